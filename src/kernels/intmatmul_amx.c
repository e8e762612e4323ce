/* AMX integer GEMM for LP_W4 / LP_W8 / LP_W4C: prefill, and at group 32 a few rows
 * (decode streams, see stream_gemm) (layout: intpack.c).
 *
 * The packed layout is already AMX's B-tile (VNNI) format: a 64-byte chunk
 * is 16 output rows x 4 consecutive inputs, i.e. one tile row of K = 4.
 * W8 chunks are loaded straight from the weights (tdpbsud: signed x
 * unsigned biased codes); W4 chunks are unpacked once per panel and column
 * chunk into a small buffer (low nibbles - 8 -> tile row 2k, high nibbles
 * - 8 -> row 2k + 1; tdpbssd) and reused by every batch block. W4C chunks
 * unpack the same way, to their signed levels.
 * The A tile is 16 quantized activation rows x K bytes of one group (K =
 * 32 or 64), read in place from the scratch; tdpbsud multiplies signed
 * activations with the unsigned (biased) codes into a 16 x 16 int32 tile.
 *
 * Per group the int32 tile is stored and finished with AVX-512 exactly as
 * the VNNI kernel does: isum = tile (+ corr for W8, cancelling the bias),
 * acc = fma(float(isum), dw * dx, acc). Integer sums are exact, so results
 * are bit-identical to every other level; the float accumulators of a
 * panel live in Y between column chunks (a store and reload is exact).
 *
 * Tile registers: 0/1 and 4/5 hold the int32 sums of alternate pairs of
 * groups (so one pair's multiplies overlap the previous pair's float
 * work), 2 the activations, 3 the weights. The tile configuration is per thread:
 * every call loads it and releases the tiles before returning. */
#include "kernels_internal.h"

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define LP_PACKED_VBMI 1 /* every CPU with AMX has it; lp_kernels_init checks */
#include "packed_avx512.h"

#define AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* W4 columns unpacked per step: 1024 columns = 256 tile rows = 16 KiB. */
#define AMX_CHUNK 1024

bool lp_amx_available(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    bool tile = (d >> 24) & 1, int8 = (d >> 25) & 1;
    if (!tile || !int8) return false;
    /* Linux hands out the 8 KiB tile state only on request (per process;
     * asking again is harmless). */
    const long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
}

typedef struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

AMX static void configure(int mb, int K) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    static const int sum_tiles[4] = {0, 1, 4, 5};
    for (int t = 0; t < 4; t++) {
        cfg.rows[sum_tiles[t]] = (uint8_t)mb; /* int32 sums */
        cfg.colsb[sum_tiles[t]] = 64;
    }
    cfg.rows[2] = (uint8_t)mb; /* activations */
    cfg.colsb[2] = (uint16_t)K;
    cfg.rows[3] = (uint8_t)(K / 4); /* weights */
    cfg.colsb[3] = 64;
    /* Not _tile_loadconfig: GCC 12 declares its asm operand as one pointer
     * (8 bytes), so the optimiser may drop the stores to the rest of cfg
     * and leave the tiles unconfigured (SIGILL on the first tile op).
     * This operand covers all 64 bytes. */
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

/* Chunks [k0, k0 + nk) of a W4 / W4C panel's code stream (8 inputs each)
 * -> tile rows 2(k-k0) (low nibbles) and 2(k-k0)+1 (high nibbles), made
 * signed (code - 8, or the level) so the sums need no bias correction. */
AMX INLINE void unpack_w4(uint32_t type, const uint8_t *codes, int64_t k0, int64_t nk, uint8_t *out,
                          const uint8_t *next) {
    for (int64_t k = 0; k < nk; k++) {
        /* the same codes of the next panel, for the next unpack: with few
         * batch rows the weights stream from memory */
        if (next) _mm_prefetch((const char *)next + 64 * (k0 + k), _MM_HINT_T0);
        __m512i lo, hi;
        lp_unpack_nibbles512(type, true, _mm512_loadu_si512(codes + 64 * (k0 + k)), &lo, &hi);
        _mm512_store_si512(out + 128 * k, lo);
        _mm512_store_si512(out + 128 * k + 64, hi);
    }
}

