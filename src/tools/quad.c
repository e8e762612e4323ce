/* QUAD tools: FP32 LoRA copies, ranges, and writing adapters as codes under
 * a shared profile (quad.h). */
#include "quad.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
