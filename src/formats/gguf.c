/* GGUF v2/v3 reader and v3 writer.
 *
 * File layout (all little-endian):
 *   "GGUF" u32 version u64 tensor_count u64 kv_count
 *   kv_count x { string key, u32 type, value }
 *   tensor_count x { string name, u32 n_dims, u64 dims[n_dims], u32 type, u64 offset }
 *   zero padding up to general.alignment (default 32)
 *   tensor data (each offset relative to here, aligned)
 * where string = u64 length + bytes (no NUL) and an array value is
 * u32 element type, u64 count, elements.
 *
 * The reader checks everything once in lp_gguf_open_memory, so the accessors
 * can trust the parsed tables. Errors are built inside out: low-level readers
 * describe the problem, callers prefix the context (kv/tensor, file name). */
#include "gguf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/dtype.h"

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4
/* No real tensor has a dimension this large; it also keeps products sane. */
#define GGUF_MAX_DIM ((uint64_t)1 << 40)
/* Smallest possible encodings, used to reject absurd counts before we
 * allocate tables for them: key length (8) + type (4) + 1-byte value, and
 * name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8). */
#define GGUF_MIN_KV_BYTES 13
#define GGUF_MIN_TENSOR_INFO_BYTES 32
/* How much of a key or name to quote in messages. */
#define QUOTE_MAX 80

/* ---- name index (open addressing over lp_str) ---------------------------- */

typedef struct name_index {
    size_t *slots; /* entry index + 1; 0 = empty */
    size_t cap;    /* power of two */
} name_index;

static uint64_t hash_bytes(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
    return h;
}

static int index_init(name_index *ix, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2; /* n is bounded by the file size: no overflow */
    ix->slots = calloc(cap, sizeof *ix->slots);
    ix->cap = cap;
    return ix->slots ? 0 : -1;
}

/* Looks up `name`; returns its entry index or SIZE_MAX. names(i) gives the
 * name of entry i. If absent and insert_as != SIZE_MAX, inserts it. */
typedef lp_str (*name_of_fn)(const void *table, size_t i);

static size_t index_lookup(name_index *ix, const void *table, name_of_fn name_of,
                           const char *p, size_t n, size_t insert_as) {
    if (!ix->slots) return SIZE_MAX;
    size_t mask = ix->cap - 1;
    for (size_t s = (size_t)hash_bytes(p, n) & mask;; s = (s + 1) & mask) {
        if (ix->slots[s] == 0) {
            if (insert_as != SIZE_MAX) ix->slots[s] = insert_as + 1;
            return SIZE_MAX;
        }
        lp_str other = name_of(table, ix->slots[s] - 1);
        if (other.len == n && memcmp(other.ptr, p, n) == 0) return ix->slots[s] - 1;
    }
}

static lp_str kv_name(const void *table, size_t i) {
    return ((const lp_gguf_kv *)table)[i].key;
}
static lp_str tensor_name(const void *table, size_t i) {
    return ((const lp_gguf_tensor *)table)[i].name;
}

/* ---- the handle ---------------------------------------------------------- */

struct lp_gguf {
    char *name;            /* path or caller-supplied name, for messages */
    lp_mapped_file file;   /* owned mapping when opened from a path */
    const uint8_t *data;
    size_t size;
    uint32_t version;
    size_t alignment;
    size_t data_offset;    /* start of the tensor data section */
    lp_gguf_kv *kvs;
    size_t n_kv;
    lp_gguf_tensor *tensors;
    size_t n_tensors;
    name_index kv_index, tensor_index;
};

bool lp_str_eq(lp_str s, const char *cstr) {
    size_t n = strlen(cstr);
    return s.len == n && (n == 0 || memcmp(s.ptr, cstr, n) == 0);
}

