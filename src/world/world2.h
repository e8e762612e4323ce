/* The demo world, version 2 (issue 20): nine languages in six scripts that
 * render one shared meaning representation, and nine tasks with exact
 * ground truth. Version 1 (world.h) is unchanged and stays the default of
 * `loraplex world` until the demo moves to version 2 (`--version 2`).
 *
 *   code  language  script                order  grammar
 *   en    English   Latin                 SVO    articles, -s plural (and
 *                                                irregular), 3sg -s, irregular
 *                                                past, "will" future
 *   vl    Velin     Latin + diacritics    SOV    agglutinative: stem-PLURAL-CASE,
 *                                                vowel harmony (back a/o/u/â,
 *                                                front e/i/ö/ü) picks every
 *                                                suffix, buffer consonants
 *   bo    Borsk     Cyrillic              SVO    3 genders, nominative /
 *                                                accusative / prepositional,
 *                                                adjectives agree, past agrees
 *                                                in gender, present in number
 *   th    Thalic    Greek                 VSO    gendered articles in two
 *                                                cases (also before names),
 *                                                augment past, "θα" future
 *   hn    Hanmal    Hangul syllables      SOV    case particles whose form
 *                                                depends on the final consonant
 *                                                (이/가, 을/를), plural -들,
 *                                                tense suffixes by vowel harmony
 *   sr    Saru      Devanagari            SOV    2 genders, postpositions, the
 *                                                verb agrees with the subject's
 *                                                gender and number in every tense
 *   za    Zamba     Latin                 SVO    noun classes (prefix pairs
 *                                                sg/pl), class concord on
 *                                                adjectives and on the verb,
 *                                                tense infix, locative -ni
 *   or    Orvai     Latin + diacritics    VOS    determiners (sg / pl / person),
 *                                                tense prefixes, the verb
 *                                                agrees with the object's number
 *   er    Ergo      Armenian              SOV    ergative: the subject of a
 *                                                transitive verb takes -ով, of
 *                                                "go" none; plural by
 *                                                reduplicating the first syllable
 *
 * The lexicons of the eight invented languages are made by a fixed
 * procedure (independent of the world's seed) from each language's sounds:
 * every stem is unique in its language, and no stem is one swap of two
 * adjacent letters (syllables in Hangul, aksharas in Devanagari) away from
 * another stem or from another stem's swap, which keeps the correction task
 * unambiguous. The world's seed only picks meanings.
 *
 * Tasks (prompt tag: completion): correct "fix:", the styles "formal:",
 * "polite:", "jovial:", "terse:" and a fifth, "curious:", that no demo
 * adapter trains on (the QUAD over-the-air case), "summary:", "reply:",
 * "xx>yy:" translation between any two languages, and "compose:" (a
 * message from an intent and keywords). Records and the model input as in
 * version 1 (world.h). */
#ifndef LP_WORLD2_H
#define LP_WORLD2_H

#include "world.h"

enum {
    LP_W2_EN, LP_W2_VL, LP_W2_BO, LP_W2_TH, LP_W2_HN, LP_W2_SR, LP_W2_ZA, LP_W2_OR, LP_W2_ER,
    LP_W2_N_LANGS
};
const char *lp_world2_lang_code(int lang);   /* "en", "vl", ... */
const char *lp_world2_lang_name(int lang);   /* "English", "Velin", ... */
const char *lp_world2_lang_script(int lang); /* "Latin", "Cyrillic", ... */
const char *lp_world2_lang_order(int lang);  /* "SVO", "SOV", "VSO", "VOS" */
int lp_world2_lang_from_code(const char *code);

/* Lexicon sizes: as version 1 with 13 times (yesterday, today, tomorrow,
 * in the morning, in the evening, at night, Monday..Sunday). */
enum { LP_W2_NAMES = 12, LP_W2_NOUNS = 40, LP_W2_AGENTS = 10, LP_W2_ADJS = 12,
       LP_W2_VERBS = 20, LP_W2_PLACES = 12, LP_W2_TIMES = 13 };
enum { LP_W2_TIME_YESTERDAY = 0, LP_W2_TIME_TOMORROW = 2, LP_W2_TIME_MONDAY = 6 };

/* Word categories (for lp_world2_word and the correction task's swaps). */
enum { LP_W2_CAT_NAME, LP_W2_CAT_NOUN, LP_W2_CAT_ADJ, LP_W2_CAT_VERB, LP_W2_CAT_PLACE,
       LP_W2_CAT_TIME, LP_W2_CAT_FUNC, LP_W2_N_CATS };
#define LP_W2_FUNCS 64 /* function words per invented language (templates) */

/* The lexicons and grammars: built once (deterministic, ~100 KB), read-only
 * after. */
