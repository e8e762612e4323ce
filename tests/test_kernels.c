/* Kernels: half-float conversions, dequantization of hand-built blocks,
 * quantize -> dequantize error bounds, lp_matmul against lp_matmul_ref at
 * every dispatch level this CPU supports, and the vector ops. */
#include "check.h"
#include "kernels/kernels.h"
#include "kernels/kernels_internal.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static float bits_to_f32(uint32_t u) {
    union { uint32_t u; float f; } v = {.u = u};
    return v.f;
}

static void put_f16(uint8_t *p, float f) {
    uint16_t h = lp_f32_to_f16(f);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

static int type_block_elems(uint32_t t) { return lp_dtype_get(t)->block_elems; }

/* ---- f16 / bf16 --------------------------------------------------------------- */

#if defined(__x86_64__)
__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f) {
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
#endif

static void test_f16(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = lp_f16_to_f32((uint16_t)h);
        bool is_nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff) != 0;
        if (is_nan) {
            if (!isnan(f) || !isnan(lp_f16_to_f32(lp_f32_to_f16(f)))) bad++;
        } else if (lp_f32_to_f16(f) != h) {
            bad++;
        }
    }
    CHECK_MSG(bad == 0, "%d f16 values do not round-trip", bad);

    CHECK(lp_f32_to_f16(1.0f) == 0x3c00);
    CHECK(lp_f32_to_f16(-2.0f) == 0xc000);
    CHECK(lp_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(lp_f32_to_f16(65519.0f) == 0x7bff);
    CHECK(lp_f32_to_f16(65520.0f) == 0x7c00);      /* halfway to 2^16 rounds to even: inf */
    CHECK(lp_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00); /* tie -> even */
    CHECK(lp_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02); /* tie -> even (up) */
    CHECK(lp_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01);
    CHECK(lp_f32_to_f16(0x1p-24f) == 0x0001);
    CHECK(lp_f32_to_f16(0x1p-25f) == 0x0000);       /* tie -> even (zero) */
    CHECK(lp_f32_to_f16(0x1.8p-25f) == 0x0001);
    CHECK(lp_f32_to_f16(3 * 0x1p-25f) == 0x0002);   /* 1.5 ulp: tie -> even */
    CHECK(lp_f32_to_f16(0x1.ffcp-15f) == 0x0400);   /* rounds up into the normals */
    CHECK(lp_f32_to_f16(-0.0f) == 0x8000);
    CHECK(lp_f32_to_f16(INFINITY) == 0x7c00);
    CHECK(lp_f32_to_f16(-INFINITY) == 0xfc00);
    CHECK(isnan(lp_f16_to_f32(lp_f32_to_f16(NAN))));

#if defined(__x86_64__)
    lp_cpu_features cpu;
    lp_cpu_detect(&cpu);
    if (cpu.f16c) { /* compare with the hardware on many random bit patterns */
        lp_rng rng;
        lp_rng_seed(&rng, 7);
        int mismatch = 0;
        for (int i = 0; i < 200000; i++) {
            uint32_t u = (uint32_t)lp_rng_u64(&rng);
            if (i & 1) u = (u & 0x87ffffff) | 0x30000000; /* bias towards the f16 range */
            float f = bits_to_f32(u);
            if (isnan(f)) continue;
            if (lp_f32_to_f16(f) != hw_f32_to_f16(f)) mismatch++;
        }
        CHECK_MSG(mismatch == 0, "%d f32->f16 differ from F16C", mismatch);
    }
#endif

    CHECK(lp_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(lp_f32_to_bf16(bits_to_f32(0x3f808000)) == 0x3f80); /* tie -> even */
    CHECK(lp_f32_to_bf16(bits_to_f32(0x3f818000)) == 0x3f82);
    CHECK(lp_f32_to_bf16(bits_to_f32(0x3f808001)) == 0x3f81);
    CHECK(isnan(lp_bf16_to_f32(lp_f32_to_bf16(NAN))));
    CHECK(lp_bf16_to_f32(0xc040) == -3.0f);
}

/* ---- dequantization of hand-built blocks ------------------------------------------ */

static int count_mismatch(const float *got, const float *want, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            if (bad < 4) fprintf(stderr, "  element %d: got %.9g want %.9g\n", i, got[i], want[i]);
            bad++;
        }
    return bad;
}

