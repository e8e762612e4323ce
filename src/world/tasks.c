/* The demo world's tasks: correction, four styles, summary, smart reply and
 * translation, each with an exact ground truth rendered from meanings; and
 * the pretraining documents (stories and sentence pairs). */
#include <stdio.h>
#include <string.h>

#include "world_internal.h"

enum { T_CORRECT, T_FORMAL, T_POLITE, T_JOVIAL, T_TERSE, T_SUMMARY, T_REPLY, T_TRANSLATE, T_CURIOUS };

static const char *const task_names[LP_WORLD_N_ALL_TASKS] = {
    "correct", "style-formal", "style-polite", "style-jovial",
    "style-terse", "summary", "reply", "translate", "style-curious"};

const char *lp_world_task_name(int task) {
    return task >= 0 && task < LP_WORLD_N_ALL_TASKS ? task_names[task] : "?";
}

int lp_world_task_from_name(const char *name) {
    for (int i = 0; i < LP_WORLD_N_ALL_TASKS; i++)
        if (strcmp(name, task_names[i]) == 0) return i;
    return -1;
}

/* ---- styles ------------------------------------------------------------------ */

/* A styled sentence is prefix + clause (first letter lowered) + suffix. */
typedef struct style_frame {
    const char *prefix, *suffix;
} style_frame;

static const style_frame style_frames[4][LP_N_LANGS] = {
    /* formal */ {{"It is my duty to report that ", "."}, {"Numo veleta ke ", "."},
                  {"Hadro zubim ka ", "."}},
    /* polite */ {{"Please note that ", ". Thank you."}, {"Pimo, ", ". Tesai."},
                  {"Buri, ", ". Gazo."}},
    /* jovial */ {{"Wow, ", "!"}, {"Oho, ", "!"}, {"Hai, ", "!"}},
    /* curious */ {{"Did you know that ", "?"}, {"Sabi tu ke ", "?"}, {"Zodo kuzo ka ", "?"}},
};

/* The frame row and the prompt tag of a framed style task. */
static int style_row(int task) { return task == T_CURIOUS ? 3 : task - T_FORMAL; }
static const char *style_tag(int task) {
    static const char *const tags[] = {"formal", "polite", "jovial", "terse"};
    return task == T_CURIOUS ? "curious" : tags[task - T_FORMAL];
}

static void render_style(sb *s, const lp_meaning *m, int lang, int task) {
    if (task == T_TERSE) {
        lp_render_opts o = {.terse = true};
        world_clause(s, m, lang, &o);
        sb_put(s, ".");
        return;
    }
    const style_frame *f = &style_frames[style_row(task)][lang];
    sb_put(s, f->prefix);
    lp_render_opts o = {.lower_first = true};
    world_clause(s, m, lang, &o);
    sb_put(s, f->suffix);
}

/* ---- correction ----------------------------------------------------------------- */

/* Whether text[a] and text[b] lie in the same word. */
static bool same_word(const char *text, size_t a, size_t b) {
    size_t lo = a < b ? a : b, hi = a < b ? b : a;
    for (size_t i = lo; i < hi; i++)
        if (text[i] == ' ') return false;
    return true;
}

/* Swaps two different adjacent letters inside a word of at least four
 * letters (neither its first nor its last letter), in another word than the
 * one at `avoid` (-1: any word): two swaps in one word can read as one swap
 * of another word (Karu "bidoh" and "bihod"). Returns the position swapped,
 * or -1 if no word qualifies. */
static long inject_swap(lp_rng *rng, char *text, long avoid) {
    size_t n = strlen(text);
    size_t cand[256];
    int nc = 0;
    for (size_t i = 1; i + 2 < n && nc < 256; i++) {
        char a = text[i], b = text[i + 1];
        bool letters = a >= 'a' && a <= 'z' && b >= 'a' && b <= 'z';
        bool inner = text[i - 1] != ' ' && text[i + 2] >= 'a' && text[i + 2] <= 'z';
        bool other = avoid < 0 || !same_word(text, i, (size_t)avoid);
        if (letters && inner && a != b && other) cand[nc++] = i;
    }
    if (nc == 0) return -1;
    size_t i = cand[world_rand(rng, nc)];
    char t = text[i];
    text[i] = text[i + 1];
    text[i + 1] = t;
    return (long)i;
}