typedef struct lp_world2 lp_world2;
lp_world2 *lp_world2_create(lp_error *err);
void lp_world2_free(lp_world2 *w);

/* A lexicon entry's stem (dictionary form for English) and its class
 * (gender, noun class or vowel-harmony class; 0 where none). */
const char *lp_world2_word(const lp_world2 *w, int lang, int cat, int index);
int lp_world2_word_class(const lp_world2 *w, int lang, int cat, int index);

/* Rendering options. swap: up to two lexicon items whose stem is written
 * with the units at pos and pos + 1 exchanged (the correction task's
 * misspellings); agree_error: the language's agreement error (en: present
 * 3sg/plural form flipped or "will" + -s; vl: object without the
 * accusative; bo: wrong gender/number on the verb; th: the object's article
 * of another gender; hn: the particle allomorph of the other final; sr: the
 * verb in the other gender; za: the subject concord of another class; or:
 * the object agreement flipped; er: no ergative on the subject). */
typedef struct lp_w2_swap {
    int cat, index, pos;
} lp_w2_swap;

typedef struct lp_w2_opts {
    bool lower_first;   /* continues a frame: no capital (names keep theirs) */
    bool terse;         /* no adjectives, articles/determiners, time, place */
    bool no_period;
    bool agree_error;
    int n_swaps;
    lp_w2_swap swap[2];
} lp_w2_opts;

/* Renders m (the version-1 meaning structure with version-2 indices) as
 * one sentence. Returns the byte length or -1 if cap is too small. */
int lp_world2_render(const lp_world2 *w, const lp_meaning *m, int lang, const lp_w2_opts *o,
                     char *buf, size_t cap);
void lp_world2_random_meaning(lp_rng *rng, bool place_required, lp_meaning *m);
/* Whether the agreement error changes the sentence of m in lang (it needs
 * e.g. a present or future verb in English). */
bool lp_world2_agree_applies(const lp_meaning *m, int lang);

/* Units of a word (code points, with Devanagari vowel signs and marks
 * joined to their consonant): the letters a swap exchanges. */
int lp_world2_units(const char *word, size_t *starts, int cap);

/* ---- tasks ------------------------------------------------------------------- */

enum { LP_W2_T_CORRECT, LP_W2_T_FORMAL, LP_W2_T_POLITE, LP_W2_T_JOVIAL, LP_W2_T_TERSE,
       LP_W2_T_CURIOUS, LP_W2_T_SUMMARY, LP_W2_T_REPLY, LP_W2_T_TRANSLATE, LP_W2_T_COMPOSE,
       LP_W2_N_TASKS };
const char *lp_world2_task_name(int task); /* "correct", ..., "style-curious", "compose" */
int lp_world2_task_from_name(const char *name);
/* Whether the demo trains an adapter on the task (all but style-curious,
 * the unseen style). */
bool lp_world2_task_trained(int task);

/* One record of task in lang (for translation lang is the source, the
 * target drawn). Returns the split key. */
uint64_t lp_world2_make_record(const lp_world2 *w, lp_rng *rng, int task, int lang,
                               lp_world_record *r);
/* One pretraining document; no sentence of an eval meaning. */
int lp_world2_pretrain_line(const lp_world2 *w, lp_rng *rng, int eval_percent, char *buf,
                            size_t cap);

/* The correction record for a given meaning (for the ambiguity tests). */
void lp_world2_make_correct(const lp_world2 *w, lp_rng *rng, const lp_meaning *m, int lang,
                            lp_world_record *r);

/* Composer input: an intent and its keywords; the message is exact. */
enum { LP_W2_INTENT_INVITE, LP_W2_INTENT_THANK, LP_W2_INTENT_REMIND, LP_W2_INTENT_ASK,
       LP_W2_INTENT_MEET, LP_W2_N_INTENTS };
typedef struct lp_w2_compose {
    int intent, name, time, place, noun; /* -1 where the intent has no slot */
} lp_w2_compose;
void lp_world2_compose(const lp_world2 *w, const lp_w2_compose *c, int lang,
                       lp_world_record *r);

/* ---- the corpus directory --------------------------------------------------------- */

/* Defaults for version 2: seed 1, 200000 documents, 3000 train records per
 * task (correct, translate and compose x10), 300 eval, 10% eval meanings,
 * vocabulary 4096 (the largest the trainer takes: see scripts/make_demo_v2.sh
 * for why). */
lp_world_params lp_world2_default_params(void);
/* Writes the version-2 corpus (the same files as version 1, without
 * correct.v1.train.jsonl, plus tasks/compose.* and tasks/style-curious.*). */
int lp_world2_generate(const char *dir, const lp_world_params *p, lp_world_stats *stats,
                       lp_error *err);

#endif
