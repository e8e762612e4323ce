/* train: a small FP32 trainer for our Llama architecture, in the style of
 * llm.c: a forward pass that keeps the activations it needs, and an explicit
 * backward for every operation (embedding, RMSNorm, RoPE, attention with GQA
 * and causal or arbitrary visibility masks, SwiGLU, LoRA branches, tied or
 * untied output, masked cross-entropy). AdamW with warmup + cosine decay and
 * global gradient clipping; checkpoints; export to GGUF / PEFT.
 *
 * Conventions match the runtime exactly (GGUF "llama"): matrices row-major
 * [out][in], RoPE rotates adjacent pairs (2i, 2i+1) with inv_freq
 * theta^(-2i/d), q/k rows in GGUF (interleaved) order, RMSNorm
 * x / sqrt(mean(x^2) + eps) * w, attention scale 1/sqrt(head_dim).
 *
 * Parameters live in three contiguous groups, each trainable or frozen:
 *   base  - token embedding, per-layer norms and projections, output norm,
 *           output matrix (absent when tied);
 *   lora  - A [rank][in] and B [out][rank] per layer for each target
 *           projection (y = W x + alpha/rank * B (A x));
 *   extra - extra input embeddings [n_extra][dim]; input ids >= n_vocab pick
 *           these rows (forecast embeddings for self-speculative decoding).
 * A frozen group has no gradient or optimizer buffers and is never written.
 *
 * Everything is deterministic for a given seed, and independent of the
 * number of threads: work is split over output rows / (sequence, head)
 * pairs so every sum is computed in one fixed order. */
#ifndef LP_TRAIN_H
#define LP_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"
#include "../kernels/kernels.h"
#include "../arch/llama.h"     /* lp_proj */
#include "../model/adapter.h"
#include "../tokenizer/tokenizer.h"
#include "../formats/lpq.h"

/* ---- configuration -------------------------------------------------------- */

typedef struct lp_train_config {
    int n_vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, n_ctx;
    float rope_theta, rms_eps;
    bool tied_output;
    int n_extra;             /* extra input embeddings (0: none) */
    int lora_rank;           /* 0: no LoRA branches */
    float lora_alpha;
    uint32_t lora_targets;   /* bit (1 << lp_proj) per target projection */
} lp_train_config;

/* Which parameter groups get gradients and optimizer updates. */
enum { LP_TRAIN_BASE = 1, LP_TRAIN_LORA = 2, LP_TRAIN_EXTRA = 4 };

/* Validates a configuration (sizes positive, heads divide, head_dim even,
 * sizes not overflowing). */
int lp_train_config_check(const lp_train_config *c, lp_error *err);
/* "q,k,v,o,gate,up,down" -> bit mask; -1 on an unknown name. */
int lp_train_parse_targets(const char *list, uint32_t *out, lp_error *err);

/* ---- the model ------------------------------------------------------------ */

/* Pointers into one parameter (or gradient) buffer set. NULL where the group
 * is absent (e.g. gradients of a frozen group). */
typedef struct lp_tlayer {
    float *attn_norm, *wq, *wk, *wv, *wo;
    float *ffn_norm, *w_gate, *w_up, *w_down;
    float *lora_a[LP_PROJ_COUNT], *lora_b[LP_PROJ_COUNT]; /* NULL if not a target */
} lp_tlayer;

typedef struct lp_tweights {
    float *tok_embd;      /* [n_vocab][dim] */
    float *output_norm;   /* [dim] */
    float *output;        /* [n_vocab][dim]; == tok_embd when tied */
    float *extra;         /* [n_extra][dim] */
    lp_tlayer *layers;    /* [n_layers] */
} lp_tweights;

/* One named tensor of the parameter table (for the optimizer, checkpoints,
 * export and tests). */
typedef struct lp_tparam {
    char name[48];
    int group;            /* LP_TRAIN_BASE / _LORA / _EXTRA */
    size_t offset, size;  /* in floats, inside the group's buffer */
    int rows, cols;       /* cols = 1 for vectors */
    bool decay;           /* AdamW weight decay applies (matrices only) */
} lp_tparam;

/* Saved activations for up to max_tokens = B*T positions. */
typedef struct lp_tacts lp_tacts;

