/* The Llama family's forward graph over the runtime's ops, and its
 * adaptable weights. Covers llama and mistral, qwen2 (q/k/v biases) and
 * qwen3 (per-head q/k norms); NEOX or interleaved rope; fused q|k|v and
 * gate|up matrices of compiled models.
 *
 * One layer over the batch:
 *   xn = rmsnorm(x)                          per row
 *   q, k, v = linear(xn) (+ bias, q/k norm, rope)
 *   xn = attention(q, this layer's KV)       runtime op
 *   x += linear_o(xn)
 *   xn = rmsnorm(x)
 *   x += linear_down(silu(linear_gate(xn)) * linear_up(xn))
 * Every linear adds the LoRA terms of the rows' adapters (lp_linear). */
#include "llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/context.h"

/* ---- weights and names ----------------------------------------------------------------------- */

static const char *const proj_short[LP_PROJ_COUNT] = {"q", "k", "v", "o", "gate", "up", "down"};
static const char *const proj_gguf[LP_PROJ_COUNT] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                                     "ffn_gate", "ffn_up", "ffn_down"};
static const char *const proj_hf[LP_PROJ_COUNT] = {"self_attn.q_proj", "self_attn.k_proj",
                                                   "self_attn.v_proj", "self_attn.o_proj",
                                                   "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};

const char *lp_proj_name(lp_proj p) { return (unsigned)p < LP_PROJ_COUNT ? proj_short[p] : "?"; }

void lp_llama_weight_name(int layer, lp_proj p, char *buf, size_t cap) {
    snprintf(buf, cap, "blk.%d.%s.weight", layer, (unsigned)p < LP_PROJ_COUNT ? proj_gguf[p] : "?");
}

void lp_llama_module_name(int layer, lp_proj p, char *buf, size_t cap) {
    snprintf(buf, cap, "model.layers.%d.%s", layer, (unsigned)p < LP_PROJ_COUNT ? proj_hf[p] : "?");
}

int lp_llama_describe(lp_model *m, lp_error *err) {
    int n = m->hp.n_layers * LP_PROJ_COUNT;
    m->weights = lp_model_own(m, (size_t)n * sizeof *m->weights);
    if (!m->weights) return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", m->path);
    m->n_weights = n;
    for (int l = 0; l < m->hp.n_layers; l++) {
        const lp_layer *L = &m->layers[l];
        const lp_weight *ws[LP_PROJ_COUNT] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int p = 0; p < LP_PROJ_COUNT; p++) {
            lp_model_weight *w = &m->weights[lp_llama_weight_id(l, (lp_proj)p)];
            lp_llama_weight_name(l, (lp_proj)p, w->name, sizeof w->name);
            lp_llama_module_name(l, (lp_proj)p, w->hf_name, sizeof w->hf_name);
            w->w = ws[p];
            /* a compiled base multiplies the gains of the norms before q/k/v
             * and gate/up into their columns */
            if (m->norms_folded)
                w->in_gain = p <= LP_PROJ_V ? L->attn_norm : (p == LP_PROJ_GATE || p == LP_PROJ_UP) ? L->ffn_norm : NULL;
            w->rope_rows = p == LP_PROJ_Q || p == LP_PROJ_K;
        }
    }
    return 0;
}

/* ---- the plan ---------------------------------------------------------------------------------- */

typedef struct llama_state {
    float *xn;         /* [rows][max(dim, q_dim)] normalised input / attention output */
    float *q;          /* [rows][q_dim] */
    float *qkv;        /* [rows][q_dim + 2 kv_dim] output of a fused q|k|v matmul (or NULL) */
    float *gate, *up;  /* [rows][ffn_dim]; fused gate|up: gate is [rows][2 ffn_dim] */
    float *rope_cos, *rope_sin; /* [rows][head_dim/2] */
    float *q_rows;     /* this layer's queries: q or inside qkv ... */
    int64_t q_stride;  /* ... with this row stride */
} llama_state;

static llama_state *state(const lp_context *ctx) { return ctx->graph_state; }

