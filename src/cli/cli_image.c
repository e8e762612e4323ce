/* The image model's subcommands: `loraplex image` (text to image with an
 * SD 1.x checkpoint, PNG out) and `loraplex synth --preset sd15|sd-tiny`
 * (reached from cli_synth: a random-weight SD 1.x checkpoint). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "image/sd.h"
#include "image/sd_compiled.h"
#include "image/sd_pipeline.h"
#include "tools/png.h"
#include "tools/sd_lora_synth.h"
#include "tools/sd_synth.h"

bool cli_is_image_preset(const char *name) {
    return !strcmp(name, "sd15") || !strcmp(name, "sd-tiny") || !strcmp(name, "sd-tiny-inpaint") ||
           !strcmp(name, "sd15-lora") || !strcmp(name, "sd-tiny-lora");
}

static void synth_image_usage(FILE *f) {
    fprintf(f, "usage: loraplex synth --preset sd15|sd-tiny|sd-tiny-inpaint [--type f32|f16|bf16] [--seed N]\n"
               "                       [--layout single|diffusers] -o OUT.safetensors|OUT_DIR\n"
               "       loraplex synth --preset sd15-lora|sd-tiny-lora [--format F] [--rank R] [--seed N] -o OUT.safetensors\n"
               "  sd15     Stable Diffusion 1.5's shapes and tensor names (UNet 860M, text encoder 123M,\n"
               "           VAE 84M parameters), random weights; --type f16 for a 2.1 GB file\n"
               "  sd-tiny  the same structure a few MB large, for tests (sd-tiny-inpaint: with the\n"
               "           inpainting UNet's 9 input channels)\n"
               "  --layout diffusers: a diffusers folder (text_encoder/, unet/, vae/) of the same tensors\n"
               "  the vocabulary is CLIP's (49408 tokens; the tokenizer reads sd/clip-bpe-merges.txt)\n"
               "  *-lora   a random LoRA for that model, F32, rank R (default 4), in format F:\n"
               "           kohya (default: every linear and conv, 3x3 convs as LoCon, alpha = R/2),\n"
               "           diffusers (the UNet's attention projections), peft (every linear),\n"
               "           cloneofsimo (attention and GEGLU linears, the text encoder's attention, a token <s1>)\n");
}

int cli_synth_image(int argc, char **argv) {
    const char *preset = NULL, *out = NULL, *format = "kohya", *layout = "single";
    lp_st_dtype dtype = LP_ST_F32;
    long seed = 1, rank = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            synth_image_usage(stdout);
            return 0;
        }
        if (!(v = cli_value(argc, argv, &i))) return 2;
        if (!strcmp(a, "--preset")) preset = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) out = v;
        else if (!strcmp(a, "--seed")) { if (!cli_int(a, v, 0, __LONG_MAX__, &seed)) return 2; }
        else if (!strcmp(a, "--rank")) { if (!cli_int(a, v, 1, 4096, &rank)) return 2; }
        else if (!strcmp(a, "--format")) format = v;
        else if (!strcmp(a, "--layout")) {
            if (strcmp(v, "single") && strcmp(v, "diffusers")) {
                fprintf(stderr, "loraplex synth: --layout %s: single or diffusers\n", v);
                return 2;
            }
            layout = v;
        } else if (!strcmp(a, "--type")) {
            if (!strcmp(v, "f32")) dtype = LP_ST_F32;
            else if (!strcmp(v, "f16")) dtype = LP_ST_F16;
            else if (!strcmp(v, "bf16")) dtype = LP_ST_BF16;
            else {
                fprintf(stderr, "loraplex synth: --type %s: an SD checkpoint is f32, f16 or bf16\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "loraplex synth: option '%s' does not apply to image presets (see --preset sd15 --help)\n", a);
            return 2;
        }
    }
    if (!out || !preset) {
        synth_image_usage(stderr);
        return 2;
    }
    lp_error err = {0};
    lp_sd_config c;
    size_t pl = strlen(preset);
    if (pl > 5 && !strcmp(preset + pl - 5, "-lora")) {
        char base[32];
        snprintf(base, sizeof base, "%.*s", (int)(pl - 5), preset);
        if (lp_sd_synth_preset(base, &c, &err) || lp_sd_synth_lora(&c, format, (int)rank, (uint64_t)seed, out, &err))
            return cli_fail("synth", &err);
        fprintf(stderr, "loraplex: wrote %s (a random %s LoRA for %s, rank %ld)\n", out, format, base, rank);
        return 0;
    }
    if (lp_sd_synth_preset(preset, &c, &err)) return cli_fail("synth", &err);
    if (!strcmp(layout, "diffusers")) { /* the checkpoint, then its tensors again under diffusers names */
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.single.safetensors", out);
        lp_sd_model *m = NULL;
        int rc = lp_sd_synth_write(&c, dtype, (uint64_t)seed, preset, tmp, &err) || !(m = lp_sd_model_load(tmp, &err)) ||
                 lp_sd_write_diffusers(m, out, &err);
        lp_sd_model_free(m);
        remove(tmp);
        if (rc) return cli_fail("synth", &err);
    } else if (lp_sd_synth_write(&c, dtype, (uint64_t)seed, preset, out, &err)) {
        return cli_fail("synth", &err);
    }
    lp_sd_counts n = lp_sd_layout_counts(&c);
    fprintf(stderr, "loraplex: wrote %s (%s, %lld tensors: text encoder %lld, UNet %lld, VAE %lld parameters)\n", out,
            lp_st_dtype_name(dtype), (long long)n.tensors, (long long)n.te, (long long)n.unet, (long long)n.vae);
    return 0;
}

