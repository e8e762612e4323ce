/* Matrix multiplication over weights of any type, and kernel dispatch.
 *
 * lp_matmul splits the output rows between threads. Each thread walks its
 * rows in tiles of LP_TILE_ROWS rows and LP_CHUNK columns: the tile's
 * weights are dequantized once into a stack buffer (F32 weights are used in
 * place, F16 ones are converted on the fly for small batches) and then
 * multiplied with every batch row, so quantized weights are decoded once per
 * call however large the batch. Nothing is allocated.
 *
 * Batch invariance: each tile kernel computes every output element with
 * the same sequence of operations whatever the batch size or the row's
 * position in it (see the tile kernels), chunks are added in column order,
 * and threads split rows only, so results are bit-identical for any
 * batching and thread count. */
#include "kernels_internal.h"
#include "lora_static.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void lp_kernels_init_reference(lp_kernels *k) {
    memset(k, 0, sizeof *k);
    k->dot_f32 = lp_dot_f32_ref;
    k->axpy_f32 = lp_axpy;
    k->softmax = lp_softmax;
    k->silu_mul = lp_silu_mul;
    k->attn_scores = lp_attn_scores;
    k->attn_mix = lp_attn_mix;
    k->round_f16 = lp_round_f16;
    k->to_f16 = lp_to_f16;
    k->lora_static = &lp_lora_static_ref;
    k->level = 0;
    k->int_level = LP_INT_REF;
    k->int8_activations = true;
    k->cpu_cap = LP_CPU_CAP_NONE;
}

/* ---- dispatch caps (LORAPLEX_CPU) ---------------------------------------------- */

typedef struct cap_alias {
    const char *name;
    int cap;
} cap_alias;

/* This architecture's cap names, canonical names first (highest level
 * first, as lp_cpu_cap_names lists them), then aliases. */
static const cap_alias k_caps[] = {
#if defined(__x86_64__)
    {"amx", LP_CPU_CAP_AMX},           {"avx512-vnni", LP_CPU_CAP_AVX512VNNI}, {"avx512", LP_CPU_CAP_AVX512},
    {"avx-vnni", LP_CPU_CAP_AVXVNNI},  {"avx2", LP_CPU_CAP_AVX2},              {"reference", LP_CPU_CAP_REFERENCE},
    {"amx-int8", LP_CPU_CAP_AMX},      {"avx512vnni", LP_CPU_CAP_AVX512VNNI},  {"avx512_vnni", LP_CPU_CAP_AVX512VNNI},
    {"avxvnni", LP_CPU_CAP_AVXVNNI},   {"avx_vnni", LP_CPU_CAP_AVXVNNI},
#elif defined(__aarch64__)
    {"neon-i8mm", LP_CPU_CAP_NEON_I8MM}, {"neon-dotprod", LP_CPU_CAP_NEON_DOT}, {"reference", LP_CPU_CAP_REFERENCE},
    {"i8mm", LP_CPU_CAP_NEON_I8MM},      {"dotprod", LP_CPU_CAP_NEON_DOT},
#else
    {"reference", LP_CPU_CAP_REFERENCE},
#endif
    {"ref", LP_CPU_CAP_REFERENCE},     {"c", LP_CPU_CAP_REFERENCE},
};

const char *lp_cpu_cap_names(void) {
#if defined(__x86_64__)
    return "amx, avx512-vnni, avx512, avx-vnni, avx2, reference";
#elif defined(__aarch64__)
    return "neon-i8mm, neon-dotprod, reference";
#else
    return "reference";
#endif
}

static bool same_name(const char *a, const char *b) {
    for (; *a && *b; a++, b++) {
        char x = *a >= 'A' && *a <= 'Z' ? (char)(*a - 'A' + 'a') : *a;
        if (x != *b) return false;
    }
    return *a == *b;
}

int lp_cpu_cap_parse(const char *text, int *cap) {
    for (size_t i = 0; text && i < sizeof k_caps / sizeof k_caps[0]; i++)
        if (same_name(text, k_caps[i].name)) {
            *cap = k_caps[i].cap;
            return 0;
        }
    return -1;
}

const char *lp_cpu_cap_name(int cap) {
    for (size_t i = 0; i < sizeof k_caps / sizeof k_caps[0]; i++)
        if (k_caps[i].cap == cap) return k_caps[i].name;
    return cap == LP_CPU_CAP_NONE ? "none" : "?";
}

int lp_cpu_cap_from_env(int *cap, lp_error *err) {
    *cap = LP_CPU_CAP_NONE;
    const char *v = getenv(LP_CPU_ENV);
    if (!v || !*v) return 0;
    if (lp_cpu_cap_parse(v, cap) == 0) return 0;
    *cap = LP_CPU_CAP_NONE;
    return lp_fail(err, "%s=%.64s is not a kernel level; accepted: %s", LP_CPU_ENV, v, lp_cpu_cap_names());
}

