/* Tests for the random-weight model and LoRA generator (src/model/synth.c):
 * presets, keys and tensors of written files for llama/qwen2/qwen3 and every
 * weight type, value distributions, determinism, vocabulary copy, llama3
 * rope factors against the shared reference model, and the LoRA adapter
 * format against stories260K-lora-r4-random-f32.gguf. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/dtype.h"
#include "check.h"
#include "formats/gguf.h"
#include "kernels/kernels.h"
#include "tools/synth.h"

static char tmpdir[64];

static const char *tmp_path(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", tmpdir, name);
    return buf;
}

static bool str_is(lp_str s, const char *c) { return lp_str_eq(s, c); }

static uint32_t get_u32(const lp_gguf *g, const char *key) {
    uint32_t v = 0xdeadbeef;
    lp_error err = {0};
    CHECK_MSG(lp_gguf_get_u32(g, key, &v, &err) == 1, "key %s: %s", key, err.message);
    return v;
}

static float get_f32(const lp_gguf *g, const char *key) {
    float v = -1.0f;
    lp_error err = {0};
    CHECK_MSG(lp_gguf_get_f32(g, key, &v, &err) == 1, "key %s: %s", key, err.message);
    return v;
}

static bool key_str_is(const lp_gguf *g, const char *key, const char *want) {
    lp_str s = {0};
    lp_error err = {0};
    return lp_gguf_get_str(g, key, &s, &err) == 1 && str_is(s, want);
}

/* Checks a tensor's presence, shape and type. */
static const lp_gguf_tensor *expect_tensor(const lp_gguf *g, const char *name,
                                           uint64_t d0, uint64_t d1, uint32_t type) {
    const lp_gguf_tensor *t = lp_gguf_find_tensor(g, name);
    CHECK_MSG(t != NULL, "tensor %s missing", name);
    if (!t) return NULL;
    uint32_t nd = d1 ? 2 : 1;
    CHECK_MSG(t->n_dims == nd && t->dims[0] == d0 && (!d1 || t->dims[1] == d1),
              "%s: dims %u [%llu, %llu], want [%llu, %llu]", name, t->n_dims,
              (unsigned long long)t->dims[0], (unsigned long long)t->dims[1],
              (unsigned long long)d0, (unsigned long long)d1);
    CHECK_MSG(t->type == type, "%s: type %s, want %s", name, lp_dtype_name(t->type),
              lp_dtype_name(type));
    return t;
}

/* The type synth uses for rows of n elements when `want` does not fit. */
static uint32_t fitted(uint32_t want, uint64_t n) {
    if (lp_dtype_row_bytes(want, n)) return want;
    return lp_dtype_row_bytes(LP_Q8_0, n) ? LP_Q8_0 : LP_F16;
}

