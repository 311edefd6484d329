/* package.c - opening, mapping, looking up and verifying a Splash package
 * (the format is in docs/package-format.md, the API in package.h).
 *
 * Opening trusts nothing in the manifest: every file it lists must exist with
 * its listed size, every tensor must name a listed file, a known dtype, a
 * shape whose byte size is exactly `bytes`, and a 64-byte aligned range inside
 * its file.  Only then are tensors handed out, so model code can index them
 * without bounds checks of its own.  Hashing is left to `splash verify`
 * because reading 15 GB on every start would cost more than the start itself.
 */
#include "package/package.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fs.h"
#include "base/mem.h"
#include "base/name_index.h"
#include "base/sha256.h"

typedef struct pkg_file {
    const char *rel; /* inside the manifest */
    char *path;      /* dir + rel */
    int64_t size;
    const char *sha256;
    splash_map map;
    int mapped;
} pkg_file;

struct splash_package {
    char *dir;
    json_value *manifest;
    const char *architecture;
    pkg_file *files;
    size_t n_files;
    splash_tensor *tensors;
    size_t n_tensors;
    splash_name_index by_name; /* tensors by name */
};

/* ---- manifest reading (shared by open and verify) ------------------------ */

static int read_manifest(const char *dir, json_value **out, splash_error *err) {
    *out = NULL;
    char *path = splash_path_join(dir, "manifest.json");
    char *text = NULL;
    size_t len = 0;
    int rc = splash_read_file(path, &text, &len, err);
    if (rc) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err ? err->msg : "");
        splash_fail(err, rc, "%s (is %s a Splash package?)", why, dir);
        free(path);
        return rc;
    }
    char jerr[256];
    json_value *m = json_parse(text, len, 32, jerr, sizeof jerr);
    free(text);
    if (!m || m->type != JSON_OBJECT) {
        rc = splash_fail(err, SPLASH_E_FORMAT, "%s: not a JSON object%s%s", path, m ? "" : ": ", m ? "" : jerr);
        json_free(m);
        free(path);
        return rc;
    }
    const char *format = json_get_string(m, "format", NULL);
    int64_t version = json_get_int(m, "version", -1);
    if (!format || strcmp(format, SPLASH_PACKAGE_FORMAT)) {
        rc = splash_fail(err, SPLASH_E_FORMAT, "%s: \"format\" is %s%s%s, expected \"%s\"", path, format ? "\"" : "",
                         format ? format : "missing", format ? "\"" : "", SPLASH_PACKAGE_FORMAT);
    } else if (version != SPLASH_PACKAGE_VERSION) {
        rc = splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: package version %" PRId64 ", this Splash reads version %d", path,
                         version, SPLASH_PACKAGE_VERSION);
    }
    free(path);
    if (rc) {
        json_free(m);
        return rc;
    }
    *out = m;
    return SPLASH_OK;
}

static int safe_relpath(const char *p) {
    return p && *p && p[0] != '/' && !strstr(p, "..") && !strchr(p, '\\');
}

/* Fills files[] from manifest "files"; checks shape of each entry. */
static int read_files(const char *dir, const json_value *m, pkg_file **out, size_t *n_out, splash_error *err) {
    const json_value *files = json_get(m, "files");
    *out = NULL;
    *n_out = 0;
    if (!files || files->type != JSON_ARRAY)
        return splash_fail(err, SPLASH_E_FORMAT, "%s/manifest.json: no \"files\" array", dir);
    pkg_file *f = xcalloc(files->count ? files->count : 1, sizeof *f);
    for (size_t i = 0; i < files->count; i++) {
        const json_value *e = files->items[i];
        const char *rel = json_get_string(e, "path", NULL);
        int64_t size;
        const char *sha = json_get_string(e, "sha256", NULL);
        if (!safe_relpath(rel) || json_int64(json_get(e, "size"), &size) != 0 || size < 0 || !sha || strlen(sha) != 64) {
            for (size_t k = 0; k < i; k++) free(f[k].path);
            free(f);
            return splash_fail(err, SPLASH_E_FORMAT, "%s/manifest.json: files[%zu] needs a relative \"path\", a \"size\" "
                               "and a 64-digit \"sha256\"", dir, i);
        }
        f[i].rel = rel;
        f[i].path = splash_path_join(dir, rel);
        f[i].size = size;
        f[i].sha256 = sha;
    }
    *out = f;
    *n_out = files->count;
    return SPLASH_OK;
}

/* ---- open ---------------------------------------------------------------- */

static const char *tensor_name_at(const void *items, size_t i) { return ((const splash_tensor *)items)[i].name; }

static const char *shape_str(int ndim, const int64_t *shape, char *buf, size_t size) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, o < size ? size - o : 0, "[");
    for (int i = 0; i < ndim; i++)
        o += (size_t)snprintf(buf + o, o < size ? size - o : 0, "%s%lld", i ? ", " : "", (long long)shape[i]);
    snprintf(buf + o, o < size ? size - o : 0, "]");
    return buf;
}

