/* SD 1.x LoRA files: the targets table and the four formats' loader (see
 * sd_lora.h). The loader classifies every key into (target, role), then
 * checks each target's pair of tensors against the target's shape, then
 * converts them to f32 in one arena. */
#include "sd_lora.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/image_ops.h"

/* ---- targets ------------------------------------------------------------------------------------- */

static const char k_te[] = "cond_stage_model.transformer.", k_unet[] = "model.diffusion_model.";

typedef struct target_walk {
    const lp_sd_config *c;
    lp_sd_targets *t;
    int32_t cap;
    lp_error *err;
} target_walk;

static int add_target(void *ctx, const lp_sd_tensor_desc *d) {
    target_walk *w = ctx;
    size_t n = strlen(d->name);
    if ((d->n_dims != 2 && d->n_dims != 4) || n < 8 || strcmp(d->name + n - 7, ".weight")) return 0;
    int part;
    if (!strncmp(d->name, k_te, sizeof k_te - 1)) part = LP_SD_PART_TE;
    else if (!strncmp(d->name, k_unet, sizeof k_unet - 1)) part = LP_SD_PART_UNET;
    else return 0;
    if (strstr(d->name, ".embeddings.")) return 0;
    if (w->t->n == w->cap) {
        int32_t cap = w->cap ? 2 * w->cap : 256;
        lp_sd_target *t = realloc(w->t->t, (size_t)cap * sizeof *t);
        if (!t) return lp_error_set(w->err, LP_ERR_NOMEM, "out of memory");
        w->t->t = t, w->cap = cap;
    }
    lp_sd_target *t = &w->t->t[w->t->n];
    *t = (lp_sd_target){.part = part, .out = (int32_t)d->shape[0], .in = (int32_t)d->shape[1],
                        .k = d->n_dims == 4 ? (int32_t)d->shape[2] : 0};
    if (n - 7 >= sizeof t->ldm) return lp_fail(w->err, "SD LoRA targets: name %s too long", d->name);
    memcpy(t->ldm, d->name, n - 7);
    t->ldm[n - 7] = 0;
    if (lp_sd_diffusers_module(w->c, t->ldm, t->diffusers, sizeof t->diffusers) != part) return lp_fail(w->err, "SD LoRA targets: no diffusers name for %s", t->ldm);
    w->t->n++;
    return 0;
}

int lp_sd_targets_build(const lp_sd_config *c, lp_sd_targets *out, lp_error *err) {
    *out = (lp_sd_targets){0};
    target_walk w = {.c = c, .t = out, .err = err};
    if (lp_sd_layout(c, add_target, &w)) {
        lp_sd_targets_free(out);
        return -1;
    }
    return 0;
}

void lp_sd_targets_free(lp_sd_targets *t) {
    free(t->t);
    *t = (lp_sd_targets){0};
}

int32_t lp_sd_target_find(const lp_sd_targets *t, const char *ldm) {
    for (int32_t i = 0; i < t->n; i++)
        if (!strcmp(t->t[i].ldm, ldm)) return i;
    return -1;
}

static int32_t find_diffusers(const lp_sd_targets *t, int part, const char *name, size_t len) {
    for (int32_t i = 0; i < t->n; i++)
        if (t->t[i].part == part && strlen(t->t[i].diffusers) == len && !memcmp(t->t[i].diffusers, name, len)) return i;
    return -1;
}

/* key (len bytes) equals name with every '.' written '_' */
static bool eq_underscored(const char *key, size_t len, const char *name) {
    size_t i = 0;
    for (; i < len && name[i]; i++)
        if (key[i] != name[i] && !(name[i] == '.' && key[i] == '_')) return false;
    return i == len && !name[i];
}

/* ---- the adapter ----------------------------------------------------------------------------------- */

struct lp_sd_lora {
    lp_sd_config cfg;
    char format[16];
    int32_t n_targets, n_deltas, count[2], max_rank, n_tokens;
    int32_t *index;      /* [n_targets]: delta index or -1 */
    lp_sd_delta *deltas; /* [n_deltas] */
    float *arena;
    char (*tokens)[64];
    float *token_emb; /* [n_tokens][te_dim] */
};

enum { ROLE_DOWN, ROLE_UP, ROLE_ALPHA };

