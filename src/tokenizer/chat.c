/* Chat templates: the four prompt formats we render by hand (no Jinja), and
 * detection of which one a tokenizer wants. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

const char *lp_chat_format_name(lp_chat_format f) {
    switch (f) {
    case LP_CHAT_LLAMA3: return "llama3";
    case LP_CHAT_CHATML: return "chatml";
    case LP_CHAT_LLAMA2: return "llama2";
    case LP_CHAT_MISTRAL: return "mistral";
    default: return "none";
    }
}

static bool has_token(const lp_tokenizer *t, const char *text) {
    return tok_lookup(t, text, strlen(text)) >= 0;
}

lp_chat_format lp_tokenizer_chat_format(const lp_tokenizer *t) {
    const char *tmpl = t->chat_template;
    if (tmpl) {
        if (strstr(tmpl, "<|start_header_id|>")) return LP_CHAT_LLAMA3;
        if (strstr(tmpl, "<|im_start|>")) return LP_CHAT_CHATML;
        if (strstr(tmpl, "[INST]")) return strstr(tmpl, "<<SYS>>") ? LP_CHAT_LLAMA2 : LP_CHAT_MISTRAL;
    }
    /* no (recognised) template: guess from the special tokens */
    if (has_token(t, "<|start_header_id|>")) return LP_CHAT_LLAMA3;
    if (has_token(t, "<|im_start|>")) return LP_CHAT_CHATML;
    if (t->kind == LP_TOK_SPM) return LP_CHAT_LLAMA2;
    return LP_CHAT_NONE;
}

/* ---- a growable string ----------------------------------------------------- */

typedef struct sbuf {
    char *s;
    size_t len, cap;
    bool oom;
} sbuf;

static void put_n(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

static void put(sbuf *b, const char *s) { put_n(b, s, strlen(s)); }

static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Content with surrounding whitespace removed (the official templates
 * trim messages with Jinja's `| trim` / `.strip()`). */
static void put_trimmed(sbuf *b, const char *s) {
    size_t n = strlen(s);
    while (n && is_space(*s)) s++, n--;
    while (n && is_space(s[n - 1])) n--;
    put_n(b, s, n);
}

/* ---- formats --------------------------------------------------------------- */

static void render_llama3(sbuf *b, const lp_chat_message *m, int n, bool gen) {
    for (int i = 0; i < n; i++) {
        put(b, "<|start_header_id|>");
        put(b, m[i].role);
        put(b, "<|end_header_id|>\n\n");
        put_trimmed(b, m[i].content);
        put(b, "<|eot_id|>");
    }
    if (gen) put(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void render_chatml(sbuf *b, const lp_chat_message *m, int n, bool gen) {
    for (int i = 0; i < n; i++) {
        put(b, "<|im_start|>");
        put(b, m[i].role);
        put(b, "\n");
        put(b, m[i].content);
        put(b, "<|im_end|>\n");
    }
    if (gen) put(b, "<|im_start|>assistant\n");
}

/* Llama 2 and Mistral: [INST] user [/INST] answer turns; the system prompt
 * is folded into the next user message. Llama 2 wraps it in <<SYS>> and
 * surrounds answers with spaces; every turn after the first starts with
 * "<s>" for Llama 2 (the first BOS comes from encode). */
static int render_inst(sbuf *b, const lp_chat_message *m, int n, bool llama2,
                       lp_error *err) {
    const char *system = NULL;
    bool first_turn = true;
    for (int i = 0; i < n; i++) {
        const char *role = m[i].role;
        if (strcmp(role, "system") == 0) {
            system = m[i].content;
        } else if (strcmp(role, "user") == 0) {
            if (llama2 && !first_turn) put(b, "<s>");
            put(b, "[INST] ");
            if (system) {
                if (llama2) {
                    put(b, "<<SYS>>\n");
                    put_trimmed(b, system);
                    put(b, "\n<</SYS>>\n\n");
                } else {
                    put_trimmed(b, system);
                    put(b, "\n\n");
                }
                system = NULL;
            }
            put_trimmed(b, m[i].content);
            put(b, " [/INST]");
            first_turn = false;
        } else if (strcmp(role, "assistant") == 0) {
            if (llama2) put(b, " ");
            put_trimmed(b, m[i].content);
            put(b, llama2 ? " </s>" : "</s>");
            first_turn = false;
        } else {
            return lp_fail(err, "chat: role '%.64s' is not supported by the %s format", role,
                           llama2 ? "llama2" : "mistral");
        }
    }
    return 0;
}

char *lp_chat_render(lp_chat_format f, const lp_chat_message *msgs, int n,
                     bool add_generation_prompt, lp_error *err) {
    if (n < 0 || (n > 0 && !msgs)) {
        lp_fail(err, "chat: invalid message list");
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content) {
            lp_fail(err, "chat: message %d has no role or content", i);
            return NULL;
        }
    }
    sbuf b = {0};
    put(&b, ""); /* an empty prompt is still a string */
    switch (f) {
    case LP_CHAT_LLAMA3:
        render_llama3(&b, msgs, n, add_generation_prompt);
        break;
    case LP_CHAT_CHATML:
        render_chatml(&b, msgs, n, add_generation_prompt);
        break;
    case LP_CHAT_LLAMA2:
    case LP_CHAT_MISTRAL:
        if (render_inst(&b, msgs, n, f == LP_CHAT_LLAMA2, err) != 0) {
            free(b.s);
            return NULL;
        }
        break;
    default:
        free(b.s);
        lp_fail(err, "chat: no chat format (the model has no known chat template)");
        return NULL;
    }
    if (b.oom) {
        free(b.s);
        lp_error_set(err, LP_ERR_NOMEM, "chat: out of memory");
        return NULL;
    }
    return b.s;
}
