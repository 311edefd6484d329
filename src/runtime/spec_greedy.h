/* spec_greedy.h - a greedy lane's speculative decision from its TOP rows, as
 * one function that the host (runtime/model.c's fallback) and a GPU kernel
 * (backend/cuda/greedy.cu) both compile, so the two decide alike by
 * construction.  It is splash_spec_decide for a greedy request whose rows
 * are TOP rows (no penalties, no logprobs, no script): row i's token is its
 * best entry; proposal i stands while it equals row i's token; then the
 * engine's cut (runtime/engine.c, cycle_commit): the rows whose inputs stand
 * end at the first stop token among the emitted ones, and at the page
 * boundary the caller gives as `limit`.
 */
#ifndef SPLASH_SPEC_GREEDY_H
#define SPLASH_SPEC_GREEDY_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define SPLASH_HD __host__ __device__
#else
#define SPLASH_HD
#endif

#define SPLASH_GREEDY_MAX_ROWS 28 /* decision rows a lane (n_props + 1) */
#define SPLASH_GREEDY_MAX_STOP 16 /* stop ids a call */

/* What a lane's decision gives (32 int32: a GPU writes it as it is). */
typedef struct splash_greedy_result {
    int32_t status; /* 0; 1: a decision row holds no finite entry (the host's "no token"): the lane fails */
    int32_t k;      /* proposals accepted */
    int32_t j;      /* out[j] is the last token emitted: the first stop token in out[0..k], else out[k] */
    int32_t c;      /* rows committed: min(n_feed + j, limit) */
    int32_t out[SPLASH_GREEDY_MAX_ROWS]; /* out[0..k]: rows 0..k's tokens (the accepted proposals, then row k's) */
} splash_greedy_result;

/* The index of the first stop token among the emitted out[0..k], else k: the
 * rows whose inputs stand end there (the engine's cut for every decision). */
static inline SPLASH_HD int splash_spec_first_stop(const int32_t *out, int k, const int32_t *stop, int n_stop) {
    for (int i = 0; i < k; i++)
        for (int s = 0; s < n_stop; s++)
            if (out[i] == stop[s]) return i;
    return k;
}

/* Row i's best entry is top_ids[i * ld] (value top_vals[i * ld]) for rows
 * 0..n_props; props[i] is the proposal row i decides; rows before row 0 (the
 * feed but its last) are n_feed - 1 more rows whose inputs stand. */
static inline SPLASH_HD void splash_greedy_decide(const int32_t *top_ids, const float *top_vals, size_t ld, int vocab,
                                                  const int32_t *props, int n_feed, int n_props, int limit,
                                                  const int32_t *stop, int n_stop, splash_greedy_result *r) {
    int k = 0;
    r->status = 0;
    for (int i = 0; i <= n_props; i++) {
        const int32_t id = top_ids[(size_t)i * ld];
        const float v = top_vals[(size_t)i * ld];
        if (id < 0 || id >= vocab || !(v > -INFINITY)) { /* the lane fails; its commit is any valid count */
            r->status = 1, r->k = 0, r->j = 0, r->c = 1, r->out[0] = 0;
            return;
        }
        r->out[i] = id;
        k = i;
        if (i == n_props || props[i] != id) break;
    }
    const int j = splash_spec_first_stop(r->out, k, stop, n_stop), c = n_feed + j;
    r->k = k, r->j = j, r->c = c < limit ? c : limit;
}

#endif