typedef struct slot {
    const lp_st_tensor *t[3]; /* down, up, alpha */
} slot;

typedef struct loader {
    const lp_safetensors *st;
    const char *name;
    const lp_sd_config *c;
    lp_sd_targets tg;
    slot *slots;
    float peft_alpha; /* 0: none */
    const char *format;
    lp_error *err;
} loader;

static bool ends_with(const char *s, size_t n, const char *suffix, size_t *stem) {
    size_t k = strlen(suffix);
    if (n < k || memcmp(s + n - k, suffix, k)) return false;
    *stem = n - k;
    return true;
}

static bool starts_with(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

static int put(loader *L, int32_t target, int role, const lp_st_tensor *t) {
    if (L->slots[target].t[role])
        return lp_fail(L->err, "%s: keys '%s' and '%s' both give the %s of %s", L->name, L->slots[target].t[role]->name,
                       t->name, role == ROLE_DOWN ? "down" : role == ROLE_UP ? "up" : "alpha", L->tg.t[target].ldm);
    L->slots[target].t[role] = t;
    return 0;
}

/* Unsupported LoRA variants, named for the message. */
static const char *variant_of(const char *key) {
    static const char *const v[][2] = {{".lora_mid.", "LoCon's Tucker mid weight"}, {".hada_", "LoHa"},
                                       {".lokr_", "LoKr"}, {".dora_scale", "DoRA"}, {".ia3", "IA3"},
                                       {".diff", "a full weight difference"}, {".diff_b", "a bias difference"}};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (strstr(key, v[i][0])) return v[i][1];
    return NULL;
}

/* Kohya: lora_unet_<m>.lora_down.weight / .lora_up.weight / .alpha */
static int kohya_key(loader *L, const lp_st_tensor *t, bool *took) {
    const char *k = t->name;
    int part;
    size_t skip;
    if (starts_with(k, "lora_unet_")) part = LP_SD_PART_UNET, skip = 10;
    else if (starts_with(k, "lora_te_")) part = LP_SD_PART_TE, skip = 8;
    else return 0;
    *took = true;
    size_t n = strlen(k), stem;
    int role;
    if (ends_with(k, n, ".lora_down.weight", &stem)) role = ROLE_DOWN;
    else if (ends_with(k, n, ".lora_up.weight", &stem)) role = ROLE_UP;
    else if (ends_with(k, n, ".alpha", &stem)) role = ROLE_ALPHA;
    else {
        const char *v = variant_of(k);
        return v ? lp_fail(L->err, "%s: key '%s': %s is not supported (plain LoRA only)", L->name, k, v)
                 : lp_fail(L->err, "%s: key '%s' is not a LoRA down, up or alpha", L->name, k);
    }
    const char *m = k + skip;
    size_t mlen = stem - skip;
    for (int32_t i = 0; i < L->tg.n; i++) {
        const lp_sd_target *g = &L->tg.t[i];
        if (g->part != part) continue;
        const char *ldm = g->ldm + (part == LP_SD_PART_TE ? sizeof k_te - 1 : sizeof k_unet - 1);
        if (eq_underscored(m, mlen, g->diffusers) || (part == LP_SD_PART_UNET && eq_underscored(m, mlen, ldm)))
            return put(L, i, role, t);
    }
    return lp_fail(L->err, "%s: key '%s' maps to no module of this SD model", L->name, k);
}

/* diffusers processors: <attn>.processor.to_q_lora.down.weight */
static int processor_key(loader *L, const lp_st_tensor *t, bool *took) {
    const char *k = t->name, *p = strstr(k, ".processor.");
    if (!p) return 0;
    *took = true;
    if (starts_with(k, "unet.")) k += 5;
    p = strstr(k, ".processor.");
    static const char *const proj[][2] = {{"to_q_lora", "to_q"}, {"to_k_lora", "to_k"}, {"to_v_lora", "to_v"},
                                          {"to_out_lora", "to_out.0"}};
    const char *q = p + 11;
    for (size_t i = 0; i < 4; i++) {
        size_t pl = strlen(proj[i][0]);
        if (strncmp(q, proj[i][0], pl)) continue;
        int role = !strcmp(q + pl, ".down.weight") ? ROLE_DOWN : !strcmp(q + pl, ".up.weight") ? ROLE_UP : -1;
        if (role < 0) break;
        char name[160];
        if (snprintf(name, sizeof name, "%.*s.%s", (int)(p - k), k, proj[i][1]) >= (int)sizeof name) break;
        int32_t g = find_diffusers(&L->tg, LP_SD_PART_UNET, name, strlen(name));
        if (g < 0) break;
        return put(L, g, role, t);
    }
    return lp_fail(L->err, "%s: key '%s' maps to no attention projection of this SD model", L->name, t->name);
}

/* PEFT / diffusers: [unet.|text_encoder.]<module>.lora_A.weight ... */
static int peft_key(loader *L, const lp_st_tensor *t, bool *took) {
    static const char *const suffixes[][2] = {
        {".lora_A.weight", "d"}, {".lora_B.weight", "u"}, {".lora_A.default.weight", "d"},
        {".lora_B.default.weight", "u"}, {".lora.down.weight", "d"}, {".lora.up.weight", "u"},
        {".lora_linear_layer.down.weight", "d"}, {".lora_linear_layer.up.weight", "u"}, {".alpha", "a"}};
    const char *k = t->name;
    size_t n = strlen(k), stem = 0;
    int role = -1;
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0] && role < 0; i++)
        if (ends_with(k, n, suffixes[i][0], &stem))
            role = suffixes[i][1][0] == 'd' ? ROLE_DOWN : suffixes[i][1][0] == 'u' ? ROLE_UP : ROLE_ALPHA;
    if (role < 0) return 0;
    *took = true;
    const char *m = k;
    if (starts_with(m, "base_model.model.")) m += 17;
    int part = LP_SD_PART_UNET;
    if (starts_with(m, "unet.")) m += 5;
    else if (starts_with(m, "text_encoder.")) m += 13, part = LP_SD_PART_TE;
    else if (starts_with(m, "text_model.")) part = LP_SD_PART_TE;
    int32_t g = find_diffusers(&L->tg, part, m, stem - (size_t)(m - k));
    if (g < 0) return lp_fail(L->err, "%s: key '%s' maps to no module of this SD model", L->name, k);
    return put(L, g, role, t);
}

