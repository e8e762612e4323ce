/* LoRA adapters: loading from .lpa, Hugging Face PEFT directories and
 * llama.cpp GGUF LoRAs into one in-memory form (adapter.h) and validation
 * against the base. .lpa writing and merging into a base GGUF are in the
 * tools library (src/tools/adapter_write.c).
 *
 * The three sources go through one path: the format code lists "pieces"
 * (the weight's name, A or B half, the stored tensor) and the alpha that
 * applies, then build_pairs() maps each name to a weight id of the base,
 * checks shapes, converts the data (F32 or F16), and fixes the rotary row
 * order. Nothing here knows an architecture: names, shapes, folded gains
 * and rotary rows all come from the base's weight table (lp_model.weights). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "adapter.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/dtype.h"
#include "../formats/lpa.h"
#include "../kernels/lora_static.h"

/* ---- fingerprint ---------------------------------------------------------------- */

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t fnv_u64(uint64_t h, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    return fnv1a(h, b, 8);
}

/* Type, shape and the first/last 64 bytes of a weight: cheap, and any
 * re-quantization or different checkpoint changes it. */
static uint64_t fnv_weight(uint64_t h, const lp_weight *w) {
    h = fnv_u64(h, w->type);
    h = fnv_u64(h, (uint64_t)w->rows);
    h = fnv_u64(h, (uint64_t)w->cols);
    if (!w->data || w->rows <= 0) return h;
    size_t bytes = w->row_bytes * (size_t)w->rows, take = bytes < 64 ? bytes : 64;
    h = fnv1a(h, w->data, take);
    return fnv1a(h, (const uint8_t *)w->data + (bytes - take), take);
}

uint64_t lp_model_fingerprint(const lp_model *m) {
    const lp_hparams *hp = &m->hp;
    uint64_t h = 0xcbf29ce484222325ull;
    const int64_t dims[] = {hp->arch, hp->n_vocab, hp->dim, hp->n_layers, hp->n_heads,
                            hp->n_kv_heads, hp->head_dim, hp->ffn_dim, hp->rope_neox};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) h = fnv_u64(h, (uint64_t)dims[i]);
    /* folded bases take only .lpa files made for folded bases (unfolded
     * fingerprints stay as they were) */
    if (m->norms_folded) h = fnv_u64(h, 0xF01DF01Dull);
    h = fnv_weight(h, &m->tok_embd);
    h = fnv_weight(h, &m->output);
    for (int l = 0; m->layers && l < hp->n_layers; l++) {
        const lp_layer *L = &m->layers[l];
        const lp_weight *ws[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) h = fnv_weight(h, ws[i]);
    }
    return h;
}

static lp_lpa_base lpa_base_of(const lp_model *m) {
    const lp_hparams *hp = &m->hp;
    lp_lpa_base b = {
        .fingerprint = lp_model_fingerprint(m),
        .arch = (uint32_t)hp->arch,
        .flags = hp->rope_neox ? 0 : LP_LPA_FLAG_INTERLEAVED,
        .n_layers = (uint32_t)hp->n_layers, .dim = (uint32_t)hp->dim,
        .n_heads = (uint32_t)hp->n_heads, .n_kv_heads = (uint32_t)hp->n_kv_heads,
        .head_dim = (uint32_t)hp->head_dim, .ffn_dim = (uint32_t)hp->ffn_dim,
        .n_vocab = (uint32_t)hp->n_vocab,
    };
    return b;
}

int lp_model_weight_by_name(const lp_model *m, const char *name) {
    for (int w = 0; w < m->n_weights; w++)
        if (!strcmp(m->weights[w].name, name)) return w;
    return -1;
}

int lp_model_weight_by_module(const lp_model *m, const char *module) {
    for (int w = 0; w < m->n_weights; w++)
        if (!strcmp(m->weights[w].hf_name, module)) return w;
    return -1;
}

/* ---- the adapter object ----------------------------------------------------------- */

static void *adapter_own(lp_adapter *a, size_t bytes) {
    if (a->n_owned == a->cap_owned) {
        int cap = a->cap_owned ? a->cap_owned * 2 : 32;
        void **grown = realloc(a->owned, (size_t)cap * sizeof *grown);
        if (!grown) return NULL;
        a->owned = grown;
        a->cap_owned = cap;
    }
    void *p = lp_alloc(bytes);
    if (p) a->owned[a->n_owned++] = p;
    return p;
}

void lp_adapter_free(lp_adapter *a) {
    if (!a) return;
    for (int i = 0; i < a->n_owned; i++) lp_free(a->owned[i]);
    free(a->owned);
    free(a->pairs);
    free(a->index);
    lp_unmap_file(&a->file);
    free(a);
}

const char *lp_adapter_name(const lp_adapter *a) { return a->name; }
uint64_t lp_adapter_bytes(const lp_adapter *a) { return a->bytes; }
int lp_adapter_max_rank(const lp_adapter *a) { return a->max_rank; }
uint64_t lp_adapter_identity(const lp_adapter *a) { return a ? a->tag : 0; }

/* An adapter with room for n pairs (and, with a base, its weight index). */
static lp_adapter *adapter_new(const lp_model *model, size_t n, lp_error *err) {
    lp_adapter *a = calloc(1, sizeof *a);
    if (a) a->pairs = calloc(n ? n : 1, sizeof *a->pairs);
    if (a && model) a->index = malloc((size_t)(model->n_weights ? model->n_weights : 1) * sizeof *a->index);
    if (!a || !a->pairs || (model && !a->index)) {
        if (a) {
            free(a->pairs);
            free(a->index);
        }
        free(a);
        lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    for (int w = 0; model && w < model->n_weights; w++) a->index[w] = -1;
    a->base = model;
    return a;
}

/* The next pair, for weight id w (-1 without a base) named `name`. */
static lp_lora_pair *add_pair(lp_adapter *a, int w, const char *name) {
    lp_lora_pair *p = &a->pairs[a->n_pairs];
    if (w >= 0) a->index[w] = a->n_pairs;
    a->n_pairs++;
    p->weight = w;
    snprintf(p->name, sizeof p->name, "%s", name);
    return p;
}

static void copy_name(char *dst, size_t cap, const char *src, size_t len) {
    if (len >= cap) len = cap - 1;
    while (len > 0 && ((uint8_t)src[len] & 0xC0) == 0x80) len--; /* whole UTF-8 chars */
    memcpy(dst, src, len);
    dst[len] = 0;
}

static const char *basename_of(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;  /* "dir/" -> "dir" */
    const char *s = path + n;
    while (s > path && s[-1] != '/') s--;
    return s;
}

/* Bytes of one half of a pair (packed W8 halves are not row-strided). */
static size_t half_bytes(const lp_weight *w) {
    if (w->type == LP_W8 || w->type == LP_W4) return lp_pack_bytes(w->type, w->rows, w->cols, w->group);
    if (w->type == LP_I8 && w->group) /* profile B: row_bytes per block of group rows */
        return w->row_bytes * (size_t)((w->rows + w->group - 1) / w->group);
    return w->row_bytes * (size_t)w->rows;
}

static void finish_totals(lp_adapter *a) {
    a->bytes = 0;
    a->max_rank = 0;
    for (int i = 0; i < a->n_pairs; i++) {
        const lp_lora_pair *p = &a->pairs[i];
        a->bytes += (uint64_t)(half_bytes(&p->A) + half_bytes(&p->B));
        if (p->rank > a->max_rank) a->max_rank = p->rank;
    }
}

/* ---- pieces: the common path of the GGUF and PEFT loaders ---------------------------- */

typedef struct src_tensor {
    char name[192];
    bool gguf;              /* print dims innermost first */
    uint32_t dtype;         /* LP_F32, LP_F16, LP_BF16 */
    uint64_t rows, cols;    /* row-major as stored */
    const void *data;       /* possibly unaligned */
} src_tensor;

typedef struct piece {
    char key[96];           /* the weight: GGUF name, or the PEFT module */
    bool is_b;
    src_tensor t;
} piece;

typedef struct piece_list {
    piece *items;
    size_t n, cap;
} piece_list;

static int push_piece(piece_list *l, const piece *p, lp_error *err) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        piece *grown = realloc(l->items, cap * sizeof *grown);
        if (!grown) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        l->items = grown;
        l->cap = cap;
    }
    l->items[l->n++] = *p;
    return 0;
}

