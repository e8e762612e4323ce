/* Tokenizer loaders: GGUF metadata, llama2.c tokenizer.bin, Hugging Face
 * tokenizer.json (+ tokenizer_config.json). All of them fill the common
 * tables through tok_set_token / tok_add_merge and end with tok_finish. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

static char *copy_str(const char *s, size_t n) {
    char *c = malloc(n + 1);
    if (!c) return NULL;
    memcpy(c, s, n);
    c[n] = '\0';
    return c;
}

/* "left right": the separator is the first space after the first byte (a
 * piece is never empty). Returns false if there is none. */
static bool split_merge(const char *s, size_t n, size_t *sep) {
    for (size_t i = 1; i < n; i++) {
        if (s[i] == ' ') {
            *sep = i;
            return true;
        }
    }
    return false;
}

static lp_pretok pretok_from_name(const char *s, size_t n) {
    static const char *const llama3[] = {"llama-bpe", "llama3", "llama-v3"};
    for (size_t i = 0; i < sizeof llama3 / sizeof llama3[0]; i++)
        if (strlen(llama3[i]) == n && memcmp(s, llama3[i], n) == 0) return LP_PRETOK_LLAMA3;
    if (n == 5 && memcmp(s, "qwen2", 5) == 0) return LP_PRETOK_QWEN2;
    return LP_PRETOK_GPT2;
}

/* ---- GGUF ------------------------------------------------------------------ */

/* A token id stored under key with any integer type; out-of-range values
 * (e.g. 0xFFFFFFFF, llama.cpp's "none") give -1. */
static int32_t gguf_token_id(const lp_gguf *g, const char *key, int32_t fallback) {
    const lp_gguf_kv *kv = lp_gguf_find(g, key);
    if (!kv) return fallback;
    switch (kv->type) {
    case LP_GGUF_U8: case LP_GGUF_U16: case LP_GGUF_U32: case LP_GGUF_U64:
        return kv->v.u < (uint64_t)TOK_MAX_VOCAB ? (int32_t)kv->v.u : -1;
    case LP_GGUF_I8: case LP_GGUF_I16: case LP_GGUF_I32: case LP_GGUF_I64:
        return kv->v.i >= 0 && kv->v.i < TOK_MAX_VOCAB ? (int32_t)kv->v.i : -1;
    default:
        return fallback;
    }
}

static int gguf_load_vocab(lp_tokenizer **out, const lp_gguf *g, const char *name,
                           lp_error *err) {
    const lp_gguf_kv *tokens = NULL, *scores = NULL, *types = NULL;
    int rc = lp_gguf_get_arr(g, "tokenizer.ggml.tokens", LP_GGUF_STRING, &tokens, err);
    if (rc < 0) return -1;
    if (rc == 0 || !tokens) return lp_fail(err, "%s: no tokenizer.ggml.tokens", name);
    if (tokens->arr_len == 0 || tokens->arr_len > TOK_MAX_VOCAB)
        return lp_fail(err, "%s: tokenizer.ggml.tokens has %llu entries", name,
                       (unsigned long long)tokens->arr_len);
    int32_t n = (int32_t)tokens->arr_len;
    if (lp_gguf_get_arr(g, "tokenizer.ggml.scores", LP_GGUF_F32, &scores, err) < 0) return -1;
    if (lp_gguf_get_arr(g, "tokenizer.ggml.token_type", LP_GGUF_I32, &types, err) < 0) return -1;
    if (scores && scores->arr_len != tokens->arr_len)
        return lp_fail(err, "%s: tokenizer.ggml.scores has %llu entries, tokens %d", name,
                       (unsigned long long)scores->arr_len, (int)n);
    if (types && types->arr_len != tokens->arr_len)
        return lp_fail(err, "%s: tokenizer.ggml.token_type has %llu entries, tokens %d", name,
                       (unsigned long long)types->arr_len, (int)n);
    lp_tokenizer *t = tok_new(n, name, err);
    if (!t) return -1;
    *out = t;
    for (int32_t i = 0; i < n; i++) {
        lp_str s = tokens->arr_strs[i];
        float score = scores ? lp_gguf_arr_f32(scores, (uint64_t)i) : 0.0f;
        if (isnan(score)) score = -INFINITY;
        int type = types ? lp_gguf_arr_i32(types, (uint64_t)i) : TOK_NORMAL;
        if (type < 0 || type > TOK_BYTE) type = TOK_NORMAL;
        if (tok_set_token(t, i, s.ptr, s.len, score, type, err) != 0) return -1;
    }
    return tok_build_vocab_index(t, err);
}

