/* LoRA adapters as runtime inputs to a frozen base.
 *
 * An adapter is a set of low-rank pairs per layer and projection:
 *   y = W x + scale * B (A x),  A: rank x in,  B: out x rank.
 * It is read from a native .lpa file, a Hugging Face PEFT directory
 * (adapter_config.json + adapter_model.safetensors) or a llama.cpp GGUF LoRA,
 * validated against the base it is loaded for, and converted to this one
 * in-memory form with the base's conventions applied (q/k row order of GGUF
 * llama bases, folded norm gains). The forward pass applies it per batch row
 * via the row's adapter slot. Ranks may differ between adapters and between
 * projections. */
#ifndef LP_ADAPTER_H
#define LP_ADAPTER_H

#include "model.h"

typedef enum lp_proj {
    LP_PROJ_Q, LP_PROJ_K, LP_PROJ_V, LP_PROJ_O, LP_PROJ_GATE, LP_PROJ_UP, LP_PROJ_DOWN,
    LP_PROJ_COUNT
} lp_proj;

/* "q", "k", "v", "o", "gate", "up", "down" */
const char *lp_proj_name(lp_proj p);

typedef struct lp_lora_pair {
    int rank;            /* 0: this projection has no adapter */
    float scale;         /* alpha / rank (or alpha / sqrt(rank) for rsLoRA) x user scale */
    lp_weight A;         /* rows = rank, cols = in  (F32 or F16) */
    lp_weight B;         /* rows = out,  cols = rank (F32 or F16) */
} lp_lora_pair;

struct lp_adapter {
    char name[256];
    const lp_model *base;
    int n_layers;
    lp_lora_pair *pairs;     /* [n_layers * LP_PROJ_COUNT] */
    int max_rank;
    uint64_t bytes;          /* bytes of A and B */
    /* ownership */
    void **owned;
    int n_owned, cap_owned;
    lp_mapped_file file;
};

static inline lp_lora_pair *lp_adapter_pair(const lp_adapter *a, int layer, lp_proj p) {
    return &a->pairs[(size_t)layer * LP_PROJ_COUNT + (size_t)p];
}

/* A fingerprint of the base's shapes and weights (sampled bytes), stored in
 * .lpa files so an adapter can't silently be used on another base. */
uint64_t lp_model_fingerprint(const lp_model *m);

#endif
