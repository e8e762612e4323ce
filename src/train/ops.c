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
 *      A is read through strides: dX = dY W and dW = dYᵀ X need no
 *      transpose (dYᵀ is dY read by columns); Y = X Wᵀ transposes W (small).
 * Within a level, every output element is summed in the same order whatever
 * tile or thread computes it, so results are bitwise independent of the
 * thread count. Different levels round differently (FMA vs mul+add); the
 * other operations (attention included) compute alike at every level. */
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
    const float *A, *B; /* A: element (r, k) at A[r * a_rs + k * a_ks]; B [K][C] */
    size_t a_rs, a_ks;
    int R, C, K;
    float alpha;
    bool accumulate;
    int level;
} gemm_nn_job;

#ifdef LP_T_X86
#include <immintrin.h>

/* AVX-512 tile: rows [r0, r0+NR) x columns [c0, c0+16*NV) (masked at the
 * right edge). NR and NV are constants at each call so the accumulators
 * stay in registers: 8 rows x 2 vectors, or 16 x 1 where C <= 16 (a LoRA
 * rank), which would leave a 2-vector tile's second half idle. A's strides
 * are the job's, so dW = dYᵀ X reads dY in place: its 8 or 16 values per k
 * are then adjacent. */
#define AVX512_MR 16
__attribute__((target("avx512f"))) static LP_T_ALWAYS_INLINE void
tile_avx512(const gemm_nn_job *j, int r0, const int NR, const int NV, int c0) {
    const int K = j->K, rem = j->C - c0;
    const size_t rs = j->a_rs, ks = j->a_ks;
    __mmask16 m0 = rem >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << rem) - 1);
    __mmask16 m1 = rem >= 32 ? (__mmask16)0xFFFF
                 : rem <= 16 ? (__mmask16)0 : (__mmask16)((1u << (rem - 16)) - 1);
    __m512 acc0[AVX512_MR], acc1[AVX512_MR]; /* acc1: NV 2, at most 8 rows */
    /* every loop over rows unrolled: GCC otherwise keeps the accumulator
     * arrays in memory and stores them on every k */
    _Pragma("GCC unroll 16") for (int i = 0; i < NR; i++) {
        acc0[i] = _mm512_setzero_ps();
        if (NV == 2) acc1[i] = _mm512_setzero_ps();
    }
    const float *a = j->A + (size_t)r0 * rs, *b = j->B + c0;
    for (int k = 0; k < K; k++, a += ks, b += j->C) {
        __m512 b0 = _mm512_maskz_loadu_ps(m0, b);
        if (NV == 2) {
            __m512 b1 = _mm512_maskz_loadu_ps(m1, b + 16);
            _Pragma("GCC unroll 16") for (int i = 0; i < NR; i++) {
                __m512 x = _mm512_set1_ps(a[(size_t)i * rs]);
                acc0[i] = _mm512_fmadd_ps(x, b0, acc0[i]);
                acc1[i] = _mm512_fmadd_ps(x, b1, acc1[i]);
            }
        } else {
            _Pragma("GCC unroll 16") for (int i = 0; i < NR; i++) acc0[i] = _mm512_fmadd_ps(_mm512_set1_ps(a[(size_t)i * rs]), b0, acc0[i]);
        }
    }
    __m512 alpha = _mm512_set1_ps(j->alpha);
    _Pragma("GCC unroll 16") for (int i = 0; i < NR; i++) {
        float *y = j->Y + (size_t)(r0 + i) * j->C + c0;
        __m512 y0 = _mm512_mul_ps(alpha, acc0[i]);
        if (j->accumulate) y0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, y), y0);
        _mm512_mask_storeu_ps(y, m0, y0);
        if (NV == 2) {
            __m512 y1 = _mm512_mul_ps(alpha, acc1[i]);
            if (j->accumulate) y1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, y + 16), y1);
            _mm512_mask_storeu_ps(y + 16, m1, y1);
        }
    }
}

#define CASE_AVX512(N, NV) \
    case N: tile_avx512(j, r0, N, NV, c0); break
