/* hermes.c - `splash hermes [ARGS...]`: Nous Research's Hermes Agent on the
 * local server.
 *
 * Hermes reads $HERMES_HOME/config.yaml (default ~/.hermes).  The launcher
 * gives it a private home under the Splash cache directory
 * ({cache}/hermes, mode 0700) and rewrites config.yaml there on every start,
 * so the user's own ~/.hermes is never edited and a stale port or model never
 * survives a restart.  The model section names a "custom" OpenAI-compatible
 * provider on Chat Completions at .../v1 with the served context and an
 * output cap of min(32768, context / 4).  The API key is not written to disk:
 * Hermes takes it from OPENAI_API_KEY, set here with OPENAI_BASE_URL.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fs.h"
#include "base/json.h"
#include "base/strbuf.h"
#include "commands.h"
#include "launch/launch.h"
#include "package/model_ref.h"

#define HERMES_INSTALL_URL "https://github.com/NousResearch/hermes-agent"

/* A YAML double-quoted scalar (JSON's escapes are valid YAML). */
static void yaml_string(strbuf *sb, const char *s) { json_write_string(sb, s, strlen(s), JSON_ASCII); }

static void hermes_config(strbuf *sb, const splash_launch *l) {
    sb_puts(sb, "# Written by `splash hermes` at every start: edits here are overwritten.\nmodel:\n  default: ");
    yaml_string(sb, l->model);
    sb_puts(sb, "\n  provider: \"custom\"\n  base_url: ");
    yaml_string(sb, l->v1);
    sb_printf(sb, "\n  api_mode: \"chat_completions\"\n  context_length: %lld\n  max_tokens: %lld\n",
              (long long)l->context, (long long)splash_launch_max_output(l));
}

/* {cache}/hermes, created 0700; *out: free() it. */
static int hermes_home(char **out, splash_error *err) {
    char *root = NULL;
    if (splash_model_cache_root(NULL, &root, err)) return err->code;
    char *home = splash_path_join(root, "hermes");
    free(root);
    if (splash_mkdirs(home, err) || chmod(home, 0700)) {
        if (!err->code) splash_fail(err, SPLASH_E_IO, "cannot create %s: %s", home, strerror(errno));
        free(home);
        return err->code;
    }
    *out = home;
    return SPLASH_OK;
}

static int write_private(const char *path, const strbuf *sb, splash_error *err) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return splash_fail(err, SPLASH_E_IO, "cannot write %s: %s", path, strerror(errno));
    ssize_t n = write(fd, sb->data, sb->len);
    int bad = n != (ssize_t)sb->len || close(fd);
    if (bad) return splash_fail(err, SPLASH_E_IO, "cannot write %s: %s", path, strerror(errno));
    return SPLASH_OK;
}

int splash_cmd_hermes(int argc, char **argv) {
    splash_launch l;
    if (splash_launch_begin(&l, "hermes", HERMES_INSTALL_URL)) return 1;
    splash_error err = {0};
    char *home = NULL, *path = NULL;
    strbuf sb;
    sb_init(&sb);
    int rc = 1;
    if (hermes_home(&home, &err)) goto fail;
    path = splash_path_join(home, "config.yaml");
    hermes_config(&sb, &l);
    if (write_private(path, &sb, &err)) goto fail;
    if (splash_launch_setenv("HERMES_HOME", home) || splash_launch_setenv("OPENAI_BASE_URL", l.v1) ||
        splash_launch_setenv("OPENAI_API_KEY", splash_launch_key(&l)))
        goto out;
    char **av = splash_launch_argv("hermes", NULL, 0, argc - 1, argv + 1);
    rc = splash_launch_exec(&l, av);
    free(av);
    goto out;
fail:
    fprintf(stderr, "splash hermes: %s\n", err.msg);
out:
    sb_free(&sb);
    free(home);
    free(path);
    splash_launch_free(&l);
    return rc;
}
