/* The step planner (runtime/scheduler.h): shortest prompt first, the overtake
 * cap, decode rows in every step, the budget under contention, admission
 * order, and no starvation over a long random run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/scheduler.h"

static splash_sched_lane prefill(int remaining, uint64_t arrival) {
    return (splash_sched_lane){.active = 1, .remaining = remaining, .arrival = arrival};
}

static splash_sched_lane decoding(uint64_t arrival) {
    return (splash_sched_lane){.active = 1, .decoding = 1, .arrival = arrival};
}

static void test_shortest_first_packs_the_budget(void **state) {
    (void)state;
    splash_sched s;
    splash_sched_init(&s, 256, 64, 0.5);
    splash_sched_lane l[4] = {prefill(1000, 1), prefill(100, 2), prefill(30, 3), {0}};
    assert_int_equal(splash_sched_plan(&s, l, 4), 256);
    assert_int_equal(l[2].rows, 30);  /* shortest: all of it */
    assert_int_equal(l[1].rows, 100); /* next */
    assert_int_equal(l[0].rows, 126); /* the rest of the budget */
    assert_int_equal(l[3].rows, 0);   /* inactive */
    /* the oldest got less than its share of 256 while later arrivals ran */
    assert_int_equal(l[0].overtaken, 1);
    assert_int_equal(l[1].overtaken, 0);
    assert_int_equal(l[2].overtaken, 0);
}

static void test_snapshot_limit_and_ties(void **state) {
    (void)state;
    splash_sched s;
    splash_sched_init(&s, 256, 64, 0.5);
    /* equal remaining: priority (lower first), then arrival; limit caps a lane */
    splash_sched_lane l[3] = {prefill(200, 1), prefill(200, 2), prefill(200, 3)};
    l[2].priority = -1;
    l[0].limit = 32;
    assert_int_equal(splash_sched_plan(&s, l, 3), 256);
    assert_int_equal(l[2].rows, 200);
    assert_int_equal(l[0].rows, 32);
    assert_int_equal(l[1].rows, 24);
    assert_int_equal(l[0].overtaken, 0); /* it got all it could use */
    assert_int_equal(l[1].overtaken, 1); /* lane 2 arrived later and ran */
}

static void test_overtake_cap(void **state) {
    (void)state;
    splash_sched s;
    splash_sched_init(&s, 64, 64, 0.5);
    splash_sched_lane l[2] = {prefill(1000, 1), prefill(0, 0)};
    /* a stream of short later arrivals on lane 1 overtakes lane 0 three times */
    for (int k = 0; k < 3; k++) {
        l[1] = prefill(10, 2 + (uint64_t)k);
        splash_sched_plan(&s, l, 2);
        assert_int_equal(l[1].rows, 10);
        assert_int_equal(l[0].rows, 54);
        assert_int_equal(l[0].overtaken, k + 1);
    }
    /* the fourth time lane 0 goes first and takes the whole budget */
    l[1] = prefill(10, 9);
    splash_sched_plan(&s, l, 2);
    assert_int_equal(l[0].rows, 64);
    assert_int_equal(l[1].rows, 0);
    assert_int_equal(l[0].overtaken, 0);
    assert_int_equal(l[1].overtaken, 0); /* passed by an earlier arrival: not overtaken */
    /* and then shortest-first again */
    splash_sched_plan(&s, l, 2);
    assert_int_equal(l[1].rows, 10);
    assert_int_equal(l[0].rows, 54);
}

static void test_decode_rows_always_ride_along(void **state) {
    (void)state;
    splash_sched s;
    splash_sched_init(&s, 256, 64, 0.5);
    splash_sched_lane l[5] = {decoding(1), prefill(5000, 2), decoding(3), prefill(7000, 4), decoding(5)};
    int total = splash_sched_plan(&s, l, 5);
    assert_int_equal(l[0].rows, 1);
    assert_int_equal(l[2].rows, 1);
    assert_int_equal(l[4].rows, 1);
    assert_int_equal(l[1].rows, 256); /* nothing measured yet: the whole budget */
    assert_int_equal(l[3].rows, 0);
    assert_int_equal(total, 259);
    /* decoding lanes only */
    splash_sched_lane d[3] = {decoding(1), decoding(2), {0}};
    assert_int_equal(splash_sched_plan(&s, d, 3), 2);
    assert_int_equal(d[0].rows + d[1].rows + d[2].rows, 2);
}

