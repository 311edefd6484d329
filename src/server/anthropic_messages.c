/* anthropic_messages.c - POST /v1/messages and /v1/messages/count_tokens
 * (Anthropic Messages, as Claude Code and the Anthropic SDKs speak it).
 *
 * A request goes: JSON -> the history folded into Chat messages for the
 * template (generation.h's srv_convo: system blocks, `role:"system"` entries,
 * thinking / text / tool_use / tool_result blocks) -> the native template ->
 * tokens -> a gen.  The output parser's events become content blocks: one
 * thinking block (its signature seals the reasoning text, generation.h),
 * text blocks, tool_use blocks.  The same block builder serves both replies:
 * streaming, it writes the SSE events as blocks open, grow and close; either
 * way it collects the final `content` array, so the streamed and whole
 * replies cannot disagree.
 *
 * Choices where Splash cannot do what Anthropic does (docs/api.md):
 * - tool_choice any / tool: grammar-constrained decoding does not exist yet,
 *   so the model's turn is started with the call ("<tool_call>\n<function="
 *   and the name for `tool`): the turn is then a call, the arguments are the
 *   model's.  As with Anthropic, thinking cannot be combined with a forced
 *   tool (400 when explicitly enabled; otherwise it is turned off).
 * - thinking.budget_tokens is validated but not enforced.
 * - A final assistant message (prefill) is continued: its text is written
 *   after the generation prompt, thinking off.
 * - Server tools (a `type` other than "custom" and no input_schema, e.g.
 *   web_search_20250305) are left out: this server cannot run them.
 * - Image and document blocks are recognised and rejected with a 400 until
 *   vision lands.
 *
 * Errors are built with srv_error (the OpenAI shape, as every shared helper
 * does) and converted once, for every /v1/messages path, by
 * srv_anthropic_error_convert (called from http.c): {"type":"error",
 * "error":{"type","message"}}, the type chosen by the status.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/generation.h"
#include "text/chat_template.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

/* ---- errors ------------------------------------------------------------------------------------ */

int srv_anthropic_path(const char *path) {
    return !strcmp(path, "/v1/messages") || !strcmp(path, "/v1/messages/count_tokens") || !strcmp(path, "/messages") ||
           !strcmp(path, "/messages/count_tokens");
}

static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