/* ---- cloneofsimo's index format ------------------------------------------------------------------------- */

#define CLONE_MAX 1024

/* The targets of the n-th linear of the target classes, in module order
 * (ff_first: BasicTransformerBlock registers ff before attn2, as the
 * diffusers of 2022 did; later ones register it after). */
static int clone_order(loader *L, int part, const cJSON *classes, bool ff_first, int32_t *order, int32_t *n) {
    bool attn = false, geglu = false, clip_attn = false, clip_mlp = false;
    const cJSON *c;
    cJSON_ArrayForEach(c, classes) {
        const char *s = cJSON_GetStringValue(c);
        if (!s) return lp_fail(L->err, "%s: target class list is not a list of names", L->name);
        if (part == LP_SD_PART_UNET && (!strcmp(s, "CrossAttention") || !strcmp(s, "Attention"))) attn = true;
        else if (part == LP_SD_PART_UNET && !strcmp(s, "GEGLU")) geglu = true;
        else if (part == LP_SD_PART_TE && !strcmp(s, "CLIPAttention")) clip_attn = true;
        else if (part == LP_SD_PART_TE && !strcmp(s, "CLIPMLP")) clip_mlp = true;
        else
            return lp_fail(L->err, "%s: target class '%s' is not supported (UNet: CrossAttention, Attention, GEGLU; "
                                   "text encoder: CLIPAttention, CLIPMLP)", L->name, s);
    }
    *n = 0;
    char name[160];
#define ADD(...)                                                                                      \
    do {                                                                                              \
        int32_t g_ = snprintf(name, sizeof name, __VA_ARGS__) < (int)sizeof name                      \
                         ? find_diffusers(&L->tg, part, name, strlen(name)) : -1;                     \
        if (g_ < 0 || *n >= CLONE_MAX) return lp_fail(L->err, "%s: no module %s in this model", L->name, name); \
        order[(*n)++] = g_;                                                                           \
    } while (0)
    if (part == LP_SD_PART_TE) {
        for (int l = 0; l < L->c->te_layers; l++) {
            if (clip_attn) { /* transformers' CLIPAttention registers k, v, q, out */
                static const char *const p[] = {"k_proj", "v_proj", "q_proj", "out_proj"};
                for (int i = 0; i < 4; i++) ADD("text_model.encoder.layers.%d.self_attn.%s", l, p[i]);
            }
            if (clip_mlp) {
                ADD("text_model.encoder.layers.%d.mlp.fc1", l);
                ADD("text_model.encoder.layers.%d.mlp.fc2", l);
            }
        }
        return 0;
    }
    /* the UNet's transformer blocks in module order: down_blocks, up_blocks, then mid_block (diffusers
     * registers both lists before the middle block) */
    char blocks[3 * LP_SD_MAX_LEVELS * 9 + 1][96];
    int nb = 0;
    const int R = L->c->unet_res_blocks, LV = L->c->unet_levels;
    for (int l = 0; l < LV; l++)
        for (int j = 0; L->c->unet_attn[l] && j < R; j++)
            snprintf(blocks[nb++], sizeof blocks[0], "down_blocks.%d.attentions.%d.transformer_blocks.0", l, j);
    for (int i = 0; i < LV; i++)
        for (int j = 0; L->c->unet_attn[LV - 1 - i] && j <= R; j++)
            snprintf(blocks[nb++], sizeof blocks[0], "up_blocks.%d.attentions.%d.transformer_blocks.0", i, j);
    snprintf(blocks[nb++], sizeof blocks[0], "mid_block.attentions.0.transformer_blocks.0");
    static const char *const proj[] = {"to_q", "to_k", "to_v", "to_out.0"};
    for (int b = 0; b < nb; b++) {
        for (int i = 0; attn && i < 4; i++) ADD("%s.attn1.%s", blocks[b], proj[i]);
        if (geglu && ff_first) ADD("%s.ff.net.0.proj", blocks[b]);
        for (int i = 0; attn && i < 4; i++) ADD("%s.attn2.%s", blocks[b], proj[i]);
        if (geglu && !ff_first) ADD("%s.ff.net.0.proj", blocks[b]);
    }
#undef ADD
    return 0;
}