/* How the loader turns alpha and rank into a scale. */
typedef struct scale_rule {
    float user_scale;
    bool gguf;                     /* alpha 0 means "no alpha/r" (llama.cpp) */
    float alpha;                   /* GGUF: one alpha */
    const lp_peft_config *peft;    /* PEFT: per-module r/alpha */
} scale_rule;

static void shape_str(const src_tensor *t, char *buf, size_t cap) {
    if (t->gguf) snprintf(buf, cap, "[%llu, %llu]", (unsigned long long)t->cols, (unsigned long long)t->rows);
    else snprintf(buf, cap, "[%llu, %llu]", (unsigned long long)t->rows, (unsigned long long)t->cols);
}

static void expect_str(bool gguf, uint64_t rows, uint64_t cols, char *buf, size_t cap) {
    if (gguf) snprintf(buf, cap, "[%llu, %llu]", (unsigned long long)cols, (unsigned long long)rows);
    else snprintf(buf, cap, "[%llu, %llu]", (unsigned long long)rows, (unsigned long long)cols);
}

static float read_elem(uint32_t dtype, const uint8_t *p, size_t i) {
    if (dtype == LP_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return dtype == LP_F16 ? lp_f16_to_f32(h) : lp_bf16_to_f32(h);
}

/* Row `dst` of q/k output rows comes from which source row. Interleaved
 * order pairs rows (2i, 2i+1) of a head for rotary; Hugging Face order pairs
 * (i, i + d/2). HF row s*d/2+i is interleaved row 2i+s. */
uint64_t lp_rope_source_row(uint64_t dst, int head_dim, int direction) {
    uint64_t d = (uint64_t)head_dim, half = d / 2, head = dst / d, j = dst % d;
    if (direction > 0) /* HF source, interleaved destination */
        return head * d + (j % 2) * half + j / 2;
    /* interleaved source, HF destination */
    return head * d + 2 * (j % half) + j / half;
}

/* Converts a stored tensor into an owned, aligned F32/F16 matrix, checking
 * every value is finite, with optional q/k row reordering. */
static int convert(lp_adapter *a, const src_tensor *t, int permute_dir, int head_dim,
                   const char *what, lp_weight *out, lp_error *err) {
    uint32_t type = t->dtype == LP_F16 ? LP_F16 : LP_F32;
    size_t esz = type == LP_F16 ? 2 : 4, src_esz = t->dtype == LP_F32 ? 4 : 2;
    size_t row_bytes, bytes;
    if (!lp_mul_ok((size_t)t->cols, esz, &row_bytes) || !lp_mul_ok(row_bytes, (size_t)t->rows, &bytes))
        return lp_fail(err, "%s: tensor '%s' is too large", what, t->name);
    uint8_t *dst = adapter_own(a, bytes ? bytes : 1);
    if (!dst) return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory for tensor '%s'", what, t->name);
    const uint8_t *src = t->data;
    for (uint64_t r = 0; r < t->rows; r++) {
        uint64_t sr = permute_dir ? lp_rope_source_row(r, head_dim, permute_dir) : r;
        const uint8_t *srow = src + sr * t->cols * src_esz;
        uint8_t *drow = dst + r * row_bytes;
        for (uint64_t c = 0; c < t->cols; c++) {
            float v = read_elem(t->dtype, srow, c);
            if (!isfinite(v))
                return lp_fail(err, "%s: tensor '%s' has a non-finite value at [%llu, %llu]", what,
                               t->name, (unsigned long long)sr, (unsigned long long)c);
        }
        if (type == t->dtype) memcpy(drow, srow, row_bytes);
        else
            for (uint64_t c = 0; c < t->cols; c++) {
                float v = read_elem(t->dtype, srow, c);
                memcpy(drow + 4 * c, &v, 4);
            }
    }
    out->type = type;
    out->rows = (int64_t)t->rows;
    out->cols = (int64_t)t->cols;
    out->row_bytes = row_bytes;
    out->data = dst;
    return 0;
}

static int pair_scale(const scale_rule *rule, const char *module, int rank, const char *what,
                      const char *tensor, float *out, lp_error *err) {
    if (rule->peft) {
        int want_rank;
        float alpha;
        if (lp_peft_module_params(rule->peft, module, what, &want_rank, &alpha, err)) return -1;
        if (want_rank != rank)
            return lp_fail(err, "%s: tensor '%s' has rank %d but adapter_config.json says r = %d "
                           "for %s (r / rank_pattern)", what, tensor, rank, want_rank, module);
        float denom = rule->peft->rslora ? sqrtf((float)rank) : (float)rank;
        *out = alpha / denom * rule->user_scale;
    } else {
        *out = rule->alpha == 0.0f ? rule->user_scale : rule->alpha / (float)rank * rule->user_scale;
    }
    if (!isfinite(*out)) return lp_fail(err, "%s: the scale of '%s' is not finite", what, tensor);
    return 0;
}

/* A base with folded norm gains (a compiled .lpx) feeds q/k/v and gate/up
 * the normalised input WITHOUT its gain (the gain is in W's columns), so an
 * adapter trained on x * gain must see it too: A' = A diag(gain). Done once
 * at load into an F32 copy. (.lpa files are stored in their base's
 * convention, already folded, and bound to it by the fingerprint.) */
static int fold_norm_gains(lp_adapter *a, const char *what, lp_error *err) {
    for (int i = 0; i < a->n_pairs; i++) {
        lp_lora_pair *pair = &a->pairs[i];
        const float *gain = a->base->weights[pair->weight].in_gain;
        if (!gain) continue;
        int64_t rows = pair->A.rows, cols = pair->A.cols;
        float *A = adapter_own(a, (size_t)rows * (size_t)cols * sizeof(float));
        if (!A) return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory folding norm gains", what);
        for (int64_t r = 0; r < rows; r++) {
            lp_dequantize_row(pair->A.type, (const uint8_t *)pair->A.data + (size_t)r * pair->A.row_bytes,
                              A + r * cols, cols);
            for (int64_t c = 0; c < cols; c++) A[r * cols + c] *= gain[c];
        }
        pair->A = (lp_weight){.type = LP_F32, .rows = rows, .cols = cols,
                              .row_bytes = (size_t)cols * sizeof(float), .data = A};
    }
    return 0;
}

/* The A and B halves of one weight's pair. */
typedef struct halves {
    const piece *h[2];
    int weight;            /* -1 without a base */
} halves;

static int cmp_piece_key(const void *x, const void *y) {
    const piece *const *a = x, *const *b = y;
    return strcmp((*a)->key, (*b)->key);
}

/* Sorts the pieces into halves per weight: by weight id with a base (a
 * name the base has no adaptable weight for is an error), else by name. */
static int collect_halves(const lp_model *m, const piece_list *pl, bool by_module, const char *what,
                          halves **out, size_t *n_out, lp_error *err) {
    size_t n = m ? (size_t)m->n_weights : pl->n;
    halves *hs = calloc(n ? n : 1, sizeof *hs);
    const piece **sorted = calloc(pl->n ? pl->n : 1, sizeof *sorted);
    if (!hs || !sorted) {
        free(hs);
        free(sorted);
        return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    }
    int rc = 0;
    size_t used = 0;
    for (size_t i = 0; i < pl->n; i++) sorted[i] = &pl->items[i];
    if (!m) qsort(sorted, pl->n, sizeof *sorted, cmp_piece_key);
    for (size_t i = 0; i < pl->n && rc == 0; i++) {
        const piece *p = sorted[i];
        halves *h;
        if (m) {
            int w = by_module ? lp_model_weight_by_module(m, p->key) : lp_model_weight_by_name(m, p->key);
            if (w < 0) {
                rc = lp_fail(err, "%s: tensor '%s' is for '%s', which is not an adaptable weight of the base "
                             "(it has %d, e.g. '%s')", what, p->t.name, p->key, m->n_weights,
                             m->n_weights ? (by_module ? m->weights[0].hf_name : m->weights[0].name) : "");
                break;
            }
            h = &hs[w];
            h->weight = w;
        } else {
            if (used == 0 || strcmp(hs[used - 1].h[0] ? hs[used - 1].h[0]->key : hs[used - 1].h[1]->key, p->key))
                hs[used++].weight = -1;
            h = &hs[used - 1];
        }
        if (h->h[p->is_b])
            rc = lp_fail(err, "%s: tensors '%s' and '%s' are the same half of one pair", what,
                         h->h[p->is_b]->t.name, p->t.name);
        h->h[p->is_b] = p;
    }
    free(sorted);
    if (rc) {
        free(hs);
        return rc;
    }
    *out = hs;
    *n_out = m ? n : used;
    return 0;
}

/* Checks one weight's halves against the base and converts them into the
 * adapter's next pair. */
static int build_pair(lp_adapter *a, const halves *h, const scale_rule *rule, bool src_interleaved,
                      const char *what, lp_error *err) {
    const lp_model *m = a->base;
    const piece *pa = h->h[0], *pb = h->h[1];
    const char *key = (pa ? pa : pb)->key;
    if (!pa || !pb)
        return lp_fail(err, "%s: %s has '%s' but no matching lora_%s half", what, key,
                       (pa ? pa : pb)->t.name, pa ? "B" : "A");
    const lp_model_weight *mw = m ? &m->weights[h->weight] : NULL;
    const src_tensor *A = &pa->t, *B = &pb->t;
    uint64_t in = A->cols, out = B->rows, rank = A->rows;
    if (mw) {
        in = (uint64_t)mw->w->cols;
        out = (uint64_t)mw->w->rows;
    }
    char have[64], want[64];
    if (A->cols != in || A->rows == 0) {
        shape_str(A, have, sizeof have);
        expect_str(A->gguf, rank, in, want, sizeof want);
        return lp_fail(err, "%s: tensor '%s' has shape %s, expected %s (rank x %llu inputs of %s)", what,
                       A->name, have, want, (unsigned long long)in, key);
    }
    if (B->rows != out || B->cols != rank) {
        shape_str(B, have, sizeof have);
        expect_str(B->gguf, out, rank, want, sizeof want);
        return lp_fail(err, "%s: tensor '%s' has shape %s, expected %s (%llu outputs of %s x rank %llu of "
                       "its lora_A)", what, B->name, have, want, (unsigned long long)out, key,
                       (unsigned long long)rank);
    }
    uint64_t max_rank = in < out ? in : out;
    if (rank > max_rank || rank > 65536)
        return lp_fail(err, "%s: tensor '%s' has rank %llu, more than min(in, out) = %llu", what, A->name,
                       (unsigned long long)rank, (unsigned long long)max_rank);
    lp_lora_pair *pair = add_pair(a, h->weight, mw ? mw->name : key);
    bool dst_interleaved = m && !m->hp.rope_neox;
    int dir = 0;
    if (mw && mw->rope_rows && src_interleaved != dst_interleaved) dir = dst_interleaved ? 1 : -1;
    pair->rank = (int)rank;
    int rc = pair_scale(rule, mw ? mw->hf_name : key, (int)rank, what, A->name, &pair->scale, err);
    if (rc == 0) rc = convert(a, A, 0, 0, what, &pair->A, err);
    if (rc == 0) rc = convert(a, B, dir, m ? m->hp.head_dim : 0, what, &pair->B, err);
    return rc;
}

/* Names to weight ids, shapes, ranks, halves, conversion. src_interleaved:
 * the source's rotary rows are in interleaved (GGUF llama) order rather
 * than Hugging Face order. by_module: the pieces' keys are PEFT module
 * names (else GGUF weight names). */
static int build_pairs(lp_adapter *a, const piece_list *pl, const scale_rule *rule, bool src_interleaved,
                       bool by_module, const char *what, lp_error *err) {
    halves *hs = NULL;
    size_t n = 0;
    if (collect_halves(a->base, pl, by_module, what, &hs, &n, err)) return -1;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        if (hs[i].h[0] || hs[i].h[1]) rc = build_pair(a, &hs[i], rule, src_interleaved, what, err);
    free(hs);
    if (rc == 0 && a->base && a->base->norms_folded) rc = fold_norm_gains(a, what, err);
    return rc;
}

/* ---- llama.cpp GGUF LoRA ------------------------------------------------------------ */

/* "blk.N.attn_q.weight.lora_a" -> key "blk.N.attn_q.weight", half; false
 * if the name is not a LoRA half of a weight. */
static bool parse_gguf_name(const char *name, char *key, size_t cap, bool *is_b) {
    size_t n = strlen(name);
    if (n < 15 || (strcmp(name + n - 14, ".weight.lora_a") && strcmp(name + n - 14, ".weight.lora_b")))
        return false;
    if (n - 7 >= cap) return false;
    memcpy(key, name, n - 7);
    key[n - 7] = 0;
    *is_b = name[n - 1] == 'b';
    return true;
}

static int gguf_str(const lp_gguf *g, const char *key, char *out, size_t cap, lp_error *err) {
    lp_str s;
    int rc = lp_gguf_get_str(g, key, &s, err);
    if (rc == 1) copy_name(out, cap, s.ptr, s.len);
    else if (cap) out[0] = 0;
    return rc;
}

static int load_gguf_pieces(const lp_gguf *g, const char *path, piece_list *pl, lp_error *err) {
    for (size_t i = 0; i < lp_gguf_tensor_count(g); i++) {
        const lp_gguf_tensor *t = lp_gguf_tensor_at(g, i);
        piece p = {0};
        copy_name(p.t.name, sizeof p.t.name, t->name.ptr, t->name.len);
        bool head = strstr(p.t.name, "token_embd") || strncmp(p.t.name, "output.", 7) == 0;
        if (head || !parse_gguf_name(p.t.name, p.key, sizeof p.key, &p.is_b)) {
            if (head)
                return lp_fail(err, "%s: tensor '%s': adapters on the token embedding or the "
                               "output layer are not supported (only q, k, v, o, gate, up, down)",
                               path, p.t.name);
            return lp_fail(err, "%s: tensor '%s' is not a LoRA half of a weight "
                           "(<weight name>.weight.lora_{a,b}, e.g. blk.0.attn_q.weight.lora_a)", path, p.t.name);
        }
        if (t->type != LP_F32 && t->type != LP_F16 && t->type != LP_BF16)
            return lp_fail(err, "%s: tensor '%s' has type %s (F32, F16, BF16 are supported)", path,
                           p.t.name, lp_dtype_name(t->type));
        if (t->n_dims != 2)
            return lp_fail(err, "%s: tensor '%s' has %u dimensions, expected 2", path, p.t.name,
                           t->n_dims);
        p.t.gguf = true;
        p.t.dtype = t->type;
        p.t.cols = t->dims[0];
        p.t.rows = t->dims[1];
        p.t.data = t->data;
        if (push_piece(pl, &p, err)) return -1;
    }
    return 0;
}

static lp_adapter *load_gguf(const lp_model *m, const char *path, float scale, lp_error *err) {
    lp_gguf *g = lp_gguf_open(path, err);
    if (!g) return NULL;
    lp_adapter *a = NULL;
    piece_list pl = {0};
    char type[64], arch[64];
    int rc = gguf_str(g, "general.type", type, sizeof type, err);
    if (rc >= 0 && strcmp(type, "adapter") != 0) {
        rc = lp_fail(err, "%s: general.type is \"%s\", not \"adapter\": this is a model, not a "
                     "LoRA adapter", path, type);
    }
    if (rc >= 0) rc = gguf_str(g, "adapter.type", type, sizeof type, err);
    if (rc >= 0 && strcmp(type, "lora") != 0)
        rc = lp_fail(err, "%s: adapter.type is \"%s\" (only \"lora\" is supported)", path, type);
    if (rc >= 0) rc = gguf_str(g, "general.architecture", arch, sizeof arch, err);
    if (rc >= 0 && !strcmp(arch, "mistral")) snprintf(arch, sizeof arch, "llama");
    lp_arch a_arch = LP_ARCH_LLAMA;
    if (rc >= 0 && lp_arch_from_name(arch, &a_arch) != 0)
        rc = lp_fail(err, "%s: adapter architecture \"%s\" is not supported", path, arch);
    if (rc >= 0 && m && a_arch != m->hp.arch)
        rc = lp_fail(err, "%s: adapter is for architecture \"%s\" but the base is \"%s\"", path,
                     arch, lp_arch_name(m->hp.arch));
    float alpha = 0.0f;
    if (rc >= 0 && lp_gguf_get_f32(g, "adapter.lora.alpha", &alpha, err) < 0) rc = -1;
    if (rc >= 0 && !isfinite(alpha)) rc = lp_fail(err, "%s: adapter.lora.alpha is not finite", path);
    if (rc >= 0) rc = load_gguf_pieces(g, path, &pl, err);
    if (rc >= 0 && pl.n == 0) rc = lp_fail(err, "%s: the adapter has no LoRA tensors", path);
    if (rc >= 0) a = adapter_new(m, pl.n, err);
    if (a) {
        a->format = "gguf";
        if (gguf_str(g, "general.name", a->name, sizeof a->name, NULL) != 1 || !a->name[0])
            snprintf(a->name, sizeof a->name, "%s", basename_of(path));
        /* llama.cpp's converter permutes q/k rows for the llama architecture only */
        scale_rule rule = {.user_scale = scale, .gguf = true, .alpha = alpha};
        if (build_pairs(a, &pl, &rule, a_arch == LP_ARCH_LLAMA, false, path, err)) {
            lp_adapter_free(a);
            a = NULL;
        } else {
            finish_totals(a);
        }
    }
    free(pl.items);
    lp_gguf_close(g);
    return a;
}

/* ---- PEFT adapter_config.json -------------------------------------------------------- */

static const char *const supported_modules[] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                "gate_proj", "up_proj", "down_proj"};

