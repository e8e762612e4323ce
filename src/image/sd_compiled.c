/* The compiled SD model file (see sd_compiled.h): its reader checks every
 * field against what the configuration's layout gives, its writer lays the
 * tensors out. */
#include "sd_compiled.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/dtype.h"
#include "../formats/le.h"

#define HEADER_BYTES 512
#define ENTRY_BYTES 64
#define CONFIG_OFFSET 32
#define CONFIG_SLOTS 40
#define ALIGN 64
#define VERSION 1

/* ---- the configuration as int32 fields --------------------------------------------------------- */

static int config_fields(lp_sd_config *c, int32_t **f) {
    int n = 0;
    int32_t *one[] = {&c->te_vocab, &c->te_ctx, &c->te_dim, &c->te_layers, &c->te_heads, &c->te_ffn,
                      &c->unet_in, &c->unet_out, &c->unet_ch, &c->unet_levels};
    for (size_t i = 0; i < sizeof one / sizeof one[0]; i++) f[n++] = one[i];
    for (int l = 0; l < LP_SD_MAX_LEVELS; l++) f[n++] = &c->unet_mult[l];
    f[n++] = &c->unet_res_blocks;
    int32_t *two[] = {&c->unet_heads, &c->context_dim, &c->vae_img, &c->vae_z, &c->vae_ch, &c->vae_levels};
    for (size_t i = 0; i < sizeof two / sizeof two[0]; i++) f[n++] = two[i];
    for (int l = 0; l < LP_SD_MAX_LEVELS; l++) f[n++] = &c->vae_mult[l];
    f[n++] = &c->vae_res_blocks;
    f[n++] = &c->groups;
    return n; /* unet_attn: the next LP_SD_MAX_LEVELS slots */
}

static void put_config(uint8_t *p, const lp_sd_config *src) {
    lp_sd_config c = *src;
    int32_t *f[CONFIG_SLOTS];
    int n = config_fields(&c, f);
    for (int i = 0; i < n; i++) lp_le_put_u32(p + 4 * i, (uint32_t)*f[i]);
    for (int l = 0; l < LP_SD_MAX_LEVELS; l++) lp_le_put_u32(p + 4 * (n + l), c.unet_attn[l] ? 1 : 0);
}

static int get_config(const uint8_t *p, lp_sd_config *c, const char *what, lp_error *err) {
    *c = (lp_sd_config){0};
    int32_t *f[CONFIG_SLOTS];
    int n = config_fields(c, f);
    for (int i = 0; i < n; i++) *f[i] = (int32_t)lp_le_get_u32(p + 4 * i);
    for (int l = 0; l < LP_SD_MAX_LEVELS; l++) {
        uint32_t a = lp_le_get_u32(p + 4 * (n + l));
        if (a > 1) return lp_fail(err, "%s: configuration: attention flag %u of level %d", what, a, l);
        c->unet_attn[l] = a;
    }
    for (int i = n + LP_SD_MAX_LEVELS; i < CONFIG_SLOTS; i++)
        if (lp_le_get_u32(p + 4 * i)) return lp_fail(err, "%s: configuration slot %d is not zero", what, i);
    lp_error e = {0};
    if (lp_sd_config_check(c, &e)) return lp_fail(err, "%s: configuration: %s", what, e.message);
    return 0;
}

/* ---- what the layout gives --------------------------------------------------------------------- */

typedef struct entry {
    uint32_t type, group;
    uint64_t rows, cols, bytes;
} entry;

typedef struct expect_ctx {
    uint32_t weight_type;
    entry *e;   /* NULL: count only */
    int64_t n;
    bool overflow;
} expect_ctx;

static int expect_one(void *ctx, const lp_sd_tensor_desc *t) {
    expect_ctx *x = ctx;
    int64_t rows, cols;
    bool w8;
    uint64_t bytes = lp_sd_tensor_bytes(x->weight_type, t, &w8, &rows, &cols);
    if (!bytes) x->overflow = true;
    if (x->e)
        x->e[x->n] = (entry){.type = w8 ? LP_W8 : LP_F32, .group = w8 ? (uint32_t)cols : 0, .rows = (uint64_t)rows,
                             .cols = (uint64_t)cols, .bytes = bytes};
    x->n++;
    return 0;
}

