/* loraplex eval: perplexity of a model on a text, and with --ref the
 * distance of its next-token distributions from a reference model's (the
 * measures of llama.cpp's `perplexity --kl-divergence`).
 *
 * Method (as llama.cpp's perplexity): the text is tokenized without BOS and
 * cut into chunks of C tokens; if the model adds BOS, the first token of
 * each chunk is replaced by BOS. Each chunk is one forward (a chain of rows
 * of one sequence). Only the second half of each chunk is scored: the
 * logits of rows C/2 .. C-2 predict tokens C/2+1 .. C-1, so every scored
 * token has at least C/2 tokens of context. Logits are requested only for
 * those rows.
 *
 * Only the public API is used; this file does not depend on the rest of the
 * CLI so the tests can include it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/base.h"
#include "tools.h"

int cli_eval(int argc, char **argv);

typedef struct eval_options {
    const lp_adapter *adapter, *ref_adapter; /* bound to slot 1 of each side, or NULL */
    int chunk_tokens;   /* C */
    int max_chunks;     /* 0 = all */
    int threads;        /* 0 = all cores */
    bool kv_f32;        /* both sides keep their KV cache in f32 */
} eval_options;

typedef struct eval_result {
    int n_chunks, chunk_tokens, n_scored;
    double ppl, ref_ppl;
    bool has_ref;
    double kl_mean, kl_median, kl_p99, kl_max;   /* KL(ref || model), nats per token */
    double same_top_pct;                         /* argmax agrees, % of positions */
    /* Δp: probability of the text's next token, model minus reference (llama.cpp's Δp) */
    double dp_mean, dp_rms, dp_min, dp_max;
    /* the same for the reference's top token */
    double top_dp_rms, top_dp_max_abs;
    double seconds;
} eval_result;

/* Both models must cut text the same way: same vocabulary size and the
 * same text for a sample of token ids. */
static int eval_same_vocab(const lp_model *a, const lp_model *b, lp_error *err) {
    lp_model_info ia, ib;
    lp_model_get_info(a, &ia);
    lp_model_get_info(b, &ib);
    if (ia.n_vocab != ib.n_vocab)
        return lp_fail(err, "the models have different vocabularies (%d vs %d tokens)",
                       ia.n_vocab, ib.n_vocab);
    int n = ia.n_vocab, step = n > 256 ? n / 128 : 1;
    for (int id = 0; id < n; id += (id < 64 ? 1 : step)) {
        char pa[64], pb[64];
        size_t la = lp_token_to_piece(a, id, pa, sizeof pa);
        size_t lb = lp_token_to_piece(b, id, pb, sizeof pb);
        size_t cmp = la < sizeof pa ? la : sizeof pa;
        if (la != lb || memcmp(pa, pb, cmp))
            return lp_fail(err, "the models have different tokenizers (token %d differs)", id);
    }
    return 0;
}

/* Tokens of text without BOS; malloc'd array in *out. */
static int eval_tokenize(const lp_model *model, const char *text, size_t len, int32_t **out,
                         int *n_out, lp_error *err) {
    if (len > (size_t)1 << 30) return lp_fail(err, "text too long (%zu bytes)", len);
    int cap = (int)len + 16;
    int32_t *tokens = malloc((size_t)cap * sizeof *tokens);
    if (!tokens) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    int n = lp_tokenize(model, text, len, false, false, tokens, cap, err);
    if (n < 0 || n > cap) {
        if (n > cap) lp_fail(err, "tokenizer returned more tokens than bytes");
        free(tokens);
        return -1;
    }
    *out = tokens;
    *n_out = n;
    return 0;
}

/* A context for one side; its rows use `adapter` (NULL: the base alone). */
static lp_context *eval_context(const lp_model *model, const lp_adapter *adapter, const eval_options *o,
                                lp_error *err) {
    lp_context_params cp = lp_context_default_params();
    cp.n_threads = o->threads;
    cp.kv_f32 = o->kv_f32;
    cp.max_rows = o->chunk_tokens;
    cp.max_logit_rows = o->chunk_tokens;
    cp.max_sequences = 1;
    cp.n_ctx = o->chunk_tokens;
    cp.max_seq_len = o->chunk_tokens;
    cp.max_adapters = 1;
    lp_context *ctx = lp_context_create(model, &cp, err);
    if (ctx && adapter && lp_context_bind_adapter(ctx, 1, adapter, err)) {
        lp_context_free(ctx);
        return NULL;
    }
    return ctx;
}

