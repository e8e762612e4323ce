/* base: errors, memory, mapped files, CPU features, half floats, RNG, threads.
 *
 * The bottom layer. Everything above may include it; it includes nothing of
 * ours except the public header (for lp_error). No global mutable state. */
#ifndef LP_BASE_H
#define LP_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loraplex.h"

/* ---- errors ------------------------------------------------------------ */

/* Writes a printf-style message into err (if non-NULL), sets its status to
 * LP_ERR_INVALID and returns -1, so a failing function can
 * `return lp_fail(err, "...")`. */
int lp_fail(lp_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* lp_error_set (public) does the same with another status (out of memory,
 * KV full, I/O, ...). */
/* A loader's failures that are not I/O or memory are the file's content:
 * turns LP_ERR_INVALID into LP_ERR_FORMAT. */
void lp_error_as_format(lp_error *err);
/* Prefixes an existing message: "context: old message" (status kept). */
int lp_fail_prefix(lp_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- memory ------------------------------------------------------------ */

#define LP_ALIGN 64
/* 64-byte aligned, zero-filled; NULL on overflow or exhaustion. */
void *lp_alloc(size_t size);
/* The same without the zero fill, for large buffers that are always
 * written before they are read (the KV cache): their pages are only
 * touched, and so only made resident, as they are used. */
void *lp_alloc_uninit(size_t size);
/* lp_free (public) releases both. */
/* a*b with overflow check: returns false on overflow. */
static inline bool lp_mul_ok(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool lp_add_ok(size_t a, size_t b, size_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

/* A read-only file in memory: mapped in place, or (lp_load_file_huge) read
 * into anonymous memory. Empty files map to data=NULL, size=0. */
typedef struct lp_mapped_file {
    const uint8_t *data;
    size_t size;
    size_t anon_bytes; /* 0: a file mapping of size bytes; else the anonymous mapping's length */
} lp_mapped_file;

int lp_map_file(const char *path, lp_mapped_file *out, lp_error *err);
/* As lp_map_file, but for a file of LP_HUGE_MIN bytes or more on a system
 * with transparent huge pages, the file is read into anonymous memory
 * asked to be backed by 2 MiB pages (then made read-only): a stream of
 * weights read every step then misses the TLB once per 2 MiB instead of
 * per 4 KiB page, and the prefetchers do not stop at 4 KiB page edges.
 * Costs a copy at load and memory the page cache cannot share. Falls back
 * to mapping in place where huge pages are off or the file is small. */
int lp_load_file_huge(const char *path, lp_mapped_file *out, lp_error *err);
void lp_unmap_file(lp_mapped_file *f);
/* Drops the resident pages of [p, p + n) (the whole pages inside it) of a
 * file mapped in place: memory freed now, read back from the file when
 * touched again. A no-op for an anonymous copy, outside the mapping, or
 * where the system has no such advice. */
void lp_mapped_file_evict(const lp_mapped_file *f, const void *p, size_t n);

/* Below this, files are not worth 2 MiB pages. */
#define LP_HUGE_MIN ((size_t)4 << 20)
/* Whether this system grants transparent huge pages to memory that asks
 * (Linux: /sys/kernel/mm/transparent_hugepage/enabled not "never"). */
bool lp_huge_pages_available(void);
/* Reads a whole file into a NUL-terminated malloc'd buffer (for small text
 * files such as JSON configs). */
int lp_read_file(const char *path, char **out, size_t *size, size_t max_size,
                 lp_error *err);

/* ---- CPU features -------------------------------------------------------- */

typedef struct lp_cpu_features {
    bool avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl, avx512vnni, avx512vbmi, avx512bf16;
    bool avxvnni;
    bool neon, dotprod, i8mm; /* i8mm: the int8 matrix multiply-accumulate (smmla) */
} lp_cpu_features;

void lp_cpu_detect(lp_cpu_features *out);
/* "avx2 fma f16c avx512f ..." for logs. */
void lp_cpu_describe(const lp_cpu_features *f, char *buf, size_t cap);

/* ---- half floats -------------------------------------------------------- */

float lp_f16_to_f32(uint16_t h);
uint16_t lp_f32_to_f16(float f); /* round to nearest even */
static inline float lp_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = { .u = (uint32_t)h << 16 };
    return v.f;
}
uint16_t lp_f32_to_bf16(float f); /* round to nearest even */

/* ---- deterministic RNG (xoshiro256**) ------------------------------------ */

typedef struct lp_rng { uint64_t s[4]; } lp_rng;

void lp_rng_seed(lp_rng *rng, uint64_t seed);
uint64_t lp_rng_u64(lp_rng *rng);
float lp_rng_uniform(lp_rng *rng); /* [0, 1) */
float lp_rng_normal(lp_rng *rng);  /* N(0, 1) */

/* ---- threads ------------------------------------------------------------ */

/* A fixed pool of workers that run one parallel task at a time. The caller's
 * thread takes part as thread 0, so a pool of 1 runs everything inline. */
typedef struct lp_threadpool lp_threadpool;
typedef void (*lp_task_fn)(void *ctx, int thread_index, int n_threads);

/* At most LP_THREADS_MAX threads (per-thread state elsewhere is sized by it). */
#define LP_THREADS_MAX 256
lp_threadpool *lp_threadpool_create(int n_threads, lp_error *err);
void lp_threadpool_destroy(lp_threadpool *pool);
int lp_threadpool_size(const lp_threadpool *pool);
/* Runs fn(ctx, i, n) for i in 0..n-1 concurrently and returns when all are
 * done. pool may be NULL (runs fn(ctx, 0, 1)). */
void lp_threadpool_run(lp_threadpool *pool, lp_task_fn fn, void *ctx);
/* Splits [0, n) into n_threads contiguous chunks (aligned to `align`). */
void lp_split_range(int64_t n, int thread_index, int n_threads, int64_t align,
                    int64_t *begin, int64_t *end);
int lp_default_threads(void);

/* ---- time --------------------------------------------------------------- */
double lp_now_seconds(void); /* monotonic */

/* ---- UTF-8 ---------------------------------------------------------------- */
/* Length of the valid UTF-8 sequence at s (1..4), or 0 if invalid. */
int lp_utf8_len(const uint8_t *s, size_t avail);
bool lp_utf8_valid(const uint8_t *s, size_t n);

#endif
