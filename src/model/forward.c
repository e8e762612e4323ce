/* The one forward pass, and the context that plans its buffers.
 *
 * A batch of rows goes through the layers together: every matrix multiply
 * sees all rows at once (so prefill reuses each weight row across tokens),
 * and attention lets each row see its sequence's committed KV plus its chain
 * of parent rows in the batch. Prefill, decode of many sequences and
 * speculative trees are all just batches. */
#include "context.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define KV_BLOCK_TOKENS 32
#define MAX_POSITION (1 << 24)

lp_context_params lp_context_default_params(void) {
    lp_context_params p = {0};
    p.n_threads = 0;
    p.max_rows = 512;
    p.max_sequences = 16;
    p.max_logit_rows = 64;
    p.n_ctx = 0;
    p.max_seq_len = 0;
    p.max_adapters = 8;
    p.max_adapter_rank = 256;
    p.max_embd_tables = 4;
    return p;
}

/* ---- context creation: the plan ------------------------------------------------- */

/* One adapter group's share of a projection: its rows' shrunk activations
 * (t, kr wide) and expanded outputs (y, out wide) in the LoRA buffers. */
typedef struct lora_piece {
    const lp_lora_pair *pair;
    int slot;
    const int *rows;      /* batch row of each group row; NULL: rows 0..n-1 */
    int n;
    float *t, *y, *dst;   /* dst: the projection's output rows */
    int64_t kr, out, dst_stride;
} lora_piece;

/* The LoRA work collected so far: shrink tasks (x A^T -> t), expand tasks
 * (t B^T -> y), one piece per (group, projection). */
typedef struct lora_batch {
    int n;
    size_t t_used, y_used;
    lora_piece piece[LP_MATMUL_TASKS_MAX];
    lp_matmul_task shrink[LP_MATMUL_TASKS_MAX], expand[LP_MATMUL_TASKS_MAX];
} lora_batch;

static void *plan_alloc(size_t count, size_t elem, bool *ok) {
    size_t bytes;
    if (!lp_mul_ok(count, elem, &bytes)) {
        *ok = false;
        return NULL;
    }
    void *p = lp_alloc(bytes);
    if (!p) *ok = false;
    return p;
}

static void *plan_alloc_uninit(size_t count, size_t elem, bool *ok) {
    size_t bytes;
    void *p = lp_mul_ok(count, elem, &bytes) ? lp_alloc_uninit(bytes) : NULL;
    if (!p) *ok = false;
    return p;
}

static int resolve_params(const lp_model *m, const lp_context_params *in,
                          lp_context_params *p, lp_error *err) {
    *p = in ? *in : lp_context_default_params();
    if (p->n_threads <= 0) p->n_threads = lp_default_threads();
    if (p->max_rows <= 0) p->max_rows = 512;
    if (p->max_sequences <= 0) p->max_sequences = 16;
    if (p->max_logit_rows <= 0) p->max_logit_rows = 64;
    if (p->max_logit_rows > p->max_rows) p->max_logit_rows = p->max_rows;
    if (p->n_ctx <= 0) p->n_ctx = m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096;
    if (p->n_ctx < 1) p->n_ctx = 4096;
    if (p->max_seq_len <= 0 || p->max_seq_len > p->n_ctx) p->max_seq_len = p->n_ctx;
    if (p->max_adapters <= 0) p->max_adapters = 8;
    if (p->max_adapter_rank <= 0) p->max_adapter_rank = 256;
    if (p->max_embd_tables <= 0) p->max_embd_tables = 4;
    if (p->max_embd_tables > 4096)
        return lp_fail(err, "max_embd_tables %d out of range (1..4096)", p->max_embd_tables);
    if (p->max_adapters > 4096 || p->max_adapter_rank > 65536)
        return lp_fail(err, "adapter limits out of range (max_adapters %d, max_adapter_rank %d)",
                       p->max_adapters, p->max_adapter_rank);
    if (p->max_rows > 65536 || p->max_sequences > 65536 || p->n_ctx > (1 << 24))
        return lp_fail(err, "context parameters out of range (max_rows %d, max_sequences %d, n_ctx %d)",
                       p->max_rows, p->max_sequences, p->n_ctx);
    return 0;
}

static int kv_init(lp_context *ctx, lp_error *err) {
    const lp_hparams *hp = &ctx->model->hp;
    lp_kv_cache *kv = &ctx->kv;
    kv->block_tokens = KV_BLOCK_TOKENS;
    kv->n_layers = hp->n_layers;
    kv->n_kv_heads = hp->n_kv_heads;
    kv->head_dim = hp->head_dim;
    /* Budget: n_ctx tokens, plus one spare block per sequence for the
     * copy-on-write of a shared partial block. */
    kv->n_blocks = (ctx->params.n_ctx + kv->block_tokens - 1) / kv->block_tokens +
                   ctx->params.max_sequences;
    kv->f16 = !ctx->params.kv_f32;
    kv->elem_bytes = kv->f16 ? sizeof(uint16_t) : sizeof(float);
    kv->block_elems = (size_t)hp->n_layers * (size_t)hp->n_kv_heads *
                      (size_t)kv->block_tokens * (size_t)hp->head_dim;
    bool ok = true;
    size_t total;
    if (!lp_mul_ok(kv->block_elems, (size_t)kv->n_blocks, &total))
        return lp_fail(err, "KV cache size overflows");
    /* not zero-filled: an entry is read only after it was written */
    kv->k = plan_alloc_uninit(total, kv->elem_bytes, &ok);
    kv->v = plan_alloc_uninit(total, kv->elem_bytes, &ok);
    kv->refcount = plan_alloc((size_t)kv->n_blocks, sizeof(int), &ok);
    kv->free_list = plan_alloc((size_t)kv->n_blocks, sizeof(int), &ok);
    if (!ok) return lp_error_set(err, LP_ERR_NOMEM, "out of memory for a KV cache of %d tokens", ctx->params.n_ctx);
    for (int b = 0; b < kv->n_blocks; b++) kv->free_list[b] = kv->n_blocks - 1 - b;
    kv->n_free = kv->n_blocks;

    ctx->max_blocks_per_seq = (ctx->params.max_seq_len + kv->block_tokens - 1) / kv->block_tokens;
    ctx->seqs = plan_alloc((size_t)ctx->params.max_sequences, sizeof(lp_seq), &ok);
    for (int s = 0; ok && s < ctx->params.max_sequences; s++) {
        lp_seq *seq = &ctx->seqs[s];
        seq->blocks = plan_alloc((size_t)ctx->max_blocks_per_seq, sizeof(int), &ok);
        seq->tokens = plan_alloc((size_t)ctx->params.max_seq_len, sizeof(int32_t), &ok);
        seq->tags = plan_alloc((size_t)ctx->params.max_seq_len, sizeof(uint64_t), &ok);
    }
    return ok ? 0 : lp_error_set(err, LP_ERR_NOMEM, "out of memory for sequence tables");
}

