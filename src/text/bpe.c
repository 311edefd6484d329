/* bpe.c - byte-level BPE merges, the token maps, and the piece cache.
 * See bpe.h for the shape and the merge order. */
#include "text/bpe.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

/* ---- hashing ------------------------------------------------------------- */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static uint64_t hash_bytes(const uint8_t *s, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    return mix64(h ^ w);
}

static size_t table_size(size_t n) {
    size_t cap = 1024;
    while (cap < 2 * n) cap *= 2;
    return cap;
}

/* ---- the piece cache ------------------------------------------------------
 *
 * Direct-mapped and bounded: 16 shards of 2048 slots, each slot holding one
 * piece of up to 32 bytes and its ids (up to 12).  A slot is simply
 * overwritten by the next piece that hashes to it, so memory never grows
 * (about 3 MiB).  A shard's mutex guards its slots; with 16 shards, threads
 * that tokenise at once rarely wait on each other.
 */
#define CACHE_SHARDS 16
#define CACHE_SLOTS 2048
#define CACHE_KEY_MAX 32
#define CACHE_IDS_MAX 12

typedef struct cache_slot {
    uint64_t hash; /* 0 = empty */
    uint8_t klen, nids;
    uint8_t key[CACHE_KEY_MAX];
    int32_t ids[CACHE_IDS_MAX];
} cache_slot;

struct bpe_cache {
    struct {
        pthread_mutex_t mu;
        cache_slot *slots;
    } shard[CACHE_SHARDS];
};

static bpe_cache *cache_new(void) {
    bpe_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    for (int i = 0; i < CACHE_SHARDS; i++) {
        pthread_mutex_init(&c->shard[i].mu, NULL);
        c->shard[i].slots = calloc(CACHE_SLOTS, sizeof(cache_slot));
        if (!c->shard[i].slots) {
            for (int j = 0; j <= i; j++) {
                free(c->shard[j].slots);
                pthread_mutex_destroy(&c->shard[j].mu);
            }
            free(c);
            return NULL;
        }
    }
    return c;
}

static void cache_free(bpe_cache *c) {
    if (!c) return;
    for (int i = 0; i < CACHE_SHARDS; i++) {
        free(c->shard[i].slots);
        pthread_mutex_destroy(&c->shard[i].mu);
    }
    free(c);
}

/* Copies the cached ids of s into ids[] and returns their count, or 0. */
static int cache_get(bpe_cache *c, uint64_t h, const uint8_t *s, size_t n, int32_t *ids) {
    int shard = (int)(h & (CACHE_SHARDS - 1));
    cache_slot *slot = &c->shard[shard].slots[(h >> 8) & (CACHE_SLOTS - 1)];
    int got = 0;
    pthread_mutex_lock(&c->shard[shard].mu);
    if (slot->hash == h && slot->klen == n && !memcmp(slot->key, s, n)) {
        got = slot->nids;
        memcpy(ids, slot->ids, (size_t)got * sizeof *ids);
    }
    pthread_mutex_unlock(&c->shard[shard].mu);
    return got;
}

static void cache_put(bpe_cache *c, uint64_t h, const uint8_t *s, size_t n, const int32_t *ids, size_t nids) {
    int shard = (int)(h & (CACHE_SHARDS - 1));
    cache_slot *slot = &c->shard[shard].slots[(h >> 8) & (CACHE_SLOTS - 1)];
    pthread_mutex_lock(&c->shard[shard].mu);
    slot->hash = h;
    slot->klen = (uint8_t)n;
    slot->nids = (uint8_t)nids;
    memcpy(slot->key, s, n);
    memcpy(slot->ids, ids, nids * sizeof *ids);
    pthread_mutex_unlock(&c->shard[shard].mu);
}

/* ---- maps ---------------------------------------------------------------- */

int bpe_init(bpe_model *m, size_t n_ids, size_t n_merges_hint, const uint8_t *bytes, const uint32_t *off) {
    memset(m, 0, sizeof *m);
    m->n_ids = n_ids;
    m->bytes = bytes;
    m->off = off;
    for (int i = 0; i < 256; i++) m->byte_id[i] = -1;
    size_t vcap = table_size(n_ids), mcap = table_size(n_merges_hint);
    m->vmap = calloc(vcap, sizeof *m->vmap);
    m->merges = malloc(mcap * sizeof *m->merges);
    m->whole = calloc(n_ids ? n_ids : 1, sizeof *m->whole);
    m->cache = cache_new();
    if (!m->vmap || !m->merges || !m->whole || !m->cache) {
        bpe_free(m);
        return SPLASH_E_NOMEM;
    }
    m->vmask = vcap - 1;
    m->mmask = mcap - 1;
    for (size_t i = 0; i < mcap; i++) m->merges[i].key = UINT64_MAX;
    return 0;
}

void bpe_free(bpe_model *m) {
    free(m->vmap);
    free(m->merges);
    free((void *)m->whole);
    cache_free(m->cache);
    memset(m, 0, sizeof *m);
}

