/* block_policy.h - the decode block chosen step by step from measured rates
 * (the engine's "auto" block size).
 *
 * A step's decoding lanes can speculate (the engine's block B: the anchor and
 * B - 1 proposals) or not (block 1).  Which gives more tokens a second
 * depends on how much of the draft the target accepts on this text and on
 * what B rows cost against one on this machine with this many lanes beside
 * each other (measured in session 19 on the H200: the default model at one
 * lane 3,800 tokens/s at block 8 against 2,634 at block 1, at four lanes 4,336
 * against 6,781; on a 2-core CPU block 8 loses at any count).  Both are
 * measured here, from the engine's decode-only steps, per bucket of decoding
 * lanes (1, 2, 3-4, 5-8, more): a moving average of a step's seconds and of
 * its tokens per lane, for each way (a way's first step in a bucket is not
 * counted, it pays one-time costs such as a CUDA graph's capture; a step
 * slower than 3x the average counts as 3x).  Each way runs until a bucket holds
 * SPLASH_BLOCK_MIN_SAMPLES steps of it; from then on the faster one runs and
 * the other is tried once every SPLASH_BLOCK_PROBE steps of the bucket (times
 * its step's cost over the faster one's, so probing takes ~3% of the time),
 * so a change of text or load is seen.
 *
 * Greedy output does not depend on the block; sampled output does (the
 * rejection step draws from max(p - q, 0), dflash.md), so the engine applies
 * the choice to greedy requests and to requests without a seed of their own
 * only: a seeded request keeps the engine's block and its output stays
 * reproducible.
 */
#ifndef SPLASH_BLOCK_POLICY_H
#define SPLASH_BLOCK_POLICY_H

#include <stdint.h>

#define SPLASH_BLOCK_BUCKETS 5
#define SPLASH_BLOCK_MIN_SAMPLES 4 /* steps of each way in a bucket before the rates decide */
#define SPLASH_BLOCK_PROBE 32      /* then one step in this many runs the slower way */

typedef struct splash_block_rate {
    double sec;   /* moving average of a step's seconds */
    double tok;   /* ... and of its tokens per lane */
    int n;        /* steps counted (saturates) */
    int warm;     /* the first step was seen (and not counted: block_policy.c) */
} splash_block_rate;

typedef struct splash_block_policy {
    splash_block_rate r[SPLASH_BLOCK_BUCKETS][2]; /* [bucket][0: block 1, 1: speculate] */
    uint64_t steps[SPLASH_BLOCK_BUCKETS];         /* choices made in the bucket */
    uint64_t last_probe[SPLASH_BLOCK_BUCKETS];    /* the step of its last probe of the slower way */
} splash_block_policy;

/* The bucket of `lanes` decoding lanes (>= 1). */
int splash_block_bucket(int lanes);
/* The faster way in the bucket of `lanes` as measured: 1 speculate, 0 block
 * 1, -1 not yet measured (fewer than SPLASH_BLOCK_MIN_SAMPLES steps of a way). */
int splash_block_best(const splash_block_policy *p, int lanes);
/* 1: speculate this step, 0: block 1 (counts the step in the bucket). */
int splash_block_choose(splash_block_policy *p, int lanes);
/* A decode-only step that ran `lanes` lanes the way `spec` took `seconds` and
 * gave `tokens` tokens over those lanes. */
void splash_block_observe(splash_block_policy *p, int lanes, int spec, double seconds, int tokens);
/* Tokens a second of each way in the bucket of `lanes` (0 when not measured). */
double splash_block_rate_of(const splash_block_policy *p, int lanes, int spec);

#endif
