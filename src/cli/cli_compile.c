/* loraplex compile: any model we load -> one memory-mappable .lpx file with
 * the weights already in the kernels' layout (see src/formats/lpx.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/base.h"
#include "../model/model.h"
#include "../tools/compile.h"
#include "cli.h"

int cli_compile(int argc, char **argv);

static void compile_usage(FILE *out) {
    fprintf(out,
            "usage: loraplex compile IN -o OUT.lpx [--weights q4|q4c|q8|f16|f32] [options]\n"
            "IN: a GGUF file (F32/F16/BF16/Q8_0/Q4_0/K-quants), a Hugging Face directory,\n"
            "    a llama2.c checkpoint or another .lpx file; or an SD 1.x single-file\n"
            "    .safetensors checkpoint (--weights q8 (default) or f32; --acts the default\n"
            "    activations of loraplex image on it)\n"
            "options:\n"
            "  --weights T     q4: int4 group-wise (W4), q4c: int4 codebook with 8-bit log\n"
            "                  scales (W4C: 4.25 bits per weight, lower KL than q4),\n"
            "                  q8: int8 group-wise (W8), f16, f32\n"
            "                  (default q4c; q4 is the format GGUF Q4_0 files repack into)\n"
            "  --group N       elements per scale: q4/q4c 32|64|128, q8 a multiple of 32 (default 32)\n"
            "  --acts A        q8: int8 activations on integer kernels (W4A8, default),\n"
            "                  f32: float activations (W4A16, for accuracy comparison)\n"
            "  --no-search     q4: plain absmax scales (faster, less accurate)\n"
            "  --q4-output     q4/q4c: pack the classifier (output / tied embedding) in 4 bits\n"
            "                  too; by default it stays 8-bit, as small models need it\n"
            "  --no-fuse       keep q/k/v and gate/up as separate matrices\n"
            "  --no-fold       keep RMSNorm gains separate from the next projections\n"
            "  --fold          q4/q4c: fold them anyway (default for 4 bits: not folded, it costs\n"
            "                  accuracy; q8/f16/f32 fold by default)\n"
            "  --threads N     quantization threads (default: all cores)\n"
            "  --tokenizer P   llama2.c input: tokenizer .bin file\n"
            "  --quiet         no progress bar\n");
}

typedef struct progress_state {
    bool tty, quiet;
    double t0, last;
    int last_decile;
} progress_state;

/* "[####......] 12/156 blk.3.ffn_down  431 MB/s  ETA 4s" on a TTY (\r
 * updates), a line per 10% otherwise. */
static void on_progress(void *user, int i, int n, const char *name, uint64_t done, uint64_t total) {
    progress_state *s = user;
    if (s->quiet) return;
    double now = lp_now_seconds(), el = now - s->t0;
    double frac = total ? (double)done / (double)total : 1.0;
    double mbs = el > 0 ? (double)done / 1e6 / el : 0.0;
    double eta = frac > 0 ? el * (1.0 - frac) / frac : 0.0;
    if (s->tty) {
        if (i < n && now - s->last < 0.1) return;
        s->last = now;
        char bar[31];
        int fill = (int)(frac * 30);
        for (int k = 0; k < 30; k++) bar[k] = k < fill ? '#' : '.';
        bar[30] = 0;
        fprintf(stderr, "\r[%s] %d/%d %-24.24s %7.1f MB/s  ETA %4.0fs ", bar, i, n, name, mbs, eta);
        if (i == n) fputc('\n', stderr);
        fflush(stderr);
        return;
    }
    int decile = (int)(frac * 10);
    if (decile > s->last_decile || i == n) {
        s->last_decile = decile;
        fprintf(stderr, "compile: %3.0f%% (%d/%d tensors, %.1f MB/s, ETA %.0fs)\n", frac * 100, i,
                n, mbs, eta);
    }
}

static void on_note(void *user, const char *msg) {
    progress_state *s = user;
    if (s->tty && !s->quiet) fputc('\r', stderr);
    fprintf(stderr, "compile: note: %s\n", msg);
}

static bool parse_weights(const char *text, uint32_t *out) {
    if (!strcasecmp(text, "q4") || !strcasecmp(text, "w4")) *out = LP_W4;
    else if (!strcasecmp(text, "q4c") || !strcasecmp(text, "w4c")) *out = LP_W4C;
    else if (!strcasecmp(text, "q8") || !strcasecmp(text, "w8")) *out = LP_W8;
    else if (!strcasecmp(text, "f16")) *out = LP_F16;
    else if (!strcasecmp(text, "f32")) *out = LP_F32;
    else {
        fprintf(stderr, "loraplex compile: --weights must be q4, q4c, q8, f16 or f32 (not '%s')\n", text);
        return false;
    }
    return true;
}

static double file_mb(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (double)st.st_size / 1e6 : 0.0;
}

