/* The OpenAI-compatible request and response bodies of `loraplex serve`:
 * parsing a /v1/chat/completions or /v1/completions body into one checked
 * request, and the JSON of responses, stream chunks and errors. No HTTP and
 * no model here, so the parser is fuzzed on its own (fuzz/fuzz_api.c). */
#ifndef LP_SERVER_API_H
#define LP_SERVER_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loraplex.h"

#define LP_API_MAX_STOP 4
#define LP_API_MAX_N 16
#define LP_API_MAX_MESSAGES 256
#define LP_API_MAX_PROMPT_TOKENS (1 << 20)
#define LP_API_MAX_LOGIT_BIAS 1024

typedef enum lp_api_kind { LP_API_CHAT, LP_API_COMPLETION } lp_api_kind;

typedef struct lp_api_request {
    lp_api_kind kind;
    const char *model;            /* "" when absent */
    /* chat */
    lp_message *messages;         /* [n_messages], strings inside the request */
    int n_messages;
    /* completion: text or tokens */
    const char *prompt;           /* NULL when tokens are given */
    int32_t *prompt_tokens;
    int n_prompt_tokens;

    int max_tokens;               /* -1: not given */
    int n;                        /* choices, 1..LP_API_MAX_N */
    const char *choice_models[LP_API_MAX_N]; /* loraplex extension: per-choice adapter
                                     names (CTG: N variants with their own adapters);
                                     NULL: the request's model */
    bool stream, include_usage;
    bool echo;
    lp_sampler_params sampling;   /* the CLI's defaults, overridden by the body */
    bool seed_set;
    const char *stop[LP_API_MAX_STOP];
    int n_stop;
    int lora_id;                  /* llama.cpp's lora: [{"id": i, "scale": 1}]; -1: none */
    lp_logit_bias *logit_bias;    /* [n_logit_bias] owned; sampling.logit_bias points here */
    int n_logit_bias;
    bool logprobs;                /* chat: logprobs true; completions: logprobs N given */
    int top_logprobs;             /* chat: top_logprobs; completions: logprobs N */
    int speculate;                /* loraplex extension "speculate": true/false; -1: not
                                     given (the server's --speculate default) */

    /* ownership */
    void *root;                   /* the parsed cJSON tree the strings live in */
    char **owned;                 /* joined text parts of messages */
    int n_owned;
} lp_api_request;

/* Parses and checks a body; on failure returns -1 with a message for a 400
 * response in msg. Unknown fields are ignored. */
int lp_api_parse(const char *body, size_t len, lp_api_kind kind, lp_api_request *out, char *msg,
                 size_t cap);
void lp_api_request_free(lp_api_request *r);

/* llama.cpp's POST /tokenize {"content", "add_special"} and /detokenize
 * {"tokens": [...]}: one of the two (content NULL for detokenize). */
typedef struct lp_api_tokens_request {
    const char *content;
    bool add_special;
    int32_t *tokens;              /* [n_tokens] owned */
    int n_tokens;
    void *root;
} lp_api_tokens_request;

int lp_api_parse_tokens(const char *body, size_t len, bool detokenize, lp_api_tokens_request *out, char *msg,
                        size_t cap);
void lp_api_tokens_request_free(lp_api_tokens_request *r);

/* vLLM's POST /v1/load_lora_adapter {"lora_name", "lora_path"} and
 * /v1/unload_lora_adapter {"lora_name"} (path NULL). A name is 1..127 of
 * [A-Za-z0-9._-], not "." or ".."; a path is a non-empty string. */
typedef struct lp_api_lora_request {
    const char *name, *path;
    void *root;
} lp_api_lora_request;

bool lp_api_name_ok(const char *name);
int lp_api_parse_lora(const char *body, size_t len, bool load, lp_api_lora_request *out, char *msg, size_t cap);
void lp_api_lora_request_free(lp_api_lora_request *r);

/* A growing string (for response bodies and stream chunks). */
typedef struct lp_sbuf {
    char *data;
    size_t len, cap;
    bool failed;                  /* out of memory: the contents are incomplete */
} lp_sbuf;

void lp_sbuf_add(lp_sbuf *b, const char *s, size_t n);
/* A string literal, its length counted by the compiler. */
#define lp_sbuf_lit(b, lit) lp_sbuf_add((b), "" lit, sizeof(lit) - 1)
void lp_sbuf_printf(lp_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s as a JSON string literal (quotes included; s is valid UTF-8). */
void lp_sbuf_json_string(lp_sbuf *b, const char *s, size_t n);
void lp_sbuf_free(lp_sbuf *b);

/* {"error": {"message": ..., "type": ..., "param": null, "code": null}} */
void lp_api_error_body(lp_sbuf *b, const char *message, const char *type);

/* The text of a token (the model's tokenizer): bytes written, at most cap. */
typedef size_t (*lp_api_piece_fn)(const void *user, int32_t token, char *buf, size_t cap);

/* Log-probabilities of a run of generated tokens, for a response or chunk. */
typedef struct lp_api_logprobs {
    const lp_token_logprobs *tokens;
    int n;
    size_t text_offset;           /* completions: the first token's offset in the text */
} lp_api_logprobs;

/* One finished choice of a response. */
typedef struct lp_api_choice {
    const char *text;
    size_t len;
    const char *finish_reason;    /* "stop", "length", or NULL while streaming */
    int n_generated;
    lp_api_logprobs logprobs;     /* with meta.logprobs */
} lp_api_choice;

typedef struct lp_api_meta {
    lp_api_kind kind;
    const char *id;               /* "chatcmpl-7" / "cmpl-7" */
    const char *model;
    int64_t created;              /* unix seconds */
    int prompt_tokens;
    bool logprobs;                /* responses carry log-probabilities ... */
    lp_api_piece_fn piece;        /* ... with token texts from this */
    const void *piece_user;
} lp_api_meta;

/* The whole (non-streamed) response. */
void lp_api_response(lp_sbuf *b, const lp_api_meta *m, const lp_api_choice *choices, int n);
/* One server-sent event "data: {...}\n\n" for choice `index`: the role
 * (chat, first chunk), a piece of text, or the end with its reason. */
void lp_api_chunk(lp_sbuf *b, const lp_api_meta *m, int index, bool role, const char *text, size_t len,
                  const char *finish_reason, const lp_api_logprobs *logprobs);
/* The usage chunk (stream_options.include_usage) and "data: [DONE]\n\n". */
void lp_api_usage_chunk(lp_sbuf *b, const lp_api_meta *m, int completion_tokens);
void lp_api_done(lp_sbuf *b);

/* Bytes of s[0..n) that end on a whole UTF-8 character (a streamed piece
 * may end inside one; the rest waits for the next piece). */
size_t lp_api_utf8_whole(const char *s, size_t n);

/* The engine's stop reason as OpenAI's finish_reason. */
const char *lp_api_finish_reason(const char *stop_reason);

#endif
