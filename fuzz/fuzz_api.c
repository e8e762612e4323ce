/* Fuzzes the server's request parser (src/server/api.c): the same bytes as a
 * chat and as a completions body; what parses is also rendered back as a
 * response and a stream chunk, so the JSON writers see every string. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

static void render(const lp_api_request *r) {
    lp_api_meta m = {.kind = r->kind, .id = "x-1", .model = r->model, .created = 1, .prompt_tokens = 3};
    lp_api_choice c[LP_API_MAX_N];
    for (int i = 0; i < r->n; i++) {
        const char *t = r->kind == LP_API_CHAT ? r->messages[0].content : r->prompt ? r->prompt : "";
        c[i] = (lp_api_choice){.text = t, .len = strlen(t), .finish_reason = "stop", .n_generated = 1};
    }
    lp_sbuf b = {0};
    lp_api_response(&b, &m, c, r->n);
    lp_api_chunk(&b, &m, 0, true, c[0].text, lp_api_utf8_whole(c[0].text, c[0].len), NULL);
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
    lp_sbuf e = {0};
    lp_api_error_body(&e, msg, "invalid_request_error");
    lp_sbuf_free(&e);
    return 0;
}
