/* The native chat template through its C API: rendering, errors, the known-
 * template check and reading a tokenizer directory.  The byte-for-byte
 * comparison over many conversations is tests/node/chat_template.test.mjs;
 * the expected strings here were written from the template by hand and agree
 * with Python Jinja (tests/node/template_cases/expected/). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fs.h"
#include "text/chat_template.h"

static json_value *parse(const char *text) {
    char err[160];
    json_value *v = json_parse(text, strlen(text), JSON_DEFAULT_MAX_DEPTH, err, sizeof err);
    if (!v) fail_msg("bad test JSON: %s", err);
    return v;
}

/* Renders request; returns the prompt (free it) or NULL with *code/err set. */
static char *render(const char *request, int *code, splash_error *err) {
    json_value *req = parse(request);
    strbuf sb;
    sb_init(&sb);
    *code = splash_chat_template_render(req, &sb, err);
    json_free(req);
    if (*code) {
        sb_free(&sb);
        return NULL;
    }
    sb_cstr(&sb);
    return sb_take(&sb, NULL);
}

static void expect_prompt(const char *request, const char *want) {
    splash_error err = {0};
    int code;
    char *got = render(request, &code, &err);
    if (!got) fail_msg("render failed (%d): %s", code, err.msg);
    assert_string_equal(got, want);
    free(got);
}

static void expect_error(const char *request, int want_code, const char *want_msg) {
    splash_error err = {0};
    int code;
    char *got = render(request, &code, &err);
    if (got) fail_msg("rendered instead of failing: %s", got);
    assert_int_equal(code, want_code);
    assert_string_equal(err.msg, want_msg);
}

static void test_render_chat(void **state) {
    (void)state;
    expect_prompt("{\"messages\": [{\"role\": \"system\", \"content\": \" Be brief. \"}, {\"role\": \"user\", \"content\": \"Hi\"}],"
                  " \"add_generation_prompt\": true}",
                  "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n");
    expect_prompt("{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"add_generation_prompt\": true,"
                  " \"enable_thinking\": false}",
                  "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    /* history reasoning dropped, current-turn <think> split out of content */
    expect_prompt("{\"messages\": [{\"role\": \"user\", \"content\": \"q1\"},"
                  " {\"role\": \"assistant\", \"content\": \"a1\", \"reasoning_content\": \"old\"},"
                  " {\"role\": \"user\", \"content\": \"q2\"},"
                  " {\"role\": \"assistant\", \"content\": \"<think>\\nnew\\n</think>\\n\\na2\"}]}",
                  "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n"
                  "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n<think>\nnew\n</think>\n\na2<|im_end|>\n");
}

static void test_render_tool_calls_python_json(void **state) {
    (void)state;
    expect_prompt("{\"messages\": [{\"role\": \"user\", \"content\": \"go\"},"
                  " {\"role\": \"assistant\", \"content\": \"ok\", \"tool_calls\": [{\"function\": {\"name\": \"f\","
                  " \"arguments\": {\"s\": \"raw \\\"text\\\"\", \"x\": 1.0, \"e\": 1e-7, \"big\": 123456789012345678901,"
                  " \"o\": {\"k\": [true, null, \"\xc3\xa9\"]}}}}]},"
                  " {\"role\": \"tool\", \"content\": \"r1\"}, {\"role\": \"tool\", \"content\": \"r2\"}]}",
                  "<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nok\n\n"
                  "<tool_call>\n<function=f>\n"
                  "<parameter=s>\nraw \"text\"\n</parameter>\n"
                  "<parameter=x>\n1.0\n</parameter>\n"
                  "<parameter=e>\n1e-07\n</parameter>\n"
                  "<parameter=big>\n123456789012345678901\n</parameter>\n"
                  "<parameter=o>\n{\"k\": [true, null, \"\xc3\xa9\"]}\n</parameter>\n"
                  "</function>\n</tool_call><|im_end|>\n"
                  "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n");
}

static void test_render_errors(void **state) {
    (void)state;
    expect_error("{\"messages\": []}", SPLASH_E_TEMPLATE, "No messages provided.");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"system\", \"content\": \"b\"}]}",
                 SPLASH_E_TEMPLATE, "System message must be at the beginning.");
    expect_error("{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}]}", SPLASH_E_TEMPLATE,
                 "No user query found in messages.");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"bot\", \"content\": \"b\"}]}",
                 SPLASH_E_TEMPLATE, "Unexpected message role.");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"\","
                 " \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]}]}",
                 SPLASH_E_TEMPLATE, "Can only get item pairs from a mapping.");
    expect_error("[]", SPLASH_E_INVALID, "the chat request must be a JSON object");

    /* a failed render leaves the output buffer as it was */
    json_value *req = parse("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"bot\"}]}");
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "keep");
    assert_int_equal(splash_chat_template_render(req, &sb, NULL), SPLASH_E_TEMPLATE);
    assert_string_equal(sb_cstr(&sb), "keep");
    sb_free(&sb);
    json_free(req);
}

static void test_render_deterministic(void **state) {
    (void)state;
    const char *req = "{\"messages\": [{\"role\": \"user\","
                      " \"content\": [{\"type\": \"image\"}, {\"type\": \"text\", \"text\": \"x\"}]}],"
                      " \"tools\": [{\"name\": \"t\", \"p\": 0.5}], \"add_vision_id\": true, \"add_generation_prompt\": true}";
    splash_error err = {0};
    int code;
    char *a = render(req, &code, &err), *b = render(req, &code, &err);
    assert_non_null(a);
    assert_non_null(b);
    assert_string_equal(a, b);
    assert_non_null(strstr(a, "\n{\"name\": \"t\", \"p\": 0.5}\n</tools>"));
    assert_non_null(strstr(a, "<|im_start|>user\nPicture 1: <|vision_start|><|image_pad|><|vision_end|>x<|im_end|>"));
    free(a);
    free(b);
}

