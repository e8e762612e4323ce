/* The batched forward: against a naive double-precision forward, and the
 * equivalences the design rests on — one batch of several sequences equals
 * each sequence alone, prefill in one batch equals token-by-token decode,
 * forked sequences share their prefix blocks and never see each other, and a
 * parent chain in one batch equals committing rows one by one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "runtime/context.h"
#include "tools/synth.h"
#include "naive_forward.h"

/* Path of a shared test file; four rotating buffers so two can be live. */
static const char *shared(const char *name) {
    static char paths[4][1024];
    static int next;
    char *path = paths[next++ % 4];
    snprintf(path, 1024, "%s/%s", LP_SHARED_MODELS, name);
    return path;
}

/* KV in f32 (kv_f32) or the default f16. */
static lp_context *make_ctx_kv(const lp_model *m, int threads, int max_rows, int max_seqs, bool kv_f32) {
    lp_context_params p = lp_context_default_params();
    p.n_threads = threads;
    p.max_rows = max_rows;
    p.max_sequences = max_seqs;
    p.n_ctx = 512;
    p.kv_f32 = kv_f32;
    lp_error err;
    lp_context *ctx = lp_context_create(m, &p, &err);
    if (!ctx) fprintf(stderr, "context: %s\n", err.message);
    return ctx;
}

static lp_context *make_ctx(const lp_model *m, int threads, int max_rows, int max_seqs) {
    return make_ctx_kv(m, threads, max_rows, max_seqs, false);
}

static lp_row row(int32_t token, int pos, int seq, int parent, bool logits) {
    lp_row r = {.token = token, .pos = pos, .seq = seq, .parent = parent, .logits = logits, .commit = true};
    return r;
}

/* Prefill tokens into seq as one chained batch; returns the logits row. */
static const float *prefill(lp_context *ctx, const int32_t *toks, int n, int seq, int start_pos) {
    lp_row rows[64];
    for (int i = 0; i < n; i++) rows[i] = row(toks[i], start_pos + i, seq, i - 1, i == n - 1);
    lp_error err;
    if (lp_forward(ctx, rows, n, &err)) {
        fprintf(stderr, "forward: %s\n", err.message);
        return NULL;
    }
    return lp_logits(ctx, n - 1);
}

static float max_abs_diff(const float *a, const float *b, int n) {
    float m = 0;
    for (int i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (d > m) m = d;
    }
    return m;
}

/* lp_forward vs the naive forward, for a model file: with an f32 KV cache
 * within tol, with the default f16 one within what rounding keys and values
 * to 11 significant bits allows (measured up to 4.3e-4 of the logit scale
 * on the synth models). */
static void against_naive(const char *path, float tol, bool kv_f32) {
    lp_error err;
    /* float activations: the naive forward does not quantize them to int8 */
    lp_model_params mp = {.activations = 32};
    lp_model *m = lp_model_load(path, &mp, &err);
    CHECK_MSG(m != NULL, "%s", m ? "" : err.message);
    if (!m) return;
    int32_t toks[9];
    for (int i = 0; i < 9; i++) toks[i] = (int32_t)((i * 37 + 11) % m->hp.n_vocab);
    lp_context *ctx = make_ctx_kv(m, 2, 64, 2, kv_f32);
    const float *logits = prefill(ctx, toks, 9, 0, 0);
    double *ref = malloc((size_t)m->hp.n_vocab * sizeof(double));
    naive_forward(m, toks, 9, ref);
    double worst = 0, scale = 0;
    for (int i = 0; i < m->hp.n_vocab; i++) {
        double d = fabs(logits[i] - ref[i]);
        if (d > worst) worst = d;
        if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
    }
    CHECK_MSG(worst <= tol * (1 + scale), "%s (KV %s): max |diff| %g (logit scale %g)", path, kv_f32 ? "f32" : "f16",
              worst, scale);
    free(ref);
    lp_context_free(ctx);
    lp_model_free(m);
}

