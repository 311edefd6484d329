/* commands.h - the subcommands of the `splash` binary.
 *
 * Each subcommand lives beside the module it drives and takes the arguments
 * after its name (argv[0] is the subcommand).  It returns the process exit
 * code: 0 success, 1 failure (message already printed), 2 usage error.
 */
#ifndef SPLASH_COMMANDS_H
#define SPLASH_COMMANDS_H

int splash_cmd_pack(int argc, char **argv);           /* src/package/cmd_pack.c */
int splash_cmd_verify(int argc, char **argv);         /* src/package/cmd_pack.c */
int splash_cmd_pull(int argc, char **argv);           /* src/package/cmd_pull.c */
int splash_cmd_eval(int argc, char **argv);           /* src/runtime/cmd_eval.c */
int splash_cmd_bench(int argc, char **argv);          /* src/runtime/cmd_bench.c (also bench/bench_cpu) */
int splash_cmd_tokenize(int argc, char **argv);       /* src/text/cmd_tokenize.c */
int splash_cmd_detokenize(int argc, char **argv);     /* src/text/cmd_tokenize.c */
int splash_cmd_apply_template(int argc, char **argv); /* src/text/cmd_template.c */
int splash_cmd_serve(int argc, char **argv);          /* src/server/cmd_serve.c */
int splash_cmd_claude(int argc, char **argv);         /* src/launch/claude.c */
int splash_cmd_codex(int argc, char **argv);          /* src/launch/codex.c */
int splash_cmd_opencode(int argc, char **argv);       /* src/launch/opencode.c */
int splash_cmd_hermes(int argc, char **argv);         /* src/launch/hermes.c */

#endif
