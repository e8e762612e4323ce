/* Private to src/kernels: the per-ISA building blocks behind lp_matmul. */
#ifndef LP_KERNELS_INTERNAL_H
#define LP_KERNELS_INTERNAL_H

#include "kernels.h"

#include <stdatomic.h>
#include <string.h>

/* lp_matmul works on tiles of LP_TILE_ROWS weight rows x LP_CHUNK columns,
 * so a dequantized chunk (4 x 1024 floats = 16 KiB) stays in L1 while every
 * batch row streams past it. LP_CHUNK is a multiple of every block size. */
#define LP_TILE_ROWS 4
#define LP_CHUNK 1024

/* One tile: y[b*y_stride + r] (+)= dot(w[r][0..n), x[b*x_stride + 0..n)) for
 * r < nr, b < n_batch. w[nr..3] alias w[nr-1] so kernels may always load
 * four rows; their results are discarded. */
typedef struct lp_tile {
    const void *w[LP_TILE_ROWS]; /* float or uint16_t (f16) rows */
    int nr;
    const float *x;
    int64_t x_stride, n_batch, n;
    float *y;
    int64_t y_stride;
    bool accumulate; /* add to y instead of overwriting it */
    /* NULL, or where the same rows' weights of the tile this thread reads
     * next begin (its next columns, or its next rows): kernels may
     * prefetch them while this tile runs (the AVX-512 one does) */
    const void *next_w[LP_TILE_ROWS];
} lp_tile;

/* lp_dequantize_row with the SIMD copy of the decoder chosen by `level`
 * (identical results, vectorized by the compiler). */
void lp_dequantize_row_fast(int level, uint32_t type, const void *src, float *dst, int64_t n);

/* ---- packed integer weights (intpack.c, intmatmul*.c) ------------------------ */

/* Rows per panel: the unit of the packed layouts (intpack.c). */
#define LP_PANEL 16

/* Geometry of a packed matrix. A panel is [header][scales][codes]: W4/W8
 * have no header and 32 bytes of f16 scales per group; W4C a 64-byte
 * header (16 f32 row bases) and 16 bytes of 8-bit scales per group. */
typedef struct lp_packed_geom {
    int64_t panels, groups;  /* ceil(rows / 16), cols / group */
    int group;               /* elements per scale */
    size_t code_bytes;       /* bytes of codes per panel and group: 8*group (W4, W4C) or 16*group (W8) */
    size_t scales_offset;    /* from the panel start: 0 (W4, W8) or 64 (W4C) */
    size_t scale_bytes;      /* per group: 32 (16 f16) or 16 (W4C) */
    size_t codes_offset;     /* from the panel start */
    size_t panel_bytes;      /* codes_offset + groups * code_bytes */
} lp_packed_geom;

/* false for bad type/shape; group 0 means 32. */
bool lp_packed_geometry(uint32_t type, int64_t rows, int64_t cols, int group, lp_packed_geom *g);

/* ---- W4C: the codebook format ------------------------------------------------- */

/* A W4C code (a nibble) stands for one of these int8 levels times the
 * group's scale: denser near zero, where most weights are, and reaching
 * -127 on one side only (the scale's sign picks the side). */
extern const int8_t lp_w4c_levels[16];

/* The scale a W4C scale byte k stands for in a row whose base is b (a
 * power of two, or 0): a small float, sign in bit 7, then 3 bits of
 * exponent and 4 of mantissa, b x 2^(k>>4 & 7) x (1 + (k & 15)/16), made by
 * adding the bits of b and k rather than by multiplying, so every kernel
 * level gets the same bits from a few integer operations. 16 steps per
 * octave over 8 octaves. */
static inline float lp_w4c_scale(float b, uint8_t k) {
    uint32_t bits;
    memcpy(&bits, &b, sizeof bits);
    bits = (bits + ((uint32_t)(k & 0x7f) << 19)) | ((uint32_t)(k & 0x80) << 24);
    memcpy(&b, &bits, sizeof b);
    return b;
}

