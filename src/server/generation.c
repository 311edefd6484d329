/* generation.c - the steps every generating API shares (generation.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "base/sha256.h"
#include "server/generation.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

uint64_t srv_random64(void) {
    uint64_t x = 0;
    if (getrandom(&x, sizeof x, 0) != sizeof x) x = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)clock();
    return x;
}

void srv_make_id(char *out, const char *prefix) {
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    size_t n = strlen(prefix);
    memcpy(out, prefix, n);
    uint64_t a = srv_random64(), b = srv_random64();
    for (int i = 0; i < 24; i++) {
        uint64_t *w = i < 12 ? &a : &b;
        out[n + i] = al[*w % 62];
        *w /= 62;
    }
    out[n + 24] = 0;
}

/* ---- request parameters -------------------------------------------------------------- */

static int is_num(const json_value *v) { return v && v->type == JSON_NUMBER; }

int srv_number_param(const json_value *req, const char *name, double *out, srv_reply *r) {
    const json_value *v = json_get(req, name);
    if (!v || v->type == JSON_NULL) return 0;
    if (!is_num(v)) {
        srv_error(r, 400, name, "invalid_type", "%s must be a number", name);
        return -1;
    }
    *out = v->num;
    return 0;
}

int srv_int_param(const json_value *req, const char *name, int64_t *out, srv_reply *r) {
    const json_value *v = json_get(req, name);
    if (!v || v->type == JSON_NULL) return 0;
    if (!is_num(v) || json_int64(v, out)) {
        srv_error(r, 400, name, "invalid_type", "%s must be an integer", name);
        return -1;
    }
    return 1;
}

int srv_sampling_params(const json_value *req, splash_gen *g, srv_reply *r) {
    splash_sampling_params *p = &g->sp;
    splash_sampling_params_default(p);
    p->temperature = 1.0;
    p->top_p = 0.95;
    p->top_k = 20;
    int64_t k;
    int rc;
    if (srv_number_param(req, "temperature", &p->temperature, r) || srv_number_param(req, "top_p", &p->top_p, r) ||
        srv_number_param(req, "min_p", &p->min_p, r) ||
        srv_number_param(req, "presence_penalty", &p->presence_penalty, r) ||
        srv_number_param(req, "frequency_penalty", &p->frequency_penalty, r) ||
        srv_number_param(req, "repetition_penalty", &p->repetition_penalty, r))
        return -1;
    if ((rc = srv_int_param(req, "top_k", &k, r)) < 0) return -1;
    if (rc) {
        if (k < -1 || k > 1000000000) return srv_error(r, 400, "top_k", "invalid_value", "top_k must be -1, 0 or positive"), -1;
        p->top_k = (int)k;
    }
    const json_value *sv = json_get(req, "seed");
    if (sv && sv->type != JSON_NULL) {
        if (!is_num(sv) || !sv->is_int) return srv_error(r, 400, "seed", "invalid_type", "seed must be an integer"), -1;
        p->seed = sv->str[0] == '-' ? (uint64_t)(int64_t)strtoll(sv->str, NULL, 10) : strtoull(sv->str, NULL, 10);
        p->seed_given = 1;
    } else {
        p->seed = srv_random64();
    }
    splash_error err = {0};
    if (splash_sampling_params_validate(p, &err)) {
        char name[48];
        size_t n = strcspn(err.msg, " :");
        snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1), err.msg);
        return srv_error(r, 400, name, "invalid_value", "%s", err.msg), -1;
    }
    return 0;
}

int srv_stop_strings(const json_value *s, const char *param, splash_gen *g, srv_reply *r) {
    if (!s || s->type == JSON_NULL) return 0;
    if (s->type == JSON_STRING) {
        if (!s->len || memchr(s->str, 0, s->len)) /* a NUL would cut it to "" (matches at once) */
            return srv_error(r, 400, param, "invalid_value", "%s must be a non-empty string without NUL", param), -1;
        g->stop[g->n_stop++] = strndup(s->str, s->len);
        return 0;
    }
    if (s->type != JSON_ARRAY || s->count > SPLASH_MAX_STOP)
        return srv_error(r, 400, param, "invalid_value", "%s must be a string or an array of at most %d strings", param,
                         SPLASH_MAX_STOP), -1;
    for (size_t i = 0; i < s->count; i++) {
        if (!json_string(s->items[i]) || !s->items[i]->len || memchr(s->items[i]->str, 0, s->items[i]->len))
            return srv_error(r, 400, param, "invalid_value", "%s[%zu] must be a non-empty string", param, i), -1;
        g->stop[g->n_stop++] = strndup(s->items[i]->str, s->items[i]->len);
    }
    return 0;
}

