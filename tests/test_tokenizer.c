/* Tokenizer tests: llama.cpp's test vectors for four real vocabularies,
 * round trips, the tiny models' tokenizers, llama2.c tokenizer.bin vs GGUF,
 * special tokens, Hugging Face tokenizer.json, malformed inputs, speed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "tokenizer/tokenizer.h"

#define ARCH LP_SHARED_MODELS "/arch/"

static char *slurp(const char *path, size_t *len) {
    lp_error err;
    char *s = NULL;
    if (lp_read_file(path, &s, len, (size_t)64 << 20, &err) != 0) {
        fprintf(stderr, "%s\n", err.message);
        return NULL;
    }
    return s;
}

static lp_tokenizer *load_gguf(const char *path, double *seconds) {
    lp_error err;
    lp_gguf *g = lp_gguf_open(path, &err);
    if (!g) {
        fprintf(stderr, "%s\n", err.message);
        return NULL;
    }
    double t0 = lp_now_seconds();
    lp_tokenizer *t = lp_tokenizer_from_gguf(g, &err);
    if (seconds) *seconds = lp_now_seconds() - t0;
    if (!t) fprintf(stderr, "%s\n", err.message);
    lp_gguf_close(g);
    return t;
}

/* Encodes into a malloc'd array (retrying with the size encode asks for). */
static int32_t *encode(const lp_tokenizer *t, const char *s, size_t len, bool bos,
                       bool special, int *n) {
    lp_error err;
    int cap = 8;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    int got = lp_tokenizer_encode(t, s, len, bos, special, ids, cap, &err);
    if (got > cap) {
        cap = got;
        ids = realloc(ids, sizeof(int32_t) * (size_t)cap);
        got = lp_tokenizer_encode(t, s, len, bos, special, ids, cap, &err);
    }
    if (got < 0) fprintf(stderr, "encode: %s\n", err.message);
    *n = got;
    return ids;
}

static char *decode(const lp_tokenizer *t, const int32_t *ids, int n, bool strip) {
    size_t need = lp_tokenizer_decode(t, ids, n, strip, NULL, 0);
    char *s = malloc(need + 1);
    size_t got = lp_tokenizer_decode(t, ids, n, strip, s, need + 1);
    if (got != need) s[0] = '\0';
    return s;
}

static void print_ids(const char *what, const int32_t *ids, int n) {
    fprintf(stderr, "  %s:", what);
    for (int i = 0; i < n; i++) fprintf(stderr, " %d", (int)ids[i]);
    fputc('\n', stderr);
}

/* ---- llama.cpp test vectors -------------------------------------------- */

static const char SEP[] = "\n__ggml_vocab_test__\n";

/* Runs every vector of vocab `name` against tokenizer t; returns passes. */
static int run_vectors(const lp_tokenizer *t, const char *name, int *n_tests, int *n_round) {
    char path[512];
    size_t inp_len, out_len;
    snprintf(path, sizeof path, ARCH "ggml-vocab-%s.gguf.inp", name);
    char *inp = slurp(path, &inp_len);
    snprintf(path, sizeof path, ARCH "ggml-vocab-%s.gguf.out", name);
    char *out = slurp(path, &out_len);
    if (!inp || !out) {
        free(inp);
        free(out);
        *n_tests = -1;
        return 0;
    }
    int pass = 0, tests = 0, round = 0;
    char *s = inp, *line = out;
    bool spm = lp_tokenizer_kind(t) == LP_TOK_SPM;
    for (;;) {
        char *end = strstr(s, SEP);
        if (!end) break;
        char *nl = strchr(line, '\n');
        if (!nl) break;
        *nl = '\0';
        /* expected ids */
        int32_t want[1024];
        int n_want = 0;
        for (char *p = line; *p && n_want < 1024;) {
            char *q;
            long v = strtol(p, &q, 10);
            if (q == p) break;
            want[n_want++] = (int32_t)v;
            p = q;
        }
        int n;
        int32_t *ids = encode(t, s, (size_t)(end - s), false, false, &n);
        bool ok = n == n_want && memcmp(ids, want, sizeof(int32_t) * (size_t)n) == 0;
        if (ok) {
            pass++;
        } else {
            fprintf(stderr, "%s: test %d mismatch for \"%.*s\"\n", name, tests, (int)(end - s), s);
            print_ids("want", want, n_want);
            print_ids("got ", ids, n);
        }
        char *back = decode(t, ids, n, spm);
        if (strlen(back) == (size_t)(end - s) && memcmp(back, s, (size_t)(end - s)) == 0)
            round++;
        else
            fprintf(stderr, "%s: test %d round trip gave \"%s\"\n", name, tests, back);
        free(back);
        free(ids);
        tests++;
        s = end + strlen(SEP);
        line = nl + 1;
    }
    free(inp);
    free(out);
    *n_tests = tests;
    *n_round = round;
    return pass;
}

