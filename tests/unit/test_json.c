/* JSON: parse, keep lexemes and key order, Python-style output, errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

static char *roundtrip(const char *text, int style) {
    char err[128];
    json_value *v = json_parse(text, strlen(text), 64, err, sizeof err);
    assert_non_null(v);
    strbuf sb;
    sb_init(&sb);
    json_write(&sb, v, style);
    json_free(v);
    return sb_take(&sb, NULL);
}

static void check(const char *in, int style, const char *want) {
    char *got = roundtrip(in, style);
    assert_string_equal(got, want);
    free(got);
}

static void test_compact_keeps_lexemes_and_order(void **state) {
    (void)state;
    check("{ \"b\" : 1.0, \"a\": [1e-7, 123456789012345678901234567890, -0] }", JSON_COMPACT,
          "{\"b\":1.0,\"a\":[1e-7,123456789012345678901234567890,-0]}");
}

static void test_python_numbers(void **state) {
    (void)state;
    check("[1.0, 1e-7, 0.0000001, 1E400, 123456789012345678901234567890, -0, 1e16, 1e15, 0.5, 100, 2.50, 1e-05, 0.0001]",
          JSON_PYTHON,
          "[1.0, 1e-07, 1e-07, Infinity, 123456789012345678901234567890, 0, 1e+16, 1000000000000000.0, 0.5, 100, 2.5, 1e-05, 0.0001]");
}

static void test_python_strings_keep_unicode(void **state) {
    (void)state;
    check("{\"k\": \"caf\\u00e9 \\ud83d\\ude00 \\n\\t\\u0001 \\\"q\\\" /\"}", JSON_PYTHON,
          "{\"k\": \"caf\xc3\xa9 \xf0\x9f\x98\x80 \\n\\t\\u0001 \\\"q\\\" /\"}");
    check("[\"\xc3\xa9\xf0\x9f\x98\x80\"]", JSON_PYTHON | JSON_ASCII, "[\"\\u00e9\\ud83d\\ude00\"]");
}

static void test_duplicate_keys_last_wins(void **state) {
    (void)state;
    check("{\"a\":1,\"b\":2,\"a\":3}", JSON_COMPACT, "{\"a\":3,\"b\":2}");
}

static void expect_error(const char *text, int depth, const char *fragment) {
    char err[128];
    json_value *v = json_parse(text, strlen(text), depth, err, sizeof err);
    assert_null(v);
    if (!strstr(err, fragment)) fail_msg("error '%s' lacks '%s'", err, fragment);
}

static void test_errors(void **state) {
    (void)state;
    expect_error("{\"a\":1,}", 64, "expected a string key");
    expect_error("[1,2", 64, "expected ',' or ']'");
    expect_error("\"abc", 64, "unterminated string");
    expect_error("\"\xff\"", 64, "invalid UTF-8");
    expect_error("\"\\ud800\"", 64, "surrogate");
    expect_error("[[[[1]]]]", 3, "nesting too deep");
    expect_error("01", 64, "unexpected data");
    expect_error("{} x", 64, "unexpected data");
    expect_error("", 64, "unexpected end");
    expect_error("nul", 64, "unexpected character");
    expect_error("[1,\n 2,\n x]", 64, "line 3, column 2");
}

static void test_getters(void **state) {
    (void)state;
    const char *t = "{\"n\": 42, \"big\": 99999999999999999999, \"f\": 3.0, \"s\": \"x\", \"t\": true}";
    json_value *v = json_parse(t, strlen(t), 64, NULL, 0);
    assert_non_null(v);
    assert_int_equal(json_get_int(v, "n", -1), 42);
    assert_int_equal(json_get_int(v, "big", -1), -1);
    assert_int_equal(json_get_int(v, "f", -1), 3);
    assert_string_equal(json_get_string(v, "s", ""), "x");
    assert_int_equal(json_get_bool(v, "t", 0), 1);
    assert_int_equal(json_get_bool(v, "missing", 7), 7);
    json_value *c = json_clone(v);
    json_obj_set(c, "n", json_new_int(-5));
    json_obj_set(c, "new", json_new_double(0.1));
    strbuf sb;
    sb_init(&sb);
    json_write(&sb, c, JSON_COMPACT);
    assert_string_equal(sb_cstr(&sb), "{\"n\":-5,\"big\":99999999999999999999,\"f\":3.0,\"s\":\"x\",\"t\":true,\"new\":0.1}");
    sb_free(&sb);
    json_free(c);
    json_free(v);
}

/* Large objects are indexed: building and lookup must stay linear, and
 * duplicate keys must still resolve to the last value. */
static void test_large_object(void **state) {
    (void)state;
    enum { N = 200000 };
    strbuf sb;
    sb_init(&sb);
    sb_putc(&sb, '{');
    for (int i = 0; i < N; i++) sb_printf(&sb, "%s\"k%d\":%d", i ? "," : "", i, i);
    sb_puts(&sb, ",\"k7\":-7}");
    json_value *v = json_parse(sb.data, sb.len, 8, NULL, 0);
    sb_free(&sb);
    assert_non_null(v);
    assert_int_equal(v->count, N);
    assert_int_equal(json_get_int(v, "k7", 0), -7);
    assert_int_equal(json_get_int(v, "k199999", 0), 199999);
    assert_null(json_get(v, "k200000"));
    assert_string_equal(v->keys[N - 1], "k199999");
    json_free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compact_keeps_lexemes_and_order),
        cmocka_unit_test(test_python_numbers),
        cmocka_unit_test(test_python_strings_keep_unicode),
        cmocka_unit_test(test_duplicate_keys_last_wins),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_getters),
        cmocka_unit_test(test_large_object),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
