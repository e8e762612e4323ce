/* The SD 1.x single-file checkpoint's tensors as a function of the
 * configuration (see sd.h). Names follow the original CompVis/ldm modules:
 * ResBlock in_layers.0 (GroupNorm) .2 (conv), emb_layers.1, out_layers.0 .3,
 * skip_connection; SpatialTransformer norm, proj_in (1x1 conv), one
 * BasicTransformerBlock (attn1 self, attn2 cross, ff GEGLU, norm1-3),
 * proj_out; the VAE's ResnetBlock norm1 conv1 norm2 conv2 nin_shortcut and
 * AttnBlock norm q k v proj_out. */
#include "sd.h"

#include "../base/dtype.h"
#include "../kernels/kernels.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

lp_sd_config lp_sd_config_sd15(void) {
    return (lp_sd_config){
        .te_vocab = 49408, .te_ctx = 77, .te_dim = 768, .te_layers = 12, .te_heads = 12, .te_ffn = 3072,
        .unet_in = 4, .unet_out = 4, .unet_ch = 320, .unet_levels = 4, .unet_mult = {1, 2, 4, 4},
        .unet_res_blocks = 2, .unet_attn = {true, true, true, false}, .unet_heads = 8, .context_dim = 768,
        .vae_img = 3, .vae_z = 4, .vae_ch = 128, .vae_levels = 4, .vae_mult = {1, 2, 4, 4}, .vae_res_blocks = 2,
        .groups = 32,
    };
}

lp_sd_config lp_sd_config_tiny(void) {
    return (lp_sd_config){
        .te_vocab = 49408, .te_ctx = 77, .te_dim = 32, .te_layers = 2, .te_heads = 2, .te_ffn = 64,
        .unet_in = 4, .unet_out = 4, .unet_ch = 32, .unet_levels = 2, .unet_mult = {1, 2},
        .unet_res_blocks = 1, .unet_attn = {true, false}, .unet_heads = 2, .context_dim = 32,
        .vae_img = 3, .vae_z = 4, .vae_ch = 32, .vae_levels = 4, .vae_mult = {1, 1, 2, 2}, .vae_res_blocks = 1,
        .groups = 32,
    };
}

int lp_sd_config_check(const lp_sd_config *c, lp_error *err) {
    if (c->te_vocab < 1 || c->te_ctx < 2 || c->te_dim < 1 || c->te_layers < 1 || c->te_heads < 1 ||
        c->te_ffn < 1 || c->te_dim % c->te_heads || c->te_vocab > (1 << 24) || c->te_ctx > 4096 ||
        c->te_dim > 65536 || c->te_ffn > (1 << 20) || c->te_layers > 256)
        return lp_fail(err, "text encoder: bad sizes (vocab %d, context %d, width %d, layers %d, heads %d, ffn %d)",
                       c->te_vocab, c->te_ctx, c->te_dim, c->te_layers, c->te_heads, c->te_ffn);
    if (c->groups < 1 || c->groups > 1024) return lp_fail(err, "GroupNorm groups %d", c->groups);
    if (c->unet_levels < 1 || c->unet_levels > LP_SD_MAX_LEVELS || c->unet_res_blocks < 1 ||
        c->unet_res_blocks > 8 || c->unet_in < 1 || c->unet_out < 1 || c->unet_in > 64 || c->unet_out > 64 ||
        c->unet_ch < 1 || c->unet_ch > 8192 || c->unet_heads < 1 || c->context_dim != c->te_dim)
        return lp_fail(err, "UNet: bad sizes (levels %d, res blocks %d, channels %d, heads %d, context %d)",
                       c->unet_levels, c->unet_res_blocks, c->unet_ch, c->unet_heads, c->context_dim);
    for (int l = 0; l < c->unet_levels; l++) {
        int64_t ch = (int64_t)c->unet_ch * c->unet_mult[l];
        if (c->unet_mult[l] < 1 || c->unet_mult[l] > 16 || ch % c->groups || ch % c->unet_heads)
            return lp_fail(err, "UNet level %d: %lld channels (multiple of %d groups and %d heads needed)", l,
                           (long long)ch, c->groups, c->unet_heads);
    }
    if (c->unet_ch % c->groups) return lp_fail(err, "UNet: %d channels, not a multiple of %d groups", c->unet_ch, c->groups);
    if (c->vae_levels < 1 || c->vae_levels > LP_SD_MAX_LEVELS || c->vae_res_blocks < 1 || c->vae_res_blocks > 8 ||
        c->vae_img < 1 || c->vae_img > 16 || c->vae_z < 1 || c->vae_z > 64 || c->vae_ch < 1 || c->vae_ch > 8192 ||
        (c->unet_in != c->vae_z && c->unet_in != 2 * c->vae_z + 1) || c->unet_out != c->vae_z ||
        c->vae_ch % c->groups)
        return lp_fail(err,
                       "VAE: bad sizes (levels %d, res blocks %d, channels %d, latent %d for a UNet of %d channels "
                       "in, %d out)",
                       c->vae_levels, c->vae_res_blocks, c->vae_ch, c->vae_z, c->unet_in, c->unet_out);
    for (int l = 0; l < c->vae_levels; l++)
        if (c->vae_mult[l] < 1 || c->vae_mult[l] > 16 || ((int64_t)c->vae_ch * c->vae_mult[l]) % c->groups)
            return lp_fail(err, "VAE level %d: multiplier %d", l, c->vae_mult[l]);
    return 0;
}

