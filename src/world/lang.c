/* The three languages of the demo world: fixed lexicons and deterministic
 * grammars that render a shared meaning (see world.h). */
#include <stdio.h>
#include <string.h>

#include "world.h"
#include "world_internal.h"

/* ---- lexicons (index-aligned across languages) ------------------------- */

static const char *const names[] = {"Tom", "Mira", "Anu", "Leo", "Sara", "Omar",
                                    "Nina", "Ivo", "Lena", "Kai", "Rosa", "Ben"};
#define N_NAMES 12

/* nouns 0..9 are agents (may be subjects), 10..39 things (objects) */
#define N_AGENTS 10
#define N_NOUNS 40
static const char *const en_noun[N_NOUNS][2] = {
    {"dog", "dogs"}, {"cat", "cats"}, {"bird", "birds"}, {"horse", "horses"},
    {"farmer", "farmers"}, {"teacher", "teachers"}, {"baker", "bakers"},
    {"girl", "girls"}, {"boy", "boys"}, {"child", "children"},
    {"apple", "apples"}, {"ball", "balls"}, {"book", "books"}, {"box", "boxes"},
    {"cup", "cups"}, {"hat", "hats"}, {"key", "keys"}, {"lamp", "lamps"},
    {"letter", "letters"}, {"map", "maps"}, {"bag", "bags"}, {"basket", "baskets"},
    {"bottle", "bottles"}, {"chair", "chairs"}, {"clock", "clocks"}, {"coat", "coats"},
    {"flower", "flowers"}, {"kite", "kites"}, {"boat", "boats"}, {"cake", "cakes"},
    {"car", "cars"}, {"drum", "drums"}, {"egg", "eggs"}, {"gift", "gifts"},
    {"pen", "pens"}, {"plate", "plates"}, {"ring", "rings"}, {"rope", "ropes"},
    {"shoe", "shoes"}, {"stone", "stones"}};
static const char *const vo_noun[N_NOUNS] = {
    "lesa", "tuti", "puma", "tosa", "masa", "tepu", "sama", "kise", "tunu", "kami",
    "tutu", "pumo", "sivu", "vine", "ketu", "nuvi", "vita", "sele", "vopa", "lilu",
    "vuva", "tiva", "pivi", "sipo", "leto", "pene", "moso", "tevo", "nesu", "nolo",
    "mete", "kema", "vuki", "nako", "lule", "poso", "soto", "moka", "lupa", "puku"};
static const char *const ka_noun[N_NOUNS] = {
    "dozik", "rirar", "robir", "bihok", "bihod", "girih", "burih", "kiduz", "rorig", "gahob",
    "gurar", "gozab", "kibag", "gakig", "kikuk", "horiz", "zuhob", "gakir", "bobak", "gazib",
    "garag", "zugib", "zibig", "bidoh", "giguz", "higok", "bobab", "hizud", "rahuh", "ruzoh",
    "digik", "hirob", "kibah", "horib", "bukoz", "dobud", "dorag", "gozod", "bodod", "borar"};

#define N_ADJS 12
static const char *const en_adj[N_ADJS] = {"red", "blue", "green", "small", "big", "old",
                                           "new", "white", "black", "heavy", "soft", "yellow"};
static const char *const vo_adj[N_ADJS] = {"tipa", "muse", "nilo", "tavo", "vona", "kali",
                                           "vepe", "lepu", "nanu", "lele", "leme", "semu"};
static const char *const ka_adj[N_ADJS] = {"gid", "zab", "gad", "rar", "bog", "hib",
                                           "zih", "huk", "gud", "gib", "kuh", "hiz"};

/* English verbs: base, third person singular, past */
#define N_VERBS 20
static const char *const en_verb[N_VERBS][3] = {
    {"see", "sees", "saw"}, {"find", "finds", "found"}, {"take", "takes", "took"},
    {"want", "wants", "wanted"}, {"like", "likes", "liked"}, {"carry", "carries", "carried"},
    {"buy", "buys", "bought"}, {"make", "makes", "made"}, {"paint", "paints", "painted"},
    {"wash", "washes", "washed"}, {"open", "opens", "opened"}, {"hold", "holds", "held"},
    {"sell", "sells", "sold"}, {"bring", "brings", "brought"}, {"watch", "watches", "watched"},
    {"clean", "cleans", "cleaned"}, {"draw", "draws", "drew"}, {"hide", "hides", "hid"},
    {"drop", "drops", "dropped"}, {"fix", "fixes", "fixed"}};
static const char *const vo_verb[N_VERBS] = {"vip", "piv", "nel", "vil", "tet", "mom", "lev",
                                             "pol", "tas", "mok", "sit", "sos", "tek", "kak",
                                             "vev", "lek", "pat", "kom", "man", "mim"};
