/* completions.c - POST /v1/completions (OpenAI legacy text completions).
 *
 * The prompt is raw text (no chat template): a string, an array of token
 * ids, or a list holding one of those (one prompt per request: batches are a
 * 400).  Strings are tokenized with special tokens recognised, as Hugging
 * Face tokenizers do.  The reply is the raw generated text - no reasoning or
 * tool-call parsing - as `text_completion` objects, whole or as SSE chunks.
 *
 * Parameters: max_tokens (default 16, as OpenAI), the sampling parameters and
 * stop strings of generation.h, stream + stream_options.include_usage, echo
 * (the prompt text in front of the completion), logprobs (0-20 alternatives,
 * the legacy shape of logprobs.h; with text_offset), n = 1, best_of = 1.
 * Rejected with a 400 naming them: echo together with logprobs (prompt
 * logprobs would need every prompt row's logits), a non-empty suffix,
 * logit_bias, n / best_of other than 1.  Unknown keys are ignored, as for
 * Chat Completions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/generation.h"
#include "server/logprobs.h"
#include "text/tokenizer.h"

typedef struct cmpl {
    srv_server *srv;
    splash_gen *g;
    char id[40];
    long long created;
    const char *model;
    int stream, include_usage, echo;
    int logprobs;         /* -1: none, else the alternatives per token */
    strbuf echo_text;     /* the prompt as text (echo) */
    size_t raw_len;       /* completion bytes taken from the gen so far */
    int n_reported;       /* token records already written as logprobs */
    size_t last_end;      /* text_end of the last one */
    strbuf taken;         /* the completion text so far (logprobs: text_offset) */
    size_t cur_byte, cur_char; /* a cursor into taken: bytes -> characters */
    srv_legacy_logprobs lp;
    int sent_echo;
} cmpl;

static void cmpl_free(cmpl *c) {
    if (!c) return;
    splash_gen_release(c->g);
    sb_free(&c->echo_text);
    sb_free(&c->taken);
    srv_legacy_logprobs_free(&c->lp);
    free(c);
}

/* ---- the prompt -------------------------------------------------------------------------- */

/* "prompt" -> tokens (and its text for echo).  -1 with r filled. */
static int read_prompt(cmpl *c, const json_value *req, splash_token_vec *toks, srv_reply *r) {
    const json_value *p = json_get(req, "prompt");
    const splash_tokenizer *tk = splash_engine_tokenizer(c->srv->engine);
    if (p && p->type == JSON_ARRAY && p->count == 1 &&
        (p->items[0]->type == JSON_STRING || p->items[0]->type == JSON_ARRAY))
        p = p->items[0]; /* ["text"] or [[ids]] */
    else if (p && p->type == JSON_ARRAY && p->count > 1 && p->items[0]->type != JSON_NUMBER)
        return srv_error(r, 400, "prompt", "unsupported_value",
                         "prompt: one prompt per request (a list of %zu prompts is a batch, not supported)", p->count), -1;
    if (!p || (p->type != JSON_STRING && p->type != JSON_ARRAY))
        return srv_error(r, 400, "prompt", "invalid_type",
                         "prompt must be a string or an array of token ids (or a list of one of those)"), -1;
    splash_error err = {0};
    if (p->type == JSON_STRING) {
        if (!p->len) return srv_error(r, 400, "prompt", "invalid_value", "prompt must not be empty"), -1;
        if (splash_tokenizer_encode(tk, p->str, p->len, SPLASH_ENCODE_SPECIAL, toks, &err))
            return srv_error(r, 400, "prompt", "invalid_value", "prompt: %s", err.msg), -1;
        if (c->echo) sb_append(&c->echo_text, p->str, p->len);
        return 0;
    }
    if (!p->count) return srv_error(r, 400, "prompt", "invalid_value", "prompt must not be empty"), -1;
    int64_t vocab = (int64_t)splash_tokenizer_vocab_size(tk), mv = splash_engine_vocab(c->srv->engine);
    if (mv < vocab) vocab = mv;
    for (size_t i = 0; i < p->count; i++) {
        int64_t id;
        if (p->items[i]->type != JSON_NUMBER || json_int64(p->items[i], &id) || id < 0 || id >= vocab)
            return srv_error(r, 400, "prompt", "invalid_value", "prompt[%zu] must be a token id in [0, %lld)", i,
                             (long long)vocab), -1;
        if (splash_token_vec_push(toks, (int32_t)id))
            return srv_error(r, 500, NULL, "out_of_memory", "out of memory"), -1;
    }
    if (c->echo) {
        strbuf raw;
        sb_init(&raw);
        splash_tokenizer_decode(tk, toks->ids, toks->len, 0, &raw, &err);
        splash_utf8_append_lossy(&c->echo_text, raw.data ? raw.data : "", raw.len);
        sb_free(&raw);
    }
    return 0;
}