typedef struct lp_train_model {
    lp_train_config cfg;
    int trainable;                    /* LP_TRAIN_* bits */
    float *group[3];                  /* base, lora, extra parameters */
    float *grad[3];                   /* NULL when frozen or absent */
    size_t group_size[3];             /* floats */
    lp_tweights w, g;                 /* views of group[] and grad[] */
    lp_tparam *params;
    int n_params;
    float *rope_inv_freq;             /* [head_dim/2] */
    lp_tacts *acts;
    lp_threadpool *pool;              /* not owned; may be NULL */
    lp_kernels kern;
    /* Matrix kernels: 0 plain C, 1 AVX2+FMA, 2 AVX-512. Set to the best the
     * CPU runs (LORAPLEX_TRAIN_GEMM=0|1|2 caps it); results are bitwise
     * reproducible for a given level, whatever the thread count. */
    int gemm_level;
    /* QUAD hooks (src/train/quad.c; owned by the caller, NULL: none): the
     * LoRA branch as the shared-profile kernels run it, range observation,
     * and the base's inputs quantized as the W4A8 kernels quantize them. */
    struct lp_train_quad *quad;
} lp_train_model;

/* Group index of an LP_TRAIN_* bit. */
int lp_train_group_index(int group_bit);

/* Allocates a model with zeroed parameters. trainable: LP_TRAIN_* bits
 * (groups that don't exist, e.g. LORA with rank 0, are ignored). */
lp_train_model *lp_train_model_create(const lp_train_config *cfg, int trainable,
                                      lp_error *err);
void lp_train_model_free(lp_train_model *m);
/* Random initialisation from a seed: embeddings N(0, 0.02), projections
 * N(0, 1/fan_in) with the residual outputs (wo, w_down) scaled by
 * 1/sqrt(2*n_layers), norms 1, LoRA A U(-1/sqrt(in), 1/sqrt(in)) and B 0
 * (PEFT's init: training starts at the base), extra rows N(0, 0.02). Only
 * the groups in `which` are touched. */
void lp_train_model_init(lp_train_model *m, int which, uint64_t seed);
/* Copies the base weights of a loaded runtime model (GGUF "llama" only;
 * any weight type, dequantized to FP32). cfg's model shape is taken from it. */
struct lp_model;
int lp_train_config_from_model(const struct lp_model *base, lp_train_config *cfg,
                               lp_error *err);
int lp_train_model_load_base(lp_train_model *m, const struct lp_model *base,
                             lp_error *err);
/* Sizes the activation buffers for batches of up to max_tokens positions
 * and sequences of up to max_seq. */
int lp_train_model_reserve(lp_train_model *m, int max_batch, int max_seq, lp_error *err);
/* Threads for the matmuls and attention (pool may be NULL; not owned). */
void lp_train_model_set_pool(lp_train_model *m, lp_threadpool *pool);

/* ---- batches, forward, backward ------------------------------------------- */

typedef struct lp_train_batch {
    int B, T;
    const int32_t *inputs;   /* [B*T]; ids >= n_vocab are extra rows */
    const int32_t *targets;  /* [B*T]; ignored where mask is 0 */
    const float *mask;       /* [B*T] loss weight (0 or 1); NULL: all 1 */
    const int32_t *pos;      /* [B*T] RoPE positions; NULL: 0..T-1 */
    const uint8_t *visible;  /* [B][T][T]: position i attends to j iff
                                visible[i*T+j]; NULL: causal (j <= i) */
    /* Distillation (QUAD fit): teacher next-token probabilities [B*T][n_vocab]
     * and the loss (1 - kd_weight) CE + kd_weight KL(teacher || model) per
     * masked position. NULL / 0: cross-entropy alone. */
    const float *teacher;
    float kd_weight;
} lp_train_batch;

/* Forward pass: returns the mean masked cross-entropy (0 if the mask is all
 * zero) and keeps the activations for lp_train_backward. Returns NAN with
 * err set on a bad batch (ids out of range, batch too big). */
double lp_train_forward(lp_train_model *m, const lp_train_batch *b, lp_error *err);
/* Logits of position i of the last forward: n_vocab floats. */
const float *lp_train_logits(const lp_train_model *m, int i);
/* Layer l's roped keys (values: its values) of the last forward, [B*T][kv_dim]. */
const float *lp_train_layer_kv(const lp_train_model *m, int l, bool values);
/* Mean KL(teacher || model) over the masked positions of the last forward
 * (0 without a teacher). */
double lp_train_last_kl(const lp_train_model *m);
/* Accumulates gradients of the last forward's loss into the trainable
 * groups' gradient buffers (call lp_train_zero_grad first). */
void lp_train_backward(lp_train_model *m, const lp_train_batch *b);
void lp_train_zero_grad(lp_train_model *m);

/* ---- quantization-aware LoRA fine-tuning (qat.c) --------------------------- */

/* Sets cfg's LoRA rank, alpha and targets from an adapter loaded for the
 * same base (one rank and scale throughout, the same projections in every
 * layer), and copies its A and B into a model made from that config. */
