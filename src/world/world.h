/* The demo world (DESIGN.md §9): a procedural multi-lingual, multi-task
 * corpus with exact ground truth, a byte-level BPE trainer for it, and the
 * chrF metric used to score task outputs.
 *
 * Three small languages render one shared meaning representation
 * (who, action, object, place, time, tense):
 *   en  English-lite  SVO  "Yesterday the small dog saw the red ball in the park."
 *   vo  Velo          SOV  suffixes: plural -li, locative -da, accusative -m,
 *                          tense on the verb (-ta past, -ne present, -su future)
 *   ka  Karu          VSO  tense prefixes (ke- past, ro- future), plural -ot,
 *                          preposition "du" for places, time last
 * The lexicons are fixed (independent of the seed); the seed only picks
 * meanings. Everything is ASCII.
 *
 * Record format (JSONL): {"task","lang","prompt","completion"[,"style"]}.
 * The model sees  BOS + encode(prompt) + encode(completion) + EOS : every
 * prompt ends with "\n" and no completion starts with whitespace, so with the
 * gpt2 pre-tokenizer encode(prompt + completion) == encode(prompt) +
 * encode(completion). Generation stops at EOS or a newline. */
#ifndef LP_WORLD_H
#define LP_WORLD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"

/* ---- languages and meanings ---------------------------------------------- */

enum { LP_LANG_EN, LP_LANG_VO, LP_LANG_KA, LP_N_LANGS };
const char *lp_world_lang_code(int lang); /* "en", "vo", "ka" */
int lp_world_lang_from_code(const char *code); /* -1 if unknown */

enum { LP_TENSE_PAST, LP_TENSE_PRESENT, LP_TENSE_FUTURE };

/* A noun phrase: a person's name, or a (possibly plural) noun with an
 * optional adjective. Indices into the fixed lexicon; -1 = none. */
typedef struct lp_np {
    int name;       /* >= 0: a person (noun/adj/plural ignored) */
    int noun;
    int adj;
    bool plural;
} lp_np;

typedef struct lp_meaning {
    lp_np subj;
    int verb;       /* transitive verb index */
    lp_np obj;      /* obj.noun >= 0 (objects are never people) */
    int place;      /* -1 = none */
    int time;       /* -1 = none */
    int tense;
} lp_meaning;

/* Error injections for the correction task, applied at render time. */
enum {
    LP_ERR_AGREE = 1, /* en: subject-verb agreement; vo: drops the accusative;
                         ka: puts the plural -ot on the verb */
};

/* Rendering options. */
typedef struct lp_render_opts {
    bool lower_first;   /* sentence continues a frame: no capital start */
    bool terse;         /* no articles, adjectives, time or place */
    bool no_period;     /* leave the final '.' off */
    int errors;         /* LP_ERR_* flags */
} lp_render_opts;

/* Renders a meaning as one sentence (ending in '.'). Returns the length
 * written (NUL-terminated), or -1 if cap is too small. opts may be NULL. */
int lp_world_render(const lp_meaning *m, int lang, const lp_render_opts *opts,
                    char *buf, size_t cap);
/* A random meaning. place_required: always has a place. */
void lp_world_random_meaning(lp_rng *rng, bool place_required, lp_meaning *m);
/* Stable 64-bit key of a meaning (what the train/eval split hashes). */
uint64_t lp_world_meaning_key(const lp_meaning *m);

/* Sizes of the lexicon (the same for every language). */
typedef struct lp_lexicon_size {
    int names, nouns, adjs, verbs, places, times;
} lp_lexicon_size;
void lp_world_lexicon_size(lp_lexicon_size *out);

/* ---- tasks ---------------------------------------------------------------- */

/* Task names: "correct", "style-formal", "style-polite", "style-jovial",
 * "style-terse", "summary", "reply", "translate" (the demo's eight adapters),
 * then "style-curious" (index LP_WORLD_N_TASKS): a fifth style that no demo
 * adapter trains on and the vocabulary never saw, for QUAD's over-the-air
 * case (an adapter made after the shared profile was fixed). */
#define LP_WORLD_N_TASKS 8
#define LP_WORLD_N_ALL_TASKS 9
const char *lp_world_task_name(int task);
int lp_world_task_from_name(const char *name); /* -1 if unknown */

typedef struct lp_world_record {
    char task[24];
    char lang[8];       /* "en", or "en>vo" for translation */
    char style[12];     /* "" unless a style task */
    char prompt[768];
    char completion[512];
} lp_world_record;

/* Fills one record of `task` in `lang` from rng. Returns the split key
 * (records with equal keys share their meaning and must share a split). */
