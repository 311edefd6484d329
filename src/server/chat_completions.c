/* chat_completions.c - POST /v1/chat/completions (OpenAI Chat Completions).
 *
 * A request goes: JSON -> checks of every parameter (a 400 naming the first
 * bad or unsupported one; nothing is silently ignored) -> the template's input
 * (developer -> system, tool-call argument strings parsed into objects) ->
 * the native chat template -> tokens -> a gen for the engine.  The engine
 * returns text; the output parser (text/output_parser.h) turns it into
 * reasoning, content and tool calls, which become the reply or, streaming,
 * `chat.completion.chunk` deltas as docs/output-parser.md maps them.
 *
 * Two figures come from the engine's per-token records (splash_gen_token)
 * rather than from the text: logprobs (one entry per generated token, see
 * logprobs.h) and usage.reasoning_tokens (the tokens up to the one that
 * completes "</think>" in the raw output, found by scanning it while the
 * reasoning is open).
 *
 * Streaming with "return_progress": true (llama.cpp's extension): while the
 * prompt is read, chunks whose delta is {"role":"assistant","content":null}
 * carry "prompt_progress": {total, cache, processed, time_ms}, one per
 * prefill chunk the engine finishes, the last with processed == total.
 * Without it, `: keep-alive` comments every keep-alive interval until the
 * first token.
 *
 * The test hook: when the server runs with --test-hooks, a request may carry
 * "test_script": "<text>" - its tokens are emitted instead of sampled, through
 * the same decode cycle, detokenizer, stop handling, parser and chunks (then a
 * stop token).  It exists only so tests can produce tool calls and reasoning
 * with a random model; without --test-hooks the field is a 400.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/generation.h"
#include "server/logprobs.h"
#include "server/server.h"
#include "text/chat_template.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

/* ---- the template's input ------------------------------------------------------ */

/* Every level but none thinks as usual: the model has no effort control yet. */
int srv_reasoning_effort_valid(const char *effort) {
    static const char *ok[] = {"none", "minimal", "low", "medium", "high", "xhigh", "max"};
    for (size_t k = 0; k < sizeof ok / sizeof ok[0]; k++)
        if (!strcmp(effort, ok[k])) return 1;
    return 0;
}

/* A member that must be a string (or absent / null); -1 with r filled. */
static int string_member(const json_value *obj, const char *key, const char *param, srv_reply *r) {
    const json_value *v = json_get(obj, key);
    if (v && v->type != JSON_NULL && v->type != JSON_STRING) {
        srv_error(r, 400, param, "invalid_type", "%s must be a string", param);
        return -1;
    }
    return 0;
}

