/* Token sampling: repetition penalty, then greedy, or temperature followed by
 * top-k, top-p and min-p filtering and a seeded draw. Scratch arrays are
 * allocated with the sampler, never per token. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../model/model.h"

struct lp_sampler {
    lp_sampler_params params;
    int n_vocab;
    lp_rng rng;
    float *work;     /* [n_vocab] logits after penalties / probabilities */
    int32_t *order;  /* [n_vocab] candidate ids */
};

lp_sampler_params lp_sampler_default_params(void) {
    lp_sampler_params p = {0};
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.seed = 0;
    return p;
}

lp_sampler *lp_sampler_create(const lp_model *model, const lp_sampler_params *params,
                              lp_error *err) {
    lp_sampler *s = calloc(1, sizeof *s);
    if (!s) {
        lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    s->params = params ? *params : lp_sampler_default_params();
    if (!(s->params.temperature >= 0) || s->params.top_k < 0 || !(s->params.top_p > 0) ||
        s->params.top_p > 1 || !(s->params.min_p >= 0) || s->params.min_p > 1 ||
        !(s->params.repeat_penalty > 0) || s->params.repeat_last_n < 0) {
        free(s);
        lp_fail(err, "sampler settings out of range (temperature >= 0, top-k >= 0, "
                     "0 < top-p <= 1, 0 <= min-p <= 1, repeat penalty > 0)");
        return NULL;
    }
    s->n_vocab = model->hp.n_vocab;
    s->work = lp_alloc((size_t)s->n_vocab * sizeof(float));
    s->order = lp_alloc((size_t)s->n_vocab * sizeof(int32_t));
    if (!s->work || !s->order) {
        lp_sampler_free(s);
        lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    lp_rng_seed(&s->rng, s->params.seed);
    return s;
}

void lp_sampler_free(lp_sampler *s) {
    if (!s) return;
    lp_free(s->work);
    lp_free(s->order);
    free(s);
}

void lp_sampler_reset(lp_sampler *s, uint64_t seed) {
    s->params.seed = seed;
    lp_rng_seed(&s->rng, seed);
}

/* llama.cpp's rule: positive logits are divided by the penalty, negative
 * ones multiplied, once per distinct recent token. */
static void apply_repeat_penalty(lp_sampler *s, const int32_t *history, int n) {
    float penalty = s->params.repeat_penalty;
    if (penalty == 1.0f || n <= 0) return;
    int from = n - s->params.repeat_last_n;
    if (from < 0) from = 0;
    for (int i = from; i < n; i++) {
        int32_t t = history[i];
        if (t < 0 || t >= s->n_vocab) continue;
        bool seen = false;
        for (int j = from; j < i && !seen; j++) seen = history[j] == t;
        if (seen) continue;
        float *l = &s->work[t];
        *l = *l > 0 ? *l / penalty : *l * penalty;
    }
}

static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int compare_desc(const void *a, const void *b, void *ctx) {
    const float *w = ctx;
    float x = w[*(const int32_t *)a], y = w[*(const int32_t *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int32_t *)a - *(const int32_t *)b; /* stable by id */
}

/* Logits scanned per step of select_top's filter. */
#define TOP_SCAN 16

/* Whether any of TOP_SCAN logits is above bar (or NaN). Not inlined:
 * inlined, GCC 12 unrolls the loop into 16 scalar compares instead of
 * vectorizing it. */
__attribute__((noinline)) static int any_above(const float *x, float bar) {
    int above = 0;
    for (int i = 0; i < TOP_SCAN; i++) above |= !(x[i] <= bar);
    return above;
}

/* Puts the k best ids of x first in s->order (sorted, ties by id). */
static int select_top(lp_sampler *s, const float *x, int k) {
    int n = s->n_vocab;
    if (k <= 0 || k >= n) {
        for (int i = 0; i < n; i++) s->order[i] = i;
        qsort_r(s->order, (size_t)n, sizeof(int32_t), compare_desc, (void *)x);
        return n;
    }
    /* Keep a sorted list of the k best seen so far: k is small. Once it is
     * full, most logits are at or below its last, so runs of TOP_SCAN are
     * first tested against it at once (a loop the compiler vectorizes) and
     * skipped whole; a run with a candidate goes one by one, as always.
     * The bar only rises, so a logit the test skips would be skipped. */
    int have = 0;
    for (int i0 = 0; i0 < n; i0 += TOP_SCAN) {
        int i1 = n - i0 < TOP_SCAN ? n : i0 + TOP_SCAN;
        if (have == k && i1 - i0 == TOP_SCAN && !any_above(x + i0, x[s->order[k - 1]])) continue;
        for (int i = i0; i < i1; i++) {
            float v = x[i];
            if (have == k && v <= x[s->order[k - 1]]) continue;
            int pos = have < k ? have++ : k - 1;
            while (pos > 0 && x[s->order[pos - 1]] < v) {
                s->order[pos] = s->order[pos - 1];
                pos--;
            }
            s->order[pos] = i;
        }
    }
    return have;
}

int32_t lp_sampler_sample(lp_sampler *s, const float *logits, const int32_t *history,
                          int n_history) {
    const lp_sampler_params *p = &s->params;
    /* the logits are copied only when a penalty changes them */
    const float *x = logits;
    if (p->repeat_penalty != 1.0f && n_history > 0) {
        memcpy(s->work, logits, (size_t)s->n_vocab * sizeof(float));
        apply_repeat_penalty(s, history, n_history);
        x = s->work;
    }
    if (p->temperature <= 0.0f) return argmax(x, s->n_vocab);

    int n = select_top(s, x, p->top_k);
    if (x != s->work)
        for (int i = 0; i < n; i++) s->work[s->order[i]] = x[s->order[i]];
    /* softmax over the candidates at temperature T */
    float max = s->work[s->order[0]], sum = 0;
    for (int i = 0; i < n; i++) {
        float e = expf((s->work[s->order[i]] - max) / p->temperature);
        s->work[s->order[i]] = e;
        sum += e;
    }
    /* top-p: smallest prefix whose mass reaches p; min-p: drop candidates
     * below min_p times the best probability. */
    float cumulative = 0, best = s->work[s->order[0]] / sum;
    int keep = 0;
    for (int i = 0; i < n; i++) {
        float prob = s->work[s->order[i]] / sum;
        if (i > 0 && prob < p->min_p * best) break;
        keep = i + 1;
        cumulative += prob;
        if (cumulative >= p->top_p) break;
    }
    float kept = 0;
    for (int i = 0; i < keep; i++) kept += s->work[s->order[i]];
    float r = lp_rng_uniform(&s->rng) * kept, acc = 0;
    for (int i = 0; i < keep; i++) {
        acc += s->work[s->order[i]];
        if (r < acc) return s->order[i];
    }
    return s->order[keep - 1];
}
