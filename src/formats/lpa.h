/* .lpa: loraplex's native LoRA adapter file, made to be memory-mapped and
 * used in place. All integers little-endian.
 *
 *   offset size  field
 *   0      4     magic "LPA1"
 *   4      4     version (1)
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
 *   80     8     data_start        align64(640 + 40 * n_entries)
 *   88     40    reserved, zero
 *   128    256   name              UTF-8, NUL-terminated, NUL-padded
 *   384    256   base_name         (e.g. PEFT base_model_name_or_path), same
 *   640    40*n  entries, strictly increasing by (layer, proj):
 *                  0 u32 layer   4 u32 proj (0..6 = q k v o gate up down)
 *                  8 u32 rank (1..min(in, out))   12 u32 dtype (0 F32, 1 F16, 64 W4, 65 W8)
 *                 16 f32 scale (alpha/r, finite)  20 u32 reserved, zero
 *                 24 u64 a_offset: A, rank rows x in cols, row-major
 *                 32 u64 b_offset: B, out rows x rank cols, row-major
 *   data_start..  the A and B blocks in table order (A then B per entry), each
 *                 64-byte aligned, zero padding between and at the end.
 *
 * W8 and W4 blocks are in the integer kernels' packed LP_W8 / LP_W4 layouts (group 32, see
 * src/kernels/intpack.c): A is rank x in (in a multiple of 32), B is
 * out x round32(rank) with zero columns past the rank, so the runtime
 * multiplies them in place with int8 activations.
 *
 * in/out per projection follow from the base dims (q: dim -> n_heads*head_dim,
 * k/v: dim -> n_kv_heads*head_dim, o: n_heads*head_dim -> dim, gate/up:
 * dim -> ffn_dim, down: ffn_dim -> dim). The B rows of q/k are stored in the
 * base's own row order (see flags), so loading is a mapping + validation. */
#ifndef LP_LPA_H
#define LP_LPA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"

#define LP_LPA_MAGIC "LPA1"
#define LP_LPA_VERSION 1
#define LP_LPA_HEADER_BYTES 640
#define LP_LPA_ENTRY_BYTES 40
#define LP_LPA_NAME_BYTES 256
#define LP_LPA_ALIGN 64
#define LP_LPA_N_PROJ 7
#define LP_LPA_FLAG_INTERLEAVED 1u

/* The base an adapter belongs to. */
typedef struct lp_lpa_base {
    uint64_t fingerprint;
    uint32_t arch, flags;
    uint32_t n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, n_vocab;
} lp_lpa_base;

typedef struct lp_lpa_entry {
    uint32_t layer, proj, rank, dtype;
    float scale;
    uint64_t in, out;         /* derived from the base dims */
    const void *a, *b;        /* reader: inside the buffer; writer: the data */
} lp_lpa_entry;

typedef struct lp_lpa {
    lp_lpa_base base;
    char name[LP_LPA_NAME_BYTES];
    char base_name[LP_LPA_NAME_BYTES];
    uint32_t n_entries;
    lp_lpa_entry *entries;    /* malloc'd; lp_lpa_release frees */
} lp_lpa;

/* Input and output sizes of projection `proj` of a base with these dims.
 * Returns false for a bad proj id. */
bool lp_lpa_proj_shape(const lp_lpa_base *b, uint32_t proj, uint64_t *in, uint64_t *out);

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

/* Writes a .lpa file; entries need layer, proj, rank, dtype, scale, a, b
 * (in/out are recomputed from the base dims). Entries are sorted here. */
int lp_lpa_write(const char *path, const lp_lpa_base *base, const char *name,
                 const char *base_name, const lp_lpa_entry *entries, uint32_t n,
                 lp_error *err);

#endif