static void test_vectors(void) {
    static const char *const vocabs[] = {"llama-bpe", "qwen2", "llama-spm", "gpt-2"};
    for (size_t i = 0; i < 4; i++) {
        char path[512];
        snprintf(path, sizeof path, ARCH "ggml-vocab-%s.gguf", vocabs[i]);
        double secs = 0;
        lp_tokenizer *t = load_gguf(path, &secs);
        CHECK_MSG(t != NULL, "%s", path);
        if (!t) continue;
        int tests = 0, round = 0;
        int pass = run_vectors(t, vocabs[i], &tests, &round);
        printf("vocab %-10s: %d/%d vectors pass, %d/%d round trips, loaded in %.3f s\n",
               vocabs[i], pass, tests, round, tests, secs);
        CHECK_MSG(tests == 46, "%s: %d tests", vocabs[i], tests);
        CHECK_MSG(pass == tests, "%s: %d of %d pass", vocabs[i], pass, tests);
        CHECK_MSG(round == tests, "%s: %d of %d round trips", vocabs[i], round, tests);
        lp_tokenizer_free(t);
    }
}

/* ---- vocabulary facts ---------------------------------------------------- */

static void test_tiny_models(void) {
    lp_tokenizer *t = load_gguf(ARCH "llama3-tiny-random.gguf", NULL);
    CHECK(t != NULL);
    if (t) {
        CHECK(lp_tokenizer_kind(t) == LP_TOK_BPE);
        CHECK(lp_tokenizer_pretok(t) == LP_PRETOK_LLAMA3);
        CHECK(lp_tokenizer_n_vocab(t) == 128256);
        CHECK(lp_tokenizer_bos(t) == 128000 && lp_tokenizer_eos(t) == 128001);
        CHECK(lp_tokenizer_add_bos(t));
        CHECK(lp_tokenizer_is_eog(t, 128001) && lp_tokenizer_is_eog(t, 128009));
        CHECK(lp_tokenizer_is_eog(t, 128008)); /* <|eom_id|> */
        CHECK(!lp_tokenizer_is_eog(t, 128006) && !lp_tokenizer_is_eog(t, 9906));
        CHECK(lp_tokenizer_lookup(t, "<|eot_id|>", 10) == 128009);
        int n;
        int32_t *ids = encode(t, "Hello world", 11, true, false, &n);
        CHECK(n == 3 && ids[0] == 128000 && ids[1] == 9906 && ids[2] == 1917);
        free(ids);
        lp_tokenizer_free(t);
    }
    t = load_gguf(ARCH "qwen2-tiny-random.gguf", NULL);
    CHECK(t != NULL);
    if (t) {
        CHECK(lp_tokenizer_kind(t) == LP_TOK_BPE && lp_tokenizer_pretok(t) == LP_PRETOK_QWEN2);
        CHECK(lp_tokenizer_bos(t) == 151643 && lp_tokenizer_eos(t) == 151645);
        CHECK(!lp_tokenizer_add_bos(t));
        CHECK(lp_tokenizer_is_eog(t, 151645) && lp_tokenizer_is_eog(t, 151643));
        CHECK(!lp_tokenizer_is_eog(t, 151644));
        lp_tokenizer_free(t);
    }
    t = load_gguf(ARCH "mistral-spm-tiny-random.gguf", NULL);
    CHECK(t != NULL);
    if (t) {
        CHECK(lp_tokenizer_kind(t) == LP_TOK_SPM && lp_tokenizer_pretok(t) == LP_PRETOK_NONE);
        CHECK(lp_tokenizer_bos(t) == 1 && lp_tokenizer_eos(t) == 2 && lp_tokenizer_add_bos(t));
        CHECK(lp_tokenizer_is_eog(t, 2) && !lp_tokenizer_is_eog(t, 1));
        size_t len;
        const char *s = lp_tokenizer_token_text(t, 15043, &len);
        CHECK(s && len == 8 && memcmp(s, "\xe2\x96\x81Hello", 8) == 0);
        lp_tokenizer_free(t);
    }
}

