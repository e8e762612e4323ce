/* Compiled models (.lpx): the loader (a memory map plus validation: every
 * weight is used in place). The compiler that writes them is in the tools
 * library (src/tools/compile.c). */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../formats/lpx.h"

/* ==== loading ======================================================================= */

bool lp_is_lpx_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char magic[4] = {0};
    size_t got = fread(magic, 1, 4, f);
    fclose(f);
    return got == 4 && memcmp(magic, LP_LPX_MAGIC, 4) == 0;
}

/* Tensors by (layer, kind); globals at layer n_layers. `used` finds strays. */
typedef struct lpx_index {
    const lp_lpx_tensor **slot;
    bool *used;
    int n_layers;
    const char *what;
} lpx_index;

static size_t slot_of(const lpx_index *ix, uint32_t kind, int layer) {
    return (size_t)(layer < 0 ? ix->n_layers : layer) * LP_LPX_T_KIND_END + kind;
}

static const lp_lpx_tensor *take(lpx_index *ix, uint32_t kind, int layer) {
    size_t s = slot_of(ix, kind, layer);
    if (ix->slot[s]) ix->used[s] = true;
    return ix->slot[s];
}

static void label(uint32_t kind, int layer, char *buf, size_t cap) {
    if (layer < 0) snprintf(buf, cap, "%s", lp_lpx_kind_name(kind));
    else snprintf(buf, cap, "blk.%d.%s", layer, lp_lpx_kind_name(kind));
}

static lp_weight weight_of(const lp_lpx_tensor *t) {
    if (lp_dtype_is_packed(t->type))
        return lp_packed_weight(t->type, (int)t->group, (int64_t)t->rows, (int64_t)t->cols, t->data);
    lp_weight w = {.type = t->type, .rows = (int64_t)t->rows, .cols = (int64_t)t->cols,
                   .row_bytes = lp_dtype_row_bytes(t->type, t->cols), .data = t->data};
    return w;
}

static int lpx_matrix(lpx_index *ix, uint32_t kind, int layer, int64_t rows, int64_t cols,
                      bool required, lp_weight *out, lp_error *err) {
    memset(out, 0, sizeof *out);
    const lp_lpx_tensor *t = take(ix, kind, layer);
    char name[64];
    label(kind, layer, name, sizeof name);
    if (!t) return required ? lp_fail(err, "%s: missing tensor %s", ix->what, name) : 0;
    if ((int64_t)t->rows != rows || (int64_t)t->cols != cols)
        return lp_fail(err, "%s: tensor %s is %llu x %llu, expected %lld x %lld", ix->what, name,
                       (unsigned long long)t->rows, (unsigned long long)t->cols, (long long)rows,
                       (long long)cols);
    *out = weight_of(t);
    return 0;
}

static int lpx_vector(lpx_index *ix, uint32_t kind, int layer, int64_t n, bool required,
                      const float **out, lp_error *err) {
    *out = NULL;
    const lp_lpx_tensor *t = take(ix, kind, layer);
    char name[64];
    label(kind, layer, name, sizeof name);
    if (!t) return required ? lp_fail(err, "%s: missing tensor %s", ix->what, name) : 0;
    if (t->type != LP_F32 || t->rows != 1 || (int64_t)t->cols != n)
        return lp_fail(err, "%s: tensor %s must be an F32 vector of %lld (it is %s %llu x %llu)",
                       ix->what, name, (long long)n, lp_dtype_name(t->type),
                       (unsigned long long)t->rows, (unsigned long long)t->cols);
    *out = t->data;
    return 0;
}

/* Rows [row0, row0 + n) of w as a weight of their own. Packed types can only
 * be split at panel (16-row) boundaries. */
static int row_view(const lp_weight *w, int64_t row0, int64_t n, const char *what,
                    const char *name, lp_weight *out, lp_error *err) {
    *out = *w;
    out->rows = n;
    if (lp_dtype_is_packed(w->type)) {
        if (row0 % 16 != 0)
            return lp_fail(err, "%s: fused tensor %s can't be split at row %lld (packed panels "
                           "hold 16 rows)", what, name, (long long)row0);
        size_t panel = lp_pack_bytes(w->type, 16, w->cols, w->group);
        *out = lp_packed_weight(w->type, w->group, n, w->cols,
                                (const uint8_t *)w->data + (size_t)(row0 / 16) * panel);
        return 0;
    }
    out->data = (const uint8_t *)w->data + (size_t)row0 * w->row_bytes;
    return 0;
}