/* the layout's entries for (cfg, weight_type): malloc'd, *n of them; NULL on overflow */
static entry *expected(const lp_sd_config *cfg, uint32_t weight_type, int64_t *n) {
    expect_ctx x = {.weight_type = weight_type};
    lp_sd_layout(cfg, expect_one, &x);
    x.e = malloc(sizeof(entry) * (size_t)(x.n ? x.n : 1));
    if (!x.e) return NULL;
    *n = x.n;
    x.n = 0;
    lp_sd_layout(cfg, expect_one, &x);
    if (x.overflow) {
        free(x.e);
        return NULL;
    }
    return x.e;
}

static uint64_t align_up(uint64_t v) { return (v + ALIGN - 1) & ~(uint64_t)(ALIGN - 1); }

/* ---- reader ------------------------------------------------------------------------------------ */

bool lp_sd_compiled_magic(const void *data, size_t size) {
    return size >= 4 && !memcmp(data, LP_SD_COMPILED_MAGIC, 4);
}

int lp_sd_compiled_parse(const void *data, size_t size, const char *what, lp_sd_compiled *out, lp_error *err) {
    *out = (lp_sd_compiled){0};
    const uint8_t *p = data;
    if (size < HEADER_BYTES || !lp_sd_compiled_magic(data, size))
        return lp_fail(err, "%s: not a compiled SD model (no LPS1 header)", what);
    if ((uintptr_t)data % ALIGN) return lp_fail(err, "%s: image not 64-byte aligned in memory", what);
    uint32_t version = lp_le_get_u32(p + 4), n = lp_le_get_u32(p + 16), wt = lp_le_get_u32(p + 20),
             acts = lp_le_get_u32(p + 24);
    uint64_t file_bytes = lp_le_get_u64(p + 8);
    if (version != VERSION) return lp_fail(err, "%s: version %u (this build reads %d)", what, version, VERSION);
    if (file_bytes != size) return lp_fail(err, "%s: header says %llu bytes, the file has %zu", what,
                                           (unsigned long long)file_bytes, size);
    if (wt != LP_F32 && wt != LP_W8) return lp_fail(err, "%s: weight type %u (f32 or w8)", what, wt);
    if (acts > 1) return lp_fail(err, "%s: activations %u (0 int8, 1 float)", what, acts);
    if (lp_le_get_u32(p + 28)) return lp_fail(err, "%s: reserved header bytes are not zero", what);
    for (size_t i = CONFIG_OFFSET + 4 * CONFIG_SLOTS; i < HEADER_BYTES; i++)
        if (p[i]) return lp_fail(err, "%s: reserved header bytes are not zero", what);
    lp_sd_config cfg;
    if (get_config(p + CONFIG_OFFSET, &cfg, what, err)) return -1;
    int64_t ne = 0;
    entry *e = expected(&cfg, wt, &ne);
    if (!e) return lp_fail(err, "%s: the configuration's tensors overflow", what);
    if ((int64_t)n != ne) {
        free(e);
        return lp_fail(err, "%s: %u tensors, the configuration has %lld", what, n, (long long)ne);
    }
    if ((uint64_t)n * ENTRY_BYTES > size - HEADER_BYTES) {
        free(e);
        return lp_fail(err, "%s: the table of %u tensors runs past the end", what, n);
    }
    out->data = malloc(sizeof(void *) * (size_t)(n ? n : 1));
    out->is_w8 = calloc(n ? n : 1, sizeof(bool));
    if (!out->data || !out->is_w8) {
        free(e);
        lp_sd_compiled_release(out);
        return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", what);
    }
    uint64_t at = align_up(HEADER_BYTES + (uint64_t)n * ENTRY_BYTES);
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *q = p + HEADER_BYTES + (size_t)i * ENTRY_BYTES;
        entry got = {.type = lp_le_get_u32(q), .group = lp_le_get_u32(q + 4), .rows = lp_le_get_u64(q + 8),
                     .cols = lp_le_get_u64(q + 16), .bytes = lp_le_get_u64(q + 32)};
        uint64_t off = lp_le_get_u64(q + 24);
        bool zero = true;
        for (int k = 40; k < ENTRY_BYTES; k++) zero = zero && !q[k];
        const char *bad = !zero                                                     ? "reserved bytes not zero"
                          : got.type != e[i].type || got.group != e[i].group        ? "type or group"
                          : got.rows != e[i].rows || got.cols != e[i].cols          ? "shape"
                          : got.bytes != e[i].bytes                                 ? "size"
                          : off % ALIGN || off < at                                 ? "offset (unaligned or overlapping)"
                          : off > size || got.bytes > size - off                    ? "extent (past the end)"
                                                                                    : NULL;
        if (bad) {
            free(e);
            lp_sd_compiled_release(out);
            return lp_fail(err, "%s: tensor %u: %s does not match the configuration's layout", what, i, bad);
        }
        out->data[i] = p + off;
        out->is_w8[i] = got.type == LP_W8;
        at = off + got.bytes;
    }
    free(e);
    out->cfg = cfg;
    out->weight_type = wt;
    out->int8_activations = acts == 0;
    out->n_tensors = n;
    return 0;
}

