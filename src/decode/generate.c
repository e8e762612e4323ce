/* Generation on top of lp_forward: N streams from one prompt (N = 1 is plain
 * generation).
 *
 * The prompt is prefilled once into the first stream's sequence; the other
 * streams fork it, sharing its KV blocks. Rows that differ per stream (the
 * last prompt token when streams have their own adapter or suffix, the
 * suffix, then each generated token) go through one batched forward per
 * step. A stream that ends leaves the batch and frees its blocks; the first
 * stream's sequence is kept so a later call with the same prefix (the next
 * chat turn) reuses its KV. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../model/context.h"

lp_generate_params lp_generate_default_params(void) {
    lp_generate_params p = {0};
    p.n_predict = 128;
    p.stop_at_eog = true;
    p.reuse_cache = true;
    return p;
}

/* ---- text with stop strings --------------------------------------------------- */

/* Output text not yet released to the callback: what might still turn out
 * to be the start of a stop string. */
typedef struct pending_text {
    char *buf;
    size_t len, cap;
} pending_text;

static bool pending_append(pending_text *p, const char *s, size_t n) {
    if (p->len + n + 1 > p->cap) {
        size_t cap = (p->len + n + 1) * 2;
        char *b = realloc(p->buf, cap);
        if (!b) return false;
        p->buf = b;
        p->cap = cap;
    }
    memcpy(p->buf + p->len, s, n);
    p->len += n;
    p->buf[p->len] = 0;
    return true;
}

