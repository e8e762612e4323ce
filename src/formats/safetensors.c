/* safetensors reader (single files and sharded sets) and writer.
 *
 * A file is: u64 little-endian header length N, N bytes of JSON, data. The
 * JSON maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]}
 * (offsets relative to the data section) plus an optional "__metadata__"
 * string map. A sharded set is an index JSON whose "weight_map" maps each
 * tensor to the shard file (in the same directory) that holds it. */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ST_MAX_HEADER ((uint64_t)100 << 20) /* 100 MB of JSON is already absurd */
#define ST_MAX_DIMS 8
#define ST_MAX_INDEX_BYTES ((size_t)100 << 20)
/* JSON numbers are doubles: integers above 2^53 are not exact. */
#define ST_MAX_JSON_INT 9007199254740992.0

static const struct {
    const char *name;
    size_t size;
} k_dtypes[] = {
    [LP_ST_F32] = {"F32", 4}, [LP_ST_F16] = {"F16", 2}, [LP_ST_BF16] = {"BF16", 2},
    [LP_ST_F64] = {"F64", 8}, [LP_ST_I8] = {"I8", 1},   [LP_ST_U8] = {"U8", 1},
    [LP_ST_I16] = {"I16", 2}, [LP_ST_I32] = {"I32", 4}, [LP_ST_I64] = {"I64", 8},
    [LP_ST_BOOL] = {"BOOL", 1},
};
#define ST_N_DTYPES (sizeof k_dtypes / sizeof k_dtypes[0])

const char *lp_st_dtype_name(lp_st_dtype t) {
    return (size_t)t < ST_N_DTYPES ? k_dtypes[t].name : "unknown";
}

size_t lp_st_dtype_size(lp_st_dtype t) { return (size_t)t < ST_N_DTYPES ? k_dtypes[t].size : 0; }

static bool dtype_from_name(const char *s, lp_st_dtype *out) {
    for (size_t i = 0; i < ST_N_DTYPES; i++) {
        if (strcmp(s, k_dtypes[i].name) == 0) {
            *out = (lp_st_dtype)i;
            return true;
        }
    }
    return false;
}

/* ---- the handle ---------------------------------------------------------- */

struct lp_safetensors {
    char *name;
    lp_mapped_file *maps; /* one per shard opened from disk */
    size_t n_maps;
    lp_st_tensor *tensors;
    size_t *tensor_shard; /* which map each tensor came from */
    size_t n_tensors, cap_tensors;
    char **meta;          /* key, value, key, value, ... */
    size_t n_meta, cap_meta;
    size_t *slots;        /* name hash index: tensor index + 1, 0 = empty */
    size_t n_slots;
};

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static bool grow(void **items, size_t *cap, size_t n, size_t size) {
    if (n < *cap) return true;
    size_t new_cap = *cap ? *cap * 2 : 16, total;
    if (!lp_mul_ok(new_cap, size, &total)) return false;
    void *p = realloc(*items, total);
    if (!p) return false;
    *items = p;
    *cap = new_cap;
    return true;
}