/* A decoding lane's verify block (anchor + proposals) takes its rows out of
 * the slice: 4 ms a row and a 1.1 s target hold 275 rows; two 1-row lanes
 * leave 273 -> 256 (a multiple of 64), two 16-row blocks 243 -> 192. */
static void test_verify_blocks_count_in_the_budget(void **state) {
    (void)state;
    splash_sched s;
    splash_sched_init(&s, 1024, 64, 1.1);
    splash_sched_observe(&s, 100, 0.4); /* 4 ms a row */
    splash_sched_lane l[3] = {prefill(100000, 1), decoding(2), decoding(3)};
    int total = splash_sched_plan(&s, l, 3);
    assert_int_equal(l[1].rows, 1);
    assert_int_equal(l[0].rows, 256);
    assert_int_equal(total, 258);
    l[1].decode_rows = l[2].decode_rows = 16;
    total = splash_sched_plan(&s, l, 3);
    assert_int_equal(l[1].rows, 16);
    assert_int_equal(l[2].rows, 16);
    assert_int_equal(l[0].rows, 192);
    assert_int_equal(total, 224);
}

static void test_budget_shrinks_and_grows(void **state) {
    (void)state;
    splash_sched s;
    splash_sched_init(&s, 1024, 64, 0.5);
    splash_sched_lane l[2] = {prefill(100000, 1), decoding(2)};
    splash_sched_plan(&s, l, 2);
    assert_int_equal(l[0].rows, 1024);
    /* 1025 rows took 4.1 s: 4 ms a row, 0.5 s holds 125 rows - 1 decode row -> 124 -> 64 (multiple of 64) */
    splash_sched_observe(&s, 1025, 4.1);
    splash_sched_plan(&s, l, 2);
    assert_int_equal(l[0].rows, 64);
    assert_int_equal(l[1].rows, 1);
    /* faster steps: 65 rows in 13 ms (0.2 ms a row) -> smoothed 2.1 ms -> 238 - 1 -> 192 */
    splash_sched_observe(&s, 65, 0.013);
    splash_sched_plan(&s, l, 2);
    assert_int_equal(l[0].rows, 192);
    for (int i = 0; i < 20; i++) splash_sched_observe(&s, 193, 193 * 0.0002);
    splash_sched_plan(&s, l, 2);
    assert_int_equal(l[0].rows, 1024); /* 2500 rows fit the target: capped at the maximum */
    /* very slow rows: never under the minimum */
    for (int i = 0; i < 20; i++) splash_sched_observe(&s, 65, 65 * 1.0);
    splash_sched_plan(&s, l, 2);
    assert_int_equal(l[0].rows, 64);
    /* no lane decodes: no contention, the whole budget whatever the timing */
    l[1].active = 0;
    splash_sched_plan(&s, l, 2);
    assert_int_equal(l[0].rows, 1024);
}

static void test_admission_order(void **state) {
    (void)state;
    assert_true(splash_sched_better(-1, 9, 0, 1));  /* lower priority value first */
    assert_false(splash_sched_better(0, 1, -1, 9));
    assert_true(splash_sched_better(0, 1, 0, 2));   /* then arrival */
    assert_false(splash_sched_better(0, 2, 0, 1));
    assert_false(splash_sched_better(0, 1, 0, 1));
}

/* A simulated engine: 4 lanes, requests with random prompt lengths, snapshot
 * limits and outputs arriving at random for STEPS steps, then drained;
 * prefill advances by the plan, decode by one row.  Timing feeds back a
 * made-up cost (5 ms + 1 ms a row).  Overtakes are counted here from the
 * plans themselves (short of min(wants, budget) while a later arrival ran
 * prefill rows), independently of the planner's own counter. */
