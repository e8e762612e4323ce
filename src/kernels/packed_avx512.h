/* Private to the AVX-512 packed kernels (intmatmul_avx512.c, intmatmul_amx.c):
 * reading a packed panel's codes and scales into zmm registers, shared so
 * that both levels compute the very same bits. Include after immintrin.h,
 * on x86-64 only. */
#ifndef LP_PACKED_AVX512_H
#define LP_PACKED_AVX512_H

#include "kernels_internal.h"

#define LP_AVX512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl")))

/* The low and high nibbles of a 64-byte chunk of a 4-bit type as bytes:
 * W4 codes as stored (0..15), or minus their bias 8 when `signed_codes`;
 * W4C levels + 128 (unsigned, for vpdpbusd), or the levels themselves. */
LP_AVX512_INLINE void lp_unpack_nibbles512(uint32_t type, bool signed_codes, __m512i raw, __m512i *lo,
                                          __m512i *hi) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    *lo = _mm512_and_si512(raw, m4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
    if (type == LP_W4C) {
        /* one vpshufb per half: nibble -> level (a 16-byte table in every lane) */
        const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lp_w4c_levels));
        *lo = _mm512_shuffle_epi8(lut, *lo);
        *hi = _mm512_shuffle_epi8(lut, *hi);
        if (!signed_codes) {
            const __m512i bias = _mm512_set1_epi8((char)0x80);
            *lo = _mm512_xor_si512(*lo, bias); /* level + 128 */
            *hi = _mm512_xor_si512(*hi, bias);
        }
    } else if (signed_codes) {
        const __m512i eight = _mm512_set1_epi8(8);
        *lo = _mm512_sub_epi8(*lo, eight);
        *hi = _mm512_sub_epi8(*hi, eight);
    }
}

/* The 16 row scales of group gi of a panel: f16, or W4C's log scales by
 * lp_w4c_scale's two multiplies. */
LP_AVX512_INLINE __m512 lp_panel_scales512(uint32_t type, const lp_packed_geom *ge, const uint8_t *panel,
                                           int64_t gi) {
    const uint8_t *s = panel + ge->scales_offset + (size_t)gi * ge->scale_bytes;
    if (type != LP_W4C) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s));
    __m512i k = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)s));
    /* vpermps reads the low 4 bits of each index: frac[k & 15] */
    __m512 frac = _mm512_permutexvar_ps(k, _mm512_loadu_ps(lp_w4c_frac));
    __m512 m = _mm512_mul_ps(_mm512_loadu_ps((const float *)panel), frac);
    __m512i e = _mm512_and_si512(_mm512_srli_epi32(k, 4), _mm512_set1_epi32(7));
    m = _mm512_mul_ps(m, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(127), e), 23)));
    __m512i sign = _mm512_slli_epi32(_mm512_and_si512(k, _mm512_set1_epi32(0x80)), 24);
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(m), sign));
}

#endif
