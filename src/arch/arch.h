/* The architectures loraplex runs: their names, and the one list of what
 * each provides (arch.c). The runtime knows none of them: a model declares
 * its adaptable weights (lp_arch_describe, at load) and the runtime runs its
 * forward pass through the graph it gets from lp_arch_graph. A new
 * architecture is a new file here and a line in arch.c. */
#ifndef LP_ARCH_H
#define LP_ARCH_H

#include "../base/base.h"

typedef enum lp_arch {
    LP_ARCH_LLAMA,   /* also mistral: GGUF arch "llama" */
    LP_ARCH_QWEN2,   /* q/k/v biases, NEOX rope */
    LP_ARCH_QWEN3,   /* q/k RMS norm, NEOX rope, head_dim from key_length */
} lp_arch;

#define LP_ARCH_COUNT 3

const char *lp_arch_name(lp_arch a);   /* "llama", "qwen2", "qwen3" */
int lp_arch_from_name(const char *name, lp_arch *out); /* 0 ok, -1 unknown */

struct lp_model;
struct lp_graph;
/* Fills m->weights / m->n_weights for m's architecture (lp_model_finish). */
int lp_arch_describe(struct lp_model *m, lp_error *err);
/* The forward graph of an architecture (runtime/context.h says what it does). */
const struct lp_graph *lp_arch_graph(lp_arch a);

#endif
