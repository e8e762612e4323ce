/* Writes a version-2 demo-world corpus directory (world2.h): pretraining
 * text, per-task train and eval JSONL, a BPE vocabulary and a README. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "world2.h"
#include "world_internal.h"

lp_world_params lp_world2_default_params(void) {
    return (lp_world_params){.version = 2, .seed = 1, .stories = 200000, .per_task = 3000,
                             .correct_factor = 10, .eval_per_task = 300, .eval_percent = 10,
                             .vocab_size = 4096};
}

typedef struct w2_gen {
    lp_world2 *w;
    const lp_world_params *p;
    lp_bpe *bpe;
    lp_world_stats *st;
    lp_world_record first[LP_W2_N_TASKS]; /* for the README */
    lp_world_record sample[LP_W2_N_TASKS][LP_W2_N_LANGS]; /* first train record per language */
} w2_gen;

static uint64_t make_v2(const void *user, lp_rng *rng, int task, int lang, lp_world_record *r) {
    return lp_world2_make_record(user, rng, task, lang, r);
}

/* Train records for a task. Correct, translate and compose get
 * correct_factor x per_task: a misspelling's fix is learnt word by word,
 * translation has 72 directions and composing five intents x nine languages
 * of keyword slots; with per_task records an adapter's 10-minute stage
 * reads each record ~50 times and learns the records, not the grammar. */
static int train_records(const lp_world_params *p, int task) {
    bool many = task == LP_W2_T_CORRECT || task == LP_W2_T_TRANSLATE || task == LP_W2_T_COMPOSE;
    return many ? p->per_task * p->correct_factor : p->per_task;
}

/* A task's records, drawn as version 1's are (world_draw_records). */
static int draw_task(w2_gen *g, int task, FILE *train, FILE *eval, lp_error *err) {
    const lp_world_params *p = g->p;
    world_draw d = {
        .task_name = lp_world2_task_name(task), .task = task, .n_langs = LP_W2_N_LANGS,
        .make = make_v2, .user = g->w,
        .seed = p->seed * 1000033u + (uint64_t)task * 7907u + 29u,
        .n_train = train_records(p, task),
        .n_eval = p->eval_per_task, .per_task = p->per_task, .eval_percent = p->eval_percent,
        .train = train, .eval = eval, .bpe = g->bpe, .first = &g->first[task], .by_lang = g->sample[task],
        .st = g->st,
    };
    return world_draw_records(&d, err);
}

static int write_task(w2_gen *g, const char *dir, int task, lp_error *err) {
    char path_tr[1024], path_ev[1024], name[96];
    snprintf(name, sizeof name, "tasks/%s.train.jsonl", lp_world2_task_name(task));
    FILE *tr = world_open_out(dir, name, path_tr, sizeof path_tr, err);
    if (!tr) return -1;
    snprintf(name, sizeof name, "tasks/%s.eval.jsonl", lp_world2_task_name(task));
    FILE *ev = world_open_out(dir, name, path_ev, sizeof path_ev, err);
    if (!ev) {
        fclose(tr);
        return -1;
    }
    int rc = draw_task(g, task, tr, ev, err);
    int rc_tr = world_close_out(tr, path_tr, rc == 0 ? err : NULL);
    int rc_ev = world_close_out(ev, path_ev, rc == 0 ? err : NULL);
    return rc ? rc : rc_tr ? rc_tr : rc_ev;
}