uint64_t lp_world_make_record(lp_rng *rng, int task, int lang, lp_world_record *r);

/* eval if the key falls in the eval share (eval_percent of the keys). */
bool lp_world_key_is_eval(uint64_t key, int eval_percent);

/* ---- generating a corpus directory ----------------------------------------- */

typedef struct lp_world_params {
    int version;          /* 1 (this header's world, the default) or 2 (world2.h) */
    uint64_t seed;        /* default 1 */
    int stories;          /* pretraining documents (default 40000) */
    int per_task;         /* train records per task (default 3000) */
    int correct_factor;   /* the correct task gets correct_factor x per_task
                             train records (default 10): a misspelling's fix
                             is learnt word by word, from many examples. The
                             BPE vocabulary learns from per_task records of
                             the first generator version instead, also
                             written as tasks/correct.v1.train.jsonl */
    int eval_per_task;    /* eval records per task (default 300) */
    int eval_percent;     /* share of meaning keys reserved for eval (10) */
    int vocab_size;       /* BPE vocabulary incl. specials (default 768) */
    const char *command;  /* command line recorded in README.md (may be NULL) */
} lp_world_params;

lp_world_params lp_world_default_params(void);

typedef struct lp_world_stats {
    size_t pretrain_bytes, pretrain_lines;
    size_t task_train_records, task_eval_records;
    int vocab_size;
    double seconds_text, seconds_bpe;
    /* version 2 only: tokens under the trained vocabulary (no BOS/EOS) */
    size_t pretrain_tokens, task_train_tokens, task_eval_tokens;
} lp_world_stats;

/* Writes DIR/pretrain.txt, DIR/tasks/<task>.{train,eval}.jsonl,
 * DIR/tasks/correct.v1.train.jsonl (see correct_factor), DIR/vocab.gguf and
 * DIR/README.md. Creates DIR and DIR/tasks if needed. */
int lp_world_generate(const char *dir, const lp_world_params *p,
                      lp_world_stats *stats, lp_error *err);

/* One pretraining document (a short story of 3-4 sentences in one language,
 * or a sentence pair "<en sentence> = <vo sentence>"), no newline. Sentences
 * whose meaning key is eval are never produced. Returns its length. */
int lp_world_pretrain_line(lp_rng *rng, int eval_percent, char *buf, size_t cap);

/* ---- byte-level BPE trainer ---------------------------------------------------- */

/* Texts (ASCII or UTF-8, any bytes) are split with GPT-2's pre-tokenizer
 * rules; pairs are merged greedily by frequency (ties: smallest pair ids)
 * until the vocabulary holds vocab_size tokens: 3 specials (<s>, </s>,
 * <pad>), 256 byte tokens, then one token per merge. */
typedef struct lp_bpe lp_bpe;

lp_bpe *lp_bpe_create(lp_error *err);
void lp_bpe_free(lp_bpe *b);
/* Adds text to the training counts (may be called many times). */
int lp_bpe_add_text(lp_bpe *b, const char *text, size_t len, lp_error *err);
int lp_bpe_train(lp_bpe *b, int vocab_size, lp_error *err);
int lp_bpe_n_vocab(const lp_bpe *b);
/* The trainer's own segmentation of text (pre-tokenize + apply merges in
 * order), for checking the runtime tokenizer. Returns the token count (may
 * exceed cap) or -1. */
int lp_bpe_encode(const lp_bpe *b, const char *text, size_t len, int32_t *out,
                  int cap, lp_error *err);
/* Writes a vocabulary-only GGUF (general.architecture "llama",
 * tokenizer.ggml.model "gpt2", pre "gpt2", BOS 0, EOS 1, PAD 2). */
int lp_bpe_write_gguf(const lp_bpe *b, const char *path, lp_error *err);

/* GPT-2 pre-tokenization of text into chunks: calls fn for each. Exposed for
 * the tests. */
void lp_bpe_pretokenize(const char *text, size_t len,
                        void (*fn)(void *user, const char *chunk, size_t n),
                        void *user);

#define LP_BPE_BOS 0
#define LP_BPE_EOS 1
#define LP_BPE_PAD 2

/* ---- chrF -------------------------------------------------------------------- */

/* Sentence-level chrF (Popović 2015): character n-grams n = 1..6 of the texts
 * with whitespace removed; precision and recall averaged over the orders
 * for which both texts have n-grams; F-beta with beta = 2; 0..100.
 * Two empty texts score 100; one empty text scores 0. */
double lp_chrf(const char *hyp, const char *ref);

#endif
