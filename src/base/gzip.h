/* gzip.h - gzip members in memory (zlib), for package files stored
 * compressed (tokenizer/tokenizer.json.gz: 11.4 MB of Qwen3 tokenizer JSON
 * is 2.1 MB gzipped).
 *
 * splash_gzip writes one member with a fixed header (mtime 0, no name, OS
 * unknown), so the same input always gives the same bytes: packages stay
 * byte-reproducible.  splash_gunzip accepts any single-member gzip file and
 * checks its CRC and length (zlib does). */
#ifndef SPLASH_GZIP_H
#define SPLASH_GZIP_H

#include <stddef.h>

#include "base/status.h"

int splash_gzip(const void *data, size_t len, char **out, size_t *out_len, splash_error *err);
/* *out is NUL-terminated (not counted in *out_len), so text can be used as a string. */
int splash_gunzip(const void *data, size_t len, char **out, size_t *out_len, splash_error *err);

/* Reads path; a path ending in ".gz" is decompressed, and when path does not
 * exist, path + ".gz" is read and decompressed instead. */
int splash_read_file_or_gz(const char *path, char **data, size_t *len, splash_error *err);

#endif
