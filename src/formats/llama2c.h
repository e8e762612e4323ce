/* llama2.c checkpoint reader (karpathy/llama2.c "version 0" format: the
 * legacy float32 export that run.c reads).
 *
 * Header: 7 int32 {dim, hidden_dim, n_layers, n_heads, n_kv_heads,
 * vocab_size, seq_len}; a negative vocab_size means the classifier is stored
 * separately (unshared). Then float32 arrays, row-major [out][in]:
 *   token_embedding [vocab][dim], rms_att [L][dim], wq [L][dim][dim],
 *   wk [L][kv_dim][dim], wv [L][kv_dim][dim], wo [L][dim][dim],
 *   rms_ffn [L][dim], w1 [L][hidden][dim], w2 [L][dim][hidden],
 *   w3 [L][hidden][dim], rms_final [dim],
 *   freq_cis_real [seq_len][head_size/2], freq_cis_imag (same) (unused),
 *   wcls [vocab][dim] if unshared.
 * Every size is validated against the file size with overflow checks. */
#ifndef LP_LLAMA2C_H
#define LP_LLAMA2C_H

#include <stdbool.h>
#include <stdint.h>

#include "../base/base.h"

typedef struct lp_llama2c {
    int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
    bool shared_classifier; /* from the sign of the header's vocab_size;
                             * vocab_size above is always positive */
    /* pointers into the mapping (4-byte aligned after the 28-byte header) */
    const float *token_embedding, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn,
                *w1, *w2, *w3, *rms_final, *wcls;
    lp_mapped_file file; /* owned (unused when opened from memory) */
} lp_llama2c;

int lp_llama2c_open(const char *path, lp_llama2c *out, lp_error *err);
int lp_llama2c_open_memory(const void *data, size_t size, const char *name,
                           lp_llama2c *out, lp_error *err);
void lp_llama2c_close(lp_llama2c *m);

#endif