static const char *type_name(uint32_t t) {
    static const char *const names[] = {"u8",  "i8",  "u16",    "i16",   "u32",
                                        "i32", "f32", "bool",   "string", "array",
                                        "u64", "i64", "f64"};
    return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

/* Bytes of a fixed-size value type, 0 for string/array/unknown. */
static size_t scalar_size(uint32_t t) {
    switch (t) {
    case LP_GGUF_U8: case LP_GGUF_I8: case LP_GGUF_BOOL: return 1;
    case LP_GGUF_U16: case LP_GGUF_I16: return 2;
    case LP_GGUF_U32: case LP_GGUF_I32: case LP_GGUF_F32: return 4;
    case LP_GGUF_U64: case LP_GGUF_I64: case LP_GGUF_F64: return 8;
    default: return 0;
    }
}

static bool is_unsigned_type(uint32_t t) {
    return t == LP_GGUF_U8 || t == LP_GGUF_U16 || t == LP_GGUF_U32 || t == LP_GGUF_U64;
}
static bool is_signed_type(uint32_t t) {
    return t == LP_GGUF_I8 || t == LP_GGUF_I16 || t == LP_GGUF_I32 || t == LP_GGUF_I64;
}

/* Decodes one little-endian fixed-size value of type t at p. */
static void decode_scalar(uint32_t t, const uint8_t *p, lp_gguf_kv *kv) {
    uint64_t u = 0;
    size_t n = scalar_size(t);
    for (size_t i = 0; i < n; i++) u |= (uint64_t)p[i] << (8 * i);
    switch (t) {
    case LP_GGUF_I8: kv->v.i = (int8_t)(uint8_t)u; break;
    case LP_GGUF_I16: kv->v.i = (int16_t)(uint16_t)u; break;
    case LP_GGUF_I32: kv->v.i = (int32_t)(uint32_t)u; break;
    case LP_GGUF_I64: kv->v.i = (int64_t)u; break;
    case LP_GGUF_F32: {
        uint32_t b = (uint32_t)u;
        float f;
        memcpy(&f, &b, 4);
        kv->v.f = f;
        break;
    }
    case LP_GGUF_F64: memcpy(&kv->v.f, &u, 8); break;
    case LP_GGUF_BOOL: kv->v.b = u != 0; break;
    default: kv->v.u = u; break;
    }
}

/* ---- bounds-checked cursor ----------------------------------------------- */

typedef struct reader {
    const uint8_t *p;
    size_t size, pos;
    lp_error *err;
} reader;

static size_t left(const reader *r) { return r->size - r->pos; }

static int need(reader *r, size_t n) {
    if (n > left(r))
        return lp_fail(r->err, "truncated: needs %zu bytes at offset %zu but only %zu remain",
                       n, r->pos, left(r));
    return 0;
}

static int read_u32(reader *r, uint32_t *out) {
    if (need(r, 4)) return -1;
    const uint8_t *p = r->p + r->pos;
    *out = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    r->pos += 4;
    return 0;
}

static int read_u64(reader *r, uint64_t *out) {
    uint32_t lo, hi;
    if (need(r, 8) || read_u32(r, &lo) || read_u32(r, &hi)) return -1;
    *out = (uint64_t)hi << 32 | lo;
    return 0;
}

/* A length-prefixed UTF-8 string. */
static int read_str(reader *r, lp_str *out) {
    uint64_t len;
    if (read_u64(r, &len)) return -1;
    if (len > left(r))
        return lp_fail(r->err, "string length %llu at offset %zu exceeds the %zu bytes left in the file",
                       (unsigned long long)len, r->pos - 8, left(r));
    const uint8_t *s = r->p + r->pos;
    if (!lp_utf8_valid(s, (size_t)len))
        return lp_fail(r->err, "string at offset %zu is not valid UTF-8", r->pos - 8);
    out->ptr = (const char *)s;
    out->len = (size_t)len;
    r->pos += (size_t)len;
    return 0;
}

/* ---- parsing ------------------------------------------------------------- */

static int parse_array(reader *r, lp_gguf_kv *kv) {
    uint32_t elem;
    uint64_t count;
    if (read_u32(r, &elem) || read_u64(r, &count)) return -1;
    kv->arr_type = (lp_gguf_type)elem;
    if (elem == LP_GGUF_ARRAY) return lp_fail(r->err, "nested arrays are not supported");
    if (elem == LP_GGUF_STRING) {
        /* every element needs at least its 8-byte length */
        if (count > left(r) / 8)
            return lp_fail(r->err, "string array of %llu elements cannot fit in the %zu bytes left",
                           (unsigned long long)count, left(r));
        lp_str *strs = NULL;
        if (count > 0) {
            strs = calloc((size_t)count, sizeof *strs);
            if (!strs) return lp_error_set(r->err, LP_ERR_NOMEM, "out of memory for %llu strings", (unsigned long long)count);
        }
        kv->arr_strs = strs; /* owned by the kv from here on (freed on close) */
        kv->arr_len = count;
        for (uint64_t i = 0; i < count; i++)
            if (read_str(r, &strs[i])) return lp_fail_prefix(r->err, "element %llu", (unsigned long long)i);
        return 0;
    }
    size_t esize = scalar_size(elem);
    if (esize == 0) return lp_fail(r->err, "unknown array element type %u", elem);
    if (count > left(r) / esize)
        return lp_fail(r->err, "array of %llu %s elements exceeds the %zu bytes left in the file",
                       (unsigned long long)count, type_name(elem), left(r));
    kv->arr_len = count;
    kv->arr_raw = r->p + r->pos;
    r->pos += (size_t)count * esize;
    return 0;
}

static int parse_value(reader *r, lp_gguf_kv *kv) {
    uint32_t type;
    if (read_u32(r, &type)) return -1;
    kv->type = (lp_gguf_type)type;
    if (type == LP_GGUF_STRING) return read_str(r, &kv->v.s);
    if (type == LP_GGUF_ARRAY) return parse_array(r, kv);
    size_t n = scalar_size(type);
    if (n == 0) return lp_fail(r->err, "unknown value type %u", type);
    if (need(r, n)) return -1;
    decode_scalar(type, r->p + r->pos, kv);
    r->pos += n;
    return 0;
}

static int parse_kvs(lp_gguf *g, reader *r) {
    if (index_init(&g->kv_index, g->n_kv)) return lp_error_set(r->err, LP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < g->n_kv; i++) {
        lp_gguf_kv *kv = &g->kvs[i];
        if (read_str(r, &kv->key)) return lp_fail_prefix(r->err, "kv #%zu key", i);
        int klen = kv->key.len > QUOTE_MAX ? QUOTE_MAX : (int)kv->key.len;
        if (index_lookup(&g->kv_index, g->kvs, kv_name, kv->key.ptr, kv->key.len, i) != SIZE_MAX)
            return lp_fail(r->err, "duplicate key '%.*s'", klen, kv->key.ptr);
        if (parse_value(r, kv)) return lp_fail_prefix(r->err, "kv #%zu '%.*s'", i, klen, kv->key.ptr);
    }
    return 0;
}

/* general.alignment: any integer type holding a power of two. */
static int read_alignment(lp_gguf *g, lp_error *err) {
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const lp_gguf_kv *kv = lp_gguf_find(g, "general.alignment");
    if (!kv) return 0;
    uint64_t a;
    if (is_unsigned_type(kv->type)) a = kv->v.u;
    else if (is_signed_type(kv->type) && kv->v.i > 0) a = (uint64_t)kv->v.i;
    else return lp_fail(err, "general.alignment has type %s, expected u32", type_name(kv->type));
    if (a == 0 || (a & (a - 1)) != 0 || a > ((uint64_t)1 << 30))
        return lp_fail(err, "general.alignment %llu is not a power of two (up to 2^30)",
                       (unsigned long long)a);
    g->alignment = (size_t)a;
    return 0;
}

static int parse_tensor_info(reader *r, lp_gguf_tensor *t, uint64_t *offset) {
    uint32_t n_dims, type;
    if (read_str(r, &t->name) || read_u32(r, &n_dims)) return -1;
    if (n_dims == 0 || n_dims > GGUF_MAX_DIMS)
        return lp_fail(r->err, "has %u dimensions (expected 1..%d)", n_dims, GGUF_MAX_DIMS);
    t->n_dims = n_dims;
    uint64_t n_elements = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->dims[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (read_u64(r, &t->dims[d])) return -1;
        if (t->dims[d] == 0 || t->dims[d] > GGUF_MAX_DIM)
            return lp_fail(r->err, "dimension %u is %llu (expected 1..2^40)", d,
                           (unsigned long long)t->dims[d]);
        if (__builtin_mul_overflow(n_elements, t->dims[d], &n_elements))
            return lp_fail(r->err, "element count overflows");
    }
    if (read_u32(r, &type) || read_u64(r, offset)) return -1;
    /* our own packed ids (LP_W4 ...) are not GGML types: their panels are
     * not rows, so the byte size below would not bound what kernels read */
    const lp_dtype_info *info = type < LP_DTYPE_COUNT ? lp_dtype_get(type) : NULL;
    if (!info) return lp_fail(r->err, "has unknown tensor type %u", type);
    t->type = type;
    t->n_elements = n_elements;
    size_t row = lp_dtype_row_bytes(type, t->dims[0]);
    if (row == 0)
        return lp_fail(r->err, "innermost dimension %llu is not a multiple of the %s block size %d",
                       (unsigned long long)t->dims[0], info->name, info->block_elems);
    if (!lp_mul_ok(row, (size_t)(n_elements / t->dims[0]), &t->n_bytes))
        return lp_fail(r->err, "byte size overflows");
    return 0;
}

static int parse_tensors(lp_gguf *g, reader *r, uint64_t *offsets) {
    if (index_init(&g->tensor_index, g->n_tensors)) return lp_error_set(r->err, LP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < g->n_tensors; i++) {
        lp_gguf_tensor *t = &g->tensors[i];
        if (parse_tensor_info(r, t, &offsets[i])) {
            if (t->name.ptr) {
                int n = t->name.len > QUOTE_MAX ? QUOTE_MAX : (int)t->name.len;
                return lp_fail_prefix(r->err, "tensor #%zu '%.*s'", i, n, t->name.ptr);
            }
            return lp_fail_prefix(r->err, "tensor #%zu name", i);
        }
        if (index_lookup(&g->tensor_index, g->tensors, tensor_name, t->name.ptr, t->name.len, i) !=
            SIZE_MAX) {
            int n = t->name.len > QUOTE_MAX ? QUOTE_MAX : (int)t->name.len;
            return lp_fail(r->err, "duplicate tensor name '%.*s'", n, t->name.ptr);
        }
    }
    return 0;
}

/* Places every tensor inside the data section, checking alignment and bounds. */
static int locate_tensor_data(lp_gguf *g, size_t info_end, const uint64_t *offsets, lp_error *err) {
    size_t a = g->alignment, start;
    if (!lp_add_ok(info_end, a - 1, &start)) return lp_fail(err, "data section offset overflows");
    g->data_offset = start & ~(a - 1);
    for (size_t i = 0; i < g->n_tensors; i++) {
        lp_gguf_tensor *t = &g->tensors[i];
        int n = t->name.len > QUOTE_MAX ? QUOTE_MAX : (int)t->name.len;
        uint64_t off = offsets[i];
        if (off % a != 0)
            return lp_fail(err, "tensor '%.*s' data offset %llu is not a multiple of the alignment %zu",
                           n, t->name.ptr, (unsigned long long)off, a);
        size_t begin, end;
        if ((uint64_t)(size_t)off != off || !lp_add_ok(g->data_offset, (size_t)off, &begin) ||
            !lp_add_ok(begin, t->n_bytes, &end) || end > g->size)
            return lp_fail(err, "tensor '%.*s' data [offset %llu, %zu bytes] extends past end of file (size %zu)",
                           n, t->name.ptr, (unsigned long long)off, t->n_bytes, g->size);
        t->data = g->data + begin;
    }
    return 0;
}

static int parse_header(lp_gguf *g, reader *r, uint64_t *n_tensors, uint64_t *n_kv) {
    if (r->size < 4 || memcmp(r->p, "GGUF", 4) != 0) {
        if (r->size < 4) return lp_fail(r->err, "too small to be a GGUF file (%zu bytes)", r->size);
        return lp_fail(r->err, "not a GGUF file (bad magic %02x %02x %02x %02x)", r->p[0], r->p[1],
                       r->p[2], r->p[3]);
    }
    r->pos = 4;
    if (read_u32(r, &g->version)) return lp_fail_prefix(r->err, "header");
    if (g->version == 1)
        return lp_fail(r->err, "GGUF version 1 is not supported (only versions 2 and 3; re-convert the model)");
    if (g->version == 0x02000000u || g->version == 0x03000000u)
        return lp_fail(r->err, "big-endian GGUF files are not supported");
    if (g->version != 2 && g->version != 3)
        return lp_fail(r->err, "unsupported GGUF version %u (expected 2 or 3)", g->version);
    if (read_u64(r, n_tensors) || read_u64(r, n_kv)) return lp_fail_prefix(r->err, "header");
    /* Reject counts that cannot fit before allocating anything for them. */
    if (*n_kv > left(r) / GGUF_MIN_KV_BYTES)
        return lp_fail(r->err, "kv count %llu cannot fit in a file of %zu bytes",
                       (unsigned long long)*n_kv, r->size);
    if (*n_tensors > left(r) / GGUF_MIN_TENSOR_INFO_BYTES ||
        *n_kv * GGUF_MIN_KV_BYTES + *n_tensors * GGUF_MIN_TENSOR_INFO_BYTES > left(r))
        return lp_fail(r->err, "tensor count %llu cannot fit in a file of %zu bytes",
                       (unsigned long long)*n_tensors, r->size);
    return 0;
}

static int parse(lp_gguf *g, lp_error *err) {
    reader r = {g->data, g->size, 0, err};
    uint64_t n_tensors, n_kv;
    if (parse_header(g, &r, &n_tensors, &n_kv)) return -1;
    g->n_kv = (size_t)n_kv;
    g->n_tensors = (size_t)n_tensors;
    g->kvs = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kvs);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kvs || !g->tensors) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    if (parse_kvs(g, &r) || read_alignment(g, err)) return -1;
    uint64_t *offsets = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *offsets);
    if (!offsets) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    int rc = parse_tensors(g, &r, offsets);
    if (rc == 0) rc = locate_tensor_data(g, r.pos, offsets, err);
    free(offsets);
    return rc;
}