static int gguf_load_merges(lp_tokenizer *t, const lp_gguf *g, const char *name,
                            lp_error *err) {
    const lp_gguf_kv *merges = NULL;
    int rc = lp_gguf_get_arr(g, "tokenizer.ggml.merges", LP_GGUF_STRING, &merges, err);
    if (rc < 0) return -1;
    if (rc == 0 || !merges) return lp_fail(err, "%s: gpt2 tokenizer without tokenizer.ggml.merges", name);
    if (merges->arr_len > INT32_MAX / 4)
        return lp_fail(err, "%s: too many merges (%llu)", name, (unsigned long long)merges->arr_len);
    if (tok_reserve_merges(t, (size_t)merges->arr_len, err) != 0) return -1;
    for (uint64_t i = 0; i < merges->arr_len; i++) {
        lp_str m = merges->arr_strs[i];
        size_t sep;
        if (!split_merge(m.ptr, m.len, &sep)) continue; /* malformed entry: ignore */
        tok_add_merge(t, m.ptr, sep, m.ptr + sep + 1, m.len - sep - 1, (int32_t)i);
    }
    return 0;
}

lp_tokenizer *lp_tokenizer_from_gguf(const lp_gguf *g, lp_error *err) {
    const char *name = lp_gguf_path(g) ? lp_gguf_path(g) : "gguf";
    lp_str model;
    int rc = lp_gguf_get_str(g, "tokenizer.ggml.model", &model, err);
    if (rc < 0) return NULL;
    if (rc == 0) {
        lp_fail(err, "%s: no tokenizer (tokenizer.ggml.model missing)", name);
        return NULL;
    }
    lp_tok_kind kind;
    if (lp_str_eq(model, "llama")) {
        kind = LP_TOK_SPM;
    } else if (lp_str_eq(model, "gpt2")) {
        kind = LP_TOK_BPE;
    } else {
        lp_fail(err, "%s: unsupported tokenizer model '%.*s' (supported: llama, gpt2)", name,
                (int)(model.len < 64 ? model.len : 64), model.ptr);
        return NULL;
    }

    lp_tokenizer *t = NULL;
    if (gguf_load_vocab(&t, g, name, err) != 0) goto fail;
    t->kind = kind;

    lp_str pre = {0};
    if (lp_gguf_get_str(g, "tokenizer.ggml.pre", &pre, err) < 0) goto fail;
    if (kind == LP_TOK_BPE) {
        if (gguf_load_merges(t, g, name, err) != 0) goto fail;
        t->pretok = pretok_from_name(pre.ptr ? pre.ptr : "", pre.len);
        t->ignore_merges = t->pretok == LP_PRETOK_LLAMA3;
    }

    /* llama.cpp's defaults: SPM adds BOS; byte-level BPE only for Llama 3 */
    t->unk = gguf_token_id(g, "tokenizer.ggml.unknown_token_id", kind == LP_TOK_SPM ? 0 : -1);
    t->bos = gguf_token_id(g, "tokenizer.ggml.bos_token_id", kind == LP_TOK_SPM ? 1 : -1);
    t->eos = gguf_token_id(g, "tokenizer.ggml.eos_token_id", kind == LP_TOK_SPM ? 2 : -1);
    t->eot = gguf_token_id(g, "tokenizer.ggml.eot_token_id", -1);
    t->eom = gguf_token_id(g, "tokenizer.ggml.eom_token_id", -1);
    t->add_bos = kind == LP_TOK_SPM || t->pretok == LP_PRETOK_LLAMA3;
    if (lp_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err) < 0) goto fail;
    if (lp_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err) < 0)
        goto fail;

    lp_str tmpl;
    rc = lp_gguf_get_str(g, "tokenizer.chat_template", &tmpl, err);
    if (rc < 0) goto fail;
    if (rc == 1 && !(t->chat_template = copy_str(tmpl.ptr, tmpl.len))) {
        lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", name);
        goto fail;
    }
    if (tok_finish(t, err) != 0) goto fail;
    return t;
