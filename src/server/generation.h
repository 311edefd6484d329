/* generation.h - what every generating API (Chat Completions, completions,
 * Anthropic Messages, Responses) shares between parsing its request and
 * streaming its reply: ids, the sampling parameters and stop strings read
 * from the request, the prompt -> tokens -> gen path with the context check
 * and the test hook, the submit and its status mapping, the status of a gen
 * that failed, and the sealed reasoning that Anthropic signatures and
 * Responses `encrypted_content` carry.
 *
 * Each API keeps its own request shape and reply format; only the steps that
 * are the same logic everywhere live here, so that one fix reaches all APIs.
 * Every function that can fail fills the srv_reply with an OpenAI-shaped
 * error (srv_error) and returns -1; Anthropic paths convert that shape at the
 * end (srv_anthropic_error_convert).
 */
#ifndef SPLASH_SERVER_GENERATION_H
#define SPLASH_SERVER_GENERATION_H

#include <stdint.h>

#include "server/server.h"
#include "text/output_parser.h"

uint64_t srv_random64(void);
/* prefix + 24 [A-Za-z0-9]; out must hold strlen(prefix) + 25 bytes. */
void srv_make_id(char *out, const char *prefix);

/* A number / integer member of req.  Absent or null: 0 (out untouched).
 * Wrong type: -1 with a 400 naming it.  srv_int_param returns 1 when set. */
int srv_number_param(const json_value *req, const char *name, double *out, srv_reply *r);
int srv_int_param(const json_value *req, const char *name, int64_t *out, srv_reply *r);

/* temperature (default 1.0), top_p (0.95), top_k (20), min_p, the three
 * penalties and seed (random when absent) from req into g->sp, checked by the
 * sampling module (a 400 whose param names the bad one). */
int srv_sampling_params(const json_value *req, splash_gen *g, srv_reply *r);
/* A stop string or an array of at most SPLASH_MAX_STOP into g->stop;
 * param names the member in errors ("stop", "stop_sequences"). */
int srv_stop_strings(const json_value *s, const char *param, splash_gen *g, srv_reply *r);

/* The test hook "test_echo_prompt": true (serve --test-hooks): the reply
 * carries the rendered prompt as "test_prompt".  1 asked, 0 not, -1 with a
 * 400 when the server runs without --test-hooks. */
int srv_test_echo_prompt(const srv_request *q, const json_value *req, srv_reply *r);

/* The SSE keep-alive interval (--keepalive-ms, default 2000). */
int srv_keepalive_ms(const srv_server *s);

/* Prompt progress of a gen (llama.cpp's `prompt_progress`): total = the
 * prompt's tokens, cache = those reused from the prefix cache, processed =
 * those in the KV so far (cached included; total once the prompt is read),
 * time_ms = since the gen entered a lane (0 while queued). */
typedef struct srv_progress {
    int state; /* SPLASH_GEN_* */
    int total, cache, processed;
    double time_ms;
} srv_progress;

/* Waits up to timeout_ms until more than `processed` prompt tokens are in,
 * the gen decodes or ends, or text is waiting; fills *p either way. */
void srv_gen_progress_wait(splash_gen *g, int processed, int timeout_ms, srv_progress *p);

/* Tokens of a text (no special tokens), 0 on failure. */
int srv_count_tokens(const srv_server *s, const char *text, size_t n);

/* The HTTP status and message for a gen that ended with ERROR or CANCELLED
 * (503 while the server stops, else 500). */
void srv_gen_error_status(const splash_gen_take *t, int *status, const char **msg);

/* 1 with r filled (the status of srv_gen_error_status, Retry-After on 503)
 * when a gen ended with ERROR or CANCELLED, else 0. */
int srv_gen_failed_reply(const splash_gen_take *t, srv_reply *r);
/* The same for an OpenAI-style stream: appends `data: {error}` and
 * `data: [DONE]` to out and returns 1, else 0. */
int srv_gen_failed_sse(const splash_gen_take *t, strbuf *out);

/* Waits for the whole output of a gen (non-streaming replies); cancels it
 * when the client goes away (srv_client_gone). */
void srv_gen_collect(splash_gen *g, strbuf *text, splash_gen_take *t);

typedef struct srv_gen_setup {
    /* in */
    int64_t max_tokens;    /* -1: the rest of the context */
    int clamp;             /* 1: a max_tokens beyond the room left is lowered to it
                              (Anthropic); 0: a 400 context_length_exceeded */
    const char *param;     /* the request member named in context errors ("messages") */
    const char *prefill;   /* text appended after the rendered prompt (the start of the
                              model's turn, e.g. a forced tool call), or NULL */
    /* out */
    int in_reasoning;      /* the prompt (without prefill) ends in "<think>\n" */
    int clamped;           /* max_tokens was lowered to fit the context */
    strbuf prompt;         /* the prompt text (prefill included); srv_gen_setup_free */
} srv_gen_setup;

/* Renders the template input `in` (splash_chat_template_render's request),
 * tokenizes it, checks it against the context and fills g->prompt,
 * g->n_prompt, g->max_tokens and, from req's "test_script" (a 400 without
 * --test-hooks), g->script.  -1 with r filled on error. */
int srv_gen_prepare(const srv_request *q, const json_value *req, const json_value *in, splash_gen *g,
                    srv_gen_setup *s, srv_reply *r);
void srv_gen_setup_free(srv_gen_setup *s);
/* Queues g: 429 when the queue is full, 503 when stopping, 400 when it can
 * never fit the pool. */
