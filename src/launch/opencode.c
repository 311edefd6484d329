/* opencode.c - `splash opencode [ARGS...]`: OpenCode on the local server.
 *
 * OpenCode merges OPENCODE_CONFIG_CONTENT (inline JSON) over the user's
 * config, so the launcher adds one provider, "splash", through the AI SDK's
 * OpenAI-compatible adapter (Chat Completions at .../v1), with the served
 * model's limits (output = min(32768, context / 4), input = the rest) and one
 * variant per reasoning effort the server accepts.  `model`, `small_model`
 * and every built-in agent are pinned to splash/MODEL so that no request
 * (titles, summaries, compaction, sub-agents) goes to a hosted provider.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/strbuf.h"
#include "commands.h"
#include "launch/launch.h"

#define OPENCODE_INSTALL_URL "https://opencode.ai/docs (npm install -g opencode-ai)"

/* OpenCode's built-in agents: primary, sub-agents, and the hidden ones. */
static const char *const agents[] = {"build", "plan", "general", "explore", "title", "summary", "compaction"};
static const char *const efforts[] = {"none", "low", "medium", "high"};

static json_value *obj(void) { return json_new(JSON_OBJECT); }

/* The OPENCODE_CONFIG_CONTENT document (free with json_free). */
static json_value *opencode_config(const splash_launch *l) {
    char ref[600];
    snprintf(ref, sizeof ref, "splash/%s", l->model);
    int64_t out = splash_launch_max_output(l);

    json_value *limit = obj();
    json_obj_set(limit, "context", json_new_int(l->context));
    json_obj_set(limit, "input", json_new_int(l->context - out));
    json_obj_set(limit, "output", json_new_int(out));
    json_value *variants = obj();
    for (size_t i = 0; i < sizeof efforts / sizeof efforts[0]; i++) {
        json_value *v = obj();
        json_obj_set(v, "reasoningEffort", json_new_string(efforts[i]));
        json_obj_set(variants, efforts[i], v);
    }
    json_value *model = obj();
    json_obj_set(model, "name", json_new_string(l->model));
    json_obj_set(model, "reasoning", json_new_bool(1));
    json_obj_set(model, "tool_call", json_new_bool(1));
    json_obj_set(model, "limit", limit);
    json_obj_set(model, "variants", variants);
    json_value *models = obj();
    json_obj_set(models, l->model, model);

    json_value *options = obj();
    json_obj_set(options, "baseURL", json_new_string(l->v1));
    json_obj_set(options, "apiKey", json_new_string(splash_launch_key(l)));
    json_value *splash = obj();
    json_obj_set(splash, "npm", json_new_string("@ai-sdk/openai-compatible"));
    json_obj_set(splash, "name", json_new_string("Splash"));
    json_obj_set(splash, "options", options);
    json_obj_set(splash, "models", models);
    json_value *provider = obj();
    json_obj_set(provider, "splash", splash);

    json_value *agent = obj();
    for (size_t i = 0; i < sizeof agents / sizeof agents[0]; i++) {
        json_value *a = obj();
        json_obj_set(a, "model", json_new_string(ref));
        json_obj_set(agent, agents[i], a);
    }

    json_value *root = obj();
    json_obj_set(root, "$schema", json_new_string("https://opencode.ai/config.json"));
    json_obj_set(root, "provider", provider);
    json_obj_set(root, "model", json_new_string(ref));
    json_obj_set(root, "small_model", json_new_string(ref));
    json_obj_set(root, "agent", agent);
    return root;
}

int splash_cmd_opencode(int argc, char **argv) {
    splash_launch l;
    if (splash_launch_begin(&l, "opencode", OPENCODE_INSTALL_URL)) return 1;
    json_value *cfg = opencode_config(&l);
    strbuf sb;
    sb_init(&sb);
    json_write(&sb, cfg, JSON_COMPACT);
    json_free(cfg);
    if (splash_launch_setenv("OPENCODE_CONFIG_CONTENT", sb_cstr(&sb))) {
        sb_free(&sb);
        splash_launch_free(&l);
        return 1;
    }
    sb_free(&sb);
    char **av = splash_launch_argv("opencode", NULL, 0, argc - 1, argv + 1);
    int rc = splash_launch_exec(&l, av);
    free(av);
    return rc;
}
