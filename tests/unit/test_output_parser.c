/* Output parser: crafted model outputs in the Qwen3.6 template's layout,
 * parsed whole, split in two at every byte boundary, and fed one byte at a
 * time.  Every way of feeding must give the same (merged) event sequence, and
 * that sequence must give the reasoning, content, calls and errors written
 * here by hand from the template's layout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/status.h"
#include "text/output_parser.h"

/* The tools in all three APIs' shapes (the parser accepts each). */
static const char TOOLS_JSON[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"read_file\", \"parameters\": {\"type\": \"object\","
    "  \"properties\": {\"path\": {\"type\": \"string\"}, \"limit\": {\"type\": \"integer\"}}}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"write_file\", \"parameters\": {\"type\": \"object\","
    "  \"properties\": {\"path\": {\"type\": \"string\"}, \"content\": {\"type\": \"string\"}}}}},"
    " {\"name\": \"typed\", \"input_schema\": {\"type\": \"object\", \"properties\": {"
    "  \"n\": {\"type\": \"integer\"}, \"x\": {\"type\": \"number\"}, \"b\": {\"type\": \"boolean\"},"
    "  \"o\": {\"type\": \"object\"}, \"a\": {\"type\": \"array\"}, \"opt\": {\"type\": [\"integer\", \"null\"]},"
    "  \"e\": {\"enum\": [1, 2, 3]}, \"u\": {\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"integer\"}]}}}},"
    " {\"type\": \"function\", \"name\": \"flat\", \"parameters\": {\"properties\": {\"q\": {\"type\": \"string\"}}}}]";

static json_value *tools;

typedef struct {
    const char *name, *args;
    int complete;
} ecall;

typedef struct {
    int code, index, usable;
    const char *raw;
} eerr;

typedef struct {
    const char *label;
    int in_reasoning;
    const char *text;
    const char *reasoning, *content;
    ecall calls[4];
    eerr errs[4];
} tcase;

#define CALL_BEGIN_TAG "<tool_call>\n"

static const tcase cases[] = {
    {"reasoning then content", 1, "The user asks 2+2.\nThat is 4.\n</think>\n\nThe answer is **4**.",
     "The user asks 2+2.\nThat is 4.", "The answer is **4**.", {{0}}, {{0}}},

    {"reasoning, two calls, text between", 0,
     "<think>\nI need both files.\n</think>\n\nReading them now.\n\n"
     "<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/a.c\n</parameter>\n</function>\n</tool_call>\n"
     "Then the second:\n"
     "<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/b.c\n</parameter>\n<parameter=limit>\n20\n"
     "</parameter>\n</function>\n</tool_call>",
     "I need both files.", "Reading them now.Then the second:",
     {{"read_file", "{\"path\": \"src/a.c\"}", 1}, {"read_file", "{\"path\": \"src/b.c\", \"limit\": 20}", 1}},
     {{0}}},

    {"string value with tag look-alikes", 0,
     "<tool_call>\n<function=write_file>\n<parameter=path>\nt.xml\n</parameter>\n<parameter=content>\n"
     "\nif (a < b && c <= d) x = \"</parameter\";\n<tool_call> <function=x> </function>\n"
     "</parameter> not the end\n\t\"quoted\" \\ back <\n</para\n</parameter>\n</function>\n</tool_call>",
     "", "",
     {{"write_file",
       "{\"path\": \"t.xml\", \"content\": \"\\nif (a < b && c <= d) x = \\\"</parameter\\\";\\n<tool_call> "
       "<function=x> </function>\\n</parameter> not the end\\n\\t\\\"quoted\\\" \\\\ back <\\n</para\"}",
       1}},
     {{0}}},

    {"typed values", 0,
     "<tool_call>\n<function=typed>\n<parameter=n>\n42\n</parameter>\n<parameter=x>\n-3.5e2\n</parameter>\n"
     "<parameter=b>\ntrue\n</parameter>\n<parameter=o>\n{\"k\": [1, 2.50], \"s\": \"v\"}\n</parameter>\n"
     "<parameter=a>\n[\"x\", 1.0, null]\n</parameter>\n<parameter=opt>\nnull\n</parameter>\n"
     "<parameter=e>\n2\n</parameter>\n<parameter=u>\n7 days\n</parameter>\n</function>\n</tool_call>",
     "", "",
     {{"typed",
       "{\"n\": 42, \"x\": -350.0, \"b\": true, \"o\": {\"k\": [1, 2.5], \"s\": \"v\"}, \"a\": [\"x\", 1.0, null], "
       "\"opt\": null, \"e\": 2, \"u\": \"7 days\"}",
       1}},
     {{0}}},

    {"values that do not fit their type", 0,
     "<tool_call>\n<function=typed>\n<parameter=n>\nmany\n</parameter>\n<parameter=b>\n\"yes\"\n</parameter>\n"
     "<parameter=o>\n{oops\n</parameter>\n<parameter=u>\n\"q\"\n</parameter>\n</function>\n</tool_call>",
     "", "", {{"typed", "{\"n\": \"many\", \"b\": \"\\\"yes\\\"\", \"o\": \"{oops\", \"u\": \"\\\"q\\\"\"}", 1}},
     {{SPLASH_OUTPUT_ERR_VALUE, 0, 1, "many"},
      {SPLASH_OUTPUT_ERR_VALUE, 0, 1, "\"yes\""},
      {SPLASH_OUTPUT_ERR_VALUE, 0, 1, "{oops"}}},

    {"unknown parameter is a string", 0,
     "<tool_call>\n<function=read_file>\n<parameter=path>\nx\n</parameter>\n<parameter=mode>\n5\n</parameter>\n"
     "</function>\n</tool_call>",
     "", "", {{"read_file", "{\"path\": \"x\", \"mode\": \"5\"}", 1}}, {{0}}},

    {"unknown tool", 0,
     "<tool_call>\n<function=nope>\n<parameter=v>\n12\n</parameter>\n</function>\n</tool_call>", "", "",
     {{"nope", "{\"v\": \"12\"}", 1}}, {{SPLASH_OUTPUT_ERR_UNKNOWN_TOOL, 0, 1, "nope"}}},

    {"missing </function>", 0,
     "Let me look.\n\n<tool_call>\n<function=read_file>\n<parameter=path>\na.c\n</parameter>\n</tool_call>",
     "", "Let me look.", {{"read_file", "{\"path\": \"a.c\"}", 1}},
     {{SPLASH_OUTPUT_ERR_MALFORMED, 0, 1,
       "<tool_call>\n<function=read_file>\n<parameter=path>\na.c\n</parameter>\n</tool_call>"}}},

    {"truncated inside a string value", 1,
     "Write it.\n</think>\n\n<tool_call>\n<function=write_file>\n<parameter=path>\nout.txt\n</parameter>\n"
     "<parameter=content>\nhello\nwor",
     "Write it.", "", {{"write_file", "{\"path\": \"out.txt\", \"content\": \"hello\\nwor\"}", 0}},
     {{SPLASH_OUTPUT_ERR_TRUNCATED, 0, 0,
       "<tool_call>\n<function=write_file>\n<parameter=path>\nout.txt\n</parameter>\n<parameter=content>\n"
       "hello\nwor"}}},

    {"truncated inside a typed value", 0,
     "<tool_call>\n<function=typed>\n<parameter=n>\n4", "", "", {{"typed", "{\"n\": 4}", 0}},
     {{SPLASH_OUTPUT_ERR_TRUNCATED, 0, 0, "<tool_call>\n<function=typed>\n<parameter=n>\n4"}}},

    {"truncated inside the function tag", 0, "<tool_call>\n<function=read_fi", "", "", {{0}},
     {{SPLASH_OUTPUT_ERR_TRUNCATED, -1, 0, "<tool_call>\n<function=read_fi"}}},

    {"no think block", 0, "Hi!\nHow can I help?\n", "", "Hi!\nHow can I help?\n", {{0}}, {{0}}},

    {"tag look-alikes in content", 0,
     "Use <tool> or <tool_calls/>, a<b, <<, </tool_call>; <think> here is text, </think> too: <tool_call",
     "", "Use <tool> or <tool_calls/>, a<b, <<, </tool_call>; <think> here is text, </think> too: <tool_call",
     {{0}}, {{0}}},

    {"unicode", 0,
     "<think>\n\xc3\x9c" "ber \xe6\x80\x9d\xe8\x80\x83 \xf0\x9f\xa4\x94\n</think>\n\n"
     "Antwort: \xf0\x9f\x98\x80 \xe2\x9c\x93\n\n<tool_call>\n<function=write_file>\n<parameter=content>\n"
     "na\xc3\xafve \xe2\x80\x94 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x9a\x80\n</parameter>\n</function>\n"
     "</tool_call>",
     "\xc3\x9c" "ber \xe6\x80\x9d\xe8\x80\x83 \xf0\x9f\xa4\x94", "Antwort: \xf0\x9f\x98\x80 \xe2\x9c\x93",
     {{"write_file",
       "{\"content\": \"na\xc3\xafve \xe2\x80\x94 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x9a\x80\"}", 1}},
     {{0}}},

    {"invalid UTF-8 becomes U+FFFD", 0, "bad \xff byte \xe2\x82", "",
     "bad \xef\xbf\xbd byte \xef\xbf\xbd", {{0}}, {{0}}},

    {"not the XML layout", 0,
     "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {}}\n</tool_call>\nSorry.", "", "Sorry.", {{0}},
     {{SPLASH_OUTPUT_ERR_MALFORMED, -1, 0, "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {}}\n</tool_call>"}}},

    {"missing </tool_call>, then text and a call", 0,
     "<tool_call>\n<function=read_file>\n<parameter=path>\na\n</parameter>\n</function>\nDone.\n"
     "<tool_call>\n<function=flat>\n</function>\n<tool_call>\n<function=flat>\n</function>\n</tool_call>",
     "", "Done.",
     {{"read_file", "{\"path\": \"a\"}", 1}, {"flat", "{}", 1}, {"flat", "{}", 1}},
     {{SPLASH_OUTPUT_ERR_MALFORMED, 0, 1, "<tool_call>\n<function=read_file>\n<parameter=path>\na\n</parameter>\n</function>\n"},
      {SPLASH_OUTPUT_ERR_MALFORMED, 1, 1, "<tool_call>\n<function=flat>\n</function>\n"}}},

    {"reasoning cut off inside a tag", 1, "Hmm, let me\nthink about </thin", "Hmm, let me\nthink about </thin", "",
     {{0}}, {{0}}},

    {"<think> after a call is text", 0,
     "<tool_call>\n<function=flat>\n</function>\n</tool_call>\n<think>\nx\n</think>", "", "<think>\nx\n</think>",
     {{"flat", "{}", 1}}, {{0}}},

    {"empty think block", 0, "<think>\n\n</think>\n\nHello", "", "Hello", {{0}}, {{0}}},

    {"calls without newlines", 0,
     "<tool_call><function=flat></function></tool_call><tool_call><function= flat ><parameter=q>x y</parameter>"
     "</function></tool_call>",
     "", "", {{"flat", "{}", 1}, {"flat", "{\"q\": \"x y\"}", 1}}, {{0}}},

    {"garbage in a call body", 0,
     "<tool_call>\n<function=read_file>\noops\n<parameter=path>\na\n</parameter>\n</function>\n</tool_call>\nok",
     "", "ok", {{"read_file", "{}", 0}},
     {{SPLASH_OUTPUT_ERR_MALFORMED, 0, 0,
       "<tool_call>\n<function=read_file>\noops\n<parameter=path>\na\n</parameter>\n</function>\n</tool_call>"}}},

    /* A </parameter> not followed by <parameter=, </function> or </tool_call>
     * is value text, so garbage there runs the value to the end. */
    {"garbage after </parameter>", 0,
     "<tool_call>\n<function=read_file>\n<parameter=path>\na\n</parameter>\noops\n</function>\n</tool_call>\nok",
     "", "", {{"read_file", "{\"path\": \"a\\n</parameter>\\noops\\n</function>\\n</tool_call>\\nok\"}", 0}},
     {{SPLASH_OUTPUT_ERR_TRUNCATED, 0, 0,
       "<tool_call>\n<function=read_file>\n<parameter=path>\na\n</parameter>\noops\n</function>\n</tool_call>\nok"}}},
};

/* ---- recording events ---------------------------------------------------- */

typedef struct {
    strbuf log; /* the event sequence, adjacent text deltas merged */
    int last_kind, last_index;
    strbuf args[8];
    splash_output_result res;
    int bad_utf8, args_mismatch;
} rec;

static int is_text(splash_output_kind k) {
    return k == SPLASH_OUTPUT_REASONING || k == SPLASH_OUTPUT_CONTENT || k == SPLASH_OUTPUT_CALL_ARGS;
}

static void rec_cb(void *ctx, const splash_output_event *ev) {
    rec *r = ctx;
    splash_output_collect(&r->res, ev);
    if (is_text(ev->kind) && !json_utf8_valid(ev->text, ev->len)) r->bad_utf8 = 1;
    if (ev->index >= 8) r->args_mismatch = 1;
    else if (ev->kind == SPLASH_OUTPUT_CALL_ARGS) sb_append(&r->args[ev->index], ev->text, ev->len);
    else if (ev->kind == SPLASH_OUTPUT_CALL_END &&
             (r->args[ev->index].len != ev->len || memcmp(sb_cstr(&r->args[ev->index]), ev->text, ev->len)))
        r->args_mismatch = 1;
    if (is_text(ev->kind) && r->last_kind == (int)ev->kind && r->last_index == ev->index) {
        sb_append(&r->log, ev->text, ev->len);
        return;
    }
    sb_printf(&r->log, "\n[%d %d", (int)ev->kind, ev->index);
    if (ev->id) sb_printf(&r->log, " id=%s", ev->id);
    if (ev->name) sb_printf(&r->log, " name=%s", ev->name);
    if (ev->kind == SPLASH_OUTPUT_ERROR) sb_printf(&r->log, " err=%d usable=%d msg=%s", ev->error, ev->call_usable, ev->message);
    sb_puts(&r->log, "] ");
    sb_append(&r->log, ev->text, ev->len);
    r->last_kind = is_text(ev->kind) ? (int)ev->kind : -1;
    r->last_index = ev->index;
}

static void rec_free(rec *r) {
    sb_free(&r->log);
    for (int i = 0; i < 8; i++) sb_free(&r->args[i]);
    splash_output_result_free(&r->res);
}

/* Feeds text in pieces ending at cuts[0..ncuts) (the last piece runs to n). */
static char *run(const tcase *tc, const size_t *cuts, size_t ncuts, rec *r) {
    memset(r, 0, sizeof *r);
    r->last_kind = -1;
    splash_output_opts o = {.in_reasoning = tc->in_reasoning, .tools = tools, .id_seed = 42};
    splash_output_parser *p = splash_output_parser_new(&o, rec_cb, r);
    assert_non_null(p);
    size_t n = strlen(tc->text), at = 0;
    for (size_t i = 0; i <= ncuts; i++) {
        size_t end = i < ncuts ? cuts[i] : n;
        assert_int_equal(splash_output_parser_feed(p, tc->text + at, end - at), 0);
        at = end;
    }
    assert_int_equal(splash_output_parser_finish(p), 0);
    assert_int_equal(splash_output_parser_feed(p, "x", 1), SPLASH_E_INVALID);
    splash_output_parser_free(p);
    if (r->bad_utf8) fail_msg("%s: an event split a UTF-8 character", tc->label);
    if (r->args_mismatch) fail_msg("%s: argument fragments differ from CALL_END", tc->label);
    return (char *)sb_cstr(&r->log);
}

static void check_result(const tcase *tc, rec *r) {
    splash_output_result *res = &r->res;
    assert_int_equal(res->oom, 0);
    assert_string_equal(sb_cstr(&res->reasoning), tc->reasoning);
    assert_string_equal(sb_cstr(&res->content), tc->content);
    size_t nc = 0, ne = 0;
    while (nc < 4 && tc->calls[nc].name) nc++;
    while (ne < 4 && tc->errs[ne].code) ne++;
    if (res->ncalls != nc) fail_msg("%s: %zu calls, expected %zu", tc->label, res->ncalls, nc);
    for (size_t i = 0; i < nc; i++) {
        assert_string_equal(res->calls[i].name, tc->calls[i].name);
        assert_string_equal(res->calls[i].arguments, tc->calls[i].args);
        assert_int_equal(res->calls[i].complete, tc->calls[i].complete);
        char err[128];
        json_value *v = json_parse(res->calls[i].arguments, res->calls[i].arguments_len, 64, err, sizeof err);
        if (!v || v->type != JSON_OBJECT) fail_msg("%s: arguments are not a JSON object: %s", tc->label, err);
        json_free(v);
        assert_int_equal(strncmp(res->calls[i].id, "call_", 5), 0);
        assert_int_equal(strlen(res->calls[i].id), 5 + 24);
        for (size_t j = 0; j < i; j++) assert_string_not_equal(res->calls[i].id, res->calls[j].id);
    }
    if (res->nerrors != ne) {
        for (size_t i = 0; i < res->nerrors; i++) print_message("  error: %s\n", res->errors[i].message);
        fail_msg("%s: %zu errors, expected %zu", tc->label, res->nerrors, ne);
    }
    for (size_t i = 0; i < ne; i++) {
        assert_int_equal(res->errors[i].code, tc->errs[i].code);
        assert_int_equal(res->errors[i].index, tc->errs[i].index);
        assert_int_equal(res->errors[i].call_usable, tc->errs[i].usable);
        assert_true(res->errors[i].message && res->errors[i].message[0]);
        if (tc->errs[i].raw) assert_string_equal(res->errors[i].raw, tc->errs[i].raw);
    }
}

static void test_cases_every_split(void **state) {
    (void)state;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const tcase *tc = &cases[c];
        rec whole;
        char *want = run(tc, NULL, 0, &whole);
        check_result(tc, &whole);
        size_t n = strlen(tc->text);
        for (size_t k = 0; k <= n; k++) {
            rec r;
            char *got = run(tc, &k, 1, &r);
            if (strcmp(got, want)) fail_msg("%s: split at %zu:\n%s\n--- vs whole:\n%s", tc->label, k, got, want);
            rec_free(&r);
        }
        size_t *cuts = malloc((n + 1) * sizeof *cuts);
        for (size_t k = 0; k < n; k++) cuts[k] = k + 1;
        rec r;
        char *got = run(tc, cuts, n ? n - 1 : 0, &r);
        if (strcmp(got, want)) fail_msg("%s: byte at a time:\n%s\n--- vs whole:\n%s", tc->label, got, want);
        rec_free(&r);
        free(cuts);
        rec_free(&whole);
    }
}

