/* Random-weight SD 1.x single-file checkpoints (see sd_synth.h). The header
 * is laid out from the layout first (names, shapes, offsets), then the
 * tensors are generated and written in the same order. */
#include "sd_synth.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int lp_sd_synth_preset(const char *name, lp_sd_config *c, lp_error *err) {
    if (!strcmp(name, "sd15")) *c = lp_sd_config_sd15();
    else if (!strcmp(name, "sd-tiny")) *c = lp_sd_config_tiny();
    else if (!strcmp(name, "sd-tiny-inpaint")) { /* the inpainting UNet's input: latent, mask, masked image */
        *c = lp_sd_config_tiny();
        c->unet_in = 2 * c->vae_z + 1;
    } else return lp_fail(err, "unknown image preset '%s' (sd15, sd-tiny, sd-tiny-inpaint)", name);
    return 0;
}

/* ---- the header ------------------------------------------------------------------------------ */

typedef struct header {
    char *json;
    size_t len, cap;
    uint64_t offset; /* data bytes so far */
    size_t elem;     /* bytes per element */
    const char *dtype_name;
    bool oom;
} header;

__attribute__((format(printf, 2, 3))) static void put(header *h, const char *fmt, ...) {
    if (h->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(h->json + h->len, h->cap - h->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            h->oom = true;
            return;
        }
        if ((size_t)n < h->cap - h->len) {
            h->len += (size_t)n;
            return;
        }
        size_t cap = h->cap * 2 + (size_t)n + 1;
        char *j = realloc(h->json, cap);
        if (!j) {
            h->oom = true;
            return;
        }
        h->json = j;
        h->cap = cap;
    }
}

static int64_t elements(const lp_sd_tensor_desc *t) {
    int64_t n = 1;
    for (int i = 0; i < t->n_dims; i++) n *= t->shape[i];
    return n;
}

static int header_one(void *ctx, const lp_sd_tensor_desc *t) {
    header *h = ctx;
    uint64_t bytes = (uint64_t)elements(t) * (h->elem == 4 ? 4 : 2);
    put(h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, h->dtype_name);
    for (int i = 0; i < t->n_dims; i++) put(h, "%s%lld", i ? "," : "", (long long)t->shape[i]);
    put(h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)h->offset, (unsigned long long)(h->offset + bytes));
    h->offset += bytes;
    return h->oom ? -1 : 0;
}

/* ---- values ------------------------------------------------------------------------------------ */

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* Weights keep activations near unit scale: matrices and kernels uniform
 * with variance 1/fan-in, gains 1 +- 0.1, biases +- 0.05, embeddings +- 0.5. */
static void fill_values(const lp_sd_tensor_desc *t, uint64_t seed, float *v, int64_t n) {
    lp_rng r;
    lp_rng_seed(&r, seed ^ name_hash(t->name));
    float amp, base = 0;
    if (ends_with(t->name, ".bias")) amp = 0.05f;
    else if (t->n_dims == 1) amp = 0.1f, base = 1.0f;
    else if (strstr(t->name, "embedding")) amp = 0.5f;
    else amp = sqrtf(3.0f / (float)(n / t->shape[0]));
    for (int64_t i = 0; i < n; i++) v[i] = base + amp * (2.0f * lp_rng_uniform(&r) - 1.0f);
}

typedef struct writer {
    FILE *f;
    lp_st_dtype dtype;
    uint64_t seed;
    float *buf;
    void *conv;
    int64_t cap;
    const char *path;
    lp_error *err;
} writer;

static int write_one(void *ctx, const lp_sd_tensor_desc *t) {
    writer *w = ctx;
    int64_t n = elements(t);
    if (n > w->cap) {
        free(w->buf), free(w->conv);
        w->buf = malloc((size_t)n * sizeof(float));
        w->conv = malloc((size_t)n * sizeof(uint16_t));
        w->cap = n;
        if (!w->buf || !w->conv) return lp_error_set(w->err, LP_ERR_NOMEM, "%s: out of memory", w->path);
    }
    fill_values(t, w->seed, w->buf, n);
    const void *data = w->buf;
    size_t bytes = (size_t)n * 4;
    if (w->dtype != LP_ST_F32) {
        uint16_t *h = w->conv;
        for (int64_t i = 0; i < n; i++) h[i] = w->dtype == LP_ST_F16 ? lp_f32_to_f16(w->buf[i]) : lp_f32_to_bf16(w->buf[i]);
        data = h;
        bytes = (size_t)n * 2;
    }
    /* little-endian hosts only, as the rest of the writers */
    if (fwrite(data, 1, bytes, w->f) != bytes) return lp_error_set(w->err, LP_ERR_IO, "%s: write failed", w->path);
    return 0;
}

