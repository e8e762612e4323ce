/* SD 1.x LoRA adapters as runtime inputs (src/image/sd_lora.c, sd_graph.c):
 *   - the targets table: SD 1.5's checkpoint names against their diffusers
 *     names (hand-written pairs from the published conversion), all unique;
 *   - the three real third-party files in shared/models/sd load with every
 *     key mapped (counts, ranks, tokens, values against the file; the
 *     cloneofsimo order shown by its GEGLU shapes); a Kohya file derived
 *     from the diffusers one by renaming keys gives the same deltas;
 *   - bad files are rejected naming the key at fault;
 *   - on a random sd-tiny: text encoder and UNet step with an adapter as a
 *     runtime input equal the merged weights W + s up down (linears, 1x1 and
 *     3x3 convs, in every format); a batch whose rows use different adapters
 *     (or none) equals each row alone, bit for bit; a textual-inversion
 *     token reads its embedding. Fails, never skips, when a file is missing. */
#include "check.h"
#include "formats/safetensors.h"
#include "image/sd.h"
#include "image/sd_graph.h"
#include "image/sd_lora.h"
#include "image/sd_pipeline.h"
#include "tools/sd_lora_synth.h"
#include "tools/sd_synth.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SD_DIR LP_SHARED_MODELS "/sd/"

/* ---- the targets table -------------------------------------------------------------------------------- */

