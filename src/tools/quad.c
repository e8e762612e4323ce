/* QUAD tools: FP32 LoRA copies, ranges, and writing adapters as codes under
 * a shared profile (quad.h). */
#include "quad.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../formats/lpa.h"

void lp_quad_lora_free(lp_quad_lora *q) {
    for (int w = 0; q->A && w < q->n_weights; w++) {
        lp_free(q->A[w]);
        lp_free(q->B[w]);
    }
    free(q->A);
    free(q->B);
    free(q->rank);
    free(q->scale);
    memset(q, 0, sizeof *q);
}

int lp_quad_lora_from_adapter(lp_quad_lora *q, const lp_adapter *a, lp_error *err) {
    memset(q, 0, sizeof *q);
    if (!a->base) return lp_fail(err, "%s: not loaded for a base", a->name);
    if (a->profile_id) return lp_fail(err, "%s: already quantized under a profile (give its FP32 original)", a->name);
    int n = a->base->n_weights;
    q->base = a->base;
    q->n_weights = n;
    snprintf(q->name, sizeof q->name, "%s", a->name);
    q->rank = calloc((size_t)n, sizeof *q->rank);
    q->scale = calloc((size_t)n, sizeof *q->scale);
    q->A = calloc((size_t)n, sizeof *q->A);
    q->B = calloc((size_t)n, sizeof *q->B);
    if (!q->rank || !q->scale || !q->A || !q->B) goto nomem;
    for (int i = 0; i < a->n_pairs; i++) {
        const lp_lora_pair *p = &a->pairs[i];
        int w = p->weight, r = p->rank;
        int64_t in = p->A.cols, out = p->B.rows, bc = p->B.cols;
        q->rank[w] = r;
        q->scale[w] = p->scale;
        q->A[w] = lp_alloc((size_t)r * (size_t)in * sizeof(float));
        q->B[w] = lp_alloc((size_t)out * (size_t)r * sizeof(float));
        float *row = lp_alloc((size_t)bc * sizeof(float));
        if (!q->A[w] || !q->B[w] || !row) {
            lp_free(row);
            goto nomem;
        }
        for (int j = 0; j < r; j++) lp_weight_dequantize_row(&p->A, j, q->A[w] + (size_t)j * (size_t)in);
        for (int64_t o = 0; o < out; o++) {
            lp_weight_dequantize_row(&p->B, o, row);
            memcpy(q->B[w] + (size_t)o * (size_t)r, row, (size_t)r * sizeof(float));
        }
        lp_free(row);
    }
    return 0;
nomem:
    lp_quad_lora_free(q);
    return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
}

void lp_quad_ranges(const float *m, int rows, int cols, int n_ch, float *lo, float *hi) {
    for (int r = 0; r < rows; r++) {
        int c = n_ch > 1 ? r : 0;
        for (int k = 0; k < cols; k++) {
            float v = m[(size_t)r * (size_t)cols + (size_t)k];
            if (v < lo[c]) lo[c] = v;
            if (v > hi[c]) hi[c] = v;
        }
    }
}

/* rows x cols codes of m under per-row (n > 1) or per-tensor encodings,
 * packed as `dtype` (LP_LPA_Q8 / Q4) into dst. */
static void encode(const float *m, int rows, int cols, const lp_qenc *enc, uint32_t n, int qmax, uint32_t dtype,
                   uint8_t *dst) {
    size_t rb = lp_lpa_code_row_bytes(dtype, (uint64_t)cols);
    memset(dst, 0, rb * (size_t)rows);
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < cols; k++) {
            int q = lp_q_code(m[(size_t)r * (size_t)cols + (size_t)k], enc[n > 1 ? r : 0], qmax);
            if (dtype == LP_LPA_Q8) dst[(size_t)r * rb + (size_t)k] = (uint8_t)q;
            else dst[(size_t)r * rb + (size_t)k / 2] |= (uint8_t)(k % 2 ? q << 4 : q);
        }
}

static void fake(float *m, int rows, int cols, const lp_qenc *enc, uint32_t n, int qmax) {
    for (int r = 0; r < rows; r++) {
        lp_qenc e = enc[n > 1 ? r : 0];
        for (int k = 0; k < cols; k++) {
            float *v = &m[(size_t)r * (size_t)cols + (size_t)k];
            *v = lp_q_value(lp_q_code(*v, e, qmax), e);
        }
    }
}

