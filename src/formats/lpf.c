/* .lpf forecast-embedding files (see lpf.h) and the public lp_forecast API. */
#include "lpf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/base.h"
#include "../model/adapter.h"
#include "le.h"
#include "lpa.h"

/* One context of the n-gram table: the token that most often followed
 * ctx[0..g-1] in the corpus, and how often. */
typedef struct ngram {
    int32_t g, ctx[LP_LPF_NGRAM], next, count;
} ngram;

struct lp_forecast {
    int k, dim, n_vocab;
    uint64_t fingerprint;
    char name[LP_LPF_NAME_BYTES];
    float *data;      /* [k][dim] */
    float *prefix;    /* [n_layers][2][n_prefix][kv_dim] KV prefix (NULL: none) */
    int n_prefix, n_layers, kv_dim;
    int32_t *corpus;  /* [n_corpus] token ids, -1 between sequences (NULL: none) */
    int n_corpus;
    ngram *table;     /* [n_table] sorted by (g, ctx): one entry per context */
    int n_table;
};

void lp_forecast_free(lp_forecast *f) {
    if (!f) return;
    free(f->data);
    free(f->prefix);
    free(f->corpus);
    free(f->table);
    free(f);
}

static int ngram_order(const ngram *a, const ngram *b) {
    if (a->g != b->g) return a->g < b->g ? -1 : 1;
    for (int i = 0; i < a->g; i++)
        if (a->ctx[i] != b->ctx[i]) return a->ctx[i] < b->ctx[i] ? -1 : 1;
    return 0;
}

static int by_context_then_next(const void *pa, const void *pb) {
    const ngram *a = pa, *b = pb;
    int c = ngram_order(a, b);
    return c ? c : (a->next > b->next) - (a->next < b->next);
}

/* The n-gram table of f->corpus (-1: out of memory): every (context of 1..LP_LPF_NGRAM tokens
 * within one sequence, next token) counted, and per context the most
 * frequent next token kept (the smallest id on ties). */
static int build_table(lp_forecast *f) {
    size_t cap = (size_t)f->n_corpus * LP_LPF_NGRAM, n = 0;
    ngram *all = cap ? malloc(cap * sizeof *all) : NULL;
    if (cap && !all) return -1;
    const int32_t *t = f->corpus;
    for (int i = 0; i < f->n_corpus; i++) {
        if (t[i] < 0) continue;
        for (int g = 1; g <= LP_LPF_NGRAM && i - g >= 0 && t[i - g] >= 0; g++) {
            ngram e = {.g = g, .next = t[i], .count = 1};
            memcpy(e.ctx, t + i - g, (size_t)g * sizeof *t);
            all[n++] = e;
        }
    }
    if (n) qsort(all, n, sizeof *all, by_context_then_next);
    size_t out = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        ngram best = all[i];
        best.count = 0;
        while (j < n && ngram_order(&all[j], &all[i]) == 0) {
            size_t run = j;
            while (j < n && ngram_order(&all[j], &all[i]) == 0 && all[j].next == all[run].next) j++;
            if ((int32_t)(j - run) > best.count) best.next = all[run].next, best.count = (int32_t)(j - run);
        }
        all[out++] = best;
        i = j;
    }
    ngram *fit = out ? realloc(all, out * sizeof *all) : NULL; /* the counting needed 3 per token */
    if (out && !fit) fit = all;
    else if (!out) free(all);
    f->table = fit;
    f->n_table = (int)out;
    return 0;
}

/* Makes c[0..n-1] (malloc'd, checked) f's corpus and builds its table;
 * on failure (out of memory) f is left without a corpus and c is freed. */
static int adopt_corpus(lp_forecast *f, int32_t *c, int n) {
    free(f->corpus);
    free(f->table);
    f->corpus = c;
    f->n_corpus = n;
    f->table = NULL;
    f->n_table = 0;
    if (build_table(f) == 0) return 0;
    free(f->corpus);
    f->corpus = NULL;
    f->n_corpus = 0;
    return -1;
}

int lp_forecast_ngram_next(const lp_forecast *f, const int32_t *history, int n) {
    if (!f || !f->n_table || !history) return -1;
    for (int g = n < LP_LPF_NGRAM ? n : LP_LPF_NGRAM; g >= 1; g--) {
        ngram key = {.g = g};
        memcpy(key.ctx, history + n - g, (size_t)g * sizeof *history);
        int lo = 0, hi = f->n_table;
        while (lo < hi) {
            int mid = lo + (hi - lo) / 2;
            if (ngram_order(&f->table[mid], &key) < 0) lo = mid + 1;
            else hi = mid;
        }
        if (lo < f->n_table && ngram_order(&f->table[lo], &key) == 0)
            return g > 1 || f->table[lo].count >= 2 ? f->table[lo].next : -1;
    }
    return -1;
}

