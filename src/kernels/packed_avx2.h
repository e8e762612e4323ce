/* Private to the 256-bit packed kernels (intmatmul_avx2.c,
 * intmatmul_avxvnni.c): reading a packed panel's scales into ymm halves,
 * storing its outputs and prefetching its stream, shared so that both
 * levels compute the very same bits. Include after immintrin.h, on x86-64
 * only. A 64-byte code chunk is two ymm halves of 8 rows x 4 inputs. */
#ifndef LP_PACKED_AVX2_H
#define LP_PACKED_AVX2_H

#include <string.h>

#include "kernels_internal.h"

#define LP_AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* How far ahead (bytes of codes) a decode tile prefetches its panel
 * stream: farther than the AVX-512 kernel's 1 KiB per 4-panel tile, as one
 * panel is one stream here (docs/benchmarks.md section 14 has the
 * distances tried). */
#define LP_AVX2_PREFETCH_BYTES 8192

static inline int32_t lp_load4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Stores half h (rows 8h..8h+7) of panel p's outputs for batch row b,
 * those below g->rows. */
LP_AVX2_INLINE void lp_store_half256(const lp_igemm *g, int64_t p, int64_t b, int h, __m256 v) {
    float *y = g->y + b * g->y_stride + p * LP_PANEL + 8 * h;
    int64_t left = g->rows - p * LP_PANEL - 8 * h;
    if (left >= 8) {
        _mm256_storeu_ps(y, v);
        return;
    }
    _Alignas(32) float tmp[8];
    _mm256_store_ps(tmp, v);
    for (int64_t i = 0; i < left; i++) y[i] = tmp[i];
}

/* The 8 row scales of half h of group gi of a panel: f16, or W4C's 8-bit
 * scales added to the row bases as lp_w4c_scale does. */
LP_AVX2_INLINE __m256 lp_panel_scales256(uint32_t type, const lp_packed_geom *ge, const uint8_t *panel, int64_t gi,
                                         int h) {
    const uint8_t *s = panel + ge->scales_offset + (size_t)gi * ge->scale_bytes;
    if (type != LP_W4C) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 16 * h)));
    __m256i k = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(s + 8 * h)));
    __m256i bits = _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(panel + 32 * h)),
                                    _mm256_slli_epi32(_mm256_and_si256(k, _mm256_set1_epi32(0x7f)), 19));
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(k, _mm256_set1_epi32(0x80)), 24);
    return _mm256_castsi256_ps(_mm256_or_si256(bits, sign));
}

/* Groups ahead of the one being computed that a decode tile prefetches:
 * `bytes` of codes (at least one group, at most the panel's). */
static inline int64_t lp_prefetch_groups256(const lp_packed_geom *ge, size_t bytes) {
    int64_t ahead = (int64_t)(bytes / ge->code_bytes);
    if (ahead < 1) ahead = 1;
    return ahead > ge->groups ? ge->groups : ahead;
}

/* Software prefetch (into L2) of group gi + ahead of panel p's stream,
 * running on into panel p + 1 if this thread takes it too: without it the
 * 1-row tile waits on the first load of nearly every chunk (the hardware
 * prefetchers alone lag the stream). As the AVX-512 kernel's
 * prefetch_ahead_by, for a tile of one panel. */
LP_AVX2_INLINE void lp_prefetch_ahead256(const lp_igemm *g, const uint8_t *panel, int64_t p, int64_t gi,
                                         int64_t ahead) {
    const lp_packed_geom *ge = &g->geom;
    int64_t ga = gi + ahead;
    if (ga >= ge->groups) {
        if (p + 1 >= g->prefetch_p1) return;
        ga -= ge->groups;
        panel += ge->panel_bytes;
    }
    const char *codes = (const char *)panel + ge->codes_offset + (size_t)ga * ge->code_bytes;
    for (size_t o = 0; o < ge->code_bytes; o += 64) _mm_prefetch(codes + o, _MM_HINT_T1);
    size_t at = ge->scales_offset + (size_t)ga * ge->scale_bytes;
    if (ga == 0 && ge->scales_offset) _mm_prefetch((const char *)panel, _MM_HINT_T1); /* W4C row bases */
    if (at % 64 < ge->scale_bytes) _mm_prefetch((const char *)panel + at, _MM_HINT_T1);
}

#endif
