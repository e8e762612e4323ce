/* loraplex run: one continuation, or N concurrent variants (--streams), with
 * optional adapters (one for the whole run, or one per stream). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/base.h"
#include "cli.h"
#include "tools.h"

#define MAX_STREAMS 64
#define MAX_ADAPTERS 64

static void run_usage(FILE *out) {
    fprintf(out,
            "usage: loraplex run -m MODEL -p PROMPT [options]\n"
            "  -m, --model PATH        GGUF file, Hugging Face directory or llama2.c .bin\n"
            "      --tokenizer PATH    tokenizer .bin for llama2.c checkpoints\n"
            "  -p, --prompt TEXT       the prompt (or -f FILE)\n"
            "  -f, --file PATH         read the prompt from a file\n"
            "  -n, --n-predict N       tokens to generate per stream (default 128)\n"
            "      --temp T            temperature, 0 = greedy (default 0.8)\n"
            "      --top-k K           (default 40, 0 = off)\n"
            "      --top-p P           (default 0.95, 1 = off)\n"
            "      --min-p P           (default 0.05, 0 = off)\n"
            "      --repeat-penalty R  (default 1.0 = off)\n"
            "      --repeat-last-n N   tokens the penalty looks back (default 64)\n"
            "  -s, --seed S            RNG seed (default: from the clock, printed with -v);\n"
            "                          stream i uses S + i\n"
            "      --stop TEXT         stop when TEXT is generated (repeatable)\n"
            "  -t, --threads N         worker threads (default: all cores)\n"
            "  -c, --ctx N             KV capacity in tokens (default min(model, 4096))\n"
            "      --kv-f32            keep the KV cache in f32 (default f16: half the memory)\n"
            "      --huge-pages        read a .lpx model into 2 MiB pages (a copy) instead of\n"
            "                          using it in place from its memory map\n"
            "      --chat              wrap the prompt in the model's chat template\n"
            "      --system TEXT       system message for --chat\n"
            "      --no-bos            do not prepend BOS\n"
            "      --echo              print the prompt before the continuation\n"
            "      --adapter PATH[:S]  apply a LoRA adapter (.lpa, PEFT dir, GGUF LoRA) to the\n"
            "                          whole run, scaled by S (default 1)\n"
            "concurrent variants of one prompt (decoded together over one shared prompt):\n"
            "      --streams N         number of variants (default 1)\n"
            "      --seed-top          stream i starts from the i-th most likely first token\n"
            "      --seed-top-min-p P  ... and ends at once if that token's probability < P\n"
            "      --adapters A,B,...  stream i decodes with adapter i (PATH[:S] each)\n"
            "      --suffixes \"a|b|..\" stream i appends its own text after the prompt\n"
            "      --temps T1,T2,...   per-stream temperatures\n"
            "      --json              JSON lines: {\"stream\":i,\"text\":...} as produced, then\n"
            "                          {\"stream\":i,\"done\":true,\"stop\":...}\n"
            "speculative decoding (prints exactly the plain output, greedy or sampled with a --seed):\n"
            "      --speculate F.lpf   forecast embeddings (loraplex forecast-random, train-forecast);\n"
            "                          with --adapters, F1,F2,... one per stream (bound to its\n"
            "                          adapter's slot); each stream runs its own tree, in one batch\n"
            "      --tree B1,B2,...    candidates per depth from the forecast rows (default 3,2,\n"
            "                          cut to each file's k); 1,1,1,1 is a chain of 4; 0: no\n"
            "                          forecast rows (the file's corpus chain and --lookup only)\n"
            "      --lookup N[:L]      also propose the L tokens (default 8) that followed an\n"
            "                          earlier match of the last N..1 tokens (prompt lookup: up\n"
            "                          to two chains, docs/speculate.md); works without --speculate too\n"
            "      --ngram L           tokens drafted from the forecast file's corpus, where it\n"
            "                          has one (default 8; 0: none)\n"
            "      --costed            measure this machine's cost of a pass of R rows first,\n"
            "                          then place only the candidates worth their rows\n"
            "  -v, --verbose           print settings and timings to stderr\n");
}

typedef struct run_options {
    const char *model, *tokenizer, *prompt, *prompt_file, *system;
    const char *stop[16];
    int n_stop;
    long n_predict, threads, ctx, seed, streams;
    bool seed_set, chat, no_bos, echo, verbose, json, seed_top, kv_f32;
    bool huge_pages; /* lp_model_params.huge_pages */
    double seed_top_min_p;
    const char *adapter, *adapters, *suffixes, *temps;
    const char *speculate, *tree, *lookup;
    long ngram;      /* --ngram L: -1 unset (lp_speculate.ngram_len's default) */
    bool costed;
    lp_sampler_params sampling;
} run_options;

