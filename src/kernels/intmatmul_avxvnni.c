/* AVX-VNNI integer GEMM for LP_W4 / LP_W8 / LP_W4C (layout: intpack.c), for
 * CPUs with the 256-bit VEX form of vpdpbusd but no AVX-512 (Intel Alder
 * Lake and later client cores, AMD Zen 5 run without AVX-512). The
 * arithmetic of the AVX-512 VNNI kernel on ymm halves of 8 rows x 4
 * inputs: vpdpbusd multiplies the unsigned (biased) weight bytes, W4
 * codes 0..15, W4C levels + 128 (one vpshufb) or W8 codes as stored, by 4
 * int8 activations broadcast to every lane, each group's int32 sum
 * starting at the activation-side correction (-bias * sum(x)), which
 * removes the bias exactly; then acc = fma(float(isum), dw * dx, acc) per
 * lane, as in the reference. Against the AVX2 kernel one instruction
 * replaces maddubs + madd (+ add, and W8's sign trick), and no int16 sum
 * can overflow.
 *
 * Tiles: 1-2 batch rows take both halves of a panel in one pass (the
 * decode stream, prefetched); more rows go 4 at a time over one half, so
 * int and float accumulators stay in the 16 ymm registers (the other half
 * and later row blocks find the panel in L1/L2). Every tile computes an
 * output element with the same operations: results equal the reference
 * bit for bit, whatever the batch. */
#include "kernels_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "packed_avx2.h"

#define VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#define INLINE static inline __attribute__((always_inline))
#define MAX_B 4

/* acc += unsigned bytes w times the 4 signed bytes at x, in every lane. */
VNNI INLINE __m256i dot_x4(__m256i acc, __m256i w, const int8_t *x) {
    return _mm256_dpbusd_avx_epi32(acc, w, _mm256_set1_epi32(lp_load4(x)));
}

/* Halves h0..h0+NH-1 of panel p x batch rows b0..b0+B-1 (NH x B <= 4:
 * int and float accumulators, 8 ymm). */
VNNI INLINE void tile(const lp_igemm *g, uint32_t type, int64_t p, int64_t b0, int B, int h0, int NH) {
    const lp_packed_geom *ge = &g->geom;
    const lp_qact *a = g->a;
    const int G = ge->group;
    const int64_t groups = ge->groups, qs = a->q_stride;
    const uint8_t *panel = g->w + (size_t)p * ge->panel_bytes;
    const uint8_t *codes = panel + ge->codes_offset;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    /* the 16 W4C levels in both 16-byte lanes, + 128 for vpdpbusd */
    const __m256i levels = _mm256_xor_si256(
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lp_w4c_levels)), _mm256_set1_epi8((char)0x80));
    __m256 accf[2][MAX_B];
    for (int h = 0; h < NH; h++)
        for (int b = 0; b < B; b++) accf[h][b] = _mm256_setzero_ps();
    /* the first pass over a panel streams it from memory; later ones find it in cache */
    const int64_t ahead = b0 > 0 || h0 > 0 ? 0 : lp_prefetch_groups256(ge, LP_AVX2_PREFETCH_BYTES);
    for (int64_t gi = 0; gi < groups; gi++) {
        if (ahead) lp_prefetch_ahead256(g, panel, p, gi, ahead);
        __m256i acc[2][MAX_B];
        for (int b = 0; b < B; b++) {
            __m256i c = _mm256_set1_epi32(a->corr[(b0 + b) * groups + gi]);
            for (int h = 0; h < NH; h++) acc[h][b] = c;
        }
        const int8_t *xg = a->q + b0 * qs + gi * G;
        const uint8_t *cg = codes + (size_t)gi * ge->code_bytes + 32 * h0;
        if (type != LP_W8) {
            for (int k = 0; k < G / 8; k++)
                for (int h = 0; h < NH; h++) {
                    __m256i raw = _mm256_loadu_si256((const __m256i *)(cg + 64 * k + 32 * h));
                    __m256i lo = _mm256_and_si256(raw, m4);
                    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                    if (type == LP_W4C) {
                        lo = _mm256_shuffle_epi8(levels, lo);
                        hi = _mm256_shuffle_epi8(levels, hi);
                    }
                    for (int b = 0; b < B; b++) {
                        const int8_t *x = xg + b * qs + 8 * k;
                        acc[h][b] = dot_x4(dot_x4(acc[h][b], lo, x), hi, x + 4);
                    }
                }
        } else {
            for (int k = 0; k < G / 4; k++)
                for (int h = 0; h < NH; h++) {
                    __m256i w = _mm256_loadu_si256((const __m256i *)(cg + 64 * k + 32 * h));
                    for (int b = 0; b < B; b++) acc[h][b] = dot_x4(acc[h][b], w, xg + b * qs + 4 * k);
                }
        }
        for (int h = 0; h < NH; h++) {
            __m256 dw = lp_panel_scales256(type, ge, panel, gi, h0 + h);
            for (int b = 0; b < B; b++) {
                __m256 dwdx = _mm256_mul_ps(dw, _mm256_set1_ps(a->d[(b0 + b) * groups + gi]));
                accf[h][b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[h][b]), dwdx, accf[h][b]);
            }
        }
    }
    for (int h = 0; h < NH; h++)
        for (int b = 0; b < B; b++) lp_store_half256(g, p, b0 + b, h0 + h, accf[h][b]);
}

/* Rows b0.. of one panel in blocks of 4 (then 3, 2 or 1) over half h. */
VNNI INLINE void half_blocks(const lp_igemm *g, uint32_t type, int64_t p, int h) {
    int64_t b0 = 0;
    for (; b0 + 4 <= g->nb; b0 += 4) tile(g, type, p, b0, 4, h, 1);
    switch (g->nb - b0) {
    case 3: tile(g, type, p, b0, 3, h, 1); break;
    case 2: tile(g, type, p, b0, 2, h, 1); break;
    case 1: tile(g, type, p, b0, 1, h, 1); break;
    default: break;
    }
}

VNNI INLINE void gemm(const lp_igemm *g, uint32_t type) {
    for (int64_t p = g->p0; p < g->p1; p++) {
        if (g->nb == 1) tile(g, type, p, 0, 1, 0, 2);
        else if (g->nb == 2) tile(g, type, p, 0, 2, 0, 2);
        else
            for (int h = 0; h < 2; h++) half_blocks(g, type, p, h);
    }
}

VNNI void lp_w4_gemm_avxvnni(const lp_igemm *g) { gemm(g, LP_W4); }
VNNI void lp_w8_gemm_avxvnni(const lp_igemm *g) { gemm(g, LP_W8); }
VNNI void lp_w4c_gemm_avxvnni(const lp_igemm *g) { gemm(g, LP_W4C); }

#else
typedef int lp_no_int_avxvnni_on_this_target; /* keep the translation unit non-empty */
#endif
