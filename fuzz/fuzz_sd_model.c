/* Fuzzes the SD 1.x checkpoint loader (src/image/sd_model.c: the
 * configuration inferred from tensor names and shapes, then the layout
 * checked) on top of the safetensors parser, and, for inputs it accepts,
 * the graphs built from them: weights converted, buffers planned for an 8x8
 * latent, the text encoder, one UNet step and the VAE decoder run. Seed: a
 * micro checkpoint (GroupNorm groups 1, widths 2 to 8) written by
 * lp_sd_synth_write (fuzz/seeds/README.md). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "image/sd.h"
#include "image/sd_graph.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    lp_error err;
    lp_sd_model *m = lp_sd_model_load_memory(data, size, "fuzz.safetensors", &err);
    if (!m) return 0;
    const lp_sd_config *c = lp_sd_model_config(m);
    lp_sd_weights *w = lp_sd_weights_create(m, LP_F32, &err);
    lp_sd_graph *g = w ? lp_sd_graph_create(w, 1, 8, 8, 1, &err) : NULL;
    if (g && c->te_ctx <= 128 && c->unet_in <= 8) {
        int32_t ids[128] = {0};
        float *ctx = calloc((size_t)c->te_ctx * (size_t)c->te_dim, sizeof(float));
        float *x = calloc((size_t)64 * (size_t)c->unet_in, sizeof(float));
        float *eps = calloc((size_t)64 * (size_t)c->unet_out, sizeof(float));
        int f = 1 << (c->vae_levels - 1);
        float *img = calloc((size_t)64 * (size_t)(f * f) * (size_t)c->vae_img, sizeof(float));
        float t = 500.0f;
        if (ctx && x && eps && img && lp_sd_text_encode(g, ids, 1, 1, ctx, &err) == 0 &&
            lp_sd_unet(g, x, &t, ctx, 1, eps, &err) == 0 && c->vae_z == c->unet_in)
            lp_sd_vae_decode(g, x, 1, img, &err);
        free(ctx), free(x), free(eps), free(img);
    }
    lp_sd_graph_free(g);
    lp_sd_weights_free(w);
    lp_sd_model_free(m);
    return 0;
}
