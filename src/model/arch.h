/* Model architectures the runtime knows, and their GGUF names. */
#ifndef LP_ARCH_H
#define LP_ARCH_H

typedef enum lp_arch {
    LP_ARCH_LLAMA,   /* also mistral: GGUF arch "llama" */
    LP_ARCH_QWEN2,   /* q/k/v biases, NEOX rope */
    LP_ARCH_QWEN3,   /* q/k RMS norm, NEOX rope, head_dim from key_length */
} lp_arch;

#define LP_ARCH_COUNT 3

const char *lp_arch_name(lp_arch a);   /* "llama", "qwen2", "qwen3" */
int lp_arch_from_name(const char *name, lp_arch *out); /* 0 ok, -1 unknown */

#endif
