/* The trainer: finite-difference gradient checks of every parameter group
 * (through GQA, LoRA, extra embeddings, a loss mask and a tree mask), an
 * overfit test, frozen-base and resume determinism, export round trips
 * through the runtime, and checkpoint validation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "runtime/context.h"
#include "tools/adapter_write.h"
#include "tools/compile.h"
#include "train/train.h"
#include "train/train_internal.h"
#include "arch/llama.h"

/* The pair of layer l's projection p, or an empty one (rank 0). */
static const lp_lora_pair *pair_of(const lp_adapter *a, int l, lp_proj p) {
    static const lp_lora_pair none = {.weight = -1};
    const lp_lora_pair *x = lp_llama_pair(a, l, p);
    return x ? x : &none;
}


static lp_train_config tiny_config(bool tied) {
    lp_train_config c = {
        .n_vocab = 11, .dim = 8, .n_layers = 2, .n_heads = 2, .n_kv_heads = 1, .head_dim = 4,
        .ffn_dim = 16, .n_ctx = 32, .rope_theta = 10000.0f, .rms_eps = 1e-5f,
        .tied_output = tied, .n_extra = 2, .lora_rank = 2, .lora_alpha = 3.0f,
        .lora_targets = (1u << LP_PROJ_COUNT) - 1,
    };
    return c;
}

/* Random everything (LoRA B too: at its zero init, A would get no gradient). */
static void randomize(lp_train_model *m, uint64_t seed, float std) {
    lp_rng rng;
    lp_rng_seed(&rng, seed);
    for (int g = 0; g < 3; g++)
        for (size_t i = 0; m->group[g] && i < m->group_size[g]; i++)
            m->group[g][i] = std * lp_rng_normal(&rng);
    /* norm gains around 1 */
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].cols == 1)
            for (size_t k = 0; k < m->params[i].size; k++)
                m->group[0][m->params[i].offset + k] += 1.0f;
}

/* Two sequences of T = 5: the first causal-like but with a tree (position 3
 * doesn't see 2; 4 sees 0,1,3,4), positions given explicitly; ids include
 * extra rows; a mask with zeros. */
enum { GB = 2, GT = 5 };
static const int32_t g_inputs[GB * GT] = {1, 5, 11, 3, 12, 2, 7, 7, 9, 4};
static const int32_t g_targets[GB * GT] = {5, 3, 3, 8, 1, 7, 7, 9, 4, 10};
static const float g_mask[GB * GT] = {1, 0, 1, 1, 1, 0, 1, 1, 1, 1};
static const int32_t g_pos[GB * GT] = {0, 1, 2, 2, 3, 0, 1, 2, 3, 4};

static void tree_visible(uint8_t *vis) {
    memset(vis, 0, (size_t)GB * GT * GT);
    for (int b = 0; b < GB; b++)
        for (int i = 0; i < GT; i++)
            for (int j = 0; j <= i; j++) vis[(b * GT + i) * GT + j] = 1;
    /* sequence 0: rows 2 and 3 are siblings; row 4 is a child of 3 */
    vis[(0 * GT + 3) * GT + 2] = 0;
    vis[(0 * GT + 4) * GT + 2] = 0;
}

static double loss_of(lp_train_model *m, const lp_train_batch *b) {
    lp_error err;
    double l = lp_train_forward(m, b, &err);
    if (isnan(l)) fprintf(stderr, "forward: %s\n", err.message);
    return l;
}

/* Central difference of the loss along dir (unit norm) with Richardson
 * extrapolation (steps h and h/2), which cancels the O(h²) term so h can
 * stay large enough for float32 rounding not to matter. */



#define GC_H 1e-2f
static double numeric_derivative(lp_train_model *m, const lp_train_batch *b, float *p,
                                 const float *dir, size_t n) {
    float *saved = malloc(n * sizeof(float));
    memcpy(saved, p, n * sizeof(float));
    double d[2];
    for (int s = 0; s < 2; s++) {
        float h = s == 0 ? GC_H : GC_H / 2;
        for (size_t k = 0; k < n; k++) p[k] = saved[k] + h * dir[k];
        double lp = loss_of(m, b);
        for (size_t k = 0; k < n; k++) p[k] = saved[k] - h * dir[k];
        double lm = loss_of(m, b);
        d[s] = (lp - lm) / (2.0 * h);
    }
    memcpy(p, saved, n * sizeof(float));
    free(saved);
    return (4.0 * d[1] - d[0]) / 3.0;
}

static double rel_error(double a, double b) {
    return fabs(a - b) / fmax(fmax(fabs(a), fabs(b)), 1e-2);
}

/* Checks d loss / d tensor along a random unit direction and at the entry
 * of largest gradient. */
static double worst_rel;
static void gradcheck_tensor(lp_train_model *m, const lp_train_batch *b, const lp_tparam *t,
                             const char *label) {
    int g = lp_train_group_index(t->group);
    float *p = m->group[g] + t->offset;
    const float *grad = m->grad[g] + t->offset;
    lp_rng rng;
    lp_rng_seed(&rng, t->offset + 17);
    float *dir = calloc(t->size, sizeof(float));
    double analytic = 0, gmax = -1;
    size_t imax = 0;
    float unit = 1.0f / sqrtf((float)t->size);
    for (size_t k = 0; k < t->size; k++) {
        dir[k] = lp_rng_uniform(&rng) < 0.5f ? -unit : unit;
        analytic += (double)dir[k] * grad[k];
        if (fabs(grad[k]) > gmax) gmax = fabs(grad[k]), imax = k;
    }
    double numeric = numeric_derivative(m, b, p, dir, t->size);
    double rel = rel_error(numeric, analytic);
    if (rel > worst_rel) worst_rel = rel;
    CHECK_MSG(rel < 3e-3, "%s %s: direction: analytic %.8g numeric %.8g (rel %.3g)", label,
              t->name, analytic, numeric, rel);
    float one = 1.0f;
    numeric = numeric_derivative(m, b, p + imax, &one, 1);
    rel = rel_error(numeric, grad[imax]);
    if (rel > worst_rel) worst_rel = rel;
    CHECK_MSG(rel < 3e-3, "%s %s[%zu]: analytic %.8g numeric %.8g (rel %.3g)", label, t->name,
              imax, (double)grad[imax], numeric, rel);
    free(dir);
}

