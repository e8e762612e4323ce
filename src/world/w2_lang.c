/* Version 2 of the demo world: the nine languages (world2.h). English has a
 * fixed lexicon; the eight invented languages get theirs from a fixed
 * procedure over each language's sounds. Every language renders the shared
 * meaning (lp_meaning) with its own grammar. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "world2.h"
#include "world_internal.h"

#define WMAX 48      /* bytes of one stem, NUL included */
#define CAT_MAX 64   /* entries per category (the largest: function words) */
#define W2_GO LP_W2_VERBS /* the verb "go": one entry after the transitive verbs */

typedef struct w2_entry {
    char s[WMAX];
    unsigned char cls; /* gender / noun class / harmony class */
} w2_entry;

struct lp_world2 {
    w2_entry e[LP_W2_N_LANGS][LP_W2_N_CATS][CAT_MAX];
};

static const int cat_n[LP_W2_N_CATS] = {LP_W2_NAMES, LP_W2_NOUNS,  LP_W2_ADJS, LP_W2_VERBS + 1,
                                        LP_W2_PLACES, LP_W2_TIMES, LP_W2_FUNCS};

static const char *const codes[LP_W2_N_LANGS] = {"en", "vl", "bo", "th", "hn",
                                                 "sr", "za", "or", "er"};
static const char *const lnames[LP_W2_N_LANGS] = {"English", "Velin", "Borsk", "Thalic", "Hanmal",
                                                  "Saru", "Zamba", "Orvai", "Ergo"};
static const char *const scripts[LP_W2_N_LANGS] = {
    "Latin", "Latin with diacritics", "Cyrillic", "Greek", "Hangul",
    "Devanagari", "Latin", "Latin with diacritics", "Armenian"};
/* constituent order of the transitive clause: T time, S subject, V verb,
 * O object, P place */
static const char *const orders[LP_W2_N_LANGS] = {"TSVOP", "TSPOV", "TSVOP", "VSOPT", "TSPOV",
                                                  "TSPOV", "SVOPT", "VOSPT", "TSPOV"};
static const char *const order_names[LP_W2_N_LANGS] = {"SVO", "SOV", "SVO", "VSO", "SOV",
                                                       "SOV", "SVO", "VOS", "SOV"};

const char *lp_world2_lang_code(int l) { return l >= 0 && l < LP_W2_N_LANGS ? codes[l] : "??"; }
const char *lp_world2_lang_name(int l) { return l >= 0 && l < LP_W2_N_LANGS ? lnames[l] : "?"; }
const char *lp_world2_lang_script(int l) { return l >= 0 && l < LP_W2_N_LANGS ? scripts[l] : "?"; }
const char *lp_world2_lang_order(int l) { return l >= 0 && l < LP_W2_N_LANGS ? order_names[l] : "?"; }

int lp_world2_lang_from_code(const char *code) {
    for (int i = 0; i < LP_W2_N_LANGS; i++)
        if (!strcmp(code, codes[i])) return i;
    return -1;
}

/* ---- English ---------------------------------------------------------------- */

static const char *const en_names[LP_W2_NAMES] = {"Tom", "Mira", "Anu",  "Leo",  "Sara", "Omar",
                                                  "Nina", "Ivo", "Lena", "Kai", "Rosa", "Ben"};
static const char *const en_noun[LP_W2_NOUNS][2] = {
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
static const char *const en_adj[LP_W2_ADJS] = {"red", "blue", "green", "small", "big",   "old",
                                               "new", "white", "black", "heavy", "soft", "yellow"};
static const char *const en_verb[LP_W2_VERBS + 1][3] = {
    {"see", "sees", "saw"}, {"find", "finds", "found"}, {"take", "takes", "took"},
    {"want", "wants", "wanted"}, {"like", "likes", "liked"}, {"carry", "carries", "carried"},
    {"buy", "buys", "bought"}, {"make", "makes", "made"}, {"paint", "paints", "painted"},
    {"wash", "washes", "washed"}, {"open", "opens", "opened"}, {"hold", "holds", "held"},
    {"sell", "sells", "sold"}, {"bring", "brings", "brought"}, {"watch", "watches", "watched"},
    {"clean", "cleans", "cleaned"}, {"draw", "draws", "drew"}, {"hide", "hides", "hid"},
    {"drop", "drops", "dropped"}, {"fix", "fixes", "fixed"}, {"go", "goes", "went"}};
static const char *const en_place[LP_W2_PLACES] = {"park",   "market", "garden",  "house",
                                                   "school", "river",  "forest",  "kitchen",
                                                   "village", "shop",  "beach",   "farm"};
static const char *const en_time[LP_W2_TIMES] = {
    "yesterday", "today", "tomorrow", "in the morning", "in the evening", "at night",
    "on Monday", "on Tuesday", "on Wednesday", "on Thursday", "on Friday", "on Saturday",
    "on Sunday"};

/* ---- UTF-8 ---------------------------------------------------------------------- */

static int get_cp(const char *s, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) { *cp = u[0]; return 1; }
    if ((u[0] & 0xE0) == 0xC0 && u[1]) { *cp = ((u[0] & 0x1Fu) << 6) | (u[1] & 0x3Fu); return 2; }
    if ((u[0] & 0xF0) == 0xE0 && u[1] && u[2]) {
        *cp = ((u[0] & 0x0Fu) << 12) | ((u[1] & 0x3Fu) << 6) | (u[2] & 0x3Fu);
        return 3;
    }
    *cp = u[0];
    return 1;
}