lp_context *lp_context_create(const lp_model *m, const lp_context_params *params,
                              lp_error *err) {
    lp_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) {
        lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    ctx->model = m;
    if (resolve_params(m, params, &ctx->params, err)) goto fail;
    lp_cpu_features cpu;
    lp_cpu_detect(&cpu);
    lp_kernels_init(&ctx->kern, &cpu);
    ctx->kern.int8_activations = m->int8_activations; /* recorded in .lpx files */
    ctx->pool = lp_threadpool_create(ctx->params.n_threads, err);
    if (!ctx->pool) goto fail;
    if (kv_init(ctx, err)) goto fail;
    {
        const lp_hparams *h = &m->hp;
        int64_t widest_in = h->dim;
        if ((int64_t)h->n_heads * h->head_dim > widest_in) widest_in = (int64_t)h->n_heads * h->head_dim;
        if (h->ffn_dim > widest_in) widest_in = h->ffn_dim;
        /* scratch for int8-quantized activations of integer kernels */
        if (lp_kernels_reserve(&ctx->kern, ctx->params.max_rows, widest_in, err)) goto fail;
    }

    const lp_hparams *hp = &m->hp;
    size_t rows = (size_t)ctx->params.max_rows, logit_rows = (size_t)ctx->params.max_logit_rows;
    size_t q_dim = (size_t)hp->n_heads * (size_t)hp->head_dim;
    size_t kv_dim = (size_t)hp->n_kv_heads * (size_t)hp->head_dim;
    size_t wide = q_dim > (size_t)hp->dim ? q_dim : (size_t)hp->dim;
    /* one row's scores for the query heads of one KV head */
    size_t score_len = ((size_t)ctx->params.max_seq_len + rows) * (size_t)(hp->n_heads / hp->n_kv_heads);
    bool ok = true;
    ctx->x = plan_alloc(rows * (size_t)hp->dim, sizeof(float), &ok);
    ctx->xn = plan_alloc(rows * wide, sizeof(float), &ok);
    ctx->q = plan_alloc(rows * q_dim, sizeof(float), &ok);
    ctx->k_new = plan_alloc((size_t)hp->n_layers * rows * kv_dim, sizeof(float), &ok);
    ctx->k_new_t = plan_alloc(rows * kv_dim, sizeof(float), &ok);
    ctx->v_new = plan_alloc((size_t)hp->n_layers * rows * kv_dim, sizeof(float), &ok);
    /* gate doubles as the attention-projection output, so it is at least dim
     * wide; with fused gate|up it holds both halves of each row */
    bool fused_qkv = false, fused_gate_up = false;
    for (int l = 0; l < hp->n_layers; l++) {
        fused_qkv |= m->layers[l].wqkv.data != NULL;
        fused_gate_up |= m->layers[l].w_gate_up.data != NULL;
    }
    size_t ffn_w = (size_t)hp->ffn_dim * (fused_gate_up ? 2 : 1);
    size_t gate_w = ffn_w > (size_t)hp->dim ? ffn_w : (size_t)hp->dim;
    if (fused_qkv) ctx->qkv = plan_alloc(rows * (q_dim + 2 * kv_dim), sizeof(float), &ok);
    ctx->gate = plan_alloc(rows * gate_w, sizeof(float), &ok);
    ctx->up = plan_alloc(rows * (size_t)hp->ffn_dim, sizeof(float), &ok);
    ctx->rope_cos = plan_alloc(rows * (size_t)(hp->head_dim / 2), sizeof(float), &ok);
    ctx->rope_sin = plan_alloc(rows * (size_t)(hp->head_dim / 2), sizeof(float), &ok);
    ctx->scores = plan_alloc((size_t)ctx->params.n_threads * score_len, sizeof(float), &ok);
    ctx->logit_in = plan_alloc(logit_rows * (size_t)hp->dim, sizeof(float), &ok);
    ctx->logits = plan_alloc(logit_rows * (size_t)hp->n_vocab, sizeof(float), &ok);
    ctx->logit_slot = plan_alloc(rows, sizeof(int), &ok);
    ctx->rows = plan_alloc(rows, sizeof(lp_row), &ok);
    ctx->commit_count = plan_alloc((size_t)ctx->params.max_sequences, sizeof(int), &ok);
    ctx->commit_block = plan_alloc(rows, sizeof(int), &ok);
    ctx->commit_slot = plan_alloc(rows, sizeof(int), &ok);
    ctx->chain_len = plan_alloc(rows, sizeof(int), &ok);
    ctx->run_len = plan_alloc(rows, sizeof(int), &ok);
    ctx->row_tag = plan_alloc(rows, sizeof(uint64_t), &ok);
    ctx->attn_cost = plan_alloc(rows, sizeof(double), &ok);
    ctx->embd = plan_alloc((size_t)ctx->params.max_embd_tables + 1, sizeof(const float *), &ok);
    ctx->embd_rows = plan_alloc((size_t)ctx->params.max_embd_tables + 1, sizeof(int), &ok);
    size_t widest = wide > (size_t)hp->ffn_dim ? wide : (size_t)hp->ffn_dim;
    ctx->max_rank = ctx->params.max_adapter_rank;
    ctx->slots = plan_alloc((size_t)ctx->params.max_adapters + 1, sizeof(lp_slot), &ok);
    ctx->group_rows = plan_alloc(rows, sizeof(int), &ok);
    ctx->group_start = plan_alloc((size_t)ctx->params.max_adapters + 2, sizeof(int), &ok);
    /* LoRA buffers: q, k and v (or gate and up) of every row at once; a
     * batch that needs more (one-hot over many adapters) flushes in parts */
    size_t qkv_out = q_dim + 2 * kv_dim, gate_up_out = 2 * (size_t)hp->ffn_dim;
    size_t lora_out = qkv_out > gate_up_out ? qkv_out : gate_up_out;
    if (lora_out < widest) lora_out = widest;
    size_t padded_rank = ((size_t)ctx->max_rank + 31) & ~(size_t)31; /* packed B pads to 32 */
    ctx->lora_t_cap = rows * 3 * padded_rank;
    ctx->lora_y_cap = rows * lora_out;
    ctx->lora_x = plan_alloc(rows * widest, sizeof(float), &ok);
    ctx->lora_t = plan_alloc(ctx->lora_t_cap, sizeof(float), &ok);
    ctx->lora_y = plan_alloc(ctx->lora_y_cap, sizeof(float), &ok);
    ctx->lora_batch = plan_alloc(1, sizeof(lora_batch), &ok);
    if (!ok) {
        lp_error_set(err, LP_ERR_NOMEM, "out of memory planning buffers for %zu rows", rows);
        goto fail;
    }
    return ctx;
fail:
    lp_context_free(ctx);
    return NULL;
}

