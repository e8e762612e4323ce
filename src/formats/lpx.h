/* .lpx: loraplex's compiled model file. Weights are stored already in the
 * kernels' layout (LP_W4/LP_W8 panels, F16, F32, ...), each tensor 64-byte
 * aligned, so loading is a memory map plus validation: nothing is copied.
 * All integers little-endian.
 *
 *   offset size  field
 *   0      4     magic "LPX1"
 *   4      4     version (1)
 *   8      8     file_bytes          total size of the file
 *   16     4     arch                0 llama, 1 qwen2, 2 qwen3 (lp_arch)
 *   20     4     flags               LP_LPX_* below; unknown bits rejected
 *   24     4x8   n_vocab, dim, n_layers, n_heads, n_kv_heads, head_dim,
 *                ffn_dim, n_ctx_train
 *   56     4     rope_theta (f32)
 *   60     4     rms_eps (f32)
 *   64     4     acts                0: int8 activations (W*A8), 1: float (W*A16)
 *   68     4     weight_type         what the file was compiled to (informational:
 *                                    LP_W4, LP_W8, LP_F16, LP_F32, ...)
 *   72     4     group               elements per scale of weight_type (0 = n/a)
 *   76     4     tokenizer_kind      1: GGUF with tokenizer.* keys, 2: Hugging Face
 *                                    tokenizer.json (+ tokenizer_config.json),
 *                                    3: llama2.c tokenizer.bin
 *   80     8+8   tokenizer offset, bytes (the blob; HF: tokenizer.json)
 *   96     8+8   tokenizer2 offset, bytes (HF tokenizer_config.json, or 0, 0)
 *   112    4     n_tensors
 *   116    4     reserved, zero
 *   120    8     table_offset        = LP_LPX_HEADER_BYTES
 *   128    8     data_offset         first byte after the table and blobs,
 *                                    64-aligned; tensors live in [data_offset, file_bytes)
 *   136    120   reserved, zero
 *   256    256   name                UTF-8, NUL-terminated, NUL-padded
 *   512    64*n  tensor table, strictly increasing by (layer, kind):
 *                  0 u32 kind (LP_LPX_T_*)   4 u32 layer (0xFFFFFFFF: not per layer)
 *                  8 u32 type (lp_dtype)    12 u32 group (W4/W8; else 0)
 *                 16 u64 rows               24 u64 cols
 *                 32 u64 offset (64-aligned, >= data_offset)
 *                 40 u64 bytes (exactly the size the type and shape need)
 *                 48 16 reserved, zero
 *   ...          tokenizer blobs (between the table and data_offset)
 *   data_offset.. tensors, 64-byte aligned, non-overlapping
 *
 * Vectors (norm gains, biases) are F32 with rows = 1. rope_freqs is always
 * present and holds the rotary inverse frequencies theta^(-2i/d) / factor_i
 * ([head_dim/2]) exactly as the runtime uses them; the FREQ_FACTORS flag
 * only says the source had frequency factors. Norm gains are stored even
 * when folded (LoRA adapters fold them into their A matrices at load). */
#ifndef LP_LPX_H
#define LP_LPX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"

#define LP_LPX_MAGIC "LPX1"
#define LP_LPX_VERSION 1
#define LP_LPX_HEADER_BYTES 512
#define LP_LPX_ENTRY_BYTES 64
#define LP_LPX_ALIGN 64
#define LP_LPX_NAME_BYTES 256
#define LP_LPX_NO_LAYER 0xFFFFFFFFu
#define LP_LPX_MAX_TENSORS (1u << 20)

/* header flags */
#define LP_LPX_ROPE_NEOX     (1u << 0)
#define LP_LPX_TIED_OUTPUT   (1u << 1)
#define LP_LPX_FREQ_FACTORS  (1u << 2)  /* the source had rope frequency factors */
#define LP_LPX_NORMS_FOLDED  (1u << 3)  /* attn/ffn norm gains are folded into q,k,v / gate,up */
#define LP_LPX_FLAGS_KNOWN   0xFu