/* Parameters other than the prompt, sampling and stop.  -1 with r filled. */
static int read_params(cmpl *c, const json_value *req, int64_t *max_tokens, srv_reply *r) {
    const json_value *v;
    if ((v = json_get(req, "model")) && v->type != JSON_NULL && !json_string(v))
        return srv_error(r, 400, "model", "invalid_type", "model must be a string"), -1;
    static const char *bools[] = {"stream", "echo"};
    for (int i = 0; i < 2; i++)
        if ((v = json_get(req, bools[i])) && v->type != JSON_NULL && !json_is_bool(v))
            return srv_error(r, 400, bools[i], "invalid_type", "%s must be a boolean", bools[i]), -1;
    c->stream = json_get_bool(req, "stream", 0);
    c->echo = json_get_bool(req, "echo", 0);
    v = json_get(req, "stream_options");
    if (v && v->type != JSON_NULL && v->type != JSON_OBJECT)
        return srv_error(r, 400, "stream_options", "invalid_type", "stream_options must be an object"), -1;
    const json_value *iu = json_get(v, "include_usage");
    if (iu && iu->type != JSON_NULL && !json_is_bool(iu))
        return srv_error(r, 400, "stream_options.include_usage", "invalid_type",
                         "stream_options.include_usage must be a boolean"), -1;
    c->include_usage = json_get_bool(v, "include_usage", 0);
    if ((v = json_get(req, "user")) && v->type != JSON_NULL && !json_string(v))
        return srv_error(r, 400, "user", "invalid_type", "user must be a string"), -1;
    int64_t n = 1;
    static const char *ones[] = {"n", "best_of"};
    for (int i = 0; i < 2; i++) {
        if (srv_int_param(req, ones[i], &n, r) < 0) return -1;
        if (n != 1) return srv_error(r, 400, ones[i], "unsupported_value", "%s must be 1", ones[i]), -1;
    }
    if ((v = json_get(req, "suffix")) && v->type != JSON_NULL && !(v->type == JSON_STRING && !v->len))
        return srv_error(r, 400, "suffix", "unsupported_value", "suffix (fill in the middle) is not supported"), -1;
    if ((v = json_get(req, "logit_bias")) && v->type != JSON_NULL && !(v->type == JSON_OBJECT && !v->count))
        return srv_error(r, 400, "logit_bias", "unsupported_value", "logit_bias is not supported"), -1;
    int64_t lp = -1;
    if (srv_int_param(req, "logprobs", &lp, r) < 0) return -1;
    if (lp != -1 && (lp < 0 || lp > SPLASH_MAX_TOP_LOGPROBS))
        return srv_error(r, 400, "logprobs", "invalid_value", "logprobs must be between 0 and %d", SPLASH_MAX_TOP_LOGPROBS), -1;
    c->logprobs = (int)lp;
    if (c->logprobs >= 0 && c->echo)
        return srv_error(r, 400, "echo", "unsupported_value",
                         "echo together with logprobs is not supported (prompt logprobs are not computed)"), -1;
    *max_tokens = 16;
    if (srv_int_param(req, "max_tokens", max_tokens, r) < 0) return -1;
    if (*max_tokens < 1) return srv_error(r, 400, "max_tokens", "invalid_value", "max_tokens must be at least 1"), -1;
    return 0;
}

/* ---- replies ----------------------------------------------------------------------------- */

static void write_usage(const cmpl *c, strbuf *b, int completion) {
    sb_printf(b, "{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}", c->g->n_prompt, completion,
              c->g->n_prompt + completion);
}

