/* Fuzzes the SD LoRA loader (src/image/sd_lora.c: key classification in
 * the four formats, cloneofsimo's module order from its metadata, shape
 * and dtype checks, conversion) on top of the safetensors parser, for the
 * sd-tiny configuration. An input starting with '{' is an
 * adapter_config.json up to its first NUL byte, then the safetensors file.
 * Accepted adapters have every delta and token read. Seeds: sd-tiny-lora
 * files at rank 1 (fuzz/seeds/README.md). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "image/sd_lora.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    char *cfg = NULL;
    if (size && data[0] == '{') {
        const uint8_t *nul = memchr(data, 0, size);
        if (!nul) return 0;
        size_t n = (size_t)(nul - data);
        if (!(cfg = malloc(n + 1))) return 0;
        memcpy(cfg, data, n);
        cfg[n] = 0;
        data += n + 1, size -= n + 1;
    }
    lp_sd_config c = lp_sd_config_tiny();
    lp_error err;
    lp_sd_lora *l = lp_sd_lora_load_memory(data, size, "fuzz.safetensors", cfg, &c, &err);
    if (l) {
        lp_sd_targets t;
        volatile float sink = 0;
        if (!lp_sd_targets_build(&c, &t, &err)) {
            for (int32_t i = 0; i < t.n; i++) {
                const lp_sd_delta *d = lp_sd_lora_delta(l, i);
                if (!d) continue;
                int64_t k = t.t[i].k ? t.t[i].k : 1;
                sink += d->down[(int64_t)d->rank * k * k * t.t[i].in - 1] + d->up[(int64_t)t.t[i].out * d->rank - 1];
            }
            lp_sd_targets_free(&t);
        }
        for (int32_t i = 0; i < lp_sd_lora_n_tokens(l); i++) sink += lp_sd_lora_token_embedding(l, i)[c.te_dim - 1];
        (void)sink;
    }
    lp_sd_lora_free(l);
    free(cfg);
    return 0;
}
