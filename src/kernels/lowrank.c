/* The two passes of a runtime low-rank adapter (image_ops.h). Both are
 * outer products: each output element is one fmaf chain over the reduced
 * dimension in a fixed order, and a vector lane is just another output
 * element, so the AVX-512 and AVX2 paths give the reference's bits and a batch row
 * gets the same bits wherever it sits. A rank is far too short a reduction
 * for lp_matmul's dot-product tiles, whose horizontal sums would cost more
 * than the products. */
#include "image_ops.h"

#include <math.h>
#include <string.h>

/* ---- shapes ------------------------------------------------------------------- */

/* Output pixel q's input pixel under tap (ky, kx), or NULL outside the
 * input, where the input is zero. */
static const float *tap_source(const lp_conv2d_shape *s, const float *x, int64_t q, int32_t ky, int32_t kx) {
    int64_t ow = lp_conv2d_out_w(s), opx = (int64_t)lp_conv2d_out_h(s) * ow;
    int64_t img = q / opx, oy = (q % opx) / ow, ox = q % ow;
    int64_t iy = oy * s->stride + ky - s->pad, ix = ox * s->stride + kx - s->pad;
    if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w) return NULL;
    return x + ((img * s->h + iy) * s->w + ix) * s->cin;
}

/* ---- reference ---------------------------------------------------------------- */

#define REF_CHUNK 64

static void down_ref(const lp_conv2d_shape *s, const float *dt, int32_t r, float scale, const float *x, float *t,
                     int64_t q0, int64_t q1) {
    float acc[REF_CHUNK];
    for (int64_t q = q0; q < q1; q++)
        for (int32_t j0 = 0; j0 < r; j0 += REF_CHUNK) {
            int32_t nj = r - j0 < REF_CHUNK ? r - j0 : REF_CHUNK;
            memset(acc, 0, sizeof acc);
            for (int32_t ky = 0; ky < s->kh; ky++)
                for (int32_t kx = 0; kx < s->kw; kx++) {
                    const float *src = tap_source(s, x, q, ky, kx);
                    const float *w = dt + (int64_t)(ky * s->kw + kx) * s->cin * r + j0;
                    for (int32_t c = 0; c < s->cin; c++, w += r) {
                        float xc = src ? src[c] : 0.0f;
                        for (int32_t j = 0; j < nj; j++) acc[j] = fmaf(xc, w[j], acc[j]);
                    }
                }
            for (int32_t j = 0; j < nj; j++) t[q * r + j0 + j] = acc[j] * scale;
        }
}

static void up_ref(int64_t i0, int64_t i1, int32_t r, const float *t, const float *ut, int64_t out, float *y,
                   int64_t y_stride) {
    for (int64_t i = i0; i < i1; i++)
        for (int32_t j = 0; j < r; j++) {
            float tj = t[i * r + j];
            const float *u = ut + (int64_t)j * out;
            float *yi = y + i * y_stride;
            for (int64_t o = 0; o < out; o++) yi[o] = fmaf(tj, u[o], yi[o]);
        }
}

/* ---- AVX-512 ------------------------------------------------------------------ */

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

#define INLINE static inline __attribute__((always_inline))

/* A tap outside the input reads these (inputs of up to this many channels
 * take the SIMD paths when the shape is padded). */
#define ZERO_ROW 4096
static const float zero_row[ZERO_ROW];

/* The rows n pixels of a SIMD shrink block read under tap (ky, kx): pixel
 * q + p's, zero_row outside the input, pixel q's again past np (results
 * dropped), so the block's loops have constant trip counts. */
INLINE void block_sources(const lp_conv2d_shape *s, const float *x, int64_t q, int np, int32_t ky, int32_t kx, int n,
                          const float **src) {
    for (int p = 0; p < n; p++) {
        src[p] = tap_source(s, x, q + (p < np ? p : 0), ky, kx);
        if (!src[p]) src[p] = zero_row;
    }
}
#define DOWN_PX 8 /* output pixels per block: 8 x 2 accumulators */
#define UP_ROWS 4 /* rows per block: 4 x 4 accumulators over 64 outputs */
#define UP_TILE 16

static __mmask16 lanes(int64_t n) { return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }

