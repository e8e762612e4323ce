/* loraplex quad profile / quad fit: QUAD's shared quantization profile for a
 * set of adapters, chosen by sensitivity, and the distillation that fits an
 * adapter to it (docs/quad.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/base.h"
#include "../formats/lpq.h"
#include "../model/adapter.h"
#include "../model/model.h"
#include "../tools/quad.h"
#include "../train/train.h"
#include "cli.h"

int cli_quad(int argc, char **argv);

#define QUAD_MAX_ADAPTERS 64

static void quad_usage(FILE *out) {
    fprintf(out,
            "usage: loraplex quad profile --base M --adapters a=A.lpa,b=B.lpa,... --calib DIR/tasks\n"
            "                             [--bits 8|4] [--granularity tensor|channel]\n"
            "                             [--strategy auto|anchor|fallback] [--anchor-factor 1.5]\n"
            "                             [--calib-n 16] [--seq 128] [--act-calib mse|minmax]\n"
            "                             [--threads N] -o shared.lpq\n"
            "                             [--export-encodings aimet.json]\n"
            "       loraplex quad fit --base M --profile shared.lpq --adapter B.lpa --data train.jsonl\n"
            "                         -o B-quad.lpa [--deploy Q.lpx] [--student-acts q8|f32]\n"
            "                         [--steps 100] [--lr 2e-4] [--kd-weight 0.5] [--seed 1]\n"
            "                         [--batch 8] [--seq 128] [--eval-every 25] [--holdout 32]\n"
            "                         [--eval E.jsonl] [--select best|last] [--threads N]\n"
            "       loraplex quad export --profile shared.lpq --export-encodings aimet.json\n"
            "       loraplex quad ptq --base M --profile shared.lpq --adapter B.lpa -o B-shared.lpa\n"
            "\n"
            "profile: QSS per adapter = mean Jensen-Shannon divergence (nats) between the FP32 and\n"
            "  the quantized adapter's next-token distributions (each adapter under its own PTQ\n"
            "  encodings, same bits and granularity) over the completion tokens of the first\n"
            "  calib-n records of DIR/<name>.train.jsonl (else <name>.eval.jsonl), f32 base.\n"
            "  Rule (auto): anchor = the highest QSS if it is at least anchor-factor times the\n"
            "  runner-up; then every encoding comes from the anchor (its weights, its activation\n"
            "  ranges); else the fallback: weight encodings from all adapters' weights together,\n"
            "  activation ranges of all adapters together. Activation encodings (--act-calib): mse\n"
            "  (the default) clips each range where the expected squared error of rounding plus\n"
            "  clipping is least over the calibration histogram; minmax keeps the observed range.\n"
            "fit: teacher = the f32 base + the FP32 adapter; student = the deployed base (--deploy,\n"
            "  default the f32 base; compile it with --no-fuse) + the adapter fake-quantized under\n"
            "  the profile (straight-through), its base inputs int8 per group of 32 as the W4A8\n"
            "  kernels quantize them (--student-acts q8, the default with --deploy); loss =\n"
            "  (1 - kd) CE + kd KL(teacher || student) on the completion tokens. The output is\n"
            "  the adapter's codes under the profile, for the deployed base.\n"
            "  Held out: the last --holdout records of --data are never trained on (or the first\n"
            "  --holdout of --eval E.jsonl); the held-out loss, (1 - kd) CE + kd KL, is measured\n"
            "  before the first step and every --eval-every steps, and --select best (the default)\n"
            "  writes the weights of the lowest one, so the fit never ends worse on held-out\n"
            "  records than the unfitted codes it started from; --select last writes the last.\n");
}

/* ---- shared setup ---------------------------------------------------------------------- */

/* A trainer model of base + the adapter's LoRA (FP32), reserved for B x T. */
static lp_train_model *trainer_for(const lp_model *base, const lp_adapter *a, int trainable, int B, int T,
                                   lp_threadpool *pool, lp_error *err) {
    lp_train_config c;
    if (lp_train_config_from_model(base, &c, err) < 0 || lp_train_config_from_adapter(a, &c, err) < 0) return NULL;
    lp_train_model *m = lp_train_model_create(&c, trainable, err);
    if (!m) return NULL;
    lp_train_model_set_pool(m, pool);
    if (lp_train_model_load_base(m, base, err) < 0 || lp_train_lora_from_adapter(m, a, err) < 0 ||
        lp_train_model_reserve(m, B, T, err) < 0) {
        lp_train_model_free(m);
        return NULL;
    }
    return m;
}