/* One chunk through one model: rows 0..C-1 chained, logits for rows >= first. */
static int eval_chunk(lp_context *ctx, lp_row *rows, const int32_t *chunk, int c, int first,
                      int32_t bos, bool adapter, lp_error *err) {
    for (int i = 0; i < c; i++)
        rows[i] = (lp_row){.token = i == 0 && bos >= 0 ? bos : chunk[i], .pos = i, .seq = 0, .adapter = adapter ? 1 : 0, .parent = i - 1, .logits = i >= first && i < c - 1, .commit = false};
    lp_seq_clear(ctx, 0);
    return lp_forward(ctx, rows, c, err);
}

/* Runs the evaluation; ref may be NULL (perplexity only). */
static int eval_run(const lp_model *model, const lp_model *ref, const int32_t *tokens,
                    int n_tokens, const eval_options *o, eval_result *r, lp_error *err) {
    memset(r, 0, sizeof *r);
    int c = o->chunk_tokens;
    if (c < 4) return lp_fail(err, "chunks need at least 4 tokens (got %d)", c);
    int n_chunks = n_tokens / c;
    if (o->max_chunks > 0 && n_chunks > o->max_chunks) n_chunks = o->max_chunks;
    if (n_chunks < 1)
        return lp_fail(err, "the text has %d tokens, fewer than one chunk of %d (use a smaller -c)",
                       n_tokens, c);
    if (ref && eval_same_vocab(model, ref, err)) return -1;
    lp_model_info info;
    lp_model_get_info(model, &info);
    int n_vocab = info.n_vocab, first = c / 2, per_chunk = c - 1 - first;
    size_t n_scored = (size_t)n_chunks * (size_t)per_chunk;
    int32_t bos = lp_model_add_bos(model) ? lp_token_bos(model) : -1;

    int rc = -1;
    lp_context *ctx = NULL, *rctx = NULL;
    lp_row *rows = malloc((size_t)c * sizeof *rows);
    double *kl = calloc(n_scored, sizeof *kl), *dp = calloc(n_scored, sizeof *dp),
           *top_dp = calloc(n_scored, sizeof *top_dp);
    if (!rows || !kl || !dp || !top_dp) {
        lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        goto out;
    }
    if (!(ctx = eval_context(model, o->adapter, o, err))) goto out;
    if (ref && !(rctx = eval_context(ref, o->ref_adapter, o, err))) goto out;

    double t0 = lp_now_seconds(), nll_sum = 0, ref_nll_sum = 0;
    size_t k = 0, same_top = 0;
    for (int ch = 0; ch < n_chunks; ch++) {
        const int32_t *chunk = tokens + (size_t)ch * (size_t)c;
        if (eval_chunk(ctx, rows, chunk, c, first, bos, o->adapter != NULL, err)) goto out;
        if (rctx && eval_chunk(rctx, rows, chunk, c, first, bos, o->ref_adapter != NULL, err)) goto out;
        for (int i = first; i < c - 1; i++, k++) {
            const float *lm = lp_logits(ctx, i);
            if (!lm) {
                lp_fail(err, "no logits for row %d", i);
                goto out;
            }
            int32_t next = chunk[i + 1];
            double nll = tool_log_sum_exp(lm, n_vocab) - lm[next];
            nll_sum += nll;
            if (!rctx) continue;
            const float *lr = lp_logits(rctx, i);
            if (!lr) {
                lp_fail(err, "no reference logits for row %d", i);
                goto out;
            }
            double lzr = tool_log_sum_exp(lr, n_vocab), lzm = tool_log_sum_exp(lm, n_vocab);
            double ref_nll = lzr - lr[next];
            ref_nll_sum += ref_nll;
            kl[k] = tool_kl_logits(lr, lm, n_vocab);
            dp[k] = exp(-nll) - exp(-ref_nll);
            int top = tool_argmax(lr, n_vocab);
            same_top += tool_argmax(lm, n_vocab) == top;
            top_dp[k] = exp(lm[top] - lzm) - exp(lr[top] - lzr);
        }
    }
    r->seconds = lp_now_seconds() - t0;
    r->n_chunks = n_chunks;
    r->chunk_tokens = c;
    r->n_scored = (int)n_scored;
    r->ppl = exp(nll_sum / (double)n_scored);
    if (rctx) {
        r->has_ref = true;
        r->ref_ppl = exp(ref_nll_sum / (double)n_scored);
        r->same_top_pct = 100.0 * (double)same_top / (double)n_scored;
        r->dp_rms = tool_rms(dp, (int)n_scored);
        r->top_dp_rms = tool_rms(top_dp, (int)n_scored);
        for (size_t i = 0; i < n_scored; i++)
            if (fabs(top_dp[i]) > r->top_dp_max_abs) r->top_dp_max_abs = fabs(top_dp[i]);
        tool_summary s = tool_summarize_inplace(dp, (int)n_scored);
        r->dp_mean = s.mean;
        r->dp_min = s.min;
        r->dp_max = s.max;
        s = tool_summarize_inplace(kl, (int)n_scored);
        r->kl_mean = s.mean;
        r->kl_median = s.median;
        r->kl_max = s.max;
        r->kl_p99 = tool_quantile_sorted(kl, (int)n_scored, 0.99);
    }
    rc = 0;
out:
    lp_context_free(ctx);
    lp_context_free(rctx);
    free(rows);
    free(kl);
    free(dp);
    free(top_dp);
    return rc;
}