static void test_gradients(bool tied, bool tree, lp_threadpool *pool) {
    lp_error err;
    lp_train_config c = tiny_config(tied);
    lp_train_model *m =
        lp_train_model_create(&c, LP_TRAIN_BASE | LP_TRAIN_LORA | LP_TRAIN_EXTRA, &err);
    CHECK_MSG(m != NULL, "%s", err.message);
    if (!m) return;
    CHECK(lp_train_model_reserve(m, GB, GT, &err) == 0);
    lp_train_model_set_pool(m, pool);
    randomize(m, 42, 0.2f);
    uint8_t vis[GB * GT * GT];
    tree_visible(vis);
    lp_train_batch b = {.B = GB, .T = GT, .inputs = g_inputs, .targets = g_targets,
                        .mask = g_mask, .pos = tree ? g_pos : NULL, .visible = tree ? vis : NULL};
    double loss = loss_of(m, &b);
    CHECK(isfinite(loss) && loss > 0);
    lp_train_zero_grad(m);
    lp_train_backward(m, &b);
    char label[64];
    snprintf(label, sizeof label, "%s%s", tied ? "tied" : "untied", tree ? "+tree" : "");
    for (int i = 0; i < m->n_params; i++) gradcheck_tensor(m, &b, &m->params[i], label);
    lp_train_model_free(m);
}


/* ---- training behaviour --------------------------------------------------------- */

/* A token stream 0..n_vocab-1 repeating with a twist, as training data. */
static void make_stream(lp_train_data *d, int n_vocab, size_t n) {
    memset(d, 0, sizeof *d);
    d->stream = malloc(n * sizeof *d->stream);
    d->n_stream = n;
    for (size_t i = 0; i < n; i++) d->stream[i] = (int32_t)((i * 3 + i / 7) % (size_t)n_vocab);
}

static lp_adamw_config test_adamw(float lr, int steps) {
    lp_adamw_config a = lp_adamw_default();
    a.lr = lr;
    a.min_lr = lr / 10;
    a.warmup = 5;
    a.total_steps = steps;
    return a;
}

/* Runs `steps` optimizer steps on batches sampled from d. Returns the last loss. */
static double train_steps(lp_train_model *m, lp_adamw *opt, lp_train_batch_buf *bb,
                          const lp_train_data *d, lp_rng *rng, int steps) {
    lp_error err;
    double loss = NAN;
    for (int s = 0; s < steps; s++) {
        if (d) CHECK(lp_train_batch_sample(bb, d, rng, &err) == 0);
        loss = lp_train_forward(m, &bb->batch, &err);
        lp_train_zero_grad(m);
        lp_train_backward(m, &bb->batch);
        lp_adamw_step(opt, m);
    }
    return loss;
}

static void test_overfit(void) {
    lp_error err;
    lp_train_config c = tiny_config(false);
    c.n_extra = 0;
    c.lora_rank = 0;
    lp_train_model *m = lp_train_model_create(&c, LP_TRAIN_BASE, &err);
    CHECK(lp_train_model_reserve(m, GB, GT, &err) == 0);
    lp_train_model_init(m, LP_TRAIN_BASE, 1);
    lp_adamw opt;
    lp_adamw_config a = test_adamw(2e-2f, 300);
    a.weight_decay = 0;
    CHECK(lp_adamw_init(&opt, m, &a, &err) == 0);
    int32_t inputs[GB * GT];
    for (int i = 0; i < GB * GT; i++) inputs[i] = g_inputs[i] % c.n_vocab;
    lp_train_batch_buf bb = {.batch = {.B = GB, .T = GT, .inputs = inputs, .targets = g_targets,
                                       .mask = g_mask}};
    double first = lp_train_forward(m, &bb.batch, &err);
    double last = train_steps(m, &opt, &bb, NULL, NULL, 300);
    printf("overfit: loss %.4f -> %.4f after 300 steps\n", first, last);
    CHECK(first > 2.0);
    CHECK_MSG(last < 0.05, "loss %g", last);
    lp_adamw_free(&opt);
    lp_train_model_free(m);
}

/* LoRA training moves only A/B: the base buffer stays bit-identical. */
static void test_lora_frozen_base(void) {
    lp_error err;
    lp_train_config c = tiny_config(true);
    c.n_extra = 0;
    lp_train_model *m = lp_train_model_create(&c, LP_TRAIN_LORA, &err);
    CHECK(m->grad[0] == NULL && m->grad[1] != NULL);
    CHECK(lp_train_model_reserve(m, 4, 8, &err) == 0);
    lp_train_model_init(m, LP_TRAIN_BASE | LP_TRAIN_LORA, 3);
    size_t bytes = m->group_size[0] * sizeof(float);
    float *copy = malloc(bytes);
    memcpy(copy, m->group[0], bytes);
    lp_train_data d;
    make_stream(&d, c.n_vocab, 500);
    lp_train_batch_buf bb;
    CHECK(lp_train_batch_alloc(&bb, 4, 8, &err) == 0);
    lp_rng rng;
    lp_rng_seed(&rng, 5);
    CHECK(lp_train_batch_sample(&bb, &d, &rng, &err) == 0);
    double before = lp_train_forward(m, &bb.batch, &err);
    lp_adamw opt;
    lp_adamw_config a = test_adamw(1e-2f, 60);
    CHECK(lp_adamw_init(&opt, m, &a, &err) == 0);
    CHECK(opt.m[0] == NULL);
    train_steps(m, &opt, &bb, &d, &rng, 60);
    CHECK(lp_train_batch_sample(&bb, &d, &rng, &err) == 0);
    double after = lp_train_forward(m, &bb.batch, &err);
    printf("lora: loss %.4f -> %.4f, base unchanged: %s\n", before, after,
           memcmp(copy, m->group[0], bytes) == 0 ? "yes" : "NO");
    CHECK(memcmp(copy, m->group[0], bytes) == 0);
    CHECK(after < before);
    free(copy);
    lp_adamw_free(&opt);
    lp_train_batch_free(&bb);
    lp_train_data_free(&d);
    lp_train_model_free(m);
}