static int put_cp(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    o[0] = (char)(0xE0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

/* Devanagari vowel signs and marks attach to the preceding consonant. */
static bool is_combining(uint32_t cp) {
    return (cp >= 0x0900 && cp <= 0x0903) || (cp >= 0x093A && cp <= 0x094F) ||
           (cp >= 0x0951 && cp <= 0x0957) || (cp >= 0x0962 && cp <= 0x0963);
}

int lp_world2_units(const char *word, size_t *starts, int cap) {
    int n = 0;
    for (size_t i = 0; word[i];) {
        uint32_t cp;
        int k = get_cp(word + i, &cp);
        if (!(n > 0 && is_combining(cp))) {
            if (n < cap) starts[n] = i;
            n++;
        }
        i += (size_t)k;
    }
    return n;
}

/* The capital of a lower-case letter of our scripts (same UTF-8 length). */
static uint32_t upper_cp(uint32_t c) {
    if (c >= 'a' && c <= 'z') return c - 32;
    if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 0x20;  /* Latin-1 */
    if (c == 0x015F) return 0x015E;                             /* ş */
    if (c >= 0x0430 && c <= 0x044F) return c - 0x20;            /* Cyrillic */
    if (c >= 0x03B1 && c <= 0x03C9 && c != 0x03C2) return c - 0x20; /* Greek */
    if (c >= 0x0561 && c <= 0x0586) return c - 0x30;            /* Armenian */
    return c;
}

void world2_upper_first(char *s) {
    uint32_t cp;
    int k = get_cp(s, &cp);
    uint32_t u = upper_cp(cp);
    char tmp[4];
    if (u != cp && put_cp(tmp, u) == k) memcpy(s, tmp, (size_t)k);
}

/* s with units pos and pos + 1 exchanged (unchanged if there are fewer). */
static void swap_units(char *s, int pos) {
    size_t st[WMAX + 1];
    int n = lp_world2_units(s, st, WMAX);
    if (pos < 0 || pos + 1 >= n || n > WMAX) return;
    size_t len = strlen(s), a = st[pos], b = st[pos + 1], e = pos + 2 < n ? st[pos + 2] : len;
    char tmp[128];
    if (e - a >= sizeof tmp) return;
    memcpy(tmp, s + b, e - b);
    memcpy(tmp + (e - b), s + a, b - a);
    memcpy(s + a, tmp, e - a);
}

/* ---- the invented lexicons ---------------------------------------------------------- */

static uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

typedef struct sounds {
    const char *const *cons;
    int n_cons;
    const char *const *vow;
    int n_vow;
} sounds;

#define ARR(a) a, (int)(sizeof a / sizeof a[0])
static const char *const vl_c[] = {"b", "d", "g", "k", "l", "m", "n", "p",
                                   "r", "s", "t", "v", "z", "ş", "ç", "y"};
static const char *const vl_back[] = {"a", "o", "u", "â"};
static const char *const vl_front[] = {"e", "i", "ö", "ü"};
static const char *const vl_coda[] = {"n", "r", "l", "k", "m", "s", "t"};
static const char *const bo_c[] = {"б", "в", "г", "д", "ж", "з", "к", "л", "м",
                                   "н", "п", "р", "с", "т", "ф", "х", "ч", "ш"};
static const char *const bo_v[] = {"а", "о", "у", "э", "и", "е"};
static const char *const th_c[] = {"β", "γ", "δ", "κ", "λ", "μ", "ν",
                                   "π", "ρ", "τ", "φ", "χ", "ζ", "θ"};
static const char *const th_v[] = {"α", "ε", "ι", "ο", "υ", "η", "ω"};
static const char *const sr_c[] = {"क", "ग", "ज", "त", "द", "न", "प", "ब",
                                   "म", "र", "ल", "स", "ह", "ट", "ड", "च"};
static const char *const sr_m[] = {"", "ा", "ि", "ी", "ु", "ू", "े", "ो"};
static const char *const za_c[] = {"b", "d", "f", "g", "h", "j", "k", "l",
                                   "m", "n", "p", "s", "t", "w", "y", "z"};
static const char *const za_v[] = {"a", "e", "i", "o", "u"};
static const char *const or_c[] = {"b", "d", "f", "h", "k", "l", "m",
                                   "n", "p", "r", "s", "t", "v", "z"};
static const char *const or_v[] = {"a", "e", "i", "o", "y", "à", "è", "ì", "ò", "ô"};
static const char *const er_c[] = {"բ", "գ", "դ", "զ", "թ", "կ", "լ", "մ", "ն",
                                   "պ", "ռ", "ս", "վ", "տ", "ր", "ք", "շ"};
static const char *const er_v[] = {"ա", "ե", "ի", "ո", "է"};

/* Hangul: initial consonants, vowels and finals by their jamo index. */
static const int hn_l[] = {0, 2, 3, 5, 6, 7, 9, 11, 12, 14, 15, 16, 17, 18};
static const int hn_v[] = {0, 4, 8, 13, 18, 20, 1, 5};
static const int hn_t[] = {0, 0, 0, 4, 8, 16, 1, 21, 17};

static uint64_t take(uint64_t *h, int n) {
    uint64_t r = *h % (uint64_t)n;
    *h /= (uint64_t)n;
    return r;
}

static void hn_syllable(char *o, size_t *len, uint64_t *h, bool open) {
    int l = hn_l[take(h, (int)(sizeof hn_l / sizeof hn_l[0]))];
    int v = hn_v[take(h, (int)(sizeof hn_v / sizeof hn_v[0]))];
    int t = open ? 0 : hn_t[take(h, (int)(sizeof hn_t / sizeof hn_t[0]))];
    *len += (size_t)put_cp(o + *len, 0xAC00u + (uint32_t)((l * 21 + v) * 28 + t));
}

static void cat_str(char *o, size_t *len, const char *s) {
    size_t k = strlen(s);
    memcpy(o + *len, s, k);
    *len += k;
}

/* One candidate stem of lang for (cat, index) from the hash h; *cls gets
 * its class. Shapes: C = consonant, V = vowel (Devanagari: consonant with
 * or without a vowel sign). */
static void gen_stem(int lang, int cat, int index, uint64_t h, char *o, unsigned char *cls) {
    size_t len = 0;
    bool verb = cat == LP_W2_CAT_VERB;
    *cls = 0;
    switch (lang) {
    case LP_W2_VL: { /* CVCV(C), verbs CVCVC; harmony class picks the vowels */
        int harm = (int)take(&h, 2);
        const char *const *v = harm ? vl_front : vl_back;
        *cls = (unsigned char)harm;
        for (int i = 0; i < 2; i++) {
            cat_str(o, &len, vl_c[take(&h, 16)]);
            cat_str(o, &len, v[take(&h, 4)]);
        }
        if (verb || take(&h, 2)) cat_str(o, &len, vl_coda[take(&h, 7)]);
        break;
    }
    case LP_W2_BO: case LP_W2_TH: { /* CVCVC; verbs CVCV (bo) or CVCVC (th) */
        sounds s = lang == LP_W2_BO ? (sounds){ARR(bo_c), ARR(bo_v)} : (sounds){ARR(th_c), ARR(th_v)};
        for (int i = 0; i < 2; i++) {
            cat_str(o, &len, s.cons[take(&h, s.n_cons)]);
            cat_str(o, &len, s.vow[take(&h, s.n_vow)]);
        }
        bool open = (lang == LP_W2_BO && verb) || cat == LP_W2_CAT_TIME || cat == LP_W2_CAT_FUNC;
        if (!open) cat_str(o, &len, s.cons[take(&h, s.n_cons)]);
        *cls = (unsigned char)take(&h, cat == LP_W2_CAT_NAME ? 2 : 3);
        break;
    }
    case LP_W2_HN: { /* two syllables; verbs and adjectives end open */
        bool open_end = verb || cat == LP_W2_CAT_ADJ;
        hn_syllable(o, &len, &h, false);
        hn_syllable(o, &len, &h, open_end);
        break;
    }
    case LP_W2_SR: { /* CM CM C (nouns...), verbs CM C, others CM CM */
        int n = verb ? 2 : 3;
        bool bare_end = cat != LP_W2_CAT_TIME && cat != LP_W2_CAT_FUNC;
        for (int i = 0; i < n; i++) {
            cat_str(o, &len, sr_c[take(&h, 16)]);
            if (i + 1 < n || !bare_end) cat_str(o, &len, sr_m[take(&h, 8)]);
        }
        *cls = (unsigned char)take(&h, 2);
        break;
    }
    default: { /* za, or, er: CVCV, verbs CVC (za, er) or CVCV (or) */
        sounds s = lang == LP_W2_ZA ? (sounds){ARR(za_c), ARR(za_v)}
                 : lang == LP_W2_OR ? (sounds){ARR(or_c), ARR(or_v)}
                                    : (sounds){ARR(er_c), ARR(er_v)};
        cat_str(o, &len, s.cons[take(&h, s.n_cons)]);
        cat_str(o, &len, s.vow[take(&h, s.n_vow)]);
        cat_str(o, &len, s.cons[take(&h, s.n_cons)]);
        if (!(verb && lang != LP_W2_OR)) cat_str(o, &len, s.vow[take(&h, s.n_vow)]);
        if (lang == LP_W2_ZA) {
            /* noun classes: people 1/2, animals 9/10, things 3/4, 7/8, 9/10 */
            if (cat == LP_W2_CAT_NOUN && index >= 4 && index < LP_W2_AGENTS) *cls = 0;
            else if (cat == LP_W2_CAT_NOUN && index < 4) *cls = 3;
            else *cls = (unsigned char)(1 + take(&h, 3));
        }
        break;
    }
    }
    o[len] = '\0';
}

/* Copies a stem (at most WMAX - 1 bytes). */
static void copy_stem(char *dst, const char *src) {
    size_t n = strnlen(src, WMAX - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* A language's stems so far and every one-swap variant of them. */
typedef struct taken {
    char (*s)[WMAX];
    int n, cap;
} taken;

static bool taken_has(const taken *t, const char *s) {
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->s[i], s)) return true;
    return false;
}

static int variants(const char *s, char out[][WMAX], int cap) {
    size_t st[WMAX];
    int n = lp_world2_units(s, st, WMAX), k = 0;
    for (int p = 0; p + 1 < n && k < cap; p++) {
        copy_stem(out[k], s);
        swap_units(out[k], p);
        if (strcmp(out[k], s)) k++;
    }
    return k;
}

/* Whether stem s may join: it and its swaps collide with no stem or swap. */
static bool stem_ok(const taken *t, const char *s) {
    char var[WMAX][WMAX];
    int nv = variants(s, var, WMAX);
    if (taken_has(t, s) || t->n + nv + 1 > t->cap) return false;
    for (int i = 0; i < nv; i++)
        if (taken_has(t, var[i])) return false;
    return true;
}

static void stem_take(taken *t, const char *s) {
    char var[WMAX][WMAX];
    int nv = variants(s, var, WMAX);
    copy_stem(t->s[t->n++], s);
    for (int i = 0; i < nv; i++) copy_stem(t->s[t->n++], var[i]);
}

static int build_lang(lp_world2 *w, int lang, taken *t, lp_error *err) {
    t->n = 0;
    for (int cat = 0; cat < LP_W2_N_CATS; cat++)
        for (int i = 0; i < cat_n[cat]; i++) {
            w2_entry *e = &w->e[lang][cat][i];
            int attempt = 0;
            for (;; attempt++) {
                if (attempt > 10000)
                    return lp_fail(err, "world2: no stem for %s category %d entry %d",
                                   codes[lang], cat, i);
                uint64_t h = splitmix(0x57e3ull ^ splitmix((uint64_t)lang * 1000003u +
                                                           (uint64_t)cat * 10007u +
                                                           (uint64_t)i * 101u +
                                                           (uint64_t)attempt * 7919u));
                gen_stem(lang, cat, i, h, e->s, &e->cls);
                if (stem_ok(t, e->s)) break;
            }
            stem_take(t, e->s);
            if (cat == LP_W2_CAT_NAME) world2_upper_first(e->s);
        }
    return 0;
}

static void build_english(lp_world2 *w) {
    w2_entry(*e)[CAT_MAX] = w->e[LP_W2_EN];
    for (int i = 0; i < LP_W2_NAMES; i++) snprintf(e[LP_W2_CAT_NAME][i].s, WMAX, "%s", en_names[i]);
    for (int i = 0; i < LP_W2_NOUNS; i++) snprintf(e[LP_W2_CAT_NOUN][i].s, WMAX, "%s", en_noun[i][0]);
    for (int i = 0; i < LP_W2_ADJS; i++) snprintf(e[LP_W2_CAT_ADJ][i].s, WMAX, "%s", en_adj[i]);
    for (int i = 0; i <= LP_W2_VERBS; i++) snprintf(e[LP_W2_CAT_VERB][i].s, WMAX, "%s", en_verb[i][0]);
    for (int i = 0; i < LP_W2_PLACES; i++) snprintf(e[LP_W2_CAT_PLACE][i].s, WMAX, "%s", en_place[i]);
    for (int i = 0; i < LP_W2_TIMES; i++) snprintf(e[LP_W2_CAT_TIME][i].s, WMAX, "%s", en_time[i]);
}

lp_world2 *lp_world2_create(lp_error *err) {
    lp_world2 *w = calloc(1, sizeof *w);
    taken t = {.cap = 4096};
    t.s = calloc((size_t)t.cap, sizeof *t.s);
    if (!w || !t.s) {
        free(w);
        free(t.s);
        lp_fail(err, "world2: out of memory");
        return NULL;
    }
    build_english(w);
    for (int l = 1; l < LP_W2_N_LANGS; l++)
        if (build_lang(w, l, &t, err) != 0) {
            free(t.s);
            free(w);
            return NULL;
        }
    free(t.s);
    return w;
}

void lp_world2_free(lp_world2 *w) { free(w); }

const char *lp_world2_word(const lp_world2 *w, int lang, int cat, int index) {
    if (lang < 0 || lang >= LP_W2_N_LANGS || cat < 0 || cat >= LP_W2_N_CATS || index < 0 ||
        index >= cat_n[cat])
        return "";
    return w->e[lang][cat][index].s;
}

int lp_world2_word_class(const lp_world2 *w, int lang, int cat, int index) {
    if (!lp_world2_word(w, lang, cat, index)[0]) return 0;
    return w->e[lang][cat][index].cls;
}

/* ---- rendering pieces ----------------------------------------------------------------- */

typedef struct w2_ctx {
    const lp_world2 *w;
    int lang;
    const lp_w2_opts *o;
} w2_ctx;

/* base (a stem or an English form of item (cat, index)) with the item's
 * swaps applied, into out (WMAX). */
static void formed(const w2_ctx *c, int cat, int index, const char *base, char *out) {
    copy_stem(out, base);
    for (int i = 0; c->o && i < c->o->n_swaps && i < 2; i++)
        if (c->o->swap[i].cat == cat && c->o->swap[i].index == index)
            swap_units(out, c->o->swap[i].pos);
}

static void stem(const w2_ctx *c, int cat, int index, char *out) {
    formed(c, cat, index, c->w->e[c->lang][cat][index].s, out);
}

static int cls_of(const w2_ctx *c, int cat, int index) { return c->w->e[c->lang][cat][index].cls; }

/* stem + suffix as one word */
static void word_sfx(sb *s, const char *stem_text, const char *sfx) {
    char w[160];
    snprintf(w, sizeof w, "%s%s", stem_text, sfx);
    sb_word(s, w);
}

static bool np_plural(const lp_np *np) { return np->name < 0 && np->plural; }

enum { ROLE_S, ROLE_O, ROLE_SI }; /* transitive subject, object, subject of "go" */

/* Velin: whether a word ends in a vowel (its last unit is one). */
static bool vl_open(const char *w) {
    size_t n = strlen(w);
    if (!n) return false;
    static const char *const vs[] = {"a", "o", "u", "â", "e", "i", "ö", "ü"};
    for (int i = 0; i < 8; i++) {
        size_t k = strlen(vs[i]);
        if (n >= k && !strcmp(w + n - k, vs[i])) return true;
    }
    return false;
}

/* Velin suffix in harmony class h: back/front variants. */
static const char *vh(int h, const char *back, const char *front) { return h ? front : back; }

/* Hangul: whether the word's last syllable has a final consonant. */
static bool hn_final(const char *w) {
    size_t n = strlen(w);
    if (n < 3) return false;
    uint32_t cp;
    get_cp(w + n - 3, &cp);
    return cp >= 0xAC00 && cp <= 0xD7A3 && (cp - 0xAC00) % 28 != 0;
}

/* Hangul: adds final consonant t (jamo index) to the open last syllable. */
static void hn_add_final(char *w, int t) {
    size_t n = strlen(w);
    if (n < 3) return;
    uint32_t cp;
    get_cp(w + n - 3, &cp);
    if (cp < 0xAC00 || cp > 0xD7A3 || (cp - 0xAC00) % 28 != 0) return;
    put_cp(w + n - 3, cp + (uint32_t)t);
}

/* Hangul: the vowel index of the last syllable. */
static int hn_vowel(const char *w) {
    size_t n = strlen(w);
    if (n < 3) return 0;
    uint32_t cp;
    get_cp(w + n - 3, &cp);
    return (int)(((cp - 0xAC00) / 28) % 21);
}

/* Borsk/Thalic noun endings by gender: [case][number][gender]; case 0
 * nominative, 1 accusative */
static const char *const bo_noun_end[2][2][3] = {{{"", "а", "о"}, {"ы", "ы", "а"}},
                                                 {{"", "у", "о"}, {"ы", "ы", "а"}}};
static const char *const bo_adj_end[2][2][3] = {{{"ый", "ая", "ое"}, {"ые", "ые", "ые"}},
                                                {{"ый", "ую", "ое"}, {"ые", "ые", "ые"}}};
static const char *const th_noun_end[2][2][3] = {{{"ος", "α", "ο"}, {"οι", "ες", "α"}},
                                                 {{"ο", "α", "ο"}, {"ους", "ες", "α"}}};
static const char *const th_adj_end[2][2][3] = {{{"ος", "η", "ο"}, {"οι", "ες", "α"}},
                                                {{"ο", "η", "ο"}, {"ους", "ες", "α"}}};
static const char *const th_art[2][2][3] = {{{"ο", "η", "το"}, {"οι", "οι", "τα"}},
                                            {{"τον", "την", "το"}, {"τους", "τις", "τα"}}};
/* Zamba concord by class (0: 1/2, 1: 3/4, 2: 7/8, 3: 9/10) and number */
static const char *const za_noun_pre[2][4] = {{"mu", "mu", "ki", "n"}, {"ba", "mi", "vi", "zi"}};
static const char *const za_adj_pre[2][4] = {{"mw", "m", "ki", "i"}, {"wa", "mi", "vi", "zi"}};
static const char *const za_subj[2][4] = {{"a", "u", "ki", "i"}, {"wa", "i", "vi", "zi"}};

/* Gender of a noun phrase (names: 0 masculine, 1 feminine). */
static int np_gender(const w2_ctx *c, const lp_np *np) {
    return np->name >= 0 ? cls_of(c, LP_W2_CAT_NAME, np->name)
                         : cls_of(c, LP_W2_CAT_NOUN, np->noun);
}

/* Renders a noun phrase in its role. err: the language's agreement error
 * where it sits on this phrase. */
static void w2_np(const w2_ctx *c, sb *s, const lp_np *np, int role, bool terse, bool err) {
    char st[WMAX], adj[WMAX] = "", w[160];
    bool pl = np_plural(np), has_adj = !terse && np->name < 0 && np->adj >= 0;
    if (np->name >= 0) stem(c, LP_W2_CAT_NAME, np->name, st);
    else stem(c, LP_W2_CAT_NOUN, np->noun, st);
    if (has_adj) stem(c, LP_W2_CAT_ADJ, np->adj, adj);
    int g = np_gender(c, np), acc = role == ROLE_O;
    switch (c->lang) {
    case LP_W2_EN:
        if (np->name >= 0) { sb_word(s, st); return; }
        if (!terse) sb_word(s, "the");
        if (has_adj) sb_word(s, adj);
        if (pl) formed(c, LP_W2_CAT_NOUN, np->noun, en_noun[np->noun][1], st);
        sb_word(s, st);
        return;
    case LP_W2_VL: { /* [adj] stem(-lar)(-case) */
        int h = np->name >= 0 ? cls_of(c, LP_W2_CAT_NAME, np->name) : cls_of(c, LP_W2_CAT_NOUN, np->noun);
        if (has_adj) sb_word(s, adj);
        snprintf(w, sizeof w, "%s%s", st, pl ? vh(h, "lar", "ler") : "");
        if (acc && !err) {
            bool open = vl_open(w);
            strcat(w, open ? vh(h, "yu", "yü") : vh(h, "u", "ü"));
        }
        sb_word(s, w);
        return;
    }
    case LP_W2_BO:
        if (np->name >= 0) { word_sfx(s, st, g ? "а" : ""); return; }
        if (has_adj) word_sfx(s, adj, bo_adj_end[acc][pl][g]);
        word_sfx(s, st, bo_noun_end[acc][pl][g]);
        return;
    case LP_W2_TH: {
        int ga = err ? (g + 1) % 3 : g;
        if (np->name >= 0) {
            if (!terse) sb_word(s, th_art[acc][0][g]);
            word_sfx(s, st, g ? "α" : (acc ? "ο" : "ος"));
            return;
        }
        if (!terse) sb_word(s, th_art[acc][pl][ga]);
        if (has_adj) word_sfx(s, adj, th_adj_end[acc][pl][g]);
        word_sfx(s, st, th_noun_end[acc][pl][g]);
        return;
    }
    case LP_W2_HN: {
        if (has_adj) {
            hn_add_final(adj, 4); /* attributive -ㄴ */
            sb_word(s, adj);
        }
        snprintf(w, sizeof w, "%s%s", st, pl ? "들" : "");
        bool fin = hn_final(w);
        if (err) fin = !fin;
        strcat(w, acc ? (fin ? "을" : "를") : (fin ? "이" : "가"));
        sb_word(s, w);
        return;
    }
    case LP_W2_SR:
        if (np->name >= 0) sb_word(s, st);
        else {
            static const char *const adj_end[2][2] = {{"ा", "े"}, {"ी", "ी"}};
            static const char *const noun_end[2][2] = {{"ा", "े"}, {"ी", "ियाँ"}};
            if (has_adj) word_sfx(s, adj, adj_end[g][pl]);
            word_sfx(s, st, noun_end[g][pl]);
        }
        if (acc) sb_word(s, "को");
        return;
    case LP_W2_ZA:
        if (np->name >= 0) { sb_word(s, st); return; }
        snprintf(w, sizeof w, "%s%s", za_noun_pre[pl][g], st);
        sb_word(s, w);
        if (has_adj) {
            snprintf(w, sizeof w, "%s%s", za_adj_pre[pl][g], adj);
            sb_word(s, w);
        }
        return;
    case LP_W2_OR:
        if (!terse) sb_word(s, np->name >= 0 ? "i" : pl ? "irèo" : "ny");
        sb_word(s, st);
        if (has_adj) sb_word(s, adj);
        return;
    default: { /* er: [adj] (reduplicated) stem (-ով) */
        if (has_adj) sb_word(s, adj);
        if (pl) {
            size_t u[WMAX];
            int n = lp_world2_units(st, u, WMAX);
            size_t k = n > 2 ? u[2] : strlen(st);
            snprintf(w, sizeof w, "%.*s%s", (int)k, st, st);
        } else {
            snprintf(w, sizeof w, "%s", st);
        }
        if (role == ROLE_S && !err) strcat(w, "ով");
        sb_word(s, w);
        return;
    }
    }
}

/* The verb phrase: verb (W2_GO for "go") in tense, agreeing with subj (and
 * obj where the language agrees with the object). */
static void w2_verb(const w2_ctx *c, sb *s, int verb, int tense, const lp_np *subj,
                    const lp_np *obj, bool err) {
    char st[WMAX], w[160];
    stem(c, LP_W2_CAT_VERB, verb, st);
    bool pl = np_plural(subj);
    int g = np_gender(c, subj);
    switch (c->lang) {
    case LP_W2_EN: {
        const char *const *f = en_verb[verb];
        if (tense == LP_TENSE_PAST) {
            formed(c, LP_W2_CAT_VERB, verb, f[2], st);
        } else if (tense == LP_TENSE_PRESENT) {
            formed(c, LP_W2_CAT_VERB, verb, f[(pl != err) ? 0 : 1], st);
        } else {
            sb_word(s, "will");
            formed(c, LP_W2_CAT_VERB, verb, f[err ? 1 : 0], st);
        }
        sb_word(s, st);
        return;
    }
    case LP_W2_VL: {
        int h = cls_of(c, LP_W2_CAT_VERB, verb);
        bool open = vl_open(st);
        const char *t = tense == LP_TENSE_PAST ? vh(h, "du", "dü")
                      : tense == LP_TENSE_PRESENT ? (open ? "r" : vh(h, "ar", "er"))
                      : (open ? vh(h, "yacak", "yecek") : vh(h, "acak", "ecek"));
        snprintf(w, sizeof w, "%s%s%s", st, t, pl ? vh(h, "lar", "ler") : "");
        sb_word(s, w);
        return;
    }
    case LP_W2_BO: {
        static const char *const past[3] = {"л", "ла", "ло"};
        bool p = err ? !pl : pl;
        if (tense == LP_TENSE_PAST) {
            int gg = err ? (g + 1) % 3 : g;
            word_sfx(s, st, pl && !err ? "ли" : past[pl ? 0 : gg]);
        } else if (tense == LP_TENSE_PRESENT) {
            word_sfx(s, st, p ? "ют" : "ет");
        } else {
            sb_word(s, p ? "будут" : "будет");
            word_sfx(s, st, "ть");
        }
        return;
    }
    case LP_W2_TH: {
        (void)err; /* Thalic's error sits on the object's article */
        if (tense == LP_TENSE_PAST) {
            snprintf(w, sizeof w, "ε%s%s", st, pl ? "αν" : "ε");
            sb_word(s, w);
        } else {
            if (tense == LP_TENSE_FUTURE) sb_word(s, "θα");
            word_sfx(s, st, pl ? "ουν" : "ει");
        }
        return;
    }
    case LP_W2_HN: {
        if (tense == LP_TENSE_PAST) {
            int v = hn_vowel(st);
            word_sfx(s, st, v == 0 || v == 8 ? "았다" : "었다");
        } else if (tense == LP_TENSE_PRESENT) {
            hn_add_final(st, 4); /* -ㄴ다 */
            word_sfx(s, st, "다");
        } else {
            hn_add_final(st, 8); /* -ㄹ 것이다 */
            sb_word(s, st);
            sb_word(s, "것이다");
        }
        return;
    }
    case LP_W2_SR: {
        int gg = err ? 1 - g : g;
        static const char *const pres[2][2] = {{"ता है", "ते हैं"}, {"ती है", "ती हैं"}};
        static const char *const past[2][2] = {{"ा", "े"}, {"ी", "ीं"}};
        static const char *const fut[2][2] = {{"ेगा", "ेंगे"}, {"ेगी", "ेंगी"}};
        const char *const(*t)[2] = tense == LP_TENSE_PAST ? past : tense == LP_TENSE_PRESENT ? pres : fut;
        word_sfx(s, st, t[gg][pl]);
        return;
    }
    case LP_W2_ZA: {
        static const char *const tns[3] = {"li", "na", "ta"};
        int cls = subj->name >= 0 ? 0 : g;
        if (err) cls = (cls + 1) % 4;
        snprintf(w, sizeof w, "%s%s%sa", za_subj[pl][cls], tns[tense], st);
        sb_word(s, w);
        return;
    }
    case LP_W2_OR: {
        static const char *const tns[3] = {"nó", "mà", "hò"};
        bool opl = obj && np_plural(obj);
        if (err && obj) opl = !opl;
        snprintf(w, sizeof w, "%s%s%s", tns[tense], st, opl ? "rè" : "");
        sb_word(s, w);
        return;
    }
    default: {
        static const char *const tns[3] = {"եց", "ում", "ելու"};
        word_sfx(s, st, tns[tense]);
        return;
    }
    }
}

static void w2_place(const w2_ctx *c, sb *s, int place, bool dest) {
    char st[WMAX], w[160];
    stem(c, LP_W2_CAT_PLACE, place, st);
    int g = cls_of(c, LP_W2_CAT_PLACE, place);
    switch (c->lang) {
    case LP_W2_EN:
        sb_word(s, dest ? "to the" : "in the");
        sb_word(s, st);
        return;
    case LP_W2_VL: {
        bool open = vl_open(st);
        const char *sfx = dest ? (open ? vh(g, "ya", "ye") : vh(g, "a", "e")) : vh(g, "da", "de");
        word_sfx(s, st, sfx);
        return;
    }
    case LP_W2_BO:
        sb_word(s, "в");
        word_sfx(s, st, dest ? bo_noun_end[1][0][g] : "е");
        return;
    case LP_W2_TH: {
        static const char *const loc[3] = {"στον", "στην", "στο"};
        if (dest) {
            sb_word(s, "προς");
            sb_word(s, th_art[1][0][g]);
        } else {
            sb_word(s, loc[g]);
        }
        word_sfx(s, st, th_noun_end[1][0][g]);
        return;
    }
    case LP_W2_HN: word_sfx(s, st, dest ? "에" : "에서"); return;
    case LP_W2_SR:
        word_sfx(s, st, g ? "ी" : "ा");
        sb_word(s, dest ? "तक" : "में");
        return;
    case LP_W2_ZA:
        if (dest) sb_word(s, "kwa");
        snprintf(w, sizeof w, "%s%s%s", za_noun_pre[0][g], st, dest ? "" : "ni");
        sb_word(s, w);
        return;
    case LP_W2_OR:
        sb_word(s, dest ? "ròa" : "àmy");
        sb_word(s, st);
        return;
    default: word_sfx(s, st, dest ? "ան" : "ին"); return;
    }
}

static void w2_time(const w2_ctx *c, sb *s, int time) {
    char st[WMAX];
    stem(c, LP_W2_CAT_TIME, time, st);
    sb_word(s, st);
}

/* A clause: verb (W2_GO: "go" to place, no object), in the language's
 * constituent order; drop_subj leaves the subject out (the second half of a
 * summary). */
typedef struct w2_clause {
    const lp_np *subj, *obj;
    int verb, tense, place, time;
    bool drop_subj;
} w2_clause;

static void clause(const w2_ctx *c, sb *s, const w2_clause *cl) {
    const lp_w2_opts *o = c->o;
    bool terse = o && o->terse, err = o && o->agree_error, go = cl->verb == W2_GO;
    size_t start = s->len;
    for (const char *p = orders[c->lang]; *p; p++) {
        switch (*p) {
        case 'T':
            if (cl->time >= 0 && !terse) w2_time(c, s, cl->time);
            break;
        case 'S':
            if (!cl->drop_subj) {
                bool e = err && (c->lang == LP_W2_ER) && !go;
                w2_np(c, s, cl->subj, go ? ROLE_SI : ROLE_S, terse, e);
            }
            break;
        case 'V':
            w2_verb(c, s, cl->verb, cl->tense, cl->subj, cl->obj,
                    err && (c->lang == LP_W2_EN || c->lang == LP_W2_BO || c->lang == LP_W2_SR ||
                            c->lang == LP_W2_ZA || c->lang == LP_W2_OR));
            break;
        case 'O':
            if (!go) {
                bool e = err && (c->lang == LP_W2_VL || c->lang == LP_W2_TH || c->lang == LP_W2_HN);
                w2_np(c, s, cl->obj, ROLE_O, terse, e);
            }
            break;
        case 'P':
            if (cl->place >= 0 && (go || !terse)) w2_place(c, s, cl->place, go);
            break;
        default: break;
        }
    }
    /* names are stored capitalized, so a frame's lower_first keeps them */
    if (!(o && o->lower_first)) world2_upper_first(s->buf + start);
}

const char *world2_period(int lang) { return lang == LP_W2_SR ? "।" : "."; }

void world2_clause(const lp_world2 *w, sb *s, const lp_meaning *m, int lang, const lp_w2_opts *o) {
    w2_ctx c = {.w = w, .lang = lang, .o = o};
    w2_clause cl = {.subj = &m->subj, .obj = &m->obj, .verb = m->verb, .tense = m->tense,
                    .place = m->place, .time = m->time};
    clause(&c, s, &cl);
}

/* "[time] S went to P" (past, no period) and "S went to P and V-ed O". */
void world2_go(const lp_world2 *w, sb *s, const lp_np *subj, int place, int time, int lang,
               const lp_w2_opts *o) {
    w2_ctx c = {.w = w, .lang = lang, .o = o};
    w2_clause cl = {.subj = subj, .verb = W2_GO, .tense = LP_TENSE_PAST, .place = place, .time = time};
    clause(&c, s, &cl);
}

void world2_go_and(const lp_world2 *w, sb *s, const lp_meaning *act, int place, int lang) {
    lp_w2_opts none = {0};
    w2_ctx c = {.w = w, .lang = lang, .o = &none};
    w2_clause go = {.subj = &act->subj, .verb = W2_GO, .tense = LP_TENSE_PAST, .place = place,
                    .time = -1};
    clause(&c, s, &go);
    sb_word(s, lang == LP_W2_EN ? "and" : w->e[lang][LP_W2_CAT_FUNC][1].s);
    lp_w2_opts low = {.lower_first = true};
    w2_ctx c2 = {.w = w, .lang = lang, .o = &low};
    w2_clause act_cl = {.subj = &act->subj, .obj = &act->obj, .verb = act->verb,
                        .tense = LP_TENSE_PAST, .place = -1, .time = -1, .drop_subj = true};
    sb_put(s, " ");
    clause(&c2, s, &act_cl);
}

/* Pieces for templates (tasks): a definite object, a destination, a place,
 * a time. */
void world2_piece(const lp_world2 *w, sb *s, char kind, const lp_np *np, int place, int time,
                  int lang) {
    lp_w2_opts none = {0};
    w2_ctx c = {.w = w, .lang = lang, .o = &none};
    if (kind == 'O') w2_np(&c, s, np, ROLE_O, false, false);
    else if (kind == 'D') w2_place(&c, s, place, true);
    else if (kind == 'L') w2_place(&c, s, place, false);
    else if (kind == 'T') w2_time(&c, s, time);
    else if (kind == 'K') { /* a noun's dictionary form (the composer's keyword) */
        lp_np bare = {.name = -1, .noun = np->noun, .adj = -1};
        if (lang == LP_W2_TH || lang == LP_W2_OR) {
            char st[WMAX];
            stem(&c, LP_W2_CAT_NOUN, np->noun, st);
            if (lang == LP_W2_TH) word_sfx(s, st, th_noun_end[0][0][cls_of(&c, LP_W2_CAT_NOUN, np->noun)]);
            else sb_word(s, st);
        } else if (lang == LP_W2_HN) {
            char st[WMAX];
            stem(&c, LP_W2_CAT_NOUN, np->noun, st);
            sb_word(s, st);
        } else {
            lp_w2_opts terse = {.terse = true};
            w2_ctx ct = {.w = w, .lang = lang, .o = &terse};
            w2_np(&ct, s, &bare, ROLE_SI, true, false);
        }
    }
}

int lp_world2_render(const lp_world2 *w, const lp_meaning *m, int lang, const lp_w2_opts *o,
                     char *buf, size_t cap) {
    lp_w2_opts none = {0};
    if (!o) o = &none;
    if (cap == 0 || lang < 0 || lang >= LP_W2_N_LANGS) return -1;
    sb s = {.buf = buf, .cap = cap};
    buf[0] = '\0';
    world2_clause(w, &s, m, lang, o);
    if (!o->no_period) sb_put(&s, world2_period(lang));
    return s.overflow ? -1 : (int)s.len;
}

bool lp_world2_agree_applies(const lp_meaning *m, int lang) {
    /* English: a wrong past form would read as a present (version 1's
     * ambiguity), so only present and future take the error */
    return lang != LP_W2_EN || m->tense != LP_TENSE_PAST;
}

/* ---- random meanings -------------------------------------------------------------------- */

static void random_np(lp_rng *rng, bool agent, lp_np *np) {
    *np = (lp_np){.name = -1, .noun = -1, .adj = -1};
    if (agent && world_rand(rng, 3) == 0) {
        np->name = world_rand(rng, LP_W2_NAMES);
        return;
    }
    np->noun = agent ? world_rand(rng, LP_W2_AGENTS)
                     : LP_W2_AGENTS + world_rand(rng, LP_W2_NOUNS - LP_W2_AGENTS);
    np->plural = world_rand(rng, 4) == 0;
    if (world_rand(rng, 2) == 0) np->adj = world_rand(rng, LP_W2_ADJS);
}

int world2_random_time(lp_rng *rng, int tense) {
    for (;;) {
        int t = world_rand(rng, LP_W2_TIMES);
        if (t == LP_W2_TIME_YESTERDAY && tense != LP_TENSE_PAST) continue;
        if (t == LP_W2_TIME_TOMORROW && tense != LP_TENSE_FUTURE) continue;
        return t;
    }
}

void world2_random_np(lp_rng *rng, bool agent, lp_np *np) { random_np(rng, agent, np); }

void lp_world2_random_meaning(lp_rng *rng, bool place_required, lp_meaning *m) {
    random_np(rng, true, &m->subj);
    random_np(rng, false, &m->obj);
    m->verb = world_rand(rng, LP_W2_VERBS);
    m->tense = world_rand(rng, 3);
    m->place = place_required || world_rand(rng, 2) == 0 ? world_rand(rng, LP_W2_PLACES) : -1;
    m->time = world_rand(rng, 3) == 0 ? world2_random_time(rng, m->tense) : -1;
}
