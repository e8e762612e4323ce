/* .lpa reader and writer (layout in lpa.h). The reader trusts nothing: every
 * count, size and offset is checked against the file (with overflow checks)
 * before anything is dereferenced, and both checksums must match. */
#include "lpa.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "le.h"

#include "../base/dtype.h"

/* ---- shared helpers ------------------------------------------------------------ */

uint64_t lp_lpa_hash(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = data;
    while (n > 0) {
        uint8_t word[8] = {0};
        size_t take = n < 8 ? n : 8;
        memcpy(word, p, take);
        h = (h ^ lp_le_get_u64(word)) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 31;
        p += take;
        n -= take;
    }
    return h;
}

static size_t elem_size(uint32_t dtype) { return dtype == LP_F16 ? 2 : 4; }

static uint64_t align64(uint64_t x) { return (x + LP_LPA_ALIGN - 1) & ~(uint64_t)(LP_LPA_ALIGN - 1); }

static bool is_packed(uint32_t dtype) { return dtype == LP_W8 || dtype == LP_W4; }
static bool is_codes(uint32_t dtype) { return dtype == LP_LPA_Q8 || dtype == LP_LPA_Q4; }
static bool valid_dtype(uint32_t dtype) {
    return dtype == LP_F32 || dtype == LP_F16 || is_packed(dtype) || is_codes(dtype);
}

/* Bytes of a W8/W4 packed rows x cols matrix (cols a multiple of 32): per
 * 16-row panel and 32-column group, 16 f16 scales and 16 x 32 codes of 8 or
 * 4 bits. */
static bool packed_bytes(uint32_t dtype, uint64_t rows, uint64_t cols, size_t *bytes) {
    if (cols == 0 || cols % 32) return false;
    size_t per_group = 32 + (dtype == LP_W8 ? 16 * 32 : 16 * 16);
    return lp_mul_ok((rows + 15) / 16, cols / 32, bytes) && lp_mul_ok(*bytes, per_group, bytes);
}

/* Bytes of A (rank x in) and B (out x rank; packed: out x round32(rank));
 * false on overflow or a shape W8/W4 cannot hold. */
static bool block_bytes(const lp_lpa_entry *e, size_t *a_bytes, size_t *b_bytes) {
    if (is_codes(e->dtype))
        return lp_mul_ok(e->rank, lp_lpa_code_row_bytes(e->dtype, e->in), a_bytes) &&
               lp_mul_ok(e->out, lp_lpa_code_row_bytes(e->dtype, e->rank), b_bytes);
    if (is_packed(e->dtype))
        return packed_bytes(e->dtype, e->rank, e->in, a_bytes) &&
               packed_bytes(e->dtype, e->out, ((uint64_t)e->rank + 31) & ~31ull, b_bytes);
    size_t na, nb;
    return lp_mul_ok(e->rank, e->in, &na) && lp_mul_ok(na, elem_size(e->dtype), a_bytes) &&
           lp_mul_ok(e->rank, e->out, &nb) && lp_mul_ok(nb, elem_size(e->dtype), b_bytes);
}

/* Version 1 entries: projection ids of the Llama family, their GGUF names
 * and shapes from the base dims. */
#define V1_N_PROJ 7
static const char *const v1_proj_gguf[V1_N_PROJ] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                                    "ffn_gate", "ffn_up", "ffn_down"};

static void v1_shape(const lp_lpa_base *b, uint32_t proj, uint64_t *in, uint64_t *out) {
    uint64_t dim = b->dim, q = (uint64_t)b->n_heads * b->head_dim,
             kv = (uint64_t)b->n_kv_heads * b->head_dim, ffn = b->ffn_dim;
    const uint64_t ins[V1_N_PROJ] = {dim, dim, dim, q, dim, dim, ffn};
    const uint64_t outs[V1_N_PROJ] = {q, kv, kv, dim, ffn, ffn, dim};
    *in = ins[proj];
    *out = outs[proj];
}

static size_t entry_bytes(uint32_t version) {
    /* version 3 has version 2's entries */
    return version == 1 ? LP_LPA_V1_ENTRY_BYTES : LP_LPA_ENTRY_BYTES;
}

/* ---- reader -------------------------------------------------------------------- */

