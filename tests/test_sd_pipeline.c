/* Text to image on a random sd-tiny (src/image/sd_pipeline.c) and the PNG
 * writer and reader (src/tools/png.c): a seed gives the same image and
 * latent every time and another seed another; explicit noise equal to the
 * seed's gives the seed's result; guidance whose negative prompt is the
 * prompt (eps_uncond = eps_cond, so any scale gives eps_cond) matches the
 * unguided one-row run, which checks the cond/uncond rows of the batch;
 * the PNG decodes back to the same pixels; bad sizes are refused; a batch
 * of three images with their own prompts, seeds and adapters (euler and
 * dpm++2m, euler_a and lcm; and euler with int8 weights, W8A16 and W8A8) equals each image
 * generated alone, bit for bit; int8 weights stay within stated bounds of
 * f32 (final latent, image PSNR) for every sampler. Image to image and
 * inpainting (a 4-channel UNet with the latent blend, and a 9-channel
 * inpainting UNet) against a reference written here from the graphs' calls
 * (VAE encoder, UNet, sampler), bit for bit, with the steps a strength runs;
 * a mask that keeps everything gives the init's latent, one that repaints
 * everything plain image to image. Needs
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

/* ---- image to image and inpainting, restated from the graphs' calls (one row: cfg 1) ---------------- */

typedef struct ref_ctx {
    lp_sd_graph *g;
    lp_sd_schedule sched;
    const float *ctx, *z0, *noise, *m, *extra; /* m: latent mask (blend) or NULL; extra: [px][5] or NULL */
    int64_t px;
    float *xin, *eps, *xb;
} ref_ctx;

static int ref_denoise(void *c, const float *x, double sigma, float *out, lp_error *err) {
    ref_ctx *r = c;
    int64_t n = r->px * 4;
    int uc = r->extra ? 9 : 4;
    if (r->m) {
        for (int64_t i = 0; i < n; i++)
            r->xb[i] = r->m[i / 4] * x[i] + (1.0f - r->m[i / 4]) * (r->z0[i] + (float)sigma * r->noise[i]);
        x = r->xb;
    }
    float c_in = (float)(1.0 / sqrt(sigma * sigma + 1.0)), t = (float)lp_sd_sigma_to_t(&r->sched, sigma);
    for (int64_t i = 0; i < r->px; i++)
        for (int ch = 0; ch < uc; ch++) r->xin[i * uc + ch] = ch < 4 ? x[i * 4 + ch] * c_in : r->extra[i * 5 + ch - 4];
    if (lp_sd_unet(r->g, r->xin, &t, r->ctx, 1, r->eps, err)) return -1;
    for (int64_t i = 0; i < n; i++) {
        out[i] = x[i] - (float)sigma * r->eps[i];
        if (r->m) out[i] = r->m[i / 4] * out[i] + (1.0f - r->m[i / 4]) * r->z0[i];
    }
    return 0;
}