fail:
    lp_tokenizer_free(t);
    return NULL;
}

/* ---- llama2.c tokenizer.bin ---------------------------------------------- */

static int32_t read_i32(const uint8_t *p) {
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t r;
    memcpy(&r, &v, 4);
    return r;
}

static float read_f32(const uint8_t *p) {
    int32_t i = read_i32(p);
    float f;
    memcpy(&f, &i, 4);
    return f;
}

/* llama2.c's export writes SentencePiece pieces with "▁" turned back into a
 * plain space and BOS/EOS as "\n<s>\n" / "\n</s>\n". Undo both so the
 * vocabulary is the one a GGUF of the same model stores. */
static int llama2c_add_token(lp_tokenizer *t, int32_t id, const uint8_t *s, size_t len,
                             float score, char *buf, lp_error *err) {
    if ((len == 5 && memcmp(s, "\n<s>\n", 5) == 0) || (len == 6 && memcmp(s, "\n</s>\n", 6) == 0)) {
        s++;
        len -= 2;
    }
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') {
            memcpy(buf + o, "\xe2\x96\x81", 3);
            o += 3;
        } else {
            buf[o++] = (char)s[i];
        }
    }
    int type = TOK_NORMAL;
    if (id == 0 && o == 5 && memcmp(buf, "<unk>", 5) == 0) type = TOK_UNKNOWN;
    if ((o == 3 && memcmp(buf, "<s>", 3) == 0) || (o == 4 && memcmp(buf, "</s>", 4) == 0))
        type = TOK_CONTROL;
    if (isnan(score)) score = -INFINITY;
    return tok_set_token(t, id, buf, o, score, type, err); /* <0xXX>: tok_finish */
}

lp_tokenizer *lp_tokenizer_from_llama2c_memory(const void *data, size_t size,
                                               int32_t vocab_size,
                                               const char *name, lp_error *err) {
    const uint8_t *p = data;
    if (!name) name = "tokenizer.bin";
    if (vocab_size <= 0 || vocab_size > TOK_MAX_VOCAB) {
        lp_fail(err, "%s: vocabulary size %d out of range", name, (int)vocab_size);
        return NULL;
    }
    if (!p || size < 4) {
        lp_fail(err, "%s: too short for a llama2.c tokenizer (%zu bytes)", name, size);
        return NULL;
    }
    int32_t max_len = read_i32(p);
    if (max_len < 0) {
        lp_fail(err, "%s: negative max_token_length %d", name, (int)max_len);
        return NULL;
    }
    /* every token takes at least 8 bytes: reject impossible sizes before
     * allocating anything */
    if ((size_t)vocab_size > (size - 4) / 8) {
        lp_fail(err, "%s: %zu bytes cannot hold %d tokens", name, size, (int)vocab_size);
        return NULL;
    }
    lp_tokenizer *t = tok_new(vocab_size, name, err);
    char *buf = NULL;
    if (!t) return NULL;
    t->kind = LP_TOK_SPM;
    size_t off = 4, buf_cap = 0;
    for (int32_t id = 0; id < vocab_size; id++) {
        if (size - off < 8) {
            lp_fail(err, "%s: truncated at token %d (offset %zu)", name, (int)id, off);
            goto fail;
        }
        float score = read_f32(p + off);
        int32_t len = read_i32(p + off + 4);
        off += 8;
        if (len < 0 || (size_t)len > size - off) {
            lp_fail(err, "%s: token %d has length %d but %zu bytes remain", name, (int)id,
                    (int)len, size - off);
            goto fail;
        }
        if ((size_t)len * 3 > buf_cap) {
            buf_cap = (size_t)len * 3 + 16;
            char *nb = realloc(buf, buf_cap);
            if (!nb) {
                lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", name);
                goto fail;
            }
            buf = nb;
        }
        if (llama2c_add_token(t, id, p + off, (size_t)len, score, buf, err) != 0) goto fail;
        off += (size_t)len;
    }
    free(buf);
    buf = NULL;
    t->unk = 0;
    t->bos = 1;
    t->eos = 2;
    t->add_bos = true;
    if (tok_finish(t, err) != 0) goto fail;
    return t;
fail:
    free(buf);
    lp_tokenizer_free(t);
    return NULL;
}

