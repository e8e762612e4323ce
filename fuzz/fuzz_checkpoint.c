/* Fuzzes the training-checkpoint reader over memory: any input must be
 * rejected with a message or load a consistent model, never crash. */
#include <stddef.h>
#include <stdint.h>

#include "train/train.h"


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lp_error err;
    lp_train_model *m = NULL;
    lp_adamw opt;
    lp_rng rng;
    if (lp_checkpoint_load_memory(data, size, "fuzz.ckpt", &m, &opt, &rng, &err) == 0) {
        lp_adamw_free(&opt);
        lp_train_model_free(m);
    }
    return 0;
}
