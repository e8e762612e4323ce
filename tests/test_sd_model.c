/* The SD 1.x checkpoint layout, the random-weight writer and the loader:
 * sd15's layout has the published parameter counts of SD 1.5 (UNet
 * 859,520,964, text encoder 123,060,480, VAE 83,653,863) and tensors named
 * and shaped as the original checkpoint's; sd-tiny written in F32, F16 and
 * BF16 loads back with its configuration inferred from the file; copies with
 * a tensor missing, reshaped or of an integer dtype are rejected naming the
 * file and the tensor. The diffusers folder layout: sd-tiny and its
 * 9-channel inpainting form written as a folder load with the same
 * configuration and every tensor's bytes (16 of sd-tiny's names checked by
 * hand against the mapping of diffusers' conversion script), the VAE attention's older
 * names load the same, and a missing file or tensor is named. */
#include "check.h"
#include "formats/safetensors.h"
#include "image/sd.h"
#include "tools/sd_synth.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct want {
    const char *name;
    int n_dims;
    int64_t shape[4];
    bool seen;
} want;

typedef struct spot {
    want *w;
    int n;
    int bad;
} spot;

static int spot_one(void *ctx, const lp_sd_tensor_desc *t) {
    spot *s = ctx;
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->w[i].name, t->name)) {
            s->w[i].seen = true;
            bool same = t->n_dims == s->w[i].n_dims;
            for (int d = 0; same && d < t->n_dims; d++) same = t->shape[d] == s->w[i].shape[d];
            if (!same) {
                fprintf(stderr, "%s: wrong shape\n", t->name);
                s->bad++;
            }
        }
    return 0;
}

static void test_sd15_layout(void) {
    lp_sd_config c = lp_sd_config_sd15();
    lp_error err = {0};
    CHECK(lp_sd_config_check(&c, &err) == 0);
    lp_sd_counts n = lp_sd_layout_counts(&c);
    CHECK_MSG(n.unet == 859520964, "UNet %lld", (long long)n.unet);
    CHECK_MSG(n.te == 123060480, "text encoder %lld", (long long)n.te);
    CHECK_MSG(n.vae == 83653863, "VAE %lld", (long long)n.vae);
    /* names and shapes of the original checkpoint, written out by hand */
    want w[] = {
        {"model.diffusion_model.time_embed.0.weight", 2, {1280, 320}, false},
        {"model.diffusion_model.input_blocks.0.0.weight", 4, {320, 4, 3, 3}, false},
        {"model.diffusion_model.input_blocks.3.0.op.weight", 4, {320, 320, 3, 3}, false},
        {"model.diffusion_model.input_blocks.4.0.skip_connection.weight", 4, {640, 320, 1, 1}, false},
        {"model.diffusion_model.input_blocks.8.1.transformer_blocks.0.attn2.to_k.weight", 2, {1280, 768}, false},
        {"model.diffusion_model.input_blocks.11.0.out_layers.3.weight", 4, {1280, 1280, 3, 3}, false},
        {"model.diffusion_model.middle_block.1.transformer_blocks.0.ff.net.0.proj.weight", 2, {10240, 1280}, false},
        {"model.diffusion_model.output_blocks.0.0.skip_connection.weight", 4, {1280, 2560, 1, 1}, false},
        {"model.diffusion_model.output_blocks.2.1.conv.weight", 4, {1280, 1280, 3, 3}, false},
        {"model.diffusion_model.output_blocks.5.2.conv.weight", 4, {1280, 1280, 3, 3}, false},
        {"model.diffusion_model.output_blocks.8.2.conv.weight", 4, {640, 640, 3, 3}, false},
        {"model.diffusion_model.output_blocks.9.0.in_layers.0.weight", 1, {960}, false},
        {"model.diffusion_model.output_blocks.11.1.proj_out.weight", 4, {320, 320, 1, 1}, false},
        {"model.diffusion_model.out.2.weight", 4, {4, 320, 3, 3}, false},
        {"cond_stage_model.transformer.text_model.embeddings.token_embedding.weight", 2, {49408, 768}, false},
        {"cond_stage_model.transformer.text_model.encoder.layers.11.mlp.fc2.weight", 2, {768, 3072}, false},
        {"cond_stage_model.transformer.text_model.final_layer_norm.bias", 1, {768}, false},
        {"first_stage_model.encoder.conv_out.weight", 4, {8, 512, 3, 3}, false},
        {"first_stage_model.encoder.down.1.block.0.nin_shortcut.weight", 4, {256, 128, 1, 1}, false},
        {"first_stage_model.decoder.up.1.block.0.nin_shortcut.weight", 4, {256, 512, 1, 1}, false},
        {"first_stage_model.decoder.up.3.upsample.conv.weight", 4, {512, 512, 3, 3}, false},
        {"first_stage_model.decoder.mid.attn_1.q.weight", 4, {512, 512, 1, 1}, false},
        {"first_stage_model.post_quant_conv.weight", 4, {4, 4, 1, 1}, false},
    };
    spot s = {.w = w, .n = (int)(sizeof w / sizeof w[0])};
    lp_sd_layout(&c, spot_one, &s);
    CHECK(s.bad == 0);
    for (int i = 0; i < s.n; i++) CHECK_MSG(w[i].seen, "%s not in the layout", w[i].name);
}

