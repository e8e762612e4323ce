/* Micro-benchmark of lp_matmul on TinyLlama-1.1B shapes (not a test).
 *
 *   cd /work/main && gcc -std=c11 -O3 -D_GNU_SOURCE -Iinclude -Isrc \
 *       bench/bench_kernels.c src/kernels/[a-z]*.c src/base/[a-z]*.c \
 *       -lpcre2-8 -lcjson -lpthread -lm -o /tmp/bench_kernels
 *   /tmp/bench_kernels [repeats] [type filter, e.g. "W4"] [decode rows, 1-32]
 *
 * Roofline: read bandwidth of a 2 GiB buffer summed with AVX-512 loads
 * (STREAM-like "sum"), 1 and 2 threads, measured in the same run.
 *
 * Decode: TinyLlama-shaped layers (q,k,v,o,gate,up,down) of each weight
 * type are allocated, as many as make at least 2.2 GB (22 layers for F16,
 * ~90 for W4), so that like the roofline buffer the working set is far
 * beyond the 480 MB L3; one pass over every matrix in order (one row)
 * is timed: GB/s = bytes / time, compared with the read roofline of the
 * same thread count. tok/s = GB/s / (22 layers' bytes). "decode rows" > 1
 * times that pass with a batch of that many rows (concurrent streams, a
 * speculative tree): tok/s is then steps per second.
 *
 * Prefill: n_batch 128 through each shape (cache-resident: compute bound),
 * GOP/s with 2 ops per multiply-add, and a 22-layer estimate in tokens/s
 * (matmuls only). Every figure is best and median of the repeats: the
 * machine is shared, so the best is the closer estimate of the kernel.
 * (The W4A16 float path, int8_activations = false, is an accuracy
 * reference, not a fast path: it is left out.) */
#include "kernels/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef struct shape { int64_t rows, cols; int per_layer; } shape;
/* q/o, k/v, gate/up, down */
static const shape k_shapes[] = {{2048, 2048, 2}, {256, 2048, 2}, {5632, 2048, 2}, {2048, 5632, 1}};
#define N_SHAPES 4
#define N_LAYERS 22
#define PREFILL 128
#define MAX_REPEATS 64

typedef struct wtype { uint32_t type; int group; bool int8; const char *name; } wtype;
static const wtype k_types[] = {
    {LP_W4, 32, true, "W4 g32"}, {LP_W4, 64, true, "W4 g64"},  {LP_W4, 128, true, "W4 g128"},
    {LP_W8, 32, true, "W8 g32"}, {LP_W4C, 32, true, "W4C g32"}, {LP_Q4_0, 0, false, "Q4_0"},
    {LP_Q8_0, 0, false, "Q8_0"}, {LP_F16, 0, false, "F16"},
};

static int g_repeats = 7;
static int64_t g_decode_rows = 1;

typedef struct stats { double best, median; } stats;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Best (smallest) and median of n timings. */
static stats summarize(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return (stats){t[0], t[n / 2]};
}

/* ---- read bandwidth (the decode roofline) -------------------------------------------- */

typedef struct bw_job { const float *b; int64_t n; float sums[256]; } bw_job;

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static float sum_avx512(const float *p, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t i = 0; i + 64 <= n; i += 64) {
        s0 = _mm512_add_ps(s0, _mm512_load_ps(p + i));
        s1 = _mm512_add_ps(s1, _mm512_load_ps(p + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_load_ps(p + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_load_ps(p + i + 48));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}
#endif

static float sum_plain(const float *p, int64_t n) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int64_t i = 0; i + 4 <= n; i += 4) {
        s0 += p[i];
        s1 += p[i + 1];
        s2 += p[i + 2];
        s3 += p[i + 3];
    }
    return s0 + s1 + s2 + s3;
}

static bool g_avx512;

static void bw_worker(void *ctx, int ti, int nt) {
    bw_job *j = ctx;
    int64_t i0, i1;
    lp_split_range(j->n, ti, nt, 4096, &i0, &i1);
#if defined(__x86_64__)
    if (g_avx512) {
        j->sums[ti] = sum_avx512(j->b + i0, i1 - i0);
        return;
    }
#endif
    j->sums[ti] = sum_plain(j->b + i0, i1 - i0);
}