/* Every key and tensor a llama.cpp loader expects for this configuration. */
static void check_model_file(const char *path, const lp_synth_params *p,
                             uint64_t n_vocab) {
    lp_error err = {0};
    lp_gguf *g = lp_gguf_open(path, &err);
    CHECK_MSG(g != NULL, "%s", err.message);
    if (!g) return;
    const char *arch = lp_arch_name(p->arch);
    char key[128], name[128];
    CHECK(key_str_is(g, "general.architecture", arch));
    CHECK(key_str_is(g, "general.type", "model"));
    CHECK(key_str_is(g, "general.name", p->name ? p->name : arch));
    CHECK(lp_gguf_find(g, "general.file_type") != NULL);
    CHECK(get_u32(g, "general.quantization_version") == 2);
#define ARCH_U32(k, v)                                          \
    do {                                                        \
        snprintf(key, sizeof key, "%s." k, arch);               \
        CHECK_MSG(get_u32(g, key) == (uint32_t)(v), "%s", key); \
    } while (0)
    ARCH_U32("context_length", p->n_ctx);
    ARCH_U32("embedding_length", p->dim);
    ARCH_U32("block_count", p->n_layers);
    ARCH_U32("feed_forward_length", p->ffn_dim);
    ARCH_U32("attention.head_count", p->n_heads);
    ARCH_U32("attention.head_count_kv", p->n_kv_heads);
    ARCH_U32("attention.key_length", p->head_dim);
    ARCH_U32("attention.value_length", p->head_dim);
    ARCH_U32("rope.dimension_count", p->head_dim);
    ARCH_U32("vocab_size", n_vocab);
#undef ARCH_U32
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    CHECK(get_f32(g, key) == p->rms_eps);
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    CHECK(get_f32(g, key) == p->rope_theta);

    const lp_gguf_kv *tokens = NULL;
    CHECK(lp_gguf_get_arr(g, "tokenizer.ggml.tokens", LP_GGUF_STRING, &tokens, &err) == 1);
    CHECK(tokens && tokens->arr_len == n_vocab);

    const uint64_t dim = (uint64_t)p->dim, ffn = (uint64_t)p->ffn_dim;
    const uint64_t hd = (uint64_t)p->head_dim;
    const uint64_t q_dim = (uint64_t)p->n_heads * hd, kv_dim = (uint64_t)p->n_kv_heads * hd;
    const uint32_t wt = p->weight_type;
    size_t expected = 2 + (p->tied_output ? 0 : 1) + (p->llama3_rope_scaling ? 1 : 0);
    expect_tensor(g, "token_embd.weight", dim, n_vocab, fitted(p->embd_type, dim));
    expect_tensor(g, "output_norm.weight", dim, 0, LP_F32);
    if (p->tied_output)
        CHECK(lp_gguf_find_tensor(g, "output.weight") == NULL);
    else
        expect_tensor(g, "output.weight", dim, n_vocab, fitted(p->embd_type, dim));
    if (p->llama3_rope_scaling)
        expect_tensor(g, "rope_freqs.weight", hd / 2, 0, LP_F32);
    else
        CHECK(lp_gguf_find_tensor(g, "rope_freqs.weight") == NULL);
    for (int l = 0; l < p->n_layers; l++) {
        struct { const char *what; uint64_t d0, d1; uint32_t type; } ts[] = {
            {"attn_norm.weight", dim, 0, LP_F32},
            {"attn_q.weight", dim, q_dim, fitted(wt, dim)},
            {"attn_k.weight", dim, kv_dim, fitted(wt, dim)},
            {"attn_v.weight", dim, kv_dim, fitted(wt, dim)},
            {"attn_output.weight", q_dim, dim, fitted(wt, q_dim)},
            {"ffn_norm.weight", dim, 0, LP_F32},
            {"ffn_gate.weight", dim, ffn, fitted(wt, dim)},
            {"ffn_up.weight", dim, ffn, fitted(wt, dim)},
            {"ffn_down.weight", ffn, dim, fitted(wt, ffn)},
        };
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            snprintf(name, sizeof name, "blk.%d.%s", l, ts[i].what);
            expect_tensor(g, name, ts[i].d0, ts[i].d1, ts[i].type);
        }
        expected += 9;
        const char *bias[3] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
        const uint64_t bias_dim[3] = {q_dim, kv_dim, kv_dim};
        for (int i = 0; i < 3; i++) {
            snprintf(name, sizeof name, "blk.%d.%s", l, bias[i]);
            if (p->arch == LP_ARCH_QWEN2) {
                expect_tensor(g, name, bias_dim[i], 0, LP_F32);
                expected++;
            } else {
                CHECK(lp_gguf_find_tensor(g, name) == NULL);
            }
        }
        const char *qk[2] = {"attn_q_norm.weight", "attn_k_norm.weight"};
        for (int i = 0; i < 2; i++) {
            snprintf(name, sizeof name, "blk.%d.%s", l, qk[i]);
            if (p->arch == LP_ARCH_QWEN3) {
                expect_tensor(g, name, hd, 0, LP_F32);
                expected++;
            } else {
                CHECK(lp_gguf_find_tensor(g, name) == NULL);
            }
        }
    }
    CHECK_MSG(lp_gguf_tensor_count(g) == expected, "%zu tensors, want %zu",
              lp_gguf_tensor_count(g), expected);
    lp_gguf_close(g);
}

