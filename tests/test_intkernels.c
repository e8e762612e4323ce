/* Packed integer weights (LP_W4, LP_W8, LP_W4C) and the W4A8/W8A8 matmul:
 * geometry, pack -> dequantize round trips, lossless GGUF Q4_0/Q8_0 repack,
 * the W4C codebook (its scales, its codes, its error against W4),
 * quantization error bounds, every integer kernel level bit-identical to the
 * C reference (every batch from 1 to 17 rows), lp_matmul against the double-precision lp_matmul_ref within
 * the bound implied by int8 activations, the W4A16 float path, batch
 * slicing when the scratch is small, odd shapes, 1 and 2 threads. */
#include "check.h"
#include "kernels/kernels.h"
#include "kernels/kernels_internal.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static float *rand_normal(lp_rng *rng, int64_t n, float scale) {
    float *x = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = lp_rng_normal(rng) * scale;
    return x;
}

/* ---- geometry ------------------------------------------------------------------------ */

static void test_geometry(void) {
    CHECK(lp_pack_bytes(LP_W4, 16, 64, 32) == 2 * (32 + 256));
    CHECK(lp_pack_bytes(LP_W4, 17, 64, 0) == 2 * 2 * (32 + 256)); /* 0 = group 32; 2 panels */
    CHECK(lp_pack_bytes(LP_W4, 16, 128, 128) == 32 + 1024);
    CHECK(lp_pack_bytes(LP_W8, 1, 96, 96) == 32 + 16 * 96); /* per-row scales */
    CHECK(lp_pack_bytes(LP_W4, 16, 64, 48) == 0);
    CHECK(lp_pack_bytes(LP_W4, 16, 96, 64) == 0);  /* cols not a multiple of group */
    CHECK(lp_pack_bytes(LP_W8, 16, 96, 48) == 0);
    CHECK(lp_pack_bytes(LP_Q4_0, 16, 64, 32) == 0);
    CHECK(lp_pack_bytes(LP_W4, 16, 0, 32) == 0);
    CHECK(lp_pack_bytes(LP_W4, INT64_MAX / 2, 1 << 20, 32) == 0); /* overflow */
    CHECK(strcmp(lp_dtype_name(LP_W4), "W4") == 0 && strcmp(lp_dtype_name(LP_W8), "W8") == 0);
    CHECK(lp_dtype_get(LP_DTYPE_OWN_END) == NULL && lp_dtype_get(63) == NULL);
    /* at group 32 the per-row average equals Q4_0's / Q8_0's row bytes */
    CHECK(lp_pack_bytes(LP_W4, 32, 2048, 32) / 32 == lp_dtype_row_bytes(LP_W4, 2048));
    CHECK(lp_dtype_row_bytes(LP_W4, 2048) == lp_dtype_row_bytes(LP_Q4_0, 2048));
    CHECK(lp_pack_bytes(LP_W8, 32, 2048, 32) / 32 == lp_dtype_row_bytes(LP_Q8_0, 2048));
    float src[64] = {0};
    uint8_t dst[64];
    CHECK(lp_pack_weight(LP_W4, 48, src, 1, 64, dst) == -1);
    uint32_t t;
    CHECK(lp_pack_from_gguf(LP_Q4_K, src, 1, 256, dst, &t) == -1);
}

/* ---- round trips ------------------------------------------------------------------------ */

/* Values exactly q * d with f16 d and a group extreme at -8 (W4) or +-127
 * (W8) decode back exactly, with or without the scale search. */
static void test_exact_roundtrip(void) {
    lp_rng rng;
    lp_rng_seed(&rng, 7);
    const int64_t rows = 37, cols = 256;
    float *src = malloc((size_t)(rows * cols) * sizeof(float));
    float *row = malloc((size_t)cols * sizeof(float));
    static const int groups_w4[] = {32, 64, 128};
    for (int type = 0; type < 2; type++)
        for (int gi = 0; gi < 3; gi++) {
            uint32_t ty = type == 0 ? LP_W4 : LP_W8;
            int group = type == 0 ? groups_w4[gi] : (gi == 2 ? (int)cols : groups_w4[gi]);
            for (int64_t r = 0; r < rows; r++)
                for (int64_t g0 = 0; g0 < cols; g0 += group) {
                    float d = lp_f16_to_f32(lp_f32_to_f16(0.001f + 0.01f * lp_rng_uniform(&rng)));
                    for (int i = 0; i < group; i++) {
                        int q = type == 0 ? (int)(lp_rng_u64(&rng) % 16) - 8 : (int)(lp_rng_u64(&rng) % 255) - 127;
                        src[r * cols + g0 + i] = (float)q * d;
                    }
                    src[r * cols + g0 + (int)(lp_rng_u64(&rng) % (uint64_t)group)] = (type == 0 ? -8.0f : 127.0f) * d;
                }
            memset(src + 5 * cols, 0, (size_t)cols * sizeof(float)); /* an all-zero row */
            size_t bytes = lp_pack_bytes(ty, rows, cols, group);
            uint8_t *packed = malloc(bytes);
            for (int search = 0; search < 2; search++) {
                CHECK(lp_pack_weight_ex(ty, group, src, rows, cols, packed, search) == 0);
                lp_weight w = lp_packed_weight(ty, group, rows, cols, packed);
                int bad = 0;
                for (int64_t r = 0; r < rows; r++) {
                    lp_weight_dequantize_row(&w, r, row);
                    for (int64_t c = 0; c < cols; c++) bad += row[c] != src[r * cols + c];
                }
                CHECK_MSG(bad == 0, "%s group %d search %d: %d values differ", lp_dtype_name(ty), group, search, bad);
                /* whole-panel dequantization (the W4A16 path) gives the same bits */
                lp_packed_geom geom;
                CHECK(lp_packed_geometry(ty, rows, cols, group, &geom));
                float *panel = malloc((size_t)(LP_PANEL * cols) * sizeof(float));
                int bad_panel = 0;
                for (int64_t p = 0; p < geom.panels; p++) {
                    lp_packed_dequant_panel(ty, &geom, packed, p, 32, cols - 32, panel, cols);
                    for (int64_t r = p * LP_PANEL; r < rows && r < (p + 1) * LP_PANEL; r++) {
                        lp_weight_dequantize_row(&w, r, row);
                        bad_panel += memcmp(panel + (r - p * LP_PANEL) * cols, row + 32, (size_t)(cols - 32) * sizeof(float)) != 0;
                    }
                }
                CHECK_MSG(bad_panel == 0, "%s group %d: %d panel rows differ", lp_dtype_name(ty), group, bad_panel);
                free(panel);
            }
            free(packed);
        }
    free(src);
    free(row);
}

