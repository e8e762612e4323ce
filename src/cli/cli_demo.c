/* loraplex demo: the built-in default job, on the project's own demo world
 * (models/demo-v2: nine languages in six scripts, the default; or
 * models/demo: version 1's three languages; each a small llama base trained from
 * scratch by our trainer and one LoRA adapter per task, see the folder's
 * README.md).
 *
 *   1. every task answered on sample inputs by hot-swapping that task's
 *      adapter into one slot of a live context (the swap is timed: it is a
 *      pointer store), with the base alone for contrast;
 *   2. one sentence rendered in four styles at once: lp_generate_streams
 *      with one stream per style adapter over a shared prompt;
 *   3. where the folder has forecast/correct.lpf: the correction task
 *      decoded plainly and speculatively (DS2D, docs/speculate.md), the same
 *      text in fewer passes, both timed.
 *
 * Sample inputs are drawn from the world generator's eval split (meanings
 * the adapters never saw in training). Without a demo folder it falls back to
 * the tiny pretrained stories260K model from shared/models. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/base.h"
#include "../world/world.h"
#include "../world/world2.h"
#include "cli.h"

/* ---- finding the artifacts --------------------------------------------------- */

static bool file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static bool is_demo_dir(const char *dir) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/base.gguf", dir);
    return file_exists(path);
}

/* A version-2 world's folder: its compose adapter (version 1 has no such
 * task) is the mark. */
static bool is_world2_dir(const char *dir) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/adapters/compose.lpa", dir);
    return file_exists(path);
}

/* The demo folders, newest world first: a checkout holds both, and the
 * demo runs the nine-language world unless LORAPLEX_DEMO_DIR names
 * another (models/demo: version 1, kept so its figures can be rerun). */
static const char *const demo_dirs[] = {"models/demo-v2", "models/demo"};

static bool find_in(const char *root, char *out, size_t cap) {
    for (size_t i = 0; i < sizeof demo_dirs / sizeof demo_dirs[0]; i++) {
        int len = root ? snprintf(out, cap, "%s/%s", root, demo_dirs[i]) : snprintf(out, cap, "%s", demo_dirs[i]);
        if (len > 0 && (size_t)len < cap && is_demo_dir(out)) return true;
    }
    return false;
}

/* LORAPLEX_DEMO_DIR, else a demo folder in the executable's folder or one
 * of its parents (a build folder inside the source tree), else in the
 * current directory. */
bool cli_find_demo_dir(char *out, size_t cap) {
    const char *env = getenv("LORAPLEX_DEMO_DIR");
    if (env && env[0]) {
        snprintf(out, cap, "%s", env);
        return is_demo_dir(out);
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        for (int up = 0; up < 6; up++) {
            char *slash = strrchr(exe, '/');
            if (!slash) break;
            *slash = '\0';
            if (find_in(exe, out, cap)) return true;
        }
    }
    return find_in(NULL, out, cap);
}

/* ---- the fallback: stories260K --------------------------------------------------- */

static bool find_shared_model(const char *file, char *out, size_t cap) {
    const char *env = getenv("LORAPLEX_SHARED_MODELS");
    const char *dirs[] = {env, LP_SHARED_MODELS, "shared/models", "../shared/models"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        if (!dirs[i]) continue;
        snprintf(out, cap, "%s/%s", dirs[i], file);
        if (file_exists(out)) return true;
    }
    return false;
}

static bool print_text(void *user, const char *text, size_t len) {
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return true;
}

static int story(lp_context *ctx, const lp_model *model, const char *prompt, float temp,
                 uint64_t seed) {
    lp_error err;
    lp_sampler_params sp = lp_sampler_default_params();
    sp.temperature = temp;
    sp.seed = seed;
    lp_sampler *s = lp_sampler_create(model, &sp, &err);
    if (!s) return cli_fail("sampler", &err);
    int32_t tokens[64];
    int n = lp_tokenize(model, prompt, strlen(prompt), true, false, tokens, 64, &err);
    lp_generate_params gp = lp_generate_default_params();
    gp.n_predict = 120;
    lp_generate_stats st;
    printf("%s", prompt);
    int rc = n < 0 ? -1 : lp_generate(ctx, s, tokens, n, &gp, print_text, NULL, &st, &err);
    lp_sampler_free(s);
    if (rc) return cli_fail("generate", &err);
    printf("\n");
    fprintf(stderr, "  [%d prompt tokens, %d generated, %.0f tok/s decode]\n\n", st.n_prompt,
            st.n_generated, st.decode_seconds > 0 ? st.n_generated / st.decode_seconds : 0.0);
    return 0;
}