json_value *srv_chat_template_input(const srv_request *q, const json_value *req, srv_reply *r) {
    const json_value *msgs = json_get(req, "messages");
    if (!msgs || msgs->type != JSON_ARRAY || !msgs->count) {
        srv_error(r, 400, "messages", "invalid_value", "messages must be a non-empty array");
        return NULL;
    }
    json_value *in = json_new(JSON_OBJECT);
    json_value *out = json_new(JSON_ARRAY);
    json_obj_set(in, "messages", out);
    char param[96];
    for (size_t i = 0; i < msgs->count; i++) {
        const json_value *m = msgs->items[i];
        const char *role = json_get_string(m, "role", NULL);
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!m || m->type != JSON_OBJECT || !role) {
            srv_error(r, 400, param, "invalid_value", "%s must be a string", param);
            goto fail;
        }
        if (strcmp(role, "system") && strcmp(role, "developer") && strcmp(role, "user") && strcmp(role, "assistant") &&
            strcmp(role, "tool")) {
            srv_error(r, 400, param, "invalid_value", "%s \"%.40s\" is not one of system, developer, user, assistant, tool",
                      param, role);
            goto fail;
        }
        static const char *strings[] = {"name", "tool_call_id", "reasoning_content"};
        for (size_t k = 0; k < sizeof strings / sizeof strings[0]; k++) {
            snprintf(param, sizeof param, "messages[%zu].%s", i, strings[k]);
            if (string_member(m, strings[k], param, r)) goto fail;
        }
        json_value *c = json_clone(m);
        json_arr_push(out, c);
        if (!strcmp(role, "developer")) json_obj_set(c, "role", json_new_string("system"));
        const json_value *content = json_get(m, "content");
        snprintf(param, sizeof param, "messages[%zu].content", i);
        if (content && content->type == JSON_ARRAY) {
            for (size_t k = 0; k < content->count; k++) {
                const char *t = json_get_string(content->items[k], "type", NULL);
                if (!t || (strcmp(t, "text") && strcmp(t, "input_text"))) {
                    srv_error(r, 400, param, "unsupported_content",
                              "%s[%zu]: content type \"%.40s\" is not supported (text only: this model has no vision)",
                              param, k, t ? t : "(none)");
                    goto fail;
                }
                if (!json_string(json_get(content->items[k], "text"))) {
                    srv_error(r, 400, param, "invalid_type", "%s[%zu].text must be a string", param, k);
                    goto fail;
                }
            }
        } else if (content && content->type != JSON_STRING && content->type != JSON_NULL) {
            srv_error(r, 400, param, "invalid_type", "%s must be a string, an array of parts or null", param);
            goto fail;
        }
        const json_value *tcs = json_get(m, "tool_calls");
        if (tcs && tcs->type != JSON_NULL) {
            snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
            if (tcs->type != JSON_ARRAY) {
                srv_error(r, 400, param, "invalid_type", "%s must be an array", param);
                goto fail;
            }
            json_value *ctcs = json_get(c, "tool_calls");
            for (size_t k = 0; k < ctcs->count; k++) {
                json_value *fn = json_get(ctcs->items[k], "function");
                json_value *args = json_get(fn, "arguments");
                if (!fn || !json_string(json_get(fn, "name"))) {
                    srv_error(r, 400, param, "invalid_value", "%s[%zu].function.name must be a string", param, k);
                    goto fail;
                }
                if (args && args->type != JSON_STRING && args->type != JSON_OBJECT) {
                    srv_error(r, 400, param, "invalid_type", "%s[%zu].function.arguments must be a JSON string", param, k);
                    goto fail;
                }
                if (args && args->type == JSON_STRING) {
                    char msg[200];
                    json_value *pa = json_parse(args->str, args->len, JSON_DEFAULT_MAX_DEPTH, msg, sizeof msg);
                    if (!pa || pa->type != JSON_OBJECT) {
                        json_free(pa);
                        srv_error(r, 400, param, "invalid_value", "%s[%zu].function.arguments is not a JSON object%s%s",
                                  param, k, pa ? "" : ": ", pa ? "" : msg);
                        goto fail;
                    }
                    json_obj_set(fn, "arguments", pa);
                } else if (!args) {
                    json_obj_set(fn, "arguments", json_new(JSON_OBJECT));
                }
            }
        }
    }
    const json_value *tools = json_get(req, "tools");
    const char *tc = json_get_string(req, "tool_choice", NULL);
    const json_value *tcv = json_get(req, "tool_choice");
    if (tcv && tcv->type != JSON_NULL && (!tc || (strcmp(tc, "auto") && strcmp(tc, "none")))) {
        srv_error(r, 400, "tool_choice", "unsupported_value",
                  "tool_choice: only \"auto\" and \"none\" are supported (required / named tools need grammar-enforced "
                  "decoding, not implemented yet)");
        goto fail;
    }
    if (tools && tools->type != JSON_NULL) {
        if (tools->type != JSON_ARRAY) {
            srv_error(r, 400, "tools", "invalid_type", "tools must be an array");
            goto fail;
        }
        for (size_t k = 0; k < tools->count; k++) {
            const json_value *fn = json_get(tools->items[k], "function");
            if (strcmp(json_get_string(tools->items[k], "type", ""), "function") || !json_string(json_get(fn, "name"))) {
                srv_error(r, 400, "tools", "invalid_value", "tools[%zu] must be {\"type\":\"function\",\"function\":{\"name\",...}}", k);
                goto fail;
            }
            const json_value *sv = json_get(fn, "strict");
            if (sv && sv->type != JSON_NULL && !json_is_bool(sv)) {
                srv_error(r, 400, "tools", "invalid_type", "tools[%zu].function.strict must be a boolean", k);
                goto fail;
            }
            if (sv && json_get_bool(fn, "strict", 0)) {
                srv_error(r, 400, "tools", "unsupported_value", "tools[%zu].function.strict: strict tools are not supported yet", k);
                goto fail;
            }
        }
        if (tools->count && !(tc && !strcmp(tc, "none"))) json_obj_set(in, "tools", json_clone(tools));
    }
    json_obj_set(in, "add_generation_prompt", json_new_bool(1));
    const char *effort = json_get_string(req, "reasoning_effort", NULL);
    const json_value *ev = json_get(req, "reasoning_effort");
    if (ev && ev->type != JSON_NULL && !effort) {
        srv_error(r, 400, "reasoning_effort", "invalid_type", "reasoning_effort must be a string");
        goto fail;
    }
    if (!effort) effort = q->srv->opt.default_reasoning_effort;
    if (effort) {
        if (!srv_reasoning_effort_valid(effort)) {
            srv_error(r, 400, "reasoning_effort", "invalid_value",
                      "reasoning_effort \"%.40s\" is not one of none, minimal, low, medium, high, xhigh, max", effort);
            goto fail;
        }
        json_obj_set(in, "enable_thinking", json_new_bool(strcmp(effort, "none") != 0));
    }
    const json_value *kw = json_get(req, "chat_template_kwargs");
    if (kw && kw->type != JSON_NULL && kw->type != JSON_OBJECT) {
        srv_error(r, 400, "chat_template_kwargs", "invalid_type", "chat_template_kwargs must be an object");
        goto fail;
    }
    const json_value *et = json_get(kw, "enable_thinking");
    if (et && et->type != JSON_NULL && !json_is_bool(et)) {
        srv_error(r, 400, "chat_template_kwargs.enable_thinking", "invalid_type",
                  "chat_template_kwargs.enable_thinking must be a boolean");
        goto fail;
    }
    if (et && json_is_bool(et)) json_obj_set(in, "enable_thinking", json_clone(et));
    return in;
