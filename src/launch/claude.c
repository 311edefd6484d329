/* claude.c - `splash claude [ARGS...]`: Claude Code on the local server.
 *
 * Claude Code speaks Anthropic Messages to ANTHROPIC_BASE_URL (the origin, it
 * appends /v1/messages itself).  Every model alias it may pick on its own
 * (opus, sonnet, haiku, the small fast model for titles and summaries) is
 * pinned to the served model, and the context variables tell it when to
 * compact.  ANTHROPIC_API_KEY is removed so a key for the real API is never
 * sent here and never overrides the token; the two DISABLE variables keep it
 * from waiting on hosts a local session cannot reach (telemetry, updates).
 * WebSearch is a server-side tool of Anthropic's API, so it is disallowed.
 */
#include <stdio.h>
#include <stdlib.h>

#include "commands.h"
#include "launch/launch.h"

#define CLAUDE_INSTALL_URL "https://docs.anthropic.com/en/docs/claude-code/setup (npm install -g @anthropic-ai/claude-code)"

int splash_cmd_claude(int argc, char **argv) {
    splash_launch l;
    if (splash_launch_begin(&l, "claude", CLAUDE_INSTALL_URL)) return 1;
    char ctx[32];
    snprintf(ctx, sizeof ctx, "%lld", (long long)l.context);
    static const char *const model_vars[] = {
        "ANTHROPIC_MODEL",
        "ANTHROPIC_DEFAULT_OPUS_MODEL",
        "ANTHROPIC_DEFAULT_SONNET_MODEL",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL",
        "ANTHROPIC_SMALL_FAST_MODEL",
    };
    int bad = splash_launch_setenv("ANTHROPIC_BASE_URL", l.origin) ||
              splash_launch_setenv("ANTHROPIC_AUTH_TOKEN", splash_launch_key(&l)) ||
              splash_launch_setenv("ANTHROPIC_API_KEY", NULL) ||
              splash_launch_setenv("CLAUDE_CODE_MAX_CONTEXT_TOKENS", ctx) ||
              splash_launch_setenv("CLAUDE_CODE_AUTO_COMPACT_WINDOW", ctx) ||
              splash_launch_setenv("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1") ||
              splash_launch_setenv("DISABLE_AUTOUPDATER", "1");
    for (size_t i = 0; !bad && i < sizeof model_vars / sizeof model_vars[0]; i++)
        bad = splash_launch_setenv(model_vars[i], l.model);
    if (bad) {
        splash_launch_free(&l);
        return 1;
    }
    const char *fixed[] = {"--disallowedTools", "WebSearch", "--model", l.model};
    char **av = splash_launch_argv("claude", fixed, 4, argc - 1, argv + 1);
    int rc = splash_launch_exec(&l, av);
    free(av);
    return rc;
}