int lp_forecast_corpus_size(const lp_forecast *f) { return f ? f->n_corpus : 0; }

int lp_forecast_set_corpus(lp_forecast *f, const int32_t *tokens, int n, lp_error *err) {
    if (!f || n < 0 || (n && !tokens))
        return lp_error_set(err, LP_ERR_INVALID, "lp_forecast_set_corpus needs a forecast set and tokens");
    if (n > LP_LPF_MAX_CORPUS)
        return lp_error_set(err, LP_ERR_INVALID, "a draft corpus of %d tokens (at most %d)", n, LP_LPF_MAX_CORPUS);
    if (n && f->n_vocab <= 0)
        return lp_error_set(err, LP_ERR_INVALID, "a draft corpus needs the set's vocabulary size recorded");
    for (int i = 0; i < n; i++)
        if (tokens[i] < -1 || tokens[i] >= f->n_vocab)
            return lp_error_set(err, LP_ERR_INVALID, "draft corpus token %d is %d (vocabulary %d; -1 separates)", i,
                                tokens[i], f->n_vocab);
    int32_t *c = n ? malloc((size_t)n * sizeof *c) : NULL;
    if (n && !c) return lp_error_set(err, LP_ERR_NOMEM, "out of memory for a draft corpus of %d", n);
    if (n) memcpy(c, tokens, (size_t)n * sizeof *c);
    return adopt_corpus(f, c, n) ? lp_error_set(err, LP_ERR_NOMEM, "out of memory for the n-gram table of %d tokens", n)
                                 : 0;
}

static lp_forecast *forecast_new(int k, int dim, lp_error *err) {
    lp_forecast *f = calloc(1, sizeof *f);
    float *d = f ? malloc((size_t)k * (size_t)dim * sizeof *d) : NULL;
    if (!d) {
        free(f);
        lp_error_set(err, LP_ERR_NOMEM, "out of memory for %d forecast embeddings of %d", k, dim);
        return NULL;
    }
    f->k = k;
    f->dim = dim;
    f->data = d;
    return f;
}

static size_t name_padded(size_t n) { return (n + 3) & ~(size_t)3; }

int lp_lpf_token_bits(uint32_t n_vocab) {
    int b = 1;
    while (b < 32 && ((1u << b) - 1) < n_vocab) b++;
    return b;
}

static size_t corpus_bytes(size_t n, int bits) { return (n * (size_t)bits + 7) / 8; }

size_t lp_lpf_file_bytes(int k, int dim, size_t name_len, int n_vocab, size_t n_corpus, size_t prefix_floats) {
    size_t corpus = n_corpus ? corpus_bytes(n_corpus, lp_lpf_token_bits((uint32_t)n_vocab)) : 0;
    return LP_LPF_HEADER_BYTES + name_padded(name_len) + ((size_t)k * (size_t)dim + prefix_floats) * sizeof(float) +
           corpus;
}

/* Token i of a corpus packed at `bits` bits, least significant bit first. */
static uint32_t unpack(const uint8_t *p, size_t n_bytes, size_t i, int bits) {
    size_t bit = i * (size_t)bits, at = bit / 8;
    uint64_t w = 0;
    for (size_t j = 0; j < 5 && at + j < n_bytes; j++) w |= (uint64_t)p[at + j] << (8 * j);
    return (uint32_t)((w >> (bit % 8)) & ((1ull << bits) - 1));
}

static void pack(uint8_t *p, size_t i, int bits, uint32_t v) {
    size_t bit = i * (size_t)bits;
    for (int j = 0; j < bits; j++, bit++)
        if (v >> j & 1) p[bit / 8] |= (uint8_t)(1u << (bit % 8));
}

