/* A context: the plan (every buffer a batch needs, laid out once from
 * max_rows, max_sequences and the KV budget), the paged KV cache, the
 * adapter and embedding slots, and the worker threads. */
#include "context.h"

#include "../model/profile.h"

#include <stdlib.h>
#include <string.h>

#define KV_BLOCK_TOKENS 32

lp_context_params lp_context_default_params(void) {
    return (lp_context_params){
        .n_threads = 0,          /* all cores (lp_default_threads) */
        .max_rows = 512,
        .max_sequences = 16,
        .max_logit_rows = 64,
        .n_ctx = 0,              /* the model's training context, at most 4096 */
        .max_seq_len = 0,        /* n_ctx */
        .max_adapters = 8,
        .max_adapter_rank = 256,
        .max_embd_tables = 4,
    };
}

/* ---- the plan arena ------------------------------------------------------------------ */

static void plan_view(lp_plan *p, const char *name, void *ptr, size_t rows, size_t cols, size_t elem,
                      bool zeroed) {
    size_t bytes;
    if (p->n == LP_PLAN_VIEWS_MAX || !lp_mul_ok(rows, cols, &bytes) || !lp_mul_ok(bytes, elem, &bytes) ||
        bytes > SIZE_MAX - 128 - p->bytes) {
        p->overflow = true;
        return;
    }
    p->views[p->n++] = (lp_plan_view){.name = name, .ptr = ptr, .rows = rows, .cols = cols, .elem = elem,
                                      .offset = p->bytes, .zeroed = zeroed};
    p->bytes += (bytes + 63) & ~(size_t)63;
}

void lp_plan_add(lp_plan *p, const char *name, void *ptr, size_t rows, size_t cols, size_t elem) {
    plan_view(p, name, ptr, rows, cols, elem, false);
}

void lp_plan_add_zeroed(lp_plan *p, const char *name, void *ptr, size_t rows, size_t cols, size_t elem) {
    plan_view(p, name, ptr, rows, cols, elem, true);
}

/* One allocation for every view; each pointer is set to its view. */
static int plan_lay_out(lp_plan *p, lp_error *err) {
    if (p->overflow) return lp_fail(err, "the plan's buffers overflow (too many rows or views)");
    p->arena = lp_alloc_uninit(p->bytes ? p->bytes : 64);
    if (!p->arena) return lp_error_set(err, LP_ERR_NOMEM, "out of memory planning %zu bytes of buffers", p->bytes);
    for (int i = 0; i < p->n; i++) {
        const lp_plan_view *v = &p->views[i];
        void *at = p->arena + v->offset;
        if (v->zeroed) memset(at, 0, v->rows * v->cols * v->elem);
        /* object pointers share one representation on every target we build for */
        memcpy(v->ptr, &at, sizeof at);
    }
    return 0;
}

/* ---- creation ------------------------------------------------------------------------ */

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
    size_t total, bytes;
    if (!lp_mul_ok(kv->block_elems, (size_t)kv->n_blocks, &total) || !lp_mul_ok(total, kv->elem_bytes, &bytes))
        return lp_fail(err, "KV cache size overflows");
    /* not zero-filled: an entry is read only after it was written */
    kv->k = lp_alloc_uninit(bytes);
    kv->v = lp_alloc_uninit(bytes);
    if (!kv->k || !kv->v)
        return lp_error_set(err, LP_ERR_NOMEM, "out of memory for a KV cache of %d tokens", ctx->params.n_ctx);
    ctx->max_blocks_per_seq = (ctx->params.max_seq_len + kv->block_tokens - 1) / kv->block_tokens;
    return 0;
}

