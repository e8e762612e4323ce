/* A QUAD shared quantization profile loaded for a base (lp_profile in the
 * public API): the parsed .lpq, checked against the base's weights, with its
 * entries indexed by weight id for the forward pass. */
#ifndef LP_PROFILE_H
#define LP_PROFILE_H

#include "../formats/lpq.h"
#include "model.h"

struct lp_profile {
    lp_lpq q;
    const lp_model *model;
    const lp_lpq_entry **by_weight;  /* [model->n_weights] or NULL where not profiled */
    int scratch_ints;                /* per thread: the largest LP_LORA_STATIC_SCRATCH */
};

/* Checks the profile against m (every tensor an adaptable weight of that
 * shape, no folded norm gain on it) and builds the index. */
int lp_profile_init(lp_profile *p, const lp_model *m, const char *what, lp_error *err);
void lp_profile_release(lp_profile *p);

#endif