lp_tokenizer *lp_tokenizer_from_llama2c(const char *path, int32_t vocab_size,
                                        lp_error *err) {
    lp_mapped_file f;
    if (lp_map_file(path, &f, err) != 0) return NULL;
    lp_tokenizer *t = lp_tokenizer_from_llama2c_memory(f.data, f.size, vocab_size, path, err);
    lp_unmap_file(&f);
    return t;
}

/* ---- Hugging Face tokenizer.json ----------------------------------------- */

/* Is there an object with "type": type anywhere inside j? */
static bool json_has_type(const cJSON *j, const char *type, int depth) {
    if (!j || depth > 32) return false;
    if (cJSON_IsObject(j)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(j, "type");
        if (cJSON_IsString(ty) && strcmp(ty->valuestring, type) == 0) return true;
    }
    if (cJSON_IsObject(j) || cJSON_IsArray(j))
        for (const cJSON *c = j->child; c; c = c->next)
            if (json_has_type(c, type, depth + 1)) return true;
    return false;
}

/* The first object with "type": type inside j, or NULL. */
static const cJSON *json_find_type(const cJSON *j, const char *type, int depth) {
    if (!j || depth > 32) return NULL;
    if (cJSON_IsObject(j)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(j, "type");
        if (cJSON_IsString(ty) && strcmp(ty->valuestring, type) == 0) return j;
    }
    if (cJSON_IsObject(j) || cJSON_IsArray(j))
        for (const cJSON *c = j->child; c; c = c->next) {
            const cJSON *r = json_find_type(c, type, depth + 1);
            if (r) return r;
        }
    return NULL;
}

/* A token id from a JSON number, or -1 if it is not a valid one. */
static int32_t json_id(const cJSON *j) {
    if (!cJSON_IsNumber(j)) return -1;
    double d = j->valuedouble;
    if (!(d >= 0 && d < TOK_MAX_VOCAB) || d != floor(d)) return -1;
    return (int32_t)d;
}

