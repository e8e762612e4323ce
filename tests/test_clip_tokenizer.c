/* The CLIP tokenizer (src/tokenizer/clip.c) on the real merge list
 * (../shared/models/sd/clip-bpe-merges.txt) against ids that Hugging Face's
 * pure-JS tokenizer produced from a tokenizer.json built from the same list
 * (tests/data/clip_vectors.tsv; tests/data/clip/README.md says how), and
 * the merge-list parser's errors on small hand-written lists. A missing
 * data file is a failure, not a skip. */
#include "check.h"
#include "tokenizer/clip.h"

#include <stdlib.h>
#include <string.h>

#define MERGES LP_SHARED_MODELS "/sd/clip-bpe-merges.txt"
#define VECTORS LP_SOURCE_DIR "/tests/data/clip_vectors.tsv"

/* A JSON string literal at s (after its opening quote) into out; returns
 * the byte after the closing quote, or NULL. */
static const char *json_string(const char *s, char *out, size_t *n) {
    size_t o = 0;
    for (; *s && *s != '"'; s++) {
        if (*s != '\\') {
            out[o++] = *s;
            continue;
        }
        s++;
        switch (*s) {
        case 'n': out[o++] = '\n'; break;
        case 't': out[o++] = '\t'; break;
        case 'r': out[o++] = '\r'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'u': {
            unsigned c = (unsigned)strtoul((char[5]){s[1], s[2], s[3], s[4], 0}, NULL, 16);
            if (c >= 0x80) return NULL; /* JSON.stringify escapes only control characters */
            out[o++] = (char)c;
            s += 4;
            break;
        }
        default: out[o++] = *s; break; /* \" \\ \/ */
        }
    }
    *n = o;
    return *s == '"' ? s + 1 : NULL;
}

static void test_vectors(const lp_clip_tokenizer *t) {
    FILE *f = fopen(VECTORS, "r");
    CHECK_MSG(f != NULL, "missing %s", VECTORS);
    if (!f) return;
    char line[8192], text[4096];
    int cases = 0, truncated = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] != '"') continue;
        size_t n;
        const char *p = json_string(line + 1, text, &n);
        CHECK(p && *p == '\t');
        if (!p) continue;
        char *end;
        long full = strtol(p + 1, &end, 10);
        int32_t want[LP_CLIP_CONTEXT], got[LP_CLIP_CONTEXT];
        int k = 0;
        for (p = end; k < LP_CLIP_CONTEXT; k++) {
            want[k] = (int32_t)strtol(p, &end, 10);
            if (end == p) break;
            p = end;
        }
        CHECK(k == LP_CLIP_CONTEXT);
        int n_tok = -1;
        lp_error err = {0};
        CHECK(lp_clip_encode(t, text, n, LP_CLIP_EOS, got, LP_CLIP_CONTEXT, &n_tok, &err) == 0);
        CHECK_MSG(n_tok == full, "\"%.*s\": %d tokens, want %ld", (int)n, text, n_tok, full);
        int first = -1;
        for (int i = 0; i < LP_CLIP_CONTEXT && first < 0; i++)
            if (got[i] != want[i]) first = i;
        CHECK_MSG(first < 0, "\"%.*s\": id %d is %d, want %d", (int)n, text, first, first < 0 ? 0 : got[first],
                  first < 0 ? 0 : want[first]);
        cases++;
        truncated += full > LP_CLIP_CONTEXT - 2;
    }
    fclose(f);
    CHECK_MSG(cases >= 30, "%d vectors", cases);
    CHECK(truncated >= 1); /* the set covers the cut to 75 tokens */
}

