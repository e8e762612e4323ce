/* Version 2's tasks (world2.h): every record rendered from a meaning or a
 * template's slots by the nine grammars, with one exact answer. */
#include <stdio.h>
#include <string.h>

#include "world2.h"
#include "world_internal.h"

static const char *const task_names[LP_W2_N_TASKS] = {
    "correct",       "style-formal", "style-polite", "style-jovial", "style-terse",
    "style-curious", "summary",      "reply",        "translate",    "compose"};

const char *lp_world2_task_name(int t) { return t >= 0 && t < LP_W2_N_TASKS ? task_names[t] : "?"; }

int lp_world2_task_from_name(const char *name) {
    for (int i = 0; i < LP_W2_N_TASKS; i++)
        if (!strcmp(name, task_names[i])) return i;
    return -1;
}

bool lp_world2_task_trained(int t) { return t >= 0 && t < LP_W2_N_TASKS && t != LP_W2_T_CURIOUS; }

/* Head-final languages (SOV) put a frame's verb-like words last. */
static bool head_final(int lang) {
    return !strcmp(lp_world2_lang_order(lang), "SOV");
}

/* ---- templates ----------------------------------------------------------------- */

/* Slots of a template: {N} name, {O} definite object, {K} a noun's
 * dictionary form, {D} destination, {L} place, {T} time, {Fk} function word
 * k ({^Fk} capitalized), {.} the language's period, {C} a clause given by
 * the caller. The first letter of the result is capitalized. */
typedef struct slots {
    int name, place, time;
    lp_np obj;
    const char *clause; /* {C} */
} slots;

static void upper_at(char *s) { world2_upper_first(s); }

/* A sub-builder at the end of s (pieces render with sb_word, which puts a
 * space before a word unless at the start). */
static void piece(const lp_world2 *w, sb *s, char kind, const slots *sl, int lang) {
    sb o = {.buf = s->buf + s->len, .cap = s->cap - s->len};
    world2_piece(w, &o, kind, &sl->obj, sl->place, sl->time, lang);
    s->len += o.len;
    s->overflow |= o.overflow;
}

static void fill(const lp_world2 *w, sb *s, const char *tpl, const slots *sl, int lang) {
    size_t start = s->len;
    for (const char *p = tpl; *p;) {
        if (*p != '{') {
            char c[2] = {*p++, 0};
            sb_put(s, c);
            continue;
        }
        const char *e = strchr(p, '}');
        if (!e) break;
        bool cap = p[1] == '^';
        const char *k = p + 1 + cap;
        size_t at = s->len;
        switch (*k) {
        case 'N': sb_put(s, lp_world2_word(w, lang, LP_W2_CAT_NAME, sl->name)); break;
        case 'F': {
            int i = 0;
            for (const char *d = k + 1; d < e; d++) i = i * 10 + (*d - '0');
            sb_put(s, lp_world2_word(w, lang, LP_W2_CAT_FUNC, i));
            break;
        }
        case '.': sb_put(s, world2_period(lang)); break;
        case 'C': sb_put(s, sl->clause); break;
        default: piece(w, s, *k, sl, lang); break;
        }
        if (cap && !s->overflow && s->len > at) upper_at(s->buf + at);
        p = e + 1;
    }
    if (!s->overflow && s->len > start) upper_at(s->buf + start);
}

/* ---- styles ----------------------------------------------------------------------- */

/* [style][head-initial / head-final] for the invented languages; English
 * below. {C}: the neutral clause, not capitalized. */
static const char *const style_tpl[4][2] = {
    {"{F2} {F3} {F4}, {C}{.}", "{C}, {F3} {F4} {F2}{.}"},
    {"{F5}, {C}{.} {^F6}{.}", "{F5}, {C}{.} {^F6}{.}"},
    {"{F7}, {C}!", "{F7}, {C}!"},
    {"{F8} {F9}, {C}?", "{C}, {F9} {F8}?"},
};
static const char *const en_style_tpl[4] = {"It is my duty to report that {C}.",
                                            "Please note that {C}. Thank you.", "Wow, {C}!",
                                            "Did you know that {C}?"};

