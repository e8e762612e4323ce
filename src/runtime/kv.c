/* Paged KV cache: blocks with reference counts, sequences as block lists,
 * fork by sharing, copy-on-write of a shared partial block on append. */
#include "context.h"

#include <string.h>

/* V is laid out [layer][kv head][block][token][head_dim], K the same but
 * transposed within a block, [head_dim][token]: one head's entries in
 * consecutive blocks lie one after another, so attention over a sequence
 * whose blocks were handed out in order (the free list gives ascending ids)
 * reads one stream per head. Transposed keys put the tokens in vector
 * lanes, so a score is one fma chain with no reduction across lanes (8
 * decode streams over a 128-token prompt, TinyLlama shape, 2 threads:
 * attention 2.36 -> 1.84 ms per step, with the prefetch and head-major
 * order of forward.c). */
static size_t block_offset(const lp_kv_cache *kv, int block, int layer, int head, int token) {
    size_t stream = (size_t)layer * (size_t)kv->n_kv_heads + (size_t)head;
    return ((stream * (size_t)kv->n_blocks + (size_t)block) * (size_t)kv->block_tokens + (size_t)token) *
           (size_t)kv->head_dim * kv->elem_bytes;
}

void *lp_kv_keys(const lp_kv_cache *kv, int block, int layer, int head) {
    return kv->k + block_offset(kv, block, layer, head, 0);
}

void *lp_kv_value(const lp_kv_cache *kv, int block, int layer, int head, int token) {
    return kv->v + block_offset(kv, block, layer, head, token);
}

/* One head's n values into the cache's element type. With f16 they were
 * rounded to f16 when made (qkv_finish_row), so the conversion is exact. */
static void kv_store(const lp_context *ctx, void *dst, const float *src, int n) {
    if (ctx->kv.f16) ctx->kern.to_f16(dst, src, n);
    else memcpy(dst, src, (size_t)n * sizeof(float));
}

/* One head's key (n values) into column `slot` of its transposed block. */
static void kv_store_key(const lp_context *ctx, void *keys, int slot, const float *src, int n) {
    int bt = ctx->kv.block_tokens;
    if (ctx->kv.f16) {
        uint16_t h[LP_HEAD_DIM_MAX];
        ctx->kern.to_f16(h, src, n);
        for (int c = 0; c < n; c++) ((uint16_t *)keys)[(size_t)c * bt + slot] = h[c];
    } else {
        for (int c = 0; c < n; c++) ((float *)keys)[(size_t)c * bt + slot] = src[c];
    }
}

static int block_alloc(lp_kv_cache *kv) {
    if (kv->n_free == 0) return -1;
    int b = kv->free_list[--kv->n_free];
    kv->refcount[b] = 1;
    return b;
}

static void block_release(lp_kv_cache *kv, int b) {
    if (--kv->refcount[b] == 0) kv->free_list[kv->n_free++] = b;
}

int lp_kv_blocks_needed(const lp_context *ctx, int seq, int n) {
    const lp_kv_cache *kv = &ctx->kv;
    const lp_seq *s = &ctx->seqs[seq];
    int bt = kv->block_tokens, used = s->length % bt, needed = 0;
    if (n <= 0) return 0;
    if (used != 0) {
        if (kv->refcount[s->blocks[s->length / bt]] > 1) needed++; /* copy-on-write */
        int room = bt - used;
        n -= room < n ? room : n;
    }
    return needed + (n + bt - 1) / bt;
}

void lp_kv_reserve_row(lp_context *ctx, int r, int pos) {
    lp_kv_cache *kv = &ctx->kv;
    const lp_hparams *hp = &ctx->model->hp;
    lp_seq *s = &ctx->seqs[ctx->rows[r].seq];
    int bt = kv->block_tokens, slot = pos % bt, bi = pos / bt;
    if (slot == 0) {
        s->blocks[bi] = block_alloc(kv);
    } else if (kv->refcount[s->blocks[bi]] > 1) {
        /* The partial block is shared with another sequence: copy it first. */
        int old = s->blocks[bi], fresh = block_alloc(kv);
        size_t bytes = (size_t)bt * (size_t)hp->head_dim * kv->elem_bytes;
        for (int l = 0; l < hp->n_layers; l++)
            for (int h = 0; h < hp->n_kv_heads; h++) {
                memcpy(lp_kv_keys(kv, fresh, l, h), lp_kv_keys(kv, old, l, h), bytes);
                memcpy(lp_kv_value(kv, fresh, l, h, 0), lp_kv_value(kv, old, l, h, 0), bytes);
            }
        block_release(kv, old);
        s->blocks[bi] = fresh;
    }
    ctx->commit_block[r] = s->blocks[bi];
    ctx->commit_slot[r] = slot;
}