static stats read_bandwidth(lp_threadpool *pool) {
    const int64_t n = (int64_t)512 << 20; /* 2 GiB of floats */
    float *b = lp_alloc((size_t)n * 4);
    if (!b) return (stats){0, 0};
    for (int64_t i = 0; i < n; i++) b[i] = 1.0f;
    bw_job job = {b, n, {0}};
    double t[MAX_REPEATS];
    for (int it = 0; it < g_repeats; it++) {
        double t0 = lp_now_seconds();
        lp_threadpool_run(pool, bw_worker, &job);
        t[it] = lp_now_seconds() - t0;
    }
    lp_free(b);
    stats s = summarize(t, g_repeats);
    return (stats){(double)n * 4 / s.best * 1e-9, (double)n * 4 / s.median * 1e-9};
}

/* ---- weights ------------------------------------------------------------------------- */

static size_t weight_bytes(const lp_weight *W) {
    if (lp_dtype_is_packed(W->type)) return lp_pack_bytes(W->type, W->rows, W->cols, W->group);
    return W->row_bytes * (size_t)W->rows;
}

static void *make_weight(const wtype *t, const float *wf, int64_t rows, int64_t cols, lp_weight *W) {
    if (lp_dtype_is_packed(t->type)) {
        void *p = lp_alloc(lp_pack_bytes(t->type, rows, cols, t->group));
        lp_pack_weight_ex(t->type, t->group, wf, rows, cols, p, false);
        *W = lp_packed_weight(t->type, t->group, rows, cols, p);
        return p;
    }
    size_t rb = lp_dtype_row_bytes(t->type, (uint64_t)cols);
    uint8_t *p = lp_alloc(rb * (size_t)rows);
    for (int64_t r = 0; r < rows; r++) lp_quantize_row(t->type, wf + r * cols, p + (size_t)r * rb, cols);
    *W = (lp_weight){t->type, rows, cols, rb, p, 0};
    return p;
}

/* ---- decode over a whole model -------------------------------------------------------- */

#define N_MATS 7 /* q k v o gate up down */
static const int k_mat_shape[N_MATS] = {0, 1, 1, 0, 2, 2, 3};

#define DECODE_BYTES 2.2e9
#define MAX_LAYERS 256

typedef struct model {
    int n_layers;
    lp_weight W[MAX_LAYERS][N_MATS];
    double bytes, layer_bytes;
} model;

/* One packed/quantized copy per shape, copied into n_layers x 7 separate
 * buffers. */
static void build_model(const wtype *t, const float *wf, model *m) {
    lp_weight proto[N_SHAPES];
    void *pmem[N_SHAPES];
    for (int s = 0; s < N_SHAPES; s++) pmem[s] = make_weight(t, wf, k_shapes[s].rows, k_shapes[s].cols, &proto[s]);
    m->layer_bytes = 0;
    for (int i = 0; i < N_MATS; i++) m->layer_bytes += (double)weight_bytes(&proto[k_mat_shape[i]]);
    m->n_layers = (int)(DECODE_BYTES / m->layer_bytes) + 1;
    if (m->n_layers < N_LAYERS) m->n_layers = N_LAYERS;
    if (m->n_layers > MAX_LAYERS) m->n_layers = MAX_LAYERS;
    m->bytes = 0;
    for (int l = 0; l < m->n_layers; l++)
        for (int i = 0; i < N_MATS; i++) {
            const lp_weight *p = &proto[k_mat_shape[i]];
            size_t bytes = weight_bytes(p);
            void *mem = lp_alloc(bytes);
            memcpy(mem, p->data, bytes);
            m->W[l][i] = *p;
            m->W[l][i].data = mem;
            m->bytes += (double)bytes;
        }
    for (int s = 0; s < N_SHAPES; s++) lp_free(pmem[s]);
}

