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
#include "world/world2.h"
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
        {"README.md", 0xf44a92158d55a6fbull}, /* since style-curious was added */
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
        {"tasks/style-curious.train.jsonl", 0x1dac8295b7024cadull},
        {"tasks/style-curious.eval.jsonl", 0x7966601fd8ee75cfull},
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
    CHECK(st.task_train_records == 150 * (LP_WORLD_N_ALL_TASKS - 1) + 1500);
    CHECK(st.task_eval_records == 30 * LP_WORLD_N_ALL_TASKS);
    CHECK(st.vocab_size == 420);
    char a[1024], b[1024];
    const char *files[] = {"pretrain.txt", "vocab.gguf", "README.md"};
    for (int i = 0; i < 3; i++) {
        snprintf(a, sizeof a, "%s/%s", dir_a, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir_b, files[i]);
        CHECK_MSG(files_equal(a, b), "%s differs between runs", files[i]);
    }
    for (int t = 0; t < LP_WORLD_N_ALL_TASKS; t++)
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
    rec *tr[LP_WORLD_N_ALL_TASKS] = {0}, *ev[LP_WORLD_N_ALL_TASKS] = {0};
    int ntr[LP_WORLD_N_ALL_TASKS], nev[LP_WORLD_N_ALL_TASKS];
    char path[1024], body[1024];
    for (int t = 0; t < LP_WORLD_N_ALL_TASKS; t++) {
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
    for (int t = 0; t < LP_WORLD_N_ALL_TASKS; t++) {
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
    for (int t = 0; t < LP_WORLD_N_ALL_TASKS; t++) {
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

/* ==== version 2 ============================================================= */

/* Strict UTF-8: no overlong forms, surrogates or code points past U+10FFFF. */
static bool utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
                 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (k == 0 || i + k > n) return false;
        uint32_t cp = k == 1 ? c : k == 2 ? c & 0x1F : k == 3 ? c & 0x0F : c & 0x07;
        for (size_t j = 1; j < k; j++) {
            if ((u[i + j] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (u[i + j] & 0x3F);
        }
        static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += k;
    }
    return true;
}

/* The code points of text in [lo, hi]: how many. */
static int count_range(const char *s, uint32_t lo, uint32_t hi) {
    int n = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; u[i];) {
        uint32_t cp = u[i];
        size_t k = 1;
        if ((u[i] & 0xE0) == 0xC0) { cp = ((u[i] & 0x1Fu) << 6) | (u[i + 1] & 0x3Fu); k = 2; }
        else if ((u[i] & 0xF0) == 0xE0) {
            cp = ((u[i] & 0x0Fu) << 12) | ((u[i + 1] & 0x3Fu) << 6) | (u[i + 2] & 0x3Fu);
            k = 3;
        }
        n += cp >= lo && cp <= hi;
        i += k;
    }
    return n;
}

static const int w2_cat_n[LP_W2_N_CATS] = {LP_W2_NAMES, LP_W2_NOUNS, LP_W2_ADJS, LP_W2_VERBS,
                                           LP_W2_PLACES, LP_W2_TIMES, LP_W2_FUNCS};

/* Brute force over the lexicons: every stem unique in its language, and no
 * swap of two adjacent units of a stem gives a stem or another stem's swap
 * (what keeps a misspelling's fix unique); every word valid UTF-8 in its
 * language's script. */
static void test_w2_lexicon(const lp_world2 *w) {
    /* [lo, hi] of each language's letters beyond ASCII (0: ASCII only) */
    static const uint32_t script[LP_W2_N_LANGS][2] = {
        {0, 0}, {0xC0, 0x17F}, {0x400, 0x4FF}, {0x370, 0x3FF}, {0xAC00, 0xD7A3},
        {0x900, 0x97F}, {0, 0}, {0xC0, 0x17F}, {0x530, 0x58F}};
    for (int l = 0; l < LP_W2_N_LANGS; l++) {
        str_set stems, swaps;
        set_init(&stems);
        set_init(&swaps);
        int dup = 0, collide = 0, foreign = 0, in_script = 0, words = 0;
        for (int c = 0; c < LP_W2_N_CATS; c++)
            for (int i = 0; i < w2_cat_n[c]; i++) {
                const char *s = lp_world2_word(w, l, c, i);
                if (l == LP_W2_EN && c == LP_W2_CAT_FUNC) continue; /* English has none */
                words++;
                CHECK_MSG(s[0] && utf8_valid(s, strlen(s)), "%s %d/%d", lp_world2_lang_code(l), c, i);
                char low[64];
                snprintf(low, sizeof low, "%s", s);
                if (set_has(&stems, low)) dup++;
                set_add(&stems, low);
                int n = (int)strlen(s);
                int script_cps = script[l][0] ? count_range(s, script[l][0], script[l][1]) : 0;
                in_script += script_cps > 0;
                /* letters outside the script: none (spaces in English times) */
                for (int k = 0; k < n; k++) {
                    unsigned char b = (unsigned char)s[k];
                    if (b < 0x80 && b != ' ' && !((b | 32) >= 'a' && (b | 32) <= 'z')) foreign++;
                }
                if (script[l][0] && l != LP_W2_VL && l != LP_W2_OR)
                    foreign += count_range(s, 'A', 'z') > 0; /* no Latin in other scripts */
            }
        CHECK_MSG(dup == 0, "%s: %d stems twice", lp_world2_lang_code(l), dup);
        if (script[l][0]) {
            /* Velin and Orvai mix diacritics into Latin; the others are all script */
            int want = (l == LP_W2_VL || l == LP_W2_OR) ? words / 4 : words;
            CHECK_MSG(in_script >= want, "%s: %d of %d words in its script",
                      lp_world2_lang_code(l), in_script, words);
        }
        CHECK_MSG(foreign == 0, "%s: %d foreign characters", lp_world2_lang_code(l), foreign);
        if (l != LP_W2_EN) { /* the swaps (English's fixed lexicon: the records' test) */
            for (int c = 0; c < LP_W2_N_CATS; c++)
                for (int i = 0; i < w2_cat_n[c]; i++) {
                    const char *s = lp_world2_word(w, l, c, i);
                    size_t u[64];
                    int n = lp_world2_units(s, u, 64);
                    for (int p = 0; p + 1 < n; p++) {
                        char v[64];
                        size_t e = p + 2 < n ? u[p + 2] : strlen(s);
                        snprintf(v, sizeof v, "%.*s%.*s%.*s%s", (int)u[p], s,
                                 (int)(e - u[p + 1]), s + u[p + 1], (int)(u[p + 1] - u[p]),
                                 s + u[p], s + e);
                        if (!strcmp(v, s)) continue;
                        if (set_has(&stems, v) || set_has(&swaps, v)) collide++;
                        set_add(&swaps, v);
                    }
                }
            CHECK_MSG(collide == 0, "%s: %d swaps collide", lp_world2_lang_code(l), collide);
            CHECK(swaps.n > 150); /* Hangul stems: two syllables, one swap each */
        }
        set_free(&stems);
        set_free(&swaps);
    }
    /* at least four scripts besides plain Latin, and the orders */
    int orders[4] = {0};
    for (int l = 0; l < LP_W2_N_LANGS; l++) {
        const char *o = lp_world2_lang_order(l);
        orders[!strcmp(o, "SVO") ? 0 : !strcmp(o, "SOV") ? 1 : !strcmp(o, "VSO") ? 2 : 3]++;
    }
    CHECK(orders[0] && orders[1] && orders[2]);
}

/* Whether word w occurs in sentence s as a whole word (between spaces or
 * the ends; the sentence's final punctuation counts as an end). */
static bool has_word(const char *s, const char *w) {
    size_t n = strlen(w);
    for (const char *p = strstr(s, w); p; p = strstr(p + 1, w)) {
        bool start = p == s || p[-1] == ' ';
        const char *e = p + n;
        bool end = !*e || *e == ' ' || *e == '.' || *e == '?' || *e == '!' || *e == ',' ||
                   !strcmp(e, "।");
        if (start && end) return true;
    }
    return false;
}

static const char *W(const lp_world2 *w, int l, int c, int i) { return lp_world2_word(w, l, c, i); }

/* o = a + b + c (o holds 256 bytes; our words are far shorter) */
static void cat3(char *o, size_t cap, const char *a, const char *b, const char *c) {
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    if (la + lb + lc + 1 > cap) {
        o[0] = '\0';
        return;
    }
    memcpy(o, a, la);
    memcpy(o + la, b, lb);
    memcpy(o + la + lb, c, lc + 1);
}

/* The grammar of each language, re-derived here from world2.h's
 * description and checked on rendered sentences: word order (the subject,
 * verb and object stems appear in the language's order), agreement and case
 * endings where the grammar puts them. */
static void test_w2_grammar(const lp_world2 *w) {
    lp_rng rng;
    lp_rng_seed(&rng, 5);
    int bad[LP_W2_N_LANGS] = {0}, order_bad[LP_W2_N_LANGS] = {0};
    char s[512], x[256], y[256];
    for (int it = 0; it < 400; it++) {
        lp_meaning m;
        lp_world2_random_meaning(&rng, false, &m);
        bool spl = m.subj.name < 0 && m.subj.plural, opl = m.obj.plural;
        for (int l = 0; l < LP_W2_N_LANGS; l++) {
            CHECK(lp_world2_render(w, &m, l, NULL, s, sizeof s) > 0);
            CHECK(utf8_valid(s, strlen(s)));
            /* order: S, V, O stems by their first byte positions */
            const char *sst = m.subj.name >= 0 ? W(w, l, LP_W2_CAT_NAME, m.subj.name)
                                               : W(w, l, LP_W2_CAT_NOUN, m.subj.noun);
            char vst[64];
            snprintf(vst, sizeof vst, "%s", W(w, l, LP_W2_CAT_VERB, m.verb));
            if (l == LP_W2_HN) vst[3] = '\0'; /* its last syllable takes the tense */
            if (l == LP_W2_EN) snprintf(vst, sizeof vst, "%s", ""); /* irregular forms */
            const char *ost = W(w, l, LP_W2_CAT_NOUN, m.obj.noun);
            char lowered[512];
            snprintf(lowered, sizeof lowered, "%s", s);
            const char *ps = strstr(s, sst), *po = strstr(s, ost);
            const char *pv = vst[0] ? strstr(s, vst) : NULL;
            /* a sentence-initial stem is capitalized: search after the first letter */
            if (!ps) ps = strstr(s, sst + 1 + (((unsigned char)sst[0] & 0x80) != 0));
            if (!po) po = strstr(s, ost + 1 + (((unsigned char)ost[0] & 0x80) != 0));
            if (!pv && vst[0]) pv = strstr(s, vst + 1 + (((unsigned char)vst[0] & 0x80) != 0));
            /* Hanmal's verb (one syllable searched) ends the sentence: its last occurrence */
            for (const char *q = pv; l == LP_W2_HN && q; q = strstr(q + 1, vst)) pv = q;
            if (!ps || !po || (vst[0] && !pv)) {
                order_bad[l]++;
            } else {
                const char *o = lp_world2_lang_order(l);
                long is = ps - s, iv = pv ? pv - s : -1, io = po - s;
                bool ok = !strcmp(o, "SVO") ? is < io && (iv < 0 || (is < iv && iv < io))
                        : !strcmp(o, "SOV") ? is < io && io < iv
                        : !strcmp(o, "VSO") ? iv < is && is < io
                                            : iv < io && io < is; /* VOS */
                if (!ok) order_bad[l]++;
            }
            int sg = m.subj.name >= 0 ? lp_world2_word_class(w, l, LP_W2_CAT_NAME, m.subj.name)
                                      : lp_world2_word_class(w, l, LP_W2_CAT_NOUN, m.subj.noun);
            int og = lp_world2_word_class(w, l, LP_W2_CAT_NOUN, m.obj.noun);
            const char *v = W(w, l, LP_W2_CAT_VERB, m.verb);
            bool ok = true;
            switch (l) {
            case LP_W2_EN: /* a singular subject's present verb ends in -s */
                if (m.tense == LP_TENSE_PRESENT && !spl) {
                    static const char *const third[] = {"sees", "finds", "takes", "wants", "likes"};
                    if (m.verb < 5) ok = has_word(s, third[m.verb]);
                }
                if (m.tense == LP_TENSE_FUTURE) ok = strstr(s, "will ") != NULL;
                break;
            case LP_W2_VL: { /* the object ends in the accusative of its harmony */
                bool front = og == 1;
                cat3(x, sizeof x, ost, opl ? (front ? "ler" : "lar") : "", "");
                size_t n = strlen(x);
                bool open = n && strchr("aoue", x[n - 1]) != NULL;
                if (n >= 2 && (!strcmp(x + n - 2, "â") || !strcmp(x + n - 2, "ö") ||
                               !strcmp(x + n - 2, "ü")))
                    open = true;
                if (n && x[n - 1] == 'i') open = true;
                cat3(y, sizeof y, x, open ? (front ? "yü" : "yu") : (front ? "ü" : "u"), "");
                ok = has_word(s, y);
                break;
            }
            case LP_W2_BO: { /* past in the subject's gender; feminine object -у */
                static const char *const past[3] = {"л", "ла", "ло"};
                if (m.tense == LP_TENSE_PAST) {
                    cat3(x, sizeof x, v, spl ? "ли" : past[sg], "");
                    ok = has_word(s, x);
                }
                if (m.tense == LP_TENSE_PRESENT) {
                    cat3(x, sizeof x, v, spl ? "ют" : "ет", "");
                    ok = has_word(s, x);
                }
                if (og == 1 && !opl) {
                    cat3(y, sizeof y, ost, "у", "");
                    ok = ok && has_word(s, y);
                }
                break;
            }
            case LP_W2_TH: { /* the object's article: gender, number, accusative */
                static const char *const art[2][3] = {{"τον", "την", "το"}, {"τους", "τις", "τα"}};
                static const char *const end[2][3] = {{"ο", "α", "ο"}, {"ους", "ες", "α"}};
                snprintf(x, sizeof x, "%s %s", art[opl][og], ost);
                ok = strstr(s, x) != NULL || (m.obj.adj >= 0 && has_word(s, art[opl][og]));
                cat3(y, sizeof y, ost, end[opl][og], "");
                ok = ok && has_word(s, y);
                /* the verb opens the sentence: the augment's capital */
                if (m.tense == LP_TENSE_PAST) ok = ok && !strncmp(s, "Ε", strlen("Ε"));
                if (m.tense == LP_TENSE_FUTURE) ok = ok && !strncmp(s, "Θα ", strlen("Θα "));
                break;
            }
            case LP_W2_HN: { /* object particle by the final consonant */
                cat3(x, sizeof x, ost, opl ? "들" : "", "");
                size_t n = strlen(x);
                unsigned cp = ((unsigned char)x[n - 3] & 0x0Fu) << 12 |
                              ((unsigned char)x[n - 2] & 0x3Fu) << 6 | ((unsigned char)x[n - 1] & 0x3Fu);
                bool fin = (cp - 0xAC00) % 28 != 0;
                cat3(y, sizeof y, x, fin ? "을" : "를", "");
                ok = has_word(s, y);
                break;
            }
            case LP_W2_SR: { /* को after the object; the verb in the subject's gender */
                static const char *const past[2][2] = {{"ा", "े"}, {"ी", "ीं"}};
                ok = strstr(s, " को ") != NULL;
                if (m.tense == LP_TENSE_PAST) {
                    cat3(x, sizeof x, v, past[sg][spl], "।");
                    size_t n = strlen(s), k = strlen(x);
                    ok = ok && n >= k && !strcmp(s + n - k, x);
                }
                break;
            }
            case LP_W2_ZA: { /* subject concord of the subject's class, tense infix */
                static const char *const sc[2][4] = {{"a", "u", "ki", "i"}, {"wa", "i", "vi", "zi"}};
                static const char *const tn[3] = {"li", "na", "ta"};
                int cls = m.subj.name >= 0 ? 0 : sg;
                snprintf(x, sizeof x, "%s%s%sa", sc[spl][cls], tn[m.tense], v);
                ok = has_word(s, x) || (x[0] = (char)(x[0] - 32), has_word(s, x));
                break;
            }
            case LP_W2_OR: { /* verb first: tense prefix, -rè for a plural object */
                static const char *const tn[3] = {"Nó", "Mà", "Hò"};
                snprintf(x, sizeof x, "%s%s%s ", tn[m.tense], v, opl ? "rè" : "");
                ok = !strncmp(s, x, strlen(x));
                break;
            }
            default: /* er: the transitive subject takes the ergative */
                if (!spl) {
                    cat3(x, sizeof x, sst, "ով", "");
                    ok = has_word(s, x);
                    world2_upper_first(x); /* it may open the sentence */
                    ok = ok || has_word(s, x);
                } else {
                    ok = strstr(s, "ով ") != NULL;
                }
                break;
            }
            if (!ok) {
                if (bad[l] < 3) fprintf(stderr, "grammar %s: %s\n", lp_world2_lang_code(l), s);
                bad[l]++;
            }
        }
    }
    for (int l = 0; l < LP_W2_N_LANGS; l++) {
        CHECK_MSG(bad[l] == 0, "%s: %d sentences break the grammar", lp_world2_lang_code(l), bad[l]);
        CHECK_MSG(order_bad[l] == 0, "%s: %d sentences out of order", lp_world2_lang_code(l),
                  order_bad[l]);
    }
    /* Ergo: the subject of "go" takes no ergative (the summary's first clause) */
    lp_world_record r;
    lp_rng_seed(&rng, 9);
    for (int i = 0; i < 20; i++) {
        lp_world2_make_record(w, &rng, LP_W2_T_SUMMARY, LP_W2_ER, &r);
        const char *first_word_end = strchr(r.completion, ' ');
        CHECK(first_word_end && strncmp(first_word_end - strlen("ով"), "ով", strlen("ով")) != 0);
    }
    /* the composer example, exactly */
    lp_w2_compose c = {.intent = LP_W2_INTENT_INVITE, .name = 8, .time = 11, .place = 0, .noun = -1};
    lp_world2_compose(w, &c, LP_W2_EN, &r);
    CHECK_MSG(!strcmp(r.prompt, "compose: invite, Lena, Saturday, park\n"), "%s", r.prompt);
    CHECK_MSG(!strcmp(r.completion, "Hi Lena, do you want to come to the park on Saturday?"), "%s",
              r.completion);
    /* keywords arrive inflected: Velin's dative of the place, Hanmal's 에 */
    lp_world2_compose(w, &c, LP_W2_HN, &r);
    snprintf(x, sizeof x, "%s에", W(w, LP_W2_HN, LP_W2_CAT_PLACE, 0));
    CHECK_MSG(has_word(r.completion, x) || strstr(r.completion, x), "%s", r.completion);
}

/* Rendering is injective in every language (distinct meanings, distinct
 * sentences), so translation between any two is a function, and going
 * A -> meaning -> B -> meaning -> A gives the sentence back. */
static void test_w2_translation(const lp_world2 *w) {
    enum { N = 1200 };
    lp_rng rng;
    lp_rng_seed(&rng, 17);
    static char text[LP_W2_N_LANGS][N][200];
    static lp_meaning ms[N];
    int n = 0;
    str_set keys;
    set_init(&keys);
    while (n < N) { /* distinct meanings only */
        lp_world2_random_meaning(&rng, false, &ms[n]);
        char k[32];
        snprintf(k, sizeof k, "%llx", (unsigned long long)lp_world_meaning_key(&ms[n]));
        if (set_has(&keys, k)) continue;
        set_add(&keys, k);
        for (int l = 0; l < LP_W2_N_LANGS; l++)
            CHECK(lp_world2_render(w, &ms[n], l, NULL, text[l][n], sizeof text[l][n]) > 0);
        n++;
    }
    set_free(&keys);
    for (int l = 0; l < LP_W2_N_LANGS; l++) {
        str_set seen;
        set_init(&seen);
        for (int i = 0; i < N; i++) set_add(&seen, text[l][i]);
        CHECK_MSG(seen.n == N, "%s renders %d meanings alike", lp_world2_lang_code(l), N - (int)seen.n);
        set_free(&seen);
    }
    /* minimal pairs: a meaning and its neighbours (number, tense, adjective,
     * place, time, name vs noun changed) render apart in every language */
    int alike = 0;
    for (int i = 0; i < 150; i++) {
        lp_meaning v[8];
        for (int k = 0; k < 8; k++) v[k] = ms[i];
        v[1].obj.plural = !v[1].obj.plural;
        if (v[2].subj.name < 0) v[2].subj.plural = !v[2].subj.plural;
        else v[2].subj = (lp_np){.name = -1, .noun = i % LP_W2_AGENTS, .adj = -1};
        v[3].tense = (v[3].tense + 1) % 3;
        if (v[3].time == LP_W2_TIME_YESTERDAY || v[3].time == LP_W2_TIME_TOMORROW) v[3].time = -1;
        v[4].obj.adj = v[4].obj.adj >= 0 ? -1 : i % LP_W2_ADJS;
        v[5].place = v[5].place >= 0 ? -1 : i % LP_W2_PLACES;
        v[6].time = v[6].time >= 0 ? -1 : 1;
        v[7].verb = (v[7].verb + 1) % LP_W2_VERBS;
        for (int l = 0; l < LP_W2_N_LANGS; l++) {
            char t[8][200];
            for (int k = 0; k < 8; k++) lp_world2_render(w, &v[k], l, NULL, t[k], sizeof t[k]);
            for (int k = 1; k < 8; k++) alike += !strcmp(t[0], t[k]);
        }
    }
    CHECK_MSG(alike == 0, "%d minimal pairs render alike", alike);
    /* A -> B -> A through the text alone, every ordered pair */
    int fails = 0, trips = 0;
    for (int a = 0; a < LP_W2_N_LANGS; a++)
        for (int b = 0; b < LP_W2_N_LANGS; b++) {
            if (a == b) continue;
            for (int i = 0; i < N; i += 97) {
                int j = -1, k = -1;
                for (int q = 0; q < N && j < 0; q++)
                    if (!strcmp(text[a][q], text[a][i])) j = q; /* A's sentence -> meaning */
                for (int q = 0; q < N && k < 0; q++)
                    if (!strcmp(text[b][q], text[b][j])) k = q; /* B's -> meaning */
                trips++;
                fails += strcmp(text[a][k], text[a][i]) != 0;
            }
        }
    CHECK(trips > 500 && fails == 0);
    /* translation records: the completion is the target's rendering */
    lp_world_record r;
    int pairs[LP_W2_N_LANGS][LP_W2_N_LANGS] = {{0}};
    for (int i = 0; i < 2000; i++) {
        int from = i % LP_W2_N_LANGS;
        lp_world2_make_record(w, &rng, LP_W2_T_TRANSLATE, from, &r);
        char src[8], dst[8];
        CHECK(sscanf(r.lang, "%2s>%2s", src, dst) == 2);
        int to = lp_world2_lang_from_code(dst);
        CHECK(to >= 0 && to != from && lp_world2_lang_from_code(src) == from);
        if (to >= 0) pairs[from][to]++;
        CHECK(!strncmp(r.prompt, r.lang, strlen(r.lang)));
    }
    int covered = 0;
    for (int a = 0; a < LP_W2_N_LANGS; a++)
        for (int b = 0; b < LP_W2_N_LANGS; b++) covered += pairs[a][b] > 0;
    CHECK_MSG(covered == LP_W2_N_LANGS * (LP_W2_N_LANGS - 1), "%d pairs", covered);
    char buf[8];
    CHECK(lp_world2_render(w, &ms[0], LP_W2_HN, NULL, buf, sizeof buf) == -1); /* bounded */
}

/* No prompt has two right answers: for the correction task over many
 * meanings, all tenses, several times and many error draws per language
 * (the clean sentences included, as the records one in ten have them); for
 * every other task over many records. */
static void test_w2_unambiguous(const lp_world2 *w) {
    str_set prompts, pairs;
    set_init(&prompts);
    set_init(&pairs);
    lp_rng rng;
    lp_rng_seed(&rng, 23);
    lp_world_record r;
    char pair[2048];
    static const int times[] = {-1, LP_W2_TIME_YESTERDAY, 1, LP_W2_TIME_TOMORROW, 4,
                                LP_W2_TIME_MONDAY + 5};
    int n = 0;
    for (int i = 0; i < 24; i++) {
        lp_meaning m;
        lp_world2_random_meaning(&rng, false, &m);
        if (i % 2) m.subj = (lp_np){.name = -1, .noun = i % 10, .adj = i % 3 ? -1 : i % 12,
                                    .plural = i % 4 == 1};
        if (i % 3 == 0) m.obj.plural = !m.obj.plural;
        for (int tense = 0; tense < 3; tense++)
            for (size_t t = 0; t < sizeof times / sizeof times[0]; t++) {
                int time = times[t];
                if ((time == LP_W2_TIME_YESTERDAY && tense != LP_TENSE_PAST) ||
                    (time == LP_W2_TIME_TOMORROW && tense != LP_TENSE_FUTURE))
                    continue;
                m.tense = tense;
                m.time = time;
                for (int l = 0; l < LP_W2_N_LANGS; l++) {
                    for (int k = 0; k < 6; k++) {
                        lp_world2_make_correct(w, &rng, &m, l, &r);
                        set_add(&prompts, r.prompt);
                        snprintf(pair, sizeof pair, "%s\t%s", r.prompt, r.completion);
                        set_add(&pairs, pair);
                        n++;
                    }
                    char clean[512];
                    lp_world2_render(w, &m, l, NULL, clean, sizeof clean);
                    snprintf(r.prompt, sizeof r.prompt, "fix: %s\n", clean);
                    set_add(&prompts, r.prompt);
                    snprintf(pair, sizeof pair, "%s\t%s", r.prompt, clean);
                    set_add(&pairs, pair);
                }
            }
    }
    CHECK(pairs.n * 2 < pairs.mask && n > 15000); /* the sets never filled up */
    CHECK_MSG(pairs.n == prompts.n, "%d correction prompts have two answers",
              (int)(pairs.n - prompts.n));
    set_free(&prompts);
    set_free(&pairs);
    for (int t = 0; t < LP_W2_N_TASKS; t++) {
        if (t == LP_W2_T_CORRECT) continue;
        set_init(&prompts);
        set_init(&pairs);
        for (int i = 0; i < 4000; i++) {
            lp_world2_make_record(w, &rng, t, i % LP_W2_N_LANGS, &r);
            set_add(&prompts, r.prompt);
            snprintf(pair, sizeof pair, "%s\t%s", r.prompt, r.completion);
            set_add(&pairs, pair);
        }
        CHECK_MSG(pairs.n == prompts.n, "%s: %d prompts have two answers", lp_world2_task_name(t),
                  (int)(pairs.n - prompts.n));
        set_free(&prompts);
        set_free(&pairs);
    }
}

static lp_world_params w2_small_params(void) {
    lp_world_params p = lp_world2_default_params();
    p.seed = 42;
    p.stories = 900;
    p.per_task = 60;
    p.correct_factor = 3;
    p.eval_per_task = 18;
    p.vocab_size = 1200;
    return p;
}

static const char *const w2_files[] = {"README.md", "pretrain.txt", "vocab.gguf"};

/* Determinism for a seed, another seed another corpus; every file valid
 * UTF-8; the records' format; train and eval disjoint; eval meanings never
 * in pretrain.txt. */
static void test_w2_corpus(const char *dir_a, const char *dir_b) {
    lp_world_params p = w2_small_params();
    lp_error err;
    lp_world_stats st;
    CHECK_MSG(lp_world_generate(dir_a, &p, &st, &err) == 0, "%s", err.message);
    CHECK(lp_world_generate(dir_b, &p, NULL, &err) == 0);
    CHECK(st.pretrain_lines == 900 && st.vocab_size == 1200);
    CHECK(st.task_train_records == 60 * (LP_W2_N_TASKS - 3) + 3 * 180);
    CHECK(st.task_eval_records == 18 * LP_W2_N_TASKS);
    CHECK(st.pretrain_tokens > 10000 && st.task_train_tokens > 5000);
    char a[1024], b[1024];
    for (size_t i = 0; i < sizeof w2_files / sizeof w2_files[0]; i++) {
        snprintf(a, sizeof a, "%s/%s", dir_a, w2_files[i]);
        snprintf(b, sizeof b, "%s/%s", dir_b, w2_files[i]);
        CHECK_MSG(files_equal(a, b), "%s differs between runs", w2_files[i]);
    }
    for (int t = 0; t < LP_W2_N_TASKS; t++)
        for (int e = 0; e < 2; e++) {
            snprintf(a, sizeof a, "%s/tasks/%s.%s.jsonl", dir_a, lp_world2_task_name(t), e ? "eval" : "train");
            snprintf(b, sizeof b, "%s/tasks/%s.%s.jsonl", dir_b, lp_world2_task_name(t), e ? "eval" : "train");
            CHECK_MSG(files_equal(a, b), "%s differs between runs", a);
        }
    /* valid UTF-8, and the README names every language */
    const char *all[3 + 2 * LP_W2_N_TASKS];
    char names[2 * LP_W2_N_TASKS][96];
    int nf = 0;
    for (size_t i = 0; i < 3; i++) all[nf++] = w2_files[i];
    for (int t = 0; t < LP_W2_N_TASKS; t++)
        for (int e = 0; e < 2; e++) {
            snprintf(names[2 * t + e], sizeof names[0], "tasks/%s.%s.jsonl", lp_world2_task_name(t),
                     e ? "eval" : "train");
            all[nf++] = names[2 * t + e];
        }
    for (int i = 0; i < nf; i++) {
        if (!strcmp(all[i], "vocab.gguf")) continue;
        snprintf(a, sizeof a, "%s/%s", dir_a, all[i]);
        size_t n = 0;
        char *d = read_all(a, &n);
        CHECK_MSG(d && n > 0 && utf8_valid(d, n), "%s: not UTF-8", all[i]);
        if (d && !strcmp(all[i], "README.md"))
            for (int l = 0; l < LP_W2_N_LANGS; l++)
                CHECK(strstr(d, lp_world2_lang_name(l)) != NULL);
        free(d);
    }
    p.seed = 43;
    p.stories = 10;
    CHECK(lp_world_generate(dir_b, &p, NULL, &err) == 0);
    snprintf(a, sizeof a, "%s/tasks/compose.train.jsonl", dir_a);
    snprintf(b, sizeof b, "%s/tasks/compose.train.jsonl", dir_b);
    CHECK(!files_equal(a, b));

    /* splits: no eval prompt or completion among the train ones or in the
     * pretraining text's sentences */
    str_set train, pre;
    set_init(&train);
    set_init(&pre);
    snprintf(a, sizeof a, "%s/pretrain.txt", dir_a);
    size_t n = 0;
    char *text = read_all(a, &n);
    CHECK(text != NULL);
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        /* sentences end in ". ", "? ", "! " or "। " (then maybe " = ") */
        char *s = line;
        for (char *q = line; *q; q++) {
            bool dot = ((*q == '.' || *q == '?' || *q == '!') && (q[1] == ' ' || !q[1]));
            bool danda = !strncmp(q, "।", 3) && (q[3] == ' ' || !q[3]);
            if (dot || danda) {
                char keep = q[danda ? 3 : 1];
                q[danda ? 3 : 1] = '\0';
                set_add(&pre, s);
                q[danda ? 3 : 1] = keep;
                q += danda ? 3 : 1;
                while (*q == ' ' || *q == '=') q++;
                s = q;
                q--;
            }
        }
    }
    free(text);
    CHECK(pre.n > 1000);
    /* one document per story for `train --text` (a blank line ends one), so
     * the base is trained to end a text with EOS */
    text = read_all(a, &n);
    int blanks = 0;
    for (size_t i = 0; text && i + 1 < n; i++) blanks += text[i] == '\n' && text[i + 1] == '\n';
    CHECK_MSG(blanks == 900 - 1, "pretrain.txt: %d blank lines for 900 documents", blanks);
    free(text);
    rec *tr[LP_W2_N_TASKS] = {0}, *ev[LP_W2_N_TASKS] = {0};
    int ntr[LP_W2_N_TASKS], nev[LP_W2_N_TASKS];
    char body[1024];
    for (int t = 0; t < LP_W2_N_TASKS; t++) {
        snprintf(a, sizeof a, "%s/tasks/%s.train.jsonl", dir_a, lp_world2_task_name(t));
        ntr[t] = read_records(a, &tr[t]);
        snprintf(a, sizeof a, "%s/tasks/%s.eval.jsonl", dir_a, lp_world2_task_name(t));
        nev[t] = read_records(a, &ev[t]);
        CHECK(ntr[t] == (t == LP_W2_T_CORRECT || t == LP_W2_T_TRANSLATE || t == LP_W2_T_COMPOSE ? 180 : 60) &&
              nev[t] == 18);
        for (int i = 0; i < ntr[t]; i++) {
            prompt_body(tr[t][i].prompt, body, sizeof body);
            set_add(&train, body);
            set_add(&train, tr[t][i].completion);
        }
    }
    int shared = 0, in_pre = 0, langs_seen = 0;
    bool lang_seen[LP_W2_N_LANGS] = {0};
    for (int t = 0; t < LP_W2_N_TASKS; t++) {
        for (int i = 0; i < nev[t]; i++) {
            const rec *r = &ev[t][i];
            prompt_body(r->prompt, body, sizeof body);
            if (set_has(&train, body) || set_has(&train, r->completion)) shared++;
            /* pretraining has the tasks' sentences, never of an eval record */
            in_pre += set_has(&pre, r->completion);
            if (t == LP_W2_T_TRANSLATE || t == LP_W2_T_REPLY ||
                (t >= LP_W2_T_FORMAL && t <= LP_W2_T_CURIOUS))
                in_pre += set_has(&pre, body);
        }
        for (int e = 0; e < 2; e++)
            for (int i = 0; i < (e ? nev[t] : ntr[t]); i++) {
                const rec *r = e ? &ev[t][i] : &tr[t][i];
                size_t pl = strlen(r->prompt);
                CHECK(!strcmp(r->task, lp_world2_task_name(t)));
                CHECK(pl > 0 && r->prompt[pl - 1] == '\n');
                CHECK(r->completion[0] && r->completion[0] != ' ' && !strchr(r->completion, '\n'));
                char code[3] = {r->lang[0], r->lang[1], 0};
                int l = lp_world2_lang_from_code(code);
                CHECK_MSG(l >= 0, "%s", r->lang);
                if (l >= 0 && !lang_seen[l]) {
                    lang_seen[l] = true;
                    langs_seen++;
                }
                prompt_body(r->prompt, body, sizeof body);
                if (t >= LP_W2_T_FORMAL && t <= LP_W2_T_CURIOUS)
                    CHECK_MSG(strcmp(body, r->completion) != 0, "style is neutral: %s", body);
                if (t == LP_W2_T_TERSE) CHECK(strlen(r->completion) < strlen(body));
            }
    }
    CHECK_MSG(shared == 0, "%d eval texts also in train", shared);
    CHECK_MSG(in_pre == 0, "%d eval sentences in pretrain.txt", in_pre);
    CHECK(langs_seen == LP_W2_N_LANGS);
    CHECK(!lp_world2_task_trained(LP_W2_T_CURIOUS) && lp_world2_task_trained(LP_W2_T_COMPOSE));
    for (int t = 0; t < LP_W2_N_TASKS; t++) {
        free(tr[t]);
        free(ev[t]);
    }
    set_free(&train);
    set_free(&pre);
}

/* The corpus's vocabulary: the runtime tokenizer round-trips every record
 * and every pretraining line (multi-byte scripts included), segments them as
 * the trainer does, and prompt + completion tokenizes as prompt then
 * completion. */
static void test_w2_tokenizer(const char *dir) {
    char path[1024];
    lp_error err;
    /* the trainer retrained on the text the corpus's vocabulary learnt from
     * (pretrain.txt and the first per_task train records of each task):
     * its segmentation must be the runtime's on every text */
    lp_bpe *bpe = lp_bpe_create(&err);
    snprintf(path, sizeof path, "%s/pretrain.txt", dir);
    size_t n = 0;
    char *text = read_all(path, &n);
    CHECK(bpe && text && lp_bpe_add_text(bpe, text, n, &err) == 0);
    free(text);
    for (int t = 0; bpe && t < LP_W2_N_TASKS; t++) {
        rec *rs = NULL;
        snprintf(path, sizeof path, "%s/tasks/%s.train.jsonl", dir, lp_world2_task_name(t));
        int nr = read_records(path, &rs);
        for (int i = 0; i < nr && i < w2_small_params().per_task; i++) {
            CHECK(lp_bpe_add_text(bpe, rs[i].prompt, strlen(rs[i].prompt), &err) == 0);
            CHECK(lp_bpe_add_text(bpe, rs[i].completion, strlen(rs[i].completion), &err) == 0);
        }
        free(rs);
    }
    CHECK(bpe && lp_bpe_train(bpe, 1200, &err) == 0);
    snprintf(path, sizeof path, "%s/vocab.gguf", dir);
    lp_gguf *g = lp_gguf_open(path, &err);
    CHECK_MSG(g != NULL, "%s", err.message);
    lp_tokenizer *tok = g ? lp_tokenizer_from_gguf(g, &err) : NULL;
    CHECK(tok != NULL && bpe != NULL);
    if (!tok || !bpe) {
        lp_tokenizer_free(tok);
        lp_gguf_close(g);
        lp_bpe_free(bpe);
        return;
    }
    CHECK(lp_tokenizer_n_vocab(tok) == 1200);
    int failures = 0, splits = 0, records = 0, lines = 0;
    snprintf(path, sizeof path, "%s/pretrain.txt", dir);
    text = read_all(path, &n);
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n"), lines++)
        failures += check_line(tok, bpe, line);
    free(text);
    for (int t = 0; t < LP_W2_N_TASKS; t++)
        for (int e = 0; e < 2; e++) {
            rec *rs = NULL;
            snprintf(path, sizeof path, "%s/tasks/%s.%s.jsonl", dir, lp_world2_task_name(t),
                     e ? "eval" : "train");
            int nr = read_records(path, &rs);
            for (int i = 0; i < nr; i++, records++) {
                failures += check_line(tok, bpe, rs[i].prompt);
                failures += check_line(tok, bpe, rs[i].completion);
                char joined[2048];
                snprintf(joined, sizeof joined, "%s%s", rs[i].prompt, rs[i].completion);
                int32_t x[512], y[512];
                int na = lp_tokenizer_encode(tok, joined, strlen(joined), false, false, x, 512, &err);
                int np = lp_tokenizer_encode(tok, rs[i].prompt, strlen(rs[i].prompt), false, false, y, 512, &err);
                int nc = np >= 0 ? lp_tokenizer_encode(tok, rs[i].completion, strlen(rs[i].completion),
                                                       false, false, y + np, 512 - np, &err) : -1;
                if (na < 0 || nc < 0 || na != np + nc || memcmp(x, y, (size_t)na * sizeof x[0]))
                    splits++;
            }
            free(rs);
        }
    CHECK(lines == 900 && records > 800);
    CHECK_MSG(failures == 0, "%d texts do not round-trip", failures);
    CHECK_MSG(splits == 0, "%d records tokenize differently joined", splits);
    /* the trainer and the runtime agree on multi-byte text */
    lp_bpe_free(bpe);
    bpe = lp_bpe_create(&err);
    CHECK(bpe != NULL);
    if (!bpe) {
        lp_tokenizer_free(tok);
        lp_gguf_close(g);
        return;
    }
    const char *samples[] = {"Пэшеч тэфэл севишое.", "Ενυριβε η Χηκιχα τον κυνηρο.",
                             "헤재가 디븍에서 그먼 피토를 롱전다.", "पोनूड हुबुली बोबीजी को लूबा।",
                             "Մեկե քեդաով շիրէին լեթո մամասե մինում.", "Nóvèderè irèo bànà ledì."};
    for (size_t i = 0; i < sizeof samples / sizeof samples[0]; i++)
        CHECK(lp_bpe_add_text(bpe, samples[i], strlen(samples[i]), &err) == 0);
    CHECK(lp_bpe_train(bpe, 300, &err) == 0);
    snprintf(path, sizeof path, "%s/test_vocab2.gguf", dir);
    CHECK(lp_bpe_write_gguf(bpe, path, &err) == 0);
    lp_gguf *g2 = lp_gguf_open(path, &err);
    lp_tokenizer *tok2 = g2 ? lp_tokenizer_from_gguf(g2, &err) : NULL;
    CHECK(tok2 != NULL);
    for (size_t i = 0; tok2 && i < sizeof samples / sizeof samples[0]; i++)
        CHECK_MSG(check_line(tok2, bpe, samples[i]) == 0, "%s", samples[i]);
    lp_tokenizer_free(tok2);
    lp_gguf_close(g2);
    lp_tokenizer_free(tok);
    lp_gguf_close(g);
    lp_bpe_free(bpe);
}

/* Adds the words of text (split at spaces; the sentence marks . , ? ! ।
 * after them removed) to set. */
/* Cuts a word's trailing punctuation (., ?, !, the danda) in place;
 * returns its new length. */
static size_t trim_word(char *wd, size_t n) {
    for (;;) {
        if (n >= 3 && !strncmp(wd + n - 3, "।", 3)) n -= 3;
        else if (n > 0 && strchr(".,?!", wd[n - 1])) n--;
        else break;
    }
    wd[n] = '\0';
    return n;
}

static void add_words(str_set *set, const char *text) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", text);
    for (char *save = NULL, *wd = strtok_r(buf, " ", &save); wd; wd = strtok_r(NULL, " ", &save)) {
        if (trim_word(wd, strlen(wd))) set_add(set, wd);
    }
}

