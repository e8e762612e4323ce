/* A context: the frozen plan (scratch buffers sized once from max_rows,
 * max_sequences and the KV budget), the paged KV cache, and the worker
 * threads. lp_forward runs a batch of rows through it without allocating. */
#ifndef LP_CONTEXT_H
#define LP_CONTEXT_H

#include "../model/adapter.h"
#include "../model/model.h"

/* KV entries live in fixed-size blocks shared by reference count, as f16
 * (default) or f32 elements; see kv.c for the layout. */
typedef struct lp_kv_cache {
    int block_tokens;
    int n_blocks;
    int n_layers, n_kv_heads, head_dim;
    bool f16;              /* elements are f16 (else f32) */
    size_t elem_bytes;     /* 2 or 4 */
    size_t block_elems;    /* elements per block for K (same for V) */
    uint8_t *k, *v;
    int *refcount;         /* per block; 0 = free */
    int *free_list;        /* stack of free block ids */
    int n_free;
} lp_kv_cache;

typedef struct lp_seq {
    int length;            /* committed entries */
    int *blocks;           /* max_blocks_per_seq block ids */
    int32_t *tokens;       /* [max_seq_len] token of each entry */
    uint64_t *tags;        /* [max_seq_len] adapter tag of each entry (0 = base) */
} lp_seq;

/* An adapter bound to a slot; tag identifies its content so KV entries made
 * with it can be recognised later (prefix reuse). */
typedef struct lp_slot {
    const lp_adapter *adapter;
    uint64_t tag;
    const lp_forecast *forecast; /* lp_context_bind_forecast (the runtime only keeps it) */
} lp_slot;

/* The plan: every scratch buffer of a context is a named, shaped view into
 * one arena, laid out once at lp_context_create (the frozen graph) and
 * freed with it. Views are 64-byte aligned and not zero-filled unless
 * asked (a mobile OS then maps only the pages a batch touches). */
#define LP_PLAN_VIEWS_MAX 64
typedef struct lp_plan_view {
    const char *name;
    void *ptr;             /* the address of the pointer that receives the view */
    size_t rows, cols, elem;
    size_t offset;         /* into the arena */
    bool zeroed;
} lp_plan_view;

typedef struct lp_plan {
    lp_plan_view views[LP_PLAN_VIEWS_MAX];
    int n;
    size_t bytes;
    bool overflow;         /* a size overflowed or there were too many views */
    uint8_t *arena;
} lp_plan;

/* Adds a view of rows x cols elements of elem bytes; `ptr` is the address of
 * the pointer to set (e.g. &ctx->x) when the plan is laid out. */
void lp_plan_add(lp_plan *p, const char *name, void *ptr, size_t rows, size_t cols, size_t elem);
void lp_plan_add_zeroed(lp_plan *p, const char *name, void *ptr, size_t rows, size_t cols, size_t elem);

/* What an architecture gives the runtime (src/arch/): the runtime validates
 * the batch, fills the residual stream with each row's input embedding,
 * calls layer() for every layer, then logits() for the rows that want
 * them, and commits KV. The graph builds its layers from lp_linear,
 * lp_attention and its own elementwise steps. */
typedef struct lp_graph {
    /* Adds the graph's buffers to the plan (ctx->params are final) and may
     * set ctx->graph_state (freed with free(), no buffers in it). */
    int (*plan)(lp_context *ctx, lp_plan *plan, lp_error *err);
    /* Per-batch tables (rope angles of the rows' positions), once before
     * the layers. */
    void (*begin)(lp_context *ctx);
    /* Layer l over the batch: reads and updates ctx->x. */
    void (*layer)(lp_context *ctx, int l);
    /* Final norm and output head for rows[0..n) of the batch: logits row i
     * of ctx->logits belongs to batch row rows[i]. */
    void (*logits)(lp_context *ctx, const int *rows, int n);
} lp_graph;