static void write_or_fail(const lp_synth_params *p, const char *path) {
    lp_error err = {0};
    int rc = lp_synth_write(p, path, &err);
    CHECK_MSG(rc == 0, "lp_synth_write %s: %s", path, err.message);
}

static void test_presets(void) {
    lp_error err = {0};
    lp_synth_params p;
    const struct { const char *name; lp_arch arch; int dim, layers, heads, kv, hd, ffn, ctx;
                   float theta, eps; bool tied, l3; const char *vocab; } want[] = {
        {"tinyllama-1.1b", LP_ARCH_LLAMA, 2048, 22, 32, 4, 64, 5632, 2048, 10000.0f, 1e-5f,
         false, false, "ggml-vocab-llama-spm.gguf"},
        {"llama-3.2-1b", LP_ARCH_LLAMA, 2048, 16, 32, 8, 64, 8192, 131072, 500000.0f, 1e-5f,
         true, true, "ggml-vocab-llama-bpe.gguf"},
        {"qwen2.5-0.5b", LP_ARCH_QWEN2, 896, 24, 14, 2, 64, 4864, 32768, 1e6f, 1e-6f,
         true, false, "ggml-vocab-qwen2.gguf"},
        {"qwen3-0.6b", LP_ARCH_QWEN3, 1024, 28, 16, 8, 128, 3072, 40960, 1e6f, 1e-6f,
         true, false, "ggml-vocab-qwen2.gguf"},
        {"tiny", LP_ARCH_LLAMA, 64, 2, 4, 2, 16, 192, 512, 10000.0f, 1e-5f, false, false,
         NULL},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        CHECK(lp_synth_preset(want[i].name, &p, &err) == 0);
        CHECK_MSG(p.arch == want[i].arch && p.dim == want[i].dim &&
                  p.n_layers == want[i].layers && p.n_heads == want[i].heads &&
                  p.n_kv_heads == want[i].kv && p.head_dim == want[i].hd &&
                  p.ffn_dim == want[i].ffn && p.n_ctx == want[i].ctx &&
                  p.rope_theta == want[i].theta && p.rms_eps == want[i].eps &&
                  p.tied_output == want[i].tied && p.llama3_rope_scaling == want[i].l3,
                  "preset %s", want[i].name);
        CHECK(p.weight_type == LP_F16 && p.embd_type == LP_F16 && p.vocab_path == NULL);
        CHECK(p.name && strcmp(p.name, want[i].name) == 0);
        const char *v = lp_synth_preset_vocab(want[i].name);
        CHECK(want[i].vocab ? (v && strcmp(v, want[i].vocab) == 0) : v == NULL);
        if (want[i].vocab) {
            char path[512];
            snprintf(path, sizeof path, "%s/arch/%s", LP_SHARED_MODELS, want[i].vocab);
            CHECK_MSG(access(path, R_OK) == 0, "preset vocabulary %s", path);
        }
    }
    CHECK(lp_synth_preset("gpt-5", &p, &err) == -1);
    CHECK(strstr(err.message, "gpt-5") && strstr(err.message, "tinyllama-1.1b"));
    CHECK(lp_synth_preset_vocab("gpt-5") == NULL);

    lp_arch a;
    for (int i = 0; i < 3; i++) {
        CHECK(lp_arch_from_name(lp_arch_name((lp_arch)i), &a) == 0 && a == (lp_arch)i);
    }
    CHECK(strcmp(lp_arch_name(LP_ARCH_QWEN3), "qwen3") == 0);
    CHECK(lp_arch_from_name("gpt2", &a) == -1);
}

static void tiny_params(lp_synth_params *p) {
    lp_error err = {0};
    CHECK(lp_synth_preset("tiny", p, &err) == 0);
}

