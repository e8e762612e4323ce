/* The training model: configuration, the parameter table (one contiguous
 * FP32 buffer per group), initialisation and loading a runtime base. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/model.h"
#include "train_internal.h"

static const char *const lp_t_proj_names[LP_PROJ_COUNT] = {"q", "k", "v", "o",
                                                           "gate", "up", "down"};

int lp_train_group_index(int group_bit) {
    return group_bit == LP_TRAIN_BASE ? 0 : group_bit == LP_TRAIN_LORA ? 1 : 2;
}

int lp_train_parse_targets(const char *list, uint32_t *out, lp_error *err) {
    *out = 0;
    const char *s = list;
    while (*s) {
        size_t len = strcspn(s, ",");
        int found = -1;
        for (int p = 0; p < LP_PROJ_COUNT; p++)
            if (strlen(lp_t_proj_names[p]) == len && !strncmp(s, lp_t_proj_names[p], len))
                found = p;
        if (found < 0)
            return lp_fail(err, "unknown LoRA target '%.*s' (use q,k,v,o,gate,up,down)",
                           (int)len, s);
        *out |= 1u << found;
        s += len;
        if (*s == ',') s++;
    }
    if (!*out) return lp_fail(err, "no LoRA targets given");
    return 0;
}

int lp_train_config_check(const lp_train_config *c, lp_error *err) {
    if (c->n_vocab <= 0 || c->n_vocab > (1 << 24) || c->dim <= 0 || c->dim > (1 << 16) ||
        c->n_layers <= 0 || c->n_layers > 1024 || c->n_heads <= 0 || c->n_heads > 1024 ||
        c->n_kv_heads <= 0 || c->head_dim <= 0 || c->head_dim > 1024 || c->ffn_dim <= 0 ||
        c->ffn_dim > (1 << 18) || c->n_ctx <= 0 || c->n_ctx > (1 << 20) ||
        c->n_extra < 0 || c->n_extra > (1 << 16) || c->lora_rank < 0 || c->lora_rank > 4096)
        return lp_fail(err, "training config: a dimension is zero, negative or too large");
    if (c->n_heads % c->n_kv_heads != 0)
        return lp_fail(err, "training config: %d heads are not a multiple of %d KV heads",
                       c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2 != 0)
        return lp_fail(err, "training config: head dimension %d must be even", c->head_dim);
    if ((int64_t)c->n_heads * c->head_dim > (1 << 16))
        return lp_fail(err, "training config: n_heads * head_dim is too large");
    if (!(c->rope_theta > 0) || !(c->rms_eps > 0) || !isfinite(c->rope_theta) ||
        !isfinite(c->rms_eps))
        return lp_fail(err, "training config: rope_theta and rms_eps must be positive");
    if (c->lora_rank > 0 && (c->lora_targets == 0 || c->lora_targets >> LP_PROJ_COUNT ||
                             !isfinite(c->lora_alpha)))
        return lp_fail(err, "training config: LoRA needs targets and a finite alpha");
    return 0;
}

size_t lp_t_lora_rows_in(const lp_train_config *c, int p) {
    size_t q_dim = (size_t)c->n_heads * (size_t)c->head_dim;
    return p == LP_PROJ_O ? q_dim : p == LP_PROJ_DOWN ? (size_t)c->ffn_dim : (size_t)c->dim;
}

size_t lp_t_lora_rows_out(const lp_train_config *c, int p) {
    size_t q_dim = (size_t)c->n_heads * (size_t)c->head_dim,
           kv_dim = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    switch (p) {
    case LP_PROJ_Q: return q_dim;
    case LP_PROJ_K: case LP_PROJ_V: return kv_dim;
    case LP_PROJ_GATE: case LP_PROJ_UP: return (size_t)c->ffn_dim;
    default: return (size_t)c->dim;
    }
}

/* ---- the parameter table ------------------------------------------------------- */

typedef struct table_builder {
    lp_tparam *p;
    int n, cap;
    size_t size[3];
    bool overflow;
} table_builder;