static int stories_demo(void) {
    char path[1024];
    if (!find_shared_model("stories260K.gguf", path, sizeof path)) {
        fprintf(stderr, "loraplex demo: cannot find stories260K.gguf either (set "
                        "LORAPLEX_SHARED_MODELS to the shared/models folder)\n");
        return 1;
    }
    lp_error err;
    lp_model *model = lp_model_load(path, NULL, &err);
    if (!model) return cli_fail("cannot load model", &err);
    lp_context *ctx = lp_context_create(model, NULL, &err);
    if (!ctx) {
        lp_model_free(model);
        return cli_fail("cannot create context", &err);
    }
    printf("loraplex demo: %s (a real 260K-parameter TinyStories model)\n\n", path);
    printf("greedy:\n");
    int rc = story(ctx, model, "Once upon a time", 0.0f, 0);
    printf("sampled (temperature 0.8, seed 42):\n");
    if (!rc) rc = story(ctx, model, "The little dog", 0.8f, 42);
    lp_context_free(ctx);
    lp_model_free(model);
    return rc;
}

/* ---- the demo world ----------------------------------------------------------------- */

enum { N_STYLES = 4, MAX_NEW = 64, MAX_TASKS = LP_W2_N_TASKS > LP_WORLD_N_TASKS ? LP_W2_N_TASKS : LP_WORLD_N_TASKS };
static const char *const style_names[N_STYLES] = {"formal", "polite", "jovial", "terse"};

typedef struct demo {
    lp_world2 *w2; /* the version-2 generator, or NULL for version 1 */
    lp_model *model;
    lp_context *ctx;
    lp_adapter *adapter[MAX_TASKS]; /* by world task index; NULL for a task with no adapter */
    lp_profile *profile;            /* the folder's QUAD profile (quad/shared.lpq), or NULL */
    lp_sampler *greedy;
} demo;

/* The two world versions behind one face: tasks, languages, records. */
static int n_tasks(const demo *d) { return d->w2 ? LP_W2_N_TASKS : LP_WORLD_N_TASKS; }
static int n_langs(const demo *d) { return d->w2 ? LP_W2_N_LANGS : LP_N_LANGS; }
static const char *task_name(const demo *d, int t) {
    return d->w2 ? lp_world2_task_name(t) : lp_world_task_name(t);
}
static bool task_trained(const demo *d, int t) { return d->w2 ? lp_world2_task_trained(t) : true; }
static int task_from_name(const demo *d, const char *name) {
    return d->w2 ? lp_world2_task_from_name(name) : lp_world_task_from_name(name);
}
/* Samples per task: version 2 shows each task in three of its nine
 * languages, so every script appears. */
static int samples_per_task(const demo *d) { return d->w2 ? 3 : 2; }

/* "vl (Latin)" for version 2's languages, the code alone for version 1's;
 * a translation's source and target both. */
static void lang_label(const demo *d, const char *code, char *out, size_t cap) {
    if (!d->w2) {
        snprintf(out, cap, "%s", code);
        return;
    }
    char src[8];
    snprintf(src, sizeof src, "%s", code);
    char *arrow = strchr(src, '>');
    if (arrow) *arrow = '\0';
    int a = lp_world2_lang_from_code(src), b = arrow ? lp_world2_lang_from_code(arrow + 1) : -1;
    if (a < 0) snprintf(out, cap, "%s", code);
    else if (b < 0) snprintf(out, cap, "%s (%s)", code, lp_world2_lang_script(a));
    else snprintf(out, cap, "%s (%s > %s)", code, lp_world2_lang_script(a), lp_world2_lang_script(b));
}

/* Collects generated text (one buffer per stream). */
typedef struct text_buf {
    char text[N_STYLES][512];
    size_t len[N_STYLES];
} text_buf;

static bool collect_one(void *user, const char *text, size_t len) {
    text_buf *b = user;
    size_t room = sizeof b->text[0] - 1 - b->len[0];
    if (len > room) len = room;
    memcpy(b->text[0] + b->len[0], text, len);
    b->len[0] += len;
    b->text[0][b->len[0]] = '\0';
    return true;
}

