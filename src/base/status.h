/* status.h - one error convention for all of Splash.
 *
 * Functions that can fail return int: 0 (SPLASH_OK) on success, a negative
 * SPLASH_E_* code on failure.  Where a caller needs to tell a person what went
 * wrong, the function also takes a `splash_error *` and writes one sentence
 * into it (naming the file, tensor, field... that failed).  Library code never
 * exits on bad input; only main() and start-up code decide to exit.
 */
#ifndef SPLASH_STATUS_H
#define SPLASH_STATUS_H

#include <stddef.h>

enum {
    SPLASH_OK = 0,
    SPLASH_E_INVALID = -1,     /* bad argument or bad input data */
    SPLASH_E_IO = -2,          /* a file or socket operation failed */
    SPLASH_E_NOMEM = -3,       /* an allocation failed */
    SPLASH_E_FORMAT = -4,      /* a file is not in the expected format */
    SPLASH_E_UNSUPPORTED = -5, /* valid, but not something Splash does */
    SPLASH_E_MISMATCH = -6,    /* two things that must agree do not */
    SPLASH_E_NOTFOUND = -7,    /* a named thing does not exist */
    SPLASH_E_RANGE = -8,       /* a value or size is out of its limits */
    SPLASH_E_TEMPLATE = -9,    /* the chat template raised an error */
};

typedef struct splash_error {
    int code;
    char msg[1024];
} splash_error;

/* Records code and a printf-style message in err (which may be NULL) and
 * returns code, so that `return splash_fail(err, SPLASH_E_IO, "...")` reads
 * naturally.  If err already holds a message, the new one replaces it. */
int splash_fail(splash_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes the message already in err with "<context>: ". */
void splash_error_prefix(splash_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

const char *splash_status_name(int code);

#endif
