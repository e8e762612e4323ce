/* Adapters: GGUF LoRA loading and merging against llama.cpp's merge, PEFT
 * directories (rank/alpha patterns, rsLoRA, q/k row permutation, every
 * rejection), and the .lpa round trip with corruption checks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/dtype.h"
#include "check.h"
#include "formats/lpa.h"
#include "model/adapter.h"
#include "tools/adapter_write.h"
#include "arch/llama.h"

/* The pair of layer l's projection p, or an empty one (rank 0). */
static const lp_lora_pair *pair_of(const lp_adapter *a, int l, lp_proj p) {
    static const lp_lora_pair none = {.weight = -1};
    const lp_lora_pair *x = lp_llama_pair(a, l, p);
    return x ? x : &none;
}


#define MODELS LP_SHARED_MODELS
static const char *const base_path = MODELS "/stories260K.gguf";
static const char *const lora_path = MODELS "/stories260K-lora-r4-random-f32.gguf";

static bool contains(const lp_error *e, const char *s) { return strstr(e->message, s) != NULL; }

static float elem(const lp_weight *w, int64_t r, int64_t c) {
    const uint8_t *p = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
    if (w->type == LP_F32) {
        float f;
        memcpy(&f, p + 4 * c, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * c, 2);
    return lp_f16_to_f32(h);
}

/* ---- (a) + (b): the shared GGUF LoRA ------------------------------------------------ */

static void test_gguf_lora(const lp_model *base) {
    lp_error err = {0};
    lp_adapter *a = lp_adapter_load(base, lora_path, 1.0f, &err);
    CHECK_MSG(a != NULL, "%s", err.message);
    if (!a) return;
    CHECK(!strcmp(a->format, "gguf"));
    CHECK(!strcmp(lp_adapter_name(a), "random-lora-r4"));
    CHECK(a->n_pairs == 35 && a->max_rank == 4);
    int n_pairs = 0;
    for (int l = 0; l < 5; l++)
        for (int p = 0; p < LP_PROJ_COUNT; p++) {
            const lp_lora_pair *pr = pair_of(a, l, (lp_proj)p);
            n_pairs += pr->rank == 4 && pr->scale == 1.0f && pr->A.rows == 4 && pr->B.cols == 4;
        }
    CHECK(n_pairs == 35);
    const lp_lora_pair *k0 = pair_of(a, 0, LP_PROJ_K);
    CHECK(k0->A.cols == 64 && k0->B.rows == 32 && k0->A.type == LP_F32);
    /* GGUF LoRA on a GGUF llama base: no permutation, data as in the file */
    lp_gguf *g = lp_gguf_open(lora_path, &err);
    const lp_gguf_tensor *t = g ? lp_gguf_find_tensor(g, "blk.0.attn_k.weight.lora_b") : NULL;
    CHECK(t && !memcmp(t->data, k0->B.data, t->n_bytes));
    lp_gguf_close(g);
    uint64_t expect_bytes = 0;
    for (int i = 0; i < 35; i++)
        expect_bytes += (uint64_t)(a->pairs[i].A.rows * a->pairs[i].A.cols +
                                   a->pairs[i].B.rows * a->pairs[i].B.cols) * 4;
    CHECK(lp_adapter_bytes(a) == expect_bytes);

    lp_adapter *half = lp_adapter_load(base, lora_path, 0.5f, &err);
    CHECK(half && pair_of(half, 3, LP_PROJ_DOWN)->scale == 0.5f);
    lp_adapter_free(half);

    /* (b) merge vs llama.cpp's merge */
    char merged[] = "/tmp/lp_test_merge_XXXXXX";
    int fd = mkstemp(merged);
    close(fd);
    const lp_adapter *list[1] = {a};
    CHECK_MSG(lp_adapter_merge(base, list, 1, merged, &err) == 0, "%s", err.message);
    lp_gguf *mine = lp_gguf_open(merged, &err), *ref = lp_gguf_open(MODELS "/stories260K-lora-r4-merged.gguf", &err);
    CHECK(mine && ref);
    if (mine && ref) {
        CHECK(lp_gguf_tensor_count(mine) == lp_gguf_tensor_count(ref));
        CHECK(lp_gguf_find(mine, "tokenizer.ggml.tokens") != NULL);
        double max_diff = 0;
        int compared = 0;
        for (size_t i = 0; i < lp_gguf_tensor_count(ref); i++) {
            const lp_gguf_tensor *rt = lp_gguf_tensor_at(ref, i);
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)rt->name.len, rt->name.ptr);
            const lp_gguf_tensor *mt = lp_gguf_find_tensor(mine, name);
            CHECK_MSG(mt && mt->type == LP_F32 && rt->type == LP_F32 &&
                      mt->n_elements == rt->n_elements, "%s", name);
            if (!mt || mt->n_elements != rt->n_elements) continue;
            const float *x = mt->data, *y = rt->data;
            for (uint64_t j = 0; j < rt->n_elements; j++) {
                double d = fabs((double)x[j] - (double)y[j]);
                if (d > max_diff) max_diff = d;
            }
            compared++;
        }
        CHECK(compared == 48);
        CHECK_MSG(max_diff < 1e-5, "merged max abs diff %g", max_diff);
    }
    lp_gguf_close(mine);
    lp_gguf_close(ref);
    /* the merged file loads as a model */
    lp_model *mm = lp_model_load(merged, NULL, &err);
    CHECK_MSG(mm != NULL, "%s", err.message);
    lp_model_free(mm);
    remove(merged);
    lp_adapter_free(a);

    /* the same adapter on the llama2.c copy of the weights: same conventions */
    lp_model_params mp = {.tokenizer_path = MODELS "/tok512.bin"};
    lp_model *l2c = lp_model_load(MODELS "/stories260K.bin", &mp, &err);
    if (l2c) {
        lp_adapter *b = lp_adapter_load(l2c, lora_path, 1.0f, &err);
        CHECK_MSG(b != NULL, "%s", err.message);
        lp_adapter_free(b);
        lp_model_free(l2c);
    }

    /* wrong bases */
    lp_model *qwen = lp_model_load(MODELS "/arch/qwen2-tiny-random.gguf", NULL, &err);
    CHECK_MSG(qwen != NULL, "%s", err.message);
    if (qwen) {
        CHECK(lp_adapter_load(qwen, lora_path, 1.0f, &err) == NULL);
        CHECK_MSG(contains(&err, "architecture \"llama\"") && contains(&err, "qwen2"), "%s", err.message);
        lp_model_free(qwen);
    }
    lp_model *l3 = lp_model_load(MODELS "/arch/llama3-tiny-random.gguf", NULL, &err);
    if (l3) {
        CHECK(lp_adapter_load(l3, lora_path, 1.0f, &err) == NULL);
        CHECK_MSG(contains(&err, "lora_a' is for 'blk.2.attn_q.weight', which is not an adaptable weight"),
                  "%s", err.message);
        lp_model_free(l3);
    }
    /* a model is not an adapter */
    CHECK(lp_adapter_load(base, base_path, 1.0f, &err) == NULL);
    CHECK_MSG(contains(&err, "not \"adapter\""), "%s", err.message);
}

