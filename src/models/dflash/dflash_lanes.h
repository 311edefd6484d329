/* dflash_lanes.h - the draft-interface glue DFlash v1 and v2 share
 * (dflash_draft.c, dflash2_draft.c): one model and one windowed context
 * cache per engine lane behind runtime/draft.h's ops.
 *
 * Each version's impl struct starts with a splash_dflash_lanes, so the ops
 * that only move a lane's cache (append, reset, snapshot, restore) are these
 * functions for both, and the open / free code keeps only the version's own
 * load, states and propose.  The lanes see the caches through dflash_ctx.h
 * (the versions' states wrap a splash_dflash_kv).
 */
#ifndef SPLASH_DFLASH_LANES_H
#define SPLASH_DFLASH_LANES_H

#include "models/dflash/dflash_ctx.h"
#include "runtime/draft.h"

typedef struct splash_dflash_lanes {
    const char *name;      /* "dflash" / "dflash2": the prefix of error messages */
    splash_dflash_ctx *c;  /* the model's shared part */
    splash_dflash_kv **kv; /* [lanes] each lane state's cache */
    int lanes;
    int max_block;         /* the model's, at most SPLASH_DRAFT_MAX_BLOCK */
    float *hidden;         /* [max_block][hidden] the block's final-normed states */
} splash_dflash_lanes;

/* The model's load options from the runtime's (window 2048 and one lane when
 * unset, the CPU activations; max_block left to the caller). */
splash_dflash_options splash_dflash_lanes_options(const splash_draft_options *opt, int *window, int *lanes);
/* After the model's load: kv (filled by the caller) and hidden.  L zeroed before;
 * release it on failure too. */
int splash_dflash_lanes_init(splash_dflash_lanes *L, const char *name, splash_dflash_ctx *c, int lanes,
                             splash_error *err);
void splash_dflash_lanes_release(splash_dflash_lanes *L);
/* Checks the lane and moves its cache to pos (a gap: positions without taps). */
int splash_dflash_lanes_reach(splash_dflash_lanes *L, int lane, int pos, splash_error *err);

/* runtime/draft.h ops; impl starts with a splash_dflash_lanes. */
int splash_dflash_lanes_append(void *impl, int lane, int pos, const float *taps, int n, splash_error *err);
void splash_dflash_lanes_reset(void *impl, int lane);
void splash_dflash_lanes_snapshot(void *impl, int lane, void *dst);
int splash_dflash_lanes_restore(void *impl, int lane, const void *src, splash_error *err);

/* Fills dr from the loaded lanes (the caches made): ops, impl, sizes, taps. */
int splash_dflash_lanes_describe(const splash_dflash_lanes *L, const splash_draft_ops *ops, void *impl, int window,
                                 splash_draft *dr, splash_error *err);

#endif