void lp_safetensors_close(lp_safetensors *st) {
    if (!st) return;
    for (size_t i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    for (size_t i = 0; i < st->n_meta; i++) free(st->meta[i]);
    for (size_t i = 0; i < st->n_maps; i++) lp_unmap_file(&st->maps[i]);
    free(st->maps);
    free(st->tensors);
    free(st->tensor_shard);
    free(st->meta);
    free(st->slots);
    free(st->name);
    free(st);
}

static lp_safetensors *new_handle(const char *name, lp_error *err) {
    lp_safetensors *st = calloc(1, sizeof *st);
    if (st) st->name = strdup(name ? name : "(memory)");
    if (!st || !st->name) {
        free(st);
        lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", name ? name : "(memory)");
        return NULL;
    }
    return st;
}

/* Builds the name index; fails on duplicate names (e.g. across shards). */
static int build_index(lp_safetensors *st, lp_error *err) {
    size_t cap = 16;
    while (cap < 2 * st->n_tensors) cap *= 2;
    st->slots = calloc(cap, sizeof *st->slots);
    if (!st->slots) return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", st->name);
    st->n_slots = cap;
    for (size_t i = 0; i < st->n_tensors; i++) {
        const char *name = st->tensors[i].name;
        size_t s = (size_t)hash_str(name) & (cap - 1);
        for (; st->slots[s]; s = (s + 1) & (cap - 1))
            if (strcmp(st->tensors[st->slots[s] - 1].name, name) == 0)
                return lp_fail(err, "%s: duplicate tensor name '%.200s'", st->name, name);
        st->slots[s] = i + 1;
    }
    return 0;
}

/* ---- parsing one file ----------------------------------------------------- */

/* A JSON number that is a non-negative integer we can represent exactly. */
static bool json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d <= ST_MAX_JSON_INT)) return false;
    uint64_t u = (uint64_t)d;
    if ((double)u != d) return false;
    *out = u;
    return true;
}

static int parse_metadata(lp_safetensors *st, const cJSON *meta, lp_error *err) {
    if (!cJSON_IsObject(meta)) return lp_fail(err, "__metadata__ is not an object");
    for (const cJSON *m = meta->child; m; m = m->next) {
        if (!cJSON_IsString(m))
            return lp_fail(err, "__metadata__ value '%.200s' is not a string", m->string);
        if (lp_safetensors_metadata(st, m->string)) continue; /* first one wins */
        if (!grow((void **)&st->meta, &st->cap_meta, st->n_meta + 1, sizeof *st->meta))
            return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        char *k = strdup(m->string), *v = strdup(m->valuestring);
        if (!k || !v) {
            free(k);
            free(v);
            return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        }
        st->meta[st->n_meta++] = k;
        st->meta[st->n_meta++] = v;
    }
    return 0;
}

/* Validates one tensor entry and fills t (name not set). */
static int parse_entry(const cJSON *e, const uint8_t *data, size_t data_size, lp_st_tensor *t,
                       lp_error *err) {
    if (!cJSON_IsObject(e)) return lp_fail(err, "entry is not an object");
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dtype)) return lp_fail(err, "missing \"dtype\"");
    if (!dtype_from_name(dtype->valuestring, &t->dtype))
        return lp_fail(err, "unsupported dtype '%.32s'", dtype->valuestring);
    if (!cJSON_IsArray(shape)) return lp_fail(err, "missing \"shape\"");
    int n_dims = cJSON_GetArraySize(shape);
    if (n_dims > ST_MAX_DIMS) return lp_fail(err, "has %d dimensions (at most %d)", n_dims, ST_MAX_DIMS);
    t->n_dims = (uint32_t)n_dims;
    uint64_t n_elements = 1;
    int d = 0;
    for (const cJSON *s = shape->child; s; s = s->next, d++) {
        if (!json_uint(s, &t->shape[d])) return lp_fail(err, "shape[%d] is not a non-negative integer", d);
        if (__builtin_mul_overflow(n_elements, t->shape[d], &n_elements))
            return lp_fail(err, "shape element count overflows");
    }
    for (; d < ST_MAX_DIMS; d++) t->shape[d] = 1;
    t->n_elements = n_elements;
    if ((uint64_t)(size_t)n_elements != n_elements ||
        !lp_mul_ok((size_t)n_elements, lp_st_dtype_size(t->dtype), &t->n_bytes))
        return lp_fail(err, "byte size overflows");
    uint64_t begin, end;
    if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2 ||
        !json_uint(offsets->child, &begin) || !json_uint(offsets->child->next, &end))
        return lp_fail(err, "\"data_offsets\" must be two non-negative integers");
    if (begin > end || end > data_size)
        return lp_fail(err, "data_offsets [%llu, %llu] are outside the data section (%zu bytes)",
                       (unsigned long long)begin, (unsigned long long)end, data_size);
    if (end - begin != t->n_bytes)
        return lp_fail(err, "data_offsets [%llu, %llu] hold %llu bytes but %s shape needs %zu",
                       (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)(end - begin), lp_st_dtype_name(t->dtype), t->n_bytes);
    t->data = data + begin;
    return 0;
}