void lp_quad_fake_quantize(lp_quad_lora *fp, const lp_lpq *profile) {
    int qmax = (1 << profile->weight_bits) - 1;
    for (uint32_t i = 0; i < profile->n_entries; i++) {
        const lp_lpq_entry *e = &profile->entries[i];
        int w = lp_model_weight_by_name(fp->base, e->tensor);
        if (w < 0 || fp->rank[w] != (int)e->rank) continue;
        fake(fp->A[w], (int)e->rank, (int)e->in, e->a, e->na, qmax);
        fake(fp->B[w], (int)e->out, (int)e->rank, e->b, e->nb, qmax);
    }
}

int lp_quad_write_adapter(const char *path, const lp_model *base, const lp_lpq *profile,
                          const lp_quad_lora *fp, lp_error *err) {
    uint32_t dtype = profile->weight_bits == 4 ? LP_LPA_Q4 : LP_LPA_Q8;
    int qmax = (1 << profile->weight_bits) - 1, adapted = 0;
    for (int w = 0; w < fp->n_weights; w++) adapted += fp->rank[w] > 0;
    lp_lpa_entry *es = calloc(profile->n_entries, sizeof *es);
    uint8_t **blocks = calloc(2 * (size_t)profile->n_entries, sizeof *blocks);
    int rc = (!es || !blocks) ? lp_error_set(err, LP_ERR_NOMEM, "out of memory") : 0;
    if (rc == 0 && adapted != (int)profile->n_entries)
        rc = lp_fail(err, "%s: the adapter adapts %d weights, the profile %u", fp->name, adapted,
                     profile->n_entries);
    for (uint32_t i = 0; rc == 0 && i < profile->n_entries; i++) {
        const lp_lpq_entry *e = &profile->entries[i];
        int w = lp_model_weight_by_name(base, e->tensor);
        if (w < 0 || w >= fp->n_weights || fp->rank[w] != (int)e->rank) {
            rc = lp_fail(err, "%s: %s: the adapter %s", fp->name, e->tensor,
                         w < 0 || w >= fp->n_weights || !fp->rank[w] ? "does not adapt it" : "has another rank");
            break;
        }
        size_t ab = (size_t)e->rank * lp_lpa_code_row_bytes(dtype, e->in);
        size_t bb = (size_t)e->out * lp_lpa_code_row_bytes(dtype, e->rank);
        blocks[2 * i] = malloc(ab);
        blocks[2 * i + 1] = malloc(bb);
        if (!blocks[2 * i] || !blocks[2 * i + 1]) {
            rc = lp_error_set(err, LP_ERR_NOMEM, "out of memory");
            break;
        }
        encode(fp->A[w], (int)e->rank, (int)e->in, e->a, e->na, qmax, dtype, blocks[2 * i]);
        encode(fp->B[w], (int)e->out, (int)e->rank, e->b, e->nb, qmax, dtype, blocks[2 * i + 1]);
        lp_lpa_entry *le = &es[i];
        snprintf(le->tensor, sizeof le->tensor, "%s", e->tensor);
        le->rank = e->rank;
        le->dtype = dtype;
        le->scale = fp->scale[w];
        le->in = e->in;
        le->out = e->out;
        le->a = blocks[2 * i];
        le->b = blocks[2 * i + 1];
    }
    if (rc == 0) {
        lp_lpa_base b = lp_adapter_lpa_base(base);
        rc = lp_lpa_write_profiled(path, &b, fp->name, "", profile->id, es, profile->n_entries, err);
    }
    for (uint32_t i = 0; blocks && i < 2 * profile->n_entries; i++) free(blocks[i]);
    free(blocks);
    free(es);
    return rc;
}

/* ---- profiles ------------------------------------------------------------------------ */