static int parse_run(int argc, char **argv, run_options *o) {
    memset(o, 0, sizeof *o);
    o->n_predict = 128;
    o->streams = 1;
    o->ngram = -1;
    o->sampling = lp_sampler_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        double d;
        long k;
#define VALUE() do { if (!(v = cli_value(argc, argv, &i))) return -1; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            run_usage(stdout);
            return 1;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VALUE(); o->model = v; }
        else if (!strcmp(a, "--tokenizer")) { VALUE(); o->tokenizer = v; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { VALUE(); o->prompt = v; }
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) { VALUE(); o->prompt_file = v; }
        else if (!strcmp(a, "--system")) { VALUE(); o->system = v; }
        else if (!strcmp(a, "--adapter")) { VALUE(); o->adapter = v; }
        else if (!strcmp(a, "--adapters")) { VALUE(); o->adapters = v; }
        else if (!strcmp(a, "--suffixes")) { VALUE(); o->suffixes = v; }
        else if (!strcmp(a, "--temps")) { VALUE(); o->temps = v; }
        else if (!strcmp(a, "--speculate")) { VALUE(); o->speculate = v; }
        else if (!strcmp(a, "--tree")) { VALUE(); o->tree = v; }
        else if (!strcmp(a, "--lookup")) { VALUE(); o->lookup = v; }
        else if (!strcmp(a, "--costed")) o->costed = true;
        else if (!strcmp(a, "--ngram")) {
            VALUE(); if (!cli_int(a, v, 0, LP_SPEC_MAX_NODES, &o->ngram)) return -1;
        }
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            VALUE(); if (!cli_int(a, v, 0, 1 << 24, &o->n_predict)) return -1;
        } else if (!strcmp(a, "--streams")) {
            VALUE(); if (!cli_int(a, v, 1, MAX_STREAMS, &o->streams)) return -1;
        } else if (!strcmp(a, "--temp")) {
            VALUE(); if (!cli_float(a, v, 0, 100, &d)) return -1;
            o->sampling.temperature = (float)d;
        } else if (!strcmp(a, "--top-k")) {
            VALUE(); if (!cli_int(a, v, 0, 1 << 24, &k)) return -1;
            o->sampling.top_k = (int)k;
        } else if (!strcmp(a, "--top-p")) {
            VALUE(); if (!cli_float(a, v, 1e-6, 1, &d)) return -1;
            o->sampling.top_p = (float)d;
        } else if (!strcmp(a, "--min-p")) {
            VALUE(); if (!cli_float(a, v, 0, 1, &d)) return -1;
            o->sampling.min_p = (float)d;
        } else if (!strcmp(a, "--seed-top-min-p")) {
            VALUE(); if (!cli_float(a, v, 0, 1, &o->seed_top_min_p)) return -1;
        } else if (!strcmp(a, "--repeat-penalty")) {
            VALUE(); if (!cli_float(a, v, 1e-3, 100, &d)) return -1;
            o->sampling.repeat_penalty = (float)d;
        } else if (!strcmp(a, "--repeat-last-n")) {
            VALUE(); if (!cli_int(a, v, 0, 1 << 20, &k)) return -1;
            o->sampling.repeat_last_n = (int)k;
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
        else if (!strcmp(a, "--kv-f32")) o->kv_f32 = true;
        else if (!strcmp(a, "--huge-pages")) o->huge_pages = true;
        else if (!strcmp(a, "--seed-top")) o->seed_top = true;
        else if (!strcmp(a, "--json")) o->json = true;
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

/* Splits s at sep into at most max parts (pointers into a copy the caller frees). */
static int split_list(const char *s, char sep, char **copy, char **parts, int max) {
    *copy = strdup(s ? s : "");
    if (!*copy) return -1;
    int n = 0;
    char *p = *copy;
    if (!s) return 0;
    for (;;) {
        if (n == max) return -1;
        parts[n++] = p;
        char *at = strchr(p, sep);
        if (!at) break;
        *at = 0;
        p = at + 1;
    }
    return n;
}

/* ---- output ----------------------------------------------------------------------- */

typedef struct printer {
    bool json, multi;
    char **texts;       /* per stream, for the grouped plain-text output */
    size_t *lens;
} printer;

static void json_string(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') printf("\\n");
        else if (c == '\t') printf("\\t");
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static bool print_text(void *user, int stream, const char *text, size_t len) {
    printer *p = user;
    if (p->json) {
        printf("{\"stream\":%d,\"text\":", stream);
        json_string(text, len);
        printf("}\n");
        fflush(stdout);
    } else if (!p->multi) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    } else {
        char *grown = realloc(p->texts[stream], p->lens[stream] + len + 1);
        if (!grown) return false;
        memcpy(grown + p->lens[stream], text, len);
        p->lens[stream] += len;
        grown[p->lens[stream]] = 0;
        p->texts[stream] = grown;
        fprintf(stderr, ".");
    }
    return true;
}

/* ---- the command ---------------------------------------------------------------------- */

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
    /* A first guess; byte-fallback vocabularies can need several tokens per
     * byte, then the exact count from the first call is used. */
    int cap = (int)(len + 16 < 1 << 28 ? len + 16 : 1 << 28), n = -1;
    int32_t *tokens = NULL;
    for (int attempt = 0; attempt < 2; attempt++) {
        free(tokens);
        tokens = malloc((size_t)cap * sizeof(int32_t));
        n = tokens ? lp_tokenize(model, text, len, add_bos, o->chat, tokens, cap, err)
                   : lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        if (n <= cap) break;
        cap = n;
    }
    lp_free(rendered);
    if (n < 0 || n > cap) {
        if (n > cap) lp_fail(err, "prompt too long");
        free(tokens);
        return NULL;
    }
    *n_out = n;
    return tokens;
}