/* index N of "part:N:role" -> the N-th target of the order; shapes are
 * checked (dims only) so that the two module orders can be told apart */
static bool clone_shapes_fit(const loader *L, const char *prefix, const int32_t *order, int32_t n) {
    char key[64];
    for (int32_t i = 0; i < n; i++) {
        const lp_sd_target *g = &L->tg.t[order[i]];
        snprintf(key, sizeof key, "%s:%d:down", prefix, (int)i);
        const lp_st_tensor *d = lp_safetensors_find(L->st, key);
        snprintf(key, sizeof key, "%s:%d:up", prefix, (int)i);
        const lp_st_tensor *u = lp_safetensors_find(L->st, key);
        if (!d || !u) return true; /* missing pairs are reported later */
        if (d->n_dims < 2 || u->n_dims < 2 || d->shape[1] != (uint64_t)g->in || u->shape[0] != (uint64_t)g->out)
            return false;
    }
    return true;
}

static int clone_part(loader *L, int part, const char *prefix, int32_t *order, int32_t *n) {
    const char *meta = lp_safetensors_metadata(L->st, prefix);
    if (!meta) return lp_fail(L->err, "%s: keys '%s:N:...' but no '%s' metadata naming the target classes", L->name, prefix, prefix);
    cJSON *classes = cJSON_Parse(meta);
    if (!cJSON_IsArray(classes)) {
        cJSON_Delete(classes);
        return lp_fail(L->err, "%s: metadata '%s' is not a JSON list of class names", L->name, prefix);
    }
    int rc = clone_order(L, part, classes, true, order, n);
    if (!rc && !clone_shapes_fit(L, prefix, order, *n)) {
        int32_t m;
        int32_t *alt = malloc(sizeof(int32_t) * CLONE_MAX);
        if (!alt) rc = lp_error_set(L->err, LP_ERR_NOMEM, "out of memory");
        else if (!(rc = clone_order(L, part, classes, false, alt, &m)) && clone_shapes_fit(L, prefix, alt, m)) {
            memcpy(order, alt, sizeof(int32_t) * (size_t)m);
            *n = m;
        }
        free(alt);
    }
    cJSON_Delete(classes);
    return rc;
}

