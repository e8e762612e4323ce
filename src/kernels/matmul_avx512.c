/* AVX-512 kernels (16 floats per vector). Compiled for AVX-512 through
 * function attributes only; lp_kernels_init calls them only when the CPU has
 * avx512f/bw/vl. Column tails use masked loads, so no scalar cleanup. */
#include "kernels_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

#include "exp_avx512.h"

/* 16 weights starting at element i of a float or f16 row. */
AVX512 INLINE __m512 load_w(const void *row, int64_t i, bool f16) {
    if (f16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i)));
    return _mm512_loadu_ps((const float *)row + i);
}

AVX512 INLINE __m512 load_w_masked(const void *row, int64_t i, __mmask16 m, bool f16) {
    if (f16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i));
    return _mm512_maskz_loadu_ps(m, (const float *)row + i);
}

/* Lane sums of many accumulators at once, by the tree _mm512_reduce_add_ps
 * takes for one (lane i + lane i+8, then i + i+4, then i + i+2, then
 * i + i+1), so every sum has the same bits whichever of these reduces it.
 * For the short rows of small models a reduction per output costs as much
 * as its dot product; these share the shuffles and adds of the levels.
 *
 * Level 1 of two vectors: chunk (4 lanes) c of a + chunk c + 2, for a in
 * the low half and b in the high half of the result. */
AVX512 INLINE __m512 halves(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}
/* Level 2 of two level-1 vectors: each half's chunk 0 + chunk 1, giving
 * the four partials in chunks 0..3 (c's low, c's high, d's low, d's high). */
AVX512 INLINE __m512 quarters(__m512 c, __m512 d) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x88), _mm512_shuffle_f32x4(c, d, 0xDD));
}
/* Levels 3 and 4 within each chunk: lane 0 + 2 and 1 + 3 (p in lanes 0-1,
 * q in lanes 2-3), then lane 0 + 1 (and 2 + 3). */
AVX512 INLINE __m512 pairs(__m512 p, __m512 q) {
    return _mm512_add_ps(_mm512_shuffle_ps(p, q, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(p, q, _MM_SHUFFLE(3, 2, 3, 2)));
}
AVX512 INLINE __m512 singles(__m512 r, __m512 s) {
    return _mm512_add_ps(_mm512_shuffle_ps(r, s, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(r, s, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* The 16 sums of acc[4][4]; lane 4b + r holds acc[r][b]'s. (Accumulator
 * k = 4r + b ends in lane 4(k % 4) + k / 4.) */
AVX512 INLINE __m512 reduce_4x4(__m512 acc[4][4]) {
    __m512 l1[8], l2[4];
    for (int j = 0; j < 8; j++) l1[j] = halves(acc[(2 * j) / 4][(2 * j) % 4], acc[(2 * j + 1) / 4][(2 * j + 1) % 4]);
    for (int m = 0; m < 4; m++) l2[m] = quarters(l1[2 * m], l1[2 * m + 1]);
    return singles(pairs(l2[0], l2[1]), pairs(l2[2], l2[3]));
}

/* The 8 sums of acc[r][b], b < 2; lane 4b + r holds acc[r][b]'s. */
AVX512 INLINE __m256 reduce_4x2(__m512 acc[4][4]) {
    __m512 h[4];
    for (int r = 0; r < 4; r++) h[r] = halves(acc[r][0], acc[r][1]);
    __m512 p = pairs(quarters(h[0], h[1]), quarters(h[2], h[3]));
    __m512 sums = singles(p, p); /* chunk c: lanes 0 and 1 hold r = c / 2 and r + 2 of b = c % 2 */
    return _mm512_castps512_ps256(
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 8, 1, 9, 4, 12, 5, 13, 0, 0, 0, 0, 0, 0, 0, 0), sums));
}

/* The 4 sums of acc[r][0] in lanes 0..3. */
AVX512 INLINE __m128 reduce_4x1(__m512 acc[4][4]) {
    __m512 l2 = quarters(halves(acc[0][0], acc[1][0]), halves(acc[2][0], acc[3][0]));
    __m512 l3 = pairs(l2, l2);
    __m512 sums = singles(l3, l3); /* acc[r][0] in lane 4r */
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), sums));
}