__attribute__((target("avx512f"))) static void tile_avx512_any(const gemm_nn_job *j, int r0,
                                                               int nr, int c0) {
    if (j->C > 16) {
        switch (nr) {
            CASE_AVX512(8, 2); CASE_AVX512(7, 2); CASE_AVX512(6, 2); CASE_AVX512(5, 2);
            CASE_AVX512(4, 2); CASE_AVX512(3, 2); CASE_AVX512(2, 2);
        default: tile_avx512(j, r0, 1, 2, c0); break;
        }
        return;
    }
    switch (nr) {
        CASE_AVX512(16, 1); CASE_AVX512(15, 1); CASE_AVX512(14, 1); CASE_AVX512(13, 1);
        CASE_AVX512(12, 1); CASE_AVX512(11, 1); CASE_AVX512(10, 1); CASE_AVX512(9, 1);
        CASE_AVX512(8, 1); CASE_AVX512(7, 1); CASE_AVX512(6, 1); CASE_AVX512(5, 1);
        CASE_AVX512(4, 1); CASE_AVX512(3, 1); CASE_AVX512(2, 1);
    default: tile_avx512(j, r0, 1, 1, c0); break;
    }
}
#undef CASE_AVX512

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
    _Pragma("GCC unroll 4") for (int i = 0; i < NR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    const float *a = j->A + (size_t)r0 * j->a_rs;
    const size_t rs = j->a_rs, ks = j->a_ks;
    for (int k = 0; k < j->K; k++, a += ks) {
        const float *b = j->B + (size_t)k * j->C + c0;
        __m256 b0 = _mm256_maskload_ps(b, m0), b1 = _mm256_maskload_ps(b + 8, m1);
        _Pragma("GCC unroll 4") for (int i = 0; i < NR; i++) {
            __m256 x = _mm256_broadcast_ss(a + (size_t)i * rs);
            acc[i][0] = _mm256_fmadd_ps(x, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(x, b1, acc[i][1]);
        }
    }
    __m256 alpha = _mm256_set1_ps(j->alpha);
    _Pragma("GCC unroll 4") for (int i = 0; i < NR; i++) {
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

/* How many column tiles share one pass over the row blocks: as many as keep
 * their part of B (K x that many columns) within this many bytes, so it
 * stays in L2 while every row block of A goes by, and each row block's A
 * stays in L1 across them. Row-block major over all of C re-read the whole
 * of B per row block (the 4096-token output matrix is 2 MB). */
#define B_BLOCK_BYTES (256 * 1024)

/* Tasks are (column block, row block, column tile) triples in that order;
 * each thread takes a contiguous range of them. */
static void gemm_nn_worker(void *arg, int thread, int n_threads) {
    const gemm_nn_job *j = arg;
    bool wide = j->C > 16;
    int mr = j->level == 2 ? (wide ? 8 : 16) : AVX2_MR, nc = j->level == 2 && wide ? 32 : 16;
    int64_t row_blocks = (j->R + mr - 1) / mr, col_tiles = (j->C + nc - 1) / nc, begin, end;
    int64_t per_block = B_BLOCK_BYTES / ((int64_t)j->K * nc * (int64_t)sizeof(float));
    if (per_block < 1) per_block = 1;
    if (per_block > col_tiles) per_block = col_tiles;
    lp_split_range(row_blocks * col_tiles, thread, n_threads, 1, &begin, &end);
    for (int64_t t = begin; t < end; t++) {
        /* every column block but the last is per_block tiles wide */
        int64_t block = t / (row_blocks * per_block), in_block = t % (row_blocks * per_block);
        int64_t first = block * per_block;
        int64_t width = col_tiles - first < per_block ? col_tiles - first : per_block;
        int r0 = (int)(in_block / width) * mr, c0 = (int)(first + in_block % width) * nc;
        int nr = j->R - r0 < mr ? j->R - r0 : mr;
        if (j->level == 2) tile_avx512_any(j, r0, nr, c0);
        else tile_avx2_any(j, r0, nr, c0);
    }
}
#endif

/* Level > 0 only (callers check): Y (+)= alpha A B, A's element (r, k) at
 * A[r * a_rs + k * a_ks]. */
static void gemm_nn(lp_threadpool *pool, int level, float *Y, const float *A, size_t a_rs,
                    size_t a_ks, const float *B, int R, int C, int K, float alpha,
                    bool accumulate) {
#ifdef LP_T_X86
    gemm_nn_job j = {.Y = Y, .A = A, .B = B, .a_rs = a_rs, .a_ks = a_ks, .R = R, .C = C,
                     .K = K, .alpha = alpha, .accumulate = accumulate, .level = level};
    if ((int64_t)R * C * K < (1 << 16)) pool = NULL;
    lp_threadpool_run(pool, gemm_nn_worker, &j);
#else
    (void)pool, (void)level, (void)Y, (void)A, (void)a_rs, (void)a_ks, (void)B, (void)R;
    (void)C, (void)K, (void)alpha, (void)accumulate;
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
    gemm_nn(pool, level, Y, X, (size_t)in, 1, scratch, N, out, in, alpha, accumulate);
}

void lp_t_matmul_dx(lp_threadpool *pool, int level, float *dX, const float *dY,
                    const float *W, int N, int in, int out, float alpha, bool accumulate,
                    float *scratch) {
    if (level > 0) {
        gemm_nn(pool, level, dX, dY, (size_t)out, 1, W, N, in, out, alpha, accumulate);
        return;
    }
    transpose(scratch, W, out, in);                 /* Wᵀ: [in][out] */
    lp_t_gemm_nt(pool, dX, dY, scratch, N, in, out, alpha, accumulate);
}

void lp_t_matmul_dw(lp_threadpool *pool, int level, float *dW, const float *dY,
                    const float *X, int N, int in, int out, float alpha, float *scratch) {
    if (level > 0) { /* dYᵀ read in place: element (o, n) at dY[n * out + o] */
        gemm_nn(pool, level, dW, dY, 1, (size_t)out, X, out, in, N, alpha, true);
        return;
    }
    float *dYt = scratch, *Xt = scratch + (size_t)N * out;
    transpose(dYt, dY, N, out);                     /* [out][N] */
    transpose(Xt, X, N, in);                        /* [in][N] */
    lp_t_gemm_nt(pool, dW, dYt, Xt, out, in, N, alpha, true);
}

/* ---- element- and row-wise operations, threaded -------------------------------
 * Each output element is computed by one thread with the same operations
 * as by any other, so results do not depend on the thread count. */

typedef struct range_job {
    lp_t_range_fn fn;
    void *ctx;
    int64_t n, align;
} range_job;

static void range_worker(void *arg, int thread, int n_threads) {
    const range_job *j = arg;
    int64_t begin, end;
    lp_split_range(j->n, thread, n_threads, j->align, &begin, &end);
    if (begin < end) j->fn(j->ctx, begin, end);
}

void lp_t_parallel_for(lp_threadpool *pool, int64_t n, int64_t cost_per, lp_t_range_fn fn, void *ctx) {
    range_job j = {.fn = fn, .ctx = ctx, .n = n, .align = 16};
    if (n * cost_per < (1 << 15)) pool = NULL;
    lp_threadpool_run(pool, range_worker, &j);
}

/* ---- RMSNorm ------------------------------------------------------------------- */

typedef struct rms_job {
    float *y, *rstd, *dx, *dw;
    const float *x, *w, *dy, *rstd_in;
    int n;
    float eps;
    bool accumulate;
} rms_job;

static void rmsnorm_rows(void *arg, int64_t r0, int64_t r1) {
    const rms_job *j = arg;
    int n = j->n;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = j->x + (size_t)r * n;
        /* the runtime's formula (lp_rmsnorm), so exported models agree */
        double ss = lp_sum_squares(xr, n);
        float s = 1.0f / sqrtf((float)(ss / (double)n) + j->eps);
        j->rstd[r] = s;
        for (int i = 0; i < n; i++) j->y[(size_t)r * n + i] = xr[i] * s * j->w[i];
    }
}

void lp_t_rmsnorm(lp_threadpool *pool, float *y, float *rstd, const float *x, const float *w, int N,
                  int n, float eps) {
    rms_job j = {.y = y, .rstd = rstd, .x = x, .w = w, .n = n, .eps = eps};
    lp_t_parallel_for(pool, N, 2 * n, rmsnorm_rows, &j);
}

/* y = x s w with s = (mean(x²) + eps)^(-1/2):
 *   dw_i += dy_i x_i s
 *   dx_i  = s w_i dy_i - x_i s³/n sum_j(dy_j w_j x_j) */
static void rmsnorm_backward_rows(void *arg, int64_t r0, int64_t r1) {
    const rms_job *j = arg;
    int n = j->n;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = j->x + (size_t)r * n, *dyr = j->dy + (size_t)r * n;
        float *dxr = j->dx + (size_t)r * n;
        float s = j->rstd_in[r];
        double dot = 0;
        for (int i = 0; i < n; i++) dot += (double)dyr[i] * j->w[i] * xr[i];
        float c = (float)(dot * (double)s * s * s / n);
        for (int i = 0; i < n; i++) {
            float v = s * j->w[i] * dyr[i] - xr[i] * c;
            dxr[i] = j->accumulate ? dxr[i] + v : v;
        }
    }
}

/* dw summed over the rows in row order, threaded over its columns. */
typedef struct rms_dw_job {
    const rms_job *j;
    int N;
} rms_dw_job;

static void rmsnorm_dw_columns(void *arg, int64_t i0, int64_t i1) {
    const rms_dw_job *d = arg;
    const rms_job *j = d->j;
    for (int r = 0; r < d->N; r++) {
        const float *xr = j->x + (size_t)r * j->n, *dyr = j->dy + (size_t)r * j->n;
        float s = j->rstd_in[r];
        for (int64_t i = i0; i < i1; i++) j->dw[i] += dyr[i] * xr[i] * s;
    }
}

void lp_t_rmsnorm_backward(lp_threadpool *pool, float *dx, float *dw, const float *dy, const float *x,
                           const float *w, const float *rstd, int N, int n, bool accumulate) {
    rms_job j = {.dx = dx, .dw = dw, .dy = dy, .x = x, .w = w, .rstd_in = rstd, .n = n,
                 .accumulate = accumulate};
    lp_t_parallel_for(pool, N, 4 * n, rmsnorm_backward_rows, &j);
    if (!dw) return;
    rms_dw_job d = {.j = &j, .N = N};
    lp_t_parallel_for(pool, n, 2 * N, rmsnorm_dw_columns, &d);
}

/* ---- RoPE -------------------------------------------------------------------- */

typedef struct rope_job {
    float *x;
    const float *cos, *sin;
    int n_heads, head_dim;
    float sign;
} rope_job;

static void rope_rows(void *arg, int64_t r0, int64_t r1) {
    const rope_job *j = arg;
    int half = j->head_dim / 2;
    for (int64_t r = r0; r < r1; r++) {
        const float *c = j->cos + (size_t)r * half, *s = j->sin + (size_t)r * half;
        for (int h = 0; h < j->n_heads; h++) {
            float *v = j->x + ((size_t)r * j->n_heads + h) * j->head_dim;
            for (int i = 0; i < half; i++) {
                float x0 = v[2 * i], x1 = v[2 * i + 1], si = j->sign * s[i];
                v[2 * i] = x0 * c[i] - x1 * si;
                v[2 * i + 1] = x0 * si + x1 * c[i];
            }
        }
    }
}

void lp_t_rope(lp_threadpool *pool, float *x, const float *cos, const float *sin, int N, int n_heads,
               int head_dim, float sign) {
    rope_job j = {.x = x, .cos = cos, .sin = sin, .n_heads = n_heads, .head_dim = head_dim, .sign = sign};
    lp_t_parallel_for(pool, N, 3 * n_heads * head_dim, rope_rows, &j);
}

/* ---- SwiGLU ------------------------------------------------------------------ */

typedef struct swiglu_job {
    float *h, *dgate, *dup;
    const float *gate, *up, *dh;
} swiglu_job;

static void swiglu_range(void *arg, int64_t i0, int64_t i1) {
    const swiglu_job *j = arg;
    for (int64_t i = i0; i < i1; i++) {
        float g = j->gate[i];
        j->h[i] = g / (1.0f + expf(-g)) * j->up[i];
    }
}

void lp_t_swiglu(lp_threadpool *pool, float *h, const float *gate, const float *up, int64_t n) {
    swiglu_job j = {.h = h, .gate = gate, .up = up};
    lp_t_parallel_for(pool, n, 16, swiglu_range, &j);
}

/* h = silu(g) u, silu'(g) = σ(g) (1 + g (1 - σ(g))). */
static void swiglu_backward_range(void *arg, int64_t i0, int64_t i1) {
    const swiglu_job *j = arg;
    for (int64_t i = i0; i < i1; i++) {
        float g = j->gate[i], sg = 1.0f / (1.0f + expf(-g));
        j->dup[i] = j->dh[i] * g * sg;
        j->dgate[i] = j->dh[i] * j->up[i] * sg * (1.0f + g * (1.0f - sg));
    }
}

void lp_t_swiglu_backward(lp_threadpool *pool, float *dgate, float *dup, const float *dh,
                          const float *gate, const float *up, int64_t n) {
    swiglu_job j = {.dgate = dgate, .dup = dup, .dh = dh, .gate = gate, .up = up};
    lp_t_parallel_for(pool, n, 16, swiglu_backward_range, &j);
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

/* p[j] = exp(p[j] - max) for the keys row i of sequence b sees; returns 1 /
 * their sum (0 if it sees none). */
static LP_T_ALWAYS_INLINE float attn_exp_row(const lp_t_attn *a, int b, int i, float *p, float max) {
    double sum = 0;
    for (int j = 0; j < a->T; j++)
        if (attn_visible(a, b, i, j)) {
            p[j] = expf(p[j] - max);
            sum += p[j];
        }
    return sum > 0 ? (float)(1.0 / sum) : 0.0f;
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
        float inv = attn_exp_row(a, b, i, p, max);
        memset(out, 0, (size_t)d * sizeof(float));
        for (int j = 0; j < T; j++) {
            if (p[j] == 0) continue;
            p[j] *= inv;
            const float *v = a->v + ((size_t)b * T + j) * kv_stride + (size_t)g * d;
            for (int e = 0; e < d; e++) out[e] += p[j] * v[e];
        }
    }
}

#ifdef LP_T_X86
/* ---- AVX-512 attention: 16 keys per vector ------------------------------------
 * The same sums as attn_dot and the loops above, element for element (no
 * fused multiply-adds: C11 mode keeps mul and add apart everywhere), so the
 * results are those of every other level, bit for bit; only the lanes
 * differ: a vector holds one row's scores against 16 keys, from a copy of
 * those keys transposed to [d][16], instead of one dot product's partial
 * sums that then need a horizontal reduction per key. */
#define ATTN_JB 16
#define ATTN_FAST_MAX_DIM 128

static bool attn_fast(const lp_t_attn *a) {
    return a->level == 2 && a->head_dim % 16 == 0 && a->head_dim <= ATTN_FAST_MAX_DIM;
}

/* kt[e][0..15] = x[j0 + jj][e] for jj < nj (zeros beyond). */
static LP_T_ALWAYS_INLINE void attn_transpose_block(float *kt, const float *x, size_t stride,
                                                    int j0, int nj, int d) {
    for (int jj = 0; jj < ATTN_JB; jj++)
        for (int e = 0; e < d; e++) kt[e * ATTN_JB + jj] = jj < nj ? x[(size_t)(j0 + jj) * stride + e] : 0.0f;
}

/* Whether row i of sequence b sees any of keys j0..j0+nj-1 (always true
 * for causal rows from j0 on). */
static LP_T_ALWAYS_INLINE bool attn_row_sees(const lp_t_attn *a, int b, int i, int j0, int nj) {
    if (!a->visible) return true;
    const uint8_t *v = a->visible + ((size_t)b * a->T + i) * a->T + j0;
    uint64_t w[2] = {0, 0};
    memcpy(w, v, (size_t)nj);
    return (w[0] | w[1]) != 0;
}

/* s[i * s_stride + j0 ..] = scale * (x_i · k_j) for the rows i in [i0, T)
 * that see any of the nj keys of kt, summed as attn_dot sums. */
__attribute__((target("avx512f"))) static LP_T_ALWAYS_INLINE void
attn_block_dots(const lp_t_attn *a, int b, float *s, size_t s_stride, const float *x, size_t x_stride,
                const float *kt, int d, int i0, int T, int j0, int nj, float scale) {
    __mmask16 m = (__mmask16)((1u << nj) - 1);
    for (int i = i0; i < T; i++) {
        if (!attn_row_sees(a, b, i, j0, nj)) continue;
        const float *xi = x + (size_t)i * x_stride;
        __m512 acc[8];
        for (int l = 0; l < 8; l++) acc[l] = _mm512_setzero_ps();
        for (int e = 0; e < d; e += 8)
            for (int l = 0; l < 8; l++)
                acc[l] = _mm512_add_ps(acc[l], _mm512_mul_ps(_mm512_set1_ps(xi[e + l]),
                                                             _mm512_loadu_ps(kt + (e + l) * ATTN_JB)));
        __m512 t = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])),
                                 _mm512_add_ps(_mm512_add_ps(acc[4], acc[5]), _mm512_add_ps(acc[6], acc[7])));
        t = _mm512_mul_ps(t, _mm512_set1_ps(scale)); /* x 1 (dP) is exact */
        _mm512_mask_storeu_ps(s + (size_t)i * s_stride + j0, m, t);
    }
}