static bool collect_stream(void *user, int stream, const char *text, size_t len) {
    text_buf *b = user;
    if (stream < 0 || stream >= N_STYLES) return false;
    size_t room = sizeof b->text[0] - 1 - b->len[stream];
    if (len > room) len = room;
    memcpy(b->text[stream] + b->len[stream], text, len);
    b->len[stream] += len;
    b->text[stream][b->len[stream]] = '\0';
    return true;
}

static void cut_newline(char *s) {
    char *nl = strchr(s, '\n');
    if (nl) *nl = '\0';
}

/* Greedy answer to `prompt` with adapter slot `slot`; out gets the text up
 * to the first newline. Returns seconds taken, or -1. */
static double answer(demo *d, const char *prompt, int slot, char *out, size_t cap,
                     lp_error *err) {
    int32_t tokens[512];
    int n = lp_tokenize(d->model, prompt, strlen(prompt), lp_model_add_bos(d->model), false,
                        tokens, 512, err);
    if (n < 0) return -1;
    if (n > 512) {
        lp_fail(err, "prompt too long (%d tokens)", n);
        return -1;
    }
    static const char *const stop[] = {"\n"};
    lp_generate_params gp = lp_generate_default_params();
    gp.n_predict = MAX_NEW;
    gp.stop = stop;
    gp.n_stop = 1;
    gp.prefix_adapter = slot;
    gp.reuse_cache = false;
    text_buf buf = {0};
    lp_sampler_reset(d->greedy, 0);
    double t0 = lp_now_seconds();
    if (lp_generate(d->ctx, d->greedy, tokens, n, &gp, collect_one, &buf, NULL, err) != 0)
        return -1;
    double dt = lp_now_seconds() - t0;
    cut_newline(buf.text[0]);
    snprintf(out, cap, "%s", buf.text[0]);
    return dt;
}

/* A record of `task` whose meaning is in the eval split (never trained on;
 * both versions hold out 10 % of the meanings). */
static void eval_sample(const demo *d, lp_rng *rng, int task, int lang, lp_world_record *r) {
    for (int tries = 0; tries < 10000; tries++) {
        uint64_t key = d->w2 ? lp_world2_make_record(d->w2, rng, task, lang, r) : lp_world_make_record(rng, task, lang, r);
        if (lp_world_key_is_eval(key, 10)) return;
    }
}

static int show_tasks(demo *d, lp_rng *rng) {
    lp_error err;
    printf("== 1. one base, one adapter per task, swapped live into slot 1 ==\n");
    int hits = 0, total = 0;
    for (int t = 0; t < n_tasks(d); t++) {
        if (!d->adapter[t]) continue;
        double t0 = lp_now_seconds();
        if (lp_context_bind_adapter(d->ctx, 1, d->adapter[t], &err) != 0)
            return cli_fail("bind adapter", &err);
        double swap_us = (lp_now_seconds() - t0) * 1e6;
        printf("\n[%s]  adapter %s%s.lpa -> slot 1 (swap %.2f us)\n", task_name(d, t), d->profile ? "quad/" : "",
               task_name(d, t), swap_us);
        const int per = samples_per_task(d);
        for (int k = 0; k < per; k++) {
            lp_world_record r;
            /* version 2: consecutive languages, so the tasks go round all nine */
            eval_sample(d, rng, t, (d->w2 ? t * per + k : t + k) % n_langs(d), &r);
            char got[512], base[512];
            double dt = answer(d, r.prompt, 1, got, sizeof got, &err);
            if (dt < 0) return cli_fail("generate", &err);
            bool ok = strcmp(got, r.completion) == 0;
            hits += ok;
            total++;
            char prompt[768];
            snprintf(prompt, sizeof prompt, "%s", r.prompt);
            cut_newline(prompt);
            char lang[64];
            lang_label(d, r.lang, lang, sizeof lang);
            printf("  %-5s %s\n", lang, prompt);
            printf("        adapter: %s  [%s, %.0f ms]\n", got, ok ? "exact" : "differs",
                   dt * 1e3);
            if (!ok) printf("        expected: %s\n", r.completion);
            if (k == 0) {
                if (answer(d, r.prompt, 0, base, sizeof base, &err) < 0)
                    return cli_fail("generate", &err);
                printf("        base alone: %s\n", base);
            }
        }
    }
    printf("\n%d of %d sample answers exact (see `loraplex eval-tasks` for the full eval)\n\n",
           hits, total);
    return 0;
}

