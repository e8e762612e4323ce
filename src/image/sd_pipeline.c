/* Text to image (see sd_pipeline.h). */
#include "sd_pipeline.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct denoiser {
    lp_sd_graph *g;
    const lp_sd_schedule *sched;
    const float *ctx; /* [rows][77][dim]: uncond first when guided */
    int rows;         /* 1 or 2 */
    float cfg;
    int64_t n;        /* floats of one latent */
    float *xin, *eps; /* [rows][n] */
} denoiser;

/* D(x, sigma) = x - sigma * eps(x / sqrt(sigma^2 + 1), t(sigma)), eps
 * guided as uncond + cfg (cond - uncond) */
static int denoise(void *ctx, const float *x, double sigma, float *out, lp_error *err) {
    denoiser *d = ctx;
    float c_in = (float)(1.0 / sqrt(sigma * sigma + 1.0)), t[2];
    for (int r = 0; r < d->rows; r++) {
        for (int64_t i = 0; i < d->n; i++) d->xin[r * d->n + i] = x[i] * c_in;
        t[r] = (float)lp_sd_sigma_to_t(d->sched, sigma);
    }
    if (lp_sd_unet(d->g, d->xin, t, d->ctx, d->rows, d->eps, err)) return -1;
    const float *eu = d->eps, *ec = d->eps + (d->rows - 1) * d->n;
    for (int64_t i = 0; i < d->n; i++) {
        float e = d->rows == 2 ? eu[i] + d->cfg * (ec[i] - eu[i]) : ec[i];
        out[i] = x[i] - (float)sigma * e;
    }
    return 0;
}

int lp_sd_generate(const lp_sd_weights *w, const lp_clip_tokenizer *tok, const lp_sd_gen_params *p,
                   float *latents_out, uint8_t *rgb, lp_error *err) {
    const lp_sd_config *c = lp_sd_weights_config(w);
    int f = 8 * (1 << (c->unet_levels - 1)), vf = 1 << (c->vae_levels - 1);
    if (p->width < f || p->height < f || p->width % f || p->height % f || p->width > 4096 || p->height > 4096)
        return lp_fail(err, "image size %dx%d: width and height must be multiples of %d (at most 4096)", p->width,
                       p->height, f);
    if (vf != 8) return lp_fail(err, "the VAE upsamples x%d, the pipeline assumes x8 latents", vf);
    if (lp_clip_vocab_size(tok) != c->te_vocab)
        return lp_fail(err, "tokenizer of %d tokens for a text encoder of %d", lp_clip_vocab_size(tok), c->te_vocab);
    if (p->steps < 1 || p->steps > LP_SD_TRAIN_STEPS) return lp_fail(err, "steps %d (1..1000)", p->steps);
    int lh = p->height / 8, lw = p->width / 8, rows = p->cfg == 1.0f ? 1 : 2;
    int64_t n = (int64_t)lh * lw * c->unet_in, T = c->te_ctx;
    lp_sd_graph *g = lp_sd_graph_create(w, rows, lh, lw, p->n_threads, err);
    if (!g) return -1;
    lp_sd_schedule *sched = malloc(sizeof *sched);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(2 * T));
    float *ctx = malloc(sizeof(float) * (size_t)(2 * T * c->te_dim));
    float *x = malloc(sizeof(float) * (size_t)n * 9); /* x, xin[2], eps[2], sampler scratch[3], image staging */
    double *sigmas = malloc(sizeof(double) * (size_t)(p->steps + 1));
    float *img = malloc(sizeof(float) * (size_t)(p->width * p->height * c->vae_img));
    int rc = -1;
    if (!sched || !ids || !ctx || !x || !sigmas || !img) {
        lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        goto done;
    }
    lp_sd_schedule_init(sched);
    /* rows: [negative,] prompt */
    const char *texts[2] = {p->negative ? p->negative : "", p->prompt};
    for (int r = 0; r < rows; r++) {
        const char *s = texts[rows == 2 ? r : 1];
        if (lp_clip_encode(tok, s, strlen(s), lp_clip_eos(tok), ids + r * T, (int)T, NULL, err)) goto done;
    }
    if (lp_sd_text_encode(g, ids, rows, p->clip_skip, ctx, err)) goto done;
    if (lp_sd_sigmas(sched, p->sampler, p->scheduler, p->steps, sigmas)) {
        lp_fail(err, "no schedule for %d steps", p->steps);
        goto done;
    }
    /* initial latent: noise * sigma_max, channels last inside */
    lp_rng rng;
    lp_rng_seed(&rng, p->seed);
    int64_t px = (int64_t)lh * lw;
    for (int64_t i = 0; i < px; i++)
        for (int ch = 0; ch < c->unet_in; ch++) {
            float e = p->noise ? p->noise[ch * px + i] : 0.0f;
            x[i * c->unet_in + ch] = e;
        }
    if (!p->noise)
        for (int ch = 0; ch < c->unet_in; ch++) /* drawn channel-major, as the file layout */
            for (int64_t i = 0; i < px; i++) x[i * c->unet_in + ch] = lp_rng_normal(&rng);
    for (int64_t i = 0; i < n; i++) x[i] *= (float)sigmas[0];
    denoiser d = {.g = g, .sched = sched, .ctx = ctx, .rows = rows, .cfg = p->cfg, .n = n,
                  .xin = x + n, .eps = x + 3 * n};
    if (lp_sd_sample(p->sampler, sigmas, p->steps, x, n, denoise, &d, &rng, x + 5 * n, p->on_step, p->step_ctx, err))
        goto done;
    if (latents_out)
        for (int64_t i = 0; i < px; i++)
            for (int ch = 0; ch < c->unet_in; ch++) latents_out[ch * px + i] = x[i * c->unet_in + ch];
    if (lp_sd_vae_decode(g, x, 1, img, err)) goto done;
    for (int64_t i = 0; i < (int64_t)p->width * p->height; i++)
        for (int ch = 0; ch < 3; ch++) {
            float v = c->vae_img >= 3 ? img[i * c->vae_img + ch] : img[i * c->vae_img];
            float u = (v + 1.0f) * 127.5f;
            rgb[i * 3 + ch] = (uint8_t)(u <= 0 ? 0 : u >= 255 ? 255 : lrintf(u));
        }
    rc = 0;
done:
    free(sched), free(ids), free(ctx), free(x), free(sigmas), free(img);
    lp_sd_graph_free(g);
    return rc;
}
