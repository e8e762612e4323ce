/* Tokenizer core: the vocabulary tables shared by both tokenizer kinds,
 * accessors, and decoding. Loaders live in load.c, encoding in encode.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

/* ---- hashing ------------------------------------------------------------ */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) { /* splitmix64 finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Smallest power of two >= 2n (load factor <= 0.5 keeps probes short). */
static size_t table_size_for(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    return cap;
}

/* ---- building ----------------------------------------------------------- */

lp_tokenizer *tok_new(int32_t n_vocab, const char *name, lp_error *err) {
    if (n_vocab <= 0 || n_vocab > TOK_MAX_VOCAB) {
        lp_fail(err, "%s: vocabulary size %d out of range (1..%d)", name,
                (int)n_vocab, TOK_MAX_VOCAB);
        return NULL;
    }
    lp_tokenizer *t = calloc(1, sizeof *t);
    if (!t) goto oom;
    snprintf(t->name, sizeof t->name, "%s", name ? name : "tokenizer");
    t->n_vocab = n_vocab;
    t->bos = t->eos = t->eot = t->eom = t->unk = -1;
    t->add_space_prefix = true;
    t->text_off = calloc((size_t)n_vocab, sizeof *t->text_off);
    t->text_len = calloc((size_t)n_vocab, sizeof *t->text_len);
    t->scores = calloc((size_t)n_vocab, sizeof *t->scores);
    t->types = malloc((size_t)n_vocab);
    t->eog = calloc((size_t)n_vocab, 1);
    t->arena_cap = 4096 + (size_t)n_vocab * 8;
    t->arena = malloc(t->arena_cap);
    if (!t->text_off || !t->text_len || !t->scores || !t->types || !t->eog ||
        !t->arena)
        goto oom;
    memset(t->types, TOK_UNUSED, (size_t)n_vocab);
    /* offset 0 holds the empty string every unset token points to */
    t->arena[0] = '\0';
    t->arena_len = 1;
    return t;
oom:
    lp_tokenizer_free(t);
    lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory for a vocabulary of %d tokens", name, (int)n_vocab);
    return NULL;
}

int tok_set_token(lp_tokenizer *t, int32_t id, const char *text, size_t len,
                  float score, int type, lp_error *err) {
    if (id < 0 || id >= t->n_vocab)
        return lp_fail(err, "%s: token id %d out of range", t->name, (int)id);
    if (len > UINT32_MAX / 2)
        return lp_fail(err, "%s: token %d is too long", t->name, (int)id);
    size_t need;
    if (!lp_add_ok(t->arena_len, len + 1, &need))
        return lp_fail(err, "%s: vocabulary too large", t->name);
    if (need > t->arena_cap) {
        size_t cap = t->arena_cap;
        while (cap < need) {
            if (!lp_mul_ok(cap, 2, &cap))
                return lp_fail(err, "%s: vocabulary too large", t->name);
        }
        char *a = realloc(t->arena, cap);
        if (!a) return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", t->name);
        t->arena = a;
        t->arena_cap = cap;
    }
    if (len) memcpy(t->arena + t->arena_len, text, len);
    t->arena[t->arena_len + len] = '\0';
    t->text_off[id] = t->arena_len;
    t->text_len[id] = (uint32_t)len;
    t->arena_len = need;
    t->scores[id] = score;
    t->types[id] = (uint8_t)type;
    return 0;
}

int tok_build_vocab_index(lp_tokenizer *t, lp_error *err) {
    size_t cap = table_size_for((size_t)t->n_vocab);
    free(t->vocab_slots);
    t->vocab_slots = calloc(cap, sizeof *t->vocab_slots);
    if (!t->vocab_slots) return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", t->name);
    t->vocab_mask = cap - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t len = t->text_len[id];
        if (len == 0) continue; /* unset / empty tokens are never looked up */
        const char *s = tok_text(t, id);
        size_t i = hash_bytes(s, len) & t->vocab_mask;
        for (;; i = (i + 1) & t->vocab_mask) {
            int32_t slot = t->vocab_slots[i];
            if (slot == 0) {
                t->vocab_slots[i] = id + 1;
                break;
            }
            int32_t other = slot - 1;
            if (t->text_len[other] == len && memcmp(tok_text(t, other), s, len) == 0) {
                t->vocab_slots[i] = id + 1; /* duplicate text: last one wins */
                break;
            }
        }
    }
    return 0;
}