/* S (row stride T) = scale * X Kᵀ for one (sequence b, head): the rows
 * that see a block of keys (from the block's first key on when causal).
 * Entries no row sees are left as they are. */
__attribute__((target("avx512f"))) static void attn_all_dots(const lp_t_attn *a, int b, float *S, const float *x,
                                                             size_t x_stride, const float *keys,
                                                             size_t k_stride, float scale) {
    float kt[ATTN_FAST_MAX_DIM * ATTN_JB];
    int T = a->T, d = a->head_dim;
    for (int j0 = 0; j0 < T; j0 += ATTN_JB) {
        int nj = T - j0 < ATTN_JB ? T - j0 : ATTN_JB;
        attn_transpose_block(kt, keys, k_stride, j0, nj, d);
        attn_block_dots(a, b, S, (size_t)T, x, x_stride, kt, d, a->visible ? 0 : j0, T, j0, nj, scale);
    }
}

/* out = sum over j with p[j] != 0 of p[j] v_j, in j order, out kept in NV
 * registers (a sum through memory waits on each store). */
__attribute__((target("avx512f"))) static LP_T_ALWAYS_INLINE void
attn_weighted_sum_nv(float *out, const float *p, const float *v, size_t stride, int T, const int NV) {
    __m512 acc[ATTN_FAST_MAX_DIM / 16];
    for (int e = 0; e < NV; e++) acc[e] = _mm512_setzero_ps();
    for (int j = 0; j < T; j++) {
        if (p[j] == 0) continue;
        __m512 pj = _mm512_set1_ps(p[j]);
        for (int e = 0; e < NV; e++)
            acc[e] = _mm512_add_ps(acc[e], _mm512_mul_ps(pj, _mm512_loadu_ps(v + (size_t)j * stride + 16 * e)));
    }
    for (int e = 0; e < NV; e++) _mm512_storeu_ps(out + 16 * e, acc[e]);
}