void lp_gguf_close(lp_gguf *g) {
    if (!g) return;
    if (g->kvs)
        for (size_t i = 0; i < g->n_kv; i++) free((void *)g->kvs[i].arr_strs);
    free(g->kvs);
    free(g->tensors);
    free(g->kv_index.slots);
    free(g->tensor_index.slots);
    lp_unmap_file(&g->file);
    free(g->name);
    free(g);
}

static lp_gguf *open_common(lp_gguf *g, const char *name, lp_error *err) {
    if (parse(g, err)) {
        lp_fail_prefix(err, "%s", name);
        lp_gguf_close(g);
        return NULL;
    }
    return g;
}

static lp_gguf *new_handle(const char *name, lp_error *err) {
    lp_gguf *g = calloc(1, sizeof *g);
    if (g) g->name = strdup(name ? name : "(memory)");
    if (!g || !g->name) {
        free(g);
        lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", name ? name : "(memory)");
        return NULL;
    }
    return g;
}

lp_gguf *lp_gguf_open_memory(const void *data, size_t size, const char *name, lp_error *err) {
    lp_gguf *g = new_handle(name, err);
    if (!g) return NULL;
    g->data = data;
    g->size = data ? size : 0;
    return open_common(g, g->name, err);
}

lp_gguf *lp_gguf_open(const char *path, lp_error *err) {
    lp_gguf *g = new_handle(path, err);
    if (!g) return NULL;
    if (lp_map_file(path, &g->file, err)) {
        lp_gguf_close(g);
        return NULL;
    }
    g->data = g->file.data;
    g->size = g->file.size;
    return open_common(g, g->name, err);
}