/* style: 0 formal, 1 polite, 2 jovial, 3 curious; 4 terse */
static void render_style(const lp_world2 *w, sb *s, const lp_meaning *m, int lang, int style) {
    if (style == 4) {
        lp_w2_opts o = {.terse = true};
        char buf[512];
        lp_world2_render(w, m, lang, &o, buf, sizeof buf);
        sb_put(s, buf);
        return;
    }
    char clause[512];
    bool hf = head_final(lang) && lang != LP_W2_EN;
    lp_w2_opts o = {.lower_first = true, .no_period = true}; /* fill capitalizes */
    lp_world2_render(w, m, lang, &o, clause, sizeof clause);
    slots sl = {.clause = clause, .name = 0, .place = 0, .time = 0};
    fill(w, s, lang == LP_W2_EN ? en_style_tpl[style] : style_tpl[style][hf], &sl, lang);
}

/* ---- correction ---------------------------------------------------------------------- */

/* The lexicon items a meaning's sentence shows. */
static int items(const lp_meaning *m, lp_w2_swap *out) {
    int n = 0;
    const lp_np *nps[2] = {&m->subj, &m->obj};
    for (int i = 0; i < 2; i++) {
        if (nps[i]->name >= 0) out[n++] = (lp_w2_swap){LP_W2_CAT_NAME, nps[i]->name, 0};
        else out[n++] = (lp_w2_swap){LP_W2_CAT_NOUN, nps[i]->noun, 0};
        if (nps[i]->name < 0 && nps[i]->adj >= 0) out[n++] = (lp_w2_swap){LP_W2_CAT_ADJ, nps[i]->adj, 0};
    }
    out[n++] = (lp_w2_swap){LP_W2_CAT_VERB, m->verb, 0};
    if (m->place >= 0) out[n++] = (lp_w2_swap){LP_W2_CAT_PLACE, m->place, 0};
    if (m->time >= 0) out[n++] = (lp_w2_swap){LP_W2_CAT_TIME, m->time, 0};
    return n;
}

/* A swap position in the item's stem: two different letters (not spaces;
 * not a name's capital). -1 if none. */
static int swap_pos(const lp_world2 *w, lp_rng *rng, int lang, const lp_w2_swap *it) {
    const char *st = lp_world2_word(w, lang, it->cat, it->index);
    size_t u[64];
    int n = lp_world2_units(st, u, 64), cand[64], nc = 0;
    if (n > 64) return -1;
    for (int p = it->cat == LP_W2_CAT_NAME ? 1 : 0; p + 1 < n; p++) {
        size_t a = u[p], b = u[p + 1], e = p + 2 < n ? u[p + 2] : strlen(st);
        bool space = st[a] == ' ' || st[b] == ' ';
        bool same = b - a == e - b && !memcmp(st + a, st + b, b - a);
        if (!space && !same) cand[nc++] = p;
    }
    return nc ? cand[world_rand(rng, nc)] : -1;
}

/* Duplicates one word (not the last, which carries the period). */
static void duplicate_word(lp_rng *rng, char *text, size_t cap) {
    size_t n = strlen(text), starts[64];
    int ns = 0;
    for (size_t i = 0; i < n && ns < 64; i++)
        if (i == 0 || text[i - 1] == ' ') starts[ns++] = i;
    if (ns < 2) return;
    int k = world_rand(rng, ns - 1);
    size_t a = starts[k], b = starts[k + 1];
    if (n + (b - a) + 1 > cap) return;
    memmove(text + b + (b - a), text + b, n - b + 1);
    memcpy(text + b, text + a, b - a);
}