/* Does `subject` match `pattern`: PEFT's re.match(rf"(.*\.)?({key})$") when
 * `suffix`, else re.fullmatch(pattern). Returns 1, 0, or -1 (bad pattern). */
static int regex_match(const char *pattern, const char *subject, bool suffix) {
    char *full = NULL;
    size_t n = strlen(pattern) + 32;
    full = malloc(n);
    if (!full) return -1;
    snprintf(full, n, suffix ? "(?:.*\\.)?(?:%s)$" : "(?:%s)", pattern);
    int errcode;
    PCRE2_SIZE erroff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)full, PCRE2_ZERO_TERMINATED, 0, &errcode,
                                   &erroff, NULL);
    free(full);
    if (!re) return -1;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    pcre2_match_context *mc = pcre2_match_context_create(NULL);
    int result = -1;
    if (md && mc) {
        pcre2_set_match_limit(mc, 100000);
        pcre2_set_depth_limit(mc, 1000);
        int rc = pcre2_match(re, (PCRE2_SPTR)subject, strlen(subject), 0,
                             PCRE2_ANCHORED | PCRE2_ENDANCHORED, md, mc);
        result = rc >= 0 ? 1 : rc == PCRE2_ERROR_NOMATCH ? 0 : -1;
    }
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return result;
}