__attribute__((target("avx512f"))) static void attn_weighted_sum(float *out, const float *p, const float *v,
                                                                 size_t stride, int T, int d) {
    switch (d / 16) {
    case 1: attn_weighted_sum_nv(out, p, v, stride, T, 1); break;
    case 2: attn_weighted_sum_nv(out, p, v, stride, T, 2); break;
    case 3: attn_weighted_sum_nv(out, p, v, stride, T, 3); break;
    case 4: attn_weighted_sum_nv(out, p, v, stride, T, 4); break;
    case 5: attn_weighted_sum_nv(out, p, v, stride, T, 5); break;
    case 6: attn_weighted_sum_nv(out, p, v, stride, T, 6); break;
    case 7: attn_weighted_sum_nv(out, p, v, stride, T, 7); break;
    default: attn_weighted_sum_nv(out, p, v, stride, T, 8); break;
    }
}

__attribute__((target("avx512f"))) static void attn_forward_fast(lp_t_attn *a, int b, int h) {
    int T = a->T, d = a->head_dim, H = a->n_heads, g = h / (H / a->n_kv_heads);
    size_t q_stride = (size_t)H * d, kv_stride = (size_t)a->n_kv_heads * d;
    float scale = 1.0f / sqrtf((float)d);
    const float *q0 = a->q + (size_t)b * T * q_stride + (size_t)h * d;
    const float *k0 = a->k + (size_t)b * T * kv_stride + (size_t)g * d;
    const float *v0 = a->v + (size_t)b * T * kv_stride + (size_t)g * d;
    float *P = a->att + ((size_t)b * H + h) * T * T;
    attn_all_dots(a, b, P, q0, q_stride, k0, kv_stride, scale);
    for (int i = 0; i < T; i++) {
        float *p = P + (size_t)i * T;
        float *out = a->out + ((size_t)b * T + i) * q_stride + (size_t)h * d;
        float max = -INFINITY;
        for (int j = 0; j < T; j++) {
            if (!attn_visible(a, b, i, j)) p[j] = 0;
            else if (p[j] > max) max = p[j];
        }
        float inv = attn_exp_row(a, b, i, p, max);
        for (int j = 0; j < T; j++) p[j] *= inv; /* 0 stays 0 */
        attn_weighted_sum(out, p, v0, kv_stride, T, d);
    }
}