/* One or two errors (the language's agreement error, a swap of two letters
 * in a stem, a duplicated word), or none in one record of ten. A swapped
 * stem is no stem and the swap of only one (the lexicon's construction),
 * the agreement errors are fixed by the rest of the sentence, so every
 * prompt has one answer (tests/test_world.c checks by brute force). */
void lp_world2_make_correct(const lp_world2 *w, lp_rng *rng, const lp_meaning *m, int lang,
                            lp_world_record *r) {
    lp_world2_render(w, m, lang, NULL, r->completion, sizeof r->completion);
    char bad[sizeof r->prompt - 8]; /* room for "fix: " and the newline */
    snprintf(bad, sizeof bad, "%s", r->completion);
    if (world_rand(rng, 10) != 0) {
        int n_errors = 1 + world_rand(rng, 2);
        lp_w2_swap its[8];
        int n_items = items(m, its);
        for (int attempt = 0; attempt < 8; attempt++) {
            lp_w2_opts o = {0};
            bool dup = false;
            for (int e = 0; e < n_errors; e++) {
                int kind = world_rand(rng, 3);
                if (kind == 0 && (o.agree_error || !lp_world2_agree_applies(m, lang))) kind = 1;
                if (kind == 0) o.agree_error = true;
                if (kind == 2) dup = true;
                if (kind == 1) {
                    lp_w2_swap it = its[world_rand(rng, n_items)];
                    bool again = o.n_swaps && o.swap[0].cat == it.cat && o.swap[0].index == it.index;
                    it.pos = swap_pos(w, rng, lang, &it);
                    if (it.pos >= 0 && !again) o.swap[o.n_swaps++] = it;
                }
            }
            lp_world2_render(w, m, lang, &o, bad, sizeof bad - 160);
            if (dup) duplicate_word(rng, bad, sizeof bad);
            if (strcmp(bad, r->completion)) break;
        }
    }
    snprintf(r->prompt, sizeof r->prompt, "fix: %s\n", bad);
}

/* ---- summary ---------------------------------------------------------------------------- */

#define N_FILLERS 5
static const char *const en_fillers[N_FILLERS] = {"The weather was warm.", "The sky was grey.",
                                                  "It was a quiet day.", "The wind was cold.",
                                                  "Everyone was busy."};

static void filler(const lp_world2 *w, sb *s, int lang, int k) {
    if (lang == LP_W2_EN) {
        sb_put(s, en_fillers[k]);
        return;
    }
    char tpl[64];
    snprintf(tpl, sizeof tpl, "{F%d} {F%d} {F%d}{.}", 10 + 3 * k, 11 + 3 * k, 12 + 3 * k);
    slots sl = {0};
    fill(w, s, tpl, &sl, lang);
}

typedef struct story {
    lp_meaning act;
    int place, time;
    int filler[2];
} story;

static void random_story(lp_rng *rng, story *st) {
    lp_world2_random_meaning(rng, false, &st->act);
    st->act.tense = LP_TENSE_PAST;
    st->act.place = -1;
    st->act.time = -1;
    st->place = world_rand(rng, LP_W2_PLACES);
    st->time = world_rand(rng, 2) == 0 ? world2_random_time(rng, LP_TENSE_PAST) : -1;
    st->filler[0] = world_rand(rng, N_FILLERS);
    st->filler[1] = world_rand(rng, 2) == 0 ? world_rand(rng, N_FILLERS) : -1;
}

static void render_story(const lp_world2 *w, sb *s, const story *st, int lang) {
    world2_go(w, s, &st->act.subj, st->place, st->time, lang, NULL);
    sb_put(s, world2_period(lang));
    sb_put(s, " ");
    filler(w, s, lang, st->filler[0]);
    sb_put(s, " ");
    char buf[512];
    lp_world2_render(w, &st->act, lang, NULL, buf, sizeof buf);
    sb_put(s, buf);
    if (st->filler[1] >= 0) {
        sb_put(s, " ");
        filler(w, s, lang, st->filler[1]);
    }
}