static int show_styles(demo *d, lp_rng *rng) {
    lp_error err;
    printf("== 2. one sentence, four styles decoded together (one stream per style "
           "adapter) ==\n");
    /* Bind the four style adapters to slots 1..4. */
    double t0 = lp_now_seconds();
    for (int s = 0; s < N_STYLES; s++) {
        char name[32];
        snprintf(name, sizeof name, "style-%s", style_names[s]);
        int task = task_from_name(d, name);
        if (task < 0 || !d->adapter[task] || lp_context_bind_adapter(d->ctx, s + 1, d->adapter[task], &err) != 0)
            return cli_fail("bind style adapter", &err);
    }
    double bind_us = (lp_now_seconds() - t0) * 1e6;
    /* A neutral English sentence from the eval split. */
    lp_world_record r;
    eval_sample(d, rng, task_from_name(d, "style-formal"), 0 /* English in both versions */, &r);
    const char *colon = strchr(r.prompt, ':');
    char sentence[sizeof r.prompt];
    snprintf(sentence, sizeof sentence, "%s", colon ? colon + 2 : r.prompt);
    cut_newline(sentence);
    printf("input: %s\n", sentence);
    /* The shared prompt is just BOS; each stream's suffix is its own
     * instruction, as in training ("<style>: <sentence>\n"). */
    int32_t bos = lp_token_bos(d->model);
    char suffix[N_STYLES][sizeof r.prompt + 16];
    lp_stream streams[N_STYLES];
    lp_sampler *samplers[N_STYLES] = {0};
    int rc = 0;
    for (int s = 0; s < N_STYLES; s++) {
        snprintf(suffix[s], sizeof suffix[s], "%s: %s\n", style_names[s], sentence);
        lp_sampler_params sp = lp_sampler_default_params();
        sp.temperature = 0;
        if (!(samplers[s] = lp_sampler_create(d->model, &sp, &err))) {
            rc = cli_fail("sampler", &err);
            goto done;
        }
        streams[s] = (lp_stream){suffix[s], s + 1, samplers[s], -1};
    }
    static const char *const stop[] = {"\n"};
    lp_generate_params gp = lp_generate_default_params();
    gp.n_predict = MAX_NEW;
    gp.stop = stop;
    gp.n_stop = 1;
    gp.reuse_cache = false;
    text_buf buf = {0};
    lp_generate_stats st;
    t0 = lp_now_seconds();
    if (lp_generate_streams(d->ctx, &bos, 1, streams, N_STYLES, &gp, collect_stream, &buf,
                            NULL, &st, &err) != 0) {
        rc = cli_fail("generate streams", &err);
        goto done;
    }
    double dt = lp_now_seconds() - t0;
    for (int s = 0; s < N_STYLES; s++) {
        cut_newline(buf.text[s]);
        printf("  %-7s %s\n", style_names[s], buf.text[s]);
    }
    printf("4 streams in one batch per step: %d tokens in %.0f ms (%d decode steps, "
           "%.0f tok/s); style adapters bound to slots 1-4 in %.1f us\n",
           st.n_generated, dt * 1e3, st.decode_steps, dt > 0 ? st.n_generated / dt : 0.0,
           bind_us);
done:
    for (int s = 0; s < N_STYLES; s++) lp_sampler_free(samplers[s]);
    return rc;
}

/* ---- 3. speculative decoding ------------------------------------------------------ */

/* One greedy answer through the engine, plain (sp NULL) or speculative. */
typedef struct engine_answer {
    text_buf text;
    int tokens, passes;
    double decode_seconds; /* from the first token to the last */
} engine_answer;

static bool collect_request(void *user, int request, const char *text, size_t len) {
    (void)request;
    return collect_one(user, text, len);
}

