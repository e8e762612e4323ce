/* AVX-512 VNNI integer GEMM for LP_W4 / LP_W8 / LP_W4C (layout: intpack.c).
 *
 * One 64-byte code chunk is one zmm: 16 dword lanes = the panel's 16 rows,
 * 4 bytes per lane = 4 consecutive inputs. vpdpbusd multiplies those
 * unsigned (biased) weight bytes by 4 int8 activations broadcast to every
 * lane (W4C nibbles become their levels + 128 through one vpshufb, or
 * vpermb in the copy of this file built with AVX512-VBMI), so each instruction does 16 rows x 4 inputs and nothing needs a
 * horizontal sum. Each group's int32 sum starts at the activation-side
 * correction (-bias * sum(x)), which removes the weight bias exactly; then
 * acc = fma(float(isum), dw * dx, acc) per lane, as in the reference.
 *
 * Register tiles: NP panels x B batch rows of int32 and float accumulators.
 * 1-row decode uses 4 panels (independent dpbusd chains, software
 * prefetch: four streams keep more bytes in flight than one); 2-16 rows
 * (speculative trees, decode streams) take rows_tile: 2 panels x 2-6
 * rows, or one panel x blocks of up to 8 rows (each chunk unpacked once
 * for all of them, activations group-major so one pointer reaches every
 * row, broadcast by vpdpbusd itself); prefill uses 1 panel x 8 batch rows
 * so each unpacked chunk feeds 16 dpbusd. Without the group-major copy (a
 * scratch too small for it) 2-9 rows fall back to the 4-panel tiles.
 * Every tile shape computes an output element with the same operations,
 * so results do not depend on the batch size (batch invariance). */
#include "kernels_internal.h"

#if defined(__x86_64__)
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "packed_avx512.h"

#if defined(LP_PACKED_VBMI)
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")))
#else
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#endif
#define INLINE static inline __attribute__((always_inline))
#define MAX_B 8
/* How far ahead the 1-4-row tiles prefetch each panel stream (8 KiB per
 * 4-panel tile). A core keeps only so many lines in flight, and a stream
 * reaches the bandwidth they allow only when enough bytes are requested
 * ahead: 1 KiB was enough on the Intel box, not on Zen 5
 * (docs/benchmarks.md section 22). */
#define PREFETCH_BYTES 2048
/* Up to this many batch rows (several decode streams) take few_rows():
 * measured up to 1.4x the 1-panel prefill tile when weights come from
 * DRAM. */
#define FEW_ROWS 9
/* From LP_FEW_ROWS_MIN up to this many batch rows take few_rows_tiles()
 * (blocks of up to MAX_RB rows over each panel), when the quantizer laid
 * the codes out group-major for them (lp_qact.qg); else few_rows() /
 * few_rows_g32(). */
#define FEW_ROWS_MAX LP_FEW_ROWS_MAX
#define MAX_RB 8 /* batch rows per few-row block */
/* How far ahead few_rows_tiles() prefetches its one stream. Weights from
 * DRAM (65536 x 2048 W4C, one thread): 8 rows 2.0-2.2x one row with 4 or
 * 8 KiB, 2.2-2.3x with 2 KiB. */
#define FEW_PREFETCH_BYTES 4096
/* Up to this many rows take rows_tile over pairs of panels: 2 x 6 rows of
 * int32 and float sums are 24 of the 32 registers. */
#define PAIR_ROWS_MAX 6

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

/* Software prefetch (into L2) of the group PREFETCH_BYTES of codes ahead
 * in the stream of panel p, a panel of a tile of NP: its own later groups,
 * then the same panel of the next tile, NP panels on, if this thread will
 * run that too (below g->prefetch_p1). Scales come along, one line per 64
 * bytes. Ahead of the first groups of each new tile was where the stream
 * stalled: prefetching only within the panel left every tile to start on
 * demand misses, and the 4-panel tiles of a 2048-column matrix are only
 * 72 KiB. 1-row decode, 2 threads, 2048-column matrices: 26.8-28.6 ->
 * 28.2-30.3 GB/s. */
