/* download.c - model name to verified package directory: the cache, the
 * manifest, and the per-file policy (resume, re-fetch, give up).  The HTTP
 * transfer itself and the progress display are in download_http.c.
 *
 * Invariants of a model's cache directory (layout in download.h):
 *   - a file at its final path was verified (size and SHA-256) against the
 *     entry of manifest.json when it was renamed there, so once the manifest
 *     is unchanged it is trusted without re-hashing;
 *   - .verified exists only while manifest.json hashes to its content and
 *     every listed file is in place: that is the one check of the fast path,
 *     which never touches the network;
 *   - every change happens under .lock.
 * A new manifest from the server (a moved branch) removes the files whose
 * entries changed; files whose entries are the same are kept.
 */
#include "package/download.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "base/fs.h"
#include "base/json.h"
#include "base/mem.h"
#include "base/sha256.h"
#include "base/strbuf.h"
#include "package/download_http.h"
#include "package/model_ref.h"
#include "package/package.h"

#define MANIFEST_MAX_BYTES (64 << 20)

/* ---- the manifest's file list ------------------------------------------- */

typedef struct mf_entry {
    const char *path; /* points into the json tree */
    int64_t size;
    char sha256[65];
} mf_entry;

typedef struct manifest {
    json_value *root;
    mf_entry *files;
    size_t n;
    int64_t total;
    char sha256[65]; /* of the manifest's bytes */
} manifest;

static void manifest_free(manifest *m) {
    json_free(m->root);
    free(m->files);
    memset(m, 0, sizeof *m);
}

/* A listed path must stay inside the package and not collide with the
 * cache's own names (manifest.json, .verified, .lock, *.partial). */
static int safe_relpath(const char *p) {
    if (!p || !*p || p[0] == '/' || strchr(p, '\\') || !strcmp(p, "manifest.json")) return 0;
    size_t n = strlen(p);
    if (p[n - 1] == '/' || (n >= 8 && !strcmp(p + n - 8, ".partial"))) return 0;
    for (const char *c = p; *c; c++) {
        if ((unsigned char)*c < ' ') return 0;
        if ((c == p || c[-1] == '/') && (*c == '.' || *c == '/')) return 0; /* ".x", "..", "a//b" */
    }
    return 1;
}

static int is_hex64(const char *s) {
    if (!s || strlen(s) != 64) return 0;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

/* Parses manifest text; `where` (a URL or path) names it in errors. */
static int manifest_parse(const char *text, size_t len, const char *where, manifest *m, splash_error *err) {
    memset(m, 0, sizeof *m);
    char jerr[256];
    json_value *root = json_parse(text, len, 32, jerr, sizeof jerr);
    if (!root || root->type != JSON_OBJECT) {
        json_free(root);
        return splash_fail(err, SPLASH_E_FORMAT, "%s is not a Splash package manifest (%s)", where,
                           root ? "not a JSON object" : jerr);
    }
    const char *format = json_get_string(root, "format", NULL);
    int64_t version = json_get_int(root, "version", -1);
    const json_value *files = json_get(root, "files");
    int rc = SPLASH_OK;
    if (!format || strcmp(format, SPLASH_PACKAGE_FORMAT))
        rc = splash_fail(err, SPLASH_E_FORMAT, "%s is not a Splash package manifest (\"format\" is not \"%s\")", where,
                         SPLASH_PACKAGE_FORMAT);
    else if (version != SPLASH_PACKAGE_VERSION)
        rc = splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: package version %" PRId64 ", this Splash reads version %d",
                         where, version, SPLASH_PACKAGE_VERSION);
    else if (!files || files->type != JSON_ARRAY)
        rc = splash_fail(err, SPLASH_E_FORMAT, "%s: no \"files\" array", where);
    if (rc) {
        json_free(root);
        return rc;
    }
    m->root = root;
    m->files = xcalloc(files->count ? files->count : 1, sizeof *m->files);
    for (size_t i = 0; i < files->count; i++) {
        const json_value *e = files->items[i];
        mf_entry *f = &m->files[i];
        f->path = json_get_string(e, "path", NULL);
        const char *sha = json_get_string(e, "sha256", NULL);
        if (!safe_relpath(f->path)) {
            rc = splash_fail(err, SPLASH_E_FORMAT, "%s: files[%zu]: missing or unsafe \"path\"", where, i);
        } else if (json_int64(json_get(e, "size"), &f->size) || f->size < 0) {
            rc = splash_fail(err, SPLASH_E_FORMAT, "%s: files[%zu] (%s): \"size\" is not a byte count", where, i, f->path);
        } else if (!is_hex64(sha)) {
            rc = splash_fail(err, SPLASH_E_FORMAT, "%s: files[%zu] (%s): \"sha256\" is not 64 lowercase hex digits", where,
                             i, f->path);
        } else {
            for (size_t j = 0; j < i && !rc; j++)
                if (!strcmp(m->files[j].path, f->path))
                    rc = splash_fail(err, SPLASH_E_FORMAT, "%s: %s is listed twice", where, f->path);
        }
        if (rc) {
            manifest_free(m);
            return rc;
        }
        memcpy(f->sha256, sha, 65);
        m->total += f->size;
        m->n++;
    }
    splash_sha256_hex(text, len, m->sha256);
    return SPLASH_OK;
}

