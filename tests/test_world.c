/* The demo world: deterministic corpus, disjoint splits, consistent ground
 * truth, chrF, and a BPE vocabulary our runtime tokenizer reproduces. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"
#include "world/world.h"
#include "world/world_internal.h"

#ifndef LP_BINARY_DIR
#define LP_BINARY_DIR "/tmp"
#endif

/* ---- small helpers ------------------------------------------------------- */

static char *read_all(const char *path, size_t *n) {
    char *data = NULL;
    lp_error err;
    if (lp_read_file(path, &data, n, (size_t)1 << 30, &err) != 0) {
        fprintf(stderr, "%s\n", err.message);
        return NULL;
    }
    return data;
}

static bool files_equal(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *da = read_all(a, &na), *db = read_all(b, &nb);
    bool eq = da && db && na == nb && memcmp(da, db, na) == 0;
    free(da);
    free(db);
    return eq;
}

/* A growable set of strings (linear probing on FNV-1a). */
typedef struct str_set {
    char **slots;
    size_t mask, n;
} str_set;

static uint64_t fnv(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static void set_init(str_set *s) {
    s->mask = (1u << 18) - 1;
    s->slots = calloc(s->mask + 1, sizeof *s->slots);
    s->n = 0;
}

static bool set_has(const str_set *s, const char *k) {
    for (size_t j = fnv(k) & s->mask; s->slots[j]; j = (j + 1) & s->mask)
        if (strcmp(s->slots[j], k) == 0) return true;
    return false;
}

static void set_add(str_set *s, const char *k) {
    if (set_has(s, k) || s->n * 2 > s->mask) return;
    size_t j = fnv(k) & s->mask;
    while (s->slots[j]) j = (j + 1) & s->mask;
    s->slots[j] = strdup(k);
    s->n++;
}

static void set_free(str_set *s) {
    for (size_t j = 0; j <= s->mask; j++) free(s->slots[j]);
    free(s->slots);
}

/* The text after "tag: " of a prompt, without its final newline. */
static void prompt_body(const char *prompt, char *out, size_t cap) {
    const char *p = strstr(prompt, ": ");
    snprintf(out, cap, "%s", p ? p + 2 : prompt);
    size_t n = strlen(out);
    if (n && out[n - 1] == '\n') out[n - 1] = '\0';
}

typedef struct rec {
    char task[32], lang[16], prompt[1024], completion[1024];
} rec;

/* Reads a JSONL task file into an array (returns count, -1 on error). */
static int read_records(const char *path, rec **out) {
    size_t n = 0;
    char *data = read_all(path, &n);
    if (!data) return -1;
    int count = 0, cap = 0;
    rec *rs = NULL;
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        if (!j) continue;
        if (count == cap) {
            cap = cap ? cap * 2 : 256;
            rs = realloc(rs, (size_t)cap * sizeof *rs);
        }
        rec *r = &rs[count++];
        const char *keys[4] = {"task", "lang", "prompt", "completion"};
        char *dst[4] = {r->task, r->lang, r->prompt, r->completion};
        size_t caps[4] = {sizeof r->task, sizeof r->lang, sizeof r->prompt, sizeof r->completion};
        for (int k = 0; k < 4; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, keys[k]);
            snprintf(dst[k], caps[k], "%s", cJSON_IsString(v) ? v->valuestring : "");
        }
        cJSON_Delete(j);
    }
    free(data);
    *out = rs;
    return count;
}

/* ---- corpus ---------------------------------------------------------------- */

static lp_world_params small_params(void) {
    lp_world_params p = lp_world_default_params();
    p.seed = 42;
    p.stories = 1500;
    p.per_task = 150;
    p.eval_per_task = 30;
    p.vocab_size = 420;
    return p;
}

/* Version 1 stays as it was (old figures can be rerun): a small corpus for
 * seed 1 hashes (FNV-1a 64 per file) as the generator before version 2
 * wrote it. tests/cli_world.sh pins the full default corpus by SHA-256. */
