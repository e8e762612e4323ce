/* Forward and backward of each operation, on FP32 rows.
 *
 * Matrix products have two implementations, picked per model by
 * gemm_level (lp_train_model.gemm_level):
 *   0  plain C: one kernel, lp_t_gemm_nt (Y = A Bᵀ, reduction contiguous in
 *      both), blocked 4 rows x 2 columns with 4-lane vector accumulators;
 *      the backward products are reduced to it by transposing.
 *   1  AVX2+FMA and 2  AVX-512: "A times B" with B row-major [K][C], so the
 *      vector runs along output columns and every output element is one
 *      chain of fused multiply-adds over k = 0..K-1 (no horizontal sums).
 *      dX = dY W needs no transpose at all; Y = X Wᵀ transposes W (small) and
 *      dW = dYᵀ X transposes dY.
 * Within a level, every output element is summed in the same order whatever
 * tile or thread computes it, so results are bitwise independent of the
 * thread count. Different levels round differently (FMA vs mul+add). */
#include <math.h>
#include <string.h>

#include "train_internal.h"

#define LP_T_ALWAYS_INLINE inline __attribute__((always_inline))
#if defined(__x86_64__) || defined(__i386__)
#define LP_T_X86 1
#endif

/* ---- the matrix kernel ------------------------------------------------------ */

typedef float v4f __attribute__((vector_size(16)));

static inline v4f load4(const float *p) {
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float hsum4(v4f v) { return (v[0] + v[1]) + (v[2] + v[3]); }

/* One element, in exactly the order the blocked path uses. */
static float gemm_dot(const float *a, const float *b, int K) {
    v4f acc = {0, 0, 0, 0};
    int k = 0;
    for (; k + 4 <= K; k += 4) acc += load4(a + k) * load4(b + k);
    float s = hsum4(acc);
    for (; k < K; k++) s += a[k] * b[k];
    return s;
}

static inline void gemm_store(float *y, float v, float alpha, bool accumulate) {
    *y = accumulate ? *y + alpha * v : alpha * v;
}

/* Rows [r0, r0+4) x columns [c0, c0+2). */
static void gemm_block_4x2(float *Y, const float *A, const float *Bm, int r0, int c0, int C,
                           int K, float alpha, bool accumulate) {
    const float *a0 = A + (size_t)r0 * K, *a1 = a0 + K, *a2 = a1 + K, *a3 = a2 + K;
    const float *b0 = Bm + (size_t)c0 * K, *b1 = b0 + K;
    v4f s00 = {0}, s01 = {0}, s10 = {0}, s11 = {0}, s20 = {0}, s21 = {0}, s30 = {0}, s31 = {0};
    int k = 0;
    for (; k + 4 <= K; k += 4) {
        v4f x0 = load4(b0 + k), x1 = load4(b1 + k), r;
        r = load4(a0 + k); s00 += r * x0; s01 += r * x1;
        r = load4(a1 + k); s10 += r * x0; s11 += r * x1;
        r = load4(a2 + k); s20 += r * x0; s21 += r * x1;
        r = load4(a3 + k); s30 += r * x0; s31 += r * x1;
    }
    float s[4][2] = {{hsum4(s00), hsum4(s01)}, {hsum4(s10), hsum4(s11)},
                     {hsum4(s20), hsum4(s21)}, {hsum4(s30), hsum4(s31)}};
    const float *as[4] = {a0, a1, a2, a3};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++) {
            const float *b = j ? b1 : b0;
            float v = s[i][j];
            for (int kk = k; kk < K; kk++) v += as[i][kk] * b[kk];
            gemm_store(&Y[(size_t)(r0 + i) * C + c0 + j], v, alpha, accumulate);
        }
}

typedef struct gemm_job {
    float *Y;
    const float *A, *Bm;
    int R, C, K;
    float alpha;
    bool accumulate;
} gemm_job;