/* Runs one request to its end on engine e (nothing else in flight). */
static int answer_engine(lp_engine *e, const int32_t *prompt, int n, const lp_adapter *a, const lp_speculate *sp,
                         engine_answer *out, lp_error *err) {
    memset(out, 0, sizeof *out);
    static const char *const stop[] = {"\n"};
    lp_request q = lp_request_default();
    q.prompt = prompt;
    q.n_prompt = n;
    q.adapter = a;
    q.prefix_adapter = a;
    q.n_prefix = n;
    q.sampling.temperature = 0;
    q.max_tokens = MAX_NEW;
    q.stop = stop;
    q.n_stop = 1;
    q.no_reuse = true;
    q.drop_kv = true;
    q.fn = collect_request;
    q.user = &out->text;
    q.speculate = sp;
    int id = lp_engine_submit(e, &q, err), left = 1;
    if (id < 0) return -1;
    double t1 = 0;
    lp_request_stats rs = {0};
    while (left > 0) {
        if ((left = lp_engine_step(e, err)) < 0) return -1;
        lp_engine_request_stats(e, id, &rs);
        if (t1 == 0 && rs.n_generated > 0) t1 = lp_now_seconds();
    }
    out->decode_seconds = t1 > 0 ? lp_now_seconds() - t1 : 0;
    lp_spec_stats ss = {0};
    lp_engine_request_spec_stats(e, id, &ss);
    out->tokens = rs.n_generated;
    out->passes = sp ? ss.n_passes : rs.n_generated;
    cut_newline(out->text.text[0]);
    return 0;
}

/* The faster of `reps` runs (the demo model is small: one run is a few ms,
 * and a timer tick or another process shows). */
static int answer_best(lp_engine *e, const int32_t *prompt, int n, const lp_adapter *a, const lp_speculate *sp,
                       int reps, engine_answer *best, lp_error *err) {
    engine_answer r;
    for (int i = 0; i < reps; i++) {
        if (answer_engine(e, prompt, n, a, sp, &r, err)) return -1;
        if (i == 0 || r.decode_seconds < best->decode_seconds) *best = r;
    }
    return 0;
}

static int show_speculate(demo *d, lp_rng *rng, const char *dir) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/forecast/correct.lpf", dir);
    int task = task_from_name(d, "correct");
    if (!file_exists(path) || task < 0 || !d->adapter[task]) return 0;
    lp_error err;
    lp_forecast *f = lp_forecast_load(path, &err);
    if (!f || lp_forecast_check(f, d->model, &err)) {
        lp_forecast_free(f);
        return cli_fail(path, &err);
    }
    /* the configuration that is fastest on this small model (docs/benchmarks.md
     * section 23): the chain from the forecast file's draft corpus and prompt
     * lookup, no forecast rows (a pass of many rows costs nearly as many rows
     * here), pruned by the measured cost of a pass */
    lp_speculate sp = lp_speculate_default();
    sp.forecast = f;
    sp.lookup_ngram = 3;
    sp.lookup_len = 8;
    int rc = 0;
    lp_engine *e = NULL;
    if (lp_speculate_measure_cost(d->ctx, 64, sp.pass_cost, LP_SPEC_COST_ROWS, &err) ||
        !(e = lp_engine_create(d->ctx, NULL, &err))) {
        rc = cli_fail("speculation", &err);
        goto done;
    }
    printf("\n== 3. speculative decoding (DS2D): the same text in fewer passes ==\n");
    /* one engine for all runs, as a server keeps one: its acceptance counts
     * per adapter carry from request to request */
    printf("[correct]  forecast/correct.lpf: a draft corpus of %d tokens (the adapter's own outputs); drafts from it\n"
           "  and from the prompt (lookup 3:8), verified as one batch of rows a pass; a pass of 2 / 4 / 8 rows\n"
           "  costs %.2f / %.2f / %.2f of one row here, and each step keeps the drafts worth their rows\n",
           lp_forecast_corpus_size(f), (double)sp.pass_cost[1], (double)sp.pass_cost[3], (double)sp.pass_cost[7]);
    int tokens = 0, plain_passes = 0, spec_passes = 0, same = 0, n_rec = samples_per_task(d) + 2;
    double plain_s = 0, spec_s = 0;
    for (int k = 0; k < n_rec; k++) {
        lp_world_record r;
        eval_sample(d, rng, task, k % n_langs(d), &r);
        int32_t prompt[512];
        int n = lp_tokenize(d->model, r.prompt, strlen(r.prompt), lp_model_add_bos(d->model), false, prompt, 512,
                            &err);
        if (n < 0 || n > 512) {
            rc = cli_fail("tokenize", &err);
            goto done;
        }
        engine_answer plain, spec;
        if (answer_best(e, prompt, n, d->adapter[task], NULL, 3, &plain, &err) ||
            answer_best(e, prompt, n, d->adapter[task], &sp, 3, &spec, &err)) {
            rc = cli_fail("generate", &err);
            goto done;
        }
        bool identical = strcmp(plain.text.text[0], spec.text.text[0]) == 0 && plain.tokens == spec.tokens;
        same += identical;
        tokens += plain.tokens;
        plain_passes += plain.passes;
        spec_passes += spec.passes;
        plain_s += plain.decode_seconds;
        spec_s += spec.decode_seconds;
        char prompt_text[768], lang[64];
        snprintf(prompt_text, sizeof prompt_text, "%s", r.prompt);
        cut_newline(prompt_text);
        lang_label(d, r.lang, lang, sizeof lang);
        printf("  %-5s %s\n", lang, prompt_text);
        printf("        plain:       %s  [%d tokens, %d passes, %.1f ms]\n", plain.text.text[0], plain.tokens,
               plain.passes, plain.decode_seconds * 1e3);
        printf("        speculative: %s  [%d passes, %.1f ms]\n", identical ? "(the same text)" : spec.text.text[0],
               spec.passes, spec.decode_seconds * 1e3);
    }
    printf("%d of %d outputs identical; %d tokens in %d passes plainly, %d speculatively (%.2f tokens per pass);\n"
           "decode %.1f ms -> %.1f ms: %.2fx (the faster of 3 runs each)\n",
           same, n_rec, tokens, plain_passes, spec_passes, spec_passes ? (double)tokens / spec_passes : 0.0,
           plain_s * 1e3, spec_s * 1e3, spec_s > 0 ? plain_s / spec_s : 0.0);
    if (same != n_rec) rc = 1; /* speculation is lossless: a difference is a bug */