typedef struct amx_block {
    const lp_igemm *g;
    uint32_t type;
    const uint8_t *panel;
    const uint8_t *bcodes; /* tile rows (64 bytes per 4 inputs) from column c0 */
    bool signed_codes;     /* W4 (unpacked, signed) or W8 (biased, needs corr) */
    int64_t p, c0, n, b0;
} amx_block;

/* The float half of group gi of a panel (row scales dw) for batch rows
 * b0 + b, b < mb: acc[b] = fma(float(isum), dw * dx, acc[b]) with the same
 * operations as the VNNI kernel; isum is the tile sum, + corr for biased
 * (unsigned) codes. Shared by the prefill blocks and the decode stream. */
AMX INLINE void finish_rows(const lp_qact *a, __m512 dw, int64_t gi, int64_t b0, int mb, bool add_corr,
                            const int32_t sums[16][16], __m512 acc[16]) {
    /* unrolled, so the 16 accumulators stay in registers (a loop indexing
     * acc[b] spills them: measured 1.35x slower prefill) */
#pragma GCC unroll 16
    for (int b = 0; b < mb; b++) {
        int64_t at = (b0 + b) * a->groups + gi;
        __m512i isum = _mm512_load_si512(sums[b]);
        if (add_corr) isum = _mm512_add_epi32(isum, _mm512_set1_epi32(a->corr[at]));
        __m512 dwdx = _mm512_mul_ps(dw, _mm512_set1_ps(a->d[at]));
        acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dwdx, acc[b]);
    }
}

AMX INLINE void finish_group(const amx_block *k, int64_t gi, int mb, const int32_t sums[16][16], __m512 acc[16]) {
    finish_rows(k->g->a, lp_panel_scales512(k->type, &k->g->geom, k->panel, gi), gi, k->b0, mb, !k->signed_codes,
                sums, acc);
}

/* Rows of panel p that exist (the last panel may be short). */
static inline __mmask16 panel_rows_mask(const lp_igemm *g, int64_t p) {
    int64_t left = g->rows - p * LP_PANEL;
    return left >= LP_PANEL ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
}

/* Integer sums of group gi into tile T (a constant), stored to out. */
#define GROUP_SUMS(T, gi, out)                                                                      \
    do {                                                                                            \
        _tile_zero(T);                                                                              \
        for (int s = 0; s < ksteps; s++) {                                                          \
            int64_t col = (gi) * G + (int64_t)s * K;                                                \
            _tile_loadd(2, xq + col, qs);                                                           \
            _tile_loadd(3, k->bcodes + (col - k->c0) / 4 * 64, 64);                                 \
            if (k->signed_codes) _tile_dpbssd(T, 2, 3);                                             \
            else _tile_dpbsud(T, 2, 3);                                                             \
        }                                                                                           \
        _tile_stored(T, out, 64);                                                                   \
    } while (0)

/* Columns [c0, c0+n) of panel p for batch rows [b0, b0+mb).
 * Groups go in pairs, software-pipelined: the tile multiplies of pair j+1
 * (tiles 4/5 or 0/1, alternating) are issued before the float work of
 * pair j, so the two overlap. */