/* tokenizer_config.json tokens are "text" or {"content": "text", ...}. */
static const char *json_token_text(const cJSON *j) {
    if (cJSON_IsString(j)) return j->valuestring;
    if (cJSON_IsObject(j)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

static lp_pretok hf_pretok(const cJSON *pre) {
    const cJSON *split = json_find_type(pre, "Split", 0);
    if (!split) return LP_PRETOK_GPT2; /* plain ByteLevel uses GPT-2's regex */
    const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(split, "pattern");
    const cJSON *regex = cJSON_GetObjectItemCaseSensitive(pattern, "Regex");
    if (!cJSON_IsString(regex)) return LP_PRETOK_GPT2;
    if (strcmp(regex->valuestring, tok_pattern_llama3) == 0) return LP_PRETOK_LLAMA3;
    if (strcmp(regex->valuestring, tok_pattern_qwen2) == 0) return LP_PRETOK_QWEN2;
    return LP_PRETOK_GPT2;
}

/* SentencePiece-style files say whether to prepend "▁" in a Metaspace
 * pre-tokenizer or a Prepend normalizer. */
static bool hf_space_prefix(const cJSON *root) {
    const cJSON *meta = json_find_type(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"),
                                       "Metaspace", 0);
    if (meta) {
        const cJSON *scheme = cJSON_GetObjectItemCaseSensitive(meta, "prepend_scheme");
        if (cJSON_IsString(scheme)) return strcmp(scheme->valuestring, "never") != 0;
        const cJSON *add = cJSON_GetObjectItemCaseSensitive(meta, "add_prefix_space");
        return !cJSON_IsFalse(add);
    }
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (norm && !cJSON_IsNull(norm)) return json_has_type(norm, "Prepend", 0);
    return true;
}

typedef struct hf_parts {
    const cJSON *model, *vocab, *merges, *added;
    int32_t n_vocab;
} hf_parts;

static int hf_check(const cJSON *root, hf_parts *h, const char *name, lp_error *err) {
    if (!cJSON_IsObject(root)) return lp_fail(err, "%s: not a JSON object", name);
    h->model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(h->model)) return lp_fail(err, "%s: no \"model\" object", name);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(h->model, "type");
    if (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE") != 0))
        return lp_fail(err, "%s: unsupported model type %s (only BPE)", name,
                       cJSON_IsString(type) ? type->valuestring : "(not a string)");
    h->vocab = cJSON_GetObjectItemCaseSensitive(h->model, "vocab");
    if (!cJSON_IsObject(h->vocab)) return lp_fail(err, "%s: model.vocab is not an object", name);
    h->merges = cJSON_GetObjectItemCaseSensitive(h->model, "merges");
    if (h->merges && !cJSON_IsArray(h->merges))
        return lp_fail(err, "%s: model.merges is not an array", name);
    h->added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (h->added && !cJSON_IsArray(h->added) && !cJSON_IsNull(h->added))
        return lp_fail(err, "%s: added_tokens is not an array", name);
    int32_t max_id = -1;
    for (const cJSON *c = h->vocab->child; c; c = c->next) {
        int32_t id = json_id(c);
        if (id < 0 || !c->string)
            return lp_fail(err, "%s: vocab entry \"%.64s\" has no valid id", name,
                           c->string ? c->string : "");
        if (id > max_id) max_id = id;
    }
    for (const cJSON *c = h->added ? h->added->child : NULL; c; c = c->next) {
        int32_t id = json_id(cJSON_GetObjectItemCaseSensitive(c, "id"));
        if (id < 0 || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(c, "content")))
            return lp_fail(err, "%s: malformed added_tokens entry", name);
        if (id > max_id) max_id = id;
    }
    if (max_id < 0) return lp_fail(err, "%s: empty vocabulary", name);
    /* ids are dense in real files; a few entries claiming huge ids would
     * only make us allocate a vast empty vocabulary */
    int n_entries = cJSON_GetArraySize(h->vocab) + cJSON_GetArraySize(h->added);
    if ((int64_t)max_id >= 2 * (int64_t)n_entries + 65536)
        return lp_fail(err, "%s: token id %d is far beyond the %d entries", name, (int)max_id,
                       n_entries);
    h->n_vocab = max_id + 1;
    return 0;
}

static int hf_fill(lp_tokenizer *t, const hf_parts *h, lp_error *err) {
    for (const cJSON *c = h->vocab->child; c; c = c->next)
        if (tok_set_token(t, json_id(c), c->string, strlen(c->string), 0.0f, TOK_NORMAL, err) != 0)
            return -1;
    for (const cJSON *c = h->added ? h->added->child : NULL; c; c = c->next) {
        const char *s = cJSON_GetObjectItemCaseSensitive(c, "content")->valuestring;
        int type = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "special")) ? TOK_CONTROL
                                                                               : TOK_USER_DEFINED;
        int32_t id = json_id(cJSON_GetObjectItemCaseSensitive(c, "id"));
        if (tok_set_token(t, id, s, strlen(s), 0.0f, type, err) != 0) return -1;
    }
    if (tok_build_vocab_index(t, err) != 0) return -1;
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(h->model, "unk_token");
    if (cJSON_IsString(unk)) {
        t->unk = tok_lookup(t, unk->valuestring, strlen(unk->valuestring));
        if (t->unk >= 0) t->types[t->unk] = TOK_UNKNOWN;
    }

    size_t n_merges = (size_t)cJSON_GetArraySize(h->merges);
    if (tok_reserve_merges(t, n_merges, err) != 0) return -1;
    int32_t rank = 0;
    for (const cJSON *m = h->merges ? h->merges->child : NULL; m; m = m->next, rank++) {
        if (cJSON_IsString(m)) {
            const char *s = m->valuestring;
            size_t n = strlen(s), sep;
            if (split_merge(s, n, &sep)) tok_add_merge(t, s, sep, s + sep + 1, n - sep - 1, rank);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
                   cJSON_IsString(m->child) && cJSON_IsString(m->child->next)) {
            const char *a = m->child->valuestring, *b = m->child->next->valuestring;
            tok_add_merge(t, a, strlen(a), b, strlen(b), rank);
        } else {
            return lp_fail(err, "%s: merge %d is neither \"a b\" nor [a, b]", t->name, (int)rank);
        }
    }
    /* Informational scores, SentencePiece-style: minus the rank of the
     * best merge making the token; tokens no merge makes rank below all. */
    float floor_score = -(float)n_merges - 1.0f;
    for (int32_t id = 0; id < t->n_vocab; id++) t->scores[id] = floor_score;
    for (size_t i = 0; t->merge_slots && i <= t->merge_mask; i++) {
        const tok_merge_slot *s = &t->merge_slots[i];
        if (s->key && -(float)s->rank > t->scores[s->result]) t->scores[s->result] = -(float)s->rank;
    }
    return 0;
}

