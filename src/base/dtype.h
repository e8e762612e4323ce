/* Tensor element types. The numeric values are GGML's type ids, so a GGUF
 * tensor's type field maps straight onto this enum. Block layouts are the
 * GGUF ones (documented in src/kernels/quant.c). */
#ifndef LP_DTYPE_H
#define LP_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum lp_dtype {
    LP_F32 = 0,
    LP_F16 = 1,
    LP_Q4_0 = 2,
    LP_Q4_1 = 3,
    LP_Q5_0 = 6,
    LP_Q5_1 = 7,
    LP_Q8_0 = 8,
    LP_Q8_1 = 9,
    LP_Q2_K = 10,
    LP_Q3_K = 11,
    LP_Q4_K = 12,
    LP_Q5_K = 13,
    LP_Q6_K = 14,
    LP_Q8_K = 15,
    LP_I8 = 24,
    LP_I16 = 25,
    LP_I32 = 26,
    LP_I64 = 27,
    LP_F64 = 28,
    LP_BF16 = 30,
    LP_DTYPE_COUNT = 31,
    /* Our own packed integer formats (ids >= 64, never GGML ids). Their
     * layout interleaves 16 rows and depends on a group size carried in
     * lp_weight.group; see src/kernels/intpack.c. block_elems/block_bytes
     * below describe the default group of 32 averaged per row. */
    LP_W4 = 64, /* int4 symmetric [-8,7], f16 scale per group (32/64/128) */
    LP_W8 = 65, /* int8 symmetric [-128,127], f16 scale per group or row */
    /* int4 codes into 16 non-uniform int8 levels (a codebook), an 8-bit
     * log scale per group and an f32 range per row: 4.25 bits per weight
     * at group 32, lower KL than W4 (docs/benchmarks.md section 2) */
    LP_W4C = 66,
    LP_DTYPE_OWN_END = 67
} lp_dtype;

typedef struct lp_dtype_info {
    const char *name;   /* "F32", "Q4_K", ... ; NULL for unknown ids */
    int block_elems;    /* elements per block (1 for plain types) */
    int block_bytes;    /* bytes per block */
    bool supported;     /* we can dequantize it */
} lp_dtype_info;

/* Info for a raw type id; returns NULL for ids we don't know. */
const lp_dtype_info *lp_dtype_get(uint32_t type_id);
/* Bytes of one row of n elements; 0 if the type is unknown or n is not a
 * multiple of the block size. For LP_W4/LP_W8 this is the average bytes per
 * row at group 32 (rows are interleaved; use lp_pack_bytes for sizes). */
size_t lp_dtype_row_bytes(uint32_t type_id, uint64_t n);
const char *lp_dtype_name(uint32_t type_id);
/* Our packed integer types (LP_W4, LP_W8, LP_W4C): 16-row panels. */
static inline bool lp_dtype_is_packed(uint32_t type_id) {
    return type_id == LP_W4 || type_id == LP_W8 || type_id == LP_W4C;
}

#endif
