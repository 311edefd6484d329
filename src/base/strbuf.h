/* strbuf.h - a growable byte buffer, always NUL-terminated.
 *
 * Used for building JSON, prompts, HTTP bodies.  Appends never fail: on
 * out-of-memory they set `oom` and drop the data, and the owner checks `oom`
 * once at the end (so request paths can report SPLASH_E_NOMEM instead of
 * aborting).
 */
#ifndef SPLASH_STRBUF_H
#define SPLASH_STRBUF_H

#include <stdarg.h>
#include <stddef.h>

typedef struct strbuf {
    char *data; /* NUL-terminated when len > 0 or after sb_cstr() */
    size_t len;
    size_t cap;
    int oom;
} strbuf;

void sb_init(strbuf *sb);
void sb_free(strbuf *sb);
void sb_clear(strbuf *sb);
int sb_reserve(strbuf *sb, size_t extra);
void sb_append(strbuf *sb, const void *data, size_t n);
void sb_puts(strbuf *sb, const char *s);
void sb_putc(strbuf *sb, char c);
void sb_printf(strbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_vprintf(strbuf *sb, const char *fmt, va_list ap);
/* Returns the contents as a C string ("" for an empty buffer). */
const char *sb_cstr(strbuf *sb);
/* Hands the buffer to the caller (free() it); the strbuf is left empty. */
char *sb_take(strbuf *sb, size_t *len);

#endif
