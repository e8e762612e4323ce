/* Text to image on a random sd-tiny (src/image/sd_pipeline.c) and the PNG
 * writer and reader (src/tools/png.c): a seed gives the same image and
 * latent every time and another seed another; explicit noise equal to the
 * seed's gives the seed's result; guidance whose negative prompt is the
 * prompt (eps_uncond = eps_cond, so any scale gives eps_cond) matches the
 * unguided one-row run, which checks the cond/uncond rows of the batch;
 * the PNG decodes back to the same pixels; bad sizes are refused; a batch
 * of three images with their own prompts, seeds and adapters (euler and
 * dpm++2m; and euler with int8 weights, W8A16 and W8A8) equals each image
 * generated alone, bit for bit; int8 weights stay within stated bounds of
 * f32 (final latent, image PSNR) for every sampler. Needs
 * ../shared/models/sd/clip-bpe-merges.txt (a failure without it). */
#include "check.h"
#include "image/sd_pipeline.h"
#include "tools/png.h"
#include "tools/sd_lora_synth.h"
#include "tools/sd_synth.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MERGES LP_SHARED_MODELS "/sd/clip-bpe-merges.txt"
enum { W = 64, H = 32, NLAT = 4 * (W / 8) * (H / 8) };
/* int8 vs f32 on the random sd-tiny, 4 steps (W8A16, W8A8): measured RMS
 * 1.0-1.4e-2 and 5.7-7.5e-2, PSNR 46-48 and 32-36 dB over the five samplers */
static const double INT8_LATENT_RMS[2] = {0.03, 0.15}, INT8_PSNR_DB[2] = {40, 28};

static int gen(const lp_sd_weights *w, const lp_clip_tokenizer *t, lp_sd_gen_params p, float *lat, uint8_t *rgb) {
    lp_error err = {0};
    int rc = lp_sd_generate(w, t, &p, lat, rgb, &err);
    if (rc) fprintf(stderr, "generate: %s\n", err.message);
    return rc;
}

static double rel_rms(const float *a, const float *ref, int n) {
    double e = 0, s = 1e-24;
    for (int i = 0; i < n; i++) e += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]), s += (double)ref[i] * ref[i];
    return sqrt(e / s);
}

static double psnr(const uint8_t *a, const uint8_t *b, int n) {
    double e = 0;
    for (int i = 0; i < n; i++) e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return e > 0 ? 10 * log10(255.0 * 255.0 / (e / n)) : 99;
}

static double max_abs_diff(const float *a, const float *b, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) m = fmax(m, fabs(a[i] - b[i]));
    return m;
}

