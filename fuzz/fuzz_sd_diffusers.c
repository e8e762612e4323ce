/* Fuzzes the SD 1.x loader on a diffusers folder (src/image/sd_model.c: the
 * three safetensors files found by their diffusers names, the configuration
 * inferred from them and from the parts' config.json, the layout checked),
 * then, for folders it accepts, the graphs as fuzz_sd_model does. The input
 * is six chunks, each a little-endian u32 size and its bytes:
 * text_encoder/model.safetensors, unet/ and vae/
 * diffusion_pytorch_model.safetensors, then the three config.json; they are
 * written to a folder under /tmp made once per process. Seed: the micro
 * checkpoint of fuzz_sd_model written by lp_sd_write_diffusers
 * (fuzz/seeds/README.md). */
#define _GNU_SOURCE /* mkdtemp */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "image/sd.h"
#include "image/sd_graph.h"
#include "fuzz_sd_run.h"

static const char *const files[6] = {"text_encoder/model.safetensors", "unet/diffusion_pytorch_model.safetensors",
                                     "vae/diffusion_pytorch_model.safetensors", "text_encoder/config.json",
                                     "unet/config.json", "vae/config.json"};

static const char *const parts[3] = {"text_encoder", "unet", "vae"};

/* the folder, made on the first call (the harness's only state) */
static char dir[64];

/* at exit: the folder and what the last input wrote into it */
static void remove_folder(void) {
    char path[160];
    for (int i = 0; i < 6; i++) snprintf(path, sizeof path, "%s/%s", dir, files[i]), remove(path);
    for (int i = 0; i < 3; i++) snprintf(path, sizeof path, "%s/%s", dir, parts[i]), rmdir(path);
    rmdir(dir);
}

static const char *folder(void) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/fuzz_sd_diffusers_XXXXXX");
        if (!mkdtemp(dir)) abort();
        char sub[128];
        for (int i = 0; i < 3; i++) {
            snprintf(sub, sizeof sub, "%s/%s", dir, parts[i]);
            mkdir(sub, 0700);
        }
        atexit(remove_folder);
    }
    return dir;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    const char *dir = folder();
    size_t at = 0;
    for (int i = 0; i < 6; i++) {
        uint32_t n = 0;
        if (size - at >= 4) n = (uint32_t)data[at] | (uint32_t)data[at + 1] << 8 | (uint32_t)data[at + 2] << 16 |
                                (uint32_t)data[at + 3] << 24, at += 4;
        if (n > size - at) n = (uint32_t)(size - at);
        char path[160];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        FILE *f = fopen(path, "wb");
        if (!f) abort();
        if (n) fwrite(data + at, 1, n, f);
        fclose(f);
        at += n;
    }
    lp_error err;
    lp_sd_model *m = lp_sd_model_load(dir, &err);
    if (m) fuzz_sd_model_run(m);
    return 0;
}
