/* block_policy.c - see block_policy.h. */
#include "runtime/block_policy.h"

/* Weight of a new step in the moving averages: a change of text or load is
 * followed within ~10 steps of a way, one slow step moves it by a fifth. */
#define ALPHA 0.2

int splash_block_bucket(int lanes) {
    return lanes <= 1 ? 0 : lanes == 2 ? 1 : lanes <= 4 ? 2 : lanes <= 8 ? 3 : 4;
}

double splash_block_rate_of(const splash_block_policy *p, int lanes, int spec) {
    const splash_block_rate *r = &p->r[splash_block_bucket(lanes)][spec ? 1 : 0];
    return r->n && r->sec > 0 ? r->tok * (double)(lanes < 1 ? 1 : lanes) / r->sec : 0;
}

int splash_block_best(const splash_block_policy *p, int lanes) {
    const splash_block_rate *r = p->r[splash_block_bucket(lanes)];
    if (r[0].n < SPLASH_BLOCK_MIN_SAMPLES || r[1].n < SPLASH_BLOCK_MIN_SAMPLES) return -1;
    /* per lane: tokens / seconds of each way (the lanes' count is the bucket's for both) */
    return r[1].tok * r[0].sec >= r[0].tok * r[1].sec;
}

int splash_block_choose(splash_block_policy *p, int lanes) {
    const int b = splash_block_bucket(lanes);
    const uint64_t k = p->steps[b]++;
    if (p->r[b][1].n < SPLASH_BLOCK_MIN_SAMPLES) return 1; /* measure speculation first: the usual winner */
    if (p->r[b][0].n < SPLASH_BLOCK_MIN_SAMPLES) return 0;
    const int best = splash_block_best(p, lanes);
    /* the other way once in SPLASH_BLOCK_PROBE steps, or in as many more as its
     * step is longer (a CPU's 8-row step can cost 7 of one row's): probes
     * then take ~1/SPLASH_BLOCK_PROBE of the time whichever way wins */
    const double ratio = p->r[b][!best].sec / p->r[b][best].sec;
    const uint64_t every = SPLASH_BLOCK_PROBE * (uint64_t)(ratio > 1 ? (ratio < 64 ? ratio + 0.5 : 64) : 1);
    return p->last_probe[b] + every <= k ? (p->last_probe[b] = k, !best) : best;
}

void splash_block_observe(splash_block_policy *p, int lanes, int spec, double seconds, int tokens) {
    if (lanes < 1 || !(seconds > 0) || tokens < 0) return;
    splash_block_rate *r = &p->r[splash_block_bucket(lanes)][spec ? 1 : 0];
    if (!r->warm) { /* a way's first step at a lane count pays one-time costs (a graph's capture): not counted */
        r->warm = 1;
        return;
    }
    const double tok = (double)tokens / lanes;
    if (!r->n) {
        r->sec = seconds, r->tok = tok;
    } else {
        if (seconds > 3 * r->sec) seconds = 3 * r->sec; /* one slow step (a capture, a stall) moves it less */
        r->sec += ALPHA * (seconds - r->sec), r->tok += ALPHA * (tok - r->tok);
    }
    if (r->n < 1 << 30) r->n++;
}