/* Duplicates one word (not the last, which carries the period). */
static bool inject_duplicate(lp_rng *rng, char *text, size_t cap) {
    size_t n = strlen(text);
    size_t starts[64];
    int ns = 0;
    for (size_t i = 0; i < n && ns < 64; i++)
        if (i == 0 || text[i - 1] == ' ') starts[ns++] = i;
    if (ns < 2) return false;
    int k = world_rand(rng, ns - 1);
    size_t a = starts[k], b = starts[k + 1]; /* word plus its space: [a, b) */
    if (n + (b - a) + 1 > cap) return false;
    memmove(text + b + (b - a), text + b, n - b + 1);
    memcpy(text + b, text + a, b - a);
    return true;
}

/* Whether the agreement error has exactly one correction. In English a
 * wrong past ("the bird sell") reads like a wrong present, or with a plural
 * subject like a right one, unless "yesterday" gives the tense away; every
 * other agreement error (and Velo's and Karu's) maps back to one sentence. */
static bool agree_is_unique(const lp_meaning *m, int lang) {
    return lang != LP_LANG_EN || m->tense != LP_TENSE_PAST || m->time == WORLD_TIME_YESTERDAY;
}

/* Fills prompt/completion for the correction task: one or two errors
 * (agreement, letter swap, duplicated word), each with a single correction,
 * so that every prompt has exactly one right answer. About one record in
 * ten is already correct (the completion repeats it). v1: as the first
 * version did, with agreement errors anywhere and two swaps possibly in one
 * word (the BPE vocabulary and the demo's warm start learnt from those). */
void world_make_correct(lp_rng *rng, const lp_meaning *m, int lang, bool v1,
                        lp_world_record *r) {
    lp_world_render(m, lang, NULL, r->completion, sizeof r->completion);
    char bad[sizeof r->prompt];
    if (world_rand(rng, 10) == 0) {
        snprintf(bad, sizeof bad, "%s", r->completion);
    } else {
        int n_errors = 1 + world_rand(rng, 2);
        for (int attempt = 0; attempt < 8; attempt++) {
            int kinds[2] = {world_rand(rng, 3), world_rand(rng, 3)};
            lp_render_opts o = {0};
            for (int e = 0; e < n_errors; e++) {
                if (!v1 && kinds[e] == 0 && !agree_is_unique(m, lang))
                    kinds[e] = 1 + world_rand(rng, 2);
                if (kinds[e] == 0) o.errors |= LP_ERR_AGREE;
            }
            lp_world_render(m, lang, &o, bad, sizeof bad - 64);
            long swapped = -1;
            for (int e = 0; e < n_errors; e++) {
                if (kinds[e] == 1) {
                    long at = inject_swap(rng, bad, v1 ? -1 : swapped);
                    if (at >= 0) swapped = at;
                }
                if (kinds[e] == 2) inject_duplicate(rng, bad, sizeof bad);
            }
            if (strcmp(bad, r->completion) != 0) break;
        }
    }
    sb p = {.buf = r->prompt, .cap = sizeof r->prompt};
    sb_put(&p, "fix: ");
    sb_put(&p, bad);
    sb_put(&p, "\n");
}

/* ---- summary ------------------------------------------------------------------------ */

#define N_FILLERS 5
static const char *const fillers[LP_N_LANGS][N_FILLERS] = {
    {"The weather was warm.", "The sky was grey.", "It was a quiet day.",
     "The wind was cold.", "Everyone was busy."},
    {"Sopa limeta.", "Kuvi nasota.", "Mesa tolu pana.", "Vilo kesuta.", "Nomi tesu paleta."},
    {"Kehaz guzor.", "Kebir dazog hiru.", "Hozak kedir.", "Kezur bagoh.", "Kedag huri zob."},
};

