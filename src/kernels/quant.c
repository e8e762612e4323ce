/* Element types: dequantization and reference quantization.
 *
 * Block layouts are GGML's (all little-endian, f16 = IEEE half):
 *
 *   Q4_0 (32 elems, 18 B): f16 d, u8 qs[16]. Element j (<16) is the low
 *        nibble of qs[j], element j+16 the high nibble; value (q - 8) * d.
 *   Q4_1 (32, 20 B): f16 d, f16 m, qs[16] as Q4_0; value q * d + m.
 *   Q5_0 (32, 22 B): f16 d, u32 qh, qs[16]. Low 4 bits as Q4_0; the 5th bit
 *        of element j is bit j of qh; value (q - 16) * d.
 *   Q5_1 (32, 24 B): f16 d, f16 m, qh, qs[16]; value q * d + m.
 *   Q8_0 (32, 34 B): f16 d, i8 qs[32]; value q * d.
 *   Q4_K (256, 144 B): f16 d, f16 dmin, u8 scales[12], u8 qs[128]. Eight
 *        sub-blocks of 32, each with a 6-bit scale sc and 6-bit min m packed
 *        in scales[] (see unpack_scale_min). Sub-blocks 2p and 2p+1 share
 *        qs[32p..32p+31]: low nibbles for 2p, high nibbles for 2p+1.
 *        value (d * sc) * q - (dmin * m).
 *   Q5_K (256, 176 B): as Q4_K plus u8 qh[32] before qs: the 5th bit of
 *        element l of sub-block s is bit s of qh[l].
 *   Q6_K (256, 210 B): u8 ql[128], u8 qh[64], i8 scales[16], f16 d. Sixteen
 *        sub-blocks of 16 (scale index = element / 16). Each half of 128
 *        elements uses 64 bytes of ql and 32 of qh: element l, 32+l, 64+l,
 *        96+l take ql[l] low, ql[32+l] low, ql[l] high, ql[32+l] high, and
 *        qh[l] bits 0-1, 2-3, 4-5, 6-7 as their top two bits;
 *        value (d * scale) * (q - 32).
 *
 * The dequantizers evaluate in the same order as llama.cpp's reference C
 * code, so the floats come out bit-identical. */
#include "kernels_internal.h"

#include <math.h>
#include <string.h>

#if defined(__clang__)
/* A fused multiply-add would change the last bit of d*q - m. */
#pragma STDC FP_CONTRACT OFF
#endif

#define QK 32     /* elements per block of the simple quants */
#define INLINE static inline __attribute__((always_inline))
#define QK_K 256  /* elements per K-quant superblock */

static inline float read_f16(const uint8_t *p) {
    return lp_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

static inline float read_bf16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h); /* little-endian host, like the files */
    return lp_bf16_to_f32(h);
}

