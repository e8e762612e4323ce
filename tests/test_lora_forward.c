/* Adapters as runtime inputs: a LoRA applied in the forward pass equals the
 * model with that LoRA merged into its weights; a batch mixing rows of
 * different adapters (and ranks) equals each row run alone with its adapter;
 * switching a slot is a pointer store. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "runtime/context.h"
#include "tools/adapter_write.h"
#include "tools/synth.h"
#include "arch/llama.h"

/* The pair of layer l's projection p, or an empty one (rank 0). */
static const lp_lora_pair *pair_of(const lp_adapter *a, int l, lp_proj p) {
    static const lp_lora_pair none = {.weight = -1};
    const lp_lora_pair *x = lp_llama_pair(a, l, p);
    return x ? x : &none;
}


/* KV in f32 (kv_f32) or the default f16. */
static lp_context *make_ctx_kv(const lp_model *m, int max_adapters, bool kv_f32) {
    lp_context_params p = lp_context_default_params();
    p.n_threads = 2;
    p.max_rows = 64;
    p.max_sequences = 16;
    p.n_ctx = 1024;
    p.max_adapters = max_adapters;
    p.kv_f32 = kv_f32;
    lp_error err;
    lp_context *ctx = lp_context_create(m, &p, &err);
    if (!ctx) fprintf(stderr, "context: %s\n", err.message);
    return ctx;
}

static lp_context *make_ctx(const lp_model *m, int max_adapters) { return make_ctx_kv(m, max_adapters, false); }

static const float *prefill(lp_context *ctx, const int32_t *toks, int n, int seq, int slot) {
    lp_row rows[64];
    for (int i = 0; i < n; i++) rows[i] = (lp_row){.token = toks[i], .pos = i, .seq = seq, .adapter = slot, .parent = i - 1, .logits = i == n - 1, .commit = true};
    lp_error err;
    if (lp_forward(ctx, rows, n, &err)) {
        fprintf(stderr, "forward: %s\n", err.message);
        return NULL;
    }
    return lp_logits(ctx, n - 1);
}

static float max_diff(const float *a, const float *b, int n) {
    float d = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(a[i] - b[i]) > d) d = fabsf(a[i] - b[i]);
    return d;
}

static bool collect(void *user, const char *text, size_t len) {
    char *buf = user;
    size_t have = strlen(buf);
    if (have + len < 2048) {
        memcpy(buf + have, text, len);
        buf[have + len] = 0;
    }
    return true;
}

static void greedy(lp_context *ctx, const lp_model *m, int slot, char *out) {
    lp_error err;
    lp_sampler_params sp = lp_sampler_default_params();
    sp.temperature = 0;
    lp_sampler *s = lp_sampler_create(m, &sp, &err);
    int32_t prompt[16];
    int n = lp_tokenize(m, "Once upon a time", 16, true, false, prompt, 16, &err);
    lp_generate_params gp = lp_generate_default_params();
    gp.n_predict = 60;
    gp.prefix_adapter = slot;
    gp.reuse_cache = false;
    out[0] = 0;
    CHECK(lp_generate(ctx, s, prompt, n, &gp, collect, out, NULL, &err) == 0);
    lp_sampler_free(s);
}

/* The shared llama.cpp GGUF LoRA at run time == llama.cpp's merged file. */
static void test_shared_lora(void) {
    lp_error err;
    lp_model *base = lp_model_load(LP_SHARED_MODELS "/stories260K.gguf", NULL, &err);
    lp_model *merged = lp_model_load(LP_SHARED_MODELS "/stories260K-lora-r4-merged.gguf", NULL, &err);
    CHECK(base && merged);
    if (!base || !merged) return;
    lp_adapter *a = lp_adapter_load(base, LP_SHARED_MODELS "/stories260K-lora-r4-random-f32.gguf",
                                    1.0f, &err);
    CHECK_MSG(a != NULL, "%s", a ? "" : err.message);
    if (!a) return;
    /* f32 KV: adapter and merged weights sum in different orders, and an
     * f16 cache could round a key either side of a tie (measured 2.2e-3
     * with the reference kernels) */
    lp_context *cb = make_ctx_kv(base, 2, true), *cm = make_ctx_kv(merged, 2, true);
    CHECK(lp_context_bind_adapter(cb, 1, a, &err) == 0);
    int32_t toks[12] = {1, 403, 407, 261, 378, 30, 60, 99, 7, 300, 12, 13};
    const float *la = prefill(cb, toks, 12, 0, 1);
    float *with = malloc(512 * sizeof(float));
    memcpy(with, la, 512 * sizeof(float));
    const float *lm = prefill(cm, toks, 12, 0, 0);
    float d = max_diff(with, lm, 512);
    CHECK_MSG(d < 1e-4f, "run-time adapter vs merged: logits differ by %g", d);
    lp_seq_clear(cb, 0);
    const float *l0 = prefill(cb, toks, 12, 0, 0);
    CHECK_MSG(max_diff(with, l0, 512) > 1e-2f, "the adapter changes nothing");

    static char a_text[2048], m_text[2048], b_text[2048];
    greedy(cb, base, 1, a_text);
    greedy(cm, merged, 0, m_text);
    greedy(cb, base, 0, b_text);
    CHECK_MSG(strcmp(a_text, m_text) == 0, "greedy text differs:\n adapter: %s\n merged:  %s",
              a_text, m_text);
    CHECK(strcmp(a_text, b_text) != 0);
    free(with);
    lp_context_free(cb);
    lp_context_free(cm);
    lp_adapter_free(a);
    lp_model_free(base);
    lp_model_free(merged);
}