void lp_context_free(lp_context *ctx) {
    if (!ctx) return;
    lp_threadpool_destroy(ctx->pool);
    lp_kernels_free(&ctx->kern);
    lp_free(ctx->kv.k);
    lp_free(ctx->kv.v);
    lp_free(ctx->kv.refcount);
    lp_free(ctx->kv.free_list);
    if (ctx->seqs)
        for (int s = 0; s < ctx->params.max_sequences; s++) {
            lp_free(ctx->seqs[s].blocks);
            lp_free(ctx->seqs[s].tokens);
            lp_free(ctx->seqs[s].tags);
        }
    lp_free(ctx->seqs);
    void *bufs[] = {ctx->x, ctx->xn, ctx->q, ctx->qkv, ctx->k_new, ctx->k_new_t, ctx->v_new, ctx->gate, ctx->up,
                    ctx->rope_cos, ctx->rope_sin, ctx->scores, ctx->logit_in, ctx->logits,
                    ctx->logit_slot, ctx->rows, ctx->commit_count, ctx->commit_block, ctx->commit_slot,
                    ctx->chain_len, ctx->run_len, ctx->row_tag, ctx->attn_cost, (void *)ctx->embd,
                    ctx->embd_rows, ctx->slots, ctx->group_rows, ctx->group_start, ctx->lora_x,
                    ctx->lora_t, ctx->lora_y, ctx->lora_batch};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) lp_free(bufs[i]);
    free(ctx);
}

const lp_model *lp_context_model(const lp_context *ctx) { return ctx->model; }

void lp_context_get_params(const lp_context *ctx, lp_context_params *params) { *params = ctx->params; }

/* ---- batch validation ------------------------------------------------------------ */

static int validate_batch(lp_context *ctx, const lp_row *rows, int n, lp_error *err) {
    const lp_context_params *p = &ctx->params;
    if (n < 1 || n > p->max_rows)
        return lp_fail(err, "batch of %d rows (this context takes 1 to %d)", n, p->max_rows);
    int n_logits = 0;
    memset(ctx->commit_count, 0, (size_t)p->max_sequences * sizeof(int));
    for (int i = 0; i < n; i++) {
        const lp_row *r = &rows[i];
        if (r->embd < 0 || r->embd > p->max_embd_tables || (r->embd > 0 && !ctx->embd[r->embd]))
            return lp_fail(err, "row %d: embedding table %d is not bound", i, r->embd);
        if (r->embd > 0 && (r->token < 0 || r->token >= ctx->embd_rows[r->embd]))
            return lp_fail(err, "row %d: row %d is outside embedding table %d (%d rows)", i, r->token,
                           r->embd, ctx->embd_rows[r->embd]);
        if (r->embd == 0 && (r->token < 0 || r->token >= ctx->model->hp.n_vocab))
            return lp_fail(err, "row %d: token %d is outside the vocabulary (%d)", i, r->token,
                           ctx->model->hp.n_vocab);
        if (r->seq < 0 || r->seq >= p->max_sequences)
            return lp_fail(err, "row %d: sequence %d does not exist (0..%d)", i, r->seq,
                           p->max_sequences - 1);
        if (r->pos < 0 || r->pos >= MAX_POSITION)
            return lp_fail(err, "row %d: position %d out of range", i, r->pos);
        if (r->adapter < 0 || r->adapter > p->max_adapters ||
            (r->adapter > 0 && !ctx->slots[r->adapter].adapter))
            return lp_fail(err, "row %d: adapter slot %d is not bound", i, r->adapter);
        if (r->parent < -1 || r->parent >= i)
            return lp_fail(err, "row %d: parent %d must be an earlier row or -1", i, r->parent);
        if (r->parent >= 0 && rows[r->parent].seq != r->seq)
            return lp_fail(err, "row %d: parent row %d belongs to another sequence", i, r->parent);
        if (r->logits) n_logits++;
        if (r->commit) ctx->commit_count[r->seq]++;
    }
    if (n_logits > p->max_logit_rows)
        return lp_fail(err, "%d rows ask for logits (this context allows %d)", n_logits,
                       p->max_logit_rows);
    int blocks = 0;
    for (int s = 0; s < p->max_sequences; s++) {
        int c = ctx->commit_count[s];
        if (c == 0) continue;
        if (ctx->seqs[s].length + c > p->max_seq_len)
            return lp_error_set(err, LP_ERR_KV_FULL, "sequence %d would grow to %d tokens (limit %d)", s,
                                  ctx->seqs[s].length + c, p->max_seq_len);
        blocks += lp_kv_blocks_needed(ctx, s, c);
    }
    if (blocks > ctx->kv.n_free)
        return lp_error_set(err, LP_ERR_KV_FULL, "KV cache full: %d blocks needed, %d free", blocks,
                              ctx->kv.n_free);
    return 0;
}

/* ---- per-row helpers ----------------------------------------------------------------- */

static void rope_tables(lp_context *ctx) {
    const lp_model *m = ctx->model;
    int half = m->hp.head_dim / 2;
    for (int r = 0; r < ctx->n_rows; r++) {
        float pos = (float)ctx->rows[r].pos;
        for (int i = 0; i < half; i++) {
            float angle = pos * m->rope_inv_freq[i];
            ctx->rope_cos[(size_t)r * half + i] = cosf(angle);
            ctx->rope_sin[(size_t)r * half + i] = sinf(angle);
        }
    }
}