/* The corpus section (n tokens of `bits` bits in n_bytes at p) into f. */
static int parse_corpus(lp_forecast *f, const uint8_t *p, size_t n_bytes, int n, int bits, const char *what,
                        lp_error *err) {
    size_t used = (size_t)n * (size_t)bits;
    if (used % 8 && p[n_bytes - 1] >> (used % 8))
        return lp_error_set(err, LP_ERR_FORMAT, "%s: the bits after the last corpus token are not zero", what);
    int32_t *c = malloc((size_t)n * sizeof *c);
    if (!c) return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory for a draft corpus of %d", what, n);
    uint32_t separator = (uint32_t)((1ull << bits) - 1);
    for (int i = 0; i < n; i++) {
        uint32_t v = unpack(p, n_bytes, (size_t)i, bits);
        if (v != separator && v >= (uint32_t)f->n_vocab) {
            free(c);
            return lp_error_set(err, LP_ERR_FORMAT, "%s: draft corpus token %d is %u (vocabulary %d)", what, i, v,
                                f->n_vocab);
        }
        c[i] = v == separator ? -1 : (int32_t)v;
    }
    if (adopt_corpus(f, c, n))
        return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory for the n-gram table of %d tokens", what, n);
    return 0;
}

static size_t prefix_floats_of(int n, int n_layers, int kv_dim) {
    return (size_t)n_layers * 2 * (size_t)n * (size_t)kv_dim;
}

/* Reads n little-endian f32 from p into dst; returns the index of the
 * first one that is not finite, or n. */
static size_t read_floats(float *dst, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        dst[i] = lp_le_get_f32(p + 4 * i);
        if (!isfinite(dst[i])) return i;
    }
    return n;
}

/* The KV prefix section (sizes checked by the caller) into f. */
static int read_prefix(lp_forecast *f, const uint8_t *p, int n, int n_layers, int kv_dim, const char *what,
                       lp_error *err) {
    size_t count = prefix_floats_of(n, n_layers, kv_dim);
    float *kv = malloc(count * sizeof *kv);
    if (!kv) return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory for a KV prefix of %zu floats", what, count);
    size_t bad = read_floats(kv, p, count);
    if (bad < count) {
        free(kv);
        return lp_error_set(err, LP_ERR_FORMAT, "%s: KV prefix element %zu is not finite", what, bad);
    }
    f->prefix = kv;
    f->n_prefix = n;
    f->n_layers = n_layers;
    f->kv_dim = kv_dim;
    return 0;
}