static const char *const ka_verb[N_VERBS] = {"kaki", "babi", "hobu", "kuza", "hahi", "robu",
                                             "kaha", "hahu", "gako", "didu", "rubu", "hoka",
                                             "zibi", "goho", "zibu", "buga", "hihu", "goru",
                                             "razi", "gara"};

#define N_PLACES 12
static const char *const en_place[N_PLACES] = {"park", "market", "garden", "house", "school",
                                               "river", "forest", "kitchen", "village", "shop",
                                               "beach", "farm"};
static const char *const vo_place[N_PLACES] = {"lise", "pivu", "suku", "kupo", "kupe", "kevu",
                                               "tupi", "vape", "mipa", "vupa", "vimi", "vuvu"};
static const char *const ka_place[N_PLACES] = {"gubug", "ridaz", "bihog", "dobod", "rurad",
                                               "buhur", "giror", "gakob", "gokub", "dahog",
                                               "garuk", "zaguk"};

/* times: 0 yesterday (past only), 1 today, 2 tomorrow (future only),
 * 3 in the morning, 4 in the evening, 5 at night */
#define N_TIMES 6
static const char *const en_time[N_TIMES] = {"yesterday", "today", "tomorrow",
                                             "in the morning", "in the evening", "at night"};
static const char *const vo_time[N_TIMES] = {"kelo", "sinu", "pato", "mana", "vesi", "nomu"};
static const char *const ka_time[N_TIMES] = {"zuga", "hodi", "rabu", "gohi", "dazu", "biro"};

static const char *const lang_codes[LP_N_LANGS] = {"en", "vo", "ka"};

const char *lp_world_lang_code(int lang) {
    return lang >= 0 && lang < LP_N_LANGS ? lang_codes[lang] : "??";
}

int lp_world_lang_from_code(const char *code) {
    for (int i = 0; i < LP_N_LANGS; i++)
        if (strcmp(code, lang_codes[i]) == 0) return i;
    return -1;
}

void lp_world_lexicon_size(lp_lexicon_size *out) {
    *out = (lp_lexicon_size){.names = N_NAMES, .nouns = N_NOUNS, .adjs = N_ADJS,
                             .verbs = N_VERBS, .places = N_PLACES, .times = N_TIMES};
}

/* ---- a bounded string builder ---------------------------------------------- */

void sb_put(sb *s, const char *text) {
    size_t n = strlen(text);
    if (s->len + n + 1 > s->cap) {
        s->overflow = true;
        return;
    }
    memcpy(s->buf + s->len, text, n + 1);
    s->len += n;
}

/* Appends a word, with a space before it unless at the start. */
void sb_word(sb *s, const char *w) {
    if (s->len > 0 && s->buf[s->len - 1] != ' ') sb_put(s, " ");
    sb_put(s, w);
}

/* Appends a word made of stem + suffix (or prefix + stem). */
void sb_word2(sb *s, const char *a, const char *b) {
    char w[64];
    snprintf(w, sizeof w, "%s%s", a, b);
    sb_word(s, w);
}

/* ---- noun phrases ---------------------------------------------------------------- */

/* Role of a noun phrase in its clause (selects Velo case suffixes). */
enum { ROLE_SUBJ, ROLE_OBJ };

static void np_en(sb *s, const lp_np *np, bool terse) {
    if (np->name >= 0) {
        sb_word(s, names[np->name]);
        return;
    }
    if (!terse) sb_word(s, "the");
    if (!terse && np->adj >= 0) sb_word(s, en_adj[np->adj]);
    sb_word(s, en_noun[np->noun][np->plural ? 1 : 0]);
}

/* Velo: noun [adj]; plural -li on the noun; accusative -m on the last word. */
static void np_vo(sb *s, const lp_np *np, int role, bool terse, bool drop_case) {
    const char *acc = role == ROLE_OBJ && !drop_case ? "m" : "";
    if (np->name >= 0) {
        sb_word2(s, names[np->name], acc);
        return;
    }
    char noun[32];
    snprintf(noun, sizeof noun, "%s%s", vo_noun[np->noun], np->plural ? "li" : "");
    if (!terse && np->adj >= 0) {
        sb_word(s, noun);
        sb_word2(s, vo_adj[np->adj], acc);
    } else {
        sb_word2(s, noun, acc);
    }
}

/* Karu: [adj] noun, plural -ot. */
static void np_ka(sb *s, const lp_np *np, bool terse) {
    if (np->name >= 0) {
        sb_word(s, names[np->name]);
        return;
    }
    if (!terse && np->adj >= 0) sb_word(s, ka_adj[np->adj]);
    sb_word2(s, ka_noun[np->noun], np->plural ? "ot" : "");
}

