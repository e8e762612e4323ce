/* libFuzzer target: lp_safetensors_open_memory on arbitrary bytes, then read
 * every tensor byte, look every name up and convert float tensors, so any
 * out-of-bounds pointer is caught by ASan. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lp_error err;
    lp_safetensors *st = lp_safetensors_open_memory(data, size, "fuzz.safetensors", &err);
    if (!st) {
        if (strlen(err.message) == 0) abort(); /* every failure must explain itself */
        return 0;
    }
    volatile uint64_t sum = 0;
    for (size_t i = 0; i < lp_safetensors_count(st); i++) {
        const lp_st_tensor *t = lp_safetensors_at(st, i);
        const uint8_t *p = t->data;
        for (size_t j = 0; j < t->n_bytes; j++) sum += p[j];
        if (lp_safetensors_find(st, t->name) != t) abort();
        if (t->n_elements <= (1u << 20)) {
            float *out = malloc((size_t)t->n_elements * sizeof(float) + 1);
            if (out && lp_st_to_f32(t, out, &err) == 0 && t->n_elements) sum += out[0] > 0;
            free(out);
        }
    }
    const char *m = lp_safetensors_metadata(st, "format");
    if (m) sum += strlen(m);
    lp_safetensors_close(st);
    (void)sum;
    return 0;
}
