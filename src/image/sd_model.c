/* Loading an SD 1.x model, a single-file checkpoint or a diffusers folder:
 * the configuration from the files' shapes and names, then every tensor of
 * that configuration's layout checked for presence, shape and dtype. A
 * folder's tensors are found by their diffusers names (lp_sd_diffusers_name),
 * so everything after the loader sees the checkpoint's names only. */
#include "sd.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* one: the single file; else part[]: a diffusers folder's text_encoder, unet and vae files */
typedef struct source {
    lp_safetensors *one, *part[3];
} source;

struct lp_sd_model {
    lp_sd_config cfg;
    source src;
    int64_t ignored;
};

static const lp_st_tensor *find(const lp_safetensors *st, const char *fmt, int a, int b) {
    char name[160];
    snprintf(name, sizeof name, fmt, a, b);
    return lp_safetensors_find(st, name);
}

/* The tensor, with n_dims dimensions; NULL (err set) when absent or of
 * another rank. */
static const lp_st_tensor *need(const lp_safetensors *st, const char *path, const char *name, uint32_t n_dims,
                                lp_error *err) {
    const lp_st_tensor *t = lp_safetensors_find(st, name);
    if (!t) return lp_fail(err, "%s: no tensor %s (not an SD 1.x single-file checkpoint?)", path, name), NULL;
    if (t->n_dims != n_dims)
        return lp_fail(err, "%s: %s has %u dimensions, expected %u", path, name, t->n_dims, n_dims), NULL;
    for (uint32_t i = 0; i < n_dims; i++)
        if (t->shape[i] == 0 || t->shape[i] > (1u << 24))
            return lp_fail(err, "%s: %s has dimension %u of size %llu", path, name, i,
                           (unsigned long long)t->shape[i]), NULL;
    return t;
}

static int32_t meta_int(const lp_safetensors *st, const char *key, int32_t dflt) {
    const char *v = lp_safetensors_metadata(st, key);
    if (!v) return dflt;
    char *end;
    long x = strtol(v, &end, 10);
    return end != v && *end == 0 && x > 0 && x < (1 << 20) ? (int32_t)x : -1;
}

static int infer_text_encoder(const lp_safetensors *st, const char *path, const char *T, lp_sd_config *c,
                              lp_error *err) {
    char name[160];
    snprintf(name, sizeof name, "%sembeddings.token_embedding.weight", T);
    const lp_st_tensor *tok = need(st, path, name, 2, err);
    if (!tok) return -1;
    snprintf(name, sizeof name, "%sembeddings.position_embedding.weight", T);
    const lp_st_tensor *pos = need(st, path, name, 2, err);
    if (!pos) return -1;
    snprintf(name, sizeof name, "%sencoder.layers.0.mlp.fc1.weight", T);
    const lp_st_tensor *fc1 = need(st, path, name, 2, err);
    if (!fc1) return -1;
    c->te_vocab = (int32_t)tok->shape[0];
    c->te_dim = (int32_t)tok->shape[1];
    c->te_ctx = (int32_t)pos->shape[0];
    c->te_ffn = (int32_t)fc1->shape[0];
    c->te_layers = 0;
    for (; c->te_layers < 256; c->te_layers++) {
        snprintf(name, sizeof name, "%sencoder.layers.%d.self_attn.q_proj.weight", T, c->te_layers);
        if (!lp_safetensors_find(st, name)) break;
    }
    /* CLIP's heads are 64 wide (ViT-L/14: 768 / 12) */
    c->te_heads = meta_int(st, "loraplex.sd.te_heads", c->te_dim % 64 == 0 ? c->te_dim / 64 : 1);
    return 0;
}

/* Walks input_blocks: a block with .0.op is a downsampler (a level ends),
 * one with .1.proj_in carries attention, the rest are ResBlocks whose
 * output channels give the level's multiplier. */
