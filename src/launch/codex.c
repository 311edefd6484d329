/* codex.c - `splash codex [ARGS...]`: OpenAI Codex CLI on the local server.
 *
 * Codex is configured with `-c key=value` overrides (values parsed as TOML)
 * rather than by editing ~/.codex/config.toml, so the user's own config is
 * left alone and the overrides last only for this run.  A provider "splash"
 * speaks the Responses API at .../v1 and reads its key from SPLASH_API_KEY,
 * which is set here (a placeholder when the server has no key, since Codex
 * refuses a provider whose env_key is unset).  Compaction starts at 90% of
 * the context; web_search is a hosted tool we do not have.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"
#include "commands.h"
#include "launch/launch.h"

#define CODEX_INSTALL_URL "https://github.com/openai/codex (npm install -g @openai/codex)"

/* A TOML basic string: the model id and URL come from the server. */
static void toml_string(strbuf *sb, const char *s) {
    sb_putc(sb, '"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') sb_printf(sb, "\\%c", c);
        else if (c < 0x20 || c == 0x7f) sb_printf(sb, "\\u%04x", c);
        else sb_putc(sb, (char)c);
    }
    sb_putc(sb, '"');
}

int splash_cmd_codex(int argc, char **argv) {
    splash_launch l;
    if (splash_launch_begin(&l, "codex", CODEX_INSTALL_URL)) return 1;
    if (splash_launch_setenv("SPLASH_API_KEY", splash_launch_key(&l))) {
        splash_launch_free(&l);
        return 1;
    }
    strbuf model, provider, window, compact;
    sb_init(&model);
    sb_init(&provider);
    sb_init(&window);
    sb_init(&compact);
    sb_puts(&model, "model=");
    toml_string(&model, l.model);
    sb_puts(&provider, "model_providers.splash={name=\"Splash\",base_url=");
    toml_string(&provider, l.v1);
    sb_puts(&provider, ",env_key=\"SPLASH_API_KEY\",wire_api=\"responses\"}");
    sb_printf(&window, "model_context_window=%lld", (long long)l.context);
    sb_printf(&compact, "model_auto_compact_token_limit=%lld", (long long)(l.context * 9 / 10));
    const char *fixed[] = {
        "-c", "model_provider=\"splash\"", "-c", sb_cstr(&provider), "-c", sb_cstr(&model),
        "-c", sb_cstr(&window),            "-c", sb_cstr(&compact),  "-c", "web_search=\"disabled\"",
    };
    char **av = splash_launch_argv("codex", fixed, (int)(sizeof fixed / sizeof fixed[0]), argc - 1, argv + 1);
    int rc = splash_launch_exec(&l, av);
    free(av);
    sb_free(&model);
    sb_free(&provider);
    sb_free(&window);
    sb_free(&compact);
    return rc;
}
