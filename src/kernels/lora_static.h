/* The LoRA branch of an adapter under a QUAD shared profile (formats/lpq.h):
 * integer codes for A and B with the profile's affine encodings, and static
 * activation encodings for the shrink's input and output, so the branch is
 * two integer dot products with no per-row range search:
 *
 *   cx_k = code(x_k; ex)                                 (0..255)
 *   t_j = (ex.scale * ea_j.scale) * sum_k (cx_k - ex.zero) (qa_jk - ea_j.zero)   (exact integer sum)
 *   ct_j = code(t_j; et)                                 (0..255)
 *   y_o += (scale * et.scale * eb_o.scale) * sum_j (ct_j - et.zero) (qb_oj - eb_o.zero)
 *
 * ea_j / eb_o are the row's encodings (index 0 for per-tensor profiles).
 * The float steps are exactly these, in this order, and the sums are exact
 * integers, so any implementation computing them gives the same bits. */
#ifndef LP_LORA_STATIC_H
#define LP_LORA_STATIC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../formats/lpq.h"

typedef struct lp_lora_static {
    const uint8_t *qa;       /* A's codes, [rank][in] (lp_lora_static_a_at) */
    const uint8_t *qb;       /* B's codes in the branch's layout (lp_lora_static_b_at) */
    bool packed;             /* 4-bit codes, two to a byte (lp_lora_static_code) */
    const int64_t *sum_a;    /* [rank] sums of A's rows' codes */
    int rank, in, out;
    const lp_qenc *ea, *eb;  /* [na], [nb] */
    uint32_t na, nb;         /* 1 or rank / out */
    lp_qenc x, t;
    int act_qmax;            /* 255 */
    float scale;             /* the adapter's alpha / rank */
} lp_lora_static;

/* B's codes as the expand reads them: blocks of 16 outputs, each block
 * [ceil(rank / 4)][16][4], the four rank positions of a quad side by side
 * per output (one 32-bit lane of a vpdpbusd), so a block is one 64-byte
 * vector per quad and all of B one forward stream; positions past the rank
 * and outputs past the last hold 0. */
#define LP_LORA_STATIC_B_BLOCK 16
static inline size_t lp_lora_static_b_at(int rank, int j, int o) {
    size_t nq = (size_t)(rank + 3) / 4, blk = LP_LORA_STATIC_B_BLOCK;
    return (((size_t)o / blk * nq + (size_t)j / 4) * blk + (size_t)o % blk) * 4 + (size_t)j % 4;
}
#define LP_LORA_STATIC_B_CODES(rank, out)                                                            \
    ((size_t)(((out) + LP_LORA_STATIC_B_BLOCK - 1) / LP_LORA_STATIC_B_BLOCK) * LP_LORA_STATIC_B_BLOCK * 4 * \
     (size_t)(((rank) + 3) / 4))

/* Position of A's code (j, k): row after row; packed rows are padded to a
 * multiple of 64 codes (with code 0). */
static inline size_t lp_lora_static_a_at(int in, bool packed, int j, int k) {
    return (size_t)j * (packed ? (size_t)(in + 63) / 64 * 64 : (size_t)in) + (size_t)k;
}
#define LP_LORA_STATIC_A_CODES(rank, in, packed) lp_lora_static_a_at(in, packed, rank, 0)

/* Code arrays hold one code a byte or, packed (4-bit codes), each run of 64
 * positions in 32 bytes: positions 0..31 in the low nibbles of bytes 0..31,
 * 32..63 in the high ones, so one shift and mask make a vector of 64. */
static inline int lp_lora_static_code(const uint8_t *codes, size_t at, bool packed) {
    if (!packed) return codes[at];
    uint8_t b = codes[at / 64 * 32 + at % 32];
    return at % 64 < 32 ? b & 15 : b >> 4;
}
static inline void lp_lora_static_set_code(uint8_t *codes, size_t at, bool packed, int code) {
    if (!packed) {
        codes[at] = (uint8_t)code;
        return;
    }
    uint8_t *b = &codes[at / 64 * 32 + at % 32];
    *b = at % 64 < 32 ? (uint8_t)((*b & 0xf0) | code) : (uint8_t)((*b & 0x0f) | code << 4);
}
/* Bytes of n code positions (a multiple of 64 when packed). */
static inline size_t lp_lora_static_code_bytes(size_t n, bool packed) { return packed ? n / 2 : n; }

/* Start of A's row j. */
static inline const uint8_t *lp_lora_static_a_row(const lp_lora_static *L, int j) {
    return L->qa + lp_lora_static_code_bytes(lp_lora_static_a_at(L->in, L->packed, j, 0), L->packed);
}

/* The shrink's last step for rank row j, from its exact integer sum s:
 * ct[j] = code(t_j). */
static inline void lp_lora_static_shrink_code(const lp_lora_static *L, int j, int64_t s, uint8_t *ct) {
    float t = (L->x.scale * L->ea[L->na > 1 ? j : 0].scale) * (float)s;
    ct[j] = (uint8_t)lp_q_code(t, L->t, L->act_qmax);
}

/* Ranks up to this sum the expand in 32 bits (every term is within
 * rank * 255^2, four of them under 2^31); wider ones in 64. */
#define LP_LORA_STATIC_INT32_RANK 4096

/* L->sum_a from the codes (done once, where an adapter's codes are made). */
void lp_lora_static_sum_a(const uint8_t *qa, bool packed, int rank, int in, int64_t *sum_a);

/* int32 values of per-thread scratch a branch of these sizes needs. */
#define LP_LORA_STATIC_SCRATCH(in, rank) (((in) + 3) / 4 + ((rank) + 3) / 4)

/* For rows i < n: y[dst(i) * y_stride + o] += the branch of x[i * x_stride],
 * dst(i) = rows ? rows[i] : i. t_out (n x rank, or NULL) receives the
 * dequantized shrink outputs. scratch: LP_LORA_STATIC_SCRATCH values. */
void lp_lora_static_rows(const lp_lora_static *L, const float *x, int64_t x_stride, int n,
                         const int *rows, float *y, int64_t y_stride, float *t_out,
                         int32_t *scratch);

/* The branch's three steps for one row, so they can be split over threads;
 * every level's build gives lp_lora_static_rows' bits. */
typedef struct lp_lora_static_ops {
    /* cx[k] = code(x[k]), k < in; returns the sum of the codes */
    int64_t (*quantize)(const lp_lora_static *L, const float *x, uint8_t *cx);
    /* ct[j] = code(t_j) for j0 <= j < j1; sum_cx: what quantize returned */
    void (*shrink)(const lp_lora_static *L, const uint8_t *cx, int64_t sum_cx, int j0, int j1, uint8_t *ct);
    /* y[o] += output o of the branch, o0 <= o < o1 */
    void (*expand)(const lp_lora_static *L, const uint8_t *ct, int o0, int o1, float *y);
} lp_lora_static_ops;

extern const lp_lora_static_ops lp_lora_static_ref;
#if defined(__x86_64__)
extern const lp_lora_static_ops lp_lora_static_avx2, lp_lora_static_avx512;
extern const lp_lora_static_ops lp_lora_static_avx512vnni, lp_lora_static_avxvnni;
#endif

#endif