/* ---- smart reply and composer ------------------------------------------------------------- */

#define N_REPLY 6
static const char *const en_reply[N_REPLY][2] = {
    {"Hello, I am {N}.", "Nice to meet you, {N}."},
    {"Thank you for {O}.", "You are welcome, enjoy {O}."},
    {"Do you want to go {D} {T}?", "Yes, I will go {D} {T}."},
    {"Do you like {O}?", "Yes, I like {O} very much."},
    {"Sorry, I lost {O}.", "No problem, we will find {O}."},
    {"Goodbye, {N}.", "See you soon, {N}."}};
/* [intent][head-initial / head-final][message, reply] */
static const char *const reply_tpl[N_REPLY][2][2] = {
    {{"{F25}, {F26} {N}{.}", "{F27} {F28}, {N}{.}"}, {"{F25}, {N} {F26}{.}", "{F27} {F28}, {N}{.}"}},
    {{"{F29} {O}{.}", "{F30}, {F31} {O}{.}"}, {"{O} {F29}{.}", "{F30}, {O} {F31}{.}"}},
    {{"{F32} {D} {T}?", "{F33}, {F34} {D} {T}{.}"}, {"{T} {D} {F32}?", "{F33}, {T} {D} {F34}{.}"}},
    {{"{F35} {O}?", "{F33}, {F36} {O} {F37}{.}"}, {"{O} {F35}?", "{F33}, {O} {F37} {F36}{.}"}},
    {{"{F38}, {F39} {O}{.}", "{F40}, {F41} {O}{.}"}, {"{F38}, {O} {F39}{.}", "{F40}, {O} {F41}{.}"}},
    {{"{F42}, {N}{.}", "{F43} {F44}, {N}{.}"}, {"{F42}, {N}{.}", "{F43} {F44}, {N}{.}"}}};

static const char *reply_text(int lang, int intent, int which) {
    if (lang == LP_W2_EN) return en_reply[intent][which];
    return reply_tpl[intent][head_final(lang)][which];
}

/* The composer: intent keyword, then the slots in a fixed order. */
static const char *const en_intent[LP_W2_N_INTENTS] = {"invite", "thank", "remind", "ask", "meet"};
static const char *const en_compose[LP_W2_N_INTENTS] = {
    "Hi {N}, do you want to come {D} {T}?", "Dear {N}, thank you for {O}.",
    "{N}, please bring {O} {T}.", "{N}, do you have {O}?", "{N}, let us meet {L} {T}."};
static const char *const compose_tpl[LP_W2_N_INTENTS][2] = {
    {"{F46} {N}, {F47} {F48} {D} {T}?", "{F46} {N}, {T} {D} {F48} {F47}?"},
    {"{F49} {N}, {F50} {O}{.}", "{F49} {N}, {O} {F50}{.}"},
    {"{N}, {F51} {F52} {O} {T}{.}", "{N}, {T} {O} {F52} {F51}{.}"},
    {"{N}, {F53} {O}?", "{N}, {O} {F53}?"},
    {"{N}, {F54} {L} {T}{.}", "{N}, {T} {L} {F54}{.}"}};
/* which slots follow the name in the prompt: T time, P place, K noun */
static const char *const compose_keys[LP_W2_N_INTENTS] = {"TP", "K", "TK", "K", "PT"};

