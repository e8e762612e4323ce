/* Arm NEON dotprod integer GEMM for LP_W4 / LP_W8 / LP_W4C (layout: intpack.c).
 *
 * A 64-byte chunk is four q registers of 4 rows x 4 inputs, the operand
 * shape of sdot: vdotq_lane_s32 adds, per row lane, the dot product of its
 * 4 weight bytes with 4 activation bytes picked from a d register.
 * W4 codes 0..15 are valid int8, so the biased product plus the
 * activation-side correction (-8 * sum(x)) gives the exact sum; W8 codes
 * are re-signed with xor 0x80 and need no correction; W4C nibbles become
 * their signed levels through one tbl and need none either. Compiled for
 * dotprod through the function attribute only; lp_kernels_init selects it
 * when getauxval reports asimddp.
 *
 * Built a second time as intmatmul_neon_i8mm.c (LP_NEON_I8MM): pairs of
 * batch rows then go through smmla, which multiplies a 2 x 8 block of
 * activations by a 2 x 8 block of weights (two rows' next 8 inputs) in one
 * instruction, twice the multiply-adds of an sdot. A zip of two 32-bit
 * lanes turns the packed layout into that block: a row's 4 low-nibble
 * inputs beside its 4 high-nibble ones (W8: two chunks). The integer sums
 * are the same exact integers, so the bits are the dotprod kernels'. */
#include "kernels_internal.h"

#if defined(LP_HAVE_NEON_DOT)
#include <arm_neon.h>

#if defined(LP_NEON_I8MM) && defined(__clang__)
#define DOT __attribute__((target("dotprod,i8mm")))
#elif defined(LP_NEON_I8MM)
#define DOT __attribute__((target("arch=armv8.2-a+dotprod+i8mm")))
#elif defined(__clang__)
#define DOT __attribute__((target("dotprod")))
#else
#define DOT __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
#define INLINE static inline __attribute__((always_inline))

DOT INLINE void store_rows(const lp_igemm *g, int64_t p, int64_t b, const float32x4_t v[4]) {
    float *y = g->y + b * g->y_stride + p * LP_PANEL;
    int64_t left = g->rows - p * LP_PANEL;
    if (left >= LP_PANEL) {
        for (int q = 0; q < 4; q++) vst1q_f32(y + 4 * q, v[q]);
        return;
    }
    float tmp[16];
    for (int q = 0; q < 4; q++) vst1q_f32(tmp + 4 * q, v[q]);
    for (int64_t i = 0; i < left; i++) y[i] = tmp[i];
}

/* A nibble chunk's 16 bytes as the signed weights of their low (inputs
 * 8k..8k+3) and high (8k+4..8k+7) nibbles. */
DOT INLINE void unpack_nibbles(uint32_t type, uint8x16_t raw, int8x16_t levels, int8x16_t *lo, int8x16_t *hi) {
    *lo = vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0f)));
    *hi = vreinterpretq_s8_u8(vshrq_n_u8(raw, 4));
    if (type == LP_W4C) {
        *lo = vqtbl1q_s8(levels, vreinterpretq_u8_s8(*lo));
        *hi = vqtbl1q_s8(levels, vreinterpretq_u8_s8(*hi));
    }
}

/* The scales of group gi of the panel's 16 rows, 4 per register. */
DOT INLINE void group_scales(uint32_t type, const lp_packed_geom *ge, const uint8_t *panel, int64_t gi,
                             float32x4_t dw[4]) {
    if (type == LP_W4C) {
        float s[LP_PANEL];
        for (int l = 0; l < LP_PANEL; l++) s[l] = lp_packed_scale(type, ge, panel, gi, l);
        for (int q = 0; q < 4; q++) dw[q] = vld1q_f32(s + 4 * q);
        return;
    }
    const uint16_t *h = (const uint16_t *)(const void *)(panel + (size_t)gi * 32);
    for (int q = 0; q < 4; q++) dw[q] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + 4 * q)));
}

