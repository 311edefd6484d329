/* fs.h - files: whole-file reads, writes, memory maps, directories. */
#ifndef SPLASH_FS_H
#define SPLASH_FS_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* Reads a whole file; *data is NUL-terminated (not counted in *len).
 * free() it. */
int splash_read_file(const char *path, char **data, size_t *len, splash_error *err);
int splash_write_file(const char *path, const void *data, size_t len, splash_error *err);

/* A read-only memory map of a whole file. */
typedef struct splash_map {
    const uint8_t *data;
    size_t size;
} splash_map;
int splash_map_file(const char *path, splash_map *map, splash_error *err);
void splash_unmap(splash_map *map);

int splash_mkdirs(const char *path, splash_error *err);   /* mkdir -p */
int splash_remove_tree(const char *path);                 /* rm -rf; 0 or -errno */
int splash_is_dir(const char *path);
int splash_is_file(const char *path);
int64_t splash_file_size(const char *path); /* -1 if missing */

/* "a" + "/" + "b" into a new string (free() it). */
char *splash_path_join(const char *a, const char *b);

#endif