void lp_kernels_init(lp_kernels *k, const lp_cpu_features *cpu) {
    int cap;
    lp_error err = {0};
    bool invalid = lp_cpu_cap_from_env(&cap, &err) != 0;
    if (invalid) fprintf(stderr, "loraplex: warning: %s (not capped)\n", err.message);
    lp_kernels_init_capped(k, cpu, cap);
    k->cpu_cap_invalid = invalid;
}

void lp_kernels_init_capped(lp_kernels *k, const lp_cpu_features *cpu, int cap) {
    lp_kernels_init_reference(k);
    k->cpu = *cpu;
    k->cpu_cap = cap;
    if (cap == LP_CPU_CAP_REFERENCE) return;
#if defined(__x86_64__)
    bool avx2 = cpu->avx2 && cpu->fma && cpu->f16c;
    bool avx512 = avx2 && cpu->avx512f && cpu->avx512bw && cpu->avx512vl && cap != LP_CPU_CAP_AVX2 &&
                  cap != LP_CPU_CAP_AVXVNNI;
    if (avx512) {
        k->level = 2;
        k->dot_f32 = lp_dot_f32_avx512;
        k->axpy_f32 = lp_axpy_avx512;
        k->softmax = lp_softmax_avx512;
        k->silu_mul = lp_silu_mul_avx512;
        k->attn_scores = lp_attn_scores_avx512;
        k->attn_mix = lp_attn_mix_avx512;
        k->lora_static = &lp_lora_static_avx512;
    } else if (avx2) {
        k->level = 1;
        k->dot_f32 = lp_dot_f32_avx2;
        k->attn_scores = lp_attn_scores_avx2;
        k->lora_static = &lp_lora_static_avx2;
    }
    if (avx2) {
        k->round_f16 = lp_round_f16_avx2;
        k->to_f16 = lp_to_f16_avx2;
    }
    if (avx512 && cpu->avx512vnni && cap != LP_CPU_CAP_AVX512) {
        k->vbmi = cpu->avx512vbmi;
        /* the AMX kernels are built with VBMI (every AMX CPU has it) */
        bool amx = cap != LP_CPU_CAP_AVX512VNNI && k->vbmi && lp_amx_available();
        k->int_level = amx ? LP_INT_AMX : LP_INT_AVX512VNNI;
    }
    /* capped at avx512 on an AVX-512 CPU: run as one without VNNI, which
     * has no AVX-VNNI either */
    else if (avx2 && cpu->avxvnni && cap != LP_CPU_CAP_AVX2 && !(avx512 && cap == LP_CPU_CAP_AVX512))
        k->int_level = LP_INT_AVXVNNI;
    else if (avx2)
        k->int_level = LP_INT_AVX2;
    /* the shared-profile branch is integer work: it follows the integer level */
    if (k->int_level == LP_INT_AVX512VNNI || k->int_level == LP_INT_AMX)
        k->lora_static = &lp_lora_static_avx512vnni;
    else if (k->int_level == LP_INT_AVXVNNI)
        k->lora_static = &lp_lora_static_avxvnni;
#elif defined(LP_HAVE_NEON_DOT)
    if (cpu->dotprod) {
        k->int_level = LP_INT_NEON_DOT;
        k->i8mm = cpu->i8mm && cap != LP_CPU_CAP_NEON_DOT;
    }
#endif
}

static const char *float_level_name(int level) {
    return level == 2 ? "avx512" : level == 1 ? "avx2" : "reference";
}

void lp_kernels_describe(const lp_kernels *k, char *buf, size_t cap) {
    if (!cap) return;
    lp_kernels native;
    lp_kernels_init_capped(&native, &k->cpu, LP_CPU_CAP_NONE);
    int w = snprintf(buf, cap, "%s%s%s (float %s)", lp_int_level_name(k->int_level), k->vbmi ? " vbmi" : "",
                     k->i8mm ? " i8mm" : "", float_level_name(k->level));
    if (w < 0 || (size_t)w >= cap || k->cpu_cap == LP_CPU_CAP_NONE) return;
    bool lowered = native.int_level != k->int_level || native.level != k->level || native.vbmi != k->vbmi ||
                   native.i8mm != k->i8mm;
    snprintf(buf + w, cap - (size_t)w, ", %s %s=%s (this CPU: %s%s%s, float %s)",
             lowered ? "capped by" : "not lowered by", LP_CPU_ENV, lp_cpu_cap_name(k->cpu_cap),
             lp_int_level_name(native.int_level), native.vbmi ? " vbmi" : "", native.i8mm ? " i8mm" : "",
             float_level_name(native.level));
}

/* ---- per-level building blocks ---------------------------------------------- */

