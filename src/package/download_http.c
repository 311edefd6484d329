/* download_http.c - one HTTP GET through libcurl, and the progress display
 * (see download_http.h for why this is apart from download.c). */
#include "package/download_http.h"

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

double dl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- progress ------------------------------------------------------------ */

static void human_bytes(int64_t n, char *buf, size_t size) {
    double x = (double)n;
    if (x >= 1e9) snprintf(buf, size, "%.2f GB", x / 1e9);
    else if (x >= 1e6) snprintf(buf, size, "%.1f MB", x / 1e6);
    else if (x >= 1e3) snprintf(buf, size, "%.1f kB", x / 1e3);
    else snprintf(buf, size, "%" PRId64 " B", n);
}

static void human_eta(double s, char *buf, size_t size) {
    if (!(s >= 0) || s > 99 * 3600.0) {
        snprintf(buf, size, "--:--");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, size, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, size, "%ld:%02ld", t / 60, t % 60);
}

/* Bytes per second over the last few seconds (the sample ring), or since
 * the start while the ring is short. */
static double speed(const dl_progress *p, double now) {
    if (p->ring_n >= 2) {
        int oldest = p->ring_n < 16 ? 0 : p->ring_i;
        double dt = now - p->ring_t[oldest];
        if (dt > 0.2) return (double)(p->received - p->ring_b[oldest]) / dt;
    }
    double dt = now - p->t_start;
    return dt > 0.2 ? (double)p->received / dt : 0.0;
}

static void status_text(const dl_progress *p, double now, char *out, size_t size) {
    char have[32], total[32], rate[32], eta[32];
    human_bytes(p->done, have, sizeof have);
    human_bytes(p->total, total, sizeof total);
    double bps = speed(p, now);
    snprintf(rate, sizeof rate, "%.1f MB/s", bps / 1e6);
    human_eta(bps > 0 ? (double)(p->total - p->done) / bps : -1.0, eta, sizeof eta);
    int pct = p->total > 0 ? (int)(100.0 * (double)p->done / (double)p->total) : 100;
    if (pct > 100) pct = 100;
    if (p->mode == DL_SHOW_BAR) {
        char bar[25];
        int fill = pct * 24 / 100;
        for (int i = 0; i < 24; i++) bar[i] = i < fill ? '#' : '.';
        bar[24] = 0;
        snprintf(out, size, "%s [%s] %3d%%  %s / %s  %s  ETA %s", p->label, bar, pct, have, total, rate, eta);
    } else {
        snprintf(out, size, "splash: %s %d%%  %s / %s  %s  ETA %s", p->label, pct, have, total, rate, eta);
    }
}

static void draw(dl_progress *p, double now) {
    char line[512];
    status_text(p, now, line, sizeof line);
    if (p->mode == DL_SHOW_BAR) {
        fprintf(stderr, "\r%s\033[K", line);
        p->on_screen = 1;
    } else {
        fprintf(stderr, "%s\n", line);
    }
    fflush(stderr);
}

void dl_progress_init(dl_progress *p, int mode, const char *label, int64_t total) {
    memset(p, 0, sizeof *p);
    p->mode = mode;
    snprintf(p->label, sizeof p->label, "%s", label);
    p->total = total;
    p->t_start = p->t_draw = p->t_line = dl_now();
}

void dl_progress_add(dl_progress *p, int64_t done, int64_t received) {
    p->done += done;
    p->received += received;
    if (p->mode == DL_SHOW_NONE) return;
    double now = dl_now();
    int last = (p->ring_i + 15) % 16;
    if (p->ring_n == 0 || now - p->ring_t[last] >= 0.25) {
        p->ring_t[p->ring_i] = now;
        p->ring_b[p->ring_i] = p->received;
        p->ring_i = (p->ring_i + 1) % 16;
        if (p->ring_n < 16) p->ring_n++;
    }
    if (p->mode == DL_SHOW_BAR && now - p->t_draw >= 0.2) {
        p->t_draw = now;
        draw(p, now);
    } else if (p->mode == DL_SHOW_LINES && now - p->t_line >= 15.0) {
        p->t_line = now;
        draw(p, now);
    }
}

