/* launch.h - the agent launchers: `splash claude|codex|opencode|hermes`.
 *
 * A launcher points an installed coding agent at the running Splash server and
 * replaces itself with it (exec), so the agent owns the terminal, its exit code
 * and its signals.  The part shared by all four lives in launch.c: find the
 * server (SPLASH_PORT, default 8000, on 127.0.0.1), ask it which model it
 * serves and with how much context (GET /status and /v1/models, the first
 * model must be owned_by "splash" so a different server on the port is not
 * mistaken for ours), find the client on PATH, print the Starting line, exec.
 * What differs per client (environment, generated config, arguments) lives in
 * one file each: claude.c, codex.c, opencode.c, hermes.c.
 *
 * The flow is split so each client file reads as "probe, configure, exec":
 *
 *     splash_launch l;
 *     if (splash_launch_begin(&l, "claude", URL)) return 1;  // message printed
 *     ...setenv / build argv...
 *     return splash_launch_exec(&l, argv);                    // returns only on failure
 */
#ifndef SPLASH_LAUNCH_H
#define SPLASH_LAUNCH_H

#include <stdint.h>

#include "base/status.h"

/* Sent as the API key when the server has none: clients that insist on a
 * non-empty key get one, and a keyless server ignores it. */
#define SPLASH_LAUNCH_PLACEHOLDER_KEY "splash-local"

typedef struct splash_launch {
    const char *client;      /* the executable's name, e.g. "claude" */
    const char *install_url; /* where to get it, for the not-installed message */
    char *client_path;       /* the client found on PATH (owned) */
    int port;                /* SPLASH_PORT or 8000 */
    char origin[64];         /* "http://127.0.0.1:PORT" (no trailing slash) */
    char v1[72];             /* origin + "/v1" */
    const char *api_key;     /* SPLASH_API_KEY, or NULL when unset or empty */
    char *model;             /* id of the first /v1/models entry (owned) */
    int64_t context;         /* /status maximum_context_tokens */
} splash_launch;

/* The port from SPLASH_PORT (1..65535), else 8000.  A malformed value is an
 * error so that a typo does not silently talk to another port. */
int splash_launch_port(int *port, splash_error *err);

/* Asks the server at l->origin for its model and context (GET /status and
 * GET /v1/models, with the API key as a bearer token when set). */
int splash_launch_probe(splash_launch *l, splash_error *err);

/* The full path of an executable named name on $PATH, or NULL (free() it). */
char *splash_launch_which(const char *name);

/* Fills l (port, key, probe, client on PATH; a missing client is tolerated
 * under SPLASH_LAUNCH_DRY_RUN, client_path NULL).  On failure prints the message
 * for people on stderr, frees what it took, and returns 1 (the exit code). */
int splash_launch_begin(splash_launch *l, const char *client, const char *install_url);

/* The API key to hand to a client: SPLASH_API_KEY or the placeholder. */
const char *splash_launch_key(const splash_launch *l);

/* The output-token cap the generated configs use: min(32768, context / 4). */
int64_t splash_launch_max_output(const splash_launch *l);

/* Sets (value non-NULL) or unsets (value NULL) one environment variable for
 * the client; 0 or 1 with the message printed. */
int splash_launch_setenv(const char *name, const char *value);

/* Prints "Starting <client>: <model> · <N> context tokens" and execs
 * l->client_path with argv (argv[0] is replaced by the client's name; argv is
 * NULL-terminated).  Returns only on failure: 1, with the message printed;
 * or, with SPLASH_LAUNCH_DRY_RUN=1, after printing what it would run as JSON
 * on stdout (path, argv, the variables set through splash_launch_setenv): 0. */
int splash_launch_exec(splash_launch *l, char **argv);

/* Frees what l owns (only needed when a launcher gives up before exec). */
void splash_launch_free(splash_launch *l);

/* argv for exec: the client's name, then the n fixed arguments, then the
 * user's arguments (user_argc of them), NULL-terminated (free() the array,
 * not the strings). */
char **splash_launch_argv(const char *client, const char *const *fixed, int n, int user_argc, char **user_argv);

#endif
