/* QUAD in the trainer (docs/quad.md): the student's forward runs the LoRA
 * branch exactly as the shared-profile kernels do (src/kernels/lora_static.c:
 * the same function, on codes of the current FP32 weights), the base's
 * inputs quantized as the W4A8 kernels quantize them (int8 per group of 32,
 * scale amax/127), and the backward takes the gradient at the fake-quantized
 * point and passes it straight through the rounding (STE). Also the range
 * observation that calibrates activation encodings, and the QSS. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/lora_static.h"
#include "train_internal.h"

struct lp_train_quad {
    int n_slots;                  /* n_layers * LP_PROJ_COUNT, by lp_llama_weight_id */
    int n_threads;
    bool base_act_q8;
    float *xq;                    /* [max tokens][widest input] */
    size_t xq_floats;
    const lp_lpq *profile;        /* static branch on when set */
    const lp_lpq_entry **enc;     /* [n_slots] */
    uint8_t **qa, **qb;           /* [n_slots] codes of the current weights (B: lp_lora_static_b_at) */
    int64_t **sum_a;              /* [n_slots] their lp_lora_static.sum_a */
    int32_t *scratch;             /* [n_threads][widest in + rank] */
    int scratch_per_thread;
    bool observe, histogram;
    float *x_lo, *x_hi, *t_lo, *t_hi; /* [n_slots] */
    double *hist;                 /* [n_slots][2][LP_QUAD_HIST_BINS] counts of x, t */
};