static int load_tensor(splash_package *p, size_t i, const json_value *e, splash_error *err) {
    const char *name = json_get_string(e, "name", NULL);
    const char *file = json_get_string(e, "file", NULL);
    const char *dts = json_get_string(e, "dtype", NULL);
    const json_value *shape = json_get(e, "shape");
    int64_t offset, bytes;
    if (!name || !file || !dts || !shape || shape->type != JSON_ARRAY || json_int64(json_get(e, "offset"), &offset) ||
        json_int64(json_get(e, "bytes"), &bytes) || offset < 0 || bytes < 0)
        return splash_fail(err, SPLASH_E_FORMAT,
                           "%s/manifest.json: tensors[%zu] needs \"name\", \"file\", \"offset\", \"dtype\", \"shape\", "
                           "\"bytes\"", p->dir, i);
    int dt = splash_dtype_parse(dts);
    if (dt < 0) return splash_fail(err, SPLASH_E_FORMAT, "%s: tensor %s: unknown dtype \"%s\"", p->dir, name, dts);
    if (shape->count < 1 || shape->count > SPLASH_MAX_DIMS)
        return splash_fail(err, SPLASH_E_FORMAT, "%s: tensor %s: %zu dimensions (1 to %d)", p->dir, name, shape->count,
                           SPLASH_MAX_DIMS);
    splash_tensor *t = &p->tensors[i];
    memset(t, 0, sizeof *t);
    t->name = name;
    t->dtype = (splash_dtype)dt;
    t->ndim = (int)shape->count;
    for (int d = 0; d < t->ndim; d++) {
        int64_t v;
        if (json_int64(shape->items[d], &v) || v <= 0 || v > (INT64_C(1) << 40))
            return splash_fail(err, SPLASH_E_FORMAT, "%s: tensor %s: bad shape", p->dir, name);
        t->shape[d] = v;
    }
    if ((dt == SPLASH_Q4 || dt == SPLASH_Q8) && t->shape[t->ndim - 1] % SPLASH_QGROUP)
        return splash_fail(err, SPLASH_E_FORMAT, "%s: tensor %s: %s needs its last dimension a multiple of %d", p->dir,
                           name, dts, SPLASH_QGROUP);
    size_t want = splash_tensor_bytes(t->dtype, t->ndim, t->shape);
    if ((uint64_t)bytes != want) {
        char sb[128];
        return splash_fail(err, SPLASH_E_FORMAT, "%s: tensor %s: %" PRId64 " bytes, but %s %s takes %zu", p->dir, name,
                           bytes, dts, shape_str(t->ndim, t->shape, sb, sizeof sb), want);
    }
    if (offset % SPLASH_TENSOR_ALIGN)
        return splash_fail(err, SPLASH_E_FORMAT, "%s: tensor %s: offset %" PRId64 " is not a multiple of %d", p->dir, name,
                           offset, SPLASH_TENSOR_ALIGN);
    pkg_file *f = NULL;
    for (size_t k = 0; k < p->n_files && !f; k++)
        if (!strcmp(p->files[k].rel, file)) f = &p->files[k];
    if (!f) return splash_fail(err, SPLASH_E_FORMAT, "%s: tensor %s: file %s is not in the manifest's files", p->dir, name, file);
    if ((uint64_t)offset > (uint64_t)f->size || (uint64_t)bytes > (uint64_t)f->size - (uint64_t)offset)
        return splash_fail(err, SPLASH_E_FORMAT, "%s: tensor %s: [%" PRId64 ", +%" PRId64 ") lies outside %s (%" PRId64 " bytes)",
                           p->dir, name, offset, bytes, file, f->size);
    if (!f->mapped) {
        int rc = splash_map_file(f->path, &f->map, err);
        if (rc) return rc;
        f->mapped = 1;
        if ((int64_t)f->map.size != f->size)
            return splash_fail(err, SPLASH_E_MISMATCH, "%s: %zu bytes, the manifest says %" PRId64, f->path, f->map.size,
                               f->size);
    }
    t->data = f->map.data + offset;
    t->bytes = (size_t)bytes;
    return SPLASH_OK;
}

