/* llama2.c "version 0" checkpoints: a 7-int header and raw float32 arrays.
 *
 * There is no magic number, so validation is the header's consistency plus
 * an exact size match: the file must be exactly as long as the header says
 * (with or without the separate classifier, by the sign of vocab_size). */
#include "llama2c.h"

#include <stdint.h>
#include <string.h>

#define HEADER_INTS 7
#define HEADER_BYTES (HEADER_INTS * 4)

/* Element counts of every array, in file order. */
typedef struct layout {
    size_t token_embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq_cis,
        wcls;
} layout;

/* a*b*c with overflow checks. */
static bool mul3(size_t a, size_t b, size_t c, size_t *out) {
    size_t ab;
    return lp_mul_ok(a, b, &ab) && lp_mul_ok(ab, c, out);
}

static int check_header(const lp_llama2c *m, const char *name, lp_error *err) {
    const int32_t *f = &m->dim;
    static const char *const field[HEADER_INTS] = {"dim",        "hidden_dim", "n_layers",
                                                   "n_heads",    "n_kv_heads", "vocab_size",
                                                   "seq_len"};
    for (int i = 0; i < HEADER_INTS; i++)
        if (f[i] <= 0)
            return lp_fail(err, "%s: llama2.c header field %s is %d (must be positive)", name,
                           field[i], f[i]);
    if (m->dim % m->n_heads != 0)
        return lp_fail(err, "%s: dim %d is not a multiple of n_heads %d", name, m->dim, m->n_heads);
    if (m->n_heads % m->n_kv_heads != 0)
        return lp_fail(err, "%s: n_heads %d is not a multiple of n_kv_heads %d", name, m->n_heads,
                       m->n_kv_heads);
    if ((m->dim / m->n_heads) % 2 != 0)
        return lp_fail(err, "%s: head size %d is odd (rotary embeddings need pairs)", name,
                       m->dim / m->n_heads);
    return 0;
}

static int compute_layout(const lp_llama2c *m, layout *l, size_t *total_floats, const char *name,
                          lp_error *err) {
    size_t dim = (size_t)m->dim, hidden = (size_t)m->hidden_dim, layers = (size_t)m->n_layers;
    size_t kv_dim = dim / (size_t)m->n_heads * (size_t)m->n_kv_heads;
    size_t head_size = dim / (size_t)m->n_heads;
    memset(l, 0, sizeof *l);
    bool ok = lp_mul_ok((size_t)m->vocab_size, dim, &l->token_embedding) &&
              lp_mul_ok(layers, dim, &l->rms_att) && mul3(layers, dim, dim, &l->wq) &&
              mul3(layers, kv_dim, dim, &l->wk) && mul3(layers, kv_dim, dim, &l->wv) &&
              mul3(layers, dim, dim, &l->wo) && lp_mul_ok(layers, dim, &l->rms_ffn) &&
              mul3(layers, hidden, dim, &l->w1) && mul3(layers, dim, hidden, &l->w2) &&
              mul3(layers, hidden, dim, &l->w3) && lp_mul_ok((size_t)m->seq_len, head_size, &l->freq_cis);
    l->rms_final = dim;
    if (!m->shared_classifier) l->wcls = l->token_embedding;
    /* freq_cis_real and freq_cis_imag: seq_len * head_size / 2 floats each */
    size_t parts[] = {l->token_embedding, l->rms_att, l->wq, l->wk, l->wv, l->wo, l->rms_ffn,
                      l->w1, l->w2, l->w3, l->rms_final, l->freq_cis / 2 * 2, l->wcls};
    size_t total = 0;
    for (size_t i = 0; ok && i < sizeof parts / sizeof parts[0]; i++) ok = lp_add_ok(total, parts[i], &total);
    if (!ok) return lp_fail(err, "%s: llama2.c model sizes overflow", name);
    *total_floats = total;
    return 0;
}

int lp_llama2c_open_memory(const void *data, size_t size, const char *name, lp_llama2c *out,
                           lp_error *err) {
    memset(out, 0, sizeof *out);
    if (!name) name = "(memory)";
    const uint8_t *p = data;
    if (!p || size < HEADER_BYTES)
        return lp_fail(err, "%s: too small for a llama2.c checkpoint (%zu bytes, header is %d)", name,
                       p ? size : 0, HEADER_BYTES);
    if ((uintptr_t)p % _Alignof(float) != 0)
        return lp_fail(err, "%s: buffer is not 4-byte aligned", name);
    lp_llama2c m = {0};
    int32_t h[HEADER_INTS];
    memcpy(h, p, sizeof h);
    m.dim = h[0], m.hidden_dim = h[1], m.n_layers = h[2], m.n_heads = h[3];
    m.n_kv_heads = h[4], m.seq_len = h[6];
    /* negative vocab_size = unshared classifier (stored after freq_cis) */
    if (h[5] == INT32_MIN) return lp_fail(err, "%s: llama2.c vocab_size %d is invalid", name, h[5]);
    m.shared_classifier = h[5] > 0;
    m.vocab_size = h[5] < 0 ? -h[5] : h[5];
    if (check_header(&m, name, err)) return -1;

    layout l;
    size_t floats = 0, expect, other_floats, other;
    if (compute_layout(&m, &l, &floats, name, err)) return -1;
    if (!lp_mul_ok(floats, 4, &expect) || !lp_add_ok(expect, HEADER_BYTES, &expect))
        return lp_fail(err, "%s: llama2.c model sizes overflow", name);
    if (size != expect) {
        /* the size the other classifier variant would have, for the hint */
        other_floats = m.shared_classifier ? floats + l.token_embedding : floats - l.token_embedding;
        bool other_ok = lp_mul_ok(other_floats, 4, &other) && lp_add_ok(other, HEADER_BYTES, &other);
        return lp_fail(err,
                       "%s: llama2.c file size is %zu bytes but the header (dim %d, hidden %d, "
                       "%d layers, %d/%d heads, vocab %d, seq_len %d, %s classifier) needs %zu%s",
                       name, size, m.dim, m.hidden_dim, m.n_layers, m.n_heads, m.n_kv_heads,
                       m.vocab_size, m.seq_len, m.shared_classifier ? "shared" : "separate", expect,
                       other_ok && other == size
                           ? " (the size matches the other classifier layout: is the sign of vocab_size wrong?)"
                           : "");
    }

    const float *f = (const float *)(p + HEADER_BYTES);
    m.token_embedding = f, f += l.token_embedding;
    m.rms_att = f, f += l.rms_att;
    m.wq = f, f += l.wq;
    m.wk = f, f += l.wk;
    m.wv = f, f += l.wv;
    m.wo = f, f += l.wo;
    m.rms_ffn = f, f += l.rms_ffn;
    m.w1 = f, f += l.w1;
    m.w2 = f, f += l.w2;
    m.w3 = f, f += l.w3;
    m.rms_final = f, f += l.rms_final;
    f += l.freq_cis / 2 * 2; /* skip the unused RoPE tables */
    m.wcls = m.shared_classifier ? m.token_embedding : f;
    *out = m;
    return 0;
}

int lp_llama2c_open(const char *path, lp_llama2c *out, lp_error *err) {
    memset(out, 0, sizeof *out);
    lp_mapped_file file;
    if (lp_map_file(path, &file, err)) return -1;
    if (lp_llama2c_open_memory(file.data, file.size, path, out, err)) {
        lp_unmap_file(&file);
        return -1;
    }
    out->file = file;
    return 0;
}

void lp_llama2c_close(lp_llama2c *m) {
    if (!m) return;
    lp_unmap_file(&m->file);
    memset(m, 0, sizeof *m);
}