static uint64_t file_fnv(const char *path) {
    size_t n = 0;
    char *d = read_all(path, &n);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; d && i < n; i++) h = (h ^ (unsigned char)d[i]) * 1099511628211ull;
    free(d);
    return d ? h : 0;
}

static void test_v1_pinned(const char *dir) {
    static const struct { const char *file; uint64_t fnv; } pins[] = {
        {"README.md", 0x28ff861f994fd043ull},
        {"pretrain.txt", 0xec4d421082be4a21ull},
        {"vocab.gguf", 0x274fc08ea6fe8b47ull},
        {"tasks/correct.v1.train.jsonl", 0xd2796d2abb65a402ull},
        {"tasks/correct.train.jsonl", 0x9615a6c1f498a591ull},
        {"tasks/correct.eval.jsonl", 0x2f3de430fda155eaull},
        {"tasks/style-formal.train.jsonl", 0xa6bfb0d964fd3df9ull},
        {"tasks/style-formal.eval.jsonl", 0xc18c53530fae4cbfull},
        {"tasks/style-polite.train.jsonl", 0xc4b7b088a4174ec3ull},
        {"tasks/style-polite.eval.jsonl", 0xd679d687393ecc81ull},
        {"tasks/style-jovial.train.jsonl", 0x0e016c3162254016ull},
        {"tasks/style-jovial.eval.jsonl", 0xfc89e017359302b3ull},
        {"tasks/style-terse.train.jsonl", 0xff698989453a330eull},
        {"tasks/style-terse.eval.jsonl", 0xe0b1b95aad1ba7f1ull},
        {"tasks/summary.train.jsonl", 0x09329b2462077ca3ull},
        {"tasks/summary.eval.jsonl", 0xaf85c2fa2e48f7caull},
        {"tasks/reply.train.jsonl", 0x7775cfcafcf352ffull},
        {"tasks/reply.eval.jsonl", 0x6fea8cf9e78179daull},
        {"tasks/translate.train.jsonl", 0x1492386b44553a97ull},
        {"tasks/translate.eval.jsonl", 0xd55b721aa2e10d62ull},
    };
    lp_world_params p = small_params();
    p.seed = 1;
    lp_error err;
    CHECK_MSG(lp_world_generate(dir, &p, NULL, &err) == 0, "%s", err.message);
    char path[1024];
    for (size_t i = 0; i < sizeof pins / sizeof pins[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, pins[i].file);
        uint64_t h = file_fnv(path);
        CHECK_MSG(h == pins[i].fnv, "v1 %s: fnv %016llx, pinned %016llx", pins[i].file,
                  (unsigned long long)h, (unsigned long long)pins[i].fnv);
    }
}