/* ---- accessors ----------------------------------------------------------- */

uint32_t lp_gguf_version(const lp_gguf *g) { return g->version; }
const char *lp_gguf_path(const lp_gguf *g) { return g->name; }
size_t lp_gguf_file_size(const lp_gguf *g) { return g->size; }
size_t lp_gguf_kv_count(const lp_gguf *g) { return g->n_kv; }
size_t lp_gguf_tensor_count(const lp_gguf *g) { return g->n_tensors; }

const lp_gguf_kv *lp_gguf_kv_at(const lp_gguf *g, size_t i) {
    return i < g->n_kv ? &g->kvs[i] : NULL;
}

const lp_gguf_tensor *lp_gguf_tensor_at(const lp_gguf *g, size_t i) {
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const lp_gguf_kv *lp_gguf_find(const lp_gguf *g, const char *key) {
    size_t i = index_lookup((name_index *)&g->kv_index, g->kvs, kv_name, key, strlen(key), SIZE_MAX);
    return i == SIZE_MAX ? NULL : &g->kvs[i];
}

const lp_gguf_tensor *lp_gguf_find_tensor(const lp_gguf *g, const char *name) {
    size_t i = index_lookup((name_index *)&g->tensor_index, g->tensors, tensor_name, name,
                            strlen(name), SIZE_MAX);
    return i == SIZE_MAX ? NULL : &g->tensors[i];
}

/* ---- typed getters ------------------------------------------------------- */

static int wrong_type(const lp_gguf *g, const char *key, const lp_gguf_kv *kv, const char *want,
                      lp_error *err) {
    return lp_fail(err, "%s: key '%s' has type %s, expected %s", g->name, key, type_name(kv->type),
                   want);
}

/* Integer value as sign + magnitude, so every range check is exact. */
static bool kv_integer(const lp_gguf_kv *kv, bool *neg, uint64_t *mag) {
    if (is_unsigned_type(kv->type)) {
        *neg = false;
        *mag = kv->v.u;
    } else if (is_signed_type(kv->type)) {
        *neg = kv->v.i < 0;
        *mag = *neg ? (uint64_t)0 - (uint64_t)kv->v.i : (uint64_t)kv->v.i;
    } else {
        return false;
    }
    return true;
}

static int get_int(const lp_gguf *g, const char *key, uint64_t max_pos, uint64_t max_neg,
                   const char *want, bool *neg, uint64_t *mag, lp_error *err) {
    const lp_gguf_kv *kv = lp_gguf_find(g, key);
    if (!kv) return 0;
    if (!kv_integer(kv, neg, mag)) return wrong_type(g, key, kv, want, err);
    if ((*neg && *mag > max_neg) || (!*neg && *mag > max_pos))
        return lp_fail(err, "%s: key '%s' value %s%llu is out of range for %s", g->name, key,
                       *neg ? "-" : "", (unsigned long long)*mag, want);
    return 1;
}

int lp_gguf_get_u32(const lp_gguf *g, const char *key, uint32_t *out, lp_error *err) {
    bool neg = false;
    uint64_t mag = 0;
    int rc = get_int(g, key, UINT32_MAX, 0, "u32", &neg, &mag, err);
    if (rc == 1) *out = (uint32_t)mag;
    return rc;
}

int lp_gguf_get_u64(const lp_gguf *g, const char *key, uint64_t *out, lp_error *err) {
    bool neg = false;
    uint64_t mag = 0;
    int rc = get_int(g, key, UINT64_MAX, 0, "u64", &neg, &mag, err);
    if (rc == 1) *out = mag;
    return rc;
}

int lp_gguf_get_i32(const lp_gguf *g, const char *key, int32_t *out, lp_error *err) {
    bool neg = false;
    uint64_t mag = 0;
    int rc = get_int(g, key, INT32_MAX, (uint64_t)INT32_MAX + 1, "i32", &neg, &mag, err);
    if (rc == 1) *out = neg ? (int32_t)(-(int64_t)mag) : (int32_t)mag;
    return rc;
}

int lp_gguf_get_f32(const lp_gguf *g, const char *key, float *out, lp_error *err) {
    const lp_gguf_kv *kv = lp_gguf_find(g, key);
    if (!kv) return 0;
    bool neg = false;
    uint64_t mag = 0;
    if (kv->type == LP_GGUF_F32 || kv->type == LP_GGUF_F64) *out = (float)kv->v.f;
    else if (kv_integer(kv, &neg, &mag)) *out = neg ? -(float)mag : (float)mag;
    else return wrong_type(g, key, kv, "a number", err);
    return 1;
}

int lp_gguf_get_bool(const lp_gguf *g, const char *key, bool *out, lp_error *err) {
    const lp_gguf_kv *kv = lp_gguf_find(g, key);
    if (!kv) return 0;
    if (kv->type != LP_GGUF_BOOL) return wrong_type(g, key, kv, "bool", err);
    *out = kv->v.b;
    return 1;
}

int lp_gguf_get_str(const lp_gguf *g, const char *key, lp_str *out, lp_error *err) {
    const lp_gguf_kv *kv = lp_gguf_find(g, key);
    if (!kv) return 0;
    if (kv->type != LP_GGUF_STRING) return wrong_type(g, key, kv, "string", err);
    *out = kv->v.s;
    return 1;
}

int lp_gguf_get_arr(const lp_gguf *g, const char *key, lp_gguf_type elem_type,
                    const lp_gguf_kv **out, lp_error *err) {
    *out = NULL;
    const lp_gguf_kv *kv = lp_gguf_find(g, key);
    if (!kv) return 0;
    if (kv->type != LP_GGUF_ARRAY) return wrong_type(g, key, kv, "array", err);
    if (kv->arr_type != elem_type)
        return lp_fail(err, "%s: key '%s' is an array of %s, expected an array of %s", g->name, key,
                       type_name(kv->arr_type), type_name(elem_type));
    *out = kv;
    return 1;
}

/* Array elements of any numeric type, converted (saturating for integers). */
static double arr_number(const lp_gguf_kv *kv, uint64_t i) {
    size_t n = scalar_size(kv->arr_type);
    if (!kv->arr_raw || n == 0 || i >= kv->arr_len) return 0;
    lp_gguf_kv tmp;
    decode_scalar(kv->arr_type, kv->arr_raw + i * n, &tmp);
    if (is_unsigned_type(kv->arr_type)) return (double)tmp.v.u;
    if (is_signed_type(kv->arr_type)) return (double)tmp.v.i;
    if (kv->arr_type == LP_GGUF_BOOL) return tmp.v.b ? 1 : 0;
    return tmp.v.f;
}

static int64_t arr_integer(const lp_gguf_kv *kv, uint64_t i, int64_t lo, int64_t hi) {
    size_t n = scalar_size(kv->arr_type);
    if (!kv->arr_raw || n == 0 || i >= kv->arr_len) return 0;
    lp_gguf_kv tmp;
    decode_scalar(kv->arr_type, kv->arr_raw + i * n, &tmp);
    if (is_signed_type(kv->arr_type))
        return tmp.v.i < lo ? lo : tmp.v.i > hi ? hi : tmp.v.i;
    if (is_unsigned_type(kv->arr_type)) return tmp.v.u > (uint64_t)hi ? hi : (int64_t)tmp.v.u;
    if (kv->arr_type == LP_GGUF_BOOL) return tmp.v.b;
    double d = tmp.v.f; /* NaN -> 0 */
    return d >= (double)hi ? hi : d <= (double)lo ? lo : d == d ? (int64_t)d : 0;
}

float lp_gguf_arr_f32(const lp_gguf_kv *kv, uint64_t i) { return (float)arr_number(kv, i); }
int32_t lp_gguf_arr_i32(const lp_gguf_kv *kv, uint64_t i) {
    return (int32_t)arr_integer(kv, i, INT32_MIN, INT32_MAX);
}
uint32_t lp_gguf_arr_u32(const lp_gguf_kv *kv, uint64_t i) {
    return (uint32_t)arr_integer(kv, i, 0, UINT32_MAX);
}
uint8_t lp_gguf_arr_u8(const lp_gguf_kv *kv, uint64_t i) {
    return (uint8_t)arr_integer(kv, i, 0, UINT8_MAX);
}

/* ---- writer -------------------------------------------------------------- */

/* Growable byte buffer; remembers allocation failure instead of reporting
 * it at every call. */
typedef struct bytes {
    uint8_t *p;
    size_t len, cap;
    bool oom;
} bytes;

static void put(bytes *b, const void *src, size_t n) {
    if (b->oom || n == 0) return;
    if (n > b->cap - b->len) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap - b->len < n) {
            if (cap > SIZE_MAX / 2) { b->oom = true; return; }
            cap *= 2;
        }
        uint8_t *p = realloc(b->p, cap);
        if (!p) { b->oom = true; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}

/* Little-endian encoders (independent of the host's byte order). */
static void put_le(bytes *b, uint64_t v, size_t n) {
    uint8_t tmp[8];
    for (size_t i = 0; i < n; i++) tmp[i] = (uint8_t)(v >> (8 * i));
    put(b, tmp, n);
}
static void put_u32(bytes *b, uint32_t v) { put_le(b, v, 4); }
static void put_u64(bytes *b, uint64_t v) { put_le(b, v, 8); }
static void put_str(bytes *b, const char *s, size_t n) {
    put_u64(b, n);
    put(b, s, n);
}
static void put_f32(bytes *b, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    put_u32(b, u);
}

typedef struct writer_kv {
    char *key;
    bytes value; /* u32 type + encoded value */
} writer_kv;

typedef struct writer_tensor {
    char *name;
    uint32_t type, n_dims;
    uint64_t dims[GGUF_MAX_DIMS];
    const void *data;
    void *owned; /* copy made by add_tensor_copy */
    size_t n_bytes;
    uint64_t offset;
} writer_tensor;

struct lp_gguf_writer {
    writer_kv *kvs;
    size_t n_kv, cap_kv;
    writer_tensor *tensors;
    size_t n_tensors, cap_tensors;
    bool failed;
    lp_error error; /* first failure, reported by write */
};

__attribute__((format(printf, 2, 3)))
static void writer_fail(lp_gguf_writer *w, const char *fmt, ...) {
    if (w->failed) return;
    w->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->error.message, sizeof w->error.message, fmt, ap);
    va_end(ap);
}

