/* Speculative decoding (forecast embeddings, candidate trees, prompt
 * lookup) is lossless:
 *   - a row verified in a tree (with siblings, rejected branches and
 *     forecast rows in the batch) has bit-identical logits to the same row
 *     decoded alone, and its committed KV gives the same next logits;
 *   - greedy speculative decoding == plain greedy decoding, token for token
 *     and text for text, on stories260K (with and without an adapter) and
 *     on a synth model, with random forecast embeddings (acceptance near
 *     zero), prompt lookup, both, stop strings and max_tokens cut mid-path,
 *     a repetition penalty, tight row / logit-row / length limits;
 *   - the KV a speculative request leaves equals plain decoding's: same
 *     length, same entries, bit-identical logits for a next row;
 *   - several speculative requests with different adapters and forecast
 *     sets in one engine == each alone; so are lp_generate_streams' streams
 *     speculating with the sets bound to their slots, and lp_generate;
 *   - speculative sampling's distribution is plain sampling's (a
 *     two-sample chi-square over independent seeds);
 *   - the .lpf reader's rejections and the engine's refusals. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "check.h"
#include "formats/le.h"
#include "formats/lpa.h"
#include "formats/lpf.h"
#include "runtime/context.h"
#include "tools/synth.h"

#define MODEL LP_SHARED_MODELS "/stories260K.gguf"
#define LORA LP_SHARED_MODELS "/stories260K-lora-r4-random-f32.gguf"
#define MAX_OUT 128


static float max_diff(const float *a, const float *b, int n) {
    float d = 0;
    for (int i = 0; i < n; i++) {
        float x = fabsf(a[i] - b[i]);
        if (!(x <= d)) d = x;
    }
    return d;
}

static lp_context *make_ctx(const lp_model *m, int max_seqs) {
    lp_context_params p = lp_context_default_params();
    p.n_threads = 2;
    p.max_rows = 256;
    p.max_logit_rows = 256;
    p.max_sequences = max_seqs;
    p.n_ctx = 2048;
    p.max_seq_len = 512;
    p.max_adapters = 4;
    lp_error err;
    lp_context *ctx = lp_context_create(m, &p, &err);
    if (!ctx) fprintf(stderr, "context: %s\n", err.message);
    return ctx;
}

static lp_forecast *random_forecast(const lp_model *m, int k, uint64_t seed, float scale) {
    lp_model_info info;
    lp_model_get_info(m, &info);
    float *e = malloc((size_t)k * (size_t)info.dim * sizeof *e);
    lp_rng rng;
    lp_rng_seed(&rng, seed);
    for (int i = 0; i < k * info.dim; i++) e[i] = scale * lp_rng_normal(&rng);
    lp_error err;
    lp_forecast *f = lp_forecast_create(m, k, e, NULL, &err);
    if (!f) fprintf(stderr, "forecast: %s\n", err.message);
    free(e);
    return f;
}

typedef struct result {
    int32_t tokens[MAX_OUT];
    int n;
    char text[2048];
    lp_request_stats stats;
    lp_spec_stats spec;
    int64_t steps;
} result;

static bool collect(void *user, int request, const char *text, size_t len) {
    (void)request;
    result *r = user;
    size_t have = strlen(r->text);
    if (have + len < sizeof r->text) {
        memcpy(r->text + have, text, len);
        r->text[have + len] = 0;
    }
    return true;
}

typedef struct job {
    const char *prompt;
    const lp_adapter *adapter;
    const lp_speculate *spec; /* NULL: plain */
    int max_tokens;
    const char *stop;
} job;

static lp_request make_request(const job *j, result *out) {
    lp_request q = lp_request_default();
    q.text = j->prompt;
    q.adapter = j->adapter;
    q.sampling.temperature = 0;
    q.max_tokens = j->max_tokens;
    q.speculate = j->spec;
    if (j->stop) {
        q.stop = &j->stop;
        q.n_stop = 1;
    }
    q.fn = collect;
    q.user = out;
    q.no_reuse = true;
    return q;
}

static void take_result(lp_engine *e, int id, result *out) {
    lp_engine_request_stats(e, id, &out->stats);
    lp_engine_request_spec_stats(e, id, &out->spec);
    int n;
    const int32_t *t = lp_engine_request_tokens(e, id, &n);
    out->n = n < MAX_OUT ? n : MAX_OUT;
    if (t) memcpy(out->tokens, t, (size_t)out->n * sizeof *t);
}

/* One job on a fresh engine over ctx (its KV kept in the context). */
static int run_one(lp_context *ctx, const job *j, result *out) {
    memset(out, 0, sizeof *out);
    lp_error err;
    lp_engine *e = lp_engine_create(ctx, NULL, &err);
    CHECK(e != NULL);
    if (!e) return -1;
    lp_request q = make_request(j, out);
    int id = lp_engine_submit(e, &q, &err);
    CHECK_MSG(id >= 0, "%s", err.message);
    if (id >= 0) {
        CHECK_MSG(lp_engine_run(e, &err) == 0, "%s", err.message);
        take_result(e, id, out);
    }
    lp_engine_counts(e, &out->steps, NULL);
    lp_engine_free(e);
    return 0;
}

static bool same(const result *a, const result *b) {
    return a->n == b->n && memcmp(a->tokens, b->tokens, (size_t)a->n * sizeof *a->tokens) == 0 &&
           strcmp(a->text, b->text) == 0 && strcmp(a->stats.stop_reason, b->stats.stop_reason) == 0;
}

static const char *const PROMPTS[] = {
    "Once upon a time, there was a little girl named Lily.",
    "Tom and his dog went to the park. Tom and his dog",
    "The sun was hot. The bird sang a song. The bird sang a",
    "One day",
};
#define N_PROMPTS 4

/* ---- tree rows vs rows alone, bit for bit ------------------------------------------ */

static void test_tree_rows_bitwise(const lp_model *m) {
    lp_error err;
    lp_model_info info;
    lp_model_get_info(m, &info);
    int V = info.n_vocab;
    int32_t prompt[12];
    for (int i = 0; i < 12; i++) prompt[i] = 1 + (i * 37) % (V - 1);
    /* plain: prompt, then 4 greedy tokens one row per forward; want[s]:
     * the logits after toks[0..s) */
    lp_context *a = make_ctx(m, 1), *b = make_ctx(m, 1);
    lp_row rows[64];
    for (int i = 0; i < 12; i++)
        rows[i] = (lp_row){.token = prompt[i], .pos = i, .parent = i - 1, .logits = i == 11, .commit = true};
    CHECK(lp_forward(a, rows, 12, &err) == 0 && lp_forward(b, rows, 12, &err) == 0);
    float *want = malloc((size_t)5 * V * sizeof(float));
    int32_t toks[5];
    for (int s = 0; s < 5; s++) {
        const float *lg = s == 0 ? lp_logits(a, 11) : lp_logits(a, 0);
        memcpy(want + (size_t)s * V, lg, (size_t)V * sizeof(float));
        int32_t best = 0;
        for (int t = 1; t < V; t++)
            if (lg[t] > lg[best]) best = t;
        toks[s] = best;
        if (s == 4) break;
        lp_row r = {.token = best, .pos = 12 + s, .parent = -1, .logits = true, .commit = true};
        CHECK(lp_forward(a, &r, 1, &err) == 0);
    }
    /* tree in b: root toks[0] at 12 with a wrong sibling, the true chain
     * toks[1..3] under it, a wrong branch, and forecast rows after each */
    float table[4 * 4096];
    for (int i = 0; i < 4 * info.dim && i < 4 * 4096; i++) table[i] = 0.01f * (float)((i * 7919) % 200 - 100);
    CHECK(info.dim <= 4096 && lp_context_bind_embeddings(b, 1, table, 4, &err) == 0);
    int n = 0;
    rows[n++] = (lp_row){.token = toks[0], .pos = 12, .parent = -1, .logits = true, .commit = true}; /* 0 */
    rows[n++] = (lp_row){.token = 0, .pos = 13, .parent = 0, .embd = 1, .logits = true};             /* 1 */
    rows[n++] = (lp_row){.token = (toks[1] + 1) % V, .pos = 13, .parent = 0, .logits = true};        /* 2 */
    rows[n++] = (lp_row){.token = toks[1], .pos = 13, .parent = 0, .logits = true};                  /* 3 */
    rows[n++] = (lp_row){.token = 1, .pos = 14, .parent = 1, .embd = 1, .logits = true};             /* 4 */
    rows[n++] = (lp_row){.token = toks[2], .pos = 14, .parent = 3, .logits = true};                  /* 5 */
    rows[n++] = (lp_row){.token = (toks[3] + 3) % V, .pos = 15, .parent = 5, .logits = true};        /* 6 */
    rows[n++] = (lp_row){.token = toks[3], .pos = 15, .parent = 5, .logits = true};                  /* 7 */
    rows[n++] = (lp_row){.token = 0, .pos = 16, .parent = 7, .embd = 1, .logits = true};             /* 8 */
    CHECK(lp_forward(b, rows, n, &err) == 0);
    int path[4] = {0, 3, 5, 7};
    for (int s = 0; s < 4; s++) {
        const float *got = lp_logits(b, path[s]);
        float d = got ? max_diff(got, want + (size_t)(s + 1) * V, V) : 1e9f;
        CHECK_MSG(d == 0, "tree row at depth %d differs from the row decoded alone by %g", s, d);
    }
    int commit[3] = {3, 5, 7};
    CHECK(lp_commit_rows(b, commit, 3, &err) == 0);
    CHECK(lp_seq_length(a, 0) == 16 && lp_seq_length(b, 0) == 16);
    for (int p = 0; p < 16; p++) {
        int32_t ta, tb;
        uint64_t ia, ib;
        CHECK(lp_seq_entry(a, 0, p, &ta, &ia) == 0 && lp_seq_entry(b, 0, p, &tb, &ib) == 0 && ta == tb && ia == ib);
    }
    lp_row next = {.token = toks[4], .pos = 16, .parent = -1, .logits = true, .commit = true};
    CHECK(lp_forward(a, &next, 1, &err) == 0 && lp_forward(b, &next, 1, &err) == 0);
    float dk = max_diff(lp_logits(a, 0), lp_logits(b, 0), V);
    CHECK_MSG(dk == 0, "the KV committed from a tree gives logits %g away from plain decoding's", dk);
    free(want);
    lp_context_free(a);
    lp_context_free(b);
}