/* Writes `a` as an int8 (W8) or int4 (W4) .lpa and loads that instead. */
static lp_adapter *as_packed(lp_model *m, lp_adapter *a, const char *path, uint32_t type) {
    lp_error err;
    if (!a) return NULL;
    CHECK_MSG(lp_adapter_write_lpa(a, path, (int)type, &err) == 0, "%s", err.message);
    lp_adapter_free(a);
    lp_adapter *b = lp_adapter_load(m, path, 1.0f, &err);
    CHECK_MSG(b != NULL, "%s", err.message);
    return b;
}

/* Rows with adapters 0, 1, 2 (ranks 4 and 8) in one batch == each alone;
 * packed (LP_W8, LP_W4; 0 = as loaded): the adapters stored as int8/int4
 * .lpa (the segmented integer path). */
static void test_mixed_batch(const char *base_path, const char *dir, uint32_t packed) {
    lp_error err;
    lp_model *m = lp_model_load(base_path, NULL, &err);
    CHECK(m != NULL);
    if (!m) return;
    char a1[512], a2[512];
    snprintf(a1, sizeof a1, "%s/a1.gguf", dir);
    snprintf(a2, sizeof a2, "%s/a2.gguf", dir);
    CHECK(lp_synth_lora_write(base_path, 4, 8, "q,k,v,o,gate,up,down", 11, a1, &err) == 0);
    CHECK(lp_synth_lora_write(base_path, 8, 4, "q,v,down", 12, a2, &err) == 0);
    lp_adapter *ad[3] = {NULL, lp_adapter_load(m, a1, 1.0f, &err), lp_adapter_load(m, a2, 0.5f, &err)};
    CHECK_MSG(ad[1] && ad[2], "%s", err.message);
    if (packed) {
        snprintf(a1, sizeof a1, "%s/a1-packed.lpa", dir);
        snprintf(a2, sizeof a2, "%s/a2-packed.lpa", dir);
        ad[1] = as_packed(m, ad[1], a1, packed);
        ad[2] = as_packed(m, ad[2], a2, packed);
        /* packed where the input width allows it (qwen2-tiny is 16 wide: F16) */
        CHECK(ad[1] && (pair_of(ad[1], 0, LP_PROJ_Q)->A.type == packed) == (m->hp.dim % 32 == 0));
    }
    if (!ad[1] || !ad[2]) return;
    int V = m->hp.n_vocab;
    int32_t prompts[3][5] = {{1, 5, 9, 13, 17}, {1, 30, 31, 32, 33}, {1, 7, 8, 9, 10}};
    float *alone = malloc((size_t)3 * 3 * V * sizeof(float));
    /* alone: every (prompt, adapter) pair in its own context */
    for (int s = 0; s < 3; s++)
        for (int a = 0; a < 3; a++) {
            lp_context *ctx = make_ctx(m, 2);
            if (a) CHECK(lp_context_bind_adapter(ctx, a, ad[a], &err) == 0);
            memcpy(alone + ((size_t)s * 3 + a) * V, prefill(ctx, prompts[s], 5, 0, a),
                   (size_t)V * sizeof(float));
            lp_context_free(ctx);
        }
    /* together: nine sequences (3 prompts x 3 adapters) interleaved in one batch */
    lp_context *ctx = make_ctx(m, 2);
    CHECK(lp_context_bind_adapter(ctx, 1, ad[1], &err) == 0);
    CHECK(lp_context_bind_adapter(ctx, 2, ad[2], &err) == 0);
    lp_row rows[45];
    int n = 0, last_row[9];
    for (int i = 0; i < 5; i++) /* ordered by position, so adapter groups interleave */
        for (int seq = 0; seq < 9; seq++) {
            int s = seq / 3, a = seq % 3;
            rows[n] = (lp_row){.token = prompts[s][i], .pos = i, .seq = seq, .adapter = a, .parent = i ? last_row[seq] : -1, .logits = i == 4, .commit = true};
            last_row[seq] = n++;
        }
    CHECK_MSG(lp_forward(ctx, rows, n, &err) == 0, "%s", err.message);
    for (int seq = 0; seq < 9; seq++) {
        int s = seq / 3, a = seq % 3;
        float d = max_diff(lp_logits(ctx, last_row[seq]), alone + ((size_t)s * 3 + a) * V, V);
        CHECK_MSG(d == 0.0f, "prompt %d adapter %d: mixed batch differs by %g (must be bit-identical)", s, a, d);
    }
    /* switching a slot's adapter is a pointer store and changes the result */
    double t0 = lp_now_seconds();
    for (int i = 0; i < 100000; i++) lp_context_bind_adapter(ctx, 1, ad[1 + (i & 1)], &err);
    double ns = (lp_now_seconds() - t0) / 100000 * 1e9;
    printf("slot switch: %.0f ns\n", ns);
    free(alone);
    lp_context_free(ctx);
    lp_adapter_free(ad[1]);
    lp_adapter_free(ad[2]);
    lp_model_free(m);
}