lp_gguf_writer *lp_gguf_writer_create(void) { return calloc(1, sizeof(lp_gguf_writer)); }

void lp_gguf_writer_free(lp_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].value.p);
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].owned);
    }
    free(w->kvs);
    free(w->tensors);
    free(w);
}

/* Grows an array of `size`-byte items to hold one more; false on failure. */
static bool grow(void **items, size_t *cap, size_t n, size_t size) {
    if (n < *cap) return true;
    size_t new_cap = *cap ? *cap * 2 : 8, bytes_needed;
    if (!lp_mul_ok(new_cap, size, &bytes_needed)) return false;
    void *p = realloc(*items, bytes_needed);
    if (!p) return false;
    *items = p;
    *cap = new_cap;
    return true;
}

/* Stores an encoded value under key, replacing an earlier value. Takes
 * ownership of value. */
static void set_kv(lp_gguf_writer *w, const char *key, bytes value) {
    if (!w) { free(value.p); return; }
    if (!key || !lp_utf8_valid((const uint8_t *)key, strlen(key))) {
        free(value.p);
        writer_fail(w, "key is missing or not valid UTF-8");
        return;
    }
    if (value.oom) {
        free(value.p);
        writer_fail(w, "out of memory encoding key '%s'", key);
        return;
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, key) == 0) {
            free(w->kvs[i].value.p);
            w->kvs[i].value = value;
            return;
        }
    }
    char *k = strdup(key);
    if (!k || !grow((void **)&w->kvs, &w->cap_kv, w->n_kv, sizeof *w->kvs)) {
        free(k);
        free(value.p);
        writer_fail(w, "out of memory adding key '%s'", key);
        return;
    }
    w->kvs[w->n_kv++] = (writer_kv){k, value};
}