static int check_name(const uint8_t *field, char *out, const char *what, const char *label,
                      lp_error *err) {
    const uint8_t *nul = memchr(field, 0, LP_LPA_NAME_BYTES);
    if (!nul) return lp_fail(err, "%s: %s is not NUL-terminated", what, label);
    size_t len = (size_t)(nul - field);
    if (!lp_utf8_valid(field, len)) return lp_fail(err, "%s: %s is not valid UTF-8", what, label);
    for (size_t i = len; i < LP_LPA_NAME_BYTES; i++)
        if (field[i]) return lp_fail(err, "%s: %s has bytes after its terminator", what, label);
    memcpy(out, field, len + 1);
    return 0;
}

static int parse_header(const uint8_t *p, size_t size, const char *what, lp_lpa *out,
                        uint64_t *data_start, lp_error *err) {
    if (size < LP_LPA_HEADER_BYTES)
        return lp_fail(err, "%s: %zu bytes is too short for an .lpa header (%d)", what, size,
                       LP_LPA_HEADER_BYTES);
    if (memcmp(p, LP_LPA_MAGIC, 4) != 0) return lp_fail(err, "%s: not an .lpa file (bad magic)", what);
    uint32_t version = lp_le_get_u32(p + 4);
    if (version < 1 || version > LP_LPA_VERSION_PROFILE)
        return lp_fail(err, "%s: .lpa version %u is not supported (this build reads 1 to %d)", what,
                       version, LP_LPA_VERSION_PROFILE);
    out->version = version;
    uint64_t file_bytes = lp_le_get_u64(p + 8);
    if (file_bytes != size)
        return lp_fail(err, "%s: header says %llu bytes but the file has %zu (truncated?)", what,
                       (unsigned long long)file_bytes, size);
    if (size % LP_LPA_ALIGN != 0)
        return lp_fail(err, "%s: file size %zu is not a multiple of %d", what, size, LP_LPA_ALIGN);
    lp_lpa_base *b = &out->base;
    b->fingerprint = lp_le_get_u64(p + 32);
    b->arch = lp_le_get_u32(p + 40);
    b->flags = lp_le_get_u32(p + 44);
    uint32_t *dims[7] = {&b->n_layers, &b->dim, &b->n_heads, &b->n_kv_heads,
                         &b->head_dim, &b->ffn_dim, &b->n_vocab};
    static const char *const dim_names[7] = {"n_layers", "dim", "n_heads", "n_kv_heads",
                                             "head_dim", "ffn_dim", "n_vocab"};
    for (int i = 0; i < 7; i++) {
        *dims[i] = lp_le_get_u32(p + 48 + 4 * i);
        uint32_t max = i == 0 ? 4096 : (1u << 24);
        if (*dims[i] == 0 || *dims[i] > max)
            return lp_fail(err, "%s: base %s = %u is out of range 1..%u", what, dim_names[i],
                           *dims[i], max);
    }
    if (b->arch > 2) return lp_fail(err, "%s: unknown base architecture id %u", what, b->arch);
    if (b->flags & ~LP_LPA_FLAG_INTERLEAVED)
        return lp_fail(err, "%s: unknown flags 0x%x", what, b->flags);
    out->n_entries = lp_le_get_u32(p + 76);
    if (version == 1 && out->n_entries > b->n_layers * V1_N_PROJ)
        return lp_fail(err, "%s: %u entries for %u layers x %d projections", what,
                       out->n_entries, b->n_layers, V1_N_PROJ);
    if (out->n_entries > LP_LPA_MAX_ENTRIES)
        return lp_fail(err, "%s: %u entries (at most %u)", what, out->n_entries, LP_LPA_MAX_ENTRIES);
    *data_start = lp_le_get_u64(p + 80);
    uint64_t expect_start = align64(LP_LPA_HEADER_BYTES + (uint64_t)entry_bytes(version) * out->n_entries);
    if (*data_start != expect_start || *data_start > size)
        return lp_fail(err, "%s: data_start %llu is wrong (expected %llu within %zu bytes)", what,
                       (unsigned long long)*data_start, (unsigned long long)expect_start, size);
    out->profile_id = lp_le_get_u64(p + 88);
    if ((version == LP_LPA_VERSION_PROFILE) != (out->profile_id != 0))
        return lp_fail(err, "%s: %s", what, version == LP_LPA_VERSION_PROFILE
                                                ? "version 3 file without a profile id"
                                                : "reserved header bytes 88..95 are not zero");
    for (int i = 96; i < 128; i++)
        if (p[i]) return lp_fail(err, "%s: reserved header byte %d is not zero", what, i);
    if (check_name(p + 128, out->name, what, "name", err) ||
        check_name(p + 384, out->base_name, what, "base_name", err))
        return -1;

    uint8_t zero[8] = {0};
    uint64_t h = lp_lpa_hash(LP_LPA_HASH_SEED, p, 16);
    h = lp_lpa_hash(h, zero, 8);
    h = lp_lpa_hash(h, p + 24, (size_t)*data_start - 24);
    if (h != lp_le_get_u64(p + 16)) return lp_fail(err, "%s: header checksum mismatch (corrupted file)", what);
    uint64_t dh = lp_lpa_hash(LP_LPA_HASH_SEED, p + *data_start, size - (size_t)*data_start);
    if (dh != lp_le_get_u64(p + 24)) return lp_fail(err, "%s: data checksum mismatch (corrupted file)", what);
    return 0;
}

