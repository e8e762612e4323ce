/* Chat templates: exact rendered prompts per format, and format detection
 * from templates and vocabularies. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tokenizer/tokenizer.h"

#define ARCH LP_SHARED_MODELS "/arch/"

static const lp_chat_message convo[] = {
    {"system", "Be brief."},
    {"user", "Hi!"},
    {"assistant", "Hello."},
    {"user", "Bye?"},
};

static void expect(lp_chat_format f, const lp_chat_message *m, int n, bool gen,
                   const char *want) {
    lp_error err;
    char *got = lp_chat_render(f, m, n, gen, &err);
    CHECK_MSG(got != NULL, "%s: %s", lp_chat_format_name(f), err.message);
    if (!got) return;
    CHECK_MSG(strcmp(got, want) == 0, "%s:\n got  [%s]\n want [%s]", lp_chat_format_name(f),
              got, want);
    free(got);
}

static void test_render(void) {
    expect(LP_CHAT_LLAMA3, convo, 4, true,
           "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
           "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
           "<|start_header_id|>user<|end_header_id|>\n\nBye?<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect(LP_CHAT_LLAMA3, convo + 1, 1, false,
           "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>");
    expect(LP_CHAT_CHATML, convo, 4, true,
           "<|im_start|>system\nBe brief.<|im_end|>\n"
           "<|im_start|>user\nHi!<|im_end|>\n"
           "<|im_start|>assistant\nHello.<|im_end|>\n"
           "<|im_start|>user\nBye?<|im_end|>\n"
           "<|im_start|>assistant\n");
    expect(LP_CHAT_CHATML, convo + 1, 1, false, "<|im_start|>user\nHi!<|im_end|>\n");
    expect(LP_CHAT_LLAMA2, convo, 4, true,
           "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST] Hello. </s><s>[INST] Bye? [/INST]");
    expect(LP_CHAT_LLAMA2, convo + 1, 1, true, "[INST] Hi! [/INST]");
    expect(LP_CHAT_MISTRAL, convo, 4, true,
           "[INST] Be brief.\n\nHi! [/INST]Hello.</s>[INST] Bye? [/INST]");
    expect(LP_CHAT_MISTRAL, convo + 1, 3, false, "[INST] Hi! [/INST]Hello.</s>[INST] Bye? [/INST]");
    /* the official templates trim message text */
    lp_chat_message padded[] = {{"user", "  spaced out \n"}};
    expect(LP_CHAT_LLAMA3, padded, 1, false,
           "<|start_header_id|>user<|end_header_id|>\n\nspaced out<|eot_id|>");
    expect(LP_CHAT_MISTRAL, padded, 1, false, "[INST] spaced out [/INST]");
    expect(LP_CHAT_CHATML, NULL, 0, true, "<|im_start|>assistant\n");

    lp_error err;
    lp_chat_message odd[] = {{"tool", "x"}};
    char *s = lp_chat_render(LP_CHAT_LLAMA2, odd, 1, true, &err);
    CHECK(s == NULL && strstr(err.message, "tool"));
    s = lp_chat_render(LP_CHAT_NONE, convo, 4, true, &err);
    CHECK(s == NULL && strlen(err.message) > 0);
    lp_chat_message missing[] = {{"user", NULL}};
    s = lp_chat_render(LP_CHAT_CHATML, missing, 1, true, &err);
    CHECK(s == NULL);
    CHECK(strcmp(lp_chat_format_name(LP_CHAT_LLAMA3), "llama3") == 0);
    CHECK(strcmp(lp_chat_format_name(LP_CHAT_CHATML), "chatml") == 0);
    CHECK(strcmp(lp_chat_format_name(LP_CHAT_LLAMA2), "llama2") == 0);
    CHECK(strcmp(lp_chat_format_name(LP_CHAT_MISTRAL), "mistral") == 0);
    CHECK(strcmp(lp_chat_format_name(LP_CHAT_NONE), "none") == 0);
}

