/* The step-wise engine and the runtime behaviour under it:
 *   - 16 concurrent requests (different prompts, adapters, lengths, greedy
 *     and seeded samplers) == each run alone, token for token;
 *   - cancellation mid-prefill and mid-decode frees every block; the abort
 *     hook abandons a pass without committing anything;
 *   - a KV cache too small for all requests: preemption, identical outputs,
 *     LP_ERR_KV_FULL for the one that cannot fit alone;
 *   - the prefix cache hits only for the same adapter identity;
 *   - API misuse found in review: identity of adapters differing in one
 *     middle value, a slot rebound between forward and commit, a row
 *     committed twice, n_predict = 0, attention split by one row's length;
 *   - rows fed from a bound embedding table. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "runtime/context.h"


#define MODEL LP_SHARED_MODELS "/stories260K.gguf"
#define LORA LP_SHARED_MODELS "/stories260K-lora-r4-random-f32.gguf"
#define N_REQ 16
#define MAX_OUT 96

static lp_context *make_ctx(const lp_model *m, int n_ctx, int max_seqs) {
    lp_context_params p = lp_context_default_params();
    p.n_threads = 2;
    p.max_rows = 128;
    p.max_sequences = max_seqs;
    p.n_ctx = n_ctx;
    p.max_seq_len = 256;
    p.max_adapters = 4;
    lp_error err;
    lp_context *ctx = lp_context_create(m, &p, &err);
    if (!ctx) fprintf(stderr, "context: %s\n", err.message);
    return ctx;
}

typedef struct job {
    const char *prompt;
    int adapter;           /* 0 base, 1 lora, 2 lora at scale 0.5 */
    float temp;
    uint64_t seed;
    int max_tokens;
} job;