static void test_against_naive(const char *path, float tol) {
    for (int kv_f32 = 1; kv_f32 >= 0; kv_f32--) against_naive(path, kv_f32 ? tol : 2e-3f, kv_f32);
}

static void test_two_file_forms(void) {
    lp_error err;
    lp_model_params mp = {.tokenizer_path = shared("tok512.bin")};
    lp_model *bin = lp_model_load(shared("stories260K.bin"), &mp, &err);
    CHECK_MSG(bin != NULL, "%s", bin ? "" : err.message);
    lp_model *gguf = lp_model_load(shared("stories260K.gguf"), NULL, &err);
    CHECK_MSG(gguf != NULL, "%s", gguf ? "" : err.message);
    if (!bin || !gguf) goto out;
    int32_t a[16], b[16];
    const char *text = "Once upon a time";
    int na = lp_tokenize(bin, text, strlen(text), true, false, a, 16, &err);
    int nb = lp_tokenize(gguf, text, strlen(text), true, false, b, 16, &err);
    CHECK(na == nb && na > 1 && memcmp(a, b, (size_t)na * sizeof(int32_t)) == 0);
    lp_context *cb = make_ctx(bin, 1, 64, 1), *cg = make_ctx(gguf, 1, 64, 1);
    const float *lb = prefill(cb, a, na, 0, 0), *lg = prefill(cg, b, nb, 0, 0);
    CHECK(lb && lg && memcmp(lb, lg, 512 * sizeof(float)) == 0); /* bit-identical */
    lp_context_free(cb);
    lp_context_free(cg);
out:
    lp_model_free(bin);
    lp_model_free(gguf);
}

/* Three sequences decoded in one batch == each alone; prefill in one batch
 * == token by token. */
static void test_batch_equivalences(const char *path) {
    lp_error err;
    lp_model *m = lp_model_load(path, NULL, &err);
    CHECK_MSG(m != NULL, "%s", m ? "" : err.message);
    if (!m) return;
    int V = m->hp.n_vocab;
    int32_t prompts[3][6] = {{1, 5, 9, 13, 17, 21}, {1, 30, 31, 32, 0, 0}, {1, 7, 0, 0, 0, 0}};
    int lens[3] = {6, 4, 2};
    int32_t next[3] = {40, 41, 42};
    float *alone = malloc((size_t)3 * V * sizeof(float));
    for (int s = 0; s < 3; s++) {
        lp_context *ctx = make_ctx(m, 2, 64, 4);
        prefill(ctx, prompts[s], lens[s], 0, 0);
        lp_row r = row(next[s], lens[s], 0, -1, true);
        CHECK(lp_forward(ctx, &r, 1, &err) == 0);
        memcpy(alone + (size_t)s * V, lp_logits(ctx, 0), (size_t)V * sizeof(float));
        lp_context_free(ctx);
    }
    /* together: all three prefills in ONE batch, then one decode batch */
    lp_context *ctx = make_ctx(m, 2, 64, 4);
    lp_row rows[16];
    int n = 0;
    for (int s = 0; s < 3; s++) {
        int first = n;
        for (int i = 0; i < lens[s]; i++, n++)
            rows[n] = row(prompts[s][i], i, s, i ? n - 1 : -1, false);
        (void)first;
    }
    CHECK(lp_forward(ctx, rows, n, &err) == 0);
    for (int s = 0; s < 3; s++) rows[s] = row(next[s], lens[s], s, -1, true);
    CHECK(lp_forward(ctx, rows, 3, &err) == 0);
    for (int s = 0; s < 3; s++) {
        float d = max_abs_diff(lp_logits(ctx, s), alone + (size_t)s * V, V);
        CHECK_MSG(d == 0.0f, "%s: sequence %d differs by %g in a batch (must be bit-identical)", path, s, d);
    }
    lp_context_free(ctx);

    /* prefill as one batch vs token by token (the batch's matmul tiles sum
     * in another order; with an f16 cache such last-bit differences can
     * round a key or value to the neighbouring f16 value, 1.4e-4 measured) */
    for (int kv_f32 = 1; kv_f32 >= 0; kv_f32--) {
        lp_context *one = make_ctx_kv(m, 1, 64, 1, kv_f32), *step = make_ctx_kv(m, 1, 64, 1, kv_f32);
        const float *lb = prefill(one, prompts[0], 6, 0, 0);
        const float *ls = NULL;
        for (int i = 0; i < 6; i++) {
            lp_row r = row(prompts[0][i], i, 0, -1, true);
            CHECK(lp_forward(step, &r, 1, &err) == 0);
            ls = lp_logits(step, 0);
        }
        float d = max_abs_diff(lb, ls, V), tol = kv_f32 ? 1e-4f : 1e-3f;
        CHECK_MSG(d <= tol, "%s (KV %s): prefill vs token-by-token differ by %g", path, kv_f32 ? "f32" : "f16", d);
        lp_context_free(one);
        lp_context_free(step);
    }
    free(alone);
    lp_model_free(m);
}

