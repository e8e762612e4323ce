/* Shared quantization profiles (profile.h, formats/lpq.h) and the check an
 * adapter under one must pass. */
#include "profile.h"

#include <stdlib.h>
#include <string.h>

#include "../kernels/lora_static.h"
#include "adapter.h"

int lp_profile_init(lp_profile *p, const lp_model *m, const char *what, lp_error *err) {
    p->model = m;
    p->by_weight = calloc((size_t)(m->n_weights ? m->n_weights : 1), sizeof *p->by_weight);
    if (!p->by_weight) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    p->scratch_ints = 0;
    for (uint32_t i = 0; i < p->q.n_entries; i++) {
        const lp_lpq_entry *e = &p->q.entries[i];
        int w = lp_model_weight_by_name(m, e->tensor);
        if (w < 0) return lp_fail(err, "%s: %s is not an adaptable weight of the base", what, e->tensor);
        const lp_weight *bw = m->weights[w].w;
        if ((int64_t)e->in != bw->cols || (int64_t)e->out != bw->rows)
            return lp_fail(err, "%s: %s is %u x %u in the profile but %lld x %lld in the base", what,
                           e->tensor, e->out, e->in, (long long)bw->rows, (long long)bw->cols);
        if (m->weights[w].in_gain)
            return lp_fail(err, "%s: the base folds a norm gain into %s (compile it without folding "
                           "to use a shared profile)", what, e->tensor);
        p->by_weight[w] = e;
        int need = LP_LORA_STATIC_SCRATCH((int)e->in, (int)e->rank);
        if (need > p->scratch_ints) p->scratch_ints = need;
    }
    return 0;
}

void lp_profile_release(lp_profile *p) {
    free(p->by_weight);
    p->by_weight = NULL;
    lp_lpq_release(&p->q);
}

lp_profile *lp_profile_load(const lp_model *model, const char *path, lp_error *err) {
    lp_profile *p = calloc(1, sizeof *p);
    if (!p) {
        lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    if (lp_lpq_read(path, &p->q, err) || lp_profile_init(p, model, path, err)) {
        lp_profile_free(p);
        lp_error_as_format(err);
        return NULL;
    }
    return p;
}

void lp_profile_free(lp_profile *p) {
    if (!p) return;
    lp_profile_release(p);
    free(p);
}

uint64_t lp_profile_id(const lp_profile *p) { return p ? p->q.id : 0; }
int lp_profile_bits(const lp_profile *p) { return p ? (int)p->q.weight_bits : 0; }

int lp_profile_check_adapter(const lp_profile *p, const lp_adapter *a, lp_error *err) {
    if (!a->profile_id) return 0;
    if (!p)
        return lp_fail(err, "adapter '%s' holds codes of shared profile %016llx, but no profile is "
                       "bound (lp_context_bind_profile / --profile)", a->name,
                       (unsigned long long)a->profile_id);
    if (a->profile_id != p->q.id)
        return lp_fail(err, "adapter '%s' was quantized under shared profile %016llx, but the bound "
                       "profile is %016llx: fit it to this profile with `loraplex quad fit`", a->name,
                       (unsigned long long)a->profile_id, (unsigned long long)p->q.id);
    if (a->base != p->model) return lp_fail(err, "adapter '%s' and the profile belong to different models", a->name);
    for (int i = 0; i < a->n_pairs; i++) {
        const lp_lora_pair *pr = &a->pairs[i];
        const lp_lpq_entry *e = p->by_weight[pr->weight];
        if (!e || (int)e->rank != pr->rank)
            return lp_fail(err, "adapter '%s': %s %s the profile", a->name, pr->name,
                           e ? "has another rank than" : "is not in");
    }
    return 0;
}
