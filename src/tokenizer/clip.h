/* The CLIP text tokenizer (OpenAI CLIP, and so Stable Diffusion 1.x):
 * byte-level BPE over GPT-2's byte-to-unicode symbols with `</w>` marking a
 * word's last symbol.
 *
 * The vocabulary follows from the merge list alone: the 256 byte symbols
 * (in GPT-2's bytes_to_unicode order), the same 256 with `</w>`, one token
 * per merge in file order, then <|startoftext|> and <|endoftext|> (49406 and
 * 49407 for the real list of 48,894 merges).
 *
 * Encoding: lower-case (Unicode simple case mapping), whitespace runs to one
 * space, split with CLIP's pattern
 *   <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
 * keeping only the matches (whitespace and invalid UTF-8 vanish), BPE each
 * piece (lowest merge rank first, leftmost on ties), then BOS, the first
 * n_ctx - 2 tokens, EOS, and padding to n_ctx. Not done: Unicode NFC (text is
 * taken as it comes; precomposed text is unaffected) and the original
 * Python's ftfy/HTML-unescape clean-up. */
#ifndef LP_TOKENIZER_CLIP_H
#define LP_TOKENIZER_CLIP_H

#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"

#define LP_CLIP_CONTEXT 77
/* the ids for the real merge list */
#define LP_CLIP_BOS 49406
#define LP_CLIP_EOS 49407

typedef struct lp_clip_tokenizer lp_clip_tokenizer;

/* Reads a merge list ("#version" header line optional, then "A B" per
 * line, every operand a token already defined). name is for messages. */
lp_clip_tokenizer *lp_clip_tokenizer_load(const char *path, lp_error *err);
lp_clip_tokenizer *lp_clip_tokenizer_parse(const char *text, size_t len, const char *name, lp_error *err);
void lp_clip_tokenizer_free(lp_clip_tokenizer *t);

int32_t lp_clip_vocab_size(const lp_clip_tokenizer *t);
int32_t lp_clip_bos(const lp_clip_tokenizer *t);
int32_t lp_clip_eos(const lp_clip_tokenizer *t);

/* Encodes text (len bytes) into ids[0..n_ctx): BOS, the tokens (cut to
 * n_ctx - 2), EOS, then pad_id (SD 1.x pads with EOS). *n_tokens (may be
 * NULL) gets the token count before the cut. Returns 0, or -1 (err set)
 * for n_ctx < 2 or text over 1 MiB. */
int lp_clip_encode(const lp_clip_tokenizer *t, const char *text, size_t len, int32_t pad_id, int32_t *ids,
                   int n_ctx, int *n_tokens, lp_error *err);

/* Token id's text: its bytes (the `</w>` end mark as a trailing space), at
 * most cap - 1 bytes and a NUL. Returns the length, or -1 for a bad id. */
int lp_clip_token_text(const lp_clip_tokenizer *t, int32_t id, char *buf, size_t cap);

#endif
