/* safetensors.c - the checkpoint reader (see safetensors.h).
 *
 * All files are mapped and validated up front, then tensors are looked up by
 * name in one open-addressing hash table (a per-expert MoE checkpoint has
 * tens of thousands of tensors, and the packer looks every one of them up).
 */
#include "package/safetensors.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fs.h"
#include "base/json.h"
#include "base/mem.h"
#include "base/name_index.h"
#include "package/tensor.h"

#define MAX_HEADER_BYTES (256u << 20) /* a header bigger than this is not a checkpoint */

typedef struct st_file {
    char *path;
    splash_map map;
    json_value *header;
} st_file;

struct splash_st {
    st_file *files;
    size_t n_files;
    splash_st_tensor *tensors;
    size_t n_tensors, cap_tensors;
    splash_name_index by_name; /* tensors by name, built once all are read */
};

static const struct {
    const char *name;
    size_t size;
} dtypes[SPLASH_ST_DTYPE_COUNT] = {
    [SPLASH_ST_BOOL] = {"BOOL", 1},     [SPLASH_ST_U8] = {"U8", 1},         [SPLASH_ST_I8] = {"I8", 1},
    [SPLASH_ST_U16] = {"U16", 2},       [SPLASH_ST_I16] = {"I16", 2},       [SPLASH_ST_F16] = {"F16", 2},
    [SPLASH_ST_BF16] = {"BF16", 2},     [SPLASH_ST_U32] = {"U32", 4},       [SPLASH_ST_I32] = {"I32", 4},
    [SPLASH_ST_F32] = {"F32", 4},       [SPLASH_ST_U64] = {"U64", 8},       [SPLASH_ST_I64] = {"I64", 8},
    [SPLASH_ST_F64] = {"F64", 8},       [SPLASH_ST_F8_E4M3] = {"F8_E4M3", 1}, [SPLASH_ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *splash_st_dtype_name(splash_st_dtype d) {
    return (unsigned)d < SPLASH_ST_DTYPE_COUNT ? dtypes[d].name : "?";
}
size_t splash_st_dtype_size(splash_st_dtype d) { return (unsigned)d < SPLASH_ST_DTYPE_COUNT ? dtypes[d].size : 0; }

static int dtype_parse(const char *s) {
    for (int i = 0; i < SPLASH_ST_DTYPE_COUNT; i++)
        if (!strcmp(s, dtypes[i].name)) return i;
    return -1;
}

int splash_st_is_float(splash_st_dtype d) {
    return d == SPLASH_ST_F16 || d == SPLASH_ST_BF16 || d == SPLASH_ST_F32 || d == SPLASH_ST_F64;
}

int64_t splash_st_numel(const splash_st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

const char *splash_st_shape_str(int ndim, const int64_t *shape, char *buf, size_t size) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, o < size ? size - o : 0, "[");
    for (int i = 0; i < ndim; i++)
        o += (size_t)snprintf(buf + o, o < size ? size - o : 0, "%s%lld", i ? ", " : "", (long long)shape[i]);
    snprintf(buf + o, o < size ? size - o : 0, "]");
    return buf;
}

/* ---- lookup table -------------------------------------------------------- */

static const char *tensor_name_at(const void *items, size_t i) { return ((const splash_st_tensor *)items)[i].name; }

const splash_st_tensor *splash_st_find(const splash_st *st, const char *name) {
    long i = splash_name_index_find(&st->by_name, name);
    return i >= 0 ? &st->tensors[i] : NULL;
}

/* ---- one file ------------------------------------------------------------ */

static int read_u64_le(const uint8_t *p, uint64_t *out) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    *out = v;
    return 0;
}

