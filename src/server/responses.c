/* responses.c - POST /v1/responses, GET / DELETE /v1/responses/{id} (OpenAI
 * Responses, as Codex and the openai SDKs speak it).
 *
 * A request goes: JSON -> its conversation (the stored one of
 * previous_response_id, then `input`: a string or message / reasoning /
 * function_call / function_call_output items) folded into Chat messages for
 * the template (generation.h's srv_convo) -> the native template -> tokens
 * -> a gen.  The output parser's events become output items: a reasoning
 * item (its `summary` holds the reasoning text, its `encrypted_content` the
 * sealed text, generation.h, so that Codex, which re-sends its whole history
 * every turn, gets the same prompt bytes back), a message item, function_call
 * items.  One item builder serves both replies: streaming, it writes the
 * events of api.md (every one with `type` and `sequence_number`) as items
 * open, grow and close; either way it collects the final `output` array.
 *
 * Choices where Splash cannot do what OpenAI does (docs/api.md):
 * - Tool types other than `function` (web_search, image_generation, custom,
 *   tool_search, local_shell, ...) are left out of the prompt rather than
 *   rejected; `namespace` tools contribute their function children as
 *   NS__NAME.
 * - tool_choice required / a named function: grammar-constrained decoding
 *   does not exist yet, so the model's turn is started with the call (as for
 *   Anthropic) and thinking is off for that request.  parallel_tool_calls
 *   false and strict tools are accepted but not enforced.
 * - text.format json_object / json_schema is asked for in the system prompt,
 *   not enforced and not validated.
 * - max_output_tokens beyond the room the context leaves is lowered to it
 *   (the response then ends incomplete, reason max_output_tokens).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/generation.h"
#include "server/response_store.h"
#include "text/output_parser.h"

/* ---- the store -------------------------------------------------------------------------------- */

#define STORE_ENTRIES 1000
#define STORE_BYTES ((size_t)256 << 20)

static srv_response_store *the_store;
static pthread_once_t store_once = PTHREAD_ONCE_INIT;
static void store_init(void) { the_store = srv_response_store_new(STORE_ENTRIES, STORE_BYTES); }

/* The process-wide store (it lives as long as the process), or NULL. */
static srv_response_store *store(void) {
    pthread_once(&store_once, store_init);
    return the_store;
}

/* ---- the request -> the template's input -------------------------------------------------------- */

typedef struct plan {
    json_value *in;      /* the template's input */
    json_value *history; /* every input item of the conversation, previous ones first */
    char *prefill;       /* a forced call's start, or NULL */
} plan;

static void plan_free(plan *p) {
    json_free(p->in);
    json_free(p->history);
    free(p->prefill);
    memset(p, 0, sizeof *p);
}

/* The text of a content string or array of text parts. */
static int content_text(const json_value *c, const char *param, strbuf *out, srv_reply *r) {
    if (!c || c->type == JSON_NULL) return 0;
    if (json_string(c)) {
        sb_append(out, c->str, c->len);
        return 0;
    }
    if (c->type != JSON_ARRAY)
        return srv_error(r, 400, param, "invalid_type", "%s must be a string or an array of content parts", param), -1;
    for (size_t k = 0; k < c->count; k++) {
        const char *t = json_get_string(c->items[k], "type", "");
        const json_value *tx = json_get(c->items[k], !strcmp(t, "refusal") ? "refusal" : "text");
        if (!strcmp(t, "input_image") || !strcmp(t, "input_file") || !strcmp(t, "input_audio"))
            return srv_error(r, 400, param, "unsupported_content",
                             "%s[%zu]: %s is not supported yet (this server has no vision)", param, k, t), -1;
        if ((strcmp(t, "input_text") && strcmp(t, "output_text") && strcmp(t, "text") && strcmp(t, "refusal")) ||
            !json_string(tx))
            return srv_error(r, 400, param, "invalid_value", "%s[%zu] must be a text part", param, k), -1;
        sb_append(out, tx->str, tx->len);
    }
    return 0;
}

/* A reasoning item's text: the sealed text when encrypted_content is ours and
 * intact, else its summary (or content) texts. */
static void reasoning_text(const json_value *it, strbuf *out) {
    const json_value *e = json_get(it, "encrypted_content");
    if (json_string(e) && !srv_reasoning_unseal(e->str, e->len, out)) return;
    const json_value *parts = json_get(it, "summary");
    if (!parts || parts->type != JSON_ARRAY || !parts->count) parts = json_get(it, "content");
    for (size_t k = 0; parts && parts->type == JSON_ARRAY && k < parts->count; k++) {
        const json_value *t = json_get(parts->items[k], "text");
        if (!json_string(t)) continue;
        if (k) sb_puts(out, "\n\n");
        sb_append(out, t->str, t->len);
    }
}