/* The first word of text, without its trailing punctuation (as add_words
 * cuts words). */
static void first_word(const char *text, char *out, size_t cap) {
    size_t n = strcspn(text, " ");
    if (n >= cap) n = cap - 1;
    memcpy(out, text, n);
    trim_word(out, n);
}

/* Members of set not in seen; *example: the first of them ("" if none). */
static int count_unseen(const str_set *set, const str_set *seen, const char **example) {
    int unseen = 0;
    *example = "";
    for (size_t i = 0; i <= set->mask; i++)
        if (set->slots[i] && !set_has(seen, set->slots[i]) && !unseen++) *example = set->slots[i];
    return unseen;
}

/* Every word a task writes is one the base reads in pretraining: the
 * completions of 3,000 records of each task (and the replies' messages)
 * against 100,000 pretraining documents (the corpus has 200,000).
 * Adapters on the linear layers cannot teach the base a token it never saw
 * (compose stalled at 24 %). */
static void test_w2_pretrain_covers_tasks(const lp_world2 *w) {
    str_set pre, pre_first;
    set_init(&pre);
    set_init(&pre_first);
    lp_rng rng;
    lp_rng_seed(&rng, 5);
    char line[4096], word[512];
    for (int i = 0; i < 100000; i++) {
        int n = lp_world2_pretrain_line(w, &rng, 10, line, sizeof line);
        CHECK(n > 0);
        if (n <= 0) continue;
        add_words(&pre, line);
        first_word(line, word, sizeof word);
        if (word[0]) set_add(&pre_first, word);
    }
    lp_world_record r;
    char body[1024];
    for (int t = 0; t < LP_W2_N_TASKS; t++) {
        str_set task_words, task_first;
        set_init(&task_words);
        set_init(&task_first);
        for (int i = 0; i < 3000; i++) {
            lp_world2_make_record(w, &rng, t, i % LP_W2_N_LANGS, &r);
            add_words(&task_words, r.completion);
            first_word(r.completion, word, sizeof word);
            if (word[0]) set_add(&task_first, word);
            if (t == LP_W2_T_REPLY) {
                prompt_body(r.prompt, body, sizeof body);
                add_words(&task_words, body);
            }
        }
        CHECK(pre.n * 2 < pre.mask && task_words.n > 50);
        const char *example, *example_first;
        int unseen = count_unseen(&task_words, &pre, &example);
        /* a few rare forms may be missing from this 100,000-document sample
         * (a capitalized plural object opening a message in an SOV
         * language: reply 5-12 of ~1,310 words as the draws fall); without
         * the tasks' sentences in pretraining: compose 153 of 758, reply
         * 319 of 1,309, summary 88, the styles 20-209 */
        CHECK_MSG(unseen * 100 <= (int)task_words.n,
                  "%s: %d of its %zu words never in pretraining (e.g. '%s')",
                  lp_world2_task_name(t), unseen, task_words.n, example);
        /* A completion opens a line (after the prompt's newline), where the
         * byte-level BPE cuts its first word without a leading space: a
         * different token from the word inside a sentence. Each such first
         * word must open some pretraining document too, or its pieces are
         * tokens the base never trained (reply's "Zuzi," was "Z" + "uzi",
         * 25 of 300 eval replies, when every reply came after its message). */
        int unseen_first = count_unseen(&task_first, &pre_first, &example_first);
        CHECK_MSG(unseen_first * 200 <= (int)task_first.n,
                  "%s: %d of its %zu first words never open a pretraining document (e.g. '%s')",
                  lp_world2_task_name(t), unseen_first, task_first.n, example_first);
        if (getenv("LP_TEST_VERBOSE"))
            fprintf(stderr, "%s: %d of %zu words unseen, %d of %zu first words\n",
                    lp_world2_task_name(t), unseen, task_words.n, unseen_first, task_first.n);
        set_free(&task_words);
        set_free(&task_first);
    }
    set_free(&pre);
    set_free(&pre_first);
}

static void test_world2(void) {
    lp_error err;
    lp_world2 *w = lp_world2_create(&err);
    CHECK_MSG(w != NULL, "%s", err.message);
    if (!w) return;
    test_w2_lexicon(w);
    test_w2_grammar(w);
    test_w2_translation(w);
    test_w2_unambiguous(w);
    test_w2_pretrain_covers_tasks(w);
    lp_world2_free(w);
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/test_world2_a", LP_BINARY_DIR);
    snprintf(b, sizeof b, "%s/test_world2_b", LP_BINARY_DIR);
    test_w2_corpus(a, b);
    test_w2_tokenizer(a);
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
    test_world2();
    return check_summary("test_world");
}