static void test_no_starvation_random(void **state) {
    (void)state;
    enum { LANES = 4, STEPS = 20000 };
    splash_sched s;
    splash_sched_init(&s, 256, 64, 0.2);
    splash_sched_lane l[LANES];
    int out_left[LANES], born[LANES], overtakes[LANES];
    memset(l, 0, sizeof l);
    uint64_t arrival = 0;
    unsigned seed = 12345;
    int arrived = 0, finished = 0, worst_overtakes = 0, worst_prefill = 0, step = 0;
    for (; step < STEPS || finished < arrived; step++) {
        assert_true(step < STEPS + 100000); /* the drain ends */
        for (int i = 0; i < LANES && step < STEPS; i++) {
            seed = seed * 1103515245u + 12345u;
            if (!l[i].active && (seed >> 16) % 4 == 0) { /* a new request arrives on a free lane */
                seed = seed * 1103515245u + 12345u;
                int len = (seed >> 8) % 8 ? 1 + (int)((seed >> 12) % 300) : 2000 + (int)((seed >> 12) % 3000);
                l[i] = prefill(len, ++arrival);
                l[i].priority = (int)((seed >> 20) % 3) - 1;
                l[i].limit = (seed >> 4) % 2 ? 0 : 1 + (int)((seed >> 24) % 200);
                out_left[i] = 1 + (int)((seed >> 14) % 40);
                born[i] = step;
                overtakes[i] = 0;
                arrived++;
            }
        }
        int want[LANES];
        for (int i = 0; i < LANES; i++) {
            want[i] = l[i].remaining;
            if (l[i].limit > 0 && l[i].limit < want[i]) want[i] = l[i].limit;
        }
        int total = splash_sched_plan(&s, l, LANES), sum = 0, pre = 0;
        for (int i = 0; i < LANES; i++) sum += l[i].rows;
        assert_int_equal(total, sum);
        for (int i = 0; i < LANES; i++) {
            if (!l[i].active) {
                assert_int_equal(l[i].rows, 0);
                continue;
            }
            if (l[i].decoding) {
                assert_int_equal(l[i].rows, 1); /* every decoding lane, every step */
                if (--out_left[i] == 0) l[i].active = 0, finished++;
                continue;
            }
            pre += l[i].rows;
            assert_true(l[i].rows <= want[i]);
            int share = want[i] < s.budget ? want[i] : s.budget, passed = 0;
            for (int j = 0; j < LANES; j++)
                passed |= l[j].active && !l[j].decoding && l[j].rows > 0 && l[j].arrival > l[i].arrival;
            if (l[i].rows >= share) overtakes[i] = 0;
            else if (passed) overtakes[i]++;
            if (overtakes[i] > worst_overtakes) worst_overtakes = overtakes[i];
        }
        for (int i = 0; i < LANES; i++) {
            if (!l[i].active || l[i].decoding) continue;
            l[i].remaining -= l[i].rows;
            if (l[i].rows && l[i].limit > 0) l[i].limit = 1 + (int)((seed >> 3) % 200); /* next snapshot point */
            if (!l[i].remaining) {
                l[i].decoding = 1;
                if (step - born[i] > worst_prefill) worst_prefill = step - born[i];
            }
        }
        assert_true(pre <= s.budget);
        assert_true(s.budget >= 64 && s.budget <= 256);
        if (pre) splash_sched_observe(&s, sum, 0.005 + 0.001 * sum);
    }
    assert_true(arrived > 1000);
    assert_int_equal(finished, arrived);
    assert_int_equal(worst_overtakes, SPLASH_SCHED_MAX_OVERTAKEN); /* reached, never passed */
    print_message("steps %d, requests %d, longest prefill %d steps\n", step, arrived, worst_prefill);
    /* at >= 64 rows a step, the 4 lanes' prompts (<= 5000 rows each) take at most ~320 steps */
    assert_true(worst_prefill <= 4 * 5000 / 64 + 4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shortest_first_packs_the_budget),
        cmocka_unit_test(test_snapshot_limit_and_ties),
        cmocka_unit_test(test_overtake_cap),
        cmocka_unit_test(test_decode_rows_always_ride_along),
        cmocka_unit_test(test_budget_shrinks_and_grows),
        cmocka_unit_test(test_verify_blocks_count_in_the_budget),
        cmocka_unit_test(test_admission_order),
        cmocka_unit_test(test_no_starvation_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