fail:
    json_free(in);
    return NULL;
}

/* ---- the request ----------------------------------------------------------------- */

typedef struct chat {
    srv_server *srv;
    splash_gen *g;
    json_value *req;   /* owns tools used by the parser */
    const json_value *tools;
    char id[48];
    long long created;
    const char *model;
    int stream, include_usage, in_reasoning;
    /* streaming */
    splash_output_parser *parser;
    strbuf *out;       /* where the parser callback writes chunks */
    int sent_role, n_calls, finished;
    /* return_progress: prompt_progress chunks while the prompt is read */
    int return_progress, prompt_read, progress_sent;
    double last_write; /* monotonic seconds of the last bytes sent (keep-alive timing) */
    /* reasoning_tokens: the raw output is scanned for "</think>" while the
       reasoning is open; think_end is the byte after it (-1: not seen) */
    int had_reasoning;
    long think_end;
    strbuf scan;
    /* streamed logprobs: entries of tokens whose text was taken, waiting
       for the next chunk */
    size_t raw_len;
    int n_reported;
    strbuf lp_pending;
} chat;

/* logprobs (a boolean) and top_logprobs (0-20, needs logprobs) into g->sp. */
static int logprob_params(const json_value *req, splash_gen *g, srv_reply *r) {
    const json_value *v = json_get(req, "logprobs");
    if (v && v->type != JSON_NULL && !json_is_bool(v))
        return srv_error(r, 400, "logprobs", "invalid_type", "logprobs must be a boolean"), -1;
    int64_t top = 0;
    int rc = srv_int_param(req, "top_logprobs", &top, r);
    if (rc < 0) return -1;
    if (rc && (top < 0 || top > SPLASH_MAX_TOP_LOGPROBS))
        return srv_error(r, 400, "top_logprobs", "invalid_value", "top_logprobs must be between 0 and %d",
                         SPLASH_MAX_TOP_LOGPROBS), -1;
    g->sp.logprobs = json_get_bool(req, "logprobs", 0);
    if (top > 0 && !g->sp.logprobs)
        return srv_error(r, 400, "top_logprobs", "invalid_value", "top_logprobs needs logprobs: true"), -1;
    g->sp.top_logprobs = (int)top;
    return 0;
}

