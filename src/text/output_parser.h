/* output_parser.h - generated text -> reasoning, content and tool calls, streaming.
 *
 * The model writes one assistant turn in the layout of the Qwen3.5/3.6 chat
 * template (../shared/reference/qwen3.6-chat_template.jinja):
 *
 *     <think>\nREASONING\n</think>\n\nCONTENT\n\n<tool_call>\n<function=NAME>\n
 *     <parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>
 *
 * This parser turns that text, fed in deltas split anywhere (inside a tag,
 * inside a multibyte character), into events that map one to one onto the
 * three APIs' streams: reasoning deltas (Chat `reasoning_content`, Anthropic
 * `thinking_delta`, Responses reasoning text), content deltas (`content`,
 * `text_delta`, `output_text.delta`), and tool calls as begin (index, id,
 * name) / argument fragments (`function.arguments`, `input_json_delta`,
 * `function_call_arguments.delta`) / end (with the whole arguments string, for
 * the `.done` events and non-streaming replies).  The concatenated argument
 * fragments of a call are always one valid JSON object, even for a malformed or
 * truncated call.  docs/output-parser.md has the exact rules; the short form:
 *
 * - Text is emitted as soon as it cannot be the start of a tag; only the
 *   longest suffix that is a prefix of a tag that matters in the current state
 *   is held back (plus the newlines the template's layout owns, see below).
 *   No partial tag ever reaches content.  Event text always ends on a UTF-8
 *   character boundary; invalid UTF-8 bytes become U+FFFD.
 * - Whitespace the template writes around tags is dropped, so that re-rendering
 *   the parsed turn gives back the same bytes: all '\n' at the start and end
 *   of reasoning, all '\n' right after </think>, all '\n' right before
 *   <tool_call> and right after </tool_call>, and one '\n' at the start and one
 *   at the end of each parameter value.
 * - Parameter values are typed by the tool's JSON schema: string parameters
 *   (and unknown tools / unknown parameters) are streamed as a JSON string as
 *   the bytes arrive; other types are parsed as JSON when the parameter closes.
 * - Problems are events, never silent: an unknown tool name, a value that is
 *   not of its declared type (kept as a string), a malformed or truncated call
 *   (the raw text it covered is carried in the event).
 *
 * Lifetime: one parser per generation.  feed() any number of times, then
 * finish() once, then free().  opts->tools is borrowed and must outlive the
 * parser.  Event pointers are valid only during the callback.
 */
#ifndef SPLASH_OUTPUT_PARSER_H
#define SPLASH_OUTPUT_PARSER_H

#include <stddef.h>
#include <stdint.h>

#include "base/json.h"

typedef enum splash_output_kind {
    SPLASH_OUTPUT_REASONING,     /* text: a reasoning delta */
    SPLASH_OUTPUT_REASONING_END, /* the reasoning block closed (sent only after
                                    at least one reasoning delta) */
    SPLASH_OUTPUT_CONTENT,       /* text: a content delta */
    SPLASH_OUTPUT_CALL_BEGIN,    /* index, id, name */
    SPLASH_OUTPUT_CALL_ARGS,     /* index, text: a fragment of the arguments JSON */
    SPLASH_OUTPUT_CALL_END,      /* index, id, name, text: the whole arguments JSON */
    SPLASH_OUTPUT_ERROR,         /* error, index (-1: no call began), message,
                                    text: the raw output it covers, call_usable */
} splash_output_kind;

typedef enum splash_output_err {
    SPLASH_OUTPUT_ERR_NONE = 0,
    SPLASH_OUTPUT_ERR_UNKNOWN_TOOL, /* name not in opts->tools; the call is still
                                       emitted (all values as strings). raw: the name */
    SPLASH_OUTPUT_ERR_VALUE,        /* a value did not parse as its schema type and
                                       was kept as a string. raw: the value */
    SPLASH_OUTPUT_ERR_MALFORMED,    /* the call's layout is broken. raw: the call's text */
    SPLASH_OUTPUT_ERR_TRUNCATED,    /* the output ended inside a call. raw: the call's text */
} splash_output_err;

