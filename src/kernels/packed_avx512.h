/* Private to the AVX-512 packed kernels (intmatmul_avx512.c, intmatmul_amx.c):
 * reading a packed panel's codes and scales into zmm registers, shared so
 * that both levels compute the very same bits. Include after immintrin.h,
 * on x86-64 only; with LP_PACKED_VBMI defined, for code built with
 * AVX512-VBMI (the AMX kernels, intmatmul_avx512_vbmi.c). */
#ifndef LP_PACKED_AVX512_H
#define LP_PACKED_AVX512_H

#include "kernels_internal.h"

#if defined(LP_PACKED_VBMI)
#define LP_AVX512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512vbmi")))
#else
#define LP_AVX512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl")))
#endif

/* The low and high nibbles of a 64-byte chunk of a 4-bit type as bytes:
 * W4 codes as stored (0..15), or minus their bias 8 when `signed_codes`;
 * W4C levels + 128 (unsigned, for vpdpbusd), or the levels themselves. */
LP_AVX512_INLINE void lp_unpack_nibbles512(uint32_t type, bool signed_codes, __m512i raw, __m512i *lo,
                                          __m512i *hi) {
    if (type == LP_W4C) {
        /* the 16 levels in every 16-byte lane, + 128 for vpdpbusd */
        __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lp_w4c_levels));
        if (!signed_codes) table = _mm512_xor_si512(table, _mm512_set1_epi8((char)0x80));
#if defined(LP_PACKED_VBMI)
        /* vpermb reads 6 bits of each index byte: against the 16 levels 4
         * times over, a nibble with anything in the 2 bits above it still
         * finds its level, so no mask: 3 operations per chunk instead of 5
         * (1-row W4C matmuls from DRAM, 2 threads: as many GB/s as W4
         * instead of 5-9 % fewer) */
        *lo = _mm512_permutexvar_epi8(raw, table);
        *hi = _mm512_permutexvar_epi8(_mm512_srli_epi16(raw, 4), table);
#else
        /* vpshufb reads 4 bits (and zeroes on bit 7): mask first */
        const __m512i m4 = _mm512_set1_epi8(0x0f);
        *lo = _mm512_shuffle_epi8(table, _mm512_and_si512(raw, m4));
        *hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4));
#endif
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    *lo = _mm512_and_si512(raw, m4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
    if (signed_codes) {
        const __m512i eight = _mm512_set1_epi8(8);
        *lo = _mm512_sub_epi8(*lo, eight);
        *hi = _mm512_sub_epi8(*hi, eight);
    }
}

/* The 16 row scales of group gi of a panel: f16, or W4C's 8-bit scales
 * added to the row bases as lp_w4c_scale does. */
LP_AVX512_INLINE __m512 lp_panel_scales512(uint32_t type, const lp_packed_geom *ge, const uint8_t *panel,
                                           int64_t gi) {
    const uint8_t *s = panel + ge->scales_offset + (size_t)gi * ge->scale_bytes;
    if (type != LP_W4C) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s));
    __m512i k = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)s));
    __m512i bits = _mm512_add_epi32(_mm512_loadu_si512(panel),
                                    _mm512_slli_epi32(_mm512_and_si512(k, _mm512_set1_epi32(0x7f)), 19));
    /* bits | (k << 24 & sign bit) */
    bits = _mm512_ternarylogic_epi32(bits, _mm512_slli_epi32(k, 24), _mm512_set1_epi32((int)0x80000000u), 0xf8);
    return _mm512_castsi512_ps(bits);
}

#endif
