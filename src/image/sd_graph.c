/* SD 1.x's text encoder, UNet and VAE (decoder and encoder) as graphs over the image ops
 * (see sd_graph.h). The UNet and the decoder are op lists built once from
 * the configuration (the same walk as the layout's, sd_layout.c); the
 * graph's buffers are sized by walking those lists for the planned batch
 * and latent size, so a step allocates nothing. */
#include "sd_graph.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/image_ops.h"
#include "sd_compiled.h"
#include "sd_lora.h"

#define GN_EPS_UNET 1e-5f /* ldm's GroupNorm32 */
#define GN_EPS_XF 1e-6f   /* SpatialTransformer's norm, and the VAE's */
#define LN_EPS 1e-5f

/* ---- weights ----------------------------------------------------------------------------------- */

/* id: the module's index among the adapter targets (sd_lora.h), or -1 */
typedef struct lin { lp_weight w; const float *b; int32_t id; } lin;                        /* [out][in], bias [out] or NULL */
/* [out][k][k][in]; pad_after: lp_conv2d_shape's (1 with pad 0 on the VAE encoder's downsample, whose
 * input is padded by one pixel on the right and bottom only) */
typedef struct cnv { lp_weight w; const float *b; int32_t cin, cout, k, stride, pad, pad_after, id; } cnv;
typedef struct nrm { const float *g, *b; } nrm;
typedef struct res { nrm n1, n2; cnv c1, c2, skip; lin emb; bool has_skip; } res;
typedef struct xf { nrm gn, ln1, ln2, ln3; cnv pin, pout; lin q1, k1, v1, o1, q2, k2, v2, o2, ff1, ff2; int32_t c; } xf;
typedef struct vattn { nrm n; cnv q, k, v, o; } vattn;
typedef struct te_layer { nrm ln1, ln2; lin q, k, v, o, fc1, fc2; } te_layer;

/* UNet ops; lvl is the resolution level the op reads (0 = full latent) */
typedef enum { U_RES, U_XF, U_DOWN, U_UP, U_PUSH, U_CAT } uop_kind;
typedef struct uop { uop_kind kind; int32_t lvl, i; } uop; /* i: into res/xf/conv arrays */
typedef enum { V_RES, V_ATTN, V_UP, V_DOWN } vop_kind;
typedef struct vop { vop_kind kind; int32_t lvl, i; } vop; /* lvl: 0 = latent size, +1 per x2 */

#define MAX_RES 64
#define MAX_XF 32
#define MAX_CONV 16
#define MAX_UOPS 192
#define MAX_BATCH 64 /* rows of a graph: images x guidance rows */

struct lp_sd_weights {
    lp_sd_config cfg;
    lp_sd_targets targets;
    uint32_t wtype;   /* LP_F32 or LP_W8 (lp_sd_weights_create) */
    float *arena;     /* every f32 tensor */
    uint8_t *packed;  /* the LP_W8 matrices */
    int64_t n_tensors, max_cols, f32_bytes, w8_bytes;
    lp_sd_tensor_desc *desc;
    void **data;      /* tensor i: floats, or LP_W8 panels when is_w8[i] */
    bool *is_w8;
    lp_mapped_file map;    /* a compiled file's image (lp_sd_weights_open), or empty */
    bool int8_activations; /* the compiled file's activations */
    /* text encoder */
    const float *tok, *pos;
    te_layer *te;
    nrm te_final;
    /* UNet */
    lin temb0, temb2;
    cnv conv_in, out_conv, ud[MAX_CONV];
    nrm out_norm;
    res ur[MAX_RES];
    xf ux[MAX_XF];
    uop uops[MAX_UOPS];
    int n_uops, n_ud, n_ur, n_ux;
    /* VAE decoder */
    cnv post_quant, d_in, d_out, vd[MAX_CONV];
    nrm d_norm;
    res vr[MAX_RES];
    vattn va;
    vop vops[MAX_UOPS];
    int n_vops, n_vd, n_vr;
    /* VAE encoder: conv_in, the down ops, norm_out, conv_out (mean and log-variance), quant_conv */
    cnv e_in, e_out, quant, ed[MAX_CONV];
    nrm e_norm;
    res er[MAX_RES];
    vattn ea;
    vop eops[MAX_UOPS];
    int n_eops, n_ed, n_er;
};

typedef struct conv_ctx {
    const lp_sd_model *m;
    lp_sd_weights *w;
    int64_t at, floats, bytes;
    lp_error *err;
} conv_ctx;

/* a tensor's place in the arenas: 64-byte aligned */
static int64_t align64(uint64_t bytes) { return (int64_t)((bytes + 63) & ~(uint64_t)63); }

static int count_sizes(void *ctx, const lp_sd_tensor_desc *t) {
    conv_ctx *c = ctx;
    int64_t rows, cols;
    bool w8;
    int64_t bytes = align64(lp_sd_tensor_bytes(c->w->wtype, t, &w8, &rows, &cols));
    if (w8) {
        c->bytes += bytes;
        if (cols > c->w->max_cols) c->w->max_cols = cols;
    } else {
        c->floats += bytes / (int64_t)sizeof(float);
    }
    c->at++;
    return 0;
}

/* st as f32 in dst, conv kernels repacked to lp_conv2d's column order */
static int to_f32(const lp_st_tensor *st, const lp_sd_tensor_desc *t, float *dst, lp_error *err) {
    if (t->n_dims == 4 && (t->shape[2] > 1 || t->shape[3] > 1)) {
        float *tmp = malloc(st->n_elements * sizeof(float));
        if (!tmp) return lp_error_set(err, LP_ERR_NOMEM, "out of memory converting %s", t->name);
        int rc = lp_st_to_f32(st, tmp, err);
        if (!rc) lp_conv_weight_repack(tmp, t->shape[0], t->shape[1], t->shape[2], t->shape[3], dst);
        free(tmp);
        return rc;
    }
    return lp_st_to_f32(st, dst, err);
}

static int convert_one(void *ctx, const lp_sd_tensor_desc *t) {
    conv_ctx *c = ctx;
    lp_sd_weights *w = c->w;
    const lp_st_tensor *st = lp_sd_model_tensor(c->m, t->name);
    if (!st) return lp_fail(c->err, "no tensor %s", t->name);
    int64_t rows, cols, i = c->at++;
    bool w8;
    int64_t bytes = align64(lp_sd_tensor_bytes(w->wtype, t, &w8, &rows, &cols));
    w->desc[i] = *t;
    if (!w8) {
        w->data[i] = w->arena + c->floats;
        c->floats += bytes / (int64_t)sizeof(float);
        return to_f32(st, t, w->data[i], c->err);
    }
    float *tmp = malloc(st->n_elements * sizeof(float));
    if (!tmp) return lp_error_set(c->err, LP_ERR_NOMEM, "out of memory converting %s", t->name);
    w->data[i] = w->packed + c->bytes;
    w->is_w8[i] = true;
    c->bytes += bytes;
    int rc = to_f32(st, t, tmp, c->err);
    if (!rc && lp_pack_weight(LP_W8, (int)cols, tmp, rows, cols, w->data[i]))
        rc = lp_fail(c->err, "cannot pack %s as int8", t->name);
    free(tmp);
    return rc;
}

static int64_t find(const lp_sd_weights *w, const char *name) {
    for (int64_t i = 0; i < w->n_tensors; i++)
        if (!strcmp(w->desc[i].name, name)) return i;
    return -1; /* the loader checked the layout: only a bug gets here */
}