lp_forecast *lp_lpf_parse(const uint8_t *p, size_t size, const char *what, lp_error *err) {
    if (!what) what = "forecast file";
    if (!p || size < LP_LPF_HEADER_BYTES) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: %zu bytes is too short for a forecast file (header %d)", what, size,
                     LP_LPF_HEADER_BYTES);
        return NULL;
    }
    if (memcmp(p, LP_LPF_MAGIC, 4) != 0) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: not a forecast file (magic is not \"%s\")", what, LP_LPF_MAGIC);
        return NULL;
    }
    uint32_t version = lp_le_get_u32(p + 4), dim = lp_le_get_u32(p + 8), k = lp_le_get_u32(p + 12);
    uint32_t n_vocab = lp_le_get_u32(p + 16), name_len = lp_le_get_u32(p + 20);
    uint64_t fp = lp_le_get_u64(p + 24), sum = lp_le_get_u64(p + 32);
    if (version < 1 || version > LP_LPF_VERSION) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: forecast file version %u (this build reads 1..%d)", what, version,
                     LP_LPF_VERSION);
        return NULL;
    }
    uint32_t n_corpus = version >= 2 ? lp_le_get_u32(p + 40) : 0;
    if (n_corpus > LP_LPF_MAX_CORPUS || (n_corpus && !n_vocab)) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: a draft corpus of %u tokens (at most %d, and only with the vocabulary "
                     "size recorded)", what, n_corpus, LP_LPF_MAX_CORPUS);
        return NULL;
    }
    int bits = version == 2 ? 32 : 0;
    if (version >= 3) {
        uint32_t b = lp_le_get_u32(p + 44);
        bits = n_corpus || version == 3 ? lp_lpf_token_bits(n_vocab) : 0;
        if (b != (uint32_t)bits) {
            lp_error_set(err, LP_ERR_FORMAT, "%s: corpus tokens of %u bits (a vocabulary of %u takes %d)", what, b,
                         n_vocab, bits);
            return NULL;
        }
    }
    if (dim < 1 || dim > LP_LPF_MAX_DIM || k < 1 || k > LP_LPF_MAX_K) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: dim %u / k %u out of range (1..%d / 1..%d)", what, dim, k,
                     LP_LPF_MAX_DIM, LP_LPF_MAX_K);
        return NULL;
    }
    if (name_len >= LP_LPF_NAME_BYTES) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: adapter name of %u bytes (at most %d)", what, name_len,
                     LP_LPF_NAME_BYTES - 1);
        return NULL;
    }
    uint32_t n_prefix = 0, n_layers = 0, kv_dim = 0;
    if (version == 4) {
        n_prefix = lp_le_get_u32(p + 48), n_layers = lp_le_get_u32(p + 52), kv_dim = lp_le_get_u32(p + 56);
        if (n_prefix < 1 || n_prefix > LP_MAX_KV_PREFIX || n_layers < 1 || n_layers > LP_LPF_MAX_LAYERS ||
            kv_dim < 1 || kv_dim > LP_LPF_MAX_DIM) {
            lp_error_set(err, LP_ERR_FORMAT, "%s: a KV prefix of %u entries, %u layers, width %u (1..%d, 1..%d, "
                         "1..%d)", what, n_prefix, n_layers, kv_dim, LP_MAX_KV_PREFIX, LP_LPF_MAX_LAYERS,
                         LP_LPF_MAX_DIM);
            return NULL;
        }
    }
    for (int i = version == 4 ? 60 : version == 3 ? 48 : version == 2 ? 44 : 40; i < LP_LPF_HEADER_BYTES; i++)
        if (p[i]) {
            lp_error_set(err, LP_ERR_FORMAT, "%s: reserved header byte %d is not zero", what, i);
            return NULL;
        }
    /* sizes: all small by the checks above, still computed with overflow checks */
    size_t data_off = LP_LPF_HEADER_BYTES + name_padded(name_len), data_bytes, total, hashed, prefix_floats;
    size_t packed = n_corpus ? corpus_bytes(n_corpus, bits) : 0;
    if (!lp_mul_ok((size_t)n_layers * 2 * n_prefix, kv_dim, &prefix_floats) ||
        !lp_add_ok((size_t)k * dim, prefix_floats, &data_bytes) || !lp_mul_ok(data_bytes, sizeof(float), &data_bytes) ||
        !lp_add_ok(data_bytes, packed, &hashed) || !lp_add_ok(data_off, hashed, &total)) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: size overflows", what);
        return NULL;
    }
    if (size != total) {
        lp_error_set(err, LP_ERR_FORMAT,
                     "%s: %zu bytes, but a forecast file of %u x %u with a %u-byte name, %u corpus tokens and a KV "
                     "prefix of %zu floats has %zu", what, size, k, dim, name_len, n_corpus, prefix_floats, total);
        return NULL;
    }
    const uint8_t *name = p + LP_LPF_HEADER_BYTES;
    if (memchr(name, 0, name_len) || !lp_utf8_valid(name, name_len)) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: the adapter name is not UTF-8 text", what);
        return NULL;
    }
    for (size_t i = LP_LPF_HEADER_BYTES + name_len; i < data_off; i++)
        if (p[i]) {
            lp_error_set(err, LP_ERR_FORMAT, "%s: padding after the name is not zero", what);
            return NULL;
        }
    if (lp_lpa_hash(LP_LPA_HASH_SEED, p + data_off, hashed) != sum) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: the checksum does not match (damaged file)", what);
        return NULL;
    }
    lp_forecast *f = forecast_new((int)k, (int)dim, err);
    if (!f) return NULL;
    f->n_vocab = (int)n_vocab;
    f->fingerprint = fp;
    memcpy(f->name, name, name_len);
    f->name[name_len] = 0;
    size_t bad = read_floats(f->data, p + data_off, (size_t)k * dim);
    if (bad < (size_t)k * dim) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: forecast embedding %zu, element %zu is not finite", what, bad / dim,
                     bad % dim);
        lp_forecast_free(f);
        return NULL;
    }
    if (prefix_floats && read_prefix(f, p + data_off + (size_t)k * dim * sizeof(float), (int)n_prefix, (int)n_layers,
                                     (int)kv_dim, what, err)) {
        lp_forecast_free(f);
        return NULL;
    }
    if (n_corpus && parse_corpus(f, p + data_off + data_bytes, packed, (int)n_corpus, bits, what, err)) {
        lp_forecast_free(f);
        return NULL;
    }
    return f;
}

lp_forecast *lp_forecast_load(const char *path, lp_error *err) {
    if (!path) {
        lp_error_set(err, LP_ERR_INVALID, "no forecast file named");
        return NULL;
    }
    lp_mapped_file mf;
    if (lp_map_file(path, &mf, err)) return NULL;
    lp_forecast *f = lp_lpf_parse(mf.data, mf.size, path, err);
    lp_unmap_file(&mf);
    return f;
}

