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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "../base/base.h"
#include "cli.h"
#include "tools.h"

int cli_bench_speculate(int argc, char **argv);
int cli_kernels_line(char *buf, size_t cap, lp_error *err); /* cli_model.c */

#define MAX_TASKS 32
#define MAX_TREES 12
#define MAX_RECORDS 256
#define MAX_OUT 512
#define COST_ROWS 10

static const int cost_rows[COST_ROWS] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32};

typedef struct spec_options {
    const char *model, *speculate, *adapters, *data, *trees, *lookup;
    int records, n_gen, threads, reps;
    bool json;
} spec_options;

/* One way to decode: the tree (branches, depth 0 = no forecast rows) and
 * whether prompt lookup is on. */
typedef struct spec_config {
    char name[64];
    int depth, branches[LP_SPEC_MAX_DEPTH];
    bool lookup, plain;
} spec_config;

typedef struct config_result {
    double decode_s;                  /* decode time over all records (median rep) */
    int64_t tokens, passes, rows;     /* decode tokens (after the first), passes, rows */
    int identical;                    /* outputs equal to plain decoding's */
} config_result;

typedef struct record_set {
    int32_t *prompt[MAX_RECORDS];
    int len[MAX_RECORDS], n;
} record_set;

static void records_free(record_set *r) {
    for (int i = 0; i < r->n; i++) free(r->prompt[i]);
    r->n = 0;
}

/* The first `max` prompts of a task's eval file, tokenized. */
static int records_load(const lp_model *m, const char *path, int max, record_set *out, lp_error *err) {
    char *text = NULL;
    size_t size;
    out->n = 0;
    if (lp_read_file(path, &text, &size, 256u << 20, err)) return -1;
    int line_no = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line && out->n < max; line = strtok_r(NULL, "\n", &save)) {
        line_no++;
        cJSON *j = cJSON_Parse(line);
        const cJSON *pr = j ? cJSON_GetObjectItemCaseSensitive(j, "prompt") : NULL;
        int k = -1;
        if (cJSON_IsString(pr)) {
            const char *s = pr->valuestring;
            k = lp_tokenize(m, s, strlen(s), lp_model_add_bos(m), false, NULL, 0, err);
            int32_t *t = k > 0 ? malloc((size_t)k * sizeof *t) : NULL;
            if (t && lp_tokenize(m, s, strlen(s), lp_model_add_bos(m), false, t, k, err) == k) {
                out->prompt[out->n] = t;
                out->len[out->n++] = k;
            } else {
                free(t);
                k = -1;
            }
        }
        cJSON_Delete(j);
        if (k < 1) {
            lp_error_set(err, LP_ERR_FORMAT, "%s:%d: not a JSON object with a non-empty \"prompt\" string", path,
                         line_no);
            free(text);
            records_free(out);
            return -1;
        }
    }
    free(text);
    if (out->n == 0) return lp_error_set(err, LP_ERR_FORMAT, "%s: no records", path);
    return 0;
}

/* ---- the cost of a pass of R rows ------------------------------------------------------ */

/* Median seconds of one forward of `n` rows forming one chain after a
 * committed prompt of `ctx_len` tokens (none of them committed). */
static double pass_seconds(lp_context *ctx, int n, int ctx_len, int reps, lp_error *err) {
    lp_row rows[32];
    for (int j = 0; j < n; j++)
        rows[j] = (lp_row){.token = 10 + j, .pos = ctx_len + j, .parent = j - 1, .logits = true};
    double t[64];
    if (reps > 64) reps = 64;
    for (int r = 0; r < reps; r++) {
        double t0 = lp_now_seconds();
        if (lp_forward(ctx, rows, n, err)) return -1;
        t[r] = lp_now_seconds() - t0;
    }
    return tool_summarize(t, reps).median;
}

static int measure_costs(lp_context *ctx, int ctx_len, double *rel, lp_error *err) {
    lp_row *prompt = malloc((size_t)ctx_len * sizeof *prompt);
    if (!prompt) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < ctx_len; i++)
        prompt[i] = (lp_row){.token = 10 + i % 50, .pos = i, .parent = i - 1, .commit = true};
    prompt[ctx_len - 1].logits = true;
    int rc = lp_forward(ctx, prompt, ctx_len, err);
    free(prompt);
    if (rc) return -1;
    pass_seconds(ctx, 1, ctx_len, 8, err); /* warm */
    double one = pass_seconds(ctx, 1, ctx_len, 40, err);
    for (int i = 0; i < COST_ROWS; i++) {
        double s = pass_seconds(ctx, cost_rows[i], ctx_len, 40, err);
        if (s < 0 || one <= 0) return -1;
        rel[i] = s / one;
    }
    lp_seq_truncate(ctx, 0, 0, NULL);
    return 0;
}

