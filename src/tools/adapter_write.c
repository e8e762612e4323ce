/* LoRA adapters, the writing side (tools library): .lpa writing and merging
 * into a base GGUF. The loaders are in the runtime (src/model/adapter.c). */
#include "adapter_write.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../arch/arch.h"
#include "../base/dtype.h"
#include "../formats/gguf.h"
#include "../formats/lpa.h"

/* Row r of a half as `cols` floats (a packed B row has padding columns
 * past the rank; they are dropped). */
static void half_row(const lp_weight *w, int64_t r, float *row_buf, float *dst, int64_t cols) {
    lp_weight_dequantize_row(w, r, row_buf);
    memcpy(dst, row_buf, (size_t)cols * sizeof(float));
}

/* ---- writing .lpa ------------------------------------------------------------------------ */

/* A pair half as `type` (F32, F16, W8) in the .lpa layout: the data itself
 * when it already is, else a converted copy left in *tmp. cols: the half's
 * true width (B: the rank, without the padding of a packed B). */
static const void *as_type(const lp_weight *w, int64_t cols, uint32_t type, void **tmp, const char *what,
                           lp_error *err) {
    *tmp = NULL;
    if (w->type == type) return w->data;
    bool packed = type == LP_W8 || type == LP_W4;
    int64_t rows = w->rows, out_cols = packed ? (cols + 31) & ~(int64_t)31 : cols;
    float *f = lp_alloc((size_t)rows * (size_t)out_cols * sizeof(float));
    float *row = lp_alloc((size_t)w->cols * sizeof(float));
    size_t bytes = packed ? lp_pack_bytes(type, rows, out_cols, 32)
                                 : (size_t)rows * (size_t)cols * (type == LP_F16 ? 2 : 4);
    uint8_t *buf = bytes ? lp_alloc(bytes) : NULL;
    const void *result = NULL;
    if (!f || !row || !buf) {
        if (!bytes) lp_fail(err, "%s: W8/W4 need widths that are multiples of 32 (this half is %lld wide)", what,
                            (long long)w->cols);
        else lp_fail(err, "out of memory");
        goto done;
    }
    for (int64_t r = 0; r < rows; r++) {
        float *dst = f + r * out_cols;
        half_row(w, r, row, dst, cols);
        for (int64_t c = cols; c < out_cols; c++) dst[c] = 0.0f; /* packed B padding */
    }
    if (packed) {
        if (lp_pack_weight(type, 32, f, rows, out_cols, buf)) {
            lp_fail(err, "%s: cannot pack a %lld x %lld half as %s", what, (long long)rows, (long long)out_cols,
                    lp_dtype_name(type));
            goto done;
        }
    } else {
        size_t n = (size_t)rows * (size_t)cols;
        for (size_t i = 0; i < n; i++) {
            if (type == LP_F32) {
                memcpy(buf + 4 * i, &f[i], 4);
                continue;
            }
            uint16_t h = lp_f32_to_f16(f[i]);
            if (!isfinite(lp_f16_to_f32(h))) {
                lp_fail(err, "%s: value %g does not fit in F16", what, (double)f[i]);
                goto done;
            }
            memcpy(buf + 2 * i, &h, 2);
        }
    }
    result = *tmp = buf;
    buf = NULL;
done:
    lp_free(f);
    lp_free(row);
    lp_free(buf);
    return result;
}

/* Codes under a shared profile are not values: nothing here reads them. */
static int refuse_profiled(const lp_adapter *a, const char *path, lp_error *err) {
    if (!a->profile_id) return 0;
    return lp_fail(err, "%s: adapter '%s' holds codes of a shared profile (%016llx); use its FP32 "
                   "original", path, a->name, (unsigned long long)a->profile_id);
}

