/* safetensors: writer round trip, dtype conversion, malformed headers, and a
 * two-shard set opened through its index. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "base/base.h"
#include "formats/safetensors.h"

static char g_dir[] = "/tmp/lp_test_st_XXXXXX";

static void path_in(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", g_dir, name);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* A file image: u64 length, the JSON as given, then `data_len` data bytes. */
static uint8_t *make_file(const char *json, size_t data_len, size_t *size) {
    size_t n = strlen(json);
    *size = 8 + n + data_len;
    uint8_t *p = calloc(1, *size);
    uint64_t n64 = n;
    memcpy(p, &n64, 8);
    memcpy(p + 8, json, n);
    for (size_t i = 0; i < data_len; i++) p[8 + n + i] = (uint8_t)(i * 13 + 5);
    return p;
}

static void expect_reject(const char *json, size_t data_len, const char *needle) {
    size_t size;
    uint8_t *p = make_file(json, data_len, &size);
    lp_error err = {0};
    lp_safetensors *st = lp_safetensors_open_memory(p, size, "bad.safetensors", &err);
    CHECK_MSG(st == NULL, "accepted: %s", json);
    CHECK_MSG(strstr(err.message, "bad.safetensors") == err.message && strstr(err.message, needle),
              "%s: message '%s' lacks '%s'", json, err.message, needle);
    lp_safetensors_close(st);
    free(p);
}

static void touch_all(const lp_safetensors *st) {
    volatile unsigned sum = 0;
    for (size_t i = 0; i < lp_safetensors_count(st); i++) {
        const lp_st_tensor *t = lp_safetensors_at(st, i);
        const uint8_t *d = t->data;
        for (size_t j = 0; j < t->n_bytes; j++) sum += d[j];
        for (const char *c = t->name; *c; c++) sum += (unsigned)*c;
        CHECK(lp_safetensors_find(st, t->name) == t);
    }
    (void)sum;
}

static const float k_f32[6] = {1.5f, -2, 3, 0.25f, -0.125f, 1e20f};
static const int32_t k_i32[3] = {7, -7, 1 << 30};

static void write_sample(const char *path) {
    static uint16_t f16[4], bf16[4];
    for (int i = 0; i < 4; i++) {
        f16[i] = lp_f32_to_f16(k_f32[i]);
        bf16[i] = lp_f32_to_bf16(k_f32[i]);
    }
    static const uint8_t scalar = 42;
    lp_st_writer *w = lp_st_writer_create();
    lp_st_writer_add(w, "model.a", LP_ST_F32, 2, (const uint64_t[]){2, 3}, k_f32, sizeof k_f32);
    lp_st_writer_add(w, "model.b_f16", LP_ST_F16, 1, (const uint64_t[]){4}, f16, sizeof f16);
    lp_st_writer_add(w, "model.c_bf16", LP_ST_BF16, 2, (const uint64_t[]){2, 2}, bf16, sizeof bf16);
    lp_st_writer_add(w, "ids", LP_ST_I32, 1, (const uint64_t[]){3}, k_i32, sizeof k_i32);
    lp_st_writer_add(w, "scalar", LP_ST_U8, 0, NULL, &scalar, 1);
    lp_st_writer_add(w, "empty", LP_ST_F32, 2, (const uint64_t[]){0, 5}, NULL, 0);
    lp_st_writer_set_metadata(w, "format", "pt");
    lp_st_writer_set_metadata(w, "note", "quote \" and \\ ok");
    lp_st_writer_set_metadata(w, "format", "pt2"); /* replaces */
    lp_error err = {0};
    CHECK_MSG(lp_st_writer_write(w, path, &err) == 0, "%s", err.message);
    lp_st_writer_free(w);
}