/* Extra-embedding mode: only E_extra changes. */
static void test_extra_only(void) {
    lp_error err;
    lp_train_config c = tiny_config(false);
    c.lora_rank = 0;
    lp_train_model *m = lp_train_model_create(&c, LP_TRAIN_EXTRA, &err);
    CHECK(m->trainable == LP_TRAIN_EXTRA);
    CHECK(lp_train_model_reserve(m, GB, GT, &err) == 0);
    lp_train_model_init(m, LP_TRAIN_BASE | LP_TRAIN_EXTRA, 9);
    size_t bytes = m->group_size[0] * sizeof(float);
    float *copy = malloc(bytes), *extra0 = malloc(m->group_size[2] * sizeof(float));
    memcpy(copy, m->group[0], bytes);
    memcpy(extra0, m->group[2], m->group_size[2] * sizeof(float));
    lp_adamw opt;
    lp_adamw_config a = test_adamw(1e-2f, 30);
    CHECK(lp_adamw_init(&opt, m, &a, &err) == 0);
    uint8_t vis[GB * GT * GT];
    tree_visible(vis);
    lp_train_batch_buf bb = {.batch = {.B = GB, .T = GT, .inputs = g_inputs, .targets = g_targets,
                                       .mask = g_mask, .pos = g_pos, .visible = vis}};
    double before = lp_train_forward(m, &bb.batch, &err);
    double after = train_steps(m, &opt, &bb, NULL, NULL, 30);
    CHECK(after < before);
    CHECK(memcmp(copy, m->group[0], bytes) == 0);
    CHECK(memcmp(extra0, m->group[2], m->group_size[2] * sizeof(float)) != 0);
    free(copy);
    free(extra0);
    lp_adamw_free(&opt);
    lp_train_model_free(m);
}


/* ---- checkpoint validation ------------------------------------------------------- */

static bool ckpt_rejected(const uint8_t *data, size_t size, const char *what) {
    lp_error err = {0};
    lp_train_model *m = NULL;
    lp_adamw opt;
    lp_rng rng;
    int rc = lp_checkpoint_load_memory(data, size, "bad.ckpt", &m, &opt, &rng, &err);
    if (rc == 0) {
        lp_adamw_free(&opt);
        lp_train_model_free(m);
        fprintf(stderr, "%s: accepted\n", what);
        return false;
    }
    return m == NULL && strstr(err.message, "bad.ckpt") != NULL;
}

static void test_bad_checkpoints(const char *path) {
    lp_mapped_file f;
    lp_error err;
    CHECK(lp_map_file(path, &f, &err) == 0);
    uint8_t *buf = malloc(f.size + 1);
    memcpy(buf, f.data, f.size);
    CHECK(ckpt_rejected(buf, 0, "empty"));
    CHECK(ckpt_rejected(buf, 40, "truncated header"));
    CHECK(ckpt_rejected(buf, f.size - 1, "truncated data"));
    buf[f.size] = 0;
    CHECK(ckpt_rejected(buf, f.size + 1, "trailing byte"));
    uint8_t *bad = malloc(f.size);
    /* magic, version, trainable, the 10 shape ints, tied, targets, beta1,
     * beta2, the 3 group counts: every flip makes the file inconsistent */
    size_t fields[] = {0, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 68, 72, 92, 96,
                       152, 160, 168};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        memcpy(bad, buf, f.size);
        uint32_t v;
        memcpy(&v, bad + fields[i], 4);
        v = v ^ 0x40000000u;   /* a huge or negative value */
        memcpy(bad + fields[i], &v, 4);
        char what[32];
        snprintf(what, sizeof what, "field at %zu", fields[i]);
        CHECK_MSG(ckpt_rejected(bad, f.size, what), "%s", what);
    }
    free(bad);
    free(buf);
    lp_unmap_file(&f);
}

/* N steps + checkpoint + M steps == N+M steps, bitwise; and 2 threads == 1. */
static void test_resume_and_threads(void) {
    lp_error err;
    lp_train_config c = tiny_config(false);
    lp_train_data d;
    make_stream(&d, c.n_vocab, 400);
    lp_adamw_config a = test_adamw(5e-3f, 10);
    lp_threadpool *pool = lp_threadpool_create(2, &err);
    lp_train_model *straight[2];
    for (int threaded = 0; threaded < 2; threaded++) {
        lp_train_model *m = lp_train_model_create(&c, LP_TRAIN_BASE | LP_TRAIN_LORA | LP_TRAIN_EXTRA, &err);
        CHECK(lp_train_model_reserve(m, 3, 6, &err) == 0);
        lp_train_model_set_pool(m, threaded ? pool : NULL);
        lp_train_model_init(m, LP_TRAIN_BASE | LP_TRAIN_LORA | LP_TRAIN_EXTRA, 11);
        lp_adamw opt;
        CHECK(lp_adamw_init(&opt, m, &a, &err) == 0);
        lp_train_batch_buf bb;
        CHECK(lp_train_batch_alloc(&bb, 3, 6, &err) == 0);
        lp_rng rng;
        lp_rng_seed(&rng, 77);
        train_steps(m, &opt, &bb, &d, &rng, 10);
        straight[threaded] = m;
        lp_adamw_free(&opt);
        lp_train_batch_free(&bb);
    }
    bool same = true;
    for (int g = 0; g < 3; g++)
        same = same && !memcmp(straight[0]->group[g], straight[1]->group[g],
                               straight[0]->group_size[g] * sizeof(float));
    CHECK_MSG(same, "2 threads give different parameters than 1");

    /* 6 steps, save, load, 4 more */
    char path[512];
    snprintf(path, sizeof path, "%s/test_train_ckpt.bin", LP_BINARY_DIR);
    lp_train_model *m = lp_train_model_create(&c, LP_TRAIN_BASE | LP_TRAIN_LORA | LP_TRAIN_EXTRA, &err);
    CHECK(lp_train_model_reserve(m, 3, 6, &err) == 0);
    lp_train_model_init(m, LP_TRAIN_BASE | LP_TRAIN_LORA | LP_TRAIN_EXTRA, 11);
    lp_adamw opt;
    CHECK(lp_adamw_init(&opt, m, &a, &err) == 0);
    lp_train_batch_buf bb;
    CHECK(lp_train_batch_alloc(&bb, 3, 6, &err) == 0);
    lp_rng rng;
    lp_rng_seed(&rng, 77);
    train_steps(m, &opt, &bb, &d, &rng, 6);
    CHECK_MSG(lp_checkpoint_save(path, m, &opt, &rng, &err) == 0, "%s", err.message);
    lp_adamw_free(&opt);
    lp_train_model_free(m);
    memset(&rng, 0, sizeof rng);
    CHECK_MSG(lp_checkpoint_load(path, &m, &opt, &rng, &err) == 0, "%s", err.message);
    if (m) {
        CHECK(opt.step == 6);
        CHECK(lp_train_model_reserve(m, 3, 6, &err) == 0);
        train_steps(m, &opt, &bb, &d, &rng, 4);
        same = true;
        for (int g = 0; g < 3; g++)
            same = same && !memcmp(m->group[g], straight[0]->group[g], m->group_size[g] * sizeof(float));
        CHECK_MSG(same, "resumed training differs from straight training");
        lp_adamw_free(&opt);
        lp_train_model_free(m);
    }
    test_bad_checkpoints(path);
    remove(path);
    lp_train_batch_free(&bb);
    lp_train_model_free(straight[0]);
    lp_train_model_free(straight[1]);
    lp_train_data_free(&d);
    lp_threadpool_destroy(pool);
}