static void tile_f32_ref(const lp_tile *t) {
    for (int r = 0; r < t->nr; r++) {
        const float *w = t->w[r];
        for (int64_t b = 0; b < t->n_batch; b++) {
            float s = lp_dot_f32_ref(w, t->x + b * t->x_stride, t->n);
            float *dst = t->y + b * t->y_stride + r;
            *dst = t->accumulate ? *dst + s : s;
        }
    }
}

static void run_tile(int level, bool f16, const lp_tile *t) {
#if defined(__x86_64__)
    if (level == 2) {
        if (f16) lp_tile_f16_avx512(t);
        else lp_tile_f32_avx512(t);
        return;
    }
    if (level == 1) {
        if (f16) lp_tile_f16_avx2(t);
        else lp_tile_f32_avx2(t);
        return;
    }
#endif
    (void)f16; /* level 0 never sees f16 rows: they are converted first */
    tile_f32_ref(t);
}

void lp_run_tile_f32(int level, const lp_tile *t) { run_tile(level, false, t); }

static void f16_row_to_f32(int level, const uint16_t *src, float *dst, int64_t n) {
#if defined(__x86_64__)
    if (level == 2) {
        lp_f16_to_f32_row_avx512(src, dst, n);
        return;
    }
    if (level == 1) {
        lp_f16_to_f32_row_avx2(src, dst, n);
        return;
    }
#endif
    (void)level;
    for (int64_t i = 0; i < n; i++) dst[i] = lp_f16_to_f32(src[i]);
}

/* ---- the threaded driver ---------------------------------------------------- */

/* One float matmul for the pool: the task and the kernels that run it. */
typedef struct matmul_job {
    const lp_kernels *k;
    lp_matmul_task t;
} matmul_job;

/* Points tile->w at columns [c0, c0+n) of rows r..r+nr-1, decoding into buf
 * when the kernels cannot read the type directly. Returns whether the rows
 * are f16. */
static bool prepare_rows(const matmul_job *job, int64_t r, int nr, int64_t c0, int64_t n,
                         float buf[LP_TILE_ROWS][LP_CHUNK], lp_tile *tile) {
    const lp_weight *W = job->t.W;
    const lp_dtype_info *info = lp_dtype_get(W->type);
    int level = job->k->level;
    /* Converting f16 once pays off when several batch rows reuse it. */
    bool f16_direct = W->type == LP_F16 && level > 0 && job->t.n_batch <= 4;
    for (int i = 0; i < nr; i++) {
        const uint8_t *row = (const uint8_t *)W->data + (size_t)(r + i) * W->row_bytes;
        if (W->type == LP_F32) {
            tile->w[i] = (const float *)row + c0;
        } else if (W->type == LP_F16) {
            const uint16_t *h = (const uint16_t *)row + c0;
            if (f16_direct) {
                tile->w[i] = h;
            } else {
                f16_row_to_f32(level, h, buf[i], n);
                tile->w[i] = buf[i];
            }
        } else {
            size_t offset = (size_t)(c0 / info->block_elems) * (size_t)info->block_bytes;
            lp_dequantize_row_fast(level, W->type, row + offset, buf[i], n);
            tile->w[i] = buf[i];
        }
    }
    for (int i = nr; i < LP_TILE_ROWS; i++) tile->w[i] = tile->w[nr - 1];
    return f16_direct;
}

/* The weights this thread reads after tile (r, c0), as stored (the tile
 * reads rows in place): the next column chunk of the same rows, else the
 * first chunk of its next rows; NULLs after its last tile. Software
 * prefetch of the next tile: the hardware streams each row but starts every
 * new one cold, and a 1-row f16 decode streamed at 77 % of the read test. */
static void next_rows(const lp_weight *W, int64_t r, int nr, int64_t c0, int64_t r1,
                      const void *next[LP_TILE_ROWS]) {
    int64_t nr_next = nr, r_next = r, c_next = c0 + LP_CHUNK;
    if (c_next >= W->cols) {
        r_next = r + LP_TILE_ROWS;
        c_next = 0;
        nr_next = r1 - r_next < LP_TILE_ROWS ? (int)(r1 - r_next) : LP_TILE_ROWS;
    }
    size_t elem = W->type == LP_F16 ? 2 : 4;
    for (int i = 0; i < LP_TILE_ROWS; i++)
        next[i] = i < nr_next ? (const uint8_t *)W->data + (size_t)(r_next + i) * W->row_bytes + (size_t)c_next * elem
                              : NULL;
}

