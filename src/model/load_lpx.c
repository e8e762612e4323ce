/* Compiled models (.lpx): the loader (a memory map plus validation: every
 * weight is used in place) and the compiler (quantize into the kernels'
 * layout, fold RMSNorm gains into the next projections, fuse q/k/v and
 * gate/up). */
#include "model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
        if (!ix.slot || !ix.used || !m->layers) rc = lp_fail_status(err, LP_ERR_NOMEM, "out of memory");
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

int lp_model_load_lpx(lp_model *m, const char *path, lp_error *err) {
    if (lp_map_file(path, &m->lpx_file, err)) return -1;
    return lp_model_load_lpx_image(m, m->lpx_file.data, m->lpx_file.size, path, err);
}

lp_model *lp_model_load_lpx_memory(const void *data, size_t size, const char *what, lp_error *err) {
    lp_model *m = calloc(1, sizeof *m);
    if (!m) {
        lp_fail_status(err, LP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    snprintf(m->path, sizeof m->path, "%s", what);
    if (lp_model_load_lpx_image(m, data, size, what, err) || lp_model_finish(m, err)) {
        lp_model_free(m);
        return NULL;
    }
    return m;
}

/* ==== compiling ======================================================================== */

#define CHUNK_ROWS 64 /* rows quantized per step: a multiple of the 16-row panel */

/* One source matrix placed at row0 of an output tensor, with the norm gain
 * to fold into its columns (or NULL) and whether it is repacked bit for bit. */
typedef struct cpart {
    const lp_weight *src;
    const float *gain;
    int64_t row0;
    bool lossless;        /* GGUF Q4_0/Q8_0 -> W4/W8 g32 */
    bool copy;            /* already in the target type: bytes copied as they are */
} cpart;

typedef struct cjob {
    cpart parts[3];
    int n_parts;          /* 0: a vector written as is */
    char name[64];
} cjob;

typedef struct compiler {
    const lp_model *src;
    const lp_compile_params *p;
    lp_lpx_tensor *tensors;
    cjob *jobs;
    uint32_t n, cap;
    uint8_t *buf;
    size_t buf_bytes;
    float *scratch;       /* [threads][CHUNK_ROWS * max_cols] */
    int64_t max_cols;
    lp_threadpool *pool;
    int *failed;          /* [threads] */
    int n_matrices, n_done;
    uint64_t bytes_done, bytes_total;
    bool fold;            /* fold gains now (the source is not folded yet) */
} compiler;

static void note(const compiler *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(const compiler *c, const char *fmt, ...) {
    if (!c->p->note) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->p->note(c->p->user, msg);
}

static bool is_packed(uint32_t type) { return lp_dtype_is_packed(type); }

/* The type a matrix with `cols` inputs gets. Embeddings that are only looked
 * up (untied) stay Q8_0/F16: they are read one row at a time. */
static int32_t group_of(const lp_weight *w) { return is_packed(w->type) ? (w->group ? w->group : 32) : 0; }

static void choose_type(const compiler *c, const char *name, const lp_weight *src, bool lookup_only,
                        uint32_t *type, uint32_t *group) {
    uint32_t want = c->p->weight_type;
    int64_t cols = src->cols;
    int g = c->p->group ? c->p->group : 32;
    *group = 0;
    *type = want;
    if (!is_packed(want)) return;
    if (lookup_only) {
        /* an already quantized embedding is kept as it is (copied) */
        if (src->type != LP_F32 && src->type != LP_F16 && src->type != LP_BF16) {
            *type = src->type;
            *group = (uint32_t)group_of(src);
        } else {
            *type = cols % 32 == 0 ? LP_Q8_0 : LP_F16;
        }
        return;
    }
    if (lp_pack_bytes(want, 16, cols, g)) {
        *group = (uint32_t)g;
    } else if (g != 32 && lp_pack_bytes(want, 16, cols, 32)) {
        if (name[0]) note(c, "%s: %lld columns are not a multiple of group %d: using group 32", name,
             (long long)cols, g);
        *group = 32;
    } else {
        if (name[0]) note(c, "%s: %lld columns are not a multiple of 32: kept as F16", name, (long long)cols);
        *type = LP_F16;
        return;
    }
    /* A GGUF Q4_0 source repacks into W4 bit for bit (lossless_ok); W4C
     * would round its already rounded weights a second time. */
    if (want == LP_W4C && src->type == LP_Q4_0 && *group == 32) *type = LP_W4;
}

/* A GGUF Q4_0 / Q8_0 source that can be repacked bit for bit into the target. */
static bool lossless_ok(const lp_weight *src, uint32_t type, uint32_t group) {
    return group == 32 && ((src->type == LP_Q4_0 && type == LP_W4) ||
                           (src->type == LP_Q8_0 && type == LP_W8));
}

static lp_lpx_tensor *add_tensor(compiler *c, uint32_t kind, int layer, cjob **job, lp_error *err) {
    if (c->n == c->cap) {
        uint32_t cap = c->cap ? c->cap * 2 : 64;
        lp_lpx_tensor *t = realloc(c->tensors, cap * sizeof *t);
        if (t) c->tensors = t;
        cjob *j = realloc(c->jobs, cap * sizeof *j);
        if (j) c->jobs = j;
        if (!t || !j) {
            lp_fail(err, "out of memory");
            return NULL;
        }
        c->cap = cap;
    }
    lp_lpx_tensor *t = &c->tensors[c->n];
    memset(t, 0, sizeof *t);
    memset(&c->jobs[c->n], 0, sizeof c->jobs[c->n]);
    t->kind = kind;
    t->layer = layer < 0 ? LP_LPX_NO_LAYER : (uint32_t)layer;
    label(kind, layer, c->jobs[c->n].name, sizeof c->jobs[c->n].name);
    *job = &c->jobs[c->n];
    c->n++;
    return t;
}

static int add_vector(compiler *c, uint32_t kind, int layer, const float *v, int64_t n, lp_error *err) {
    if (!v) return 0;
    cjob *j;
    lp_lpx_tensor *t = add_tensor(c, kind, layer, &j, err);
    if (!t) return -1;
    t->type = LP_F32;
    t->rows = 1;
    t->cols = (uint64_t)n;
    t->bytes = (uint64_t)n * sizeof(float);
    t->data = v;
    return 0;
}

/* A matrix made of n source matrices stacked by rows (n > 1: fused). */
static int add_matrix(compiler *c, uint32_t kind, int layer, const lp_weight *const *srcs,
                      const float *gain, int n, bool lookup_only, lp_error *err) {
    cjob *j;
    lp_lpx_tensor *t = add_tensor(c, kind, layer, &j, err);
    if (!t) return -1;
    choose_type(c, j->name, srcs[0], lookup_only, &t->type, &t->group);
    /* The classifier (the output matrix, or the embedding when tied) stays
     * 8-bit under q4, as llama.cpp keeps it at Q6_K/Q8_0: 4-bit logits
     * measurably hurt small models (the demo base stops predicting EOS).
     * Only a source already at 4 bits goes to 4 (a Q4_0 one bit for bit);
     * a Q6_K or Q8_0 one (llama.cpp's own files) stays 8-bit. */
    bool classifier = kind == LP_LPX_T_OUTPUT || (kind == LP_LPX_T_TOK_EMBD && !lookup_only);
    uint32_t st = srcs[0]->type;
    bool four_bit_source = st == LP_Q4_0 || st == LP_Q4_1 || st == LP_Q4_K || st == LP_W4 || st == LP_W4C;
    if (classifier && !four_bit_source && (t->type == LP_W4 || t->type == LP_W4C) && !c->p->q4_output &&
        lp_pack_bytes(LP_W8, 16, srcs[0]->cols, 32)) {
        t->type = LP_W8;
        t->group = 32;
    }
    int64_t rows = 0;
    for (int i = 0; i < n; i++) {
        j->parts[i] = (cpart){.src = srcs[i], .gain = gain, .row0 = rows};
        j->parts[i].lossless = !gain && lossless_ok(srcs[i], t->type, t->group);
        j->parts[i].copy = !gain && srcs[i]->type == t->type && (uint32_t)group_of(srcs[i]) == t->group;
        rows += srcs[i]->rows;
    }
    j->n_parts = n;
    t->rows = (uint64_t)rows;
    t->cols = (uint64_t)srcs[0]->cols;
    t->bytes = lp_lpx_tensor_bytes(t->type, t->rows, t->cols, t->group);
    if (t->bytes == 0) return lp_fail(err, "%s: cannot store %s as %s", c->src->path, j->name,
                                      lp_dtype_name(t->type));
    if (t->cols > (uint64_t)c->max_cols) c->max_cols = (int64_t)t->cols;
    if (t->bytes > c->buf_bytes) c->buf_bytes = t->bytes;
    c->n_matrices++;
    c->bytes_total += t->bytes;
    return 0;
}

/* q|k|v or gate|up: fused when the parts share a type and, for packed
 * types, every split falls on a 16-row panel boundary. */
static int add_group(compiler *c, int layer, uint32_t fused_kind, const uint32_t *kinds,
                     const lp_weight *const *srcs, int n, const float *gain, lp_error *err) {
    bool fuse = !c->p->no_fuse;
    uint32_t t0, g0;
    choose_type(c, "", srcs[0], false, &t0, &g0);
    for (int i = 0; fuse && i < n - 1; i++)
        if (is_packed(t0) && srcs[i]->rows % 16 != 0) fuse = false;
    (void)g0;
    if (fuse) return add_matrix(c, fused_kind, layer, srcs, gain, n, false, err);
    for (int i = 0; i < n; i++)
        if (add_matrix(c, kinds[i], layer, &srcs[i], gain, 1, false, err)) return -1;
    return 0;
}

/* Folding multiplies columns, so it would spoil a bit-exact repack of a
 * quantized source: then lossless wins and the gains stay separate. */
static bool fold_would_requantize(const compiler *c) {
    const lp_model *m = c->src;
    for (int l = 0; l < m->hp.n_layers; l++) {
        const lp_layer *L = &m->layers[l];
        const lp_weight *ws[5] = {&L->wq, &L->wk, &L->wv, &L->w_gate, &L->w_up};
        for (int i = 0; i < 5; i++) {
            uint32_t type, group;
            choose_type(c, "", ws[i], false, &type, &group);
            if (lossless_ok(ws[i], type, group)) return true;
        }
    }
    return false;
}

static int plan(compiler *c, lp_error *err) {
    const lp_model *m = c->src;
    const lp_hparams *hp = &m->hp;
    /* Folding is exact in float and near-lossless at 8 bits, but gains scale
     * the columns of a 4-bit group unevenly: on the demo base KL vs f32 rose
     * from 0.0054 to 0.0065 (search) and 0.0051 to 0.0072 (absmax), so q4
     * folds only when asked. */
    c->fold = !c->p->no_fold && !m->norms_folded &&
              ((c->p->weight_type != LP_W4 && c->p->weight_type != LP_W4C) || c->p->fold);
    if (c->fold && fold_would_requantize(c)) {
        c->fold = false;
        note(c, "norm gains not folded: the source's Q4_0/Q8_0 weights are repacked bit for bit");
    }
    if (c->p->no_fold && m->norms_folded)
        note(c, "the source already has folded norm gains; they stay folded");
    const lp_weight *embd = &m->tok_embd;
    if (add_matrix(c, LP_LPX_T_TOK_EMBD, -1, &embd, NULL, 1, !m->tied_output, err)) return -1;
    if (!m->tied_output) {
        const lp_weight *out = &m->output;
        if (add_matrix(c, LP_LPX_T_OUTPUT, -1, &out, NULL, 1, false, err)) return -1;
    }
    if (add_vector(c, LP_LPX_T_OUTPUT_NORM, -1, m->output_norm, hp->dim, err) ||
        add_vector(c, LP_LPX_T_ROPE_FREQS, -1, m->rope_inv_freq, hp->head_dim / 2, err))
        return -1;
    int64_t q_dim = (int64_t)hp->n_heads * hp->head_dim, kv_dim = (int64_t)hp->n_kv_heads * hp->head_dim;
    for (int l = 0; l < hp->n_layers; l++) {
        const lp_layer *L = &m->layers[l];
        const lp_weight *qkv[3] = {&L->wq, &L->wk, &L->wv}, *gu[2] = {&L->w_gate, &L->w_up};
        const lp_weight *wo = &L->wo, *wd = &L->w_down;
        const uint32_t qkv_k[3] = {LP_LPX_T_WQ, LP_LPX_T_WK, LP_LPX_T_WV};
        const uint32_t gu_k[2] = {LP_LPX_T_W_GATE, LP_LPX_T_W_UP};
        if (add_group(c, l, LP_LPX_T_WQKV, qkv_k, qkv, 3, c->fold ? L->attn_norm : NULL, err) ||
            add_matrix(c, LP_LPX_T_WO, l, &wo, NULL, 1, false, err) ||
            add_group(c, l, LP_LPX_T_W_GATE_UP, gu_k, gu, 2, c->fold ? L->ffn_norm : NULL, err) ||
            add_matrix(c, LP_LPX_T_W_DOWN, l, &wd, NULL, 1, false, err) ||
            add_vector(c, LP_LPX_T_ATTN_NORM, l, L->attn_norm, hp->dim, err) ||
            add_vector(c, LP_LPX_T_FFN_NORM, l, L->ffn_norm, hp->dim, err) ||
            add_vector(c, LP_LPX_T_BQ, l, L->bq, q_dim, err) ||
            add_vector(c, LP_LPX_T_BK, l, L->bk, kv_dim, err) ||
            add_vector(c, LP_LPX_T_BV, l, L->bv, kv_dim, err) ||
            add_vector(c, LP_LPX_T_Q_NORM, l, L->q_norm, hp->head_dim, err) ||
            add_vector(c, LP_LPX_T_K_NORM, l, L->k_norm, hp->head_dim, err))
            return -1;
    }
    return 0;
}

typedef struct pack_task {
    compiler *c;
    const lp_lpx_tensor *t;
    const cpart *part;
    uint8_t *dst;         /* where this part's rows start */
} pack_task;

static void pack_rows(compiler *c, const lp_lpx_tensor *t, const cpart *pt, uint8_t *dst,
                      int64_t r, int64_t n, float *buf, int thread) {
    int64_t cols = (int64_t)t->cols;
    if (pt->lossless) {
        uint32_t got;
        const uint8_t *src = (const uint8_t *)pt->src->data + (size_t)r * pt->src->row_bytes;
        if (lp_pack_from_gguf(pt->src->type, src, n, cols, dst, &got) != 0 || got != t->type)
            c->failed[thread] = 1;
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float *row = buf + i * cols;
        lp_weight_dequantize_row(pt->src, r + i, row);
        if (pt->gain)
            for (int64_t k = 0; k < cols; k++) row[k] *= pt->gain[k];
    }
    if (is_packed(t->type)) {
        if (lp_pack_weight_ex(t->type, (int)t->group, buf, n, cols, dst, !c->p->no_search))
            c->failed[thread] = 1;
        return;
    }
    size_t row_bytes = lp_dtype_row_bytes(t->type, (uint64_t)cols);
    for (int64_t i = 0; i < n; i++)
        if (!lp_quantize_row(t->type, buf + i * cols, dst + (size_t)i * row_bytes, cols))
            c->failed[thread] = 1;
}

static void pack_worker(void *arg, int thread, int n_threads) {
    pack_task *k = arg;
    const lp_lpx_tensor *t = k->t;
    int64_t b, e, cols = (int64_t)t->cols;
    lp_split_range(k->part->src->rows, thread, n_threads, CHUNK_ROWS, &b, &e);
    float *buf = k->c->scratch + (size_t)thread * CHUNK_ROWS * (size_t)k->c->max_cols;
    size_t panel = is_packed(t->type) ? lp_pack_bytes(t->type, 16, cols, (int)t->group) : 0;
    size_t row_bytes = is_packed(t->type) ? 0 : lp_dtype_row_bytes(t->type, (uint64_t)cols);
    for (int64_t r = b; r < e; r += CHUNK_ROWS) {
        int64_t n = e - r < CHUNK_ROWS ? e - r : CHUNK_ROWS;
        uint8_t *dst = k->dst + (panel ? (size_t)(r / 16) * panel : (size_t)r * row_bytes);
        pack_rows(k->c, t, k->part, dst, r, n, buf, thread);
    }
}

static const void *fill_tensor(void *user, uint32_t i, lp_error *err) {
    compiler *c = user;
    const lp_lpx_tensor *t = &c->tensors[i];
    const cjob *j = &c->jobs[i];
    if (j->n_parts == 0) return t->data;
    memset(c->buf, 0, t->bytes);
    int n_threads = lp_threadpool_size(c->pool);
    memset(c->failed, 0, (size_t)n_threads * sizeof *c->failed);
    for (int p = 0; p < j->n_parts; p++) {
        const cpart *pt = &j->parts[p];
        size_t offset = is_packed(t->type)
            ? (size_t)(pt->row0 / 16) * lp_pack_bytes(t->type, 16, (int64_t)t->cols, (int)t->group)
            : (size_t)pt->row0 * lp_dtype_row_bytes(t->type, t->cols);
        if (pt->copy) {
            memcpy(c->buf + offset, pt->src->data,
                   lp_lpx_tensor_bytes(t->type, (uint64_t)pt->src->rows, t->cols, t->group));
            continue;
        }
        pack_task task = {c, t, pt, c->buf + offset};
        lp_threadpool_run(c->pool, pack_worker, &task);
    }
    for (int k = 0; k < n_threads; k++)
        if (c->failed[k]) {
            lp_fail(err, "%s: quantizing %s to %s failed", c->src->path, j->name, lp_dtype_name(t->type));
            return NULL;
        }
    c->n_done++;
    c->bytes_done += t->bytes;
    if (c->p->progress)
        c->p->progress(c->p->user, c->n_done, c->n_matrices, j->name, c->bytes_done, c->bytes_total);
    return c->buf;
}

/* The source's tokenizer as an embeddable blob (malloc'd in *owned). */
static int tokenizer_blob(const lp_model *m, const char *out_path, lp_lpx_header *h,
                          const void **tok, size_t *tok_n, const void **tok2, size_t *tok2_n,
                          char **owned, char **owned2, lp_error *err) {
    *owned = *owned2 = NULL;
    *tok2 = NULL;
    *tok2_n = 0;
    if (m->lpx_tok) {
        h->tokenizer_kind = m->lpx_tok_kind;
        *tok = m->lpx_tok;
        *tok_n = m->lpx_tok_bytes;
        *tok2 = m->lpx_tok2;
        *tok2_n = m->lpx_tok2_bytes;
        return 0;
    }
    if (m->gguf) {
        /* the source's metadata (tokenizer.* and the rest; no tensors) as a small GGUF */
        h->tokenizer_kind = LP_LPX_TOK_GGUF;
        lp_gguf_writer *w = lp_gguf_writer_create();
        if (!w) return lp_fail(err, "out of memory");
        for (size_t i = 0; i < lp_gguf_kv_count(m->gguf); i++)
            lp_gguf_writer_copy_kv(w, lp_gguf_kv_at(m->gguf, i));
        char tmp[1100];
        snprintf(tmp, sizeof tmp, "%s.tok.%ld.tmp", out_path, (long)getpid());
        int rc = lp_gguf_writer_write(w, tmp, err);
        lp_gguf_writer_free(w);
        if (rc == 0) rc = lp_read_file(tmp, owned, tok_n, (size_t)1 << 30, err);
        remove(tmp);
        *tok = *owned;
        return rc;
    }
    char path[1200], path2[1200];
    if (m->st) {
        h->tokenizer_kind = LP_LPX_TOK_HF;
        snprintf(path, sizeof path, "%s/tokenizer.json", m->path);
        snprintf(path2, sizeof path2, "%s/tokenizer_config.json", m->path);
        if (lp_read_file(path, owned, tok_n, (size_t)1 << 30, err)) return -1;
        *tok = *owned;
        if (access(path2, R_OK) == 0) {
            if (lp_read_file(path2, owned2, tok2_n, (size_t)1 << 26, err)) return -1;
            *tok2 = *owned2;
        }
        return 0;
    }
    h->tokenizer_kind = LP_LPX_TOK_LLAMA2C;
    if (!m->tokenizer_path[0]) return lp_fail(err, "%s: the model has no tokenizer file", m->path);
    if (lp_read_file(m->tokenizer_path, owned, tok_n, (size_t)1 << 30, err)) return -1;
    *tok = *owned;
    return 0;
}

static void fill_header(const compiler *c, lp_lpx_header *h) {
    const lp_model *m = c->src;
    const lp_hparams *hp = &m->hp;
    memset(h, 0, sizeof *h);
    h->arch = (uint32_t)hp->arch;
    h->flags = (hp->rope_neox ? LP_LPX_ROPE_NEOX : 0) | (m->tied_output ? LP_LPX_TIED_OUTPUT : 0) |
               (m->has_freq_factors ? LP_LPX_FREQ_FACTORS : 0) |
               (c->fold || m->norms_folded ? LP_LPX_NORMS_FOLDED : 0);
    h->n_vocab = (uint32_t)hp->n_vocab;
    h->dim = (uint32_t)hp->dim;
    h->n_layers = (uint32_t)hp->n_layers;
    h->n_heads = (uint32_t)hp->n_heads;
    h->n_kv_heads = (uint32_t)hp->n_kv_heads;
    h->head_dim = (uint32_t)hp->head_dim;
    h->ffn_dim = (uint32_t)hp->ffn_dim;
    h->n_ctx_train = (uint32_t)hp->n_ctx_train;
    h->rope_theta = hp->rope_theta;
    h->rms_eps = hp->rms_eps;
    h->acts = c->p->float_acts ? LP_LPX_ACTS_F32 : LP_LPX_ACTS_INT8;
    h->weight_type = c->p->weight_type;
    h->group = is_packed(c->p->weight_type) ? (uint32_t)(c->p->group ? c->p->group : 32) : 0;
    snprintf(h->name, sizeof h->name, "%s", m->name);
}

int lp_model_compile(const lp_model *src, const char *out_path, const lp_compile_params *p,
                     lp_error *err) {
    uint32_t wt = p->weight_type;
    if (wt != LP_W4 && wt != LP_W4C && wt != LP_W8 && wt != LP_F16 && wt != LP_F32)
        return lp_fail(err, "compile: weight type must be W4, W4C, W8, F16 or F32");
    int g = p->group ? p->group : 32;
    if (((wt == LP_W4 || wt == LP_W4C) && g != 32 && g != 64 && g != 128) || (wt == LP_W8 && (g <= 0 || g % 32 != 0)))
        return lp_fail(err, "compile: group %d is not valid for %s (W4, W4C: 32, 64, 128; W8: a "
                       "multiple of 32)", g, lp_dtype_name(wt));
    compiler c = {.src = src, .p = p};
    lp_lpx_header h;
    const void *tok = NULL, *tok2 = NULL;
    size_t tok_n = 0, tok2_n = 0;
    char *owned = NULL, *owned2 = NULL;
    int rc = plan(&c, err);
    if (rc == 0) {
        fill_header(&c, &h);
        rc = tokenizer_blob(src, out_path, &h, &tok, &tok_n, &tok2, &tok2_n, &owned, &owned2, err);
    }
    if (rc == 0) {
        c.pool = lp_threadpool_create(p->n_threads > 0 ? p->n_threads : lp_default_threads(), err);
        if (!c.pool) rc = -1;
    }
    if (rc == 0) {
        int threads = lp_threadpool_size(c.pool);
        size_t scratch = (size_t)threads * CHUNK_ROWS * (size_t)(c.max_cols ? c.max_cols : 1);
        c.buf = lp_alloc(c.buf_bytes ? c.buf_bytes : 1);
        c.scratch = lp_alloc(scratch * sizeof(float));
        c.failed = calloc((size_t)threads, sizeof *c.failed);
        if (!c.buf || !c.scratch || !c.failed)
            rc = lp_fail(err, "out of memory for compile buffers (%zu MB)", c.buf_bytes >> 20);
    }
    if (rc == 0)
        rc = lp_lpx_write(out_path, &h, tok, tok_n, tok2, tok2_n, c.tensors, c.n, fill_tensor, &c, err);
    lp_threadpool_destroy(c.pool);
    lp_free(c.buf);
    lp_free(c.scratch);
    free(c.failed);
    free(c.tensors);
    free(c.jobs);
    free(owned);
    free(owned2);
    return rc;
}
