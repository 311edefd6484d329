/* model_ref.c - model names, base URL, cache paths (see model_ref.h). */
#include "package/model_ref.h"

#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/fs.h"
#include "base/mem.h"
#include "base/strbuf.h"

static int name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
}

/* Checks one part (owner, repo or revision) of s[0..n); writes it to out. */
static int check_part(const char *what, const char *name, const char *s, size_t n, char *out, size_t cap,
                      splash_error *err) {
    if (n == 0) return splash_fail(err, SPLASH_E_INVALID, "model name '%s': the %s is empty", name, what);
    if (n >= cap)
        return splash_fail(err, SPLASH_E_INVALID, "model name '%s': the %s is longer than %zu characters", name, what,
                           cap - 1);
    for (size_t i = 0; i < n; i++) {
        if (!name_char(s[i])) {
            if (s[i] == '/' && !strcmp(what, "revision"))
                return splash_fail(err, SPLASH_E_INVALID,
                                   "model name '%s': revisions with '/' are not supported (use a branch, tag or commit id)",
                                   name);
            return splash_fail(err, SPLASH_E_INVALID,
                               "model name '%s': the %s may only hold letters, digits, '.', '_' and '-' (found '%c')", name,
                               what, s[i]);
        }
        if (i + 1 < n && ((s[i] == '-' && s[i + 1] == '-') || (s[i] == '.' && s[i + 1] == '.')))
            return splash_fail(err, SPLASH_E_INVALID, "model name '%s': the %s may not contain \"--\" or \"..\"", name,
                               what);
    }
    if (s[0] == '.' || s[0] == '-' || s[n - 1] == '.' || s[n - 1] == '-')
        return splash_fail(err, SPLASH_E_INVALID, "model name '%s': the %s may not start or end with '.' or '-'", name,
                           what);
    memcpy(out, s, n);
    out[n] = 0;
    return SPLASH_OK;
}

int splash_model_ref_parse(const char *name, splash_model_ref *ref, splash_error *err) {
    memset(ref, 0, sizeof *ref);
    if (!name || !*name) return splash_fail(err, SPLASH_E_INVALID, "empty model name (expected OWNER/REPO)");
    const char *slash = strchr(name, '/');
    if (!slash)
        return splash_fail(err, SPLASH_E_INVALID, "model name '%s': expected OWNER/REPO or OWNER/REPO@REVISION", name);
    const char *at = strchr(slash + 1, '@');
    size_t repo_len = at ? (size_t)(at - slash - 1) : strlen(slash + 1);
    int rc = check_part("owner", name, name, (size_t)(slash - name), ref->owner, sizeof ref->owner, err);
    if (!rc) rc = check_part("repository", name, slash + 1, repo_len, ref->repo, sizeof ref->repo, err);
    if (!rc && at) rc = check_part("revision", name, at + 1, strlen(at + 1), ref->revision, sizeof ref->revision, err);
    if (!rc && !at) snprintf(ref->revision, sizeof ref->revision, "%s", SPLASH_MODEL_REVISION_DEFAULT);
    if (rc) memset(ref, 0, sizeof *ref);
    return rc;
}

int splash_model_looks_like_path(const char *s) {
    if (!s || !*s) return 0;
    if (s[0] == '/' || s[0] == '.' || s[0] == '~') return 1;
    size_t n = strlen(s);
    if (s[n - 1] == '/') return 1;
    const char *slash = strchr(s, '/');
    return slash && strchr(slash + 1, '/') != NULL;
}

int splash_model_base_url(const char *override, char **out, splash_error *err) {
    *out = NULL;
    const char *src = "SPLASH_MODEL_BASE_URL";
    const char *url = override;
    if (url) src = "the base URL";
    else if ((url = getenv("SPLASH_MODEL_BASE_URL")) == NULL || !*url) url = SPLASH_MODEL_BASE_URL_DEFAULT;
    size_t scheme = !strncasecmp(url, "http://", 7) ? 7 : !strncasecmp(url, "https://", 8) ? 8 : 0;
    if (!scheme || !url[scheme] || url[scheme] == '/')
        return splash_fail(err, SPLASH_E_INVALID, "%s '%s': only http:// and https:// URLs with a host are supported",
                           src, url);
    for (const char *p = url; *p; p++)
        if ((unsigned char)*p <= ' ' || *p == '?' || *p == '#')
            return splash_fail(err, SPLASH_E_INVALID, "%s '%s': no spaces, '?' or '#' allowed", src, url);
    size_t n = strlen(url);
    while (n > scheme && url[n - 1] == '/') n--;
    *out = xstrndup(url, n);
    return SPLASH_OK;
}

int splash_model_cache_root(const char *override, char **out, splash_error *err) {
    *out = NULL;
    const char *s = override;
    if (!s || !*s) s = getenv("SPLASH_CACHE_DIR");
    if (s && *s) {
        *out = xstrdup(s);
        return SPLASH_OK;
    }
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg && xdg[0] == '/') { /* the XDG spec says to ignore relative values */
        *out = splash_path_join(xdg, "splash");
        return SPLASH_OK;
    }
    const char *home = getenv("HOME");
    if (!home || !*home) {
        struct passwd *pw = getpwuid(getuid());
        home = pw ? pw->pw_dir : NULL;
    }
    if (!home || !*home)
        return splash_fail(err, SPLASH_E_NOTFOUND,
                           "no cache directory: set SPLASH_CACHE_DIR (HOME and XDG_CACHE_HOME are unset)");
    strbuf sb;
    sb_init(&sb);
    sb_printf(&sb, "%s/.cache/splash", home);
    *out = sb_take(&sb, NULL);
    return SPLASH_OK;
}

char *splash_model_cache_dir(const char *root, const splash_model_ref *ref) {
    strbuf sb;
    sb_init(&sb);
    sb_printf(&sb, "%s/models/%s--%s/%s", root, ref->owner, ref->repo, ref->revision);
    return sb_take(&sb, NULL);
}

char *splash_model_file_url(const char *base, const splash_model_ref *ref, const char *file) {
    strbuf sb;
    sb_init(&sb);
    sb_printf(&sb, "%s/%s/%s/resolve/%s/", base, ref->owner, ref->repo, ref->revision);
    for (const unsigned char *p = (const unsigned char *)file; *p; p++) {
        if (name_char((char)*p) || *p == '/' || *p == '~') sb_putc(&sb, (char)*p);
        else sb_printf(&sb, "%%%02X", *p);
    }
    return sb_take(&sb, NULL);
}