/* One panel x B batch rows (B <= 2: 16 accumulators of 32 registers). */
DOT INLINE void tile(const lp_igemm *g, uint32_t type, int64_t p, int64_t b0, int B) {
    const lp_packed_geom *ge = &g->geom;
    const lp_qact *a = g->a;
    const int G = ge->group;
    const int64_t groups = ge->groups, qs = a->q_stride;
    const uint8_t *panel = g->w + (size_t)p * ge->panel_bytes;
    const uint8_t *codes = panel + ge->codes_offset;
    const uint8x16_t bias = vdupq_n_u8(0x80);
    const int8x16_t levels = vld1q_s8(lp_w4c_levels);
    const bool nibbles = type != LP_W8;
    float32x4_t accf[2][4];
    for (int b = 0; b < B; b++)
        for (int q = 0; q < 4; q++) accf[b][q] = vdupq_n_f32(0.0f);
    for (int64_t gi = 0; gi < groups; gi++) {
        int32x4_t acc[2][4];
        const int8_t *xg = a->q + b0 * qs + gi * G;
        const uint8_t *cg = codes + (size_t)gi * ge->code_bytes;
        for (int b = 0; b < B; b++) {
            int32x4_t c = vdupq_n_s32(type == LP_W4 ? a->corr[(b0 + b) * groups + gi] : 0);
            for (int q = 0; q < 4; q++) acc[b][q] = c;
        }
        if (nibbles) {
            for (int k = 0; k < G / 8; k++) {
                int8x8_t x[2];
                for (int b = 0; b < B; b++) x[b] = vld1_s8(xg + b * qs + 8 * k);
                for (int q = 0; q < 4; q++) {
                    int8x16_t lo, hi;
                    unpack_nibbles(type, vld1q_u8(cg + 64 * k + 16 * q), levels, &lo, &hi);
                    for (int b = 0; b < B; b++) {
                        acc[b][q] = vdotq_lane_s32(acc[b][q], lo, x[b], 0);
                        acc[b][q] = vdotq_lane_s32(acc[b][q], hi, x[b], 1);
                    }
                }
            }
        } else {
            for (int k = 0; k < G / 4; k += 2) { /* G/4 is even: two chunks per 8 activation bytes */
                int8x8_t x[2];
                for (int b = 0; b < B; b++) x[b] = vld1_s8(xg + b * qs + 4 * k);
                for (int q = 0; q < 4; q++) {
                    int8x16_t w0 = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(cg + 64 * k + 16 * q), bias));
                    int8x16_t w1 = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(cg + 64 * (k + 1) + 16 * q), bias));
                    for (int b = 0; b < B; b++) {
                        acc[b][q] = vdotq_lane_s32(acc[b][q], w0, x[b], 0);
                        acc[b][q] = vdotq_lane_s32(acc[b][q], w1, x[b], 1);
                    }
                }
            }
        }
        float32x4_t dw[4];
        group_scales(type, ge, panel, gi, dw);
        for (int q = 0; q < 4; q++) {
            for (int b = 0; b < B; b++) {
                float32x4_t dwdx = vmulq_f32(dw[q], vdupq_n_f32(a->d[(b0 + b) * groups + gi]));
                accf[b][q] = vfmaq_f32(accf[b][q], vcvtq_f32_s32(acc[b][q]), dwdx);
            }
        }
    }
    for (int b = 0; b < B; b++) store_rows(g, p, b0 + b, accf[b]);
}

#if defined(LP_NEON_I8MM)
/* smmla's 2 x 8 weight operand from two registers of 4 rows x 4 inputs (a:
 * inputs n..n+3, b: n+4..n+7): rows01 takes the first two rows, each its 4
 * bytes of a then its 4 of b; rows23 the last two. */
DOT INLINE int8x16_t rows01(int8x16_t a, int8x16_t b) {
    return vreinterpretq_s8_s32(vzip1q_s32(vreinterpretq_s32_s8(a), vreinterpretq_s32_s8(b)));
}
DOT INLINE int8x16_t rows23(int8x16_t a, int8x16_t b) {
    return vreinterpretq_s8_s32(vzip2q_s32(vreinterpretq_s32_s8(a), vreinterpretq_s32_s8(b)));
}

/* One panel x batch rows b0, b0+1. acc[j] holds weight rows 2j, 2j+1 of
 * both batch rows, lanes [b0 row 2j, b0 row 2j+1, b0+1 row 2j, b0+1 row
 * 2j+1]; the float finish is tile()'s, on the same integers. */
