/* Micro-benchmark of a runtime LoRA's two passes on SD 1.5 shapes (not a
 * test): lp_lowrank_down + lp_lowrank_up (the outer-product kernels) against
 * the same delta through lp_matmul's float tiles (shrink, expand into a
 * buffer, add), as the graph ran it before. Rank 32, 256x256 with CFG: 2048
 * latent rows at the first level.
 *
 *   cd /work/main && gcc -std=c11 -O3 -D_GNU_SOURCE -Iinclude -Isrc \
 *       bench/bench_lowrank.c src/kernels/[a-z]*.c src/base/[a-z]*.c \
 *       -lpcre2-8 -lcjson -lpthread -lm -o /tmp/bench_lowrank
 *   /tmp/bench_lowrank [threads] [repeats]
 *
 * Prints the best and the median time of the repeats (the machine is
 * shared: the best is the closer estimate of the kernel) and GFLOP/s with 2
 * flops per multiply-add. */
#include "kernels/image_ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct shape { const char *name; int64_t rows, in, out; } shape;
static const shape k_shapes[] = {
    {"attn q/k/v/out, level 1", 2048, 320, 320}, {"ff proj (GEGLU), level 1", 2048, 320, 2560},
    {"ff out, level 1", 2048, 1280, 320},        {"attn, level 2", 512, 640, 640},
    {"attn, level 3", 128, 1280, 1280},          {"text encoder q/k/v", 154, 768, 768},
};
#define RANK 32

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void fill(float *x, int64_t n, uint64_t seed) {
    lp_rng r;
    lp_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) x[i] = 2.0f * lp_rng_uniform(&r) - 1.0f;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2, repeats = argc > 2 ? atoi(argv[2]) : 9;
    if (threads < 1 || repeats < 1 || repeats > 99) return fprintf(stderr, "usage: bench_lowrank [threads] [repeats]\n"), 2;
    lp_cpu_features cpu;
    lp_cpu_detect(&cpu);
    lp_kernels k;
    lp_kernels_init(&k, &cpu);
    char desc[256];
    lp_kernels_describe(&k, desc, sizeof desc);
    lp_error err = {0};
    lp_threadpool *pool = lp_threadpool_create(threads, &err);
    if (!pool) return fprintf(stderr, "%s\n", err.message), 1;
    printf("kernels: %s; %d threads, rank %d, best / median of %d\n", desc, threads, RANK, repeats);
    printf("%-26s %5s %5s %5s | %-22s | %-22s | %s\n", "shape", "rows", "in", "out", "lp_matmul + add (ms)",
           "lowrank (ms)", "best: GFLOP/s, speedup");
    for (size_t si = 0; si < sizeof k_shapes / sizeof *k_shapes; si++) {
        const shape *s = &k_shapes[si];
        int64_t rows = s->rows, in = s->in, out = s->out;
        float *x = malloc(sizeof(float) * rows * in), *down = malloc(sizeof(float) * RANK * in);
        float *up = malloc(sizeof(float) * out * RANK), *dt = malloc(sizeof(float) * RANK * in);
        float *ut = malloc(sizeof(float) * out * RANK), *t = malloc(sizeof(float) * rows * RANK);
        float *u = malloc(sizeof(float) * rows * out), *y = malloc(sizeof(float) * rows * out);
        fill(x, rows * in, 1), fill(down, RANK * in, 2), fill(up, out * RANK, 3), fill(y, rows * out, 4);
        memset(u, 0, sizeof(float) * rows * out), memset(t, 0, sizeof(float) * rows * RANK); /* pages in */
        for (int64_t j = 0; j < RANK; j++)
            for (int64_t c = 0; c < in; c++) dt[c * RANK + j] = down[j * in + c];
        for (int64_t o = 0; o < out; o++)
            for (int64_t j = 0; j < RANK; j++) ut[j * out + o] = up[o * RANK + j];
        lp_weight wd = {.type = LP_F32, .rows = RANK, .cols = in, .row_bytes = (size_t)in * 4, .data = down};
        lp_weight wu = {.type = LP_F32, .rows = out, .cols = RANK, .row_bytes = RANK * 4, .data = up};
        lp_conv2d_shape cs = {.n = 1, .h = 1, .w = (int32_t)rows, .cin = (int32_t)in, .kh = 1, .kw = 1, .stride = 1};
        double tm[2][99];
        for (int r = -1; r < repeats; r++) { /* one warm-up round */
            double t0 = lp_now_seconds();
            lp_matmul(&k, pool, &wd, x, in, rows, t, RANK);
            lp_matmul(&k, pool, &wu, t, RANK, rows, u, out);
            for (int64_t i = 0; i < rows * out; i++) y[i] += 0.5f * u[i];
            double t1 = lp_now_seconds();
            lp_lowrank_down(&k, pool, &cs, dt, RANK, 0.5f, x, t);
            lp_lowrank_up(&k, pool, rows, RANK, t, ut, out, y, out);
            double t2 = lp_now_seconds();
            if (r >= 0) tm[0][r] = t1 - t0, tm[1][r] = t2 - t1;
        }
        qsort(tm[0], (size_t)repeats, sizeof(double), cmp_double);
        qsort(tm[1], (size_t)repeats, sizeof(double), cmp_double);
        double flops = 2.0 * rows * RANK * (double)(in + out);
        printf("%-26s %5lld %5lld %5lld | %8.3f / %-11.3f | %8.3f / %-11.3f | %.0f -> %.0f, %.2fx\n", s->name,
               (long long)rows, (long long)in, (long long)out, tm[0][0] * 1e3, tm[0][repeats / 2] * 1e3,
               tm[1][0] * 1e3, tm[1][repeats / 2] * 1e3, flops / tm[0][0] / 1e9, flops / tm[1][0] / 1e9,
               tm[0][0] / tm[1][0]);
        free(x), free(down), free(up), free(dt), free(ut), free(t), free(u), free(y);
    }
    lp_threadpool_destroy(pool);
    lp_kernels_free(&k);
    return 0;
}