static void test_targets(void) {
    lp_sd_config c = lp_sd_config_sd15();
    lp_sd_targets t;
    lp_error err = {0};
    CHECK(lp_sd_targets_build(&c, &t, &err) == 0);
    static const char *const pairs[][2] = {
        {"model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn1.to_q", "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"},
        {"model.diffusion_model.input_blocks.7.1.proj_in", "down_blocks.2.attentions.0.proj_in"},
        {"model.diffusion_model.input_blocks.3.0.op", "down_blocks.0.downsamplers.0.conv"},
        {"model.diffusion_model.input_blocks.4.0.skip_connection", "down_blocks.1.resnets.0.conv_shortcut"},
        {"model.diffusion_model.input_blocks.11.0.in_layers.2", "down_blocks.3.resnets.1.conv1"},
        {"model.diffusion_model.middle_block.2.out_layers.3", "mid_block.resnets.1.conv2"},
        {"model.diffusion_model.middle_block.1.transformer_blocks.0.attn2.to_k", "mid_block.attentions.0.transformer_blocks.0.attn2.to_k"},
        {"model.diffusion_model.output_blocks.2.1.conv", "up_blocks.0.upsamplers.0.conv"},
        {"model.diffusion_model.output_blocks.5.2.conv", "up_blocks.1.upsamplers.0.conv"},
        {"model.diffusion_model.output_blocks.8.0.skip_connection", "up_blocks.2.resnets.2.conv_shortcut"},
        {"model.diffusion_model.output_blocks.11.1.transformer_blocks.0.ff.net.2", "up_blocks.3.attentions.2.transformer_blocks.0.ff.net.2"},
        {"model.diffusion_model.output_blocks.3.0.emb_layers.1", "up_blocks.1.resnets.0.time_emb_proj"},
        {"model.diffusion_model.time_embed.0", "time_embedding.linear_1"},
        {"model.diffusion_model.input_blocks.0.0", "conv_in"},
        {"model.diffusion_model.out.2", "conv_out"},
        {"cond_stage_model.transformer.text_model.encoder.layers.11.mlp.fc2", "text_model.encoder.layers.11.mlp.fc2"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        int32_t k = lp_sd_target_find(&t, pairs[i][0]);
        CHECK_MSG(k >= 0 && !strcmp(t.t[k].diffusers, pairs[i][1]), "%s -> %s", pairs[i][0], k >= 0 ? t.t[k].diffusers : "none");
    }
    bool unique = true;
    for (int32_t i = 0; i < t.n; i++)
        for (int32_t j = i + 1; j < t.n; j++)
            if (t.t[i].part == t.t[j].part && !strcmp(t.t[i].diffusers, t.t[j].diffusers)) unique = false;
    CHECK(unique);
    /* 12 layers x 6 linears; UNet: 16 transformers x 12 modules, 22 ResBlocks x 3 (+ 14 shortcuts), 3 down,
     * 3 up, conv in/out, 2 time linears */
    int32_t te = 0, unet = 0;
    for (int32_t i = 0; i < t.n; i++) *(t.t[i].part == LP_SD_PART_TE ? &te : &unet) += 1;
    CHECK_MSG(te == 72, "%d", te);
    CHECK_MSG(unet == 16 * 12 + 22 * 3 + 14 + 3 + 3 + 2 + 2, "%d", unet);
    lp_sd_targets_free(&t);
}

/* ---- the real files ------------------------------------------------------------------------------------- */

static float first_value(const char *path, const char *key) {
    lp_error err = {0};
    lp_safetensors *st = lp_safetensors_open(path, &err);
    const lp_st_tensor *t = st ? lp_safetensors_find(st, key) : NULL;
    float *v = t ? malloc(sizeof(float) * t->n_elements) : NULL;
    float r = NAN;
    if (v && !lp_st_to_f32(t, v, &err)) r = v[0];
    free(v);
    lp_safetensors_close(st);
    return r;
}

static int32_t target_of(const char *ldm) {
    lp_sd_config c = lp_sd_config_sd15();
    lp_sd_targets t;
    lp_error err = {0};
    if (lp_sd_targets_build(&c, &t, &err)) return -1;
    int32_t k = lp_sd_target_find(&t, ldm);
    lp_sd_targets_free(&t);
    return k;
}

/* renames the diffusers processor file's keys to Kohya's (alpha = rank * alpha_x) */
static int write_kohya_from_diffusers(const char *src, const char *dst, float alpha_x) {
    lp_error err = {0};
    lp_safetensors *st = lp_safetensors_open(src, &err);
    if (!st) return -1;
    lp_st_writer *w = lp_st_writer_create();
    size_t n = lp_safetensors_count(st);
    float *alphas = calloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++) {
        const lp_st_tensor *t = lp_safetensors_at(st, i);
        char name[320], m[256];
        const char *p = strstr(t->name, ".processor.");
        const char *q = p + 11, *lora = strstr(q, "_lora.");
        bool down = !strcmp(lora + 6, "down.weight");
        /* diffusers' to_out_lora adapts to_out.0 */
        snprintf(m, sizeof m, "%.*s.%.*s%s", (int)(p - t->name), t->name, (int)(lora - q), q,
                 !strncmp(q, "to_out_lora", 11) ? ".0" : "");
        for (char *c = m; *c; c++)
            if (*c == '.') *c = '_';
        snprintf(name, sizeof name, "lora_unet_%s.%s", m, down ? "lora_down.weight" : "lora_up.weight");
        lp_st_writer_add(w, name, t->dtype, t->n_dims, t->shape, t->data, t->n_bytes);
        if (down) {
            alphas[i] = (float)t->shape[0] * alpha_x;
            snprintf(name, sizeof name, "lora_unet_%s.alpha", m);
            lp_st_writer_add(w, name, LP_ST_F32, 0, NULL, &alphas[i], sizeof(float));
        }
    }
    int rc = lp_st_writer_write(w, dst, &err);
    lp_st_writer_free(w);
    free(alphas);
    lp_safetensors_close(st);
    return rc;
}