static void test_real_list(void) {
    lp_error err = {0};
    lp_clip_tokenizer *t = lp_clip_tokenizer_load(MERGES, &err);
    CHECK_MSG(t != NULL, "%s", err.message);
    if (!t) return;
    CHECK(lp_clip_vocab_size(t) == 49408);
    CHECK(lp_clip_bos(t) == LP_CLIP_BOS && lp_clip_eos(t) == LP_CLIP_EOS);
    char buf[64];
    CHECK(lp_clip_token_text(t, 320, buf, sizeof buf) == 2 && strcmp(buf, "a ") == 0);
    CHECK(lp_clip_token_text(t, 2368, buf, sizeof buf) == 4 && strcmp(buf, "cat ") == 0);
    CHECK(lp_clip_token_text(t, 0, buf, sizeof buf) == 1 && strcmp(buf, "!") == 0);
    CHECK(lp_clip_token_text(t, 49408, buf, sizeof buf) == -1);
    test_vectors(t);

    /* pad id, a short context, the size limit */
    int32_t ids[8];
    int n = 0;
    CHECK(lp_clip_encode(t, "a photo of a cat", 16, 0, ids, 8, &n, &err) == 0);
    int32_t want[8] = {49406, 320, 1125, 539, 320, 2368, 49407, 0};
    CHECK(n == 5 && memcmp(ids, want, sizeof want) == 0);
    CHECK(lp_clip_encode(t, "a photo of a cat", 16, 0, ids, 4, &n, &err) == 0);
    CHECK(n == 5 && ids[1] == 320 && ids[2] == 1125 && ids[3] == 49407);
    CHECK(lp_clip_encode(t, "x", 1, 0, ids, 1, &n, &err) == -1);
    /* invalid UTF-8 is dropped like whitespace */
    CHECK(lp_clip_encode(t, "cat\xff\xfe" "cat", 8, 0, ids, 8, &n, &err) == 0);
    CHECK(n == 2 && ids[1] == 2368 && ids[2] == 2368);
    lp_clip_tokenizer_free(t);
}

static void test_small_lists(void) {
    lp_error err = {0};
    /* "c a" does not exist yet when "ca t</w>" needs it */
    const char *bad_order = "#version: 0.2\nca t</w>\nc a\n";
    CHECK(lp_clip_tokenizer_parse(bad_order, strlen(bad_order), "order.txt", &err) == NULL);
    CHECK(strstr(err.message, "order.txt: line 2") != NULL && strstr(err.message, "'ca'") != NULL);
    const char *repeated = "c a\nc a\n";
    CHECK(lp_clip_tokenizer_parse(repeated, strlen(repeated), "rep.txt", &err) == NULL);
    CHECK(strstr(err.message, "rep.txt: line 2") != NULL);
    const char *malformed = "c a\nca t </w>\n";
    CHECK(lp_clip_tokenizer_parse(malformed, strlen(malformed), "bad.txt", &err) == NULL);
    CHECK(strstr(err.message, "bad.txt: line 2") != NULL);
    const char *lone = "c\n";
    CHECK(lp_clip_tokenizer_parse(lone, strlen(lone), "lone.txt", &err) == NULL);

    /* three merges: ids 512.. in order, specials after them */
    const char *ok = "#version: 0.2\nc a\nca t</w>\nu t</w>\n";
    lp_clip_tokenizer *t = lp_clip_tokenizer_parse(ok, strlen(ok), "ok.txt", &err);
    CHECK_MSG(t != NULL, "%s", err.message);
    if (!t) return;
    CHECK(lp_clip_vocab_size(t) == 512 + 3 + 2 && lp_clip_bos(t) == 515);
    int32_t ids[6];
    int n;
    CHECK(lp_clip_encode(t, "CAT cut", 7, -1, ids, 6, &n, &err) == 0);
    /* "cat" -> c a t</w> -> ca t</w> -> cat</w> (513); "cut" -> c u t</w> -> c ut</w> (514) */
    char buf[16];
    CHECK(n == 3 && ids[1] == 513 && lp_clip_token_text(t, 513, buf, sizeof buf) == 4 && strcmp(buf, "cat ") == 0);
    CHECK(ids[2] == 'c' - 33 && ids[3] == 514 && ids[4] == 516 && ids[5] == -1);
    lp_clip_tokenizer_free(t);
}

int main(void) {
    test_real_list();
    test_small_lists();
    return check_summary("test_clip_tokenizer");
}
