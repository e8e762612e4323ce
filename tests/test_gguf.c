/* GGUF reader/writer: round trip of every value type, the shared model files,
 * and a catalogue of malformed inputs (each must be rejected with a message
 * naming the problem, never crash). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "base/base.h"
#include "base/dtype.h"
#include "formats/gguf.h"

/* ---- helpers ------------------------------------------------------------- */

typedef struct buf {
    uint8_t *p;
    size_t len, cap;
} buf;

static void b_put(buf *b, const void *src, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
}
static void b_u32(buf *b, uint32_t v) { b_put(b, &v, 4); }
static void b_u64(buf *b, uint64_t v) { b_put(b, &v, 8); }
static void b_str(buf *b, const char *s) {
    b_u64(b, strlen(s));
    b_put(b, s, strlen(s));
}
static void b_zeros(buf *b, size_t n) {
    for (size_t i = 0; i < n; i++) b_put(b, "", 1);
}
static void b_pad(buf *b, size_t align) { b_zeros(b, (align - b->len % align) % align); }
static void b_header(buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b_put(b, "GGUF", 4);
    b_u32(b, version);
    b_u64(b, n_tensors);
    b_u64(b, n_kv);
}
static void b_kv_u32(buf *b, const char *key, uint32_t v) {
    b_str(b, key);
    b_u32(b, LP_GGUF_U32);
    b_u32(b, v);
}
static void b_tensor(buf *b, const char *name, uint32_t n_dims, const uint64_t *dims,
                     uint32_t type, uint64_t offset) {
    b_str(b, name);
    b_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) b_u64(b, dims[i]);
    b_u32(b, type);
    b_u64(b, offset);
}

/* Reads every byte the handle exposes, so out-of-bounds pointers trip ASan. */
static uint64_t touch_all(const lp_gguf *g) {
    uint64_t sum = 0;
    for (size_t i = 0; i < lp_gguf_kv_count(g); i++) {
        const lp_gguf_kv *kv = lp_gguf_kv_at(g, i);
        for (size_t j = 0; j < kv->key.len; j++) sum += (uint8_t)kv->key.ptr[j];
        if (kv->type == LP_GGUF_STRING)
            for (size_t j = 0; j < kv->v.s.len; j++) sum += (uint8_t)kv->v.s.ptr[j];
        if (kv->type != LP_GGUF_ARRAY) continue;
        for (uint64_t j = 0; j < kv->arr_len; j++) {
            if (kv->arr_type == LP_GGUF_STRING) {
                for (size_t k = 0; k < kv->arr_strs[j].len; k++) sum += (uint8_t)kv->arr_strs[j].ptr[k];
            } else {
                sum += lp_gguf_arr_u8(kv, j) + lp_gguf_arr_u32(kv, j) + (uint32_t)lp_gguf_arr_i32(kv, j);
                float f = lp_gguf_arr_f32(kv, j);
                sum += f == f ? 1 : 0;
            }
        }
    }
    for (size_t i = 0; i < lp_gguf_tensor_count(g); i++) {
        const lp_gguf_tensor *t = lp_gguf_tensor_at(g, i);
        const uint8_t *d = t->data;
        for (size_t j = 0; j < t->n_bytes; j++) sum += d[j];
        for (size_t j = 0; j < t->name.len; j++) sum += (uint8_t)t->name.ptr[j];
    }
    return sum;
}

static uint8_t *read_whole(const char *path, size_t *size) {
    lp_mapped_file m;
    lp_error err;
    if (lp_map_file(path, &m, &err)) return NULL;
    uint8_t *p = malloc(m.size ? m.size : 1);
    memcpy(p, m.data, m.size);
    *size = m.size;
    lp_unmap_file(&m);
    return p;
}

/* Opens an exact-size heap copy (so ASan sees any over-read) and expects a
 * failure whose message mentions `needle` and the file name. */
static void expect_reject(const void *data, size_t size, const char *needle, const char *what) {
    uint8_t *copy = malloc(size ? size : 1);
    memcpy(copy, data, size);
    lp_error err = {0};
    lp_gguf *g = lp_gguf_open_memory(copy, size, "bad.gguf", &err);
    CHECK_MSG(g == NULL, "%s: accepted", what);
    CHECK_MSG(strstr(err.message, "bad.gguf") == err.message, "%s: message '%s'", what, err.message);
    CHECK_MSG(strstr(err.message, needle) != NULL, "%s: message '%s' lacks '%s'", what,
              err.message, needle);
    lp_gguf_close(g);
    free(copy);
}

/* ---- round trip ----------------------------------------------------------- */

static char g_dir[] = "/tmp/lp_test_gguf_XXXXXX";

