/* The linear op: the base matmul of a weight (integer or float kernels)
 * plus the LoRA terms of the adapters the batch's rows carry, for any
 * weight the model declares adaptable (lp_model.weights). Rows are grouped
 * by adapter slot once per forward, so each adapter runs one shrink and one
 * expand over all of its rows, for all weights that share an input. */
#include "context.h"

#include <string.h>

#include "../kernels/lora_static.h"
#include "../model/profile.h"

/* weights one lp_linear_multi / lp_linear_fused call may take */
#define LP_LINEAR_MULTI_MAX 8

/* One adapter group's share of a projection: its rows' shrunk activations
 * (t, kr wide) and expanded outputs (y, out wide) in the LoRA buffers. */
typedef struct lora_piece {
    const lp_lora_pair *pair;
    const int *rows;      /* batch row of each group row */
    int n;
    float *t, *y, *dst;   /* dst: the projection's output rows */
    int64_t kr, out, dst_stride;
} lora_piece;

/* One adapter group's share of a projection under the bound shared
 * profile: the static integer branch over its rows (x row i at x + i *
 * x_stride, added into dst row rows[i]), their shrink codes in ct. */
typedef struct static_piece {
    lp_lora_static L;
    const int *rows;
    int n;
    const float *x;
    float *dst;
    int64_t x_stride, dst_stride;
    uint8_t *ct;          /* [n][rank] */
} static_piece;

/* The LoRA work collected so far: shrink tasks (x A^T -> t), expand tasks
 * (t B^T -> y), one piece per (group, projection); and the pieces of
 * adapters under the shared profile. */
typedef struct lora_batch {
    int n, n_static;
    size_t t_used, y_used, qt_used;
    lora_piece piece[LP_MATMUL_TASKS_MAX];
    lp_matmul_task shrink[LP_MATMUL_TASKS_MAX], expand[LP_MATMUL_TASKS_MAX];
    static_piece sp[LP_MATMUL_TASKS_MAX];
} lora_batch;

size_t lp_lora_batch_bytes(void) { return sizeof(lora_batch); }

/* Orders the batch's rows by adapter slot (a counting sort), so each adapter
 * does one shrink and one expand over all of its rows. */