static void test_real_files(void) {
    lp_sd_config c = lp_sd_config_sd15();
    lp_error err = {0};
    const char *dpath = SD_DIR "sd15-lora-diffusers-r4.safetensors";
    lp_sd_lora *d = lp_sd_lora_load(dpath, &c, &err);
    CHECK_MSG(d != NULL, "%s", err.message);
    if (d) {
        CHECK(!strcmp(lp_sd_lora_format(d), "diffusers"));
        CHECK(lp_sd_lora_count(d, LP_SD_PART_UNET) == 128 && lp_sd_lora_count(d, LP_SD_PART_TE) == 0);
        CHECK(lp_sd_lora_max_rank(d) == 4);
        const lp_sd_delta *q = lp_sd_lora_delta(d, target_of("model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn1.to_q"));
        CHECK(q && q->rank == 4 && q->scale == 1.0f);
        CHECK(q && q->down[0] == first_value(dpath, "down_blocks.0.attentions.0.transformer_blocks.0.attn1.processor.to_q_lora.down.weight"));
        const lp_sd_delta *o = lp_sd_lora_delta(d, target_of("model.diffusion_model.output_blocks.11.1.transformer_blocks.0.attn2.to_out.0"));
        CHECK(o && o->up[0] == first_value(dpath, "up_blocks.3.attentions.2.transformer_blocks.0.attn2.processor.to_out_lora.up.weight"));
        /* the same adapter renamed to Kohya's keys, alpha = rank, then alpha = rank / 2 */
        char kpath[] = "/tmp/lp_sd_lora_kohya_XXXXXX";
        int fd = mkstemp(kpath);
        close(fd);
        for (int half = 0; half < 2; half++) {
            CHECK(write_kohya_from_diffusers(dpath, kpath, half ? 0.5f : 1.0f) == 0);
            lp_sd_lora *k = lp_sd_lora_load(kpath, &c, &err);
            CHECK_MSG(k != NULL, "%s", err.message);
            if (!k) continue;
            CHECK(!strcmp(lp_sd_lora_format(k), "kohya") && lp_sd_lora_count(k, -1) == 128);
            bool same = true;
            lp_sd_targets t;
            lp_sd_targets_build(&c, &t, &err);
            for (int32_t i = 0; i < t.n; i++) {
                const lp_sd_delta *a = lp_sd_lora_delta(d, i), *b = lp_sd_lora_delta(k, i);
                if (!a != !b) same = false;
                if (!a || !b) continue;
                int64_t n = (int64_t)a->rank * (t.t[i].in + t.t[i].out);
                if (a->rank != b->rank || memcmp(a->down, b->down, sizeof(float) * (size_t)n) ||
                    b->scale != (half ? 0.5f : 1.0f))
                    same = false;
            }
            CHECK(same);
            lp_sd_targets_free(&t);
            lp_sd_lora_free(k);
        }
        unlink(kpath);
    }
    lp_sd_lora_free(d);

    static const char *const clones[] = {"sd15-lora-cloneofsimo-disney-r1.safetensors", "sd15-lora-cloneofsimo-analog-r4.safetensors"};
    for (int f = 0; f < 2; f++) {
        char path[512];
        snprintf(path, sizeof path, SD_DIR "%s", clones[f]);
        lp_sd_lora *l = lp_sd_lora_load(path, &c, &err);
        CHECK_MSG(l != NULL, "%s", err.message);
        if (!l) continue;
        int rank = f ? 4 : 1;
        CHECK(!strcmp(lp_sd_lora_format(l), "cloneofsimo"));
        CHECK(lp_sd_lora_count(l, LP_SD_PART_UNET) == 144 && lp_sd_lora_count(l, LP_SD_PART_TE) == 48);
        CHECK(lp_sd_lora_max_rank(l) == rank);
        CHECK(lp_sd_lora_n_tokens(l) == (f ? 0 : 2));
        if (!f) {
            CHECK(lp_sd_lora_token(l, 0) && lp_sd_lora_token(l, 1) &&
                  ((!strcmp(lp_sd_lora_token(l, 0), "<s1>") && !strcmp(lp_sd_lora_token(l, 1), "<s2>")) ||
                   (!strcmp(lp_sd_lora_token(l, 0), "<s2>") && !strcmp(lp_sd_lora_token(l, 1), "<s1>"))));
            CHECK(lp_sd_lora_token_embedding(l, 0)[0] == first_value(path, lp_sd_lora_token(l, 0)));
        }
        /* index 4 is the first block's GEGLU projection (320 -> 2560): the 2022 diffusers order */
        const lp_sd_delta *g = lp_sd_lora_delta(l, target_of("model.diffusion_model.input_blocks.1.1.transformer_blocks.0.ff.net.0.proj"));
        CHECK(g && g->rank == rank && g->up[0] == first_value(path, "unet:4:up"));
        /* 135..143: the middle block, last */
        const lp_sd_delta *m = lp_sd_lora_delta(l, target_of("model.diffusion_model.middle_block.1.transformer_blocks.0.attn2.to_out.0"));
        CHECK(m && m->down[0] == first_value(path, "unet:143:down"));
        /* the text encoder: k, v, q, out per layer */
        const lp_sd_delta *k = lp_sd_lora_delta(l, target_of("cond_stage_model.transformer.text_model.encoder.layers.0.self_attn.k_proj"));
        const lp_sd_delta *q = lp_sd_lora_delta(l, target_of("cond_stage_model.transformer.text_model.encoder.layers.0.self_attn.q_proj"));
        CHECK(k && k->down[0] == first_value(path, "text_encoder:0:down"));
        CHECK(q && q->down[0] == first_value(path, "text_encoder:2:down"));
        lp_sd_lora_free(l);
    }
}