lp_train_quad *lp_train_quad_create(const lp_train_model *m, lp_error *err) {
    const lp_train_config *c = &m->cfg;
    lp_train_quad *q = calloc(1, sizeof *q);
    if (!q) {
        lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    q->n_slots = c->n_layers * LP_PROJ_COUNT;
    q->n_threads = m->pool ? lp_threadpool_size(m->pool) : 1;
    int widest = c->dim > c->ffn_dim ? c->dim : c->ffn_dim;
    int qd = c->n_heads * c->head_dim;
    if (qd > widest) widest = qd;
    q->scratch_per_thread = LP_LORA_STATIC_SCRATCH(widest, c->lora_rank > 0 ? c->lora_rank : 1);
    size_t tokens = m->acts ? (size_t)m->acts->max_batch * (size_t)m->acts->max_seq : 0;
    q->xq_floats = tokens * (size_t)widest;
    q->xq = lp_alloc((q->xq_floats ? q->xq_floats : 1) * sizeof(float));
    q->enc = calloc((size_t)q->n_slots, sizeof *q->enc);
    q->qa = calloc((size_t)q->n_slots, sizeof *q->qa);
    q->qb = calloc((size_t)q->n_slots, sizeof *q->qb);
    q->sum_a = calloc((size_t)q->n_slots, sizeof *q->sum_a);
    q->scratch = malloc((size_t)q->n_threads * (size_t)q->scratch_per_thread * sizeof(int32_t));
    float **r[4] = {&q->x_lo, &q->x_hi, &q->t_lo, &q->t_hi};
    bool ok = q->xq && q->enc && q->qa && q->qb && q->sum_a && q->scratch && m->acts;
    for (int i = 0; i < 4; i++) ok = (*r[i] = malloc((size_t)q->n_slots * sizeof(float))) && ok;
    if (!ok) {
        lp_train_quad_free(q);
        lp_fail(err, m->acts ? "out of memory" : "lp_train_model_reserve first");
        return NULL;
    }
    lp_train_quad_reset_ranges(q);
    return q;
}

void lp_train_quad_free(lp_train_quad *q) {
    if (!q) return;
    for (int i = 0; q->qa && i < q->n_slots; i++) {
        free(q->qa[i]);
        free(q->qb[i]);
        if (q->sum_a) free(q->sum_a[i]);
    }
    free(q->qa);
    free(q->qb);
    free(q->sum_a);
    free(q->enc);
    free(q->scratch);
    lp_free(q->xq);
    free(q->x_lo);
    free(q->x_hi);
    free(q->t_lo);
    free(q->t_hi);
    free(q->hist);
    free(q);
}

void lp_train_quad_base_act_q8(lp_train_quad *q, bool on) { q->base_act_q8 = on; }

void lp_train_quad_observe(lp_train_quad *q, bool on) { q->observe = on; }

int lp_train_quad_histogram(lp_train_quad *q, bool on, lp_error *err) {
    size_t n = (size_t)q->n_slots * 2 * LP_QUAD_HIST_BINS;
    if (on && !q->hist && !(q->hist = calloc(n, sizeof *q->hist)))
        return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    if (on) memset(q->hist, 0, n * sizeof *q->hist);
    q->histogram = on;
    return 0;
}

const double *lp_train_quad_hist(const lp_train_quad *q, int slot) {
    return q->hist && slot >= 0 && slot < q->n_slots ? q->hist + (size_t)slot * 2 * LP_QUAD_HIST_BINS : NULL;
}

/* Counts of v[0..n) in LP_QUAD_HIST_BINS bins over [lo, hi] (ends clamped). */
static void count_into(double *h, const float *v, size_t n, float lo, float hi) {
    float span = hi - lo, per = span > 0 ? (float)LP_QUAD_HIST_BINS / span : 0.0f;
    for (size_t i = 0; i < n; i++) h[lp_q_bin(v[i], lo, per, LP_QUAD_HIST_BINS)] += 1.0;
}

void lp_train_quad_reset_ranges(lp_train_quad *q) {
    for (int i = 0; i < q->n_slots; i++) {
        q->x_lo[i] = q->t_lo[i] = INFINITY;
        q->x_hi[i] = q->t_hi[i] = -INFINITY;
    }
}

void lp_train_quad_ranges(const lp_train_quad *q, int slot, float *x_lo, float *x_hi, float *t_lo,
                          float *t_hi) {
    *x_lo = q->x_lo[slot];
    *x_hi = q->x_hi[slot];
    *t_lo = q->t_lo[slot];
    *t_hi = q->t_hi[slot];
}

int lp_train_quad_set_profile(lp_train_quad *q, const lp_train_model *m, const lp_lpq *profile,
                              lp_error *err) {
    const lp_train_config *c = &m->cfg;
    q->profile = NULL;
    if (!profile) return 0;
    int found = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int p = 0; p < LP_PROJ_COUNT; p++) {
            int s = lp_llama_weight_id(l, (lp_proj)p);
            q->enc[s] = NULL;
            if (!m->w.layers[l].lora_a[p]) continue;
            char name[96];
            lp_llama_weight_name(l, (lp_proj)p, name, sizeof name);
            const lp_lpq_entry *e = lp_lpq_find(profile, name);
            if (!e) return lp_fail(err, "the profile has no encodings for %s", name);
            if ((int)e->rank != c->lora_rank || e->in != lp_t_lora_rows_in(c, p) || e->out != lp_t_lora_rows_out(c, p))
                return lp_fail(err, "%s: the profile's shape (rank %u, %u x %u) is not the adapter's", name, e->rank,
                               e->out, e->in);
            if (!q->qa[s]) q->qa[s] = malloc((size_t)e->rank * e->in);
            if (!q->qb[s]) q->qb[s] = calloc(LP_LORA_STATIC_B_CODES((int)e->rank, (int)e->out), 1);
            if (!q->sum_a[s]) q->sum_a[s] = malloc((size_t)e->rank * sizeof(int64_t));
            if (!q->qa[s] || !q->qb[s] || !q->sum_a[s]) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
            q->enc[s] = e;
            found++;
        }
    if ((uint32_t)found != profile->n_entries)
        return lp_fail(err, "the profile has %u entries but the adapter adapts %d weights", profile->n_entries, found);
    q->profile = profile;
    return 0;
}

/* codes of m under per-row or per-tensor encodings (for B: in the static
 * branch's quads, lp_lora_static_b_at), and m replaced by the values they
 * stand for */
static void encode_fake(float *m, size_t rows, size_t cols, const lp_qenc *enc, uint32_t n, int qmax,
                        bool quads, uint8_t *codes) {
    for (size_t r = 0; r < rows; r++) {
        lp_qenc e = enc[n > 1 ? r : 0];
        for (size_t k = 0; k < cols; k++) {
            int c = lp_q_code(m[r * cols + k], e, qmax);
            codes[quads ? lp_lora_static_b_at((int)cols, (int)k, (int)r) : r * cols + k] = (uint8_t)c;
            m[r * cols + k] = lp_q_value(c, e);
        }
    }
}

