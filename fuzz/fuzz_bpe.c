/* Fuzzes the demo world's BPE trainer (src/world/bpe_train.c) on arbitrary
 * bytes: the GPT-2 pre-tokenizer (UTF-8 decoding, character classes) must
 * cut the input into non-empty chunks that cover it exactly and never split
 * a valid multi-byte character; a vocabulary trained on the input must
 * encode it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "world/world.h"

typedef struct cover {
    const char *base;
    size_t next;
    bool bad;
} cover;

static void on_chunk(void *user, const char *chunk, size_t n) {
    cover *c = user;
    if (n == 0 || chunk != c->base + c->next) c->bad = true;
    /* a chunk never starts on a continuation byte that follows a lead byte
     * of a valid sequence it belongs to: checked loosely, on 2-3 byte forms */
    if (c->next > 0 && ((unsigned char)chunk[0] & 0xC0) == 0x80) {
        unsigned char p = (unsigned char)c->base[c->next - 1];
        if (p >= 0xC2 && p <= 0xDF) c->bad = true;
    }
    c->next += n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) size = 4096;
    const char *text = (const char *)data;
    cover c = {.base = text};
    lp_bpe_pretokenize(text, size, on_chunk, &c);
    if (c.bad || c.next != size) abort();
    lp_error err;
    lp_bpe *b = lp_bpe_create(&err);
    if (!b) return 0;
    if (lp_bpe_add_text(b, text, size, &err) == 0 && lp_bpe_train(b, 300, &err) == 0) {
        int32_t ids[64];
        int n = lp_bpe_encode(b, text, size, ids, 64, &err);
        if (n > (int)size) abort(); /* never more tokens than bytes */
    }
    lp_bpe_free(b);
    return 0;
}