AMX INLINE void block(const amx_block *k, int mb, int K) {
    const lp_igemm *g = k->g;
    const int G = g->geom.group, ksteps = G / K;
    const int64_t qs = g->a->q_stride;
    const int8_t *xq = g->a->q + k->b0 * qs;
    float *y = g->y + k->b0 * g->y_stride + k->p * LP_PANEL;
    __mmask16 rows_mask = panel_rows_mask(g, k->p);
    __m512 acc[16] = {0}; /* rows past mb stay unused */
#pragma GCC unroll 16
    for (int b = 0; b < mb; b++)
        acc[b] = k->c0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(rows_mask, y + b * g->y_stride);
    _Alignas(64) int32_t sums[2][2][16][16];
    const int64_t g0 = k->c0 / G, ng = k->n / G, npairs = (ng + 1) / 2;
#define ISSUE(j)                                                                                    \
    do {                                                                                            \
        int64_t ga = g0 + 2 * (j);                                                                  \
        bool two = 2 * (j) + 1 < ng;                                                                \
        if ((j) & 1) {                                                                              \
            GROUP_SUMS(4, ga, sums[1][0]);                                                          \
            if (two) GROUP_SUMS(5, ga + 1, sums[1][1]);                                             \
        } else {                                                                                    \
            GROUP_SUMS(0, ga, sums[0][0]);                                                          \
            if (two) GROUP_SUMS(1, ga + 1, sums[0][1]);                                             \
        }                                                                                           \
    } while (0)
    ISSUE(0);
    for (int64_t j = 0; j < npairs; j++) {
        if (j + 1 < npairs) ISSUE(j + 1);
        int64_t ga = g0 + 2 * j;
        finish_group(k, ga, mb, sums[j & 1][0], acc);
        if (2 * j + 1 < ng) finish_group(k, ga + 1, mb, sums[j & 1][1], acc);
    }
#undef ISSUE
#pragma GCC unroll 16
    for (int b = 0; b < mb; b++) _mm512_mask_storeu_ps(y + b * g->y_stride, rows_mask, acc[b]);
}

/* Batch rows [bstart, bend) in blocks of mb (the configured tile rows). */
AMX INLINE void run_blocks(const lp_igemm *g, uint32_t type, int64_t bstart, int64_t bend, int mb, int K) {
    const lp_packed_geom *ge = &g->geom;
    const bool w4 = type != LP_W8;
    const int64_t cols = ge->groups * ge->group;
    /* W8 codes are tile rows already: one "chunk" spans the row. */
    const int64_t chunk = w4 ? AMX_CHUNK : cols;
    _Alignas(64) uint8_t buf[AMX_CHUNK * 16];
    for (int64_t p = g->p0; p < g->p1; p++) {
        const uint8_t *panel = g->w + (size_t)p * ge->panel_bytes;
        const uint8_t *codes = panel + ge->codes_offset;
        for (int64_t c0 = 0; c0 < cols; c0 += chunk) {
            int64_t n = cols - c0 < chunk ? cols - c0 : chunk;
            amx_block k = {g, type, panel, codes + c0 * 16, false, p, c0, n, 0};
            if (w4) {
                const uint8_t *next = p + 1 < g->p1 ? codes + ge->panel_bytes : NULL;
                unpack_w4(type, codes, c0 / 8, n / 8, buf, next);
                k.bcodes = buf;
                k.signed_codes = true;
            }
            for (k.b0 = bstart; k.b0 < bend; k.b0 += mb) block(&k, mb, K);
        }
    }
}

/* ---- decode streams: a few rows at group 32 ------------------------------------------- */

/* With a few batch rows (decode streams) every step streams the weights
 * from memory once, so this path is built around the stream. Panels go in
 * pairs that share each activation tile. Group by group, their W4 codes
 * are unpacked (signed, code - 8, so the finish needs no bias correction:
 * 10-15 % less time at 12-16 rows) into a ring of B tiles AHEAD groups early,
 * multiplied into a ring of int32 sums (one tdpbssd, W8: tdpbsud, of K = 32 per panel
 * and group) and finished LAG groups late, so the vector unpack, the tile
 * work and the float finish of different groups overlap; the same group of
 * the pair ahead is prefetched into L2, scales included, so a new pair
 * starts with its data in cache. W8 codes are B tiles as they are. The
 * float finish is the VNNI kernel's, so the bits match every other level.
 * Measured on one 5632 x 2048 W4 matrix from DRAM, one thread, 8 rows:
 * 0.70 ms against 0.50 for the bare stream (unpack and prefetch only) and
 * 0.84 for the VNNI kernel; the tile work and the finish each add about
 * 0.1 ms, ring depths 2-6 change nothing. */
