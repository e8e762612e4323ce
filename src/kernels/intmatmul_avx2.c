/* AVX2 integer GEMM for LP_W4 / LP_W8 / LP_W4C (layout: intpack.c), for CPUs
 * without AVX-512 VNNI. A 64-byte chunk is two ymm halves of 8 rows x 4
 * inputs.
 *
 * W4: maddubs(unsigned biased code 0..15, int8 x) gives pair sums within
 * +-3810, so 8 of them (4 chunks = 32 inputs) add up in int16 without
 * overflow (+-30480) before one madd widens them to int32; the group sum
 * starts at the bias correction as in the VNNI kernel.
 * W8: codes are re-signed (xor 0x80) and multiplied with the sign trick,
 * maddubs(|w|, sign(x, w)), whose pair sums stay within +-32512; no bias
 * correction is needed. W4C: nibbles become their signed levels (one
 * vpshufb) and take W8's sign trick. Results equal the reference bit for
 * bit. */
#include "kernels_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "packed_avx2.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* acc += signed bytes w times x (4 bytes broadcast), by the sign trick. */
AVX2 INLINE __m256i dot_signed(__m256i acc, __m256i w, int32_t x4) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i sx = _mm256_sign_epi8(_mm256_set1_epi32(x4), w);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), sx), ones));
}

/* One panel x B batch rows (B <= 2: 2 halves x B x (int + float) = 8 ymm). */
AVX2 INLINE void tile(const lp_igemm *g, uint32_t type, int64_t p, int64_t b0, int B) {
    const lp_packed_geom *ge = &g->geom;
    const lp_qact *a = g->a;
    const int G = ge->group;
    const int64_t groups = ge->groups, qs = a->q_stride;
    const uint8_t *panel = g->w + (size_t)p * ge->panel_bytes;
    const uint8_t *codes = panel + ge->codes_offset;
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1), bias = _mm256_set1_epi8((char)0x80);
    const __m256i levels = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lp_w4c_levels));
    __m256 accf[2][2];
    for (int h = 0; h < 2; h++)
        for (int b = 0; b < B; b++) accf[h][b] = _mm256_setzero_ps();
    /* the first batch rows of a panel stream it from memory; later ones find it in cache */
    const int64_t ahead = b0 > 0 ? 0 : lp_prefetch_groups256(ge, LP_AVX2_PREFETCH_BYTES);
    for (int64_t gi = 0; gi < groups; gi++) {
        __m256i acc[2][2];
        if (ahead) lp_prefetch_ahead256(g, panel, p, gi, ahead);
        const int8_t *xg = a->q + b0 * qs + gi * G;
        const uint8_t *cg = codes + (size_t)gi * ge->code_bytes;
        if (type == LP_W4) {
            for (int b = 0; b < B; b++) acc[0][b] = acc[1][b] = _mm256_set1_epi32(a->corr[(b0 + b) * groups + gi]);
            for (int k0 = 0; k0 < G / 8; k0 += 4) {
                __m256i s16[2][2];
                for (int h = 0; h < 2; h++)
                    for (int b = 0; b < B; b++) s16[h][b] = _mm256_setzero_si256();
                for (int k = k0; k < k0 + 4; k++)
                    for (int h = 0; h < 2; h++) {
                        __m256i raw = _mm256_loadu_si256((const __m256i *)(cg + 64 * k + 32 * h));
                        __m256i lo = _mm256_and_si256(raw, m4);
                        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                        for (int b = 0; b < B; b++) {
                            const int8_t *x = xg + b * qs + 8 * k;
                            __m256i t = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(lp_load4(x))),
                                                         _mm256_maddubs_epi16(hi, _mm256_set1_epi32(lp_load4(x + 4))));
                            s16[h][b] = _mm256_add_epi16(s16[h][b], t);
                        }
                    }
                for (int h = 0; h < 2; h++)
                    for (int b = 0; b < B; b++)
                        acc[h][b] = _mm256_add_epi32(acc[h][b], _mm256_madd_epi16(s16[h][b], ones));
            }
        } else if (type == LP_W4C) {
            for (int b = 0; b < B; b++) acc[0][b] = acc[1][b] = _mm256_setzero_si256();
            for (int k = 0; k < G / 8; k++)
                for (int h = 0; h < 2; h++) {
                    __m256i raw = _mm256_loadu_si256((const __m256i *)(cg + 64 * k + 32 * h));
                    __m256i lo = _mm256_shuffle_epi8(levels, _mm256_and_si256(raw, m4));
                    __m256i hi = _mm256_shuffle_epi8(levels, _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
                    for (int b = 0; b < B; b++) {
                        const int8_t *x = xg + b * qs + 8 * k;
                        acc[h][b] = dot_signed(dot_signed(acc[h][b], lo, lp_load4(x)), hi, lp_load4(x + 4));
                    }
                }
        } else {
            for (int b = 0; b < B; b++) acc[0][b] = acc[1][b] = _mm256_setzero_si256();
            for (int k = 0; k < G / 4; k++)
                for (int h = 0; h < 2; h++) {
                    __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(cg + 64 * k + 32 * h)), bias);
                    for (int b = 0; b < B; b++) acc[h][b] = dot_signed(acc[h][b], w, lp_load4(xg + b * qs + 4 * k));
                }
        }
        for (int h = 0; h < 2; h++) {
            __m256 dw = lp_panel_scales256(type, ge, panel, gi, h);
            for (int b = 0; b < B; b++) {
                __m256 dwdx = _mm256_mul_ps(dw, _mm256_set1_ps(a->d[(b0 + b) * groups + gi]));
                accf[h][b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[h][b]), dwdx, accf[h][b]);
            }
        }
    }
    for (int h = 0; h < 2; h++)
        for (int b = 0; b < B; b++) lp_store_half256(g, p, b0 + b, h, accf[h][b]);
}