static bool is_supported_module(const char *name) {
    for (size_t i = 0; i < sizeof supported_modules / sizeof supported_modules[0]; i++)
        if (!strcmp(name, supported_modules[i])) return true;
    return false;
}

static int check_targets(const cJSON *t, const char *what, lp_error *err) {
    if (!t || cJSON_IsNull(t)) return 0;
    if (cJSON_IsString(t)) {
        if (!strcmp(t->valuestring, "all-linear")) return 0;  /* PEFT excludes lm_head */
        static const char *const bad[] = {"model.embed_tokens", "lm_head"};
        for (int i = 0; i < 2; i++) {
            int r = regex_match(t->valuestring, bad[i], false);
            if (r < 0)
                return lp_fail(err, "%s: target_modules \"%s\" is not a usable regular expression",
                               what, t->valuestring);
            if (r == 1)
                return lp_fail(err, "%s: target_modules \"%s\" matches %s: adapters on the "
                               "embedding or lm_head are not supported", what, t->valuestring,
                               bad[i]);
        }
        return 0;
    }
    if (!cJSON_IsArray(t))
        return lp_fail(err, "%s: target_modules must be a list or a string", what);
    const cJSON *it;
    cJSON_ArrayForEach(it, t) {
        if (!cJSON_IsString(it))
            return lp_fail(err, "%s: target_modules entries must be strings", what);
        const char *dot = strrchr(it->valuestring, '.');
        const char *leaf = dot ? dot + 1 : it->valuestring;
        if (!is_supported_module(leaf))
            return lp_fail(err, "%s: target_modules entry \"%s\" is not supported (supported: "
                           "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)",
                           what, it->valuestring);
    }
    return 0;
}