lp_forecast *lp_forecast_from_memory(const void *data, size_t size, const char *what, lp_error *err) {
    return lp_lpf_parse(data, size, what, err);
}

lp_forecast *lp_forecast_create(const lp_model *model, int k, const float *embd, const char *adapter_name,
                                lp_error *err) {
    if (!model || !embd) {
        lp_error_set(err, LP_ERR_INVALID, "lp_forecast_create needs a model and embeddings");
        return NULL;
    }
    lp_model_info info;
    lp_model_get_info(model, &info);
    if (k < 1 || k > LP_LPF_MAX_K || info.dim < 1 || info.dim > LP_LPF_MAX_DIM) {
        lp_error_set(err, LP_ERR_INVALID, "forecast embeddings: k %d (1..%d) or dim %d out of range", k, LP_LPF_MAX_K,
                     info.dim);
        return NULL;
    }
    size_t nl = adapter_name ? strlen(adapter_name) : 0;
    if (nl >= LP_LPF_NAME_BYTES || (nl && (memchr(adapter_name, 0, nl) ||
                                           !lp_utf8_valid((const uint8_t *)adapter_name, nl)))) {
        lp_error_set(err, LP_ERR_INVALID, "forecast embeddings: adapter name too long or not UTF-8 (at most %d bytes)",
                     LP_LPF_NAME_BYTES - 1);
        return NULL;
    }
    for (size_t i = 0; i < (size_t)k * (size_t)info.dim; i++)
        if (!isfinite(embd[i])) {
            lp_error_set(err, LP_ERR_INVALID, "forecast embeddings: element %zu is not finite", i);
            return NULL;
        }
    lp_forecast *f = forecast_new(k, info.dim, err);
    if (!f) return NULL;
    memcpy(f->data, embd, (size_t)k * (size_t)info.dim * sizeof(float));
    f->n_vocab = info.n_vocab;
    f->fingerprint = lp_model_fingerprint(model);
    if (nl) memcpy(f->name, adapter_name, nl);
    f->name[nl] = 0;
    return f;
}

int lp_forecast_save(const lp_forecast *f, const char *path, lp_error *err) {
    if (!f || !path) return lp_error_set(err, LP_ERR_INVALID, "lp_forecast_save needs a forecast set and a path");
    size_t nl = strlen(f->name), off = LP_LPF_HEADER_BYTES + name_padded(nl);
    size_t prefix_floats = lp_forecast_prefix_floats(f);
    size_t data_bytes = ((size_t)f->k * (size_t)f->dim + prefix_floats) * sizeof(float);
    size_t total = lp_lpf_file_bytes(f->k, f->dim, nl, f->n_vocab, (size_t)f->n_corpus, prefix_floats);
    uint8_t *buf = calloc(1, total);
    if (!buf) return lp_error_set(err, LP_ERR_NOMEM, "out of memory writing %s", path);
    memcpy(buf, LP_LPF_MAGIC, 4);
    /* the oldest version that holds the set: older readers keep reading what they can */
    lp_le_put_u32(buf + 4, f->n_prefix ? 4 : f->n_corpus ? 3 : 1);
    lp_le_put_u32(buf + 8, (uint32_t)f->dim);
    lp_le_put_u32(buf + 12, (uint32_t)f->k);
    lp_le_put_u32(buf + 16, (uint32_t)f->n_vocab);
    lp_le_put_u32(buf + 20, (uint32_t)nl);
    lp_le_put_u64(buf + 24, f->fingerprint);
    memcpy(buf + LP_LPF_HEADER_BYTES, f->name, nl);
    for (size_t i = 0; i < (size_t)f->k * (size_t)f->dim; i++) lp_le_put_f32(buf + off + 4 * i, f->data[i]);
    if (f->n_prefix) {
        lp_le_put_u32(buf + 48, (uint32_t)f->n_prefix);
        lp_le_put_u32(buf + 52, (uint32_t)f->n_layers);
        lp_le_put_u32(buf + 56, (uint32_t)f->kv_dim);
        uint8_t *at = buf + off + (size_t)f->k * (size_t)f->dim * sizeof(float);
        for (size_t i = 0; i < prefix_floats; i++) lp_le_put_f32(at + 4 * i, f->prefix[i]);
    }
    if (f->n_corpus) {
        int bits = lp_lpf_token_bits((uint32_t)f->n_vocab);
        lp_le_put_u32(buf + 40, (uint32_t)f->n_corpus);
        lp_le_put_u32(buf + 44, (uint32_t)bits);
        for (int i = 0; i < f->n_corpus; i++)
            pack(buf + off + data_bytes, (size_t)i, bits,
                 f->corpus[i] < 0 ? (uint32_t)((1ull << bits) - 1) : (uint32_t)f->corpus[i]);
    }
    lp_le_put_u64(buf + 32, lp_lpa_hash(LP_LPA_HASH_SEED, buf + off, total - off));
    FILE *fp = fopen(path, "wb");
    int rc = 0;
    if (!fp) {
        rc = lp_error_set(err, LP_ERR_IO, "%s: cannot open for writing", path);
    } else {
        bool ok = fwrite(buf, 1, total, fp) == total;
        if (fclose(fp) != 0) ok = false;
        if (!ok) rc = lp_error_set(err, LP_ERR_IO, "%s: write failed", path);
    }
    free(buf);
    return rc;
}

