/* llama2.c checkpoints: the shared stories260K model (cross-checked against
 * its GGUF twin), a synthetic model with a separate classifier, and malformed
 * headers and sizes. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "base/base.h"
#include "formats/gguf.h"
#include "formats/llama2c.h"

/* Copies `size` bytes of a file image into an exact-size heap buffer with a
 * patched header (so ASan catches reads past the end) and opens it. */
static int open_patched(const uint8_t *src, size_t src_size, size_t size, const int32_t *header,
                        lp_llama2c *m, lp_error *err) {
    uint8_t *p = malloc(size ? size : 4);
    memcpy(p, src, size < src_size ? size : src_size);
    if (size > src_size) memset(p + src_size, 0, size - src_size);
    if (header && size >= 28) memcpy(p, header, 28);
    int rc = lp_llama2c_open_memory(p, size, "bad.bin", m, err);
    if (rc == 0) { /* read everything the struct points at */
        volatile float s = 0;
        for (int32_t i = 0; i < m->vocab_size * m->dim; i++) s += m->token_embedding[i] + m->wcls[i];
        s += m->rms_final[m->dim - 1];
        (void)s;
    }
    free(p);
    return rc;
}

static void expect_reject(const uint8_t *src, size_t src_size, size_t size, const int32_t *header,
                          const char *needle, const char *what) {
    lp_llama2c m;
    lp_error err = {0};
    int rc = open_patched(src, src_size, size, header, &m, &err);
    CHECK_MSG(rc == -1, "%s: accepted", what);
    CHECK_MSG(strstr(err.message, "bad.bin") == err.message && strstr(err.message, needle),
              "%s: message '%s' lacks '%s'", what, err.message, needle);
}

static void test_stories(void) {
    lp_error err = {0};
    lp_llama2c m;
    int rc = lp_llama2c_open(LP_SHARED_MODELS "/stories260K.bin", &m, &err);
    CHECK_MSG(rc == 0, "%s", err.message);
    if (rc != 0) return;
    CHECK(m.dim == 64 && m.hidden_dim == 172 && m.n_layers == 5 && m.n_heads == 8 &&
          m.n_kv_heads == 4 && m.vocab_size == 512 && m.seq_len == 512);
    CHECK(m.shared_classifier && m.wcls == m.token_embedding);
    CHECK(m.file.size == 1056540);
    /* offsets of a few arrays (in floats after the header) */
    const float *base = m.token_embedding;
    CHECK(m.rms_att - base == 512 * 64);
    CHECK(m.wq - m.rms_att == 5 * 64);
    CHECK(m.wk - m.wq == 5 * 64 * 64 && m.wv - m.wk == 5 * 32 * 64 && m.wo - m.wv == 5 * 32 * 64);
    CHECK(m.w2 - m.w1 == 5 * 172 * 64);
    CHECK((const uint8_t *)(m.rms_final + 64 + 512 * 8) == m.file.data + m.file.size);
    CHECK_NEAR(m.token_embedding[0], -0.29474878f, 1e-7);

    /* the GGUF twin stores the same embedding */
    lp_gguf *g = lp_gguf_open(LP_SHARED_MODELS "/stories260K.gguf", &err);
    CHECK_MSG(g != NULL, "%s", err.message);
    if (g) {
        const lp_gguf_tensor *t = lp_gguf_find_tensor(g, "token_embd.weight");
        CHECK(t && t->n_elements == 512 * 64 && memcmp(t->data, m.token_embedding, 4 * sizeof(float)) == 0);
        const lp_gguf_tensor *norm = lp_gguf_find_tensor(g, "output_norm.weight");
        CHECK(norm && norm->n_elements == 64 && memcmp(norm->data, m.rms_final, 64 * sizeof(float)) == 0);
        lp_gguf_close(g);
    }

    /* malformed variants of the real file */
    const uint8_t *src = m.file.data;
    size_t n = m.file.size;
    int32_t h[7];
    memcpy(h, src, 28);
    expect_reject(src, n, n - 1, NULL, "needs 1056540", "truncated by 1");
    expect_reject(src, n, n - 4, NULL, "file size is 1056536", "truncated by a float");
    expect_reject(src, n, n + 4, NULL, "needs 1056540", "one float too many");
    expect_reject(src, n, 27, NULL, "too small", "header cut");
    expect_reject(src, n, 0, NULL, "too small", "empty");
    int32_t bad[7];
    memcpy(bad, h, 28);
    bad[5] = -512; /* claims a separate classifier that is not there */
    expect_reject(src, n, n, bad, "other classifier", "wrong classifier sign");
    memcpy(bad, h, 28);
    bad[0] = -64;
    expect_reject(src, n, n, bad, "dim is -64", "negative dim");
    memcpy(bad, h, 28);
    bad[3] = 0;
    expect_reject(src, n, n, bad, "n_heads is 0", "zero heads");
    memcpy(bad, h, 28);
    bad[4] = 0;
    expect_reject(src, n, n, bad, "n_kv_heads is 0", "zero kv heads");
    memcpy(bad, h, 28);
    bad[6] = -1;
    expect_reject(src, n, n, bad, "seq_len", "negative seq_len");
    memcpy(bad, h, 28);
    bad[3] = 7;
    expect_reject(src, n, n, bad, "not a multiple of n_heads", "heads don't divide dim");
    memcpy(bad, h, 28);
    bad[4] = 3;
    expect_reject(src, n, n, bad, "not a multiple of n_kv_heads", "kv heads don't divide heads");
    memcpy(bad, h, 28);
    bad[3] = 64, bad[4] = 64;
    expect_reject(src, n, n, bad, "odd", "head size 1");
    memcpy(bad, h, 28);
    bad[5] = INT32_MIN;
    expect_reject(src, n, n, bad, "vocab_size", "INT32_MIN vocab");
    int32_t huge[7] = {1 << 30, 1 << 30, 1 << 30, 1, 1, 1 << 30, 1 << 30};
    expect_reject(src, n, n, huge, "overflow", "huge dims");
    int32_t big[7] = {1 << 20, 1 << 20, 8, 2, 2, 1 << 20, 16};
    expect_reject(src, n, n, big, "needs", "big dims");
    lp_llama2c_close(&m);
    CHECK(m.token_embedding == NULL && m.file.data == NULL);
}