int lp_adapter_write_lpa(const lp_adapter *a, const char *path, int dtype, lp_error *err) {
    if (!a->base) return lp_fail(err, "%s: the adapter must be loaded for a base", path);
    if (refuse_profiled(a, path, err)) return -1;
    if (dtype != -1 && dtype != LP_F32 && dtype != LP_F16 && dtype != LP_W8 && dtype != LP_W4)
        return lp_fail(err, "%s: .lpa data must be F32, F16, W8 or W4", path);
    size_t n_pairs = (size_t)a->n_pairs;
    lp_lpa_entry *es = calloc(n_pairs ? n_pairs : 1, sizeof *es);
    void **tmps = calloc(n_pairs * 2 + 1, sizeof *tmps);
    int rc = es && tmps ? 0 : lp_fail(err, "out of memory");
    uint32_t n = 0;
    for (size_t s = 0; s < n_pairs && rc == 0; s++) {
        const lp_lora_pair *p = &a->pairs[s];
        uint32_t type = dtype == -1 ? p->A.type : (uint32_t)dtype;
        /* W8 groups are 32 wide: a projection whose input is not (stories260K's
         * 172-wide down) keeps F16 */
        if ((type == LP_W8 || type == LP_W4) && p->A.cols % 32) type = LP_F16;
        lp_lpa_entry *e = &es[n++];
        snprintf(e->tensor, sizeof e->tensor, "%s", p->name);
        e->in = (uint64_t)p->A.cols;
        e->out = (uint64_t)p->B.rows;
        e->rank = (uint32_t)p->rank;
        e->dtype = type;
        e->scale = p->scale;
        e->a = as_type(&p->A, p->A.cols, type, &tmps[2 * s], path, err);
        e->b = e->a ? as_type(&p->B, p->rank, type, &tmps[2 * s + 1], path, err) : NULL;
        if (!e->a || !e->b) rc = -1;
    }
    if (rc == 0) {
        lp_lpa_base base = lp_adapter_lpa_base(a->base);
        rc = lp_lpa_write(path, &base, a->name, a->base_name, es, n, err);
    }
    for (size_t i = 0; tmps && i < n_pairs * 2; i++) lp_free(tmps[i]);
    free(tmps);
    free(es);
    return rc;
}

/* ---- writing a llama.cpp GGUF LoRA ------------------------------------------------------ */

/* The alpha that gives every pair its scale through llama.cpp's (and our
 * GGUF loader's) alpha / rank, bit for bit; 0 when there is none. */
static float common_alpha(const lp_adapter *a) {
    if (a->n_pairs == 0) return 0.0f;
    float alpha = a->pairs[0].scale * (float)a->pairs[0].rank;
    if (!(alpha != 0.0f) || !isfinite(alpha)) return 0.0f;
    for (int i = 0; i < a->n_pairs; i++)
        if (alpha / (float)a->pairs[i].rank != a->pairs[i].scale) return 0.0f;
    return alpha;
}

/* One half as GGUF tensor data: rows x cols floats (F32 or F16) in *out. */
static int gguf_half(float *f, int64_t rows, int64_t cols, uint32_t type, void **out, size_t *bytes,
                     const char *what, const char *name, lp_error *err) {
    size_t n = (size_t)rows * (size_t)cols;
    *bytes = n * (type == LP_F16 ? 2 : 4);
    *out = lp_alloc(*bytes ? *bytes : 1);
    if (!*out) return lp_fail(err, "out of memory");
    if (type == LP_F32) {
        memcpy(*out, f, *bytes);
        return 0;
    }
    uint16_t *h = *out;
    for (size_t i = 0; i < n; i++) {
        h[i] = lp_f32_to_f16(f[i]);
        if (!isfinite(lp_f16_to_f32(h[i])))
            return lp_fail(err, "%s: %s: value %g does not fit in F16", what, name, (double)f[i]);
    }
    return 0;
}

/* Pair p's A (rank x in) and B (out x rank) as floats in GGUF's
 * conventions: folded norm gains divided out of A's columns (a zero gain's
 * column is zero in the folded A and stays zero), B's rotary rows in the
 * order the GGUF architecture stores, B x scale when alpha is 0. */
static void gguf_pair_floats(const lp_adapter *a, const lp_lora_pair *p, float alpha, float *A, float *B,
                             float *row) {
    const lp_model *m = a->base;
    const lp_model_weight *mw = &m->weights[p->weight];
    int64_t in = p->A.cols, out = p->B.rows, rank = p->rank;
    for (int64_t r = 0; r < rank; r++) {
        half_row(&p->A, r, row, A + r * in, in);
        for (int64_t c = 0; mw->in_gain && c < in; c++)
            A[r * in + c] = mw->in_gain[c] != 0.0f ? A[r * in + c] / mw->in_gain[c] : 0.0f;
    }
    /* llama.cpp's converter stores llama q/k rows interleaved, others in HF order */
    bool want_interleaved = m->hp.arch == LP_ARCH_LLAMA, have_interleaved = !m->hp.rope_neox;
    int dir = mw->rope_rows && want_interleaved != have_interleaved ? (want_interleaved ? 1 : -1) : 0;
    for (int64_t r = 0; r < out; r++) {
        int64_t src = dir ? (int64_t)lp_rope_source_row((uint64_t)r, m->hp.head_dim, dir) : r;
        half_row(&p->B, src, row, B + r * rank, rank);
        for (int64_t c = 0; alpha == 0.0f && c < rank; c++) B[r * rank + c] *= p->scale;
    }
}