/* ---- greedy speculative == plain ----------------------------------------------------- */

typedef struct spec_totals {
    int64_t passes, generated, accepted, drafted, plain_steps, spec_steps;
} spec_totals;

/* Every prompt: plain vs each speculation setting, on fresh contexts; the
 * KV each leaves must match too. */
static void compare_all(const lp_model *m, const lp_adapter *adapter, const lp_speculate *specs, int n_specs,
                        const char *const *names, const char *what, int max_tokens) {
    lp_error err;
    lp_model_info info;
    lp_model_get_info(m, &info);
    for (int s = 0; s < n_specs; s++) {
        spec_totals t = {0};
        for (int p = 0; p < N_PROMPTS; p++) {
            lp_context *ca = make_ctx(m, 1), *cb = make_ctx(m, 1);
            result *plain = calloc(1, sizeof *plain), *spec = calloc(1, sizeof *spec);
            job jp = {PROMPTS[p], adapter, NULL, max_tokens, NULL}, js = jp;
            js.spec = &specs[s];
            run_one(ca, &jp, plain);
            run_one(cb, &js, spec);
            CHECK_MSG(same(plain, spec), "%s, %s, prompt %d: speculative output differs from plain (%d vs %d tokens)",
                      what, names[s], p, spec->n, plain->n);
            /* the KV left behind: length, entries, next logits */
            int la = lp_seq_length(ca, 0), lb = lp_seq_length(cb, 0);
            CHECK_MSG(la == lb && la > 0, "%s, %s, prompt %d: KV length %d vs plain %d", what, names[s], p, lb, la);
            bool entries = la == lb;
            for (int i = 0; entries && i < la; i++) {
                int32_t x, y;
                uint64_t ix, iy;
                entries = lp_seq_entry(ca, 0, i, &x, &ix) == 0 && lp_seq_entry(cb, 0, i, &y, &iy) == 0 && x == y &&
                          ix == iy;
            }
            CHECK_MSG(entries, "%s, %s, prompt %d: KV entries differ", what, names[s], p);
            if (la == lb && la > 0) {
                lp_context_params cp;
                lp_context_get_params(ca, &cp);
                int slot = 0;
                if (adapter) {
                    CHECK(lp_context_bind_adapter(ca, 1, adapter, &err) == 0 &&
                          lp_context_bind_adapter(cb, 1, adapter, &err) == 0);
                    slot = 1;
                }
                lp_row next = {.token = 5, .pos = la, .adapter = slot, .parent = -1, .logits = true};
                CHECK(lp_forward(ca, &next, 1, &err) == 0 && lp_forward(cb, &next, 1, &err) == 0);
                float dk = max_diff(lp_logits(ca, 0), lp_logits(cb, 0), info.n_vocab);
                CHECK_MSG(dk == 0, "%s, %s, prompt %d: next-row logits over the left KV differ by %g", what,
                          names[s], p, dk);
            }
            t.passes += spec->spec.n_passes;
            t.generated += spec->spec.n_generated;
            t.accepted += spec->spec.n_accepted;
            t.drafted += spec->spec.n_drafted;
            t.plain_steps += plain->steps;
            t.spec_steps += spec->steps;
            CHECK(spec->spec.n_generated == spec->stats.n_generated);
            free(plain);
            free(spec);
            lp_context_free(ca);
            lp_context_free(cb);
        }
        printf("%s, %-22s: %lld tokens in %lld passes (%.2f tokens/pass), %lld of %lld drafts accepted; "
               "forwards %lld plain, %lld speculative\n",
               what, names[s], (long long)t.generated, (long long)t.passes,
               t.passes ? (double)t.generated / (double)t.passes : 0.0, (long long)t.accepted, (long long)t.drafted,
               (long long)t.plain_steps, (long long)t.spec_steps);
    }
}

static void test_greedy_equal(const lp_model *m, const lp_adapter *lora, const char *what, int max_tokens) {
    lp_forecast *f = random_forecast(m, 4, 7, 0.5f);
    CHECK(f != NULL);
    if (!f) return;
    lp_speculate sp[5] = {lp_speculate_default(), lp_speculate_default(), lp_speculate_default(),
                          lp_speculate_default(), lp_speculate_default()};
    const char *names[5] = {"nothing (root only)", "random forecast [3,2]", "random chain of 4", "lookup 3/8",
                            "random [3,2] + lookup"};
    sp[1].forecast = f, sp[1].depth = 2, sp[1].branches[0] = 3, sp[1].branches[1] = 2;
    sp[2].forecast = f, sp[2].depth = 4;
    for (int d = 0; d < 4; d++) sp[2].branches[d] = 1;
    sp[3].lookup_ngram = 3, sp[3].lookup_len = 8;
    sp[4] = sp[1];
    sp[4].lookup_ngram = 3, sp[4].lookup_len = 8;
    compare_all(m, NULL, sp, 5, names, what, max_tokens);
    if (lora) {
        char w[128];
        snprintf(w, sizeof w, "%s + LoRA", what);
        compare_all(m, lora, sp + 3, 2, names + 3, w, max_tokens);
    }
    lp_forecast_free(f);
}

/* max_tokens and stop strings that end a request inside an accepted path. */
static void test_cut_mid_path(const lp_model *m) {
    lp_speculate sp = lp_speculate_default();
    sp.lookup_ngram = 2, sp.lookup_len = 12;
    const char *prompt = "Tom and his dog went to the park. Tom and his dog went to the park. Tom and his dog";
    for (int n = 1; n <= 12; n++) {
        lp_context *ca = make_ctx(m, 1), *cb = make_ctx(m, 1);
        result *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
        job jp = {prompt, NULL, NULL, n, NULL}, js = {prompt, NULL, &sp, n, NULL};
        run_one(ca, &jp, a);
        run_one(cb, &js, b);
        CHECK_MSG(same(a, b), "max_tokens %d: speculative differs from plain", n);
        CHECK_MSG(lp_seq_length(ca, 0) == lp_seq_length(cb, 0), "max_tokens %d: KV %d vs plain %d", n,
                  lp_seq_length(cb, 0), lp_seq_length(ca, 0));
        free(a);
        free(b);
        lp_context_free(ca);
        lp_context_free(cb);
    }
    const char *stops[] = {"park", " the", ".", "dog went"};
    for (int i = 0; i < 4; i++) {
        lp_context *ca = make_ctx(m, 1), *cb = make_ctx(m, 1);
        result *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
        job jp = {prompt, NULL, NULL, 64, stops[i]}, js = {prompt, NULL, &sp, 64, stops[i]};
        run_one(ca, &jp, a);
        run_one(cb, &js, b);
        CHECK_MSG(same(a, b), "stop \"%s\": speculative differs from plain (\"%s\" vs \"%s\")", stops[i], b->text,
                  a->text);
        CHECK_MSG(lp_seq_length(ca, 0) == lp_seq_length(cb, 0), "stop \"%s\": KV %d vs plain %d", stops[i],
                  lp_seq_length(cb, 0), lp_seq_length(ca, 0));
        free(a);
        free(b);
        lp_context_free(ca);
        lp_context_free(cb);
    }
}

/* Prompt lookup on the demo world's `correct` task, where the output is
 * the input with its mistakes fixed: the first output word is the input's
 * first word without its leading space (a different BPE token: the loose
 * match), and after the output's first " the" the copy goes on from the
 * input's first " the" (the anchor), not its latest. The output is plain
 * decoding's; the passes are what those two rules give: the prefill, one
 * pass copying up to the doubled word (its bonus token drops it), one
 * for the rest. */
static void test_lookup_copy(void) {
    lp_error err;
    lp_model *m = lp_model_load(LP_SOURCE_DIR "/models/demo/base.gguf", NULL, &err);
    CHECK_MSG(m != NULL, "%s", err.message);
    if (!m) return;
    lp_adapter *a = lp_adapter_load(m, LP_SOURCE_DIR "/models/demo/adapters/correct.lpa", 1.0f, &err);
    CHECK_MSG(a != NULL, "%s", err.message);
    lp_speculate sp = lp_speculate_default();
    sp.lookup_ngram = 3, sp.lookup_len = 12;
    const char *prompt = "fix: In the evening the girl will make the the black apple.\n";
    lp_context *ca = make_ctx(m, 1), *cb = make_ctx(m, 1);
    result *plain = calloc(1, sizeof *plain), *spec = calloc(1, sizeof *spec);
    job jp = {prompt, a, NULL, 24, "\n"}, js = {prompt, a, &sp, 24, "\n"};
    run_one(ca, &jp, plain);
    run_one(cb, &js, spec);
    CHECK_MSG(strcmp(plain->text, "In the evening the girl will make the black apple.") == 0, "plain: \"%s\"",
              plain->text);
    CHECK_MSG(same(plain, spec), "lookup differs from plain (\"%s\")", spec->text);
    CHECK_MSG(spec->spec.n_passes == 3, "%d tokens in %d passes, want 3 passes", spec->spec.n_generated,
              spec->spec.n_passes);
    free(plain);
    free(spec);
    lp_context_free(ca);
    lp_context_free(cb);
    lp_adapter_free(a);
    lp_model_free(m);
}

