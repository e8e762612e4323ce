/* lp_matmul for the packed integer types LP_W4 / LP_W8 / LP_W4C.
 *
 * Integer path (default): two thread-pool passes over pre-reserved scratch.
 *   1. the rows of X are quantized to int8 per group of the weight's group
 *      size (scale amax/127, round to nearest), threads splitting the rows;
 *   2. the output rows (16-row panels) are shared out between threads
 *      (lp_panel_claims: a contiguous share each, stolen from when a
 *      thread falls behind) and each runs the integer GEMM kernel of its
 *      level: exact int32 dot products
 *      per group, scaled in float (see lp_igemm in kernels_internal.h).
 *      At LP_INT_AMX, batches of LP_AMX_MIN_BATCH rows or more take the AMX
 *      tile kernel, and at group 32 so do decode batches from
 *      LP_AMX_STREAM_MIN rows (its streaming path; up to LP_AMX_PAIR_MAX
 *      rows the quantizer also lays the codes out in pairs of groups for
 *      it, see lp_qact.pairs); smaller ones take the AVX-512 VNNI kernel.
 * Batch invariance: every kernel computes each output element with the
 * same operations in the same order (exact integer group sums, then one
 * fma per group in group order), and activation rows are quantized one by
 * one, so a row's result does not depend on the batch size, its position
 * in the batch, the slicing over the scratch, the thread count or even the
 * level.
 * Float path (int8_activations = false, or no scratch): each panel is
 * dequantized chunk by chunk and multiplied by the float tile kernels
 * (W4A16), for accuracy comparisons. */
#include "kernels_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

/* ---- scratch ---------------------------------------------------------------------- */

static int64_t round64(int64_t n) { return (n + 63) & ~(int64_t)63; }

/* Scratch bytes one batch row needs: codes, then a float scale and an int32
 * correction per group. */
static size_t act_row_bytes(int64_t cols, int64_t groups) {
    return (size_t)round64(cols) + 8 * (size_t)groups;
}

/* Bytes of lp_qact.pairs for nb rows of `groups` groups of 32. */
static size_t pairs_bytes(int64_t groups, int64_t nb) { return (size_t)((groups + 1) / 2 * 2 * nb * 64); }

int lp_kernels_reserve(lp_kernels *k, int64_t max_rows, int64_t max_cols, lp_error *err) {
    if (max_rows <= 0 || max_cols <= 0)
        return lp_fail(err, "kernels: bad scratch shape %lld x %lld", (long long)max_rows, (long long)max_cols);
    size_t bytes;
    if (!lp_mul_ok(act_row_bytes(max_cols, max_cols / 32 + 1), (size_t)max_rows, &bytes))
        return lp_fail(err, "kernels: activation scratch size overflows");
    /* room for the AMX pair layout of small batches and the group-major
     * copy of few-row ones (run_int_job) */
    int64_t pair_rows = max_rows < LP_AMX_PAIR_MAX ? max_rows : LP_AMX_PAIR_MAX;
    int64_t few_rows = max_rows < LP_FEW_ROWS_MAX ? max_rows : LP_FEW_ROWS_MAX;
    size_t pairs = pairs_bytes(max_cols / 32 + 1, pair_rows) + 64 +
                   act_row_bytes(max_cols, max_cols / 32 + 1) * (size_t)few_rows + 64;
    if (bytes > SIZE_MAX - pairs) return lp_fail(err, "kernels: activation scratch size overflows");
    bytes += pairs;
    if (bytes <= k->scratch_bytes) return 0;
    void *p = lp_alloc(bytes);
    if (!p) return lp_error_set(err, LP_ERR_NOMEM, "kernels: out of memory for %zu bytes of activation scratch", bytes);
    lp_free(k->scratch);
    k->scratch = p;
    k->scratch_bytes = bytes;
    return 0;
}

void lp_kernels_free(lp_kernels *k) {
    lp_free(k->scratch);
    k->scratch = NULL;
    k->scratch_bytes = 0;
}

const char *lp_int_level_name(int int_level) {
    switch (int_level) {
    case LP_INT_AVX2: return "avx2";
    case LP_INT_AVXVNNI: return "avx-vnni";
    case LP_INT_AVX512VNNI: return "avx512-vnni";
    case LP_INT_AMX: return "amx-int8";
    case LP_INT_NEON_DOT: return "neon-dotprod";
    default: return "reference";
    }
}

/* ---- activation quantization (one C version for every level) --------------------- */

