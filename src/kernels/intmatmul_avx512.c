/* AVX-512 VNNI integer GEMM for LP_W4 / LP_W8 (layout: intpack.c).
 *
 * One 64-byte code chunk is one zmm: 16 dword lanes = the panel's 16 rows,
 * 4 bytes per lane = 4 consecutive inputs. vpdpbusd multiplies those
 * unsigned (biased) weight bytes by 4 int8 activations broadcast to every
 * lane, so each instruction does 16 rows x 4 inputs and nothing needs a
 * horizontal sum. Each group's int32 sum starts at the activation-side
 * correction (-bias * sum(x)), which removes the weight bias exactly; then
 * acc = fma(float(isum), dw * dx, acc) per lane, as in the reference.
 *
 * Register tiles: NP panels x B batch rows of int32 and float accumulators.
 * Decode (few batch rows) uses 4 panels for 4 independent dpbusd chains
 * while the weights stream in; prefill uses 1 panel x 8 batch rows so each
 * unpacked chunk feeds 16 dpbusd. */
#include "kernels_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))
#define MAX_B 8

static inline int32_t load4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

VNNI INLINE void store_rows(const lp_igemm *g, int64_t p, int64_t b, __m512 v) {
    float *y = g->y + b * g->y_stride + p * LP_PANEL;
    int64_t left = g->rows - p * LP_PANEL;
    if (left >= LP_PANEL) _mm512_storeu_ps(y, v);
    else _mm512_mask_storeu_ps(y, (__mmask16)((1u << left) - 1), v);
}

/* W4 (w4 = true) or W8 tile: panels p..p+NP-1, batch rows b0..b0+B-1. */
VNNI INLINE void tile(const lp_igemm *g, bool w4, int64_t p, int NP, int64_t b0, int B) {
    const lp_packed_geom *ge = &g->geom;
    const lp_qact *a = g->a;
    const int G = ge->group;
    const int64_t groups = ge->groups, qs = a->q_stride;
    const uint8_t *panel[4], *codes[4];
    for (int i = 0; i < NP; i++) {
        panel[i] = g->w + (size_t)(p + i) * ge->panel_bytes;
        codes[i] = panel[i] + (size_t)groups * 32;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512 accf[4][MAX_B];
    for (int i = 0; i < NP; i++)
        for (int b = 0; b < B; b++) accf[i][b] = _mm512_setzero_ps();
    for (int64_t gi = 0; gi < groups; gi++) {
        __m512i acc[4][MAX_B];
        for (int b = 0; b < B; b++) {
            __m512i c = _mm512_set1_epi32(a->corr[(b0 + b) * groups + gi]);
            for (int i = 0; i < NP; i++) acc[i][b] = c;
        }
        const int8_t *xg = a->q + b0 * qs + gi * G;
        if (w4) {
            for (int k = 0; k < G / 8; k++) {
                for (int i = 0; i < NP; i++) {
                    __m512i raw = _mm512_loadu_si512(codes[i] + (size_t)gi * ge->code_bytes + 64 * (size_t)k);
                    __m512i lo = _mm512_and_si512(raw, m4);
                    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
                    for (int b = 0; b < B; b++) {
                        const int8_t *x = xg + b * qs + 8 * k;
                        acc[i][b] = _mm512_dpbusd_epi32(acc[i][b], lo, _mm512_set1_epi32(load4(x)));
                        acc[i][b] = _mm512_dpbusd_epi32(acc[i][b], hi, _mm512_set1_epi32(load4(x + 4)));
                    }
                }
            }
        } else {
            for (int k = 0; k < G / 4; k++) {
                for (int i = 0; i < NP; i++) {
                    __m512i w = _mm512_loadu_si512(codes[i] + (size_t)gi * ge->code_bytes + 64 * (size_t)k);
                    for (int b = 0; b < B; b++)
                        acc[i][b] = _mm512_dpbusd_epi32(acc[i][b], w, _mm512_set1_epi32(load4(xg + b * qs + 4 * k)));
                }
            }
        }
        for (int i = 0; i < NP; i++) {
            __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(panel[i] + (size_t)gi * 32)));
            for (int b = 0; b < B; b++) {
                __m512 dwdx = _mm512_mul_ps(dw, _mm512_set1_ps(a->d[(b0 + b) * groups + gi]));
                accf[i][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][b]), dwdx, accf[i][b]);
            }
        }
    }
    for (int i = 0; i < NP; i++)
        for (int b = 0; b < B; b++) store_rows(g, p + i, b0 + b, accf[i][b]);
}

/* Batch rows [b0, b0+B) for B <= 3 over 4-panel steps, then single panels. */
#define SMALL_BATCH(W4, B)                                                        \
    do {                                                                          \
        int64_t p = g->p0;                                                        \
        for (; p + 4 <= g->p1; p += 4) tile(g, W4, p, 4, b0, B);                  \
        for (; p < g->p1; p++) tile(g, W4, p, 1, b0, B);                          \
    } while (0)

VNNI INLINE void gemm(const lp_igemm *g, bool w4) {
    int64_t b0 = 0;
    if (g->nb <= 3) {
        switch (g->nb) {
        case 1: SMALL_BATCH(w4, 1); break;
        case 2: SMALL_BATCH(w4, 2); break;
        default: SMALL_BATCH(w4, 3); break;
        }
        return;
    }
    /* Prefill: each panel (a few KiB to tens of KiB) stays in cache while
     * all batch rows pass over it. */
    for (int64_t p = g->p0; p < g->p1; p++) {
        for (b0 = 0; b0 + MAX_B <= g->nb; b0 += MAX_B) tile(g, w4, p, 1, b0, MAX_B);
        switch (g->nb - b0) {
        case 7: tile(g, w4, p, 1, b0, 7); break;
        case 6: tile(g, w4, p, 1, b0, 6); break;
        case 5: tile(g, w4, p, 1, b0, 5); break;
        case 4: tile(g, w4, p, 1, b0, 4); break;
        case 3: tile(g, w4, p, 1, b0, 3); break;
        case 2: tile(g, w4, p, 1, b0, 2); break;
        case 1: tile(g, w4, p, 1, b0, 1); break;
        default: break;
        }
    }
}

VNNI void lp_w4_gemm_vnni(const lp_igemm *g) { gemm(g, true); }
VNNI void lp_w8_gemm_vnni(const lp_igemm *g) { gemm(g, false); }

#else
typedef int lp_no_vnni_on_this_target; /* keep the translation unit non-empty */
#endif
