/* GGUF v2/v3 reader (memory-mapped, zero-copy) and writer.
 *
 * The reader validates everything up front: every length, count and offset is
 * checked against the file size (with overflow checks), tensor types must be
 * known, dimensions must be sane, tensor data must lie inside the file, keys
 * and string values must be valid UTF-8. After lp_gguf_open succeeds, the
 * accessors below cannot read out of bounds. */
#ifndef LP_GGUF_H
#define LP_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"

typedef enum lp_gguf_type {
    LP_GGUF_U8 = 0,
    LP_GGUF_I8 = 1,
    LP_GGUF_U16 = 2,
    LP_GGUF_I16 = 3,
    LP_GGUF_U32 = 4,
    LP_GGUF_I32 = 5,
    LP_GGUF_F32 = 6,
    LP_GGUF_BOOL = 7,
    LP_GGUF_STRING = 8,
    LP_GGUF_ARRAY = 9,
    LP_GGUF_U64 = 10,
    LP_GGUF_I64 = 11,
    LP_GGUF_F64 = 12,
} lp_gguf_type;

/* A string inside the mapped file: not NUL-terminated. */
typedef struct lp_str {
    const char *ptr;
    size_t len;
} lp_str;

bool lp_str_eq(lp_str s, const char *cstr);

typedef struct lp_gguf_kv {
    lp_str key;
    lp_gguf_type type;
    /* scalars (integers widened, floats widened): unsigned types in u,
     * signed types in i, F32/F64 in f, BOOL in b, STRING in s */
    union {
        uint64_t u;
        int64_t i;
        double f;
        bool b;
        lp_str s;
    } v;
    /* arrays: element type, count, raw little-endian data (possibly
     * unaligned: read with the lp_gguf_arr_* helpers). For string arrays
     * `strs` indexes every element; raw is NULL. Nested arrays are rejected. */
    lp_gguf_type arr_type;
    uint64_t arr_len;
    const uint8_t *arr_raw;
    const lp_str *arr_strs;
} lp_gguf_kv;

typedef struct lp_gguf_tensor {
    lp_str name;
    uint32_t n_dims;        /* 1..4 */
    uint64_t dims[4];       /* innermost first, unused = 1 */
    uint32_t type;          /* lp_dtype id (known and with a valid row size) */
    uint64_t n_elements;
    size_t n_bytes;
    const void *data;       /* inside the mapping, aligned to general.alignment */
} lp_gguf_tensor;

typedef struct lp_gguf lp_gguf;

/* Opens and validates a file (memory-mapped). Errors name the file. */
lp_gguf *lp_gguf_open(const char *path, lp_error *err);
/* Same over a caller-owned buffer (must outlive the handle); `name` is used in
 * error messages. Used by the fuzzer and tests. */
lp_gguf *lp_gguf_open_memory(const void *data, size_t size, const char *name,
                             lp_error *err);
void lp_gguf_close(lp_gguf *g);

uint32_t lp_gguf_version(const lp_gguf *g);
const char *lp_gguf_path(const lp_gguf *g);
size_t lp_gguf_file_size(const lp_gguf *g);

size_t lp_gguf_kv_count(const lp_gguf *g);
const lp_gguf_kv *lp_gguf_kv_at(const lp_gguf *g, size_t i);
const lp_gguf_kv *lp_gguf_find(const lp_gguf *g, const char *key);

size_t lp_gguf_tensor_count(const lp_gguf *g);
const lp_gguf_tensor *lp_gguf_tensor_at(const lp_gguf *g, size_t i);
const lp_gguf_tensor *lp_gguf_find_tensor(const lp_gguf *g, const char *name);

/* Typed getters. Return 1 if found and converted, 0 if the key is absent, and
 * -1 (with a message naming the key and file) if present with an
 * incompatible type or out of range. Integer getters accept any integer
 * type whose value fits. Float getters accept F32/F64 (and integers). */
int lp_gguf_get_u32(const lp_gguf *g, const char *key, uint32_t *out, lp_error *err);
int lp_gguf_get_u64(const lp_gguf *g, const char *key, uint64_t *out, lp_error *err);
int lp_gguf_get_i32(const lp_gguf *g, const char *key, int32_t *out, lp_error *err);
int lp_gguf_get_f32(const lp_gguf *g, const char *key, float *out, lp_error *err);
int lp_gguf_get_bool(const lp_gguf *g, const char *key, bool *out, lp_error *err);
int lp_gguf_get_str(const lp_gguf *g, const char *key, lp_str *out, lp_error *err);
/* Arrays: returns the kv (or NULL if absent / not an array of that element
 * kind, with -1 semantics reported through err when present but wrong). */
int lp_gguf_get_arr(const lp_gguf *g, const char *key, lp_gguf_type elem_type,
                    const lp_gguf_kv **out, lp_error *err);

/* Element readers for numeric arrays (bounds are the caller's job: i < arr_len). */
float lp_gguf_arr_f32(const lp_gguf_kv *kv, uint64_t i);
int32_t lp_gguf_arr_i32(const lp_gguf_kv *kv, uint64_t i);
uint32_t lp_gguf_arr_u32(const lp_gguf_kv *kv, uint64_t i);
uint8_t lp_gguf_arr_u8(const lp_gguf_kv *kv, uint64_t i);

/* ---- writer -------------------------------------------------------------- */

/* Builds a GGUF v3 file in memory-light fashion: metadata is copied, tensor
 * data is referenced (must stay valid until lp_gguf_writer_write returns)
 * unless added with lp_gguf_writer_add_tensor_copy. */
typedef struct lp_gguf_writer lp_gguf_writer;

lp_gguf_writer *lp_gguf_writer_create(void);
void lp_gguf_writer_free(lp_gguf_writer *w);
void lp_gguf_writer_set_u32(lp_gguf_writer *w, const char *key, uint32_t v);
void lp_gguf_writer_set_i32(lp_gguf_writer *w, const char *key, int32_t v);
void lp_gguf_writer_set_u64(lp_gguf_writer *w, const char *key, uint64_t v);
void lp_gguf_writer_set_f32(lp_gguf_writer *w, const char *key, float v);
void lp_gguf_writer_set_bool(lp_gguf_writer *w, const char *key, bool v);
void lp_gguf_writer_set_str(lp_gguf_writer *w, const char *key, const char *v);
void lp_gguf_writer_set_arr_str(lp_gguf_writer *w, const char *key,
                                const lp_str *items, uint64_t n);
void lp_gguf_writer_set_arr_f32(lp_gguf_writer *w, const char *key,
                                const float *items, uint64_t n);
void lp_gguf_writer_set_arr_i32(lp_gguf_writer *w, const char *key,
                                const int32_t *items, uint64_t n);
/* Copies a key/value (any type, arrays included) from an open file. */
void lp_gguf_writer_copy_kv(lp_gguf_writer *w, const lp_gguf_kv *kv);
/* dims innermost first. */
void lp_gguf_writer_add_tensor(lp_gguf_writer *w, const char *name, uint32_t type,
                               uint32_t n_dims, const uint64_t *dims,
                               const void *data, size_t n_bytes);
void lp_gguf_writer_add_tensor_copy(lp_gguf_writer *w, const char *name,
                                    uint32_t type, uint32_t n_dims,
                                    const uint64_t *dims, const void *data,
                                    size_t n_bytes);
/* Writes the file (alignment 32). Any earlier allocation failure or invalid
 * call is reported here. */
int lp_gguf_writer_write(lp_gguf_writer *w, const char *path, lp_error *err);

#endif
