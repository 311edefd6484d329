/* The Responses store (bounded, least recently used first) and sealed
 * reasoning (the Anthropic signature / Responses encrypted_content format),
 * the expected seals computed with Python's hashlib and base64. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "server/generation.h"
#include "server/response_store.h"

static int has(srv_response_store *s, const char *id) { return srv_response_store_get(s, id, NULL, NULL) == 0; }

static void test_put_get_delete(void **state) {
    (void)state;
    srv_response_store *s = srv_response_store_new(10, 1 << 20);
    assert_int_equal(srv_response_store_put(s, "a", "{\"id\":\"a\"}", 10, "[1]", 3), 0);
    strbuf r, i;
    sb_init(&r);
    sb_init(&i);
    assert_int_equal(srv_response_store_get(s, "a", &r, &i), 0);
    assert_string_equal(sb_cstr(&r), "{\"id\":\"a\"}");
    assert_string_equal(sb_cstr(&i), "[1]");
    assert_int_equal(srv_response_store_put(s, "a", "{}", 2, "[2]", 3), 0); /* replaces */
    size_t n, bytes;
    srv_response_store_usage(s, &n, &bytes);
    assert_int_equal(n, 1);
    assert_int_equal(srv_response_store_get(s, "b", &r, NULL), SPLASH_E_NOTFOUND);
    assert_int_equal(srv_response_store_delete(s, "a"), 0);
    assert_int_equal(srv_response_store_delete(s, "a"), SPLASH_E_NOTFOUND);
    srv_response_store_usage(s, &n, &bytes);
    assert_int_equal(n, 0);
    assert_int_equal(bytes, 0);
    sb_free(&r);
    sb_free(&i);
    srv_response_store_free(s);
}

static void test_lru_by_count_and_bytes(void **state) {
    (void)state;
    srv_response_store *s = srv_response_store_new(3, 1 << 20);
    srv_response_store_put(s, "a", "x", 1, "[]", 2);
    srv_response_store_put(s, "b", "x", 1, "[]", 2);
    srv_response_store_put(s, "c", "x", 1, "[]", 2);
    assert_true(has(s, "a")); /* a is now the most recently used: b goes first */
    srv_response_store_put(s, "d", "x", 1, "[]", 2);
    assert_false(has(s, "b"));
    assert_true(has(s, "a") && has(s, "c") && has(s, "d"));
    srv_response_store_free(s);

    char big[4000];
    memset(big, 'x', sizeof big);
    s = srv_response_store_new(100, 10000); /* two of these fit, not three */
    srv_response_store_put(s, "a", big, sizeof big, "[]", 2);
    srv_response_store_put(s, "b", big, sizeof big, "[]", 2);
    srv_response_store_put(s, "c", big, sizeof big, "[]", 2);
    assert_false(has(s, "a"));
    assert_true(has(s, "b") && has(s, "c"));
    size_t n, bytes;
    srv_response_store_usage(s, &n, &bytes);
    assert_true(bytes <= 10000);
    char huge[12000];
    memset(huge, 'y', sizeof huge);
    assert_int_equal(srv_response_store_put(s, "h", huge, sizeof huge, "[]", 2), SPLASH_E_RANGE);
    assert_true(has(s, "b")); /* a refused entry evicts nothing */
    srv_response_store_free(s);
}

static void check_seal(const char *text, size_t n, const char *want) {
    strbuf b, t;
    sb_init(&b);
    sb_init(&t);
    srv_reasoning_seal(text, n, &b);
    assert_string_equal(sb_cstr(&b), want);
    assert_int_equal(srv_reasoning_unseal(b.data, b.len, &t), 0);
    assert_int_equal(t.len, n);
    assert_memory_equal(sb_cstr(&t), text, n);
    sb_free(&b);
    sb_free(&t);
}

static void test_seal(void **state) {
    (void)state;
    check_seal("I should call the tool.", 23, "sr1_b616399e541eaaa2048dd4dbbde894bf_SSBzaG91bGQgY2FsbCB0aGUgdG9vbC4=");
    check_seal("", 0, "sr1_4fdeb2e2c077751e7a27288f4a9d26bf_");
    check_seal("h\xc3\xa9llo\n\n<think>", 15, "sr1_9915a8d6f2c50ad78218503a26c3dacf_aMOpbGxvCgo8dGhpbms+");
    check_seal("ab", 2, "sr1_b5faa0868d630a1c83c54d5d93444936_YWI=");
    strbuf t;
    sb_init(&t);
    const char *bad[] = {
        "sr1_b616399e541eaaa2048dd4dbbde894bf_SSBzaG91bGQgY2FsbCB0aGUgdG9vbC5=", /* text edited */
        "sr1_c616399e541eaaa2048dd4dbbde894bf_SSBzaG91bGQgY2FsbCB0aGUgdG9vbC4=", /* hash edited */
        "sr1_b616399e541eaaa2048dd4dbbde894bf_SSBzaG91bGQgY2FsbCB0aGUgdG9vbC4",  /* truncated */
        "sr1_b5faa0868d630a1c83c54d5d93444936_Y=WI",                             /* padding inside */
        "EqQBCkYIBxgCKkBsignature",                                              /* someone else's */
        "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) assert_int_equal(srv_reasoning_unseal(bad[i], strlen(bad[i]), &t), -1);
    assert_int_equal(t.len, 0);
    sb_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_get_delete),
        cmocka_unit_test(test_lru_by_count_and_bytes),
        cmocka_unit_test(test_seal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