void dl_progress_drop(dl_progress *p, int64_t done) { p->done -= done; }

void dl_progress_say(dl_progress *p, const char *fmt, ...) {
    if (p->mode == DL_SHOW_NONE) return;
    if (p->on_screen) fprintf(stderr, "\r\033[K");
    p->on_screen = 0;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
}

void dl_progress_end(dl_progress *p) {
    if (p->mode != DL_SHOW_BAR) return;
    draw(p, dl_now());
    fputc('\n', stderr);
    p->on_screen = 0;
}

/* ---- one GET --------------------------------------------------------------- */

typedef struct fetch_state {
    dl_fetch *f;
    CURL *curl;
    int started;          /* first body bytes seen */
    int64_t range_start;  /* from Content-Range of the current response, -1 if none */
} fetch_state;

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init(void) { curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

static long env_long(const char *name, long dflt, long lo, long hi) {
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    char *end;
    long v = strtol(s, &end, 10);
    return *end || v < lo || v > hi ? dflt : v;
}

static size_t on_header(char *buf, size_t size, size_t nitems, void *ud) {
    fetch_state *st = ud;
    size_t n = size * nitems;
    if (n >= 5 && !strncmp(buf, "HTTP/", 5)) st->range_start = -1; /* a new response (after a redirect) */
    static const char key[] = "content-range:";
    if (n > sizeof key && !strncasecmp(buf, key, sizeof key - 1)) {
        char line[256];
        size_t m = n - (sizeof key - 1) < sizeof line - 1 ? n - (sizeof key - 1) : sizeof line - 1;
        memcpy(line, buf + sizeof key - 1, m);
        line[m] = 0;
        long long a;
        if (sscanf(line, " bytes %lld-", &a) == 1 && a >= 0) st->range_start = a;
    }
    return n;
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w, n -= (size_t)w;
    }
    return 0;
}

/* The server sends the whole file after all: empty the sink, restart the
 * hash and take the kept bytes back from the progress. */
static int restart_sink(dl_fetch *f) {
    if (f->fd >= 0) {
        if (ftruncate(f->fd, 0) != 0 || lseek(f->fd, 0, SEEK_SET) != 0) {
            f->outcome = DL_FETCH_LOCAL;
            snprintf(f->why, sizeof f->why, "cannot truncate the partial file: %s", strerror(errno));
            return -1;
        }
        char discard[65];
        splash_sha256_finish(*f->hash, discard);
        *f->hash = splash_sha256_new();
    } else {
        sb_clear(f->mem);
    }
    if (f->progress) dl_progress_drop(f->progress, f->size);
    f->size = 0;
    f->restarted = 1;
    return 0;
}

/* Called once the first body bytes of the final response arrive: a 200 to a
 * Range request means the server sends the whole file, so the sink starts
 * over; a 206 must start exactly where we asked. */
