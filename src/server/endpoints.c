/* endpoints.c - the small endpoints: health, readiness, status, metrics,
 * models, tokenize, apply-template. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "server/server.h"

json_value *srv_parse_body(const srv_request *q, srv_reply *r) {
    char msg[256];
    if (!json_utf8_valid(q->body, q->body_len)) {
        srv_error(r, 400, NULL, "invalid_json", "the request body is not valid UTF-8");
        return NULL;
    }
    json_value *v = json_parse(q->body, q->body_len, JSON_DEFAULT_MAX_DEPTH, msg, sizeof msg);
    if (!v) {
        srv_error(r, 400, NULL, "invalid_json", "the request body is not valid JSON: %s", msg);
        return NULL;
    }
    if (v->type != JSON_OBJECT) {
        json_free(v);
        srv_error(r, 400, NULL, "invalid_json", "the request body must be a JSON object");
        return NULL;
    }
    return v;
}

static void text_reply(srv_reply *r, int status, const char *json) {
    r->status = status;
    r->content_type = "application/json";
    sb_puts(&r->body, json);
}

void srv_health(const srv_request *q, srv_reply *r) { text_reply(r, 200, "{\"status\":\"ok\"}"); }

/* /ready: 503 at critical pressure (shared/spec/engine.md "Caches"), so a
 * balancer sends new work elsewhere while this server could not take it:
 *   queue_full      the queue is at --max-queue: a new request gets 429;
 *   pool_exhausted  a request waits with a lane free, so the engine's last
 *                   admission found no room in the KV pool, and the pool
 *                   cannot hold one request of the whole context either (a
 *                   request only waits for pages when its budget does not
 *                   fit; with room for the largest one it is admitted at the
 *                   engine's next step, so a request that merely arrived
 *                   during a step does not count).
 * The figures are the engine's stats; pages_free includes cached pages no
 * running request pins, which admission reclaims. */
void srv_ready(const srv_request *q, srv_reply *r) {
    srv_server *s = q->srv;
    if (!s->engine) {
        text_reply(r, 503, "{\"status\":\"unavailable\",\"reason\":\"loading\"}");
        r->retry_after = 1;
        return;
    }
    splash_engine_stats st;
    splash_engine_get_stats(s->engine, &st);
    int pt = st.page_tokens > 0 ? st.page_tokens : 1;
    int request_pages = (splash_engine_max_context(s->engine) + pt - 1) / pt;
    const char *reason = NULL, *msg = NULL;
    if (st.queued >= st.max_queue) reason = "queue_full", msg = "the request queue is full";
    else if (st.queued > 0 && st.slots_free > 0 && st.pages_free < request_pages)
        reason = "pool_exhausted", msg = "the KV pool cannot admit the next queued request";
    if (!reason) {
        text_reply(r, 200, "{\"status\":\"ready\"}");
        return;
    }
    sb_printf(&r->body,
              "{\"status\":\"unavailable\",\"reason\":\"%s\",\"message\":\"%s\",\"queued\":%d,\"max_queued\":%d"
              ",\"active\":%d,\"slots_free\":%d,\"pages_free\":%d,\"pages_total\":%d}",
              reason, msg, st.queued, st.max_queue, st.active, st.slots_free, st.pages_free, st.pages_total);
    r->status = 503;
    r->content_type = "application/json";
    r->retry_after = 1;
}