int lp_train_config_from_adapter(const lp_adapter *a, lp_train_config *cfg, lp_error *err);
int lp_train_lora_from_adapter(lp_train_model *m, const lp_adapter *a, lp_error *err);
/* Saves the LoRA group into keep (group_size floats) and replaces it with
 * the values an .lpa of `type` (LP_W4 / LP_W8) would hold; restore puts the
 * saved weights back. Between the two, a forward and backward pass take the
 * gradient at the rounded point (straight-through). */
int lp_train_fake_quantize_lora(lp_train_model *m, uint32_t type, float *keep, lp_error *err);
void lp_train_restore_lora(lp_train_model *m, const float *keep);

/* ---- QUAD: shared-profile students (quad.c, docs/quad.md) ----------------- */

/* Hooks for one model (after lp_train_model_reserve and set_pool); set
 * m->quad to use them. With a profile set, between lp_train_quad_begin and
 * lp_train_restore_lora the LoRA branch runs as the shared-profile kernels
 * run it (lp_lora_static_rows on the codes of the weights at begin; the
 * weights hold the values of those codes, so the backward's gradient is
 * taken there and passes straight through the rounding). */
typedef struct lp_train_quad lp_train_quad;
lp_train_quad *lp_train_quad_create(const lp_train_model *m, lp_error *err);
void lp_train_quad_free(lp_train_quad *q);
/* NULL profile: the float branch. The profile must outlive q. */
int lp_train_quad_set_profile(lp_train_quad *q, const lp_train_model *m, const lp_lpq *profile,
                              lp_error *err);
/* Saves the LoRA group into keep (group_size floats) and replaces it with
 * its values under the profile, taking their codes. */
int lp_train_quad_begin(lp_train_quad *q, lp_train_model *m, float *keep, lp_error *err);
/* The base matmuls' inputs (and the classifier's) as the W4A8 kernels see
 * them: int8 per group of 32, scale amax/127 (lp_quantize_act_ref). */
void lp_train_quad_base_act_q8(lp_train_quad *q, bool on);
/* Range observation of the float branch: the shrink's input x and output
 * t = x A^T per (layer, projection) slot lp_llama_weight_id. */
void lp_train_quad_observe(lp_train_quad *q, bool on);
void lp_train_quad_reset_ranges(lp_train_quad *q);
void lp_train_quad_ranges(const lp_train_quad *q, int slot, float *x_lo, float *x_hi, float *t_lo,
                          float *t_hi);
/* A second observing pass, over the same data: counts of x and t in
 * LP_QUAD_HIST_BINS equal bins spanning each slot's observed range (the
 * first pass's), for an encoding that weighs rounding against clipping.
 * lp_train_quad_hist: the slot's [2][LP_QUAD_HIST_BINS] counts (x, then t);
 * NULL before the histogram pass. */
#define LP_QUAD_HIST_BINS 512
int lp_train_quad_histogram(lp_train_quad *q, bool on, lp_error *err);
const double *lp_train_quad_hist(const lp_train_quad *q, int slot);
/* Jensen-Shannon divergence (nats) of the softmaxes of two logit rows;
 * tmp: 2 V doubles. */
double lp_quad_js(const float *za, const float *zb, int V, double *tmp);
/* The quantization sensitivity score of the model's LoRA under `profile`:
 * mean JS divergence between the FP32 forward's and the quantized forward's
 * next-token distributions over the batch's masked positions. NULL profile:
 * both forwards in FP32 (0). m->quad is left as it was. */
int lp_quad_qss(lp_train_model *m, const lp_train_batch *b, const lp_lpq *profile, double *qss,
                lp_error *err);

/* ---- optimizer ----------------------------------------------------------- */

typedef struct lp_adamw_config {
    float lr, min_lr;        /* peak and final learning rate */
    int warmup, total_steps; /* linear warmup, then cosine to min_lr */
    float beta1, beta2, eps;
    float weight_decay;      /* decoupled, on matrices only (see lp_tparam) */
    float grad_clip;         /* global L2 norm bound; 0 = off */
} lp_adamw_config;

lp_adamw_config lp_adamw_default(void);
/* Learning rate at 0-based step. */
float lp_train_lr(const lp_adamw_config *c, long step);

typedef struct lp_adamw {
    lp_adamw_config cfg;
    long step;               /* steps taken */
    float *m[3], *v[3];      /* per trainable group */
} lp_adamw;

int lp_adamw_init(lp_adamw *opt, const lp_train_model *model,
                  const lp_adamw_config *cfg, lp_error *err);
void lp_adamw_free(lp_adamw *opt);
/* One update from the gradients; returns the gradient norm before clipping. */
float lp_adamw_step(lp_adamw *opt, lp_train_model *model);

/* ---- data ------------------------------------------------------------------ */

/* One training example: tokens and which of them are predicted. */
typedef struct lp_train_example {
    int32_t *ids;            /* [n]: BOS prompt completion EOS */
    int n;
    int n_prompt;            /* ids[0..n_prompt) are prompt (not predicted) */
} lp_train_example;