static int parse_file(splash_st *st, st_file *f, splash_error *err) {
    int rc = splash_map_file(f->path, &f->map, err);
    if (rc) return rc;
    size_t size = f->map.size;
    if (size < 8)
        return splash_fail(err, SPLASH_E_FORMAT,
                           "%s: truncated: %zu bytes (a safetensors file starts with an 8-byte header length)",
                           f->path, size);
    uint64_t n;
    read_u64_le(f->map.data, &n);
    if (n > size - 8)
        return splash_fail(err, SPLASH_E_FORMAT,
                           "%s: header length %llu runs past the end of the file (%zu bytes): truncated or not a "
                           "safetensors file",
                           f->path, (unsigned long long)n, size);
    if (n > MAX_HEADER_BYTES)
        return splash_fail(err, SPLASH_E_FORMAT, "%s: header of %llu bytes is too large", f->path,
                           (unsigned long long)n);
    char jerr[256];
    f->header = json_parse((const char *)f->map.data + 8, (size_t)n, 16, jerr, sizeof jerr);
    if (!f->header) return splash_fail(err, SPLASH_E_FORMAT, "%s: safetensors header is not JSON: %s", f->path, jerr);
    if (f->header->type != JSON_OBJECT)
        return splash_fail(err, SPLASH_E_FORMAT, "%s: safetensors header is not a JSON object", f->path);
    size_t data_size = size - 8 - (size_t)n;
    const uint8_t *data = f->map.data + 8 + n;
    for (size_t i = 0; i < f->header->count; i++) {
        const char *name = f->header->keys[i];
        const json_value *e = f->header->items[i];
        if (!strcmp(name, "__metadata__")) continue;
        const char *ds = json_get_string(e, "dtype", NULL);
        const json_value *shape = json_get(e, "shape");
        const json_value *offs = json_get(e, "data_offsets");
        if (!ds || !shape || shape->type != JSON_ARRAY || !offs || offs->type != JSON_ARRAY || offs->count != 2)
            return splash_fail(err, SPLASH_E_FORMAT,
                               "%s: tensor %s: header entry needs \"dtype\", \"shape\" and two \"data_offsets\"",
                               f->path, name);
        int dt = dtype_parse(ds);
        if (dt < 0) return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: tensor %s: unknown dtype \"%s\"", f->path, name, ds);
        if (shape->count > SPLASH_ST_MAX_DIMS)
            return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: tensor %s: %zu dimensions (at most %d)", f->path, name,
                               shape->count, SPLASH_ST_MAX_DIMS);
        splash_st_tensor t;
        memset(&t, 0, sizeof t);
        t.name = name;
        t.file = f->path;
        t.dtype = (splash_st_dtype)dt;
        t.ndim = (int)shape->count;
        /* numel in unsigned 128-bit-safe steps: stop at anything beyond the file */
        uint64_t numel = 1;
        for (size_t d = 0; d < shape->count; d++) {
            int64_t v;
            if (json_int64(shape->items[d], &v) != 0 || v < 0)
                return splash_fail(err, SPLASH_E_FORMAT, "%s: tensor %s: shape entry %zu is not a size", f->path, name, d);
            t.shape[d] = v;
            if (v && numel > (UINT64_C(1) << 62) / (uint64_t)v)
                return splash_fail(err, SPLASH_E_FORMAT, "%s: tensor %s: shape too large", f->path, name);
            numel *= (uint64_t)v;
        }
        int64_t b, en;
        if (json_int64(offs->items[0], &b) != 0 || json_int64(offs->items[1], &en) != 0 || b < 0 || en < b)
            return splash_fail(err, SPLASH_E_FORMAT, "%s: tensor %s: bad data_offsets", f->path, name);
        uint64_t want = numel * dtypes[dt].size;
        if ((uint64_t)(en - b) != want) {
            char sb[128];
            return splash_fail(err, SPLASH_E_FORMAT, "%s: tensor %s: data_offsets span %lld bytes but %s %s needs %llu",
                               f->path, name, (long long)(en - b), ds, splash_st_shape_str(t.ndim, t.shape, sb, sizeof sb),
                               (unsigned long long)want);
        }
        if ((uint64_t)en > data_size)
            return splash_fail(err, SPLASH_E_FORMAT,
                               "%s: tensor %s: data [%lld, %lld) lies outside the file's %zu data bytes: the file is "
                               "truncated or its header is wrong",
                               f->path, name, (long long)b, (long long)en, data_size);
        t.data = data + b;
        t.bytes = (size_t)want;
        if (st->n_tensors == st->cap_tensors) {
            st->cap_tensors = st->cap_tensors ? st->cap_tensors * 2 : 256;
            st->tensors = xrealloc(st->tensors, st->cap_tensors * sizeof *st->tensors);
        }
        st->tensors[st->n_tensors++] = t;
    }
    return SPLASH_OK;
}

/* ---- opening ------------------------------------------------------------- */

static int has_suffix(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void add_file(splash_st *st, char *path) {
    st->files = xrealloc(st->files, (st->n_files + 1) * sizeof *st->files);
    memset(&st->files[st->n_files], 0, sizeof st->files[0]);
    st->files[st->n_files++].path = path;
}

/* Lists *.safetensors and the index in dir. */
static int scan_dir(const char *dir, char ***names, size_t *n, char **index, splash_error *err) {
    DIR *d = opendir(dir);
    if (!d) return splash_fail(err, SPLASH_E_IO, "%s: cannot open the checkpoint directory", dir);
    *names = NULL;
    *n = 0;
    *index = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (has_suffix(e->d_name, ".safetensors")) {
            *names = xrealloc(*names, (*n + 1) * sizeof **names);
            (*names)[(*n)++] = xstrdup(e->d_name);
        } else if (has_suffix(e->d_name, ".safetensors.index.json")) {
            /* prefer model.safetensors.index.json when there are several */
            if (!*index || !strcmp(e->d_name, "model.safetensors.index.json")) {
                free(*index);
                *index = xstrdup(e->d_name);
            }
        }
    }
    closedir(d);
    if (*n) qsort(*names, *n, sizeof **names, cmp_str);
    return SPLASH_OK;
}