typedef struct splash_output_event {
    splash_output_kind kind;
    int index;         /* tool call index (0, 1, ...), or -1 */
    const char *text;  /* delta / fragment / arguments / raw text; not NUL-safe: use len */
    size_t len;
    const char *id;    /* CALL_BEGIN, CALL_END */
    const char *name;  /* CALL_BEGIN, CALL_END */
    splash_output_err error; /* ERROR */
    const char *message;     /* ERROR: one sentence */
    int call_usable;   /* ERROR with index >= 0: 1 if the call's name and every
                          parameter were read completely (it can still be run),
                          0 if it was cut short.  An ERROR always comes before
                          the CALL_END of its call. */
} splash_output_event;

typedef void (*splash_output_cb)(void *ctx, const splash_output_event *ev);

typedef struct splash_output_opts {
    /* 1 when the generation prompt already opened the think block (the
     * template's "<think>\n" generation prompt): the output starts as reasoning.
     * With 0, a <think> as the first non-newline text of the output opens one. */
    int in_reasoning;
    /* The request's tools, a JSON array (or NULL: no tools, every call name is
     * unknown).  Each element may be any of the three APIs' forms:
     *   {"type":"function","function":{"name","parameters"}}   Chat Completions
     *   {"type":"function","name","parameters"}                 Responses
     *   {"name","input_schema"}                                 Anthropic
     * Only the name and parameters.properties.P (type, anyOf/oneOf, enum,
     * const) are read.  Borrowed: must outlive the parser. */
    const json_value *tools;
    const char *id_prefix; /* call ids are id_prefix + 24 [A-Za-z0-9]; NULL: "call_" */
    uint64_t id_seed;      /* 0: random; otherwise ids are a function of the seed (tests) */
} splash_output_opts;

typedef struct splash_output_parser splash_output_parser;

/* Returns NULL on allocation failure.  opts may be NULL (all defaults). */
splash_output_parser *splash_output_parser_new(const splash_output_opts *opts, splash_output_cb cb, void *ctx);
/* Feeds n bytes (any split).  Events for everything that became certain are
 * delivered before it returns.  0, SPLASH_E_NOMEM (the parser is then
 * unusable), or SPLASH_E_INVALID after finish(). */
int splash_output_parser_feed(splash_output_parser *p, const char *text, size_t n);
/* End of output: flushes held text, closes reasoning, reports a call left
 * open as SPLASH_OUTPUT_ERR_TRUNCATED (and still closes it). */
int splash_output_parser_finish(splash_output_parser *p);
void splash_output_parser_free(splash_output_parser *p);

/* ---- Whole-text convenience (built on the streaming parser) -------------- */

typedef struct splash_output_call {
    char *id;
    char *name;
    char *arguments; /* a JSON object, e.g. {"path": "a.c", "n": 3} */
    size_t arguments_len;
    int complete;    /* 0 if an error with call_usable == 0 names this call */
} splash_output_call;

typedef struct splash_output_error {
    splash_output_err code;
    int index;
    int call_usable;
    char *message;
    char *raw;
    size_t raw_len;
} splash_output_error;

typedef struct splash_output_result {
    strbuf reasoning; /* use sb_cstr(); text of all reasoning deltas */
    strbuf content;   /* use sb_cstr(); text around calls is concatenated */
    splash_output_call *calls; /* calls[i] is the call with index i */
    size_t ncalls, calls_cap;
    splash_output_error *errors;
    size_t nerrors, errors_cap;
    int oom;          /* an allocation failed while collecting */
} splash_output_result;

/* Parses a whole output.  0 or SPLASH_E_NOMEM; free res with
 * splash_output_result_free() in either case. */
int splash_output_parse(const char *text, size_t n, const splash_output_opts *opts, splash_output_result *res);
void splash_output_result_free(splash_output_result *res);

/* A callback that appends every event to a splash_output_result (ctx, zeroed
 * or freed before first use), for callers that stream and also need the whole
 * turn at the end. */
void splash_output_collect(void *ctx, const splash_output_event *ev);

#endif
