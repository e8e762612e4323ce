/* The server's JSON string writer (src/server/api.c): escapes, and text
 * that is not well-formed UTF-8 (stray byte tokens of a model) written as
 * U+FFFD so every body stays valid UTF-8 and parses to the expected text. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "check.h"
#include "server/api.h"

static void expect(const char *in, size_t n, const char *want, const char *what) {
    lp_sbuf b = {0};
    lp_sbuf_json_string(&b, in, n);
    bool valid = !b.failed && lp_utf8_valid((const uint8_t *)b.data, b.len);
    CHECK_MSG(valid, "%s: the JSON is not valid UTF-8", what);
    char *doc = malloc(b.len + 1);
    memcpy(doc, b.data, b.len);
    doc[b.len] = 0;
    cJSON *j = cJSON_Parse(doc);
    CHECK_MSG(cJSON_IsString(j) && strcmp(j->valuestring, want) == 0, "%s: %s parsed to %s", what, doc,
              cJSON_IsString(j) ? j->valuestring : "(not a string)");
    cJSON_Delete(j);
    free(doc);
    lp_sbuf_free(&b);
}

int main(void) {
    expect("plain", 5, "plain", "ascii");
    expect("q\"b\\n\n\t\x01", 8, "q\"b\\n\n\t\x01", "escapes");
    expect("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", "2, 3 and 4 bytes");
    expect("a\xff" "b", 3, "a\xef\xbf\xbd" "b", "a stray byte");
    expect("x\xe2\x82", 3, "x\xef\xbf\xbd\xef\xbf\xbd", "a cut character at the end");
    expect("\xc0\xaf", 2, "\xef\xbf\xbd\xef\xbf\xbd", "an overlong slash");
    expect("\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", "a surrogate");
    expect("\x80\xc3\xa9", 3, "\xef\xbf\xbd\xc3\xa9", "a continuation byte, then a good one");
    expect("nul\0end", 7, "nul", "an embedded NUL (escaped; cJSON stops at it)");
    return check_summary("test_api");
}