#define RING 4
#define AHEAD 3
#define LAG 2

AMX INLINE void stream_unpack(uint32_t type, const uint8_t *codes, uint8_t *bt) {
    for (int k = 0; k < 4; k++) {
        __m512i lo, hi;
        lp_unpack_nibbles512(type, true, _mm512_loadu_si512(codes + 64 * k), &lo, &hi);
        _mm512_store_si512(bt + 128 * k, lo);
        _mm512_store_si512(bt + 128 * k + 64, hi);
    }
}

/* The scales of the group(s) starting at byte `at` of the next panel's
 * scale stream, into L2 with the codes (and W4C's row ranges with the
 * first group): one prefetch per 64-byte line. */
AMX INLINE void prefetch_scales(const lp_packed_geom *ge, const char *next_panel, int64_t gi) {
    size_t at = ge->scales_offset + (size_t)gi * ge->scale_bytes;
    if (gi == 0 && ge->scales_offset) _mm_prefetch(next_panel, _MM_HINT_T1);
    if (at % 64 < ge->scale_bytes) _mm_prefetch(next_panel + at, _MM_HINT_T1);
}

/* Tiles of the stream: sums 0 and 1 (one per panel of a pair), the
 * activations 2, the weights 3 and 4. */
AMX static void configure_stream(int mb) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 2; t++) {
        cfg.rows[t] = (uint8_t)mb; /* int32 sums */
        cfg.colsb[t] = 64;
    }
    cfg.rows[2] = (uint8_t)mb; /* activations: mb x 32 */
    cfg.colsb[2] = 32;
    cfg.rows[3] = cfg.rows[4] = 8; /* weights: 8 x (16 x 4) */
    cfg.colsb[3] = cfg.colsb[4] = 64;
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg)); /* see configure() */
}

