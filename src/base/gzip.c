/* gzip.c - see gzip.h. */
#include "base/gzip.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "base/fs.h"

int splash_gzip(const void *data, size_t len, char **out, size_t *out_len, splash_error *err) {
    *out = NULL;
    *out_len = 0;
    z_stream z;
    memset(&z, 0, sizeof z);
    /* windowBits 15 + 16: a gzip wrapper with zlib's default header (mtime 0, OS 255 = unknown) */
    if (deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY) != Z_OK)
        return splash_fail(err, SPLASH_E_NOMEM, "gzip: deflateInit2 failed");
    size_t cap = deflateBound(&z, (uLong)len) + 32;
    char *buf = malloc(cap);
    if (!buf) {
        deflateEnd(&z);
        return splash_fail(err, SPLASH_E_NOMEM, "gzip: out of memory for %zu bytes", cap);
    }
    z.next_in = (Bytef *)(uintptr_t)data;
    z.avail_in = (uInt)len;
    z.next_out = (Bytef *)buf;
    z.avail_out = (uInt)cap;
    int rc = deflate(&z, Z_FINISH);
    size_t n = cap - z.avail_out;
    deflateEnd(&z);
    if (rc != Z_STREAM_END || len > (size_t)(uInt)-1) {
        free(buf);
        return splash_fail(err, SPLASH_E_IO, "gzip: deflate did not finish (%d)", rc);
    }
    *out = buf;
    *out_len = n;
    return SPLASH_OK;
}

int splash_gunzip(const void *data, size_t len, char **out, size_t *out_len, splash_error *err) {
    *out = NULL;
    *out_len = 0;
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 15 + 16) != Z_OK) return splash_fail(err, SPLASH_E_NOMEM, "gunzip: inflateInit2 failed");
    z.next_in = (Bytef *)(uintptr_t)data;
    z.avail_in = (uInt)len;
    size_t cap = len * 4 + 1024, n = 0;
    char *buf = NULL;
    int rc = Z_OK;
    while (rc == Z_OK) {
        if (!buf || n == cap) {
            if (buf) cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                inflateEnd(&z);
                return splash_fail(err, SPLASH_E_NOMEM, "gunzip: out of memory for %zu bytes", cap);
            }
            buf = nb;
        }
        z.next_out = (Bytef *)buf + n;
        z.avail_out = (uInt)(cap - n);
        rc = inflate(&z, Z_NO_FLUSH);
        n = cap - z.avail_out;
        if (rc == Z_BUF_ERROR && z.avail_out) break; /* input ended before the stream did */
        if (rc == Z_BUF_ERROR) rc = Z_OK;                /* only out of room: grow and go on */
    }
    int complete = rc == Z_STREAM_END && z.avail_in == 0;
    inflateEnd(&z);
    if (!complete) {
        free(buf);
        return splash_fail(err, SPLASH_E_FORMAT, "gunzip: not one complete gzip member (%s)",
                           rc == Z_STREAM_END ? "bytes after its end" : rc == Z_DATA_ERROR ? "corrupt data" : "truncated");
    }
    buf[n] = 0;
    *out = buf;
    *out_len = n;
    return SPLASH_OK;
}

/* Reads a gzip file whole and decompresses it; errors name the file. */
static int read_gz(const char *gz, char **data, size_t *len, splash_error *err) {
    char *raw = NULL;
    size_t rl = 0, n = 0;
    int rc = splash_read_file(gz, &raw, &rl, err);
    if (!rc) {
        splash_error e2 = {0};
        rc = splash_gunzip(raw, rl, data, &n, &e2);
        if (rc) splash_fail(err, rc, "%s: %s", gz, e2.msg);
        else if (len) *len = n;
    }
    free(raw);
    return rc;
}

int splash_read_file_or_gz(const char *path, char **data, size_t *len, splash_error *err) {
    size_t pl = strlen(path);
    if (pl > 3 && !strcmp(path + pl - 3, ".gz")) return read_gz(path, data, len, err);
    if (splash_is_file(path)) return splash_read_file(path, data, len, err);
    char *gz = malloc(pl + 4);
    if (!gz) return splash_fail(err, SPLASH_E_NOMEM, "out of memory");
    memcpy(gz, path, pl);
    memcpy(gz + pl, ".gz", 4);
    int rc = splash_is_file(gz) ? read_gz(gz, data, len, err)
                                : splash_read_file(path, data, len, err); /* neither: the error names path */
    free(gz);
    return rc;
}
