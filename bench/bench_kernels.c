/* Micro-benchmark of lp_matmul on TinyLlama-1.1B shapes (not a test).
 *
 *   cd /work/main && gcc -std=c11 -O3 -D_GNU_SOURCE -Iinclude -Isrc \
 *       bench/bench_kernels.c src/kernels/[a-z]*.c src/base/[a-z]*.c \
 *       -lpcre2-8 -lcjson -lpthread -lm -o /tmp/bench_kernels
 *   /tmp/bench_kernels [seconds_per_case]
 *
 * For F16, GGUF Q8_0/Q4_0 and the packed LP_W4 (groups 32/64/128) / LP_W8
 * types: decode (n_batch 1) weight-read GB/s and prefill (n_batch 128)
 * GOP/s (2 ops per multiply-add), on 1 and 2 threads, at the best dispatch
 * level. Also a read-only and a STREAM-like triad bandwidth measurement
 * (the decode roofline) and whole-model estimates: 22 layers of TinyLlama
 * projections, tokens/s for decode and 128-token prefill (matmuls only).
 * Every figure is the best of repeated runs: the machine may be shared. */
#include "kernels/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct shape { int64_t rows, cols; int per_layer; } shape;
/* q/o, k/v, gate/up, down */
static const shape k_shapes[] = {{2048, 2048, 2}, {256, 2048, 2}, {5632, 2048, 2}, {2048, 5632, 1}};
#define N_LAYERS 22
#define PREFILL 128

typedef struct wtype { uint32_t type; int group; const char *name; } wtype;
static const wtype k_types[] = {
    {LP_F16, 0, "F16"},     {LP_Q8_0, 0, "Q8_0"},    {LP_Q4_0, 0, "Q4_0"},  {LP_W8, 32, "W8 g32"},
    {LP_W8, -1, "W8 row"},  {LP_W4, 32, "W4 g32"},   {LP_W4, 64, "W4 g64"}, {LP_W4, 128, "W4 g128"},
};

static double g_seconds = 0.3;

static double bench(const lp_kernels *k, lp_threadpool *pool, const lp_weight *W, const float *X,
                    int64_t n_batch, float *Y) {
    lp_matmul(k, pool, W, X, W->cols, n_batch, Y, W->rows); /* warm up */
    double start = lp_now_seconds(), best = 1e30;
    int iters = 0;
    while (lp_now_seconds() - start < g_seconds || iters < 3) {
        double t0 = lp_now_seconds();
        lp_matmul(k, pool, W, X, W->cols, n_batch, Y, W->rows);
        double t = lp_now_seconds() - t0;
        if (t < best) best = t;
        iters++;
    }
    return best;
}

/* ---- memory bandwidth -------------------------------------------------------------- */

typedef struct bw_job { float *a; const float *b, *c; int64_t n; double sums[64]; bool triad; } bw_job;

static void bw_worker(void *ctx, int ti, int nt) {
    bw_job *j = ctx;
    int64_t i0, i1;
    lp_split_range(j->n, ti, nt, 4096, &i0, &i1);
    if (j->triad) {
        for (int64_t i = i0; i < i1; i++) j->a[i] = j->b[i] + 3.0f * j->c[i];
    } else {
        float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (int64_t i = i0; i + 4 <= i1; i += 4) {
            s0 += j->b[i];
            s1 += j->b[i + 1];
            s2 += j->b[i + 2];
            s3 += j->b[i + 3];
        }
        j->sums[ti] = s0 + s1 + s2 + s3;
    }
}

static void bandwidth(lp_threadpool *pool, int threads) {
    const int64_t n = 64 << 20; /* 256 MiB per array: far beyond any cache */
    float *a = lp_alloc((size_t)n * 4), *b = lp_alloc((size_t)n * 4), *c = lp_alloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) b[i] = c[i] = 1.0f;
    for (int triad = 0; triad < 2; triad++) {
        bw_job job = {a, b, c, n, {0}, triad};
        double best = 1e30;
        for (int it = 0; it < 8; it++) {
            double t0 = lp_now_seconds();
            lp_threadpool_run(pool, bw_worker, &job);
            double t = lp_now_seconds() - t0;
            if (t < best) best = t;
        }
        double bytes = (double)n * 4 * (triad ? 3 : 1);
        printf("bandwidth %-6s %d thread(s): %6.1f GB/s%s\n", triad ? "triad" : "read", threads, bytes / best * 1e-9,
               triad ? " (2 reads + 1 write counted)" : "");
    }
    lp_free(a);
    lp_free(b);
    lp_free(c);
}

/* ---- matmul -------------------------------------------------------------------------------- */