int lp_train_quad_begin(lp_train_quad *q, lp_train_model *m, float *keep, lp_error *err) {
    const lp_train_config *c = &m->cfg;
    int gi = lp_train_group_index(LP_TRAIN_LORA);
    if (!q->profile || !m->group[gi]) return lp_fail(err, "no profile set, or the model has no LoRA");
    memcpy(keep, m->group[gi], m->group_size[gi] * sizeof(float));
    int qmax = (1 << q->profile->weight_bits) - 1;
    for (int l = 0; l < c->n_layers; l++)
        for (int p = 0; p < LP_PROJ_COUNT; p++) {
            int s = lp_llama_weight_id(l, (lp_proj)p);
            const lp_lpq_entry *e = q->enc[s];
            if (!e) continue;
            encode_fake(m->w.layers[l].lora_a[p], e->rank, e->in, e->a, e->na, qmax, false, q->qa[s]);
            encode_fake(m->w.layers[l].lora_b[p], e->out, e->rank, e->b, e->nb, qmax, true, q->qb[s]);
            lp_lora_static_sum_a(q->qa[s], false, (int)e->rank, (int)e->in, q->sum_a[s]);
        }
    return 0;
}

/* ---- the forward's hooks ------------------------------------------------------- */

/* As lp_quantize_act_ref: symmetric int8 per group of 32, scale amax/127,
 * round to nearest even; the values the integer kernels multiply. */
static void fake_q8_row(float *dst, const float *x, int n) {
    for (int g0 = 0; g0 < n; g0 += 32) {
        int g1 = g0 + 32 < n ? g0 + 32 : n;
        float amax = 0;
        for (int i = g0; i < g1; i++) amax = fmaxf(amax, fabsf(x[i]));
        float id = amax > 0 && isfinite(amax) ? 127.0f / amax : 0.0f, d = id > 0 ? amax / 127.0f : 0.0f;
        for (int i = g0; i < g1; i++) {
            float v = rintf(x[i] * id);
            v = v < -127 ? -127 : v > 127 ? 127 : v;
            dst[i] = d * v;
        }
    }
}

const float *lp_t_quad_base_input(lp_train_model *m, const float *x, int N, int in) {
    lp_train_quad *q = m->quad;
    if (!q->base_act_q8 || (size_t)N * (size_t)in > q->xq_floats) return NULL;
    for (int n = 0; n < N; n++) fake_q8_row(q->xq + (size_t)n * in, x + (size_t)n * in, in);
    return q->xq;
}

typedef struct branch_job {
    const lp_lora_static *L;
    const float *x;
    float *y, *t;
    int N;
    int32_t *scratch;
    int scratch_per_thread;
} branch_job;

static void branch_worker(void *ctx, int ti, int nt) {
    const branch_job *j = ctx;
    int64_t b, e;
    lp_split_range(j->N, ti, nt, 1, &b, &e);
    if (e <= b) return;
    lp_lora_static_rows(j->L, j->x + b * j->L->in, j->L->in, (int)(e - b), NULL, j->y + b * j->L->out,
                        j->L->out, j->t + b * j->L->rank, j->scratch + (size_t)ti * (size_t)j->scratch_per_thread);
}

bool lp_t_quad_branch(lp_train_model *m, int l, int p, float *y, const float *x, int N, float *t) {
    lp_train_quad *q = m->quad;
    int s = lp_llama_weight_id(l, (lp_proj)p);
    const lp_lpq_entry *e = q->profile ? q->enc[s] : NULL;
    if (!e) return false;
    const lp_train_config *c = &m->cfg;
    lp_lora_static L = {
        .qa = q->qa[s], .qb = q->qb[s], .sum_a = q->sum_a[s], .rank = (int)e->rank, .in = (int)e->in, .out = (int)e->out,
        .ea = e->a, .eb = e->b, .na = e->na, .nb = e->nb, .x = e->x, .t = e->t,
        .act_qmax = (1 << q->profile->act_bits) - 1, .scale = c->lora_alpha / (float)c->lora_rank,
    };
    branch_job job = {.L = &L, .x = x, .y = y, .t = t, .N = N, .scratch = q->scratch,
                      .scratch_per_thread = q->scratch_per_thread};
    lp_threadpool_run(m->pool, branch_worker, &job);
    return true;
}

