/* OpenAI request bodies in, response bodies and stream chunks out (api.h).
 * Every field is checked for its type and range; a body that fails gets a
 * message naming the field, for a 400. */
#include "api.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/base.h"

/* ---- parsing --------------------------------------------------------------------------- */

typedef struct parse {
    lp_api_request *r;
    char *msg;
    size_t cap;
} parse;

static int bad(parse *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(parse *p, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->msg, p->cap, fmt, ap);
    va_end(ap);
    return -1;
}

static bool utf8_ok(const char *s) { return lp_utf8_valid((const uint8_t *)s, strlen(s)); }

/* A request body as a JSON object (the caller deletes it), or NULL with msg set. */
static cJSON *parse_body(parse *p, const char *body, size_t len) {
    if (!lp_utf8_valid((const uint8_t *)body, len)) {
        bad(p, "the body is not valid UTF-8");
        return NULL;
    }
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root) bad(p, "the body is not valid JSON");
    else if (!cJSON_IsObject(root)) bad(p, "the body must be a JSON object");
    else return root;
    cJSON_Delete(root);
    return NULL;
}

/* A string field: absent leaves *out; present must be a valid UTF-8 string. */
static int get_string(parse *p, const cJSON *o, const char *key, const char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v)) return bad(p, "'%s' must be a string", key);
    if (!utf8_ok(v->valuestring)) return bad(p, "'%s' is not valid UTF-8", key);
    *out = v->valuestring;
    return 0;
}

static int get_number(parse *p, const cJSON *o, const char *key, double lo, double hi, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return bad(p, "'%s' must be a number", key);
    if (v->valuedouble < lo || v->valuedouble > hi) return bad(p, "'%s' must be in [%g, %g]", key, lo, hi);
    *out = v->valuedouble;
    return 0;
}

static int get_int(parse *p, const cJSON *o, const char *key, double lo, double hi, int *out) {
    double d = *out;
    if (get_number(p, o, key, lo, hi, &d)) return -1;
    if (d != floor(d)) return bad(p, "'%s' must be an integer", key);
    *out = (int)d;
    return 0;
}

static int get_bool(parse *p, const cJSON *o, const char *key, bool *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return bad(p, "'%s' must be true or false", key);
    *out = cJSON_IsTrue(v);
    return 0;
}

static char *own(lp_api_request *r, size_t bytes) {
    char **grown = realloc(r->owned, (size_t)(r->n_owned + 1) * sizeof *grown);
    if (!grown) return NULL;
    r->owned = grown;
    char *s = malloc(bytes);
    if (s) r->owned[r->n_owned++] = s;
    return s;
}

/* A message's content: a string, or an array of {"type": "text", "text": ...}
 * parts joined. */
static int message_content(parse *p, const cJSON *c, int i, const char **out) {
    if (cJSON_IsString(c)) {
        if (!utf8_ok(c->valuestring)) return bad(p, "messages[%d].content is not valid UTF-8", i);
        *out = c->valuestring;
        return 0;
    }
    if (!cJSON_IsArray(c)) return bad(p, "messages[%d].content must be a string or an array of text parts", i);
    size_t total = 1;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
            return bad(p, "messages[%d].content: only {\"type\": \"text\", \"text\": ...} parts are supported", i);
        if (!utf8_ok(text->valuestring)) return bad(p, "messages[%d].content is not valid UTF-8", i);
        total += strlen(text->valuestring);
    }
    char *s = own(p->r, total);
    if (!s) return bad(p, "out of memory");
    s[0] = 0;
    size_t at = 0;
    cJSON_ArrayForEach(part, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t n = strlen(t);
        memcpy(s + at, t, n + 1);
        at += n;
    }
    *out = s;
    return 0;
}

static int parse_messages(parse *p, const cJSON *root) {
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!cJSON_IsArray(ms)) return bad(p, "'messages' must be an array");
    int n = cJSON_GetArraySize(ms);
    if (n < 1 || n > LP_API_MAX_MESSAGES) return bad(p, "'messages' must have 1 to %d entries", LP_API_MAX_MESSAGES);
    p->r->messages = calloc((size_t)n, sizeof *p->r->messages);
    if (!p->r->messages) return bad(p, "out of memory");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, ms) {
        if (!cJSON_IsObject(m)) return bad(p, "messages[%d] must be an object", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role) || !utf8_ok(role->valuestring))
            return bad(p, "messages[%d].role must be a string", i);
        const char *r = role->valuestring;
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "developer"))
            return bad(p, "messages[%d].role \"%.40s\" is not system, developer, user or assistant", i, r);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!content) return bad(p, "messages[%d] has no content", i);
        p->r->messages[i].role = strcmp(r, "developer") ? r : "system";
        if (message_content(p, content, i, &p->r->messages[i].content)) return -1;
        i++;
    }
    p->r->n_messages = n;
    return 0;
}

