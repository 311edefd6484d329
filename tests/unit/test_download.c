/* Model names, base URLs and cache paths (src/package/model_ref.h), and the
 * offline path of splash_model_resolve (no network).  The HTTP side is tested
 * against a local server in tests/node/download.test.mjs. */
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
#include "package/download.h"
#include "package/model_ref.h"

static void parse_ok(const char *name, const char *owner, const char *repo, const char *rev) {
    splash_model_ref ref;
    splash_error err = {0};
    assert_int_equal(splash_model_ref_parse(name, &ref, &err), 0);
    assert_string_equal(ref.owner, owner);
    assert_string_equal(ref.repo, repo);
    assert_string_equal(ref.revision, rev);
}

static void parse_bad(const char *name, const char *why) {
    splash_model_ref ref;
    splash_error err = {0};
    assert_int_equal(splash_model_ref_parse(name, &ref, &err), SPLASH_E_INVALID);
    if (!strstr(err.msg, why)) fail_msg("'%s': message \"%s\" lacks \"%s\"", name, err.msg, why);
}

static void test_names(void **state) {
    (void)state;
    parse_ok("Qwen/Qwen3.5-27B", "Qwen", "Qwen3.5-27B", "main");
    parse_ok("acme/tiny@v1.0", "acme", "tiny", "v1.0");
    parse_ok("a_b/c.d@0123456789abcdef0123456789abcdef01234567", "a_b", "c.d", "0123456789abcdef0123456789abcdef01234567");
    parse_bad("tiny", "expected OWNER/REPO");
    parse_bad("/tiny", "the owner is empty");
    parse_bad("acme/", "the repository is empty");
    parse_bad("acme/tiny@", "the revision is empty");
    parse_bad("acme/a/b", "only hold letters");
    parse_bad("acme/t iny", "found ' '");
    parse_bad("acme/a--b", "\"--\"");
    parse_bad("acme/a..b", "\"..\"");
    parse_bad("acme/..", "\"..\"");
    parse_bad("acme/.git", "start or end");
    parse_bad("acme/tiny-", "start or end");
    parse_bad("acme/tiny@refs/pr/1", "revisions with '/'");
    char longname[200];
    memset(longname, 'a', sizeof longname);
    memcpy(longname, "acme/", 5);
    longname[199] = 0;
    parse_bad(longname, "longer than 96");
}

static void test_paths_vs_names(void **state) {
    (void)state;
    assert_true(splash_model_looks_like_path("/models/x"));
    assert_true(splash_model_looks_like_path("./x"));
    assert_true(splash_model_looks_like_path("~/x"));
    assert_true(splash_model_looks_like_path("a/b/c"));
    assert_true(splash_model_looks_like_path("a/b/"));
    assert_false(splash_model_looks_like_path("Qwen/Qwen3.5-27B"));
    assert_false(splash_model_looks_like_path("tiny"));
}

static void test_urls(void **state) {
    (void)state;
    splash_model_ref ref;
    assert_int_equal(splash_model_ref_parse("acme/tiny@v2", &ref, NULL), 0);
    char *url = splash_model_file_url("https://huggingface.co", &ref, "tokenizer/chat template+.jinja");
    assert_string_equal(url, "https://huggingface.co/acme/tiny/resolve/v2/tokenizer/chat%20template%2B.jinja");
    free(url);
    char *dir = splash_model_cache_dir("/c", &ref);
    assert_string_equal(dir, "/c/models/acme--tiny/v2");
    free(dir);

    char *base = NULL;
    splash_error err = {0};
    unsetenv("SPLASH_MODEL_BASE_URL");
    assert_int_equal(splash_model_base_url(NULL, &base, &err), 0);
    assert_string_equal(base, "https://huggingface.co");
    free(base);
    setenv("SPLASH_MODEL_BASE_URL", "http://127.0.0.1:8080/mirror//", 1);
    assert_int_equal(splash_model_base_url(NULL, &base, &err), 0);
    assert_string_equal(base, "http://127.0.0.1:8080/mirror");
    free(base);
    setenv("SPLASH_MODEL_BASE_URL", "file:///etc", 1);
    assert_int_equal(splash_model_base_url(NULL, &base, &err), SPLASH_E_INVALID);
    assert_null(base);
    assert_non_null(strstr(err.msg, "only http:// and https://"));
    assert_int_equal(splash_model_base_url("https://", &base, &err), SPLASH_E_INVALID);
    unsetenv("SPLASH_MODEL_BASE_URL");
}

static void test_cache_root(void **state) {
    (void)state;
    char *root = NULL;
    setenv("SPLASH_CACHE_DIR", "/x/splash-cache", 1);
    assert_int_equal(splash_model_cache_root(NULL, &root, NULL), 0);
    assert_string_equal(root, "/x/splash-cache");
    free(root);
    unsetenv("SPLASH_CACHE_DIR");
    setenv("XDG_CACHE_HOME", "/xdg", 1);
    assert_int_equal(splash_model_cache_root(NULL, &root, NULL), 0);
    assert_string_equal(root, "/xdg/splash");
    free(root);
    setenv("XDG_CACHE_HOME", "relative", 1); /* ignored, as the XDG spec says */
    setenv("HOME", "/home/u", 1);
    assert_int_equal(splash_model_cache_root(NULL, &root, NULL), 0);
    assert_string_equal(root, "/home/u/.cache/splash");
    free(root);
    assert_int_equal(splash_model_cache_root("/opt/c", &root, NULL), 0);
    assert_string_equal(root, "/opt/c");
    free(root);
}

/* Offline resolution never needs a server: an existing directory is returned
 * as is, a name missing from the cache fails with the cache path in the
 * message, and a bad name is refused before anything else. */
static void test_resolve_offline(void **state) {
    (void)state;
    char tmpl[] = "/tmp/splash-test-download-XXXXXX";
    char *tmp = mkdtemp(tmpl);
    assert_non_null(tmp);
    splash_download_options opt = {.offline = 1, .quiet = 1, .cache_dir = tmp};
    char *dir = NULL;
    splash_error err = {0};
    assert_int_equal(splash_model_resolve(tmp, &opt, &dir, &err), 0);
    assert_string_equal(dir, tmp);
    free(dir);
    dir = NULL;
    assert_int_equal(splash_model_resolve("acme/tiny", &opt, &dir, &err), SPLASH_E_NOTFOUND);
    assert_null(dir);
    char want[512];
    snprintf(want, sizeof want, "model acme/tiny is not in the cache (%s/models/acme--tiny/main has no download)", tmp);
    assert_non_null(strstr(err.msg, want));
    assert_int_equal(splash_model_resolve("/no/such/dir", &opt, &dir, &err), SPLASH_E_NOTFOUND);
    assert_string_equal(err.msg, "no package directory at /no/such/dir");
    assert_int_equal(splash_model_resolve("acme/a--b", &opt, &dir, &err), SPLASH_E_INVALID);
    assert_int_equal(splash_remove_tree(tmp), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_paths_vs_names),
        cmocka_unit_test(test_urls),
        cmocka_unit_test(test_cache_root),
        cmocka_unit_test(test_resolve_offline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