/* The tiny preset in every weight type; K-quants fall back on 64-wide rows. */
static void test_tiny_types(void) {
    const uint32_t types[] = {LP_F32, LP_F16, LP_BF16, LP_Q8_0, LP_Q4_0, LP_Q4_1,
                              LP_Q5_0, LP_Q5_1, LP_Q4_K, LP_Q5_K, LP_Q6_K};
    char path[256];
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        lp_synth_params p;
        tiny_params(&p);
        p.weight_type = types[i];
        p.embd_type = types[i] == LP_F32 ? LP_F32 : LP_F16;
        char file[64];
        snprintf(file, sizeof file, "tiny-%s.gguf", lp_dtype_name(types[i]));
        write_or_fail(&p, tmp_path(path, sizeof path, file));
        check_model_file(path, &p, 259);
    }
}

/* Built-in vocabulary, value distributions, and the same model in F32/Q4_K. */
static void test_values(void) {
    char path[256], qpath[256];
    lp_synth_params p;
    tiny_params(&p);
    p.dim = 256;          /* K-quant rows fit */
    p.ffn_dim = 512;
    p.n_heads = 4;
    p.head_dim = 64;
    p.n_layers = 3;
    p.weight_type = LP_F32;
    p.embd_type = LP_F32;
    p.name = "values";
    write_or_fail(&p, tmp_path(path, sizeof path, "values-f32.gguf"));
    check_model_file(path, &p, 259);
    p.weight_type = LP_Q4_K;
    p.embd_type = LP_Q6_K;
    write_or_fail(&p, tmp_path(qpath, sizeof qpath, "values-q4k.gguf"));
    check_model_file(qpath, &p, 259);

    lp_error err = {0};
    lp_gguf *g = lp_gguf_open(path, &err), *q = lp_gguf_open(qpath, &err);
    CHECK_MSG(g && q, "%s", err.message);
    if (!g || !q) {
        if (g) lp_gguf_close(g);
        return;
    }
    /* built-in SentencePiece byte vocabulary */
    const lp_gguf_kv *tok = lp_gguf_find(g, "tokenizer.ggml.tokens");
    const lp_gguf_kv *types = lp_gguf_find(g, "tokenizer.ggml.token_type");
    CHECK(key_str_is(g, "tokenizer.ggml.model", "llama"));
    CHECK(tok && tok->arr_len == 259 && str_is(tok->arr_strs[0], "<unk>") &&
          str_is(tok->arr_strs[1], "<s>") && str_is(tok->arr_strs[2], "</s>") &&
          str_is(tok->arr_strs[3], "<0x00>") && str_is(tok->arr_strs[3 + 0x41], "<0x41>") &&
          str_is(tok->arr_strs[258], "<0xFF>"));
    CHECK(types && types->arr_len == 259 && lp_gguf_arr_i32(types, 0) == 2 &&
          lp_gguf_arr_i32(types, 1) == 3 && lp_gguf_arr_i32(types, 100) == 6);
    CHECK(lp_gguf_find(g, "tokenizer.ggml.scores") != NULL);
    CHECK(get_u32(g, "tokenizer.ggml.bos_token_id") == 1);
    CHECK(get_u32(g, "tokenizer.ggml.eos_token_id") == 2);
    CHECK(get_u32(g, "general.file_type") == 0);
    CHECK(get_u32(q, "general.file_type") == 14);

    /* embedding rows have length sqrt(dim) */
    const lp_gguf_tensor *e = lp_gguf_find_tensor(g, "token_embd.weight");
    const float *ev = e->data;
    for (int r = 0; r < 259; r += 37) {
        double ss = 0;
        for (int i = 0; i < 256; i++) ss += (double)ev[r * 256 + i] * ev[r * 256 + i];
        CHECK_NEAR(ss, 256.0, 0.01);
    }
    /* q ~ N(0, 1/dim); norms in [0.5, 1.5]; output norm scaled by 32/sqrt(dim) */
    const lp_gguf_tensor *wq = lp_gguf_find_tensor(g, "blk.1.attn_q.weight");
    const float *qv = wq->data;
    double sum = 0, ss = 0;
    for (uint64_t i = 0; i < wq->n_elements; i++) {
        sum += qv[i];
        ss += (double)qv[i] * qv[i];
    }
    const double n_q = (double)wq->n_elements, var = ss / n_q;
    CHECK_NEAR(sum / n_q, 0.0, 0.01);
    CHECK_NEAR(var, 1.0 / 256.0, 0.03 / 256.0);
    /* normal shape: 4.55% beyond 2 sigma, 0.27% beyond 3, kurtosis 3 */
    double beyond2 = 0, beyond3 = 0, m4 = 0;
    for (uint64_t i = 0; i < wq->n_elements; i++) {
        double z2 = (double)qv[i] * qv[i] / var;
        beyond2 += z2 > 4.0;
        beyond3 += z2 > 9.0;
        m4 += z2 * z2;
    }
    CHECK_NEAR(beyond2 / n_q, 0.0455, 0.004);
    CHECK_NEAR(beyond3 / n_q, 0.0027, 0.0008);
    CHECK_NEAR(m4 / n_q, 3.0, 0.15);
    const lp_gguf_tensor *an = lp_gguf_find_tensor(g, "blk.2.ffn_norm.weight");
    const lp_gguf_tensor *on = lp_gguf_find_tensor(g, "output_norm.weight");
    bool in_range = true;
    for (int i = 0; i < 256; i++) {
        float a = ((const float *)an->data)[i], o = ((const float *)on->data)[i];
        in_range = in_range && a >= 0.5f && a < 1.5f && o >= 1.0f && o < 3.0f;
    }
    CHECK(in_range);
    /* different tensors of the same shape get different values */
    const lp_gguf_tensor *wk = lp_gguf_find_tensor(g, "blk.1.ffn_gate.weight");
    const lp_gguf_tensor *wu = lp_gguf_find_tensor(g, "blk.1.ffn_up.weight");
    CHECK(memcmp(wk->data, wu->data, 256 * sizeof(float)) != 0);

    /* the Q4_K file holds the same model: dequantized values track F32 */
    const lp_gguf_tensor *qq = lp_gguf_find_tensor(q, "blk.1.attn_q.weight");
    float row[256];
    double err2 = 0;
    for (int r = 0; r < 256; r++) {
        lp_dequantize_row(qq->type, (const uint8_t *)qq->data + (size_t)r * 144, row, 256);
        for (int i = 0; i < 256; i++) {
            double d = row[i] - qv[r * 256 + i];
            err2 += d * d;
        }
    }
    CHECK_MSG(err2 / ss < 0.02, "Q4_K relative error %g", err2 / ss);
    /* ... and so does the Q6_K embedding */
    const lp_gguf_tensor *qe = lp_gguf_find_tensor(q, "token_embd.weight");
    CHECK_MSG(qe != NULL, "token_embd.weight missing from the Q4_K file");
    err2 = 0;
    for (int r = 0; qe && r < 259; r++) {
        lp_dequantize_row(qe->type, (const uint8_t *)qe->data + (size_t)r * 210, row, 256);
        for (int i = 0; i < 256; i++) {
            double d = row[i] - ev[r * 256 + i];
            err2 += d * d;
        }
    }
    CHECK_MSG(err2 / (259.0 * 256.0) < 0.002, "Q6_K embedding error %g", err2 / (259.0 * 256.0));
    lp_gguf_close(g);
    lp_gguf_close(q);
}

