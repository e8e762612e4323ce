/* libFuzzer target: lp_llama2c_open_memory on arbitrary bytes; on success,
 * read the first and last element of every array the struct points at, so a
 * wrong layout computation is caught by ASan. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/llama2c.h"

static float ends(const float *p, size_t n) { return n ? p[0] + p[n - 1] : 0; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lp_llama2c m;
    lp_error err;
    if (lp_llama2c_open_memory(data, size, "fuzz.bin", &m, &err) != 0) {
        if (strlen(err.message) == 0) abort(); /* every failure must explain itself */
        return 0;
    }
    size_t dim = (size_t)m.dim, hid = (size_t)m.hidden_dim, L = (size_t)m.n_layers;
    size_t kv = dim / (size_t)m.n_heads * (size_t)m.n_kv_heads, V = (size_t)m.vocab_size;
    volatile float s = 0;
    s += ends(m.token_embedding, V * dim) + ends(m.rms_att, L * dim) + ends(m.wq, L * dim * dim);
    s += ends(m.wk, L * kv * dim) + ends(m.wv, L * kv * dim) + ends(m.wo, L * dim * dim);
    s += ends(m.rms_ffn, L * dim) + ends(m.w1, L * hid * dim) + ends(m.w2, L * dim * hid);
    s += ends(m.w3, L * hid * dim) + ends(m.rms_final, dim) + ends(m.wcls, V * dim);
    if ((const uint8_t *)(m.wcls + (m.shared_classifier ? 0 : V * dim)) > data + size) abort();
    lp_llama2c_close(&m);
    (void)s;
    return 0;
}