static const char *arch_name(uint32_t arch) {
    static const char *const names[3] = {"llama", "qwen2", "qwen3"};
    return arch < 3 ? names[arch] : "?";
}

static int check_base(const lp_lpa_base *have, const lp_lpa_base *want, const char *what,
                      lp_error *err) {
    if (have->arch != want->arch || have->n_layers != want->n_layers || have->dim != want->dim ||
        have->n_heads != want->n_heads || have->n_kv_heads != want->n_kv_heads ||
        have->head_dim != want->head_dim || have->ffn_dim != want->ffn_dim ||
        have->n_vocab != want->n_vocab)
        return lp_fail(err, "%s: compiled for a base of another shape (%s, %u layers, dim %u, "
                       "ffn %u, vocab %u; this base: %s, %u layers, dim %u, ffn %u, vocab %u)",
                       what, arch_name(have->arch), have->n_layers, have->dim, have->ffn_dim, have->n_vocab,
                       arch_name(want->arch), want->n_layers, want->dim, want->ffn_dim, want->n_vocab);
    if (have->flags != want->flags)
        return lp_fail(err, "%s: compiled for a base with another q/k row order", what);
    if (have->fingerprint != want->fingerprint)
        return lp_fail(err, "%s: compiled for another base (fingerprint %016llx, this base "
                       "%016llx): recompile it with `loraplex adapter compile`", what,
                       (unsigned long long)have->fingerprint, (unsigned long long)want->fingerprint);
    return 0;
}

static bool all_zero(const uint8_t *p, uint64_t from, uint64_t to) {
    for (uint64_t i = from; i < to; i++)
        if (p[i]) return false;
    return true;
}

/* Tensor name, rank, dtype, scale, shape and offsets of entry i; the
 * reserved fields must be zero. */
