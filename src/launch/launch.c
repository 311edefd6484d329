/* launch.c - what the four agent launchers share: find the server, ask it for
 * the model and context, find the client, exec it.  See launch.h.
 *
 * The server is always 127.0.0.1: the launchers are for the machine that runs
 * `splash serve`, and the API key is sent only there.  Messages go to stderr,
 * including the Starting line, so that a client's stdout (`claude -p ... |
 * jq`) carries only what the client wrote.
 */
#include "launch/launch.h"

#include <curl/curl.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fs.h"
#include "base/json.h"
#include "base/mem.h"
#include "base/strbuf.h"

#define PROBE_MAX_BYTES (1 << 20) /* /status and /v1/models are a few KB */

/* ---- HTTP ------------------------------------------------------------------ */

typedef struct probe_body {
    strbuf sb;
    int too_long;
} probe_body;

static size_t on_body(char *p, size_t size, size_t n, void *ud) {
    probe_body *b = ud;
    if (b->sb.len + size * n > PROBE_MAX_BYTES) {
        b->too_long = 1;
        return 0;
    }
    sb_append(&b->sb, p, size * n);
    return size * n;
}

enum { GET_OK, GET_DOWN, GET_FAILED };

/* GET origin+path into *out (parsed JSON).  GET_DOWN when nothing answers. */
static int get_json(const splash_launch *l, const char *path, json_value **out, long *status, splash_error *err) {
    *out = NULL;
    *status = 0;
    CURL *c = curl_easy_init();
    if (!c) return splash_fail(err, SPLASH_E_NOMEM, "libcurl could not start"), GET_FAILED;
    char url[128];
    snprintf(url, sizeof url, "%s%s", l->origin, path);
    probe_body b = {0};
    sb_init(&b.sb);
    struct curl_slist *hdr = NULL;
    strbuf auth;
    sb_init(&auth);
    if (l->api_key) {
        sb_printf(&auth, "Authorization: Bearer %s", l->api_key);
        hdr = curl_slist_append(hdr, sb_cstr(&auth));
    }
    hdr = curl_slist_append(hdr, "Accept: application/json");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 3000L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 15000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*"); /* loopback: never via a proxy */
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http");
    CURLcode rc = curl_easy_perform(c);
    int ret = GET_OK;
    if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_OPERATION_TIMEDOUT || rc == CURLE_GOT_NOTHING ||
        rc == CURLE_RECV_ERROR || rc == CURLE_SEND_ERROR) {
        ret = GET_DOWN;
    } else if (rc != CURLE_OK) {
        splash_fail(err, SPLASH_E_IO, "GET %s: %s", url, b.too_long ? "reply too long" : curl_easy_strerror(rc));
        ret = GET_FAILED;
    } else {
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
        char jerr[160];
        if (*status == 200) {
            *out = json_parse(b.sb.data ? b.sb.data : "", b.sb.len, 32, jerr, sizeof jerr);
            if (!*out) {
                splash_fail(err, SPLASH_E_FORMAT, "GET %s: the reply is not JSON (%s)", url, jerr);
                ret = GET_FAILED;
            }
        }
    }
    curl_slist_free_all(hdr);
    sb_free(&auth);
    sb_free(&b.sb);
    curl_easy_cleanup(c);
    return ret;
}

/* ---- probing ---------------------------------------------------------------- */

int splash_launch_port(int *port, splash_error *err) {
    const char *s = getenv("SPLASH_PORT");
    *port = 8000;
    if (!s || !*s) return SPLASH_OK;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 1 || v > 65535)
        return splash_fail(err, SPLASH_E_INVALID, "SPLASH_PORT=%.40s is not a port number (1-65535)", s);
    *port = (int)v;
    return SPLASH_OK;
}

static int not_running(const splash_launch *l, splash_error *err) {
    return splash_fail(err, SPLASH_E_IO, "Splash is not running on %s: start it with `splash serve`", l->origin);
}