/* ---- llama2.c tokenizer.bin ------------------------------------------------- */

static void test_llama2c(void) {
    lp_error err;
    lp_tokenizer *a = lp_tokenizer_from_llama2c(LP_SHARED_MODELS "/tok512.bin", 512, &err);
    CHECK_MSG(a != NULL, "%s", err.message);
    lp_tokenizer *b = load_gguf(LP_SHARED_MODELS "/stories260K.gguf", NULL);
    CHECK(b != NULL);
    if (!a || !b) {
        lp_tokenizer_free(a);
        lp_tokenizer_free(b);
        return;
    }
    CHECK(lp_tokenizer_kind(a) == LP_TOK_SPM && lp_tokenizer_n_vocab(a) == 512);
    CHECK(lp_tokenizer_bos(a) == 1 && lp_tokenizer_eos(a) == 2 && lp_tokenizer_add_bos(a));
    /* the same vocabulary once the export's spaces become ▁ again */
    for (int32_t id = 0; id < 512; id++) {
        size_t la, lb;
        const char *sa = lp_tokenizer_token_text(a, id, &la);
        const char *sb = lp_tokenizer_token_text(b, id, &lb);
        CHECK_MSG(la == lb && memcmp(sa, sb, la) == 0, "token %d: '%s' vs '%s'", (int)id, sa, sb);
    }
    const char *prompt = "Once upon a time";
    int na, nb;
    int32_t *ia = encode(a, prompt, strlen(prompt), true, false, &na);
    int32_t *ib = encode(b, prompt, strlen(prompt), true, false, &nb);
    /* ids from llama2.c's own encoder (run.c) on tok512.bin */
    static const int32_t want[] = {1, 403, 407, 261, 378};
    CHECK(na == 5 && memcmp(ia, want, sizeof want) == 0);
    CHECK(nb == 5 && memcmp(ib, want, sizeof want) == 0);
    char *back = decode(a, ia, na, true);
    CHECK_MSG(strcmp(back, prompt) == 0, "'%s'", back);
    free(back);

    /* the reference continuation survives a round trip through both */
    const char *story = "Once upon a time, there was a little girl named Lily. She loved to play "
                        "outside in the park.\nLily's mom said, \"Lily, let's go to the park.\"";
    free(ia);
    free(ib);
    ia = encode(a, story, strlen(story), true, false, &na);
    ib = encode(b, story, strlen(story), true, false, &nb);
    CHECK(na == nb && na > 10 && memcmp(ia, ib, sizeof(int32_t) * (size_t)na) == 0);
    back = decode(b, ib, nb, true);
    CHECK_MSG(strcmp(back, story) == 0, "'%s'", back);
    free(back);
    /* token pieces: the prefix space renders as a space */
    char piece[16];
    size_t pl = lp_tokenizer_decode_token(a, 403, false, piece, sizeof piece);
    CHECK(pl == 5 && memcmp(piece, " Once", 5) == 0);
    CHECK(lp_tokenizer_decode_token(a, 1, false, piece, sizeof piece) == 0);
    CHECK(lp_tokenizer_decode_token(a, 1, true, piece, sizeof piece) == 3);
    CHECK(lp_tokenizer_decode_token(a, 3 + '\n', false, piece, sizeof piece) == 1 && piece[0] == '\n');
    free(ia);
    free(ib);
    lp_tokenizer_free(a);
    lp_tokenizer_free(b);
}

