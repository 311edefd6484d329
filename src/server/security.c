/* security.c - who may talk to the server.
 *
 * Three checks, in the order http.c runs them:
 *   - Host (DNS rebinding): a page on evil.example that resolves its name to
 *     127.0.0.1 sends `Host: evil.example`; only loopback names, the bind
 *     address and --allowed-host names are accepted.
 *   - Origin: a browser says where the page came from; a cross-site page may
 *     not drive the API (same rule as Host: loopback, bind address, allowed).
 *     Requests without Origin (SDKs, curl) pass.
 *   - API key, when configured: `Authorization: Bearer KEY` or `x-api-key`,
 *     compared in constant time; `/`, `/index.html`, `/health`, `/ready` and
 *     OPTIONS stay public.  401 carries `WWW-Authenticate: Bearer`.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "server/server.h"

/* host[:port] or [v6]:port -> the host part in out (lower case). */
static void host_part(const char *h, char *out, size_t size) {
    size_t n = 0;
    if (*h == '[') {
        h++;
        while (*h && *h != ']' && n + 1 < size) out[n++] = *h++;
    } else {
        const char *colon = strchr(h, ':');
        int v6 = colon && strchr(colon + 1, ':'); /* bare IPv6 literal */
        while (*h && (v6 || *h != ':') && n + 1 < size) out[n++] = *h++;
    }
    out[n] = 0;
    for (size_t i = 0; i < n; i++)
        if (out[i] >= 'A' && out[i] <= 'Z') out[i] = (char)(out[i] - 'A' + 'a');
}

static int name_allowed(const srv_server *s, const char *name) {
    if (!strcmp(name, "localhost") || !strcmp(name, "::1") || !strncmp(name, "127.", 4)) return 1;
    if (strlen(name) > 10 && !strcmp(name + strlen(name) - 10, ".localhost")) return 1;
    if (!strcasecmp(name, s->opt.host)) return 1;
    for (int i = 0; i < s->opt.n_allowed_hosts; i++)
        if (!strcasecmp(name, s->opt.allowed_hosts[i]) || !strcmp(s->opt.allowed_hosts[i], "*")) return 1;
    return 0;
}

int srv_check_host(const srv_server *s, const char *host, const char *origin, srv_reply *r) {
    char name[256];
    if (host) {
        host_part(host, name, sizeof name);
        if (!name_allowed(s, name)) {
            srv_error(r, 403, NULL, "host_not_allowed",
                      "Host \"%s\" is not allowed (loopback, the bind address or --allowed-host)", name);
            return -1;
        }
    }
    if (origin) {
        const char *p = strstr(origin, "://");
        if (!p || !strcmp(origin, "null")) {
            srv_error(r, 403, NULL, "origin_not_allowed", "Origin \"%.200s\" is not allowed", origin);
            return -1;
        }
        char hp[256];
        snprintf(hp, sizeof hp, "%s", p + 3);
        char *slash = strchr(hp, '/');
        if (slash) *slash = 0;
        host_part(hp, name, sizeof name);
        if (!name_allowed(s, name)) {
            srv_error(r, 403, NULL, "origin_not_allowed", "Origin \"%.200s\" is not allowed", origin);
            return -1;
        }
    }
    return 0;
}

static int same(const char *a, const char *b) { /* constant time in the length of b */
    size_t na = strlen(a), nb = strlen(b);
    unsigned diff = na != nb;
    for (size_t i = 0; i < nb; i++) diff |= (unsigned)(unsigned char)(i < na ? a[i] : 0) ^ (unsigned char)b[i];
    return diff == 0;
}

int srv_check_auth(const srv_server *s, const char *method, const char *path, const char *authorization,
                   const char *x_api_key, srv_reply *r) {
    const char *key = s->opt.api_key;
    if (!key || !*key) return 0;
    if (!strcmp(method, "OPTIONS") || !strcmp(path, "/") || !strcmp(path, "/index.html") || !strcmp(path, "/health") ||
        !strcmp(path, "/ready"))
        return 0;
    if (authorization && !strncasecmp(authorization, "Bearer ", 7) && same(authorization + 7, key)) return 0;
    if (x_api_key && same(x_api_key, key)) return 0;
    srv_error(r, 401, NULL, "invalid_api_key",
              (authorization || x_api_key) ? "invalid API key" : "an API key is required (Authorization: Bearer KEY)");
    r->www_authenticate = 1;
    return -1;
}
