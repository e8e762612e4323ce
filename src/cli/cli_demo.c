/* loraplex demo: the built-in default job. Until the project's own demo
 * world (a trained base with task adapters) exists, it runs the real tiny
 * pretrained stories260K model from shared/models: a greedy story and a
 * sampled one, with timings. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/base.h"
#include "cli.h"

static bool find_model(const char *file, char *out, size_t cap) {
    const char *env = getenv("LORAPLEX_SHARED_MODELS");
    const char *dirs[] = {env, LP_SHARED_MODELS, "shared/models", "../shared/models"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        if (!dirs[i]) continue;
        snprintf(out, cap, "%s/%s", dirs[i], file);
        struct stat st;
        if (stat(out, &st) == 0) return true;
    }
    return false;
}

static bool print_text(void *user, const char *text, size_t len) {
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return true;
}

static int story(lp_context *ctx, const lp_model *model, const char *prompt, float temp,
                 uint64_t seed) {
    lp_error err;
    lp_sampler_params sp = lp_sampler_default_params();
    sp.temperature = temp;
    sp.seed = seed;
    lp_sampler *s = lp_sampler_create(model, &sp, &err);
    if (!s) return cli_fail("sampler", &err);
    int32_t tokens[64];
    int n = lp_tokenize(model, prompt, strlen(prompt), true, false, tokens, 64, &err);
    lp_generate_params gp = lp_generate_default_params();
    gp.n_predict = 120;
    lp_generate_stats st;
    printf("%s", prompt);
    int rc = lp_generate(ctx, s, tokens, n, &gp, print_text, NULL, &st, &err);
    lp_sampler_free(s);
    if (rc) return cli_fail("generate", &err);
    printf("\n");
    fprintf(stderr, "  [%d prompt tokens, %d generated, %.0f tok/s decode]\n\n", st.n_prompt,
            st.n_generated, st.decode_seconds > 0 ? st.n_generated / st.decode_seconds : 0.0);
    return 0;
}

int cli_demo(int argc, char **argv) {
    (void)argc;
    (void)argv;
    char path[1024];
    if (!find_model("stories260K.gguf", path, sizeof path)) {
        fprintf(stderr, "loraplex demo: cannot find stories260K.gguf (set LORAPLEX_SHARED_MODELS "
                        "to the shared/models folder)\n");
        return 1;
    }
    lp_error err;
    lp_model *model = lp_model_load(path, NULL, &err);
    if (!model) return cli_fail("cannot load model", &err);
    lp_context *ctx = lp_context_create(model, NULL, &err);
    if (!ctx) {
        lp_model_free(model);
        return cli_fail("cannot create context", &err);
    }
    fprintf(stderr, "loraplex demo: %s (a real 260K-parameter TinyStories model)\n\n", path);
    fprintf(stderr, "greedy:\n");
    int rc = story(ctx, model, "Once upon a time", 0.0f, 0);
    fprintf(stderr, "sampled (temperature 0.8, seed 42):\n");
    if (!rc) rc = story(ctx, model, "The little dog", 0.8f, 42);
    lp_context_free(ctx);
    lp_model_free(model);
    return rc;
}
