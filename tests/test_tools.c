/* The benchmark/evaluation tools: statistics helpers, KL and Δp on known
 * distributions, the SVG writer's output, and eval of a model against itself
 * (KL 0, same top token everywhere) and against a different model (KL > 0). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cli/cli_eval.c"
#include "cli/svg.c"

static void test_summary(void) {
    double v[] = {5, 1, 4, 2, 3};
    tool_summary s = tool_summarize(v, 5);
    CHECK_NEAR(s.median, 3, 0);
    CHECK_NEAR(s.min, 1, 0);
    CHECK_NEAR(s.max, 5, 0);
    CHECK_NEAR(s.mean, 3, 1e-12);
    CHECK(v[0] == 5); /* the caller's array is untouched */
    double even[] = {4, 1, 3, 2};
    CHECK_NEAR(tool_summarize(even, 4).median, 2.5, 1e-12);
    double one[] = {7};
    s = tool_summarize(one, 1);
    CHECK(s.median == 7 && s.min == 7 && s.max == 7);
    double sorted[101];
    for (int i = 0; i <= 100; i++) sorted[i] = i;
    CHECK_NEAR(tool_quantile_sorted(sorted, 101, 0.99), 99, 1e-9);
    CHECK_NEAR(tool_quantile_sorted(sorted, 101, 0.5), 50, 1e-9);
    CHECK_NEAR(tool_quantile_sorted(sorted, 11, 0.25), 2.5, 1e-9);
    double rms[] = {3, -4};
    CHECK_NEAR(tool_rms(rms, 2), sqrt(12.5), 1e-12);
}

static void test_kl(void) {
    /* KL of two coins: p = (1/2, 1/2), q = (1/4, 3/4) */
    double p[] = {0.5, 0.5}, q[] = {0.25, 0.75};
    double expect = 0.5 * log(0.5 / 0.25) + 0.5 * log(0.5 / 0.75);
    CHECK_NEAR(tool_kl_probs(p, q, 2), expect, 1e-12);
    /* the same from logits (log probabilities plus any constant) */
    float lp[] = {logf(0.5f) + 3, logf(0.5f) + 3}, lq[] = {logf(0.25f) - 1, logf(0.75f) - 1};
    CHECK_NEAR(tool_kl_logits(lp, lq, 2), expect, 1e-6);
    CHECK(tool_kl_logits(lp, lp, 2) == 0);
    float big[] = {1000, 999, -1000};   /* no overflow in the normalizer */
    CHECK_NEAR(tool_log_sum_exp(big, 3), 1000 + log(1 + exp(-1.0)), 1e-6);
    CHECK(tool_argmax(big, 3) == 0);
    double zero[] = {1, 0}, q2[] = {0.5, 0.5};
    CHECK_NEAR(tool_kl_probs(zero, q2, 2), log(2.0), 1e-12);
}

static void test_lists(void) {
    int v[4];
    CHECK(tool_parse_int_list("-t", "1,2,16", 1, 64, v, 4) == 3 && v[2] == 16);
    CHECK(tool_parse_int_list("-t", "1,,2", 1, 64, v, 4) < 0);
    CHECK(tool_parse_int_list("-t", "1,2,3,4,5", 1, 64, v, 4) < 0);
    CHECK(tool_parse_int_list("-t", "0", 1, 64, v, 4) < 0);
    CHECK(tool_parse_int_list("-t", "", 1, 64, v, 4) < 0);
}

/* Counts "<tag" openings minus "</tag" closings and self-closing "/>". */
static int tag_balance(const char *s, const char *tag) {
    char open[32], close[32];
    snprintf(open, sizeof open, "<%s", tag);
    snprintf(close, sizeof close, "</%s>", tag);
    int bal = 0;
    for (const char *p = s; (p = strstr(p, open)); p++) {
        const char *end = strchr(p, '>');
        char after = p[strlen(open)];
        if (after != ' ' && after != '>') continue;
        bal += !(end && end[-1] == '/');
    }
    for (const char *p = s; (p = strstr(p, close)); p++) bal--;
    return bal;
}