/* ---- speculative decoding ----------------------------------------------------------------- */

/* --tree and --lookup into sp; k: the largest k of the forecast files
 * (0: none), whose depth each stream cuts to its own file's. */
static int parse_speculate(const run_options *o, int k, lp_speculate *sp) {
    *sp = lp_speculate_default();
    if (k > 0) {
        int def[2] = {3, 2}, n = 0;
        if (o->tree && !strcmp(o->tree, "0")) {
            /* no forecast rows: the file's corpus chain (and lookup) alone */
        } else if (o->tree) {
            const char *p = o->tree;
            while (*p) {
                char *end;
                long b = strtol(p, &end, 10);
                if (end == p || b < 1 || b > LP_SPEC_MAX_NODES || n == LP_SPEC_MAX_DEPTH) {
                    fprintf(stderr, "loraplex run: --tree wants up to %d counts 1..%d, like 3,2\n", LP_SPEC_MAX_DEPTH,
                            LP_SPEC_MAX_NODES);
                    return -1;
                }
                sp->branches[n++] = (int)b;
                p = *end == ',' ? end + 1 : end;
                if (*end && *end != ',') {
                    fprintf(stderr, "loraplex run: --tree: bad list '%s'\n", o->tree);
                    return -1;
                }
            }
        } else {
            for (; n < 2; n++) sp->branches[n] = def[n];
        }
        sp->depth = n < k ? n : k;
        if (o->ngram >= 0) sp->ngram_len = o->ngram ? (int)o->ngram : -1;
    } else if (o->tree) {
        fprintf(stderr, "loraplex run: --tree needs --speculate F.lpf\n");
        return -1;
    }
    if (o->lookup) {
        char *end;
        long g = strtol(o->lookup, &end, 10), len = 8;
        if (*end == ':') len = strtol(end + 1, &end, 10);
        if (*end || g < 1 || g > 16 || len < 1 || len > LP_SPEC_MAX_NODES) {
            fprintf(stderr, "loraplex run: --lookup wants N (1..16) or N:L (L 1..%d)\n", LP_SPEC_MAX_NODES);
            return -1;
        }
        sp->lookup_ngram = (int)g;
        sp->lookup_len = (int)len;
    }
    return 0;
}