/* GGUF Q4_0 / Q8_0 repack is lossless: every row decodes to the same bits as
 * lp_dequantize_row of the original blocks. */
static void test_gguf_repack(void) {
    lp_rng rng;
    lp_rng_seed(&rng, 11);
    const int64_t rows = 45, cols = 192;
    float *src = rand_normal(&rng, rows * cols, 0.05f);
    float *a = malloc((size_t)cols * sizeof(float)), *b = malloc((size_t)cols * sizeof(float));
    static const uint32_t types[] = {LP_Q4_0, LP_Q8_0};
    for (int t = 0; t < 2; t++) {
        size_t rb = lp_dtype_row_bytes(types[t], (uint64_t)cols);
        uint8_t *gg = malloc(rb * (size_t)rows);
        for (int64_t r = 0; r < rows; r++) lp_quantize_row(types[t], src + r * cols, gg + (size_t)r * rb, cols);
        gg[3] = 0x80; /* a Q8_0 code of -128 (or any Q4_0 nibbles) must survive too */
        uint32_t packed_type = 0;
        size_t bytes = lp_pack_bytes(t == 0 ? LP_W4 : LP_W8, rows, cols, 32);
        uint8_t *packed = malloc(bytes);
        CHECK(lp_pack_from_gguf(types[t], gg, rows, cols, packed, &packed_type) == 0);
        CHECK(packed_type == (t == 0 ? LP_W4 : LP_W8));
        lp_weight w = lp_packed_weight(packed_type, 32, rows, cols, packed);
        lp_weight wg = {types[t], rows, cols, rb, gg, 0};
        int bad = 0;
        for (int64_t r = 0; r < rows; r++) {
            lp_dequantize_row(types[t], gg + (size_t)r * rb, a, cols);
            lp_weight_dequantize_row(&w, r, b);
            bad += memcmp(a, b, (size_t)cols * sizeof(float)) != 0;
            lp_weight_dequantize_row(&wg, r, b); /* old types work through it too */
            bad += memcmp(a, b, (size_t)cols * sizeof(float)) != 0;
        }
        CHECK_MSG(bad == 0, "%s repack: %d rows differ", lp_dtype_name(types[t]), bad);
        free(gg);
        free(packed);
    }
    free(src);
    free(a);
    free(b);
}

/* Error bounds on normal weights: plain W4 is within one step d of every
 * value (the clamp at +7 can cost a full step), the search never has a
 * larger squared error than the plain choice, W8 is within d/2. */