VNNI INLINE void prefetch_ahead_by(const lp_igemm *g, const uint8_t *panel, int64_t p, int NP, int64_t gi,
                                   size_t bytes) {
    const lp_packed_geom *ge = &g->geom;
    int64_t ahead = (int64_t)(bytes / ge->code_bytes);
    if (ahead < 1) ahead = 1;
    if (ahead > ge->groups) ahead = ge->groups;
    int64_t ga = gi + ahead;
    if (ga >= ge->groups) {
        if (p + NP >= g->prefetch_p1) return;
        ga -= ge->groups;
        panel += (size_t)NP * ge->panel_bytes;
    }
    const char *codes = (const char *)panel + ge->codes_offset + (size_t)ga * ge->code_bytes;
    for (size_t o = 0; o < ge->code_bytes; o += 64) _mm_prefetch(codes + o, _MM_HINT_T1);
    size_t at = ge->scales_offset + (size_t)ga * ge->scale_bytes;
    if (ga == 0 && ge->scales_offset) _mm_prefetch((const char *)panel, _MM_HINT_T1); /* W4C row bases */
    if (at % 64 < ge->scale_bytes) _mm_prefetch((const char *)panel + at, _MM_HINT_T1);
}

VNNI INLINE void prefetch_ahead(const lp_igemm *g, const uint8_t *panel, int64_t p, int NP, int64_t gi) {
    prefetch_ahead_by(g, panel, p, NP, gi, PREFETCH_BYTES);
}

/* Tile of type W4, W8 or W4C: panels p..p+NP-1, batch rows b0..b0+B-1. */
VNNI INLINE void tile(const lp_igemm *g, uint32_t type, int64_t p, int NP, int64_t b0, int B) {
    const lp_packed_geom *ge = &g->geom;
    const lp_qact *a = g->a;
    const int G = ge->group;
    const int64_t groups = ge->groups, qs = a->q_stride;
    const uint8_t *panel[4], *codes[4];
    for (int i = 0; i < NP; i++) {
        panel[i] = g->w + (size_t)(p + i) * ge->panel_bytes;
        codes[i] = panel[i] + ge->codes_offset;
    }
    __m512 accf[4][MAX_B];
    for (int i = 0; i < NP; i++)
        for (int b = 0; b < B; b++) accf[i][b] = _mm512_setzero_ps();
    for (int64_t gi = 0; gi < groups; gi++) {
        if (B <= 3) {
            /* Decode-shaped tiles (up to 3 rows) stream their panels from
             * memory: fetching each stream PREFETCH_BYTES ahead measured
             * ~10% closer to the read bandwidth than the hardware
             * prefetchers alone. That includes single panels, e.g. a
             * LoRA's A matrix (rank 32 = 2 panels, one per thread), short
             * streams the hardware barely ramps up on: 8 one-row adapters'
             * shrinks took 6.1 -> 5.5 ms per step; a farther distance for
             * those (g->stream_prefetch) more. Prefill tiles (8 rows)
             * reuse a panel in cache and do not prefetch. */
            size_t pf = NP == 1 && g->stream_prefetch ? g->stream_prefetch : PREFETCH_BYTES;
            for (int i = 0; i < NP; i++) prefetch_ahead_by(g, panel[i], p + i, NP, gi, pf);
        }
        __m512i acc[4][MAX_B];
        for (int b = 0; b < B; b++) {
            __m512i c = _mm512_set1_epi32(a->corr[(b0 + b) * groups + gi]);
            for (int i = 0; i < NP; i++) acc[i][b] = c;
        }
        const int8_t *xg = a->q + b0 * qs + gi * G;
        if (type != LP_W8) {
            for (int k = 0; k < G / 8; k++) {
                for (int i = 0; i < NP; i++) {
                    __m512i lo, hi;
                    lp_unpack_nibbles512(type, false, _mm512_loadu_si512(codes[i] + (size_t)gi * ge->code_bytes + 64 * (size_t)k), &lo, &hi);
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
            __m512 dw = lp_panel_scales512(type, ge, panel[i], gi);
            for (int b = 0; b < B; b++) {
                __m512 dwdx = _mm512_mul_ps(dw, _mm512_set1_ps(a->d[(b0 + b) * groups + gi]));
                accf[i][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][b]), dwdx, accf[i][b]);
            }
        }
    }
    for (int i = 0; i < NP; i++)
        for (int b = 0; b < B; b++) store_rows(g, p + i, b0 + b, accf[i][b]);
}