static int check_pattern_object(const cJSON *o, const char *key, bool integer, const char *what,
                                lp_error *err) {
    if (!o || cJSON_IsNull(o)) return 0;
    if (!cJSON_IsObject(o)) return lp_fail(err, "%s: \"%s\" must be an object", what, key);
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) ||
            (integer && (it->valuedouble < 1 || it->valuedouble > 65536 ||
                         it->valuedouble != floor(it->valuedouble))))
            return lp_fail(err, "%s: %s[\"%s\"] must be %s", what, key, it->string ? it->string : "",
                           integer ? "an integer rank 1..65536" : "a finite number");
    }
    return 0;
}

static bool json_true(const cJSON *root, const char *key) {
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, key));
}

static int check_config(const cJSON *root, const char *what, lp_peft_config *cfg, lp_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
    if (!cJSON_IsString(v))
        return lp_fail(err, "%s: missing \"peft_type\" (expected \"LORA\")", what);
    if (strcmp(v->valuestring, "LORA") != 0)
        return lp_fail(err, "%s: peft_type \"%s\" is not supported (only \"LORA\")", what,
                       v->valuestring);
    if (json_true(root, "use_dora"))
        return lp_fail(err, "%s: use_dora: true: DoRA adapters are not supported", what);
    v = cJSON_GetObjectItemCaseSensitive(root, "modules_to_save");
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0) {
        const cJSON *first = cJSON_GetArrayItem(v, 0);
        return lp_fail(err, "%s: modules_to_save is not empty (\"%s\"...): fully trained "
                       "modules are not supported", what,
                       cJSON_IsString(first) ? first->valuestring : "?");
    }
    if (v && !cJSON_IsNull(v) && !cJSON_IsArray(v))
        return lp_fail(err, "%s: modules_to_save must be a list or null", what);
    v = cJSON_GetObjectItemCaseSensitive(root, "bias");
    if (cJSON_IsString(v) && strcmp(v->valuestring, "none") != 0)
        return lp_fail(err, "%s: bias \"%s\": trained biases are not supported (only \"none\")",
                       what, v->valuestring);
    if (json_true(root, "lora_bias"))
        return lp_fail(err, "%s: lora_bias: true is not supported", what);
    v = cJSON_GetObjectItemCaseSensitive(root, "layer_replication");
    if (v && !cJSON_IsNull(v))
        return lp_fail(err, "%s: layer_replication is not supported", what);
    v = cJSON_GetObjectItemCaseSensitive(root, "target_parameters");
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0)
        return lp_fail(err, "%s: target_parameters is not supported", what);
    /* fan_in_fan_out only concerns GPT-2 style Conv1D bases; PEFT resets it
     * to false for nn.Linear layers and lora_A/lora_B are Linear weights
     * either way, so it is accepted and ignored (shapes are checked). */
    if (check_targets(cJSON_GetObjectItemCaseSensitive(root, "target_modules"), what, err))
        return -1;

    v = cJSON_GetObjectItemCaseSensitive(root, "r");
    if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 65536 ||
        v->valuedouble != floor(v->valuedouble))
        return lp_fail(err, "%s: \"r\" must be an integer rank 1..65536", what);
    cfg->r = (int)v->valuedouble;
    v = cJSON_GetObjectItemCaseSensitive(root, "lora_alpha");
    cfg->alpha = 8.0f;  /* PEFT's default */
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || fabs(v->valuedouble) > 1e30)
            return lp_fail(err, "%s: \"lora_alpha\" must be a finite number", what);
        cfg->alpha = (float)v->valuedouble;
    }
    cfg->rslora = json_true(root, "use_rslora");
    cfg->rank_pattern = cJSON_GetObjectItemCaseSensitive(root, "rank_pattern");
    cfg->alpha_pattern = cJSON_GetObjectItemCaseSensitive(root, "alpha_pattern");
    if (check_pattern_object(cfg->rank_pattern, "rank_pattern", true, what, err) ||
        check_pattern_object(cfg->alpha_pattern, "alpha_pattern", false, what, err))
        return -1;
    if (cJSON_IsNull(cfg->rank_pattern)) cfg->rank_pattern = NULL;
    if (cJSON_IsNull(cfg->alpha_pattern)) cfg->alpha_pattern = NULL;
    v = cJSON_GetObjectItemCaseSensitive(root, "base_model_name_or_path");
    if (cJSON_IsString(v)) copy_name(cfg->base_name, sizeof cfg->base_name, v->valuestring,
                                     strlen(v->valuestring));
    return 0;
}

