/* The one forward pass: a batch of rows goes through the model's layers
 * together. Every matrix multiply sees all rows at once (so prefill reuses
 * each weight row across tokens), and attention lets each row see its
 * sequence's committed KV plus its chain of parent rows in the batch.
 * Prefill, decode of many sequences and speculative trees are all just
 * batches; the architecture's graph (src/arch/) supplies the layers. */
#include "context.h"

#include <string.h>

#define MAX_POSITION (1 << 24)

/* The elementwise work between the matmuls (norms, rope, SwiGLU, residual
 * adds) runs one row at a time. Cheap per row, but over a batch it adds up,
 * and on one thread it leaves the others waiting: batches of
 * ROWS_PARALLEL_MIN rows or more split it across the pool (docs/benchmarks.md
 * has the measurement). Every row gets the same operations whichever thread
 * runs it. */
#define ROWS_PARALLEL_MIN 4

typedef struct rows_job {
    const lp_context *ctx;
    void (*fn)(void *arg, int row);
    void *arg;
} rows_job;

static void rows_worker(void *arg, int thread, int n_threads) {
    const rows_job *j = arg;
    int64_t begin, end;
    lp_split_range(j->ctx->n_rows, thread, n_threads, 1, &begin, &end);
    for (int64_t r = begin; r < end; r++) j->fn(j->arg, (int)r);
}

void lp_run_rows(lp_context *ctx, void (*fn)(void *arg, int row), void *arg) {
    rows_job j = {.ctx = ctx, .fn = fn, .arg = arg};
    lp_threadpool_run(ctx->n_rows >= ROWS_PARALLEL_MIN ? ctx->pool : NULL, rows_worker, &j);
}

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
        double visible = (double)ctx->seqs[rows[r].seq].length + ctx->chain_len[r] +
                         (rows[r].embd > 0 ? ctx->embd_prefix_n[rows[r].embd] : 0);
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
    ctx->graph->begin(ctx);
    lp_group_rows_by_adapter(ctx);
    for (int l = 0; l < hp->n_layers; l++) {
        if (ctx->abort_fn && ctx->abort_fn(ctx->abort_user)) {
            for (int r = n_rows - 1; r >= 0; r--)
                if (rows[r].commit) lp_kv_unreserve_row(ctx, r);
            ctx->n_rows = 0; /* no logits, nothing to commit */
            return lp_error_set(err, LP_ERR_CANCELLED, "forward abandoned by the abort hook before layer %d", l);
        }
        ctx->graph->layer(ctx, l);
    }

    int n_logits = 0;
    for (int r = 0; r < n_rows; r++) {
        ctx->logit_slot[r] = rows[r].logits ? n_logits : -1;
        if (rows[r].logits) ctx->logit_rows[n_logits++] = r;
    }
    if (n_logits > 0) ctx->graph->logits(ctx, ctx->logit_rows, n_logits);

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