/* Rows 0..nr-1 of batch row b's outputs from the 4 sums in v. */
AVX512 INLINE void store_column_at(const lp_tile *t, float *y, int b, __m128 v) {
    float *dst = y + b * t->y_stride;
    if (t->nr == 4) { /* masked stores are slow on some CPUs */
        if (t->accumulate) v = _mm_add_ps(_mm_loadu_ps(dst), v);
        _mm_storeu_ps(dst, v);
        return;
    }
    __mmask8 m = (__mmask8)((1u << t->nr) - 1);
    if (t->accumulate) v = _mm_add_ps(_mm_maskz_loadu_ps(m, dst), v);
    _mm_mask_storeu_ps(dst, m, v);
}

AVX512 INLINE void store_4xB(const lp_tile *t, float *y, int B, __m512 sums) {
    /* the extract's lane must be an immediate, also in unoptimized builds */
    store_column_at(t, y, 0, _mm512_extractf32x4_ps(sums, 0));
    store_column_at(t, y, 1, _mm512_extractf32x4_ps(sums, 1));
    if (B > 2) store_column_at(t, y, 2, _mm512_extractf32x4_ps(sums, 2));
    if (B > 3) store_column_at(t, y, 3, _mm512_extractf32x4_ps(sums, 3));
}

/* 4 weight rows x B batch rows (B <= 4): 16 accumulators, each weight
 * vector loaded (and converted) once for all B batch rows.
 *
 * Batch invariance: every output element is computed by exactly one
 * accumulator chain, acc = fma(w[i..i+15], x[i..i+15], acc) over 16-wide
 * steps (the tail masked), then the one reduction tree (reduce_4x4 and
 * reduce_4x1 add the same lanes in the same order), whatever B is, so a
 * row's result does not depend on the batch size or its position in the
 * batch. Four rows give four independent chains even at B = 1, which
 * is plenty for the memory-bound decode case. */
AVX512 INLINE void tile_4xB(const lp_tile *t, const float *x, float *y, int B, bool f16, bool prefetch) {
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int b = 0; b < 4; b++) acc[r][b] = _mm512_setzero_ps(); /* all 16: the reduction reads them */
    const int64_t n = t->n, xs = t->x_stride, elem = f16 ? 2 : 4;
    /* the next tile's rows, in locals: read from t in the loop they cost
     * more than the multiply-adds on short rows */
    const char *next[4];
    int n_next = 0;
    for (int r = 0; prefetch && r < 4; r++)
        if (t->next_w[r]) next[n_next++] = t->next_w[r];
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        /* one line of each of the next tile's rows per line of these */
        if (((i * elem) & 63) == 0)
            for (int r = 0; r < n_next; r++) _mm_prefetch(next[r] + i * elem, _MM_HINT_T1);
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
    if (B == 1) {
        store_column_at(t, y, 0, reduce_4x1(acc));
    } else if (B == 2) {
        __m256 s = reduce_4x2(acc);
        store_column_at(t, y, 0, _mm256_castps256_ps128(s));
        store_column_at(t, y, 1, _mm256_extractf128_ps(s, 1));
    } else {
        store_4xB(t, y, B, reduce_4x4(acc));
    }
}

