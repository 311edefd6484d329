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

/* Tokens of a text (no special tokens), 0 on failure. */
int srv_count_tokens(const srv_server *s, const char *text, size_t n);

/* The HTTP status and message for a gen that ended with ERROR or CANCELLED
 * (503 while the server stops, else 500). */
void srv_gen_error_status(const splash_gen_take *t, int *status, const char **msg);

/* Waits for the whole output of a gen (non-streaming replies). */
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
