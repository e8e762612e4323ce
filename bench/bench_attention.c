/* Micro-benchmark of lp_attention_tiled on SD 1.5 shapes (not a test): the
 * plain path (one query at a time: dot, expf, axpy; the reference level)
 * against the AVX2 block of 16 queries (LORAPLEX_CPU=avx2's level) and the
 * AVX-512 block of 32.
 *
 *   cmake --build build --target bench_attention
 *   build/bench_attention [threads] [repeats]
 *
 * Prints the best and the median of the repeats per shape and level, and
 * the rate in GFLOP/s counting 4 d flops per (query, key) pair (the score's
 * and the mix's multiply-adds). */
#include "kernels/image_ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct shape { const char *name; int64_t nq, nk, d; int heads; bool causal; } shape;
static const shape k_shapes[] = {
    {"self, level 1, 256x256", 1024, 1024, 40, 8, false}, {"cross, level 1, 256x256", 1024, 77, 40, 8, false},
    {"self, level 2, 256x256", 256, 256, 80, 8, false},   {"self, level 1, 512x512", 4096, 4096, 40, 8, false},
    {"text encoder (causal)", 77, 77, 64, 12, true},
};

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2, repeats = argc > 2 ? atoi(argv[2]) : 5;
    if (threads < 1 || repeats < 1 || repeats > 99) return fprintf(stderr, "usage: bench_attention [threads] [repeats]\n"), 2;
    lp_cpu_features cpu;
    lp_cpu_detect(&cpu);
    lp_kernels lv[3];
    lp_kernels_init_reference(&lv[0]);
    lp_kernels_init_capped(&lv[1], &cpu, LP_CPU_CAP_AVX2);
    lp_kernels_init_capped(&lv[2], &cpu, LP_CPU_CAP_NONE);
    static const char *const names[3] = {"plain", "avx2", "avx512"};
    lp_error err = {0};
    lp_threadpool *pool = threads > 1 ? lp_threadpool_create(threads, &err) : NULL;
    if (threads > 1 && !pool) return fprintf(stderr, "%s\n", err.message), 1;
    printf("%d threads, best / median of %d (ms), GFLOP/s of the best\n", threads, repeats);
    for (size_t si = 0; si < sizeof k_shapes / sizeof *k_shapes; si++) {
        const shape *sh = &k_shapes[si];
        int64_t w = sh->heads * sh->d, rows = sh->nq > sh->nk ? sh->nq : sh->nk;
        float *q = malloc(sizeof(float) * (size_t)(rows * w)), *kv = malloc(sizeof(float) * (size_t)(rows * 2 * w));
        float *out = malloc(sizeof(float) * (size_t)(sh->nq * w));
        float *scratch = malloc(sizeof(float) * lp_attention_scratch_floats(threads, sh->d));
        lp_rng r;
        lp_rng_seed(&r, 7);
        for (int64_t i = 0; i < rows * w; i++) q[i] = 2.0f * lp_rng_uniform(&r) - 1.0f;
        for (int64_t i = 0; i < rows * 2 * w; i++) kv[i] = 2.0f * lp_rng_uniform(&r) - 1.0f;
        lp_attn_shape s = {.nq = sh->nq, .nk = sh->nk, .heads = sh->heads, .d = sh->d, .q_stride = w,
                           .k_stride = 2 * w, .v_stride = 2 * w, .out_stride = w,
                           .scale = 1.0f / sqrtf((float)sh->d), .causal = sh->causal};
        double best[3], med[3];
        for (int lvl = 0; lvl < 3; lvl++) {
            double t[99];
            for (int k = 0; k < repeats; k++) {
                double t0 = lp_now_seconds();
                lp_attention_tiled(&lv[lvl], pool, &s, q, kv, kv + w, out, scratch);
                t[k] = lp_now_seconds() - t0;
            }
            qsort(t, (size_t)repeats, sizeof *t, cmp_double);
            best[lvl] = t[0];
            med[lvl] = t[repeats / 2];
        }
        double flops = 4.0 * (double)sh->nq * (double)sh->nk * (double)sh->d * sh->heads;
        printf("%-26s", sh->name);
        for (int lvl = 0; lvl < 3; lvl++)
            printf(" | %s %7.2f / %7.2f (%5.1f GFLOP/s, %5.2fx)", names[lvl], 1e3 * best[lvl], 1e3 * med[lvl],
                   flops / best[lvl] * 1e-9, best[0] / best[lvl]);
        printf("\n");
        free(q), free(kv), free(out), free(scratch);
    }
    lp_threadpool_destroy(pool);
    return 0;
}