DOT INLINE void pair_tile(const lp_igemm *g, uint32_t type, int64_t p, int64_t b0) {
    const lp_packed_geom *ge = &g->geom;
    const lp_qact *a = g->a;
    const int G = ge->group;
    const int64_t groups = ge->groups, qs = a->q_stride;
    const uint8_t *panel = g->w + (size_t)p * ge->panel_bytes;
    const uint8_t *codes = panel + ge->codes_offset;
    const uint8x16_t bias = vdupq_n_u8(0x80);
    const int8x16_t levels = vld1q_s8(lp_w4c_levels);
    const int8_t *x0 = a->q + b0 * qs, *x1 = x0 + qs;
    float32x4_t accf[2][4];
    for (int b = 0; b < 2; b++)
        for (int q = 0; q < 4; q++) accf[b][q] = vdupq_n_f32(0.0f);
    for (int64_t gi = 0; gi < groups; gi++) {
        const uint8_t *cg = codes + (size_t)gi * ge->code_bytes;
        const int8_t *xg0 = x0 + gi * G, *xg1 = x1 + gi * G;
        int32x4_t acc[8];
        int32x4_t c = type == LP_W4 ? vcombine_s32(vdup_n_s32(a->corr[b0 * groups + gi]),
                                                   vdup_n_s32(a->corr[(b0 + 1) * groups + gi]))
                                    : vdupq_n_s32(0);
        for (int j = 0; j < 8; j++) acc[j] = c;
        for (int k = 0; k < G / 8; k++) { /* 8 inputs: one nibble chunk, or two W8 chunks */
            int8x16_t x = vcombine_s8(vld1_s8(xg0 + 8 * k), vld1_s8(xg1 + 8 * k));
            for (int q = 0; q < 4; q++) {
                int8x16_t first, second; /* rows 4q..4q+3: inputs 8k..8k+3, then 8k+4..8k+7 */
                if (type == LP_W8) {
                    first = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(cg + 128 * k + 16 * q), bias));
                    second = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(cg + 128 * k + 64 + 16 * q), bias));
                } else {
                    unpack_nibbles(type, vld1q_u8(cg + 64 * k + 16 * q), levels, &first, &second);
                }
                acc[2 * q] = vmmlaq_s32(acc[2 * q], x, rows01(first, second));
                acc[2 * q + 1] = vmmlaq_s32(acc[2 * q + 1], x, rows23(first, second));
            }
        }
        float32x4_t dw[4];
        group_scales(type, ge, panel, gi, dw);
        for (int q = 0; q < 4; q++) {
            int64x2_t lo = vreinterpretq_s64_s32(acc[2 * q]), hi = vreinterpretq_s64_s32(acc[2 * q + 1]);
            int32x4_t isum[2] = {vreinterpretq_s32_s64(vzip1q_s64(lo, hi)), vreinterpretq_s32_s64(vzip2q_s64(lo, hi))};
            for (int b = 0; b < 2; b++) {
                float32x4_t dwdx = vmulq_f32(dw[q], vdupq_n_f32(a->d[(b0 + b) * groups + gi]));
                accf[b][q] = vfmaq_f32(accf[b][q], vcvtq_f32_s32(isum[b]), dwdx);
            }
        }
    }
    for (int b = 0; b < 2; b++) store_rows(g, p, b0 + b, accf[b]);
}
#endif

DOT INLINE void gemm(const lp_igemm *g, uint32_t type) {
    for (int64_t p = g->p0; p < g->p1; p++) {
        int64_t b0 = 0;
#if defined(LP_NEON_I8MM)
        for (; b0 + 2 <= g->nb; b0 += 2) pair_tile(g, type, p, b0);
#else
        for (; b0 + 2 <= g->nb; b0 += 2) tile(g, type, p, b0, 2);
#endif
        if (b0 < g->nb) tile(g, type, p, b0, 1);
    }
}

#if defined(LP_NEON_I8MM)
DOT void lp_w4_gemm_neon_i8mm(const lp_igemm *g) { gemm(g, LP_W4); }
DOT void lp_w8_gemm_neon_i8mm(const lp_igemm *g) { gemm(g, LP_W8); }
DOT void lp_w4c_gemm_neon_i8mm(const lp_igemm *g) { gemm(g, LP_W4C); }
#else
DOT void lp_w4_gemm_neon(const lp_igemm *g) { gemm(g, LP_W4); }
DOT void lp_w8_gemm_neon(const lp_igemm *g) { gemm(g, LP_W8); }
DOT void lp_w4c_gemm_neon(const lp_igemm *g) { gemm(g, LP_W4C); }
#endif

#else
typedef int lp_no_neon_on_this_target; /* keep the translation unit non-empty */
#endif
