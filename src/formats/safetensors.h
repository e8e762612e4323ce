/* safetensors reader (memory-mapped, zero-copy), sharded sets via
 * model.safetensors.index.json, and a small writer (for tests and PEFT
 * adapters we produce).
 *
 * Layout: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {"k": "v"}}, then the data. Offsets are relative to the end
 * of the header. The reader checks every offset, shape product and dtype size
 * against the file and rejects overlaps out of bounds. */
#ifndef LP_SAFETENSORS_H
#define LP_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"

typedef enum lp_st_dtype {
    LP_ST_F32, LP_ST_F16, LP_ST_BF16, LP_ST_F64,
    LP_ST_I8, LP_ST_U8, LP_ST_I16, LP_ST_I32, LP_ST_I64, LP_ST_BOOL,
} lp_st_dtype;

typedef struct lp_st_tensor {
    char *name;            /* NUL-terminated, owned by the handle */
    lp_st_dtype dtype;
    uint32_t n_dims;       /* 0..8 */
    uint64_t shape[8];     /* outermost first, as in the file (PyTorch order) */
    uint64_t n_elements;
    size_t n_bytes;
    const void *data;      /* inside the mapping (may be unaligned) */
} lp_st_tensor;

typedef struct lp_safetensors lp_safetensors;

/* Opens one .safetensors file, or a directory/ index: if `path` is a
 * directory, opens model.safetensors or, failing that,
 * model.safetensors.index.json and all its shards; if it ends in
 * .index.json, opens that index. All tensors of all shards are visible
 * through one handle. */
lp_safetensors *lp_safetensors_open(const char *path, lp_error *err);
lp_safetensors *lp_safetensors_open_memory(const void *data, size_t size,
                                           const char *name, lp_error *err);
void lp_safetensors_close(lp_safetensors *st);

size_t lp_safetensors_count(const lp_safetensors *st);
const lp_st_tensor *lp_safetensors_at(const lp_safetensors *st, size_t i);
const lp_st_tensor *lp_safetensors_find(const lp_safetensors *st, const char *name);
/* __metadata__ value for key, or NULL. */
const char *lp_safetensors_metadata(const lp_safetensors *st, const char *key);
const char *lp_st_dtype_name(lp_st_dtype t);
size_t lp_st_dtype_size(lp_st_dtype t);

/* Converts a F32/F16/BF16 tensor to f32 (n_elements floats into out). */
int lp_st_to_f32(const lp_st_tensor *t, float *out, lp_error *err);

/* Writer: tensors are referenced until write returns; shape outermost first. */
typedef struct lp_st_writer lp_st_writer;
lp_st_writer *lp_st_writer_create(void);
void lp_st_writer_free(lp_st_writer *w);
void lp_st_writer_add(lp_st_writer *w, const char *name, lp_st_dtype dtype,
                      uint32_t n_dims, const uint64_t *shape, const void *data,
                      size_t n_bytes);
void lp_st_writer_set_metadata(lp_st_writer *w, const char *key, const char *value);
int lp_st_writer_write(lp_st_writer *w, const char *path, lp_error *err);

#endif
