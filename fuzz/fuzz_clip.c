/* Fuzzes the CLIP merge-list parser and encoder (src/tokenizer/clip.c): the
 * input up to its first NUL byte is a merge list, the rest a prompt that the
 * tokenizer (when the list parsed) encodes into 77 ids, every one of which
 * must be in its vocabulary. Seed: the real list's first 300 merges and a
 * prompt. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/clip.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    const uint8_t *nul = memchr(data, 0, size);
    size_t nm = nul ? (size_t)(nul - data) : size;
    lp_error err;
    lp_clip_tokenizer *t = lp_clip_tokenizer_parse((const char *)data, nm, "fuzz.txt", &err);
    if (!t) return 0;
    const char *text = nul ? (const char *)nul + 1 : "a photo of a cat";
    size_t nt = nul ? size - nm - 1 : strlen(text);
    int32_t ids[LP_CLIP_CONTEXT];
    int n;
    if (lp_clip_encode(t, text, nt, lp_clip_eos(t), ids, LP_CLIP_CONTEXT, &n, &err) == 0)
        for (int i = 0; i < LP_CLIP_CONTEXT; i++)
            if (ids[i] < 0 || ids[i] >= lp_clip_vocab_size(t)) abort();
    char buf[64];
    for (int32_t id = 0; id < lp_clip_vocab_size(t) && id < 4096; id++) lp_clip_token_text(t, id, buf, sizeof buf);
    lp_clip_tokenizer_free(t);
    return 0;
}