static void test_dequant_simple(void) {
    uint8_t b[80];
    float got[256], want[256];

    /* Q4_0, both signs of d; every nibble value appears in both halves. */
    for (int sign = 0; sign < 2; sign++) {
        float d = sign ? -0.25f : 0.5f;
        put_f16(b, d);
        for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
        for (int j = 0; j < 16; j++) {
            want[j] = (float)(j - 8) * d;
            want[j + 16] = (float)(7 - j) * d;
        }
        lp_dequantize_row(LP_Q4_0, b, got, 32);
        CHECK(count_mismatch(got, want, 32) == 0);
    }
    CHECK(want[16] == -1.75f && want[31] == 2.0f); /* sanity of the table itself */

    /* Q4_1: q*d + m. */
    put_f16(b, 0.25f);
    put_f16(b + 2, -1.5f);
    for (int j = 0; j < 16; j++) b[4 + j] = (uint8_t)((15 - j) | (j << 4));
    for (int j = 0; j < 16; j++) {
        want[j] = (float)(15 - j) * 0.25f - 1.5f;
        want[j + 16] = (float)j * 0.25f - 1.5f;
    }
    lp_dequantize_row(LP_Q4_1, b, got, 32);
    CHECK(count_mismatch(got, want, 32) == 0);

    /* Q5_0 / Q5_1: the 5th bit of element e is bit e of the u32 qh. */
    uint32_t qh = 0xA5C30F69u;
    for (int t = 0; t < 2; t++) {
        uint32_t type = t ? LP_Q5_1 : LP_Q5_0;
        int off = t ? 4 : 2;
        put_f16(b, -0.5f);
        if (t) put_f16(b + 2, 3.0f);
        for (int i = 0; i < 4; i++) b[off + i] = (uint8_t)(qh >> (8 * i));
        for (int j = 0; j < 16; j++) b[off + 4 + j] = (uint8_t)(j | ((j * 7 % 16) << 4));
        for (int e = 0; e < 32; e++) {
            int lo = e < 16 ? (e & 15) : ((e - 16) * 7 % 16);
            int q = lo | (int)(((qh >> e) & 1) << 4);
            want[e] = t ? (float)q * -0.5f + 3.0f : (float)(q - 16) * -0.5f;
        }
        lp_dequantize_row(type, b, got, 32);
        CHECK_MSG(count_mismatch(got, want, 32) == 0, "%s", lp_dtype_name(type));
    }

    /* Q8_0: negative d, full int8 range; two blocks in a row. */
    put_f16(b, -0.125f);
    put_f16(b + 34, 3.0f);
    for (int j = 0; j < 32; j++) {
        b[2 + j] = (uint8_t)(int8_t)(j == 0 ? -128 : j == 1 ? 127 : j * 9 - 140);
        b[36 + j] = (uint8_t)(int8_t)(-j);
    }
    for (int j = 0; j < 32; j++) {
        want[j] = (float)(int8_t)b[2 + j] * -0.125f;
        want[32 + j] = (float)-j * 3.0f;
    }
    lp_dequantize_row(LP_Q8_0, b, got, 64);
    CHECK(count_mismatch(got, want, 64) == 0);
    CHECK(got[0] == 16.0f && got[1] == -15.875f);

    /* Plain types. */
    uint16_t h[3] = {0x3c00, 0xc000, 0x7bff};
    lp_dequantize_row(LP_F16, h, got, 3);
    CHECK(got[0] == 1.0f && got[1] == -2.0f && got[2] == 65504.0f);
    uint16_t bf[2] = {0x3f80, 0xc040};
    lp_dequantize_row(LP_BF16, bf, got, 2);
    CHECK(got[0] == 1.0f && got[1] == -3.0f);
}

/* A 12-byte K-quant scale array and the (scale, min) pairs worked out by
 * hand from the GGML packing rule (see quant.c). */
static const uint8_t k_scales[12] = {0xC1, 0x7F, 0x05, 0xA1, 0x40, 0xFF,
                                     0x07, 0x1F, 0x5A, 0x3C, 0xE1, 0x00};
static const int k_sc[8] = {1, 63, 5, 33, 58, 28, 1, 32};
static const int k_m[8] = {0, 63, 7, 31, 21, 51, 14, 0};