static void table_add(table_builder *tb, const char *name, int group, size_t rows,
                      size_t cols, bool decay) {
    size_t n;
    int gi = lp_train_group_index(group);
    if (!lp_mul_ok(rows, cols, &n) || rows > INT32_MAX || cols > INT32_MAX ||
        !lp_add_ok(tb->size[gi], n, &tb->size[gi]) || tb->n >= tb->cap) {
        tb->overflow = true;
        return;
    }
    lp_tparam *t = &tb->p[tb->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->group = group;
    t->offset = tb->size[gi] - n;
    t->size = n;
    t->rows = (int)rows;
    t->cols = (int)cols;
    t->decay = decay;
}

static int build_table(lp_train_model *m, lp_error *err) {
    const lp_train_config *c = &m->cfg;
    size_t dim = (size_t)c->dim, q_dim = (size_t)c->n_heads * (size_t)c->head_dim,
           kv_dim = (size_t)c->n_kv_heads * (size_t)c->head_dim, ffn = (size_t)c->ffn_dim;
    table_builder tb = {0};
    tb.cap = 4 + c->n_layers * (9 + 2 * LP_PROJ_COUNT);
    tb.p = calloc((size_t)tb.cap, sizeof *tb.p);
    if (!tb.p) return lp_fail(err, "out of memory");
    char name[48];
    /* Matrices decay; embeddings and norm gains don't (as in llm.c / GPT-2
     * practice: decaying gains towards 0 fights the normalisation). */
    table_add(&tb, "token_embd", LP_TRAIN_BASE, (size_t)c->n_vocab, dim, false);
    for (int l = 0; l < c->n_layers; l++) {
        struct { const char *n; size_t rows, cols; bool decay; } ts[] = {
            {"attn_norm", dim, 1, false}, {"attn_q", q_dim, dim, true},
            {"attn_k", kv_dim, dim, true}, {"attn_v", kv_dim, dim, true},
            {"attn_output", dim, q_dim, true}, {"ffn_norm", dim, 1, false},
            {"ffn_gate", ffn, dim, true}, {"ffn_up", ffn, dim, true},
            {"ffn_down", dim, ffn, true},
        };
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            snprintf(name, sizeof name, "blk.%d.%s", l, ts[i].n);
            table_add(&tb, name, LP_TRAIN_BASE, ts[i].rows, ts[i].cols, ts[i].decay);
        }
    }
    table_add(&tb, "output_norm", LP_TRAIN_BASE, dim, 1, false);
    if (!c->tied_output) table_add(&tb, "output", LP_TRAIN_BASE, (size_t)c->n_vocab, dim, true);
    for (int l = 0; l < c->n_layers && c->lora_rank > 0; l++)
        for (int p = 0; p < LP_PROJ_COUNT; p++) {
            if (!(c->lora_targets & (1u << p))) continue;
            snprintf(name, sizeof name, "blk.%d.%s.lora_a", l, lp_t_proj_names[p]);
            table_add(&tb, name, LP_TRAIN_LORA, (size_t)c->lora_rank, lp_t_lora_rows_in(c, p), true);
            snprintf(name, sizeof name, "blk.%d.%s.lora_b", l, lp_t_proj_names[p]);
            table_add(&tb, name, LP_TRAIN_LORA, lp_t_lora_rows_out(c, p), (size_t)c->lora_rank, true);
        }
    if (c->n_extra > 0) table_add(&tb, "extra_embd", LP_TRAIN_EXTRA, (size_t)c->n_extra, dim, false);
    if (tb.overflow) {
        free(tb.p);
        return lp_fail(err, "training config: parameter sizes overflow");
    }
    m->params = tb.p;
    m->n_params = tb.n;
    for (int g = 0; g < 3; g++) m->group_size[g] = tb.size[g];
    return 0;
}

/* Points a view's tensors into the three group buffers (NULL buffers give
 * NULL tensors). The table order is fixed, so walk it. */
