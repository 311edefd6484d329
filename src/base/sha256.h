/* sha256.h - SHA-256 through OpenSSL's libcrypto, as lowercase hex. */
#ifndef SPLASH_SHA256_H
#define SPLASH_SHA256_H

#include <stddef.h>

#include "status.h"

typedef struct splash_sha256 splash_sha256;

splash_sha256 *splash_sha256_new(void);
void splash_sha256_update(splash_sha256 *h, const void *data, size_t n);
/* Writes 64 hex digits and a NUL into hex[65] and frees h. */
void splash_sha256_finish(splash_sha256 *h, char hex[65]);

void splash_sha256_hex(const void *data, size_t n, char hex[65]);
int splash_sha256_file(const char *path, char hex[65], splash_error *err);

#endif