/* an f32 tensor (norms, biases, embeddings) */
__attribute__((format(printf, 2, 3))) static const float *W(const lp_sd_weights *w, const char *fmt, ...) {
    char name[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int64_t i = find(w, name);
    return i < 0 || w->is_w8[i] ? NULL : w->data[i];
}

/* p.weight as a rows x cols matrix, f32 or int8 */
static lp_weight matrix(const lp_sd_weights *w, const char *p, int64_t rows, int64_t cols) {
    char name[160];
    snprintf(name, sizeof name, "%s.weight", p);
    int64_t i = find(w, name);
    if (i >= 0 && w->is_w8[i]) return lp_packed_weight(LP_W8, (int)cols, rows, cols, w->data[i]);
    return (lp_weight){.type = LP_F32, .rows = rows, .cols = cols, .row_bytes = (size_t)cols * 4,
                       .data = i < 0 ? NULL : w->data[i]};
}

static lin mk_lin(const lp_sd_weights *w, const char *p, int64_t out, int64_t in, bool bias) {
    return (lin){.w = matrix(w, p, out, in), .b = bias ? W(w, "%s.bias", p) : NULL,
                 .id = lp_sd_target_find(&w->targets, p)};
}

static cnv mk_conv(const lp_sd_weights *w, const char *p, int32_t cout, int32_t cin, int32_t k, int32_t stride) {
    return (cnv){.w = matrix(w, p, cout, (int64_t)k * k * cin), .b = W(w, "%s.bias", p), .cin = cin, .cout = cout,
                 .k = k, .stride = stride, .pad = k / 2, .id = lp_sd_target_find(&w->targets, p)};
}

static nrm mk_norm(const lp_sd_weights *w, const char *p) {
    return (nrm){.g = W(w, "%s.weight", p), .b = W(w, "%s.bias", p)};
}

static const char *cat2(char *buf, const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    if (na + nb > 255) nb = na > 255 ? 0 : 255 - na, na = na > 255 ? 255 : na;
    memcpy(buf, a, na);
    memcpy(buf + na, b, nb);
    buf[na + nb] = 0;
    return buf;
}

/* ldm ResBlock (UNet, temb > 0) or the VAE's ResnetBlock (temb 0) */
static res mk_res(const lp_sd_weights *w, const char *p, int32_t cin, int32_t cout, int32_t temb) {
    char b[256];
    res r = {.has_skip = cin != cout};
    if (temb) {
        r.n1 = mk_norm(w, cat2(b, p, ".in_layers.0"));
        r.c1 = mk_conv(w, cat2(b, p, ".in_layers.2"), cout, cin, 3, 1);
        r.emb = mk_lin(w, cat2(b, p, ".emb_layers.1"), cout, temb, true);
        r.n2 = mk_norm(w, cat2(b, p, ".out_layers.0"));
        r.c2 = mk_conv(w, cat2(b, p, ".out_layers.3"), cout, cout, 3, 1);
        if (r.has_skip) r.skip = mk_conv(w, cat2(b, p, ".skip_connection"), cout, cin, 1, 1);
    } else {
        r.n1 = mk_norm(w, cat2(b, p, ".norm1"));
        r.c1 = mk_conv(w, cat2(b, p, ".conv1"), cout, cin, 3, 1);
        r.n2 = mk_norm(w, cat2(b, p, ".norm2"));
        r.c2 = mk_conv(w, cat2(b, p, ".conv2"), cout, cout, 3, 1);
        if (r.has_skip) r.skip = mk_conv(w, cat2(b, p, ".nin_shortcut"), cout, cin, 1, 1);
    }
    r.c1.cin = cin;
    return r;
}

static xf mk_xf(const lp_sd_weights *w, const char *p, int32_t c, int32_t ctx) {
    char b[256], t[256];
    snprintf(t, sizeof t, "%s.transformer_blocks.0.", p);
    return (xf){
        .c = c,
        .gn = mk_norm(w, cat2(b, p, ".norm")),
        .pin = mk_conv(w, cat2(b, p, ".proj_in"), c, c, 1, 1),
        .pout = mk_conv(w, cat2(b, p, ".proj_out"), c, c, 1, 1),
        .ln1 = mk_norm(w, cat2(b, t, "norm1")),
        .ln2 = mk_norm(w, cat2(b, t, "norm2")),
        .ln3 = mk_norm(w, cat2(b, t, "norm3")),
        .q1 = mk_lin(w, cat2(b, t, "attn1.to_q"), c, c, false),
        .k1 = mk_lin(w, cat2(b, t, "attn1.to_k"), c, c, false),
        .v1 = mk_lin(w, cat2(b, t, "attn1.to_v"), c, c, false),
        .o1 = mk_lin(w, cat2(b, t, "attn1.to_out.0"), c, c, true),
        .q2 = mk_lin(w, cat2(b, t, "attn2.to_q"), c, c, false),
        .k2 = mk_lin(w, cat2(b, t, "attn2.to_k"), c, ctx, false),
        .v2 = mk_lin(w, cat2(b, t, "attn2.to_v"), c, ctx, false),
        .o2 = mk_lin(w, cat2(b, t, "attn2.to_out.0"), c, c, true),
        .ff1 = mk_lin(w, cat2(b, t, "ff.net.0.proj"), 8 * c, c, true),
        .ff2 = mk_lin(w, cat2(b, t, "ff.net.2"), c, 4 * c, true),
    };
}

static void build_text_encoder(lp_sd_weights *w) {
    const lp_sd_config *c = &w->cfg;
    const char *T = "cond_stage_model.transformer.text_model.";
    char p[256], b[256];
    int64_t d = c->te_dim;
    w->tok = W(w, "%sembeddings.token_embedding.weight", T);
    w->pos = W(w, "%sembeddings.position_embedding.weight", T);
    for (int l = 0; l < c->te_layers; l++) {
        snprintf(p, sizeof p, "%sencoder.layers.%d.", T, l);
        w->te[l] = (te_layer){
            .ln1 = mk_norm(w, cat2(b, p, "layer_norm1")),
            .ln2 = mk_norm(w, cat2(b, p, "layer_norm2")),
            .q = mk_lin(w, cat2(b, p, "self_attn.q_proj"), d, d, true),
            .k = mk_lin(w, cat2(b, p, "self_attn.k_proj"), d, d, true),
            .v = mk_lin(w, cat2(b, p, "self_attn.v_proj"), d, d, true),
            .o = mk_lin(w, cat2(b, p, "self_attn.out_proj"), d, d, true),
            .fc1 = mk_lin(w, cat2(b, p, "mlp.fc1"), c->te_ffn, d, true),
            .fc2 = mk_lin(w, cat2(b, p, "mlp.fc2"), d, c->te_ffn, true),
        };
    }
    w->te_final = mk_norm(w, cat2(b, T, "final_layer_norm"));
}

static void uop_add(lp_sd_weights *w, uop_kind k, int32_t lvl, int32_t i) {
    w->uops[w->n_uops++] = (uop){.kind = k, .lvl = lvl, .i = i};
}

static void build_unet(lp_sd_weights *w) {
    const lp_sd_config *c = &w->cfg;
    const char *U = "model.diffusion_model.";
    char p[256];
    int32_t ch = c->unet_ch, temb = 4 * ch, cur = ch, skips[64];
    int n_skips = 0, idx = 1;
    w->temb0 = mk_lin(w, cat2(p, U, "time_embed.0"), temb, ch, true);
    w->temb2 = mk_lin(w, cat2(p, U, "time_embed.2"), temb, temb, true);
    w->conv_in = mk_conv(w, cat2(p, U, "input_blocks.0.0"), ch, c->unet_in, 3, 1);
    uop_add(w, U_PUSH, 0, 0);
    skips[n_skips++] = ch;
    for (int l = 0; l < c->unet_levels; l++) {
        int32_t out = ch * c->unet_mult[l];
        for (int r = 0; r < c->unet_res_blocks; r++, idx++) {
            snprintf(p, sizeof p, "%sinput_blocks.%d.0", U, idx);
            w->ur[w->n_ur] = mk_res(w, p, cur, out, temb);
            uop_add(w, U_RES, l, w->n_ur++);
            cur = out;
            if (c->unet_attn[l]) {
                snprintf(p, sizeof p, "%sinput_blocks.%d.1", U, idx);
                w->ux[w->n_ux] = mk_xf(w, p, cur, c->context_dim);
                uop_add(w, U_XF, l, w->n_ux++);
            }
            uop_add(w, U_PUSH, l, 0);
            skips[n_skips++] = cur;
        }
        if (l + 1 < c->unet_levels) {
            snprintf(p, sizeof p, "%sinput_blocks.%d.0.op", U, idx++);
            w->ud[w->n_ud] = mk_conv(w, p, cur, cur, 3, 2);
            uop_add(w, U_DOWN, l, w->n_ud++);
            uop_add(w, U_PUSH, l + 1, 0);
            skips[n_skips++] = cur;
        }
    }
    int L = c->unet_levels - 1;
    w->ur[w->n_ur] = mk_res(w, cat2(p, U, "middle_block.0"), cur, cur, temb);
    uop_add(w, U_RES, L, w->n_ur++);
    w->ux[w->n_ux] = mk_xf(w, cat2(p, U, "middle_block.1"), cur, c->context_dim);
    uop_add(w, U_XF, L, w->n_ux++);
    w->ur[w->n_ur] = mk_res(w, cat2(p, U, "middle_block.2"), cur, cur, temb);
    uop_add(w, U_RES, L, w->n_ur++);
    idx = 0;
    for (int l = L; l >= 0; l--) {
        int32_t out = ch * c->unet_mult[l];
        for (int r = 0; r <= c->unet_res_blocks; r++, idx++) {
            int32_t skip = skips[--n_skips];
            uop_add(w, U_CAT, l, skip);
            snprintf(p, sizeof p, "%soutput_blocks.%d.0", U, idx);
            w->ur[w->n_ur] = mk_res(w, p, cur + skip, out, temb);
            uop_add(w, U_RES, l, w->n_ur++);
            cur = out;
            int k = 1;
            if (c->unet_attn[l]) {
                snprintf(p, sizeof p, "%soutput_blocks.%d.1", U, idx);
                w->ux[w->n_ux] = mk_xf(w, p, cur, c->context_dim);
                uop_add(w, U_XF, l, w->n_ux++);
                k = 2;
            }
            if (l > 0 && r == c->unet_res_blocks) {
                snprintf(p, sizeof p, "%soutput_blocks.%d.%d.conv", U, idx, k);
                w->ud[w->n_ud] = mk_conv(w, p, cur, cur, 3, 1);
                uop_add(w, U_UP, l, w->n_ud++);
            }
        }
    }
    w->out_norm = mk_norm(w, cat2(p, U, "out.0"));
    w->out_conv = mk_conv(w, cat2(p, U, "out.2"), c->unet_out, ch, 3, 1);
}

static vattn mk_vattn(const lp_sd_weights *w, const char *pre, int32_t c) {
    char p[256];
    return (vattn){.n = mk_norm(w, cat2(p, pre, "mid.attn_1.norm")),
                   .q = mk_conv(w, cat2(p, pre, "mid.attn_1.q"), c, c, 1, 1),
                   .k = mk_conv(w, cat2(p, pre, "mid.attn_1.k"), c, c, 1, 1),
                   .v = mk_conv(w, cat2(p, pre, "mid.attn_1.v"), c, c, 1, 1),
                   .o = mk_conv(w, cat2(p, pre, "mid.attn_1.proj_out"), c, c, 1, 1)};
}

/* the middle of either VAE half, at the latent size: res, attention, res */
static int vae_mid(const lp_sd_weights *w, const char *pre, int32_t c, res *rs, int *n_res, vop *ops, int n_ops) {
    char p[256];
    rs[*n_res] = mk_res(w, cat2(p, pre, "mid.block_1"), c, c, 0);
    ops[n_ops++] = (vop){.kind = V_RES, .lvl = 0, .i = (*n_res)++};
    ops[n_ops++] = (vop){.kind = V_ATTN, .lvl = 0, .i = 0};
    rs[*n_res] = mk_res(w, cat2(p, pre, "mid.block_2"), c, c, 0);
    ops[n_ops++] = (vop){.kind = V_RES, .lvl = 0, .i = (*n_res)++};
    return n_ops;
}

static void build_vae_decoder(lp_sd_weights *w) {
    const lp_sd_config *c = &w->cfg;
    const char *D = "first_stage_model.decoder.";
    char p[256];
    int32_t ch = c->vae_ch, cur = ch * c->vae_mult[c->vae_levels - 1];
    w->post_quant = mk_conv(w, "first_stage_model.post_quant_conv", c->vae_z, c->vae_z, 1, 1);
    w->d_in = mk_conv(w, cat2(p, D, "conv_in"), cur, c->vae_z, 3, 1);
    w->va = mk_vattn(w, D, cur);
    w->n_vops = vae_mid(w, D, cur, w->vr, &w->n_vr, w->vops, w->n_vops);
    int lvl = 0;
    for (int l = c->vae_levels - 1; l >= 0; l--) {
        int32_t out = ch * c->vae_mult[l];
        for (int r = 0; r <= c->vae_res_blocks; r++) {
            snprintf(p, sizeof p, "%sup.%d.block.%d", D, l, r);
            w->vr[w->n_vr] = mk_res(w, p, cur, out, 0);
            w->vops[w->n_vops++] = (vop){.kind = V_RES, .lvl = lvl, .i = w->n_vr++};
            cur = out;
        }
        if (l > 0) {
            snprintf(p, sizeof p, "%sup.%d.upsample.conv", D, l);
            w->vd[w->n_vd] = mk_conv(w, p, cur, cur, 3, 1);
            w->vops[w->n_vops++] = (vop){.kind = V_UP, .lvl = lvl++, .i = w->n_vd++};
        }
    }
    w->d_norm = mk_norm(w, cat2(p, D, "norm_out"));
    w->d_out = mk_conv(w, cat2(p, D, "conv_out"), c->vae_img, cur, 3, 1);
}

/* the layout's encoder walk (sd_layout.c), levels counted from the latent size */
static void build_vae_encoder(lp_sd_weights *w) {
    const lp_sd_config *c = &w->cfg;
    const char *E = "first_stage_model.encoder.";
    char p[256];
    int32_t ch = c->vae_ch, cur = ch, z = c->vae_z, L = c->vae_levels;
    w->e_in = mk_conv(w, cat2(p, E, "conv_in"), ch, c->vae_img, 3, 1);
    for (int l = 0; l < L; l++) {
        int32_t out = ch * c->vae_mult[l];
        for (int r = 0; r < c->vae_res_blocks; r++) {
            snprintf(p, sizeof p, "%sdown.%d.block.%d", E, l, r);
            w->er[w->n_er] = mk_res(w, p, cur, out, 0);
            w->eops[w->n_eops++] = (vop){.kind = V_RES, .lvl = L - 1 - l, .i = w->n_er++};
            cur = out;
        }
        if (l + 1 < L) {
            snprintf(p, sizeof p, "%sdown.%d.downsample.conv", E, l);
            w->ed[w->n_ed] = mk_conv(w, p, cur, cur, 3, 2);
            w->ed[w->n_ed].pad = 0, w->ed[w->n_ed].pad_after = 1;
            w->eops[w->n_eops++] = (vop){.kind = V_DOWN, .lvl = L - 1 - l, .i = w->n_ed++};
        }
    }
    w->ea = mk_vattn(w, E, cur);
    w->n_eops = vae_mid(w, E, cur, w->er, &w->n_er, w->eops, w->n_eops);
    w->e_norm = mk_norm(w, cat2(p, E, "norm_out"));
    w->e_out = mk_conv(w, cat2(p, E, "conv_out"), 2 * z, cur, 3, 1);
    w->quant = mk_conv(w, "first_stage_model.quant_conv", 2 * z, 2 * z, 1, 1);
}

/* A weights struct for c's layout with its tables allocated (data filled
 * by the caller). */
static lp_sd_weights *weights_alloc(const lp_sd_config *c, uint32_t weight_type, lp_error *err) {
    if (c->unet_levels * (c->unet_res_blocks + 2) * 2 + 2 > MAX_RES || c->vae_levels * (c->vae_res_blocks + 1) + 2 > MAX_RES ||
        c->unet_levels * (c->unet_res_blocks * 2 + 1) + 1 > MAX_XF)
        return lp_fail(err, "SD model too deep for this build"), NULL;
    lp_sd_weights *w = calloc(1, sizeof *w);
    if (!w) return lp_error_set(err, LP_ERR_NOMEM, "out of memory"), NULL;
    w->cfg = *c;
    w->wtype = weight_type;
    conv_ctx k = {.w = w, .err = err};
    lp_sd_layout(c, count_sizes, &k);
    w->n_tensors = k.at;
    w->f32_bytes = k.floats * (int64_t)sizeof(float);
    w->w8_bytes = k.bytes;
    w->desc = malloc((size_t)k.at * sizeof *w->desc);
    w->data = malloc((size_t)k.at * sizeof *w->data);
    w->is_w8 = calloc((size_t)k.at, sizeof *w->is_w8);
    w->te = calloc((size_t)c->te_layers, sizeof *w->te);
    if (!w->desc || !w->data || !w->is_w8 || !w->te) {
        lp_sd_weights_free(w);
        return lp_error_set(err, LP_ERR_NOMEM, "out of memory"), NULL;
    }
    if (lp_sd_targets_build(c, &w->targets, err)) {
        lp_sd_weights_free(w);
        return NULL;
    }
    return w;
}

/* the graphs' modules over the filled tensors */
static void weights_build(lp_sd_weights *w) {
    build_text_encoder(w);
    build_unet(w);
    build_vae_decoder(w);
    build_vae_encoder(w);
}

lp_sd_weights *lp_sd_weights_create(const lp_sd_model *m, uint32_t weight_type, lp_error *err) {
    if (weight_type != LP_F32 && weight_type != LP_W8)
        return lp_fail(err, "SD weights: type %u (f32 or w8)", (unsigned)weight_type), NULL;
    lp_sd_weights *w = weights_alloc(lp_sd_model_config(m), weight_type, err);
    if (!w) return NULL;
    w->arena = lp_alloc_uninit((size_t)w->f32_bytes);
    w->packed = w->w8_bytes ? lp_alloc_uninit((size_t)w->w8_bytes) : NULL;
    if (!w->arena || (w->w8_bytes && !w->packed)) {
        long long mb = (w->f32_bytes + w->w8_bytes) >> 20;
        lp_sd_weights_free(w);
        return lp_error_set(err, LP_ERR_NOMEM, "out of memory for %lld MB of weights", mb), NULL;
    }
    conv_ctx k = {.m = m, .w = w, .err = err};
    if (lp_sd_layout(&w->cfg, convert_one, &k)) {
        lp_sd_weights_free(w);
        return NULL;
    }
    weights_build(w);
    return w;
}

/* the tensors' names and shapes, for W() */
static int fill_desc(void *ctx, const lp_sd_tensor_desc *t) {
    conv_ctx *c = ctx;
    c->w->desc[c->at++] = *t;
    return 0;
}

static lp_sd_weights *weights_from_compiled(lp_sd_compiled *sc, lp_error *err) {
    lp_sd_weights *w = weights_alloc(&sc->cfg, sc->weight_type, err);
    if (!w) return NULL;
    conv_ctx k = {.w = w, .err = err};
    lp_sd_layout(&w->cfg, fill_desc, &k);
    for (int64_t i = 0; i < w->n_tensors; i++) {
        w->data[i] = (void *)sc->data[i]; /* read-only: the graphs never write weights */
        w->is_w8[i] = sc->is_w8[i];
    }
    w->int8_activations = sc->int8_activations;
    weights_build(w);
    return w;
}

lp_sd_weights *lp_sd_weights_open_memory(const void *data, size_t size, const char *name, lp_error *err) {
    lp_sd_compiled sc;
    if (lp_sd_compiled_parse(data, size, name, &sc, err)) return NULL;
    lp_sd_weights *w = weights_from_compiled(&sc, err);
    lp_sd_compiled_release(&sc);
    return w;
}

lp_sd_weights *lp_sd_weights_open(const char *path, lp_error *err) {
    lp_mapped_file map;
    if (lp_map_file(path, &map, err)) return NULL;
    lp_sd_weights *w = lp_sd_weights_open_memory(map.data, map.size, path, err);
    if (!w) {
        lp_unmap_file(&map);
        return NULL;
    }
    w->map = map;
    return w;
}

int lp_sd_weights_save(const lp_sd_weights *w, bool int8_activations, const char *path, lp_error *err) {
    return lp_sd_compiled_write(path, &w->cfg, w->wtype, int8_activations, (const void *const *)w->data,
                                w->n_tensors, err);
}

uint32_t lp_sd_weights_type(const lp_sd_weights *w) { return w->wtype; }

void lp_sd_weights_evict(const lp_sd_weights *w, int part) {
    static const char *const prefix[3] = {"cond_stage_model.", "model.diffusion_model.", "first_stage_model."};
    if (!w->map.data || part < 0 || part > 2) return;
    const uint8_t *lo = NULL, *hi = NULL;
    for (int64_t i = 0; i < w->n_tensors; i++) { /* a part's tensors lie together, in layout order */
        if (strncmp(w->desc[i].name, prefix[part], strlen(prefix[part]))) continue;
        bool w8;
        int64_t rows, cols;
        const uint8_t *p = w->data[i];
        uint64_t n = lp_sd_tensor_bytes(w->wtype, &w->desc[i], &w8, &rows, &cols);
        if (!lo || p < lo) lo = p;
        if (!hi || p + n > hi) hi = p + n;
    }
    if (lo) lp_mapped_file_evict(&w->map, lo, (size_t)(hi - lo));
}
bool lp_sd_weights_int8_activations(const lp_sd_weights *w) { return w->int8_activations; }

void lp_sd_weights_free(lp_sd_weights *w) {
    if (!w) return;
    lp_free(w->arena);
    lp_free(w->packed);
    lp_unmap_file(&w->map);
    free(w->desc), free(w->data), free(w->is_w8), free(w->te);
    lp_sd_targets_free(&w->targets);
    free(w);
}

const lp_sd_config *lp_sd_weights_config(const lp_sd_weights *w) { return &w->cfg; }

void lp_sd_weights_bytes(const lp_sd_weights *w, int64_t *f32_bytes, int64_t *w8_bytes) {
    *f32_bytes = w->f32_bytes;
    *w8_bytes = w->w8_bytes;
}

/* ---- the graph's buffers ------------------------------------------------------------------------- */

struct lp_sd_graph {
    const lp_sd_weights *w;
    lp_kernels k;
    lp_threadpool *pool;
    int max_batch, lat_h, lat_w;
    float *arena;
    /* UNet / VAE: four activation buffers of s2 floats, one of s8 (the
     * transformer's q k v o and its feed-forward), the skips */
    float *a, *b, *c, *d, *e, *skips, *temb, *temb_s, *embo, *ctx_kv, *conv_scratch, *attn_scratch;
    float *gn_scratch; /* lp_group_norm's partial sums: doubles (64-byte aligned) */
    /* text encoder */
    float *tx, *th, *tqkv, *tff;
    /* adapters: each batch row's (lp_sd_graph_set_loras), and the scratch
     * of their passes (the expand adds into the module's output in place) */
    lp_sd_row_loras rows[MAX_BATCH];
    int n_lora_rows;
    float *lora_t; /* [rows][rank]: an adapter's shrunk rows */
    int64_t lora_t_cap;
};

static int64_t lvl_pixels(const lp_sd_graph *g, int lvl) { return (int64_t)(g->lat_h >> lvl) * (g->lat_w >> lvl); }
static int64_t vlvl_pixels(const lp_sd_graph *g, int lvl) { return ((int64_t)g->lat_h << lvl) * ((int64_t)g->lat_w << lvl); }

static int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

/* lp_conv2d's scratch for any image size: its tile never exceeds 256 pixels */
static size_t conv_scratch_for(const cnv *c) {
    return c->k == 1 && c->stride == 1 ? 0 : (size_t)256 * (size_t)(c->k * c->k) * (size_t)c->cin;
}

/* the largest buffers a VAE op list needs for n images, its first op reading cur channels: s2 (the
 * activations), s8 (the middle attention's q k v o), cs (conv scratch) */
static void size_vae_ops(const lp_sd_graph *g, const vop *ops, int n_ops, const res *rs, const cnv *cv, int64_t cur,
                         int64_t n, int64_t *s2, int64_t *s8, size_t *cs) {
    for (int i = 0; i < n_ops; i++) {
        const vop *o = &ops[i];
        int64_t px = n * vlvl_pixels(g, o->lvl);
        if (o->kind == V_RES) {
            const res *r = &rs[o->i];
            *s2 = imax(*s2, px * imax(r->c1.cin, r->c2.cout));
            *cs = (size_t)imax((int64_t)*cs, imax((int64_t)conv_scratch_for(&r->c1), (int64_t)conv_scratch_for(&r->c2)));
            cur = r->c2.cout;
        } else if (o->kind == V_ATTN) {
            *s8 = imax(*s8, 4 * px * cur);
        } else { /* x2 up (nearest, then the conv), or down */
            *s2 = imax(*s2, o->kind == V_UP ? 4 * px * cur : px * cur);
            *cs = (size_t)imax((int64_t)*cs, (int64_t)conv_scratch_for(&cv[o->i]));
        }
    }
}

lp_sd_graph *lp_sd_graph_create(const lp_sd_weights *w, int max_batch, int lat_h, int lat_w, int n_threads,
                                lp_error *err) {
    const lp_sd_config *c = &w->cfg;
    int f = 1 << (c->unet_levels - 1);
    if (max_batch < 1 || max_batch > MAX_BATCH || lat_h < 1 || lat_w < 1 || lat_h % f || lat_w % f || lat_h > 1024 ||
        lat_w > 1024)
        return lp_fail(err, "SD graph: latent %dx%d (multiples of %d, at most 1024) for batch %d (1..%d)", lat_h,
                       lat_w, f, max_batch, MAX_BATCH), NULL;
    lp_sd_graph *g = calloc(1, sizeof *g);
    if (!g) return lp_error_set(err, LP_ERR_NOMEM, "out of memory"), NULL;
    *g = (lp_sd_graph){.w = w, .max_batch = max_batch, .lat_h = lat_h, .lat_w = lat_w};
    lp_cpu_features cpu;
    lp_cpu_detect(&cpu);
    lp_kernels_init(&g->k, &cpu);
    g->k.int8_activations = false; /* W8A16 until lp_sd_graph_set_int8_activations */
    if (n_threads > 1 && !(g->pool = lp_threadpool_create(n_threads, err))) {
        free(g);
        return NULL;
    }
    /* int8 activations in slices of up to 512 rows (a conv tile is 256) */
    if (w->max_cols && lp_kernels_reserve(&g->k, 512, w->max_cols, err)) {
        lp_sd_graph_free(g);
        return NULL;
    }
    /* sizes from the op lists */
    int64_t n = max_batch, s2 = n * lvl_pixels(g, 0) * imax(c->unet_ch, c->unet_in), s8 = 0, skips = 0;
    size_t cs = imax((int64_t)conv_scratch_for(&w->conv_in), (int64_t)conv_scratch_for(&w->out_conv));
    int32_t cur = c->unet_ch;
    for (int i = 0; i < w->n_uops; i++) {
        const uop *o = &w->uops[i];
        int64_t px = n * lvl_pixels(g, o->lvl);
        switch (o->kind) {
        case U_PUSH: skips += px * cur; break;
        case U_CAT: s2 = imax(s2, px * (cur + o->i)); break;
        case U_RES: {
            const res *r = &w->ur[o->i];
            cur = r->c2.cout;
            s2 = imax(s2, px * imax(r->c1.cin, cur));
            cs = (size_t)imax((int64_t)cs, imax((int64_t)conv_scratch_for(&r->c1), (int64_t)conv_scratch_for(&r->c2)));
            break;
        }
        case U_XF: s8 = imax(s8, px * 8 * cur); break;
        case U_DOWN: cs = (size_t)imax((int64_t)cs, (int64_t)conv_scratch_for(&w->ud[o->i])); break;
        case U_UP:
            s2 = imax(s2, 4 * px * cur);
            cs = (size_t)imax((int64_t)cs, (int64_t)conv_scratch_for(&w->ud[o->i]));
            break;
        }
    }
    cs = (size_t)imax((int64_t)cs, imax((int64_t)conv_scratch_for(&w->d_in), (int64_t)conv_scratch_for(&w->d_out)));
    cs = (size_t)imax((int64_t)cs, imax((int64_t)conv_scratch_for(&w->e_in), (int64_t)conv_scratch_for(&w->e_out)));
    s2 = imax(s2, n * vlvl_pixels(g, c->vae_levels - 1) * imax(c->vae_ch, c->vae_img));
    s2 = imax(s2, n * vlvl_pixels(g, 0) * 2 * c->vae_z); /* the encoder's moments */
    size_vae_ops(g, w->vops, w->n_vops, w->vr, w->vd, c->vae_ch * c->vae_mult[c->vae_levels - 1], n, &s2, &s8, &cs);
    size_vae_ops(g, w->eops, w->n_eops, w->er, w->ed, c->vae_ch, n, &s2, &s8, &cs);
    int64_t te_rows = n * c->te_ctx, xfc = c->unet_ch * 16; /* widest transformer: at most 16x */
    int nt = g->pool ? lp_threadpool_size(g->pool) : 1;
    int64_t attn_d = imax(imax(xfc, c->te_dim), (int64_t)c->vae_ch * c->vae_mult[c->vae_levels - 1]);
    int64_t sizes[] = {
        s2, s2, s2, s2, s8, skips,
        n * 4 * c->unet_ch, n * 4 * c->unet_ch, n * xfc,              /* temb, silu(temb), emb_layers out */
        2 * n * c->te_ctx * xfc,                                       /* cross-attention keys and values */
        (int64_t)cs,
        (int64_t)lp_attention_scratch_floats(nt, attn_d),
        2 * (int64_t)lp_group_norm_scratch_doubles(c->groups),
        te_rows * c->te_dim, te_rows * c->te_dim, 4 * te_rows * c->te_dim, te_rows * c->te_ffn,
    };
    float **ptrs[] = {&g->a, &g->b, &g->c, &g->d, &g->e, &g->skips, &g->temb, &g->temb_s, &g->embo, &g->ctx_kv,
                      &g->conv_scratch, &g->attn_scratch, &g->gn_scratch, &g->tx, &g->th, &g->tqkv, &g->tff};
    int64_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += (sizes[i] + 15) & ~(int64_t)15;
    g->arena = lp_alloc_uninit((size_t)total * sizeof(float));
    if (!g->arena) {
        lp_sd_graph_free(g);
        return lp_error_set(err, LP_ERR_NOMEM, "SD graph: out of memory (%lld MB of buffers)",
                            (long long)(total * 4 >> 20)), NULL;
    }
    total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *ptrs[i] = g->arena + total;
        total += (sizes[i] + 15) & ~(int64_t)15;
    }
    return g;
}

