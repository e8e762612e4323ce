/* Concurrent streams: every stream of a concurrent run equals that stream
 * run alone (greedy with seed-top first tokens, seeded sampling, per-stream
 * suffixes); the prompt's KV blocks are shared, not copied; finished streams
 * free their blocks; a later call reuses the cached prefix. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "runtime/context.h"

#define MAX_STREAMS 8

typedef struct outputs {
    char text[MAX_STREAMS][4096];
    int blocks_seen; /* KV blocks in use at the first callback */
    lp_context *ctx;
} outputs;

static bool collect(void *user, int stream, const char *text, size_t len) {
    outputs *o = user;
    if (!o->blocks_seen) lp_kv_usage(o->ctx, &o->blocks_seen, NULL, NULL);
    size_t have = strlen(o->text[stream]);
    if (have + len < sizeof o->text[0]) {
        memcpy(o->text[stream] + have, text, len);
        o->text[stream][have + len] = 0;
    }
    return true;
}

static lp_context *make_ctx(const lp_model *m) {
    lp_context_params p = lp_context_default_params();
    p.n_threads = 2;
    p.max_rows = 64;
    p.max_sequences = MAX_STREAMS + 1;
    p.n_ctx = 2048;
    lp_error err;
    return lp_context_create(m, &p, &err);
}

typedef struct spec {
    const char *suffix;
    float temp;
    uint64_t seed;
    int32_t first_token;
} spec;

/* Runs n streams together, then each alone, and compares texts. */
static void compare(const lp_model *m, const char *prompt_text, const spec *specs, int n,
                    int n_predict) {
    lp_error err;
    lp_context *ctx = make_ctx(m);
    int32_t prompt[256];
    int n_prompt = lp_tokenize(m, prompt_text, strlen(prompt_text), true, false, prompt, 256, &err);
    lp_sampler *samplers[MAX_STREAMS];
    lp_stream streams[MAX_STREAMS];
    for (int i = 0; i < n; i++) {
        lp_sampler_params sp = lp_sampler_default_params();
        sp.temperature = specs[i].temp;
        sp.seed = specs[i].seed;
        samplers[i] = lp_sampler_create(m, &sp, &err);
        streams[i] = (lp_stream){specs[i].suffix, 0, samplers[i], specs[i].first_token};
    }
    lp_generate_params gp = lp_generate_default_params();
    gp.n_predict = n_predict;
    static outputs together, alone;
    memset(&together, 0, sizeof together);
    together.ctx = ctx;
    lp_stream_stats ss[MAX_STREAMS];
    lp_generate_stats st;
    CHECK_MSG(lp_generate_streams(ctx, prompt, n_prompt, streams, n, &gp, collect, &together, ss,
                                  &st, &err) == 0, "%s", err.message);
    /* while streams ran, the prompt's blocks were shared: far fewer blocks
     * than n private copies would need */
    int prompt_blocks = (n_prompt + 31) / 32;
    CHECK_MSG(n == 1 || together.blocks_seen < n * prompt_blocks + n,
              "blocks in use %d for %d streams of a %d-block prompt", together.blocks_seen, n,
              prompt_blocks);
    /* afterwards only the first stream's sequence keeps blocks */
    int used;
    lp_kv_usage(ctx, &used, NULL, NULL);
    CHECK(used == (lp_seq_length(ctx, 0) + 31) / 32);

    for (int i = 0; i < n; i++) {
        memset(&alone, 0, sizeof alone);
        alone.ctx = ctx;
        lp_sampler_reset(samplers[i], specs[i].seed);
        lp_stream one = streams[i];
        lp_generate_params gp1 = gp;
        gp1.reuse_cache = false;
        CHECK(lp_generate_streams(ctx, prompt, n_prompt, &one, 1, &gp1, collect, &alone, NULL,
                                  NULL, &err) == 0);
        CHECK_MSG(strcmp(alone.text[0], together.text[i]) == 0,
                  "stream %d differs:\n together: %s\n alone:    %s", i, together.text[i],
                  alone.text[0]);
    }
    for (int i = 0; i < n; i++) lp_sampler_free(samplers[i]);
    lp_context_free(ctx);
}

