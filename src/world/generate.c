/* Writes a demo-world corpus directory: pretraining text, per-task train and
 * eval JSONL, a BPE vocabulary trained on the training text, and a README. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "world2.h"
#include "world_internal.h"

lp_world_params lp_world_default_params(void) {
    return (lp_world_params){.version = 1, .seed = 1, .stories = 40000, .per_task = 3000,
                             .correct_factor = 10, .eval_per_task = 300, .eval_percent = 10,
                             .vocab_size = 768};
}

int world_make_dir(const char *path, lp_error *err) {
    if (mkdir(path, 0755) == 0 || errno == EEXIST) return 0;
    return lp_fail(err, "%s: cannot create directory: %s", path, strerror(errno));
}

/* JSON string with escapes (our texts are ASCII, but be correct anyway). */
static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

void world_write_record(FILE *f, const lp_world_record *r) {
    fputs("{\"task\":", f);
    json_str(f, r->task);
    fputs(",\"lang\":", f);
    json_str(f, r->lang);
    if (r->style[0]) {
        fputs(",\"style\":", f);
        json_str(f, r->style);
    }
    fputs(",\"prompt\":", f);
    json_str(f, r->prompt);
    fputs(",\"completion\":", f);
    json_str(f, r->completion);
    fputs("}\n", f);
}

uint64_t world_hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h | 1; /* 0 marks an empty slot */
}

/* A set of 64-bit hashes (open addressing) to drop duplicate prompts. */
bool world_set_insert(world_hash_set *s, uint64_t h) {
    size_t j = h & s->mask;
    for (; s->slots[j]; j = (j + 1) & s->mask)
        if (s->slots[j] == h) return false;
    s->slots[j] = h;
    return true;
}

FILE *world_open_out(const char *dir, const char *name, char *path, size_t cap,
                      lp_error *err) {
    snprintf(path, cap, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) lp_fail(err, "%s: cannot write: %s", path, strerror(errno));
    return f;
}

int world_close_out(FILE *f, const char *path, lp_error *err) {
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) return lp_fail(err, "%s: write failed", path);
    return 0;
}

/* Where a task's records go; NULL members are skipped. */
int world_draw_records(const world_draw *d, lp_error *err) {
    size_t want = (size_t)d->n_train + (size_t)d->n_eval, cap = 1024;
    while (cap < want * 4) cap *= 2;
    world_hash_set seen = {.slots = calloc(cap, sizeof(uint64_t)), .mask = cap - 1};
    lp_world_record *r = malloc(sizeof *r);
    int rc = -1;
    if (!seen.slots || !r) {
        lp_fail(err, "out of memory");
        goto done;
    }
    lp_rng rng;
    lp_rng_seed(&rng, d->seed);
    int n_train = 0, n_eval = 0;
    for (uint64_t attempt = 0; n_train < d->n_train || n_eval < d->n_eval; attempt++) {
        if (attempt > (uint64_t)want * 50) {
            lp_fail(err, "%s: could not find %zu distinct records (got %d train, %d eval)", d->task_name, want,
                    n_train, n_eval);
            goto done;
        }
        int lang = (int)(attempt % (uint64_t)d->n_langs);
        uint64_t key = d->make(d->user, &rng, d->task, lang, r);
        bool eval = lp_world_key_is_eval(key, d->eval_percent);
        if (eval ? n_eval >= d->n_eval : n_train >= d->n_train) continue;
        if (!world_set_insert(&seen, world_hash_str(r->prompt))) continue;
        FILE *f = eval ? d->eval : d->train;
        if (f) world_write_record(f, r);
        if (eval) {
            n_eval++;
            continue;
        }
        if (d->first && n_train == 0) *d->first = *r;
        if (d->by_lang && !d->by_lang[lang].task[0]) d->by_lang[lang] = *r;
        if (d->bpe && n_train < d->per_task &&
            (lp_bpe_add_text(d->bpe, r->prompt, strlen(r->prompt), err) != 0 ||
             lp_bpe_add_text(d->bpe, r->completion, strlen(r->completion), err) != 0))
            goto done;
        n_train++;
    }
    if (d->st) {
        d->st->task_train_records += (size_t)n_train;
        d->st->task_eval_records += (size_t)n_eval;
    }
    rc = 0;
done:
    free(seen.slots);
    free(r);
    return rc;
}

