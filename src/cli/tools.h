/* Helpers shared by `loraplex bench` and `loraplex eval`: summary statistics,
 * distributions from logits, and option parsing that does not depend on the
 * rest of the CLI (so tests can include cli_eval.c on its own).
 * Header-only: every function is static inline. */
#ifndef LP_CLI_TOOLS_H
#define LP_CLI_TOOLS_H

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loraplex.h"

/* ---- summary statistics ------------------------------------------------------ */

typedef struct tool_summary {
    double median, min, max, mean;
    int n;
} tool_summary;

static inline int tool_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* q-quantile (0..1) of sorted values, linear interpolation between the two
 * nearest ranks (numpy's default). */
static inline double tool_quantile_sorted(const double *sorted, int n, double q) {
    if (n <= 0) return 0.0;
    if (q <= 0) return sorted[0];
    if (q >= 1) return sorted[n - 1];
    double at = q * (double)(n - 1);
    int lo = (int)at;
    if (lo >= n - 1) return sorted[n - 1];
    double frac = at - lo;
    return sorted[lo] + frac * (sorted[lo + 1] - sorted[lo]);
}

/* Sorts v in place and summarizes it. */
static inline tool_summary tool_summarize_inplace(double *v, int n) {
    tool_summary s = {0, 0, 0, 0, n};
    if (n <= 0) return s;
    qsort(v, (size_t)n, sizeof *v, tool_cmp_double);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    s.median = tool_quantile_sorted(v, n, 0.5);
    s.min = v[0];
    s.max = v[n - 1];
    s.mean = sum / n;
    return s;
}

/* Summary of up to 64 values without touching the caller's array. */
static inline tool_summary tool_summarize(const double *v, int n) {
    double copy[64];
    if (n > 64) n = 64;
    if (n > 0) memcpy(copy, v, (size_t)n * sizeof *v);
    return tool_summarize_inplace(copy, n);
}

/* ---- distributions from logits ------------------------------------------------------ */

/* log of the softmax normalizer: log sum_i exp(logits[i]) */
static inline double tool_log_sum_exp(const float *logits, int n) {
    float mx = logits[0];
    for (int i = 1; i < n; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
    return mx + log(sum);
}

static inline int tool_argmax(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* KL(P || Q) in nats, P = softmax(ref), Q = softmax(model). Exactly 0 for
 * identical logits (each term is p * (x - x) with the same normalizers). */
static inline double tool_kl_logits(const float *ref, const float *model, int n) {
    double lzp = tool_log_sum_exp(ref, n), lzq = tool_log_sum_exp(model, n), kl = 0;
    for (int i = 0; i < n; i++) {
        double lp = ref[i] - lzp, lq = model[i] - lzq;
        kl += exp(lp) * (lp - lq);
    }
    return kl;
}

/* KL(P || Q) of explicit probability vectors (terms with p = 0 contribute 0). */
static inline double tool_kl_probs(const double *p, const double *q, int n) {
    double kl = 0;
    for (int i = 0; i < n; i++)
        if (p[i] > 0) kl += p[i] * log(p[i] / q[i]);
    return kl;
}

/* Root mean square and mean of values. */
static inline double tool_rms(const double *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i] * v[i];
    return n > 0 ? sqrt(s / n) : 0.0;
}

/* ---- option parsing ------------------------------------------------------------- */

static inline bool tool_parse_long(const char *opt, const char *text, long min, long max,
                                   long *out) {
    char *end;
    errno = 0;
    long v = text ? strtol(text, &end, 10) : 0;
    if (!text || !*text || *end || errno || v < min || v > max) {
        fprintf(stderr, "loraplex: %s expects an integer in %ld..%ld, got '%s'\n", opt, min,
                max, text ? text : "");
        return false;
    }
    *out = v;
    return true;
}

/* "1,2,4" -> {1,2,4}; returns the count or -1 (after printing why). */
static inline int tool_parse_int_list(const char *opt, const char *text, long min, long max,
                                      int *out, int cap) {
    int n = 0;
    const char *p = text;
    while (p && *p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[32];
        long v;
        if (len == 0 || len >= sizeof item || n == cap) {
            fprintf(stderr, "loraplex: %s: bad list '%s' (at most %d comma-separated values)\n",
                    opt, text, cap);
            return -1;
        }
        memcpy(item, p, len);
        item[len] = 0;
        if (!tool_parse_long(opt, item, min, max, &v)) return -1;
        out[n++] = (int)v;
        p = comma ? comma + 1 : NULL;
    }
    if (n == 0) {
        fprintf(stderr, "loraplex: %s needs at least one value\n", opt);
        return -1;
    }
    return n;
}

/* Writes s as a JSON string literal. */
static inline void tool_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* "path[:scale]" -> an adapter loaded for model (spec's colon is cut). */
static inline lp_adapter *tool_load_adapter(const lp_model *model, char *spec, lp_error *err) {
    float scale = 1.0f;
    char *colon = strrchr(spec, ':');
    if (colon && colon[1]) {
        char *end;
        double s = strtod(colon + 1, &end);
        if (*end == 0) {
            scale = (float)s;
            *colon = 0;
        }
    }
    return lp_adapter_load(model, spec, scale, err);
}

#endif
