/* .lpq reader and writer (layout in lpq.h). The reader checks every count
 * and size against the file before reading, and the id (the whole file's
 * hash) must match. */
#include "lpq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "le.h"
#include "lpa.h"

lp_qenc lp_qenc_from_range(float lo, float hi, int qmax) {
    if (!(lo <= 0.0f)) lo = 0.0f; /* NaN too */
    if (!(hi >= 0.0f)) hi = 0.0f;
    float span = hi - lo;
    if (!(span > 1e-20f) || !isfinite(span)) return (lp_qenc){.scale = 1e-8f, .zero = 0};
    float scale = span / (float)qmax;
    float z = rintf(-lo / scale);
    int32_t zero = z < 0 ? 0 : z > (float)qmax ? qmax : (int32_t)z;
    return (lp_qenc){.scale = scale, .zero = zero};
}

/* ---- reader -------------------------------------------------------------------- */

static bool all_zero(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return false;
    return true;
}

static uint64_t file_id(const uint8_t *p, size_t size) {
    uint8_t zero[8] = {0};
    uint64_t h = lp_lpa_hash(LP_LPA_HASH_SEED ^ 0x4c5051ull, p, 16);
    h = lp_lpa_hash(h, zero, 8);
    h = lp_lpa_hash(h, p + 24, size - 24);
    return h ? h : 1;
}

static int check_enc(lp_qenc e, int qmax, const char *what, const char *tensor, const char *label,
                     lp_error *err) {
    if (!isfinite(e.scale) || !(e.scale >= 1e-30f) || !(e.scale <= 1e30f))
        return lp_fail(err, "%s: %s: %s scale %g is not a finite value in [1e-30, 1e30]", what, tensor,
                       label, (double)e.scale);
    if (e.zero < 0 || e.zero > qmax)
        return lp_fail(err, "%s: %s: %s zero-point %d is outside 0..%d", what, tensor, label,
                       (int)e.zero, qmax);
    return 0;
}

static int parse_header(const uint8_t *p, size_t size, const char *what, lp_lpq *q, lp_error *err) {
    if (size < LP_LPQ_HEADER_BYTES)
        return lp_fail(err, "%s: %zu bytes is too short for an .lpq header (%d)", what, size,
                       LP_LPQ_HEADER_BYTES);
    if (memcmp(p, LP_LPQ_MAGIC, 4)) return lp_fail(err, "%s: not an .lpq profile (bad magic)", what);
    uint32_t version = lp_le_get_u32(p + 4);
    if (version != LP_LPQ_VERSION)
        return lp_fail(err, "%s: .lpq version %u is not supported (this build reads %d)", what, version,
                       LP_LPQ_VERSION);
    if (lp_le_get_u64(p + 8) != size)
        return lp_fail(err, "%s: header says %llu bytes but the file has %zu (truncated?)", what,
                       (unsigned long long)lp_le_get_u64(p + 8), size);
    q->id = lp_le_get_u64(p + 16);
    if (q->id != file_id(p, size))
        return lp_fail(err, "%s: profile id / checksum mismatch (corrupted file)", what);
    q->base_fingerprint = lp_le_get_u64(p + 24);
    q->weight_bits = lp_le_get_u32(p + 32);
    q->act_bits = lp_le_get_u32(p + 36);
    q->granularity = lp_le_get_u32(p + 40);
    q->strategy = lp_le_get_u32(p + 44);
    q->n_entries = lp_le_get_u32(p + 48);
    if (q->weight_bits != 8 && q->weight_bits != 4)
        return lp_fail(err, "%s: weight bits %u (8 or 4)", what, q->weight_bits);
    if (q->act_bits != 8) return lp_fail(err, "%s: activation bits %u (8)", what, q->act_bits);
    if (q->granularity > LP_LPQ_PER_CHANNEL)
        return lp_fail(err, "%s: granularity %u (0 per tensor, 1 per channel)", what, q->granularity);
    if (q->strategy > LP_LPQ_FALLBACK) return lp_fail(err, "%s: strategy %u (0 anchor, 1 fallback)", what, q->strategy);
    if (q->n_entries == 0 || q->n_entries > LP_LPQ_MAX_ENTRIES)
        return lp_fail(err, "%s: %u entries (1..%u)", what, q->n_entries, LP_LPQ_MAX_ENTRIES);
    if (!all_zero(p + 52, 12) || !all_zero(p + 128, 128))
        return lp_fail(err, "%s: reserved header bytes are not zero", what);
    const uint8_t *nul = memchr(p + 64, 0, LP_LPQ_ANCHOR_BYTES);
    if (!nul) return lp_fail(err, "%s: anchor name is not NUL-terminated", what);
    size_t len = (size_t)(nul - (p + 64));
    if (!lp_utf8_valid(p + 64, len) || !all_zero(nul, LP_LPQ_ANCHOR_BYTES - len))
        return lp_fail(err, "%s: anchor name is not valid NUL-padded UTF-8", what);
    memcpy(q->anchor, p + 64, len + 1);
    size_t table;
    if (!lp_mul_ok(q->n_entries, LP_LPQ_ENTRY_BYTES, &table) || table > size - LP_LPQ_HEADER_BYTES)
        return lp_fail(err, "%s: %u entries do not fit in %zu bytes", what, q->n_entries, size);
    return 0;
}

