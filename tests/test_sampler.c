/* The sampler against a plain reference of its documented rule: penalties,
 * then greedy, or every logit sorted (descending, ties by id), the first
 * top-k kept, softmax at temperature T, top-p and min-p cuts, one seeded
 * draw. Same seed, same logits: the same token, for logit sets built to
 * stress the top-k scan (ties, rising runs, -inf, a vocabulary that is not
 * a multiple of the scan width). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model/model.h"

enum { VOCAB = 1003, DRAWS = 40 };

static const float *sort_keys;

static int by_logit_desc(const void *a, const void *b) {
    float x = sort_keys[*(const int32_t *)a], y = sort_keys[*(const int32_t *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

static int32_t reference_sample(const lp_sampler_params *p, lp_rng *rng, const float *logits, const int32_t *history,
                                 int n_history) {
    static float w[VOCAB];
    static int32_t order[VOCAB];
    memcpy(w, logits, sizeof w);
    int from = n_history - p->repeat_last_n < 0 ? 0 : n_history - p->repeat_last_n;
    if (p->repeat_penalty != 1.0f)
        for (int i = from; i < n_history; i++) {
            bool seen = false;
            for (int j = from; j < i; j++) seen |= history[j] == history[i];
            if (!seen) w[history[i]] = w[history[i]] > 0 ? w[history[i]] / p->repeat_penalty
                                                         : w[history[i]] * p->repeat_penalty;
        }
    if (p->temperature <= 0) {
        int32_t best = 0;
        for (int i = 1; i < VOCAB; i++)
            if (w[i] > w[best]) best = i;
        return best;
    }
    for (int i = 0; i < VOCAB; i++) order[i] = i;
    sort_keys = w;
    qsort(order, VOCAB, sizeof order[0], by_logit_desc);
    int n = p->top_k > 0 && p->top_k < VOCAB ? p->top_k : VOCAB;
    float max = w[order[0]], sum = 0;
    for (int i = 0; i < n; i++) {
        w[order[i]] = expf((w[order[i]] - max) / p->temperature);
        sum += w[order[i]];
    }
    float cumulative = 0, best = w[order[0]] / sum;
    int keep = 0;
    for (int i = 0; i < n; i++) {
        float prob = w[order[i]] / sum;
        if (i > 0 && prob < p->min_p * best) break;
        keep = i + 1;
        cumulative += prob;
        if (cumulative >= p->top_p) break;
    }
    float kept = 0;
    for (int i = 0; i < keep; i++) kept += w[order[i]];
    float r = lp_rng_uniform(rng) * kept, acc = 0;
    for (int i = 0; i < keep; i++) {
        acc += w[order[i]];
        if (r < acc) return order[i];
    }
    return order[keep - 1];
}

/* Logit set `kind` into x. */
static void make_logits(int kind, lp_rng *rng, float *x) {
    for (int i = 0; i < VOCAB; i++) {
        float g = lp_rng_normal(rng) * 3.0f;
        switch (kind) {
        case 0: x[i] = g; break;                          /* plain */
        case 1: x[i] = floorf(g);  break;                 /* many ties */
        case 2: x[i] = (float)i * 0.01f; break;           /* rising: every logit a candidate */
        case 3: x[i] = i % 7 ? -INFINITY : g; break;      /* mostly -inf */
        default: x[i] = i >= VOCAB - 5 ? 50.0f + g : g;   /* the best at the very end */
        }
    }
}

static void test_sampler_matches_reference(void) {
    lp_model model;
    memset(&model, 0, sizeof model);
    model.hp.n_vocab = VOCAB;
    static const struct { float temp; int top_k; float top_p, min_p, penalty; } cases[] = {
        {0.8f, 40, 0.95f, 0.05f, 1.0f}, {1.0f, 1, 1.0f, 0.0f, 1.0f},   {1.5f, 5, 1.0f, 0.0f, 1.0f},
        {2.0f, 100, 0.9f, 0.0f, 1.0f},  {0.7f, 0, 0.95f, 0.01f, 1.0f}, {1.0f, VOCAB + 5, 1.0f, 0.0f, 1.3f},
        {0.9f, 40, 1.0f, 0.0f, 1.3f},   {0.0f, 40, 1.0f, 0.0f, 1.0f},  {0.0f, 0, 1.0f, 0.0f, 1.1f},
    };
    static float logits[VOCAB];
    int32_t history[64];
    lp_rng data;
    lp_rng_seed(&data, 7);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int kind = 0; kind < 5; kind++) {
            lp_sampler_params p = lp_sampler_default_params();
            p.temperature = cases[c].temp;
            p.top_k = cases[c].top_k;
            p.top_p = cases[c].top_p;
            p.min_p = cases[c].min_p;
            p.repeat_penalty = cases[c].penalty;
            p.seed = 100 + c;
            lp_error err;
            lp_sampler *s = lp_sampler_create(&model, &p, &err);
            CHECK_MSG(s != NULL, "%s", err.message);
            if (!s) return;
            lp_rng ref;
            lp_rng_seed(&ref, p.seed);
            int bad = 0;
            for (int d = 0; d < DRAWS; d++) {
                make_logits(kind, &data, logits);
                int n_history = d % 64;
                for (int i = 0; i < n_history; i++) history[i] = (int32_t)(lp_rng_u64(&data) % VOCAB);
                int32_t got = lp_sampler_sample(s, logits, history, n_history);
                int32_t want = reference_sample(&p, &ref, logits, history, n_history);
                bad += got != want;
            }
            CHECK_MSG(bad == 0, "case %zu, logits %d: %d of %d draws differ from the reference", c, kind, bad, DRAWS);
            lp_sampler_free(s);
        }
}

int main(void) {
    test_sampler_matches_reference();
    return check_summary("test_sampler");
}