static void path_in_dir(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", g_dir, name);
}

static float f32_data[12] = {1, -2, 3.5f, 4, 5, 6, 7, 8, 9, 10, 11, -12.25f};
static uint16_t f16_data[8];
static uint8_t q8_data[2 * 34];
static int32_t i32_data[5] = {1, -1, 7, 1 << 30, -(1 << 30)};

static void fill_writer(lp_gguf_writer *w) {
    lp_gguf_writer_set_str(w, "general.architecture", "llama");
    lp_gguf_writer_set_u32(w, "t.u32", 4000000000u);
    lp_gguf_writer_set_i32(w, "t.i32", -123456);
    lp_gguf_writer_set_u64(w, "t.u64", 0xfedcba9876543210ull);
    lp_gguf_writer_set_f32(w, "t.f32", 0.15625f);
    lp_gguf_writer_set_bool(w, "t.bool", true);
    lp_gguf_writer_set_str(w, "t.str", "h\xc3\xa9llo w\xc3\xb6rld");
    lp_gguf_writer_set_str(w, "t.empty", "");
    lp_str toks[4] = {{"<s>", 3}, {"\xe2\x96\x81the", 6}, {"", 0}, {"a\0b", 3}};
    lp_gguf_writer_set_arr_str(w, "t.arr_str", toks, 4);
    float fl[3] = {0.5f, -1.0f, 1e30f};
    lp_gguf_writer_set_arr_f32(w, "t.arr_f32", fl, 3);
    int32_t il[4] = {-5, 0, 5, INT32_MIN};
    lp_gguf_writer_set_arr_i32(w, "t.arr_i32", il, 4);
    lp_gguf_writer_set_arr_i32(w, "t.arr_empty", NULL, 0);
    lp_gguf_writer_set_u32(w, "t.replaced", 1);
    lp_gguf_writer_set_u32(w, "t.replaced", 2); /* same key: replaces */

    /* The remaining types only exist through copy_kv. */
    lp_gguf_kv kv = {.key = {"t.u8", 4}, .type = LP_GGUF_U8, .v.u = 200};
    lp_gguf_writer_copy_kv(w, &kv);
    kv = (lp_gguf_kv){.key = {"t.i8", 4}, .type = LP_GGUF_I8, .v.i = -100};
    lp_gguf_writer_copy_kv(w, &kv);
    kv = (lp_gguf_kv){.key = {"t.u16", 5}, .type = LP_GGUF_U16, .v.u = 65000};
    lp_gguf_writer_copy_kv(w, &kv);
    kv = (lp_gguf_kv){.key = {"t.i16", 5}, .type = LP_GGUF_I16, .v.i = -32000};
    lp_gguf_writer_copy_kv(w, &kv);
    kv = (lp_gguf_kv){.key = {"t.i64", 5}, .type = LP_GGUF_I64, .v.i = INT64_MIN + 1};
    lp_gguf_writer_copy_kv(w, &kv);
    kv = (lp_gguf_kv){.key = {"t.f64", 5}, .type = LP_GGUF_F64, .v.f = 3.141592653589793};
    lp_gguf_writer_copy_kv(w, &kv);
    static const uint16_t u16s[3] = {1, 2, 65535};
    kv = (lp_gguf_kv){.key = {"t.arr_u16", 9}, .type = LP_GGUF_ARRAY, .arr_type = LP_GGUF_U16,
                      .arr_len = 3, .arr_raw = (const uint8_t *)u16s};
    lp_gguf_writer_copy_kv(w, &kv);
    static const double f64s[2] = {1e300, -0.5};
    kv = (lp_gguf_kv){.key = {"t.arr_f64", 9}, .type = LP_GGUF_ARRAY, .arr_type = LP_GGUF_F64,
                      .arr_len = 2, .arr_raw = (const uint8_t *)f64s};
    lp_gguf_writer_copy_kv(w, &kv);
    static const uint8_t bools[3] = {1, 0, 1};
    kv = (lp_gguf_kv){.key = {"t.arr_bool", 10}, .type = LP_GGUF_ARRAY, .arr_type = LP_GGUF_BOOL,
                      .arr_len = 3, .arr_raw = bools};
    lp_gguf_writer_copy_kv(w, &kv);
    static const int8_t i8s[2] = {-128, 127};
    kv = (lp_gguf_kv){.key = {"t.arr_i8", 8}, .type = LP_GGUF_ARRAY, .arr_type = LP_GGUF_I8,
                      .arr_len = 2, .arr_raw = (const uint8_t *)i8s};
    lp_gguf_writer_copy_kv(w, &kv);

    for (int i = 0; i < 8; i++) f16_data[i] = lp_f32_to_f16((float)i - 3.5f);
    for (size_t i = 0; i < sizeof q8_data; i++) q8_data[i] = (uint8_t)(i * 7 + 1);
    lp_gguf_writer_add_tensor(w, "a.f32", LP_F32, 2, (const uint64_t[]){4, 3}, f32_data, sizeof f32_data);
    lp_gguf_writer_add_tensor_copy(w, "b.f16", LP_F16, 1, (const uint64_t[]){8}, f16_data, sizeof f16_data);
    lp_gguf_writer_add_tensor(w, "c.i32", LP_I32, 1, (const uint64_t[]){5}, i32_data, sizeof i32_data);
    lp_gguf_writer_add_tensor(w, "d.q8", LP_Q8_0, 3, (const uint64_t[]){32, 2, 1}, q8_data, sizeof q8_data);
}