void lp_world2_compose(const lp_world2 *w, const lp_w2_compose *c, int lang, lp_world_record *r) {
    slots sl = {.name = c->name, .place = c->place, .time = c->time,
                .obj = {.name = -1, .noun = c->noun, .adj = -1}};
    sb p = {.buf = r->prompt, .cap = sizeof r->prompt};
    sb_put(&p, "compose: ");
    sb_put(&p, lang == LP_W2_EN ? en_intent[c->intent]
                                : lp_world2_word(w, lang, LP_W2_CAT_FUNC, 56 + c->intent));
    sb_put(&p, ", ");
    sb_put(&p, lp_world2_word(w, lang, LP_W2_CAT_NAME, c->name));
    for (const char *k = compose_keys[c->intent]; *k; k++) {
        sb_put(&p, ", ");
        if (*k == 'T') {
            const char *t = lp_world2_word(w, lang, LP_W2_CAT_TIME, c->time);
            sb_put(&p, lang == LP_W2_EN && !strncmp(t, "on ", 3) ? t + 3 : t);
        } else if (*k == 'P') {
            sb_put(&p, lp_world2_word(w, lang, LP_W2_CAT_PLACE, c->place));
        } else {
            sb o = {.buf = p.buf + p.len, .cap = p.cap - p.len};
            world2_piece(w, &o, 'K', &sl.obj, -1, -1, lang);
            p.len += o.len;
            p.overflow |= o.overflow;
        }
    }
    sb_put(&p, "\n");
    sb m = {.buf = r->completion, .cap = sizeof r->completion};
    fill(w, &m, lang == LP_W2_EN ? en_compose[c->intent] : compose_tpl[c->intent][head_final(lang)],
         &sl, lang);
}

/* ---- records ------------------------------------------------------------------------------- */

static uint64_t make_reply(const lp_world2 *w, lp_rng *rng, int lang, lp_world_record *r) {
    int intent = world_rand(rng, N_REPLY);
    slots sl = {.name = world_rand(rng, LP_W2_NAMES), .place = world_rand(rng, LP_W2_PLACES)};
    do sl.time = world_rand(rng, LP_W2_TIMES);
    while (sl.time == LP_W2_TIME_YESTERDAY); /* the invitation is ahead */
    world2_random_np(rng, false, &sl.obj);
    sb p = {.buf = r->prompt, .cap = sizeof r->prompt};
    sb_put(&p, "reply: ");
    fill(w, &p, reply_text(lang, intent, 0), &sl, lang);
    sb_put(&p, "\n");
    sb c = {.buf = r->completion, .cap = sizeof r->completion};
    fill(w, &c, reply_text(lang, intent, 1), &sl, lang);
    /* the key covers exactly the slots the intent uses (the same in every
     * language, so a meaning is in one split everywhere) */
    const char *tpl = en_reply[intent][0];
    uint64_t h = world_mix(0x7e92, intent);
    if (strstr(tpl, "{N}")) h = world_mix(h, sl.name);
    if (strstr(tpl, "{D}")) h = world_mix(world_mix(h, sl.place), sl.time);
    if (strstr(tpl, "{O}"))
        h = world_mix(world_mix(world_mix(h, sl.obj.noun), sl.obj.adj), sl.obj.plural);
    return h;
}

static uint64_t make_compose(const lp_world2 *w, lp_rng *rng, int lang, lp_world_record *r) {
    lp_w2_compose c = {.intent = world_rand(rng, LP_W2_N_INTENTS), .name = world_rand(rng, LP_W2_NAMES),
                       .time = -1, .place = -1, .noun = -1};
    const char *k = compose_keys[c.intent];
    if (strchr(k, 'T')) {
        do c.time = world_rand(rng, LP_W2_TIMES);
        while (c.time == LP_W2_TIME_YESTERDAY);
    }
    if (strchr(k, 'P')) c.place = world_rand(rng, LP_W2_PLACES);
    if (strchr(k, 'K')) c.noun = LP_W2_AGENTS + world_rand(rng, LP_W2_NOUNS - LP_W2_AGENTS);
    lp_world2_compose(w, &c, lang, r);
    uint64_t h = world_mix(world_mix(0xc0b0, c.intent), c.name);
    h = world_mix(world_mix(h, c.time), c.place);
    return world_mix(h, c.noun);
}

