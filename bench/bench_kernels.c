/* Micro-benchmark of lp_matmul (not a test).
 *
 *   cd /work/main && gcc -std=c11 -O3 -D_GNU_SOURCE -Iinclude -Isrc \
 *       bench/bench_kernels.c src/kernels/[a-z]*.c src/base/[a-z]*.c \
 *       -lpcre2-8 -lcjson -lpthread -lm -o /tmp/bench_kernels
 *   /tmp/bench_kernels [rows cols]
 *
 * Prints GFLOP/s and weight-read GB/s for several types, batch sizes and
 * thread counts at the best dispatch level of this CPU. */
#include "kernels/kernels.h"

#include <stdio.h>
#include <stdlib.h>

/* Best time of repeated runs over ~0.5 s: the minimum is the most stable
 * figure on a machine shared with other work. */
static double bench(const lp_kernels *k, lp_threadpool *pool, const lp_weight *W, const float *X,
                    int64_t n_batch, float *Y) {
    lp_matmul(k, pool, W, X, W->cols, n_batch, Y, W->rows); /* warm up */
    double start = lp_now_seconds(), best = 1e30;
    int iters = 0;
    while (lp_now_seconds() - start < 0.5 || iters < 3) {
        double t0 = lp_now_seconds();
        lp_matmul(k, pool, W, X, W->cols, n_batch, Y, W->rows);
        double t = lp_now_seconds() - t0;
        if (t < best) best = t;
        iters++;
    }
    return best;
}

int main(int argc, char **argv) {
    int64_t rows = argc > 2 ? atoll(argv[1]) : 2048, cols = argc > 2 ? atoll(argv[2]) : 5632;
    lp_cpu_features cpu;
    lp_cpu_detect(&cpu);
    lp_kernels k;
    lp_kernels_init(&k, &cpu);
    char desc[256];
    lp_cpu_describe(&cpu, desc, sizeof desc);
    printf("cpu: %s; level %d; W %lld x %lld\n", desc, k.level, (long long)rows, (long long)cols);

    static const uint32_t types[] = {LP_F32, LP_F16, LP_BF16, LP_Q8_0, LP_Q4_0, LP_Q4_K, LP_Q6_K};
    static const int64_t batches[] = {1, 64};
    lp_rng rng;
    lp_rng_seed(&rng, 1);
    float *wf = malloc((size_t)(rows * cols) * sizeof(float));
    float *X = malloc((size_t)(64 * cols) * sizeof(float));
    float *Y = malloc((size_t)(64 * rows) * sizeof(float));
    for (int64_t i = 0; i < rows * cols; i++) wf[i] = lp_rng_normal(&rng);
    for (int64_t i = 0; i < 64 * cols; i++) X[i] = lp_rng_normal(&rng);
    lp_error err;
    lp_threadpool *pools[2] = {lp_threadpool_create(1, &err), lp_threadpool_create(2, &err)};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        size_t row_bytes = lp_dtype_row_bytes(types[t], (uint64_t)cols);
        uint8_t *wq = malloc(row_bytes * (size_t)rows);
        for (int64_t r = 0; r < rows; r++) lp_quantize_row(types[t], wf + r * cols, wq + r * row_bytes, cols);
        lp_weight W = {types[t], rows, cols, row_bytes, wq};
        for (size_t b = 0; b < 2; b++)
            for (int p = 0; p < 2; p++) {
                double s = bench(&k, pools[p], &W, X, batches[b], Y);
                double flops = 2.0 * (double)rows * (double)cols * (double)batches[b];
                printf("%-5s batch %2lld threads %d: %8.3f ms  %7.1f GFLOP/s  %6.1f GB/s weights\n",
                       lp_dtype_name(types[t]), (long long)batches[b], p + 1, s * 1e3, flops / s * 1e-9,
                       (double)row_bytes * (double)rows / s * 1e-9);
            }
        free(wq);
    }
    lp_threadpool_destroy(pools[0]);
    lp_threadpool_destroy(pools[1]);
    free(wf);
    free(X);
    free(Y);
    return 0;
}