/* ---- (c) PEFT directories ------------------------------------------------------------- */

static const char *const hf_mod[LP_PROJ_COUNT] = {"self_attn.q_proj", "self_attn.k_proj",
                                                  "self_attn.v_proj", "self_attn.o_proj",
                                                  "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};

typedef struct peft_data {
    float *A[5][LP_PROJ_COUNT], *B[5][LP_PROJ_COUNT];
    int rank[5][LP_PROJ_COUNT];
    int64_t in[LP_PROJ_COUNT], out[LP_PROJ_COUNT];
} peft_data;

/* Tweaks for rejection tests. */
typedef struct peft_opts {
    const char *config;        /* adapter_config.json text */
    bool drop_b_l1_v;          /* leave out layer 1 v_proj lora_B */
    bool bad_shape_l0_q;       /* layer 0 q_proj lora_A with 63 columns */
    bool nan_l2_o;             /* a NaN in layer 2 o_proj lora_B */
    bool extra_embed;          /* an embed_tokens lora tensor */
    bool int_dtype;            /* layer 0 gate lora_A as I32 */
    bool default_segment;      /* ".lora_A.default.weight" names */
    bool extra_layer;          /* a layer 7 q_proj pair */
} peft_opts;

static const char *const good_config =
    "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"lora_dropout\": 0.05,"
    " \"target_modules\": [\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\","
    " \"up_proj\", \"down_proj\"], \"rank_pattern\": {\"k_proj\": 8,"
    " \"model.layers.2.mlp.down_proj\": 8}, \"alpha_pattern\": {\"v_proj\": 16},"
    " \"base_model_name_or_path\": \"karpathy/stories260K\", \"bias\": \"none\","
    " \"modules_to_save\": null, \"use_dora\": false, \"fan_in_fan_out\": false}";

static void make_peft_data(peft_data *d) {
    const int64_t in[7] = {64, 64, 64, 64, 64, 64, 172}, out[7] = {64, 32, 32, 64, 172, 172, 64};
    lp_rng rng;
    lp_rng_seed(&rng, 42);
    for (int p = 0; p < LP_PROJ_COUNT; p++) {
        d->in[p] = in[p];
        d->out[p] = out[p];
    }
    for (int l = 0; l < 5; l++)
        for (int p = 0; p < LP_PROJ_COUNT; p++) {
            int r = (p == LP_PROJ_K || (l == 2 && p == LP_PROJ_DOWN)) ? 8 : 4;
            d->rank[l][p] = r;
            d->A[l][p] = malloc(sizeof(float) * (size_t)(r * in[p]));
            d->B[l][p] = malloc(sizeof(float) * (size_t)(r * out[p]));
            for (int64_t i = 0; i < r * in[p]; i++) d->A[l][p][i] = lp_rng_normal(&rng) * 0.1f;
            for (int64_t i = 0; i < r * out[p]; i++) d->B[l][p][i] = lp_rng_normal(&rng) * 0.1f;
        }
}

static void free_peft_data(peft_data *d) {
    for (int l = 0; l < 5; l++)
        for (int p = 0; p < LP_PROJ_COUNT; p++) {
            free(d->A[l][p]);
            free(d->B[l][p]);
        }
}

/* up_proj is stored as F16 and down_proj as BF16, the rest F32. */
static void write_peft(const char *dir, const peft_data *d, const peft_opts *o) {
    char path[512];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    FILE *f = fopen(path, "w");
    fputs(o->config ? o->config : good_config, f);
    fclose(f);
    lp_st_writer *w = lp_st_writer_create();
    uint16_t *halfs[5][LP_PROJ_COUNT][2] = {{{0}}};
    static const float nan_block[4] = {0, NAN, 0, 0};
    static const int32_t ints[4 * 64] = {0};
    for (int l = 0; l < 5; l++)
        for (int p = 0; p < LP_PROJ_COUNT; p++) {
            int r = d->rank[l][p];
            for (int half = 0; half < 2; half++) {
                char name[160];
                snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_%c.%sweight",
                         l, hf_mod[p], half ? 'B' : 'A', o->default_segment ? "default." : "");
                uint64_t shape[2] = {half ? (uint64_t)d->out[p] : (uint64_t)r,
                                     half ? (uint64_t)r : (uint64_t)d->in[p]};
                const float *src = half ? d->B[l][p] : d->A[l][p];
                size_t n = shape[0] * shape[1];
                if (half && o->drop_b_l1_v && l == 1 && p == LP_PROJ_V) continue;
                if (!half && o->bad_shape_l0_q && l == 0 && p == LP_PROJ_Q) shape[1] = 63, n = shape[0] * 63;
                if (!half && o->int_dtype && l == 0 && p == LP_PROJ_GATE) {
                    lp_st_writer_add(w, name, LP_ST_I32, 2, shape, ints, n * 4);
                    continue;
                }
                if (half && o->nan_l2_o && l == 2 && p == LP_PROJ_O) {
                    float *copy = malloc(n * 4);
                    memcpy(copy, src, n * 4);
                    memcpy(copy, nan_block, sizeof nan_block);
                    halfs[l][p][half] = (uint16_t *)copy;
                    lp_st_writer_add(w, name, LP_ST_F32, 2, shape, copy, n * 4);
                } else if (p == LP_PROJ_UP || p == LP_PROJ_DOWN) {
                    uint16_t *h = malloc(n * 2);
                    for (size_t i = 0; i < n; i++)
                        h[i] = p == LP_PROJ_UP ? lp_f32_to_f16(src[i]) : lp_f32_to_bf16(src[i]);
                    halfs[l][p][half] = h;
                    lp_st_writer_add(w, name, p == LP_PROJ_UP ? LP_ST_F16 : LP_ST_BF16, 2, shape, h, n * 2);
                } else {
                    lp_st_writer_add(w, name, LP_ST_F32, 2, shape, src, n * 4);
                }
            }
        }
    static const float l7[4 * 64] = {0};
    if (o->extra_layer) {
        uint64_t sa[2] = {4, 64};
        lp_st_writer_add(w, "base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight",
                         LP_ST_F32, 2, sa, l7, sizeof l7);
        lp_st_writer_add(w, "base_model.model.model.layers.7.self_attn.q_proj.lora_B.weight",
                         LP_ST_F32, 2, sa, l7, sizeof l7);
    }
    static const float embed[4 * 512] = {0};
    if (o->extra_embed) {
        uint64_t shape[2] = {4, 512};
        lp_st_writer_add(w, "base_model.model.model.embed_tokens.lora_embedding_A", LP_ST_F32, 2,
                         shape, embed, sizeof embed);
    }
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    lp_error err;
    if (lp_st_writer_write(w, path, &err)) fprintf(stderr, "write: %s\n", err.message);
    lp_st_writer_free(w);
    for (int l = 0; l < 5; l++)
        for (int p = 0; p < LP_PROJ_COUNT; p++) {
            free(halfs[l][p][0]);
            free(halfs[l][p][1]);
        }
}