static int read_entry(const uint8_t *e, const lp_lpq *q, uint32_t i, const char *what, lp_lpq_entry *out,
                      lp_error *err) {
    const uint8_t *nul = memchr(e, 0, LP_LPQ_TENSOR_BYTES);
    if (!nul || nul == e) return lp_fail(err, "%s: entry %u: tensor name is empty or not NUL-terminated", what, i);
    size_t len = (size_t)(nul - e);
    if (!lp_utf8_valid(e, len) || !all_zero(nul, LP_LPQ_TENSOR_BYTES - len))
        return lp_fail(err, "%s: entry %u: tensor name is not valid NUL-padded UTF-8", what, i);
    memcpy(out->tensor, e, len + 1);
    out->rank = lp_le_get_u32(e + 96);
    out->in = lp_le_get_u32(e + 100);
    out->out = lp_le_get_u32(e + 104);
    out->x = (lp_qenc){.scale = lp_le_get_f32(e + 108), .zero = (int32_t)lp_le_get_u32(e + 112)};
    out->t = (lp_qenc){.scale = lp_le_get_f32(e + 116), .zero = (int32_t)lp_le_get_u32(e + 120)};
    if (lp_le_get_u32(e + 124)) return lp_fail(err, "%s: %s: reserved field is not zero", what, out->tensor);
    if (out->in == 0 || out->out == 0 || out->in > (1u << 24) || out->out > (1u << 24))
        return lp_fail(err, "%s: %s: shape %u x %u out of range (1..2^24)", what, out->tensor, out->out, out->in);
    uint32_t max_rank = out->in < out->out ? out->in : out->out;
    if (out->rank == 0 || out->rank > max_rank)
        return lp_fail(err, "%s: %s: rank %u out of range 1..%u", what, out->tensor, out->rank, max_rank);
    int amax = (1 << q->act_bits) - 1;
    if (check_enc(out->x, amax, what, out->tensor, "shrink input", err) ||
        check_enc(out->t, amax, what, out->tensor, "shrink output", err))
        return -1;
    bool chan = q->granularity == LP_LPQ_PER_CHANNEL;
    out->na = chan ? out->rank : 1;
    out->nb = chan ? out->out : 1;
    return 0;
}

/* Reads n encodings (n scales, then n zeros) at *off, advancing it. */
static int read_encs(const uint8_t *p, size_t size, size_t *off, uint32_t n, int qmax, const char *what,
                     const char *tensor, const char *label, lp_qenc **out, lp_error *err) {
    size_t bytes, end;
    if (!lp_mul_ok(n, 8, &bytes) || !lp_add_ok(*off, bytes, &end) || end > size)
        return lp_fail(err, "%s: %s: the %s encodings run past the end of the file", what, tensor, label);
    lp_qenc *e = malloc((size_t)n * sizeof *e);
    if (!e) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    *out = e;
    for (uint32_t i = 0; i < n; i++) {
        e[i].scale = lp_le_get_f32(p + *off + 4 * (size_t)i);
        e[i].zero = (int32_t)lp_le_get_u32(p + *off + 4 * ((size_t)n + i));
        if (check_enc(e[i], qmax, what, tensor, label, err)) return -1;
    }
    *off = end;
    return 0;
}

int lp_lpq_parse(const void *data, size_t size, const char *what, lp_lpq *q, lp_error *err) {
    memset(q, 0, sizeof *q);
    const uint8_t *p = data;
    if (parse_header(p, size, what, q, err)) return -1;
    q->entries = calloc(q->n_entries, sizeof *q->entries);
    if (!q->entries) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    size_t off = LP_LPQ_HEADER_BYTES + (size_t)q->n_entries * LP_LPQ_ENTRY_BYTES;
    int wmax = (1 << q->weight_bits) - 1;
    for (uint32_t i = 0; i < q->n_entries; i++) {
        lp_lpq_entry *e = &q->entries[i];
        if (read_entry(p + LP_LPQ_HEADER_BYTES + (size_t)i * LP_LPQ_ENTRY_BYTES, q, i, what, e, err) ||
            (i > 0 && strcmp(q->entries[i - 1].tensor, e->tensor) >= 0 &&
             lp_fail(err, "%s: entry %u (%s) is out of order or repeated", what, i, e->tensor)) ||
            read_encs(p, size, &off, e->na, wmax, what, e->tensor, "A", &e->a, err) ||
            read_encs(p, size, &off, e->nb, wmax, what, e->tensor, "B", &e->b, err)) {
            lp_lpq_release(q);
            return -1;
        }
    }
    if (off != size) {
        lp_fail(err, "%s: %zu bytes after the last entry's encodings", what, size - off);
        lp_lpq_release(q);
        return -1;
    }
    return 0;
}

