/* Export: the trained model as a llama-architecture GGUF, a LoRA as a
 * Hugging Face PEFT directory, extra embeddings as safetensors. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../formats/gguf.h"
#include "../formats/safetensors.h"
#include "train_internal.h"

static void set_llama_u32(lp_gguf_writer *w, const char *key, uint32_t v) {
    char full[96];
    snprintf(full, sizeof full, "llama.%s", key);
    lp_gguf_writer_set_u32(w, full, v);
}

static void set_llama_f32(lp_gguf_writer *w, const char *key, float v) {
    char full[96];
    snprintf(full, sizeof full, "llama.%s", key);
    lp_gguf_writer_set_f32(w, full, v);
}

static int copy_vocab(lp_gguf_writer *w, const char *vocab_path, int n_vocab, lp_error *err) {
    lp_gguf *v = lp_gguf_open(vocab_path, err);
    if (!v) return -1;
    const lp_gguf_kv *tokens = NULL;
    int rc = 0;
    if (lp_gguf_get_arr(v, "tokenizer.ggml.tokens", LP_GGUF_STRING, &tokens, err) < 0 || !tokens)
        rc = lp_fail(err, "%s: no tokenizer.ggml.tokens", vocab_path);
    else if (tokens->arr_len != (uint64_t)n_vocab)
        rc = lp_fail(err, "%s: vocabulary has %llu tokens, the model %d", vocab_path,
                     (unsigned long long)tokens->arr_len, n_vocab);
    for (size_t i = 0; rc == 0 && i < lp_gguf_kv_count(v); i++) {
        const lp_gguf_kv *kv = lp_gguf_kv_at(v, i);
        if (kv->key.len >= 10 && memcmp(kv->key.ptr, "tokenizer.", 10) == 0)
            lp_gguf_writer_copy_kv(w, kv);
    }
    lp_gguf_close(v);
    return rc;
}

int lp_train_export_gguf(const lp_train_model *m, const char *path, uint32_t weight_type,
                         const char *vocab_path, const char *name, lp_error *err) {
    const lp_train_config *c = &m->cfg;
    if (weight_type != LP_F32 && weight_type != LP_F16)
        return lp_fail(err, "export: weights can be F32 or F16");
    lp_gguf_writer *w = lp_gguf_writer_create();
    if (!w) return lp_fail(err, "out of memory");
    lp_gguf_writer_set_str(w, "general.architecture", "llama");
    lp_gguf_writer_set_str(w, "general.type", "model");
    lp_gguf_writer_set_str(w, "general.name", name ? name : "loraplex-trained");
    set_llama_u32(w, "block_count", (uint32_t)c->n_layers);
    set_llama_u32(w, "context_length", (uint32_t)c->n_ctx);
    set_llama_u32(w, "embedding_length", (uint32_t)c->dim);
    set_llama_u32(w, "feed_forward_length", (uint32_t)c->ffn_dim);
    set_llama_u32(w, "attention.head_count", (uint32_t)c->n_heads);
    set_llama_u32(w, "attention.head_count_kv", (uint32_t)c->n_kv_heads);
    set_llama_f32(w, "rope.freq_base", c->rope_theta);
    set_llama_f32(w, "attention.layer_norm_rms_epsilon", c->rms_eps);
    set_llama_u32(w, "attention.key_length", (uint32_t)c->head_dim);
    set_llama_u32(w, "attention.value_length", (uint32_t)c->head_dim);
    set_llama_u32(w, "rope.dimension_count", (uint32_t)c->head_dim);
    set_llama_u32(w, "vocab_size", (uint32_t)c->n_vocab);
    lp_gguf_writer_set_u32(w, "general.file_type", weight_type == LP_F16 ? 1 : 0);
    int rc = vocab_path ? copy_vocab(w, vocab_path, c->n_vocab, err) : 0;
    lp_gguf_writer_set_u32(w, "general.quantization_version", 2);

    uint16_t *half = NULL;
    for (int i = 0; rc == 0 && i < m->n_params; i++) {
        const lp_tparam *t = &m->params[i];
        if (t->group != LP_TRAIN_BASE) continue;
        const float *data = m->group[0] + t->offset;
        char tname[64];
        snprintf(tname, sizeof tname, "%s.weight", t->name);
        if (t->cols == 1) {
            uint64_t dims[1] = {(uint64_t)t->rows};
            lp_gguf_writer_add_tensor_copy(w, tname, LP_F32, 1, dims, data, t->size * sizeof(float));
            continue;
        }
        uint64_t dims[2] = {(uint64_t)t->cols, (uint64_t)t->rows};
        if (weight_type == LP_F32) {
            lp_gguf_writer_add_tensor_copy(w, tname, LP_F32, 2, dims, data, t->size * sizeof(float));
            continue;
        }
        half = realloc(half, t->size * sizeof *half);
        if (!half) {
            rc = lp_fail(err, "out of memory");
            break;
        }
        for (size_t k = 0; k < t->size; k++) half[k] = lp_f32_to_f16(data[k]);
        lp_gguf_writer_add_tensor_copy(w, tname, LP_F16, 2, dims, half, t->size * sizeof *half);
    }
    free(half);
    if (rc == 0) rc = lp_gguf_writer_write(w, path, err);
    lp_gguf_writer_free(w);
    return rc;
}

/* ---- PEFT ----------------------------------------------------------------------- */

static const char *const peft_module[LP_PROJ_COUNT] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};

/* Our q/k rows are in GGUF order (RoPE pairs adjacent); Hugging Face keeps
 * each head's pairs half a head apart: GGUF row 2i+s -> HF row s*d/2+i. */
