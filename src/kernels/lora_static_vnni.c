/* The shared-profile LoRA branch (lora_static.h) on vpdpbusd, for AVX-512
 * VNNI and AVX-VNNI. vpdpbusd multiplies unsigned bytes by signed ones, so
 * 8-bit weight codes go in as code - 128 (one xor; 4-bit codes, unpacked
 * with one shift and mask, as they are) and the zero points and the 128
 * come back out in closed form:
 *  - the shrink feeds the input codes (0..255) as they are; with bias 128
 *    for 8-bit weight codes and 0 for 4-bit ones,
 *      sum_k (cx_k - zx)(qa_k - za) = D + (bias - za) sum(cx) - zx sum(qa) + in zx za,
 *      D = sum_k cx_k (qa_k - bias),
 *    with sum(qa) per rank row known in advance (L->sum_a);
 *  - the expand needs no per-output sums (they would cost as many bytes as
 *    B's codes): it splits ct_j - zt into its positive and negative parts,
 *    p_j - n_j, both 0..255, so
 *      sum_j (ct_j - zt)(qb_j - zb) = Dp - Dn + (bias - zb) sum_j (ct_j - zt),
 *      Dp = sum_j p_j (qb_j - bias), Dn likewise,
 *    two vpdpbusd per quad of rank positions, reading each output's codes
 *    and encoding once.
 * Every sum is the reference's integer, converted and scaled by the same
 * float operations in the same order, so the results are the reference's
 * bits. Ranks past LP_LORA_STATIC_INT32_RANK run the reference expand. */
#include "lora_static.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#define V512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))
#define V256 __attribute__((target("avx2,fma,avxvnni")))
#define INLINE static inline __attribute__((always_inline))

/* Inputs per shrink block: 2^15 products of at most 255 * 128 each stay
 * below 2^31 in one int32 sum over all lanes (a multiple of 128). */
#define SHRINK_CHUNK 32768

/* How far ahead of A and B the kernels fetch. */
#define LP_LORA_STATIC_PREFETCH 2048

/* What the kernels subtract from a weight code to make it a signed byte:
 * 128 from 8-bit codes, nothing from 4-bit ones. */
#define BIAS(packed) ((packed) ? 0 : 128)

/* The shrink's closed form for row j, from D = sum cx (qa - bias). */
static inline int64_t shrink_sum(const lp_lora_static *L, int j, int64_t d, int64_t sum_cx) {
    int64_t za = L->ea[L->na > 1 ? j : 0].zero, zx = L->x.zero;
    return d + (BIAS(L->packed) - za) * sum_cx - zx * L->sum_a[j] + (int64_t)L->in * zx * za;
}

/* What both expands need of a row's shrink codes: ct_j - zt as the quads
 * of its positive and negative parts (zero past the rank) and its sum. */
typedef struct expand_quads {
    uint32_t pos[LP_LORA_STATIC_INT32_RANK / 4], neg[LP_LORA_STATIC_INT32_RANK / 4];
    int32_t sum;     /* sum_j (ct_j - zt) */
    int nq;          /* quads */
    size_t step;     /* bytes of one quad vector of a block */
    float st;        /* the adapter's scale times et.scale */
} expand_quads;

static void expand_quads_init(const lp_lora_static *L, const uint8_t *ct, bool packed, expand_quads *e) {
    e->nq = (L->rank + 3) / 4;
    e->step = packed ? 32 : 64;
    e->st = L->scale * L->t.scale;
    e->sum = 0;
    for (int q = 0; q < e->nq; q++) {
        uint8_t p[4] = {0, 0, 0, 0}, n[4] = {0, 0, 0, 0};
        for (int i = 0; i < 4 && 4 * q + i < L->rank; i++) {
            int d = ct[4 * q + i] - L->t.zero;
            p[i] = (uint8_t)(d > 0 ? d : 0);
            n[i] = (uint8_t)(d < 0 ? -d : 0);
            e->sum += d;
        }
        memcpy(&e->pos[q], p, 4);
        memcpy(&e->neg[q], n, 4);
    }
}

