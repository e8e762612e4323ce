/* Forecast-embedding training by self-distillation (see forecast.h). */
#include "forecast.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../formats/lpf.h"
#include "train.h"

typedef struct teacher {
    int32_t *ids;  /* prompt + greedy continuation */
    int n, n_prompt;
} teacher;

static lp_context *make_ctx(const lp_model *m, int threads, int max_seq, lp_error *err) {
    lp_context_params cp = lp_context_default_params();
    cp.n_threads = threads;
    cp.max_sequences = 1;
    cp.max_logit_rows = 128;
    cp.n_ctx = max_seq + 256;
    cp.max_seq_len = max_seq + 128;
    cp.max_adapters = 1;
    return lp_context_create(m, &cp, err);
}

/* Greedy continuation of one prompt (with the adapter); spec may be NULL. */
static int decode(lp_context *ctx, const lp_adapter *a, const int32_t *prompt, int n_prompt, int n_new,
                  const lp_speculate *spec, teacher *out, lp_spec_stats *ss, lp_error *err) {
    lp_engine *e = lp_engine_create(ctx, NULL, err);
    if (!e) return -1;
    lp_request q = lp_request_default();
    q.prompt = prompt;
    q.n_prompt = n_prompt;
    q.adapter = a;
    q.prefix_adapter = a;
    q.n_prefix = n_prompt;
    q.sampling.temperature = 0;
    q.max_tokens = n_new;
    q.no_reuse = true;
    q.drop_kv = true;
    q.speculate = spec;
    int id = lp_engine_submit(e, &q, err), rc = -1;
    if (id >= 0 && lp_engine_run(e, err) == 0) {
        int n;
        const int32_t *t = lp_engine_request_tokens(e, id, &n);
        if (out) {
            out->ids = malloc((size_t)(n_prompt + n) * sizeof *out->ids);
            if (!out->ids) {
                lp_engine_free(e);
                return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
            }
            memcpy(out->ids, prompt, (size_t)n_prompt * sizeof *prompt);
            memcpy(out->ids + n_prompt, t, (size_t)n * sizeof *t);
            out->n = n_prompt + n;
            out->n_prompt = n_prompt;
        }
        if (ss) lp_engine_request_spec_stats(e, id, ss);
        rc = 0;
    }
    lp_engine_free(e);
    return rc;
}

/* The teacher outputs as f's draft corpus: each continuation after the last
 * LP_LPF_NGRAM tokens of its prompt (so the first output token has its
 * context), sequences separated by -1; the first prompts' outputs while the
 * file stays within max_bytes (0: no limit). */
static int attach_corpus(lp_forecast *f, const lp_model *base, const teacher *tch, int n, size_t max_bytes,
                         lp_forecast_train_report *rep, lp_error *err) {
    lp_model_info info;
    lp_model_get_info(base, &info);
    size_t name_len = strlen(lp_forecast_adapter_name(f)), total = 0;
    for (int i = 0; i < n; i++) total += (size_t)(tch[i].n - tch[i].n_prompt) + LP_LPF_NGRAM + 1;
    if (total > LP_LPF_MAX_CORPUS) total = LP_LPF_MAX_CORPUS;
    int32_t *c = malloc((total ? total : 1) * sizeof *c);
    if (!c) return lp_error_set(err, LP_ERR_NOMEM, "out of memory for the draft corpus");
    size_t len = 0;
    int kept = 0;
    for (int i = 0; i < n; i++) {
        int from = tch[i].n_prompt > LP_LPF_NGRAM ? tch[i].n_prompt - LP_LPF_NGRAM : 0, need = tch[i].n - from + 1;
        if (len + (size_t)need > total) break;
        if (max_bytes && lp_lpf_file_bytes(lp_forecast_k(f), lp_forecast_dim(f), name_len, info.n_vocab,
                                           len + (size_t)need, lp_forecast_prefix_floats(f)) > max_bytes)
            break;
        memcpy(c + len, tch[i].ids + from, (size_t)(tch[i].n - from) * sizeof *c);
        len += (size_t)(tch[i].n - from);
        c[len++] = -1;
        kept++;
    }
    rep->corpus_sequences = kept;
    rep->corpus_dropped = n - kept;
    int rc = lp_forecast_set_corpus(f, c, (int)len, err);
    free(c);
    return rc;
}

