/* Fuzzes the compiled SD model reader (src/image/sd_compiled.c: header,
 * configuration, every table entry against the configuration's layout)
 * and, for inputs it accepts, the graphs on the mapped weights: buffers
 * planned for an 8x8 latent, the text encoder, one UNet step and the VAE
 * decoder. Seeds: the micro checkpoint of fuzz_sd_model compiled with
 * --weights f32 and q8 (fuzz/seeds/README.md). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "image/sd_graph.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    /* the reader takes a 64-byte aligned image, as a memory map is */
    uint8_t *img = aligned_alloc(64, (size + 63) & ~(size_t)63);
    if (!img) return 0;
    memcpy(img, data, size);
    lp_error err;
    lp_sd_weights *w = lp_sd_weights_open_memory(img, size, "fuzz.lpx", &err);
    const lp_sd_config *c = w ? lp_sd_weights_config(w) : NULL;
    lp_sd_graph *g = w ? lp_sd_graph_create(w, 1, 8, 8, 1, &err) : NULL;
    if (g && c->te_ctx <= 128 && c->unet_in <= 8) {
        lp_sd_graph_set_int8_activations(g, lp_sd_weights_int8_activations(w));
        int32_t ids[128] = {0};
        float *ctx = calloc((size_t)c->te_ctx * (size_t)c->te_dim, sizeof(float));
        float *x = calloc((size_t)64 * (size_t)c->unet_in, sizeof(float));
        float *eps = calloc((size_t)64 * (size_t)c->unet_out, sizeof(float));
        int f = 1 << (c->vae_levels - 1);
        float *out = calloc((size_t)64 * (size_t)(f * f) * (size_t)c->vae_img, sizeof(float));
        float t = 500.0f;
        if (ctx && x && eps && out && lp_sd_text_encode(g, ids, 1, 1, ctx, &err) == 0 &&
            lp_sd_unet(g, x, &t, ctx, 1, eps, &err) == 0)
            lp_sd_vae_decode(g, x, 1, out, &err);
        free(ctx), free(x), free(eps), free(out);
    }
    lp_sd_graph_free(g);
    lp_sd_weights_free(w);
    free(img);
    return 0;
}
