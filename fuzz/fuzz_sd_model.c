/* Fuzzes the SD 1.x checkpoint loader (src/image/sd_model.c: the
 * configuration inferred from tensor names and shapes, then the layout
 * checked) on top of the safetensors parser, and, for inputs it accepts,
 * the graphs built from them: weights converted, buffers planned for an 8x8
 * latent, the text encoder, one UNet step and the VAE decoder run. Seed: a
 * micro checkpoint (GroupNorm groups 1, widths 2 to 8) written by
 * lp_sd_synth_write (fuzz/seeds/README.md). */
#include <stdint.h>

#include "image/sd.h"
#include "image/sd_graph.h"
#include "fuzz_sd_run.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    lp_error err;
    lp_sd_model *m = lp_sd_model_load_memory(data, size, "fuzz.safetensors", &err);
    if (m) fuzz_sd_model_run(m);
    return 0;
}