static void gemm_worker(void *arg, int thread, int n_threads) {
    const gemm_job *j = arg;
    int64_t begin, end;
    lp_split_range(j->R, thread, n_threads, 4, &begin, &end);
    int r = (int)begin;
    for (; r + 4 <= end; r += 4) {
        int c = 0;
        for (; c + 2 <= j->C; c += 2)
            gemm_block_4x2(j->Y, j->A, j->Bm, r, c, j->C, j->K, j->alpha, j->accumulate);
        for (; c < j->C; c++)
            for (int i = r; i < r + 4; i++)
                gemm_store(&j->Y[(size_t)i * j->C + c],
                           gemm_dot(j->A + (size_t)i * j->K, j->Bm + (size_t)c * j->K, j->K),
                           j->alpha, j->accumulate);
    }
    for (; r < end; r++)
        for (int c = 0; c < j->C; c++)
            gemm_store(&j->Y[(size_t)r * j->C + c],
                       gemm_dot(j->A + (size_t)r * j->K, j->Bm + (size_t)c * j->K, j->K),
                       j->alpha, j->accumulate);
}

void lp_t_gemm_nt(lp_threadpool *pool, float *Y, const float *A, const float *Bm, int R,
                  int C, int K, float alpha, bool accumulate) {
    gemm_job j = {Y, A, Bm, R, C, K, alpha, accumulate};
    /* Small products aren't worth waking the workers. */
    if ((int64_t)R * C * K < (1 << 16)) pool = NULL;
    lp_threadpool_run(pool, gemm_worker, &j);
}

/* dst[c][r] = src[r][c], in tiles so both sides stay in cache. */
static void transpose(float *dst, const float *src, int rows, int cols) {
    enum { TILE = 32 };
    for (int r0 = 0; r0 < rows; r0 += TILE)
        for (int c0 = 0; c0 < cols; c0 += TILE) {
            int r1 = r0 + TILE < rows ? r0 + TILE : rows, c1 = c0 + TILE < cols ? c0 + TILE : cols;
            for (int r = r0; r < r1; r++)
                for (int c = c0; c < c1; c++) dst[(size_t)c * rows + r] = src[(size_t)r * cols + c];
        }
}

/* ---- AVX2 / AVX-512 "A times B" kernels --------------------------------------- */

typedef struct gemm_nn_job {
    float *Y;
    const float *A, *B;     /* A [R][K], B [K][C] */
    int R, C, K;
    float alpha;
    bool accumulate;
    int level;
} gemm_nn_job;

#ifdef LP_T_X86
#include <immintrin.h>

/* AVX-512 tile: rows [r0, r0+NR) x columns [c0, c0+32) (masked at the
 * right edge). NR is a constant at each call so the accumulators stay in
 * registers. */
#define AVX512_MR 8
__attribute__((target("avx512f"))) static LP_T_ALWAYS_INLINE void
tile_avx512(const gemm_nn_job *j, int r0, const int NR, int c0) {
    int rem = j->C - c0;
    __mmask16 m0 = rem >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << rem) - 1);
    __mmask16 m1 = rem >= 32 ? (__mmask16)0xFFFF
                 : rem <= 16 ? (__mmask16)0 : (__mmask16)((1u << (rem - 16)) - 1);
    __m512 acc[AVX512_MR][2];
    for (int i = 0; i < NR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    const float *a = j->A + (size_t)r0 * j->K;
    for (int k = 0; k < j->K; k++) {
        const float *b = j->B + (size_t)k * j->C + c0;
        __m512 b0 = _mm512_maskz_loadu_ps(m0, b), b1 = _mm512_maskz_loadu_ps(m1, b + 16);
        for (int i = 0; i < NR; i++) {
            __m512 x = _mm512_set1_ps(a[(size_t)i * j->K + k]);
            acc[i][0] = _mm512_fmadd_ps(x, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(x, b1, acc[i][1]);
        }
    }
    __m512 alpha = _mm512_set1_ps(j->alpha);
    for (int i = 0; i < NR; i++) {
        float *y = j->Y + (size_t)(r0 + i) * j->C + c0;
        __m512 y0 = _mm512_mul_ps(alpha, acc[i][0]), y1 = _mm512_mul_ps(alpha, acc[i][1]);
        if (j->accumulate) {
            y0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, y), y0);
            y1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, y + 16), y1);
        }
        _mm512_mask_storeu_ps(y, m0, y0);
        _mm512_mask_storeu_ps(y + 16, m1, y1);
    }
}