int srv_test_echo_prompt(const srv_request *q, const json_value *req, srv_reply *r) {
    const json_value *v = json_get(req, "test_echo_prompt");
    if (!v) return 0;
    if (!q->srv->opt.test_hooks)
        return srv_error(r, 400, "test_echo_prompt", "unsupported_parameter",
                         "test_echo_prompt exists only for tests (serve --test-hooks)"), -1;
    if (!json_is_bool(v)) return srv_error(r, 400, "test_echo_prompt", "invalid_type", "test_echo_prompt must be a boolean"), -1;
    return v->type == JSON_TRUE;
}

int srv_keepalive_ms(const srv_server *s) { return s->opt.keepalive_ms > 0 ? s->opt.keepalive_ms : 2000; }

/* The engine sets n_prefilled and broadcasts the gen's cv after each prefill
 * chunk (engine.h), so this wakes once per chunk rather than polling. */
void srv_gen_progress_wait(splash_gen *g, int processed, int timeout_ms, srv_progress *p) {
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    if (timeout_ms < 0) timeout_ms = 0;
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        int done = g->n_prefilled > processed || g->state >= SPLASH_GEN_DECODE || g->text.len;
        if (done || pthread_cond_timedwait(&g->cv, &g->mu, &dl)) break;
    }
    p->state = g->state;
    p->total = g->n_prompt;
    p->cache = g->n_cached;
    p->processed = g->n_prefilled > g->n_cached ? g->n_prefilled : g->n_cached;
    if (g->state >= SPLASH_GEN_DECODE && g->finish != SPLASH_FINISH_ERROR && g->finish != SPLASH_FINISH_CANCELLED)
        p->processed = g->n_prompt; /* read whole (a gen that ends in its first step never shows DECODE) */
    p->time_ms = g->t_start > 0 ? 1e3 * (splash_now() - g->t_start) : 0.0;
    pthread_mutex_unlock(&g->mu);
}

int srv_count_tokens(const srv_server *s, const char *text, size_t n) {
    if (!n) return 0;
    splash_token_vec v = {0};
    splash_error err = {0};
    int k = splash_tokenizer_encode(splash_engine_tokenizer(s->engine), text, n, 0, &v, &err) ? 0 : (int)v.len;
    splash_token_vec_free(&v);
    return k;
}

void srv_gen_error_status(const splash_gen_take *t, int *status, const char **msg) {
    *status = 500;
    *msg = t->error[0] ? t->error : "generation failed";
    if (t->finish == SPLASH_FINISH_ERROR && strstr(t->error, "stopping")) *status = 503;
}

int srv_gen_failed_reply(const splash_gen_take *t, srv_reply *r) {
    if (t->finish != SPLASH_FINISH_ERROR && t->finish != SPLASH_FINISH_CANCELLED) return 0;
    int st;
    const char *msg;
    srv_gen_error_status(t, &st, &msg);
    srv_error(r, st, NULL, "generation_failed", "%s", msg);
    if (st == 503) r->retry_after = 1;
    return 1;
}

int srv_gen_failed_sse(const splash_gen_take *t, strbuf *out) {
    srv_reply er;
    memset(&er, 0, sizeof er);
    sb_init(&er.body);
    if (!srv_gen_failed_reply(t, &er)) {
        sb_free(&er.body);
        return 0;
    }
    sb_puts(out, "data: ");
    sb_append(out, er.body.data, er.body.len);
    sb_puts(out, "\n\ndata: [DONE]\n\n");
    sb_free(&er.body);
    return 1;
}

