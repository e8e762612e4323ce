/* Model loading: format detection, the GGUF loader, shared validation, and
 * the public model/tokenizer API. */
#include "model.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- ownership ------------------------------------------------------------- */

void *lp_model_own(lp_model *m, size_t bytes) {
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 64;
        void **grown = realloc(m->owned, (size_t)cap * sizeof *grown);
        if (!grown) return NULL;
        m->owned = grown;
        m->cap_owned = cap;
    }
    void *p = lp_alloc(bytes);
    if (p) m->owned[m->n_owned++] = p;
    return p;
}

void lp_model_free(lp_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_owned; i++) lp_free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    lp_tokenizer_free(m->tok);
    lp_gguf_close(m->gguf);
    lp_unmap_file(&m->lpx_file);
    lp_safetensors_close(m->st);
    if (m->has_l2c) lp_llama2c_close(&m->l2c);
    free(m);
}

/* ---- format detection ------------------------------------------------------ */

static bool is_directory(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool has_gguf_magic(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char magic[4] = {0};
    size_t got = fread(magic, 1, 4, f);
    fclose(f);
    return got == 4 && memcmp(magic, "GGUF", 4) == 0;
}

lp_model *lp_model_load(const char *path, const lp_model_params *params,
                        lp_error *err) {
    lp_model *m = calloc(1, sizeof *m);
    if (!m) {
        lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    snprintf(m->path, sizeof m->path, "%s", path);
    m->no_repack = params && params->no_repack;
    m->int8_activations = true;
    int acts = params ? params->activations : 0;
    if (acts != 0 && acts != 8 && acts != 32) {
        lp_fail(err, "activations must be 0 (model's choice), 8 (int8) or 32 (float), not %d", acts);
        free(m);
        return NULL;
    }
    int rc;
    if (is_directory(path)) {
        rc = lp_model_load_hf(m, path, err);
    } else if (lp_is_lpx_file(path)) {
        rc = lp_model_load_lpx(m, path, params && params->huge_pages, err);
    } else if (has_gguf_magic(path)) {
        /* threads that convert block matrices for the integer kernels;
         * without it (NULL) they convert inline */
        lp_error no_pool;
        int threads = params && params->n_load_threads > 0 ? params->n_load_threads : lp_default_threads();
        if (!m->no_repack && threads > 1) m->load_pool = lp_threadpool_create(threads, &no_pool);
        rc = lp_model_load_gguf(m, path, err);
        lp_threadpool_destroy(m->load_pool);
        m->load_pool = NULL;
    } else {
        rc = lp_model_load_llama2c(m, path, params ? params->tokenizer_path : NULL, err);
    }
    if (rc == 0) rc = lp_model_finish(m, err);
    if (rc != 0) {
        lp_error_as_format(err);
        lp_model_free(m);
        return NULL;
    }
    if (acts) m->int8_activations = acts == 8;
    return m;
}

/* ---- GGUF ------------------------------------------------------------------ */

/* A 1-D vector of n floats from a tensor (F32 used in place when aligned,
 * F16/BF16 converted). */
static int gguf_vector(lp_model *m, const char *name, int64_t n, bool required,
                       const float **out, lp_error *err) {
    *out = NULL;
    const lp_gguf_tensor *t = lp_gguf_find_tensor(m->gguf, name);
    if (!t) {
        if (!required) return 0;
        return lp_fail(err, "%s: missing tensor '%s'", m->path, name);
    }
    if ((int64_t)t->n_elements != n)
        return lp_fail(err, "%s: tensor '%s' has %llu elements, expected %lld",
                       m->path, name, (unsigned long long)t->n_elements, (long long)n);
    if (t->type == LP_F32 && ((uintptr_t)t->data % 4) == 0) {
        *out = t->data;
        return 0;
    }
    if (t->type != LP_F32 && t->type != LP_F16 && t->type != LP_BF16)
        return lp_fail(err, "%s: tensor '%s' has type %s; vectors must be F32/F16/BF16",
                       m->path, name, lp_dtype_name(t->type));
    float *buf = lp_model_own(m, (size_t)n * sizeof(float));
    if (!buf) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    lp_dequantize_row(t->type, t->data, buf, n);
    *out = buf;
    return 0;
}

/* GGUF block matrices converted for the integer kernels at load (one copy
 * of the matrix):
 * - Q4_0 / Q8_0 -> LP_W4 / LP_W8 group 32 panels, losslessly (same codes,
 *   same f16 scales);
 * - other block types (K-quants, Q4_1, Q5_0, Q5_1) -> LP_W8 group 32,
 *   requantized. Their codes do not map onto W4/W8 codes, and on the float
 *   kernels every block is decoded again on every token: the Q6_K
 *   classifier of a llama.cpp Q4_0 TinyLlama took 13 of its 31 ms per
 *   token. Each weight lands within half an 8-bit step (the group's largest
 *   |w| / 254) of its stored value: about an eighth of a Q6_K or Q5_K
 *   level, a sixteenth of a Q4_K one.
 * Panels are independent, so the load pool's threads take a share each. */
typedef struct convert_task {
    const lp_weight *src;
    uint32_t packed;     /* LP_W4 or LP_W8 */
    bool requantize;     /* decode to float and pack, rather than repack the codes */
    uint8_t *dst;
    size_t panel_bytes;
    atomic_int failed;
} convert_task;

static void convert_worker(void *arg, int thread, int n_threads) {
    convert_task *t = arg;
    const lp_weight *w = t->src;
    int64_t p0, p1;
    lp_split_range((w->rows + 15) / 16, thread, n_threads, 1, &p0, &p1);
    float *rows = t->requantize && p1 > p0 ? malloc(16 * (size_t)w->cols * sizeof *rows) : NULL;
    if (t->requantize && p1 > p0 && !rows) {
        atomic_store(&t->failed, 1);
        return;
    }
    for (int64_t p = p0; p < p1; p++) {
        int64_t r0 = 16 * p, n = w->rows - r0 < 16 ? w->rows - r0 : 16;
        const uint8_t *src = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
        uint8_t *dst = t->dst + (size_t)p * t->panel_bytes;
        bool ok;
        if (t->requantize) {
            for (int64_t i = 0; i < n; i++) lp_dequantize_row(w->type, src + (size_t)i * w->row_bytes, rows + i * w->cols, w->cols);
            ok = lp_pack_weight_ex(LP_W8, 32, rows, n, w->cols, dst, false) == 0;
        } else {
            uint32_t got;
            ok = lp_pack_from_gguf(w->type, src, n, w->cols, dst, &got) == 0 && got == t->packed;
        }
        if (!ok) atomic_store(&t->failed, 1);
    }
    free(rows);
}

static int convert_for_int_kernels(lp_model *m, const char *name, lp_weight *w, lp_error *err) {
    bool lossless = w->type == LP_Q4_0 || w->type == LP_Q8_0;
    uint32_t packed = w->type == LP_Q4_0 ? LP_W4 : LP_W8;
    size_t bytes = lp_pack_bytes(packed, w->rows, w->cols, 32);
    if (bytes == 0) return 0; /* shape the packer can't take: keep the GGUF layout */
    convert_task t = {.src = w, .packed = packed, .requantize = !lossless,
                      .panel_bytes = lp_pack_bytes(packed, 16, w->cols, 32)};
    atomic_init(&t.failed, 0);
    if (!(t.dst = lp_model_own(m, bytes))) return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory converting '%s'", m->path, name);
    lp_threadpool_run(m->load_pool, convert_worker, &t);
    if (atomic_load(&t.failed))
        return lp_fail(err, "%s: cannot %s '%s' (%s)", m->path, lossless ? "repack" : "requantize", name,
                       lp_dtype_name(w->type));
    *w = lp_packed_weight(packed, 32, w->rows, w->cols, t.dst);
    m->n_repacked++;
    return 0;
}

/* lookup_only: the matrix is only read a row at a time (an untied token
 * embedding), so requantizing it would cost load time for nothing. */
static int gguf_matrix(lp_model *m, const char *name, int64_t rows, int64_t cols,
                       bool required, bool lookup_only, lp_weight *out, lp_error *err) {
    memset(out, 0, sizeof *out);
    const lp_gguf_tensor *t = lp_gguf_find_tensor(m->gguf, name);
    if (!t) {
        if (!required) return 0;
        return lp_fail(err, "%s: missing tensor '%s'", m->path, name);
    }
    if (t->n_dims != 2 || (int64_t)t->dims[0] != cols || (int64_t)t->dims[1] != rows)
        return lp_fail(err, "%s: tensor '%s' has shape [%llu, %llu], expected [%lld, %lld]",
                       m->path, name, (unsigned long long)t->dims[0],
                       (unsigned long long)(t->n_dims > 1 ? t->dims[1] : 1),
                       (long long)cols, (long long)rows);
    const lp_dtype_info *info = lp_dtype_get(t->type);
    if (!info || !info->supported)
        return lp_fail(err, "%s: tensor '%s' has type %s, which is not supported",
                       m->path, name, lp_dtype_name(t->type));
    out->type = t->type;
    out->rows = rows;
    out->cols = cols;
    out->row_bytes = lp_dtype_row_bytes(t->type, (uint64_t)cols);
    out->data = t->data;
    if (m->no_repack || info->block_elems == 1) return 0;
    if (lookup_only && t->type != LP_Q4_0 && t->type != LP_Q8_0) return 0;
    return convert_for_int_kernels(m, name, out, err);
}

/* Reads "{arch}.{suffix}" as u32 into *out; required keys fail when absent. */
static int arch_u32(const lp_model *m, const char *arch, const char *suffix,
                    bool required, int *out, lp_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v;
    int rc = lp_gguf_get_u32(m->gguf, key, &v, err);
    if (rc < 0) return -1;
    if (rc == 0) {
        if (required) return lp_fail(err, "%s: missing key '%s'", m->path, key);
        return 0;
    }
    if (v > (1u << 30)) return lp_fail(err, "%s: key '%s' = %u is absurd", m->path, key, v);
    *out = (int)v;
    return 0;
}

static int arch_f32(const lp_model *m, const char *arch, const char *suffix,
                    float *out, lp_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return lp_gguf_get_f32(m->gguf, key, out, err) < 0 ? -1 : 0;
}

int lp_model_load_gguf(lp_model *m, const char *path, lp_error *err) {
    m->format = "gguf";
    m->gguf = lp_gguf_open(path, err);
    if (!m->gguf) return -1;
    lp_str arch_s;
    if (lp_gguf_get_str(m->gguf, "general.architecture", &arch_s, err) != 1)
        return lp_fail(err, "%s: missing general.architecture", path);
    char arch[32];
    snprintf(arch, sizeof arch, "%.*s", (int)(arch_s.len < 31 ? arch_s.len : 31), arch_s.ptr);
    lp_hparams *hp = &m->hp;
    if (lp_arch_from_name(arch, &hp->arch) != 0) {
        if (strcmp(arch, "mistral") == 0) hp->arch = LP_ARCH_LLAMA;
        else return lp_fail(err, "%s: architecture '%s' is not supported (llama, mistral, qwen2, qwen3 are)", path, arch);
    }
    lp_str name;
    if (lp_gguf_get_str(m->gguf, "general.name", &name, NULL) == 1)
        snprintf(m->name, sizeof m->name, "%.*s", (int)(name.len < 127 ? name.len : 127), name.ptr);

    hp->n_ctx_train = 2048;
    hp->rope_theta = 10000.0f;
    hp->rms_eps = 1e-5f;
    if (arch_u32(m, arch, "embedding_length", true, &hp->dim, err) ||
        arch_u32(m, arch, "block_count", true, &hp->n_layers, err) ||
        arch_u32(m, arch, "feed_forward_length", true, &hp->ffn_dim, err) ||
        arch_u32(m, arch, "attention.head_count", true, &hp->n_heads, err) ||
        arch_u32(m, arch, "context_length", false, &hp->n_ctx_train, err) ||
        arch_f32(m, arch, "rope.freq_base", &hp->rope_theta, err) ||
        arch_f32(m, arch, "attention.layer_norm_rms_epsilon", &hp->rms_eps, err))
        return -1;
    hp->n_kv_heads = hp->n_heads;
    if (arch_u32(m, arch, "attention.head_count_kv", false, &hp->n_kv_heads, err)) return -1;
    if (hp->n_heads <= 0) return lp_fail(err, "%s: attention.head_count is 0", path);
    hp->head_dim = hp->dim / hp->n_heads;
    if (arch_u32(m, arch, "attention.key_length", false, &hp->head_dim, err)) return -1;
    hp->rope_neox = hp->arch != LP_ARCH_LLAMA;

    const lp_gguf_tensor *embd = lp_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!embd) return lp_fail(err, "%s: missing tensor 'token_embd.weight'", path);
    if (embd->n_dims != 2 || embd->dims[1] > (1u << 24))
        return lp_fail(err, "%s: token_embd.weight has a bad shape", path);
    hp->n_vocab = (int)embd->dims[1];

    m->tok = lp_tokenizer_from_gguf(m->gguf, err);
    if (!m->tok) return -1;

    int64_t dim = hp->dim, q_dim = (int64_t)hp->n_heads * hp->head_dim,
            kv_dim = (int64_t)hp->n_kv_heads * hp->head_dim;
    bool untied = lp_gguf_find_tensor(m->gguf, "output.weight") != NULL;
    if (gguf_matrix(m, "token_embd.weight", hp->n_vocab, dim, true, untied, &m->tok_embd, err) ||
        gguf_matrix(m, "output.weight", hp->n_vocab, dim, false, false, &m->output, err) ||
        gguf_vector(m, "output_norm.weight", dim, true, &m->output_norm, err))
        return -1;
    m->tied_output = m->output.data == NULL;
    if (m->tied_output) m->output = m->tok_embd;

    const float *freq_factors;
    if (gguf_vector(m, "rope_freqs.weight", hp->head_dim / 2, false, &freq_factors, err)) return -1;
    m->rope_inv_freq = lp_model_own(m, (size_t)(hp->head_dim / 2 + 1) * sizeof(float));
    if (!m->rope_inv_freq) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    m->has_freq_factors = freq_factors != NULL;
    for (int i = 0; i < hp->head_dim / 2; i++) {
        m->rope_inv_freq[i] = powf(hp->rope_theta, -2.0f * (float)i / (float)hp->head_dim);
        if (freq_factors) m->rope_inv_freq[i] /= freq_factors[i];
    }

    if (hp->n_layers <= 0 || hp->n_layers > 4096)
        return lp_fail(err, "%s: block_count %d is out of range", path, hp->n_layers);
    m->layers = calloc((size_t)hp->n_layers, sizeof *m->layers);
    if (!m->layers) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    for (int l = 0; l < hp->n_layers; l++) {
        lp_layer *L = &m->layers[l];
        char n[96];
#define T(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, l), n)
        if (gguf_matrix(m, T("attn_q.weight"), q_dim, dim, true, false, &L->wq, err) ||
            gguf_matrix(m, T("attn_k.weight"), kv_dim, dim, true, false, &L->wk, err) ||
            gguf_matrix(m, T("attn_v.weight"), kv_dim, dim, true, false, &L->wv, err) ||
            gguf_matrix(m, T("attn_output.weight"), dim, q_dim, true, false, &L->wo, err) ||
            gguf_matrix(m, T("ffn_gate.weight"), hp->ffn_dim, dim, true, false, &L->w_gate, err) ||
            gguf_matrix(m, T("ffn_up.weight"), hp->ffn_dim, dim, true, false, &L->w_up, err) ||
            gguf_matrix(m, T("ffn_down.weight"), dim, hp->ffn_dim, true, false, &L->w_down, err) ||
            gguf_vector(m, T("attn_norm.weight"), dim, true, &L->attn_norm, err) ||
            gguf_vector(m, T("ffn_norm.weight"), dim, true, &L->ffn_norm, err) ||
            gguf_vector(m, T("attn_q.bias"), q_dim, hp->arch == LP_ARCH_QWEN2, &L->bq, err) ||
            gguf_vector(m, T("attn_k.bias"), kv_dim, hp->arch == LP_ARCH_QWEN2, &L->bk, err) ||
            gguf_vector(m, T("attn_v.bias"), kv_dim, hp->arch == LP_ARCH_QWEN2, &L->bv, err) ||
            gguf_vector(m, T("attn_q_norm.weight"), hp->head_dim, hp->arch == LP_ARCH_QWEN3, &L->q_norm, err) ||
            gguf_vector(m, T("attn_k_norm.weight"), hp->head_dim, hp->arch == LP_ARCH_QWEN3, &L->k_norm, err))
            return -1;
#undef T
    }
    return 0;
}

/* ---- shared validation -------------------------------------------------------- */

int lp_model_finish(lp_model *m, lp_error *err) {
    const lp_hparams *hp = &m->hp;
    if (hp->dim <= 0 || hp->n_heads <= 0 || hp->n_kv_heads <= 0 || hp->head_dim <= 0 ||
        hp->ffn_dim <= 0 || hp->n_vocab <= 0 || hp->n_layers <= 0)
        return lp_fail(err, "%s: model dimensions must be positive", m->path);
    if (hp->n_heads % hp->n_kv_heads != 0)
        return lp_fail(err, "%s: %d heads are not a multiple of %d KV heads", m->path,
                       hp->n_heads, hp->n_kv_heads);
    if (hp->head_dim % 2 != 0 || hp->head_dim > LP_HEAD_DIM_MAX)
        return lp_fail(err, "%s: head dimension %d must be even and at most %d", m->path,
                       hp->head_dim, LP_HEAD_DIM_MAX);
    if (!(hp->rms_eps > 0.0f) || !(hp->rope_theta > 0.0f))
        return lp_fail(err, "%s: rms epsilon and rope theta must be positive", m->path);
    if (lp_tokenizer_n_vocab(m->tok) > hp->n_vocab)
        return lp_fail(err, "%s: tokenizer has %d tokens but the embedding only %d rows",
                       m->path, lp_tokenizer_n_vocab(m->tok), hp->n_vocab);
    return lp_arch_describe(m, err);
}

/* ---- public accessors ---------------------------------------------------------- */

static uint64_t weight_params(const lp_weight *w) { return (uint64_t)(w->rows * w->cols); }
static uint64_t weight_bytes(const lp_weight *w) {
    if (lp_dtype_is_packed(w->type)) /* packed panels: row_bytes is an average */
        return lp_pack_bytes(w->type, w->rows, w->cols, w->group);
    return (uint64_t)w->row_bytes * (uint64_t)w->rows;
}

void lp_model_foreach_weight(const lp_model *m,
                             void (*fn)(void *, const char *, const char *, int64_t, int64_t),
                             void *user) {
    fn(user, "token_embd", lp_dtype_name(m->tok_embd.type), m->tok_embd.rows, m->tok_embd.cols);
    if (!m->tied_output)
        fn(user, "output", lp_dtype_name(m->output.type), m->output.rows, m->output.cols);
    static const char *const names[7] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                         "ffn_gate", "ffn_up", "ffn_down"};
    for (int l = 0; l < m->hp.n_layers; l++) {
        const lp_layer *L = &m->layers[l];
        const lp_weight *ws[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s", l, names[i]);
            fn(user, name, lp_dtype_name(ws[i]->type), ws[i]->rows, ws[i]->cols);
        }
    }
}

