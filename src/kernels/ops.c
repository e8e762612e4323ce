/* The small vector ops of a transformer layer. */
#include "kernels.h"

#include <math.h>

float lp_dot_f32_ref(const float *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void lp_axpy(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

void lp_round_f16(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = lp_f16_to_f32(lp_f32_to_f16(x[i]));
}

void lp_to_f16(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = lp_f32_to_f16(src[i]);
}

/* Row j of a V run as floats: f32 rows in place, f16 rows converted
 * (exactly) into buf (d <= LP_HEAD_DIM_MAX), once for all the heads that
 * read it. */
static const float *kv_row(const void *base, int64_t j, int64_t stride, bool f16, int64_t d, float *buf) {
    if (!f16) return (const float *)base + j * stride;
    const uint16_t *h = (const uint16_t *)base + j * stride;
    for (int64_t i = 0; i < d; i++) buf[i] = lp_f16_to_f32(h[i]);
    return buf;
}

/* One fmaf chain per score over the keys' values as floats: the same
 * operations on the same values, whatever the storage. */
void lp_attn_scores(const float *q, int64_t q_stride, int nq, const void *kt, bool k_f16, int64_t kt_stride, int nk,
                    int64_t d, float scale, float *s, int64_t s_stride) {
    for (int h = 0; h < nq; h++)
        for (int j = 0; j < nk; j++) {
            float acc = 0.0f;
            for (int64_t c = 0; c < d; c++) {
                int64_t at = c * kt_stride + j;
                float kc = k_f16 ? lp_f16_to_f32(((const uint16_t *)kt)[at]) : ((const float *)kt)[at];
                acc = fmaf(q[h * q_stride + c], kc, acc);
            }
            s[h * s_stride + j] = acc * scale;
        }
}

/* lp_axpy on the V rows as floats (the same operations on the same values,
 * whatever the storage), rows j in order for every head: each output sums
 * its terms in row order, as one lp_axpy per row would. */
void lp_attn_mix(float *out, int64_t out_stride, int nq, const float *p, int64_t p_stride, const void *v, bool v_f16,
                 int64_t v_stride, int nk, int64_t d) {
    float buf[LP_HEAD_DIM_MAX];
    for (int j = 0; j < nk; j++) {
        const float *vj = kv_row(v, j, v_stride, v_f16, d, buf);
        for (int h = 0; h < nq; h++) lp_axpy(out + h * out_stride, p[h * p_stride + j], vj, d);
    }
}

/* In double: for large n a float sum would drift, and the result then
 * rounds to what a float implementation intends. Eight partial sums
 * (element i into sum i % 8, added pairwise at the end), so the compiler
 * can keep them in vectors: one chain of dependent adds over 2048 values
 * took 2.7 us a row, a quarter of an 8-stream step's row work. */
double lp_sum_squares(const float *x, int64_t n) {
    double part[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) part[l] += (double)x[i + l] * (double)x[i + l];
    for (int l = 0; i < n; i++, l++) part[l] += (double)x[i] * (double)x[i];
    return ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
}

void lp_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    double ss = lp_sum_squares(x, n);
    float mean = n > 0 ? (float)(ss / (double)n) : 0.0f;
    float scale = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < n; i++) out[i] = w ? x[i] * scale * w[i] : x[i] * scale;
}

void lp_softmax(float *x, int64_t n) {
    if (n <= 0) return;
    float max = x[0];
    for (int64_t i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void lp_silu_mul(float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