/* ---- export: the runtime must compute what the trainer computes ------------------ */

static const char *vocab_path(void) { return LP_SHARED_MODELS "/stories260K.gguf"; }


/* A one-sequence inference context for T rows with logits, to compare with
 * the trainer's forward (f32 throughout, so the KV cache is f32 too). */
static lp_context *runtime_context(const lp_model *rt, int T, lp_error *err) {
    lp_context_params cp = lp_context_default_params();
    cp.n_threads = 1;
    cp.max_rows = T;
    cp.max_logit_rows = T;
    cp.max_sequences = 1;
    cp.n_ctx = 64;
    cp.kv_f32 = true;
    return lp_context_create(rt, &cp, err);
}
static void test_export_gguf(lp_threadpool *pool) {
    lp_error err;
    lp_train_config c = {
        .n_vocab = 512, .dim = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 8,
        .ffn_dim = 48, .n_ctx = 64, .rope_theta = 10000.0f, .rms_eps = 1e-5f,
    };
    for (int tied = 0; tied < 2; tied++) {
        c.tied_output = tied;
        lp_train_model *m = lp_train_model_create(&c, LP_TRAIN_BASE, &err);
        enum { T = 12 };
        CHECK(lp_train_model_reserve(m, 1, T, &err) == 0);
        lp_train_model_set_pool(m, pool);
        randomize(m, 100 + tied, 0.2f);
        int32_t ids[T], targets[T] = {0};
        for (int i = 0; i < T; i++) ids[i] = (int32_t)((i * 37 + 5) % c.n_vocab);
        lp_train_batch b = {.B = 1, .T = T, .inputs = ids, .targets = targets};
        lp_train_forward(m, &b, &err);
        char path[512];
        snprintf(path, sizeof path, "%s/test_train_export_%d.gguf", LP_BINARY_DIR, tied);
        CHECK_MSG(lp_train_export_gguf(m, path, LP_F32, vocab_path(), "test", &err) == 0, "%s",
                  err.message);
        lp_model *rt = lp_model_load(path, NULL, &err);
        CHECK_MSG(rt != NULL, "%s", err.message);
        if (rt) {
            lp_context *ctx = runtime_context(rt, T, &err);
            CHECK_MSG(ctx != NULL, "%s", err.message);
            lp_row rows[T];
            for (int i = 0; i < T; i++)
                rows[i] = (lp_row){.token = ids[i], .pos = i, .seq = 0, .adapter = 0,
                                   .parent = i - 1, .logits = true, .commit = false};
            CHECK_MSG(ctx && lp_forward(ctx, rows, T, &err) == 0, "%s", err.message);
            double worst = 0;
            int missing = 0;
            for (int i = 0; ctx && i < T; i++) {
                const float *a = lp_logits(ctx, i), *e = lp_train_logits(m, i);
                if (!a || !e) missing++;
                for (int v = 0; a && e && v < c.n_vocab; v++) worst = fmax(worst, fabs(a[v] - e[v]));
            }
            CHECK_MSG(missing == 0, "%d rows without logits", missing);
            printf("export (%s): runtime vs trainer logits max diff %.3g\n",
                   tied ? "tied" : "untied", worst);
            CHECK(worst < 1e-4);
            /* the roped keys and the values of every layer too: a forecast
             * set's KV prefix is exported from them (lp_train_layer_kv) */
            double worst_kv = 0;
            size_t kv_n = (size_t)T * c.n_kv_heads * c.head_dim;
            for (int l = 0; ctx && l < c.n_layers; l++)
                for (size_t i = 0; i < kv_n; i++) {
                    worst_kv = fmax(worst_kv, fabs(lp_batch_keys(ctx, l)[i] - lp_train_layer_kv(m, l, false)[i]));
                    worst_kv = fmax(worst_kv, fabs(lp_batch_values(ctx, l)[i] - lp_train_layer_kv(m, l, true)[i]));
                }
            CHECK_MSG(worst_kv < 1e-5, "runtime vs trainer keys and values differ by %g", worst_kv);
            lp_context_free(ctx);
            lp_model_free(rt);
        }
        remove(path);
        lp_train_model_free(m);
    }
}

/* Removes a PEFT directory written by lp_train_export_peft. */
static void remove_peft_dir(const char *dir) {
    char file[600];
    snprintf(file, sizeof file, "%s/adapter_model.safetensors", dir);
    remove(file);
    snprintf(file, sizeof file, "%s/adapter_config.json", dir);
    remove(file);
    rmdir(dir);
}

/* A small model with a rank-4 LoRA on all seven projections; its FFN
 * (48) is not a multiple of 32, so down's adapter stays F16 in an .lpa. */
static const lp_train_config small_lora_config = {
    .n_vocab = 512, .dim = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 8,
    .ffn_dim = 48, .n_ctx = 64, .rope_theta = 10000.0f, .rms_eps = 1e-5f,
    .lora_rank = 4, .lora_alpha = 8, .lora_targets = (1u << LP_PROJ_COUNT) - 1,
};

/* A trained LoRA exported as PEFT and loaded by the runtime's adapter
 * loader reproduces the trainer's logits (q/k row order, scale, layouts). */