/* Speculative requests with different adapters and forecast sets, and a
 * plain one, in one engine == each alone. */
static void test_mixed(const lp_model *m, const lp_adapter *lora, const lp_adapter *half) {
    lp_error err;
    lp_forecast *f1 = random_forecast(m, 2, 11, 0.5f), *f2 = random_forecast(m, 3, 12, 1.0f);
    lp_speculate s1 = lp_speculate_default(), s2 = lp_speculate_default(), s3 = lp_speculate_default();
    s1.forecast = f1, s1.depth = 2, s1.branches[0] = 3, s1.branches[1] = 2;
    s2.forecast = f2, s2.depth = 3, s2.branches[0] = 2, s2.branches[1] = 1, s2.branches[2] = 1;
    s2.lookup_ngram = 2, s2.lookup_len = 6;
    s3.lookup_ngram = 3, s3.lookup_len = 10;
    enum { N = 6 };
    job jobs[N] = {
        {PROMPTS[0], NULL, &s1, 40, NULL}, {PROMPTS[1], lora, &s2, 50, NULL}, {PROMPTS[2], half, &s3, 45, NULL},
        {PROMPTS[3], lora, &s1, 30, NULL}, {PROMPTS[1], NULL, NULL, 35, NULL}, {PROMPTS[2], half, &s2, 60, NULL},
    };
    result *alone = calloc(N, sizeof *alone), *together = calloc(N, sizeof *together);
    for (int i = 0; i < N; i++) {
        lp_context *c = make_ctx(m, 1);
        run_one(c, &jobs[i], &alone[i]);
        lp_context_free(c);
    }
    lp_context *ctx = make_ctx(m, 8);
    lp_engine *e = lp_engine_create(ctx, NULL, &err);
    int ids[N];
    for (int i = 0; i < N; i++) {
        lp_request q = make_request(&jobs[i], &together[i]);
        ids[i] = lp_engine_submit(e, &q, &err);
        CHECK_MSG(ids[i] >= 0, "%s", err.message);
    }
    CHECK_MSG(lp_engine_run(e, &err) == 0, "%s", err.message);
    for (int i = 0; i < N; i++) {
        take_result(e, ids[i], &together[i]);
        CHECK_MSG(same(&alone[i], &together[i]), "mixed batch: request %d differs from running alone", i);
    }
    lp_engine_free(e);
    lp_context_free(ctx);
    free(alone);
    free(together);
    lp_forecast_free(f1);
    lp_forecast_free(f2);
}

/* ---- lp_generate / lp_generate_streams with forecast sets bound to slots ------------------- */

typedef struct texts {
    char t[4][2048];
} texts;

static bool collect_stream(void *user, int stream, const char *text, size_t len) {
    texts *x = user;
    size_t have = strlen(x->t[stream]);
    if (have + len < sizeof x->t[stream]) {
        memcpy(x->t[stream] + have, text, len);
        x->t[stream][have + len] = 0;
    }
    return true;
}

static bool collect_one(void *user, const char *text, size_t len) { return collect_stream(user, 0, text, len); }

/* Three streams on three slots (base, lora, half), each speculating with the
 * forecast set bound to its slot, one of them sampling: the plain output,
 * stream for stream; lp_generate the same; the binding rules. */
static void test_generate_bound(const lp_model *m, const lp_model *other, const lp_adapter *lora,
                                const lp_adapter *half) {
    lp_error err;
    lp_context *ctx = make_ctx(m, 4);
    lp_forecast *f[3] = {random_forecast(m, 2, 21, 0.5f), random_forecast(m, 3, 22, 1.0f),
                         random_forecast(m, 4, 23, 0.7f)};
    CHECK(lp_context_bind_adapter(ctx, 1, lora, &err) == 0 && lp_context_bind_adapter(ctx, 2, half, &err) == 0);
    for (int i = 0; i < 3; i++) CHECK_MSG(lp_context_bind_forecast(ctx, i, f[i], &err) == 0, "%s", err.message);
    CHECK(lp_context_slot_forecast(ctx, 1) == f[1] && lp_context_slot_forecast(ctx, 3) == NULL);
    err.status = LP_OK;
    CHECK(lp_context_bind_forecast(ctx, 5, f[0], &err) < 0 && err.status == LP_ERR_INVALID);
    if (other) {
        lp_forecast *wrong = random_forecast(other, 2, 1, 1.0f);
        CHECK(lp_context_bind_forecast(ctx, 3, wrong, &err) < 0 && err.status == LP_ERR_FORMAT);
        lp_forecast_free(wrong);
    }
    /* a slot that changes adapter loses its forecast set; rebinding the same keeps it */
    CHECK(lp_context_bind_adapter(ctx, 3, lora, &err) == 0 && lp_context_bind_forecast(ctx, 3, f[1], &err) == 0);
    CHECK(lp_context_bind_adapter(ctx, 3, lora, &err) == 0 && lp_context_slot_forecast(ctx, 3) == f[1]);
    CHECK(lp_context_bind_adapter(ctx, 3, half, &err) == 0 && lp_context_slot_forecast(ctx, 3) == NULL);

    lp_sampler_params gp = lp_sampler_default_params(), sp_params = lp_sampler_default_params();
    gp.temperature = 0;
    sp_params.seed = 77;
    lp_sampler *sam[3] = {lp_sampler_create(m, &gp, &err), lp_sampler_create(m, &gp, &err),
                          lp_sampler_create(m, &sp_params, &err)};
    lp_stream streams[3] = {{.suffix = " The cat", .adapter = 0, .sampler = sam[0], .first_token = -1},
                            {.suffix = " Tom and his dog", .adapter = 1, .sampler = sam[1], .first_token = -1},
                            {.suffix = " One day", .adapter = 2, .sampler = sam[2], .first_token = -1}};
    int32_t prompt[64];
    int n_prompt = lp_tokenize(m, PROMPTS[0], strlen(PROMPTS[0]), true, false, prompt, 64, &err);
    CHECK(n_prompt > 0 && n_prompt < 64);
    lp_generate_params p = lp_generate_default_params();
    p.n_predict = 60;
    texts *plain = calloc(1, sizeof *plain), *spec = calloc(1, sizeof *spec);
    lp_stream_stats ps[3], ss[3];
    lp_generate_stats pst, sst;
    CHECK_MSG(lp_generate_streams(ctx, prompt, n_prompt, streams, 3, &p, collect_stream, plain, ps, &pst, &err) == 0,
              "%s", err.message);
    lp_speculate sp = lp_speculate_default(); /* no forecast named: each slot's */
    sp.depth = 3, sp.branches[0] = 3, sp.branches[1] = 2, sp.branches[2] = 1;
    sp.lookup_ngram = 2, sp.lookup_len = 6;
    p.speculate = &sp;
    lp_sampler_reset(sam[2], 77);
    CHECK_MSG(lp_generate_streams(ctx, prompt, n_prompt, streams, 3, &p, collect_stream, spec, ss, &sst, &err) == 0,
              "%s", err.message);
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(strcmp(plain->t[i], spec->t[i]) == 0 && ps[i].n_generated == ss[i].n_generated &&
                      strcmp(ps[i].stop_reason, ss[i].stop_reason) == 0,
                  "stream %d: speculative output differs from plain", i);
        CHECK(ps[i].spec.n_passes == 0 && ss[i].spec.n_passes > 0 && ss[i].spec.n_drafted > 0 &&
              ss[i].spec.n_generated == ss[i].n_generated);
    }
    /* every stream's forecast rows ran: depth cut to its set's k (2, 3, 3) */
    CHECK(ss[0].spec.n_forecast_rows > 0 && ss[1].spec.n_forecast_rows > 0 && ss[2].spec.n_forecast_rows > 0);
    CHECK(sst.spec.n_generated == sst.n_generated && sst.steps > sst.decode_steps && pst.spec.n_passes == 0);
    CHECK_MSG(strlen(plain->t[2]) > 0 && strcmp(plain->t[1], plain->t[2]) != 0, "the streams' texts prove nothing");

    /* one stream: lp_generate on slot 1, greedy and sampled */
    for (int sampled = 0; sampled < 2; sampled++) {
        lp_sampler *one = sampled ? sam[2] : sam[1];
        texts *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
        lp_generate_stats as, bs;
        p.prefix_adapter = 1;
        p.speculate = NULL;
        lp_sampler_reset(one, 5);
        CHECK(lp_generate(ctx, one, prompt, n_prompt, &p, collect_one, a, &as, &err) == 0);
        p.speculate = &sp;
        lp_sampler_reset(one, 5);
        CHECK_MSG(lp_generate(ctx, one, prompt, n_prompt, &p, collect_one, b, &bs, &err) == 0, "%s", err.message);
        CHECK_MSG(strcmp(a->t[0], b->t[0]) == 0 && as.n_generated == bs.n_generated && bs.spec.n_passes > 0,
                  "lp_generate (%s): speculative output differs", sampled ? "sampled" : "greedy");
        free(a);
        free(b);
    }
    /* a sampling sampler shared by two speculating streams is refused */
    streams[1].sampler = sam[2];
    p.prefix_adapter = 0;
    err.status = LP_OK;
    CHECK(lp_generate_streams(ctx, prompt, n_prompt, streams, 3, &p, collect_stream, spec, NULL, NULL, &err) < 0 &&
          err.status == LP_ERR_INVALID && strstr(err.message, "shared"));
    free(plain);
    free(spec);
    for (int i = 0; i < 3; i++) lp_sampler_free(sam[i]);
    lp_context_free(ctx);
    for (int i = 0; i < 3; i++) lp_forecast_free(f[i]);
}