int lp_lpq_read(const char *path, lp_lpq *q, lp_error *err) {
    char *text;
    size_t len;
    memset(q, 0, sizeof *q);
    if (lp_read_file(path, &text, &len, 256u << 20, err)) return -1;
    int rc = lp_lpq_parse(text, len, path, q, err);
    free(text);
    return rc;
}

void lp_lpq_release(lp_lpq *q) {
    for (uint32_t i = 0; q->entries && i < q->n_entries; i++) {
        free(q->entries[i].a);
        free(q->entries[i].b);
    }
    free(q->entries);
    q->entries = NULL;
    q->n_entries = 0;
}

const lp_lpq_entry *lp_lpq_find(const lp_lpq *q, const char *tensor) {
    uint32_t lo = 0, hi = q->n_entries;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        int c = strcmp(q->entries[mid].tensor, tensor);
        if (c == 0) return &q->entries[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* ---- writer -------------------------------------------------------------------- */

static int cmp_entry(const void *x, const void *y) {
    return strcmp(((const lp_lpq_entry *)x)->tensor, ((const lp_lpq_entry *)y)->tensor);
}

static void put_encs(uint8_t *p, size_t *off, const lp_qenc *e, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        lp_le_put_f32(p + *off + 4 * (size_t)i, e[i].scale);
        lp_le_put_u32(p + *off + 4 * ((size_t)n + i), (uint32_t)e[i].zero);
    }
    *off += 8 * (size_t)n;
}

int lp_lpq_write(const char *path, lp_lpq *q, lp_error *err) {
    if (q->n_entries == 0 || q->n_entries > LP_LPQ_MAX_ENTRIES)
        return lp_fail(err, "%s: a profile needs 1..%u entries", path, LP_LPQ_MAX_ENTRIES);
    qsort(q->entries, q->n_entries, sizeof *q->entries, cmp_entry);
    size_t size = LP_LPQ_HEADER_BYTES + (size_t)q->n_entries * LP_LPQ_ENTRY_BYTES;
    for (uint32_t i = 0; i < q->n_entries; i++) size += 8 * ((size_t)q->entries[i].na + q->entries[i].nb);
    uint8_t *p = calloc(1, size);
    if (!p) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    memcpy(p, LP_LPQ_MAGIC, 4);
    lp_le_put_u32(p + 4, LP_LPQ_VERSION);
    lp_le_put_u64(p + 8, size);
    lp_le_put_u64(p + 24, q->base_fingerprint);
    lp_le_put_u32(p + 32, q->weight_bits);
    lp_le_put_u32(p + 36, q->act_bits);
    lp_le_put_u32(p + 40, q->granularity);
    lp_le_put_u32(p + 44, q->strategy);
    lp_le_put_u32(p + 48, q->n_entries);
    size_t alen = strnlen(q->anchor, LP_LPQ_ANCHOR_BYTES - 1);
    while (alen > 0 && ((uint8_t)q->anchor[alen] & 0xC0) == 0x80) alen--;
    memcpy(p + 64, q->anchor, alen);
    size_t off = LP_LPQ_HEADER_BYTES + (size_t)q->n_entries * LP_LPQ_ENTRY_BYTES;
    for (uint32_t i = 0; i < q->n_entries; i++) {
        const lp_lpq_entry *e = &q->entries[i];
        uint8_t *t = p + LP_LPQ_HEADER_BYTES + (size_t)i * LP_LPQ_ENTRY_BYTES;
        memcpy(t, e->tensor, strnlen(e->tensor, LP_LPQ_TENSOR_BYTES - 1));
        lp_le_put_u32(t + 96, e->rank);
        lp_le_put_u32(t + 100, e->in);
        lp_le_put_u32(t + 104, e->out);
        lp_le_put_f32(t + 108, e->x.scale);
        lp_le_put_u32(t + 112, (uint32_t)e->x.zero);
        lp_le_put_f32(t + 116, e->t.scale);
        lp_le_put_u32(t + 120, (uint32_t)e->t.zero);
        put_encs(p, &off, e->a, e->na);
        put_encs(p, &off, e->b, e->nb);
    }
    q->id = file_id(p, size);
    lp_le_put_u64(p + 16, q->id);
    /* what is written must read back (catches bad encodings at the source) */
    lp_lpq check;
    int rc = lp_lpq_parse(p, size, path, &check, err);
    if (rc == 0) lp_lpq_release(&check);
    FILE *f = rc == 0 ? fopen(path, "wb") : NULL;
    if (rc == 0 && !f) rc = lp_error_set(err, LP_ERR_IO, "%s: cannot create file", path);
    if (f) {
        bool ok = fwrite(p, 1, size, f) == size;
        ok = fclose(f) == 0 && ok;
        if (!ok) {
            remove(path);
            rc = lp_fail(err, "%s: write failed", path);
        }
    }
    free(p);
    return rc;
}