/* acc += w (unsigned bytes) x the 4 signed activation bytes at x, broadcast
 * to every lane by the instruction itself ({1to16}): GCC 12 folds
 * broadcasts into fma and add but not into vpdpbusd, and the separate
 * vpbroadcastd were a third of a few-row tile's instructions (clang folds
 * them itself). */
VNNI INLINE __m512i dpbusd_x4(__m512i acc, __m512i w, const int8_t *x) {
#if defined(__GNUC__) && !defined(__clang__)
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int8_t(*)[4])x));
    return acc;
#else
    return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(load4(x)));
#endif
}

/* Few-row tile: NP panels from p (1, or 2 for RB <= PAIR_ROWS_MAX) x RB
 * batch rows b0.. (RB <= MAX_RB), every group's int32 sums in registers
 * and the float accumulators too. Up to 8 (panel, row) pairs, each sums
 * in two vpdpbusd chains (low and high nibbles, or W8's even and odd
 * chunks, 4 long at group 32) so that about two groups' chains in flight
 * cover the instruction's latency; more pairs are enough chains by
 * themselves and need the registers, so one chain each. Either way the
 * sum is the same exact integer.
 * Each 64-byte chunk of codes is loaded and unpacked once for all RB rows;
 * the activation bytes of a group come from the group-major copy
 * (lp_qact.qg), one pointer for every row; the scale products take dx as
 * the vmulps' broadcast operand. Per group and row: G/4 vpdpbusd (the
 * activations as their broadcast operand, dpbusd_x4) plus the float
 * finish (add, convert, dw * dx, fma). G: the group when a
 * compile-time 32 (chunks fully unrolled), else 0 (the geometry's). pf:
 * how many bytes ahead to prefetch the stream, or 0 (a panel's later
 * blocks of rows find it in L1/L2). Same operations per output as tile() and the
 * reference, so the same bits. */
