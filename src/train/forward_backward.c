/* The model's forward pass (keeping what the backward needs) and its
 * backward pass, layer by layer in reverse, one explicit step per operation. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train_internal.h"

/* ---- activation buffers -------------------------------------------------------- */

void lp_t_free_acts(lp_tacts *a) {
    if (!a) return;
    float **bufs[] = {&a->x, &a->xn1, &a->rstd1, &a->q, &a->k, &a->v, &a->att, &a->att_out,
                      &a->x_mid, &a->xn2, &a->rstd2, &a->gate, &a->up, &a->h, &a->lora_t,
                      &a->xnf, &a->rstdf, &a->logits, &a->rope_cos, &a->rope_sin,
                      &a->dlogits, &a->dx, &a->dxn, &a->dtmp, &a->dq, &a->dk, &a->dv,
                      &a->datt_out, &a->dgate, &a->dup, &a->dh, &a->dlora, &a->datt,
                      &a->scratch};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) lp_free(*bufs[i]);
    lp_free(a->row_loss);
    free(a);
}

/* Allocates count1*count2*count3 floats (0 counts allowed), overflow-checked. */
static float *acts_alloc(size_t n1, size_t n2, size_t n3, bool *ok) {
    size_t n, bytes;
    if (!lp_mul_ok(n1, n2, &n) || !lp_mul_ok(n, n3, &n) || !lp_mul_ok(n, sizeof(float), &bytes)) {
        *ok = false;
        return NULL;
    }
    float *p = lp_alloc(bytes ? bytes : sizeof(float));
    if (!p) *ok = false;
    return p;
}

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

int lp_train_model_reserve(lp_train_model *m, int max_batch, int max_seq, lp_error *err) {
    const lp_train_config *c = &m->cfg;
    if (max_batch <= 0 || max_seq <= 0 || max_batch > (1 << 16) || max_seq > (1 << 20))
        return lp_fail(err, "batch %d x %d is out of range", max_batch, max_seq);
    lp_t_free_acts(m->acts);
    lp_tacts *a = m->acts = calloc(1, sizeof *a);
    if (!a) return lp_fail(err, "out of memory");
    a->max_batch = max_batch;
    a->max_seq = max_seq;
    size_t N = (size_t)max_batch * (size_t)max_seq, L = (size_t)c->n_layers;
    size_t dim = (size_t)c->dim, q_dim = (size_t)c->n_heads * c->head_dim,
           kv_dim = (size_t)c->n_kv_heads * c->head_dim, ffn = (size_t)c->ffn_dim,
           V = (size_t)c->n_vocab, R = (size_t)c->lora_rank, H = (size_t)c->n_heads;
    size_t wide = max_sz(dim, q_dim);
    size_t max_in = max_sz(wide, max_sz(ffn, R)), max_out = max_sz(max_in, V);
    bool ok = true;
    a->x = acts_alloc(L + 1, N, dim, &ok);
    a->xn1 = acts_alloc(L, N, dim, &ok);
    a->rstd1 = acts_alloc(L, N, 1, &ok);
    a->q = acts_alloc(L, N, q_dim, &ok);
    a->k = acts_alloc(L, N, kv_dim, &ok);
    a->v = acts_alloc(L, N, kv_dim, &ok);
    a->att = acts_alloc(L * H, N, (size_t)max_seq, &ok);
    a->att_out = acts_alloc(L, N, q_dim, &ok);
    a->x_mid = acts_alloc(L, N, dim, &ok);
    a->xn2 = acts_alloc(L, N, dim, &ok);
    a->rstd2 = acts_alloc(L, N, 1, &ok);
    a->gate = acts_alloc(L, N, ffn, &ok);
    a->up = acts_alloc(L, N, ffn, &ok);
    a->h = acts_alloc(L, N, ffn, &ok);
    a->lora_t = acts_alloc(L * LP_PROJ_COUNT, N, R, &ok);
    a->xnf = acts_alloc(N, dim, 1, &ok);
    a->rstdf = acts_alloc(N, 1, 1, &ok);
    a->logits = acts_alloc(N, V, 1, &ok);
    a->rope_cos = acts_alloc(N, (size_t)c->head_dim / 2, 1, &ok);
    a->rope_sin = acts_alloc(N, (size_t)c->head_dim / 2, 1, &ok);
    a->dlogits = acts_alloc(N, V, 1, &ok);
    a->dx = acts_alloc(N, wide, 1, &ok);
    a->dxn = acts_alloc(N, wide, 1, &ok);
    a->dtmp = acts_alloc(N, wide, 1, &ok);
    a->dq = acts_alloc(N, q_dim, 1, &ok);
    a->dk = acts_alloc(N, kv_dim, 1, &ok);
    a->dv = acts_alloc(N, kv_dim, 1, &ok);
    a->datt_out = acts_alloc(N, q_dim, 1, &ok);
    a->dgate = acts_alloc(N, ffn, 1, &ok);
    a->dup = acts_alloc(N, ffn, 1, &ok);
    a->dh = acts_alloc(N, ffn, 1, &ok);
    a->dlora = acts_alloc(N, R, 1, &ok);
    a->datt = acts_alloc(H, N, (size_t)max_seq, &ok); /* one layer's dP: [B][H][T][T] */
    size_t s1 = 0, s2 = 0;
    ok = ok && lp_add_ok(max_in, max_out, &s1) && lp_mul_ok(N, s1, &s1) &&
         lp_mul_ok(max_in, max_out, &s2);
    a->scratch_floats = max_sz(s1, s2);
    a->scratch = acts_alloc(a->scratch_floats, 1, 1, &ok);
    a->row_loss = ok ? lp_alloc(4 * N * sizeof(double)) : NULL;
    ok = ok && a->row_loss;
    if (ok) {
        a->row_kl = a->row_loss + N;
        a->row_max = a->row_loss + 2 * N;
        a->row_sum = a->row_loss + 3 * N;
    }
    if (!ok) {
        lp_t_free_acts(a);
        m->acts = NULL;
        return lp_fail(err, "out of memory for activations of a %d x %d batch", max_batch, max_seq);
    }
    return 0;
}