/* A KV cache too small for everyone: preemption in the middle of
 * speculation changes no output. */
static void test_preempt(const lp_model *m) {
    lp_error err;
    lp_forecast *f = random_forecast(m, 2, 5, 0.5f);
    lp_speculate s = lp_speculate_default();
    s.forecast = f, s.depth = 2, s.branches[0] = 2, s.branches[1] = 2;
    s.lookup_ngram = 3, s.lookup_len = 8;
    enum { N = 4 };
    result *alone = calloc(N, sizeof *alone), *together = calloc(N, sizeof *together);
    job jobs[N];
    for (int i = 0; i < N; i++) jobs[i] = (job){PROMPTS[i], NULL, &s, 100, NULL};
    for (int i = 0; i < N; i++) {
        lp_context *c = make_ctx(m, 1);
        run_one(c, &jobs[i], &alone[i]);
        lp_context_free(c);
    }
    lp_context_params p = lp_context_default_params();
    p.n_threads = 2;
    p.max_rows = 256;
    p.max_logit_rows = 256;
    p.max_sequences = 4;
    p.n_ctx = 256; /* 4 requests of ~115 entries do not fit */
    p.max_seq_len = 200;
    lp_context *ctx = lp_context_create(m, &p, &err);
    lp_engine *e = lp_engine_create(ctx, NULL, &err);
    int ids[N];
    for (int i = 0; i < N; i++) {
        lp_request q = make_request(&jobs[i], &together[i]);
        q.drop_kv = true;
        ids[i] = lp_engine_submit(e, &q, &err);
    }
    CHECK_MSG(lp_engine_run(e, &err) == 0, "%s", err.message);
    int preempted = 0;
    for (int i = 0; i < N; i++) {
        take_result(e, ids[i], &together[i]);
        preempted += together[i].stats.n_preempted;
        CHECK_MSG(same(&alone[i], &together[i]), "preemption: request %d differs from running alone", i);
    }
    CHECK_MSG(preempted > 0, "the test meant to preempt");
    lp_engine_free(e);
    lp_context_free(ctx);
    free(alone);
    free(together);
    lp_forecast_free(f);
}

/* Little room: few rows and logit rows per batch (trees cut short, forecast
 * rows left out) and a short sequence limit (the request ends with
 * "context" inside a path). Output and KV length still equal plain. */
static void test_tight(const lp_model *m) {
    lp_error err;
    lp_forecast *f = random_forecast(m, 3, 9, 0.5f);
    lp_speculate s = lp_speculate_default();
    s.forecast = f, s.depth = 3, s.branches[0] = 3, s.branches[1] = 2, s.branches[2] = 2;
    s.lookup_ngram = 2, s.lookup_len = 10;
    int shapes[][3] = {{16, 8, 512}, {4, 2, 512}, {64, 64, 40}, {64, 64, 34}, {3, 3, 36}};
    for (int k = 0; k < 5; k++) {
        for (int p = 0; p < N_PROMPTS; p++) {
            result *res[2];
            int len[2];
            for (int v = 0; v < 2; v++) {
                lp_context_params cp = lp_context_default_params();
                cp.n_threads = 2;
                cp.max_rows = shapes[k][0];
                cp.max_logit_rows = shapes[k][1];
                cp.max_sequences = 1;
                cp.n_ctx = 1024;
                cp.max_seq_len = shapes[k][2];
                lp_context *ctx = lp_context_create(m, &cp, &err);
                CHECK_MSG(ctx != NULL, "%s", err.message);
                res[v] = calloc(1, sizeof *res[v]);
                job j = {PROMPTS[p], NULL, v ? &s : NULL, 100, NULL};
                run_one(ctx, &j, res[v]);
                len[v] = lp_seq_length(ctx, 0);
                lp_context_free(ctx);
            }
            CHECK_MSG(same(res[0], res[1]) && len[0] == len[1],
                      "rows %d, logit rows %d, sequence limit %d, prompt %d: speculative (%d tokens, %s, KV %d) != "
                      "plain (%d, %s, KV %d)", shapes[k][0], shapes[k][1], shapes[k][2], p, res[1]->n,
                      res[1]->stats.stop_reason, len[1], res[0]->n, res[0]->stats.stop_reason, len[0]);
            free(res[0]);
            free(res[1]);
        }
    }
    lp_forecast_free(f);
}

/* Greedy with a repetition penalty: the choice depends on the history,
 * which speculation extends token by token exactly as plain decoding. */
static void test_repeat_penalty(const lp_model *m) {
    lp_error err;
    lp_speculate s = lp_speculate_default();
    s.lookup_ngram = 2, s.lookup_len = 8;
    for (int p = 0; p < N_PROMPTS; p++) {
        result *res[2];
        for (int v = 0; v < 2; v++) {
            lp_context *ctx = make_ctx(m, 1);
            lp_engine *e = lp_engine_create(ctx, NULL, &err);
            res[v] = calloc(1, sizeof *res[v]);
            job j = {PROMPTS[p], NULL, v ? &s : NULL, 80, NULL};
            lp_request q = make_request(&j, res[v]);
            q.sampling.repeat_penalty = 1.3f;
            q.sampling.repeat_last_n = 16;
            int id = lp_engine_submit(e, &q, &err);
            CHECK_MSG(id >= 0 && lp_engine_run(e, &err) == 0, "%s", err.message);
            take_result(e, id, res[v]);
            lp_engine_free(e);
            lp_context_free(ctx);
        }
        CHECK_MSG(same(res[0], res[1]), "repeat penalty, prompt %d: speculative differs from plain", p);
        free(res[0]);
        free(res[1]);
    }
}

/* Sampling: the engine draws each token from its node's exact logits, one
 * draw per token in order, so for a seed the speculative output is the plain
 * sampler's token for token (and so has its distribution); drafts must
 * still be accepted now and then, or the tree path went untested. */
static void test_sampled_equal(const lp_model *m, const lp_adapter *lora) {
    lp_error err;
    lp_forecast *f = random_forecast(m, 2, 7, 0.5f);
    lp_speculate s = lp_speculate_default();
    s.forecast = f, s.depth = 2, s.branches[0] = 3, s.branches[1] = 2;
    s.lookup_ngram = 3, s.lookup_len = 8;
    int64_t accepted = 0, generated = 0, passes = 0;
    const float temps[3] = {0.5f, 0.8f, 1.2f};
    for (int p = 0; p < N_PROMPTS; p++)
        for (int k = 0; k < 3; k++) {
            result *res[2];
            for (int v = 0; v < 2; v++) {
                lp_context *ctx = make_ctx(m, 1);
                lp_engine *e = lp_engine_create(ctx, NULL, &err);
                res[v] = calloc(1, sizeof *res[v]);
                job j = {PROMPTS[p], p % 2 ? lora : NULL, v ? &s : NULL, 64, NULL};
                lp_request q = make_request(&j, res[v]);
                q.sampling.temperature = temps[k];
                q.sampling.top_k = k == 1 ? 40 : 0;
                q.sampling.top_p = k == 2 ? 0.9f : 1.0f;
                q.sampling.seed = 1000u + (uint64_t)(p * 3 + k);
                int id = lp_engine_submit(e, &q, &err);
                CHECK_MSG(id >= 0 && lp_engine_run(e, &err) == 0, "%s", err.message);
                take_result(e, id, res[v]);
                lp_engine_free(e);
                lp_context_free(ctx);
            }
            CHECK_MSG(same(res[0], res[1]), "temperature %.1f, prompt %d: speculative sampling differs from plain "
                      "sampling with the same seed", (double)temps[k], p);
            accepted += res[1]->spec.n_accepted;
            generated += res[1]->spec.n_generated;
            passes += res[1]->spec.n_passes;
            free(res[0]);
            free(res[1]);
        }
    printf("sampled, [3,2] + lookup: %lld tokens in %lld passes (%.2f tokens/pass), %lld drafts accepted\n",
           (long long)generated, (long long)passes, passes ? (double)generated / (double)passes : 0.0,
           (long long)accepted);
    CHECK_MSG(accepted > 0, "no draft was ever accepted under sampling: the tree path went untested");
    lp_forecast_free(f);
}

/* The statistical form of the same claim, without shared randomness:
 * N plain draws (seeds 0..N-1) and N speculative draws (seeds N..2N-1) of
 * the tokens after a prompt whose continuation prompt lookup drafts, so
 * accepted drafts carry some of them; a two-sample chi-square over the
 * tokens at each place (rare tokens pooled) stays below the 0.1 % critical
 * value. Seeds are fixed, so the test is deterministic. */
static double chi_square_critical(int df) {
    /* Wilson-Hilferty, z = 3.09 (alpha 0.001) */
    double a = 2.0 / (9.0 * df);
    return df * pow(1.0 - a + 3.09 * sqrt(a), 3);
}