static void free_model(model *m) {
    for (int l = 0; l < m->n_layers; l++)
        for (int i = 0; i < N_MATS; i++) lp_free((void *)m->W[l][i].data);
}

/* Seconds per decode pass (every matrix once, g_decode_rows rows). multi: q,k,v
 * and gate,up each in one lp_matmul_multi call, as an engine would. */
static stats decode(const lp_kernels *k, lp_threadpool *pool, const model *m, const float *X, float *Y, bool multi) {
    double t[MAX_REPEATS];
    /* separate outputs: 3 x 32 rows of 5632 fit the prefill-sized Y */
    float *ys[3] = {Y, Y + 32 * 5632, Y + 2 * 32 * 5632};
    for (int it = -1; it < g_repeats; it++) {
        double t0 = lp_now_seconds();
        for (int l = 0; l < m->n_layers; l++) {
            if (multi) {
                const lp_weight *qkv[3] = {&m->W[l][0], &m->W[l][1], &m->W[l][2]};
                const lp_weight *gu[2] = {&m->W[l][4], &m->W[l][5]};
                int64_t s_qkv[3] = {2048, 256, 256}, s_gu[2] = {5632, 5632};
                lp_matmul_multi(k, pool, 3, qkv, X, 2048, g_decode_rows, ys, s_qkv);
                lp_matmul(k, pool, &m->W[l][3], X, 2048, g_decode_rows, Y, 2048);
                lp_matmul_multi(k, pool, 2, gu, X, 2048, g_decode_rows, ys, s_gu);
                lp_matmul(k, pool, &m->W[l][6], X, 5632, g_decode_rows, Y, 2048);
                continue;
            }
            for (int i = 0; i < N_MATS; i++) {
                const lp_weight *W = &m->W[l][i];
                lp_matmul(k, pool, W, X, W->cols, g_decode_rows, Y, W->rows);
            }
        }
        if (it >= 0) t[it] = lp_now_seconds() - t0;
    }
    return summarize(t, g_repeats);
}

/* Seconds per call at n_batch rows. */
static stats time_matmul(const lp_kernels *k, lp_threadpool *pool, const lp_weight *W, const float *X,
                         int64_t n_batch, float *Y) {
    lp_matmul(k, pool, W, X, W->cols, n_batch, Y, W->rows); /* warm up */
    double t[MAX_REPEATS];
    for (int it = 0; it < g_repeats; it++) {
        double t0 = lp_now_seconds();
        lp_matmul(k, pool, W, X, W->cols, n_batch, Y, W->rows);
        t[it] = lp_now_seconds() - t0;
    }
    return summarize(t, g_repeats);
}