void lp_model_get_info(const lp_model *m, lp_model_info *info) {
    memset(info, 0, sizeof *info);
    const lp_hparams *hp = &m->hp;
    info->arch = lp_arch_name(hp->arch);
    info->format = m->format;
    info->name = m->name;
    info->n_vocab = hp->n_vocab;
    info->dim = hp->dim;
    info->n_layers = hp->n_layers;
    info->n_heads = hp->n_heads;
    info->n_kv_heads = hp->n_kv_heads;
    info->head_dim = hp->head_dim;
    info->ffn_dim = hp->ffn_dim;
    info->n_ctx_train = hp->n_ctx_train;
    info->rope_theta = hp->rope_theta;
    info->rms_eps = hp->rms_eps;
    info->rope_neox = hp->rope_neox;
    info->rope_freq_factors = m->has_freq_factors;
    info->tied_output = m->tied_output;
    uint64_t params = weight_params(&m->tok_embd), bytes = weight_bytes(&m->tok_embd);
    if (!m->tied_output) {
        params += weight_params(&m->output);
        bytes += weight_bytes(&m->output);
    }
    for (int l = 0; l < hp->n_layers; l++) {
        const lp_layer *L = &m->layers[l];
        const lp_weight *ws[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) {
            params += weight_params(ws[i]);
            bytes += weight_bytes(ws[i]);
        }
        params += 2 * (uint64_t)hp->dim;
    }
    info->n_params = params + (uint64_t)hp->dim;
    info->weight_bytes = bytes;
    info->tokenizer = lp_tokenizer_kind(m->tok) == LP_TOK_SPM ? "spm" : "bpe";
    info->chat_format = lp_chat_format_name(lp_tokenizer_chat_format(m->tok));
}

