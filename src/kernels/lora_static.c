/* The shared-profile LoRA branch (lora_static.h): the reference, also built
 * for the AVX2 and AVX-512 levels without VNNI as plain C shaped for the
 * compiler's vectoriser (lp_kernels.lora_static picks; the VNNI levels are
 * in lora_static_vnni.c):
 *  - the shrink multiplies input codes less their zero point by A's codes
 *    less theirs as 16-bit numbers and sums into 32 bits (pmaddwd), in
 *    chunks whose sums cannot overflow, added up in 64 bits;
 *  - the expand walks B's blocks of 16 outputs (lp_lora_static_b_at) with
 *    its inner loop over the outputs, summing (ct_j - et.zero) qb_oj in 32
 *    bits and taking eb_o.zero * sum_j (ct_j - et.zero) off once per output;
 *    exact for ranks up to LP_LORA_STATIC_INT32_RANK, wider ranks sum in 64
 *    bits.
 * The three steps are separate so the runtime can split a batch's branches
 * over threads (by rank rows for the shrink, by outputs for the expand). */
#include "lora_static.h"

#define INLINE static inline __attribute__((always_inline))

void lp_lora_static_sum_a(const uint8_t *qa, bool packed, int rank, int in, int64_t *sum_a) {
    for (int j = 0; j < rank; j++) {
        int64_t s = 0;
        for (int k = 0; k < in; k++) s += lp_lora_static_code(qa, lp_lora_static_a_at(in, packed, j, k), packed);
        sum_a[j] = s;
    }
}

INLINE int64_t quantize_impl(const lp_lora_static *L, const float *restrict x, uint8_t *restrict cx) {
    int64_t sum = 0;
    for (int k = 0; k < L->in; k++) {
        int c = lp_q_code(x[k], L->x, L->act_qmax);
        cx[k] = (uint8_t)c;
        sum += c;
    }
    return sum;
}

/* sum_k (cx[k] - zx) * (codes[k] - za); both factors are within +-255, so
 * 2^15 products stay below 2^31. */
INLINE int64_t dot_codes(const uint8_t *restrict cx, int16_t zx, const uint8_t *restrict codes, int16_t za,
                         int n) {
    int64_t total = 0;
    for (int k0 = 0; k0 < n; k0 += 32768) {
        int k1 = n - k0 < 32768 ? n : k0 + 32768;
        int32_t acc = 0;
        for (int k = k0; k < k1; k++) acc += (int16_t)(cx[k] - zx) * (int16_t)(codes[k] - za);
        total += acc;
    }
    return total;
}

/* A packed row's dot, one run of 64 codes unpacked at a time. */
INLINE int64_t dot_packed(const uint8_t *restrict cx, int16_t zx, const uint8_t *restrict packed, int16_t za,
                          int n) {
    int64_t total = 0;
    for (int k0 = 0; k0 < n; k0 += 64) {
        uint8_t u[64];
        const uint8_t *p = packed + k0 / 2;
        for (int i = 0; i < 32; i++) {
            u[i] = p[i] & 15;
            u[i + 32] = p[i] >> 4;
        }
        total += dot_codes(cx + k0, zx, u, za, n - k0 < 64 ? n - k0 : 64);
    }
    return total;
}

INLINE void shrink_impl(const lp_lora_static *L, const uint8_t *cx, int j0, int j1, uint8_t *ct) {
    for (int j = j0; j < j1; j++) {
        int16_t za = (int16_t)L->ea[L->na > 1 ? j : 0].zero, zx = (int16_t)L->x.zero;
        const uint8_t *a = lp_lora_static_a_row(L, j);
        int64_t s = L->packed ? dot_packed(cx, zx, a, za, L->in) : dot_codes(cx, zx, a, za, L->in);
        lp_lora_static_shrink_code(L, j, s, ct);
    }
}