/* euler, cfg 1: the init (and the mask) as lp_sd_generate's contract states -> latent [px][4] */
static void ref_img2img(const lp_sd_weights *w, const lp_clip_tokenizer *tok, const lp_sd_gen_params *p, float *lat) {
    enum { PX = (W / 8) * (H / 8) };
    static float img[W * H * 3], z0[PX * 4], zm[PX * 4], noise[PX * 4], x[PX * 4], scratch[3 * PX * 4];
    static float xin[PX * 9], eps[PX * 4], xb[PX * 4], m[PX], extra[PX * 5], ctx[77 * 32];
    lp_error err = {0};
    bool nine = lp_sd_weights_config(w)->unet_in == 9;
    ref_ctx r = {.g = lp_sd_graph_create(w, 1, H / 8, W / 8, p->n_threads, &err), .ctx = ctx, .z0 = z0,
                 .noise = noise, .px = PX, .xin = xin, .eps = eps, .xb = xb};
    lp_sd_schedule_init(&r.sched);
    int32_t ids[77];
    CHECK(lp_sd_encode_prompt(tok, NULL, p->prompt, ids, 77, &err) == 0);
    CHECK(lp_sd_text_encode(r.g, ids, 1, 1, ctx, &err) == 0);
    for (int pass = 0; pass < 1 + nine; pass++) { /* the init; the init with the masked pixels zeroed */
        for (int i = 0; i < W * H * 3; i++) img[i] = pass && p->mask[i / 3] >= 128 ? 0.0f : p->init[i] / 127.5f - 1.0f;
        CHECK(lp_sd_vae_encode(r.g, img, 1, pass ? zm : z0, &err) == 0);
    }
    for (int y = 0; p->mask && y < H / 8; y++)
        for (int xx = 0; xx < W / 8; xx++) {
            int on = 0;
            for (int i = 0; i < 64; i++) on += p->mask[(8 * y + i / 8) * W + 8 * xx + i % 8] >= 128;
            m[y * (W / 8) + xx] = on / 64.0f;
            extra[(y * (W / 8) + xx) * 5] = p->mask[8 * y * W + 8 * xx] >= 128;
            for (int ch = 0; ch < 4; ch++) extra[(y * (W / 8) + xx) * 5 + 1 + ch] = zm[(y * (W / 8) + xx) * 4 + ch];
        }
    r.m = p->mask && !nine ? m : NULL;
    r.extra = nine ? extra : NULL;
    double sig[1001];
    CHECK(lp_sd_sigmas(&r.sched, LP_SD_SAMPLER_EULER, LP_SD_SCHED_DISCRETE, p->steps, sig) == 0);
    int start = p->steps - (int)(p->steps * p->strength);
    lp_rng nr;
    lp_rng_seed(&nr, p->seed);
    for (int ch = 0; ch < 4; ch++)
        for (int i = 0; i < PX; i++) noise[i * 4 + ch] = lp_rng_normal(&nr);
    for (int i = 0; i < PX * 4; i++) x[i] = z0[i] + noise[i] * (float)sig[start];
    CHECK(lp_sd_sample(LP_SD_SAMPLER_EULER, sig + start, p->steps - start, x, PX * 4, ref_denoise, &r, &nr, 1, scratch,
                       NULL, NULL, &err) == 0);
    for (int i = 0; r.m && i < PX * 4; i++) x[i] = r.m[i / 4] * x[i] + (1.0f - r.m[i / 4]) * (z0[i] + 0.0f * noise[i]);
    for (int ch = 0; ch < 4; ch++) /* channel-major, as lp_sd_generate's latents_out */
        for (int i = 0; i < PX; i++) lat[ch * PX + i] = x[i * 4 + ch];
    lp_sd_graph_free(r.g);
}

static void count_step(void *ctx, int step, int steps) {
    (void)step, (void)steps;
    ++*(int *)ctx;
}