int lp_peft_config_parse(const char *json, size_t len, const char *what, lp_peft_config *cfg,
                         lp_error *err) {
    memset(cfg, 0, sizeof *cfg);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return lp_fail(err, "%s: not a valid JSON object", what);
    }
    cfg->root = root;
    if (check_config(root, what, cfg, err)) {
        lp_peft_config_free(cfg);
        return -1;
    }
    return 0;
}

void lp_peft_config_free(lp_peft_config *cfg) {
    cJSON_Delete(cfg->root);
    memset(cfg, 0, sizeof *cfg);
}

/* The first pattern key (in file order) matching the module, as PEFT does. */
static int pattern_find(const cJSON *patterns, const char *module, const char *label,
                        const char *what, const cJSON **found, lp_error *err) {
    *found = NULL;
    if (!patterns) return 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, patterns) {
        if (!it->string) continue;
        int r = !strcmp(it->string, module) ? 1 : regex_match(it->string, module, true);
        if (r < 0)
            return lp_fail(err, "%s: %s key \"%s\" is not a usable regular expression", what,
                           label, it->string);
        if (r == 1) {
            *found = it;
            return 0;
        }
    }
    return 0;
}

int lp_peft_module_params(const lp_peft_config *cfg, const char *module, const char *what,
                          int *rank, float *alpha, lp_error *err) {
    const cJSON *r, *a;
    if (pattern_find(cfg->rank_pattern, module, "rank_pattern", what, &r, err) ||
        pattern_find(cfg->alpha_pattern, module, "alpha_pattern", what, &a, err))
        return -1;
    *rank = r ? (int)r->valuedouble : cfg->r;
    *alpha = a ? (float)a->valuedouble : cfg->alpha;
    return 0;
}

/* ---- PEFT directory ------------------------------------------------------------------ */

/* "base_model.model.<module>.lora_A[.default].weight" -> key "<module>",
 * half; false if the name is not of that form. */
static bool parse_peft_name(const char *name, char *key, size_t cap, bool *is_b) {
    const char *s = name;
    if (!strncmp(s, "base_model.model.", 17)) s += 17;
    const char *half = strstr(s, ".lora_A.");
    if (!half) half = strstr(s, ".lora_B.");
    if (!half || half == s || (size_t)(half - s) >= cap) return false;
    const char *rest = half + 8;
    if (!strncmp(rest, "default.", 8)) rest += 8;
    if (strcmp(rest, "weight") != 0) return false;
    memcpy(key, s, (size_t)(half - s));
    key[half - s] = 0;
    *is_b = half[6] == 'B';
    return true;
}

static int reject_peft_tensor(const char *path, const char *name, lp_error *err) {
    if (strstr(name, "embed_tokens") || strstr(name, "lm_head"))
        return lp_fail(err, "%s: tensor '%s': adapters on embed_tokens / lm_head are not "
                       "supported", path, name);
    if (strstr(name, "lora_magnitude_vector"))
        return lp_fail(err, "%s: tensor '%s': DoRA magnitude vectors are not supported", path, name);
    if (strstr(name, "lora_embedding_"))
        return lp_fail(err, "%s: tensor '%s': embedding adapters are not supported", path, name);
    if (strstr(name, ".bias"))
        return lp_fail(err, "%s: tensor '%s': LoRA / trained biases are not supported", path, name);
    return lp_fail(err, "%s: tensor '%s' is not a LoRA half of a module (<module>.lora_{A,B}"
                   "[.default].weight, e.g. model.layers.0.self_attn.q_proj.lora_A.weight)", path, name);
}

static int load_peft_pieces(const lp_safetensors *st, const char *path, piece_list *pl,
                            lp_error *err) {
    for (size_t i = 0; i < lp_safetensors_count(st); i++) {
        const lp_st_tensor *t = lp_safetensors_at(st, i);
        piece p = {0};
        if (!parse_peft_name(t->name, p.key, sizeof p.key, &p.is_b))
            return reject_peft_tensor(path, t->name, err);
        copy_name(p.t.name, sizeof p.t.name, t->name, strlen(t->name));
        switch (t->dtype) {
        case LP_ST_F32: p.t.dtype = LP_F32; break;
        case LP_ST_F16: p.t.dtype = LP_F16; break;
        case LP_ST_BF16: p.t.dtype = LP_BF16; break;
        default:
            return lp_fail(err, "%s: tensor '%s' has dtype %s (F32, F16, BF16 are supported)",
                           path, t->name, lp_st_dtype_name(t->dtype));
        }
        if (t->n_dims != 2)
            return lp_fail(err, "%s: tensor '%s' has %u dimensions, expected 2", path, t->name,
                           t->n_dims);
        p.t.rows = t->shape[0];
        p.t.cols = t->shape[1];
        p.t.data = t->data;
        if (push_piece(pl, &p, err)) return -1;
    }
    return 0;
}

static bool file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static lp_adapter *load_peft(const lp_model *m, const char *dir, float scale, lp_error *err) {
    char cfg_path[1200], st_path[1200];
    snprintf(cfg_path, sizeof cfg_path, "%s/adapter_config.json", dir);
    snprintf(st_path, sizeof st_path, "%s/adapter_model.safetensors", dir);
    if (!file_exists(cfg_path)) {
        lp_fail(err, "%s: no adapter_config.json: not a PEFT adapter directory", dir);
        return NULL;
    }
    if (!file_exists(st_path)) {
        char bin[1200];
        snprintf(bin, sizeof bin, "%s/adapter_model.bin", dir);
        lp_fail(err, "%s: no adapter_model.safetensors%s", dir,
                file_exists(bin) ? " (adapter_model.bin is a pickle: convert it to safetensors)" : "");
        return NULL;
    }
    char *text;
    size_t len;
    if (lp_read_file(cfg_path, &text, &len, 64u << 20, err)) return NULL;
    lp_peft_config cfg;
    int rc = lp_peft_config_parse(text, len, cfg_path, &cfg, err);
    free(text);
    if (rc) return NULL;
    lp_safetensors *st = lp_safetensors_open(st_path, err);
    lp_adapter *a = NULL;
    piece_list pl = {0};
    if (st && load_peft_pieces(st, st_path, &pl, err) == 0) {
        if (pl.n == 0) lp_fail(err, "%s: the adapter has no LoRA tensors", st_path);
        else a = adapter_new(m, pl.n, err);
    }
    if (a) {
        a->format = "peft";
        snprintf(a->name, sizeof a->name, "%s", basename_of(dir));
        snprintf(a->base_name, sizeof a->base_name, "%s", cfg.base_name);
        scale_rule rule = {.user_scale = scale, .peft = &cfg};
        /* PEFT weights are in Hugging Face row order */
        if (build_pairs(a, &pl, &rule, false, true, st_path, err)) {
            lp_adapter_free(a);
            a = NULL;
        } else {
            finish_totals(a);
        }
    }
    free(pl.items);
    lp_safetensors_close(st);
    lp_peft_config_free(&cfg);
    return a;
}

