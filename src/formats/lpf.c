/* .lpf forecast-embedding files (see lpf.h) and the public lp_forecast API. */
#include "lpf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/base.h"
#include "../model/adapter.h"
#include "le.h"
#include "lpa.h"

struct lp_forecast {
    int k, dim, n_vocab;
    uint64_t fingerprint;
    char name[LP_LPF_NAME_BYTES];
    float *data; /* [k][dim] */
};

void lp_forecast_free(lp_forecast *f) {
    if (!f) return;
    free(f->data);
    free(f);
}

static lp_forecast *forecast_new(int k, int dim, lp_error *err) {
    lp_forecast *f = calloc(1, sizeof *f);
    float *d = f ? malloc((size_t)k * (size_t)dim * sizeof *d) : NULL;
    if (!d) {
        free(f);
        lp_error_set(err, LP_ERR_NOMEM, "out of memory for %d forecast embeddings of %d", k, dim);
        return NULL;
    }
    f->k = k;
    f->dim = dim;
    f->data = d;
    return f;
}

static size_t name_padded(size_t n) { return (n + 3) & ~(size_t)3; }

lp_forecast *lp_lpf_parse(const uint8_t *p, size_t size, const char *what, lp_error *err) {
    if (!what) what = "forecast file";
    if (!p || size < LP_LPF_HEADER_BYTES) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: %zu bytes is too short for a forecast file (header %d)", what, size,
                     LP_LPF_HEADER_BYTES);
        return NULL;
    }
    if (memcmp(p, LP_LPF_MAGIC, 4) != 0) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: not a forecast file (magic is not \"%s\")", what, LP_LPF_MAGIC);
        return NULL;
    }
    uint32_t version = lp_le_get_u32(p + 4), dim = lp_le_get_u32(p + 8), k = lp_le_get_u32(p + 12);
    uint32_t n_vocab = lp_le_get_u32(p + 16), name_len = lp_le_get_u32(p + 20);
    uint64_t fp = lp_le_get_u64(p + 24), sum = lp_le_get_u64(p + 32);
    if (version != LP_LPF_VERSION) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: forecast file version %u (this build reads %d)", what, version,
                     LP_LPF_VERSION);
        return NULL;
    }
    if (dim < 1 || dim > LP_LPF_MAX_DIM || k < 1 || k > LP_LPF_MAX_K) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: dim %u / k %u out of range (1..%d / 1..%d)", what, dim, k,
                     LP_LPF_MAX_DIM, LP_LPF_MAX_K);
        return NULL;
    }
    if (name_len >= LP_LPF_NAME_BYTES) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: adapter name of %u bytes (at most %d)", what, name_len,
                     LP_LPF_NAME_BYTES - 1);
        return NULL;
    }
    for (int i = 40; i < LP_LPF_HEADER_BYTES; i++)
        if (p[i]) {
            lp_error_set(err, LP_ERR_FORMAT, "%s: reserved header byte %d is not zero", what, i);
            return NULL;
        }
    /* sizes: all small by the checks above, still computed with overflow checks */
    size_t data_off = LP_LPF_HEADER_BYTES + name_padded(name_len), data_bytes, total;
    if (!lp_mul_ok((size_t)k * dim, sizeof(float), &data_bytes) || !lp_add_ok(data_off, data_bytes, &total)) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: size overflows", what);
        return NULL;
    }
    if (size != total) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: %zu bytes, but a forecast file of %u x %u with a %u-byte name has %zu",
                     what, size, k, dim, name_len, total);
        return NULL;
    }
    const uint8_t *name = p + LP_LPF_HEADER_BYTES;
    if (memchr(name, 0, name_len) || !lp_utf8_valid(name, name_len)) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: the adapter name is not UTF-8 text", what);
        return NULL;
    }
    for (size_t i = LP_LPF_HEADER_BYTES + name_len; i < data_off; i++)
        if (p[i]) {
            lp_error_set(err, LP_ERR_FORMAT, "%s: padding after the name is not zero", what);
            return NULL;
        }
    if (lp_lpa_hash(LP_LPA_HASH_SEED, p + data_off, data_bytes) != sum) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: the embeddings' checksum does not match (damaged file)", what);
        return NULL;
    }
    lp_forecast *f = forecast_new((int)k, (int)dim, err);
    if (!f) return NULL;
    f->n_vocab = (int)n_vocab;
    f->fingerprint = fp;
    memcpy(f->name, name, name_len);
    f->name[name_len] = 0;
    for (size_t i = 0; i < (size_t)k * dim; i++) {
        float v = lp_le_get_f32(p + data_off + 4 * i);
        if (!isfinite(v)) {
            lp_error_set(err, LP_ERR_FORMAT, "%s: forecast embedding %zu, element %zu is not finite", what, i / dim,
                         i % dim);
            lp_forecast_free(f);
            return NULL;
        }
        f->data[i] = v;
    }
    return f;
}

lp_forecast *lp_forecast_load(const char *path, lp_error *err) {
    if (!path) {
        lp_error_set(err, LP_ERR_INVALID, "no forecast file named");
        return NULL;
    }
    lp_mapped_file mf;
    if (lp_map_file(path, &mf, err)) return NULL;
    lp_forecast *f = lp_lpf_parse(mf.data, mf.size, path, err);
    lp_unmap_file(&mf);
    return f;
}