static void test_peft_runtime(void) {
    lp_error err;
    lp_train_config c = small_lora_config;
    lp_train_model *m = lp_train_model_create(&c, LP_TRAIN_LORA, &err);
    enum { T = 10 };
    CHECK(lp_train_model_reserve(m, 1, T, &err) == 0);
    randomize(m, 321, 0.2f);
    int32_t ids[T], targets[T] = {0};
    for (int i = 0; i < T; i++) ids[i] = (int32_t)((i * 53 + 7) % c.n_vocab);
    lp_train_batch b = {.B = 1, .T = T, .inputs = ids, .targets = targets};
    lp_train_forward(m, &b, &err);
    char path[512], dir[512];
    snprintf(path, sizeof path, "%s/test_train_peft_base.gguf", LP_BINARY_DIR);
    snprintf(dir, sizeof dir, "%s/test_train_peft_rt", LP_BINARY_DIR);
    CHECK(lp_train_export_gguf(m, path, LP_F32, vocab_path(), "base", &err) == 0);
    CHECK(lp_train_export_peft(m, dir, "base", &err) == 0);
    lp_model *rt = lp_model_load(path, NULL, &err);
    lp_adapter *ad = rt ? lp_adapter_load(rt, dir, 1.0f, &err) : NULL;
    CHECK_MSG(ad != NULL, "%s", err.message);
    if (ad) {
        lp_context *ctx = runtime_context(rt, T, &err);
        CHECK(ctx && lp_context_bind_adapter(ctx, 1, ad, &err) == 0);
        lp_row rows[T];
        for (int i = 0; i < T; i++)
            rows[i] = (lp_row){.token = ids[i], .pos = i, .seq = 0, .adapter = 1,
                               .parent = i - 1, .logits = true, .commit = false};
        CHECK_MSG(ctx && lp_forward(ctx, rows, T, &err) == 0, "%s", err.message);
        double worst = 0;
        int missing = 0;
        for (int i = 0; ctx && i < T; i++) {
            const float *a = lp_logits(ctx, i), *e = lp_train_logits(m, i);
            if (!a || !e) missing++;
            for (int v = 0; a && e && v < c.n_vocab; v++) worst = fmax(worst, fabs(a[v] - e[v]));
        }
        CHECK_MSG(missing == 0, "%d rows without logits", missing);
        printf("peft: runtime (base + adapter) vs trainer logits max diff %.3g\n", worst);
        CHECK(worst < 1e-4);
        lp_context_free(ctx);
        lp_adapter_free(ad);
    }
    lp_model_free(rt);
    remove(path);
    remove_peft_dir(dir);
    lp_train_model_free(m);
}

/* Quantization-aware fine-tuning: an adapter loaded back into the trainer
 * (--init-adapter) holds the exported weights exactly; the fake-quantized
 * weights the QAT forward sees are bit for bit what the .lpa of that type
 * stores (projections with inputs that are not a multiple of 32, stored
 * F16, are left alone); restoring brings the FP32 weights back exactly. */
static void test_qat(void) {
    lp_error err;
    lp_train_config c = small_lora_config;
    lp_train_model *m = lp_train_model_create(&c, LP_TRAIN_LORA, &err);
    randomize(m, 99, 0.2f);
    char path[512], dir[512], lpa[512];
    snprintf(path, sizeof path, "%s/test_train_qat_base.gguf", LP_BINARY_DIR);
    snprintf(dir, sizeof dir, "%s/test_train_qat_peft", LP_BINARY_DIR);
    snprintf(lpa, sizeof lpa, "%s/test_train_qat.lpa", LP_BINARY_DIR);
    CHECK(lp_train_export_gguf(m, path, LP_F32, vocab_path(), "base", &err) == 0);
    CHECK(lp_train_export_peft(m, dir, "base", &err) == 0);
    lp_model *rt = lp_model_load(path, NULL, &err);
    lp_adapter *ad = rt ? lp_adapter_load(rt, dir, 1.0f, &err) : NULL;
    CHECK_MSG(ad != NULL, "%s", err.message);
    lp_train_config c2;
    lp_train_model *m2 = NULL;
    if (ad && lp_train_config_from_model(rt, &c2, &err) == 0 && lp_train_config_from_adapter(ad, &c2, &err) == 0) {
        CHECK(c2.lora_rank == 4 && c2.lora_alpha == 8 && c2.lora_targets == c.lora_targets);
        m2 = lp_train_model_create(&c2, LP_TRAIN_LORA, &err);
    }
    CHECK_MSG(m2 && lp_train_model_load_base(m2, rt, &err) == 0 && lp_train_lora_from_adapter(m2, ad, &err) == 0,
              "%s", err.message);
    int gi = lp_train_group_index(LP_TRAIN_LORA);
    size_t n = m->group_size[gi];
    CHECK(m2 && m2->group_size[gi] == n && !memcmp(m2->group[gi], m->group[gi], n * sizeof(float)));
    float *keep = malloc(n * sizeof *keep);
    static const uint32_t types[2] = {LP_W4, LP_W8};
    for (int ti = 0; m2 && keep && ti < 2; ti++) {
        CHECK_MSG(lp_adapter_write_lpa(ad, lpa, (int)types[ti], &err) == 0, "%s", err.message);
        lp_adapter *stored = lp_adapter_load(rt, lpa, 1.0f, &err);
        CHECK_MSG(stored && lp_train_fake_quantize_lora(m2, types[ti], keep, &err) == 0, "%s", err.message);
        int same = 0, differ = 0, rounded = 0, untouched = 0;
        float row[64];
        for (int l = 0; stored && l < c.n_layers; l++)
            for (int p = 0; p < LP_PROJ_COUNT; p++) {
                const lp_lora_pair *pair = pair_of(stored, l, (lp_proj)p);
                const float *A = m2->w.layers[l].lora_a[p], *B = m2->w.layers[l].lora_b[p];
                const float *A0 = m->w.layers[l].lora_a[p];
                size_t in = lp_t_lora_rows_in(&c, p), out = lp_t_lora_rows_out(&c, p);
                bool packed = pair->A.type == types[ti];
                CHECK(packed == (in % 32 == 0));
                for (int r = 0; r < 4; r++) {
                    lp_weight_dequantize_row(&pair->A, r, row);
                    for (size_t k = 0; k < in; k++) {
                        if (!packed) {
                            untouched += A[r * in + k] == A0[r * in + k];
                            continue;
                        }
                        if (A[r * in + k] == row[k]) same++;
                        else differ++;
                        rounded += A[r * in + k] != A0[r * in + k];
                    }
                }
                for (size_t o = 0; packed && o < out; o++) {
                    lp_weight_dequantize_row(&pair->B, (int64_t)o, row);
                    for (int r = 0; r < 4; r++) {
                        if (B[o * 4 + r] == row[r]) same++;
                        else differ++;
                    }
                }
            }
        printf("qat %s: %d values as stored, %d differ, %d rounded, %d left (F16 projections)\n",
               lp_dtype_name(types[ti]), same, differ, rounded, untouched);
        CHECK(same > 0 && differ == 0 && rounded > same / 4 && untouched == 2 * 4 * 48);
        lp_train_restore_lora(m2, keep);
        CHECK(!memcmp(m2->group[gi], m->group[gi], n * sizeof(float)));
        lp_adapter_free(stored);
    }
    /* an adapter the trainer cannot hold (mixed ranks) is refused clearly */
    if (ad) {
        lp_lora_pair *v1 = &ad->pairs[ad->index[lp_llama_weight_id(1, LP_PROJ_V)]];
        v1->rank = 2;
        lp_train_config c3 = c2;
        CHECK(lp_train_config_from_adapter(ad, &c3, &err) < 0 && strstr(err.message, "ranks"));
        v1->rank = 4;
    }
    free(keep);
    lp_train_model_free(m2);
    lp_adapter_free(ad);
    lp_model_free(rt);
    remove(path);
    remove(lpa);
    remove_peft_dir(dir);
    lp_train_model_free(m);
}