/* The tree a stream runs (lp_speculate_for_slot's settings). */
static void tree_text(const lp_speculate *sp, char *buf, size_t cap) {
    const lp_forecast *f = sp->forecast;
    size_t n = 0;
    buf[0] = 0;
    if (sp->depth > 0) {
        n += (size_t)snprintf(buf + n, cap - n, "forecast [");
        for (int d = 0; d < sp->depth && n < cap; d++)
            n += (size_t)snprintf(buf + n, cap - n, "%s%d", d ? "," : "", sp->branches[d]);
        if (n < cap) n += (size_t)snprintf(buf + n, cap - n, "]");
    }
    if (f && lp_forecast_corpus_size(f) && sp->ngram_len >= 0 && n < cap)
        n += (size_t)snprintf(buf + n, cap - n, "%sn-gram %d", n ? " + " : "", sp->ngram_len ? sp->ngram_len : 8);
    if (sp->lookup_ngram > 0 && n < cap)
        n += (size_t)snprintf(buf + n, cap - n, "%slookup %d:%d", n ? " + " : "", sp->lookup_ngram, sp->lookup_len);
    if (n == 0) snprintf(buf, cap, "none");
}

/* Loads the --speculate files: one for every stream (sp->forecast), or one
 * per stream bound to its adapter's slot (1..n); then --tree and --lookup. */
static int load_forecasts(const lp_model *model, lp_context *ctx, const run_options *o, char **paths, int n,
                          lp_forecast **out, lp_speculate *sp) {
    lp_error err = {0};
    int k = 0;
    for (int i = 0; i < n; i++) {
        out[i] = lp_forecast_load(paths[i], &err);
        if (!out[i] || lp_forecast_check(out[i], model, &err) ||
            (n > 1 && lp_context_bind_forecast(ctx, i + 1, out[i], &err)))
            return cli_fail(paths[i], &err);
        if (lp_forecast_k(out[i]) > k) k = lp_forecast_k(out[i]);
        if (o->verbose)
            fprintf(stderr, "loraplex: forecast %s: k %d, trained for %s\n", paths[i], lp_forecast_k(out[i]),
                    lp_forecast_adapter_name(out[i])[0] ? lp_forecast_adapter_name(out[i]) : "the base");
    }
    if (parse_speculate(o, k, sp)) return 2;
    if (n == 1) sp->forecast = out[0];
    return 0;
}