/* ---- loraplex image ------------------------------------------------------------------------------ */

static void image_usage(FILE *f) {
    fprintf(f,
            "usage: loraplex image -m MODEL.safetensors -p PROMPT [options] -o OUT.png\n"
            "  -m, --model PATH     SD 1.x single-file checkpoint (F32/F16/BF16 safetensors), a\n"
            "                       diffusers folder (text_encoder/, unet/, vae/), or a model\n"
            "                       compiled by loraplex compile (memory-mapped)\n"
            "  -p, --prompt TEXT    the prompt; several -p: one image each, in one batch\n"
            "  --batch N            N images in one UNet batch (prompts in turn; image b: seed + b)\n"
            "  -n, --negative TEXT  the negative prompt (default empty)\n"
            "  -W, -H N             image size in pixels (default: the init image's, else 512;\n"
            "                       multiples of 64 for SD 1.5)\n"
            "  --init PNG           image to image: start from this picture, encoded by the VAE\n"
            "  --strength S         how much of the schedule reruns on it, (0, 1] (default 0.75)\n"
            "  --mask PNG           inpainting (with --init): white (>= 128) pixels are repainted, the\n"
            "                       rest kept; an inpainting UNet (9 input channels) needs it\n"
            "  --steps N            sampling steps (default 20)\n"
            "  --cfg S              classifier-free guidance scale (default 7.5; 1 = off)\n"
            "  --sampler NAME       euler, euler_a, ddim, dpm++2m, lcm (default euler)\n"
            "  --scheduler NAME     discrete, karras (default discrete)\n"
            "  --seed N             noise seed (default 1)\n"
            "  --clip-skip N        stop the text encoder N-1 layers early (default 1)\n"
            "  --noise FILE         initial noise, raw little-endian float32 [4][H/8][W/8]\n"
            "  --latents-out FILE   write the final latents the same way (all images, in order)\n"
            "  --lora PATH[:SCALE]  a LoRA as a runtime input (Kohya, diffusers, PEFT or cloneofsimo\n"
            "                       safetensors), at SCALE (default 1); up to 8, applied in order\n"
            "  --image-lora B=PATH[:SCALE]  an adapter for image B only (0-based), after the --lora ones\n"
            "  --merges FILE        CLIP merge list (default: a folder's tokenizer/merges.txt, else\n"
            "                       sd/clip-bpe-merges.txt in shared/models)\n"
            "  --precision P        f32 (default), w8a16 (int8 weights per output channel, float\n"
            "                       activations) or w8a8 (int8 activations per pixel too);\n"
            "                       a compiled model: its weights' (default: as compiled)\n"
            "  -t, --threads N      threads (default: the cores)\n"
            "  -o, --output PATH    the PNG to write (several images: PATH with -0, -1, ... before .png)\n");
}