struct lp_context {
    const lp_model *model;
    const lp_graph *graph;
    void *graph_state;     /* the graph's own views (plan) */
    lp_kernels kern;
    lp_threadpool *pool;
    lp_context_params params;
    int max_blocks_per_seq;
    lp_plan plan;

    lp_kv_cache kv;
    lp_seq *seqs;          /* [max_sequences] */
    int *seq_blocks;       /* [max_sequences][max_blocks_per_seq] block ids */
    int32_t *seq_tokens;   /* [max_sequences][max_seq_len] */
    uint64_t *seq_tags;    /* [max_sequences][max_seq_len] */

    /* the batch: copies, and what lp_forward derives from it once */
    lp_row *rows;      /* [rows] copy of the last batch */
    int n_rows;
    float *x;          /* [rows][dim] residual stream */
    int *chain_len;    /* [rows] rows in a row's chain of parents, itself included */
    int *run_len;      /* [rows] consecutive rows ending at a row, each the parent of the next */
    bool batch_has_runs; /* some row's parent is the row before it */
    uint64_t *row_tag; /* [rows] identity of the adapter each row was computed with,
                        * taken at forward time (a slot rebound before a later
                        * lp_commit_rows must not relabel the row's KV) */
    double *attn_cost; /* [rows] running sum of the rows' attention work (visible
                        * entries), for splitting attention evenly across threads */
    int *commit_count; /* [max_sequences] scratch for capacity checks */
    int *commit_block, *commit_slot; /* [rows] where a committed row's entry goes */

    /* attention: the batch's own keys and values, and scores */
    float *k_new;      /* [layers][rows][kv_dim] this batch's keys (roped) */
    float *v_new;      /* [layers][rows][kv_dim] */
    float *k_new_t;    /* [kv_heads][head_dim][rows] this layer's k_new transposed, for
                        * attention over runs of rows (batch_has_runs) */
    float *scores;     /* [threads][score_len]: (KV prefix + max_seq_len + max_rows) x heads per KV head */
    size_t score_len;
    int *run_last;     /* [threads][rows] last row of each run of a row's chain */

    /* output */
    float *logit_in;   /* [logit_rows][dim] */
    float *logits;     /* [logit_rows][n_vocab] */
    int *logit_slot;   /* [rows] index into logits or -1 */
    int *logit_rows;   /* [logit_rows] batch row of each logits row */

    /* embedding tables: slots 1..max_embd_tables, [n][dim] floats each */
    const float **embd;
    int *embd_rows;
    const float **embd_prefix; /* [max_embd_tables + 1] its rows' KV prefix,
                                  [layers][2][n][kv_dim] (lp_context_bind_kv_prefix) */
    int *embd_prefix_n;

    bool (*abort_fn)(void *user); /* checked between layers */
    void *abort_user;

    /* adapters: slots 1..max_adapters, and the per-forward grouping of rows */
    lp_slot *slots;       /* [max_adapters + 1]; slot 0 = base */
    const struct lp_profile *profile; /* bound shared quantization profile or NULL */
    int32_t *profile_scratch;         /* [threads][profile->scratch_ints] for its LoRA kernel */
    uint8_t *lora_qt;     /* [lora_t_cap] shrink codes of the static pieces of one flush */
    int *group_rows;      /* [rows] row indices ordered by slot */
    int *group_start;     /* [max_adapters + 2] offsets into group_rows */
    bool any_adapter;     /* some row of this batch uses an adapter */
    float *lora_x;        /* [rows][widest input] gathered inputs of one group */
    float *lora_t;        /* shrunk activations of the pieces of one flush */
    float *lora_y;        /* expanded outputs of the pieces of one flush */
    size_t lora_t_cap, lora_y_cap; /* floats in lora_t, lora_y */
    struct lora_batch *lora_batch; /* the pending LoRA pieces (linear.c) */
    int max_rank;         /* planned rank limit */
};

/* ---- the runtime's ops, for graphs ---- */

/* y = W x for the batch's rows, plus the LoRA term scale * B (A x) of every
 * adapter that a row group carries for weight id `weight` (the segmented
 * LoRA matmul: two pool passes however many adapters the batch mixes). */
