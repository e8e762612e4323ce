/* The LoRA branch of an adapter under a QUAD shared profile (formats/lpq.h):
 * integer codes for A and B with the profile's affine encodings, and static
 * activation encodings for the shrink's input and output, so the branch is
 * two integer dot products with no per-row range search:
 *
 *   qx = code(x; ex) - ex.zero                          (in values)
 *   t_j = (ex.scale * ea_j.scale) * sum_k qx_k (qa_jk - ea_j.zero)      (int64 sum)
 *   qt_j = code(t_j; et) - et.zero
 *   y_o += (scale * et.scale * eb_o.scale) * sum_j qt_j (qb_oj - eb_o.zero)
 *
 * ea_j / eb_o are the row's encodings (index 0 for per-tensor profiles).
 * The float steps are exactly these, in this order, so any implementation
 * computing them gives the same bits. */
#ifndef LP_LORA_STATIC_H
#define LP_LORA_STATIC_H

#include <stdint.h>

#include "../formats/lpq.h"

typedef struct lp_lora_static {
    const uint8_t *qa;       /* [rank][in] codes */
    const uint8_t *qbt;      /* [rank][out] B's codes, transposed */
    int rank, in, out;
    const lp_qenc *ea, *eb;  /* [na], [nb] */
    uint32_t na, nb;         /* 1 or rank / out */
    lp_qenc x, t;
    int act_qmax;            /* 255 */
    float scale;             /* the adapter's alpha / rank */
} lp_lora_static;

/* Ranks up to this sum the expand in float, exactly (lora_static.c). */
#define LP_LORA_STATIC_FLOAT_RANK 256

/* int32 values of scratch a branch of these sizes needs. */
#define LP_LORA_STATIC_SCRATCH(in, rank, out) ((rank) + 2 * (out) + ((in) + 1) / 2)

/* For rows i < n: y[dst(i) * y_stride + o] += the branch of x[i * x_stride],
 * dst(i) = rows ? rows[i] : i. t_out (n x rank, or NULL) receives the
 * dequantized shrink outputs. scratch: LP_LORA_STATIC_SCRATCH values. */
void lp_lora_static_rows(const lp_lora_static *L, const float *x, int64_t x_stride, int n,
                         const int *rows, float *y, int64_t y_stride, float *t_out,
                         int32_t *scratch);

/* The branch's three steps for one row, so they can be split over threads;
 * every level's build gives lp_lora_static_rows' bits. */
typedef struct lp_lora_static_ops {
    /* qx[k] = code(x[k]) - x.zero, k < in */
    void (*quantize)(const lp_lora_static *L, const float *x, int16_t *qx);
    /* qt[j] = code(t_j) - t.zero for j0 <= j < j1 */
    void (*shrink)(const lp_lora_static *L, const int16_t *qx, int j0, int j1, int32_t *qt);
    /* y[o] += output o of the branch, o0 <= o < o1; scratch: 2 (o1 - o0) floats */
    void (*expand)(const lp_lora_static *L, const int32_t *qt, int o0, int o1, float *y, float *scratch);
} lp_lora_static_ops;

extern const lp_lora_static_ops lp_lora_static_ref;
#if defined(__x86_64__)
extern const lp_lora_static_ops lp_lora_static_avx2, lp_lora_static_avx512;
#endif

#endif