static bool files_equal(const char *a, const char *b) {
    lp_mapped_file fa, fb;
    lp_error err;
    if (lp_map_file(a, &fa, &err) < 0) return false;
    if (lp_map_file(b, &fb, &err) < 0) {
        lp_unmap_file(&fa);
        return false;
    }
    bool eq = fa.size == fb.size && (fa.size == 0 || memcmp(fa.data, fb.data, fa.size) == 0);
    lp_unmap_file(&fa);
    lp_unmap_file(&fb);
    return eq;
}

static void test_determinism(void) {
    char a[256], b[256], c[256];
    lp_synth_params p;
    tiny_params(&p);
    p.seed = 42;
    p.weight_type = LP_Q4_0;
    write_or_fail(&p, tmp_path(a, sizeof a, "det-a.gguf"));
    write_or_fail(&p, tmp_path(b, sizeof b, "det-b.gguf"));
    p.seed = 43;
    write_or_fail(&p, tmp_path(c, sizeof c, "det-c.gguf"));
    CHECK(files_equal(a, b));
    CHECK(!files_equal(a, c));
}

static void test_qwen(void) {
    char path[256];
    lp_synth_params p;
    memset(&p, 0, sizeof p);
    p.arch = LP_ARCH_QWEN2;
    p.dim = 32;
    p.n_layers = 2;
    p.n_heads = 4;
    p.n_kv_heads = 2;
    p.head_dim = 8;
    p.ffn_dim = 96;
    p.n_ctx = 1024;
    p.rope_theta = 1e6f;
    p.rms_eps = 1e-6f;
    p.tied_output = true;
    p.weight_type = LP_Q8_0;
    p.embd_type = LP_F16;
    p.seed = 7;
    p.name = "qwen2-custom";
    p.vocab_path = LP_SHARED_MODELS "/arch/ggml-vocab-qwen2.gguf";
    write_or_fail(&p, tmp_path(path, sizeof path, "qwen2.gguf"));
    check_model_file(path, &p, 151936);

    /* every tokenizer.* key of the vocabulary file came across */
    lp_error err = {0};
    lp_gguf *v = lp_gguf_open(p.vocab_path, &err), *g = lp_gguf_open(path, &err);
    CHECK_MSG(v && g, "%s", err.message);
    if (v && g) {
        size_t n_tok_keys = 0;
        for (size_t i = 0; i < lp_gguf_kv_count(v); i++) {
            const lp_gguf_kv *kv = lp_gguf_kv_at(v, i);
            if (kv->key.len < 10 || memcmp(kv->key.ptr, "tokenizer.", 10) != 0) continue;
            n_tok_keys++;
            char key[128];
            snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
            const lp_gguf_kv *copy = lp_gguf_find(g, key);
            CHECK_MSG(copy && copy->type == kv->type && copy->arr_len == kv->arr_len,
                      "tokenizer key %s", key);
        }
        CHECK(n_tok_keys >= 8);
        CHECK(key_str_is(g, "tokenizer.ggml.pre", "qwen2"));
        CHECK(get_u32(g, "tokenizer.ggml.eos_token_id") == 151645);
        const lp_gguf_kv *tok = lp_gguf_find(g, "tokenizer.ggml.tokens");
        CHECK(tok && tok->arr_len == 151936 && str_is(tok->arr_strs[151645], "<|im_end|>"));
        /* biases are N(0, 0.25) */
        const lp_gguf_tensor *b = lp_gguf_find_tensor(g, "blk.0.attn_q.bias");
        double ss = 0;
        for (int i = 0; b && i < 32; i++) ss += (double)((const float *)b->data)[i] * ((const float *)b->data)[i];
        CHECK(ss / 32 > 0.1 && ss / 32 < 0.5);
    }
    if (v) lp_gguf_close(v);
    if (g) lp_gguf_close(g);

    /* qwen3: head_dim * n_heads != dim, q/k norms */
    p.arch = LP_ARCH_QWEN3;
    p.head_dim = 16;
    p.n_layers = 1;
    p.weight_type = LP_F16;
    p.vocab_path = NULL;
    p.name = NULL;
    write_or_fail(&p, tmp_path(path, sizeof path, "qwen3.gguf"));
    check_model_file(path, &p, 259);
}

