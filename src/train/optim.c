/* AdamW (decoupled weight decay) with linear warmup, cosine decay and global
 * gradient-norm clipping. Only trainable groups have moments; frozen groups
 * are never read for gradients nor written. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train_internal.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

lp_adamw_config lp_adamw_default(void) {
    lp_adamw_config c = {
        .lr = 1e-3f, .min_lr = 1e-4f, .warmup = 100, .total_steps = 1000,
        .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f,
    };
    return c;
}

float lp_train_lr(const lp_adamw_config *c, long step) {
    if (step < c->warmup) return c->lr * (float)(step + 1) / (float)c->warmup;
    long span = c->total_steps - c->warmup;
    double progress = span > 0 ? (double)(step - c->warmup) / (double)span : 1.0;
    if (progress > 1) progress = 1;
    return (float)(c->min_lr + 0.5 * (c->lr - c->min_lr) * (1.0 + cos(M_PI * progress)));
}

int lp_adamw_init(lp_adamw *opt, const lp_train_model *model, const lp_adamw_config *cfg,
                  lp_error *err) {
    memset(opt, 0, sizeof *opt);
    opt->cfg = *cfg;
    for (int g = 0; g < 3; g++) {
        if (!model->grad[g]) continue;
        size_t bytes = model->group_size[g] * sizeof(float);  /* fits: the group exists */
        opt->m[g] = lp_alloc(bytes);
        opt->v[g] = lp_alloc(bytes);
        if (!opt->m[g] || !opt->v[g]) {
            lp_adamw_free(opt);
            return lp_fail(err, "out of memory for optimizer state");
        }
    }
    return 0;
}

void lp_adamw_free(lp_adamw *opt) {
    for (int g = 0; g < 3; g++) {
        lp_free(opt->m[g]);
        lp_free(opt->v[g]);
        opt->m[g] = opt->v[g] = NULL;
    }
}

static double grad_norm(const lp_train_model *model) {
    double ss = 0;
    for (int g = 0; g < 3; g++) {
        const float *gr = model->grad[g];
        for (size_t i = 0; gr && i < model->group_size[g]; i++) ss += (double)gr[i] * gr[i];
    }
    return sqrt(ss);
}

float lp_adamw_step(lp_adamw *opt, lp_train_model *model) {
    const lp_adamw_config *c = &opt->cfg;
    double norm = grad_norm(model);
    float clip = c->grad_clip > 0 && norm > c->grad_clip ? (float)(c->grad_clip / norm) : 1.0f;
    float lr = lp_train_lr(c, opt->step);
    opt->step++;
    float bc1 = 1.0f - powf(c->beta1, (float)opt->step), bc2 = 1.0f - powf(c->beta2, (float)opt->step);
    for (int i = 0; i < model->n_params; i++) {
        const lp_tparam *t = &model->params[i];
        int g = lp_train_group_index(t->group);
        if (!model->grad[g]) continue;
        float *p = model->group[g] + t->offset, *gr = model->grad[g] + t->offset;
        float *m = opt->m[g] + t->offset, *v = opt->v[g] + t->offset;
        float decay = t->decay ? c->weight_decay : 0.0f;
        for (size_t k = 0; k < t->size; k++) {
            float grad = gr[k] * clip;
            m[k] = c->beta1 * m[k] + (1.0f - c->beta1) * grad;
            v[k] = c->beta2 * v[k] + (1.0f - c->beta2) * grad * grad;
            float mhat = m[k] / bc1, vhat = v[k] / bc2;
            p[k] -= lr * (mhat / (sqrtf(vhat) + c->eps) + decay * p[k]);
        }
    }
    return (float)norm;
}