static int manifest_load(const char *dir, manifest *m, splash_error *err) {
    char *path = splash_path_join(dir, "manifest.json");
    char *text = NULL;
    size_t len = 0;
    int rc = splash_read_file(path, &text, &len, err);
    if (!rc) rc = manifest_parse(text, len, path, m, err);
    free(text);
    free(path);
    return rc;
}

static const mf_entry *manifest_find(const manifest *m, const char *path) {
    for (size_t i = 0; i < m->n; i++)
        if (!strcmp(m->files[i].path, path)) return &m->files[i];
    return NULL;
}

/* ---- the cache directory --------------------------------------------------- */

static char *join3(const char *a, const char *b, const char *suffix) {
    strbuf sb;
    sb_init(&sb);
    sb_printf(&sb, "%s/%s%s", a, b, suffix);
    return sb_take(&sb, NULL);
}

/* 1 when dir holds a complete verified download (the fast path: no hashing of
 * the package files, no network).  *any: something is there at all. */
static int cache_complete(const char *dir, int *any) {
    *any = 0;
    char *vpath = splash_path_join(dir, ".verified");
    char *text = NULL;
    size_t len = 0;
    manifest m;
    int ok = 0;
    char *mpath = splash_path_join(dir, "manifest.json");
    *any = splash_is_file(mpath);
    free(mpath);
    if (!splash_read_file(vpath, &text, &len, NULL)) {
        while (len && (text[len - 1] == '\n' || text[len - 1] == ' ')) text[--len] = 0;
        if (len == 64 && !manifest_load(dir, &m, NULL)) {
            ok = !strcmp(text, m.sha256);
            for (size_t i = 0; ok && i < m.n; i++) {
                char *p = splash_path_join(dir, m.files[i].path);
                ok = splash_file_size(p) == m.files[i].size;
                free(p);
            }
            manifest_free(&m);
        }
    }
    free(text);
    free(vpath);
    return ok;
}

