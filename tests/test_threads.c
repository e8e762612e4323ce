/* Separate contexts on one shared model are safe to use from separate
 * threads at once: each thread's greedy output equals a solo run. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "loraplex.h"

typedef struct job {
    const lp_model *model;
    const char *prompt;
    char text[2048];
    int rc;
} job;

static bool collect(void *user, const char *text, size_t len) {
    job *j = user;
    size_t have = strlen(j->text);
    if (have + len < sizeof j->text) {
        memcpy(j->text + have, text, len);
        j->text[have + len] = 0;
    }
    return true;
}

static void *run_job(void *arg) {
    job *j = arg;
    lp_error err;
    lp_context_params cp = lp_context_default_params();
    cp.n_threads = 2;
    cp.max_sequences = 1;
    lp_context *ctx = lp_context_create(j->model, &cp, &err);
    lp_sampler_params sp = lp_sampler_default_params();
    sp.temperature = 0;
    lp_sampler *s = ctx ? lp_sampler_create(j->model, &sp, &err) : NULL;
    int32_t toks[64];
    int n = lp_tokenize(j->model, j->prompt, strlen(j->prompt), true, false, toks, 64, &err);
    lp_generate_params gp = lp_generate_default_params();
    gp.n_predict = 40;
    j->rc = s && n > 0 ? lp_generate(ctx, s, toks, n, &gp, collect, j, NULL, &err) : -1;
    lp_sampler_free(s);
    lp_context_free(ctx);
    return NULL;
}

int main(void) {
    lp_error err;
    lp_model *m = lp_model_load(LP_SHARED_MODELS "/stories260K.gguf", NULL, &err);
    CHECK(m != NULL);
    if (!m) return check_summary("threads");
    const char *prompts[4] = {"Once upon a time", "The cat", "Tom and Sue", "One day"};
    job solo[4], together[4];
    memset(solo, 0, sizeof solo);
    memset(together, 0, sizeof together);
    for (int i = 0; i < 4; i++) {
        solo[i] = (job){m, prompts[i], {0}, 0};
        run_job(&solo[i]);
        together[i] = (job){m, prompts[i], {0}, 0};
    }
    pthread_t th[4];
    for (int i = 0; i < 4; i++) CHECK(pthread_create(&th[i], NULL, run_job, &together[i]) == 0);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        CHECK(solo[i].rc == 0 && together[i].rc == 0);
        CHECK(strlen(solo[i].text) > 20);
        CHECK_MSG(strcmp(solo[i].text, together[i].text) == 0, "thread %d: '%s' vs '%s'", i,
                  together[i].text, solo[i].text);
    }
    lp_model_free(m);
    return check_summary("threads");
}
