/* dflash2_draft.h - the DFlash 2 draft behind runtime/draft.h's ops.
 *
 * Unlike v1, whose proposals the runtime selects from draft logits, DFlash 2
 * picks its own proposals with its candidate selector (dflash2.h), so its
 * propose returns SPLASH_DRAFT_SPARSE: the picks plus each row's q over its
 * top_k candidates, which the cycle's rejection sampling then uses
 * (runtime/spec.h, splash_spec_q).  The two steps around the selector - its
 * arguments from a request, and its rows as the cycle's proposals - are
 * exported so the cycle's distribution test (tests/unit/test_spec_cycle.c)
 * runs the very code the engine does on a hand-made selector.
 */
#ifndef SPLASH_DFLASH2_DRAFT_H
#define SPLASH_DFLASH2_DRAFT_H

#include <stdint.h>

#include "base/status.h"
#include "models/dflash/dflash2.h"
#include "runtime/draft.h"

/* The package's DFlash 2 draft (draft.architecture "dflash2"): one
 * splash_dflash2 and a state per lane, windowed as v1 (options.window). */
int splash_dflash2_draft_open(splash_package *pkg, const splash_draft_options *opt, splash_draft **out,
                              splash_error *err);

/* The selector's arguments for proposals at positions pos0 .. pos0+n-1 of a
 * request: greedy at temperature 0; otherwise T = the request's temperature
 * and uniform[i] = splash_rng_uniform_f32(seed, pos0 + i, SPLASH_RNG_DRAFT, 0).
 * No mask (grammars will plug in here).  uniform: [n] storage the args
 * point into. */
void splash_dflash2_draft_args(const splash_sampling_params *sp, uint64_t pos0, int n, float *uniform,
                               splash_dflash2_select_args *a);

/* The selector's rows as proposals: tokens[i] = rows[i].token and q[i] its
 * candidates with their q. */
void splash_dflash2_draft_rows(const splash_dflash2_row *rows, int n, int32_t *tokens, splash_spec_q *q);

#endif