int srv_gen_submit(const srv_request *q, splash_gen *g, srv_reply *r);

/* Which stop string ended a gen that finished with SPLASH_FINISH_STOP and
 * produced text_len bytes of text: its index in g->stop, or -1 when a stop
 * token ended it (the engine records every token's text end, so a cut shows
 * as recorded text beyond what was delivered). */
int srv_gen_stop_index(const srv_server *s, splash_gen *g, size_t text_len);

/* ---- the template's input from an Anthropic or Responses history ----------
 * Both APIs send a history of typed blocks / items; the template wants Chat
 * messages.  srv_convo folds them in order: leading system texts merge into
 * one system message ("\n\n" between them; a system text after the first
 * other message becomes a user turn, since the template allows a system
 * message only first), text joins the open user or assistant message,
 * reasoning opens a new assistant turn unless the open one is still empty,
 * tool calls join the open assistant turn, a tool result is a tool message.
 * Tool-call arguments are objects, as the template wants them. */
typedef struct srv_convo {
    json_value *msgs;      /* the messages after the system one */
    strbuf system;
    int n_system;
    json_value *open;      /* the user or assistant message still being filled (in msgs), or NULL */
    int open_assistant;
} srv_convo;

void srv_convo_init(srv_convo *c);
void srv_convo_free(srv_convo *c);
void srv_convo_system(srv_convo *c, const char *text, size_t n);
void srv_convo_user(srv_convo *c, const char *text, size_t n);
void srv_convo_reasoning(srv_convo *c, const char *text, size_t n);
void srv_convo_assistant(srv_convo *c, const char *text, size_t n);
void srv_convo_tool_call(srv_convo *c, const char *id, const char *name, json_value *args /* taken */);
void srv_convo_tool_result(srv_convo *c, const char *call_id, const char *text, size_t n);
/* Ends the open message: the next text starts a new one. */
void srv_convo_break(srv_convo *c);
/* The last message when it is an assistant turn with text only (an
 * Anthropic prefill), removed from the history: its text, else NULL.
 * free() it. */
char *srv_convo_take_prefill(srv_convo *c);
/* Moves the history into a new template input object {"messages": [...]}. */
json_value *srv_convo_input(srv_convo *c);

/* Appends {"type":"function","function":{"name","description"?,"parameters"?}}
 * (the Chat shape, so that the same tools render the same prompt whichever
 * API sent them) to tools. */
void srv_tool_add(json_value *tools, const char *name, const json_value *description, const json_value *parameters);
/* The start of a tool call written into the model's turn to force a call
 * (tool_choice any / named): "<tool_call>\n<function=" and, with a name,
 * "NAME>\n".  Grammar-enforced decoding does not exist yet; this makes the
 * turn begin with a call, the model writes the rest. */
char *srv_forced_call_prefill(const char *name);
/* 1 when a tools array made by srv_tool_add has a function of that name. */
int srv_tools_has(const json_value *tools, const char *name);

/* ---- a turn read through the output parser (Anthropic, Responses) ---------
 * The gen's text goes through the output parser, whose callback builds the
 * API's blocks or items; the same steps serve the whole and the streamed
 * reply. */
typedef struct srv_turn {
    splash_gen *g;                /* owned (one reference) */
    splash_output_parser *parser; /* owned */
    size_t text_len;              /* text bytes taken from the gen so far */
    const char *fed;              /* borrowed: parsed before the gen's first text */
} srv_turn;

enum { SRV_TURN_IDLE, SRV_TURN_MORE, SRV_TURN_DONE, SRV_TURN_FAILED };

/* Creates the parser.  `fed` (borrowed, or NULL) is parsed before the gen's
 * first text, at the first step: the start of a forced call, which is part of
 * the turn though the prompt holds it.  -1 when out of memory. */
int srv_turn_parser(srv_turn *t, const splash_output_opts *o, splash_output_cb cb, void *ctx, const char *fed);
/* Streaming: waits up to timeout_ms and feeds what came to the parser.
 * SRV_TURN_IDLE: nothing came (send a keep-alive); MORE: text was parsed;
 * DONE: the gen ended well and the parser is finished; FAILED: the gen ended
 * with an error (srv_gen_error_status on *take says what). */
int srv_turn_step(srv_turn *t, int timeout_ms, splash_gen_take *take);
/* Whole reply: waits for the end (cancelling the gen if the client goes
 * away), parses everything and finishes the parser.  -1 with r filled when
 * the gen failed. */
int srv_turn_whole(srv_turn *t, splash_gen_take *take, srv_reply *r);
void srv_turn_free(srv_turn *t);

/* One SSE event "event: TYPE\ndata: " ... the caller writes the JSON and
 * "\n\n". */
void srv_sse_event(strbuf *out, const char *type);

/* Sealed reasoning: the reasoning text of a turn, made opaque and checkable,
 * so that a client that only hands back what it was given (an Anthropic
 * thinking `signature`, a redacted_thinking `data`, a Responses
 * `encrypted_content`) lets the server re-render exactly the text the model
 * wrote.  "sr1_" + 32 hex digits of SHA-256("splash-reasoning\n" + text) +
 * "_" + base64(text).  This is an integrity check against truncation and
 * edits by clients, not a secret: anyone may send any reasoning in plain text
 * anyway. */
void srv_reasoning_seal(const char *text, size_t n, strbuf *out);
/* 0 and the text appended to out when sealed is a valid seal, else -1. */
int srv_reasoning_unseal(const char *sealed, size_t n, strbuf *out);

#endif