void lp_t_bind(const lp_train_model *m, float *const groups[3], lp_tweights *w) {
    const lp_train_config *c = &m->cfg;
    lp_tlayer *layers = w->layers;
    memset(layers, 0, (size_t)c->n_layers * sizeof *layers);
    memset(w, 0, sizeof *w);
    w->layers = layers;
    for (int i = 0; i < m->n_params; i++) {
        const lp_tparam *t = &m->params[i];
        float *base = groups[lp_train_group_index(t->group)];
        float *p = base ? base + t->offset : NULL;
        int l = -1, off = 0;
        char what[48];
        if (sscanf(t->name, "blk.%d.%n", &l, &off) == 1 && off > 0) {
            snprintf(what, sizeof what, "%s", t->name + off);
            lp_tlayer *L = &layers[l];
            if (!strcmp(what, "attn_norm")) L->attn_norm = p;
            else if (!strcmp(what, "attn_q")) L->wq = p;
            else if (!strcmp(what, "attn_k")) L->wk = p;
            else if (!strcmp(what, "attn_v")) L->wv = p;
            else if (!strcmp(what, "attn_output")) L->wo = p;
            else if (!strcmp(what, "ffn_norm")) L->ffn_norm = p;
            else if (!strcmp(what, "ffn_gate")) L->w_gate = p;
            else if (!strcmp(what, "ffn_up")) L->w_up = p;
            else if (!strcmp(what, "ffn_down")) L->w_down = p;
            else
                for (int q = 0; q < LP_PROJ_COUNT; q++) {
                    char na[24], nb[24];
                    snprintf(na, sizeof na, "%s.lora_a", lp_t_proj_names[q]);
                    snprintf(nb, sizeof nb, "%s.lora_b", lp_t_proj_names[q]);
                    if (!strcmp(what, na)) L->lora_a[q] = p;
                    if (!strcmp(what, nb)) L->lora_b[q] = p;
                }
        } else if (!strcmp(t->name, "token_embd")) {
            w->tok_embd = p;
        } else if (!strcmp(t->name, "output_norm")) {
            w->output_norm = p;
        } else if (!strcmp(t->name, "output")) {
            w->output = p;
        } else if (!strcmp(t->name, "extra_embd")) {
            w->extra = p;
        }
    }
    if (c->tied_output) w->output = w->tok_embd;
}

lp_train_model *lp_train_model_create(const lp_train_config *cfg, int trainable,
                                      lp_error *err) {
    if (lp_train_config_check(cfg, err) < 0) return NULL;
    lp_train_model *m = calloc(1, sizeof *m);
    if (!m) {
        lp_fail(err, "out of memory");
        return NULL;
    }
    m->cfg = *cfg;
    if (cfg->lora_rank == 0) m->cfg.lora_targets = 0;
    m->trainable = trainable & ((LP_TRAIN_BASE) | (cfg->lora_rank > 0 ? LP_TRAIN_LORA : 0) |
                                (cfg->n_extra > 0 ? LP_TRAIN_EXTRA : 0));
    lp_kernels_init_reference(&m->kern);
    m->gemm_level = lp_t_gemm_best_level();
    const char *cap = getenv("LORAPLEX_TRAIN_GEMM");
    if (cap && cap[0] >= '0' && cap[0] <= '2' && !cap[1] && cap[0] - '0' < m->gemm_level)
        m->gemm_level = cap[0] - '0';
    if (build_table(m, err) < 0) goto fail;
    for (int g = 0; g < 3; g++) {
        size_t bytes;
        if (m->group_size[g] == 0) continue;
        if (!lp_mul_ok(m->group_size[g], sizeof(float), &bytes) ||
            !(m->group[g] = lp_alloc(bytes))) {
            lp_fail(err, "out of memory for %zu parameters", m->group_size[g]);
            goto fail;
        }
        if ((m->trainable & (1 << g)) && !(m->grad[g] = lp_alloc(bytes))) {
            lp_fail(err, "out of memory for gradients");
            goto fail;
        }
    }
    m->w.layers = calloc((size_t)cfg->n_layers, sizeof(lp_tlayer));
    m->g.layers = calloc((size_t)cfg->n_layers, sizeof(lp_tlayer));
    m->rope_inv_freq = calloc((size_t)cfg->head_dim / 2 + 1, sizeof(float));
    if (!m->w.layers || !m->g.layers || !m->rope_inv_freq) {
        lp_fail(err, "out of memory");
        goto fail;
    }
    lp_t_bind(m, m->group, &m->w);
    lp_t_bind(m, m->grad, &m->g);
    /* Same float formula as the runtime (model.c) so angles agree bitwise. */
    for (int i = 0; i < cfg->head_dim / 2; i++)
        m->rope_inv_freq[i] = powf(cfg->rope_theta, -2.0f * (float)i / (float)cfg->head_dim);
    return m;
fail:
    lp_train_model_free(m);
    return NULL;
}

