/* Kernels: (de)quantization of every supported element type, matrix
 * multiplication over weights of any type, and the small vector ops of a
 * transformer layer.
 *
 * Every SIMD path has a plain C reference (lp_*_ref) that tests compare
 * against. The fast path is chosen at run time from lp_cpu_features, never
 * at compile time with -march=native. */
#ifndef LP_KERNELS_H
#define LP_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"
#include "../base/dtype.h"

/* A weight matrix: rows = output features, cols = input features; row r
 * occupies row_bytes bytes at data + r*row_bytes, in `type`'s block layout.
 *
 * Exception: the packed integer types LP_W4 / LP_W8 / LP_W4C interleave 16 rows (see
 * intpack.c); for them row_bytes is only the average bytes per row
 * (lp_pack_bytes / rows, informational), data holds lp_pack_bytes(type,
 * rows, cols, group) bytes and single rows are read with
 * lp_weight_dequantize_row. */
typedef struct lp_weight {
    uint32_t type;      /* lp_dtype */
    int64_t rows, cols;
    size_t row_bytes;
    const void *data;
    int32_t group;      /* packed types: elements per scale; 0 = 32 */
} lp_weight;

/* ---- element types ----------------------------------------------------- */

/* n must be a multiple of the type's block size. */
void lp_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n);
/* Reference quantizers (round to nearest, llama.cpp-compatible block
 * layouts) for F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K.
 * Returns false for types we cannot produce. */
bool lp_quantize_row(uint32_t type, const float *src, void *dst, int64_t n);

/* Row r of any weight (every type above plus the packed ones), as W->cols
 * floats. Used for embedding lookups. */
void lp_weight_dequantize_row(const lp_weight *w, int64_t row, float *dst);

/* ---- packed integer weights (LP_W4, LP_W8, LP_W4C) ------------------------- */

/* Bytes of a packed rows x cols matrix; 0 for bad arguments (type not
 * packed, group not 32/64/128 for W4/W4C or not a multiple of 32 dividing
 * cols for W8, group 0 = 32, cols not a multiple of group, overflow).
 * W8 per-row scales: group = cols. */
size_t lp_pack_bytes(uint32_t type, int64_t rows, int64_t cols, int group);
/* Quantizes row-major float rows into the packed layout at dst
 * (lp_pack_bytes bytes). W4 and W4C use a per-group scale search minimising
 * the squared error. Returns 0, or -1 for bad arguments. */
int lp_pack_weight(uint32_t type, int group, const float *src_rows_major, int64_t rows,
                   int64_t cols, void *dst);
/* As lp_pack_weight; search = false takes the plain absmax scale (W4; W4C
 * always searches). */
int lp_pack_weight_ex(uint32_t type, int group, const float *src_rows_major, int64_t rows,
                      int64_t cols, void *dst, bool search);
/* Lossless repack of GGUF rows (row_bytes = lp_dtype_row_bytes(gguf_type,
 * cols), rows contiguous): Q4_0 -> LP_W4 group 32, Q8_0 -> LP_W8 group 32.
 * dst holds lp_pack_bytes(*packed_type, rows, cols, 32) bytes. Returns 0,
 * or -1 for other types or bad shapes. */
int lp_pack_from_gguf(uint32_t gguf_type, const void *src, int64_t rows, int64_t cols,
                      void *dst, uint32_t *packed_type);
/* Fills an lp_weight for packed data (group 0 -> 32). */
lp_weight lp_packed_weight(uint32_t type, int group, int64_t rows, int64_t cols, const void *data);

/* ---- matmul ------------------------------------------------------------ */

/* Integer kernel levels for the packed types (lp_kernels.int_level). */
enum { LP_INT_REF = 0, LP_INT_AVX2 = 1, LP_INT_AVX512VNNI = 2, LP_INT_NEON_DOT = 3,
       /* AMX tiles for batches (prefill), AVX-512 VNNI below LP_AMX_MIN_BATCH
        * rows; same bits as every other level */
       LP_INT_AMX = 4,
       /* 256-bit vpdpbusd (AVX-VNNI) on CPUs without AVX-512 */
       LP_INT_AVXVNNI = 5 };

/* Kernel dispatch table, filled once per context from the CPU features. */
struct lp_lora_static_ops; /* lora_static.h */

