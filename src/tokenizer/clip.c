/* The CLIP byte-level BPE tokenizer (see clip.h). Tokens are kept as the
 * merge list writes them (byte symbols mapped through GPT-2's
 * bytes_to_unicode, `</w>` appended to a word's last symbol), exactly as
 * Hugging Face's vocabulary holds them, so a merge (a, b) makes the token
 * whose string is a's then b's. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "clip.h"

#include <locale.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <wctype.h>

#define CLIP_MAX_TEXT ((size_t)1 << 20)
#define CLIP_MAX_MERGES (1 << 20)
#define CLIP_MAX_TOKEN_BYTES 4096

static const char clip_pattern[] =
    "<\\|startoftext\\|>|<\\|endoftext\\|>|'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|[^\\s\\p{L}\\p{N}]+";

struct lp_clip_tokenizer {
    int32_t n_tokens;   /* 512 + merges; the two specials follow */
    /* token i's string: chars[off[i] .. off[i] + len[i]) */
    uint32_t *off, *len;
    char *chars;
    size_t chars_len, chars_cap;
    int32_t *str_slot;  /* open addressing over token strings: id or -1 */
    uint32_t str_mask;
    uint64_t *pair_key; /* (a << 32 | b) + 1; 0 = empty */
    int32_t *pair_rank;
    uint32_t pair_mask;
    int32_t byte_id[256], byte_eow_id[256]; /* a byte's symbol, plain and word-final */
    pcre2_code *re;
    locale_t lower;     /* C.UTF-8 for towlower_l; (locale_t)0: ASCII only */
};

/* ---- bytes_to_unicode --------------------------------------------------------------- */