VNNI INLINE void rows_tile(const lp_igemm *g, uint32_t type, int64_t p, int NP, int64_t b0, int RB, int G_const,
                           size_t pf) {
    const lp_packed_geom *ge = &g->geom;
    const lp_qact *a = g->a;
    const int G = G_const ? G_const : ge->group;
    const int64_t groups = ge->groups, nb = a->rows;
    const size_t cb = ge->code_bytes;
    const bool one_chain = NP * RB > 8;
    const uint8_t *panel[2], *codes[2];
    for (int i = 0; i < NP; i++) {
        panel[i] = g->w + (size_t)(p + i) * ge->panel_bytes;
        codes[i] = panel[i] + ge->codes_offset;
    }
    __m512 accf[2][MAX_RB];
    for (int i = 0; i < NP; i++)
        for (int r = 0; r < RB; r++) accf[i][r] = _mm512_setzero_ps();
    for (int64_t gi = 0; gi < groups; gi++) {
        if (pf)
            for (int i = 0; i < NP; i++) prefetch_ahead_by(g, panel[i], p + i, NP, gi, pf);
        const int8_t *xg = a->qg + (gi * nb + b0) * G;
        const float *dg = a->dg + gi * nb + b0;
        const int32_t *cg = a->cg + gi * nb + b0;
        __m512i acc[2][MAX_RB], acc2[2][MAX_RB];
        for (int i = 0; i < NP; i++)
            for (int r = 0; r < RB; r++) {
                acc[i][r] = _mm512_set1_epi32(cg[r]);
                acc2[i][r] = _mm512_setzero_si512();
            }
        for (int i = 0; i < NP; i++) {
            const uint8_t *c = codes[i] + (size_t)gi * cb;
            if (type != LP_W8) {
                for (int k = 0; k < G / 8; k++) {
                    __m512i lo, hi;
                    lp_unpack_nibbles512(type, false, _mm512_loadu_si512(c + 64 * (size_t)k), &lo, &hi);
                    for (int r = 0; r < RB; r++) {
                        acc[i][r] = dpbusd_x4(acc[i][r], lo, xg + r * G + 8 * k);
                        if (one_chain) acc[i][r] = dpbusd_x4(acc[i][r], hi, xg + r * G + 8 * k + 4);
                        else acc2[i][r] = dpbusd_x4(acc2[i][r], hi, xg + r * G + 8 * k + 4);
                    }
                }
            } else {
                for (int k = 0; k < G / 4; k += 2) {
                    __m512i w0 = _mm512_loadu_si512(c + 64 * (size_t)k), w1 = _mm512_loadu_si512(c + 64 * (size_t)k + 64);
                    for (int r = 0; r < RB; r++) {
                        acc[i][r] = dpbusd_x4(acc[i][r], w0, xg + r * G + 4 * k);
                        if (one_chain) acc[i][r] = dpbusd_x4(acc[i][r], w1, xg + r * G + 4 * k + 4);
                        else acc2[i][r] = dpbusd_x4(acc2[i][r], w1, xg + r * G + 4 * k + 4);
                    }
                }
            }
        }
        for (int i = 0; i < NP; i++) {
            __m512 dw = lp_panel_scales512(type, ge, panel[i], gi);
            for (int r = 0; r < RB; r++)
                accf[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(one_chain ? acc[i][r] : _mm512_add_epi32(acc[i][r], acc2[i][r])),
                                             _mm512_mul_ps(dw, _mm512_set1_ps(dg[r])), accf[i][r]);
        }
    }
    for (int i = 0; i < NP; i++)
        for (int r = 0; r < RB; r++) store_rows(g, p + i, b0 + r, accf[i][r]);
}

/* rows_tile with RB a constant (1 <= rb <= MAX_RB). */
VNNI INLINE void rows_tile_rb(const lp_igemm *g, uint32_t type, int64_t p, int64_t b0, int rb, int G, size_t pf) {
    switch (rb) {
    case 1: rows_tile(g, type, p, 1, b0, 1, G, pf); break;
    case 2: rows_tile(g, type, p, 1, b0, 2, G, pf); break;
    case 3: rows_tile(g, type, p, 1, b0, 3, G, pf); break;
    case 4: rows_tile(g, type, p, 1, b0, 4, G, pf); break;
    case 5: rows_tile(g, type, p, 1, b0, 5, G, pf); break;
    case 6: rows_tile(g, type, p, 1, b0, 6, G, pf); break;
#if MAX_RB >= 7
    case 7: rows_tile(g, type, p, 1, b0, 7, G, pf); break;
#endif
#if MAX_RB >= 8
    case 8: rows_tile(g, type, p, 1, b0, 8, G, pf); break;
#endif
    default: break;
    }
}

/* 2-PAIR_ROWS_MAX rows over panels p, p+1, both panels' streams
 * prefetched as the 1-row tiles do theirs: two streams keep more bytes in
 * flight than one. */
VNNI INLINE void rows_tile_pair(const lp_igemm *g, uint32_t type, int64_t p, int rb, int G) {
    switch (rb) {
    case 2: rows_tile(g, type, p, 2, 0, 2, G, PREFETCH_BYTES); break;
    case 3: rows_tile(g, type, p, 2, 0, 3, G, PREFETCH_BYTES); break;
    case 4: rows_tile(g, type, p, 2, 0, 4, G, PREFETCH_BYTES); break;
    case 5: rows_tile(g, type, p, 2, 0, 5, G, PREFETCH_BYTES); break;
    case 6: rows_tile(g, type, p, 2, 0, 6, G, PREFETCH_BYTES); break;
    default: break;
    }
}