static void test_llama2c_malformed(void) {
    size_t len;
    char *good = slurp(LP_SHARED_MODELS "/tok512.bin", &len);
    CHECK(good != NULL);
    if (!good) return;
    lp_error err;
    lp_tokenizer *t;
    /* truncated anywhere */
    size_t cuts[] = {0, 3, 4, 7, 11, 100, len / 2, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        t = lp_tokenizer_from_llama2c_memory(good, cuts[i], 512, "cut", &err);
        CHECK_MSG(t == NULL, "cut at %zu accepted", cuts[i]);
        lp_tokenizer_free(t);
    }
    char *bad = malloc(len);
    /* negative and huge lengths of the first token; negative max length */
    int32_t vals[] = {-1, -2147483647 - 1, 2147483647, (int32_t)len};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        memcpy(bad, good, len);
        memcpy(bad + 8, &vals[i], 4);
        t = lp_tokenizer_from_llama2c_memory(bad, len, 512, "bad", &err);
        CHECK_MSG(t == NULL, "length %d accepted", (int)vals[i]);
        if (!t) CHECK(strstr(err.message, "bad") != NULL);
        lp_tokenizer_free(t);
    }
    memcpy(bad, good, len);
    int32_t neg = -5;
    memcpy(bad, &neg, 4);
    t = lp_tokenizer_from_llama2c_memory(bad, len, 512, "bad", &err);
    CHECK(t == NULL);
    lp_tokenizer_free(t);
    /* vocabulary sizes the file cannot hold */
    int32_t sizes[] = {0, -1, 513, 1 << 30};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        t = lp_tokenizer_from_llama2c_memory(good, len, sizes[i], "bad", &err);
        CHECK_MSG(t == NULL, "vocab %d accepted", (int)sizes[i]);
        lp_tokenizer_free(t);
    }
    /* a smaller vocabulary reads a prefix: fine */
    t = lp_tokenizer_from_llama2c_memory(good, len, 300, "prefix", &err);
    CHECK(t != NULL && lp_tokenizer_n_vocab(t) == 300);
    lp_tokenizer_free(t);
    free(bad);
    free(good);
}

/* ---- special tokens ---------------------------------------------------- */

static void test_special(void) {
    lp_tokenizer *t = load_gguf(ARCH "ggml-vocab-qwen2.gguf", NULL);
    CHECK(t != NULL);
    if (!t) return;
    const char *s = "<|im_start|>user\nHello<|im_end|>\n";
    int n;
    int32_t *ids = encode(t, s, strlen(s), false, true, &n);
    /* <|im_start|> user \n Hello <|im_end|> \n */
    static const int32_t want[] = {151644, 872, 198, 9707, 151645, 198};
    CHECK(n == 6 && memcmp(ids, want, sizeof want) == 0);
    if (n != 6) print_ids("special", ids, n);
    char *back = decode(t, ids, n, false);
    CHECK_MSG(strcmp(back, "user\nHello\n") == 0, "'%s'", back); /* control tokens hidden */
    free(back);
    char piece[32];
    size_t pl = lp_tokenizer_decode_token(t, 151644, true, piece, sizeof piece);
    CHECK(pl == 12 && memcmp(piece, "<|im_start|>", 12) == 0);
    free(ids);
    /* without parse_special the text is ordinary text */
    ids = encode(t, s, strlen(s), false, false, &n);
    bool any = false;
    for (int i = 0; i < n; i++) any |= ids[i] >= 151643;
    CHECK(n > 6 && !any);
    back = decode(t, ids, n, false);
    CHECK(strcmp(back, s) == 0);
    free(back);
    free(ids);
    /* cap smaller than the result: count still reported, nothing overrun */
    int32_t small[2] = {-7, -7};
    lp_error err;
    CHECK(lp_tokenizer_encode(t, s, strlen(s), false, true, small, 1, &err) == 6);
    CHECK(small[0] == 151644 && small[1] == -7);
    CHECK(lp_tokenizer_encode(t, "", 0, false, true, NULL, 0, &err) == 0);
    /* invalid UTF-8 never fails, and round-trips bytewise */
    const char junk[] = "a\xff\xfe b\xc3 \xe2\x82 \xf0\x9f\x98 z\x80";
    ids = encode(t, junk, sizeof junk - 1, false, true, &n);
    CHECK(n > 0);
    back = decode(t, ids, n, false);
    CHECK(memcmp(back, junk, sizeof junk) == 0);
    free(back);
    free(ids);
    lp_tokenizer_free(t);

    /* Llama 3 chat header round trip */
    t = load_gguf(ARCH "ggml-vocab-llama-bpe.gguf", NULL);
    if (t) {
        s = "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>";
        ids = encode(t, s, strlen(s), true, true, &n);
        CHECK(n == 7 && ids[0] == 128000 && ids[1] == 128006 && ids[3] == 128007 &&
              ids[6] == 128009);
        free(ids);
        lp_tokenizer_free(t);
    }
    /* SPM: </s><s> in a llama2 prompt */
    t = load_gguf(ARCH "ggml-vocab-llama-spm.gguf", NULL);
    if (t) {
        s = "[INST] Hi [/INST] Yo </s><s>[INST]";
        ids = encode(t, s, strlen(s), true, true, &n);
        int found = 0;
        for (int i = 0; i < n; i++) found += ids[i] == 1 || ids[i] == 2;
        CHECK(n > 4 && ids[0] == 1 && found == 3);
        free(ids);
        lp_tokenizer_free(t);
    }
}