/* "prompt": a string, or an array of token ids. */
static int parse_prompt(parse *p, const cJSON *root) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (cJSON_IsString(v)) {
        if (!utf8_ok(v->valuestring)) return bad(p, "'prompt' is not valid UTF-8");
        p->r->prompt = v->valuestring;
        return 0;
    }
    if (!cJSON_IsArray(v)) return bad(p, "'prompt' must be a string or an array of token ids");
    int n = cJSON_GetArraySize(v);
    if (n < 1 || n > LP_API_MAX_PROMPT_TOKENS) return bad(p, "'prompt' must have 1 to %d tokens", LP_API_MAX_PROMPT_TOKENS);
    p->r->prompt_tokens = malloc((size_t)n * sizeof(int32_t));
    if (!p->r->prompt_tokens) return bad(p, "out of memory");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, v) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
            t->valuedouble > INT32_MAX)
            return bad(p, "prompt[%d] must be a token id (a non-negative integer)", i);
        p->r->prompt_tokens[i++] = (int32_t)t->valuedouble;
    }
    p->r->n_prompt_tokens = n;
    return 0;
}

static int parse_stop(parse *p, const cJSON *root) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (!v || cJSON_IsNull(v)) return 0;
    if (cJSON_IsString(v)) {
        if (!utf8_ok(v->valuestring)) return bad(p, "'stop' is not valid UTF-8");
        if (v->valuestring[0]) p->r->stop[p->r->n_stop++] = v->valuestring;
        return 0;
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) > LP_API_MAX_STOP)
        return bad(p, "'stop' must be a string or an array of at most %d strings", LP_API_MAX_STOP);
    const cJSON *s;
    cJSON_ArrayForEach(s, v) {
        if (!cJSON_IsString(s) || !utf8_ok(s->valuestring)) return bad(p, "'stop' entries must be strings");
        if (s->valuestring[0]) p->r->stop[p->r->n_stop++] = s->valuestring;
    }
    return 0;
}

/* OpenAI's presence / frequency penalties, logit bias and log-probabilities. */
static int parse_openai_sampling(parse *p, const cJSON *root, lp_api_kind kind) {
    lp_api_request *r = p->r;
    double presence = 0, frequency = 0;
    if (get_number(p, root, "presence_penalty", -2, 2, &presence) ||
        get_number(p, root, "frequency_penalty", -2, 2, &frequency))
        return -1;
    r->sampling.presence_penalty = (float)presence;
    r->sampling.frequency_penalty = (float)frequency;
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    if (bias && !cJSON_IsNull(bias)) {
        if (!cJSON_IsObject(bias)) return bad(p, "'logit_bias' must be an object of token id -> bias");
        int n = cJSON_GetArraySize(bias);
        if (n > LP_API_MAX_LOGIT_BIAS) return bad(p, "'logit_bias' has more than %d entries", LP_API_MAX_LOGIT_BIAS);
        if (n > 0 && !(r->logit_bias = calloc((size_t)n, sizeof *r->logit_bias))) return bad(p, "out of memory");
        const cJSON *e;
        cJSON_ArrayForEach(e, bias) {
            /* the key is a token id in decimal, nothing else */
            const char *k = e->string;
            char *end = NULL;
            long id = k && *k >= '0' && *k <= '9' && strlen(k) <= 10 ? strtol(k, &end, 10) : -1;
            if (id < 0 || id > INT32_MAX || !end || *end)
                return bad(p, "'logit_bias' keys must be token ids (decimal integers); got \"%.20s\"", k ? k : "");
            if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble) || e->valuedouble < -100 || e->valuedouble > 100)
                return bad(p, "'logit_bias' values must be numbers in [-100, 100]");
            r->logit_bias[r->n_logit_bias++] = (lp_logit_bias){.token = (int32_t)id, .bias = (float)e->valuedouble};
        }
        r->sampling.logit_bias = r->logit_bias;
        r->sampling.n_logit_bias = r->n_logit_bias;
    }
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
    if (kind == LP_API_CHAT) {
        if (get_bool(p, root, "logprobs", &r->logprobs) ||
            get_int(p, root, "top_logprobs", 0, LP_MAX_TOP_LOGPROBS, &r->top_logprobs))
            return -1;
        const cJSON *top = cJSON_GetObjectItemCaseSensitive(root, "top_logprobs");
        if (top && !cJSON_IsNull(top) && !r->logprobs) return bad(p, "'top_logprobs' needs 'logprobs': true");
    } else if (lp && !cJSON_IsNull(lp)) {
        /* the legacy form: logprobs N, the N best alternatives */
        if (get_int(p, root, "logprobs", 0, LP_MAX_TOP_LOGPROBS, &r->top_logprobs)) return -1;
        r->logprobs = true;
    }
    return 0;
}