static int llama_plan(lp_context *ctx, lp_plan *p, lp_error *err) {
    const lp_model *m = ctx->model;
    const lp_hparams *hp = &m->hp;
    llama_state *st = calloc(1, sizeof *st);
    if (!st) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    ctx->graph_state = st;
    size_t rows = (size_t)ctx->params.max_rows;
    size_t q_dim = (size_t)hp->n_heads * (size_t)hp->head_dim;
    size_t kv_dim = (size_t)hp->n_kv_heads * (size_t)hp->head_dim;
    size_t wide = q_dim > (size_t)hp->dim ? q_dim : (size_t)hp->dim;
    bool fused_qkv = false, fused_gate_up = false;
    for (int l = 0; l < hp->n_layers; l++) {
        fused_qkv |= m->layers[l].wqkv.data != NULL;
        fused_gate_up |= m->layers[l].w_gate_up.data != NULL;
    }
    /* gate doubles as the attention-projection output, so it is at least dim
     * wide; with fused gate|up it holds both halves of each row */
    size_t ffn_w = (size_t)hp->ffn_dim * (fused_gate_up ? 2 : 1);
    size_t gate_w = ffn_w > (size_t)hp->dim ? ffn_w : (size_t)hp->dim;
    lp_plan_add(p, "llama.xn", &st->xn, rows, wide, sizeof(float));
    lp_plan_add(p, "llama.q", &st->q, rows, q_dim, sizeof(float));
    if (fused_qkv) lp_plan_add(p, "llama.qkv", &st->qkv, rows, q_dim + 2 * kv_dim, sizeof(float));
    lp_plan_add(p, "llama.gate", &st->gate, rows, gate_w, sizeof(float));
    lp_plan_add(p, "llama.up", &st->up, rows, (size_t)hp->ffn_dim, sizeof(float));
    lp_plan_add(p, "llama.rope_cos", &st->rope_cos, rows, (size_t)(hp->head_dim / 2), sizeof(float));
    lp_plan_add(p, "llama.rope_sin", &st->rope_sin, rows, (size_t)(hp->head_dim / 2), sizeof(float));
    return 0;
}

/* ---- per-row steps ----------------------------------------------------------------------------- */

static void llama_begin(lp_context *ctx) {
    const lp_model *m = ctx->model;
    llama_state *st = state(ctx);
    int half = m->hp.head_dim / 2;
    for (int r = 0; r < ctx->n_rows; r++) {
        float pos = (float)ctx->rows[r].pos;
        for (int i = 0; i < half; i++) {
            float angle = pos * m->rope_inv_freq[i];
            st->rope_cos[(size_t)r * half + i] = cosf(angle);
            st->rope_sin[(size_t)r * half + i] = sinf(angle);
        }
    }
}

/* Rotates every head of one row's q or k. Normal rope pairs (2i, 2i+1);
 * NEOX pairs (i, i + d/2). */
static void rope_apply(const lp_context *ctx, int r, float *vec, int n_heads) {
    const lp_hparams *hp = &ctx->model->hp;
    const llama_state *st = state(ctx);
    int half = hp->head_dim / 2;
    const float *c = st->rope_cos + (size_t)r * half, *s = st->rope_sin + (size_t)r * half;
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
    float *gate, *up;       /* ROW_SILU */
    int64_t stride;         /* ROW_SILU: of gate and up */
} rows_task;

static void qkv_finish_row(const rows_task *t, int r) {
    lp_context *ctx = t->ctx;
    const lp_hparams *hp = &ctx->model->hp;
    const lp_layer *L = &ctx->model->layers[t->layer];
    const llama_state *st = state(ctx);
    int64_t d = hp->head_dim, q_dim = hp->n_heads * d, kv_dim = hp->n_kv_heads * d;
    float *q = st->q_rows + r * st->q_stride;
    float *k = lp_batch_keys(ctx, t->layer) + r * kv_dim, *v = lp_batch_values(ctx, t->layer) + r * kv_dim;
    if (L->wqkv.data) { /* q stays in the fused output; k/v move to the per-layer
                         * batch KV that attention and commits read */
        memcpy(k, q + q_dim, (size_t)kv_dim * sizeof(float));
        memcpy(v, q + q_dim + kv_dim, (size_t)kv_dim * sizeof(float));
    }
    add_bias(q, L->bq, q_dim);
    add_bias(k, L->bk, kv_dim);
    add_bias(v, L->bv, kv_dim);
    if (L->q_norm) {
        for (int h = 0; h < hp->n_heads; h++) lp_rmsnorm(q + h * d, q + h * d, L->q_norm, d, hp->rms_eps);
        for (int h = 0; h < hp->n_kv_heads; h++) lp_rmsnorm(k + h * d, k + h * d, L->k_norm, d, hp->rms_eps);
    }
    rope_apply(ctx, r, q, hp->n_heads);
    rope_apply(ctx, r, k, hp->n_kv_heads);
    lp_attention_key_ready(ctx, t->layer, r);
}

