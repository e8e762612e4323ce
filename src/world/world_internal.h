/* Private to src/world: the string builder and rendering pieces shared by
 * the language (lang.c) and task (tasks.c) code. */
#ifndef LP_WORLD_INTERNAL_H
#define LP_WORLD_INTERNAL_H

#include <stdio.h>

#include "world.h"

/* A bounded string builder: never writes past cap, remembers overflow. */
typedef struct sb {
    char *buf;
    size_t len, cap;
    bool overflow;
} sb;

void sb_put(sb *s, const char *text);
void sb_word(sb *s, const char *w);           /* space-separated */
void sb_word2(sb *s, const char *a, const char *b);

/* Rendering pieces (lang.c). verb -1 = "go". */
void world_np(sb *s, const lp_np *np, int lang, bool object);
void world_verb(sb *s, int verb, int tense, int lang, const lp_np *subj);
void world_place(sb *s, int place, int lang, bool dest, bool drop_prep);
void world_time(sb *s, int time, int lang);
void world_clause(sb *s, const lp_meaning *m, int lang, const lp_render_opts *o);
void world_case_first(sb *s, size_t from, bool lower, bool starts_with_name);
const char *world_name(int name);

/* Time indices with a fixed tense (lang.c's time lexicon). */
enum { WORLD_TIME_YESTERDAY = 0, WORLD_TIME_TOMORROW = 2 };

/* lp_world_make_record; v1: correction records as the first generator
 * version made them (kept for the BPE vocabulary, see generate.c). */
uint64_t world_make_record(lp_rng *rng, int task, int lang, bool v1, lp_world_record *r);

/* The correction task's prompt and completion for m (r's prompt and
 * completion only). */
void world_make_correct(lp_rng *rng, const lp_meaning *m, int lang, bool v1,
                        lp_world_record *r);

int world_rand(lp_rng *rng, int n);
void world_random_np(lp_rng *rng, bool agent, lp_np *np);
int world_random_time(lp_rng *rng, int tense);
uint64_t world_core_key(const lp_meaning *m);
uint64_t world_mix(uint64_t h, int64_t v);

/* ---- version 2 (w2_lang.c, w2_tasks.c, w2_generate.c) ---- */
struct lp_world2;
struct lp_w2_opts;
const char *world2_period(int lang);
/* capitalizes the first letter of s in place (our scripts with case) */
void world2_upper_first(char *s);
void world2_clause(const struct lp_world2 *w, sb *s, const lp_meaning *m, int lang,
                   const struct lp_w2_opts *o);
void world2_go(const struct lp_world2 *w, sb *s, const lp_np *subj, int place, int time, int lang,
               const struct lp_w2_opts *o);
void world2_go_and(const struct lp_world2 *w, sb *s, const lp_meaning *act, int place, int lang);
/* kind: 'O' definite object, 'D' destination, 'L' place, 'T' time, 'K' a
 * noun's dictionary form */
void world2_piece(const struct lp_world2 *w, sb *s, char kind, const lp_np *np, int place,
                  int time, int lang);
int world2_random_time(lp_rng *rng, int tense);
void world2_random_np(lp_rng *rng, bool agent, lp_np *np);

/* generate.c's writers, shared with version 2 */
typedef struct world_hash_set {
    uint64_t *slots;
    size_t mask;
} world_hash_set;
bool world_set_insert(world_hash_set *s, uint64_t h);
uint64_t world_hash_str(const char *s);
void world_write_record(FILE *f, const lp_world_record *r);
FILE *world_open_out(const char *dir, const char *name, char *path, size_t cap, lp_error *err);
int world_close_out(FILE *f, const char *path, lp_error *err);
int world_make_dir(const char *path, lp_error *err);

/* A task's records drawn (every version): languages in turn, a record to
 * eval when its meaning key is an eval key, repeated prompts dropped, until
 * n_train train and n_eval eval records are found. The eval records do not
 * depend on n_train (the sequence drawn is the same either way). */
typedef uint64_t (*world_make_fn)(const void *user, lp_rng *rng, int task, int lang, lp_world_record *r);
typedef struct world_draw {
    const char *task_name;
    int task, n_langs;
    world_make_fn make;       /* one record for a language; returns its meaning key */
    const void *user;
    uint64_t seed;            /* the task's RNG seed */
    int n_train, n_eval, per_task, eval_percent;
    FILE *train, *eval;       /* NULL: drawn, not written */
    lp_bpe *bpe;              /* learns from the first per_task train records */
    lp_world_record *first;   /* the first train record */
    lp_world_record *by_lang; /* [n_langs] the first train record of each language */
    lp_world_stats *st;       /* counts added */
} world_draw;
int world_draw_records(const world_draw *d, lp_error *err);

#endif