int main(void) {
    lp_error err;
    lp_model *m = lp_model_load(LP_SHARED_MODELS "/stories260K.gguf", NULL, &err);
    CHECK(m != NULL);
    if (!m) return check_summary("streams");
    /* seeded sampling: each stream its own seed */
    spec sampled[4] = {{NULL, 0.9f, 1, -1}, {NULL, 0.9f, 2, -1}, {NULL, 1.0f, 3, -1},
                       {NULL, 0.7f, 4, -1}};
    compare(m, "Once upon a time", sampled, 4, 40);
    /* greedy with forced distinct first tokens */
    spec forced[3] = {{NULL, 0, 0, 403}, {NULL, 0, 0, 1125 % 512}, {NULL, 0, 0, 300}};
    compare(m, "The little dog", forced, 3, 40);
    /* per-stream suffixes (own rows after the shared prompt) */
    spec suffixed[3] = {{" She", 0, 0, -1}, {" He", 0, 0, -1}, {NULL, 0.8f, 9, -1}};
    compare(m, "Once upon a time there was a cat.", suffixed, 3, 40);
    /* eight streams */
    spec eight[8];
    for (int i = 0; i < 8; i++) eight[i] = (spec){NULL, 0.8f, 100 + (uint64_t)i, -1};
    compare(m, "One day, Tim went to the park with his mom.", eight, 8, 30);

    /* seed-top: stream i starts from the i-th most likely token, all distinct */
    lp_context *ctx = make_ctx(m);
    int32_t prompt[64];
    int n = lp_tokenize(m, "Once upon a time", 16, true, false, prompt, 64, &err);
    lp_sampler_params sp = lp_sampler_default_params();
    sp.temperature = 0;
    lp_sampler *greedy = lp_sampler_create(m, &sp, &err);
    lp_stream st4[4];
    for (int i = 0; i < 4; i++) st4[i] = (lp_stream){NULL, 0, greedy, -1};
    lp_generate_params gp = lp_generate_default_params();
    gp.n_predict = 20;
    gp.seed_top = 4;
    static outputs o;
    memset(&o, 0, sizeof o);
    o.ctx = ctx;
    CHECK(lp_generate_streams(ctx, prompt, n, st4, 4, &gp, collect, &o, NULL, NULL, &err) == 0);
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++) CHECK_MSG(strcmp(o.text[i], o.text[j]) != 0, "%d == %d", i, j);
    CHECK(strncmp(o.text[0], ", there was", 11) == 0); /* rank 0 = the greedy path */
    /* pruning: a threshold no seed token reaches ends streams 1..3 at once */
    gp.seed_top_min_prob = 0.999f;
    lp_stream_stats ss[4];
    memset(&o, 0, sizeof o);
    o.ctx = ctx;
    CHECK(lp_generate_streams(ctx, prompt, n, st4, 4, &gp, collect, &o, ss, NULL, &err) == 0);
    CHECK(strcmp(ss[1].stop_reason, "pruned") == 0 && ss[1].n_generated == 0);

    /* the next call with a longer prompt reuses the cached prefix */
    gp = lp_generate_default_params();
    gp.n_predict = 5;
    lp_generate_stats stats;
    CHECK(lp_generate(ctx, greedy, prompt, n, &gp, NULL, NULL, &stats, &err) == 0);
    int32_t longer[64];
    memcpy(longer, prompt, (size_t)n * sizeof(int32_t));
    longer[n] = 261;
    CHECK(lp_generate(ctx, greedy, longer, n + 1, &gp, NULL, NULL, &stats, &err) == 0);
    CHECK_MSG(stats.n_reused == n, "reused %d of %d", stats.n_reused, n);
    lp_sampler_free(greedy);
    lp_context_free(ctx);
    lp_model_free(m);
    return check_summary("streams");
}
