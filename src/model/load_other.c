/* Loaders for Hugging Face model directories (config.json + safetensors +
 * tokenizer.json) and llama2.c checkpoints. Both store matrices row-major
 * [out][in] like us, so weights are used in place from the mapping. */
#include "model.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static bool file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static void rope_table(lp_model *m, const float *freq_factors) {
    const lp_hparams *hp = &m->hp;
    for (int i = 0; i < hp->head_dim / 2; i++) {
        m->rope_inv_freq[i] = powf(hp->rope_theta, -2.0f * (float)i / (float)hp->head_dim);
        if (freq_factors) m->rope_inv_freq[i] /= freq_factors[i];
    }
}

/* ---- Hugging Face directory ---------------------------------------------------- */

static int json_int(const cJSON *cfg, const char *key, bool required, int *out,
                    const char *path, lp_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return lp_fail(err, "%s: missing \"%s\"", path, key);
        return 0;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > (double)(1 << 30) ||
        v->valuedouble != floor(v->valuedouble))
        return lp_fail(err, "%s: \"%s\" must be a non-negative integer", path, key);
    *out = (int)v->valuedouble;
    return 0;
}

static int json_float(const cJSON *cfg, const char *key, float *out, const char *path,
                      lp_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v)) return lp_fail(err, "%s: \"%s\" must be a number", path, key);
    *out = (float)v->valuedouble;
    return 0;
}

/* Llama 3.1/3.2 "llama3" rope scaling: long wavelengths are slowed by
 * `factor`, short ones kept, the band between interpolated. Returned as the
 * per-frequency divisor that GGUF files store as rope_freqs.weight. */
static int llama3_freq_factors(lp_model *m, const cJSON *scaling, const float **out,
                               const char *path, lp_error *err) {
    *out = NULL;
    if (!scaling || !cJSON_IsObject(scaling)) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(scaling, "rope_type");
    if (!type) type = cJSON_GetObjectItemCaseSensitive(scaling, "type");
    if (!cJSON_IsString(type)) return 0;
    if (strcmp(type->valuestring, "llama3") != 0) {
        if (strcmp(type->valuestring, "default") == 0) return 0;
        return lp_fail(err, "%s: rope_scaling type \"%s\" is not supported (llama3 is)",
                       path, type->valuestring);
    }
    float factor = 8, low = 1, high = 4, orig = 8192;
    json_float(scaling, "factor", &factor, path, NULL);
    json_float(scaling, "low_freq_factor", &low, path, NULL);
    json_float(scaling, "high_freq_factor", &high, path, NULL);
    json_float(scaling, "original_max_position_embeddings", &orig, path, NULL);
    if (!(factor > 0) || !(high > low) || !(orig > 0))
        return lp_fail(err, "%s: rope_scaling values are invalid", path);
    int half = m->hp.head_dim / 2;
    float *ff = lp_model_own(m, (size_t)(half + 1) * sizeof(float));
    if (!ff) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < half; i++) {
        double freq = pow(m->hp.rope_theta, -2.0 * i / m->hp.head_dim);
        double wavelen = 2.0 * M_PI / freq;
        if (wavelen < orig / high) ff[i] = 1.0f;
        else if (wavelen > orig / low) ff[i] = factor;
        else {
            double smooth = (orig / wavelen - low) / (high - low);
            ff[i] = (float)(1.0 / ((1.0 - smooth) / factor + smooth));
        }
    }
    *out = ff;
    return 0;
}

