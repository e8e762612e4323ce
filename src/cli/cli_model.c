/* loraplex info / tokenize, and the option helpers every subcommand uses. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/base.h"
#include "../kernels/kernels.h"
#include "cli.h"

/* The kernel levels this process runs (LORAPLEX_CPU applied), for info and
 * bench; -1 (err set) when LORAPLEX_CPU is not a level. (Declared here and
 * in cli_bench.c rather than in cli.h.) */
int cli_kernels_line(char *buf, size_t cap, lp_error *err);

/* ---- option helpers ---------------------------------------------------------- */

bool cli_int(const char *opt, const char *text, long min, long max, long *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < min || v > max) {
        fprintf(stderr, "loraplex: %s expects an integer in [%ld, %ld], got '%s'\n", opt, min,
                max, text);
        return false;
    }
    *out = v;
    return true;
}

bool cli_float(const char *opt, const char *text, double min, double max, double *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !(v >= min && v <= max)) {
        fprintf(stderr, "loraplex: %s expects a number in [%g, %g], got '%s'\n", opt, min, max,
                text);
        return false;
    }
    *out = v;
    return true;
}

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "loraplex: option %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_fail(const char *what, const lp_error *err) {
    fprintf(stderr, "loraplex: %s: %s\n", what, err->message);
    return 1;
}

int cli_kernels_line(char *buf, size_t cap, lp_error *err) {
    int cpu_cap;
    if (lp_cpu_cap_from_env(&cpu_cap, err)) return -1;
    lp_cpu_features cpu;
    lp_cpu_detect(&cpu);
    lp_kernels k;
    lp_kernels_init_capped(&k, &cpu, cpu_cap);
    lp_kernels_describe(&k, buf, cap);
    return 0;
}

/* ---- info ------------------------------------------------------------------------ */

typedef struct type_tally {
    char type[16][8];
    long count[16];
    double params[16];
    int n;
    bool list;
} type_tally;

static void tally_weight(void *user, const char *name, const char *type, int64_t rows,
                         int64_t cols) {
    type_tally *t = user;
    if (t->list) printf("  %-28s %-6s %lld x %lld\n", name, type, (long long)rows, (long long)cols);
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->type[i], type)) {
            t->count[i]++;
            t->params[i] += (double)rows * (double)cols;
            return;
        }
    if (t->n == 16) return;
    snprintf(t->type[t->n], sizeof t->type[0], "%s", type);
    t->count[t->n] = 1;
    t->params[t->n++] = (double)rows * (double)cols;
}