/* A small synthetic model with a separate classifier. */
static void test_unshared(void) {
    const int32_t dim = 8, hidden = 12, layers = 2, heads = 2, kv_heads = 1, vocab = 5, seq = 3;
    size_t head = 4, kv_dim = 4;
    size_t floats = vocab * dim + layers * dim + layers * dim * dim + 2 * layers * kv_dim * dim +
                    layers * dim * dim + layers * dim + 3 * layers * hidden * dim + dim + seq * head +
                    vocab * dim;
    size_t size = 28 + 4 * floats;
    uint8_t *p = malloc(size);
    int32_t h[7] = {dim, hidden, layers, heads, kv_heads, -vocab, seq};
    memcpy(p, h, 28);
    float *f = (float *)(p + 28);
    for (size_t i = 0; i < floats; i++) f[i] = (float)i;
    lp_llama2c m;
    lp_error err = {0};
    int rc = lp_llama2c_open_memory(p, size, "unshared.bin", &m, &err);
    CHECK_MSG(rc == 0, "%s", err.message);
    if (rc == 0) {
        CHECK(!m.shared_classifier && m.vocab_size == 5);
        CHECK(m.wcls == f + floats - vocab * dim && m.wcls[0] == (float)(floats - vocab * dim));
        CHECK(m.wk - m.wq == layers * dim * dim && m.wv - m.wk == layers * (int)kv_dim * dim);
        CHECK(m.rms_final[0] == (float)(floats - vocab * dim - seq * head - dim));
        lp_llama2c_close(&m); /* memory-opened: nothing to unmap */
    }
    /* the same bytes with a positive vocab are too long */
    h[5] = vocab;
    memcpy(p, h, 28);
    rc = lp_llama2c_open_memory(p, size, "unshared.bin", &m, &err);
    CHECK(rc == -1 && strstr(err.message, "other classifier"));
    /* unaligned buffers are refused rather than read misaligned */
    rc = lp_llama2c_open_memory(p + 1, size - 1, "odd.bin", &m, &err);
    CHECK(rc == -1 && strstr(err.message, "aligned"));
    free(p);
    CHECK(lp_llama2c_open("/nonexistent/model.bin", &m, &err) == -1 &&
          strstr(err.message, "/nonexistent/model.bin"));
}

int main(void) {
    test_stories();
    test_unshared();
    return check_summary("llama2c");
}