static void test_determinism(const char *dir_a, const char *dir_b) {
    lp_world_params p = small_params();
    lp_error err;
    lp_world_stats st;
    CHECK_MSG(lp_world_generate(dir_a, &p, &st, &err) == 0, "%s", err.message);
    CHECK(lp_world_generate(dir_b, &p, NULL, &err) == 0);
    CHECK(st.pretrain_lines == 1500);
    /* the correction task gets correct_factor (10) times the train records */
    CHECK(st.task_train_records == 150 * (LP_WORLD_N_TASKS - 1) + 1500);
    CHECK(st.task_eval_records == 30 * LP_WORLD_N_TASKS);
    CHECK(st.vocab_size == 420);
    char a[1024], b[1024];
    const char *files[] = {"pretrain.txt", "vocab.gguf", "README.md"};
    for (int i = 0; i < 3; i++) {
        snprintf(a, sizeof a, "%s/%s", dir_a, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir_b, files[i]);
        CHECK_MSG(files_equal(a, b), "%s differs between runs", files[i]);
    }
    for (int t = 0; t < LP_WORLD_N_TASKS; t++)
        for (int e = 0; e < 2; e++) {
            const char *split = e ? "eval" : "train";
            snprintf(a, sizeof a, "%s/tasks/%s.%s.jsonl", dir_a, lp_world_task_name(t), split);
            snprintf(b, sizeof b, "%s/tasks/%s.%s.jsonl", dir_b, lp_world_task_name(t), split);
            CHECK_MSG(files_equal(a, b), "%s differs between runs", a);
        }
    /* fewer correction records change nothing else: the same vocabulary,
     * pretraining text, eval files and other tasks, and the correction
     * train file is a prefix of the larger one */
    p.correct_factor = 1;
    CHECK(lp_world_generate(dir_b, &p, NULL, &err) == 0);
    const char *same[] = {"pretrain.txt", "vocab.gguf", "tasks/correct.eval.jsonl",
                          "tasks/correct.v1.train.jsonl", "tasks/summary.train.jsonl"};
    for (int i = 0; i < 5; i++) {
        snprintf(a, sizeof a, "%s/%s", dir_a, same[i]);
        snprintf(b, sizeof b, "%s/%s", dir_b, same[i]);
        CHECK_MSG(files_equal(a, b), "%s depends on the correction train count", same[i]);
    }
    size_t na = 0, nb = 0;
    snprintf(a, sizeof a, "%s/tasks/correct.train.jsonl", dir_a);
    snprintf(b, sizeof b, "%s/tasks/correct.train.jsonl", dir_b);
    char *da = read_all(a, &na), *db = read_all(b, &nb);
    CHECK(da && db && nb > 0 && na > 5 * nb && memcmp(da, db, nb) == 0);
    free(da);
    free(db);
    /* the first version's correction records (the vocabulary's), 150 of them */
    rec *v1 = NULL;
    snprintf(a, sizeof a, "%s/tasks/correct.v1.train.jsonl", dir_a);
    CHECK(read_records(a, &v1) == 150 && !strcmp(v1[0].task, "correct"));
    free(v1);
    p.correct_factor = 0;
    CHECK(lp_world_generate(dir_b, &p, NULL, &err) == -1 && strstr(err.message, "correct"));
    p.correct_factor = 10;
    /* another seed gives another corpus */
    p.seed = 43;
    p.stories = 10;
    CHECK(lp_world_generate(dir_b, &p, NULL, &err) == 0);
    snprintf(a, sizeof a, "%s/tasks/correct.train.jsonl", dir_a);
    snprintf(b, sizeof b, "%s/tasks/correct.train.jsonl", dir_b);
    CHECK(!files_equal(a, b));
}

/* Every sentence of the pretraining text: lines split after ". " and at
 * " = ". */
static void pretrain_sentences(const char *dir, str_set *out) {
    char path[1024], cur[1024];
    snprintf(path, sizeof path, "%s/pretrain.txt", dir);
    size_t n = 0, k = 0;
    char *data = read_all(path, &n);
    if (!data) return;
    for (size_t i = 0; i < n; i++) {
        if (data[i] == '\n' || (data[i] == ' ' && data[i + 1] == '=' && data[i + 2] == ' ')) {
            cur[k] = '\0';
            if (k) set_add(out, cur);
            k = 0;
            if (data[i] == ' ') i += 2;
            continue;
        }
        if (k + 1 < sizeof cur) cur[k++] = data[i];
        if (data[i] == '.' && data[i + 1] == ' ' && data[i + 2] != '=') {
            cur[k] = '\0';
            set_add(out, cur);
            k = 0;
            i++; /* the space */
        }
    }
    free(data);
}