/* llama3 rope factors equal the ones in the shared reference model. */
static void test_llama3_rope(void) {
    char path[256];
    lp_synth_params p;
    tiny_params(&p);
    p.dim = 16;
    p.n_heads = 2;
    p.n_kv_heads = 1;
    p.head_dim = 8;
    p.ffn_dim = 64;
    p.rope_theta = 500000.0f;
    p.llama3_rope_scaling = true;
    p.tied_output = true;
    write_or_fail(&p, tmp_path(path, sizeof path, "llama3.gguf"));
    check_model_file(path, &p, 259);
    lp_error err = {0};
    lp_gguf *g = lp_gguf_open(path, &err);
    lp_gguf *ref = lp_gguf_open(LP_SHARED_MODELS "/arch/llama3-tiny-random.gguf", &err);
    CHECK_MSG(g && ref, "%s", err.message);
    if (g && ref) {
        const lp_gguf_tensor *a = lp_gguf_find_tensor(g, "rope_freqs.weight");
        const lp_gguf_tensor *b = lp_gguf_find_tensor(ref, "rope_freqs.weight");
        CHECK(a && b && a->n_elements == 4 && b->n_elements == 4);
        for (int i = 0; a && b && i < 4; i++)
            CHECK_NEAR(((const float *)a->data)[i], ((const float *)b->data)[i], 1e-5);
        if (a) CHECK_NEAR(((const float *)a->data)[2], 3.2922626, 1e-5);
        /* tied classifier: output norm magnitudes 8*U(0.5,1.5), random signs */
        const lp_gguf_tensor *on = lp_gguf_find_tensor(g, "output_norm.weight");
        int neg = 0, in_range = 0;
        for (int i = 0; on && i < 16; i++) {
            float v = ((const float *)on->data)[i];
            neg += v < 0;
            in_range += fabsf(v) >= 4.0f && fabsf(v) < 12.0f;
        }
        CHECK(neg > 0 && neg < 16 && in_range == 16);
    }
    if (g) lp_gguf_close(g);
    if (ref) lp_gguf_close(ref);
}