static int on_first_bytes(fetch_state *st) {
    dl_fetch *f = st->f;
    long code = 0;
    curl_easy_getinfo(st->curl, CURLINFO_RESPONSE_CODE, &code);
    if (f->offset <= 0) return 0;
    if (code == 206) {
        if (st->range_start != f->offset) {
            f->outcome = DL_FETCH_BAD_RANGE;
            snprintf(f->why, sizeof f->why, "asked for bytes %" PRId64 "- and got a 206 starting at %" PRId64, f->offset,
                     (int64_t)st->range_start);
            return -1;
        }
        return 0;
    }
    return restart_sink(f);
}

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *ud) {
    fetch_state *st = ud;
    dl_fetch *f = st->f;
    size_t n = size * nmemb;
    if (!st->started) {
        st->started = 1;
        if (on_first_bytes(st)) return 0;
    }
    if (f->limit >= 0 && f->size + (int64_t)n > f->limit) {
        f->outcome = DL_FETCH_TOO_LONG;
        snprintf(f->why, sizeof f->why, "the server sent more than the expected %" PRId64 " bytes", f->limit);
        return 0;
    }
    if (f->fd >= 0) {
        if (write_all(f->fd, ptr, n)) {
            f->outcome = DL_FETCH_LOCAL;
            snprintf(f->why, sizeof f->why, "write failed: %s", strerror(errno));
            return 0;
        }
        splash_sha256_update(*f->hash, ptr, n);
    } else {
        sb_append(f->mem, ptr, n);
        if (f->mem->oom) {
            f->outcome = DL_FETCH_LOCAL;
            snprintf(f->why, sizeof f->why, "out of memory");
            return 0;
        }
    }
    f->size += (int64_t)n;
    if (f->progress) dl_progress_add(f->progress, (int64_t)n, (int64_t)n);
    return n;
}

static int transient_code(CURLcode c) {
    switch (c) {
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_SSL_CONNECT_ERROR: return 1;
    default: return 0;
    }
}

int dl_fetch_run(dl_fetch *f) {
    f->outcome = DL_FETCH_OK;
    f->transient = 0;
    f->status = 0;
    f->restarted = 0;
    f->why[0] = 0;
    f->size = f->offset > 0 ? f->offset : 0;
    pthread_once(&curl_once, curl_init);
    CURL *curl = curl_init_rc == CURLE_OK ? curl_easy_init() : NULL;
    if (!curl) {
        f->outcome = DL_FETCH_REFUSED;
        snprintf(f->why, sizeof f->why, "libcurl could not start");
        return -1;
    }
    fetch_state st = {.f = f, .curl = curl, .range_start = -1};
    char errbuf[CURL_ERROR_SIZE] = {0};
    char range[32];
    curl_easy_setopt(curl, CURLOPT_URL, f->url);
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, env_long("SPLASH_DOWNLOAD_STALL_S", 60, 1, 86400));
    curl_easy_setopt(curl, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, 512L * 1024); /* fewer write()s and hash calls */
    curl_easy_setopt(curl, CURLOPT_USERAGENT, "splash");
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &st);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &st);
    if (f->offset > 0) {
        snprintf(range, sizeof range, "%" PRId64 "-", f->offset);
        curl_easy_setopt(curl, CURLOPT_RANGE, range);
    }
    CURLcode rc = curl_easy_perform(curl);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &f->status);
    curl_easy_cleanup(curl);
    if (rc == CURLE_OK) {
        /* an empty body never reaches on_body: a 200 to a Range request for
         * an empty file still means "start over" */
        if (!st.started && f->offset > 0 && f->status != 206 && restart_sink(f)) return -1;
        return 0;
    }
    if (rc == CURLE_WRITE_ERROR && f->outcome != DL_FETCH_OK) return -1; /* ours, why is set */
    if (rc == CURLE_HTTP_RETURNED_ERROR) {
        f->outcome = DL_FETCH_HTTP;
        f->transient = f->status == 408 || f->status == 429 || f->status >= 500;
        snprintf(f->why, sizeof f->why, "HTTP %ld", f->status);
        return -1;
    }
    f->transient = transient_code(rc);
    f->outcome = f->transient || rc == CURLE_WRITE_ERROR ? DL_FETCH_NETWORK : DL_FETCH_REFUSED;
    if (rc == CURLE_OPERATION_TIMEDOUT && st.started)
        snprintf(f->why, sizeof f->why, "transfer stalled: %s", errbuf[0] ? errbuf : curl_easy_strerror(rc));
    else snprintf(f->why, sizeof f->why, "%s", errbuf[0] ? errbuf : curl_easy_strerror(rc));
    return -1;
}