static void test_sampled_distribution(const lp_model *m) {
    enum { N = 1200, PLACES = 3 };
    lp_error err;
    lp_model_info info;
    lp_model_get_info(m, &info);
    lp_speculate s = lp_speculate_default();
    s.lookup_ngram = 3, s.lookup_len = 6;
    int *count = calloc((size_t)2 * PLACES * (size_t)info.n_vocab, sizeof *count);
    /* requests in batches of BATCH: each has its own seeded sampler, so
     * its output is what it gives alone, and the steps are 1/BATCH as many */
    enum { BATCH = 16 };
    lp_context *ctx = make_ctx(m, BATCH);
    lp_engine *e = lp_engine_create(ctx, NULL, &err);
    result *res = calloc(BATCH, sizeof *res);
    int64_t accepted = 0;
    for (int v = 0; v < 2; v++)
        for (int i0 = 0; i0 < N; i0 += BATCH) {
            int ids[BATCH], n = N - i0 < BATCH ? N - i0 : BATCH;
            memset(res, 0, BATCH * sizeof *res);
            for (int i = 0; i < n; i++) {
                job j = {"Tom and his dog went to the park. Tom and his dog went to the park. Tom and his dog", NULL,
                         v ? &s : NULL, PLACES, NULL};
                lp_request q = make_request(&j, &res[i]);
                q.no_reuse = false; /* the prompt's KV is reused: the same output, faster */
                q.stop_at_eog = false;
                q.sampling.temperature = 0.6f, q.sampling.top_k = 0, q.sampling.top_p = 1.0f, q.sampling.min_p = 0;
                q.sampling.seed = (uint64_t)(v * N + i0 + i);
                ids[i] = lp_engine_submit(e, &q, &err);
                CHECK_MSG(ids[i] >= 0, "%s", err.message);
            }
            CHECK_MSG(lp_engine_run(e, &err) == 0, "%s", err.message);
            for (int i = 0; i < n; i++) {
                result *r = &res[i];
                take_result(e, ids[i], r);
                lp_engine_release(e, ids[i]);
                for (int t = 0; t < r->n && t < PLACES; t++)
                    count[((size_t)v * PLACES + t) * info.n_vocab + r->tokens[t]]++;
                accepted += r->spec.n_accepted;
            }
        }
    free(res);
    for (int t = 0; t < PLACES; t++) {
        const int *a = count + (size_t)t * info.n_vocab, *b = count + ((size_t)PLACES + t) * info.n_vocab;
        double chi = 0;
        int df = -1, pooled_a = 0, pooled_b = 0;
        for (int x = 0; x < info.n_vocab; x++) {
            if (a[x] + b[x] < 10) {
                pooled_a += a[x], pooled_b += b[x];
                continue;
            }
            chi += (double)(a[x] - b[x]) * (a[x] - b[x]) / (a[x] + b[x]);
            df++;
        }
        if (pooled_a + pooled_b > 0) {
            chi += (double)(pooled_a - pooled_b) * (pooled_a - pooled_b) / (pooled_a + pooled_b);
            df++;
        }
        printf("sampled distribution, token %d: chi-square %.2f, %d degrees of freedom (critical %.2f)\n", t + 1,
               chi, df, df > 0 ? chi_square_critical(df) : 0.0);
        CHECK_MSG(df >= 2, "token %d: too few distinct tokens to test anything", t + 1);
        CHECK_MSG(df < 1 || chi < chi_square_critical(df),
                  "token %d: speculative sampling's distribution differs from plain sampling's (chi-square %.2f)",
                  t + 1, chi);
    }
    printf("sampled distribution: %lld drafts accepted\n", (long long)accepted);
    CHECK_MSG(accepted > N / 20, "only %lld drafts accepted: the test does not exercise the tree", (long long)accepted);
    lp_engine_free(e);
    lp_context_free(ctx);
    free(count);
}

/* The cost model only changes which candidates are placed, never the
 * output: a flat cost places them all (the same passes as no model), a
 * linear one (r rows cost r) none, one in between some; the measured costs
 * are sane and leave the context as they found it. */
static void spec_totals_of(const lp_model *m, const lp_adapter *a, const lp_speculate *sp, lp_spec_stats *sum) {
    *sum = (lp_spec_stats){0};
    for (int p = 0; p < N_PROMPTS; p++) {
        lp_context *ctx = make_ctx(m, 1);
        result *res = calloc(1, sizeof *res);
        job j = {PROMPTS[p], a, sp, 64, NULL};
        run_one(ctx, &j, res);
        sum->n_passes += res->spec.n_passes;
        sum->n_generated += res->spec.n_generated;
        sum->n_drafted += res->spec.n_drafted;
        sum->n_accepted += res->spec.n_accepted;
        free(res);
        lp_context_free(ctx);
    }
}

static void test_cost_model(const lp_model *m, const lp_adapter *lora) {
    lp_error err;
    lp_forecast *f = random_forecast(m, 2, 7, 0.5f);
    lp_speculate sp[4];
    for (int i = 0; i < 4; i++) {
        sp[i] = lp_speculate_default();
        sp[i].forecast = f, sp[i].depth = 2, sp[i].branches[0] = 3, sp[i].branches[1] = 2;
        sp[i].lookup_ngram = 3, sp[i].lookup_len = 8;
    }
    for (int r = 0; r < LP_SPEC_COST_ROWS; r++) {
        sp[1].pass_cost[r] = 1.0f;                    /* flat */
        sp[2].pass_cost[r] = (float)(r + 1);          /* linear */
        sp[3].pass_cost[r] = 1.0f + 0.04f * (float)r; /* in between */
    }
    const char *names[4] = {"no cost model", "flat cost", "linear cost", "1 + 0.04 per row"};
    compare_all(m, lora, sp, 4, names, "cost model", 64);
    lp_spec_stats t[4];
    for (int i = 0; i < 4; i++) spec_totals_of(m, lora, &sp[i], &t[i]);
    CHECK_MSG(t[1].n_passes == t[0].n_passes && t[1].n_drafted == t[0].n_drafted,
              "a flat cost placed %d candidates in %d passes, without a model %d in %d", t[1].n_drafted,
              t[1].n_passes, t[0].n_drafted, t[0].n_passes);
    CHECK_MSG(t[2].n_drafted == 0 && t[2].n_passes == t[2].n_generated,
              "a linear cost still placed %d candidates", t[2].n_drafted);
    CHECK_MSG(t[3].n_drafted > 0 && t[3].n_drafted < t[0].n_drafted && t[3].n_accepted > 0,
              "1 + 0.04 per row placed %d of %d candidates (%d accepted)", t[3].n_drafted, t[0].n_drafted,
              t[3].n_accepted);
    printf("cost model 1 + 0.04/row: %d candidates placed (of %d without), %.2f tokens per pass (%.2f without)\n",
           t[3].n_drafted, t[0].n_drafted, (double)t[3].n_generated / t[3].n_passes,
           (double)t[0].n_generated / t[0].n_passes);

    /* lookup alone at 1 + 0.6 per row: a candidate at the prior (1/2) does
     * not pay, one sure to be accepted would; the engine tries one every
     * few passes, so counts can rise, and the output stays plain's */
    lp_speculate ex = lp_speculate_default();
    ex.lookup_ngram = 3, ex.lookup_len = 8;
    for (int r = 0; r < LP_SPEC_COST_ROWS; r++) ex.pass_cost[r] = 1.0f + 0.6f * (float)r;
    const char *ex_name[1] = {"1 + 0.6 per row, lookup"};
    compare_all(m, lora, &ex, 1, ex_name, "cost model", 64);
    lp_spec_stats te;
    spec_totals_of(m, lora, &ex, &te);
    CHECK_MSG(te.n_drafted > 0 && te.n_drafted * 4 < te.n_passes && te.n_accepted > 0,
              "1 + 0.6 per row: %d candidates (%d accepted) in %d passes", te.n_drafted, te.n_accepted, te.n_passes);

    /* a table that is not a cost */
    lp_context *ctx = make_ctx(m, 1);
    lp_engine *e = lp_engine_create(ctx, NULL, &err);
    lp_request q = lp_request_default();
    q.text = "Hello";
    lp_speculate bad = sp[3];
    bad.pass_cost[5] = 0.5f;
    q.speculate = &bad;
    CHECK(lp_engine_submit(e, &q, &err) < 0 && err.status == LP_ERR_INVALID && strstr(err.message, "pass_cost[5]"));
    bad.pass_cost[5] = NAN;
    CHECK(lp_engine_submit(e, &q, &err) < 0 && err.status == LP_ERR_INVALID);
    lp_engine_free(e);

    /* measured: 1 for one row, then positive and non-decreasing; the sequence left empty */
    float cost[LP_SPEC_COST_ROWS];
    lp_context_params cp;
    lp_context_get_params(ctx, &cp);
    CHECK_MSG(lp_speculate_measure_cost(ctx, 32, cost, LP_SPEC_COST_ROWS, &err) == 0, "%s", err.message);
    bool sane = cost[0] == 1;
    for (int r = 1; r < LP_SPEC_COST_ROWS; r++) sane &= cost[r] >= cost[r - 1] && isfinite(cost[r]);
    CHECK_MSG(sane, "measured costs: %g %g ... %g", (double)cost[0], (double)cost[1], (double)cost[63]);
    CHECK(lp_seq_length(ctx, cp.max_sequences - 1) == 0);
    lp_row row = {.token = 3, .pos = 0, .seq = cp.max_sequences - 1, .parent = -1, .commit = true};
    CHECK(lp_forward(ctx, &row, 1, &err) == 0);
    CHECK(lp_speculate_measure_cost(ctx, 32, cost, 8, &err) != 0 && strstr(err.message, "in use"));
    CHECK(lp_speculate_measure_cost(ctx, 32, cost, LP_SPEC_COST_ROWS + 1, &err) != 0 && err.status == LP_ERR_INVALID);
    lp_context_free(ctx);
    lp_forecast_free(f);
}