/* Panels p..p+NP-1 (NP = 1 or 2: two panels share each activation tile). */
AMX INLINE void stream_panels(const lp_igemm *g, uint32_t type, int64_t p, int NP, int mb) {
    const lp_packed_geom *ge = &g->geom;
    const bool w4 = type != LP_W8;
    const lp_qact *a = g->a;
    const int64_t groups = ge->groups, qs = a->q_stride;
    const uint8_t *panel[2], *codes[2];
    for (int i = 0; i < NP; i++) {
        panel[i] = g->w + (size_t)(p + i) * ge->panel_bytes;
        codes[i] = panel[i] + ge->codes_offset;
    }
    const size_t cb = ge->code_bytes;
    _Alignas(64) uint8_t bt[RING][2][512];
    _Alignas(64) int32_t sums[RING][2][16][16];
    __m512 acc[2][16];
    for (int i = 0; i < NP; i++)
#pragma GCC unroll 16
        for (int b = 0; b < mb; b++) acc[i][b] = _mm512_setzero_ps();
    if (w4)
        for (int64_t gi = 0; gi < AHEAD && gi < groups; gi++)
            for (int i = 0; i < NP; i++) stream_unpack(type, codes[i] + gi * cb, bt[gi % RING][i]);
    for (int64_t gi = 0; gi < groups + LAG; gi++) {
        if (gi < groups) {
            for (int i = 0; i < NP; i++) {
                /* the same group of the panel NP ahead (into L2), scales
                 * included, so a new panel starts with its data in cache */
                if (p + i + NP < g->prefetch_p1) {
                    const char *next = (const char *)panel[i] + NP * ge->panel_bytes;
                    for (size_t o = 0; o < cb; o += 64) _mm_prefetch(next + ge->codes_offset + gi * cb + o, _MM_HINT_T1);
                    prefetch_scales(ge, next, gi);
                }
                if (w4 && gi + AHEAD < groups)
                    stream_unpack(type, codes[i] + (gi + AHEAD) * cb, bt[(gi + AHEAD) % RING][i]);
            }
            const int8_t *xg = a->q + gi * 32;
            _tile_loadd(2, xg, qs);
            _tile_loadd(3, w4 ? bt[gi % RING][0] : codes[0] + gi * cb, 64);
            _tile_zero(0);
            if (w4) _tile_dpbssd(0, 2, 3);
            else _tile_dpbsud(0, 2, 3);
            _tile_stored(0, sums[gi % RING][0], 64);
            if (NP == 2) {
                _tile_loadd(4, w4 ? bt[gi % RING][1] : codes[1] + gi * cb, 64);
                _tile_zero(1);
                if (w4) _tile_dpbssd(1, 2, 4);
                else _tile_dpbsud(1, 2, 4);
                _tile_stored(1, sums[gi % RING][1], 64);
            }
        }
        int64_t gf = gi - LAG;
        if (gf < 0) continue;
        /* W8 codes are biased (unsigned, as stored): the correction
         * removes the bias; W4 ones were unpacked signed */
        for (int i = 0; i < NP; i++)
            finish_rows(a, lp_panel_scales512(type, ge, panel[i], gf), gf, 0, mb, !w4, sums[gf % RING][i], acc[i]);
    }
    for (int i = 0; i < NP; i++) {
        float *y = g->y + (p + i) * LP_PANEL;
        __mmask16 rows_mask = panel_rows_mask(g, p + i);
#pragma GCC unroll 16
        for (int b = 0; b < mb; b++) _mm512_mask_storeu_ps(y + b * g->y_stride, rows_mask, acc[i][b]);
    }
}

/* ---- decode streams of up to 8 rows: two groups per tile multiply --------------------- */

/* With the activations in pairs of groups (lp_qact.pairs: group 2j in
 * tile rows [0, mb), group 2j+1 in rows [mb, 2mb), each zero in the other
 * group's half of K = 64), one multiply covers two groups of a panel: the
 * B tile is the two groups' codes (16 rows of 4 inputs), and the sums
 * come out as the first and second mb rows of the result. Half the tile
 * operations of stream_panels for the same work; the finish is the same.
 * Per step (a pair of groups): multiplies of pair j, the finish of pair
 * j - LAG, then the unpack of pair j + AHEAD and the prefetch, and the
 * tile stores last, so the stores of the sums do not hold up the loads
 * after them. Measured on one 5632 x 2048 W4 matrix in cache, 8 rows, one
 * thread: 0.48 ms against 0.55-0.57 for stream_panels; from DRAM on 2
 * threads (bench/bench_kernels.c with 8 decode rows) 15 against 14 GB/s. */

/* The sums of pair j are stored at the end of step j and finished LAG
 * steps later. */
_Static_assert(LAG >= 1, "stream_pairs finishes a pair after its tile store");

/* Tiles: sums 0 and 1 (one per panel), paired activations 2, weights 3, 4. */
AMX static void configure_pairs(int mb) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 3; t++) {
        cfg.rows[t] = (uint8_t)(2 * mb);
        cfg.colsb[t] = 64;
    }
    cfg.rows[3] = cfg.rows[4] = 16; /* weights: 16 x (16 x 4) */
    cfg.colsb[3] = cfg.colsb[4] = 64;
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg)); /* see configure() */
}

/* The B tile (16 rows of 64 bytes) of groups 2j and 2j+1 of a panel's
 * codes: W4 codes unpacked into bt; W8 codes are B tiles as they are,
 * except a last group without a partner, copied into bt. */