void world_np(sb *s, const lp_np *np, int lang, bool object) {
    if (lang == LP_LANG_EN) np_en(s, np, false);
    else if (lang == LP_LANG_VO) np_vo(s, np, object ? ROLE_OBJ : ROLE_SUBJ, false, false);
    else np_ka(s, np, false);
}

static bool np_is_plural(const lp_np *np) { return np->name < 0 && np->plural; }

/* ---- verbs -------------------------------------------------------------------- */

static const char *const vo_tense[3] = {"ta", "ne", "su"};
static const char *const ka_tense[3] = {"ke", "", "ro"};

/* English verb phrase; `wrong` gives the agreement/tense-form error: the
 * base form in the past and for a singular subject in the present, "-s" for a
 * plural subject in the present, "will" + "-s" in the future. A wrong past
 * ("the bird sell") reads like a wrong present, and with a plural subject
 * ("the birds sell") like a right one, so the correction task injects it
 * only where "yesterday" gives the tense away (tasks.c). */
static void verb_en(sb *s, const char *const forms[3], int tense, bool plural, bool wrong) {
    switch (tense) {
    case LP_TENSE_PAST:
        sb_word(s, wrong ? forms[0] : forms[2]);
        break;
    case LP_TENSE_PRESENT:
        sb_word(s, (plural != wrong) ? forms[0] : forms[1]);
        break;
    default:
        sb_word(s, "will");
        sb_word(s, wrong ? forms[1] : forms[0]);
        break;
    }
}

static const char *const en_go[3] = {"go", "goes", "went"};

void world_verb(sb *s, int verb, int tense, int lang, const lp_np *subj) {
    if (lang == LP_LANG_EN) {
        verb_en(s, verb < 0 ? en_go : en_verb[verb], tense, np_is_plural(subj), false);
    } else if (lang == LP_LANG_VO) {
        sb_word2(s, verb < 0 ? "il" : vo_verb[verb], vo_tense[tense]);
    } else {
        sb_word2(s, ka_tense[tense], verb < 0 ? "vad" : ka_verb[verb]);
    }
}

/* ---- places and times ------------------------------------------------------------- */

/* dest: "to the park" (motion) instead of "in the park". */
void world_place(sb *s, int place, int lang, bool dest, bool drop_prep) {
    if (lang == LP_LANG_EN) {
        sb_word(s, dest ? "to the" : "in the");
        sb_word(s, en_place[place]);
    } else if (lang == LP_LANG_VO) {
        sb_word2(s, vo_place[place], dest ? "ve" : "da");
    } else {
        if (!drop_prep) sb_word(s, dest ? "ri" : "du");
        sb_word(s, ka_place[place]);
    }
}

void world_time(sb *s, int time, int lang) {
    sb_word(s, lang == LP_LANG_EN ? en_time[time] : lang == LP_LANG_VO ? vo_time[time]
                                                                         : ka_time[time]);
}

const char *world_name(int name) { return names[name]; }

/* Capitalizes the first letter at `from`, or lowercases it unless the
 * sentence starts with a name (names keep their capital). */
void world_case_first(sb *s, size_t from, bool lower, bool starts_with_name) {
    if (s->overflow || from >= s->len) return;
    char c = s->buf[from];
    if (!lower && c >= 'a' && c <= 'z') s->buf[from] = (char)(c - 'a' + 'A');
    if (lower && !starts_with_name && c >= 'A' && c <= 'Z') s->buf[from] = (char)(c - 'A' + 'a');
}

/* ---- clauses ------------------------------------------------------------------------ */

/* Renders the clause of m (no final period) into s. The first letter is
 * capitalized unless opts->lower_first. */