static int parse_json_header(lp_safetensors *st, const cJSON *root, const uint8_t *data,
                             size_t data_size, size_t shard, lp_error *err) {
    if (!cJSON_IsObject(root)) return lp_fail(err, "header is not a JSON object");
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (parse_metadata(st, e, err)) return -1;
            continue;
        }
        if (!grow((void **)&st->tensors, &st->cap_tensors, st->n_tensors, sizeof *st->tensors))
            return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        size_t cap = st->cap_tensors; /* tensor_shard grows alongside */
        size_t *shards = realloc(st->tensor_shard, cap * sizeof *shards);
        if (!shards) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        st->tensor_shard = shards;
        lp_st_tensor t = {0};
        if (parse_entry(e, data, data_size, &t, err))
            return lp_fail_prefix(err, "tensor '%.200s'", e->string);
        if (!(t.name = strdup(e->string))) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        st->tensor_shard[st->n_tensors] = shard;
        st->tensors[st->n_tensors++] = t;
    }
    return 0;
}

/* Parses one file image; errors come back without the file name. */
static int parse_file(lp_safetensors *st, const uint8_t *p, size_t size, size_t shard, lp_error *err) {
    if (size < 8) return lp_fail(err, "too small to be a safetensors file (%zu bytes)", size);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)p[i] << (8 * i);
    if (n > size - 8)
        return lp_fail(err, "header length %llu exceeds the file size %zu", (unsigned long long)n, size);
    if (n > ST_MAX_HEADER)
        return lp_fail(err, "header length %llu exceeds the 100 MB limit", (unsigned long long)n);
    cJSON *root = cJSON_ParseWithLength((const char *)p + 8, (size_t)n);
    if (!root) return lp_fail(err, "header is not valid JSON");
    int rc = parse_json_header(st, root, p + 8 + n, size - 8 - (size_t)n, shard, err);
    cJSON_Delete(root);
    return rc;
}

lp_safetensors *lp_safetensors_open_memory(const void *data, size_t size, const char *name,
                                           lp_error *err) {
    lp_safetensors *st = new_handle(name, err);
    if (!st) return NULL;
    if (parse_file(st, data, data ? size : 0, 0, err)) {
        lp_fail_prefix(err, "%s", st->name);
        lp_safetensors_close(st);
        return NULL;
    }
    if (build_index(st, err)) {
        lp_safetensors_close(st);
        return NULL;
    }
    return st;
}

/* Maps and parses a file into st as shard number st->n_maps. */
static int add_file(lp_safetensors *st, const char *path, lp_error *err) {
    lp_mapped_file *maps = realloc(st->maps, (st->n_maps + 1) * sizeof *maps);
    if (!maps) return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", path);
    st->maps = maps;
    if (lp_map_file(path, &st->maps[st->n_maps], err)) return -1;
    size_t shard = st->n_maps++;
    if (parse_file(st, st->maps[shard].data, st->maps[shard].size, shard, err))
        return lp_fail_prefix(err, "%s", path);
    return 0;
}

static bool safe_shard_name(const char *s) {
    return s[0] && !strchr(s, '/') && !strchr(s, '\\') && !strstr(s, "..");
}

static char *join_path(const char *dir, const char *file) {
    size_t n = strlen(dir) + strlen(file) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, file);
    return p;
}

