/* loraplex world: writes the demo world's corpus (src/world).
 * loraplex eval-tasks: scores a model and its task adapters on the world's
 * eval files (exact match and chrF, per task and language), for a
 * full-precision model and optionally a quantized one side by side; with
 * --speculate, also decodes every record speculatively and checks that the
 * output is the plain one. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/base.h"
#include "../world/world.h"
#include "../world/world2.h"
#include "cli.h"

/* ---- loraplex world ------------------------------------------------------- */

static void world_usage(FILE *out) {
    fprintf(out,
            "usage: loraplex world --out DIR [options]\n"
            "Writes DIR/pretrain.txt, DIR/tasks/<task>.{train,eval}.jsonl, DIR/vocab.gguf\n"
            "and DIR/README.md, deterministically from the seed.\n"
            "options:\n"
            "  --version V     1: three languages in Latin letters (the default, the\n"
            "                  committed demo's world); 2: nine languages in six scripts,\n"
            "                  ten tasks (src/world/world2.h). The defaults below are\n"
            "                  version 1's; version 2's: --stories 200000 --vocab 4096\n"
            "  --seed S        random seed (default 1)\n"
            "  --stories N     pretraining documents (default 40000)\n"
            "  --per-task N    train records per task (default 3000)\n"
            "  --correct-factor F  the correct task (version 2: also translate and\n"
            "                  compose) gets F x as many (default 10)\n"
            "  --eval N        eval records per task (default 300)\n"
            "  --eval-percent P share of meanings reserved for eval (default 10)\n"
            "  --vocab N       BPE vocabulary size incl. 3 specials (default 768)\n");
}

int cli_world(int argc, char **argv) {
    lp_world_params p = lp_world_default_params();
    const char *out = NULL;
    char command[1024];
    size_t o = (size_t)snprintf(command, sizeof command, "loraplex world");
    for (int i = 1; i < argc && o < sizeof command; i++)
        o += (size_t)snprintf(command + o, sizeof command - o, " %s", argv[i]);
    p.command = command;
    /* --version first: it picks the defaults the other options override */
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--version")) {
            long n;
            if (!cli_int("--version", argv[i + 1], 1, 2, &n)) return 2;
            if (n == 2) p = lp_world2_default_params();
            p.command = command;
        }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long n;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            world_usage(stdout);
            return 0;
        }
        if (!(v = cli_value(argc, argv, &i))) return 2;
        if (!strcmp(a, "--out") || !strcmp(a, "-o")) {
            out = v;
        } else if (!strcmp(a, "--version")) {
            /* read above */
        } else if (!strcmp(a, "--seed")) {
            if (!cli_int(a, v, 0, (1L << 62), &n)) return 2;
            p.seed = (uint64_t)n;
        } else if (!strcmp(a, "--stories")) {
            if (!cli_int(a, v, 0, 10000000, &n)) return 2;
            p.stories = (int)n;
        } else if (!strcmp(a, "--per-task")) {
            if (!cli_int(a, v, 1, 1000000, &n)) return 2;
            p.per_task = (int)n;
        } else if (!strcmp(a, "--correct-factor")) {
            if (!cli_int(a, v, 1, 100, &n)) return 2;
            p.correct_factor = (int)n;
        } else if (!strcmp(a, "--eval")) {
            if (!cli_int(a, v, 1, 100000, &n)) return 2;
            p.eval_per_task = (int)n;
        } else if (!strcmp(a, "--eval-percent")) {
            if (!cli_int(a, v, 1, 50, &n)) return 2;
            p.eval_percent = (int)n;
        } else if (!strcmp(a, "--vocab")) {
            if (!cli_int(a, v, 259, 4096, &n)) return 2;
            p.vocab_size = (int)n;
        } else {
            fprintf(stderr, "loraplex world: unknown option '%s'\n", a);
            world_usage(stderr);
            return 2;
        }
    }
    if (!out) {
        world_usage(stderr);
        return 2;
    }
    lp_error err;
    lp_world_stats st;
    if (lp_world_generate(out, &p, &st, &err) != 0) return cli_fail("world", &err);
    fprintf(stderr,
            "world: %s (version %d, seed %llu)\n"
            "  pretrain.txt  %zu lines, %.2f MB\n"
            "  tasks/        %d tasks, %zu train + %zu eval records\n"
            "  vocab.gguf    %d tokens\n"
            "  time          %.2f s text, %.2f s BPE\n",
            out, p.version, (unsigned long long)p.seed, st.pretrain_lines, st.pretrain_bytes / 1e6,
            p.version == 2 ? LP_W2_N_TASKS : LP_WORLD_N_ALL_TASKS, st.task_train_records, st.task_eval_records, st.vocab_size,
            st.seconds_text, st.seconds_bpe);
    if (p.version == 2)
        fprintf(stderr, "  tokens        pretrain %zu, task train %zu, task eval %zu\n",
                st.pretrain_tokens, st.task_train_tokens, st.task_eval_tokens);
    return 0;
}