/* Version 1's records; user: whether they are the first generator's
 * correction records (see write_task). */
static uint64_t make_v1(const void *user, lp_rng *rng, int task, int lang, lp_world_record *r) {
    return world_make_record(rng, task, lang, *(const bool *)user, r);
}

static int draw_task(int task, const lp_world_params *p, int n_train, bool v1, FILE *train, FILE *eval,
                     lp_bpe *bpe, lp_world_record *first, lp_world_stats *st, lp_error *err) {
    world_draw d = {
        .task_name = lp_world_task_name(task), .task = task, .n_langs = LP_N_LANGS,
        .make = make_v1, .user = &v1,
        .seed = p->seed * 1000003u + (uint64_t)task * 7919u + 17u,
        .n_train = n_train, .n_eval = p->eval_per_task, .per_task = p->per_task, .eval_percent = p->eval_percent,
        .train = train, .eval = eval, .bpe = bpe, .first = first, .st = st,
    };
    return world_draw_records(&d, err);
}

/* One task's train and eval files. The correction task gets correct_factor
 * times per_task train records, and a third file, correct.v1.train.jsonl:
 * per_task records as the first generator version made them (some of its
 * agreement errors had two right answers). The BPE vocabulary learns from
 * the first per_task train records of each task, for the correction task
 * from the v1 records, so that the vocabulary, and the demo base and the
 * adapters' shared warm start made from it, stay reproducible. */
static int write_task(const char *dir, int task, const lp_world_params *p, lp_bpe *bpe,
                      lp_world_record *first, lp_world_stats *st, lp_error *err) {
    char path_tr[1024], path_ev[1024], name[64];
    const char *tname = lp_world_task_name(task);
    snprintf(name, sizeof name, "tasks/%s.train.jsonl", tname);
    FILE *tr = world_open_out(dir, name, path_tr, sizeof path_tr, err);
    if (!tr) return -1;
    snprintf(name, sizeof name, "tasks/%s.eval.jsonl", tname);
    FILE *ev = world_open_out(dir, name, path_ev, sizeof path_ev, err);
    if (!ev) {
        fclose(tr);
        return -1;
    }
    bool correct = task == lp_world_task_from_name("correct");
    FILE *v1 = NULL;
    char path_v1[1024];
    int rc = 0;
    if (correct) {
        snprintf(name, sizeof name, "tasks/%s.v1.train.jsonl", tname);
        v1 = world_open_out(dir, name, path_v1, sizeof path_v1, err);
        rc = v1 ? 0 : -1;
    }
    if (rc == 0 && correct) rc = draw_task(task, p, p->per_task, true, v1, NULL, bpe, NULL, NULL, err);
    if (rc == 0) {
        int n_train = correct ? p->per_task * p->correct_factor : p->per_task;
        rc = draw_task(task, p, n_train, false, tr, ev, correct ? NULL : bpe, first, st, err);
    }
    int rc_v1 = v1 ? world_close_out(v1, path_v1, rc == 0 ? err : NULL) : 0;
    int rc_tr = world_close_out(tr, path_tr, rc == 0 ? err : NULL);
    int rc_ev = world_close_out(ev, path_ev, rc == 0 ? err : NULL);
    return rc != 0 ? rc : rc_v1 != 0 ? rc_v1 : rc_tr != 0 ? rc_tr : rc_ev;
}

static int write_pretrain(const char *dir, const lp_world_params *p, lp_bpe *bpe,
                          lp_world_stats *st, lp_error *err) {
    char path[1024], line[2048];
    FILE *f = world_open_out(dir, "pretrain.txt", path, sizeof path, err);
    if (!f) return -1;
    lp_rng rng;
    lp_rng_seed(&rng, p->seed * 1000003u + 99991u);
    for (int i = 0; i < p->stories; i++) {
        int n = lp_world_pretrain_line(&rng, p->eval_percent, line, sizeof line);
        if (n < 0) {
            fclose(f);
            return lp_fail(err, "%s: a pretraining line did not fit", path);
        }
        if (lp_bpe_add_text(bpe, line, (size_t)n, err) != 0) {
            fclose(f);
            return -1;
        }
        fwrite(line, 1, (size_t)n, f);
        fputc('\n', f);
        st->pretrain_bytes += (size_t)n + 1;
        st->pretrain_lines++;
    }
    return world_close_out(f, path, err);
}