enum { LP_LPX_ACTS_INT8 = 0, LP_LPX_ACTS_F32 = 1 };
enum { LP_LPX_TOK_GGUF = 1, LP_LPX_TOK_HF = 2, LP_LPX_TOK_LLAMA2C = 3 };

/* Tensor kinds. Global ones have layer = LP_LPX_NO_LAYER. */
typedef enum lp_lpx_kind {
    LP_LPX_T_TOK_EMBD = 0, LP_LPX_T_OUTPUT, LP_LPX_T_OUTPUT_NORM, LP_LPX_T_ROPE_FREQS,
    LP_LPX_T_ATTN_NORM = 16, LP_LPX_T_FFN_NORM,
    LP_LPX_T_WQ, LP_LPX_T_WK, LP_LPX_T_WV,
    LP_LPX_T_WQKV,          /* fused [q_dim + 2 kv_dim] x dim: q rows, then k, then v */
    LP_LPX_T_WO,
    LP_LPX_T_W_GATE, LP_LPX_T_W_UP,
    LP_LPX_T_W_GATE_UP,     /* fused [2 ffn] x dim: gate rows, then up */
    LP_LPX_T_W_DOWN,
    LP_LPX_T_BQ, LP_LPX_T_BK, LP_LPX_T_BV, LP_LPX_T_Q_NORM, LP_LPX_T_K_NORM,
    LP_LPX_T_KIND_END
} lp_lpx_kind;

/* "token_embd", "blk.attn_qkv", ... for messages (without the layer). */
const char *lp_lpx_kind_name(uint32_t kind);
bool lp_lpx_kind_is_global(uint32_t kind);

typedef struct lp_lpx_header {
    uint32_t arch, flags;
    uint32_t n_vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, n_ctx_train;
    float rope_theta, rms_eps;
    uint32_t acts, weight_type, group;
    uint32_t tokenizer_kind;
    char name[LP_LPX_NAME_BYTES];
} lp_lpx_header;

typedef struct lp_lpx_tensor {
    uint32_t kind, layer, type, group;
    uint64_t rows, cols;
    uint64_t bytes;
    const void *data;       /* reader: inside the image; writer: the bytes to write */
} lp_lpx_tensor;

typedef struct lp_lpx {
    lp_lpx_header h;
    const void *base;           /* the image */
    size_t size;
    const void *tok, *tok2;     /* tokenizer blobs inside the image */
    size_t tok_bytes, tok2_bytes;
    uint32_t n_tensors;
    lp_lpx_tensor *tensors;     /* malloc'd; lp_lpx_release frees */
} lp_lpx;

/* Bytes a tensor of this type and shape needs (W4/W8: lp_pack_bytes, others
 * rows x row bytes), or 0 if the type/shape/group combination is invalid. */
size_t lp_lpx_tensor_bytes(uint32_t type, uint64_t rows, uint64_t cols, uint32_t group);

/* Parses and validates a whole image (must be 64-byte aligned in memory:
 * the data is used in place): magic, version, sizes, every offset and size
 * (with overflow checks), alignment, types, ordering, no overlaps. Semantic
 * checks (shapes against the hyper-parameters) are the model loader's job.
 * `what` names the file in messages. */
int lp_lpx_parse(const void *data, size_t size, const char *what, lp_lpx *out, lp_error *err);
void lp_lpx_release(lp_lpx *x);

/* Produces tensor i's bytes when it is written (so a compiler needs only one
 * tensor in memory at a time); NULL = failure (err set). */
typedef const void *(*lp_lpx_fill_fn)(void *user, uint32_t i, lp_error *err);

/* Writes a file; tensors are sorted here, offsets computed. A tensor whose
 * data is NULL is produced by fill(user, its index in `tensors`). */
int lp_lpx_write(const char *path, const lp_lpx_header *h, const void *tok, size_t tok_bytes,
                 const void *tok2, size_t tok2_bytes, const lp_lpx_tensor *tensors, uint32_t n,
                 lp_lpx_fill_fn fill, void *user, lp_error *err);

#endif