/* Whether a checkpoint's model has the shape this run's base (and adapter)
 * and k give it. */
static bool same_shape(const lp_train_config *a, const lp_train_config *b) {
    return a->n_vocab == b->n_vocab && a->dim == b->dim && a->n_layers == b->n_layers && a->n_heads == b->n_heads &&
           a->n_kv_heads == b->n_kv_heads && a->head_dim == b->head_dim && a->ffn_dim == b->ffn_dim &&
           a->n_extra == b->n_extra && a->lora_rank == b->lora_rank && a->lora_targets == b->lora_targets;
}

/* The forecast set the trainer's extra rows make: k embeddings, and the
 * keys and values of the P prefix rows in every layer, from a forward of
 * those rows alone (batch buffers of at least P rows reused). */
static lp_forecast *make_set(lp_train_model *m, const lp_forecast_train_params *p, const char *name, int32_t *inputs,
                             int32_t *targets, int32_t *pos, float *mask, uint8_t *visible, lp_error *err) {
    lp_forecast *f = lp_forecast_create(p->base, p->k, m->w.extra, name, err);
    int P = p->prefix;
    if (!f || P == 0) return f;
    const lp_train_config *c = &m->cfg;
    for (int i = 0; i < P; i++) {
        inputs[i] = c->n_vocab + p->k + i;
        targets[i] = 0;
        pos[i] = i;
        mask[i] = 0;
        for (int j = 0; j < P; j++) visible[(size_t)i * P + j] = j <= i;
    }
    lp_train_batch batch = {.B = 1, .T = P, .inputs = inputs, .targets = targets, .mask = mask, .pos = pos,
                            .visible = visible};
    size_t kv_dim = (size_t)c->n_kv_heads * (size_t)c->head_dim, per_layer = (size_t)P * kv_dim;
    float *kv = malloc((size_t)c->n_layers * 2 * per_layer * sizeof *kv);
    if (!kv || isnan(lp_train_forward(m, &batch, err))) {
        if (!kv) lp_error_set(err, LP_ERR_NOMEM, "out of memory for a KV prefix");
        free(kv);
        lp_forecast_free(f);
        return NULL;
    }
    for (int l = 0; l < c->n_layers; l++) {
        memcpy(kv + (size_t)l * 2 * per_layer, lp_train_layer_kv(m, l, false), per_layer * sizeof *kv);
        memcpy(kv + ((size_t)l * 2 + 1) * per_layer, lp_train_layer_kv(m, l, true), per_layer * sizeof *kv);
    }
    int rc = lp_forecast_set_prefix(f, p->base, kv, P, err);
    free(kv);
    if (rc) {
        lp_forecast_free(f);
        return NULL;
    }
    return f;
}

/* Mean tokens per pass of speculative decoding over the held-out prompts. */
static double eval_acceptance(lp_context *ctx, const lp_forecast_train_params *p, const lp_forecast *f,
                              lp_error *err) {
    lp_speculate sp = p->eval_tree;
    sp.forecast = f;
    if (sp.depth <= 0) {
        sp.depth = p->k;
        for (int d = 0; d < p->k; d++) sp.branches[d] = 1;
    }
    if (sp.depth > p->k) sp.depth = p->k;
    long gen = 0, passes = 0;
    for (int i = p->n_prompts - p->n_eval; i < p->n_prompts; i++) {
        lp_spec_stats ss;
        if (decode(ctx, p->adapter, p->prompts[i], p->n_prompt[i], p->eval_tokens, &sp, NULL, &ss, err)) return -1;
        gen += ss.n_generated;
        passes += ss.n_passes;
    }
    return passes ? (double)gen / (double)passes : 0.0;
}