static void test_splits_and_truth(const char *dir) {
    str_set train, pre;
    set_init(&train);
    set_init(&pre);
    pretrain_sentences(dir, &pre);
    CHECK(pre.n > 1000);
    rec *tr[LP_WORLD_N_TASKS] = {0}, *ev[LP_WORLD_N_TASKS] = {0};
    int ntr[LP_WORLD_N_TASKS], nev[LP_WORLD_N_TASKS];
    char path[1024], body[1024];
    for (int t = 0; t < LP_WORLD_N_TASKS; t++) {
        snprintf(path, sizeof path, "%s/tasks/%s.train.jsonl", dir, lp_world_task_name(t));
        ntr[t] = read_records(path, &tr[t]);
        snprintf(path, sizeof path, "%s/tasks/%s.eval.jsonl", dir, lp_world_task_name(t));
        nev[t] = read_records(path, &ev[t]);
        CHECK(ntr[t] == (strcmp(lp_world_task_name(t), "correct") ? 150 : 1500) &&
              nev[t] == 30);
        for (int i = 0; i < ntr[t]; i++) {
            prompt_body(tr[t][i].prompt, body, sizeof body);
            set_add(&train, body);
            set_add(&train, tr[t][i].completion);
        }
    }
    int shared = 0, in_pretrain = 0, identity = 0, n_correct = 0;
    for (int t = 0; t < LP_WORLD_N_TASKS; t++) {
        const char *task = lp_world_task_name(t);
        for (int i = 0; i < nev[t]; i++) {
            const rec *r = &ev[t][i];
            prompt_body(r->prompt, body, sizeof body);
            if (set_has(&train, body) || set_has(&train, r->completion)) shared++;
            /* the neutral sentences of eval meanings never reach pretraining */
            if (!strcmp(task, "translate") || !strcmp(task, "correct"))
                if (set_has(&pre, r->completion)) in_pretrain++;
            if (!strcmp(task, "translate") || !strncmp(task, "style-", 6))
                if (set_has(&pre, body)) in_pretrain++;
        }
        for (int e = 0; e < 2; e++) {
            const rec *rs = e ? ev[t] : tr[t];
            int n = e ? nev[t] : ntr[t];
            for (int i = 0; i < n; i++) {
                const rec *r = &rs[i];
                size_t pl = strlen(r->prompt);
                CHECK(!strcmp(r->task, task));
                /* the format contract: prompt ends the line, completion is one line */
                CHECK(pl > 0 && r->prompt[pl - 1] == '\n');
                CHECK(r->completion[0] && r->completion[0] != ' ' && !strchr(r->completion, '\n'));
                prompt_body(r->prompt, body, sizeof body);
                if (!strncmp(task, "style-", 6)) {
                    CHECK_MSG(strcmp(body, r->completion) != 0, "style is neutral: %s", body);
                    if (!strcmp(task, "style-terse")) CHECK(strlen(r->completion) < strlen(body));
                }
                if (!strcmp(task, "correct")) {
                    n_correct++;
                    if (!strcmp(body, r->completion)) identity++;
                    /* a fix changes little: an error drops at most a few letters */
                    CHECK(strlen(body) + 3 >= strlen(r->completion));
                }
            }
        }
    }
    CHECK_MSG(shared == 0, "%d eval sentences also in train", shared);
    CHECK_MSG(in_pretrain == 0, "%d eval sentences in pretrain.txt", in_pretrain);
    /* about one correction record in ten is already correct: identity */
    CHECK_MSG(identity > n_correct / 30 && identity < n_correct / 4, "%d of %d", identity,
              n_correct);
    for (int t = 0; t < LP_WORLD_N_TASKS; t++) {
        free(tr[t]);
        free(ev[t]);
    }
    set_free(&train);
    set_free(&pre);
}

/* Every correction prompt has exactly one right answer: over all tenses and
 * times of many meanings, and many error draws each, no prompt is made from
 * two different sentences. The first generator version's records (v1) did
 * have such prompts: in English an agreement error in the past ("the birds
 * sell") read like the present. */