static int parse_lora(parse *p, const cJSON *root) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "lora");
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) > 1)
        return bad(p, "'lora' must be an array of at most one {\"id\": i, \"scale\": s} (one adapter a request)");
    const cJSON *e = cJSON_GetArrayItem(v, 0);
    if (!e) return 0;
    if (!cJSON_IsObject(e)) return bad(p, "'lora' entries must be objects");
    int id = -1;
    double scale = 1;
    if (get_int(p, e, "id", 0, 4095, &id) || get_number(p, e, "scale", -1e6, 1e6, &scale)) return -1;
    if (id < 0) return bad(p, "'lora' entries need an 'id'");
    if (scale == 0) return 0; /* llama.cpp: scale 0 turns the adapter off */
    if (scale != 1) return bad(p, "'lora' scale must be 0 or 1 here (adapters are loaded with their scale)");
    p->r->lora_id = id;
    return 0;
}

static int parse_choice_models(parse *p, const cJSON *root) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "choice_models");
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != p->r->n)
        return bad(p, "'choice_models' must be an array of n (%d) adapter names", p->r->n);
    int i = 0;
    const cJSON *s;
    cJSON_ArrayForEach(s, v) {
        if (!cJSON_IsString(s) || !utf8_ok(s->valuestring)) return bad(p, "'choice_models' entries must be strings");
        p->r->choice_models[i++] = s->valuestring;
    }
    return 0;
}

static int parse_fields(parse *p, const cJSON *root, lp_api_kind kind) {
    lp_api_request *r = p->r;
    if (get_string(p, root, "model", &r->model)) return -1;
    if (kind == LP_API_CHAT ? parse_messages(p, root) : parse_prompt(p, root)) return -1;
    if (get_int(p, root, "max_tokens", 0, 1 << 24, &r->max_tokens) ||
        get_int(p, root, "max_completion_tokens", 0, 1 << 24, &r->max_tokens) ||
        get_int(p, root, "n", 1, LP_API_MAX_N, &r->n) || get_bool(p, root, "stream", &r->stream) ||
        get_bool(p, root, "echo", &r->echo))
        return -1;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) return bad(p, "'stream_options' must be an object");
        if (get_bool(p, so, "include_usage", &r->include_usage)) return -1;
    }
    lp_sampler_params *s = &r->sampling;
    double t = s->temperature, top_p = s->top_p, min_p = s->min_p, rp = s->repeat_penalty, seed = 0;
    int top_k = s->top_k;
    if (get_number(p, root, "temperature", 0, 2, &t) || get_number(p, root, "top_p", 0, 1, &top_p) ||
        get_int(p, root, "top_k", 0, 1 << 20, &top_k) || get_number(p, root, "min_p", 0, 1, &min_p) ||
        get_number(p, root, "repeat_penalty", 0, 10, &rp))
        return -1;
    if (top_p <= 0) return bad(p, "'top_p' must be greater than 0");
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(root, "speculate");
    if (spec && !cJSON_IsNull(spec)) {
        bool on = false;
        if (get_bool(p, root, "speculate", &on)) return -1;
        r->speculate = on;
    }
    const cJSON *sv = cJSON_GetObjectItemCaseSensitive(root, "seed");
    if (sv && !cJSON_IsNull(sv)) {
        if (get_number(p, root, "seed", -9007199254740991.0, 9007199254740991.0, &seed)) return -1;
        if (seed != floor(seed)) return bad(p, "'seed' must be an integer");
        s->seed = (uint64_t)(int64_t)seed;
        r->seed_set = true;
    }
    s->temperature = (float)t;
    s->top_p = (float)top_p;
    s->top_k = top_k;
    s->min_p = (float)min_p;
    s->repeat_penalty = (float)rp;
    if (parse_stop(p, root) || parse_openai_sampling(p, root, kind) || parse_lora(p, root) ||
        parse_choice_models(p, root))
        return -1;
    return 0;
}