static size_t weight_bytes(const lp_weight *W) {
    if (W->type == LP_W4 || W->type == LP_W8) return lp_pack_bytes(W->type, W->rows, W->cols, W->group);
    return W->row_bytes * (size_t)W->rows;
}

static void *make_weight(const wtype *t, const float *wf, int64_t rows, int64_t cols, lp_weight *W) {
    if (t->type == LP_W4 || t->type == LP_W8) {
        int group = t->group < 0 ? (int)cols : t->group;
        void *p = lp_alloc(lp_pack_bytes(t->type, rows, cols, group));
        lp_pack_weight_ex(t->type, group, wf, rows, cols, p, false);
        *W = lp_packed_weight(t->type, group, rows, cols, p);
        return p;
    }
    size_t rb = lp_dtype_row_bytes(t->type, (uint64_t)cols);
    uint8_t *p = lp_alloc(rb * (size_t)rows);
    for (int64_t r = 0; r < rows; r++) lp_quantize_row(t->type, wf + r * cols, p + (size_t)r * rb, cols);
    *W = (lp_weight){t->type, rows, cols, rb, p, 0};
    return p;
}

int main(int argc, char **argv) {
    if (argc > 1) g_seconds = atof(argv[1]);
    lp_cpu_features cpu;
    lp_cpu_detect(&cpu);
    lp_kernels k;
    lp_kernels_init(&k, &cpu);
    lp_error err;
    if (lp_kernels_reserve(&k, PREFILL, 5632, &err) != 0) return 1;
    char desc[256];
    lp_cpu_describe(&cpu, desc, sizeof desc);
    printf("cpu: %s; float level %d; integer level %s\n", desc, k.level, lp_int_level_name(k.int_level));
    lp_threadpool *pools[2] = {lp_threadpool_create(1, &err), lp_threadpool_create(2, &err)};
    for (int p = 0; p < 2; p++) bandwidth(pools[p], p + 1);

    lp_rng rng;
    lp_rng_seed(&rng, 1);
    const int64_t max_elems = 5632 * 2048;
    float *wf = malloc((size_t)max_elems * sizeof(float));
    float *X = malloc((size_t)(PREFILL * 5632) * sizeof(float));
    float *Y = malloc((size_t)(PREFILL * 5632) * sizeof(float));
    for (int64_t i = 0; i < max_elems; i++) wf[i] = lp_rng_normal(&rng) * 0.02f;
    for (int64_t i = 0; i < PREFILL * 5632; i++) X[i] = lp_rng_normal(&rng);

    printf("\n%-8s %-10s | decode GB/s 1t  2t | prefill GOP/s 1t  2t\n", "type", "shape");
    for (size_t t = 0; t < sizeof k_types / sizeof k_types[0]; t++) {
        double layer_dec[2] = {0, 0}, layer_pre[2] = {0, 0}, layer_bytes = 0;
        for (size_t s = 0; s < sizeof k_shapes / sizeof k_shapes[0]; s++) {
            const shape *sh = &k_shapes[s];
            lp_weight W;
            void *mem = make_weight(&k_types[t], wf, sh->rows, sh->cols, &W);
            double bytes = (double)weight_bytes(&W), ops = 2.0 * (double)sh->rows * (double)sh->cols;
            double dec[2], pre[2];
            for (int p = 0; p < 2; p++) {
                dec[p] = bench(&k, pools[p], &W, X, 1, Y);
                pre[p] = bench(&k, pools[p], &W, X, PREFILL, Y);
                layer_dec[p] += dec[p] * sh->per_layer;
                layer_pre[p] += pre[p] * sh->per_layer;
            }
            layer_bytes += bytes * sh->per_layer;
            printf("%-8s %4lldx%-5lld | %13.1f %5.1f | %16.1f %5.1f\n", k_types[t].name, (long long)sh->rows,
                   (long long)sh->cols, bytes / dec[0] * 1e-9, bytes / dec[1] * 1e-9, ops * PREFILL / pre[0] * 1e-9,
                   ops * PREFILL / pre[1] * 1e-9);
            lp_free(mem);
        }
        printf("%-8s 22 layers  | %.3f GB/token; decode %.1f / %.1f tok/s (%.1f GB/s at 2t); prefill %.0f / %.0f tok/s\n",
               k_types[t].name, layer_bytes * N_LAYERS * 1e-9, 1.0 / (layer_dec[0] * N_LAYERS),
               1.0 / (layer_dec[1] * N_LAYERS), layer_bytes / layer_dec[1] * 1e-9,
               PREFILL / (layer_pre[0] * N_LAYERS), PREFILL / (layer_pre[1] * N_LAYERS));
    }
    lp_kernels_free(&k);
    lp_threadpool_destroy(pools[0]);
    lp_threadpool_destroy(pools[1]);
    free(wf);
    free(X);
    free(Y);
    return 0;
}