typedef struct lp_kernels {
    lp_cpu_features cpu;
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    /* lp_axpy, lp_softmax and lp_silu_mul of this level (axpy bit-identical
     * to the reference; softmax and silu use a polynomial exp, within a few
     * ulp of expf) */
    void (*axpy_f32)(float *y, float a, const float *x, int64_t n);
    void (*softmax)(float *x, int64_t n);
    void (*silu_mul)(float *gate, const float *up, int64_t n);
    /* Attention over a run of keys for the nq query heads that share them
     * (grouped-query attention): lp_attn_scores (the reference's bits; keys
     * transposed) and lp_attn_mix (the bits of axpy_f32 called row by row)
     * of this level. */
    void (*attn_scores)(const float *q, int64_t q_stride, int nq, const void *kt, bool k_f16, int64_t kt_stride,
                        int nk, int64_t d, float scale, float *s, int64_t s_stride);
    void (*attn_mix)(float *out, int64_t out_stride, int nq, const float *p, int64_t p_stride, const void *v,
                     bool v_f16, int64_t v_stride, int nk, int64_t d);
    /* x[i] = the f16 value nearest x[i] (round to nearest even), as f32 */
    void (*round_f16)(float *x, int64_t n);
    /* dst[i] = lp_f32_to_f16(src[i]) (the KV cache's stores) */
    void (*to_f16)(uint16_t *dst, const float *src, int64_t n);
    /* the shared-profile LoRA branch's steps at this level (the same bits) */
    const struct lp_lora_static_ops *lora_static;
    /* more fast paths are private to kernels/ */
    int level;     /* float paths: 0 = reference, 1 = avx2, 2 = avx512 */
    int int_level; /* packed integer paths: LP_INT_* */
    /* LP_INT_AVX512VNNI / LP_INT_AMX: W4C decode kernels use AVX512-VBMI */
    bool vbmi;
    /* LP_INT_NEON_DOT: batches of 2+ rows run pairs of rows through the
     * int8 matrix multiply (smmla) */
    bool i8mm;
    /* LP_W4/LP_W8: quantize activations to int8 per group and run integer
     * dot products (default). false: W4A16/W8A16 (dequantize + float). */
    bool int8_activations;
    /* Quantized-activation scratch, see lp_kernels_reserve. */
    void *scratch;
    size_t scratch_bytes;
    /* The ceiling the levels were picked under (LP_CPU_CAP_*; LP_CPU_CAP_NONE
     * when LORAPLEX_CPU is unset), and whether LORAPLEX_CPU held a value
     * that is not a level (then ignored, with a warning). */
    int cpu_cap;
    bool cpu_cap_invalid;
} lp_kernels;

/* ---- dispatch caps (LORAPLEX_CPU) ---------------------------------------------- */

/* Ceilings on the levels lp_kernels_init picks, lowest first: the dispatch
 * runs as it would on a CPU that has at most that level (e.g. an AMX box
 * measured as an AVX-512 VNNI one). AVXVNNI: the AVX2 float kernels with
 * the AVX-VNNI integer ones (a client core without AVX-512); AVX512: the
 * AVX-512 float kernels with the AVX2 integer ones (the AVX-512 CPUs
 * without VNNI have no AVX-VNNI either); NEON_DOT: Arm's dotprod kernels
 * without the i8mm ones; NEON_I8MM: both (the top Arm level).
 * Every level gives the integer kernels' bits, so a cap changes speed, not
 * results (the float kernels of different levels may differ in the last
 * bits). */
enum { LP_CPU_CAP_REFERENCE = 0, LP_CPU_CAP_AVX2, LP_CPU_CAP_AVXVNNI, LP_CPU_CAP_AVX512, LP_CPU_CAP_AVX512VNNI, LP_CPU_CAP_AMX,
       LP_CPU_CAP_NEON_DOT, LP_CPU_CAP_NEON_I8MM, LP_CPU_CAP_NONE };
/* The environment variable, and the values it takes on this build's
 * architecture, as a list for messages: x86-64 "amx, avx512-vnni, avx512,
 * avx-vnni, avx2, reference"; aarch64 "neon-i8mm, neon-dotprod, reference". */
#define LP_CPU_ENV "LORAPLEX_CPU"
const char *lp_cpu_cap_names(void);
/* Parses a cap name (case-insensitive; "amx-int8" = "amx", "avx512vnni" =
 * "avx512-vnni", "avxvnni" = "avx-vnni", "dotprod" = "neon-dotprod", "i8mm" = "neon-i8mm", "ref" / "c" = "reference") into
 * *cap. Returns 0, or -1 for anything else, names of another architecture
 * included. */
int lp_cpu_cap_parse(const char *text, int *cap);
const char *lp_cpu_cap_name(int cap);
/* LORAPLEX_CPU's cap: 0 with *cap = LP_CPU_CAP_NONE when unset or empty,
 * -1 (err set, naming the accepted values) when it is not a level. */
int lp_cpu_cap_from_env(int *cap, lp_error *err);

/* Both reset *k (call lp_kernels_free first if it holds scratch).
 * lp_kernels_init applies LORAPLEX_CPU (lp_cpu_cap_from_env): an invalid
 * value is ignored with a warning on stderr, the only one this library
 * writes; loraplex info and bench refuse to run with one. */
void lp_kernels_init(lp_kernels *k, const lp_cpu_features *cpu);
/* lp_kernels_init under an explicit cap (LP_CPU_CAP_*), ignoring the
 * environment. */
void lp_kernels_init_capped(lp_kernels *k, const lp_cpu_features *cpu, int cap);
/* One line for logs: the integer and float levels in use, and when capped,
 * the cap and the levels this CPU would run, e.g. "avx2 (float avx2),
 * capped by LORAPLEX_CPU=avx2 (this CPU: avx512-vnni vbmi, float avx512)". */