int32_t tok_lookup(const lp_tokenizer *t, const char *text, size_t len) {
    if (!t->vocab_slots || len == 0) return -1;
    size_t i = hash_bytes(text, len) & t->vocab_mask;
    for (;; i = (i + 1) & t->vocab_mask) {
        int32_t slot = t->vocab_slots[i];
        if (slot == 0) return -1;
        int32_t id = slot - 1;
        if (t->text_len[id] == len && memcmp(tok_text(t, id), text, len) == 0) return id;
    }
}

int tok_reserve_merges(lp_tokenizer *t, size_t n, lp_error *err) {
    size_t cap = table_size_for(n);
    size_t bytes;
    if (!lp_mul_ok(cap, sizeof *t->merge_slots, &bytes))
        return lp_fail(err, "%s: too many merges", t->name);
    free(t->merge_slots);
    t->merge_slots = calloc(cap, sizeof *t->merge_slots);
    if (!t->merge_slots) return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory for merges", t->name);
    t->merge_mask = cap - 1;
    t->n_merges = 0;
    return 0;
}

static uint64_t merge_key(int32_t left, int32_t right) {
    return (((uint64_t)(uint32_t)left << 32) | (uint32_t)right) + 1;
}

void tok_add_merge(lp_tokenizer *t, const char *left, size_t left_len,
                   const char *right, size_t right_len, int32_t rank) {
    /* never fill the table past its reserved load factor */
    if (!t->merge_slots || t->n_merges >= (t->merge_mask + 1) / 2) return;
    int32_t l = tok_lookup(t, left, left_len);
    int32_t r = tok_lookup(t, right, right_len);
    if (l < 0 || r < 0) return;
    /* the merged text, built in a small stack buffer (or skipped if huge) */
    char buf[512];
    if (left_len + right_len > sizeof buf) return;
    memcpy(buf, left, left_len);
    memcpy(buf + left_len, right, right_len);
    int32_t result = tok_lookup(t, buf, left_len + right_len);
    if (result < 0) return;
    uint64_t key = merge_key(l, r);
    size_t i = hash_u64(key) & t->merge_mask;
    for (;; i = (i + 1) & t->merge_mask) {
        tok_merge_slot *s = &t->merge_slots[i];
        if (s->key == 0) {
            s->key = key;
            s->rank = rank;
            s->result = result;
            t->n_merges++;
            return;
        }
        if (s->key == key) {
            if (rank < s->rank) s->rank = rank;
            return;
        }
    }
}

bool tok_find_merge(const lp_tokenizer *t, int32_t left, int32_t right,
                    int32_t *rank, int32_t *result) {
    if (!t->merge_slots || left < 0 || right < 0) return false;
    uint64_t key = merge_key(left, right);
    size_t i = hash_u64(key) & t->merge_mask;
    for (;; i = (i + 1) & t->merge_mask) {
        const tok_merge_slot *s = &t->merge_slots[i];
        if (s->key == 0) return false;
        if (s->key == key) {
            *rank = s->rank;
            *result = s->result;
            return true;
        }
    }
}

/* ---- GPT-2 byte <-> unicode --------------------------------------------- */

/* Printable Latin-1 bytes map to themselves; the other 68 bytes (0..32,
 * 127..160, 173) map, in order, to U+0100..U+0143 so that every byte
 * becomes a visible character. */
uint32_t tok_byte_to_cp(uint8_t b) {
    if (b <= 32) return 256 + b;
    if (b >= 127 && b <= 160) return 256 + 33 + (b - 127);
    if (b == 173) return 256 + 67;
    return b;
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp <= 32 || (cp >= 127 && cp <= 160) || cp == 173) return -1;
    if (cp < 256) return (int)cp;
    if (cp < 256 + 33) return (int)(cp - 256);
    if (cp < 256 + 67) return (int)(cp - 256 - 33 + 127);
    if (cp == 256 + 67) return 173;
    return -1;
}