void world_clause(sb *s, const lp_meaning *m, int lang, const lp_render_opts *o) {
    size_t start = s->len;
    bool terse = o->terse, err = (o->errors & LP_ERR_AGREE) != 0;
    bool has_time = m->time >= 0 && !terse, has_place = m->place >= 0 && !terse;
    bool first_is_name = false;
    if (lang == LP_LANG_EN) { /* [Time] S V O [place] */
        if (has_time) world_time(s, m->time, lang);
        else first_is_name = m->subj.name >= 0;
        np_en(s, &m->subj, terse);
        if (m->verb >= 0)
            verb_en(s, en_verb[m->verb], m->tense, np_is_plural(&m->subj), err);
        np_en(s, &m->obj, terse);
        if (has_place) world_place(s, m->place, lang, false, false);
    } else if (lang == LP_LANG_VO) { /* [Time] S [Place-da] O-m V-tense */
        if (has_time) world_time(s, m->time, lang);
        else first_is_name = m->subj.name >= 0;
        np_vo(s, &m->subj, ROLE_SUBJ, terse, false);
        if (has_place) world_place(s, m->place, lang, false, false);
        np_vo(s, &m->obj, ROLE_OBJ, terse, err);
        sb_word2(s, vo_verb[m->verb], vo_tense[m->tense]);
    } else { /* tense-V S O [du Place] [Time]; the error puts -ot on the verb */
        char verb[32];
        snprintf(verb, sizeof verb, "%s%s%s", ka_tense[m->tense], ka_verb[m->verb],
                 err ? "ot" : "");
        sb_word(s, verb);
        np_ka(s, &m->subj, terse);
        np_ka(s, &m->obj, terse);
        if (has_place) world_place(s, m->place, lang, false, false);
        if (has_time) world_time(s, m->time, lang);
    }
    world_case_first(s, start, o->lower_first, first_is_name);
}

int lp_world_render(const lp_meaning *m, int lang, const lp_render_opts *opts, char *buf,
                    size_t cap) {
    lp_render_opts none = {0};
    if (!opts) opts = &none;
    if (cap == 0) return -1;
    sb s = {.buf = buf, .cap = cap};
    buf[0] = '\0';
    world_clause(&s, m, lang, opts);
    if (!opts->no_period) sb_put(&s, ".");
    return s.overflow ? -1 : (int)s.len;
}

/* ---- random meanings ---------------------------------------------------------------- */

int world_rand(lp_rng *rng, int n) { return (int)(lp_rng_u64(rng) % (uint64_t)n); }

void world_random_np(lp_rng *rng, bool agent, lp_np *np) {
    *np = (lp_np){.name = -1, .noun = -1, .adj = -1};
    if (agent && world_rand(rng, 3) == 0) {
        np->name = world_rand(rng, N_NAMES);
        return;
    }
    np->noun = agent ? world_rand(rng, N_AGENTS) : N_AGENTS + world_rand(rng, N_NOUNS - N_AGENTS);
    np->plural = world_rand(rng, 4) == 0;
    if (world_rand(rng, 2) == 0) np->adj = world_rand(rng, N_ADJS);
}

/* A time that agrees with the tense (yesterday only in the past, tomorrow
 * only in the future). */
int world_random_time(lp_rng *rng, int tense) {
    for (;;) {
        int t = world_rand(rng, N_TIMES);
        if (t == WORLD_TIME_YESTERDAY && tense != LP_TENSE_PAST) continue;
        if (t == WORLD_TIME_TOMORROW && tense != LP_TENSE_FUTURE) continue;
        return t;
    }
}

void lp_world_random_meaning(lp_rng *rng, bool place_required, lp_meaning *m) {
    world_random_np(rng, true, &m->subj);
    world_random_np(rng, false, &m->obj);
    m->verb = world_rand(rng, N_VERBS);
    m->tense = world_rand(rng, 3);
    m->place = place_required || world_rand(rng, 2) == 0 ? world_rand(rng, N_PLACES) : -1;
    m->time = world_rand(rng, 3) == 0 ? world_random_time(rng, m->tense) : -1;
}

static uint64_t mix64(uint64_t h, int64_t v) {
    h ^= (uint64_t)v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 33);
}

static uint64_t np_key(uint64_t h, const lp_np *np) {
    h = mix64(h, np->name);
    h = mix64(h, np->noun);
    h = mix64(h, np->adj);
    return mix64(h, np->plural);
}

uint64_t lp_world_meaning_key(const lp_meaning *m) {
    uint64_t h = np_key(0x5eed, &m->subj);
    h = np_key(h, &m->obj);
    h = mix64(h, m->verb);
    h = mix64(h, m->place);
    h = mix64(h, m->time);
    return mix64(h, m->tense);
}

/* The split key: the meaning's core (subject, verb, object noun, tense), so
 * that meanings differing only in details a terse rendering drops share a
 * split. */
uint64_t world_core_key(const lp_meaning *m) {
    uint64_t h = mix64(0xc0de, m->subj.name);
    h = mix64(h, m->subj.noun);
    h = mix64(h, m->subj.plural && m->subj.name < 0);
    h = mix64(h, m->verb);
    h = mix64(h, m->obj.noun);
    h = mix64(h, m->obj.plural);
    return mix64(h, m->tense);
}

uint64_t world_mix(uint64_t h, int64_t v) { return mix64(h, v); }

bool lp_world_key_is_eval(uint64_t key, int eval_percent) {
    return (int)(mix64(key, 0x5711) % 100) < eval_percent;
}