INLINE void expand_impl(const lp_lora_static *L, const uint8_t *ct, int o0, int o1, float *restrict y) {
    float st = L->scale * L->t.scale;
    int zt = L->t.zero, nq = (L->rank + 3) / 4;
    if (L->rank > LP_LORA_STATIC_INT32_RANK) {
        for (int o = o0; o < o1; o++) {
            lp_qenc eb = L->eb[L->nb > 1 ? o : 0];
            int64_t s = 0;
            for (int j = 0; j < L->rank; j++)
                s += (int64_t)(ct[j] - zt) *
                     (lp_lora_static_code(L->qb, lp_lora_static_b_at(L->rank, j, o), L->packed) - eb.zero);
            float add = (st * eb.scale) * (float)s; /* its own statement: never fused into an FMA */
            y[o] += add;
        }
        return;
    }
    int32_t qsum = 0;
    for (int j = 0; j < L->rank; j++) qsum += ct[j] - zt;
    for (int o = o0; o < o1;) {
        int blk = o / 16, lo = o - 16 * blk, hi = o1 - 16 * blk < 16 ? o1 - 16 * blk : 16;
        size_t b = (size_t)blk * (size_t)nq * 64;
        int32_t acc[16] = {0};
        for (int j = 0; j < L->rank; j++) {
            size_t at = b + (size_t)(j / 4) * 64 + (size_t)(j % 4);
            int32_t q = ct[j] - zt;
            if (L->packed)
                for (int l = 0; l < 16; l++) acc[l] += q * lp_lora_static_code(L->qb, at + 4 * (size_t)l, true);
            else
                for (int l = 0; l < 16; l++) acc[l] += q * L->qb[at + 4 * (size_t)l];
        }
        for (int l = lo; l < hi; l++) {
            lp_qenc eb = L->eb[L->nb > 1 ? 16 * blk + l : 0];
            float add = (st * eb.scale) * (float)(acc[l] - eb.zero * qsum);
            y[16 * blk + l] += add;
        }
        o = 16 * blk + hi;
    }
}

#define LEVEL(suffix, target)                                                                                  \
    target static int64_t quantize_##suffix(const lp_lora_static *L, const float *x, uint8_t *cx) {            \
        return quantize_impl(L, x, cx);                                                                      \
    }                                                                                                         \
    target static void shrink_##suffix(const lp_lora_static *L, const uint8_t *cx, int64_t sum_cx, int j0,     \
                                       int j1, uint8_t *ct) {                                                \
        (void)sum_cx;                                                                                         \
        shrink_impl(L, cx, j0, j1, ct);                                                                      \
    }                                                                                                         \
    target static void expand_##suffix(const lp_lora_static *L, const uint8_t *ct, int o0, int o1, float *y) { \
        expand_impl(L, ct, o0, o1, y);                                                                       \
    }                                                                                                         \
    const lp_lora_static_ops lp_lora_static_##suffix = {quantize_##suffix, shrink_##suffix, expand_##suffix};

LEVEL(ref, )
#if defined(__x86_64__)
LEVEL(avx2, __attribute__((target("avx2,fma"))))
LEVEL(avx512, __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))))
#endif

void lp_lora_static_rows(const lp_lora_static *L, const float *x, int64_t x_stride, int n, const int *rows,
                         float *y, int64_t y_stride, float *t_out, int32_t *scratch) {
    uint8_t *ct = (uint8_t *)scratch, *cx = ct + 4 * ((L->rank + 3) / 4); /* [rank], [in] */
    for (int i = 0; i < n; i++) {
        int64_t sum_cx = quantize_ref(L, x + (int64_t)i * x_stride, cx);
        shrink_ref(L, cx, sum_cx, 0, L->rank, ct);
        if (t_out)
            for (int j = 0; j < L->rank; j++) t_out[(int64_t)i * L->rank + j] = lp_q_value(ct[j], L->t);
        expand_ref(L, ct, 0, L->out, y + (int64_t)(rows ? rows[i] : i) * y_stride);
    }
}
