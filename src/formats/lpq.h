/* .lpq: a QUAD shared quantization profile (docs/quad.md). One set of
 * encodings that every adapter quantized under it uses: an affine scale and
 * zero-point for A and B of every adapted weight (per tensor or per output
 * channel), and static activation encodings of the LoRA branch (the shrink's
 * input x and its output t = x A^T). Adapters quantized under a profile store
 * integer codes only (.lpa version 3, see lpa.h) and the profile's id, so a
 * graph compiled for the profile takes any of them. All integers
 * little-endian.
 *
 *   offset size  field
 *   0      4     magic "LPQ1"
 *   4      4     version (1)
 *   8      8     file_bytes        total size (exactly what the table implies)
 *   16     8     profile_id        lp_lpa_hash of the whole file with this field
 *                                  read as zero (never 0): the id and the checksum
 *   24     8     base_fingerprint  lp_model_fingerprint of the base it was made on
 *   32     4     weight_bits       8 or 4 (codes 0..2^bits-1)
 *   36     4     act_bits          8 (codes 0..255)
 *   40     4     granularity       0 per tensor, 1 per output channel (rows of
 *                                  A = rank, rows of B = out)
 *   44     4     strategy          0 anchor, 1 fallback (informative)
 *   48     4     n_entries         1..2^20
 *   52     12    reserved, zero
 *   64     64    anchor            the anchor adapter's name, UTF-8, NUL-padded
 *                                  ("" for the fallback)
 *   128    128   reserved, zero
 *   256    128*n entries, strictly increasing by tensor name (bytewise):
 *                  0  96 tensor   the base weight's GGUF name, NUL-padded
 *                 96 u32 rank     1..min(in, out)
 *                100 u32 in       104 u32 out   the weight's shape, 1..2^24
 *                108 f32 x_scale  112 i32 x_zero   shrink input encoding
 *                116 f32 t_scale  120 i32 t_zero   shrink output encoding
 *                124 u32 reserved, zero
 *   then per entry, in table order: A scales f32[na], A zeros i32[na],
 *   B scales f32[nb], B zeros i32[nb], with na = rank, nb = out per channel
 *   and na = nb = 1 per tensor. Scales are finite, in [1e-30, 1e30]; zeros
 *   in 0..2^bits-1.
 *
 * The quantizer (the one definition the writer, the trainer's student, the
 * kernels and their reference share): code(x) = clamp(rint(x / s) + z, 0,
 * 2^bits - 1), value(q) = s (q - z). */
#ifndef LP_LPQ_H
#define LP_LPQ_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"

#define LP_LPQ_MAGIC "LPQ1"
#define LP_LPQ_VERSION 1
#define LP_LPQ_HEADER_BYTES 256
#define LP_LPQ_ENTRY_BYTES 128
#define LP_LPQ_TENSOR_BYTES 96
#define LP_LPQ_ANCHOR_BYTES 64
#define LP_LPQ_MAX_ENTRIES (1u << 20)

enum { LP_LPQ_PER_TENSOR = 0, LP_LPQ_PER_CHANNEL = 1 };
enum { LP_LPQ_ANCHOR = 0, LP_LPQ_FALLBACK = 1 };

/* One affine encoding. */
typedef struct lp_qenc {
    float scale;
    int32_t zero;
} lp_qenc;

typedef struct lp_lpq_entry {
    char tensor[LP_LPQ_TENSOR_BYTES];
    uint32_t rank, in, out;
    lp_qenc x, t;             /* static activation encodings of the LoRA branch */
    uint32_t na, nb;          /* channels: 1, or rank / out */
    lp_qenc *a, *b;           /* [na], [nb] */
} lp_lpq_entry;

typedef struct lp_lpq {
    uint64_t id, base_fingerprint;
    uint32_t weight_bits, act_bits, granularity, strategy;
    char anchor[LP_LPQ_ANCHOR_BYTES];
    uint32_t n_entries;
    lp_lpq_entry *entries;    /* malloc'd (with their a / b arrays): lp_lpq_release */
} lp_lpq;

/* ---- the quantizer ------------------------------------------------------------ */

static inline int lp_q_code(float x, lp_qenc e, int qmax) {
    float r = rintf(x / e.scale) + (float)e.zero;
    if (!(r >= 0.0f)) return 0; /* NaN too */
    return r > (float)qmax ? qmax : (int)r;
}

static inline float lp_q_value(int q, lp_qenc e) { return e.scale * (float)(q - e.zero); }

/* The bin of v among nb equal bins from lo, per = nb / (hi - lo); values
 * outside (and NaN) land in the end bins. Calibration histograms use it. */
static inline int lp_q_bin(float v, float lo, float per, int nb) {
    float f = (v - lo) * per;
    return !(f >= 0) ? 0 : f < (float)nb ? (int)f : nb - 1;
}

/* The encoding of [lo, hi] (widened to hold 0) on codes 0..qmax. */
lp_qenc lp_qenc_from_range(float lo, float hi, int qmax);

/* ---- the file ----------------------------------------------------------------- */

/* Parses and validates a whole .lpq image; `what` names it in messages. */
int lp_lpq_parse(const void *data, size_t size, const char *what, lp_lpq *out, lp_error *err);
/* Reads a file (at most 256 MiB). */
int lp_lpq_read(const char *path, lp_lpq *out, lp_error *err);
void lp_lpq_release(lp_lpq *q);
/* Writes q (entries need every field; sorted here, duplicates rejected) and
 * sets q->id to the written file's id. */
int lp_lpq_write(const char *path, lp_lpq *q, lp_error *err);
/* The entry of a tensor name, or NULL. Entries must be sorted (as parsed). */
const lp_lpq_entry *lp_lpq_find(const lp_lpq *q, const char *tensor);

#endif
