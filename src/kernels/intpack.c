/* Packed integer weights: LP_W4, LP_W8 and LP_W4C.
 *
 * Both are symmetric: value = q * d with one f16 scale d per `group`
 * consecutive elements of a row (W4: q in [-8, 7], group 32/64/128;
 * W8: q in [-128, 127], group a multiple of 32 dividing cols, group = cols
 * for per-row scales).
 *
 * Layout (all little-endian). Rows are packed in PANELS of 16; the last
 * panel is padded with zero rows (scale 0, q = 0). With G = group and
 * NG = cols / G, a panel is
 *
 *     scales: NG blocks of 16 f16 (32 bytes): block g, entry l = scale of
 *             group g of row 16p + l
 *     codes:  NG blocks of C bytes (C = 8G for W4, 16G for W8), block g
 *             made of 64-byte chunks, each holding 16 rows x 4 bytes:
 *             byte 4l + j of a chunk belongs to row 16p + l.
 *       W4 chunk k (G/8 per group): low nibble of byte 4l+j = q + 8 of
 *             element gG + 8k + j, high nibble = q + 8 of element
 *             gG + 8k + 4 + j  (j < 4).
 *       W8 chunk k (G/4 per group): byte 4l+j = q + 128 of element
 *             gG + 4k + j.
 *
 * so panel bytes = NG * (32 + C) and the matrix is ceil(rows/16) panels
 * back to back. Why: a 64-byte chunk is exactly one zmm whose 16 dword
 * lanes are 16 output rows and whose 4 bytes per lane are 4 consecutive
 * inputs, the operand shape of vpdpbusd (and of NEON sdot on 4 rows x 4
 * inputs per q register); codes are stored biased (unsigned) because
 * vpdpbusd/maddubs want unsigned x signed, and the bias is cancelled
 * exactly per group from the activation side (see lp_qact). A decode
 * matmul reads each thread's panels front to back: one linear stream. */
#include "kernels_internal.h"

#include <math.h>
#include <string.h>