static void test_svg(void) {
    double x[] = {1, 2, 4, 8}, a[] = {1, 2, 3, 4}, b[] = {4, 3, NAN, 1};
    const char *names[] = {"a <concurrent>", "b & c"};
    const double *ys[] = {a, b};
    const char *cats[] = {"K=1", "K=4", "K=10", "K=32"};
    svg_chart charts[2] = {
        {"Lines", "N", "seconds", false, true, 4, x, NULL, 2, names, ys},
        {"Bars", "K", "GiB", true, false, 4, NULL, cats, 2, names, ys},
    };
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(f && svg_write(f, charts, 2) == 0);
    if (f) fclose(f);
    CHECK(buf && !strncmp(buf, "<svg ", 5));
    CHECK(buf && strstr(buf, "</svg>\n") && strlen(strstr(buf, "</svg>")) == 7);
    if (buf) {
        CHECK(tag_balance(buf, "svg") == 0);
        CHECK(tag_balance(buf, "text") == 0);
        CHECK(strstr(buf, "a &lt;concurrent&gt;") && strstr(buf, "b &amp; c"));
        CHECK(!strstr(buf, "<concurrent>"));
        CHECK(strstr(buf, "<polyline") && strstr(buf, "<rect"));
        CHECK(!strstr(buf, "nan") && !strstr(buf, "inf"));
    }
    free(buf);
    /* malformed charts are refused, nothing written */
    svg_chart empty = {"x", "x", "y", false, false, 0, x, NULL, 1, names, ys};
    CHECK(svg_write(stdout, &empty, 1) < 0);
    CHECK_NEAR(svg_nice_step(10, 5), 2, 0);
    CHECK_NEAR(svg_nice_step(0.7, 5), 0.2, 1e-12);
    CHECK_NEAR(svg_nice_step(430, 5), 100, 0);
}

static void test_eval(void) {
    lp_error err = {0};
    lp_model *m = lp_model_load(LP_SHARED_MODELS "/stories260K.gguf", NULL, &err);
    lp_model *merged = lp_model_load(LP_SHARED_MODELS "/stories260K-lora-r4-merged.gguf", NULL, &err);
    CHECK_MSG(m && merged, "%s", err.message);
    if (!m || !merged) {
        lp_model_free(m);
        lp_model_free(merged);
        return;
    }
    const char *text = "Once upon a time, there was a little girl named Lily. She loved to play "
                       "outside in the sunshine. One day, she saw a big, red ball in the park.";
    int32_t *tokens = NULL;
    int n = 0;
    CHECK(eval_tokenize(m, text, strlen(text), &tokens, &n, &err) == 0 && n >= 32);
    eval_options o = {.chunk_tokens = 32, .max_chunks = 1, .threads = 1};
    eval_result r;
    CHECK_MSG(eval_run(m, m, tokens, n, &o, &r, &err) == 0, "%s", err.message);
    CHECK(r.n_chunks == 1 && r.n_scored == 15);
    CHECK(r.kl_mean == 0 && r.kl_max == 0 && r.same_top_pct == 100);
    CHECK(r.dp_rms == 0 && r.top_dp_max_abs == 0);
    CHECK(r.ppl > 1 && r.ppl < 512 && r.ppl == r.ref_ppl);
    CHECK_MSG(eval_run(merged, m, tokens, n, &o, &r, &err) == 0, "%s", err.message);
    CHECK(r.kl_mean > 0 && r.kl_max >= r.kl_p99 && r.kl_p99 >= r.kl_median);
    CHECK(r.same_top_pct < 100 && r.dp_rms > 0);
    /* an adapter at run time against the same adapter merged: the same model */
    lp_adapter *lora = lp_adapter_load(m, LP_SHARED_MODELS "/stories260K-lora-r4-random-f32.gguf", 1.0f, &err);
    CHECK_MSG(lora, "%s", err.message);
    if (lora) {
        o.adapter = lora;
        o.kv_f32 = true; /* the same math in another order: no f16 rounding flips */
        CHECK_MSG(eval_run(m, merged, tokens, n, &o, &r, &err) == 0, "%s", err.message);
        CHECK_MSG(r.kl_mean < 1e-6 && r.same_top_pct == 100, "adapter vs merged: KL %g", r.kl_mean);
        o.kv_f32 = false;
        /* adapter on both sides: identical; on one side only: different */
        o.ref_adapter = lora;
        CHECK(eval_run(m, m, tokens, n, &o, &r, &err) == 0 && r.kl_max == 0 && r.dp_rms == 0);
        o.adapter = NULL;
        CHECK(eval_run(m, m, tokens, n, &o, &r, &err) == 0 && r.kl_mean > 1e-4);
        o.ref_adapter = NULL;
        lp_adapter_free(lora);
    }
    /* perplexity only */
    CHECK(eval_run(m, NULL, tokens, n, &o, &r, &err) == 0 && !r.has_ref);
    /* too short for one chunk: a clear error */
    o.chunk_tokens = 4096;
    CHECK(eval_run(m, NULL, tokens, n, &o, &r, &err) < 0 && strstr(err.message, "chunk"));
    free(tokens);
    lp_model_free(m);
    lp_model_free(merged);
}

int main(void) {
    test_summary();
    test_kl();
    test_lists();
    test_svg();
    test_eval();
    return check_summary("tools");
}
