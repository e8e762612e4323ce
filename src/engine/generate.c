/* lp_generate and lp_generate_streams: thin drivers of the engine.
 *
 * N streams of one prompt are N requests. The first computes the shared
 * prompt; the others wait for it and fork its KV blocks (the engine's
 * shared-prefix rule), then each computes only its own rows: the last
 * prompt token (for its logits, under its own adapter), its suffix, its
 * tokens. Every stream's KV but the first is freed when it ends; the first
 * stays as a cached prefix for the next call (the next chat turn). */
#include "loraplex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}


lp_generate_params lp_generate_default_params(void) {
    lp_generate_params p = {0};
    p.n_predict = 128;
    p.stop_at_eog = true;
    p.reuse_cache = true;
    return p;
}

typedef struct streams_run {
    lp_stream_fn fn;
    void *user;
    const int *stream_of;      /* [request id] stream index */
    int n_ids;
} streams_run;

static bool to_stream(void *user, int request, const char *text, size_t len) {
    const streams_run *R = user;
    int stream = request >= 0 && request < R->n_ids ? R->stream_of[request] : 0;
    return R->fn ? R->fn(R->user, stream, text, len) : true;
}

/* Stream i's request tokens: the prompt, then its suffix. */
static int stream_tokens(const lp_model *m, const int32_t *prompt, int n_prompt, const char *suffix,
                         int32_t **out, lp_error *err) {
    size_t suffix_len = suffix ? strlen(suffix) : 0;
    int cap = n_prompt + (int)suffix_len + 8;
    int32_t *t = malloc((size_t)cap * sizeof *t);
    if (!t) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    memcpy(t, prompt, (size_t)n_prompt * sizeof *t);
    int n = 0;
    if (suffix_len) {
        n = lp_tokenize(m, suffix, suffix_len, false, true, t + n_prompt, cap - n_prompt, err);
        if (n < 0 || n > cap - n_prompt) {
            free(t);
            return n < 0 ? -1 : lp_error_set(err, LP_ERR_INVALID, "suffix too long");
        }
    }
    *out = t;
    return n_prompt + n;
}

static void add_spec_stats(lp_spec_stats *sum, const lp_spec_stats *s) {
    sum->n_passes += s->n_passes;
    sum->n_generated += s->n_generated;
    sum->n_drafted += s->n_drafted;
    sum->n_accepted += s->n_accepted;
    sum->n_forecast_rows += s->n_forecast_rows;
    sum->n_tree_rows += s->n_tree_rows;
}

lp_speculate lp_speculate_for_slot(const lp_context *ctx, const lp_speculate *base, int slot) {
    lp_speculate sp = *base;
    if (!sp.forecast) {
        sp.forecast = lp_context_slot_forecast(ctx, slot);
        int k = sp.forecast ? lp_forecast_k(sp.forecast) : 0;
        if (sp.depth > k) sp.depth = k;
    }
    return sp;
}