static bool printable_byte(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

/* GPT-2's table: printable bytes map to themselves and come first in the
 * vocabulary; the other 68 map to 256 + n in byte order, after them. */
static void byte_order(uint8_t order[256], uint32_t cp[256]) {
    int n = 0, k = 0;
    for (int b = 0; b < 256; b++)
        if (printable_byte(b)) order[k++] = (uint8_t)b, cp[b] = (uint32_t)b;
    for (int b = 0; b < 256; b++)
        if (!printable_byte(b)) order[k++] = (uint8_t)b, cp[b] = 256u + (uint32_t)n++;
}

static int put_utf8(char *dst, uint32_t c) {
    if (c < 0x80) return dst[0] = (char)c, 1;
    if (c < 0x800) return dst[0] = (char)(0xc0 | c >> 6), dst[1] = (char)(0x80 | (c & 0x3f)), 2;
    if (c < 0x10000) {
        dst[0] = (char)(0xe0 | c >> 12), dst[1] = (char)(0x80 | ((c >> 6) & 0x3f));
        dst[2] = (char)(0x80 | (c & 0x3f));
        return 3;
    }
    dst[0] = (char)(0xf0 | c >> 18), dst[1] = (char)(0x80 | ((c >> 12) & 0x3f));
    dst[2] = (char)(0x80 | ((c >> 6) & 0x3f)), dst[3] = (char)(0x80 | (c & 0x3f));
    return 4;
}

/* Decodes one UTF-8 code point of s[0..n) (n >= 1): its length, or 0 when
 * the bytes are not valid UTF-8 (lp_utf8_len checks the form). */
static int get_utf8(const uint8_t *s, size_t n, uint32_t *c) {
    int l = lp_utf8_len(s, n);
    if (l <= 0) return 0;
    if (l == 1) *c = s[0];
    else if (l == 2) *c = (uint32_t)(s[0] & 0x1f) << 6 | (s[1] & 0x3f);
    else if (l == 3) *c = (uint32_t)(s[0] & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
    else *c = (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3f) << 12 | (uint32_t)(s[2] & 0x3f) << 6 | (s[3] & 0x3f);
    return l;
}

/* ---- tables ---------------------------------------------------------------------------- */

static uint32_t hash_bytes(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static uint32_t hash_pair(uint64_t k) { return (uint32_t)((k * 0x9e3779b97f4a7c15ull) >> 32); }

static int32_t str_find(const lp_clip_tokenizer *t, const char *s, size_t n) {
    for (uint32_t i = hash_bytes(s, n) & t->str_mask;; i = (i + 1) & t->str_mask) {
        int32_t id = t->str_slot[i];
        if (id < 0) return -1;
        if (t->len[id] == n && memcmp(t->chars + t->off[id], s, n) == 0) return id;
    }
}

static void str_insert(lp_clip_tokenizer *t, int32_t id) {
    uint32_t i = hash_bytes(t->chars + t->off[id], t->len[id]) & t->str_mask;
    while (t->str_slot[i] >= 0) i = (i + 1) & t->str_mask;
    t->str_slot[i] = id;
}

/* The rank of merge (a, b), or -1. */
static int32_t pair_find(const lp_clip_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    for (uint32_t i = hash_pair(key) & t->pair_mask;; i = (i + 1) & t->pair_mask) {
        if (t->pair_key[i] == 0) return -1;
        if (t->pair_key[i] == key) return t->pair_rank[i];
    }
}

static void pair_insert(lp_clip_tokenizer *t, int32_t a, int32_t b, int32_t rank) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    uint32_t i = hash_pair(key) & t->pair_mask;
    while (t->pair_key[i] != 0) i = (i + 1) & t->pair_mask;
    t->pair_key[i] = key;
    t->pair_rank[i] = rank;
}

/* Appends a token string (the caller checked capacity); its id is the next. */
static int32_t add_token(lp_clip_tokenizer *t, const char *a, size_t na, const char *b, size_t nb) {
    int32_t id = t->n_tokens++;
    t->off[id] = (uint32_t)t->chars_len;
    t->len[id] = (uint32_t)(na + nb);
    memcpy(t->chars + t->chars_len, a, na);
    memcpy(t->chars + t->chars_len + na, b, nb);
    t->chars_len += na + nb;
    str_insert(t, id);
    return id;
}

static uint32_t pow2_above(size_t n) {
    uint32_t c = 1;
    while (c < 2 * n) c <<= 1;
    return c;
}

/* ---- loading ------------------------------------------------------------------------------ */

void lp_clip_tokenizer_free(lp_clip_tokenizer *t) {
    if (!t) return;
    free(t->off), free(t->len), free(t->chars), free(t->str_slot), free(t->pair_key), free(t->pair_rank);
    if (t->re) pcre2_code_free(t->re);
    if (t->lower != (locale_t)0) freelocale(t->lower);
    free(t);
}

static int compile_pattern(lp_clip_tokenizer *t, lp_error *err) {
    int code;
    PCRE2_SIZE at;
    /* MATCH_INVALID_UTF: invalid UTF-8 never matches, so it is dropped with
     * the other gaps between matches */
    t->re = pcre2_compile((PCRE2_SPTR)clip_pattern, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_CASELESS, &code, &at, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return lp_fail(err, "CLIP pre-tokenizer regex: %s at %zu", (const char *)msg, (size_t)at);
    }
    pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); /* optional speed-up */
    return 0;
}

/* Counts merge lines and checks each is "A B" with both parts non-empty. */
static int count_merges(const char *text, size_t len, const char *name, size_t *n_merges, lp_error *err) {
    size_t n = 0, line = 0;
    for (size_t p = 0; p < len;) {
        const char *nl = memchr(text + p, '\n', len - p);
        size_t e = nl ? (size_t)(nl - text) : len, l = e - p;
        line++;
        if (l && text[p + l - 1] == '\r') l--;
        if (l && !(line == 1 && l >= 8 && memcmp(text + p, "#version", 8) == 0)) {
            const char *sp = memchr(text + p, ' ', l);
            if (!sp || sp == text + p || sp == text + p + l - 1 || memchr(sp + 1, ' ', l - (size_t)(sp - text - p) - 1))
                return lp_fail(err, "%s: line %zu: a merge is two tokens separated by one space", name, line);
            if (++n > CLIP_MAX_MERGES) return lp_fail(err, "%s: more than %d merges", name, CLIP_MAX_MERGES);
        }
        p = e + 1;
    }
    *n_merges = n;
    return 0;
}

static int add_merges(lp_clip_tokenizer *t, const char *text, size_t len, const char *name, lp_error *err) {
    size_t line = 0;
    for (size_t p = 0; p < len;) {
        const char *nl = memchr(text + p, '\n', len - p);
        size_t e = nl ? (size_t)(nl - text) : len, l = e - p;
        line++;
        if (l && text[p + l - 1] == '\r') l--;
        if (l && !(line == 1 && l >= 8 && memcmp(text + p, "#version", 8) == 0)) {
            const char *a = text + p, *sp = memchr(a, ' ', l), *b = sp + 1;
            size_t na = (size_t)(sp - a), nb = l - na - 1;
            int32_t ia = str_find(t, a, na), ib = str_find(t, b, nb);
            if (ia < 0 || ib < 0)
                return lp_fail(err, "%s: line %zu: merge of '%.*s', a token not defined before", name, line,
                               (int)(ia < 0 ? na : nb), ia < 0 ? a : b);
            if (na + nb > CLIP_MAX_TOKEN_BYTES) return lp_fail(err, "%s: line %zu: token too long", name, line);
            if (pair_find(t, ia, ib) >= 0) return lp_fail(err, "%s: line %zu: repeated merge", name, line);
            int32_t rank = t->n_tokens - 512;
            /* the merged string may already be a token (a different split of
             * it): the vocabulary would then map one string to two ids */
            char buf[CLIP_MAX_TOKEN_BYTES];
            memcpy(buf, a, na);
            memcpy(buf + na, b, nb);
            if (str_find(t, buf, na + nb) >= 0)
                return lp_fail(err, "%s: line %zu: merge makes '%.*s', already a token", name, line,
                               (int)(na + nb), buf);
            add_token(t, a, na, b, nb);
            pair_insert(t, ia, ib, rank);
        }
        p = e + 1;
    }
    return 0;
}

lp_clip_tokenizer *lp_clip_tokenizer_parse(const char *text, size_t len, const char *name, lp_error *err) {
    size_t n_merges = 0;
    if (count_merges(text, len, name, &n_merges, err)) return NULL;
    lp_clip_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", name), NULL;
    size_t n_tok = 512 + n_merges;
    t->str_mask = pow2_above(n_tok) - 1;
    t->pair_mask = pow2_above(n_merges + 1) - 1;
    t->chars_cap = len + 512 * 8; /* merged strings total at most the file's bytes */
    t->off = malloc(n_tok * sizeof *t->off);
    t->len = malloc(n_tok * sizeof *t->len);
    t->chars = malloc(t->chars_cap);
    t->str_slot = malloc(((size_t)t->str_mask + 1) * sizeof *t->str_slot);
    t->pair_key = calloc((size_t)t->pair_mask + 1, sizeof *t->pair_key);
    t->pair_rank = malloc(((size_t)t->pair_mask + 1) * sizeof *t->pair_rank);
    if (!t->off || !t->len || !t->chars || !t->str_slot || !t->pair_key || !t->pair_rank) {
        lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", name);
        goto fail;
    }
    memset(t->str_slot, 0xff, ((size_t)t->str_mask + 1) * sizeof *t->str_slot);
    uint8_t order[256];
    uint32_t cp[256];
    byte_order(order, cp);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < 256; i++) {
            char sym[4];
            int n = put_utf8(sym, cp[order[i]]);
            int32_t id = add_token(t, sym, (size_t)n, "</w>", pass ? 4 : 0);
            (pass ? t->byte_eow_id : t->byte_id)[order[i]] = id;
        }
    if (add_merges(t, text, len, name, err)) goto fail;
    if (compile_pattern(t, err)) goto fail;
    t->lower = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
    return t;
fail:
    lp_clip_tokenizer_free(t);
    return NULL;
}