static int hf_weight(lp_model *m, const char *name, int64_t rows, int64_t cols,
                     bool required, lp_weight *out, lp_error *err) {
    memset(out, 0, sizeof *out);
    const lp_st_tensor *t = lp_safetensors_find(m->st, name);
    if (!t) {
        if (!required) return 0;
        return lp_fail(err, "%s: missing tensor '%s'", m->path, name);
    }
    if (t->n_dims != 2 || (int64_t)t->shape[0] != rows || (int64_t)t->shape[1] != cols)
        return lp_fail(err, "%s: tensor '%s' has the wrong shape (expected [%lld, %lld])",
                       m->path, name, (long long)rows, (long long)cols);
    uint32_t type;
    switch (t->dtype) {
    case LP_ST_F32: type = LP_F32; break;
    case LP_ST_F16: type = LP_F16; break;
    case LP_ST_BF16: type = LP_BF16; break;
    default:
        return lp_fail(err, "%s: tensor '%s' has dtype %s (F32, F16, BF16 are supported)",
                       m->path, name, lp_st_dtype_name(t->dtype));
    }
    const void *data = t->data;
    size_t elem = lp_st_dtype_size(t->dtype);
    if ((uintptr_t)data % elem != 0) { /* misaligned in the file: copy once */
        void *copy = lp_model_own(m, t->n_bytes);
        if (!copy) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        memcpy(copy, data, t->n_bytes);
        data = copy;
    }
    out->type = type;
    out->rows = rows;
    out->cols = cols;
    out->row_bytes = (size_t)cols * elem;
    out->data = data;
    return 0;
}

static int hf_vector(lp_model *m, const char *name, int64_t n, bool required,
                     const float **out, lp_error *err) {
    *out = NULL;
    const lp_st_tensor *t = lp_safetensors_find(m->st, name);
    if (!t) {
        if (!required) return 0;
        return lp_fail(err, "%s: missing tensor '%s'", m->path, name);
    }
    if ((int64_t)t->n_elements != n)
        return lp_fail(err, "%s: tensor '%s' has %llu elements, expected %lld", m->path,
                       name, (unsigned long long)t->n_elements, (long long)n);
    float *buf = lp_model_own(m, (size_t)n * sizeof(float));
    if (!buf) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    if (lp_st_to_f32(t, buf, err)) return lp_fail_prefix(err, "%s", m->path);
    *out = buf;
    return 0;
}

static int hf_config(lp_model *m, const char *dir, cJSON **cfg_out, lp_error *err) {
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text;
    size_t len;
    if (lp_read_file(path, &text, &len, 1 << 20, err)) return -1;
    cJSON *cfg = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cfg || !cJSON_IsObject(cfg)) {
        cJSON_Delete(cfg);
        return lp_fail(err, "%s: not a valid JSON object", path);
    }
    *cfg_out = cfg;
    lp_hparams *hp = &m->hp;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    if (!cJSON_IsString(type)) return lp_fail(err, "%s: missing \"model_type\"", path);
    if (strcmp(type->valuestring, "llama") == 0 || strcmp(type->valuestring, "mistral") == 0)
        hp->arch = LP_ARCH_LLAMA;
    else if (lp_arch_from_name(type->valuestring, &hp->arch) != 0)
        return lp_fail(err, "%s: model_type \"%s\" is not supported (llama, mistral, qwen2, qwen3 are)",
                       path, type->valuestring);
    hp->rope_theta = 10000.0f;
    hp->rms_eps = 1e-5f;
    hp->n_ctx_train = 2048;
    if (json_int(cfg, "hidden_size", true, &hp->dim, path, err) ||
        json_int(cfg, "num_hidden_layers", true, &hp->n_layers, path, err) ||
        json_int(cfg, "num_attention_heads", true, &hp->n_heads, path, err) ||
        json_int(cfg, "intermediate_size", true, &hp->ffn_dim, path, err) ||
        json_int(cfg, "vocab_size", true, &hp->n_vocab, path, err) ||
        json_int(cfg, "max_position_embeddings", false, &hp->n_ctx_train, path, err) ||
        json_float(cfg, "rope_theta", &hp->rope_theta, path, err) ||
        json_float(cfg, "rms_norm_eps", &hp->rms_eps, path, err))
        return -1;
    hp->n_kv_heads = hp->n_heads;
    if (json_int(cfg, "num_key_value_heads", false, &hp->n_kv_heads, path, err)) return -1;
    if (hp->n_heads == 0 || hp->n_layers == 0 || hp->n_layers > 4096)
        return lp_fail(err, "%s: head or layer count out of range", path);
    hp->head_dim = hp->dim / hp->n_heads;
    if (json_int(cfg, "head_dim", false, &hp->head_dim, path, err)) return -1;
    /* Hugging Face keeps q/k in rotate-half order (no permutation at
     * conversion), which is the NEOX pairing. */
    hp->rope_neox = true;
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(cfg, "tie_word_embeddings");
    m->tied_output = cJSON_IsBool(tie) ? cJSON_IsTrue(tie) : false;
    return 0;
}