/* The scale of group gi of row `lane` of a panel, any packed type. */
static inline float lp_packed_scale(uint32_t type, const lp_packed_geom *g, const uint8_t *panel, int64_t gi,
                                    int lane) {
    const uint8_t *s = panel + g->scales_offset + (size_t)gi * g->scale_bytes;
    if (type == LP_W4C) {
        float b;
        memcpy(&b, panel + 4 * lane, sizeof b);
        return lp_w4c_scale(b, s[lane]);
    }
    return lp_f16_to_f32((uint16_t)(s[2 * lane] | (s[2 * lane + 1] << 8)));
}

/* Activations quantized to int8 per group of `group` elements (the weight's
 * group): row b has codes q[b*q_stride ..], scales d[b*groups + g] (x ~=
 * d*q, q in [-127,127]) and corr[b*groups + g] = -offset * sum(q in group),
 * where offset is the weight code bias (8 for W4, 128 for W8 and W4C): kernels
 * that multiply biased unsigned weight codes start each group's integer
 * sum at corr, which cancels the bias exactly. */
typedef struct lp_qact {
    int8_t *q;
    float *d;
    int32_t *corr;
    int64_t q_stride, groups;
    int64_t rows; /* batch rows */
    /* NULL, or the same codes laid out for the AMX pair stream (group 32,
     * LP_AMX_STREAM_MIN..LP_AMX_PAIR_MAX rows): per pair of groups j a
     * block of 2 x rows rows of 64 bytes; row b holds group 2j of batch
     * row b in bytes 0-31, row rows + b group 2j+1 in bytes 32-63, zeros
     * elsewhere, so one K = 64 tile multiply gives both groups' sums, in
     * separate tile rows (filled by intmatmul.c, read by stream_pairs in
     * intmatmul_amx.c). */
    int8_t *pairs;
    /* NULL, or (batches of LP_FEW_ROWS_MIN..LP_FEW_ROWS_MAX rows at the AVX-512 VNNI and
     * AMX levels) the same codes, scales and corrections group-major:
     * group gi of row b at qg + (gi * rows + b) * group, dg[gi * rows + b],
     * cg[gi * rows + b], so that one pointer per group reaches every row
     * at fixed offsets (filled by intmatmul.c, read by the few-row tiles
     * of intmatmul_avx512.c). */
    int8_t *qg;
    float *dg;
    int32_t *cg;
} lp_qact;
/* The batch rows lp_qact.qg is laid out for: every batch of more than one
 * row. One row runs the VNNI kernel's 4-panel decode tiles, whose four
 * prefetched streams keep the most bytes in flight; from 2 rows on the
 * arithmetic counts too, and the few-row tiles do it in half the time of
 * the 4-panel ones or less (docs/benchmarks.md section 25). */
#define LP_FEW_ROWS_MIN 2
#define LP_FEW_ROWS_MAX 16

/* One integer GEMM job: panels [p0, p1) of a packed matrix against batch
 * rows [0, nb) of a. y[b*y_stride + r] for r = 16*p + lane < rows. */
typedef struct lp_igemm {
    const uint8_t *w;        /* packed data (panel 0) */
    lp_packed_geom geom;
    int64_t rows;
    int64_t p0, p1;
    int64_t prefetch_p1; /* >= p1: the thread's next panels end here (prefetching kernels may read ahead) */
    const lp_qact *a;
    int64_t nb;
    float *y;
    int64_t y_stride;
    /* 0, or how far ahead (bytes) a single-panel decode tile prefetches its
     * stream: a LoRA task's share is one short panel, where the base's
     * matrices are long runs of panels (the AVX-512 kernel; the 256-bit
     * ones prefetch 8 KiB ahead anyway) */
    size_t stream_prefetch;
} lp_igemm;

/* Every kernel computes, per output (row r, batch b), exactly
 *     acc = 0; for each group g: acc = fmaf((float)isum_g, dw_g * dx_g, acc)
 * with isum_g the exact int32 dot product of the group's codes, so every
 * level gives bit-identical floats. */