static void test_img2img(const lp_sd_weights *w, const lp_clip_tokenizer *tok, const uint8_t *init,
                         const lp_sd_config *tiny, const char *path) {
    static float lat[NLAT], ref[NLAT], plain[NLAT];
    static uint8_t rgb[W * H * 3], mask[W * H];
    lp_error err = {0};
    int steps_run = 0;
    lp_sd_gen_params p = {.prompt = "a red cube", .width = W, .height = H, .steps = 5, .cfg = 1.0f,
                          .sampler = LP_SD_SAMPLER_EULER, .seed = 9, .clip_skip = 1, .n_threads = 2, .init = init,
                          .on_step = count_step, .step_ctx = &steps_run};
    /* strengths: the steps floor(steps * strength) run, each equal to the restated pipeline */
    const float strengths[] = {1.0f, 0.6f, 0.2f};
    const int runs[] = {5, 3, 1};
    for (int k = 0; k < 3; k++) {
        p.strength = strengths[k], steps_run = 0;
        CHECK(gen(w, tok, p, lat, rgb) == 0);
        CHECK_MSG(steps_run == runs[k], "strength %g: %d steps run", (double)p.strength, steps_run);
        ref_img2img(w, tok, &p, ref);
        CHECK_MSG(!memcmp(lat, ref, sizeof lat), "image to image at strength %g != the restated pipeline",
                  (double)p.strength);
    }
    memcpy(plain, lat, sizeof plain); /* strength 0.2 */
    /* inpainting, 4-channel UNet: the left half repainted; everything kept; everything repainted */
    for (int i = 0; i < W * H; i++) mask[i] = i % W < W / 2 - 4 ? 255 : 0; /* off the 8x8 blocks */
    p.mask = mask, p.strength = 1.0f;
    CHECK(gen(w, tok, p, lat, rgb) == 0);
    ref_img2img(w, tok, &p, ref);
    CHECK_MSG(!memcmp(lat, ref, sizeof lat), "inpainting != the restated pipeline");
    memset(mask, 0, sizeof mask);
    p.strength = 0.2f;
    CHECK(gen(w, tok, p, lat, rgb) == 0);
    ref_img2img(w, tok, &(lp_sd_gen_params){.prompt = p.prompt, .steps = 1, .strength = 0.0f, .init = init,
                                            .mask = mask, .seed = p.seed, .n_threads = 2},
                ref); /* no step: the init's latent */
    CHECK_MSG(!memcmp(lat, ref, sizeof lat), "a mask keeping everything does not give the init's latent");
    memset(mask, 255, sizeof mask);
    CHECK(gen(w, tok, p, lat, rgb) == 0);
    CHECK_MSG(!memcmp(lat, plain, sizeof lat), "a mask repainting everything != image to image");
    /* refusals */
    lp_sd_gen_params q = p;
    q.strength = 0.1f; /* 0.5 step of 5 */
    CHECK(lp_sd_generate(w, tok, &q, NULL, rgb, &err) == -1 && strstr(err.message, "runs no step"));
    q.strength = 0.0f;
    CHECK(lp_sd_generate(w, tok, &q, NULL, rgb, &err) == -1 && strstr(err.message, "strength"));
    q = p, q.init = NULL;
    CHECK(lp_sd_generate(w, tok, &q, NULL, rgb, &err) == -1 && strstr(err.message, "needs an init"));

    /* a 9-channel inpainting UNet: [latent, mask, masked init's latent] in, as restated */
    lp_sd_config nine = *tiny;
    nine.unet_in = 9;
    CHECK(lp_sd_synth_write(&nine, LP_ST_F16, 12, "sd-tiny-inpaint", path, &err) == 0);
    lp_sd_model *m = lp_sd_model_load(path, &err);
    lp_sd_weights *w9 = m ? lp_sd_weights_create(m, LP_F32, &err) : NULL;
    lp_sd_model_free(m);
    CHECK_MSG(w9 != NULL, "%s", err.message);
    if (!w9) return;
    for (int i = 0; i < W * H; i++) mask[i] = (i / W) < H / 2 - 3 ? 255 : 0;
    p.strength = 1.0f;
    CHECK(gen(w9, tok, p, lat, rgb) == 0);
    ref_img2img(w9, tok, &p, ref);
    CHECK_MSG(!memcmp(lat, ref, sizeof lat), "9-channel inpainting != the restated pipeline");
    q = p, q.mask = NULL;
    CHECK(lp_sd_generate(w9, tok, &q, NULL, rgb, &err) == -1 && strstr(err.message, "inpainting UNet"));
    lp_sd_weights_free(w9);
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
            /* euler and dpm++2m in f32; euler with int8 weights, W8A16 and W8A8; the ancestral euler_a and
             * lcm (their noise per image) */
            for (int s = 0; s < 6; s++) {
                const lp_sd_weights *sw = s == 2 || s == 3 ? w8 : w;
                lp_sd_gen_params q = p;
                q.sampler = s == 1 ? LP_SD_SAMPLER_DPMPP_2M : s == 4 ? LP_SD_SAMPLER_EULER_A
                          : s == 5 ? LP_SD_SAMPLER_LCM : LP_SD_SAMPLER_EULER;
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

    test_img2img(w, tok, rgb[0], &tiny, path);

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