/* An int8 (W8) or int4 (W4) adapter moves the logits almost as its f32
 * source: the difference is a small fraction (bound) of the adapter's own
 * effect. */
static void test_packed_accuracy(const char *base_path, const char *dir, uint32_t packed, float bound) {
    lp_error err;
    lp_model *m = lp_model_load(base_path, NULL, &err);
    CHECK(m != NULL);
    if (!m) return;
    char src[512], dst[512];
    snprintf(src, sizeof src, "%s/acc.gguf", dir);
    snprintf(dst, sizeof dst, "%s/acc-packed.lpa", dir);
    int rank = m->hp.dim < 32 ? 8 : 32;
    CHECK(lp_synth_lora_write(base_path, rank, 2.0f * (float)rank, "q,k,v,o,gate,up,down", 21, src, &err) == 0);
    lp_adapter *f = lp_adapter_load(m, src, 1.0f, &err);
    lp_adapter *q = as_packed(m, lp_adapter_load(m, src, 1.0f, &err), dst, packed);
    CHECK(f && q);
    if (!f || !q) return;
    /* f32 -> int8 (+ f16 scales per 32), F16 where widths are not multiples of 32 */
    printf("adapter bytes: f32 %llu, packed %llu\n", (unsigned long long)f->bytes, (unsigned long long)q->bytes);
    uint64_t ratio = packed == LP_W4 ? 4 : 3; /* f32 -> 4.5 or 8.5 bits (F16 where not packable) */
    CHECK(m->hp.dim % 32 == 0 ? q->bytes * ratio < f->bytes : q->bytes < f->bytes);
    int V = m->hp.n_vocab;
    int32_t prompt[6] = {1, 40, 41, 42, 43, 44};
    float *out[3];
    const lp_adapter *which[3] = {NULL, f, q};
    for (int i = 0; i < 3; i++) {
        lp_context *ctx = make_ctx(m, 1);
        if (which[i]) CHECK(lp_context_bind_adapter(ctx, 1, which[i], &err) == 0);
        out[i] = malloc((size_t)V * sizeof(float));
        memcpy(out[i], prefill(ctx, prompt, 6, 0, which[i] ? 1 : 0), (size_t)V * sizeof(float));
        lp_context_free(ctx);
    }
    float effect = max_diff(out[0], out[1], V), error = max_diff(out[1], out[2], V);
    printf("%s: %s adapter error %.4g vs adapter effect %.4g\n", base_path, lp_dtype_name(packed), (double)error,
           (double)effect);
    CHECK(effect > 0.1f);
    CHECK_MSG(error < bound * effect, "%s adapter error %g is not small next to its effect %g", lp_dtype_name(packed),
              (double)error, (double)effect);
    for (int i = 0; i < 3; i++) free(out[i]);
    lp_adapter_free(f);
    lp_adapter_free(q);
    lp_model_free(m);
}