void lp_sd_graph_set_int8_activations(lp_sd_graph *g, bool on) { g->k.int8_activations = on; }

void lp_sd_graph_free(lp_sd_graph *g) {
    if (!g) return;
    lp_free(g->arena);
    lp_free(g->lora_t);
    lp_threadpool_destroy(g->pool);
    lp_kernels_free(&g->k);
    free(g);
}

/* ---- op helpers ------------------------------------------------------------------------------------ */

/* *buf holds at least need floats (contents not kept) */
static int grow_scratch(float **buf, int64_t *cap, int64_t need) {
    if (need <= *cap) return 0;
    lp_free(*buf);
    *cap = (*buf = lp_alloc_uninit((size_t)need * sizeof(float))) ? need : 0;
    return *buf ? 0 : -1;
}

int lp_sd_graph_set_loras(lp_sd_graph *g, const lp_sd_row_loras *rows, int n, lp_error *err) {
    const lp_sd_config *c = &g->w->cfg;
    if (n < 0 || n > g->max_batch) return lp_fail(err, "SD adapters for %d rows (0..%d)", n, g->max_batch);
    int32_t rank = 0;
    for (int i = 0; i < n; i++) {
        if (rows[i].n < 0 || rows[i].n > LP_SD_MAX_ROW_LORAS)
            return lp_fail(err, "SD adapters: row %d has %d (0..%d)", i, rows[i].n, LP_SD_MAX_ROW_LORAS);
        for (int j = 0; j < rows[i].n; j++) {
            const lp_sd_lora_use *u = &rows[i].use[j];
            if (!u->lora || !isfinite(u->scale))
                return lp_fail(err, "SD adapters: row %d, adapter %d: none, or its scale is not a number", i, j);
            /* lp_sd_config has no padding: int32 fields and 4 bools */
            if (memcmp(lp_sd_lora_config(u->lora), c, sizeof *c))
                return lp_fail(err, "SD adapters: row %d, adapter %d was loaded for another model", i, j);
            if (lp_sd_lora_max_rank(u->lora) > rank) rank = lp_sd_lora_max_rank(u->lora);
        }
    }
    int64_t rows_max = (int64_t)g->max_batch * imax((int64_t)g->lat_h * g->lat_w, c->te_ctx);
    if (rank && grow_scratch(&g->lora_t, &g->lora_t_cap, rows_max * rank)) {
        g->n_lora_rows = 0;
        return lp_error_set(err, LP_ERR_NOMEM, "SD adapters: out of memory");
    }
    if (n) memcpy(g->rows, rows, sizeof *rows * (size_t)n);
    g->n_lora_rows = n;
    return 0;
}