static lp_tokenizer *load(const char *path) {
    lp_error err;
    lp_gguf *g = lp_gguf_open(path, &err);
    if (!g) {
        fprintf(stderr, "%s\n", err.message);
        return NULL;
    }
    lp_tokenizer *t = lp_tokenizer_from_gguf(g, &err);
    if (!t) fprintf(stderr, "%s\n", err.message);
    lp_gguf_close(g);
    return t;
}

static void test_detect_models(void) {
    lp_tokenizer *t = load(ARCH "qwen2-tiny-random.gguf"); /* template: ChatML */
    CHECK(t && lp_tokenizer_chat_format(t) == LP_CHAT_CHATML);
    if (t) {
        /* a rendered prompt encodes its markers as single special tokens */
        lp_error err;
        char *p = lp_chat_render(LP_CHAT_CHATML, convo + 1, 1, true, &err);
        int32_t ids[64];
        int n = lp_tokenizer_encode(t, p, strlen(p), lp_tokenizer_add_bos(t), true, ids, 64, &err);
        CHECK(n > 5 && n <= 64 && ids[0] == 151644 && ids[n - 3] == 151644);
        int ends = 0;
        for (int i = 0; i < n && i < 64; i++) ends += ids[i] == 151645;
        CHECK(ends == 1);
        free(p);
    }
    lp_tokenizer_free(t);
    t = load(ARCH "llama3-tiny-random.gguf"); /* no template: from the vocabulary */
    CHECK(t && lp_tokenizer_chat_format(t) == LP_CHAT_LLAMA3);
    lp_tokenizer_free(t);
    t = load(ARCH "mistral-spm-tiny-random.gguf");
    lp_chat_format f = t ? lp_tokenizer_chat_format(t) : LP_CHAT_NONE;
    CHECK(f == LP_CHAT_LLAMA2 || f == LP_CHAT_MISTRAL);
    lp_tokenizer_free(t);
    t = load(ARCH "ggml-vocab-gpt-2.gguf"); /* nothing to go by */
    CHECK(t && lp_tokenizer_chat_format(t) == LP_CHAT_NONE);
    lp_tokenizer_free(t);
}

/* Detection from tokenizer_config.json chat templates. */
static void test_detect_templates(void) {
    const char *json = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]},"
                       "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}";
    static const struct {
        const char *config;
        lp_chat_format want;
    } cases[] = {
        {"{\"chat_template\":\"{{ '<|start_header_id|>' + m + '<|end_header_id|>' }}\"}", LP_CHAT_LLAMA3},
        {"{\"chat_template\":\"{% for m in messages %}<|im_start|>{{m}}{% endfor %}\"}", LP_CHAT_CHATML},
        {"{\"chat_template\":\"[INST] <<SYS>>\\n{{s}}\\n<</SYS>> [/INST]\"}", LP_CHAT_LLAMA2},
        {"{\"chat_template\":\"{{ bos }}[INST] {{ m }} [/INST]\"}", LP_CHAT_MISTRAL},
        {"{\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"<|im_start|>\"},"
         "{\"name\":\"default\",\"template\":\"[INST]\"}]}", LP_CHAT_MISTRAL},
        {"{\"chat_template\":\"{{ unknown }}\"}", LP_CHAT_NONE},
        {"{}", LP_CHAT_NONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lp_error err;
        lp_tokenizer *t = lp_tokenizer_from_hf_memory(json, strlen(json), cases[i].config,
                                                      strlen(cases[i].config), "t.json", &err);
        CHECK_MSG(t != NULL, "%s", err.message);
        if (!t) continue;
        lp_chat_format f = lp_tokenizer_chat_format(t);
        CHECK_MSG(f == cases[i].want, "case %zu: %s", i, lp_chat_format_name(f));
        lp_tokenizer_free(t);
    }
}

int main(void) {
    test_render();
    test_detect_models();
    test_detect_templates();
    return check_summary("chat");
}