/* the merge list: a diffusers folder's tokenizer/merges.txt, else CLIP's in shared/models */
static bool find_merges(const char *model, char *out, size_t cap) {
    struct stat sb;
    snprintf(out, cap, "%s/tokenizer/merges.txt", model);
    if (stat(out, &sb) == 0) return true;
    const char *env = getenv("LORAPLEX_SHARED_MODELS");
    const char *dirs[] = {env, LP_SHARED_MODELS, "shared/models", "../shared/models", "../../shared/models"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        if (!dirs[i]) continue;
        snprintf(out, cap, "%s/sd/clip-bpe-merges.txt", dirs[i]);
        struct stat st;
        if (stat(out, &st) == 0) return true;
    }
    return false;
}

typedef struct progress {
    double start, first; /* the run's start; the end of step 1 */
} progress;

/* s/step from step 2 on counts the steps alone (step 1's time includes the
 * text encoder) */
static void on_step(void *ctx, int step, int steps) {
    progress *p = ctx;
    double now = lp_now_seconds();
    if (step == 1) p->first = now;
    double per = step == 1 ? now - p->start : (now - p->first) / (step - 1);
    int bar = 30 * step / steps;
    fprintf(stderr, "\r[%.*s%*s] step %d/%d  %.2f s/step  ETA %.0f s ", bar,
            "==============================", 30 - bar, "", step, steps, per, per * (steps - step));
    if (step == steps) fputc('\n', stderr);
}

static int write_raw(const char *path, const float *v, int64_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(v, sizeof(float), (size_t)n, f); /* little-endian hosts */
    return fclose(f) == 0 && w == (size_t)n ? 0 : -1;
}

/* --lora PATH[:SCALE]: the scale only when what follows the last ':' is a number */
static int load_lora(const char *arg, const lp_sd_config *c, lp_sd_lora_use *out, lp_error *err) {
    char path[4096];
    float scale = 1.0f;
    snprintf(path, sizeof path, "%s", arg);
    char *colon = strrchr(path, ':'), *end = NULL;
    if (colon && colon[1]) {
        double s = strtod(colon + 1, &end);
        if (end && !*end && isfinite(s) && fabs(s) <= 100) {
            scale = (float)s;
            *colon = 0;
        }
    }
    lp_sd_lora *l = lp_sd_lora_load(path, c, err);
    if (!l) return -1;
    *out = (lp_sd_lora_use){.lora = l, .scale = scale};
    fprintf(stderr, "loraplex image: adapter %s (%s: %d UNet and %d text encoder modules, rank up to %d%s) at %g\n",
            path, lp_sd_lora_format(l), lp_sd_lora_count(l, LP_SD_PART_UNET), lp_sd_lora_count(l, LP_SD_PART_TE),
            lp_sd_lora_max_rank(l), lp_sd_lora_n_tokens(l) ? ", with tokens" : "", scale);
    return 0;
}

/* whether path starts like a compiled SD model (sd_compiled.h) */
static bool is_compiled(const char *path) {
    FILE *f = fopen(path, "rb");
    char magic[4] = {0};
    bool yes = f && fread(magic, 1, 4, f) == 4 && lp_sd_compiled_magic(magic, 4);
    if (f) fclose(f);
    return yes;
}