int lp_tokenize(const lp_model *m, const char *text, size_t len, bool add_bos,
                bool parse_special, int32_t *out, int cap, lp_error *err) {
    return lp_tokenizer_encode(m->tok, text, len, add_bos, parse_special, out, cap, err);
}

size_t lp_token_to_piece(const lp_model *m, int32_t token, char *buf, size_t cap) {
    return lp_tokenizer_decode_token(m->tok, token, false, buf, cap);
}

int32_t lp_token_bos(const lp_model *m) { return lp_tokenizer_bos(m->tok); }
int32_t lp_token_eos(const lp_model *m) { return lp_tokenizer_eos(m->tok); }
bool lp_token_is_eog(const lp_model *m, int32_t t) { return lp_tokenizer_is_eog(m->tok, t); }
bool lp_model_add_bos(const lp_model *m) { return lp_tokenizer_add_bos(m->tok); }

char *lp_chat_apply(const lp_model *m, const lp_message *msgs, int n,
                    bool add_generation_prompt, lp_error *err) {
    lp_chat_format f = lp_tokenizer_chat_format(m->tok);
    if (f == LP_CHAT_NONE) {
        lp_fail(err, "%s: the model has no chat template", m->path);
        return NULL;
    }
    /* lp_message and lp_chat_message have the same layout by design. */
    lp_chat_message *cm = calloc((size_t)(n > 0 ? n : 1), sizeof *cm);
    if (!cm) {
        lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        cm[i].role = msgs[i].role;
        cm[i].content = msgs[i].content;
    }
    char *s = lp_chat_render(f, cm, n, add_generation_prompt, err);
    free(cm);
    return s;
}
