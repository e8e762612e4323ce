/* Training data: JSONL prompt/completion records and plain-text token
 * streams, tokenized once up front; batches sampled from them with the
 * trainer's RNG (so a checkpoint's RNG state resumes the same data). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_internal.h"

enum { LP_DATA_MAX_BYTES = 1 << 30 };

/* Encodes into a growing malloc'd buffer. Returns the count or -1. */
static int data_encode(const lp_tokenizer *tok, const char *text, size_t len, bool bos,
                       int32_t **out, lp_error *err) {
    int cap = (int)(len < 64 ? 64 : len + 8);
    for (;;) {
        int32_t *buf = malloc((size_t)cap * sizeof *buf);
        if (!buf) return lp_fail(err, "out of memory");
        int n = lp_tokenizer_encode(tok, text, len, bos, false, buf, cap, err);
        if (n < 0) {
            free(buf);
            return -1;
        }
        if (n <= cap) {
            *out = buf;
            return n;
        }
        free(buf);
        cap = n;
    }
}

void lp_train_data_free(lp_train_data *d) {
    for (int i = 0; i < d->n_ex; i++) free(d->ex[i].ids);
    free(d->ex);
    free(d->stream);
    memset(d, 0, sizeof *d);
}

static int add_record(lp_train_data *d, const lp_tokenizer *tok, const char *prompt,
                      const char *completion, lp_error *err) {
    int32_t *p = NULL, *c = NULL;
    int np = data_encode(tok, prompt, strlen(prompt), lp_tokenizer_bos(tok) >= 0, &p, err);
    if (np < 0) return -1;
    int nc = data_encode(tok, completion, strlen(completion), false, &c, err);
    if (nc < 0) {
        free(p);
        return -1;
    }
    int32_t eos = lp_tokenizer_eos(tok);
    int n = np + nc + (eos >= 0);
    int32_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
    lp_train_example *ex = realloc(d->ex, (size_t)(d->n_ex + 1) * sizeof *ex);
    if (!ids || !ex) {
        free(ids);
        free(p);
        free(c);
        if (ex) d->ex = ex;
        return lp_fail(err, "out of memory");
    }
    d->ex = ex;
    memcpy(ids, p, (size_t)np * sizeof *ids);
    memcpy(ids + np, c, (size_t)nc * sizeof *ids);
    if (eos >= 0) ids[n - 1] = eos;
    free(p);
    free(c);
    /* A record must predict at least one token after at least one input. */
    if (np == 0) return lp_fail(err, "empty prompt with no BOS token");
    d->ex[d->n_ex++] = (lp_train_example){ids, n, np};
    return 0;
}

int lp_train_data_load_jsonl(lp_train_data *d, const char *path, const lp_tokenizer *tok,
                             lp_error *err) {
    char *text;
    size_t size;
    if (lp_read_file(path, &text, &size, LP_DATA_MAX_BYTES, err) < 0) return -1;
    int rc = 0, line_no = 0;
    char *line = text;
    while (line && *line && rc == 0) {
        line_no++;
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        char *s = line;
        while (*s == ' ' || *s == '\t' || *s == '\r') s++;
        if (*s) {
            cJSON *j = cJSON_Parse(s);
            const cJSON *jp = j ? cJSON_GetObjectItemCaseSensitive(j, "prompt") : NULL;
            const cJSON *jc = j ? cJSON_GetObjectItemCaseSensitive(j, "completion") : NULL;
            if (!cJSON_IsString(jp) || !cJSON_IsString(jc))
                rc = lp_fail(err, "%s:%d: expected {\"prompt\": string, \"completion\": string}",
                             path, line_no);
            else if (add_record(d, tok, jp->valuestring, jc->valuestring, err) < 0)
                rc = lp_fail_prefix(err, "%s:%d", path, line_no);
            cJSON_Delete(j);
        }
        line = nl ? nl + 1 : NULL;
    }
    free(text);
    if (rc == 0 && d->n_ex == 0) rc = lp_fail(err, "%s: no records", path);
    return rc;
}