static void test_identify(void **state) {
    (void)state;
    size_t len;
    const char *t = splash_chat_template_builtin(&len);
    assert_int_equal(len, 7765);
    assert_int_equal(strlen(t), len);
    char buf[256];
    assert_string_equal(splash_chat_template_identify(t, len, buf, sizeof buf), "native");
    assert_string_equal(splash_chat_template_identify(t, len - 1, buf, sizeof buf), "native"); /* no final newline */

    char *copy = malloc(len + 8);
    memcpy(copy, t, len);
    memcpy(copy + len, " \n\t\r\n", 5);
    assert_string_equal(splash_chat_template_identify(copy, len + 5, buf, sizeof buf), "native");
    /* line 2 is "{%- set video_count = namespace(value=0) %}" */
    char *p = strstr(copy, "video_count");
    p[0] = 'V';
    const char *d = splash_chat_template_identify(copy, len, buf, sizeof buf);
    assert_ptr_equal(d, buf);
    assert_string_equal(d, "not the known Qwen3.6 template: line 2, column 9 has "
                           "\"Video_count = namespace(value=0) %}\\n{%- ...\" where the known one has "
                           "\"video_count = namespace(value=0) %}\\n{%- ...\"");
    free(copy);
}

static void test_identify_edges(void **state) {
    (void)state;
    size_t len;
    const char *t = splash_chat_template_builtin(&len);
    char buf[256];
    assert_string_equal(splash_chat_template_identify("", 0, buf, sizeof buf), "empty, not the known Qwen3.6 template");
    assert_string_equal(splash_chat_template_identify(t, 43, buf, sizeof buf),
                        "not the known Qwen3.6 template: ends at line 1, column 44, before "
                        "\"\\n{%- set video_count = namespace(value=0...\"");
    assert_non_null(strstr(splash_chat_template_identify(t, 200, buf, sizeof buf), "ends at line"));
    char *more = malloc(len + 16);
    memcpy(more, t, len);
    memcpy(more + len, "{{ extra }}", 11);
    assert_string_equal(splash_chat_template_identify(more, len + 11, buf, sizeof buf),
                        "not the known Qwen3.6 template: extra text from line 154, column 13: \"\\n{{ extra }}\"");
    free(more);
}

static char *root_path(const char *rel) {
    const char *root = getenv("SPLASH_ROOT");
    return splash_path_join(root && *root ? root : ".", rel);
}

/* The copy the tests render, and the reference in shared/ when present, are
 * the embedded text. */
static void test_identify_files(void **state) {
    (void)state;
    const char *files[] = {"tests/node/template_cases/tokenizer/chat_template.jinja",
                           "../shared/reference/qwen3.6-chat_template.jinja"};
    for (int i = 0; i < 2; i++) {
        char *path = root_path(files[i]);
        char *text;
        size_t n;
        if (i == 1 && !splash_is_file(path)) {
            free(path);
            continue;
        }
        if (splash_read_file(path, &text, &n, NULL)) fail_msg("cannot read %s", path);
        char buf[256];
        assert_string_equal(splash_chat_template_identify(text, n, buf, sizeof buf), "native");
        free(text);
        free(path);
    }
}

static void test_read_dir(void **state) {
    (void)state;
    char dir[] = "/tmp/splash-tpl-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *cfg = splash_path_join(dir, "tokenizer_config.json");
    char *jinja = splash_path_join(dir, "chat_template.jinja");
    char *text;
    size_t n;
    splash_error err = {0};
    assert_int_equal(splash_chat_template_read_dir(dir, &text, &n, &err), SPLASH_E_NOTFOUND);

    const char *list = "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
                       " {\"name\": \"default\", \"template\": \"D\\n\"}]}";
    assert_int_equal(splash_write_file(cfg, list, strlen(list), NULL), 0);
    assert_int_equal(splash_chat_template_read_dir(dir, &text, &n, &err), 0);
    assert_string_equal(text, "D\n");
    assert_int_equal(n, 2);
    free(text);

    assert_int_equal(splash_write_file(jinja, "J", 1, NULL), 0); /* the .jinja file wins */
    assert_int_equal(splash_chat_template_read_dir(dir, &text, &n, &err), 0);
    assert_string_equal(text, "J");
    free(text);

    unlink(jinja);
    assert_int_equal(splash_write_file(cfg, "{\"x\": 1}", 8, NULL), 0);
    assert_int_equal(splash_chat_template_read_dir(dir, &text, &n, &err), SPLASH_E_NOTFOUND);
    assert_int_equal(splash_write_file(cfg, "{bad", 4, NULL), 0);
    assert_int_equal(splash_chat_template_read_dir(dir, &text, &n, &err), SPLASH_E_FORMAT);
    unlink(cfg);
    rmdir(dir);
    free(cfg);
    free(jinja);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render_chat),
        cmocka_unit_test(test_render_tool_calls_python_json),
        cmocka_unit_test(test_render_errors),
        cmocka_unit_test(test_render_deterministic),
        cmocka_unit_test(test_identify),
        cmocka_unit_test(test_identify_edges),
        cmocka_unit_test(test_identify_files),
        cmocka_unit_test(test_read_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