void srv_gen_collect(splash_gen *g, strbuf *text, splash_gen_take *t) {
    while (!splash_gen_wait(g, 1000, text, t) || t->finish == SPLASH_FINISH_NONE)
        if (srv_client_gone()) splash_gen_cancel(g);
}

/* ---- prompt -> gen ------------------------------------------------------------------------ */

int srv_gen_prepare(const srv_request *q, const json_value *req, const json_value *in, splash_gen *g,
                    srv_gen_setup *s, srv_reply *r) {
    srv_server *srv = q->srv;
    const char *param = s->param ? s->param : "messages";
    sb_init(&s->prompt);
    const json_value *script = json_get(req, "test_script");
    if (script && !srv->opt.test_hooks)
        return srv_error(r, 400, "test_script", "unsupported_parameter",
                         "test_script exists only for tests (serve --test-hooks)"), -1;
    if (script && !json_string(script))
        return srv_error(r, 400, "test_script", "invalid_type", "test_script must be a string"), -1;
    splash_error err = {0};
    if (splash_chat_template_render(in, &s->prompt, &err))
        return srv_error(r, 400, param, "template_error", "%s", err.msg), -1;
    s->in_reasoning = s->prompt.len >= 8 && !memcmp(s->prompt.data + s->prompt.len - 8, "<think>\n", 8);
    if (s->prefill) sb_puts(&s->prompt, s->prefill);
    if (s->prompt.oom) return srv_error(r, 500, NULL, "out_of_memory", "out of memory"), -1;
    const splash_tokenizer *tk = splash_engine_tokenizer(srv->engine);
    splash_token_vec toks = {0};
    if (splash_tokenizer_encode(tk, s->prompt.data, s->prompt.len, SPLASH_ENCODE_SPECIAL, &toks, &err)) {
        splash_token_vec_free(&toks);
        return srv_error(r, 400, param, NULL, "%s", err.msg), -1;
    }
    int ctx = splash_engine_max_context(srv->engine), np = (int)toks.len;
    int64_t max_tokens = s->max_tokens;
    if (s->clamp && np < ctx && max_tokens > ctx - np) {
        max_tokens = ctx - np;
        s->clamped = 1;
    }
    if (np >= ctx || (max_tokens > 0 && np + max_tokens > ctx)) {
        splash_token_vec_free(&toks);
        if (max_tokens > 0)
            srv_error(r, 400, param, "context_length_exceeded",
                      "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d in the "
                      "messages, %lld in the completion).",
                      ctx, (long long)(np + max_tokens), np, (long long)max_tokens);
        else
            srv_error(r, 400, param, "context_length_exceeded",
                      "This model's maximum context length is %d tokens. However, your messages resulted in %d tokens.",
                      ctx, np);
        return -1;
    }
    g->prompt = toks.ids;
    g->n_prompt = np;
    g->max_tokens = max_tokens > 0 ? (int)max_tokens : ctx - np;
    if (script) {
        splash_token_vec st = {0};
        if (splash_tokenizer_encode(tk, script->str, script->len, SPLASH_ENCODE_SPECIAL, &st, &err)) {
            splash_token_vec_free(&st);
            return srv_error(r, 400, "test_script", NULL, "%s", err.msg), -1;
        }
        g->script = st.ids;
        g->n_script = (int)st.len;
        if (!g->script) g->script = calloc(1, sizeof(int32_t));
    }
    return 0;
}

void srv_gen_setup_free(srv_gen_setup *s) { sb_free(&s->prompt); }

int srv_gen_submit(const srv_request *q, splash_gen *g, srv_reply *r) {
    splash_error err = {0};
    int rc = splash_engine_submit(q->srv->engine, g, &err);
    if (!rc) return 0;
    int st = rc == SPLASH_E_RANGE ? 429 : rc == SPLASH_E_UNSUPPORTED ? 503 : 400;
    srv_error(r, st, NULL, st == 429 ? "rate_limit_exceeded" : NULL, "%s", err.msg);
    if (st != 400) r->retry_after = 1;
    return -1;
}

