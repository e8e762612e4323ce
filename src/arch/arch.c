/* Architecture names (see arch.h). */
#include "arch.h"

#include <string.h>

#include "llama.h"
#include "../runtime/context.h"

static const char *const arch_names[] = {
    [LP_ARCH_LLAMA] = "llama",
    [LP_ARCH_QWEN2] = "qwen2",
    [LP_ARCH_QWEN3] = "qwen3",
};
#define N_ARCHS ((int)(sizeof arch_names / sizeof arch_names[0]))
_Static_assert(N_ARCHS == LP_ARCH_COUNT, "LP_ARCH_COUNT counts arch_names");

const char *lp_arch_name(lp_arch a) {
    if ((int)a < 0 || (int)a >= N_ARCHS) return "unknown";
    return arch_names[a];
}

int lp_arch_from_name(const char *name, lp_arch *out) {
    if (!name) return -1;
    for (int i = 0; i < N_ARCHS; i++) {
        if (strcmp(name, arch_names[i]) == 0) {
            *out = (lp_arch)i;
            return 0;
        }
    }
    return -1;
}

int lp_arch_describe(struct lp_model *m, lp_error *err) { return lp_llama_describe(m, err); }

const struct lp_graph *lp_arch_graph(lp_arch a) {
    (void)a; /* llama, mistral, qwen2 and qwen3 are one graph with options */
    return &lp_llama_graph;
}