/* The PEFT directory: config keys and tensor shapes, and q/k B rows in HF order. */
static void test_export_peft(void) {
    lp_error err;
    lp_train_config c = tiny_config(false);
    c.n_extra = 0;
    lp_train_model *m = lp_train_model_create(&c, LP_TRAIN_LORA, &err);
    randomize(m, 5, 0.3f);
    char dir[512], file[600];
    snprintf(dir, sizeof dir, "%s/test_train_peft", LP_BINARY_DIR);
    CHECK_MSG(lp_train_export_peft(m, dir, "tiny-base", &err) == 0, "%s", err.message);
    snprintf(file, sizeof file, "%s/adapter_config.json", dir);
    char *json;
    size_t len;
    CHECK(lp_read_file(file, &json, &len, 1 << 20, &err) == 0);
    cJSON *j = cJSON_Parse(json);
    CHECK(j && !strcmp(cJSON_GetObjectItem(j, "peft_type")->valuestring, "LORA"));
    CHECK(j && cJSON_GetObjectItem(j, "r")->valueint == 2);
    CHECK(j && cJSON_GetArraySize(cJSON_GetObjectItem(j, "target_modules")) == 7);
    cJSON_Delete(j);
    free(json);
    snprintf(file, sizeof file, "%s/adapter_model.safetensors", dir);
    lp_safetensors *st = lp_safetensors_open(file, &err);
    CHECK_MSG(st != NULL, "%s", err.message);
    if (st) {
        CHECK(lp_safetensors_count(st) == (size_t)c.n_layers * 7 * 2);
        const lp_st_tensor *qb = lp_safetensors_find(st, "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight");
        const lp_st_tensor *da = lp_safetensors_find(st, "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight");
        CHECK(qb && qb->shape[0] == 8 && qb->shape[1] == 2);
        CHECK(da && da->shape[0] == 2 && da->shape[1] == 16);
        if (qb) {
            /* HF row s*d/2 + i of head h = our row 2i + s */
            float hf[16];
            memcpy(hf, qb->data, sizeof hf);
            const float *ours = m->w.layers[1].lora_b[LP_PROJ_Q];
            bool ok = true;
            for (int h = 0; h < 2; h++)
                for (int i = 0; i < 2; i++)
                    for (int s = 0; s < 2; s++)
                        for (int r = 0; r < 2; r++)
                            ok = ok && hf[(h * 4 + s * 2 + i) * 2 + r] == ours[(h * 4 + 2 * i + s) * 2 + r];
            CHECK(ok);
        }
        lp_safetensors_close(st);
    }
    remove(file);
    snprintf(file, sizeof file, "%s/adapter_config.json", dir);
    remove(file);
    rmdir(dir);
    lp_train_model_free(m);
}

/* JSONL: prompt tokens unmasked, completion + EOS masked in, padding masked out. */
/* The test vocabulary's tokenizer (*g: its file, closed by the caller). */
static lp_tokenizer *open_vocab(lp_gguf **g) {
    lp_error err;
    *g = lp_gguf_open(vocab_path(), &err);
    CHECK_MSG(*g != NULL, "%s", err.message);
    return *g ? lp_tokenizer_from_gguf(*g, &err) : NULL;
}