/* ---- Hugging Face tokenizer.json ------------------------------------------- */

/* A tokenizer.json built from the GPT-2 vocabulary GGUF must tokenize the
 * GPT-2 vectors identically. */
static void test_hf_from_gguf(void) {
    lp_error err;
    lp_gguf *g = lp_gguf_open(ARCH "ggml-vocab-gpt-2.gguf", &err);
    CHECK(g != NULL);
    if (!g) return;
    const lp_gguf_kv *tokens = lp_gguf_find(g, "tokenizer.ggml.tokens");
    const lp_gguf_kv *merges = lp_gguf_find(g, "tokenizer.ggml.merges");
    CHECK(tokens && merges);
    if (!tokens || !merges) {
        lp_gguf_close(g);
        return;
    }
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject();
    cJSON *vocab = cJSON_CreateObject(), *m = cJSON_CreateArray(), *added = cJSON_CreateArray();
    char buf[1024];
    for (uint64_t i = 0; i < tokens->arr_len; i++) {
        lp_str s = tokens->arr_strs[i];
        snprintf(buf, sizeof buf, "%.*s", (int)s.len, s.ptr);
        if (i == 50256) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", (double)i);
            cJSON_AddStringToObject(a, "content", buf);
            cJSON_AddTrueToObject(a, "special");
            cJSON_AddItemToArray(added, a);
        }
        cJSON_AddNumberToObject(vocab, buf, (double)i);
    }
    for (uint64_t i = 0; i < merges->arr_len; i++) {
        lp_str s = merges->arr_strs[i];
        snprintf(buf, sizeof buf, "%.*s", (int)s.len, s.ptr);
        /* alternate the two merge spellings */
        if (i % 2) {
            cJSON_AddItemToArray(m, cJSON_CreateString(buf));
        } else {
            char *sp = strchr(buf + 1, ' ');
            *sp = '\0';
            const char *pair[2] = {buf, sp + 1};
            cJSON_AddItemToArray(m, cJSON_CreateStringArray(pair, 2));
        }
    }
    lp_gguf_close(g);
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", m);
    cJSON_AddItemToObject(root, "model", model);
    cJSON_AddItemToObject(root, "added_tokens", added);
    cJSON *pre = cJSON_CreateObject();
    cJSON_AddStringToObject(pre, "type", "ByteLevel");
    cJSON_AddItemToObject(root, "pre_tokenizer", pre);
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    const char *cfg = "{\"bos_token\": {\"content\": \"<|endoftext|>\"}, "
                      "\"eos_token\": \"<|endoftext|>\", \"add_bos_token\": false}";
    lp_tokenizer *t = lp_tokenizer_from_hf_memory(json, strlen(json), cfg, strlen(cfg),
                                                  "gpt2.json", &err);
    CHECK_MSG(t != NULL, "%s", err.message);
    if (t) {
        CHECK(lp_tokenizer_kind(t) == LP_TOK_BPE && lp_tokenizer_pretok(t) == LP_PRETOK_GPT2);
        CHECK(lp_tokenizer_bos(t) == 50256 && lp_tokenizer_eos(t) == 50256);
        CHECK(!lp_tokenizer_add_bos(t) && lp_tokenizer_is_eog(t, 50256));
        int tests = 0, round = 0;
        int pass = run_vectors(t, "gpt-2", &tests, &round);
        printf("tokenizer.json from gpt-2: %d/%d vectors pass\n", pass, tests);
        CHECK(tests == 46 && pass == tests && round == tests);
        lp_tokenizer_free(t);
    }
    /* malformed JSON is rejected with a message; so is a truncated file */
    t = lp_tokenizer_from_hf_memory(json, strlen(json) / 2, NULL, 0, "half.json", &err);
    CHECK(t == NULL && strstr(err.message, "half.json") && strstr(err.message, "malformed"));
    lp_tokenizer_free(t);
    free(json);
}