AVX512 INLINE void tile_all(const lp_tile *t, bool f16) {
    const int64_t nb = t->n_batch;
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) tile_4xB(t, t->x + b * t->x_stride, t->y + b * t->y_stride, 4, f16, b == 0);
    const float *x = t->x + b * t->x_stride;
    float *y = t->y + b * t->y_stride;
    switch (nb - b) {
    case 3: tile_4xB(t, x, y, 3, f16, b == 0); break;
    case 2: tile_4xB(t, x, y, 2, f16, b == 0); break;
    case 1: tile_4xB(t, x, y, 1, f16, b == 0); break;
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

AVX512 INLINE float dot_avx512(const float *a, const float *b, int64_t n) {
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
AVX512 float lp_dot_f32_avx512(const float *a, const float *b, int64_t n) { return dot_avx512(a, b, n); }

/* Values fetched ahead in lp_attn_mix (rows). */
#define ATTN_AHEAD 8

/* Element e of a V row stream (f32 or f16 elements) as bytes. */
#define KV_AT(base, e, f16) ((const char *)(base) + (e) * ((f16) ? 2 : 4))

/* Heads [0, HN) (HN a constant where inlined, so the accumulators stay in
 * registers) against KV vectors (1 or 2) of 16 keys from key j, n keys in
 * all: 8 heads x 2 vectors are 16 independent fma chains, lanes across
 * keys, one fma per element as the reference, and no reductions. */
AVX512 INLINE void scores_t(const float *q, int64_t q_stride, int HN, int KV, const void *kt, bool f16,
                            int64_t kt_stride, int j, int n, int64_t d, float scale, float *s, int64_t s_stride) {
    __mmask16 m[2];
    for (int v = 0; v < 2; v++) {
        int left = n - 16 * v;
        m[v] = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
    }
    __m512 acc[8][2];
    for (int h = 0; h < HN; h++)
        for (int v = 0; v < KV; v++) acc[h][v] = _mm512_setzero_ps();
    for (int64_t c = 0; c < d; c++) {
        __m512 kv[2];
        /* element c of keys j + 16v.. (transposed storage; lanes past the
         * mask read as 0 and are never stored) */
        for (int v = 0; v < KV; v++) kv[v] = load_w_masked(kt, c * kt_stride + j + 16 * v, m[v], f16);
        for (int h = 0; h < HN; h++) {
            __m512 qv = _mm512_set1_ps(q[h * q_stride + c]);
            for (int v = 0; v < KV; v++) acc[h][v] = _mm512_fmadd_ps(qv, kv[v], acc[h][v]);
        }
    }
    const __m512 sv = _mm512_set1_ps(scale);
    for (int h = 0; h < HN; h++)
        for (int v = 0; v < KV; v++)
            _mm512_mask_storeu_ps(s + h * s_stride + j + 16 * v, m[v], _mm512_mul_ps(acc[h][v], sv));
}

/* Keys in runs of up to 32, heads 8, 4 or 1 at a time. */
AVX512 INLINE void scores_t_all(const float *q, int64_t q_stride, int nq, const void *kt, bool f16, int64_t kt_stride,
                                int nk, int64_t d, float scale, float *s, int64_t s_stride) {
    for (int j = 0; j < nk; j += 32) {
        int n = nk - j < 32 ? nk - j : 32;
        int h = 0;
#define SCORES_T(HN)                                                                                       \
    do {                                                                                                   \
        if (n > 16) scores_t(q + h * q_stride, q_stride, HN, 2, kt, f16, kt_stride, j, n, d, scale, s + h * s_stride, s_stride); \
        else scores_t(q + h * q_stride, q_stride, HN, 1, kt, f16, kt_stride, j, n, d, scale, s + h * s_stride, s_stride);        \
        h += HN;                                                                                           \
    } while (0)
        while (h + 8 <= nq) SCORES_T(8);
        if (h + 4 <= nq) SCORES_T(4);
        while (h < nq) SCORES_T(1);
#undef SCORES_T
    }
}

AVX512 void lp_attn_scores_avx512(const float *q, int64_t q_stride, int nq, const void *kt, bool k_f16,
                                  int64_t kt_stride, int nk, int64_t d, float scale, float *s, int64_t s_stride) {
    if (k_f16) scores_t_all(q, q_stride, nq, kt, true, kt_stride, nk, d, scale, s, s_stride);
    else scores_t_all(q, q_stride, nq, kt, false, kt_stride, nk, d, scale, s, s_stride);
}

/* HN (a constant where inlined, up to 8) heads x 32 outputs from column c:
 * 16 accumulators, and each value row's two vectors (loaded and converted
 * once) serve all HN heads. */
AVX512 INLINE void mix_heads(float *out, int64_t out_stride, int HN, const float *p, int64_t p_stride,
                             const void *v, bool f16, int64_t v_stride, int nk, int64_t d, int64_t c) {
    __mmask16 m[2];
    for (int i = 0; i < 2; i++) {
        int64_t left = d - c - 16 * i;
        m[i] = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
    }
    __m512 acc[8][2];
    for (int h = 0; h < HN; h++)
        for (int i = 0; i < 2; i++) acc[h][i] = _mm512_maskz_loadu_ps(m[i], out + h * out_stride + c + 16 * i);
    for (int j = 0; j < nk; j++) {
        __m512 vj[2];
        if (j + ATTN_AHEAD < nk)
            for (int i = 0; i < 2; i++) _mm_prefetch(KV_AT(v, (j + ATTN_AHEAD) * v_stride + c + 16 * i, f16), _MM_HINT_T0);
        for (int i = 0; i < 2; i++) vj[i] = load_w_masked(KV_AT(v, j * v_stride, f16), c + 16 * i, m[i], f16);
        for (int h = 0; h < HN; h++) {
            __m512 pv = _mm512_set1_ps(p[h * p_stride + j]);
            for (int i = 0; i < 2; i++) acc[h][i] = _mm512_fmadd_ps(pv, vj[i], acc[h][i]);
        }
    }
    for (int h = 0; h < HN; h++)
        for (int i = 0; i < 2; i++) _mm512_mask_storeu_ps(out + h * out_stride + c + 16 * i, m[i], acc[h][i]);
}

/* lp_attn_mix: 8 heads x 32 floats of output stay in registers while
 * every value row passes (one load per row and chunk instead of a load and
 * store of the output per head and row), one fma per element and row, in
 * row order. 8 heads per pass rather than 4 x 64 floats: half the value
 * loads and conversions for the same fmas. */
AVX512 INLINE void mix_all(float *out, int64_t out_stride, int nq, const float *p, int64_t p_stride, const void *v,
                           bool f16, int64_t v_stride, int nk, int64_t d) {
    for (int64_t c = 0; c < d; c += 32) {
        int h0 = 0;
        for (; h0 + 8 <= nq; h0 += 8)
            mix_heads(out + h0 * out_stride, out_stride, 8, p + h0 * p_stride, p_stride, v, f16, v_stride, nk, d, c);
        if (h0 + 4 <= nq) {
            mix_heads(out + h0 * out_stride, out_stride, 4, p + h0 * p_stride, p_stride, v, f16, v_stride, nk, d, c);
            h0 += 4;
        }
        for (; h0 < nq; h0++)
            mix_heads(out + h0 * out_stride, out_stride, 1, p + h0 * p_stride, p_stride, v, f16, v_stride, nk, d, c);
    }
}

AVX512 void lp_attn_mix_avx512(float *out, int64_t out_stride, int nq, const float *p, int64_t p_stride,
                               const void *v, bool v_f16, int64_t v_stride, int nk, int64_t d) {
    if (v_f16) mix_all(out, out_stride, nq, p, p_stride, v, true, v_stride, nk, d);
    else mix_all(out, out_stride, nq, p, p_stride, v, false, v_stride, nk, d);
}

/* y += a * x as a multiply then an add (no fma), like the reference. */
AVX512 void lp_axpy_avx512(float *y, float a, const float *x, int64_t n) {
    __m512 av = _mm512_set1_ps(a);
    for (int64_t i = 0; i < n; i += 16) {
        int64_t left = n - i;
        __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_mul_ps(av, _mm512_maskz_loadu_ps(m, x + i)));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

/* The reference's steps (max, exponentials summed in double, one scale)
 * 16 lanes at a time (the sum in another order: within a few ulp). */
AVX512 void lp_softmax_avx512(float *x, int64_t n) {
    if (n <= 0) return;
    __m512 mx = _mm512_set1_ps(x[0]);
    for (int64_t i = 0; i < n; i += 16) {
        int64_t left = n - i;
        __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, x + i));
    }
    __m512 maxv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    /* two sums (low and high halves of each vector), so the double adds
     * do not wait on each other */
    __m512d sum_lo = _mm512_setzero_pd(), sum_hi = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += 16) {
        int64_t left = n - i;
        __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), maxv)));
        _mm512_mask_storeu_ps(x + i, m, e);
        sum_lo = _mm512_add_pd(sum_lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        sum_hi = _mm512_add_pd(sum_hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    __m512 inv = _mm512_set1_ps((float)(1.0 / _mm512_reduce_add_pd(_mm512_add_pd(sum_lo, sum_hi))));
    for (int64_t i = 0; i < n; i += 16) {
        int64_t left = n - i;
        __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
    }
}

/* gate = gate / (1 + e^-gate) * up */
AVX512 void lp_silu_mul_avx512(float *gate, const float *up, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        int64_t left = n - i;
        __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
        __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
        _mm512_mask_storeu_ps(gate + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, up + i)));
    }
}

#else
typedef int lp_no_avx512_on_this_target; /* keep the translation unit non-empty */
#endif