static bytes typed(uint32_t type) {
    bytes b = {0};
    put_u32(&b, type);
    return b;
}

void lp_gguf_writer_set_u32(lp_gguf_writer *w, const char *key, uint32_t v) {
    bytes b = typed(LP_GGUF_U32);
    put_u32(&b, v);
    set_kv(w, key, b);
}
void lp_gguf_writer_set_i32(lp_gguf_writer *w, const char *key, int32_t v) {
    bytes b = typed(LP_GGUF_I32);
    put_u32(&b, (uint32_t)v);
    set_kv(w, key, b);
}
void lp_gguf_writer_set_u64(lp_gguf_writer *w, const char *key, uint64_t v) {
    bytes b = typed(LP_GGUF_U64);
    put_u64(&b, v);
    set_kv(w, key, b);
}
void lp_gguf_writer_set_f32(lp_gguf_writer *w, const char *key, float v) {
    bytes b = typed(LP_GGUF_F32);
    put_f32(&b, v);
    set_kv(w, key, b);
}
void lp_gguf_writer_set_bool(lp_gguf_writer *w, const char *key, bool v) {
    bytes b = typed(LP_GGUF_BOOL);
    put_le(&b, v ? 1 : 0, 1);
    set_kv(w, key, b);
}
void lp_gguf_writer_set_str(lp_gguf_writer *w, const char *key, const char *v) {
    if (!w) return;
    if (!v || !lp_utf8_valid((const uint8_t *)v, strlen(v))) {
        writer_fail(w, "string value of key '%s' is missing or not valid UTF-8", key ? key : "?");
        return;
    }
    bytes b = typed(LP_GGUF_STRING);
    put_str(&b, v, strlen(v));
    set_kv(w, key, b);
}
void lp_gguf_writer_set_arr_str(lp_gguf_writer *w, const char *key, const lp_str *items, uint64_t n) {
    bytes b = typed(LP_GGUF_ARRAY);
    put_u32(&b, LP_GGUF_STRING);
    put_u64(&b, n);
    for (uint64_t i = 0; i < n; i++) {
        if (w && !lp_utf8_valid((const uint8_t *)items[i].ptr, items[i].len)) {
            free(b.p);
            writer_fail(w, "string array '%s' element %llu is not valid UTF-8", key ? key : "?", (unsigned long long)i);
            return;
        }
        put_str(&b, items[i].ptr, items[i].len);
    }
    set_kv(w, key, b);
}
void lp_gguf_writer_set_arr_f32(lp_gguf_writer *w, const char *key, const float *items, uint64_t n) {
    bytes b = typed(LP_GGUF_ARRAY);
    put_u32(&b, LP_GGUF_F32);
    put_u64(&b, n);
    for (uint64_t i = 0; i < n; i++) put_f32(&b, items[i]);
    set_kv(w, key, b);
}
void lp_gguf_writer_set_arr_i32(lp_gguf_writer *w, const char *key, const int32_t *items, uint64_t n) {
    bytes b = typed(LP_GGUF_ARRAY);
    put_u32(&b, LP_GGUF_I32);
    put_u64(&b, n);
    for (uint64_t i = 0; i < n; i++) put_u32(&b, (uint32_t)items[i]);
    set_kv(w, key, b);
}