static int ambiguous_corrections(bool v1) {
    str_set prompts, pairs;
    set_init(&prompts);
    set_init(&pairs);
    lp_rng rng;
    lp_rng_seed(&rng, 11);
    lp_world_record r;
    char pair[2048];
    for (int i = 0; i < 40; i++) {
        lp_meaning m;
        lp_world_random_meaning(&rng, false, &m);
        if (i % 2) /* plural subjects too (nouns 0..9 are agents) */
            m.subj = (lp_np){.name = -1, .noun = i % 10, .adj = -1, .plural = true};
        for (int tense = 0; tense < 3; tense++)
            for (int time = -1; time < 6; time++) {
                if ((time == WORLD_TIME_YESTERDAY && tense != LP_TENSE_PAST) ||
                    (time == WORLD_TIME_TOMORROW && tense != LP_TENSE_FUTURE))
                    continue;
                m.tense = tense;
                m.time = time;
                for (int lang = 0; lang < LP_N_LANGS; lang++)
                    for (int k = 0; k < 12; k++) {
                        world_make_correct(&rng, &m, lang, v1, &r);
                        set_add(&prompts, r.prompt);
                        snprintf(pair, sizeof pair, "%s%s", r.prompt, r.completion);
                        set_add(&pairs, pair);
                    }
            }
    }
    int ambiguous = (int)(pairs.n - prompts.n);
    set_free(&prompts);
    set_free(&pairs);
    return ambiguous;
}

static void test_corrections_unambiguous(void) {
    int now = ambiguous_corrections(false), before = ambiguous_corrections(true);
    CHECK_MSG(now == 0, "%d correction prompts have two answers", now);
    CHECK_MSG(before > 0, "the v1 records were ambiguous, the check should see it");
}

/* Rendering is injective in every language, so translation between any two
 * languages is a function and en -> xx -> en gives back the original. */
static void test_translation_round_trip(void) {
    lp_rng rng;
    lp_rng_seed(&rng, 7);
    enum { N = 1500 };
    static char text[LP_N_LANGS][N][256];
    static uint64_t key[N];
    for (int i = 0; i < N; i++) {
        lp_meaning m;
        lp_world_random_meaning(&rng, false, &m);
        key[i] = lp_world_meaning_key(&m);
        for (int l = 0; l < LP_N_LANGS; l++)
            CHECK(lp_world_render(&m, l, NULL, text[l][i], sizeof text[l][i]) > 0);
    }
    int bad = 0, round_trips = 0;
    for (int l = 0; l < LP_N_LANGS; l++) {
        str_set seen;
        set_init(&seen);
        for (int i = 0; i < N; i++) set_add(&seen, text[l][i]);
        /* distinct texts == distinct meanings */
        str_set keys;
        set_init(&keys);
        char k[32];
        for (int i = 0; i < N; i++) {
            snprintf(k, sizeof k, "%llx", (unsigned long long)key[i]);
            set_add(&keys, k);
        }
        if (seen.n != keys.n) bad++;
        set_free(&seen);
        set_free(&keys);
    }
    /* en -> vo -> en through the text alone: find the vo text's meaning */
    for (int i = 0; i < 200; i++)
        for (int j = 0; j < N; j++)
            if (!strcmp(text[LP_LANG_VO][j], text[LP_LANG_VO][i])) {
                round_trips += !strcmp(text[LP_LANG_EN][j], text[LP_LANG_EN][i]);
                break;
            }
    CHECK_MSG(bad == 0, "%d languages render two meanings alike", bad);
    CHECK(round_trips == 200);
    char buf[8];
    lp_meaning m;
    lp_world_random_meaning(&rng, true, &m);
    CHECK(lp_world_render(&m, LP_LANG_EN, NULL, buf, sizeof buf) == -1); /* bounded */
}

/* ---- chrF ---------------------------------------------------------------------- */