/* Relative cost of a pass of `rows` rows, linear between the measured ones. */
static double cost_at(const double *rel, double rows) {
    if (rows <= 1) return 1;
    for (int i = 1; i < COST_ROWS; i++)
        if (rows <= cost_rows[i]) {
            double f = (rows - cost_rows[i - 1]) / (cost_rows[i] - cost_rows[i - 1]);
            return rel[i - 1] + f * (rel[i] - rel[i - 1]);
        }
    return rel[COST_ROWS - 1] * rows / cost_rows[COST_ROWS - 1];
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
                      const spec_options *o, const record_set *rs, output *outs, config_result *res,
                      lp_error *err) {
    lp_speculate sp = lp_speculate_default();
    if (c->depth > 0) {
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
    for (int i = 0; i < rs->n; i++) {
        lp_engine *e = lp_engine_create(ctx, NULL, err);
        if (!e) return -1;
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
        int id = lp_engine_submit(e, &q, err);
        if (id < 0) {
            lp_engine_free(e);
            return -1;
        }
        double t1 = 0;
        for (int left = 1; left > 0;) {
            if ((left = lp_engine_step(e, err)) < 0) {
                lp_engine_free(e);
                return -1;
            }
            lp_request_stats st;
            lp_engine_request_stats(e, id, &st);
            if (t1 == 0 && st.n_generated > 0) t1 = lp_now_seconds();
        }
        double t2 = lp_now_seconds();
        lp_request_stats st;
        lp_spec_stats ss;
        lp_engine_request_stats(e, id, &st);
        lp_engine_request_spec_stats(e, id, &ss);
        int n_tok = 0;
        const int32_t *tok = lp_engine_request_tokens(e, id, &n_tok);
        outs[i].n = n_tok < MAX_OUT ? n_tok : MAX_OUT;
        if (outs[i].n > 0) memcpy(outs[i].tok, tok, (size_t)outs[i].n * sizeof *tok);
        lp_engine_free(e);
        if (st.n_generated > 1) {
            res->decode_s += t2 - t1;
            res->tokens += st.n_generated - 1;
        }
        res->passes += c->plain ? st.n_generated : ss.n_passes;
        res->rows += c->plain ? st.n_generated : ss.n_passes + ss.n_tree_rows + ss.n_forecast_rows;
    }
    return 0;
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

/* "3,2;4" into configurations: plain, lookup, then each tree alone and with
 * lookup (trees only where there is a forecast set). */
static int make_configs(const char *trees, bool forecast, spec_config *out) {
    int n = 0;
    out[n++] = (spec_config){.name = "plain", .plain = true};
    out[n++] = (spec_config){.name = "lookup", .lookup = true};
    if (!forecast) return n;
    const char *p = trees;
    while (*p && n + 2 <= MAX_TREES) {
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

static void print_costs(const spec_options *o, const double *rel) {
    if (o->json) {
        printf("{\"pass_cost\": {");
        for (int i = 0; i < COST_ROWS; i++) printf("%s\"%d\": %.3f", i ? ", " : "", cost_rows[i], rel[i]);
        printf("}}\n");
        return;
    }
    printf("cost of one forward of R tree rows, relative to 1 row:\n  R    ");
    for (int i = 0; i < COST_ROWS; i++) printf("%6d", cost_rows[i]);
    printf("\n  cost ");
    for (int i = 0; i < COST_ROWS; i++) printf("%6.2f", rel[i]);
    printf("\n\n");
}

static void print_task(const spec_options *o, const task *t, const spec_config *cs, const config_result *rs, int n,
                       int n_records, const double *rel) {
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
        double per_pass = r->passes ? (double)(r->tokens + n_records) / (double)r->passes : 0;
        double rows = r->passes ? (double)r->rows / (double)r->passes : 0;
        double predicted = per_pass / cost_at(rel, rows);
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

static int bench_task(lp_context *ctx, const spec_options *o, const task *t, const double *rel, bool *all_same,
                      lp_error *err) {
    record_set rs = {0};
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.eval.jsonl", o->data, t->name);
    if (records_load(lp_context_model(ctx), path, o->records, &rs, err)) return -1;
    spec_config cs[MAX_TREES];
    int n = make_configs(o->trees, t->forecast != NULL, cs);
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
            rc = run_config(ctx, t->adapter, t->forecast, &cs[c], o, &rs, c == 0 ? plain : outs, &res[c], err);
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
    double rel[COST_ROWS];
    if (measure_costs(ctx, 64, rel, &err)) goto out;
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