/* ---- random mixes of tag fragments ------------------------------------- */

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static void put(char *text, size_t *len, const char *s) {
    size_t l = strlen(s);
    if (*len + l < 4000) memcpy(text + *len, s, l), *len += l;
}

/* Texts in the template's layout, with pieces dropped or swapped for noise at
 * random and cut anywhere: every way of feeding must agree, each begun call
 * must end exactly once, and its arguments must be one JSON object. */
static void test_random_fragments(void **state) {
    (void)state;
    static const char *const noise[] = {
        "<think>", "</think>", "<tool_call>", "</tool_call>", "<function=", ">", "</parameter>", "</function>",
        "\n", "\n\n", " ", "abc", "42", "{\"k\": [1]}", "<", "</", "<<", "\xc3\xa9", "\xe6\x97\xa5",
        "\xf0\x9f\x9a\x80", "\"", "\\", "\xff", "</para", "<tool", "\t", "null", "<parameter=u>",
    };
    static const char *const fns[] = {"read_file", "typed", "flat", "nope"};
    static const char *const params[] = {"path", "n", "o", "u", "limit", "zz"};
    const size_t nnoise = sizeof noise / sizeof noise[0];
    uint64_t seed = 12345;
    char text[4096];
    size_t ncalls = 0, ncomplete = 0;
    for (int t = 0; t < 400; t++) {
        size_t len = 0;
#define MAYBE(s) (lcg(&seed) % 16 ? (s) : noise[lcg(&seed) % nnoise]) /* 1 in 16: noise instead */
#define NOISE() for (int k_ = (int)(lcg(&seed) % 3); k_ > 0; k_--) put(text, &len, noise[lcg(&seed) % nnoise])
        if (lcg(&seed) % 2) put(text, &len, MAYBE("<think>\n"));
        NOISE();
        put(text, &len, MAYBE("\n</think>\n\n"));
        NOISE();
        for (int c = (int)(lcg(&seed) % 4); c > 0; c--) {
            put(text, &len, MAYBE("\n\n<tool_call>\n<function="));
            put(text, &len, fns[lcg(&seed) % 4]);
            put(text, &len, MAYBE(">\n"));
            for (int q = (int)(lcg(&seed) % 3); q > 0; q--) {
                put(text, &len, MAYBE("<parameter="));
                put(text, &len, params[lcg(&seed) % 6]);
                put(text, &len, MAYBE(">\n"));
                NOISE();
                put(text, &len, MAYBE("\n</parameter>\n"));
            }
            put(text, &len, MAYBE("</function>\n"));
            put(text, &len, MAYBE("</tool_call>"));
        }
        if (lcg(&seed) % 4 == 0) len = lcg(&seed) % (len + 1); /* cut anywhere */
#undef MAYBE
#undef NOISE
        text[len] = 0;
        tcase tc = {.label = text, .in_reasoning = (int)(lcg(&seed) & 1), .text = text};
        rec whole;
        char *want = run(&tc, NULL, 0, &whole);
        ncalls += whole.res.ncalls;
        for (size_t i = 0; i < whole.res.ncalls; i++) ncomplete += whole.res.calls[i].complete;
        for (size_t i = 0; i < whole.res.ncalls; i++) {
            char err[128];
            json_value *v = json_parse(whole.res.calls[i].arguments ? whole.res.calls[i].arguments : "",
                                       whole.res.calls[i].arguments_len, 64, err, sizeof err);
            if (!v || v->type != JSON_OBJECT) fail_msg("[%s]: call %zu arguments: %s", text, i, err);
            json_free(v);
        }
        int begins = 0, ends = 0;
        for (const char *q = want; (q = strstr(q, "\n[3 ")); q++) begins++;
        for (const char *q = want; (q = strstr(q, "\n[5 ")); q++) ends++;
        if (begins != ends || (size_t)begins != whole.res.ncalls) fail_msg("[%s]: %d begins, %d ends", text, begins, ends);
        size_t cuts[4];
        for (int r = 0; r < 4; r++) {
            size_t nc = 1 + lcg(&seed) % 4;
            for (size_t i = 0; i < nc; i++) cuts[i] = lcg(&seed) % (len + 1);
            for (size_t i = 1; i < nc; i++) /* sort */
                for (size_t j = i; j > 0 && cuts[j - 1] > cuts[j]; j--) {
                    size_t x = cuts[j];
                    cuts[j] = cuts[j - 1];
                    cuts[j - 1] = x;
                }
            rec rr;
            char *got = run(&tc, cuts, nc, &rr);
            if (strcmp(got, want)) fail_msg("[%s]: split differs:\n%s\n--- vs whole:\n%s", text, got, want);
            rec_free(&rr);
        }
        rec_free(&whole);
    }
    /* the generator must reach both well-formed and broken calls */
    if (ncomplete < 200 || ncalls - ncomplete < 50) fail_msg("%zu calls, %zu complete", ncalls, ncomplete);
}

