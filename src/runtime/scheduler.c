/* scheduler.c - the step planner (see scheduler.h for the policy).
 *
 * Kept free of the engine's types and of the clock so that every rule can be
 * tested on made-up lanes.  A handful of lanes per call, so picking the best
 * remaining candidate again for each share (quadratic) is all the ordering
 * needs, and no array is sized by a guess.
 */
#include "runtime/scheduler.h"

void splash_sched_init(splash_sched *s, int max_budget, int min_budget, double target_s) {
    s->max_budget = max_budget > 0 ? max_budget : 1;
    s->min_budget = min_budget > 0 && min_budget < s->max_budget ? min_budget : s->max_budget;
    s->target_s = target_s > 0 ? target_s : 0.5;
    s->row_s = 0;
    s->budget = s->max_budget;
}

/* The prefill budget for a step whose decoding lanes run n_decode rows. */
static int budget_for(const splash_sched *s, int n_decode) {
    if (!n_decode || s->row_s <= 0) return s->max_budget; /* nobody waits, or nothing measured yet */
    double want = s->target_s / s->row_s - n_decode;
    if (want >= s->max_budget) return s->max_budget;
    if (want <= s->min_budget) return s->min_budget;
    int b = (int)want / s->min_budget * s->min_budget;
    return b < s->min_budget ? s->min_budget : b;
}

/* Prefill order: overtaken-out lanes first (by arrival), then shortest
 * remaining, then priority, then arrival. */
static int goes_before(const splash_sched_lane *a, const splash_sched_lane *b) {
    int fa = a->overtaken >= SPLASH_SCHED_MAX_OVERTAKEN, fb = b->overtaken >= SPLASH_SCHED_MAX_OVERTAKEN;
    if (fa != fb) return fa;
    if (fa) return a->arrival < b->arrival;
    if (a->remaining != b->remaining) return a->remaining < b->remaining;
    return splash_sched_better(a->priority, a->arrival, b->priority, b->arrival);
}

/* Rows a prefill lane could use this step, ignoring the other lanes. */
static int wants(const splash_sched_lane *l) {
    int w = l->remaining;
    if (l->limit > 0 && l->limit < w) w = l->limit;
    return w > 0 ? w : 0;
}

int splash_sched_plan(splash_sched *s, splash_sched_lane *lanes, int n) {
    int n_decode = 0;
    for (int i = 0; i < n; i++) {
        splash_sched_lane *l = &lanes[i];
        l->rows = 0;
        if (l->active && l->decoding) {
            l->rows = l->decode_rows > 0 ? l->decode_rows : 1;
            n_decode += l->rows;
        } else if (l->active && wants(l)) {
            l->rows = -1; /* a prefill candidate not served yet */
        }
    }
    int budget = budget_for(s, n_decode), left = budget;
    s->budget = budget;
    while (left > 0) { /* the best candidate left takes what it wants of the budget */
        int best = -1;
        for (int i = 0; i < n; i++)
            if (lanes[i].rows < 0 && (best < 0 || goes_before(&lanes[i], &lanes[best]))) best = i;
        if (best < 0) break;
        int r = wants(&lanes[best]);
        lanes[best].rows = r < left ? r : left;
        left -= lanes[best].rows;
    }
    for (int i = 0; i < n; i++)
        if (lanes[i].rows < 0) lanes[i].rows = 0;
    /* overtaken: short of its share while a later arrival ran prefill rows */
    for (int i = 0; i < n; i++) {
        splash_sched_lane *l = &lanes[i];
        if (!l->active || l->decoding || !wants(l)) continue;
        int share = wants(l) < budget ? wants(l) : budget;
        if (l->rows >= share) {
            l->overtaken = 0;
            continue;
        }
        for (int j = 0; j < n; j++)
            if (!lanes[j].decoding && lanes[j].rows > 0 && lanes[j].arrival > l->arrival) {
                l->overtaken++;
                break;
            }
    }
    return n_decode + budget - left;
}

void splash_sched_observe(splash_sched *s, int rows, double seconds) {
    if (rows <= 0 || seconds <= 0) return;
    double x = seconds / rows;
    s->row_s = s->row_s > 0 ? 0.5 * s->row_s + 0.5 * x : x;
}