int lp_model_load_hf(lp_model *m, const char *dir, lp_error *err) {
    m->format = "safetensors";
    cJSON *cfg = NULL;
    if (hf_config(m, dir, &cfg, err)) {
        cJSON_Delete(cfg);
        return -1;
    }
    lp_hparams *hp = &m->hp;
    m->rope_inv_freq = lp_model_own(m, (size_t)(hp->head_dim / 2 + 1) * sizeof(float));
    const float *ff = NULL;
    int rc = m->rope_inv_freq ? 0 : lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    if (rc == 0) {
        char path[1200];
        snprintf(path, sizeof path, "%s/config.json", dir);
        rc = llama3_freq_factors(m, cJSON_GetObjectItemCaseSensitive(cfg, "rope_scaling"),
                                 &ff, path, err);
    }
    cJSON_Delete(cfg);
    if (rc) return -1;
    m->has_freq_factors = ff != NULL;
    rope_table(m, ff);

    m->st = lp_safetensors_open(dir, err);
    if (!m->st) return -1;
    char tok_json[1200], tok_cfg[1200];
    snprintf(tok_json, sizeof tok_json, "%s/tokenizer.json", dir);
    snprintf(tok_cfg, sizeof tok_cfg, "%s/tokenizer_config.json", dir);
    m->tok = lp_tokenizer_from_hf(tok_json, file_exists(tok_cfg) ? tok_cfg : NULL, err);
    if (!m->tok) return -1;

    int64_t dim = hp->dim, q_dim = (int64_t)hp->n_heads * hp->head_dim,
            kv_dim = (int64_t)hp->n_kv_heads * hp->head_dim;
    if (hf_weight(m, "model.embed_tokens.weight", hp->n_vocab, dim, true, &m->tok_embd, err) ||
        hf_weight(m, "lm_head.weight", hp->n_vocab, dim, false, &m->output, err) ||
        hf_vector(m, "model.norm.weight", dim, true, &m->output_norm, err))
        return -1;
    if (!m->output.data) m->tied_output = true;
    if (m->tied_output) m->output = m->tok_embd;
    m->layers = calloc((size_t)hp->n_layers, sizeof *m->layers);
    if (!m->layers) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    bool qwen2 = hp->arch == LP_ARCH_QWEN2, qwen3 = hp->arch == LP_ARCH_QWEN3;
    for (int l = 0; l < hp->n_layers; l++) {
        lp_layer *L = &m->layers[l];
        char n[128];
#define T(suffix) (snprintf(n, sizeof n, "model.layers.%d." suffix, l), n)
        if (hf_weight(m, T("self_attn.q_proj.weight"), q_dim, dim, true, &L->wq, err) ||
            hf_weight(m, T("self_attn.k_proj.weight"), kv_dim, dim, true, &L->wk, err) ||
            hf_weight(m, T("self_attn.v_proj.weight"), kv_dim, dim, true, &L->wv, err) ||
            hf_weight(m, T("self_attn.o_proj.weight"), dim, q_dim, true, &L->wo, err) ||
            hf_weight(m, T("mlp.gate_proj.weight"), hp->ffn_dim, dim, true, &L->w_gate, err) ||
            hf_weight(m, T("mlp.up_proj.weight"), hp->ffn_dim, dim, true, &L->w_up, err) ||
            hf_weight(m, T("mlp.down_proj.weight"), dim, hp->ffn_dim, true, &L->w_down, err) ||
            hf_vector(m, T("input_layernorm.weight"), dim, true, &L->attn_norm, err) ||
            hf_vector(m, T("post_attention_layernorm.weight"), dim, true, &L->ffn_norm, err) ||
            hf_vector(m, T("self_attn.q_proj.bias"), q_dim, qwen2, &L->bq, err) ||
            hf_vector(m, T("self_attn.k_proj.bias"), kv_dim, qwen2, &L->bk, err) ||
            hf_vector(m, T("self_attn.v_proj.bias"), kv_dim, qwen2, &L->bv, err) ||
            hf_vector(m, T("self_attn.q_norm.weight"), hp->head_dim, qwen3, &L->q_norm, err) ||
            hf_vector(m, T("self_attn.k_norm.weight"), hp->head_dim, qwen3, &L->k_norm, err))
            return -1;
#undef T
    }
    return 0;
}

