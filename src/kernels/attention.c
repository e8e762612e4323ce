/* Multi-head attention in tiles with a streaming softmax (image_ops.h):
 * the plain path (the reference level) and blocks of 32 queries (AVX-512)
 * or 16 (AVX2) vectorised across the queries.
 *
 * The plain path takes one query at a time: a dot product per key (a
 * horizontal sum for a head width of 40), a scalar expf per score and an
 * axpy per key. A block transposes its queries once, Qt [d][32], so that a
 * score is one lane of an FMA: for each of 8 keys, 32 queries x one key
 * channel per pair of FMAs, the key's element broadcast. Scores go to St
 * [keys][32], one row per key; the running maximum, the exponentials and
 * the sums are then vertical operations on those rows, and the values mix
 * into a transposed accumulator Ot [d][32] the same way (the value's
 * element broadcast, a row of probabilities the vector). Per (query, key)
 * pair that is about 2d/16 FMAs plus a sixteenth of an exponential. The
 * softmax is the same streaming one (running maximum, rescale by
 * exp(m_old - m_new)), with a polynomial exp: results agree with the plain
 * path to float rounding, not bit for bit (float levels, like
 * lp_softmax_avx512). */
#include "image_ops.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* ---- attention ---------------------------------------------------------------------- */

/* One thread's scratch: the plain path's scores [QT][KT], accumulators
 * [QT][d], running maximum and sum [QT] each; the AVX-512 block's Qt and Ot
 * [d][QT], St [KT][QT] and the sums' inverses [QT]. */
static size_t attn_thread_floats(int64_t d) {
    size_t f = (size_t)LP_ATTN_QUERY_TILE * ((size_t)LP_ATTN_KEY_TILE + 2 * (size_t)d + 2);
    return (f + 15) & ~(size_t)15; /* 64-byte apart */
}

size_t lp_attention_scratch_floats(int n_threads, int64_t d) {
    return (size_t)(n_threads > 0 ? n_threads : 1) * attn_thread_floats(d);
}

typedef struct attn_job {
    const lp_kernels *k;
    const lp_attn_shape *s;
    const float *q, *key, *v;
    float *out, *scratch;
} attn_job;

/* Queries [i0, i0 + nq) of head h against every key, a key tile at a time:
 * for each tile the running maximum m rises to cover the tile's scores, what
 * was accumulated so far is rescaled by exp(m_old - m_new), and the tile's
 * exp(s - m_new) are added to the sum and, times v, to the accumulator. */
static void attn_block(const attn_job *j, int32_t h, int64_t i0, int64_t nq, float *sc) {
    const lp_attn_shape *s = j->s;
    int64_t d = s->d;
    float *scores = sc, *acc = sc + LP_ATTN_QUERY_TILE * LP_ATTN_KEY_TILE;
    float *m = acc + LP_ATTN_QUERY_TILE * d, *l = m + LP_ATTN_QUERY_TILE;
    for (int64_t i = 0; i < nq; i++) {
        m[i] = -FLT_MAX;
        l[i] = 0;
        memset(acc + i * d, 0, (size_t)d * sizeof(float));
    }
    int64_t nk = s->nk;
    if (s->causal && i0 + nq < nk) nk = i0 + nq; /* no query of this block sees further */
    for (int64_t j0 = 0; j0 < nk; j0 += LP_ATTN_KEY_TILE) {
        int64_t nt = nk - j0 < LP_ATTN_KEY_TILE ? nk - j0 : LP_ATTN_KEY_TILE;
        for (int64_t i = 0; i < nq; i++) {
            const float *qi = j->q + (i0 + i) * s->q_stride + (int64_t)h * d;
            float *si = scores + i * LP_ATTN_KEY_TILE;
            int64_t vis = nt;
            if (s->causal) {
                vis = i0 + i + 1 - j0; /* keys j0 .. i0+i */
                if (vis > nt) vis = nt;
                if (vis <= 0) continue;
            }
            float tmax = -FLT_MAX;
            for (int64_t t = 0; t < vis; t++) {
                const float *kj = j->key + (j0 + t) * s->k_stride + (int64_t)h * d;
                si[t] = s->scale * j->k->dot_f32(qi, kj, d);
                if (si[t] > tmax) tmax = si[t];
            }
            float mnew = tmax > m[i] ? tmax : m[i];
            float corr = expf(m[i] - mnew); /* 0 on the first tile: m = -FLT_MAX */
            float *ai = acc + i * d;
            if (corr != 1.0f) {
                for (int64_t c = 0; c < d; c++) ai[c] *= corr;
            }
            float sum = 0;
            for (int64_t t = 0; t < vis; t++) {
                float p = expf(si[t] - mnew);
                sum += p;
                j->k->axpy_f32(ai, p, j->v + (j0 + t) * s->v_stride + (int64_t)h * d, d);
            }
            l[i] = l[i] * corr + sum;
            m[i] = mnew;
        }
    }
    for (int64_t i = 0; i < nq; i++) {
        float *o = j->out + (i0 + i) * s->out_stride + (int64_t)h * d;
        float inv = l[i] > 0 ? 1.0f / l[i] : 0.0f;
        for (int64_t c = 0; c < d; c++) o[c] = acc[i * d + c] * inv;
    }
}