/* Pixels [q, q + np) (np <= DOWN_PX), rank columns [j0, j0 + 32). Every
 * pixel of the block reads a row each tap (a tap outside the input reads
 * zero_row, a pixel past np repeats pixel q's rows), so the loops have
 * constant trip counts and the accumulators stay in registers. */
AVX512 INLINE void down_block(const lp_conv2d_shape *s, const float *dt, int32_t r, int32_t j0, float scale,
                              const float *x, float *t, int64_t q, int np) {
    __mmask16 m0 = lanes(r - j0), m1 = lanes(r - j0 - 16);
    __m512 acc[DOWN_PX][2];
    for (int p = 0; p < DOWN_PX; p++) acc[p][0] = acc[p][1] = _mm512_setzero_ps();
    for (int32_t ky = 0; ky < s->kh; ky++)
        for (int32_t kx = 0; kx < s->kw; kx++) {
            const float *src[DOWN_PX];
            block_sources(s, x, q, np, ky, kx, DOWN_PX, src);
            const float *w = dt + (int64_t)(ky * s->kw + kx) * s->cin * r + j0;
            for (int32_t c = 0; c < s->cin; c++, w += r) {
                __m512 w0 = _mm512_maskz_loadu_ps(m0, w), w1 = _mm512_maskz_loadu_ps(m1, w + 16);
                for (int p = 0; p < DOWN_PX; p++) {
                    __m512 b = _mm512_set1_ps(src[p][c]);
                    acc[p][0] = _mm512_fmadd_ps(b, w0, acc[p][0]);
                    acc[p][1] = _mm512_fmadd_ps(b, w1, acc[p][1]);
                }
            }
        }
    __m512 sc = _mm512_set1_ps(scale);
    for (int p = 0; p < DOWN_PX; p++)
        if (p < np) {
            float *dst = t + (q + p) * r + j0;
            _mm512_mask_storeu_ps(dst, m0, _mm512_mul_ps(acc[p][0], sc));
            _mm512_mask_storeu_ps(dst + 16, m1, _mm512_mul_ps(acc[p][1], sc));
        }
}

AVX512 static void down_avx512(const lp_conv2d_shape *s, const float *dt, int32_t r, float scale, const float *x,
                               float *t, int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; q += DOWN_PX) {
        int np = (int)(q1 - q < DOWN_PX ? q1 - q : DOWN_PX);
        for (int32_t j0 = 0; j0 < r; j0 += 32) down_block(s, dt, r, j0, scale, x, t, q, np);
    }
}

/* Rows [i, i + nr) (nr <= UP_ROWS), outputs [o0, o0 + 64). */
AVX512 INLINE void up_block(int64_t i, int nr, int32_t r, const float *t, const float *ut, int64_t out, int64_t o0,
                            float *y, int64_t y_stride) {
    __mmask16 m[4];
    for (int v = 0; v < 4; v++) m[v] = lanes(out - o0 - 16 * v);
    __m512 acc[UP_ROWS][4];
    for (int a = 0; a < nr; a++)
        for (int v = 0; v < 4; v++) acc[a][v] = _mm512_maskz_loadu_ps(m[v], y + (i + a) * y_stride + o0 + 16 * v);
    for (int32_t j = 0; j < r; j++) {
        const float *u = ut + (int64_t)j * out + o0;
        __m512 w[4];
        for (int v = 0; v < 4; v++) w[v] = _mm512_maskz_loadu_ps(m[v], u + 16 * v);
        for (int a = 0; a < nr; a++) {
            __m512 b = _mm512_set1_ps(t[(i + a) * r + j]);
            for (int v = 0; v < 4; v++) acc[a][v] = _mm512_fmadd_ps(b, w[v], acc[a][v]);
        }
    }
    for (int a = 0; a < nr; a++)
        for (int v = 0; v < 4; v++) _mm512_mask_storeu_ps(y + (i + a) * y_stride + o0 + 16 * v, m[v], acc[a][v]);
}

/* Tiles of UP_TILE rows: y's rows stream in order while each 64-output
 * slice of ut is reused from L1 by the tile's row blocks. */
