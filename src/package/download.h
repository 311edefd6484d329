/* download.h - from a model name to a verified package directory.
 *
 * `splash serve --model NAME` and `splash pull NAME` call splash_model_resolve.
 * A path to an existing directory is used as it is.  A name (OWNER/REPO or
 * OWNER/REPO@REVISION, see model_ref.h) is fetched from a Hugging Face-style
 * server into the cache directory
 *
 *   {cache}/models/OWNER--REPO/REVISION/
 *     manifest.json          the manifest the directory is being filled against
 *     target/layer-0.bin ... each renamed into place only once its size and
 *                            SHA-256 match the manifest
 *     FILE.partial           an unfinished download, resumed with HTTP Range
 *     .verified              the manifest's SHA-256, written when every listed
 *                            file has checked out: the cache is then used
 *                            without touching the network
 *     .lock                  flock()ed while downloading, so two processes do
 *                            not fetch the same model at once
 *
 * Only the files the manifest lists are fetched; a corrupt file is fetched
 * once more, then the call fails naming the file and both hashes.  Progress
 * goes to stderr: a bar (bytes, percent, MB/s, ETA) on a terminal, plain
 * lines otherwise.  Docs: docs/download.md.
 *
 * Environment: SPLASH_MODEL_BASE_URL (default https://huggingface.co),
 * SPLASH_CACHE_DIR (default $XDG_CACHE_HOME/splash or ~/.cache/splash),
 * SPLASH_DOWNLOAD_RETRIES (automatic resumes of a failed transfer, default 3),
 * SPLASH_DOWNLOAD_STALL_S (abort a transfer below 1 KiB/s for this many
 * seconds, default 60).
 */
#ifndef SPLASH_DOWNLOAD_H
#define SPLASH_DOWNLOAD_H

#include "base/status.h"

typedef struct splash_download_options {
    int offline;           /* never touch the network: the cache must be complete */
    int quiet;             /* no progress or status lines on stderr */
    int progress;          /* 0: a bar when stderr is a TTY, else plain lines;
                              1: always the bar; -1: always plain lines */
    const char *base_url;  /* NULL: $SPLASH_MODEL_BASE_URL or the default */
    const char *cache_dir; /* NULL: $SPLASH_CACHE_DIR or the default */
} splash_download_options;

/* Resolves name_or_path to a package directory (*package_dir: free() it).
 * opt may be NULL (defaults).  Errors name the model, the URL or the file:
 * SPLASH_E_NOTFOUND (no such directory, model or file on the server, or not
 * cached under offline), SPLASH_E_MISMATCH (a file failed its hash twice),
 * SPLASH_E_IO (network or disk), SPLASH_E_INVALID (bad name or URL),
 * SPLASH_E_FORMAT (the server's manifest is not a Splash manifest). */
int splash_model_resolve(const char *name_or_path, const splash_download_options *opt, char **package_dir,
                         splash_error *err);

#endif