static void test_jsonl(void) {
    lp_error err;
    lp_gguf *g;
    lp_tokenizer *tok = open_vocab(&g);
    if (!tok) {
        lp_gguf_close(g);
        return;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/test_train.jsonl", LP_BINARY_DIR);
    FILE *f = fopen(path, "w");
    fputs("{\"prompt\": \"Once upon\", \"completion\": \" a time\"}\n\n"
          "{\"prompt\": \"The cat\", \"completion\": \" sat\"}\n", f);
    fclose(f);
    lp_train_data d = {0};
    CHECK_MSG(lp_train_data_load_jsonl(&d, path, tok, &err) == 0, "%s", err.message);
    CHECK(d.n_ex == 2);
    if (d.n_ex == 2) {
        const lp_train_example *ex = &d.ex[0];
        CHECK(ex->ids[0] == lp_tokenizer_bos(tok));
        CHECK(ex->ids[ex->n - 1] == lp_tokenizer_eos(tok));
        lp_train_batch_buf bb;
        CHECK(lp_train_batch_alloc(&bb, 1, 16, &err) == 0);
        lp_train_batch_set_example(&bb, 0, ex);
        int masked = 0;
        for (int t = 0; t < 16; t++) masked += bb.mask[t] != 0;
        CHECK(masked == ex->n - ex->n_prompt);
        CHECK(bb.mask[ex->n_prompt - 2] == 0 && bb.mask[ex->n_prompt - 1] == 1);
        CHECK(bb.targets[ex->n - 2] == lp_tokenizer_eos(tok) && bb.mask[ex->n - 1] == 0);
        lp_train_batch_free(&bb);
    }
    lp_train_data_free(&d);
    f = fopen(path, "w");
    fputs("{\"prompt\": \"x\"}\n", f);
    fclose(f);
    CHECK(lp_train_data_load_jsonl(&d, path, tok, &err) < 0 && strstr(err.message, ":1:"));
    lp_train_data_free(&d);
    remove(path);
    lp_tokenizer_free(tok);
    lp_gguf_close(g);
}

/* Plain text: a blank line ends a document, and each document is BOS ...
 * EOS in the stream; lines without blank lines between them are one
 * document (EOS once), which n_docs and n_lines make visible. */
static void test_text(void) {
    lp_error err;
    lp_gguf *g;
    lp_tokenizer *tok = open_vocab(&g);
    if (!tok) {
        lp_gguf_close(g);
        return;
    }
    int32_t bos = lp_tokenizer_bos(tok), eos = lp_tokenizer_eos(tok);
    char path[512];
    snprintf(path, sizeof path, "%s/test_train.txt", LP_BINARY_DIR);
    const char *texts[2] = {"Once upon a time.\n\nThe cat sat.\n\n\nA dog ran.\n",
                            "Once upon a time.\nThe cat sat.\nA dog ran.\n"};
    for (int k = 0; k < 2; k++) {
        FILE *f = fopen(path, "w");
        fputs(texts[k], f);
        fclose(f);
        lp_train_data d = {0};
        CHECK_MSG(lp_train_data_load_text(&d, path, tok, &err) == 0, "%s", err.message);
        size_t n_bos = 0, n_eos = 0;
        for (size_t i = 0; i < d.n_stream; i++) {
            n_bos += d.stream[i] == bos;
            n_eos += d.stream[i] == eos;
        }
        size_t want = k == 0 ? 3 : 1;
        CHECK_MSG(d.n_docs == want && n_bos == want && n_eos == want,
                  "text %d: %zu documents, %zu BOS, %zu EOS", k, d.n_docs, n_bos, n_eos);
        CHECK(d.n_stream > 0 && d.stream[0] == bos && d.stream[d.n_stream - 1] == eos);
        CHECK(d.n_lines == (k == 0 ? 0 : 2)); /* line breaks inside documents */
        lp_train_data_free(&d);
    }
    remove(path);
    lp_tokenizer_free(tok);
    lp_gguf_close(g);
}

/* ---- kernel levels and packing ------------------------------------------------- */

/* Loss and gradients of one batch at a given matrix-kernel level. */
static double grads_at_level(const lp_train_config *c, int level, const lp_train_batch *b,
                             float **grad_copy, size_t *n_grad) {
    lp_error err;
    lp_train_model *m = lp_train_model_create(c, LP_TRAIN_BASE | LP_TRAIN_LORA, &err);
    if (!m || lp_train_model_reserve(m, b->B, b->T, &err) < 0) {
        lp_train_model_free(m);
        return NAN;
    }
    m->gemm_level = level;
    randomize(m, 7, 0.1f);
    double loss = lp_train_forward(m, b, &err);
    lp_train_zero_grad(m);
    lp_train_backward(m, b);
    *n_grad = m->group_size[0] + m->group_size[1];
    *grad_copy = malloc(*n_grad * sizeof(float));
    memcpy(*grad_copy, m->grad[0], m->group_size[0] * sizeof(float));
    memcpy(*grad_copy + m->group_size[0], m->grad[1], m->group_size[1] * sizeof(float));
    lp_train_model_free(m);
    return loss;
}

/* Every kernel level this CPU runs gives the plain C result up to rounding,
 * on shapes that leave partial tiles everywhere (rows not a multiple of 8,
 * columns not a multiple of 16 or 32). */
static void test_gemm_levels(void) {
    lp_train_config c = {
        .n_vocab = 37, .dim = 40, .n_layers = 2, .n_heads = 5, .n_kv_heads = 1, .head_dim = 8,
        .ffn_dim = 72, .n_ctx = 32, .rope_theta = 10000.0f, .rms_eps = 1e-5f,
        .lora_rank = 3, .lora_alpha = 6.0f, .lora_targets = (1u << LP_PROJ_COUNT) - 1,
    };
    enum { B = 3, T = 13 };
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) in[i] = (i * 7 + 3) % 37, tg[i] = (i * 5 + 1) % 37;
    lp_train_batch b = {.B = B, .T = T, .inputs = in, .targets = tg};
    float *g0 = NULL;
    size_t n0 = 0;
    double l0 = grads_at_level(&c, 0, &b, &g0, &n0);
    CHECK(isfinite(l0));
    int best = lp_t_gemm_best_level();
    for (int level = 1; level <= best; level++) {
        float *g = NULL;
        size_t n = 0;
        double l = grads_at_level(&c, level, &b, &g, &n);
        double worst = 0, scale = 0;
        for (size_t i = 0; g && g0 && i < n && i < n0; i++) {
            double d = fabs((double)g[i] - g0[i]);
            worst = d > worst ? d : worst;
            scale = fabs(g0[i]) > scale ? fabs(g0[i]) : scale;
        }
        CHECK_MSG(fabs(l - l0) < 1e-5 * fabs(l0), "level %d loss %.9g vs %.9g", level, l, l0);
        CHECK_MSG(n == n0 && worst < 1e-4 * scale, "level %d gradient differs by %g (max %g)",
                  level, worst, scale);
        free(g);
    }
    printf("gemm levels: 0..%d agree\n", best);
    free(g0);
}

/* The AVX-512 attention (16 keys per vector, head dims that are multiples
 * of 16) gives the plain C attention's bits: same sums, other lanes. Causal
 * and masked (packed records, and one sequence whose rows also see the next
 * key), sequence lengths that leave partial key blocks, 1 and 2 threads. */
static void test_attention_levels(lp_threadpool *pool) {
    if (lp_t_gemm_best_level() < 2) {
        printf("attention levels: no AVX-512 here, fast path not run\n");
        return;
    }
    const int dims[] = {16, 32, 48};
    int compared = 0;
    for (int di = 0; di < 3; di++)
        for (int masked = 0; masked < 2; masked++) {
            enum { B = 2, T = 37, H = 4, KV = 2 };
            int d = dims[di];
            size_t qn = (size_t)B * T * H * d, kn = (size_t)B * T * KV * d, pn = (size_t)B * H * T * T;
            float *in = malloc((2 * qn + 2 * kn) * sizeof(float));
            float *out[2][6];
            uint8_t *visible = malloc((size_t)B * T * T);
            uint32_t s = 17u + (uint32_t)(di * 2 + masked);
            for (size_t i = 0; i < 2 * qn + 2 * kn; i++) {
                s = s * 1664525u + 1013904223u;
                in[i] = (float)((s >> 8) & 0xFFFF) / 16384.0f - 2.0f;
            }
            for (int b = 0; b < B; b++)
                for (int i = 0; i < T; i++)
                    for (int j = 0; j < T; j++)
                        visible[((size_t)b * T + i) * T + j] =
                            (j <= i && i / (7 + 5 * b) == j / (7 + 5 * b)) || (b == 1 && j == i + 1);
            for (int run = 0; run < 2; run++) {
                size_t sizes[6] = {pn, qn, qn, kn, kn, pn};
                for (int o = 0; o < 6; o++) out[run][o] = calloc(sizes[o], sizeof(float));
                lp_t_attn a = {
                    .B = B, .T = T, .n_heads = H, .n_kv_heads = KV, .head_dim = d,
                    .visible = masked ? visible : NULL, .level = run ? 2 : 0,
                    .q = in, .k = in + qn, .v = in + qn + kn, .dout = in + qn + 2 * kn,
                    .att = out[run][0], .out = out[run][1], .dq = out[run][2], .dk = out[run][3],
                    .dv = out[run][4], .datt = out[run][5],
                };
                lp_threadpool *p = run ? pool : NULL;
                lp_t_attention(p, &a);
                lp_t_attention_backward(p, &a);
            }
            size_t sizes[5] = {pn, qn, qn, kn, kn};
            for (int o = 0; o < 5; o++) {
                CHECK_MSG(memcmp(out[0][o], out[1][o], sizes[o] * sizeof(float)) == 0,
                          "attention output %d differs (head dim %d, masked %d)", o, d, masked);
                compared++;
            }
            for (int run = 0; run < 2; run++)
                for (int o = 0; o < 6; o++) free(out[run][o]);
            free(in);
            free(visible);
        }
    printf("attention levels: %d outputs bit-identical\n", compared);
}

