/* threads.c - the worker pool behind splash_pool_run.
 *
 * A decode step is about a hundred short parallel loops (matrix products of
 * a few MB, attention heads, GDN heads), each 10-500 us, with
 * single-threaded glue of a few microseconds between them.  Waking sleeping
 * threads through a condition variable costs 10-20 us per loop, a tenth of
 * the step at that rate, so runs are started and finished through atomics:
 *
 *   start:  the caller publishes (fn, ctx, n_tasks), resets the task counter
 *           and bumps `gen`; workers waiting for it see it at once.  A
 *           worker waits by spinning briefly, then yielding the CPU in a
 *           loop (on a busy machine the thread we need may be waiting for
 *           this core) for up to SPIN_NS, then sleeping on the condition
 *           variable; only then does the caller take the lock to wake it.
 *   tasks:  claimed one at a time with fetch_add, so whoever is running
 *           takes whatever is left.
 *   finish: a worker joins a run by moving its `joined` from gen-1 to gen
 *           (compare-and-swap), and reports `done` = gen after its last
 *           task.  When the caller has run out of tasks it tries the same
 *           swap on each worker's `joined`: if it wins, the worker had not
 *           started (asleep, or preempted on a shared machine) and is excused
 *           from this run, so the caller never waits for a thread the OS has
 *           not scheduled; if it loses, it waits for that worker's `done`
 *           (it is inside a task).
 *
 * So a run ends as soon as its tasks are done, and a run never overlaps the
 * next (the fields of run g+1 are written only after every worker that
 * joined run g has reported).  Tasks write only their own outputs, so which
 * thread runs which task changes no result.  The handshake between `gen` and
 * `sleepers` uses sequentially consistent atomics: a worker registers as a
 * sleeper and then re-reads `gen` under the lock; the caller bumps `gen`
 * and then reads `sleepers`; one of them sees the other's write.
 */
#include "threads.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "mem.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define SPIN_NS 50000L    /* a worker waits this long for the next run before sleeping */
#define PAUSE_SPINS 2048  /* pause-spins (a few us) before either side starts yielding */

typedef struct worker_slot {
    _Alignas(64) atomic_uint joined; /* the last run joined or excused from */
    atomic_uint done;                /* the last run finished */
} worker_slot;

struct splash_pool {
    int n_threads; /* including the caller */
    pthread_t *threads;
    worker_slot *slots; /* [n_threads], slot 0 unused */
    long spin_ns;
    unsigned cur;       /* the caller's last run */
    /* the current run, published before gen is bumped */
    splash_task_fn fn;
    void *ctx;
    size_t n_tasks;
    _Alignas(64) atomic_size_t next;
    _Alignas(64) atomic_uint gen;
    atomic_int sleepers;
    atomic_int stop;
    pthread_mutex_t lock;
    pthread_cond_t wake;
};

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void drain(splash_pool *p, int worker) {
    size_t n = p->n_tasks;
    for (;;) {
        size_t i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= n) break;
        p->fn(p->ctx, i, worker);
    }
}

typedef struct {
    splash_pool *pool;
    int index;
} worker_arg;

/* Waits for a generation other than `seen` (or stop); returns it. */
static unsigned wait_run(splash_pool *p, unsigned seen) {
    long deadline = 0;
    for (unsigned spins = 0;; spins++) {
        unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen || atomic_load_explicit(&p->stop, memory_order_relaxed)) return g;
        if (spins < PAUSE_SPINS) {
            cpu_relax();
            continue;
        }
        sched_yield();
        long t = now_ns();
        if (!deadline)
            deadline = t + p->spin_ns;
        else if (t > deadline)
            break;
    }
    pthread_mutex_lock(&p->lock);
    atomic_fetch_add(&p->sleepers, 1);
    unsigned g;
    while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->wake, &p->lock);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->lock);
    return g;
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    splash_pool *p = wa->pool;
    worker_slot *me = &p->slots[wa->index];
    int index = wa->index;
    free(wa);
    unsigned seen = 0;
    for (;;) {
        seen = wait_run(p, seen);
        if (atomic_load(&p->stop)) break;
        unsigned expect = seen - 1;
        if (!atomic_compare_exchange_strong(&me->joined, &expect, seen)) continue; /* excused: the run is over */
        drain(p, index);
        atomic_store_explicit(&me->done, seen, memory_order_release);
    }
    return NULL;
}

splash_pool *splash_pool_create(int n_threads) {
    if (n_threads <= 0) {
        const char *env = getenv("SPLASH_THREADS");
        n_threads = env ? atoi(env) : 0;
        if (n_threads <= 0) n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (n_threads <= 0) n_threads = 1;
    }
    splash_pool *p = xcalloc(1, sizeof *p);
    p->n_threads = n_threads;
    const char *spin = getenv("SPLASH_POOL_SPIN_US");
    p->spin_ns = spin ? atol(spin) * 1000L : SPIN_NS;
    p->slots = splash_aligned_alloc(64, (size_t)n_threads * sizeof *p->slots);
    if (!p->slots) { /* start-up: dies as the x-allocators do */
        fputs("splash: out of memory creating the thread pool\n", stderr);
        abort();
    }
    for (int i = 0; i < n_threads; i++) {
        atomic_init(&p->slots[i].joined, 0);
        atomic_init(&p->slots[i].done, 0);
    }
    atomic_init(&p->next, 0);
    atomic_init(&p->gen, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, 0);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->threads = xcalloc((size_t)n_threads, sizeof *p->threads);
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = xmalloc(sizeof *wa);
        wa->pool = p;
        wa->index = i;
        pthread_create(&p->threads[i], NULL, worker_main, wa);
    }
    return p;
}

void splash_pool_destroy(splash_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->gen, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    free(p->threads);
    free(p->slots);
    free(p);
}

int splash_pool_size(const splash_pool *p) { return p->n_threads; }

void splash_pool_run(splash_pool *p, size_t n_tasks, splash_task_fn fn, void *ctx) {
    if (n_tasks == 0) return;
    if (p->n_threads == 1 || n_tasks == 1) {
        for (size_t i = 0; i < n_tasks; i++) fn(ctx, i, 0);
        return;
    }
    unsigned g = p->cur + 1;
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store(&p->gen, g); /* seq_cst: publishes the run, ordered before the sleepers check */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
    }
    drain(p, 0);
    for (int w = 1; w < p->n_threads; w++) {
        unsigned expect = g - 1;
        if (atomic_compare_exchange_strong(&p->slots[w].joined, &expect, g)) continue; /* had not started: excused */
        for (unsigned spins = 0; atomic_load_explicit(&p->slots[w].done, memory_order_acquire) != g; spins++) {
            if (spins < PAUSE_SPINS)
                cpu_relax();
            else
                sched_yield();
        }
    }
    p->cur = g;
}
