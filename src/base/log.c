#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static int log_threshold(void) {
    static int level = -1;
    if (level < 0) {
        const char *s = getenv("SPLASH_LOG");
        level = SPLASH_LOG_INFO;
        if (s && !strcmp(s, "error")) level = SPLASH_LOG_ERROR;
        if (s && !strcmp(s, "warn")) level = SPLASH_LOG_WARN;
        if (s && !strcmp(s, "debug")) level = SPLASH_LOG_DEBUG;
    }
    return level;
}

void splash_log(int level, const char *fmt, ...) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    if (level > log_threshold()) return;
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&log_lock);
    fprintf(stderr, "splash %s: ", names[level]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    pthread_mutex_unlock(&log_lock);
    va_end(ap);
}

void splash_say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&log_lock);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    fflush(stderr);
    pthread_mutex_unlock(&log_lock);
    va_end(ap);
}