done:
    lp_engine_free(e);
    lp_forecast_free(f);
    return rc;
}

static void demo_free(demo *d) {
    lp_sampler_free(d->greedy);
    lp_context_free(d->ctx);
    for (int t = 0; t < MAX_TASKS; t++) lp_adapter_free(d->adapter[t]);
    lp_profile_free(d->profile);
    lp_model_free(d->model);
    lp_world2_free(d->w2);
}

/* The folder's QUAD profile when it has one and a fitted adapter for every
 * trained task (quad/shared.lpq, quad/<task>.lpa): the demo then runs the
 * adapters as int8 codes under that one shared profile; else NULL and the
 * plain adapters/<task>.lpa. */
static lp_profile *load_quad(demo *d, const char *dir, lp_error *err) {
    char path[PATH_MAX + 64];
    for (int t = 0; t < n_tasks(d); t++) {
        snprintf(path, sizeof path, "%s/quad/%s.lpa", dir, task_name(d, t));
        if (task_trained(d, t) && !file_exists(path)) return NULL;
    }
    snprintf(path, sizeof path, "%s/quad/shared.lpq", dir);
    return file_exists(path) ? lp_profile_load(d->model, path, err) : NULL;
}

static int world_demo(const char *dir, long seed, int threads) {
    lp_error err;
    demo d = {0};
    int rc = 1;
    char path[PATH_MAX + 64];
    if (is_world2_dir(dir) && !(d.w2 = lp_world2_create(&err))) {
        cli_fail("world generator", &err);
        goto done;
    }
    snprintf(path, sizeof path, "%s/base.gguf", dir);
    double t0 = lp_now_seconds();
    if (!(d.model = lp_model_load(path, NULL, &err))) {
        cli_fail(path, &err);
        goto done;
    }
    double load_ms = (lp_now_seconds() - t0) * 1e3;
    lp_model_info info;
    lp_model_get_info(d.model, &info);
    if (d.w2) {
        printf("loraplex demo: the demo world, version 2 (%s): %d languages,", dir, LP_W2_N_LANGS);
        for (int l = 0; l < LP_W2_N_LANGS; l++)
            printf(" %s %s (%s)%s", lp_world2_lang_code(l), lp_world2_lang_name(l), lp_world2_lang_script(l),
                   l + 1 < LP_W2_N_LANGS ? "," : "\n");
    } else {
        printf("loraplex demo: the demo world, version 1 (%s)\n", dir);
    }
    printf("base: %s, %.2fM parameters, dim %d, %d layers, %d/%d heads, vocab %d, "
           "%.1f MB; loaded in %.0f ms\n",
           path, info.n_params / 1e6, info.dim, info.n_layers, info.n_heads, info.n_kv_heads,
           info.n_vocab, info.weight_bytes / 1e6, load_ms);
    t0 = lp_now_seconds();
    uint64_t adapter_bytes = 0;
    int n_adapters = 0;
    err.message[0] = '\0';
    d.profile = load_quad(&d, dir, &err);
    if (!d.profile && err.message[0]) {
        cli_fail("quad/shared.lpq", &err);
        goto done;
    }
    for (int t = 0; t < n_tasks(&d); t++) {
        if (!task_trained(&d, t)) continue; /* version 2's style-curious: the style no adapter saw */
        snprintf(path, sizeof path, "%s/%s/%s.lpa", dir, d.profile ? "quad" : "adapters", task_name(&d, t));
        if (!(d.adapter[t] = lp_adapter_load(d.model, path, 1.0f, &err))) {
            cli_fail(path, &err);
            goto done;
        }
        adapter_bytes += lp_adapter_bytes(d.adapter[t]);
        n_adapters++;
    }
    if (d.profile)
        printf("adapters: %d (quad/<task>.lpa: int8 codes under one shared QUAD profile, quad/shared.lpq %016llx, "
               "fitted by `loraplex quad fit`), %.2f MB together; loaded in %.0f ms\n\n",
               n_adapters, (unsigned long long)lp_profile_id(d.profile), adapter_bytes / 1e6,
               (lp_now_seconds() - t0) * 1e3);
    else
        printf("adapters: %d (.lpa), %.2f MB together; loaded in %.0f ms\n\n", n_adapters, adapter_bytes / 1e6,
               (lp_now_seconds() - t0) * 1e3);
    lp_context_params cp = lp_context_default_params();
    cp.n_threads = threads;
    cp.max_adapters = N_STYLES;
    cp.max_sequences = N_STYLES;
    cp.max_seq_len = 256;
    cp.n_ctx = N_STYLES * 256;
    cp.max_logit_rows = LP_SPEC_MAX_NODES + 1; /* a speculative step asks for every draft's logits */
    lp_sampler_params sp = lp_sampler_default_params();
    sp.temperature = 0;
    if (!(d.ctx = lp_context_create(d.model, &cp, &err)) ||
        (d.profile && lp_context_bind_profile(d.ctx, d.profile, &err)) ||
        !(d.greedy = lp_sampler_create(d.model, &sp, &err))) {
        cli_fail("context", &err);
        goto done;
    }
    lp_rng rng;
    lp_rng_seed(&rng, (uint64_t)seed);
    if (show_tasks(&d, &rng) != 0 || show_styles(&d, &rng) != 0 || show_speculate(&d, &rng, dir) != 0) goto done;
    rc = 0;
done:
    demo_free(&d);
    return rc;
}

int cli_demo(int argc, char **argv) {
    long seed = 7, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: loraplex demo [--seed S] [-t THREADS]\n"
                   "Runs the demo world's base with its task adapters (models/demo-v2, the\n"
                   "nine-language world; or LORAPLEX_DEMO_DIR, e.g. models/demo for version 1);\n"
                   "--seed picks the sample inputs (default 7).\n");
            return 0;
        }
        if (!(v = cli_value(argc, argv, &i))) return 2;
        if (!strcmp(a, "--seed")) {
            if (!cli_int(a, v, 0, 1L << 62, &seed)) return 2;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!cli_int(a, v, 0, 256, &threads)) return 2;
        } else {
            fprintf(stderr, "loraplex demo: unknown option '%s'\n", a);
            return 2;
        }
    }
    char dir[PATH_MAX];
    if (!cli_find_demo_dir(dir, sizeof dir)) {
        fprintf(stderr, "loraplex demo: no demo world artifacts found (models/demo-v2, or set "
                        "LORAPLEX_DEMO_DIR); running stories260K instead\n\n");
        return stories_demo();
    }
    return world_demo(dir, seed, (int)threads);
}