static int add_item(srv_convo *cv, const json_value *it, size_t i, srv_reply *r) {
    char param[64];
    snprintf(param, sizeof param, "input[%zu]", i);
    if (!it || it->type != JSON_OBJECT) return srv_error(r, 400, param, "invalid_type", "%s must be an object", param), -1;
    const char *type = json_get_string(it, "type", json_get(it, "role") ? "message" : "");
    strbuf t;
    sb_init(&t);
    int rc = 0;
    if (!strcmp(type, "message")) {
        const char *role = json_get_string(it, "role", "");
        char cparam[80];
        snprintf(cparam, sizeof cparam, "%s.content", param);
        if (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") && strcmp(role, "developer"))
            rc = (srv_error(r, 400, param, "invalid_value", "%s.role must be user, assistant, system or developer", param), -1);
        else if (!(rc = content_text(json_get(it, "content"), cparam, &t, r))) {
            const char *s = t.data ? t.data : "";
            if (!strcmp(role, "user")) {
                srv_convo_user(cv, s, t.len);
                srv_convo_break(cv);
            } else if (!strcmp(role, "assistant")) {
                srv_convo_assistant(cv, s, t.len);
            } else {
                srv_convo_system(cv, s, t.len);
            }
        }
    } else if (!strcmp(type, "reasoning")) {
        reasoning_text(it, &t);
        srv_convo_reasoning(cv, t.data ? t.data : "", t.len);
    } else if (!strcmp(type, "function_call")) {
        const json_value *name = json_get(it, "name"), *args = json_get(it, "arguments");
        json_value *pa = NULL;
        if (!json_string(name) || (args && !json_string(args)))
            rc = (srv_error(r, 400, param, "invalid_value", "%s: a function_call needs a string name and arguments", param), -1);
        else if (args && (!(pa = json_parse(args->str, args->len, JSON_DEFAULT_MAX_DEPTH, NULL, 0)) ||
                          pa->type != JSON_OBJECT)) {
            json_free(pa);
            rc = (srv_error(r, 400, param, "invalid_value", "%s.arguments is not a JSON object", param), -1);
        } else {
            /* a call of a namespace's tool: the model saw (and wrote) NS__NAME */
            const char *ns = json_get_string(it, "namespace", NULL);
            char full[512];
            snprintf(full, sizeof full, "%s%s%s", ns ? ns : "", ns ? "__" : "", name->str);
            srv_convo_tool_call(cv, json_get_string(it, "call_id", NULL), full, pa);
        }
    } else if (!strcmp(type, "function_call_output")) {
        const json_value *out = json_get(it, "output");
        char oparam[80];
        snprintf(oparam, sizeof oparam, "%s.output", param);
        if (!(rc = content_text(out, oparam, &t, r)))
            srv_convo_tool_result(cv, json_get_string(it, "call_id", NULL), t.data ? t.data : "", t.len);
    } else {
        rc = (srv_error(r, 400, param, "unsupported_value", "%s: input items of type \"%.40s\" are not supported", param,
                       type), -1);
    }
    sb_free(&t);
    return rc;
}

static void add_function(json_value *tools, const json_value *t, const char *ns) {
    const json_value *name = json_get(t, "name");
    if (!json_string(name)) return;
    char full[512];
    snprintf(full, sizeof full, "%s%s%s", ns ? ns : "", ns ? "__" : "", name->str);
    srv_tool_add(tools, full, json_get(t, "description"), json_get(t, "parameters"));
}

static int add_tools(json_value *tools, const json_value *req, srv_reply *r) {
    const json_value *ts = json_get(req, "tools");
    if (!ts || ts->type == JSON_NULL) return 0;
    if (ts->type != JSON_ARRAY) return srv_error(r, 400, "tools", "invalid_type", "tools must be an array"), -1;
    for (size_t k = 0; k < ts->count; k++) {
        const json_value *t = ts->items[k];
        const char *type = json_get_string(t, "type", "");
        if (!strcmp(type, "function")) {
            if (!json_string(json_get(t, "name")))
                return srv_error(r, 400, "tools", "invalid_value", "tools[%zu].name must be a string", k), -1;
            add_function(tools, t, NULL);
        } else if (!strcmp(type, "namespace")) {
            const json_value *kids = json_get(t, "tools");
            const char *ns = json_get_string(t, "name", NULL);
            for (size_t j = 0; ns && kids && kids->type == JSON_ARRAY && j < kids->count; j++)
                if (!strcmp(json_get_string(kids->items[j], "type", "function"), "function"))
                    add_function(tools, kids->items[j], ns);
        } /* other types: tools this server cannot run, left out */
    }
    return 0;
}

/* text.format: a system instruction for json_object / json_schema. */
static int format_instruction(const json_value *req, srv_convo *cv, srv_reply *r) {
    const json_value *f = json_get(json_get(req, "text"), "format");
    if (!f || f->type == JSON_NULL) return 0;
    const char *type = json_get_string(f, "type", "");
    if (!strcmp(type, "text")) return 0;
    strbuf t;
    sb_init(&t);
    if (!strcmp(type, "json_object")) {
        sb_puts(&t, "Respond with a single JSON object and nothing else.");
    } else if (!strcmp(type, "json_schema") && json_get(f, "schema")) {
        sb_puts(&t, "Respond with a single JSON value that matches this JSON schema, and nothing else:\n");
        json_write(&t, json_get(f, "schema"), JSON_COMPACT);
    } else {
        sb_free(&t);
        return srv_error(r, 400, "text.format", "invalid_value",
                         "text.format.type must be text, json_object or json_schema (with a schema)"), -1;
    }
    srv_convo_system(cv, t.data, t.len);
    sb_free(&t);
    return 0;
}

static int build_plan(const srv_request *q, const json_value *req, plan *p, srv_reply *r) {
    memset(p, 0, sizeof *p);
    srv_convo cv;
    srv_convo_init(&cv);
    json_value *tools = json_new(JSON_ARRAY);
    p->history = json_new(JSON_ARRAY);
    const json_value *prev = json_get(req, "previous_response_id"), *input = json_get(req, "input");
    const json_value *instr = json_get(req, "instructions");
    if (prev && prev->type != JSON_NULL) {
        strbuf items;
        sb_init(&items);
        json_value *pv = NULL;
        if (!json_string(prev) || !store() || srv_response_store_get(store(), prev->str, NULL, &items) ||
            !(pv = json_parse(items.data ? items.data : "", items.len, JSON_DEFAULT_MAX_DEPTH, NULL, 0))) {
            sb_free(&items);
            srv_error(r, 404, "previous_response_id", "previous_response_not_found",
                      "Previous response with id '%.80s' not found.", json_string(prev) ? prev->str : "");
            goto fail;
        }
        for (size_t i = 0; pv->type == JSON_ARRAY && i < pv->count; i++) json_arr_push(p->history, json_clone(pv->items[i]));
        json_free(pv);
        sb_free(&items);
    }
    size_t n_prev = p->history->count;
    if (json_string(input)) {
        json_value *m = json_new(JSON_OBJECT);
        json_obj_set(m, "type", json_new_string("message"));
        json_obj_set(m, "role", json_new_string("user"));
        json_obj_set(m, "content", json_clone(input));
        json_arr_push(p->history, m);
    } else if (input && input->type == JSON_ARRAY) {
        for (size_t i = 0; i < input->count; i++) json_arr_push(p->history, json_clone(input->items[i]));
    } else {
        srv_error(r, 400, "input", "invalid_type", "input must be a string or an array of items");
        goto fail;
    }
    if (instr && instr->type != JSON_NULL && !json_string(instr)) {
        srv_error(r, 400, "instructions", "invalid_type", "instructions must be a string");
        goto fail;
    }
    if (json_string(instr) && instr->len) srv_convo_system(&cv, instr->str, instr->len);
    if (format_instruction(req, &cv, r)) goto fail;
    for (size_t i = 0; i < p->history->count; i++) {
        /* errors name the request's own items: input[i - n_prev] */
        if (add_item(&cv, p->history->items[i], i < n_prev ? i : i - n_prev, r)) goto fail;
    }
    if (add_tools(tools, req, r)) goto fail;
    const json_value *tc = json_get(req, "tool_choice");
    const char *forced = NULL, *tcs = json_string(tc);
    int none = tcs && !strcmp(tcs, "none");
    if (tcs && strcmp(tcs, "auto") && strcmp(tcs, "none") && strcmp(tcs, "required")) {
        srv_error(r, 400, "tool_choice", "invalid_value", "tool_choice must be auto, none, required or a function");
        goto fail;
    }
    if (tcs && !strcmp(tcs, "required")) forced = "";
    if (tc && tc->type == JSON_OBJECT && !strcmp(json_get_string(tc, "type", ""), "function")) {
        forced = json_get_string(tc, "name", "");
        if (!srv_tools_has(tools, forced)) {
            srv_error(r, 400, "tool_choice", "invalid_value", "tool_choice.name \"%.80s\" is not one of the tools", forced);
            goto fail;
        }
    }
    if (!tools->count || none) forced = NULL;
    const json_value *eff = json_get(json_get(req, "reasoning"), "effort");
    const char *effort = json_string(eff) ? eff->str : q->srv->opt.default_reasoning_effort;
    if (eff && eff->type != JSON_NULL && (!json_string(eff) || !srv_reasoning_effort_valid(eff->str))) {
        srv_error(r, 400, "reasoning.effort", "invalid_value",
                  "reasoning.effort must be one of none, minimal, low, medium, high, xhigh, max");
        goto fail;
    }
    p->in = srv_convo_input(&cv);
    if (tools->count && !none) {
        json_obj_set(p->in, "tools", tools);
        tools = NULL;
    }
    json_obj_set(p->in, "add_generation_prompt", json_new_bool(1));
    if (forced) {
        p->prefill = srv_forced_call_prefill(*forced ? forced : NULL);
        json_obj_set(p->in, "enable_thinking", json_new_bool(0));
    } else if (effort) {
        json_obj_set(p->in, "enable_thinking", json_new_bool(strcmp(effort, "none") != 0));
    }
    json_free(tools);
    srv_convo_free(&cv);
    return 0;
fail:
    json_free(tools);
    srv_convo_free(&cv);
    plan_free(p);
    return -1;
}

/* ---- items: parser events -> SSE events and the final output array ------------------------------ */

enum { ITEM_NONE, ITEM_REASONING, ITEM_MESSAGE, ITEM_CALL };

typedef struct rsp {
    srv_server *srv;
    srv_turn turn;
    json_value *req;         /* echoed fields */
    plan plan;
    char id[40];
    long long created;
    const char *model;
    int stream, store, echo_prompt, in_reasoning, clamped;
    strbuf prompt;
    strbuf *sse;
    int seq, started;
    int kind, index;         /* the open item and its output_index */
    char item_id[40], call_id[64], call_name[512];
    strbuf acc;              /* the open item's text / arguments */
    strbuf output;           /* the output array's items, comma-separated */
    strbuf reasoning;        /* all reasoning text, for reasoning_tokens */
    int n_calls;
} rsp;

static void rsp_free(rsp *a) {
    if (!a) return;
    srv_turn_free(&a->turn);
    json_free(a->req);
    plan_free(&a->plan);
    sb_free(&a->prompt);
    sb_free(&a->acc);
    sb_free(&a->output);
    sb_free(&a->reasoning);
    free(a);
}

static void jstr(strbuf *b, const char *s, size_t n) { json_write_string(b, s, n, JSON_COMPACT); }

/* event: TYPE / data: {"type":TYPE,"sequence_number":N ... (the caller closes it with ev_end) */
static void ev(rsp *a, const char *type) {
    srv_sse_event(a->sse, type);
    sb_printf(a->sse, "{\"type\":\"%s\",\"sequence_number\":%d", type, a->seq++);
}

static void ev_end(rsp *a) { sb_puts(a->sse, "}\n\n"); }

static void ev_item(rsp *a, const char *type) {
    ev(a, type);
    sb_printf(a->sse, ",\"item_id\":\"%s\",\"output_index\":%d", a->item_id, a->index);
}

static void ev_text(rsp *a, const char *key, const char *s, size_t n) {
    sb_printf(a->sse, ",\"%s\":", key);
    jstr(a->sse, s, n);
}

/* NS when name is NS__CHILD for a namespace tool of the request: its length, else 0. */
static size_t namespace_len(const json_value *req, const char *name) {
    const json_value *ts = json_get(req, "tools");
    for (size_t k = 0; ts && ts->type == JSON_ARRAY && k < ts->count; k++) {
        const char *ns = json_get_string(ts->items[k], "name", NULL);
        size_t n = ns ? strlen(ns) : 0;
        if (n && !strcmp(json_get_string(ts->items[k], "type", ""), "namespace") && !strncmp(name, ns, n) &&
            !strncmp(name + n, "__", 2))
            return n;
    }
    return 0;
}

/* The open item as JSON (status "in_progress" while open). */
static void write_item(rsp *a, strbuf *b, const char *status, int full) {
    const char *acc = a->acc.data ? a->acc.data : "";
    size_t n = full ? a->acc.len : 0;
    if (a->kind == ITEM_REASONING) {
        sb_printf(b, "{\"id\":\"%s\",\"type\":\"reasoning\",\"summary\":[", a->item_id);
        if (full) {
            sb_puts(b, "{\"type\":\"summary_text\",\"text\":");
            jstr(b, acc, n);
            sb_puts(b, "}],\"encrypted_content\":");
            strbuf seal;
            sb_init(&seal);
            srv_reasoning_seal(acc, n, &seal);
            jstr(b, seal.data, seal.len);
            sb_free(&seal);
            sb_puts(b, "}");
        } else {
            sb_puts(b, "]}");
        }
    } else if (a->kind == ITEM_MESSAGE) {
        sb_printf(b, "{\"id\":\"%s\",\"type\":\"message\",\"status\":\"%s\",\"role\":\"assistant\",\"content\":[", a->item_id,
                  status);
        if (full) {
            sb_puts(b, "{\"type\":\"output_text\",\"annotations\":[],\"logprobs\":[],\"text\":");
            jstr(b, acc, n);
            sb_puts(b, "}");
        }
        sb_puts(b, "]}");
    } else {
        sb_printf(b, "{\"id\":\"%s\",\"type\":\"function_call\",\"status\":\"%s\",\"arguments\":", a->item_id, status);
        jstr(b, acc, n);
        sb_puts(b, ",\"call_id\":");
        jstr(b, a->call_id, strlen(a->call_id));
        size_t ns = namespace_len(a->req, a->call_name);
        if (ns) {
            sb_puts(b, ",\"namespace\":");
            jstr(b, a->call_name, ns);
        }
        sb_puts(b, ",\"name\":");
        jstr(b, a->call_name + (ns ? ns + 2 : 0), strlen(a->call_name) - (ns ? ns + 2 : 0));
        sb_puts(b, "}");
    }
}

static void item_start(rsp *a, int kind) {
    a->kind = kind;
    sb_clear(&a->acc);
    srv_make_id(a->item_id, kind == ITEM_REASONING ? "rs_" : kind == ITEM_MESSAGE ? "msg_" : "fc_");
    if (!a->sse) return;
    ev(a, "response.output_item.added");
    sb_printf(a->sse, ",\"output_index\":%d,\"item\":", a->index);
    write_item(a, a->sse, "in_progress", 0);
    ev_end(a);
    if (kind == ITEM_REASONING) {
        ev_item(a, "response.reasoning_summary_part.added");
        sb_puts(a->sse, ",\"summary_index\":0,\"part\":{\"type\":\"summary_text\",\"text\":\"\"}");
        ev_end(a);
    } else if (kind == ITEM_MESSAGE) {
        ev_item(a, "response.content_part.added");
        sb_puts(a->sse, ",\"content_index\":0,\"part\":{\"type\":\"output_text\",\"annotations\":[],\"logprobs\":[],\"text\":\"\"}");
        ev_end(a);
    }
}

static void item_delta(rsp *a, const char *s, size_t n) {
    sb_append(&a->acc, s, n);
    if (!a->sse) return;
    if (a->kind == ITEM_REASONING) {
        ev_item(a, "response.reasoning_summary_text.delta");
        sb_puts(a->sse, ",\"summary_index\":0");
    } else if (a->kind == ITEM_MESSAGE) {
        ev_item(a, "response.output_text.delta");
        sb_puts(a->sse, ",\"content_index\":0,\"logprobs\":[]");
    } else {
        ev_item(a, "response.function_call_arguments.delta");
    }
    ev_text(a, "delta", s, n);
    ev_end(a);
}

static void item_stop(rsp *a, const char *status) {
    if (a->kind == ITEM_NONE) return;
    const char *acc = a->acc.data ? a->acc.data : "";
    if (a->sse) {
        if (a->kind == ITEM_REASONING) {
            ev_item(a, "response.reasoning_summary_text.done");
            sb_puts(a->sse, ",\"summary_index\":0");
            ev_text(a, "text", acc, a->acc.len);
            ev_end(a);
            ev_item(a, "response.reasoning_summary_part.done");
            sb_puts(a->sse, ",\"summary_index\":0,\"part\":{\"type\":\"summary_text\"");
            ev_text(a, "text", acc, a->acc.len);
            sb_puts(a->sse, "}");
            ev_end(a);
        } else if (a->kind == ITEM_MESSAGE) {
            ev_item(a, "response.output_text.done");
            sb_puts(a->sse, ",\"content_index\":0,\"logprobs\":[]");
            ev_text(a, "text", acc, a->acc.len);
            ev_end(a);
            ev_item(a, "response.content_part.done");
            sb_puts(a->sse, ",\"content_index\":0,\"part\":{\"type\":\"output_text\",\"annotations\":[],\"logprobs\":[]");
            ev_text(a, "text", acc, a->acc.len);
            sb_puts(a->sse, "}");
            ev_end(a);
        } else {
            ev_item(a, "response.function_call_arguments.done");
            ev_text(a, "arguments", acc, a->acc.len);
            size_t ns = namespace_len(a->req, a->call_name);
            ev_text(a, "name", a->call_name + (ns ? ns + 2 : 0), strlen(a->call_name) - (ns ? ns + 2 : 0));
            ev_end(a);
        }
        ev(a, "response.output_item.done");
        sb_printf(a->sse, ",\"output_index\":%d,\"item\":", a->index);
        write_item(a, a->sse, status, 1);
        ev_end(a);
    }
    if (a->output.len) sb_putc(&a->output, ',');
    write_item(a, &a->output, status, 1);
    a->index++;
    a->kind = ITEM_NONE;
}

static void on_event(void *ctx, const splash_output_event *e) {
    rsp *a = ctx;
    switch (e->kind) {
    case SPLASH_OUTPUT_REASONING:
    case SPLASH_OUTPUT_CONTENT: {
        int kind = e->kind == SPLASH_OUTPUT_REASONING ? ITEM_REASONING : ITEM_MESSAGE;
        if (kind == ITEM_REASONING) sb_append(&a->reasoning, e->text, e->len);
        if (a->kind != kind) {
            item_stop(a, "completed");
            item_start(a, kind);
        }
        item_delta(a, e->text, e->len);
        break;
    }
    case SPLASH_OUTPUT_REASONING_END:
        if (a->kind == ITEM_REASONING) item_stop(a, "completed");
        break;
    case SPLASH_OUTPUT_CALL_BEGIN:
        item_stop(a, "completed");
        snprintf(a->call_id, sizeof a->call_id, "%s", e->id);
        snprintf(a->call_name, sizeof a->call_name, "%s", e->name);
        a->n_calls++;
        item_start(a, ITEM_CALL);
        break;
    case SPLASH_OUTPUT_CALL_ARGS:
        item_delta(a, e->text, e->len);
        break;
    case SPLASH_OUTPUT_CALL_END:
        if (a->kind == ITEM_CALL) item_stop(a, "completed");
        break;
    default:
        break;
    }
}

static int start_parser(rsp *a) {
    splash_output_opts o = {.in_reasoning = a->in_reasoning, .tools = json_get(a->plan.in, "tools"), .id_prefix = "call_"};
    return srv_turn_parser(&a->turn, &o, on_event, a, a->plan.prefill);
}

/* ---- the response object ------------------------------------------------------------------------ */

/* "key": the request's value, or dflt (a JSON literal) */
static void echo(rsp *a, strbuf *b, const char *key, const char *dflt) {
    const json_value *v = json_get(a->req, key);
    sb_printf(b, ",\"%s\":", key);
    if (v && v->type != JSON_NULL) json_write(b, v, JSON_COMPACT);
    else sb_puts(b, dflt);
}

/* status: in_progress | completed | incomplete | failed.  t: NULL while in progress. */
static void write_response(rsp *a, strbuf *b, const char *status, const splash_gen_take *t, const char *error) {
    sb_printf(b, "{\"id\":\"%s\",\"object\":\"response\",\"created_at\":%lld,\"status\":\"%s\",\"background\":false,\"error\":",
              a->id, a->created, status);
    if (error) {
        sb_puts(b, "{\"code\":\"server_error\",\"message\":");
        jstr(b, error, strlen(error));
        sb_puts(b, "}");
    } else {
        sb_puts(b, "null");
    }
    sb_printf(b, ",\"incomplete_details\":%s", !strcmp(status, "incomplete") ? "{\"reason\":\"max_output_tokens\"}" : "null");
    echo(a, b, "instructions", "null");
    echo(a, b, "max_output_tokens", "null");
    sb_puts(b, ",\"max_tool_calls\":null,\"model\":");
    jstr(b, a->model, strlen(a->model));
    sb_puts(b, ",\"output\":[");
    if (t) sb_append(b, a->output.data ? a->output.data : "", a->output.len);
    sb_puts(b, "]");
    echo(a, b, "parallel_tool_calls", "true");
    echo(a, b, "previous_response_id", "null");
    echo(a, b, "prompt_cache_key", "null");
    echo(a, b, "reasoning", "{\"effort\":null,\"summary\":null}");
    sb_printf(b, ",\"service_tier\":\"default\",\"store\":%s", a->store ? "true" : "false");
    echo(a, b, "temperature", "1.0");
    echo(a, b, "text", "{\"format\":{\"type\":\"text\"}}");
    echo(a, b, "tool_choice", "\"auto\"");
    echo(a, b, "tools", "[]");
    echo(a, b, "top_p", "0.95");
    sb_puts(b, ",\"truncation\":\"disabled\",\"usage\":");
    if (t) {
        int reasoning = srv_count_tokens(a->srv, a->reasoning.data, a->reasoning.len);
        if (reasoning > t->n_tokens) reasoning = t->n_tokens;
        sb_printf(b,
                  "{\"input_tokens\":%d,\"input_tokens_details\":{\"cached_tokens\":%d},\"output_tokens\":%d,"
                  "\"output_tokens_details\":{\"reasoning_tokens\":%d},\"total_tokens\":%d}",
                  a->turn.g->n_prompt, a->turn.g->n_cached, t->n_tokens, reasoning, a->turn.g->n_prompt + t->n_tokens);
    } else {
        sb_puts(b, "null");
    }
    echo(a, b, "user", "null");
    echo(a, b, "metadata", "{}");
    sb_puts(b, "}");
}

/* Finishes the output and writes the final response object; stores it. */
static const char *finish(rsp *a, const splash_gen_take *t, strbuf *resp) {
    const char *status = t->finish == SPLASH_FINISH_LENGTH ? "incomplete" : "completed";
    item_stop(a, status);
    write_response(a, resp, status, t, NULL);
    if (a->store && store()) {
        strbuf items;
        sb_init(&items);
        sb_putc(&items, '[');
        for (size_t i = 0; i < a->plan.history->count; i++) {
            if (i) sb_putc(&items, ',');
            json_write(&items, a->plan.history->items[i], JSON_COMPACT);
        }
        if (a->plan.history->count && a->output.len) sb_putc(&items, ',');
        sb_append(&items, a->output.data ? a->output.data : "", a->output.len);
        sb_putc(&items, ']');
        srv_response_store_put(store(), a->id, resp->data, resp->len, items.data, items.len);
        sb_free(&items);
    }
    return status;
}

/* ---- replies ------------------------------------------------------------------------------------- */

static void reply_whole(rsp *a, srv_reply *r) {
    splash_gen_take t;
    if (srv_turn_whole(&a->turn, &t, r)) return;
    finish(a, &t, &r->body);
    if (a->echo_prompt && r->body.len) { /* the test hook: the prompt beside the response */
        r->body.len--;
        sb_puts(&r->body, ",\"test_prompt\":");
        jstr(&r->body, a->prompt.data ? a->prompt.data : "", a->prompt.len);
        sb_puts(&r->body, "}");
    }
    r->status = 200;
    r->content_type = "application/json";
}

static void stream_produce(void *ctx, strbuf *out, int *done) {
    rsp *a = ctx;
    a->sse = out;
    if (!a->started) {
        a->started = 1;
        ev(a, "response.created");
        sb_puts(out, ",\"response\":");
        write_response(a, out, "in_progress", NULL, NULL);
        ev_end(a);
        ev(a, "response.in_progress");
        sb_puts(out, ",\"response\":");
        write_response(a, out, "in_progress", NULL, NULL);
        ev_end(a);
        return;
    }
    splash_gen_take t;
    int st = srv_turn_step(&a->turn, srv_keepalive_ms(a->srv), &t);
    if (st == SRV_TURN_IDLE) sb_puts(out, ": keep-alive\n\n");
    if (st == SRV_TURN_IDLE || st == SRV_TURN_MORE) return;
    *done = 1;
    if (st == SRV_TURN_FAILED) {
        int status;
        const char *msg;
        srv_gen_error_status(&t, &status, &msg);
        ev(a, "response.failed");
        sb_puts(out, ",\"response\":");
        write_response(a, out, "failed", NULL, msg);
        ev_end(a);
        return;
    }
    strbuf resp;
    sb_init(&resp);
    const char *status = finish(a, &t, &resp);
    ev(a, !strcmp(status, "completed") ? "response.completed" : "response.incomplete");
    sb_puts(out, ",\"response\":");
    sb_append(out, resp.data, resp.len);
    ev_end(a);
    sb_free(&resp);
}

static void stream_cancel(void *ctx) { splash_gen_cancel(((rsp *)ctx)->turn.g); }
static void stream_free(void *ctx) { rsp_free(ctx); }

/* ---- handlers ------------------------------------------------------------------------------------ */

static void create(const srv_request *q, srv_reply *r) {
    srv_server *srv = q->srv;
    json_value *req = srv_parse_body(q, r);
    if (!req) return;
    rsp *a = calloc(1, sizeof *a);
    if (!a || !(a->turn.g = splash_gen_new())) {
        srv_error(r, 500, NULL, "out_of_memory", "out of memory");
        json_free(req);
        free(a);
        return;
    }
    a->srv = srv;
    a->req = req;
    a->model = srv->opt.served_names[0];
    sb_init(&a->prompt);
    sb_init(&a->acc);
    sb_init(&a->output);
    sb_init(&a->reasoning);
    splash_gen *g = a->turn.g;
    const json_value *v;
    int64_t max_tokens = -1;
    if (srv_int_param(req, "max_output_tokens", &max_tokens, r) < 0) goto done;
    if (max_tokens == 0 || max_tokens < -1) {
        srv_error(r, 400, "max_output_tokens", "invalid_value", "max_output_tokens must be at least 1");
        goto done;
    }
    static const char *bools[] = {"stream", "store", "parallel_tool_calls", "background"};
    for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++)
        if ((v = json_get(req, bools[i])) && v->type != JSON_NULL && !json_is_bool(v)) {
            srv_error(r, 400, bools[i], "invalid_type", "%s must be a boolean", bools[i]);
            goto done;
        }
    if (json_get_bool(req, "background", 0)) {
        srv_error(r, 400, "background", "unsupported_value", "background responses are not supported");
        goto done;
    }
    a->stream = json_get_bool(req, "stream", 0);
    a->store = json_get_bool(req, "store", 1);
    if ((a->echo_prompt = srv_test_echo_prompt(q, req, r)) < 0) goto done;
    if (srv_sampling_params(req, g, r) || build_plan(q, req, &a->plan, r)) goto done;
    srv_gen_setup setup = {.max_tokens = max_tokens, .clamp = 1, .param = "input", .prefill = a->plan.prefill};
    int rc = srv_gen_prepare(q, req, a->plan.in, g, &setup, r);
    a->in_reasoning = setup.in_reasoning && !a->plan.prefill;
    a->prompt = setup.prompt;
    if (rc) goto done;
    srv_make_id(a->id, "resp_");
    a->created = (long long)time(NULL);
    if (srv_gen_submit(q, g, r)) goto done;
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
done:
    rsp_free(a);
}