/* Known OpenAI parameters Splash does not do yet: present and not neutral = 400. */
static int unsupported(const json_value *req, srv_reply *r) {
    const json_value *v;
    int64_t n = 1;
    if (srv_int_param(req, "n", &n, r) < 0) return -1;
    if (n != 1) return srv_error(r, 400, "n", "unsupported_value", "n must be 1"), -1;
    if ((v = json_get(req, "logit_bias")) && v->type != JSON_NULL && !(v->type == JSON_OBJECT && !v->count))
        return srv_error(r, 400, "logit_bias", "unsupported_value", "logit_bias is not supported"), -1;
    if ((v = json_get(req, "response_format")) && v->type != JSON_NULL &&
        strcmp(json_get_string(v, "type", ""), "text"))
        return srv_error(r, 400, "response_format", "unsupported_value",
                         "response_format: only {\"type\":\"text\"} is supported yet (json_object / json_schema need "
                         "grammar-enforced decoding)"), -1;
    if ((v = json_get(req, "parallel_tool_calls")) && v->type != JSON_NULL && !json_is_bool(v))
        return srv_error(r, 400, "parallel_tool_calls", "invalid_type", "parallel_tool_calls must be a boolean"), -1;
    if ((v = json_get(req, "parallel_tool_calls")) && v->type == JSON_FALSE)
        return srv_error(r, 400, "parallel_tool_calls", "unsupported_value", "parallel_tool_calls false is not supported yet"), -1;
    static const char *never[] = {"audio", "prediction", "web_search_options", "functions", "function_call"};
    for (size_t i = 0; i < sizeof never / sizeof never[0]; i++)
        if ((v = json_get(req, never[i])) && v->type != JSON_NULL)
            return srv_error(r, 400, never[i], "unsupported_parameter", "%s is not supported", never[i]), -1;
    if ((v = json_get(req, "modalities")) && v->type != JSON_NULL && v->type != JSON_ARRAY)
        return srv_error(r, 400, "modalities", "invalid_type", "modalities must be an array of strings"), -1;
    if ((v = json_get(req, "modalities")) && v->type == JSON_ARRAY)
        for (size_t i = 0; i < v->count; i++)
            if (strcmp(json_string(v->items[i]) ? json_string(v->items[i]) : "", "text"))
                return srv_error(r, 400, "modalities", "unsupported_value", "modalities: only \"text\" is supported"), -1;
    return 0;
}

/* ---- replies ----------------------------------------------------------------------- */

static void chat_free(chat *c) {
    if (!c) return;
    splash_gen_release(c->g);
    if (c->parser) splash_output_parser_free(c->parser);
    json_free(c->req);
    sb_free(&c->scan);
    sb_free(&c->lp_pending);
    free(c);
}

/* Where the reasoning ends in the raw output: the byte after the first
 * "</think>", or -1. */
static long find_think_end(const char *s, size_t n) {
    const char *p = s ? memmem(s, n, "</think>", 8) : NULL;
    return p ? (long)(p - s) + 8 : -1;
}

/* reasoning_tokens: the generated tokens up to the one that completes
 * "</think>" (all of them when the reasoning never closed), counted from the
 * engine's token records rather than by tokenizing the reasoning text again.
 * A token counts when any of its bytes lies inside the reasoning. */
static int reasoning_tokens(chat *c, int n_recorded) {
    if (!c->in_reasoning && !c->had_reasoning) return 0;
    if (c->think_end < 0 || n_recorded <= 0) return n_recorded;
    splash_gen_token *t = malloc(sizeof *t * (size_t)n_recorded);
    if (!t) return 0;
    int n = splash_gen_records(c->g, 0, n_recorded, t, NULL), k = 0;
    while (k < n && (k ? (long)t[k - 1].text_end : 0) < c->think_end) k++;
    free(t);
    return k;
}

/* Chat logprobs entries of records [c->n_reported, n_recorded) whose text is
 * within the first c->raw_len bytes (all when `all`) onto c->lp_pending. */
