/* loraplex bench --speculate: what speculative decoding buys per task.
 *
 *   bench --speculate DIR|F.lpf|none -m BASE [--adapters name=A.lpa,...]
 *         --data DIR/tasks [--records N] [-n N] [--trees "3,2;4"] [--lookup N:L]
 *
 * For every task (an adapter name, or "base" without adapters): the first N
 * prompts of DIR/tasks/<task>.eval.jsonl decoded greedily one at a time,
 * plainly and under each candidate tree (forecast rows from DIR/<task>.lpf
 * when the file exists, prompt lookup, both). Reported per tree: decode
 * tok/s, speedup over plain, tokens per pass, rows per pass, the speedup a
 * cost model predicts (tokens per pass over the measured cost of a pass of
 * that many rows), and how many outputs were identical to plain decoding
 * (all must be); the tree with the best measured tok/s is the one chosen.
 * First, once: the cost of one forward of R tree rows relative to 1 row. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/base.h"
#include "cli.h"
#include "tools.h"

int cli_bench_speculate(int argc, char **argv);
int cli_kernels_line(char *buf, size_t cap, lp_error *err); /* cli_model.c */

#define MAX_TASKS 32
#define MAX_TREES 20
#define MAX_RECORDS 4096
#define MAX_OUT 512
#define COST_SHOWN 10

static const int cost_rows[COST_SHOWN] = {1, 2, 3, 4, 6, 8, 12, 16, 32, 64};

typedef struct spec_options {
    const char *model, *speculate, *adapters, *data, *trees, *lookup;
    int records, n_gen, threads, reps;
    bool json;
} spec_options;

/* One way to decode: the tree (branches, depth 0 = no forecast rows),
 * whether prompt lookup is on, and whether a depth-0 tree still drafts
 * from the forecast set's corpus (with forecast rows it always does). */
typedef struct spec_config {
    char name[64];
    int depth, branches[LP_SPEC_MAX_DEPTH];
    bool lookup, plain, cost_model, ngram;
} spec_config;

typedef struct config_result {
    double decode_s;                  /* decode time over all records (median rep) */
    int64_t tokens, generated;        /* decode tokens (after the first); all of them */
    int64_t passes, rows;             /* forwards, and their rows (a prompt's counted as one) */
    int identical;                    /* outputs equal to plain decoding's */
} config_result;

typedef struct record_set {
    int32_t **prompt; /* [n] tokenized prompts (cli_load_prompts) */
    int *len, n;
} record_set;

static void records_free(record_set *r) {
    for (int i = 0; i < r->n; i++) free(r->prompt[i]);
    free(r->prompt);
    free(r->len);
    *r = (record_set){0};
}

/* ---- the cost of a pass of R rows ------------------------------------------------------ */

/* Relative cost of a pass of `rows` rows (lp_speculate_measure_cost's
 * table), linear between whole rows and on past the table. */
static double cost_at(const float *cost, double rows) {
    if (rows <= 1) return 1;
    int lo = (int)rows;
    if (lo >= LP_SPEC_COST_ROWS)
        return cost[LP_SPEC_COST_ROWS - 1] +
               (rows - LP_SPEC_COST_ROWS) * (cost[LP_SPEC_COST_ROWS - 1] - cost[LP_SPEC_COST_ROWS - 2]);
    return cost[lo - 1] + (rows - lo) * (cost[lo] - cost[lo - 1]);
}

/* ---- decoding the records under one configuration ------------------------------------ */

typedef struct output {
    int32_t tok[MAX_OUT];
    int n;
} output;

static bool collect(void *user, int request, const char *text, size_t len) {
    (void)user, (void)request, (void)text, (void)len;
    return true;
}

