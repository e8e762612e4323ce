/* A compiled SD 1.x model (`loraplex compile` of a checkpoint): every tensor
 * of the layout already in the form the graphs use (conv kernels in
 * lp_conv2d's [out][k][k][in] order, int8 matrices as LP_W8 panels), each
 * 64-byte aligned, so loading is a memory map and a check. Little-endian.
 *
 *   offset size   field
 *   0      4      magic "LPS1"
 *   4      4      version (1)
 *   8      8      file_bytes     total size of the file
 *   16     4      n_tensors      = the layout's count for the configuration
 *   20     4      weight_type    LP_F32 or LP_W8 (the lp_sd_tensor_w8 rule)
 *   24     4      acts           0: int8 activations (W8A8), 1: float (W8A16)
 *   28     4      reserved, zero
 *   32     4x40   the configuration: the int32 fields of lp_sd_config in
 *                 declaration order (unet_attn as 0/1), then zeros
 *   192    320    reserved, zero
 *   512    64*n   one entry per tensor, in the layout's order:
 *                   0 u32 type (LP_F32 or LP_W8)   4 u32 group (W8: cols, else 0)
 *                   8 u64 rows                    16 u64 cols
 *                  24 u64 offset (64-aligned)     32 u64 bytes
 *                  40 24 reserved, zero
 *   ...           tensors, in the table's order, 64-byte aligned, after the
 *                 table, not overlapping, inside the file
 *
 * The table must be exactly what the configuration's layout and the weight
 * type give (shapes, types, sizes): a reader needs no names. */
#ifndef LP_IMAGE_SD_COMPILED_H
#define LP_IMAGE_SD_COMPILED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"
#include "sd.h"

#define LP_SD_COMPILED_MAGIC "LPS1"

typedef struct lp_sd_compiled {
    lp_sd_config cfg;
    uint32_t weight_type;
    bool int8_activations;
    int64_t n_tensors;
    const void **data; /* [n_tensors], inside the image; malloc'd (lp_sd_compiled_release) */
    bool *is_w8;       /* [n_tensors] */
} lp_sd_compiled;

/* Whether the bytes start like a compiled SD model. */
bool lp_sd_compiled_magic(const void *data, size_t size);
/* Checks the image (64-byte aligned in memory; used in place) and points
 * out->data at its tensors. Errors name `what`. */
int lp_sd_compiled_parse(const void *data, size_t size, const char *what, lp_sd_compiled *out, lp_error *err);
void lp_sd_compiled_release(lp_sd_compiled *c);
/* Writes the tensors data[i] (the layout's order, as the graphs hold them)
 * of a configuration and weight type. */
int lp_sd_compiled_write(const char *path, const lp_sd_config *cfg, uint32_t weight_type, bool int8_activations,
                         const void *const *data, int64_t n_tensors, lp_error *err);

#endif
