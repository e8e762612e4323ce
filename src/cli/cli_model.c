/* loraplex run / info / tokenize. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/base.h"
#include "cli.h"

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

/* ---- run ------------------------------------------------------------------------ */

static void run_usage(FILE *out) {
    fprintf(out,
            "usage: loraplex run -m MODEL -p PROMPT [options]\n"
            "  -m, --model PATH        GGUF file, Hugging Face directory or llama2.c .bin\n"
            "      --tokenizer PATH    tokenizer .bin for llama2.c checkpoints\n"
            "  -p, --prompt TEXT       the prompt (or -f FILE)\n"
            "  -f, --file PATH         read the prompt from a file\n"
            "  -n, --n-predict N       tokens to generate (default 128)\n"
            "      --temp T            temperature, 0 = greedy (default 0.8)\n"
            "      --top-k K           (default 40, 0 = off)\n"
            "      --top-p P           (default 0.95, 1 = off)\n"
            "      --min-p P           (default 0.05, 0 = off)\n"
            "      --repeat-penalty R  (default 1.0 = off)\n"
            "      --repeat-last-n N   tokens the penalty looks back (default 64)\n"
            "  -s, --seed S            RNG seed (default: from the clock, printed)\n"
            "      --stop TEXT         stop when TEXT is generated (repeatable)\n"
            "  -t, --threads N         worker threads (default: all cores)\n"
            "  -c, --ctx N             context length in tokens (default min(model, 4096))\n"
            "      --chat              wrap the prompt in the model's chat template\n"
            "      --system TEXT       system message for --chat\n"
            "      --no-bos            do not prepend BOS\n"
            "      --echo              print the prompt before the continuation\n"
            "  -v, --verbose           print timings and settings to stderr\n");
}

typedef struct run_options {
    const char *model, *tokenizer, *prompt, *prompt_file, *system;
    const char *stop[16];
    int n_stop;
    long n_predict, threads, ctx, seed;
    bool seed_set, chat, no_bos, echo, verbose;
    lp_sampler_params sampling;
} run_options;

static int parse_run(int argc, char **argv, run_options *o) {
    memset(o, 0, sizeof *o);
    o->n_predict = 128;
    o->sampling = lp_sampler_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        double d;
#define VALUE() do { if (!(v = cli_value(argc, argv, &i))) return -1; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            run_usage(stdout);
            return 1;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VALUE(); o->model = v; }
        else if (!strcmp(a, "--tokenizer")) { VALUE(); o->tokenizer = v; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { VALUE(); o->prompt = v; }
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) { VALUE(); o->prompt_file = v; }
        else if (!strcmp(a, "--system")) { VALUE(); o->system = v; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            VALUE(); if (!cli_int(a, v, 0, 1 << 24, &o->n_predict)) return -1;
        } else if (!strcmp(a, "--temp")) {
            VALUE(); if (!cli_float(a, v, 0, 100, &d)) return -1;
            o->sampling.temperature = (float)d;
        } else if (!strcmp(a, "--top-k")) {
            long k; VALUE(); if (!cli_int(a, v, 0, 1 << 24, &k)) return -1;
            o->sampling.top_k = (int)k;
        } else if (!strcmp(a, "--top-p")) {
            VALUE(); if (!cli_float(a, v, 1e-6, 1, &d)) return -1;
            o->sampling.top_p = (float)d;
        } else if (!strcmp(a, "--min-p")) {
            VALUE(); if (!cli_float(a, v, 0, 1, &d)) return -1;
            o->sampling.min_p = (float)d;
        } else if (!strcmp(a, "--repeat-penalty")) {
            VALUE(); if (!cli_float(a, v, 1e-3, 100, &d)) return -1;
            o->sampling.repeat_penalty = (float)d;
        } else if (!strcmp(a, "--repeat-last-n")) {
            long n; VALUE(); if (!cli_int(a, v, 0, 1 << 20, &n)) return -1;
            o->sampling.repeat_last_n = (int)n;
        } else if (!strcmp(a, "-s") || !strcmp(a, "--seed")) {
            VALUE(); if (!cli_int(a, v, 0, __LONG_MAX__, &o->seed)) return -1;
            o->seed_set = true;
        } else if (!strcmp(a, "--stop")) {
            VALUE();
            if (o->n_stop == 16) { fprintf(stderr, "loraplex: at most 16 --stop strings\n"); return -1; }
            o->stop[o->n_stop++] = v;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            VALUE(); if (!cli_int(a, v, 1, 256, &o->threads)) return -1;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) {
            VALUE(); if (!cli_int(a, v, 8, 1 << 24, &o->ctx)) return -1;
        } else if (!strcmp(a, "--chat")) o->chat = true;
        else if (!strcmp(a, "--no-bos")) o->no_bos = true;
        else if (!strcmp(a, "--echo")) o->echo = true;
        else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) o->verbose = true;
        else {
            fprintf(stderr, "loraplex run: unknown option '%s' (see --help)\n", a);
            return -1;
        }