int cli_info(int argc, char **argv) {
    const char *path = NULL, *tokenizer = NULL;
    type_tally tally = {0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer")) {
            if (!(tokenizer = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--tensors")) tally.list = true;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: loraplex info MODEL [--tokenizer PATH] [--tensors]\n");
            return 0;
        } else if (!path) path = argv[i];
        else {
            fprintf(stderr, "loraplex info: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: loraplex info MODEL [--tokenizer PATH] [--tensors]\n");
        return 2;
    }
    lp_error err = {0};
    char kernels[256];
    if (cli_kernels_line(kernels, sizeof kernels, &err)) return cli_fail("info", &err) + 1;
    lp_model_params mp = {.tokenizer_path = tokenizer};
    lp_model *model = lp_model_load(path, &mp, &err);
    if (!model) return cli_fail("cannot load model", &err);
    lp_model_info in;
    lp_model_get_info(model, &in);
    printf("file:          %s\n", path);
    printf("format:        %s\n", in.format);
    if (in.name[0]) printf("name:          %s\n", in.name);
    printf("architecture:  %s\n", in.arch);
    printf("parameters:    %llu (%.3f B)\n", (unsigned long long)in.n_params, in.n_params / 1e9);
    printf("weights:       %.2f MiB\n", in.weight_bytes / 1048576.0);
    printf("dim:           %d\n", in.dim);
    printf("layers:        %d\n", in.n_layers);
    printf("heads:         %d (KV heads %d, head dim %d)\n", in.n_heads, in.n_kv_heads, in.head_dim);
    printf("ffn dim:       %d\n", in.ffn_dim);
    printf("vocabulary:    %d (%s tokenizer)\n", in.n_vocab, in.tokenizer);
    printf("context:       %d\n", in.n_ctx_train);
    printf("rope:          theta %g, %s pairs%s\n", in.rope_theta,
           in.rope_neox ? "neox (i, i+d/2)" : "adjacent (2i, 2i+1)",
           in.rope_freq_factors ? ", llama3 frequency factors" : "");
    printf("rms eps:       %g\n", in.rms_eps);
    printf("output:        %s\n", in.tied_output ? "tied to the token embedding" : "separate");
    printf("chat template: %s\n", in.chat_format);
    printf("bos / eos:     %d / %d (add bos: %s)\n", lp_token_bos(model), lp_token_eos(model),
           lp_model_add_bos(model) ? "yes" : "no");
    printf("kernels:       %s\n", kernels);
    if (tally.list) printf("weights:\n");
    lp_model_foreach_weight(model, tally_weight, &tally);
    printf("tensor types: ");
    for (int i = 0; i < tally.n; i++)
        printf(" %s: %ld (%.1f M params)%s", tally.type[i], tally.count[i], tally.params[i] / 1e6,
               i + 1 < tally.n ? "," : "");
    printf("\n");
    lp_model_free(model);
    return 0;
}

/* ---- tokenize ------------------------------------------------------------------------ */

int cli_tokenize(int argc, char **argv) {
    const char *path = NULL, *text = NULL, *tokenizer = NULL;
    bool no_bos = false, special = false, ids_only = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer")) {
            if (!(tokenizer = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--no-bos")) no_bos = true;
        else if (!strcmp(argv[i], "--special")) special = true;
        else if (!strcmp(argv[i], "--ids")) ids_only = true;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: loraplex tokenize MODEL TEXT [--tokenizer PATH] [--no-bos] "
                   "[--special] [--ids]\n");
            return 0;
        } else if (!path) path = argv[i];
        else if (!text) text = argv[i];
        else {
            fprintf(stderr, "loraplex tokenize: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!path || !text) {
        fprintf(stderr, "usage: loraplex tokenize MODEL TEXT [--tokenizer PATH] [--no-bos] "
                        "[--special] [--ids]\n");
        return 2;
    }
    lp_error err = {0};
    lp_model_params mp = {.tokenizer_path = tokenizer};
    lp_model *model = lp_model_load(path, &mp, &err);
    if (!model) return cli_fail("cannot load model", &err);
    size_t len = strlen(text);
    int cap = (int)len + 8;
    int32_t *ids = malloc((size_t)cap * sizeof(int32_t));
    int n = ids ? lp_tokenize(model, text, len, !no_bos && lp_model_add_bos(model), special,
                              ids, cap, &err)
                : -1;
    if (n < 0 || n > cap) {
        free(ids);
        lp_model_free(model);
        return cli_fail("cannot tokenize", &err);
    }
    for (int i = 0; i < n; i++) {
        if (ids_only) {
            printf("%s%d", i ? " " : "", ids[i]);
            continue;
        }
        char piece[256];
        size_t pl = lp_token_to_piece(model, ids[i], piece, sizeof piece - 1);
        if (pl > sizeof piece - 1) pl = sizeof piece - 1;
        printf("%8d  '", ids[i]);
        for (size_t k = 0; k < pl; k++) {
            unsigned char c = (unsigned char)piece[k];
            if (c == '\n') printf("\\n");
            else if (c == '\t') printf("\\t");
            else if (c == '\'') printf("\\'");
            else if (c < 0x20) printf("\\x%02x", c);
            else putchar(c);
        }
        printf("'\n");
    }
    if (ids_only) printf("\n");
    fprintf(stderr, "%d tokens\n", n);
    free(ids);
    lp_model_free(model);
    return 0;
}