void lp_train_model_free(lp_train_model *m) {
    if (!m) return;
    for (int g = 0; g < 3; g++) {
        lp_free(m->group[g]);
        lp_free(m->grad[g]);
    }
    free(m->params);
    free(m->w.layers);
    free(m->g.layers);
    free(m->rope_inv_freq);
    lp_t_free_acts(m->acts);
    lp_kernels_free(&m->kern);
    free(m);
}

void lp_train_model_set_pool(lp_train_model *m, lp_threadpool *pool) { m->pool = pool; }

/* ---- initialisation ---------------------------------------------------------------- */

static void fill_normal(float *p, size_t n, float std, lp_rng *rng) {
    for (size_t i = 0; i < n; i++) p[i] = std * lp_rng_normal(rng);
}

void lp_train_model_init(lp_train_model *m, int which, uint64_t seed) {
    const lp_train_config *c = &m->cfg;
    /* One RNG stream per tensor (seed, index), so a tensor's values don't
     * depend on which other groups are initialised. */
    for (int i = 0; i < m->n_params; i++) {
        const lp_tparam *t = &m->params[i];
        if (!(t->group & which)) continue;
        float *p = m->group[lp_train_group_index(t->group)] + t->offset;
        lp_rng rng;
        lp_rng_seed(&rng, seed * 0x9E3779B97F4A7C15ull + (uint64_t)i + 1);
        const char *dot = strrchr(t->name, '.');
        const char *what = dot ? dot + 1 : t->name;
        if (t->cols == 1) {                               /* norm gains */
            for (size_t k = 0; k < t->size; k++) p[k] = 1.0f;
        } else if (!strcmp(what, "lora_a")) {             /* PEFT: kaiming-uniform-like */
            float bound = 1.0f / sqrtf((float)t->cols);
            for (size_t k = 0; k < t->size; k++)
                p[k] = bound * (2.0f * lp_rng_uniform(&rng) - 1.0f);
        } else if (!strcmp(what, "lora_b")) {             /* zero: start at the base */
            memset(p, 0, t->size * sizeof(float));
        } else if (!strcmp(t->name, "token_embd") || !strcmp(t->name, "extra_embd")) {
            fill_normal(p, t->size, 0.02f, &rng);
        } else {
            float std = 1.0f / sqrtf((float)t->cols);
            if (!strcmp(what, "attn_output") || !strcmp(what, "ffn_down"))
                std /= sqrtf(2.0f * (float)c->n_layers);
            if (!strcmp(t->name, "output")) std *= 0.5f;
            fill_normal(p, t->size, std, &rng);
        }
    }
}

/* ---- a runtime model as the base ------------------------------------------------------ */

int lp_train_config_from_model(const lp_model *base, lp_train_config *cfg, lp_error *err) {
    const lp_hparams *hp = &base->hp;
    if (hp->arch != LP_ARCH_LLAMA || hp->rope_neox || base->has_freq_factors)
        return lp_fail(err, "%s: only the plain llama architecture can be trained "
                       "(no NEOX rope, biases, q/k norms or rope scaling)", base->path);
    memset(cfg, 0, sizeof *cfg);
    cfg->n_vocab = hp->n_vocab;
    cfg->dim = hp->dim;
    cfg->n_layers = hp->n_layers;
    cfg->n_heads = hp->n_heads;
    cfg->n_kv_heads = hp->n_kv_heads;
    cfg->head_dim = hp->head_dim;
    cfg->ffn_dim = hp->ffn_dim;
    cfg->n_ctx = hp->n_ctx_train;
    cfg->rope_theta = hp->rope_theta;
    cfg->rms_eps = hp->rms_eps;
    cfg->tied_output = base->tied_output;
    return 0;
}