/* ---- AVX-512 VNNI -------------------------------------------------------------------- */

V512 INLINE __m512i flip512(__m512i v) { return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80)); }

/* 64 weight codes at p as signed bytes: 8-bit codes less 128, or 4-bit
 * codes from 32 packed bytes. */
V512 INLINE __m512i codes64(const uint8_t *p, bool packed) {
    if (!packed) return flip512(_mm512_loadu_si512(p));
    const __m256i v = _mm256_loadu_si256((const __m256i *)p), low = _mm256_set1_epi8(15);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, low)),
                              _mm256_and_si256(_mm256_srli_epi16(v, 4), low), 1);
}

V512 static int64_t quantize_512(const lp_lora_static *L, const float *x, uint8_t *cx) {
    const __m512 scale = _mm512_set1_ps(L->x.scale), zero = _mm512_set1_ps((float)L->x.zero),
                 qmax = _mm512_set1_ps((float)L->act_qmax), nil = _mm512_setzero_ps();
    __m512i sum = _mm512_setzero_si512();
    for (int k = 0; k < L->in; k += 16) {
        __mmask16 m = L->in - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (L->in - k)) - 1);
        __m512 r = _mm512_roundscale_ps(_mm512_div_ps(_mm512_maskz_loadu_ps(m, x + k), scale),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        /* vmaxps returns its second operand where the first is NaN: NaN -> 0, as lp_q_code */
        r = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(r, zero), nil), qmax);
        __m512i c = _mm512_cvtps_epi32(r);
        _mm512_mask_cvtepi32_storeu_epi8(cx + k, m, c);
        sum = _mm512_mask_add_epi32(sum, m, sum, c);
    }
    return _mm512_reduce_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(sum))) +
           _mm512_reduce_add_epi64(_mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(sum, 1)));
}

/* One rank row after another: A is one forward stream (its rows are
 * contiguous), fetched LP_LORA_STATIC_PREFETCH bytes ahead, since the
 * hardware prefetchers barely ramp up on streams this short; the input
 * codes stay in L1. */
V512 INLINE void shrink512_impl(const lp_lora_static *L, const uint8_t *cx, int64_t sum_cx, int j0, int j1,
                                uint8_t *ct, bool packed) {
    const size_t step = packed ? 32 : 64; /* bytes of 64 codes */
    for (int j = j0; j < j1; j++) {
        const uint8_t *a = lp_lora_static_a_row(L, j);
        int64_t d = 0;
        for (int k0 = 0; k0 < L->in; k0 += SHRINK_CHUNK) {
            int k1 = L->in - k0 < SHRINK_CHUNK ? L->in : k0 + SHRINK_CHUNK;
            __m512i acc0 = _mm512_setzero_si512(), acc1 = _mm512_setzero_si512();
            int k = k0;
            for (; k + 128 <= k1; k += 128) {
                const uint8_t *w = a + (size_t)k / 64 * step;
                _mm_prefetch((const char *)(w + LP_LORA_STATIC_PREFETCH), _MM_HINT_T0);
                if (!packed) _mm_prefetch((const char *)(w + 64 + LP_LORA_STATIC_PREFETCH), _MM_HINT_T0);
                acc0 = _mm512_dpbusd_epi32(acc0, _mm512_loadu_si512(cx + k), codes64(w, packed));
                acc1 = _mm512_dpbusd_epi32(acc1, _mm512_loadu_si512(cx + k + 64), codes64(w + step, packed));
            }
            for (; k < k1; k += 64) { /* packed rows are padded to 64 codes; 8-bit ones are not */
                __mmask64 m = k1 - k >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (k1 - k)) - 1;
                const uint8_t *w = a + (size_t)k / 64 * step;
                __m512i c = _mm512_maskz_loadu_epi8(m, cx + k);
                acc0 = _mm512_dpbusd_epi32(acc0, c, packed ? codes64(w, true) : flip512(_mm512_maskz_loadu_epi8(m, w)));
            }
            d += _mm512_reduce_add_epi32(_mm512_add_epi32(acc0, acc1));
        }
        lp_lora_static_shrink_code(L, j, shrink_sum(L, j, d, sum_cx), ct);
    }
}