int lp_adapter_write_gguf(const lp_adapter *a, const char *path, int dtype, lp_error *err) {
    if (!a->base) return lp_fail(err, "%s: the adapter must be loaded for a base", path);
    if (refuse_profiled(a, path, err)) return -1;
    uint32_t type = dtype == -1 ? LP_F32 : (uint32_t)dtype;
    if (type != LP_F32 && type != LP_F16)
        return lp_fail(err, "%s: a GGUF LoRA is written as f32 or f16 (llama.cpp reads no int8/int4 LoRA)",
                       path);
    const lp_model *m = a->base;
    float alpha = common_alpha(a);
    lp_gguf_writer *w = lp_gguf_writer_create();
    void **data = calloc((size_t)a->n_pairs * 2 + 1, sizeof *data);
    int rc = w && data ? 0 : lp_fail(err, "out of memory");
    if (rc == 0) {
        lp_gguf_writer_set_str(w, "general.architecture", lp_arch_name(m->hp.arch));
        lp_gguf_writer_set_str(w, "general.type", "adapter");
        lp_gguf_writer_set_str(w, "general.name", a->name);
        lp_gguf_writer_set_str(w, "adapter.type", "lora");
        lp_gguf_writer_set_f32(w, "adapter.lora.alpha", alpha);
    }
    for (int i = 0; i < a->n_pairs && rc == 0; i++) {
        const lp_lora_pair *p = &a->pairs[i];
        int64_t in = p->A.cols, out = p->B.rows, rank = p->rank;
        int64_t widest = in > p->B.cols ? in : p->B.cols;
        float *A = lp_alloc((size_t)rank * (size_t)in * sizeof(float));
        float *B = lp_alloc((size_t)out * (size_t)rank * sizeof(float));
        float *row = lp_alloc((size_t)widest * sizeof(float));
        size_t bytes_a = 0, bytes_b = 0;
        char an[128], bn[128];
        snprintf(an, sizeof an, "%s.lora_a", p->name);
        snprintf(bn, sizeof bn, "%s.lora_b", p->name);
        if (!A || !B || !row) rc = lp_fail(err, "out of memory");
        if (rc == 0) gguf_pair_floats(a, p, alpha, A, B, row);
        if (rc == 0) rc = gguf_half(A, rank, in, type, &data[2 * i], &bytes_a, path, an, err);
        if (rc == 0) rc = gguf_half(B, out, rank, type, &data[2 * i + 1], &bytes_b, path, bn, err);
        if (rc == 0) {
            /* GGUF dims run fastest first: A is [in, rank], B [rank, out] */
            const uint64_t dims_a[2] = {(uint64_t)in, (uint64_t)rank}, dims_b[2] = {(uint64_t)rank, (uint64_t)out};
            lp_gguf_writer_add_tensor(w, an, type, 2, dims_a, data[2 * i], bytes_a);
            lp_gguf_writer_add_tensor(w, bn, type, 2, dims_b, data[2 * i + 1], bytes_b);
        }
        lp_free(A);
        lp_free(B);
        lp_free(row);
    }
    if (rc == 0) rc = lp_gguf_writer_write(w, path, err);
    for (int i = 0; data && i < a->n_pairs * 2; i++) lp_free(data[i]);
    free(data);
    lp_gguf_writer_free(w);
    return rc;
}

/* ---- concatenation: the all-adapters baseline ---------------------------------------------- */

/* One weight's pairs of every adapter as one pair of their summed rank:
 * A rows stacked, B columns side by side with each adapter's scale folded
 * in. Written as `type` (packed types need inputs that are multiples of 32). */