static void test_bad_params(void) {
    char path[256];
    lp_error err = {0};
    lp_synth_params p;
    tiny_params(&p);
    p.n_kv_heads = 3;
    CHECK(lp_synth_write(&p, tmp_path(path, sizeof path, "bad.gguf"), &err) == -1);
    CHECK(strstr(err.message, "n_kv_heads") != NULL);
    tiny_params(&p);
    p.weight_type = LP_Q8_K;
    CHECK(lp_synth_write(&p, path, &err) == -1);
    tiny_params(&p);
    p.dim = 0;
    CHECK(lp_synth_write(&p, path, &err) == -1);
    tiny_params(&p);
    p.vocab_path = "/nonexistent/vocab.gguf";
    err.message[0] = '\0';
    CHECK(lp_synth_write(&p, path, &err) == -1);
    CHECK(strstr(err.message, "/nonexistent/vocab.gguf") != NULL);
    CHECK(access(path, F_OK) != 0);
}

/* The adapter has exactly the reference adapter's keys and tensor layout. */
static void test_lora(void) {
    char path[256];
    lp_error err = {0};
    const char *base = LP_SHARED_MODELS "/stories260K.gguf";
    int rc = lp_synth_lora_write(base, 4, 4.0f, "q,k,v,o,gate,up,down", 5,
                                 tmp_path(path, sizeof path, "lora.gguf"), &err);
    CHECK_MSG(rc == 0, "%s", err.message);
    lp_gguf *g = lp_gguf_open(path, &err);
    lp_gguf *ref = lp_gguf_open(LP_SHARED_MODELS "/stories260K-lora-r4-random-f32.gguf", &err);
    CHECK_MSG(g && ref, "%s", err.message);
    if (g && ref) {
        CHECK(lp_gguf_kv_count(g) == lp_gguf_kv_count(ref));
        for (size_t i = 0; i < lp_gguf_kv_count(ref); i++) {
            const lp_gguf_kv *r = lp_gguf_kv_at(ref, i), *o = lp_gguf_kv_at(g, i);
            CHECK_MSG(o && o->key.len == r->key.len &&
                      memcmp(o->key.ptr, r->key.ptr, r->key.len) == 0 && o->type == r->type,
                      "key %zu: %.*s", i, (int)r->key.len, r->key.ptr);
        }
        CHECK(key_str_is(g, "general.type", "adapter"));
        CHECK(key_str_is(g, "adapter.type", "lora"));
        CHECK(key_str_is(g, "general.architecture", "llama"));
        CHECK(get_f32(g, "adapter.lora.alpha") == 4.0f);
        CHECK(lp_gguf_tensor_count(g) == lp_gguf_tensor_count(ref));
        for (size_t i = 0; i < lp_gguf_tensor_count(ref) && i < lp_gguf_tensor_count(g); i++) {
            const lp_gguf_tensor *r = lp_gguf_tensor_at(ref, i), *o = lp_gguf_tensor_at(g, i);
            CHECK_MSG(o->name.len == r->name.len &&
                      memcmp(o->name.ptr, r->name.ptr, r->name.len) == 0 &&
                      o->n_dims == r->n_dims && o->dims[0] == r->dims[0] &&
                      o->dims[1] == r->dims[1] && o->type == r->type,
                      "tensor %zu: %.*s", i, (int)r->name.len, r->name.ptr);
        }
    }
    if (g) lp_gguf_close(g);
    if (ref) lp_gguf_close(ref);

    /* a subset of targets, on a synthetic qwen3 base */
    char qpath[256];
    tmp_path(qpath, sizeof qpath, "qwen3.gguf");
    rc = lp_synth_lora_write(qpath, 2, 8.0f, "q, down", 1,
                             tmp_path(path, sizeof path, "lora-q3.gguf"), &err);
    CHECK_MSG(rc == 0, "%s", err.message);
    g = lp_gguf_open(path, &err);
    CHECK_MSG(g != NULL, "%s", err.message);
    if (g) {
        CHECK(key_str_is(g, "general.architecture", "qwen3"));
        CHECK(lp_gguf_tensor_count(g) == 4);
        expect_tensor(g, "blk.0.attn_q.weight.lora_a", 32, 2, LP_F32);
        expect_tensor(g, "blk.0.attn_q.weight.lora_b", 2, 64, LP_F32);
        expect_tensor(g, "blk.0.ffn_down.weight.lora_a", 96, 2, LP_F32);
        expect_tensor(g, "blk.0.ffn_down.weight.lora_b", 2, 32, LP_F32);
        lp_gguf_close(g);
    }
    CHECK(lp_synth_lora_write(base, 4, 4.0f, "q,lm_head", 1, path, &err) == -1);
    CHECK(strstr(err.message, "lm_head") != NULL);
    CHECK(lp_synth_lora_write(base, 0, 4.0f, "q", 1, path, &err) == -1);
    CHECK(lp_synth_lora_write("/nonexistent.gguf", 4, 4.0f, "q", 1, path, &err) == -1);
}

static void remove_tmpdir(void) {
    static const char *const files[] = {
        "tiny-F32.gguf", "tiny-F16.gguf", "tiny-BF16.gguf", "tiny-Q8_0.gguf",
        "tiny-Q4_0.gguf", "tiny-Q4_1.gguf", "tiny-Q5_0.gguf", "tiny-Q5_1.gguf",
        "tiny-Q4_K.gguf", "tiny-Q5_K.gguf", "tiny-Q6_K.gguf", "values-f32.gguf", "values-q4k.gguf",
        "det-a.gguf", "det-b.gguf", "det-c.gguf", "qwen2.gguf", "qwen3.gguf",
        "llama3.gguf", "bad.gguf", "lora.gguf", "lora-q3.gguf"};
    char path[256];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        unlink(tmp_path(path, sizeof path, files[i]));
    rmdir(tmpdir);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/lp_test_synth_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_presets();
    test_tiny_types();
    test_values();
    test_determinism();
    test_qwen();
    test_llama3_rope();
    test_bad_params();
    test_lora();
    remove_tmpdir();
    return check_summary("synth");
}
