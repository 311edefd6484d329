/* kv_pool.c - page ids and their reference counts (see kv_pool.h). */
#include "runtime/kv_pool.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/status.h"

int splash_kv_pool_init(splash_kv_pool *p, int n_pages) {
    memset(p, 0, sizeof *p);
    p->free_list = malloc(sizeof(int32_t) * (size_t)(n_pages > 0 ? n_pages : 1));
    p->refs = calloc((size_t)(n_pages > 0 ? n_pages : 1), sizeof(int32_t));
    if (!p->free_list || !p->refs) {
        splash_kv_pool_free(p);
        return SPLASH_E_NOMEM;
    }
    p->n_pages = n_pages;
    for (int i = 0; i < n_pages; i++) p->free_list[i] = n_pages - 1 - i; /* page 0 handed out first */
    p->n_free = n_pages;
    return 0;
}

void splash_kv_pool_free(splash_kv_pool *p) {
    free(p->free_list);
    free(p->refs);
    memset(p, 0, sizeof *p);
}

int32_t splash_kv_pool_alloc(splash_kv_pool *p) {
    if (!p->n_free) return -1;
    int32_t id = p->free_list[--p->n_free];
    p->refs[id] = 1;
    p->allocs++;
    return id;
}

void splash_kv_pool_ref(splash_kv_pool *p, int32_t page) {
    if (page < 0 || page >= p->n_pages || p->refs[page] <= 0) {
        LOG_WARN("kv pool: reference to page %d that is not allocated", (int)page);
        return;
    }
    p->refs[page]++;
}

void splash_kv_pool_unref(splash_kv_pool *p, int32_t page) {
    if (page < 0 || page >= p->n_pages || p->refs[page] <= 0) {
        LOG_WARN("kv pool: release of page %d that is not allocated", (int)page);
        return;
    }
    if (--p->refs[page] == 0) {
        p->free_list[p->n_free++] = page;
        p->releases++;
    }
}
