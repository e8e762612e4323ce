/* Micro-benchmark (not a test): a UNet batch of B images with B different
 * runtime LoRAs against the same batch with one LoRA for all, alternating
 * the two every call in one process, so that a machine whose speed drifts
 * between minutes affects both sides alike. Rows are laid out as
 * lp_sd_generate lays them out with guidance: image b is rows 2b
 * (unconditional) and 2b+1 (conditional), both with image b's adapter.
 *
 *   cmake --build build && build/bench_sd_mix MODEL.lpx W8A8|W8A16 SIZE \
 *       THREADS ROUNDS LORA1 [LORA2 ...]
 *
 * e.g. build/bench_sd_mix sd15-q8.lpx W8A8 256 2 6 k1.safetensors ...
 * k4.safetensors. Prints each round's seconds per UNet call for both and
 * their ratio (throughput of the mixed batch over the one-adapter batch),
 * then the median ratio. */
#include "image/sd_graph.h"
#include "image/sd_lora.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LORAS 8

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double unet_seconds(lp_sd_graph *g, const lp_sd_row_loras *rows, int n, const float *x, const float *t,
                           const float *ctx, float *eps, lp_error *err) {
    if (lp_sd_graph_set_loras(g, rows, n, err)) return -1;
    double t0 = lp_now_seconds();
    if (lp_sd_unet(g, x, t, ctx, n, eps, err)) return -1;
    return lp_now_seconds() - t0;
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: bench_sd_mix MODEL.lpx W8A8|W8A16 SIZE THREADS ROUNDS LORA1 [LORA2 ...]\n");
        return 2;
    }
    const char *model = argv[1];
    bool a8 = strcmp(argv[2], "W8A8") == 0;
    int size = atoi(argv[3]), threads = atoi(argv[4]), rounds = atoi(argv[5]), n_lora = argc - 6;
    if (size < 64 || size % 64 || threads < 1 || rounds < 1 || rounds > 99 || n_lora > MAX_LORAS) {
        fprintf(stderr, "bench_sd_mix: SIZE a multiple of 64, THREADS >= 1, ROUNDS 1..99, at most %d LoRAs\n",
                MAX_LORAS);
        return 2;
    }
    lp_error err = {0};
    lp_sd_weights *w = lp_sd_weights_open(model, &err);
    if (!w) return fprintf(stderr, "%s\n", err.message), 1;
    const lp_sd_config *c = lp_sd_weights_config(w);
    lp_sd_lora *loras[MAX_LORAS] = {0};
    for (int i = 0; i < n_lora; i++)
        if (!(loras[i] = lp_sd_lora_load(argv[6 + i], c, &err))) return fprintf(stderr, "%s\n", err.message), 1;
    int rows = 2 * n_lora, lat = size / 8;
    lp_sd_graph *g = lp_sd_graph_create(w, rows, lat, lat, threads, &err);
    if (!g) return fprintf(stderr, "%s\n", err.message), 1;
    lp_sd_graph_set_int8_activations(g, a8);
    int64_t nx = (int64_t)rows * lat * lat * c->unet_in, nctx = (int64_t)rows * c->te_ctx * c->context_dim;
    float *x = malloc(sizeof(float) * (size_t)nx), *ctx = malloc(sizeof(float) * (size_t)nctx);
    float *eps = malloc(sizeof(float) * (size_t)rows * lat * lat * c->unet_out), t[2 * MAX_LORAS];
    if (!x || !ctx || !eps) return fprintf(stderr, "out of memory\n"), 1;
    lp_rng r;
    lp_rng_seed(&r, 1);
    for (int64_t i = 0; i < nx; i++) x[i] = 2.0f * lp_rng_uniform(&r) - 1.0f;
    for (int64_t i = 0; i < nctx; i++) ctx[i] = 2.0f * lp_rng_uniform(&r) - 1.0f;
    for (int i = 0; i < rows; i++) t[i] = 500.0f;
    lp_sd_row_loras one[2 * MAX_LORAS], mixed[2 * MAX_LORAS];
    for (int i = 0; i < rows; i++) {
        one[i] = (lp_sd_row_loras){.n = 1, .use[0] = {.lora = loras[0], .scale = 1.0f}};
        mixed[i] = (lp_sd_row_loras){.n = 1, .use[0] = {.lora = loras[i / 2], .scale = 1.0f}};
    }
    printf("%s %s, %dx%d, %d images (%d rows), %d threads; s per UNet call\n", model, a8 ? "W8A8" : "W8A16", size,
           size, n_lora, rows, threads);
    /* a first call of each: page the weights in, size the scratch */
    if (unet_seconds(g, one, rows, x, t, ctx, eps, &err) < 0 || unet_seconds(g, mixed, rows, x, t, ctx, eps, &err) < 0)
        return fprintf(stderr, "%s\n", err.message), 1;
    double ratio[99];
    for (int k = 0; k < rounds; k++) {
        /* alternate which side runs first, so neither always follows the other */
        bool mixed_first = k % 2;
        double a = unet_seconds(g, mixed_first ? mixed : one, rows, x, t, ctx, eps, &err);
        double b = a < 0 ? -1 : unet_seconds(g, mixed_first ? one : mixed, rows, x, t, ctx, eps, &err);
        if (b < 0) return fprintf(stderr, "%s\n", err.message), 1;
        double s_one = mixed_first ? b : a, s_mixed = mixed_first ? a : b;
        ratio[k] = s_one / s_mixed;
        printf("round %d: one adapter %.3f s, %d adapters %.3f s, mixed / one throughput %.3f\n", k + 1, s_one, n_lora,
               s_mixed, ratio[k]);
        fflush(stdout);
    }
    qsort(ratio, (size_t)rounds, sizeof *ratio, cmp_double);
    printf("median mixed / one throughput over %d rounds: %.3f (min %.3f, max %.3f)\n", rounds, ratio[rounds / 2],
           ratio[0], ratio[rounds - 1]);
    free(x);
    free(ctx);
    free(eps);
    lp_sd_graph_free(g);
    for (int i = 0; i < n_lora; i++) lp_sd_lora_free(loras[i]);
    lp_sd_weights_free(w);
    return 0;
}