int lp_quad_acts_init(lp_quad_acts *a, int n, int n_bins, lp_error *err) {
    memset(a, 0, sizeof *a);
    a->n_weights = n;
    a->n_bins = n_bins > 0 ? n_bins : 0;
    if (a->n_bins > LP_QUAD_MAX_BINS)
        return lp_fail(err, "at most %d histogram bins (%d asked)", LP_QUAD_MAX_BINS, n_bins);
    float **f[4] = {&a->x_lo, &a->x_hi, &a->t_lo, &a->t_hi};
    bool ok = true;
    for (int i = 0; i < 4; i++) ok = (*f[i] = malloc((size_t)(n ? n : 1) * sizeof(float))) && ok;
    if (ok && a->n_bins) {
        size_t nh = (size_t)(n ? n : 1) * (size_t)a->n_bins;
        ok = (a->x_hist = calloc(nh, sizeof(double))) && (a->t_hist = calloc(nh, sizeof(double)));
    }
    if (!ok) {
        lp_quad_acts_free(a);
        return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    }
    for (int w = 0; w < n; w++) {
        a->x_lo[w] = a->t_lo[w] = INFINITY;
        a->x_hi[w] = a->t_hi[w] = -INFINITY;
    }
    return 0;
}

void lp_quad_acts_free(lp_quad_acts *a) {
    free(a->x_lo);
    free(a->x_hi);
    free(a->t_lo);
    free(a->t_hi);
    free(a->x_hist);
    free(a->t_hist);
    memset(a, 0, sizeof *a);
}

/* Adds the counts of src (nb bins over [slo, shi]) into dst (nb bins over
 * [dlo, dhi], which holds [slo, shi]), each bin's count at its centre. */
static void rebin_add(double *dst, float dlo, float dhi, const double *src, float slo, float shi, int nb) {
    float sw = (shi - slo) / (float)nb, per = dhi > dlo ? (float)nb / (dhi - dlo) : 0.0f;
    for (int i = 0; i < nb; i++) {
        if (src[i] == 0) continue;
        dst[lp_q_bin(slo + ((float)i + 0.5f) * sw, dlo, per, nb)] += src[i];
    }
}

/* One range and its histogram widened to hold another's. */
static void union_one(float *dlo, float *dhi, double *dh, float slo, float shi, const double *sh, int nb) {
    if (!(slo <= shi)) return; /* src saw nothing */
    float lo = fminf(*dlo, slo), hi = fmaxf(*dhi, shi);
    if (dh && sh) {
        double old[LP_QUAD_MAX_BINS];
        if (*dlo <= *dhi && (lo != *dlo || hi != *dhi)) {
            memcpy(old, dh, (size_t)nb * sizeof *dh);
            memset(dh, 0, (size_t)nb * sizeof *dh);
            rebin_add(dh, lo, hi, old, *dlo, *dhi, nb);
        }
        rebin_add(dh, lo, hi, sh, slo, shi, nb);
    }
    *dlo = lo;
    *dhi = hi;
}

void lp_quad_acts_union(lp_quad_acts *d, const lp_quad_acts *s) {
    int nb = d->n_bins == s->n_bins ? d->n_bins : 0; /* both <= LP_QUAD_MAX_BINS (init) */
    for (int w = 0; w < d->n_weights && w < s->n_weights; w++) {
        size_t at = (size_t)w * (size_t)nb;
        union_one(&d->x_lo[w], &d->x_hi[w], nb ? d->x_hist + at : NULL, s->x_lo[w], s->x_hi[w],
                  nb ? s->x_hist + at : NULL, nb);
        union_one(&d->t_lo[w], &d->t_hi[w], nb ? d->t_hist + at : NULL, s->t_lo[w], s->t_hi[w],
                  nb ? s->t_hist + at : NULL, nb);
    }
}

/* Expected squared error of h (nb bins over [lo, hi]) under encoding e. */
static double enc_mse(const double *h, int nb, float lo, float hi, lp_qenc e, int qmax) {
    double w = ((double)hi - lo) / nb, a = -(double)e.zero * e.scale, b = (double)(qmax - e.zero) * e.scale;
    double inside = (double)e.scale * e.scale / 12.0, sum = 0;
    for (int i = 0; i < nb; i++) {
        if (h[i] == 0) continue;
        double c = lo + (i + 0.5) * w, d = c < a ? a - c : c > b ? c - b : 0;
        sum += h[i] * (d > 0 ? d * d : inside);
    }
    return sum;
}