/* ---- helpers ---------------------------------------------------------------- */

static float *proj_weight(const lp_tlayer *L, int p) {
    float *const w[LP_PROJ_COUNT] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down};
    return w[p];
}

static float *lora_t_of(const lp_train_model *m, int l, int p) {
    const lp_tacts *a = m->acts;
    size_t N = (size_t)a->B * a->T;
    return a->lora_t + ((size_t)l * LP_PROJ_COUNT + p) * N * (size_t)m->cfg.lora_rank;
}

static float lora_scale(const lp_train_config *c) {
    return c->lora_rank > 0 ? c->lora_alpha / (float)c->lora_rank : 0.0f;
}

/* y = W x (+ s B (A x), keeping A x). */
static void linear_forward(lp_train_model *m, int l, int p, float *y, const float *x, int N) {
    const lp_train_config *c = &m->cfg;
    const lp_tlayer *L = &m->w.layers[l];
    int in = (int)lp_t_lora_rows_in(c, p), out = (int)lp_t_lora_rows_out(c, p);
    const float *xb = m->quad ? lp_t_quad_base_input(m, x, N, in) : NULL;
    lp_t_matmul(m->pool, m->gemm_level, y, xb ? xb : x, proj_weight(L, p), N, in, out, 1.0f, false,
                m->acts->scratch);
    if (L->lora_a[p]) {
        float *t = lora_t_of(m, l, p);
        if (m->quad && lp_t_quad_branch(m, l, p, y, x, N, t)) return;
        lp_t_matmul(m->pool, m->gemm_level, t, x, L->lora_a[p], N, in, c->lora_rank, 1.0f, false,
                    m->acts->scratch);
        if (m->quad) lp_t_quad_observe(m, l, p, x, t, N);
        lp_t_matmul(m->pool, m->gemm_level, y, t, L->lora_b[p], N, c->lora_rank, out,
                    lora_scale(c), true, m->acts->scratch);
    }
}