static int write_pretrain(w2_gen *g, const char *dir, lp_error *err) {
    char path[1024], line[4096];
    FILE *f = world_open_out(dir, "pretrain.txt", path, sizeof path, err);
    if (!f) return -1;
    lp_rng rng;
    lp_rng_seed(&rng, g->p->seed * 1000033u + 99989u);
    for (int i = 0; i < g->p->stories; i++) {
        int n = lp_world2_pretrain_line(g->w, &rng, g->p->eval_percent, line, sizeof line);
        if (n < 0) {
            fclose(f);
            return lp_fail(err, "%s: a pretraining line did not fit", path);
        }
        if (lp_bpe_add_text(g->bpe, line, (size_t)n, err) != 0) {
            fclose(f);
            return -1;
        }
        /* A blank line ends a document for `loraplex train --text`: each
         * document is then BOS ... EOS, so the base learns where a text
         * ends. (On one line each, the file was one document: EOS was never
         * a target, its output row stayed with the unused tokens', and an
         * adapter's EOS won by a hair in f32 and lost it quantized.) */
        fwrite(line, 1, (size_t)n, f);
        fputs(i + 1 < g->p->stories ? "\n\n" : "\n", f);
        g->st->pretrain_bytes += (size_t)n + (i + 1 < g->p->stories ? 2 : 1);
        g->st->pretrain_lines++;
    }
    return world_close_out(f, path, err);
}

/* Tokens of a file's text (pretrain.txt) or of its records' prompts and
 * completions (JSONL: counted on the raw lines' strings) under the trained
 * vocabulary. */
static int count_tokens(const lp_bpe *bpe, const char *path, bool jsonl, size_t *out,
                        lp_error *err) {
    char *data = NULL;
    size_t n = 0;
    if (lp_read_file(path, &data, &n, (size_t)1 << 31, err) != 0) return -1;
    size_t total = 0;
    int rc = 0;
    for (char *save = NULL, *line = strtok_r(data, "\n", &save); line && rc == 0;
         line = strtok_r(NULL, "\n", &save)) {
        if (jsonl) { /* the prompt and completion values, unescaped enough to count */
            const char *keys[2] = {"\"prompt\":\"", "\"completion\":\""};
            for (int k = 0; k < 2; k++) {
                char *v = strstr(line, keys[k]);
                if (!v) continue;
                v += strlen(keys[k]);
                char *e = strstr(v, "\"}");
                char *e2 = strstr(v, "\",\"");
                if (e2 && (!e || e2 < e)) e = e2;
                if (!e) continue;
                int t = lp_bpe_encode(bpe, v, (size_t)(e - v), NULL, 0, err);
                if (t < 0) rc = -1;
                else total += (size_t)t;
            }
        } else {
            int t = lp_bpe_encode(bpe, line, strlen(line), NULL, 0, err);
            if (t < 0) rc = -1;
            else total += (size_t)t + 1; /* the newline */
        }
    }
    free(data);
    *out = total;
    return rc;
}

static int count_all_tokens(const lp_bpe *bpe, const char *dir, lp_world_stats *st, lp_error *err) {
    char path[1024];
    snprintf(path, sizeof path, "%s/pretrain.txt", dir);
    if (count_tokens(bpe, path, false, &st->pretrain_tokens, err) != 0) return -1;
    for (int t = 0; t < LP_W2_N_TASKS; t++)
        for (int e = 0; e < 2; e++) {
            size_t k = 0;
            snprintf(path, sizeof path, "%s/tasks/%s.%s.jsonl", dir, lp_world2_task_name(t),
                     e ? "eval" : "train");
            if (count_tokens(bpe, path, true, &k, err) != 0) return -1;
            if (e) st->task_eval_tokens += k;
            else st->task_train_tokens += k;
        }
    return 0;
}

/* A markdown table cell: the text without its final newline, '|' escaped. */
static void cell(FILE *f, const char *s) {
    fputs("`", f);
    for (; *s; s++) {
        if (*s == '\n') continue;
        if (*s == '|') fputs("\\|", f);
        else fputc(*s, f);
    }
    fputs("`", f);
}