static bool same_config(const lp_sd_config *a, const lp_sd_config *b) { return !memcmp(a, b, sizeof *a); }

/* A copy of src's tensors through the writer, without `drop`, with
 * `reshape`'s first dimension doubled as claimed shape (data kept), and
 * `as_int` relabelled I32. */
static int copy_with(const char *src, const char *dst, const char *drop, const char *as_int) {
    lp_error err = {0};
    lp_safetensors *st = lp_safetensors_open(src, &err);
    if (!st) return -1;
    lp_st_writer *w = lp_st_writer_create();
    for (size_t i = 0; i < lp_safetensors_count(st); i++) {
        const lp_st_tensor *t = lp_safetensors_at(st, i);
        if (drop && !strcmp(t->name, drop)) continue;
        if (as_int && !strcmp(t->name, as_int))
            lp_st_writer_add(w, t->name, LP_ST_I32, t->n_dims, t->shape, t->data, t->n_bytes);
        else
            lp_st_writer_add(w, t->name, t->dtype, t->n_dims, t->shape, t->data, t->n_bytes);
    }
    lp_st_writer_set_metadata(w, "loraplex.sd.te_heads", "2");
    lp_st_writer_set_metadata(w, "loraplex.sd.unet_heads", "2");
    int rc = lp_st_writer_write(w, dst, &err);
    lp_st_writer_free(w);
    lp_safetensors_close(st);
    return rc;
}

