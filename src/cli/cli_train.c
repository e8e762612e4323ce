/* loraplex train / train-lora: train a small llama model from scratch, or a
 * LoRA on a frozen base, with the in-tree FP32 trainer (src/train). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/base.h"
#include "../base/dtype.h"
#include "../formats/gguf.h"
#include "../kernels/kernels.h"
#include "../model/model.h"
#include "../train/train.h"
#include "cli.h"

int cli_train(int argc, char **argv);
int cli_train_lora(int argc, char **argv);
int cli_quantize(int argc, char **argv);

typedef struct train_opts {
    bool lora;
    const char *vocab, *text, *data, *eval, *base, *out, *checkpoint, *resume, *targets;
    const char *init_from, *init_adapter, *qat;
    uint32_t qat_type; /* LP_W4 / LP_W8 with --qat, else 0 */
    long dim, layers, heads, kv_heads, ffn, ctx, rank;
    long steps, batch, seq, warmup, seed, threads, eval_every, log_every, ckpt_every, eval_match;
    double lr, min_lr, wd, clip, theta, alpha;
    bool tied, f16, pack;
} train_opts;

static void train_usage(FILE *out, bool lora) {
    if (!lora)
        fprintf(out,
                "usage: loraplex train --vocab VOCAB.gguf (--text FILE | --data FILE.jsonl) [options] -o OUT.gguf\n"
                "model:   --dim 128 --layers 4 --heads 4 --kv-heads 2 --ffn 384 --ctx 256\n"
                "         --theta 10000 --tied\n"
                "output:  -o OUT.gguf (llama architecture, F32; --f16 for F16 matrices)\n");
    else
        fprintf(out,
                "usage: loraplex train-lora --base MODEL.gguf --data TRAIN.jsonl [--eval EVAL.jsonl]\n"
                "                           [--rank 8] [--alpha 16] [--targets q,k,v,o,gate,up,down]\n"
                "                           [options] -o ADAPTER_DIR (Hugging Face PEFT)\n");
    fprintf(out,
            "data:    --text FILE (documents split at blank lines)  --data FILE.jsonl\n"
            "         ({\"prompt\",\"completion\"} per line; loss on the completion + EOS)\n"
            "         --pack (records only: several whole records per row, each seeing only\n"
            "         itself; less padding, same gradients per record)\n"
            "         --eval FILE.jsonl  --eval-every K (default 100)  --eval-match N (greedy\n"
            "         exact-match sample size, default 16 for train-lora, 0 for train)\n"
            "steps:   --steps 1000 --batch 16 --seq 128 --lr 1e-3 (train-lora: 1e-4... 2e-4 typical)\n"
            "         --min-lr LR/10 --warmup 100 --wd 0.1 --clip 1.0 --seed 1 --threads N\n"
            "         --log-every 10\n"
            "state:   --checkpoint FILE --checkpoint-every K  --resume FILE (model, optimizer,\n"
            "         RNG and step from the checkpoint; --steps may extend the run)\n"
            "         --init-from FILE (train-lora: LoRA weights from a checkpoint, a fresh\n"
            "         optimizer, schedule and RNG from these options: warm starts)\n"
            "         --init-adapter PATH (train-lora: start from an adapter, PEFT dir, GGUF\n"
            "         or .lpa, taking its rank, alpha and targets)\n"
            "quant:   --qat i4|i8 (train-lora: quantization-aware fine-tuning: every forward\n"
            "         sees the adapter as `adapter compile --dtype i4|i8` will store it, and\n"
            "         the gradient updates the FP32 weights; eval numbers are for the\n"
            "         rounded adapter; export stays FP32, compile it with that --dtype)\n");
}

static bool is_flag(const char *a) {
    return !strcmp(a, "--tied") || !strcmp(a, "--f16") || !strcmp(a, "--pack") ||
           !strcmp(a, "-h") || !strcmp(a, "--help");
}