/* ---- .lpa --------------------------------------------------------------------------- */

/* The W8 halves of an .lpa entry as packed weights (B is zero-padded to a
 * multiple of 32 columns). */
static lp_weight lpa_half(const lp_lpa_entry *e, bool is_b) {
    int64_t rank = (int64_t)e->rank, kr = (rank + 31) & ~(int64_t)31;
    if (e->dtype == LP_W8 || e->dtype == LP_W4)
        return is_b ? lp_packed_weight(e->dtype, 32, (int64_t)e->out, kr, e->b)
                    : lp_packed_weight(e->dtype, 32, rank, (int64_t)e->in, e->a);
    size_t esz = e->dtype == LP_F16 ? 2 : 4;
    return is_b ? (lp_weight){.type = e->dtype, .rows = (int64_t)e->out, .cols = rank,
                              .row_bytes = esz * (size_t)rank, .data = e->b}
                : (lp_weight){.type = e->dtype, .rows = rank, .cols = (int64_t)e->in,
                              .row_bytes = esz * e->in, .data = e->a};
}

/* Profile codes (.lpa version 3) in the static branch's layouts (type
 * LP_I8 marks them; group: B's outputs per block): Q8 A in place, Q8 B and
 * everything Q4 in an owned copy, Q4 kept at two codes a byte
 * (lp_lora_static_code). NULL data on no memory. */
static lp_weight lpa_codes(lp_adapter *a, const lp_lpa_entry *e, bool is_b) {
    int64_t rows = is_b ? (int64_t)e->out : (int64_t)e->rank, cols = is_b ? (int64_t)e->rank : (int64_t)e->in;
    const uint8_t *src = is_b ? e->b : e->a;
    bool packed = e->dtype == LP_LPA_Q4;
    lp_weight w = {.type = LP_I8, .rows = rows, .cols = cols, .row_bytes = (size_t)cols, .data = src};
    if (!packed && !is_b) return w;
    size_t codes = is_b ? LP_LORA_STATIC_B_CODES((int)cols, (int)rows) : LP_LORA_STATIC_A_CODES((int)rows, (int)cols, packed);
    size_t bytes = lp_lora_static_code_bytes(codes, packed);
    uint8_t *dst = adapter_own(a, bytes);
    w.data = dst;
    if (!dst) return w;
    memset(dst, 0, bytes);
    /* rows x row_bytes: the bytes the layout holds (hashing, sizes) */
    w.row_bytes = bytes / (size_t)(is_b ? (rows + LP_LORA_STATIC_B_BLOCK - 1) / LP_LORA_STATIC_B_BLOCK : rows);
    if (is_b) w.group = LP_LORA_STATIC_B_BLOCK;
    size_t rb = lp_lpa_code_row_bytes((uint32_t)e->dtype, (uint64_t)cols);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const uint8_t *row = src + (size_t)r * rb;
            int code = packed ? (c % 2 ? row[c / 2] >> 4 : row[c / 2] & 15) : row[c];
            size_t at = is_b ? lp_lora_static_b_at((int)cols, (int)c, (int)r)
                             : lp_lora_static_a_at((int)cols, packed, (int)r, (int)c);
            lp_lora_static_set_code(dst, at, packed, code);
        }
    return w;
}

/* The code sums the static branch needs (lp_lora_static.sum_a). */
static int64_t *lpa_sum_a(lp_adapter *a, const lp_lora_pair *p) {
    int64_t *sum_a = adapter_own(a, (size_t)p->rank * sizeof(int64_t));
    if (sum_a) lp_lora_static_sum_a(p->A.data, p->codes_packed, p->rank, (int)p->A.cols, sum_a);
    return sum_a;
}

static int check_lpa_data(const lp_lpa_entry *e, const char *what, lp_error *err) {
    if (e->dtype == LP_LPA_Q8 || e->dtype == LP_LPA_Q4) return 0; /* any code is valid */
    for (int h = 0; h < 2; h++) {
        lp_weight w = lpa_half(e, h == 1);
        float *row = lp_alloc((size_t)w.cols * sizeof(float));
        if (!row) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        bool finite = true;
        for (int64_t r = 0; r < w.rows && finite; r++) {
            lp_weight_dequantize_row(&w, r, row);
            for (int64_t c = 0; c < w.cols; c++) finite &= isfinite(row[c]) != 0;
        }
        lp_free(row);
        if (!finite)
            return lp_fail(err, "%s: %s lora_%c has a non-finite value", what, e->tensor, h ? 'B' : 'A');
    }
    return 0;
}

static int cmp_pair_weight(const void *x, const void *y) {
    const lp_lora_pair *a = x, *b = y;
    return (a->weight > b->weight) - (a->weight < b->weight);
}

/* Pairs in weight id order (as the other loaders build them), so an
 * adapter's identity does not depend on the file it came from. */
static void sort_pairs(lp_adapter *a) {
    if (!a->base) return;
    qsort(a->pairs, (size_t)a->n_pairs, sizeof *a->pairs, cmp_pair_weight);
    for (int i = 0; i < a->n_pairs; i++) a->index[a->pairs[i].weight] = i;
}

/* Entry e's weight id in m (-1 without a base), its shape checked. */
static int lpa_weight(const lp_model *m, const lp_lpa_entry *e, const char *what, lp_error *err) {
    if (!m) return -1;
    int w = lp_model_weight_by_name(m, e->tensor);
    if (w < 0) {
        lp_fail(err, "%s: entry '%s' is not an adaptable weight of the base", what, e->tensor);
        return -2;
    }
    const lp_weight *bw = m->weights[w].w;
    if (e->in != (uint64_t)bw->cols || e->out != (uint64_t)bw->rows) {
        lp_fail(err, "%s: %s is %llu x %llu in the file but %lld x %lld in the base", what, e->tensor,
                (unsigned long long)e->out, (unsigned long long)e->in, (long long)bw->rows, (long long)bw->cols);
        return -2;
    }
    return w;
}

