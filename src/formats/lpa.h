/* .lpa: loraplex's native LoRA adapter file, made to be memory-mapped and
 * used in place. All integers little-endian.
 *
 *   offset size  field
 *   0      4     magic "LPA1"
 *   4      4     version (2, or 3 for adapters under a shared profile; version
 *                1 is still read, see below)
 *   8      8     file_bytes        total size of the file (a multiple of 64)
 *   16     8     header_checksum   lp_lpa_hash of bytes [0, data_start) with
 *                                  this field read as zero
 *   24     8     data_checksum     lp_lpa_hash of bytes [data_start, file_bytes)
 *   32     8     base_fingerprint  lp_model_fingerprint of the base
 *   40     4     base_arch         0 llama, 1 qwen2, 2 qwen3 (lp_arch)
 *   44     4     flags             bit 0: q/k rows interleaved for rotary
 *                                  (base rope is not NEOX); other bits zero
 *   48     4x7   n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, n_vocab
 *   76     4     n_entries
 *   80     8     data_start        align64(640 + 160 * n_entries)
 *   88     8     profile_id        version 3: the .lpq profile (lpq.h) whose
 *                                  encodings the codes use (never 0); else zero
 *   96     32    reserved, zero
 *   128    256   name              UTF-8, NUL-terminated, NUL-padded
 *   384    256   base_name         (e.g. PEFT base_model_name_or_path), same
 *   640    160*n entries, strictly increasing by tensor name (bytewise):
 *                  0 96  tensor    the base weight's GGUF name ("blk.3.attn_q.weight"),
 *                                  UTF-8, NUL-terminated, NUL-padded
 *                 96 u32 rank (1..min(in, out))   100 u32 dtype (0 F32, 1 F16, 64 W4, 65 W8;
 *                                  version 3: 80 Q8, 81 Q4 profile codes)
 *                104 f32 scale (alpha/r, finite)  108 u32 reserved, zero
 *                112 u64 in    120 u64 out       (the base weight's shape, 1..2^24)
 *                128 u64 a_offset: A, rank rows x in cols, row-major
 *                136 u64 b_offset: B, out rows x rank cols, row-major
 *                144 16  reserved, zero
 *   data_start..  the A and B blocks in table order (A then B per entry), each
 *                 64-byte aligned, zero padding between and at the end.
 *
 * Version 1 (Llama family only) had 40-byte entries keyed by (layer, proj):
 *   0 u32 layer  4 u32 proj (0..6 = q k v o gate up down)  8 u32 rank  12 u32 dtype
 *   16 f32 scale  20 u32 zero  24 u64 a_offset  32 u64 b_offset,
 * strictly increasing by (layer, proj), data_start = align64(640 + 40 n), in
 * and out derived from the base dims. The reader names them as version 2
 * does ("blk.L.attn_q.weight", ...).
 *
 * W8 and W4 blocks are in the integer kernels' packed LP_W8 / LP_W4 layouts (group 32, see
 * src/kernels/intpack.c): A is rank x in (in a multiple of 32), B is
 * out x round32(rank) with zero columns past the rank, so the runtime
 * multiplies them in place with int8 activations. Q8 / Q4 blocks (version 3
 * only, and every entry of a version 3 file is one) are the bare codes of
 * the profile's affine encodings, row-major, A rank x in, B out x rank: one
 * byte per code (Q8), or two per byte, low nibble first, each row padded to
 * a whole byte (Q4). The B rows of q/k are
 * stored in the base's own row order (see flags), so loading is a mapping +
 * validation. */
#ifndef LP_LPA_H
#define LP_LPA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"

#define LP_LPA_MAGIC "LPA1"
#define LP_LPA_VERSION 2
#define LP_LPA_VERSION_PROFILE 3
#define LP_LPA_Q8 80u
#define LP_LPA_Q4 81u
#define LP_LPA_HEADER_BYTES 640
#define LP_LPA_ENTRY_BYTES 160
#define LP_LPA_V1_ENTRY_BYTES 40
#define LP_LPA_NAME_BYTES 256
#define LP_LPA_TENSOR_BYTES 96
#define LP_LPA_MAX_ENTRIES (1u << 20)
#define LP_LPA_ALIGN 64
#define LP_LPA_FLAG_INTERLEAVED 1u

/* The base an adapter belongs to. */
typedef struct lp_lpa_base {
    uint64_t fingerprint;
    uint32_t arch, flags;
    uint32_t n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, n_vocab;
} lp_lpa_base;

typedef struct lp_lpa_entry {
    char tensor[LP_LPA_TENSOR_BYTES]; /* the base weight's GGUF name */
    uint32_t rank, dtype;
    float scale;
    uint64_t in, out;         /* the base weight's shape */
    const void *a, *b;        /* reader: inside the buffer; writer: the data */
} lp_lpa_entry;

typedef struct lp_lpa {
    lp_lpa_base base;
    uint64_t profile_id;      /* version 3; 0 otherwise */
    char name[LP_LPA_NAME_BYTES];
    char base_name[LP_LPA_NAME_BYTES];
    uint32_t version;         /* of the file read */
    uint32_t n_entries;
    lp_lpa_entry *entries;    /* malloc'd; lp_lpa_release frees */
} lp_lpa;

/* Streaming 64-bit hash over 8-byte little-endian words (a trailing partial
 * word is zero-padded). Chunks fed in sequence must be multiples of 8 bytes
 * except the last. Start with h = LP_LPA_HASH_SEED. */
#define LP_LPA_HASH_SEED 0x4c50413168617368ull
uint64_t lp_lpa_hash(uint64_t h, const void *data, size_t n);

/* Parses and validates a whole .lpa image (must be 64-byte aligned in
 * memory: the data is used in place). If `expect` is non-NULL the file must
 * have been compiled for exactly that base (fingerprint, arch, flags and all
 * dims). `what` names the file in messages. Entries point into `data`. */
int lp_lpa_parse(const void *data, size_t size, const lp_lpa_base *expect,
                 const char *what, lp_lpa *out, lp_error *err);
void lp_lpa_release(lp_lpa *lpa);

/* Writes a version 2 .lpa file; entries need every field. They are sorted
 * here; two entries for one tensor are rejected. */
int lp_lpa_write(const char *path, const lp_lpa_base *base, const char *name,
                 const char *base_name, const lp_lpa_entry *entries, uint32_t n,
                 lp_error *err);
/* The same with a profile id: nonzero writes version 3 (every entry Q8 or
 * Q4), zero is lp_lpa_write. */
int lp_lpa_write_profiled(const char *path, const lp_lpa_base *base, const char *name,
                          const char *base_name, uint64_t profile_id,
                          const lp_lpa_entry *entries, uint32_t n, lp_error *err);
/* Bytes of one row of n codes of an LP_LPA_Q8 / LP_LPA_Q4 block. */
static inline size_t lp_lpa_code_row_bytes(uint32_t dtype, uint64_t n) {
    return dtype == LP_LPA_Q4 ? (size_t)((n + 1) / 2) : (size_t)n;
}

#endif