/* Returns 0 ok, 1 exit 0 (help), 2 usage error. */
static int parse_train_opts(int argc, char **argv, train_opts *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!is_flag(a) && !(v = cli_value(argc, argv, &i))) return 2;
        struct { const char *name; long *dst; long min, max; } ints[] = {
            {"--dim", &o->dim, 2, 65536}, {"--layers", &o->layers, 1, 1024},
            {"--heads", &o->heads, 1, 1024}, {"--kv-heads", &o->kv_heads, 1, 1024},
            {"--ffn", &o->ffn, 1, 1 << 18}, {"--ctx", &o->ctx, 1, 1 << 20},
            {"--rank", &o->rank, 1, 4096}, {"--steps", &o->steps, 1, 1L << 30},
            {"--batch", &o->batch, 1, 65536}, {"--seq", &o->seq, 2, 1 << 16},
            {"--warmup", &o->warmup, 0, 1L << 30}, {"--seed", &o->seed, 0, 1L << 62},
            {"--threads", &o->threads, 1, 256}, {"--eval-every", &o->eval_every, 0, 1L << 30},
            {"--log-every", &o->log_every, 1, 1L << 30},
            {"--checkpoint-every", &o->ckpt_every, 0, 1L << 30},
            {"--eval-match", &o->eval_match, 0, 1 << 20},
        };
        struct { const char *name; double *dst; double min, max; } floats[] = {
            {"--lr", &o->lr, 0, 10}, {"--min-lr", &o->min_lr, 0, 10}, {"--wd", &o->wd, 0, 10},
            {"--clip", &o->clip, 0, 1e9}, {"--theta", &o->theta, 1, 1e9},
            {"--alpha", &o->alpha, -1e6, 1e6},
        };
        struct { const char *name; const char **dst; } strs[] = {
            {"--vocab", &o->vocab}, {"--text", &o->text}, {"--data", &o->data},
            {"--eval", &o->eval}, {"--base", &o->base}, {"-o", &o->out},
            {"--checkpoint", &o->checkpoint}, {"--resume", &o->resume},
            {"--targets", &o->targets}, {"--init-from", &o->init_from},
            {"--init-adapter", &o->init_adapter}, {"--qat", &o->qat},
        };
        bool done = false;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            train_usage(stdout, o->lora);
            return 1;
        }
        if (!strcmp(a, "--tied")) o->tied = done = true;
        if (!strcmp(a, "--f16")) o->f16 = done = true;
        if (!strcmp(a, "--pack")) o->pack = done = true;
        for (size_t k = 0; !done && k < sizeof ints / sizeof ints[0]; k++)
            if (!strcmp(a, ints[k].name)) {
                if (!cli_int(a, v, ints[k].min, ints[k].max, ints[k].dst)) return 2;
                done = true;
            }
        for (size_t k = 0; !done && k < sizeof floats / sizeof floats[0]; k++)
            if (!strcmp(a, floats[k].name)) {
                if (!cli_float(a, v, floats[k].min, floats[k].max, floats[k].dst)) return 2;
                done = true;
            }
        for (size_t k = 0; !done && k < sizeof strs / sizeof strs[0]; k++)
            if (!strcmp(a, strs[k].name)) {
                *strs[k].dst = v;
                done = true;
            }
        if (!done) {
            fprintf(stderr, "loraplex %s: unknown option '%s'\n", o->lora ? "train-lora" : "train", a);
            train_usage(stderr, o->lora);
            return 2;
        }
    }
    if (o->qat) {
        o->qat_type = !strcmp(o->qat, "i4") ? LP_W4 : !strcmp(o->qat, "i8") ? LP_W8 : 0;
        if (!o->qat_type || !o->lora) {
            fprintf(stderr, "loraplex %s: --qat takes i4 or i8, and only with train-lora\n",
                    o->lora ? "train-lora" : "train");
            return 2;
        }
    }
    if (o->init_adapter && (!o->lora || o->init_from || o->resume)) {
        fprintf(stderr, "loraplex: --init-adapter is for train-lora, without --init-from or --resume\n");
        return 2;
    }
    return 0;
}

