/* The smallest use of the public API: load a model, greedy-generate a
 * continuation of a prompt, print it.
 *
 *   example_generate MODEL "PROMPT" [N]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loraplex.h"

static bool print_text(void *user, const char *text, size_t len) {
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return true;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL PROMPT [N]\n", argv[0]);
        return 2;
    }
    lp_error err;
    lp_model *model = lp_model_load(argv[1], NULL, &err);
    if (!model) {
        fprintf(stderr, "error: %s\n", err.message);
        return 1;
    }
    int32_t prompt[512];
    int n = lp_tokenize(model, argv[2], strlen(argv[2]), lp_model_add_bos(model), false, prompt,
                        512, &err);
    if (n < 0 || n > 512) {
        fprintf(stderr, "error: cannot tokenize the prompt\n");
        lp_model_free(model);
        return 1;
    }
    lp_context *ctx = lp_context_create(model, NULL, &err);
    lp_sampler_params sp = lp_sampler_default_params();
    sp.temperature = 0; /* greedy */
    lp_sampler *sampler = ctx ? lp_sampler_create(model, &sp, &err) : NULL;
    lp_generate_params gp = lp_generate_default_params();
    gp.n_predict = argc > 3 ? atoi(argv[3]) : 64;
    int rc = sampler ? lp_generate(ctx, sampler, prompt, n, &gp, print_text, NULL, NULL, &err)
                     : -1;
    if (rc) fprintf(stderr, "\nerror: %s\n", err.message);
    printf("\n");
    lp_sampler_free(sampler);
    lp_context_free(ctx);
    lp_model_free(model);
    return rc ? 1 : 0;
}