/* Rotates every head of one row's q or k. Normal rope pairs (2i, 2i+1);
 * NEOX pairs (i, i + d/2). */
static void rope_apply(const lp_context *ctx, int r, float *vec, int n_heads) {
    const lp_hparams *hp = &ctx->model->hp;
    int half = hp->head_dim / 2;
    const float *c = ctx->rope_cos + (size_t)r * half, *s = ctx->rope_sin + (size_t)r * half;
    for (int h = 0; h < n_heads; h++) {
        float *v = vec + (size_t)h * hp->head_dim;
        for (int i = 0; i < half; i++) {
            int a = hp->rope_neox ? i : 2 * i, b = hp->rope_neox ? i + half : 2 * i + 1;
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * c[i] - x1 * s[i];
            v[b] = x0 * s[i] + x1 * c[i];
        }
    }
}

static void add_bias(float *y, const float *bias, int64_t n) {
    if (bias)
        for (int64_t i = 0; i < n; i++) y[i] += bias[i];
}

/* ---- attention --------------------------------------------------------------------------- */

typedef struct attention_task {
    lp_context *ctx;
    int layer;
} attention_task;

/* A block's keys, and its values, are short streams of their own (4 KiB
 * each at head dim 64: the hardware prefetchers stop at page ends), so
 * attention fetches the next block's keys while it scores one, and the
 * values the mix will read. */
static void prefetch(const void *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o, 0, 3);
}

static void reverse(float *x, int n) {
    for (int i = 0, j = n - 1; i < j; i++, j--) {
        float t = x[i];
        x[i] = x[j];
        x[j] = t;
    }
}

/* One row and one KV head, for the query heads that share it (grouped-
 * query attention): softmax(q·K/sqrt(d)) V over the sequence's committed
 * entries, block by block, followed by the row's parent chain (nearest
 * first). Each key and value is read once for all those heads. */
