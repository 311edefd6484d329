/* scheduler.h - what the engine runs next: a pure planning function.
 *
 * The engine thread asks, before every forward call, how many rows each lane
 * gets.  The answer depends only on the lanes' states and the scheduler's own
 * figures (the prefill budget and the measured cost of a row), never on the
 * model or the clock, so it can be tested exhaustively without a model.
 *
 * The policy (shared/spec/engine.md "Scheduler"):
 *  - every decoding lane gets its verify block in every step, so a long prompt
 *    stalls other streams' tokens for at most one slice;
 *  - prefill lanes share a row budget, shortest remaining prompt first
 *    (ties: priority, then arrival); a lane that wanted rows and did not get
 *    them all while a lane that arrived after it got some has been overtaken;
 *    after SPLASH_SCHED_MAX_OVERTAKEN such steps it goes first until it gets
 *    its full share;
 *  - the budget is max_budget when no lane decodes (nothing waits on the
 *    slice), and under contention shrinks toward target_s: from the observed
 *    seconds per row of previous steps, budget = target_s / row_seconds minus
 *    the decode rows, clamped to [min_budget, max_budget] and rounded down to
 *    a multiple of min_budget (the chunked GDN works in chunks of 64).  It
 *    grows back the same way when steps get faster.
 *
 * Admission (which queued request takes a free lane) is by priority, then
 * arrival: splash_sched_better.  Lower priority values are served first
 * (default 0), as in vLLM's request priority.
 */
#ifndef SPLASH_SCHEDULER_H
#define SPLASH_SCHEDULER_H

#include <stdint.h>

#define SPLASH_SCHED_MAX_OVERTAKEN 3

/* One lane as the scheduler sees it.  The engine fills the inputs; plan
 * writes rows and updates overtaken (which the engine keeps per lane,
 * zeroed when a request takes the lane). */
typedef struct splash_sched_lane {
    int active;      /* a request holds the lane */
    int decoding;    /* 1: it decodes (a verify block); 0: it reads its prompt */
    int decode_rows; /* decoding: rows of its verify block (<= 0: 1) */
    int remaining;   /* prefill: prompt rows still to run */
    int limit;       /* prefill: most rows this step (a snapshot is due there), <= 0: none */
    int priority;    /* lower first (a tie-break among equal remaining) */
    uint64_t arrival; /* admission order: smaller arrived earlier */
    int overtaken;   /* in/out: steps it was overtaken since it last got its share */
    int rows;        /* out: rows this step (0: not in the batch) */
} splash_sched_lane;

typedef struct splash_sched {
    int max_budget;    /* prefill rows per step at most (the engine's chunk) */
    int min_budget;    /* ... and at least, under contention (64) */
    double target_s;   /* a slice's time target under contention (0.5 s on the CPU) */
    double row_s;      /* observed seconds per row (smoothed), 0 = nothing measured yet */
    int budget;        /* the prefill budget of the last plan */
} splash_sched;

/* max_budget > 0; min_budget is capped at max_budget; target_s > 0. */
void splash_sched_init(splash_sched *s, int max_budget, int min_budget, double target_s);

/* Plans the next step for lanes[0..n): sets every lane's rows and updates
 * overtaken.  Returns the total rows planned (decode + prefill). */
int splash_sched_plan(splash_sched *s, splash_sched_lane *lanes, int n);

/* Feeds back the timing of a step that ran prefill rows: rows run (prefill
 * + decode) and seconds.  seconds / rows over-counts the step's fixed cost
 * (weight traffic), but the budget it gives still converges to the target:
 * with a step costing D + rows * c, the fixed point is D + budget * c =
 * target_s and it is stable while D < target_s. */
void splash_sched_observe(splash_sched *s, int rows, double seconds);

/* 1 when a request (priority pa, arrival aa) is admitted before (pb, ab). */
static inline int splash_sched_better(int pa, uint64_t aa, int pb, uint64_t ab) {
    return pa != pb ? pa < pb : aa < ab;
}

#endif