static void test_chrf(void) {
    CHECK_NEAR(lp_chrf("The dog saw the ball.", "The dog saw the ball."), 100.0, 1e-9);
    CHECK_NEAR(lp_chrf("", ""), 100.0, 1e-9);
    CHECK_NEAR(lp_chrf("abc", ""), 0.0, 1e-9);
    CHECK_NEAR(lp_chrf("", "abc"), 0.0, 1e-9);
    /* n=1: P=R=1/2; n=2: P=R=0 -> mean P=R=1/4 -> F=1/4 */
    CHECK_NEAR(lp_chrf("ab", "ac"), 25.0, 1e-9);
    /* n=1 only: P=1, R=1/2 -> F2 = 5*0.5/(4+0.5) */
    CHECK_NEAR(lp_chrf("a", "ab"), 100.0 * 2.5 / 4.5, 1e-9);
    /* whitespace is ignored */
    CHECK_NEAR(lp_chrf("a b c", "abc"), 100.0, 1e-9);
    /* recall weighs more than precision */
    CHECK(lp_chrf("abc", "abcdef") < lp_chrf("abcdef", "abc"));
    double near = lp_chrf("The dog saw the bal.", "The dog saw the ball.");
    CHECK(near > 80.0 && near < 100.0);
    CHECK(lp_chrf("xyz", "The dog saw the ball.") < 5.0);
}

/* ---- BPE ------------------------------------------------------------------------- */

typedef struct chunks {
    char out[512];
} chunks;

static void join_chunk(void *user, const char *c, size_t n) {
    chunks *ch = user;
    size_t l = strlen(ch->out);
    if (l + n + 2 < sizeof ch->out) {
        memcpy(ch->out + l, c, n);
        ch->out[l + n] = '|';
        ch->out[l + n + 1] = '\0';
    }
}

static void test_pretokenizer(void) {
    chunks ch = {{0}};
    const char *text = "Hello  world\n\nit's en>vo: 42 ok?! \nx  ";
    lp_bpe_pretokenize(text, strlen(text), join_chunk, &ch);
    CHECK_MSG(!strcmp(ch.out, "Hello| | world|\n|\n|it|'s| en|>|vo|:| 42| ok|?!| |\n|x|  |"),
              "%s", ch.out);
}

/* The runtime tokenizer on our vocabulary segments text exactly like the
 * trainer, and decoding gives the text back. */
static int check_line(const lp_tokenizer *tok, const lp_bpe *bpe, const char *line) {
    int32_t a[512], b[512];
    lp_error err;
    size_t n = strlen(line);
    int na = lp_tokenizer_encode(tok, line, n, false, false, a, 512, &err);
    int nb = bpe ? lp_bpe_encode(bpe, line, n, b, 512, &err) : na;
    if (na < 0 || na > 512 || nb != na) return 1;
    if (bpe && memcmp(a, b, (size_t)na * sizeof a[0]) != 0) return 1;
    char dec[2048];
    size_t dn = lp_tokenizer_decode(tok, a, na, false, dec, sizeof dec);
    return dn == n && memcmp(dec, line, n) == 0 ? 0 : 1;
}