int lp_sd_graph_added_tokens(const lp_sd_graph *g, int row) {
    int n = 0;
    for (int p = 0; row >= 0 && row < g->n_lora_rows && p < g->rows[row].n; p++) n += lp_sd_lora_n_tokens(g->rows[row].use[p].lora);
    return n;
}

const float *lp_sd_graph_added_token(const lp_sd_graph *g, int row, int32_t j) {
    for (int p = 0; row >= 0 && row < g->n_lora_rows && p < g->rows[row].n && j >= 0; p++) {
        const lp_sd_lora *l = g->rows[row].use[p].lora;
        if (j < lp_sd_lora_n_tokens(l)) return lp_sd_lora_token_embedding(l, j);
        j -= lp_sd_lora_n_tokens(l);
    }
    return NULL;
}

/* y[rows][out] += up (s down x) for rows of n_img images; conv: the
 * module's shape when it is a conv (the down projection is a conv of the
 * same kernel and stride, up a 1x1), else x is rows of the module's inputs */
static void delta_run(lp_sd_graph *g, const lp_sd_delta *d, float s, int n_img, int64_t rows, const float *x,
                      const lp_conv2d_shape *conv, float *y, int64_t out) {
    const lp_sd_target *t = &g->w->targets.t[d->target];
    lp_conv2d_shape cs = conv ? *conv : (lp_conv2d_shape){.h = 1, .w = (int32_t)rows, .cin = t->in, .kh = 1, .kw = 1, .stride = 1};
    cs.n = conv ? n_img : 1;
    lp_lowrank_down(&g->k, g->pool, &cs, d->down, d->rank, s, x, g->lora_t);
    lp_lowrank_up(&g->k, g->pool, rows, d->rank, g->lora_t, d->up, out, y, out);
}