/* With --qat: the LoRA weights the forward passes see are the rounded ones
 * (qat.c); keep holds the FP32 weights in between. */
static int qat_enter(const train_opts *o, lp_train_model *m, float *keep, lp_error *err) {
    return o->qat_type ? lp_train_fake_quantize_lora(m, o->qat_type, keep, err) : 0;
}
static void qat_leave(const train_opts *o, lp_train_model *m, const float *keep) {
    if (o->qat_type) lp_train_restore_lora(m, keep);
}

/* ---- evaluation ----------------------------------------------------------------- */

/* Mean masked loss over every eval record, in order, batch by batch. */
static double eval_loss(lp_train_model *m, lp_train_batch_buf *bb, const lp_train_data *d) {
    double total = 0, weight = 0;
    lp_error err;
    for (int i = 0; i < d->n_ex; i += bb->batch.B) {
        lp_train_batch b = bb->batch;
        b.B = d->n_ex - i < b.B ? d->n_ex - i : b.B;
        for (int r = 0; r < b.B; r++) lp_train_batch_set_example(bb, r, &d->ex[i + r]);
        double loss = lp_train_forward(m, &b, &err);
        double w = 0;
        for (int k = 0; k < b.B * b.T; k++) w += b.mask[k];
        if (isfinite(loss)) total += loss * w, weight += w;
    }
    return weight > 0 ? total / weight : NAN;
}

/* Greedy generation with the training forward (full recompute per token;
 * fine at these sizes): the fraction of records whose completion + EOS is
 * reproduced exactly. */
static double eval_exact_match(lp_train_model *m, const lp_train_data *d, int n, int max_len) {
    int32_t *ids = malloc((size_t)max_len * sizeof *ids), *tg = calloc((size_t)max_len, sizeof *tg);
    int hits = 0, tried = 0;
    lp_error err;
    for (int i = 0; i < d->n_ex && tried < n && ids && tg; i++) {
        const lp_train_example *ex = &d->ex[i];
        if (ex->n > max_len) continue;
        tried++;
        int len = ex->n_prompt;
        memcpy(ids, ex->ids, (size_t)len * sizeof *ids);
        bool ok = true;
        while (len < ex->n && ok) {
            lp_train_batch b = {.B = 1, .T = len, .inputs = ids, .targets = tg};
            if (isnan(lp_train_forward(m, &b, &err))) break;
            const float *z = lp_train_logits(m, len - 1);
            int best = 0;
            for (int v = 1; v < m->cfg.n_vocab; v++) best = z[v] > z[best] ? v : best;
            ok = best == ex->ids[len];
            ids[len++] = best;
        }
        hits += ok && len == ex->n;
    }
    free(ids);
    free(tg);
    return tried ? (double)hits / tried : NAN;
}

/* ---- progress ------------------------------------------------------------------------ */

