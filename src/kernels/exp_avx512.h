/* e^x on 16 lanes for the AVX-512 kernel files (each defines AVX512, its
 * target attribute, and INLINE before including this). */
#ifndef LP_KERNELS_EXP_AVX512_H
#define LP_KERNELS_EXP_AVX512_H

#include <immintrin.h>

/* e^x for 16 lanes: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two so
 * n ln2 is exact), e^r by its degree-6 Taylor polynomial (error below 2e-7
 * relative on that interval), then scaled by 2^n. Inputs are clamped to
 * [-103, 88.7]: below, the result flushes towards 0 as expf does. */
AVX512 INLINE __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-103.0f)), _mm512_set1_ps(88.7f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

#endif