__attribute__((target("avx512f"))) static void tile_avx512_any(const gemm_nn_job *j, int r0,
                                                               int nr, int c0) {
    switch (nr) {
    case 8: tile_avx512(j, r0, 8, c0); break;
    case 7: tile_avx512(j, r0, 7, c0); break;
    case 6: tile_avx512(j, r0, 6, c0); break;
    case 5: tile_avx512(j, r0, 5, c0); break;
    case 4: tile_avx512(j, r0, 4, c0); break;
    case 3: tile_avx512(j, r0, 3, c0); break;
    case 2: tile_avx512(j, r0, 2, c0); break;
    default: tile_avx512(j, r0, 1, c0); break;
    }
}

/* AVX2 tile: rows [r0, r0+NR) x columns [c0, c0+16). */
#define AVX2_MR 4
__attribute__((target("avx2,fma"))) static LP_T_ALWAYS_INLINE __m256i avx2_mask(int rem) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(rem), lanes);
}

__attribute__((target("avx2,fma"))) static LP_T_ALWAYS_INLINE void
tile_avx2(const gemm_nn_job *j, int r0, const int NR, int c0) {
    int rem = j->C - c0;
    __m256i m0 = avx2_mask(rem), m1 = avx2_mask(rem - 8);
    __m256 acc[AVX2_MR][2];
    for (int i = 0; i < NR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    const float *a = j->A + (size_t)r0 * j->K;
    for (int k = 0; k < j->K; k++) {
        const float *b = j->B + (size_t)k * j->C + c0;
        __m256 b0 = _mm256_maskload_ps(b, m0), b1 = _mm256_maskload_ps(b + 8, m1);
        for (int i = 0; i < NR; i++) {
            __m256 x = _mm256_broadcast_ss(a + (size_t)i * j->K + k);
            acc[i][0] = _mm256_fmadd_ps(x, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(x, b1, acc[i][1]);
        }
    }
    __m256 alpha = _mm256_set1_ps(j->alpha);
    for (int i = 0; i < NR; i++) {
        float *y = j->Y + (size_t)(r0 + i) * j->C + c0;
        __m256 y0 = _mm256_mul_ps(alpha, acc[i][0]), y1 = _mm256_mul_ps(alpha, acc[i][1]);
        if (j->accumulate) {
            y0 = _mm256_add_ps(_mm256_maskload_ps(y, m0), y0);
            y1 = _mm256_add_ps(_mm256_maskload_ps(y + 8, m1), y1);
        }
        _mm256_maskstore_ps(y, m0, y0);
        _mm256_maskstore_ps(y + 8, m1, y1);
    }
}

__attribute__((target("avx2,fma"))) static void tile_avx2_any(const gemm_nn_job *j, int r0,
                                                              int nr, int c0) {
    switch (nr) {
    case 4: tile_avx2(j, r0, 4, c0); break;
    case 3: tile_avx2(j, r0, 3, c0); break;
    case 2: tile_avx2(j, r0, 2, c0); break;
    default: tile_avx2(j, r0, 1, c0); break;
    }
}

/* Tasks are (row block, column tile) pairs, row-block major so a thread
 * reuses its A rows across the column tiles. */
static void gemm_nn_worker(void *arg, int thread, int n_threads) {
    const gemm_nn_job *j = arg;
    int mr = j->level == 2 ? AVX512_MR : AVX2_MR, nc = j->level == 2 ? 32 : 16;
    int64_t row_blocks = (j->R + mr - 1) / mr, col_tiles = (j->C + nc - 1) / nc, begin, end;
    lp_split_range(row_blocks * col_tiles, thread, n_threads, 1, &begin, &end);
    for (int64_t t = begin; t < end; t++) {
        int r0 = (int)(t / col_tiles) * mr, c0 = (int)(t % col_tiles) * nc;
        int nr = j->R - r0 < mr ? j->R - r0 : mr;
        if (j->level == 2) tile_avx512_any(j, r0, nr, c0);
        else tile_avx2_any(j, r0, nr, c0);
    }
}
#endif

/* Level > 0 only (callers check): Y (+)= alpha A B. */
static void gemm_nn(lp_threadpool *pool, int level, float *Y, const float *A, const float *B,
                    int R, int C, int K, float alpha, bool accumulate) {
#ifdef LP_T_X86
    gemm_nn_job j = {Y, A, B, R, C, K, alpha, accumulate, level};
    if ((int64_t)R * C * K < (1 << 16)) pool = NULL;
    lp_threadpool_run(pool, gemm_nn_worker, &j);
#else
    (void)pool, (void)level, (void)Y, (void)A, (void)B, (void)R, (void)C, (void)K;
    (void)alpha, (void)accumulate;
#endif
}

int lp_t_gemm_best_level(void) {
#ifdef LP_T_X86
    lp_cpu_features f;
    lp_cpu_detect(&f);
    if (f.avx512f) return 2;
    if (f.avx2 && f.fma) return 1;
#endif
    return 0;
}

/* ---- the three products ---------------------------------------------------------- */

void lp_t_matmul(lp_threadpool *pool, int level, float *Y, const float *X, const float *W,
                 int N, int in, int out, float alpha, bool accumulate, float *scratch) {
    if (level == 0) {
        lp_t_gemm_nt(pool, Y, X, W, N, out, in, alpha, accumulate);
        return;
    }
    transpose(scratch, W, out, in);                 /* Wᵀ: [in][out] */
    gemm_nn(pool, level, Y, X, scratch, N, out, in, alpha, accumulate);
}

void lp_t_matmul_dx(lp_threadpool *pool, int level, float *dX, const float *dY,
                    const float *W, int N, int in, int out, float alpha, bool accumulate,
                    float *scratch) {
    if (level > 0) {
        gemm_nn(pool, level, dX, dY, W, N, in, out, alpha, accumulate);
        return;
    }
    transpose(scratch, W, out, in);                 /* Wᵀ: [in][out] */
    lp_t_gemm_nt(pool, dX, dY, scratch, N, in, out, alpha, accumulate);
}

void lp_t_matmul_dw(lp_threadpool *pool, int level, float *dW, const float *dY,
                    const float *X, int N, int in, int out, float alpha, float *scratch) {
    float *dYt = scratch, *Xt = scratch + (size_t)N * out;
    transpose(dYt, dY, N, out);                     /* [out][N] */
    if (level > 0) {
        gemm_nn(pool, level, dW, dYt, X, out, in, N, alpha, true);
        return;
    }
    transpose(Xt, X, N, in);                        /* [in][N] */
    lp_t_gemm_nt(pool, dW, dYt, Xt, out, in, N, alpha, true);
}

/* ---- RMSNorm ------------------------------------------------------------------- */

void lp_t_rmsnorm(float *y, float *rstd, const float *x, const float *w, int N, int n,
                  float eps) {
    for (int r = 0; r < N; r++) {
        const float *xr = x + (size_t)r * n;
        /* the runtime's formula (lp_rmsnorm), so exported models agree */
        double ss = lp_sum_squares(xr, n);
        float s = 1.0f / sqrtf((float)(ss / (double)n) + eps);
        rstd[r] = s;
        for (int i = 0; i < n; i++) y[(size_t)r * n + i] = xr[i] * s * w[i];
    }
}

/* y = x s w with s = (mean(x²) + eps)^(-1/2):
 *   dw_i += dy_i x_i s
 *   dx_i  = s w_i dy_i - x_i s³/n sum_j(dy_j w_j x_j) */
void lp_t_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x,
                           const float *w, const float *rstd, int N, int n, bool accumulate) {
    for (int r = 0; r < N; r++) {
        const float *xr = x + (size_t)r * n, *dyr = dy + (size_t)r * n;
        float *dxr = dx + (size_t)r * n;
        float s = rstd[r];
        double dot = 0;
        for (int i = 0; i < n; i++) dot += (double)dyr[i] * w[i] * xr[i];
        float c = (float)(dot * (double)s * s * s / n);
        for (int i = 0; i < n; i++) {
            float v = s * w[i] * dyr[i] - xr[i] * c;
            dxr[i] = accumulate ? dxr[i] + v : v;
        }
        if (dw)
            for (int i = 0; i < n; i++) dw[i] += dyr[i] * xr[i] * s;
    }
}

/* ---- RoPE -------------------------------------------------------------------- */

void lp_t_rope(float *x, const float *cos, const float *sin, int N, int n_heads,
               int head_dim, float sign) {
    int half = head_dim / 2;
    for (int r = 0; r < N; r++) {
        const float *c = cos + (size_t)r * half, *s = sin + (size_t)r * half;
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)r * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                float x0 = v[2 * i], x1 = v[2 * i + 1], si = sign * s[i];
                v[2 * i] = x0 * c[i] - x1 * si;
                v[2 * i + 1] = x0 * si + x1 * c[i];
            }
        }
    }
}