/* ---- diffusers names ---------------------------------------------------------------------------- */

/* a ResBlock's ldm part name -> diffusers' */
static const char *unet_res_rest(const char *r) {
    static const char *const map[][2] = {{".in_layers.0", ".norm1"},
                                         {".out_layers.0", ".norm2"},
                                         {".in_layers.2", ".conv1"},
                                         {".out_layers.3", ".conv2"},
                                         {".emb_layers.1", ".time_emb_proj"},
                                         {".skip_connection", ".conv_shortcut"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(r, map[i][0])) return map[i][1];
    return NULL;
}

/* The diffusers name of a UNet module (s: the ldm name after
 * "model.diffusion_model."): down_blocks.L.{resnets,attentions}.J,
 * .downsamplers.0.conv, mid_block, up_blocks.I (I = levels - 1 - level). */
static bool unet_diffusers(const lp_sd_config *c, const char *s, char *out, size_t cap) {
    const int R = c->unet_res_blocks, L = c->unet_levels;
    static const char *const fixed[][2] = {{"time_embed.0", "time_embedding.linear_1"},
                                           {"time_embed.2", "time_embedding.linear_2"},
                                           {"input_blocks.0.0", "conv_in"},
                                           {"out.0", "conv_norm_out"},
                                           {"out.2", "conv_out"}};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (!strcmp(s, fixed[i][0])) return snprintf(out, cap, "%s", fixed[i][1]) < (int)cap;
    int n, m, len = 0;
    const char *rr;
    if (sscanf(s, "input_blocks.%d.%d%n", &n, &m, &len) == 2 && len > 0 && n >= 1) {
        const char *rest = s + len;
        int l = (n - 1) / (R + 1), j = (n - 1) % (R + 1);
        if (j == R) return m == 0 && !strcmp(rest, ".op") && snprintf(out, cap, "down_blocks.%d.downsamplers.0.conv", l) < (int)cap;
        if (m == 0) return (rr = unet_res_rest(rest)) && snprintf(out, cap, "down_blocks.%d.resnets.%d%s", l, j, rr) < (int)cap;
        return m == 1 && snprintf(out, cap, "down_blocks.%d.attentions.%d%s", l, j, rest) < (int)cap;
    }
    if (sscanf(s, "middle_block.%d%n", &m, &len) == 1 && len > 0) {
        const char *rest = s + len;
        if (m == 1) return snprintf(out, cap, "mid_block.attentions.0%s", rest) < (int)cap;
        return (m == 0 || m == 2) && (rr = unet_res_rest(rest)) && snprintf(out, cap, "mid_block.resnets.%d%s", m / 2, rr) < (int)cap;
    }
    if (sscanf(s, "output_blocks.%d.%d%n", &n, &m, &len) == 2 && len > 0 && n >= 0) {
        const char *rest = s + len;
        int i = n / (R + 1), j = n % (R + 1), level = L - 1 - i;
        if (level < 0) return false;
        if (!strcmp(rest, ".conv") && m == (c->unet_attn[level] ? 2 : 1))
            return snprintf(out, cap, "up_blocks.%d.upsamplers.0.conv", i) < (int)cap;
        if (m == 0) return (rr = unet_res_rest(rest)) && snprintf(out, cap, "up_blocks.%d.resnets.%d%s", i, j, rr) < (int)cap;
        return m == 1 && snprintf(out, cap, "up_blocks.%d.attentions.%d%s", i, j, rest) < (int)cap;
    }
    return false;
}

/* a VAE ResnetBlock's or middle attention's ldm part -> diffusers' (the attention's newer names) */
static const char *vae_rest(const char *r) {
    static const char *const map[][2] = {{".norm1", ".norm1"},          {".conv1", ".conv1"},
                                         {".norm2", ".norm2"},          {".conv2", ".conv2"},
                                         {".nin_shortcut", ".conv_shortcut"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(r, map[i][0])) return map[i][1];
    return NULL;
}

/* The diffusers name of a VAE module (s: after "first_stage_model."):
 * {encoder,decoder}.{conv_in,conv_norm_out,conv_out}, encoder.down_blocks.L,
 * decoder.up_blocks.I (I = levels - 1 - level), mid_block.{resnets.0,
 * attentions.0, resnets.1}, quant_conv, post_quant_conv. */
static bool vae_diffusers(const lp_sd_config *c, const char *s, char *out, size_t cap) {
    static const char *const fixed[][2] = {{"quant_conv", "quant_conv"},          {"post_quant_conv", "post_quant_conv"},
                                           {"encoder.conv_in", "encoder.conv_in"}, {"encoder.norm_out", "encoder.conv_norm_out"},
                                           {"encoder.conv_out", "encoder.conv_out"}, {"decoder.conv_in", "decoder.conv_in"},
                                           {"decoder.norm_out", "decoder.conv_norm_out"},
                                           {"decoder.conv_out", "decoder.conv_out"}};
    static const char *const attn[][2] = {{"norm", "group_norm"}, {"q", "to_q"}, {"k", "to_k"}, {"v", "to_v"},
                                          {"proj_out", "to_out.0"}};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (!strcmp(s, fixed[i][0])) return snprintf(out, cap, "%s", fixed[i][1]) < (int)cap;
    const char *half = !strncmp(s, "encoder.", 8) ? "encoder" : !strncmp(s, "decoder.", 8) ? "decoder" : NULL;
    if (!half) return false;
    s += 8;
    int l, r, len = 0;
    const char *rr;
    if (!strncmp(s, "mid.attn_1.", 11)) {
        for (size_t i = 0; i < sizeof attn / sizeof attn[0]; i++)
            if (!strcmp(s + 11, attn[i][0]))
                return snprintf(out, cap, "%s.mid_block.attentions.0.%s", half, attn[i][1]) < (int)cap;
        return false;
    }
    if (sscanf(s, "mid.block_%d%n", &r, &len) == 1 && len > 0 && (r == 1 || r == 2))
        return (rr = vae_rest(s + len)) && snprintf(out, cap, "%s.mid_block.resnets.%d%s", half, r - 1, rr) < (int)cap;
    bool enc = half[0] == 'e';
    if (sscanf(s, enc ? "down.%d%n" : "up.%d%n", &l, &len) != 1 || len <= 0 || l < 0 || l >= c->vae_levels)
        return false;
    s += len;
    int i = enc ? l : c->vae_levels - 1 - l;
    const char *blocks = enc ? "down_blocks" : "up_blocks";
    if (!strcmp(s, enc ? ".downsample.conv" : ".upsample.conv"))
        return snprintf(out, cap, "%s.%s.%d.%s.0.conv", half, blocks, i, enc ? "downsamplers" : "upsamplers") < (int)cap;
    if (sscanf(s, ".block.%d%n", &r, &len) == 1 && len > 0)
        return (rr = vae_rest(s + len)) && snprintf(out, cap, "%s.%s.%d.resnets.%d%s", half, blocks, i, r, rr) < (int)cap;
    return false;
}

int lp_sd_diffusers_module(const lp_sd_config *c, const char *ldm, char *out, size_t cap) {
    static const char te[] = "cond_stage_model.transformer.", unet[] = "model.diffusion_model.",
                      vae[] = "first_stage_model.";
    if (!strncmp(ldm, te, sizeof te - 1))
        return snprintf(out, cap, "%s", ldm + sizeof te - 1) < (int)cap ? LP_SD_PART_TE : -1;
    if (!strncmp(ldm, unet, sizeof unet - 1))
        return unet_diffusers(c, ldm + sizeof unet - 1, out, cap) ? LP_SD_PART_UNET : -1;
    if (!strncmp(ldm, vae, sizeof vae - 1))
        return vae_diffusers(c, ldm + sizeof vae - 1, out, cap) ? LP_SD_PART_VAE : -1;
    return -1;
}

int lp_sd_diffusers_name(const lp_sd_config *c, const char *ldm, char *out, size_t cap) {
    const char *dot = strrchr(ldm, '.');
    char module[160];
    if (!dot || (size_t)(dot - ldm) >= sizeof module) return -1;
    memcpy(module, ldm, (size_t)(dot - ldm));
    module[dot - ldm] = 0;
    int part = lp_sd_diffusers_module(c, module, out, cap);
    size_t n = part < 0 ? 0 : strlen(out);
    return part >= 0 && n + strlen(dot) < cap ? (memcpy(out + n, dot, strlen(dot) + 1), part) : -1;
}

/* ---- enumeration ----------------------------------------------------------------------------- */

typedef struct emitter {
    lp_sd_tensor_fn fn;
    void *ctx;
    int rc;
} emitter;

__attribute__((format(printf, 4, 5))) static void emit(emitter *e, int n_dims, const int64_t *shape,
                                                       const char *fmt, ...) {
    if (e->rc) return;
    lp_sd_tensor_desc t = {.n_dims = n_dims};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t.name, sizeof t.name, fmt, ap);
    va_end(ap);
    memcpy(t.shape, shape, sizeof(int64_t) * (size_t)n_dims);
    e->rc = e->fn(e->ctx, &t);
}

/* weight [out][in] and bias [out] (bias only when with_bias) */
static void linear(emitter *e, const char *p, int64_t out, int64_t in, bool with_bias) {
    emit(e, 2, (int64_t[]){out, in}, "%s.weight", p);
    if (with_bias) emit(e, 1, (int64_t[]){out}, "%s.bias", p);
}

static void conv(emitter *e, const char *p, int64_t out, int64_t in, int64_t k) {
    emit(e, 4, (int64_t[]){out, in, k, k}, "%s.weight", p);
    emit(e, 1, (int64_t[]){out}, "%s.bias", p);
}

/* GroupNorm and LayerNorm: weight and bias [c] */
static void norm(emitter *e, const char *p, int64_t c) {
    emit(e, 1, (int64_t[]){c}, "%s.weight", p);
    emit(e, 1, (int64_t[]){c}, "%s.bias", p);
}

/* p then s into buf (256 bytes; names are far shorter) */
static const char *cat(char *buf, const char *p, const char *s) {
    size_t np = strlen(p), ns = strlen(s);
    if (np > 255) np = 255;
    if (ns > 255 - np) ns = 255 - np;
    memcpy(buf, p, np);
    memcpy(buf + np, s, ns);
    buf[np + ns] = 0;
    return buf;
}

static void text_encoder(emitter *e, const lp_sd_config *c) {
    const char *T = "cond_stage_model.transformer.text_model.";
    char b[256], p[256];
    int64_t d = c->te_dim;
    emit(e, 2, (int64_t[]){c->te_vocab, d}, "%sembeddings.token_embedding.weight", T);
    emit(e, 2, (int64_t[]){c->te_ctx, d}, "%sembeddings.position_embedding.weight", T);
    for (int l = 0; l < c->te_layers; l++) {
        snprintf(p, sizeof p, "%sencoder.layers.%d.", T, l);
        linear(e, cat(b, p, "self_attn.q_proj"), d, d, true);
        linear(e, cat(b, p, "self_attn.k_proj"), d, d, true);
        linear(e, cat(b, p, "self_attn.v_proj"), d, d, true);
        linear(e, cat(b, p, "self_attn.out_proj"), d, d, true);
        norm(e, cat(b, p, "layer_norm1"), d);
        linear(e, cat(b, p, "mlp.fc1"), c->te_ffn, d, true);
        linear(e, cat(b, p, "mlp.fc2"), d, c->te_ffn, true);
        norm(e, cat(b, p, "layer_norm2"), d);
    }
    norm(e, cat(b, T, "final_layer_norm"), d);
}

static void res_block(emitter *e, const char *p, int64_t cin, int64_t cout, int64_t temb) {
    char b[256];
    norm(e, cat(b, p, ".in_layers.0"), cin);
    conv(e, cat(b, p, ".in_layers.2"), cout, cin, 3);
    linear(e, cat(b, p, ".emb_layers.1"), cout, temb, true);
    norm(e, cat(b, p, ".out_layers.0"), cout);
    conv(e, cat(b, p, ".out_layers.3"), cout, cout, 3);
    if (cin != cout) conv(e, cat(b, p, ".skip_connection"), cout, cin, 1);
}

static void transformer(emitter *e, const char *p, int64_t ch, int64_t ctx) {
    char b[256], t[256];
    norm(e, cat(b, p, ".norm"), ch);
    conv(e, cat(b, p, ".proj_in"), ch, ch, 1);
    snprintf(t, sizeof t, "%s.transformer_blocks.0.", p);
    linear(e, cat(b, t, "attn1.to_q"), ch, ch, false);
    linear(e, cat(b, t, "attn1.to_k"), ch, ch, false);
    linear(e, cat(b, t, "attn1.to_v"), ch, ch, false);
    linear(e, cat(b, t, "attn1.to_out.0"), ch, ch, true);
    linear(e, cat(b, t, "ff.net.0.proj"), 8 * ch, ch, true); /* GEGLU: value and gate, 4 ch each */
    linear(e, cat(b, t, "ff.net.2"), ch, 4 * ch, true);
    linear(e, cat(b, t, "attn2.to_q"), ch, ch, false);
    linear(e, cat(b, t, "attn2.to_k"), ch, ctx, false);
    linear(e, cat(b, t, "attn2.to_v"), ch, ctx, false);
    linear(e, cat(b, t, "attn2.to_out.0"), ch, ch, true);
    norm(e, cat(b, t, "norm1"), ch);
    norm(e, cat(b, t, "norm2"), ch);
    norm(e, cat(b, t, "norm3"), ch);
    conv(e, cat(b, p, ".proj_out"), ch, ch, 1);
}

static void unet(emitter *e, const lp_sd_config *c) {
    const char *U = "model.diffusion_model.";
    char p[256];
    int64_t ch = c->unet_ch, temb = 4 * ch, cur = ch, skips[3 * LP_SD_MAX_LEVELS * 9 + 1];
    int n_skips = 0, idx = 1;
    linear(e, cat(p, U, "time_embed.0"), temb, ch, true);
    linear(e, cat(p, U, "time_embed.2"), temb, temb, true);
    conv(e, cat(p, U, "input_blocks.0.0"), ch, c->unet_in, 3);
    skips[n_skips++] = ch;
    for (int l = 0; l < c->unet_levels; l++) {
        int64_t out = ch * c->unet_mult[l];
        for (int r = 0; r < c->unet_res_blocks; r++, idx++) {
            snprintf(p, sizeof p, "%sinput_blocks.%d.0", U, idx);
            res_block(e, p, cur, out, temb);
            cur = out;
            if (c->unet_attn[l]) {
                snprintf(p, sizeof p, "%sinput_blocks.%d.1", U, idx);
                transformer(e, p, cur, c->context_dim);
            }
            skips[n_skips++] = cur;
        }
        if (l + 1 < c->unet_levels) {
            snprintf(p, sizeof p, "%sinput_blocks.%d.0.op", U, idx++);
            conv(e, p, cur, cur, 3);
            skips[n_skips++] = cur;
        }
    }
    res_block(e, cat(p, U, "middle_block.0"), cur, cur, temb);
    transformer(e, cat(p, U, "middle_block.1"), cur, c->context_dim);
    res_block(e, cat(p, U, "middle_block.2"), cur, cur, temb);
    idx = 0;
    for (int l = c->unet_levels - 1; l >= 0; l--) {
        int64_t out = ch * c->unet_mult[l];
        for (int r = 0; r <= c->unet_res_blocks; r++, idx++) {
            int64_t skip = skips[--n_skips];
            snprintf(p, sizeof p, "%soutput_blocks.%d.0", U, idx);
            res_block(e, p, cur + skip, out, temb);
            cur = out;
            int k = 1;
            if (c->unet_attn[l]) {
                snprintf(p, sizeof p, "%soutput_blocks.%d.1", U, idx);
                transformer(e, p, cur, c->context_dim);
                k = 2;
            }
            if (l > 0 && r == c->unet_res_blocks) {
                snprintf(p, sizeof p, "%soutput_blocks.%d.%d.conv", U, idx, k);
                conv(e, p, cur, cur, 3);
            }
        }
    }
    norm(e, cat(p, U, "out.0"), ch);
    conv(e, cat(p, U, "out.2"), c->unet_out, ch, 3);
}

static void vae_res(emitter *e, const char *p, int64_t cin, int64_t cout) {
    char b[256];
    norm(e, cat(b, p, ".norm1"), cin);
    conv(e, cat(b, p, ".conv1"), cout, cin, 3);
    norm(e, cat(b, p, ".norm2"), cout);
    conv(e, cat(b, p, ".conv2"), cout, cout, 3);
    if (cin != cout) conv(e, cat(b, p, ".nin_shortcut"), cout, cin, 1);
}

static void vae_mid(emitter *e, const char *p, int64_t ch) {
    char b[256];
    vae_res(e, cat(b, p, "mid.block_1"), ch, ch);
    norm(e, cat(b, p, "mid.attn_1.norm"), ch);
    conv(e, cat(b, p, "mid.attn_1.q"), ch, ch, 1);
    conv(e, cat(b, p, "mid.attn_1.k"), ch, ch, 1);
    conv(e, cat(b, p, "mid.attn_1.v"), ch, ch, 1);
    conv(e, cat(b, p, "mid.attn_1.proj_out"), ch, ch, 1);
    vae_res(e, cat(b, p, "mid.block_2"), ch, ch);
}

static void vae(emitter *e, const lp_sd_config *c) {
    const char *E = "first_stage_model.encoder.", *D = "first_stage_model.decoder.";
    char p[256];
    int64_t ch = c->vae_ch, cur = ch, z = c->vae_z;
    conv(e, cat(p, E, "conv_in"), ch, c->vae_img, 3);
    for (int l = 0; l < c->vae_levels; l++) {
        int64_t out = ch * c->vae_mult[l];
        for (int r = 0; r < c->vae_res_blocks; r++) {
            snprintf(p, sizeof p, "%sdown.%d.block.%d", E, l, r);
            vae_res(e, p, cur, out);
            cur = out;
        }
        if (l + 1 < c->vae_levels) {
            snprintf(p, sizeof p, "%sdown.%d.downsample.conv", E, l);
            conv(e, p, cur, cur, 3);
        }
    }
    vae_mid(e, E, cur);
    norm(e, cat(p, E, "norm_out"), cur);
    conv(e, cat(p, E, "conv_out"), 2 * z, cur, 3); /* mean and log-variance */
    conv(e, "first_stage_model.quant_conv", 2 * z, 2 * z, 1);
    conv(e, "first_stage_model.post_quant_conv", z, z, 1);
    cur = ch * c->vae_mult[c->vae_levels - 1];
    conv(e, cat(p, D, "conv_in"), cur, z, 3);
    vae_mid(e, D, cur);
    for (int l = c->vae_levels - 1; l >= 0; l--) {
        int64_t out = ch * c->vae_mult[l];
        for (int r = 0; r <= c->vae_res_blocks; r++) {
            snprintf(p, sizeof p, "%sup.%d.block.%d", D, l, r);
            vae_res(e, p, cur, out);
            cur = out;
        }
        if (l > 0) {
            snprintf(p, sizeof p, "%sup.%d.upsample.conv", D, l);
            conv(e, p, cur, cur, 3);
        }
    }
    norm(e, cat(p, D, "norm_out"), cur);
    conv(e, cat(p, D, "conv_out"), c->vae_img, cur, 3);
}

int lp_sd_layout(const lp_sd_config *c, lp_sd_tensor_fn fn, void *ctx) {
    emitter e = {.fn = fn, .ctx = ctx};
    text_encoder(&e, c);
    unet(&e, c);
    vae(&e, c);
    return e.rc;
}

static int count_one(void *ctx, const lp_sd_tensor_desc *t) {
    lp_sd_counts *n = ctx;
    int64_t k = 1;
    for (int i = 0; i < t->n_dims; i++) k *= t->shape[i];
    n->tensors++;
    if (!strncmp(t->name, "cond_stage_model.", 17)) n->te += k;
    else if (!strncmp(t->name, "model.diffusion_model.", 22)) n->unet += k;
    else n->vae += k;
    return 0;
}

lp_sd_counts lp_sd_layout_counts(const lp_sd_config *c) {
    lp_sd_counts n = {0};
    lp_sd_layout(c, count_one, &n);
    return n;
}

/* ---- int8 matrices ------------------------------------------------------------------------------ */

/* The image's own channels (3, 4 or 8: the first and last convs of the
 * UNet and the VAE, the quant convs) give matrices under 16 rows or with
 * 27 or 36 columns: under 0.1% of the weights, and where error enters or
 * leaves the latent, so they stay f32 (and could not be packed per row
 * with those widths anyway). The embedding tables are looked up, not
 * multiplied. */
bool lp_sd_tensor_w8(uint32_t weight_type, const lp_sd_tensor_desc *t, int64_t *rows, int64_t *cols) {
    size_t n = strlen(t->name);
    if (weight_type != LP_W8 || (t->n_dims != 2 && t->n_dims != 4) || n < 7 || strcmp(t->name + n - 7, ".weight") ||
        strstr(t->name, "embedding"))
        return false;
    *rows = t->shape[0];
    *cols = t->n_dims == 2 ? t->shape[1] : t->shape[1] * t->shape[2] * t->shape[3];
    return *cols % 32 == 0 && *rows >= 16;
}

uint64_t lp_sd_tensor_bytes(uint32_t weight_type, const lp_sd_tensor_desc *t, bool *w8, int64_t *rows, int64_t *cols) {
    *w8 = lp_sd_tensor_w8(weight_type, t, rows, cols);
    if (*w8) return *cols <= INT32_MAX ? lp_pack_bytes(LP_W8, *rows, *cols, (int)*cols) : 0;
    uint64_t n = t->n_dims ? (uint64_t)t->shape[0] : 1, c = 1;
    for (int i = 1; i < t->n_dims; i++)
        if (__builtin_mul_overflow(c, (uint64_t)t->shape[i], &c)) return 0;
    *rows = (int64_t)n;
    *cols = (int64_t)c;
    return __builtin_mul_overflow(n, c, &n) || __builtin_mul_overflow(n, (uint64_t)sizeof(float), &n) ? 0 : n;
}