static void get_or_delete(const srv_request *q, srv_reply *r, const char *id) {
    srv_response_store *s = store();
    int del = !strcmp(q->method, "DELETE");
    int rc = !s ? SPLASH_E_NOTFOUND : del ? srv_response_store_delete(s, id) : srv_response_store_get(s, id, &r->body, NULL);
    if (rc) {
        srv_error(r, 404, NULL, "not_found", "Response with id '%.80s' not found.", id);
        return;
    }
    if (del) {
        sb_puts(&r->body, "{\"id\":");
        jstr(&r->body, id, strlen(id));
        sb_puts(&r->body, ",\"object\":\"response.deleted\",\"deleted\":true}");
    }
    r->status = 200;
    r->content_type = "application/json";
}

int srv_route_responses(const srv_request *q, srv_reply *r) {
    const char *p = q->path, *m = q->method;
    if (!strncmp(p, "/v1/", 4)) p += 3;
    if (strncmp(p, "/responses", 10) || (p[10] && p[10] != '/')) return 0;
    if (!p[10] && !strcmp(m, "POST")) create(q, r);
    else if (p[10] && p[11] && !strchr(p + 11, '/') && (!strcmp(m, "GET") || !strcmp(m, "DELETE")))
        get_or_delete(q, r, p + 11);
    else if (p[10] && p[11] && !strchr(p + 11, '/'))
        srv_error(r, 405, NULL, "method_not_allowed", "%s is not allowed on %s", m, q->path);
    else if (!p[10])
        srv_error(r, 405, NULL, "method_not_allowed", "%s is not allowed on %s", m, q->path);
    else
        return 0;
    return 1;
}
