/* Tokenizers: SentencePiece-style BPE with byte fallback (Llama 2, Mistral,
 * llama2.c vocabularies) and byte-level BPE with pre-tokenizer regexes
 * (GPT-2, Llama 3, Qwen2) via PCRE2. Plus chat templates.
 *
 * One lp_tokenizer type for both; built from GGUF metadata, a llama2.c
 * tokenizer .bin, or a Hugging Face tokenizer.json. Immutable after creation,
 * so one tokenizer may be shared by many threads. */
#ifndef LP_TOKENIZER_H
#define LP_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"
#include "../formats/gguf.h"

typedef struct lp_tokenizer lp_tokenizer;

typedef enum lp_tok_kind {
    LP_TOK_SPM,  /* SentencePiece BPE: scores, ▁ for space, <0xXX> bytes */
    LP_TOK_BPE,  /* byte-level BPE: merges, GPT-2 byte-to-unicode mapping */
} lp_tok_kind;

typedef enum lp_pretok {
    LP_PRETOK_NONE,   /* SPM */
    LP_PRETOK_GPT2,
    LP_PRETOK_LLAMA3, /* "llama-bpe" */
    LP_PRETOK_QWEN2,
} lp_pretok;

typedef enum lp_chat_format {
    LP_CHAT_NONE,
    LP_CHAT_LLAMA3,
    LP_CHAT_CHATML,   /* qwen */
    LP_CHAT_LLAMA2,
    LP_CHAT_MISTRAL,
} lp_chat_format;

/* tokenizer.ggml.* keys of a GGUF (model or vocab-only). */
lp_tokenizer *lp_tokenizer_from_gguf(const lp_gguf *g, lp_error *err);
/* llama2.c tokenizer.bin: i32 max_token_length, then per token: f32 score,
 * i32 len, len bytes. vocab_size comes from the model header. */
lp_tokenizer *lp_tokenizer_from_llama2c(const char *path, int32_t vocab_size,
                                        lp_error *err);
lp_tokenizer *lp_tokenizer_from_llama2c_memory(const void *data, size_t size,
                                               int32_t vocab_size,
                                               const char *name, lp_error *err);
/* Hugging Face tokenizer.json (+ optional tokenizer_config.json for BOS/EOS,
 * add_bos and chat template; may be NULL). */
lp_tokenizer *lp_tokenizer_from_hf(const char *tokenizer_json_path,
                                   const char *tokenizer_config_path,
                                   lp_error *err);
lp_tokenizer *lp_tokenizer_from_hf_memory(const char *json, size_t len,
                                          const char *config_json, size_t config_len,
                                          const char *name, lp_error *err);
void lp_tokenizer_free(lp_tokenizer *t);

lp_tok_kind lp_tokenizer_kind(const lp_tokenizer *t);
lp_pretok lp_tokenizer_pretok(const lp_tokenizer *t);
int32_t lp_tokenizer_n_vocab(const lp_tokenizer *t);
int32_t lp_tokenizer_bos(const lp_tokenizer *t);  /* -1 if none */
int32_t lp_tokenizer_eos(const lp_tokenizer *t);  /* -1 if none */
bool lp_tokenizer_add_bos(const lp_tokenizer *t);
/* End of generation: eos, eot (<|eot_id|>, <|im_end|>, <|eom_id|>, ...). */
bool lp_tokenizer_is_eog(const lp_tokenizer *t, int32_t id);
/* The vocabulary string of a token as stored (e.g. "▁Hello", "ĠHello"). */
const char *lp_tokenizer_token_text(const lp_tokenizer *t, int32_t id, size_t *len);
/* Token id for an exact vocabulary string, or -1. */
int32_t lp_tokenizer_lookup(const lp_tokenizer *t, const char *text, size_t len);

/* Encodes UTF-8 text. add_bos: prepend BOS (if the vocabulary has one).
 * parse_special: recognise control/special token texts (e.g. "<|im_start|>")
 * in the input as single tokens. SPM adds the dummy-prefix space as
 * SentencePiece does. Returns the number of tokens (which may exceed cap:
 * then only the first cap are written and the caller retries with a bigger
 * buffer) or -1 with err set (invalid UTF-8 is encoded bytewise, never an
 * error; only allocation failure is). */
int lp_tokenizer_encode(const lp_tokenizer *t, const char *text, size_t len,
                        bool add_bos, bool parse_special, int32_t *out,
                        int cap, lp_error *err);

/* The bytes a token contributes to the output text (▁ -> space, <0x0A> ->
 * byte, GPT-2 byte unmapping; control tokens give their text only if
 * render_special). Returns the length written (may be partial UTF-8);
 * at most cap bytes are written; returns the needed length. */
size_t lp_tokenizer_decode_token(const lp_tokenizer *t, int32_t id,
                                 bool render_special, char *buf, size_t cap);
/* Decodes a whole sequence. SPM: strips the dummy-prefix space of the first
 * token when `strip_leading_space`. Returns needed length (NUL written if
 * room). */
size_t lp_tokenizer_decode(const lp_tokenizer *t, const int32_t *ids, int n,
                           bool strip_leading_space, char *buf, size_t cap);

/* ---- chat ------------------------------------------------------------- */

typedef struct lp_chat_message {
    const char *role;    /* "system", "user", "assistant" */
    const char *content;
} lp_chat_message;

/* Chat format from the tokenizer's template (tokenizer.chat_template) or, if
 * absent, from the vocabulary (special tokens present). */
lp_chat_format lp_tokenizer_chat_format(const lp_tokenizer *t);
const char *lp_chat_format_name(lp_chat_format f);
/* Renders messages into a prompt string (malloc'd, caller frees) with the
 * assistant turn opened when add_generation_prompt. Special tokens appear as
 * text and are recognised by encode(parse_special = true). The BOS text is
 * not included (encode adds BOS). */
char *lp_chat_render(lp_chat_format f, const lp_chat_message *msgs, int n,
                     bool add_generation_prompt, lp_error *err);

#endif
