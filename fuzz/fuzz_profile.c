/* Fuzzes the .lpq shared-profile reader (src/formats/lpq.c). The input is
 * tried as is and with its id (the whole file's hash) repaired, so
 * mutations get past it to the count, shape and encoding checks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/le.h"
#include "formats/lpa.h"
#include "formats/lpq.h"

static void try_parse(const uint8_t *buf, size_t size) {
    lp_lpq q;
    lp_error err;
    if (lp_lpq_parse(buf, size, "fuzz.lpq", &q, &err) == 0) {
        /* touch every encoding the kernels would read */
        volatile float sum = 0;
        for (uint32_t i = 0; i < q.n_entries; i++) {
            const lp_lpq_entry *e = &q.entries[i];
            for (uint32_t c = 0; c < e->na; c++) sum += e->a[c].scale * (float)e->a[c].zero;
            for (uint32_t c = 0; c < e->nb; c++) sum += e->b[c].scale * (float)e->b[c].zero;
            (void)lp_lpq_find(&q, e->tensor);
        }
        (void)sum;
        lp_lpq_release(&q);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (4u << 20)) return 0;
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    try_parse(buf, size);
    if (size >= LP_LPQ_HEADER_BYTES) {
        uint8_t zero[8] = {0};
        uint64_t h = lp_lpa_hash(LP_LPA_HASH_SEED ^ 0x4c5051ull, buf, 16);
        h = lp_lpa_hash(h, zero, 8);
        h = lp_lpa_hash(h, buf + 24, size - 24);
        lp_le_put_u64(buf + 16, h ? h : 1);
        try_parse(buf, size);
    }
    free(buf);
    return 0;
}