/* LP_FEW_ROWS_MIN..FEW_ROWS_MAX batch rows (speculative trees, decode
 * streams): up to PAIR_ROWS_MAX rows in one block over pairs of panels;
 * more in as few blocks of up to MAX_RB as hold them, as even as they go,
 * over each panel in turn, where later blocks read the panel the first
 * just brought into L1/L2. */
VNNI INLINE void few_rows_tiles(const lp_igemm *g, uint32_t type, int G) {
    const int64_t nb = g->nb;
    if (nb <= PAIR_ROWS_MAX) {
        int64_t p = g->p0;
        for (; p + 2 <= g->p1; p += 2) rows_tile_pair(g, type, p, (int)nb, G);
        if (p < g->p1) rows_tile_rb(g, type, p, 0, (int)nb, G, FEW_PREFETCH_BYTES);
        return;
    }
    const int64_t nblocks = (nb + MAX_RB - 1) / MAX_RB;
    int64_t start[LP_FEW_ROWS_MAX + 1];
    for (int64_t j = 0; j <= nblocks; j++) start[j] = j * nb / nblocks;
    for (int64_t p = g->p0; p < g->p1; p++)
        for (int64_t j = 0; j < nblocks; j++)
            rows_tile_rb(g, type, p, start[j], (int)(start[j + 1] - start[j]), G, j == 0 ? FEW_PREFETCH_BYTES : 0);
}

/* Batch rows [b0, b0+B) for B <= 3 over 4-panel steps, then single panels. */
#define SMALL_BATCH(TYPE, B)                                                      \
    do {                                                                          \
        int64_t p = g->p0;                                                        \
        for (; p + 4 <= g->p1; p += 4) tile(g, TYPE, p, 4, b0, B);                \
        for (; p < g->p1; p++) tile(g, TYPE, p, 1, b0, B);                        \
    } while (0)

/* 4 batch rows as two passes of 2 over each 4-panel step (4 x 4
 * accumulators of each kind would not fit the registers); the second pass
 * finds the panels in L1/L2. */
VNNI INLINE void four_rows(const lp_igemm *g, uint32_t type) {
    int64_t p = g->p0;
    for (; p + 4 <= g->p1; p += 4) {
        tile(g, type, p, 4, 0, 2);
        tile(g, type, p, 4, 2, 2);
    }
    for (; p < g->p1; p++) tile(g, type, p, 1, 0, 4);
}

/* A few batch rows (several decode streams): 4-panel steps, the batch in
 * blocks of 3 rows; the 4 panels stay in L1/L2 between the blocks. */
VNNI INLINE void few_rows(const lp_igemm *g, uint32_t type) {
    int64_t p = g->p0;
    for (; p + 4 <= g->p1; p += 4) {
        int64_t b0 = 0;
        for (; b0 + 3 <= g->nb; b0 += 3) tile(g, type, p, 4, b0, 3);
        if (g->nb - b0 == 2) tile(g, type, p, 4, b0, 2);
        if (g->nb - b0 == 1) tile(g, type, p, 4, b0, 1);
    }
    for (; p < g->p1; p++) {
        int64_t b0 = 0;
        for (; b0 + 3 <= g->nb; b0 += 3) tile(g, type, p, 1, b0, 3);
        if (g->nb - b0 == 2) tile(g, type, p, 1, b0, 2);
        if (g->nb - b0 == 1) tile(g, type, p, 1, b0, 1);
    }
}

/* Group gi of batch rows b..b+RB-1 against the unpacked codes wv of NP
 * panels. Each (row, panel) sums even and odd chunks in two int32 chains:
 * with RB = 2 that is 8 independent dpbusd chains, enough to hide their
 * latency (the sum of the two is the same exact integer). */
