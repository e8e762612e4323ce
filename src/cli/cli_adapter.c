/* loraplex adapter: inspect, compile (to .lpa) and merge LoRA adapters.
 * argv[0] is "adapter", argv[1] the action. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/dtype.h"
#include "../model/adapter.h"
#include "../tools/adapter_write.h"
#include "cli.h"

int cli_adapter(int argc, char **argv);

static void adapter_usage(FILE *out) {
    fprintf(out,
            "usage: loraplex adapter info PATH [-m BASE]\n"
            "       loraplex adapter compile INPUT --base BASE -o OUT.lpa|OUT.gguf [--dtype f16|f32|i8|i4]\n"
            "                                [--scale S]\n"
            "       loraplex adapter merge --base BASE.gguf --adapter PATH[:SCALE] [--adapter ...]\n"
            "                              -o MERGED.gguf\n"
            "PATH / INPUT: an .lpa file, a llama.cpp GGUF LoRA, or a PEFT directory\n"
            "(adapter_config.json + adapter_model.safetensors).\n"
            "  info     ranks and scales per projection, targets, size, base name\n"
            "           (-m BASE: validate against a base and show its conventions applied)\n"
            "  compile  validate against BASE and write the native .lpa (memory-mappable), or\n"
            "           with OUT.gguf a llama.cpp GGUF LoRA (f32 or f16) for the same base\n"
            "  merge    write BASE with W' = W + scale * B A of every adapter folded in (F32)\n");
}

/* A weight name with its numbers as '#': "blk.3.attn_q.weight" ->
 * "blk.#.attn_q.weight", so targets group across layers. */
static void name_shape(const char *name, char *out, size_t cap) {
    size_t n = 0;
    for (const char *c = name; *c && n + 1 < cap; c++) {
        if (*c >= '0' && *c <= '9') {
            while (c[1] >= '0' && c[1] <= '9') c++;
            out[n++] = '#';
        } else {
            out[n++] = *c;
        }
    }
    out[n] = 0;
}

static void print_info(const lp_adapter *a, const char *path) {
    printf("adapter:    %s\n", path);
    printf("name:       %s\n", a->name);
    printf("format:     %s\n", a->format);
    printf("base:       %s\n", a->base_name[0] ? a->base_name : "(unknown)");
    if (a->base)
        printf("fingerprint %016llx (validated against %s)\n",
               (unsigned long long)lp_model_fingerprint(a->base), a->base->path);
    printf("weights:    %d adapted\n", a->n_pairs);
    printf("max rank:   %d\n", a->max_rank);
    printf("bytes:      %llu\n", (unsigned long long)a->bytes);
    if (a->profile_id)
        printf("profile:    %016llx (codes of a shared quantization profile, docs/quad.md)\n",
               (unsigned long long)a->profile_id);
    printf("targets:   ");
    for (int i = 0; i < a->n_pairs; i++) {
        char shape[96], other[96];
        name_shape(a->pairs[i].name, shape, sizeof shape);
        bool seen = false;
        int n = 0;
        for (int j = 0; j < a->n_pairs; j++) {
            name_shape(a->pairs[j].name, other, sizeof other);
            if (strcmp(shape, other)) continue;
            seen |= j < i;
            n++;
        }
        if (!seen) printf(" %s(%d)", shape, n);
    }
    printf("\n\n%-40s rank  scale       type  in     out\n", "weight");
    for (int i = 0; i < a->n_pairs; i++) {
        const lp_lora_pair *pr = &a->pairs[i];
        printf("%-40s %-5d %-11.6g %-5s %-6lld %lld\n", pr->name, pr->rank, (double)pr->scale,
               a->profile_id ? "codes" : lp_dtype_name(pr->A.type), (long long)pr->A.cols, (long long)pr->B.rows);
    }
}

