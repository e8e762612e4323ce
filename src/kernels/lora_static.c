/* The shared-profile LoRA branch (lora_static.h). The arithmetic is integer
 * up to one float scale per output, so every implementation gives the same
 * bits; this one is plain C shaped for the compiler's vectoriser, built once
 * per instruction-set level (lp_kernels.lora_static picks):
 *  - the shrink multiplies 16-bit input codes by 16-bit weight codes less
 *    their zero point and sums pairs into 32 bits (pmaddwd), in chunks whose
 *    sums cannot overflow, added up in 64 bits;
 *  - the expand walks B transposed ([rank][out]) so its inner loop runs over
 *    the outputs; it sums in float, which is exact: every product is an
 *    integer of at most 255 * 255 and, for rank <= LP_LORA_STATIC_FLOAT_RANK,
 *    every partial sum stays below 2^24. Wider ranks sum in 64 bits.
 * The three steps are separate so the runtime can split a batch's branches
 * over threads (by rank rows for the shrink, by outputs for the expand). */
#include "lora_static.h"

#include <stddef.h>

#define INLINE static inline __attribute__((always_inline))

INLINE void quantize_impl(const lp_lora_static *L, const float *restrict x, int16_t *restrict qx) {
    for (int k = 0; k < L->in; k++) qx[k] = (int16_t)(lp_q_code(x[k], L->x, L->act_qmax) - L->x.zero);
}

/* sum_k q[k] * (codes[k] - zero); |q|, |codes - zero| <= 255, so 2^15
 * products stay below 2^31. */
INLINE int64_t dot_codes(const int16_t *restrict q, const uint8_t *restrict codes, int16_t zero, int n) {
    int64_t total = 0;
    for (int k0 = 0; k0 < n; k0 += 32768) {
        int k1 = n - k0 < 32768 ? n : k0 + 32768;
        int32_t acc = 0;
        for (int k = k0; k < k1; k++) acc += q[k] * (int16_t)(codes[k] - zero);
        total += acc;
    }
    return total;
}

INLINE void shrink_impl(const lp_lora_static *L, const int16_t *qx, int j0, int j1, int32_t *qt) {
    for (int j = j0; j < j1; j++) {
        lp_qenc ea = L->ea[L->na > 1 ? j : 0];
        int64_t s = dot_codes(qx, L->qa + (size_t)j * (size_t)L->in, (int16_t)ea.zero, L->in);
        float t = (L->x.scale * ea.scale) * (float)s;
        qt[j] = lp_q_code(t, L->t, L->act_qmax) - L->t.zero;
    }
}

INLINE void expand_impl(const lp_lora_static *L, const int32_t *qt, int o0, int o1, float *restrict y,
                        float *restrict scratch) {
    int m = o1 - o0;
    float st = L->scale * L->t.scale;
    if (L->rank > LP_LORA_STATIC_FLOAT_RANK) {
        for (int o = o0; o < o1; o++) {
            lp_qenc eb = L->eb[L->nb > 1 ? o : 0];
            int64_t s = 0;
            for (int j = 0; j < L->rank; j++)
                s += (int64_t)qt[j] * ((int32_t)L->qbt[(size_t)j * (size_t)L->out + (size_t)o] - eb.zero);
            y[o] += (st * eb.scale) * (float)s;
        }
        return;
    }
    float *restrict acc = scratch, *restrict zero = scratch + m;
    for (int o = 0; o < m; o++) {
        acc[o] = 0.0f;
        zero[o] = (float)L->eb[L->nb > 1 ? o0 + o : 0].zero;
    }
    for (int j = 0; j < L->rank; j++) {
        const uint8_t *restrict row = L->qbt + (size_t)j * (size_t)L->out + (size_t)o0;
        float q = (float)qt[j];
        for (int o = 0; o < m; o++) acc[o] += q * ((float)row[o] - zero[o]);
    }
    for (int o = 0; o < m; o++) y[o0 + o] += (st * L->eb[L->nb > 1 ? o0 + o : 0].scale) * acc[o];
}

#define LEVEL(suffix, target)                                                                                  \
    target static void quantize_##suffix(const lp_lora_static *L, const float *x, int16_t *qx) {               \
        quantize_impl(L, x, qx);                                                                             \
    }                                                                                                         \
    target static void shrink_##suffix(const lp_lora_static *L, const int16_t *qx, int j0, int j1,             \
                                       int32_t *qt) {                                                        \
        shrink_impl(L, qx, j0, j1, qt);                                                                      \
    }                                                                                                         \
    target static void expand_##suffix(const lp_lora_static *L, const int32_t *qt, int o0, int o1, float *y,   \
                                       float *scratch) {                                                     \
        expand_impl(L, qt, o0, o1, y, scratch);                                                              \
    }                                                                                                         \
    const lp_lora_static_ops lp_lora_static_##suffix = {quantize_##suffix, shrink_##suffix, expand_##suffix};

LEVEL(ref, )
#if defined(__x86_64__)
LEVEL(avx2, __attribute__((target("avx2,fma"))))
LEVEL(avx512, __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))))
#endif

void lp_lora_static_rows(const lp_lora_static *L, const float *x, int64_t x_stride, int n, const int *rows,
                         float *y, int64_t y_stride, float *t_out, int32_t *scratch) {
    int32_t *qt = scratch;                                    /* [rank] */
    float *acc = (float *)(scratch + L->rank);                /* [2 out] */
    int16_t *qx = (int16_t *)(scratch + L->rank + 2 * L->out); /* [in] */
    for (int i = 0; i < n; i++) {
        quantize_ref(L, x + (int64_t)i * x_stride, qx);
        shrink_ref(L, qx, 0, L->rank, qt);
        if (t_out)
            for (int j = 0; j < L->rank; j++) t_out[(int64_t)i * L->rank + j] = L->t.scale * (float)qt[j];
        expand_ref(L, qt, 0, L->out, y + (int64_t)(rows ? rows[i] : i) * y_stride, acc);
    }
}
