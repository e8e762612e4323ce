/* .lpx reader and writer (layout in lpx.h). The reader trusts nothing: every
 * count, offset and size is checked against the image (with overflow checks)
 * before it is used, and every tensor must be exactly as large as its type
 * and shape say. */
#include "lpx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "le.h"

#include "../base/dtype.h"
#include "../kernels/kernels.h"

static bool all_zero(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return false;
    return true;
}

static uint64_t align_up(uint64_t v) { return (v + LP_LPX_ALIGN - 1) & ~(uint64_t)(LP_LPX_ALIGN - 1); }

/* ---- kinds ---------------------------------------------------------------------- */

const char *lp_lpx_kind_name(uint32_t kind) {
    switch (kind) {
    case LP_LPX_T_TOK_EMBD: return "token_embd";
    case LP_LPX_T_OUTPUT: return "output";
    case LP_LPX_T_OUTPUT_NORM: return "output_norm";
    case LP_LPX_T_ROPE_FREQS: return "rope_freqs";
    case LP_LPX_T_ATTN_NORM: return "attn_norm";
    case LP_LPX_T_FFN_NORM: return "ffn_norm";
    case LP_LPX_T_WQ: return "attn_q";
    case LP_LPX_T_WK: return "attn_k";
    case LP_LPX_T_WV: return "attn_v";
    case LP_LPX_T_WQKV: return "attn_qkv";
    case LP_LPX_T_WO: return "attn_output";
    case LP_LPX_T_W_GATE: return "ffn_gate";
    case LP_LPX_T_W_UP: return "ffn_up";
    case LP_LPX_T_W_GATE_UP: return "ffn_gate_up";
    case LP_LPX_T_W_DOWN: return "ffn_down";
    case LP_LPX_T_BQ: return "attn_q.bias";
    case LP_LPX_T_BK: return "attn_k.bias";
    case LP_LPX_T_BV: return "attn_v.bias";
    case LP_LPX_T_Q_NORM: return "attn_q_norm";
    case LP_LPX_T_K_NORM: return "attn_k_norm";
    default: return NULL;
    }
}

bool lp_lpx_kind_is_global(uint32_t kind) { return kind <= LP_LPX_T_ROPE_FREQS; }

size_t lp_lpx_tensor_bytes(uint32_t type, uint64_t rows, uint64_t cols, uint32_t group) {
    if (rows == 0 || cols == 0 || rows > ((uint64_t)1 << 40) || cols > ((uint64_t)1 << 40))
        return 0;
    if (lp_dtype_is_packed(type)) {
        if (group == 0 || group > (1u << 30)) return 0; /* the file always says its group */
        return lp_pack_bytes(type, (int64_t)rows, (int64_t)cols, (int)group);
    }
    if (group != 0) return 0;
    const lp_dtype_info *info = lp_dtype_get(type);
    if (!info || !info->supported || type >= LP_DTYPE_COUNT) return 0;
    size_t row = lp_dtype_row_bytes(type, cols), total;
    if (row == 0 || !lp_mul_ok(row, (size_t)rows, &total)) return 0;
    return total;
}

static void tensor_label(const lp_lpx_tensor *t, char *buf, size_t cap) {
    const char *k = lp_lpx_kind_name(t->kind);
    if (!k) snprintf(buf, cap, "tensor of kind %u", t->kind);
    else if (t->layer == LP_LPX_NO_LAYER) snprintf(buf, cap, "%s", k);
    else snprintf(buf, cap, "blk.%u.%s", t->layer, k);
}

/* ---- reader ------------------------------------------------------------------------ */