/* ---- loraplex eval-tasks ------------------------------------------------------ */

typedef struct eval_record {
    char lang[16];
    char *prompt, *completion;
} eval_record;

/* Scores of one (task, language, adapter) group for one model. */
typedef struct eval_score {
    int n, exact;
    double chrf;
    /* --speculate: records whose speculative output was the plain one; tokens
     * and passes of the speculative decode; wall time of each decode (batched,
     * prefill included) and the tokens plain decoding generated in it */
    int identical;
    long long spec_tokens, spec_passes, plain_tokens;
    double plain_s, spec_s;
} eval_score;

typedef struct eval_group {
    char task[32], lang[16], adapter[64];
    char tree[64];       /* what the task speculated with ("" without --speculate) */
    eval_score score[2]; /* full precision, quantized */
} eval_group;

typedef struct eval_opts {
    const char *model_path[2];
    const char *data_dir;
    char *adapter_spec;      /* name=PATH,name=PATH */
    int n_adapters;
    char *adapter_name[32], *adapter_path[32];
    int max_records, threads, batch, max_new;
    bool base, json;
    const char *only_tasks;  /* comma-separated, NULL = all */
    const char *profile;     /* QUAD shared profile bound to each model's context, or NULL */
    const char *speculate;   /* forecast directory (DIR/<task>.lpf), or NULL */
    int lookup_ngram, lookup_len; /* --lookup N:L (0: only for tasks without a forecast file) */
    int ngram_len;           /* --ngram L: lp_speculate.ngram_len (0: the default 8, < 0: off) */
    bool costed;
} eval_opts;

static void eval_usage(FILE *out) {
    fprintf(out,
            "usage: loraplex eval-tasks -m MODEL [--quantized MODEL_Q]\n"
            "                           [--adapters NAME=PATH,...] --data DIR/tasks [options]\n"
            "Greedy-decodes every record of DIR/tasks/<task>.eval.jsonl with the adapter\n"
            "named after the task (else after its family, e.g. 'style' for style-formal;\n"
            "else the base alone) and reports exact match and chrF per task and language,\n"
            "for MODEL and MODEL_Q side by side with their ratio.\n"
            "options:\n"
            "  --base          also score every task with the base alone\n"
            "  --tasks A,B     only these tasks\n"
            "  --max N         at most N records per task (default all)\n"
            "  --batch N       sequences decoded together (default 16)\n"
            "  --max-new N     generated tokens per record at most (default 96)\n"
            "  -t N            threads (default: all cores)\n"
            "  --json          JSON on stdout instead of a table\n"
            "  --profile P.lpq bind this shared quantization profile (adapters made by\n"
            "                  `loraplex quad fit` / `quad ptq` need theirs; docs/quad.md)\n"
            "  --speculate DIR also decode every record speculatively with DIR/<task>.lpf\n"
            "                  (tree 3,2; a task without a file: prompt lookup alone) and\n"
            "                  report how many outputs were identical to plain decoding\n"
            "                  (the command fails if any differs), tokens per pass and\n"
            "                  tok/s plain vs speculative (wall time of the batched decode,\n"
            "                  prefill included: meaningful on a quiet machine only)\n"
            "  --lookup N[:L]  with --speculate: prompt lookup for every task too (default\n"
            "                  3:8, used only where a task has no forecast file)\n"
            "  --ngram L       with --speculate: tokens drafted from a forecast file's corpus\n"
            "                  (default 8 where the file has one; 0: none)\n"
            "  --costed        with --speculate: measure this machine's cost of a pass of R\n"
            "                  rows first and place only the candidates that pay (docs/speculate.md)\n");
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
        s[--n] = '\0';
    return s;
}