/* Two adapters with different ranks, targets and scales stacked into one
 * (lp_adapter_write_concat, the bench's all-adapters baseline) == the base
 * with both merged in. */
static void test_stacked(const char *base_path, const char *dir) {
    lp_error err;
    lp_model *m = lp_model_load(base_path, NULL, &err);
    CHECK(m != NULL);
    if (!m) return;
    char a1[512], a2[512], all[512], merged[512];
    snprintf(a1, sizeof a1, "%s/s1.gguf", dir);
    snprintf(a2, sizeof a2, "%s/s2.gguf", dir);
    snprintf(all, sizeof all, "%s/stacked.lpa", dir);
    snprintf(merged, sizeof merged, "%s/merged2.gguf", dir);
    CHECK(lp_synth_lora_write(base_path, 4, 8, "q,k,v,o,gate,up,down", 21, a1, &err) == 0);
    CHECK(lp_synth_lora_write(base_path, 8, 4, "q,v,down", 22, a2, &err) == 0);
    lp_adapter *ad[2] = {lp_adapter_load(m, a1, 1.0f, &err), lp_adapter_load(m, a2, 0.5f, &err)};
    CHECK_MSG(ad[0] && ad[1], "%s", err.message);
    lp_adapter *st = NULL;
    lp_model *mm = NULL;
    if (ad[0] && ad[1]) {
        CHECK_MSG(lp_adapter_write_concat((const lp_adapter *const *)ad, 2, all, &err) == 0, "%s", err.message);
        CHECK_MSG(lp_adapter_merge(m, (const lp_adapter *const *)ad, 2, merged, &err) == 0, "%s", err.message);
        st = lp_adapter_load(m, all, 1.0f, &err);
        mm = lp_model_load(merged, NULL, &err);
    }
    CHECK_MSG(st && mm, "%s", err.message);
    if (st && mm) {
        const lp_lora_pair *q0 = pair_of(st, 0, LP_PROJ_Q), *k0 = pair_of(st, 0, LP_PROJ_K);
        CHECK(q0->rank == 12 && k0->rank == 4 && st->n_pairs == m->n_weights);
        lp_context *cs = make_ctx_kv(m, 1, true), *cm = make_ctx_kv(mm, 1, true);
        CHECK(lp_context_bind_adapter(cs, 1, st, &err) == 0);
        int32_t toks[8] = {1, 40, 41, 42, 43, 44, 45, 46};
        int V = m->hp.n_vocab;
        float *ls = malloc((size_t)V * sizeof(float));
        memcpy(ls, prefill(cs, toks, 8, 0, 1), (size_t)V * sizeof(float));
        float d = max_diff(ls, prefill(cm, toks, 8, 0, 0), V);
        CHECK_MSG(d < 1e-4f, "stacked adapters vs both merged: logits differ by %g", d);
        free(ls);
        lp_context_free(cs);
        lp_context_free(cm);
    }
    lp_adapter_free(st);
    lp_model_free(mm);
    lp_adapter_free(ad[0]);
    lp_adapter_free(ad[1]);
    lp_model_free(m);
}

int main(void) {
    test_shared_lora();
    char dir[] = "/tmp/lp_lora_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    const uint32_t storage[3] = {0, LP_W8, LP_W4};
    for (int i = 0; i < 3; i++) {
        test_mixed_batch(LP_SHARED_MODELS "/stories260K.gguf", dir, storage[i]);
        test_mixed_batch(LP_SHARED_MODELS "/arch/qwen2-tiny-random.gguf", dir, storage[i]);
    }
    test_stacked(LP_SHARED_MODELS "/stories260K.gguf", dir);
    test_packed_accuracy(LP_SHARED_MODELS "/stories260K.gguf", dir, LP_W8, 0.05f);
    test_packed_accuracy(LP_SHARED_MODELS "/arch/qwen2-tiny-random.gguf", dir, LP_W8, 0.05f);
    test_packed_accuracy(LP_SHARED_MODELS "/stories260K.gguf", dir, LP_W4, 0.25f);
    test_packed_accuracy(LP_SHARED_MODELS "/arch/qwen2-tiny-random.gguf", dir, LP_W4, 0.25f);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return check_summary("lora_forward");
}
