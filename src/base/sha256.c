#include "sha256.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"

struct splash_sha256 {
    EVP_MD_CTX *ctx;
};

splash_sha256 *splash_sha256_new(void) {
    splash_sha256 *h = xcalloc(1, sizeof *h);
    h->ctx = EVP_MD_CTX_new();
    if (!h->ctx || EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL) != 1) {
        fprintf(stderr, "splash: libcrypto could not start SHA-256\n");
        abort();
    }
    return h;
}

void splash_sha256_update(splash_sha256 *h, const void *data, size_t n) { EVP_DigestUpdate(h->ctx, data, n); }

void splash_sha256_finish(splash_sha256 *h, char hex[65]) {
    unsigned char md[32];
    unsigned int len = 0;
    EVP_DigestFinal_ex(h->ctx, md, &len);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    EVP_MD_CTX_free(h->ctx);
    free(h);
}

void splash_sha256_hex(const void *data, size_t n, char hex[65]) {
    splash_sha256 *h = splash_sha256_new();
    splash_sha256_update(h, data, n);
    splash_sha256_finish(h, hex);
}

int splash_sha256_file(const char *path, char hex[65], splash_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return splash_fail(err, SPLASH_E_IO, "%s: %s", path, strerror(errno));
    splash_sha256 *h = splash_sha256_new();
    size_t cap = 1 << 20;
    unsigned char *buf = xmalloc(cap);
    size_t n;
    while ((n = fread(buf, 1, cap, f)) > 0) splash_sha256_update(h, buf, n);
    int bad = ferror(f);
    fclose(f);
    free(buf);
    splash_sha256_finish(h, hex);
    if (bad) return splash_fail(err, SPLASH_E_IO, "%s: read failed", path);
    return SPLASH_OK;
}
