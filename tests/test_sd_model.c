/* The SD 1.x checkpoint layout, the random-weight writer and the loader:
 * sd15's layout has the published parameter counts of SD 1.5 (UNet
 * 859,520,964, text encoder 123,060,480, VAE 83,653,863) and tensors named
 * and shaped as the original checkpoint's; sd-tiny written in F32, F16 and
 * BF16 loads back with its configuration inferred from the file; copies with
 * a tensor missing, reshaped or of an integer dtype are rejected naming the
 * file and the tensor. */
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

int main(void) {
    test_sd15_layout();
    test_micro();
    test_tiny_roundtrip();
    return check_summary("test_sd_model");
}