lp_clip_tokenizer *lp_clip_tokenizer_load(const char *path, lp_error *err) {
    char *text;
    size_t size;
    if (lp_read_file(path, &text, &size, (size_t)64 << 20, err)) return NULL;
    lp_clip_tokenizer *t = lp_clip_tokenizer_parse(text, size, path, err);
    free(text);
    return t;
}

int32_t lp_clip_vocab_size(const lp_clip_tokenizer *t) { return t->n_tokens + 2; }
int32_t lp_clip_bos(const lp_clip_tokenizer *t) { return t->n_tokens; }
int32_t lp_clip_eos(const lp_clip_tokenizer *t) { return t->n_tokens + 1; }

/* ---- encoding -------------------------------------------------------------------------------- */

static bool clip_space(uint32_t c) {
    return c == ' ' || (c >= 9 && c <= 13) || c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
           c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000 || c == 0xfeff;
}

/* Lower-cases text and turns whitespace runs into one space, into out (at
 * most 4 bytes per input byte: a code point's lower case never needs more
 * than 4 bytes). Invalid UTF-8 bytes are copied as they are. */
static size_t normalise(const lp_clip_tokenizer *t, const uint8_t *s, size_t n, char *out) {
    size_t o = 0;
    bool in_space = false;
    for (size_t i = 0; i < n;) {
        uint32_t c;
        int l = get_utf8(s + i, n - i, &c);
        if (l == 0) {
            out[o++] = (char)s[i++];
            in_space = false;
            continue;
        }
        i += (size_t)l;
        if (clip_space(c)) {
            if (!in_space) out[o++] = ' ';
            in_space = true;
            continue;
        }
        in_space = false;
        if (c < 0x80) {
            out[o++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
        } else {
            uint32_t lc = c;
            if (t->lower != (locale_t)0) lc = (uint32_t)towlower_l((wint_t)c, t->lower);
            if (lc > 0x10ffff || (lc >= 0xd800 && lc <= 0xdfff)) lc = c;
            o += (size_t)put_utf8(out + o, lc);
        }
    }
    return o;
}

typedef struct clip_out {
    int32_t *ids;
    int cap, n;   /* ids kept, and counted */
    int32_t *sym; /* one piece's symbols */
} clip_out;

static void emit(clip_out *o, int32_t id) {
    if (o->n < o->cap) o->ids[o->n] = id;
    o->n++;
}

/* BPE of one piece: byte symbols (the last one word-final), then the
 * lowest-ranked adjacent pair merged, leftmost first, until none is a
 * merge. The token a merge makes is 512 + its rank. */
static void bpe_piece(const lp_clip_tokenizer *t, const uint8_t *p, size_t n, clip_out *o) {
    int32_t *s = o->sym;
    size_t m = n;
    for (size_t i = 0; i < n; i++) s[i] = i + 1 == n ? t->byte_eow_id[p[i]] : t->byte_id[p[i]];
    while (m > 1) {
        int32_t best = -1;
        size_t at = 0;
        for (size_t i = 0; i + 1 < m; i++) {
            int32_t r = pair_find(t, s[i], s[i + 1]);
            if (r >= 0 && (best < 0 || r < best)) best = r, at = i;
        }
        if (best < 0) break;
        s[at] = 512 + best;
        memmove(s + at + 1, s + at + 2, (m - at - 2) * sizeof *s);
        m--;
    }
    for (size_t i = 0; i < m; i++) emit(o, s[i]);
}

int lp_clip_encode(const lp_clip_tokenizer *t, const char *text, size_t len, int32_t pad_id, int32_t *ids,
                   int n_ctx, int *n_tokens, lp_error *err) {
    if (n_ctx < 2) return lp_fail(err, "CLIP encode: a context of %d tokens has no room for BOS and EOS", n_ctx);
    if (len > CLIP_MAX_TEXT) return lp_fail(err, "CLIP encode: prompt of %zu bytes (at most %zu)", len, CLIP_MAX_TEXT);
    char *norm = malloc(4 * len + 1);
    int32_t *sym = malloc((4 * len + 1) * sizeof *sym);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
    if (!norm || !sym || !md) {
        free(norm), free(sym);
        if (md) pcre2_match_data_free(md);
        return lp_error_set(err, LP_ERR_NOMEM, "CLIP encode: out of memory");
    }
    size_t n = normalise(t, (const uint8_t *)text, len, norm);
    clip_out o = {.ids = ids + 1, .cap = n_ctx - 2, .sym = sym};
    for (size_t at = 0; at < n;) {
        int rc = pcre2_match(t->re, (PCRE2_SPTR)norm, n, at, 0, md, NULL);
        if (rc < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t b = ov[0], e = ov[1];
        if (e == b) { /* cannot happen with this pattern; never loop */
            at = b + 1;
            continue;
        }
        const char *piece = norm + b;
        if (e - b == 15 && memcmp(piece, "<|startoftext|>", 15) == 0)
            emit(&o, lp_clip_bos(t));
        else if (e - b == 13 && memcmp(piece, "<|endoftext|>", 13) == 0)
            emit(&o, lp_clip_eos(t));
        else
            bpe_piece(t, (const uint8_t *)piece, e - b, &o);
        at = e;
    }
    pcre2_match_data_free(md);
    free(norm), free(sym);
    int kept = o.n < o.cap ? o.n : o.cap;
    ids[0] = lp_clip_bos(t);
    ids[kept + 1] = lp_clip_eos(t);
    for (int i = kept + 2; i < n_ctx; i++) ids[i] = pad_id;
    if (n_tokens) *n_tokens = o.n;
    return 0;
}

int lp_clip_token_text(const lp_clip_tokenizer *t, int32_t id, char *buf, size_t cap) {
    if (cap == 0) return -1;
    if (id == lp_clip_bos(t) || id == lp_clip_eos(t)) {
        const char *s = id == lp_clip_bos(t) ? "<|startoftext|>" : "<|endoftext|>";
        size_t l = strlen(s) < cap - 1 ? strlen(s) : cap - 1;
        memcpy(buf, s, l);
        buf[l] = 0;
        return (int)l;
    }
    if (id < 0 || id >= t->n_tokens) return -1;
    uint8_t order[256];
    uint32_t cp[256];
    byte_order(order, cp);
    const uint8_t *s = (const uint8_t *)t->chars + t->off[id];
    size_t n = t->len[id], o = 0;
    bool eow = n >= 4 && memcmp(s + n - 4, "</w>", 4) == 0;
    if (eow) n -= 4;
    for (size_t i = 0; i < n && o + 1 < cap;) {
        uint32_t c = 0;
        int l = get_utf8(s + i, n - i, &c);
        if (l == 0) return -1; /* token strings are built from valid symbols */
        i += (size_t)l;
        for (int b = 0; b < 256; b++)
            if (cp[b] == c) {
                buf[o++] = (char)b;
                break;
            }
    }
    if (eow && o + 1 < cap) buf[o++] = ' ';
    buf[o] = 0;
    return (int)o;
}
