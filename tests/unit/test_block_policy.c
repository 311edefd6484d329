/* The auto block's choice (runtime/block_policy.h) on made-up step costs:
 * each way measured first, then the faster one with a probe of the other,
 * lane buckets apart, a change of costs followed, bad samples ignored. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "runtime/block_policy.h"

/* Runs n steps at `lanes` lanes where a block-1 step takes plain_s and gives
 * a token a lane, a speculating one spec_s and spec_tok tokens a lane;
 * counts[way] gets the steps each way ran. */
static void drive(splash_block_policy *p, int lanes, int n, double plain_s, double spec_s, double spec_tok,
                  int counts[2]) {
    for (int i = 0; i < n; i++) {
        const int spec = splash_block_choose(p, lanes);
        counts[spec]++;
        splash_block_observe(p, lanes, spec, spec ? spec_s : plain_s, (int)(spec ? spec_tok * lanes : lanes));
    }
}

static void test_measures_both_then_picks_the_faster(void **state) {
    (void)state;
    splash_block_policy p;
    memset(&p, 0, sizeof p);
    assert_int_equal(splash_block_best(&p, 1), -1);
    /* the first steps: speculation, then block 1, SPLASH_BLOCK_MIN_SAMPLES each
     * after one not counted (a first step's one-time costs: 10x here) */
    for (int i = 0; i <= SPLASH_BLOCK_MIN_SAMPLES; i++) {
        assert_int_equal(splash_block_choose(&p, 1), 1);
        splash_block_observe(&p, 1, 1, i ? 0.010 : 0.100, 4); /* 400 tokens/s */
    }
    assert_int_equal(splash_block_best(&p, 1), -1);
    for (int i = 0; i <= SPLASH_BLOCK_MIN_SAMPLES; i++) {
        assert_int_equal(splash_block_choose(&p, 1), 0);
        splash_block_observe(&p, 1, 0, 0.005, 1); /* 200 tokens/s */
    }
    assert_int_equal(splash_block_best(&p, 1), 1);
    assert_true(splash_block_rate_of(&p, 1, 1) > 399 && splash_block_rate_of(&p, 1, 1) < 401);
    assert_true(splash_block_rate_of(&p, 1, 0) > 199 && splash_block_rate_of(&p, 1, 0) < 201);
    /* then the faster way, and one probe of the other in SPLASH_BLOCK_PROBE steps */
    int c[2] = {0, 0};
    drive(&p, 1, 4 * SPLASH_BLOCK_PROBE, 0.005, 0.010, 4, c);
    assert_int_equal(c[0], 4);
    assert_int_equal(c[1], 4 * SPLASH_BLOCK_PROBE - 4);
    /* a stall of 50x moves the average by at most 3x a fifth */
    splash_block_observe(&p, 1, 1, 0.5, 4);
    assert_true(splash_block_rate_of(&p, 1, 1) > 400 / 1.41 && splash_block_best(&p, 1) == 1);
}

static void test_block_1_wins_when_the_draft_misses(void **state) {
    (void)state;
    splash_block_policy p;
    memset(&p, 0, sizeof p);
    int c[2] = {0, 0};
    /* a draft the target rejects: 1.1 tokens a lane for 3x the step */
    drive(&p, 1, 200, 0.004, 0.012, 1.1, c);
    assert_int_equal(splash_block_best(&p, 1), 0);
    assert_true(c[0] > 180);
    /* a speculating step 7x block 1's (a CPU): probed once in 7 x SPLASH_BLOCK_PROBE steps */
    memset(&p, 0, sizeof p);
    drive(&p, 1, 20, 0.002, 0.014, 1.5, c);
    memset(c, 0, sizeof c);
    drive(&p, 1, 10 * 7 * SPLASH_BLOCK_PROBE, 0.002, 0.014, 1.5, c);
    assert_true(c[1] >= 9 && c[1] <= 11);
}

static void test_buckets_apart(void **state) {
    (void)state;
    splash_block_policy p;
    memset(&p, 0, sizeof p);
    int c1[2] = {0, 0}, c4[2] = {0, 0};
    /* one lane: speculation 2.7x the tokens for 1.6x the step; four lanes: 2.7x the tokens for 4.4x */
    for (int i = 0; i < 100; i++) {
        drive(&p, 1, 1, 0.006, 0.0096, 2.7, c1);
        drive(&p, 4, 1, 0.0065, 0.0286, 2.7, c4);
    }
    assert_int_equal(splash_block_best(&p, 1), 1);
    assert_int_equal(splash_block_best(&p, 4), 0);
    assert_int_equal(splash_block_best(&p, 3), 0); /* 3 and 4 lanes: one bucket */
    assert_int_equal(splash_block_best(&p, 2), -1); /* never measured */
    assert_true(c1[1] > 85 && c4[0] > 85);
}

static void test_follows_a_change(void **state) {
    (void)state;
    splash_block_policy p;
    memset(&p, 0, sizeof p);
    int c[2] = {0, 0};
    drive(&p, 2, 100, 0.005, 0.008, 5, c); /* code: the draft hits */
    assert_int_equal(splash_block_best(&p, 2), 1);
    memset(c, 0, sizeof c);
    drive(&p, 2, 400, 0.005, 0.008, 1.05, c); /* prose: it misses; the probes of block 1 see it */
    assert_int_equal(splash_block_best(&p, 2), 0);
    assert_true(c[0] > 300);
}

static void test_bad_samples_ignored(void **state) {
    (void)state;
    splash_block_policy p;
    memset(&p, 0, sizeof p);
    splash_block_observe(&p, 1, 1, 0.01, 4); /* the first step of a way: not counted */
    assert_int_equal(p.r[0][1].n, 0);
    assert_int_equal(p.r[0][1].warm, 1);
    p.r[0][1].warm = 0;
    splash_block_observe(&p, 0, 1, 0.01, 4);
    splash_block_observe(&p, 1, 1, 0.0, 4);
    splash_block_observe(&p, 1, 1, -1.0, 4);
    splash_block_observe(&p, 1, 1, 0.01, -2);
    for (int b = 0; b < SPLASH_BLOCK_BUCKETS; b++) assert_int_equal(p.r[b][0].n + p.r[b][1].n, 0);
    assert_int_equal(splash_block_bucket(1), 0);
    assert_int_equal(splash_block_bucket(2), 1);
    assert_int_equal(splash_block_bucket(4), 2);
    assert_int_equal(splash_block_bucket(8), 3);
    assert_int_equal(splash_block_bucket(64), 4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_measures_both_then_picks_the_faster),
        cmocka_unit_test(test_block_1_wins_when_the_draft_misses),
        cmocka_unit_test(test_buckets_apart),
        cmocka_unit_test(test_follows_a_change),
        cmocka_unit_test(test_bad_samples_ignored),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
