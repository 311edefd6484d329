/* http.c - the HTTP/1.1 server on libmicrohttpd.
 *
 * Why libmicrohttpd: a small, well-kept C library that does HTTP/1.1 parsing,
 * keep-alive and chunked transfer encoding correctly, which a hand-written
 * server would have to re-learn.  It runs in thread-per-connection mode: each
 * connection's thread reads the body, runs the checks and the handler, and
 * for a stream calls the stream's produce() whenever the socket can take more
 * bytes.  produce() waits on the request's gen (at most ~2 s, then a
 * keep-alive comment), so a slow client only ever blocks its own thread; the
 * engine keeps appending to the gen.  When the client goes away, the write
 * fails, libmicrohttpd frees the response and the free callback cancels the
 * gen, so the engine drops the lane at its next step.
 *
 * Disconnects are also seen without a write: before each produce() and, for
 * a non-streaming handler waiting on the engine, through srv_client_gone(),
 * the socket is peeked (recv MSG_PEEK: 0 bytes = the peer closed).  A stream
 * that is silent while decoding and a whole reply still being generated are
 * therefore cancelled within a poll interval of the client leaving.
 *
 * Slow uploads: libmicrohttpd only offers an idle timeout that closes the
 * connection without a reply, and in this mode no callback runs while a
 * body is not arriving.  A watchdog thread keeps the connections whose body
 * is still being read, with the time of their last progress; one idle for
 * body_timeout_ms (nginx's client_body_timeout rule) gets a 408 written on
 * its socket and its read side shut down, which ends the connection's
 * thread.  The connection cannot go away under the watchdog: completed()
 * unlinks it under the same mutex before libmicrohttpd closes the socket.
 *
 * Order of checks for every request: body size (413, from Content-Length
 * before reading, else while reading), Host and Origin (403), API key (401),
 * then for POST: JSON content type (415) and a non-empty body (400).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "base/log.h"
#include "server/server.h"

typedef struct conn_ctx conn_ctx;

struct srv_http {
    srv_server *srv;
    struct MHD_Daemon *d;
    /* the upload watchdog */
    pthread_t watch;
    int watch_started, watch_stop;
    pthread_mutex_t wmu;
    pthread_cond_t wcv;
    conn_ctx *uploads; /* connections whose body is being read, under wmu */
};

struct conn_ctx {
    strbuf body;
    int too_big;
    int replied; /* a response was queued before the body was read */
    /* under the watchdog's mutex */
    int fd, linked, timed_out;
    double last_progress;
    conn_ctx *prev, *next;
};

typedef struct stream_ctx {
    srv_stream st;
    strbuf pending;
    size_t off;
    int done;
    srv_server *srv;
    struct MHD_Connection *conn;
} stream_ctx;

/* ---- disconnects ------------------------------------------------------------------ */

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *i = c ? MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD) : NULL;
    return i ? (int)i->connect_fd : -1;
}

/* The peer closed or reset the connection (bytes waiting, e.g. a pipelined
 * request, mean it is still there). */