static int infer_unet(const lp_safetensors *st, const char *path, lp_sd_config *c, lp_error *err) {
    const lp_st_tensor *in = need(st, path, "model.diffusion_model.input_blocks.0.0.weight", 4, err);
    if (!in) return -1;
    const lp_st_tensor *out = need(st, path, "model.diffusion_model.out.2.weight", 4, err);
    if (!out) return -1;
    c->unet_ch = (int32_t)in->shape[0];
    c->unet_in = (int32_t)in->shape[1];
    c->unet_out = (int32_t)out->shape[0];
    c->unet_levels = 0;
    c->unet_res_blocks = 0;
    int res_in_level = 0;
    for (int idx = 1; idx < 64; idx++) {
        if (find(st, "model.diffusion_model.input_blocks.%d.0.op.weight", idx, 0)) {
            if (c->unet_levels == 0) c->unet_res_blocks = res_in_level;
            if (res_in_level != c->unet_res_blocks || ++c->unet_levels >= LP_SD_MAX_LEVELS)
                return lp_fail(err, "%s: UNet input_blocks.%d: levels of unequal depth or more than %d levels", path,
                               idx, LP_SD_MAX_LEVELS);
            res_in_level = 0;
            continue;
        }
        const lp_st_tensor *r = find(st, "model.diffusion_model.input_blocks.%d.0.out_layers.3.weight", idx, 0);
        if (!r) break;
        if (r->n_dims != 4 || r->shape[0] % (uint64_t)c->unet_ch)
            return lp_fail(err, "%s: UNet input_blocks.%d: %llu channels, not a multiple of %d", path, idx,
                           (unsigned long long)r->shape[0], c->unet_ch);
        c->unet_mult[c->unet_levels] = (int32_t)(r->shape[0] / (uint64_t)c->unet_ch);
        c->unet_attn[c->unet_levels] = find(st, "model.diffusion_model.input_blocks.%d.1.proj_in.weight", idx, 0) != NULL;
        res_in_level++;
    }
    if (c->unet_levels == 0) c->unet_res_blocks = res_in_level;
    if (res_in_level != c->unet_res_blocks || res_in_level == 0)
        return lp_fail(err, "%s: UNet: the last level has %d ResBlocks, the others %d", path, res_in_level,
                       c->unet_res_blocks);
    c->unet_levels++;
    const lp_st_tensor *k =
        need(st, path, "model.diffusion_model.middle_block.1.transformer_blocks.0.attn2.to_k.weight", 2, err);
    if (!k) return -1;
    c->context_dim = (int32_t)k->shape[1];
    c->unet_heads = meta_int(st, "loraplex.sd.unet_heads", 8); /* SD 1.x: 8 heads everywhere */
    return 0;
}

static int infer_vae(const lp_safetensors *st, const char *path, lp_sd_config *c, lp_error *err) {
    const lp_st_tensor *in = need(st, path, "first_stage_model.encoder.conv_in.weight", 4, err);
    if (!in) return -1;
    const lp_st_tensor *z = need(st, path, "first_stage_model.post_quant_conv.weight", 4, err);
    if (!z) return -1;
    c->vae_ch = (int32_t)in->shape[0];
    c->vae_img = (int32_t)in->shape[1];
    c->vae_z = (int32_t)z->shape[0];
    c->vae_levels = 0;
    while (c->vae_levels < LP_SD_MAX_LEVELS) {
        const lp_st_tensor *t = find(st, "first_stage_model.encoder.down.%d.block.0.conv2.weight", c->vae_levels, 0);
        if (!t) break;
        if (t->n_dims != 4 || t->shape[0] % (uint64_t)c->vae_ch)
            return lp_fail(err, "%s: VAE encoder.down.%d: %llu channels, not a multiple of %d", path, c->vae_levels,
                           (unsigned long long)t->shape[0], c->vae_ch);
        c->vae_mult[c->vae_levels++] = (int32_t)(t->shape[0] / (uint64_t)c->vae_ch);
    }
    c->vae_res_blocks = 0;
    while (c->vae_res_blocks < 8 && find(st, "first_stage_model.encoder.down.0.block.%d.conv1.weight", c->vae_res_blocks, 0))
        c->vae_res_blocks++;
    return 0;
}

static uint32_t groups_of(const lp_safetensors *st) {
    /* GroupNorm's groups are no shape: 32 in SD, written by our synth too */
    int32_t g = meta_int(st, "loraplex.sd.groups", 32);
    return g > 0 ? (uint32_t)g : 0;
}

