/* cmd_pull.c - `splash pull NAME [--offline]`: resolve a model name (or a
 * package directory) the way `splash serve --model` does, downloading and
 * verifying what is missing, and print the package directory on stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "package/download.h"

static void pull_usage(FILE *f) {
    fprintf(f, "usage: splash pull OWNER/REPO[@REVISION]|PKG_DIR [--offline] [--quiet] [--progress bar|lines]\n"
               "\n"
               "Downloads a Splash package into the cache, verifies the size and SHA-256 of\n"
               "every file against its manifest, and prints the package directory.  A model\n"
               "already verified in the cache is used without touching the network.\n"
               "  --offline   never use the network; fail unless the cache is complete\n"
               "  --quiet     no progress on stderr\n"
               "  --progress  bar (default on a terminal) or lines\n"
               "Environment: SPLASH_MODEL_BASE_URL (default https://huggingface.co),\n"
               "SPLASH_CACHE_DIR (default $XDG_CACHE_HOME/splash or ~/.cache/splash).\n");
}

int splash_cmd_pull(int argc, char **argv) {
    splash_download_options opt = {0};
    const char *name = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            pull_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--offline")) {
            opt.offline = 1;
        } else if (!strcmp(a, "--quiet")) {
            opt.quiet = 1;
        } else if (!strcmp(a, "--progress") && i + 1 < argc &&
                   (!strcmp(argv[i + 1], "bar") || !strcmp(argv[i + 1], "lines"))) {
            opt.progress = !strcmp(argv[++i], "bar") ? 1 : -1;
        } else if (a[0] == '-' || name) {
            fprintf(stderr, "splash pull: unexpected argument %s\n\n", a);
            pull_usage(stderr);
            return 2;
        } else {
            name = a;
        }
    }
    if (!name) {
        pull_usage(stderr);
        return 2;
    }
    char *dir = NULL;
    splash_error err = {0};
    if (splash_model_resolve(name, &opt, &dir, &err)) {
        fprintf(stderr, "splash pull: %s\n", err.msg);
        return 1;
    }
    printf("%s\n", dir);
    free(dir);
    return 0;
}