static void json_speculation(const lp_context *ctx, const lp_speculate *sp, int slot, const lp_spec_stats *s,
                             const lp_generate_stats *st) {
    lp_speculate t = lp_speculate_for_slot(ctx, sp, slot);
    char tree[128];
    tree_text(&t, tree, sizeof tree);
    printf(",\"speculate\":{\"forward_passes\":%d,\"decode_passes\":%d,\"tokens_per_pass\":%.3f,\"drafted\":%d,"
           "\"accepted\":%d,\"tree_rows\":%d,\"forecast_rows\":%d,\"tree\":\"%s\"}",
           st->steps, s->n_passes, s->n_passes ? (double)s->n_generated / s->n_passes : 0.0, s->n_drafted,
           s->n_accepted, s->n_tree_rows, s->n_forecast_rows, tree);
}

static void report_speculation(const lp_context *ctx, const lp_speculate *sp, const lp_stream *streams,
                               int n_streams, const lp_stream_stats *ss, const lp_generate_stats *st) {
    for (int i = 0; i < n_streams; i++) {
        lp_speculate t = lp_speculate_for_slot(ctx, sp, streams[i].adapter);
        char tree[128];
        tree_text(&t, tree, sizeof tree);
        const lp_spec_stats *s = &ss[i].spec;
        char who[32] = "";
        if (n_streams > 1) snprintf(who, sizeof who, "stream %d: ", i);
        fprintf(stderr,
                "loraplex: %sspeculative (%s): %d tokens in %d passes that produced tokens (%.2f tokens per pass); "
                "%d of %d drafted tokens accepted; %d tree rows, %d forecast rows\n",
                who, tree, s->n_generated, s->n_passes,
                s->n_passes ? (double)s->n_generated / s->n_passes : 0.0, s->n_accepted, s->n_drafted,
                s->n_tree_rows, s->n_forecast_rows);
    }
    fprintf(stderr, "loraplex: %d forward passes in all\n", st->steps);
}