typedef struct lp_train_data {
    lp_train_example *ex;    /* JSONL records */
    int n_ex;
    int32_t *stream;         /* plain text token stream */
    size_t n_stream;
    size_t n_docs;           /* documents in it (each BOS ... EOS) */
    size_t n_lines;          /* line breaks inside its documents, to spot a file meant as one
                                document per line (see lp_train_data_load_text) */
    /* text of records (for exact-match eval) is not kept */
} lp_train_data;

/* {"prompt": ..., "completion": ...} per line; prompt tokens = BOS +
 * encode(prompt), completion tokens = encode(completion) + EOS, encoded
 * separately. Blank lines are skipped; any other bad line is an error
 * naming file and line. */
int lp_train_data_load_jsonl(lp_train_data *d, const char *path,
                             const lp_tokenizer *tok, lp_error *err);
/* Plain text: documents separated by blank lines, each BOS + tokens + EOS,
 * concatenated into one stream. A file of one document per line is one
 * document here: EOS is then a target once, and a model never learns to
 * end a text (n_docs and n_lines let a caller say so). */
int lp_train_data_load_text(lp_train_data *d, const char *path,
                            const lp_tokenizer *tok, lp_error *err);
void lp_train_data_free(lp_train_data *d);

/* Batch buffers (owned). pos and visible exist only with packing. */
typedef struct lp_train_batch_buf {
    lp_train_batch batch;
    int32_t *inputs, *targets;
    float *mask;
    int32_t *pos;
    uint8_t *visible;
} lp_train_batch_buf;

int lp_train_batch_alloc(lp_train_batch_buf *bb, int B, int T, lp_error *err);
/* Packing: lp_train_batch_sample then fills each row with as many whole
 * records as fit, each with its own positions (from 0) and a causal mask
 * that stops at its boundaries, so every record trains exactly as if alone
 * while padding shrinks. Allocates pos and visible (B*T*T bytes). */
int lp_train_batch_enable_packing(lp_train_batch_buf *bb, lp_error *err);
void lp_train_batch_free(lp_train_batch_buf *bb);
/* Writes one example into row r: inputs ids[0..n-1), targets ids[1..n),
 * mask 1 on completion targets (the EOS included), right-padded (pad 0,
 * mask 0) and truncated to T. */
void lp_train_batch_set_example(lp_train_batch_buf *bb, int r, const lp_train_example *ex);
/* Row r = a window of T+1 tokens of the stream starting at `start`, all
 * masked in. */
void lp_train_batch_set_window(lp_train_batch_buf *bb, int r, const int32_t *stream,
                               size_t start);
/* Fills every row by sampling with rng: records uniformly (with
 * replacement) and/or random text windows; with both, rows alternate
 * text / records (packed rows of records only with packing and no text).
 * Returns -1 if there is no data. */
int lp_train_batch_sample(lp_train_batch_buf *bb, const lp_train_data *d, lp_rng *rng,
                          lp_error *err);

/* ---- checkpoints ---------------------------------------------------------- */

/* File layout (all little-endian), see checkpoint.c. */
int lp_checkpoint_save(const char *path, const lp_train_model *m, const lp_adamw *opt,
                       const lp_rng *rng, lp_error *err);
/* Reads and validates a checkpoint; creates *model (no pool, no
 * activations) and fills *opt and *rng. */
int lp_checkpoint_load(const char *path, lp_train_model **model, lp_adamw *opt,
                       lp_rng *rng, lp_error *err);
int lp_checkpoint_load_memory(const void *data, size_t size, const char *name,
                              lp_train_model **model, lp_adamw *opt, lp_rng *rng,
                              lp_error *err);

/* ---- export ------------------------------------------------------------ */

/* A llama-architecture GGUF the runtime (and llama.cpp) loads directly:
 * weight_type LP_F32 or LP_F16 for matrices (norms stay F32); tokenizer.*
 * keys copied from vocab (a GGUF with a vocabulary; NULL: none written). */
int lp_train_export_gguf(const lp_train_model *m, const char *path, uint32_t weight_type,
                         const char *vocab_path, const char *name, lp_error *err);
/* A Hugging Face PEFT directory (adapter_config.json +
 * adapter_model.safetensors) with q/k B rows in HF (rotate-half) order. */
int lp_train_export_peft(const lp_train_model *m, const char *dir,
                         const char *base_name, lp_error *err);
/* Extra embeddings as safetensors: "extra_embeddings" [n_extra][dim] F32,
 * metadata n_vocab (the first extra id). */
int lp_train_export_extra(const lp_train_model *m, const char *path, lp_error *err);

#endif
