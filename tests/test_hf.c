/* Hugging Face model directories: a GGUF model is rewritten in the layout
 * Hugging Face uses (config.json, model.safetensors, tokenizer.json, q/k rows
 * in rotate-half order) and must give the same tokens and logits. For llama
 * bases this checks the q/k row permutation and the llama3 rope scaling read
 * from config.json; for qwen2 the biases and tied output. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "runtime/context.h"
#include "tokenizer/tokenizer_internal.h"

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
}

static void write_json(const char *path, cJSON *json) {
    char *text = cJSON_PrintUnformatted(json);
    write_text(path, text);
    free(text);
    cJSON_Delete(json);
}

static cJSON *tokenizer_json(const lp_gguf *g, const char *pattern) {
    const lp_gguf_kv *tokens = lp_gguf_find(g, "tokenizer.ggml.tokens");
    const lp_gguf_kv *merges = lp_gguf_find(g, "tokenizer.ggml.merges");
    const lp_gguf_kv *types = lp_gguf_find(g, "tokenizer.ggml.token_type");
    cJSON *root = cJSON_CreateObject(), *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    char buf[1024];
    for (uint64_t i = 0; i < tokens->arr_len; i++) {
        lp_str s = tokens->arr_strs[i];
        snprintf(buf, sizeof buf, "%.*s", (int)s.len, s.ptr);
        if (lp_gguf_arr_i32(types, i) == 3) {
            cJSON *t = cJSON_CreateObject();
            cJSON_AddNumberToObject(t, "id", (double)i);
            cJSON_AddStringToObject(t, "content", buf);
            cJSON_AddBoolToObject(t, "special", 1);
            cJSON_AddItemToArray(added, t);
        } else if (lp_gguf_arr_i32(types, i) == 1) {
            cJSON_AddNumberToObject(vocab, buf, (double)i);
        }
    }
    cJSON *m = cJSON_AddArrayToObject(model, "merges");
    for (uint64_t i = 0; i < merges->arr_len; i++) {
        lp_str s = merges->arr_strs[i];
        snprintf(buf, sizeof buf, "%.*s", (int)s.len, s.ptr);
        cJSON_AddItemToArray(m, cJSON_CreateString(buf));
    }
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "Sequence");
    cJSON *list = cJSON_AddArrayToObject(pre, "pretokenizers");
    cJSON *split = cJSON_CreateObject();
    cJSON_AddStringToObject(split, "type", "Split");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(split, "pattern"), "Regex", pattern);
    cJSON_AddStringToObject(split, "behavior", "Isolated");
    cJSON_AddItemToArray(list, split);
    cJSON *bl = cJSON_CreateObject();
    cJSON_AddStringToObject(bl, "type", "ByteLevel");
    cJSON_AddBoolToObject(bl, "add_prefix_space", 0);
    cJSON_AddItemToArray(list, bl);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(root, "decoder"), "type", "ByteLevel");
    return root;
}

/* GGUF llama q/k rows are interleaved per head; HF keeps rotate-half order:
 * HF row (s*d/2 + i) is GGUF row (2i + s). */
static void *unpermute_rows(const void *data, int64_t rows, size_t row_bytes, int head_dim) {
    uint8_t *out = malloc((size_t)rows * row_bytes);
    int half = head_dim / 2;
    for (int64_t h = 0; h < rows / head_dim; h++)
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < half; i++)
                memcpy(out + (size_t)(h * head_dim + s * half + i) * row_bytes,
                       (const uint8_t *)data + (size_t)(h * head_dim + 2 * i + s) * row_bytes,
                       row_bytes);
    return out;
}