/* A KV block holds K and V for every layer in f16 by default, f32 on
 * request, and reports its size. */
static void test_kv_block_bytes(void) {
    lp_error err;
    lp_model *m = lp_model_load(shared("stories260K.gguf"), NULL, &err);
    CHECK(m != NULL);
    if (!m) return;
    lp_context *h = make_ctx_kv(m, 1, 8, 1, false), *f = make_ctx_kv(m, 1, 8, 1, true);
    int bt = 0;
    lp_kv_usage(h, NULL, NULL, &bt);
    size_t elems = 2 * (size_t)m->hp.n_layers * (size_t)m->hp.n_kv_heads * (size_t)bt * (size_t)m->hp.head_dim;
    CHECK(h && f && lp_kv_block_bytes(h) == elems * 2 && lp_kv_block_bytes(f) == elems * 4);
    lp_context_free(h);
    lp_context_free(f);
    lp_model_free(m);
}

/* Forks share blocks; a stream never sees another's tokens; a parent chain
 * with deferred commit equals committing as we go. */
static void test_fork_and_tree(void) {
    lp_error err;
    lp_model *m = lp_model_load(shared("stories260K.gguf"), NULL, &err);
    CHECK(m != NULL);
    if (!m) return;
    int V = m->hp.n_vocab;
    lp_context *ctx = make_ctx(m, 2, 64, 4);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = (int32_t)(1 + (i * 7) % 500);
    prefill(ctx, prompt, 40, 0, 0); /* 40 entries: one full block + 8 */
    int used0;
    lp_kv_usage(ctx, &used0, NULL, NULL);
    CHECK(used0 == 2);
    CHECK(lp_seq_fork(ctx, 0, 1, &err) == 0 && lp_seq_fork(ctx, 0, 2, &err) == 0);
    int used1;
    lp_kv_usage(ctx, &used1, NULL, NULL);
    CHECK_MSG(used1 == used0, "fork copied blocks: %d -> %d", used0, used1);
    CHECK(ctx->seqs[1].blocks[0] == ctx->seqs[0].blocks[0]); /* same memory */

    /* each stream appends a different token in one batch */
    lp_row rows[3] = {row(100, 40, 0, -1, true), row(200, 40, 1, -1, true), row(300, 40, 2, -1, true)};
    CHECK(lp_forward(ctx, rows, 3, &err) == 0);
    int used2;
    lp_kv_usage(ctx, &used2, NULL, NULL);
    /* the shared partial block is copied once per writer except the last */
    CHECK_MSG(used2 == used0 + 2, "expected %d blocks after copy-on-write, got %d", used0 + 2, used2);
    CHECK(ctx->seqs[1].blocks[0] == ctx->seqs[0].blocks[0]); /* full block still shared */
    /* stream 1 continues; it must equal a fresh run of prompt + 200 + 201 */
    lp_row r = row(201, 41, 1, -1, true);
    CHECK(lp_forward(ctx, &r, 1, &err) == 0);
    float *got = malloc((size_t)V * sizeof(float));
    memcpy(got, lp_logits(ctx, 0), (size_t)V * sizeof(float));
    lp_context *fresh = make_ctx(m, 2, 64, 1);
    int32_t full[42];
    memcpy(full, prompt, sizeof prompt);
    full[40] = 200;
    full[41] = 201;
    const float *want = prefill(fresh, full, 42, 0, 0);
    float d = max_abs_diff(got, want, V);
    CHECK_MSG(d <= 1e-4f, "forked stream differs from a fresh run by %g", d);

    /* tree: rows 0->1->2 chained, uncommitted, then commit; compare with
     * the fresh run's logits for the same continuation */
    CHECK(lp_seq_truncate(ctx, 1, 40, &err) == 0);
    lp_row tree[4] = {row(200, 40, 1, -1, false), row(201, 41, 1, 0, true),
                      row(999 % V, 41, 1, 0, true), row(5, 42, 1, 2, true)};
    for (int i = 0; i < 4; i++) tree[i].commit = false;
    CHECK(lp_forward(ctx, tree, 4, &err) == 0);
    d = max_abs_diff(lp_logits(ctx, 1), want, V);
    CHECK_MSG(d <= 1e-4f, "tree row differs from the linear run by %g", d);
    CHECK(lp_seq_length(ctx, 1) == 40);
    int accept[2] = {0, 1};
    CHECK(lp_commit_rows(ctx, accept, 2, &err) == 0);
    CHECK(lp_seq_length(ctx, 1) == 42);
    lp_row next = row(7, 42, 1, -1, true);
    CHECK(lp_forward(ctx, &next, 1, &err) == 0);
    memcpy(got, lp_logits(ctx, 0), (size_t)V * sizeof(float));
    lp_row nf = row(7, 42, 0, -1, true);
    CHECK(lp_forward(fresh, &nf, 1, &err) == 0);
    d = max_abs_diff(got, lp_logits(fresh, 0), V);
    CHECK_MSG(d <= 1e-4f, "after committing the accepted path: differs by %g", d);

    /* clearing the streams returns their private blocks */
    lp_seq_clear(ctx, 1);
    lp_seq_clear(ctx, 2);
    lp_seq_clear(ctx, 0);
    int used3;
    lp_kv_usage(ctx, &used3, NULL, NULL);
    CHECK(used3 == 0);

    /* bad batches are rejected, not run */
    lp_row bad = row(V, 0, 0, -1, true);
    CHECK(lp_forward(ctx, &bad, 1, &err) != 0 && strstr(err.message, "vocabulary"));
    bad = row(1, 0, 9, -1, true);
    CHECK(lp_forward(ctx, &bad, 1, &err) != 0 && strstr(err.message, "sequence"));
    lp_row two[2] = {row(1, 0, 0, -1, false), row(1, 1, 1, 0, true)};
    CHECK(lp_forward(ctx, two, 2, &err) != 0 && strstr(err.message, "another sequence"));
    free(got);
    lp_context_free(fresh);
    lp_context_free(ctx);
    lp_model_free(m);
}