static void test_roundtrip(void) {
    char path[256];
    path_in(path, sizeof path, "rt.safetensors");
    write_sample(path);
    lp_error err = {0};
    lp_safetensors *st = lp_safetensors_open(path, &err);
    CHECK_MSG(st != NULL, "%s", err.message);
    if (!st) return;
    CHECK(lp_safetensors_count(st) == 6);
    CHECK(strcmp(lp_safetensors_at(st, 0)->name, "model.a") == 0); /* file order */
    const lp_st_tensor *a = lp_safetensors_find(st, "model.a");
    CHECK(a && a->dtype == LP_ST_F32 && a->n_dims == 2 && a->shape[0] == 2 && a->shape[1] == 3 &&
          a->n_elements == 6 && a->n_bytes == 24 && memcmp(a->data, k_f32, 24) == 0);
    CHECK(a && ((uintptr_t)a->data & 7) == 0); /* header padded to 8 */
    float out[6] = {0};
    CHECK(a && lp_st_to_f32(a, out, &err) == 0 && memcmp(out, k_f32, 24) == 0);
    const lp_st_tensor *h = lp_safetensors_find(st, "model.b_f16");
    CHECK(h && h->dtype == LP_ST_F16 && h->n_bytes == 8);
    CHECK(h && lp_st_to_f32(h, out, &err) == 0);
    for (int i = 0; i < 4; i++) CHECK_NEAR(out[i], k_f32[i], 1e-3);
    const lp_st_tensor *b = lp_safetensors_find(st, "model.c_bf16");
    CHECK(b && b->dtype == LP_ST_BF16 && b->n_elements == 4);
    CHECK(b && lp_st_to_f32(b, out, &err) == 0);
    for (int i = 0; i < 4; i++) CHECK_NEAR(out[i], k_f32[i], 1e-2);
    const lp_st_tensor *ids = lp_safetensors_find(st, "ids");
    CHECK(ids && ids->dtype == LP_ST_I32 && memcmp(ids->data, k_i32, 12) == 0);
    CHECK(ids && lp_st_to_f32(ids, out, &err) == -1 && strstr(err.message, "I32"));
    const lp_st_tensor *sc = lp_safetensors_find(st, "scalar");
    CHECK(sc && sc->n_dims == 0 && sc->n_elements == 1 && *(const uint8_t *)sc->data == 42);
    const lp_st_tensor *e = lp_safetensors_find(st, "empty");
    CHECK(e && e->n_elements == 0 && e->n_bytes == 0 && e->shape[1] == 5);
    CHECK(lp_safetensors_find(st, "nope") == NULL && lp_safetensors_at(st, 6) == NULL);
    const char *fmt = lp_safetensors_metadata(st, "format");
    CHECK(fmt && strcmp(fmt, "pt2") == 0);
    const char *note = lp_safetensors_metadata(st, "note");
    CHECK(note && strcmp(note, "quote \" and \\ ok") == 0);
    CHECK(lp_safetensors_metadata(st, "missing") == NULL);
    CHECK(strcmp(lp_st_dtype_name(LP_ST_BF16), "BF16") == 0 && lp_st_dtype_size(LP_ST_I64) == 8);
    lp_safetensors_close(st);

    /* writer misuse reported at write time */
    lp_st_writer *w = lp_st_writer_create();
    lp_st_writer_add(w, "x", LP_ST_F32, 1, (const uint64_t[]){3}, k_f32, 8);
    CHECK(lp_st_writer_write(w, path, &err) == -1 && strstr(err.message, "'x'"));
    lp_st_writer_free(w);
    w = lp_st_writer_create();
    lp_st_writer_add(w, "x", LP_ST_F32, 1, (const uint64_t[]){1}, k_f32, 4);
    lp_st_writer_add(w, "x", LP_ST_F32, 1, (const uint64_t[]){1}, k_f32, 4);
    CHECK(lp_st_writer_write(w, path, &err) == -1 && strstr(err.message, "duplicate"));
    lp_st_writer_free(w);
    CHECK(lp_safetensors_open("/nonexistent/a.safetensors", &err) == NULL &&
          strstr(err.message, "/nonexistent/a.safetensors"));
    unlink(path);
}