static int read_entry(const uint8_t *q, const lp_lpa *lpa, uint32_t i, const char *what, lp_lpa_entry *e,
                      uint64_t *a_off, uint64_t *b_off, lp_error *err) {
    if (lpa->version == 1) {
        uint32_t layer = lp_le_get_u32(q), proj = lp_le_get_u32(q + 4);
        if (layer >= lpa->base.n_layers || proj >= V1_N_PROJ)
            return lp_fail(err, "%s: entry %u: layer %u / projection %u out of range", what, i, layer, proj);
        snprintf(e->tensor, sizeof e->tensor, "blk.%u.%s.weight", layer, v1_proj_gguf[proj]);
        v1_shape(&lpa->base, proj, &e->in, &e->out);
        e->rank = lp_le_get_u32(q + 8);
        e->dtype = lp_le_get_u32(q + 12);
        e->scale = lp_le_get_f32(q + 16);
        *a_off = lp_le_get_u64(q + 24);
        *b_off = lp_le_get_u64(q + 32);
        if (lp_le_get_u32(q + 20) != 0) return lp_fail(err, "%s: %s: reserved field is not zero", what, e->tensor);
        return 0;
    }
    const uint8_t *nul = memchr(q, 0, LP_LPA_TENSOR_BYTES);
    if (!nul || nul == q) return lp_fail(err, "%s: entry %u: tensor name is empty or not NUL-terminated", what, i);
    size_t len = (size_t)(nul - q);
    if (!lp_utf8_valid(q, len) || !all_zero(q, len, LP_LPA_TENSOR_BYTES))
        return lp_fail(err, "%s: entry %u: tensor name is not valid UTF-8 or not NUL-padded", what, i);
    memcpy(e->tensor, q, len + 1);
    e->rank = lp_le_get_u32(q + 96);
    e->dtype = lp_le_get_u32(q + 100);
    e->scale = lp_le_get_f32(q + 104);
    e->in = lp_le_get_u64(q + 112);
    e->out = lp_le_get_u64(q + 120);
    *a_off = lp_le_get_u64(q + 128);
    *b_off = lp_le_get_u64(q + 136);
    if (lp_le_get_u32(q + 108) != 0 || !all_zero(q, 144, LP_LPA_ENTRY_BYTES))
        return lp_fail(err, "%s: %s: reserved field is not zero", what, e->tensor);
    if (e->in == 0 || e->out == 0 || e->in > (1u << 24) || e->out > (1u << 24))
        return lp_fail(err, "%s: %s: shape %llu x %llu out of range (1..2^24)", what, e->tensor,
                       (unsigned long long)e->out, (unsigned long long)e->in);
    return 0;
}

/* Strictly increasing keys: (layer, proj) in version 1, the name in 2. */
static bool in_order(const uint8_t *prev, const uint8_t *q, const lp_lpa_entry *pe, const lp_lpa_entry *e,
                     uint32_t version) {
    if (version == 1) {
        uint64_t kp = (uint64_t)lp_le_get_u32(prev) * V1_N_PROJ + lp_le_get_u32(prev + 4);
        uint64_t kq = (uint64_t)lp_le_get_u32(q) * V1_N_PROJ + lp_le_get_u32(q + 4);
        return kq > kp;
    }
    return strcmp(pe->tensor, e->tensor) < 0;
}

static int parse_entries(const uint8_t *p, size_t size, uint64_t data_start, const char *what,
                         lp_lpa *out, lp_error *err) {
    uint64_t cursor = data_start;
    size_t eb = entry_bytes(out->version);
    for (uint32_t i = 0; i < out->n_entries; i++) {
        const uint8_t *q = p + LP_LPA_HEADER_BYTES + (size_t)i * eb;
        lp_lpa_entry *e = &out->entries[i];
        uint64_t a_off = 0, b_off = 0;
        if (read_entry(q, out, i, what, e, &a_off, &b_off, err)) return -1;
        const char *pn = e->tensor;
        if (i > 0 && !in_order(q - eb, q, &out->entries[i - 1], e, out->version))
            return lp_fail(err, "%s: entry %u (%s) is out of order or repeated", what, i, pn);
        uint64_t max_rank = e->in < e->out ? e->in : e->out;
        if (e->rank == 0 || e->rank > max_rank)
            return lp_fail(err, "%s: %s: rank %u out of range 1..%llu", what, pn, e->rank,
                           (unsigned long long)max_rank);
        if (!valid_dtype(e->dtype))
            return lp_fail(err, "%s: %s: dtype %u is not F32 (0), F16 (1), W4 (64), W8 (65), Q8 (80) "
                           "or Q4 (81)", what, pn, e->dtype);
        if (is_codes(e->dtype) != (out->version == LP_LPA_VERSION_PROFILE))
            return lp_fail(err, "%s: %s: %s", what, pn, is_codes(e->dtype)
                               ? "profile codes (Q8/Q4) in a file without a profile id"
                               : "a file under a profile holds Q8/Q4 codes only");
        if (!isfinite(e->scale)) return lp_fail(err, "%s: %s: scale is not finite", what, pn);
        size_t a_bytes, b_bytes, a_end, b_end;
        if (!block_bytes(e, &a_bytes, &b_bytes))
            return lp_fail(err, "%s: %s: size overflows%s", what, pn,
                           is_packed(e->dtype) && e->in % 32 ? " (W8/W4 need an input width that is a multiple of 32)" : "");
        if (a_off % LP_LPA_ALIGN || b_off % LP_LPA_ALIGN || a_off < cursor ||
            !lp_add_ok(a_off, a_bytes, &a_end) || a_end > size || b_off < a_end ||
            !lp_add_ok(b_off, b_bytes, &b_end) || b_end > size)
            return lp_fail(err, "%s: %s: A/B offsets %llu/%llu are misaligned, overlap "
                           "or lie outside the %zu-byte file", what, pn,
                           (unsigned long long)a_off, (unsigned long long)b_off, size);
        e->a = p + a_off;
        e->b = p + b_off;
        cursor = b_end;
    }
    return 0;
}