/* q/k/v (or gate/up): either one fused tensor split into views, or separate ones. */
static int lpx_group(lpx_index *ix, int layer, uint32_t fused_kind, const uint32_t *kinds,
                     lp_weight **outs, const int64_t *rows, int n, int64_t cols,
                     lp_weight *fused, lp_error *err) {
    memset(fused, 0, sizeof *fused);
    if (ix->slot[slot_of(ix, fused_kind, layer)]) {
        int64_t total = 0;
        for (int i = 0; i < n; i++) total += rows[i];
        if (lpx_matrix(ix, fused_kind, layer, total, cols, true, fused, err)) return -1;
        char name[64];
        label(fused_kind, layer, name, sizeof name);
        int64_t at = 0;
        for (int i = 0; i < n; i++) {
            if (ix->slot[slot_of(ix, kinds[i], layer)])
                return lp_fail(err, "%s: layer %d has both %s and %s", ix->what, layer, name,
                               lp_lpx_kind_name(kinds[i]));
            if (row_view(fused, at, rows[i], ix->what, name, outs[i], err)) return -1;
            at += rows[i];
        }
        return 0;
    }
    for (int i = 0; i < n; i++)
        if (lpx_matrix(ix, kinds[i], layer, rows[i], cols, true, outs[i], err)) return -1;
    return 0;
}

static int lpx_hparams(lp_model *m, const lp_lpx_header *h, const char *what, lp_error *err) {
    lp_hparams *hp = &m->hp;
    const uint32_t limits[8][2] = {{h->n_vocab, 1u << 24}, {h->dim, 1u << 20}, {h->n_layers, 4096},
                                   {h->n_heads, 4096}, {h->n_kv_heads, 4096}, {h->head_dim, 1024},
                                   {h->ffn_dim, 1u << 22}, {h->n_ctx_train, 1u << 24}};
    static const char *const names[8] = {"n_vocab", "dim", "n_layers", "n_heads", "n_kv_heads",
                                         "head_dim", "ffn_dim", "n_ctx_train"};
    for (int i = 0; i < 8; i++)
        if (limits[i][0] == 0 || limits[i][0] > limits[i][1])
            return lp_fail(err, "%s: %s = %u is out of range (1..%u)", what, names[i], limits[i][0],
                           limits[i][1]);
    if (!isfinite(h->rope_theta) || !isfinite(h->rms_eps))
        return lp_fail(err, "%s: rope theta and rms epsilon must be finite", what);
    hp->arch = (lp_arch)h->arch;
    hp->n_vocab = (int)h->n_vocab;
    hp->dim = (int)h->dim;
    hp->n_layers = (int)h->n_layers;
    hp->n_heads = (int)h->n_heads;
    hp->n_kv_heads = (int)h->n_kv_heads;
    hp->head_dim = (int)h->head_dim;
    hp->ffn_dim = (int)h->ffn_dim;
    hp->n_ctx_train = (int)h->n_ctx_train;
    hp->rope_theta = h->rope_theta;
    hp->rms_eps = h->rms_eps;
    hp->rope_neox = (h->flags & LP_LPX_ROPE_NEOX) != 0;
    m->tied_output = (h->flags & LP_LPX_TIED_OUTPUT) != 0;
    m->has_freq_factors = (h->flags & LP_LPX_FREQ_FACTORS) != 0;
    m->norms_folded = (h->flags & LP_LPX_NORMS_FOLDED) != 0;
    m->int8_activations = h->acts == LP_LPX_ACTS_INT8;
    m->compiled_type = h->weight_type;
    m->compiled_group = h->group;
    memcpy(m->name, h->name, sizeof m->name - 1);
    m->name[sizeof m->name - 1] = 0;
    while (m->name[0] && ((uint8_t)m->name[strlen(m->name) - 1] & 0x80)) /* cut partial UTF-8 */
        m->name[strlen(m->name) - 1] = 0;
    return 0;
}