static void test_error_bounds(void) {
    lp_rng rng;
    lp_rng_seed(&rng, 3);
    const int64_t rows = 20, cols = 512;
    float *src = rand_normal(&rng, rows * cols, 0.02f);
    float *row = malloc((size_t)cols * sizeof(float));
    static const int groups[] = {32, 64, 128};
    for (int gi = 0; gi < 3; gi++) {
        int group = groups[gi];
        double sse[2] = {0, 0};
        int bad = 0;
        for (int search = 0; search < 2; search++) {
            uint8_t *packed = malloc(lp_pack_bytes(LP_W4, rows, cols, group));
            lp_pack_weight_ex(LP_W4, group, src, rows, cols, packed, search);
            lp_weight w = lp_packed_weight(LP_W4, group, rows, cols, packed);
            for (int64_t r = 0; r < rows; r++) {
                lp_weight_dequantize_row(&w, r, row);
                for (int64_t g0 = 0; g0 < cols; g0 += group) {
                    float amax = 0;
                    for (int i = 0; i < group; i++) amax = fmaxf(amax, fabsf(src[r * cols + g0 + i]));
                    float d = amax / 8.0f;
                    for (int i = 0; i < group; i++) {
                        float e = row[g0 + i] - src[r * cols + g0 + i];
                        sse[search] += (double)e * e;
                        if (!search) bad += fabsf(e) > d * 1.002f;
                    }
                }
            }
            free(packed);
        }
        CHECK_MSG(bad == 0, "W4 g%d plain: %d errors above one step", group, bad);
        CHECK_MSG(sse[1] <= sse[0], "W4 g%d: search %g > plain %g", group, sse[1], sse[0]);
        CHECK_MSG(sse[1] < 0.97 * sse[0], "W4 g%d: search gains too little (%g vs %g)", group, sse[1], sse[0]);
    }
    for (int per_row = 0; per_row < 2; per_row++) {
        int group = per_row ? (int)cols : 32, bad = 0;
        uint8_t *packed = malloc(lp_pack_bytes(LP_W8, rows, cols, group));
        lp_pack_weight(LP_W8, group, src, rows, cols, packed);
        lp_weight w = lp_packed_weight(LP_W8, group, rows, cols, packed);
        for (int64_t r = 0; r < rows; r++) {
            lp_weight_dequantize_row(&w, r, row);
            for (int64_t g0 = 0; g0 < cols; g0 += group) {
                float amax = 0;
                for (int i = 0; i < group; i++) amax = fmaxf(amax, fabsf(src[r * cols + g0 + i]));
                for (int i = 0; i < group; i++)
                    bad += fabsf(row[g0 + i] - src[r * cols + g0 + i]) > amax / 127.0f * 0.502f;
            }
        }
        CHECK_MSG(bad == 0, "W8 group %d: %d errors above half a step", group, bad);
        free(packed);
    }
    free(src);
    free(row);
}

/* ---- W4C: the codebook format ----------------------------------------------------------- */

static void test_w4c(void) {
    /* geometry: a 64-byte header of row ranges, 16 scale bytes per group,
     * then W4's codes */
    CHECK(lp_pack_bytes(LP_W4C, 16, 64, 32) == 64 + 32 + 2 * 256);
    CHECK(lp_pack_bytes(LP_W4C, 17, 2048, 32) == 2 * (64 + 1024 + 64 * 256));
    CHECK(lp_pack_bytes(LP_W4C, 16, 96, 32) == 64 + 48 + 3 * 256);
    CHECK(lp_pack_bytes(LP_W4C, 16, 256, 128) == 64 + 32 + 2 * 1024);
    CHECK(lp_pack_bytes(LP_W4C, 16, 96, 64) == 0);
    CHECK(strcmp(lp_dtype_name(LP_W4C), "W4C") == 0 && lp_dtype_is_packed(LP_W4C));
    /* 5.2 % fewer bytes than W4 on a 2048-wide matrix */
    CHECK(lp_pack_bytes(LP_W4C, 2048, 2048, 32) * 100 < lp_pack_bytes(LP_W4, 2048, 2048, 32) * 95);

    /* scales: b x 2^(k >> 4 & 7) x (1 + (k & 15) / 16) with a sign bit */
    int bad = 0;
    const float b = 0x1p-12f;
    for (int k = 0; k < 256; k++) {
        float want = (k & 0x80 ? -1.0f : 1.0f) * ldexpf(b, (k >> 4) & 7) * (1.0f + (float)(k & 15) / 16.0f);
        bad += lp_w4c_scale(b, (uint8_t)k) != want;
        if (k > 0 && k < 128) bad += !(lp_w4c_scale(b, (uint8_t)k) > lp_w4c_scale(b, (uint8_t)(k - 1)));
    }
    CHECK_MSG(bad == 0, "W4C scales: %d of 256 off", bad);
    CHECK(lp_w4c_levels[8] == 0); /* padding codes (0x88) decode to 0 */

    /* every decoded value is a level times its group's scale; the
     * codebook's squared error is well below W4's (with its scale search)
     * on normal weights; a zero row and NaNs decode to 0 */
    lp_rng rng;
    lp_rng_seed(&rng, 13);
    const int64_t rows = 20, cols = 512;
    float *src = rand_normal(&rng, rows * cols, 0.02f);
    memset(src + 3 * cols, 0, (size_t)cols * sizeof(float));
    src[7 * cols + 5] = NAN;
    float *row = malloc((size_t)cols * sizeof(float)), *panel = malloc((size_t)(LP_PANEL * cols) * sizeof(float));
    static const int groups[] = {32, 64, 128};
    for (int gi = 0; gi < 3; gi++) {
        const int group = groups[gi];
        double sse[2] = {0, 0};
        int off_grid = 0, bad_zero = 0, bad_panel = 0;
        for (int t = 0; t < 2; t++) {
            uint32_t ty = t == 0 ? LP_W4 : LP_W4C;
            uint8_t *packed = malloc(lp_pack_bytes(ty, rows, cols, group));
            CHECK(lp_pack_weight(ty, group, src, rows, cols, packed) == 0);
            lp_weight w = lp_packed_weight(ty, group, rows, cols, packed);
            lp_packed_geom geom;
            CHECK(lp_packed_geometry(ty, rows, cols, group, &geom));
            for (int64_t rr = 0; rr < rows; rr++) {
                lp_weight_dequantize_row(&w, rr, row);
                const uint8_t *pp = packed + (size_t)(rr / LP_PANEL) * geom.panel_bytes;
                for (int64_t c = 0; c < cols; c++) {
                    float x = src[rr * cols + c];
                    if (isnan(x) || rr == 3) {
                        bad_zero += row[c] != 0.0f;
                        continue;
                    }
                    sse[t] += (double)(row[c] - x) * (row[c] - x);
                    if (ty != LP_W4C) continue;
                    float d = lp_packed_scale(ty, &geom, pp, c / group, (int)(rr % LP_PANEL));
                    int on = 0;
                    for (int l = 0; l < 16; l++) on += row[c] == (float)lp_w4c_levels[l] * d;
                    off_grid += on == 0;
                }
            }
            if (ty == LP_W4C)
                for (int64_t p = 0; p < geom.panels; p++) {
                    lp_packed_dequant_panel(ty, &geom, packed, p, 0, cols, panel, cols);
                    for (int64_t rr = p * LP_PANEL; rr < rows && rr < (p + 1) * LP_PANEL; rr++) {
                        lp_weight_dequantize_row(&w, rr, row);
                        bad_panel += memcmp(panel + (rr - p * LP_PANEL) * cols, row, (size_t)cols * sizeof(float)) != 0;
                    }
                }
            free(packed);
        }
        CHECK_MSG(off_grid == 0 && bad_zero == 0 && bad_panel == 0,
                  "W4C g%d: %d values off the levels, %d zeros wrong, %d panel rows differ", group, off_grid, bad_zero,
                  bad_panel);
        CHECK_MSG(sse[1] < 0.9 * sse[0], "W4C g%d: squared error %g, W4 %g", group, sse[1], sse[0]);
        printf("W4C g%d: squared error %.3g of W4's\n", group, sse[1] / sse[0]);
    }
    free(src);
    free(row);
    free(panel);
}