/* Opens every shard listed in the index and checks the weight map. */
static int open_index(lp_safetensors *st, const char *path, lp_error *err) {
    char *text = NULL;
    size_t len = 0;
    if (lp_read_file(path, &text, &len, ST_MAX_INDEX_BYTES, err)) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) return lp_fail(err, "%s: not valid JSON", path);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    char *dir = strdup(path), *slash = dir ? strrchr(dir, '/') : NULL;
    if (dir) {
        if (slash) *slash = 0;
        else strcpy(dir, ".");
    }
    int rc = 0;
    const char **shards = NULL; /* distinct shard names, in first-seen order */
    size_t n_shards = 0, cap_shards = 0;
    if (!dir) rc = lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", path);
    else if (!cJSON_IsObject(map)) rc = lp_fail(err, "%s: no \"weight_map\" object", path);
    for (const cJSON *e = map ? map->child : NULL; rc == 0 && e; e = e->next) {
        if (!cJSON_IsString(e) || !safe_shard_name(e->valuestring)) {
            rc = lp_fail(err, "%s: tensor '%.200s' has an invalid shard file name", path, e->string);
            break;
        }
        size_t i = 0;
        while (i < n_shards && strcmp(shards[i], e->valuestring) != 0) i++;
        if (i < n_shards) continue;
        if (!grow((void **)&shards, &cap_shards, n_shards, sizeof *shards)) {
            rc = lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", path);
            break;
        }
        shards[n_shards++] = e->valuestring;
        char *shard_path = join_path(dir, e->valuestring);
        rc = shard_path ? add_file(st, shard_path, err) : lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", path);
        free(shard_path);
    }
    if (rc == 0) rc = build_index(st, err);
    /* every tensor of the map must be in the shard the map names */
    for (const cJSON *e = map ? map->child : NULL; rc == 0 && e; e = e->next) {
        const lp_st_tensor *t = lp_safetensors_find(st, e->string);
        size_t shard = t ? st->tensor_shard[t - st->tensors] : 0;
        if (!t || strcmp(shards[shard], e->valuestring) != 0)
            rc = lp_fail(err, "%s: tensor '%.200s' is not in shard %.200s", path, e->string,
                         e->valuestring);
    }
    free(shards);
    free(dir);
    cJSON_Delete(root);
    return rc;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static bool file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

lp_safetensors *lp_safetensors_open(const char *path, lp_error *err) {
    lp_safetensors *st = new_handle(path, err);
    if (!st) return NULL;
    int rc;
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char *single = join_path(path, "model.safetensors");
        char *index = join_path(path, "model.safetensors.index.json");
        if (!single || !index) rc = lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", path);
        else if (file_exists(single)) rc = add_file(st, single, err);
        else if (file_exists(index)) rc = open_index(st, index, err);
        else rc = lp_fail(err, "%s: no model.safetensors or model.safetensors.index.json in this directory", path);
        if (rc == 0 && st->slots == NULL) rc = build_index(st, err);
        free(single);
        free(index);
    } else if (ends_with(path, ".index.json")) {
        rc = open_index(st, path, err);
    } else {
        rc = add_file(st, path, err);
        if (rc == 0) rc = build_index(st, err);
    }
    if (rc) {
        lp_safetensors_close(st);
        return NULL;
    }
    return st;
}

/* ---- accessors ----------------------------------------------------------- */

size_t lp_safetensors_count(const lp_safetensors *st) { return st->n_tensors; }

const lp_st_tensor *lp_safetensors_at(const lp_safetensors *st, size_t i) {
    return i < st->n_tensors ? &st->tensors[i] : NULL;
}

const lp_st_tensor *lp_safetensors_find(const lp_safetensors *st, const char *name) {
    if (!st->slots) return NULL;
    size_t mask = st->n_slots - 1;
    for (size_t s = (size_t)hash_str(name) & mask; st->slots[s]; s = (s + 1) & mask)
        if (strcmp(st->tensors[st->slots[s] - 1].name, name) == 0) return &st->tensors[st->slots[s] - 1];
    return NULL;
}

