/* server.h - what the files of src/server share: the server object, one
 * request as the routes see it, and the reply they build.
 *
 * http.c owns the libmicrohttpd side (connections, bodies, limits, the
 * security checks of security.c, turning a srv_reply into an MHD response);
 * routes.c maps paths to handlers; one file per API builds replies.  A
 * handler never sees libmicrohttpd: it gets a srv_request (method, path,
 * body) and fills a srv_reply, either a whole body or a srv_stream whose
 * produce() the connection's thread calls until it says done.
 */
#ifndef SPLASH_SERVER_H
#define SPLASH_SERVER_H

#include <stdatomic.h>
#include <stddef.h>

#include "base/json.h"
#include "base/strbuf.h"
#include "runtime/engine.h"

#define SRV_MAX_HOSTS 16
#define SRV_MAX_NAMES 8

typedef struct srv_options {
    const char *host;
    int port;
    const char *api_key;                  /* NULL: no key */
    const char *allowed_hosts[SRV_MAX_HOSTS];
    int n_allowed_hosts;
    size_t max_request_size;
    const char *served_names[SRV_MAX_NAMES]; /* [0] is the model's id */
    int n_served_names;
    const char *default_reasoning_effort; /* NULL: the template's default */
    int test_hooks;
    int body_timeout_ms; /* an upload with no progress for this long gets 408 (default 30 s) */
    int keepalive_ms;    /* SSE keep-alive interval while queued or prefilling (default 2 s) */
    int no_webui;        /* --no-webui: no chat page at / */
} srv_options;

typedef struct srv_server {
    srv_options opt;
    splash_engine *engine;
    const char *model_name;
    double started;      /* monotonic seconds */
    long long started_wall; /* unix time */
    atomic_uint_fast64_t n_requests, n_errors, n_streams_open;
} srv_server;

typedef struct srv_request {
    srv_server *srv;
    const char *method;
    const char *path; /* without the query string */
    const char *body;
    size_t body_len;
    const char *if_none_match; /* the If-None-Match header, or NULL */
} srv_request;

/* A stream: produce() appends bytes to out, waiting at most ~2 s, and sets
 * *done when nothing more will come; cancel() is called when the client went
 * away before done; free() always, once. */
typedef struct srv_stream {
    void *ctx;
    void (*produce)(void *ctx, strbuf *out, int *done);
    void (*cancel)(void *ctx);
    void (*free)(void *ctx);
} srv_stream;

typedef struct srv_reply {
    int status;
    const char *content_type; /* static string */
    strbuf body;
    int retry_after;          /* seconds, 0 = none */
    int www_authenticate;
    srv_stream stream;        /* stream.produce != NULL: an SSE reply */
    const char *headers[16];  /* more headers: name, value, ... (strings that outlive the
                                 reply), ended by NULL */
} srv_reply;

/* The OpenAI error body: {"error":{"message","type","param","code"}}. */
void srv_error(srv_reply *r, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void srv_json(srv_reply *r, int status, const json_value *v); /* compact JSON body */

/* routes.c */
void srv_route(const srv_request *q, srv_reply *r);

/* security.c: 0 = allowed; otherwise fills r. */
int srv_check_host(const srv_server *s, const char *host, const char *origin, srv_reply *r);
int srv_check_auth(const srv_server *s, const char *method, const char *path, const char *authorization,
                   const char *x_api_key, srv_reply *r);

/* The handlers. */
void srv_health(const srv_request *q, srv_reply *r);
void srv_ready(const srv_request *q, srv_reply *r);
void srv_status(const srv_request *q, srv_reply *r);
void srv_metrics(const srv_request *q, srv_reply *r);
void srv_models(const srv_request *q, srv_reply *r);
void srv_model_one(const srv_request *q, srv_reply *r, const char *id);
void srv_tokenize(const srv_request *q, srv_reply *r);
void srv_apply_template(const srv_request *q, srv_reply *r);
void srv_chat_page(const srv_request *q, srv_reply *r); /* chat_page.c: GET / */
void srv_chat_completions(const srv_request *q, srv_reply *r);
void srv_completions(const srv_request *q, srv_reply *r); /* completions.c */
/* anthropic_messages.c, responses.c: 1 when the path is theirs (r filled,
 * 405 for other methods), else 0. */
int srv_route_anthropic(const srv_request *q, srv_reply *r);
int srv_route_responses(const srv_request *q, srv_reply *r);
/* Anthropic paths (/v1/messages...) answer errors in Anthropic's shape:
 * http.c converts every error reply on them with srv_anthropic_error_convert. */
int srv_anthropic_path(const char *path);
void srv_anthropic_error_convert(srv_reply *r);

/* Parses the body as a JSON object (400 on failure, r filled). */
json_value *srv_parse_body(const srv_request *q, srv_reply *r);

/* chat_completions.c: one of none, minimal, low, medium, high, xhigh, max. */
int srv_reasoning_effort_valid(const char *effort);

/* chat_completions.c, shared with /apply-template: the request -> the
 * template's input (messages with parsed tool-call arguments, tools,
 * add_generation_prompt, enable_thinking).  NULL with r filled on error. */
json_value *srv_chat_template_input(const srv_request *q, const json_value *req, srv_reply *r);

/* http.c */
/* 1 when the client of the request this thread is handling has closed its
 * connection (or reset it).  A non-streaming handler that waits for the
 * engine polls it and cancels its gen; streams are checked by http.c itself
 * before each produce().  libmicrohttpd cannot tell: in thread-per-connection
 * mode the connection's thread is inside the handler, not reading the socket. */
int srv_client_gone(void);
typedef struct srv_http srv_http;
int srv_http_start(srv_server *s, srv_http **out, char *err, size_t err_size);
int srv_http_port(srv_http *h); /* the bound port (for --port 0) */
void srv_http_quiesce(srv_http *h); /* stop accepting connections */
void srv_http_stop(srv_http *h);

#endif