static bool collect(void *user, const char *text, size_t len) {
    char *buf = user;
    size_t have = strlen(buf);
    if (have + len < 4096) {
        memcpy(buf + have, text, len);
        buf[have + len] = 0;
    }
    return true;
}

/* Greedy continuation of "Once upon a time" equals the reference text. */
static void test_reference_output(const char *model, const char *tokenizer) {
    static const char reference[] =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
        "park. One day, she saw a big, red ball. She wanted to play with it, but it was too "
        "high.\nLily's mom said, \"Lily, let's go to the park.\" Lily was sad and didn't know "
        "what to do. She said, \"I want to play with your ball, but I can't find it.\"\n"
        "Lily was sad and didn't know what to do. She said, \"I'm sorry, Lily. I didn't know "
        "what to do.\"\nLily didn't want to help her mom, so she said, \"I'm sorry, mom. I "
        "didn't know what to do.\" Her mom said, \"Don't worry, Lily. We can help you.\n";
    lp_error err;
    lp_model_params mp = {.tokenizer_path = tokenizer};
    lp_model *m = lp_model_load(model, &mp, &err);
    CHECK_MSG(m != NULL, "%s", m ? "" : err.message);
    if (!m) return;
    lp_context *ctx = make_ctx(m, 2, 64, 1);
    lp_sampler_params sp = lp_sampler_default_params();
    sp.temperature = 0;
    lp_sampler *s = lp_sampler_create(m, &sp, &err);
    int32_t prompt[16];
    int n = lp_tokenize(m, "Once upon a time", 16, true, false, prompt, 16, &err);
    char text[4096] = "Once upon a time";
    lp_generate_params gp = lp_generate_default_params();
    gp.n_predict = 60;
    CHECK(lp_generate(ctx, s, prompt, n, &gp, collect, text, NULL, &err) == 0);
    size_t got = strlen(text);
    CHECK_MSG(got > 150 && strncmp(text, reference, got) == 0, "%s:\n got: %s\nwant: %s", model,
              text, reference);
    lp_sampler_free(s);
    lp_context_free(ctx);
    lp_model_free(m);
}