/* ---- matmul ----------------------------------------------------------------------------- */

typedef struct int_level_setup {
    lp_kernels k;
} int_level_setup;

/* Every integer level this CPU can run, reference first. */
static int int_levels(int_level_setup out[6]) {
    lp_cpu_features cpu;
    lp_cpu_detect(&cpu);
    int n = 0;
    lp_kernels_init_reference(&out[n++].k);
    lp_kernels best; /* uncapped whatever LORAPLEX_CPU says (test_cpucap covers the caps) */
    lp_kernels_init_capped(&best, &cpu, LP_CPU_CAP_NONE);
#if defined(__x86_64__)
    if (cpu.avx2 && cpu.fma && cpu.f16c) {
        lp_kernels_init_capped(&out[n].k, &cpu, LP_CPU_CAP_NONE);
        out[n].k.vbmi = false;
        out[n++].k.int_level = LP_INT_AVX2;
        if (cpu.avxvnni) {
            out[n] = out[n - 1];
            out[n++].k.int_level = LP_INT_AVXVNNI;
        }
    }
#endif
    if (best.int_level == LP_INT_AMX) { /* also the VNNI kernel AMX falls back to */
        out[n].k = best;
        out[n++].k.int_level = LP_INT_AVX512VNNI;
    }
    if (best.vbmi) { /* and the VNNI kernels of CPUs without VBMI */
        out[n].k = best;
        out[n].k.int_level = LP_INT_AVX512VNNI;
        out[n++].k.vbmi = false;
    }
    if (best.i8mm) { /* and the dotprod kernels of Arm CPUs without i8mm */
        out[n].k = best;
        out[n++].k.i8mm = false;
    }
    if (best.int_level != LP_INT_REF && best.int_level != LP_INT_AVX2 && best.int_level != LP_INT_AVXVNNI)
        out[n++].k = best;
    return n;
}

/* |y - exact| bound from int8 activations: each x moves by at most half a
 * step d_x/2 of its group, times |w|; plus float rounding slack. */
static double act_bound(const float *wrow, const float *x, int64_t cols, int group) {
    double bound = 0, mag = 0;
    for (int64_t g0 = 0; g0 < cols; g0 += group) {
        float amax = 0;
        double wsum = 0;
        for (int i = 0; i < group; i++) {
            amax = fmaxf(amax, fabsf(x[g0 + i]));
            wsum += fabs(wrow[g0 + i]);
            mag += fabs((double)wrow[g0 + i] * x[g0 + i]);
        }
        bound += wsum * amax / 127.0 * 0.5;
    }
    return bound * 1.01 + 1e-5 * mag + 1e-30;
}

typedef struct mm_case {
    uint32_t type;
    int group;
    int64_t rows, cols;
} mm_case;

