/* state_cache.h - recurrent-state snapshots, budgeted.
 *
 * A hybrid model cannot rebuild its recurrent state (GDN conv + delta state)
 * from KV pages, so the runtime copies a slot's state at page-aligned
 * positions and keeps the copy on the prefix-cache node whose page ends
 * there: restoring it plus mapping the node's path of pages puts a lane
 * exactly where a cold run would be.  Kinds, in the order they are evicted:
 *   CHECKPOINT  periodic, during long prefills (disposable);
 *   JUNCTION    where a request left the cached path (branches meet there);
 *   REPLAY      the last whole page before the generation prompt, and the
 *               last whole page a finished request reached (the next turn of
 *               the same conversation restarts at one of them).
 * Within a kind the least recently used goes first.  No snapshot is ever
 * needed by a running request (restore copies it into the lane's slot), so
 * any can be evicted at a safe point between forward calls.
 *
 * Buffers come from the model's backend (splash_model_alloc_memory) as they
 * are needed, at most `max_snaps` of them (the memory plan's state budget).
 */
#ifndef SPLASH_STATE_CACHE_H
#define SPLASH_STATE_CACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct splash_model splash_model;
struct splash_pc_node;

enum { SPLASH_SNAP_CHECKPOINT = 0, SPLASH_SNAP_JUNCTION = 1, SPLASH_SNAP_REPLAY = 2 };

typedef struct splash_snap {
    void *buf;                   /* state_bytes, or NULL when this entry is unused */
    struct splash_pc_node *node; /* the node it belongs to (node->snap is this index) */
    int kind;
    uint64_t last_used;
} splash_snap;

typedef struct splash_state_cache {
    splash_model *model;
    size_t state_bytes;
    int max_snaps, n_held;
    splash_snap *snaps; /* [max_snaps] */
    uint64_t taken, evicted, restored;
} splash_state_cache;

int splash_state_cache_init(splash_state_cache *sc, splash_model *model, size_t state_bytes, int max_snaps);
void splash_state_cache_free(splash_state_cache *sc);
/* A free entry (evicting the least useful snapshot when the budget is
 * spent), with its buffer allocated; -1 when the budget is 0 or memory is
 * short.  The caller fills it and links it to a node. */
int splash_state_cache_take(splash_state_cache *sc, int kind, uint64_t tick);
/* Drops entry i (and unlinks its node). */
void splash_state_cache_drop(splash_state_cache *sc, int i);
static inline size_t splash_state_cache_bytes(const splash_state_cache *sc) {
    return (size_t)sc->n_held * sc->state_bytes;
}

#endif
