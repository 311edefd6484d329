/* kv_pool.h - the KV page pool: page ids with reference counts.
 *
 * The pool only counts; the page memory itself is one block the runtime
 * allocated through the model's backend and attached to the model (page id i
 * = bytes [i * page_bytes, (i+1) * page_bytes)).  Who holds a reference: a
 * lane for every page in its page table, and the prefix cache for every page
 * one of its nodes names.  A page whose count drops to zero is free again.
 * A page with more than one holder is shared and must never be written: the
 * runtime only shares whole pages that are complete, so no one ever needs to
 * write into one (the copy-on-write case cannot arise; see prefix_cache.h).
 *
 * Not thread-safe: only the engine thread touches it (stats are copied under
 * the engine's lock).
 */
#ifndef SPLASH_KV_POOL_H
#define SPLASH_KV_POOL_H

#include <stdint.h>

typedef struct splash_kv_pool {
    int n_pages;
    int n_free;
    int32_t *free_list; /* [n_pages] stack of free ids */
    int32_t *refs;      /* [n_pages] holders of each page */
    uint64_t allocs, releases; /* totals, for the leak checks */
} splash_kv_pool;

/* 0 or SPLASH_E_NOMEM.  Every page starts free. */
int splash_kv_pool_init(splash_kv_pool *p, int n_pages);
void splash_kv_pool_free(splash_kv_pool *p);
/* A free page with one reference, or -1 when none is free. */
int32_t splash_kv_pool_alloc(splash_kv_pool *p);
/* One more holder of an allocated page. */
void splash_kv_pool_ref(splash_kv_pool *p, int32_t page);
/* Drops one holder; the page is free again when none is left. */
void splash_kv_pool_unref(splash_kv_pool *p, int32_t page);
static inline int splash_kv_pool_used(const splash_kv_pool *p) { return p->n_pages - p->n_free; }

#endif