static void test_matmul(void) {
    lp_rng rng;
    lp_rng_seed(&rng, 5);
    lp_error err;
    lp_threadpool *pool2 = lp_threadpool_create(2, &err);
    CHECK(pool2 != NULL);
    int_level_setup levels[6];
    int n_levels = int_levels(levels);
    for (int l = 0; l < n_levels; l++) {
        CHECK(lp_kernels_reserve(&levels[l].k, 64, 1024, &err) == 0);
        printf("integer kernel level: %s%s%s\n", lp_int_level_name(levels[l].k.int_level),
               levels[l].k.vbmi ? " (vbmi)" : "", levels[l].k.i8mm ? " (i8mm)" : "");
    }
    static const mm_case cases[] = {
        {LP_W4, 32, 37, 96},  {LP_W4, 64, 16, 128}, {LP_W4, 128, 100, 256}, {LP_W4, 32, 1, 32},
        {LP_W4, 32, 70, 320}, {LP_W8, 32, 37, 96},  {LP_W8, 96, 21, 96},    {LP_W8, 256, 100, 256},
        {LP_W8, 64, 48, 192}, {LP_W4C, 32, 37, 96}, {LP_W4C, 64, 16, 128}, {LP_W4C, 128, 100, 256},
        {LP_W4C, 32, 70, 320}, {LP_W4C, 32, 1, 32},
    };
    /* decode, every few-row tile shape (2..16 rows: streams, speculative trees), prefill */
    static const int64_t batches[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 64};
    const int64_t max_b = 64, max_c = 320, max_r = 103; /* rows + 3 of stride slack */
    float *X = rand_normal(&rng, max_b * max_c, 1.0f);
    for (int64_t i = 0; i < max_c; i += 7) X[i] *= 20.0f; /* activation outliers */
    float *Y = malloc((size_t)(max_b * max_r) * sizeof(float)), *Yref = malloc((size_t)(max_b * max_r) * sizeof(float));
    float *Y0 = malloc((size_t)(max_b * max_r) * sizeof(float));
    float *wrow = malloc((size_t)max_c * sizeof(float));
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const mm_case *mc = &cases[c];
        float *wf = rand_normal(&rng, mc->rows * mc->cols, 0.05f);
        uint8_t *packed = malloc(lp_pack_bytes(mc->type, mc->rows, mc->cols, mc->group));
        CHECK(lp_pack_weight(mc->type, mc->group, wf, mc->rows, mc->cols, packed) == 0);
        lp_weight W = lp_packed_weight(mc->type, mc->group, mc->rows, mc->cols, packed);
        const char *tn = lp_dtype_name(mc->type);
        for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
            int64_t nb = batches[bi];
            /* Y strides wider than rows catch writes past the last row */
            int64_t ys = mc->rows + 3;
            lp_matmul_ref(&W, X, mc->cols, nb, Yref, ys);
            int bad_bound = 0;
            for (int l = 0; l < n_levels; l++)
                for (int threads = 1; threads <= 2; threads++) {
                    for (int64_t i = 0; i < nb * ys; i++) Y[i] = 12345.0f;
                    lp_matmul(&levels[l].k, threads == 2 ? pool2 : NULL, &W, X, mc->cols, nb, Y, ys);
                    if (l == 0 && threads == 1) memcpy(Y0, Y, (size_t)(nb * ys) * sizeof(float));
                    int bad_exact = 0, bad_pad = 0;
                    for (int64_t b = 0; b < nb; b++)
                        for (int64_t r = 0; r < ys; r++) {
                            float got = Y[b * ys + r];
                            if (r >= mc->rows) bad_pad += got != 12345.0f;
                            else bad_exact += memcmp(&got, &Y0[b * ys + r], sizeof got) != 0;
                        }
                    CHECK_MSG(bad_exact == 0 && bad_pad == 0, "%s g%d %lldx%lld nb %lld level %s threads %d: %d differ from reference, %d padding writes",
                              tn, mc->group, (long long)mc->rows, (long long)mc->cols, (long long)nb,
                              lp_int_level_name(levels[l].k.int_level), threads, bad_exact, bad_pad);
                }
            for (int64_t r = 0; r < mc->rows; r++) {
                lp_weight_dequantize_row(&W, r, wrow);
                for (int64_t b = 0; b < nb; b++) {
                    double bound = act_bound(wrow, X + b * mc->cols, mc->cols, W.group);
                    bad_bound += !(fabs(Y0[b * ys + r] - Yref[b * ys + r]) <= bound);
                }
            }
            CHECK_MSG(bad_bound == 0, "%s g%d nb %lld: %d outputs beyond the int8-activation bound", tn, mc->group,
                      (long long)nb, bad_bound);

            /* W4A16 / W8A16 float path at every float level, and the
             * no-scratch fallback, against the double reference */
            for (int l = 0; l < n_levels; l++) {
                lp_kernels kf = levels[l].k;
                kf.int8_activations = false;
                lp_kernels nos = levels[l].k;
                nos.scratch = NULL;
                nos.scratch_bytes = 0;
                const lp_kernels *variants[2] = {&kf, &nos};
                for (int v = 0; v < 2; v++) {
                    lp_matmul(variants[v], pool2, &W, X, mc->cols, nb, Y, ys);
                    int bad = 0;
                    for (int64_t r = 0; r < mc->rows; r++) {
                        lp_weight_dequantize_row(&W, r, wrow);
                        for (int64_t b = 0; b < nb; b++) {
                            double mag = 0;
                            for (int64_t i = 0; i < mc->cols; i++) mag += fabs((double)wrow[i] * X[b * mc->cols + i]);
                            bad += !(fabs(Y[b * ys + r] - Yref[b * ys + r]) <= 1e-5 * mag + 1e-30);
                        }
                    }
                    CHECK_MSG(bad == 0, "%s g%d nb %lld float path (%s): %d off", tn, mc->group, (long long)nb,
                              v ? "no scratch" : "W4A16", bad);
                }
            }
        }
        /* scratch for 5 rows: a batch of 17 runs in slices, same bits */
        lp_kernels small = levels[n_levels - 1].k;
        small.scratch = NULL;
        small.scratch_bytes = 0;
        CHECK(lp_kernels_reserve(&small, 5, mc->cols, &err) == 0);
        lp_matmul(&small, pool2, &W, X, mc->cols, 17, Y, mc->rows);
        lp_matmul(&levels[0].k, NULL, &W, X, mc->cols, 17, Y0, mc->rows);
        CHECK_MSG(memcmp(Y, Y0, (size_t)(17 * mc->rows) * sizeof(float)) == 0, "%s sliced batch differs", tn);
        lp_kernels_free(&small);
        free(wf);
        free(packed);
    }
    /* a malformed packed weight (group does not divide cols) gives zeros */
    uint8_t dummy[64] = {0};
    lp_weight bad = {LP_W4, 2, 48, 0, dummy, 32};
    Y[0] = Y[1] = 1.0f;
    lp_matmul(&levels[0].k, NULL, &bad, X, 48, 1, Y, 2);
    CHECK(Y[0] == 0.0f && Y[1] == 0.0f);
    for (int l = 0; l < n_levels; l++) lp_kernels_free(&levels[l].k);
    CHECK(lp_kernels_reserve(&levels[0].k, 0, 10, &err) == -1);
    lp_threadpool_destroy(pool2);
    free(X);
    free(Y);
    free(Y0);
    free(Yref);
    free(wrow);
}