static size_t tok_len(const bpe_model *m, int32_t id) { return m->off[id + 1] - m->off[id]; }

int32_t bpe_vocab_add(bpe_model *m, int32_t id) {
    const uint8_t *s = m->bytes + m->off[id];
    size_t n = tok_len(m, id);
    size_t i = hash_bytes(s, n) & m->vmask;
    while (m->vmap[i]) {
        int32_t other = (int32_t)m->vmap[i] - 1;
        if (tok_len(m, other) == n && !memcmp(m->bytes + m->off[other], s, n)) return other;
        i = (i + 1) & m->vmask;
    }
    m->vmap[i] = (uint32_t)id + 1;
    if (n == 1) m->byte_id[s[0]] = id;
    return -1;
}

int32_t bpe_lookup(const bpe_model *m, const uint8_t *s, size_t n) {
    size_t i = hash_bytes(s, n) & m->vmask;
    while (m->vmap[i]) {
        int32_t id = (int32_t)m->vmap[i] - 1;
        if (tok_len(m, id) == n && !memcmp(m->bytes + m->off[id], s, n)) return id;
        i = (i + 1) & m->vmask;
    }
    return -1;
}

static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

/* Doubles the merge table (when it is half full). */
static int merges_grow(bpe_model *m) {
    size_t cap = 2 * (m->mmask + 1);
    bpe_merge *t = malloc(cap * sizeof *t);
    if (!t) return SPLASH_E_NOMEM;
    for (size_t i = 0; i < cap; i++) t[i].key = UINT64_MAX;
    for (size_t j = 0; j <= m->mmask; j++) {
        if (m->merges[j].key == UINT64_MAX) continue;
        size_t i = mix64(m->merges[j].key) & (cap - 1);
        while (t[i].key != UINT64_MAX) i = (i + 1) & (cap - 1);
        t[i] = m->merges[j];
    }
    free(m->merges);
    m->merges = t;
    m->mmask = cap - 1;
    return 0;
}

int bpe_merge_add(bpe_model *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
    if (2 * (m->n_merges + 1) > m->mmask + 1 && merges_grow(m)) return SPLASH_E_NOMEM;
    uint64_t key = pair_key(a, b);
    size_t i = mix64(key) & m->mmask;
    while (m->merges[i].key != UINT64_MAX && m->merges[i].key != key) i = (i + 1) & m->mmask;
    if (m->merges[i].key == UINT64_MAX) m->n_merges++;
    m->merges[i].key = key;
    m->merges[i].rank = rank;
    m->merges[i].new_id = new_id;
    return 0;
}

static const bpe_merge *merge_find(const bpe_model *m, int32_t a, int32_t b) {
    uint64_t key = pair_key(a, b);
    size_t i = mix64(key) & m->mmask;
    for (;;) {
        const bpe_merge *e = &m->merges[i];
        if (e->key == key) return e;
        if (e->key == UINT64_MAX) return NULL;
        i = (i + 1) & m->mmask;
    }
}

/* ---- merging ------------------------------------------------------------- */

#define NO_RANK UINT32_MAX
#define SCAN_MAX 48 /* pieces up to this many bytes merge by scanning */

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return SPLASH_E_NOMEM;
    *p = q;
    *cap = c;
    return 0;
}

/* O(n^2): find the lowest-ranked adjacent pair (leftmost on a tie), merge,
 * repeat.  rank[i] is the rank of the pair (ids[i], ids[i + 1]). */
static int merge_scan(const bpe_model *m, const uint8_t *s, size_t n, splash_token_vec *out) {
    int32_t ids[SCAN_MAX], nid[SCAN_MAX];
    uint32_t rank[SCAN_MAX];
    size_t cnt = n;
    for (size_t i = 0; i < n; i++) ids[i] = m->byte_id[s[i]];
    for (size_t i = 0; i + 1 < n; i++) {
        const bpe_merge *e = merge_find(m, ids[i], ids[i + 1]);
        rank[i] = e ? e->rank : NO_RANK;
        nid[i] = e ? e->new_id : -1;
    }
    while (cnt > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < cnt; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == NO_RANK) break;
        ids[best] = nid[best];
        memmove(ids + best + 1, ids + best + 2, (cnt - best - 2) * sizeof *ids);
        if (best + 2 < cnt) {
            memmove(rank + best + 1, rank + best + 2, (cnt - best - 3) * sizeof *rank);
            memmove(nid + best + 1, nid + best + 2, (cnt - best - 3) * sizeof *nid);
        }
        cnt--;
        for (size_t i = best ? best - 1 : 0; i <= best && i + 1 < cnt; i++) {
            const bpe_merge *e = merge_find(m, ids[i], ids[i + 1]);
            rank[i] = e ? e->rank : NO_RANK;
            nid[i] = e ? e->new_id : -1;
        }
    }
    for (size_t i = 0; i < cnt; i++)
        if (splash_token_vec_push(out, ids[i])) return SPLASH_E_NOMEM;
    return 0;
}