static const char *hf_name(const char *gguf_name, char *buf, size_t cap) {
    static const char *map[][2] = {
        {"attn_q.weight", "self_attn.q_proj.weight"}, {"attn_k.weight", "self_attn.k_proj.weight"},
        {"attn_v.weight", "self_attn.v_proj.weight"}, {"attn_output.weight", "self_attn.o_proj.weight"},
        {"attn_q.bias", "self_attn.q_proj.bias"}, {"attn_k.bias", "self_attn.k_proj.bias"},
        {"attn_v.bias", "self_attn.v_proj.bias"}, {"ffn_gate.weight", "mlp.gate_proj.weight"},
        {"ffn_up.weight", "mlp.up_proj.weight"}, {"ffn_down.weight", "mlp.down_proj.weight"},
        {"attn_norm.weight", "input_layernorm.weight"},
        {"ffn_norm.weight", "post_attention_layernorm.weight"},
    };
    if (!strcmp(gguf_name, "token_embd.weight")) return "model.embed_tokens.weight";
    if (!strcmp(gguf_name, "output_norm.weight")) return "model.norm.weight";
    if (!strcmp(gguf_name, "output.weight")) return "lm_head.weight";
    int layer, off;
    if (sscanf(gguf_name, "blk.%d.%n", &layer, &off) == 1)
        for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
            if (!strcmp(gguf_name + off, map[i][0])) {
                snprintf(buf, cap, "model.layers.%d.%s", layer, map[i][1]);
                return buf;
            }
    return NULL; /* rope_freqs: expressed as rope_scaling in config.json */
}