static bool same_use(const lp_sd_graph *g, int i, int j, int p) {
    const lp_sd_row_loras *a = &g->rows[i], *b = &g->rows[j];
    return j < g->n_lora_rows && p < b->n && a->use[p].lora == b->use[p].lora && a->use[p].scale == b->use[p].scale;
}

/* Module id's adapter deltas for every image of the batch (x_img: floats
 * of one image's input; rows / n rows of out floats are one image's output). Each image adds its adapters in
 * its list's order; consecutive images with the same adapter at the same
 * place share one pass, which gives each the bits it gets alone (the
 * kernels are batch invariant). */
static void lora_apply(lp_sd_graph *g, int32_t id, int n, int64_t rows, const float *x, int64_t x_img,
                       const lp_conv2d_shape *conv, float *y, int64_t out) {
    if (id < 0 || !g->n_lora_rows) return;
    int64_t per = rows / n;
    for (int p = 0; p < LP_SD_MAX_ROW_LORAS; p++)
        for (int i = 0; i < n && i < g->n_lora_rows;) {
            if (p >= g->rows[i].n) {
                i++;
                continue;
            }
            int j = i + 1;
            while (j < n && same_use(g, i, j, p)) j++;
            const lp_sd_lora_use *u = &g->rows[i].use[p];
            const lp_sd_delta *d = lp_sd_lora_delta(u->lora, id);
            if (d && u->scale != 0)
                delta_run(g, d, d->scale * u->scale, j - i, (j - i) * per, x + i * x_img, conv, y + i * per * out, out);
            i = j;
        }
}