VNNI INLINE void rows_g32(const lp_qact *a, bool nibbles, __m512i wv[2][8], const __m512 dw[2], int NP, int64_t gi,
                          int64_t b, int RB, float accf[2][FEW_ROWS][16]) {
    const int64_t groups = a->groups;
    __m512i acc[2][2][2];
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NP; i++) {
            acc[r][i][0] = _mm512_set1_epi32(a->corr[(b + r) * groups + gi]);
            acc[r][i][1] = _mm512_setzero_si512();
        }
    for (int k = 0; k < 8; k++)
        for (int r = 0; r < RB; r++) {
            const int8_t *xg = a->q + (b + r) * a->q_stride + gi * 32;
            __m512i xv = _mm512_set1_epi32(load4(xg + (nibbles ? 8 * (k / 2) + 4 * (k % 2) : 4 * k)));
            for (int i = 0; i < NP; i++) acc[r][i][k & 1] = _mm512_dpbusd_epi32(acc[r][i][k & 1], wv[i][k], xv);
        }
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NP; i++) {
            __m512i isum = _mm512_add_epi32(acc[r][i][0], acc[r][i][1]);
            __m512 dwdx = _mm512_mul_ps(dw[i], _mm512_set1_ps(a->d[(b + r) * groups + gi]));
            _mm512_store_ps(accf[i][b + r], _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dwdx, _mm512_load_ps(accf[i][b + r])));
        }
}

/* A few batch rows (several decode streams) at group 32, panels in pairs:
 * each group's codes of both panels are loaded (and for W4 unpacked) into
 * 16 registers once, then every batch row multiplies against them, so the
 * weights cross the load ports once per step rather than once per block of
 * rows. The float accumulators live in a small L1 buffer (one load and
 * store per group and row) to leave the registers to the weights. Same
 * operations per output as tile(), so the bits match. */
VNNI INLINE void pair_rows_g32(const lp_igemm *g, uint32_t type, int64_t p, int NP) {
    const lp_packed_geom *ge = &g->geom;
    const lp_qact *a = g->a;
    const int64_t groups = ge->groups, nb = g->nb;
    const uint8_t *panel[2], *codes[2];
    for (int i = 0; i < NP; i++) {
        panel[i] = g->w + (size_t)(p + i) * ge->panel_bytes;
        codes[i] = panel[i] + ge->codes_offset;
    }
    _Alignas(64) float accf[2][FEW_ROWS][16];
    for (int i = 0; i < NP; i++)
        for (int64_t b = 0; b < nb; b++) _mm512_store_ps(accf[i][b], _mm512_setzero_ps());
    for (int64_t gi = 0; gi < groups; gi++) {
        __m512i wv[2][8]; /* W4, W4C: lo, hi of 4 chunks; W8: 8 chunks */
        __m512 dw[2];
        for (int i = 0; i < NP; i++) {
            const uint8_t *c = codes[i] + (size_t)gi * ge->code_bytes;
            prefetch_ahead(g, panel[i], p + i, NP, gi);
            if (type != LP_W8) {
                for (int k = 0; k < 4; k++) lp_unpack_nibbles512(type, false, _mm512_loadu_si512(c + 64 * k), &wv[i][2 * k], &wv[i][2 * k + 1]);
            } else {
                for (int k = 0; k < 8; k++) wv[i][k] = _mm512_loadu_si512(c + 64 * k);
            }
            dw[i] = lp_panel_scales512(type, ge, panel[i], gi);
        }
        int64_t b = 0;
        for (; b + 2 <= nb; b += 2) rows_g32(a, type != LP_W8, wv, dw, NP, gi, b, 2, accf);
        if (b < nb) rows_g32(a, type != LP_W8, wv, dw, NP, gi, b, 1, accf);
    }
    for (int i = 0; i < NP; i++)
        for (int64_t b = 0; b < nb; b++) store_rows(g, p + i, b, _mm512_load_ps(accf[i][b]));
}

VNNI INLINE void few_rows_g32(const lp_igemm *g, uint32_t type) {
    int64_t p = g->p0;
    for (; p + 2 <= g->p1; p += 2) pair_rows_g32(g, type, p, 2);
    if (p < g->p1) pair_rows_g32(g, type, p, 1);
}