static void readme_example(FILE *f, const lp_world_record *r) {
    char prompt[sizeof r->prompt];
    snprintf(prompt, sizeof prompt, "%s", r->prompt);
    size_t n = strlen(prompt);
    if (n && prompt[n - 1] == '\n') prompt[n - 1] = '\0';
    fprintf(f, "| %s | %s | `%s` | `%s` |\n", r->task, r->lang, prompt, r->completion);
}

static int write_readme(const char *dir, const lp_world_params *p, const lp_world_stats *st,
                        const lp_world_record *firsts, lp_error *err) {
    char path[1024];
    FILE *f = world_open_out(dir, "README.md", path, sizeof path, err);
    if (!f) return -1;
    fprintf(f,
            "# loraplex demo world corpus\n\n"
            "Made by `%s` (seed %llu): everything here is a deterministic function of the\n"
            "seed and the generator's code (src/world/).\n\n"
            "## Files\n\n"
            "- `pretrain.txt`: %zu documents, one per line (%zu bytes): short stories in\n"
            "  three languages (en English-lite SVO, vo Velo SOV, ka Karu VSO) and\n"
            "  sentence pairs `<sentence> = <same meaning in another language>`.\n"
            "  No sentence whose meaning is reserved for evaluation appears here.\n"
            "- `tasks/<task>.train.jsonl`, `tasks/<task>.eval.jsonl`: %zu train and %zu eval\n"
            "  records in all, `{\"task\",\"lang\",[\"style\"],\"prompt\",\"completion\"}`:\n"
            "  %d train records per task, %d for `correct` (its misspellings are\n"
            "  learnt from many examples), %d eval records per task.\n"
            "  `tasks/correct.v1.train.jsonl`: the first generator version's correction\n"
            "  records (some of its agreement errors had two right answers), kept because\n"
            "  the vocabulary and the demo adapters' shared warm start were made from them.\n"
            "  `style-curious` is a fifth style that the demo's adapters never train on\n"
            "  and the vocabulary never saw (QUAD's over-the-air adapter, docs/quad.md).\n"
            "  Train and eval never share a meaning (split by a hash of the meaning's\n"
            "  core: subject, verb, object, tense; %d%% of cores are eval).\n"
            "  The model input is BOS + prompt (which ends in a newline) + completion +\n"
            "  EOS; generation stops at EOS or a newline.\n"
            "- `vocab.gguf`: a byte-level BPE vocabulary (%d tokens: <s>=0, </s>=1,\n"
            "  <pad>=2, 256 bytes, merges) trained on pretrain.txt and the train records\n"
            "  (not style-curious's).\n"
            "  tokenizer.ggml.model = gpt2, pre = gpt2. Copy it into the model.\n\n"
            "## Tasks (first train record of each)\n\n"
            "| task | lang | prompt | completion |\n|---|---|---|---|\n",
            p->command ? p->command : "loraplex world", (unsigned long long)p->seed,
            st->pretrain_lines, st->pretrain_bytes, st->task_train_records,
            st->task_eval_records, p->per_task, p->per_task * p->correct_factor,
            p->eval_per_task, p->eval_percent, st->vocab_size);
    for (int t = 0; t < LP_WORLD_N_ALL_TASKS; t++) readme_example(f, &firsts[t]);
    fprintf(f,
            "\n## Recommended training (2-core CPU)\n\n"
            "Base model, trained from scratch on pretrain.txt only (it never sees a task\n"
            "prompt, so it should do poorly on the tasks): Llama architecture, dim 128,\n"
            "4 layers, 4 heads (head dim 32), FFN 384 (SwiGLU), tied embeddings, context\n"
            "256, vocabulary from vocab.gguf: about 0.95 M parameters. At ~6 FLOP per\n"
            "parameter per token and roughly 10 GFLOP/s of f32 on two cores, that is\n"
            "~1500-3000 tokens/s, so ~2 M tokens in ~15-20 minutes. pretrain.txt is\n"
            "~1.3 M tokens with the default settings (documents of <= ~80 tokens: pack\n"
            "several per sequence): e.g. 2000 steps of 4 x 256 tokens (~1.6 passes), AdamW lr 3e-3\n"
            "with warm-up 100 and cosine decay to 3e-4, weight decay 0.1.\n\n"
            "One LoRA adapter per task file (style: one per style), rank 8, alpha 16,\n"
            "on q,k,v,o,gate,up,down, loss on completion tokens only, AdamW lr 2e-3,\n"
            "~600-1000 steps of 16 records (a few minutes each).\n\n"
            "Commands, with WORLD set to this directory (flag names to be matched to the\n"
            "trainer's CLI):\n\n"
            "    loraplex train base --data $WORLD/pretrain.txt --vocab $WORLD/vocab.gguf \\\n"
            "        --dim 128 --layers 4 --heads 4 --ffn 384 --ctx 256 \\\n"
            "        --batch 4 --steps 2000 --lr 3e-3 -o base.gguf\n"
            "    for t in correct style-formal style-polite style-jovial style-terse \\\n"
            "             summary reply translate; do\n"
            "      loraplex train lora -m base.gguf --data $WORLD/tasks/$t.train.jsonl \\\n"
            "          --rank 8 --alpha 16 --batch 16 --steps 800 --lr 2e-3 -o $t.lpa\n"
            "    done\n"
            "    loraplex eval-tasks -m base.gguf --quantized base-w4a8.lpx \\\n"
            "        --adapters correct=correct.lpa,style-formal=style-formal.lpa,... \\\n"
            "        --data $WORLD/tasks\n");
    return world_close_out(f, path, err);
}