/* The SIMD activation quantizers give the reference's bits, also for
 * zeros, huge values, infinities and NaN, at widths that are whole blocks
 * of 16 groups (the AVX-512 one's fast path) and that leave a remainder. */
static void test_quantize_act(void) {
#if defined(__x86_64__)
    lp_cpu_features cpu;
    lp_cpu_detect(&cpu);
    bool has512 = cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512vnni;
    if (!(cpu.avx2 && cpu.fma && cpu.f16c)) return;
    lp_rng rng;
    lp_rng_seed(&rng, 21);
    enum { COLS = 800 }; /* 25 groups of 32 */
    float x[COLS];
    int8_t q[3][COLS];
    float d[3][COLS / 32];
    int32_t corr[3][COLS / 32];
    void (*const quantizers[3])(const float *, int64_t, int, int, int8_t *, float *, int32_t *) = {
        lp_quantize_act_ref, lp_quantize_act_avx2, lp_quantize_act_avx512};
    int n_quantizers = has512 ? 3 : 2;
    static const int groups[] = {32, 64, 128, 512};
    int bad = 0;
    for (int trial = 0; trial < 40; trial++) {
        for (int i = 0; i < COLS; i++) x[i] = lp_rng_normal(&rng) * (trial % 3 == 0 ? 1e-3f : 5.0f);
        if (trial % 4 == 1) x[lp_rng_u64(&rng) % COLS] = NAN;
        if (trial % 4 == 2) x[lp_rng_u64(&rng) % COLS] = -INFINITY;
        if (trial % 4 == 3) x[lp_rng_u64(&rng) % COLS] = 3e38f;
        if (trial % 8 == 5) x[lp_rng_u64(&rng) % COLS] = FLT_MAX; /* the largest finite amax */
        if (trial % 5 == 0)
            for (int i = 32; i < 64; i++) x[i] = 0.0f;
        for (int i = 0; i < COLS; i += 37) x[i] = (float)(i % 5) * 0.5f; /* ties after scaling */
        for (int gi = 0; gi < 4; gi++) {
            int group = groups[gi];
            int cols = trial % 2 && group == 32 ? COLS : 512, ng = cols / group;
            for (int v = 0; v < n_quantizers; v++) {
                memset(q[v], 0x55, sizeof q[v]);
                quantizers[v](x, cols, group, 8, q[v], d[v], corr[v]);
                bad += memcmp(q[0], q[v], (size_t)cols) != 0 || memcmp(d[0], d[v], (size_t)ng * sizeof(float)) != 0 ||
                       memcmp(corr[0], corr[v], (size_t)ng * sizeof(int32_t)) != 0;
            }
        }
    }
    CHECK_MSG(bad == 0, "SIMD activation quantizers differ from the reference in %d cases", bad);
#endif
}

/* lp_matmul_multi (q, k, v-like weights sharing one input) gives the bits
 * of separate lp_matmul calls, on the packed single-pass path and on the
 * fallback (mixed types), for decode and prefill batches, 1 and 2 threads. */