static lp_adapter *adapter_from_lpa(const lp_model *m, const void *data, size_t size,
                                    const char *what, float scale, lp_error *err) {
    lp_lpa_base want;
    if (m) want = lpa_base_of(m);
    lp_lpa lpa;
    if (lp_lpa_parse(data, size, m ? &want : NULL, what, &lpa, err)) return NULL;
    lp_adapter *a = adapter_new(m, lpa.n_entries, err);
    for (uint32_t i = 0; a && i < lpa.n_entries; i++) {
        const lp_lpa_entry *e = &lpa.entries[i];
        float s = e->scale * scale;
        int w = lpa_weight(m, e, what, err);
        if (w == -2 || !isfinite(s) || check_lpa_data(e, what, err)) {
            if (w != -2 && !isfinite(s)) lp_fail(err, "%s: %s: scale is not finite", what, e->tensor);
            lp_adapter_free(a);
            a = NULL;
            break;
        }
        if (w >= 0 && a->index[w] >= 0) {
            lp_fail(err, "%s: two entries for %s", what, e->tensor);
            lp_adapter_free(a);
            a = NULL;
            break;
        }
        lp_lora_pair *p = add_pair(a, w, e->tensor);
        p->rank = (int)e->rank;
        p->scale = s;
        bool codes = e->dtype == LP_LPA_Q8 || e->dtype == LP_LPA_Q4;
        p->A = codes ? lpa_codes(a, e, false) : lpa_half(e, false);
        p->B = codes ? lpa_codes(a, e, true) : lpa_half(e, true);
        p->codes_packed = e->dtype == LP_LPA_Q4;
        if (codes && p->A.data && p->B.data) p->sum_a = lpa_sum_a(a, p);
        if (!p->A.data || !p->B.data || (codes && !p->sum_a)) {
            lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", what);
            lp_adapter_free(a);
            a = NULL;
            break;
        }
    }
    if (a) {
        a->format = "lpa";
        a->profile_id = lpa.profile_id;
        snprintf(a->name, sizeof a->name, "%s", lpa.name);
        snprintf(a->base_name, sizeof a->base_name, "%s", lpa.base_name);
        sort_pairs(a);
        finish_totals(a);
    }
    lp_lpa_release(&lpa);
    return a;
}

lp_adapter *lp_adapter_load_lpa_memory(const lp_model *m, const void *data, size_t size,
                                       const char *what, float scale, lp_error *err) {
    lp_adapter *a = adapter_from_lpa(m, data, size, what, scale, err);
    if (a) a->tag = lp_adapter_content_hash(a);
    return a;
}

static lp_adapter *load_lpa(const lp_model *m, const char *path, float scale, lp_error *err) {
    lp_mapped_file f;
    if (lp_map_file(path, &f, err)) return NULL;
    lp_adapter *a = adapter_from_lpa(m, f.data, f.size, path, scale, err);
    if (!a) {
        lp_unmap_file(&f);
        return NULL;
    }
    a->file = f;   /* the pairs point into the mapping */
    return a;
}

/* ---- dispatch -------------------------------------------------------------------------- */

static lp_adapter *load_any(const lp_model *m, const char *path, float scale, lp_error *err) {
    if (!isfinite(scale)) {
        lp_fail(err, "%s: adapter scale must be finite", path);
        return NULL;
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        lp_fail(err, "%s: no such file or directory", path);
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) return load_peft(m, path, scale, err);
    char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(magic, 1, 4, f) : 0;
    if (f) fclose(f);
    if (!f) {
        lp_error_set(err, LP_ERR_IO, "%s: cannot open", path);
        return NULL;
    }
    if (got == 4 && !memcmp(magic, "GGUF", 4)) return load_gguf(m, path, scale, err);
    if (got == 4 && !memcmp(magic, LP_LPA_MAGIC, 4)) return load_lpa(m, path, scale, err);
    lp_fail(err, "%s: not an adapter (expected an .lpa file, a GGUF LoRA or a PEFT directory)", path);
    return NULL;
}

/* A hash of the adapter's shapes, scales and sampled weight bytes: the tag
 * that KV entries computed with it carry. */
/* A 64-bit mix of n bytes into h: four independent multiply-xorshift lanes
 * over 8-byte words (so hashing a large adapter costs about a read of it),
 * the tail byte by byte, all lanes folded at the end. */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t hash_bytes(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = data;
    uint64_t lane[4] = {h, h ^ 0x9e3779b97f4a7c15ULL, h ^ 0xbf58476d1ce4e5b9ULL, h ^ 0x94d049bb133111ebULL};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++) {
            uint64_t w;
            memcpy(&w, p + i + 8 * k, sizeof w);
            lane[k] = (lane[k] ^ w) * 0x100000001b3ULL;
            lane[k] ^= lane[k] >> 29;
        }
    uint64_t out = mix64(lane[0]) ^ mix64(lane[1] + 1) ^ mix64(lane[2] + 2) ^ mix64(lane[3] + 3);
    for (; i < n; i++) out = (out ^ p[i]) * 0x100000001b3ULL;
    return mix64(out ^ (uint64_t)n);
}

static uint64_t hash_half(uint64_t h, const lp_weight *w) {
    int64_t shape[4] = {w->type, w->rows, w->cols, w->group};
    h = hash_bytes(h, shape, sizeof shape);
    return hash_bytes(h, w->data, half_bytes(w));
}

/* The adapter's identity: every shape, scale and weight byte, so KV made
 * with it is never served to an adapter that differs anywhere. */
uint64_t lp_adapter_content_hash(const lp_adapter *a) {
    uint64_t h = 0xcbf29ce484222325ULL;
    if (a->profile_id) h = hash_bytes(h, &a->profile_id, sizeof a->profile_id); /* codes need it */
    for (int i = 0; i < a->n_pairs; i++) {
        const lp_lora_pair *pr = &a->pairs[i];
        h = hash_bytes(h, pr->name, strlen(pr->name));
        h = hash_bytes(h, &pr->rank, sizeof pr->rank);
        h = hash_bytes(h, &pr->scale, sizeof pr->scale);
        h = hash_half(h, &pr->A);
        h = hash_half(h, &pr->B);
    }
    return h ? h : 1;
}

lp_adapter *lp_adapter_load(const lp_model *model, const char *path, float scale, lp_error *err) {
    if (!model) {
        lp_fail(err, "%s: an adapter needs a base model", path);
        return NULL;
    }
    lp_adapter *a = load_any(model, path, scale, err);
    if (a) a->tag = lp_adapter_content_hash(a);
    else lp_error_as_format(err);
    return a;
}

lp_adapter *lp_adapter_inspect(const char *path, lp_error *err) {
    return load_any(NULL, path, 1.0f, err);
}

/* ---- for the writers in the tools library (src/tools/adapter_write.c) ------------------- */

lp_lpa_base lp_adapter_lpa_base(const lp_model *m) { return lpa_base_of(m); }

void lp_adapter_copy_name(char *dst, size_t cap, const char *src, size_t len) {
    copy_name(dst, cap, src, len);
}