const char *lp_safetensors_metadata(const lp_safetensors *st, const char *key) {
    for (size_t i = 0; i + 1 < st->n_meta; i += 2)
        if (strcmp(st->meta[i], key) == 0) return st->meta[i + 1];
    return NULL;
}

int lp_st_to_f32(const lp_st_tensor *t, float *out, lp_error *err) {
    const uint8_t *p = t->data; /* may be unaligned: copy element by element */
    for (uint64_t i = 0; i < t->n_elements; i++) {
        uint16_t h;
        switch (t->dtype) {
        case LP_ST_F32: memcpy(&out[i], p + 4 * i, 4); break;
        case LP_ST_F16: memcpy(&h, p + 2 * i, 2); out[i] = lp_f16_to_f32(h); break;
        case LP_ST_BF16: memcpy(&h, p + 2 * i, 2); out[i] = lp_bf16_to_f32(h); break;
        case LP_ST_F64: {
            double d;
            memcpy(&d, p + 8 * i, 8);
            out[i] = (float)d;
            break;
        }
        default:
            return lp_fail(err, "tensor '%s' has dtype %s, which does not convert to f32", t->name,
                           lp_st_dtype_name(t->dtype));
        }
    }
    return 0;
}

/* ---- writer -------------------------------------------------------------- */

typedef struct st_entry {
    char *name;
    lp_st_dtype dtype;
    uint32_t n_dims;
    uint64_t shape[ST_MAX_DIMS];
    const void *data;
    size_t n_bytes;
} st_entry;

struct lp_st_writer {
    st_entry *entries;
    size_t n, cap;
    char **meta; /* key, value pairs */
    size_t n_meta, cap_meta;
    bool failed;
    lp_error error;
};

lp_st_writer *lp_st_writer_create(void) { return calloc(1, sizeof(lp_st_writer)); }

void lp_st_writer_free(lp_st_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n; i++) free(w->entries[i].name);
    for (size_t i = 0; i < w->n_meta; i++) free(w->meta[i]);
    free(w->entries);
    free(w->meta);
    free(w);
}

static void writer_fail(lp_st_writer *w, const char *what, const char *name) {
    if (w->failed) return;
    w->failed = true;
    lp_fail(&w->error, "tensor '%.200s': %s", name ? name : "(null)", what);
}
/* Records the first misuse (reported by write) and leaves the function. */
#define WRITER_FAIL(w, what, name) \
    do {                           \
        writer_fail(w, what, name); \
        return;                    \
    } while (0)

void lp_st_writer_add(lp_st_writer *w, const char *name, lp_st_dtype dtype, uint32_t n_dims,
                      const uint64_t *shape, const void *data, size_t n_bytes) {
    if (!w) return;
    if (!name || !name[0] || strcmp(name, "__metadata__") == 0)
        WRITER_FAIL(w, "invalid name", name);
    if (lp_st_dtype_size(dtype) == 0) WRITER_FAIL(w, "invalid dtype", name);
    if (n_dims > ST_MAX_DIMS) WRITER_FAIL(w, "more than 8 dimensions", name);
    uint64_t n = 1;
    for (uint32_t d = 0; d < n_dims; d++)
        if (__builtin_mul_overflow(n, shape[d], &n) || shape[d] > (uint64_t)ST_MAX_JSON_INT)
            WRITER_FAIL(w, "shape overflows", name);
    size_t expect;
    if ((uint64_t)(size_t)n != n || !lp_mul_ok((size_t)n, lp_st_dtype_size(dtype), &expect) ||
        expect != n_bytes)
        WRITER_FAIL(w, "byte size does not match dtype and shape", name);
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->entries[i].name, name) == 0) WRITER_FAIL(w, "duplicate name", name);
    st_entry e = {.dtype = dtype, .n_dims = n_dims, .data = data, .n_bytes = n_bytes};
    for (uint32_t d = 0; d < n_dims; d++) e.shape[d] = shape[d];
    if (!(e.name = strdup(name)) || !grow((void **)&w->entries, &w->cap, w->n, sizeof *w->entries)) {
        free(e.name);
        WRITER_FAIL(w, "out of memory", name);
    }
    w->entries[w->n++] = e;
}

