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

/* The logits after the penalties and bias into w: llama.cpp's repeat
 * penalty over the history, OpenAI's presence / frequency penalties over its
 * last n_generated entries (counted plainly), the bias added. */
static void reference_penalize(const lp_sampler_params *p, const float *logits, const int32_t *history,
                               int n_history, int n_generated, float *w) {
    memcpy(w, logits, VOCAB * sizeof *w);
    int from = n_history - p->repeat_last_n < 0 ? 0 : n_history - p->repeat_last_n;
    if (p->repeat_penalty != 1.0f)
        for (int i = from; i < n_history; i++) {
            bool seen = false;
            for (int j = from; j < i; j++) seen |= history[j] == history[i];
            if (!seen) w[history[i]] = w[history[i]] > 0 ? w[history[i]] / p->repeat_penalty
                                                         : w[history[i]] * p->repeat_penalty;
        }
    const int32_t *gen = history + n_history - n_generated;
    for (int32_t t = 0; t < VOCAB; t++) {
        int count = 0;
        for (int i = 0; i < n_generated; i++) count += gen[i] == t;
        if (count) w[t] -= p->frequency_penalty * (float)count + p->presence_penalty;
    }
    for (int i = 0; i < p->n_logit_bias; i++) w[p->logit_bias[i].token] += p->logit_bias[i].bias;
}

static int32_t reference_sample(const lp_sampler_params *p, lp_rng *rng, const float *logits, const int32_t *history,
                                 int n_history, int n_generated) {
    static float w[VOCAB];
    static int32_t order[VOCAB];
    reference_penalize(p, logits, history, n_history, n_generated, w);
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
                int32_t want = reference_sample(&p, &ref, logits, history, n_history, n_history);
                bad += got != want;
            }
            CHECK_MSG(bad == 0, "case %zu, logits %d: %d of %d draws differ from the reference", c, kind, bad, DRAWS);
            lp_sampler_free(s);
        }
}

/* Presence / frequency penalties over the generated tokens only, logit bias,
 * and log-probabilities: the token equals the reference's draw, and the
 * reported log-probabilities equal a double log-softmax of the reference's
 * penalized logits (before temperature), top list sorted and holding the
 * best tokens. */
static void test_penalties_bias_logprobs(void) {
    lp_model model;
    memset(&model, 0, sizeof model);
    model.hp.n_vocab = VOCAB;
    const lp_logit_bias bias[] = {{3, 5.0f}, {VOCAB - 1, -100.0f}, {500, 2.5f}};
    static const struct { float temp, presence, frequency; int n_bias, n_top; } cases[] = {
        {0.0f, 0.5f, 0.0f, 0, 5}, {0.0f, 0.0f, 1.5f, 3, 20}, {0.8f, 1.0f, 0.7f, 3, 3},
        {1.2f, -0.5f, 0.3f, 1, 0}, {0.0f, 2.0f, 2.0f, 3, 1},
    };
    static float logits[VOCAB], w[VOCAB];
    int32_t history[80];
    lp_rng data;
    lp_rng_seed(&data, 11);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        lp_sampler_params p = lp_sampler_default_params();
        p.temperature = cases[c].temp;
        p.presence_penalty = cases[c].presence;
        p.frequency_penalty = cases[c].frequency;
        p.logit_bias = bias;
        p.n_logit_bias = cases[c].n_bias;
        p.seed = 300 + c;
        lp_error err;
        lp_sampler *s = lp_sampler_create(&model, &p, &err);
        CHECK_MSG(s != NULL, "%s", err.message);
        if (!s) return;
        lp_rng ref;
        lp_rng_seed(&ref, p.seed);
        int bad_token = 0, bad_lp = 0;
        for (int d = 0; d < DRAWS; d++) {
            make_logits(d % 5, &data, logits);
            int n_history = 16 + d, n_generated = d % 12;
            /* few distinct tokens, so repeats are counted */
            for (int i = 0; i < n_history; i++) history[i] = (int32_t)(lp_rng_u64(&data) % 9) * 37;
            lp_token_logprobs lp;
            int32_t got = lp_sampler_sample_ex(s, logits, history, n_history, n_generated, cases[c].n_top, &lp);
            int32_t want = reference_sample(&p, &ref, logits, history, n_history, n_generated);
            bad_token += got != want;
            reference_penalize(&p, logits, history, n_history, n_generated, w);
            double max = -INFINITY, sum = 0;
            for (int i = 0; i < VOCAB; i++) max = w[i] > max ? w[i] : max;
            for (int i = 0; i < VOCAB; i++) sum += exp((double)w[i] - max);
            double lse = max + log(sum);
            bool ok = lp.token == got && fabs(lp.logprob - (w[got] - lse)) < 1e-4 && lp.n_top == cases[c].n_top;
            for (int i = 0; ok && i < lp.n_top; i++) {
                ok = fabs(lp.top_logprob[i] - (w[lp.top_token[i]] - lse)) < 1e-4 &&
                     (i == 0 || lp.top_logprob[i] <= lp.top_logprob[i - 1]);
                /* nothing outside the list beats its last */
                for (int t = 0; ok && i == lp.n_top - 1 && t < VOCAB; t++) {
                    bool listed = false;
                    for (int k = 0; k < lp.n_top; k++) listed |= lp.top_token[k] == t;
                    ok = listed || w[t] <= w[lp.top_token[i]];
                }
            }
            if (ok && p.temperature == 0 && lp.n_top > 0) ok = lp.top_token[0] == got;
            bad_lp += !ok;
        }
        CHECK_MSG(bad_token == 0, "penalty case %zu: %d of %d draws differ from the reference", c, bad_token, DRAWS);
        CHECK_MSG(bad_lp == 0, "penalty case %zu: %d of %d log-probability sets differ from the reference", c, bad_lp,
                  DRAWS);
        lp_sampler_free(s);
    }
    /* a bias naming a token outside the vocabulary is refused */
    lp_sampler_params p = lp_sampler_default_params();
    const lp_logit_bias outside = {VOCAB, 1.0f};
    p.logit_bias = &outside;
    p.n_logit_bias = 1;
    lp_error err;
    CHECK(lp_sampler_create(&model, &p, &err) == NULL);
}

int main(void) {
    test_sampler_matches_reference();
    test_penalties_bias_logprobs();
    return check_summary("test_sampler");
}