static const char *const grammar_notes[LP_W2_N_LANGS] = {
    "articles, -s plural (some irregular), 3rd person -s, irregular past, \"will\" future",
    "agglutinative stem-PLURAL-CASE; vowel harmony (back a o u â / front e i ö ü) picks "
    "every suffix (-lar/-ler, accusative -u/-ü, -yu/-yü after a vowel, locative -da/-de, "
    "dative -a/-e, -ya/-ye); tense -du/-dü, -ar/-er (-r), -acak/-ecek; plural subject -lar/-ler "
    "on the verb",
    "three genders (by ending: -, -а, -о); nominative, accusative (feminine -у) and "
    "prepositional (в ...-е); adjectives agree in gender, number and case; past agrees in "
    "gender (-л/-ла/-ло, plural -ли), present in number (-ет/-ют), future будет/будут + -ть",
    "gendered articles in two cases (ο/η/το, τον/την/το, οι/τα, τους/τις/τα), also before "
    "names; noun and adjective endings agree; past with the augment ε- (-ε/-αν), future θα; "
    "places στον/στην/στο, προς",
    "case particles after the noun whose form depends on its last syllable's final "
    "consonant (subject 이/가, object 을/를), locative 에서, dative 에, plural -들; adjectives "
    "take a final ㄴ; past -았다/-었다 by vowel harmony, present -ㄴ다, future -ㄹ 것이다",
    "two genders; nouns -ा/-े (masculine), -ी/-ियाँ (feminine), adjectives agree; object "
    "postposition को, places में / तक; the verb agrees with the subject's gender and number "
    "in every tense (-ता है, -ती हैं, -ा, -ीं, -ेगा, -ेंगी ...); sentences end in ।",
    "noun classes with singular/plural prefixes (mu-/ba- people, mu-/mi-, ki-/vi-, n-/zi-); "
    "adjectives follow with their class concord; the verb is subject concord + tense infix "
    "(-li- past, -na- present, -ta- future) + stem + -a; locative -ni, kwa 'to'",
    "determiners ny (singular), irèo (plural), i (names); tense prefixes nó- (past), mà- "
    "(present), hò- (future); the verb takes -rè when its object is plural; àmy 'in', ròa 'to'",
    "ergative: the subject of a transitive verb takes -ով, the subject of 'go' nothing; "
    "plural by reduplicating the first syllable; locative -ին, dative -ան; tense -եց, -ում, "
    "-ելու"};

static void readme_langs(FILE *f, const lp_world2 *w) {
    fprintf(f, "| code | language | script | order | grammar | 'dog', 'ball', 'see', 'park' |\n"
               "|---|---|---|---|---|---|\n");
    for (int l = 0; l < LP_W2_N_LANGS; l++)
        fprintf(f, "| %s | %s | %s | %s | %s | %s, %s, %s, %s |\n", lp_world2_lang_code(l),
                lp_world2_lang_name(l), lp_world2_lang_script(l), lp_world2_lang_order(l),
                grammar_notes[l], lp_world2_word(w, l, LP_W2_CAT_NOUN, 0),
                lp_world2_word(w, l, LP_W2_CAT_NOUN, 11), lp_world2_word(w, l, LP_W2_CAT_VERB, 0),
                lp_world2_word(w, l, LP_W2_CAT_PLACE, 0));
}