static void pending_logprobs(chat *c, int n_recorded, int all) {
    int n = n_recorded - c->n_reported;
    if (!c->g->sp.logprobs || n <= 0) return;
    splash_gen_token *t = malloc(sizeof *t * (size_t)n);
    splash_logprobs *lp = malloc(sizeof *lp * (size_t)n);
    if (t && lp) {
        n = splash_gen_records(c->g, c->n_reported, n, t, lp);
        const splash_tokenizer *tk = splash_engine_tokenizer(c->srv->engine);
        for (int i = 0; i < n && (all || t[i].text_end <= c->raw_len); i++) {
            if (c->lp_pending.len) sb_putc(&c->lp_pending, ',');
            srv_logprobs_chat_entry(&c->lp_pending, tk, &lp[i]);
            c->n_reported++;
        }
    }
    free(t);
    free(lp);
}

/* "logprobs": the pending entries (then cleared), or null. */
static void write_logprobs(chat *c, strbuf *b) {
    if (!c->g->sp.logprobs || !c->lp_pending.len) {
        sb_puts(b, "null");
        return;
    }
    sb_puts(b, "{\"content\":[");
    sb_append(b, c->lp_pending.data, c->lp_pending.len);
    sb_puts(b, "]}");
    sb_clear(&c->lp_pending);
}

static void write_usage(chat *c, strbuf *b, int completion, int reasoning) {
    sb_printf(b,
              "{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,"
              "\"prompt_tokens_details\":{\"cached_tokens\":%d},\"completion_tokens_details\":{\"reasoning_tokens\":%d}}",
              c->g->n_prompt, completion, c->g->n_prompt + completion, c->g->n_cached, reasoning > completion ? completion : reasoning);
}

static void write_timings(chat *c, strbuf *b, const splash_gen_take *t) {
    int pn = c->g->n_prompt, dn = t->n_tokens > 0 ? t->n_tokens - 1 : 0;
    double pm = t->prefill_ms, dm = t->decode_ms;
    sb_printf(b,
              "{\"prompt_n\":%d,\"prompt_ms\":%.3f,\"prompt_per_token_ms\":%.3f,\"prompt_per_second\":%.2f,"
              "\"predicted_n\":%d,\"predicted_ms\":%.3f,\"predicted_per_token_ms\":%.3f,\"predicted_per_second\":%.2f,"
              "\"draft_n\":%d,\"draft_n_accepted\":%d,\"decode_cycles\":%d}", /* speculation, llama.cpp's names */
              pn, pm, pn ? pm / pn : 0.0, pm > 0 ? 1e3 * pn / pm : 0.0, t->n_tokens, dm, dn ? dm / dn : 0.0,
              dm > 0 ? 1e3 * dn / dm : 0.0, t->drafted, t->accepted, t->cycles);
}

static const char *finish_name(const chat *c, splash_finish f) {
    if (f == SPLASH_FINISH_LENGTH) return "length";
    return c->n_calls ? "tool_calls" : "stop";
}