int lp_world_generate(const char *dir, const lp_world_params *p, lp_world_stats *stats,
                      lp_error *err) {
    if (p->version == 2) return lp_world2_generate(dir, p, stats, err);
    if (p->version != 1)
        return lp_fail(err, "world: version %d unknown (1 or 2)", p->version);
    lp_world_stats st = {0};
    char tasks_dir[1024];
    if (p->stories < 0 || p->per_task < 1 || p->eval_per_task < 1 || p->eval_percent < 1 ||
        p->eval_percent > 50 || p->correct_factor < 1 || p->correct_factor > 1000 ||
        p->per_task > 10000000 / p->correct_factor)
        return lp_fail(err, "world: bad parameters (stories %d, per task %d, correct factor "
                            "%d, eval %d, eval percent %d)", p->stories, p->per_task,
                       p->correct_factor, p->eval_per_task, p->eval_percent);
    snprintf(tasks_dir, sizeof tasks_dir, "%s/tasks", dir);
    if (world_make_dir(dir, err) != 0 || world_make_dir(tasks_dir, err) != 0) return -1;
    lp_bpe *bpe = lp_bpe_create(err);
    if (!bpe) return -1;
    lp_world_record firsts[LP_WORLD_N_ALL_TASKS];
    memset(firsts, 0, sizeof firsts);
    int rc = -1;
    double t0 = lp_now_seconds();
    if (write_pretrain(dir, p, bpe, &st, err) != 0) goto done;
    for (int t = 0; t < LP_WORLD_N_ALL_TASKS; t++) /* style-curious leaves the vocabulary alone */
        if (write_task(dir, t, p, t < LP_WORLD_N_TASKS ? bpe : NULL, &firsts[t], &st, err) != 0) goto done;
    double t1 = lp_now_seconds();
    if (lp_bpe_train(bpe, p->vocab_size, err) != 0) goto done;
    char path[1024];
    snprintf(path, sizeof path, "%s/vocab.gguf", dir);
    if (lp_bpe_write_gguf(bpe, path, err) != 0) goto done;
    st.vocab_size = lp_bpe_n_vocab(bpe);
    st.seconds_text = t1 - t0;
    st.seconds_bpe = lp_now_seconds() - t1;
    if (write_readme(dir, p, &st, firsts, err) != 0) goto done;
    if (stats) *stats = st;
    rc = 0;
done:
    lp_bpe_free(bpe);
    return rc;
}