/* The engine refuses what it cannot do exactly. */
static void test_refusals(const lp_model *m) {
    lp_error err;
    lp_context *ctx = make_ctx(m, 1);
    lp_engine *e = lp_engine_create(ctx, NULL, &err);
    lp_forecast *f = random_forecast(m, 2, 1, 0.5f);
    lp_speculate s = lp_speculate_default();
    s.forecast = f, s.depth = 2, s.branches[0] = 2, s.branches[1] = 1;
    lp_request q = lp_request_default();
    q.text = "Hello";
    q.speculate = &s;
    lp_sampler_params sampler_params = lp_sampler_default_params();
    lp_sampler *borrowed = lp_sampler_create(m, &sampler_params, &err);
    q.sampler = borrowed; /* a borrowed sampler no one else uses is fine ... */
    int first = lp_engine_submit(e, &q, &err);
    CHECK_MSG(first >= 0, "%s", err.message);
    lp_request plain = lp_request_default();
    plain.text = "Hi";
    plain.sampler = borrowed; /* ... shared, the two requests' draws would interleave */
    err.status = LP_OK;
    CHECK(lp_engine_submit(e, &plain, &err) < 0 && err.status == LP_ERR_INVALID && strstr(err.message, "shared"));
    lp_sampler_params greedy_params = lp_sampler_default_params();
    greedy_params.temperature = 0;
    lp_sampler *greedy = lp_sampler_create(m, &greedy_params, &err);
    plain.sampler = q.sampler = greedy; /* a greedy one draws nothing: sharing it is fine */
    CHECK(lp_engine_submit(e, &plain, &err) >= 0 && lp_engine_submit(e, &q, &err) >= 0);
    q.sampler = NULL;
    s.depth = 3; /* more than the set has */
    CHECK(lp_engine_submit(e, &q, &err) < 0 && err.status == LP_ERR_INVALID);
    s.depth = 2;
    s.branches[1] = 0;
    CHECK(lp_engine_submit(e, &q, &err) < 0 && err.status == LP_ERR_INVALID);
    s.branches[1] = 1;
    s.lookup_ngram = 2; /* without a length */
    CHECK(lp_engine_submit(e, &q, &err) < 0 && err.status == LP_ERR_INVALID);
    s.lookup_ngram = 0;
    int id = lp_engine_submit(e, &q, &err);
    CHECK_MSG(id >= 0, "%s", err.message);
    CHECK(lp_engine_run(e, &err) == 0);
    lp_engine_free(e);
    lp_context_free(ctx);
    lp_forecast_free(f);
    lp_sampler_free(borrowed);
    lp_sampler_free(greedy);
}

/* ---- the .lpf reader ----------------------------------------------------------------- */

static uint8_t *image_of(const lp_forecast *f, size_t *size) {
    char path[] = "/tmp/lp_test_lpf_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return NULL;
    close(fd);
    lp_error err;
    uint8_t *buf = NULL;
    if (lp_forecast_save(f, path, &err) == 0) {
        FILE *fp = fopen(path, "rb");
        fseek(fp, 0, SEEK_END);
        *size = (size_t)ftell(fp);
        fseek(fp, 0, SEEK_SET);
        buf = malloc(*size);
        if (fread(buf, 1, *size, fp) != *size) {
            free(buf);
            buf = NULL;
        }
        fclose(fp);
    }
    unlink(path);
    return buf;
}

static bool rejects(const uint8_t *img, size_t size, const char *needle) {
    lp_error err = {0};
    lp_forecast *f = lp_forecast_from_memory(img, size, "bad.lpf", &err);
    bool ok = !f && err.status == LP_ERR_FORMAT && strstr(err.message, "bad.lpf") &&
              (!needle || strstr(err.message, needle));
    if (!ok) fprintf(stderr, "expected a rejection (%s), got: %s\n", needle ? needle : "", f ? "accepted" : err.message);
    lp_forecast_free(f);
    return ok;
}

static void test_lpf(const lp_model *m, const lp_model *other) {
    lp_error err;
    lp_model_info info;
    lp_model_get_info(m, &info);
    float *e = malloc((size_t)3 * info.dim * sizeof *e);
    for (int i = 0; i < 3 * info.dim; i++) e[i] = (float)i * 0.001f - 0.1f;
    lp_forecast *f = lp_forecast_create(m, 3, e, "correct", &err);
    CHECK_MSG(f != NULL, "%s", err.message);
    size_t size = 0;
    uint8_t *img = image_of(f, &size);
    CHECK(img && size == 64 + 8 + (size_t)3 * info.dim * 4);
    lp_forecast *g = lp_forecast_from_memory(img, size, "good.lpf", &err);
    CHECK_MSG(g != NULL, "%s", err.message);
    CHECK(g && lp_forecast_k(g) == 3 && lp_forecast_dim(g) == info.dim &&
          strcmp(lp_forecast_adapter_name(g), "correct") == 0 &&
          memcmp(lp_forecast_data(g), e, (size_t)3 * info.dim * sizeof *e) == 0);
    CHECK(lp_forecast_check(g, m, &err) == 0);
    CHECK(other && lp_forecast_check(g, other, &err) != 0 && err.status == LP_ERR_FORMAT);
    lp_forecast_free(g);

    uint8_t *b = malloc(size + 8);
    #define MUTATE(stmt, sz, needle) do { memcpy(b, img, size); stmt; CHECK(rejects(b, sz, needle)); } while (0)
    MUTATE((void)0, 10, "too short");
    MUTATE((void)0, size - 1, "bytes");
    MUTATE(memset(b + size, 0, 8), size + 8, "bytes");
    MUTATE(b[0] = 'X', size, "magic");
    MUTATE(lp_le_put_u32(b + 4, LP_LPF_VERSION + 1), size, "version");
    MUTATE(lp_le_put_u32(b + 4, 0), size, "version");
    MUTATE(b[40] = 1, size, "reserved"); /* version 1: no corpus count */
    MUTATE(lp_le_put_u32(b + 8, 0), size, "out of range");
    MUTATE(lp_le_put_u32(b + 12, 0), size, "out of range");
    MUTATE(lp_le_put_u32(b + 12, 1000), size, "out of range");
    MUTATE(lp_le_put_u32(b + 8, 0xffffffffu), size, "out of range");
    MUTATE(lp_le_put_u32(b + 12, 4), size, "bytes"); /* k says more than there is */
    MUTATE(lp_le_put_u32(b + 20, 300), size, "name");
    MUTATE(lp_le_put_u32(b + 20, 9), size, "bytes");
    MUTATE(b[50] = 1, size, "reserved");
    MUTATE(b[64] = 0xff, size, "UTF-8");
    MUTATE(b[64] = 0, size, "UTF-8");
    MUTATE(b[71] = 1, size, "padding");
    MUTATE(b[size - 1] ^= 1, size, "checksum");
    {   /* a NaN with a matching checksum */
        memcpy(b, img, size);
        lp_le_put_f32(b + 72, __builtin_nanf(""));
        lp_le_put_u64(b + 32, lp_lpa_hash(LP_LPA_HASH_SEED, b + 72, size - 72));
        CHECK(rejects(b, size, "finite"));
    }
    #undef MUTATE
    CHECK(rejects(NULL, 0, NULL));
    lp_forecast *none = lp_forecast_load("/nonexistent/x.lpf", &err);
    CHECK(!none && err.status == LP_ERR_IO && strstr(err.message, "/nonexistent/x.lpf"));
    /* creation refuses what it could not save */
    e[5] = __builtin_inff();
    CHECK(lp_forecast_create(m, 3, e, NULL, &err) == NULL && err.status == LP_ERR_INVALID);
    CHECK(lp_forecast_create(m, 0, e, NULL, &err) == NULL);
    free(b);
    free(img);
    free(e);
    lp_forecast_free(f);
}

/* A forecast set with a draft corpus: the n-gram table's choices, the
 * version 2 file (round trip, every rejection), and greedy speculation
 * that drafts from it == plain decoding, in fewer passes when the corpus
 * holds the continuation itself. */
/* Sets token i of a corpus packed at `bits` bits to v. */
static void put_bits(uint8_t *p, int i, int bits, uint32_t v) {
    for (int j = 0; j < bits; j++) {
        size_t bit = (size_t)i * (size_t)bits + (size_t)j;
        p[bit / 8] = (uint8_t)((p[bit / 8] & ~(1u << (bit % 8))) | ((v >> j & 1u) << (bit % 8)));
    }
}