static void test_matmul_multi(void) {
    lp_rng rng;
    lp_rng_seed(&rng, 17);
    lp_error err;
    lp_threadpool *pool2 = lp_threadpool_create(2, &err);
    CHECK(pool2 != NULL);
    int_level_setup levels[6];
    int n_levels = int_levels(levels);
    enum { COLS = 256, NB = 19 };
    static const int64_t rows[3] = {48, 16, 37};
    float *X = rand_normal(&rng, NB * COLS, 1.0f);
    void *mem[3];
    lp_weight W[3], Wmixed[3];
    float *Ysep[3], *Ymulti[3];
    for (int i = 0; i < 3; i++) {
        float *wf = rand_normal(&rng, rows[i] * COLS, 0.05f);
        mem[i] = malloc(lp_pack_bytes(LP_W4, rows[i], COLS, 64));
        CHECK(lp_pack_weight(LP_W4, 64, wf, rows[i], COLS, mem[i]) == 0);
        W[i] = lp_packed_weight(LP_W4, 64, rows[i], COLS, mem[i]);
        Ysep[i] = malloc((size_t)(NB * (rows[i] + 1)) * sizeof(float));
        Ymulti[i] = malloc((size_t)(NB * (rows[i] + 1)) * sizeof(float));
        free(wf);
    }
    /* the third as W8: the mixed set takes the fallback */
    float *wf8 = rand_normal(&rng, rows[2] * COLS, 0.05f);
    void *mem8 = malloc(lp_pack_bytes(LP_W8, rows[2], COLS, 32));
    lp_pack_weight(LP_W8, 32, wf8, rows[2], COLS, mem8);
    Wmixed[0] = W[0];
    Wmixed[1] = W[1];
    Wmixed[2] = lp_packed_weight(LP_W8, 32, rows[2], COLS, mem8);
    int64_t ys[3] = {rows[0] + 1, rows[1] + 1, rows[2] + 1};
    int bad = 0;
    for (int l = 0; l < n_levels; l++) {
        CHECK(lp_kernels_reserve(&levels[l].k, NB, COLS, &err) == 0);
        for (int mixed = 0; mixed < 2; mixed++)
            for (int threads = 1; threads <= 2; threads++)
                for (int64_t nb = 1; nb <= NB; nb += NB - 1) {
                    const lp_weight *ws[3] = {&W[0], &W[1], mixed ? &Wmixed[2] : &W[2]};
                    for (int i = 0; i < 3; i++) {
                        lp_matmul(&levels[l].k, threads == 2 ? pool2 : NULL, ws[i], X, COLS, nb, Ysep[i], ys[i]);
                        for (int64_t j = 0; j < NB * ys[i]; j++) Ymulti[i][j] = 777.0f;
                    }
                    lp_matmul_multi(&levels[l].k, threads == 2 ? pool2 : NULL, 3, ws, X, COLS, nb, Ymulti, ys);
                    for (int i = 0; i < 3; i++)
                        for (int64_t b = 0; b < nb; b++) {
                            bad += memcmp(Ysep[i] + b * ys[i], Ymulti[i] + b * ys[i], (size_t)rows[i] * sizeof(float)) != 0;
                            bad += Ymulti[i][b * ys[i] + rows[i]] != 777.0f; /* no write past the rows */
                        }
                }
        lp_kernels_free(&levels[l].k);
    }
    CHECK_MSG(bad == 0, "lp_matmul_multi: %d rows differ from separate lp_matmul calls", bad);
    for (int i = 0; i < 3; i++) {
        free(mem[i]);
        free(Ysep[i]);
        free(Ymulti[i]);
    }
    free(wf8);
    free(mem8);
    free(X);
    lp_threadpool_destroy(pool2);
}

/* lp_matmul_tasks (independent weights, inputs and outputs: the segmented
 * LoRA shrink/expand) gives the bits of one lp_matmul per task, at every
 * level and thread count, with shared and separate inputs, on the packed
 * single pass and on the fallback (a float weight in the set). */
static void test_matmul_tasks(void) {
    lp_rng rng;
    lp_rng_seed(&rng, 23);
    lp_error err;
    lp_threadpool *pool2 = lp_threadpool_create(2, &err);
    CHECK(pool2 != NULL);
    int_level_setup levels[6];
    int n_levels = int_levels(levels);
    enum { N_TASKS = 5, MAXC = 256, MAXB = 12 };
    /* shrink-like (rank x width) and expand-like (width x 32) shapes */
    static const int64_t rows[N_TASKS] = {16, 8, 32, 200, 96}, cols[N_TASKS] = {256, 256, 64, 32, 64};
    static const int64_t nb[N_TASKS] = {3, 3, 12, 1, 7};
    float *X[N_TASKS], *Yt[N_TASKS], *Ys[N_TASKS], *wf[N_TASKS];
    void *mem[N_TASKS];
    lp_weight W[N_TASKS];
    for (int i = 0; i < N_TASKS; i++) {
        wf[i] = rand_normal(&rng, rows[i] * cols[i], 0.05f);
        mem[i] = malloc(lp_pack_bytes(LP_W8, rows[i], cols[i], 32));
        CHECK(lp_pack_weight(LP_W8, 32, wf[i], rows[i], cols[i], mem[i]) == 0);
        W[i] = lp_packed_weight(LP_W8, 32, rows[i], cols[i], mem[i]);
        X[i] = rand_normal(&rng, MAXB * MAXC, 1.0f);
        Yt[i] = malloc((size_t)MAXB * (size_t)(rows[i] + 3) * sizeof(float));
        Ys[i] = malloc((size_t)MAXB * (size_t)(rows[i] + 3) * sizeof(float));
    }
    lp_weight Wf = {.type = LP_F32, .rows = rows[4], .cols = cols[4], .row_bytes = (size_t)cols[4] * 4, .data = wf[4]};
    int bad = 0;
    for (int l = 0; l < n_levels; l++) {
        CHECK(lp_kernels_reserve(&levels[l].k, MAXB, MAXC, &err) == 0);
        for (int variant = 0; variant < 3; variant++) /* 0 separate inputs, 1 shared, 2 with a float weight */
            for (int threads = 1; threads <= 2; threads++) {
                lp_matmul_task t[N_TASKS];
                for (int i = 0; i < N_TASKS; i++) {
                    const float *x = variant == 1 && i == 1 ? X[0] : X[i]; /* task 1 shares task 0's rows */
                    t[i] = (lp_matmul_task){variant == 2 && i == 4 ? &Wf : &W[i], x, MAXC, nb[i], Yt[i], rows[i] + 3};
                    for (int64_t j = 0; j < MAXB * (rows[i] + 3); j++) Yt[i][j] = 777.0f;
                    lp_matmul(&levels[l].k, threads == 2 ? pool2 : NULL, t[i].W, x, MAXC, nb[i], Ys[i], rows[i] + 3);
                }
                lp_matmul_tasks(&levels[l].k, threads == 2 ? pool2 : NULL, N_TASKS, t);
                for (int i = 0; i < N_TASKS; i++)
                    for (int64_t b = 0; b < nb[i]; b++) {
                        bad += memcmp(Ys[i] + b * (rows[i] + 3), Yt[i] + b * (rows[i] + 3),
                                      (size_t)rows[i] * sizeof(float)) != 0;
                        bad += Yt[i][b * (rows[i] + 3) + rows[i]] != 777.0f; /* no write past the rows */
                    }
            }
        lp_kernels_free(&levels[l].k);
    }
    CHECK_MSG(bad == 0, "lp_matmul_tasks: %d rows differ from separate lp_matmul calls", bad);
    for (int i = 0; i < N_TASKS; i++) {
        free(wf[i]);
        free(mem[i]);
        free(X[i]);
        free(Yt[i]);
        free(Ys[i]);
    }
    lp_threadpool_destroy(pool2);
}