/* Appends ids to the stream. */
static int stream_append(lp_train_data *d, const int32_t *ids, size_t n, lp_error *err) {
    size_t total;
    if (!lp_add_ok(d->n_stream, n, &total) || total > ((size_t)1 << 34))
        return lp_fail(err, "text stream too long");
    int32_t *s = realloc(d->stream, (total ? total : 1) * sizeof *s);
    if (!s) return lp_fail(err, "out of memory");
    memcpy(s + d->n_stream, ids, n * sizeof *s);
    d->stream = s;
    d->n_stream = total;
    return 0;
}

int lp_train_data_load_text(lp_train_data *d, const char *path, const lp_tokenizer *tok,
                            lp_error *err) {
    char *text;
    size_t size;
    if (lp_read_file(path, &text, &size, LP_DATA_MAX_BYTES, err) < 0) return -1;
    int32_t eos = lp_tokenizer_eos(tok);
    int rc = 0;
    size_t pos = 0;
    while (pos < size && rc == 0) {
        /* a document runs to the next blank line */
        const char *start = text + pos;
        const char *blank = strstr(start, "\n\n");
        size_t len = blank ? (size_t)(blank - start) : size - pos;
        pos += len + (blank ? 2 : 0);
        while (len > 0 && (start[len - 1] == '\n' || start[len - 1] == '\r')) len--;
        while (len > 0 && (*start == '\n' || *start == '\r')) start++, len--;
        if (len == 0) continue;
        for (size_t i = 0; i < len; i++) d->n_lines += start[i] == '\n';
        int32_t *ids = NULL;
        int n = data_encode(tok, start, len, lp_tokenizer_bos(tok) >= 0, &ids, err);
        if (n < 0) {
            rc = lp_fail_prefix(err, "%s", path);
            break;
        }
        rc = stream_append(d, ids, (size_t)n, err);
        free(ids);
        if (rc == 0 && eos >= 0) rc = stream_append(d, &eos, 1, err);
        d->n_docs++;
    }
    free(text);
    if (rc == 0 && d->n_stream < 2) rc = lp_fail(err, "%s: no text", path);
    return rc;
}

/* ---- batches ------------------------------------------------------------------ */

int lp_train_batch_alloc(lp_train_batch_buf *bb, int B, int T, lp_error *err) {
    memset(bb, 0, sizeof *bb);
    size_t n = (size_t)B * (size_t)T;
    if (B <= 0 || T <= 0 || n > ((size_t)1 << 26)) return lp_fail(err, "bad batch %d x %d", B, T);
    bb->inputs = calloc(n, sizeof *bb->inputs);
    bb->targets = calloc(n, sizeof *bb->targets);
    bb->mask = calloc(n, sizeof *bb->mask);
    if (!bb->inputs || !bb->targets || !bb->mask) {
        lp_train_batch_free(bb);
        return lp_fail(err, "out of memory");
    }
    bb->batch = (lp_train_batch){.B = B, .T = T, .inputs = bb->inputs, .targets = bb->targets,
                                 .mask = bb->mask};
    return 0;
}

int lp_train_batch_enable_packing(lp_train_batch_buf *bb, lp_error *err) {
    size_t n = (size_t)bb->batch.B * (size_t)bb->batch.T, vis;
    if (!lp_mul_ok(n, (size_t)bb->batch.T, &vis)) return lp_fail(err, "batch too large to pack");
    if (!bb->pos) bb->pos = calloc(n, sizeof *bb->pos);
    if (!bb->visible) bb->visible = calloc(vis, 1);
    if (!bb->pos || !bb->visible) return lp_fail(err, "out of memory for packed batches");
    bb->batch.pos = bb->pos;
    bb->batch.visible = bb->visible;
    return 0;
}

/* Row r, positions [start, start+len): one segment with positions from 0
 * that sees only itself, causally. */
static void set_segment(lp_train_batch_buf *bb, int r, int start, int len) {
    int T = bb->batch.T;
    if (!bb->pos) return;
    for (int i = start; i < start + len; i++) {
        bb->pos[(size_t)r * T + i] = i - start;
        uint8_t *v = bb->visible + ((size_t)r * T + i) * T;
        memset(v, 0, (size_t)T);
        memset(v + start, 1, (size_t)(i - start + 1));
    }
}