AVX512 static void up_avx512(int64_t i0, int64_t i1, int32_t r, const float *t, const float *ut, int64_t out, float *y,
                             int64_t y_stride) {
    for (int64_t it = i0; it < i1; it += UP_TILE) {
        int64_t ie = i1 - it < UP_TILE ? i1 : it + UP_TILE;
        for (int64_t o0 = 0; o0 < out; o0 += 64)
            for (int64_t i = it; i < ie; i += UP_ROWS) {
                if (ie - i >= UP_ROWS) up_block(i, UP_ROWS, r, t, ut, out, o0, y, y_stride);
                else if (ie - i == 3) up_block(i, 3, r, t, ut, out, o0, y, y_stride);
                else if (ie - i == 2) up_block(i, 2, r, t, ut, out, o0, y, y_stride);
                else up_block(i, 1, r, t, ut, out, o0, y, y_stride);
            }
    }
}
/* ---- AVX2 (16 registers: 4 pixels x 16 rank columns, 4 rows x 16 outputs) ------ */

#define AVX2 __attribute__((target("avx2,fma")))
#define DOWN2_PX 4
#define UP2_ROWS 4

AVX2 static inline __m256i lanes8(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 0 ? 0 : n > 8 ? 8 : n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Pixels [q, q + np) (np <= DOWN2_PX), rank columns [j0, j0 + 16); as down_block */
AVX2 INLINE void down_block2(const lp_conv2d_shape *s, const float *dt, int32_t r, int32_t j0, float scale,
                             const float *x, float *t, int64_t q, int np) {
    __m256i m0 = lanes8(r - j0), m1 = lanes8(r - j0 - 8);
    __m256 acc[DOWN2_PX][2];
    for (int p = 0; p < DOWN2_PX; p++) acc[p][0] = acc[p][1] = _mm256_setzero_ps();
    for (int32_t ky = 0; ky < s->kh; ky++)
        for (int32_t kx = 0; kx < s->kw; kx++) {
            const float *src[DOWN2_PX];
            block_sources(s, x, q, np, ky, kx, DOWN2_PX, src);
            const float *w = dt + (int64_t)(ky * s->kw + kx) * s->cin * r + j0;
            for (int32_t c = 0; c < s->cin; c++, w += r) {
                __m256 w0 = _mm256_maskload_ps(w, m0), w1 = _mm256_maskload_ps(w + 8, m1);
                for (int p = 0; p < DOWN2_PX; p++) {
                    __m256 b = _mm256_broadcast_ss(src[p] + c);
                    acc[p][0] = _mm256_fmadd_ps(b, w0, acc[p][0]);
                    acc[p][1] = _mm256_fmadd_ps(b, w1, acc[p][1]);
                }
            }
        }
    __m256 sc = _mm256_set1_ps(scale);
    for (int p = 0; p < DOWN2_PX; p++)
        if (p < np) {
            float *dst = t + (q + p) * r + j0;
            _mm256_maskstore_ps(dst, m0, _mm256_mul_ps(acc[p][0], sc));
            _mm256_maskstore_ps(dst + 8, m1, _mm256_mul_ps(acc[p][1], sc));
        }
}

AVX2 static void down_avx2(const lp_conv2d_shape *s, const float *dt, int32_t r, float scale, const float *x,
                           float *t, int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; q += DOWN2_PX) {
        int np = (int)(q1 - q < DOWN2_PX ? q1 - q : DOWN2_PX);
        for (int32_t j0 = 0; j0 < r; j0 += 16) down_block2(s, dt, r, j0, scale, x, t, q, np);
    }
}

/* Rows [i, i + nr) (nr <= UP2_ROWS), outputs [o0, o0 + 16); as up_block */
AVX2 INLINE void up_block2(int64_t i, int nr, int32_t r, const float *t, const float *ut, int64_t out, int64_t o0,
                           float *y, int64_t y_stride) {
    __m256i m[2] = {lanes8(out - o0), lanes8(out - o0 - 8)};
    __m256 acc[UP2_ROWS][2];
    for (int a = 0; a < nr; a++)
        for (int v = 0; v < 2; v++) acc[a][v] = _mm256_maskload_ps(y + (i + a) * y_stride + o0 + 8 * v, m[v]);
    for (int32_t j = 0; j < r; j++) {
        const float *u = ut + (int64_t)j * out + o0;
        __m256 w[2] = {_mm256_maskload_ps(u, m[0]), _mm256_maskload_ps(u + 8, m[1])};
        for (int a = 0; a < nr; a++) {
            __m256 b = _mm256_broadcast_ss(t + (i + a) * r + j);
            for (int v = 0; v < 2; v++) acc[a][v] = _mm256_fmadd_ps(b, w[v], acc[a][v]);
        }
    }
    for (int a = 0; a < nr; a++)
        for (int v = 0; v < 2; v++) _mm256_maskstore_ps(y + (i + a) * y_stride + o0 + 8 * v, m[v], acc[a][v]);
}