/* Re-encodes a parsed scalar in its original width. */
static void put_scalar(bytes *b, uint32_t type, const lp_gguf_kv *kv) {
    switch (type) {
    case LP_GGUF_F32: put_f32(b, (float)kv->v.f); break;
    case LP_GGUF_F64: {
        uint64_t u;
        memcpy(&u, &kv->v.f, 8);
        put_u64(b, u);
        break;
    }
    case LP_GGUF_BOOL: put_le(b, kv->v.b ? 1 : 0, 1); break;
    default:
        put_le(b, is_signed_type(type) ? (uint64_t)kv->v.i : kv->v.u, scalar_size(type));
        break;
    }
}

void lp_gguf_writer_copy_kv(lp_gguf_writer *w, const lp_gguf_kv *kv) {
    if (!w) return;
    char *key = strndup(kv->key.ptr ? kv->key.ptr : "", kv->key.len);
    if (!key) { writer_fail(w, "out of memory copying a key"); return; }
    bytes b = typed(kv->type);
    if (kv->type == LP_GGUF_STRING) {
        put_str(&b, kv->v.s.ptr, kv->v.s.len);
    } else if (kv->type == LP_GGUF_ARRAY) {
        put_u32(&b, kv->arr_type);
        put_u64(&b, kv->arr_len);
        size_t esize = scalar_size(kv->arr_type), n;
        if (kv->arr_type == LP_GGUF_STRING) {
            for (uint64_t i = 0; i < kv->arr_len; i++)
                put_str(&b, kv->arr_strs[i].ptr, kv->arr_strs[i].len);
        } else if (esize && (uint64_t)(size_t)kv->arr_len == kv->arr_len && lp_mul_ok((size_t)kv->arr_len, esize, &n)) {
            put(&b, kv->arr_raw, n);
        } else {
            free(b.p);
            writer_fail(w, "cannot copy array '%s' of element type %u", key, (unsigned)kv->arr_type);
            free(key);
            return;
        }
    } else if (scalar_size(kv->type)) {
        put_scalar(&b, kv->type, kv);
    } else {
        free(b.p);
        writer_fail(w, "cannot copy key '%s' of unknown type %u", key, (unsigned)kv->type);
        free(key);
        return;
    }
    set_kv(w, key, b);
    free(key);
}