typedef struct sym {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    int32_t alive;
} sym;

typedef struct heap_entry {
    uint32_t rank;
    uint32_t pos;
    int32_t new_id;
} heap_entry;

static int heap_less(const heap_entry *a, const heap_entry *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(heap_entry *h, size_t *n, heap_entry e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_less(&e, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = e;
}

static heap_entry heap_pop(heap_entry *h, size_t *n) {
    heap_entry top = h[0], last = h[--*n];
    size_t i = 0, cnt = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= cnt) break;
        if (c + 1 < cnt && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (cnt) h[i] = last;
    return top;
}

/* O(n log n), the same order as Rust's Word::merge_all: a heap of candidate
 * merges by (rank, position); a popped entry whose pair has changed since it
 * was pushed is skipped. */
static int merge_heap(const bpe_model *m, const uint8_t *s, size_t n, splash_token_vec *out, bpe_scratch *scr) {
    if (n > INT32_MAX / 2) return SPLASH_E_NOMEM;
    /* Every merge pushes at most two entries, and there are at most n - 1
     * merges, plus the n - 1 initial pairs. */
    if (grow(&scr->sym, &scr->sym_cap, n, sizeof(sym)) || grow(&scr->heap, &scr->heap_cap, 3 * n, sizeof(heap_entry)))
        return SPLASH_E_NOMEM;
    sym *sy = scr->sym;
    heap_entry *heap = scr->heap;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        sy[i].id = m->byte_id[s[i]];
        sy[i].prev = (int32_t)i - 1;
        sy[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
        sy[i].alive = 1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        const bpe_merge *e = merge_find(m, sy[i].id, sy[i + 1].id);
        if (e) heap_push(heap, &hn, (heap_entry){e->rank, (uint32_t)i, e->new_id});
    }
    while (hn) {
        heap_entry top = heap_pop(heap, &hn);
        sym *cur = &sy[top.pos];
        if (!cur->alive || cur->next < 0) continue;
        sym *right = &sy[cur->next];
        const bpe_merge *e = merge_find(m, cur->id, right->id);
        if (!e || e->new_id != top.new_id) continue;
        cur->id = top.new_id;
        right->alive = 0;
        cur->next = right->next;
        if (cur->next >= 0) sy[cur->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0) {
            e = merge_find(m, sy[cur->prev].id, cur->id);
            if (e) heap_push(heap, &hn, (heap_entry){e->rank, (uint32_t)cur->prev, e->new_id});
        }
        if (cur->next >= 0) {
            e = merge_find(m, cur->id, sy[cur->next].id);
            if (e) heap_push(heap, &hn, (heap_entry){e->rank, top.pos, e->new_id});
        }
    }
    for (int32_t i = 0; i >= 0; i = sy[i].next)
        if (splash_token_vec_push(out, sy[i].id)) return SPLASH_E_NOMEM;
    return 0;
}

int bpe_merge_piece(const bpe_model *m, const uint8_t *s, size_t n, int force_heap, splash_token_vec *out,
                    bpe_scratch *scr) {
    if (!force_heap && n <= SCAN_MAX) return merge_scan(m, s, n, out);
    return merge_heap(m, s, n, out, scr);
}

void bpe_scratch_free(bpe_scratch *scr) {
    free(scr->sym);
    free(scr->heap);
    memset(scr, 0, sizeof *scr);
}

int bpe_encode(const bpe_model *m, const uint8_t *s, size_t n, splash_token_vec *out, bpe_scratch *scr) {
    if (n == 1) return splash_token_vec_push(out, m->byte_id[s[0]]);
    int32_t id = bpe_lookup(m, s, n);
    if (id >= 0) {
        if (m->ignore_merges) return splash_token_vec_push(out, id);
        unsigned char st = atomic_load_explicit(&m->whole[id], memory_order_relaxed);
        if (st == 1) return splash_token_vec_push(out, id);
        if (st == 0) {
            size_t before = out->len;
            int rc = bpe_merge_piece(m, s, n, 0, out, scr);
            if (rc) return rc;
            st = out->len == before + 1 && out->ids[before] == id ? 1 : 2;
            atomic_store_explicit(&m->whole[id], st, memory_order_relaxed);
            return 0;
        }
    }
    if (n > CACHE_KEY_MAX) return bpe_merge_piece(m, s, n, 0, out, scr);
    uint64_t h = hash_bytes(s, n) | 1;
    int32_t ids[CACHE_IDS_MAX];
    int got = cache_get(m->cache, h, s, n, ids);
    if (got) {
        for (int i = 0; i < got; i++)
            if (splash_token_vec_push(out, ids[i])) return SPLASH_E_NOMEM;
        return 0;
    }
    size_t before = out->len;
    int rc = bpe_merge_piece(m, s, n, 0, out, scr);
    if (rc) return rc;
    if (out->len - before <= CACHE_IDS_MAX) cache_put(m->cache, h, s, n, out->ids + before, out->len - before);
    return 0;
}