/* Expect a load failure whose message contains `needle`. */
static void expect_reject(const lp_model *base, const char *dir, const peft_data *d,
                          const peft_opts *o, const char *needle) {
    write_peft(dir, d, o);
    lp_error err = {0};
    lp_adapter *a = lp_adapter_load(base, dir, 1.0f, &err);
    CHECK_MSG(a == NULL && contains(&err, needle), "wanted \"%s\", got \"%s\"", needle,
              a ? "(loaded)" : err.message);
    lp_adapter_free(a);
}

static void test_peft(const lp_model *base, const char *dir, peft_data *d) {
    peft_opts o = {0};
    write_peft(dir, d, &o);
    lp_error err = {0};
    lp_adapter *a = lp_adapter_load(base, dir, 1.0f, &err);
    CHECK_MSG(a != NULL, "%s", err.message);
    if (!a) return;
    CHECK(!strcmp(a->format, "peft") && !strcmp(a->base_name, "karpathy/stories260K"));
    CHECK(a->max_rank == 8);
    bool ranks_ok = true, scales_ok = true, a_ok = true, b_ok = true;
    const int d_head = 8;
    for (int l = 0; l < 5; l++)
        for (int p = 0; p < LP_PROJ_COUNT; p++) {
            const lp_lora_pair *pr = pair_of(a, l, (lp_proj)p);
            int r = d->rank[l][p];
            ranks_ok &= pr->rank == r;
            float want_scale = (p == LP_PROJ_V ? 16.0f : 8.0f) / (float)r;
            scales_ok &= pr->scale == want_scale;
            /* F16 stays F16; BF16 becomes F32 */
            a_ok &= pr->A.type == (p == LP_PROJ_UP ? LP_F16 : LP_F32);
            double tol = p == LP_PROJ_UP ? 1e-3 : p == LP_PROJ_DOWN ? 1e-2 : 0;
            for (int64_t i = 0; i < r * d->in[p]; i++)
                a_ok &= fabs(elem(&pr->A, i / d->in[p], i % d->in[p]) - d->A[l][p][i]) <= tol;
            for (int64_t row = 0; row < d->out[p]; row++) {
                /* the base is a GGUF llama (interleaved rotary pairs): HF row
                 * s*d/2 + i of each q/k head is row 2i + s */
                int64_t src = row;
                if (p == LP_PROJ_Q || p == LP_PROJ_K) {
                    int64_t h = row / d_head, j = row % d_head;
                    src = h * d_head + (j % 2) * (d_head / 2) + j / 2;
                }
                for (int k = 0; k < r; k++)
                    b_ok &= fabs(elem(&pr->B, row, k) - d->B[l][p][src * r + k]) <= tol;
            }
        }
    CHECK(ranks_ok);
    CHECK(scales_ok);
    CHECK(a_ok);
    CHECK(b_ok);
    /* explicitly: q row 1 of head 0 is HF row 4 (d/2 + 0) */
    const lp_lora_pair *q0 = pair_of(a, 0, LP_PROJ_Q);
    CHECK(elem(&q0->B, 1, 0) == d->B[0][0][4 * 4] && elem(&q0->B, 2, 3) == d->B[0][0][1 * 4 + 3]);

    /* (d) .lpa round trip */
    char lpa[600];
    snprintf(lpa, sizeof lpa, "%s/a.lpa", dir);
    CHECK_MSG(lp_adapter_write_lpa(a, lpa, -1, &err) == 0, "%s", err.message);
    lp_adapter *b = lp_adapter_load(base, lpa, 1.0f, &err);
    CHECK_MSG(b != NULL, "%s", err.message);
    if (b) {
        bool same = !strcmp(b->format, "lpa") && !strcmp(b->name, a->name) &&
                    !strcmp(b->base_name, a->base_name) && b->bytes == a->bytes;
        for (int i = 0; i < 35; i++) {
            const lp_lora_pair *x = &a->pairs[i], *y = &b->pairs[i];
            same &= x->rank == y->rank && x->scale == y->scale && x->A.type == y->A.type &&
                    x->B.type == y->B.type && x->A.rows == y->A.rows && x->A.cols == y->A.cols &&
                    x->B.rows == y->B.rows && x->B.cols == y->B.cols &&
                    !memcmp(x->A.data, y->A.data, x->A.row_bytes * (size_t)x->A.rows) &&
                    !memcmp(x->B.data, y->B.data, x->B.row_bytes * (size_t)x->B.rows) &&
                    (uintptr_t)y->A.data % 64 == 0 && (uintptr_t)y->B.data % 64 == 0;
        }
        CHECK(same);
        lp_adapter_free(b);
    }
    /* (e) GGUF LoRA round trip: every pair's A and scale x B come back */
    char gg[600];
    snprintf(gg, sizeof gg, "%s/a.gguf", dir);
    CHECK_MSG(lp_adapter_write_gguf(a, gg, -1, &err) == 0, "%s", err.message);
    b = lp_adapter_load(base, gg, 1.0f, &err);
    CHECK_MSG(b != NULL, "%s", err.message);
    if (b) {
        bool same = !strcmp(b->format, "gguf") && b->n_pairs == a->n_pairs && !strcmp(b->name, a->name);
        double worst = 0;
        for (int i = 0; same && i < a->n_pairs; i++) {
            const lp_lora_pair *x = &a->pairs[i], *y = &b->pairs[i];
            same &= x->weight == y->weight && x->rank == y->rank && x->A.rows == y->A.rows &&
                    x->A.cols == y->A.cols && x->B.rows == y->B.rows;
            for (int64_t r = 0; same && r < x->A.rows; r++)
                for (int64_t c = 0; c < x->A.cols; c++) same &= elem(&x->A, r, c) == elem(&y->A, r, c);
            for (int64_t r = 0; same && r < x->B.rows; r++)
                for (int64_t c = 0; c < x->rank; c++) {
                    double u = (double)x->scale * elem(&x->B, r, c), v = (double)y->scale * elem(&y->B, r, c);
                    double e = fabs(u - v) / (fabs(u) + 1e-30);
                    if (u != v && e > worst) worst = e;
                }
        }
        CHECK_MSG(same && worst < 1e-6, "same %d, worst relative error of scale x B %g", same, worst);
        lp_adapter_free(b);
    }
    /* llama.cpp reads no integer LoRA */
    CHECK(lp_adapter_write_gguf(a, gg, LP_W8, &err) == -1 && contains(&err, "f32 or f16"));
    /* --scale and dtype conversion */
    CHECK(lp_adapter_write_lpa(a, lpa, LP_F32, &err) == 0);
    b = lp_adapter_load(base, lpa, 2.0f, &err);
    CHECK(b && pair_of(b, 0, LP_PROJ_UP)->A.type == LP_F32 &&
          pair_of(b, 4, LP_PROJ_Q)->scale == 4.0f);
    lp_adapter_free(b);
    /* inspect without a base */
    b = lp_adapter_inspect(lpa, &err);
    CHECK(b && b->base == NULL && b->n_pairs == 35 && b->max_rank == 8);
    lp_adapter_free(b);
    b = lp_adapter_inspect(dir, &err);
    bool k1 = false; /* without a base, pairs are found by name */
    for (int i = 0; b && i < b->n_pairs; i++)
        k1 |= !strcmp(b->pairs[i].name, "model.layers.1.self_attn.k_proj") && b->pairs[i].rank == 8;
    CHECK_MSG(b && b->n_pairs == 35 && k1, "%s", err.message);
    lp_adapter_free(b);

    /* .lpa on other bases: another shape, and the same shape with other weights */
    lp_model *l3 = lp_model_load(MODELS "/arch/llama3-tiny-random.gguf", NULL, &err);
    if (l3) {
        CHECK(lp_adapter_load(l3, lpa, 1.0f, &err) == NULL);
        CHECK_MSG(contains(&err, "another shape"), "%s", err.message);
        lp_model_free(l3);
    }
    lp_gguf *g = lp_gguf_open(base_path, &err);
    lp_gguf_writer *w = lp_gguf_writer_create();
    for (size_t i = 0; i < lp_gguf_kv_count(g); i++) lp_gguf_writer_copy_kv(w, lp_gguf_kv_at(g, i));
    for (size_t i = 0; i < lp_gguf_tensor_count(g); i++) {
        const lp_gguf_tensor *t = lp_gguf_tensor_at(g, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        if (!strcmp(name, "blk.0.attn_q.weight")) {
            float *copy = malloc(t->n_bytes);
            memcpy(copy, t->data, t->n_bytes);
            copy[0] += 1.0f;
            lp_gguf_writer_add_tensor_copy(w, name, t->type, t->n_dims, t->dims, copy, t->n_bytes);
            free(copy);
        } else {
            lp_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->dims, t->data, t->n_bytes);
        }
    }
    char other[600];
    snprintf(other, sizeof other, "%s/other.gguf", dir);
    CHECK(lp_gguf_writer_write(w, other, &err) == 0);
    lp_gguf_writer_free(w);
    lp_gguf_close(g);
    lp_model *om = lp_model_load(other, NULL, &err);
    CHECK_MSG(om != NULL, "%s", err.message);
    if (om) {
        CHECK(lp_model_fingerprint(om) != lp_model_fingerprint(base));
        CHECK(lp_adapter_load(om, lpa, 1.0f, &err) == NULL);
        CHECK_MSG(contains(&err, "fingerprint"), "%s", err.message);
        lp_model_free(om);
    }
    remove(other);
    remove(lpa);
    remove(gg);
    lp_adapter_free(a);

    /* rsLoRA: alpha / sqrt(r) */
    o.config = "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"use_rslora\": true,"
               " \"target_modules\": \"q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj\","
               " \"rank_pattern\": {\"k_proj\": 8, \"model.layers.2.mlp.down_proj\": 8}}";
    o.default_segment = true;
    write_peft(dir, d, &o);
    a = lp_adapter_load(base, dir, 1.0f, &err);
    CHECK_MSG(a != NULL, "%s", err.message);
    if (a) {
        CHECK_NEAR(pair_of(a, 0, LP_PROJ_Q)->scale, 4.0, 1e-6);
        CHECK_NEAR(pair_of(a, 0, LP_PROJ_K)->scale, 8.0 / sqrt(8.0), 1e-6);
        lp_adapter_free(a);
    }

    /* rejections */
    peft_opts r = {0};
    r.config = "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"use_dora\": true}";
    expect_reject(base, dir, d, &r, "use_dora");
    r.config = "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"modules_to_save\": [\"lm_head\"]}";
    expect_reject(base, dir, d, &r, "modules_to_save");
    r.config = "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\", \"embed_tokens\"]}";
    expect_reject(base, dir, d, &r, "\"embed_tokens\" is not supported");
    r.config = "{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": \".*(embed_tokens|q_proj)\"}";
    expect_reject(base, dir, d, &r, "model.embed_tokens");
    r.config = "{\"peft_type\": \"PREFIX_TUNING\", \"r\": 4}";
    expect_reject(base, dir, d, &r, "peft_type \"PREFIX_TUNING\"");
    r.config = "{\"peft_type\": \"LORA\", \"r\": 4, \"bias\": \"all\"}";
    expect_reject(base, dir, d, &r, "bias \"all\"");
    r.config = "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8}";  /* no rank_pattern */
    expect_reject(base, dir, d, &r, "r = 4");
    r = (peft_opts){.extra_embed = true};
    expect_reject(base, dir, d, &r, "embed_tokens");
    r = (peft_opts){.bad_shape_l0_q = true};
    expect_reject(base, dir, d, &r,
                  "'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' has shape "
                  "[4, 63], expected [4, 64]");
    r = (peft_opts){.drop_b_l1_v = true};
    expect_reject(base, dir, d, &r, "model.layers.1.self_attn.v_proj has 'base_model.model.model.layers.1.self_attn."
                                    "v_proj.lora_A.weight' but no matching lora_B");
    r = (peft_opts){.nan_l2_o = true};
    expect_reject(base, dir, d, &r, "layers.2.self_attn.o_proj.lora_B.weight' has a non-finite");
    r = (peft_opts){.int_dtype = true};
    expect_reject(base, dir, d, &r, "dtype I32");
    r = (peft_opts){.extra_layer = true};
    expect_reject(base, dir, d, &r, "is for 'model.layers.7.self_attn.q_proj', which is not an adaptable weight");
}