V512 static void shrink_512(const lp_lora_static *L, const uint8_t *cx, int64_t sum_cx, int j0, int j1,
                            uint8_t *ct) {
    if (L->packed) shrink512_impl(L, cx, sum_cx, j0, j1, ct, true);
    else shrink512_impl(L, cx, sum_cx, j0, j1, ct, false);
}

/* 16 encodings from e[0..n) (n <= 16): their scales and zero points. */
V512 INLINE void encodings16(const lp_qenc *e, int n, __m512 *scale, __m512i *zero) {
    int n0 = n < 8 ? n : 8, n1 = n - n0;
    __m512 lo = _mm512_maskz_loadu_ps((__mmask16)((1u << (2 * n0)) - 1), e);
    __m512 hi = _mm512_maskz_loadu_ps((__mmask16)((1u << (2 * n1)) - 1), e + 8);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    *scale = _mm512_permutex2var_ps(lo, even, hi);
    *zero = _mm512_castps_si512(_mm512_permutex2var_ps(lo, odd, hi));
}

V512 INLINE void expand512_impl(const lp_lora_static *L, const uint8_t *ct, int o0, int o1, float *y,
                                bool packed) {
    expand_quads e;
    expand_quads_init(L, ct, packed, &e);
    const int nq = e.nq;
    const size_t step = e.step;
    const __m512i q_sum = _mm512_set1_epi32(e.sum), bias = _mm512_set1_epi32(BIAS(packed));
    __m512 scale = _mm512_set1_ps(L->eb[0].scale);
    __m512i zb = _mm512_set1_epi32(L->eb[0].zero);
    for (int o = o0; o < o1;) {
        int blk = o / 16, lo = o - 16 * blk, hi = o1 - 16 * blk < 16 ? o1 - 16 * blk : 16;
        __mmask16 m = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
        const uint8_t *b = L->qb + (size_t)blk * (size_t)nq * step;
        __m512i dp = _mm512_setzero_si512(), dn = _mm512_setzero_si512();
        for (int q = 0; q < nq; q++) {
            _mm_prefetch((const char *)(b + step * q + LP_LORA_STATIC_PREFETCH), _MM_HINT_T0);
            __m512i w = codes64(b + step * q, packed);
            dp = _mm512_dpbusd_epi32(dp, _mm512_set1_epi32((int)e.pos[q]), w);
            dn = _mm512_dpbusd_epi32(dn, _mm512_set1_epi32((int)e.neg[q]), w);
        }
        if (L->nb > 1) {
            /* the encodings are a second stream, as long as B's for rank 8 */
            const char *e = (const char *)(L->eb + 16 * blk);
            _mm_prefetch(e + LP_LORA_STATIC_PREFETCH, _MM_HINT_T0);
            _mm_prefetch(e + 64 + LP_LORA_STATIC_PREFETCH, _MM_HINT_T0);
            encodings16(L->eb + 16 * blk, hi, &scale, &zb);
        }
        __m512i s = _mm512_add_epi32(_mm512_sub_epi32(dp, dn), _mm512_mullo_epi32(_mm512_sub_epi32(bias, zb), q_sum));
        __m512 f = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(e.st), scale), _mm512_cvtepi32_ps(s));
        float *yb = y + 16 * blk;
        _mm512_mask_storeu_ps(yb, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, yb), f));
        o = 16 * blk + hi;
    }
}

V512 static void expand_512(const lp_lora_static *L, const uint8_t *ct, int o0, int o1, float *y) {
    if (L->rank > LP_LORA_STATIC_INT32_RANK) lp_lora_static_ref.expand(L, ct, o0, o1, y);
    else if (L->packed) expand512_impl(L, ct, o0, o1, y, true);
    else expand512_impl(L, ct, o0, o1, y, false);
}