void srv_status(const srv_request *q, srv_reply *r) {
    srv_server *s = q->srv;
    splash_engine_stats st;
    splash_engine_get_stats(s->engine, &st);
    sb_puts(&r->body, "{\"model\":");
    json_write_string(&r->body, s->model_name, strlen(s->model_name), JSON_COMPACT);
    sb_printf(&r->body,
              ",\"maximum_context_tokens\":%d,\"vision\":false,\"uptime_seconds\":%.1f"
              ",\"memory\":{\"weight_bytes\":%zu,\"pool_bytes\":%zu}"
              ",\"pool\":{\"pages_total\":%d,\"pages_free\":%d,\"page_tokens\":%d,\"slots_total\":%d,\"slots_free\":%d}"
              ",\"queue\":{\"active\":%d,\"queued\":%d,\"max_lanes\":%d,\"max_queued\":%d}"
              ",\"plan\":{\"budget_bytes\":%zu,\"fixed_bytes\":%zu,\"scratch_bytes\":%zu,\"kv_bytes\":%zu"
              ",\"snapshot_bytes\":%zu,\"max_snapshots\":%d,\"spare_bytes\":%zu}"
              ",\"cache\":{\"prefix_cache\":true,\"pages_cached\":%d,\"pages_pinned\":%d,\"lookups\":%llu"
              ",\"hits\":%llu,\"cached_tokens\":%llu,\"prefill_tokens\":%llu,\"pages_evicted\":%llu"
              ",\"snapshots_held\":%d,\"snapshot_bytes\":%zu,\"snapshots_taken\":%llu,\"snapshots_evicted\":%llu"
              ",\"snapshots_restored\":%llu}"
              ",\"totals\":{\"requests\":%llu,\"prompt_tokens\":%llu,\"completion_tokens\":%llu}"
              ",\"streams_open\":%llu",
              splash_engine_max_context(s->engine), splash_now() - s->started, st.weight_bytes, st.pool_bytes,
              st.pages_total, st.pages_free, st.page_tokens, st.slots_total, st.slots_free, st.active, st.queued,
              st.max_lanes, st.max_queue, st.plan_budget, st.plan_fixed, st.plan_scratch, st.plan_kv_bytes,
              st.plan_snapshot_bytes, st.plan_max_snapshots, st.plan_spare_bytes, st.pages_cached, st.pages_pinned,
              (unsigned long long)st.cache_lookups, (unsigned long long)st.cache_hits,
              (unsigned long long)st.cached_tokens, (unsigned long long)st.prefill_tokens,
              (unsigned long long)st.pages_evicted, st.snapshots_held, st.snapshot_bytes,
              (unsigned long long)st.snapshots_taken, (unsigned long long)st.snapshots_evicted,
              (unsigned long long)st.snapshots_restored, (unsigned long long)st.requests_done,
              (unsigned long long)st.prompt_tokens, (unsigned long long)st.completion_tokens,
              (unsigned long long)atomic_load(&s->n_streams_open));
    sb_printf(&r->body, /* the decode cycle */
              ",\"speculation\":{\"draft\":\"%s\",\"block_size\":%d,\"cycles\":%llu,\"drafted\":%llu,\"accepted\":%llu"
              ",\"tokens_per_cycle\":%.3f,\"steps\":%llu"
              ",\"seconds\":{\"draft\":%.6f,\"verify\":%.6f,\"accept\":%.6f,\"commit\":%.6f}"
              ",\"auto\":%s,\"auto_steps\":{\"block_1\":%llu,\"block\":%llu}"
              ",\"auto_tokens_per_second\":{\"lanes_1\":{\"block_1\":%.1f,\"block\":%.1f},"
              "\"lanes_4\":{\"block_1\":%.1f,\"block\":%.1f}}}}",
              st.draft, st.block_size, (unsigned long long)st.spec_cycles, (unsigned long long)st.spec_drafted,
              (unsigned long long)st.spec_accepted,
              st.spec_cycles ? (double)(st.spec_accepted + st.spec_cycles) / (double)st.spec_cycles : 0.0,
              (unsigned long long)st.spec_steps,
              st.spec_draft_seconds, st.spec_verify_seconds, st.spec_accept_seconds, st.spec_commit_seconds,
              st.block_auto ? "true" : "false", (unsigned long long)st.auto_steps[0], (unsigned long long)st.auto_steps[1],
              st.auto_rate[0][0], st.auto_rate[0][1], st.auto_rate[1][0], st.auto_rate[1][1]);
    r->status = 200;
    r->content_type = "application/json";
}