/* ---- sealed reasoning ----------------------------------------------------------------------- */

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void seal_hash(const char *text, size_t n, char hex[65]) {
    splash_sha256 *h = splash_sha256_new();
    if (!h) {
        memset(hex, '0', 64);
        hex[64] = 0;
        return;
    }
    splash_sha256_update(h, "splash-reasoning\n", 17);
    splash_sha256_update(h, text, n);
    splash_sha256_finish(h, hex);
}

void srv_reasoning_seal(const char *text, size_t n, strbuf *out) {
    char hex[65];
    seal_hash(text, n, hex);
    sb_printf(out, "sr1_%.32s_", hex);
    const unsigned char *p = (const unsigned char *)text;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        char q[4] = {b64[w >> 18 & 63], b64[w >> 12 & 63], i + 1 < n ? b64[w >> 6 & 63] : '=', i + 2 < n ? b64[w & 63] : '='};
        sb_append(out, q, 4);
    }
}

static int b64_val(char c) {
    const char *p = c ? strchr(b64, c) : NULL;
    return p ? (int)(p - b64) : -1;
}

int srv_reasoning_unseal(const char *sealed, size_t n, strbuf *out) {
    if (n < 37 || memcmp(sealed, "sr1_", 4) || sealed[36] != '_' || (n - 37) % 4) return -1;
    strbuf t;
    sb_init(&t);
    for (size_t i = 37; i < n; i += 4) {
        int v[4], pad = 0;
        for (int k = 0; k < 4; k++) {
            char c = sealed[i + k];
            if (c == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
            } else if ((v[k] = b64_val(c)) < 0 || pad) {
                sb_free(&t);
                return -1;
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        char bytes[3] = {(char)(w >> 16), (char)(w >> 8 & 255), (char)(w & 255)};
        sb_append(&t, bytes, (size_t)(3 - pad));
    }
    /* canonical only: sealing the text again must give the same bytes (base64 can
     * hide edits in the unused bits of its last character) */
    strbuf again;
    sb_init(&again);
    srv_reasoning_seal(t.data ? t.data : "", t.len, &again);
    int ok = again.len == n && !memcmp(again.data, sealed, n) && !t.oom && !again.oom;
    if (ok) sb_append(out, t.data ? t.data : "", t.len);
    sb_free(&again);
    sb_free(&t);
    return ok ? 0 : -1;
}

/* ---- which stop string ---------------------------------------------------------------------- */

int srv_gen_stop_index(const srv_server *s, splash_gen *g, size_t text_len) {
    if (!g->n_stop) return -1;
    splash_gen_take t;
    strbuf none;
    sb_init(&none);
    splash_gen_wait(g, 0, &none, &t);
    sb_free(&none);
    int n = t.n_recorded;
    if (n <= 0) return -1;
    splash_gen_token *toks = malloc(sizeof *toks * (size_t)n);
    int32_t *ids = malloc(sizeof *ids * (size_t)n);
    int found = -1;
    if (toks && ids && (n = splash_gen_records(g, 0, n, toks, NULL)) > 0 && toks[n - 1].text_end > text_len) {
        found = 0; /* a stop string cut the text; which one: the one the raw text has at the cut */
        for (int i = 0; i < n; i++) ids[i] = toks[i].id;
        strbuf raw;
        sb_init(&raw);
        splash_error err = {0};
        if (!splash_tokenizer_decode(splash_engine_tokenizer(s->engine), ids, (size_t)n, SPLASH_DECODE_SKIP_SPECIAL, &raw,
                                     &err))
            for (int i = 0; i < g->n_stop; i++) {
                size_t sl = strlen(g->stop[i]);
                if (raw.len >= text_len + sl && !memcmp(raw.data + text_len, g->stop[i], sl)) {
                    found = i;
                    break;
                }
            }
        sb_free(&raw);
    }
    free(toks);
    free(ids);
    return found;
}

/* ---- the template's input from other histories ----------------------------------------------- */

void srv_convo_init(srv_convo *c) {
    memset(c, 0, sizeof *c);
    c->msgs = json_new(JSON_ARRAY);
    sb_init(&c->system);
}

void srv_convo_free(srv_convo *c) {
    json_free(c->msgs);
    sb_free(&c->system);
    memset(c, 0, sizeof *c);
}

void srv_convo_break(srv_convo *c) { c->open = NULL; }

static json_value *convo_open(srv_convo *c, int assistant) {
    if (c->open && c->open_assistant == assistant) return c->open;
    json_value *m = json_new(JSON_OBJECT);
    json_obj_set(m, "role", json_new_string(assistant ? "assistant" : "user"));
    json_obj_set(m, "content", json_new_string(""));
    json_arr_push(c->msgs, m);
    c->open = m;
    c->open_assistant = assistant;
    return m;
}

/* Appends text to a string member of m (created when absent). */
static void append_member(json_value *m, const char *key, const char *text, size_t n) {
    json_value *old = json_get(m, key);
    strbuf b;
    sb_init(&b);
    if (old && old->type == JSON_STRING) sb_append(&b, old->str, old->len);
    sb_append(&b, text, n);
    json_obj_set(m, key, json_new_stringn(b.data ? b.data : "", b.len));
    sb_free(&b);
}

void srv_convo_system(srv_convo *c, const char *text, size_t n) {
    if (c->msgs->count) {
        c->open = NULL;
        srv_convo_user(c, text, n);
        c->open = NULL;
        return;
    }
    if (c->n_system++) sb_puts(&c->system, "\n\n");
    sb_append(&c->system, text, n);
}

void srv_convo_user(srv_convo *c, const char *text, size_t n) { append_member(convo_open(c, 0), "content", text, n); }

static int assistant_has(const json_value *m, int reasoning) {
    const json_value *v = json_get(m, "content");
    if (v && v->len) return 1;
    if (json_get(m, "tool_calls")) return 1;
    return reasoning && json_get(m, "reasoning_content");
}

void srv_convo_reasoning(srv_convo *c, const char *text, size_t n) {
    if (c->open && c->open_assistant && assistant_has(c->open, 1)) c->open = NULL;
    append_member(convo_open(c, 1), "reasoning_content", text, n);
}

void srv_convo_assistant(srv_convo *c, const char *text, size_t n) {
    if (c->open && c->open_assistant && json_get(c->open, "tool_calls")) c->open = NULL;
    append_member(convo_open(c, 1), "content", text, n);
}

void srv_convo_tool_call(srv_convo *c, const char *id, const char *name, json_value *args) {
    json_value *m = convo_open(c, 1);
    json_value *calls = json_get(m, "tool_calls");
    if (!calls) {
        calls = json_new(JSON_ARRAY);
        json_obj_set(m, "tool_calls", calls);
    }
    json_value *call = json_new(JSON_OBJECT), *fn = json_new(JSON_OBJECT);
    if (id) json_obj_set(call, "id", json_new_string(id));
    json_obj_set(call, "type", json_new_string("function"));
    json_obj_set(fn, "name", json_new_string(name));
    json_obj_set(fn, "arguments", args ? args : json_new(JSON_OBJECT));
    json_obj_set(call, "function", fn);
    json_arr_push(calls, call);
}

void srv_convo_tool_result(srv_convo *c, const char *call_id, const char *text, size_t n) {
    json_value *m = json_new(JSON_OBJECT);
    json_obj_set(m, "role", json_new_string("tool"));
    if (call_id) json_obj_set(m, "tool_call_id", json_new_string(call_id));
    json_obj_set(m, "content", json_new_stringn(text, n));
    json_arr_push(c->msgs, m);
    c->open = NULL;
}

char *srv_convo_take_prefill(srv_convo *c) {
    if (!c->msgs->count) return NULL;
    json_value *m = c->msgs->items[c->msgs->count - 1];
    if (strcmp(json_get_string(m, "role", ""), "assistant") || json_get(m, "tool_calls") ||
        json_get(m, "reasoning_content"))
        return NULL;
    const json_value *t = json_get(m, "content");
    char *s = strndup(t && t->str ? t->str : "", t ? t->len : 0);
    json_free(m);
    c->msgs->count--;
    c->open = NULL;
    return s;
}

json_value *srv_convo_input(srv_convo *c) {
    json_value *in = json_new(JSON_OBJECT), *msgs = json_new(JSON_ARRAY);
    if (c->n_system) {
        json_value *m = json_new(JSON_OBJECT);
        json_obj_set(m, "role", json_new_string("system"));
        json_obj_set(m, "content", json_new_stringn(c->system.data ? c->system.data : "", c->system.len));
        json_arr_push(msgs, m);
    }
    for (size_t i = 0; i < c->msgs->count; i++) json_arr_push(msgs, c->msgs->items[i]);
    c->msgs->count = 0;
    json_obj_set(in, "messages", msgs);
    srv_convo_free(c);
    srv_convo_init(c);
    return in;
}

void srv_tool_add(json_value *tools, const char *name, const json_value *description, const json_value *parameters) {
    json_value *t = json_new(JSON_OBJECT), *fn = json_new(JSON_OBJECT);
    json_obj_set(t, "type", json_new_string("function"));
    json_obj_set(fn, "name", json_new_string(name));
    if (description && description->type != JSON_NULL) json_obj_set(fn, "description", json_clone(description));
    if (parameters && parameters->type != JSON_NULL) json_obj_set(fn, "parameters", json_clone(parameters));
    json_obj_set(t, "function", fn);
    json_arr_push(tools, t);
}

char *srv_forced_call_prefill(const char *name) {
    strbuf b;
    sb_init(&b);
    sb_puts(&b, "<tool_call>\n<function=");
    if (name) sb_printf(&b, "%s>\n", name);
    return sb_take(&b, NULL);
}

int srv_tools_has(const json_value *tools, const char *name) {
    for (size_t k = 0; tools && k < tools->count; k++)
        if (!strcmp(json_get_string(json_get(tools->items[k], "function"), "name", ""), name)) return 1;
    return 0;
}

/* ---- a turn through the output parser ------------------------------------------------------------ */

int srv_turn_parser(srv_turn *t, const splash_output_opts *o, splash_output_cb cb, void *ctx, const char *fed) {
    t->fed = fed;
    return (t->parser = splash_output_parser_new(o, cb, ctx)) ? 0 : -1;
}

/* Parses text; `fed` first.  -1 when the parser ran out of memory. */
static int turn_feed(srv_turn *t, const strbuf *text) {
    if (t->fed && splash_output_parser_feed(t->parser, t->fed, strlen(t->fed))) return -1;
    t->fed = NULL;
    return text->oom || (text->len && splash_output_parser_feed(t->parser, text->data, text->len)) ? -1 : 0;
}

int srv_turn_step(srv_turn *t, int timeout_ms, splash_gen_take *take) {
    strbuf text;
    sb_init(&text);
    int fed = t->fed != NULL; /* its events go out at once: do not wait */
    if (!splash_gen_wait(t->g, fed ? 0 : timeout_ms, &text, take) && !fed) {
        sb_free(&text);
        return SRV_TURN_IDLE;
    }
    t->text_len += text.len;
    if (turn_feed(t, &text)) {
        take->finish = SPLASH_FINISH_ERROR;
        snprintf(take->error, sizeof take->error, "out of memory");
    }
    sb_free(&text);
    if (take->finish == SPLASH_FINISH_NONE) return SRV_TURN_MORE;
    if (take->finish == SPLASH_FINISH_ERROR || take->finish == SPLASH_FINISH_CANCELLED) return SRV_TURN_FAILED;
    splash_output_parser_finish(t->parser);
    return SRV_TURN_DONE;
}

int srv_turn_whole(srv_turn *t, splash_gen_take *take, srv_reply *r) {
    strbuf text;
    sb_init(&text);
    srv_gen_collect(t->g, &text, take);
    t->text_len = text.len;
    int failed = srv_gen_failed_reply(take, r);
    if (!failed && turn_feed(t, &text)) {
        srv_error(r, 500, NULL, "out_of_memory", "out of memory");
        failed = 1;
    }
    sb_free(&text);
    if (failed) return -1;
    splash_output_parser_finish(t->parser);
    return 0;
}

void srv_turn_free(srv_turn *t) {
    splash_gen_release(t->g);
    if (t->parser) splash_output_parser_free(t->parser);
    memset(t, 0, sizeof *t);
}

void srv_sse_event(strbuf *out, const char *type) { sb_printf(out, "event: %s\ndata: ", type); }