static void check_roundtrip_file(const lp_gguf *g) {
    lp_error err = {0};
    CHECK(lp_gguf_version(g) == 3);
    CHECK(lp_gguf_kv_count(g) == 23);
    lp_str s;
    CHECK(lp_gguf_get_str(g, "general.architecture", &s, &err) == 1 && lp_str_eq(s, "llama"));
    uint32_t u32 = 0;
    CHECK(lp_gguf_get_u32(g, "t.u32", &u32, &err) == 1 && u32 == 4000000000u);
    CHECK(lp_gguf_get_u32(g, "t.replaced", &u32, &err) == 1 && u32 == 2);
    CHECK(lp_gguf_get_u32(g, "t.u8", &u32, &err) == 1 && u32 == 200);
    CHECK(lp_gguf_get_u32(g, "t.missing", &u32, &err) == 0);
    int32_t i32 = 0;
    CHECK(lp_gguf_get_i32(g, "t.i32", &i32, &err) == 1 && i32 == -123456);
    CHECK(lp_gguf_get_i32(g, "t.i8", &i32, &err) == 1 && i32 == -100);
    CHECK(lp_gguf_get_i32(g, "t.i16", &i32, &err) == 1 && i32 == -32000);
    CHECK(lp_gguf_get_i32(g, "t.u16", &i32, &err) == 1 && i32 == 65000);
    /* range and type errors */
    CHECK(lp_gguf_get_i32(g, "t.u32", &i32, &err) == -1 && strstr(err.message, "out of range"));
    CHECK(lp_gguf_get_u32(g, "t.i32", &u32, &err) == -1 && strstr(err.message, "t.i32"));
    CHECK(lp_gguf_get_u32(g, "t.str", &u32, &err) == -1 && strstr(err.message, "string"));
    uint64_t u64 = 0;
    CHECK(lp_gguf_get_u64(g, "t.u64", &u64, &err) == 1 && u64 == 0xfedcba9876543210ull);
    CHECK(lp_gguf_get_u32(g, "t.u64", &u32, &err) == -1);
    const lp_gguf_kv *kv = lp_gguf_find(g, "t.i64");
    CHECK(kv && kv->type == LP_GGUF_I64 && kv->v.i == INT64_MIN + 1);
    float f = 0;
    CHECK(lp_gguf_get_f32(g, "t.f32", &f, &err) == 1 && f == 0.15625f);
    CHECK(lp_gguf_get_f32(g, "t.i32", &f, &err) == 1 && f == -123456.0f);
    kv = lp_gguf_find(g, "t.f64");
    CHECK(kv && kv->type == LP_GGUF_F64 && kv->v.f == 3.141592653589793);
    bool b = false;
    CHECK(lp_gguf_get_bool(g, "t.bool", &b, &err) == 1 && b);
    CHECK(lp_gguf_get_bool(g, "t.u8", &b, &err) == -1);
    CHECK(lp_gguf_get_str(g, "t.str", &s, &err) == 1 && lp_str_eq(s, "h\xc3\xa9llo w\xc3\xb6rld"));
    CHECK(lp_gguf_get_str(g, "t.empty", &s, &err) == 1 && s.len == 0);

    const lp_gguf_kv *arr = NULL;
    CHECK(lp_gguf_get_arr(g, "t.arr_str", LP_GGUF_STRING, &arr, &err) == 1);
    CHECK(arr && arr->arr_len == 4 && arr->arr_raw == NULL);
    if (arr && arr->arr_len == 4) {
        CHECK(lp_str_eq(arr->arr_strs[0], "<s>"));
        CHECK(lp_str_eq(arr->arr_strs[1], "\xe2\x96\x81the"));
        CHECK(arr->arr_strs[2].len == 0);
        CHECK(arr->arr_strs[3].len == 3 && memcmp(arr->arr_strs[3].ptr, "a\0b", 3) == 0);
    }
    CHECK(lp_gguf_get_arr(g, "t.arr_str", LP_GGUF_I32, &arr, &err) == -1 && arr == NULL);
    CHECK(lp_gguf_get_arr(g, "t.u32", LP_GGUF_I32, &arr, &err) == -1);
    CHECK(lp_gguf_get_arr(g, "t.nope", LP_GGUF_I32, &arr, &err) == 0);
    CHECK(lp_gguf_get_arr(g, "t.arr_f32", LP_GGUF_F32, &arr, &err) == 1);
    CHECK(arr && arr->arr_len == 3 && lp_gguf_arr_f32(arr, 0) == 0.5f &&
          lp_gguf_arr_f32(arr, 1) == -1.0f && lp_gguf_arr_f32(arr, 2) == 1e30f);
    CHECK(lp_gguf_get_arr(g, "t.arr_i32", LP_GGUF_I32, &arr, &err) == 1);
    CHECK(arr && arr->arr_len == 4 && lp_gguf_arr_i32(arr, 0) == -5 && lp_gguf_arr_i32(arr, 2) == 5 &&
          lp_gguf_arr_i32(arr, 3) == INT32_MIN && lp_gguf_arr_f32(arr, 0) == -5.0f);
    CHECK(lp_gguf_get_arr(g, "t.arr_empty", LP_GGUF_I32, &arr, &err) == 1 && arr->arr_len == 0);
    CHECK(lp_gguf_get_arr(g, "t.arr_u16", LP_GGUF_U16, &arr, &err) == 1);
    CHECK(arr && arr->arr_len == 3 && lp_gguf_arr_u32(arr, 2) == 65535 && lp_gguf_arr_u8(arr, 2) == 255);
    CHECK(lp_gguf_get_arr(g, "t.arr_f64", LP_GGUF_F64, &arr, &err) == 1);
    CHECK(arr && arr->arr_len == 2 && lp_gguf_arr_f32(arr, 1) == -0.5f);
    CHECK(lp_gguf_get_arr(g, "t.arr_bool", LP_GGUF_BOOL, &arr, &err) == 1);
    CHECK(arr && arr->arr_len == 3 && lp_gguf_arr_u8(arr, 0) == 1 && lp_gguf_arr_u8(arr, 1) == 0);
    CHECK(lp_gguf_get_arr(g, "t.arr_i8", LP_GGUF_I8, &arr, &err) == 1);
    CHECK(arr && lp_gguf_arr_i32(arr, 0) == -128 && lp_gguf_arr_i32(arr, 1) == 127 &&
          lp_gguf_arr_u32(arr, 0) == 0); /* saturates */

    CHECK(lp_gguf_tensor_count(g) == 4);
    const lp_gguf_tensor *t = lp_gguf_find_tensor(g, "a.f32");
    CHECK(t && t->n_dims == 2 && t->dims[0] == 4 && t->dims[1] == 3 && t->dims[2] == 1 &&
          t->type == LP_F32 && t->n_elements == 12 && t->n_bytes == sizeof f32_data);
    CHECK(t && memcmp(t->data, f32_data, sizeof f32_data) == 0);
    t = lp_gguf_find_tensor(g, "b.f16");
    CHECK(t && t->type == LP_F16 && t->n_bytes == 16 && memcmp(t->data, f16_data, 16) == 0);
    t = lp_gguf_find_tensor(g, "c.i32");
    CHECK(t && t->type == LP_I32 && t->n_bytes == 20 && memcmp(t->data, i32_data, 20) == 0);
    t = lp_gguf_find_tensor(g, "d.q8");
    CHECK(t && t->type == LP_Q8_0 && t->n_dims == 3 && t->n_elements == 64 &&
          t->n_bytes == sizeof q8_data && memcmp(t->data, q8_data, sizeof q8_data) == 0);
    CHECK(lp_gguf_find_tensor(g, "nope") == NULL);
    for (size_t i = 0; i < lp_gguf_tensor_count(g); i++)
        CHECK(((uintptr_t)lp_gguf_tensor_at(g, i)->data & 31) == 0); /* mapping is page aligned */
    CHECK(lp_gguf_tensor_at(g, 4) == NULL && lp_gguf_kv_at(g, 23) == NULL);
}