static int do_info(int argc, char **argv) {
    const char *path = NULL, *base_path = NULL;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--base")) {
            if (!(base_path = cli_value(argc, argv, &i))) return 2;
        } else if (!path && argv[i][0] != '-') {
            path = argv[i];
        } else {
            fprintf(stderr, "loraplex adapter info: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!path) {
        adapter_usage(stderr);
        return 2;
    }
    lp_error err = {0};
    lp_model *base = NULL;
    if (base_path && !(base = lp_model_load(base_path, NULL, &err))) return cli_fail("model", &err);
    lp_adapter *a = base ? lp_adapter_load(base, path, 1.0f, &err) : lp_adapter_inspect(path, &err);
    int rc = 0;
    if (!a) rc = cli_fail("adapter", &err);
    else print_info(a, path);
    lp_adapter_free(a);
    lp_model_free(base);
    return rc;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static int do_compile(int argc, char **argv) {
    const char *in = NULL, *base_path = NULL, *out = NULL;
    int dtype = -1;
    double scale = 1.0;
    for (int i = 2; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--base") || !strcmp(argv[i], "-m")) {
            if (!(base_path = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "-o")) {
            if (!(out = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--dtype")) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (!strcmp(v, "f16")) dtype = LP_F16;
            else if (!strcmp(v, "f32")) dtype = LP_F32;
            else if (!strcmp(v, "i8")) dtype = LP_W8;
            else if (!strcmp(v, "i4")) dtype = LP_W4;
            else {
                fprintf(stderr, "loraplex adapter compile: --dtype is f16, f32, i8 or i4, not '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(argv[i], "--scale")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_float("--scale", v, -1e6, 1e6, &scale))
                return 2;
        } else if (!in && argv[i][0] != '-') {
            in = argv[i];
        } else {
            fprintf(stderr, "loraplex adapter compile: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!in || !base_path || !out) {
        adapter_usage(stderr);
        return 2;
    }
    lp_error err = {0};
    lp_model *base = lp_model_load(base_path, NULL, &err);
    if (!base) return cli_fail("model", &err);
    lp_adapter *a = lp_adapter_load(base, in, (float)scale, &err);
    int rc = 0;
    if (!a) rc = cli_fail("adapter", &err);
    else if ((ends_with(out, ".gguf") ? lp_adapter_write_gguf(a, out, dtype, &err)
                                           : lp_adapter_write_lpa(a, out, dtype, &err)))
        rc = cli_fail("compile", &err);
    else
        fprintf(stderr, "loraplex: wrote %s (%d weights, max rank %d, %llu bytes of A/B)\n", out,
                a->n_pairs, a->max_rank, (unsigned long long)a->bytes);
    lp_adapter_free(a);
    lp_model_free(base);
    return rc;
}

/* "PATH[:SCALE]": the scale is taken only if what follows the last ':' parses. */
static bool split_scale(const char *arg, char *path, size_t cap, float *scale) {
    *scale = 1.0f;
    snprintf(path, cap, "%s", arg);
    char *colon = strrchr(path, ':');
    if (!colon || !colon[1]) return true;
    char *end;
    double v = strtod(colon + 1, &end);
    if (*end) return true;   /* a ':' in the path itself */
    if (!(v > -1e6 && v < 1e6)) return false;
    *colon = 0;
    *scale = (float)v;
    return true;
}

static int do_merge(int argc, char **argv) {
    const char *base_path = NULL, *out = NULL;
    const char *specs[64];
    int n = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--base") || !strcmp(argv[i], "-m")) {
            if (!(base_path = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "-o")) {
            if (!(out = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--adapter") || !strcmp(argv[i], "-a")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v) return 2;
            if (n == 64) {
                fprintf(stderr, "loraplex adapter merge: at most 64 adapters\n");
                return 2;
            }
            specs[n++] = v;
        } else {
            fprintf(stderr, "loraplex adapter merge: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!base_path || !out || n == 0) {
        adapter_usage(stderr);
        return 2;
    }
    lp_error err = {0};
    lp_model *base = lp_model_load(base_path, NULL, &err);
    if (!base) return cli_fail("model", &err);
    lp_adapter *ads[64] = {0};
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        char path[1024];
        float scale;
        if (!split_scale(specs[i], path, sizeof path, &scale)) {
            fprintf(stderr, "loraplex adapter merge: bad scale in '%s'\n", specs[i]);
            rc = 2;
        } else if (!(ads[i] = lp_adapter_load(base, path, scale, &err))) {
            rc = cli_fail("adapter", &err);
        }
    }
    if (rc == 0 && lp_adapter_merge(base, (const lp_adapter *const *)ads, n, out, &err))
        rc = cli_fail("merge", &err);
    if (rc == 0) fprintf(stderr, "loraplex: wrote %s (%d adapter%s merged)\n", out, n, n == 1 ? "" : "s");
    for (int i = 0; i < n; i++) lp_adapter_free(ads[i]);
    lp_model_free(base);
    return rc;
}

int cli_adapter(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        adapter_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            adapter_usage(stdout);
            return 0;
        }
    if (!strcmp(argv[1], "info")) return do_info(argc, argv);
    if (!strcmp(argv[1], "compile")) return do_compile(argc, argv);
    if (!strcmp(argv[1], "merge")) return do_merge(argc, argv);
    fprintf(stderr, "loraplex adapter: unknown action '%s'\n\n", argv[1]);
    adapter_usage(stderr);
    return 2;
}