/* ---- streaming promptness ------------------------------------------------ */

typedef struct {
    strbuf content, reasoning, args;
    int begins, ends;
} live;

static void live_cb(void *ctx, const splash_output_event *ev) {
    live *l = ctx;
    if (ev->kind == SPLASH_OUTPUT_CONTENT) sb_append(&l->content, ev->text, ev->len);
    if (ev->kind == SPLASH_OUTPUT_REASONING) sb_append(&l->reasoning, ev->text, ev->len);
    if (ev->kind == SPLASH_OUTPUT_CALL_ARGS) sb_append(&l->args, ev->text, ev->len);
    if (ev->kind == SPLASH_OUTPUT_CALL_BEGIN) l->begins++;
    if (ev->kind == SPLASH_OUTPUT_CALL_END) l->ends++;
}

static void feed_str(splash_output_parser *p, const char *s) {
    assert_int_equal(splash_output_parser_feed(p, s, strlen(s)), 0);
}

static void test_emits_as_soon_as_certain(void **state) {
    (void)state;
    live l = {0};
    splash_output_opts o = {.in_reasoning = 1, .tools = tools};
    splash_output_parser *p = splash_output_parser_new(&o, live_cb, &l);
    feed_str(p, "abc\n");
    assert_string_equal(sb_cstr(&l.reasoning), "abc"); /* the '\n' may be the template's */
    feed_str(p, "d </th");
    assert_string_equal(sb_cstr(&l.reasoning), "abc\nd ");
    feed_str(p, "ink>\n\nHello <to");
    assert_string_equal(sb_cstr(&l.content), "Hello ");
    feed_str(p, "ol_");
    assert_string_equal(sb_cstr(&l.content), "Hello ");
    feed_str(p, "x> \xe2\x9c");
    assert_string_equal(sb_cstr(&l.content), "Hello <tool_x> "); /* half a character waits */
    feed_str(p, "\x93\n\n<tool_call>\n<function=write_file>\n<parameter=content>\nline1\nli");
    assert_string_equal(sb_cstr(&l.content), "Hello <tool_x> \xe2\x9c\x93");
    assert_int_equal(l.begins, 1);
    assert_string_equal(sb_cstr(&l.args), "{\"content\": \"line1\\nli");
    feed_str(p, "ne2\n</param");
    assert_string_equal(sb_cstr(&l.args), "{\"content\": \"line1\\nline2");
    feed_str(p, "eter>\n</func"); /* a </parameter> counts once what follows confirms it */
    assert_string_equal(sb_cstr(&l.args), "{\"content\": \"line1\\nline2");
    feed_str(p, "tion>");
    assert_string_equal(sb_cstr(&l.args), "{\"content\": \"line1\\nline2\"");
    assert_int_equal(l.ends, 0);
    feed_str(p, "\n</tool_call>");
    assert_string_equal(sb_cstr(&l.args), "{\"content\": \"line1\\nline2\"}");
    assert_int_equal(l.ends, 1);
    assert_int_equal(splash_output_parser_finish(p), 0);
    splash_output_parser_free(p);
    sb_free(&l.content);
    sb_free(&l.reasoning);
    sb_free(&l.args);
}