static int32_t lookup_first(const lp_tokenizer *t, const char *const *names, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int32_t id = tok_lookup(t, names[i], strlen(names[i]));
        if (id >= 0) return id;
    }
    return -1;
}

static int hf_apply_config(lp_tokenizer *t, const cJSON *cfg, lp_error *err) {
    static const char *const spm_bos[] = {"<s>"}, *const spm_eos[] = {"</s>"};
    static const char *const bpe_bos[] = {"<|begin_of_text|>"};
    static const char *const bpe_eos[] = {"<|end_of_text|>", "<|endoftext|>", "<|im_end|>"};
    bool spm = t->kind == LP_TOK_SPM;
    t->bos = spm ? lookup_first(t, spm_bos, 1) : lookup_first(t, bpe_bos, 1);
    t->eos = spm ? lookup_first(t, spm_eos, 1) : lookup_first(t, bpe_eos, 3);
    t->add_bos = spm || t->pretok == LP_PRETOK_LLAMA3;
    if (!cfg) return 0;
    const char *bos = json_token_text(cJSON_GetObjectItemCaseSensitive(cfg, "bos_token"));
    const char *eos = json_token_text(cJSON_GetObjectItemCaseSensitive(cfg, "eos_token"));
    if (bos) t->bos = tok_lookup(t, bos, strlen(bos));
    if (eos) t->eos = tok_lookup(t, eos, strlen(eos));
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
    if (cJSON_IsBool(add)) t->add_bos = cJSON_IsTrue(add);
    const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    const char *text = NULL;
    if (cJSON_IsString(tmpl)) {
        text = tmpl->valuestring;
    } else if (cJSON_IsArray(tmpl)) { /* [{"name": ..., "template": ...}] */
        for (const cJSON *c = tmpl->child; c; c = c->next) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(c, "name");
            const cJSON *tx = cJSON_GetObjectItemCaseSensitive(c, "template");
            if (!cJSON_IsString(tx)) continue;
            if (!text || (cJSON_IsString(nm) && strcmp(nm->valuestring, "default") == 0))
                text = tx->valuestring;
        }
    }
    if (text && !(t->chat_template = copy_str(text, strlen(text))))
        return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", t->name);
    return 0;
}