/* "[Time] S went to the P." in lang. */
static void render_go(sb *s, const lp_np *subj, int place, int time, int lang) {
    size_t start = s->len;
    bool first_is_name = subj->name >= 0 && (time < 0 || lang == LP_LANG_KA);
    if (lang == LP_LANG_EN) {
        if (time >= 0) world_time(s, time, lang);
        world_np(s, subj, lang, false);
        world_verb(s, -1, LP_TENSE_PAST, lang, subj);
        world_place(s, place, lang, true, false);
    } else if (lang == LP_LANG_VO) {
        if (time >= 0) world_time(s, time, lang);
        world_np(s, subj, lang, false);
        world_place(s, place, lang, true, false);
        world_verb(s, -1, LP_TENSE_PAST, lang, subj);
    } else {
        world_verb(s, -1, LP_TENSE_PAST, lang, subj);
        world_np(s, subj, lang, false);
        world_place(s, place, lang, true, false);
        if (time >= 0) world_time(s, time, lang);
    }
    world_case_first(s, start, false, first_is_name);
    sb_put(s, ".");
}

/* One summary story: a go meaning (subject, place, time) and an act meaning
 * (the same subject, past tense, no place or time). */
typedef struct story {
    lp_meaning act;
    int place, time;
    int filler[2]; /* second is -1 for three-sentence stories */
} story;

static void random_story(lp_rng *rng, story *st) {
    lp_world_random_meaning(rng, false, &st->act);
    st->act.tense = LP_TENSE_PAST;
    st->act.place = -1;
    st->act.time = -1;
    st->place = world_rand(rng, 12);
    st->time = world_rand(rng, 2) == 0 ? world_random_time(rng, LP_TENSE_PAST) : -1;
    st->filler[0] = world_rand(rng, N_FILLERS);
    st->filler[1] = world_rand(rng, 2) == 0 ? world_rand(rng, N_FILLERS) : -1;
}

static void render_story(sb *s, const story *st, int lang) {
    render_go(s, &st->act.subj, st->place, st->time, lang);
    sb_put(s, " ");
    sb_put(s, fillers[lang][st->filler[0]]);
    sb_put(s, " ");
    char buf[256];
    lp_world_render(&st->act, lang, NULL, buf, sizeof buf);
    sb_put(s, buf);
    if (st->filler[1] >= 0) {
        sb_put(s, " ");
        sb_put(s, fillers[lang][st->filler[1]]);
    }
}

/* "S went to the P and V-ed O." */
static void render_summary(sb *s, const story *st, int lang) {
    size_t start = s->len;
    const lp_np *subj = &st->act.subj;
    if (lang == LP_LANG_EN) {
        world_np(s, subj, lang, false);
        world_verb(s, -1, LP_TENSE_PAST, lang, subj);
        world_place(s, st->place, lang, true, false);
        sb_word(s, "and");
        world_verb(s, st->act.verb, LP_TENSE_PAST, lang, subj);
        world_np(s, &st->act.obj, lang, true);
    } else if (lang == LP_LANG_VO) {
        world_np(s, subj, lang, false);
        world_place(s, st->place, lang, true, false);
        world_verb(s, -1, LP_TENSE_PAST, lang, subj);
        sb_word(s, "eta");
        world_np(s, &st->act.obj, lang, true);
        world_verb(s, st->act.verb, LP_TENSE_PAST, lang, subj);
    } else {
        world_verb(s, -1, LP_TENSE_PAST, lang, subj);
        world_np(s, subj, lang, false);
        world_place(s, st->place, lang, true, false);
        sb_word(s, "ena"); /* "ena ke-V O": the act without repeating the subject */
        world_verb(s, st->act.verb, LP_TENSE_PAST, lang, subj);
        world_np(s, &st->act.obj, lang, true);
    }
    world_case_first(s, start, false, subj->name >= 0);
    sb_put(s, ".");
}

/* ---- smart reply ------------------------------------------------------------------------ */

/* Templates with slots {N} name, {O} object phrase, {D} destination,
 * {T} time. */