/* ---- bad files --------------------------------------------------------------------------------------------- */

static void expect_reject(const char *what, lp_st_writer *w, const char *needle, const char *meta_key,
                          const char *meta_value) {
    char path[] = "/tmp/lp_sd_lora_bad_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    if (meta_key) lp_st_writer_set_metadata(w, meta_key, meta_value);
    lp_error err = {0};
    CHECK(lp_st_writer_write(w, path, &err) == 0);
    lp_sd_config c = lp_sd_config_tiny();
    lp_sd_lora *l = lp_sd_lora_load(path, &c, &err);
    CHECK_MSG(l == NULL && strstr(err.message, needle) && strstr(err.message, path), "%s: %s", what, err.message);
    lp_sd_lora_free(l);
    lp_st_writer_free(w);
    unlink(path);
}

static void test_bad_files(void) {
    static float z[4096];
    const char *k = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q";
    char a[200], b[200];
    snprintf(a, sizeof a, "%s.lora_down.weight", k);
    snprintf(b, sizeof b, "%s.lora_up.weight", k);
    lp_st_writer *w = lp_st_writer_create();
    lp_st_writer_add(w, a, LP_ST_F32, 2, (uint64_t[]){4, 32}, z, 4 * 32 * 4);
    lp_st_writer_add(w, b, LP_ST_F32, 2, (uint64_t[]){32, 4}, z, 4 * 32 * 4);
    lp_st_writer_add(w, "lora_unet_down_blocks_9_nothing.lora_down.weight", LP_ST_F32, 2, (uint64_t[]){4, 32}, z, 512);
    expect_reject("unmapped", w, "lora_unet_down_blocks_9_nothing.lora_down.weight", NULL, NULL);

    w = lp_st_writer_create();
    lp_st_writer_add(w, a, LP_ST_F32, 2, (uint64_t[]){4, 32}, z, 512);
    expect_reject("no up", w, "no matching up", NULL, NULL);

    w = lp_st_writer_create();
    lp_st_writer_add(w, a, LP_ST_F32, 2, (uint64_t[]){4, 31}, z, 4 * 31 * 4);
    lp_st_writer_add(w, b, LP_ST_F32, 2, (uint64_t[]){32, 4}, z, 512);
    expect_reject("shape", w, "shape does not fit", NULL, NULL);

    w = lp_st_writer_create();
    lp_st_writer_add(w, a, LP_ST_F32, 2, (uint64_t[]){4, 32}, z, 512);
    lp_st_writer_add(w, b, LP_ST_F32, 2, (uint64_t[]){32, 5}, z, 32 * 5 * 4);
    expect_reject("up shape", w, "is not [32][4]", NULL, NULL);

    w = lp_st_writer_create();
    lp_st_writer_add(w, a, LP_ST_I32, 2, (uint64_t[]){4, 32}, z, 512);
    lp_st_writer_add(w, b, LP_ST_F32, 2, (uint64_t[]){32, 4}, z, 512);
    expect_reject("dtype", w, "dtype I32", NULL, NULL);

    w = lp_st_writer_create();
    snprintf(a, sizeof a, "%s.hada_w1_a", k);
    lp_st_writer_add(w, a, LP_ST_F32, 2, (uint64_t[]){4, 32}, z, 512);
    expect_reject("LoHa", w, "LoHa is not supported", NULL, NULL);

    w = lp_st_writer_create();
    lp_st_writer_add(w, "some.random.tensor", LP_ST_F32, 1, (uint64_t[]){4}, z, 16);
    expect_reject("foreign", w, "'some.random.tensor' is in no LoRA format", NULL, NULL);

    w = lp_st_writer_create();
    lp_st_writer_add(w, "unet:0:down", LP_ST_F32, 2, (uint64_t[]){4, 32}, z, 512);
    lp_st_writer_add(w, "unet:0:up", LP_ST_F32, 2, (uint64_t[]){32, 4}, z, 512);
    expect_reject("clone classes", w, "target class 'ResnetBlock2D' is not supported", "unet", "[\"ResnetBlock2D\"]");

    w = lp_st_writer_create();
    lp_st_writer_add(w, "unet:99:down", LP_ST_F32, 2, (uint64_t[]){4, 32}, z, 512);
    expect_reject("clone index", w, "index 99", "unet", "[\"CrossAttention\"]");

    w = lp_st_writer_create();
    expect_reject("empty", w, "no LoRA tensors", NULL, NULL);
}

