/* spec.h - the decisions of one speculative cycle, as pure functions of rows
 * of logits.
 *
 * The engine's decode cycle (runtime/engine.c) is: the draft proposes
 * (runtime/draft.h), splash_spec_select turns draft logits into proposals,
 * the target verifies [anchor, proposals] in one VERIFY forward, and
 * splash_spec_decide walks the target's rows and says which proposals stand
 * and which token follows them.  Both functions depend only on their
 * arguments - rows of logits, the request's sampling parameters and token
 * history, the positions - so the tests check the cycle's output
 * distribution on made-up rows (tests/unit/test_spec_cycle.c, a G-test over
 * 2-3 consecutive tokens) with the very code the engine runs.
 *
 * Conventions (shared/spec/dflash.md, "One decode cycle"):
 *   - row i of a block decides the token at position pos0 + i (positions as
 *     in sampling.h: the request's sequence index of the token decided);
 *   - the target's row i and the draft's row i are processed (penalties,
 *     temperature, filters) as if proposals 0..i-1 were already output
 *     (splash_sampler_process's `extra`);
 *   - draft proposal i is drawn from its processed q_i with the keyed stream
 *     (seed, pos0 + i, SPLASH_RNG_DRAFT); a greedy request takes q_i's argmax;
 *   - acceptance of proposal i: splash_spec_verify_row (ACCEPT coin, then the
 *     RESIDUAL draw at the first rejection); a greedy target row accepts iff
 *     the proposal is its argmax and replaces it by the argmax otherwise;
 *   - when every proposal stands, the last row's token is drawn from its p
 *     with (seed, pos0 + n, SPLASH_RNG_SAMPLE) - exactly splash_sample, so a
 *     block of one row (no draft) is today's plain decoding, same tokens.
 * Lossless: with x_i ~ q_i, accept-or-residual yields p_i exactly, row by
 * row, so the tokens have the target's joint distribution whatever the draft.
 *
 * A draft that picks its own proposals (DFlash 2's candidate selector) hands
 * over each row's q as a splash_spec_q: the candidates it drew from and their
 * probabilities, q = 0 elsewhere.  decide then uses that q as it is - q(x)
 * for the coin, max(p - q, 0) over the whole vocabulary for the residual -
 * instead of recomputing q from draft logits.
 */
#ifndef SPLASH_SPEC_H
#define SPLASH_SPEC_H

#include <stdint.h>

#include "runtime/sampling.h"

/* One draft row's distribution over its candidates (a sparse draft). */
#define SPLASH_SPEC_MAX_CAND 64
typedef struct splash_spec_q {
    int n;                             /* candidates */
    int32_t ids[SPLASH_SPEC_MAX_CAND]; /* distinct, any order */
    float p[SPLASH_SPEC_MAX_CAND];     /* q of each (the proposal's must be positive) */
} splash_spec_q;

/* Proposals from draft logits [n][vocab]: props[i] from q_i as above. */
int splash_spec_select(splash_sampler *s, splash_dist *q, const splash_sampling_params *sp,
                       const splash_token_history *h, const float *draft, int n, uint64_t pos0, int32_t *props,
                       splash_error *err);

typedef struct splash_spec_block {
    const float *target;   /* [n + 1][vocab]: the target's rows after the anchor and each proposal */
    const float *draft;    /* [n][vocab] the draft logits props were selected from; NULL: deterministic props */
    const int32_t *props;  /* [n] */
    int n;
    uint64_t pos0;         /* position decided by row 0 */
    const int32_t *forced; /* [n + 1] test script: row i's token is forced[i] (a point-mass p), or NULL */
    const splash_spec_q *sparse; /* [n] each proposal's q as the draft drew it (draft must be NULL), or NULL */
    const int32_t *top_ids;      /* when not NULL: the target's rows as TOP rows (runtime/model.h) of top_n */
    const float *top_logits;     /* entries each, [n + 1][top_n], instead of target (splash_sampler_process_top: */
    int top_n;                   /* the request then has no penalties, and needs at most top_n entries) */
} splash_spec_block;

/* Walks the rows: returns k, the proposals accepted (0..n), and fills
 * out[0..k]: props[0..k) and then row k's token (the residual draw at the
 * first rejection, or row n's sample when all stood).  q: scratch of
 * capacity vocab (the draft's distributions are recomputed from b->draft,
 * exactly as select computed them; or built from b->sparse).  Negative
 * status on bad rows, and on a sparse q that gives its proposal no mass. */
int splash_spec_decide(splash_sampler *s, splash_dist *q, const splash_sampling_params *sp,
                       const splash_token_history *h, const splash_spec_block *b, int32_t *out, splash_error *err);

#endif