int cli_run(int argc, char **argv) {
    run_options o;
    int rc = parse_run(argc, argv, &o);
    if (rc) return rc > 0 ? 0 : 2;
    lp_error err = {0};
    char *file_text = NULL, *adapters_copy = NULL, *suffix_copy = NULL, *temps_copy = NULL;
    char *adapter_specs[MAX_ADAPTERS], *suffix_list[MAX_STREAMS], *temp_list[MAX_STREAMS];
    lp_adapter *adapters[MAX_ADAPTERS + 1] = {0};
    lp_sampler *samplers[MAX_STREAMS] = {0};
    lp_stream streams[MAX_STREAMS];
    int n_streams = (int)o.streams, n_adapters = 0;
    lp_model *model = NULL;
    lp_context *ctx = NULL;
    lp_forecast *forecasts[MAX_STREAMS] = {0};
    char *forecast_copy = NULL, *forecast_list[MAX_STREAMS];
    bool speculate = o.speculate || o.lookup;
    lp_speculate sp = lp_speculate_default();
    int32_t *prompt = NULL;
    printer out = {o.json, n_streams > 1 && !o.json, NULL, NULL};

    int n_suffix = split_list(o.suffixes, '|', &suffix_copy, suffix_list, MAX_STREAMS);
    int n_temps = split_list(o.temps, ',', &temps_copy, temp_list, MAX_STREAMS);
    n_adapters = split_list(o.adapters, ',', &adapters_copy, adapter_specs, MAX_ADAPTERS);
    int n_forecasts = split_list(o.speculate, ',', &forecast_copy, forecast_list, MAX_STREAMS);
    rc = 2;
    if (n_suffix < 0 || n_temps < 0 || n_adapters < 0 || n_forecasts < 0) {
        fprintf(stderr, "loraplex run: too many entries in a list option\n");
        goto out;
    }
    if ((o.suffixes && n_suffix != n_streams) || (o.temps && n_temps != n_streams) ||
        (o.adapters && n_adapters != n_streams)) {
        fprintf(stderr, "loraplex run: --suffixes, --temps and --adapters need one entry per "
                        "stream (%d)\n", n_streams);
        goto out;
    }
    if (n_forecasts > 1 && (n_forecasts != n_streams || !o.adapters)) {
        fprintf(stderr, "loraplex run: --speculate F1,F2,... wants one file per stream, with --adapters (else "
                        "one file for all streams)\n");
        goto out;
    }
    rc = 1;
    const char *text = o.prompt;
    if (o.prompt_file) {
        size_t len;
        if (lp_read_file(o.prompt_file, &file_text, &len, 64u << 20, &err)) {
            rc = cli_fail("prompt", &err);
            goto out;
        }
        text = file_text;
    }
    if (!o.seed_set) o.seed = (long)time(NULL);

    double t0 = lp_now_seconds();
    lp_model_params mp = {.tokenizer_path = o.tokenizer, .huge_pages = o.huge_pages};
    model = lp_model_load(o.model, &mp, &err);
    if (!model) {
        rc = cli_fail("cannot load model", &err);
        goto out;
    }
    double t_load = lp_now_seconds() - t0;
    int n_prompt = 0;
    prompt = prompt_tokens(model, &o, text, &n_prompt, &err);
    if (!prompt) {
        rc = cli_fail("cannot tokenize the prompt", &err);
        goto out;
    }
    lp_context_params cp = lp_context_default_params();
    cp.n_threads = (int)o.threads;
    cp.kv_f32 = o.kv_f32;
    cp.max_sequences = n_streams;
    cp.n_ctx = (int)(o.ctx ? o.ctx : 0);
    if (!cp.n_ctx) {
        /* room for the prompt once and every stream's own tokens */
        long need = n_prompt + 64 + (long)n_streams * (o.n_predict + 64);
        cp.n_ctx = (int)(need < 4096 ? 4096 : need);
    }
    cp.max_seq_len = n_prompt + (int)o.n_predict + 256;
    cp.max_adapters = n_adapters + 1;
    /* trees and forecast rows ask for logits: 30 a stream for the tree {3, 2} */
    if (speculate) cp.max_logit_rows = n_streams < 8 ? 64 + 64 * n_streams : 512;
    ctx = lp_context_create(model, &cp, &err);
    if (!ctx) {
        rc = cli_fail("cannot create context", &err);
        goto out;
    }
    /* slot 1..n: per-stream adapters; slot n+1: the whole-run adapter */
    for (int i = 0; i < n_adapters + (o.adapter ? 1 : 0); i++) {
        char spec[1024];
        snprintf(spec, sizeof spec, "%s", i < n_adapters ? adapter_specs[i] : o.adapter);
        double ta = lp_now_seconds();
        adapters[i] = tool_load_adapter(model, spec, &err);
        if (!adapters[i] || lp_context_bind_adapter(ctx, i + 1, adapters[i], &err)) {
            rc = cli_fail(spec, &err);
            goto out;
        }
        if (o.verbose)
            fprintf(stderr, "loraplex: adapter %s (%.1f MiB) loaded in %.1f ms\n", spec,
                    lp_adapter_bytes(adapters[i]) / 1048576.0, (lp_now_seconds() - ta) * 1e3);
    }
    int whole_run_slot = o.adapter ? n_adapters + 1 : 0;
    for (int i = 0; i < n_streams; i++) {
        lp_sampler_params sp = o.sampling;
        sp.seed = (uint64_t)o.seed + (uint64_t)i;
        if (o.temps) {
            double t;
            if (!cli_float("--temps", temp_list[i], 0, 100, &t)) {
                rc = 2;
                goto out;
            }
            sp.temperature = (float)t;
        }
        samplers[i] = lp_sampler_create(model, &sp, &err);
        if (!samplers[i]) {
            rc = cli_fail("sampler", &err);
            goto out;
        }
        streams[i] = (lp_stream){o.suffixes ? suffix_list[i] : NULL,
                                 o.adapters ? i + 1 : whole_run_slot, samplers[i], -1};
    }
    if (o.verbose)
        fprintf(stderr, "loraplex: %d prompt tokens, %d stream(s), seed %ld, load %.0f ms\n",
                n_prompt, n_streams, o.seed, t_load * 1e3);
    if (out.multi) {
        out.texts = calloc((size_t)n_streams, sizeof(char *));
        out.lens = calloc((size_t)n_streams, sizeof(size_t));
        if (!out.texts || !out.lens) goto out;
    }
    if (o.echo && !o.json) fputs(text, stdout);

    if (speculate && (rc = load_forecasts(model, ctx, &o, forecast_list, n_forecasts, forecasts, &sp)) != 0)
        goto out;
    if (speculate && o.costed && lp_speculate_measure_cost(ctx, n_prompt, sp.pass_cost, LP_SPEC_COST_ROWS, &err)) {
        rc = cli_fail("run --costed", &err);
        goto out;
    }
    lp_generate_params gp = lp_generate_default_params();
    gp.n_predict = (int)o.n_predict;
    gp.stop = o.stop;
    gp.n_stop = o.n_stop;
    gp.prefix_adapter = whole_run_slot;
    gp.seed_top = o.seed_top ? n_streams : 0;
    gp.seed_top_min_prob = (float)o.seed_top_min_p;
    if (speculate) gp.speculate = &sp;
    lp_stream_stats ss[MAX_STREAMS];
    lp_generate_stats st;
    if (lp_generate_streams(ctx, prompt, n_prompt, streams, n_streams, &gp, print_text, &out, ss,
                            &st, &err)) {
        rc = cli_fail("generation failed", &err);
        goto out;
    }
    for (int i = 0; i < n_streams; i++) {
        if (o.json) {
            printf("{\"stream\":%d,\"done\":true,\"tokens\":%d,\"stop\":\"%s\"", i, ss[i].n_generated,
                   ss[i].stop_reason);
            if (speculate) json_speculation(ctx, &sp, streams[i].adapter, &ss[i].spec, &st);
            printf("}\n");
        } else if (out.multi) {
            printf("%s=== stream %d", i ? "\n" : "", i);
            if (o.adapters) printf(" (adapter %s)", adapter_specs[i]);
            if (o.suffixes) printf(" (suffix \"%s\")", suffix_list[i]);
            printf(" ===\n%s%s\n", o.echo ? text : "", out.texts[i] ? out.texts[i] : "");
        }
    }
    if (!o.json && !out.multi) printf("\n");
    if (out.multi) fprintf(stderr, "\n");
    fprintf(stderr,
            "loraplex: prompt %d tokens (%d from cache) in %.1f ms (%.1f tok/s); %d stream(s), "
            "%d tokens in %.1f ms (%.1f tok/s, %d steps), stop: %s\n",
            st.n_prompt, st.n_reused, st.prefill_seconds * 1e3,
            st.prefill_seconds > 0 ? (st.n_prompt - st.n_reused) / st.prefill_seconds : 0.0,
            n_streams, st.n_generated, st.decode_seconds * 1e3,
            st.decode_seconds > 0 ? st.n_generated / st.decode_seconds : 0.0,
            st.decode_steps, st.stop_reason);
    if (speculate && o.verbose) report_speculation(ctx, &sp, streams, n_streams, ss, &st);
    rc = 0;
out:
    if (out.texts)
        for (int i = 0; i < n_streams; i++) free(out.texts[i]);
    free(out.texts);
    free(out.lens);
    free(prompt);
    for (int i = 0; i < n_streams; i++) lp_sampler_free(samplers[i]);
    lp_context_free(ctx);
    for (int i = 0; i < MAX_STREAMS; i++) lp_forecast_free(forecasts[i]);
    for (int i = 0; i <= MAX_ADAPTERS; i++) lp_adapter_free(adapters[i]);
    lp_model_free(model);
    free(file_text);
    free(adapters_copy);
    free(suffix_copy);
    free(temps_copy);
    free(forecast_copy);
    return rc;
}