static void test_roundtrip(void) {
    char path[256], path2[256];
    path_in_dir(path, sizeof path, "rt.gguf");
    path_in_dir(path2, sizeof path2, "rt2.gguf");
    lp_error err = {0};
    lp_gguf_writer *w = lp_gguf_writer_create();
    fill_writer(w);
    CHECK_MSG(lp_gguf_writer_write(w, path, &err) == 0, "%s", err.message);
    lp_gguf_writer_free(w);

    lp_gguf *g = lp_gguf_open(path, &err);
    CHECK_MSG(g != NULL, "%s", err.message);
    if (!g) return;
    check_roundtrip_file(g);
    CHECK(strcmp(lp_gguf_path(g), path) == 0);

    /* copy_kv of every kv plus the tensors gives an identical file */
    w = lp_gguf_writer_create();
    for (size_t i = 0; i < lp_gguf_kv_count(g); i++) lp_gguf_writer_copy_kv(w, lp_gguf_kv_at(g, i));
    for (size_t i = 0; i < lp_gguf_tensor_count(g); i++) {
        const lp_gguf_tensor *t = lp_gguf_tensor_at(g, i);
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        lp_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->dims, t->data, t->n_bytes);
    }
    CHECK_MSG(lp_gguf_writer_write(w, path2, &err) == 0, "%s", err.message);
    lp_gguf_writer_free(w);
    size_t n1 = 0, n2 = 0;
    uint8_t *a = read_whole(path, &n1), *b = read_whole(path2, &n2);
    CHECK(a && b && n1 == n2 && memcmp(a, b, n1) == 0);
    free(a);
    free(b);
    lp_gguf_close(g);

    /* explicit alignment */
    w = lp_gguf_writer_create();
    lp_gguf_writer_set_u32(w, "general.alignment", 64);
    lp_gguf_writer_add_tensor(w, "x", LP_F32, 1, (const uint64_t[]){3}, f32_data, 12);
    lp_gguf_writer_add_tensor(w, "y", LP_F32, 1, (const uint64_t[]){5}, f32_data, 20);
    CHECK(lp_gguf_writer_write(w, path2, &err) == 0);
    lp_gguf_writer_free(w);
    g = lp_gguf_open(path2, &err);
    CHECK_MSG(g != NULL, "%s", err.message);
    if (g) {
        const lp_gguf_tensor *y = lp_gguf_find_tensor(g, "y");
        CHECK(y && ((const uint8_t *)y->data - (const uint8_t *)lp_gguf_tensor_at(g, 0)->data) == 64);
        CHECK(((uintptr_t)y->data & 63) == 0 && memcmp(y->data, f32_data, 20) == 0);
        lp_gguf_close(g);
    }

    /* writer misuse is reported at write time */
    w = lp_gguf_writer_create();
    lp_gguf_writer_add_tensor(w, "bad", LP_Q8_0, 1, (const uint64_t[]){30}, q8_data, 34);
    CHECK(lp_gguf_writer_write(w, path2, &err) == -1 && strstr(err.message, "bad"));
    lp_gguf_writer_free(w);
    w = lp_gguf_writer_create();
    lp_gguf_writer_set_u32(w, "general.alignment", 48);
    CHECK(lp_gguf_writer_write(w, path2, &err) == -1 && strstr(err.message, "power of two"));
    lp_gguf_writer_free(w);
    w = lp_gguf_writer_create();
    lp_gguf_writer_add_tensor(w, "x", LP_F32, 1, (const uint64_t[]){3}, f32_data, 12);
    lp_gguf_writer_add_tensor(w, "x", LP_F32, 1, (const uint64_t[]){3}, f32_data, 12);
    CHECK(lp_gguf_writer_write(w, path2, &err) == -1 && strstr(err.message, "duplicate"));
    lp_gguf_writer_free(w);

    /* a missing file */
    CHECK(lp_gguf_open("/nonexistent/x.gguf", &err) == NULL && strstr(err.message, "/nonexistent/x.gguf"));
    unlink(path);
    unlink(path2);
}