static void format_eta(double s, char *buf, size_t cap) {
    if (!isfinite(s) || s < 0) s = 0;
    long t = (long)s;
    if (t >= 3600) snprintf(buf, cap, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
}

/* ---- the loop -------------------------------------------------------------------------- */

static int train_loop(train_opts *o, lp_train_model *m, lp_adamw *opt, lp_rng *rng,
                      const lp_train_data *train, const lp_train_data *eval,
                      const lp_tokenizer *tok) {
    lp_error err;
    lp_train_batch_buf bb;
    if (lp_train_batch_alloc(&bb, (int)o->batch, (int)o->seq, &err) < 0) return cli_fail("train", &err);
    if (o->pack && lp_train_batch_enable_packing(&bb, &err) < 0) {
        lp_train_batch_free(&bb);
        return cli_fail("train", &err);
    }
    float *keep = NULL;
    if (o->qat_type && !(keep = malloc(m->group_size[lp_train_group_index(LP_TRAIN_LORA)] * sizeof *keep))) {
        lp_train_batch_free(&bb);
        lp_fail(&err, "out of memory for the QAT weight copy");
        return cli_fail("train", &err);
    }
    bool tty = isatty(2);
    double t0 = lp_now_seconds();
    long start = opt->step, tokens_per_step = o->batch * o->seq;
    int rc = 0;
    for (long step = opt->step; step < o->steps; step++) {
        if (lp_train_batch_sample(&bb, train, rng, &err) < 0 || qat_enter(o, m, keep, &err) < 0) {
            rc = cli_fail("train", &err);
            break;
        }
        double loss = lp_train_forward(m, &bb.batch, &err);
        if (isnan(loss)) {
            qat_leave(o, m, keep);
            rc = cli_fail("train", &err);
            break;
        }
        lp_train_zero_grad(m);
        lp_train_backward(m, &bb.batch);
        qat_leave(o, m, keep); /* the gradient at the rounded point updates the FP32 weights */
        float lr = lp_train_lr(&opt->cfg, opt->step);
        float norm = lp_adamw_step(opt, m);
        long done = step + 1 - start;
        double elapsed = lp_now_seconds() - t0;
        double tps = (double)done * tokens_per_step / (elapsed > 0 ? elapsed : 1e-9);
        char eta[32];
        format_eta(elapsed / (double)done * (double)(o->steps - step - 1), eta, sizeof eta);
        if (tty || (step + 1) % o->log_every == 0 || step + 1 == o->steps)
            fprintf(stderr, "%sstep %ld/%ld | loss %.4f | lr %.2e | grad %.3f | %.0f tok/s | ETA %s%s",
                    tty ? "\r" : "", step + 1, o->steps, loss, lr, norm, tps, eta,
                    tty ? "   " : "\n");
        bool last = step + 1 == o->steps;
        if (eval && o->eval_every > 0 && ((step + 1) % o->eval_every == 0 || last)) {
            if (qat_enter(o, m, keep, &err) < 0) {
                rc = cli_fail("train", &err);
                break;
            }
            double el = eval_loss(m, &bb, eval);
            if (tty) fputc('\n', stderr);
            fprintf(stderr, "eval step %ld: loss %.4f", step + 1, el);
            if (o->eval_match > 0)
                fprintf(stderr, " | exact match %.1f%%",
                        100.0 * eval_exact_match(m, eval, (int)o->eval_match, (int)o->seq));
            fputc('\n', stderr);
            qat_leave(o, m, keep);
        }
        if (o->checkpoint && ((o->ckpt_every > 0 && (step + 1) % o->ckpt_every == 0) || last)) {
            if (lp_checkpoint_save(o->checkpoint, m, opt, rng, &err) < 0) {
                rc = cli_fail("checkpoint", &err);
                break;
            }
        }
    }
    if (tty) fputc('\n', stderr);
    free(keep);
    lp_train_batch_free(&bb);
    (void)tok;
    return rc;
}

/* Shared setup: data, threads, optimizer; then the loop and the export. */
static int run_training(train_opts *o, lp_train_model *m, lp_adamw *opt, lp_rng *rng,
                        const lp_tokenizer *tok, const char *base_name) {
    lp_error err;
    int rc = 1;
    lp_train_data train = {0}, eval = {0};
    lp_threadpool *pool = NULL;
    if ((o->text && lp_train_data_load_text(&train, o->text, tok, &err) < 0) ||
        (o->data && lp_train_data_load_jsonl(&train, o->data, tok, &err) < 0) ||
        (o->eval && lp_train_data_load_jsonl(&eval, o->eval, tok, &err) < 0)) {
        cli_fail("data", &err);
        goto done;
    }
    fprintf(stderr, "data: %zu text tokens in %zu documents, %d records%s", train.n_stream,
            train.n_docs, train.n_ex, o->eval ? "" : "\n");
    if (o->eval) fprintf(stderr, "; eval: %d records\n", eval.n_ex);
    /* many lines, few documents: likely a file of one document per line */
    if (o->text && train.n_lines > 100 * train.n_docs)
        fprintf(stderr, "note: %s: %zu line breaks but %zu document(s): --text ends a document at a "
                        "blank line, and each ends in EOS, the only place a model learns to "
                        "end a text\n", o->text, train.n_lines, train.n_docs);
    pool = lp_threadpool_create(o->threads > 0 ? (int)o->threads : lp_default_threads(), &err);
    if (!pool || lp_train_model_reserve(m, (int)o->batch, (int)o->seq, &err) < 0) {
        cli_fail("train", &err);
        goto done;
    }
    lp_train_model_set_pool(m, pool);
    size_t n_train = 0;
    for (int g = 0; g < 3; g++) n_train += m->grad[g] ? m->group_size[g] : 0;
    fprintf(stderr, "model: dim %d, %d layers, %d/%d heads, ffn %d, vocab %d; %zu trainable "
            "parameters; %d threads\n", m->cfg.dim, m->cfg.n_layers, m->cfg.n_heads,
            m->cfg.n_kv_heads, m->cfg.ffn_dim, m->cfg.n_vocab, n_train, lp_threadpool_size(pool));
    opt->cfg.total_steps = (int)o->steps;
    if (train_loop(o, m, opt, rng, &train, o->eval ? &eval : NULL, tok) != 0) goto done;
    if (o->lora)
        rc = lp_train_export_peft(m, o->out, base_name, &err);
    else
        rc = lp_train_export_gguf(m, o->out, o->f16 ? LP_F16 : LP_F32, o->vocab, "loraplex-trained", &err);
    if (rc < 0) {
        rc = cli_fail("export", &err);
        goto done;
    }
    fprintf(stderr, "wrote %s\n", o->out);
    rc = 0;
done:
    lp_train_data_free(&train);
    lp_train_data_free(&eval);
    lp_threadpool_destroy(pool);
    return rc;
}

static void default_opts(train_opts *o, bool lora) {
    memset(o, 0, sizeof *o);
    o->lora = lora;
    o->dim = 128, o->layers = 4, o->heads = 4, o->kv_heads = 2, o->ffn = 384, o->ctx = 256;
    o->rank = 8, o->alpha = 16, o->targets = "q,k,v,o,gate,up,down";
    o->steps = 1000, o->batch = 16, o->seq = 128, o->warmup = 100, o->seed = 1;
    o->eval_every = 100, o->log_every = 10, o->eval_match = lora ? 16 : 0;
    o->lr = lora ? 2e-4 : 1e-3, o->min_lr = -1, o->wd = lora ? 0.0 : 0.1, o->clip = 1.0;
    o->theta = 10000;
}

static lp_adamw_config opts_adamw(const train_opts *o) {
    lp_adamw_config a = lp_adamw_default();
    a.lr = (float)o->lr;
    a.min_lr = o->min_lr >= 0 ? (float)o->min_lr : (float)o->lr / 10;
    a.warmup = (int)o->warmup;
    a.total_steps = (int)o->steps;
    a.weight_decay = (float)o->wd;
    a.grad_clip = (float)o->clip;
    return a;
}

int cli_train(int argc, char **argv) {
    train_opts o;
    default_opts(&o, false);
    int p = parse_train_opts(argc, argv, &o);
    if (p) return p == 1 ? 0 : 2;
    if (!o.vocab || !o.out || (!o.text && !o.data)) {
        fprintf(stderr, "loraplex train: --vocab, -o and --text or --data are required\n");
        train_usage(stderr, false);
        return 2;
    }
    lp_error err;
    lp_gguf *vg = lp_gguf_open(o.vocab, &err);
    lp_tokenizer *tok = vg ? lp_tokenizer_from_gguf(vg, &err) : NULL;
    if (!tok) {
        if (vg) lp_gguf_close(vg);
        return cli_fail(o.vocab, &err);
    }
    lp_train_model *m = NULL;
    lp_adamw opt = {0};
    lp_rng rng;
    int rc = 1;
    if (o.resume) {
        if (lp_checkpoint_load(o.resume, &m, &opt, &rng, &err) < 0) {
            cli_fail("resume", &err);
            goto done;
        }
        fprintf(stderr, "resumed %s at step %ld\n", o.resume, opt.step);
    } else {
        lp_train_config c = {
            .n_vocab = lp_tokenizer_n_vocab(tok), .dim = (int)o.dim, .n_layers = (int)o.layers,
            .n_heads = (int)o.heads, .n_kv_heads = (int)o.kv_heads,
            .head_dim = (int)(o.dim / o.heads), .ffn_dim = (int)o.ffn, .n_ctx = (int)o.ctx,
            .rope_theta = (float)o.theta, .rms_eps = 1e-5f, .tied_output = o.tied,
        };
        if (o.dim % o.heads != 0) {
            fprintf(stderr, "loraplex train: --dim must be a multiple of --heads\n");
            goto done;
        }
        m = lp_train_model_create(&c, LP_TRAIN_BASE, &err);
        lp_adamw_config a = opts_adamw(&o);
        if (!m || lp_adamw_init(&opt, m, &a, &err) < 0) {
            cli_fail("train", &err);
            goto done;
        }
        lp_train_model_init(m, LP_TRAIN_BASE, (uint64_t)o.seed);
        lp_rng_seed(&rng, (uint64_t)o.seed);
    }
    if (o.seq > m->cfg.n_ctx) {
        fprintf(stderr, "loraplex train: --seq %ld exceeds the context %d\n", o.seq, m->cfg.n_ctx);
        goto done;
    }
    rc = run_training(&o, m, &opt, &rng, tok, NULL);
done:
    lp_adamw_free(&opt);
    lp_train_model_free(m);
    lp_tokenizer_free(tok);
    lp_gguf_close(vg);
    return rc;
}

int cli_train_lora(int argc, char **argv) {
    train_opts o;
    default_opts(&o, true);
    int p = parse_train_opts(argc, argv, &o);
    if (p) return p == 1 ? 0 : 2;
    if (!o.base || !o.out || (!o.data && !o.text)) {
        fprintf(stderr, "loraplex train-lora: --base, --data and -o are required\n");
        train_usage(stderr, true);
        return 2;
    }
    lp_error err;
    lp_model *base = lp_model_load(o.base, NULL, &err);
    if (!base) return cli_fail(o.base, &err);
    lp_adapter *init = NULL;
    lp_train_model *m = NULL;
    lp_adamw opt = {0};
    lp_rng rng;
    int rc = 1;
    if (o.resume || o.init_from) {
        const char *from = o.resume ? o.resume : o.init_from;
        if (lp_checkpoint_load(from, &m, &opt, &rng, &err) < 0) {
            cli_fail(from, &err);
            goto done;
        }
        if (m->trainable != LP_TRAIN_LORA) {
            fprintf(stderr, "loraplex train-lora: %s is not a LoRA checkpoint\n", from);
            goto done;
        }
        if (!o.resume) {
            /* warm start: keep the weights, start the optimization afresh */
            lp_adamw_free(&opt);
            lp_adamw_config a = opts_adamw(&o);
            if (lp_adamw_init(&opt, m, &a, &err) < 0) {
                cli_fail("train-lora", &err);
                goto done;
            }
            lp_rng_seed(&rng, (uint64_t)o.seed);
        }
        fprintf(stderr, "%s %s at step %ld\n", o.resume ? "resumed" : "initialized from", from,
                opt.step);
    } else {
        lp_train_config c;
        if (lp_train_config_from_model(base, &c, &err) < 0 ||
            lp_train_parse_targets(o.targets, &c.lora_targets, &err) < 0) {
            cli_fail("train-lora", &err);
            goto done;
        }
        c.lora_rank = (int)o.rank;
        c.lora_alpha = (float)o.alpha;
        if (o.init_adapter) {
            /* rank, alpha and targets are the adapter's */
            if (!(init = lp_adapter_load(base, o.init_adapter, 1.0f, &err)) ||
                lp_train_config_from_adapter(init, &c, &err) < 0) {
                cli_fail(o.init_adapter, &err);
                goto done;
            }
        }
        m = lp_train_model_create(&c, LP_TRAIN_LORA, &err);
        lp_adamw_config a = opts_adamw(&o);
        if (!m || lp_train_model_load_base(m, base, &err) < 0 ||
            lp_adamw_init(&opt, m, &a, &err) < 0) {
            cli_fail("train-lora", &err);
            goto done;
        }
        lp_train_model_init(m, LP_TRAIN_LORA, (uint64_t)o.seed);
        if (init && lp_train_lora_from_adapter(m, init, &err) < 0) {
            cli_fail(o.init_adapter, &err);
            goto done;
        }
        if (init)
            fprintf(stderr, "initialized from %s (rank %d, alpha %g)\n", o.init_adapter, c.lora_rank,
                    (double)c.lora_alpha);
        lp_rng_seed(&rng, (uint64_t)o.seed);
    }
    rc = run_training(&o, m, &opt, &rng, base->tok, o.base);
done:
    lp_adamw_free(&opt);
    lp_train_model_free(m);
    lp_adapter_free(init);
    lp_model_free(base);
    return rc;
}

/* ---- loraplex quantize ------------------------------------------------------------- */

/* llama.cpp's general.file_type for a model whose matrices are all `type`. */
static uint32_t file_type_of(uint32_t type) {
    switch (type) {
    case LP_F16: return 1;
    case LP_Q4_0: return 2;
    case LP_Q8_0: return 7;
    default: return 0;
    }
}

/* One tensor: 2-D F32/F16 matrices whose rows split into whole blocks are
 * quantized row by row; everything else (norms, odd shapes, already
 * quantized tensors) is copied as it is. */
static int quantize_tensor(lp_gguf_writer *w, const lp_gguf_tensor *t, uint32_t type,
                           size_t *n_quantized, lp_error *err) {
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
    int64_t cols = (int64_t)t->dims[0], rows = (int64_t)(t->n_elements / t->dims[0]);
    bool matrix = t->n_dims == 2 && (t->type == LP_F32 || t->type == LP_F16) &&
                  lp_dtype_row_bytes(type, (uint64_t)cols) != 0;
    if (!matrix) {
        lp_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->dims, t->data, t->n_bytes);
        return 0;
    }
    size_t row_bytes = lp_dtype_row_bytes(type, cols), total;
    if (row_bytes == 0 || !lp_mul_ok((size_t)rows, row_bytes, &total))
        return lp_fail(err, "tensor %s: size overflows", name);
    uint8_t *out = malloc(total);
    float *row = malloc((size_t)cols * sizeof *row);
    if (!out || !row) {
        free(out);
        free(row);
        return lp_error_set(err, LP_ERR_NOMEM, "out of memory for tensor %s", name);
    }
    for (int64_t r = 0; r < rows; r++) {
        if (t->type == LP_F32) {
            memcpy(row, (const float *)t->data + r * cols, (size_t)cols * sizeof *row);
        } else {
            const uint8_t *src = (const uint8_t *)t->data + (size_t)(r * cols) * 2;
            for (int64_t c = 0; c < cols; c++) {
                uint16_t h;
                memcpy(&h, src + c * 2, 2);
                row[c] = lp_f16_to_f32(h);
            }
        }
        lp_quantize_row(type, row, out + (size_t)r * row_bytes, cols);
    }
    lp_gguf_writer_add_tensor_copy(w, name, type, t->n_dims, t->dims, out, total);
    free(out);
    free(row);
    (*n_quantized)++;
    return 0;
}