/* Decodes every record alone; outputs into outs (one per record). */
static int run_config(lp_context *ctx, const lp_adapter *adapter, const lp_forecast *f, const spec_config *c,
                      const spec_options *o, const record_set *rs, const float *cost, output *outs,
                      config_result *res, lp_error *err) {
    lp_speculate sp = lp_speculate_default();
    if (c->cost_model) memcpy(sp.pass_cost, cost, sizeof sp.pass_cost);
    if (c->depth > 0 || c->ngram) {
        sp.forecast = f;
        sp.depth = c->depth;
        memcpy(sp.branches, c->branches, sizeof sp.branches);
    }
    if (c->lookup) {
        int g = 3, len = 8;
        if (o->lookup && sscanf(o->lookup, "%d:%d", &g, &len) < 1) g = 3;
        sp.lookup_ngram = g;
        sp.lookup_len = len;
    }
    *res = (config_result){0};
    /* one engine for all records, as a server would: the cost model's
     * acceptance counts carry from one request of a task to the next */
    lp_engine *e = lp_engine_create(ctx, NULL, err);
    if (!e) return -1;
    int rc = 0;
    for (int i = 0; i < rs->n && !rc; i++) {
        lp_request q = lp_request_default();
        q.prompt = rs->prompt[i];
        q.n_prompt = rs->len[i];
        q.adapter = adapter;
        q.sampling.temperature = 0;
        q.sampling.repeat_penalty = 1.0f;
        q.max_tokens = o->n_gen < MAX_OUT ? o->n_gen : MAX_OUT;
        q.speculate = c->plain ? NULL : &sp;
        q.fn = collect;
        q.no_reuse = q.drop_kv = true;
        int64_t steps0, rows0, steps1, rows1;
        lp_engine_counts(e, &steps0, &rows0);
        int id = lp_engine_submit(e, &q, err);
        if (id < 0) {
            rc = -1;
            break;
        }
        double t1 = 0;
        for (int left = 1; left > 0 && !rc;) {
            if ((left = lp_engine_step(e, err)) < 0) rc = -1;
            lp_request_stats st;
            lp_engine_request_stats(e, id, &st);
            if (t1 == 0 && st.n_generated > 0) t1 = lp_now_seconds();
        }
        double t2 = lp_now_seconds();
        lp_request_stats st;
        lp_engine_request_stats(e, id, &st);
        lp_engine_counts(e, &steps1, &rows1);
        int n_tok = 0;
        const int32_t *tok = lp_engine_request_tokens(e, id, &n_tok);
        outs[i].n = n_tok < MAX_OUT ? n_tok : MAX_OUT;
        if (outs[i].n > 0) memcpy(outs[i].tok, tok, (size_t)outs[i].n * sizeof *tok);
        lp_engine_release(e, id);
        if (st.n_generated > 1) {
            res->decode_s += t2 - t1;
            res->tokens += st.n_generated - 1;
        }
        /* every forward, the prefill's and an end-of-text one's included */
        res->generated += st.n_generated;
        res->passes += steps1 - steps0;
        res->rows += rows1 - rows0 - (rs->len[i] - 1);
    }
    lp_engine_free(e);
    return rc;
}

static bool same_output(const output *a, const output *b) {
    return a->n == b->n && memcmp(a->tok, b->tok, (size_t)a->n * sizeof *a->tok) == 0;
}

/* ---- options ---------------------------------------------------------------------------- */

static void usage(FILE *out) {
    fprintf(out,
            "usage: loraplex bench --speculate DIR|F.lpf|none -m BASE --data DIR/tasks [options]\n"
            "  --speculate DIR         forecast files DIR/<task>.lpf (a task without one is\n"
            "                          measured with prompt lookup only); F.lpf: one set for\n"
            "                          every task; none: prompt lookup only\n"
            "  --adapters a=A.lpa,...  the tasks (default: the base alone, task \"base\")\n"
            "  --data DIR              DIR/<task>.eval.jsonl holds the prompts\n"
            "  --records N             prompts per task (default 16)\n"
            "  -n N                    tokens per output at most (default 64)\n"
            "  --trees \"3,2;4;...\"     forecast trees tried (default \"1;2;3,2;2,2,1\")\n"
            "  --lookup N:L            prompt lookup's n-gram and length (default 3:8)\n"
            "  -t N                    threads (default 1)\n"
            "  -r N                    repetitions, median decode time (default 1)\n"
            "  --json                  JSON lines\n");
}

