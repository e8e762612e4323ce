/* Encoding: special-token splitting, then per fragment either
 *   SentencePiece BPE: "▁" for spaces, dummy prefix, merge the adjacent pair
 *   whose concatenation is the best-scoring token, byte fallback; or
 *   byte-level BPE: pre-tokenizer regex, GPT-2 byte alphabet, merge the
 *   adjacent pair with the lowest merge rank.
 * Both merge loops share one engine: a doubly linked list of symbols and a
 * binary heap of candidate pairs, so a text of n characters costs
 * O(n log n) rather than the O(n^2) of rescanning for the best pair. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

/* ---- pre-tokenizer patterns ---------------------------------------------- */

/* As written in the upstream tokenizers (GPT-2's encoder.py, Llama 3's
 * tiktoken setup, Qwen2's tokenizer.json). */
const char *const tok_pattern_gpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char *const tok_pattern_llama3 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char *const tok_pattern_qwen2 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* Hugging Face evaluates these with Oniguruma, whose Unicode \s also
 * matches U+0085 (NEL); PCRE2 10.42's \s under UCP does not. Spelling \s
 * and \S out keeps the two engines in agreement. */
static char *pcre2_dialect(const char *pattern) {
    static const char ws[] = "\\s\\x{85}";
    size_t n = strlen(pattern), cap = n * 6 + 1, o = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = pattern[i];
        if (c == '\\' && i + 1 < n) {
            char d = pattern[i + 1];
            if (d == 's') {
                o += (size_t)sprintf(out + o, in_class ? "%s" : "[%s]", ws);
            } else if (d == 'S' && !in_class) {
                o += (size_t)sprintf(out + o, "[^%s]", ws);
            } else {
                out[o++] = c;
                out[o++] = d;
            }
            i++;
            continue;
        }
        if (c == '[') in_class = true;
        else if (c == ']') in_class = false;
        out[o++] = c;
    }
    out[o] = '\0';
    return out;
}

int tok_compile_regex(lp_tokenizer *t, lp_error *err) {
    const char *pattern = t->pretok == LP_PRETOK_LLAMA3 ? tok_pattern_llama3
                        : t->pretok == LP_PRETOK_QWEN2  ? tok_pattern_qwen2
                                                        : tok_pattern_gpt2;
    char *dialect = pcre2_dialect(pattern);
    if (!dialect) return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", t->name);
    int code;
    PCRE2_SIZE at;
    /* MATCH_INVALID_UTF: invalid UTF-8 never matches, so those bytes fall
     * into the gaps between matches and are encoded bytewise. */
    t->regex = pcre2_compile((PCRE2_SPTR)dialect, PCRE2_ZERO_TERMINATED,
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                             &code, &at, NULL);
    free(dialect);
    if (!t->regex) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return lp_fail(err, "%s: pre-tokenizer regex: %s at %zu", t->name,
                       (const char *)msg, (size_t)at);
    }
    pcre2_jit_compile(t->regex, PCRE2_JIT_COMPLETE); /* optional speed-up */
    return 0;
}

/* ---- scratch state of one encode call ------------------------------------ */

typedef struct sym {
    int32_t start, len; /* bytes of the working text */
    int32_t id;         /* token id of this piece, -1 if not a token */
    int32_t prev, next; /* linked list of live symbols */
} sym;

typedef struct cand { /* a candidate merge of two adjacent symbols */
    double cost;        /* lower merges first: -score or rank */
    int32_t left, right;
    int32_t left_id, right_id, size, result;
} cand;

typedef struct enc {
    const lp_tokenizer *t;
    sym *syms;
    size_t syms_cap;
    cand *heap;
    size_t heap_len, heap_cap;
    char *buf;
    size_t buf_cap;
    pcre2_match_data *md;
    /* output */
    int32_t *out;
    int cap;
    size_t n_out;
    bool oom;
} enc;

static void emit(enc *e, int32_t id) {
    if (id < 0) return;
    if (e->n_out < (size_t)e->cap) e->out[e->n_out] = id;
    e->n_out++;
}

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

/* ---- heap ------------------------------------------------------------------ */

static bool cand_before(const cand *a, const cand *b) {
    return a->cost < b->cost || (a->cost == b->cost && a->left < b->left);
}

static void heap_push(enc *e, cand c) {
    if (!grow((void **)&e->heap, &e->heap_cap, e->heap_len + 1, sizeof(cand))) {
        e->oom = true;
        return;
    }
    size_t i = e->heap_len++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_before(&c, &e->heap[parent])) break;
        e->heap[i] = e->heap[parent];
        i = parent;
    }
    e->heap[i] = c;
}

