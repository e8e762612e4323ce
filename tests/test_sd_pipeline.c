/* Text to image on a random sd-tiny (src/image/sd_pipeline.c) and the PNG
 * writer and reader (src/tools/png.c): a seed gives the same image and
 * latent every time and another seed another; explicit noise equal to the
 * seed's gives the seed's result; guidance whose negative prompt is the
 * prompt (eps_uncond = eps_cond, so any scale gives eps_cond) matches the
 * unguided one-row run, which checks the cond/uncond rows of the batch;
 * the PNG decodes back to the same pixels; bad sizes are refused; a batch
 * of three images with their own prompts, seeds and adapters (euler and
 * dpm++2m) equals each image generated alone, bit for bit. Needs
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

static int gen(const lp_sd_weights *w, const lp_clip_tokenizer *t, lp_sd_gen_params p, float *lat, uint8_t *rgb) {
    lp_error err = {0};
    int rc = lp_sd_generate(w, t, &p, lat, rgb, &err);
    if (rc) fprintf(stderr, "generate: %s\n", err.message);
    return rc;
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
    lp_sd_weights *w = m ? lp_sd_weights_create(m, &err) : NULL;
    CHECK_MSG(w != NULL, "%s", err.message);
    lp_sd_model_free(m);
    if (!tok || !w) goto out;

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
            for (int s = 0; s < 2; s++) {
                lp_sd_gen_params q = p;
                q.sampler = s ? LP_SD_SAMPLER_DPMPP_2M : LP_SD_SAMPLER_EULER;
                q.seed = 40, q.batch = 3, q.prompts = prompts, q.image_loras = sets;
                CHECK(gen(w, tok, q, blat[0], brgb[0]) == 0);
                for (int i = 0; i < 3; i++) {
                    lp_sd_gen_params o = p;
                    o.sampler = q.sampler, o.seed = 40 + (uint64_t)i, o.prompt = prompts[i], o.loras = sets[i];
                    CHECK(gen(w, tok, o, one, orgb) == 0);
                    CHECK_MSG(!memcmp(one, blat[i], sizeof one) && !memcmp(orgb, brgb[i], sizeof orgb),
                              "sampler %d: image %d of the batch != alone", s, i);
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
    lp_clip_tokenizer_free(tok);
    unlink(path);
    return check_summary("test_sd_pipeline");
}