static int bad_status(const splash_launch *l, const char *path, long status, splash_error *err) {
    if (status == 401)
        return splash_fail(err, SPLASH_E_INVALID,
                           "Splash on %s %s: set SPLASH_API_KEY to the key the server was started with", l->origin,
                           l->api_key ? "refused SPLASH_API_KEY" : "needs an API key");
    if (status == 503)
        return splash_fail(err, SPLASH_E_IO, "Splash on %s is still starting (GET %s: 503): try again in a moment",
                           l->origin, path);
    return splash_fail(err, SPLASH_E_IO, "the server on %s is not Splash, or not this version (GET %s: HTTP %ld)",
                       l->origin, path, status);
}

int splash_launch_probe(splash_launch *l, splash_error *err) {
    json_value *st = NULL, *models = NULL;
    long status;
    int rc = SPLASH_OK;
    int g = get_json(l, "/status", &st, &status, err);
    if (g == GET_DOWN) return not_running(l, err);
    if (g != GET_OK) return err->code;
    if (status != 200) return bad_status(l, "/status", status, err);

    g = get_json(l, "/v1/models", &models, &status, err);
    if (g == GET_DOWN) {
        rc = not_running(l, err);
        goto done;
    }
    if (g != GET_OK) {
        rc = err->code;
        goto done;
    }
    if (status != 200) {
        rc = bad_status(l, "/v1/models", status, err);
        goto done;
    }
    json_value *first = json_at(json_get(models, "data"), 0);
    const char *id = json_get_string(first, "id", NULL);
    if (!id || !*id || strcmp(json_get_string(first, "owned_by", ""), "splash")) {
        rc = splash_fail(err, SPLASH_E_MISMATCH,
                         "the server on %s is not Splash (the first model of GET /v1/models is not owned_by \"splash\")",
                         l->origin);
        goto done;
    }
    int64_t ctx = json_get_int(st, "maximum_context_tokens", 0);
    if (ctx <= 0) ctx = json_get_int(first, "context_length", 0);
    if (ctx <= 0) {
        rc = splash_fail(err, SPLASH_E_FORMAT, "GET %s/status gave no maximum_context_tokens", l->origin);
        goto done;
    }
    l->model = xstrdup(id);
    l->context = ctx;
done:
    json_free(st);
    json_free(models);
    return rc;
}

char *splash_launch_which(const char *name) {
    if (!name || !*name) return NULL;
    if (strchr(name, '/')) return access(name, X_OK) == 0 ? xstrdup(name) : NULL;
    const char *path = getenv("PATH");
    if (!path) return NULL;
    strbuf sb;
    sb_init(&sb);
    for (const char *p = path;; p++) {
        const char *end = strchr(p, ':');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        sb_clear(&sb);
        if (n) sb_append(&sb, p, n);
        else sb_putc(&sb, '.'); /* an empty PATH entry is the current directory */
        sb_printf(&sb, "/%s", name);
        const char *cand = sb_cstr(&sb);
        if (access(cand, X_OK) == 0 && !splash_is_dir(cand)) {
            char *r = sb_take(&sb, NULL);
            return r;
        }
        if (!end) break;
        p = end;
    }
    sb_free(&sb);
    return NULL;
}

/* ---- dry run -------------------------------------------------------------------
 *
 * SPLASH_LAUNCH_DRY_RUN=1 prints, instead of exec, what would run: the client's
 * path, argv and every variable the launcher set (null: removed), as one JSON
 * object on stdout.  For people checking a setup and for the tests (Hermes
 * cannot be installed where they run); a missing client is not an error then. */

#define MAX_TOUCHED 32
static const char *touched[MAX_TOUCHED]; /* names passed to splash_launch_setenv */
static int n_touched;

static int dry_run(void) {
    const char *s = getenv("SPLASH_LAUNCH_DRY_RUN");
    return s && *s && strcmp(s, "0");
}