int cli_image_compile(const char *in, const char *out, uint32_t weight_type, bool int8_activations) {
    lp_error err = {0};
    double t0 = lp_now_seconds();
    lp_sd_model *m = lp_sd_model_load(in, &err);
    lp_sd_weights *w = m ? lp_sd_weights_create(m, weight_type, &err) : NULL;
    lp_sd_model_free(m);
    if (!w) return cli_fail("compile", &err);
    double t1 = lp_now_seconds();
    int rc = lp_sd_weights_save(w, int8_activations, out, &err);
    double t2 = lp_now_seconds();
    int64_t f32_bytes, w8_bytes;
    lp_sd_weights_bytes(w, &f32_bytes, &w8_bytes);
    lp_sd_weights_free(w);
    if (rc) return cli_fail("compile", &err);
    lp_sd_weights *c = lp_sd_weights_open(out, &err);
    double t3 = lp_now_seconds();
    if (!c) return cli_fail("compile: reloading the output", &err);
    lp_sd_weights_free(c);
    printf("compiled %s -> %s (SD 1.x)\n", in, out);
    printf("  weights %s: %lld MB int8 + %lld MB f32, activations %s by default\n",
           weight_type == LP_W8 ? "q8 per output channel" : "f32", (long long)(w8_bytes >> 20),
           (long long)(f32_bytes >> 20), int8_activations ? "int8 (w8a8)" : "float (w8a16)");
    printf("  convert %.1f s, write %.1f s, load output %.1f ms\n", t1 - t0, t2 - t1, (t3 - t2) * 1e3);
    return 0;
}

/* image b's file: OUT itself for one image, else OUT with -b before its extension */
static void image_path(const char *out, int b, int n, char *buf, size_t cap) {
    const char *dot = strrchr(out, '.'), *slash = strrchr(out, '/');
    if (n == 1) snprintf(buf, cap, "%s", out);
    else if (dot && (!slash || dot > slash)) snprintf(buf, cap, "%.*s-%d%s", (int)(dot - out), out, b, dot);
    else snprintf(buf, cap, "%s-%d", out, b);
}

/* --init (and --mask): the pictures, and the image size when -W / -H left it open (0) */
static int read_init(const char *init_path, const char *mask_path, long *width, long *height, uint8_t **init,
                     uint8_t **mask) {
    lp_error err = {0};
    int w, h, mw, mh;
    uint8_t *m = NULL;
    if (lp_png_read(init_path, (int64_t)4096 * 4096, init, &w, &h, &err)) return cli_fail("init", &err);
    if ((*width && *width != w) || (*height && *height != h)) {
        fprintf(stderr, "loraplex image: %s is %dx%d, not the %ldx%ld asked for (resize it first)\n", init_path, w, h,
                *width ? *width : w, *height ? *height : h);
        free(*init), *init = NULL;
        return 1;
    }
    *width = w, *height = h;
    if (!mask_path) return 0;
    if (lp_png_read(mask_path, (int64_t)4096 * 4096, &m, &mw, &mh, &err) || mw != w || mh != h) {
        if (m) fprintf(stderr, "loraplex image: mask %s is %dx%d, the init image %dx%d\n", mask_path, mw, mh, w, h);
        else cli_fail("mask", &err);
        free(m), free(*init), *init = NULL;
        return 1;
    }
    for (int64_t i = 0; i < (int64_t)w * h; i++) m[i] = (uint8_t)((m[3 * i] + m[3 * i + 1] + m[3 * i + 2]) / 3);
    *mask = m;
    return 0;
}