/* Random models of every architecture and weight type written by synth run
 * and agree with the naive forward. */
static void test_synth_models(void) {
    static const struct { const char *arch; uint32_t type; int dim, heads, kv, head_dim; } cases[] = {
        {"llama", LP_F32, 256, 4, 2, 64},  {"llama", LP_Q4_K, 256, 4, 2, 64},
        {"llama", LP_Q6_K, 256, 4, 1, 64}, {"llama", LP_Q8_0, 256, 8, 2, 32},
        {"llama", LP_Q4_0, 256, 4, 4, 64}, {"llama", LP_BF16, 256, 4, 2, 64},
        {"qwen2", LP_F16, 128, 4, 2, 32},  {"qwen3", LP_F32, 128, 4, 2, 64},
        {"qwen3", LP_Q5_K, 256, 2, 1, 128},
    };
    char dir[] = "/tmp/lp_fwd_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lp_synth_params p;
        lp_error err;
        CHECK(lp_synth_preset("tiny", &p, &err) == 0);
        CHECK(lp_arch_from_name(cases[i].arch, &p.arch) == 0);
        p.dim = cases[i].dim;
        p.n_heads = cases[i].heads;
        p.n_kv_heads = cases[i].kv;
        p.head_dim = cases[i].head_dim;
        p.ffn_dim = 512;
        p.n_layers = 2;
        p.weight_type = cases[i].type;
        p.embd_type = cases[i].type == LP_F32 ? LP_F32 : LP_F16;
        p.tied_output = p.arch != LP_ARCH_LLAMA;
        p.seed = 100 + i;
        char path[256];
        snprintf(path, sizeof path, "%s/m%zu.gguf", dir, i);
        CHECK_MSG(lp_synth_write(&p, path, &err) == 0, "%s", err.message);
        test_against_naive(path, 2e-5f);
        unlink(path);
    }
    rmdir(dir);
}

int main(void) {
    test_kv_block_bytes();
    test_synth_models();
    test_two_file_forms();
    test_reference_output(shared("stories260K.gguf"), NULL);
    test_reference_output(shared("stories260K.bin"), shared("tok512.bin"));
    test_against_naive(shared("stories260K.gguf"), 1e-4f);
    test_against_naive(shared("arch/llama3-tiny-random.gguf"), 2e-5f);
    test_against_naive(shared("arch/qwen2-tiny-random.gguf"), 2e-5f);
    test_against_naive(shared("arch/mistral-spm-tiny-random.gguf"), 2e-5f);
    test_batch_equivalences(shared("stories260K.gguf"));
    test_batch_equivalences(shared("arch/qwen2-tiny-random.gguf"));
    test_fork_and_tree();
    return check_summary("forward");
}