static void test_lpf_corpus(const lp_model *m) {
    lp_error err;
    lp_model_info info;
    lp_model_get_info(m, &info);
    lp_forecast *f = random_forecast(m, 2, 21, 0.5f);
    /* a b c | a b d | a b c | e f | x : after "a b" c (2 of 3); after "b" c;
     * after "f" nothing (a single token seen once); after "z a b" the
     * longest context seen decides ("a b") */
    const int32_t a = 10, b_ = 11, c = 12, d = 13, e = 14, ff = 15;
    const int32_t corpus[] = {a, b_, c, -1, a, b_, d, -1, a, b_, c, -1, e, ff, -1, 30};
    CHECK_MSG(lp_forecast_set_corpus(f, corpus, 16, &err) == 0, "%s", err.message);
    CHECK(lp_forecast_corpus_size(f) == 16);
    const int32_t h1[] = {a, b_}, h2[] = {b_}, h3[] = {ff}, h4[] = {99, a, b_}, h5[] = {e};
    CHECK(lp_forecast_ngram_next(f, h1, 2) == c);
    CHECK(lp_forecast_ngram_next(f, h2, 1) == c);
    CHECK(lp_forecast_ngram_next(f, h3, 1) == -1);
    CHECK(lp_forecast_ngram_next(f, h4, 3) == c);
    CHECK(lp_forecast_ngram_next(f, h5, 1) == -1);
    const int32_t bad1[] = {a, (int32_t)info.n_vocab}, bad2[] = {a, -2};
    CHECK(lp_forecast_set_corpus(f, bad1, 2, &err) != 0 && err.status == LP_ERR_INVALID);
    CHECK(lp_forecast_set_corpus(f, bad2, 2, &err) != 0 && err.status == LP_ERR_INVALID);
    CHECK(lp_forecast_corpus_size(f) == 16); /* a refused corpus leaves the old one */

    size_t size = 0;
    uint8_t *img = image_of(f, &size);
    int bits = lp_lpf_token_bits((uint32_t)info.n_vocab);
    size_t corpus_at = 64 + (size_t)2 * info.dim * 4, packed = (16 * (size_t)bits + 7) / 8;
    CHECK(img && size == corpus_at + packed && size == lp_lpf_file_bytes(2, info.dim, 0, info.n_vocab, 16, 0));
    CHECK(img && lp_le_get_u32(img + 4) == 3 && lp_le_get_u32(img + 40) == 16 && lp_le_get_u32(img + 44) == (uint32_t)bits);
    lp_forecast *g = img ? lp_forecast_from_memory(img, size, "corpus.lpf", &err) : NULL;
    CHECK_MSG(g != NULL, "%s", err.message);
    CHECK(g && lp_forecast_corpus_size(g) == 16 && lp_forecast_ngram_next(g, h1, 2) == c &&
          lp_forecast_ngram_next(g, h3, 1) == -1);
    lp_forecast_free(g);
    /* version 2 (u32 tokens) still reads */
    size_t size2 = corpus_at + 16 * 4;
    uint8_t *v2 = calloc(1, size2);
    if (img && v2) {
        memcpy(v2, img, corpus_at);
        lp_le_put_u32(v2 + 4, 2);
        lp_le_put_u32(v2 + 44, 0);
        for (int i = 0; i < 16; i++) lp_le_put_u32(v2 + corpus_at + 4 * i, corpus[i] < 0 ? 0xffffffffu : (uint32_t)corpus[i]);
        lp_le_put_u64(v2 + 32, lp_lpa_hash(LP_LPA_HASH_SEED, v2 + 64, size2 - 64));
        g = lp_forecast_from_memory(v2, size2, "corpus-v2.lpf", &err);
        CHECK_MSG(g && lp_forecast_corpus_size(g) == 16 && lp_forecast_ngram_next(g, h1, 2) == c, "version 2: %s",
                  err.message);
        lp_forecast_free(g);
        lp_le_put_u32(v2 + corpus_at + 4, (uint32_t)info.n_vocab);
        lp_le_put_u64(v2 + 32, lp_lpa_hash(LP_LPA_HASH_SEED, v2 + 64, size2 - 64));
        CHECK(rejects(v2, size2, "vocabulary"));
    }
    free(v2);
    uint8_t *bb = malloc(size + 4);
    #define REHASH() lp_le_put_u64(bb + 32, lp_lpa_hash(LP_LPA_HASH_SEED, bb + 64, size - 64))
    #define MUTATE(stmt, sz, needle) do { memcpy(bb, img, size); stmt; CHECK(rejects(bb, sz, needle)); } while (0)
    /* token 1 (b_) := n_vocab, token 0 (a) := all ones but one bit */
    MUTATE((put_bits(bb + corpus_at, 1, bits, (uint32_t)info.n_vocab), REHASH()), size, "vocabulary");
    MUTATE((put_bits(bb + corpus_at, 0, bits, (1u << bits) - 2), REHASH()), size, "vocabulary");
    MUTATE(bb[corpus_at] ^= 1, size, "checksum");
    MUTATE(lp_le_put_u32(bb + 40, 15), size, "bytes");
    MUTATE(lp_le_put_u32(bb + 40, LP_LPF_MAX_CORPUS + 1), size, "corpus");
    MUTATE(lp_le_put_u32(bb + 16, 0), size, "corpus"); /* a corpus needs the vocabulary */
    MUTATE(lp_le_put_u32(bb + 44, (uint32_t)bits + 1), size, "bits");
    MUTATE(lp_le_put_u32(bb + 44, 32), size, "bits");
    MUTATE(bb[48] = 1, size, "reserved");
    if ((16 * bits) % 8) MUTATE((bb[size - 1] |= 0x80, REHASH()), size, "after the last");
    MUTATE((bb[size] = 0, REHASH()), size + 1, "bytes");
    #undef MUTATE
    #undef REHASH
    free(bb);
    free(img);

    /* the corpus holds the plain continuation of a prompt: the n-gram chain
     * drafts it; the output stays plain decoding's */
    const char *prompt = PROMPTS[0];
    lp_context *ca = make_ctx(m, 1), *cb = make_ctx(m, 1), *cc = make_ctx(m, 1);
    result *plain = calloc(1, sizeof *plain), *spec = calloc(1, sizeof *spec), *off = calloc(1, sizeof *off);
    job jp = {prompt, NULL, NULL, 48, NULL};
    run_one(ca, &jp, plain);
    int32_t pt[256];
    int np = lp_tokenize(m, prompt, strlen(prompt), true, false, pt, 256, &err);
    int32_t *cor = malloc((size_t)(3 + plain->n + 1) * sizeof *cor);
    int nc = 0;
    for (int i = np - 3; i < np; i++) cor[nc++] = pt[i];
    for (int i = 0; i < plain->n; i++) cor[nc++] = plain->tokens[i];
    cor[nc++] = -1;
    CHECK(np >= 3 && lp_forecast_set_corpus(f, cor, nc, &err) == 0);
    lp_speculate sp = lp_speculate_default();
    sp.forecast = f, sp.depth = 2, sp.branches[0] = 2, sp.branches[1] = 1;
    job js = {prompt, NULL, &sp, 48, NULL};
    run_one(cb, &js, spec);
    CHECK_MSG(same(plain, spec), "n-gram drafts: speculative differs from plain");
    CHECK_MSG(spec->spec.n_passes * 3 <= spec->spec.n_generated, "n-gram drafts: %d tokens in %d passes",
              spec->spec.n_generated, spec->spec.n_passes);
    sp.ngram_len = -1; /* off: the random embeddings alone */
    job jo = {prompt, NULL, &sp, 48, NULL};
    run_one(cc, &jo, off);
    CHECK(same(plain, off) && off->spec.n_passes > spec->spec.n_passes * 2);
    sp.ngram_len = LP_SPEC_MAX_NODES + 1;
    lp_engine *en = lp_engine_create(cc, NULL, &err);
    result tmp;
    lp_request q = make_request(&jo, &tmp);
    CHECK(en && lp_engine_submit(en, &q, &err) < 0 && strstr(err.message, "ngram_len"));
    lp_engine_free(en);
    free(cor);
    free(plain);
    free(spec);
    free(off);
    lp_context_free(ca);
    lp_context_free(cb);
    lp_context_free(cc);
    lp_forecast_free(f);
}

/* ---- a synth model ------------------------------------------------------------------- */

/* ---- the KV prefix: forecast rows alone attend to it --------------------------------------- */

/* A random KV prefix of n entries for m: [layers][2][n][kv_dim]. */
static float *random_prefix(const lp_model *m, int n, uint64_t seed, size_t *count) {
    lp_model_info info;
    lp_model_get_info(m, &info);
    *count = (size_t)info.n_layers * 2 * (size_t)n * (size_t)(info.n_kv_heads * info.head_dim);
    float *kv = malloc(*count * sizeof *kv);
    lp_rng rng;
    lp_rng_seed(&rng, seed);
    for (size_t i = 0; kv && i < *count; i++) kv[i] = lp_rng_normal(&rng);
    return kv;
}

/* A row of embedding table 1 over a KV prefix equals the same row after a
 * sequence whose committed KV is that prefix, bit for bit (f32 KV); a token
 * row's logits do not change when a prefix is bound; the prefix round-trips
 * through an .lpf file (version 4) and is checked against the model;
 * speculation with a random prefix stays lossless. */