/* ---- runtime input == merged weights, on sd-tiny ------------------------------------------------------------- */

/* the checkpoint with W + s up down on every target the adapter has (and token row `tok_row` replaced by
 * the adapter's first token embedding, when tok_row >= 0) */
static int write_merged(const char *base, const lp_sd_lora *l, float s, int tok_row, const char *out) {
    lp_error err = {0};
    lp_safetensors *st = lp_safetensors_open(base, &err);
    if (!st) return -1;
    lp_sd_config c = lp_sd_config_tiny();
    lp_sd_targets tg;
    lp_sd_targets_build(&c, &tg, &err);
    lp_st_writer *w = lp_st_writer_create();
    size_t n = lp_safetensors_count(st);
    float **bufs = calloc(n, sizeof *bufs);
    for (size_t i = 0; i < n; i++) {
        const lp_st_tensor *t = lp_safetensors_at(st, i);
        float *v = bufs[i] = malloc(sizeof(float) * t->n_elements);
        lp_st_to_f32(t, v, &err);
        char stem[160];
        size_t len = strlen(t->name);
        snprintf(stem, sizeof stem, "%.*s", len > 7 ? (int)(len - 7) : 0, t->name);
        int32_t id = len > 7 && !strcmp(t->name + len - 7, ".weight") ? lp_sd_target_find(&tg, stem) : -1;
        const lp_sd_delta *d = id >= 0 ? lp_sd_lora_delta(l, id) : NULL;
        if (d) {
            const lp_sd_target *g = &tg.t[id];
            int64_t k = g->k ? g->k : 1, in = g->in;
            for (int64_t o = 0; o < g->out; o++)
                for (int64_t ci = 0; ci < in; ci++)
                    for (int64_t ky = 0; ky < k; ky++)
                        for (int64_t kx = 0; kx < k; kx++) {
                            double acc = 0;
                            for (int r = 0; r < d->rank; r++)
                                acc += (double)d->up[(int64_t)r * g->out + o] *
                                       d->down[((ky * k + kx) * in + ci) * d->rank + r];
                            v[((o * in + ci) * k + ky) * k + kx] += (float)(s * d->scale * acc);
                        }
        }
        if (tok_row >= 0 && strstr(t->name, "token_embedding.weight"))
            memcpy(v + (size_t)tok_row * (size_t)c.te_dim, lp_sd_lora_token_embedding(l, 0), sizeof(float) * (size_t)c.te_dim);
        lp_st_writer_add(w, t->name, LP_ST_F32, t->n_dims, t->shape, v, sizeof(float) * t->n_elements);
    }
    static const char *const meta[] = {"loraplex.sd.te_heads", "loraplex.sd.unet_heads", "loraplex.sd.groups"};
    for (int i = 0; i < 3; i++)
        if (lp_safetensors_metadata(st, meta[i])) lp_st_writer_set_metadata(w, meta[i], lp_safetensors_metadata(st, meta[i]));
    int rc = lp_st_writer_write(w, out, &err);
    for (size_t i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    lp_st_writer_free(w);
    lp_sd_targets_free(&tg);
    lp_safetensors_close(st);
    return rc;
}

typedef struct io {
    int32_t ids[3 * 77];
    float x[3 * 8 * 8 * 4], t[3], ctx[3 * 77 * 32];
} io;

static void make_io(io *v) {
    lp_rng r;
    lp_rng_seed(&r, 11);
    for (int i = 0; i < 3 * 77; i++) v->ids[i] = (int32_t)(lp_rng_u64(&r) % 49408);
    for (size_t i = 0; i < sizeof v->x / sizeof v->x[0]; i++) v->x[i] = lp_rng_normal(&r);
    for (size_t i = 0; i < sizeof v->ctx / sizeof v->ctx[0]; i++) v->ctx[i] = lp_rng_normal(&r);
    v->t[0] = 999, v->t[1] = 500, v->t[2] = 1;
}

/* text encoder and UNet outputs of `batch` rows with the graph's adapters as set */
static int run(lp_sd_graph *g, const io *v, int batch, float *te, float *eps) {
    lp_error err = {0};
    if (lp_sd_text_encode(g, v->ids, batch, 1, te, &err)) return -1;
    return lp_sd_unet(g, v->x, v->t, v->ctx, batch, eps, &err);
}

static double rel_err(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#define TE_N (77 * 32)
#define EPS_N (8 * 8 * 4)

static void test_runtime_vs_merged(const char *base, int threads) {
    lp_sd_config c = lp_sd_config_tiny();
    lp_error err = {0};
    lp_sd_model *m = lp_sd_model_load(base, &err);
    lp_sd_weights *w = m ? lp_sd_weights_create(m, LP_F32, &err) : NULL;
    lp_sd_graph *g = w ? lp_sd_graph_create(w, 3, 8, 8, threads, &err) : NULL;
    CHECK_MSG(g != NULL, "%s", err.message);
    if (!g) goto done;
    io *v = malloc(sizeof *v);
    make_io(v);
    float *te0 = malloc(sizeof(float) * 3 * TE_N), *eps0 = malloc(sizeof(float) * 3 * EPS_N);
    float *te1 = malloc(sizeof(float) * 3 * TE_N), *eps1 = malloc(sizeof(float) * 3 * EPS_N);
    float *te2 = malloc(sizeof(float) * 3 * TE_N), *eps2 = malloc(sizeof(float) * 3 * EPS_N);
    CHECK(run(g, v, 1, te0, eps0) == 0); /* the base */
    static const char *const formats[] = {"kohya", "diffusers", "peft", "cloneofsimo"};
    lp_sd_lora *l[4] = {0};
    char lpath[] = "/tmp/lp_sd_lora_tiny_XXXXXX", mpath[] = "/tmp/lp_sd_lora_merged_XXXXXX";
    close(mkstemp(lpath));
    close(mkstemp(mpath));
    for (int f = 0; f < 4; f++) {
        CHECK(lp_sd_synth_lora(&c, formats[f], 3 + f, 20 + f, lpath, &err) == 0);
        l[f] = lp_sd_lora_load(lpath, &c, &err);
        CHECK_MSG(l[f] != NULL, "%s: %s", formats[f], err.message);
        if (!l[f]) continue;
        CHECK(!strcmp(lp_sd_lora_format(l[f]), formats[f]));
        float s = f == 1 ? 0.6f : 1.0f;
        lp_sd_row_loras rl = {.n = 1, .use = {{.lora = l[f], .scale = s}}};
        CHECK(lp_sd_graph_set_loras(g, &rl, 1, &err) == 0);
        CHECK(run(g, v, 1, te1, eps1) == 0);
        CHECK(lp_sd_graph_set_loras(g, NULL, 0, &err) == 0);
        /* merged */
        CHECK(write_merged(base, l[f], s, -1, mpath) == 0);
        lp_sd_model *mm = lp_sd_model_load(mpath, &err);
        lp_sd_weights *mw = mm ? lp_sd_weights_create(mm, LP_F32, &err) : NULL;
        lp_sd_graph *mg = mw ? lp_sd_graph_create(mw, 1, 8, 8, threads, &err) : NULL;
        CHECK_MSG(mg != NULL, "%s", err.message);
        if (mg) {
            CHECK(run(mg, v, 1, te2, eps2) == 0);
            double et = rel_err(te1, te2, TE_N), ee = rel_err(eps1, eps2, EPS_N);
            double ct = rel_err(te1, te0, TE_N), ce = rel_err(eps1, eps0, EPS_N);
            bool has_te = lp_sd_lora_count(l[f], LP_SD_PART_TE) > 0;
            CHECK_MSG(et < 1e-5 && ee < 1e-5, "%s: runtime vs merged: text %g, eps %g", formats[f], et, ee);
            CHECK_MSG((!has_te || ct > 1e-3) && ce > 1e-3, "%s: the adapter changes little: text %g, eps %g", formats[f], ct, ce);
        }
        lp_sd_graph_free(mg);
        lp_sd_weights_free(mw);
        lp_sd_model_free(mm);
    }
    /* a batch of three rows: kohya + peft, none, diffusers at 0.6; each row against itself alone */
    if (l[0] && l[1] && l[2]) {
        lp_sd_row_loras rows[3] = {{.n = 2, .use = {{.lora = l[0], .scale = 1.0f}, {.lora = l[2], .scale = 0.8f}}},
                                   {.n = 0},
                                   {.n = 1, .use = {{.lora = l[1], .scale = 0.6f}}}};
        CHECK(lp_sd_graph_set_loras(g, rows, 3, &err) == 0);
        CHECK(run(g, v, 3, te1, eps1) == 0);
        for (int r = 0; r < 3; r++) {
            io one = *v;
            memcpy(one.ids, v->ids + r * 77, sizeof(int32_t) * 77);
            memcpy(one.x, v->x + r * EPS_N, sizeof(float) * EPS_N);
            memcpy(one.ctx, v->ctx + r * 77 * 32, sizeof(float) * 77 * 32);
            one.t[0] = v->t[r];
            CHECK(lp_sd_graph_set_loras(g, &rows[r], 1, &err) == 0);
            CHECK(run(g, &one, 1, te2, eps2) == 0);
            CHECK_MSG(!memcmp(te1 + r * TE_N, te2, sizeof(float) * TE_N), "row %d: text encoder batch != alone", r);
            CHECK_MSG(!memcmp(eps1 + r * EPS_N, eps2, sizeof(float) * EPS_N), "row %d: UNet batch != alone", r);
        }
        /* the same adapter in consecutive rows shares one pass: rows 0 and 1 both with kohya */
        lp_sd_row_loras two[2] = {{.n = 1, .use = {{.lora = l[0], .scale = 1.0f}}}, {.n = 1, .use = {{.lora = l[0], .scale = 1.0f}}}};
        CHECK(lp_sd_graph_set_loras(g, two, 2, &err) == 0);
        CHECK(run(g, v, 2, te1, eps1) == 0);
        CHECK(lp_sd_graph_set_loras(g, two, 1, &err) == 0);
        CHECK(run(g, v, 1, te2, eps2) == 0);
        CHECK(!memcmp(te1, te2, sizeof(float) * TE_N) && !memcmp(eps1, eps2, sizeof(float) * EPS_N));
    }
    /* a textual-inversion token: id vocab + 0 reads the cloneofsimo adapter's "<s1>", as a merged model
     * whose token 7 is that embedding reads id 7 */
    if (l[3]) {
        lp_sd_row_loras rl = {.n = 1, .use = {{.lora = l[3], .scale = 1.0f}}};
        CHECK(lp_sd_graph_set_loras(g, &rl, 1, &err) == 0);
        CHECK(lp_sd_graph_added_tokens(g, 0) == 1);
        io tv = *v;
        tv.ids[5] = c.te_vocab;
        CHECK(run(g, &tv, 1, te1, eps1) == 0);
        tv.ids[5] = c.te_vocab + 1;
        CHECK(lp_sd_text_encode(g, tv.ids, 1, 1, te2, &err) != 0 && strstr(err.message, "token id 49409"));
        CHECK(write_merged(base, l[3], 1.0f, 7, mpath) == 0);
        lp_sd_model *mm = lp_sd_model_load(mpath, &err);
        lp_sd_weights *mw = mm ? lp_sd_weights_create(mm, LP_F32, &err) : NULL;
        lp_sd_graph *mg = mw ? lp_sd_graph_create(mw, 1, 8, 8, threads, &err) : NULL;
        tv.ids[5] = 7;
        CHECK(mg && lp_sd_text_encode(mg, tv.ids, 1, 1, te2, &err) == 0);
        CHECK_MSG(rel_err(te1, te2, TE_N) < 1e-5, "token: %g", rel_err(te1, te2, TE_N));
        lp_sd_graph_free(mg);
        lp_sd_weights_free(mw);
        lp_sd_model_free(mm);
        /* an adapter loaded for another configuration */
        lp_sd_config c15 = lp_sd_config_sd15();
        lp_sd_lora *other = lp_sd_lora_load(SD_DIR "sd15-lora-diffusers-r4.safetensors", &c15, &err);
        lp_sd_row_loras bad = {.n = 1, .use = {{.lora = other, .scale = 1.0f}}};
        CHECK(other && lp_sd_graph_set_loras(g, &bad, 1, &err) != 0 && strstr(err.message, "another model"));
        lp_sd_lora_free(other);
    }
    CHECK(lp_sd_graph_set_loras(g, NULL, 0, &err) == 0);
    for (int f = 0; f < 4; f++) lp_sd_lora_free(l[f]);
    /* a file for SD 1.5 does not fit sd-tiny */
    lp_sd_lora *x = lp_sd_lora_load(SD_DIR "sd15-lora-diffusers-r4.safetensors", &c, &err);
    CHECK_MSG(x == NULL && strstr(err.message, "sd15-lora-diffusers-r4.safetensors: key 'down_blocks.0.attentions.1."),
              "%s", err.message);
    unlink(lpath), unlink(mpath);
    free(v), free(te0), free(eps0), free(te1), free(eps1), free(te2), free(eps2);
done:
    lp_sd_graph_free(g);
    lp_sd_weights_free(w);
    lp_sd_model_free(m);
}

/* the prompt's "<s1>" becomes the adapter's token id; the text around it is tokenized as alone */
static void test_prompt_tokens(void) {
    lp_error err = {0};
    lp_clip_tokenizer *tok = lp_clip_tokenizer_load(SD_DIR "clip-bpe-merges.txt", &err);
    lp_sd_config c = lp_sd_config_sd15();
    lp_sd_lora *l = lp_sd_lora_load(SD_DIR "sd15-lora-cloneofsimo-disney-r1.safetensors", &c, &err);
    CHECK_MSG(tok && l, "%s", err.message);
    if (tok && l) {
        int s1 = !strcmp(lp_sd_lora_token(l, 0), "<s1>") ? 0 : 1;
        lp_sd_row_loras rl = {.n = 1, .use = {{.lora = l, .scale = 1.0f}}};
        int32_t ids[77], a[77], b[77];
        CHECK(lp_sd_encode_prompt(tok, &rl, "a photo of <s1>, Disney style<s2>", ids, 77, &err) == 0);
        CHECK(lp_clip_encode(tok, "a photo of ", 11, LP_CLIP_EOS, a, 77, NULL, &err) == 0);
        CHECK(lp_clip_encode(tok, ", Disney style", 14, LP_CLIP_EOS, b, 77, NULL, &err) == 0);
        /* BOS a photo of | 49408 + s1 | , disney style | 49408 + s2 | EOS, pad */
        CHECK(ids[0] == LP_CLIP_BOS && ids[1] == a[1] && ids[2] == a[2] && ids[3] == a[3] && a[4] == LP_CLIP_EOS);
        CHECK(ids[4] == 49408 + s1);
        CHECK(ids[5] == b[1] && ids[6] == b[2] && ids[7] == b[3] && b[4] == LP_CLIP_EOS);
        CHECK(ids[8] == 49408 + (1 - s1) && ids[9] == LP_CLIP_EOS && ids[76] == LP_CLIP_EOS);
        /* without the adapter: plain encoding */
        lp_sd_row_loras none = {.n = 0};
        CHECK(lp_sd_encode_prompt(tok, &none, "a photo of <s1>", ids, 77, &err) == 0);
        CHECK(lp_clip_encode(tok, "a photo of <s1>", 15, LP_CLIP_EOS, a, 77, NULL, &err) == 0);
        CHECK(!memcmp(ids, a, sizeof ids));
    }
    lp_sd_lora_free(l);
    lp_clip_tokenizer_free(tok);
}

int main(void) {
    test_targets();
    test_prompt_tokens();
    test_real_files();
    test_bad_files();
    char path[] = "/tmp/lp_sd_lora_base_XXXXXX";
    close(mkstemp(path));
    lp_sd_config tiny = lp_sd_config_tiny();
    lp_error err = {0};
    CHECK(lp_sd_synth_write(&tiny, LP_ST_F32, 5, "sd-tiny", path, &err) == 0);
    test_runtime_vs_merged(path, 1);
    test_runtime_vs_merged(path, 2);
    unlink(path);
    return check_summary("test_sd_lora");
}
