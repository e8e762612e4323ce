/* libFuzzer target: lp_gguf_open_memory on arbitrary bytes, then read every
 * byte the handle exposes (keys, strings, array elements, tensor data) so any
 * pointer that escapes the input is caught by ASan. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/gguf.h"

static uint64_t touch_kv(const lp_gguf_kv *kv) {
    uint64_t sum = 0;
    for (size_t i = 0; i < kv->key.len; i++) sum += (uint8_t)kv->key.ptr[i];
    if (kv->type == LP_GGUF_STRING)
        for (size_t i = 0; i < kv->v.s.len; i++) sum += (uint8_t)kv->v.s.ptr[i];
    if (kv->type != LP_GGUF_ARRAY) return sum;
    for (uint64_t i = 0; i < kv->arr_len; i++) {
        if (kv->arr_type == LP_GGUF_STRING) {
            for (size_t j = 0; j < kv->arr_strs[i].len; j++) sum += (uint8_t)kv->arr_strs[i].ptr[j];
        } else {
            sum += lp_gguf_arr_u8(kv, i) + lp_gguf_arr_u32(kv, i) + (uint32_t)lp_gguf_arr_i32(kv, i);
            float f = lp_gguf_arr_f32(kv, i);
            sum += f > 0;
        }
    }
    return sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lp_error err;
    lp_gguf *g = lp_gguf_open_memory(data, size, "fuzz.gguf", &err);
    if (!g) {
        if (strlen(err.message) == 0) abort(); /* every failure must explain itself */
        return 0;
    }
    volatile uint64_t sum = 0;
    for (size_t i = 0; i < lp_gguf_kv_count(g); i++) sum += touch_kv(lp_gguf_kv_at(g, i));
    for (size_t i = 0; i < lp_gguf_tensor_count(g); i++) {
        const lp_gguf_tensor *t = lp_gguf_tensor_at(g, i);
        const uint8_t *p = t->data;
        for (size_t j = 0; j < t->n_bytes; j++) sum += p[j];
        if (lp_gguf_find_tensor(g, "token_embd.weight") == t) sum++;
    }
    /* getters on a few common keys (any type) */
    uint32_t u32;
    float f;
    lp_str s;
    const lp_gguf_kv *arr;
    lp_gguf_get_u32(g, "general.alignment", &u32, &err);
    lp_gguf_get_f32(g, "llama.rope.freq_base", &f, &err);
    lp_gguf_get_str(g, "general.architecture", &s, &err);
    lp_gguf_get_arr(g, "tokenizer.ggml.tokens", LP_GGUF_STRING, &arr, &err);
    lp_gguf_close(g);
    (void)sum;
    return 0;
}