static int clone_key(loader *L, const lp_st_tensor *t, const int32_t *orders[2], const int32_t n[2], bool *took) {
    const char *k = t->name;
    int part;
    const char *rest;
    if (starts_with(k, "unet:")) part = LP_SD_PART_UNET, rest = k + 5;
    else if (starts_with(k, "text_encoder:")) part = LP_SD_PART_TE, rest = k + 13;
    else return 0;
    *took = true;
    char *end;
    long i = strtol(rest, &end, 10);
    if (end == rest || *end != ':' || i < 0) return lp_fail(L->err, "%s: key '%s' is not part:N:down or part:N:up", L->name, k);
    int role = !strcmp(end, ":down") ? ROLE_DOWN : !strcmp(end, ":up") ? ROLE_UP : -1;
    if (role < 0) return lp_fail(L->err, "%s: key '%s' is not part:N:down or part:N:up", L->name, k);
    if (i >= n[part])
        return lp_fail(L->err, "%s: key '%s': index %ld, but the target classes have %d linears", L->name, k, i, n[part]);
    char rk[80];
    snprintf(rk, sizeof rk, "%.*s:%ld:rank", (int)(rest - k - 1), k, i);
    const char *r = lp_safetensors_metadata(L->st, rk);
    if (r && role == ROLE_DOWN && (t->n_dims < 1 || strtoull(r, NULL, 10) != t->shape[0]))
        return lp_fail(L->err, "%s: key '%s': metadata rank %s, tensor rank %llu", L->name, k, r,
                       t->n_dims ? (unsigned long long)t->shape[0] : 0ULL);
    return put(L, orders[part][i], role, t);
}

/* ---- checking and converting ------------------------------------------------------------------------------ */

/* rank of a slot's pair, with every shape checked against the target */
static int check_pair(loader *L, int32_t i, int32_t *rank) {
    const lp_sd_target *g = &L->tg.t[i];
    const lp_st_tensor *d = L->slots[i].t[ROLE_DOWN], *u = L->slots[i].t[ROLE_UP], *a = L->slots[i].t[ROLE_ALPHA];
    if (!d || !u)
        return lp_fail(L->err, "%s: key '%s' has no matching %s", L->name, (d ? d : u ? u : a)->name, d ? "up" : "down");
    int32_t k = g->k ? g->k : 1;
    uint64_t r = d->n_dims ? d->shape[0] : 0;
    bool down_ok = r >= 1 && r <= 4096 && d->shape[1] == (uint64_t)g->in &&
                   (d->n_dims == 2 ? k == 1 : d->n_dims == 4 && d->shape[2] == (uint64_t)k && d->shape[3] == (uint64_t)k);
    if (!down_ok)
        return lp_fail(L->err, "%s: key '%s': shape does not fit %s (%s [%d][%d]%s, rank 1..4096)", L->name, d->name,
                       g->ldm, g->k ? "conv" : "linear", g->out, g->in, g->k == 3 ? "[3][3]" : "");
    bool up_ok = u->shape[0] == (uint64_t)g->out && u->shape[1] == r &&
                 (u->n_dims == 2 || (u->n_dims == 4 && u->shape[2] == 1 && u->shape[3] == 1));
    if (!up_ok) return lp_fail(L->err, "%s: key '%s': shape is not [%d][%llu] for %s", L->name, u->name, g->out, (unsigned long long)r, g->ldm);
    if (a && a->n_elements != 1) return lp_fail(L->err, "%s: key '%s': alpha is not one number", L->name, a->name);
    for (int j = 0; j < 3; j++) {
        const lp_st_tensor *t = L->slots[i].t[j];
        if (t && t->dtype != LP_ST_F32 && t->dtype != LP_ST_F16 && t->dtype != LP_ST_BF16)
            return lp_fail(L->err, "%s: key '%s': dtype %s (F32, F16 or BF16)", L->name, t->name, lp_st_dtype_name(t->dtype));
    }
    *rank = (int32_t)r;
    return 0;
}