void srv_metrics(const srv_request *q, srv_reply *r) {
    srv_server *s = q->srv;
    splash_engine_stats st;
    splash_engine_get_stats(s->engine, &st);
    strbuf *b = &r->body;
    sb_printf(b, "# HELP splash_http_requests_total HTTP requests received.\n# TYPE splash_http_requests_total counter\n"
                 "splash_http_requests_total %llu\n",
              (unsigned long long)atomic_load(&s->n_requests));
    sb_printf(b, "# HELP splash_http_errors_total HTTP replies with status >= 400.\n# TYPE splash_http_errors_total counter\n"
                 "splash_http_errors_total %llu\n",
              (unsigned long long)atomic_load(&s->n_errors));
    sb_printf(b, "# HELP splash_requests_finished_total Generation requests finished.\n"
                 "# TYPE splash_requests_finished_total counter\nsplash_requests_finished_total %llu\n",
              (unsigned long long)st.requests_done);
    sb_printf(b, "# HELP splash_prompt_tokens_total Prompt tokens processed.\n# TYPE splash_prompt_tokens_total counter\n"
                 "splash_prompt_tokens_total %llu\n",
              (unsigned long long)st.prompt_tokens);
    sb_printf(b, "# HELP splash_completion_tokens_total Tokens generated.\n"
                 "# TYPE splash_completion_tokens_total counter\nsplash_completion_tokens_total %llu\n",
              (unsigned long long)st.completion_tokens);
    sb_printf(b, "# HELP splash_prefill_seconds_total Engine time in steps with prefill.\n"
                 "# TYPE splash_prefill_seconds_total counter\nsplash_prefill_seconds_total %.6f\n",
              st.prefill_seconds);
    sb_printf(b, "# HELP splash_decode_seconds_total Engine time in decode-only steps.\n"
                 "# TYPE splash_decode_seconds_total counter\nsplash_decode_seconds_total %.6f\n",
              st.decode_seconds);
    sb_printf(b, "# HELP splash_spec_cycles_total Decode cycles (one verify pass of one request).\n"
                 "# TYPE splash_spec_cycles_total counter\nsplash_spec_cycles_total %llu\n"
                 "# HELP splash_spec_draft_tokens_total Draft proposals verified.\n"
                 "# TYPE splash_spec_draft_tokens_total counter\nsplash_spec_draft_tokens_total %llu\n"
                 "# HELP splash_spec_accepted_tokens_total Draft proposals accepted.\n"
                 "# TYPE splash_spec_accepted_tokens_total counter\nsplash_spec_accepted_tokens_total %llu\n",
              (unsigned long long)st.spec_cycles, (unsigned long long)st.spec_drafted,
              (unsigned long long)st.spec_accepted);
    sb_printf(b, "# HELP splash_spec_seconds_total Engine time in each phase of the decode cycles.\n"
                 "# TYPE splash_spec_seconds_total counter\n"
                 "splash_spec_seconds_total{phase=\"draft\"} %.6f\nsplash_spec_seconds_total{phase=\"verify\"} %.6f\n"
                 "splash_spec_seconds_total{phase=\"accept\"} %.6f\nsplash_spec_seconds_total{phase=\"commit\"} %.6f\n",
              st.spec_draft_seconds, st.spec_verify_seconds, st.spec_accept_seconds, st.spec_commit_seconds);
    sb_printf(b, "# HELP splash_queue_depth Requests waiting for a lane.\n# TYPE splash_queue_depth gauge\n"
                 "splash_queue_depth %d\n",
              st.queued);
    sb_printf(b, "# HELP splash_active_requests Requests in a lane.\n# TYPE splash_active_requests gauge\n"
                 "splash_active_requests %d\n",
              st.active);
    sb_printf(b, "# HELP splash_kv_pages_free Free KV pages.\n# TYPE splash_kv_pages_free gauge\n"
                 "splash_kv_pages_free %d\n",
              st.pages_free);
    r->status = 200;
    r->content_type = "text/plain; version=0.0.4";
}