int lp_forecast_check(const lp_forecast *f, const lp_model *model, lp_error *err) {
    if (!f || !model) return lp_error_set(err, LP_ERR_INVALID, "lp_forecast_check needs a forecast set and a model");
    lp_model_info info;
    lp_model_get_info(model, &info);
    if (f->dim != info.dim)
        return lp_error_set(err, LP_ERR_FORMAT, "forecast embeddings of width %d do not fit a model of dim %d", f->dim,
                            info.dim);
    if (f->n_vocab && f->n_vocab != info.n_vocab)
        return lp_error_set(err, LP_ERR_FORMAT, "forecast embeddings were made for a vocabulary of %d, the model has %d",
                            f->n_vocab, info.n_vocab);
    if (f->n_prefix && (f->n_layers != info.n_layers || f->kv_dim != info.n_kv_heads * info.head_dim))
        return lp_error_set(err, LP_ERR_FORMAT, "the forecast set's KV prefix is for %d layers of width %d, the model "
                            "has %d of %d", f->n_layers, f->kv_dim, info.n_layers, info.n_kv_heads * info.head_dim);
    if (f->fingerprint && f->fingerprint != lp_model_fingerprint(model))
        return lp_error_set(err, LP_ERR_FORMAT, "forecast embeddings were made for another base (fingerprint differs)");
    return 0;
}

int lp_forecast_k(const lp_forecast *f) { return f ? f->k : 0; }
int lp_forecast_dim(const lp_forecast *f) { return f ? f->dim : 0; }
const float *lp_forecast_data(const lp_forecast *f) { return f ? f->data : NULL; }
const char *lp_forecast_adapter_name(const lp_forecast *f) { return f ? f->name : ""; }

size_t lp_forecast_prefix_floats(const lp_forecast *f) {
    return f ? prefix_floats_of(f->n_prefix, f->n_layers, f->kv_dim) : 0;
}
int lp_forecast_prefix_len(const lp_forecast *f) { return f ? f->n_prefix : 0; }
const float *lp_forecast_prefix(const lp_forecast *f) { return f ? f->prefix : NULL; }

int lp_forecast_set_prefix(lp_forecast *f, const lp_model *model, const float *kv, int n, lp_error *err) {
    if (!f || !model || n < 0 || n > LP_MAX_KV_PREFIX || (n && !kv))
        return lp_error_set(err, LP_ERR_INVALID, "lp_forecast_set_prefix needs a set, a model and 0..%d entries",
                            LP_MAX_KV_PREFIX);
    lp_model_info info;
    lp_model_get_info(model, &info);
    if (info.dim != f->dim) return lp_error_set(err, LP_ERR_INVALID, "the KV prefix's model is not the set's");
    int kv_dim = info.n_kv_heads * info.head_dim;
    size_t count = prefix_floats_of(n, info.n_layers, kv_dim);
    for (size_t i = 0; i < count; i++)
        if (!isfinite(kv[i])) return lp_error_set(err, LP_ERR_INVALID, "KV prefix element %zu is not finite", i);
    float *copy = count ? malloc(count * sizeof *copy) : NULL;
    if (count && !copy) return lp_error_set(err, LP_ERR_NOMEM, "out of memory for a KV prefix of %zu floats", count);
    if (count) memcpy(copy, kv, count * sizeof *copy);
    free(f->prefix);
    f->prefix = copy;
    f->n_prefix = n;
    f->n_layers = n ? info.n_layers : 0;
    f->kv_dim = n ? kv_dim : 0;
    return 0;
}