/* One row i of one head: dq_i = sum_j ds_ij k_j (in registers),
 * dk_j += ds_ij q_i, dv_j += p_ij dout_i, over the keys with p_ij != 0 in
 * j order, ds_ij = p_ij (dp_ij - sum) scale. */
__attribute__((target("avx512f"))) static LP_T_ALWAYS_INLINE void
attn_row_backward_nv(float *dq, float *dk, float *dv, const float *k, size_t stride, const float *q,
                     const float *dout, const float *p, const float *dp, float sum, float scale, int T,
                     const int NV) {
    __m512 acc[ATTN_FAST_MAX_DIM / 16], qv[ATTN_FAST_MAX_DIM / 16], dov[ATTN_FAST_MAX_DIM / 16];
    for (int e = 0; e < NV; e++) {
        acc[e] = _mm512_setzero_ps();
        qv[e] = _mm512_loadu_ps(q + 16 * e);
        dov[e] = _mm512_loadu_ps(dout + 16 * e);
    }
    for (int j = 0; j < T; j++) {
        if (p[j] == 0) continue;
        __m512 ds = _mm512_set1_ps(p[j] * (dp[j] - sum) * scale), pj = _mm512_set1_ps(p[j]);
        const float *kj = k + (size_t)j * stride;
        float *dkj = dk + (size_t)j * stride, *dvj = dv + (size_t)j * stride;
        for (int e = 0; e < NV; e++) {
            acc[e] = _mm512_add_ps(acc[e], _mm512_mul_ps(ds, _mm512_loadu_ps(kj + 16 * e)));
            _mm512_storeu_ps(dkj + 16 * e, _mm512_add_ps(_mm512_loadu_ps(dkj + 16 * e), _mm512_mul_ps(ds, qv[e])));
            _mm512_storeu_ps(dvj + 16 * e, _mm512_add_ps(_mm512_loadu_ps(dvj + 16 * e), _mm512_mul_ps(pj, dov[e])));
        }
    }
    for (int e = 0; e < NV; e++) _mm512_storeu_ps(dq + 16 * e, acc[e]);
}