int tok_utf8_put(uint32_t cp, char *out) {
    uint8_t *o = (uint8_t *)out;
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes one UTF-8 code point of a (valid) token text; returns its length. */
static int utf8_get(const uint8_t *s, size_t avail, uint32_t *cp) {
    int n = lp_utf8_len(s, avail);
    if (n <= 1) {
        *cp = s[0];
        return 1;
    }
    uint32_t c = s[0] & (0x7F >> n);
    for (int i = 1; i < n; i++) c = (c << 6) | (s[i] & 0x3F);
    *cp = c;
    return n;
}

/* ---- finishing ---------------------------------------------------------- */

static int parse_byte_token(const char *s, size_t len) {
    /* "<0xAB>" */
    if (len != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = (c >= '0' && c <= '9') ? c - '0'
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static bool is_eog_name(const char *s) {
    static const char *const names[] = {"<|eot_id|>", "<|eom_id|>", "<|im_end|>",
                                        "<|endoftext|>", "</s>", "<|end_of_text|>"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i]) == 0) return true;
    return false;
}

int tok_finish(lp_tokenizer *t, lp_error *err) {
    if (!t->vocab_slots && tok_build_vocab_index(t, err) != 0) return -1;

    /* byte fallback / byte alphabet */
    for (int b = 0; b < 256; b++) {
        if (t->kind == LP_TOK_SPM) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->byte_token[b] = tok_lookup(t, name, 6);
        } else {
            char u[4];
            int n = tok_utf8_put(tok_byte_to_cp((uint8_t)b), u);
            t->byte_token[b] = tok_lookup(t, u, (size_t)n);
        }
    }
    if (t->kind == LP_TOK_SPM) { /* files without types: recognise <0xXX> */
        for (int32_t id = 0; id < t->n_vocab; id++)
            if (t->types[id] == TOK_NORMAL &&
                parse_byte_token(tok_text(t, id), t->text_len[id]) >= 0)
                t->types[id] = TOK_BYTE;
    }

    /* special tokens matched in input text, bucketed by first byte, longest
     * first (ties: lower id). Key: first byte | 2^24 - length | id. */
    int n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if ((t->types[id] == TOK_CONTROL || t->types[id] == TOK_USER_DEFINED) &&
            t->text_len[id] > 0)
            n++;
    free(t->specials);
    t->specials = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    uint64_t *order = malloc(sizeof(uint64_t) * (size_t)(n ? n : 1));
    if (!t->specials || !order) {
        free(order);
        return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", t->name);
    }
    t->n_specials = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint32_t len = t->text_len[id];
        if ((t->types[id] != TOK_CONTROL && t->types[id] != TOK_USER_DEFINED) || len == 0)
            continue;
        uint64_t first = (uint8_t)tok_text(t, id)[0];
        uint64_t inv_len = 0xFFFFFFu - (len < 0xFFFFFFu ? len : 0xFFFFFFu);
        order[t->n_specials++] = (first << 46) | (inv_len << 22) | (uint32_t)id;
    }
    qsort(order, (size_t)t->n_specials, sizeof *order, cmp_u64);
    memset(t->special_bucket, 0, sizeof t->special_bucket);
    for (int i = 0; i < t->n_specials; i++) {
        t->specials[i] = (int32_t)(order[i] & 0x3FFFFFu);
        t->special_bucket[(order[i] >> 46) + 1]++;
    }
    for (int b = 0; b < 256; b++) t->special_bucket[b + 1] += t->special_bucket[b];
    free(order);

    /* ids out of range mean "none" */
    int32_t *ids[] = {&t->bos, &t->eos, &t->eot, &t->eom, &t->unk};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (*ids[i] < 0 || *ids[i] >= t->n_vocab) *ids[i] = -1;
    if (t->bos < 0) t->add_bos = false;

    for (size_t i = 1; i < 4; i++)
        if (*ids[i] >= 0) t->eog[*ids[i]] = 1;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->types[id] == TOK_CONTROL && is_eog_name(tok_text(t, id))) t->eog[id] = 1;

    if (t->kind == LP_TOK_BPE) return tok_compile_regex(t, err);
    t->pretok = LP_PRETOK_NONE;
    return 0;
}

/* ---- public accessors ---------------------------------------------------- */

void lp_tokenizer_free(lp_tokenizer *t) {
    if (!t) return;
    free(t->arena);
    free(t->text_off);
    free(t->text_len);
    free(t->scores);
    free(t->types);
    free(t->eog);
    free(t->vocab_slots);
    free(t->merge_slots);
    free(t->specials);
    if (t->regex) pcre2_code_free(t->regex);
    free(t->chat_template);
    free(t);
}

lp_tok_kind lp_tokenizer_kind(const lp_tokenizer *t) { return t->kind; }
lp_pretok lp_tokenizer_pretok(const lp_tokenizer *t) { return t->pretok; }
int32_t lp_tokenizer_n_vocab(const lp_tokenizer *t) { return t->n_vocab; }
int32_t lp_tokenizer_bos(const lp_tokenizer *t) { return t->bos; }
int32_t lp_tokenizer_eos(const lp_tokenizer *t) { return t->eos; }
bool lp_tokenizer_add_bos(const lp_tokenizer *t) { return t->add_bos; }