static int parse(int argc, char **argv, spec_options *o) {
    *o = (spec_options){.records = 16, .n_gen = 64, .threads = 1, .reps = 1, .trees = "1;2;3,2;2,2,1"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long k;
#define VALUE() do { if (!(v = cli_value(argc, argv, &i))) return -1; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VALUE(); o->model = v; }
        else if (!strcmp(a, "--speculate")) { VALUE(); o->speculate = v; }
        else if (!strcmp(a, "--adapters")) { VALUE(); o->adapters = v; }
        else if (!strcmp(a, "--data")) { VALUE(); o->data = v; }
        else if (!strcmp(a, "--trees")) { VALUE(); o->trees = v; }
        else if (!strcmp(a, "--lookup")) { VALUE(); o->lookup = v; }
        else if (!strcmp(a, "--json")) o->json = true;
        else if (!strcmp(a, "--records")) {
            VALUE(); if (!cli_int(a, v, 1, MAX_RECORDS, &k)) return -1;
            o->records = (int)k;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--gen-tokens")) {
            VALUE(); if (!cli_int(a, v, 2, MAX_OUT, &k)) return -1;
            o->n_gen = (int)k;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            VALUE(); if (!cli_int(a, v, 1, 256, &k)) return -1;
            o->threads = (int)k;
        } else if (!strcmp(a, "-r") || !strcmp(a, "--reps")) {
            VALUE(); if (!cli_int(a, v, 1, 64, &k)) return -1;
            o->reps = (int)k;
        } else {
            fprintf(stderr, "loraplex bench --speculate: unknown option '%s' (see --help)\n", a);
            return -1;
        }
#undef VALUE
    }
    if (!o->model || !o->speculate || !o->data) {
        fprintf(stderr, "loraplex bench --speculate: needs -m BASE, --speculate DIR|F.lpf|none and --data DIR\n");
        return -1;
    }
    int g, len;
    char tail;
    if (o->lookup && (sscanf(o->lookup, "%d:%d%c", &g, &len, &tail) != 2 || g < 1 || g > 16 || len < 1 ||
                      len > LP_SPEC_MAX_NODES)) {
        fprintf(stderr, "loraplex bench --speculate: --lookup wants N:L (N 1..16, L 1..%d)\n", LP_SPEC_MAX_NODES);
        return -1;
    }
    return 0;
}

/* "3,2;4" into configurations: plain, lookup, the corpus n-gram chain
 * without forecast rows (where the set has a corpus), then each tree alone
 * and with lookup (trees only where there is a forecast set). */
static int make_configs(const char *trees, bool forecast, bool corpus, spec_config *out) {
    int n = 0;
    out[n++] = (spec_config){.name = "plain", .plain = true};
    out[n++] = (spec_config){.name = "lookup", .lookup = true};
    out[n++] = (spec_config){.name = "lookup,costed", .lookup = true, .cost_model = true};
    if (!forecast) return n;
    if (corpus) {
        out[n++] = (spec_config){.name = "n-gram", .ngram = true};
        out[n++] = (spec_config){.name = "n-gram+lookup", .ngram = true, .lookup = true};
        out[n++] = (spec_config){.name = "n-gram+lookup,costed", .ngram = true, .lookup = true, .cost_model = true};
    }
    const char *p = trees;
    while (*p && n + 3 <= MAX_TREES) {
        spec_config c = {0};
        char *end;
        while (*p && *p != ';') {
            long b = strtol(p, &end, 10);
            if (end == p || b < 1 || b > LP_SPEC_MAX_NODES || c.depth == LP_SPEC_MAX_DEPTH) return -1;
            c.branches[c.depth++] = (int)b;
            p = end;
            if (*p == ',') p++;
            else if (*p && *p != ';') return -1;
        }
        if (*p == ';') p++;
        if (c.depth == 0) return -1;
        int at = snprintf(c.name, sizeof c.name, "[");
        for (int d = 0; d < c.depth; d++)
            at += snprintf(c.name + at, sizeof c.name - (size_t)at, "%s%d", d ? "," : "", c.branches[d]);
        snprintf(c.name + at, sizeof c.name - (size_t)at, "]");
        out[n++] = c;
        c.lookup = true;
        strncat(c.name, "+lookup", sizeof c.name - strlen(c.name) - 1);
        out[n++] = c;
        c.cost_model = true;
        strncat(c.name, ",costed", sizeof c.name - strlen(c.name) - 1);
        out[n++] = c;
    }
    return n;
}

/* ---- the command ------------------------------------------------------------------------ */