AMX INLINE const uint8_t *pair_codes(const uint8_t *codes, uint32_t type, int64_t j, int64_t groups, size_t cb,
                                     uint8_t *bt) {
    const bool odd_end = 2 * j + 1 >= groups, w4 = type != LP_W8;
    if (!w4 && !odd_end) return codes + 2 * j * cb;
    if (w4) stream_unpack(type, codes + 2 * j * cb, bt);
    else memcpy(bt, codes + 2 * j * cb, 512);
    /* a last group without a partner: its half of K meets zero
     * activations, but the tile must not read past the panel */
    if (odd_end) memset(bt + 512, 0, 512);
    else stream_unpack(type, codes + (2 * j + 1) * cb, bt + 512);
    return bt;
}

/* The float finish of pair jf of one panel (groups 2jf and, when two, 2jf + 1). */
AMX INLINE void finish_pair(const lp_qact *a, uint32_t type, const lp_packed_geom *ge, const uint8_t *panel, int64_t jf,
                            bool two, int mb, bool add_corr, const int32_t sums[16][16], __m512 acc[16]) {
    finish_rows(a, lp_panel_scales512(type, ge, panel, 2 * jf), 2 * jf, 0, mb, add_corr, sums, acc);
    if (two) finish_rows(a, lp_panel_scales512(type, ge, panel, 2 * jf + 1), 2 * jf + 1, 0, mb, add_corr, &sums[mb], acc);
}

AMX INLINE void stream_pairs(const lp_igemm *g, uint32_t type, int64_t p, int NP, int mb) {
    const lp_packed_geom *ge = &g->geom;
    const bool w4 = type != LP_W8;
    const lp_qact *a = g->a;
    const int64_t groups = ge->groups, npairs = (groups + 1) / 2;
    const size_t cb = ge->code_bytes;
    const uint8_t *panel[2], *codes[2];
    for (int i = 0; i < NP; i++) {
        panel[i] = g->w + (size_t)(p + i) * ge->panel_bytes;
        codes[i] = panel[i] + ge->codes_offset;
    }
    _Alignas(64) uint8_t bt[RING][2][1024];
    const uint8_t *b_tile[RING][2];
    _Alignas(64) int32_t sums[RING][2][16][16];
    /* two arrays, not acc[2][16]: indexed by a panel loop the compiler
     * keeps them in memory (a load and store around every fma) */
    __m512 acc0[16] = {0}, acc1[16] = {0};
    for (int64_t j = 0; j < AHEAD && j < npairs; j++)
        for (int i = 0; i < NP; i++) b_tile[j % RING][i] = pair_codes(codes[i], type, j, groups, cb, bt[j % RING][i]);
    for (int64_t j = 0; j < npairs + LAG; j++) {
        const bool live = j < npairs;
        if (live) {
            _tile_loadd(2, a->pairs + j * 2 * mb * 64, 64);
            _tile_loadd(3, b_tile[j % RING][0], 64);
            _tile_zero(0);
            if (w4) _tile_dpbssd(0, 2, 3);
            else _tile_dpbsud(0, 2, 3);
            if (NP == 2) {
                _tile_loadd(4, b_tile[j % RING][1], 64);
                _tile_zero(1);
                if (w4) _tile_dpbssd(1, 2, 4);
                else _tile_dpbsud(1, 2, 4);
            }
        }
        const int64_t jf = j - LAG;
        if (jf >= 0) {
            /* W8 codes are biased (unsigned): the correction removes it */
            const bool two = 2 * jf + 1 < groups;
            finish_pair(a, type, ge, panel[0], jf, two, mb, !w4, sums[jf % RING][0], acc0);
            if (NP == 2) finish_pair(a, type, ge, panel[1], jf, two, mb, !w4, sums[jf % RING][1], acc1);
        }
        if (!live) continue;
        for (int i = 0; i < NP; i++) {
            /* the same pair of the panel NP ahead (into L2), scales included */
            if (p + i + NP < g->prefetch_p1) {
                const char *next = (const char *)panel[i] + NP * ge->panel_bytes;
                for (size_t o = 0; o < 2 * cb && 2 * j * cb + o < groups * cb; o += 64)
                    _mm_prefetch(next + ge->codes_offset + 2 * j * cb + o, _MM_HINT_T1);
                prefetch_scales(ge, next, 2 * j);
                if (2 * j + 1 < groups) prefetch_scales(ge, next, 2 * j + 1);
            }
            if (j + AHEAD < npairs)
                b_tile[(j + AHEAD) % RING][i] = pair_codes(codes[i], type, j + AHEAD, groups, cb, bt[(j + AHEAD) % RING][i]);
        }
        _tile_stored(0, sums[j % RING][0], 64);
        if (NP == 2) _tile_stored(1, sums[j % RING][1], 64);
    }
    for (int i = 0; i < NP; i++) {
        float *y = g->y + (p + i) * LP_PANEL;
        __mmask16 rows_mask = panel_rows_mask(g, p + i);
#pragma GCC unroll 16
        for (int b = 0; b < mb; b++) _mm512_mask_storeu_ps(y + b * g->y_stride, rows_mask, i ? acc1[b] : acc0[b]);
    }
}