/* Writes dir from the GGUF model at path; returns false if unsupported. */
static void convert(const char *path, const char *dir, const char *pattern, bool llama3_scaling) {
    lp_error err;
    lp_gguf *g = lp_gguf_open(path, &err);
    lp_model *m = g ? lp_model_load(path, NULL, &err) : NULL;
    CHECK_MSG(g && m, "%s", err.message); /* a missing input fails here, not by a crash */
    if (!g || !m) {
        lp_gguf_close(g);
        return;
    }
    const lp_hparams *hp = &m->hp;
    char file[1200];

    cJSON *cfg = cJSON_CreateObject();
    cJSON_AddStringToObject(cfg, "model_type", lp_arch_name(hp->arch));
    cJSON_AddNumberToObject(cfg, "hidden_size", hp->dim);
    cJSON_AddNumberToObject(cfg, "num_hidden_layers", hp->n_layers);
    cJSON_AddNumberToObject(cfg, "num_attention_heads", hp->n_heads);
    cJSON_AddNumberToObject(cfg, "num_key_value_heads", hp->n_kv_heads);
    cJSON_AddNumberToObject(cfg, "intermediate_size", hp->ffn_dim);
    cJSON_AddNumberToObject(cfg, "vocab_size", hp->n_vocab);
    cJSON_AddNumberToObject(cfg, "max_position_embeddings", hp->n_ctx_train);
    cJSON_AddNumberToObject(cfg, "rope_theta", hp->rope_theta);
    cJSON_AddNumberToObject(cfg, "rms_norm_eps", hp->rms_eps);
    cJSON_AddBoolToObject(cfg, "tie_word_embeddings", m->tied_output);
    if (llama3_scaling) {
        cJSON *rs = cJSON_AddObjectToObject(cfg, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
        cJSON_AddNumberToObject(rs, "factor", 32);
        cJSON_AddNumberToObject(rs, "low_freq_factor", 1);
        cJSON_AddNumberToObject(rs, "high_freq_factor", 4);
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", 8192);
    }
    snprintf(file, sizeof file, "%s/config.json", dir);
    write_json(file, cfg);

    snprintf(file, sizeof file, "%s/tokenizer.json", dir);
    write_json(file, tokenizer_json(g, pattern));
    cJSON *tc = cJSON_CreateObject();
    int32_t bos = lp_tokenizer_bos(m->tok), eos = lp_tokenizer_eos(m->tok);
    lp_str s;
    size_t len;
    if (bos >= 0) {
        s.ptr = lp_tokenizer_token_text(m->tok, bos, &len);
        char b[128];
        snprintf(b, sizeof b, "%.*s", (int)len, s.ptr);
        cJSON_AddStringToObject(tc, "bos_token", b);
    }
    s.ptr = lp_tokenizer_token_text(m->tok, eos, &len);
    char e[128];
    snprintf(e, sizeof e, "%.*s", (int)len, s.ptr);
    cJSON_AddStringToObject(tc, "eos_token", e);
    cJSON_AddBoolToObject(tc, "add_bos_token", lp_tokenizer_add_bos(m->tok));
    snprintf(file, sizeof file, "%s/tokenizer_config.json", dir);
    write_json(file, tc);

    lp_st_writer *w = lp_st_writer_create();
    void *owned[256];
    int n_owned = 0;
    for (size_t i = 0; i < lp_gguf_tensor_count(g); i++) {
        const lp_gguf_tensor *t = lp_gguf_tensor_at(g, i);
        char gname[256], buf[256];
        snprintf(gname, sizeof gname, "%.*s", (int)t->name.len, t->name.ptr);
        const char *name = hf_name(gname, buf, sizeof buf);
        if (!name) continue;
        uint64_t shape[2] = {t->n_dims > 1 ? t->dims[1] : t->dims[0], t->dims[0]};
        const void *data = t->data;
        if (!hp->rope_neox && (strstr(gname, "attn_q.weight") || strstr(gname, "attn_k.weight")))
            data = owned[n_owned++] = unpermute_rows(t->data, (int64_t)t->dims[1],
                                                     t->n_bytes / t->dims[1], hp->head_dim);
        lp_st_writer_add(w, name, t->type == LP_F16 ? LP_ST_F16 : LP_ST_F32, t->n_dims,
                         t->n_dims > 1 ? shape : t->dims, data, t->n_bytes);
    }
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    CHECK(lp_st_writer_write(w, file, &err) == 0);
    lp_st_writer_free(w);
    for (int i = 0; i < n_owned; i++) free(owned[i]);
    lp_model_free(m);
    lp_gguf_close(g);
}

static const float *run(lp_context *ctx, const int32_t *toks, int n) {
    lp_row rows[32];
    for (int i = 0; i < n; i++) rows[i] = (lp_row){.token = toks[i], .pos = i, .seq = 0, .adapter = 0, .parent = i - 1, .logits = i == n - 1, .commit = true};
    lp_error err;
    CHECK(lp_forward(ctx, rows, n, &err) == 0);
    return lp_logits(ctx, n - 1);
}

static void compare(const char *gguf_path, const char *pattern, bool llama3_scaling, float tol) {
    char dir[] = "/tmp/lp_hf_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    convert(gguf_path, dir, pattern, llama3_scaling);
    lp_error err;
    lp_model *a = lp_model_load(gguf_path, NULL, &err);
    lp_model *b = lp_model_load(dir, NULL, &err);
    CHECK_MSG(b != NULL, "%s", b ? "" : err.message);
    if (!a || !b) return;
    lp_model_info ia, ib;
    lp_model_get_info(a, &ia);
    lp_model_get_info(b, &ib);
    CHECK(strcmp(ib.format, "safetensors") == 0 && ib.rope_neox && ib.dim == ia.dim);
    CHECK(ib.rope_freq_factors == ia.rope_freq_factors);
    const char *text = "Hello world! Ça va? 123456 数字";
    int32_t ta[64], tb[64];
    int na = lp_tokenize(a, text, strlen(text), true, false, ta, 64, &err);
    int nb = lp_tokenize(b, text, strlen(text), true, false, tb, 64, &err);
    CHECK_MSG(na == nb && na > 3 && memcmp(ta, tb, (size_t)na * 4) == 0, "tokens differ (%d vs %d)", na, nb);
    lp_context_params p = lp_context_default_params();
    p.n_threads = 1;
    p.max_rows = 32;
    p.max_sequences = 1;
    p.n_ctx = 64;
    lp_context *ca = lp_context_create(a, &p, &err), *cb = lp_context_create(b, &p, &err);
    const float *la = run(ca, ta, na), *lb = run(cb, ta, na);
    float worst = 0;
    for (int i = 0; i < ia.n_vocab; i++)
        if (fabsf(la[i] - lb[i]) > worst) worst = fabsf(la[i] - lb[i]);
    CHECK_MSG(worst <= tol, "%s: GGUF vs HF logits differ by %g", gguf_path, worst);
    lp_context_free(ca);
    lp_context_free(cb);
    lp_model_free(a);
    lp_model_free(b);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

int main(void) {
    compare(LP_SHARED_MODELS "/arch/qwen2-tiny-random.gguf", tok_pattern_qwen2, false, 1e-4f);
    compare(LP_SHARED_MODELS "/arch/llama3-tiny-random.gguf", tok_pattern_llama3, true, 2e-3f);
    return check_summary("hf");
}