static int concat_pair(const lp_adapter *const *as, int n, int w, uint32_t type, lp_lpa_entry *e, void **tmp,
                       const char *path, lp_error *err) {
    int rank = 0;
    int64_t in = 0, out = 0;
    for (int k = 0; k < n; k++) {
        const lp_lora_pair *p = lp_adapter_pair(as[k], w);
        if (!p) continue;
        rank += p->rank;
        in = p->A.cols;
        out = p->B.rows;
    }
    lp_weight A = {.type = LP_F32, .rows = rank, .cols = in, .row_bytes = (size_t)in * sizeof(float)};
    lp_weight B = {.type = LP_F32, .rows = out, .cols = rank, .row_bytes = (size_t)rank * sizeof(float)};
    float *fa = lp_alloc((size_t)rank * (size_t)in * sizeof(float)), *fb = lp_alloc((size_t)out * (size_t)rank * sizeof(float));
    float *row = lp_alloc(((size_t)rank + 32) * sizeof(float)); /* a B row, packed padding included */
    int rc = fa && fb && row ? 0 : lp_fail(err, "out of memory");
    for (int k = 0, at = 0; k < n && rc == 0; k++) {
        const lp_lora_pair *p = lp_adapter_pair(as[k], w);
        if (!p) continue;
        for (int r = 0; r < p->rank; r++) lp_weight_dequantize_row(&p->A, r, fa + (size_t)(at + r) * (size_t)in);
        for (int64_t o = 0; o < out; o++) {
            lp_weight_dequantize_row(&p->B, o, row);
            for (int r = 0; r < p->rank; r++) fb[o * rank + at + r] = p->scale * row[r];
        }
        at += p->rank;
    }
    A.data = fa;
    B.data = fb;
    if ((type == LP_W8 || type == LP_W4) && in % 32) type = LP_F16;
    if (rc == 0) {
        *e = (lp_lpa_entry){.rank = (uint32_t)rank, .dtype = type, .scale = 1.0f, .in = (uint64_t)in,
                            .out = (uint64_t)out};
        snprintf(e->tensor, sizeof e->tensor, "%s", as[0]->base->weights[w].name);
        e->a = as_type(&A, in, type, &tmp[0], path, err);
        e->b = e->a ? as_type(&B, rank, type, &tmp[1], path, err) : NULL;
        if (!e->a || !e->b) rc = -1;
        /* halves already of the type are used as they are: tmp owns them */
        if (e->a == fa) {
            tmp[0] = fa;
            fa = NULL;
        }
        if (e->b == fb) {
            tmp[1] = fb;
            fb = NULL;
        }
    }
    lp_free(fa);
    lp_free(fb);
    lp_free(row);
    return rc;
}

int lp_adapter_write_concat(const lp_adapter *const *adapters, int n, const char *path, lp_error *err) {
    if (n < 1 || !adapters[0]->base) return lp_fail(err, "%s: concatenation needs adapters loaded for a base", path);
    const lp_model *base = adapters[0]->base;
    for (int k = 1; k < n; k++)
        if (adapters[k]->base != base) return lp_fail(err, "%s: the adapters are for different bases", path);
    for (int k = 0; k < n; k++)
        if (refuse_profiled(adapters[k], path, err)) return -1;
    lp_lpa_entry *es = calloc((size_t)base->n_weights + 1, sizeof *es);
    void **tmps = calloc(2 * (size_t)base->n_weights + 2, sizeof *tmps);
    int rc = es && tmps ? 0 : lp_fail(err, "out of memory");
    uint32_t m = 0;
    uint32_t type = adapters[0]->n_pairs ? adapters[0]->pairs[0].A.type : LP_F32;
    for (int w = 0; w < base->n_weights && rc == 0; w++) {
        bool any = false;
        for (int k = 0; k < n; k++) any |= lp_adapter_pair(adapters[k], w) != NULL;
        if (any) rc = concat_pair(adapters, n, w, type, &es[m], &tmps[2 * m], path, err);
        if (any && rc == 0) m++;
    }
    if (rc == 0) {
        lp_lpa_base b = lp_adapter_lpa_base(base);
        rc = lp_lpa_write(path, &b, "concatenated", adapters[0]->base_name, es, m, err);
    }
    for (size_t i = 0; tmps && i < 2 * (size_t)base->n_weights + 2; i++) lp_free(tmps[i]);
    free(tmps);
    free(es);
    return rc;
}

/* ---- merging ------------------------------------------------------------------------------ */