/* rows = n images x rows per image */
static void run_lin(lp_sd_graph *g, const lin *l, const float *x, int64_t rows, int n, float *y) {
    lp_matmul(&g->k, g->pool, &l->w, x, l->w.cols, rows, y, l->w.rows);
    if (l->b)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < l->w.rows; i++) y[r * l->w.rows + i] += l->b[i];
    lora_apply(g, l->id, n, rows, x, rows / n * l->w.cols, NULL, y, l->w.rows);
}

static void run_conv(lp_sd_graph *g, const cnv *c, const float *x, int n, int h, int w, float *y) {
    lp_conv2d_shape s = {.n = n, .h = h, .w = w, .cin = c->cin, .cout = c->cout, .kh = c->k, .kw = c->k,
                         .stride = c->stride, .pad = c->pad, .pad_after = c->pad_after};
    lp_conv2d(&g->k, g->pool, &s, &c->w, c->b, x, y, g->conv_scratch);
    if (c->id >= 0 && g->n_lora_rows) {
        int64_t opx = (int64_t)lp_conv2d_out_h(&s) * lp_conv2d_out_w(&s);
        lora_apply(g, c->id, n, n * opx, x, (int64_t)h * w * c->cin, &s, y, c->cout);
    }
}

static void run_gn(const lp_sd_graph *g, const nrm *nm, const float *x, float *y, int n, int64_t px, int64_t c,
                   float eps, bool silu) {
    for (int i = 0; i < n; i++)
        lp_group_norm(g->pool, x + i * px * c, y + i * px * c, px, c, g->w->cfg.groups, nm->g, nm->b, eps, silu,
                      (double *)(void *)g->gn_scratch);
}