static cJSON *parse_json(const char *json, size_t len, const char *name, const char *what,
                         lp_error *err) {
    if (!json) {
        lp_fail(err, "%s: no %s", name, what);
        return NULL;
    }
    const char *end = NULL; /* the error position, without cJSON's global */
    cJSON *j = cJSON_ParseWithLengthOpts(json, len, &end, false);
    if (!j) {
        size_t off = end && end >= json && end <= json + len ? (size_t)(end - json) : 0;
        lp_fail(err, "%s: malformed %s (JSON syntax error near byte %zu)", name, what, off);
    }
    return j;
}

lp_tokenizer *lp_tokenizer_from_hf_memory(const char *json, size_t len,
                                          const char *config_json, size_t config_len,
                                          const char *name, lp_error *err) {
    if (!name) name = "tokenizer.json";
    lp_tokenizer *t = NULL;
    cJSON *cfg = NULL;
    cJSON *root = parse_json(json, len, name, "tokenizer.json", err);
    if (!root) return NULL;
    if (config_json && !(cfg = parse_json(config_json, config_len, name, "tokenizer_config.json", err)))
        goto fail;
    if (cfg && !cJSON_IsObject(cfg)) {
        lp_fail(err, "%s: tokenizer_config.json is not a JSON object", name);
        goto fail;
    }
    hf_parts h = {0};
    if (hf_check(root, &h, name, err) != 0) goto fail;
    if (!(t = tok_new(h.n_vocab, name, err))) goto fail;

    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    bool byte_level = json_has_type(pre, "ByteLevel", 0) || json_has_type(dec, "ByteLevel", 0);
    if (byte_level) {
        t->kind = LP_TOK_BPE;
        t->pretok = hf_pretok(pre);
    } else {
        /* ▁-style BPE with byte fallback (Llama 2, Mistral): SentencePiece
         * pieces, but merged by the ranks of the merges list */
        t->kind = LP_TOK_SPM;
        t->use_merge_ranks = true;
        t->add_space_prefix = hf_space_prefix(root);
    }
    const cJSON *ignore = cJSON_GetObjectItemCaseSensitive(h.model, "ignore_merges");
    t->ignore_merges = t->kind == LP_TOK_BPE && cJSON_IsTrue(ignore);
    if (hf_fill(t, &h, err) != 0) goto fail;
    if (hf_apply_config(t, cfg, err) != 0) goto fail;
    if (tok_finish(t, err) != 0) goto fail;
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    return t;
fail:
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    lp_tokenizer_free(t);
    return NULL;
}

lp_tokenizer *lp_tokenizer_from_hf(const char *tokenizer_json_path,
                                   const char *tokenizer_config_path, lp_error *err) {
    const size_t max = (size_t)256 << 20;
    char *json = NULL, *cfg = NULL;
    size_t len = 0, cfg_len = 0;
    if (lp_read_file(tokenizer_json_path, &json, &len, max, err) != 0) return NULL;
    if (tokenizer_config_path &&
        lp_read_file(tokenizer_config_path, &cfg, &cfg_len, max, err) != 0) {
        free(json);
        return NULL;
    }
    lp_tokenizer *t = lp_tokenizer_from_hf_memory(json, len, cfg, cfg_len, tokenizer_json_path, err);
    free(json);
    free(cfg);
    return t;
}