static inline void write_f16(uint8_t *p, uint16_t h) {
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

/* roundf(v) (halves away from zero) clamped to [lo, hi], without the libm
 * call the baseline x86-64 build makes for roundf (it ran 15 % of a K-quant
 * GGUF's load): with lo and hi integers, v below lo (or NaN) or above hi
 * clamps as its rounding would, and inside the range truncating v plus the
 * float just below 1/2 rounds as roundf does (GCC's own inline expansion).
 * Equal to the roundf form for all 2^32 floats, checked exhaustively for
 * [-127, 127] and [-8, 7]. */
static inline int clamp_round(float v, int lo, int hi) {
    float c = v >= (float)lo ? v : (float)lo; /* NaN -> lo */
    c = c > (float)hi ? (float)hi : c;
    return (int)(c + copysignf(0.49999997f, c));
}

/* fmaxf(m, |v|) for m not NaN, inline: a NaN v leaves m, as fmaxf does. */
static inline float max_abs(float m, float v) {
    float a = fabsf(v);
    return a > m ? a : m;
}

/* The largest |x[i]| (NaNs ignored), in 8 independent chains: one chain
 * waits on each max in turn. */
static float group_amax(const float *x, int n) {
    float m[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) m[k] = max_abs(m[k], x[i + k]);
    for (; i < n; i++) m[0] = max_abs(m[0], x[i]);
    float amax = 0;
    for (int k = 0; k < 8; k++) amax = max_abs(amax, m[k]);
    return amax;
}

const int8_t lp_w4c_levels[16] = {-127, -100, -78, -60, -45, -32, -20, -10, 0, 10, 20, 32, 45, 60, 78, 100};

bool lp_packed_geometry(uint32_t type, int64_t rows, int64_t cols, int group, lp_packed_geom *g) {
    if (group == 0) group = 32;
    if (rows < 0 || cols <= 0 || group <= 0 || cols % group != 0) return false;
    size_t code_bytes;
    if (type == LP_W4 || type == LP_W4C) {
        if (group != 32 && group != 64 && group != 128) return false;
        code_bytes = 8 * (size_t)group;
    } else if (type == LP_W8) {
        if (group % 32 != 0) return false;
        code_bytes = 16 * (size_t)group;
    } else {
        return false;
    }
    g->panels = (rows + LP_PANEL - 1) / LP_PANEL;
    g->groups = cols / group;
    g->group = group;
    g->code_bytes = code_bytes;
    size_t groups = (size_t)g->groups, scales, codes;
    if (type == LP_W4C) {
        g->scales_offset = 64;
        g->scale_bytes = 16;
        if (!lp_mul_ok(16, groups, &scales)) return false;
    } else {
        g->scales_offset = 0;
        g->scale_bytes = 32;
        if (!lp_mul_ok(32, groups, &scales)) return false;
    }
    g->codes_offset = g->scales_offset + scales;
    if (!lp_mul_ok(code_bytes, groups, &codes) || codes > SIZE_MAX - g->codes_offset) return false;
    g->panel_bytes = g->codes_offset + codes;
    size_t total;
    return lp_mul_ok(g->panel_bytes, (size_t)g->panels, &total);
}

size_t lp_pack_bytes(uint32_t type, int64_t rows, int64_t cols, int group) {
    lp_packed_geom g;
    if (!lp_packed_geometry(type, rows, cols, group, &g)) return 0;
    return g.panel_bytes * (size_t)g.panels;
}

lp_weight lp_packed_weight(uint32_t type, int group, int64_t rows, int64_t cols, const void *data) {
    lp_weight w = {type, rows, cols, 0, data, group ? group : 32};
    if (rows > 0) w.row_bytes = lp_pack_bytes(type, rows, cols, group) / (size_t)rows;
    return w;
}

/* ---- reading single codes --------------------------------------------------------- */

static inline const uint8_t *panel_ptr(const lp_packed_geom *g, const uint8_t *data, int64_t p) {
    return data + (size_t)p * g->panel_bytes;
}

/* Value of nibble code n of a 4-bit type, before the scale. */
static inline int nibble_value(uint32_t type, int n) { return type == LP_W4C ? lp_w4c_levels[n] : n - 8; }

/* Columns [c0, c0+n) of one row (lane) of a panel; c0 and n multiples of 8. */
static void dequant_lane(uint32_t type, const lp_packed_geom *g, const uint8_t *panel, int lane, int64_t c0,
                         int64_t n, float *o) {
    const uint8_t *codes0 = panel + g->codes_offset;
    for (int64_t c = c0; c < c0 + n; c += 8) {
        int64_t grp = c / g->group;
        int i = (int)(c % g->group);
        float d = lp_packed_scale(type, g, panel, grp, lane);
        const uint8_t *codes = codes0 + (size_t)grp * g->code_bytes;
        float *dst = o + (c - c0);
        if (type != LP_W8) {
            const uint8_t *b = codes + 64 * (i / 8) + 4 * lane;
            for (int j = 0; j < 4; j++) {
                dst[j] = (float)nibble_value(type, b[j] & 0x0f) * d;
                dst[j + 4] = (float)nibble_value(type, b[j] >> 4) * d;
            }
        } else {
            const uint8_t *b = codes + 64 * (i / 4) + 4 * lane;
            for (int j = 0; j < 4; j++) {
                dst[j] = (float)((int)b[j] - 128) * d;
                dst[j + 4] = (float)((int)b[j + 64] - 128) * d;
            }
        }
    }
}

/* All 16 rows at once: the scales are converted once per group, and each
 * 64-byte chunk is read once (same values as dequant_lane). */
void lp_packed_dequant_panel(uint32_t type, const lp_packed_geom *g, const uint8_t *data, int64_t p,
                             int64_t c0, int64_t n, float *out, int64_t out_stride) {
    const uint8_t *panel = panel_ptr(g, data, p);
    const uint8_t *codes0 = panel + g->codes_offset;
    float d[LP_PANEL];
    int64_t grp = -1;
    for (int64_t c = c0; c < c0 + n; c += 8) {
        if (c / g->group != grp) {
            grp = c / g->group;
            for (int lane = 0; lane < LP_PANEL; lane++) d[lane] = lp_packed_scale(type, g, panel, grp, lane);
        }
        int i = (int)(c % g->group);
        const uint8_t *codes = codes0 + (size_t)grp * g->code_bytes;
        float *dst = out + (c - c0);
        if (type != LP_W8) {
            const uint8_t *chunk = codes + 64 * (i / 8);
            for (int lane = 0; lane < LP_PANEL; lane++)
                for (int j = 0; j < 4; j++) {
                    uint8_t byte = chunk[4 * lane + j];
                    dst[lane * out_stride + j] = (float)nibble_value(type, byte & 0x0f) * d[lane];
                    dst[lane * out_stride + j + 4] = (float)nibble_value(type, byte >> 4) * d[lane];
                }
        } else {
            const uint8_t *chunk = codes + 64 * (i / 4);
            for (int lane = 0; lane < LP_PANEL; lane++)
                for (int j = 0; j < 4; j++) {
                    dst[lane * out_stride + j] = (float)((int)chunk[4 * lane + j] - 128) * d[lane];
                    dst[lane * out_stride + j + 4] = (float)((int)chunk[64 + 4 * lane + j] - 128) * d[lane];
                }
        }
    }
}

void lp_packed_dequant_row(uint32_t type, const lp_packed_geom *g, const uint8_t *data, int64_t row,
                           int64_t c0, int64_t n, float *out) {
    dequant_lane(type, g, panel_ptr(g, data, row / LP_PANEL), (int)(row % LP_PANEL), c0, n, out);
}

void lp_weight_dequantize_row(const lp_weight *w, int64_t row, float *dst) {
    lp_packed_geom g;
    if (lp_dtype_is_packed(w->type)) {
        if (!lp_packed_geometry(w->type, w->rows, w->cols, w->group, &g) || row < 0 || row >= w->rows) {
            memset(dst, 0, (size_t)w->cols * sizeof(float));
            return;
        }
        lp_packed_dequant_row(w->type, &g, w->data, row, 0, w->cols, dst);
        return;
    }
    lp_dequantize_row(w->type, (const uint8_t *)w->data + (size_t)row * w->row_bytes, dst, w->cols);
}

/* ---- writing ---------------------------------------------------------------------------- */

/* One 4-bit code, element i of group grp of row `lane` (W4: q in [-8, 7];
 * W4C: q = nibble - 8), into the layout described at the top. */
static inline void put_code4(const lp_packed_geom *g, uint8_t *panel, int64_t grp, int lane, int i, int q) {
    uint8_t *codes = panel + g->codes_offset + (size_t)grp * g->code_bytes;
    uint8_t *byte = &codes[64 * (i / 8) + 4 * lane + (i % 4)];
    uint8_t nib = (uint8_t)(q + 8);
    *byte = (i % 8) < 4 ? (uint8_t)((*byte & 0xf0) | nib) : (uint8_t)((*byte & 0x0f) | (nib << 4));
}

/* n W8 codes (q in [-128, 127], n a multiple of 4) of one row into the
 * layout described at the top, the row's 4 bytes of each 64-byte chunk at a
 * time; row_codes points at its bytes of the first chunk (codes + 4 * lane). */
static void put_w8_codes(uint8_t *row_codes, const int8_t *q, int n) {
    for (int i = 0; i < n; i += 4) {
        uint8_t four[4];
        for (int j = 0; j < 4; j++) four[j] = (uint8_t)(q[i + j] + 128);
        memcpy(row_codes + 16 * (size_t)i, four, 4);
    }
}

/* Padding rows must decode to 0 with any scale: codes = the bias (W4C:
 * nibble 8, level 0), scales and row ranges 0. */
static void init_panels(uint32_t type, const lp_packed_geom *g, uint8_t *dst) {
    for (int64_t p = 0; p < g->panels; p++) {
        uint8_t *panel = dst + (size_t)p * g->panel_bytes;
        memset(panel, 0, g->codes_offset);
        memset(panel + g->codes_offset, type == LP_W8 ? 0x80 : 0x88, (size_t)g->groups * g->code_bytes);
    }
}

/* Scales are stored as f16: keep them finite. */
static uint16_t scale_to_f16(float d) { return lp_f32_to_f16(fminf(d, 65504.0f)); }

/* Codes for x against a given scale d. */
static void round_codes(const float *x, int n, float d, int lo, int hi, int8_t *q) {
    float id = d != 0 ? 1.0f / d : 0.0f;
    for (int i = 0; i < n; i++) q[i] = (int8_t)clamp_round(x[i] * id, lo, hi);
}

/* W4 codes of x[0..n) for the inverse scale id: rounded half up and
 * clamped to [-8, 7], branch-free so the compiler vectorizes it (x holds
 * no NaN: see quantize_w4_group). */
static void w4_codes(const float *x, int n, float id, int8_t *q) {
    for (int i = 0; i < n; i++) {
        float v = x[i] * id;
        v = v < -8.0f ? -8.0f : v;
        v = v > 7.0f ? 7.0f : v;
        q[i] = (int8_t)((int)(v + 8.5f) - 8); /* v + 8.5 > 0: truncation is floor */
    }
}

/* The sums below keep 8 partial sums (n is a multiple of 8) so that the
 * compiler may vectorize them without reassociating anything. */

/* Squared error of x against d * q. */
static float w4_error(const float *x, int n, float d, const int8_t *q) {
    float acc[8] = {0};
    for (int i = 0; i < n; i += 8)
        for (int j = 0; j < 8; j++) {
            float e = x[i + j] - d * (float)q[i + j];
            acc[j] += e * e;
        }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* The f16 least-squares scale sum(x q) / sum(q q) for fixed codes q
 * (0 when every code is 0). */
static uint16_t w4_ls_scale(const float *x, int n, const int8_t *q) {
    float sxq[8] = {0}, sqq[8] = {0};
    for (int i = 0; i < n; i += 8)
        for (int j = 0; j < 8; j++) {
            sxq[j] += x[i + j] * (float)q[i + j];
            sqq[j] += (float)q[i + j] * (float)q[i + j];
        }
    float a = ((sxq[0] + sxq[1]) + (sxq[2] + sxq[3])) + ((sxq[4] + sxq[5]) + (sxq[6] + sxq[7]));
    float b = ((sqq[0] + sqq[1]) + (sqq[2] + sqq[3])) + ((sqq[4] + sqq[5]) + (sqq[6] + sqq[7]));
    return b > 0 ? scale_to_f16(a / b) : 0;
}

typedef struct w4_best {
    uint16_t h;
    float err;
    int8_t q[128];
} w4_best;

/* Codes for the f16 scale h; keeps them when their error beats *best. */
static void w4_try(const float *x, int n, uint16_t h, w4_best *best) {
    float d = lp_f16_to_f32(h);
    int8_t q[128];
    w4_codes(x, n, d != 0 ? 1.0f / d : 0.0f, q);
    float err = w4_error(x, n, d, q);
    if (err < best->err) {
        best->err = err;
        best->h = h;
        memcpy(best->q, q, (size_t)n);
    }
}

/* W4 group: the plain choice maps the element of largest magnitude to -8
 * (as Q4_0 does). The search also tries other divisors near 8 on both
 * signs, each refitted to the least-squares scale of its rounding pattern
 * (stored as f16), then polishes the winner: two more least-squares
 * refits and the neighbouring f16 scales. The smallest squared error
 * after rounding wins, so it is never worse than the plain choice. */
static uint16_t quantize_w4_group(const float *x_in, int n, bool search, int8_t *q) {
    if (n <= 0 || n > 128) return 0; /* groups are 32, 64 or 128 */
    float x[128], amax = 0, m = 0;
    for (int i = 0; i < n; i++) {
        x[i] = isnan(x_in[i]) ? 0.0f : x_in[i]; /* NaN weights quantize as 0 */
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            m = x[i];
        }
    }
    if (!(amax > 0) || !isfinite(amax)) {
        memset(q, 0, (size_t)n);
        return 0;
    }
    w4_best best = {.err = INFINITY};
    w4_try(x, n, scale_to_f16(m / -8.0f), &best);
    if (!search) {
        memcpy(q, best.q, (size_t)n);
        return best.h;
    }
    int8_t trial[128];
    for (int side = 0; side < 2; side++)
        for (int step = -6; step <= 12; step++) {
            /* the extreme element lands on about -8 (side 0) or +7 (side 1) */
            float target = side == 0 ? -8.0f - 0.1f * (float)step : 7.0f + 0.1f * (float)step;
            w4_codes(x, n, target / m, trial);
            uint16_t h = w4_ls_scale(x, n, trial);
            if (h) w4_try(x, n, h, &best);
        }
    for (int it = 0; it < 2; it++) {
        uint16_t h = w4_ls_scale(x, n, best.q);
        if (h) w4_try(x, n, h, &best);
    }
    uint16_t h = best.h;
    if ((h & 0x7fff) > 1) w4_try(x, n, (uint16_t)(h - 1), &best);
    if ((h & 0x7fff) < 0x7bff) w4_try(x, n, (uint16_t)(h + 1), &best);
    memcpy(q, best.q, (size_t)n);
    return best.h;
}

/* ---- W4C: the codebook quantizer ------------------------------------------------- */

/* Where a value v (in units of the scale) falls between the levels: it
 * rounds above level m when 2v > twice the midpoint of m and m + 1, and
 * each level crossed adds the gap to the next. Computed from the levels
 * so the two can never disagree. */
typedef struct w4c_grid {
    float mid2[15], gap[15];
} w4c_grid;

static w4c_grid w4c_make_grid(void) {
    w4c_grid t;
    for (int m = 0; m < 15; m++) {
        t.mid2[m] = (float)(lp_w4c_levels[m] + lp_w4c_levels[m + 1]);
        t.gap[m] = (float)(lp_w4c_levels[m + 1] - lp_w4c_levels[m]);
    }
    return t;
}

/* Squared error of x against its nearest levels times d (d != 0). Level
 * by level over the whole group, then 8 partial sums, so that the compiler
 * vectorizes both loops (n a multiple of 8, at most 128): the search calls
 * this ~54 times per group, and as one loop per weight it stayed scalar
 * (TinyLlama compiled in 209 s). */
static float w4c_error(const w4c_grid *t, const float *x, int n, float d) {
    const float id2 = 2.0f / d;
    float v2[128], q[128];
    for (int i = 0; i < n; i++) {
        v2[i] = x[i] * id2;
        q[i] = (float)lp_w4c_levels[0];
    }
    for (int m = 0; m < 15; m++) {
        const float mid = t->mid2[m], gap = t->gap[m];
        for (int i = 0; i < n; i++) q[i] += v2[i] > mid ? gap : 0.0f;
    }
    float acc[8] = {0};
    for (int i = 0; i < n; i += 8)
        for (int j = 0; j < 8; j++) {
            float e = x[i + j] - d * q[i + j];
            acc[j] += e * e;
        }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* Nibble codes of x for the scale d, as w4c_error picks them. */
static void w4c_codes(const w4c_grid *t, const float *x, int n, float d, int8_t *nib) {
    const float id2 = 2.0f / d;
    for (int i = 0; i < n; i++) {
        float v2 = x[i] * id2;
        int c = 0;
        for (int m = 0; m < 15; m++) c += v2 > t->mid2[m];
        nib[i] = (int8_t)c;
    }
}

/* The base of a row's scale grid: the power of two b that puts the grid's
 * top (b x 2^7 x 31/16) between 1 and 2 times the row's largest |weight| /
 * 50, the largest scale the group search asks for, so the grid spans
 * from there down about 8 octaves. 0 for a row of zeros (or without a
 * finite maximum); b stays a normal float, so the scale bytes add to its
 * exponent without overflowing it. */
static float w4c_row_base(const float *x, int64_t n) {
    float amax = 0;
    for (int64_t i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]); /* NaN never compares greater */
    if (!(amax > 0) || !isfinite(amax)) return 0.0f;
    int e = (int)ceilf(log2f(amax / (50.0f * 248.0f)));
    e = e < -126 ? -126 : e > 118 ? 118 : e;
    return ldexpf(1.0f, e);
}

/* One W4C group: every grid scale (both signs) that puts the group's
 * largest |weight| between levels 50 and 160 is tried, and the one with
 * the least squared error after rounding to the levels wins. Returns the
 * scale byte; nib gets the codes. */
static uint8_t quantize_w4c_group(const w4c_grid *t, const float *x_in, int n, float base, int8_t *nib) {
    float x[128], amax = 0;
    for (int i = 0; i < n; i++) {
        x[i] = isnan(x_in[i]) ? 0.0f : x_in[i]; /* NaN weights quantize as 0 */
        amax = max_abs(amax, x[i]);
    }
    if (!(amax > 0) || !isfinite(amax) || !(base > 0)) {
        memset(nib, 8, (size_t)n); /* level 0 */
        return 0;
    }
    /* the grid rises with k: the candidates are a run of k, or (for a
     * group below the grid) its smallest scale */
    int k_lo = 0, k_hi = 127;
    while (k_lo < 127 && lp_w4c_scale(base, (uint8_t)k_lo) < amax / 160.0f) k_lo++;
    while (k_hi > k_lo && lp_w4c_scale(base, (uint8_t)k_hi) > amax / 50.0f) k_hi--;
    uint8_t best = 0;
    float best_err = INFINITY;
    for (int sign = 0; sign <= 0x80; sign += 0x80)
        for (int k = k_lo; k <= k_hi; k++) {
            uint8_t byte = (uint8_t)(k | sign);
            float err = w4c_error(t, x, n, lp_w4c_scale(base, byte));
            if (err < best_err) {
                best_err = err;
                best = byte;
            }
        }
    w4c_codes(t, x, n, lp_w4c_scale(base, best), nib);
    return best;
}

static void pack_w4c(const lp_packed_geom *g, const float *src, int64_t rows, int64_t cols, uint8_t *out) {
    const w4c_grid t = w4c_make_grid();
    int8_t nib[128];
    for (int64_t row = 0; row < rows; row++) {
        uint8_t *panel = out + (size_t)(row / LP_PANEL) * g->panel_bytes;
        int lane = (int)(row % LP_PANEL);
        const float *x = src + row * cols;
        float base = w4c_row_base(x, cols);
        memcpy(panel + 4 * lane, &base, sizeof base);
        for (int64_t grp = 0; grp < g->groups; grp++) {
            uint8_t k = quantize_w4c_group(&t, x + grp * g->group, g->group, base, nib);
            panel[g->scales_offset + (size_t)grp * g->scale_bytes + (size_t)lane] = k;
            for (int i = 0; i < g->group; i++) put_code4(g, panel, grp, lane, i, nib[i] - 8);
        }
    }
}

int lp_pack_weight_ex(uint32_t type, int group, const float *src, int64_t rows, int64_t cols, void *dst,
                      bool search) {
    lp_packed_geom g;
    if (!lp_packed_geometry(type, rows, cols, group, &g)) return -1;
    uint8_t *out = dst;
    init_panels(type, &g, out);
    if (type == LP_W4C) {
        pack_w4c(&g, src, rows, cols, out);
        return 0;
    }
    int8_t q[128];
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *panel = out + (size_t)(r / LP_PANEL) * g.panel_bytes;
        int lane = (int)(r % LP_PANEL);
        for (int64_t grp = 0; grp < g.groups; grp++) {
            const float *x = src + r * cols + grp * g.group;
            /* W8 groups can be a whole row: quantize in pieces of 128
             * against the group's scale. */
            uint16_t h;
            if (type == LP_W4) {
                h = quantize_w4_group(x, g.group, search, q);
                for (int i = 0; i < g.group; i++) put_code4(&g, panel, grp, lane, i, q[i]);
            } else {
                float amax = group_amax(x, g.group);
                h = isfinite(amax) ? scale_to_f16(amax / 127.0f) : 0;
                float d = lp_f16_to_f32(h);
                uint8_t *codes = panel + g.codes_offset + (size_t)grp * g.code_bytes + 4 * (size_t)lane;
                for (int i0 = 0; i0 < g.group; i0 += 128) {
                    int n = g.group - i0 < 128 ? g.group - i0 : 128;
                    if (d > 0) round_codes(x + i0, n, d, -127, 127, q);
                    else memset(q, 0, (size_t)n);
                    put_w8_codes(codes + 16 * (size_t)i0, q, n);
                }
            }
            write_f16(panel + (size_t)grp * 32 + 2 * (size_t)lane, h);
        }
    }
    return 0;
}