static int open_index(splash_st *st, const char *dir, const char *index_name, json_value **map_out,
                      splash_error *err) {
    char *path = splash_path_join(dir, index_name);
    char *text = NULL;
    size_t len = 0;
    int rc = splash_read_file(path, &text, &len, err);
    if (rc) {
        free(path);
        return rc;
    }
    char jerr[256];
    json_value *idx = json_parse(text, len, 16, jerr, sizeof jerr);
    free(text);
    if (!idx) {
        rc = splash_fail(err, SPLASH_E_FORMAT, "%s: not JSON: %s", path, jerr);
        free(path);
        return rc;
    }
    json_value *wm = json_get(idx, "weight_map");
    if (!wm || wm->type != JSON_OBJECT) {
        json_free(idx);
        rc = splash_fail(err, SPLASH_E_FORMAT, "%s: no \"weight_map\" object", path);
        free(path);
        return rc;
    }
    /* unique file names, in order of first appearance */
    for (size_t i = 0; i < wm->count; i++) {
        const char *fn = json_string(wm->items[i]);
        if (!fn || !*fn || fn[0] == '/' || strstr(fn, "..")) {
            rc = splash_fail(err, SPLASH_E_FORMAT, "%s: tensor %s: bad file name in weight_map", path, wm->keys[i]);
            json_free(idx);
            free(path);
            return rc;
        }
        char *full = splash_path_join(dir, fn);
        int seen = 0;
        for (size_t k = 0; k < st->n_files && !seen; k++) seen = !strcmp(st->files[k].path, full);
        if (seen) free(full);
        else add_file(st, full);
    }
    free(path);
    *map_out = idx;
    return SPLASH_OK;
}

int splash_st_open(const char *path, splash_st **out, splash_error *err) {
    *out = NULL;
    splash_st *st = xcalloc(1, sizeof *st);
    json_value *index = NULL;
    char *index_name = NULL;
    int rc = SPLASH_OK;
    if (splash_is_dir(path)) {
        char **names = NULL;
        size_t n = 0;
        rc = scan_dir(path, &names, &n, &index_name, err);
        if (!rc && index_name) {
            rc = open_index(st, path, index_name, &index, err);
            for (size_t i = 0; i < n; i++) free(names[i]);
        } else if (!rc) {
            for (size_t i = 0; i < n; i++) add_file(st, splash_path_join(path, names[i])), free(names[i]);
            if (!n) rc = splash_fail(err, SPLASH_E_NOTFOUND, "%s: no *.safetensors files", path);
        }
        free(names);
    } else if (splash_is_file(path)) {
        add_file(st, xstrdup(path));
    } else {
        rc = splash_fail(err, SPLASH_E_NOTFOUND, "%s: no such file or directory", path);
    }
    for (size_t i = 0; !rc && i < st->n_files; i++) rc = parse_file(st, &st->files[i], err);
    if (!rc) {
        splash_name_index_init(&st->by_name, st->n_tensors, tensor_name_at, st->tensors);
        for (size_t i = 0; i < st->n_tensors && !rc; i++) {
            long j = splash_name_index_add(&st->by_name, i);
            if (j >= 0)
                rc = splash_fail(err, SPLASH_E_FORMAT, "tensor %s is in both %s and %s", st->tensors[i].name,
                                 st->tensors[j].file, st->tensors[i].file);
        }
    }
    if (!rc && index) {
        json_value *wm = json_get(index, "weight_map");
        for (size_t i = 0; i < wm->count && !rc; i++) {
            const splash_st_tensor *t = splash_st_find(st, wm->keys[i]);
            char *want = splash_path_join(path, json_string(wm->items[i]));
            if (!t || strcmp(t->file, want))
                rc = splash_fail(err, SPLASH_E_NOTFOUND, "%s/%s lists tensor %s in %s, but %s", path, index_name,
                                 wm->keys[i], want, t ? "another file holds it" : "that file has no such tensor");
            free(want);
        }
    }
    json_free(index);
    free(index_name);
    if (rc) {
        splash_st_close(st);
        return rc;
    }
    *out = st;
    return SPLASH_OK;
}

void splash_st_close(splash_st *st) {
    if (!st) return;
    for (size_t i = 0; i < st->n_files; i++) {
        splash_unmap(&st->files[i].map);
        json_free(st->files[i].header);
        free(st->files[i].path);
    }
    free(st->files);
    free(st->tensors);
    splash_name_index_free(&st->by_name);
    free(st);
}

size_t splash_st_count(const splash_st *st) { return st->n_tensors; }
const splash_st_tensor *splash_st_at(const splash_st *st, size_t i) { return i < st->n_tensors ? &st->tensors[i] : NULL; }
size_t splash_st_file_count(const splash_st *st) { return st->n_files; }
const char *splash_st_file_path(const splash_st *st, size_t i) { return i < st->n_files ? st->files[i].path : NULL; }

int splash_st_read_f32(const splash_st_tensor *t, size_t first, size_t n, float *out) {
    size_t total = (size_t)splash_st_numel(t);
    if (first > total || n > total - first) return -1;
    const uint8_t *p = t->data + first * dtypes[t->dtype].size;
    switch (t->dtype) {
    case SPLASH_ST_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = splash_bf16_to_f32(h);
        }
        return 0;
    case SPLASH_ST_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = splash_f16_to_f32(h);
        }
        return 0;
    case SPLASH_ST_F32: memcpy(out, p, n * 4); return 0;
    case SPLASH_ST_F64:
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + 8 * i, 8);
            out[i] = (float)d;
        }
        return 0;
    default: return -1;
    }
}