static float *to_f32(const lp_weight *w) {
    float *out = lp_alloc((size_t)w->rows * (size_t)w->cols * sizeof(float));
    if (!out) return NULL;
    for (int64_t r = 0; r < w->rows; r++) lp_weight_dequantize_row(w, r, out + r * w->cols);
    return out;
}

/* W += scale * B A, with delta = B A accumulated first (as llama.cpp does). */
static int add_low_rank(float *W, const lp_lora_pair *p, int64_t rows, int64_t cols) {
    float *A = to_f32(&p->A), *B = to_f32(&p->B), *delta = lp_alloc((size_t)cols * sizeof(float));
    int rc = A && B && delta ? 0 : -1;
    for (int64_t r = 0; r < rows && rc == 0; r++) {
        memset(delta, 0, (size_t)cols * sizeof(float));
        for (int k = 0; k < p->rank; k++) {
            float b = B[r * p->B.cols + k];
            const float *arow = A + (int64_t)k * cols;
            for (int64_t c = 0; c < cols; c++) delta[c] += b * arow[c];
        }
        for (int64_t c = 0; c < cols; c++) W[r * cols + c] += p->scale * delta[c];
    }
    lp_free(A);
    lp_free(B);
    lp_free(delta);
    return rc;
}

int lp_adapter_merge(const lp_model *base, const lp_adapter *const *adapters, int n,
                     const char *out_path, lp_error *err) {
    if (!base->gguf)
        return lp_fail(err, "%s: merging needs a GGUF base (this base is %s)", base->path,
                       base->format);
    for (int i = 0; i < n; i++)
        if (refuse_profiled(adapters[i], out_path, err)) return -1;
    for (int i = 0; i < n; i++)
        if (adapters[i]->base != base)
            return lp_fail(err, "adapter '%s' was not loaded for this base", adapters[i]->name);
    const lp_gguf *g = base->gguf;
    lp_gguf_writer *w = lp_gguf_writer_create();
    if (!w) return lp_fail(err, "out of memory");
    for (size_t i = 0; i < lp_gguf_kv_count(g); i++) {
        const lp_gguf_kv *kv = lp_gguf_kv_at(g, i);
        if (lp_str_eq(kv->key, "general.file_type")) continue; /* types change */
        /* our tokenizer trainer names the GPT-2 pre-tokenizer "gpt2"; llama.cpp
         * knows it only as "gpt-2", and a merged file is for other tools too */
        if (lp_str_eq(kv->key, "tokenizer.ggml.pre") && kv->type == LP_GGUF_STRING && lp_str_eq(kv->v.s, "gpt2")) {
            lp_gguf_writer_set_str(w, "tokenizer.ggml.pre", "gpt-2");
            continue;
        }
        lp_gguf_writer_copy_kv(w, kv);
    }
    int rc = 0;
    for (size_t i = 0; i < lp_gguf_tensor_count(g) && rc == 0; i++) {
        const lp_gguf_tensor *t = lp_gguf_tensor_at(g, i);
        char name[192];
        lp_adapter_copy_name(name, sizeof name, t->name.ptr, t->name.len);
        int wid = lp_model_weight_by_name(base, name);
        bool adapted = false;
        for (int k = 0; k < n && wid >= 0; k++) adapted |= lp_adapter_pair(adapters[k], wid) != NULL;
        if (!adapted) {
            lp_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->dims, t->data, t->n_bytes);
            continue;
        }
        const lp_weight *bw = base->weights[wid].w;
        float *W = to_f32(bw);
        if (!W) rc = lp_fail(err, "out of memory merging %s", name);
        for (int k = 0; k < n && rc == 0; k++) {
            const lp_lora_pair *p = lp_adapter_pair(adapters[k], wid);
            if (p && add_low_rank(W, p, bw->rows, bw->cols))
                rc = lp_fail(err, "out of memory merging %s", name);
        }
        if (rc == 0) {
            uint64_t dims[2] = {(uint64_t)bw->cols, (uint64_t)bw->rows};
            lp_gguf_writer_add_tensor_copy(w, name, LP_F32, 2, dims, W,
                                           (size_t)bw->rows * (size_t)bw->cols * sizeof(float));
        }
        lp_free(W);
    }
    if (rc == 0) rc = lp_gguf_writer_write(w, out_path, err);
    lp_gguf_writer_free(w);
    return rc;
}
