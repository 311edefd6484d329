#include "threads.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "mem.h"

struct splash_pool {
    int n_threads; /* including the caller */
    pthread_t *threads;
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    unsigned long generation;
    int stop;
    int busy; /* workers still in the current run */
    splash_task_fn fn;
    void *ctx;
    size_t n_tasks;
    atomic_size_t next;
};

static void drain(splash_pool *p, int worker) {
    for (;;) {
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n_tasks) break;
        p->fn(p->ctx, i, worker);
    }
}

typedef struct {
    splash_pool *pool;
    int index;
} worker_arg;

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    splash_pool *p = wa->pool;
    int index = wa->index;
    free(wa);
    unsigned long seen = 0;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->wake, &p->lock);
        if (p->stop) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->lock);
        drain(p, index);
        pthread_mutex_lock(&p->lock);
        if (--p->busy == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->lock);
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
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
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
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p);
}

int splash_pool_size(const splash_pool *p) { return p->n_threads; }

void splash_pool_run(splash_pool *p, size_t n_tasks, splash_task_fn fn, void *ctx) {
    if (n_tasks == 0) return;
    if (p->n_threads == 1 || n_tasks == 1) {
        for (size_t i = 0; i < n_tasks; i++) fn(ctx, i, 0);
        return;
    }
    pthread_mutex_lock(&p->lock);
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store(&p->next, 0);
    p->busy = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    drain(p, 0);
    pthread_mutex_lock(&p->lock);
    while (p->busy > 0) pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
}