/* ---- the AVX-512 block ----------------------------------------------------------- */

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

#include "exp_avx512.h"

#define QB LP_ATTN_QUERY_TILE /* queries per block: two vectors */
#define KB 8  /* keys per score tile (16 accumulators) */
#define CB 8  /* value channels per mix tile (16 accumulators) */

/* St rows t0..t0+KN-1 = the block's scores against keys at kp (row stride
 * ks): KN keys x 32 queries in 2*KN accumulators, over d channels. */
AVX512 INLINE void score_tile(const float *qt, int64_t d, const float *kp, int64_t ks, int KN, float *st) {
    __m512 acc[KB][2];
    for (int k = 0; k < KN; k++) acc[k][0] = acc[k][1] = _mm512_setzero_ps();
    for (int64_t c = 0; c < d; c++) {
        __m512 qa = _mm512_loadu_ps(qt + c * QB), qb = _mm512_loadu_ps(qt + c * QB + 16);
        for (int k = 0; k < KN; k++) {
            __m512 kv = _mm512_set1_ps(kp[k * ks + c]);
            acc[k][0] = _mm512_fmadd_ps(qa, kv, acc[k][0]);
            acc[k][1] = _mm512_fmadd_ps(qb, kv, acc[k][1]);
        }
    }
    for (int k = 0; k < KN; k++) {
        _mm512_storeu_ps(st + k * QB, acc[k][0]);
        _mm512_storeu_ps(st + k * QB + 16, acc[k][1]);
    }
}

/* Ot rows c0..c0+CN-1 += sum over the nt keys of St[t] x v[t][c]. */
AVX512 INLINE void mix_tile(float *ot, const float *st, const float *vp, int64_t vs, int64_t nt, int CN) {
    __m512 acc[CB][2];
    for (int c = 0; c < CN; c++) {
        acc[c][0] = _mm512_loadu_ps(ot + c * QB);
        acc[c][1] = _mm512_loadu_ps(ot + c * QB + 16);
    }
    for (int64_t t = 0; t < nt; t++) {
        __m512 pa = _mm512_loadu_ps(st + t * QB), pb = _mm512_loadu_ps(st + t * QB + 16);
        const float *vt = vp + t * vs;
        for (int c = 0; c < CN; c++) {
            __m512 vv = _mm512_set1_ps(vt[c]);
            acc[c][0] = _mm512_fmadd_ps(pa, vv, acc[c][0]);
            acc[c][1] = _mm512_fmadd_ps(pb, vv, acc[c][1]);
        }
    }
    for (int c = 0; c < CN; c++) {
        _mm512_storeu_ps(ot + c * QB, acc[c][0]);
        _mm512_storeu_ps(ot + c * QB + 16, acc[c][1]);
    }
}

/* The tile functions with their count a constant 1..8, so their
 * accumulators stay in registers. */
#define CASES(CALL) \
    CALL(1) CALL(2) CALL(3) CALL(4) CALL(5) CALL(6) CALL(7) CALL(8)

AVX512 static void score_tile_n(const float *qt, int64_t d, const float *kp, int64_t ks, int n, float *st) {
    switch (n) {
#define SCORE(N) \
    case N: score_tile(qt, d, kp, ks, N, st); break;
        CASES(SCORE)
#undef SCORE
    default: break;
    }
}

AVX512 static void mix_tile_n(float *ot, const float *st, const float *vp, int64_t vs, int64_t nt, int n) {
    switch (n) {
#define MIX(N) \
    case N: mix_tile(ot, st, vp, vs, nt, N); break;
        CASES(MIX)
#undef MIX
    default: break;
    }
}

/* Causal: query i0 + i sees key j when j <= i0 + i; the other lanes of key
 * j's row become 0 after the exponentials (their scores, -inf before). */