static void test_tiny_roundtrip(void) {
    char dir[] = "/tmp/lp_sd_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[128], bad[128];
    snprintf(path, sizeof path, "%s/tiny.safetensors", dir);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    lp_sd_config tiny = lp_sd_config_tiny();
    lp_error err = {0};
    lp_st_dtype types[] = {LP_ST_F16, LP_ST_BF16, LP_ST_F32};
    for (int i = 0; i < 3; i++) {
        CHECK(lp_sd_synth_write(&tiny, types[i], 5, "sd-tiny", path, &err) == 0);
        lp_sd_model *m = lp_sd_model_load(path, &err);
        CHECK_MSG(m != NULL, "%s", err.message);
        if (!m) continue;
        CHECK(same_config(lp_sd_model_config(m), &tiny));
        CHECK(lp_sd_model_ignored(m) == 0);
        const lp_st_tensor *t = lp_sd_model_tensor(m, "model.diffusion_model.out.2.weight");
        CHECK(t && t->dtype == types[i] && t->n_elements == 4 * 32 * 9);
        /* norm gains near 1, biases small, weights bounded by sqrt(3 / fan-in) */
        float g[32], b[32];
        const lp_st_tensor *tg = lp_sd_model_tensor(m, "model.diffusion_model.out.0.weight");
        const lp_st_tensor *tb = lp_sd_model_tensor(m, "model.diffusion_model.out.0.bias");
        CHECK(tg && tb && lp_st_to_f32(tg, g, &err) == 0 && lp_st_to_f32(tb, b, &err) == 0);
        bool ok = true;
        for (int k = 0; k < 32; k++) ok = ok && fabsf(g[k] - 1.0f) <= 0.11f && fabsf(b[k]) <= 0.051f;
        CHECK(ok);
        lp_sd_model_free(m);
    }
    /* written twice with one seed: the same bytes */
    {
        char again[128];
        snprintf(again, sizeof again, "%s/again.safetensors", dir);
        CHECK(lp_sd_synth_write(&tiny, LP_ST_F32, 5, "sd-tiny", again, &err) == 0);
        char *a = NULL, *b = NULL;
        size_t na = 0, nb = 1;
        CHECK(lp_read_file(path, &a, &na, 64 << 20, &err) == 0 && lp_read_file(again, &b, &nb, 64 << 20, &err) == 0);
        CHECK(na == nb && memcmp(a, b, na) == 0);
        free(a), free(b);
        unlink(again);
    }

    /* a tensor missing, a dtype that is not a float: the file and the tensor named */
    const char *victim = "model.diffusion_model.output_blocks.1.0.skip_connection.weight";
    CHECK(copy_with(path, bad, victim, NULL) == 0);
    CHECK(lp_sd_model_load(bad, &err) == NULL);
    CHECK_MSG(strstr(err.message, bad) && strstr(err.message, victim) && err.status == LP_ERR_FORMAT, "%s",
              err.message);
    const char *pos = "cond_stage_model.transformer.text_model.embeddings.position_embedding.weight";
    CHECK(copy_with(path, bad, pos, NULL) == 0);
    CHECK(lp_sd_model_load(bad, &err) == NULL);
    CHECK_MSG(strstr(err.message, pos) != NULL, "%s", err.message);
    const char *ln = "cond_stage_model.transformer.text_model.final_layer_norm.weight";
    CHECK(copy_with(path, bad, NULL, ln) == 0);
    CHECK(lp_sd_model_load(bad, &err) == NULL);
    CHECK_MSG(strstr(err.message, ln) && strstr(err.message, "I32"), "%s", err.message);
    /* a level without its downsampler: levels of unequal depth */
    CHECK(copy_with(path, bad, "model.diffusion_model.input_blocks.2.0.op.weight", NULL) == 0);
    CHECK(lp_sd_model_load(bad, &err) == NULL);
    CHECK_MSG(strstr(err.message, bad) != NULL, "%s", err.message);
    /* extra tensors (EMA copies, schedule buffers) are ignored and counted */
    {
        lp_safetensors *st = lp_safetensors_open(path, &err);
        lp_st_writer *w = lp_st_writer_create();
        for (size_t i = 0; i < lp_safetensors_count(st); i++) {
            const lp_st_tensor *t = lp_safetensors_at(st, i);
            lp_st_writer_add(w, t->name, t->dtype, t->n_dims, t->shape, t->data, t->n_bytes);
        }
        float betas[1000] = {0};
        lp_st_writer_add(w, "betas", LP_ST_F32, 1, (uint64_t[]){1000}, betas, sizeof betas);
        lp_st_writer_set_metadata(w, "loraplex.sd.te_heads", "2");
        lp_st_writer_set_metadata(w, "loraplex.sd.unet_heads", "2");
        CHECK(lp_st_writer_write(w, bad, &err) == 0);
        lp_st_writer_free(w);
        lp_safetensors_close(st);
        lp_sd_model *m = lp_sd_model_load(bad, &err);
        CHECK(m && lp_sd_model_ignored(m) == 1 && same_config(lp_sd_model_config(m), &tiny));
        lp_sd_model_free(m);
    }
    CHECK(lp_sd_synth_preset("sd-huge", &tiny, &err) == -1 && strstr(err.message, "sd15"));
    unlink(path);
    unlink(bad);
    rmdir(dir);
}

/* A micro model (GroupNorm groups 1, widths 2 to 8; the fuzz seed's
 * configuration): groups and heads come back from the metadata, and the
 * loader reads the same from memory. */
static void test_micro(void) {
    lp_sd_config c = {.te_vocab = 8, .te_ctx = 4, .te_dim = 4, .te_layers = 1, .te_heads = 1, .te_ffn = 8,
                      .unet_in = 4, .unet_out = 4, .unet_ch = 2, .unet_levels = 2, .unet_mult = {1, 2},
                      .unet_res_blocks = 1, .unet_attn = {true, false}, .unet_heads = 1, .context_dim = 4,
                      .vae_img = 3, .vae_z = 4, .vae_ch = 2, .vae_levels = 2, .vae_mult = {1, 1},
                      .vae_res_blocks = 1, .groups = 1};
    char path[] = "/tmp/lp_sd_micro_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    lp_error err = {0};
    CHECK(lp_sd_synth_write(&c, LP_ST_F16, 1, "micro", path, &err) == 0);
    char *data;
    size_t size;
    CHECK(lp_read_file(path, &data, &size, 1 << 20, &err) == 0);
    lp_sd_model *m = lp_sd_model_load_memory(data, size, "micro.safetensors", &err);
    CHECK_MSG(m && same_config(lp_sd_model_config(m), &c), "%s", m ? "config differs" : err.message);
    lp_sd_model_free(m);
    /* truncated: the safetensors parser's error, named */
    CHECK(lp_sd_model_load_memory(data, size / 2, "cut.safetensors", &err) == NULL && strstr(err.message, "cut.safetensors"));
    free(data);
    unlink(path);
}