AVX2 INLINE void gemm(const lp_igemm *g, uint32_t type) {
    for (int64_t p = g->p0; p < g->p1; p++) {
        int64_t b0 = 0;
        for (; b0 + 2 <= g->nb; b0 += 2) tile(g, type, p, b0, 2);
        if (b0 < g->nb) tile(g, type, p, b0, 1);
    }
}

/* The activation quantizer of intmatmul.c (lp_quantize_act_ref) with the same arithmetic, 8
 * lanes at a time (see lp_quantize_act_avx512): bit-identical results. */
AVX2 void lp_quantize_act_avx2(const float *x, int64_t cols, int group, int offset, int8_t *q, float *d,
                               int32_t *corr) {
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i magic_bits = _mm256_set1_epi32(0x4B400000);
    const __m256i lo = _mm256_set1_epi32(0x4B400000 - 127), hi = _mm256_set1_epi32(0x4B400000 + 127);
    for (int64_t g0 = 0, gi = 0; g0 < cols; g0 += group, gi++) {
        __m256 m = _mm256_setzero_ps();
        /* maxps returns its second operand when the first is NaN: NaN is
         * ignored, as by fmaxf */
        for (int i = 0; i < group; i += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + g0 + i), abs_mask), m);
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float id = amax > 0 && isfinite(amax) ? 127.0f / amax : 0.0f;
        __m256 idv = _mm256_set1_ps(id);
        __m256i sum = _mm256_setzero_si256();
        for (int i = 0; i < group; i += 8) {
            __m256 t = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + g0 + i), idv), magic);
            __m256i bits = _mm256_min_epi32(_mm256_max_epi32(_mm256_castps_si256(t), lo), hi);
            __m256i r = _mm256_sub_epi32(bits, magic_bits);
            sum = _mm256_add_epi32(sum, r);
            __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
            _mm_storel_epi64((__m128i *)(q + g0 + i), _mm_packs_epi16(p16, p16));
        }
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        d[gi] = id > 0 ? amax / 127.0f : 0.0f;
        corr[gi] = -offset * _mm_cvtsi128_si32(s4);
    }
}

AVX2 void lp_w4_gemm_avx2(const lp_igemm *g) { gemm(g, LP_W4); }
AVX2 void lp_w8_gemm_avx2(const lp_igemm *g) { gemm(g, LP_W8); }
AVX2 void lp_w4c_gemm_avx2(const lp_igemm *g) { gemm(g, LP_W4C); }

#else
typedef int lp_no_int_avx2_on_this_target; /* keep the translation unit non-empty */
#endif
