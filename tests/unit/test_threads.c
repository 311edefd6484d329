/* The worker pool (src/base/threads.c): every task of every run runs exactly
 * once, with worker indices in range, whatever the thread count; runs never
 * overlap (a task of run k never sees run k+1's context); a run whose worker
 * stalls or sleeps still completes; pools come and go. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/threads.h"

typedef struct run_ctx {
    int run;                 /* which run this context belongs to */
    int n_threads;
    atomic_int *count;       /* [n] times each task ran */
    atomic_int *current_run; /* the run the caller is in */
    atomic_int bad;          /* a task saw another run's state, or a bad worker index */
    int stall_task;          /* this task sleeps (-1: none) */
} run_ctx;

static void task(void *ctx, size_t i, int worker) {
    run_ctx *c = ctx;
    if (worker < 0 || worker >= c->n_threads || atomic_load(c->current_run) != c->run) atomic_fetch_add(&c->bad, 1);
    if ((int)i == c->stall_task) {
        struct timespec ts = {0, 2000000}; /* 2 ms */
        nanosleep(&ts, NULL);
    }
    atomic_fetch_add(&c->count[i], 1);
}

static void check_pool(int threads) {
    splash_pool *p = splash_pool_create(threads);
    assert_int_equal(splash_pool_size(p), threads);
    atomic_int count[257], current;
    atomic_init(&current, 0);
    for (int run = 1; run <= 300; run++) {
        int n = run % 3 == 0 ? 1 : 1 + (run * 37) % 257;
        for (int i = 0; i < n; i++) atomic_init(&count[i], 0);
        run_ctx c = {.run = run, .n_threads = threads, .count = count, .current_run = &current,
                     .stall_task = run % 50 == 0 ? n - 1 : -1};
        atomic_init(&c.bad, 0);
        atomic_store(&current, run);
        splash_pool_run(p, (size_t)n, task, &c);
        atomic_store(&current, -run); /* a straggler of this run would notice */
        assert_int_equal(atomic_load(&c.bad), 0);
        for (int i = 0; i < n; i++)
            if (atomic_load(&count[i]) != 1) fail_msg("%d threads, run %d: task %d ran %d times", threads, run, i, atomic_load(&count[i]));
        if (run % 100 == 0) { /* let the workers give up spinning and sleep */
            struct timespec ts = {0, 80000000};
            nanosleep(&ts, NULL);
        }
    }
    splash_pool_run(p, 0, task, NULL); /* no tasks: returns at once */
    splash_pool_destroy(p);
}

static void test_pool_runs(void **state) {
    (void)state;
    check_pool(1);
    check_pool(2);
    check_pool(4);
}

static void test_pool_create_destroy(void **state) {
    (void)state;
    for (int i = 0; i < 20; i++) splash_pool_destroy(splash_pool_create(1 + i % 3));
    splash_pool_destroy(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_runs),
        cmocka_unit_test(test_pool_create_destroy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