bool lp_tokenizer_is_eog(const lp_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

const char *lp_tokenizer_token_text(const lp_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->text_len[id];
    return tok_text(t, id);
}

int32_t lp_tokenizer_lookup(const lp_tokenizer *t, const char *text, size_t len) {
    return tok_lookup(t, text, len);
}

/* ---- decoding ----------------------------------------------------------- */

/* Appends bytes to buf[0..cap) at *pos, counting what does not fit. */
static void put_bytes(char *buf, size_t cap, size_t *pos, const void *src, size_t n) {
    if (*pos < cap) {
        size_t room = cap - *pos;
        memcpy(buf + *pos, src, n < room ? n : room);
    }
    *pos += n;
}

static void decode_spm_text(const char *s, size_t len, char *buf, size_t cap, size_t *pos) {
    static const char meta[] = "\xe2\x96\x81"; /* ▁ U+2581 */
    size_t start = 0;
    for (size_t i = 0; i + 3 <= len;) {
        if (memcmp(s + i, meta, 3) == 0) {
            put_bytes(buf, cap, pos, s + start, i - start);
            put_bytes(buf, cap, pos, " ", 1);
            i += 3;
            start = i;
        } else {
            i++;
        }
    }
    put_bytes(buf, cap, pos, s + start, len - start);
}

static void decode_bpe_text(const char *s, size_t len, char *buf, size_t cap, size_t *pos) {
    const uint8_t *u = (const uint8_t *)s;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int n = utf8_get(u + i, len - i, &cp);
        int b = tok_cp_to_byte(cp);
        if (b >= 0) {
            uint8_t c = (uint8_t)b;
            put_bytes(buf, cap, pos, &c, 1);
        } else {
            put_bytes(buf, cap, pos, s + i, (size_t)n); /* not a mapped byte: as is */
        }
        i += (size_t)n;
    }
}

static void decode_normal(const lp_tokenizer *t, const char *s, size_t len, char *buf,
                          size_t cap, size_t *pos) {
    if (t->kind == LP_TOK_SPM)
        decode_spm_text(s, len, buf, cap, pos);
    else
        decode_bpe_text(s, len, buf, cap, pos);
}

size_t lp_tokenizer_decode_token(const lp_tokenizer *t, int32_t id,
                                 bool render_special, char *buf, size_t cap) {
    if (id < 0 || id >= t->n_vocab) return 0;
    const char *s = tok_text(t, id);
    size_t len = t->text_len[id], pos = 0;
    switch (t->types[id]) {
    case TOK_CONTROL:
    case TOK_UNKNOWN:
    case TOK_UNUSED:
        if (render_special) put_bytes(buf, cap, &pos, s, len);
        break;
    case TOK_USER_DEFINED:
        put_bytes(buf, cap, &pos, s, len);
        break;
    case TOK_BYTE: {
        int v = t->kind == LP_TOK_SPM ? parse_byte_token(s, len) : -1;
        if (v >= 0) {
            uint8_t c = (uint8_t)v;
            put_bytes(buf, cap, &pos, &c, 1);
        } else {
            decode_normal(t, s, len, buf, cap, &pos);
        }
        break;
    }
    default:
        decode_normal(t, s, len, buf, cap, &pos);
        break;
    }
    return pos;
}

size_t lp_tokenizer_decode(const lp_tokenizer *t, const int32_t *ids, int n,
                           bool strip_leading_space, char *buf, size_t cap) {
    size_t pos = 0;
    bool at_start = t->kind == LP_TOK_SPM && t->add_space_prefix && strip_leading_space;
    char piece[256];
    for (int i = 0; i < n; i++) {
        size_t need = lp_tokenizer_decode_token(t, ids[i], false, piece, sizeof piece);
        const char *src = piece;
        char *big = NULL;
        if (need > sizeof piece) { /* rare: a very long token */
            big = malloc(need);
            if (!big) continue;
            lp_tokenizer_decode_token(t, ids[i], false, big, need);
            src = big;
        }
        size_t skip = 0;
        if (at_start && need > 0) {
            if (src[0] == ' ') skip = 1;
            at_start = false;
        }
        put_bytes(buf, cap, &pos, src + skip, need - skip);
        free(big);
    }
    if (pos < cap) buf[pos] = '\0';
    return pos;
}