AVX512 INLINE __mmask16 visible(int64_t j, int64_t i0, int lane0) {
    __m512i lanes = _mm512_add_epi32(_mm512_set1_epi32(lane0), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                                                   11, 12, 13, 14, 15));
    int64_t first = j - i0; /* the first lane that sees key j */
    if (first <= lane0) return (__mmask16)0xffff;
    if (first >= lane0 + 16) return 0;
    return _mm512_cmpge_epi32_mask(lanes, _mm512_set1_epi32((int32_t)first));
}

AVX512 static void block_avx512(const lp_attn_shape *s, const float *q, const float *key, const float *v,
                                 float *out, int32_t h, int64_t i0, int64_t nq, float *sc) {
    const int64_t d = s->d, KT = LP_ATTN_KEY_TILE;
    float *qt = sc, *ot = qt + d * QB, *st = ot + d * QB, *l = st + KT * QB; /* attn_thread_floats */
    /* the block's queries, transposed and pre-scaled; missing ones are 0 */
    for (int64_t c = 0; c < d; c++)
        for (int i = 0; i < QB; i++) qt[c * QB + i] = i < nq ? s->scale * q[(i0 + i) * s->q_stride + h * d + c] : 0.0f;
    memset(ot, 0, sizeof(float) * (size_t)(d * QB));
    __m512 mv[2] = {_mm512_set1_ps(-FLT_MAX), _mm512_set1_ps(-FLT_MAX)}, lv[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t nk = s->nk;
    if (s->causal && i0 + nq < nk) nk = i0 + nq; /* no query of this block sees further */
    for (int64_t j0 = 0; j0 < nk; j0 += KT) {
        int64_t nt = nk - j0 < KT ? nk - j0 : KT;
        const float *kp = key + j0 * s->k_stride + h * d;
        for (int64_t t = 0; t < nt; t += KB)
            score_tile_n(qt, d, kp + t * s->k_stride, s->k_stride, (int)(nt - t < KB ? nt - t : KB), st + t * QB);
        for (int half = 0; half < 2; half++) {
            __m512 tmax = _mm512_set1_ps(-FLT_MAX);
            for (int64_t t = 0; t < nt; t++) {
                __mmask16 vis = s->causal ? visible(j0 + t, i0, 16 * half) : (__mmask16)0xffff;
                tmax = _mm512_mask_max_ps(tmax, vis, tmax, _mm512_loadu_ps(st + t * QB + 16 * half));
            }
            __m512 mnew = _mm512_max_ps(mv[half], tmax);
            __m512 corr = exp16(_mm512_sub_ps(mv[half], mnew)); /* 0 on the first tile: m = -FLT_MAX */
            __m512 sum = _mm512_setzero_ps();
            for (int64_t t = 0; t < nt; t++) {
                float *row = st + t * QB + 16 * half;
                __mmask16 vis = s->causal ? visible(j0 + t, i0, 16 * half) : (__mmask16)0xffff;
                __m512 p = _mm512_maskz_mov_ps(vis, exp16(_mm512_sub_ps(_mm512_loadu_ps(row), mnew)));
                sum = _mm512_add_ps(sum, p);
                _mm512_storeu_ps(row, p);
            }
            for (int64_t c = 0; c < d; c++)
                _mm512_storeu_ps(ot + c * QB + 16 * half, _mm512_mul_ps(_mm512_loadu_ps(ot + c * QB + 16 * half), corr));
            lv[half] = _mm512_fmadd_ps(lv[half], corr, sum);
            mv[half] = mnew;
        }
        const float *vp = v + j0 * s->v_stride + h * d;
        for (int64_t c = 0; c < d; c += CB)
            mix_tile_n(ot + c * QB, st, vp + c, s->v_stride, nt, (int)(d - c < CB ? d - c : CB));
    }
    for (int half = 0; half < 2; half++) {
        __mmask16 pos = _mm512_cmp_ps_mask(lv[half], _mm512_setzero_ps(), _CMP_GT_OQ);
        _mm512_storeu_ps(l + 16 * half, _mm512_maskz_div_ps(pos, _mm512_set1_ps(1.0f), lv[half]));
    }
    for (int64_t i = 0; i < nq; i++) {
        float *o = out + (i0 + i) * s->out_stride + h * d;
        for (int64_t c = 0; c < d; c++) o[c] = ot[c * QB + i] * l[i];
    }
}


/* ---- the AVX2 block: the same steps on 8 lanes ------------------------------------- */

#define AVX2 __attribute__((target("avx2,fma")))
#define QB2 16 /* queries per block: two vectors (16 registers in all) */
#define KB2 4
#define CB2 4

/* e^x on 8 lanes, exp16's steps; 2^n built in the exponent bits (n is in
 * [-149, 128] after the clamp: split in two factors so both are normal). */
AVX2 INLINE __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-103.0f)), _mm256_set1_ps(88.7f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i ni = _mm256_cvtps_epi32(n), half = _mm256_srai_epi32(ni, 1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

AVX2 INLINE void score_tile8(const float *qt, int64_t d, const float *kp, int64_t ks, int KN, float *st) {
    __m256 acc[KB2][2];
    for (int k = 0; k < KN; k++) acc[k][0] = acc[k][1] = _mm256_setzero_ps();
    for (int64_t c = 0; c < d; c++) {
        __m256 qa = _mm256_loadu_ps(qt + c * QB2), qb = _mm256_loadu_ps(qt + c * QB2 + 8);
        for (int k = 0; k < KN; k++) {
            __m256 kv = _mm256_broadcast_ss(kp + k * ks + c);
            acc[k][0] = _mm256_fmadd_ps(qa, kv, acc[k][0]);
            acc[k][1] = _mm256_fmadd_ps(qb, kv, acc[k][1]);
        }
    }
    for (int k = 0; k < KN; k++) {
        _mm256_storeu_ps(st + k * QB2, acc[k][0]);
        _mm256_storeu_ps(st + k * QB2 + 8, acc[k][1]);
    }
}

AVX2 INLINE void mix_tile8(float *ot, const float *st, const float *vp, int64_t vs, int64_t nt, int CN) {
    __m256 acc[CB2][2];
    for (int c = 0; c < CN; c++) {
        acc[c][0] = _mm256_loadu_ps(ot + c * QB2);
        acc[c][1] = _mm256_loadu_ps(ot + c * QB2 + 8);
    }
    for (int64_t t = 0; t < nt; t++) {
        __m256 pa = _mm256_loadu_ps(st + t * QB2), pb = _mm256_loadu_ps(st + t * QB2 + 8);
        for (int c = 0; c < CN; c++) {
            __m256 vv = _mm256_broadcast_ss(vp + t * vs + c);
            acc[c][0] = _mm256_fmadd_ps(pa, vv, acc[c][0]);
            acc[c][1] = _mm256_fmadd_ps(pb, vv, acc[c][1]);
        }
    }
    for (int c = 0; c < CN; c++) {
        _mm256_storeu_ps(ot + c * QB2, acc[c][0]);
        _mm256_storeu_ps(ot + c * QB2 + 8, acc[c][1]);
    }
}

#define CASES4(CALL) CALL(1) CALL(2) CALL(3) CALL(4)

AVX2 static void score_tile8_n(const float *qt, int64_t d, const float *kp, int64_t ks, int n, float *st) {
    switch (n) {
#define SCORE(N) \
    case N: score_tile8(qt, d, kp, ks, N, st); break;
        CASES4(SCORE)
#undef SCORE
    default: break;
    }
}

AVX2 static void mix_tile8_n(float *ot, const float *st, const float *vp, int64_t vs, int64_t nt, int n) {
    switch (n) {
#define MIX(N) \
    case N: mix_tile8(ot, st, vp, vs, nt, N); break;
        CASES4(MIX)
#undef MIX
    default: break;
    }
}

/* visible() on 8 lanes: all ones where query i0 + lane0 + lane sees key j. */
AVX2 INLINE __m256 visible8(int64_t j, int64_t i0, int lane0) {
    int64_t first = j - i0 - lane0; /* the first lane that sees key j */
    if (first <= 0) return _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    if (first >= 8) return _mm256_setzero_ps();
    __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(lanes, _mm256_set1_epi32((int32_t)first - 1)));
}

AVX2 static void block_avx2(const lp_attn_shape *s, const float *q, const float *key, const float *v, float *out,
                            int32_t h, int64_t i0, int64_t nq, float *sc) {
    const int64_t d = s->d, KT = LP_ATTN_KEY_TILE;
    float *qt = sc, *ot = qt + d * QB2, *st = ot + d * QB2, *l = st + KT * QB2; /* within attn_thread_floats */
    for (int64_t c = 0; c < d; c++)
        for (int i = 0; i < QB2; i++) qt[c * QB2 + i] = i < nq ? s->scale * q[(i0 + i) * s->q_stride + h * d + c] : 0.0f;
    memset(ot, 0, sizeof(float) * (size_t)(d * QB2));
    __m256 mv[2] = {_mm256_set1_ps(-FLT_MAX), _mm256_set1_ps(-FLT_MAX)}, lv[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t nk = s->nk;
    if (s->causal && i0 + nq < nk) nk = i0 + nq;
    for (int64_t j0 = 0; j0 < nk; j0 += KT) {
        int64_t nt = nk - j0 < KT ? nk - j0 : KT;
        const float *kp = key + j0 * s->k_stride + h * d;
        for (int64_t t = 0; t < nt; t += KB2)
            score_tile8_n(qt, d, kp + t * s->k_stride, s->k_stride, (int)(nt - t < KB2 ? nt - t : KB2), st + t * QB2);
        for (int half = 0; half < 2; half++) {
            __m256 tmax = _mm256_set1_ps(-FLT_MAX), all = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
            for (int64_t t = 0; t < nt; t++) {
                __m256 vis = s->causal ? visible8(j0 + t, i0, 8 * half) : all;
                tmax = _mm256_blendv_ps(tmax, _mm256_max_ps(tmax, _mm256_loadu_ps(st + t * QB2 + 8 * half)), vis);
            }
            __m256 mnew = _mm256_max_ps(mv[half], tmax);
            __m256 corr = exp8(_mm256_sub_ps(mv[half], mnew));
            __m256 sum = _mm256_setzero_ps();
            for (int64_t t = 0; t < nt; t++) {
                float *row = st + t * QB2 + 8 * half;
                __m256 vis = s->causal ? visible8(j0 + t, i0, 8 * half) : all;
                __m256 p = _mm256_and_ps(vis, exp8(_mm256_sub_ps(_mm256_loadu_ps(row), mnew)));
                sum = _mm256_add_ps(sum, p);
                _mm256_storeu_ps(row, p);
            }
            for (int64_t c = 0; c < d; c++)
                _mm256_storeu_ps(ot + c * QB2 + 8 * half, _mm256_mul_ps(_mm256_loadu_ps(ot + c * QB2 + 8 * half), corr));
            lv[half] = _mm256_fmadd_ps(lv[half], corr, sum);
            mv[half] = mnew;
        }
        const float *vp = v + j0 * s->v_stride + h * d;
        for (int64_t c = 0; c < d; c += CB2)
            mix_tile8_n(ot + c * QB2, st, vp + c, s->v_stride, nt, (int)(d - c < CB2 ? d - c : CB2));
    }
    for (int half = 0; half < 2; half++) {
        __m256 pos = _mm256_cmp_ps(lv[half], _mm256_setzero_ps(), _CMP_GT_OQ);
        _mm256_storeu_ps(l + 8 * half, _mm256_and_ps(pos, _mm256_div_ps(_mm256_set1_ps(1.0f), lv[half])));
    }
    for (int64_t i = 0; i < nq; i++) {
        float *o = out + (i0 + i) * s->out_stride + h * d;
        for (int64_t c = 0; c < d; c++) o[c] = ot[c * QB2 + i] * l[i];
    }
}

#endif

static void attn_worker(void *ctx, int ti, int nt) {
    const attn_job *j = ctx;
    int64_t qblocks = (j->s->nq + LP_ATTN_QUERY_TILE - 1) / LP_ATTN_QUERY_TILE;
    int64_t begin, end;
    lp_split_range(qblocks * j->s->heads, ti, nt, 1, &begin, &end);
    float *sc = j->scratch + (size_t)ti * attn_thread_floats(j->s->d);
    for (int64_t w = begin; w < end; w++) {
        int32_t h = (int32_t)(w / qblocks);
        int64_t i0 = (w % qblocks) * LP_ATTN_QUERY_TILE;
        int64_t nq = j->s->nq - i0 < LP_ATTN_QUERY_TILE ? j->s->nq - i0 : LP_ATTN_QUERY_TILE;
#if defined(__x86_64__)
        if (j->k->level >= 2) {
            block_avx512(j->s, j->q, j->key, j->v, j->out, h, i0, nq, sc);
            continue;
        }
        if (j->k->level == 1) { /* two blocks of 16 */
            block_avx2(j->s, j->q, j->key, j->v, j->out, h, i0, nq < QB2 ? nq : QB2, sc);
            if (nq > QB2) block_avx2(j->s, j->q, j->key, j->v, j->out, h, i0 + QB2, nq - QB2, sc);
            continue;
        }
#endif
        attn_block(j, h, i0, nq, sc);
    }
}

void lp_attention_tiled(const lp_kernels *k, lp_threadpool *pool, const lp_attn_shape *s, const float *q,
                        const float *key, const float *v, float *out, float *scratch) {
    attn_job job = {.k = k, .s = s, .q = q, .key = key, .v = v, .out = out, .scratch = scratch};
    /* small problems run inline: waking the pool costs more */
    if ((double)s->nq * (double)s->nk * (double)s->d * s->heads < 65536.0) pool = NULL;
    lp_threadpool_run(pool, attn_worker, &job);
}
