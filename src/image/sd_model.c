/* Loading a single-file SD 1.x checkpoint: the configuration from the
 * file's shapes and names, then every tensor of that configuration's layout
 * checked for presence, shape and dtype. */
#include "sd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct lp_sd_model {
    lp_sd_config cfg;
    lp_safetensors *st;
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

static int infer_text_encoder(const lp_safetensors *st, const char *path, lp_sd_config *c, lp_error *err) {
    const char *T = "cond_stage_model.transformer.text_model.";
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
    while (c->te_layers < 256 &&
           find(st, "cond_stage_model.transformer.text_model.encoder.layers.%d.self_attn.q_proj.weight", c->te_layers, 0))
        c->te_layers++;
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

typedef struct check_ctx {
    const lp_safetensors *st;
    const char *path;
    lp_error *err;
    int64_t found;
} check_ctx;

static int check_one(void *ctx, const lp_sd_tensor_desc *d) {
    check_ctx *k = ctx;
    const lp_st_tensor *t = lp_safetensors_find(k->st, d->name);
    if (!t) return lp_fail(k->err, "%s: no tensor %s", k->path, d->name);
    bool same = t->n_dims == (uint32_t)d->n_dims;
    for (int i = 0; same && i < d->n_dims; i++) same = t->shape[i] == (uint64_t)d->shape[i];
    if (!same) {
        char want[96] = "", got[96] = "";
        for (int i = 0; i < d->n_dims; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? ", " : "", (long long)d->shape[i]);
        for (uint32_t i = 0; i < t->n_dims && i < 8; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%llu", i ? ", " : "",
                     (unsigned long long)t->shape[i]);
        return lp_fail(k->err, "%s: %s has shape [%s], expected [%s]", k->path, d->name, got, want);
    }
    if (t->dtype != LP_ST_F32 && t->dtype != LP_ST_F16 && t->dtype != LP_ST_BF16)
        return lp_fail(k->err, "%s: %s is %s (F32, F16 or BF16 expected)", k->path, d->name, lp_st_dtype_name(t->dtype));
    k->found++;
    return 0;
}

static lp_sd_model *model_from(lp_safetensors *st, const char *path, lp_error *err) {
    lp_sd_config c = {0};
    if (infer_text_encoder(st, path, &c, err) || infer_unet(st, path, &c, err) || infer_vae(st, path, &c, err))
        goto fail;
    c.groups = (int32_t)groups_of(st);
    if (lp_sd_config_check(&c, err)) {
        lp_fail_prefix(err, "%s", path);
        goto fail;
    }
    check_ctx k = {.st = st, .path = path, .err = err};
    if (lp_sd_layout(&c, check_one, &k)) goto fail;
    lp_sd_model *m = calloc(1, sizeof *m);
    if (!m) {
        lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    *m = (lp_sd_model){.cfg = c, .st = st, .ignored = (int64_t)lp_safetensors_count(st) - k.found};
    return m;
fail:
    lp_error_as_format(err);
    lp_safetensors_close(st);
    return NULL;
}

lp_sd_model *lp_sd_model_load(const char *path, lp_error *err) {
    lp_safetensors *st = lp_safetensors_open(path, err);
    return st ? model_from(st, path, err) : NULL;
}

lp_sd_model *lp_sd_model_load_memory(const void *data, size_t size, const char *name, lp_error *err) {
    lp_safetensors *st = lp_safetensors_open_memory(data, size, name, err);
    return st ? model_from(st, name, err) : NULL;
}

void lp_sd_model_free(lp_sd_model *m) {
    if (!m) return;
    lp_safetensors_close(m->st);
    free(m);
}

const lp_sd_config *lp_sd_model_config(const lp_sd_model *m) { return &m->cfg; }
const lp_st_tensor *lp_sd_model_tensor(const lp_sd_model *m, const char *name) {
    return lp_safetensors_find(m->st, name);
}
int64_t lp_sd_model_ignored(const lp_sd_model *m) { return m->ignored; }