/* ---- the command ------------------------------------------------------------------------ */

static void eval_usage(FILE *out) {
    fprintf(out,
            "usage: loraplex eval -m MODEL -f TEXT [--ref REFERENCE] [options]\n"
            "  -m, --model PATH     the model to evaluate\n"
            "      --ref PATH       reference model (same tokenizer): adds KL divergence,\n"
            "                       top-token agreement and probability changes\n"
            "      --adapter A[:S]  run the model with this LoRA adapter (scaled by S)\n"
            "      --ref-adapter A[:S]\n"
            "                       run the reference with this adapter; without --ref the\n"
            "                       reference is MODEL itself, e.g. an int4 adapter\n"
            "                       against its f32 original on one base\n"
            "  -f, --file PATH      the text\n"
            "  -c, --ctx N          tokens per chunk (default 512); the second half of\n"
            "                       each chunk is scored, as llama.cpp's perplexity does\n"
            "      --chunks N       evaluate at most N chunks (default: all)\n"
            "      --no-repack      load a GGUF MODEL with every matrix as stored (float\n"
            "                       kernels on the exact values; by default Q4_0/Q8_0 are\n"
            "                       repacked losslessly and K-quants requantized to 8 bits)\n"
            "      --ref-no-repack  the same for the reference: --ref MODEL --ref-no-repack\n"
            "                       measures what loading MODEL for the integer kernels costs\n"
            "      --kv-f32         both sides keep the KV cache in f32 (default f16)\n"
            "  -t, --threads N      worker threads (default: all cores)\n"
            "      --json           one JSON object instead of the table\n");
}

static void print_result(const eval_result *r, const char *model, const char *ref, bool json) {
    if (json) {
        printf("{\"model\":");
        tool_json_string(stdout, model);
        printf(",\"chunks\":%d,\"chunk_tokens\":%d,\"scored_tokens\":%d,\"ppl\":%.6g,"
               "\"seconds\":%.3f",
               r->n_chunks, r->chunk_tokens, r->n_scored, r->ppl, r->seconds);
        if (r->has_ref) {
            printf(",\"ref\":");
            tool_json_string(stdout, ref);
            printf(",\"ref_ppl\":%.6g,\"kl_mean\":%.6g,\"kl_median\":%.6g,\"kl_p99\":%.6g,"
                   "\"kl_max\":%.6g,\"same_top_pct\":%.4f,\"dp_mean\":%.6g,\"dp_rms\":%.6g,"
                   "\"dp_min\":%.6g,\"dp_max\":%.6g,\"top_dp_rms\":%.6g,\"top_dp_max_abs\":%.6g",
                   r->ref_ppl, r->kl_mean, r->kl_median, r->kl_p99, r->kl_max, r->same_top_pct,
                   r->dp_mean, r->dp_rms, r->dp_min, r->dp_max, r->top_dp_rms,
                   r->top_dp_max_abs);
        }
        printf("}\n");
        return;
    }
    printf("%d chunks of %d tokens, %d tokens scored (second half of each chunk), %.1f s\n",
           r->n_chunks, r->chunk_tokens, r->n_scored, r->seconds);
    printf("PPL(model)       : %.6f\n", r->ppl);
    if (!r->has_ref) return;
    printf("PPL(ref)         : %.6f\n", r->ref_ppl);
    printf("KL(ref || model) : mean %.6f  median %.6f  99%% %.6f  max %.6f (nats/token)\n",
           r->kl_mean, r->kl_median, r->kl_p99, r->kl_max);
    printf("same top token   : %.3f %%\n", r->same_top_pct);
    printf("dp next token    : mean %.3f %%  rms %.3f %%  min %.3f %%  max %.3f %%\n",
           100 * r->dp_mean, 100 * r->dp_rms, 100 * r->dp_min, 100 * r->dp_max);
    printf("dp ref top token : rms %.3f %%  max |dp| %.3f %%\n", 100 * r->top_dp_rms,
           100 * r->top_dp_max_abs);
}