VNNI INLINE void gemm(const lp_igemm *g, uint32_t type) {
    int64_t b0 = 0;
    if (g->nb >= LP_FEW_ROWS_MIN && g->nb <= FEW_ROWS_MAX && g->a->qg) {
        if (g->geom.group == 32) few_rows_tiles(g, type, 32);
        else few_rows_tiles(g, type, 0);
        return;
    }
    if (g->nb > 4 && g->nb <= FEW_ROWS) {
        if (g->geom.group == 32) few_rows_g32(g, type);
        else few_rows(g, type);
        return;
    }
    if (g->nb <= 4) {
        switch (g->nb) {
        case 1: SMALL_BATCH(type, 1); break;
        case 2: SMALL_BATCH(type, 2); break;
        case 3: SMALL_BATCH(type, 3); break;
        default: four_rows(g, type); break;
        }
        return;
    }
    /* Prefill: each panel (a few KiB to tens of KiB) stays in cache while
     * all batch rows pass over it. */
    for (int64_t p = g->p0; p < g->p1; p++) {
        for (b0 = 0; b0 + MAX_B <= g->nb; b0 += MAX_B) tile(g, type, p, 1, b0, MAX_B);
        switch (g->nb - b0) {
        case 7: tile(g, type, p, 1, b0, 7); break;
        case 6: tile(g, type, p, 1, b0, 6); break;
        case 5: tile(g, type, p, 1, b0, 5); break;
        case 4: tile(g, type, p, 1, b0, 4); break;
        case 3: tile(g, type, p, 1, b0, 3); break;
        case 2: tile(g, type, p, 1, b0, 2); break;
        case 1: tile(g, type, p, 1, b0, 1); break;
        default: break;
        }
    }
}

#if defined(LP_PACKED_VBMI)
VNNI void lp_w4c_gemm_vnni_vbmi(const lp_igemm *g) { gemm(g, LP_W4C); }
#else
/* Lane j of the result: the max (float) or the sum (int32 bits) of the 16
 * lanes of v[j]. Four rounds of shuffles that each halve the vectors do 16
 * reductions in 15 operations, where one reduction alone takes 4 dependent
 * steps. Both are exact (no rounding, NaN never reaches them), so the order
 * is free. */
VNNI INLINE __m512 op16(__m512 a, __m512 b, bool int_sum) {
    if (int_sum) return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
    return _mm512_max_ps(a, b);
}

VNNI INLINE __m512 reduce16(__m512 v[16], bool int_sum) {
    /* 16 -> 8: 128-bit lanes 0,1 of each hold group 2i, lanes 2,3 group 2i+1 */
    for (int i = 0; i < 8; i++)
        v[i] = op16(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                    _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)), int_sum);
    /* 8 -> 4: 128-bit lane L of v[i] holds group 4i + L */
    for (int i = 0; i < 4; i++)
        v[i] = op16(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                    _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)), int_sum);
    /* 4 -> 2: in 128-bit lane L, elements 0,1 hold group 8i + L, 2,3 group 8i + 4 + L */
    for (int i = 0; i < 2; i++)
        v[i] = op16(_mm512_shuffle_ps(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                    _mm512_shuffle_ps(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)), int_sum);
    /* 2 -> 1: element k of 128-bit lane L holds group 4k + L; transpose back */
    __m512 r = op16(_mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
                    _mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)), int_sum);
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}

/* Codes of 16 floats at scale id (the 1.5 * 2^23 rounding trick, clamped to
 * +-127 as round_magic does), stored as bytes; returns them as int32. */
VNNI INLINE __m512i codes16(const float *x, __m512 idv, int8_t *q) {
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    const __m512i magic_bits = _mm512_set1_epi32(0x4B400000);
    const __m512i lo = _mm512_set1_epi32(0x4B400000 - 127), hi = _mm512_set1_epi32(0x4B400000 + 127);
    __m512 t = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(x), idv), magic);
    /* round_magic clamps bits - magic computed without overflow: clamping
     * the bits first is the same for every input (NaN too) */
    __m512i bits = _mm512_min_epi32(_mm512_max_epi32(_mm512_castps_si512(t), lo), hi);
    __m512i r = _mm512_sub_epi32(bits, magic_bits);
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(r));
    return r;
}

