/* LoRA adapters as runtime inputs to a frozen base.
 *
 * An adapter is a sparse map from the base's weight ids (lp_model.weights)
 * to low-rank pairs: y = W x + scale * B (A x),  A: rank x in,  B: out x rank.
 * It is read from a native .lpa file, a Hugging Face PEFT directory
 * (adapter_config.json + adapter_model.safetensors) or a llama.cpp GGUF LoRA
 * by mapping each tensor name through the base's weight names, validated
 * against the base, and converted to this one in-memory form with the base's
 * conventions applied (rotary row order, folded norm gains). The forward
 * pass applies it per batch row via the row's adapter slot. Ranks and
 * targets may differ between adapters and between weights. */
#ifndef LP_ADAPTER_H
#define LP_ADAPTER_H

#include "../formats/lpa.h"
#include "model.h"

typedef struct lp_lora_pair {
    int weight;          /* weight id in the base; -1 in lp_adapter_inspect */
    char name[96];       /* the base weight's GGUF name ("blk.3.attn_q.weight") */
    int rank;
    float scale;         /* alpha / rank (or alpha / sqrt(rank) for rsLoRA) x user scale */
    lp_weight A;         /* rows = rank, cols = in  (F32, F16, or packed W8/W4) */
    lp_weight B;         /* rows = out,  cols = rank (F32, F16; packed: round32(rank),
                            zero past the rank) */
    /* Under a shared profile (lp_adapter.profile_id != 0) A and B are bare
     * codes (type LP_I8 marks them; the values are codes, not numbers), in
     * the static branch's layouts (kernels/lora_static.h; rows / cols still
     * name the shapes), 8-bit or 4-bit packed two a byte: their
     * encodings are in the profile the context binds (lp_profile), found
     * by `weight`. */
    const int64_t *sum_a;  /* profile codes: [rank] sums of A's rows' codes (lp_lora_static.sum_a) */
    bool codes_packed;     /* profile codes: 4-bit, two a byte (lp_lora_static.packed) */
} lp_lora_pair;

struct lp_adapter {
    char name[256];
    char base_name[256];     /* the base it was trained on, as the file says ("" if unknown) */
    const char *format;      /* "lpa", "peft", "gguf" */
    const lp_model *base;    /* NULL for lp_adapter_inspect */
    int n_pairs;
    lp_lora_pair *pairs;     /* [n_pairs] by weight id (inspect: by name) */
    int32_t *index;          /* [base->n_weights] pair of each weight id or -1; NULL without a base */
    int max_rank;
    uint64_t bytes;          /* bytes of A and B */
    uint64_t tag;            /* content hash (never 0): KV made with this adapter is
                                recognised by it, so rebinding costs nothing */
    uint64_t profile_id;     /* the .lpq profile its codes need (0: none) */
    /* ownership */
    void **owned;
    int n_owned, cap_owned;
    lp_mapped_file file;
};

/* The pair of weight id w, or NULL where the adapter leaves w alone. */
static inline const lp_lora_pair *lp_adapter_pair(const lp_adapter *a, int w) {
    int i = a->index[w];
    return i >= 0 ? &a->pairs[i] : NULL;
}

/* Weight id of a GGUF weight name ("blk.3.attn_q.weight") or a Hugging Face
 * module name ("model.layers.3.self_attn.q_proj") of m; -1 if m has no
 * adaptable weight of that name. */
int lp_model_weight_by_name(const lp_model *m, const char *name);
int lp_model_weight_by_module(const lp_model *m, const char *module);

/* The adapter's identity (a->tag): a hash of every shape, scale and weight
 * byte, never 0. */
uint64_t lp_adapter_content_hash(const lp_adapter *a);

/* A fingerprint of the base's shapes and weights (sampled bytes), stored in
 * .lpa files so an adapter can't silently be used on another base. */
uint64_t lp_model_fingerprint(const lp_model *m);

/* Reads an adapter without a base (for `adapter info`): shapes are taken from
 * the file as they are, nothing is permuted, no fingerprint is checked. */
lp_adapter *lp_adapter_inspect(const char *path, lp_error *err);
/* Loads an .lpa image from memory (64-byte aligned; must outlive the
 * adapter). `what` names it in messages. Used by the fuzzer and tests. */
lp_adapter *lp_adapter_load_lpa_memory(const lp_model *model, const void *data,
                                       size_t size, const char *what, float scale,
                                       lp_error *err);
/* For the writers in the tools library (src/tools/adapter_write.c): the
 * base description an .lpa file records, and a name copy that keeps whole
 * UTF-8 characters. */
lp_lpa_base lp_adapter_lpa_base(const lp_model *m);
void lp_adapter_copy_name(char *dst, size_t cap, const char *src, size_t len);
/* The source row of q/k output row `dst` when rotary rows are reordered:
 * direction +1 from Hugging Face order into interleaved (GGUF llama) order,
 * -1 back. */
uint64_t lp_rope_source_row(uint64_t dst, int head_dim, int direction);

/* ---- PEFT adapter_config.json (exposed for the fuzzer) ---- */
struct cJSON;
typedef struct lp_peft_config {
    int r;
    float alpha;
    bool rslora;
    char base_name[256];
    struct cJSON *root;                 /* owned */
    const struct cJSON *rank_pattern;   /* objects or NULL */
    const struct cJSON *alpha_pattern;
} lp_peft_config;

/* Parses and checks a config (rejects DoRA, modules_to_save, unsupported
 * targets, biases, ...). `what` names the file in messages. */
int lp_peft_config_parse(const char *json, size_t len, const char *what,
                         lp_peft_config *cfg, lp_error *err);
void lp_peft_config_free(lp_peft_config *cfg);
/* Rank and alpha of one module ("model.layers.3.self_attn.q_proj") after
 * rank_pattern / alpha_pattern. */
int lp_peft_module_params(const lp_peft_config *cfg, const char *module, const char *what,
                          int *rank, float *alpha, lp_error *err);

#endif