void lp_kernels_describe(const lp_kernels *k, char *buf, size_t cap);
/* Forces the plain C reference everywhere (tests). */
void lp_kernels_init_reference(lp_kernels *k);
/* Allocates the int8 activation scratch once: enough for lp_matmul calls
 * with n_batch <= max_rows and cols <= max_cols (larger batches are done in
 * slices; without scratch the packed types take the float path). Returns 0
 * or -1 (err set). */
int lp_kernels_reserve(lp_kernels *k, int64_t max_rows, int64_t max_cols, lp_error *err);
void lp_kernels_free(lp_kernels *k);
const char *lp_int_level_name(int int_level);

/* Y[b][r] = sum_c W[r][c] * X[b][c] for b < n_batch, r < W->rows.
 * X is n_batch rows of W->cols floats (stride x_stride floats); Y rows have
 * stride y_stride floats. Parallel over output rows. Never allocates. */
void lp_matmul(const lp_kernels *k, lp_threadpool *pool, const lp_weight *W,
               const float *X, int64_t x_stride, int64_t n_batch, float *Y,
               int64_t y_stride);
/* Several weights applied to the same input, e.g. q, k, v or gate, up:
 * Y[i] = X W[i]^T for i < n, with the same bits as n lp_matmul calls. For
 * packed weights of one type, group and width (the int8 path) the input is
 * quantized once and all the weights' rows share one pass over the pool:
 * fewer thread round trips per token. Anything else (or n >
 * LP_MATMUL_MULTI_MAX) runs as n lp_matmul calls. */
#define LP_MATMUL_MULTI_MAX 8
void lp_matmul_multi(const lp_kernels *k, lp_threadpool *pool, int n, const lp_weight *const *W,
                     const float *X, int64_t x_stride, int64_t n_batch, float *const *Y,
                     const int64_t *y_stride);
/* Independent matmuls (each its own weight, input rows and output) in one
 * pass over the pool: the segmented LoRA shrink or expand, where every
 * adapter group of a batch multiplies its own rows by its own small
 * matrices. Same bits as one lp_matmul per task. When every weight is
 * packed with int8 activations and the inputs fit the scratch, inputs are
 * quantized once (tasks with the same X, rows and width share it) and one
 * GEMM pass covers every task's panels: two pool round trips in all
 * instead of two per task. Anything else runs as n lp_matmul calls. */
typedef struct lp_matmul_task {
    const lp_weight *W;
    const float *X;
    int64_t x_stride, n_batch;
    float *Y;
    int64_t y_stride;
} lp_matmul_task;
#define LP_MATMUL_TASKS_MAX 64
void lp_matmul_tasks(const lp_kernels *k, lp_threadpool *pool, int n, const lp_matmul_task *tasks);
/* Plain reference: dequantize each row, double-free float dot. */
void lp_matmul_ref(const lp_weight *W, const float *X, int64_t x_stride,
                   int64_t n_batch, float *Y, int64_t y_stride);

/* ---- vector ops ---------------------------------------------------------- */

/* sum of x[i]^2 in double, in a fixed order (lp_rmsnorm's, and training's) */
double lp_sum_squares(const float *x, int64_t n);
/* out = x / sqrt(mean(x^2) + eps) * w  (w may be NULL: no gain) */
void lp_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);
/* In-place softmax over n values. */
void lp_softmax(float *x, int64_t n);
/* gate[i] = silu(gate[i]) * up[i] */
void lp_silu_mul(float *gate, const float *up, int64_t n);
float lp_dot_f32_ref(const float *a, const float *b, int64_t n);
/* Scores of nq query heads against nk keys stored transposed (element c of
 * key j at kt[c*kt_stride + j], f32, or f16 when k_f16), for h < nq, j < nk:
 * s[h*s_stride + j] = scale * acc, acc = fmaf(q_h[c], k_j[c], acc) for c =
 * 0..d-1 in order from 0, q_h = q + h*q_stride. Every level does exactly
 * these operations (one chain per score, vectors across keys), so every
 * level gives the same bits, and a score depends only on its query and key.
 * An f16 key gives the bits its f32 value would. */
void lp_attn_scores(const float *q, int64_t q_stride, int nq, const void *kt, bool k_f16, int64_t kt_stride, int nk,
                    int64_t d, float scale, float *s, int64_t s_stride);
/* out + h*out_stride += sum over j in order of p[h*p_stride + j] * v_j
 * (v_j = v + j*v_stride, d f32 or f16 elements), as lp_axpy per j does,
 * for h < nq. */
void lp_attn_mix(float *out, int64_t out_stride, int nq, const float *p, int64_t p_stride, const void *v, bool v_f16,
                 int64_t v_stride, int nk, int64_t d);
/* y += a * x */
void lp_axpy(float *y, float a, const float *x, int64_t n);
/* x[i] = the f16 value nearest x[i] (round to nearest even), as f32 */
void lp_round_f16(float *x, int64_t n);
/* dst[i] = lp_f32_to_f16(src[i]) */
void lp_to_f16(uint16_t *dst, const float *src, int64_t n);
/* The widest attention head a model may have (checked at load): the
 * reference attention converts one f16 K/V row of it on the stack. */
#define LP_HEAD_DIM_MAX 1024

#endif
