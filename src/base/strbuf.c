#include "strbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sb_init(strbuf *sb) { memset(sb, 0, sizeof *sb); }

void sb_free(strbuf *sb) {
    free(sb->data);
    memset(sb, 0, sizeof *sb);
}

void sb_clear(strbuf *sb) {
    sb->len = 0;
    if (sb->data) sb->data[0] = 0;
}

int sb_reserve(strbuf *sb, size_t extra) {
    if (sb->oom) return -1;
    size_t need = sb->len + extra + 1;
    if (need <= sb->cap) return 0;
    size_t cap = sb->cap ? sb->cap : 64;
    while (cap < need) cap *= 2;
    char *p = realloc(sb->data, cap);
    if (!p) {
        sb->oom = 1;
        return -1;
    }
    sb->data = p;
    sb->cap = cap;
    return 0;
}

void sb_append(strbuf *sb, const void *data, size_t n) {
    if (sb_reserve(sb, n)) return;
    if (n) memcpy(sb->data + sb->len, data, n);
    sb->len += n;
    sb->data[sb->len] = 0;
}

void sb_puts(strbuf *sb, const char *s) { sb_append(sb, s, strlen(s)); }

void sb_putc(strbuf *sb, char c) { sb_append(sb, &c, 1); }

void sb_vprintf(strbuf *sb, const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0 || sb_reserve(sb, (size_t)n)) return;
    vsnprintf(sb->data + sb->len, (size_t)n + 1, fmt, ap);
    sb->len += (size_t)n;
}

void sb_printf(strbuf *sb, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    sb_vprintf(sb, fmt, ap);
    va_end(ap);
}

const char *sb_cstr(strbuf *sb) { return sb->data ? sb->data : ""; }

char *sb_take(strbuf *sb, size_t *len) {
    if (!sb->data) sb_reserve(sb, 0);
    char *p = sb->data;
    if (len) *len = sb->len;
    memset(sb, 0, sizeof *sb);
    return p;
}
