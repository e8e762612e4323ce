/* Random-weight model generator: writes a valid GGUF of a real model's shape
 * (TinyLlama, Llama 3.2, Qwen2.5, Qwen3 ...) with small random weights and a
 * real tokenizer vocabulary, for tests and benchmarks. Also writes random
 * GGUF LoRA adapters for such a model. */
#ifndef LP_SYNTH_H
#define LP_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "../base/base.h"
#include "../arch/arch.h"

typedef struct lp_synth_params {
    lp_arch arch;
    int dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, n_ctx;
    float rope_theta, rms_eps;
    bool tied_output;
    bool llama3_rope_scaling;   /* write rope_freqs.weight (factor 32 as Llama 3.2) */
    uint32_t weight_type;       /* lp_dtype for 2-D matrices (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) */
    uint32_t embd_type;         /* lp_dtype for token_embd / output */
    uint64_t seed;
    const char *vocab_path;     /* GGUF whose tokenizer.* keys are copied; NULL: built-in byte vocab */
    const char *name;           /* general.name */
} lp_synth_params;

/* Fills p from a preset name ("tinyllama-1.1b", "llama-3.2-1b",
 * "qwen2.5-0.5b", "qwen3-0.6b", "tiny" (a few MB, for fast tests)). vocab_path
 * is left NULL; the caller chooses. Returns -1 for unknown names (the message
 * lists the presets). */
int lp_synth_preset(const char *name, lp_synth_params *p, lp_error *err);
/* Name of the vocabulary file (in ../shared/models/arch) the preset's real
 * model uses, e.g. "ggml-vocab-llama-spm.gguf". */
const char *lp_synth_preset_vocab(const char *name);

int lp_synth_write(const lp_synth_params *p, const char *out_path, lp_error *err);

/* A random llama.cpp-format GGUF LoRA adapter for a model file: rank r on
 * the given targets ("q,k,v,o,gate,up,down"), alpha, F32 A/B. */
int lp_synth_lora_write(const char *base_model_path, int rank, float alpha,
                        const char *targets, uint64_t seed,
                        const char *out_path, lp_error *err);

#endif