static void add(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

/* One head group over each image: q rows [px][c], keys/values [nk][c]. */
static void run_attn(lp_sd_graph *g, const float *q, const float *k, const float *v, float *o, int n, int64_t nq,
                     int64_t nk, int64_t c, int heads, bool causal) {
    int64_t d = c / heads;
    lp_attn_shape s = {.nq = nq, .nk = nk, .heads = heads, .d = d, .q_stride = c, .k_stride = c, .v_stride = c,
                       .out_stride = c, .scale = 1.0f / sqrtf((float)d), .causal = causal};
    for (int i = 0; i < n; i++)
        lp_attention_tiled(&g->k, g->pool, &s, q + i * nq * c, k + i * nk * c, v + i * nk * c, o + i * nq * c,
                           g->attn_scratch);
}

/* ---- text encoder ------------------------------------------------------------------------------------ */

int lp_sd_text_encode(lp_sd_graph *g, const int32_t *ids, int batch, int clip_skip, float *out, lp_error *err) {
    const lp_sd_weights *w = g->w;
    const lp_sd_config *c = &w->cfg;
    if (batch < 1 || batch > g->max_batch) return lp_fail(err, "text encoder: batch %d (1..%d)", batch, g->max_batch);
    if (clip_skip < 1 || clip_skip > c->te_layers)
        return lp_fail(err, "text encoder: clip skip %d (1..%d)", clip_skip, c->te_layers);
    int64_t T = c->te_ctx, D = c->te_dim, rows = batch * T;
    for (int64_t r = 0; r < rows; r++) {
        int32_t id = ids[r];
        const float *e = id >= 0 && id < c->te_vocab ? w->tok + (int64_t)id * D
                         : id >= c->te_vocab ? lp_sd_graph_added_token(g, (int)(r / T), id - c->te_vocab) : NULL;
        if (!e)
            return lp_fail(err, "text encoder: token id %d (vocabulary %d, and %d tokens of the row's adapters)", id,
                           c->te_vocab, lp_sd_graph_added_tokens(g, (int)(r / T)));
        for (int64_t i = 0; i < D; i++) g->tx[r * D + i] = e[i] + w->pos[(r % T) * D + i];
    }
    float *q = g->tqkv, *k = q + rows * D, *v = k + rows * D, *o = v + rows * D;
    for (int l = 0; l < c->te_layers - (clip_skip - 1); l++) {
        const te_layer *L = &w->te[l];
        lp_layer_norm(g->th, g->tx, rows, D, L->ln1.g, L->ln1.b, LN_EPS);
        run_lin(g, &L->q, g->th, rows, batch, q);
        run_lin(g, &L->k, g->th, rows, batch, k);
        run_lin(g, &L->v, g->th, rows, batch, v);
        run_attn(g, q, k, v, o, batch, T, T, D, c->te_heads, true);
        run_lin(g, &L->o, o, rows, batch, g->th);
        add(g->tx, g->th, rows * D);
        lp_layer_norm(g->th, g->tx, rows, D, L->ln2.g, L->ln2.b, LN_EPS);
        run_lin(g, &L->fc1, g->th, rows, batch, g->tff);
        lp_quick_gelu(g->tff, rows * c->te_ffn);
        run_lin(g, &L->fc2, g->tff, rows, batch, g->th);
        add(g->tx, g->th, rows * D);
    }
    lp_layer_norm(out, g->tx, rows, D, w->te_final.g, w->te_final.b, LN_EPS);
    return 0;
}

/* ---- UNet ---------------------------------------------------------------------------------------------- */

/* x [n][px][cin] -> out [n][px][cout]; t1, t2 scratch of n*px*max(cin, cout). embo [n][cout]: the block's
 * time-embedding projection (NULL in the VAE). */
static void run_res(lp_sd_graph *g, const res *r, const float *x, float *out, float *t1, float *t2, int n, int h,
                    int w, const float *embo, float eps) {
    int64_t px = (int64_t)h * w, cin = r->c1.cin, cout = r->c2.cout;
    run_gn(g, &r->n1, x, t1, n, px, cin, eps, true);
    run_conv(g, &r->c1, t1, n, h, w, t2);
    if (embo)
        for (int i = 0; i < n; i++)
            for (int64_t p = 0; p < px; p++) add(t2 + (i * px + p) * cout, embo + i * cout, cout);
    run_gn(g, &r->n2, t2, t1, n, px, cout, eps, true);
    run_conv(g, &r->c2, t1, n, h, w, out);
    if (r->has_skip) {
        run_conv(g, &r->skip, x, n, h, w, t2);
        add(out, t2, n * px * cout);
    } else {
        add(out, x, n * px * cout);
    }
}

/* SpatialTransformer: x [n][px][c] -> out; c, d scratch, e the big one. */
static void run_xf(lp_sd_graph *g, const xf *t, const float *x, float *out, float *sc, float *sd, float *e, int n,
                   int h, int w, const float *ctx) {
    const lp_sd_config *cf = &g->w->cfg;
    int64_t px = (int64_t)h * w, c = t->c, rows = n * px, T = cf->te_ctx;
    int heads = cf->unet_heads;
    float *q = e, *k = e + rows * c, *v = k + rows * c, *o = v + rows * c;
    run_gn(g, &t->gn, x, sc, n, px, c, GN_EPS_XF, false);
    run_conv(g, &t->pin, sc, n, h, w, sd);
    /* self-attention */
    lp_layer_norm(sc, sd, rows, c, t->ln1.g, t->ln1.b, LN_EPS);
    run_lin(g, &t->q1, sc, rows, n, q);
    run_lin(g, &t->k1, sc, rows, n, k);
    run_lin(g, &t->v1, sc, rows, n, v);
    run_attn(g, q, k, v, o, n, px, px, c, heads, false);
    run_lin(g, &t->o1, o, rows, n, sc);
    add(sd, sc, rows * c);
    /* cross-attention over the row's text context */
    float *kc = g->ctx_kv, *vc = kc + n * T * c;
    lp_layer_norm(sc, sd, rows, c, t->ln2.g, t->ln2.b, LN_EPS);
    run_lin(g, &t->q2, sc, rows, n, q);
    run_lin(g, &t->k2, ctx, n * T, n, kc);
    run_lin(g, &t->v2, ctx, n * T, n, vc);
    run_attn(g, q, kc, vc, o, n, px, T, c, heads, false);
    run_lin(g, &t->o2, o, rows, n, sc);
    add(sd, sc, rows * c);
    /* GEGLU feed-forward */
    lp_layer_norm(sc, sd, rows, c, t->ln3.g, t->ln3.b, LN_EPS);
    run_lin(g, &t->ff1, sc, rows, n, e);
    lp_geglu(e, 4 * c, e, rows, 4 * c);
    run_lin(g, &t->ff2, e, rows, n, sc);
    add(sd, sc, rows * c);
    run_conv(g, &t->pout, sd, n, h, w, out);
    add(out, x, rows * c);
}

/* ldm's timestep_embedding: [cos(t f_i), sin(t f_i)], f_i = 10000^(-i / half) */
static void timestep_embedding(const float *t, int n, int32_t dim, float *out) {
    int32_t half = dim / 2;
    for (int b = 0; b < n; b++)
        for (int32_t i = 0; i < half; i++) {
            double f = exp(-log(10000.0) * i / half), a = (double)t[b] * f;
            out[b * dim + i] = (float)cos(a);
            out[b * dim + half + i] = (float)sin(a);
        }
}

int lp_sd_unet(lp_sd_graph *g, const float *x, const float *t, const float *ctx, int batch, float *eps,
               lp_error *err) {
    const lp_sd_weights *w = g->w;
    const lp_sd_config *c = &w->cfg;
    if (batch < 1 || batch > g->max_batch) return lp_fail(err, "UNet: batch %d (1..%d)", batch, g->max_batch);
    int n = batch, ch = c->unet_ch;
    /* time embedding: the sinusoid, linear, SiLU, linear; every ResBlock then takes SiLU of it */
    timestep_embedding(t, n, ch, g->temb_s);
    run_lin(g, &w->temb0, g->temb_s, n, n, g->temb);
    lp_silu(g->temb, n * 4 * ch);
    run_lin(g, &w->temb2, g->temb, n, n, g->temb_s);
    lp_silu(g->temb_s, n * 4 * ch);

    float *cur = g->a, *nxt = g->b;
    int32_t cc = ch;
    run_conv(g, &w->conv_in, x, n, g->lat_h, g->lat_w, cur);
    /* skips: stacked in push order, each [n][px][ch] */
    int64_t skip_off[64], top = 0;
    int32_t skip_ch[64];
    int n_sk = 0;
    for (int i = 0; i < w->n_uops; i++) {
        const uop *o = &w->uops[i];
        int h = g->lat_h >> o->lvl, wd = g->lat_w >> o->lvl;
        int64_t px = (int64_t)h * wd;
        switch (o->kind) {
        case U_PUSH:
            memcpy(g->skips + top, cur, sizeof(float) * (size_t)(n * px * cc));
            skip_off[n_sk] = top;
            skip_ch[n_sk++] = cc;
            top += n * px * cc;
            break;
        case U_CAT: { /* [h | skip] per pixel, h first (torch.cat([h, hs.pop()], 1)) */
            int32_t sc = skip_ch[--n_sk];
            const float *s = g->skips + skip_off[n_sk];
            top = skip_off[n_sk];
            for (int64_t p = 0; p < n * px; p++) {
                memcpy(nxt + p * (cc + sc), cur + p * cc, sizeof(float) * (size_t)cc);
                memcpy(nxt + p * (cc + sc) + cc, s + p * sc, sizeof(float) * (size_t)sc);
            }
            cc += sc;
            float *tmp = cur;
            cur = nxt, nxt = tmp;
            break;
        }
        case U_RES: {
            const res *r = &w->ur[o->i];
            run_lin(g, &r->emb, g->temb_s, n, n, g->embo);
            run_res(g, r, cur, nxt, g->c, g->d, n, h, wd, g->embo, GN_EPS_UNET);
            cc = r->c2.cout;
            float *tmp = cur;
            cur = nxt, nxt = tmp;
            break;
        }
        case U_XF: {
            run_xf(g, &w->ux[o->i], cur, nxt, g->c, g->d, g->e, n, h, wd, ctx);
            float *tmp = cur;
            cur = nxt, nxt = tmp;
            break;
        }
        case U_DOWN: {
            run_conv(g, &w->ud[o->i], cur, n, h, wd, nxt);
            float *tmp = cur;
            cur = nxt, nxt = tmp;
            break;
        }
        case U_UP:
            for (int b = 0; b < n; b++)
                lp_upsample_nearest2x(cur + b * px * cc, nxt + b * 4 * px * cc, h, wd, cc);
            run_conv(g, &w->ud[o->i], nxt, n, 2 * h, 2 * wd, cur);
            break;
        }
    }
    int64_t px = (int64_t)g->lat_h * g->lat_w;
    run_gn(g, &w->out_norm, cur, nxt, n, px, cc, GN_EPS_UNET, true);
    run_conv(g, &w->out_conv, nxt, n, g->lat_h, g->lat_w, eps);
    return 0;
}

/* ---- VAE ------------------------------------------------------------------------------------------------ */

/* the middle's attention: one head over every pixel, x [n][h*w][c] -> out (x + attention) */
static void run_vattn(lp_sd_graph *g, const vattn *a, const float *x, float *out, int n, int h, int w, int64_t c) {
    int64_t p = (int64_t)h * w;
    float *q = g->e, *k = q + n * p * c, *v = k + n * p * c, *ao = v + n * p * c;
    run_gn(g, &a->n, x, g->c, n, p, c, GN_EPS_XF, false);
    run_conv(g, &a->q, g->c, n, h, w, q);
    run_conv(g, &a->k, g->c, n, h, w, k);
    run_conv(g, &a->v, g->c, n, h, w, v);
    run_attn(g, q, k, v, ao, n, p, p, c, 1, false);
    run_conv(g, &a->o, ao, n, h, w, out);
    add(out, x, n * p * c);
}

/* A VAE half's op list over n images from cur (g->a or g->b, *cc
 * channels): returns the buffer of the result (the other one is free),
 * *cc its channels. */
static float *run_vae_ops(lp_sd_graph *g, const vop *ops, int n_ops, const res *rs, const vattn *attn, const cnv *cv,
                          float *cur, int n, int32_t *cc) {
    float *nxt = cur == g->a ? g->b : g->a;
    for (int i = 0; i < n_ops; i++) {
        const vop *o = &ops[i];
        int hh = g->lat_h << o->lvl, ww = g->lat_w << o->lvl;
        int64_t p = (int64_t)hh * ww;
        if (o->kind == V_RES) {
            run_res(g, &rs[o->i], cur, nxt, g->c, g->d, n, hh, ww, NULL, GN_EPS_XF);
            *cc = rs[o->i].c2.cout;
        } else if (o->kind == V_ATTN) {
            run_vattn(g, attn, cur, nxt, n, hh, ww, *cc);
        } else if (o->kind == V_UP) { /* nearest x2, then the conv */
            for (int b = 0; b < n; b++) lp_upsample_nearest2x(cur + b * p * *cc, g->c + b * 4 * p * *cc, hh, ww, *cc);
            run_conv(g, &cv[o->i], g->c, n, 2 * hh, 2 * ww, nxt);
        } else {
            run_conv(g, &cv[o->i], cur, n, hh, ww, nxt);
        }
        float *tmp = cur;
        cur = nxt, nxt = tmp;
    }
    return cur;
}

int lp_sd_vae_encode(lp_sd_graph *g, const float *img, int batch, float *z, lp_error *err) {
    const lp_sd_weights *w = g->w;
    const lp_sd_config *c = &w->cfg;
    if (batch < 1 || batch > g->max_batch) return lp_fail(err, "VAE encoder: batch %d (1..%d)", batch, g->max_batch);
    int n = batch, f = 1 << (c->vae_levels - 1);
    run_conv(g, &w->e_in, img, n, g->lat_h * f, g->lat_w * f, g->a);
    int32_t cc = w->e_in.cout;
    float *cur = run_vae_ops(g, w->eops, w->n_eops, w->er, &w->ea, w->ed, g->a, n, &cc);
    float *nxt = cur == g->a ? g->b : g->a;
    int64_t px = (int64_t)g->lat_h * g->lat_w, zc = c->vae_z;
    run_gn(g, &w->e_norm, cur, nxt, n, px, cc, GN_EPS_XF, true);
    run_conv(g, &w->e_out, nxt, n, g->lat_h, g->lat_w, cur);
    run_conv(g, &w->quant, cur, n, g->lat_h, g->lat_w, nxt); /* [n][px][mean | log-variance] */
    for (int64_t i = 0; i < n * px; i++)
        for (int64_t ch = 0; ch < zc; ch++) z[i * zc + ch] = nxt[i * 2 * zc + ch] * LP_SD_VAE_SCALE;
    return 0;
}

int lp_sd_vae_decode(lp_sd_graph *g, const float *z, int batch, float *img, lp_error *err) {
    const lp_sd_weights *w = g->w;
    const lp_sd_config *c = &w->cfg;
    if (batch < 1 || batch > g->max_batch) return lp_fail(err, "VAE: batch %d (1..%d)", batch, g->max_batch);
    int n = batch, h = g->lat_h, wd = g->lat_w;
    int64_t px = (int64_t)h * wd;
    for (int64_t i = 0; i < n * px * c->vae_z; i++) g->c[i] = z[i] / LP_SD_VAE_SCALE;
    run_conv(g, &w->post_quant, g->c, n, h, wd, g->d);
    run_conv(g, &w->d_in, g->d, n, h, wd, g->a);
    int32_t cc = w->d_in.cout;
    float *cur = run_vae_ops(g, w->vops, w->n_vops, w->vr, &w->va, w->vd, g->a, n, &cc);
    float *nxt = cur == g->a ? g->b : g->a;
    int f = 1 << (c->vae_levels - 1);
    int64_t op = px * f * f;
    run_gn(g, &w->d_norm, cur, nxt, n, op, cc, GN_EPS_XF, true);
    run_conv(g, &w->d_out, nxt, n, h * f, wd * f, img);
    return 0;
}