lp_forecast *lp_forecast_train(const lp_forecast_train_params *pin, lp_forecast_train_report *report,
                               lp_error *err) {
    lp_forecast_train_params p = *pin;
    if (p.n_continue <= 0) p.n_continue = 48;
    if (p.steps <= 0) p.steps = 200;
    if (p.batch <= 0) p.batch = 8;
    if (p.anchors <= 0) p.anchors = 8;
    if (p.lr <= 0) p.lr = 0.02f;
    if (p.eval_tokens <= 0) p.eval_tokens = 48;
    if (p.threads <= 0) p.threads = lp_default_threads();
    lp_forecast_train_report rep = {0};
    if (!p.base || p.k < 1 || p.k > LP_SPEC_MAX_DEPTH || p.n_prompts < 1 || p.n_eval < 0 ||
        p.n_eval >= p.n_prompts || p.prefix < 0 || p.prefix > LP_MAX_KV_PREFIX) {
        lp_error_set(err, LP_ERR_INVALID, "train-forecast: k %d (1..%d), prefix %d (0..%d), %d prompts of which %d "
                     "held out", p.k, LP_SPEC_MAX_DEPTH, p.prefix, LP_MAX_KV_PREFIX, p.n_prompts, p.n_eval);
        return NULL;
    }
    double t0 = lp_now_seconds();
    lp_model_info info;
    lp_model_get_info(p.base, &info);
    /* the size limit holds the embeddings and the prefix whole (the corpus
     * gets what is left) */
    size_t name_len = p.adapter ? strlen(lp_adapter_name(p.adapter)) : 0;
    size_t fixed = lp_lpf_file_bytes(p.k, info.dim, name_len, info.n_vocab, 0,
                                     (size_t)info.n_layers * 2 * (size_t)p.prefix *
                                         (size_t)(info.n_kv_heads * info.head_dim));
    if (p.max_bytes && fixed > p.max_bytes) {
        lp_error_set(err, LP_ERR_INVALID, "train-forecast: %d embeddings and a KV prefix of %d entries take %zu bytes, "
                     "over the file size limit of %zu (a smaller --prefix or a larger --max-size)", p.k, p.prefix,
                     fixed, p.max_bytes);
        return NULL;
    }
    int max_prompt = 0;
    for (int i = 0; i < p.n_prompts; i++)
        if (p.n_prompt[i] > max_prompt) max_prompt = p.n_prompt[i];
    int n_train = p.n_prompts - p.n_eval;
    teacher *tch = calloc((size_t)n_train, sizeof *tch);
    lp_context *ctx = make_ctx(p.base, p.threads, max_prompt + p.n_continue + p.eval_tokens, err);
    lp_train_model *m = NULL;
    lp_threadpool *pool = NULL;
    lp_adamw opt = {0};
    lp_forecast *out = NULL, *probe = NULL;
    int32_t *inputs = NULL, *targets = NULL, *pos = NULL;
    float *mask = NULL;
    uint8_t *visible = NULL;
    if (!tch || !ctx) {
        if (!tch) lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* 1. teacher continuations */
    int max_n = 0;
    for (int i = 0; i < n_train; i++) {
        if (decode(ctx, p.adapter, p.prompts[i], p.n_prompt[i], p.n_continue, NULL, &tch[i], NULL, err)) goto done;
        rep.n_teacher_tokens += tch[i].n - tch[i].n_prompt;
        if (tch[i].n > max_n) max_n = tch[i].n;
    }
    /* 2. the trainer: frozen base (and LoRA), k trainable extra rows */
    lp_train_config c;
    if (lp_train_config_from_model(p.base, &c, err) < 0) goto done;
    c.n_extra = p.k + p.prefix;
    if (p.adapter && lp_train_config_from_adapter(p.adapter, &c, err) < 0) goto done;
    lp_adamw_config ac = lp_adamw_default();
    ac.lr = p.lr;
    ac.min_lr = p.lr * 0.1f;
    ac.warmup = p.steps / 10 + 1;
    ac.total_steps = p.steps;
    ac.weight_decay = 0;
    lp_rng rng;
    lp_rng_seed(&rng, p.seed ^ 0x5eed5eedull);
    if (p.resume) {
        /* the embeddings, optimizer, RNG and step from the checkpoint; the
         * frozen base and LoRA from the files given, as for a fresh run */
        if (lp_checkpoint_load(p.resume, &m, &opt, &rng, err) < 0) goto done;
        if (!same_shape(&m->cfg, &c) || m->trainable != LP_TRAIN_EXTRA) {
            lp_error_set(err, LP_ERR_FORMAT, "%s: not a forecast checkpoint for this base%s, k %d and prefix %d",
                         p.resume, p.adapter ? " and adapter" : "", p.k, p.prefix);
            goto done;
        }
        if (opt.cfg.lr != ac.lr || opt.cfg.min_lr != ac.min_lr || opt.cfg.warmup != ac.warmup ||
            opt.cfg.total_steps != ac.total_steps || opt.step > p.steps) {
            lp_error_set(err, LP_ERR_INVALID, "%s: made with other --steps or --lr (or past step %d)", p.resume,
                         p.steps);
            goto done;
        }
        rep.resumed_step = (int)opt.step;
        if (lp_train_model_load_base(m, p.base, err) < 0) goto done;
    } else {
        m = lp_train_model_create(&c, LP_TRAIN_EXTRA, err);
        if (!m || lp_train_model_load_base(m, p.base, err) < 0) goto done;
        lp_train_model_init(m, LP_TRAIN_EXTRA, p.seed);
        if (lp_adamw_init(&opt, m, &ac, err) < 0) goto done;
    }
    if (p.adapter && lp_train_lora_from_adapter(m, p.adapter, err) < 0) goto done;
    /* rows of a training sequence: the teacher's, the anchor groups', the prefix's */
    int T = max_n + p.anchors * p.k + p.prefix, B = p.batch;
    pool = lp_threadpool_create(p.threads, err);
    if (!pool || lp_train_model_reserve(m, B, T, err) < 0) goto done;
    lp_train_model_set_pool(m, pool);
    size_t BT = (size_t)B * (size_t)T;
    inputs = malloc(BT * sizeof *inputs);
    targets = malloc(BT * sizeof *targets);
    pos = malloc(BT * sizeof *pos);
    mask = malloc(BT * sizeof *mask);
    visible = malloc(BT * (size_t)T);
    if (!inputs || !targets || !pos || !mask || !visible) {
        lp_error_set(err, LP_ERR_NOMEM, "out of memory for training batches");
        goto done;
    }
    /* acceptance before training (the random init) */
    if (p.n_eval > 0 && !p.resume) {
        probe = make_set(m, &p, NULL, inputs, targets, pos, mask, visible, err);
        if (!probe) goto done;
        rep.eval_tokens_per_pass_before = eval_acceptance(ctx, &p, probe, err);
        lp_forecast_free(probe);
        probe = NULL;
        if (rep.eval_tokens_per_pass_before < 0) goto done;
    }
    /* 3. steps */
    for (int step = (int)opt.step; step < p.steps; step++) {
        memset(inputs, 0, BT * sizeof *inputs);
        memset(targets, 0, BT * sizeof *targets);
        memset(mask, 0, BT * sizeof *mask);
        memset(visible, 0, BT * (size_t)T);
        for (int b = 0; b < B; b++) {
            const teacher *s = &tch[lp_rng_u64(&rng) % (uint64_t)n_train];
            int32_t *in = inputs + (size_t)b * T, *tg = targets + (size_t)b * T, *ps = pos + (size_t)b * T;
            float *mk = mask + (size_t)b * T;
            uint8_t *vis = visible + (size_t)b * T * T;
            for (int i = 0; i < T; i++) ps[i] = 0;
            for (int i = 0; i < s->n; i++) {
                in[i] = s->ids[i];
                ps[i] = i;
                for (int j = 0; j <= i; j++) vis[(size_t)i * T + j] = 1;
            }
            /* padding rows see themselves only (masked out of the loss) */
            for (int i = s->n; i < T; i++) vis[(size_t)i * T + i] = 1;
            int pre = T - p.prefix; /* the prefix rows: the last P */
            for (int i = 0; i < p.prefix; i++) {
                in[pre + i] = c.n_vocab + p.k + i;
                ps[pre + i] = i;
                for (int j = 0; j <= i; j++) vis[(size_t)(pre + i) * T + pre + j] = 1;
            }
            int t_min = s->n_prompt - 1, t_max = s->n - 3; /* at least the first forecast row has a target */
            if (t_max < t_min) continue;
            for (int g = 0; g < p.anchors; g++) {
                int t = t_min + (int)(lp_rng_u64(&rng) % (uint64_t)(t_max - t_min + 1));
                int base_row = s->n + g * p.k;
                for (int j = 0; j < p.k; j++) {
                    int r = base_row + j;
                    in[r] = c.n_vocab + j;
                    ps[r] = t + 1 + j;
                    for (int q = 0; q <= t; q++) vis[(size_t)r * T + q] = 1;
                    for (int q = 0; q <= j; q++) vis[(size_t)r * T + base_row + q] = 1;
                    for (int q = 0; q < p.prefix; q++) vis[(size_t)r * T + pre + q] = 1;
                    if (t + 2 + j < s->n) {
                        tg[r] = s->ids[t + 2 + j];
                        mk[r] = 1;
                    }
                }
            }
        }
        lp_train_batch batch = {.B = B, .T = T, .inputs = inputs, .targets = targets, .mask = mask, .pos = pos,
                                .visible = visible};
        double loss = lp_train_forward(m, &batch, err);
        if (isnan(loss)) goto done;
        lp_train_zero_grad(m);
        lp_train_backward(m, &batch);
        lp_adamw_step(&opt, m);
        if (step == rep.resumed_step) rep.first_loss = loss;
        rep.last_loss = loss;
        if (!p.quiet && (step % 10 == 0 || step == p.steps - 1))
            fprintf(stderr, "train-forecast: step %d/%d  loss %.4f  lr %.4g  %.1f s\n", step + 1, p.steps, loss,
                    (double)lp_train_lr(&opt.cfg, step), lp_now_seconds() - t0);
        bool stop = p.stop_after > 0 && step + 1 - rep.resumed_step >= p.stop_after && step + 1 < p.steps;
        if (p.checkpoint && ((p.checkpoint_every > 0 && (step + 1) % p.checkpoint_every == 0) ||
                             step + 1 == p.steps || stop) &&
            lp_checkpoint_save(p.checkpoint, m, &opt, &rng, err) < 0)
            goto done;
        if (stop) {
            rep.stopped_at = step + 1;
            break;
        }
    }
    out = make_set(m, &p, p.adapter ? lp_adapter_name(p.adapter) : NULL, inputs, targets, pos, mask, visible, err);
    if (out && p.n_eval > 0) {
        rep.eval_tokens_per_pass_embeddings = eval_acceptance(ctx, &p, out, err);
        if (rep.eval_tokens_per_pass_embeddings < 0) goto fail;
    }
    if (out && !p.no_corpus) {
        if (attach_corpus(out, p.base, tch, n_train, p.max_bytes, &rep, err)) goto fail;
        rep.n_corpus = lp_forecast_corpus_size(out);
    }
    if (out && p.n_eval > 0) {
        rep.eval_tokens_per_pass_after = p.no_corpus ? rep.eval_tokens_per_pass_embeddings
                                                     : eval_acceptance(ctx, &p, out, err);
        if (rep.eval_tokens_per_pass_after < 0) goto fail;
    }
    rep.seconds = lp_now_seconds() - t0;
    goto done;
fail:
    lp_forecast_free(out);
    out = NULL;
done:
    if (report) *report = rep;
    for (int i = 0; tch && i < n_train; i++) free(tch[i].ids);
    free(tch);
    free(inputs);
    free(targets);
    free(pos);
    free(mask);
    free(visible);
    lp_adamw_free(&opt);
    lp_train_model_free(m);
    lp_threadpool_destroy(pool);
    lp_context_free(ctx);
    return out;
}
