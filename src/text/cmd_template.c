/* cmd_template.c - `splash apply-template`: a chat request on stdin, the
 * prompt on stdout.
 *
 * The prompt is written exactly as rendered (no newline added) so that it can
 * be compared byte for byte with other renderers.  Exit codes: 0 rendered,
 * 1 the template raised an error (its message alone on the last stderr line)
 * or a file could not be read, 2 bad usage or a request that is not JSON.
 * The checkpoint's chat_template.jinja is only compared with the known
 * template: the rendering is always the native one, with a warning on stderr
 * when the checkpoint's template differs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fs.h"
#include "base/json.h"
#include "base/strbuf.h"
#include "commands.h"
#include "text/chat_template.h"

static const char usage_text[] =
    "usage: splash apply-template (--model PKG | --tokenizer-dir DIR) < request.json\n"
    "\n"
    "Reads a chat request {messages, tools?, add_generation_prompt?, enable_thinking?,\n"
    "preserve_thinking?, add_vision_id?} on stdin and prints the prompt the model sees,\n"
    "rendered natively as the Qwen3.5/3.6 chat template (byte-identical to Jinja).\n"
    "The checkpoint's template (PKG/tokenizer/chat_template.jinja, or DIR/chat_template.jinja)\n"
    "is compared with the known one; a different template gets a warning.\n"
    "Exit: 0 ok, 1 template error (message on stderr), 2 usage or bad JSON.\n";

static int read_stdin(strbuf *sb) {
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, stdin)) > 0) sb_append(sb, chunk, n);
    return ferror(stdin) || sb->oom ? -1 : 0;
}

int splash_cmd_apply_template(int argc, char **argv) {
    const char *model = NULL, *tokdir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage_text, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            model = argv[++i];
        } else if (!strcmp(argv[i], "--tokenizer-dir") && i + 1 < argc) {
            tokdir = argv[++i];
        } else {
            fprintf(stderr, "splash apply-template: unexpected argument '%s'\n\n%s", argv[i], usage_text);
            return 2;
        }
    }
    if (!model == !tokdir) {
        fprintf(stderr, "splash apply-template: give exactly one of --model or --tokenizer-dir\n\n%s", usage_text);
        return 2;
    }

    char *dir = model ? splash_path_join(model, "tokenizer") : strdup(tokdir);
    if (!dir || !splash_is_dir(dir)) {
        fprintf(stderr, "splash apply-template: %s is not a directory\n", dir ? dir : tokdir);
        free(dir);
        return 1;
    }
    splash_error err = {0};
    char *text = NULL;
    size_t len = 0;
    int rc = splash_chat_template_read_dir(dir, &text, &len, &err);
    if (rc == SPLASH_E_NOTFOUND) {
        fprintf(stderr, "splash apply-template: warning: %s; rendering with the built-in Qwen3.6 template\n", err.msg);
    } else if (rc) {
        fprintf(stderr, "splash apply-template: %s\n", err.msg);
        free(dir);
        return 1;
    } else {
        char desc[256];
        const char *what = splash_chat_template_identify(text, len, desc, sizeof desc);
        if (strcmp(what, "native"))
            fprintf(stderr,
                    "splash apply-template: warning: the chat template in %s is %s; rendering natively as Qwen3.6\n",
                    dir, what);
    }
    free(text);
    free(dir);

    strbuf in, out;
    sb_init(&in);
    sb_init(&out);
    if (read_stdin(&in)) {
        fprintf(stderr, "splash apply-template: could not read stdin\n");
        sb_free(&in);
        return 1;
    }
    char perr[160];
    json_value *req = json_parse(in.data ? in.data : "", in.len, JSON_DEFAULT_MAX_DEPTH, perr, sizeof perr);
    sb_free(&in);
    if (!req) {
        fprintf(stderr, "splash apply-template: the request on stdin is not JSON: %s\n", perr);
        return 2;
    }
    rc = splash_chat_template_render(req, &out, &err);
    json_free(req);
    if (rc == SPLASH_E_INVALID) {
        fprintf(stderr, "splash apply-template: %s\n", err.msg);
        sb_free(&out);
        return 2;
    }
    if (rc) {
        fprintf(stderr, "%s\n", err.msg);
        sb_free(&out);
        return 1;
    }
    int ok = fwrite(out.data ? out.data : "", 1, out.len, stdout) == out.len && fflush(stdout) == 0;
    sb_free(&out);
    if (!ok) {
        fprintf(stderr, "splash apply-template: could not write the prompt to stdout\n");
        return 1;
    }
    return 0;
}