/* ---- (d) corruption of a small .lpa ------------------------------------------------ */

static void test_lpa_corruption(const lp_model *base, const char *dir) {
    const lp_hparams *hp = &base->hp;
    lp_lpa_base b = {
        .fingerprint = lp_model_fingerprint(base), .arch = hp->arch,
        .flags = hp->rope_neox ? 0 : LP_LPA_FLAG_INTERLEAVED, .n_layers = (uint32_t)hp->n_layers,
        .dim = (uint32_t)hp->dim, .n_heads = (uint32_t)hp->n_heads,
        .n_kv_heads = (uint32_t)hp->n_kv_heads, .head_dim = (uint32_t)hp->head_dim,
        .ffn_dim = (uint32_t)hp->ffn_dim, .n_vocab = (uint32_t)hp->n_vocab};
    static float qa[64], qb[64], da[172], db[64];
    for (int i = 0; i < 64; i++) qa[i] = qb[i] = db[i] = (float)i / 64.0f;
    for (int i = 0; i < 172; i++) da[i] = (float)i / 172.0f;
    lp_lpa_entry es[2] = {
        {.tensor = "blk.4.ffn_down.weight", .in = 172, .out = 64, .rank = 1, .dtype = LP_F32, .scale = 0.5f,
         .a = da, .b = db},
        {.tensor = "blk.0.attn_q.weight", .in = 64, .out = 64, .rank = 1, .dtype = LP_F32, .scale = 2.0f,
         .a = qa, .b = qb},
    };
    char path[600];
    snprintf(path, sizeof path, "%s/small.lpa", dir);
    lp_error err = {0};
    CHECK_MSG(lp_lpa_write(path, &b, "small", "", es, 2, &err) == 0, "%s", err.message);
    char *text;
    size_t size;
    CHECK(lp_read_file(path, &text, &size, 1 << 20, &err) == 0);
    remove(path);
    uint8_t *buf = lp_alloc(size + 64);
    memcpy(buf, text, size);
    free(text);
    lp_adapter *a = lp_adapter_load_lpa_memory(base, buf, size, "small.lpa", 1.0f, &err);
    CHECK_MSG(a != NULL, "%s", err.message);
    if (a) {
        CHECK(pair_of(a, 0, LP_PROJ_Q)->rank == 1 && pair_of(a, 0, LP_PROJ_Q)->scale == 2.0f);
        CHECK(pair_of(a, 4, LP_PROJ_DOWN)->A.cols == 172);
        CHECK(pair_of(a, 1, LP_PROJ_Q)->rank == 0);
        lp_adapter_free(a);
    }
    int accepted = 0;
    for (size_t n = 0; n < size; n++) {
        lp_adapter *t = lp_adapter_load_lpa_memory(base, buf, n, "cut.lpa", 1.0f, &err);
        accepted += t != NULL;
        lp_adapter_free(t);
    }
    CHECK_MSG(accepted == 0, "%d truncations accepted", accepted);
    for (size_t i = 0; i < size; i++)
        for (int bit = 0; bit < 8; bit += 7) {
            buf[i] ^= (uint8_t)(1u << bit);
            lp_adapter *t = lp_adapter_load_lpa_memory(base, buf, size, "flip.lpa", 1.0f, &err);
            accepted += t != NULL;
            lp_adapter_free(t);
            buf[i] ^= (uint8_t)(1u << bit);
        }
    CHECK_MSG(accepted == 0, "%d byte flips accepted", accepted);
    lp_free(buf);
}

