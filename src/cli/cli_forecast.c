/* loraplex forecast-random: a forecast-embedding file (.lpf) of random
 * embeddings for a model, for tests and as the "no training" baseline of
 * speculative decoding (acceptance near zero; output still exact). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "../base/base.h"
#include "../train/forecast.h"
#include "cli.h"
#include "tools.h"

static void forecast_usage(FILE *out) {
    fprintf(out, "usage: loraplex forecast-random --model M -k K -o F.lpf [--seed S] [--scale X]\n"
                 "                                [--adapter-name NAME] [--prefix P]\n"
                 "  k random embeddings N(0, X^2) (default X 0.5) of the model's width, recording\n"
                 "  its fingerprint and vocabulary (and NAME as the adapter they are meant for);\n"
                 "  --prefix P adds a random KV prefix of P entries (N(0, 1) keys and values)\n");
}

static int random_prefix(lp_forecast *f, const lp_model *m, int n, lp_rng *rng, lp_error *err) {
    if (n == 0) return 0;
    lp_model_info info;
    lp_model_get_info(m, &info);
    size_t count = (size_t)info.n_layers * 2 * (size_t)n * (size_t)(info.n_kv_heads * info.head_dim);
    float *kv = malloc(count * sizeof *kv);
    if (!kv) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < count; i++) kv[i] = lp_rng_normal(rng);
    int rc = lp_forecast_set_prefix(f, m, kv, n, err);
    free(kv);
    return rc;
}

int cli_forecast_random(int argc, char **argv) {
    const char *model_path = NULL, *out_path = NULL, *name = NULL;
    long k = 4, seed = 1, prefix = 0;
    double scale = 0.5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            forecast_usage(stdout);
            return 0;
        }
        if (!(v = cli_value(argc, argv, &i))) return 2;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model_path = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--out")) out_path = v;
        else if (!strcmp(a, "--adapter-name")) name = v;
        else if (!strcmp(a, "-k")) { if (!cli_int(a, v, 1, 64, &k)) return 2; }
        else if (!strcmp(a, "--prefix")) { if (!cli_int(a, v, 0, LP_MAX_KV_PREFIX, &prefix)) return 2; }
        else if (!strcmp(a, "-s") || !strcmp(a, "--seed")) { if (!cli_int(a, v, 0, __LONG_MAX__, &seed)) return 2; }
        else if (!strcmp(a, "--scale")) { if (!cli_float(a, v, 0, 100, &scale)) return 2; }
        else {
            fprintf(stderr, "loraplex forecast-random: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (!model_path || !out_path) {
        forecast_usage(stderr);
        return 2;
    }
    lp_error err = {0};
    lp_model *m = lp_model_load(model_path, NULL, &err);
    if (!m) return cli_fail(model_path, &err);
    lp_model_info info;
    lp_model_get_info(m, &info);
    float *e = malloc((size_t)k * (size_t)info.dim * sizeof *e);
    int rc = 1;
    if (e) {
        lp_rng rng;
        lp_rng_seed(&rng, (uint64_t)seed);
        for (long i = 0; i < k * info.dim; i++) e[i] = (float)scale * lp_rng_normal(&rng);
        lp_forecast *f = lp_forecast_create(m, (int)k, e, name, &err);
        if (!f || random_prefix(f, m, (int)prefix, &rng, &err) || lp_forecast_save(f, out_path, &err)) {
            rc = cli_fail(out_path, &err);
        } else {
            fprintf(stderr, "loraplex: %s: %ld random forecast embeddings of %d (seed %ld, scale %g)\n", out_path, k,
                    info.dim, seed, scale);
            rc = 0;
        }
        lp_forecast_free(f);
    }
    free(e);
    lp_model_free(m);
    return rc;
}

/* ---- loraplex train-forecast --------------------------------------------------------------- */