int main(void) {
    lp_error err = {0};
    lp_clip_tokenizer *tok = lp_clip_tokenizer_load(MERGES, &err);
    CHECK_MSG(tok != NULL, "%s", err.message);
    char path[] = "/tmp/lp_sd_pipe_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    lp_sd_config tiny = lp_sd_config_tiny();
    CHECK(lp_sd_synth_write(&tiny, LP_ST_F16, 11, "sd-tiny", path, &err) == 0);
    lp_sd_model *m = lp_sd_model_load(path, &err);
    lp_sd_weights *w = m ? lp_sd_weights_create(m, LP_F32, &err) : NULL;
    lp_sd_weights *w8 = m ? lp_sd_weights_create(m, LP_W8, &err) : NULL;
    CHECK_MSG(w != NULL && w8 != NULL, "%s", err.message);
    lp_sd_model_free(m);
    if (!tok || !w || !w8) goto out;

    static float lat[4][NLAT];
    static uint8_t rgb[4][W * H * 3];
    lp_sd_gen_params p = {.prompt = "a red cube on a blue sphere", .negative = "blurry", .width = W, .height = H,
                          .steps = 3, .cfg = 5.0f, .sampler = LP_SD_SAMPLER_EULER, .seed = 7, .clip_skip = 1,
                          .n_threads = 2};
    CHECK(gen(w, tok, p, lat[0], rgb[0]) == 0);
    CHECK(gen(w, tok, p, lat[1], rgb[1]) == 0);
    CHECK(memcmp(lat[0], lat[1], sizeof lat[0]) == 0 && memcmp(rgb[0], rgb[1], sizeof rgb[0]) == 0);
    bool varied = false;
    for (int i = 1; i < W * H * 3; i++) varied = varied || rgb[0][i] != rgb[0][0];
    CHECK(varied);
    p.seed = 8;
    CHECK(gen(w, tok, p, lat[1], rgb[1]) == 0);
    CHECK(memcmp(lat[0], lat[1], sizeof lat[0]) != 0);

    /* the noise a seed draws, given explicitly ([4][h][w], channel-major) */
    float noise[NLAT];
    lp_rng r;
    lp_rng_seed(&r, 7);
    for (int i = 0; i < NLAT; i++) noise[i] = lp_rng_normal(&r);
    p.seed = 1234; /* unused for the initial latent; euler draws no more noise */
    p.noise = noise;
    CHECK(gen(w, tok, p, lat[1], rgb[1]) == 0);
    CHECK(memcmp(lat[0], lat[1], sizeof lat[0]) == 0);
    p.noise = NULL;

    /* guidance with negative = prompt equals no guidance */
    p.seed = 7;
    p.negative = p.prompt;
    p.sampler = LP_SD_SAMPLER_DPMPP_2M;
    CHECK(gen(w, tok, p, lat[2], rgb[2]) == 0);
    p.cfg = 1.0f;
    CHECK(gen(w, tok, p, lat[3], rgb[3]) == 0);
    double d = max_abs_diff(lat[2], lat[3], NLAT), scale = 0;
    for (int i = 0; i < NLAT; i++) scale = fmax(scale, fabs(lat[3][i]));
    CHECK_MSG(d <= 1e-4 * scale, "guided with negative = prompt vs unguided: %g (scale %g)", d, scale);

    /* every sampler runs */
    for (int s = 0; s < 5; s++) {
        p.sampler = s;
        p.scheduler = s % 2 ? LP_SD_SCHED_KARRAS : LP_SD_SCHED_DISCRETE;
        CHECK_MSG(gen(w, tok, p, lat[3], rgb[3]) == 0, "sampler %s", lp_sd_sampler_name(s));
        bool finite = true;
        for (int i = 0; i < NLAT; i++) finite = finite && isfinite(lat[3][i]);
        CHECK(finite);
    }

    /* int8 weights against f32 with the same noise, every sampler: the final latent's RMS error and the
     * image's PSNR (INT8_LATENT_RMS, INT8_PSNR_DB); W8A8 differs from W8A16 (its activations are quantized) */
    for (int s = 0; s < 5; s++) {
        static float l32[NLAT], l8[2][NLAT];
        static uint8_t i32[W * H * 3], i8[2][W * H * 3];
        lp_sd_gen_params q = p;
        q.sampler = s, q.negative = "blurry", q.cfg = 5.0f, q.steps = 4, q.seed = 3;
        CHECK(gen(w, tok, q, l32, i32) == 0);
        for (int a8 = 0; a8 < 2; a8++) {
            q.int8_activations = a8;
            CHECK(gen(w8, tok, q, l8[a8], i8[a8]) == 0);
            double e = rel_rms(l8[a8], l32, NLAT), db = psnr(i8[a8], i32, W * H * 3);
            fprintf(stderr, "sd-tiny %s %-8s vs f32: latent RMS %.2e, PSNR %.1f dB\n", a8 ? "w8a8 " : "w8a16",
                    lp_sd_sampler_name(s), e, db);
            CHECK_MSG(e < INT8_LATENT_RMS[a8] && db > INT8_PSNR_DB[a8], "%s %s: latent %g, PSNR %g",
                      a8 ? "w8a8" : "w8a16", lp_sd_sampler_name(s), e, db);
            CHECK(e > 0);
        }
        CHECK(memcmp(l8[0], l8[1], sizeof l8[0]) != 0);
    }

    /* the PNG holds the pixels */
    {
        char png[64];
        snprintf(png, sizeof png, "%s.png", path);
        CHECK(lp_png_write(png, rgb[0], W, H, &err) == 0);
        uint8_t *back = NULL;
        int bw = 0, bh = 0;
        CHECK_MSG(lp_png_read(png, 1 << 20, &back, &bw, &bh, &err) == 0, "%s", err.message);
        CHECK(bw == W && bh == H && back && memcmp(back, rgb[0], sizeof rgb[0]) == 0);
        free(back);
        CHECK(lp_png_read(png, 100, &back, &bw, &bh, &err) == -1 && strstr(err.message, "pixels"));
        CHECK(lp_png_read_memory("\x89PNG\r\n\x1a\nxx", 10, "junk.png", 1 << 20, &back, &bw, &bh, &err) == -1);
        CHECK(strstr(err.message, "junk.png") != NULL);
        unlink(png);
    }

    /* a batch of three: kohya at 1, none, cloneofsimo at 0.7 (its token in the prompt) */
    {
        char lk[] = "/tmp/lp_sd_pipe_lk_XXXXXX", lc[] = "/tmp/lp_sd_pipe_lc_XXXXXX";
        close(mkstemp(lk));
        close(mkstemp(lc));
        CHECK(lp_sd_synth_lora(&tiny, "kohya", 4, 1, lk, &err) == 0);
        CHECK(lp_sd_synth_lora(&tiny, "cloneofsimo", 2, 2, lc, &err) == 0);
        lp_sd_lora *a = lp_sd_lora_load(lk, &tiny, &err), *b = lp_sd_lora_load(lc, &tiny, &err);
        CHECK_MSG(a && b, "%s", err.message);
        if (a && b) {
            lp_sd_row_loras sets[3] = {{.n = 1, .use = {{.lora = a, .scale = 1.0f}}},
                                       {.n = 0},
                                       {.n = 1, .use = {{.lora = b, .scale = 0.7f}}}};
            const char *prompts[3] = {"a red cube", "a green cone", "a photo of <s1>"};
            static float blat[3][NLAT], one[NLAT];
            static uint8_t brgb[3][W * H * 3], orgb[W * H * 3];
            /* euler and dpm++2m in f32; euler with int8 weights, W8A16 and W8A8 */
            for (int s = 0; s < 4; s++) {
                const lp_sd_weights *sw = s < 2 ? w : w8;
                lp_sd_gen_params q = p;
                q.sampler = s == 1 ? LP_SD_SAMPLER_DPMPP_2M : LP_SD_SAMPLER_EULER;
                q.int8_activations = s == 3;
                q.seed = 40, q.batch = 3, q.prompts = prompts, q.image_loras = sets;
                CHECK(gen(sw, tok, q, blat[0], brgb[0]) == 0);
                for (int i = 0; i < 3; i++) {
                    lp_sd_gen_params o = p;
                    o.sampler = q.sampler, o.int8_activations = q.int8_activations;
                    o.seed = 40 + (uint64_t)i, o.prompt = prompts[i], o.loras = sets[i];
                    CHECK(gen(sw, tok, o, one, orgb) == 0);
                    CHECK_MSG(!memcmp(one, blat[i], sizeof one) && !memcmp(orgb, brgb[i], sizeof orgb),
                              "case %d: image %d of the batch != alone", s, i);
                }
                CHECK(memcmp(blat[0], blat[1], sizeof one) && memcmp(blat[1], blat[2], sizeof one));
            }
            lp_sd_gen_params q = p;
            q.batch = LP_SD_MAX_IMAGES + 1;
            CHECK(lp_sd_generate(w, tok, &q, NULL, rgb[3], &err) == -1 && strstr(err.message, "batch of 33"));
        }
        lp_sd_lora_free(a);
        lp_sd_lora_free(b);
        unlink(lk), unlink(lc);
    }

    /* sizes the UNet cannot take */
    p.width = 60;
    CHECK(lp_sd_generate(w, tok, &p, NULL, rgb[3], &err) == -1 && strstr(err.message, "multiples of 16"));
    p.width = W;
    p.steps = 0;
    CHECK(lp_sd_generate(w, tok, &p, NULL, rgb[3], &err) == -1);
out:
    lp_sd_weights_free(w);
    lp_sd_weights_free(w8);
    lp_clip_tokenizer_free(tok);
    unlink(path);
    return check_summary("test_sd_pipeline");
}
