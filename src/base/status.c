#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int splash_fail(splash_error *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

void splash_error_prefix(splash_error *err, const char *fmt, ...) {
    if (!err) return;
    char prefix[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof err->msg - 3) n = sizeof err->msg - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t rest = sizeof err->msg - n - 3;
    size_t ol = strnlen(old, rest);
    memcpy(err->msg + n + 2, old, ol);
    err->msg[n + 2 + ol] = 0;
}

const char *splash_status_name(int code) {
    switch (code) {
    case SPLASH_OK: return "ok";
    case SPLASH_E_INVALID: return "invalid";
    case SPLASH_E_IO: return "io";
    case SPLASH_E_NOMEM: return "nomem";
    case SPLASH_E_FORMAT: return "format";
    case SPLASH_E_UNSUPPORTED: return "unsupported";
    case SPLASH_E_MISMATCH: return "mismatch";
    case SPLASH_E_NOTFOUND: return "notfound";
    case SPLASH_E_RANGE: return "range";
    case SPLASH_E_TEMPLATE: return "template";
    default: return "error";
    }
}
