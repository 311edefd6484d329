/* bench_stats.h - the benchmarks' summary of repeated timings (splash bench:
 * cmd_bench.c, cmd_bench_draft.c): median and 10th / 90th percentiles. */
#ifndef SPLASH_BENCH_STATS_H
#define SPLASH_BENCH_STATS_H

typedef struct stat3 {
    double med, p10, p90;
} stat3;

/* Of n values (sorted in place); zeros for n <= 0. */
stat3 splash_bench_stats(double *v, int n);

#endif