void lp_kv_store_row(const lp_context *ctx, int r, int layer, int head) {
    const lp_kv_cache *kv = &ctx->kv;
    int d = ctx->model->hp.head_dim, block = ctx->commit_block[r];
    size_t at = ((size_t)layer * (size_t)ctx->params.max_rows + (size_t)r) * (size_t)kv->n_kv_heads * (size_t)d +
                (size_t)head * (size_t)d;
    kv_store_key(ctx, lp_kv_keys(kv, block, layer, head), ctx->commit_slot[r], ctx->k_new + at, d);
    kv_store(ctx, lp_kv_value(kv, block, layer, head, ctx->commit_slot[r]), ctx->v_new + at, d);
}

void lp_kv_finish_row(lp_context *ctx, int r) {
    lp_seq *s = &ctx->seqs[ctx->rows[r].seq];
    s->tokens[s->length] = ctx->rows[r].embd > 0 ? -1 : ctx->rows[r].token;
    s->tags[s->length] = ctx->row_tag[r];
    s->length++;
}

void lp_kv_unreserve_row(lp_context *ctx, int r) {
    /* a fresh block was taken for an entry at a block start; a private copy
     * of a shared partial block holds the same entries, so it stays */
    if (ctx->commit_slot[r] == 0) block_release(&ctx->kv, ctx->commit_block[r]);
}

void lp_kv_append_row(lp_context *ctx, int r) {
    const lp_hparams *hp = &ctx->model->hp;
    lp_kv_reserve_row(ctx, r, ctx->seqs[ctx->rows[r].seq].length);
    for (int l = 0; l < hp->n_layers; l++)
        for (int h = 0; h < hp->n_kv_heads; h++) lp_kv_store_row(ctx, r, l, h);
    lp_kv_finish_row(ctx, r);
}

/* ---- public sequence API ------------------------------------------------------- */

static bool seq_ok(const lp_context *ctx, int seq) {
    return seq >= 0 && seq < ctx->params.max_sequences;
}

int lp_seq_length(const lp_context *ctx, int seq) {
    return seq_ok(ctx, seq) ? ctx->seqs[seq].length : -1;
}

int lp_seq_truncate(lp_context *ctx, int seq, int n, lp_error *err) {
    if (!seq_ok(ctx, seq)) return lp_fail(err, "sequence %d does not exist", seq);
    lp_seq *s = &ctx->seqs[seq];
    if (n < 0 || n > s->length)
        return lp_fail(err, "cannot truncate sequence %d of length %d to %d", seq, s->length, n);
    int bt = ctx->kv.block_tokens;
    int keep_blocks = (n + bt - 1) / bt, have_blocks = (s->length + bt - 1) / bt;
    for (int b = keep_blocks; b < have_blocks; b++) block_release(&ctx->kv, s->blocks[b]);
    s->length = n;
    return 0;
}

void lp_seq_clear(lp_context *ctx, int seq) {
    if (seq_ok(ctx, seq)) lp_seq_truncate(ctx, seq, 0, NULL);
}

int lp_seq_fork(lp_context *ctx, int src, int dst, lp_error *err) {
    if (!seq_ok(ctx, src) || !seq_ok(ctx, dst))
        return lp_fail(err, "cannot fork sequence %d into %d: no such sequence", src, dst);
    if (src == dst) return 0;
    lp_seq_clear(ctx, dst);
    const lp_seq *s = &ctx->seqs[src];
    lp_seq *d = &ctx->seqs[dst];
    int bt = ctx->kv.block_tokens, nb = (s->length + bt - 1) / bt;
    for (int b = 0; b < nb; b++) {
        d->blocks[b] = s->blocks[b];
        ctx->kv.refcount[s->blocks[b]]++;
    }
    d->length = s->length;
    memcpy(d->tokens, s->tokens, (size_t)s->length * sizeof(int32_t));
    memcpy(d->tags, s->tags, (size_t)s->length * sizeof(uint64_t));
    return 0;
}

int lp_seq_entry(const lp_context *ctx, int seq, int pos, int32_t *token, uint64_t *adapter_identity) {
    if (!seq_ok(ctx, seq) || pos < 0 || pos >= ctx->seqs[seq].length) return -1;
    if (token) *token = ctx->seqs[seq].tokens[pos];
    if (adapter_identity) *adapter_identity = ctx->seqs[seq].tags[pos];
    return 0;
}

size_t lp_kv_block_bytes(const lp_context *ctx) { return 2 * ctx->kv.block_elems * ctx->kv.elem_bytes; }

void lp_kv_usage(const lp_context *ctx, int *used, int *total, int *block_tokens) {
    if (used) *used = ctx->kv.n_blocks - ctx->kv.n_free;
    if (total) *total = ctx->kv.n_blocks;
    if (block_tokens) *block_tokens = ctx->kv.block_tokens;
}