#define N_INTENTS 6
static const char *const reply_templates[LP_N_LANGS][N_INTENTS][2] = {
    {{"Hello, I am {N}.", "Nice to meet you, {N}."},
     {"Thank you for {O}.", "You are welcome, enjoy {O}."},
     {"Do you want to go {D} {T}?", "Yes, I will go {D} {T}."},
     {"Do you like {O}?", "Yes, I like {O} very much."},
     {"Sorry, I lost {O}.", "No problem, we will find {O}."},
     {"Goodbye, {N}.", "See you soon, {N}."}},
    {{"Sala, mi {N} nu.", "Vesa tilu, {N}."},
     {"Tesai {O} peka.", "Nala, {O} sovi."},
     {"Tu {D} {T} ilsu ko?", "Ke, mi {D} {T} ilsu."},
     {"Tu {O} tetne ko?", "Ke, mi {O} mosa tetne."},
     {"Savu, mi {O} nolta.", "Nopa, memi {O} pivsu."},
     {"Pomi, {N}.", "Sita lomu, {N}."}},
    {{"Zaha, ba {N} oz.", "Gudo hira, {N}."},
     {"Dori ka {O}.", "Hozi, bagu {O}."},
     {"Ravad ku {D} {T} ha?", "Ia, rovad ba {D} {T}."},
     {"Hahi ku {O} ha?", "Ia, hahi ba {O} gozu."},
     {"Zoru, kegodi ba {O}.", "Bodu, robabi zi {O}."},
     {"Kodo, {N}.", "Rabu hiza, {N}."}},
};

typedef struct reply_slots {
    int intent, name, place, time;
    lp_np obj;
} reply_slots;

static void fill_template(sb *s, const char *tpl, const reply_slots *rs, int lang) {
    for (const char *p = tpl; *p;) {
        if (p[0] == '{' && p[1] && p[2] == '}') {
            switch (p[1]) {
            case 'N': sb_put(s, world_name(rs->name)); break;
            case 'O': {
                sb o = {.buf = s->buf + s->len, .cap = s->cap - s->len};
                world_np(&o, &rs->obj, lang, true);
                s->len += o.len;
                s->overflow |= o.overflow;
                break;
            }
            case 'D': {
                sb o = {.buf = s->buf + s->len, .cap = s->cap - s->len};
                world_place(&o, rs->place, lang, true, false);
                s->len += o.len;
                s->overflow |= o.overflow;
                break;
            }
            case 'T': {
                sb o = {.buf = s->buf + s->len, .cap = s->cap - s->len};
                world_time(&o, rs->time, lang);
                s->len += o.len;
                s->overflow |= o.overflow;
                break;
            }
            default: break;
            }
            p += 3;
        } else {
            char c[2] = {*p++, 0};
            sb_put(s, c);
        }
    }
}

static uint64_t make_reply(lp_rng *rng, int lang, lp_world_record *r) {
    reply_slots rs;
    rs.intent = world_rand(rng, N_INTENTS);
    rs.name = world_rand(rng, 12);
    rs.place = world_rand(rng, 12);
    rs.time = 1 + world_rand(rng, 5); /* not "yesterday": the invitation is ahead */
    world_random_np(rng, false, &rs.obj);
    sb p = {.buf = r->prompt, .cap = sizeof r->prompt};
    sb_put(&p, "reply: ");
    fill_template(&p, reply_templates[lang][rs.intent][0], &rs, lang);
    sb_put(&p, "\n");
    sb c = {.buf = r->completion, .cap = sizeof r->completion};
    fill_template(&c, reply_templates[lang][rs.intent][1], &rs, lang);
    /* the key covers exactly the slots the intent uses */
    uint64_t h = world_mix(0x7e91, rs.intent);
    h = world_mix(h, lang);
    const char *tpl = reply_templates[lang][rs.intent][0];
    if (strstr(tpl, "{N}")) h = world_mix(h, rs.name);
    if (strstr(tpl, "{D}")) h = world_mix(world_mix(h, rs.place), rs.time);
    if (strstr(tpl, "{O}")) {
        h = world_mix(h, rs.obj.noun);
        h = world_mix(h, rs.obj.adj);
        h = world_mix(h, rs.obj.plural);
    }
    return h;
}

/* ---- records ---------------------------------------------------------------------------- */

uint64_t lp_world_make_record(lp_rng *rng, int task, int lang, lp_world_record *r) {
    return world_make_record(rng, task, lang, false, r);
}