static void test_ids(void **state) {
    (void)state;
    const char *text = "<tool_call>\n<function=flat>\n</function>\n</tool_call>";
    splash_output_opts o = {.tools = tools, .id_prefix = "toolu_"};
    splash_output_result a, b;
    assert_int_equal(splash_output_parse(text, strlen(text), &o, &a), 0);
    assert_int_equal(splash_output_parse(text, strlen(text), &o, &b), 0);
    assert_int_equal(a.ncalls, 1);
    assert_int_equal(strncmp(a.calls[0].id, "toolu_", 6), 0);
    assert_int_equal(strlen(a.calls[0].id), 6 + 24);
    assert_string_not_equal(a.calls[0].id, b.calls[0].id); /* random seeds differ */
    splash_output_result_free(&a);
    splash_output_result_free(&b);
}

static int setup(void **state) {
    (void)state;
    char err[128];
    tools = json_parse(TOOLS_JSON, strlen(TOOLS_JSON), 64, err, sizeof err);
    if (!tools) fprintf(stderr, "tools: %s\n", err);
    return tools ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    json_free(tools);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases_every_split),
        cmocka_unit_test(test_random_fragments),
        cmocka_unit_test(test_emits_as_soon_as_certain),
        cmocka_unit_test(test_ids),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