/* The runtime's own views: the batch, attention, output, slots, LoRA. */
static void plan_runtime(lp_context *ctx, lp_plan *p) {
    const lp_hparams *hp = &ctx->model->hp;
    const lp_context_params *cp = &ctx->params;
    size_t rows = (size_t)cp->max_rows, logit_rows = (size_t)cp->max_logit_rows;
    size_t seqs = (size_t)cp->max_sequences, slots = (size_t)cp->max_adapters + 1;
    size_t kv_dim = (size_t)hp->n_kv_heads * (size_t)hp->head_dim;
    size_t i = sizeof(int);
    lp_plan_add_zeroed(p, "kv.refcount", &ctx->kv.refcount, (size_t)ctx->kv.n_blocks, 1, i);
    lp_plan_add(p, "kv.free_list", &ctx->kv.free_list, (size_t)ctx->kv.n_blocks, 1, i);
    lp_plan_add_zeroed(p, "seqs", &ctx->seqs, seqs, 1, sizeof(lp_seq));
    lp_plan_add(p, "seq.blocks", &ctx->seq_blocks, seqs, (size_t)ctx->max_blocks_per_seq, i);
    lp_plan_add(p, "seq.tokens", &ctx->seq_tokens, seqs, (size_t)cp->max_seq_len, sizeof(int32_t));
    lp_plan_add(p, "seq.tags", &ctx->seq_tags, seqs, (size_t)cp->max_seq_len, sizeof(uint64_t));

    lp_plan_add(p, "rows", &ctx->rows, rows, 1, sizeof(lp_row));
    lp_plan_add(p, "x", &ctx->x, rows, (size_t)hp->dim, sizeof(float));
    lp_plan_add(p, "chain_len", &ctx->chain_len, rows, 1, i);
    lp_plan_add(p, "run_len", &ctx->run_len, rows, 1, i);
    lp_plan_add(p, "row_tag", &ctx->row_tag, rows, 1, sizeof(uint64_t));
    lp_plan_add(p, "attn_cost", &ctx->attn_cost, rows, 1, sizeof(double));
    lp_plan_add(p, "commit_count", &ctx->commit_count, seqs, 1, i);
    lp_plan_add(p, "commit_block", &ctx->commit_block, rows, 1, i);
    lp_plan_add(p, "commit_slot", &ctx->commit_slot, rows, 1, i);

    /* one row's scores for the query heads of one KV head, per thread */
    size_t prefix = cp->max_embd_tables > 0 ? LP_MAX_KV_PREFIX : 0;
    size_t score_len = ((size_t)cp->max_seq_len + rows + prefix) * (size_t)(hp->n_heads / hp->n_kv_heads);
    ctx->score_len = score_len;
    lp_plan_add(p, "k_new", &ctx->k_new, (size_t)hp->n_layers * rows, kv_dim, sizeof(float));
    lp_plan_add(p, "v_new", &ctx->v_new, (size_t)hp->n_layers * rows, kv_dim, sizeof(float));
    lp_plan_add(p, "k_new_t", &ctx->k_new_t, kv_dim, rows, sizeof(float));
    lp_plan_add(p, "scores", &ctx->scores, (size_t)cp->n_threads, score_len, sizeof(float));
    lp_plan_add(p, "run_last", &ctx->run_last, (size_t)cp->n_threads, rows, i);

    lp_plan_add(p, "logit_in", &ctx->logit_in, logit_rows, (size_t)hp->dim, sizeof(float));
    lp_plan_add(p, "logits", &ctx->logits, logit_rows, (size_t)hp->n_vocab, sizeof(float));
    lp_plan_add(p, "logit_slot", &ctx->logit_slot, rows, 1, i);
    lp_plan_add(p, "logit_rows", &ctx->logit_rows, logit_rows, 1, i);
    lp_plan_add_zeroed(p, "embd", &ctx->embd, (size_t)cp->max_embd_tables + 1, 1, sizeof(const float *));
    lp_plan_add_zeroed(p, "embd_rows", &ctx->embd_rows, (size_t)cp->max_embd_tables + 1, 1, i);
    lp_plan_add_zeroed(p, "embd_prefix", &ctx->embd_prefix, (size_t)cp->max_embd_tables + 1, 1,
                       sizeof(const float *));
    lp_plan_add_zeroed(p, "embd_prefix_n", &ctx->embd_prefix_n, (size_t)cp->max_embd_tables + 1, 1, i);

    /* LoRA: the widest input and output of any adaptable weight; shrunk
     * activations of three weights (q, k, v) of every row at once, outputs
     * of two of the widest (gate, up); a batch that needs more flushes in
     * parts */
    size_t widest_in = 1, widest_out = 1;
    for (int w = 0; w < ctx->model->n_weights; w++) {
        const lp_weight *wt = ctx->model->weights[w].w;
        if ((size_t)wt->cols > widest_in) widest_in = (size_t)wt->cols;
        if ((size_t)wt->rows > widest_out) widest_out = (size_t)wt->rows;
    }
    size_t padded_rank = ((size_t)ctx->max_rank + 31) & ~(size_t)31; /* packed B pads to 32 */
    ctx->lora_t_cap = rows * 3 * padded_rank;
    ctx->lora_y_cap = rows * 2 * widest_out;
    lp_plan_add_zeroed(p, "slots", &ctx->slots, slots, 1, sizeof(lp_slot));
    lp_plan_add(p, "group_rows", &ctx->group_rows, rows, 1, i);
    lp_plan_add(p, "group_start", &ctx->group_start, slots + 1, 1, i);
    lp_plan_add(p, "lora_x", &ctx->lora_x, rows, widest_in, sizeof(float));
    lp_plan_add(p, "lora_t", &ctx->lora_t, ctx->lora_t_cap, 1, sizeof(float));
    lp_plan_add(p, "lora_qt", &ctx->lora_qt, ctx->lora_t_cap, 1, sizeof(uint8_t));
    lp_plan_add(p, "lora_y", &ctx->lora_y, ctx->lora_y_cap, 1, sizeof(float));
    lp_plan_add(p, "lora_batch", &ctx->lora_batch, 1, 1, lp_lora_batch_bytes());
}

