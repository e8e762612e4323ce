/* Token sampling: repetition penalty, OpenAI's presence and frequency
 * penalties and logit bias, then greedy, or temperature followed by top-k,
 * top-p and min-p filtering and a seeded draw; log-probabilities on request
 * from the penalized logits. Scratch arrays are allocated with the sampler,
 * never per token. */
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
    lp_logit_bias *bias; /* [params.n_logit_bias] a copy of the caller's */
    uint8_t *seen;   /* [n_vocab] zero between calls: presence marks */
    float *copy;     /* [n_vocab] penalized logits kept for log-probabilities
                        while a draw overwrites work (made on first use) */
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
    const lp_sampler_params *p = &s->params;
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty) || p->n_logit_bias < 0 ||
        (p->n_logit_bias > 0 && !p->logit_bias)) {
        free(s);
        lp_fail(err, "sampler settings out of range (finite presence / frequency penalties, a logit bias list)");
        return NULL;
    }
    for (int i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].token < 0 || p->logit_bias[i].token >= s->n_vocab || !isfinite(p->logit_bias[i].bias)) {
            int32_t t = p->logit_bias[i].token;
            free(s);
            lp_fail(err, "logit bias for token %d: not a token of this vocabulary (%d) or not a finite bias", (int)t,
                    model->hp.n_vocab);
            return NULL;
        }
    s->work = lp_alloc((size_t)s->n_vocab * sizeof(float));
    s->order = lp_alloc((size_t)s->n_vocab * sizeof(int32_t));
    s->seen = calloc((size_t)s->n_vocab, 1);
    if (p->n_logit_bias > 0) {
        s->bias = malloc((size_t)p->n_logit_bias * sizeof *s->bias);
        if (s->bias) memcpy(s->bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof *s->bias);
    }
    s->params.logit_bias = s->bias;
    if (!s->work || !s->order || !s->seen || (p->n_logit_bias > 0 && !s->bias)) {
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
    free(s->seen);
    free(s->bias);
    lp_free(s->copy);
    free(s);
}

lp_sampler_params lp_sampler_get_params(const lp_sampler *s) { return s->params; }

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

/* OpenAI's rule over the generated tokens: -presence once per distinct
 * token, -frequency per occurrence. */
static void apply_openai_penalties(lp_sampler *s, const int32_t *gen, int n) {
    const lp_sampler_params *p = &s->params;
    for (int i = 0; i < n; i++) {
        int32_t t = gen[i];
        if (t < 0 || t >= s->n_vocab) continue;
        s->work[t] -= p->frequency_penalty;
        if (!s->seen[t]) s->work[t] -= p->presence_penalty;
        s->seen[t] = 1;
    }
    for (int i = 0; i < n; i++)
        if (gen[i] >= 0 && gen[i] < s->n_vocab) s->seen[gen[i]] = 0;
}

/* log-softmax of x at the chosen token and the n_top best. */
static void logprobs(lp_sampler *s, const float *x, int32_t tok, int n_top, lp_token_logprobs *lp) {
    float max = x[argmax(x, s->n_vocab)];
    double sum = 0;
    for (int i = 0; i < s->n_vocab; i++) sum += exp((double)x[i] - max);
    double lse = max + log(sum);
    lp->token = tok;
    lp->logprob = (float)(x[tok] - lse);
    if (n_top > LP_MAX_TOP_LOGPROBS) n_top = LP_MAX_TOP_LOGPROBS;
    if (n_top > s->n_vocab) n_top = s->n_vocab;
    lp->n_top = n_top > 0 ? select_top(s, x, n_top) : 0;
    for (int i = 0; i < lp->n_top; i++) {
        lp->top_token[i] = s->order[i];
        lp->top_logprob[i] = (float)(x[s->order[i]] - lse);
    }
}

static int32_t draw(lp_sampler *s, const float *x);

int32_t lp_sampler_sample(lp_sampler *s, const float *logits, const int32_t *history,
                          int n_history) {
    return lp_sampler_sample_ex(s, logits, history, n_history, n_history, 0, NULL);
}

int32_t lp_sampler_sample_ex(lp_sampler *s, const float *logits, const int32_t *history, int n_history,
                             int n_generated, int n_top, lp_token_logprobs *lp) {
    const lp_sampler_params *p = &s->params;
    if (n_generated > n_history) n_generated = n_history;
    bool repeat = p->repeat_penalty != 1.0f && n_history > 0;
    bool openai = (p->presence_penalty != 0 || p->frequency_penalty != 0) && n_generated > 0;
    /* the logits are copied only when a penalty or bias changes them */
    const float *x = logits;
    if (repeat || openai || p->n_logit_bias > 0) {
        memcpy(s->work, logits, (size_t)s->n_vocab * sizeof(float));
        if (repeat) apply_repeat_penalty(s, history, n_history);
        if (openai) apply_openai_penalties(s, history + n_history - n_generated, n_generated);
        for (int i = 0; i < p->n_logit_bias; i++) s->work[s->bias[i].token] += s->bias[i].bias;
        x = s->work;
    }
    int32_t tok;
    if (p->temperature <= 0.0f) {
        tok = argmax(x, s->n_vocab);
        if (lp) logprobs(s, x, tok, n_top, lp);
        return tok;
    }
    if (!lp) return draw(s, x);
    /* the draw overwrites work: the log-probabilities come from a copy */
    lp_token_logprobs tops;
    if (x == s->work) {
        if (!s->copy) s->copy = lp_alloc((size_t)s->n_vocab * sizeof(float)); /* once */
        if (!s->copy) {
            lp->token = -1; /* out of memory: no log-probabilities */
            return draw(s, x);
        }
        memcpy(s->copy, x, (size_t)s->n_vocab * sizeof(float));
    }
    tok = draw(s, x);
    logprobs(s, x == s->work ? s->copy : x, tok, n_top, &tops);
    *lp = tops;
    return tok;
}

/* Temperature, top-k, top-p, min-p and the seeded draw over x (which may be
 * s->work; it is overwritten). */
static int32_t draw(lp_sampler *s, const float *x) {
    const lp_sampler_params *p = &s->params;
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
