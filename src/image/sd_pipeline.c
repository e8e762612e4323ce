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

/* the adapters' token at text, longest first: its index j, or -1 */
static int token_at(const lp_sd_row_loras *l, const char *text, size_t left, size_t *len) {
    int best = -1, j = 0;
    *len = 0;
    for (int p = 0; p < l->n; p++)
        for (int32_t i = 0; i < lp_sd_lora_n_tokens(l->use[p].lora); i++, j++) {
            const char *s = lp_sd_lora_token(l->use[p].lora, i);
            size_t n = strlen(s);
            if (n > *len && n <= left && !memcmp(text, s, n)) best = j, *len = n;
        }
    return best;
}

int lp_sd_encode_prompt(const lp_clip_tokenizer *tok, const lp_sd_row_loras *loras, const char *text, int32_t *ids,
                        int n_ctx, lp_error *err) {
    size_t len = strlen(text);
    if (!loras || !loras->n) return lp_clip_encode(tok, text, len, lp_clip_eos(tok), ids, n_ctx, NULL, err);
    if (n_ctx < 2 || n_ctx > 4096) return lp_fail(err, "prompt: context %d", n_ctx);
    int32_t *piece = malloc(sizeof(int32_t) * (size_t)n_ctx);
    if (!piece) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    int n = 0, max = n_ctx - 2, rc = 0;
    ids[0] = lp_clip_bos(tok);
    size_t start = 0;
    for (size_t at = 0; at <= len && n < max && !rc; at++) {
        size_t tl = 0;
        int j = at < len ? token_at(loras, text + at, len - at, &tl) : -1;
        if (j < 0 && at < len) continue;
        int got = 0;
        if (at > start && !(rc = lp_clip_encode(tok, text + start, at - start, lp_clip_eos(tok), piece, n_ctx, &got, err)))
            for (int i = 0; i < got && i < n_ctx - 2 && n < max; i++) ids[1 + n++] = piece[1 + i];
        if (j >= 0 && n < max) ids[1 + n++] = lp_clip_vocab_size(tok) + j;
        start = at + tl;
        if (tl) at += tl - 1;
    }
    free(piece);
    if (rc) return -1;
    ids[1 + n] = lp_clip_eos(tok);
    for (int i = n + 2; i < n_ctx; i++) ids[i] = lp_clip_eos(tok);
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
        if (lp_sd_encode_prompt(tok, &p->loras, s, ids + r * T, (int)T, err)) goto done;
    }
    lp_sd_row_loras rl[2] = {p->loras, p->loras};
    if (lp_sd_graph_set_loras(g, rl, rows, err)) goto done;
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