static int parse_header(const uint8_t *p, size_t size, const char *what, lp_lpx_header *h,
                        uint32_t *n_tensors, uint64_t *data_offset, lp_error *err) {
    if (size < LP_LPX_HEADER_BYTES)
        return lp_fail(err, "%s: %zu bytes is too small for a .lpx file (header is %d)", what, size,
                       LP_LPX_HEADER_BYTES);
    if (memcmp(p, LP_LPX_MAGIC, 4) != 0) return lp_fail(err, "%s: not a .lpx file (bad magic)", what);
    uint32_t version = lp_le_get_u32(p + 4);
    if (version != LP_LPX_VERSION)
        return lp_fail(err, "%s: .lpx version %u is not supported (this build reads %d)", what,
                       version, LP_LPX_VERSION);
    uint64_t file_bytes = lp_le_get_u64(p + 8);
    if (file_bytes != size)
        return lp_fail(err, "%s: header says %llu bytes but the file has %zu (truncated?)", what,
                       (unsigned long long)file_bytes, size);
    h->arch = lp_le_get_u32(p + 16);
    h->flags = lp_le_get_u32(p + 20);
    uint32_t *dims[8] = {&h->n_vocab, &h->dim, &h->n_layers, &h->n_heads, &h->n_kv_heads,
                         &h->head_dim, &h->ffn_dim, &h->n_ctx_train};
    for (int i = 0; i < 8; i++) *dims[i] = lp_le_get_u32(p + 24 + 4 * i);
    h->rope_theta = lp_le_get_f32(p + 56);
    h->rms_eps = lp_le_get_f32(p + 60);
    h->acts = lp_le_get_u32(p + 64);
    h->weight_type = lp_le_get_u32(p + 68);
    h->group = lp_le_get_u32(p + 72);
    h->tokenizer_kind = lp_le_get_u32(p + 76);
    if (h->arch > 2) return lp_fail(err, "%s: unknown architecture id %u", what, h->arch);
    if (h->flags & ~LP_LPX_FLAGS_KNOWN)
        return lp_fail(err, "%s: unknown flags 0x%x", what, h->flags & ~LP_LPX_FLAGS_KNOWN);
    if (h->acts > LP_LPX_ACTS_F32) return lp_fail(err, "%s: unknown activation mode %u", what, h->acts);
    if (h->tokenizer_kind < LP_LPX_TOK_GGUF || h->tokenizer_kind > LP_LPX_TOK_LLAMA2C)
        return lp_fail(err, "%s: unknown tokenizer kind %u", what, h->tokenizer_kind);
    *n_tensors = lp_le_get_u32(p + 112);
    if (lp_le_get_u32(p + 116) != 0 || !all_zero(p + 136, 120))
        return lp_fail(err, "%s: reserved header bytes are not zero", what);
    if (lp_le_get_u64(p + 120) != LP_LPX_HEADER_BYTES)
        return lp_fail(err, "%s: tensor table offset %llu (expected %d)", what,
                       (unsigned long long)lp_le_get_u64(p + 120), LP_LPX_HEADER_BYTES);
    *data_offset = lp_le_get_u64(p + 128);
    const char *name = (const char *)p + 256;
    size_t name_len = strnlen(name, LP_LPX_NAME_BYTES);
    if (name_len == LP_LPX_NAME_BYTES || !lp_utf8_valid((const uint8_t *)name, name_len) ||
        !all_zero((const uint8_t *)name + name_len, LP_LPX_NAME_BYTES - name_len))
        return lp_fail(err, "%s: the model name is not NUL-terminated, NUL-padded UTF-8", what);
    memcpy(h->name, name, LP_LPX_NAME_BYTES);
    return 0;
}

/* A blob [offset, offset+bytes) must lie between the table end and data_offset. */
static int check_blob(uint64_t offset, uint64_t bytes, uint64_t lo, uint64_t hi, const char *label,
                      const char *what, lp_error *err) {
    uint64_t end;
    if (__builtin_add_overflow(offset, bytes, &end) || offset < lo || end > hi)
        return lp_fail(err, "%s: %s [%llu, +%llu) lies outside [%llu, %llu)", what, label,
                       (unsigned long long)offset, (unsigned long long)bytes,
                       (unsigned long long)lo, (unsigned long long)hi);
    return 0;
}

static int parse_entry(const uint8_t *e, const uint8_t *base, size_t size, uint64_t data_offset,
                       uint32_t index, const char *what, lp_lpx_tensor *t, lp_error *err) {
    t->kind = lp_le_get_u32(e);
    t->layer = lp_le_get_u32(e + 4);
    t->type = lp_le_get_u32(e + 8);
    t->group = lp_le_get_u32(e + 12);
    t->rows = lp_le_get_u64(e + 16);
    t->cols = lp_le_get_u64(e + 24);
    uint64_t offset = lp_le_get_u64(e + 32);
    t->bytes = lp_le_get_u64(e + 40);
    char label[64];
    tensor_label(t, label, sizeof label);
    if (!lp_lpx_kind_name(t->kind))
        return lp_fail(err, "%s: tensor %u has unknown kind %u", what, index, t->kind);
    if (lp_lpx_kind_is_global(t->kind) != (t->layer == LP_LPX_NO_LAYER))
        return lp_fail(err, "%s: tensor %u (%s) has layer %u", what, index, label, t->layer);
    if (!all_zero(e + 48, 16))
        return lp_fail(err, "%s: tensor %s: reserved bytes are not zero", what, label);
    size_t need = lp_lpx_tensor_bytes(t->type, t->rows, t->cols, t->group);
    if (need == 0)
        return lp_fail(err, "%s: tensor %s: type %s (%u), group %u, shape %llu x %llu is not valid",
                       what, label, lp_dtype_name(t->type), t->type, t->group,
                       (unsigned long long)t->rows, (unsigned long long)t->cols);
    if (t->bytes != need)
        return lp_fail(err, "%s: tensor %s has %llu bytes; type %s %llu x %llu needs %zu", what,
                       label, (unsigned long long)t->bytes, lp_dtype_name(t->type),
                       (unsigned long long)t->rows, (unsigned long long)t->cols, need);
    if (offset % LP_LPX_ALIGN != 0)
        return lp_fail(err, "%s: tensor %s: offset %llu is not %d-byte aligned", what, label,
                       (unsigned long long)offset, LP_LPX_ALIGN);
    if (check_blob(offset, t->bytes, data_offset, size, label, what, err)) return -1;
    t->data = base + offset;
    return 0;
}