int lp_sd_synth_write(const lp_sd_config *c, lp_st_dtype dtype, uint64_t seed, const char *preset,
                      const char *out_path, lp_error *err) {
    if (dtype != LP_ST_F32 && dtype != LP_ST_F16 && dtype != LP_ST_BF16)
        return lp_fail(err, "%s: SD weights are F32, F16 or BF16", out_path);
    if (lp_sd_config_check(c, err)) return -1;
    header h = {.elem = lp_st_dtype_size(dtype), .dtype_name = lp_st_dtype_name(dtype), .cap = 1 << 16};
    h.json = malloc(h.cap);
    if (!h.json) return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", out_path);
    /* what shapes cannot tell the loader */
    put(&h, "{\"__metadata__\":{\"format\":\"pt\",\"loraplex.sd.preset\":\"%s\",\"loraplex.sd.te_heads\":\"%d\","
            "\"loraplex.sd.unet_heads\":\"%d\",\"loraplex.sd.groups\":\"%d\"}",
        preset ? preset : "custom", c->te_heads, c->unet_heads, c->groups);
    lp_sd_layout(c, header_one, &h);
    put(&h, "}");
    while (!h.oom && h.len % 8) put(&h, " ");
    if (h.oom) {
        free(h.json);
        return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", out_path);
    }
    FILE *f = fopen(out_path, "wb");
    if (!f) {
        free(h.json);
        return lp_error_set(err, LP_ERR_IO, "%s: cannot create", out_path);
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
    int rc = 0;
    if (fwrite(len8, 1, 8, f) != 8 || fwrite(h.json, 1, h.len, f) != h.len)
        rc = lp_error_set(err, LP_ERR_IO, "%s: write failed", out_path);
    free(h.json);
    writer w = {.f = f, .dtype = dtype, .seed = seed, .path = out_path, .err = err};
    if (!rc) rc = lp_sd_layout(c, write_one, &w);
    free(w.buf), free(w.conv);
    if (fclose(f) && !rc) rc = lp_error_set(err, LP_ERR_IO, "%s: write failed", out_path);
    if (rc) remove(out_path);
    return rc ? -1 : 0;
}

/* ---- the diffusers folder ------------------------------------------------------------------------ */

typedef struct diff_ctx {
    const lp_sd_model *m;
    lp_st_writer *w[3];
    lp_error *err;
} diff_ctx;

static int add_diffusers(void *ctx, const lp_sd_tensor_desc *d) {
    diff_ctx *k = ctx;
    char dn[192];
    int part = lp_sd_diffusers_name(lp_sd_model_config(k->m), d->name, dn, sizeof dn);
    const lp_st_tensor *t = lp_sd_model_tensor(k->m, d->name);
    if (part < 0 || !t) return lp_fail(k->err, "diffusers layout: no name for %s", d->name);
    uint64_t shape[4];
    uint32_t n = (uint32_t)d->n_dims;
    for (uint32_t i = 0; i < n; i++) shape[i] = (uint64_t)d->shape[i];
    if (part == LP_SD_PART_VAE && strstr(dn, ".attentions.0.to_") && strstr(dn, ".weight")) n = 2;
    lp_st_writer_add(k->w[part], dn, t->dtype, n, shape, t->data, t->n_bytes);
    return 0;
}

static int write_text(const char *path, const char *text, lp_error *err) {
    FILE *f = fopen(path, "w");
    if (!f) return lp_fail(err, "cannot write %s", path);
    bool ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok ? 0 : lp_fail(err, "cannot write %s", path);
}

int lp_sd_write_diffusers(const lp_sd_model *m, const char *dir, lp_error *err) {
    static const char *const sub[3] = {"text_encoder", "unet", "vae"};
    static const char *const file[3] = {"model", "diffusion_pytorch_model", "diffusion_pytorch_model"};
    const lp_sd_config *c = lp_sd_model_config(m);
    char path[4096], json[256];
    mkdir(dir, 0755);
    diff_ctx k = {.m = m, .err = err};
    int rc = 0;
    for (int i = 0; i < 3; i++) k.w[i] = lp_st_writer_create();
    if (!k.w[0] || !k.w[1] || !k.w[2]) rc = lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    if (!rc) rc = lp_sd_layout(c, add_diffusers, &k);
    for (int i = 0; i < 3 && !rc; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, sub[i]);
        if (mkdir(path, 0755) && errno != EEXIST) rc = lp_fail(err, "cannot create %s", path);
        snprintf(path, sizeof path, "%s/%s/%s.safetensors", dir, sub[i], file[i]);
        if (!rc) rc = lp_st_writer_write(k.w[i], path, err);
        if (i == 0) snprintf(json, sizeof json, "{\"num_attention_heads\": %d}\n", c->te_heads);
        else if (i == 1)
            snprintf(json, sizeof json, "{\"attention_head_dim\": %d, \"norm_num_groups\": %d}\n", c->unet_heads, c->groups);
        else snprintf(json, sizeof json, "{\"norm_num_groups\": %d}\n", c->groups);
        snprintf(path, sizeof path, "%s/%s/config.json", dir, sub[i]);
        if (!rc) rc = write_text(path, json, err);
    }
    for (int i = 0; i < 3; i++) lp_st_writer_free(k.w[i]);
    return rc;
}