/* every layout tensor of a and b: the same bytes */
typedef struct same_ctx {
    const lp_sd_model *a, *b;
    int differ;
} same_ctx;

static int same_one(void *ctx, const lp_sd_tensor_desc *d) {
    same_ctx *k = ctx;
    const lp_st_tensor *x = lp_sd_model_tensor(k->a, d->name), *y = lp_sd_model_tensor(k->b, d->name);
    k->differ += !x || !y || x->n_bytes != y->n_bytes || memcmp(x->data, y->data, x->n_bytes);
    return 0;
}

/* dir's vae file again with the attention's older names (query, key, value, proj_attn) */
static int older_vae_names(const char *dir) {
    char path[256], out[256];
    snprintf(path, sizeof path, "%s/vae/diffusion_pytorch_model.safetensors", dir);
    snprintf(out, sizeof out, "%s/vae/new.safetensors", dir);
    lp_error err = {0};
    lp_safetensors *st = lp_safetensors_open(path, &err);
    if (!st) return -1;
    static const char *const map[][2] = {{".to_q.", ".query."}, {".to_k.", ".key."}, {".to_v.", ".value."},
                                         {".to_out.0.", ".proj_attn."}};
    char names[64][160];
    int n = 0;
    lp_st_writer *w = lp_st_writer_create();
    for (size_t i = 0; i < lp_safetensors_count(st); i++) {
        const lp_st_tensor *t = lp_safetensors_at(st, i);
        const char *name = t->name;
        for (size_t j = 0; j < 4 && n < 64; j++) {
            const char *k = strstr(t->name, map[j][0]);
            if (!k) continue;
            snprintf(names[n], sizeof names[n], "%.*s%s%s", (int)(k - t->name), t->name, map[j][1], k + strlen(map[j][0]));
            name = names[n++];
        }
        lp_st_writer_add(w, name, t->dtype, t->n_dims, t->shape, t->data, t->n_bytes);
    }
    int rc = lp_st_writer_write(w, out, &err) || rename(out, path) ? -1 : n;
    lp_st_writer_free(w);
    lp_safetensors_close(st);
    return rc;
}

