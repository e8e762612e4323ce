/* A deliberately plain, double-precision forward pass over a whole token
 * sequence, written straight from the architecture description (no batching,
 * no KV cache, no SIMD). Tests compare lp_forward's logits against it. */
#ifndef LP_TEST_NAIVE_FORWARD_H
#define LP_TEST_NAIVE_FORWARD_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

static double *naive_matrix_row(const lp_weight *w, int64_t r, float *tmp, double *out) {
    lp_weight_dequantize_row(w, r, tmp);
    for (int64_t c = 0; c < w->cols; c++) out[c] = tmp[c];
    return out;
}

/* y[rows] = W x */
static void naive_matvec(const lp_weight *w, const double *x, double *y) {
    float *tmp = malloc((size_t)w->cols * sizeof(float));
    double *row = malloc((size_t)w->cols * sizeof(double));
    for (int64_t r = 0; r < w->rows; r++) {
        naive_matrix_row(w, r, tmp, row);
        double s = 0;
        for (int64_t c = 0; c < w->cols; c++) s += row[c] * x[c];
        y[r] = s;
    }
    free(tmp);
    free(row);
}

static void naive_rmsnorm(double *out, const double *x, const float *w, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    double scale = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * (w ? w[i] : 1.0);
}

static void naive_rope(const lp_model *m, double *v, int n_heads, int pos) {
    int d = m->hp.head_dim, half = d / 2;
    for (int h = 0; h < n_heads; h++) {
        double *x = v + (size_t)h * d;
        for (int i = 0; i < half; i++) {
            double angle = (double)pos * (double)m->rope_inv_freq[i];
            int a = m->hp.rope_neox ? i : 2 * i, b = m->hp.rope_neox ? i + half : 2 * i + 1;
            double x0 = x[a], x1 = x[b];
            x[a] = x0 * cos(angle) - x1 * sin(angle);
            x[b] = x0 * sin(angle) + x1 * cos(angle);
        }
    }
}

/* Logits (n_vocab doubles) after the last of n tokens (positions 0..n-1). */
static void naive_forward(const lp_model *m, const int32_t *tokens, int n, double *logits) {
    const lp_hparams *hp = &m->hp;
    int64_t dim = hp->dim, d = hp->head_dim, q_dim = hp->n_heads * d, kv_dim = hp->n_kv_heads * d;
    int64_t ffn = hp->ffn_dim;
    double *x = calloc((size_t)(n * dim), sizeof(double));
    double *xn = calloc((size_t)dim, sizeof(double));
    double *q = calloc((size_t)(n * q_dim), sizeof(double));
    double *k = calloc((size_t)(n * kv_dim), sizeof(double));
    double *v = calloc((size_t)(n * kv_dim), sizeof(double));
    double *att = calloc((size_t)q_dim, sizeof(double));
    double *tmp = calloc((size_t)(dim > ffn ? (dim > q_dim ? dim : q_dim) : ffn), sizeof(double));
    double *g = calloc((size_t)ffn, sizeof(double)), *u = calloc((size_t)ffn, sizeof(double));
    double *scores = calloc((size_t)n, sizeof(double));
    float *row = malloc((size_t)dim * sizeof(float));
    for (int t = 0; t < n; t++) {
        lp_weight_dequantize_row(&m->tok_embd, tokens[t], row);
        for (int64_t i = 0; i < dim; i++) x[t * dim + i] = row[i];
    }
    for (int l = 0; l < hp->n_layers; l++) {
        const lp_layer *L = &m->layers[l];
        for (int t = 0; t < n; t++) {
            naive_rmsnorm(xn, x + t * dim, L->attn_norm, dim, hp->rms_eps);
            naive_matvec(&L->wq, xn, q + t * q_dim);
            naive_matvec(&L->wk, xn, k + t * kv_dim);
            naive_matvec(&L->wv, xn, v + t * kv_dim);
            for (int64_t i = 0; i < q_dim; i++) q[t * q_dim + i] += L->bq ? L->bq[i] : 0;
            for (int64_t i = 0; i < kv_dim; i++) {
                k[t * kv_dim + i] += L->bk ? L->bk[i] : 0;
                v[t * kv_dim + i] += L->bv ? L->bv[i] : 0;
            }
            if (L->q_norm) {
                for (int h = 0; h < hp->n_heads; h++)
                    naive_rmsnorm(q + t * q_dim + h * d, q + t * q_dim + h * d, L->q_norm, d, hp->rms_eps);
                for (int h = 0; h < hp->n_kv_heads; h++)
                    naive_rmsnorm(k + t * kv_dim + h * d, k + t * kv_dim + h * d, L->k_norm, d, hp->rms_eps);
            }
            naive_rope(m, q + t * q_dim, hp->n_heads, t);
            naive_rope(m, k + t * kv_dim, hp->n_kv_heads, t);
        }
        for (int t = 0; t < n; t++) {
            for (int h = 0; h < hp->n_heads; h++) {
                int gkv = h / (hp->n_heads / hp->n_kv_heads);
                double max = -1e300, sum = 0;
                for (int s = 0; s <= t; s++) {
                    double dot = 0;
                    for (int64_t i = 0; i < d; i++)
                        dot += q[t * q_dim + h * d + i] * k[s * kv_dim + gkv * d + i];
                    scores[s] = dot / sqrt((double)d);
                    if (scores[s] > max) max = scores[s];
                }
                for (int s = 0; s <= t; s++) sum += (scores[s] = exp(scores[s] - max));
                for (int64_t i = 0; i < d; i++) {
                    double acc = 0;
                    for (int s = 0; s <= t; s++) acc += scores[s] / sum * v[s * kv_dim + gkv * d + i];
                    att[h * d + i] = acc;
                }
            }
            naive_matvec(&L->wo, att, tmp);
            for (int64_t i = 0; i < dim; i++) x[t * dim + i] += tmp[i];
            naive_rmsnorm(xn, x + t * dim, L->ffn_norm, dim, hp->rms_eps);
            naive_matvec(&L->w_gate, xn, g);
            naive_matvec(&L->w_up, xn, u);
            for (int64_t i = 0; i < ffn; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            naive_matvec(&L->w_down, g, tmp);
            for (int64_t i = 0; i < dim; i++) x[t * dim + i] += tmp[i];
        }
    }
    naive_rmsnorm(xn, x + (n - 1) * dim, m->output_norm, dim, hp->rms_eps);
    naive_matvec(&m->output, xn, logits);
    free(x); free(xn); free(q); free(k); free(v); free(att); free(tmp);
    free(g); free(u); free(scores); free(row);
}

#endif