static int cmp_tensor_pos(const void *a, const void *b) {
    const lp_lpx_tensor *x = *(const lp_lpx_tensor *const *)a, *y = *(const lp_lpx_tensor *const *)b;
    return x->data < y->data ? -1 : x->data > y->data;
}

/* Entries ordered by (layer, kind) with globals (layer 0xFFFFFFFF) last. */
static uint64_t order_key(const lp_lpx_tensor *t) { return (uint64_t)t->layer << 32 | t->kind; }

static int check_overlaps(lp_lpx *x, const char *what, lp_error *err) {
    const lp_lpx_tensor **by_pos = malloc((size_t)x->n_tensors * sizeof *by_pos + 1);
    if (!by_pos) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    for (uint32_t i = 0; i < x->n_tensors; i++) by_pos[i] = &x->tensors[i];
    qsort(by_pos, x->n_tensors, sizeof *by_pos, cmp_tensor_pos);
    int rc = 0;
    /* the file ends right after the last tensor's padding: nothing hides there */
    const lp_lpx_tensor *last = by_pos[x->n_tensors - 1];
    uint64_t end = align_up((uint64_t)((const uint8_t *)last->data - (const uint8_t *)x->base) + last->bytes);
    if (end != x->size)
        rc = lp_fail(err, "%s: the file has %zu bytes but its last tensor ends at %llu", what,
                     x->size, (unsigned long long)end);
    for (uint32_t i = 1; i < x->n_tensors && rc == 0; i++) {
        const lp_lpx_tensor *a = by_pos[i - 1], *b = by_pos[i];
        if ((const uint8_t *)a->data + a->bytes > (const uint8_t *)b->data) {
            char la[64], lb[64];
            tensor_label(a, la, sizeof la);
            tensor_label(b, lb, sizeof lb);
            rc = lp_fail(err, "%s: tensors %s and %s overlap", what, la, lb);
        }
    }
    free(by_pos);
    return rc;
}

