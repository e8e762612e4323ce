/* The model: hyper-parameters, weights (memory-mapped where possible) and
 * tokenizer, loaded from GGUF, a Hugging Face directory or a llama2.c
 * checkpoint into one in-memory form. Immutable after loading. */
#ifndef LP_MODEL_H
#define LP_MODEL_H

#include "../base/base.h"
#include "../formats/gguf.h"
#include "../formats/llama2c.h"
#include "../formats/safetensors.h"
#include "../kernels/kernels.h"
#include "../tokenizer/tokenizer.h"
#include "../arch/arch.h"

typedef struct lp_layer {
    /* Per-projection weights. In a layer with fused projections these are
     * row views into wqkv / w_gate_up (shape checks, adapters, info). */
    lp_weight wq, wk, wv, wo;
    lp_weight w_gate, w_up, w_down;
    /* Fused projections (compiled models): data != NULL means the forward
     * runs one matmul for q|k|v ([q_dim + 2 kv_dim] x dim, q rows first) and
     * one for gate|up ([2 ffn] x dim, gate rows first). */
    lp_weight wqkv, w_gate_up;
    /* RMSNorm gains [dim]. When the model's norms_folded is set they are
     * already multiplied into the columns of q/k/v (attn) and gate/up (ffn):
     * the forward normalises without a gain, and adapters fold the gain into
     * their A matrices. */
    const float *attn_norm, *ffn_norm;
    const float *bq, *bk, *bv;           /* qwen2 biases or NULL */
    const float *q_norm, *k_norm;        /* qwen3 per-head RMS gains [head_dim] or NULL */
} lp_layer;

/* A weight adapters may target. Its weight id is its index in
 * lp_model.weights; the architecture declares and names them (src/arch/).
 * Adapters are keyed by weight id, and files reach it through the names. */
typedef struct lp_model_weight {
    char name[96];          /* GGUF tensor name, "blk.3.attn_q.weight" */
    char hf_name[96];       /* Hugging Face module, "model.layers.3.self_attn.q_proj" */
    const lp_weight *w;     /* [out][in] (a row view into a fused weight) */
    const float *in_gain;   /* [in] norm gain folded into w's columns (norms_folded):
                               adapters fold it into A; NULL if none */
    bool rope_rows;         /* rows pair up for rotary: their order differs between
                               GGUF llama and Hugging Face files */
} lp_model_weight;

typedef struct lp_hparams {
    lp_arch arch;
    int n_vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim;
    int n_ctx_train;
    float rope_theta, rms_eps;
    bool rope_neox;        /* rotate pairs (i, i+d/2) instead of (2i, 2i+1) */
} lp_hparams;

struct lp_model {
    lp_hparams hp;
    const char *format;
    char name[128];
    char path[1024];

    lp_weight tok_embd;     /* rows = n_vocab, cols = dim */
    lp_weight output;       /* == tok_embd when tied */
    bool tied_output;
    const float *output_norm;
    float *rope_inv_freq;   /* [head_dim/2]: theta^(-2i/d) / freq_factor[i] */
    bool has_freq_factors;
    lp_layer *layers;
    lp_model_weight *weights; /* [n_weights] the adaptable weights, by weight id */
    int n_weights;

    lp_tokenizer *tok;

    /* plan-time transforms and activation mode (see lp_layer) */
    bool norms_folded;
    bool int8_activations;  /* integer kernels quantize activations to int8 (W*A8);
                               false: float activations (W*A16) */
    char tokenizer_path[1100]; /* llama2.c: the tokenizer file used (for compile) */
    /* .lpx: the tokenizer blobs inside the mapping (kind LP_LPX_TOK_*) */
    uint32_t lpx_tok_kind;
    const void *lpx_tok, *lpx_tok2;
    size_t lpx_tok_bytes, lpx_tok2_bytes;
    uint32_t compiled_type, compiled_group;   /* .lpx: what it was compiled to */
    bool no_repack;         /* lp_model_params.no_repack, for the GGUF loader */
    int n_repacked;         /* GGUF matrices repacked to W4/W8 at load */
    lp_threadpool *load_pool; /* during a GGUF load only: converts them */

    /* ownership */
    lp_gguf *gguf;
    lp_safetensors *st;
    lp_llama2c l2c;
    bool has_l2c;
    lp_mapped_file lpx_file;
    void **owned;           /* buffers converted at load (norms, biases) */
    int n_owned, cap_owned;
};

/* Internal loaders (model.c dispatches on the path). */
int lp_model_load_gguf(lp_model *m, const char *path, lp_error *err);
int lp_model_load_hf(lp_model *m, const char *dir, lp_error *err);
int lp_model_load_llama2c(lp_model *m, const char *path,
                          const char *tokenizer_path, lp_error *err);

/* .lpx compiled files (load_lpx.c). The image loader validates a whole
 * 64-byte aligned image used in place (must outlive the model). */
int lp_model_load_lpx(lp_model *m, const char *path, bool huge_pages, lp_error *err);
int lp_model_load_lpx_image(lp_model *m, const void *data, size_t size, const char *what,
                            lp_error *err);
/* A whole model from an in-memory .lpx image (fuzzer, tests). */
lp_model *lp_model_load_lpx_memory(const void *data, size_t size, const char *what,
                                   lp_error *err);
bool lp_is_lpx_file(const char *path);

/* Shared helpers for the loaders. */
void *lp_model_own(lp_model *m, size_t bytes);   /* zeroed, freed with the model */
/* Validates shape/type and fills the model's derived data (rope table). */
int lp_model_finish(lp_model *m, lp_error *err);

#endif