void lp_group_rows_by_adapter(lp_context *ctx) {
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

/* Runs the collected pieces: every shrink in one pool pass, the scales,
 * every expand in one pass, then y rows added to the weights' outputs. */
static void lora_flush(lp_context *ctx, lora_batch *b) {
    if (b->n == 0) return;
    lp_matmul_tasks(&ctx->kern, ctx->pool, b->n, b->shrink);
    for (int i = 0; i < b->n; i++) {
        const lora_piece *p = &b->piece[i];
        int64_t rank = p->pair->A.rows;
        for (int r = 0; r < p->n; r++) {
            float scale = p->pair->scale;
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
            ctx->kern.axpy_f32(p->dst + p->rows[r] * p->dst_stride, 1.0f, p->y + r * p->out, p->out);
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

/* ---- adapters under the shared profile: the static integer branch, split over the threads ---- */

typedef struct static_job {
    lp_context *ctx;
    const static_piece *sp;
    int n;
    bool expand;          /* the pass: shrinks (units: rows x rank) or expands (rows x out) */
    int64_t units;        /* over all pieces */
} static_job;

/* The piece and row holding unit u of the pass's flattened (piece, row,
 * width) range: *piece, *row, *at (the offset within the row); returns the
 * row's end unit, or -1 past the last piece. */
static int64_t locate(const static_job *j, int64_t u, int *piece, int *row, int *at) {
    int64_t base = 0;
    for (int p = 0; p < j->n; p++) {
        int64_t w = j->expand ? j->sp[p].L.out : j->sp[p].L.rank, size = (int64_t)j->sp[p].n * w;
        if (u < base + size) {
            *piece = p;
            *row = (int)((u - base) / w);
            *at = (int)((u - base) % w);
            return base + (*row + 1) * w;
        }
        base += size;
    }
    return -1;
}

/* One thread's share of a pass: for the shrink, its rows' input codes then
 * their rank rows' codes; for the expand, its rows' outputs. The weights
 * that share an input (q, k, v; gate, up) usually share its encoding too,
 * so a thread quantizes such a row once for all of them. */
static void static_pass(void *arg, int ti, int nt) {
    const static_job *j = arg;
    const lp_lora_static_ops *ops = j->ctx->kern.lora_static;
    int32_t *scratch = j->ctx->profile_scratch + (size_t)ti * (size_t)j->ctx->profile->scratch_ints;
    int64_t u, e;
    lp_split_range(j->units, ti, nt, j->expand ? 64 : 1, &u, &e);
    uint8_t *cx = (uint8_t *)scratch;
    const float *coded = NULL; /* the row cx holds the codes of, under coded_enc */
    lp_qenc coded_enc = {0};
    int64_t sum_cx = 0;
    while (u < e) {
        int p = 0, i = 0, at = 0;
        int64_t end = locate(j, u, &p, &i, &at);
        if (end < 0) return; /* not reached: units is the pieces' total */
        int len = (int)((end < e ? end : e) - u);
        const static_piece *s = &j->sp[p];
        uint8_t *ct = s->ct + (int64_t)i * s->L.rank;
        if (j->expand) {
            ops->expand(&s->L, ct, at, at + len, s->dst + s->rows[i] * s->dst_stride);
        } else {
            const float *x = s->x + i * s->x_stride;
            if (x != coded || s->L.x.scale != coded_enc.scale || s->L.x.zero != coded_enc.zero) {
                sum_cx = ops->quantize(&s->L, x, cx);
                coded = x;
                coded_enc = s->L.x;
            }
            ops->shrink(&s->L, cx, sum_cx, at, at + len, ct);
        }
        u += len;
    }
}

/* Runs the collected static pieces: all shrinks in one pool pass, all
 * expands (adding into the projections' rows) in another. */
static void static_flush(lp_context *ctx, lora_batch *b) {
    if (b->n_static == 0) return;
    static_job j = {.ctx = ctx, .sp = b->sp, .n = b->n_static};
    for (int pass = 0; pass < 2; pass++) {
        j.expand = pass == 1;
        j.units = 0;
        for (int p = 0; p < b->n_static; p++)
            j.units += (int64_t)b->sp[p].n * (j.expand ? b->sp[p].L.out : b->sp[p].L.rank);
        lp_threadpool_run(ctx->pool, static_pass, &j);
    }
    b->n_static = 0;
    b->qt_used = 0;
}

/* Queues a pair of an adapter under the bound shared profile for its rows. */
static void add_static(lp_context *ctx, lora_batch *b, const lp_lora_pair *pair, const int *rows, int n,
                       const float *xs, int64_t xs_stride, float *dst, int64_t dst_stride) {
    const lp_profile *pf = ctx->profile;
    const lp_lpq_entry *e = pf->by_weight[pair->weight];
    size_t need = (size_t)n * (size_t)pair->rank;
    if (b->n_static == LP_MATMUL_TASKS_MAX || b->qt_used + need > ctx->lora_t_cap) static_flush(ctx, b);
    b->sp[b->n_static++] = (static_piece){
        .L = {.qa = pair->A.data, .qb = pair->B.data, .packed = pair->codes_packed, .sum_a = pair->sum_a, .rank = pair->rank, .in = (int)e->in, .out = (int)e->out,
              .ea = e->a, .eb = e->b, .na = e->na, .nb = e->nb, .x = e->x, .t = e->t,
              .act_qmax = (1 << pf->q.act_bits) - 1, .scale = pair->scale},
        .rows = rows, .n = n, .x = xs, .x_stride = xs_stride, .dst = dst, .dst_stride = dst_stride,
        .ct = ctx->lora_qt + b->qt_used,
    };
    b->qt_used += need;
}

/* y_i[r] += scale * B_i (A_i x[r]) for the weights i that share the input
 * x, for the rows of every adapter group with a pair there. */
static void apply_lora(lp_context *ctx, int n_weights, const int *weights, const float *x, int64_t x_stride,
                       float *const *ys, const int64_t *y_strides) {
    if (!ctx->any_adapter) return;
    lora_batch *b = ctx->lora_batch;
    b->n = b->n_static = 0;
    b->t_used = b->y_used = b->qt_used = 0;
    for (int s = 1; s <= ctx->params.max_adapters; s++) {
        int n = ctx->group_start[s + 1] - ctx->group_start[s];
        const int *rows = ctx->group_rows + ctx->group_start[s];
        if (n == 0 || !ctx->slots[s].adapter) continue;
        const float *xs = NULL;
        int64_t xs_stride = x_stride;
        for (int i = 0; i < n_weights; i++) {
            const lp_lora_pair *pair = lp_adapter_pair(ctx->slots[s].adapter, weights[i]);
            if (!pair) continue;
            if (!xs) xs = group_input(ctx, s, x, x_stride, pair->A.cols, &xs_stride);
            if (ctx->slots[s].adapter->profile_id) { /* checked against ctx->profile at binding */
                add_static(ctx, b, pair, rows, n, xs, xs_stride, ys[i], y_strides[i]);
                continue;
            }
            int64_t kr = pair->B.cols, out = pair->B.rows;
            size_t need_t = (size_t)n * (size_t)kr, need_y = (size_t)n * (size_t)out;
            if (b->n == LP_MATMUL_TASKS_MAX || b->t_used + need_t > ctx->lora_t_cap ||
                b->y_used + need_y > ctx->lora_y_cap)
                lora_flush(ctx, b);
            lora_piece *p = &b->piece[b->n];
            *p = (lora_piece){.pair = pair, .rows = rows, .n = n, .t = ctx->lora_t + b->t_used,
                              .y = ctx->lora_y + b->y_used, .dst = ys[i], .kr = kr, .out = out,
                              .dst_stride = y_strides[i]};
            b->shrink[b->n] = (lp_matmul_task){&pair->A, xs, xs_stride, n, p->t, kr};
            b->expand[b->n] = (lp_matmul_task){&pair->B, p->t, kr, n, p->y, out};
            b->n++;
            b->t_used += need_t;
            b->y_used += need_y;
        }
    }
    lora_flush(ctx, b);
    static_flush(ctx, b);
}

/* ---- the linear op ------------------------------------------------------------------------------- */

void lp_linear(lp_context *ctx, int weight, const float *x, int64_t x_stride, float *y, int64_t y_stride) {
    lp_matmul(&ctx->kern, ctx->pool, ctx->model->weights[weight].w, x, x_stride, ctx->n_rows, y, y_stride);
    apply_lora(ctx, 1, &weight, x, x_stride, &y, &y_stride);
}

void lp_linear_multi(lp_context *ctx, int n, const int *weights, const float *x, int64_t x_stride,
                     float *const *ys, const int64_t *y_strides) {
    const lp_weight *ws[LP_LINEAR_MULTI_MAX];
    for (int i = 0; i < n; i++) ws[i] = ctx->model->weights[weights[i]].w;
    lp_matmul_multi(&ctx->kern, ctx->pool, n, ws, x, x_stride, ctx->n_rows, ys, y_strides);
    apply_lora(ctx, n, weights, x, x_stride, ys, y_strides);
}

void lp_linear_fused(lp_context *ctx, const lp_weight *fused, int n, const int *weights,
                     const float *x, int64_t x_stride, float *y, int64_t y_stride) {
    lp_matmul(&ctx->kern, ctx->pool, fused, x, x_stride, ctx->n_rows, y, y_stride);
    float *ys[LP_LINEAR_MULTI_MAX];
    int64_t strides[LP_LINEAR_MULTI_MAX], col = 0;
    for (int i = 0; i < n; i++) {
        ys[i] = y + col;
        strides[i] = y_stride;
        col += ctx->model->weights[weights[i]].w->rows;
    }
    apply_lora(ctx, n, weights, x, x_stride, ys, strides);
}
