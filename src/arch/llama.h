/* The Llama family (llama, mistral, qwen2, qwen3): its adaptable weights and
 * their names, and its forward graph over the runtime's ops (llama.c).
 *
 * Every layer has seven adaptable projections, and the weight id of
 * projection p of layer l is l * LP_PROJ_COUNT + p: the trainer, the merge
 * tool and .lpa version 1 files address weights that way. Other code goes
 * through lp_model.weights and names only. */
#ifndef LP_ARCH_LLAMA_H
#define LP_ARCH_LLAMA_H

#include "../model/adapter.h"
#include "../model/model.h"

typedef enum lp_proj {
    LP_PROJ_Q, LP_PROJ_K, LP_PROJ_V, LP_PROJ_O, LP_PROJ_GATE, LP_PROJ_UP, LP_PROJ_DOWN,
    LP_PROJ_COUNT
} lp_proj;

/* "q", "k", "v", "o", "gate", "up", "down" */
const char *lp_proj_name(lp_proj p);

static inline int lp_llama_weight_id(int layer, lp_proj p) { return layer * LP_PROJ_COUNT + (int)p; }

/* The pair an adapter (loaded for a base) has for layer l's projection p,
 * or NULL. */
static inline const lp_lora_pair *lp_llama_pair(const lp_adapter *a, int layer, lp_proj p) {
    return lp_adapter_pair(a, lp_llama_weight_id(layer, p));
}

/* The GGUF tensor name ("blk.3.attn_q.weight") and the Hugging Face module
 * ("model.layers.3.self_attn.q_proj") of a projection. */
void lp_llama_weight_name(int layer, lp_proj p, char *buf, size_t cap);
void lp_llama_module_name(int layer, lp_proj p, char *buf, size_t cap);

/* Fills m->weights: the seven projections of every layer, in weight id
 * order, with the norm gains folded into them and the q/k rotary rows. */
int lp_llama_describe(lp_model *m, lp_error *err);

/* The family's forward graph (runtime/context.h describes lp_graph). */
struct lp_graph;
extern const struct lp_graph lp_llama_graph;

#endif