lp_qenc lp_qenc_mse(const double *h, int nb, float lo, float hi, int qmax) {
    if (!(lo <= 0.0f)) lo = 0.0f;
    if (!(hi >= 0.0f)) hi = 0.0f;
    lp_qenc best = lp_qenc_from_range(lo, hi, qmax);
    if (!h || nb < 1 || !(hi - lo > 0) || !isfinite(hi - lo)) return best;
    enum { GRID = 40 };
    double best_err = enc_mse(h, nb, lo, hi, best, qmax);
    for (int i = 1; i <= GRID; i++)
        for (int j = 1; j <= GRID; j++) {
            lp_qenc e = lp_qenc_from_range(lo * (float)i / GRID, hi * (float)j / GRID, qmax);
            double err = enc_mse(h, nb, lo, hi, e, qmax);
            if (err < best_err) best_err = err, best = e;
        }
    return best;
}

static int cmp_lpq_entry(const void *x, const void *y) {
    return strcmp(((const lp_lpq_entry *)x)->tensor, ((const lp_lpq_entry *)y)->tensor);
}

static int profile_entry(const lp_model *base, int w, const lp_quad_lora *const *fps, int n, const lp_quad_acts *acts,
                         int qmax, bool chan, lp_lpq_entry *e, lp_error *err) {
    int rank = fps[0]->rank[w];
    snprintf(e->tensor, sizeof e->tensor, "%s", base->weights[w].name);
    e->rank = (uint32_t)rank;
    e->in = (uint32_t)base->weights[w].w->cols;
    e->out = (uint32_t)base->weights[w].w->rows;
    e->na = chan ? e->rank : 1;
    e->nb = chan ? e->out : 1;
    e->a = malloc(e->na * sizeof *e->a);
    e->b = malloc(e->nb * sizeof *e->b);
    float *lo = malloc((e->na + e->nb) * sizeof(float)), *hi = malloc((e->na + e->nb) * sizeof(float));
    if (!e->a || !e->b || !lo || !hi) {
        free(lo);
        free(hi);
        return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    }
    for (uint32_t c = 0; c < e->na + e->nb; c++) lo[c] = INFINITY, hi[c] = -INFINITY;
    for (int k = 0; k < n; k++) {
        lp_quad_ranges(fps[k]->A[w], rank, (int)e->in, (int)e->na, lo, hi);
        lp_quad_ranges(fps[k]->B[w], (int)e->out, rank, (int)e->nb, lo + e->na, hi + e->na);
    }
    for (uint32_t c = 0; c < e->na; c++) e->a[c] = lp_qenc_from_range(lo[c], hi[c], qmax);
    for (uint32_t c = 0; c < e->nb; c++) e->b[c] = lp_qenc_from_range(lo[e->na + c], hi[e->na + c], qmax);
    free(lo);
    free(hi);
    size_t at = (size_t)w * (size_t)acts->n_bins;
    e->x = acts->n_bins ? lp_qenc_mse(acts->x_hist + at, acts->n_bins, acts->x_lo[w], acts->x_hi[w], 255)
                        : lp_qenc_from_range(acts->x_lo[w], acts->x_hi[w], 255);
    e->t = acts->n_bins ? lp_qenc_mse(acts->t_hist + at, acts->n_bins, acts->t_lo[w], acts->t_hi[w], 255)
                        : lp_qenc_from_range(acts->t_lo[w], acts->t_hi[w], 255);
    return 0;
}

int lp_quad_build_profile(const lp_model *base, const lp_quad_lora *const *fps, int n, const lp_quad_acts *acts,
                          int bits, int granularity, int strategy, const char *anchor, lp_lpq *out,
                          lp_error *err) {
    memset(out, 0, sizeof *out);
    if (n < 1 || (bits != 8 && bits != 4)) return lp_fail(err, "a profile needs adapters and 8 or 4 bits");
    for (int k = 1; k < n; k++)
        for (int w = 0; w < base->n_weights; w++)
            if (fps[k]->rank[w] != fps[0]->rank[w])
                return lp_fail(err, "%s and %s adapt %s differently (rank %d vs %d): one profile needs one "
                               "shape", fps[0]->name, fps[k]->name, base->weights[w].name, fps[0]->rank[w],
                               fps[k]->rank[w]);
    out->weight_bits = (uint32_t)bits;
    out->act_bits = 8;
    out->granularity = (uint32_t)granularity;
    out->strategy = (uint32_t)strategy;
    out->base_fingerprint = lp_model_fingerprint(base);
    snprintf(out->anchor, sizeof out->anchor, "%s", anchor ? anchor : "");
    out->entries = calloc((size_t)base->n_weights + 1, sizeof *out->entries);
    if (!out->entries) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    for (int w = 0; w < base->n_weights; w++) {
        if (!fps[0]->rank[w]) continue;
        lp_lpq_entry *e = &out->entries[out->n_entries++];
        if (profile_entry(base, w, fps, n, acts, (1 << bits) - 1, granularity == LP_LPQ_PER_CHANNEL, e, err)) {
            lp_lpq_release(out);
            return -1;
        }
    }
    qsort(out->entries, out->n_entries, sizeof *out->entries, cmp_lpq_entry); /* as files hold them (lp_lpq_find) */
    return 0;
}