void lp_st_writer_set_metadata(lp_st_writer *w, const char *key, const char *value) {
    if (!w) return;
    if (!key || !value) WRITER_FAIL(w, "metadata key or value is NULL", "__metadata__");
    for (size_t i = 0; i < w->n_meta; i += 2) {
        if (strcmp(w->meta[i], key) == 0) {
            char *v = strdup(value);
            if (!v) WRITER_FAIL(w, "out of memory", "__metadata__");
            free(w->meta[i + 1]);
            w->meta[i + 1] = v;
            return;
        }
    }
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v || !grow((void **)&w->meta, &w->cap_meta, w->n_meta + 1, sizeof *w->meta)) {
        free(k);
        free(v);
        WRITER_FAIL(w, "out of memory", "__metadata__");
    }
    w->meta[w->n_meta++] = k;
    w->meta[w->n_meta++] = v;
}

/* Adds a JSON integer written verbatim (cJSON would print doubles). */
static bool add_raw_uint(cJSON *array, uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    cJSON *item = cJSON_CreateRaw(buf);
    return item && cJSON_AddItemToArray(array, item);
}

static char *build_header(const lp_st_writer *w) {
    cJSON *root = cJSON_CreateObject();
    bool ok = root != NULL;
    if (ok && w->n_meta) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        ok = meta != NULL;
        for (size_t i = 0; ok && i < w->n_meta; i += 2)
            ok = cJSON_AddStringToObject(meta, w->meta[i], w->meta[i + 1]) != NULL;
    }
    uint64_t offset = 0;
    for (size_t i = 0; ok && i < w->n; i++) {
        const st_entry *e = &w->entries[i];
        cJSON *t = cJSON_AddObjectToObject(root, e->name);
        cJSON *shape = t ? cJSON_AddArrayToObject(t, "shape") : NULL;
        cJSON *offs = t ? cJSON_AddArrayToObject(t, "data_offsets") : NULL;
        ok = t && shape && offs && cJSON_AddStringToObject(t, "dtype", lp_st_dtype_name(e->dtype));
        for (uint32_t d = 0; ok && d < e->n_dims; d++) ok = add_raw_uint(shape, e->shape[d]);
        ok = ok && add_raw_uint(offs, offset) && add_raw_uint(offs, offset + e->n_bytes);
        offset += e->n_bytes;
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return text;
}

int lp_st_writer_write(lp_st_writer *w, const char *path, lp_error *err) {
    if (!w) return lp_error_set(err, LP_ERR_NOMEM, "%s: no safetensors writer (out of memory?)", path);
    if (w->failed) return lp_fail(err, "%s: %s", path, w->error.message);
    char *header = build_header(w);
    if (!header) return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory building the header", path);
    /* pad the JSON with spaces so the data section starts 8-byte aligned */
    size_t len = strlen(header), padded = (len + 7) / 8 * 8;
    uint8_t size_le[8];
    for (int i = 0; i < 8; i++) size_le[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(header);
        return lp_error_set(err, LP_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    bool ok = fwrite(size_le, 1, 8, f) == 8 && fwrite(header, 1, len, f) == len;
    for (size_t i = len; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    for (size_t i = 0; ok && i < w->n; i++)
        ok = w->entries[i].n_bytes == 0 ||
             fwrite(w->entries[i].data, 1, w->entries[i].n_bytes, f) == w->entries[i].n_bytes;
    free(header);
    if (fclose(f) != 0) ok = false;
    if (!ok) return lp_fail(err, "%s: write failed: %s", path, strerror(errno));
    return 0;
}
