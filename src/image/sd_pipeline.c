/* Text to image (see sd_pipeline.h). */
#include "sd_pipeline.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct denoiser {
    lp_sd_graph *g;
    const lp_sd_schedule *sched;
    const float *ctx; /* [images * per][77][dim]: each image's uncond row first when guided */
    int images, per;  /* per: rows per image, 1 or 2 */
    float cfg;
    int64_t px;       /* latent pixels */
    int zc, uc;       /* latent channels, UNet input channels (zc, or 2 zc + 1 for an inpainting UNet) */
    float *xin, *eps; /* [images * per][px][uc], [images * per][px][zc] */
    /* inpainting with a 4-channel UNet (NULL otherwise): the init's latent and each image's initial
     * noise [images][px][zc], the latent mask [px] (1: repaint), the blended latents [images][px][zc] */
    const float *z0, *noise0, *lmask;
    float *xb;
    const float *extra; /* an inpainting UNet's further input [px][zc + 1] (mask, masked latent), or NULL */
} denoiser;

/* keeps what lies outside the mask on the init's latent: at noise sigma, z0 + sigma * noise */
static void keep_unmasked(const denoiser *d, const float *x, double sigma, float *out) {
    int64_t n = d->px * d->zc;
    for (int b = 0; b < d->images; b++)
        for (int64_t i = 0; i < n; i++) {
            float m = d->lmask[i / d->zc], k = d->z0[i] + (float)sigma * d->noise0[b * n + i];
            out[b * n + i] = m * x[b * n + i] + (1.0f - m) * k;
        }
}

/* D(x, sigma) = x - sigma * eps(x / sqrt(sigma^2 + 1), t(sigma)) for every
 * image's latent, eps guided as uncond + cfg (cond - uncond); all rows in
 * one UNet batch */