int lp_api_parse(const char *body, size_t len, lp_api_kind kind, lp_api_request *out, char *msg, size_t cap) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->model = "";
    out->max_tokens = -1;
    out->n = 1;
    out->lora_id = -1;
    out->speculate = -1;
    out->sampling = lp_sampler_default_params();
    parse p = {.r = out, .msg = msg, .cap = cap};
    cJSON *root = parse_body(&p, body, len);
    if (!root) return -1;
    out->root = root;
    if (parse_fields(&p, root, kind)) {
        lp_api_request_free(out);
        return -1;
    }
    return 0;
}

void lp_api_request_free(lp_api_request *r) {
    cJSON_Delete(r->root);
    free(r->messages);
    free(r->prompt_tokens);
    free(r->logit_bias);
    for (int i = 0; i < r->n_owned; i++) free(r->owned[i]);
    free(r->owned);
    memset(r, 0, sizeof *r);
}

int lp_api_parse_tokens(const char *body, size_t len, bool detokenize, lp_api_tokens_request *out, char *msg,
                        size_t cap) {
    memset(out, 0, sizeof *out);
    lp_api_request scratch = {0};
    parse p = {.r = &scratch, .msg = msg, .cap = cap};
    cJSON *root = parse_body(&p, body, len);
    if (!root) return -1;
    out->root = root;
    int rc = -1;
    if (!detokenize) {
        out->content = "";
        if (!get_string(&p, root, "content", &out->content) && !get_bool(&p, root, "add_special", &out->add_special))
            rc = 0;
    } else {
        /* the same checks as a prompt of token ids */
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "tokens");
        if (cJSON_IsArray(t) && cJSON_GetArraySize(t) == 0) rc = 0;
        else if (!cJSON_IsArray(t)) bad(&p, "'tokens' must be an array of token ids");
        else {
            cJSON *wrap = cJSON_CreateObject();
            if (wrap && cJSON_AddItemReferenceToObject(wrap, "prompt", (cJSON *)t) && !parse_prompt(&p, wrap)) {
                out->tokens = scratch.prompt_tokens;
                out->n_tokens = scratch.n_prompt_tokens;
                scratch.prompt_tokens = NULL;
                rc = 0;
            } else if (!wrap) bad(&p, "out of memory");
            cJSON_Delete(wrap);
            free(scratch.prompt_tokens);
        }
    }
    if (rc) lp_api_tokens_request_free(out);
    return rc;
}

void lp_api_tokens_request_free(lp_api_tokens_request *r) {
    cJSON_Delete(r->root);
    free(r->tokens);
    memset(r, 0, sizeof *r);
}