static void train_forecast_usage(FILE *out) {
    fprintf(out,
            "usage: loraplex train-forecast --base M [--adapter A[:S]] --data prompts.jsonl -k K -o F.lpf\n"
            "  trains K forecast embeddings for run --speculate by self-distillation: the targets\n"
            "  are the frozen model's own greedy continuations of the prompts (with the adapter)\n"
            "  --data PATH        JSON lines with a \"prompt\" string (other fields ignored)\n"
            "  --continue N       teacher tokens per prompt (default 48)\n"
            "  --steps N          optimizer steps (default 200)\n"
            "  --batch B          sequences per step (default 8)\n"
            "  --anchors G        forecast groups per sequence (default 8)\n"
            "  --prefix P         also learn a KV prefix of P entries (0..64, default 0) that only\n"
            "                     forecast rows attend to, in every layer (stored as keys and values)\n"
            "  --lr X             peak learning rate (default 0.02; warmup, cosine to X/10)\n"
            "  --eval N           hold out the last N prompts to measure tokens per pass before\n"
            "                     and after (default: a tenth, at least 1 when there are 2+)\n"
            "  --tree B1,B2,...   the tree that evaluation uses (default: a chain of K)\n"
            "  --no-corpus        don't keep the teacher outputs in the file as its draft corpus\n"
            "                     (by default the engine drafts n-gram chains from them)\n"
            "  --max-size N|P%%    the file's size limit in bytes, or in percent of the adapter\n"
            "                     file: the corpus keeps the first prompts' outputs that fit\n"
            "                     (default 5%% with --adapter, else none; 0: none)\n"
            "  --checkpoint F     keep the training state in F (every --checkpoint-every N\n"
            "                     steps, at the end and where --stop-after ends the run)\n"
            "  --resume F         continue from checkpoint F (same base, adapter, prompts, -k,\n"
            "                     --steps and --lr: the file an uninterrupted run writes)\n"
            "  --stop-after N     stop after N steps of this run and write the set trained so\n"
            "                     far (needs --checkpoint; the schedule still spans --steps)\n"
            "  -s, --seed S       (default 1)   -t, --threads N (default: all cores)\n");
}

int cli_load_prompts(const lp_model *m, const char *path, int max, int32_t ***out, int **lens, lp_error *err) {
    char *text = NULL;
    size_t size;
    if (lp_read_file(path, &text, &size, 256u << 20, err)) return -1;
    int n = 0, cap = 0, line_no = 0;
    int32_t **ps = NULL;
    int *ls = NULL;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line && (max <= 0 || n < max); line = strtok_r(NULL, "\n", &save)) {
        line_no++;
        while (*line == ' ' || *line == '\t' || *line == '\r') line++;
        if (!*line) continue;
        cJSON *j = cJSON_Parse(line);
        const cJSON *pr = j ? cJSON_GetObjectItemCaseSensitive(j, "prompt") : NULL;
        if (!cJSON_IsString(pr)) {
            cJSON_Delete(j);
            lp_error_set(err, LP_ERR_FORMAT, "%s:%d: not a JSON object with a \"prompt\" string", path, line_no);
            goto bad;
        }
        const char *s = pr->valuestring;
        int k = lp_tokenize(m, s, strlen(s), lp_model_add_bos(m), false, NULL, 0, err);
        if (k < 1) {
            cJSON_Delete(j);
            if (k == 0) lp_error_set(err, LP_ERR_FORMAT, "%s:%d: empty prompt", path, line_no);
            goto bad;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            int32_t **np = realloc(ps, (size_t)cap * sizeof *np);
            if (np) ps = np;
            int *nl = np ? realloc(ls, (size_t)cap * sizeof *nl) : NULL;
            if (nl) ls = nl;
            if (!np || !nl) {
                cJSON_Delete(j);
                lp_error_set(err, LP_ERR_NOMEM, "out of memory");
                goto bad;
            }
        }
        ps[n] = malloc((size_t)k * sizeof **ps);
        if (!ps[n] || lp_tokenize(m, s, strlen(s), lp_model_add_bos(m), false, ps[n], k, err) != k) {
            free(ps[n]);
            cJSON_Delete(j);
            goto bad;
        }
        ls[n++] = k;
        cJSON_Delete(j);
    }
    free(text);
    if (n == 0) {
        free(ps);
        free(ls);
        return lp_error_set(err, LP_ERR_FORMAT, "%s: no prompts", path);
    }
    *out = ps;
    *lens = ls;
    return n;
bad:
    for (int i = 0; i < n; i++) free(ps[i]);
    free(ps);
    free(ls);
    free(text);
    return -1;
}