void lp_w4_gemm_ref(const lp_igemm *g);
void lp_w8_gemm_ref(const lp_igemm *g);
void lp_w4c_gemm_ref(const lp_igemm *g);
#if defined(__x86_64__)
void lp_w4_gemm_avx2(const lp_igemm *g);
void lp_w8_gemm_avx2(const lp_igemm *g);
void lp_w4c_gemm_avx2(const lp_igemm *g);
void lp_w4_gemm_avxvnni(const lp_igemm *g); /* needs AVX-VNNI */
void lp_w8_gemm_avxvnni(const lp_igemm *g);
void lp_w4c_gemm_avxvnni(const lp_igemm *g);
void lp_w4_gemm_vnni(const lp_igemm *g);
void lp_w8_gemm_vnni(const lp_igemm *g);
void lp_w4c_gemm_vnni(const lp_igemm *g);
void lp_w4c_gemm_vnni_vbmi(const lp_igemm *g); /* needs AVX512-VBMI too */
void lp_w4_gemm_amx(const lp_igemm *g);
void lp_w8_gemm_amx(const lp_igemm *g);
void lp_w4c_gemm_amx(const lp_igemm *g);
#endif
/* Quantizes one activation row to int8 per group (see lp_qact): the C
 * reference and an AVX-512 copy with bit-identical results. */
void lp_quantize_act_ref(const float *x, int64_t cols, int group, int offset, int8_t *q, float *d, int32_t *corr);
#if defined(__x86_64__)
void lp_quantize_act_avx512(const float *x, int64_t cols, int group, int offset, int8_t *q, float *d,
                            int32_t *corr);
void lp_quantize_act_avx2(const float *x, int64_t cols, int group, int offset, int8_t *q, float *d, int32_t *corr);
#endif
/* Whether this CPU and OS run AMX-INT8 (asks Linux for the tile state). */
bool lp_amx_available(void);
/* Batches below this many rows take the VNNI kernel at LP_INT_AMX. */
#define LP_AMX_MIN_BATCH 10
/* From LP_AMX_STREAM_MIN up to LP_AMX_STREAM_MAX rows at group 32 (decode
 * streams), the AMX kernel streams the weights group by group rather than
 * unpacking column chunks: measured 1.1x VNNI at 4 rows, 1.24x at 8, 2x
 * at 12-16 (one 5632 x 2048 W4 matrix from DRAM, one thread). */
#define LP_AMX_STREAM_MIN 4
#define LP_AMX_STREAM_MAX 16
/* Up to this many rows (2 rows per batch row fill a 16-row tile), the
 * stream multiplies two groups per tile operation (lp_qact.pairs). */
#define LP_AMX_PAIR_MAX 8

/* The panels of one matmul pass, shared out between threads
 * (intmatmul.c). Each thread owns a contiguous share, [begin, end) packed
 * as begin | end << 32, and takes it front to back in chunks that shrink
 * as it drains (half of what is left, at most `chunk`, whole 4-panel
 * decode tiles; a share's last tile by `tail_unit` panels). A thread done
 * with its share takes the back half of what another has left, so a
 * thread slowed by the OS or its memory channel does not hold the others.
 * Contiguous shares keep each thread's reads one stream that its
 * prefetches can run ahead in. */
typedef struct lp_panel_claims {
    atomic_ullong share[LP_THREADS_MAX];
    int64_t chunk;
    int threads;
    int tail_unit;
} lp_panel_claims;

/* total_panels < 2^32, 1 <= threads <= LP_THREADS_MAX, tail_unit 1 or 4. */
void lp_claims_init(lp_panel_claims *c, int64_t total_panels, int threads, int tail_unit);
/* The next panels [p0, p1) for thread ti, false when none are left
 * anywhere; *own_end: where the share the panels came from ends (the
 * thread may prefetch up to there). */
bool lp_claims_next(lp_panel_claims *c, int ti, int64_t *p0, int64_t *p1, int64_t *own_end);
/* GCC builds the dotprod kernels through a target attribute; clang 14's
 * arm_neon.h only declares the lane forms when the whole file targets
 * dotprod, so with clang they need that flag: on the whole build, or (CMake,
 * LP_NEON_DOT_FILE) on intmatmul_neon.c alone. */