static int write_readme(const w2_gen *g, const char *dir, lp_error *err) {
    const lp_world_params *p = g->p;
    const lp_world_stats *st = g->st;
    char path[1024];
    FILE *f = world_open_out(dir, "README.md", path, sizeof path, err);
    if (!f) return -1;
    fprintf(f,
            "# loraplex demo world corpus, version 2\n\n"
            "Made by `%s` (version 2, seed %llu): everything here is a deterministic function\n"
            "of the seed and the generator's code (src/world/w2_*.c, world2.h). Version 1 (three\n"
            "languages, Latin letters only) is `--version 1`, still the default.\n\n"
            "## Languages\n\n"
            "Nine languages render one shared meaning representation (subject, verb,\n"
            "object, place, time, tense; a noun phrase is a name, or a noun with number and\n"
            "an optional adjective), each with its own lexicon and grammar, in six scripts\n"
            "(multi-byte UTF-8 everywhere but English and Zamba). Translation between any\n"
            "two is defined through that representation: a sentence's meaning rendered by\n"
            "the other grammar. The lexicons of the eight invented languages are made by a\n"
            "fixed procedure from each language's sounds (the seed does not change them):\n"
            "every stem is unique, and no stem is one swap of two adjacent letters away from\n"
            "another stem or its swaps.\n\n",
            p->command ? p->command : "loraplex world --version 2", (unsigned long long)p->seed);
    readme_langs(f, g->w);
    fprintf(f,
            "\n## Files\n\n"
            "- `pretrain.txt`: %zu documents, one per line, a blank line between them (the\n"
            "  trainer's document boundary: BOS ... EOS) (%zu bytes), each in one of the\n"
            "  nine languages: short stories (2 in 10), runs of sentences about one subject\n"
            "  (2 in 10), sentence pairs `<sentence> = <same meaning in another language>`\n"
            "  (any pair; 4 in 10), and runs of unrelated sentences the tasks write (styled\n"
            "  sentences, summaries, messages and replies, composed messages; 2 in 10), so\n"
            "  the base knows every word the tasks use. No sentence whose meaning is reserved\n"
            "  for evaluation appears here, nor any task prompt, nor a prompt next to its\n"
            "  answer.\n"
            "- `tasks/<task>.train.jsonl`, `tasks/<task>.eval.jsonl`: %zu train and %zu eval\n"
            "  records in all, `{\"task\",\"lang\",[\"style\"],\"prompt\",\"completion\"}`: %d\n"
            "  train records per task, %d for `correct`, `translate` and `compose`, %d eval\n"
            "  records per task, the languages in turn. Train and eval never share a meaning\n"
            "  (split by a hash of the meaning's core, the same in every language; %d%% of\n"
            "  cores are eval). Every\n"
            "  prompt has exactly one right completion. The model input is BOS + prompt (ends\n"
            "  in a newline) + completion + EOS; generation stops at EOS or a newline.\n"
            "- `vocab.gguf`: a byte-level BPE vocabulary (%d tokens: <s>=0, </s>=1, <pad>=2,\n"
            "  256 bytes, merges) trained on pretrain.txt and the first %d train records of\n"
            "  each task; tokenizer.ggml.model = gpt2, pre = gpt2. Under it pretrain.txt is\n"
            "  %zu tokens, the train records %zu and the eval records %zu (prompts and\n"
            "  completions, JSON escapes counted as written).\n\n"
            "## Tasks\n\n"
            "- `correct` (`fix:`): one or two errors — the language's agreement error (en\n"
            "  3sg/plural verb form, vl missing accusative, bo verb gender/number, th object\n"
            "  article gender, hn particle allomorph, sr verb gender, za subject concord, or\n"
            "  object agreement, er missing ergative), two adjacent letters of a stem swapped,\n"
            "  a duplicated word — or none (one record in ten).\n"
            "- `style-formal`, `style-polite`, `style-jovial`, `style-terse`: the sentence in\n"
            "  a style (frames of the language's words; terse drops articles, adjectives, time\n"
            "  and place). `style-curious` is a fifth style that the demo's adapters never\n"
            "  train on (the over-the-air case): a question frame, `curious:`.\n"
            "- `summary`: a 3-4 sentence story -> \"S went to P and V-ed O\" (the second\n"
            "  clause without its subject, in each language's order).\n"
            "- `reply`: six intents, the reply with the message's slots.\n"
            "- `translate` (`xx>yy:`): any of the 72 ordered pairs; the prompt names the\n"
            "  source and the target language.\n"
            "- `compose` (`compose:`): an intent (invite, thank, remind, ask, meet, in the\n"
            "  language's words) and its keywords (name; day or time, place, thing in\n"
            "  dictionary form) -> one message, the keywords inflected by the grammar.\n\n"
            "First train record of each task:\n\n"
            "| task | lang | prompt | completion |\n|---|---|---|---|\n",
            st->pretrain_lines, st->pretrain_bytes, st->task_train_records,
            st->task_eval_records, p->per_task, p->per_task * p->correct_factor,
            p->eval_per_task, p->eval_percent, st->vocab_size, p->per_task,
            st->pretrain_tokens, st->task_train_tokens, st->task_eval_tokens);
    for (int t = 0; t < LP_W2_N_TASKS; t++) {
        fprintf(f, "| %s | %s | ", g->first[t].task, g->first[t].lang);
        cell(f, g->first[t].prompt);
        fputs(" | ", f);
        cell(f, g->first[t].completion);
        fputs(" |\n", f);
    }
    fprintf(f, "\nThe composer in every language:\n\n| lang | prompt | completion |\n|---|---|---|\n");
    for (int l = 0; l < LP_W2_N_LANGS; l++) {
        const lp_world_record *r = &g->sample[LP_W2_T_COMPOSE][l];
        fprintf(f, "| %s | ", r->lang);
        cell(f, r->prompt);
        fputs(" | ", f);
        cell(f, r->completion);
        fputs(" |\n", f);
    }
    fprintf(f,
            "\n## Training\n\n"
            "`scripts/make_demo_v2.sh` trains the base (from scratch, on pretrain.txt only)\n"
            "and one adapter per trained task; see its header for the sizes and the reasons.\n");
    return world_close_out(f, path, err);
}

