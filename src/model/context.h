/* A context: the frozen plan (scratch buffers sized once from max_rows,
 * max_sequences and the KV budget), the paged KV cache, and the worker
 * threads. lp_forward runs a batch of rows through it without allocating. */
#ifndef LP_CONTEXT_H
#define LP_CONTEXT_H

#include "adapter.h"
#include "model.h"

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
} lp_slot;

struct lp_context {
    const lp_model *model;
    lp_kernels kern;
    lp_threadpool *pool;
    lp_context_params params;
    int max_blocks_per_seq;

    lp_kv_cache kv;
    lp_seq *seqs;

    /* the plan: scratch buffers, sized for max_rows rows */
    float *x;          /* [rows][dim] residual stream */
    float *xn;         /* [rows][max(dim, q_dim)] normalised input / attention output */
    float *q;          /* [rows][q_dim] */
    float *qkv;        /* [rows][q_dim + 2 kv_dim] output of a fused q|k|v matmul (or NULL) */
    float *q_rows;       /* this layer's queries: ctx->q or inside qkv ... */
    int64_t q_stride;    /* ... with this row stride */
    float *k_new;      /* [layers][rows][kv_dim] this batch's keys (roped) */
    float *k_new_t;    /* [kv_heads][head_dim][rows] this layer's k_new transposed, for
                        * attention over runs of rows (batch_has_runs) */
    bool batch_has_runs; /* some row's parent is the row before it */
    int *chain_len;    /* [rows] rows in a row's chain of parents, itself included */
    int *run_len;      /* [rows] consecutive rows ending at a row, each the parent of the next */
    float *v_new;      /* [layers][rows][kv_dim] */
    float *gate, *up;  /* [rows][ffn_dim]; fused gate|up: gate is [rows][2 ffn_dim] */
    float *rope_cos, *rope_sin; /* [rows][head_dim/2] */
    float *scores;     /* [threads][max_seq_len + max_rows] */
    float *logit_in;   /* [logit_rows][dim] */
    float *logits;     /* [logit_rows][n_vocab] */
    int *logit_slot;   /* [rows] index into logits or -1 */
    lp_row *rows;      /* [rows] copy of the last batch */
    int n_rows;
    int *commit_count; /* [max_sequences] scratch for capacity checks */
    int *commit_block, *commit_slot; /* [rows] where a committed row's entry goes */
    uint64_t *row_tag; /* [rows] identity of the adapter each row was computed with,
                        * taken at forward time (a slot rebound before a later
                        * lp_commit_rows must not relabel the row's KV) */
    double *attn_cost; /* [rows] running sum of the rows' attention work (visible
                        * entries), for splitting attention evenly across threads */

    /* embedding tables: slots 1..max_embd_tables, [n][dim] floats each */
    const float **embd;
    int *embd_rows;

    bool adapters_onehot; /* the bench's frozen-graph baseline (lp_context_set_onehot) */
    bool (*abort_fn)(void *user); /* checked between layers */
    void *abort_user;

    /* adapters: slots 1..max_adapters, and the per-forward grouping of rows */
    lp_slot *slots;       /* [max_adapters + 1]; slot 0 = base */
    int *group_rows;      /* [rows] row indices ordered by slot */
    int *group_start;     /* [max_adapters + 2] offsets into group_rows */
    bool any_adapter;     /* some row of this batch uses an adapter */
    float *lora_x;        /* [rows][max in] gathered inputs of one group */
    float *lora_t;        /* shrunk activations of the pieces of one flush */
    float *lora_y;        /* expanded outputs of the pieces of one flush */
    size_t lora_t_cap, lora_y_cap; /* floats in lora_t, lora_y */
    struct lora_batch *lora_batch; /* the pending LoRA pieces (forward.c) */
    int max_rank;         /* planned rank limit */
};

/* Benchmark baseline only, not in the public API: compute EVERY bound
 * adapter for every row and mask by a one-hot selection, as a graph with
 * all adapters compiled in does. */
void lp_context_set_onehot(lp_context *ctx, bool on);

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