static void test_dequant_k(void) {
    uint8_t b[210];
    float got[256], want[256];

    /* Q4_K */
    put_f16(b, 0.5f);
    put_f16(b + 2, 0.25f);
    memcpy(b + 4, k_scales, 12);
    for (int i = 0; i < 128; i++) b[16 + i] = (uint8_t)(i * 37 + 11);
    for (int e = 0; e < 256; e++) {
        int p = e / 64, within = e % 64, l = within % 32, s = e / 32;
        uint8_t byte = b[16 + 32 * p + l];
        int q = within < 32 ? (byte & 15) : (byte >> 4);
        want[e] = (0.5f * (float)k_sc[s]) * (float)q - 0.25f * (float)k_m[s];
    }
    lp_dequantize_row(LP_Q4_K, b, got, 256);
    CHECK_MSG(count_mismatch(got, want, 256) == 0, "Q4_K");

    /* Q5_K: qh[32] sits between scales and qs. */
    put_f16(b, -0.5f);
    put_f16(b + 2, 0.125f);
    memcpy(b + 4, k_scales, 12);
    for (int i = 0; i < 32; i++) b[16 + i] = (uint8_t)(i * 53 + 7);
    for (int i = 0; i < 128; i++) b[48 + i] = (uint8_t)(i * 91 + 5);
    for (int e = 0; e < 256; e++) {
        int p = e / 64, within = e % 64, l = within % 32, s = e / 32;
        uint8_t byte = b[48 + 32 * p + l];
        int q = (within < 32 ? (byte & 15) : (byte >> 4)) | (((b[16 + l] >> s) & 1) << 4);
        want[e] = (-0.5f * (float)k_sc[s]) * (float)q - 0.125f * (float)k_m[s];
    }
    lp_dequantize_row(LP_Q5_K, b, got, 256);
    CHECK_MSG(count_mismatch(got, want, 256) == 0, "Q5_K");

    /* Q6_K: ql[128] qh[64] scales[16] d; negative and extreme scales. */
    static const int8_t sc6[16] = {-128, 127, -1, 0, 1, 2, -3, 45, -67, 89, 10, -11, 12, -13, 14, 100};
    for (int i = 0; i < 128; i++) b[i] = (uint8_t)(i * 29 + 3);
    for (int i = 0; i < 64; i++) b[128 + i] = (uint8_t)(i * 71 + 5);
    memcpy(b + 192, sc6, 16);
    put_f16(b + 208, 0.25f);
    for (int e = 0; e < 256; e++) {
        int half = e / 128, k = e % 128, g = k / 32, l = k % 32;
        const uint8_t *ql = b + 64 * half, *qh = b + 128 + 32 * half;
        int lo = g == 0 ? ql[l] & 15 : g == 1 ? ql[32 + l] & 15 : g == 2 ? ql[l] >> 4 : ql[32 + l] >> 4;
        int q = (lo | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
        want[e] = 0.25f * (float)sc6[e / 16] * (float)q;
    }
    lp_dequantize_row(LP_Q6_K, b, got, 256);
    CHECK_MSG(count_mismatch(got, want, 256) == 0, "Q6_K");
    /* spot values worked out by hand: element 0: ql[0]=3, qh[0]=5 -> q = (3|1<<4)-32 = -13 */
    CHECK(got[0] == 0.25f * -128.0f * -13.0f);
}

typedef struct level_setup {
    lp_kernels k;
    const char *name;
} level_setup;

static int supported_levels(level_setup out[4]) {
    lp_cpu_features cpu;
    lp_cpu_detect(&cpu);
    int n = 0;
    lp_kernels_init_reference(&out[n].k);
    out[n++].name = "reference";
    lp_cpu_features no512 = cpu;
    no512.avx512f = no512.avx512bw = no512.avx512vl = false;
    lp_kernels_init(&out[n].k, &no512);
    if (out[n].k.level == 1) out[n++].name = "avx2";
    lp_kernels_init(&out[n].k, &cpu);
    if (out[n].k.level == 2) out[n++].name = "avx512";
#if defined(__aarch64__)
    lp_kernels_init(&out[n].k, &cpu);
    if (out[n].k.int_level == LP_INT_NEON_DOT) out[n++].name = "neon-dotprod";
#endif
    if (out[n - 1].k.int_level == LP_INT_AMX) { /* the VNNI kernel too */
        out[n] = out[n - 1];
        out[n].k.int_level = LP_INT_AVX512VNNI;
        out[n++].name = "avx512 (vnni integer kernels)";
    }
    return n;
}

/* ---- quantize -> dequantize ----------------------------------------------------- */

static float read_f16_at(const uint8_t *p) { return lp_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

static void unpack_k(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* The largest error the format allows for element e of a quantized block. */
static double allowed_error(uint32_t type, const uint8_t *blk, int e, float x, float amax) {
    double tiny = 1e-6 * amax + 1e-30;
    switch (type) {
    case LP_F32: return 0;
    case LP_F16: return fabs(x) * 0x1p-11 + 0x1p-25;
    case LP_BF16: return fabs(x) * 0x1p-8;
    case LP_Q8_0: return fabs(read_f16_at(blk)) / 2 + tiny;
    case LP_Q4_0:
    case LP_Q5_0: {
        double d = read_f16_at(blk), top = type == LP_Q4_0 ? 7 : 15;
        /* the code range is asymmetric: values above top*d clamp to it */
        if (d != 0 && x / d > top + 0.5) return fabs(x - top * d) + tiny;
        return fabs(d) / 2 + tiny;
    }
    case LP_Q4_1:
    case LP_Q5_1: return read_f16_at(blk) / 2 + fabs(read_f16_at(blk + 2)) * 0x1p-10 + tiny;
    case LP_Q4_K:
    case LP_Q5_K: {
        int sc, m;
        unpack_k(blk + 4, e / 32, &sc, &m);
        return read_f16_at(blk) * sc / 2 + tiny;
    }
    case LP_Q6_K: return fabs(read_f16_at(blk + 208) * ((const int8_t *)blk)[192 + e / 16]) / 2 + tiny;
    default: return 0;
    }
}

static const uint32_t k_all_types[] = {LP_F32, LP_F16, LP_BF16, LP_Q8_0, LP_Q4_0, LP_Q4_1,
                                       LP_Q5_0, LP_Q5_1, LP_Q4_K, LP_Q5_K, LP_Q6_K};
#define N_TYPES (sizeof k_all_types / sizeof k_all_types[0])

static void fill_test_row(lp_rng *rng, float *x, int n, int pattern) {
    for (int i = 0; i < n; i++) {
        switch (pattern) {
        case 0: x[i] = lp_rng_normal(rng); break;
        case 1: x[i] = lp_rng_normal(rng) * (i % 7 == 0 ? 20.0f : 0.01f); break; /* outliers */
        case 2: x[i] = 3.0f + lp_rng_uniform(rng); break;                           /* all positive */
        case 3: x[i] = -2.0f - lp_rng_uniform(rng) * 1e-3f; break;                  /* nearly constant < 0 */
        case 4: x[i] = 0.0f; break;
        default: x[i] = lp_rng_normal(rng) * 1e-4f; break;                         /* tiny values */
        }
    }
}

static void test_roundtrip(void) {
    lp_rng rng;
    lp_rng_seed(&rng, 42);
    enum { N = 512 };
    float x[N], y[N];
    uint8_t q[N * 4];
    for (size_t t = 0; t < N_TYPES; t++) {
        uint32_t type = k_all_types[t];
        const lp_dtype_info *info = lp_dtype_get(type);
        for (int pattern = 0; pattern < 6; pattern++) {
            fill_test_row(&rng, x, N, pattern);
            memset(q, 0xAB, sizeof q);
            CHECK(lp_quantize_row(type, x, q, N));
            lp_dequantize_row(type, q, y, N);
            int bad = 0, be = info->block_elems;
            double worst = 0;
            for (int i = 0; i < N; i++) {
                const uint8_t *blk = q + (i / be) * info->block_bytes;
                float amax = 0;
                for (int j = i / be * be; j < (i / be + 1) * be; j++) amax = fmaxf(amax, fabsf(x[j]));
                double err = fabs((double)x[i] - y[i]);
                if (!(err <= allowed_error(type, blk, i % be, x[i], amax))) {
                    if (bad++ < 3)
                        fprintf(stderr, "  %s pattern %d elem %d: x %g y %g bound %g\n", info->name, pattern, i,
                                x[i], y[i], allowed_error(type, blk, i % be, x[i], amax));
                }
                if (amax > 0) worst = fmax(worst, err / amax);
            }
            CHECK_MSG(bad == 0, "%s pattern %d: %d elements outside the bound", info->name, pattern, bad);
            /* The bounds above come from the stored scales; also cap the scales. */
            /* (Q4_0/Q5_0 clamp the top code, so their worst case is a full step.) */
            double cap = type == LP_Q4_0 ? 0.13 : type == LP_Q5_0 ? 0.07
                         : type == LP_Q4_1 || type == LP_Q4_K ? 0.07
                         : type == LP_Q6_K || type == LP_Q5_1 || type == LP_Q5_K ? 0.04
                         : 0.01;
            if (be > 1) CHECK_MSG(worst <= cap, "%s pattern %d: worst relative error %g", info->name, pattern, worst);
        }
    }

    /* Exactly representable input comes back unchanged. */
    for (int i = 0; i < 32; i++) x[i] = (float)(i - 16) * 0.25f;
    x[0] = -127 * 0.25f;
    CHECK(lp_quantize_row(LP_Q8_0, x, q, 32));
    lp_dequantize_row(LP_Q8_0, q, y, 32);
    CHECK(count_mismatch(y, x, 32) == 0);
    for (int i = 0; i < 32; i++) x[i] = (float)(i % 16 - 8) * 0.5f;
    CHECK(lp_quantize_row(LP_Q4_0, x, q, 32));
    lp_dequantize_row(LP_Q4_0, q, y, 32);
    CHECK(count_mismatch(y, x, 32) == 0);

    /* The SIMD-compiled decoders used by lp_matmul give the very same bits. */
    float z[N];
    level_setup levels[4];
    int n_levels = supported_levels(levels);
    for (size_t t = 0; t < N_TYPES; t++) {
        fill_test_row(&rng, x, N, 1);
        lp_quantize_row(k_all_types[t], x, q, N);
        lp_dequantize_row(k_all_types[t], q, y, N);
        for (int l = 0; l < n_levels; l++) {
            int level = levels[l].k.level;
            lp_dequantize_row_fast(level, k_all_types[t], q, z, N);
            CHECK_MSG(count_mismatch(z, y, N) == 0, "%s fast level %d", lp_dtype_name(k_all_types[t]), level);
        }
    }

    CHECK(!lp_quantize_row(LP_Q2_K, x, q, 256));
    CHECK(!lp_quantize_row(LP_Q8_0, x, q, 33));
}

/* ---- matmul ---------------------------------------------------------------------- */

static void check_matmul_case(level_setup *levels, int n_levels, lp_threadpool **pools, uint32_t type,
                              int64_t rows, int64_t cols, int64_t n_batch, lp_rng *rng) {
    size_t row_bytes = lp_dtype_row_bytes(type, (uint64_t)cols);
    int64_t x_stride = cols + 3, y_stride = rows + 2;
    float *wf = malloc((size_t)(rows * cols) * sizeof(float));
    uint8_t *wq = malloc(row_bytes * (size_t)rows);
    float *X = malloc((size_t)(n_batch * x_stride) * sizeof(float));
    float *Y = malloc((size_t)(n_batch * y_stride) * sizeof(float));
    float *ref = malloc((size_t)(n_batch * y_stride) * sizeof(float));
    double *mag = malloc((size_t)(n_batch * rows) * sizeof(double));
    float *deq = malloc((size_t)cols * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        fill_test_row(rng, wf + r * cols, (int)cols, r % 3 == 2 ? 1 : 0);
        lp_quantize_row(type, wf + r * cols, wq + r * row_bytes, cols);
    }
    for (int64_t i = 0; i < n_batch * x_stride; i++) X[i] = lp_rng_normal(rng);
    lp_weight W = {.type = type, .rows = rows, .cols = cols, .row_bytes = row_bytes, .data = wq};
    lp_matmul_ref(&W, X, x_stride, n_batch, ref, y_stride);
    for (int64_t r = 0; r < rows; r++) {
        lp_dequantize_row(type, wq + r * row_bytes, deq, cols);
        for (int64_t b = 0; b < n_batch; b++) {
            double m = 0;
            for (int64_t c = 0; c < cols; c++) m += fabs((double)deq[c] * X[b * x_stride + c]);
            mag[b * rows + r] = m;
        }
    }
    for (int l = 0; l < n_levels; l++)
        for (int p = 0; p < 2; p++) {
            for (int64_t i = 0; i < n_batch * y_stride; i++) Y[i] = 12345.0f;
            lp_matmul(&levels[l].k, pools[p], &W, X, x_stride, n_batch, Y, y_stride);
            int bad = 0;
            for (int64_t b = 0; b < n_batch; b++) {
                for (int64_t r = 0; r < rows; r++) {
                    double tol = 1e-5 * mag[b * rows + r] + 1e-30;
                    float got = Y[b * y_stride + r], want = ref[b * y_stride + r];
                    if (!(fabs((double)got - want) <= tol)) {
                        if (bad++ < 2)
                            fprintf(stderr, "  [%s b=%lld r=%lld] got %.8g want %.8g tol %g\n", levels[l].name,
                                    (long long)b, (long long)r, got, want, tol);
                    }
                }
                for (int64_t r = rows; r < y_stride; r++) bad += Y[b * y_stride + r] != 12345.0f;
            }
            CHECK_MSG(bad == 0, "matmul %s %lldx%lld batch %lld, %s, %d thread(s): %d bad", lp_dtype_name(type),
                      (long long)rows, (long long)cols, (long long)n_batch, levels[l].name, p + 1, bad);
        }
    free(wf);
    free(wq);
    free(X);
    free(Y);
    free(ref);
    free(mag);
    free(deq);
}

static void test_matmul(void) {
    level_setup levels[4];
    int n_levels = supported_levels(levels);
    printf("kernels: testing %d dispatch level(s):", n_levels);
    for (int i = 0; i < n_levels; i++) printf(" %s", levels[i].name);
    printf("\n");
    lp_error err;
    lp_threadpool *pools[2] = {lp_threadpool_create(1, &err), lp_threadpool_create(2, &err)};
    CHECK(pools[0] && pools[1]);
    if (!pools[0] || !pools[1]) return;
    lp_rng rng;
    lp_rng_seed(&rng, 1234);
    static const int64_t cols_list[] = {7, 32, 37, 256, 288, 1030, 4096 + 256};
    static const int64_t batches[] = {1, 3, 17};
    for (size_t t = 0; t < N_TYPES; t++) {
        uint32_t type = k_all_types[t];
        for (size_t c = 0; c < sizeof cols_list / sizeof cols_list[0]; c++) {
            int64_t cols = cols_list[c];
            if (cols % type_block_elems(type) != 0) continue;
            int64_t rows = cols > 1024 ? 9 : 13;
            for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++)
                check_matmul_case(levels, n_levels, pools, type, rows, cols, batches[b], &rng);
        }
        /* fewer rows than a tile, and one row */
        check_matmul_case(levels, n_levels, pools, type, 3, 256, 5, &rng);
        check_matmul_case(levels, n_levels, pools, type, 1, 256, 2, &rng);
    }
    /* An unsupported type gives zeros instead of reading unknown blocks. */
    uint8_t junk[84 * 2];
    memset(junk, 0x5a, sizeof junk);
    float xs[256] = {1}, ys[2] = {7, 7};
    lp_weight q2 = {.type = LP_Q2_K, .rows = 2, .cols = 256, .row_bytes = 84, .data = junk};
    lp_matmul(&levels[n_levels - 1].k, pools[1], &q2, xs, 256, 1, ys, 2);
    CHECK(ys[0] == 0.0f && ys[1] == 0.0f);
    lp_threadpool_destroy(pools[0]);
    lp_threadpool_destroy(pools[1]);
}

/* ---- batch invariance ------------------------------------------------------------ */

/* The engine promises that a sequence computed inside a batch (any size,
 * any position, any thread count, any scratch slicing) gives the very same
 * bits as computed alone. Y rows from batches of 1, 3, 17 and 64 at two
 * offsets, on 1 and 2 threads, must memcmp-equal the row computed alone. */
typedef struct inv_type { uint32_t type; int group; bool int8_act; } inv_type;

static int invariance_case(const lp_kernels *k, lp_threadpool **pools, const lp_weight *W, const float *X,
                           int64_t nx, const float *alone, float *Y) {
    static const int64_t sizes[] = {1, 3, 17, 64};
    int bad = 0;
    for (int p = 0; p < 2; p++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            /* slices start at row 0 or row 5: rows sit at other positions */
            int64_t offset = (int64_t)((si + (size_t)p) % 2) * 5;
            for (int64_t b0 = offset; b0 < nx; b0 += sizes[si]) {
                int64_t nb = nx - b0 < sizes[si] ? nx - b0 : sizes[si];
                lp_matmul(k, pools[p], W, X + b0 * W->cols, W->cols, nb, Y + b0 * W->rows, W->rows);
            }
            for (int64_t b = offset; b < nx; b++)
                bad += memcmp(Y + b * W->rows, alone + b * W->rows, (size_t)W->rows * sizeof(float)) != 0;
        }
    return bad;
}

static void test_batch_invariance(void) {
    level_setup levels[4];
    int n_levels = supported_levels(levels);
    lp_error err;
    lp_threadpool *pools[2] = {lp_threadpool_create(1, &err), lp_threadpool_create(2, &err)};
    CHECK(pools[0] && pools[1]);
    if (!pools[0] || !pools[1]) return;
    static const inv_type types[] = {
        {LP_F32, 0, false},  {LP_F16, 0, false},  {LP_BF16, 0, false}, {LP_Q8_0, 0, false},
        {LP_Q4_0, 0, false}, {LP_Q4_1, 0, false}, {LP_Q5_0, 0, false}, {LP_Q5_1, 0, false},
        {LP_Q4_K, 0, false}, {LP_Q5_K, 0, false}, {LP_Q6_K, 0, false}, {LP_W4, 32, true},
        {LP_W4, 64, true},   {LP_W4, 128, true},  {LP_W8, 32, true},   {LP_W8, 1280, true},
        {LP_W4, 32, false},  {LP_W8, 32, false},
    };
    enum { NX = 64, ROWS = 21 };
    lp_rng rng;
    lp_rng_seed(&rng, 77);
    const int64_t max_cols = 1280;
    float *wf = malloc((size_t)(ROWS * max_cols) * sizeof(float));
    float *X = malloc((size_t)(NX * max_cols) * sizeof(float));
    float *alone = malloc((size_t)(NX * ROWS) * sizeof(float)), *Y = malloc((size_t)(NX * ROWS) * sizeof(float));
    uint8_t *wq = malloc((size_t)ROWS * lp_dtype_row_bytes(LP_F32, (uint64_t)max_cols));
    for (int64_t i = 0; i < ROWS * max_cols; i++) wf[i] = lp_rng_normal(&rng) * 0.05f;
    for (int64_t i = 0; i < NX * max_cols; i++) X[i] = lp_rng_normal(&rng) * (i % 13 == 0 ? 10.0f : 1.0f);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const inv_type *it = &types[t];
        bool packed = it->type == LP_W4 || it->type == LP_W8;
        /* F32/F16/BF16 and packed weights: > 1024 columns (two LP_CHUNK /
         * AMX chunks) with a tail that is not a multiple of the vector
         * width where the block size allows; the other types share the
         * same tile code and take fewer columns (ASan run time). */
        int64_t be = packed ? 32 : type_block_elems(it->type);
        int64_t cols = be == 1 ? 1037 : packed ? (it->group <= 32 ? 1056 : 1280) : be == 32 ? 544 : 768;
        lp_weight W;
        if (packed) {
            CHECK(lp_pack_weight(it->type, it->group, wf, ROWS, cols, wq) == 0);
            W = lp_packed_weight(it->type, it->group, ROWS, cols, wq);
        } else {
            size_t rb = lp_dtype_row_bytes(it->type, (uint64_t)cols);
            for (int64_t r = 0; r < ROWS; r++) lp_quantize_row(it->type, wf + r * cols, wq + (size_t)r * rb, cols);
            W = (lp_weight){.type = it->type, .rows = ROWS, .cols = cols, .row_bytes = rb, .data = wq};
        }
        for (int l = 0; l < n_levels; l++) {
            lp_kernels k = levels[l].k;
            k.int8_activations = it->int8_act;
            CHECK(lp_kernels_reserve(&k, NX, cols, &err) == 0);
            for (int64_t b = 0; b < NX; b++) lp_matmul(&k, NULL, &W, X + b * cols, cols, 1, alone + b * ROWS, ROWS);
            int bad = invariance_case(&k, pools, &W, X, NX, alone, Y);
            /* scratch for 5 rows: bigger batches run in slices */
            lp_kernels small = k;
            small.scratch = NULL;
            small.scratch_bytes = 0;
            CHECK(lp_kernels_reserve(&small, 5, cols, &err) == 0);
            if (packed && it->int8_act) bad += invariance_case(&small, pools, &W, X, NX, alone, Y);
            CHECK_MSG(bad == 0, "batch invariance %s g%d %s, level %s: %d rows differ", lp_dtype_name(it->type),
                      it->group, it->int8_act ? "int8" : "float", levels[l].name, bad);
            lp_kernels_free(&small);
            lp_kernels_free(&k);
        }
    }
    free(wf);
    free(X);
    free(alone);
    free(Y);
    free(wq);
    lp_threadpool_destroy(pools[0]);
    lp_threadpool_destroy(pools[1]);
}

/* ---- vector ops ----------------------------------------------------------------- */

static void test_ops(void) {
    lp_rng rng;
    lp_rng_seed(&rng, 99);
    enum { N = 1000 };
    float x[N], w[N], out[N], g[N], u[N];
    for (int i = 0; i < N; i++) {
        x[i] = lp_rng_normal(&rng) * 3.0f;
        w[i] = 1.0f + 0.1f * lp_rng_normal(&rng);
    }

    /* rmsnorm, with and without a gain */
    double ss = 0;
    for (int i = 0; i < N; i++) ss += (double)x[i] * x[i];
    double inv = 1.0 / sqrt(ss / N + 1e-5);
    lp_rmsnorm(out, x, w, N, 1e-5f);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += !(fabs(out[i] - x[i] * inv * w[i]) <= 1e-6 * fabs(x[i] * inv * w[i]) + 1e-7);
    CHECK_MSG(bad == 0, "rmsnorm: %d off", bad);
    lp_rmsnorm(out, x, NULL, N, 1e-5f);
    bad = 0;
    for (int i = 0; i < N; i++) bad += !(fabs(out[i] - x[i] * inv) <= 1e-6 * fabs(x[i] * inv) + 1e-7);
    CHECK_MSG(bad == 0, "rmsnorm without gain: %d off", bad);
    float zeros[4] = {0};
    lp_rmsnorm(out, zeros, NULL, 4, 1e-5f);
    CHECK(out[0] == 0.0f && out[3] == 0.0f);
    /* its sum of squares at every length up to 40 (the tail of the eight
     * partial sums) and a long one */
    bad = 0;
    for (int n = 0; n <= N; n += n < 40 ? 1 : N - 40) {
        long double want = 0;
        for (int i = 0; i < n; i++) want += (long double)x[i] * x[i];
        bad += !(fabsl(lp_sum_squares(x, n) - want) <= 1e-14L * want);
    }
    CHECK_MSG(bad == 0, "sum_squares: %d lengths off", bad);

    /* softmax: large offsets must not overflow */
    float s[N];
    for (int i = 0; i < N; i++) s[i] = x[i] + 1000.0f;
    double mx = -INFINITY, sum = 0;
    /* (not fmax: gcc 12 for aarch64 crashes vectorizing that reduction) */
    for (int i = 0; i < N; i++)
        if (s[i] > mx) mx = s[i];
    for (int i = 0; i < N; i++) sum += exp((double)s[i] - mx);
    float copy[N];
    memcpy(copy, s, sizeof s);
    lp_softmax(s, N);
    bad = 0;
    double total = 0;
    for (int i = 0; i < N; i++) {
        double want = exp((double)copy[i] - mx) / sum;
        bad += !(fabs(s[i] - want) <= 1e-6 * want + 1e-12);
        total += s[i];
    }
    CHECK_MSG(bad == 0, "softmax: %d off", bad);
    CHECK_NEAR(total, 1.0, 1e-5);
    float one[1] = {-5.0f};
    lp_softmax(one, 1);
    CHECK(one[0] == 1.0f);

    /* silu(g) * u */
    for (int i = 0; i < N; i++) {
        g[i] = x[i] * 4.0f;
        u[i] = w[i];
    }
    g[0] = -100.0f;
    g[1] = 100.0f;
    float gc[N];
    memcpy(gc, g, sizeof g);
    lp_silu_mul(g, u, N);
    bad = 0;
    for (int i = 0; i < N; i++) {
        double want = gc[i] / (1.0 + exp(-(double)gc[i])) * u[i];
        bad += !(fabs(g[i] - want) <= 1e-6 * fabs(want) + 1e-30);
    }
    CHECK_MSG(bad == 0, "silu_mul: %d off", bad);

    /* axpy */
    memcpy(out, w, sizeof w);
    lp_axpy(out, 0.5f, x, N);
    bad = 0;
    for (int i = 0; i < N; i++) bad += out[i] != w[i] + 0.5f * x[i];
    CHECK(bad == 0);

    /* every dot_f32, all lengths up to 100 and a long one */
    level_setup levels[4];
    int n_levels = supported_levels(levels);
    for (int l = 0; l < n_levels; l++) {
        bad = 0;
        for (int n = 0; n <= N; n += n < 100 ? 1 : 900) {
            double want = 0, mag = 0;
            for (int i = 0; i < n; i++) {
                want += (double)x[i] * w[i];
                mag += fabs((double)x[i] * w[i]);
            }
            float got = levels[l].k.dot_f32(x, w, n);
            bad += !(fabs(got - want) <= 1e-5 * mag + 1e-30);
        }
        CHECK_MSG(bad == 0, "dot_f32 %s: %d lengths off", levels[l].name, bad);
    }

    /* every level's axpy (bit-identical), softmax and silu_mul (within a few
     * ulp of the double-precision formula), all lengths up to 100 */
    for (int l = 0; l < n_levels; l++) {
        const lp_kernels *k = &levels[l].k;
        int bad_axpy = 0, bad_soft = 0, bad_silu = 0;
        for (int n = 1; n <= 100; n++) {
            float a[N], b[N], e[N];
            memcpy(a, w, (size_t)n * sizeof(float));
            memcpy(b, w, (size_t)n * sizeof(float));
            lp_axpy(a, -0.75f, x, n);
            k->axpy_f32(b, -0.75f, x, n);
            bad_axpy += memcmp(a, b, (size_t)n * sizeof(float)) != 0;
            for (int i = 0; i < n; i++) e[i] = x[i] * 30.0f; /* scores from -15 to 15 and beyond */
            memcpy(a, e, (size_t)n * sizeof(float));
            k->softmax(a, n);
            double mx = e[0], sum = 0;
            for (int i = 1; i < n; i++) mx = e[i] > mx ? e[i] : mx;
            for (int i = 0; i < n; i++) sum += exp((double)e[i] - mx);
            for (int i = 0; i < n; i++) {
                double want = exp((double)e[i] - mx) / sum;
                bad_soft += !(fabs(a[i] - want) <= 1e-6 * want + 1e-37);
            }
            for (int i = 0; i < n; i++) a[i] = x[i] * 12.0f;
            memcpy(b, a, (size_t)n * sizeof(float));
            k->silu_mul(a, w, n);
            for (int i = 0; i < n; i++) {
                double want = b[i] / (1.0 + exp(-(double)b[i])) * w[i];
                bad_silu += !(fabs(a[i] - want) <= 1e-6 * fabs(want) + 1e-30);
            }
        }
        CHECK_MSG(bad_axpy == 0, "axpy %s: %d lengths differ from the reference", levels[l].name, bad_axpy);
        CHECK_MSG(bad_soft == 0, "softmax %s: %d values off", levels[l].name, bad_soft);
        CHECK_MSG(bad_silu == 0, "silu_mul %s: %d values off", levels[l].name, bad_silu);
    }

    /* every level's attention scores (keys transposed) against double sums
     * and bit for bit against the reference (1 to 9 heads so the 8- and
     * 4-head blocks end anywhere; 1 to 37 keys, across the 16- and 32-key
     * vectors, with padded strides; head dims with and without a tail), and
     * a score that does not depend on the run it came in: each key alone
     * gives the same bits */
    for (int l = 0; l < n_levels; l++) {
        const lp_kernels *k = &levels[l].k;
        int bad_scores = 0, bad_ref = 0, bad_alone = 0;
        static const int dims[] = {8, 48, 64, 100};
        static const int keys[] = {1, 7, 16, 21, 32, 37};
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (size_t ki = 0; ki < sizeof keys / sizeof keys[0]; ki++)
                for (int nq = 1; nq <= 9; nq += 2) {
                    int d = dims[di], nk = keys[ki], kt_stride = nk + 3;
                    enum { QMAX = 9 * 100, KMAX = 100 * 40, SMAX = 9 * 40 };
                    static float q[QMAX], kt[KMAX], s1[SMAX], s2[SMAX], s_ref[SMAX];
                    for (int i = 0; i < nq * d; i++) q[i] = x[(i * 7 + di) % N];
                    for (int i = 0; i < d * kt_stride; i++) kt[i] = w[(i * 3 + ki) % N];
                    k->attn_scores(q, d, nq, kt, false, kt_stride, nk, d, 0.125f, s1, nk);
                    lp_attn_scores(q, d, nq, kt, false, kt_stride, nk, d, 0.125f, s_ref, nk);
                    bad_ref += memcmp(s1, s_ref, (size_t)(nq * nk) * sizeof(float)) != 0;
                    for (int j = 0; j < nk; j++) {
                        k->attn_scores(q, d, nq, kt + j, false, kt_stride, 1, d, 0.125f, s2 + j, nk);
                        for (int h = 0; h < nq; h++) {
                            double want = 0, mag = 0;
                            for (int c = 0; c < d; c++) {
                                double t = (double)q[h * d + c] * kt[c * kt_stride + j];
                                want += t;
                                mag += fabs(t);
                            }
                            bad_scores += !(fabs(s1[h * nk + j] - 0.125 * want) <= 1e-6 * mag + 1e-30);
                        }
                    }
                    bad_alone += memcmp(s1, s2, (size_t)(nq * nk) * sizeof(float)) != 0;
                }
        CHECK_MSG(bad_scores == 0, "attn_scores %s: %d scores off", levels[l].name, bad_scores);
        CHECK_MSG(bad_ref == 0, "attn_scores %s: %d cases differ from the reference's bits", levels[l].name, bad_ref);
        CHECK_MSG(bad_alone == 0, "attn_scores %s: %d cases depend on the run a key came in", levels[l].name,
                  bad_alone);
    }

    /* every level's attention mix against double sums (keys forwards and
     * backwards), and an output that does not depend on the run it came
     * in: each value row alone gives the same bits */
    for (int l = 0; l < n_levels; l++) {
        const lp_kernels *k = &levels[l].k;
        int bad_mix = 0, bad_alone = 0;
        static const int dims[] = {8, 48, 64, 100, 128};
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (int nq = 1; nq <= 9; nq += 2)
                for (int dir = 1; dir >= -1; dir -= 2) {
                    int d = dims[di], nk = 7;
                    if (nq * d + 17 > N || nk * d + 17 > N) continue; /* stay inside x and w */
                    const float *v0 = dir > 0 ? x + 17 : x + 17 + (nk - 1) * d;
                    float p[9 * 7], o1[9 * 128], o2[9 * 128];
                    for (int i = 0; i < nq * nk; i++) p[i] = w[i] * 0.5f;
                    for (int i = 0; i < nq * d; i++) o1[i] = o2[i] = x[i + 3];
                    k->attn_mix(o1, d, nq, p, nk, v0, false, dir * d, nk, d);
                    for (int j = 0; j < nk; j++) k->attn_mix(o2, d, nq, p + j, nk, v0 + j * dir * d, false, dir * d, 1, d);
                    bad_alone += memcmp(o1, o2, (size_t)(nq * d) * sizeof(float)) != 0;
                    for (int h = 0; h < nq; h++)
                        for (int i = 0; i < d; i++) {
                            double want = x[h * d + i + 3], mag = fabs(want);
                            for (int j = 0; j < nk; j++) {
                                double t = (double)p[h * nk + j] * v0[j * dir * d + i];
                                want += t;
                                mag += fabs(t);
                            }
                            bad_mix += !(fabs(o1[h * d + i] - want) <= 1e-6 * mag + 1e-30);
                        }
                }
        CHECK_MSG(bad_mix == 0, "attn_mix %s: %d outputs off", levels[l].name, bad_mix);
        CHECK_MSG(bad_alone == 0, "attn_mix %s: %d cases depend on the run a value came in", levels[l].name,
                  bad_alone);
    }
}

/* The KV cache's f16 storage: every level's round_f16 gives the bits of
 * lp_f32_to_f16 (ties, subnormals, overflow), and the attention kernels
 * read an f16 key or value as exactly its f32 value: same scores, same
 * outputs, bit for bit, forwards and backwards. */
static void test_f16_kv(void) {
    level_setup levels[4];
    int n_levels = supported_levels(levels);
    enum { NK = 9, NQ = 8, NR = 64, DMAX = 272 };
    lp_rng rng;
    lp_rng_seed(&rng, 41);
    static const float edge[] = {0.0f, -0.0f, 65504.0f, 65520.0f, -65519.0f, 1e-8f, 2.98023224e-8f, 5.96046448e-8f,
                                 6.1035156e-5f, 6.1e-5f, 1.00048828125f, 1.00146484375f, 3.0e38f, -1e-30f};
    float vals[NR + 14], want[NR + 14];
    for (int i = 0; i < NR; i++) vals[i] = (lp_rng_uniform(&rng) - 0.5f) * (float)(1 << (i % 20)) * 1e-3f;
    memcpy(vals + NR, edge, sizeof edge);
    for (int i = 0; i < NR + 14; i++) want[i] = lp_f16_to_f32(lp_f32_to_f16(vals[i]));
    for (int l = 0; l < n_levels; l++) {
        float got[NR + 14];
        memcpy(got, vals, sizeof got);
        levels[l].k.round_f16(got, NR + 14);
        CHECK_MSG(memcmp(got, want, sizeof got) == 0, "round_f16 %s differs from lp_f32_to_f16", levels[l].name);
        uint16_t bits[NR + 14];
        levels[l].k.to_f16(bits, vals, NR + 14);
        int bad = 0;
        for (int i = 0; i < NR + 14; i++) bad += bits[i] != lp_f32_to_f16(vals[i]);
        CHECK_MSG(bad == 0, "to_f16 %s: %d values differ from lp_f32_to_f16", levels[l].name, bad);
    }
    /* an odd-sized head (vector tails) and a wide one */
    static float q[NQ * DMAX], kf[NK * DMAX], vf[NK * DMAX], p[NQ * NK];
    static uint16_t kh[NK * DMAX], vh[NK * DMAX];
    static const int dims[] = {100, DMAX};
    for (int di = 0; di < 2; di++) {
        int D = dims[di];
        for (int i = 0; i < NQ * D; i++) q[i] = lp_rng_uniform(&rng) - 0.5f;
        for (int i = 0; i < NK * D; i++) {
            kh[i] = lp_f32_to_f16(lp_rng_uniform(&rng) * 4.0f - 2.0f);
            vh[i] = lp_f32_to_f16(lp_rng_uniform(&rng) * 4.0f - 2.0f);
            kf[i] = lp_f16_to_f32(kh[i]);
            vf[i] = lp_f16_to_f32(vh[i]);
        }
        for (int i = 0; i < NQ * NK; i++) p[i] = lp_rng_uniform(&rng) / NK;
        for (int l = 0; l < n_levels; l++) {
            const lp_kernels *k = &levels[l].k;
            int bad = 0;
            for (int nq = 1; nq <= NQ; nq += 3)
                for (int dir = 1; dir >= -1; dir -= 2) {
                    int64_t at = dir > 0 ? 0 : (int64_t)(NK - 1) * D;
                    static float s_f[NQ * NK], s_h[NQ * NK], o_f[NQ * DMAX], o_h[NQ * DMAX];
                    memset(o_f, 0, sizeof o_f);
                    memset(o_h, 0, sizeof o_h);
                    /* kf / kh as transposed keys: D rows of NK */
                    k->attn_scores(q, D, nq, kf, false, NK, NK, D, 0.125f, s_f, NK);
                    k->attn_scores(q, D, nq, kh, true, NK, NK, D, 0.125f, s_h, NK);
                    bad += memcmp(s_f, s_h, (size_t)(nq * NK) * sizeof(float)) != 0;
                    k->attn_mix(o_f, D, nq, p, NK, vf + at, false, dir * D, NK, D);
                    k->attn_mix(o_h, D, nq, p, NK, vh + at, true, dir * D, NK, D);
                    bad += memcmp(o_f, o_h, (size_t)(nq * D) * sizeof(float)) != 0;
                }
            CHECK_MSG(bad == 0, "attention %s, head dim %d: %d cases where f16 K/V differ from their f32 values",
                      levels[l].name, D, bad);
        }
    }
}

int main(void) {
    test_f16();
    test_dequant_simple();
    test_dequant_k();
    test_roundtrip();
    test_matmul();
    test_batch_invariance();
    test_ops();
    test_f16_kv();
    return check_summary("kernels");
}