static int tokens_of(loader *L, lp_sd_lora *l) {
    size_t n = lp_safetensors_count(L->st);
    for (size_t i = 0; i < n; i++) {
        const lp_st_tensor *t = lp_safetensors_at(L->st, i);
        const char *m = lp_safetensors_metadata(L->st, t->name);
        if (!m || strcmp(m, "<embed>")) continue;
        if (t->n_elements != (uint64_t)L->c->te_dim || (t->dtype != LP_ST_F32 && t->dtype != LP_ST_F16 && t->dtype != LP_ST_BF16))
            return lp_fail(L->err, "%s: token embedding '%s' is not %d F32/F16/BF16 values", L->name, t->name, L->c->te_dim);
        if (!*t->name || strlen(t->name) >= sizeof l->tokens[0])
            return lp_fail(L->err, "%s: token '%s' is empty or longer than 63 bytes", L->name, t->name);
        l->n_tokens++;
    }
    if (!l->n_tokens) return 0;
    l->tokens = calloc((size_t)l->n_tokens, sizeof *l->tokens);
    l->token_emb = malloc(sizeof(float) * (size_t)l->n_tokens * (size_t)L->c->te_dim);
    if (!l->tokens || !l->token_emb) return lp_error_set(L->err, LP_ERR_NOMEM, "out of memory");
    int32_t j = 0;
    for (size_t i = 0; i < n; i++) {
        const lp_st_tensor *t = lp_safetensors_at(L->st, i);
        const char *m = lp_safetensors_metadata(L->st, t->name);
        if (!m || strcmp(m, "<embed>")) continue;
        snprintf(l->tokens[j], sizeof l->tokens[0], "%s", t->name);
        if (lp_st_to_f32(t, l->token_emb + (size_t)j * (size_t)L->c->te_dim, L->err)) return -1;
        j++;
    }
    return 0;
}

static int classify(loader *L, lp_sd_lora *l) {
    size_t n = lp_safetensors_count(L->st);
    bool clone = false;
    for (size_t i = 0; i < n && !clone; i++) {
        const char *k = lp_safetensors_at(L->st, i)->name;
        clone = starts_with(k, "unet:") || starts_with(k, "text_encoder:");
    }
    int32_t *orders[2] = {NULL, NULL}, cn[2] = {0, 0};
    int rc = 0;
    if (clone) {
        orders[0] = malloc(sizeof(int32_t) * CLONE_MAX);
        orders[1] = malloc(sizeof(int32_t) * CLONE_MAX);
        if (!orders[0] || !orders[1]) rc = lp_error_set(L->err, LP_ERR_NOMEM, "out of memory");
        for (int p = 0; p < 2 && !rc; p++) {
            const char *prefix = p == LP_SD_PART_TE ? "text_encoder" : "unet";
            bool has = false;
            for (size_t i = 0; i < n && !has; i++) {
                const char *k = lp_safetensors_at(L->st, i)->name;
                has = starts_with(k, prefix) && k[strlen(prefix)] == ':';
            }
            if (has) rc = clone_part(L, p, prefix, orders[p], &cn[p]);
        }
    }
    for (size_t i = 0; i < n && !rc; i++) {
        const lp_st_tensor *t = lp_safetensors_at(L->st, i);
        const char *m = lp_safetensors_metadata(L->st, t->name);
        if (m && !strcmp(m, "<embed>")) continue; /* a token: tokens_of */
        bool took = false;
        const char *fmt = clone ? "cloneofsimo" : "kohya";
        if (clone) rc = clone_key(L, t, (const int32_t **)orders, cn, &took);
        if (!rc && !took) rc = kohya_key(L, t, &took), fmt = "kohya";
        if (!rc && !took) rc = processor_key(L, t, &took), fmt = "diffusers";
        if (!rc && !took) rc = peft_key(L, t, &took), fmt = "peft";
        if (!rc && !took) {
            const char *v = variant_of(t->name);
            rc = v ? lp_fail(L->err, "%s: key '%s': %s is not supported (plain LoRA only)", L->name, t->name, v)
                   : lp_fail(L->err, "%s: key '%s' is in no LoRA format this loader reads (Kohya, diffusers, PEFT, "
                                     "cloneofsimo)", L->name, t->name);
        }
        if (!rc && !L->format) L->format = fmt;
    }
    free(orders[0]), free(orders[1]);
    if (!rc && !L->format) rc = lp_fail(L->err, "%s: no LoRA tensors", L->name);
    if (!rc) snprintf(l->format, sizeof l->format, "%s", L->format);
    return rc;
}