static void test_kv_prefix(const lp_model *m, const lp_model *other) {
    enum { P = 5 };
    lp_error err;
    lp_model_info info;
    lp_model_get_info(m, &info);
    int kv_dim = info.n_kv_heads * info.head_dim;
    lp_context_params cp = lp_context_default_params();
    cp.n_threads = 2, cp.max_rows = 16, cp.max_sequences = 1, cp.n_ctx = 256, cp.max_seq_len = 64, cp.kv_f32 = true;
    lp_context *a = lp_context_create(m, &cp, &err), *b = lp_context_create(m, &cp, &err);
    CHECK(a && b);
    if (!a || !b) return;
    float *table = malloc((size_t)info.dim * sizeof *table);
    lp_rng rng;
    lp_rng_seed(&rng, 9);
    for (int i = 0; i < info.dim; i++) table[i] = 0.5f * lp_rng_normal(&rng);
    CHECK(lp_context_bind_embeddings(a, 1, table, 1, &err) == 0 && lp_context_bind_embeddings(b, 1, table, 1, &err) == 0);
    /* sequence 0 of a: P tokens; their keys and values become b's prefix */
    lp_row rows[P + 1];
    const int32_t toks[P] = {1, 403, 89, 17, 250};
    for (int i = 0; i < P; i++) rows[i] = (lp_row){.token = toks[i], .pos = i, .parent = i - 1, .commit = true};
    CHECK(lp_forward(a, rows, P, &err) == 0);
    float *kv = malloc((size_t)info.n_layers * 2 * P * (size_t)kv_dim * sizeof *kv);
    for (int l = 0; l < info.n_layers; l++) {
        memcpy(kv + (size_t)l * 2 * P * kv_dim, lp_batch_keys(a, l), (size_t)P * kv_dim * sizeof *kv);
        memcpy(kv + ((size_t)l * 2 + 1) * P * kv_dim, lp_batch_values(a, l), (size_t)P * kv_dim * sizeof *kv);
    }
    lp_row fr = {.token = 0, .embd = 1, .pos = P, .parent = -1, .logits = true};
    lp_row tr = {.token = 42, .pos = 0, .parent = -1, .logits = true};
    CHECK(lp_forward(a, &fr, 1, &err) == 0);
    float *want = malloc((size_t)info.n_vocab * sizeof *want), *plain = malloc((size_t)info.n_vocab * sizeof *plain);
    memcpy(want, lp_logits(a, 0), (size_t)info.n_vocab * sizeof *want);
    CHECK(lp_forward(b, &tr, 1, &err) == 0);
    memcpy(plain, lp_logits(b, 0), (size_t)info.n_vocab * sizeof *plain);
    CHECK(lp_forward(b, &fr, 1, &err) == 0);
    CHECK_MSG(max_diff(lp_logits(b, 0), want, info.n_vocab) > 0, "the forecast row does not depend on its context");
    CHECK_MSG(lp_context_bind_kv_prefix(b, 1, kv, P, &err) == 0, "%s", err.message);
    CHECK(lp_forward(b, &fr, 1, &err) == 0);
    float d = max_diff(lp_logits(b, 0), want, info.n_vocab);
    CHECK_MSG(d == 0, "a row over a KV prefix differs from the row after that KV by %g", d);
    CHECK(lp_forward(b, &tr, 1, &err) == 0);
    CHECK_MSG(max_diff(lp_logits(b, 0), plain, info.n_vocab) == 0, "a token row saw the KV prefix");
    err.status = LP_OK;
    CHECK(lp_context_bind_kv_prefix(b, 1, kv, LP_MAX_KV_PREFIX + 1, &err) < 0 && err.status == LP_ERR_INVALID);
    CHECK(lp_context_bind_kv_prefix(b, 9, kv, P, &err) < 0);

    /* the file */
    lp_forecast *f = random_forecast(m, 3, 31, 0.5f);
    CHECK(lp_forecast_set_prefix(f, m, kv, P, &err) == 0 && lp_forecast_prefix_len(f) == P);
    size_t size = 0;
    uint8_t *img = image_of(f, &size);
    CHECK(img && lp_le_get_u32(img + 4) == 4 && size == lp_lpf_file_bytes(3, info.dim, 0, info.n_vocab, 0,
                                                                           (size_t)info.n_layers * 2 * P * kv_dim));
    lp_forecast *g = img ? lp_forecast_from_memory(img, size, "prefix.lpf", &err) : NULL;
    CHECK_MSG(g && lp_forecast_prefix_len(g) == P && lp_forecast_check(g, m, &err) == 0 &&
                  memcmp(lp_forecast_prefix(g), kv, lp_forecast_prefix_floats(g) * sizeof(float)) == 0,
              "prefix round trip: %s", err.message);
    lp_forecast_free(g);
    if (img) {
        uint8_t *bad = malloc(size);
        memcpy(bad, img, size);
        lp_le_put_u32(bad + 48, 0); /* version 4 without entries */
        CHECK(!lp_forecast_from_memory(bad, size, "p0.lpf", &err) && strstr(err.message, "KV prefix"));
        memcpy(bad, img, size);
        lp_le_put_u32(bad + 52, (uint32_t)info.n_layers + 1); /* a size that no longer adds up */
        CHECK(!lp_forecast_from_memory(bad, size, "p1.lpf", &err) && strstr(err.message, "p1.lpf"));
        memcpy(bad, img, size);
        lp_le_put_f32(bad + 64 + (size_t)3 * info.dim * 4, NAN);
        lp_le_put_u64(bad + 32, lp_lpa_hash(LP_LPA_HASH_SEED, bad + 64, size - 64));
        CHECK(!lp_forecast_from_memory(bad, size, "p2.lpf", &err) && strstr(err.message, "not finite"));
        free(bad);
    }
    free(img);
    if (other) {
        lp_model_info oi;
        lp_model_get_info(other, &oi);
        /* a prefix shaped for another model */
        lp_forecast *h = random_forecast(m, 2, 3, 0.5f);
        size_t n_other;
        float *okv = random_prefix(other, 2, 4, &n_other);
        CHECK_MSG(oi.dim == info.dim, "the other model must share the width (it differs in layers)");
        CHECK(lp_forecast_set_prefix(h, other, okv, 2, &err) == 0);
        CHECK(lp_forecast_check(h, m, &err) != 0 && err.status == LP_ERR_FORMAT && strstr(err.message, "KV prefix"));
        free(okv);
        lp_forecast_free(h);
    }
    lp_context_free(a);
    lp_context_free(b);

    /* speculation with a random prefix: the plain output */
    size_t count;
    float *rkv = random_prefix(m, 8, 5, &count);
    CHECK(lp_forecast_set_prefix(f, m, rkv, 8, &err) == 0);
    free(rkv);
    lp_speculate sp[2] = {lp_speculate_default(), lp_speculate_default()};
    const char *names[2] = {"prefix [3,2]", "prefix chain 3 + lookup"};
    sp[0].forecast = f, sp[0].depth = 2, sp[0].branches[0] = 3, sp[0].branches[1] = 2;
    sp[1].forecast = f, sp[1].depth = 3, sp[1].branches[0] = sp[1].branches[1] = sp[1].branches[2] = 1;
    sp[1].lookup_ngram = 2, sp[1].lookup_len = 6;
    compare_all(m, NULL, sp, 2, names, "KV prefix", 48);
    lp_forecast_free(f);
    free(kv);
    free(table);
    free(want);
    free(plain);
}

static lp_model *synth_model(char *path) {
    lp_error err;
    lp_synth_params p;
    if (lp_synth_preset("tiny", &p, &err)) return NULL;
    p.seed = 3;
    p.name = "spec-synth";
    snprintf(path, 256, "%s/test_speculate_synth.gguf", LP_BINARY_DIR);
    if (lp_synth_write(&p, path, &err)) {
        fprintf(stderr, "synth: %s\n", err.message);
        return NULL;
    }
    lp_model *m = lp_model_load(path, NULL, &err);
    if (!m) fprintf(stderr, "synth load: %s\n", err.message);
    return m;
}

/* Whether a row whose parent is in the batch gets the bits of the same row
 * decoded after its parent was committed (the forward's attention adds
 * the chain's terms in position order). */
static bool probe_exact(const lp_model *m, float *diff) {
    lp_error err;
    lp_model_info info;
    lp_model_get_info(m, &info);
    lp_context *a = make_ctx(m, 1), *b = make_ctx(m, 1);
    lp_row rows[3] = {{.token = 1, .pos = 0, .parent = -1, .commit = true},
                      {.token = 2, .pos = 1, .parent = -1, .logits = true},
                      {.token = 3, .pos = 2, .parent = 1, .logits = true}};
    float *want = malloc((size_t)info.n_vocab * sizeof *want);
    bool ok = lp_forward(a, rows, 1, &err) == 0 && lp_forward(b, rows, 1, &err) == 0;
    rows[1].commit = true;
    ok = ok && lp_forward(a, rows + 1, 1, &err) == 0;
    rows[2].parent = -1;
    ok = ok && lp_forward(a, rows + 2, 1, &err) == 0;
    if (ok) memcpy(want, lp_logits(a, 0), (size_t)info.n_vocab * sizeof *want);
    rows[1].commit = false;
    rows[2].parent = 0;
    ok = ok && lp_forward(b, rows + 1, 2, &err) == 0;
    *diff = ok ? max_diff(lp_logits(b, 1), want, info.n_vocab) : 1e9f;
    free(want);
    lp_context_free(a);
    lp_context_free(b);
    return ok && *diff == 0.0f;
}

int main(void) {
    lp_error err;
    lp_model *m = lp_model_load(MODEL, NULL, &err);
    CHECK_MSG(m != NULL, "%s", err.message);
    if (!m) return check_summary("test_speculate");
    /* a row verified with its parent in the batch equals the row decoded
     * alone bit for bit (attention adds the in-batch chain in position
     * order); every comparison below is exact */
    float probe = 0;
    CHECK_MSG(probe_exact(m, &probe), "a tree row differs from the row decoded alone by %g", probe);
    lp_adapter *lora = lp_adapter_load(m, LORA, 1.0f, &err), *half = lp_adapter_load(m, LORA, 0.5f, &err);
    CHECK(lora && half);
    char synth_path[256];
    lp_model *s = synth_model(synth_path);
    CHECK(s != NULL);

    test_lpf(m, s);
    test_lpf_corpus(m);
    test_tree_rows_bitwise(m);
    test_greedy_equal(m, lora, "stories260K", 96);
    test_cut_mid_path(m);
    test_lookup_copy();
    test_mixed(m, lora, half);
    test_generate_bound(m, s, lora, half);
    test_kv_prefix(m, s);
    test_preempt(m);
    test_tight(m);
    test_repeat_penalty(m);
    test_sampled_equal(m, lora);
    test_sampled_distribution(m);
    test_cost_model(m, lora);
    test_refusals(m);
    if (s) {
        test_tree_rows_bitwise(s);
        test_greedy_equal(s, NULL, "synth tiny", 48);
        lp_model_free(s);
        unlink(synth_path);
    }
    lp_adapter_free(lora);
    lp_adapter_free(half);
    lp_model_free(m);
    return check_summary("test_speculate");
}
