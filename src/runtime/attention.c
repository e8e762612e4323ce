/* Attention, the runtime's op for every graph: each row of the batch
 * attends over its sequence's committed KV (paged blocks) followed by its
 * chain of parent rows in the batch, so prefill chains, decode rows of many
 * sequences and speculative trees are one loop. Work is split across the
 * pool by each row's visible entries. */
#include "context.h"

#include <math.h>
#include <string.h>

float *lp_batch_keys(const lp_context *ctx, int l) {
    size_t kv_dim = (size_t)ctx->model->hp.n_kv_heads * (size_t)ctx->model->hp.head_dim;
    return ctx->k_new + (size_t)l * (size_t)ctx->params.max_rows * kv_dim;
}

float *lp_batch_values(const lp_context *ctx, int l) {
    size_t kv_dim = (size_t)ctx->model->hp.n_kv_heads * (size_t)ctx->model->hp.head_dim;
    return ctx->v_new + (size_t)l * (size_t)ctx->params.max_rows * kv_dim;
}

void lp_attention_key_ready(lp_context *ctx, int l, int r) {
    int64_t kv_dim = (int64_t)ctx->model->hp.n_kv_heads * ctx->model->hp.head_dim;
    float *k = lp_batch_keys(ctx, l) + r * kv_dim, *v = lp_batch_values(ctx, l) + r * kv_dim;
    if (ctx->kv.f16) {
        /* what the cache will hold, so this row's own batch (chains,
         * speculative trees) reads exactly the values a later row reads
         * back from the cache */
        ctx->kern.round_f16(k, kv_dim);
        ctx->kern.round_f16(v, kv_dim);
    }
    /* the batch's keys transposed, as the cache's blocks hold them, where
     * attention reads runs of them (with 8 decode streams the rows'
     * columns share cache lines between the threads) */
    if (ctx->batch_has_runs) {
        int64_t rows = ctx->params.max_rows;
        for (int64_t i = 0; i < kv_dim; i++) ctx->k_new_t[i * rows + r] = k[i];
    }
}

typedef struct attention_task {
    lp_context *ctx;
    int layer;
    const float *q;
    int64_t q_stride;
    float *out;
    int64_t out_stride;
} attention_task;

/* A block's keys, and its values, are short streams of their own (4 KiB
 * each at head dim 64: the hardware prefetchers stop at page ends), so
 * attention fetches the next block's keys while it scores one, and the
 * values the mix will read. */
static void prefetch(const void *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o, 0, 3);
}

/* One row and one KV head, for the query heads that share it (grouped-
 * query attention): softmax(q·K/sqrt(d)) V over a forecast row's KV prefix
 * (lp_context_bind_kv_prefix), the sequence's committed entries, block by
 * block, then the row's parent chain (nearest first). Each key and value is
 * read once for all those heads. */
static void attend_group(const attention_task *task, int r, int g, float *scores, int *run_last) {
    lp_context *ctx = task->ctx;
    int layer = task->layer;
    const lp_hparams *hp = &ctx->model->hp;
    const lp_kv_cache *kv = &ctx->kv;
    int d = hp->head_dim, per = hp->n_heads / hp->n_kv_heads, h0 = g * per;
    size_t kv_dim = (size_t)hp->n_kv_heads * (size_t)d, rows = (size_t)ctx->params.max_rows;
    const float *q = task->q + (size_t)r * (size_t)task->q_stride + (size_t)h0 * (size_t)d;
    const lp_seq *s = &ctx->seqs[ctx->rows[r].seq];
    float scale = 1.0f / sqrtf((float)d);
    const float *k_batch = ctx->k_new + (size_t)layer * rows * kv_dim + (size_t)g * (size_t)d;
    const float *k_batch_t = ctx->k_new_t + (size_t)g * (size_t)d * rows;
    const float *v_batch = ctx->v_new + (size_t)layer * rows * kv_dim + (size_t)g * (size_t)d;
    /* scores of head h0 + i at scores[i * n_all ...]: the row's KV prefix
     * (forecast rows), then committed entries, then the chain */
    int table = ctx->rows[r].embd, n_pre = table > 0 ? ctx->embd_prefix_n[table] : 0;
    const float *pre = n_pre ? ctx->embd_prefix[table] + (size_t)layer * 2 * (size_t)n_pre * kv_dim : NULL;
    int n_all = n_pre + s->length + ctx->chain_len[r];
    for (int i = 0; i < n_pre; i++)
        ctx->kern.attn_scores(q, d, per, pre + (size_t)i * kv_dim + (size_t)g * (size_t)d, false, 1, 1, d, scale,
                              scores + i, n_all);
    float *tail = scores + n_pre; /* committed entries, then the chain */
    int bt = kv->block_tokens;
    size_t block_bytes = (size_t)bt * (size_t)d * kv->elem_bytes;
    for (int t = 0; t < s->length; t += bt) {
        int nk = s->length - t < bt ? s->length - t : bt;
        const void *kt = lp_kv_keys(kv, s->blocks[t / bt], layer, g);
        if (t + bt < s->length) prefetch(lp_kv_keys(kv, s->blocks[t / bt + 1], layer, g), block_bytes);
        prefetch(lp_kv_value(kv, s->blocks[t / bt], layer, g, 0), (size_t)nk * (size_t)d * kv->elem_bytes);
        ctx->kern.attn_scores(q, d, per, kt, kv->f16, bt, nk, d, scale, tail + t, n_all);
    }
    /* The chain in position order, as the entries would be once committed,
     * in runs of consecutive rows (a prefill chain is one run) from the
     * nearest run back: so a row's terms come in one order whether its
     * parents are in the cache or in the batch (a speculative tree's rows
     * equal plain decoding bit for bit) */
    int n = n_all - n_pre, n_runs = 0;
    for (int a = r; a >= 0;) {
        int len = ctx->run_len[a], first = a - len + 1;
        n -= len;
        /* one key is its own transpose (k_new_t is filled only for batches
         * with longer runs) */
        if (len == 1)
            ctx->kern.attn_scores(q, d, per, k_batch + (size_t)a * kv_dim, false, 1, 1, d, scale, tail + n, n_all);
        else
            ctx->kern.attn_scores(q, d, per, k_batch_t + first, false, (int64_t)rows, len, d, scale, tail + n,
                                  n_all);
        run_last[n_runs++] = a;
        a = ctx->rows[first].parent;
    }
    for (int i = 0; i < per; i++) ctx->kern.softmax(scores + (size_t)i * (size_t)n_all, n_all);

    float *out = task->out + (size_t)r * (size_t)task->out_stride + (size_t)h0 * (size_t)d;
    memset(out, 0, (size_t)per * (size_t)d * sizeof(float));
    if (n_pre)
        ctx->kern.attn_mix(out, d, per, scores, n_all, pre + (size_t)n_pre * kv_dim + (size_t)g * (size_t)d, false,
                           (int64_t)kv_dim, n_pre, d);
    for (int t = 0; t < s->length; t += bt) {
        int nk = s->length - t < bt ? s->length - t : bt;
        const void *v = lp_kv_value(kv, s->blocks[t / bt], layer, g, 0);
        ctx->kern.attn_mix(out, d, per, tail + t, n_all, v, kv->f16, d, nk, d);
    }
    /* the runs farthest first */
    n = s->length;
    for (int k = n_runs - 1; k >= 0; k--) {
        int len = ctx->run_len[run_last[k]], first = run_last[k] - len + 1;
        ctx->kern.attn_mix(out, d, per, tail + n, n_all, v_batch + (size_t)first * kv_dim, false, (int64_t)kv_dim,
                           len, d);
        n += len;
    }
}