/* Given dy, writes (or adds) dx and accumulates dW, dA, dB where trainable. */
static void linear_backward(lp_train_model *m, int l, int p, float *dx, const float *dy,
                            const float *x, int N, bool accumulate) {
    const lp_train_config *c = &m->cfg;
    const lp_tlayer *L = &m->w.layers[l], *G = &m->g.layers[l];
    float *scratch = m->acts->scratch;
    int in = (int)lp_t_lora_rows_in(c, p), out = (int)lp_t_lora_rows_out(c, p), r = c->lora_rank;
    float *gw = proj_weight(G, p);
    if (gw) lp_t_matmul_dw(m->pool, m->gemm_level, gw, dy, x, N, in, out, 1.0f, scratch);
    lp_t_matmul_dx(m->pool, m->gemm_level, dx, dy, proj_weight(L, p), N, in, out, 1.0f,
                   accumulate, scratch);
    if (L->lora_a[p]) {
        const float *t = lora_t_of(m, l, p);
        float s = lora_scale(c), *dt = m->acts->dlora;
        if (G->lora_b[p])
            lp_t_matmul_dw(m->pool, m->gemm_level, G->lora_b[p], dy, t, N, r, out, s, scratch);
        lp_t_matmul_dx(m->pool, m->gemm_level, dt, dy, L->lora_b[p], N, r, out, s, false, scratch);
        if (G->lora_a[p])
            lp_t_matmul_dw(m->pool, m->gemm_level, G->lora_a[p], dt, x, N, in, r, 1.0f, scratch);
        lp_t_matmul_dx(m->pool, m->gemm_level, dx, dt, L->lora_a[p], N, in, r, 1.0f, true, scratch);
    }
}