/* ---- AIMET encodings JSON ----------------------------------------------------------------- */

/* One AIMET encoding: offset = -zero, min = offset * scale, max = (qmax +
 * offset) * scale, unsigned codes (is_symmetric "False", as AIMET writes
 * booleans in this file). */
static cJSON *aimet_encoding(lp_qenc e, int bits) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    int qmax = (1 << bits) - 1, offset = -e.zero;
    cJSON_AddNumberToObject(o, "bitwidth", bits);
    cJSON_AddStringToObject(o, "dtype", "int");
    cJSON_AddStringToObject(o, "is_symmetric", "False");
    cJSON_AddNumberToObject(o, "max", (double)e.scale * (double)(qmax + offset));
    cJSON_AddNumberToObject(o, "min", (double)e.scale * (double)offset);
    cJSON_AddNumberToObject(o, "offset", offset);
    cJSON_AddNumberToObject(o, "scale", (double)e.scale);
    return o;
}

static bool add_encodings(cJSON *parent, const char *name, const lp_qenc *e, uint32_t n, int bits) {
    cJSON *list = cJSON_AddArrayToObject(parent, name);
    if (!list) return false;
    for (uint32_t i = 0; i < n; i++) {
        cJSON *o = aimet_encoding(e[i], bits);
        if (!o || !cJSON_AddItemToArray(list, o)) return false;
    }
    return true;
}

/* "blk.3.attn_q.weight" -> "blk.3.attn_q" */
static void stem(const char *tensor, char *out, size_t cap) {
    size_t n = strlen(tensor);
    if (n > 7 && !strcmp(tensor + n - 7, ".weight")) n -= 7;
    snprintf(out, cap, "%.*s", (int)n, tensor);
}

int lp_quad_export_aimet(const lp_lpq *q, const char *path, lp_error *err) {
    cJSON *root = cJSON_CreateObject();
    cJSON *acts = root ? cJSON_AddObjectToObject(root, "activation_encodings") : NULL;
    cJSON *params = root ? cJSON_AddObjectToObject(root, "param_encodings") : NULL;
    bool ok = acts && params && cJSON_AddArrayToObject(root, "excluded_layers") &&
              cJSON_AddStringToObject(root, "version", "0.6.1");
    for (uint32_t i = 0; ok && i < q->n_entries; i++) {
        const lp_lpq_entry *e = &q->entries[i];
        char base[LP_LPQ_TENSOR_BYTES], name[LP_LPQ_TENSOR_BYTES + 16];
        stem(e->tensor, base, sizeof base);
        snprintf(name, sizeof name, "%s.lora_A", base);
        ok = add_encodings(params, name, e->a, e->na, (int)q->weight_bits);
        snprintf(name, sizeof name, "%s.lora_B", base);
        ok = ok && add_encodings(params, name, e->b, e->nb, (int)q->weight_bits);
        snprintf(name, sizeof name, "%s.lora_x", base);
        ok = ok && add_encodings(acts, name, &e->x, 1, (int)q->act_bits);
        snprintf(name, sizeof name, "%s.lora_t", base);
        ok = ok && add_encodings(acts, name, &e->t, 1, (int)q->act_bits);
    }
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory building the JSON", path);
    FILE *f = fopen(path, "w");
    bool wrote = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    wrote = f && fclose(f) == 0 && wrote;
    cJSON_free(text);
    if (!wrote) return lp_error_set(err, LP_ERR_IO, "%s: cannot write", path);
    return 0;
}
