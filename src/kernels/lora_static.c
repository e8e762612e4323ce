/* The shared-profile LoRA branch (lora_static.h): plain C with int32 code
 * products summed in int64, which compilers vectorise; the arithmetic is
 * integer up to one float scale per output, so results do not depend on the
 * instruction set. */
#include "lora_static.h"

#include <stddef.h>

/* sum_k q[k] * (codes[k] - zero), in chunks small enough for int32
 * (|q| <= 255, |codes - zero| <= 255: 2^15 products stay below 2^31). */
static int64_t dot_codes(const int32_t *q, const uint8_t *codes, int32_t zero, int n) {
    int64_t total = 0;
    for (int k0 = 0; k0 < n; k0 += 32768) {
        int k1 = n - k0 < 32768 ? n : k0 + 32768;
        int32_t acc = 0;
        for (int k = k0; k < k1; k++) acc += q[k] * ((int32_t)codes[k] - zero);
        total += acc;
    }
    return total;
}

void lp_lora_static_rows(const lp_lora_static *L, const float *x, int64_t x_stride, int n,
                         const int *rows, float *y, int64_t y_stride, float *t_out,
                         int32_t *scratch) {
    int32_t *qx = scratch, *qt = scratch + L->in;
    for (int i = 0; i < n; i++) {
        const float *xr = x + (int64_t)i * x_stride;
        for (int k = 0; k < L->in; k++) qx[k] = lp_q_code(xr[k], L->x, L->act_qmax) - L->x.zero;
        for (int j = 0; j < L->rank; j++) {
            lp_qenc ea = L->ea[L->na > 1 ? j : 0];
            int64_t acc = dot_codes(qx, L->qa + (size_t)j * (size_t)L->in, ea.zero, L->in);
            float t = (L->x.scale * ea.scale) * (float)acc;
            qt[j] = lp_q_code(t, L->t, L->act_qmax) - L->t.zero;
            if (t_out) t_out[(int64_t)i * L->rank + j] = L->t.scale * (float)qt[j];
        }
        float *yr = y + (int64_t)(rows ? rows[i] : i) * y_stride;
        float st = L->scale * L->t.scale;
        for (int o = 0; o < L->out; o++) {
            lp_qenc eb = L->eb[L->nb > 1 ? o : 0];
            int64_t acc = dot_codes(qt, L->qb + (size_t)o * (size_t)L->rank, eb.zero, L->rank);
            yr[o] += (st * eb.scale) * (float)acc;
        }
    }
}