/* The first item (KV head g, row r at g * n + r) whose work starts at or
 * after `at`, the work of all items before it being their rows' visible
 * entries. */
static int64_t attention_item_at(const lp_context *ctx, double at) {
    int64_t n = ctx->n_rows, n_kv = ctx->model->hp.n_kv_heads;
    double per_head = ctx->attn_cost[n - 1];
    if (per_head <= 0) return 0;
    int64_t g = (int64_t)(at / per_head);
    if (g >= n_kv) return n * n_kv;
    double in_head = at - (double)g * per_head;
    /* rows whose cumulative cost (through them) is <= in_head lie before */
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        double before = mid > 0 ? ctx->attn_cost[mid - 1] : 0;
        if (before < in_head) lo = mid + 1;
        else hi = mid;
    }
    return g * n + lo;
}

void lp_attention_share(const lp_context *ctx, int thread, int n_threads, int64_t *begin, int64_t *end) {
    double total = ctx->attn_cost[ctx->n_rows - 1] * ctx->model->hp.n_kv_heads;
    *begin = thread == 0 ? 0 : attention_item_at(ctx, total * thread / n_threads);
    *end = thread == n_threads - 1 ? (int64_t)ctx->n_rows * ctx->model->hp.n_kv_heads
                                    : attention_item_at(ctx, total * (thread + 1) / n_threads);
}

bool lp_attention_parallel(const lp_context *ctx) {
    /* small attention (tiny models, short contexts) runs inline: waking the
     * pool would cost more than the work */
    const lp_hparams *hp = &ctx->model->hp;
    return ctx->attn_cost[ctx->n_rows - 1] * (double)hp->n_heads * (double)hp->head_dim >= 65536.0;
}

static void attention_worker(void *arg, int thread, int n_threads) {
    attention_task *task = arg;
    lp_context *ctx = task->ctx;
    float *scores = ctx->scores + (size_t)thread * ctx->score_len;
    int *run_last = ctx->run_last + (size_t)thread * (size_t)ctx->params.max_rows;
    /* KV head major: the rows of one head follow each other on one thread,
     * so streams sharing a prompt read its keys and values from memory
     * once, not once per row and thread */
    int64_t begin, end, n = ctx->n_rows;
    lp_attention_share(ctx, thread, n_threads, &begin, &end);
    for (int64_t i = begin; i < end; i++) {
        int r = (int)(i % n), g = (int)(i / n);
        attend_group(task, r, g, scores, run_last);
        if (ctx->rows[r].commit) lp_kv_store_row(ctx, r, task->layer, g);
    }
}

void lp_attention(lp_context *ctx, int l, const float *q, int64_t q_stride, float *out, int64_t out_stride) {
    attention_task task = {.ctx = ctx, .layer = l, .q = q, .q_stride = q_stride, .out = out,
                           .out_stride = out_stride};
    lp_threadpool_run(lp_attention_parallel(ctx) ? ctx->pool : NULL, attention_worker, &task);
}
