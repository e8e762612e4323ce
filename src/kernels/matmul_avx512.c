/* AVX-512 kernels (16 floats per vector). Compiled for AVX-512 through
 * function attributes only; lp_kernels_init calls them only when the CPU has
 * avx512f/bw/vl. Column tails use masked loads, so no scalar cleanup. */
#include "kernels_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* 16 weights starting at element i of a float or f16 row. */
AVX512 INLINE __m512 load_w(const void *row, int64_t i, bool f16) {
    if (f16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i)));
    return _mm512_loadu_ps((const float *)row + i);
}

AVX512 INLINE __m512 load_w_masked(const void *row, int64_t i, __mmask16 m, bool f16) {
    if (f16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i));
    return _mm512_maskz_loadu_ps(m, (const float *)row + i);
}

AVX512 INLINE void store_result(const lp_tile *t, float *y, int r, int b, float s) {
    float *dst = y + b * t->y_stride + r;
    *dst = t->accumulate ? *dst + s : s;
}

/* 4 weight rows x B batch rows (B <= 4): 16 accumulators, each weight
 * vector loaded (and converted) once for all B batch rows.
 *
 * Batch invariance: every output element is computed by exactly one
 * accumulator chain, acc = fma(w[i..i+15], x[i..i+15], acc) over 16-wide
 * steps (the tail masked), then one _mm512_reduce_add_ps, whatever B is,
 * so a row's result does not depend on the batch size or its position in
 * the batch. Four rows give four independent chains even at B = 1, which
 * is plenty for the memory-bound decode case. */
AVX512 INLINE void tile_4xB(const lp_tile *t, const float *x, float *y, int B, bool f16) {
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int b = 0; b < B; b++) acc[r][b] = _mm512_setzero_ps();
    const int64_t n = t->n, xs = t->x_stride;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 w[4];
        for (int r = 0; r < 4; r++) w[r] = load_w(t->w[r], i, f16);
        for (int b = 0; b < B; b++) {
            __m512 xv = _mm512_loadu_ps(x + b * xs + i);
            for (int r = 0; r < 4; r++) acc[r][b] = _mm512_fmadd_ps(w[r], xv, acc[r][b]);
        }
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512 w[4];
        for (int r = 0; r < 4; r++) w[r] = load_w_masked(t->w[r], i, m, f16);
        for (int b = 0; b < B; b++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, x + b * xs + i);
            for (int r = 0; r < 4; r++) acc[r][b] = _mm512_fmadd_ps(w[r], xv, acc[r][b]);
        }
    }
    for (int r = 0; r < t->nr; r++)
        for (int b = 0; b < B; b++) store_result(t, y, r, b, _mm512_reduce_add_ps(acc[r][b]));
}

AVX512 INLINE void tile_all(const lp_tile *t, bool f16) {
    const int64_t nb = t->n_batch;
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) tile_4xB(t, t->x + b * t->x_stride, t->y + b * t->y_stride, 4, f16);
    const float *x = t->x + b * t->x_stride;
    float *y = t->y + b * t->y_stride;
    switch (nb - b) {
    case 3: tile_4xB(t, x, y, 3, f16); break;
    case 2: tile_4xB(t, x, y, 2, f16); break;
    case 1: tile_4xB(t, x, y, 1, f16); break;
    default: break;
    }
}

AVX512 void lp_tile_f32_avx512(const lp_tile *t) { tile_all(t, false); }
AVX512 void lp_tile_f16_avx512(const lp_tile *t) { tile_all(t, true); }

AVX512 void lp_f16_to_f32_row_avx512(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i)));
    }
}

AVX512 float lp_dot_f32_avx512(const float *a, const float *b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i < n; i += 16) {
        int64_t left = n - i;
        __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}
#else
typedef int lp_no_avx512_on_this_target; /* keep the translation unit non-empty */
#endif
