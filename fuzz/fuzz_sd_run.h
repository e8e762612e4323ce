/* What the SD fuzz targets do with weights their parser accepted: plan
 * buffers for an 8x8 latent, run the text encoder, one UNet step and the
 * VAE decoder and encoder (zero inputs), free. */
#ifndef LP_FUZZ_SD_RUN_H
#define LP_FUZZ_SD_RUN_H

#include <stdlib.h>

#include "image/sd_graph.h"

static void fuzz_sd_run(const lp_sd_weights *w, bool int8_activations) {
    lp_error err;
    const lp_sd_config *c = lp_sd_weights_config(w);
    lp_sd_graph *g = lp_sd_graph_create(w, 1, 8, 8, 1, &err);
    if (g && c->te_ctx <= 128 && c->unet_in <= 16) {
        lp_sd_graph_set_int8_activations(g, int8_activations);
        int32_t ids[128] = {0};
        float *ctx = calloc((size_t)c->te_ctx * (size_t)c->te_dim, sizeof(float));
        float *x = calloc((size_t)64 * (size_t)c->unet_in, sizeof(float));
        float *eps = calloc((size_t)64 * (size_t)c->unet_out, sizeof(float));
        int f = 1 << (c->vae_levels - 1);
        float *img = calloc((size_t)64 * (size_t)(f * f) * (size_t)c->vae_img, sizeof(float));
        float t = 500.0f;
        if (ctx && x && eps && img && lp_sd_text_encode(g, ids, 1, 1, ctx, &err) == 0 &&
            lp_sd_unet(g, x, &t, ctx, 1, eps, &err) == 0 && lp_sd_vae_decode(g, x, 1, img, &err) == 0)
            lp_sd_vae_encode(g, img, 1, x, &err); /* the config holds unet_in >= vae_z */
        free(ctx), free(x), free(eps), free(img);
    }
    lp_sd_graph_free(g);
}

/* a model the loader accepted: its weights converted and run as above, then both freed */
static inline void fuzz_sd_model_run(lp_sd_model *m) {
    lp_error err;
    lp_sd_weights *w = lp_sd_weights_create(m, LP_F32, &err);
    if (w) fuzz_sd_run(w, false);
    lp_sd_weights_free(w);
    lp_sd_model_free(m);
}

#endif
