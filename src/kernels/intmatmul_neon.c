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
 * when getauxval reports asimddp. */
#include "kernels_internal.h"

#if defined(LP_HAVE_NEON_DOT)
#include <arm_neon.h>

#if defined(__clang__)
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

/* One panel x B batch rows (B <= 2: 16 accumulators of 32 registers). */
DOT INLINE void tile(const lp_igemm *g, uint32_t type, int64_t p, int64_t b0, int B) {
    const lp_packed_geom *ge = &g->geom;
    const lp_qact *a = g->a;
    const int G = ge->group;
    const int64_t groups = ge->groups, qs = a->q_stride;
    const uint8_t *panel = g->w + (size_t)p * ge->panel_bytes;
    const uint8_t *codes = panel + ge->codes_offset;
    const uint8x16_t m4 = vdupq_n_u8(0x0f), bias = vdupq_n_u8(0x80);
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
                    uint8x16_t raw = vld1q_u8(cg + 64 * k + 16 * q);
                    int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(raw, m4));
                    int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(raw, 4));
                    if (type == LP_W4C) {
                        lo = vqtbl1q_s8(levels, vreinterpretq_u8_s8(lo));
                        hi = vqtbl1q_s8(levels, vreinterpretq_u8_s8(hi));
                    }
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
        float w4c_scales[LP_PANEL];
        if (type == LP_W4C)
            for (int l = 0; l < LP_PANEL; l++) w4c_scales[l] = lp_packed_scale(type, ge, panel, gi, l);
        for (int q = 0; q < 4; q++) {
            float32x4_t dw = type == LP_W4C ? vld1q_f32(w4c_scales + 4 * q)
                                            : vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(
                                                  (const uint16_t *)(const void *)(panel + (size_t)gi * 32 + 8 * q))));
            for (int b = 0; b < B; b++) {
                float32x4_t dwdx = vmulq_f32(dw, vdupq_n_f32(a->d[(b0 + b) * groups + gi]));
                accf[b][q] = vfmaq_f32(accf[b][q], vcvtq_f32_s32(acc[b][q]), dwdx);
            }
        }
    }
    for (int b = 0; b < B; b++) store_rows(g, p, b0 + b, accf[b]);
}

DOT INLINE void gemm(const lp_igemm *g, uint32_t type) {
    for (int64_t p = g->p0; p < g->p1; p++) {
        int64_t b0 = 0;
        for (; b0 + 2 <= g->nb; b0 += 2) tile(g, type, p, b0, 2);
        if (b0 < g->nb) tile(g, type, p, b0, 1);
    }
}

DOT void lp_w4_gemm_neon(const lp_igemm *g) { gemm(g, LP_W4); }
DOT void lp_w8_gemm_neon(const lp_igemm *g) { gemm(g, LP_W8); }
DOT void lp_w4c_gemm_neon(const lp_igemm *g) { gemm(g, LP_W4C); }

#else
typedef int lp_no_neon_on_this_target; /* keep the translation unit non-empty */
#endif