/* The trainer's LoRA as FP32 matrices by weight id of base. */
static int lora_of_trainer(const lp_train_model *m, const lp_model *base, const char *name, lp_quad_lora *q,
                           lp_error *err) {
    memset(q, 0, sizeof *q);
    int n = base->n_weights;
    q->base = base;
    q->n_weights = n;
    snprintf(q->name, sizeof q->name, "%s", name);
    q->rank = calloc((size_t)n, sizeof *q->rank);
    q->scale = calloc((size_t)n, sizeof *q->scale);
    q->A = calloc((size_t)n, sizeof *q->A);
    q->B = calloc((size_t)n, sizeof *q->B);
    if (!q->rank || !q->scale || !q->A || !q->B) goto nomem;
    const lp_train_config *c = &m->cfg;
    for (int l = 0; l < c->n_layers; l++)
        for (int p = 0; p < LP_PROJ_COUNT; p++) {
            const float *A = m->w.layers[l].lora_a[p], *B = m->w.layers[l].lora_b[p];
            int w = lp_llama_weight_id(l, (lp_proj)p);
            if (!A || w >= n) continue;
            size_t in = (size_t)base->weights[w].w->cols, out = (size_t)base->weights[w].w->rows, r = (size_t)c->lora_rank;
            q->rank[w] = c->lora_rank;
            q->scale[w] = c->lora_alpha / (float)c->lora_rank;
            q->A[w] = lp_alloc(r * in * sizeof(float));
            q->B[w] = lp_alloc(out * r * sizeof(float));
            if (!q->A[w] || !q->B[w]) goto nomem;
            memcpy(q->A[w], A, r * in * sizeof(float));
            memcpy(q->B[w], B, out * r * sizeof(float));
        }
    return 0;
nomem:
    lp_quad_lora_free(q);
    return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
}

static bool file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* One batch of the first B records (fewer if the data has fewer). */
static int records_batch(lp_train_batch_buf *bb, const lp_train_data *d, int B, int T, lp_error *err) {
    int n = d->n_ex < B ? d->n_ex : B;
    if (n <= 0) return lp_fail(err, "no records");
    if (lp_train_batch_alloc(bb, n, T, err) < 0) return -1;
    for (int r = 0; r < n; r++) lp_train_batch_set_example(bb, r, &d->ex[r]);
    return 0;
}

/* ---- quad profile ------------------------------------------------------------------------ */

typedef struct named_adapter {
    char name[128];
    const char *path;
    lp_adapter *a;
    lp_quad_lora fp;
    lp_quad_acts acts;
    double qss;
} named_adapter;

static int parse_adapters(const char *list, named_adapter *out, int *n) {
    *n = 0;
    const char *s = list;
    while (*s) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        const char *eq = memchr(s, '=', len);
        if (!eq || eq == s || *n == QUAD_MAX_ADAPTERS || (size_t)(eq - s) >= sizeof out[0].name) {
            fprintf(stderr, "loraplex quad profile: --adapters wants name=path,... (at most %d)\n", QUAD_MAX_ADAPTERS);
            return -1;
        }
        named_adapter *a = &out[(*n)++];
        memset(a, 0, sizeof *a);
        snprintf(a->name, sizeof a->name, "%.*s", (int)(eq - s), s);
        char *path = malloc(len - (size_t)(eq - s));
        if (!path) return -1;
        snprintf(path, len - (size_t)(eq - s), "%.*s", (int)(len - (size_t)(eq - s) - 1), eq + 1);
        a->path = path;
        s += len + (comma ? 1 : 0);
    }
    return *n > 0 ? 0 : -1;
}

