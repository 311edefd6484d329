/* cmd_bench_draft.h - `splash bench --draft` (cmd_bench_draft.c): the
 * package's draft timed alone at its own shapes. */
#ifndef SPLASH_CMD_BENCH_DRAFT_H
#define SPLASH_CMD_BENCH_DRAFT_H

/* Opens model_dir's draft on device ("cpu" or "cuda") with `threads` CPU
 * threads, gives four lanes ctx positions of context, prints a table of
 * propose and append times (reps each, at least 5); 0, or 1 with a message
 * on stderr. */
int splash_bench_draft(const char *model_dir, const char *device, int threads, int ctx, int reps);

#endif
