/* The image model's subcommands: `loraplex synth --preset sd15|sd-tiny`
 * (reached from cli_synth) writes a random-weight SD 1.x checkpoint. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "image/sd.h"
#include "tools/sd_synth.h"

bool cli_is_image_preset(const char *name) { return !strcmp(name, "sd15") || !strcmp(name, "sd-tiny"); }

static void synth_image_usage(FILE *f) {
    fprintf(f, "usage: loraplex synth --preset sd15|sd-tiny [--type f32|f16|bf16] [--seed N] -o OUT.safetensors\n"
               "  sd15     Stable Diffusion 1.5's shapes and tensor names (UNet 860M, text encoder 123M,\n"
               "           VAE 84M parameters), random weights; --type f16 for a 2.1 GB file\n"
               "  sd-tiny  the same structure a few MB large, for tests\n"
               "  the vocabulary is CLIP's (49408 tokens; the tokenizer reads sd/clip-bpe-merges.txt)\n");
}

int cli_synth_image(int argc, char **argv) {
    const char *preset = NULL, *out = NULL;
    lp_st_dtype dtype = LP_ST_F32;
    long seed = 1;
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
        else if (!strcmp(a, "--type")) {
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
    if (lp_sd_synth_preset(preset, &c, &err)) return cli_fail("synth", &err);
    if (lp_sd_synth_write(&c, dtype, (uint64_t)seed, preset, out, &err)) return cli_fail("synth", &err);
    lp_sd_counts n = lp_sd_layout_counts(&c);
    fprintf(stderr, "loraplex: wrote %s (%s, %lld tensors: text encoder %lld, UNet %lld, VAE %lld parameters)\n", out,
            lp_st_dtype_name(dtype), (long long)n.tensors, (long long)n.te, (long long)n.unet, (long long)n.vae);
    return 0;
}
