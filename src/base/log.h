/* log.h - messages for people, on stderr.
 *
 * splash_say() prints a status line as-is (the start-up lines of `serve`);
 * splash_log() prints a leveled diagnostic, filtered by SPLASH_LOG
 * (error, warn, info, debug; default info).
 */
#ifndef SPLASH_LOG_H
#define SPLASH_LOG_H

enum { SPLASH_LOG_ERROR, SPLASH_LOG_WARN, SPLASH_LOG_INFO, SPLASH_LOG_DEBUG };

void splash_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void splash_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define LOG_ERROR(...) splash_log(SPLASH_LOG_ERROR, __VA_ARGS__)
#define LOG_WARN(...) splash_log(SPLASH_LOG_WARN, __VA_ARGS__)
#define LOG_INFO(...) splash_log(SPLASH_LOG_INFO, __VA_ARGS__)
#define LOG_DEBUG(...) splash_log(SPLASH_LOG_DEBUG, __VA_ARGS__)

#endif