static int denoise(void *ctx, const float *x, double sigma, float *out, lp_error *err) {
    denoiser *d = ctx;
    float c_in = (float)(1.0 / sqrt(sigma * sigma + 1.0)), t[LP_SD_MAX_IMAGES * 2];
    int rows = d->images * d->per, zc = d->zc, uc = d->uc;
    int64_t n = d->px * zc;
    if (d->lmask) {
        keep_unmasked(d, x, sigma, d->xb);
        x = d->xb;
    }
    for (int r = 0; r < rows; r++) {
        const float *xi = x + (r / d->per) * n;
        float *row = d->xin + r * d->px * uc;
        for (int64_t i = 0; i < d->px; i++) {
            for (int ch = 0; ch < zc; ch++) row[i * uc + ch] = xi[i * zc + ch] * c_in;
            for (int ch = zc; ch < uc; ch++) row[i * uc + ch] = d->extra[i * (uc - zc) + ch - zc];
        }
        t[r] = (float)lp_sd_sigma_to_t(d->sched, sigma);
    }
    if (lp_sd_unet(d->g, d->xin, t, d->ctx, rows, d->eps, err)) return -1;
    for (int b = 0; b < d->images; b++) {
        const float *eu = d->eps + b * d->per * n, *ec = eu + (d->per - 1) * n;
        const float *xb = x + b * n;
        float *ob = out + b * n;
        for (int64_t i = 0; i < n; i++) {
            float e = d->per == 2 ? eu[i] + d->cfg * (ec[i] - eu[i]) : ec[i];
            ob[i] = xb[i] - (float)sigma * e;
            if (d->lmask) ob[i] = d->lmask[i / zc] * ob[i] + (1.0f - d->lmask[i / zc]) * d->z0[i];
        }
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

/* rgb bytes [h*w][3] -> the VAE's input [h*w][vae_img] in [-1, 1]; masked pixels (mask >= 128) zeroed
 * when mask is given */
static void image_in(const uint8_t *rgb, const uint8_t *mask, int64_t npix, int vae_img, float *out) {
    for (int64_t i = 0; i < npix; i++)
        for (int ch = 0; ch < vae_img; ch++) {
            float v = rgb[i * 3 + (ch < 3 ? ch : 2)] / 127.5f - 1.0f;
            out[i * vae_img + ch] = mask && mask[i] >= 128 ? 0.0f : v;
        }
}

/* the pixel mask at the latent's size: each 8x8 block's share of repainted pixels (blend), or its top-left
 * pixel, 0 or 1 (nearest, as the inpainting UNet was trained) */
static void latent_mask(const uint8_t *mask, int w, int lh, int lw, bool nearest, float *out) {
    for (int y = 0; y < lh; y++)
        for (int x = 0; x < lw; x++) {
            int on = 0;
            for (int i = 0; i < (nearest ? 1 : 8); i++)
                for (int j = 0; j < (nearest ? 1 : 8); j++) on += mask[(int64_t)(8 * y + i) * w + 8 * x + j] >= 128;
            out[y * lw + x] = nearest ? (float)on : on / 64.0f;
        }
}

static int check_params(const lp_sd_config *c, const lp_clip_tokenizer *tok, const lp_sd_gen_params *p,
                        lp_error *err) {
    int f = 8 * (1 << (c->unet_levels - 1)), vf = 1 << (c->vae_levels - 1);
    if (p->width < f || p->height < f || p->width % f || p->height % f || p->width > 4096 || p->height > 4096)
        return lp_fail(err, "image size %dx%d: width and height must be multiples of %d (at most 4096)", p->width,
                       p->height, f);
    if (vf != 8) return lp_fail(err, "the VAE upsamples x%d, the pipeline assumes x8 latents", vf);
    if (lp_clip_vocab_size(tok) != c->te_vocab)
        return lp_fail(err, "tokenizer of %d tokens for a text encoder of %d", lp_clip_vocab_size(tok), c->te_vocab);
    if (p->steps < 1 || p->steps > LP_SD_TRAIN_STEPS) return lp_fail(err, "steps %d (1..1000)", p->steps);
    if (p->mask && !p->init) return lp_fail(err, "a mask needs an init image");
    if (c->unet_in != c->vae_z && !p->mask)
        return lp_fail(err, "an inpainting UNet (%d input channels) needs an init image and a mask", c->unet_in);
    if (p->init && (!(p->strength > 0) || p->strength > 1))
        return lp_fail(err, "strength %g (above 0, at most 1)", (double)p->strength);
    if (p->init && (int)(p->steps * p->strength) < 1)
        return lp_fail(err, "strength %g of %d steps runs no step", (double)p->strength, p->steps);
    return 0;
}

int lp_sd_generate(const lp_sd_weights *w, const lp_clip_tokenizer *tok, const lp_sd_gen_params *p,
                   float *latents_out, uint8_t *rgb, lp_error *err) {
    const lp_sd_config *c = lp_sd_weights_config(w);
    if (check_params(c, tok, p, err)) return -1;
    int B = p->batch > 1 ? p->batch : 1;
    if (B > LP_SD_MAX_IMAGES) return lp_fail(err, "batch of %d images (1..%d)", B, LP_SD_MAX_IMAGES);
    int lh = p->height / 8, lw = p->width / 8, per = p->cfg == 1.0f ? 1 : 2, rows = B * per;
    int zc = c->vae_z, uc = c->unet_in;
    bool inpaint_unet = uc != zc;
    int64_t px = (int64_t)lh * lw, n = px * zc, T = c->te_ctx;
    int64_t npix = (int64_t)p->width * p->height;
    lp_sd_graph *g = lp_sd_graph_create(w, rows, lh, lw, p->n_threads, err);
    if (!g) return -1;
    lp_sd_graph_set_int8_activations(g, p->int8_activations);
    lp_sd_schedule *sched = malloc(sizeof *sched);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(rows * T));
    float *ctx = malloc(sizeof(float) * (size_t)(rows * T * c->te_dim));
    /* x, sampler scratch[3], the initial noise, the blended latents: [B][n] each; the init's latent */
    float *x = malloc(sizeof(float) * (size_t)(n * (6 * B + 1)));
    float *xin = malloc(sizeof(float) * (size_t)(rows * px * uc)), *eps = malloc(sizeof(float) * (size_t)(rows * n));
    float *extra = malloc(sizeof(float) * (size_t)(px * (zc + 1))); /* latent mask, then an inpainting UNet's input */
    double *sigmas = malloc(sizeof(double) * (size_t)(p->steps + 1));
    float *img = malloc(sizeof(float) * (size_t)(npix * c->vae_img));
    lp_sd_row_loras *rl = malloc(sizeof *rl * (size_t)rows);
    int rc = -1;
    if (!sched || !ids || !ctx || !x || !xin || !eps || !extra || !sigmas || !img || !rl) {
        lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        goto done;
    }
    float *scratch = x + B * n, *noise0 = x + 4 * B * n, *xb = x + 5 * B * n, *z0 = x + 6 * B * n;
    lp_sd_schedule_init(sched);
    /* rows: per image [negative,] prompt, with the image's adapters */
    for (int b = 0; b < B; b++) {
        const lp_sd_row_loras *loras = p->image_loras ? &p->image_loras[b] : &p->loras;
        const char *prompt = p->prompts && p->prompts[b] ? p->prompts[b] : p->prompt;
        const char *texts[2] = {p->negative ? p->negative : "", prompt};
        for (int r = 0; r < per; r++) {
            int row = b * per + r;
            const char *s = texts[per == 2 ? r : 1];
            if (lp_sd_encode_prompt(tok, loras, s, ids + row * T, (int)T, err)) goto done;
            rl[row] = *loras;
        }
    }
    int start = p->init ? p->steps - (int)(p->steps * p->strength) : 0; /* the first step run */
    lp_sd_timings tm = {.steps = p->steps - start};
    double t0 = lp_now_seconds();
    if (lp_sd_graph_set_loras(g, rl, rows, err)) goto done;
    if (lp_sd_text_encode(g, ids, rows, p->clip_skip, ctx, err)) goto done;
    double t1 = lp_now_seconds();
    tm.text = t1 - t0;
    lp_sd_weights_evict(w, LP_SD_PART_TE);
    if (lp_sd_sigmas(sched, p->sampler, p->scheduler, p->steps, sigmas)) {
        lp_fail(err, "no schedule for %d steps", p->steps);
        goto done;
    }
    /* the init: its latent (the whole image; an inpainting UNet's extra input: the masked pixels zeroed) */
    if (p->init) {
        image_in(p->init, NULL, npix, c->vae_img, img);
        if (lp_sd_vae_encode(g, img, 1, z0, err)) goto done;
    }
    if (inpaint_unet) {
        latent_mask(p->mask, p->width, lh, lw, true, xin);
        image_in(p->init, p->mask, npix, c->vae_img, img);
        if (lp_sd_vae_encode(g, img, 1, xb, err)) goto done;
        for (int64_t i = 0; i < px; i++) {
            extra[i * (zc + 1)] = xin[i];
            for (int ch = 0; ch < zc; ch++) extra[i * (zc + 1) + 1 + ch] = xb[i * zc + ch];
        }
    } else if (p->mask) {
        latent_mask(p->mask, p->width, lh, lw, false, extra);
    }
    double t2 = lp_now_seconds();
    tm.encode = t2 - t1;
    /* initial latents: image b's noise from seed + b (so it is the image a run with that seed alone makes),
     * channel-major as the file layout, times the first sigma run, on the init's latent if any */
    for (int b = 0; b < B; b++) {
        float *xb0 = x + b * n, *nb = noise0 + b * n;
        lp_rng nr;
        lp_rng_seed(&nr, p->seed + (uint64_t)b);
        for (int ch = 0; ch < zc; ch++)
            for (int64_t i = 0; i < px; i++) nb[i * zc + ch] = p->noise ? p->noise[ch * px + i] : lp_rng_normal(&nr);
        for (int64_t i = 0; i < n; i++) xb0[i] = (p->init ? z0[i] : 0.0f) + nb[i] * (float)sigmas[start];
    }
    lp_rng rng[LP_SD_MAX_IMAGES]; /* the ancestral samplers' noise: image b's as its run alone draws it */
    for (int b = 0; b < B; b++) {
        lp_rng_seed(&rng[b], p->seed + (uint64_t)b);
        for (int64_t i = 0; p->noise == NULL && i < n; i++) lp_rng_normal(&rng[b]); /* past its initial draws */
    }
    bool blend = p->mask && !inpaint_unet;
    denoiser d = {.g = g, .sched = sched, .ctx = ctx, .images = B, .per = per, .cfg = p->cfg, .px = px, .zc = zc,
                  .uc = uc, .xin = xin, .eps = eps, .z0 = z0, .noise0 = noise0, .lmask = blend ? extra : NULL,
                  .xb = xb, .extra = inpaint_unet ? extra : NULL};
    if (lp_sd_sample(p->sampler, sigmas + start, p->steps - start, x, B * n, denoise, &d, rng, B, scratch, p->on_step,
                     p->step_ctx, err))
        goto done;
    double t3 = lp_now_seconds();
    tm.unet = t3 - t2;
    lp_sd_weights_evict(w, LP_SD_PART_UNET);
    if (blend) { /* sigma 0: outside the mask, the init's latent itself */
        keep_unmasked(&d, x, 0.0, xb);
        memcpy(x, xb, sizeof(float) * (size_t)(B * n));
    }
    for (int b = 0; b < B; b++) {
        const float *xo = x + b * n;
        if (latents_out)
            for (int64_t i = 0; i < px; i++)
                for (int ch = 0; ch < zc; ch++) latents_out[b * n + ch * px + i] = xo[i * zc + ch];
        if (lp_sd_vae_decode(g, xo, 1, img, err)) goto done;
        uint8_t *out = rgb + (size_t)b * (size_t)npix * 3;
        for (int64_t i = 0; i < npix; i++)
            for (int ch = 0; ch < 3; ch++) {
                float v = c->vae_img >= 3 ? img[i * c->vae_img + ch] : img[i * c->vae_img];
                float u = (v + 1.0f) * 127.5f;
                out[i * 3 + ch] = (uint8_t)(u <= 0 ? 0 : u >= 255 ? 255 : lrintf(u));
            }
    }
    tm.decode = lp_now_seconds() - t3;
    if (p->timings) *p->timings = tm;
    rc = 0;
done:
    free(sched), free(ids), free(ctx), free(x), free(xin), free(eps), free(extra), free(sigmas), free(img), free(rl);
    lp_sd_graph_free(g);
    return rc;
}