#undef VALUE
    }
    if (!o->model) {
        fprintf(stderr, "loraplex run: -m MODEL is required (see --help)\n");
        return -1;
    }
    if (!o->prompt && !o->prompt_file) {
        fprintf(stderr, "loraplex run: -p PROMPT or -f FILE is required\n");
        return -1;
    }
    return 0;
}

static bool write_stdout(void *user, const char *text, size_t len) {
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return true;
}

/* The prompt's tokens: plain text, or the chat template rendered around it. */
static int32_t *prompt_tokens(const lp_model *model, const run_options *o, const char *text,
                              int *n_out, lp_error *err) {
    char *rendered = NULL;
    if (o->chat) {
        lp_message msgs[2];
        int n = 0;
        if (o->system) msgs[n++] = (lp_message){"system", o->system};
        msgs[n++] = (lp_message){"user", text};
        rendered = lp_chat_apply(model, msgs, n, true, err);
        if (!rendered) return NULL;
        text = rendered;
    }
    bool add_bos = !o->no_bos && lp_model_add_bos(model);
    size_t len = strlen(text);
    int cap = (int)(len + 16 < 1 << 30 ? len + 16 : 1 << 30);
    int32_t *tokens = malloc((size_t)cap * sizeof(int32_t));
    int n = tokens ? lp_tokenize(model, text, len, add_bos, o->chat, tokens, cap, err)
                   : lp_fail(err, "out of memory");
    free(rendered);
    if (n < 0 || n > cap) {
        if (n > cap) lp_fail(err, "prompt too long");
        free(tokens);
        return NULL;
    }
    *n_out = n;
    return tokens;
}

int cli_run(int argc, char **argv) {
    run_options o;
    int rc = parse_run(argc, argv, &o);
    if (rc) return rc > 0 ? 0 : 2;
    lp_error err = {{0}};
    char *file_text = NULL;
    const char *text = o.prompt;
    if (o.prompt_file) {
        size_t len;
        if (lp_read_file(o.prompt_file, &file_text, &len, 64u << 20, &err))
            return cli_fail("prompt", &err);
        text = file_text;
    }
    if (!o.seed_set) o.seed = (long)time(NULL);
    o.sampling.seed = (uint64_t)o.seed;

    double t0 = lp_now_seconds();
    lp_model_params mp = {o.tokenizer};
    lp_model *model = lp_model_load(o.model, &mp, &err);
    if (!model) {
        free(file_text);
        return cli_fail("cannot load model", &err);
    }
    double t_load = lp_now_seconds() - t0;
    int n_prompt = 0;
    int32_t *prompt = prompt_tokens(model, &o, text, &n_prompt, &err);
    free(file_text);
    lp_context_params cp = lp_context_default_params();
    cp.n_threads = (int)o.threads;
    cp.max_sequences = 1;
    cp.n_ctx = (int)o.ctx;
    lp_context *ctx = prompt ? lp_context_create(model, &cp, &err) : NULL;
    lp_sampler *sampler = ctx ? lp_sampler_create(model, &o.sampling, &err) : NULL;
    if (!sampler) {
        rc = cli_fail(prompt ? "cannot start" : "cannot tokenize the prompt", &err);
        goto out;
    }
    if (o.verbose)
        fprintf(stderr, "loraplex: %d prompt tokens, seed %ld, load %.0f ms\n", n_prompt,
                o.seed, t_load * 1e3);
    if (o.echo) write_stdout(NULL, text, strlen(text));
    lp_generate_params gp = lp_generate_default_params();
    gp.n_predict = (int)o.n_predict;
    gp.stop = o.stop;
    gp.n_stop = o.n_stop;
    lp_generate_stats st;
    if (lp_generate(ctx, sampler, prompt, n_prompt, &gp, write_stdout, NULL, NULL, 0, &st,
                    &err)) {
        rc = cli_fail("generation failed", &err);
        goto out;
    }
    printf("\n");
    fprintf(stderr,
            "loraplex: prompt %d tokens in %.1f ms (%.1f tok/s), generated %d tokens in "
            "%.1f ms (%.1f tok/s), stop: %s\n",
            st.n_prompt, st.prefill_seconds * 1e3,
            st.prefill_seconds > 0 ? st.n_prompt / st.prefill_seconds : 0.0, st.n_generated,
            st.decode_seconds * 1e3,
            st.decode_seconds > 0 ? (st.n_generated > 1 ? st.n_generated - 1 : 0) / st.decode_seconds : 0.0,
            st.stop_reason);
    rc = 0;
out:
    free(prompt);
    lp_sampler_free(sampler);
    lp_context_free(ctx);
    lp_model_free(model);
    return rc;
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
    lp_error err = {{0}};
    lp_model_params mp = {tokenizer};
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
    lp_error err = {{0}};
    lp_model_params mp = {tokenizer};
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