bool lp_api_name_ok(const char *n) {
    size_t len = strlen(n);
    if (len == 0 || len > 127 || !strcmp(n, ".") || !strcmp(n, "..")) return false;
    for (size_t i = 0; i < len; i++) {
        char c = n[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return false;
    }
    return true;
}

int lp_api_parse_lora(const char *body, size_t len, bool load, lp_api_lora_request *out, char *msg, size_t cap) {
    memset(out, 0, sizeof *out);
    lp_api_request scratch = {0};
    parse p = {.r = &scratch, .msg = msg, .cap = cap};
    cJSON *root = parse_body(&p, body, len);
    if (!root) return -1;
    out->root = root;
    int rc = -1;
    if (!get_string(&p, root, "lora_name", &out->name) &&
             !(load && get_string(&p, root, "lora_path", &out->path))) {
        if (!out->name || !lp_api_name_ok(out->name))
            bad(&p, "'lora_name' must be 1 to 127 letters, digits, '.', '_' or '-' (not \".\" or \"..\")");
        else if (load && (!out->path || !out->path[0])) bad(&p, "'lora_path' must be a path inside --adapter-dir");
        else rc = 0;
    }
    if (rc) lp_api_lora_request_free(out);
    return rc;
}

void lp_api_lora_request_free(lp_api_lora_request *r) {
    cJSON_Delete(r->root);
    memset(r, 0, sizeof *r);
}

/* ---- output ---------------------------------------------------------------------------- */

void lp_sbuf_add(lp_sbuf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *grown = realloc(b->data, cap);
        if (!grown) {
            b->failed = true;
            return;
        }
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void lp_sbuf_printf(lp_sbuf *b, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = true;
        return;
    }
    if ((size_t)n < sizeof small) {
        lp_sbuf_add(b, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->failed = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    lp_sbuf_add(b, big, (size_t)n);
    free(big);
}

/* Bytes of the one well-formed UTF-8 character at s (n > 0, s[0] >= 0x80), 0 if there is none. */
static size_t utf8_char(const unsigned char *s, size_t n) {
    size_t len = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
    return len && len <= n && lp_utf8_valid(s, len) ? len : 0;
}

/* A JSON string of text, any byte that is not part of well-formed UTF-8
 * written as U+FFFD (a model can emit stray byte tokens; JSON must stay
 * valid UTF-8, as other OpenAI servers keep it). */
void lp_sbuf_json_string(lp_sbuf *b, const char *s, size_t n) {
    lp_sbuf_lit(b, "\"");
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80) {
            size_t k = utf8_char((const unsigned char *)s + i, n - i);
            if (k) {
                i += k - 1;
                continue;
            }
            lp_sbuf_add(b, s + run, i - run);
            run = i + 1;
            lp_sbuf_lit(b, "\\ufffd");
            continue;
        }
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        lp_sbuf_add(b, s + run, i - run);
        run = i + 1;
        char esc[8];
        switch (c) {
        case '"': lp_sbuf_lit(b, "\\\""); break;
        case '\\': lp_sbuf_lit(b, "\\\\"); break;
        case '\n': lp_sbuf_lit(b, "\\n"); break;
        case '\r': lp_sbuf_lit(b, "\\r"); break;
        case '\t': lp_sbuf_lit(b, "\\t"); break;
        default:
            snprintf(esc, sizeof esc, "\\u%04x", c);
            lp_sbuf_add(b, esc, 6);
        }
    }
    lp_sbuf_add(b, s + run, n - run);
    lp_sbuf_lit(b, "\"");
}

void lp_sbuf_free(lp_sbuf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

void lp_api_error_body(lp_sbuf *b, const char *message, const char *type) {
    lp_sbuf_lit(b, "{\"error\":{\"message\":");
    lp_sbuf_json_string(b, message, strlen(message));
    lp_sbuf_printf(b, ",\"type\":\"%s\",\"param\":null,\"code\":null}}", type);
}

static void meta_head(lp_sbuf *b, const lp_api_meta *m, const char *object) {
    lp_sbuf_printf(b, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", m->id, object,
                   (long long)m->created);
    lp_sbuf_json_string(b, m->model, strlen(m->model));
}

static void usage(lp_sbuf *b, int prompt, int completion) {
    lp_sbuf_printf(b, "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}", prompt,
                   completion, prompt + completion);
}

static void finish(lp_sbuf *b, const char *reason) {
    if (reason) lp_sbuf_printf(b, "\"finish_reason\":\"%s\"", reason);
    else lp_sbuf_lit(b, "\"finish_reason\":null");
}

/* A token's text as a JSON string: a piece that is not whole UTF-8 (a byte
 * of a character split over tokens) has its non-ASCII bytes as U+FFFD, as
 * OpenAI does; `bytes` keeps the exact ones. */
static void token_string(lp_sbuf *b, const char *piece, size_t n) {
    if (lp_utf8_valid((const uint8_t *)piece, n)) {
        lp_sbuf_json_string(b, piece, n);
        return;
    }
    char clean[256 * 3];
    size_t at = 0;
    for (size_t i = 0; i < n && at + 3 <= sizeof clean; i++) {
        unsigned char c = (unsigned char)piece[i];
        if (c < 0x80) clean[at++] = (char)c;
        else {
            memcpy(clean + at, "\xef\xbf\xbd", 3);
            at += 3;
        }
    }
    lp_sbuf_json_string(b, clean, at);
}

static void logprob_value(lp_sbuf *b, float v) {
    /* OpenAI's stand-in for an impossible token */
    lp_sbuf_printf(b, "%.7g", isfinite(v) ? (double)v : -9999.0);
}

static size_t piece_of(const lp_api_meta *m, int32_t tok, char *buf, size_t cap) {
    size_t n = m->piece ? m->piece(m->piece_user, tok, buf, cap) : 0;
    return n < cap ? n : cap;
}

/* {"token": ..., "logprob": ..., "bytes": [...]} without the closing brace. */
static void chat_token(lp_sbuf *b, const lp_api_meta *m, int32_t tok, float logprob) {
    char piece[256];
    size_t n = piece_of(m, tok, piece, sizeof piece);
    lp_sbuf_lit(b, "{\"token\":");
    token_string(b, piece, n);
    lp_sbuf_lit(b, ",\"logprob\":");
    logprob_value(b, logprob);
    lp_sbuf_lit(b, ",\"bytes\":[");
    for (size_t i = 0; i < n; i++) lp_sbuf_printf(b, "%s%u", i ? "," : "", (unsigned char)piece[i]);
    lp_sbuf_lit(b, "]");
}

/* chat: {"content": [{token, logprob, bytes, top_logprobs: [...]}], "refusal": null} */
static void chat_logprobs(lp_sbuf *b, const lp_api_meta *m, const lp_api_logprobs *lp) {
    lp_sbuf_lit(b, "{\"content\":[");
    for (int i = 0; i < lp->n; i++) {
        const lp_token_logprobs *t = &lp->tokens[i];
        if (i) lp_sbuf_lit(b, ",");
        chat_token(b, m, t->token, t->logprob);
        lp_sbuf_lit(b, ",\"top_logprobs\":[");
        for (int k = 0; k < t->n_top; k++) {
            if (k) lp_sbuf_lit(b, ",");
            chat_token(b, m, t->top_token[k], t->top_logprob[k]);
            lp_sbuf_lit(b, "}");
        }
        lp_sbuf_lit(b, "]}");
    }
    lp_sbuf_lit(b, "],\"refusal\":null}");
}

/* completions (legacy): {"tokens", "token_logprobs", "top_logprobs": [{text: logprob}], "text_offset"} */
static void completion_logprobs(lp_sbuf *b, const lp_api_meta *m, const lp_api_logprobs *lp) {
    char piece[256];
    lp_sbuf_lit(b, "{\"tokens\":[");
    for (int i = 0; i < lp->n; i++) {
        if (i) lp_sbuf_lit(b, ",");
        token_string(b, piece, piece_of(m, lp->tokens[i].token, piece, sizeof piece));
    }
    lp_sbuf_lit(b, "],\"token_logprobs\":[");
    for (int i = 0; i < lp->n; i++) {
        if (i) lp_sbuf_lit(b, ",");
        logprob_value(b, lp->tokens[i].logprob);
    }
    lp_sbuf_lit(b, "],\"top_logprobs\":[");
    for (int i = 0; i < lp->n; i++) {
        const lp_token_logprobs *t = &lp->tokens[i];
        if (i) lp_sbuf_lit(b, ",");
        lp_sbuf_lit(b, "{");
        int written = 0;
        for (int k = 0; k < t->n_top; k++) {
            /* a JSON object has one entry per text: two tokens with the
             * same text keep the likelier (the first) */
            size_t n = piece_of(m, t->top_token[k], piece, sizeof piece);
            bool dup = false;
            for (int j = 0; j < k && !dup; j++) {
                char other[256];
                size_t no = piece_of(m, t->top_token[j], other, sizeof other);
                dup = no == n && !memcmp(other, piece, n);
            }
            if (dup) continue;
            if (written++) lp_sbuf_lit(b, ",");
            token_string(b, piece, n);
            lp_sbuf_lit(b, ":");
            logprob_value(b, t->top_logprob[k]);
        }
        lp_sbuf_lit(b, "}");
    }
    lp_sbuf_lit(b, "],\"text_offset\":[");
    size_t offset = lp->text_offset;
    for (int i = 0; i < lp->n; i++) {
        lp_sbuf_printf(b, "%s%zu", i ? "," : "", offset);
        offset += piece_of(m, lp->tokens[i].token, piece, sizeof piece);
    }
    lp_sbuf_lit(b, "]}");
}

static void logprobs_field(lp_sbuf *b, const lp_api_meta *m, const lp_api_logprobs *lp) {
    lp_sbuf_lit(b, "\"logprobs\":");
    if (!m->logprobs || !lp) lp_sbuf_lit(b, "null");
    else if (m->kind == LP_API_CHAT) chat_logprobs(b, m, lp);
    else completion_logprobs(b, m, lp);
    lp_sbuf_lit(b, ",");
}

void lp_api_response(lp_sbuf *b, const lp_api_meta *m, const lp_api_choice *choices, int n) {
    bool chat = m->kind == LP_API_CHAT;
    meta_head(b, m, chat ? "chat.completion" : "text_completion");
    lp_sbuf_lit(b, ",\"choices\":[");
    int generated = 0;
    for (int i = 0; i < n; i++) {
        lp_sbuf_printf(b, "%s{\"index\":%d,", i ? "," : "", i);
        if (chat) {
            lp_sbuf_lit(b, "\"message\":{\"role\":\"assistant\",\"content\":");
            lp_sbuf_json_string(b, choices[i].text, choices[i].len);
            lp_sbuf_lit(b, "},");
        } else {
            lp_sbuf_lit(b, "\"text\":");
            lp_sbuf_json_string(b, choices[i].text, choices[i].len);
            lp_sbuf_lit(b, ",");
        }
        logprobs_field(b, m, &choices[i].logprobs);
        finish(b, choices[i].finish_reason);
        lp_sbuf_lit(b, "}");
        generated += choices[i].n_generated;
    }
    lp_sbuf_lit(b, "],");
    usage(b, m->prompt_tokens, generated);
    lp_sbuf_lit(b, "}");
}

void lp_api_chunk(lp_sbuf *b, const lp_api_meta *m, int index, bool role, const char *text, size_t len,
                  const char *finish_reason, const lp_api_logprobs *logprobs) {
    bool chat = m->kind == LP_API_CHAT;
    lp_sbuf_lit(b, "data: ");
    meta_head(b, m, chat ? "chat.completion.chunk" : "text_completion");
    lp_sbuf_printf(b, ",\"choices\":[{\"index\":%d,", index);
    if (chat) {
        lp_sbuf_lit(b, "\"delta\":{");
        if (role) lp_sbuf_lit(b, "\"role\":\"assistant\",");
        if (text || role) {
            lp_sbuf_lit(b, "\"content\":");
            lp_sbuf_json_string(b, text ? text : "", text ? len : 0);
        }
        lp_sbuf_lit(b, "},");
    } else {
        lp_sbuf_lit(b, "\"text\":");
        lp_sbuf_json_string(b, text ? text : "", text ? len : 0);
        lp_sbuf_lit(b, ",");
    }
    logprobs_field(b, m, logprobs);
    finish(b, finish_reason);
    lp_sbuf_lit(b, "}]}\n\n");
}

void lp_api_usage_chunk(lp_sbuf *b, const lp_api_meta *m, int completion_tokens) {
    lp_sbuf_lit(b, "data: ");
    meta_head(b, m, m->kind == LP_API_CHAT ? "chat.completion.chunk" : "text_completion");
    lp_sbuf_lit(b, ",\"choices\":[],");
    usage(b, m->prompt_tokens, completion_tokens);
    lp_sbuf_lit(b, "}\n\n");
}

void lp_api_done(lp_sbuf *b) { lp_sbuf_lit(b, "data: [DONE]\n\n"); }

size_t lp_api_utf8_whole(const char *s, size_t n) {
    size_t i = n;
    /* back over continuation bytes to the last lead byte */
    while (i > 0 && n - i < 4 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) i--;
    if (i == 0) return n; /* no lead byte: invalid anyway, send as is */
    unsigned char lead = (unsigned char)s[i - 1];
    size_t want = lead < 0x80 ? 1 : (lead & 0xE0) == 0xC0 ? 2 : (lead & 0xF0) == 0xE0 ? 3 : (lead & 0xF8) == 0xF0 ? 4 : 1;
    return n - (i - 1) >= want ? n : i - 1;
}

const char *lp_api_finish_reason(const char *stop_reason) {
    if (!stop_reason) return NULL;
    if (!strcmp(stop_reason, "length") || !strcmp(stop_reason, "context")) return "length";
    return "stop";
}