int lp_generate_streams(lp_context *ctx, const int32_t *prompt, int n_prompt,
                        const lp_stream *specs, int n_streams, const lp_generate_params *params,
                        lp_stream_fn fn, void *user, lp_stream_stats *stream_stats,
                        lp_generate_stats *stats, lp_error *err) {
    lp_generate_params p = params ? *params : lp_generate_default_params();
    lp_generate_stats st = {.n_prompt = n_prompt};
    lp_context_params cp;
    lp_context_get_params(ctx, &cp);
    const lp_model *m = lp_context_model(ctx);
    if (stats) *stats = st;
    if (n_prompt < 1) return lp_error_set(err, LP_ERR_INVALID, "the prompt is empty (no tokens)");
    if (n_streams < 1) return lp_error_set(err, LP_ERR_INVALID, "no streams requested");
    if (p.first_seq < 0 || p.first_seq + n_streams > cp.max_sequences)
        return lp_error_set(err, LP_ERR_INVALID, "%d streams from sequence %d need %d sequences; this context has %d",
                    n_streams, p.first_seq, p.first_seq + n_streams, cp.max_sequences);
    if (p.prefix_adapter < 0 || p.prefix_adapter > cp.max_adapters)
        return lp_error_set(err, LP_ERR_INVALID, "prefix adapter slot %d out of range", p.prefix_adapter);
    for (int i = 0; i < n_streams; i++) {
        if (!specs[i].sampler && specs[i].first_token < 0 && p.seed_top <= 0)
            return lp_error_set(err, LP_ERR_INVALID, "stream %d has no sampler", i);
        if (specs[i].adapter < 0 || specs[i].adapter > cp.max_adapters ||
            (specs[i].adapter > 0 && !lp_context_slot_adapter(ctx, specs[i].adapter)))
            return lp_error_set(err, LP_ERR_INVALID, "stream %d: adapter slot %d is not bound", i, specs[i].adapter);
    }
    /* Streams that differ from the prefix (own adapter or suffix) compute
     * the last prompt token under their own adapter. */
    bool plain = true;
    for (int i = 0; i < n_streams; i++)
        if ((specs[i].suffix && specs[i].suffix[0]) || specs[i].adapter != p.prefix_adapter) plain = false;

    lp_engine_params ep = lp_engine_default_params();
    ep.first_seq = p.first_seq;
    ep.n_seqs = n_streams;
    ep.min_shared = 1; /* the streams share their whole prompt, however short */
    lp_engine *e = lp_engine_create(ctx, &ep, err);
    if (!e) return -1;
    int *ids = calloc((size_t)n_streams, sizeof *ids), *stream_of = calloc((size_t)n_streams, sizeof *stream_of);
    streams_run R = {fn, user, stream_of, n_streams};
    int rc = -1;
    if (!ids || !stream_of) {
        lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < n_streams; i++) {
        int32_t *toks = NULL;
        int n = stream_tokens(m, prompt, n_prompt, specs[i].suffix, &toks, err);
        if (n < 0) goto done;
        if (n >= cp.max_seq_len) {
            free(toks);
            lp_error_set(err, LP_ERR_KV_FULL, "stream %d: prompt of %d tokens does not fit the context (%d)", i, n,
                 cp.max_seq_len);
            goto done;
        }
        lp_request q = lp_request_default();
        q.prompt = toks;
        q.n_prompt = n;
        q.adapter = lp_context_slot_adapter(ctx, specs[i].adapter);
        q.prefix_adapter = lp_context_slot_adapter(ctx, p.prefix_adapter);
        q.n_prefix = plain ? n_prompt : n_prompt - 1;
        q.sampler = specs[i].sampler;
        q.max_tokens = p.n_predict > 0 ? p.n_predict : 0;
        q.stop = p.stop;
        q.n_stop = p.n_stop;
        q.stop_at_eog = p.stop_at_eog;
        q.first_token = specs[i].first_token;
        q.first_rank = p.seed_top > 0 ? i + 1 : 0;
        q.first_min_prob = p.seed_top_min_prob;
        q.no_reuse = !p.reuse_cache && i == 0;
        q.drop_kv = i > 0;
        q.fn = to_stream;
        q.user = &R;
        lp_speculate sp;
        if (p.speculate) {
            sp = lp_speculate_for_slot(ctx, p.speculate, specs[i].adapter);
            q.speculate = &sp; /* copied by submit */
        }
        ids[i] = lp_engine_submit(e, &q, err);
        free(toks);
        if (ids[i] < 0) goto done;
        if (ids[i] < n_streams) stream_of[ids[i]] = i;
    }
    /* prefill ends when every stream has its first token (or has ended) */
    double t0 = now_seconds(), t1 = t0;
    bool prefilled = false;
    for (;;) {
        int left = lp_engine_step(e, err);
        if (left < 0) goto done;
        st.steps++;
        if (prefilled) st.decode_steps++;
        if (!prefilled) {
            prefilled = true;
            for (int i = 0; i < n_streams; i++) {
                lp_request_stats rs;
                lp_engine_request_stats(e, ids[i], &rs);
                prefilled &= rs.done || rs.n_generated > 0;
            }
            if (prefilled) t1 = now_seconds();
        }
        if (left == 0) break;
    }
    st.prefill_seconds = t1 - t0;
    st.decode_seconds = now_seconds() - t1;
    rc = 0;
    for (int i = 0; i < n_streams; i++) {
        lp_request_stats rs;
        lp_engine_request_stats(e, ids[i], &rs);
        if (rs.status == LP_ERR_KV_FULL && rc == 0)
            rc = lp_error_set(err, LP_ERR_KV_FULL, "stream %d: the KV cache has no room for it", i);
        lp_spec_stats sp = {0};
        lp_engine_request_spec_stats(e, ids[i], &sp);
        if (i == 0) st.n_reused = rs.n_reused;
        st.n_generated += rs.n_generated;
        add_spec_stats(&st.spec, &sp);
        if (stream_stats)
            stream_stats[i] = (lp_stream_stats){.n_generated = rs.n_generated, .stop_reason = rs.stop_reason,
                                                .spec = sp};
    }
    {
        lp_request_stats rs;
        lp_engine_request_stats(e, ids[0], &rs);
        st.stop_reason = rs.stop_reason;
    }
done:
    lp_engine_free(e);
    free(ids);
    free(stream_of);
    if (stats) *stats = st;
    return rc;
}

/* ---- one stream ------------------------------------------------------------------ */

typedef struct single_text {
    lp_text_fn fn;
    void *user;
} single_text;

static bool forward_text(void *user, int stream, const char *text, size_t len) {
    (void)stream;
    single_text *t = user;
    return t->fn ? t->fn(t->user, text, len) : true;
}

int lp_generate(lp_context *ctx, lp_sampler *sampler, const int32_t *prompt, int n_prompt,
                const lp_generate_params *params, lp_text_fn fn, void *user,
                lp_generate_stats *stats, lp_error *err) {
    lp_generate_params p = params ? *params : lp_generate_default_params();
    lp_stream one = {.adapter = p.prefix_adapter, .sampler = sampler, .first_token = -1};
    p.seed_top = 0;
    single_text t = {fn, user};
    return lp_generate_streams(ctx, prompt, n_prompt, &one, 1, &p, forward_text, &t, NULL, stats,
                               err);
}
