/* chrF (Popović 2015): a character n-gram F-score, used to give partial
 * credit to task outputs that are not an exact match. */
#include <stdlib.h>
#include <string.h>

#include "world.h"

/* Copies s without whitespace into a malloc'd buffer; *n gets its length. */
static char *strip_spaces(const char *s, size_t *n) {
    size_t len = strlen(s), o = 0;
    char *out = malloc(len + 1);
    if (!out) return NULL;
    for (size_t i = 0; i < len; i++)
        if (s[i] != ' ' && (s[i] < '\t' || s[i] > '\r')) out[o++] = s[i];
    out[o] = '\0';
    *n = o;
    return out;
}

/* Matched n-grams: each reference n-gram may match one hypothesis n-gram
 * (the sum over distinct n-grams of min(count in hyp, count in ref)). */
static size_t ngram_matches(const char *h, size_t hn, const char *r, size_t rn, size_t n,
                            unsigned char *used) {
    size_t nr = rn - n + 1, matches = 0;
    memset(used, 0, nr);
    for (size_t i = 0; i + n <= hn; i++)
        for (size_t j = 0; j < nr; j++)
            if (!used[j] && memcmp(h + i, r + j, n) == 0) {
                used[j] = 1;
                matches++;
                break;
            }
    return matches;
}

double lp_chrf(const char *hyp, const char *ref) {
    const double beta2 = 4.0; /* beta = 2: recall weighs twice precision */
    size_t hn = 0, rn = 0;
    char *h = strip_spaces(hyp, &hn), *r = strip_spaces(ref, &rn);
    unsigned char *used = malloc(rn + 1);
    double score = 0.0;
    if (!h || !r || !used) goto done;
    if (hn == 0 || rn == 0) {
        score = hn == rn ? 100.0 : 0.0;
        goto done;
    }
    double sum_p = 0.0, sum_r = 0.0;
    int orders = 0;
    for (size_t n = 1; n <= 6; n++) {
        if (n > hn || n > rn) break; /* no n-grams of this order on one side */
        double m = (double)ngram_matches(h, hn, r, rn, n, used);
        sum_p += m / (double)(hn - n + 1);
        sum_r += m / (double)(rn - n + 1);
        orders++;
    }
    double p = sum_p / orders, rc = sum_r / orders;
    score = p + rc > 0 ? 100.0 * (1 + beta2) * p * rc / (beta2 * p + rc) : 0.0;
done:
    free(h);
    free(r);
    free(used);
    return score;
}
