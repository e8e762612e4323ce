/* A byte-level BPE trainer (GPT-2 style) for the demo world's vocabulary.
 *
 * Texts are cut into chunks by GPT-2's pre-tokenizer rules, identical chunks
 * are counted once, and the most frequent adjacent pair of tokens over all
 * chunks is merged into a new token, again and again. The result is written
 * as GGUF tokenizer metadata (model "gpt2", pre "gpt2") that our runtime
 * tokenizer loads: token texts use GPT-2's byte-to-unicode alphabet and the
 * merges are ranked in the order they were learned. */
#include <stdlib.h>
#include <string.h>

#include "../formats/gguf.h"
#include "world.h"

#define N_SPECIAL 3
#define BYTE0 N_SPECIAL            /* id of byte 0 */
#define MAX_VOCAB 4096

typedef struct bpe_word {
    char *text;       /* the chunk's bytes */
    size_t len;
    uint64_t count;
    int32_t *syms;    /* current segmentation */
    int n_syms;
} bpe_word;

struct lp_bpe {
    /* chunk -> word (open addressing; slot holds index + 1) */
    bpe_word *words;
    size_t n_words, words_cap;
    uint32_t *slots;
    size_t slot_mask;

    int n_vocab;
    int32_t merge_left[MAX_VOCAB], merge_right[MAX_VOCAB]; /* by result id */
    int32_t *rank_of;  /* MAX_VOCAB^2 would be big: n_vocab^2 after training */
    int rank_dim;
};

/* ---- GPT-2 pre-tokenizer ---------------------------------------------------
 * Character classes as the runtime's PCRE2 pattern (\\p{L}, \\p{N}, \\s with
 * PCRE2_UCP) sees them, for ASCII and for the non-ASCII characters of the
 * demo world's scripts: Latin-1 and Latin Extended-A, combining marks,
 * Greek, Cyrillic, Armenian, Devanagari (its vowel signs and marks are
 * \\p{M}, not letters; the danda is punctuation), Hangul. Other non-ASCII
 * code points count as letters. */

static bool is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

enum { CLS_SPACE, CLS_LETTER, CLS_DIGIT, CLS_OTHER };

static int cp_class_of(uint32_t c) {
    if (c < 0x80) {
        if (is_space((unsigned char)c)) return CLS_SPACE;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CLS_LETTER;
        return c >= '0' && c <= '9' ? CLS_DIGIT : CLS_OTHER;
    }
    if (c < 0xC0) {
        if (c == 0xAA || c == 0xB5 || c == 0xBA) return CLS_LETTER;
        if (c == 0xB2 || c == 0xB3 || c == 0xB9 || (c >= 0xBC && c <= 0xBE)) return CLS_DIGIT;
        return c == 0x85 || c == 0xA0 ? CLS_SPACE : CLS_OTHER;
    }
    if (c == 0xD7 || c == 0xF7) return CLS_OTHER;
    if ((c >= 0x0300 && c <= 0x036F) || (c >= 0x0483 && c <= 0x0489)) return CLS_OTHER;
    if (c == 0x037E || c == 0x0387 || (c >= 0x055A && c <= 0x055F) || c == 0x0589 || c == 0x058A)
        return CLS_OTHER;
    if (c >= 0x0900 && c <= 0x097F) {
        if (c <= 0x0903 || (c >= 0x093A && c <= 0x093C) || (c >= 0x093E && c <= 0x094F) ||
            (c >= 0x0951 && c <= 0x0957) || c == 0x0962 || c == 0x0963 || c == 0x0964 ||
            c == 0x0965 || c == 0x0970)
            return CLS_OTHER;
        return c >= 0x0966 && c <= 0x096F ? CLS_DIGIT : CLS_LETTER;
    }
    if (c >= 0x2000 && c <= 0x200A) return CLS_SPACE;
    if (c >= 0x200B && c <= 0x206F) return c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F
                                               ? CLS_SPACE : CLS_OTHER;
    if (c == 0x3000) return CLS_SPACE;
    return CLS_LETTER;
}