/* text_offset counts characters, as OpenAI's (Python string indices) do:
 * the characters of the completion text before byte `pos` (offsets only grow). */
static size_t char_offset(cmpl *c, size_t pos) {
    if (pos > c->taken.len) pos = c->taken.len; /* text cut by a stop string */
    for (; c->cur_byte < pos; c->cur_byte++)
        if (((unsigned char)c->taken.data[c->cur_byte] & 0xC0) != 0x80) c->cur_char++;
    return c->cur_char;
}

/* Adds the token records not reported yet, up to n_recorded, whose text is
 * within the first c->raw_len bytes (all of them when `all`). */
static void add_records(cmpl *c, int n_recorded, int all) {
    int n = n_recorded - c->n_reported;
    if (c->logprobs < 0 || n <= 0) return;
    splash_gen_token *toks = malloc(sizeof *toks * (size_t)n);
    splash_logprobs *lps = malloc(sizeof *lps * (size_t)n);
    if (toks && lps) {
        n = splash_gen_records(c->g, c->n_reported, n, toks, lps);
        const splash_tokenizer *tk = splash_engine_tokenizer(c->srv->engine);
        for (int i = 0; i < n && (all || toks[i].text_end <= c->raw_len); i++) {
            srv_legacy_logprobs_add(&c->lp, tk, &lps[i], char_offset(c, c->last_end));
            c->last_end = toks[i].text_end;
            c->n_reported++;
        }
    }
    free(toks);
    free(lps);
}

static void choice(cmpl *c, strbuf *b, const char *text, size_t n, const char *finish) {
    sb_puts(b, "{\"text\":");
    json_write_string(b, text ? text : "", n, JSON_COMPACT);
    sb_puts(b, ",\"index\":0,\"logprobs\":");
    if (c->logprobs >= 0 && (c->lp.n || finish)) srv_legacy_logprobs_write(b, &c->lp);
    else sb_puts(b, "null");
    sb_printf(b, ",\"finish_reason\":%s%s%s}", finish ? "\"" : "", finish ? finish : "null", finish ? "\"" : "");
}

static void head(cmpl *c, strbuf *b) {
    sb_printf(b, "{\"id\":\"%s\",\"object\":\"text_completion\",\"created\":%lld,\"model\":", c->id, c->created);
    json_write_string(b, c->model, strlen(c->model), JSON_COMPACT);
}

static const char *finish_name(splash_finish f) { return f == SPLASH_FINISH_LENGTH ? "length" : "stop"; }

static void reply_whole(cmpl *c, srv_reply *r) {
    strbuf text;
    sb_init(&text);
    splash_gen_take t;
    srv_gen_collect(c->g, &text, &t);
    if (srv_gen_failed_reply(&t, r)) {
        sb_free(&text);
        return;
    }
    c->raw_len = text.len;
    if (c->logprobs >= 0) sb_append(&c->taken, text.data, text.len);
    add_records(c, t.n_recorded, 1);
    strbuf all;
    sb_init(&all);
    sb_append(&all, c->echo_text.data, c->echo_text.len);
    sb_append(&all, text.data, text.len);
    strbuf *b = &r->body;
    head(c, b);
    sb_puts(b, ",\"choices\":[");
    choice(c, b, all.data, all.len, finish_name(t.finish));
    sb_puts(b, "],\"usage\":");
    write_usage(c, b, t.n_tokens);
    sb_puts(b, "}");
    r->status = 200;
    r->content_type = "application/json";
    sb_free(&all);
    sb_free(&text);
}