int cli_image(int argc, char **argv) {
    const char *model = NULL, *prompts[LP_SD_MAX_IMAGES], *negative = "", *out = NULL, *noise_path = NULL;
    const char *lat_path = NULL, *merges = NULL, *lora_arg[LP_SD_MAX_ROW_LORAS], *image_lora[4 * LP_SD_MAX_IMAGES];
    int n_lora = 0, n_prompts = 0, n_image_lora = 0;
    long batch = 0;
    const char *init_path = NULL, *mask_path = NULL;
    double strength = 0.75;
    long width = 0, height = 0, steps = 20, seed = 1, clip_skip = 1, threads = lp_default_threads();
    double cfg = 7.5;
    int precision = -1; /* 0 f32, 1 w8a16, 2 w8a8; -1: f32, or a compiled file's own */
    int sampler = LP_SD_SAMPLER_EULER, scheduler = LP_SD_SCHED_DISCRETE;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            image_usage(stdout);
            return 0;
        }
        if (!(v = cli_value(argc, argv, &i))) return 2;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (n_prompts == LP_SD_MAX_IMAGES) {
                fprintf(stderr, "loraplex image: at most %d prompts\n", LP_SD_MAX_IMAGES);
                return 2;
            }
            prompts[n_prompts++] = v;
        }
        else if (!strcmp(a, "--batch")) { if (!cli_int(a, v, 1, LP_SD_MAX_IMAGES, &batch)) return 2; }
        else if (!strcmp(a, "--image-lora")) {
            char *end = NULL;
            long b = strtol(v, &end, 10);
            if (end == v || *end != '=' || b < 0 || b >= LP_SD_MAX_IMAGES || n_image_lora == 4 * LP_SD_MAX_IMAGES) {
                fprintf(stderr, "loraplex image: --image-lora %s: IMAGE=PATH[:SCALE], IMAGE 0..%d\n", v, LP_SD_MAX_IMAGES - 1);
                return 2;
            }
            image_lora[n_image_lora++] = v;
        }
        else if (!strcmp(a, "-n") || !strcmp(a, "--negative")) negative = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) out = v;
        else if (!strcmp(a, "--noise")) noise_path = v;
        else if (!strcmp(a, "--init")) init_path = v;
        else if (!strcmp(a, "--mask")) mask_path = v;
        else if (!strcmp(a, "--strength")) { if (!cli_float(a, v, 0, 1, &strength)) return 2; }
        else if (!strcmp(a, "--latents-out")) lat_path = v;
        else if (!strcmp(a, "--merges")) merges = v;
        else if (!strcmp(a, "--lora")) {
            if (n_lora == LP_SD_MAX_ROW_LORAS) {
                fprintf(stderr, "loraplex image: at most %d --lora\n", LP_SD_MAX_ROW_LORAS);
                return 2;
            }
            lora_arg[n_lora++] = v;
        }
        else if (!strcmp(a, "-W") || !strcmp(a, "--width")) { if (!cli_int(a, v, 8, 4096, &width)) return 2; }
        else if (!strcmp(a, "-H") || !strcmp(a, "--height")) { if (!cli_int(a, v, 8, 4096, &height)) return 2; }
        else if (!strcmp(a, "--steps")) { if (!cli_int(a, v, 1, 1000, &steps)) return 2; }
        else if (!strcmp(a, "--seed")) { if (!cli_int(a, v, 0, __LONG_MAX__, &seed)) return 2; }
        else if (!strcmp(a, "--clip-skip")) { if (!cli_int(a, v, 1, 64, &clip_skip)) return 2; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { if (!cli_int(a, v, 1, LP_THREADS_MAX, &threads)) return 2; }
        else if (!strcmp(a, "--cfg")) { if (!cli_float(a, v, 0, 100, &cfg)) return 2; }
        else if (!strcmp(a, "--sampler")) {
            if ((sampler = lp_sd_sampler_parse(v)) < 0) {
                fprintf(stderr, "loraplex image: --sampler %s: euler, euler_a, ddim, dpm++2m or lcm\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--precision")) {
            if (!strcmp(v, "f32")) precision = 0;
            else if (!strcmp(v, "w8a16")) precision = 1;
            else if (!strcmp(v, "w8a8")) precision = 2;
            else {
                fprintf(stderr, "loraplex image: --precision %s: f32, w8a16 or w8a8\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--scheduler")) {
            if ((scheduler = lp_sd_scheduler_parse(v)) < 0) {
                fprintf(stderr, "loraplex image: --scheduler %s: discrete or karras\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "loraplex image: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (mask_path && !init_path) {
        fprintf(stderr, "loraplex image: --mask needs --init (the picture to inpaint)\n");
        return 2;
    }
    if (!model || !n_prompts || !out) {
        fprintf(stderr, "loraplex image: -m MODEL, -p PROMPT and -o OUT are required (see --help)\n");
        return 2;
    }
    char merges_buf[1024];
    if (!merges) {
        if (!find_merges(model, merges_buf, sizeof merges_buf)) {
            fprintf(stderr, "loraplex image: no sd/clip-bpe-merges.txt in LORAPLEX_SHARED_MODELS or shared/models; "
                            "give --merges FILE\n");
            return 1;
        }
        merges = merges_buf;
    }
    lp_error err = {0};
    int rc = 1;
    float *noise = NULL, *lat = NULL;
    uint8_t *rgb = NULL, *init = NULL, *mask = NULL;
    if (init_path && read_init(init_path, mask_path, &width, &height, &init, &mask)) return 1;
    if (!width) width = 512;
    if (!height) height = 512;
    lp_sd_weights *w = NULL;
    lp_sd_row_loras uses = {0}, sets[LP_SD_MAX_IMAGES];
    const lp_sd_lora *owned[4 * LP_SD_MAX_IMAGES];
    int n_owned = 0;
    lp_clip_tokenizer *tok = lp_clip_tokenizer_load(merges, &err);
    if (!tok) return cli_fail("tokenizer", &err);
    if (is_compiled(model)) {
        if (!(w = lp_sd_weights_open(model, &err))) {
            cli_fail("model", &err);
            goto done;
        }
        bool w8 = lp_sd_weights_type(w) == LP_W8;
        if (precision < 0) precision = !w8 ? 0 : lp_sd_weights_int8_activations(w) ? 2 : 1;
        if (w8 != (precision > 0)) {
            fprintf(stderr, "loraplex image: %s holds %s weights: --precision %s\n", model, w8 ? "int8" : "f32",
                    w8 ? "w8a16 or w8a8" : "f32 (compile it with --weights q8 for int8)");
            goto done;
        }
    } else {
        if (precision < 0) precision = 0;
        lp_sd_model *m = lp_sd_model_load(model, &err);
        if (!m) {
            cli_fail("model", &err);
            goto done;
        }
        w = lp_sd_weights_create(m, precision ? LP_W8 : LP_F32, &err);
        lp_sd_model_free(m); /* the weights are converted copies */
        if (!w) {
            cli_fail("model", &err);
            goto done;
        }
    }
    static const char *const precision_name[] = {"f32", "w8a16", "w8a8"};
    int64_t f32_bytes, w8_bytes;
    lp_sd_weights_bytes(w, &f32_bytes, &w8_bytes);
    fprintf(stderr, "loraplex image: %s weights, %lld MB int8 + %lld MB f32\n", precision_name[precision],
            (long long)(w8_bytes >> 20), (long long)(f32_bytes >> 20));
    int B = batch ? (int)batch : n_prompts;
    for (int i = 0; i < n_lora; i++)
        if (load_lora(lora_arg[i], lp_sd_weights_config(w), &uses.use[uses.n++], &err)) {
            uses.n--;
            cli_fail("lora", &err);
            goto done;
        }
    for (int b = 0; b < B; b++) sets[b] = uses;
    for (int i = 0; i < n_image_lora; i++) {
        char *end;
        int b = (int)strtol(image_lora[i], &end, 10);
        if (b >= B) {
            fprintf(stderr, "loraplex image: --image-lora %s: there are %d images\n", image_lora[i], B);
            goto done;
        }
        if (sets[b].n == LP_SD_MAX_ROW_LORAS) {
            fprintf(stderr, "loraplex image: image %d: at most %d adapters\n", b, LP_SD_MAX_ROW_LORAS);
            goto done;
        }
        if (load_lora(end + 1, lp_sd_weights_config(w), &sets[b].use[sets[b].n], &err)) {
            cli_fail("lora", &err);
            goto done;
        }
        owned[n_owned++] = sets[b].use[sets[b].n++].lora;
    }
    const char *image_prompts[LP_SD_MAX_IMAGES];
    for (int b = 0; b < B; b++) image_prompts[b] = prompts[b % n_prompts];
    int64_t nlat = (int64_t)lp_sd_weights_config(w)->vae_z * (height / 8) * (width / 8);
    if (noise_path) {
        char *data;
        size_t size;
        if (lp_read_file(noise_path, &data, &size, (size_t)1 << 30, &err)) {
            cli_fail("noise", &err);
            goto done;
        }
        if (size != (size_t)nlat * 4 || width % 8 || height % 8) {
            fprintf(stderr, "loraplex image: %s has %zu bytes; a %ldx%ld image takes [4][%ld][%ld] float32 = %lld\n",
                    noise_path, size, width, height, height / 8, width / 8, (long long)nlat * 4);
            free(data);
            goto done;
        }
        noise = malloc((size_t)nlat * sizeof(float));
        if (noise) memcpy(noise, data, (size_t)nlat * 4);
        free(data);
    }
    lat = malloc((size_t)nlat * (size_t)B * sizeof(float));
    rgb = malloc((size_t)(width * height * 3) * (size_t)B);
    if (!lat || !rgb || (noise_path && !noise)) {
        fprintf(stderr, "loraplex image: out of memory\n");
        goto done;
    }
    progress pr = {.start = lp_now_seconds()};
    lp_sd_timings tm = {0};
    lp_sd_gen_params gp = {.prompt = prompts[0], .prompts = image_prompts, .batch = B, .image_loras = sets,
                           .negative = negative, .width = (int)width, .height = (int)height,
                           .steps = (int)steps, .cfg = (float)cfg, .sampler = sampler, .scheduler = scheduler,
                           .seed = (uint64_t)seed, .clip_skip = (int)clip_skip, .n_threads = (int)threads,
                           .int8_activations = precision == 2, .noise = noise, .loras = uses, .on_step = on_step, .step_ctx = &pr,
                           .init = init, .strength = (float)strength, .mask = mask, .timings = &tm};
    if (lp_sd_generate(w, tok, &gp, lat, rgb, &err)) {
        cli_fail("image", &err);
        goto done;
    }
    if (lat_path && write_raw(lat_path, lat, nlat * B)) {
        fprintf(stderr, "loraplex image: cannot write %s\n", lat_path);
        goto done;
    }
    for (int b = 0; b < B; b++) {
        char path[4096];
        image_path(out, b, B, path, sizeof path);
        if (lp_png_write(path, rgb + (size_t)b * (size_t)(width * height * 3), (int)width, (int)height, &err)) {
            cli_fail("image", &err);
            goto done;
        }
        fprintf(stderr, "loraplex: wrote %s (%ldx%ld, %s, %ld steps, cfg %g, seed %ld)\n", path, width, height,
                lp_sd_sampler_name(sampler), steps, cfg, seed + b);
    }
    fprintf(stderr, "loraplex: text encoder %.0f ms, ", tm.text * 1e3);
    if (init) fprintf(stderr, "VAE encoder %.2f s, ", tm.encode);
    fprintf(stderr, "UNet %.2f s/step (%d step%s, %.1f s), VAE decoder %.2f s\n", tm.steps ? tm.unet / tm.steps : 0.0,
            tm.steps, tm.steps == 1 ? "" : "s", tm.unet, tm.decode);
    fprintf(stderr, "loraplex: %d image%s in %.1f s\n", B, B > 1 ? "s" : "", lp_now_seconds() - pr.start);
    rc = 0;
done:
    free(noise), free(lat), free(rgb), free(init), free(mask);
    for (int i = 0; i < uses.n; i++) lp_sd_lora_free((lp_sd_lora *)uses.use[i].lora);
    for (int i = 0; i < n_owned; i++) lp_sd_lora_free((lp_sd_lora *)owned[i]);
    lp_sd_weights_free(w);
    lp_clip_tokenizer_free(tok);
    return rc;
}