lp_forecast *lp_forecast_from_memory(const void *data, size_t size, const char *what, lp_error *err) {
    return lp_lpf_parse(data, size, what, err);
}

lp_forecast *lp_forecast_create(const lp_model *model, int k, const float *embd, const char *adapter_name,
                                lp_error *err) {
    if (!model || !embd) {
        lp_error_set(err, LP_ERR_INVALID, "lp_forecast_create needs a model and embeddings");
        return NULL;
    }
    lp_model_info info;
    lp_model_get_info(model, &info);
    if (k < 1 || k > LP_LPF_MAX_K || info.dim < 1 || info.dim > LP_LPF_MAX_DIM) {
        lp_error_set(err, LP_ERR_INVALID, "forecast embeddings: k %d (1..%d) or dim %d out of range", k, LP_LPF_MAX_K,
                     info.dim);
        return NULL;
    }
    size_t nl = adapter_name ? strlen(adapter_name) : 0;
    if (nl >= LP_LPF_NAME_BYTES || (nl && (memchr(adapter_name, 0, nl) ||
                                           !lp_utf8_valid((const uint8_t *)adapter_name, nl)))) {
        lp_error_set(err, LP_ERR_INVALID, "forecast embeddings: adapter name too long or not UTF-8 (at most %d bytes)",
                     LP_LPF_NAME_BYTES - 1);
        return NULL;
    }
    for (size_t i = 0; i < (size_t)k * (size_t)info.dim; i++)
        if (!isfinite(embd[i])) {
            lp_error_set(err, LP_ERR_INVALID, "forecast embeddings: element %zu is not finite", i);
            return NULL;
        }
    lp_forecast *f = forecast_new(k, info.dim, err);
    if (!f) return NULL;
    memcpy(f->data, embd, (size_t)k * (size_t)info.dim * sizeof(float));
    f->n_vocab = info.n_vocab;
    f->fingerprint = lp_model_fingerprint(model);
    if (nl) memcpy(f->name, adapter_name, nl);
    f->name[nl] = 0;
    return f;
}

int lp_forecast_save(const lp_forecast *f, const char *path, lp_error *err) {
    if (!f || !path) return lp_error_set(err, LP_ERR_INVALID, "lp_forecast_save needs a forecast set and a path");
    size_t nl = strlen(f->name), off = LP_LPF_HEADER_BYTES + name_padded(nl);
    size_t data_bytes = (size_t)f->k * (size_t)f->dim * sizeof(float), total = off + data_bytes;
    uint8_t *buf = calloc(1, total);
    if (!buf) return lp_error_set(err, LP_ERR_NOMEM, "out of memory writing %s", path);
    memcpy(buf, LP_LPF_MAGIC, 4);
    lp_le_put_u32(buf + 4, LP_LPF_VERSION);
    lp_le_put_u32(buf + 8, (uint32_t)f->dim);
    lp_le_put_u32(buf + 12, (uint32_t)f->k);
    lp_le_put_u32(buf + 16, (uint32_t)f->n_vocab);
    lp_le_put_u32(buf + 20, (uint32_t)nl);
    lp_le_put_u64(buf + 24, f->fingerprint);
    memcpy(buf + LP_LPF_HEADER_BYTES, f->name, nl);
    for (size_t i = 0; i < (size_t)f->k * (size_t)f->dim; i++) lp_le_put_f32(buf + off + 4 * i, f->data[i]);
    lp_le_put_u64(buf + 32, lp_lpa_hash(LP_LPA_HASH_SEED, buf + off, data_bytes));
    FILE *fp = fopen(path, "wb");
    int rc = 0;
    if (!fp) {
        rc = lp_error_set(err, LP_ERR_IO, "%s: cannot open for writing", path);
    } else {
        bool ok = fwrite(buf, 1, total, fp) == total;
        if (fclose(fp) != 0) ok = false;
        if (!ok) rc = lp_error_set(err, LP_ERR_IO, "%s: write failed", path);
    }
    free(buf);
    return rc;
}

int lp_forecast_check(const lp_forecast *f, const lp_model *model, lp_error *err) {
    if (!f || !model) return lp_error_set(err, LP_ERR_INVALID, "lp_forecast_check needs a forecast set and a model");
    lp_model_info info;
    lp_model_get_info(model, &info);
    if (f->dim != info.dim)
        return lp_error_set(err, LP_ERR_FORMAT, "forecast embeddings of width %d do not fit a model of dim %d", f->dim,
                            info.dim);
    if (f->n_vocab && f->n_vocab != info.n_vocab)
        return lp_error_set(err, LP_ERR_FORMAT, "forecast embeddings were made for a vocabulary of %d, the model has %d",
                            f->n_vocab, info.n_vocab);
    if (f->fingerprint && f->fingerprint != lp_model_fingerprint(model))
        return lp_error_set(err, LP_ERR_FORMAT, "forecast embeddings were made for another base (fingerprint differs)");
    return 0;
}

int lp_forecast_k(const lp_forecast *f) { return f ? f->k : 0; }
int lp_forecast_dim(const lp_forecast *f) { return f ? f->dim : 0; }
const float *lp_forecast_data(const lp_forecast *f) { return f ? f->data : NULL; }
const char *lp_forecast_adapter_name(const lp_forecast *f) { return f ? f->name : ""; }
