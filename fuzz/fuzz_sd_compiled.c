/* Fuzzes the compiled SD model reader (src/image/sd_compiled.c: header,
 * configuration, every table entry against the configuration's layout)
 * and, for inputs it accepts, the graphs on the mapped weights: buffers
 * planned for an 8x8 latent, the text encoder, one UNet step and the VAE
 * decoder. Seeds: the micro checkpoint of fuzz_sd_model compiled with
 * --weights f32 and q8 (fuzz/seeds/README.md). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_sd_run.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    /* the reader takes a 64-byte aligned image, as a memory map is */
    uint8_t *img = aligned_alloc(64, (size + 63) & ~(size_t)63);
    if (!img) return 0;
    memcpy(img, data, size);
    lp_error err;
    lp_sd_weights *w = lp_sd_weights_open_memory(img, size, "fuzz.lpx", &err);
    if (w) fuzz_sd_run(w, lp_sd_weights_int8_activations(w));
    lp_sd_weights_free(w);
    free(img);
    return 0;
}