/* The panel claims behind every threaded pass: each panel exactly once,
 * owners front to back in whole 4-panel tiles (a share's last tile by
 * single panels with tail unit 1), and a thread whose share is done takes
 * the back half of another's (scenario 0: thread 0 drains its own share,
 * then everyone else's, as if the others were descheduled). */
static void test_panel_claims(void) {
    static lp_panel_claims c;
    const int64_t total = 103;
    int seen[103];
    for (int run = 0; run < 4; run++) {
        int scenario = run % 2, tail = run < 2 ? 4 : 1;
        memset(seen, 0, sizeof seen);
        lp_claims_init(&c, total, 3, tail);
        int64_t p0, p1, own_end, last_own[3] = {-1, -1, -1};
        int claims = 0, stolen = 0, single = 0;
        bool any = true;
        while (any) {
            any = false;
            for (int t = 0; t < 3; t++) {
                if (scenario == 0 && t > 0) break; /* only thread 0 runs */
                if (!lp_claims_next(&c, t, &p0, &p1, &own_end)) continue;
                any = true;
                claims++;
                CHECK(p0 >= 0 && p0 < p1 && p1 <= own_end && own_end <= total);
                if (tail == 4)
                    CHECK_MSG(p0 % 4 == 0, "claim [%lld, %lld) does not start on a 4-panel tile", (long long)p0,
                              (long long)p1);
                else if (p0 % 4 != 0 || p1 - p0 < 4)
                    CHECK_MSG(p1 - p0 <= 2 && p1 - (p0 & ~(int64_t)3) <= 4,
                              "claim [%lld, %lld) is more than half of a last tile", (long long)p0, (long long)p1);
                single += p1 - p0 == 1;
                int64_t share_b, share_e;
                lp_split_range(total, t, 3, 4, &share_b, &share_e);
                if (p0 >= share_b && p1 <= share_e) {
                    CHECK_MSG(p0 > last_own[t], "thread %d's own claims go backwards", t);
                    last_own[t] = p0;
                } else {
                    /* a theft takes the back of another thread's share */
                    stolen++;
                    bool at_a_back = false;
                    for (int v = 0; v < 3; v++) {
                        int64_t vb, ve;
                        lp_split_range(total, v, 3, 4, &vb, &ve);
                        /* inside v's share, with everything after it there already taken */
                        if (v != t && p0 >= vb && p1 <= ve && (p1 == ve || seen[p1] == 1)) at_a_back = true;
                    }
                    CHECK_MSG(at_a_back, "theft [%lld, %lld) is not the back of another share", (long long)p0,
                              (long long)p1);
                }
                for (int64_t p = p0; p < p1; p++) seen[p]++;
            }
        }
        int once = 0;
        for (int64_t p = 0; p < total; p++) once += seen[p] == 1;
        CHECK_MSG(once == total, "scenario %d, tail %d: %d of %lld panels claimed exactly once", scenario, tail,
                  once, (long long)total);
        if (scenario == 0) CHECK_MSG(stolen >= 2, "thread 0 alone stole %d times", stolen);
        else if (tail == 4) CHECK(stolen == 0); /* even threads finish their own shares */
        CHECK(claims > 3);
        /* every share ends in single panels (3 at least), or none does */
        CHECK_MSG(tail == 1 ? single >= 3 : single == 0, "tail %d: %d single-panel claims", tail, single);
    }
}

int main(void) {
    test_panel_claims();
    test_geometry();
    test_exact_roundtrip();
    test_gguf_repack();
    test_error_bounds();
    test_w4c();
    test_quantize_act();
    test_matmul();
    test_matmul_multi();
    test_matmul_tasks();
    return check_summary("intkernels");
}