void lp_t_quad_observe(lp_train_model *m, int l, int p, const float *x, const float *t, int N) {
    lp_train_quad *q = m->quad;
    if (!q->observe) return;
    const lp_train_config *c = &m->cfg;
    int s = lp_llama_weight_id(l, (lp_proj)p);
    size_t in = lp_t_lora_rows_in(c, p), nx = (size_t)N * in, nt = (size_t)N * (size_t)c->lora_rank;
    if (q->histogram) {
        double *h = q->hist + (size_t)s * 2 * LP_QUAD_HIST_BINS;
        count_into(h, x, nx, q->x_lo[s], q->x_hi[s]);
        count_into(h + LP_QUAD_HIST_BINS, t, nt, q->t_lo[s], q->t_hi[s]);
        return;
    }
    float lo = q->x_lo[s], hi = q->x_hi[s];
    for (size_t i = 0; i < nx; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    q->x_lo[s] = lo;
    q->x_hi[s] = hi;
    lo = q->t_lo[s];
    hi = q->t_hi[s];
    for (size_t i = 0; i < nt; i++) {
        lo = t[i] < lo ? t[i] : lo;
        hi = t[i] > hi ? t[i] : hi;
    }
    q->t_lo[s] = lo;
    q->t_hi[s] = hi;
}

/* ---- divergences ------------------------------------------------------------------ */

static void softmax_d(const float *z, int V, double *p) {
    float max = z[0];
    for (int v = 1; v < V; v++) max = z[v] > max ? z[v] : max;
    double sum = 0;
    for (int v = 0; v < V; v++) sum += p[v] = exp((double)z[v] - max);
    for (int v = 0; v < V; v++) p[v] /= sum;
}

double lp_quad_js(const float *za, const float *zb, int V, double *tmp) {
    double *p = tmp, *q = tmp + V, js = 0;
    softmax_d(za, V, p);
    softmax_d(zb, V, q);
    for (int v = 0; v < V; v++) {
        double mv = 0.5 * (p[v] + q[v]);
        if (p[v] > 0) js += 0.5 * p[v] * log(p[v] / mv);
        if (q[v] > 0) js += 0.5 * q[v] * log(q[v] / mv);
    }
    return js > 0 ? js : 0.0; /* in nats, 0..ln 2 */
}

int lp_quad_qss(lp_train_model *m, const lp_train_batch *b, const lp_lpq *profile, double *qss,
                lp_error *err) {
    int V = m->cfg.n_vocab, N = b->B * b->T;
    float *ref = lp_alloc((size_t)N * (size_t)V * sizeof(float));
    double *tmp = malloc(2 * (size_t)V * sizeof(double));
    float *keep = lp_alloc(m->group_size[lp_train_group_index(LP_TRAIN_LORA)] * sizeof(float) + 1);
    lp_train_quad *saved = m->quad;
    int rc = (!ref || !tmp || !keep) ? lp_error_set(err, LP_ERR_NOMEM, "out of memory") : 0;
    m->quad = NULL;
    if (rc == 0 && isnan(lp_train_forward(m, b, err))) rc = -1;
    if (rc == 0) memcpy(ref, m->acts->logits, (size_t)N * (size_t)V * sizeof(float));
    lp_train_quad *q = rc == 0 && profile ? lp_train_quad_create(m, err) : NULL;
    if (rc == 0 && profile && (!q || lp_train_quad_set_profile(q, m, profile, err) || lp_train_quad_begin(q, m, keep, err)))
        rc = -1;
    bool began = rc == 0 && profile;
    m->quad = q;
    if (rc == 0 && isnan(lp_train_forward(m, b, err))) rc = -1;
    if (began) lp_train_restore_lora(m, keep);
    m->quad = saved;
    double total = 0, weight = 0;
    for (int n = 0; rc == 0 && n < N; n++) {
        float w = b->mask ? b->mask[n] : 1.0f;
        if (w == 0) continue;
        total += w * lp_quad_js(ref + (size_t)n * V, m->acts->logits + (size_t)n * V, V, tmp);
        weight += w;
    }
    *qss = weight > 0 ? total / weight : 0.0;
    lp_train_quad_free(q);
    lp_free(ref);
    lp_free(keep);
    free(tmp);
    return rc;
}