static int lpx_tokenizer(lp_model *m, const lp_lpx *x, const char *what, lp_error *err) {
    m->lpx_tok_kind = x->h.tokenizer_kind;
    m->lpx_tok = x->tok;
    m->lpx_tok_bytes = x->tok_bytes;
    m->lpx_tok2 = x->tok2;
    m->lpx_tok2_bytes = x->tok2_bytes;
    if (x->h.tokenizer_kind == LP_LPX_TOK_GGUF) {
        lp_gguf *g = lp_gguf_open_memory(x->tok, x->tok_bytes, what, err);
        if (!g) return lp_fail_prefix(err, "%s: embedded tokenizer", what);
        m->tok = lp_tokenizer_from_gguf(g, err);
        lp_gguf_close(g);
    } else if (x->h.tokenizer_kind == LP_LPX_TOK_HF) {
        m->tok = lp_tokenizer_from_hf_memory(x->tok, x->tok_bytes, x->tok2, x->tok2_bytes, what, err);
    } else {
        if (x->tok_bytes > INT32_MAX) return lp_fail(err, "%s: tokenizer blob too large", what);
        m->tok = lp_tokenizer_from_llama2c_memory(x->tok, x->tok_bytes, (int32_t)m->hp.n_vocab,
                                                  what, err);
    }
    return m->tok ? 0 : -1;
}

static int lpx_layer(lp_model *m, lpx_index *ix, int l, lp_error *err) {
    const lp_hparams *hp = &m->hp;
    lp_layer *L = &m->layers[l];
    int64_t dim = hp->dim, q_dim = (int64_t)hp->n_heads * hp->head_dim,
            kv_dim = (int64_t)hp->n_kv_heads * hp->head_dim, ffn = hp->ffn_dim;
    const uint32_t qkv_kinds[3] = {LP_LPX_T_WQ, LP_LPX_T_WK, LP_LPX_T_WV};
    lp_weight *qkv[3] = {&L->wq, &L->wk, &L->wv};
    const int64_t qkv_rows[3] = {q_dim, kv_dim, kv_dim};
    const uint32_t gu_kinds[2] = {LP_LPX_T_W_GATE, LP_LPX_T_W_UP};
    lp_weight *gu[2] = {&L->w_gate, &L->w_up};
    const int64_t gu_rows[2] = {ffn, ffn};
    bool qwen2 = hp->arch == LP_ARCH_QWEN2, qwen3 = hp->arch == LP_ARCH_QWEN3;
    if (lpx_group(ix, l, LP_LPX_T_WQKV, qkv_kinds, qkv, qkv_rows, 3, dim, &L->wqkv, err) ||
        lpx_group(ix, l, LP_LPX_T_W_GATE_UP, gu_kinds, gu, gu_rows, 2, dim, &L->w_gate_up, err) ||
        lpx_matrix(ix, LP_LPX_T_WO, l, dim, q_dim, true, &L->wo, err) ||
        lpx_matrix(ix, LP_LPX_T_W_DOWN, l, dim, ffn, true, &L->w_down, err) ||
        lpx_vector(ix, LP_LPX_T_ATTN_NORM, l, dim, true, &L->attn_norm, err) ||
        lpx_vector(ix, LP_LPX_T_FFN_NORM, l, dim, true, &L->ffn_norm, err) ||
        lpx_vector(ix, LP_LPX_T_BQ, l, q_dim, qwen2, &L->bq, err) ||
        lpx_vector(ix, LP_LPX_T_BK, l, kv_dim, qwen2, &L->bk, err) ||
        lpx_vector(ix, LP_LPX_T_BV, l, kv_dim, qwen2, &L->bv, err) ||
        lpx_vector(ix, LP_LPX_T_Q_NORM, l, hp->head_dim, qwen3, &L->q_norm, err) ||
        lpx_vector(ix, LP_LPX_T_K_NORM, l, hp->head_dim, qwen3, &L->k_norm, err))
        return -1;
    if ((L->bq != NULL) != (L->bk != NULL) || (L->bq != NULL) != (L->bv != NULL))
        return lp_fail(err, "%s: layer %d has some but not all q/k/v biases", ix->what, l);
    if ((L->q_norm != NULL) != (L->k_norm != NULL))
        return lp_fail(err, "%s: layer %d has only one of the q/k norms", ix->what, l);
    return 0;
}

