/* Kernels: (de)quantization of every supported element type, matrix
 * multiplication over weights of any type, and the small vector ops of a
 * transformer layer.
 *
 * Every SIMD path has a plain C reference (lp_*_ref) that tests compare
 * against. The fast path is chosen at run time from lp_cpu_features, never
 * at compile time with -march=native. */
#ifndef LP_KERNELS_H
#define LP_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"
#include "../base/dtype.h"

/* A weight matrix: rows = output features, cols = input features; row r
 * occupies row_bytes bytes at data + r*row_bytes, in `type`'s block layout. */
typedef struct lp_weight {
    uint32_t type;      /* lp_dtype */
    int64_t rows, cols;
    size_t row_bytes;
    const void *data;
} lp_weight;

/* ---- element types ----------------------------------------------------- */

/* n must be a multiple of the type's block size. */
void lp_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n);
/* Reference quantizers (round to nearest, llama.cpp-compatible block
 * layouts) for F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K.
 * Returns false for types we cannot produce. */
bool lp_quantize_row(uint32_t type, const float *src, void *dst, int64_t n);

/* ---- matmul ------------------------------------------------------------ */

/* Kernel dispatch table, filled once per context from the CPU features. */
typedef struct lp_kernels {
    lp_cpu_features cpu;
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    /* more fast paths are private to kernels/ */
    int level; /* 0 = reference, 1 = avx2, 2 = avx512 */
} lp_kernels;

void lp_kernels_init(lp_kernels *k, const lp_cpu_features *cpu);
/* Forces the plain C reference everywhere (tests). */
void lp_kernels_init_reference(lp_kernels *k);

/* Y[b][r] = sum_c W[r][c] * X[b][c] for b < n_batch, r < W->rows.
 * X is n_batch rows of W->cols floats (stride x_stride floats); Y rows have
 * stride y_stride floats. Parallel over output rows. Never allocates. */
void lp_matmul(const lp_kernels *k, lp_threadpool *pool, const lp_weight *W,
               const float *X, int64_t x_stride, int64_t n_batch, float *Y,
               int64_t y_stride);
/* Plain reference: dequantize each row, double-free float dot. */
void lp_matmul_ref(const lp_weight *W, const float *X, int64_t x_stride,
                   int64_t n_batch, float *Y, int64_t y_stride);

/* ---- vector ops ---------------------------------------------------------- */

/* out = x / sqrt(mean(x^2) + eps) * w  (w may be NULL: no gain) */
void lp_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);
/* In-place softmax over n values. */
void lp_softmax(float *x, int64_t n);
/* gate[i] = silu(gate[i]) * up[i] */
void lp_silu_mul(float *gate, const float *up, int64_t n);
float lp_dot_f32_ref(const float *a, const float *b, int64_t n);
/* y += a * x */
void lp_axpy(float *y, float a, const float *x, int64_t n);

#endif