/* ---- SwiGLU ------------------------------------------------------------------ */

void lp_t_swiglu(float *h, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        h[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* h = silu(g) u, silu'(g) = σ(g) (1 + g (1 - σ(g))). */
void lp_t_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                          const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i], sg = 1.0f / (1.0f + expf(-g));
        dup[i] = dh[i] * g * sg;
        dgate[i] = dh[i] * up[i] * sg * (1.0f + g * (1.0f - sg));
    }
}

/* ---- attention ----------------------------------------------------------------- */

static inline bool attn_visible(const lp_t_attn *a, int b, int i, int j) {
    return a->visible ? a->visible[((size_t)b * a->T + i) * a->T + j] != 0 : j <= i;
}

/* Eight explicit partial sums: vectorizes (the order is in the source, so
 * every instruction set sums alike) and the lanes' chains run in parallel. */
static LP_T_ALWAYS_INLINE float attn_dot(const float *a, const float *b, int n) {
    float s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) s[l] += a[i + l] * b[i + l];
    float t = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) t += a[i] * b[i];
    return t;
}

/* One (sequence b, head h): P = softmax(q Kᵀ / sqrt(d)) over visible keys,
 * out = P V. Rows that see nothing output zeros. */
static LP_T_ALWAYS_INLINE void attn_forward_one(lp_t_attn *a, int b, int h) {
    int T = a->T, d = a->head_dim, H = a->n_heads, g = h / (H / a->n_kv_heads);
    size_t q_stride = (size_t)H * d, kv_stride = (size_t)a->n_kv_heads * d;
    float scale = 1.0f / sqrtf((float)d);
    for (int i = 0; i < T; i++) {
        const float *q = a->q + ((size_t)b * T + i) * q_stride + (size_t)h * d;
        float *p = a->att + (((size_t)b * H + h) * T + i) * T;
        float *out = a->out + ((size_t)b * T + i) * q_stride + (size_t)h * d;
        float max = -INFINITY;
        for (int j = 0; j < T; j++) {
            if (!attn_visible(a, b, i, j)) {
                p[j] = 0;
                continue;
            }
            const float *k = a->k + ((size_t)b * T + j) * kv_stride + (size_t)g * d;
            p[j] = attn_dot(q, k, d) * scale;
            if (p[j] > max) max = p[j];
        }
        double sum = 0;
        for (int j = 0; j < T; j++)
            if (attn_visible(a, b, i, j)) {
                p[j] = expf(p[j] - max);
                sum += p[j];
            }
        float inv = sum > 0 ? (float)(1.0 / sum) : 0.0f;
        memset(out, 0, (size_t)d * sizeof(float));
        for (int j = 0; j < T; j++) {
            if (p[j] == 0) continue;
            p[j] *= inv;
            const float *v = a->v + ((size_t)b * T + j) * kv_stride + (size_t)g * d;
            for (int e = 0; e < d; e++) out[e] += p[j] * v[e];
        }
    }
}