/* QSS of one adapter (its own PTQ encodings) and its activation ranges. */
static int sense_adapter(named_adapter *na, const lp_model *base, const char *calib_dir, int calib_n, int T, int bits,
                         int gran, int n_bins, lp_threadpool *pool, lp_error *err) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.train.jsonl", calib_dir, na->name);
    if (!file_exists(path)) snprintf(path, sizeof path, "%s/%s.eval.jsonl", calib_dir, na->name);
    lp_train_data d = {0};
    if (lp_train_data_load_jsonl(&d, path, base->tok, err) < 0) return -1;
    lp_train_batch_buf bb = {0};
    lp_train_model *m = NULL;
    lp_train_quad *q = NULL;
    lp_lpq own = {0};
    int rc = -1;
    if (records_batch(&bb, &d, calib_n, T, err) < 0) goto done;
    if (!(m = trainer_for(base, na->a, 0, bb.batch.B, T, pool, err)) || !(q = lp_train_quad_create(m, err)) ||
        lp_quad_acts_init(&na->acts, base->n_weights, n_bins, err))
        goto done;
    /* the FP32 branch's ranges on the calibration prompts, then (n_bins) a
     * second pass for the histograms over those ranges */
    lp_train_quad_observe(q, true);
    m->quad = q;
    if (isnan(lp_train_forward(m, &bb.batch, err))) goto done;
    if (n_bins && (lp_train_quad_histogram(q, true, err) || isnan(lp_train_forward(m, &bb.batch, err)))) goto done;
    m->quad = NULL;
    for (int w = 0; w < base->n_weights && w < m->cfg.n_layers * LP_PROJ_COUNT; w++) {
        lp_train_quad_ranges(q, w, &na->acts.x_lo[w], &na->acts.x_hi[w], &na->acts.t_lo[w], &na->acts.t_hi[w]);
        const double *h = n_bins ? lp_train_quad_hist(q, w) : NULL;
        if (!h) continue;
        memcpy(na->acts.x_hist + (size_t)w * n_bins, h, (size_t)n_bins * sizeof *h);
        memcpy(na->acts.t_hist + (size_t)w * n_bins, h + n_bins, (size_t)n_bins * sizeof *h);
    }
    const lp_quad_lora *one = &na->fp;
    if (lp_quad_build_profile(base, &one, 1, &na->acts, bits, gran, LP_LPQ_ANCHOR, na->name, &own, err) ||
        lp_quad_qss(m, &bb.batch, &own, &na->qss, err))
        goto done;
    fprintf(stderr, "%-14s QSS %.6f  (%d calibration records from %s)\n", na->name, na->qss, bb.batch.B, path);
    rc = 0;
done:
    lp_lpq_release(&own);
    lp_train_quad_free(q);
    lp_train_model_free(m);
    lp_train_batch_free(&bb);
    lp_train_data_free(&d);
    return rc;
}

static int by_qss(const void *x, const void *y) {
    const named_adapter *const *a = x, *const *b = y;
    return ((*a)->qss < (*b)->qss) - ((*a)->qss > (*b)->qss);
}

