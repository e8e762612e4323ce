/* Random SD 1.x LoRA files (see sd_lora_synth.h). */
#include "sd_lora_synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../formats/safetensors.h"
#include "../image/sd_lora.h"

typedef struct writer {
    lp_st_writer *w;
    float **bufs;
    int n, cap;
    uint64_t seed;
    bool oom;
} writer;

static uint64_t fnv(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* a tensor of n uniform values in [-a, a), kept until the file is written */
static void add(writer *w, const char *key, uint32_t n_dims, const uint64_t *shape, float a) {
    uint64_t n = 1;
    for (uint32_t i = 0; i < n_dims; i++) n *= shape[i];
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 256;
        float **b = realloc(w->bufs, sizeof *b * (size_t)cap);
        if (!b) {
            w->oom = true;
            return;
        }
        w->bufs = b, w->cap = cap;
    }
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!v) {
        w->oom = true;
        return;
    }
    lp_rng rng;
    lp_rng_seed(&rng, w->seed ^ fnv(key));
    for (uint64_t i = 0; i < n; i++) v[i] = a * (2.0f * lp_rng_uniform(&rng) - 1.0f);
    w->bufs[w->n++] = v;
    lp_st_writer_add(w->w, key, LP_ST_F32, n_dims, shape, v, sizeof(float) * (size_t)n);
}

static void add_scalar(writer *w, const char *key, float value) {
    add(w, key, 0, NULL, 0.0f);
    if (!w->oom) w->bufs[w->n - 1][0] = value;
}

/* down [r][in]([k][k]) and up [out][r]([1][1]) under the two keys */
static void pair(writer *w, const lp_sd_target *t, int r, const char *down_key, const char *up_key, bool four_d) {
    int64_t k = t->k ? t->k : 1;
    uint64_t ds[4] = {(uint64_t)r, (uint64_t)t->in, (uint64_t)k, (uint64_t)k}, us[4] = {(uint64_t)t->out, (uint64_t)r, 1, 1};
    add(w, down_key, four_d ? 4 : 2, ds, 1.0f / sqrtf((float)(k * k * t->in)));
    add(w, up_key, four_d ? 4 : 2, us, 1.0f / sqrtf((float)r));
}

static void underscored(char *dst, size_t cap, const char *prefix, const char *name) {
    int n = snprintf(dst, cap, "%s%s", prefix, name);
    for (int i = (int)strlen(prefix); i < n && i < (int)cap; i++)
        if (dst[i] == '.') dst[i] = '_';
}

static bool is_attn_proj(const char *d) {
    const char *p = strstr(d, ".attn");
    return p && (strstr(p, ".to_q") || strstr(p, ".to_k") || strstr(p, ".to_v") || strstr(p, ".to_out.0"));
}

static void kohya(writer *w, const lp_sd_targets *tg, int r) {
    char m[192], a[240], b[240];
    for (int32_t i = 0; i < tg->n; i++) {
        const lp_sd_target *t = &tg->t[i];
        underscored(m, sizeof m, t->part == LP_SD_PART_TE ? "lora_te_" : "lora_unet_", t->diffusers);
        snprintf(a, sizeof a, "%s.lora_down.weight", m);
        snprintf(b, sizeof b, "%s.lora_up.weight", m);
        pair(w, t, r, a, b, t->k > 0);
        snprintf(a, sizeof a, "%s.alpha", m);
        add_scalar(w, a, (float)r / 2);
    }
}

static void diffusers(writer *w, const lp_sd_targets *tg, int r) {
    char a[240], b[240];
    for (int32_t i = 0; i < tg->n; i++) {
        const lp_sd_target *t = &tg->t[i];
        if (t->part != LP_SD_PART_UNET || !is_attn_proj(t->diffusers)) continue;
        const char *proj = strrchr(t->diffusers, '.');
        size_t stem = (size_t)(proj - t->diffusers);
        if (!strcmp(proj, ".0")) { /* to_out.0 */
            stem -= 7;
            proj = ".to_out";
        }
        snprintf(a, sizeof a, "%.*s.processor.%s_lora.down.weight", (int)stem, t->diffusers, proj + 1);
        snprintf(b, sizeof b, "%.*s.processor.%s_lora.up.weight", (int)stem, t->diffusers, proj + 1);
        pair(w, t, r, a, b, false);
    }
}

static void peft(writer *w, const lp_sd_targets *tg, int r) {
    char a[240], b[240];
    for (int32_t i = 0; i < tg->n; i++) {
        const lp_sd_target *t = &tg->t[i];
        if (t->k) continue;
        const char *p = t->part == LP_SD_PART_TE ? "text_encoder." : "unet.";
        snprintf(a, sizeof a, "%s%s.lora_A.weight", p, t->diffusers);
        snprintf(b, sizeof b, "%s%s.lora_B.weight", p, t->diffusers);
        pair(w, t, r, a, b, false);
    }
}