static void test_diffusers(void) {
    char dir[] = "/tmp/lp_sd_diff_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[128], folder[128], cmd[512];
    snprintf(path, sizeof path, "%s/tiny.safetensors", dir);
    snprintf(folder, sizeof folder, "%s/tiny", dir);
    lp_error err = {0};
    static const char *const pairs[][2] = {
        {"model.diffusion_model.input_blocks.1.0.in_layers.0.weight", "down_blocks.0.resnets.0.norm1.weight"},
        {"model.diffusion_model.input_blocks.1.0.out_layers.3.bias", "down_blocks.0.resnets.0.conv2.bias"},
        {"model.diffusion_model.input_blocks.1.1.proj_in.weight", "down_blocks.0.attentions.0.proj_in.weight"},
        {"model.diffusion_model.input_blocks.2.0.op.weight", "down_blocks.0.downsamplers.0.conv.weight"},
        {"model.diffusion_model.middle_block.2.emb_layers.1.weight", "mid_block.resnets.1.time_emb_proj.weight"},
        {"model.diffusion_model.output_blocks.1.1.conv.weight", "up_blocks.0.upsamplers.0.conv.weight"},
        {"model.diffusion_model.output_blocks.3.0.skip_connection.weight", "up_blocks.1.resnets.1.conv_shortcut.weight"},
        {"model.diffusion_model.out.0.bias", "conv_norm_out.bias"},
        {"model.diffusion_model.time_embed.2.weight", "time_embedding.linear_2.weight"},
        {"cond_stage_model.transformer.text_model.final_layer_norm.weight", "text_model.final_layer_norm.weight"},
        {"first_stage_model.encoder.down.1.downsample.conv.weight", "encoder.down_blocks.1.downsamplers.0.conv.weight"},
        {"first_stage_model.encoder.mid.attn_1.norm.bias", "encoder.mid_block.attentions.0.group_norm.bias"},
        {"first_stage_model.decoder.mid.attn_1.proj_out.weight", "decoder.mid_block.attentions.0.to_out.0.weight"},
        {"first_stage_model.decoder.up.0.block.1.nin_shortcut.weight", "decoder.up_blocks.3.resnets.1.conv_shortcut.weight"},
        {"first_stage_model.decoder.up.3.upsample.conv.bias", "decoder.up_blocks.0.upsamplers.0.conv.bias"},
        {"first_stage_model.decoder.norm_out.weight", "decoder.conv_norm_out.weight"},
    };
    lp_sd_config tiny = lp_sd_config_tiny();
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        char dn[192] = "";
        int part = lp_sd_diffusers_name(&tiny, pairs[i][0], dn, sizeof dn);
        CHECK_MSG(part >= 0 && !strcmp(dn, pairs[i][1]), "%s -> %s (want %s)", pairs[i][0], dn, pairs[i][1]);
    }
    CHECK(lp_sd_diffusers_name(&tiny, "model.diffusion_model.input_blocks.1.0.in_layers.7.weight", (char[192]){0}, 192) == -1);
    CHECK(lp_sd_diffusers_name(&tiny, "first_stage_model.decoder.up.4.block.0.conv1.weight", (char[192]){0}, 192) == -1);
    lp_sd_config nine = tiny;
    nine.unet_in = 9;
    for (int k = 0; k < 2; k++) {
        const lp_sd_config *c = k ? &nine : &tiny;
        CHECK(lp_sd_synth_write(c, LP_ST_F16, 6, "sd-tiny", path, &err) == 0);
        lp_sd_model *a = lp_sd_model_load(path, &err), *b = NULL;
        CHECK_MSG(a && lp_sd_write_diffusers(a, folder, &err) == 0, "%s", err.message);
        CHECK_MSG((b = lp_sd_model_load(folder, &err)) != NULL, "%s", err.message);
        if (a && b) {
            CHECK(same_config(lp_sd_model_config(b), c) && lp_sd_model_ignored(b) == 0);
            same_ctx sc = {.a = a, .b = b};
            lp_sd_layout(c, same_one, &sc);
            CHECK_MSG(sc.differ == 0, "%d tensors differ", sc.differ);
            const lp_st_tensor *q = lp_sd_model_tensor(b, "first_stage_model.encoder.mid.attn_1.q.weight");
            CHECK(q && q->n_dims == 2); /* as diffusers keeps it */
        }
        lp_sd_model_free(b);
        if (k == 0) { /* the older VAE attention names */
            CHECK(older_vae_names(folder) == 16);
            lp_sd_model *o = lp_sd_model_load(folder, &err);
            CHECK_MSG(o != NULL, "%s", err.message);
            same_ctx sc = {.a = a, .b = o};
            if (o) lp_sd_layout(c, same_one, &sc);
            CHECK(o && sc.differ == 0);
            lp_sd_model_free(o);
        }
        lp_sd_model_free(a);
    }
    /* a tensor missing, a file missing: named */
    char vae[256], tmp[272];
    snprintf(vae, sizeof vae, "%s/vae/diffusion_pytorch_model.safetensors", folder);
    snprintf(tmp, sizeof tmp, "%s.tmp", vae); /* not over the mapped file */
    CHECK(copy_with(vae, tmp, "encoder.down_blocks.0.resnets.0.norm2.bias", NULL) == 0 && rename(tmp, vae) == 0);
    CHECK(lp_sd_model_load(folder, &err) == NULL);
    CHECK_MSG(strstr(err.message, "no tensor encoder.down_blocks.0.resnets.0.norm2.bias"), "%s", err.message);
    unlink(vae);
    CHECK(lp_sd_model_load(folder, &err) == NULL);
    CHECK_MSG(strstr(err.message, "vae/diffusion_pytorch_model.safetensors"), "%s", err.message);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

int main(void) {
    test_diffusers();
    test_sd15_layout();
    test_micro();
    test_tiny_roundtrip();
    return check_summary("test_sd_model");
}