void lp_train_batch_free(lp_train_batch_buf *bb) {
    free(bb->inputs);
    free(bb->targets);
    free(bb->mask);
    free(bb->pos);
    free(bb->visible);
    memset(bb, 0, sizeof *bb);
}

/* Writes ex at [start, T) of row r (truncated); returns the positions used. */
static int put_example(lp_train_batch_buf *bb, int r, int start, const lp_train_example *ex) {
    int T = bb->batch.T;
    int32_t *in = bb->inputs + (size_t)r * T, *tg = bb->targets + (size_t)r * T;
    float *mk = bb->mask + (size_t)r * T;
    int used = ex->n - 1 < T - start ? ex->n - 1 : T - start;
    for (int k = 0; k < used; k++) {
        in[start + k] = ex->ids[k];
        tg[start + k] = ex->ids[k + 1];
        /* target k+1 is a completion token (or the EOS) */
        mk[start + k] = k + 1 >= ex->n_prompt ? 1.0f : 0.0f;
    }
    set_segment(bb, r, start, used);
    return used;
}

/* Pads [start, T) of row r: no loss, each position sees only itself. */
static void pad_row(lp_train_batch_buf *bb, int r, int start) {
    int T = bb->batch.T;
    for (int t = start; t < T; t++) {
        bb->inputs[(size_t)r * T + t] = 0;
        bb->targets[(size_t)r * T + t] = 0;
        bb->mask[(size_t)r * T + t] = 0.0f;
        set_segment(bb, r, t, 1);
    }
}

void lp_train_batch_set_example(lp_train_batch_buf *bb, int r, const lp_train_example *ex) {
    int used = put_example(bb, r, 0, ex);
    pad_row(bb, r, used > 0 ? used : 0);
}

void lp_train_batch_set_window(lp_train_batch_buf *bb, int r, const int32_t *stream,
                               size_t start) {
    int T = bb->batch.T;
    for (int t = 0; t < T; t++) {
        bb->inputs[(size_t)r * T + t] = stream[start + t];
        bb->targets[(size_t)r * T + t] = stream[start + t + 1];
        bb->mask[(size_t)r * T + t] = 1.0f;
    }
    set_segment(bb, r, 0, T);
}

static uint64_t rng_below(lp_rng *rng, uint64_t n) { return lp_rng_u64(rng) % n; }

int lp_train_batch_sample(lp_train_batch_buf *bb, const lp_train_data *d, lp_rng *rng,
                          lp_error *err) {
    int T = bb->batch.T;
    bool text = d->n_stream > (size_t)T + 1, records = d->n_ex > 0;
    if (!text && !records)
        return lp_fail(err, "no training data (text shorter than one window of %d tokens?)", T + 1);
    if (records && !text && bb->visible) {
        /* packed: a record that doesn't fit opens the next row */
        int64_t pending = -1;
        for (int r = 0; r < bb->batch.B; r++) {
            int at = 0;
            for (;;) {
                int64_t i = pending >= 0 ? pending : (int64_t)rng_below(rng, (uint64_t)d->n_ex);
                pending = -1;
                const lp_train_example *ex = &d->ex[i];
                if (at > 0 && ex->n - 1 > T - at) {
                    pending = i;
                    break;
                }
                int used = put_example(bb, r, at, ex);
                at += used;
                if (at >= T || used <= 0) break;
            }
            pad_row(bb, r, at);
        }
        return 0;
    }
    for (int r = 0; r < bb->batch.B; r++) {
        bool use_text = text && (!records || r % 2 == 0);
        if (use_text)
            lp_train_batch_set_window(bb, r, d->stream, rng_below(rng, d->n_stream - (size_t)T));
        else
            lp_train_batch_set_example(bb, r, &d->ex[rng_below(rng, (uint64_t)d->n_ex)]);
    }
    return 0;
}