static void free_records(eval_record *rs, int n) {
    for (int i = 0; i < n; i++) {
        free(rs[i].prompt);
        free(rs[i].completion);
    }
    free(rs);
}

/* Reads up to max records (0 = all) of a task's eval JSONL. Returns the
 * count, 0 if the file does not exist, -1 on error. */
static int read_eval(const char *path, int max, eval_record **out, lp_error *err) {
    FILE *probe = fopen(path, "r");
    if (!probe) return 0;
    fclose(probe);
    char *data = NULL;
    size_t size = 0;
    if (lp_read_file(path, &data, &size, (size_t)1 << 30, err) != 0) return -1;
    int n = 0, cap = 0, line_no = 0;
    eval_record *rs = NULL;
    char *save = NULL;
    for (char *line = strtok_r(data, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        line_no++;
        if (max > 0 && n >= max) break;
        cJSON *j = cJSON_Parse(line);
        const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(j, "prompt");
        const cJSON *completion = cJSON_GetObjectItemCaseSensitive(j, "completion");
        const cJSON *lang = cJSON_GetObjectItemCaseSensitive(j, "lang");
        if (!cJSON_IsString(prompt) || !cJSON_IsString(completion)) {
            cJSON_Delete(j);
            free(data);
            free_records(rs, n);
            return lp_fail(err, "%s:%d: not a {\"prompt\", \"completion\"} record", path, line_no);
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            eval_record *grown = realloc(rs, (size_t)cap * sizeof *rs);
            if (!grown) {
                cJSON_Delete(j);
                free(data);
                free_records(rs, n);
                return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", path);
            }
            rs = grown;
        }
        eval_record *r = &rs[n++];
        snprintf(r->lang, sizeof r->lang, "%s", cJSON_IsString(lang) ? lang->valuestring : "-");
        r->prompt = strdup(prompt->valuestring);
        r->completion = strdup(completion->valuestring);
        cJSON_Delete(j);
        if (!r->prompt || !r->completion) {
            free(data);
            free_records(rs, n);
            return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", path);
        }
    }
    free(data);
    *out = rs;
    return n;
}

/* Adapter slot for a task: exact name, else the family before '-', else 0. */
static int adapter_for(const eval_opts *o, const char *task) {
    for (int i = 0; i < o->n_adapters; i++)
        if (!strcmp(o->adapter_name[i], task)) return i + 1;
    const char *dash = strchr(task, '-');
    size_t fam = dash ? (size_t)(dash - task) : strlen(task);
    for (int i = 0; i < o->n_adapters; i++)
        if (strlen(o->adapter_name[i]) == fam && !strncmp(o->adapter_name[i], task, fam))
            return i + 1;
    return 0;
}

/* ---- batched greedy decoding ------------------------------------------------------ */

/* One record's output as the engine streams it. */
typedef struct record_out {
    char text[1024];
    size_t len;
    int generated, passes; /* tokens; passes that produced them (= tokens when plain) */
} record_out;

static bool collect_record(void *user, int request, const char *text, size_t len) {
    (void)request;
    record_out *o = user;
    if (o->len + len >= sizeof o->text) len = sizeof o->text - 1 - o->len;
    memcpy(o->text + o->len, text, len);
    o->len += len;
    o->text[o->len] = '\0';
    return true;
}

/* Decodes records [0, n) greedily with `adapter` (NULL: the base), all
 * submitted to one engine that batches them; each output ends at the first
 * newline and is left in out[i].text. A prompt too long for a sequence is
 * scored as a miss (empty output). */
static int decode_records(lp_context *ctx, const lp_model *model, const eval_record *rs, int n,
                          const lp_adapter *adapter, const lp_speculate *sp, int max_new, int max_seq_len,
                          int32_t *tokens, record_out *out, lp_error *err) {
    static const char *const newline[1] = {"\n"};
    lp_engine *e = lp_engine_create(ctx, NULL, err);
    if (!e) return -1;
    int rc = 0;
    int ids[256];
    for (int i = 0; i < n && rc == 0; i++) {
        out[i].len = 0;
        out[i].text[0] = '\0';
        out[i].generated = out[i].passes = 0;
        ids[i] = -1;
        int k = lp_tokenize(model, rs[i].prompt, strlen(rs[i].prompt), lp_model_add_bos(model), false, tokens,
                            max_seq_len, err);
        if (k < 0) rc = -1;
        if (k < 0 || k > max_seq_len || k + max_new > max_seq_len) continue;
        lp_request q = lp_request_default();
        q.prompt = tokens;
        q.n_prompt = k;
        q.adapter = adapter;
        q.sampling.temperature = 0;
        q.sampling.repeat_penalty = 1.0f;
        q.max_tokens = max_new;
        q.stop = newline;
        q.n_stop = 1;
        q.fn = collect_record;
        q.user = &out[i];
        q.speculate = sp;
        if ((ids[i] = lp_engine_submit(e, &q, err)) < 0) rc = -1;
    }
    if (rc == 0 && lp_engine_run(e, err) != 0) rc = -1;
    for (int i = 0; i < n && rc == 0; i++) {
        if (ids[i] < 0) continue;
        lp_request_stats st;
        lp_spec_stats ss;
        lp_engine_request_stats(e, ids[i], &st);
        lp_engine_request_spec_stats(e, ids[i], &ss);
        out[i].generated = st.n_generated;
        out[i].passes = sp ? ss.n_passes : st.n_generated;
    }
    lp_engine_free(e);
    return rc;
}

/* ---- groups and reporting ---------------------------------------------------------- */

typedef struct group_list {
    eval_group *g;
    int n, cap;
} group_list;

static eval_group *group_get(group_list *gl, const char *task, const char *lang,
                             const char *adapter) {
    for (int i = 0; i < gl->n; i++)
        if (!strcmp(gl->g[i].task, task) && !strcmp(gl->g[i].lang, lang) &&
            !strcmp(gl->g[i].adapter, adapter))
            return &gl->g[i];
    if (gl->n == gl->cap) {
        int cap = gl->cap ? gl->cap * 2 : 64;
        eval_group *g = realloc(gl->g, (size_t)cap * sizeof *g);
        if (!g) return NULL;
        gl->g = g;
        gl->cap = cap;
    }
    eval_group *g = &gl->g[gl->n++];
    memset(g, 0, sizeof *g);
    snprintf(g->task, sizeof g->task, "%s", task);
    snprintf(g->lang, sizeof g->lang, "%s", lang);
    snprintf(g->adapter, sizeof g->adapter, "%s", adapter);
    return g;
}

/* --speculate: the task's forecast file DIR/<task>.lpf if there is one
 * (tree {3, 2}, plus prompt lookup if --lookup), else prompt lookup alone.
 * *f is the loaded set (NULL: none), tree names the shape for the report. */
static int task_speculate(const eval_opts *o, const lp_model *model, const char *task, const float *cost,
                          lp_speculate *sp, lp_forecast **f, char *tree, size_t cap, lp_error *err) {
    *sp = lp_speculate_default();
    *f = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.lpf", o->speculate, task);
    FILE *probe = fopen(path, "rb");
    if (probe) {
        fclose(probe);
        if (!(*f = lp_forecast_load(path, err)) || lp_forecast_check(*f, model, err) != 0) return -1;
        int k = lp_forecast_k(*f);
        sp->forecast = *f;
        sp->branches[0] = 3;
        sp->branches[1] = 2;
        sp->depth = k < 2 ? k : 2;
        sp->ngram_len = o->ngram_len;
    }
    if (!*f || o->lookup_ngram > 0) {
        sp->lookup_ngram = o->lookup_ngram > 0 ? o->lookup_ngram : 3;
        sp->lookup_len = o->lookup_len > 0 ? o->lookup_len : 8;
    }
    if (o->costed) memcpy(sp->pass_cost, cost, sizeof sp->pass_cost);
    size_t n = 0;
    tree[0] = '\0';
    if (*f) n += (size_t)snprintf(tree, cap, "forecast [3,2]");
    if (*f && lp_forecast_corpus_size(*f) && o->ngram_len >= 0 && n < cap)
        n += (size_t)snprintf(tree + n, cap - n, " + n-gram %d", o->ngram_len ? o->ngram_len : 8);
    if (sp->lookup_ngram > 0 && n < cap)
        snprintf(tree + n, cap - n, "%slookup %d:%d", n ? " + " : "", sp->lookup_ngram, sp->lookup_len);
    return 0;
}

/* Scores every task (with its adapter, and with the base if asked) on one
 * model, adding to the groups' score[which]. */
static int eval_model(const eval_opts *o, int which, group_list *gl, bool *all_same, lp_error *err) {
    const char *path = o->model_path[which];
    lp_model *model = lp_model_load(path, NULL, err);
    if (!model) return -1;
    lp_adapter *adapters[32] = {0};
    lp_profile *profile = NULL;
    lp_context *ctx = NULL;
    lp_forecast *forecast = NULL;
    record_out *outs = NULL, *spec_outs = NULL;
    int32_t *tokens = NULL;
    int rc = -1;
    int max_seq_len = 512, max_rows = 512;
    /* a speculating request asks for (1 + nodes) x (1 + depth) logit rows */
    if (o->speculate) max_rows += 64 * o->batch;
    lp_context_params cp = lp_context_default_params();
    cp.n_threads = o->threads;
    cp.max_rows = max_rows;
    cp.max_sequences = o->batch;
    cp.max_logit_rows = o->speculate ? 64 * o->batch : o->batch > 64 ? o->batch : 64;
    cp.max_seq_len = max_seq_len;
    cp.n_ctx = o->batch * max_seq_len;
    cp.max_adapters = o->n_adapters > 0 ? o->n_adapters : 1;
    ctx = lp_context_create(model, &cp, err);
    if (!ctx) goto done;
    if (o->profile && (!(profile = lp_profile_load(model, o->profile, err)) ||
                       lp_context_bind_profile(ctx, profile, err) != 0))
        goto done;
    for (int i = 0; i < o->n_adapters; i++) {
        adapters[i] = lp_adapter_load(model, o->adapter_path[i], 1.0f, err);
        if (!adapters[i]) {
            lp_fail_prefix(err, "adapter '%s'", o->adapter_name[i]);
            goto done;
        }
        if (lp_context_bind_adapter(ctx, i + 1, adapters[i], err) != 0) goto done;
    }
    float cost[LP_SPEC_COST_ROWS] = {0};
    if (o->speculate && o->costed && lp_speculate_measure_cost(ctx, 64, cost, LP_SPEC_COST_ROWS, err) != 0) goto done;
    outs = calloc((size_t)o->batch, sizeof *outs);
    spec_outs = calloc((size_t)o->batch, sizeof *spec_outs);
    tokens = calloc((size_t)max_seq_len, sizeof *tokens);
    if (!outs || !spec_outs || !tokens) {
        lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* version 2's tasks: version 1's and style-curious, compose */
    for (int t = 0; t < LP_W2_N_TASKS; t++) {
        const char *task = lp_world2_task_name(t);
        if (o->only_tasks) {
            const char *hit = strstr(o->only_tasks, task);
            size_t tl = strlen(task);
            if (!hit || (hit != o->only_tasks && hit[-1] != ',') || (hit[tl] && hit[tl] != ','))
                continue;
        }
        char file[1024];
        snprintf(file, sizeof file, "%s/%s.eval.jsonl", o->data_dir, task);
        eval_record *rs = NULL;
        int n = read_eval(file, o->max_records, &rs, err);
        if (n < 0) goto done;
        if (n == 0) continue;
        lp_speculate sp;
        char tree[64] = "";
        if (o->speculate && task_speculate(o, model, task, cost, &sp, &forecast, tree, sizeof tree, err) != 0) {
            free_records(rs, n);
            goto done;
        }
        int slots[2] = {adapter_for(o, task), 0};
        int n_runs = o->base && slots[0] != 0 ? 2 : 1;
        double t0 = lp_now_seconds();
        for (int run = 0; run < n_runs; run++) {
            int slot = slots[run];
            const char *aname = slot ? o->adapter_name[slot - 1] : "base";
            for (int start = 0; start < n; start += o->batch) {
                int count = n - start < o->batch ? n - start : o->batch;
                const lp_adapter *ad = slot ? adapters[slot - 1] : NULL;
                double t1 = lp_now_seconds();
                if (decode_records(ctx, model, rs + start, count, ad, NULL, o->max_new, max_seq_len, tokens, outs,
                                   err) != 0) {
                    free_records(rs, n);
                    goto done;
                }
                double t2 = lp_now_seconds();
                if (o->speculate && decode_records(ctx, model, rs + start, count, ad, &sp, o->max_new, max_seq_len,
                                                   tokens, spec_outs, err) != 0) {
                    free_records(rs, n);
                    goto done;
                }
                double t3 = lp_now_seconds();
                for (int i = 0; i < count; i++) {
                    bool same = o->speculate && outs[i].len == spec_outs[i].len &&
                                !memcmp(outs[i].text, spec_outs[i].text, outs[i].len) &&
                                outs[i].generated == spec_outs[i].generated;
                    if (o->speculate && !same) {
                        *all_same = false;
                        fprintf(stderr,
                                "eval-tasks: %s record %d (%s, %s): speculative output differs from plain decoding\n"
                                "  plain:       %s\n  speculative: %s\n",
                                task, start + i + 1, aname, tree, outs[i].text, spec_outs[i].text);
                    }
                    const eval_record *r = &rs[start + i];
                    char ref[1024];
                    snprintf(ref, sizeof ref, "%s", r->completion);
                    char *hyp = trim(outs[i].text), *want = trim(ref);
                    eval_group *gs[2] = {group_get(gl, task, r->lang, aname),
                                         group_get(gl, task, "all", aname)};
                    for (int k = 0; k < 2; k++) {
                        if (!gs[k]) {
                            free_records(rs, n);
                            lp_error_set(err, LP_ERR_NOMEM, "out of memory");
                            goto done;
                        }
                        eval_score *sc = &gs[k]->score[which];
                        sc->n++;
                        sc->exact += strcmp(hyp, want) == 0;
                        sc->chrf += lp_chrf(hyp, want);
                        if (!o->speculate) continue;
                        snprintf(gs[k]->tree, sizeof gs[k]->tree, "%s", tree);
                        sc->identical += same;
                        sc->spec_tokens += spec_outs[i].generated;
                        sc->spec_passes += spec_outs[i].passes;
                        sc->plain_tokens += outs[i].generated;
                        /* a batch's time goes to its records by their share of its tokens */
                        int tot_p = 0, tot_s = 0;
                        for (int j = 0; j < count; j++) {
                            tot_p += outs[j].generated;
                            tot_s += spec_outs[j].generated;
                        }
                        if (tot_p) sc->plain_s += (t2 - t1) * outs[i].generated / tot_p;
                        if (tot_s) sc->spec_s += (t3 - t2) * spec_outs[i].generated / tot_s;
                    }
                }
            }
        }
        lp_forecast_free(forecast);
        forecast = NULL;
        if (!o->json)
            fprintf(stderr, "eval-tasks: %s: %s, %d records in %.1f s\n", path, task, n,
                    lp_now_seconds() - t0);
        free_records(rs, n);
    }
    rc = 0;
done:
    free(outs);
    free(spec_outs);
    free(tokens);
    lp_forecast_free(forecast);
    lp_context_free(ctx);
    for (int i = 0; i < o->n_adapters; i++) lp_adapter_free(adapters[i]);
    lp_profile_free(profile);
    lp_model_free(model);
    return rc;
}

/* Table order: tasks in their standard order, the task's adapter before
 * the base, languages alphabetically with "all" last. */
static int group_cmp(const void *pa, const void *pb) {
    const eval_group *a = pa, *b = pb;
    int ta = lp_world2_task_from_name(a->task), tb = lp_world2_task_from_name(b->task);
    if (ta != tb) return ta < tb ? -1 : 1;
    int ba = !strcmp(a->adapter, "base"), bb = !strcmp(b->adapter, "base");
    if (ba != bb) return ba - bb;
    int la = !strcmp(a->lang, "all"), lb = !strcmp(b->lang, "all");
    if (la != lb) return la - lb;
    return strcmp(a->lang, b->lang);
}

static double pct(int a, int n) { return n ? 100.0 * a / n : 0.0; }
static double mean(double s, int n) { return n ? s / n : 0.0; }
static double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

static void print_table(const eval_opts *o, const group_list *gl) {
    bool q = o->model_path[1] != NULL;
    printf("%-14s %-6s %-14s %5s %8s %8s", "task", "lang", "adapter", "n", "EM%", "chrF");
    if (q) printf(" %8s %8s %8s %8s", "q EM%", "q chrF", "rel EM%", "rel chrF");
    if (o->speculate) printf(" %9s %8s %9s %9s  %s", "identical", "tok/pass", "plain t/s", "spec t/s", "speculated with");
    printf("\n");
    for (int i = 0; i < gl->n; i++) {
        const eval_group *g = &gl->g[i];
        const eval_score *f = &g->score[0], *qq = &g->score[1];
        double em = pct(f->exact, f->n), cf = mean(f->chrf, f->n);
        printf("%-14s %-6s %-14s %5d %8.1f %8.1f", g->task, g->lang, g->adapter, f->n, em, cf);
        if (q) {
            double qem = pct(qq->exact, qq->n), qcf = mean(qq->chrf, qq->n);
            printf(" %8.1f %8.1f", qem, qcf);
            if (em > 0) printf(" %8.1f", 100.0 * qem / em);
            else printf(" %8s", "-");
            if (cf > 0) printf(" %8.1f", 100.0 * qcf / cf);
            else printf(" %8s", "-");
        }
        if (o->speculate) {
            char same[24];
            snprintf(same, sizeof same, "%d/%d", f->identical, f->n);
            printf(" %9s %8.2f %9.1f %9.1f  %s", same, ratio((double)f->spec_tokens, (double)f->spec_passes),
                   ratio((double)f->plain_tokens, f->plain_s), ratio((double)f->spec_tokens, f->spec_s), g->tree);
        }
        printf("\n");
    }
}

static void print_json(const eval_opts *o, const group_list *gl) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", o->model_path[0]);
    if (o->model_path[1]) cJSON_AddStringToObject(root, "quantized", o->model_path[1]);
    cJSON *arr = cJSON_AddArrayToObject(root, "results");
    for (int i = 0; i < gl->n; i++) {
        const eval_group *g = &gl->g[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "task", g->task);
        cJSON_AddStringToObject(e, "lang", g->lang);
        cJSON_AddStringToObject(e, "adapter", g->adapter);
        cJSON_AddNumberToObject(e, "n", g->score[0].n);
        const char *names[2] = {"full", "quantized"};
        for (int k = 0; k < (o->model_path[1] ? 2 : 1); k++) {
            cJSON *s = cJSON_AddObjectToObject(e, names[k]);
            cJSON_AddNumberToObject(s, "exact_match", pct(g->score[k].exact, g->score[k].n));
            cJSON_AddNumberToObject(s, "chrf", mean(g->score[k].chrf, g->score[k].n));
            if (!o->speculate) continue;
            const eval_score *sc = &g->score[k];
            cJSON *sp = cJSON_AddObjectToObject(s, "speculate");
            cJSON_AddStringToObject(sp, "tree", g->tree);
            cJSON_AddNumberToObject(sp, "identical", sc->identical);
            cJSON_AddNumberToObject(sp, "records", sc->n);
            cJSON_AddNumberToObject(sp, "tokens", (double)sc->spec_tokens);
            cJSON_AddNumberToObject(sp, "passes", (double)sc->spec_passes);
            cJSON_AddNumberToObject(sp, "tokens_per_pass", ratio((double)sc->spec_tokens, (double)sc->spec_passes));
            cJSON_AddNumberToObject(sp, "plain_tok_s", ratio((double)sc->plain_tokens, sc->plain_s));
            cJSON_AddNumberToObject(sp, "spec_tok_s", ratio((double)sc->spec_tokens, sc->spec_s));
        }
        if (o->model_path[1]) {
            double em = pct(g->score[0].exact, g->score[0].n);
            double cf = mean(g->score[0].chrf, g->score[0].n);
            cJSON *r = cJSON_AddObjectToObject(e, "relative");
            if (em > 0)
                cJSON_AddNumberToObject(r, "exact_match",
                                        100.0 * pct(g->score[1].exact, g->score[1].n) / em);
            if (cf > 0)
                cJSON_AddNumberToObject(r, "chrf",
                                        100.0 * mean(g->score[1].chrf, g->score[1].n) / cf);
        }
        cJSON_AddItemToArray(arr, e);
    }
    char *text = cJSON_Print(root);
    if (text) puts(text);
    free(text);
    cJSON_Delete(root);
}

/* "name=PATH,name=PATH" into o->adapter_name / adapter_path (in place). */
static bool parse_adapters(eval_opts *o) {
    for (char *save = NULL, *item = strtok_r(o->adapter_spec, ",", &save); item;
         item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (!eq || eq == item || !eq[1]) {
            fprintf(stderr, "loraplex eval-tasks: --adapters wants NAME=PATH, got '%s'\n", item);
            return false;
        }
        if (o->n_adapters == 32) {
            fprintf(stderr, "loraplex eval-tasks: at most 32 adapters\n");
            return false;
        }
        *eq = '\0';
        o->adapter_name[o->n_adapters] = item;
        o->adapter_path[o->n_adapters++] = eq + 1;
    }
    return true;
}

int cli_eval_tasks(int argc, char **argv) {
    eval_opts o = {.batch = 16, .max_new = 96};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long n;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            eval_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--base")) { o.base = true; continue; }
        if (!strcmp(a, "--json")) { o.json = true; continue; }
        if (!strcmp(a, "--costed")) { o.costed = true; continue; }
        if (!(v = cli_value(argc, argv, &i))) return 2;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o.model_path[0] = v;
        else if (!strcmp(a, "--quantized")) o.model_path[1] = v;
        else if (!strcmp(a, "--data")) o.data_dir = v;
        else if (!strcmp(a, "--adapters")) o.adapter_spec = strdup(v);
        else if (!strcmp(a, "--tasks")) o.only_tasks = v;
        else if (!strcmp(a, "--profile")) o.profile = v;
        else if (!strcmp(a, "--speculate")) o.speculate = v;
        else if (!strcmp(a, "--lookup")) {
            char *end;
            long g = strtol(v, &end, 10), len = 8;
            if (*end == ':') len = strtol(end + 1, &end, 10);
            if (*end || g < 1 || g > 16 || len < 1 || len > LP_SPEC_MAX_NODES) {
                fprintf(stderr, "loraplex eval-tasks: --lookup wants N (1..16) or N:L (L 1..%d)\n",
                        LP_SPEC_MAX_NODES);
                free(o.adapter_spec);
                return 2;
            }
            o.lookup_ngram = (int)g;
            o.lookup_len = (int)len;
        }
        else if (!strcmp(a, "--ngram")) {
            if (!cli_int(a, v, 0, LP_SPEC_MAX_NODES, &n)) return 2;
            o.ngram_len = n ? (int)n : -1;
        }
        else if (!strcmp(a, "--max")) {
            if (!cli_int(a, v, 1, 10000000, &n)) return 2;
            o.max_records = (int)n;
        } else if (!strcmp(a, "--batch")) {
            if (!cli_int(a, v, 1, 256, &n)) return 2;
            o.batch = (int)n;
        } else if (!strcmp(a, "--max-new")) {
            if (!cli_int(a, v, 1, 400, &n)) return 2;
            o.max_new = (int)n;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!cli_int(a, v, 1, 1024, &n)) return 2;
            o.threads = (int)n;
        } else {
            fprintf(stderr, "loraplex eval-tasks: unknown option '%s'\n", a);
            eval_usage(stderr);
            return 2;
        }
    }
    if ((o.lookup_ngram || o.costed) && !o.speculate) {
        fprintf(stderr, "loraplex eval-tasks: --lookup and --costed need --speculate DIR\n");
        free(o.adapter_spec);
        return 2;
    }
    if (!o.model_path[0] || !o.data_dir) {
        eval_usage(stderr);
        free(o.adapter_spec);
        return 2;
    }
    if (o.adapter_spec && !parse_adapters(&o)) {
        free(o.adapter_spec);
        return 2;
    }
    group_list gl = {0};
    lp_error err;
    int rc = 0;
    bool all_same = true;
    for (int which = 0; which < 2 && rc == 0; which++)
        if (o.model_path[which] && eval_model(&o, which, &gl, &all_same, &err) != 0)
            rc = cli_fail("eval-tasks", &err);
    if (rc == 0 && gl.n == 0) {
        fprintf(stderr, "loraplex eval-tasks: no <task>.eval.jsonl files in %s\n", o.data_dir);
        rc = 1;
    }
    if (rc == 0) {
        qsort(gl.g, (size_t)gl.n, sizeof *gl.g, group_cmp);
        if (o.json) print_json(&o, &gl);
        else print_table(&o, &gl);
    }
    if (rc == 0 && !all_same) {
        fprintf(stderr, "loraplex eval-tasks: FAILED: a speculative output differs from plain decoding "
                        "(a bug in speculative decoding: report it)\n");
        rc = 1;
    }
    free(gl.g);
    free(o.adapter_spec);
    return rc;
}