/* ---- (e) .lpa version 1 is still read, as version 2 names it ----------------------- */

static void test_lpa_v1(void) {
    const char *v1 = LP_SOURCE_DIR "/fuzz/seeds/fuzz_adapter/packed.lpa";
    const char *v2 = LP_SOURCE_DIR "/fuzz/seeds/fuzz_adapter/packed-v2.lpa";
    lp_error err = {0};
    lp_adapter *a = lp_adapter_inspect(v1, &err);
    CHECK_MSG(a != NULL, "%s", err.message);
    lp_adapter *b = lp_adapter_inspect(v2, &err);
    CHECK_MSG(b != NULL, "%s", err.message);
    if (!a || !b) {
        lp_adapter_free(a);
        lp_adapter_free(b);
        return;
    }
    /* v1 lists (layer, projection) order, v2 name order: match by name */
    CHECK(a->n_pairs == 3 && b->n_pairs == 3);
    int same = 0;
    for (int i = 0; i < a->n_pairs; i++)
        for (int j = 0; j < b->n_pairs; j++) {
            const lp_lora_pair *x = &a->pairs[i], *y = &b->pairs[j];
            if (strcmp(x->name, y->name)) continue;
            same += x->rank == y->rank && x->scale == y->scale && x->A.type == y->A.type &&
                    x->A.rows == y->A.rows && x->A.cols == y->A.cols && x->B.rows == y->B.rows &&
                    x->B.cols == y->B.cols;
        }
    CHECK_MSG(same == 3, "%d of 3 pairs match", same);
    bool names = false;
    for (int i = 0; i < a->n_pairs; i++) names |= !strcmp(a->pairs[i].name, "blk.1.ffn_down.weight");
    CHECK(names && a->pairs[0].A.type == LP_W8);
    lp_adapter_free(a);
    lp_adapter_free(b);
}

int main(void) {
    lp_error err = {0};
    lp_model *base = lp_model_load(base_path, NULL, &err);
    CHECK_MSG(base != NULL, "%s", err.message);
    if (!base) return check_summary("adapter");
    test_gguf_lora(base);
    char dir[] = "/tmp/lp_test_peft_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    peft_data d;
    make_peft_data(&d);
    test_peft(base, dir, &d);
    test_lpa_corruption(base, dir);
    test_lpa_v1();
    free_peft_data(&d);
    char path[600];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    remove(path);
    rmdir(dir);
    lp_model_free(base);
    return check_summary("adapter");
}