/* A ▁-style (Llama 2 HF) tokenizer.json: BPE with byte fallback. */
static void test_hf_spm(void) {
    const char *json =
        "{\"version\":\"1.0\",\"added_tokens\":["
        "{\"id\":0,\"content\":\"<unk>\",\"special\":true},"
        "{\"id\":1,\"content\":\"<s>\",\"special\":true},"
        "{\"id\":2,\"content\":\"</s>\",\"special\":true}],"
        "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":["
        "{\"type\":\"Prepend\",\"prepend\":\"\\u2581\"},"
        "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}]},"
        "\"pre_tokenizer\":null,"
        "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\","
        "\"pattern\":{\"String\":\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"}]},"
        "\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"unk_token\":\"<unk>\","
        "\"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2,\"<0x0A>\":3,\"<0xC3>\":4,\"<0xA9>\":5,"
        "\"\\u2581\":6,\"h\":7,\"i\":8,\"\\u2581h\":9,\"\\u2581hi\":10,\"t\":11,\"\\u2581t\":12},"
        "\"merges\":[\"\\u2581 h\",[\"\\u2581h\",\"i\"],\"\\u2581 t\"]}}";
    lp_error err;
    lp_tokenizer *t = lp_tokenizer_from_hf_memory(json, strlen(json), NULL, 0, "spm.json", &err);
    CHECK_MSG(t != NULL, "%s", err.message);
    if (!t) return;
    CHECK(lp_tokenizer_kind(t) == LP_TOK_SPM);
    CHECK(lp_tokenizer_bos(t) == 1 && lp_tokenizer_eos(t) == 2 && lp_tokenizer_add_bos(t));
    const char *s = "hi hi\n\xc3\xa9t";
    int n;
    int32_t *ids = encode(t, s, strlen(s), true, false, &n);
    /* <s> ▁hi ▁hi <0x0A> <0xC3> <0xA9> t */
    static const int32_t want[] = {1, 10, 10, 3, 4, 5, 11};
    CHECK(n == 7 && memcmp(ids, want, sizeof want) == 0);
    if (n != 7) print_ids("hf spm", ids, n);
    char *back = decode(t, ids, n, true);
    CHECK_MSG(strcmp(back, s) == 0, "'%s'", back);
    free(back);
    free(ids);
    lp_tokenizer_free(t);

    /* structurally wrong files */
    static const char *const bad[] = {
        "[]", "{}", "{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"x\"},\"merges\":[]}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[5]}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":99999999},\"merges\":[]}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{}}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}},\"added_tokens\":[{\"id\":1}]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        t = lp_tokenizer_from_hf_memory(bad[i], strlen(bad[i]), NULL, 0, "bad.json", &err);
        CHECK_MSG(t == NULL, "accepted %s", bad[i]);
        lp_tokenizer_free(t);
    }
    t = lp_tokenizer_from_hf_memory(json, strlen(json), "{oops", 5, "spm.json", &err);
    CHECK(t == NULL && strstr(err.message, "tokenizer_config.json"));
    lp_tokenizer_free(t);
}

/* ---- speed ----------------------------------------------------------------- */

static void test_speed(void) {
    /* 100 KB of varied text, including long runs without spaces */
    size_t len = 100 * 1024;
    char *text = malloc(len);
    static const char chunk[] = "The quick brown fox jumps over 1234567 lazy dogs! "
                                "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xe4\xbd\xa0\xe5\xa5\xbd\n\t";
    for (size_t i = 0; i < len; i++) text[i] = chunk[i % (sizeof chunk - 1)];
    for (size_t i = len / 2; i < len / 2 + 4000; i++) text[i] = 'a' + (char)(i % 7);
    while (len && ((uint8_t)text[len - 1] & 0xC0) == 0x80) len--; /* whole characters */
    static const char *const files[] = {ARCH "ggml-vocab-llama-bpe.gguf",
                                        ARCH "ggml-vocab-llama-spm.gguf"};
    for (int f = 0; f < 2; f++) {
        lp_tokenizer *t = load_gguf(files[f], NULL);
        if (!t) continue;
        double t0 = lp_now_seconds();
        int n;
        int32_t *ids = encode(t, text, len, false, true, &n);
        double dt = lp_now_seconds() - t0;
        printf("encode 100 KB with %s: %d tokens in %.3f s\n", f ? "spm" : "llama-bpe", n, dt);
        CHECK(n > 10000);
        /* generous for sanitizer builds; a release build takes a few ms */
        CHECK_MSG(dt < 5.0, "%.3f s", dt);
        char *back = decode(t, ids, n, true);
        CHECK(strlen(back) == len && memcmp(back, text, len) == 0);
        free(back);
        free(ids);
        lp_tokenizer_free(t);
    }
    free(text);
}

int main(void) {
    test_vectors();
    test_tiny_models();
    test_llama2c();
    test_llama2c_malformed();
    test_special();
    test_hf_from_gguf();
    test_hf_spm();
    test_speed();
    return check_summary("tokenizer");
}