static void rows_to_hf(float *dst, const float *src, int n_heads, int head_dim, int cols) {
    int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++)
        for (int i = 0; i < half; i++)
            for (int s = 0; s < 2; s++)
                memcpy(dst + ((size_t)h * head_dim + (size_t)s * half + i) * cols,
                       src + ((size_t)h * head_dim + 2 * (size_t)i + s) * cols,
                       (size_t)cols * sizeof(float));
}

static int write_text(const char *path, const char *text, lp_error *err) {
    FILE *f = fopen(path, "wb");
    if (!f) return lp_fail(err, "%s: cannot create", path);
    size_t n = strlen(text);
    bool ok = fwrite(text, 1, n, f) == n;
    if (fclose(f) != 0) ok = false;
    return ok ? 0 : lp_fail(err, "%s: write failed", path);
}

static int write_peft_config(const lp_train_model *m, const char *dir, const char *base_name,
                             lp_error *err) {
    const lp_train_config *c = &m->cfg;
    static const char *const hf_names[LP_PROJ_COUNT] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                       "gate_proj", "up_proj", "down_proj"};
    cJSON *j = cJSON_CreateObject();
    cJSON *targets = cJSON_CreateArray();
    for (int p = 0; p < LP_PROJ_COUNT; p++)
        if (c->lora_targets & (1u << p)) cJSON_AddItemToArray(targets, cJSON_CreateString(hf_names[p]));
    cJSON_AddStringToObject(j, "peft_type", "LORA");
    cJSON_AddStringToObject(j, "task_type", "CAUSAL_LM");
    cJSON_AddStringToObject(j, "base_model_name_or_path", base_name ? base_name : "");
    cJSON_AddNumberToObject(j, "r", c->lora_rank);
    cJSON_AddNumberToObject(j, "lora_alpha", c->lora_alpha);
    cJSON_AddNumberToObject(j, "lora_dropout", 0);
    cJSON_AddStringToObject(j, "bias", "none");
    cJSON_AddBoolToObject(j, "fan_in_fan_out", 0);
    cJSON_AddBoolToObject(j, "use_rslora", 0);
    cJSON_AddBoolToObject(j, "use_dora", 0);
    cJSON_AddItemToObject(j, "target_modules", targets);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return lp_fail(err, "out of memory");
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    int rc = write_text(path, text, err);
    free(text);
    return rc;
}

int lp_train_export_peft(const lp_train_model *m, const char *dir, const char *base_name,
                         lp_error *err) {
    const lp_train_config *c = &m->cfg;
    if (c->lora_rank <= 0) return lp_fail(err, "export: the model has no LoRA");
    if (strlen(dir) > 4000) return lp_fail(err, "%s: path too long", dir);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return lp_fail(err, "%s: cannot create directory", dir);
    if (write_peft_config(m, dir, base_name, err) < 0) return -1;

    lp_st_writer *w = lp_st_writer_create();
    float **owned = calloc((size_t)c->n_layers * LP_PROJ_COUNT, sizeof *owned);
    if (!w || !owned) {
        lp_st_writer_free(w);
        free(owned);
        return lp_fail(err, "out of memory");
    }
    int rc = 0, n_owned = 0;
    for (int l = 0; l < c->n_layers && rc == 0; l++)
        for (int p = 0; p < LP_PROJ_COUNT; p++) {
            const lp_tlayer *L = &m->w.layers[l];
            if (!L->lora_a[p]) continue;
            int in = (int)lp_t_lora_rows_in(c, p), out = (int)lp_t_lora_rows_out(c, p), r = c->lora_rank;
            const float *b = L->lora_b[p];
            if (p == LP_PROJ_Q || p == LP_PROJ_K) {
                float *perm = malloc((size_t)out * r * sizeof *perm);
                if (!perm) {
                    rc = lp_fail(err, "out of memory");
                    break;
                }
                rows_to_hf(perm, b, p == LP_PROJ_Q ? c->n_heads : c->n_kv_heads, c->head_dim, r);
                owned[n_owned++] = perm;
                b = perm;
            }
            char name[160];
            uint64_t shape_a[2] = {(uint64_t)r, (uint64_t)in}, shape_b[2] = {(uint64_t)out, (uint64_t)r};
            snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_A.weight", l, peft_module[p]);
            lp_st_writer_add(w, name, LP_ST_F32, 2, shape_a, L->lora_a[p], (size_t)r * in * sizeof(float));
            snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_B.weight", l, peft_module[p]);
            lp_st_writer_add(w, name, LP_ST_F32, 2, shape_b, b, (size_t)out * r * sizeof(float));
        }
    if (rc == 0) {
        char path[4096];
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
        lp_st_writer_set_metadata(w, "format", "pt");
        rc = lp_st_writer_write(w, path, err);
    }
    lp_st_writer_free(w);
    for (int i = 0; i < n_owned; i++) free(owned[i]);
    free(owned);
    return rc;
}

int lp_train_export_extra(const lp_train_model *m, const char *path, lp_error *err) {
    const lp_train_config *c = &m->cfg;
    if (c->n_extra <= 0) return lp_fail(err, "export: the model has no extra embeddings");
    lp_st_writer *w = lp_st_writer_create();
    if (!w) return lp_fail(err, "out of memory");
    uint64_t shape[2] = {(uint64_t)c->n_extra, (uint64_t)c->dim};
    lp_st_writer_add(w, "extra_embeddings", LP_ST_F32, 2, shape, m->w.extra,
                     (size_t)c->n_extra * c->dim * sizeof(float));
    char v[32];
    snprintf(v, sizeof v, "%d", c->n_vocab);
    lp_st_writer_set_metadata(w, "n_vocab", v);
    snprintf(v, sizeof v, "%d", c->dim);
    lp_st_writer_set_metadata(w, "dim", v);
    int rc = lp_st_writer_write(w, path, err);
    lp_st_writer_free(w);
    return rc;
}