uint64_t world_make_record(lp_rng *rng, int task, int lang, bool v1, lp_world_record *r) {
    memset(r, 0, sizeof *r);
    snprintf(r->task, sizeof r->task, "%s", lp_world_task_name(task));
    snprintf(r->lang, sizeof r->lang, "%s", lp_world_lang_code(lang));
    char src[512];
    lp_meaning m;
    switch (task) {
    case T_CORRECT:
        lp_world_random_meaning(rng, false, &m);
        world_make_correct(rng, &m, lang, v1, r);
        return world_core_key(&m);
    case T_FORMAL: case T_POLITE: case T_JOVIAL: case T_TERSE: case T_CURIOUS: {
        const char *tag = style_tag(task);
        snprintf(r->style, sizeof r->style, "%s", tag);
        lp_world_random_meaning(rng, true, &m);
        lp_world_render(&m, lang, NULL, src, sizeof src);
        snprintf(r->prompt, sizeof r->prompt, "%s: %s\n", tag, src);
        sb c = {.buf = r->completion, .cap = sizeof r->completion};
        render_style(&c, &m, lang, task);
        return world_core_key(&m);
    }
    case T_SUMMARY: {
        story st;
        random_story(rng, &st);
        sb p = {.buf = r->prompt, .cap = sizeof r->prompt};
        sb_put(&p, "summary: ");
        render_story(&p, &st, lang);
        sb_put(&p, "\n");
        sb c = {.buf = r->completion, .cap = sizeof r->completion};
        render_summary(&c, &st, lang);
        return world_core_key(&st.act);
    }
    case T_REPLY:
        return make_reply(rng, lang, r);
    default: { /* translation from lang into one of the two others */
        int to = (lang + 1 + world_rand(rng, 2)) % LP_N_LANGS;
        snprintf(r->lang, sizeof r->lang, "%s>%s", lp_world_lang_code(lang),
                 lp_world_lang_code(to));
        lp_world_random_meaning(rng, false, &m);
        lp_world_render(&m, lang, NULL, src, sizeof src);
        snprintf(r->prompt, sizeof r->prompt, "%s: %s\n", r->lang, src);
        lp_world_render(&m, to, NULL, r->completion, sizeof r->completion);
        return world_core_key(&m);
    }
    }
}

/* ---- pretraining documents ------------------------------------------------------------------ */

/* A random meaning whose core is not reserved for evaluation. */
static void train_meaning(lp_rng *rng, int eval_percent, lp_meaning *m) {
    do lp_world_random_meaning(rng, false, m);
    while (lp_world_key_is_eval(world_core_key(m), eval_percent));
}

int lp_world_pretrain_line(lp_rng *rng, int eval_percent, char *buf, size_t cap) {
    if (cap == 0) return -1;
    sb s = {.buf = buf, .cap = cap};
    buf[0] = '\0';
    int kind = world_rand(rng, 10);
    int lang = world_rand(rng, LP_N_LANGS);
    char tmp[512];
    if (kind < 4) { /* a story like the summary task's */
        story st;
        do random_story(rng, &st);
        while (lp_world_key_is_eval(world_core_key(&st.act), eval_percent));
        render_story(&s, &st, lang);
    } else if (kind < 8) { /* three or four sentences about one subject */
        lp_meaning m;
        train_meaning(rng, eval_percent, &m);
        int n = 3 + world_rand(rng, 2);
        for (int i = 0; i < n; i++) {
            lp_meaning next;
            do {
                lp_world_random_meaning(rng, false, &next);
                next.subj = m.subj;
            } while (lp_world_key_is_eval(world_core_key(&next), eval_percent));
            lp_world_render(&next, lang, NULL, tmp, sizeof tmp);
            if (i > 0) sb_put(&s, " ");
            sb_put(&s, tmp);
        }
    } else { /* the same meaning in two languages */
        lp_meaning m;
        train_meaning(rng, eval_percent, &m);
        int to = (lang + 1 + world_rand(rng, 2)) % LP_N_LANGS;
        lp_world_render(&m, lang, NULL, tmp, sizeof tmp);
        sb_put(&s, tmp);
        sb_put(&s, " = ");
        lp_world_render(&m, to, NULL, tmp, sizeof tmp);
        sb_put(&s, tmp);
    }
    return s.overflow ? -1 : (int)s.len;
}