#if defined(__aarch64__) && (!defined(__clang__) || defined(__ARM_FEATURE_DOTPROD) || defined(LP_NEON_DOT_FILE))
#define LP_HAVE_NEON_DOT 1
#endif
#if defined(LP_HAVE_NEON_DOT)
void lp_w4_gemm_neon(const lp_igemm *g);
void lp_w8_gemm_neon(const lp_igemm *g);
void lp_w4c_gemm_neon(const lp_igemm *g);
/* The same with pairs of batch rows through smmla (intmatmul_neon_i8mm.c;
 * run only where getauxval reports i8mm). Clang builds that file for
 * +dotprod+i8mm (CMake), as it does the dotprod one. */
#define LP_HAVE_NEON_I8MM 1
void lp_w4_gemm_neon_i8mm(const lp_igemm *g);
void lp_w8_gemm_neon_i8mm(const lp_igemm *g);
void lp_w4c_gemm_neon_i8mm(const lp_igemm *g);
#endif

/* Dequantizes columns [c0, c0+n) of the 16 rows of panel p into
 * out[lane*out_stride + i] (padding rows give zeros). c0, n multiples of 8. */
void lp_packed_dequant_panel(uint32_t type, const lp_packed_geom *g, const uint8_t *data, int64_t p,
                             int64_t c0, int64_t n, float *out, int64_t out_stride);

void lp_packed_dequant_row(uint32_t type, const lp_packed_geom *g, const uint8_t *data, int64_t row,
                           int64_t c0, int64_t n, float *out);

bool lp_matmul_packed(const lp_kernels *k, lp_threadpool *pool, const lp_weight *W, const float *X,
                      int64_t x_stride, int64_t n_batch, float *Y, int64_t y_stride);
/* lp_matmul_multi for packed weights; false when they do not qualify
 * (types, groups or widths differ, float path, no scratch). */
bool lp_matmul_packed_multi(const lp_kernels *k, lp_threadpool *pool, int n, const lp_weight *const *W,
                            const float *X, int64_t x_stride, int64_t n_batch, float *const *Y,
                            const int64_t *y_stride);
/* lp_matmul_tasks for packed weights; false when they do not qualify
 * (a float weight, float path, or the inputs do not fit the scratch). */
bool lp_matmul_packed_tasks(const lp_kernels *k, lp_threadpool *pool, int n, const lp_matmul_task *t);
void lp_matmul_ref_packed(const lp_weight *W, const float *X, int64_t x_stride, int64_t n_batch, float *Y,
                          int64_t y_stride);

/* Runs an lp_tile (float weights) at a float dispatch level. */
void lp_run_tile_f32(int level, const lp_tile *t);

#if defined(__x86_64__)
float lp_dot_f32_avx2(const float *a, const float *b, int64_t n);
void lp_attn_scores_avx2(const float *q, int64_t q_stride, int nq, const void *kt, bool k_f16, int64_t kt_stride, int nk,
                         int64_t d, float scale, float *s, int64_t s_stride);
void lp_round_f16_avx2(float *x, int64_t n);
void lp_to_f16_avx2(uint16_t *dst, const float *src, int64_t n);
void lp_tile_f32_avx2(const lp_tile *t);
void lp_tile_f16_avx2(const lp_tile *t);
void lp_f16_to_f32_row_avx2(const uint16_t *src, float *dst, int64_t n);
void lp_dequant_q4_0_avx2(const uint8_t *src, float *dst, int64_t blocks);
void lp_dequant_q8_0_avx2(const uint8_t *src, float *dst, int64_t blocks);

float lp_dot_f32_avx512(const float *a, const float *b, int64_t n);
void lp_attn_scores_avx512(const float *q, int64_t q_stride, int nq, const void *kt, bool k_f16, int64_t kt_stride,
                           int nk, int64_t d, float scale, float *s, int64_t s_stride);
void lp_attn_mix_avx512(float *out, int64_t out_stride, int nq, const float *p, int64_t p_stride, const void *v,
                        bool v_f16, int64_t v_stride, int nk, int64_t d);
void lp_axpy_avx512(float *y, float a, const float *x, int64_t n);
void lp_softmax_avx512(float *x, int64_t n);
void lp_silu_mul_avx512(float *gate, const float *up, int64_t n);
void lp_tile_f32_avx512(const lp_tile *t);
void lp_tile_f16_avx512(const lp_tile *t);
void lp_f16_to_f32_row_avx512(const uint16_t *src, float *dst, int64_t n);
#endif

#endif