/* Free lists and sequence tables over their views. */
static void init_tables(lp_context *ctx) {
    lp_kv_cache *kv = &ctx->kv;
    for (int b = 0; b < kv->n_blocks; b++) kv->free_list[b] = kv->n_blocks - 1 - b;
    kv->n_free = kv->n_blocks;
    for (int s = 0; s < ctx->params.max_sequences; s++) {
        lp_seq *seq = &ctx->seqs[s];
        seq->blocks = ctx->seq_blocks + (size_t)s * (size_t)ctx->max_blocks_per_seq;
        seq->tokens = ctx->seq_tokens + (size_t)s * (size_t)ctx->params.max_seq_len;
        seq->tags = ctx->seq_tags + (size_t)s * (size_t)ctx->params.max_seq_len;
    }
}

lp_context *lp_context_create(const lp_model *m, const lp_context_params *params, lp_error *err) {
    lp_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) {
        lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    ctx->model = m;
    ctx->graph = lp_arch_graph(m->hp.arch);
    if (resolve_params(m, params, &ctx->params, err)) goto fail;
    ctx->max_rank = ctx->params.max_adapter_rank;
    lp_cpu_features cpu;
    lp_cpu_detect(&cpu);
    lp_kernels_init(&ctx->kern, &cpu);
    ctx->kern.int8_activations = m->int8_activations; /* recorded in .lpx files */
    ctx->pool = lp_threadpool_create(ctx->params.n_threads, err);
    if (!ctx->pool) goto fail;
    if (kv_init(ctx, err)) goto fail;
    {
        /* scratch for int8-quantized activations of integer kernels */
        int64_t widest_in = m->hp.dim;
        for (int w = 0; w < m->n_weights; w++)
            if (m->weights[w].w->cols > widest_in) widest_in = m->weights[w].w->cols;
        if (lp_kernels_reserve(&ctx->kern, ctx->params.max_rows, widest_in, err)) goto fail;
    }
    plan_runtime(ctx, &ctx->plan);
    if (ctx->graph->plan(ctx, &ctx->plan, err) || plan_lay_out(&ctx->plan, err)) goto fail;
    init_tables(ctx);
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
    lp_free(ctx->plan.arena);
    free(ctx->graph_state);
    free(ctx->profile_scratch);
    free(ctx);
}