uint64_t lp_world2_make_record(const lp_world2 *w, lp_rng *rng, int task, int lang,
                               lp_world_record *r) {
    memset(r, 0, sizeof *r);
    snprintf(r->task, sizeof r->task, "%s", lp_world2_task_name(task));
    snprintf(r->lang, sizeof r->lang, "%s", lp_world2_lang_code(lang));
    char src[512];
    lp_meaning m;
    switch (task) {
    case LP_W2_T_CORRECT:
        lp_world2_random_meaning(rng, false, &m);
        lp_world2_make_correct(w, rng, &m, lang, r);
        return world_core_key(&m);
    case LP_W2_T_FORMAL: case LP_W2_T_POLITE: case LP_W2_T_JOVIAL: case LP_W2_T_TERSE:
    case LP_W2_T_CURIOUS: {
        static const int style_of[] = {0, 1, 2, 4, 3};
        const char *tag = task_names[task] + 6;
        snprintf(r->style, sizeof r->style, "%s", tag);
        lp_world2_random_meaning(rng, true, &m);
        lp_world2_render(w, &m, lang, NULL, src, sizeof src);
        snprintf(r->prompt, sizeof r->prompt, "%s: %s\n", tag, src);
        sb c = {.buf = r->completion, .cap = sizeof r->completion};
        render_style(w, &c, &m, lang, style_of[task - LP_W2_T_FORMAL]);
        return world_core_key(&m);
    }
    case LP_W2_T_SUMMARY: {
        story st;
        random_story(rng, &st);
        sb p = {.buf = r->prompt, .cap = sizeof r->prompt};
        sb_put(&p, "summary: ");
        render_story(w, &p, &st, lang);
        sb_put(&p, "\n");
        sb c = {.buf = r->completion, .cap = sizeof r->completion};
        world2_go_and(w, &c, &st.act, st.place, lang);
        sb_put(&c, world2_period(lang));
        return world_core_key(&st.act);
    }
    case LP_W2_T_REPLY:
        return make_reply(w, rng, lang, r);
    case LP_W2_T_COMPOSE:
        return make_compose(w, rng, lang, r);
    default: { /* translation into any of the eight other languages */
        int to = (lang + 1 + world_rand(rng, LP_W2_N_LANGS - 1)) % LP_W2_N_LANGS;
        snprintf(r->lang, sizeof r->lang, "%s>%s", lp_world2_lang_code(lang),
                 lp_world2_lang_code(to));
        lp_world2_random_meaning(rng, false, &m);
        lp_world2_render(w, &m, lang, NULL, src, sizeof src);
        snprintf(r->prompt, sizeof r->prompt, "%s: %s\n", r->lang, src);
        lp_world2_render(w, &m, to, NULL, r->completion, sizeof r->completion);
        return world_core_key(&m);
    }
    }
}

/* ---- pretraining documents ---------------------------------------------------------------- */

static void train_meaning(lp_rng *rng, int eval_percent, lp_meaning *m) {
    do lp_world2_random_meaning(rng, false, m);
    while (lp_world_key_is_eval(world_core_key(m), eval_percent));
}

/* A record of task in lang whose meaning is outside the eval split. */
static void train_record(const lp_world2 *w, lp_rng *rng, int eval_percent, int task, int lang,
                         lp_world_record *r) {
    uint64_t key;
    do key = lp_world2_make_record(w, rng, task, lang, r);
    while (lp_world_key_is_eval(key, eval_percent));
}

/* The sentences a task writes (its output; for smart reply a message and
 * the reply to another), of meanings outside the eval split, without the
 * task's prompt: the base meets every word and phrase the tasks write (a
 * style's frame, a summary's "and", a message's greeting) but never a
 * prompt next to its answer, so alone it still scores ~0 on every task. */