/* Packed rows train each record exactly as alone: the packed batch's total
 * masked loss equals the sum over records run one per row. */
static void test_packing(void) {
    lp_error err;
    lp_train_config c = tiny_config(false);
    lp_train_model *m = lp_train_model_create(&c, LP_TRAIN_BASE, &err);
    CHECK_MSG(m != NULL, "%s", err.message);
    if (!m) return;
    enum { T = 16, N_EX = 5 };
    CHECK(lp_train_model_reserve(m, 4, T, &err) == 0);
    randomize(m, 3, 0.3f);
    static int32_t ids[N_EX][8] = {{0, 4, 5, 6, 1}, {0, 7, 8, 1}, {0, 2, 3, 9, 10, 1},
                                   {0, 5, 5, 1}, {0, 6, 7, 8, 9, 10, 4, 1}};
    static const int lens[N_EX] = {5, 4, 6, 4, 8}, prompts[N_EX] = {2, 1, 3, 2, 4};
    lp_train_example ex[N_EX];
    for (int i = 0; i < N_EX; i++) ex[i] = (lp_train_example){ids[i], lens[i], prompts[i]};
    lp_train_data d = {.ex = ex, .n_ex = N_EX};
    lp_train_batch_buf packed;
    CHECK(lp_train_batch_alloc(&packed, 2, T, &err) == 0);
    CHECK(lp_train_batch_enable_packing(&packed, &err) == 0);
    lp_rng rng;
    lp_rng_seed(&rng, 11);
    CHECK(lp_train_batch_sample(&packed, &d, &rng, &err) == 0);
    /* Recover which records were packed where from the positions (a record
     * starts where pos is 0 and the mask of its row isn't padding). */
    double packed_total = 0, alone_total = 0, weight = 0;
    double lp = lp_train_forward(m, &packed.batch, &err);
    for (int k = 0; k < 2 * T; k++) weight += packed.mask[k];
    packed_total = lp * weight;
    lp_train_batch_buf one;
    CHECK(lp_train_batch_alloc(&one, 1, T, &err) == 0);
    int records = 0;
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < T; t++) {
            if (packed.pos[r * T + t] != 0 || packed.inputs[r * T + t] != 0) continue;
            /* a record starts with BOS (id 0) at position 0; padding has pos 0 too but
             * sees nothing before it and has no loss: skip rows of pure padding */
            int len = 1;
            while (t + len < T && packed.pos[r * T + t + len] == len) len++;
            bool any = false;
            for (int k = 0; k < len; k++) any |= packed.mask[r * T + t + k] != 0;
            if (!any) continue;
            lp_train_example e = {packed.inputs + r * T + t, len + 1, 0};
            /* rebuild the record: inputs then the last target */
            int32_t buf[T + 1];
            memcpy(buf, packed.inputs + r * T + t, (size_t)len * sizeof *buf);
            buf[len] = packed.targets[r * T + t + len - 1];
            e.ids = buf;
            int first_loss = 0;
            while (first_loss < len && packed.mask[r * T + t + first_loss] == 0) first_loss++;
            e.n_prompt = first_loss + 1;
            lp_train_batch_set_example(&one, 0, &e);
            double w = 0;
            for (int k = 0; k < T; k++) w += one.mask[k];
            alone_total += lp_train_forward(m, &one.batch, &err) * w;
            records++;
        }
    CHECK_MSG(records >= 3, "only %d records packed into 2 rows of %d", records, T);
    CHECK_MSG(fabs(packed_total - alone_total) < 1e-4 * fabs(alone_total),
              "packed %.7g vs alone %.7g", packed_total, alone_total);
    lp_train_batch_free(&one);
    lp_train_batch_free(&packed);
    lp_train_model_free(m);
}

/* A compiled base (norm gains folded into the weights, fused projections)
 * is refused: training on it would apply the gains twice. */
static void test_compiled_base_refused(void) {
    lp_error err;
    lp_model *src = lp_model_load(LP_SHARED_MODELS "/stories260K.gguf", NULL, &err);
    CHECK(src != NULL);
    if (!src) return;
    char path[] = "/tmp/lp_train_lpx_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    lp_compile_params p = {.weight_type = LP_F32, .n_threads = 1};
    CHECK(lp_model_compile(src, path, &p, &err) == 0);
    lp_model *compiled = lp_model_load(path, NULL, &err);
    CHECK(compiled != NULL && compiled->norms_folded);
    lp_train_config cfg;
    CHECK(lp_train_config_from_model(src, &cfg, &err) == 0);
    lp_train_model *m = lp_train_model_create(&cfg, LP_TRAIN_LORA, &err);
    CHECK(m != NULL);
    if (m && compiled) {
        CHECK(lp_train_model_load_base(m, src, &err) == 0);
        CHECK(lp_train_model_load_base(m, compiled, &err) != 0 &&
              strstr(err.message, "compiled base") != NULL);
    }
    lp_train_model_free(m);
    lp_model_free(compiled);
    lp_model_free(src);
    unlink(path);
}

int main(void) {
    lp_error err;
    lp_threadpool *pool = lp_threadpool_create(2, &err);
    test_compiled_base_refused();
    test_gradients(false, false, NULL);
    test_gradients(true, true, pool);
    printf("gradient check: worst relative error %.3g\n", worst_rel);
    test_overfit();
    test_lora_frozen_base();
    test_extra_only();
    test_resume_and_threads();
    test_export_gguf(pool);
    test_export_peft();
    test_peft_runtime();
    test_qat();
    test_jsonl();
    test_text();
    test_gemm_levels();
    test_attention_levels(pool);
    test_packing();
    lp_threadpool_destroy(pool);
    return check_summary("train");
}