int lp_world2_generate(const char *dir, const lp_world_params *p, lp_world_stats *stats,
                       lp_error *err) {
    if (p->stories < 0 || p->per_task < 1 || p->eval_per_task < 1 || p->eval_percent < 1 ||
        p->eval_percent > 50 || p->correct_factor < 1 || p->correct_factor > 1000 ||
        p->per_task > 10000000 / p->correct_factor)
        return lp_fail(err, "world: bad parameters (stories %d, per task %d, correct factor "
                            "%d, eval %d, eval percent %d)", p->stories, p->per_task,
                       p->correct_factor, p->eval_per_task, p->eval_percent);
    char tasks_dir[1024];
    snprintf(tasks_dir, sizeof tasks_dir, "%s/tasks", dir);
    if (world_make_dir(dir, err) != 0 || world_make_dir(tasks_dir, err) != 0) return -1;
    lp_world_stats st = {0};
    w2_gen *g = calloc(1, sizeof *g);
    if (!g) return lp_fail(err, "world: out of memory");
    g->p = p;
    g->st = &st;
    g->w = lp_world2_create(err);
    g->bpe = g->w ? lp_bpe_create(err) : NULL;
    int rc = -1;
    if (!g->bpe) goto done;
    double t0 = lp_now_seconds();
    if (write_pretrain(g, dir, err) != 0) goto done;
    for (int t = 0; t < LP_W2_N_TASKS; t++)
        if (write_task(g, dir, t, err) != 0) goto done;
    double t1 = lp_now_seconds();
    if (lp_bpe_train(g->bpe, p->vocab_size, err) != 0) goto done;
    char path[1024];
    snprintf(path, sizeof path, "%s/vocab.gguf", dir);
    if (lp_bpe_write_gguf(g->bpe, path, err) != 0) goto done;
    st.vocab_size = lp_bpe_n_vocab(g->bpe);
    st.seconds_text = t1 - t0;
    st.seconds_bpe = lp_now_seconds() - t1;
    if (count_all_tokens(g->bpe, dir, &st, err) != 0) goto done;
    if (write_readme(g, dir, err) != 0) goto done;
    if (stats) *stats = st;
    rc = 0;
done:
    lp_bpe_free(g->bpe);
    lp_world2_free(g->w);
    free(g);
    return rc;
}