int cli_train_forecast(int argc, char **argv) {
    const char *base_path = NULL, *adapter_spec = NULL, *data = NULL, *out_path = NULL, *tree = NULL;
    long k = 4, seed = 1, steps = 200, batch = 8, anchors = 8, cont = 48, eval = -1, threads = 0, prefix = 0;
    double lr = 0.02;
    bool no_corpus = false;
    const char *max_size = NULL, *checkpoint = NULL, *resume = NULL;
    long ckpt_every = 0, stop_after = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            train_forecast_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--no-corpus")) {
            no_corpus = true;
            continue;
        }
        if (!(v = cli_value(argc, argv, &i))) return 2;
        if (!strcmp(a, "--base") || !strcmp(a, "-m") || !strcmp(a, "--model")) base_path = v;
        else if (!strcmp(a, "--adapter")) adapter_spec = v;
        else if (!strcmp(a, "--data")) data = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--out")) out_path = v;
        else if (!strcmp(a, "--tree")) tree = v;
        else if (!strcmp(a, "--max-size")) max_size = v;
        else if (!strcmp(a, "--checkpoint")) checkpoint = v;
        else if (!strcmp(a, "--resume")) resume = v;
        else if (!strcmp(a, "--checkpoint-every")) { if (!cli_int(a, v, 1, 1000000, &ckpt_every)) return 2; }
        else if (!strcmp(a, "--stop-after")) { if (!cli_int(a, v, 1, 1000000, &stop_after)) return 2; }
        else if (!strcmp(a, "-k")) { if (!cli_int(a, v, 1, LP_SPEC_MAX_DEPTH, &k)) return 2; }
        else if (!strcmp(a, "--prefix")) { if (!cli_int(a, v, 0, LP_MAX_KV_PREFIX, &prefix)) return 2; }
        else if (!strcmp(a, "-s") || !strcmp(a, "--seed")) { if (!cli_int(a, v, 0, __LONG_MAX__, &seed)) return 2; }
        else if (!strcmp(a, "--steps")) { if (!cli_int(a, v, 1, 1000000, &steps)) return 2; }
        else if (!strcmp(a, "--batch")) { if (!cli_int(a, v, 1, 4096, &batch)) return 2; }
        else if (!strcmp(a, "--anchors")) { if (!cli_int(a, v, 1, 256, &anchors)) return 2; }
        else if (!strcmp(a, "--continue")) { if (!cli_int(a, v, 4, 4096, &cont)) return 2; }
        else if (!strcmp(a, "--eval")) { if (!cli_int(a, v, 0, 1 << 20, &eval)) return 2; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { if (!cli_int(a, v, 1, 256, &threads)) return 2; }
        else if (!strcmp(a, "--lr")) { if (!cli_float(a, v, 1e-6, 10, &lr)) return 2; }
        else {
            fprintf(stderr, "loraplex train-forecast: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (!base_path || !data || !out_path) {
        train_forecast_usage(stderr);
        return 2;
    }
    if ((stop_after || ckpt_every) && !checkpoint) {
        fprintf(stderr, "loraplex train-forecast: --stop-after and --checkpoint-every need --checkpoint\n");
        return 2;
    }
    lp_speculate eval_tree = lp_speculate_default();
    if (tree) {
        const char *p = tree;
        int n = 0;
        while (*p) {
            char *end;
            long b = strtol(p, &end, 10);
            if (end == p || b < 1 || b > LP_SPEC_MAX_NODES || n == LP_SPEC_MAX_DEPTH || (*end && *end != ',')) {
                fprintf(stderr, "loraplex train-forecast: --tree wants counts like 3,2\n");
                return 2;
            }
            eval_tree.branches[n++] = (int)b;
            p = *end ? end + 1 : end;
        }
        eval_tree.depth = n;
    }
    char *end = NULL;
    double size_limit = strtod(max_size ? max_size : (adapter_spec ? "5%" : "0"), &end);
    bool percent = end && *end == '%';
    if (!end || end == max_size || (*end && strcmp(end, "%")) || size_limit < 0 || size_limit > 1e12) {
        fprintf(stderr, "loraplex train-forecast: --max-size wants bytes or a percentage, like 30000 or 5%%\n");
        return 2;
    }
    if (percent && !adapter_spec) {
        fprintf(stderr, "loraplex train-forecast: --max-size %s is relative to an --adapter\n", max_size);
        return 2;
    }
    lp_error err = {0};
    lp_model *m = lp_model_load(base_path, NULL, &err);
    if (!m) return cli_fail(base_path, &err);
    lp_adapter *adapter = NULL;
    int32_t **prompts = NULL;
    int *lens = NULL, n = 0, rc = 1;
    if (adapter_spec) {
        char spec[1024];
        snprintf(spec, sizeof spec, "%s", adapter_spec);
        adapter = tool_load_adapter(m, spec, &err);
        if (!adapter) {
            rc = cli_fail(adapter_spec, &err);
            goto out;
        }
        if (percent) {
            struct stat st;
            if (stat(spec, &st) != 0) {
                fprintf(stderr, "loraplex train-forecast: %s: cannot read its size for --max-size\n", spec);
                goto out;
            }
            size_limit = size_limit / 100.0 * (double)st.st_size;
        }
    }
    n = cli_load_prompts(m, data, 0, &prompts, &lens, &err);
    if (n < 0) {
        n = 0;
        rc = cli_fail(data, &err);
        goto out;
    }
    if (eval < 0) eval = n >= 2 ? (n / 10 > 0 ? n / 10 : 1) : 0;
    if (eval >= n) {
        fprintf(stderr, "loraplex train-forecast: --eval %ld leaves no training prompts (of %d)\n", eval, n);
        rc = 2;
        goto out;
    }
    lp_forecast_train_params tp = {
        .base = m, .adapter = adapter, .prompts = (const int32_t *const *)prompts, .n_prompt = lens,
        .n_prompts = n, .n_eval = (int)eval, .k = (int)k, .prefix = (int)prefix, .n_continue = (int)cont, .steps = (int)steps,
        .batch = (int)batch, .anchors = (int)anchors, .lr = (float)lr, .seed = (uint64_t)seed,
        .threads = (int)threads, .eval_tree = eval_tree, .no_corpus = no_corpus, .max_bytes = (size_t)size_limit,
        .checkpoint = checkpoint, .checkpoint_every = (int)ckpt_every, .resume = resume, .stop_after = (int)stop_after,
    };
    fprintf(stderr, "train-forecast: %d prompts (%ld held out), k %ld, KV prefix %ld, %ld steps of %ld x %ld groups, "
            "seed %ld\n", n, eval, k, prefix, steps, batch, anchors, seed);
    lp_forecast_train_report rep;
    lp_forecast *f = lp_forecast_train(&tp, &rep, &err);
    if (!f || lp_forecast_save(f, out_path, &err)) {
        rc = cli_fail(out_path, &err);
    } else {
        fprintf(stderr, "train-forecast: %d teacher tokens; ", rep.n_teacher_tokens);
        if (rep.resumed_step) fprintf(stderr, "resumed %s at step %d; ", resume, rep.resumed_step);
        if (rep.stopped_at)
            fprintf(stderr, "stopped after step %d of %ld (--resume %s continues); ", rep.stopped_at, steps,
                    checkpoint);
        fprintf(stderr, "loss %.4f -> %.4f; ", rep.first_loss, rep.last_loss);
        if (rep.resumed_step && eval > 0)
            fprintf(stderr, "held-out tokens per pass %.3f (trained) -> %.3f (with the corpus); ",
                    rep.eval_tokens_per_pass_embeddings, rep.eval_tokens_per_pass_after);
        else if (eval > 0 && rep.n_corpus)
            fprintf(stderr, "held-out tokens per pass %.3f (initial) -> %.3f (trained) -> %.3f (with the %d-token "
                    "draft corpus); ", rep.eval_tokens_per_pass_before, rep.eval_tokens_per_pass_embeddings,
                    rep.eval_tokens_per_pass_after, rep.n_corpus);
        else if (eval > 0)
            fprintf(stderr, "held-out tokens per pass %.3f (initial) -> %.3f (trained); ",
                    rep.eval_tokens_per_pass_before, rep.eval_tokens_per_pass_after);
        if (rep.corpus_dropped)
            fprintf(stderr, "the size limit of %.0f bytes kept %d of %d outputs in the corpus; ", size_limit,
                    rep.corpus_sequences, rep.corpus_sequences + rep.corpus_dropped);
        fprintf(stderr, "%.1f s; wrote %s\n", rep.seconds, out_path);
        rc = 0;
    }
    lp_forecast_free(f);
out:
    for (int i = 0; i < n; i++) free(prompts[i]);
    free(prompts);
    free(lens);
    lp_adapter_free(adapter);
    lp_model_free(m);
    return rc;
}