static void stream_produce(void *ctx, strbuf *out, int *done) {
    cmpl *c = ctx;
    if (c->echo && !c->sent_echo) {
        c->sent_echo = 1;
        sb_puts(out, "data: ");
        head(c, out);
        sb_puts(out, ",\"choices\":[");
        choice(c, out, c->echo_text.data, c->echo_text.len, NULL);
        sb_puts(out, "]}\n\n");
        return;
    }
    strbuf text;
    sb_init(&text);
    splash_gen_take t;
    int ka = c->srv->opt.keepalive_ms > 0 ? c->srv->opt.keepalive_ms : 2000;
    if (!splash_gen_wait(c->g, ka, &text, &t)) {
        /* keep-alive only while nothing can come yet; a decode that is silent
           (text held back for a stop string) sends nothing */
        if (t.state == SPLASH_GEN_QUEUED || t.state == SPLASH_GEN_PREFILL) sb_puts(out, ": keep-alive\n\n");
        sb_free(&text);
        return;
    }
    c->raw_len += text.len;
    if (c->logprobs >= 0) sb_append(&c->taken, text.data, text.len);
    if (srv_gen_failed_sse(&t, out)) {
        *done = 1;
        sb_free(&text);
        return;
    }
    int end = t.finish != SPLASH_FINISH_NONE;
    add_records(c, t.n_recorded, end);
    if (text.len || c->lp.n) {
        sb_puts(out, "data: ");
        head(c, out);
        sb_puts(out, ",\"choices\":[");
        choice(c, out, text.data, text.len, NULL);
        sb_puts(out, "]}\n\n");
    }
    sb_free(&text);
    if (!end) return;
    *done = 1;
    sb_puts(out, "data: ");
    head(c, out);
    sb_puts(out, ",\"choices\":[");
    choice(c, out, "", 0, finish_name(t.finish));
    sb_puts(out, "]}\n\n");
    if (c->include_usage) {
        sb_puts(out, "data: ");
        head(c, out);
        sb_puts(out, ",\"choices\":[],\"usage\":");
        write_usage(c, out, t.n_tokens);
        sb_puts(out, "}\n\n");
    }
    sb_puts(out, "data: [DONE]\n\n");
}

static void stream_cancel(void *ctx) { splash_gen_cancel(((cmpl *)ctx)->g); }
static void stream_free(void *ctx) { cmpl_free(ctx); }

/* ---- the handler ------------------------------------------------------------------------- */

void srv_completions(const srv_request *q, srv_reply *r) {
    srv_server *srv = q->srv;
    json_value *req = srv_parse_body(q, r);
    if (!req) return;
    cmpl *c = calloc(1, sizeof *c);
    splash_token_vec toks = {0};
    if (!c || !(c->g = splash_gen_new())) {
        srv_error(r, 500, NULL, "out_of_memory", "out of memory");
        json_free(req);
        free(c);
        return;
    }
    c->srv = srv;
    c->model = srv->opt.served_names[0];
    sb_init(&c->echo_text);
    sb_init(&c->taken);
    srv_legacy_logprobs_init(&c->lp);
    splash_gen *g = c->g;
    int64_t max_tokens;
    if (read_params(c, req, &max_tokens, r) || srv_sampling_params(req, g, r) ||
        srv_stop_strings(json_get(req, "stop"), "stop", g, r) || read_prompt(c, req, &toks, r))
        goto fail;
    if (json_get(req, "test_script")) {
        srv_error(r, 400, "test_script", "unsupported_parameter", "test_script is for Chat Completions only");
        goto fail;
    }
    g->sp.logprobs = c->logprobs >= 0;
    g->sp.top_logprobs = c->logprobs > 0 ? c->logprobs : 0;
    int ctx = splash_engine_max_context(srv->engine), np = (int)toks.len;
    if (np >= ctx || np + max_tokens > ctx) {
        srv_error(r, 400, "prompt", "context_length_exceeded",
                  "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d in your "
                  "prompt; %lld for the completion). Please reduce your prompt; or completion length.",
                  ctx, (long long)(np + max_tokens), np, (long long)max_tokens);
        goto fail;
    }
    g->prompt = toks.ids;
    g->n_prompt = np;
    g->max_tokens = (int)max_tokens;
    toks.ids = NULL;
    srv_make_id(c->id, "cmpl-");
    c->created = (long long)time(NULL);
    if (srv_gen_submit(q, g, r)) goto fail;
    json_free(req);
    if (c->stream) {
        r->status = 200;
        r->stream = (srv_stream){c, stream_produce, stream_cancel, stream_free};
        return;
    }
    reply_whole(c, r);
    cmpl_free(c);
    return;
fail:
    splash_token_vec_free(&toks);
    json_free(req);
    cmpl_free(c);
}