void lp_sd_compiled_release(lp_sd_compiled *c) {
    free(c->data), free(c->is_w8);
    c->data = NULL, c->is_w8 = NULL;
}

/* ---- writer ------------------------------------------------------------------------------------ */

static int write_all(FILE *f, const void *p, uint64_t n) { return fwrite(p, 1, (size_t)n, f) == (size_t)n ? 0 : -1; }

static int pad_to(FILE *f, uint64_t *at, uint64_t to) {
    static const uint8_t zeros[ALIGN];
    if (to - *at > ALIGN) return -1;
    int rc = write_all(f, zeros, to - *at);
    *at = to;
    return rc;
}

int lp_sd_compiled_write(const char *path, const lp_sd_config *cfg, uint32_t weight_type, bool int8_activations,
                         const void *const *data, int64_t n_tensors, lp_error *err) {
    int64_t n = 0;
    entry *e = expected(cfg, weight_type, &n);
    if (!e) return lp_fail(err, "%s: the configuration's tensors overflow", path);
    if (n != n_tensors || n > UINT32_MAX) {
        free(e);
        return lp_fail(err, "%s: %lld tensors for a layout of %lld", path, (long long)n_tensors, (long long)n);
    }
    uint8_t *head = calloc(1, HEADER_BYTES + (size_t)n * ENTRY_BYTES);
    FILE *f = head ? fopen(path, "wb") : NULL;
    if (!f) {
        free(e), free(head);
        return lp_fail(err, "cannot write %s", path);
    }
    uint64_t at = align_up(HEADER_BYTES + (uint64_t)n * ENTRY_BYTES), off = at, end = at;
    for (int64_t i = 0; i < n; i++) {
        uint8_t *q = head + HEADER_BYTES + i * ENTRY_BYTES;
        lp_le_put_u32(q, e[i].type);
        lp_le_put_u32(q + 4, e[i].group);
        lp_le_put_u64(q + 8, e[i].rows);
        lp_le_put_u64(q + 16, e[i].cols);
        lp_le_put_u64(q + 24, off);
        lp_le_put_u64(q + 32, e[i].bytes);
        end = off + e[i].bytes;
        off = align_up(end);
    }
    memcpy(head, LP_SD_COMPILED_MAGIC, 4);
    lp_le_put_u32(head + 4, VERSION);
    lp_le_put_u32(head + 16, (uint32_t)n);
    lp_le_put_u32(head + 20, weight_type);
    lp_le_put_u32(head + 24, int8_activations ? 0 : 1);
    put_config(head + CONFIG_OFFSET, cfg);
    lp_le_put_u64(head + 8, end); /* the last tensor ends the file */
    uint64_t pos = HEADER_BYTES + (uint64_t)n * ENTRY_BYTES;
    int rc = write_all(f, head, pos);
    for (int64_t i = 0; !rc && i < n; i++) {
        rc = pad_to(f, &pos, align_up(pos));
        if (!rc) rc = write_all(f, data[i], e[i].bytes);
        pos += e[i].bytes;
    }
    if (fclose(f)) rc = -1;
    free(e), free(head);
    if (rc) {
        remove(path);
        return lp_fail(err, "cannot write %s (disk full?)", path);
    }
    return 0;
}
