/* threads.h - a fixed pool of worker threads for data-parallel loops.
 *
 * splash_pool_run(pool, n, fn, ctx) calls fn(ctx, i, worker) for every task
 * i in [0, n) across the workers and the calling thread, and returns when
 * all are done.  Tasks are claimed dynamically, so a task must write only
 * its own outputs and do its own reductions in a fixed order: then results
 * are bit-identical whatever the thread count or schedule (batch invariance
 * depends on it).  One run at a time per pool.
 */
#ifndef SPLASH_THREADS_H
#define SPLASH_THREADS_H

#include <stddef.h>

typedef struct splash_pool splash_pool;
typedef void (*splash_task_fn)(void *ctx, size_t task, int worker);

/* n_threads <= 0: the number of online CPUs (or SPLASH_THREADS). */
splash_pool *splash_pool_create(int n_threads);
void splash_pool_destroy(splash_pool *pool);
int splash_pool_size(const splash_pool *pool);
void splash_pool_run(splash_pool *pool, size_t n_tasks, splash_task_fn fn, void *ctx);

#endif