int lp_lpx_parse(const void *data, size_t size, const char *what, lp_lpx *out, lp_error *err) {
    memset(out, 0, sizeof *out);
    const uint8_t *p = data;
    if ((uintptr_t)p % LP_LPX_ALIGN != 0)
        return lp_fail(err, "%s: image is not %d-byte aligned in memory", what, LP_LPX_ALIGN);
    uint32_t n = 0;
    uint64_t data_offset = 0;
    if (parse_header(p, size, what, &out->h, &n, &data_offset, err)) return -1;
    if (n == 0 || n > LP_LPX_MAX_TENSORS)
        return lp_fail(err, "%s: %u tensors (1 to %u allowed)", what, n, LP_LPX_MAX_TENSORS);
    uint64_t table_end = LP_LPX_HEADER_BYTES + (uint64_t)n * LP_LPX_ENTRY_BYTES;
    if (data_offset % LP_LPX_ALIGN != 0 || data_offset < table_end || data_offset > size)
        return lp_fail(err, "%s: data offset %llu is invalid (table ends at %llu, file has %zu "
                       "bytes, must be %d-aligned)", what, (unsigned long long)data_offset,
                       (unsigned long long)table_end, size, LP_LPX_ALIGN);
    /* tokenizer blobs between the table and the data */
    uint64_t tok_off = lp_le_get_u64(p + 80), tok_n = lp_le_get_u64(p + 88);
    uint64_t tok2_off = lp_le_get_u64(p + 96), tok2_n = lp_le_get_u64(p + 104);
    if (tok_n == 0) return lp_fail(err, "%s: the file has no tokenizer", what);
    if (check_blob(tok_off, tok_n, table_end, data_offset, "tokenizer", what, err)) return -1;
    if (tok2_n == 0 && tok2_off != 0)
        return lp_fail(err, "%s: empty second tokenizer blob with offset %llu", what,
                       (unsigned long long)tok2_off);
    if (tok2_n && check_blob(tok2_off, tok2_n, table_end, data_offset, "tokenizer config", what, err))
        return -1;
    if (tok2_n && out->h.tokenizer_kind != LP_LPX_TOK_HF)
        return lp_fail(err, "%s: only Hugging Face tokenizers have a second blob", what);
    out->base = p;
    out->size = size;
    out->tok = p + tok_off;
    out->tok_bytes = (size_t)tok_n;
    out->tok2 = tok2_n ? p + tok2_off : NULL;
    out->tok2_bytes = (size_t)tok2_n;

    out->tensors = calloc(n, sizeof *out->tensors);
    if (!out->tensors) return lp_error_set(err, LP_ERR_NOMEM, "out of memory for %u tensors", n);
    out->n_tensors = n;
    for (uint32_t i = 0; i < n; i++) {
        lp_lpx_tensor *t = &out->tensors[i];
        if (parse_entry(p + LP_LPX_HEADER_BYTES + (size_t)i * LP_LPX_ENTRY_BYTES, p, size,
                        data_offset, i, what, t, err))
            goto fail;
        if (i > 0 && order_key(t) <= order_key(&out->tensors[i - 1])) {
            char label[64];
            tensor_label(t, label, sizeof label);
            lp_fail(err, "%s: tensor table is not strictly ordered at %s (entry %u)", what, label, i);
            goto fail;
        }
    }
    if (check_overlaps(out, what, err)) goto fail;
    return 0;
fail:
    lp_lpx_release(out);
    return -1;
}

void lp_lpx_release(lp_lpx *x) {
    free(x->tensors);
    x->tensors = NULL;
    x->n_tensors = 0;
}

/* ---- writer ---------------------------------------------------------------------------- */

static int cmp_order(const void *a, const void *b) {
    uint64_t x = order_key(*(const lp_lpx_tensor *const *)a), y = order_key(*(const lp_lpx_tensor *const *)b);
    return x < y ? -1 : x > y;
}

static int write_all(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n ? 0 : -1; }

static int write_zeros(FILE *f, uint64_t n) {
    static const uint8_t zeros[LP_LPX_ALIGN];
    while (n > 0) {
        size_t take = n < sizeof zeros ? (size_t)n : sizeof zeros;
        if (write_all(f, zeros, take)) return -1;
        n -= take;
    }
    return 0;
}

static void fill_header(uint8_t *hd, const lp_lpx_header *h, uint64_t file_bytes, uint32_t n,
                        uint64_t tok_off, uint64_t tok_n, uint64_t tok2_off, uint64_t tok2_n,
                        uint64_t data_offset) {
    memset(hd, 0, LP_LPX_HEADER_BYTES);
    memcpy(hd, LP_LPX_MAGIC, 4);
    lp_le_put_u32(hd + 4, LP_LPX_VERSION);
    lp_le_put_u64(hd + 8, file_bytes);
    lp_le_put_u32(hd + 16, h->arch);
    lp_le_put_u32(hd + 20, h->flags);
    const uint32_t dims[8] = {h->n_vocab, h->dim, h->n_layers, h->n_heads, h->n_kv_heads,
                              h->head_dim, h->ffn_dim, h->n_ctx_train};
    for (int i = 0; i < 8; i++) lp_le_put_u32(hd + 24 + 4 * i, dims[i]);
    lp_le_put_f32(hd + 56, h->rope_theta);
    lp_le_put_f32(hd + 60, h->rms_eps);
    lp_le_put_u32(hd + 64, h->acts);
    lp_le_put_u32(hd + 68, h->weight_type);
    lp_le_put_u32(hd + 72, h->group);
    lp_le_put_u32(hd + 76, h->tokenizer_kind);
    lp_le_put_u64(hd + 80, tok_off);
    lp_le_put_u64(hd + 88, tok_n);
    lp_le_put_u64(hd + 96, tok2_off);
    lp_le_put_u64(hd + 104, tok2_n);
    lp_le_put_u32(hd + 112, n);
    lp_le_put_u64(hd + 120, LP_LPX_HEADER_BYTES);
    lp_le_put_u64(hd + 128, data_offset);
    /* name: whole UTF-8 characters, NUL-padded */
    size_t len = strnlen(h->name, LP_LPX_NAME_BYTES - 1);
    while (len > 0 && ((uint8_t)h->name[len] & 0xC0) == 0x80) len--;
    memcpy(hd + 256, h->name, len);
}