/* a layout tensor by its checkpoint name: in the file, or in the folder's part under its diffusers name
 * (the VAE attention's older diffusers names too) */
static const lp_st_tensor *source_find(const source *s, const lp_sd_config *c, const char *ldm) {
    if (s->one) return lp_safetensors_find(s->one, ldm);
    char dn[192];
    int part = lp_sd_diffusers_name(c, ldm, dn, sizeof dn);
    if (part < 0) return NULL;
    const lp_st_tensor *t = lp_safetensors_find(s->part[part], dn);
    static const char *const older[][2] = {{".to_q.", ".query."}, {".to_k.", ".key."}, {".to_v.", ".value."},
                                           {".to_out.0.", ".proj_attn."}};
    char *at = part == LP_SD_PART_VAE ? strstr(dn, ".attentions.0.") : NULL;
    for (size_t i = 0; !t && at && i < sizeof older / sizeof older[0]; i++) {
        char *k = strstr(at, older[i][0]), alt[192];
        if (k && snprintf(alt, sizeof alt, "%.*s%s%s", (int)(k - dn), dn, older[i][1], k + strlen(older[i][0])) <
                     (int)sizeof alt)
            t = lp_safetensors_find(s->part[part], alt);
    }
    return t;
}

typedef struct check_ctx {
    const source *src;
    const lp_sd_config *c;
    const char *path;
    lp_error *err;
    int64_t found;
} check_ctx;

/* diffusers keeps the VAE attention's 1x1 convs as linears: [c][c] for [c][c][1][1] */
static bool same_shape(const lp_st_tensor *t, const lp_sd_tensor_desc *d) {
    bool same = t->n_dims == (uint32_t)d->n_dims;
    for (int i = 0; same && i < d->n_dims; i++) same = t->shape[i] == (uint64_t)d->shape[i];
    return same || (t->n_dims == 2 && d->n_dims == 4 && d->shape[2] == 1 && d->shape[3] == 1 &&
                    t->shape[0] == (uint64_t)d->shape[0] && t->shape[1] == (uint64_t)d->shape[1]);
}

static int check_one(void *ctx, const lp_sd_tensor_desc *d) {
    check_ctx *k = ctx;
    const lp_st_tensor *t = source_find(k->src, k->c, d->name);
    char dn[192] = "";
    if (!k->src->one) lp_sd_diffusers_name(k->c, d->name, dn, sizeof dn);
    const char *name = dn[0] ? dn : d->name;
    if (!t) return lp_fail(k->err, "%s: no tensor %s", k->path, name);
    if (!same_shape(t, d)) {
        char want[96] = "", got[96] = "";
        for (int i = 0; i < d->n_dims; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? ", " : "", (long long)d->shape[i]);
        for (uint32_t i = 0; i < t->n_dims && i < 8; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%llu", i ? ", " : "",
                     (unsigned long long)t->shape[i]);
        return lp_fail(k->err, "%s: %s has shape [%s], expected [%s]", k->path, name, got, want);
    }
    if (t->dtype != LP_ST_F32 && t->dtype != LP_ST_F16 && t->dtype != LP_ST_BF16)
        return lp_fail(k->err, "%s: %s is %s (F32, F16 or BF16 expected)", k->path, name, lp_st_dtype_name(t->dtype));
    k->found++;
    return 0;
}

static void source_close(source *s) {
    lp_safetensors_close(s->one);
    for (int i = 0; i < 3; i++) lp_safetensors_close(s->part[i]);
}

static size_t source_count(const source *s) {
    if (s->one) return lp_safetensors_count(s->one);
    return lp_safetensors_count(s->part[0]) + lp_safetensors_count(s->part[1]) + lp_safetensors_count(s->part[2]);
}