/* Round to nearest even without a libm call, so the loop vectorizes:
 * adding 1.5 * 2^23 leaves the rounded integer in the low mantissa bits
 * (valid for |v| < 2^22; the caller clamps anything else). */
static inline int32_t round_magic(float v) {
    float t = v + 12582912.0f;
    int32_t bits;
    memcpy(&bits, &t, sizeof bits);
    int64_t r = (int64_t)bits - 0x4B400000;
    return (int32_t)(r < -127 ? -127 : r > 127 ? 127 : r);
}

void lp_quantize_act_ref(const float *x, int64_t cols, int group, int offset, int8_t *q, float *d,
                         int32_t *corr) {
    for (int64_t g0 = 0, gi = 0; g0 < cols; g0 += group, gi++) {
        float amax = 0;
        for (int i = 0; i < group; i++) amax = fmaxf(amax, fabsf(x[g0 + i]));
        float id = amax > 0 && isfinite(amax) ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < group; i++) {
            int32_t v = round_magic(x[g0 + i] * id);
            q[g0 + i] = (int8_t)v;
            sum += v;
        }
        d[gi] = id > 0 ? amax / 127.0f : 0.0f;
        corr[gi] = -offset * sum;
    }
}

/* ---- reference kernels -------------------------------------------------------------- */

static void gemm_ref(const lp_igemm *g, uint32_t type) {
    const lp_packed_geom *ge = &g->geom;
    const lp_qact *a = g->a;
    const int G = ge->group;
    for (int64_t p = g->p0; p < g->p1; p++) {
        const uint8_t *panel = g->w + (size_t)p * ge->panel_bytes;
        const uint8_t *codes0 = panel + ge->codes_offset;
        for (int lane = 0; lane < LP_PANEL && p * LP_PANEL + lane < g->rows; lane++) {
            for (int64_t b = 0; b < g->nb; b++) {
                const int8_t *xq = a->q + b * a->q_stride;
                float acc = 0;
                for (int64_t gi = 0; gi < ge->groups; gi++) {
                    const uint8_t *codes = codes0 + (size_t)gi * ge->code_bytes + 4 * lane;
                    const int8_t *xg = xq + gi * G;
                    int32_t isum = 0;
                    if (type == LP_W4) {
                        for (int k = 0; k < G / 8; k++)
                            for (int j = 0; j < 4; j++) {
                                uint8_t byte = codes[64 * k + j];
                                isum += ((byte & 0x0f) - 8) * xg[8 * k + j] + ((byte >> 4) - 8) * xg[8 * k + 4 + j];
                            }
                    } else if (type == LP_W4C) {
                        for (int k = 0; k < G / 8; k++)
                            for (int j = 0; j < 4; j++) {
                                uint8_t byte = codes[64 * k + j];
                                isum += lp_w4c_levels[byte & 0x0f] * xg[8 * k + j] +
                                        lp_w4c_levels[byte >> 4] * xg[8 * k + 4 + j];
                            }
                    } else {
                        for (int k = 0; k < G / 4; k++)
                            for (int j = 0; j < 4; j++) isum += ((int)codes[64 * k + j] - 128) * xg[4 * k + j];
                    }
                    float dw = lp_packed_scale(type, ge, panel, gi, lane);
                    acc = fmaf((float)isum, dw * a->d[b * a->groups + gi], acc);
                }
                g->y[b * g->y_stride + p * LP_PANEL + lane] = acc;
            }
        }
    }
}

void lp_w4_gemm_ref(const lp_igemm *g) { gemm_ref(g, LP_W4); }
void lp_w8_gemm_ref(const lp_igemm *g) { gemm_ref(g, LP_W8); }
void lp_w4c_gemm_ref(const lp_igemm *g) { gemm_ref(g, LP_W4C); }

typedef void (*igemm_fn)(const lp_igemm *g);

/* The kernels of one level, by packed type. */
typedef struct kernel_set {
    igemm_fn w4, w8, w4c;
} kernel_set;

static igemm_fn by_type(kernel_set k, uint32_t type) {
    return type == LP_W4 ? k.w4 : type == LP_W4C ? k.w4c : k.w8;
}