int splash_package_open(const char *dir, splash_package **out, splash_error *err) {
    *out = NULL;
    splash_package *p = xcalloc(1, sizeof *p);
    p->dir = xstrdup(dir);
    int rc = read_manifest(dir, &p->manifest, err);
    if (!rc) {
        p->architecture = json_get_string(p->manifest, "architecture", NULL);
        if (!p->architecture) rc = splash_fail(err, SPLASH_E_FORMAT, "%s/manifest.json: no \"architecture\"", dir);
    }
    if (!rc) rc = read_files(dir, p->manifest, &p->files, &p->n_files, err);
    for (size_t i = 0; !rc && i < p->n_files; i++) {
        int64_t size = splash_file_size(p->files[i].path);
        if (size < 0)
            rc = splash_fail(err, SPLASH_E_NOTFOUND, "%s: missing (listed in %s/manifest.json)", p->files[i].path, dir);
        else if (size != p->files[i].size)
            rc = splash_fail(err, SPLASH_E_MISMATCH, "%s: %" PRId64 " bytes, the manifest says %" PRId64
                             " (truncated or replaced: run `splash verify`)", p->files[i].path, size, p->files[i].size);
    }
    const json_value *tensors = rc ? NULL : json_get(p->manifest, "tensors");
    if (!rc && (!tensors || tensors->type != JSON_ARRAY))
        rc = splash_fail(err, SPLASH_E_FORMAT, "%s/manifest.json: no \"tensors\" array", dir);
    if (!rc) {
        p->n_tensors = tensors->count;
        p->tensors = xcalloc(p->n_tensors ? p->n_tensors : 1, sizeof *p->tensors);
        for (size_t i = 0; !rc && i < p->n_tensors; i++) rc = load_tensor(p, i, tensors->items[i], err);
    }
    if (!rc) {
        splash_name_index_init(&p->by_name, p->n_tensors, tensor_name_at, p->tensors);
        for (size_t i = 0; !rc && i < p->n_tensors; i++)
            if (splash_name_index_add(&p->by_name, i) >= 0)
                rc = splash_fail(err, SPLASH_E_FORMAT, "%s/manifest.json: tensor %s listed twice", dir, p->tensors[i].name);
    }
    if (rc) {
        splash_package_close(p);
        return rc;
    }
    *out = p;
    return SPLASH_OK;
}

void splash_package_close(splash_package *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_files; i++) {
        if (p->files[i].mapped) splash_unmap(&p->files[i].map);
        free(p->files[i].path);
    }
    free(p->files);
    free(p->tensors);
    splash_name_index_free(&p->by_name);
    json_free(p->manifest);
    free(p->dir);
    free(p);
}

const char *splash_package_dir(const splash_package *p) { return p->dir; }
const json_value *splash_package_manifest(const splash_package *p) { return p->manifest; }
const char *splash_package_architecture(const splash_package *p) { return p->architecture; }
size_t splash_package_tensor_count(const splash_package *p) { return p->n_tensors; }
const splash_tensor *splash_package_tensor_at(const splash_package *p, size_t i) {
    return i < p->n_tensors ? &p->tensors[i] : NULL;
}

const splash_tensor *splash_package_find(const splash_package *p, const char *name) {
    long i = splash_name_index_find(&p->by_name, name);
    return i >= 0 ? &p->tensors[i] : NULL;
}

int splash_package_get(const splash_package *p, const char *name, int ndim, const int64_t *shape,
                       const splash_tensor **out, splash_error *err) {
    *out = NULL;
    const splash_tensor *t = splash_package_find(p, name);
    if (!t)
        return splash_fail(err, SPLASH_E_NOTFOUND, "package %s: tensor %s is missing (architecture %s)", p->dir, name,
                           p->architecture);
    int ok = ndim <= 0 || t->ndim == ndim;
    for (int d = 0; ok && ndim > 0 && d < ndim; d++) ok = t->shape[d] == shape[d];
    if (!ok) {
        char a[128], b[128];
        return splash_fail(err, SPLASH_E_MISMATCH, "package %s: tensor %s is %s %s, the model expects shape %s", p->dir,
                           name, splash_dtype_name(t->dtype), shape_str(t->ndim, t->shape, a, sizeof a),
                           shape_str(ndim, shape, b, sizeof b));
    }
    *out = t;
    return SPLASH_OK;
}

const char *splash_package_file(const splash_package *p, const char *relpath) {
    for (size_t i = 0; i < p->n_files; i++)
        if (!strcmp(p->files[i].rel, relpath)) return p->files[i].path;
    return NULL;
}

/* ---- verify -------------------------------------------------------------- */

int splash_package_verify(const char *dir, int verbose, splash_error *err) {
    json_value *m = NULL;
    int rc = read_manifest(dir, &m, err);
    if (rc) return rc;
    pkg_file *files = NULL;
    size_t n = 0;
    rc = read_files(dir, m, &files, &n, err);
    int64_t total = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        int64_t size = splash_file_size(files[i].path);
        if (size < 0) {
            rc = splash_fail(err, SPLASH_E_MISMATCH, "%s: missing (the manifest lists it)", files[i].path);
            break;
        }
        if (size != files[i].size) {
            rc = splash_fail(err, SPLASH_E_MISMATCH, "%s: size %" PRId64 " bytes, the manifest says %" PRId64,
                             files[i].path, size, files[i].size);
            break;
        }
        char hex[65];
        rc = splash_sha256_file(files[i].path, hex, err);
        if (rc) break;
        if (strcmp(hex, files[i].sha256)) {
            rc = splash_fail(err, SPLASH_E_MISMATCH, "%s: sha256 %s, the manifest says %s", files[i].path, hex,
                             files[i].sha256);
            break;
        }
        total += size;
        if (verbose) fprintf(stderr, "ok  %s  %" PRId64 " bytes  %s\n", files[i].rel, size, hex);
    }
    if (!rc && verbose) fprintf(stderr, "%s: %zu files, %" PRId64 " bytes, all match the manifest\n", dir, n, total);
    for (size_t i = 0; i < n; i++) free(files[i].path);
    free(files);
    json_free(m);
    return rc;
}