/* dst[c][r] = src[r][c] for a rows x cols src */
static void transpose(const float *src, int64_t rows, int64_t cols, float *dst) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[c * rows + r] = src[r * cols + c];
}

static int convert(loader *L, lp_sd_lora *l) {
    int64_t floats = 0;
    int32_t *rank = calloc((size_t)L->tg.n, sizeof *rank);
    if (!rank) return lp_error_set(L->err, LP_ERR_NOMEM, "out of memory");
    int rc = 0;
    for (int32_t i = 0; i < L->tg.n && !rc; i++) {
        const slot *s = &L->slots[i];
        if (!s->t[0] && !s->t[1] && !s->t[2]) continue;
        if ((rc = check_pair(L, i, &rank[i]))) break;
        const lp_sd_target *g = &L->tg.t[i];
        int64_t k = g->k ? g->k : 1;
        floats += rank[i] * (k * k * g->in + g->out);
        l->n_deltas++;
    }
    l->index = malloc(sizeof(int32_t) * (size_t)L->tg.n);
    l->deltas = calloc((size_t)(l->n_deltas ? l->n_deltas : 1), sizeof *l->deltas);
    l->arena = malloc(sizeof(float) * (size_t)(floats ? floats : 1));
    float *tmp = NULL;
    if (!rc && (!l->index || !l->deltas || !l->arena)) rc = lp_error_set(L->err, LP_ERR_NOMEM, "out of memory");
    int64_t at = 0;
    int32_t j = 0;
    for (int32_t i = 0; i < L->tg.n && !rc; i++) {
        l->index[i] = -1;
        const slot *s = &L->slots[i];
        if (!s->t[ROLE_DOWN]) continue;
        const lp_sd_target *g = &L->tg.t[i];
        int64_t k = g->k ? g->k : 1, cols = k * k * g->in, r = rank[i];
        float *down = l->arena + at, *up = down + r * cols;
        free(tmp);
        if (!(tmp = malloc(sizeof(float) * (size_t)(2 * r * (cols > g->out ? cols : g->out))))) {
            rc = lp_error_set(L->err, LP_ERR_NOMEM, "out of memory");
            break;
        }
        float *file = tmp, *rows = tmp + r * cols; /* the file's layout; [r][cols] in lp_conv2d's column order */
        if ((rc = lp_st_to_f32(s->t[ROLE_DOWN], file, L->err))) break;
        if (k > 1) lp_conv_weight_repack(file, r, g->in, k, k, rows);
        else memcpy(rows, file, sizeof(float) * (size_t)(r * cols));
        transpose(rows, r, cols, down);
        if ((rc = lp_st_to_f32(s->t[ROLE_UP], file, L->err))) break;
        transpose(file, g->out, r, up);
        float scale = 1.0f;
        if (s->t[ROLE_ALPHA]) {
            float a;
            if ((rc = lp_st_to_f32(s->t[ROLE_ALPHA], &a, L->err))) break;
            scale = a / (float)r;
        } else if (L->peft_alpha > 0 && !strcmp(l->format, "peft")) {
            scale = L->peft_alpha / (float)r;
        }
        l->deltas[j] = (lp_sd_delta){.target = i, .rank = (int32_t)r, .scale = scale, .down = down, .up = up};
        l->index[i] = j++;
        l->count[g->part]++;
        if (r > l->max_rank) l->max_rank = (int32_t)r;
        at += r * (cols + g->out);
    }
    free(tmp);
    free(rank);
    return rc;
}

/* adapter_config.json: lora_alpha (PEFT's scale is lora_alpha / r) */
static int peft_alpha_of(const char *text, const char *name, float *alpha, lp_error *err) {
    cJSON *j = cJSON_Parse(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return lp_fail(err, "%s: adapter_config.json is not a JSON object", name);
    }
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "lora_alpha");
    int rc = 0;
    if (a && (!cJSON_IsNumber(a) || !(a->valuedouble > 0) || a->valuedouble > 1e6))
        rc = lp_fail(err, "%s: adapter_config.json: lora_alpha is not a positive number", name);
    else if (a)
        *alpha = (float)a->valuedouble;
    cJSON_Delete(j);
    return rc;
}

