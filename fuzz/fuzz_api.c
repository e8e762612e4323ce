/* Fuzzes the server's request parser (src/server/api.c): the same bytes as a
 * chat and as a completions body; what parses is also rendered back as a
 * response and a stream chunk, so the JSON writers see every string. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

/* A stand-in tokenizer: a token's text is bytes of its id, so some pieces
 * are split UTF-8 and some repeat (duplicate keys in completions' tops). */
static size_t fake_piece(const void *user, int32_t token, char *buf, size_t cap) {
    (void)user;
    const char bytes[] = {(char)(token & 0xff), (char)0xc3, (char)(token >> 8), '"'};
    size_t n = (size_t)(token % 5);
    if (n > cap) n = cap;
    memcpy(buf, bytes, n < sizeof bytes ? n : sizeof bytes);
    return n < sizeof bytes ? n : sizeof bytes;
}

static void render(const lp_api_request *r) {
    lp_api_meta m = {.kind = r->kind, .id = "x-1", .model = r->model, .created = 1, .prompt_tokens = 3,
                     .logprobs = r->logprobs, .piece = fake_piece};
    /* log-probabilities for the bias's tokens, the top lists of the size asked */
    lp_token_logprobs lps[8];
    int n_lps = r->n_logit_bias < 8 ? r->n_logit_bias : 8;
    for (int i = 0; i < n_lps; i++) {
        lps[i] = (lp_token_logprobs){.token = r->logit_bias[i].token, .logprob = -r->logit_bias[i].bias,
                                     .n_top = r->top_logprobs};
        for (int k = 0; k < r->top_logprobs; k++) {
            lps[i].top_token[k] = r->logit_bias[(i + k) % r->n_logit_bias].token;
            lps[i].top_logprob[k] = (float)-k;
        }
    }
    lp_api_logprobs lp = {.tokens = lps, .n = n_lps, .text_offset = 2};
    lp_api_choice c[LP_API_MAX_N];
    for (int i = 0; i < r->n; i++) {
        const char *t = r->kind == LP_API_CHAT ? r->messages[0].content : r->prompt ? r->prompt : "";
        c[i] = (lp_api_choice){.text = t, .len = strlen(t), .finish_reason = "stop", .n_generated = 1, .logprobs = lp};
    }
    lp_sbuf b = {0};
    lp_api_response(&b, &m, c, r->n);
    lp_api_chunk(&b, &m, 0, true, c[0].text, lp_api_utf8_whole(c[0].text, c[0].len), NULL, &lp);
    lp_api_usage_chunk(&b, &m, 1);
    lp_api_done(&b);
    lp_sbuf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    char msg[512];
    for (int k = 0; k < 2; k++) {
        lp_api_request r;
        if (lp_api_parse((const char *)data, size, k ? LP_API_COMPLETION : LP_API_CHAT, &r, msg, sizeof msg) == 0) {
            render(&r);
            lp_api_request_free(&r);
        }
    }
    for (int k = 0; k < 2; k++) {
        lp_api_tokens_request t;
        if (lp_api_parse_tokens((const char *)data, size, k, &t, msg, sizeof msg) == 0) lp_api_tokens_request_free(&t);
    }
    for (int k = 0; k < 2; k++) {
        lp_api_lora_request l;
        if (lp_api_parse_lora((const char *)data, size, k, &l, msg, sizeof msg) == 0) lp_api_lora_request_free(&l);
    }
    lp_sbuf e = {0};
    lp_api_error_body(&e, msg, "invalid_request_error");
    lp_sbuf_free(&e);
    return 0;
}