static void write_error(strbuf *b, int status, const char *msg, size_t n) {
    sb_printf(b, "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":", error_type(status));
    json_write_string(b, msg, n, JSON_COMPACT);
    sb_puts(b, "}}");
}

void srv_anthropic_error_convert(srv_reply *r) {
    if (r->status < 400 || r->stream.produce) return;
    json_value *v = json_parse(r->body.data ? r->body.data : "", r->body.len, 8, NULL, 0);
    const json_value *m = json_get(json_get(v, "error"), "message");
    strbuf b;
    sb_init(&b);
    if (json_string(m)) write_error(&b, r->status, m->str, m->len);
    else write_error(&b, r->status, "request failed", 14);
    json_free(v);
    sb_free(&r->body);
    r->body = b;
    r->content_type = "application/json";
}

/* ---- the request -> the template's input -------------------------------------------------------- */

typedef struct prompt_plan {
    json_value *in;   /* the template's input */
    char *prefill;    /* written after the generation prompt, or NULL */
    int feed_prefill; /* the parser reads the prefill too (a forced call) */
} prompt_plan;

static void plan_free(prompt_plan *p) {
    json_free(p->in);
    free(p->prefill);
    memset(p, 0, sizeof *p);
}

/* Text of a string or of an array of text blocks; other blocks: -1 with a 400. */
static int text_of(const json_value *v, const char *param, strbuf *out, int skip_billing, const char *sep,
                   srv_reply *r) {
    if (json_string(v)) {
        sb_append(out, v->str, v->len);
        return 0;
    }
    if (!v || v->type != JSON_ARRAY)
        return srv_error(r, 400, param, "invalid_type", "%s must be a string or an array of text blocks", param), -1;
    int n = 0;
    for (size_t k = 0; k < v->count; k++) {
        const json_value *b = v->items[k], *t = json_get(b, "text");
        if (strcmp(json_get_string(b, "type", ""), "text") || !json_string(t))
            return srv_error(r, 400, param, "invalid_value", "%s[%zu] must be a text block {\"type\":\"text\",\"text\"}",
                             param, k), -1;
        if (skip_billing && t->len >= 26 && !memcmp(t->str, "x-anthropic-billing-header", 26)) continue;
        if (n++ && sep) sb_puts(out, sep);
        sb_append(out, t->str, t->len);
    }
    return 0;
}

static int media_block(const char *type) {
    return !strcmp(type, "image") || !strcmp(type, "document");
}

/* Reasoning to re-render: the sealed text when the signature (or the
 * redacted block's data) is ours and intact, else the plain text. */
static void add_thinking(srv_convo *cv, const json_value *b, int redacted) {
    const json_value *seal = json_get(b, redacted ? "data" : "signature");
    strbuf t;
    sb_init(&t);
    if (!json_string(seal) || srv_reasoning_unseal(seal->str, seal->len, &t)) {
        const json_value *plain = redacted ? NULL : json_get(b, "thinking");
        if (json_string(plain)) sb_append(&t, plain->str, plain->len);
        else if (redacted) { /* someone else's redacted reasoning: nothing we can show the model */
            sb_free(&t);
            return;
        }
    }
    srv_convo_reasoning(cv, t.data ? t.data : "", t.len);
    sb_free(&t);
}

static int tool_result(srv_convo *cv, const json_value *b, const char *param, srv_reply *r) {
    const json_value *id = json_get(b, "tool_use_id"), *content = json_get(b, "content");
    if (!json_string(id)) return srv_error(r, 400, param, "invalid_value", "%s.tool_use_id must be a string", param), -1;
    strbuf t;
    sb_init(&t);
    if (json_get_bool(b, "is_error", 0)) sb_puts(&t, "Error: ");
    if (content && content->type == JSON_ARRAY) {
        for (size_t k = 0; k < content->count; k++) {
            const char *ty = json_get_string(content->items[k], "type", "");
            const json_value *tx = json_get(content->items[k], "text");
            if (media_block(ty)) {
                sb_free(&t);
                return srv_error(r, 400, param, "unsupported_content",
                                 "%s.content[%zu]: %s blocks are not supported yet (this server has no vision)", param, k,
                                 ty), -1;
            }
            if (strcmp(ty, "text") || !json_string(tx)) {
                sb_free(&t);
                return srv_error(r, 400, param, "invalid_value", "%s.content[%zu] must be a text block", param, k), -1;
            }
            if (k) sb_putc(&t, '\n');
            sb_append(&t, tx->str, tx->len);
        }
    } else if (json_string(content)) {
        sb_append(&t, content->str, content->len);
    } else if (content && content->type != JSON_NULL) {
        sb_free(&t);
        return srv_error(r, 400, param, "invalid_type", "%s.content must be a string or an array of blocks", param), -1;
    }
    srv_convo_tool_result(cv, id->str, t.data ? t.data : "", t.len);
    sb_free(&t);
    return 0;
}

static int add_message(srv_convo *cv, const json_value *m, size_t i, srv_reply *r) {
    char param[96];
    snprintf(param, sizeof param, "messages[%zu]", i);
    const char *role = json_get_string(m, "role", NULL);
    if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system")))
        return srv_error(r, 400, param, "invalid_value", "%s.role must be \"user\", \"assistant\" or \"system\"", param), -1;
    int user = !strcmp(role, "user"), assistant = !strcmp(role, "assistant");
    const json_value *c = json_get(m, "content");
    srv_convo_break(cv);
    if (!strcmp(role, "system")) {
        strbuf t;
        sb_init(&t);
        snprintf(param, sizeof param, "messages[%zu].content", i);
        int rc = text_of(c, param, &t, 1, "\n\n", r);
        if (!rc) srv_convo_system(cv, t.data ? t.data : "", t.len);
        sb_free(&t);
        return rc;
    }
    if (json_string(c)) {
        if (user) srv_convo_user(cv, c->str, c->len);
        else srv_convo_assistant(cv, c->str, c->len);
        return 0;
    }
    if (!c || c->type != JSON_ARRAY)
        return srv_error(r, 400, param, "invalid_type", "%s.content must be a string or an array of blocks", param), -1;
    for (size_t k = 0; k < c->count; k++) {
        const json_value *b = c->items[k], *t = json_get(b, "text");
        const char *type = json_get_string(b, "type", "");
        snprintf(param, sizeof param, "messages[%zu].content[%zu]", i, k);
        if (!strcmp(type, "text")) {
            if (!json_string(t)) return srv_error(r, 400, param, "invalid_type", "%s.text must be a string", param), -1;
            if (user) srv_convo_user(cv, t->str, t->len);
            else srv_convo_assistant(cv, t->str, t->len);
        } else if (user && !strcmp(type, "tool_result")) {
            if (tool_result(cv, b, param, r)) return -1;
        } else if (user && media_block(type)) {
            return srv_error(r, 400, param, "unsupported_content",
                             "%s: %s blocks are not supported yet (this server has no vision)", param, type), -1;
        } else if (assistant && (!strcmp(type, "thinking") || !strcmp(type, "redacted_thinking"))) {
            add_thinking(cv, b, type[0] == 'r');
        } else if (assistant && !strcmp(type, "tool_use")) {
            const json_value *name = json_get(b, "name"), *input = json_get(b, "input");
            if (!json_string(name) || (input && input->type != JSON_OBJECT))
                return srv_error(r, 400, param, "invalid_value", "%s must have a string name and an object input",
                                 param), -1;
            srv_convo_tool_call(cv, json_get_string(b, "id", NULL), name->str,
                                input ? json_clone(input) : json_new(JSON_OBJECT));
        } else {
            return srv_error(r, 400, param, "unsupported_content", "%s: block type \"%.40s\" is not supported in a %s message",
                             param, type, role), -1;
        }
    }
    return 0;
}

static int add_tools(json_value *tools, const json_value *req, srv_reply *r) {
    const json_value *ts = json_get(req, "tools");
    if (!ts || ts->type == JSON_NULL) return 0;
    if (ts->type != JSON_ARRAY) return srv_error(r, 400, "tools", "invalid_type", "tools must be an array"), -1;
    for (size_t k = 0; k < ts->count; k++) {
        const json_value *t = ts->items[k], *schema = json_get(t, "input_schema");
        const char *type = json_get_string(t, "type", NULL);
        if (!schema && type && strcmp(type, "custom")) continue; /* a server tool: not ours to run */
        if (!json_string(json_get(t, "name")) || !schema || schema->type != JSON_OBJECT)
            return srv_error(r, 400, "tools", "invalid_value", "tools[%zu] must have a string name and an object input_schema",
                             k), -1;
        srv_tool_add(tools, json_get_string(t, "name", ""), json_get(t, "description"), schema);
    }
    return 0;
}

/* thinking -> 1 on, 0 off, -1 not said (the server's default applies). */
static int thinking_param(const srv_request *q, const json_value *req, int *explicit_on, srv_reply *r) {
    const json_value *t = json_get(req, "thinking");
    *explicit_on = 0;
    if (!t || t->type == JSON_NULL) {
        const char *d = q->srv->opt.default_reasoning_effort;
        return d ? strcmp(d, "none") != 0 : -1;
    }
    const char *type = json_get_string(t, "type", "");
    if (!strcmp(type, "disabled")) return 0;
    if (strcmp(type, "enabled") && strcmp(type, "adaptive"))
        return srv_error(r, 400, "thinking", "invalid_value", "thinking.type must be \"enabled\", \"disabled\" or \"adaptive\""),
               -2;
    const json_value *b = json_get(t, "budget_tokens");
    int64_t budget;
    if (!strcmp(type, "enabled") && (!b || json_int64(b, &budget) || budget < 1))
        return srv_error(r, 400, "thinking.budget_tokens", "invalid_value",
                         "thinking.budget_tokens must be a positive integer when thinking is enabled"), -2;
    *explicit_on = 1;
    return 1;
}

static int build_plan(const srv_request *q, const json_value *req, prompt_plan *p, srv_reply *r) {
    memset(p, 0, sizeof *p);
    srv_convo cv;
    srv_convo_init(&cv);
    json_value *tools = json_new(JSON_ARRAY);
    const json_value *sys = json_get(req, "system"), *msgs = json_get(req, "messages");
    if (sys && sys->type != JSON_NULL) {
        strbuf t;
        sb_init(&t);
        int rc = text_of(sys, "system", &t, 1, "\n\n", r);
        if (!rc && t.len) srv_convo_system(&cv, t.data, t.len);
        sb_free(&t);
        if (rc) goto fail;
    }
    if (!msgs || msgs->type != JSON_ARRAY || !msgs->count) {
        srv_error(r, 400, "messages", "invalid_value", "messages must be a non-empty array");
        goto fail;
    }
    for (size_t i = 0; i < msgs->count; i++)
        if (add_message(&cv, msgs->items[i], i, r)) goto fail;
    if (add_tools(tools, req, r)) goto fail;
    const json_value *tc = json_get(req, "tool_choice");
    const char *tct = json_get_string(tc, "type", "auto");
    if (tc && tc->type != JSON_NULL && (tc->type != JSON_OBJECT || (strcmp(tct, "auto") && strcmp(tct, "any") &&
                                                                    strcmp(tct, "none") && strcmp(tct, "tool")))) {
        srv_error(r, 400, "tool_choice", "invalid_value", "tool_choice.type must be auto, any, none or tool");
        goto fail;
    }
    if (!strcmp(tct, "tool") && !srv_tools_has(tools, json_get_string(tc, "name", ""))) {
        srv_error(r, 400, "tool_choice", "invalid_value", "tool_choice.name \"%.80s\" is not one of the tools",
                  json_get_string(tc, "name", ""));
        goto fail;
    }
    int forced = tools->count && (!strcmp(tct, "any") || !strcmp(tct, "tool"));
    int explicit_on;
    int thinking = thinking_param(q, req, &explicit_on, r);
    if (thinking == -2) goto fail;
    p->prefill = srv_convo_take_prefill(&cv);
    if (forced || p->prefill) {
        if (explicit_on) {
            srv_error(r, 400, forced ? "tool_choice" : "messages", "invalid_value",
                      forced ? "Thinking may not be enabled when tool_choice forces tool use."
                             : "Thinking may not be enabled when the last message is an assistant prefill.");
            goto fail;
        }
        thinking = 0;
    }
    if (forced) {
        free(p->prefill);
        p->prefill = srv_forced_call_prefill(!strcmp(tct, "tool") ? json_get_string(tc, "name", "") : NULL);
        p->feed_prefill = 1;
    }
    p->in = srv_convo_input(&cv);
    if (tools->count && strcmp(tct, "none")) {
        json_obj_set(p->in, "tools", tools);
        tools = NULL;
    }
    json_obj_set(p->in, "add_generation_prompt", json_new_bool(1));
    if (thinking >= 0) json_obj_set(p->in, "enable_thinking", json_new_bool(thinking));
    json_free(tools);
    srv_convo_free(&cv);
    return 0;
fail:
    json_free(tools);
    srv_convo_free(&cv);
    plan_free(p);
    return -1;
}

/* ---- blocks: parser events -> SSE events and the final content array ---------------------------- */

enum { BLOCK_NONE, BLOCK_THINKING, BLOCK_TEXT, BLOCK_TOOL };

typedef struct amsg {
    srv_server *srv;
    srv_turn turn;
    prompt_plan plan;
    char id[40];
    const char *model;
    int stream, clamped, echo_prompt, in_reasoning;
    strbuf prompt;            /* echo_prompt (test hook) */
    strbuf *sse;              /* where events go while streaming, else NULL */
    int index, kind;          /* the open block */
    strbuf acc;               /* the open block's text / arguments */
    char call_id[64], call_name[256];
    int n_calls;
    strbuf content;           /* the final content array's items, comma-separated */
    int started;
} amsg;

static void amsg_free(amsg *a) {
    if (!a) return;
    srv_turn_free(&a->turn);
    plan_free(&a->plan);
    sb_free(&a->prompt);
    sb_free(&a->acc);
    sb_free(&a->content);
    free(a);
}

static void jstr(strbuf *b, const char *s, size_t n) { json_write_string(b, s, n, JSON_COMPACT); }

static void block_start(amsg *a, int kind) {
    a->kind = kind;
    sb_clear(&a->acc);
    if (!a->sse) return;
    srv_sse_event(a->sse, "content_block_start");
    sb_printf(a->sse, "{\"type\":\"content_block_start\",\"index\":%d,\"content_block\":", a->index);
    if (kind == BLOCK_THINKING) sb_puts(a->sse, "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}");
    else if (kind == BLOCK_TEXT) sb_puts(a->sse, "{\"type\":\"text\",\"text\":\"\"}");
    else {
        sb_puts(a->sse, "{\"type\":\"tool_use\",\"id\":");
        jstr(a->sse, a->call_id, strlen(a->call_id));
        sb_puts(a->sse, ",\"name\":");
        jstr(a->sse, a->call_name, strlen(a->call_name));
        sb_puts(a->sse, ",\"input\":{}}");
    }
    sb_puts(a->sse, "}\n\n");
}

static void delta(amsg *a, const char *type, const char *field, const char *s, size_t n) {
    if (!a->sse) return;
    srv_sse_event(a->sse, "content_block_delta");
    sb_printf(a->sse, "{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"%s\",\"%s\":", a->index, type,
              field);
    jstr(a->sse, s, n);
    sb_puts(a->sse, "}}\n\n");
}

/* Closes the open block: its signature (thinking), the stop event, and the
 * block in the final content array. */
static void block_stop(amsg *a) {
    if (a->kind == BLOCK_NONE) return;
    strbuf *c = &a->content;
    const char *acc = a->acc.data ? a->acc.data : "";
    if (c->len) sb_putc(c, ',');
    if (a->kind == BLOCK_THINKING) {
        strbuf sig;
        sb_init(&sig);
        srv_reasoning_seal(acc, a->acc.len, &sig);
        delta(a, "signature_delta", "signature", sig.data, sig.len);
        sb_puts(c, "{\"type\":\"thinking\",\"thinking\":");
        jstr(c, acc, a->acc.len);
        sb_puts(c, ",\"signature\":");
        jstr(c, sig.data, sig.len);
        sb_puts(c, "}");
        sb_free(&sig);
    } else if (a->kind == BLOCK_TEXT) {
        sb_puts(c, "{\"type\":\"text\",\"text\":");
        jstr(c, acc, a->acc.len);
        sb_puts(c, "}");
    } else {
        sb_puts(c, "{\"type\":\"tool_use\",\"id\":");
        jstr(c, a->call_id, strlen(a->call_id));
        sb_puts(c, ",\"name\":");
        jstr(c, a->call_name, strlen(a->call_name));
        sb_puts(c, ",\"input\":");
        if (a->acc.len) sb_append(c, acc, a->acc.len); /* the parser's arguments: always one JSON object */
        else sb_puts(c, "{}");
        sb_puts(c, "}");
    }
    if (a->sse) {
        srv_sse_event(a->sse, "content_block_stop");
        sb_printf(a->sse, "{\"type\":\"content_block_stop\",\"index\":%d}\n\n", a->index);
    }
    a->index++;
    a->kind = BLOCK_NONE;
}

static void on_event(void *ctx, const splash_output_event *ev) {
    amsg *a = ctx;
    switch (ev->kind) {
    case SPLASH_OUTPUT_REASONING:
    case SPLASH_OUTPUT_CONTENT: {
        int kind = ev->kind == SPLASH_OUTPUT_REASONING ? BLOCK_THINKING : BLOCK_TEXT;
        if (a->kind != kind) {
            block_stop(a);
            block_start(a, kind);
        }
        sb_append(&a->acc, ev->text, ev->len);
        if (kind == BLOCK_THINKING) delta(a, "thinking_delta", "thinking", ev->text, ev->len);
        else delta(a, "text_delta", "text", ev->text, ev->len);
        break;
    }
    case SPLASH_OUTPUT_REASONING_END:
        if (a->kind == BLOCK_THINKING) block_stop(a);
        break;
    case SPLASH_OUTPUT_CALL_BEGIN:
        block_stop(a);
        snprintf(a->call_id, sizeof a->call_id, "%s", ev->id);
        snprintf(a->call_name, sizeof a->call_name, "%s", ev->name);
        a->n_calls++;
        block_start(a, BLOCK_TOOL);
        break;
    case SPLASH_OUTPUT_CALL_ARGS:
        sb_append(&a->acc, ev->text, ev->len);
        delta(a, "input_json_delta", "partial_json", ev->text, ev->len);
        break;
    case SPLASH_OUTPUT_CALL_END:
        if (a->kind == BLOCK_TOOL) block_stop(a);
        break;
    default:
        break;
    }
}

static const char *stop_reason(amsg *a, const splash_gen_take *t, int *stop_index) {
    *stop_index = -1;
    if (t->finish == SPLASH_FINISH_LENGTH) return a->clamped ? "model_context_window_exceeded" : "max_tokens";
    if ((*stop_index = srv_gen_stop_index(a->srv, a->turn.g, a->turn.text_len)) >= 0) return "stop_sequence";
    return a->n_calls ? "tool_use" : "end_turn";
}

static void write_stop(amsg *a, strbuf *b, const char *reason, int stop_index) {
    sb_printf(b, "\"stop_reason\":\"%s\",\"stop_sequence\":", reason);
    if (stop_index >= 0) jstr(b, a->turn.g->stop[stop_index], strlen(a->turn.g->stop[stop_index]));
    else sb_puts(b, "null");
}

/* cached: prompt tokens read from the prefix cache (known once the gen was
 * admitted: 0 in message_start, the final figure in message_delta). */
static void write_usage(amsg *a, strbuf *b, int cached, int output_tokens) {
    sb_printf(b,
              "{\"input_tokens\":%d,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":%d,"
              "\"output_tokens\":%d}",
              a->turn.g->n_prompt - cached, cached, output_tokens);
}

static void message_head(amsg *a, strbuf *b) {
    sb_printf(b, "{\"id\":\"%s\",\"type\":\"message\",\"role\":\"assistant\",\"model\":", a->id);
    jstr(b, a->model, strlen(a->model));
}

static int start_parser(amsg *a) {
    splash_output_opts o = {.in_reasoning = a->in_reasoning, .tools = json_get(a->plan.in, "tools"), .id_prefix = "toolu_"};
    return srv_turn_parser(&a->turn, &o, on_event, a, a->plan.feed_prefill ? a->plan.prefill : NULL);
}

/* ---- replies ------------------------------------------------------------------------------------- */

static void reply_whole(amsg *a, srv_reply *r) {
    splash_gen_take t;
    if (srv_turn_whole(&a->turn, &t, r)) return;
    block_stop(a);
    int si;
    const char *reason = stop_reason(a, &t, &si);
    strbuf *b = &r->body;
    message_head(a, b);
    sb_puts(b, ",\"content\":[");
    sb_append(b, a->content.data ? a->content.data : "", a->content.len);
    sb_puts(b, "],");
    write_stop(a, b, reason, si);
    sb_puts(b, ",\"usage\":");
    write_usage(a, b, a->turn.g->n_cached, t.n_tokens);
    if (a->echo_prompt) {
        sb_puts(b, ",\"test_prompt\":");
        jstr(b, a->prompt.data ? a->prompt.data : "", a->prompt.len);
    }
    sb_puts(b, "}");
    r->status = 200;
    r->content_type = "application/json";
}

static void stream_produce(void *ctx, strbuf *out, int *done) {
    amsg *a = ctx;
    a->sse = out;
    if (!a->started) {
        a->started = 1;
        srv_sse_event(out, "message_start");
        sb_puts(out, "{\"type\":\"message_start\",\"message\":");
        message_head(a, out);
        sb_puts(out, ",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":");
        write_usage(a, out, 0, 0);
        sb_puts(out, "}}\n\n");
        srv_sse_event(out, "ping");
        sb_puts(out, "{\"type\":\"ping\"}\n\n");
        return;
    }
    splash_gen_take t;
    int st = srv_turn_step(&a->turn, srv_keepalive_ms(a->srv), &t);
    if (st == SRV_TURN_IDLE) {
        srv_sse_event(out, "ping");
        sb_puts(out, "{\"type\":\"ping\"}\n\n");
    }
    if (st == SRV_TURN_IDLE || st == SRV_TURN_MORE) return;
    *done = 1;
    if (st == SRV_TURN_FAILED) {
        int status;
        const char *msg;
        srv_gen_error_status(&t, &status, &msg);
        srv_sse_event(out, "error");
        write_error(out, status, msg, strlen(msg));
        sb_puts(out, "\n\n");
        return;
    }
    block_stop(a);
    int si;
    const char *reason = stop_reason(a, &t, &si);
    srv_sse_event(out, "message_delta");
    sb_puts(out, "{\"type\":\"message_delta\",\"delta\":{");
    write_stop(a, out, reason, si);
    sb_puts(out, "},\"usage\":");
    write_usage(a, out, a->turn.g->n_cached, t.n_tokens);
    sb_puts(out, "}\n\n");
    srv_sse_event(out, "message_stop");
    sb_puts(out, "{\"type\":\"message_stop\"}\n\n");
}

static void stream_cancel(void *ctx) { splash_gen_cancel(((amsg *)ctx)->turn.g); }
static void stream_free(void *ctx) { amsg_free(ctx); }

/* ---- handlers ------------------------------------------------------------------------------------ */

static void messages(const srv_request *q, srv_reply *r) {
    srv_server *srv = q->srv;
    json_value *req = srv_parse_body(q, r);
    if (!req) return;
    amsg *a = calloc(1, sizeof *a);
    if (!a || !(a->turn.g = splash_gen_new())) {
        srv_error(r, 500, NULL, "out_of_memory", "out of memory");
        json_free(req);
        free(a);
        return;
    }
    a->srv = srv;
    a->model = srv->opt.served_names[0];
    a->kind = BLOCK_NONE;
    sb_init(&a->prompt);
    sb_init(&a->acc);
    sb_init(&a->content);
    splash_gen *g = a->turn.g;
    const json_value *v;
    int64_t max_tokens = 0;
    int rc = srv_int_param(req, "max_tokens", &max_tokens, r);
    if (rc < 0) goto fail;
    if (!rc || max_tokens < 1) {
        srv_error(r, 400, "max_tokens", "invalid_value", rc ? "max_tokens must be at least 1" : "max_tokens: Field required");
        goto fail;
    }
    if ((v = json_get(req, "model")) && !json_string(v)) {
        srv_error(r, 400, "model", "invalid_type", "model must be a string");
        goto fail;
    }
    if ((v = json_get(req, "stream")) && v->type != JSON_NULL && !json_is_bool(v)) {
        srv_error(r, 400, "stream", "invalid_type", "stream must be a boolean");
        goto fail;
    }
    a->stream = json_get_bool(req, "stream", 0);
    if ((a->echo_prompt = srv_test_echo_prompt(q, req, r)) < 0) goto fail;
    if (srv_sampling_params(req, g, r) || srv_stop_strings(json_get(req, "stop_sequences"), "stop_sequences", g, r) ||
        build_plan(q, req, &a->plan, r))
        goto fail;
    srv_gen_setup setup = {.max_tokens = max_tokens, .clamp = 1, .prefill = a->plan.prefill};
    rc = srv_gen_prepare(q, req, a->plan.in, g, &setup, r);
    a->clamped = setup.clamped;
    a->in_reasoning = setup.in_reasoning && !a->plan.prefill;
    a->prompt = setup.prompt;
    if (rc) goto fail;
    srv_make_id(a->id, "msg_");
    if (srv_gen_submit(q, g, r)) goto fail;
    json_free(req);
    req = NULL;
    if (start_parser(a)) {
        splash_gen_cancel(g);
        srv_error(r, 500, NULL, "out_of_memory", "out of memory");
    } else if (a->stream) {
        r->status = 200;
        r->stream = (srv_stream){a, stream_produce, stream_cancel, stream_free};
        return;
    } else {
        reply_whole(a, r);
    }
fail:
    json_free(req);
    amsg_free(a);
}

static void count_tokens(const srv_request *q, srv_reply *r) {
    json_value *req = srv_parse_body(q, r);
    if (!req) return;
    prompt_plan p;
    strbuf prompt;
    sb_init(&prompt);
    splash_token_vec toks = {0};
    splash_error err = {0};
    int echo = srv_test_echo_prompt(q, req, r);
    if (echo < 0 || build_plan(q, req, &p, r)) goto done;
    if (splash_chat_template_render(p.in, &prompt, &err)) {
        srv_error(r, 400, "messages", "template_error", "%s", err.msg);
    } else {
        if (p.prefill) sb_puts(&prompt, p.prefill);
        if (splash_tokenizer_encode(splash_engine_tokenizer(q->srv->engine), prompt.data ? prompt.data : "", prompt.len,
                                    SPLASH_ENCODE_SPECIAL, &toks, &err))
            srv_error(r, 400, "messages", NULL, "%s", err.msg);
        else {
            sb_printf(&r->body, "{\"input_tokens\":%zu", toks.len);
            if (echo) {
                sb_puts(&r->body, ",\"test_prompt\":");
                jstr(&r->body, prompt.data ? prompt.data : "", prompt.len);
            }
            sb_puts(&r->body, "}");
            r->status = 200;
            r->content_type = "application/json";
        }
    }
    plan_free(&p);
done:
    splash_token_vec_free(&toks);
    sb_free(&prompt);
    json_free(req);
}

int srv_route_anthropic(const srv_request *q, srv_reply *r) {
    if (!srv_anthropic_path(q->path)) return 0;
    if (strcmp(q->method, "POST")) srv_error(r, 405, NULL, "method_not_allowed", "%s is not allowed on %s", q->method, q->path);
    else if (strstr(q->path, "count_tokens")) count_tokens(q, r);
    else messages(q, r);
    return 1;
}
