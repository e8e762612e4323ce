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
AVX512 INLINE void tile_4xB(const lp_tile *t, const float *x, float *y, int B, bool f16, bool prefetch) {
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int b = 0; b < B; b++) acc[r][b] = _mm512_setzero_ps();
    const int64_t n = t->n, xs = t->x_stride, elem = f16 ? 2 : 4;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        /* one line of each of the next tile's rows per line of these */
        if (prefetch && ((i * elem) & 63) == 0)
            for (int r = 0; r < 4; r++)
                if (t->next_w[r]) _mm_prefetch((const char *)t->next_w[r] + i * elem, _MM_HINT_T1);
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