AVX2 static void up_avx2(int64_t i0, int64_t i1, int32_t r, const float *t, const float *ut, int64_t out, float *y,
                         int64_t y_stride) {
    for (int64_t it = i0; it < i1; it += UP_TILE) {
        int64_t ie = i1 - it < UP_TILE ? i1 : it + UP_TILE;
        for (int64_t o0 = 0; o0 < out; o0 += 16)
            for (int64_t i = it; i < ie; i += UP2_ROWS) {
                if (ie - i >= UP2_ROWS) up_block2(i, UP2_ROWS, r, t, ut, out, o0, y, y_stride);
                else if (ie - i == 3) up_block2(i, 3, r, t, ut, out, o0, y, y_stride);
                else if (ie - i == 2) up_block2(i, 2, r, t, ut, out, o0, y, y_stride);
                else up_block2(i, 1, r, t, ut, out, o0, y, y_stride);
            }
    }
}
#endif

/* ---- dispatch and threads ----------------------------------------------------- */

typedef struct lowrank_job {
    int level;
    const lp_conv2d_shape *s;
    int64_t n; /* output pixels (down) or rows (up) */
    int32_t r;
    float scale;
    const float *x, *dt, *t, *ut;
    float *out;
    int64_t width, y_stride; /* up: outputs per row, row stride of y */
} lowrank_job;

static void down_worker(void *ctx, int thread_index, int n_threads) {
    const lowrank_job *j = ctx;
    int64_t q0, q1;
    lp_split_range(j->n, thread_index, n_threads, 8, &q0, &q1);
    if (q0 >= q1) return;
#if defined(__x86_64__)
    if (j->level >= 1 && (j->s->pad + j->s->pad_after == 0 || j->s->cin <= ZERO_ROW)) {
        (j->level >= 2 ? down_avx512 : down_avx2)(j->s, j->dt, j->r, j->scale, j->x, j->out, q0, q1);
        return;
    }
#endif
    down_ref(j->s, j->dt, j->r, j->scale, j->x, j->out, q0, q1);
}

static void up_worker(void *ctx, int thread_index, int n_threads) {
    const lowrank_job *j = ctx;
    int64_t i0, i1;
    lp_split_range(j->n, thread_index, n_threads, 4, &i0, &i1);
    if (i0 >= i1) return;
#if defined(__x86_64__)
    if (j->level >= 1) {
        (j->level >= 2 ? up_avx512 : up_avx2)(i0, i1, j->r, j->t, j->ut, j->width, j->out, j->y_stride);
        return;
    }
#endif
    up_ref(i0, i1, j->r, j->t, j->ut, j->width, j->out, j->y_stride);
}

void lp_lowrank_down(const lp_kernels *k, lp_threadpool *pool, const lp_conv2d_shape *s, const float *dt, int32_t r,
                     float scale, const float *x, float *t) {
    if (r <= 0) return;
    lowrank_job j = {.level = k ? k->level : 0, .s = s, .r = r, .scale = scale, .x = x, .dt = dt, .out = t,
                     .n = (int64_t)s->n * lp_conv2d_out_h(s) * lp_conv2d_out_w(s)};
    lp_threadpool_run(pool, down_worker, &j);
}

void lp_lowrank_up(const lp_kernels *k, lp_threadpool *pool, int64_t rows, int32_t r, const float *t, const float *ut,
                   int64_t out, float *y, int64_t y_stride) {
    if (r <= 0 || rows <= 0 || out <= 0) return;
    lowrank_job j = {.level = k ? k->level : 0, .n = rows, .r = r, .t = t, .ut = ut, .width = out, .out = y,
                     .y_stride = y_stride};
    lp_threadpool_run(pool, up_worker, &j);
}