int lp_lpa_parse(const void *data, size_t size, const lp_lpa_base *expect, const char *what,
                 lp_lpa *out, lp_error *err) {
    memset(out, 0, sizeof *out);
    const uint8_t *p = data;
    if (size < LP_LPA_HEADER_BYTES)
        return lp_fail(err, "%s: %zu bytes is too short for an .lpa header (%d)", what, size,
                       LP_LPA_HEADER_BYTES);
    if (((uintptr_t)p % LP_LPA_ALIGN) != 0)
        return lp_fail(err, "%s: .lpa data must be %d-byte aligned in memory", what, LP_LPA_ALIGN);
    uint64_t data_start = 0;
    if (parse_header(p, size, what, out, &data_start, err)) return -1;
    if (expect && check_base(&out->base, expect, what, err)) return -1;
    /* the table was covered by the header checksum; the padding must be zero */
    if (!all_zero(p, LP_LPA_HEADER_BYTES + (uint64_t)entry_bytes(out->version) * out->n_entries, data_start))
        return lp_fail(err, "%s: padding before the data is not zero", what);
    out->entries = calloc(out->n_entries ? out->n_entries : 1, sizeof *out->entries);
    if (!out->entries) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    if (parse_entries(p, size, data_start, what, out, err)) {
        lp_lpa_release(out);
        return -1;
    }
    return 0;
}

void lp_lpa_release(lp_lpa *lpa) {
    free(lpa->entries);
    lpa->entries = NULL;
    lpa->n_entries = 0;
}

/* ---- writer -------------------------------------------------------------------- */

static int cmp_entry(const void *x, const void *y) {
    const lp_lpa_entry *a = x, *b = y;
    return strcmp(a->tensor, b->tensor);
}

static void put_name(uint8_t *field, const char *name) {
    size_t len = name ? strlen(name) : 0;
    if (len > LP_LPA_NAME_BYTES - 1) len = LP_LPA_NAME_BYTES - 1;
    /* never cut a UTF-8 sequence in half */
    while (len > 0 && ((uint8_t)name[len] & 0xC0) == 0x80) len--;
    if (len) memcpy(field, name, len);
}

/* Writes [data, data+n) plus zero padding to the next 64 bytes, hashing both. */
static bool write_block(FILE *f, const void *data, size_t n, uint64_t *h) {
    static const uint8_t zeros[LP_LPA_ALIGN] = {0};
    size_t pad = (size_t)(align64(n) - n);
    *h = lp_lpa_hash(*h, data, n - n % 8);
    uint8_t tail[LP_LPA_ALIGN] = {0};
    memcpy(tail, (const uint8_t *)data + (n - n % 8), n % 8);
    *h = lp_lpa_hash(*h, tail, n % 8 + pad);
    return fwrite(data, 1, n, f) == n && fwrite(zeros, 1, pad, f) == pad;
}

int lp_lpa_write(const char *path, const lp_lpa_base *base, const char *name,
                 const char *base_name, const lp_lpa_entry *entries, uint32_t n, lp_error *err) {
    return lp_lpa_write_profiled(path, base, name, base_name, 0, entries, n, err);
}

