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
#include "synth.h"

typedef struct lp_layer {
    lp_weight wq, wk, wv, wo;
    lp_weight w_gate, w_up, w_down;
    const float *attn_norm, *ffn_norm;   /* [dim] */
    const float *bq, *bk, *bv;           /* qwen2 biases or NULL */
    const float *q_norm, *k_norm;        /* qwen3 per-head RMS gains [head_dim] or NULL */
} lp_layer;

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

    lp_tokenizer *tok;

    /* ownership */
    lp_gguf *gguf;
    lp_safetensors *st;
    lp_llama2c l2c;
    bool has_l2c;
    void **owned;           /* buffers converted at load (norms, biases) */
    int n_owned, cap_owned;
};

/* Internal loaders (model.c dispatches on the path). */
int lp_model_load_gguf(lp_model *m, const char *path, lp_error *err);
int lp_model_load_hf(lp_model *m, const char *dir, lp_error *err);
int lp_model_load_llama2c(lp_model *m, const char *path,
                          const char *tokenizer_path, lp_error *err);

/* Shared helpers for the loaders. */
void *lp_model_own(lp_model *m, size_t bytes);   /* zeroed, freed with the model */
/* Validates shape/type and fills the model's derived data (rope table). */
int lp_model_finish(lp_model *m, lp_error *err);

#endif