int cli_compile(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *tokenizer = NULL;
    lp_compile_params p = {.weight_type = LP_W4C};
    bool weights_given = false;
    progress_state ps = {.tty = isatty(2) != 0, .last_decile = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            compile_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (!(out = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--weights")) {
            const char *t = cli_value(argc, argv, &i);
            if (!t || !parse_weights(t, &p.weight_type)) return 2;
            weights_given = true;
        } else if (!strcmp(a, "--group")) {
            const char *t = cli_value(argc, argv, &i);
            if (!t || !cli_int("--group", t, 32, 1 << 20, &v)) return 2;
            p.group = (int)v;
        } else if (!strcmp(a, "--acts")) {
            const char *t = cli_value(argc, argv, &i);
            if (!t) return 2;
            if (!strcasecmp(t, "q8") || !strcasecmp(t, "int8")) p.float_acts = false;
            else if (!strcasecmp(t, "f32") || !strcasecmp(t, "float")) p.float_acts = true;
            else {
                fprintf(stderr, "loraplex compile: --acts must be q8 or f32 (not '%s')\n", t);
                return 2;
            }
        } else if (!strcmp(a, "--threads")) {
            const char *t = cli_value(argc, argv, &i);
            if (!t || !cli_int("--threads", t, 1, 4096, &v)) return 2;
            p.n_threads = (int)v;
        } else if (!strcmp(a, "--tokenizer")) {
            if (!(tokenizer = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--no-search")) p.no_search = true;
        else if (!strcmp(a, "--no-fuse")) p.no_fuse = true;
        else if (!strcmp(a, "--no-fold")) p.no_fold = true;
        else if (!strcmp(a, "--fold")) p.fold = true;
        else if (!strcmp(a, "--q4-output")) p.q4_output = true;
        else if (!strcmp(a, "--quiet")) ps.quiet = true;
        else if (a[0] == '-') {
            fprintf(stderr, "loraplex compile: unknown option '%s'\n", a);
            compile_usage(stderr);
            return 2;
        } else if (!in) in = a;
        else {
            fprintf(stderr, "loraplex compile: more than one input ('%s' and '%s')\n", in, a);
            return 2;
        }
    }
    if (!in || !out) {
        compile_usage(stderr);
        return 2;
    }
    /* an SD single-file checkpoint: the image pipeline's own compiled form */
    size_t len = strlen(in);
    struct stat st;
    if (len > 12 && !strcmp(in + len - 12, ".safetensors") && stat(in, &st) == 0 && S_ISREG(st.st_mode)) {
        if (weights_given && p.weight_type != LP_W8 && p.weight_type != LP_F32) {
            fprintf(stderr, "loraplex compile: an SD checkpoint compiles to --weights q8 or f32\n");
            return 2;
        }
        return cli_image_compile(in, out, weights_given ? p.weight_type : LP_W8, !p.float_acts);
    }
    p.progress = on_progress;
    p.note = on_note;
    p.user = &ps;
    lp_error err = {0};
    double t0 = lp_now_seconds();
    /* no_repack: quantized GGUF sources are read in their own layout and repacked
     * by the compiler itself (bit for bit where the formats match) */
    lp_model_params mp = {.tokenizer_path = tokenizer, .no_repack = true};
    lp_model *m = lp_model_load(in, &mp, &err);
    if (!m) return cli_fail("compile", &err);
    double t1 = lp_now_seconds();
    ps.t0 = ps.last = t1;
    int rc = lp_model_compile(m, out, &p, &err);
    double t2 = lp_now_seconds();
    lp_model_free(m);
    if (rc) return cli_fail("compile", &err);
    /* how fast the result loads: the point of the format */
    double t3 = lp_now_seconds();
    lp_model *c = lp_model_load(out, NULL, &err);
    double t4 = lp_now_seconds();
    if (!c) return cli_fail("compile: reloading the output", &err);
    lp_model_info info;
    lp_model_get_info(c, &info);
    printf("compiled %s -> %s\n", in, out);
    printf("  weights %s group %d, activations %s, norms %s, %s layers\n",
           p.weight_type == LP_W4 ? "q4" : p.weight_type == LP_W4C ? "q4c" : p.weight_type == LP_W8 ? "q8"
           : p.weight_type == LP_F16 ? "f16" : "f32",
           p.group ? p.group : 32, p.float_acts ? "f32" : "int8",
           c->norms_folded ? "folded" : "separate", info.n_layers > 0 && c->layers[0].wqkv.data
           ? "fused" : "unfused");
    printf("  size %.1f MB (input %.1f MB), load input %.2fs, compile %.2fs, load output %.1f ms\n",
           file_mb(out), file_mb(in), t1 - t0, t2 - t1, (t4 - t3) * 1e3);
    lp_model_free(c);
    return 0;
}