/* Each worker is compiled once per instruction set (the body inlined into
 * a function with that target) and picked by the model's gemm level. */
#define ATTN_WORKER(name, body, n_units, target)                                        \
    target static void name(lp_t_attn *a, int thread, int n_threads) {                   \
        int64_t begin, end, per = n_units;                                              \
        lp_split_range((int64_t)a->B * per, thread, n_threads, 1, &begin, &end);         \
        for (int64_t t = begin; t < end; t++) body(a, (int)(t / per), (int)(t % per));   \
    }

ATTN_WORKER(attn_forward_c, attn_forward_one, a->n_heads, )
#ifdef LP_T_X86
ATTN_WORKER(attn_forward_avx2, attn_forward_one, a->n_heads,
            __attribute__((target("avx2,fma"))))
ATTN_WORKER(attn_forward_avx512, attn_forward_one, a->n_heads,
            __attribute__((target("avx512f"))))
#endif

static void attn_forward_worker(void *arg, int thread, int n_threads) {
    lp_t_attn *a = arg;
#ifdef LP_T_X86
    if (a->level == 2) return attn_forward_avx512(a, thread, n_threads);
    if (a->level == 1) return attn_forward_avx2(a, thread, n_threads);
#endif
    attn_forward_c(a, thread, n_threads);
}

