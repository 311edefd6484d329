/* bench_stats.c - see bench_stats.h. */
#include "runtime/bench_stats.h"

#include <stdlib.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

stat3 splash_bench_stats(double *v, int n) {
    stat3 s = {0, 0, 0};
    if (n <= 0) return s;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    s.med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    s.p10 = v[(n - 1) / 10];
    s.p90 = v[(n - 1) - (n - 1) / 10];
    return s;
}