/* Panels [p0, p1) in pairs (a last one alone). */
AMX INLINE void stream_all_pairs(const lp_igemm *g, uint32_t type, int mb) {
    int64_t p = g->p0;
    for (; p + 2 <= g->p1; p += 2) stream_pairs(g, type, p, 2, mb);
    if (p < g->p1) stream_pairs(g, type, p, 1, mb);
}

AMX INLINE void stream_gemm(const lp_igemm *g, uint32_t type) {
    int mb = (int)g->nb;
    if (g->a->pairs && g->a->rows == mb && mb <= LP_AMX_PAIR_MAX) {
        configure_pairs(mb);
        /* the row count as a constant: the finish's row loops unroll and
         * the accumulators stay in registers (8 rows, 2048 x 5632 W4 in
         * cache, 2 threads: 0.24 against 0.26 ms) */
        _Static_assert(LP_AMX_STREAM_MIN == 4 && LP_AMX_PAIR_MAX == 8, "one case per row count");
        switch (mb) {
        case 4: stream_all_pairs(g, type, 4); break;
        case 5: stream_all_pairs(g, type, 5); break;
        case 6: stream_all_pairs(g, type, 6); break;
        case 7: stream_all_pairs(g, type, 7); break;
        case 8: stream_all_pairs(g, type, 8); break;
        default: stream_all_pairs(g, type, mb); break;
        }
        _tile_release();
        return;
    }
    configure_stream(mb);
    int64_t p = g->p0;
    for (; p + 2 <= g->p1; p += 2) stream_panels(g, type, p, 2, mb);
    if (p < g->p1) stream_panels(g, type, p, 1, mb);
    _tile_release();
}

AMX INLINE void gemm(const lp_igemm *g, uint32_t type) {
    if (g->geom.group == 32 && g->nb <= LP_AMX_STREAM_MAX) {
        stream_gemm(g, type);
        return;
    }
    const int K = g->geom.group % 64 == 0 ? 64 : 32;
    const int64_t full = g->nb / 16 * 16;
    if (full > 0) {
        configure(16, K);
        run_blocks(g, type, 0, full, 16, K);
    }
    if (full < g->nb) {
        int mb = (int)(g->nb - full);
        configure(mb, K);
        run_blocks(g, type, full, g->nb, mb, K);
    }
    _tile_release();
}

AMX void lp_w4_gemm_amx(const lp_igemm *g) { gemm(g, LP_W4); }
AMX void lp_w8_gemm_amx(const lp_igemm *g) { gemm(g, LP_W8); }
AMX void lp_w4c_gemm_amx(const lp_igemm *g) { gemm(g, LP_W4C); }

#else
bool lp_amx_available(void) { return false; }
#endif