static cand heap_pop(enc *e) {
    cand top = e->heap[0];
    cand last = e->heap[--e->heap_len];
    size_t i = 0, n = e->heap_len;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && cand_before(&e->heap[child + 1], &e->heap[child])) child++;
        if (!cand_before(&e->heap[child], &last)) break;
        e->heap[i] = e->heap[child];
        i = child;
    }
    if (n) e->heap[i] = last;
    return top;
}

/* ---- the merge engine ------------------------------------------------------- */

static bool spm_mergeable(int type) {
    return type == TOK_NORMAL || type == TOK_USER_DEFINED || type == TOK_UNDEFINED;
}

/* Queues the merge of symbols left and right if the vocabulary has one. */
static void try_pair(enc *e, const char *text, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const lp_tokenizer *t = e->t;
    const sym *l = &e->syms[left], *r = &e->syms[right];
    cand c = {.left = left, .right = right, .left_id = l->id, .right_id = r->id,
              .size = l->len + r->len};
    if (t->kind == LP_TOK_BPE || t->use_merge_ranks) {
        int32_t rank;
        if (!tok_find_merge(t, l->id, r->id, &rank, &c.result)) return;
        c.cost = rank;
    } else {
        c.result = tok_lookup(t, text + l->start, (size_t)c.size);
        if (c.result < 0 || !spm_mergeable(t->types[c.result])) return;
        c.cost = -(double)t->scores[c.result];
    }
    heap_push(e, c);
}

/* Merges the n symbols e->syms[0..n) (linked in order) as far as possible. */
static void merge_symbols(enc *e, const char *text, int32_t n) {
    e->heap_len = 0;
    for (int32_t i = 1; i < n; i++) try_pair(e, text, i - 1, i);
    while (e->heap_len > 0 && !e->oom) {
        cand c = heap_pop(e);
        sym *l = &e->syms[c.left], *r = &e->syms[c.right];
        /* stale: one side has changed since this pair was queued */
        if (l->len == 0 || r->len == 0 || l->next != c.right || l->id != c.left_id ||
            r->id != c.right_id || l->len + r->len != c.size)
            continue;
        l->len += r->len;
        l->id = c.result;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) e->syms[r->next].prev = c.left;
        try_pair(e, text, l->prev, c.left);
        try_pair(e, text, c.left, l->next);
    }
}

/* Emits the symbols left after merging; pieces that are not tokens fall
 * back to byte tokens (or <unk>). */
static void emit_symbols(enc *e, const char *text) {
    const lp_tokenizer *t = e->t;
    for (int32_t i = 0; i >= 0; i = e->syms[i].next) {
        const sym *s = &e->syms[i];
        if (s->id >= 0) {
            emit(e, s->id);
            continue;
        }
        for (int32_t k = 0; k < s->len; k++) {
            int32_t b = t->byte_token[(uint8_t)text[s->start + k]];
            emit(e, b >= 0 ? b : t->unk);
        }
    }
}

/* Splits text[0..len) into symbols, one per UTF-8 character (an invalid
 * byte is a character of its own), and looks each one up. */
static int32_t split_chars(enc *e, const char *text, size_t len) {
    if (!grow((void **)&e->syms, &e->syms_cap, len, sizeof(sym))) {
        e->oom = true;
        return 0;
    }
    int32_t n = 0;
    for (size_t i = 0; i < len;) {
        int cl = lp_utf8_len((const uint8_t *)text + i, len - i);
        if (cl <= 0) cl = 1;
        e->syms[n] = (sym){.start = (int32_t)i, .len = cl,
                           .id = tok_lookup(e->t, text + i, (size_t)cl),
                           .prev = n - 1, .next = -1};
        if (n > 0) e->syms[n - 1].next = n;
        n++;
        i += (size_t)cl;
    }
    return n;
}

/* ---- SentencePiece fragments -------------------------------------------- */

static void encode_spm(enc *e, const char *text, size_t len, bool prefix_space) {
    const lp_tokenizer *t = e->t;
    /* working text: optional dummy prefix, spaces as U+2581 (3 bytes) */
    if (!grow((void **)&e->buf, &e->buf_cap, len * 3 + 4, 1)) {
        e->oom = true;
        return;
    }
    size_t o = 0;
    if (prefix_space && t->add_space_prefix) {
        memcpy(e->buf, "\xe2\x96\x81", 3);
        o = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(e->buf + o, "\xe2\x96\x81", 3);
            o += 3;
        } else {
            e->buf[o++] = text[i];
        }
    }
    if (o == 0) return;
    int32_t n = split_chars(e, e->buf, o);
    if (e->oom || n == 0) return;
    merge_symbols(e, e->buf, n);
    emit_symbols(e, e->buf);
}

/* ---- byte-level BPE fragments -------------------------------------------- */

