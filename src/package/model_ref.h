/* model_ref.h - naming a model that is not on disk yet.
 *
 * A model name is OWNER/REPO, optionally OWNER/REPO@REVISION (a branch, tag or
 * commit; default "main").  It is looked up on a Hugging Face-style server
 *
 *   {base}/{owner}/{repo}/resolve/{revision}/{file}
 *
 * and cached in {cache}/models/OWNER--REPO/REVISION/.  The name rules follow
 * the Hub's (letters, digits, '.', '_', '-'; no "--" or ".."; no leading or
 * trailing '.' or '-'), which is also what keeps OWNER--REPO unambiguous and
 * every part safe to use as a directory name.  This file is pure string work
 * (no I/O beyond reading the environment), so it is unit-tested on its own.
 */
#ifndef SPLASH_MODEL_REF_H
#define SPLASH_MODEL_REF_H

#include "base/status.h"

#define SPLASH_MODEL_BASE_URL_DEFAULT "https://huggingface.co"
#define SPLASH_MODEL_REVISION_DEFAULT "main"

typedef struct splash_model_ref {
    char owner[97];
    char repo[97];
    char revision[129];
} splash_model_ref;

/* Parses "OWNER/REPO[@REVISION]".  Fails (SPLASH_E_INVALID) saying which part
 * is wrong and why. */
int splash_model_ref_parse(const char *name, splash_model_ref *ref, splash_error *err);

/* 1 when s is written like a file system path rather than a model name
 * (starts with '/', '.', '~', ends with '/', or has more than one '/'). */
int splash_model_looks_like_path(const char *s);

/* The server's base URL: override if non-NULL, else $SPLASH_MODEL_BASE_URL if
 * set and non-empty, else SPLASH_MODEL_BASE_URL_DEFAULT.  Only http:// and
 * https:// are accepted; trailing slashes are dropped.  *out: free() it. */
int splash_model_base_url(const char *override, char **out, splash_error *err);

/* The cache root: override, else $SPLASH_CACHE_DIR, else $XDG_CACHE_HOME/splash
 * (when absolute), else $HOME/.cache/splash.  *out: free() it. */
int splash_model_cache_root(const char *override, char **out, splash_error *err);

/* {root}/models/OWNER--REPO/REVISION (free() it). */
char *splash_model_cache_dir(const char *root, const splash_model_ref *ref);

/* {base}/OWNER/REPO/resolve/REVISION/{file}, each byte of file outside
 * [A-Za-z0-9._~/-] percent-encoded (free() it). */
char *splash_model_file_url(const char *base, const splash_model_ref *ref, const char *file);

#endif
