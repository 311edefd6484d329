/* default_model.c - finding the default package (default_model.h). */
#include "package/default_model.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


static int has_manifest(const char *dir) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/manifest.json", dir) >= (int)sizeof path) return 0;
    return access(path, R_OK) == 0;
}

int splash_default_model_dir(char **out, splash_error *err) {
    *out = NULL;
    const char *env = getenv("SPLASH_DEFAULT_MODEL");
    if (env && *env) {
        if (has_manifest(env)) {
            *out = strdup(env);
            return *out ? 0 : splash_fail(err, SPLASH_E_NOMEM, "out of memory");
        }
        return splash_fail(err, SPLASH_E_NOTFOUND, "SPLASH_DEFAULT_MODEL=%s holds no package (no manifest.json)", env);
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return splash_fail(err, SPLASH_E_NOTFOUND, "cannot find the executable's directory; pass --model PKG");
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    static const char *const rel[] = {"../models/" SPLASH_DEFAULT_MODEL_NAME,
                                      "../share/splash/models/" SPLASH_DEFAULT_MODEL_NAME};
    char tried[2][PATH_MAX + 64];
    for (int i = 0; i < 2; i++) {
        char dir[PATH_MAX + 64];
        snprintf(dir, sizeof dir, "%s/%s", exe, rel[i]);
        char *real = realpath(dir, NULL);
        snprintf(tried[i], sizeof tried[i], "%s", real ? real : dir);
        if (real && has_manifest(real)) {
            *out = real;
            return 0;
        }
        free(real);
    }
    return splash_fail(err, SPLASH_E_NOTFOUND, "no default model at %s or %s; pass --model PKG or set SPLASH_DEFAULT_MODEL",
                       tried[0], tried[1]);
}