void lp_linear(lp_context *ctx, int weight, const float *x, int64_t x_stride, float *y, int64_t y_stride);
/* Weights that share their input, in one pool pass (one activation
 * quantization). */
void lp_linear_multi(lp_context *ctx, int n, const int *weights, const float *x, int64_t x_stride,
                     float *const *ys, const int64_t *y_strides);
/* A fused matrix whose row blocks are weights[0..n) in order (q|k|v):
 * one matmul into y, each weight's LoRA added to its own columns. */
void lp_linear_fused(lp_context *ctx, const lp_weight *fused, int n, const int *weights,
                     const float *x, int64_t x_stride, float *y, int64_t y_stride);

/* Attention of layer l for the batch: queries q (row stride q_stride,
 * n_heads * head_dim wide, roped) over each row's committed KV and its
 * chain of parents in the batch (k_new / v_new of the layer, which the
 * graph filled through lp_attention_key_ready), into out (row stride
 * out_stride); committed rows' keys and values go into the cache. */
void lp_attention(lp_context *ctx, int l, const float *q, int64_t q_stride, float *out, int64_t out_stride);
/* Row r's key and value of layer l are final in k_new / v_new (roped,
 * normalised): rounds them to the cache's precision and keeps the
 * transposed copy that attention over runs of rows reads. */
void lp_attention_key_ready(lp_context *ctx, int l, int r);
/* This layer's slice of k_new / v_new: [rows][kv_dim]. */
float *lp_batch_keys(const lp_context *ctx, int l);
float *lp_batch_values(const lp_context *ctx, int l);

/* Orders the batch's rows by adapter slot (linear.c; lp_forward), and the
 * size of the pending-LoRA record the plan holds for it. */
void lp_group_rows_by_adapter(lp_context *ctx);
size_t lp_lora_batch_bytes(void);

/* Splits rows 0..n_rows of the batch across the pool for elementwise
 * steps when the batch is big enough to pay for the hand-off. */
void lp_run_rows(lp_context *ctx, void (*fn)(void *arg, int row), void *arg);

/* Attention work of the last batch split across n_threads: items i of
 * [*begin, *end) are (KV head i / n_rows, row i % n_rows), chosen so each
 * thread's rows see about the same number of entries (forward.c). */
void lp_attention_share(const lp_context *ctx, int thread, int n_threads, int64_t *begin,
                        int64_t *end);
/* Whether the last batch's attention is worth waking the pool for. */
bool lp_attention_parallel(const lp_context *ctx);

/* KV helpers shared by forward and the sequence API (kv.c). A block's keys
 * of one layer and head are transposed, [head_dim][block_tokens]; its
 * values are rows, [block_tokens][head_dim]. */
void *lp_kv_keys(const lp_kv_cache *kv, int block, int layer, int head);
void *lp_kv_value(const lp_kv_cache *kv, int block, int layer, int head, int token);
/* Blocks a sequence needs to grow by n entries (counting a copy-on-write of a
 * shared partial last block). */
int lp_kv_blocks_needed(const lp_context *ctx, int seq, int n);
/* Appends row r of the last forward to its sequence (capacity checked by
 * the caller): the three steps below at once. */
void lp_kv_append_row(lp_context *ctx, int r);
/* Makes room for row r's entry at position pos of its sequence (a new
 * block, or a private copy of a shared partial one) and records where it
 * goes in commit_block / commit_slot; invisible until lp_kv_finish_row. */
void lp_kv_reserve_row(lp_context *ctx, int r, int pos);
/* Row r's key and value of one layer and KV head into its reserved place. */
void lp_kv_store_row(const lp_context *ctx, int r, int layer, int head);
/* Counts row r's reserved entry into its sequence (after its stores). */
void lp_kv_finish_row(lp_context *ctx, int r);
/* Gives back what lp_kv_reserve_row took for row r when the pass is
 * abandoned before lp_kv_finish_row. */
void lp_kv_unreserve_row(lp_context *ctx, int r);

#endif
