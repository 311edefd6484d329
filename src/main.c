/* main.c - the `splash` binary: one dispatch table of subcommands. */
#include <stdio.h>
#include <string.h>

#include "commands.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"pack", splash_cmd_pack, "turn a Hugging Face checkpoint into a Splash package"},
    {"verify", splash_cmd_verify, "re-hash every file of a package against its manifest"},
    {"pull", splash_cmd_pull, "download and verify a model into the cache, print its directory"},
    {"eval", splash_cmd_eval, "run a token sequence through a model, print perplexity, dump logits"},
    {"bench", splash_cmd_bench, "model speed: prefill, decode, verify blocks; synthetic 27B / 35B-A3B packages"},
    {"tokenize", splash_cmd_tokenize, "text on stdin to token ids"},
    {"detokenize", splash_cmd_detokenize, "token ids on stdin to text"},
    {"apply-template", splash_cmd_apply_template, "render a chat request (JSON on stdin) to the prompt"},
    {"serve", splash_cmd_serve, "the OpenAI-compatible HTTP server"},
    {"claude", splash_cmd_claude, "start Claude Code on the running server (arguments pass through)"},
    {"codex", splash_cmd_codex, "start OpenAI Codex CLI on the running server (arguments pass through)"},
    {"opencode", splash_cmd_opencode, "start OpenCode on the running server (arguments pass through)"},
    {"hermes", splash_cmd_hermes, "start Hermes Agent on the running server (arguments pass through)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: splash <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-16s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n`splash <command> --help` describes a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "splash: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