static int32_t find(const lp_sd_targets *tg, const char *diffusers) {
    for (int32_t i = 0; i < tg->n; i++)
        if (!strcmp(tg->t[i].diffusers, diffusers)) return i;
    return -1;
}

/* cloneofsimo's module order, written out here on its own: transformer blocks of
 * down_blocks, then up_blocks, then mid_block; in each attn1 q k v out, the
 * GEGLU proj, attn2 q k v out; the text encoder's layers k v q out */
static int clone(writer *w, const lp_sd_targets *tg, const lp_sd_config *c, int r, lp_error *err) {
    char blocks[64][96], name[200], a[64], b[64];
    int nb = 0, idx = 0;
    for (int l = 0; l < c->unet_levels; l++)
        for (int j = 0; c->unet_attn[l] && j < c->unet_res_blocks; j++)
            snprintf(blocks[nb++], sizeof blocks[0], "down_blocks.%d.attentions.%d.transformer_blocks.0", l, j);
    for (int i = 0; i < c->unet_levels; i++)
        for (int j = 0; c->unet_attn[c->unet_levels - 1 - i] && j <= c->unet_res_blocks; j++)
            snprintf(blocks[nb++], sizeof blocks[0], "up_blocks.%d.attentions.%d.transformer_blocks.0", i, j);
    snprintf(blocks[nb++], sizeof blocks[0], "mid_block.attentions.0.transformer_blocks.0");
    static const char *const seq[] = {"attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "ff.net.0.proj",
                                      "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0"};
    for (int bl = 0; bl < nb; bl++)
        for (int s = 0; s < 9; s++) {
            int32_t t = snprintf(name, sizeof name, "%s.%s", blocks[bl], seq[s]) < (int)sizeof name ? find(tg, name) : -1;
            if (t < 0) return lp_fail(err, "synth: no %s", name);
            snprintf(a, sizeof a, "unet:%d:down", idx);
            snprintf(b, sizeof b, "unet:%d:up", idx);
            pair(w, &tg->t[t], r, a, b, false);
            char key[32], val[16];
            snprintf(key, sizeof key, "unet:%d:rank", idx++);
            snprintf(val, sizeof val, "%d", r);
            lp_st_writer_set_metadata(w->w, key, val);
        }
    idx = 0;
    static const char *const te[] = {"k_proj", "v_proj", "q_proj", "out_proj"};
    for (int l = 0; l < c->te_layers; l++)
        for (int s = 0; s < 4; s++) {
            int32_t t = snprintf(name, sizeof name, "text_model.encoder.layers.%d.self_attn.%s", l, te[s]) < (int)sizeof name
                            ? find(tg, name) : -1;
            if (t < 0) return lp_fail(err, "synth: no %s", name);
            snprintf(a, sizeof a, "text_encoder:%d:down", idx);
            snprintf(b, sizeof b, "text_encoder:%d:up", idx++);
            pair(w, &tg->t[t], r, a, b, false);
        }
    lp_st_writer_set_metadata(w->w, "unet", "[\"CrossAttention\", \"Attention\", \"GEGLU\"]");
    lp_st_writer_set_metadata(w->w, "text_encoder", "[\"CLIPAttention\"]");
    add(w, "<s1>", 1, (uint64_t[]){(uint64_t)c->te_dim}, 1.0f);
    lp_st_writer_set_metadata(w->w, "<s1>", "<embed>");
    return 0;
}

int lp_sd_synth_lora(const lp_sd_config *c, const char *format, int rank, uint64_t seed, const char *out_path,
                     lp_error *err) {
    if (rank < 1 || rank > 4096) return lp_fail(err, "synth: LoRA rank %d (1..4096)", rank);
    lp_sd_targets tg;
    if (lp_sd_targets_build(c, &tg, err)) return -1;
    writer w = {.w = lp_st_writer_create(), .seed = seed};
    int rc = w.w ? 0 : lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    if (!rc) {
        if (!strcmp(format, "kohya")) kohya(&w, &tg, rank);
        else if (!strcmp(format, "diffusers")) diffusers(&w, &tg, rank);
        else if (!strcmp(format, "peft")) peft(&w, &tg, rank);
        else if (!strcmp(format, "cloneofsimo")) rc = clone(&w, &tg, c, rank, err);
        else rc = lp_fail(err, "synth: LoRA format '%s' (kohya, diffusers, peft, cloneofsimo)", format);
    }
    if (!rc && w.oom) rc = lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    if (!rc) rc = lp_st_writer_write(w.w, out_path, err);
    for (int i = 0; i < w.n; i++) free(w.bufs[i]);
    free(w.bufs);
    lp_st_writer_free(w.w);
    lp_sd_targets_free(&tg);
    return rc;
}