const lp_model *lp_context_model(const lp_context *ctx) { return ctx->model; }

void lp_context_get_params(const lp_context *ctx, lp_context_params *params) { *params = ctx->params; }

/* ---- slots and hooks ----------------------------------------------------------------- */

const lp_adapter *lp_context_slot_adapter(const lp_context *ctx, int slot) {
    return slot >= 1 && slot <= ctx->params.max_adapters ? ctx->slots[slot].adapter : NULL;
}

int lp_context_n_slots(const lp_context *ctx) { return ctx->params.max_adapters; }

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

int lp_context_bind_kv_prefix(lp_context *ctx, int k, const float *kv, int n, lp_error *err) {
    if (k < 1 || k > ctx->params.max_embd_tables)
        return lp_fail(err, "embedding table %d out of range (1..%d)", k, ctx->params.max_embd_tables);
    if (n < 0 || n > LP_MAX_KV_PREFIX) return lp_fail(err, "a KV prefix of %d entries (0..%d)", n, LP_MAX_KV_PREFIX);
    ctx->embd_prefix[k] = n ? kv : NULL;
    ctx->embd_prefix_n[k] = kv ? n : 0;
    return 0;
}

int lp_context_bind_adapter(lp_context *ctx, int slot, const lp_adapter *a, lp_error *err) {
    if (slot < 1 || slot > ctx->params.max_adapters)
        return lp_fail(err, "adapter slot %d out of range (1..%d)", slot, ctx->params.max_adapters);
    if (a && a->base != ctx->model)
        return lp_fail(err, "adapter '%s' was loaded for another model", a->name);
    if (a && a->profile_id && lp_profile_check_adapter(ctx->profile, a, err)) return -1;
    if (a && a->max_rank > ctx->max_rank)
        return lp_fail(err, "adapter '%s' has rank %d; this context allows up to %d "
                       "(max_adapter_rank)", a->name, a->max_rank, ctx->max_rank);
    if (ctx->slots[slot].adapter != a) ctx->slots[slot].forecast = NULL;
    ctx->slots[slot].tag = a ? a->tag : 0;
    ctx->slots[slot].adapter = a;
    return 0;
}

int lp_context_bind_forecast(lp_context *ctx, int slot, const lp_forecast *f, lp_error *err) {
    if (slot < 0 || slot > ctx->params.max_adapters)
        return lp_fail(err, "forecast slot %d out of range (0..%d)", slot, ctx->params.max_adapters);
    if (f && lp_forecast_check(f, ctx->model, err)) return -1;
    ctx->slots[slot].forecast = f;
    return 0;
}

const lp_forecast *lp_context_slot_forecast(const lp_context *ctx, int slot) {
    return slot >= 0 && slot <= ctx->params.max_adapters ? ctx->slots[slot].forecast : NULL;
}

int lp_context_bind_profile(lp_context *ctx, const lp_profile *p, lp_error *err) {
    if (!p) return lp_fail(err, "no profile to bind");
    if (ctx->profile == p) return 0;
    if (ctx->profile)
        return lp_fail(err, "this context already binds shared profile %016llx (a context binds one, once)",
                       (unsigned long long)ctx->profile->q.id);
    if (p->model != ctx->model) return lp_fail(err, "the profile was loaded for another model");
    size_t per_thread = (size_t)(p->scratch_ints > 0 ? p->scratch_ints : 1);
    ctx->profile_scratch = malloc((size_t)lp_threadpool_size(ctx->pool) * per_thread * sizeof(int32_t));
    if (!ctx->profile_scratch) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    ctx->profile = p;
    return 0;
}

