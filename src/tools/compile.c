/* Compiled models (.lpx): the compiler (quantize into the kernels' layout,
 * fold RMSNorm gains into the next projections, fuse q/k/v and gate/up).
 * The loader is in the runtime (src/model/load_lpx.c). */
#include "compile.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../formats/lpx.h"

/* A tensor's name for messages (as the loader's label()). */
static void label(uint32_t kind, int layer, char *buf, size_t cap) {
    if (layer < 0) snprintf(buf, cap, "%s", lp_lpx_kind_name(kind));
    else snprintf(buf, cap, "blk.%d.%s", layer, lp_lpx_kind_name(kind));
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