static int do_profile(int argc, char **argv) {
    const char *base_path = NULL, *list = NULL, *calib = NULL, *out = NULL, *aimet = NULL, *strategy = "auto",
               *gran_s = "channel", *act_calib = "mse";
    long bits = 8, calib_n = 16, seq = 128, threads = 0;
    double factor = 1.5;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char **str = !strcmp(a, "--base") || !strcmp(a, "-m") ? &base_path
                           : !strcmp(a, "--adapters")                ? &list
                           : !strcmp(a, "--calib")                   ? &calib
                           : !strcmp(a, "-o")                        ? &out
                           : !strcmp(a, "--export-encodings")        ? &aimet
                           : !strcmp(a, "--strategy")                ? &strategy
                           : !strcmp(a, "--granularity")             ? &gran_s
                           : !strcmp(a, "--act-calib")               ? &act_calib
                                                                     : NULL;
        long *num = !strcmp(a, "--bits") ? &bits : !strcmp(a, "--calib-n") ? &calib_n : !strcmp(a, "--seq") ? &seq
                    : !strcmp(a, "--threads") ? &threads : NULL;
        const char *v = (str || num || !strcmp(a, "--anchor-factor")) ? cli_value(argc, argv, &i) : NULL;
        if (str && v) *str = v;
        else if (num && v) {
            if (!cli_int(a, v, 0, 1 << 20, num)) return 2;
        } else if (!strcmp(a, "--anchor-factor") && v) {
            if (!cli_float(a, v, 1.0, 1e9, &factor)) return 2;
        } else {
            if (!v) fprintf(stderr, "loraplex quad profile: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    int gran = !strcmp(gran_s, "tensor") ? LP_LPQ_PER_TENSOR : !strcmp(gran_s, "channel") ? LP_LPQ_PER_CHANNEL : -1;
    int n_bins = !strcmp(act_calib, "mse") ? LP_QUAD_HIST_BINS : !strcmp(act_calib, "minmax") ? 0 : -1;
    if (!base_path || !list || !calib || !out || (bits != 8 && bits != 4) || gran < 0 || calib_n < 1 || n_bins < 0 ||
        (strcmp(strategy, "auto") && strcmp(strategy, "anchor") && strcmp(strategy, "fallback"))) {
        quad_usage(stderr);
        return 2;
    }
    named_adapter *ads = calloc(QUAD_MAX_ADAPTERS, sizeof *ads);
    int n = 0, rc = 1;
    lp_error err;
    lp_threadpool *pool = NULL;
    lp_lpq shared = {0};
    lp_model *base = lp_model_load(base_path, NULL, &err);
    if (!base) {
        free(ads);
        return cli_fail(base_path, &err);
    }
    if (!ads || parse_adapters(list, ads, &n) < 0) goto done;
    if (!(pool = lp_threadpool_create(threads > 0 ? (int)threads : lp_default_threads(), &err))) {
        cli_fail("threads", &err);
        goto done;
    }
    double t0 = lp_now_seconds();
    fprintf(stderr, "QSS: %ld-bit weights per %s, 8-bit static activations (%s ranges), f32 base %s\n", bits,
            gran ? "channel" : "tensor", n_bins ? "least-squared-error clipped" : "min / max", base_path);
    for (int i = 0; i < n; i++) {
        named_adapter *na = &ads[i];
        if (!(na->a = lp_adapter_load(base, na->path, 1.0f, &err)) || lp_quad_lora_from_adapter(&na->fp, na->a, &err) ||
            sense_adapter(na, base, calib, (int)calib_n, (int)seq, (int)bits, gran, n_bins, pool, &err)) {
            cli_fail(na->path, &err);
            goto done;
        }
    }
    named_adapter *rank[QUAD_MAX_ADAPTERS];
    for (int i = 0; i < n; i++) rank[i] = &ads[i];
    qsort(rank, (size_t)n, sizeof rank[0], by_qss);
    printf("rank  adapter         QSS (mean JS, nats)\n");
    for (int i = 0; i < n; i++) printf("%-5d %-15s %.6f\n", i + 1, rank[i]->name, rank[i]->qss);
    double ratio = n > 1 && rank[1]->qss > 0 ? rank[0]->qss / rank[1]->qss : INFINITY;
    bool anchor = !strcmp(strategy, "anchor") || (!strcmp(strategy, "auto") && ratio >= factor);
    printf("rule: anchor if the top QSS >= %.2f x the runner-up; top/runner-up = %.3f -> %s%s\n", factor, ratio,
           anchor ? "anchor " : "fallback (no adapter stands out: encodings from all adapters together)",
           anchor ? rank[0]->name : "");
    if (strcmp(strategy, "auto")) printf("(strategy forced by --strategy %s)\n", strategy);
    const lp_quad_lora *fps[QUAD_MAX_ADAPTERS];
    lp_quad_acts acts;
    if (lp_quad_acts_init(&acts, base->n_weights, n_bins, &err)) {
        cli_fail("profile", &err);
        goto done;
    }
    int nf = anchor ? 1 : n;
    for (int i = 0; i < nf; i++) {
        fps[i] = &rank[i]->fp;
        lp_quad_acts_union(&acts, &rank[i]->acts);
    }
    int brc = lp_quad_build_profile(base, fps, nf, &acts, (int)bits, gran, anchor ? LP_LPQ_ANCHOR : LP_LPQ_FALLBACK,
                                    anchor ? rank[0]->name : "", &shared, &err);
    lp_quad_acts_free(&acts);
    if (brc || lp_lpq_write(out, &shared, &err) || (aimet && lp_quad_export_aimet(&shared, aimet, &err))) {
        cli_fail(out, &err);
        goto done;
    }
    printf("profile %016llx: %u tensors, %ld-bit, per %s, %s -> %s (%.1f s)\n", (unsigned long long)shared.id,
           shared.n_entries, bits, gran ? "channel" : "tensor", anchor ? "anchor" : "fallback", out,
           lp_now_seconds() - t0);
    if (aimet) printf("AIMET encodings -> %s\n", aimet);
    rc = 0;
done:
    lp_lpq_release(&shared);
    for (int i = 0; ads && i < n; i++) {
        lp_quad_lora_free(&ads[i].fp);
        lp_quad_acts_free(&ads[i].acts);
        lp_adapter_free(ads[i].a);
        free((void *)ads[i].path);
    }
    free(ads);
    lp_threadpool_destroy(pool);
    lp_model_free(base);
    return rc;
}

/* ---- quad fit ------------------------------------------------------------------------------ */

/* Teacher next-token probabilities of the batch (all positions). */
static int teacher_probs(lp_train_model *t, const lp_train_batch *b, float *probs, lp_error *err) {
    if (isnan(lp_train_forward(t, b, err))) return -1;
    int V = t->cfg.n_vocab, N = b->B * b->T;
    for (int n = 0; n < N; n++) {
        const float *z = lp_train_logits(t, n);
        float *p = probs + (size_t)n * V, max = z[0];
        for (int v = 1; v < V; v++) max = z[v] > max ? z[v] : max;
        double sum = 0;
        for (int v = 0; v < V; v++) sum += exp((double)z[v] - max);
        for (int v = 0; v < V; v++) p[v] = (float)(exp((double)z[v] - max) / sum);
    }
    return 0;
}

/* KL(teacher || student) and CE of the student (under the profile) on a batch. */
static int kd_eval(lp_train_model *t, lp_train_model *s, lp_train_quad *q, lp_train_batch *b, float *probs,
                   float *keep, double *kl, double *ce, lp_error *err) {
    if (teacher_probs(t, b, probs, err) || lp_train_quad_begin(q, s, keep, err)) return -1;
    b->teacher = probs;
    b->kd_weight = 1.0f;
    double l1 = lp_train_forward(s, b, err);
    *kl = lp_train_last_kl(s);
    b->kd_weight = 0.0f;
    double l0 = lp_train_forward(s, b, err);
    lp_train_restore_lora(s, keep);
    b->teacher = NULL;
    *ce = l0;
    return isnan(l1) || isnan(l0) ? -1 : 0;
}

/* Mean KL and CE over every held-out record, a batch buffer's rows at a
 * time (each chunk weighted by its records). */
static int held_eval(lp_train_model *t, lp_train_model *s, lp_train_quad *q, lp_train_batch_buf *eb,
                     const lp_train_data *held, float *probs, float *keep, double *kl, double *ce, lp_error *err) {
    int rows = eb->batch.B;
    double skl = 0, sce = 0;
    for (int at = 0; at < held->n_ex; at += rows) {
        int n = held->n_ex - at < rows ? held->n_ex - at : rows;
        for (int r = 0; r < n; r++) lp_train_batch_set_example(eb, r, &held->ex[at + r]);
        eb->batch.B = n;
        double k, c;
        int rc = kd_eval(t, s, q, &eb->batch, probs, keep, &k, &c, err);
        eb->batch.B = rows;
        if (rc) return -1;
        skl += k * n;
        sce += c * n;
    }
    *kl = skl / held->n_ex;
    *ce = sce / held->n_ex;
    return 0;
}

static int do_fit(int argc, char **argv) {
    const char *base_path = NULL, *deploy_path = NULL, *prof_path = NULL, *ad_path = NULL, *data = NULL,
               *eval_path = NULL, *out = NULL, *acts_s = NULL, *select = "best";
    long steps = 100, seed = 1, batch = 8, seq = 128, eval_every = 25, threads = 0, holdout = 32;
    double lr = 2e-4, kd = 0.5;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char **str = !strcmp(a, "--base") || !strcmp(a, "-m") ? &base_path
                           : !strcmp(a, "--deploy")                  ? &deploy_path
                           : !strcmp(a, "--profile")                 ? &prof_path
                           : !strcmp(a, "--adapter")                 ? &ad_path
                           : !strcmp(a, "--data")                    ? &data
                           : !strcmp(a, "--eval")                    ? &eval_path
                           : !strcmp(a, "--student-acts")            ? &acts_s
                           : !strcmp(a, "--select")                  ? &select
                           : !strcmp(a, "-o")                        ? &out
                                                                     : NULL;
        long *num = !strcmp(a, "--steps") ? &steps : !strcmp(a, "--seed") ? &seed : !strcmp(a, "--batch") ? &batch
                    : !strcmp(a, "--seq") ? &seq : !strcmp(a, "--eval-every") ? &eval_every
                    : !strcmp(a, "--threads") ? &threads : !strcmp(a, "--holdout") ? &holdout : NULL;
        double *fl = !strcmp(a, "--lr") ? &lr : !strcmp(a, "--kd-weight") ? &kd : NULL;
        const char *v = (str || num || fl) ? cli_value(argc, argv, &i) : NULL;
        if (str && v) *str = v;
        else if (num && v) {
            if (!cli_int(a, v, 0, 1 << 24, num)) return 2;
        } else if (fl && v) {
            if (!cli_float(a, v, 0.0, 1.0, fl)) return 2;
        } else {
            if (!v) fprintf(stderr, "loraplex quad fit: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    if (!acts_s) acts_s = deploy_path ? "q8" : "f32";
    bool keep_best = !strcmp(select, "best");
    if (!base_path || !prof_path || !ad_path || !data || !out || batch < 1 || seq < 2 || holdout < 1 ||
        (strcmp(acts_s, "q8") && strcmp(acts_s, "f32")) || (!keep_best && strcmp(select, "last"))) {
        quad_usage(stderr);
        return 2;
    }
    lp_error err;
    int rc = 1;
    lp_model *base = NULL, *deploy = NULL;
    lp_adapter *a = NULL; /* on the f32 base; its weights seed the student on either base */
    lp_lpq prof = {0};
    lp_threadpool *pool = NULL;
    lp_train_model *teacher = NULL, *student = NULL;
    lp_train_quad *q = NULL;
    lp_adamw opt = {0};
    lp_train_data train = {0}, eval = {0};
    lp_train_batch_buf bb = {0}, eb = {0};
    float *probs = NULL, *keep = NULL, *best = NULL;
    lp_quad_lora fp = {0};
    if (!(base = lp_model_load(base_path, NULL, &err)) ||
        (deploy_path && !(deploy = lp_model_load(deploy_path, NULL, &err))) ||
        !(a = lp_adapter_load(base, ad_path, 1.0f, &err)) ||
        lp_lpq_read(prof_path, &prof, &err) ||
        !(pool = lp_threadpool_create(threads > 0 ? (int)threads : lp_default_threads(), &err)) ||
        lp_train_data_load_jsonl(&train, data, base->tok, &err) < 0 ||
        (eval_path && lp_train_data_load_jsonl(&eval, eval_path, base->tok, &err) < 0)) {
        cli_fail("quad fit", &err);
        goto done;
    }
    /* fit: the records trained on; held: the held-out ones (views, not owned) */
    lp_train_data fit = train, held = eval;
    if (!eval_path) {
        if (train.n_ex <= holdout) {
            fprintf(stderr, "loraplex quad fit: %s: %d records, not more than --holdout %ld\n", data, train.n_ex,
                    holdout);
            goto done;
        }
        fit.n_ex = train.n_ex - (int)holdout;
        held = (lp_train_data){.ex = train.ex + fit.n_ex, .n_ex = (int)holdout};
    } else if (eval.n_ex > holdout) {
        held.n_ex = (int)holdout;
    }
    if (held.n_ex < 1 || fit.n_ex < 1) {
        fprintf(stderr, "loraplex quad fit: no %s records in %s\n", fit.n_ex < 1 ? "training" : "held-out",
                fit.n_ex < 1 ? data : eval_path);
        goto done;
    }
    const lp_model *dep = deploy ? deploy : base;
    if (!(teacher = trainer_for(base, a, 0, (int)batch, (int)seq, pool, &err)) ||
        !(student = trainer_for(dep, a, LP_TRAIN_LORA, (int)batch, (int)seq, pool, &err)) ||
        !(q = lp_train_quad_create(student, &err)) || lp_train_quad_set_profile(q, student, &prof, &err)) {
        cli_fail("quad fit", &err);
        goto done;
    }
    lp_train_quad_base_act_q8(q, !strcmp(acts_s, "q8"));
    student->quad = q;
    lp_adamw_config ac = lp_adamw_default();
    ac.lr = (float)lr;
    ac.min_lr = (float)lr / 10;
    ac.warmup = steps >= 20 ? 10 : 0;
    ac.total_steps = (int)(steps > 0 ? steps : 1);
    ac.weight_decay = 0.0f;
    size_t V = (size_t)base->hp.n_vocab;
    probs = lp_alloc((size_t)batch * (size_t)seq * V * sizeof(float));
    int gi = lp_train_group_index(LP_TRAIN_LORA);
    size_t lora_bytes = student->group_size[gi] * sizeof(float);
    keep = lp_alloc(lora_bytes);
    best = lp_alloc(lora_bytes);
    if (!probs || !keep || !best || lp_adamw_init(&opt, student, &ac, &err) < 0 ||
        lp_train_batch_alloc(&bb, (int)batch, (int)seq, &err) < 0 ||
        records_batch(&eb, &held, (int)batch, (int)seq, &err) < 0) {
        if (!probs || !keep || !best) lp_error_set(&err, LP_ERR_NOMEM, "out of memory");
        cli_fail("quad fit", &err);
        goto done;
    }
    fprintf(stderr, "quad fit: %s under profile %016llx (%u-bit, per %s), teacher f32 %s + FP32 adapter, student %s "
            "(%s inputs) + adapter under the profile; loss = %.2f CE + %.2f KL; %ld steps of %ld x %ld, lr %g, seed %ld\n",
            ad_path, (unsigned long long)prof.id, prof.weight_bits, prof.granularity ? "channel" : "tensor", base_path,
            deploy_path ? deploy_path : base_path, acts_s, 1.0 - kd, kd, steps, batch, seq, lr, seed);
    double kl0, ce0;
    if (held_eval(teacher, student, q, &eb, &held, probs, keep, &kl0, &ce0, &err)) {
        cli_fail("quad fit", &err);
        goto done;
    }
    double best_loss = (1 - kd) * ce0 + kd * kl0;
    long best_step = 0;
    memcpy(best, student->group[gi], lora_bytes);
    fprintf(stderr, "eval step 0: KL %.5f | CE %.4f | loss %.5f (%d held-out records of %s; %d trained on)\n", kl0,
            ce0, best_loss, held.n_ex, eval_path ? eval_path : data, fit.n_ex);
    lp_rng rng;
    lp_rng_seed(&rng, (uint64_t)seed);
    double t0 = lp_now_seconds();
    for (long step = 0; step < steps; step++) {
        if (lp_train_batch_sample(&bb, &fit, &rng, &err) < 0 || teacher_probs(teacher, &bb.batch, probs, &err) ||
            lp_train_quad_begin(q, student, keep, &err)) {
            cli_fail("quad fit", &err);
            goto done;
        }
        bb.batch.teacher = probs;
        bb.batch.kd_weight = (float)kd;
        double loss = lp_train_forward(student, &bb.batch, &err);
        if (isnan(loss)) {
            lp_train_restore_lora(student, keep);
            cli_fail("quad fit", &err);
            goto done;
        }
        double kl = lp_train_last_kl(student);
        lp_train_zero_grad(student);
        lp_train_backward(student, &bb.batch);
        lp_train_restore_lora(student, keep); /* the gradient at the quantized point updates the FP32 weights */
        float cur = lp_train_lr(&opt.cfg, opt.step);
        lp_adamw_step(&opt, student);
        double el = lp_now_seconds() - t0;
        fprintf(stderr, "step %ld/%ld | loss %.4f | KL %.5f | lr %.2e | %.1f s\n", step + 1, steps, loss, kl, cur, el);
        if (eval_every > 0 && ((step + 1) % eval_every == 0 || step + 1 == steps)) {
            double kle, cee;
            if (held_eval(teacher, student, q, &eb, &held, probs, keep, &kle, &cee, &err)) {
                cli_fail("quad fit", &err);
                goto done;
            }
            double le = (1 - kd) * cee + kd * kle;
            bool better = le < best_loss;
            if (better) {
                best_loss = le;
                best_step = step + 1;
                memcpy(best, student->group[gi], lora_bytes);
            }
            fprintf(stderr, "eval step %ld: KL %.5f | CE %.4f | loss %.5f%s\n", step + 1, kle, cee, le,
                    better ? " (best)" : "");
        }
    }
    if (keep_best) {
        memcpy(student->group[gi], best, lora_bytes);
        fprintf(stderr, "kept step %ld (lowest held-out loss %.5f)\n", best_step, best_loss);
    }
    if (lora_of_trainer(student, dep, a->name, &fp, &err) || lp_quad_write_adapter(out, dep, &prof, &fp, &err)) {
        cli_fail(out, &err);
        goto done;
    }
    fprintf(stderr, "wrote %s (codes under profile %016llx, for %s) in %.1f s\n", out, (unsigned long long)prof.id,
            dep->path, lp_now_seconds() - t0);
    rc = 0;
done:
    lp_quad_lora_free(&fp);
    lp_free(probs);
    lp_free(keep);
    lp_free(best);
    lp_train_batch_free(&bb);
    lp_train_batch_free(&eb);
    lp_train_data_free(&train);
    lp_train_data_free(&eval);
    lp_adamw_free(&opt);
    lp_train_quad_free(q);
    lp_train_model_free(teacher);
    lp_train_model_free(student);
    lp_threadpool_destroy(pool);
    lp_lpq_release(&prof);
    lp_adapter_free(a);
    lp_model_free(deploy);
    lp_model_free(base);
    return rc;
}

/* ---- quad ptq / export ------------------------------------------------------------------------ */

/* An adapter's codes under a profile as they are (shared profile, no KD). */
static int do_ptq(int argc, char **argv) {
    const char *base_path = NULL, *prof_path = NULL, *ad_path = NULL, *out = NULL;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char **str = !strcmp(a, "--base") || !strcmp(a, "-m") ? &base_path : !strcmp(a, "--profile") ? &prof_path
                           : !strcmp(a, "--adapter") ? &ad_path : !strcmp(a, "-o") ? &out : NULL;
        const char *v = str ? cli_value(argc, argv, &i) : NULL;
        if (!v) {
            if (!str) fprintf(stderr, "loraplex quad ptq: unexpected argument '%s'\n", a);
            return 2;
        }
        *str = v;
    }
    if (!base_path || !prof_path || !ad_path || !out) {
        quad_usage(stderr);
        return 2;
    }
    lp_error err;
    lp_lpq prof = {0};
    lp_quad_lora fp = {0};
    lp_adapter *a = NULL;
    lp_model *base = lp_model_load(base_path, NULL, &err);
    int rc = 1;
    if (base && (a = lp_adapter_load(base, ad_path, 1.0f, &err)) && lp_lpq_read(prof_path, &prof, &err) == 0 &&
        lp_quad_lora_from_adapter(&fp, a, &err) == 0 && lp_quad_write_adapter(out, base, &prof, &fp, &err) == 0) {
        fprintf(stderr, "wrote %s (codes under profile %016llx)\n", out, (unsigned long long)prof.id);
        rc = 0;
    } else {
        cli_fail("quad ptq", &err);
    }
    lp_quad_lora_free(&fp);
    lp_lpq_release(&prof);
    lp_adapter_free(a);
    lp_model_free(base);
    return rc;
}

static int do_export(int argc, char **argv) {
    const char *prof_path = NULL, *out = NULL;
    for (int i = 2; i < argc; i++) {
        const char **str = !strcmp(argv[i], "--profile") ? &prof_path : !strcmp(argv[i], "--export-encodings") ? &out : NULL;
        const char *v = str ? cli_value(argc, argv, &i) : NULL;
        if (!v) {
            if (!str) fprintf(stderr, "loraplex quad export: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
        *str = v;
    }
    if (!prof_path || !out) {
        quad_usage(stderr);
        return 2;
    }
    lp_error err;
    lp_lpq prof;
    if (lp_lpq_read(prof_path, &prof, &err)) return cli_fail(prof_path, &err);
    int rc = lp_quad_export_aimet(&prof, out, &err) ? cli_fail(out, &err) : 0;
    lp_lpq_release(&prof);
    return rc;
}

int cli_quad(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        quad_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "profile")) return do_profile(argc, argv);
    if (!strcmp(argv[1], "fit")) return do_fit(argc, argv);
    if (!strcmp(argv[1], "ptq")) return do_ptq(argc, argv);
    if (!strcmp(argv[1], "export")) return do_export(argc, argv);
    fprintf(stderr, "loraplex quad: unknown subcommand '%s'\n", argv[1]);
    quad_usage(stderr);
    return 2;
}