int lp_model_load_lpx_image(lp_model *m, const void *data, size_t size, const char *what,
                            lp_error *err) {
    m->format = "lpx";
    lp_lpx x;
    if (lp_lpx_parse(data, size, what, &x, err)) return -1;
    lpx_index ix = {.n_layers = (int)x.h.n_layers, .what = what};
    int rc = lpx_hparams(m, &x.h, what, err);
    size_t n_slots = 0;
    if (rc == 0) {
        n_slots = ((size_t)x.h.n_layers + 1) * LP_LPX_T_KIND_END;
        ix.slot = calloc(n_slots, sizeof *ix.slot);
        ix.used = calloc(n_slots, sizeof *ix.used);
        m->layers = calloc(x.h.n_layers, sizeof *m->layers);
        if (!ix.slot || !ix.used || !m->layers) rc = lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    }
    for (uint32_t i = 0; rc == 0 && i < x.n_tensors; i++) {
        const lp_lpx_tensor *t = &x.tensors[i];
        if (t->layer != LP_LPX_NO_LAYER && t->layer >= x.h.n_layers) {
            rc = lp_fail(err, "%s: tensor %s is for layer %u but the model has %u", what,
                         lp_lpx_kind_name(t->kind), t->layer, x.h.n_layers);
            break;
        }
        ix.slot[slot_of(&ix, t->kind, t->layer == LP_LPX_NO_LAYER ? -1 : (int)t->layer)] = t;
    }
    const lp_hparams *hp = &m->hp;
    const float *rope = NULL;
    if (rc == 0)
        rc = lpx_matrix(&ix, LP_LPX_T_TOK_EMBD, -1, hp->n_vocab, hp->dim, true, &m->tok_embd, err) ||
             lpx_matrix(&ix, LP_LPX_T_OUTPUT, -1, hp->n_vocab, hp->dim, !m->tied_output,
                        &m->output, err) ||
             lpx_vector(&ix, LP_LPX_T_OUTPUT_NORM, -1, hp->dim, true, &m->output_norm, err) ||
             lpx_vector(&ix, LP_LPX_T_ROPE_FREQS, -1, hp->head_dim / 2 ? hp->head_dim / 2 : 1, true,
                        &rope, err)
             ? -1 : 0;
    m->rope_inv_freq = (float *)rope; /* read-only use: the forward never writes it */
    if (rc == 0 && m->tied_output) {
        if (m->output.data) rc = lp_fail(err, "%s: a tied model must not have an output tensor", what);
        m->output = m->tok_embd;
    }
    for (int l = 0; rc == 0 && l < hp->n_layers; l++) rc = lpx_layer(m, &ix, l, err);
    for (size_t s = 0; rc == 0 && s < n_slots; s++)
        if (ix.slot[s] && !ix.used[s]) {
            char name[64];
            label(ix.slot[s]->kind, s / LP_LPX_T_KIND_END == (size_t)ix.n_layers
                  ? -1 : (int)(s / LP_LPX_T_KIND_END), name, sizeof name);
            rc = lp_fail(err, "%s: unexpected tensor %s for a %s model", what, name,
                         lp_arch_name(hp->arch));
        }
    if (rc == 0) rc = lpx_tokenizer(m, &x, what, err);
    free(ix.slot);
    free(ix.used);
    lp_lpx_release(&x);
    return rc;
}

int lp_model_load_lpx(lp_model *m, const char *path, bool huge_pages, lp_error *err) {
    if ((huge_pages ? lp_load_file_huge : lp_map_file)(path, &m->lpx_file, err)) return -1;
    return lp_model_load_lpx_image(m, m->lpx_file.data, m->lpx_file.size, path, err);
}

lp_model *lp_model_load_lpx_memory(const void *data, size_t size, const char *what, lp_error *err) {
    lp_model *m = calloc(1, sizeof *m);
    if (!m) {
        lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    snprintf(m->path, sizeof m->path, "%s", what);
    if (lp_model_load_lpx_image(m, data, size, what, err) || lp_model_finish(m, err)) {
        lp_model_free(m);
        return NULL;
    }
    return m;
}