static int peer_gone(struct MHD_Connection *c) {
    int fd = conn_fd(c);
    if (fd < 0) return 0;
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static __thread struct MHD_Connection *handling; /* the connection whose handler runs on this thread */

int srv_client_gone(void) { return handling && peer_gone(handling); }

void srv_error(srv_reply *r, int status, const char *param, const char *code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sb_clear(&r->body);
    r->status = status;
    r->content_type = "application/json";
    sb_puts(&r->body, "{\"error\":{\"message\":");
    json_write_string(&r->body, msg, strlen(msg), JSON_COMPACT);
    sb_printf(&r->body, ",\"type\":\"%s\",\"param\":", status < 500 ? "invalid_request_error" : "server_error");
    if (param) json_write_string(&r->body, param, strlen(param), JSON_COMPACT);
    else sb_puts(&r->body, "null");
    sb_puts(&r->body, ",\"code\":");
    if (code) json_write_string(&r->body, code, strlen(code), JSON_COMPACT);
    else sb_puts(&r->body, "null");
    sb_puts(&r->body, "}}");
}

void srv_json(srv_reply *r, int status, const json_value *v) {
    sb_clear(&r->body);
    r->status = status;
    r->content_type = "application/json";
    json_write(&r->body, v, JSON_COMPACT);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream_ctx *s = cls;
    while (s->off >= s->pending.len) {
        if (s->done) return MHD_CONTENT_READER_END_OF_STREAM;
        if (peer_gone(s->conn)) return MHD_CONTENT_READER_END_WITH_ERROR; /* stream_free cancels */
        sb_clear(&s->pending);
        s->off = 0;
        s->st.produce(s->st.ctx, &s->pending, &s->done);
        if (s->pending.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = s->pending.len - s->off;
    if (n > max) n = max;
    memcpy(buf, s->pending.data + s->off, n);
    s->off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    stream_ctx *s = cls;
    if (!s->done && s->st.cancel) s->st.cancel(s->st.ctx);
    if (s->st.free) s->st.free(s->st.ctx);
    sb_free(&s->pending);
    atomic_fetch_sub(&s->srv->n_streams_open, 1);
    free(s);
}

static enum MHD_Result send_reply(srv_server *srv, struct MHD_Connection *c, srv_reply *r, const char *origin) {
    struct MHD_Response *resp;
    if (r->stream.produce) {
        stream_ctx *s = calloc(1, sizeof *s);
        if (!s) {
            if (r->stream.cancel) r->stream.cancel(r->stream.ctx);
            if (r->stream.free) r->stream.free(r->stream.ctx);
            return MHD_NO;
        }
        s->st = r->stream;
        s->srv = srv;
        s->conn = c;
        sb_init(&s->pending);
        atomic_fetch_add(&srv->n_streams_open, 1);
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, s, stream_free);
        if (!resp) {
            stream_free(s);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
    } else {
        size_t len;
        char *body = sb_take(&r->body, &len);
        resp = MHD_create_response_from_buffer(len, body ? body : (char *)"", body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
        if (!resp) {
            free(body);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", r->content_type ? r->content_type : "application/json");
    }
    if (r->retry_after > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", r->retry_after);
        MHD_add_response_header(resp, "Retry-After", v);
    }
    if (r->www_authenticate) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    for (int i = 0; i + 1 < (int)(sizeof r->headers / sizeof r->headers[0]) && r->headers[i]; i += 2)
        MHD_add_response_header(resp, r->headers[i], r->headers[i + 1]);
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff"); /* every reply: no MIME sniffing */
    if (origin) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", origin);
        MHD_add_response_header(resp, "Vary", "Origin");
    }
    if (r->status >= 400) atomic_fetch_add(&srv->n_errors, 1);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* ---- the upload watchdog ------------------------------------------------------------ */

static void upload_unlink(srv_http *h, conn_ctx *cc) {
    if (!cc->linked) return;
    if (cc->prev) cc->prev->next = cc->next;
    else h->uploads = cc->next;
    if (cc->next) cc->next->prev = cc->prev;
    cc->prev = cc->next = NULL;
    cc->linked = 0;
}

/* Marks progress on an upload; 0 when it already timed out (close it). */
static int upload_progress(srv_http *h, conn_ctx *cc, int finished) {
    pthread_mutex_lock(&h->wmu);
    int ok = !cc->timed_out;
    cc->last_progress = splash_now();
    if (finished) upload_unlink(h, cc);
    pthread_mutex_unlock(&h->wmu);
    return ok;
}

static void *watchdog(void *arg) {
    srv_http *h = arg;
    int limit = h->srv->opt.body_timeout_ms > 0 ? h->srv->opt.body_timeout_ms : 30000;
    int period = limit / 10 < 50 ? 50 : limit / 10 > 1000 ? 1000 : limit / 10;
    pthread_mutex_lock(&h->wmu);
    while (!h->watch_stop) {
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_nsec += (long)period * 1000000L;
        dl.tv_sec += dl.tv_nsec / 1000000000L;
        dl.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&h->wcv, &h->wmu, &dl);
        double now = splash_now();
        for (conn_ctx *cc = h->uploads, *next; cc; cc = next) {
            next = cc->next;
            if (1e3 * (now - cc->last_progress) < limit) continue;
            srv_reply r;
            memset(&r, 0, sizeof r);
            sb_init(&r.body);
            srv_error(&r, 408, NULL, "request_timeout", "the request body did not arrive: no progress for %d ms", limit);
            strbuf msg;
            sb_init(&msg);
            sb_printf(&msg, "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                            "Connection: close\r\n\r\n", r.body.len);
            sb_append(&msg, r.body.data, r.body.len);
            if (!msg.oom) (void)!send(cc->fd, msg.data, msg.len, MSG_NOSIGNAL | MSG_DONTWAIT);
            sb_free(&msg);
            sb_free(&r.body);
            shutdown(cc->fd, SHUT_RD); /* the connection's thread reads EOF and closes */
            cc->timed_out = 1;
            atomic_fetch_add(&h->srv->n_errors, 1);
            upload_unlink(h, cc);
        }
    }
    pthread_mutex_unlock(&h->wmu);
    return NULL;
}

/* ---- requests ----------------------------------------------------------------------- */

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    srv_http *h = cls;
    srv_server *srv = h->srv;
    conn_ctx *cc = *con_cls;
    srv_reply r;
    memset(&r, 0, sizeof r);
    sb_init(&r.body);
    if (!cc) {
        cc = calloc(1, sizeof *cc);
        if (!cc) return MHD_NO;
        sb_init(&cc->body);
        *con_cls = cc;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > srv->opt.max_request_size) {
            cc->too_big = cc->replied = 1;
            srv_error(&r, 413, NULL, "request_too_large", "the request body is larger than the limit of %zu bytes",
                      srv->opt.max_request_size);
            enum MHD_Result ret = send_reply(srv, c, &r, NULL);
            sb_free(&r.body);
            return ret;
        }
        /* until the last call of this request, its body is being read */
        pthread_mutex_lock(&h->wmu);
        cc->fd = conn_fd(c);
        cc->last_progress = splash_now();
        if (cc->fd >= 0) {
            cc->next = h->uploads;
            if (h->uploads) h->uploads->prev = cc;
            h->uploads = cc;
            cc->linked = 1;
        }
        pthread_mutex_unlock(&h->wmu);
        return MHD_YES;
    }
    if (cc->replied) {
        *upload_size = 0;
        return MHD_YES;
    }
    if (!upload_progress(h, cc, *upload_size == 0)) return MHD_NO; /* 408 already sent */
    if (*upload_size) {
        if (!cc->too_big) {
            if (cc->body.len + *upload_size > srv->opt.max_request_size) {
                cc->too_big = 1;
                sb_free(&cc->body);
                sb_init(&cc->body);
            } else {
                sb_append(&cc->body, upload, *upload_size);
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    atomic_fetch_add(&srv->n_requests, 1);
    char path[512];
    snprintf(path, sizeof path, "%s", url);
    char *qm = strchr(path, '?');
    if (qm) *qm = 0;
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    const char *ctype = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    const char *cors = NULL;
    if (cc->too_big) {
        srv_error(&r, 413, NULL, "request_too_large", "the request body is larger than the limit of %zu bytes",
                  srv->opt.max_request_size);
    } else if (srv_check_host(srv, host, origin, &r)) {
        /* r filled */
    } else if ((cors = origin), !strcmp(method, "OPTIONS")) {
        r.status = 204;
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT);
        if (origin) MHD_add_response_header(resp, "Access-Control-Allow-Origin", origin);
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
        MHD_add_response_header(resp, "Access-Control-Allow-Headers", "Authorization, Content-Type, x-api-key");
        enum MHD_Result ret = MHD_queue_response(c, 204, resp);
        MHD_destroy_response(resp);
        sb_free(&r.body);
        return ret;
    } else if (srv_check_auth(srv, method, path, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"),
                              MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"), &r)) {
        /* r filled */
    } else if (!strcmp(method, "POST") && (!ctype || strncasecmp(ctype, "application/json", 16))) {
        srv_error(&r, 415, NULL, "unsupported_media_type", "the request body must be JSON (Content-Type: application/json)");
    } else if (!strcmp(method, "POST") && cc->body.len == 0) {
        srv_error(&r, 400, NULL, "empty_body", "the request body is empty");
    } else {
        srv_request q = {srv, method, path, sb_cstr(&cc->body), cc->body.len,
                         MHD_lookup_connection_value(c, MHD_HEADER_KIND, "If-None-Match")};
        handling = c;
        srv_route(&q, &r);
        handling = NULL;
    }
    if (srv_anthropic_path(path)) srv_anthropic_error_convert(&r);
    enum MHD_Result ret = send_reply(srv, c, &r, cors);
    sb_free(&r.body);
    return ret;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    srv_http *h = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    pthread_mutex_lock(&h->wmu);
    upload_unlink(h, cc);
    pthread_mutex_unlock(&h->wmu);
    sb_free(&cc->body);
    free(cc);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    LOG_DEBUG("http: %s", msg);
}

int srv_http_start(srv_server *s, srv_http **out, char *err, size_t err_size) {
    srv_http *h = calloc(1, sizeof *h);
    if (!h) return snprintf(err, err_size, "out of memory"), -1;
    h->srv = s;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, s->opt.host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)s->opt.port);
    } else if (inet_pton(AF_INET6, s->opt.host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)s->opt.port);
        flags |= MHD_USE_IPv6;
    } else {
        free(h);
        return snprintf(err, err_size, "--host %s: not an IPv4 or IPv6 address", s->opt.host), -1;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&h->wmu, NULL);
    pthread_cond_init(&h->wcv, &ca);
    pthread_condattr_destroy(&ca);
    h->d = MHD_start_daemon(flags, (uint16_t)s->opt.port, NULL, NULL, handle, h, MHD_OPTION_SOCK_ADDR, &ss,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, h, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)600, MHD_OPTION_CONNECTION_LIMIT, (unsigned)1000, MHD_OPTION_EXTERNAL_LOGGER,
                            mhd_log, NULL, MHD_OPTION_END);
    if (!h->d) {
        pthread_cond_destroy(&h->wcv);
        pthread_mutex_destroy(&h->wmu);
        free(h);
        return snprintf(err, err_size, "could not listen on %s:%d (in use?)", s->opt.host, s->opt.port), -1;
    }
    if (!pthread_create(&h->watch, NULL, watchdog, h)) h->watch_started = 1;
    *out = h;
    return 0;
}

int srv_http_port(srv_http *h) {
    const union MHD_DaemonInfo *i = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    return i ? (int)i->port : -1;
}

void srv_http_quiesce(srv_http *h) {
    if (h) MHD_quiesce_daemon(h->d);
}

void srv_http_stop(srv_http *h) {
    if (!h) return;
    if (h->watch_started) {
        pthread_mutex_lock(&h->wmu);
        h->watch_stop = 1;
        pthread_cond_broadcast(&h->wcv);
        pthread_mutex_unlock(&h->wmu);
        pthread_join(h->watch, NULL);
    }
    MHD_stop_daemon(h->d);
    pthread_cond_destroy(&h->wcv);
    pthread_mutex_destroy(&h->wmu);
    free(h);
}
