/* Private to src/tokenizer: the tokenizer's layout and the helpers the
 * loaders (load.c), the encoders (encode.c) and the decoder share. */
#ifndef LP_TOKENIZER_INTERNAL_H
#define LP_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer.h"

/* Token types as GGUF stores them (tokenizer.ggml.token_type). */
enum {
    TOK_UNDEFINED = 0,
    TOK_NORMAL = 1,
    TOK_UNKNOWN = 2,
    TOK_CONTROL = 3,
    TOK_USER_DEFINED = 4,
    TOK_UNUSED = 5,
    TOK_BYTE = 6,
};

/* Upper bound on vocabulary sizes we accept from any file: far above any
 * real model, low enough that allocations sized by it stay reasonable. */
#define TOK_MAX_VOCAB (1 << 22)

/* One slot of the merge table: the pair (left, right) of token ids merges
 * into `result` with priority `rank` (lower merges first). */
typedef struct tok_merge_slot {
    uint64_t key;   /* (left << 32 | right) + 1; 0 marks an empty slot */
    int32_t rank;
    int32_t result;
} tok_merge_slot;

struct lp_tokenizer {
    lp_tok_kind kind;
    lp_pretok pretok;
    int32_t n_vocab;

    /* Token texts, each NUL-terminated inside one arena. */
    char *arena;
    size_t arena_len, arena_cap;
    size_t *text_off;
    uint32_t *text_len;
    float *scores;
    uint8_t *types;
    uint8_t *eog;            /* 1 = ends generation */

    /* Open-addressing table text -> id (slot holds id + 1, 0 = empty). */
    int32_t *vocab_slots;
    size_t vocab_mask;

    /* Pair merges (byte-level BPE, and SentencePiece models given as
     * Hugging Face merges). use_merge_ranks selects them for SPM. */
    tok_merge_slot *merge_slots;
    size_t merge_mask;
    size_t n_merges;
    bool use_merge_ranks;
    bool ignore_merges;      /* Llama 3: a word that is a token is not split */
    bool add_space_prefix;   /* SentencePiece dummy prefix */

    int32_t bos, eos, eot, eom, unk;
    bool add_bos;

    /* SPM: id of "<0xXX>"; BPE: id of the byte's GPT-2 unicode character.
     * -1 when the vocabulary lacks it. */
    int32_t byte_token[256];

    /* Special tokens matched in the input: control + user-defined, sorted
     * by text length, longest first. */
    int32_t *specials;
    int n_specials;
    /* specials[special_bucket[b] .. special_bucket[b+1]) start with byte b,
     * longest first within a bucket */
    int32_t special_bucket[257];

    pcre2_code *regex;       /* BPE pre-tokenizer, compiled once */
    char *chat_template;     /* NULL if none */
    char name[256];          /* for error messages */
};

/* ---- building (tokenizer.c) ------------------------------------------- */

/* A tokenizer with room for n tokens (all empty, type UNUSED). */
lp_tokenizer *tok_new(int32_t n_vocab, const char *name, lp_error *err);
/* Sets token id's text/score/type (text copied). */
int tok_set_token(lp_tokenizer *t, int32_t id, const char *text, size_t len,
                  float score, int type, lp_error *err);
/* Builds the text -> id table; call after all tokens are set. */
int tok_build_vocab_index(lp_tokenizer *t, lp_error *err);
/* Reserves the merge table for n merges (after the vocab index exists). */
int tok_reserve_merges(lp_tokenizer *t, size_t n, lp_error *err);
/* Adds "left right" with the given rank; pairs whose parts or result are
 * not tokens are skipped (returns 0), duplicates keep the best rank. */
void tok_add_merge(lp_tokenizer *t, const char *left, size_t left_len,
                   const char *right, size_t right_len, int32_t rank);
/* Final step for every loader: byte tables, specials, end-of-generation
 * flags, pre-tokenizer regex. */
int tok_finish(lp_tokenizer *t, lp_error *err);

int32_t tok_lookup(const lp_tokenizer *t, const char *text, size_t len);
static inline const char *tok_text(const lp_tokenizer *t, int32_t id) {
    return t->arena + t->text_off[id];
}
/* Merge table probe: result id and rank for the pair, or false. */
bool tok_find_merge(const lp_tokenizer *t, int32_t left, int32_t right,
                    int32_t *rank, int32_t *result);

/* GPT-2 byte <-> unicode mapping. */
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp); /* -1 if cp is not a mapped byte */
/* Writes cp as UTF-8 into out (>= 4 bytes); returns its length. */
int tok_utf8_put(uint32_t cp, char *out);

/* The exact upstream pre-tokenizer patterns (for matching tokenizer.json). */
extern const char *const tok_pattern_gpt2;
extern const char *const tok_pattern_llama3;
extern const char *const tok_pattern_qwen2;

/* ---- encoding (encode.c) ---------------------------------------------- */
int tok_compile_regex(lp_tokenizer *t, lp_error *err);

#endif