int lp_lpa_write_profiled(const char *path, const lp_lpa_base *base, const char *name,
                          const char *base_name, uint64_t profile_id, const lp_lpa_entry *entries,
                          uint32_t n, lp_error *err) {
    for (uint32_t i = 0; i < n; i++)
        if (is_codes(entries[i].dtype) != (profile_id != 0))
            return lp_fail(err, "%s: entry '%.*s': profile codes go with a profile id, and only them", path,
                           (int)strnlen(entries[i].tensor, LP_LPA_TENSOR_BYTES), entries[i].tensor);
    if (n > LP_LPA_MAX_ENTRIES) return lp_fail(err, "%s: too many adapter entries (%u)", path, n);
    lp_lpa_entry *es = calloc(n ? n : 1, sizeof *es);
    size_t table_end = LP_LPA_HEADER_BYTES + (size_t)LP_LPA_ENTRY_BYTES * n;
    size_t data_start = (size_t)align64(table_end);
    uint8_t *head = calloc(1, data_start);
    if (!es || !head) {
        free(es);
        free(head);
        return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    }
    if (n) memcpy(es, entries, (size_t)n * sizeof *es);
    qsort(es, n, sizeof *es, cmp_entry);

    uint64_t off = data_start;
    int rc = 0;
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        lp_lpa_entry *e = &es[i];
        size_t a_bytes = 0, b_bytes = 0;
        size_t len = strnlen(e->tensor, LP_LPA_TENSOR_BYTES);
        if (len == 0 || len == LP_LPA_TENSOR_BYTES || (i > 0 && cmp_entry(&es[i - 1], e) == 0) ||
            e->in == 0 || e->out == 0 || e->in > (1u << 24) || e->out > (1u << 24) ||
            !block_bytes(e, &a_bytes, &b_bytes) || !valid_dtype(e->dtype) || !isfinite(e->scale)) {
            rc = lp_fail(err, "%s: invalid adapter entry '%.*s'", path, (int)len, e->tensor);
            break;
        }
        uint8_t *q = head + LP_LPA_HEADER_BYTES + (size_t)i * LP_LPA_ENTRY_BYTES;
        memcpy(q, e->tensor, len);
        lp_le_put_u32(q + 96, e->rank);
        lp_le_put_u32(q + 100, e->dtype);
        lp_le_put_f32(q + 104, e->scale);
        lp_le_put_u64(q + 112, e->in);
        lp_le_put_u64(q + 120, e->out);
        lp_le_put_u64(q + 128, off);
        off += align64(a_bytes);
        lp_le_put_u64(q + 136, off);
        off += align64(b_bytes);
    }
    if (rc) {
        free(es);
        free(head);
        return rc;
    }
    memcpy(head, LP_LPA_MAGIC, 4);
    lp_le_put_u32(head + 4, profile_id ? LP_LPA_VERSION_PROFILE : LP_LPA_VERSION);
    lp_le_put_u64(head + 88, profile_id);
    lp_le_put_u64(head + 8, off);
    lp_le_put_u64(head + 32, base->fingerprint);
    lp_le_put_u32(head + 40, base->arch);
    lp_le_put_u32(head + 44, base->flags);
    const uint32_t dims[7] = {base->n_layers, base->dim, base->n_heads, base->n_kv_heads,
                              base->head_dim, base->ffn_dim, base->n_vocab};
    for (int i = 0; i < 7; i++) lp_le_put_u32(head + 48 + 4 * i, dims[i]);
    lp_le_put_u32(head + 76, n);
    lp_le_put_u64(head + 80, data_start);
    put_name(head + 128, name);
    put_name(head + 384, base_name);

    FILE *f = fopen(path, "wb");
    if (!f) {
        free(es);
        free(head);
        return lp_error_set(err, LP_ERR_IO, "%s: cannot create file", path);
    }
    /* data first (after a placeholder header) so its checksum is known */
    bool ok = fwrite(head, 1, data_start, f) == data_start;
    uint64_t dh = LP_LPA_HASH_SEED;
    for (uint32_t i = 0; i < n && ok; i++) {
        size_t a_bytes = 0, b_bytes = 0;
        block_bytes(&es[i], &a_bytes, &b_bytes);
        ok = write_block(f, es[i].a, a_bytes, &dh) && write_block(f, es[i].b, b_bytes, &dh);
    }
    lp_le_put_u64(head + 24, dh);
    lp_le_put_u64(head + 16, lp_lpa_hash(LP_LPA_HASH_SEED, head, data_start));
    ok = ok && fseek(f, 0, SEEK_SET) == 0 && fwrite(head, 1, data_start, f) == data_start;
    ok = (fclose(f) == 0) && ok;
    free(es);
    free(head);
    if (!ok) {
        remove(path);
        return lp_fail(err, "%s: write failed", path);
    }
    return 0;
}