static void add_tensor(lp_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                       const uint64_t *dims, const void *data, size_t n_bytes, bool copy) {
    if (!w) return;
    if (!name || !lp_utf8_valid((const uint8_t *)name, strlen(name))) {
        writer_fail(w, "tensor name is missing or not valid UTF-8");
        return;
    }
    if (n_dims == 0 || n_dims > GGUF_MAX_DIMS) {
        writer_fail(w, "tensor '%s' must have 1..4 dimensions, not %u", name, n_dims);
        return;
    }
    uint64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (dims[d] == 0 || dims[d] > GGUF_MAX_DIM ||
            __builtin_mul_overflow(n_elements, dims[d], &n_elements)) {
            writer_fail(w, "tensor '%s' has an invalid dimension", name);
            return;
        }
    }
    size_t row = lp_dtype_row_bytes(type, dims[0]), expect;
    if (row == 0 || !lp_mul_ok(row, (size_t)(n_elements / dims[0]), &expect) || expect != n_bytes) {
        writer_fail(w, "tensor '%s': %zu bytes do not match type %s and its shape", name, n_bytes, lp_dtype_name(type));
        return;
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        if (strcmp(w->tensors[i].name, name) == 0) {
            writer_fail(w, "duplicate tensor name '%s'", name);
            return;
        }
    }
    writer_tensor t = {.type = type, .n_dims = n_dims, .n_bytes = n_bytes, .data = data};
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t.dims[d] = (uint32_t)d < n_dims ? dims[d] : 1;
    t.name = strdup(name);
    if (copy && n_bytes) {
        t.owned = malloc(n_bytes);
        if (t.owned) memcpy(t.owned, data, n_bytes);
        t.data = t.owned;
    }
    if (!t.name || (copy && n_bytes && !t.owned) ||
        !grow((void **)&w->tensors, &w->cap_tensors, w->n_tensors, sizeof *w->tensors)) {
        free(t.name);
        free(t.owned);
        writer_fail(w, "out of memory adding tensor '%s'", name);
        return;
    }
    w->tensors[w->n_tensors++] = t;
}

void lp_gguf_writer_add_tensor(lp_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                               const uint64_t *dims, const void *data, size_t n_bytes) {
    add_tensor(w, name, type, n_dims, dims, data, n_bytes, false);
}

void lp_gguf_writer_add_tensor_copy(lp_gguf_writer *w, const char *name, uint32_t type,
                                    uint32_t n_dims, const uint64_t *dims, const void *data,
                                    size_t n_bytes) {
    add_tensor(w, name, type, n_dims, dims, data, n_bytes, true);
}

/* The alignment a writer will use: general.alignment if set (u32), else 32. */
static int writer_alignment(const lp_gguf_writer *w, size_t *out, const char *path, lp_error *err) {
    *out = GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, "general.alignment") != 0) continue;
        const bytes *v = &w->kvs[i].value;
        if (v->len != 8 || v->p[0] != LP_GGUF_U32 || v->p[1] || v->p[2] || v->p[3])
            return lp_fail(err, "%s: general.alignment must be a u32", path);
        uint32_t a = (uint32_t)v->p[4] | (uint32_t)v->p[5] << 8 | (uint32_t)v->p[6] << 16 |
                     (uint32_t)v->p[7] << 24;
        if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 30))
            return lp_fail(err, "%s: general.alignment %u is not a power of two", path, a);
        *out = a;
    }
    return 0;
}

static bool write_zeros(FILE *f, size_t n) {
    static const uint8_t zeros[256];
    while (n > 0) {
        size_t k = n < sizeof zeros ? n : sizeof zeros;
        if (fwrite(zeros, 1, k, f) != k) return false;
        n -= k;
    }
    return true;
}

int lp_gguf_writer_write(lp_gguf_writer *w, const char *path, lp_error *err) {
    if (!w) return lp_error_set(err, LP_ERR_NOMEM, "%s: no GGUF writer (out of memory?)", path);
    if (w->failed) return lp_fail(err, "%s: %s", path, w->error.message);
    size_t align;
    if (writer_alignment(w, &align, path, err)) return -1;

    /* Header, metadata and tensor infos go to one buffer; data is streamed. */
    bytes head = {0};
    put(&head, "GGUF", 4);
    put_u32(&head, 3);
    put_u64(&head, w->n_tensors);
    put_u64(&head, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        put_str(&head, w->kvs[i].key, strlen(w->kvs[i].key));
        put(&head, w->kvs[i].value.p, w->kvs[i].value.len);
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        writer_tensor *t = &w->tensors[i];
        offset = (offset + align - 1) / align * align;
        t->offset = offset;
        offset += t->n_bytes;
        put_str(&head, t->name, strlen(t->name));
        put_u32(&head, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) put_u64(&head, t->dims[d]);
        put_u32(&head, t->type);
        put_u64(&head, t->offset);
    }
    if (head.oom) {
        free(head.p);
        return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", path);
    }

    FILE *f = fopen(path, "wb");
    if (!f) {
        free(head.p);
        return lp_error_set(err, LP_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    bool ok = fwrite(head.p, 1, head.len, f) == head.len;
    ok = ok && write_zeros(f, (align - head.len % align) % align);
    uint64_t pos = 0; /* position inside the data section */
    for (size_t i = 0; ok && i < w->n_tensors; i++) {
        const writer_tensor *t = &w->tensors[i];
        ok = write_zeros(f, (size_t)(t->offset - pos)) &&
             (t->n_bytes == 0 || fwrite(t->data, 1, t->n_bytes, f) == t->n_bytes);
        pos = t->offset + t->n_bytes;
    }
    free(head.p);
    if (fclose(f) != 0) ok = false;
    if (!ok) return lp_fail(err, "%s: write failed: %s", path, strerror(errno));
    return 0;
}