static int copy_matrix(float *dst, const lp_weight *w, int64_t rows, int64_t cols,
                       const char *name, lp_error *err) {
    if (w->rows != rows || w->cols != cols)
        return lp_fail(err, "base tensor %s has shape %lldx%lld, expected %lldx%lld", name,
                       (long long)w->rows, (long long)w->cols, (long long)rows,
                       (long long)cols);
    for (int64_t r = 0; r < rows; r++) lp_weight_dequantize_row(w, r, dst + r * cols);
    return 0;
}

int lp_train_model_load_base(lp_train_model *m, const lp_model *base, lp_error *err) {
    /* A compiled base has its norm gains inside the weights and q/k/v,
     * gate/up fused: training on it would apply the gains twice. */
    for (int l = 0; l < base->hp.n_layers; l++)
        if (base->norms_folded || base->layers[l].wqkv.data || base->layers[l].w_gate_up.data)
            return lp_fail(err, "%s: a compiled base (folded norms, fused projections) cannot be "
                           "trained on; use the model it was compiled from", base->path);
    lp_train_config bc = {0};
    if (lp_train_config_from_model(base, &bc, err) < 0) return -1;
    const lp_train_config *c = &m->cfg;
    if (bc.n_vocab != c->n_vocab || bc.dim != c->dim || bc.n_layers != c->n_layers ||
        bc.n_heads != c->n_heads || bc.n_kv_heads != c->n_kv_heads ||
        bc.head_dim != c->head_dim || bc.ffn_dim != c->ffn_dim ||
        bc.tied_output != c->tied_output)
        return lp_fail(err, "%s: model shape differs from the training config", base->path);
    int64_t dim = c->dim, q_dim = (int64_t)c->n_heads * c->head_dim,
            kv_dim = (int64_t)c->n_kv_heads * c->head_dim, ffn = c->ffn_dim;
    const lp_tweights *w = &m->w;
    if (copy_matrix(w->tok_embd, &base->tok_embd, c->n_vocab, dim, "token_embd", err) ||
        (!c->tied_output &&
         copy_matrix(w->output, &base->output, c->n_vocab, dim, "output", err)))
        return -1;
    memcpy(w->output_norm, base->output_norm, (size_t)dim * sizeof(float));
    for (int l = 0; l < c->n_layers; l++) {
        const lp_layer *B = &base->layers[l];
        lp_tlayer *L = &w->layers[l];
        if (copy_matrix(L->wq, &B->wq, q_dim, dim, "attn_q", err) ||
            copy_matrix(L->wk, &B->wk, kv_dim, dim, "attn_k", err) ||
            copy_matrix(L->wv, &B->wv, kv_dim, dim, "attn_v", err) ||
            copy_matrix(L->wo, &B->wo, dim, q_dim, "attn_output", err) ||
            copy_matrix(L->w_gate, &B->w_gate, ffn, dim, "ffn_gate", err) ||
            copy_matrix(L->w_up, &B->w_up, ffn, dim, "ffn_up", err) ||
            copy_matrix(L->w_down, &B->w_down, dim, ffn, "ffn_down", err))
            return lp_fail_prefix(err, "%s: layer %d", base->path, l);
        memcpy(L->attn_norm, B->attn_norm, (size_t)dim * sizeof(float));
        memcpy(L->ffn_norm, B->ffn_norm, (size_t)dim * sizeof(float));
    }
    return 0;
}

int lp_t_param_counts(const lp_train_config *cfg, size_t sizes[3], lp_error *err) {
    if (lp_train_config_check(cfg, err) < 0) return -1;
    lp_train_model tmp = {.cfg = *cfg};
    if (build_table(&tmp, err) < 0) return -1;
    free(tmp.params);
    for (int g = 0; g < 3; g++) sizes[g] = tmp.group_size[g];
    return 0;
}