static void reply_whole(chat *c, srv_reply *r) {
    strbuf text;
    sb_init(&text);
    splash_gen_take t;
    srv_gen_collect(c->g, &text, &t); /* cancels the gen if the client goes away */
    if (srv_gen_failed_reply(&t, r)) {
        sb_free(&text);
        return;
    }
    splash_output_opts o = {.in_reasoning = c->in_reasoning, .tools = c->tools};
    splash_output_result res;
    memset(&res, 0, sizeof res);
    splash_output_parse(text.data ? text.data : "", text.len, &o, &res);
    c->n_calls = (int)res.ncalls;
    c->had_reasoning = res.reasoning.len > 0;
    c->think_end = find_think_end(text.data, text.len);
    pending_logprobs(c, t.n_recorded, 1);
    strbuf *b = &r->body;
    sb_printf(b, "{\"id\":\"%s\",\"object\":\"chat.completion\",\"created\":%lld,\"model\":", c->id, c->created);
    json_write_string(b, c->model, strlen(c->model), JSON_COMPACT);
    sb_puts(b, ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
    if (res.content.len || !res.ncalls) json_write_string(b, sb_cstr(&res.content), res.content.len, JSON_COMPACT);
    else sb_puts(b, "null");
    if (res.reasoning.len) {
        sb_puts(b, ",\"reasoning_content\":");
        json_write_string(b, sb_cstr(&res.reasoning), res.reasoning.len, JSON_COMPACT);
    }
    if (res.ncalls) {
        sb_puts(b, ",\"tool_calls\":[");
        for (size_t i = 0; i < res.ncalls; i++) {
            sb_printf(b, "%s{\"id\":", i ? "," : "");
            json_write_string(b, res.calls[i].id, strlen(res.calls[i].id), JSON_COMPACT);
            sb_puts(b, ",\"type\":\"function\",\"function\":{\"name\":");
            json_write_string(b, res.calls[i].name, strlen(res.calls[i].name), JSON_COMPACT);
            sb_puts(b, ",\"arguments\":");
            json_write_string(b, res.calls[i].arguments, res.calls[i].arguments_len, JSON_COMPACT);
            sb_puts(b, "}}");
        }
        sb_puts(b, "]");
    }
    sb_puts(b, "},\"logprobs\":");
    if (c->g->sp.logprobs && !c->lp_pending.len) sb_puts(b, "{\"content\":[]}");
    else write_logprobs(c, b);
    sb_printf(b, ",\"finish_reason\":\"%s\"}],\"usage\":", finish_name(c, t.finish));
    write_usage(c, b, t.n_tokens, reasoning_tokens(c, t.n_recorded));
    sb_puts(b, ",\"timings\":");
    write_timings(c, b, &t);
    sb_puts(b, "}");
    r->status = 200;
    r->content_type = "application/json";
    splash_output_result_free(&res);
    sb_free(&text);
}

/* ---- streaming ---------------------------------------------------------------------- */

static void chunk_open(chat *c, strbuf *b) {
    sb_printf(b, "data: {\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"created\":%lld,\"model\":", c->id, c->created);
    json_write_string(b, c->model, strlen(c->model), JSON_COMPACT);
    sb_puts(b, ",\"choices\":[{\"index\":0,\"delta\":");
}

static void chunk_close(chat *c, strbuf *b, const char *finish) {
    sb_puts(b, ",\"logprobs\":");
    write_logprobs(c, b);
    sb_printf(b, ",\"finish_reason\":%s%s%s}]}\n\n", finish ? "\"" : "", finish ? finish : "null", finish ? "\"" : "");
}

static void on_event(void *ctx, const splash_output_event *ev) {
    chat *c = ctx;
    strbuf *b = c->out;
    switch (ev->kind) {
    case SPLASH_OUTPUT_REASONING:
    case SPLASH_OUTPUT_CONTENT: {
        int reasoning = ev->kind == SPLASH_OUTPUT_REASONING;
        if (reasoning) c->had_reasoning = 1;
        chunk_open(c, b);
        sb_puts(b, reasoning ? "{\"reasoning_content\":" : "{\"content\":");
        json_write_string(b, ev->text, ev->len, JSON_COMPACT);
        sb_puts(b, "}");
        chunk_close(c, b, NULL);
        break;
    }
    case SPLASH_OUTPUT_CALL_BEGIN:
        c->n_calls++;
        chunk_open(c, b);
        sb_printf(b, "{\"tool_calls\":[{\"index\":%d,\"id\":", ev->index);
        json_write_string(b, ev->id, strlen(ev->id), JSON_COMPACT);
        sb_puts(b, ",\"type\":\"function\",\"function\":{\"name\":");
        json_write_string(b, ev->name, strlen(ev->name), JSON_COMPACT);
        sb_puts(b, ",\"arguments\":\"\"}}]}");
        chunk_close(c, b, NULL);
        break;
    case SPLASH_OUTPUT_CALL_ARGS:
        chunk_open(c, b);
        sb_printf(b, "{\"tool_calls\":[{\"index\":%d,\"function\":{\"arguments\":", ev->index);
        json_write_string(b, ev->text, ev->len, JSON_COMPACT);
        sb_puts(b, "}}]}");
        chunk_close(c, b, NULL);
        break;
    default:
        break;
    }
}

/* While the prompt is read (return_progress): a chunk with llama.cpp's
 * `prompt_progress` each time more of it is in (the engine wakes the gen
 * after every prefill chunk), a keep-alive when nothing moved for the
 * interval.  The last progress chunk has processed == total.  Once the gen
 * decodes or ends, the caller goes on with the text. */
static void stream_progress(chat *c, strbuf *out) {
    int ka = srv_keepalive_ms(c->srv);
    double now = splash_now();
    int wait = ka - (int)(1e3 * (now - c->last_write));
    srv_progress p;
    srv_gen_progress_wait(c->g, c->progress_sent, wait, &p);
    if (p.processed > c->progress_sent) {
        chunk_open(c, out);
        sb_printf(out,
                  "{\"role\":\"assistant\",\"content\":null},\"logprobs\":null,\"finish_reason\":null}],"
                  "\"prompt_progress\":{\"total\":%d,\"cache\":%d,\"processed\":%d,\"time_ms\":%lld}}\n\n",
                  p.total, p.cache, p.processed, (long long)p.time_ms);
        c->progress_sent = p.processed;
        c->last_write = splash_now();
    } else if (p.state < SPLASH_GEN_DECODE && 1e3 * (splash_now() - c->last_write) >= ka) {
        sb_puts(out, ": keep-alive\n\n");
        c->last_write = splash_now();
    }
    if (p.state >= SPLASH_GEN_DECODE) c->prompt_read = 1;
}

static void stream_produce(void *ctx, strbuf *out, int *done) {
    chat *c = ctx;
    c->out = out;
    if (!c->sent_role) {
        chunk_open(c, out);
        sb_puts(out, "{\"role\":\"assistant\",\"content\":\"\"}");
        chunk_close(c, out, NULL);
        c->sent_role = 1;
        c->last_write = splash_now();
        return;
    }
    if (c->return_progress && !c->prompt_read) {
        size_t before = out->len;
        stream_progress(c, out);
        if (!c->prompt_read || out->len > before) return; /* send what was written now */
    }
    strbuf text;
    sb_init(&text);
    splash_gen_take t;
    if (!splash_gen_wait(c->g, c->srv->opt.keepalive_ms > 0 ? c->srv->opt.keepalive_ms : 2000, &text, &t)) {
        /* keep-alive only while nothing can come yet (queued, prefilling); a
           decode that is silent (text held back for a stop string or a tag)
           sends nothing; a client that left is noticed by http.c anyway */
        if (t.state == SPLASH_GEN_QUEUED || t.state == SPLASH_GEN_PREFILL) sb_puts(out, ": keep-alive\n\n");
        sb_free(&text);
        return;
    }
    if (c->think_end < 0 && text.len) { /* for reasoning_tokens */
        size_t from = c->scan.len > 7 ? c->scan.len - 7 : 0;
        sb_append(&c->scan, text.data, text.len);
        long e = find_think_end(c->scan.data + from, c->scan.len - from);
        if (e >= 0) {
            c->think_end = (long)from + e; /* scan holds the whole raw output so far */
            sb_free(&c->scan);
        }
    }
    c->raw_len += text.len;
    pending_logprobs(c, t.n_recorded, t.finish != SPLASH_FINISH_NONE);
    if (text.len && splash_output_parser_feed(c->parser, text.data, text.len)) t.finish = SPLASH_FINISH_ERROR;
    sb_free(&text);
    if (t.finish == SPLASH_FINISH_NONE) return;
    *done = 1;
    if (srv_gen_failed_sse(&t, out)) return;
    splash_output_parser_finish(c->parser);
    chunk_open(c, out);
    sb_puts(out, "{},\"logprobs\":");
    write_logprobs(c, out);
    sb_printf(out, ",\"finish_reason\":\"%s\"}],\"timings\":", finish_name(c, t.finish));
    write_timings(c, out, &t);
    sb_puts(out, "}\n\n");
    if (c->include_usage) {
        sb_printf(out, "data: {\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"created\":%lld,\"model\":", c->id,
                  c->created);
        json_write_string(out, c->model, strlen(c->model), JSON_COMPACT);
        sb_puts(out, ",\"choices\":[],\"usage\":");
        write_usage(c, out, t.n_tokens, reasoning_tokens(c, t.n_recorded));
        sb_puts(out, "}\n\n");
    }
    sb_puts(out, "data: [DONE]\n\n");
    c->finished = 1;
}

static void stream_cancel(void *ctx) { splash_gen_cancel(((chat *)ctx)->g); }
static void stream_free(void *ctx) { chat_free(ctx); }

/* ---- the handler ------------------------------------------------------------------- */

void srv_chat_completions(const srv_request *q, srv_reply *r) {
    srv_server *srv = q->srv;
    json_value *req = srv_parse_body(q, r);
    if (!req) return;
    chat *c = calloc(1, sizeof *c);
    json_value *in = NULL;
    if (!c || !(c->g = splash_gen_new())) {
        srv_error(r, 500, NULL, "out_of_memory", "out of memory");
        json_free(req);
        free(c);
        return;
    }
    c->srv = srv;
    c->req = req;
    c->think_end = -1;
    sb_init(&c->scan);
    sb_init(&c->lp_pending);
    splash_gen *g = c->g;
    const json_value *v;
    if ((v = json_get(req, "model")) && v->type != JSON_NULL && !json_string(v)) {
        srv_error(r, 400, "model", "invalid_type", "model must be a string");
        goto fail;
    }
    c->model = srv->opt.served_names[0];
    if ((v = json_get(req, "stream")) && v->type != JSON_NULL && !json_is_bool(v)) {
        srv_error(r, 400, "stream", "invalid_type", "stream must be a boolean");
        goto fail;
    }
    c->stream = json_get_bool(req, "stream", 0);
    v = json_get(req, "stream_options");
    if (v && v->type != JSON_NULL && v->type != JSON_OBJECT) {
        srv_error(r, 400, "stream_options", "invalid_type", "stream_options must be an object");
        goto fail;
    }
    const json_value *iu = json_get(v, "include_usage");
    if (iu && iu->type != JSON_NULL && !json_is_bool(iu)) {
        srv_error(r, 400, "stream_options.include_usage", "invalid_type", "stream_options.include_usage must be a boolean");
        goto fail;
    }
    c->include_usage = json_get_bool(v, "include_usage", 0);
    if ((v = json_get(req, "return_progress")) && v->type != JSON_NULL && !json_is_bool(v)) {
        srv_error(r, 400, "return_progress", "invalid_type", "return_progress must be a boolean");
        goto fail;
    }
    c->return_progress = c->stream && json_get_bool(req, "return_progress", 0);
    if (unsupported(req, r) || srv_sampling_params(req, g, r) || logprob_params(req, g, r) ||
        srv_stop_strings(json_get(req, "stop"), "stop", g, r))
        goto fail;
    int64_t max_tokens = -1, mct = -1;
    int has_mt = srv_int_param(req, "max_tokens", &max_tokens, r), has_mct;
    if (has_mt < 0 || (has_mct = srv_int_param(req, "max_completion_tokens", &mct, r)) < 0) goto fail;
    if (has_mct) max_tokens = mct;
    if ((has_mt || has_mct) && max_tokens < 1) {
        srv_error(r, 400, has_mct ? "max_completion_tokens" : "max_tokens", "invalid_value", "%s must be at least 1",
                  has_mct ? "max_completion_tokens" : "max_tokens");
        goto fail;
    }
    if (!(in = srv_chat_template_input(q, req, r))) goto fail;
    srv_gen_setup setup = {.max_tokens = max_tokens};
    int prc = srv_gen_prepare(q, req, in, g, &setup, r);
    c->in_reasoning = setup.in_reasoning;
    srv_gen_setup_free(&setup);
    if (prc) goto fail;
    srv_make_id(c->id, "chatcmpl-");
    c->created = (long long)time(NULL);
    if (srv_gen_submit(q, g, r)) goto fail;
    /* the parser reads tools from `in`: keep it alive with the chat */
    c->req = in;
    c->tools = json_get(in, "tools");
    json_free(req);
    in = NULL;
    if (c->stream) {
        splash_output_opts o = {.in_reasoning = c->in_reasoning, .tools = c->tools};
        if (!(c->parser = splash_output_parser_new(&o, on_event, c))) {
            splash_gen_cancel(g);
            srv_error(r, 500, NULL, "out_of_memory", "out of memory");
            chat_free(c);
            return;
        }
        r->status = 200;
        r->stream = (srv_stream){c, stream_produce, stream_cancel, stream_free};
        return;
    }
    reply_whole(c, r);
    chat_free(c);
    return;
fail:
    json_free(in);
    chat_free(c);
}
