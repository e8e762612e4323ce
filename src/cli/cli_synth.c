/* loraplex synth: random-weight models of real shapes (and random GGUF LoRA
 * adapters for them), for tests and benchmarks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "../base/base.h"
#include "../base/dtype.h"
#include "../tools/synth.h"
#include "cli.h"

static void synth_usage(FILE *out) {
    fprintf(out,
            "usage: loraplex synth --preset NAME [options] -o OUT.gguf\n"
            "       loraplex synth --arch llama|qwen2|qwen3 --dim N --layers N --heads N\n"
            "                      --kv-heads N --ffn N [--head-dim N] [options] -o OUT.gguf\n"
            "       loraplex synth --lora-for BASE.gguf [--rank R] [--alpha A]\n"
            "                      [--targets q,k,v,o,gate,up,down] -o OUT.gguf\n"
            "presets: tinyllama-1.1b, llama-3.2-1b, qwen2.5-0.5b, qwen3-0.6b, tiny\n"
            "         sd15, sd-tiny: Stable Diffusion 1.x safetensors; sd15-lora, sd-tiny-lora: LoRAs for them\n"
            "         (see --preset sd15 --help)\n"
            "options:\n"
            "  --type T        weight type: f32 f16 bf16 q8_0 q4_0 q4_k q5_k q6_k (default f16)\n"
            "  --embd-type T   token embedding / output type (default: f16, or f32 with --type f32)\n"
            "  --vocab PATH    GGUF whose tokenizer is copied, or 'none' for a byte vocabulary\n"
            "                  (default for presets: the real vocabulary from shared/models/arch)\n"
            "  --ctx N         context length   --theta X  rope base   --eps X  rms epsilon\n"
            "  --tied          tie output to the embedding   --llama3-rope  llama3 rope scaling\n"
            "  --seed N        random seed (default 1)\n");
}

static bool parse_type(const char *text, uint32_t *out) {
    static const struct { const char *name; uint32_t type; } types[] = {
        {"f32", LP_F32}, {"f16", LP_F16}, {"bf16", LP_BF16}, {"q8_0", LP_Q8_0},
        {"q4_0", LP_Q4_0}, {"q4_1", LP_Q4_1}, {"q5_0", LP_Q5_0}, {"q5_1", LP_Q5_1},
        {"q4_k", LP_Q4_K}, {"q5_k", LP_Q5_K}, {"q6_k", LP_Q6_K},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcasecmp(text, types[i].name)) {
            *out = types[i].type;
            return true;
        }
    fprintf(stderr, "loraplex synth: unknown type '%s' (f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 "
                    "q5_1 q4_k q5_k q6_k)\n", text);
    return false;
}

/* Where the real vocabularies live: $LORAPLEX_SHARED_MODELS, the build's
 * shared/models, or ../shared/models from the current directory. */
static bool find_vocab(const char *file, char *out, size_t cap) {
    const char *env = getenv("LORAPLEX_SHARED_MODELS");
    const char *dirs[] = {env, LP_SHARED_MODELS, "shared/models", "../shared/models",
                          "../../shared/models"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        if (!dirs[i]) continue;
        snprintf(out, cap, "%s/arch/%s", dirs[i], file);
        struct stat st;
        if (stat(out, &st) == 0) return true;
    }
    return false;
}

