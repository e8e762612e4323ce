/* Single-sequence generation on top of lp_forward: prefill the prompt as
 * batches of chained rows, then decode one row per step. Text is streamed
 * through a callback; text that might be the start of a stop string is held
 * back until it is known not to be one. */
#include <stdlib.h>
#include <string.h>

#include "../model/context.h"

lp_generate_params lp_generate_default_params(void) {
    lp_generate_params p = {0};
    p.n_predict = 128;
    p.stop_at_eog = true;
    return p;
}

/* Output text not yet released to the callback. */
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

/* Length of the longest suffix of text that is a proper prefix of a stop
 * string: that much must be held back. */
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

/* Finds the earliest stop string in text; returns its offset or -1. */
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

/* The prompt as chains of rows, max_rows at a time; only the last row asks
 * for logits. */
static int prefill(lp_context *ctx, lp_row *rows, const int32_t *prompt, int n, int seq,
                   lp_error *err) {
    int max_rows = ctx->params.max_rows;
    for (int start = 0; start < n; start += max_rows) {
        int count = n - start < max_rows ? n - start : max_rows;
        for (int i = 0; i < count; i++) {
            lp_row r = {0};
            r.token = prompt[start + i];
            r.pos = start + i;
            r.seq = seq;
            r.parent = i > 0 ? i - 1 : -1;
            r.logits = start + i == n - 1;
            r.commit = true;
            rows[i] = r;
        }
        if (lp_forward(ctx, rows, count, err)) return -1;
    }
    return 0;
}

int lp_generate(lp_context *ctx, lp_sampler *sampler, const int32_t *prompt, int n_prompt,
                const lp_generate_params *params, lp_text_fn fn, void *user,
                int32_t *out_tokens, int out_cap, lp_generate_stats *stats, lp_error *err) {
    lp_generate_params p = params ? *params : lp_generate_default_params();
    lp_generate_stats st = {0};
    st.n_prompt = n_prompt;
    st.stop_reason = "length";
    if (n_prompt < 1) return lp_fail(err, "the prompt is empty (no tokens)");
    if (p.seq < 0 || p.seq >= ctx->params.max_sequences)
        return lp_fail(err, "sequence %d does not exist", p.seq);
    if (n_prompt >= ctx->params.max_seq_len)
        return lp_fail(err, "prompt of %d tokens does not fit the context (%d)", n_prompt,
                       ctx->params.max_seq_len);
    const lp_model *m = ctx->model;
    lp_seq_clear(ctx, p.seq);

    int history_cap = n_prompt + (p.n_predict > 0 ? p.n_predict : 0);
    int32_t *history = malloc((size_t)history_cap * sizeof(int32_t));
    int n_rows = n_prompt < ctx->params.max_rows ? n_prompt : ctx->params.max_rows;
    lp_row *rows = malloc((size_t)n_rows * sizeof(lp_row));
    pending_text pending = {0};
    if (!history || !rows) {
        free(history);
        free(rows);
        return lp_fail(err, "out of memory");
    }
    memcpy(history, prompt, (size_t)n_prompt * sizeof(int32_t));
    int n_history = n_prompt, rc = 0;

    double t0 = lp_now_seconds();
    if (prefill(ctx, rows, prompt, n_prompt, p.seq, err)) {
        rc = -1;
        goto done;
    }
    double t1 = lp_now_seconds();
    st.prefill_seconds = t1 - t0;
    int last_row = (n_prompt - 1) % ctx->params.max_rows;

    for (int i = 0; i < p.n_predict; i++) {
        int32_t tok = lp_sampler_sample(sampler, lp_logits(ctx, last_row), history, n_history);
        if (p.stop_at_eog && lp_token_is_eog(m, tok)) {
            st.stop_reason = "eog";
            break;
        }
        history[n_history++] = tok;
        if (out_tokens && st.n_generated < out_cap) out_tokens[st.n_generated] = tok;
        st.n_generated++;

        char piece[256];
        size_t len = lp_token_to_piece(m, tok, piece, sizeof piece);
        if (len > sizeof piece) len = sizeof piece;
        if (!pending_append(&pending, piece, len)) {
            rc = lp_fail(err, "out of memory");
            goto done;
        }
        long at = find_stop(pending.buf, pending.len, p.stop, p.n_stop);
        if (at >= 0) {
            if (fn && at > 0) fn(user, pending.buf, (size_t)at);
            pending.len = 0;
            st.stop_reason = "stop";
            break;
        }
        size_t hold = held_back(pending.buf, pending.len, p.stop, p.n_stop);
        size_t release = pending.len - hold;
        if (release > 0) {
            bool go_on = fn ? fn(user, pending.buf, release) : true;
            memmove(pending.buf, pending.buf + release, hold);
            pending.len = hold;
            if (!go_on) {
                st.stop_reason = "callback";
                break;
            }
        }
        if (i + 1 == p.n_predict) break;
        if (lp_seq_length(ctx, p.seq) >= ctx->params.max_seq_len) {
            st.stop_reason = "context";
            break;
        }
        lp_row row = {0};
        row.token = tok;
        row.pos = n_history - 1;
        row.seq = p.seq;
        row.parent = -1;
        row.logits = true;
        row.commit = true;
        if (lp_forward(ctx, &row, 1, err)) {
            rc = -1;
            goto done;
        }
        last_row = 0;
    }
    if (fn && pending.len > 0 && strcmp(st.stop_reason, "stop") != 0)
        fn(user, pending.buf, pending.len);
    st.decode_seconds = lp_now_seconds() - t1;
done:
    free(history);
    free(rows);
    free(pending.buf);
    if (stats) *stats = st;
    return rc;
}