const lp_lora_static_ops lp_lora_static_avx512vnni = {quantize_512, shrink_512, expand_512};

/* ---- AVX-VNNI (256-bit) ---------------------------------------------------------------- */

V256 INLINE __m256i flip256(__m256i v) { return _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)); }

/* 32 weight codes as signed bytes: 8-bit codes at p less 128, or the low
 * (half 0) or high (half 1) nibbles of 32 packed bytes at p. */
V256 INLINE __m256i codes32(const uint8_t *p, bool packed, int half) {
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    if (!packed) return flip256(v);
    return _mm256_and_si256(half ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(15));
}

V256 static int64_t quantize_256(const lp_lora_static *L, const float *x, uint8_t *cx) {
    const __m256 scale = _mm256_set1_ps(L->x.scale), zero = _mm256_set1_ps((float)L->x.zero),
                 qmax = _mm256_set1_ps((float)L->act_qmax), nil = _mm256_setzero_ps();
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    __m256i sum = _mm256_setzero_si256();
    int k = 0;
    for (; k + 8 <= L->in; k += 8) {
        __m256 r = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + k), scale),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(r, zero), nil), qmax); /* NaN -> 0 */
        __m256i c = _mm256_cvtps_epi32(r);
        sum = _mm256_add_epi32(sum, c);
        __m256i b = _mm256_shuffle_epi8(c, pick);
        uint32_t lo = (uint32_t)_mm256_extract_epi32(b, 0), hi = (uint32_t)_mm256_extract_epi32(b, 4);
        memcpy(cx + k, &lo, 4);
        memcpy(cx + k + 4, &hi, 4);
    }
    int32_t lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, sum);
    int64_t total = 0;
    for (int i = 0; i < 8; i++) total += lanes[i];
    for (; k < L->in; k++) {
        int c = lp_q_code(x[k], L->x, L->act_qmax);
        cx[k] = (uint8_t)c;
        total += c;
    }
    return total;
}

V256 INLINE void shrink256_impl(const lp_lora_static *L, const uint8_t *cx, int64_t sum_cx, int j0, int j1,
                                uint8_t *ct, bool packed) {
    const size_t step = packed ? 32 : 64; /* bytes of 64 codes */
    int full = L->in & ~63;
    for (int j = j0; j < j1; j++) {
        const uint8_t *a = lp_lora_static_a_row(L, j);
        int64_t d = 0;
        for (int k0 = 0; k0 < full; k0 += SHRINK_CHUNK) {
            int k1 = full - k0 < SHRINK_CHUNK ? full : k0 + SHRINK_CHUNK;
            __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
            for (int k = k0; k < k1; k += 64) {
                const uint8_t *w = a + (size_t)k / 64 * step;
                _mm_prefetch((const char *)(w + LP_LORA_STATIC_PREFETCH), _MM_HINT_T0);
                acc0 = _mm256_dpbusd_avx_epi32(acc0, _mm256_loadu_si256((const __m256i *)(cx + k)),
                                               codes32(w, packed, 0));
                acc1 = _mm256_dpbusd_avx_epi32(acc1, _mm256_loadu_si256((const __m256i *)(cx + k + 32)),
                                               packed ? codes32(w, true, 1) : codes32(w + 32, false, 0));
            }
            int32_t lanes[8];
            _mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi32(acc0, acc1));
            for (int i = 0; i < 8; i++) d += lanes[i];
        }
        for (int k = full; k < L->in; k++) d += cx[k] * (lp_lora_static_code(a, (size_t)k, packed) - BIAS(packed));
        lp_lora_static_shrink_code(L, j, shrink_sum(L, j, d, sum_cx), ct);
    }
}