/* The class of the character at u (n bytes left); *len gets its byte
 * length. A byte that starts no valid sequence counts as one letter. */
static int char_class_at(const unsigned char *u, size_t n, size_t *len) {
    uint32_t c = u[0];
    size_t k = 1;
    if (c >= 0xC2 && c <= 0xDF && n >= 2 && (u[1] & 0xC0) == 0x80) {
        c = ((c & 0x1F) << 6) | (u[1] & 0x3F);
        k = 2;
    } else if (c >= 0xE0 && c <= 0xEF && n >= 3 && (u[1] & 0xC0) == 0x80 && (u[2] & 0xC0) == 0x80) {
        c = ((c & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
        k = 3;
        if (c < 0x800 || (c >= 0xD800 && c <= 0xDFFF)) { c = 0x10FFFF; k = 1; }
    } else if (c >= 0x80) {
        c = 0x10FFFF; /* outside the table: a letter */
    }
    *len = k;
    return cp_class_of(c);
}

/* Length of a contraction ('s 't 're 've 'm 'll 'd) at t, or 0. */
static size_t contraction(const char *t, size_t n) {
    static const char *const forms[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        size_t k = strlen(forms[i]);
        if (k <= n && memcmp(t, forms[i], k) == 0) return k;
    }
    return 0;
}

/* The alternatives of the GPT-2 pattern, in order:
 *   contractions | ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+ | \s+(?!\S) | \s+ */
static size_t next_chunk(const char *t, size_t n) {
    const unsigned char *u = (const unsigned char *)t;
    size_t k = contraction(t, n), len;
    if (k) return k;
    size_t start = u[0] == ' ' && n > 1 && char_class_at(u + 1, n - 1, &len) != CLS_SPACE ? 1 : 0;
    int cls = start < n ? char_class_at(u + start, n - start, &len) : CLS_SPACE;
    if (cls != CLS_SPACE) {
        size_t e = start + len; /* a run of one class (letters, digits or other) */
        while (e < n && char_class_at(u + e, n - e, &len) == cls) e += len;
        return e;
    }
    size_t e = 0;
    while (e < n && char_class_at(u + e, n - e, &len) == CLS_SPACE) e += len;
    if (e == n || e == 1) return e;  /* to the end, or a single space */
    /* leave the last space to the next word */
    size_t last = e - 1;
    while (last > 0 && (u[last] & 0xC0) == 0x80) last--;
    return last > 0 ? last : e; /* one (multi-byte) space: \\s+ takes it */
}

void lp_bpe_pretokenize(const char *text, size_t len,
                        void (*fn)(void *user, const char *chunk, size_t n), void *user) {
    size_t i = 0;
    while (i < len) {
        size_t k = next_chunk(text + i, len - i);
        fn(user, text + i, k);
        i += k;
    }
}

/* ---- word table --------------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

lp_bpe *lp_bpe_create(lp_error *err) {
    lp_bpe *b = calloc(1, sizeof *b);
    if (!b) {
        lp_fail(err, "bpe: out of memory");
        return NULL;
    }
    b->slot_mask = 4095;
    b->slots = calloc(b->slot_mask + 1, sizeof *b->slots);
    if (!b->slots) {
        free(b);
        lp_fail(err, "bpe: out of memory");
        return NULL;
    }
    b->n_vocab = N_SPECIAL + 256;
    return b;
}

void lp_bpe_free(lp_bpe *b) {
    if (!b) return;
    for (size_t i = 0; i < b->n_words; i++) {
        free(b->words[i].text);
        free(b->words[i].syms);
    }
    free(b->words);
    free(b->slots);
    free(b->rank_of);
    free(b);
}

static bool grow_slots(lp_bpe *b) {
    size_t cap = (b->slot_mask + 1) * 2;
    uint32_t *slots = calloc(cap, sizeof *slots);
    if (!slots) return false;
    for (size_t i = 0; i < b->n_words; i++) {
        size_t j = hash_bytes(b->words[i].text, b->words[i].len) & (cap - 1);
        while (slots[j]) j = (j + 1) & (cap - 1);
        slots[j] = (uint32_t)i + 1;
    }
    free(b->slots);
    b->slots = slots;
    b->slot_mask = cap - 1;
    return true;
}

typedef struct add_state {
    lp_bpe *b;
    bool oom;
} add_state;

static void add_chunk(void *user, const char *chunk, size_t n) {
    add_state *st = user;
    lp_bpe *b = st->b;
    if (st->oom) return;
    size_t j = hash_bytes(chunk, n) & b->slot_mask;
    for (; b->slots[j]; j = (j + 1) & b->slot_mask) {
        bpe_word *w = &b->words[b->slots[j] - 1];
        if (w->len == n && memcmp(w->text, chunk, n) == 0) {
            w->count++;
            return;
        }
    }
    if (b->n_words == b->words_cap) {
        size_t cap = b->words_cap ? b->words_cap * 2 : 1024;
        bpe_word *words = realloc(b->words, cap * sizeof *words);
        if (!words) {
            st->oom = true;
            return;
        }
        b->words = words;
        b->words_cap = cap;
    }
    bpe_word w = {.text = malloc(n), .len = n, .count = 1, .syms = malloc(n * sizeof(int32_t))};
    if (!w.text || !w.syms) {
        free(w.text);
        free(w.syms);
        st->oom = true;
        return;
    }
    memcpy(w.text, chunk, n);
    for (size_t i = 0; i < n; i++) w.syms[i] = BYTE0 + (unsigned char)chunk[i];
    w.n_syms = (int)n;
    b->words[b->n_words] = w;
    b->slots[j] = (uint32_t)++b->n_words;
    if (b->n_words * 2 > b->slot_mask && !grow_slots(b)) st->oom = true;
}

int lp_bpe_add_text(lp_bpe *b, const char *text, size_t len, lp_error *err) {
    if (b->rank_of) return lp_fail(err, "bpe: text added after training");
    if (len > (size_t)INT32_MAX) return lp_fail(err, "bpe: text too long");
    add_state st = {.b = b};
    lp_bpe_pretokenize(text, len, add_chunk, &st);
    return st.oom ? lp_fail(err, "bpe: out of memory while counting chunks") : 0;
}

/* ---- training ------------------------------------------------------------------ */

/* Merges every (left, right) in syms into `result`, left to right. */
static int merge_in(int32_t *syms, int n, int32_t left, int32_t right, int32_t result) {
    int o = 0;
    for (int i = 0; i < n; i++) {
        if (i + 1 < n && syms[i] == left && syms[i + 1] == right) {
            syms[o++] = result;
            i++;
        } else {
            syms[o++] = syms[i];
        }
    }
    return o;
}

int lp_bpe_train(lp_bpe *b, int vocab_size, lp_error *err) {
    if (b->rank_of) return lp_fail(err, "bpe: already trained");
    if (vocab_size < N_SPECIAL + 256 || vocab_size > MAX_VOCAB)
        return lp_fail(err, "bpe: vocabulary size %d out of range [%d, %d]", vocab_size,
                       N_SPECIAL + 256, MAX_VOCAB);
    size_t dim = (size_t)vocab_size;
    uint64_t *counts = calloc(dim * dim, sizeof *counts);
    b->rank_of = malloc(dim * dim * sizeof *b->rank_of);
    if (!counts || !b->rank_of) {
        free(counts);
        return lp_fail(err, "bpe: out of memory (pair table for %d tokens)", vocab_size);
    }
    b->rank_dim = vocab_size;
    for (size_t i = 0; i < dim * dim; i++) b->rank_of[i] = -1;

    /* the pairs counted this round, so that clearing and finding the best
     * pair cost the corpus's size, not the table's (vocab_size^2) */
    size_t n_syms = 0;
    for (size_t w = 0; w < b->n_words; w++) n_syms += (size_t)b->words[w].n_syms;
    size_t *touched = malloc((n_syms + 1) * sizeof *touched);
    if (!touched) {
        free(counts);
        return lp_fail(err, "bpe: out of memory (pair list)");
    }
    while (b->n_vocab < vocab_size) {
        size_t n_touched = 0;
        for (size_t w = 0; w < b->n_words; w++) {
            const bpe_word *wd = &b->words[w];
            for (int i = 0; i + 1 < wd->n_syms; i++) {
                size_t p = (size_t)wd->syms[i] * dim + (size_t)wd->syms[i + 1];
                if (counts[p] == 0) touched[n_touched++] = p;
                counts[p] += wd->count;
            }
        }
        /* most frequent pair; ties go to the smallest (left, right) */
        size_t best = 0;
        uint64_t best_count = 0;
        for (size_t k = 0; k < n_touched; k++) {
            size_t p = touched[k];
            if (counts[p] > best_count || (counts[p] == best_count && p < best)) {
                best = p;
                best_count = counts[p];
            }
        }
        for (size_t k = 0; k < n_touched; k++) counts[touched[k]] = 0;
        if (best_count < 2) break; /* nothing left worth merging */
        int32_t left = (int32_t)(best / dim), right = (int32_t)(best % dim);
        int32_t result = b->n_vocab++;
        b->merge_left[result] = left;
        b->merge_right[result] = right;
        b->rank_of[best] = result; /* ranks follow result ids */
        for (size_t w = 0; w < b->n_words; w++) {
            bpe_word *wd = &b->words[w];
            wd->n_syms = merge_in(wd->syms, wd->n_syms, left, right, result);
        }
    }
    free(touched);
    free(counts);
    return 0;
}

int lp_bpe_n_vocab(const lp_bpe *b) { return b->n_vocab; }

/* ---- the trainer's segmentation ---------------------------------------------------- */

typedef struct enc_state {
    const lp_bpe *b;
    int32_t *out;
    int cap;
    size_t n;
    int32_t syms[1024];
    bool too_long;
} enc_state;

/* Applies the merges in the order they were learned: repeatedly the
 * lowest-ranked pair present, every occurrence left to right (a new token's
 * pairs always rank after it, so this is exactly the training order). */
static void encode_chunk(void *user, const char *chunk, size_t n) {
    enc_state *st = user;
    const lp_bpe *b = st->b;
    if (n > sizeof st->syms / sizeof st->syms[0]) {
        st->too_long = true;
        return;
    }
    int m = (int)n;
    for (int i = 0; i < m; i++) st->syms[i] = BYTE0 + (unsigned char)chunk[i];
    size_t dim = (size_t)b->rank_dim;
    for (;;) {
        int32_t best = -1;
        for (int i = 0; i + 1 < m && dim; i++) {
            int32_t r = b->rank_of[(size_t)st->syms[i] * dim + (size_t)st->syms[i + 1]];
            if (r >= 0 && (best < 0 || r < best)) best = r;
        }
        if (best < 0) break;
        m = merge_in(st->syms, m, b->merge_left[best], b->merge_right[best], best);
    }
    for (int i = 0; i < m; i++, st->n++)
        if (st->n < (size_t)st->cap) st->out[st->n] = st->syms[i];
}

int lp_bpe_encode(const lp_bpe *b, const char *text, size_t len, int32_t *out, int cap,
                  lp_error *err) {
    enc_state *st = calloc(1, sizeof *st);
    if (!st) return lp_fail(err, "bpe: out of memory");
    *st = (enc_state){.b = b, .out = out, .cap = cap < 0 ? 0 : cap};
    lp_bpe_pretokenize(text, len, encode_chunk, st);
    bool bad = st->too_long || st->n > (size_t)INT32_MAX;
    int n = (int)st->n;
    free(st);
    return bad ? lp_fail(err, "bpe: chunk or text too long to encode") : n;
}

/* ---- GGUF output ------------------------------------------------------------------------- */

/* GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for
 * themselves, the others get code points 256, 257, ... in byte order. */
static uint32_t byte_to_cp(unsigned char b) {
    bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    if (self) return b;
    uint32_t n = 0;
    for (unsigned c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174)) n++;
    return 256 + n;
}

static size_t put_utf8(uint32_t cp, char *o) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    o[0] = (char)(0xC0 | (cp >> 6)); /* every mapped code point is < 0x800 */
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* Appends the GPT-2 text of token id (its bytes, mapped) to o. */
static size_t token_text(const lp_bpe *b, int32_t id, char *o) {
    if (id < BYTE0 + 256) return put_utf8(byte_to_cp((unsigned char)(id - BYTE0)), o);
    size_t k = token_text(b, b->merge_left[id], o);
    return k + token_text(b, b->merge_right[id], o + k);
}

/* Byte length of a token (for sizing its text: at most 2 bytes per byte). */
static size_t token_bytes(const lp_bpe *b, int32_t id) {
    if (id >= BYTE0 + 256) return token_bytes(b, b->merge_left[id]) + token_bytes(b, b->merge_right[id]);
    return 1;
}

int lp_bpe_write_gguf(const lp_bpe *b, const char *path, lp_error *err) {
    int n = b->n_vocab, n_merges = n - BYTE0 - 256;
    size_t total = 0;
    /* a byte's text is at most 2 UTF-8 bytes; a merge line is both halves
     * plus a space */
    for (int32_t id = BYTE0; id < n; id++) total += 2 * token_bytes(b, id);
    for (int32_t id = BYTE0 + 256; id < n; id++) total += 2 * token_bytes(b, id) + 1;
    char *arena = malloc(total + 64);
    lp_str *tokens = calloc((size_t)n, sizeof *tokens);
    lp_str *merges = calloc((size_t)(n_merges > 0 ? n_merges : 1), sizeof *merges);
    int32_t *types = calloc((size_t)n, sizeof *types);
    lp_gguf_writer *w = lp_gguf_writer_create();
    int rc = -1;
    if (!arena || !tokens || !merges || !types || !w) {
        lp_fail(err, "%s: out of memory", path);
        goto done;
    }
    static const char *const specials[N_SPECIAL] = {"<s>", "</s>", "<pad>"};
    for (int i = 0; i < N_SPECIAL; i++) {
        tokens[i] = (lp_str){specials[i], strlen(specials[i])};
        types[i] = 3; /* control */
    }
    size_t o = 0;
    for (int32_t id = BYTE0; id < n; id++) {
        size_t k = token_text(b, id, arena + o);
        tokens[id] = (lp_str){arena + o, k};
        types[id] = 1; /* normal */
        o += k;
    }
    for (int32_t id = BYTE0 + 256; id < n; id++) {
        char *start = arena + o;
        o += token_text(b, b->merge_left[id], arena + o);
        arena[o++] = ' ';
        o += token_text(b, b->merge_right[id], arena + o);
        merges[id - BYTE0 - 256] = (lp_str){start, (size_t)(arena + o - start)};
    }
    lp_gguf_writer_set_str(w, "general.architecture", "llama");
    lp_gguf_writer_set_str(w, "general.name", "loraplex-world-vocab");
    lp_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    lp_gguf_writer_set_str(w, "tokenizer.ggml.pre", "gpt2");
    lp_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, (uint64_t)n);
    lp_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)n);
    lp_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, (uint64_t)n_merges);
    lp_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", LP_BPE_BOS);
    lp_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", LP_BPE_EOS);
    lp_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", LP_BPE_PAD);
    lp_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    lp_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    rc = lp_gguf_writer_write(w, path, err);
done:
    lp_gguf_writer_free(w);
    free(arena);
    free(tokens);
    free(merges);
    free(types);
    return rc;
}