static void row_step_one(void *arg, int r) {
    const rows_task *t = arg;
    lp_context *ctx = t->ctx;
    const lp_model *m = ctx->model;
    const lp_layer *L = &m->layers[t->layer];
    const llama_state *st = state(ctx);
    int64_t dim = m->hp.dim;
    float *x = ctx->x + r * dim, *xn = st->xn + r * dim;
    /* folded gains already sit in the columns of q/k/v and gate/up */
    switch (t->step) {
    case ROW_ATTN_NORM:
        lp_rmsnorm(xn, x, m->norms_folded ? NULL : L->attn_norm, dim, m->hp.rms_eps);
        break;
    case ROW_QKV_FINISH:
        qkv_finish_row(t, r);
        break;
    case ROW_RESIDUAL_NORM:
        ctx->kern.axpy_f32(x, 1.0f, st->gate + r * dim, dim);
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

static void run_rows(lp_context *ctx, rows_task t) { lp_run_rows(ctx, row_step_one, &t); }

/* ---- the layer --------------------------------------------------------------------------------- */

/* q, k, v of the batch: q into st->q (or left inside the fused buffer), k
 * and v into this layer's batch keys and values; then biases, q/k norms and
 * rope. */
static void attention_inputs(lp_context *ctx, int l) {
    const lp_hparams *hp = &ctx->model->hp;
    const lp_layer *L = &ctx->model->layers[l];
    llama_state *st = state(ctx);
    int64_t dim = hp->dim, d = hp->head_dim;
    int64_t q_dim = hp->n_heads * d, kv_dim = hp->n_kv_heads * d;
    const int ids[3] = {lp_llama_weight_id(l, LP_PROJ_Q), lp_llama_weight_id(l, LP_PROJ_K),
                        lp_llama_weight_id(l, LP_PROJ_V)};
    st->q_rows = st->q;
    st->q_stride = q_dim;
    if (L->wqkv.data) {
        /* one matmul; adapters add to the q/k/v column ranges of its output */
        int64_t w = q_dim + 2 * kv_dim;
        lp_linear_fused(ctx, &L->wqkv, 3, ids, st->xn, dim, st->qkv, w);
        st->q_rows = st->qkv;
        st->q_stride = w;
    } else {
        float *ys[3] = {st->q, lp_batch_keys(ctx, l), lp_batch_values(ctx, l)};
        const int64_t strides[3] = {q_dim, kv_dim, kv_dim};
        lp_linear_multi(ctx, 3, ids, st->xn, dim, ys, strides);
    }
    run_rows(ctx, (rows_task){.ctx = ctx, .layer = l, .step = ROW_QKV_FINISH});
}

/* silu(gate) * up of the batch; returns where the product rows are and
 * their stride (inside the fused buffer for fused gate|up). */
static float *feed_forward_hidden(lp_context *ctx, int l, int64_t *stride) {
    const lp_hparams *hp = &ctx->model->hp;
    const lp_layer *L = &ctx->model->layers[l];
    llama_state *st = state(ctx);
    int64_t dim = hp->dim, ffn = hp->ffn_dim;
    const int ids[2] = {lp_llama_weight_id(l, LP_PROJ_GATE), lp_llama_weight_id(l, LP_PROJ_UP)};
    float *gate = st->gate, *up = st->up;
    int64_t w = ffn;
    if (L->w_gate_up.data) {
        w = 2 * ffn;
        up = st->gate + ffn;
        lp_linear_fused(ctx, &L->w_gate_up, 2, ids, st->xn, dim, st->gate, w);
    } else {
        float *ys[2] = {gate, up};
        const int64_t strides[2] = {w, w};
        lp_linear_multi(ctx, 2, ids, st->xn, dim, ys, strides);
    }
    run_rows(ctx, (rows_task){.ctx = ctx, .layer = l, .step = ROW_SILU, .gate = gate, .up = up, .stride = w});
    *stride = w;
    return gate;
}

static void llama_layer(lp_context *ctx, int l) {
    const lp_hparams *hp = &ctx->model->hp;
    llama_state *st = state(ctx);
    int64_t dim = hp->dim, q_dim = hp->n_heads * (int64_t)hp->head_dim;
    /* attention block: its output (in xn, q_dim wide) -> gate buffer as
     * scratch, then the residual */
    run_rows(ctx, (rows_task){.ctx = ctx, .layer = l, .step = ROW_ATTN_NORM});
    attention_inputs(ctx, l);
    lp_attention(ctx, l, st->q_rows, st->q_stride, st->xn, q_dim);
    lp_linear(ctx, lp_llama_weight_id(l, LP_PROJ_O), st->xn, q_dim, st->gate, dim);

    /* feed-forward block */
    run_rows(ctx, (rows_task){.ctx = ctx, .layer = l, .step = ROW_RESIDUAL_NORM});
    int64_t h_stride;
    float *hidden = feed_forward_hidden(ctx, l, &h_stride);
    lp_linear(ctx, lp_llama_weight_id(l, LP_PROJ_DOWN), hidden, h_stride, st->xn, dim);
    run_rows(ctx, (rows_task){.ctx = ctx, .layer = l, .step = ROW_RESIDUAL});
}

static void llama_logits(lp_context *ctx, const int *rows, int n) {
    const lp_model *m = ctx->model;
    int64_t dim = m->hp.dim;
    for (int i = 0; i < n; i++)
        lp_rmsnorm(ctx->logit_in + i * dim, ctx->x + rows[i] * dim, m->output_norm, dim, m->hp.rms_eps);
    lp_matmul(&ctx->kern, ctx->pool, &m->output, ctx->logit_in, dim, n, ctx->logits, m->hp.n_vocab);
}

const lp_graph lp_llama_graph = {
    .plan = llama_plan,
    .begin = llama_begin,
    .layer = llama_layer,
    .logits = llama_logits,
};