static void matmul_worker(void *ctx, int thread_index, int n_threads) {
    const matmul_job *job = ctx;
    const lp_weight *W = job->t.W;
    int64_t r0, r1;
    lp_split_range(W->rows, thread_index, n_threads, LP_TILE_ROWS, &r0, &r1);
    _Alignas(64) float buf[LP_TILE_ROWS][LP_CHUNK];
    for (int64_t r = r0; r < r1; r += LP_TILE_ROWS) {
        int nr = (int)(r1 - r < LP_TILE_ROWS ? r1 - r : LP_TILE_ROWS);
        for (int64_t c0 = 0; c0 < W->cols; c0 += LP_CHUNK) {
            int64_t n = W->cols - c0 < LP_CHUNK ? W->cols - c0 : LP_CHUNK;
            lp_tile tile = {
                .nr = nr,
                .x = job->t.X + c0,
                .x_stride = job->t.x_stride,
                .n_batch = job->t.n_batch,
                .n = n,
                .y = job->t.Y + r,
                .y_stride = job->t.y_stride,
                .accumulate = c0 > 0,
            };
            bool f16 = prepare_rows(job, r, nr, c0, n, buf, &tile);
            if (tile.w[0] != buf[0]) next_rows(W, r, nr, c0, r1, tile.next_w);
            run_tile(job->k->level, f16, &tile);
        }
    }
}

void lp_matmul(const lp_kernels *k, lp_threadpool *pool, const lp_weight *W,
               const float *X, int64_t x_stride, int64_t n_batch, float *Y,
               int64_t y_stride) {
    if (W->rows <= 0 || n_batch <= 0) return;
    if (lp_dtype_is_packed(W->type)) {
        if (!lp_matmul_packed(k, pool, W, X, x_stride, n_batch, Y, y_stride))
            for (int64_t b = 0; b < n_batch; b++) memset(Y + b * y_stride, 0, (size_t)W->rows * sizeof(float));
        return;
    }
    const lp_dtype_info *info = lp_dtype_get(W->type);
    /* Loaders reject unsupported types; zeros beat reading unknown blocks. */
    if (W->cols <= 0 || !info || !info->supported) {
        for (int64_t b = 0; b < n_batch; b++) memset(Y + b * y_stride, 0, (size_t)W->rows * sizeof(float));
        return;
    }
    matmul_job job = {k, {W, X, x_stride, n_batch, Y, y_stride}};
    /* Too little work to share (tiny models): waking the pool costs more
     * than the multiply. */
    if (W->rows <= LP_TILE_ROWS || (double)W->rows * (double)W->cols * (double)n_batch < 32768.0)
        pool = NULL;
    lp_threadpool_run(pool, matmul_worker, &job);
}

void lp_matmul_multi(const lp_kernels *k, lp_threadpool *pool, int n, const lp_weight *const *W,
                     const float *X, int64_t x_stride, int64_t n_batch, float *const *Y,
                     const int64_t *y_stride) {
    if (n <= 0 || n_batch <= 0) return;
    if (lp_matmul_packed_multi(k, pool, n, W, X, x_stride, n_batch, Y, y_stride)) return;
    for (int i = 0; i < n; i++) lp_matmul(k, pool, W[i], X, x_stride, n_batch, Y[i], y_stride[i]);
}

void lp_matmul_tasks(const lp_kernels *k, lp_threadpool *pool, int n, const lp_matmul_task *tasks) {
    if (n <= 0 || lp_matmul_packed_tasks(k, pool, n, tasks)) return;
    for (int i = 0; i < n; i++) {
        const lp_matmul_task *t = &tasks[i];
        lp_matmul(k, pool, t->W, t->X, t->x_stride, t->n_batch, t->Y, t->y_stride);
    }
}

void lp_matmul_ref(const lp_weight *W, const float *X, int64_t x_stride,
                   int64_t n_batch, float *Y, int64_t y_stride) {
    if (lp_dtype_is_packed(W->type)) {
        lp_matmul_ref_packed(W, X, x_stride, n_batch, Y, y_stride);
        return;
    }
    const lp_dtype_info *info = lp_dtype_get(W->type);
    if (!info || !info->supported) {
        for (int64_t b = 0; b < n_batch; b++)
            for (int64_t r = 0; r < W->rows; r++) Y[b * y_stride + r] = 0.0f;
        return;
    }
    float buf[LP_CHUNK];
    for (int64_t r = 0; r < W->rows; r++) {
        const uint8_t *row = (const uint8_t *)W->data + (size_t)r * W->row_bytes;
        for (int64_t b = 0; b < n_batch; b++) {
            const float *x = X + b * x_stride;
            double sum = 0;
            for (int64_t c0 = 0; c0 < W->cols; c0 += LP_CHUNK) {
                int64_t n = W->cols - c0 < LP_CHUNK ? W->cols - c0 : LP_CHUNK;
                size_t offset = (size_t)(c0 / info->block_elems) * (size_t)info->block_bytes;
                lp_dequantize_row(W->type, row + offset, buf, n);
                for (int64_t i = 0; i < n; i++) sum += (double)buf[i] * (double)x[c0 + i];
            }
            Y[b * y_stride + r] = (float)sum;
        }
    }
}