static lp_sd_lora *load_st(const lp_safetensors *st, const char *name, const char *peft_config, const lp_sd_config *c,
                           lp_error *err) {
    loader L = {.st = st, .name = name, .c = c, .err = err};
    lp_sd_lora *l = calloc(1, sizeof *l);
    if (!l) return lp_error_set(err, LP_ERR_NOMEM, "out of memory"), NULL;
    l->cfg = *c;
    int rc = lp_sd_targets_build(c, &L.tg, err);
    if (!rc && !(L.slots = calloc((size_t)L.tg.n, sizeof *L.slots))) rc = lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    if (!rc && peft_config) rc = peft_alpha_of(peft_config, name, &L.peft_alpha, err);
    if (!rc) rc = classify(&L, l);
    if (!rc) rc = convert(&L, l);
    if (!rc) rc = tokens_of(&L, l);
    l->n_targets = L.tg.n;
    free(L.slots);
    lp_sd_targets_free(&L.tg);
    if (rc) {
        lp_error_as_format(err);
        lp_sd_lora_free(l);
        return NULL;
    }
    return l;
}

lp_sd_lora *lp_sd_lora_load_memory(const void *data, size_t size, const char *name, const char *peft_config,
                                   const lp_sd_config *c, lp_error *err) {
    lp_safetensors *st = lp_safetensors_open_memory(data, size, name, err);
    if (!st) return NULL;
    lp_sd_lora *l = load_st(st, name, peft_config, c, err);
    lp_safetensors_close(st);
    return l;
}

lp_sd_lora *lp_sd_lora_load(const char *path, const lp_sd_config *c, lp_error *err) {
    lp_safetensors *st = lp_safetensors_open(path, err);
    if (!st) return NULL;
    /* a PEFT adapter's scale is in the adapter_config.json beside it */
    char cfg_path[4096];
    const char *slash = strrchr(path, '/');
    int dl = slash ? (int)(slash - path + 1) : 0;
    char *cfg = NULL;
    size_t cfg_size = 0;
    if (snprintf(cfg_path, sizeof cfg_path, "%.*sadapter_config.json", dl, path) < (int)sizeof cfg_path) {
        lp_error e2 = {0};
        if (lp_read_file(cfg_path, &cfg, &cfg_size, (size_t)1 << 20, &e2)) cfg = NULL;
    }
    lp_sd_lora *l = load_st(st, path, cfg, c, err);
    free(cfg);
    lp_safetensors_close(st);
    return l;
}

void lp_sd_lora_free(lp_sd_lora *l) {
    if (!l) return;
    free(l->index), free(l->deltas), free(l->arena), free(l->tokens), free(l->token_emb);
    free(l);
}

const lp_sd_config *lp_sd_lora_config(const lp_sd_lora *l) { return &l->cfg; }
const char *lp_sd_lora_format(const lp_sd_lora *l) { return l->format; }
int32_t lp_sd_lora_count(const lp_sd_lora *l, int part) {
    return part == LP_SD_PART_TE || part == LP_SD_PART_UNET ? l->count[part] : l->count[0] + l->count[1];
}
int32_t lp_sd_lora_max_rank(const lp_sd_lora *l) { return l->max_rank; }
const lp_sd_delta *lp_sd_lora_delta(const lp_sd_lora *l, int32_t target) {
    return target >= 0 && target < l->n_targets && l->index[target] >= 0 ? &l->deltas[l->index[target]] : NULL;
}
int32_t lp_sd_lora_n_tokens(const lp_sd_lora *l) { return l->n_tokens; }
const char *lp_sd_lora_token(const lp_sd_lora *l, int32_t i) {
    return i >= 0 && i < l->n_tokens ? l->tokens[i] : NULL;
}
const float *lp_sd_lora_token_embedding(const lp_sd_lora *l, int32_t i) {
    return i >= 0 && i < l->n_tokens ? l->token_emb + (size_t)i * (size_t)l->cfg.te_dim : NULL;
}