#define ATTN_ROW_BACKWARD(NV) \
    attn_row_backward_nv(dq, dk, dv, k, stride, q, dout, p, dp, sum, scale, T, NV)
__attribute__((target("avx512f"))) static void attn_row_backward(float *dq, float *dk, float *dv, const float *k,
                                                                 size_t stride, const float *q, const float *dout,
                                                                 const float *p, const float *dp, float sum,
                                                                 float scale, int T, int d) {
    switch (d / 16) {
    case 1: ATTN_ROW_BACKWARD(1); break;
    case 2: ATTN_ROW_BACKWARD(2); break;
    case 3: ATTN_ROW_BACKWARD(3); break;
    case 4: ATTN_ROW_BACKWARD(4); break;
    case 5: ATTN_ROW_BACKWARD(5); break;
    case 6: ATTN_ROW_BACKWARD(6); break;
    case 7: ATTN_ROW_BACKWARD(7); break;
    default: ATTN_ROW_BACKWARD(8); break;
    }
}
#undef ATTN_ROW_BACKWARD

/* As attn_backward_one; dP of each head first, all rows at once, into the
 * head's T x T slice of datt. */
__attribute__((target("avx512f"))) static void attn_backward_fast(lp_t_attn *a, int b, int g) {
    int T = a->T, d = a->head_dim, H = a->n_heads, per = H / a->n_kv_heads;
    size_t q_stride = (size_t)H * d, kv_stride = (size_t)a->n_kv_heads * d;
    float scale = 1.0f / sqrtf((float)d);
    const float *v0 = a->v + (size_t)b * T * kv_stride + (size_t)g * d;
    for (int j = 0; j < T; j++) {
        memset(a->dk + ((size_t)b * T + j) * kv_stride + (size_t)g * d, 0, (size_t)d * sizeof(float));
        memset(a->dv + ((size_t)b * T + j) * kv_stride + (size_t)g * d, 0, (size_t)d * sizeof(float));
    }
    for (int h = g * per; h < (g + 1) * per; h++) {
        float *DP = a->datt + ((size_t)b * H + h) * T * T;
        attn_all_dots(a, b, DP, a->dout + (size_t)b * T * q_stride + (size_t)h * d, q_stride, v0, kv_stride, 1.0f);
        for (int i = 0; i < T; i++) {
            size_t qi = ((size_t)b * T + i) * q_stride + (size_t)h * d;
            const float *q = a->q + qi, *dout = a->dout + qi;
            const float *p = a->att + (((size_t)b * H + h) * T + i) * T;
            float *dq = a->dq + qi, *dp = DP + (size_t)i * T;
            double sum = 0;
            for (int j = 0; j < T; j++)
                if (p[j] != 0) sum += (double)p[j] * dp[j];
            size_t k0 = (size_t)b * T * kv_stride + (size_t)g * d;
            attn_row_backward(dq, a->dk + k0, a->dv + k0, a->k + k0, kv_stride, q, dout, p, dp,
                              (float)sum, scale, T, d);
        }
    }
}
#endif

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
ATTN_WORKER(attn_forward_fast_worker, attn_forward_fast, a->n_heads, )
#endif

static void attn_forward_worker(void *arg, int thread, int n_threads) {
    lp_t_attn *a = arg;
#ifdef LP_T_X86
    if (attn_fast(a)) return attn_forward_fast_worker(a, thread, n_threads);
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
ATTN_WORKER(attn_backward_fast_worker, attn_backward_fast, a->n_kv_heads, )
#endif

static void attn_backward_worker(void *arg, int thread, int n_threads) {
    lp_t_attn *a = arg;
#ifdef LP_T_X86
    if (attn_fast(a)) return attn_backward_fast_worker(a, thread, n_threads);
    if (a->level == 2) return attn_backward_avx512(a, thread, n_threads);
    if (a->level == 1) return attn_backward_avx2(a, thread, n_threads);
#endif
    attn_backward_c(a, thread, n_threads);
}

void lp_t_attention_backward(lp_threadpool *pool, lp_t_attn *a) {
    lp_threadpool_run(pool, attn_backward_worker, a);
}