static void print_dry_run(const splash_launch *l, char **argv) {
    json_value *root = json_new(JSON_OBJECT), *av = json_new(JSON_ARRAY), *env = json_new(JSON_OBJECT);
    json_obj_set(root, "client", json_new_string(l->client));
    json_obj_set(root, "path", l->client_path ? json_new_string(l->client_path) : json_new(JSON_NULL));
    for (char **a = argv; *a; a++) json_arr_push(av, json_new_string(*a));
    json_obj_set(root, "argv", av);
    for (int i = 0; i < n_touched; i++) {
        const char *v = getenv(touched[i]);
        json_obj_set(env, touched[i], v ? json_new_string(v) : json_new(JSON_NULL));
    }
    json_obj_set(root, "env", env);
    strbuf sb;
    sb_init(&sb);
    json_write(&sb, root, JSON_COMPACT);
    json_free(root);
    printf("%s\n", sb_cstr(&sb));
    sb_free(&sb);
    fflush(stdout);
}

/* ---- the flow ----------------------------------------------------------------- */

int splash_launch_begin(splash_launch *l, const char *client, const char *install_url) {
    memset(l, 0, sizeof *l);
    l->client = client;
    l->install_url = install_url;
    splash_error err = {0};
    if (splash_launch_port(&l->port, &err)) goto fail;
    snprintf(l->origin, sizeof l->origin, "http://127.0.0.1:%d", l->port);
    snprintf(l->v1, sizeof l->v1, "%s/v1", l->origin);
    const char *key = getenv("SPLASH_API_KEY");
    l->api_key = key && *key ? key : NULL;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    int rc = splash_launch_probe(l, &err);
    curl_global_cleanup();
    if (rc) goto fail;
    l->client_path = splash_launch_which(client);
    if (!l->client_path && !dry_run()) {
        splash_fail(&err, SPLASH_E_NOTFOUND, "%s is not installed or is not on PATH. Install it first: %s", client,
                    install_url);
        goto fail;
    }
    return 0;
fail:
    fprintf(stderr, "splash %s: %s\n", client, err.msg);
    splash_launch_free(l);
    return 1;
}

const char *splash_launch_key(const splash_launch *l) {
    return l->api_key ? l->api_key : SPLASH_LAUNCH_PLACEHOLDER_KEY;
}

int64_t splash_launch_max_output(const splash_launch *l) {
    int64_t q = l->context / 4;
    return q < 32768 ? q : 32768;
}

int splash_launch_setenv(const char *name, const char *value) {
    if (n_touched < MAX_TOUCHED) touched[n_touched++] = name;
    int rc = value ? setenv(name, value, 1) : unsetenv(name);
    if (rc) {
        fprintf(stderr, "splash: cannot set %s: %s\n", name, strerror(errno));
        return 1;
    }
    return 0;
}

char **splash_launch_argv(const char *client, const char *const *fixed, int n, int user_argc, char **user_argv) {
    char **argv = xcalloc((size_t)(1 + n + user_argc + 1), sizeof *argv);
    int k = 0;
    argv[k++] = (char *)client;
    for (int i = 0; i < n; i++) argv[k++] = (char *)fixed[i];
    for (int i = 0; i < user_argc; i++) argv[k++] = user_argv[i];
    argv[k] = NULL;
    return argv;
}

int splash_launch_exec(splash_launch *l, char **argv) {
    fprintf(stderr, "Starting %s: %s \xc2\xb7 %lld context tokens\n", l->client, l->model, (long long)l->context);
    fflush(stderr);
    fflush(stdout);
    argv[0] = (char *)l->client;
    if (dry_run()) {
        print_dry_run(l, argv);
        splash_launch_free(l);
        return 0;
    }
    execv(l->client_path, argv);
    fprintf(stderr, "splash %s: cannot run %s: %s\n", l->client, l->client_path, strerror(errno));
    splash_launch_free(l);
    return 1;
}

void splash_launch_free(splash_launch *l) {
    free(l->client_path);
    free(l->model);
    l->client_path = NULL;
    l->model = NULL;
}
