/* Random-weight SD 1.x single-file checkpoints (see sd_synth.h). The header
 * is laid out from the layout first (names, shapes, offsets), then the
 * tensors are generated and written in the same order. */
#include "sd_synth.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
