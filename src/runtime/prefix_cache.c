/* prefix_cache.c - the radix tree of shared KV pages (see prefix_cache.h). */
#include "runtime/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdULL;
    return h ^ (h >> 33);
}

static uint64_t key_of(const splash_prefix_cache *pc, const splash_pc_node *parent, const int32_t *tokens,
                       const uint8_t *digest) {
    uint64_t h = mix(0x5bd1e995ULL, (uint64_t)(uintptr_t)parent);
    for (int i = 0; i < pc->page_tokens; i++) h = mix(h, (uint32_t)tokens[i]);
    if (digest)
        for (int i = 0; i < SPLASH_DIGEST_BYTES; i += 8) {
            uint64_t w;
            memcpy(&w, digest + i, 8);
            h = mix(h, w);
        }
    return h;
}

int splash_prefix_cache_init(splash_prefix_cache *pc, int page_tokens, splash_kv_pool *pool,
                             splash_state_cache *states) {
    memset(pc, 0, sizeof *pc);
    pc->page_tokens = page_tokens;
    pc->pool = pool;
    pc->states = states;
    pc->n_buckets = 1024;
    while (pc->n_buckets < 2 * (size_t)pool->n_pages) pc->n_buckets *= 2;
    pc->buckets = calloc(pc->n_buckets, sizeof *pc->buckets);
    return pc->buckets ? 0 : SPLASH_E_NOMEM;
}

static void unlink_node(splash_prefix_cache *pc, splash_pc_node *n) {
    splash_pc_node **pp = &pc->buckets[n->key & (pc->n_buckets - 1)];
    while (*pp && *pp != n) pp = &(*pp)->hnext;
    if (*pp) *pp = n->hnext;
    if (n->prev_all) n->prev_all->next_all = n->next_all;
    else pc->all = n->next_all;
    if (n->next_all) n->next_all->prev_all = n->prev_all;
    if (n->parent) n->parent->n_children--;
    if (n->snap >= 0 && pc->states) splash_state_cache_drop(pc->states, n->snap);
    splash_kv_pool_unref(pc->pool, n->page);
    pc->n_nodes--;
    free(n);
}

void splash_prefix_cache_free(splash_prefix_cache *pc) {
    /* children before parents: repeatedly drop leaves */
    while (pc->all) {
        for (splash_pc_node *n = pc->all, *nx; n; n = nx) {
            nx = n->next_all;
            if (!n->n_children) unlink_node(pc, n);
        }
    }
    free(pc->buckets);
    memset(pc, 0, sizeof *pc);
}

static int same_key(const splash_prefix_cache *pc, const splash_pc_node *n, const splash_pc_node *parent,
                    const int32_t *tokens, const uint8_t *digest) {
    if (n->parent != parent || n->has_digest != (digest != NULL)) return 0;
    if (digest && memcmp(n->digest, digest, SPLASH_DIGEST_BYTES)) return 0;
    return !memcmp(n->tokens, tokens, sizeof(int32_t) * (size_t)pc->page_tokens);
}

splash_pc_node *splash_prefix_find(splash_prefix_cache *pc, splash_pc_node *parent, const int32_t *tokens,
                                   const uint8_t *digest) {
    uint64_t k = key_of(pc, parent, tokens, digest);
    for (splash_pc_node *n = pc->buckets[k & (pc->n_buckets - 1)]; n; n = n->hnext)
        if (n->key == k && same_key(pc, n, parent, tokens, digest)) return n;
    return NULL;
}

int splash_prefix_match(splash_prefix_cache *pc, const int32_t *tokens, int n, splash_pc_node **path, int max) {
    int k = 0;
    splash_pc_node *at = NULL;
    pc->lookups++;
    while (k < max && (k + 1) * pc->page_tokens <= n) {
        splash_pc_node *c = splash_prefix_find(pc, at, tokens + (size_t)k * pc->page_tokens, NULL);
        if (!c) break;
        path[k++] = at = c;
    }
    return k;
}

splash_pc_node *splash_prefix_insert(splash_prefix_cache *pc, splash_pc_node *parent, const int32_t *tokens,
                                     const uint8_t *digest, int32_t page) {
    splash_pc_node *n = splash_prefix_find(pc, parent, tokens, digest);
    if (n) return n;
    n = calloc(1, sizeof *n + sizeof(int32_t) * (size_t)pc->page_tokens);
    if (!n) return NULL;
    n->parent = parent;
    n->key = key_of(pc, parent, tokens, digest);
    n->page = page;
    n->depth = parent ? parent->depth + 1 : 1;
    n->snap = -1;
    n->last_used = ++pc->tick;
    if (digest) {
        n->has_digest = 1;
        memcpy(n->digest, digest, SPLASH_DIGEST_BYTES);
    }
    memcpy(n->tokens, tokens, sizeof(int32_t) * (size_t)pc->page_tokens);
    splash_pc_node **b = &pc->buckets[n->key & (pc->n_buckets - 1)];
    n->hnext = *b;
    *b = n;
    n->next_all = pc->all;
    if (pc->all) pc->all->prev_all = n;
    pc->all = n;
    if (parent) parent->n_children++;
    splash_kv_pool_ref(pc->pool, page);
    pc->n_nodes++;
    return n;
}

void splash_prefix_pin(splash_prefix_cache *pc, splash_pc_node *n) {
    n->pins++;
    n->last_used = ++pc->tick;
}

void splash_prefix_unpin(splash_prefix_cache *pc, splash_pc_node *n) {
    if (n->pins > 0) n->pins--;
    n->last_used = ++pc->tick;
}

int splash_prefix_evict_one(splash_prefix_cache *pc) {
    splash_pc_node *best = NULL;
    for (splash_pc_node *n = pc->all; n; n = n->next_all)
        if (!n->pins && !n->n_children && (!best || n->last_used < best->last_used)) best = n;
    if (!best) return 0;
    unlink_node(pc, best);
    pc->pages_evicted++;
    return 1;
}

int splash_prefix_evictable(const splash_prefix_cache *pc) {
    int k = 0;
    for (const splash_pc_node *n = pc->all; n; n = n->next_all) k += !n->pins;
    return k;
}