static void add_rows(float *y, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

static const float *embedding_row(const lp_train_model *m, int32_t id) {
    const lp_train_config *c = &m->cfg;
    return id < c->n_vocab ? m->w.tok_embd + (size_t)id * c->dim
                           : m->w.extra + (size_t)(id - c->n_vocab) * c->dim;
}

static lp_t_attn attn_args(const lp_train_model *m, const lp_train_batch *b, int l) {
    const lp_train_config *c = &m->cfg;
    const lp_tacts *a = m->acts;
    size_t N = (size_t)b->B * b->T, q_dim = (size_t)c->n_heads * c->head_dim,
           kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    lp_t_attn at = {
        .B = b->B, .T = b->T, .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads,
        .head_dim = c->head_dim, .visible = b->visible, .level = m->gemm_level,
        .q = a->q + l * N * q_dim, .k = a->k + l * N * kv_dim, .v = a->v + l * N * kv_dim,
        .att = a->att + (size_t)l * N * c->n_heads * b->T,
        .out = a->att_out + l * N * q_dim,
    };
    return at;
}

/* ---- forward ------------------------------------------------------------------ */

static int check_batch(const lp_train_model *m, const lp_train_batch *b, lp_error *err) {
    const lp_train_config *c = &m->cfg;
    if (!m->acts) return lp_fail(err, "training model: lp_train_model_reserve was not called");
    if (b->B <= 0 || b->T <= 0 || b->B > m->acts->max_batch || b->T > m->acts->max_seq)
        return lp_fail(err, "batch %d x %d exceeds the reserved %d x %d", b->B, b->T,
                       m->acts->max_batch, m->acts->max_seq);
    size_t N = (size_t)b->B * b->T;
    for (size_t n = 0; n < N; n++) {
        int32_t id = b->inputs[n];
        if (id < 0 || id >= c->n_vocab + c->n_extra)
            return lp_fail(err, "input %zu: token id %d is out of range (vocab %d + %d extra)",
                           n, id, c->n_vocab, c->n_extra);
        float w = b->mask ? b->mask[n] : 1.0f;
        if (w != 0 && (b->targets[n] < 0 || b->targets[n] >= c->n_vocab))
            return lp_fail(err, "target %zu: token id %d is out of range", n, b->targets[n]);
        if (!(w >= 0) || !isfinite(w)) return lp_fail(err, "mask %zu is not a finite weight >= 0", n);
    }
    return 0;
}

static void rope_tables(lp_train_model *m, const lp_train_batch *b) {
    int half = m->cfg.head_dim / 2;
    size_t N = (size_t)b->B * b->T;
    for (size_t n = 0; n < N; n++) {
        float pos = (float)(b->pos ? b->pos[n] : (int32_t)(n % (size_t)b->T));
        for (int i = 0; i < half; i++) {
            float angle = pos * m->rope_inv_freq[i];
            m->acts->rope_cos[n * half + i] = cosf(angle);
            m->acts->rope_sin[n * half + i] = sinf(angle);
        }
    }
}

/* Each row's cross-entropy (and KL to the teacher) in double, threaded over
 * rows; the mean sums them in row order. */
typedef struct ce_job {
    lp_train_model *m;
    const lp_train_batch *b;
} ce_job;

static void cross_entropy_rows(void *arg, int64_t n0, int64_t n1) {
    const ce_job *j = arg;
    const lp_train_batch *b = j->b;
    lp_tacts *a = j->m->acts;
    size_t V = (size_t)j->m->cfg.n_vocab;
    bool kd = b->teacher && b->kd_weight > 0;
    for (size_t n = (size_t)n0; n < (size_t)n1; n++) {
        a->row_loss[n] = a->row_kl[n] = 0;
        if (b->mask && b->mask[n] == 0) continue;
        const float *z = a->logits + n * V;
        float max = z[0];
        for (size_t v = 1; v < V; v++) max = z[v] > max ? z[v] : max;
        double sum = 0;
        for (size_t v = 0; v < V; v++) sum += exp((double)z[v] - max);
        a->row_max[n] = max; /* for the backward */
        a->row_sum[n] = sum;
        double lse = log(sum) + max, ce = lse - z[b->targets[n]];
        if (kd) {
            /* KL(p || q) = sum p (log p - log q), log q = z - lse */
            const float *pt = b->teacher + n * V;
            double k = 0;
            for (size_t v = 0; v < V; v++)
                if (pt[v] > 0) k += pt[v] * (log((double)pt[v]) - (z[v] - lse));
            a->row_kl[n] = k;
            ce = (1.0 - b->kd_weight) * ce + b->kd_weight * k;
        }
        a->row_loss[n] = ce;
    }
}

/* Mean masked cross-entropy. */
static double cross_entropy(lp_train_model *m, const lp_train_batch *b) {
    lp_tacts *a = m->acts;
    size_t N = (size_t)b->B * b->T;
    ce_job j = {.m = m, .b = b};
    lp_t_parallel_for(m->pool, (int64_t)N, 3 * m->cfg.n_vocab, cross_entropy_rows, &j);
    double total = 0, weight = 0, kl = 0;
    bool kd = b->teacher && b->kd_weight > 0;
    for (size_t n = 0; n < N; n++) {
        float w = b->mask ? b->mask[n] : 1.0f;
        if (w == 0) continue;
        if (kd) kl += w * a->row_kl[n];
        total += w * a->row_loss[n];
        weight += w;
    }
    a->mask_sum = weight;
    a->kl = weight > 0 && kd ? kl / weight : 0.0;
    a->loss = weight > 0 ? total / weight : 0.0;
    return a->loss;
}

double lp_train_forward(lp_train_model *m, const lp_train_batch *b, lp_error *err) {
    if (check_batch(m, b, err) < 0) return NAN;
    const lp_train_config *c = &m->cfg;
    lp_tacts *a = m->acts;
    a->B = b->B;
    a->T = b->T;
    int N = b->B * b->T;
    size_t dim = (size_t)c->dim, q_dim = (size_t)c->n_heads * c->head_dim,
           kv_dim = (size_t)c->n_kv_heads * c->head_dim, ffn = (size_t)c->ffn_dim;
    rope_tables(m, b);
    for (int n = 0; n < N; n++) memcpy(a->x + (size_t)n * dim, embedding_row(m, b->inputs[n]), dim * sizeof(float));

    for (int l = 0; l < c->n_layers; l++) {
        const lp_tlayer *L = &m->w.layers[l];
        size_t o = (size_t)l * N;
        float *x = a->x + o * dim, *xn1 = a->xn1 + o * dim, *q = a->q + o * q_dim,
              *k = a->k + o * kv_dim, *v = a->v + o * kv_dim, *att_out = a->att_out + o * q_dim,
              *x_mid = a->x_mid + o * dim, *xn2 = a->xn2 + o * dim, *gate = a->gate + o * ffn,
              *up = a->up + o * ffn, *h = a->h + o * ffn, *x_next = a->x + (o + N) * dim;
        lp_t_rmsnorm(m->pool, xn1, a->rstd1 + o, x, L->attn_norm, N, c->dim, c->rms_eps);
        linear_forward(m, l, LP_PROJ_Q, q, xn1, N);
        linear_forward(m, l, LP_PROJ_K, k, xn1, N);
        linear_forward(m, l, LP_PROJ_V, v, xn1, N);
        lp_t_rope(m->pool, q, a->rope_cos, a->rope_sin, N, c->n_heads, c->head_dim, 1.0f);
        lp_t_rope(m->pool, k, a->rope_cos, a->rope_sin, N, c->n_kv_heads, c->head_dim, 1.0f);
        lp_t_attn at = attn_args(m, b, l);
        lp_t_attention(m->pool, &at);
        linear_forward(m, l, LP_PROJ_O, a->dtmp, att_out, N);
        add_rows(x_mid, x, a->dtmp, (size_t)N * dim);
        lp_t_rmsnorm(m->pool, xn2, a->rstd2 + o, x_mid, L->ffn_norm, N, c->dim, c->rms_eps);
        linear_forward(m, l, LP_PROJ_GATE, gate, xn2, N);
        linear_forward(m, l, LP_PROJ_UP, up, xn2, N);
        lp_t_swiglu(m->pool, h, gate, up, (int64_t)N * ffn);
        linear_forward(m, l, LP_PROJ_DOWN, a->dtmp, h, N);
        add_rows(x_next, x_mid, a->dtmp, (size_t)N * dim);
    }
    lp_t_rmsnorm(m->pool, a->xnf, a->rstdf, a->x + (size_t)c->n_layers * N * dim, m->w.output_norm, N,
                 c->dim, c->rms_eps);
    const float *xf = m->quad ? lp_t_quad_base_input(m, a->xnf, N, c->dim) : NULL;
    lp_t_matmul(m->pool, m->gemm_level, a->logits, xf ? xf : a->xnf, m->w.output, N, c->dim, c->n_vocab,
                1.0f, false, a->scratch);
    return cross_entropy(m, b);
}

const float *lp_train_logits(const lp_train_model *m, int i) {
    return m->acts->logits + (size_t)i * m->cfg.n_vocab;
}

const float *lp_train_layer_kv(const lp_train_model *m, int l, bool values) {
    size_t N = (size_t)m->acts->B * (size_t)m->acts->T, kv_dim = (size_t)m->cfg.n_kv_heads * m->cfg.head_dim;
    return (values ? m->acts->v : m->acts->k) + (size_t)l * N * kv_dim;
}

double lp_train_last_kl(const lp_train_model *m) { return m->acts ? m->acts->kl : 0.0; }

/* ---- backward ------------------------------------------------------------------- */

void lp_train_zero_grad(lp_train_model *m) {
    for (int g = 0; g < 3; g++)
        if (m->grad[g]) memset(m->grad[g], 0, m->group_size[g] * sizeof(float));
}

/* dL/dlogits = (softmax - onehot) * w / sum(w), threaded over rows. */
static void cross_entropy_backward_rows(void *arg, int64_t n0, int64_t n1) {
    const ce_job *j = arg;
    const lp_train_batch *b = j->b;
    lp_tacts *a = j->m->acts;
    size_t V = (size_t)j->m->cfg.n_vocab;
    for (size_t n = (size_t)n0; n < (size_t)n1; n++) {
        float w = b->mask ? b->mask[n] : 1.0f;
        float *dz = a->dlogits + n * V;
        if (w == 0 || a->mask_sum <= 0) {
            memset(dz, 0, V * sizeof(float));
            continue;
        }
        const float *z = a->logits + n * V;
        float max = (float)a->row_max[n]; /* the forward's, of these logits */
        double sum = a->row_sum[n];
        double k = w / a->mask_sum;
        for (size_t v = 0; v < V; v++) dz[v] = (float)(exp((double)z[v] - max) / sum * k);
        if (b->teacher && b->kd_weight > 0) {
            /* (1 - l)(q - onehot) + l (q - p) */
            const float *pt = b->teacher + n * V;
            double l = b->kd_weight;
            for (size_t v = 0; v < V; v++) dz[v] -= (float)(l * pt[v] * k);
            dz[b->targets[n]] -= (float)((1.0 - l) * k);
            continue;
        }
        dz[b->targets[n]] -= (float)k;
    }
}

static void cross_entropy_backward(lp_train_model *m, const lp_train_batch *b) {
    ce_job j = {.m = m, .b = b};
    lp_t_parallel_for(m->pool, (int64_t)b->B * b->T, 3 * m->cfg.n_vocab, cross_entropy_backward_rows, &j);
}

void lp_train_backward(lp_train_model *m, const lp_train_batch *b) {
    if (!m->trainable) return;
    const lp_train_config *c = &m->cfg;
    lp_tacts *a = m->acts;
    int N = b->B * b->T;
    size_t dim = (size_t)c->dim, q_dim = (size_t)c->n_heads * c->head_dim,
           kv_dim = (size_t)c->n_kv_heads * c->head_dim, ffn = (size_t)c->ffn_dim;
    float *scratch = a->scratch;

    cross_entropy_backward(m, b);
    if (m->g.output)
        lp_t_matmul_dw(m->pool, m->gemm_level, m->g.output, a->dlogits, a->xnf, N, c->dim,
                       c->n_vocab, 1.0f, scratch);
    lp_t_matmul_dx(m->pool, m->gemm_level, a->dxn, a->dlogits, m->w.output, N, c->dim,
                   c->n_vocab, 1.0f, false, scratch);
    lp_t_rmsnorm_backward(m->pool, a->dx, m->g.output_norm, a->dxn, a->x + (size_t)c->n_layers * N * dim,
                          m->w.output_norm, a->rstdf, N, c->dim, false);

    for (int l = c->n_layers - 1; l >= 0; l--) {
        const lp_tlayer *L = &m->w.layers[l], *G = &m->g.layers[l];
        size_t o = (size_t)l * N;
        /* a->dx holds dL/dx_{l+1}; x_{l+1} = x_mid + down(h) */
        linear_backward(m, l, LP_PROJ_DOWN, a->dh, a->dx, a->h + o * ffn, N, false);
        lp_t_swiglu_backward(m->pool, a->dgate, a->dup, a->dh, a->gate + o * ffn, a->up + o * ffn,
                             (int64_t)N * ffn);
        linear_backward(m, l, LP_PROJ_GATE, a->dxn, a->dgate, a->xn2 + o * dim, N, false);
        linear_backward(m, l, LP_PROJ_UP, a->dxn, a->dup, a->xn2 + o * dim, N, true);
        lp_t_rmsnorm_backward(m->pool, a->dx, G->ffn_norm, a->dxn, a->x_mid + o * dim, L->ffn_norm,
                              a->rstd2 + o, N, c->dim, true);
        /* a->dx holds dL/dx_mid; x_mid = x_l + o(attention) */
        linear_backward(m, l, LP_PROJ_O, a->datt_out, a->dx, a->att_out + o * q_dim, N, false);
        lp_t_attn at = attn_args(m, b, l);
        at.dout = a->datt_out;
        at.dq = a->dq;
        at.dk = a->dk;
        at.dv = a->dv;
        at.datt = a->datt;
        lp_t_attention_backward(m->pool, &at);
        lp_t_rope(m->pool, a->dq, a->rope_cos, a->rope_sin, N, c->n_heads, c->head_dim, -1.0f);
        lp_t_rope(m->pool, a->dk, a->rope_cos, a->rope_sin, N, c->n_kv_heads, c->head_dim, -1.0f);
        const float *xn1 = a->xn1 + o * dim;
        linear_backward(m, l, LP_PROJ_Q, a->dxn, a->dq, xn1, N, false);
        linear_backward(m, l, LP_PROJ_K, a->dxn, a->dk, xn1, N, true);
        linear_backward(m, l, LP_PROJ_V, a->dxn, a->dv, xn1, N, true);
        lp_t_rmsnorm_backward(m->pool, a->dx, G->attn_norm, a->dxn, a->x + o * dim, L->attn_norm,
                              a->rstd1 + o, N, c->dim, true);
        (void)kv_dim;
    }
    /* embedding rows: sequential, so repeated ids add up in a fixed order */
    for (int n = 0; n < N; n++) {
        int32_t id = b->inputs[n];
        float *row = id < c->n_vocab
                         ? (m->g.tok_embd ? m->g.tok_embd + (size_t)id * dim : NULL)
                         : (m->g.extra ? m->g.extra + (size_t)(id - c->n_vocab) * dim : NULL);
        if (row)
            for (size_t i = 0; i < dim; i++) row[i] += a->dx[(size_t)n * dim + i];
    }
}