typedef struct result {
    int32_t tokens[MAX_OUT];
    int n;
    char text[1024];
    lp_request_stats stats;
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

static lp_request make_request(const job *j, lp_adapter *const *adapters, result *out) {
    lp_request q = lp_request_default();
    q.text = j->prompt;
    q.adapter = j->adapter ? adapters[j->adapter - 1] : NULL;
    q.sampling.temperature = j->temp;
    q.sampling.seed = j->seed;
    q.max_tokens = j->max_tokens;
    q.fn = collect;
    q.user = out;
    return q;
}

static void take_result(lp_engine *e, int id, result *out) {
    lp_engine_request_stats(e, id, &out->stats);
    int n;
    const int32_t *t = lp_engine_request_tokens(e, id, &n);
    out->n = n < MAX_OUT ? n : MAX_OUT;
    if (t) memcpy(out->tokens, t, (size_t)out->n * sizeof *t);
}

/* Every job alone, each on a fresh engine with the cache off. */
static void run_alone(lp_context *ctx, const job *jobs, int n, lp_adapter *const *adapters, result *out) {
    lp_error err;
    for (int i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        lp_engine *e = lp_engine_create(ctx, NULL, &err);
        lp_request q = make_request(&jobs[i], adapters, &out[i]);
        q.no_reuse = true;
        q.drop_kv = true;
        int id = lp_engine_submit(e, &q, &err);
        CHECK_MSG(id >= 0, "%s", err.message);
        CHECK_MSG(lp_engine_run(e, &err) == 0, "%s", err.message);
        take_result(e, id, &out[i]);
        lp_engine_free(e);
    }
}

static bool same_result(const result *a, const result *b) {
    return a->n == b->n && memcmp(a->tokens, b->tokens, (size_t)a->n * sizeof(int32_t)) == 0 &&
           strcmp(a->text, b->text) == 0;
}

static const char *prompts[] = {
    "Once upon a time", "The little dog", "One day, Tim went to the park with his mom.",
    "Lily liked to play", "The sun was hot", "Once upon a time there was a cat.",
    "Ben and his friend", "She saw a big red ball",
};

static void make_jobs(job *jobs) {
    for (int i = 0; i < N_REQ; i++)
        jobs[i] = (job){prompts[i % 8], i % 3, i % 2 ? 0.8f : 0.0f, 1000 + (uint64_t)i, 8 + (i * 7) % 40};
}

static void test_concurrent(const lp_model *m, lp_adapter *const *adapters) {
    lp_context *ctx = make_ctx(m, 4096, N_REQ + 2);
    job jobs[N_REQ];
    make_jobs(jobs);
    static result together[N_REQ], alone[N_REQ];
    memset(together, 0, sizeof together);
    lp_error err;
    lp_engine_params ep = lp_engine_default_params();
    ep.max_prefill_rows = 24; /* prompts spread over several steps, mixed with decode rows */
    lp_engine *e = lp_engine_create(ctx, &ep, &err);
    int ids[N_REQ];
    /* half submitted up front, half while the first ones run */
    for (int i = 0; i < N_REQ / 2; i++) {
        lp_request q = make_request(&jobs[i], adapters, &together[i]);
        ids[i] = lp_engine_submit(e, &q, &err);
    }
    for (int i = 0; i < 3; i++) CHECK(lp_engine_step(e, &err) > 0);
    for (int i = N_REQ / 2; i < N_REQ; i++) {
        lp_request q = make_request(&jobs[i], adapters, &together[i]);
        ids[i] = lp_engine_submit(e, &q, &err);
    }
    CHECK_MSG(lp_engine_run(e, &err) == 0, "%s", err.message);
    int64_t steps, rows;
    lp_engine_counts(e, &steps, &rows);
    for (int i = 0; i < N_REQ; i++) take_result(e, ids[i], &together[i]);
    lp_engine_free(e);
    /* one batch served many requests: far fewer passes than tokens */
    int total = 0;
    for (int i = 0; i < N_REQ; i++) total += together[i].stats.n_generated;
    CHECK_MSG(steps < total / 3, "%lld steps for %d tokens", (long long)steps, total);

    run_alone(ctx, jobs, N_REQ, adapters, alone);
    for (int i = 0; i < N_REQ; i++) {
        CHECK_MSG(together[i].n > 0 && same_result(&together[i], &alone[i]),
                  "request %d (adapter %d, temp %.1f) differs:\n together: %s\n alone:    %s", i,
                  jobs[i].adapter, jobs[i].temp, together[i].text, alone[i].text);
        CHECK(together[i].stats.done && together[i].stats.status == LP_OK);
    }
    /* the adapters change the output (else the comparison above proves little) */
    CHECK(!same_result(&alone[0], &alone[1]) || !same_result(&alone[1], &alone[2]));
    lp_context_free(ctx);
}

static void test_cancel(const lp_model *m, lp_adapter *const *adapters) {
    lp_context *ctx = make_ctx(m, 2048, 4);
    lp_error err;
    lp_engine_params ep = lp_engine_default_params();
    ep.max_prefill_rows = 4;
    lp_engine *e = lp_engine_create(ctx, &ep, &err);
    static result r[3];
    memset(r, 0, sizeof r);
    job j = {"One day, Tim went to the park with his mom. They saw a big tree.", 1, 0, 1, 40};
    lp_request q = make_request(&j, adapters, &r[0]);
    q.drop_kv = false; /* a cancelled request frees its KV even so */
    int a = lp_engine_submit(e, &q, &err);
    CHECK(lp_engine_step(e, &err) == 1);
    lp_request_stats st;
    lp_engine_request_stats(e, a, &st);
    CHECK(st.n_generated == 0 && lp_seq_length(ctx, st.seq) == 4); /* mid-prefill */
    CHECK(lp_engine_cancel(e, a, &err) == 0);
    int used;
    lp_kv_usage(ctx, &used, NULL, NULL);
    CHECK_MSG(used == 0, "%d blocks left after a cancel mid-prefill", used);
    lp_engine_request_stats(e, a, &st);
    CHECK(st.done && st.status == LP_ERR_CANCELLED && strcmp(st.stop_reason, "cancelled") == 0);

    /* mid-decode, next to a request that goes on undisturbed */
    q = make_request(&j, adapters, &r[1]);
    int b = lp_engine_submit(e, &q, &err);
    job k = {"Lily liked to play", 0, 0, 1, 12};
    lp_request q2 = make_request(&k, adapters, &r[2]);
    q2.drop_kv = true;
    int c = lp_engine_submit(e, &q2, &err);
    for (;;) {
        CHECK(lp_engine_step(e, &err) > 0);
        lp_engine_request_stats(e, b, &st);
        if (st.n_generated >= 3) break;
    }
    CHECK(lp_engine_cancel(e, b, &err) == 0);
    CHECK(lp_engine_run(e, &err) == 0);
    lp_kv_usage(ctx, &used, NULL, NULL);
    CHECK_MSG(used == 0, "%d blocks left after a cancel mid-decode", used);
    result alone;
    run_alone(ctx, &k, 1, adapters, &alone);
    take_result(e, c, &r[2]);
    CHECK(same_result(&r[2], &alone) && r[2].n == 12);
    lp_engine_free(e);

    lp_context_free(ctx);
}

static bool abort_after(void *user) {
    int *left = user;
    return (*left)-- <= 0;
}

static void test_abort(const lp_model *m) {
    lp_context *ctx = make_ctx(m, 2048, 4);
    lp_error err;
    int32_t toks[40];
    int n = lp_tokenize(m, "One day, Tim went to the park with his mom.", 43, true, false, toks, 40, &err);
    lp_row rows[40];
    for (int i = 0; i < n; i++)
        rows[i] = (lp_row){.token = toks[i], .pos = i, .seq = 1, .parent = i - 1, .logits = i == n - 1, .commit = true};
    int left = 2;
    lp_context_set_abort(ctx, abort_after, &left);
    err.status = LP_OK;
    CHECK(lp_forward(ctx, rows, n, &err) != 0 && err.status == LP_ERR_CANCELLED);
    int used;
    lp_kv_usage(ctx, &used, NULL, NULL);
    CHECK(used == 0 && lp_seq_length(ctx, 1) == 0 && lp_logits(ctx, n - 1) == NULL);
    int none[1] = {0};
    CHECK(lp_commit_rows(ctx, none, 1, &err) != 0); /* nothing of the abandoned pass remains */
    lp_context_set_abort(ctx, NULL, NULL);
    CHECK(lp_forward(ctx, rows, n, &err) == 0 && lp_seq_length(ctx, 1) == n);
    lp_context_free(ctx);
}

static void test_kv_full(const lp_model *m, lp_adapter *const *adapters) {
    /* 4 blocks of 32 tokens plus one spare per sequence: room for two or
     * three of these requests at a time */
    lp_context *ctx = make_ctx(m, 128, 6);
    job jobs[6];
    for (int i = 0; i < 6; i++)
        jobs[i] = (job){prompts[i], i % 3, i % 2 ? 0.9f : 0.0f, 50 + (uint64_t)i, 60};
    static result together[6], alone[6];
    memset(together, 0, sizeof together);
    lp_error err;
    lp_engine *e = lp_engine_create(ctx, NULL, &err);
    int ids[6];
    for (int i = 0; i < 6; i++) {
        lp_request q = make_request(&jobs[i], adapters, &together[i]);
        q.stop_at_eog = false;
        q.drop_kv = true;
        ids[i] = lp_engine_submit(e, &q, &err);
    }
    CHECK_MSG(lp_engine_run(e, &err) == 0, "%s", err.message);
    int preempted = 0;
    for (int i = 0; i < 6; i++) {
        take_result(e, ids[i], &together[i]);
        preempted += together[i].stats.n_preempted;
    }
    lp_engine_free(e);
    CHECK_MSG(preempted > 0, "no request was preempted: the test does not fill the cache");
    /* alone, with eog off as above */
    for (int i = 0; i < 6; i++) {
        memset(&alone[i], 0, sizeof alone[i]);
        lp_engine *e1 = lp_engine_create(ctx, NULL, &err);
        lp_request q = make_request(&jobs[i], adapters, &alone[i]);
        q.stop_at_eog = false;
        q.drop_kv = true;
        int id = lp_engine_submit(e1, &q, &err);
        CHECK(lp_engine_run(e1, &err) == 0);
        take_result(e1, id, &alone[i]);
        lp_engine_free(e1);
    }
    for (int i = 0; i < 6; i++)
        CHECK_MSG(same_result(&together[i], &alone[i]) && together[i].n == 60,
                  "request %d under preemption differs:\n together: %s\n alone:    %s", i, together[i].text,
                  alone[i].text);

    /* a request that reaches its sequence's limit ends there ("context");
     * the other one still gets its whole output */
    lp_context *small_ctx = make_ctx(m, 96, 2);
    e = lp_engine_create(small_ctx, NULL, &err);
    static result big, small;
    memset(&big, 0, sizeof big);
    memset(&small, 0, sizeof small);
    job jb = {"Once upon a time", 0, 0, 1, 250}, js = {"The little dog", 0, 0, 1, 20};
    lp_request qb = make_request(&jb, adapters, &big), qs = make_request(&js, adapters, &small);
    qb.stop_at_eog = qs.stop_at_eog = false;
    int ib = lp_engine_submit(e, &qb, &err), is = lp_engine_submit(e, &qs, &err);
    CHECK(lp_engine_run(e, &err) == 0);
    take_result(e, ib, &big);
    take_result(e, is, &small);
    CHECK_MSG(strcmp(big.stats.stop_reason, "context") == 0 && big.stats.n_prompt + big.stats.n_generated == 97,
              "reason %s after %d tokens", big.stats.stop_reason, big.stats.n_generated);
    CHECK(small.stats.status == LP_OK && small.n == 20);
    lp_engine_free(e);
    lp_context_free(small_ctx);

    /* lp_forward says which failure it is */
    lp_row rows[128];
    int32_t toks[8];
    int n = lp_tokenize(m, "The sun", 7, true, false, toks, 8, &err);
    for (int i = 0; i < 128; i++)
        rows[i] = (lp_row){.token = toks[i % n], .pos = i, .seq = 0, .parent = i - 1, .commit = true};
    for (int s = 0; s < 6; s++) lp_seq_clear(ctx, s);
    CHECK(lp_forward(ctx, rows, 128, &err) == 0);
    for (int i = 0; i < 128; i++) rows[i].seq = 1;
    CHECK(lp_forward(ctx, rows, 128, &err) == 0);
    for (int i = 0; i < 128; i++) rows[i].seq = 2; /* 8 of 10 blocks are taken */
    err.status = LP_OK;
    CHECK(lp_forward(ctx, rows, 128, &err) != 0 && err.status == LP_ERR_KV_FULL);
    rows[0].token = -5;
    CHECK(lp_forward(ctx, rows, 1, &err) != 0 && err.status == LP_ERR_INVALID);
    lp_context_free(ctx);
}

static void test_prefix_cache(const lp_model *m, lp_adapter *const *adapters) {
    lp_context *ctx = make_ctx(m, 2048, 4);
    lp_error err;
    lp_engine *e = lp_engine_create(ctx, NULL, &err);
    static result r[4];
    memset(r, 0, sizeof r);
    job j = {"One day, Tim went to the park with his mom.", 1, 0, 1, 6};
    lp_request q = make_request(&j, adapters, &r[0]);
    int a = lp_engine_submit(e, &q, &err);
    CHECK(lp_engine_run(e, &err) == 0);
    /* same prompt, same adapter: the whole prompt but its last token is reused */
    q = make_request(&j, adapters, &r[1]);
    int b = lp_engine_submit(e, &q, &err);
    CHECK(lp_engine_run(e, &err) == 0);
    /* the same weights at another scale, and the base: nothing is reused */
    job j2 = j, j3 = j;
    j2.adapter = 2;
    j3.adapter = 0;
    q = make_request(&j2, adapters, &r[2]);
    int c = lp_engine_submit(e, &q, &err);
    CHECK(lp_engine_run(e, &err) == 0);
    q = make_request(&j3, adapters, &r[3]);
    int d = lp_engine_submit(e, &q, &err);
    CHECK(lp_engine_run(e, &err) == 0);
    for (int i = 0; i < 4; i++) take_result(e, (int[]){a, b, c, d}[i], &r[i]);
    int n_prompt = r[0].stats.n_prompt;
    CHECK(r[0].stats.n_reused == 0);
    CHECK_MSG(r[1].stats.n_reused == n_prompt - 1, "reused %d of %d", r[1].stats.n_reused, n_prompt);
    CHECK_MSG(r[2].stats.n_reused == 0 && r[3].stats.n_reused == 0, "reused %d and %d with other adapters",
              r[2].stats.n_reused, r[3].stats.n_reused);
    CHECK(same_result(&r[0], &r[1]));
    lp_engine_free(e);

    /* submitted together with a long common prompt: the second waits for the
     * first to compute it, forks it, and outputs what it would alone */
    e = lp_engine_create(ctx, NULL, &err);
    static result s2[2], alone2[2];
    memset(s2, 0, sizeof s2);
    job shared[2] = {
        {"One day, Tim went to the park with his mom. They saw a big tree and a little bird. The bird was sad.", 1,
         0, 1, 10},
        {"One day, Tim went to the park with his mom. They saw a big tree and a little bird. The bird was happy.",
         1, 0.8f, 5, 10},
    };
    int ids2[2];
    for (int i = 0; i < 2; i++) {
        lp_request q2 = make_request(&shared[i], adapters, &s2[i]);
        ids2[i] = lp_engine_submit(e, &q2, &err);
    }
    CHECK(lp_engine_run(e, &err) == 0);
    for (int i = 0; i < 2; i++) take_result(e, ids2[i], &s2[i]);
    CHECK_MSG(s2[1].stats.n_reused >= 16, "the second request reused %d tokens", s2[1].stats.n_reused);
    lp_engine_free(e);
    run_alone(ctx, shared, 2, adapters, alone2);
    for (int i = 0; i < 2; i++) CHECK(same_result(&s2[i], &alone2[i]));
    lp_context_free(ctx);
}

/* Bug 1: two adapters differing in one middle value had one identity. */
static void test_identity(const lp_model *m, lp_adapter *lora) {
    lp_error err;
    /* one value in the middle of a middle layer's A, away from every
     * tensor's first and last 64 bytes */
    lp_lora_pair *pair = lora->n_pairs > 0 ? &lora->pairs[lora->n_pairs / 2] : NULL;
    CHECK(pair != NULL && pair->A.type == LP_F32);
    if (!pair || pair->A.type != LP_F32) return;
    size_t n = (size_t)pair->A.rows * (size_t)pair->A.cols;
    CHECK(n * sizeof(float) > 256);
    float *copy = malloc(n * sizeof(float));
    memcpy(copy, pair->A.data, n * sizeof(float));
    copy[n / 2] += 0.25f;
    const void *orig = pair->A.data;
    uint64_t before = lp_adapter_content_hash(lora);
    CHECK(before == lp_adapter_identity(lora));
    pair->A.data = copy;
    uint64_t after = lp_adapter_content_hash(lora);
    pair->A.data = orig;
    CHECK_MSG(after != before, "one middle value changed, the identity did not");
    free(copy);
    lp_adapter *z = lp_adapter_load(m, LORA, 0.5f, &err);
    CHECK(z && lp_adapter_identity(z) != lp_adapter_identity(lora)); /* the scale is part of it */
    lp_adapter *w = lp_adapter_load(m, LORA, 1.0f, &err);
    CHECK(w && lp_adapter_identity(w) == lp_adapter_identity(lora)); /* the same content, the same identity */
    CHECK(lp_adapter_identity(NULL) == 0 && lp_adapter_identity(lora) != 0);
    lp_adapter_free(z);
    lp_adapter_free(w);
}

/* Bugs 2 and 3: a slot rebound between forward and commit; a row committed twice. */
static void test_commit(const lp_model *m, lp_adapter *const *adapters) {
    lp_context *ctx = make_ctx(m, 1024, 4);
    lp_error err;
    CHECK(lp_context_bind_adapter(ctx, 1, adapters[0], &err) == 0);
    lp_row rows[3] = {
        {.token = 1, .pos = 0, .seq = 0, .adapter = 1, .parent = -1, .commit = true},
        {.token = 300, .pos = 1, .seq = 0, .adapter = 1, .parent = 0, .logits = true},
        {.token = 301, .pos = 1, .seq = 0, .adapter = 1, .parent = 0, .logits = true},
    };
    CHECK(lp_forward(ctx, rows, 3, &err) == 0);
    CHECK(lp_context_bind_adapter(ctx, 1, adapters[1], &err) == 0);
    int twice[2] = {1, 1};
    CHECK(lp_commit_rows(ctx, twice, 2, &err) != 0 && err.status == LP_ERR_INVALID);
    CHECK_MSG(lp_seq_length(ctx, 0) == 1, "length %d after a rejected commit", lp_seq_length(ctx, 0));
    int one[1] = {2};
    CHECK(lp_commit_rows(ctx, one, 1, &err) == 0 && lp_seq_length(ctx, 0) == 2);
    int32_t tok;
    uint64_t id;
    CHECK(lp_seq_entry(ctx, 0, 1, &tok, &id) == 0 && tok == 301);
    CHECK_MSG(id == lp_adapter_identity(adapters[0]), "the entry was labelled with the slot's new adapter");
    CHECK(lp_seq_entry(ctx, 0, 2, &tok, &id) != 0);
    int again[1] = {2};
    CHECK(lp_commit_rows(ctx, again, 1, &err) != 0 && lp_seq_length(ctx, 0) == 2);
    lp_context_free(ctx);
}

static bool count_text(void *user, const char *text, size_t len) {
    (void)text;
    *(size_t *)user += len;
    return true;
}

/* Bug 4: n_predict = 0 generated one token. */
static void test_zero_tokens(const lp_model *m) {
    lp_context *ctx = make_ctx(m, 1024, 2);
    lp_error err;
    lp_sampler_params sp = lp_sampler_default_params();
    sp.temperature = 0;
    lp_sampler *s = lp_sampler_create(m, &sp, &err);
    int32_t toks[16];
    int n = lp_tokenize(m, "Once upon a time", 16, true, false, toks, 16, &err);
    lp_generate_params gp = lp_generate_default_params();
    gp.n_predict = 0;
    size_t bytes = 0;
    lp_generate_stats st;
    CHECK(lp_generate(ctx, s, toks, n, &gp, count_text, &bytes, &st, &err) == 0);
    CHECK_MSG(bytes == 0 && st.n_generated == 0, "n_predict 0: %zu bytes, %d tokens", bytes, st.n_generated);
    lp_sampler_free(s);
    lp_context_free(ctx);
}

/* Bug 5: attention threading looked only at row 0's sequence. */
static void test_attention_split(const lp_model *m) {
    lp_context_params p = lp_context_default_params();
    p.n_threads = 2;
    p.max_rows = 512;
    p.max_sequences = 2;
    p.n_ctx = 4096;
    lp_error err;
    lp_context *ctx = lp_context_create(m, &p, &err);
    CHECK(ctx != NULL);
    if (!ctx) return;
    static lp_row rows[512];
    for (int c = 0; c < 6; c++) {
        for (int i = 0; i < 512; i++)
            rows[i] = (lp_row){.token = 1 + (i * 7) % 500, .pos = c * 512 + i, .seq = 1, .parent = i - 1,
                               .commit = true};
        CHECK(lp_forward(ctx, rows, 512, &err) == 0);
    }
    /* a fresh request first, then a row that sees 3072 entries */
    lp_row mixed[2] = {
        {.token = 1, .pos = 0, .seq = 0, .parent = -1, .logits = true},
        {.token = 5, .pos = 3072, .seq = 1, .parent = -1, .logits = true},
    };
    CHECK(lp_forward(ctx, mixed, 2, &err) == 0);
    CHECK_MSG(lp_attention_parallel(ctx), "a batch with a 3072-entry row ran attention on one thread");
    /* the two threads' shares see about the same number of entries */
    double cost[2] = {0, 0};
    int n_kv = ctx->model->hp.n_kv_heads;
    for (int t = 0; t < 2; t++) {
        int64_t b, e;
        lp_attention_share(ctx, t, 2, &b, &e);
        for (int64_t i = b; i < e; i++) cost[t] += (i % 2) ? 3073 : 1;
    }
    CHECK_MSG(cost[0] + cost[1] == n_kv * 3074.0, "the shares do not cover every item");
    double worst = cost[0] > cost[1] ? cost[0] : cost[1];
    CHECK_MSG(worst <= n_kv * 3074.0 / 2 + 3073, "unbalanced shares: %g and %g", cost[0], cost[1]);
    lp_context_free(ctx);
}

/* Rows fed from a bound table == rows whose token embedding is that row. */
static void test_embedding_rows(lp_model *m) {
    lp_context *ctx = make_ctx(m, 1024, 4);
    lp_error err;
    int dim = m->hp.dim, V = m->hp.n_vocab;
    float *table = malloc((size_t)3 * (size_t)dim * sizeof(float));
    uint64_t x = 12345;
    for (int i = 0; i < 3 * dim; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        table[i] = ((float)(x >> 40) / (float)(1 << 24) - 0.5f) * 0.2f;
    }
    int32_t toks[8];
    int n = lp_tokenize(m, "The little dog", 14, true, false, toks, 8, &err);
    lp_row rows[9];
    for (int i = 0; i < n; i++)
        rows[i] = (lp_row){.token = toks[i], .pos = i, .seq = 0, .parent = i - 1, .commit = true};
    rows[n] = (lp_row){.token = 2, .embd = 1, .pos = n, .seq = 0, .parent = n - 1, .logits = true};
    CHECK(lp_forward(ctx, rows, n + 1, &err) != 0); /* table 1 is not bound yet */
    CHECK(lp_context_bind_embeddings(ctx, 1, table, 3, &err) == 0);
    rows[n].token = 3;
    CHECK(lp_forward(ctx, rows, n + 1, &err) != 0); /* past the table's rows */
    rows[n].token = 2;
    CHECK_MSG(lp_forward(ctx, rows, n + 1, &err) == 0, "%s", err.message);
    float *got = malloc((size_t)V * sizeof(float));
    memcpy(got, lp_logits(ctx, n), (size_t)V * sizeof(float));
    int32_t tok;
    CHECK(lp_seq_entry(ctx, 0, n - 1, &tok, NULL) == 0 && tok == toks[n - 1]);
    lp_seq_clear(ctx, 0);

    /* the same with the embedding of token 7 replaced by the table's row 2 */
    const lp_weight saved = m->tok_embd;
    float *embd = malloc((size_t)V * (size_t)dim * sizeof(float));
    for (int t = 0; t < V; t++) lp_weight_dequantize_row(&saved, t, embd + (size_t)t * dim);
    memcpy(embd + (size_t)7 * dim, table + (size_t)2 * dim, (size_t)dim * sizeof(float));
    m->tok_embd = (lp_weight){.type = LP_F32, .rows = V, .cols = dim, .data = embd,
                              .row_bytes = (size_t)dim * sizeof(float)};
    rows[n] = (lp_row){.token = 7, .pos = n, .seq = 0, .parent = n - 1, .logits = true};
    CHECK(lp_forward(ctx, rows, n + 1, &err) == 0);
    const float *want = lp_logits(ctx, n);
    CHECK_MSG(want && memcmp(want, got, (size_t)V * sizeof(float)) == 0, "embedding row differs from the token row");
    m->tok_embd = saved;
    /* and it changes the output (the table is not ignored) */
    lp_seq_clear(ctx, 0);
    CHECK(lp_forward(ctx, rows, n + 1, &err) == 0);
    CHECK(memcmp(lp_logits(ctx, n), got, (size_t)V * sizeof(float)) != 0);
    /* its KV entry is not a token: no prompt can match it */
    lp_seq_clear(ctx, 0);
    rows[n] = (lp_row){.token = 2, .embd = 1, .pos = n, .seq = 0, .parent = n - 1, .commit = true};
    CHECK(lp_forward(ctx, rows, n + 1, &err) == 0);
    CHECK(lp_seq_entry(ctx, 0, n, &tok, NULL) == 0 && tok == -1);
    free(embd);
    free(got);
    free(table);
    lp_context_free(ctx);
}

typedef struct lp_record {
    lp_token_logprobs lp[MAX_OUT];
    int n;
} lp_record;

static void record_logprobs(void *user, int request, const lp_token_logprobs *lp) {
    (void)request;
    lp_record *r = user;
    if (r->n < MAX_OUT) r->lp[r->n++] = *lp;
}

/* Log-probabilities reported through token_fn (greedy, a frequency
 * penalty) equal a direct computation: one forward over the prompt and the
 * generated tokens, OpenAI's penalty applied to each row's logits by hand,
 * a double log-softmax. */
static void test_logprobs(const lp_model *m) {
    lp_context *ctx = make_ctx(m, 1024, 4);
    if (!ctx) return;
    lp_error err;
    lp_engine *e = lp_engine_create(ctx, NULL, &err);
    lp_record rec = {0};
    lp_request q = lp_request_default();
    q.text = "Once upon a time";
    q.sampling.temperature = 0;
    q.sampling.frequency_penalty = 0.75f;
    q.max_tokens = 20;
    q.stop_at_eog = false;
    q.no_reuse = q.drop_kv = true;
    q.token_fn = record_logprobs;
    q.top_logprobs = 4;
    q.user = &rec;
    int id = lp_engine_submit(e, &q, &err);
    CHECK_MSG(id >= 0, "%s", err.message);
    CHECK_MSG(lp_engine_run(e, &err) == 0, "%s", err.message);
    int n_gen;
    const int32_t *gen = lp_engine_request_tokens(e, id, &n_gen);
    CHECK_MSG(n_gen == 20 && rec.n == n_gen, "generated %d, reported %d", n_gen, rec.n);
    int32_t toks[128];
    int n_prompt = lp_tokenize(m, q.text, strlen(q.text), true, false, toks, 64, &err);
    CHECK(n_prompt > 0 && n_prompt + n_gen <= 128);
    if (n_prompt <= 0 || n_gen != 20 || rec.n != n_gen) goto out;
    memcpy(toks + n_prompt, gen, (size_t)n_gen * sizeof *gen);
    lp_row rows[128];
    int n_rows = n_prompt + n_gen - 1;
    for (int i = 0; i < n_rows; i++)
        rows[i] = (lp_row){.token = toks[i], .pos = i, .seq = 3, .parent = i - 1, .logits = i >= n_prompt - 1};
    CHECK_MSG(lp_forward(ctx, rows, n_rows, &err) == 0, "%s", err.message);
    lp_model_info mi;
    lp_model_get_info(m, &mi);
    int V = mi.n_vocab, bad = 0;
    float *w = malloc((size_t)V * sizeof *w);
    for (int g = 0; w && g < n_gen; g++) {
        memcpy(w, lp_logits(ctx, n_prompt - 1 + g), (size_t)V * sizeof *w);
        for (int k = 0; k < g; k++) w[gen[k]] -= q.sampling.frequency_penalty;
        double max = -INFINITY, sum = 0;
        for (int t = 0; t < V; t++) max = w[t] > max ? w[t] : max;
        for (int t = 0; t < V; t++) sum += exp(w[t] - max);
        double lse = max + log(sum);
        const lp_token_logprobs *lp = &rec.lp[g];
        bool ok = lp->token == gen[g] && fabs(lp->logprob - (w[gen[g]] - lse)) < 2e-3 && lp->n_top == 4 &&
                  lp->top_token[0] == gen[g];
        for (int i = 0; ok && i < 4; i++)
            ok = fabs(lp->top_logprob[i] - (w[lp->top_token[i]] - lse)) < 2e-3 &&
                 (i == 0 || lp->top_logprob[i] <= lp->top_logprob[i - 1]);
        bad += !ok;
    }
    free(w);
    CHECK_MSG(bad == 0, "%d of %d tokens' log-probabilities differ from the direct computation", bad, n_gen);
out:
    lp_engine_free(e);
    lp_context_free(ctx);
}

int main(void) {
    lp_error err;
    lp_model *m = lp_model_load(MODEL, NULL, &err);
    CHECK_MSG(m != NULL, "%s", err.message);
    if (!m) return check_summary("engine");
    lp_adapter *adapters[2] = {lp_adapter_load(m, LORA, 1.0f, &err), lp_adapter_load(m, LORA, 0.5f, &err)};
    CHECK_MSG(adapters[0] && adapters[1], "%s", err.message);
    if (!adapters[0] || !adapters[1]) return check_summary("engine");
    test_concurrent(m, adapters);
    test_cancel(m, adapters);
    test_abort(m);
    test_kv_full(m, adapters);
    test_prefix_cache(m, adapters);
    test_identity(m, adapters[0]);
    test_commit(m, adapters);
    test_zero_tokens(m);
    test_attention_split(m);
    test_embedding_rows(m);
    test_logprobs(m);
    lp_adapter_free(adapters[0]);
    lp_adapter_free(adapters[1]);
    lp_model_free(m);
    return check_summary("engine");
}
