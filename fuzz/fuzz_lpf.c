/* Fuzzes the .lpf forecast-embedding reader (src/formats/lpf.c), versions 1
 * to 4 (with a draft corpus of u32 or bit-packed tokens, and a KV prefix). The input is tried as is and with its
 * checksum repaired, so mutations get past it to the size, name, value and
 * corpus checks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/le.h"
#include "formats/lpa.h"
#include "formats/lpf.h"

static void try_parse(const uint8_t *buf, size_t size) {
    lp_error err;
    lp_forecast *f = lp_lpf_parse(buf, size, "fuzz.lpf", &err);
    if (f) {
        /* touch every value the engine would feed */
        const float *d = lp_forecast_data(f);
        volatile float sum = 0;
        for (int i = 0; i < lp_forecast_k(f) * lp_forecast_dim(f); i++) sum += d[i];
        const float *kv = lp_forecast_prefix(f);
        for (size_t i = 0; i < lp_forecast_prefix_floats(f); i++) sum += kv[i];
        (void)sum;
        (void)lp_forecast_adapter_name(f)[0];
        /* and the n-gram table built from a draft corpus */
        int32_t h[3] = {0, 1, 2};
        for (int n = 0; n <= 3; n++) (void)lp_forecast_ngram_next(f, h + 3 - n, n);
        lp_forecast_free(f);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (4u << 20)) return 0;
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    try_parse(buf, size);
    if (size >= LP_LPF_HEADER_BYTES) {
        size_t name = lp_le_get_u32(buf + 20), off = LP_LPF_HEADER_BYTES + ((name + 3) & ~(size_t)3);
        if (name < LP_LPF_NAME_BYTES && off <= size) {
            lp_le_put_u64(buf + 32, lp_lpa_hash(LP_LPA_HASH_SEED, buf + off, size - off));
            try_parse(buf, size);
        }
    }
    free(buf);
    return 0;
}
