/* Private to src/kernels: the per-ISA building blocks behind lp_matmul. */
#ifndef LP_KERNELS_INTERNAL_H
#define LP_KERNELS_INTERNAL_H

#include "kernels.h"

/* lp_matmul works on tiles of LP_TILE_ROWS weight rows x LP_CHUNK columns,
 * so a dequantized chunk (4 x 1024 floats = 16 KiB) stays in L1 while every
 * batch row streams past it. LP_CHUNK is a multiple of every block size. */
#define LP_TILE_ROWS 4
#define LP_CHUNK 1024

/* One tile: y[b*y_stride + r] (+)= dot(w[r][0..n), x[b*x_stride + 0..n)) for
 * r < nr, b < n_batch. w[nr..3] alias w[nr-1] so kernels may always load
 * four rows; their results are discarded. */
typedef struct lp_tile {
    const void *w[LP_TILE_ROWS]; /* float or uint16_t (f16) rows */
    int nr;
    const float *x;
    int64_t x_stride, n_batch, n;
    float *y;
    int64_t y_stride;
    bool accumulate; /* add to y instead of overwriting it */
} lp_tile;

/* lp_dequantize_row with the SIMD copy of the decoder chosen by `level`
 * (identical results, vectorized by the compiler). */
void lp_dequantize_row_fast(int level, uint32_t type, const void *src, float *dst, int64_t n);

#if defined(__x86_64__)
float lp_dot_f32_avx2(const float *a, const float *b, int64_t n);
void lp_tile_f32_avx2(const lp_tile *t);
void lp_tile_f16_avx2(const lp_tile *t);
void lp_f16_to_f32_row_avx2(const uint16_t *src, float *dst, int64_t n);
void lp_dequant_q4_0_avx2(const uint8_t *src, float *dst, int64_t blocks);
void lp_dequant_q8_0_avx2(const uint8_t *src, float *dst, int64_t blocks);

float lp_dot_f32_avx512(const float *a, const float *b, int64_t n);
void lp_tile_f32_avx512(const lp_tile *t);
void lp_tile_f16_avx512(const lp_tile *t);
void lp_f16_to_f32_row_avx512(const uint16_t *src, float *dst, int64_t n);
#endif

#endif
