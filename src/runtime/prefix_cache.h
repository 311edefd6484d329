/* prefix_cache.h - the radix tree of KV pages that requests share.
 *
 * A node is one complete KV page: key = (parent node, the page's exact
 * page_tokens tokens, an extra digest: empty for text, later the digest of an
 * image's preprocessed pixels and grid).  The path from the root to a node
 * names the tokens [0, depth * page_tokens) and the pages that hold their KV
 * (for every attention layer).  A node may carry a recurrent-state snapshot
 * (state_cache.h) of the state after its last token.
 *
 * Only complete pages enter the tree, and a lane writes only positions past
 * what it reused, which start on a page boundary: a shared page is never
 * written, so no copy-on-write is needed.  The cost is at most page_tokens-1
 * recomputed tokens per reuse.
 *
 * Holders: the tree holds one pool reference per node page.  A running lane
 * pins every node on its path (reused or inserted by it), so neither the node
 * nor its page can be evicted under it.  Eviction takes unpinned leaves,
 * least recently used first (a node's snapshot goes with it).
 *
 * Lookup is a hash table over the keys (parent pointer, tokens, digest), so a
 * match costs one probe per page.
 */
#ifndef SPLASH_PREFIX_CACHE_H
#define SPLASH_PREFIX_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/kv_pool.h"
#include "runtime/state_cache.h"

#define SPLASH_DIGEST_BYTES 32

typedef struct splash_pc_node {
    struct splash_pc_node *parent;
    struct splash_pc_node *hnext;            /* hash chain */
    struct splash_pc_node *prev_all, *next_all; /* every node, for eviction scans */
    uint64_t key;
    uint64_t last_used;
    int32_t page;
    int depth;         /* pages from the root; this node covers tokens [(depth-1)*pt, depth*pt) */
    int n_children;
    int pins;          /* running lanes whose path includes this node */
    int snap;          /* state_cache entry of the state after this page, or -1 */
    int has_digest;
    uint8_t digest[SPLASH_DIGEST_BYTES];
    int32_t tokens[];  /* [page_tokens] */
} splash_pc_node;

typedef struct splash_prefix_cache {
    int page_tokens;
    splash_kv_pool *pool;
    splash_state_cache *states;
    splash_pc_node **buckets;
    size_t n_buckets;
    splash_pc_node *all; /* list head */
    int n_nodes;
    uint64_t tick;
    /* figures */
    uint64_t lookups, hits, tokens_reused, pages_evicted;
} splash_prefix_cache;

int splash_prefix_cache_init(splash_prefix_cache *pc, int page_tokens, splash_kv_pool *pool,
                             splash_state_cache *states);
/* Releases every node (pins are ignored: call with no lane running). */
void splash_prefix_cache_free(splash_prefix_cache *pc);

/* The child of parent (NULL: the root) keyed by one page of tokens and an
 * optional digest (NULL: text), or NULL. */
splash_pc_node *splash_prefix_find(splash_prefix_cache *pc, splash_pc_node *parent, const int32_t *tokens,
                                   const uint8_t *digest);
/* Walks tokens[0, n) page by page (whole pages only); fills path[0..k) with
 * the matched nodes (k <= max) and returns k. */
int splash_prefix_match(splash_prefix_cache *pc, const int32_t *tokens, int n, splash_pc_node **path, int max);
/* Adds the page under parent and returns its node, or the node already there
 * (then *page is not taken: the caller keeps its own copy).  NULL when out of
 * memory.  A new node takes one pool reference on page. */
splash_pc_node *splash_prefix_insert(splash_prefix_cache *pc, splash_pc_node *parent, const int32_t *tokens,
                                     const uint8_t *digest, int32_t page);
void splash_prefix_pin(splash_prefix_cache *pc, splash_pc_node *n);
void splash_prefix_unpin(splash_prefix_cache *pc, splash_pc_node *n);
/* Evicts the least recently used unpinned leaf; 1 if one went, 0 if none can. */
int splash_prefix_evict_one(splash_prefix_cache *pc);
/* Pages that eviction could free now (unpinned nodes: every unpinned node
 * becomes a leaf once its unpinned descendants are gone). */
int splash_prefix_evictable(const splash_prefix_cache *pc);

#endif