int lp_lpx_write(const char *path, const lp_lpx_header *h, const void *tok, size_t tok_bytes,
                 const void *tok2, size_t tok2_bytes, const lp_lpx_tensor *tensors, uint32_t n,
                 lp_lpx_fill_fn fill, void *user, lp_error *err) {
    if (n == 0 || n > LP_LPX_MAX_TENSORS) return lp_fail(err, "%s: %u tensors", path, n);
    if (tok_bytes == 0) return lp_fail(err, "%s: a tokenizer is required", path);
    const lp_lpx_tensor **order = malloc((size_t)n * sizeof *order);
    uint8_t *table = calloc(n, LP_LPX_ENTRY_BYTES);
    uint64_t *offsets = calloc(n, sizeof *offsets);
    int rc = order && table && offsets ? 0 : lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    FILE *f = NULL;
    if (rc) goto done;
    for (uint32_t i = 0; i < n; i++) order[i] = &tensors[i];
    qsort(order, n, sizeof *order, cmp_order);
    for (uint32_t i = 1; i < n; i++)
        if (order_key(order[i]) == order_key(order[i - 1])) {
            rc = lp_fail(err, "%s: tensor %s (layer %u) given twice", path,
                         lp_lpx_kind_name(order[i]->kind), order[i]->layer);
            goto done;
        }
    /* layout: header, table, tokenizer blobs, then aligned tensors */
    uint64_t tok_off = LP_LPX_HEADER_BYTES + (uint64_t)n * LP_LPX_ENTRY_BYTES;
    uint64_t tok2_off = tok2_bytes ? tok_off + tok_bytes : 0;
    uint64_t pos = align_up(tok_off + tok_bytes + tok2_bytes), data_offset = pos;
    for (uint32_t i = 0; i < n; i++) {
        const lp_lpx_tensor *t = order[i];
        size_t need = lp_lpx_tensor_bytes(t->type, t->rows, t->cols, t->group);
        if (need == 0 || need != t->bytes) {
            rc = lp_fail(err, "%s: tensor %s (layer %u) has an invalid type/shape/size", path,
                         lp_lpx_kind_name(t->kind), t->layer);
            goto done;
        }
        offsets[i] = pos;
        pos = align_up(pos + t->bytes);
        uint8_t *e = table + (size_t)i * LP_LPX_ENTRY_BYTES;
        lp_le_put_u32(e, t->kind);
        lp_le_put_u32(e + 4, t->layer);
        lp_le_put_u32(e + 8, t->type);
        lp_le_put_u32(e + 12, t->group);
        lp_le_put_u64(e + 16, t->rows);
        lp_le_put_u64(e + 24, t->cols);
        lp_le_put_u64(e + 32, offsets[i]);
        lp_le_put_u64(e + 40, t->bytes);
    }
    uint8_t hd[LP_LPX_HEADER_BYTES];
    fill_header(hd, h, pos, n, tok_off, tok_bytes, tok2_off, tok2_bytes, data_offset);
    f = fopen(path, "wb");
    if (!f) {
        rc = lp_error_set(err, LP_ERR_IO, "%s: cannot create the file", path);
        goto done;
    }
    uint64_t at = data_offset;
    rc = write_all(f, hd, sizeof hd) || write_all(f, table, (size_t)n * LP_LPX_ENTRY_BYTES) ||
         write_all(f, tok, tok_bytes) || (tok2_bytes && write_all(f, tok2, tok2_bytes)) ||
         write_zeros(f, data_offset - (tok_off + tok_bytes + tok2_bytes));
    bool fill_failed = false;
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        const void *bytes = order[i]->data;
        if (!bytes && fill) bytes = fill(user, (uint32_t)(order[i] - tensors), err);
        if (!bytes) {
            if (!fill) lp_fail(err, "%s: tensor %s has no data", path, lp_lpx_kind_name(order[i]->kind));
            fill_failed = true;
            rc = -1;
            break;
        }
        rc = write_zeros(f, offsets[i] - at) || write_all(f, bytes, order[i]->bytes);
        at = offsets[i] + order[i]->bytes;
    }
    if (rc == 0) rc = write_zeros(f, pos - at);
    if (fclose(f) != 0) rc = -1;
    f = NULL;
    if (rc && !fill_failed) rc = lp_fail(err, "%s: write failed (disk full?)", path);
    if (rc) remove(path);
done:
    free(order);
    free(table);
    free(offsets);
    return rc;
}
