/* Fuzzes the .lpa reader (against a fake base with stories260K's shape and
 * no weights: validation needs only shapes and the fingerprint) and the PEFT
 * adapter_config.json parser. Seeds: a version 1 and a version 2 file. The .lpa input is tried as is and with its
 * fingerprint and checksums repaired, so mutations reach the entry table. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arch/llama.h"
#include "formats/lpa.h"
#include "model/adapter.h"

static void fake_base(lp_model *m, lp_layer *layers, lp_model_weight *weights) {
    memset(m, 0, sizeof *m);
    m->hp = (lp_hparams){.arch = LP_ARCH_LLAMA, .n_vocab = 512, .dim = 64, .n_layers = 2,
                         .n_heads = 8, .n_kv_heads = 4, .head_dim = 8, .ffn_dim = 172};
    m->layers = layers;
    for (int l = 0; l < 2; l++) {
        lp_layer *L = &layers[l];
        memset(L, 0, sizeof *L);
        L->wq = (lp_weight){.type = 0, .rows = 64, .cols = 64, .row_bytes = 256};
        L->wk = (lp_weight){.type = 0, .rows = 32, .cols = 64, .row_bytes = 256};
        L->wv = L->wk;
        L->wo = L->wq;
        L->w_gate = (lp_weight){.type = 0, .rows = 172, .cols = 64, .row_bytes = 256};
        L->w_up = L->w_gate;
        L->w_down = (lp_weight){.type = 0, .rows = 64, .cols = 172, .row_bytes = 688};
        const lp_weight *ws[LP_PROJ_COUNT] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int p = 0; p < LP_PROJ_COUNT; p++) {
            lp_model_weight *w = &weights[lp_llama_weight_id(l, (lp_proj)p)];
            memset(w, 0, sizeof *w);
            lp_llama_weight_name(l, (lp_proj)p, w->name, sizeof w->name);
            lp_llama_module_name(l, (lp_proj)p, w->hf_name, sizeof w->hf_name);
            w->w = ws[p];
            w->rope_rows = p <= LP_PROJ_K;
        }
    }
    m->weights = weights;
    m->n_weights = 2 * LP_PROJ_COUNT;
}

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void try_lpa(const lp_model *m, const uint8_t *buf, size_t size) {
    lp_error err;
    lp_adapter *a = lp_adapter_load_lpa_memory(m, buf, size, "fuzz.lpa", 1.0f, &err);
    if (a) {
        volatile float sink = 0;
        for (int i = 0; i < a->n_pairs; i++) sink += ((const uint8_t *)a->pairs[i].B.data)[0];
        (void)sink;
    }
    lp_adapter_free(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lp_model m;
    lp_layer layers[2];
    lp_model_weight weights[2 * LP_PROJ_COUNT];
    fake_base(&m, layers, weights);
    if (size > (1u << 20)) return 0;

    uint8_t *buf = lp_alloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    try_lpa(&m, buf, size);
    /* repaired: right size, fingerprint and checksums */
    if (size >= LP_LPA_HEADER_BYTES) {
        put_u64(buf + 8, size);
        put_u64(buf + 32, lp_model_fingerprint(&m));
        uint64_t start = get_u64(buf + 80);
        if (start >= 24 && start <= size) {
            put_u64(buf + 24, lp_lpa_hash(LP_LPA_HASH_SEED, buf + start, size - start));
            uint8_t zero[8] = {0};
            uint64_t h = lp_lpa_hash(LP_LPA_HASH_SEED, buf, 16);
            h = lp_lpa_hash(h, zero, 8);
            h = lp_lpa_hash(h, buf + 24, start - 24);
            put_u64(buf + 16, h);
        }
        try_lpa(&m, buf, size);
    }
    lp_free(buf);

    /* the same bytes as an adapter_config.json */
    lp_peft_config cfg;
    lp_error err;
    if (lp_peft_config_parse((const char *)data, size, "fuzz.json", &cfg, &err) == 0) {
        int r;
        float alpha;
        lp_peft_module_params(&cfg, "model.layers.0.self_attn.q_proj", "fuzz.json", &r, &alpha, &err);
        lp_peft_module_params(&cfg, "model.layers.1.mlp.down_proj", "fuzz.json", &r, &alpha, &err);
        lp_peft_config_free(&cfg);
    }
    return 0;
}