static void model_object(srv_server *s, strbuf *b, const char *id) {
    int ctx = splash_engine_max_context(s->engine);
    sb_puts(b, "{\"id\":");
    json_write_string(b, id, strlen(id), JSON_COMPACT);
    sb_printf(b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"splash\",\"max_model_len\":%d,"
                 "\"context_length\":%d,\"vision\":false,\"input_modalities\":[\"text\"]}",
              (long long)s->started_wall, ctx, ctx);
}

void srv_models(const srv_request *q, srv_reply *r) {
    srv_server *s = q->srv;
    sb_puts(&r->body, "{\"object\":\"list\",\"data\":[");
    for (int i = 0; i < s->opt.n_served_names; i++) {
        if (i) sb_putc(&r->body, ',');
        model_object(s, &r->body, s->opt.served_names[i]);
    }
    sb_puts(&r->body, "],\"models\":[{\"name\":");
    json_write_string(&r->body, s->model_name, strlen(s->model_name), JSON_COMPACT);
    sb_puts(&r->body, ",\"description\":\"\",\"release_date\":null}]}");
    r->status = 200;
    r->content_type = "application/json";
}

void srv_model_one(const srv_request *q, srv_reply *r, const char *id) {
    srv_server *s = q->srv;
    for (int i = 0; i < s->opt.n_served_names; i++)
        if (!strcmp(id, s->opt.served_names[i])) {
            model_object(s, &r->body, id);
            r->status = 200;
            r->content_type = "application/json";
            return;
        }
    srv_error(r, 404, "model", "model_not_found", "the model \"%.200s\" does not exist", id);
}

void srv_tokenize(const srv_request *q, srv_reply *r) {
    json_value *req = srv_parse_body(q, r);
    if (!req) return;
    const json_value *c = json_get(req, "content");
    const json_value *as = json_get(req, "add_special");
    if (!json_string(c)) srv_error(r, 400, "content", "invalid_type", "content must be a string");
    else if (as && !json_is_bool(as)) srv_error(r, 400, "add_special", "invalid_type", "add_special must be a boolean");
    else {
        splash_token_vec v = {0};
        splash_error err = {0};
        /* Qwen adds no BOS, so add_special only decides whether special tokens written in the text count */
        int flags = json_get_bool(req, "add_special", 1) || json_get_bool(req, "parse_special", 0) ? SPLASH_ENCODE_SPECIAL : 0;
        if (splash_tokenizer_encode(splash_engine_tokenizer(q->srv->engine), c->str, c->len, flags, &v, &err))
            srv_error(r, 400, "content", NULL, "%s", err.msg);
        else {
            sb_puts(&r->body, "{\"tokens\":[");
            for (size_t i = 0; i < v.len; i++) sb_printf(&r->body, i ? ",%d" : "%d", v.ids[i]);
            sb_puts(&r->body, "]}");
            r->status = 200;
            r->content_type = "application/json";
        }
        splash_token_vec_free(&v);
    }
    json_free(req);
}

void srv_apply_template(const srv_request *q, srv_reply *r) {
    json_value *req = srv_parse_body(q, r);
    if (!req) return;
    json_value *in = srv_chat_template_input(q, req, r);
    if (in) {
        strbuf p;
        sb_init(&p);
        splash_error err = {0};
        if (splash_chat_template_render(in, &p, &err)) srv_error(r, 400, "messages", "template_error", "%s", err.msg);
        else {
            sb_puts(&r->body, "{\"prompt\":");
            json_write_string(&r->body, p.data ? p.data : "", p.len, JSON_COMPACT);
            sb_puts(&r->body, "}");
            r->status = 200;
            r->content_type = "application/json";
        }
        sb_free(&p);
        json_free(in);
    }
    json_free(req);
}
