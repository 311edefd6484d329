#include "fs.h"


#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mem.h"

int splash_read_file(const char *path, char **data, size_t *len, splash_error *err) {
    *data = NULL;
    if (len) *len = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return splash_fail(err, SPLASH_E_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return splash_fail(err, SPLASH_E_IO, "%s: not a regular file", path);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return splash_fail(err, SPLASH_E_NOMEM, "%s: out of memory reading %zu bytes", path, n);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            free(buf);
            close(fd);
            return splash_fail(err, SPLASH_E_IO, "%s: read failed: %s", path, r < 0 ? strerror(errno) : "short read");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *data = buf;
    if (len) *len = n;
    return SPLASH_OK;
}

int splash_write_file(const char *path, const void *data, size_t len, splash_error *err) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return splash_fail(err, SPLASH_E_IO, "%s: %s", path, strerror(errno));
    const char *p = data;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            int e = errno;
            close(fd);
            return splash_fail(err, SPLASH_E_IO, "%s: write failed: %s", path, strerror(e));
        }
        p += w;
        len -= (size_t)w;
    }
    if (close(fd) != 0) return splash_fail(err, SPLASH_E_IO, "%s: close failed: %s", path, strerror(errno));
    return SPLASH_OK;
}

int splash_map_file(const char *path, splash_map *map, splash_error *err) {
    map->data = NULL;
    map->size = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return splash_fail(err, SPLASH_E_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return splash_fail(err, SPLASH_E_IO, "%s: %s", path, strerror(errno));
    }
    if (st.st_size == 0) { /* mmap of 0 bytes fails; an empty map is valid */
        close(fd);
        return SPLASH_OK;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return splash_fail(err, SPLASH_E_IO, "%s: mmap failed: %s", path, strerror(errno));
    map->data = p;
    map->size = (size_t)st.st_size;
    return SPLASH_OK;
}

void splash_unmap(splash_map *map) {
    if (map->data && map->size) munmap((void *)map->data, map->size);
    map->data = NULL;
    map->size = 0;
}

int splash_mkdirs(const char *path, splash_error *err) {
    char *p = xstrdup(path);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            int e = errno;
            free(p);
            return splash_fail(err, SPLASH_E_IO, "%s: mkdir failed: %s", path, strerror(e));
        }
        *s = '/';
    }
    int rc = SPLASH_OK;
    if (mkdir(p, 0755) != 0 && errno != EEXIST) rc = splash_fail(err, SPLASH_E_IO, "%s: mkdir failed: %s", path, strerror(errno));
    free(p);
    return rc;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path) == 0 ? 0 : -errno;
}

int splash_remove_tree(const char *path) {
    if (!splash_is_dir(path)) return remove(path) == 0 || errno == ENOENT ? 0 : -errno;
    return nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

int splash_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int splash_is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int64_t splash_file_size(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    return (int64_t)st.st_size;
}

char *splash_path_join(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    int slash = la > 0 && a[la - 1] != '/';
    char *p = xmalloc(la + lb + 2);
    memcpy(p, a, la);
    if (slash) p[la] = '/';
    memcpy(p + la + slash, b, lb + 1);
    return p;
}
