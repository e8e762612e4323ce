/* AVX2 + FMA + F16C kernels (8 floats per vector). Compiled for AVX2 through
 * function attributes only; lp_kernels_init calls them only when the CPU has
 * avx2, fma and f16c. Column tails (n % 8) are finished in scalar code. */
#include "kernels_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* 8 floats from element i of a row stored as f32 or f16 (converted exactly). */
AVX2 INLINE __m256 load_w(const void *row, int64_t i, bool f16) {
    if (f16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
    return _mm256_loadu_ps((const float *)row + i);
}

INLINE float scalar_w(const void *row, int64_t i, bool f16) {
    return f16 ? lp_f16_to_f32(((const uint16_t *)row)[i]) : ((const float *)row)[i];
}

AVX2 INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE void store_result(const lp_tile *t, float *y, int r, int b, float s) {
    float *dst = y + b * t->y_stride + r;
    *dst = t->accumulate ? *dst + s : s;
}

/* Lane sums of many accumulators at once, by hsum's tree (lane i + lane
 * i+4, then i + i+2, then i + i+1), so a sum has the same bits whichever of
 * these reduces it; on short rows one hsum per output costs as much as its
 * dot product. Level 1 of two vectors: a's halves added in the low half,
 * b's in the high half. */
AVX2 INLINE __m256 halves(__m256 a, __m256 b) {
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
/* Levels 2 and 3 within each half: lanes 0 + 2 and 1 + 3 (p in lanes 0-1,
 * q in lanes 2-3), then 0 + 1 (and 2 + 3). */
AVX2 INLINE __m256 pairs(__m256 p, __m256 q) {
    return _mm256_add_ps(_mm256_shuffle_ps(p, q, _MM_SHUFFLE(1, 0, 1, 0)), _mm256_shuffle_ps(p, q, _MM_SHUFFLE(3, 2, 3, 2)));
}
AVX2 INLINE __m256 singles(__m256 r, __m256 s) {
    return _mm256_add_ps(_mm256_shuffle_ps(r, s, _MM_SHUFFLE(2, 0, 2, 0)), _mm256_shuffle_ps(r, s, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* The sums of acc[r][b] (b < B <= 2); lane 4b + r holds acc[r][b]'s. */
AVX2 INLINE __m256 reduce_4xB(__m256 acc[4][2], int B) {
    if (B == 2) {
        __m256 p = pairs(halves(acc[0][0], acc[0][1]), halves(acc[1][0], acc[1][1]));
        __m256 q = pairs(halves(acc[2][0], acc[2][1]), halves(acc[3][0], acc[3][1]));
        return singles(p, q);
    }
    __m256 l2 = pairs(halves(acc[0][0], acc[1][0]), halves(acc[2][0], acc[3][0]));
    __m256 sums = singles(l2, l2); /* r = 0, 2 in lanes 0, 1; r = 1, 3 in lanes 4, 5 */
    return _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0));
}

/* 4 weight rows x B batch rows (B <= 2): 8 accumulators + 4 weight vectors
 * fit in the 16 ymm registers.
 *
 * Batch invariance: each output element is one accumulator chain over
 * 8-wide steps, one reduction by the same tree (reduce_4xB), then the
 * scalar tail in order, whatever B is. */
AVX2 INLINE void tile_4xB(const lp_tile *t, const float *x, float *y, int B, bool f16) {
    __m256 acc[4][2];
    for (int r = 0; r < 4; r++)
        for (int b = 0; b < 2; b++) acc[r][b] = _mm256_setzero_ps(); /* all 8: the reduction reads them */
    const int64_t n = t->n, xs = t->x_stride;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 w[4];
        for (int r = 0; r < 4; r++) w[r] = load_w(t->w[r], i, f16);
        for (int b = 0; b < B; b++) {
            __m256 xv = _mm256_loadu_ps(x + b * xs + i);
            for (int r = 0; r < 4; r++) acc[r][b] = _mm256_fmadd_ps(w[r], xv, acc[r][b]);
        }
    }
    __m256 sums = reduce_4xB(acc, B);
    if (i == n && t->nr == 4) {
        for (int b = 0; b < B; b++) {
            float *dst = y + b * t->y_stride;
            __m128 v = b ? _mm256_extractf128_ps(sums, 1) : _mm256_castps256_ps128(sums);
            if (t->accumulate) v = _mm_add_ps(_mm_loadu_ps(dst), v);
            _mm_storeu_ps(dst, v);
        }
        return;
    }
    float s8[8];
    _mm256_storeu_ps(s8, sums);
    for (int r = 0; r < t->nr; r++)
        for (int b = 0; b < B; b++) {
            float s = s8[4 * b + r];
            for (int64_t j = i; j < n; j++) s += scalar_w(t->w[r], j, f16) * x[b * xs + j];
            store_result(t, y, r, b, s);
        }
}

AVX2 INLINE void tile_all(const lp_tile *t, bool f16) {
    const int64_t nb = t->n_batch;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) tile_4xB(t, t->x + b * t->x_stride, t->y + b * t->y_stride, 2, f16);
    if (b < nb) tile_4xB(t, t->x + b * t->x_stride, t->y + b * t->y_stride, 1, f16);
}

AVX2 void lp_tile_f32_avx2(const lp_tile *t) { tile_all(t, false); }
AVX2 void lp_tile_f16_avx2(const lp_tile *t) { tile_all(t, true); }

AVX2 void lp_f16_to_f32_row_avx2(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = lp_f16_to_f32(src[i]);
}

AVX2 float lp_dot_f32_avx2(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* F16C rounds to nearest even, as lp_f32_to_f16 does: the same bits. */
AVX2 void lp_round_f16_avx2(float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
    for (; i < n; i++) x[i] = lp_f16_to_f32(lp_f32_to_f16(x[i]));
}

AVX2 void lp_to_f16_avx2(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = lp_f32_to_f16(src[i]);
}

/* Heads [h, h + HN) (HN a constant where inlined) against keys [j, j + 16):
 * 2 HN chains, lanes across keys, one fma per element as the reference. */
AVX2 INLINE void scores_t16(const float *q, int64_t q_stride, int HN, const void *kt, bool f16, int64_t kt_stride,
                            int j, int64_t d, float scale, float *s, int64_t s_stride) {
    __m256 acc[4][2];
    for (int h = 0; h < HN; h++) acc[h][0] = acc[h][1] = _mm256_setzero_ps();
    for (int64_t c = 0; c < d; c++) {
        /* element c of keys j..j+15 (transposed storage) */
        __m256 k0 = load_w(kt, c * kt_stride + j, f16), k1 = load_w(kt, c * kt_stride + j + 8, f16);
        for (int h = 0; h < HN; h++) {
            __m256 qv = _mm256_broadcast_ss(q + h * q_stride + c);
            acc[h][0] = _mm256_fmadd_ps(qv, k0, acc[h][0]);
            acc[h][1] = _mm256_fmadd_ps(qv, k1, acc[h][1]);
        }
    }
    const __m256 sv = _mm256_set1_ps(scale);
    for (int h = 0; h < HN; h++) {
        _mm256_storeu_ps(s + h * s_stride + j, _mm256_mul_ps(acc[h][0], sv));
        _mm256_storeu_ps(s + h * s_stride + j + 8, _mm256_mul_ps(acc[h][1], sv));
    }
}

/* Keys in runs of 16 (4 heads at a time); the last few keys by the
 * reference, whose fmaf is the same fused operation per element. */
AVX2 INLINE void scores_t_all(const float *q, int64_t q_stride, int nq, const void *kt, bool f16, int64_t kt_stride,
                              int nk, int64_t d, float scale, float *s, int64_t s_stride) {
    int j = 0;
    for (; j + 16 <= nk; j += 16) {
        int h = 0;
        for (; h + 4 <= nq; h += 4)
            scores_t16(q + h * q_stride, q_stride, 4, kt, f16, kt_stride, j, d, scale, s + h * s_stride, s_stride);
        for (; h < nq; h++)
            scores_t16(q + h * q_stride, q_stride, 1, kt, f16, kt_stride, j, d, scale, s + h * s_stride, s_stride);
    }
    if (j < nk) {
        const void *tail = f16 ? (const void *)((const uint16_t *)kt + j) : (const void *)((const float *)kt + j);
        lp_attn_scores(q, q_stride, nq, tail, f16, kt_stride, nk - j, d, scale, s + j, s_stride);
    }
}

AVX2 void lp_attn_scores_avx2(const float *q, int64_t q_stride, int nq, const void *kt, bool k_f16, int64_t kt_stride,
                              int nk, int64_t d, float scale, float *s, int64_t s_stride) {
    if (k_f16) scores_t_all(q, q_stride, nq, kt, true, kt_stride, nk, d, scale, s, s_stride);
    else scores_t_all(q, q_stride, nq, kt, false, kt_stride, nk, d, scale, s, s_stride);
}

/* Q4_0 / Q8_0 decoders: integer codes widen to int32, convert exactly to
 * float and take one multiply by d, as the reference does (same bits). */
AVX2 void lp_dequant_q4_0_avx2(const uint8_t *src, float *dst, int64_t blocks) {
    const __m128i low4 = _mm_set1_epi8(0x0f);
    const __m256i eight = _mm256_set1_epi32(8);
    for (int64_t i = 0; i < blocks; i++, src += 18, dst += 32) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss((unsigned short)(src[0] | (src[1] << 8))));
        __m128i q = _mm_loadu_si128((const __m128i *)(src + 2));
        __m128i halves[2] = {_mm_and_si128(q, low4), _mm_and_si128(_mm_srli_epi16(q, 4), low4)};
        for (int h = 0; h < 2; h++) {
            __m256i a = _mm256_sub_epi32(_mm256_cvtepu8_epi32(halves[h]), eight);
            __m256i b = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(halves[h], 8)), eight);
            _mm256_storeu_ps(dst + 16 * h, _mm256_mul_ps(_mm256_cvtepi32_ps(a), d));
            _mm256_storeu_ps(dst + 16 * h + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(b), d));
        }
    }
}

AVX2 void lp_dequant_q8_0_avx2(const uint8_t *src, float *dst, int64_t blocks) {
    for (int64_t i = 0; i < blocks; i++, src += 34, dst += 32) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss((unsigned short)(src[0] | (src[1] << 8))));
        for (int k = 0; k < 4; k++) {
            __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(src + 2 + 8 * k)));
            _mm256_storeu_ps(dst + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
        }
    }
}
#else
typedef int lp_no_avx2_on_this_target; /* keep the translation unit non-empty */
#endif