static inline void write_f16(uint8_t *p, uint16_t h) {
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

/* ---- dequantization, one block at a time ----------------------------------- */

INLINE void dequant_q4_0(const uint8_t *restrict b, float *restrict y) {
    float d = read_f16(b);
    const uint8_t *qs = b + 2;
    /* two simple loops vectorize better than one with two stores */
    for (int j = 0; j < QK / 2; j++) y[j] = (float)((qs[j] & 0x0f) - 8) * d;
    for (int j = 0; j < QK / 2; j++) y[j + QK / 2] = (float)((qs[j] >> 4) - 8) * d;
}

INLINE void dequant_q4_1(const uint8_t *restrict b, float *restrict y) {
    float d = read_f16(b), m = read_f16(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < QK / 2; j++) y[j] = (float)(qs[j] & 0x0f) * d + m;
    for (int j = 0; j < QK / 2; j++) y[j + QK / 2] = (float)(qs[j] >> 4) * d + m;
}

static inline uint32_t read_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

INLINE void dequant_q5_0(const uint8_t *restrict b, float *restrict y) {
    float d = read_f16(b);
    uint32_t qh = read_u32(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < QK / 2; j++) {
        int hi0 = (int)((qh >> j) & 1) << 4, hi1 = (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = (float)(((qs[j] & 0x0f) | hi0) - 16) * d;
        y[j + QK / 2] = (float)(((qs[j] >> 4) | hi1) - 16) * d;
    }
}

INLINE void dequant_q5_1(const uint8_t *restrict b, float *restrict y) {
    float d = read_f16(b), m = read_f16(b + 2);
    uint32_t qh = read_u32(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < QK / 2; j++) {
        int hi0 = (int)((qh >> j) & 1) << 4, hi1 = (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = (float)((qs[j] & 0x0f) | hi0) * d + m;
        y[j + QK / 2] = (float)((qs[j] >> 4) | hi1) * d + m;
    }
}

INLINE void dequant_q8_0(const uint8_t *restrict b, float *restrict y) {
    float d = read_f16(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < QK; j++) y[j] = (float)qs[j] * d;
}

/* Scale and min of K-quant sub-block j (0..7) from the 12 packed bytes:
 * sub-blocks 0-3 keep 6 bits in bytes j (scale) and j+4 (min); sub-blocks
 * 4-7 keep their low 4 bits in byte j+4 (scale low nibble, min high nibble)
 * and their top 2 bits in the spare top bits of bytes j-4 and j. */
static inline void unpack_scale_min(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

INLINE void dequant_q4_k(const uint8_t *restrict b, float *restrict y) {
    float d = read_f16(b), dmin = read_f16(b + 2);
    const uint8_t *scales = b + 4, *qs = b + 16;
    for (int p = 0; p < 4; p++) {
        int sc, m;
        unpack_scale_min(2 * p, scales, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        unpack_scale_min(2 * p + 1, scales, &sc, &m);
        float d2 = d * (float)sc, m2 = dmin * (float)m;
        const uint8_t *q = qs + 32 * p;
        for (int l = 0; l < 32; l++) y[64 * p + l] = d1 * (float)(q[l] & 0x0f) - m1;
        for (int l = 0; l < 32; l++) y[64 * p + 32 + l] = d2 * (float)(q[l] >> 4) - m2;
    }
}

INLINE void dequant_q5_k(const uint8_t *restrict b, float *restrict y) {
    float d = read_f16(b), dmin = read_f16(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + 48;
    for (int p = 0; p < 4; p++) {
        int sc, m;
        unpack_scale_min(2 * p, scales, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        unpack_scale_min(2 * p + 1, scales, &sc, &m);
        float d2 = d * (float)sc, m2 = dmin * (float)m;
        const uint8_t *q = qs + 32 * p;
        int lo_bit = 2 * p, hi_bit = 2 * p + 1;
        for (int l = 0; l < 32; l++)
            y[64 * p + l] = d1 * (float)((q[l] & 0x0f) + (((qh[l] >> lo_bit) & 1) << 4)) - m1;
        for (int l = 0; l < 32; l++)
            y[64 * p + 32 + l] = d2 * (float)((q[l] >> 4) + (((qh[l] >> hi_bit) & 1) << 4)) - m2;
    }
}

INLINE void dequant_q6_k(const uint8_t *restrict b, float *restrict y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = read_f16(b + 208);
    /* Quarter g of each half: low nibbles of ql[0..31] (g=0), of
     * ql[32..63] (g=1), then the high nibbles (g=2, 3); qh bits 2g, 2g+1.
     * (d * scale) * q is the reference's d * scale * q, evaluated once per
     * 16 elements. */
    for (int half = 0; half < 2; half++) {
        for (int g = 0; g < 4; g++) {
            const uint8_t *lo = ql + 32 * (g & 1);
            int lo_shift = 4 * (g >> 1), hi_shift = 2 * g;
            for (int s = 0; s < 2; s++) {
                float ds = d * (float)sc[2 * g + s];
                for (int l = 16 * s; l < 16 * s + 16; l++) {
                    int q = (((lo[l] >> lo_shift) & 0x0f) | (((qh[l] >> hi_shift) & 3) << 4)) - 32;
                    y[32 * g + l] = ds * (float)q;
                }
            }
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

/* Decodes `blocks` consecutive blocks. Defined twice from one body: a
 * portable copy and one the compiler may vectorize for AVX2 (same
 * arithmetic, no contraction, so the same bits). */
#define DEFINE_DEQUANT_BLOCKS(name, attr)                                                 \
    attr static void name(uint32_t type, const uint8_t *s, float *dst, int64_t blocks) { \
        switch (type) {                                                                   \
        case LP_Q4_0: for (int64_t i = 0; i < blocks; i++) dequant_q4_0(s + i * 18, dst + i * QK); break;    \
        case LP_Q4_1: for (int64_t i = 0; i < blocks; i++) dequant_q4_1(s + i * 20, dst + i * QK); break;    \
        case LP_Q5_0: for (int64_t i = 0; i < blocks; i++) dequant_q5_0(s + i * 22, dst + i * QK); break;    \
        case LP_Q5_1: for (int64_t i = 0; i < blocks; i++) dequant_q5_1(s + i * 24, dst + i * QK); break;    \
        case LP_Q8_0: for (int64_t i = 0; i < blocks; i++) dequant_q8_0(s + i * 34, dst + i * QK); break;    \
        case LP_Q4_K: for (int64_t i = 0; i < blocks; i++) dequant_q4_k(s + i * 144, dst + i * QK_K); break; \
        case LP_Q5_K: for (int64_t i = 0; i < blocks; i++) dequant_q5_k(s + i * 176, dst + i * QK_K); break; \
        case LP_Q6_K: for (int64_t i = 0; i < blocks; i++) dequant_q6_k(s + i * 210, dst + i * QK_K); break; \
        case LP_BF16: for (int64_t i = 0; i < blocks; i++) dst[i] = read_bf16(s + 2 * i); break;             \
        default: break; /* unsupported types never get here */                            \
        }                                                                                 \
    }

DEFINE_DEQUANT_BLOCKS(dequant_blocks, )
#if defined(__x86_64__)
DEFINE_DEQUANT_BLOCKS(dequant_blocks_avx2, __attribute__((target("avx2,fma,f16c"))))
#endif

static void dequantize_row_level(int level, uint32_t type, const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    switch (type) {
    case LP_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    case LP_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = read_f16(s + 2 * i);
        return;
    default:
        break;
    }
    const lp_dtype_info *info = lp_dtype_get(type);
    /* callers check lp_dtype_info.supported first; packed types need the
     * whole matrix (lp_weight_dequantize_row) */
    if (!info || !info->supported || lp_dtype_is_packed(type)) {
        memset(dst, 0, (size_t)n * sizeof(float));
        return;
    }
    int64_t blocks = n / info->block_elems;
#if defined(__x86_64__)
    if (level > 0) {
        if (type == LP_Q4_0) lp_dequant_q4_0_avx2(s, dst, blocks);
        else if (type == LP_Q8_0) lp_dequant_q8_0_avx2(s, dst, blocks);
        else dequant_blocks_avx2(type, s, dst, blocks);
        return;
    }
#endif
    (void)level;
    dequant_blocks(type, s, dst, blocks);
}

void lp_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n) {
    dequantize_row_level(0, type, src, dst, n);
}

void lp_dequantize_row_fast(int level, uint32_t type, const void *src, float *dst, int64_t n) {
    dequantize_row_level(level, type, src, dst, n);
}

/* ---- reference quantization ------------------------------------------------ */

/* Rounds to nearest and clamps to [lo, hi] in float first, so NaN or huge
 * inputs never reach an undefined float-to-int conversion. */
static inline int quant_clamp(float v, int lo, int hi) {
    v = roundf(v);
    if (!(v >= (float)lo)) return lo;
    if (v > (float)hi) return hi;
    return (int)v;
}

/* The f16 nearest to x but not below it (x >= 0): a scale stored this way
 * never shrinks, so the largest value still fits in the quant range. */
static uint16_t f16_round_up(float x) {
    uint16_t h = lp_f32_to_f16(x);
    if (lp_f16_to_f32(h) < x && h < 0x7bff) h++;
    return h;
}

/* Signed value of largest magnitude. */
static float signed_absmax(const float *x, int n) {
    float amax = 0, max = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    return max;
}

/* Q4_0/Q5_0: the value of largest magnitude maps to the bottom code
 * -levels/2 exactly (so d may be negative, as in llama.cpp). The id uses the
 * stored (rounded) d so the error stays within |d|/2. */
static void quant_q4_0(const float *x, uint8_t *b) {
    float max = signed_absmax(x, QK);
    uint16_t dh = lp_f32_to_f16(max / -8.0f);
    float d = lp_f16_to_f32(dh), id = d != 0 ? 1.0f / d : 0.0f;
    write_f16(b, dh);
    for (int j = 0; j < QK / 2; j++) {
        int q0 = quant_clamp(x[j] * id, -8, 7) + 8;
        int q1 = quant_clamp(x[j + QK / 2] * id, -8, 7) + 8;
        b[2 + j] = (uint8_t)(q0 | (q1 << 4));
    }
}

static void quant_q5_0(const float *x, uint8_t *b) {
    float max = signed_absmax(x, QK);
    uint16_t dh = lp_f32_to_f16(max / -16.0f);
    float d = lp_f16_to_f32(dh), id = d != 0 ? 1.0f / d : 0.0f;
    write_f16(b, dh);
    uint32_t qh = 0;
    for (int j = 0; j < QK / 2; j++) {
        int q0 = quant_clamp(x[j] * id, -16, 15) + 16;
        int q1 = quant_clamp(x[j + QK / 2] * id, -16, 15) + 16;
        b[6 + j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
        qh |= (uint32_t)(q0 >> 4) << j;
        qh |= (uint32_t)(q1 >> 4) << (j + 16);
    }
    for (int i = 0; i < 4; i++) b[2 + i] = (uint8_t)(qh >> (8 * i));
}

/* Q4_1/Q5_1: affine over [min, max] with `levels` steps. */
static void affine_params(const float *x, int levels, uint8_t *b, float *d, float *m) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < QK; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    uint16_t dh = f16_round_up((hi - lo) / (float)levels), mh = lp_f32_to_f16(lo);
    write_f16(b, dh);
    write_f16(b + 2, mh);
    *d = lp_f16_to_f32(dh);
    *m = lp_f16_to_f32(mh);
}

static void quant_q4_1(const float *x, uint8_t *b) {
    float d, m;
    affine_params(x, 15, b, &d, &m);
    float id = d != 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < QK / 2; j++) {
        int q0 = quant_clamp((x[j] - m) * id, 0, 15);
        int q1 = quant_clamp((x[j + QK / 2] - m) * id, 0, 15);
        b[4 + j] = (uint8_t)(q0 | (q1 << 4));
    }
}

static void quant_q5_1(const float *x, uint8_t *b) {
    float d, m;
    affine_params(x, 31, b, &d, &m);
    float id = d != 0 ? 1.0f / d : 0.0f;
    uint32_t qh = 0;
    for (int j = 0; j < QK / 2; j++) {
        int q0 = quant_clamp((x[j] - m) * id, 0, 31);
        int q1 = quant_clamp((x[j + QK / 2] - m) * id, 0, 31);
        b[8 + j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
        qh |= (uint32_t)(q0 >> 4) << j;
        qh |= (uint32_t)(q1 >> 4) << (j + 16);
    }
    for (int i = 0; i < 4; i++) b[4 + i] = (uint8_t)(qh >> (8 * i));
}

static void quant_q8_0(const float *x, uint8_t *b) {
    float amax = 0;
    for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
    uint16_t dh = f16_round_up(amax / 127.0f);
    float d = lp_f16_to_f32(dh), id = d != 0 ? 1.0f / d : 0.0f;
    write_f16(b, dh);
    for (int j = 0; j < QK; j++) b[2 + j] = (uint8_t)(int8_t)quant_clamp(x[j] * id, -127, 127);
}

/* Q4_K/Q5_K (levels = 15 or 31). A simple, non-searching choice:
 *  1. each sub-block's min (<= 0) is stored as m * dmin with m rounded UP,
 *     so x + m*dmin >= 0 for every element;
 *  2. its scale covers [0, max + m*dmin] in `levels` steps, stored as
 *     sc * d with sc rounded UP so the top value still fits;
 *  3. elements are rounded to nearest against the stored (quantized)
 *     scale and min, so the error is at most d*sc/2. */
static void quant_k_common(const float *x, int levels, uint8_t *b, uint8_t q[QK_K]) {
    float mins[8], dms[8], scales[8], max_min = 0, max_scale = 0;
    for (int s = 0; s < 8; s++) {
        float lo = 0;
        for (int l = 0; l < 32; l++) lo = fminf(lo, x[32 * s + l]);
        mins[s] = -lo;
        max_min = fmaxf(max_min, mins[s]);
    }
    uint16_t dminh = f16_round_up(max_min / 63.0f);
    float dmin = lp_f16_to_f32(dminh);
    int sc[8], m[8];
    for (int s = 0; s < 8; s++) {
        m[s] = dmin > 0 ? (int)fminf(ceilf(mins[s] / dmin), 63.0f) : 0;
        dms[s] = dmin * (float)m[s];
        float hi = 0;
        for (int l = 0; l < 32; l++) hi = fmaxf(hi, x[32 * s + l] + dms[s]);
        scales[s] = hi / (float)levels;
        max_scale = fmaxf(max_scale, scales[s]);
    }
    uint16_t dh = f16_round_up(max_scale / 63.0f);
    float d = lp_f16_to_f32(dh);
    for (int s = 0; s < 8; s++) {
        sc[s] = d > 0 ? (int)fminf(ceilf(scales[s] / d), 63.0f) : 0;
        float ds = d * (float)sc[s], ids = ds > 0 ? 1.0f / ds : 0.0f;
        for (int l = 0; l < 32; l++) q[32 * s + l] = (uint8_t)quant_clamp((x[32 * s + l] + dms[s]) * ids, 0, levels);
    }
    write_f16(b, dh);
    write_f16(b + 2, dminh);
    uint8_t *packed = b + 4;
    for (int j = 0; j < 4; j++) {
        packed[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        packed[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
        packed[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
    }
}

static void quant_q4_k(const float *x, uint8_t *b) {
    uint8_t q[QK_K];
    quant_k_common(x, 15, b, q);
    uint8_t *qs = b + 16;
    for (int p = 0; p < 4; p++)
        for (int l = 0; l < 32; l++) qs[32 * p + l] = (uint8_t)(q[64 * p + l] | (q[64 * p + 32 + l] << 4));
}

static void quant_q5_k(const float *x, uint8_t *b) {
    uint8_t q[QK_K];
    quant_k_common(x, 31, b, q);
    uint8_t *qh = b + 16, *qs = b + 48;
    memset(qh, 0, 32);
    for (int p = 0; p < 4; p++)
        for (int l = 0; l < 32; l++) {
            int lo = q[64 * p + l], hi = q[64 * p + 32 + l];
            qs[32 * p + l] = (uint8_t)((lo & 0x0f) | ((hi & 0x0f) << 4));
            qh[l] |= (uint8_t)(((lo >> 4) << (2 * p)) | ((hi >> 4) << (2 * p + 1)));
        }
}

/* Q6_K: symmetric, codes -31..31 (one level unused keeps it simple), int8
 * sub-block scales rounded up against the f16 superblock scale. */
static void quant_q6_k(const float *x, uint8_t *b) {
    float scales[16], max_scale = 0;
    for (int s = 0; s < 16; s++) {
        float amax = 0;
        for (int l = 0; l < 16; l++) amax = fmaxf(amax, fabsf(x[16 * s + l]));
        scales[s] = amax / 31.0f;
        max_scale = fmaxf(max_scale, scales[s]);
    }
    uint16_t dh = f16_round_up(max_scale / 127.0f);
    float d = lp_f16_to_f32(dh);
    uint8_t *ql = b, *qh = b + 128;
    int8_t *sc = (int8_t *)(b + 192);
    uint8_t q[QK_K];
    for (int s = 0; s < 16; s++) {
        int scale = d > 0 ? (int)fminf(ceilf(scales[s] / d), 127.0f) : 0;
        sc[s] = (int8_t)scale;
        float ds = d * (float)scale, ids = ds > 0 ? 1.0f / ds : 0.0f;
        for (int l = 0; l < 16; l++) q[16 * s + l] = (uint8_t)(quant_clamp(x[16 * s + l] * ids, -32, 31) + 32);
    }
    write_f16(b + 208, dh);
    memset(qh, 0, 64);
    for (int half = 0; half < 2; half++) {
        const uint8_t *qq = q + 128 * half;
        uint8_t *l_out = ql + 64 * half, *h_out = qh + 32 * half;
        for (int l = 0; l < 32; l++) {
            l_out[l] = (uint8_t)((qq[l] & 0x0f) | ((qq[l + 64] & 0x0f) << 4));
            l_out[l + 32] = (uint8_t)((qq[l + 32] & 0x0f) | ((qq[l + 96] & 0x0f) << 4));
            h_out[l] = (uint8_t)((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) |
                                 ((qq[l + 96] >> 4) << 6));
        }
    }
}

bool lp_quantize_row(uint32_t type, const float *src, void *dst, int64_t n) {
    uint8_t *d = dst;
    void (*fn)(const float *, uint8_t *) = NULL;
    switch (type) {
    case LP_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return true;
    case LP_F16:
    case LP_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = type == LP_F16 ? lp_f32_to_f16(src[i]) : lp_f32_to_bf16(src[i]);
            write_f16(d + 2 * i, h);
        }
        return true;
    case LP_Q4_0: fn = quant_q4_0; break;
    case LP_Q4_1: fn = quant_q4_1; break;
    case LP_Q5_0: fn = quant_q5_0; break;
    case LP_Q5_1: fn = quant_q5_1; break;
    case LP_Q8_0: fn = quant_q8_0; break;
    case LP_Q4_K: fn = quant_q4_k; break;
    case LP_Q5_K: fn = quant_q5_k; break;
    case LP_Q6_K: fn = quant_q6_k; break;
    default: return false;
    }
    const lp_dtype_info *info = lp_dtype_get(type);
    if (n % info->block_elems != 0) return false;
    for (int64_t i = 0; i < n / info->block_elems; i++)
        fn(src + i * info->block_elems, d + i * info->block_bytes);
    return true;
}