static igemm_fn pick_kernel(const lp_kernels *k, uint32_t type, int group, int64_t nb) {
    static const kernel_set ref = {lp_w4_gemm_ref, lp_w8_gemm_ref, lp_w4c_gemm_ref};
    switch (k->int_level) {
#if defined(__x86_64__)
    case LP_INT_AMX:
        if (nb >= LP_AMX_MIN_BATCH || (group == 32 && nb >= LP_AMX_STREAM_MIN)) {
            static const kernel_set amx = {lp_w4_gemm_amx, lp_w8_gemm_amx, lp_w4c_gemm_amx};
            return by_type(amx, type);
        }
        /* smaller batches take the VNNI kernels */
        /* fall through */
    case LP_INT_AVX512VNNI: {
        static const kernel_set vnni = {lp_w4_gemm_vnni, lp_w8_gemm_vnni, lp_w4c_gemm_vnni};
        static const kernel_set vbmi = {lp_w4_gemm_vnni, lp_w8_gemm_vnni, lp_w4c_gemm_vnni_vbmi};
        return by_type(k->vbmi ? vbmi : vnni, type);
    }
    case LP_INT_AVXVNNI: {
        static const kernel_set avxvnni = {lp_w4_gemm_avxvnni, lp_w8_gemm_avxvnni, lp_w4c_gemm_avxvnni};
        return by_type(avxvnni, type);
    }
    case LP_INT_AVX2: {
        static const kernel_set avx2 = {lp_w4_gemm_avx2, lp_w8_gemm_avx2, lp_w4c_gemm_avx2};
        return by_type(avx2, type);
    }
#endif
#if defined(LP_HAVE_NEON_DOT)
    case LP_INT_NEON_DOT: {
        static const kernel_set neon = {lp_w4_gemm_neon, lp_w8_gemm_neon, lp_w4c_gemm_neon};
#if defined(LP_HAVE_NEON_I8MM)
        static const kernel_set i8mm = {lp_w4_gemm_neon_i8mm, lp_w8_gemm_neon_i8mm, lp_w4c_gemm_neon_i8mm};
        if (k->i8mm && nb >= 2) return by_type(i8mm, type);
#endif
        return by_type(neon, type);
    }
#endif
    default: return by_type(ref, type);
    }
}

typedef void (*quantize_fn)(const float *x, int64_t cols, int group, int offset, int8_t *q, float *d,
                            int32_t *corr);

/* The activation quantizer of a level (all bit-identical to the reference). */
static quantize_fn pick_quantizer(int int_level) {
#if defined(__x86_64__)
    if (int_level == LP_INT_AVX512VNNI || int_level == LP_INT_AMX) return lp_quantize_act_avx512;
    if (int_level == LP_INT_AVX2 || int_level == LP_INT_AVXVNNI) return lp_quantize_act_avx2;
#endif
    (void)int_level;
    return lp_quantize_act_ref;
}

/* Points a at nb rows of quantized activations in the scratch at s: the
 * codes (rows of round64(cols) bytes), then the scales, then the
 * corrections (act_row_bytes(cols, groups) * nb bytes in all). */
static void place_qact(lp_qact *a, uint8_t *s, int64_t cols, int64_t groups, int64_t nb) {
    a->q_stride = round64(cols);
    a->groups = groups;
    a->rows = nb;
    a->q = (int8_t *)s;
    a->d = (float *)(s + (size_t)nb * (size_t)a->q_stride);
    a->corr = (int32_t *)(a->d + nb * groups);
    a->pairs = NULL;
    a->qg = NULL;
    a->dg = NULL;
    a->cg = NULL;
}

/* Copies batch row b of a into the group-major layout (lp_qact.qg). */
static void group_row(const lp_qact *a, int group, int64_t b) {
    const int8_t *x = a->q + b * a->q_stride;
    for (int64_t gi = 0; gi < a->groups; gi++) {
        int8_t *dst = a->qg + (gi * a->rows + b) * group;
        if (group == 32) memcpy(dst, x + gi * 32, 32); /* a fixed size: two moves, no call */
        else memcpy(dst, x + gi * group, (size_t)group);
        a->dg[gi * a->rows + b] = a->d[b * a->groups + gi];
        a->cg[gi * a->rows + b] = a->corr[b * a->groups + gi];
    }
}

/* Copies batch row b of a->q into its two rows of every block of a->pairs. */
static void pair_row(const lp_qact *a, int64_t b) {
    const int8_t *x = a->q + b * a->q_stride;
    for (int64_t j = 0; j < (a->groups + 1) / 2; j++) {
        int8_t *block = a->pairs + j * 2 * a->rows * 64;
        int8_t *first = block + b * 64, *second = block + (a->rows + b) * 64;
        memset(first, 0, 64);
        memset(second, 0, 64);
        memcpy(first, x + 64 * j, 32);
        if (2 * j + 1 < a->groups) memcpy(second + 32, x + 64 * j + 32, 32);
    }
}