/* Groups gi..gi+15 of 32 (1-row decode quantizes 64-176 groups per pass,
 * serially: one group at a time it took 0.66 us for 2048 columns, most of
 * it in two 4-step reductions per group). */
VNNI INLINE void quantize16_g32(const float *x, int offset, int8_t *q, float *d, int32_t *corr) {
    __m512 m[16];
    for (int j = 0; j < 16; j++)
        m[j] = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + 32 * j + 16)),
                             _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + 32 * j)), _mm512_setzero_ps()));
    __m512 amax = reduce16(m, false);
    /* id = 127 / amax for 0 < amax < inf, else 0; d = amax / 127 where id > 0 */
    __mmask16 ok = _mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_GT_OQ) &
                   _mm512_cmp_ps_mask(amax, _mm512_set1_ps(FLT_MAX), _CMP_LE_OQ);
    __m512 id = _mm512_maskz_div_ps(ok, _mm512_set1_ps(127.0f), amax);
    __mmask16 pos = _mm512_cmp_ps_mask(id, _mm512_setzero_ps(), _CMP_GT_OQ);
    _mm512_storeu_ps(d, _mm512_maskz_div_ps(pos, amax, _mm512_set1_ps(127.0f)));
    _Alignas(64) float ids[16];
    _mm512_store_ps(ids, id);
    __m512 sums[16];
    for (int j = 0; j < 16; j++) {
        __m512 idv = _mm512_set1_ps(ids[j]);
        __m512i a = codes16(x + 32 * j, idv, q + 32 * j), b = codes16(x + 32 * j + 16, idv, q + 32 * j + 16);
        sums[j] = _mm512_castsi512_ps(_mm512_add_epi32(a, b));
    }
    __m512i sum = _mm512_castps_si512(reduce16(sums, true));
    _mm512_storeu_si512(corr, _mm512_mullo_epi32(sum, _mm512_set1_epi32(-offset)));
}

/* The activation quantizer of intmatmul.c (lp_quantize_act_ref), 16 lanes at
 * a time with the very same arithmetic: amax by max (NaN ignored, as
 * fmaxf), id = 127 / amax, codes by the 1.5 * 2^23 rounding trick and the
 * same clamp, so the codes, scales and corrections are bit-identical. */
VNNI void lp_quantize_act_avx512(const float *x, int64_t cols, int group, int offset, int8_t *q, float *d,
                                 int32_t *corr) {
    int64_t g0 = 0, gi = 0;
    if (group == 32)
        for (; g0 + 16 * 32 <= cols; g0 += 16 * 32, gi += 16) quantize16_g32(x + g0, offset, q + g0, d + gi, corr + gi);
    for (; g0 < cols; g0 += group, gi++) {
        __m512 m = _mm512_setzero_ps();
        for (int i = 0; i < group; i += 16) m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + g0 + i)), m);
        float amax = _mm512_reduce_max_ps(m);
        float id = amax > 0 && isfinite(amax) ? 127.0f / amax : 0.0f;
        __m512 idv = _mm512_set1_ps(id);
        __m512i sum = _mm512_setzero_si512();
        for (int i = 0; i < group; i += 16) sum = _mm512_add_epi32(sum, codes16(x + g0 + i, idv, q + g0 + i));
        d[gi] = id > 0 ? amax / 127.0f : 0.0f;
        corr[gi] = -offset * _mm512_reduce_add_epi32(sum);
    }
}

VNNI void lp_w4_gemm_vnni(const lp_igemm *g) { gemm(g, LP_W4); }
VNNI void lp_w8_gemm_vnni(const lp_igemm *g) { gemm(g, LP_W8); }
VNNI void lp_w4c_gemm_vnni(const lp_igemm *g) { gemm(g, LP_W4C); }
#endif

#else
typedef int lp_no_vnni_on_this_target; /* keep the translation unit non-empty */
#endif