/* ---- llama2.c checkpoint ------------------------------------------------------- */

static lp_weight f32_matrix(const float *data, int64_t rows, int64_t cols) {
    lp_weight w = {.type = LP_F32, .rows = rows, .cols = cols,
                   .row_bytes = (size_t)cols * sizeof(float), .data = data};
    return w;
}

/* The tokenizer: explicit path, else tokenizer.bin or tok<vocab>.bin beside
 * the checkpoint. */
static int find_llama2c_tokenizer(const char *model_path, int vocab, char *out,
                                  size_t cap) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", model_path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    snprintf(out, cap, "%s/tokenizer.bin", dir);
    if (file_exists(out)) return 0;
    snprintf(out, cap, "%s/tok%d.bin", dir, vocab);
    if (file_exists(out)) return 0;
    return -1;
}

int lp_model_load_llama2c(lp_model *m, const char *path, const char *tokenizer_path,
                          lp_error *err) {
    m->format = "llama2c";
    if (lp_llama2c_open(path, &m->l2c, err)) return -1;
    m->has_l2c = true;
    const lp_llama2c *c = &m->l2c;
    lp_hparams *hp = &m->hp;
    hp->arch = LP_ARCH_LLAMA;
    hp->dim = c->dim;
    hp->n_layers = c->n_layers;
    hp->n_heads = c->n_heads;
    hp->n_kv_heads = c->n_kv_heads;
    hp->head_dim = c->dim / c->n_heads;
    hp->ffn_dim = c->hidden_dim;
    hp->n_vocab = c->vocab_size;
    hp->n_ctx_train = c->seq_len;
    hp->rope_theta = 10000.0f;
    hp->rms_eps = 1e-5f;
    hp->rope_neox = false; /* run.c rotates adjacent pairs */

    char tok_path[1100];
    if (tokenizer_path) snprintf(tok_path, sizeof tok_path, "%s", tokenizer_path);
    else if (find_llama2c_tokenizer(path, c->vocab_size, tok_path, sizeof tok_path))
        return lp_fail(err, "%s: llama2.c checkpoints need a tokenizer file: pass --tokenizer "
                       "(no tokenizer.bin or tok%d.bin beside the model)", path, c->vocab_size);
    snprintf(m->tokenizer_path, sizeof m->tokenizer_path, "%s", tok_path);
    m->tok = lp_tokenizer_from_llama2c(tok_path, c->vocab_size, err);
    if (!m->tok) return -1;

    m->rope_inv_freq = lp_model_own(m, (size_t)(hp->head_dim / 2 + 1) * sizeof(float));
    if (!m->rope_inv_freq) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    rope_table(m, NULL);

    int64_t dim = c->dim, kv_dim = (int64_t)c->n_kv_heads * hp->head_dim, hid = c->hidden_dim;
    m->tok_embd = f32_matrix(c->token_embedding, c->vocab_size, dim);
    m->tied_output = c->shared_classifier;
    m->output = m->tied_output ? m->tok_embd : f32_matrix(c->wcls, c->vocab_size, dim);
    m->output_norm = c->rms_final;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    for (int64_t l = 0; l < c->n_layers; l++) {
        lp_layer *L = &m->layers[l];
        L->wq = f32_matrix(c->wq + l * dim * dim, dim, dim);
        L->wk = f32_matrix(c->wk + l * kv_dim * dim, kv_dim, dim);
        L->wv = f32_matrix(c->wv + l * kv_dim * dim, kv_dim, dim);
        L->wo = f32_matrix(c->wo + l * dim * dim, dim, dim);
        L->w_gate = f32_matrix(c->w1 + l * hid * dim, hid, dim);
        L->w_down = f32_matrix(c->w2 + l * dim * hid, dim, hid);
        L->w_up = f32_matrix(c->w3 + l * hid * dim, hid, dim);
        L->attn_norm = c->rms_att + l * dim;
        L->ffn_norm = c->rms_ffn + l * dim;
    }
    return 0;
}