/* takes src (closed on failure) */
static lp_sd_model *model_from(source *src, const lp_sd_config *cfg, const char *path, lp_error *err) {
    lp_sd_config c = *cfg;
    if (lp_sd_config_check(&c, err)) {
        lp_fail_prefix(err, "%s", path);
        goto fail;
    }
    check_ctx k = {.src = src, .c = &c, .path = path, .err = err};
    if (lp_sd_layout(&c, check_one, &k)) goto fail;
    lp_sd_model *m = calloc(1, sizeof *m);
    if (!m) {
        lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    *m = (lp_sd_model){.cfg = c, .src = *src, .ignored = (int64_t)source_count(src) - k.found};
    return m;
fail:
    lp_error_as_format(err);
    source_close(src);
    return NULL;
}

static lp_sd_model *single_file(lp_safetensors *st, const char *path, lp_error *err) {
    lp_sd_config c = {0};
    source src = {.one = st};
    if (infer_text_encoder(st, path, "cond_stage_model.transformer.text_model.", &c, err) ||
        infer_unet(st, path, &c, err) || infer_vae(st, path, &c, err)) {
        lp_error_as_format(err);
        source_close(&src);
        return NULL;
    }
    c.groups = (int32_t)groups_of(st);
    return model_from(&src, &c, path, err);
}

/* ---- the diffusers folder ------------------------------------------------------------------ */

/* an integer of DIR/SUB/config.json (diffusers' and transformers' configs), or dflt */
static int32_t config_int(const char *dir, const char *sub, const char *key, int32_t dflt) {
    char path[4096], *text;
    size_t size;
    lp_error err = {0};
    snprintf(path, sizeof path, "%s/%s/config.json", dir, sub);
    if (lp_read_file(path, &text, &size, (size_t)1 << 20, &err)) return dflt;
    cJSON *j = cJSON_ParseWithLength(text, size);
    free(text);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (cJSON_IsArray(v)) v = cJSON_GetArrayItem(v, 0); /* attention_head_dim may be per level */
    int32_t r = cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble < (1 << 20) ? (int32_t)v->valuedouble : dflt;
    cJSON_Delete(j);
    return r;
}

/* the UNet's and the VAE's sizes from diffusers names (the text encoder's are transformers', read as in a
 * checkpoint) */
static int infer_diffusers(const source *s, const char *path, lp_sd_config *c, lp_error *err) {
    const lp_safetensors *u = s->part[LP_SD_PART_UNET], *v = s->part[LP_SD_PART_VAE];
    const lp_st_tensor *in = need(u, path, "conv_in.weight", 4, err), *out = in ? need(u, path, "conv_out.weight", 4, err) : NULL;
    const lp_st_tensor *k = out ? need(u, path, "mid_block.attentions.0.transformer_blocks.0.attn2.to_k.weight", 2, err) : NULL;
    const lp_st_tensor *vin = k ? need(v, path, "encoder.conv_in.weight", 4, err) : NULL;
    const lp_st_tensor *z = vin ? need(v, path, "post_quant_conv.weight", 4, err) : NULL;
    if (!z) return -1;
    c->unet_ch = (int32_t)in->shape[0], c->unet_in = (int32_t)in->shape[1], c->unet_out = (int32_t)out->shape[0];
    c->context_dim = (int32_t)k->shape[1];
    const lp_st_tensor *t;
    for (c->unet_levels = 0; c->unet_levels < LP_SD_MAX_LEVELS &&
                             (t = find(u, "down_blocks.%d.resnets.0.conv2.weight", c->unet_levels, 0));
         c->unet_levels++) {
        if (t->n_dims != 4 || t->shape[0] % (uint64_t)c->unet_ch)
            return lp_fail(err, "%s: UNet down_blocks.%d: %llu channels", path, c->unet_levels,
                           (unsigned long long)t->shape[0]);
        c->unet_mult[c->unet_levels] = (int32_t)(t->shape[0] / (uint64_t)c->unet_ch);
        c->unet_attn[c->unet_levels] = find(u, "down_blocks.%d.attentions.0.proj_in.weight", c->unet_levels, 0) != NULL;
    }
    for (c->unet_res_blocks = 0; c->unet_res_blocks < 8 && find(u, "down_blocks.0.resnets.%d.conv1.weight", c->unet_res_blocks, 0);)
        c->unet_res_blocks++;
    c->vae_ch = (int32_t)vin->shape[0], c->vae_img = (int32_t)vin->shape[1], c->vae_z = (int32_t)z->shape[0];
    for (c->vae_levels = 0; c->vae_levels < LP_SD_MAX_LEVELS &&
                            (t = find(v, "encoder.down_blocks.%d.resnets.0.conv2.weight", c->vae_levels, 0));
         c->vae_levels++) {
        if (t->n_dims != 4 || t->shape[0] % (uint64_t)c->vae_ch)
            return lp_fail(err, "%s: VAE encoder.down_blocks.%d: %llu channels", path, c->vae_levels,
                           (unsigned long long)t->shape[0]);
        c->vae_mult[c->vae_levels] = (int32_t)(t->shape[0] / (uint64_t)c->vae_ch);
    }
    for (c->vae_res_blocks = 0; c->vae_res_blocks < 8 && find(v, "encoder.down_blocks.0.resnets.%d.conv1.weight", c->vae_res_blocks, 0);)
        c->vae_res_blocks++;
    return 0;
}

/* DIR/SUB/NAME.safetensors, or its fp16 variant, or a sharded index */
static lp_safetensors *open_part(const char *dir, const char *sub, const char *name, lp_error *err) {
    static const char *const forms[] = {"%s/%s/%s.safetensors", "%s/%s/%s.fp16.safetensors",
                                        "%s/%s/%s.safetensors.index.json"};
    char path[4096];
    struct stat sb;
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        snprintf(path, sizeof path, forms[i], dir, sub, name);
        if (stat(path, &sb) == 0) return lp_safetensors_open(path, err);
    }
    snprintf(path, sizeof path, forms[0], dir, sub, name);
    return lp_fail(err, "%s: no %s (a diffusers folder has text_encoder/, unet/ and vae/)", dir, path), NULL;
}

