/* Fuzzes the .lpx compiled-model loader: the format reader (lpx.c) and the
 * model built from it (load_lpx.c: shapes against the hyper-parameters,
 * fused views, the embedded tokenizer). The input is tried as is and with
 * its file-size field repaired, so mutations reach the tensor table. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

static void try_load(const uint8_t *buf, size_t size) {
    lp_error err;
    lp_model *m = lp_model_load_lpx_memory(buf, size, "fuzz.lpx", &err);
    if (m) {
        /* touch what a forward would read first */
        float row[4096];
        if (m->tok_embd.cols <= 4096) lp_weight_dequantize_row(&m->tok_embd, 0, row);
        lp_model_free(m);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (8u << 20)) return 0;
    uint8_t *buf = lp_alloc(size ? size : 1); /* the reader wants a 64-aligned image */
    if (!buf) return 0;
    memcpy(buf, data, size);
    try_load(buf, size);
    if (size >= 16) {
        for (int i = 0; i < 8; i++) buf[8 + i] = (uint8_t)((uint64_t)size >> (8 * i));
        try_load(buf, size);
    }
    lp_free(buf);
    return 0;
}