int cli_eval(int argc, char **argv) {
    const char *model_path = NULL, *ref_path = NULL, *text_path = NULL;
    char *adapter_spec = NULL, *ref_adapter_spec = NULL;
    eval_options o = {NULL, NULL, 512, 0, 0, false};
    bool json = false;
    lp_model_params model_params = {0}, ref_params = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long v;
        bool has_value = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            eval_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--kv-f32")) {
            o.kv_f32 = true;
        } else if (!strcmp(a, "--no-repack")) {
            model_params.no_repack = true;
        } else if (!strcmp(a, "--ref-no-repack")) {
            ref_params.no_repack = true;
        } else if (!has_value) {
            fprintf(stderr, "loraplex eval: unknown option or missing value: '%s' (see --help)\n", a);
            return 2;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model_path = argv[++i];
        else if (!strcmp(a, "--ref")) ref_path = argv[++i];
        else if (!strcmp(a, "--adapter")) adapter_spec = argv[++i];
        else if (!strcmp(a, "--ref-adapter")) ref_adapter_spec = argv[++i];
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) text_path = argv[++i];
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) {
            if (!tool_parse_long(a, argv[++i], 4, 1 << 20, &v)) return 2;
            o.chunk_tokens = (int)v;
        } else if (!strcmp(a, "--chunks")) {
            if (!tool_parse_long(a, argv[++i], 0, 1 << 30, &v)) return 2;
            o.max_chunks = (int)v;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!tool_parse_long(a, argv[++i], 1, 256, &v)) return 2;
            o.threads = (int)v;
        } else {
            fprintf(stderr, "loraplex eval: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!model_path || !text_path) {
        fprintf(stderr, "loraplex eval: -m MODEL and -f TEXT are required (see --help)\n");
        return 2;
    }
    lp_error err = {0};
    int rc = 1;
    char *text = NULL;
    size_t len = 0;
    int32_t *tokens = NULL, *ref_tokens = NULL;
    int n_tokens = 0, n_ref_tokens = 0;
    lp_model *model = NULL, *ref = NULL;
    lp_adapter *adapter = NULL, *ref_adapter = NULL;
    eval_result r;
    if (lp_read_file(text_path, &text, &len, (size_t)1 << 30, &err)) goto fail;
    if (!(model = lp_model_load(model_path, &model_params, &err))) goto fail;
    if (ref_path && !(ref = lp_model_load(ref_path, &ref_params, &err))) goto fail;
    if (ref_adapter_spec && !ref_path) {
        /* the same base on both sides, only the adapters differ */
        if (!(ref = lp_model_load(model_path, &model_params, &err))) goto fail;
        ref_path = model_path;
    }
    if (adapter_spec && !(o.adapter = adapter = tool_load_adapter(model, adapter_spec, &err))) goto fail;
    if (ref_adapter_spec && !(o.ref_adapter = ref_adapter = tool_load_adapter(ref, ref_adapter_spec, &err)))
        goto fail;
    if (ref && eval_same_vocab(model, ref, &err)) goto fail;
    if (eval_tokenize(model, text, len, &tokens, &n_tokens, &err)) goto fail;
    if (ref) {
        /* the same text must give the same tokens under both tokenizers */
        if (eval_tokenize(ref, text, len, &ref_tokens, &n_ref_tokens, &err)) goto fail;
        if (n_ref_tokens != n_tokens ||
            memcmp(tokens, ref_tokens, (size_t)n_tokens * sizeof *tokens)) {
            lp_fail(&err, "%s and %s tokenize the text differently", model_path, ref_path);
            goto fail;
        }
    }
    if (eval_run(model, ref, tokens, n_tokens, &o, &r, &err)) goto fail;
    print_result(&r, model_path, ref_path, json);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "loraplex eval: %s\n", err.message);
out:
    free(text);
    free(tokens);
    free(ref_tokens);
    lp_adapter_free(adapter);
    lp_adapter_free(ref_adapter);
    lp_model_free(model);
    lp_model_free(ref);
    return rc;
}