static bool parse_quant_type(const char *name, uint32_t *out) {
    if (!strcmp(name, "q8_0")) *out = LP_Q8_0;
    else if (!strcmp(name, "q4_0")) *out = LP_Q4_0;
    else if (!strcmp(name, "f16")) *out = LP_F16;
    else return false;
    return true;
}

int cli_quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *type_name = "q8_0", *output_name = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: loraplex quantize IN.gguf OUT.gguf [--type q8_0|q4_0|f16]\n"
                   "                         [--output-type q8_0|q4_0|f16]\n"
                   "Writes a copy of a llama GGUF with its F32/F16 matrices quantized (round to\n"
                   "nearest, llama.cpp block layouts); norms and metadata are copied. The\n"
                   "output matrix (the token embedding when tied) gets --output-type (default:\n"
                   "q8_0 for --type q4_0, else --type).\n");
            return 0;
        }
        if (!strcmp(a, "--type")) {
            if (!(type_name = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--output-type")) {
            if (!(output_name = cli_value(argc, argv, &i))) return 2;
        } else if (a[0] == '-') {
            fprintf(stderr, "loraplex quantize: unknown option '%s'\n", a);
            return 2;
        } else if (!in) {
            in = a;
        } else if (!out) {
            out = a;
        } else {
            fprintf(stderr, "loraplex quantize: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    uint32_t type, output_type;
    if (!parse_quant_type(type_name, &type) ||
        !parse_quant_type(output_name ? output_name : type == LP_Q4_0 ? "q8_0" : type_name,
                          &output_type)) {
        fprintf(stderr, "loraplex quantize: types are q8_0, q4_0 or f16\n");
        return 2;
    }
    if (!in || !out) {
        fprintf(stderr, "usage: loraplex quantize IN.gguf OUT.gguf [--type q8_0|q4_0|f16]\n");
        return 2;
    }
    lp_error err;
    lp_gguf *g = lp_gguf_open(in, &err);
    if (!g) return cli_fail(in, &err);
    lp_gguf_writer *w = lp_gguf_writer_create();
    int rc = 1;
    size_t n_quantized = 0;
    if (!w) {
        fprintf(stderr, "loraplex quantize: out of memory\n");
        goto done;
    }
    for (size_t i = 0; i < lp_gguf_kv_count(g); i++) {
        const lp_gguf_kv *kv = lp_gguf_kv_at(g, i);
        if (!lp_str_eq(kv->key, "general.file_type")) lp_gguf_writer_copy_kv(w, kv);
    }
    lp_gguf_writer_set_u32(w, "general.file_type", file_type_of(type));
    for (size_t i = 0; i < lp_gguf_tensor_count(g); i++) {
        const lp_gguf_tensor *t = lp_gguf_tensor_at(g, i);
        /* The output matrix (the token embedding when tied) decides every
         * token, EOS included: like llama.cpp's Q4_0 files, keep it at
         * higher precision unless asked otherwise. */
        bool output = lp_str_eq(t->name, "output.weight") ||
                      (lp_str_eq(t->name, "token_embd.weight") &&
                       !lp_gguf_find_tensor(g, "output.weight"));
        if (quantize_tensor(w, t, output ? output_type : type, &n_quantized, &err) < 0) {
            cli_fail(in, &err);
            goto done;
        }
    }
    if (lp_gguf_writer_write(w, out, &err) < 0) {
        cli_fail(out, &err);
        goto done;
    }
    fprintf(stderr, "wrote %s: %zu of %zu tensors quantized (%s, output %s)\n", out,
            n_quantized, lp_gguf_tensor_count(g), lp_dtype_name(type), lp_dtype_name(output_type));
    rc = 0;
done:
    lp_gguf_writer_free(w);
    lp_gguf_close(g);
    return rc;
}