void lp_t_attention(lp_threadpool *pool, lp_t_attn *a) {
    lp_threadpool_run(pool, attn_forward_worker, a);
}

/* One (sequence b, KV group g): the heads sharing g write its dK and dV, so
 * a task owns them exclusively.
 *   dV_j += P_ij dout_i;  dP_ij = dout_i · v_j;
 *   dS_ij = P_ij (dP_ij - sum_j P_ij dP_ij);
 *   dq_i = scale sum_j dS_ij k_j;  dK_j += scale dS_ij q_i. */
static LP_T_ALWAYS_INLINE void attn_backward_one(lp_t_attn *a, int b, int g) {
    int T = a->T, d = a->head_dim, H = a->n_heads, per = H / a->n_kv_heads;
    size_t q_stride = (size_t)H * d, kv_stride = (size_t)a->n_kv_heads * d;
    float scale = 1.0f / sqrtf((float)d);
    for (int j = 0; j < T; j++) {
        memset(a->dk + ((size_t)b * T + j) * kv_stride + (size_t)g * d, 0, (size_t)d * sizeof(float));
        memset(a->dv + ((size_t)b * T + j) * kv_stride + (size_t)g * d, 0, (size_t)d * sizeof(float));
    }
    for (int h = g * per; h < (g + 1) * per; h++) {
        float *dp = a->datt + ((size_t)b * H + h) * T;
        for (int i = 0; i < T; i++) {
            size_t qi = ((size_t)b * T + i) * q_stride + (size_t)h * d;
            const float *q = a->q + qi, *dout = a->dout + qi;
            const float *p = a->att + (((size_t)b * H + h) * T + i) * T;
            float *dq = a->dq + qi;
            double sum = 0;
            for (int j = 0; j < T; j++) {
                dp[j] = 0;
                if (p[j] == 0) continue;   /* invisible (or underflowed: no gradient either) */
                const float *v = a->v + ((size_t)b * T + j) * kv_stride + (size_t)g * d;
                dp[j] = attn_dot(dout, v, d);
                sum += (double)p[j] * dp[j];
            }
            memset(dq, 0, (size_t)d * sizeof(float));
            for (int j = 0; j < T; j++) {
                if (p[j] == 0) continue;
                size_t kj = ((size_t)b * T + j) * kv_stride + (size_t)g * d;
                const float *k = a->k + kj;
                float *dk = a->dk + kj, *dv = a->dv + kj;
                float ds = p[j] * (dp[j] - (float)sum) * scale;
                for (int e = 0; e < d; e++) {
                    dq[e] += ds * k[e];
                    dk[e] += ds * q[e];
                    dv[e] += p[j] * dout[e];
                }
            }
        }
    }
}

ATTN_WORKER(attn_backward_c, attn_backward_one, a->n_kv_heads, )
#ifdef LP_T_X86
ATTN_WORKER(attn_backward_avx2, attn_backward_one, a->n_kv_heads,
            __attribute__((target("avx2,fma"))))
ATTN_WORKER(attn_backward_avx512, attn_backward_one, a->n_kv_heads,
            __attribute__((target("avx512f"))))
#endif

static void attn_backward_worker(void *arg, int thread, int n_threads) {
    lp_t_attn *a = arg;
#ifdef LP_T_X86
    if (a->level == 2) return attn_backward_avx512(a, thread, n_threads);
    if (a->level == 1) return attn_backward_avx2(a, thread, n_threads);
#endif
    attn_backward_c(a, thread, n_threads);
}

void lp_t_attention_backward(lp_threadpool *pool, lp_t_attn *a) {
    lp_threadpool_run(pool, attn_backward_worker, a);
}