/* Quantizes rows [b0, b1) of X for weights of `type` into a. */
static void quantize_rows(int int_level, uint32_t type, const float *X, int64_t x_stride, int64_t cols, int group,
                          const lp_qact *a, int64_t b0, int64_t b1) {
    quantize_fn quantize = pick_quantizer(int_level);
    int offset = type == LP_W4 ? 8 : 128; /* the weight codes' bias (W4C: the VNNI kernel's levels + 128) */
    for (int64_t b = b0; b < b1; b++) {
        quantize(X + b * x_stride, cols, group, offset, a->q + b * a->q_stride, a->d + b * a->groups,
                 a->corr + b * a->groups);
        if (a->pairs) pair_row(a, b);
        if (a->qg) group_row(a, group, b);
    }
}

/* ---- the threaded driver ------------------------------------------------------------ */

/* One integer matmul pass: n weights (q, k, v, or gate, up) applied to the
 * same input rows, quantized once; their panels are concatenated and split
 * evenly between the threads. */
typedef struct int_job {
    const lp_kernels *k;
    int n;
    const lp_weight *W[LP_MATMUL_MULTI_MAX];
    lp_packed_geom geom[LP_MATMUL_MULTI_MAX];
    float *Y[LP_MATMUL_MULTI_MAX];
    int64_t y_stride[LP_MATMUL_MULTI_MAX];
    int64_t total_panels;
    const float *X;
    int64_t x_stride, nb;
    lp_qact a;
    lp_panel_claims claims;
} int_job;

static void quant_worker(void *ctx, int ti, int nt) {
    const int_job *job = ctx;
    int64_t b0, b1;
    lp_split_range(job->nb, ti, nt, 1, &b0, &b1);
    quantize_rows(job->k->int_level, job->W[0]->type, job->X, job->x_stride, job->W[0]->cols, job->geom[0].group,
                  &job->a, b0, b1);
}

static unsigned long long pack_share(int64_t begin, int64_t end) {
    return (unsigned long long)begin | (unsigned long long)end << 32;
}

void lp_claims_init(lp_panel_claims *c, int64_t total_panels, int threads, int tail_unit) {
    c->threads = threads;
    c->tail_unit = tail_unit == 1 ? 1 : 4;
    /* about 8 chunks per thread */
    c->chunk = (total_panels / (8 * threads) + 3) & ~(int64_t)3;
    if (c->chunk < 4) c->chunk = 4;
    for (int t = 0; t < threads; t++) {
        int64_t b, e;
        lp_split_range(total_panels, t, threads, 4, &b, &e);
        atomic_store_explicit(&c->share[t], pack_share(b, e), memory_order_relaxed);
    }
}

/* With every thread taking the next chunk of one shared counter instead,
 * 8 decode streams over a 2048 x 5632 W4 matrix (AMX, 2 threads, from
 * DRAM) ran at 18.6-19.3 GB/s against 22.2-22.7 (docs/benchmarks.md §4). */
/* What an owner takes from the front of its share of `left` panels: half
 * of them in whole tiles, at most `chunk`; the last tile by tail_unit. */
static int64_t claim_size(const lp_panel_claims *c, int64_t left) {
    if (left <= 4) return c->tail_unit < left ? c->tail_unit : left;
    int64_t n = (left / 2 + 3) & ~(int64_t)3;
    if (n > c->chunk) n = c->chunk;
    return n < left ? n : left;
}

/* What a thief leaves of another share of `left` panels (it takes the
 * rest, from the back): half in whole tiles; of a last tile, half by
 * single panels or nothing. */
static int64_t steal_keep(const lp_panel_claims *c, int64_t left) {
    if (left <= 4) return c->tail_unit == 1 ? left / 2 : 0;
    int64_t keep = (left / 2 + 3) & ~(int64_t)3;
    return keep < left ? keep : 0;
}