static void task_sentences(const lp_world2 *w, lp_rng *rng, int eval_percent, int lang, sb *s) {
    static const int kinds[] = {LP_W2_T_FORMAL,  LP_W2_T_POLITE,  LP_W2_T_JOVIAL,
                                LP_W2_T_TERSE,   LP_W2_T_CURIOUS, LP_W2_T_SUMMARY,
                                LP_W2_T_REPLY,   LP_W2_T_COMPOSE};
    int task = kinds[world_rand(rng, (int)(sizeof kinds / sizeof kinds[0]))];
    lp_world_record r;
    train_record(w, rng, eval_percent, task, lang, &r);
    if (task == LP_W2_T_REPLY) {
        /* a message (the prompt after "reply: ", without its newline) and
         * the reply to another one, in either order: a reply opens a line in
         * its record, where its first word is cut into other tokens than
         * after a space, so replies must open documents too */
        char message[sizeof r.prompt];
        size_t skip = strlen("reply: "), n = strlen(r.prompt) - 1 - skip;
        memcpy(message, r.prompt + skip, n);
        message[n] = '\0';
        train_record(w, rng, eval_percent, task, lang, &r);
        bool reply_first = world_rand(rng, 2);
        sb_put(s, reply_first ? r.completion : message);
        sb_put(s, " ");
        sb_put(s, reply_first ? message : r.completion);
        return;
    }
    sb_put(s, r.completion);
}

int lp_world2_pretrain_line(const lp_world2 *w, lp_rng *rng, int eval_percent, char *buf,
                            size_t cap) {
    if (cap == 0) return -1;
    sb s = {.buf = buf, .cap = cap};
    buf[0] = '\0';
    /* 2 in 10 stories, 2 in 10 runs of sentences, 4 in 10 sentence pairs,
     * 2 in 10 runs of the tasks' sentences. Pairs: a base that learned nine
     * lexicons from monolingual text alone has no translation for an adapter
     * to draw on (0 % exact match at 1 in 5 pairs). The tasks' sentences:
     * without them the words only the tasks write (a style's frame, "you",
     * "and") are tokens the base never saw, which adapters on q..down cannot
     * teach it (compose 24 % exact match; models/demo-v2/README.md). */
    int kind = world_rand(rng, 10);
    int lang = world_rand(rng, LP_W2_N_LANGS);
    char tmp[512];
    if (kind < 2) { /* a story like the summary task's */
        story st;
        do random_story(rng, &st);
        while (lp_world_key_is_eval(world_core_key(&st.act), eval_percent));
        render_story(w, &s, &st, lang);
    } else if (kind < 4) { /* three or four sentences about one subject */
        lp_meaning m;
        train_meaning(rng, eval_percent, &m);
        int n = 3 + world_rand(rng, 2);
        for (int i = 0; i < n; i++) {
            lp_meaning next;
            do {
                lp_world2_random_meaning(rng, false, &next);
                next.subj = m.subj;
            } while (lp_world_key_is_eval(world_core_key(&next), eval_percent));
            lp_world2_render(w, &next, lang, NULL, tmp, sizeof tmp);
            if (i > 0) sb_put(&s, " ");
            sb_put(&s, tmp);
        }
    } else if (kind < 8) { /* the same meaning in two languages */
        lp_meaning m;
        train_meaning(rng, eval_percent, &m);
        int to = (lang + 1 + world_rand(rng, LP_W2_N_LANGS - 1)) % LP_W2_N_LANGS;
        lp_world2_render(w, &m, lang, NULL, tmp, sizeof tmp);
        sb_put(&s, tmp);
        sb_put(&s, " = ");
        lp_world2_render(w, &m, to, NULL, tmp, sizeof tmp);
        sb_put(&s, tmp);
    } else { /* two to four unrelated runs of the tasks' sentences */
        int n = 2 + world_rand(rng, 3);
        for (int i = 0; i < n; i++) {
            if (i > 0) sb_put(&s, " ");
            task_sentences(w, rng, eval_percent, lang, &s);
        }
    }
    return s.overflow ? -1 : (int)s.len;
}