int cli_synth(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--preset") && cli_is_image_preset(argv[i + 1])) return cli_synth_image(argc, argv);
    lp_synth_params p;
    memset(&p, 0, sizeof p);
    const char *preset = NULL, *out = NULL, *vocab = NULL, *lora_base = NULL;
    const char *targets = "q,k,v,o,gate,up,down", *arch = NULL;
    long dim = 0, layers = 0, heads = 0, kv_heads = 0, ffn = 0, head_dim = 0, ctx = 0;
    long rank = 4, seed = 1;
    double theta = 0, eps = 0, alpha = 0;
    bool tied = false, llama3_rope = false, type_set = false, embd_set = false;
    uint32_t type = LP_F16, embd_type = LP_F16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        bool needs = strcmp(a, "--tied") && strcmp(a, "--llama3-rope") && strcmp(a, "-h") &&
                     strcmp(a, "--help");
        if (needs && !(v = cli_value(argc, argv, &i))) return 2;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { synth_usage(stdout); return 0; }
        else if (!strcmp(a, "--tied")) tied = true;
        else if (!strcmp(a, "--llama3-rope")) llama3_rope = true;
        else if (!strcmp(a, "--preset")) preset = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) out = v;
        else if (!strcmp(a, "--vocab")) vocab = v;
        else if (!strcmp(a, "--arch")) arch = v;
        else if (!strcmp(a, "--lora-for")) lora_base = v;
        else if (!strcmp(a, "--targets")) targets = v;
        else if (!strcmp(a, "--type")) { if (!parse_type(v, &type)) return 2; type_set = true; }
        else if (!strcmp(a, "--embd-type")) { if (!parse_type(v, &embd_type)) return 2; embd_set = true; }
        else if (!strcmp(a, "--dim")) { if (!cli_int(a, v, 2, 1 << 16, &dim)) return 2; }
        else if (!strcmp(a, "--layers")) { if (!cli_int(a, v, 1, 1024, &layers)) return 2; }
        else if (!strcmp(a, "--heads")) { if (!cli_int(a, v, 1, 1024, &heads)) return 2; }
        else if (!strcmp(a, "--kv-heads")) { if (!cli_int(a, v, 1, 1024, &kv_heads)) return 2; }
        else if (!strcmp(a, "--ffn")) { if (!cli_int(a, v, 1, 1 << 18, &ffn)) return 2; }
        else if (!strcmp(a, "--head-dim")) { if (!cli_int(a, v, 2, 1024, &head_dim)) return 2; }
        else if (!strcmp(a, "--ctx")) { if (!cli_int(a, v, 8, 1 << 24, &ctx)) return 2; }
        else if (!strcmp(a, "--rank")) { if (!cli_int(a, v, 1, 4096, &rank)) return 2; }
        else if (!strcmp(a, "--seed")) { if (!cli_int(a, v, 0, __LONG_MAX__, &seed)) return 2; }
        else if (!strcmp(a, "--theta")) { if (!cli_float(a, v, 1, 1e9, &theta)) return 2; }
        else if (!strcmp(a, "--eps")) { if (!cli_float(a, v, 1e-12, 1, &eps)) return 2; }
        else if (!strcmp(a, "--alpha")) { if (!cli_float(a, v, 1e-6, 1e6, &alpha)) return 2; }
        else {
            fprintf(stderr, "loraplex synth: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "loraplex synth: -o OUT is required (see --help)\n");
        return 2;
    }
    lp_error err = {0};
    if (lora_base) {
        if (lp_synth_lora_write(lora_base, (int)rank, alpha > 0 ? (float)alpha : (float)rank,
                                targets, (uint64_t)seed, out, &err))
            return cli_fail("cannot write adapter", &err);
        fprintf(stderr, "loraplex: wrote %s\n", out);
        return 0;
    }
    if (preset) {
        if (lp_synth_preset(preset, &p, &err)) return cli_fail("synth", &err);
    } else {
        if (!arch || !dim || !layers || !heads || !ffn) {
            fprintf(stderr, "loraplex synth: give --preset, or --arch with --dim --layers "
                            "--heads --ffn (see --help)\n");
            return 2;
        }
        if (lp_arch_from_name(arch, &p.arch)) {
            fprintf(stderr, "loraplex synth: unknown --arch '%s' (llama, qwen2, qwen3)\n", arch);
            return 2;
        }
        p.n_ctx = 2048;
        p.rope_theta = 10000.0f;
        p.rms_eps = 1e-5f;
        p.weight_type = LP_F16;
        p.embd_type = LP_F16;
        p.seed = 1;
        p.name = "synth";
    }
    if (dim) p.dim = (int)dim;
    if (layers) p.n_layers = (int)layers;
    if (heads) p.n_heads = (int)heads;
    if (kv_heads) p.n_kv_heads = (int)kv_heads;
    else if (!preset) p.n_kv_heads = p.n_heads;
    if (ffn) p.ffn_dim = (int)ffn;
    if (head_dim) p.head_dim = (int)head_dim;
    else if (!preset || dim || heads) p.head_dim = p.dim / p.n_heads;
    if (ctx) p.n_ctx = (int)ctx;
    if (theta > 0) p.rope_theta = (float)theta;
    if (eps > 0) p.rms_eps = (float)eps;
    if (tied) p.tied_output = true;
    if (llama3_rope) p.llama3_rope_scaling = true;
    if (type_set) p.weight_type = type;
    if (embd_set) p.embd_type = embd_type;
    else if (type_set) p.embd_type = type == LP_F32 ? LP_F32 : LP_F16;
    p.seed = (uint64_t)seed;

    char vocab_path[1024];
    if (vocab && strcmp(vocab, "none") != 0) {
        p.vocab_path = vocab;
    } else if (!vocab && preset && lp_synth_preset_vocab(preset)) {
        if (!find_vocab(lp_synth_preset_vocab(preset), vocab_path, sizeof vocab_path)) {
            fprintf(stderr, "loraplex synth: cannot find the vocabulary %s (set "
                            "LORAPLEX_SHARED_MODELS, pass --vocab PATH, or --vocab none)\n",
                    lp_synth_preset_vocab(preset));
            return 1;
        }
        p.vocab_path = vocab_path;
    }
    double t0 = lp_now_seconds();
    if (lp_synth_write(&p, out, &err)) return cli_fail("cannot write model", &err);
    fprintf(stderr, "loraplex: wrote %s (%s, dim %d, %d layers) in %.1f s\n", out,
            lp_arch_name(p.arch), p.dim, p.n_layers, lp_now_seconds() - t0);
    return 0;
}