static void attend_group(lp_context *ctx, int layer, int r, int g, float *scores) {
    const lp_hparams *hp = &ctx->model->hp;
    const lp_kv_cache *kv = &ctx->kv;
    int d = hp->head_dim, per = hp->n_heads / hp->n_kv_heads, h0 = g * per;
    size_t kv_dim = (size_t)hp->n_kv_heads * (size_t)d, rows = (size_t)ctx->params.max_rows;
    const float *q = ctx->q_rows + (size_t)r * (size_t)ctx->q_stride + (size_t)h0 * (size_t)d;
    const lp_seq *s = &ctx->seqs[ctx->rows[r].seq];
    float scale = 1.0f / sqrtf((float)d);
    const float *k_batch = ctx->k_new + (size_t)layer * rows * kv_dim + (size_t)g * (size_t)d;
    const float *k_batch_t = ctx->k_new_t + (size_t)g * (size_t)d * rows;
    const float *v_batch = ctx->v_new + (size_t)layer * rows * kv_dim + (size_t)g * (size_t)d;
    /* scores of head h0 + i at scores[i * n_all ...]: committed, then chain */
    int n_all = s->length + ctx->chain_len[r];
    int bt = kv->block_tokens;
    size_t block_bytes = (size_t)bt * (size_t)d * kv->elem_bytes;
    for (int t = 0; t < s->length; t += bt) {
        int nk = s->length - t < bt ? s->length - t : bt;
        const void *kt = lp_kv_keys(kv, s->blocks[t / bt], layer, g);
        if (t + bt < s->length) prefetch(lp_kv_keys(kv, s->blocks[t / bt + 1], layer, g), block_bytes);
        prefetch(lp_kv_value(kv, s->blocks[t / bt], layer, g, 0), (size_t)nk * (size_t)d * kv->elem_bytes);
        ctx->kern.attn_scores(q, d, per, kt, kv->f16, bt, nk, d, scale, scores + t, n_all);
    }
    /* The chain nearest first, in runs of consecutive rows (a prefill chain
     * is one run): a run's scores come out in row order and are turned
     * around, so a row's terms keep one order however its chain is batched. */
    int n = s->length;
    for (int a = r; a >= 0;) {
        int len = ctx->run_len[a], first = a - len + 1;
        /* one key is its own transpose (k_new_t is filled only for batches
         * with longer runs) */
        if (len == 1)
            ctx->kern.attn_scores(q, d, per, k_batch + (size_t)a * kv_dim, false, 1, 1, d, scale, scores + n, n_all);
        else
            ctx->kern.attn_scores(q, d, per, k_batch_t + first, false, (int64_t)rows, len, d, scale, scores + n,
                                  n_all);
        for (int i = 0; i < per; i++) reverse(scores + (size_t)i * (size_t)n_all + n, len);
        n += len;
        a = ctx->rows[first].parent;
    }
    for (int i = 0; i < per; i++) ctx->kern.softmax(scores + (size_t)i * (size_t)n_all, n_all);

    float *out = ctx->xn + ((size_t)r * hp->n_heads + (size_t)h0) * (size_t)d;
    memset(out, 0, (size_t)per * (size_t)d * sizeof(float));
    for (int t = 0; t < s->length; t += bt) {
        int nk = s->length - t < bt ? s->length - t : bt;
        const void *v = lp_kv_value(kv, s->blocks[t / bt], layer, g, 0);
        ctx->kern.attn_mix(out, d, per, scores + t, n_all, v, kv->f16, d, nk, d);
    }
    n = s->length;
    for (int a = r; a >= 0;) {
        int len = ctx->run_len[a];
        ctx->kern.attn_mix(out, d, per, scores + n, n_all, v_batch + (size_t)a * kv_dim, false, -(int64_t)kv_dim, len,
                           d);
        n += len;
        a = ctx->rows[a - len + 1].parent;
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
    const lp_hparams *hp = &ctx->model->hp;
    int n_kv = hp->n_kv_heads;
    size_t per_thread = ((size_t)ctx->params.max_seq_len + (size_t)ctx->params.max_rows) *
                        (size_t)(hp->n_heads / n_kv);
    float *scores = ctx->scores + (size_t)thread * per_thread;
    /* KV head major: the rows of one head follow each other on one thread,
     * so streams sharing a prompt read its keys and values from memory
     * once, not once per row and thread */
    int64_t begin, end, n = ctx->n_rows;
    lp_attention_share(ctx, thread, n_threads, &begin, &end);
    for (int64_t i = begin; i < end; i++) {
        int r = (int)(i % n), g = (int)(i / n);
        attend_group(ctx, task->layer, r, g, scores);
        if (ctx->rows[r].commit) lp_kv_store_row(ctx, r, task->layer, g);
    }
}

/* ---- adapters ------------------------------------------------------------------------------ */

/* Orders the batch's rows by adapter slot (a counting sort), so each adapter
 * does one shrink and one expand over all of its rows. */
static void group_rows_by_adapter(lp_context *ctx) {
    int n_slots = ctx->params.max_adapters + 1;
    int *start = ctx->group_start; /* n_slots + 1 entries */
    memset(start, 0, (size_t)(n_slots + 1) * sizeof(int));
    for (int r = 0; r < ctx->n_rows; r++) start[ctx->rows[r].adapter + 1]++;
    for (int s = 0; s < n_slots; s++) start[s + 1] += start[s];
    ctx->any_adapter = start[n_slots] > start[1];
    /* place rows, advancing each group's start to its end ... */
    for (int r = 0; r < ctx->n_rows; r++) ctx->group_rows[start[ctx->rows[r].adapter]++] = r;
    /* ... then shift back so start[s] is the beginning of group s again */
    for (int s = n_slots; s > 0; s--) start[s] = start[s - 1];
    start[0] = 0;
}

/* Runs the collected pieces: every shrink in one pool pass, the scales (and
 * the one-hot mask), every expand in one pass, then y rows added to the
 * projections' outputs. */
static void lora_flush(lp_context *ctx, lora_batch *b) {
    if (b->n == 0) return;
    lp_matmul_tasks(&ctx->kern, ctx->pool, b->n, b->shrink);
    for (int i = 0; i < b->n; i++) {
        const lora_piece *p = &b->piece[i];
        int64_t rank = p->pair->A.rows;
        for (int r = 0; r < p->n; r++) {
            /* one-hot: rows of other slots are multiplied by 0 */
            int batch_row = p->rows ? p->rows[r] : r;
            float scale = p->rows || ctx->rows[batch_row].adapter == p->slot ? p->pair->scale : 0.0f;
            float *t = p->t + r * p->kr;
            for (int64_t j = 0; j < rank; j++) t[j] *= scale;
            /* packed B is zero-padded to a multiple of 32 columns */
            for (int64_t j = rank; j < p->kr; j++) t[j] = 0.0f;
        }
    }
    lp_matmul_tasks(&ctx->kern, ctx->pool, b->n, b->expand);
    for (int i = 0; i < b->n; i++) {
        const lora_piece *p = &b->piece[i];
        for (int r = 0; r < p->n; r++)
            ctx->kern.axpy_f32(p->dst + (p->rows ? p->rows[r] : r) * p->dst_stride, 1.0f, p->y + r * p->out, p->out);
    }
    b->n = 0;
    b->t_used = b->y_used = 0;
}

/* The input rows of adapter group s: straight from x when they are
 * consecutive batch rows (one adapter for the batch, or streams in slot
 * order), else gathered into lora_x at the group's offset. */
static const float *group_input(lp_context *ctx, int s, const float *x, int64_t x_stride, int64_t in,
                                int64_t *stride) {
    int begin = ctx->group_start[s], n = ctx->group_start[s + 1] - begin;
    const int *rows = ctx->group_rows + begin;
    *stride = x_stride;
    if (rows[n - 1] - rows[0] == n - 1) return x + rows[0] * x_stride; /* rows ascend within a group */
    float *dst = ctx->lora_x + (size_t)begin * (size_t)in;
    for (int i = 0; i < n; i++) memcpy(dst + i * in, x + rows[i] * x_stride, (size_t)in * sizeof(float));
    *stride = in;
    return dst;
}

/* y_p[r] += scale * B_p (A_p x[r]) for the projections p that share the
 * input x (q, k, v; gate, up; o; down), for the rows of every adapter group
 * with a pair there: the segmented LoRA matmul, two pool passes per flush
 * however many adapters the batch mixes. One-hot mode (the frozen-graph
 * baseline) runs every bound adapter over every row, masked. */
static void apply_lora(lp_context *ctx, int layer, int n_proj, const lp_proj *projs, const float *x,
                       int64_t x_stride, float *const *ys, const int64_t *y_strides) {
    if (!ctx->any_adapter && !ctx->adapters_onehot) return;
    lora_batch *b = ctx->lora_batch;
    b->n = 0;
    b->t_used = b->y_used = 0;
    for (int s = 1; s <= ctx->params.max_adapters; s++) {
        int n = ctx->group_start[s + 1] - ctx->group_start[s];
        const int *rows = ctx->group_rows + ctx->group_start[s];
        if (ctx->adapters_onehot && ctx->slots[s].adapter) {
            n = ctx->n_rows; /* every row, whatever its slot */
            rows = NULL;
        }
        if (n == 0 || !ctx->slots[s].adapter) continue;
        const float *xs = NULL;
        int64_t xs_stride = x_stride;
        for (int i = 0; i < n_proj; i++) {
            const lp_lora_pair *pair = lp_adapter_pair(ctx->slots[s].adapter, layer, projs[i]);
            if (pair->rank == 0) continue;
            if (!xs) xs = rows ? group_input(ctx, s, x, x_stride, pair->A.cols, &xs_stride) : x;
            int64_t kr = pair->B.cols, out = pair->B.rows;
            size_t need_t = (size_t)n * (size_t)kr, need_y = (size_t)n * (size_t)out;
            if (b->n == LP_MATMUL_TASKS_MAX || b->t_used + need_t > ctx->lora_t_cap ||
                b->y_used + need_y > ctx->lora_y_cap)
                lora_flush(ctx, b);
            lora_piece *p = &b->piece[b->n];
            *p = (lora_piece){pair, s, rows, n, ctx->lora_t + b->t_used, ctx->lora_y + b->y_used,
                              ys[i], kr, out, y_strides[i]};
            b->shrink[b->n] = (lp_matmul_task){&pair->A, xs, xs_stride, n, p->t, kr};
            b->expand[b->n] = (lp_matmul_task){&pair->B, p->t, kr, n, p->y, out};
            b->n++;
            b->t_used += need_t;
            b->y_used += need_y;
        }
    }
    lora_flush(ctx, b);
}

const lp_adapter *lp_context_slot_adapter(const lp_context *ctx, int slot) {
    return slot >= 1 && slot <= ctx->params.max_adapters ? ctx->slots[slot].adapter : NULL;
}

int lp_context_n_slots(const lp_context *ctx) { return ctx->params.max_adapters; }

void lp_context_set_onehot(lp_context *ctx, bool on) { ctx->adapters_onehot = on; }

void lp_context_set_abort(lp_context *ctx, bool (*fn)(void *user), void *user) {
    ctx->abort_fn = fn;
    ctx->abort_user = user;
}

int lp_context_bind_embeddings(lp_context *ctx, int k, const float *data, int n_rows, lp_error *err) {
    if (k < 1 || k > ctx->params.max_embd_tables)
        return lp_fail(err, "embedding table %d out of range (1..%d)", k, ctx->params.max_embd_tables);
    if (data && n_rows < 1) return lp_fail(err, "embedding table %d: %d rows", k, n_rows);
    ctx->embd[k] = data;
    ctx->embd_rows[k] = data ? n_rows : 0;
    return 0;
}

int lp_context_bind_adapter(lp_context *ctx, int slot, const lp_adapter *a, lp_error *err) {
    if (slot < 1 || slot > ctx->params.max_adapters)
        return lp_fail(err, "adapter slot %d out of range (1..%d)", slot, ctx->params.max_adapters);
    if (a && a->base != ctx->model)
        return lp_fail(err, "adapter '%s' was loaded for another model", a->name);
    if (a && a->max_rank > ctx->max_rank)
        return lp_fail(err, "adapter '%s' has rank %d; this context allows up to %d "
                       "(max_adapter_rank)", a->name, a->max_rank, ctx->max_rank);
    ctx->slots[slot].tag = a ? a->tag : 0;
    ctx->slots[slot].adapter = a;
    return 0;
}

/* ---- per-row steps ------------------------------------------------------------------------- */

/* The elementwise work between the matmuls (norms, rope, SwiGLU, residual
 * adds), one row at a time. Cheap per row, but over a batch it adds up, and
 * run on one thread it leaves the others waiting: batches of
 * ROWS_PARALLEL_MIN rows or more split it across the pool (8 decode
 * streams, 2 threads: 1.5 -> 1.1-1.2 ms of a 35 ms step; at 2-4 rows,
 * splitting or not measured the same). Every row gets the same operations
 * whichever thread runs it. */
#define ROWS_PARALLEL_MIN 4

typedef enum row_step {
    ROW_ATTN_NORM,      /* xn = rmsnorm(x) */
    ROW_QKV_FINISH,     /* k, v out of the fused output; biases, q/k norms, rope */
    ROW_RESIDUAL_NORM,  /* x += attention output (gate buffer); xn = rmsnorm(x) */
    ROW_SILU,           /* hidden = silu(gate) * up */
    ROW_RESIDUAL,       /* x += feed-forward output (xn) */
} row_step;

typedef struct rows_task {
    lp_context *ctx;
    int layer;
    row_step step;
    float *k_new, *v_new;   /* ROW_QKV_FINISH */
    float *gate, *up;       /* ROW_SILU */
    int64_t stride;         /* ROW_SILU: of gate and up */
} rows_task;

static void qkv_finish_row(const rows_task *t, int r) {
    lp_context *ctx = t->ctx;
    const lp_hparams *hp = &ctx->model->hp;
    const lp_layer *L = &ctx->model->layers[t->layer];
    int64_t d = hp->head_dim, q_dim = hp->n_heads * d, kv_dim = hp->n_kv_heads * d;
    float *q = ctx->q_rows + r * ctx->q_stride, *k = t->k_new + r * kv_dim;
    if (L->wqkv.data) { /* q stays in the fused output; k/v move to the per-layer
                         * batch KV that attention and commits read */
        memcpy(k, q + q_dim, (size_t)kv_dim * sizeof(float));
        memcpy(t->v_new + r * kv_dim, q + q_dim + kv_dim, (size_t)kv_dim * sizeof(float));
    }
    add_bias(q, L->bq, q_dim);
    add_bias(k, L->bk, kv_dim);
    add_bias(t->v_new + r * kv_dim, L->bv, kv_dim);
    if (L->q_norm) {
        for (int h = 0; h < hp->n_heads; h++) lp_rmsnorm(q + h * d, q + h * d, L->q_norm, d, hp->rms_eps);
        for (int h = 0; h < hp->n_kv_heads; h++) lp_rmsnorm(k + h * d, k + h * d, L->k_norm, d, hp->rms_eps);
    }
    rope_apply(ctx, r, q, hp->n_heads);
    rope_apply(ctx, r, k, hp->n_kv_heads);
    if (ctx->kv.f16) {
        /* what the cache will hold, so this row's own batch (chains,
         * speculative trees) reads exactly the values a later row reads
         * back from the cache */
        ctx->kern.round_f16(k, kv_dim);
        ctx->kern.round_f16(t->v_new + r * kv_dim, kv_dim);
    }
    /* the batch's keys transposed, as the cache's blocks hold them, where
     * attention reads runs of them (with 8 decode streams the rows'
     * columns share cache lines between the threads: 0.5 ms a step) */
    if (ctx->batch_has_runs) {
        int64_t rows = ctx->params.max_rows;
        for (int64_t i = 0; i < kv_dim; i++) ctx->k_new_t[i * rows + r] = k[i];
    }
}

static void row_step_one(const rows_task *t, int r) {
    lp_context *ctx = t->ctx;
    const lp_model *m = ctx->model;
    const lp_layer *L = &m->layers[t->layer];
    int64_t dim = m->hp.dim;
    float *x = ctx->x + r * dim, *xn = ctx->xn + r * dim;
    /* folded gains already sit in the columns of q/k/v and gate/up */
    switch (t->step) {
    case ROW_ATTN_NORM:
        lp_rmsnorm(xn, x, m->norms_folded ? NULL : L->attn_norm, dim, m->hp.rms_eps);
        break;
    case ROW_QKV_FINISH:
        qkv_finish_row(t, r);
        break;
    case ROW_RESIDUAL_NORM:
        ctx->kern.axpy_f32(x, 1.0f, ctx->gate + r * dim, dim);
        lp_rmsnorm(xn, x, m->norms_folded ? NULL : L->ffn_norm, dim, m->hp.rms_eps);
        break;
    case ROW_SILU:
        ctx->kern.silu_mul(t->gate + r * t->stride, t->up + r * t->stride, m->hp.ffn_dim);
        break;
    case ROW_RESIDUAL:
        ctx->kern.axpy_f32(x, 1.0f, xn, dim);
        break;
    }
}

static void rows_worker(void *arg, int thread, int n_threads) {
    const rows_task *t = arg;
    int64_t begin, end;
    lp_split_range(t->ctx->n_rows, thread, n_threads, 1, &begin, &end);
    for (int64_t r = begin; r < end; r++) row_step_one(t, (int)r);
}

static void run_rows(lp_context *ctx, rows_task t) {
    lp_threadpool_run(ctx->n_rows >= ROWS_PARALLEL_MIN ? ctx->pool : NULL, rows_worker, &t);
}

/* ---- the layer ------------------------------------------------------------------------------- */

static void matmul(lp_context *ctx, const lp_weight *w, const float *x, int64_t x_stride,
                   float *y, int64_t y_stride, int64_t n) {
    lp_matmul(&ctx->kern, ctx->pool, w, x, x_stride, n, y, y_stride);
}

/* q, k, v of the batch: q into ctx->q (or left inside the fused buffer), k
 * and v into this layer's k_new / v_new; then biases, q/k norms and rope. */
static void attention_inputs(lp_context *ctx, int l, float *k_new, float *v_new) {
    static const lp_proj qkv_projs[3] = {LP_PROJ_Q, LP_PROJ_K, LP_PROJ_V};
    const lp_hparams *hp = &ctx->model->hp;
    const lp_layer *L = &ctx->model->layers[l];
    int n = ctx->n_rows;
    int64_t dim = hp->dim, d = hp->head_dim;
    int64_t q_dim = hp->n_heads * d, kv_dim = hp->n_kv_heads * d;
    float *q_rows = ctx->q;
    int64_t q_stride = q_dim;
    if (L->wqkv.data) {
        /* one matmul; adapters add to the q/k/v column ranges of its output */
        int64_t w = q_dim + 2 * kv_dim;
        matmul(ctx, &L->wqkv, ctx->xn, dim, ctx->qkv, w, n);
        float *ys[3] = {ctx->qkv, ctx->qkv + q_dim, ctx->qkv + q_dim + kv_dim};
        const int64_t strides[3] = {w, w, w};
        apply_lora(ctx, l, 3, qkv_projs, ctx->xn, dim, ys, strides);
        q_rows = ctx->qkv;
        q_stride = w;
    } else {
        /* one pool pass (and one activation quantization) for all three */
        const lp_weight *ws[3] = {&L->wq, &L->wk, &L->wv};
        float *ys[3] = {ctx->q, k_new, v_new};
        const int64_t strides[3] = {q_dim, kv_dim, kv_dim};
        lp_matmul_multi(&ctx->kern, ctx->pool, 3, ws, ctx->xn, dim, n, ys, strides);
        apply_lora(ctx, l, 3, qkv_projs, ctx->xn, dim, ys, strides);
    }
    ctx->q_rows = q_rows;
    ctx->q_stride = q_stride;
    run_rows(ctx, (rows_task){.ctx = ctx, .layer = l, .step = ROW_QKV_FINISH, .k_new = k_new, .v_new = v_new});
}

/* silu(gate) * up of the batch; returns where the product rows are and
 * their stride (inside the fused buffer for fused gate|up). */
static float *feed_forward_hidden(lp_context *ctx, int l, int64_t *stride) {
    const lp_hparams *hp = &ctx->model->hp;
    const lp_layer *L = &ctx->model->layers[l];
    int n = ctx->n_rows;
    int64_t dim = hp->dim, ffn = hp->ffn_dim;
    float *gate = ctx->gate, *up = ctx->up;
    int64_t w = ffn;
    if (L->w_gate_up.data) {
        w = 2 * ffn;
        up = ctx->gate + ffn;
        matmul(ctx, &L->w_gate_up, ctx->xn, dim, ctx->gate, w, n);
    } else {
        const lp_weight *ws[2] = {&L->w_gate, &L->w_up};
        float *ys[2] = {gate, up};
        const int64_t strides[2] = {w, w};
        lp_matmul_multi(&ctx->kern, ctx->pool, 2, ws, ctx->xn, dim, n, ys, strides);
    }
    static const lp_proj gate_up_projs[2] = {LP_PROJ_GATE, LP_PROJ_UP};
    float *gu[2] = {gate, up};
    const int64_t gu_strides[2] = {w, w};
    apply_lora(ctx, l, 2, gate_up_projs, ctx->xn, dim, gu, gu_strides);
    run_rows(ctx, (rows_task){.ctx = ctx, .layer = l, .step = ROW_SILU, .gate = gate, .up = up, .stride = w});
    *stride = w;
    return gate;
}

static void layer_forward(lp_context *ctx, int l) {
    const lp_model *m = ctx->model;
    const lp_hparams *hp = &m->hp;
    const lp_layer *L = &m->layers[l];
    int n = ctx->n_rows;
    int64_t dim = hp->dim, q_dim = hp->n_heads * (int64_t)hp->head_dim;
    int64_t kv_dim = hp->n_kv_heads * (int64_t)hp->head_dim;
    size_t rows = (size_t)ctx->params.max_rows;
    float *k_new = ctx->k_new + (size_t)l * rows * (size_t)kv_dim;
    float *v_new = ctx->v_new + (size_t)l * rows * (size_t)kv_dim;
    /* attention block */
    run_rows(ctx, (rows_task){.ctx = ctx, .layer = l, .step = ROW_ATTN_NORM});
    attention_inputs(ctx, l, k_new, v_new);
    attention_task task = {ctx, l};
    lp_threadpool_run(lp_attention_parallel(ctx) ? ctx->pool : NULL, attention_worker, &task);
    /* attention output (in xn, q_dim wide) -> gate buffer as scratch, then residual */
    matmul(ctx, &L->wo, ctx->xn, q_dim, ctx->gate, dim, n);
    static const lp_proj o_proj[1] = {LP_PROJ_O}, down_proj[1] = {LP_PROJ_DOWN};
    float *o_out[1] = {ctx->gate}, *down_out[1] = {ctx->xn};
    const int64_t dim_stride[1] = {dim};
    apply_lora(ctx, l, 1, o_proj, ctx->xn, q_dim, o_out, dim_stride);

    /* feed-forward block */
    run_rows(ctx, (rows_task){.ctx = ctx, .layer = l, .step = ROW_RESIDUAL_NORM});
    int64_t h_stride;
    float *hidden = feed_forward_hidden(ctx, l, &h_stride);
    matmul(ctx, &L->w_down, hidden, h_stride, ctx->xn, dim, n);
    apply_lora(ctx, l, 1, down_proj, hidden, h_stride, down_out, dim_stride);
    run_rows(ctx, (rows_task){.ctx = ctx, .layer = l, .step = ROW_RESIDUAL});
}

int lp_forward(lp_context *ctx, const lp_row *rows, int n_rows, lp_error *err) {
    if (validate_batch(ctx, rows, n_rows, err)) return -1;
    const lp_model *m = ctx->model;
    const lp_hparams *hp = &m->hp;
    int64_t dim = hp->dim;
    memcpy(ctx->rows, rows, (size_t)n_rows * sizeof *rows);
    ctx->n_rows = n_rows;
    /* chains and runs of parents, once per batch: walking them per row and
     * head made attention over a prefill quadratic in its length */
    ctx->batch_has_runs = false;
    for (int r = 0; r < n_rows; r++) {
        int parent = rows[r].parent;
        ctx->chain_len[r] = parent >= 0 ? ctx->chain_len[parent] + 1 : 1;
        ctx->run_len[r] = r > 0 && parent == r - 1 ? ctx->run_len[r - 1] + 1 : 1;
        ctx->batch_has_runs |= ctx->run_len[r] > 1;
        ctx->row_tag[r] = ctx->slots[rows[r].adapter].tag;
        double visible = (double)ctx->seqs[rows[r].seq].length + ctx->chain_len[r];
        ctx->attn_cost[r] = (r > 0 ? ctx->attn_cost[r - 1] : 0) + visible;
    }
    /* committed rows' places in the cache, in row order per sequence; their
     * keys and values go in as attention finishes with them (layer by
     * layer, while those cache lines are at hand), and count at the end */
    memset(ctx->commit_count, 0, (size_t)ctx->params.max_sequences * sizeof(int));
    for (int r = 0; r < n_rows; r++)
        if (rows[r].commit) lp_kv_reserve_row(ctx, r, ctx->seqs[rows[r].seq].length + ctx->commit_count[rows[r].seq]++);

    for (int r = 0; r < n_rows; r++) {
        if (rows[r].embd > 0)
            memcpy(ctx->x + r * dim, ctx->embd[rows[r].embd] + (size_t)rows[r].token * (size_t)dim,
                   (size_t)dim * sizeof(float));
        else
            lp_weight_dequantize_row(&m->tok_embd, rows[r].token, ctx->x + r * dim);
    }
    rope_tables(ctx);
    group_rows_by_adapter(ctx);
    for (int l = 0; l < hp->n_layers; l++) {
        if (ctx->abort_fn && ctx->abort_fn(ctx->abort_user)) {
            for (int r = n_rows - 1; r >= 0; r--)
                if (rows[r].commit) lp_kv_unreserve_row(ctx, r);
            ctx->n_rows = 0; /* no logits, nothing to commit */
            return lp_error_set(err, LP_ERR_CANCELLED, "forward abandoned by the abort hook before layer %d", l);
        }
        layer_forward(ctx, l);
    }

    int n_logits = 0;
    for (int r = 0; r < n_rows; r++) {
        ctx->logit_slot[r] = rows[r].logits ? n_logits : -1;
        if (rows[r].logits) {
            lp_rmsnorm(ctx->logit_in + n_logits * dim, ctx->x + r * dim, m->output_norm, dim,
                       hp->rms_eps);
            n_logits++;
        }
    }
    if (n_logits > 0)
        matmul(ctx, &m->output, ctx->logit_in, dim, ctx->logits, hp->n_vocab, n_logits);

    for (int r = 0; r < n_rows; r++)
        if (rows[r].commit) lp_kv_finish_row(ctx, r);
    return 0;
}

const float *lp_logits(const lp_context *ctx, int row) {
    if (row < 0 || row >= ctx->n_rows || ctx->logit_slot[row] < 0) return NULL;
    return ctx->logits + (size_t)ctx->logit_slot[row] * (size_t)ctx->model->hp.n_vocab;
}

int lp_commit_rows(lp_context *ctx, const int *rows, int n, lp_error *err) {
    memset(ctx->commit_count, 0, (size_t)ctx->params.max_sequences * sizeof(int));
    int rc = 0, marked = 0;
    /* each row is marked committed as it is checked, so a row named twice
     * is caught; the marks are taken back if anything is rejected */
    for (; marked < n; marked++) {
        int r = rows[marked];
        if (r < 0 || r >= ctx->n_rows) {
            rc = lp_fail(err, "row %d is not in the last batch", r);
            break;
        }
        if (ctx->rows[r].commit) {
            rc = lp_fail(err, "row %d was already committed", r);
            break;
        }
        ctx->rows[r].commit = true;
        ctx->commit_count[ctx->rows[r].seq]++;
    }
    int blocks = 0;
    for (int s = 0; rc == 0 && s < ctx->params.max_sequences; s++) {
        int c = ctx->commit_count[s];
        if (c && ctx->seqs[s].length + c > ctx->params.max_seq_len)
            rc = lp_error_set(err, LP_ERR_KV_FULL, "sequence %d would exceed %d tokens", s, ctx->params.max_seq_len);
        blocks += lp_kv_blocks_needed(ctx, s, c);
    }
    if (rc == 0 && blocks > ctx->kv.n_free)
        rc = lp_error_set(err, LP_ERR_KV_FULL, "KV cache full: %d blocks needed, %d free", blocks, ctx->kv.n_free);
    if (rc != 0) {
        for (int i = 0; i < marked; i++) ctx->rows[rows[i]].commit = false;
        return rc;
    }
    for (int i = 0; i < n; i++) lp_kv_append_row(ctx, rows[i]);
    return 0;
}