static void test_malformed(void) {
    const char *good =
        "{\"__metadata__\":{\"a\":\"b\"},"
        "\"x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
        "\"y\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[16,22]}}";
    size_t size;
    uint8_t *ok = make_file(good, 22, &size);
    lp_error err = {0};
    lp_safetensors *st = lp_safetensors_open_memory(ok, size, "good.safetensors", &err);
    CHECK_MSG(st && lp_safetensors_count(st) == 2, "%s", err.message);
    lp_safetensors_close(st);

    /* every proper prefix is rejected (data or header cut) */
    for (size_t n = 0; n < size; n++) {
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, ok, n);
        err.message[0] = 0;
        st = lp_safetensors_open_memory(copy, n, "cut.safetensors", &err);
        CHECK_MSG(st == NULL && strlen(err.message) > 10, "prefix %zu accepted", n);
        lp_safetensors_close(st);
        free(copy);
    }

    /* header length */
    uint8_t *copy = malloc(size);
    memcpy(copy, ok, size);
    uint64_t huge = UINT64_MAX - 2;
    memcpy(copy, &huge, 8);
    st = lp_safetensors_open_memory(copy, size, "bad.safetensors", &err);
    CHECK(st == NULL && strstr(err.message, "header length"));
    huge = (uint64_t)200 << 20;
    memcpy(copy, &huge, 8);
    st = lp_safetensors_open_memory(copy, size, "bad.safetensors", &err);
    CHECK(st == NULL && strstr(err.message, "header length"));
    free(copy);

    expect_reject("{\"x\":", 0, "not valid JSON");
    expect_reject("[1,2]", 0, "not a JSON object");
    expect_reject("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "outside the data section");
    expect_reject("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,4]}}", 16, "outside");
    expect_reject("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", 16, "hold 12 bytes");
    expect_reject("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 16, "data_offsets");
    expect_reject("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,1e300]}}", 16, "data_offsets");
    expect_reject("{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 16, "shape[0]");
    expect_reject("{\"x\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}", 16, "shape[0]");
    expect_reject("{\"x\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 16, "shape[0]");
    expect_reject("{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
                  "\"data_offsets\":[0,8]}}", 16, "overflows");
    expect_reject("{\"x\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 16,
                  "9 dimensions");
    expect_reject("{\"x\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 16, "unsupported dtype");
    expect_reject("{\"x\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 16, "dtype");
    expect_reject("{\"x\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 16, "shape");
    expect_reject("{\"x\":3}", 16, "not an object");
    expect_reject("{\"__metadata__\":{\"a\":1}}", 0, "not a string");
    expect_reject("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 16, "duplicate");

    /* overlapping ranges are allowed; trailing spaces in the header too */
    size_t n2;
    uint8_t *ov = make_file("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                            "\"y\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[4,8]}}   ", 8, &n2);
    st = lp_safetensors_open_memory(ov, n2, "overlap.safetensors", &err);
    CHECK_MSG(st && lp_safetensors_count(st) == 2, "%s", err.message);
    lp_safetensors_close(st);
    free(ov);

    /* random byte flips never crash */
    lp_rng rng;
    lp_rng_seed(&rng, 99);
    for (int iter = 0; iter < 3000; iter++) {
        copy = malloc(size);
        memcpy(copy, ok, size);
        int flips = 1 + (int)(lp_rng_u64(&rng) % 3);
        for (int k = 0; k < flips; k++) {
            uint64_t r = lp_rng_u64(&rng);
            copy[r % size] = (uint8_t)(r >> 32);
        }
        st = lp_safetensors_open_memory(copy, size, "flip.safetensors", &err);
        if (st) touch_all(st);
        else CHECK(err.message[0] != 0);
        lp_safetensors_close(st);
        free(copy);
    }
    free(ok);
}

static void write_shard(const char *name, const char *tensor, float value) {
    char path[256];
    path_in(path, sizeof path, name);
    float data[4] = {value, value + 1, value + 2, value + 3};
    lp_st_writer *w = lp_st_writer_create();
    lp_st_writer_add(w, tensor, LP_ST_F32, 2, (const uint64_t[]){2, 2}, data, sizeof data);
    lp_st_writer_set_metadata(w, "format", "pt");
    lp_error err = {0};
    CHECK_MSG(lp_st_writer_write(w, path, &err) == 0, "%s", err.message);
    lp_st_writer_free(w);
}

static void test_sharded(void) {
    char index[256], path[256];
    write_shard("model-00001-of-00002.safetensors", "layers.0.w", 10);
    write_shard("model-00002-of-00002.safetensors", "layers.1.w", 20);
    path_in(index, sizeof index, "model.safetensors.index.json");
    write_text(index, "{\"metadata\":{\"total_size\":32},\"weight_map\":{"
                      "\"layers.0.w\":\"model-00001-of-00002.safetensors\","
                      "\"layers.1.w\":\"model-00002-of-00002.safetensors\"}}");
    lp_error err = {0};
    for (int via_dir = 0; via_dir < 2; via_dir++) {
        lp_safetensors *st = lp_safetensors_open(via_dir ? g_dir : index, &err);
        CHECK_MSG(st != NULL, "%s", err.message);
        if (!st) continue;
        CHECK(lp_safetensors_count(st) == 2);
        const lp_st_tensor *a = lp_safetensors_find(st, "layers.0.w");
        const lp_st_tensor *b = lp_safetensors_find(st, "layers.1.w");
        CHECK(a && ((const float *)a->data)[0] == 10 && ((const float *)a->data)[3] == 13);
        CHECK(b && ((const float *)b->data)[0] == 20 && b->shape[0] == 2);
        CHECK(lp_safetensors_metadata(st, "format") != NULL);
        lp_safetensors_close(st);
    }

    /* bad indexes */
    write_text(index, "{\"weight_map\":{\"layers.0.w\":\"../model-00001-of-00002.safetensors\"}}");
    CHECK(lp_safetensors_open(index, &err) == NULL && strstr(err.message, "invalid shard"));
    write_text(index, "{\"weight_map\":{\"layers.0.w\":\"sub/x.safetensors\"}}");
    CHECK(lp_safetensors_open(index, &err) == NULL && strstr(err.message, "invalid shard"));
    write_text(index, "{\"weight_map\":{\"layers.0.w\":\"model-00002-of-00002.safetensors\"}}");
    CHECK(lp_safetensors_open(index, &err) == NULL && strstr(err.message, "not in shard"));
    write_text(index, "{\"weight_map\":{\"layers.0.w\":\"missing.safetensors\"}}");
    CHECK(lp_safetensors_open(g_dir, &err) == NULL && strstr(err.message, "missing.safetensors"));
    write_text(index, "{\"weight_map\":[]}");
    CHECK(lp_safetensors_open(index, &err) == NULL && strstr(err.message, "weight_map"));
    write_text(index, "{\"weight_map\":");
    CHECK(lp_safetensors_open(index, &err) == NULL && strstr(err.message, "JSON"));
    /* the same tensor in two shards */
    write_shard("dup.safetensors", "layers.0.w", 30);
    write_text(index, "{\"weight_map\":{\"layers.0.w\":\"model-00001-of-00002.safetensors\","
                      "\"other\":\"dup.safetensors\"}}");
    CHECK(lp_safetensors_open(index, &err) == NULL && strstr(err.message, "duplicate"));
    unlink(index);
    path_in(path, sizeof path, "dup.safetensors");
    unlink(path);

    /* a directory with model.safetensors takes that file */
    CHECK(lp_safetensors_open(g_dir, &err) == NULL && strstr(err.message, "no model.safetensors"));
    write_shard("model.safetensors", "solo", 5);
    lp_safetensors *st = lp_safetensors_open(g_dir, &err);
    CHECK_MSG(st && lp_safetensors_count(st) == 1 && lp_safetensors_find(st, "solo"), "%s", err.message);
    lp_safetensors_close(st);
    path_in(path, sizeof path, "model.safetensors");
    unlink(path);
    path_in(path, sizeof path, "model-00001-of-00002.safetensors");
    unlink(path);
    path_in(path, sizeof path, "model-00002-of-00002.safetensors");
    unlink(path);
}

int main(void) {
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_roundtrip();
    test_malformed();
    test_sharded();
    rmdir(g_dir);
    return check_summary("safetensors");
}