static void fsync_dir_of(const char *path) {
    char *d = xstrdup(path);
    char *slash = strrchr(d, '/');
    if (slash) *slash = 0;
    int fd = open(slash ? d : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(d);
}

static int mkdirs_parent(const char *path, splash_error *err) {
    char *d = xstrdup(path);
    char *slash = strrchr(d, '/');
    int rc = SPLASH_OK;
    if (slash && slash != d) {
        *slash = 0;
        rc = splash_mkdirs(d, err);
    }
    free(d);
    return rc;
}

/* Takes the model directory's lock, waiting (and saying so) while another
 * process holds it.  Returns the fd (close it to unlock) or -1. */
static int lock_dir(const char *dir, const char *label, int quiet, splash_error *err) {
    char *path = splash_path_join(dir, ".lock");
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        splash_fail(err, SPLASH_E_IO, "%s: cannot open the lock file: %s", path, strerror(errno));
        free(path);
        return -1;
    }
    int rc;
    while ((rc = flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {}
    if (rc != 0 && errno == EWOULDBLOCK) {
        if (!quiet) fprintf(stderr, "splash: another splash process is downloading %s; waiting for it (%s)\n", label, path);
        while ((rc = flock(fd, LOCK_EX)) != 0 && errno == EINTR) {}
    }
    if (rc != 0) {
        splash_fail(err, SPLASH_E_IO, "%s: cannot lock: %s", path, strerror(errno));
        close(fd);
        fd = -1;
    }
    free(path);
    return fd;
}

/* ---- fetching ---------------------------------------------------------------- */

typedef struct dl_ctx {
    const char *label; /* OWNER/REPO or OWNER/REPO@REV */
    const char *dir;
    const char *base;
    const splash_model_ref *ref;
    dl_progress progress;
    int retries;
    int quiet;
} dl_ctx;

static int retries_from_env(void) {
    const char *s = getenv("SPLASH_DOWNLOAD_RETRIES");
    if (!s || !*s) return 3;
    char *end;
    long v = strtol(s, &end, 10);
    return *end || v < 0 || v > 100 ? 3 : (int)v;
}

static void backoff(int attempt) {
    double s = 0.5 * (double)(1 << (attempt < 5 ? attempt - 1 : 4));
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static int fetch_manifest(dl_ctx *c, manifest *m, char **text, size_t *len, splash_error *err) {
    char *url = splash_model_file_url(c->base, c->ref, "manifest.json");
    strbuf sb;
    sb_init(&sb);
    dl_fetch f = {.url = url, .limit = MANIFEST_MAX_BYTES, .fd = -1, .mem = &sb};
    int rc = SPLASH_OK;
    for (int attempt = 1;; attempt++) {
        if (!dl_fetch_run(&f)) break;
        if (f.transient && attempt <= c->retries) {
            if (!c->quiet) fprintf(stderr, "splash: %s: %s; trying again (%d of %d)\n", url, f.why, attempt, c->retries);
            backoff(attempt);
            continue;
        }
        if (f.outcome == DL_FETCH_HTTP && (f.status == 404 || f.status == 401 || f.status == 410)) {
            if (strcmp(c->ref->revision, SPLASH_MODEL_REVISION_DEFAULT))
                rc = splash_fail(err, SPLASH_E_NOTFOUND, "model %s/%s (revision %s) not found at %s (HTTP %ld)",
                                 c->ref->owner, c->ref->repo, c->ref->revision, url, f.status);
            else
                rc = splash_fail(err, SPLASH_E_NOTFOUND, "model %s/%s not found at %s (HTTP %ld)", c->ref->owner,
                                 c->ref->repo, url, f.status);
        } else if (f.outcome == DL_FETCH_TOO_LONG) {
            rc = splash_fail(err, SPLASH_E_FORMAT, "%s: the manifest is larger than %d MiB", url, MANIFEST_MAX_BYTES >> 20);
        } else {
            rc = splash_fail(err, SPLASH_E_IO, "cannot fetch the manifest of %s from %s: %s", c->label, url, f.why);
        }
        break;
    }
    if (!rc) rc = manifest_parse(sb.data ? sb.data : "", sb.len, url, m, err);
    free(url);
    if (rc) {
        sb_free(&sb);
        return rc;
    }
    *text = sb_take(&sb, len);
    if (!*text) *text = xstrdup("");
    return SPLASH_OK;
}

/* Hashes the first n bytes of fd into h.  0 or -errno. */
static int hash_prefix(int fd, int64_t n, splash_sha256 *h) {
    enum { CHUNK = 1 << 20 };
    char *buf = malloc(CHUNK);
    if (!buf) return -ENOMEM;
    int64_t off = 0;
    int rc = 0;
    while (off < n) {
        size_t want = n - off < CHUNK ? (size_t)(n - off) : CHUNK;
        ssize_t r = pread(fd, buf, want, off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            rc = r < 0 ? -errno : -EIO;
            break;
        }
        splash_sha256_update(h, buf, (size_t)r);
        off += r;
    }
    free(buf);
    return rc;
}

static int file_matches(const char *path, const mf_entry *e) {
    char hex[65];
    return splash_file_size(path) == e->size && !splash_sha256_file(path, hex, NULL) && !strcmp(hex, e->sha256);
}

/* Brings one listed file into place: kept if it is there (re-hashed unless
 * trusted), else downloaded into FILE.partial, resumed from what is there,
 * retried on transient errors, re-fetched once if it does not match, then
 * renamed into place. */
static int fetch_file(dl_ctx *c, const mf_entry *e, int trusted, splash_error *err) {
    char *final = splash_path_join(c->dir, e->path);
    char *partial = join3(c->dir, e->path, ".partial");
    char *url = splash_model_file_url(c->base, c->ref, e->path);
    splash_sha256 *hash = NULL;
    int fd = -1, rc = SPLASH_OK;
    int refetched = 0, range_reset = 0, tries = 0;

    if (splash_is_file(final)) {
        if (splash_file_size(final) == e->size && (trusted || file_matches(final, e))) {
            dl_progress_add(&c->progress, e->size, 0);
            goto done;
        }
        unlink(final);
    }
    if ((rc = mkdirs_parent(final, err))) goto done;
    for (;;) {
        fd = open(partial, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0) {
            rc = splash_fail(err, SPLASH_E_IO, "%s: %s", partial, strerror(errno));
            goto done;
        }
        int64_t have = st.st_size;
        if (have > e->size) {
            if (ftruncate(fd, 0) != 0) {
                rc = splash_fail(err, SPLASH_E_IO, "%s: truncate failed: %s", partial, strerror(errno));
                goto done;
            }
            have = 0;
        }
        hash = splash_sha256_new();
        int hr = have > 0 ? hash_prefix(fd, have, hash) : 0;
        if (hr) {
            rc = splash_fail(err, SPLASH_E_IO, "%s: read failed: %s", partial, strerror(-hr));
            goto done;
        }
        dl_progress_add(&c->progress, have, 0);
        int64_t size = have;
        if (have < e->size) {
            if (lseek(fd, have, SEEK_SET) != have) {
                rc = splash_fail(err, SPLASH_E_IO, "%s: seek failed: %s", partial, strerror(errno));
                goto done;
            }
            dl_fetch f = {.url = url, .offset = have, .limit = e->size, .fd = fd, .hash = &hash, .progress = &c->progress};
            int fr = dl_fetch_run(&f);
            size = f.size;
            if (fr) {
                dl_progress_drop(&c->progress, f.size); /* counted again on the next pass */
                char discard[65];
                splash_sha256_finish(hash, discard);
                hash = NULL;
                close(fd);
                fd = -1;
                if (f.outcome == DL_FETCH_HTTP && !f.transient && f.status != 416) {
                    rc = splash_fail(err, f.status == 404 ? SPLASH_E_NOTFOUND : SPLASH_E_IO,
                                     "%s of model %s: %s at %s", e->path, c->label,
                                     f.status == 404 ? "not found (HTTP 404)" : f.why, url);
                    goto done;
                }
                if (((f.outcome == DL_FETCH_HTTP && f.status == 416) || f.outcome == DL_FETCH_BAD_RANGE) && !range_reset) {
                    /* 416 or a 206 from elsewhere: what we hold is not a prefix the server knows */
                    range_reset = 1;
                    dl_progress_say(&c->progress, "splash: %s: %s after asking for bytes %" PRId64 "-; starting it over",
                                    e->path, f.why, have);
                    unlink(partial);
                    continue;
                }
                if (f.outcome == DL_FETCH_TOO_LONG) {
                    size = e->size + 1; /* handled as a mismatch below */
                } else {
                    if (f.transient) {
                        tries = f.size > have ? 1 : tries + 1; /* progress resets the count */
                        if (tries <= c->retries) {
                            dl_progress_say(&c->progress,
                                            "splash: %s: %s; resuming from byte %" PRId64 " (retry %d of %d)", e->path,
                                            f.why, f.size, tries, c->retries);
                            backoff(tries);
                            continue;
                        }
                    }
                    rc = splash_fail(err, SPLASH_E_IO,
                                     "downloading %s of model %s from %s: %s (%" PRId64 " of %" PRId64
                                     " bytes kept in %s; run again to resume)",
                                     e->path, c->label, url, f.why, f.size, e->size, partial);
                    goto done;
                }
            }
        }
        char actual[65] = "";
        if (hash) splash_sha256_finish(hash, actual);
        hash = NULL;
        if (size != e->size || strcmp(actual, e->sha256)) {
            if (fd >= 0) close(fd);
            fd = -1;
            unlink(partial);
            dl_progress_drop(&c->progress, size > e->size ? 0 : size);
            char what[256];
            if (size != e->size)
                snprintf(what, sizeof what, "size mismatch: expected %" PRId64 " bytes, got %s%" PRId64, e->size,
                         size > e->size ? "more than " : "", size > e->size ? e->size : size);
            else
                snprintf(what, sizeof what, "sha256 mismatch: expected %s, actual %s", e->sha256, actual);
            if (!refetched) {
                refetched = 1;
                dl_progress_say(&c->progress, "splash: %s: %s; fetching it again", e->path, what);
                continue;
            }
            rc = splash_fail(err, SPLASH_E_MISMATCH, "%s of model %s is corrupt after fetching it twice: %s (from %s)",
                             e->path, c->label, what, url);
            goto done;
        }
        if (fsync(fd) != 0 || close(fd) != 0) {
            fd = -1;
            rc = splash_fail(err, SPLASH_E_IO, "%s: %s", partial, strerror(errno));
            goto done;
        }
        fd = -1;
        if (rename(partial, final) != 0) {
            rc = splash_fail(err, SPLASH_E_IO, "rename %s to %s: %s", partial, final, strerror(errno));
            goto done;
        }
        fsync_dir_of(final);
        if (c->progress.mode == DL_SHOW_LINES)
            dl_progress_say(&c->progress, "splash: %s  %" PRId64 " bytes  sha256 ok", e->path, e->size);
        break;
    }
done:
    if (hash) {
        char discard[65];
        splash_sha256_finish(hash, discard);
    }
    if (fd >= 0) close(fd);
    free(final);
    free(partial);
    free(url);
    return rc;
}

/* Installs a freshly fetched manifest: entries that changed since the old
 * manifest.json lose their files; .verified goes until everything checks out.
 * trusted[i] says whether files[i] at its final path can be kept unhashed. */
static int install_manifest(dl_ctx *c, const manifest *m, const char *text, size_t len, int *trusted, splash_error *err) {
    char *vpath = splash_path_join(c->dir, ".verified");
    char *mpath = splash_path_join(c->dir, "manifest.json");
    char *tmp = splash_path_join(c->dir, "manifest.json.partial");
    unlink(vpath);
    manifest old;
    int have_old = !manifest_load(c->dir, &old, NULL);
    for (size_t i = 0; i < m->n; i++) {
        const mf_entry *o = have_old ? manifest_find(&old, m->files[i].path) : NULL;
        trusted[i] = o && o->size == m->files[i].size && !strcmp(o->sha256, m->files[i].sha256);
    }
    if (have_old) {
        for (size_t i = 0; i < old.n; i++) {
            const mf_entry *n = manifest_find(m, old.files[i].path);
            if (n && n->size == old.files[i].size && !strcmp(n->sha256, old.files[i].sha256)) continue;
            char *f = splash_path_join(c->dir, old.files[i].path);
            char *p = join3(c->dir, old.files[i].path, ".partial");
            unlink(f);
            unlink(p);
            free(f);
            free(p);
        }
        manifest_free(&old);
    }
    int rc = splash_write_file(tmp, text, len, err);
    if (!rc && rename(tmp, mpath) != 0) rc = splash_fail(err, SPLASH_E_IO, "rename %s: %s", tmp, strerror(errno));
    free(vpath);
    free(mpath);
    free(tmp);
    return rc;
}

static int check_disk_space(dl_ctx *c, const manifest *m, splash_error *err) {
    int64_t need = 0;
    for (size_t i = 0; i < m->n; i++) {
        char *f = splash_path_join(c->dir, m->files[i].path);
        char *p = join3(c->dir, m->files[i].path, ".partial");
        if (splash_file_size(f) != m->files[i].size) {
            int64_t have = splash_file_size(p);
            need += m->files[i].size - (have > 0 && have <= m->files[i].size ? have : 0);
        }
        free(f);
        free(p);
    }
    struct statvfs vfs;
    if (statvfs(c->dir, &vfs) != 0) return SPLASH_OK; /* cannot tell: let writes fail */
    int64_t avail = (int64_t)vfs.f_bavail * (int64_t)vfs.f_frsize;
    if (avail < need)
        return splash_fail(err, SPLASH_E_IO, "not enough disk space for %s in %s: %.2f GB to download, %.2f GB free",
                           c->label, c->dir, (double)need / 1e9, (double)avail / 1e9);
    return SPLASH_OK;
}

static int download(dl_ctx *c, int mode, splash_error *err) {
    manifest m;
    char *text = NULL;
    size_t len = 0;
    int rc = fetch_manifest(c, &m, &text, &len, err);
    if (rc) return rc;
    int *trusted = xcalloc(m.n ? m.n : 1, sizeof *trusted);
    rc = install_manifest(c, &m, text, len, trusted, err);
    if (!rc) rc = check_disk_space(c, &m, err);
    if (!rc) {
        dl_progress_init(&c->progress, mode, c->label, m.total);
        dl_progress_say(&c->progress, "splash: fetching %s: %zu files, %.1f MB, from %s into %s", c->label, m.n,
                        (double)m.total / 1e6, c->base, c->dir);
        for (size_t i = 0; i < m.n && !rc; i++) rc = fetch_file(c, &m.files[i], trusted[i], err);
        if (rc) dl_progress_end(&c->progress); /* leave the bar where it stopped */
    }
    if (!rc) {
        char *vpath = splash_path_join(c->dir, ".verified");
        char *tmp = splash_path_join(c->dir, ".verified.partial");
        char line[66];
        snprintf(line, sizeof line, "%s\n", m.sha256);
        rc = splash_write_file(tmp, line, 65, err);
        if (!rc && rename(tmp, vpath) != 0) rc = splash_fail(err, SPLASH_E_IO, "rename %s: %s", tmp, strerror(errno));
        if (!rc) fsync_dir_of(vpath);
        free(vpath);
        free(tmp);
    }
    if (!rc) {
        dl_progress_end(&c->progress);
        double dt = dl_now() - c->progress.t_start;
        dl_progress_say(&c->progress, "splash: %s: %zu files verified (%.1f MB downloaded in %.1f s) in %s", c->label,
                        m.n, (double)c->progress.received / 1e6, dt, c->dir);
    }
    free(trusted);
    free(text);
    manifest_free(&m);
    return rc;
}

/* ---- the entry point --------------------------------------------------------- */

int splash_model_resolve(const char *name_or_path, const splash_download_options *opt, char **package_dir,
                         splash_error *err) {
    static const splash_download_options defaults = {0};
    if (!opt) opt = &defaults;
    *package_dir = NULL;
    if (!name_or_path || !*name_or_path) return splash_fail(err, SPLASH_E_INVALID, "no model given");
    if (splash_is_dir(name_or_path)) {
        *package_dir = xstrdup(name_or_path);
        return SPLASH_OK;
    }
    if (splash_model_looks_like_path(name_or_path) || splash_is_file(name_or_path))
        return splash_fail(err, SPLASH_E_NOTFOUND, "no package directory at %s", name_or_path);
    if (!strchr(name_or_path, '/'))
        return splash_fail(err, SPLASH_E_NOTFOUND,
                           "'%s' is neither a package directory nor a model name OWNER/REPO[@REVISION]", name_or_path);
    splash_model_ref ref;
    int rc = splash_model_ref_parse(name_or_path, &ref, err);
    if (rc) return rc;

    char *root = NULL, *dir = NULL, *base = NULL;
    int lock = -1;
    rc = splash_model_cache_root(opt->cache_dir, &root, err);
    if (rc) return rc;
    dir = splash_model_cache_dir(root, &ref);
    char label[sizeof ref.owner + sizeof ref.repo + sizeof ref.revision + 4];
    snprintf(label, sizeof label, "%s/%s%s%s", ref.owner, ref.repo,
             strcmp(ref.revision, SPLASH_MODEL_REVISION_DEFAULT) ? "@" : "",
             strcmp(ref.revision, SPLASH_MODEL_REVISION_DEFAULT) ? ref.revision : "");
    int any = 0;
    if (cache_complete(dir, &any)) goto found;
    if (opt->offline) {
        rc = splash_fail(err, SPLASH_E_NOTFOUND,
                         "model %s is not in the cache (%s %s) and --offline forbids downloading it; run `splash pull "
                         "%s` while online, or give a package directory",
                         label, dir, any ? "holds an incomplete download" : "has no download", name_or_path);
        goto out;
    }
    if ((rc = splash_mkdirs(dir, err))) goto out;
    if ((lock = lock_dir(dir, label, opt->quiet, err)) < 0) {
        rc = err ? err->code : SPLASH_E_IO;
        goto out;
    }
    if (cache_complete(dir, &any)) goto found; /* another process finished it while we waited */
    if ((rc = splash_model_base_url(opt->base_url, &base, err))) goto out;
    int mode = DL_SHOW_NONE;
    if (!opt->quiet) {
        if (opt->progress > 0) mode = DL_SHOW_BAR;
        else if (opt->progress < 0) mode = DL_SHOW_LINES;
        else mode = isatty(2) ? DL_SHOW_BAR : DL_SHOW_LINES;
    }
    dl_ctx c = {.label = label, .dir = dir, .base = base, .ref = &ref, .retries = retries_from_env(),
                .quiet = opt->quiet};
    rc = download(&c, mode, err);
    if (rc) goto out;
found:
    *package_dir = dir;
    dir = NULL;
    rc = SPLASH_OK;
out:
    if (lock >= 0) close(lock);
    free(root);
    free(dir);
    free(base);
    return rc;
}