typedef struct task {
    char name[64];
    lp_adapter *adapter;
    lp_forecast *forecast;
} task;

/* Tasks from --adapters (name=path[:scale]), or the base alone. */
static int load_tasks(const lp_model *m, const spec_options *o, task *tasks, int *n, lp_error *err) {
    *n = 0;
    if (!o->adapters) {
        tasks[(*n)++] = (task){.name = "base"};
        return 0;
    }
    char *list = strdup(o->adapters), *save = NULL;
    if (!list) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    int rc = 0;
    for (char *it = strtok_r(list, ",", &save); it && !rc; it = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(it, '=');
        if (!eq || eq == it || (size_t)(eq - it) >= sizeof tasks[0].name || *n == MAX_TASKS) {
            rc = lp_error_set(err, LP_ERR_INVALID, "--adapters wants name=path,... (at most %d): '%s'", MAX_TASKS, it);
            break;
        }
        task *t = &tasks[*n];
        *t = (task){0};
        memcpy(t->name, it, (size_t)(eq - it));
        if (!(t->adapter = tool_load_adapter(m, eq + 1, err))) rc = -1;
        else (*n)++;
    }
    free(list);
    return rc;
}

/* The task's forecast set: DIR/<task>.lpf, the one file, or none. */
static int load_forecast(const lp_model *m, const spec_options *o, task *t, lp_error *err) {
    if (!strcmp(o->speculate, "none")) return 0;
    struct stat st;
    char path[4096];
    if (stat(o->speculate, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(path, sizeof path, "%s/%s.lpf", o->speculate, t->name);
        if (stat(path, &st) != 0) return 0;
    } else {
        snprintf(path, sizeof path, "%s", o->speculate);
    }
    if (!(t->forecast = lp_forecast_load(path, err))) return -1;
    return lp_forecast_check(t->forecast, m, err);
}

static void print_costs(const spec_options *o, const float *cost) {
    if (o->json) {
        printf("{\"pass_cost\": [");
        for (int i = 0; i < LP_SPEC_COST_ROWS; i++) printf("%s%.3f", i ? ", " : "", (double)cost[i]);
        printf("]}\n");
        return;
    }
    printf("cost of one forward of R tree rows, relative to 1 row:\n  R    ");
    for (int i = 0; i < COST_SHOWN; i++) printf("%6d", cost_rows[i]);
    printf("\n  cost ");
    for (int i = 0; i < COST_SHOWN; i++) printf("%6.2f", (double)cost[cost_rows[i] - 1]);
    printf("\n\n");
}

static void print_task(const spec_options *o, const task *t, const spec_config *cs, const config_result *rs, int n,
                       int n_records, const float *rel) {
    double plain = rs[0].decode_s > 0 ? rs[0].tokens / rs[0].decode_s : 0;
    int best = 0;
    for (int c = 1; c < n; c++)
        if (rs[c].decode_s > 0 && rs[c].tokens / rs[c].decode_s > rs[best].tokens / rs[best].decode_s) best = c;
    if (!o->json)
        printf("%s (%d prompts%s):\n  %-16s %9s %8s %10s %9s %10s %10s\n", t->name, n_records,
               t->forecast ? "" : ", no forecast set: lookup only", "tree", "tok/s", "speedup", "tok/pass", "rows/pass",
               "predicted", "identical");
    for (int c = 0; c < n; c++) {
        const config_result *r = &rs[c];
        double tps = r->decode_s > 0 ? r->tokens / r->decode_s : 0;
        double per_pass = r->passes ? (double)r->generated / (double)r->passes : 0;
        double rows = r->passes ? (double)r->rows / (double)r->passes : 0;
        double plain_per_pass = rs[0].passes ? (double)rs[0].generated / (double)rs[0].passes : 1;
        double predicted = per_pass / cost_at(rel, rows) / plain_per_pass;
        if (o->json) {
            printf("{\"task\": ");
            tool_json_string(stdout, t->name);
            printf(", \"tree\": ");
            tool_json_string(stdout, cs[c].name);
            printf(", \"tok_s\": %.2f, \"speedup\": %.3f, \"tokens_per_pass\": %.3f, \"rows_per_pass\": %.2f, "
                   "\"predicted_speedup\": %.3f, \"identical\": %d, \"records\": %d, \"chosen\": %s}\n",
                   tps, plain > 0 ? tps / plain : 0, per_pass, rows, predicted, r->identical, n_records,
                   c == best ? "true" : "false");
        } else {
            printf("  %-16s %9.1f %7.2fx %10.2f %9.1f %9.2fx %6d/%-3d%s\n", cs[c].name, tps, plain > 0 ? tps / plain : 0,
                   per_pass, rows, predicted, r->identical, n_records, c == best ? "  <- chosen" : "");
        }
    }
    if (!o->json) printf("\n");
}

static int bench_task(lp_context *ctx, const spec_options *o, const task *t, const float *rel, bool *all_same,
                      lp_error *err) {
    record_set rs = {0};
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.eval.jsonl", o->data, t->name);
    if ((rs.n = cli_load_prompts(lp_context_model(ctx), path, o->records, &rs.prompt, &rs.len, err)) < 0) return -1;
    spec_config cs[MAX_TREES];
    int n = make_configs(o->trees, t->forecast != NULL, t->forecast && lp_forecast_corpus_size(t->forecast), cs);
    if (n < 0) {
        records_free(&rs);
        return lp_error_set(err, LP_ERR_INVALID, "--trees wants lists like \"3,2;4\": '%s'", o->trees);
    }
    output *plain = calloc((size_t)rs.n, sizeof *plain), *outs = calloc((size_t)rs.n, sizeof *outs);
    config_result res[MAX_TREES];
    int rc = plain && outs ? 0 : lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    for (int c = 0; c < n && !rc; c++) {
        double times[64];
        for (int r = 0; r < o->reps && !rc; r++) {
            rc = run_config(ctx, t->adapter, t->forecast, &cs[c], o, &rs, rel, c == 0 ? plain : outs, &res[c], err);
            times[r] = res[c].decode_s;
        }
        if (rc) break;
        res[c].decode_s = tool_summarize(times, o->reps).median;
        for (int i = 0; i < rs.n; i++) res[c].identical += same_output(&plain[i], c == 0 ? &plain[i] : &outs[i]);
        *all_same &= res[c].identical == rs.n;
    }
    if (!rc) print_task(o, t, cs, res, n, rs.n, rel);
    free(plain);
    free(outs);
    records_free(&rs);
    return rc;
}

int cli_bench_speculate(int argc, char **argv) {
    spec_options o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc > 0 ? 0 : 2;
    lp_error err = {0};
    task tasks[MAX_TASKS];
    int n_tasks = 0;
    lp_context *ctx = NULL;
    lp_model *m = lp_model_load(o.model, NULL, &err);
    rc = 1;
    if (!m || load_tasks(m, &o, tasks, &n_tasks, &err)) goto out;
    for (int i = 0; i < n_tasks; i++)
        if (load_forecast(m, &o, &tasks[i], &err)) goto out;
    lp_context_params cp = lp_context_default_params();
    cp.n_threads = o.threads;
    cp.max_logit_rows = 128; /* trees and forecast rows ask for logits */
    cp.max_sequences = 2;
    if (!(ctx = lp_context_create(m, &cp, &err))) goto out;
    char kernels[256];
    if (cli_kernels_line(kernels, sizeof kernels, &err)) goto out;
    fprintf(o.json ? stderr : stdout, "kernels: %s; %d thread%s\n", kernels, o.threads, o.threads > 1 ? "s" : "");
    float rel[LP_SPEC_COST_ROWS];
    if (lp_speculate_measure_cost(ctx, 64, rel, LP_SPEC_COST_ROWS, &err)) goto out;
    print_costs(&o, rel);
    bool all_same = true;
    for (int i = 0; i < n_tasks; i++)
        if (bench_task(ctx, &o, &tasks[i], rel, &all_same, &err)) goto out;
    if (!all_same) {
        lp_error_set(&err, LP_ERR_INVALID, "a speculative output differs from plain decoding (a bug: report it)");
        goto out;
    }
    rc = 0;
out:
    if (rc) cli_fail("bench", &err);
    for (int i = 0; i < n_tasks; i++) {
        lp_adapter_free(tasks[i].adapter);
        lp_forecast_free(tasks[i].forecast);
    }
    lp_context_free(ctx);
    lp_model_free(m);
    return rc;
}
