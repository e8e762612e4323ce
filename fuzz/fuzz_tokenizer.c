/* Fuzzes the tokenizer loaders and, when a load succeeds, encode/decode.
 * The input is tried as a llama2.c tokenizer.bin (vocabulary size taken
 * from its first byte), as tokenizer.json (+ tokenizer_config.json after a
 * NUL byte, if any) and as a GGUF file. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static void exercise(const lp_tokenizer *t, const uint8_t *data, size_t size) {
    static const char *const texts[] = {
        "Once upon a time, there was a little girl.",
        " leading  spaces\t\ttabs\n\nnewlines 12345 \xe4\xbd\xa0\xe5\xa5\xbd",
        "<s>[INST] <|im_start|>user\n<|eot_id|></s>",
        "",
    };
    lp_error err;
    int32_t ids[256];
    char out[1024];
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int n = lp_tokenizer_encode(t, texts[i], strlen(texts[i]), true, i % 2 == 0, ids, 256, &err);
        if (n > 0) lp_tokenizer_decode(t, ids, n < 256 ? n : 256, true, out, sizeof out);
    }
    /* the input itself as text (bytes of any kind) */
    size_t len = size < 2048 ? size : 2048;
    int n = lp_tokenizer_encode(t, (const char *)data, len, true, true, ids, 256, &err);
    if (n > 0) lp_tokenizer_decode(t, ids, n < 256 ? n : 256, false, out, sizeof out);
    /* every token's piece, with a tiny buffer */
    int32_t nv = lp_tokenizer_n_vocab(t);
    for (int32_t id = -1; id <= nv && id < 2048; id++) {
        char small[4];
        lp_tokenizer_decode_token(t, id, id & 1, small, sizeof small);
        lp_tokenizer_is_eog(t, id);
    }
    lp_tokenizer_chat_format(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lp_error err;
    if (size >= 1) {
        int32_t vocab = 1 + data[0] % 600; /* bounded: the file must hold it */
        lp_tokenizer *t = lp_tokenizer_from_llama2c_memory(data, size, vocab, "fuzz.bin", &err);
        if (t) {
            exercise(t, data, size);
            lp_tokenizer_free(t);
        }
    }

    const uint8_t *nul = memchr(data, 0, size);
    size_t json_len = nul ? (size_t)(nul - data) : size;
    const char *cfg = nul ? (const char *)nul + 1 : NULL;
    size_t cfg_len = nul ? size - json_len - 1 : 0;
    lp_tokenizer *t = lp_tokenizer_from_hf_memory((const char *)data, json_len, cfg, cfg_len,
                                                  "fuzz.json", &err);
    if (t) {
        exercise(t, data, size);
        lp_tokenizer_free(t);
    }

    lp_gguf *g = lp_gguf_open_memory(data, size, "fuzz.gguf", &err);
    if (g) {
        t = lp_tokenizer_from_gguf(g, &err);
        lp_gguf_close(g);
        if (t) {
            exercise(t, data, size);
            lp_tokenizer_free(t);
        }
    }
    return 0;
}