V256 static void shrink_256(const lp_lora_static *L, const uint8_t *cx, int64_t sum_cx, int j0, int j1,
                            uint8_t *ct) {
    if (L->packed) shrink256_impl(L, cx, sum_cx, j0, j1, ct, true);
    else shrink256_impl(L, cx, sum_cx, j0, j1, ct, false);
}

/* 8 encodings from e: their scales and zero points. */
V256 INLINE void encodings8(const lp_qenc *e, __m256 *scale, __m256i *zero) {
    __m256 lo = _mm256_loadu_ps((const float *)e), hi = _mm256_loadu_ps((const float *)(e + 4));
    /* per 128-bit lane: entries (0, 1, 4, 5) and (2, 3, 6, 7); then put them in order */
    __m256 s = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)), z = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
    *scale = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s), _MM_SHUFFLE(3, 1, 2, 0)));
    *zero = _mm256_castpd_si256(_mm256_permute4x64_pd(_mm256_castps_pd(z), _MM_SHUFFLE(3, 1, 2, 0)));
}

/* Half blocks (8 outputs) that [o0, o1) covers whole; partial ones run
 * the reference. */
V256 INLINE void expand256_impl(const lp_lora_static *L, const uint8_t *ct, int h0, int h1, float *y, bool packed) {
    expand_quads e;
    expand_quads_init(L, ct, packed, &e);
    const int nq = e.nq;
    const size_t step = e.step;
    const __m256i q_sum = _mm256_set1_epi32(e.sum), bias = _mm256_set1_epi32(BIAS(packed));
    __m256 scale = _mm256_set1_ps(L->eb[0].scale);
    __m256i zb = _mm256_set1_epi32(L->eb[0].zero);
    for (int h = h0; h < h1; h++) {
        int o = 8 * h;
        /* packed: both halves of a block share its bytes (low / high nibbles) */
        const uint8_t *b = L->qb + (size_t)(h / 2) * (size_t)nq * step + (packed ? 0 : 32 * (size_t)(h % 2));
        __m256i dp = _mm256_setzero_si256(), dn = _mm256_setzero_si256();
        for (int q = 0; q < nq; q++) {
            _mm_prefetch((const char *)(b + step * q + LP_LORA_STATIC_PREFETCH), _MM_HINT_T0);
            __m256i w = codes32(b + step * q, packed, h % 2);
            dp = _mm256_dpbusd_avx_epi32(dp, _mm256_set1_epi32((int)e.pos[q]), w);
            dn = _mm256_dpbusd_avx_epi32(dn, _mm256_set1_epi32((int)e.neg[q]), w);
        }
        if (L->nb > 1) {
            _mm_prefetch((const char *)(L->eb + o) + LP_LORA_STATIC_PREFETCH, _MM_HINT_T0);
            encodings8(L->eb + o, &scale, &zb);
        }
        __m256i s = _mm256_add_epi32(_mm256_sub_epi32(dp, dn), _mm256_mullo_epi32(_mm256_sub_epi32(bias, zb), q_sum));
        __m256 f = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(e.st), scale), _mm256_cvtepi32_ps(s));
        _mm256_storeu_ps(y + o, _mm256_add_ps(_mm256_loadu_ps(y + o), f));
    }
}

V256 static void expand_256(const lp_lora_static *L, const uint8_t *ct, int o0, int o1, float *y) {
    int h0 = (o0 + 7) / 8, h1 = o1 / 8;
    if (L->rank > LP_LORA_STATIC_INT32_RANK || h1 <= h0) {
        lp_lora_static_ref.expand(L, ct, o0, o1, y);
        return;
    }
    if (o0 < 8 * h0) lp_lora_static_ref.expand(L, ct, o0, 8 * h0, y);
    if (L->packed) expand256_impl(L, ct, h0, h1, y, true);
    else expand256_impl(L, ct, h0, h1, y, false);
    if (8 * h1 < o1) lp_lora_static_ref.expand(L, ct, 8 * h1, o1, y);
}

const lp_lora_static_ops lp_lora_static_avxvnni = {quantize_256, shrink_256, expand_256};

#endif