bool lp_claims_next(lp_panel_claims *c, int ti, int64_t *p0, int64_t *p1, int64_t *own_end) {
    atomic_ullong *own = &c->share[ti];
    unsigned long long v = atomic_load_explicit(own, memory_order_relaxed);
    for (;;) {
        int64_t b = (int64_t)(v & 0xffffffffu), e = (int64_t)(v >> 32);
        if (b >= e) break;
        int64_t n = claim_size(c, e - b);
        if (atomic_compare_exchange_weak_explicit(own, &v, pack_share(b + n, e), memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *p0 = b;
            *p1 = b + n;
            *own_end = e;
            return true;
        }
    }
    /* the back half (whole 4-panel tiles) of another share, or of a last
     * tile (all of it unless claimed by single panels) */
    for (int k = 1; k < c->threads; k++) {
        atomic_ullong *other = &c->share[(ti + k) % c->threads];
        v = atomic_load_explicit(other, memory_order_relaxed);
        for (;;) {
            int64_t b = (int64_t)(v & 0xffffffffu), e = (int64_t)(v >> 32);
            if (b >= e) break;
            int64_t keep = steal_keep(c, e - b);
            if (atomic_compare_exchange_weak_explicit(other, &v, pack_share(b, b + keep), memory_order_relaxed,
                                                      memory_order_relaxed)) {
                *p0 = b + keep;
                *p1 = e;
                *own_end = e;
                return true;
            }
        }
    }
    return false;
}

static void gemm_worker(void *ctx, int ti, int nt) {
    (void)nt;
    int_job *job = ctx;
    igemm_fn kernel = pick_kernel(job->k, job->W[0]->type, job->geom[0].group, job->nb);
    int64_t p0, p1, own_end;
    while (lp_claims_next(&job->claims, ti, &p0, &p1, &own_end)) {
        int64_t base = 0;
        for (int i = 0; i < job->n && p0 < p1; base += job->geom[i].panels, i++) {
            int64_t lo = p0 - base, hi = p1 - base;
            if (lo < 0) lo = 0;
            if (hi > job->geom[i].panels) hi = job->geom[i].panels;
            if (lo >= hi) continue;
            int64_t pf = own_end - base < job->geom[i].panels ? own_end - base : job->geom[i].panels;
            lp_igemm g = {job->W[i]->data, job->geom[i], job->W[i]->rows, lo, hi, pf, &job->a, job->nb, job->Y[i],
                          job->y_stride[i], 0};
            kernel(&g);
        }
    }
}

/* Float path: 16 dequantized rows x FLOAT_CHUNK columns per step (one
 * weight: job->W[0]). */
#define FLOAT_CHUNK 256

static void float_worker(void *ctx, int ti, int nt) {
    const int_job *job = ctx;
    const lp_packed_geom *ge = &job->geom[0];
    const lp_weight *W = job->W[0];
    int64_t p0, p1;
    lp_split_range(ge->panels, ti, nt, 1, &p0, &p1);
    _Alignas(64) float buf[LP_PANEL][FLOAT_CHUNK];
    const int64_t cols = W->cols;
    for (int64_t p = p0; p < p1; p++) {
        for (int64_t c0 = 0; c0 < cols; c0 += FLOAT_CHUNK) {
            int64_t n = cols - c0 < FLOAT_CHUNK ? cols - c0 : FLOAT_CHUNK;
            lp_packed_dequant_panel(W->type, ge, W->data, p, c0, n, &buf[0][0], FLOAT_CHUNK);
            for (int t = 0; t < LP_PANEL / LP_TILE_ROWS; t++) {
                int64_t r = p * LP_PANEL + t * LP_TILE_ROWS;
                if (r >= W->rows) break;
                lp_tile tile = {
                    .nr = (int)(W->rows - r < LP_TILE_ROWS ? W->rows - r : LP_TILE_ROWS),
                    .x = job->X + c0,
                    .x_stride = job->x_stride,
                    .n_batch = job->nb,
                    .n = n,
                    .y = job->Y[0] + r,
                    .y_stride = job->y_stride[0],
                    .accumulate = c0 > 0,
                };
                for (int i = 0; i < LP_TILE_ROWS; i++) tile.w[i] = buf[t * LP_TILE_ROWS + (i < tile.nr ? i : tile.nr - 1)];
                lp_run_tile_f32(job->k->level, &tile);
            }
        }
    }
}

/* A few rows at group 32 on AMX: the codes also go in pairs of groups
 * (lp_qact.pairs), after the rest in the scratch. */
static void place_pairs(const lp_kernels *k, int_job *job) {
    lp_qact *a = &job->a;
    if (k->int_level != LP_INT_AMX || job->geom[0].group != 32 || job->nb < LP_AMX_STREAM_MIN ||
        job->nb > LP_AMX_PAIR_MAX)
        return;
    size_t used = (size_t)round64((int64_t)(act_row_bytes(job->W[0]->cols, a->groups) * (size_t)job->nb));
    if (used + pairs_bytes(a->groups, job->nb) <= k->scratch_bytes) a->pairs = (int8_t *)k->scratch + used;
}

/* LP_FEW_ROWS_MIN..LP_FEW_ROWS_MAX rows at the AVX-512 levels: the group-major copy
 * (lp_qact.qg) after the rest in the scratch. */
static void place_grouped(const lp_kernels *k, int_job *job) {
    lp_qact *a = &job->a;
    if ((k->int_level != LP_INT_AVX512VNNI && k->int_level != LP_INT_AMX) || job->nb < LP_FEW_ROWS_MIN ||
        job->nb > LP_FEW_ROWS_MAX)
        return;
    /* batches the AMX kernels take (they differ from 1-row's VNNI one) need no copy */
    uint32_t type = job->W[0]->type;
    int group = job->geom[0].group;
    if (k->int_level == LP_INT_AMX && pick_kernel(k, type, group, job->nb) != pick_kernel(k, type, group, 1)) return;
    size_t row = act_row_bytes(job->W[0]->cols, a->groups);
    size_t used = (size_t)round64((int64_t)(row * (size_t)job->nb));
    if (a->pairs) used += (size_t)round64((int64_t)pairs_bytes(a->groups, job->nb));
    size_t codes = (size_t)round64(job->W[0]->cols * job->nb), rest = 8 * (size_t)(a->groups * job->nb);
    if (used + codes + rest > k->scratch_bytes) return;
    a->qg = (int8_t *)k->scratch + used;
    a->dg = (float *)(a->qg + codes);
    a->cg = (int32_t *)(a->dg + a->groups * job->nb);
}

/* The integer path for job->n weights sharing one type, group and column
 * count: the batch in slices that fit the scratch, each slice quantized
 * once, then one GEMM pass over every weight's panels. */
static void run_int_job(int_job *job, lp_threadpool *pool, int64_t slice, int64_t n_batch, double work) {
    const lp_kernels *k = job->k;
    /* Small jobs run on the calling thread: waking the pool costs more. */
    lp_threadpool *gemm_pool = job->total_panels <= 1 || work < 65536.0 ? NULL : pool;
    const float *X = job->X;
    float *Y[LP_MATMUL_MULTI_MAX];
    memcpy(Y, job->Y, sizeof Y);
    for (int64_t b0 = 0; b0 < n_batch; b0 += slice) {
        job->nb = n_batch - b0 < slice ? n_batch - b0 : slice;
        job->X = X + b0 * job->x_stride;
        for (int i = 0; i < job->n; i++) job->Y[i] = Y[i] + b0 * job->y_stride[i];
        place_qact(&job->a, k->scratch, job->W[0]->cols, job->geom[0].groups, job->nb);
        place_pairs(k, job);
        place_grouped(k, job);
        /* Quantizing one or two rows is quicker than a pool round trip. */
        lp_threadpool_run(job->nb >= 4 ? gemm_pool : NULL, quant_worker, job);
        /* Decode rows finish each pass by single panels: whoever is done
         * first waits for the other's last claim, and a 4-panel tile of a
         * 5632-column matrix is 200 KiB, 13 us at a thread's share of the
         * bandwidth (1-row decode, 2 threads: the threads' finishing times
         * 2.9-3.2 -> 1.6-2.2 us apart on average). Larger batches keep
         * whole tiles, which their kernels need to be fast. */
        lp_claims_init(&job->claims, job->total_panels, lp_threadpool_size(gemm_pool), job->nb <= 3 ? 1 : 4);
        lp_threadpool_run(gemm_pool, gemm_worker, job);
    }
}

/* Batch rows per slice the scratch holds for this geometry (0: none). */
static int64_t scratch_slice(const lp_kernels *k, int64_t cols, const lp_packed_geom *g) {
    size_t per_row = act_row_bytes(cols, g->groups);
    return k->scratch ? (int64_t)(k->scratch_bytes / per_row) : 0;
}

/* Called by lp_matmul for LP_W4/LP_W8. Returns false for a malformed
 * weight (the caller zeroes Y). */
bool lp_matmul_packed(const lp_kernels *k, lp_threadpool *pool, const lp_weight *W, const float *X,
                      int64_t x_stride, int64_t n_batch, float *Y, int64_t y_stride) {
    int_job job = {.k = k, .n = 1, .W = {W}, .Y = {Y}, .y_stride = {y_stride}, .X = X, .x_stride = x_stride};
    if (!lp_packed_geometry(W->type, W->rows, W->cols, W->group, &job.geom[0])) return false;
    job.total_panels = job.geom[0].panels;
    if (job.total_panels > (int64_t)UINT32_MAX) return false; /* the claims pack panel numbers in 32 bits */
    double work = (double)W->rows * (double)W->cols * (double)n_batch;
    int64_t slice = scratch_slice(k, W->cols, &job.geom[0]);
    if (!k->int8_activations || slice == 0) {
        job.nb = n_batch;
        bool small = W->rows <= LP_PANEL || work < 65536.0;
        lp_threadpool_run(small ? NULL : pool, float_worker, &job);
        return true;
    }
    run_int_job(&job, pool, slice, n_batch, work);
    return true;
}

bool lp_matmul_packed_multi(const lp_kernels *k, lp_threadpool *pool, int n, const lp_weight *const *W,
                            const float *X, int64_t x_stride, int64_t n_batch, float *const *Y,
                            const int64_t *y_stride) {
    if (n < 1 || n > LP_MATMUL_MULTI_MAX || !k->int8_activations) return false;
    int_job job = {.k = k, .n = n, .X = X, .x_stride = x_stride};
    double work = 0;
    for (int i = 0; i < n; i++) {
        const lp_weight *w = W[i];
        if (w->type != W[0]->type || w->cols != W[0]->cols || (w->group ? w->group : 32) != (W[0]->group ? W[0]->group : 32))
            return false;
        if (w->rows <= 0 || !lp_packed_geometry(w->type, w->rows, w->cols, w->group, &job.geom[i])) return false;
        job.W[i] = w;
        job.Y[i] = Y[i];
        job.y_stride[i] = y_stride[i];
        job.total_panels += job.geom[i].panels;
        if (job.total_panels > (int64_t)UINT32_MAX) return false;
        work += (double)w->rows * (double)w->cols * (double)n_batch;
    }
    int64_t slice = scratch_slice(k, W[0]->cols, &job.geom[0]);
    if (slice == 0) return false;
    run_int_job(&job, pool, slice, n_batch, work);
    return true;
}

/* ---- independent tasks in one pass (the segmented LoRA matmul) ---------------------- */

typedef struct tasks_job {
    const lp_kernels *k;
    int n;
    const lp_matmul_task *t;
    lp_packed_geom geom[LP_MATMUL_TASKS_MAX];
    lp_qact a[LP_MATMUL_TASKS_MAX];
    int quantized_by[LP_MATMUL_TASKS_MAX]; /* the task whose codes this one reuses (itself if none) */
    int64_t first_row[LP_MATMUL_TASKS_MAX + 1]; /* prefix sums of n_batch over the tasks */
} tasks_job;

static void tasks_quant_worker(void *ctx, int ti, int nt) {
    const tasks_job *job = ctx;
    int64_t r0, r1;
    lp_split_range(job->first_row[job->n], ti, nt, 1, &r0, &r1);
    for (int i = 0; i < job->n && r0 < r1; i++) {
        int64_t lo = r0 > job->first_row[i] ? r0 : job->first_row[i];
        int64_t hi = r1 < job->first_row[i + 1] ? r1 : job->first_row[i + 1];
        if (job->quantized_by[i] != i || lo >= hi) continue;
        const lp_matmul_task *t = &job->t[i];
        quantize_rows(job->k->int_level, t->W->type, t->X, t->x_stride, t->W->cols, job->geom[i].group, &job->a[i],
                      lo - job->first_row[i], hi - job->first_row[i]);
    }
}

/* The first bytes of this thread's share of task i (its first panel's
 * scales and codes), fetched while the task before it runs: LoRA tasks
 * are short streams (tens of KiB), each of which would otherwise start
 * with a full memory latency before the hardware prefetchers catch on.
 * 8 one-row adapters per step: shrink 5.5 -> 5.0-5.4 ms, expand 4.5 ->
 * 4.1-4.4 ms. */
static void prefetch_task_start(const tasks_job *job, int i, int ti, int nt) {
    if (i >= job->n) return;
    const lp_packed_geom *ge = &job->geom[i];
    int64_t p0, p1;
    lp_split_range(ge->panels, ti, nt, 1, &p0, &p1);
    if (p0 >= p1) return;
    const char *panel = (const char *)job->t[i].W->data + (size_t)p0 * ge->panel_bytes;
    const size_t scales = ge->codes_offset, ahead = 1024;
    for (size_t o = 0; o < scales && o < ahead; o += 64) __builtin_prefetch(panel + o, 0, 3);
    for (size_t o = 0; o < ahead && scales + o < ge->panel_bytes; o += 64) __builtin_prefetch(panel + scales + o, 0, 3);
}

/* A task's share is often one panel (a rank-32 A matrix is two, one per
 * thread): fetched this far ahead it streams nearer the read bandwidth
 * than at the base's distance (docs/benchmarks.md §9). */
#define TASK_PREFETCH_BYTES 8192

/* Every thread takes its share of every task's panels: tasks differ in
 * rows and batch, so splitting each one keeps the threads even. */
static void tasks_gemm_worker(void *ctx, int ti, int nt) {
    const tasks_job *job = ctx;
    prefetch_task_start(job, 0, ti, nt);
    for (int i = 0; i < job->n; i++) {
        const lp_matmul_task *t = &job->t[i];
        int64_t p0, p1;
        prefetch_task_start(job, i + 1, ti, nt);
        lp_split_range(job->geom[i].panels, ti, nt, 1, &p0, &p1);
        if (p0 >= p1) continue;
        lp_igemm g = {t->W->data, job->geom[i], t->W->rows, p0, p1, p1, &job->a[job->quantized_by[i]], t->n_batch, t->Y,
                      t->y_stride, TASK_PREFETCH_BYTES};
        pick_kernel(job->k, t->W->type, job->geom[i].group, t->n_batch)(&g);
    }
}

static bool same_input(const lp_matmul_task *a, const lp_matmul_task *b, const lp_packed_geom *ga,
                       const lp_packed_geom *gb) {
    return a->X == b->X && a->x_stride == b->x_stride && a->n_batch == b->n_batch && a->W->cols == b->W->cols &&
           ga->group == gb->group && (a->W->type == LP_W4) == (b->W->type == LP_W4);
}

bool lp_matmul_packed_tasks(const lp_kernels *k, lp_threadpool *pool, int n, const lp_matmul_task *t) {
    if (n < 1 || n > LP_MATMUL_TASKS_MAX || !k->int8_activations || !k->scratch) return false;
    tasks_job job = {.k = k, .n = n, .t = t};
    uint8_t *s = k->scratch, *end = s + k->scratch_bytes;
    double work = 0;
    for (int i = 0; i < n; i++) {
        const lp_weight *w = t[i].W;
        if (!lp_dtype_is_packed(w->type) || w->rows <= 0 || t[i].n_batch <= 0 ||
            !lp_packed_geometry(w->type, w->rows, w->cols, w->group, &job.geom[i]))
            return false;
        job.first_row[i + 1] = job.first_row[i] + t[i].n_batch;
        work += (double)w->rows * (double)w->cols * (double)t[i].n_batch;
        job.quantized_by[i] = i;
        for (int j = 0; j < i; j++)
            if (job.quantized_by[j] == j && same_input(&t[i], &t[j], &job.geom[i], &job.geom[j])) {
                job.quantized_by[i] = j;
                break;
            }
        if (job.quantized_by[i] != i) continue;
        /* this task's codes, scales and corrections in the scratch */
        /* each region 64-byte aligned, as the kernels' loads of codes expect */
        size_t bytes = (size_t)round64((int64_t)(act_row_bytes(w->cols, job.geom[i].groups) * (size_t)t[i].n_batch));
        if (bytes > (size_t)(end - s)) return false;
        place_qact(&job.a[i], s, w->cols, job.geom[i].groups, t[i].n_batch);
        s += bytes;
    }
    /* Small passes run on the calling thread: waking the pool costs more. */
    lp_threadpool *p = work < 65536.0 ? NULL : pool;
    lp_threadpool_run(job.first_row[n] >= 4 ? p : NULL, tasks_quant_worker, &job);
    lp_threadpool_run(p, tasks_gemm_worker, &job);
    return true;
}

void lp_matmul_ref_packed(const lp_weight *W, const float *X, int64_t x_stride, int64_t n_batch, float *Y,
                          int64_t y_stride) {
    lp_packed_geom g;
    bool ok = lp_packed_geometry(W->type, W->rows, W->cols, W->group, &g);
    float buf[LP_CHUNK];
    for (int64_t r = 0; r < W->rows; r++)
        for (int64_t b = 0; b < n_batch; b++) {
            double sum = 0;
            for (int64_t c0 = 0; ok && c0 < W->cols; c0 += LP_CHUNK) {
                int64_t n = W->cols - c0 < LP_CHUNK ? W->cols - c0 : LP_CHUNK;
                lp_packed_dequant_row(W->type, &g, W->data, r, c0, n, buf);
                for (int64_t i = 0; i < n; i++) sum += (double)buf[i] * (double)X[b * x_stride + c0 + i];
            }
            Y[b * y_stride + r] = (float)sum;
        }
}
