/* loraplex forecast-random: a forecast-embedding file (.lpf) of random
 * embeddings for a model, for tests and as the "no training" baseline of
 * speculative decoding (acceptance near zero; output still exact). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/base.h"
#include "cli.h"

static void forecast_usage(FILE *out) {
    fprintf(out, "usage: loraplex forecast-random --model M -k K -o F.lpf [--seed S] [--scale X]\n"
                 "                                [--adapter-name NAME]\n"
                 "  k random embeddings N(0, X^2) (default X 0.5) of the model's width, recording\n"
                 "  its fingerprint and vocabulary (and NAME as the adapter they are meant for)\n");
}

int cli_forecast_random(int argc, char **argv) {
    const char *model_path = NULL, *out_path = NULL, *name = NULL;
    long k = 4, seed = 1;
    double scale = 0.5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            forecast_usage(stdout);
            return 0;
        }
        if (!(v = cli_value(argc, argv, &i))) return 2;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model_path = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--out")) out_path = v;
        else if (!strcmp(a, "--adapter-name")) name = v;
        else if (!strcmp(a, "-k")) { if (!cli_int(a, v, 1, 64, &k)) return 2; }
        else if (!strcmp(a, "-s") || !strcmp(a, "--seed")) { if (!cli_int(a, v, 0, __LONG_MAX__, &seed)) return 2; }
        else if (!strcmp(a, "--scale")) { if (!cli_float(a, v, 0, 100, &scale)) return 2; }
        else {
            fprintf(stderr, "loraplex forecast-random: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (!model_path || !out_path) {
        forecast_usage(stderr);
        return 2;
    }
    lp_error err = {0};
    lp_model *m = lp_model_load(model_path, NULL, &err);
    if (!m) return cli_fail(model_path, &err);
    lp_model_info info;
    lp_model_get_info(m, &info);
    float *e = malloc((size_t)k * (size_t)info.dim * sizeof *e);
    int rc = 1;
    if (e) {
        lp_rng rng;
        lp_rng_seed(&rng, (uint64_t)seed);
        for (long i = 0; i < k * info.dim; i++) e[i] = (float)scale * lp_rng_normal(&rng);
        lp_forecast *f = lp_forecast_create(m, (int)k, e, name, &err);
        if (!f || lp_forecast_save(f, out_path, &err)) {
            rc = cli_fail(out_path, &err);
        } else {
            fprintf(stderr, "loraplex: %s: %ld random forecast embeddings of %d (seed %ld, scale %g)\n", out_path, k,
                    info.dim, seed, scale);
            rc = 0;
        }
        lp_forecast_free(f);
    }
    free(e);
    lp_model_free(m);
    return rc;
}