int main(int argc, char **argv) {
    if (argc > 1) g_repeats = atoi(argv[1]);
    if (g_repeats < 3) g_repeats = 3;
    if (g_repeats > MAX_REPEATS) g_repeats = MAX_REPEATS;
    const char *filter = argc > 2 ? argv[2] : NULL;
    if (argc > 3) g_decode_rows = atoi(argv[3]);
    if (g_decode_rows < 1 || g_decode_rows > 32) g_decode_rows = 1;
    lp_cpu_features cpu;
    lp_cpu_detect(&cpu);
    g_avx512 = cpu.avx512f;
    lp_kernels k;
    lp_kernels_init(&k, &cpu);
    lp_error err;
    if (lp_kernels_reserve(&k, PREFILL, 5632, &err) != 0) return 1;
    char desc[256];
    lp_cpu_describe(&cpu, desc, sizeof desc);
    printf("cpu: %s; float level %d; integer level %s; %d repeats (best / median); decode rows %lld\n", desc,
           k.level, lp_int_level_name(k.int_level), g_repeats, (long long)g_decode_rows);
    lp_threadpool *pools[2] = {lp_threadpool_create(1, &err), lp_threadpool_create(2, &err)};
    stats roof[2];
    for (int p = 0; p < 2; p++) {
        roof[p] = read_bandwidth(pools[p]);
        printf("read bandwidth (2 GiB, %s loads) %d thread(s): best %.1f GB/s, median %.1f GB/s\n",
               g_avx512 ? "AVX-512" : "scalar", p + 1, roof[p].best, roof[p].median);
    }

    lp_rng rng;
    lp_rng_seed(&rng, 1);
    const int64_t max_elems = 5632 * 2048;
    float *wf = malloc((size_t)max_elems * sizeof(float));
    float *X = malloc((size_t)(PREFILL * 5632) * sizeof(float));
    float *Y = malloc((size_t)(PREFILL * 5632) * sizeof(float));
    for (int64_t i = 0; i < max_elems; i++) wf[i] = lp_rng_normal(&rng) * 0.02f;
    for (int64_t i = 0; i < PREFILL * 5632; i++) X[i] = lp_rng_normal(&rng);

    printf("\n%-8s | GB read | decode GB/s 1t best/med (%% roof) | 2t best/med (%% roof) | tok/s 1t 2t | "
           "prefill GOP/s 1t best/med | 2t best/med | tok/s 1t 2t\n",
           "type");
    for (size_t t = 0; t < sizeof k_types / sizeof k_types[0]; t++) {
        const wtype *ty = &k_types[t];
        if (filter && !strstr(ty->name, filter)) continue;
        lp_kernels kt = k;
        kt.int8_activations = ty->int8;
        model *m = malloc(sizeof *m);
        build_model(ty, wf, m);
        stats dec[2], pre[2] = {{0, 0}, {0, 0}};
        for (int p = 0; p < 2; p++) dec[p] = decode(&kt, pools[p], m, X, Y, false);
        stats multi = decode(&kt, pools[1], m, X, Y, true);
        /* prefill: per-layer time from the four shapes, each cache-resident */
        double ops_layer = 0;
        for (int s = 0; s < N_SHAPES; s++) ops_layer += 2.0 * (double)k_shapes[s].rows * k_shapes[s].cols * k_shapes[s].per_layer;
        for (int p = 0; p < 2; p++)
            for (int s = 0; s < N_SHAPES; s++) {
                const lp_weight *W = &m->W[0][s == 0 ? 0 : s == 1 ? 1 : s == 2 ? 4 : 6];
                stats st = time_matmul(&kt, pools[p], W, X, PREFILL, Y);
                pre[p].best += st.best * k_shapes[s].per_layer;
                pre[p].median += st.median * k_shapes[s].per_layer;
            }
        double gb = m->bytes * 1e-9, tok_gb = m->layer_bytes * N_LAYERS * 1e-9;
        printf("%-8s | %7.2f | %6.1f / %6.1f (%3.0f%%)       | %6.1f / %6.1f (%3.0f%%) | %5.1f %5.1f | "
               "%6.0f / %6.0f     | %6.0f / %6.0f | %4.0f %4.0f\n",
               ty->name, gb, gb / dec[0].best, gb / dec[0].median, 100 * gb / dec[0].best / roof[0].best,
               gb / dec[1].best, gb / dec[1].median, 100 * gb / dec[1].best / roof[1].best,
               gb / dec[0].best / tok_gb, gb / dec[1].best / tok_gb,
               ops_layer * PREFILL / pre[0].best * 1e-9, ops_layer * PREFILL / pre[0].median * 1e-9,
               ops_layer * PREFILL / pre[1].best * 1e-9, ops_layer * PREFILL / pre[1].median * 1e-9,
               PREFILL / (pre[0].best * N_LAYERS), PREFILL / (pre[1].best * N_LAYERS));
        printf("%-8s |  2t decode with lp_matmul_multi (q,k,v and gate,up fused): %.1f / %.1f GB/s (%.0f%%), "
               "%.1f tok/s\n",
               ty->name, gb / multi.best, gb / multi.median, 100 * gb / multi.best / roof[1].best,
               gb / multi.best / tok_gb);
        fflush(stdout);
        free_model(m);
        free(m);
    }
    lp_kernels_free(&k);
    lp_threadpool_destroy(pools[0]);
    lp_threadpool_destroy(pools[1]);
    free(wf);
    free(X);
    free(Y);
    return 0;
}