static void test_bpe(const char *dir) {
    lp_error err;
    char path[1024];
    /* a vocabulary trained here, so the trainer's own segmentation is known */
    lp_bpe *bpe = lp_bpe_create(&err);
    CHECK(bpe != NULL);
    if (!bpe) return;
    snprintf(path, sizeof path, "%s/pretrain.txt", dir);
    size_t n = 0;
    char *text = read_all(path, &n);
    CHECK(text != NULL);
    if (!text) return;
    CHECK(lp_bpe_add_text(bpe, text, n, &err) == 0);
    CHECK_MSG(lp_bpe_train(bpe, 512, &err) == 0, "%s", err.message);
    CHECK(lp_bpe_n_vocab(bpe) == 512);
    snprintf(path, sizeof path, "%s/test_vocab.gguf", dir);
    CHECK_MSG(lp_bpe_write_gguf(bpe, path, &err) == 0, "%s", err.message);
    lp_gguf *g = lp_gguf_open(path, &err);
    CHECK_MSG(g != NULL, "%s", err.message);
    lp_tokenizer *tok = g ? lp_tokenizer_from_gguf(g, &err) : NULL;
    CHECK_MSG(tok != NULL, "%s", err.message);
    if (tok) {
        CHECK(lp_tokenizer_n_vocab(tok) == 512);
        CHECK(lp_tokenizer_bos(tok) == LP_BPE_BOS && lp_tokenizer_eos(tok) == LP_BPE_EOS);
        CHECK(lp_tokenizer_add_bos(tok));
        CHECK(lp_tokenizer_kind(tok) == LP_TOK_BPE && lp_tokenizer_pretok(tok) == LP_PRETOK_GPT2);
        int failures = 0, lines = 0;
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), lines++)
            failures += check_line(tok, bpe, line);
        CHECK(lines == 1500);
        CHECK_MSG(failures == 0, "%d of %d lines tokenized differently", failures, lines);
        /* text the vocabulary never saw, bytes included */
        const char *odd[] = {"zzqx  ..!!  \n\n", "caf\xc3\xa9 na\xc3\xafve", "aaaa aaa",
                             "en>vo: Tom saw the ball.\nTepu\n"};
        for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++)
            CHECK_MSG(check_line(tok, bpe, odd[i]) == 0, "%s", odd[i]);
    }
    free(text);
    lp_tokenizer_free(tok);
    lp_gguf_close(g);
    lp_bpe_free(bpe);

    /* the corpus's own vocabulary: loads, round-trips every record, and
     * prompt + completion tokenizes as prompt then completion */
    snprintf(path, sizeof path, "%s/vocab.gguf", dir);
    g = lp_gguf_open(path, &err);
    CHECK_MSG(g != NULL, "%s", err.message);
    tok = g ? lp_tokenizer_from_gguf(g, &err) : NULL;
    CHECK(tok != NULL);
    if (tok) {
        CHECK(lp_tokenizer_n_vocab(tok) == 420);
        lp_str arch;
        CHECK(lp_gguf_get_str(g, "general.architecture", &arch, &err) == 1 &&
              lp_str_eq(arch, "llama"));
        int failures = 0, splits = 0;
        for (int t = 0; t < LP_WORLD_N_TASKS; t++) {
            rec *rs = NULL;
            snprintf(path, sizeof path, "%s/tasks/%s.eval.jsonl", dir, lp_world_task_name(t));
            int nr = read_records(path, &rs);
            for (int i = 0; i < nr; i++) {
                failures += check_line(tok, NULL, rs[i].prompt);
                failures += check_line(tok, NULL, rs[i].completion);
                char joined[2048];
                snprintf(joined, sizeof joined, "%s%s", rs[i].prompt, rs[i].completion);
                int32_t a[512], b[512];
                int na = lp_tokenizer_encode(tok, joined, strlen(joined), false, false, a, 512, &err);
                int np = lp_tokenizer_encode(tok, rs[i].prompt, strlen(rs[i].prompt), false, false, b, 512, &err);
                int nc = lp_tokenizer_encode(tok, rs[i].completion, strlen(rs[i].completion), false, false, b + np, 512 - np, &err);
                if (na != np + nc || memcmp(a, b, (size_t)na * sizeof a[0]) != 0) splits++;
            }
            free(rs);
        }
        CHECK_MSG(failures == 0, "%d records do not round-trip", failures);
        CHECK_MSG(splits == 0, "%d records tokenize differently joined", splits);
    }
    lp_tokenizer_free(tok);
    lp_gguf_close(g);
}

int main(void) {
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/test_world_a", LP_BINARY_DIR);
    snprintf(b, sizeof b, "%s/test_world_b", LP_BINARY_DIR);
    char v1dir[512];
    snprintf(v1dir, sizeof v1dir, "%s/test_world_v1", LP_BINARY_DIR);
    test_v1_pinned(v1dir);
    test_chrf();
    test_pretokenizer();
    test_translation_round_trip();
    test_corrections_unambiguous();
    test_determinism(a, b);
    test_splits_and_truth(a);
    test_bpe(a);
    return check_summary("test_world");
}
