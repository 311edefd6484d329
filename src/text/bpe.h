/* bpe.h - internal to the tokenizer: the BPE model over bytes.
 *
 * The byte-level alphabet makes every piece a byte string, so the model works
 * on raw bytes, never on the GPT-2 "bytes_to_unicode" strings of the file:
 * tokenizer.c turns each vocabulary string into the bytes it stands for, and
 * this file holds the maps (bytes -> id, (id, id) -> merge), runs the merges
 * of one piece by rank, and caches the result of pieces that are seen often.
 *
 * Merge order follows Hugging Face's Rust BPE (Word::merge_all): the lowest
 * rank among the adjacent pairs merges first, ties (the same pair twice) go to
 * the leftmost.  Pieces short enough use an O(n^2) scan, longer ones a binary
 * heap (O(n log n)); both give the same result, which the unit test checks.
 *
 * Shortcut: a piece whose bytes are a vocabulary token becomes that token
 * without merging, but only once BPE has been seen to rebuild that token from
 * its own bytes (checked the first time, remembered per id); so the shortcut
 * never changes a result.
 */
#ifndef SPLASH_BPE_H
#define SPLASH_BPE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

typedef struct bpe_merge {
    uint64_t key; /* (left id << 32) | right id; UINT64_MAX = empty slot */
    uint32_t rank;
    int32_t new_id;
} bpe_merge;

typedef struct bpe_cache bpe_cache;

typedef struct bpe_model {
    size_t n_ids;
    const uint8_t *bytes;  /* token bytes of id i: bytes[off[i] .. off[i + 1]) */
    const uint32_t *off;
    int32_t byte_id[256];  /* the token of each single byte */
    uint32_t *vmap;        /* open addressing, bytes -> id + 1 (0 = empty) */
    size_t vmask;
    bpe_merge *merges;     /* open addressing, pair -> (rank, new id) */
    size_t mmask;
    size_t n_merges;
    _Atomic unsigned char *whole; /* per id: 0 unknown, 1 BPE(bytes) == [id], 2 not */
    int ignore_merges;     /* HF `ignore_merges`: a vocabulary word is taken whole */
    bpe_cache *cache;
} bpe_model;

/* Per-call scratch (one per encode call; grown as needed, freed at the end). */
typedef struct bpe_scratch {
    void *sym;
    size_t sym_cap;
    void *heap;
    size_t heap_cap;
} bpe_scratch;

/* Sets up the maps for n_ids ids whose bytes are already in bytes/off
 * (n_merges_hint: the expected number of merges, to size the table).
 * Returns 0 or SPLASH_E_NOMEM. */
int bpe_init(bpe_model *m, size_t n_ids, size_t n_merges_hint, const uint8_t *bytes, const uint32_t *off);
void bpe_free(bpe_model *m);

/* Makes id findable by its bytes; returns the id already there for the same
 * bytes, or -1 when the bytes were new. */
int32_t bpe_vocab_add(bpe_model *m, int32_t id);
/* The id whose bytes are s[0..n), or -1. */
int32_t bpe_lookup(const bpe_model *m, const uint8_t *s, size_t n);
/* Records the merge (a, b) -> new_id with its rank (a later rank for the same
 * pair replaces the earlier one, as a Rust HashMap built from the list does).
 * The table grows as needed; 0 or SPLASH_E_NOMEM. */
int bpe_merge_add(bpe_model *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id);

/* Appends the ids of one piece s[0..n) (n >= 1).  0 or SPLASH_E_NOMEM. */
int bpe_encode(const bpe_model *m, const uint8_t *s, size_t n, splash_token_vec *out, bpe_scratch *scr);
void bpe_scratch_free(bpe_scratch *scr);

/* Test hook: merges with the heap (force_heap = 1) or the scan (0) whatever
 * the length, bypassing shortcut and cache. */
int bpe_merge_piece(const bpe_model *m, const uint8_t *s, size_t n, int force_heap, splash_token_vec *out,
                    bpe_scratch *scr);

#endif