int lp_pack_weight(uint32_t type, int group, const float *src, int64_t rows, int64_t cols, void *dst) {
    return lp_pack_weight_ex(type, group, src, rows, cols, dst, true);
}

int lp_pack_from_gguf(uint32_t gguf_type, const void *src, int64_t rows, int64_t cols, void *dst,
                      uint32_t *packed_type) {
    uint32_t type = gguf_type == LP_Q4_0 ? LP_W4 : gguf_type == LP_Q8_0 ? LP_W8 : 0;
    lp_packed_geom g;
    if (!type || !lp_packed_geometry(type, rows, cols, 32, &g)) return -1;
    size_t row_bytes = lp_dtype_row_bytes(gguf_type, (uint64_t)cols), block = type == LP_W4 ? 18 : 34;
    uint8_t *out = dst;
    init_panels(type, &g, out);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = (const uint8_t *)src + (size_t)r * row_bytes;
        uint8_t *panel = out + (size_t)(r / LP_PANEL) * g.panel_bytes;
        int lane = (int)(r % LP_PANEL);
        for (int64_t grp = 0; grp < g.groups; grp++) {
            const uint8_t *b = row + (size_t)grp * block, *q = b + 2;
            memcpy(panel + (size_t)grp * 32 + 2 * (size_t)lane, b, 2); /* same f16 scale bits */
            /* this row's 4 bytes of each 64-byte chunk at a time (a code at
             * a time was most of a GGUF load) */
            uint8_t *codes = panel + g.codes_offset + (size_t)grp * g.code_bytes + 4 * (size_t)lane;
            if (type == LP_W4) {
                uint8_t four[4];
                /* Q4_0 byte i: element i in the low nibble, 16 + i in the
                 * high one, both already biased by 8; W4 chunk k byte j:
                 * element 8k + j low, 8k + 4 + j high */
                for (int k = 0; k < 4; k++) {
                    for (int j = 0; j < 4; j++) {
                        int lo = 8 * k + j, hi = lo + 4;
                        int nib_lo = lo < 16 ? q[lo] & 0x0f : q[lo - 16] >> 4;
                        int nib_hi = hi < 16 ? q[hi] & 0x0f : q[hi - 16] >> 4;
                        four[j] = (uint8_t)(nib_lo | nib_hi << 4);
                    }
                    memcpy(codes + 64 * k, four, 4);
                }
            } else {
                put_w8_codes(codes, (const int8_t *)q, 32);
            }
        }
    }
    *packed_type = type;
    return 0;
}