static void encode_bpe_word(enc *e, const char *word, size_t len) {
    const lp_tokenizer *t = e->t;
    if (len == 0) return;
    if (t->ignore_merges) { /* whole word already a token: take it as is */
        if (!grow((void **)&e->buf, &e->buf_cap, len * 2, 1)) {
            e->oom = true;
            return;
        }
        size_t o = 0;
        for (size_t i = 0; i < len; i++)
            o += (size_t)tok_utf8_put(tok_byte_to_cp((uint8_t)word[i]), e->buf + o);
        int32_t id = tok_lookup(t, e->buf, o);
        if (id >= 0) {
            emit(e, id);
            return;
        }
    }
    /* one symbol per byte: its GPT-2 character's token */
    if (!grow((void **)&e->syms, &e->syms_cap, len, sizeof(sym))) {
        e->oom = true;
        return;
    }
    for (size_t i = 0; i < len; i++) {
        int32_t n = (int32_t)i;
        e->syms[i] = (sym){.start = n, .len = 1, .id = t->byte_token[(uint8_t)word[i]],
                           .prev = n - 1, .next = i + 1 < len ? n + 1 : -1};
    }
    merge_symbols(e, word, (int32_t)len);
    emit_symbols(e, word);
}

static void encode_bpe(enc *e, const char *text, size_t len) {
    const lp_tokenizer *t = e->t;
    if (!e->md) {
        e->md = pcre2_match_data_create_from_pattern(t->regex, NULL);
        if (!e->md) {
            e->oom = true;
            return;
        }
    }
    size_t done = 0, offset = 0;
    while (offset < len && !e->oom) {
        int rc = pcre2_match(t->regex, (PCRE2_SPTR)text, len, offset, 0, e->md, NULL);
        if (rc < 0) break; /* no match (or a matching limit): rest is a gap */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t start = ov[0], end = ov[1];
        if (start < done || end < start || end > len) break;
        if (start > done) encode_bpe_word(e, text + done, start - done); /* gap */
        if (end == start) { /* an empty match cannot happen; never loop */
            offset = end + 1;
            continue;
        }
        encode_bpe_word(e, text + start, end - start);
        done = offset = end;
    }
    if (done < len && !e->oom) encode_bpe_word(e, text + done, len - done);
}

/* ---- special tokens and the public entry point ------------------------------ */

/* The longest eligible special token at text[0..avail), or -1. */
static int32_t match_special(const lp_tokenizer *t, const char *text, size_t avail,
                             bool parse_special) {
    uint8_t b = (uint8_t)text[0];
    for (int32_t i = t->special_bucket[b]; i < t->special_bucket[b + 1]; i++) {
        int32_t id = t->specials[i];
        if (!parse_special && t->types[id] != TOK_USER_DEFINED) continue;
        size_t n = t->text_len[id];
        if (n <= avail && memcmp(text, tok_text(t, id), n) == 0) return id;
    }
    return -1;
}

/* Every fragment starts the text or follows a special token, so an SPM
 * fragment always gets the dummy prefix (llama.cpp does the same). */
static void encode_fragment(enc *e, const char *text, size_t len) {
    if (len == 0) return;
    if (e->t->kind == LP_TOK_SPM)
        encode_spm(e, text, len, true);
    else
        encode_bpe(e, text, len);
}

int lp_tokenizer_encode(const lp_tokenizer *t, const char *text, size_t len,
                        bool add_bos, bool parse_special, int32_t *out,
                        int cap, lp_error *err) {
    /* symbol indices are int32 and the SPM working text can triple */
    if (len > (size_t)1 << 28)
        return lp_fail(err, "%s: text of %zu bytes is too long to encode", t->name, len);
    if (cap < 0) cap = 0;
    enc e = {.t = t, .out = out, .cap = cap};
    if (add_bos && t->bos >= 0) emit(&e, t->bos);

    /* user-defined tokens always split the text; control tokens only when
     * parse_special (as llama.cpp and Hugging Face do) */
    size_t frag = 0;
    for (size_t i = 0; i < len && !e.oom;) {
        int32_t id = t->n_specials ? match_special(t, text + i, len - i, parse_special) : -1;
        if (id < 0) {
            i++;
            continue;
        }
        encode_fragment(&e, text + frag, i - frag);
        emit(&e, id);
        i += t->text_len[id];
        frag = i;
    }
    if (!e.oom) encode_fragment(&e, text + frag, len - frag);

    free(e.syms);
    free(e.heap);
    free(e.buf);
    if (e.md) pcre2_match_data_free(e.md);
    if (e.oom) return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory while encoding", t->name);
    if (e.n_out > (size_t)INT32_MAX)
        return lp_fail(err, "%s: too many tokens", t->name);
    return (int)e.n_out;
}