/* ---- the shared model files ---------------------------------------------- */

static void test_shared_models(void) {
    lp_error err = {0};
    lp_gguf *g = lp_gguf_open(LP_SHARED_MODELS "/stories260K.gguf", &err);
    CHECK_MSG(g != NULL, "%s", err.message);
    if (g) {
        lp_str s;
        CHECK(lp_gguf_get_str(g, "general.architecture", &s, &err) == 1 && lp_str_eq(s, "llama"));
        uint32_t n = 0;
        CHECK(lp_gguf_get_u32(g, "llama.embedding_length", &n, &err) == 1 && n == 64);
        CHECK(lp_gguf_get_u32(g, "llama.block_count", &n, &err) == 1 && n == 5);
        CHECK(lp_gguf_tensor_count(g) == 48);
        CHECK(lp_gguf_kv_count(g) == 19);
        const lp_gguf_tensor *t = lp_gguf_find_tensor(g, "token_embd.weight");
        CHECK(t && t->n_dims == 2 && t->dims[0] == 64 && t->dims[1] == 512 && t->type == LP_F32);
        const lp_gguf_kv *tokens = NULL;
        CHECK(lp_gguf_get_arr(g, "tokenizer.ggml.tokens", LP_GGUF_STRING, &tokens, &err) == 1);
        CHECK(tokens && tokens->arr_len == 512);
        touch_all(g);
        lp_gguf_close(g);
    }
    static const struct { const char *file; uint64_t n_tokens; } vocabs[] = {
        {"ggml-vocab-llama-bpe.gguf", 128256}, {"ggml-vocab-llama-spm.gguf", 32000},
        {"ggml-vocab-gpt-2.gguf", 50257},      {"ggml-vocab-qwen2.gguf", 151936},
        {"llama3-tiny-random.gguf", 0},        {"mistral-spm-tiny-random.gguf", 0},
        {"qwen2-tiny-random.gguf", 0},
    };
    for (size_t i = 0; i < sizeof vocabs / sizeof vocabs[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/arch/%s", LP_SHARED_MODELS, vocabs[i].file);
        g = lp_gguf_open(path, &err);
        CHECK_MSG(g != NULL, "%s", err.message);
        if (!g) continue;
        const lp_gguf_kv *tokens = NULL;
        CHECK(lp_gguf_get_arr(g, "tokenizer.ggml.tokens", LP_GGUF_STRING, &tokens, &err) == 1);
        if (vocabs[i].n_tokens)
            CHECK_MSG(tokens && tokens->arr_len == vocabs[i].n_tokens, "%s: %llu tokens", vocabs[i].file,
                      tokens ? (unsigned long long)tokens->arr_len : 0ull);
        lp_gguf_close(g);
    }
}

/* ---- malformed files ----------------------------------------------------- */

/* A small valid file: two kvs, two tensors, last tensor ends at EOF. */
static void build_small(buf *b) {
    b_header(b, 3, 2, 2);
    b_kv_u32(b, "k.one", 1);
    b_str(b, "k.name");
    b_u32(b, LP_GGUF_STRING);
    b_str(b, "tiny");
    b_tensor(b, "w1", 2, (const uint64_t[]){4, 2}, LP_F32, 0);
    b_tensor(b, "w2", 1, (const uint64_t[]){3}, LP_F32, 32);
    b_pad(b, 32);
    for (int i = 0; i < 8; i++) b_put(b, &f32_data[i], 4);
    for (int i = 0; i < 3; i++) b_put(b, &f32_data[i], 4);
}

/* A file with one kv (given as raw bytes after the key) and no tensors. */
static void one_kv(buf *b, const char *key, const void *value, size_t n) {
    b->len = 0;
    b_header(b, 3, 0, 1);
    b_str(b, key);
    b_put(b, value, n);
    b_zeros(b, 32);
}

/* A file with one tensor info and a little data. */
static void one_tensor(buf *b, uint32_t n_dims, const uint64_t *dims, uint32_t type, uint64_t offset) {
    b->len = 0;
    b_header(b, 3, 1, 0);
    b_tensor(b, "t", n_dims, dims, type, offset);
    b_pad(b, 32);
    b_zeros(b, 128);
}

static void test_malformed(void) {
    buf ok = {0}, b = {0};
    build_small(&ok);
    lp_error err = {0};
    lp_gguf *g = lp_gguf_open_memory(ok.p, ok.len, "small.gguf", &err);
    CHECK_MSG(g != NULL, "%s", err.message);
    if (g) {
        const lp_gguf_tensor *w2 = lp_gguf_find_tensor(g, "w2");
        CHECK(w2 && (const uint8_t *)w2->data + w2->n_bytes == ok.p + ok.len);
        CHECK(lp_gguf_file_size(g) == ok.len);
        lp_gguf_close(g);
    }

    /* every proper prefix is rejected */
    for (size_t n = 0; n < ok.len; n++) {
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, ok.p, n);
        err.message[0] = 0;
        g = lp_gguf_open_memory(copy, n, "cut.gguf", &err);
        CHECK_MSG(g == NULL && strlen(err.message) > 10, "prefix %zu accepted", n);
        lp_gguf_close(g);
        free(copy);
    }
    /* a truncated file mentions it */
    expect_reject(ok.p, 20, "truncated", "cut in the header");
    expect_reject(ok.p, ok.len - 1, "extends past end of file", "cut in the data");

    /* header fields */
    buf c = {0};
    b_put(&c, ok.p, ok.len);
    c.p[0] = 'X';
    expect_reject(c.p, c.len, "bad magic", "bad magic");
    memcpy(c.p, ok.p, ok.len);
    c.p[4] = 1;
    expect_reject(c.p, c.len, "version 1 is not supported", "version 1");
    c.p[4] = 99;
    expect_reject(c.p, c.len, "unsupported GGUF version 99", "version 99");
    memcpy(c.p, ok.p, ok.len);
    uint64_t huge = 1000000000000ull;
    memcpy(c.p + 8, &huge, 8);
    expect_reject(c.p, c.len, "tensor count", "absurd tensor count");
    memcpy(c.p, ok.p, ok.len);
    memcpy(c.p + 16, &huge, 8);
    expect_reject(c.p, c.len, "kv count", "absurd kv count");
    huge = UINT64_MAX;
    memcpy(c.p + 16, &huge, 8);
    expect_reject(c.p, c.len, "kv count", "kv count 2^64-1");

    /* string lengths */
    b.len = 0;
    b_header(&b, 3, 0, 1);
    b_u64(&b, UINT64_MAX - 3); /* key length near 2^64 */
    b_zeros(&b, 40);
    expect_reject(b.p, b.len, "string length", "key length overflow");
    uint8_t sv[4 + 8];
    uint32_t ty = LP_GGUF_STRING;
    uint64_t len = UINT64_MAX;
    memcpy(sv, &ty, 4);
    memcpy(sv + 4, &len, 8);
    one_kv(&b, "k", sv, sizeof sv);
    expect_reject(b.p, b.len, "string length", "value length overflow");

    /* UTF-8 */
    one_kv(&b, "bad\xff", (const uint8_t[]){4, 0, 0, 0, 1, 0, 0, 0}, 8);
    expect_reject(b.p, b.len, "not valid UTF-8", "bad UTF-8 key");
    uint8_t bad_str[4 + 8 + 3] = {8, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 'a', 0xc3, 0x28};
    one_kv(&b, "k", bad_str, sizeof bad_str);
    expect_reject(b.p, b.len, "not valid UTF-8", "bad UTF-8 value");
    uint8_t bad_arr[4 + 4 + 8 + 8 + 2] = {9, 0, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
                                          2, 0, 0, 0, 0, 0, 0, 0, 0xed, 0xa0};
    one_kv(&b, "k", bad_arr, sizeof bad_arr);
    expect_reject(b.p, b.len, "not valid UTF-8", "bad UTF-8 in string array");

    /* value types and arrays */
    one_kv(&b, "k", (const uint8_t[]){77, 0, 0, 0, 1, 0, 0, 0}, 8);
    expect_reject(b.p, b.len, "unknown value type 77", "unknown kv type");
    one_kv(&b, "k", (const uint8_t[]){9, 0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}, 16);
    expect_reject(b.p, b.len, "nested arrays", "nested array");
    one_kv(&b, "k", (const uint8_t[]){9, 0, 0, 0, 13, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}, 16);
    expect_reject(b.p, b.len, "unknown array element type", "unknown array type");
    one_kv(&b, "k", (const uint8_t[]){9, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x40}, 16);
    expect_reject(b.p, b.len, "exceeds", "huge numeric array");
    one_kv(&b, "k", (const uint8_t[]){9, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0}, 16);
    expect_reject(b.p, b.len, "cannot fit", "huge string array");
    b.len = 0;
    b_header(&b, 3, 0, 2);
    b_kv_u32(&b, "same", 1);
    b_kv_u32(&b, "same", 2);
    b_zeros(&b, 32);
    expect_reject(b.p, b.len, "duplicate key 'same'", "duplicate key");
    b.len = 0;
    b_header(&b, 3, 0, 1);
    b_kv_u32(&b, "general.alignment", 48);
    b_zeros(&b, 32);
    expect_reject(b.p, b.len, "power of two", "alignment 48");

    /* tensor infos */
    one_tensor(&b, 0, NULL, LP_F32, 0);
    expect_reject(b.p, b.len, "0 dimensions", "n_dims 0");
    one_tensor(&b, 5, (const uint64_t[]){1, 1, 1, 1, 1}, LP_F32, 0);
    expect_reject(b.p, b.len, "5 dimensions", "n_dims 5");
    one_tensor(&b, 2, (const uint64_t[]){4, 0}, LP_F32, 0);
    expect_reject(b.p, b.len, "dimension 1 is 0", "zero dim");
    one_tensor(&b, 1, (const uint64_t[]){(uint64_t)1 << 50}, LP_F32, 0);
    expect_reject(b.p, b.len, "dimension 0 is", "absurd dim");
    uint64_t big = (uint64_t)1 << 40;
    one_tensor(&b, 4, (const uint64_t[]){big, big, big, big}, LP_F32, 0);
    expect_reject(b.p, b.len, "overflows", "element count overflow");
    one_tensor(&b, 2, (const uint64_t[]){big, big}, LP_F32, 0);
    expect_reject(b.p, b.len, "overflows", "byte size overflow");
    one_tensor(&b, 1, (const uint64_t[]){4}, 99, 0);
    expect_reject(b.p, b.len, "unknown tensor type 99", "wrong type id");
    one_tensor(&b, 1, (const uint64_t[]){4}, 4, 0); /* a removed GGML type id */
    expect_reject(b.p, b.len, "unknown tensor type 4", "removed type id");
    /* our packed ids are laid out in panels, never GGUF rows */
    static const uint32_t own[3] = {LP_W4, LP_W8, LP_W4C};
    for (int i = 0; i < 3; i++) {
        one_tensor(&b, 2, (const uint64_t[]){32, 17}, own[i], 0);
        expect_reject(b.p, b.len, "unknown tensor type", lp_dtype_name(own[i]));
    }
    one_tensor(&b, 1, (const uint64_t[]){30}, LP_Q8_0, 0);
    expect_reject(b.p, b.len, "block size", "block size");
    one_tensor(&b, 1, (const uint64_t[]){4}, LP_F32, 4);
    expect_reject(b.p, b.len, "not a multiple of the alignment", "misaligned offset");
    one_tensor(&b, 1, (const uint64_t[]){4}, LP_F32, UINT64_MAX - 31);
    expect_reject(b.p, b.len, "extends past end of file", "overflowing offset");
    one_tensor(&b, 1, (const uint64_t[]){4}, LP_F32, 128);
    expect_reject(b.p, b.len, "tensor 't' data [offset 128, 16 bytes] extends past end of file",
                  "offset past the end");
    one_tensor(&b, 1, (const uint64_t[]){64}, LP_F32, 0);
    expect_reject(b.p, b.len, "extends past end of file", "size past the end");
    b.len = 0;
    b_header(&b, 3, 2, 0);
    b_tensor(&b, "t", 1, (const uint64_t[]){4}, LP_F32, 0);
    b_tensor(&b, "t", 1, (const uint64_t[]){4}, LP_F32, 0);
    b_pad(&b, 32);
    b_zeros(&b, 16);
    expect_reject(b.p, b.len, "duplicate tensor name 't'", "duplicate tensor");
    b.len = 0;
    b_header(&b, 3, 1, 0);
    b_u64(&b, 2);
    b_put(&b, "\xc0\x80", 2); /* overlong NUL */
    b_u32(&b, 1);
    b_u64(&b, 4);
    b_u32(&b, 0);
    b_u64(&b, 0);
    b_pad(&b, 32);
    b_zeros(&b, 16);
    expect_reject(b.p, b.len, "not valid UTF-8", "bad UTF-8 tensor name");

    /* Known but unsupported types are listed as they are. */
    one_tensor(&b, 1, (const uint64_t[]){256}, LP_Q2_K, 0);
    g = lp_gguf_open_memory(b.p, b.len, "q2k.gguf", &err);
    CHECK_MSG(g && lp_gguf_tensor_at(g, 0)->type == LP_Q2_K && lp_gguf_tensor_at(g, 0)->n_bytes == 84,
              "%s", err.message);
    lp_gguf_close(g);
    /* Version 2 reads too. */
    memcpy(c.p, ok.p, ok.len);
    c.p[4] = 2;
    g = lp_gguf_open_memory(c.p, c.len, "v2.gguf", &err);
    CHECK(g && lp_gguf_version(g) == 2);
    lp_gguf_close(g);

    /* random byte flips never crash */
    lp_rng rng;
    lp_rng_seed(&rng, 1234);
    int accepted = 0;
    for (int iter = 0; iter < 4000; iter++) {
        uint8_t *copy = malloc(ok.len);
        memcpy(copy, ok.p, ok.len);
        int flips = 1 + (int)(lp_rng_u64(&rng) % 4);
        for (int k = 0; k < flips; k++) {
            size_t pos = (size_t)(lp_rng_u64(&rng) % ok.len);
            uint64_t r = lp_rng_u64(&rng);
            copy[pos] = (r & 1) ? (uint8_t)(copy[pos] ^ (1u << ((r >> 1) % 8))) : (uint8_t)(r >> 8);
        }
        g = lp_gguf_open_memory(copy, ok.len, "flip.gguf", &err);
        if (g) {
            accepted++;
            touch_all(g);
        } else {
            CHECK(err.message[0] != 0);
        }
        lp_gguf_close(g);
        free(copy);
    }
    CHECK(accepted > 0); /* flips in tensor data stay valid */
    free(ok.p);
    free(b.p);
    free(c.p);
}

int main(void) {
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_roundtrip();
    test_shared_models();
    test_malformed();
    rmdir(g_dir);
    return check_summary("gguf");
}