static lp_sd_model *diffusers_folder(const char *dir, lp_error *err) {
    source src = {0};
    static const char *const sub[3] = {"text_encoder", "unet", "vae"}, *const file[3] = {"model", "diffusion_pytorch_model", "diffusion_pytorch_model"};
    for (int i = 0; i < 3; i++)
        if (!(src.part[i] = open_part(dir, sub[i], file[i], err))) {
            source_close(&src);
            return NULL;
        }
    lp_sd_config c = {0};
    if (infer_text_encoder(src.part[LP_SD_PART_TE], dir, "text_model.", &c, err) || infer_diffusers(&src, dir, &c, err)) {
        lp_error_as_format(err);
        source_close(&src);
        return NULL;
    }
    c.te_heads = config_int(dir, "text_encoder", "num_attention_heads", c.te_heads);
    c.unet_heads = config_int(dir, "unet", "attention_head_dim", 8); /* SD 1.x's "head dim" field holds its 8 heads */
    c.groups = config_int(dir, "unet", "norm_num_groups", 32);
    return model_from(&src, &c, dir, err);
}

lp_sd_model *lp_sd_model_load(const char *path, lp_error *err) {
    struct stat sb;
    char unet[4096];
    snprintf(unet, sizeof unet, "%s/unet", path);
    if (stat(unet, &sb) == 0 && S_ISDIR(sb.st_mode)) return diffusers_folder(path, err);
    lp_safetensors *st = lp_safetensors_open(path, err);
    return st ? single_file(st, path, err) : NULL;
}

lp_sd_model *lp_sd_model_load_memory(const void *data, size_t size, const char *name, lp_error *err) {
    lp_safetensors *st = lp_safetensors_open_memory(data, size, name, err);
    return st ? single_file(st, name, err) : NULL;
}

void lp_sd_model_free(lp_sd_model *m) {
    if (!m) return;
    source_close(&m->src);
    free(m);
}

const lp_sd_config *lp_sd_model_config(const lp_sd_model *m) { return &m->cfg; }
const lp_st_tensor *lp_sd_model_tensor(const lp_sd_model *m, const char *name) {
    return source_find(&m->src, &m->cfg, name);
}
int64_t lp_sd_model_ignored(const lp_sd_model *m) { return m->ignored; }
