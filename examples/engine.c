/* The step-wise engine: several requests in flight at once, each with its
 * own prompt, adapter and sampler, batched into one forward per step; one
 * cancelled mid-way; then a repeated prompt served from the prefix cache.
 *
 *   example_engine MODEL [ADAPTER]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loraplex.h"

#define N_REQ 4
#define CANCEL 3       /* the request cancelled ... */
#define CANCEL_STEP 6  /* ... after this many steps */

typedef struct job {
    const char *prompt;
    bool adapter;      /* with the adapter (when one was given) */
    float temperature; /* 0 = greedy */
    int max_tokens;
    char text[2048];   /* what it generated, collected by on_text */
} job;

static job jobs[N_REQ + 1] = {
    {"Once upon a time", false, 0.0f, 40, ""},  /* greedy, base */
    {"The little dog", true, 0.8f, 40, ""},     /* seeded sampling, adapter */
    {"Lily liked to play", true, 0.0f, 30, ""}, /* greedy, adapter */
    {"The sun was hot", false, 0.8f, 100, ""},  /* cancelled mid-way */
    {"Once upon a time", false, 0.0f, 40, ""},  /* job 0 again: a prefix cache hit */
};

static bool on_text(void *user, int request, const char *text, size_t len) {
    (void)request;
    job *j = user;
    size_t have = strlen(j->text);
    if (have + len < sizeof j->text) {
        memcpy(j->text + have, text, len);
        j->text[have + len] = 0;
    }
    return true;
}

static int submit(lp_engine *engine, job *j, const lp_adapter *adapter, lp_error *err) {
    lp_request q = lp_request_default();
    q.text = j->prompt;
    q.adapter = j->adapter ? adapter : NULL;
    q.sampling.temperature = j->temperature;
    q.sampling.seed = 42;
    q.max_tokens = j->max_tokens;
    q.fn = on_text;
    q.user = j;
    return lp_engine_submit(engine, &q, err);
}

/* One line per request: its text (newlines written as \n), then its stats. */
static void report(const lp_engine *engine, int id, const job *j) {
    printf("[%d] %s", id, j->prompt);
    for (const char *c = j->text; *c; c++)
        if (*c == '\n') fputs("\\n", stdout);
        else putchar(*c);
    lp_request_stats st;
    lp_engine_request_stats(engine, id, &st);
    printf("\n[%d] stats: stop=%s generated=%d prompt=%d reused=%d adapter=%s\n", id,
           st.stop_reason ? st.stop_reason : "running", st.n_generated, st.n_prompt,
           st.n_reused, j->adapter ? "yes" : "no");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [ADAPTER]\n", argv[0]);
        return 2;
    }
    lp_error err;
    lp_model *model = lp_model_load(argv[1], NULL, &err);
    lp_adapter *adapter = NULL;
    lp_context *ctx = NULL;
    lp_engine *engine = NULL;
    int rc = 1, ids[N_REQ + 1];
    if (!model) goto fail;
    if (argc > 2 && !(adapter = lp_adapter_load(model, argv[2], 1.0f, &err))) goto fail;
    if (!adapter) /* no adapter given: every job runs on the base */
        for (int i = 0; i <= N_REQ; i++) jobs[i].adapter = false;
    if (!(ctx = lp_context_create(model, NULL, &err))) goto fail;
    if (!(engine = lp_engine_create(ctx, NULL, &err))) goto fail;

    /* all requests at once; each step batches whatever they need */
    for (int i = 0; i < N_REQ; i++)
        if ((ids[i] = submit(engine, &jobs[i], adapter, &err)) < 0) goto fail;
    for (int step = 1;; step++) {
        if (step == CANCEL_STEP + 1 && lp_engine_cancel(engine, ids[CANCEL], &err)) goto fail;
        int running = lp_engine_step(engine, &err);
        if (running < 0) goto fail;
        printf("step %d: %d running\n", step, running);
        if (running == 0) break;
    }
    for (int i = 0; i < N_REQ; i++) report(engine, ids[i], &jobs[i]);

    /* the first prompt again: its KV is still cached, so n_reused > 0 */
    if ((ids[N_REQ] = submit(engine, &jobs[N_REQ], adapter, &err)) < 0) goto fail;
    if (lp_engine_run(engine, &err) < 0) goto fail;
    report(engine, ids[N_REQ], &jobs[N_REQ]);
    rc = 0;
fail:
    if (rc) fprintf(stderr, "error: %s\n", err.message);
    lp_engine_free(engine);
    lp_context_free(ctx);
    lp_adapter_free(adapter);
    lp_model_free(model);
    return rc;
}