/* Length of the longest suffix of text that is a proper prefix of a stop string. */
static size_t held_back(const char *text, size_t len, const char *const *stop, int n_stop) {
    size_t hold = 0;
    for (int i = 0; i < n_stop; i++) {
        size_t sl = strlen(stop[i]);
        for (size_t k = sl > 0 ? sl - 1 : 0; k > hold; k--)
            if (k <= len && memcmp(text + len - k, stop[i], k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

/* Offset of the earliest stop string in text, or -1. */
static long find_stop(const char *text, size_t len, const char *const *stop, int n_stop) {
    long best = -1;
    for (int i = 0; i < n_stop; i++) {
        size_t sl = strlen(stop[i]);
        if (sl == 0 || sl > len) continue;
        for (size_t at = 0; at + sl <= len; at++)
            if (memcmp(text + at, stop[i], sl) == 0) {
                if (best < 0 || (long)at < best) best = (long)at;
                break;
            }
    }
    return best;
}

/* ---- streams ---------------------------------------------------------------------- */

typedef struct stream_state {
    const lp_stream *spec;
    int index, seq;
    int32_t *history;         /* prompt, suffix, generated tokens */
    int n_history, cap_history;
    int32_t *head;            /* rows this stream computes itself before decoding */
    int n_head;
    pending_text text;
    bool active;
    int32_t next_token;       /* sampled, to be fed in the next step; -1 none */
    lp_stream_stats stats;
} stream_state;

typedef struct run {
    lp_context *ctx;
    const lp_generate_params *p;
    stream_state *streams;
    int n_streams;
    lp_stream_fn fn;
    void *user;
    lp_row *rows;             /* [max_rows] */
    int *row_stream;          /* [max_rows] which stream a row's logits belong to (-1) */
} run;

static void finish(run *R, stream_state *s, const char *reason) {
    if (!s->active) return;
    s->active = false;
    s->next_token = -1;
    s->stats.stop_reason = reason;
    if (strcmp(reason, "stop") != 0 && s->text.len > 0 && R->fn)
        R->fn(R->user, s->index, s->text.buf, s->text.len);
    s->text.len = 0;
    /* The first stream's sequence stays as a cache for the next call. */
    if (s->index > 0) lp_seq_clear(R->ctx, s->seq);
}

/* Picks the i-th most likely token of logits (ties by id) and its probability. */
static int32_t nth_best(const float *logits, int n_vocab, int nth, float *prob) {
    int32_t best[64] = {0};
    int have = 0;
    if (nth >= 64) nth = 63;
    for (int32_t t = 0; t < n_vocab; t++) {
        if (have == nth + 1 && logits[t] <= logits[best[nth]]) continue;
        int pos = have <= nth ? have++ : nth;
        while (pos > 0 && logits[best[pos - 1]] < logits[t]) {
            best[pos] = best[pos - 1];
            pos--;
        }
        best[pos] = t;
    }
    float max = logits[best[0]], sum = 0;
    for (int t = 0; t < n_vocab; t++) sum += expf(logits[t] - max);
    int32_t pick = best[have - 1 < nth ? have - 1 : nth];
    *prob = expf(logits[pick] - max) / sum;
    return pick;
}

/* Chooses a stream's next token from its logits and emits its text. */
static int sample_and_emit(run *R, stream_state *s, const float *logits, lp_error *err) {
    const lp_model *m = R->ctx->model;
    const lp_generate_params *p = R->p;
    int32_t tok;
    if (s->stats.n_generated == 0 && s->spec->first_token >= 0) {
        tok = s->spec->first_token;
    } else if (s->stats.n_generated == 0 && p->seed_top > 0) {
        float prob;
        tok = nth_best(logits, m->hp.n_vocab, s->index, &prob);
        if (prob < p->seed_top_min_prob) {
            finish(R, s, "pruned");
            return 0;
        }
    } else {
        tok = lp_sampler_sample(s->spec->sampler, logits, s->history, s->n_history);
    }
    if (p->stop_at_eog && lp_token_is_eog(m, tok)) {
        finish(R, s, "eog");
        return 0;
    }
    s->history[s->n_history++] = tok;
    s->stats.n_generated++;
    char piece[256];
    size_t len = lp_token_to_piece(m, tok, piece, sizeof piece);
    if (len > sizeof piece) len = sizeof piece;
    if (!pending_append(&s->text, piece, len)) return lp_fail(err, "out of memory");
    long at = find_stop(s->text.buf, s->text.len, p->stop, p->n_stop);
    if (at >= 0) {
        if (R->fn && at > 0) R->fn(R->user, s->index, s->text.buf, (size_t)at);
        finish(R, s, "stop");
        return 0;
    }
    size_t hold = held_back(s->text.buf, s->text.len, p->stop, p->n_stop);
    size_t release = s->text.len - hold;
    if (release > 0) {
        bool go_on = R->fn ? R->fn(R->user, s->index, s->text.buf, release) : true;
        memmove(s->text.buf, s->text.buf + release, hold);
        s->text.len = hold;
        if (!go_on) {
            finish(R, s, "callback");
            return 0;
        }
    }
    if (s->stats.n_generated >= p->n_predict) {
        finish(R, s, "length");
        return 0;
    }
    if (lp_seq_length(R->ctx, s->seq) >= R->ctx->params.max_seq_len) {
        finish(R, s, "context");
        return 0;
    }
    s->next_token = tok;
    return 0;
}

/* Runs the batch in R->rows and samples for every row that wants logits. */
static int forward_and_sample(run *R, int n, lp_error *err) {
    if (lp_forward(R->ctx, R->rows, n, err)) return -1;
    for (int r = 0; r < n; r++)
        if (R->row_stream[r] >= 0) {
            stream_state *s = &R->streams[R->row_stream[r]];
            if (sample_and_emit(R, s, lp_logits(R->ctx, r), err)) return -1;
        }
    return 0;
}

/* Feeds `n` tokens of a stream (its head) as chained rows, possibly across
 * several batches; the stream samples after its last row. */
static int prefill_rows(run *R, int *n_rows, int *n_logits, const int32_t *toks, int n, int seq,
                        int adapter, int stream, lp_error *err) {
    lp_context *ctx = R->ctx;
    for (int i = 0; i < n; i++) {
        bool last = i == n - 1 && stream >= 0;
        if (*n_rows == ctx->params.max_rows || (last && *n_logits == ctx->params.max_logit_rows)) {
            if (forward_and_sample(R, *n_rows, err)) return -1;
            *n_rows = *n_logits = 0;
        }
        /* Rows of one head are consecutive: a row chains to the previous one
         * unless a batch boundary fell between them (then the previous one
         * is already committed). */
        int r = (*n_rows)++;
        bool chained = i > 0 && r > 0;
        int pos = chained ? R->rows[r - 1].pos + 1 : lp_seq_length(ctx, seq);
        R->rows[r] = (lp_row){toks[i], pos, seq, adapter, chained ? r - 1 : -1, last, true};
        R->row_stream[r] = last ? stream : -1;
        if (last) (*n_logits)++;
    }
    return 0;
}

/* How much of the first sequence's cached KV matches the prompt under the
 * prefix adapter. */
static int reusable_prefix(const lp_context *ctx, int seq, const int32_t *prompt, int n,
                           int adapter) {
    const lp_seq *s = &ctx->seqs[seq];
    uint64_t tag = ctx->slots[adapter].tag;
    int k = 0;
    while (k < s->length && k < n && s->tokens[k] == prompt[k] && s->tags[k] == tag) k++;
    return k;
}

static int setup_streams(run *R, const int32_t *prompt, int n_prompt, const lp_stream *specs,
                         int shared_len, lp_error *err) {
    const lp_model *m = R->ctx->model;
    for (int i = 0; i < R->n_streams; i++) {
        stream_state *s = &R->streams[i];
        s->spec = &specs[i];
        s->index = i;
        s->seq = R->p->first_seq + i;
        s->next_token = -1;
        s->active = true;
        s->stats.stop_reason = "length";
        if (!specs[i].sampler && specs[i].first_token < 0 && R->p->seed_top <= 0)
            return lp_fail(err, "stream %d has no sampler", i);
        int n_suffix = 0;
        size_t suffix_len = specs[i].suffix ? strlen(specs[i].suffix) : 0;
        int suffix_cap = (int)suffix_len + 8;
        s->cap_history = n_prompt + suffix_cap + (R->p->n_predict > 0 ? R->p->n_predict : 0) + 1;
        s->history = malloc((size_t)s->cap_history * sizeof(int32_t));
        s->head = malloc((size_t)(n_prompt - shared_len + suffix_cap) * sizeof(int32_t));
        if (!s->history || !s->head) return lp_fail(err, "out of memory");
        memcpy(s->history, prompt, (size_t)n_prompt * sizeof(int32_t));
        s->n_history = n_prompt;
        if (suffix_len) {
            n_suffix = lp_tokenize(m, specs[i].suffix, suffix_len, false, true,
                                   s->history + n_prompt, suffix_cap, err);
            if (n_suffix < 0) return -1;
            if (n_suffix > suffix_cap) return lp_fail(err, "stream %d: suffix too long", i);
        }
        s->n_history += n_suffix;
        s->n_head = n_prompt - shared_len + n_suffix;
        memcpy(s->head, s->history + shared_len, (size_t)s->n_head * sizeof(int32_t));
        if (n_prompt + n_suffix >= R->ctx->params.max_seq_len)
            return lp_fail(err, "stream %d: prompt of %d tokens does not fit the context (%d)", i,
                           n_prompt + n_suffix, R->ctx->params.max_seq_len);
    }
    return 0;
}

int lp_generate_streams(lp_context *ctx, const int32_t *prompt, int n_prompt,
                        const lp_stream *specs, int n_streams, const lp_generate_params *params,
                        lp_stream_fn fn, void *user, lp_stream_stats *stream_stats,
                        lp_generate_stats *stats, lp_error *err) {
    lp_generate_params p = params ? *params : lp_generate_default_params();
    lp_generate_stats st = {0};
    st.n_prompt = n_prompt;
    if (n_prompt < 1) return lp_fail(err, "the prompt is empty (no tokens)");
    if (n_streams < 1) return lp_fail(err, "no streams requested");
    if (p.first_seq < 0 || p.first_seq + n_streams > ctx->params.max_sequences)
        return lp_fail(err, "%d streams from sequence %d need %d sequences; this context has %d",
                       n_streams, p.first_seq, p.first_seq + n_streams, ctx->params.max_sequences);
    if (p.prefix_adapter < 0 || p.prefix_adapter > ctx->params.max_adapters)
        return lp_fail(err, "prefix adapter slot %d out of range", p.prefix_adapter);

    run R = {ctx, &p, NULL, n_streams, fn, user, NULL, NULL};
    R.streams = calloc((size_t)n_streams, sizeof *R.streams);
    R.rows = malloc((size_t)ctx->params.max_rows * sizeof *R.rows);
    R.row_stream = malloc((size_t)ctx->params.max_rows * sizeof(int));
    int rc = -1;
    if (!R.streams || !R.rows || !R.row_stream) {
        lp_fail(err, "out of memory");
        goto done;
    }
    /* Streams that differ from the prefix (own adapter or suffix) compute
     * the last prompt token themselves; otherwise all share its logits. */
    bool plain = true;
    for (int i = 0; i < n_streams; i++)
        if ((specs[i].suffix && specs[i].suffix[0]) || specs[i].adapter != p.prefix_adapter)
            plain = false;
    int shared_len = plain ? n_prompt : n_prompt - 1;
    if (setup_streams(&R, prompt, n_prompt, specs, shared_len, err)) goto done;

    /* 1. the shared prefix, reusing cached KV where tokens and adapter match */
    double t0 = lp_now_seconds();
    int seq0 = p.first_seq;
    int keep = p.reuse_cache ? reusable_prefix(ctx, seq0, prompt, shared_len, p.prefix_adapter) : 0;
    if (plain && keep == shared_len) keep--; /* the last row is needed for its logits */
    if (lp_seq_truncate(ctx, seq0, keep, err)) goto done;
    st.n_reused = keep;
    int n_rows = 0, n_logits = 0;
    if (plain) {
        /* sample every stream from the last prompt row's logits */
        if (prefill_rows(&R, &n_rows, &n_logits, prompt + keep, shared_len - keep, seq0,
                         p.prefix_adapter, -1, err))
            goto done;
        R.rows[n_rows - 1].logits = true;
        if (lp_forward(ctx, R.rows, n_rows, err)) goto done;
        const float *logits = lp_logits(ctx, n_rows - 1);
        for (int i = 1; i < n_streams; i++)
            if (lp_seq_fork(ctx, seq0, seq0 + i, err)) goto done;
        for (int i = 0; i < n_streams; i++)
            if (sample_and_emit(&R, &R.streams[i], logits, err)) goto done;
        n_rows = 0;
    } else {
        if (shared_len > keep) {
            if (prefill_rows(&R, &n_rows, &n_logits, prompt + keep, shared_len - keep, seq0,
                             p.prefix_adapter, -1, err) ||
                (n_rows > 0 && forward_and_sample(&R, n_rows, err)))
                goto done;
            n_rows = n_logits = 0;
        }
        for (int i = 1; i < n_streams; i++)
            if (lp_seq_fork(ctx, seq0, seq0 + i, err)) goto done;
        /* 2. every stream's own head rows, batched together */
        for (int i = 0; i < n_streams; i++)
            if (prefill_rows(&R, &n_rows, &n_logits, R.streams[i].head, R.streams[i].n_head,
                             R.streams[i].seq, specs[i].adapter, i, err))
                goto done;
        if (n_rows > 0 && forward_and_sample(&R, n_rows, err)) goto done;
    }
    double t1 = lp_now_seconds();
    st.prefill_seconds = t1 - t0;

    /* 3. decode: one row per live stream per step */
    for (;;) {
        int n = 0;
        for (int i = 0; i < n_streams; i++) {
            stream_state *s = &R.streams[i];
            if (!s->active || s->next_token < 0) continue;
            if (n == ctx->params.max_rows || n == ctx->params.max_logit_rows) {
                if (forward_and_sample(&R, n, err)) goto done;
                n = 0;
            }
            R.rows[n] = (lp_row){s->next_token, lp_seq_length(ctx, s->seq), s->seq,
                                 specs[i].adapter, -1, true, true};
            R.row_stream[n++] = i;
            s->next_token = -1;
        }
        if (n == 0) break;
        if (forward_and_sample(&R, n, err)) goto done;
        st.decode_steps++;
    }
    st.decode_seconds = lp_now_seconds() - t1;
    rc = 0;
done:
    if (R.streams) {
        for (int i = 0; i < n_streams; i++) {
            stream_state *s = &R.streams[i];
            if (rc != 0 && s->index > 0) lp_seq_clear(ctx, s->seq);
            st.n_generated += s->stats.n_generated;
            if (stream_stats) stream_stats[i] = s->stats;
            free(s->history);
            free(s->head);
            free(s->text.buf);
        }
        st.stop_reason = R.streams[0].stats.stop_reason;
    }
    free(R.streams);
    free(R.rows);
    free(R.row_stream);
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
    lp_stream one = {NULL, p.prefix_adapter, sampler, -1};
    p.seed_top = 0;
    single_text t = {fn, user};
    return lp_generate_streams(ctx, prompt, n_prompt, &one, 1, &p, forward_text, &t, NULL, stats,
                               err);
}
