/* The DFlash 2 draft (src/models/dflash/dflash2) and `pack --draft` of a
 * DFlash2DraftModel checkpoint.
 *
 * Without a fixture (numbers worked out by hand in the comments):
 *   - the grouped dynamic conv: hand values, causal inside the block, and a
 *     block never reads a row before its first (a block starting one row
 *     later gives row 0 = (base0 + dyn0) * x_first only);
 *   - the logit transform: multiplier, then the soft cap's tanh, bounded;
 *   - the selector walk on a hand-made 6-token vocabulary: greedy (the
 *     edge term overturns the argmax, the predecessor is the previous pick),
 *     sampled (q = softmax(score / T), the inverse-CDF pick), the mask
 *     callback (candidates only among allowed tokens, the prefix it sees, a
 *     row with nothing allowed ends the walk), q sums to 1, bad input.
 * With tests/fixtures/dflash2-tiny (tools/make_dflash2_fixture.py, an
 * independent PyTorch implementation; skipped with a message when absent):
 *   - the manifest's draft object and the new tensors;
 *   - bf16 package: hidden states and logits of two blocks within 1e-4
 *     relative L2; the conv-free reference is far off (the conv is
 *     exercised); 1 vs 2 threads and one-by-one appends give the same bits;
 *   - the selector on our outputs and on the reference's: candidates,
 *     greedy and sampled picks equal, scores and q within 1e-4;
 *   - snapshot save / load, seek, a window and a larger max_block (the
 *     options shared with the v1 draft);
 *   - v1 / v2 loaders refuse each other's drafts; a config missing a DFlash 2
 *     value fails to pack; q8 / q4 packages print their errors (loose bounds).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "base/fs.h"
#include "base/json.h"
#include "models/dflash/dflash.h"
#include "models/dflash/dflash2.h"
#include "package/package.h"
#include "package/packer.h"

#define H 128
#define B 8
#define V 512
#define TOPK 16
#define TAPW (3 * H)
#define NPOS 43
#define MAX_CTX 256

static char tmp_root[256];
static float *taps, *ref_hidden, *ref_noconv, *ref_logits, *ref_gscores, *ref_sq;
static json_value *ref_json;
static int have_fixture = -1;

static const char *root(void) {
    const char *r = getenv("SPLASH_ROOT");
    return r && *r ? r : ".";
}

static float *read_f32(const char *name, size_t n) {
    char path[600];
    snprintf(path, sizeof path, "%s/tests/fixtures/dflash2-tiny/%s", root(), name);
    char *data = NULL;
    size_t len = 0;
    splash_error err = {0};
    if (splash_read_file(path, &data, &len, &err)) return NULL;
    if (len != n * sizeof(float)) fail_msg("%s: %zu bytes, expected %zu", path, len, n * sizeof(float));
    return (float *)data;
}

static int fixture(void) {
    if (have_fixture >= 0) return have_fixture;
    taps = read_f32("taps.f32", (size_t)NPOS * TAPW);
    ref_hidden = read_f32("ref_hidden.f32", 2 * B * H);
    ref_noconv = read_f32("ref_noconv_hidden.f32", 2 * B * H);
    ref_logits = read_f32("ref_logits.f32", 2 * (B - 1) * V);
    ref_gscores = read_f32("ref_greedy_scores.f32", 2 * (B - 1) * TOPK);
    ref_sq = read_f32("ref_sample_q.f32", 2 * (B - 1) * TOPK);
    char path[600], *text = NULL, jerr[128];
    size_t len = 0;
    splash_error err = {0};
    snprintf(path, sizeof path, "%s/tests/fixtures/dflash2-tiny/ref.json", root());
    if (!splash_read_file(path, &text, &len, &err)) {
        ref_json = json_parse(text, len, 32, jerr, sizeof jerr);
        free(text);
    }
    have_fixture = taps && ref_hidden && ref_noconv && ref_logits && ref_gscores && ref_sq && ref_json;
    if (!have_fixture)
        printf("# tests/fixtures/dflash2-tiny is missing: run `python3 tools/make_dflash2_fixture.py --out "
               "tests/fixtures/dflash2-tiny` (needs torch); fixture tests skipped\n");
    return have_fixture;
}

static void skip_without_fixture(void) {
    if (!fixture()) skip();
}

/* ---- hand-made numbers ------------------------------------------------------- */

/* hidden 4, group 2 (2 groups), K 2, 3 rows.  dyn row t = [side][tap][group].
 *   base side 0: tap 0 [1, 1, 2, 2], tap 1 [0.5, 0.5, 0, 1]
 *   dyn row t side 0: tap 0 [0.1 t, -0.1 t], tap 1 [1, 2]     (side 1 rows: 9s, unused)
 *   x rows: [1,2,3,4], [5,6,7,8], [9,10,11,12]
 * out_0 = (b0 + d0) * x_0                     = [1,2,6,8] (t = 0: tap 1 reads nothing)
 * out_1 = (b0 + [.1,.1,-.1,-.1]) x_1 + (b1 + [1,1,2,2]) x_0
 *       = [5.5, 6.6, 13.3, 15.2] + [1.5, 3, 6, 12] = [7, 9.6, 19.3, 27.2]
 * out_2 = (b0 + [.2,.2,-.2,-.2]) x_2 + (b1 + [1,1,2,2]) x_1
 *       = [10.8, 12, 19.8, 21.6] + [7.5, 9, 14, 24] = [18.3, 21, 33.8, 45.6] */
static void test_conv_hand(void **state) {
    (void)state;
    const float x[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    const float base[2][2][4] = {{{1, 1, 2, 2}, {0.5f, 0.5f, 0, 1}}, {{7, 7, 7, 7}, {7, 7, 7, 7}}};
    float dyn[3][8];
    for (int t = 0; t < 3; t++) {
        const float row[8] = {0.1f * (float)t, -0.1f * (float)t, 1, 2, 9, 9, 9, 9};
        memcpy(dyn[t], row, sizeof row);
    }
    float out[12];
    splash_dflash2_conv(x, 4, 3, 4, &base[0][0][0], &dyn[0][0], 8, 0, 2, 2, out, 4);
    const float want[12] = {1, 2, 6, 8, 7, 9.6f, 19.3f, 27.2f, 18.3f, 21, 33.8f, 45.6f};
    for (int i = 0; i < 12; i++) assert_true(fabsf(out[i] - want[i]) < 1e-5f);
    /* a block that starts at row 1: its row 0 never reads x_0 */
    float out2[8];
    splash_dflash2_conv(x + 4, 4, 2, 4, &base[0][0][0], &dyn[1][0], 8, 0, 2, 2, out2, 4);
    const float want2[4] = {(1 + 0.1f) * 5, (1 + 0.1f) * 6, (2 - 0.1f) * 7, (2 - 0.1f) * 8};
    for (int i = 0; i < 4; i++) assert_true(fabsf(out2[i] - want2[i]) < 1e-5f);
    /* side 1 reads the dyn entries after side 0's: base side 1 (7s) + 9s */
    splash_dflash2_conv(x, 4, 1, 4, &base[1][0][0], &dyn[0][0], 8, 1, 2, 2, out, 4);
    for (int c = 0; c < 4; c++) assert_true(fabsf(out[c] - 16.0f * x[c]) < 1e-5f);
    /* later rows do not change earlier outputs (causal) */
    float x3[12];
    memcpy(x3, x, sizeof x3);
    x3[8] = 1000;
    splash_dflash2_conv(x3, 4, 3, 4, &base[0][0][0], &dyn[0][0], 8, 0, 2, 2, out, 4);
    for (int i = 0; i < 8; i++) assert_true(fabsf(out[i] - want[i]) < 1e-5f);
}

static void test_softcap(void **state) {
    (void)state;
    float l[7] = {-1e4f, -3, -0.5f, 0, 0.5f, 3, 1e4f};
    splash_dflash2_logits_transform(l, 7, 2.0f, 6.0f);
    /* 6 tanh(2x / 6): 2x = -2e4 -> -6 (rounds to the cap), -6 -> 6 tanh(-1) */
    assert_true(l[0] >= -6.0f && l[0] < -5.999f);
    assert_true(fabs(l[1] - 6 * tanh(-1.0)) < 1e-5);
    assert_true(fabs(l[2] - 6 * tanh(-1.0 / 6)) < 1e-6);
    assert_true(l[3] == 0);
    assert_true(fabs(l[5] - 6 * tanh(1.0)) < 1e-5);
    assert_true(l[6] <= 6.0f && l[6] > 5.999f);
    for (int i = 0; i < 6; i++) assert_true(l[i] < l[i + 1] || (i == 5 && l[i] <= l[i + 1]));
    for (int i = 0; i < 7; i++) assert_true(fabsf(l[i]) <= 6.0f);
    float m[2] = {-2.5f, 40};
    splash_dflash2_logits_transform(m, 2, 0.5f, 0); /* no cap: the multiplier alone */
    assert_true(m[0] == -1.25f && m[1] == 20.0f);
}

/* The hand selector: vocab 6, rank 2, top_k 3.
 *   pred: t4 [1, 0], t5 [0, 1], others [0, 0]
 *   succ: t0 [0, .2], t1 [1, 0], t2 [0, 1], t3 [0, 5], t4 [0, -1], t5 [1.5, 0]
 *   row 0: logits [0, 2, 1, 3, -1, 1.5], gate [2, 1]; row 1: logits [1, .5, 2.5, 0, 2, -3], gate [1, -1]
 * Greedy from anchor 4: row 0 candidates (3, 1, 5), g = pred[4] * gate = [2, 0],
 *   scores 3 + 0, 2 + 2, 1.5 + 3 = (3, 4, 4.5) -> 5 (the argmax of the logits was 3);
 *   row 1 candidates (2, 4, 0), g = pred[5] * [1, -1] = [0, -1],
 *   scores 2.5 - 1, 2 + 1, 1 - .2 = (1.5, 3, .8) -> 4.
 *   (With the anchor as row 1's predecessor the scores would be the logits: 2.) */
static const float pred_w[6][2] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}, {1, 0}, {0, 1}};
static const float succ_w[6][2] = {{0, 0.2f}, {1, 0}, {0, 1}, {0, 5}, {0, -1}, {1.5f, 0}};
static const float hand_logits[2][6] = {{0, 2, 1, 3, -1, 1.5f}, {1, 0.5f, 2.5f, 0, 2, -3}};
static const float hand_gate[2][2] = {{2, 1}, {1, -1}};

static splash_tensor f32_tensor(const float *data, int64_t rows, int64_t cols) {
    splash_tensor t;
    memset(&t, 0, sizeof t);
    t.name = "hand";
    t.dtype = SPLASH_F32;
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.data = (const uint8_t *)data;
    t.bytes = (size_t)(rows * cols) * sizeof(float);
    return t;
}

typedef struct hand {
    splash_tensor pred, succ;
    splash_dflash2_selector sel;
    void *scratch;
} hand;

static void hand_init(hand *h) {
    h->pred = f32_tensor(&pred_w[0][0], 6, 2);
    h->succ = f32_tensor(&succ_w[0][0], 6, 2);
    h->sel = (splash_dflash2_selector){.vocab = 6, .rank = 2, .top_k = 3, .pred_codebook = &h->pred,
                                       .succ_codebook = &h->succ};
    h->scratch = calloc(1, splash_dflash2_walk_scratch(6, 2));
}

static void test_walk_greedy(void **state) {
    (void)state;
    hand h;
    hand_init(&h);
    splash_dflash2_row out[2];
    splash_error err = {0};
    splash_dflash2_select_args a = {.temperature = 0};
    assert_int_equal(splash_dflash2_walk(&h.sel, &hand_gate[0][0], &hand_logits[0][0], 4, 2, &a, out, h.scratch, &err), 2);
    assert_int_equal(out[0].n_cand, 3);
    assert_int_equal(out[0].cand[0], 3);
    assert_int_equal(out[0].cand[1], 1);
    assert_int_equal(out[0].cand[2], 5);
    assert_int_equal(out[0].cand[3], -1);
    assert_true(fabsf(out[0].score[0] - 3) < 1e-6f && fabsf(out[0].score[1] - 4) < 1e-6f &&
                fabsf(out[0].score[2] - 4.5f) < 1e-6f);
    assert_int_equal(out[0].token, 5);
    assert_int_equal(out[0].pick, 2);
    assert_true(out[0].q[2] == 1 && out[0].q[0] == 0 && out[0].q[1] == 0);
    assert_int_equal(out[1].cand[0], 2);
    assert_int_equal(out[1].cand[1], 4);
    assert_int_equal(out[1].cand[2], 0);
    assert_true(fabsf(out[1].score[0] - 1.5f) < 1e-6f && fabsf(out[1].score[1] - 3) < 1e-6f &&
                fabsf(out[1].score[2] - 0.8f) < 1e-6f);
    assert_int_equal(out[1].token, 4);
    /* equal scores: the first candidate wins (greedy, as std::max_element / argmax) */
    const float flat[6] = {1, 1, 1, 0, 0, 0}, zero_gate[2] = {0, 0};
    assert_int_equal(splash_dflash2_walk(&h.sel, zero_gate, flat, 0, 1, &a, out, h.scratch, &err), 1);
    assert_int_equal(out[0].cand[0], 0);
    assert_int_equal(out[0].cand[1], 1);
    assert_int_equal(out[0].cand[2], 2);
    assert_int_equal(out[0].token, 0);
    free(h.scratch);
}

/* T = 1.  Row 0 scores (3, 4, 4.5): q = (e^-1.5, e^-.5, 1) / S, S = 1.82958;
 *   q0 = .12195, u = .1 < q0 -> candidate 0 = token 3.
 * Row 1 from token 3 (pred [0, 0]: no edge): scores = logits (2.5, 2, 1):
 *   q = (1, e^-.5, e^-1.5) / S = (.54657, .33151, .12195); u = .9 > .87808 -> candidate 2 = token 0. */
static void test_walk_sampled(void **state) {
    (void)state;
    hand h;
    hand_init(&h);
    splash_dflash2_row out[2];
    splash_error err = {0};
    const float u[2] = {0.1f, 0.9f};
    splash_dflash2_select_args a = {.temperature = 1.0f, .uniform = u};
    assert_int_equal(splash_dflash2_walk(&h.sel, &hand_gate[0][0], &hand_logits[0][0], 4, 2, &a, out, h.scratch, &err), 2);
    double S = exp(-1.5) + exp(-0.5) + 1;
    assert_true(fabs(out[0].q[0] - exp(-1.5) / S) < 1e-6 && fabs(out[0].q[1] - exp(-0.5) / S) < 1e-6 &&
                fabs(out[0].q[2] - 1 / S) < 1e-6);
    assert_int_equal(out[0].token, 3);
    assert_true(fabsf(out[1].score[0] - 2.5f) < 1e-6f && fabsf(out[1].score[2] - 1.0f) < 1e-6f);
    assert_true(fabs(out[1].q[0] - 1 / S) < 1e-6 && fabs(out[1].q[2] - exp(-1.5) / S) < 1e-6);
    assert_int_equal(out[1].token, 0);
    assert_int_equal(out[1].pick, 2);
    /* T = 0.5 halves the temperature: q0 of row 0 = e^-3 / (e^-3 + e^-1 + 1) */
    a.temperature = 0.5f;
    const float u2[2] = {0.99f, 0.0f};
    a.uniform = u2;
    assert_int_equal(splash_dflash2_walk(&h.sel, &hand_gate[0][0], &hand_logits[0][0], 4, 1, &a, out, h.scratch, &err), 1);
    assert_true(fabs(out[0].q[0] - exp(-3.0) / (exp(-3.0) + exp(-1.0) + 1)) < 1e-6);
    assert_int_equal(out[0].token, 5);
    free(h.scratch);
}

typedef struct mask_ctx {
    int calls;
    int32_t seen[4][4];
    int nothing_on_row; /* row that allows nothing, or -1 */
} mask_ctx;

/* row 0: every token but 3 and 5; row 1: only token 0 (or nothing) */
static int hand_mask(void *ctx, int row, const int32_t *prefix, uint32_t *allow) {
    mask_ctx *m = ctx;
    for (int i = 0; i <= row; i++) m->seen[row][i] = prefix[i];
    m->calls++;
    if (row == m->nothing_on_row) allow[0] = 0;
    else allow[0] = row == 0 ? 0x3fu & ~((1u << 3) | (1u << 5)) : 1u;
    return 0;
}

static int failing_mask(void *ctx, int row, const int32_t *prefix, uint32_t *allow) {
    (void)ctx, (void)row, (void)prefix, (void)allow;
    return SPLASH_E_RANGE;
}

/* Row 0 without 3 and 5: candidates (1, 2, 0) (logits 2, 1, 0), g = [2, 0]:
 * scores 2 + 2, 1 + 0, 0 + 0 -> token 1.  Row 1 allows token 0 alone: one
 * candidate, q = 1. */
static void test_walk_mask(void **state) {
    (void)state;
    hand h;
    hand_init(&h);
    splash_dflash2_row out[2];
    splash_error err = {0};
    mask_ctx mc = {.nothing_on_row = -1};
    const float u[2] = {0.5f, 0.5f};
    splash_dflash2_select_args a = {.temperature = 0.7f, .uniform = u, .mask = hand_mask, .mask_ctx = &mc};
    assert_int_equal(splash_dflash2_walk(&h.sel, &hand_gate[0][0], &hand_logits[0][0], 4, 2, &a, out, h.scratch, &err), 2);
    assert_int_equal(mc.calls, 2);
    assert_int_equal(mc.seen[0][0], 4);
    assert_int_equal(out[0].n_cand, 3);
    assert_int_equal(out[0].cand[0], 1);
    assert_int_equal(out[0].cand[1], 2);
    assert_int_equal(out[0].cand[2], 0);
    assert_true(fabsf(out[0].score[0] - 4) < 1e-6f && fabsf(out[0].score[1] - 1) < 1e-6f && fabsf(out[0].score[2]) < 1e-6f);
    /* greedy would take token 1; with T = .7 and u = .5: q0 = 1 / (1 + e^(-3/.7) + e^(-4/.7)) > .5 */
    assert_int_equal(out[0].token, 1);
    assert_int_equal(mc.seen[1][0], 4);
    assert_int_equal(mc.seen[1][1], 1);
    assert_int_equal(out[1].n_cand, 1);
    assert_int_equal(out[1].token, 0);
    assert_true(out[1].q[0] == 1.0f && out[1].q[1] == 0 && out[1].cand[1] == -1);
    /* a row with nothing allowed ends the walk there */
    mc = (mask_ctx){.nothing_on_row = 1};
    assert_int_equal(splash_dflash2_walk(&h.sel, &hand_gate[0][0], &hand_logits[0][0], 4, 2, &a, out, h.scratch, &err), 1);
    assert_int_equal(out[1].n_cand, 0);
    /* -inf logits are never candidates */
    float lg[6] = {-INFINITY, -INFINITY, 0.5f, -INFINITY, -INFINITY, -INFINITY};
    a.mask = NULL;
    assert_int_equal(splash_dflash2_walk(&h.sel, &hand_gate[0][0], lg, 4, 1, &a, out, h.scratch, &err), 1);
    assert_int_equal(out[0].n_cand, 1);
    assert_int_equal(out[0].token, 2);
    /* a failing mask fails the walk with its code */
    a.mask = failing_mask;
    assert_int_equal(splash_dflash2_walk(&h.sel, &hand_gate[0][0], &hand_logits[0][0], 4, 2, &a, out, h.scratch, &err),
                     SPLASH_E_RANGE);
    free(h.scratch);
}

/* q over 16 candidates of a 64-token row, several temperatures: a
 * distribution (>= 0, sums to 1) whose ratios are exp((s_k - s_0) / T). */
static void test_q_sums_to_one(void **state) {
    (void)state;
    enum { VV = 64, RR = 8, KK = 16 };
    float *pred = malloc(sizeof(float) * VV * RR), *succ = malloc(sizeof(float) * VV * RR);
    float logits[VV], gate[RR];
    uint32_t s = 12345;
    for (int i = 0; i < VV * RR; i++) {
        s = s * 1664525u + 1013904223u;
        pred[i] = (float)((int)(s >> 20) - 2048) / 1024.0f;
        s = s * 1664525u + 1013904223u;
        succ[i] = (float)((int)(s >> 20) - 2048) / 1024.0f;
    }
    for (int i = 0; i < VV; i++) logits[i] = sinf((float)i * 1.7f) * 5;
    for (int r = 0; r < RR; r++) gate[r] = cosf((float)r);
    splash_tensor tp = f32_tensor(pred, VV, RR), ts = f32_tensor(succ, VV, RR);
    splash_dflash2_selector sel = {.vocab = VV, .rank = RR, .top_k = KK, .pred_codebook = &tp, .succ_codebook = &ts};
    void *scratch = calloc(1, splash_dflash2_walk_scratch(VV, RR));
    const float temps[4] = {0.05f, 0.3f, 1.0f, 2.5f};
    for (int ti = 0; ti < 4; ti++) {
        float u = 0.37f;
        splash_dflash2_select_args a = {.temperature = temps[ti], .uniform = &u};
        splash_dflash2_row out;
        splash_error err = {0};
        assert_int_equal(splash_dflash2_walk(&sel, gate, logits, 7, 1, &a, &out, scratch, &err), 1);
        assert_int_equal(out.n_cand, KK);
        double sum = 0;
        int best = 0;
        for (int k = 1; k < KK; k++)
            if (out.score[k] > out.score[best]) best = k;
        for (int k = 0; k < KK; k++) {
            assert_true(out.q[k] >= 0);
            sum += out.q[k];
            if (k) assert_true(logits[out.cand[k]] <= logits[out.cand[k - 1]]);
            double want = exp(((double)out.score[k] - out.score[best]) / temps[ti]) * out.q[best];
            assert_true(fabs(out.q[k] - want) < 1e-6 + 1e-5 * want);
        }
        assert_true(fabs(sum - 1) < 1e-6);
        double cum = 0;
        for (int k = 0; k < out.pick; k++) cum += out.q[k];
        assert_true(cum <= 0.37 + 1e-6 && 0.37 < cum + out.q[out.pick] + 1e-6);
    }
    free(scratch);
    free(pred);
    free(succ);
}

static void test_walk_bad_input(void **state) {
    (void)state;
    hand h;
    hand_init(&h);
    splash_dflash2_row out[2];
    splash_error err = {0};
    splash_dflash2_select_args a = {.temperature = 1.0f};
    /* sampling without uniforms */
    assert_int_equal(splash_dflash2_walk(&h.sel, &hand_gate[0][0], &hand_logits[0][0], 4, 2, &a, out, h.scratch, &err),
                     SPLASH_E_INVALID);
    const float u[1] = {1.0f};
    a.uniform = u;
    assert_int_equal(splash_dflash2_walk(&h.sel, &hand_gate[0][0], &hand_logits[0][0], 4, 1, &a, out, h.scratch, &err),
                     SPLASH_E_INVALID);
    a = (splash_dflash2_select_args){0};
    assert_int_equal(splash_dflash2_walk(&h.sel, &hand_gate[0][0], &hand_logits[0][0], 6, 1, &a, out, h.scratch, &err),
                     SPLASH_E_INVALID);
    assert_int_equal(splash_dflash2_walk(&h.sel, &hand_gate[0][0], &hand_logits[0][0], 0, 0, &a, out, h.scratch, &err), 0);
    free(h.scratch);
}

/* ---- the fixture --------------------------------------------------------------- */

static const char *packed_draft(splash_dtype w, const char *draft_name) {
    static char dirs[2][SPLASH_DTYPE_COUNT][400];
    int v1 = !strcmp(draft_name, "dflash-tiny");
    if (dirs[v1][w][0]) return dirs[v1][w];
    if (!tmp_root[0]) {
        snprintf(tmp_root, sizeof tmp_root, "/tmp/splash-test-dflash2-XXXXXX");
        if (!mkdtemp(tmp_root)) fail_msg("mkdtemp");
    }
    char from[512], draft[512];
    snprintf(from, sizeof from, "%s/tests/fixtures/dense-tiny", root());
    snprintf(draft, sizeof draft, "%s/tests/fixtures/%s", root(), draft_name);
    snprintf(dirs[v1][w], sizeof dirs[v1][w], "%s/pkg-%s-%s", tmp_root, draft_name, splash_dtype_name(w));
    splash_pack_options o = {.from = from, .draft = draft, .out = dirs[v1][w], .weights = w, .threads = 2, .force = 1};
    splash_pack_stats st;
    splash_error err = {0};
    if (splash_pack(&o, &st, &err)) fail_msg("pack: %s", err.msg);
    return dirs[v1][w];
}

static const char *packed(splash_dtype w) { return packed_draft(w, "dflash2-tiny"); }

typedef struct run {
    splash_package *pkg;
    splash_dflash2 *d;
    splash_dflash2_state *s;
} run;

static void open_run(run *r, splash_dtype w, int act, int threads) {
    splash_error err = {0};
    if (splash_package_open(packed(w), &r->pkg, &err)) fail_msg("%s", err.msg);
    splash_dflash_options o = {.threads = threads, .act = act, .max_context = MAX_CTX};
    if (splash_dflash2_load(r->pkg, &o, &r->d, &err)) fail_msg("%s", err.msg);
    if (splash_dflash2_state_new(r->d, &r->s, &err)) fail_msg("%s", err.msg);
}

static void close_run(run *r) {
    splash_dflash2_state_free(r->s);
    splash_dflash2_free(r->d);
    splash_package_close(r->pkg);
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - (double)b[i];
        num += e * e;
        den += (double)b[i] * (double)b[i];
    }
    return sqrt(num / den);
}

static int block_anchor(int k) { return (int)json_get_int(json_at(json_get(ref_json, "blocks"), (size_t)k), "anchor", -1); }

/* The two fixture blocks: hidden [2][B-1][H], logits [2][B-1][V]. */
static void two_blocks(run *r, int one_by_one, float *hid, float *lg) {
    splash_error err = {0};
    splash_dflash2_state_reset(r->s);
    if (one_by_one) {
        for (int p = 0; p < 40; p++)
            if (splash_dflash2_append(r->d, r->s, taps + (size_t)p * TAPW, 1, &err)) fail_msg("%s", err.msg);
    } else if (splash_dflash2_append(r->d, r->s, taps, 40, &err)) {
        fail_msg("%s", err.msg);
    }
    assert_int_equal(splash_dflash2_state_positions(r->s), 40);
    if (splash_dflash2_draft(r->d, r->s, block_anchor(0), B, hid, lg, &err)) fail_msg("%s", err.msg);
    if (splash_dflash2_append(r->d, r->s, taps + (size_t)40 * TAPW, 3, &err)) fail_msg("%s", err.msg);
    if (splash_dflash2_draft(r->d, r->s, block_anchor(1), B, hid + (B - 1) * H, lg + (B - 1) * V, &err))
        fail_msg("%s", err.msg);
}

static void errors(const float *hid, const float *lg, double e_h[2], double e_l[2]) {
    for (int k = 0; k < 2; k++) {
        e_h[k] = rel_l2(hid + (size_t)k * (B - 1) * H, ref_hidden + (size_t)k * B * H + H, (size_t)(B - 1) * H);
        e_l[k] = rel_l2(lg + (size_t)k * (B - 1) * V, ref_logits + (size_t)k * (B - 1) * V, (size_t)(B - 1) * V);
    }
}

static void test_manifest(void **state) {
    (void)state;
    skip_without_fixture();
    splash_package *pkg;
    splash_error err = {0};
    if (splash_package_open(packed(SPLASH_Q4), &pkg, &err)) fail_msg("%s", err.msg);
    const json_value *d = json_get(splash_package_manifest(pkg), "draft");
    assert_non_null(d);
    assert_string_equal(json_get_string(d, "architecture", ""), "dflash2");
    assert_string_equal(json_get_string(d, "source_architecture", ""), "DFlash2DraftModel");
    assert_int_equal(json_get_int(d, "block_size", 0), 8); /* from dflash_config */
    assert_int_equal(json_get_int(d, "mask_token_id", 0), 511);
    assert_int_equal(json_get_int(d, "sliding_window", 0), 16);
    assert_int_equal(json_get_int(d, "conv_kernel_size", 0), 2);
    assert_int_equal(json_get_int(d, "conv_group_size", 0), 16);
    assert_int_equal(json_get_int(d, "selector_rank", 0), 64);
    assert_int_equal(json_get_int(d, "selector_top_k", 0), 16);
    assert_true(json_get_num(d, "output_multiplier", 0) == 3.0);
    assert_true(json_get_num(d, "final_logit_softcapping", 0) == 6.0);
    assert_true(json_get_num(d, "input_embedding_scale", 0) == 1.25);
    assert_true(json_get_num(d, "rope_theta", 0) == 500000.0);
    const json_value *c = json_get(d, "causal");
    assert_int_equal(c->count, 2);
    assert_true(c->items[0]->type == JSON_FALSE && c->items[1]->type == JSON_FALSE); /* is_causal: false */
    assert_string_equal(json_string(json_get(d, "layer_types")->items[1]), "sliding_attention");
    const splash_tensor *t = splash_package_find(pkg, "draft.layers.1.attn_conv.base");
    assert_non_null(t);
    assert_int_equal(t->dtype, SPLASH_F32);
    assert_int_equal(t->ndim, 3);
    assert_int_equal(t->shape[0], 2);
    assert_int_equal(t->shape[1], 2);
    assert_int_equal(t->shape[2], H);
    /* tap 0 of each side ~ 1 + 0.2 N(0,1), tap 1 ~ 0.4 N(0,1) (the fixture's init) */
    const float *bk = (const float *)t->data;
    double m0 = 0, m1 = 0;
    for (int i = 0; i < H; i++) m0 += bk[i], m1 += fabsf(bk[H + i]);
    assert_true(fabs(m0 / H - 1) < 0.1 && m1 / H < 0.6);
    t = splash_package_find(pkg, "draft.layers.0.ffn_conv.proj");
    assert_non_null(t);
    assert_int_equal(t->shape[0], 2 * 2 * (H / 16));
    assert_int_equal(t->shape[1], H);
    t = splash_package_find(pkg, "draft.selector.pred_codebook");
    assert_non_null(t);
    assert_int_equal(t->dtype, SPLASH_Q4);
    assert_int_equal(t->shape[0], V);
    assert_int_equal(t->shape[1], 64);
    assert_non_null(splash_package_find(pkg, "draft.selector.succ_codebook"));
    assert_non_null(splash_package_find(pkg, "draft.selector.hidden_proj"));
    assert_non_null(splash_package_file(pkg, "draft/selector.bin"));
    /* the v1 loader refuses a DFlash 2 draft */
    splash_dflash_options o = {.threads = 1, .max_context = 64};
    splash_dflash *v1 = NULL;
    assert_int_equal(splash_dflash_load(pkg, &o, &v1, &err), SPLASH_E_UNSUPPORTED);
    splash_package_close(pkg);
}

static void test_bf16_matches_reference(void **state) {
    (void)state;
    skip_without_fixture();
    run r;
    open_run(&r, SPLASH_BF16, CPU_ACT_F32, 2);
    float *hid = malloc(sizeof(float) * 2 * (B - 1) * H), *lg = malloc(sizeof(float) * 2 * (B - 1) * V);
    two_blocks(&r, 0, hid, lg);
    double eh[2], el[2];
    errors(hid, lg, eh, el);
    printf("# bf16: block@40 hidden %.3g logits %.3g; block@43 hidden %.3g logits %.3g\n", eh[0], el[0], eh[1], el[1]);
    for (int k = 0; k < 2; k++) {
        assert_true(eh[k] < 1e-4);
        assert_true(el[k] < 1e-4);
    }
    for (size_t i = 0; i < (size_t)2 * (B - 1) * V; i++) assert_true(fabsf(lg[i]) <= 6.0f); /* the soft cap */
    /* the conv matters here: the conv-free reference is far off */
    for (int k = 0; k < 2; k++) {
        double ec = rel_l2(hid + (size_t)k * (B - 1) * H, ref_noconv + (size_t)k * B * H + H, (size_t)(B - 1) * H);
        printf("# conv removed: block %d differs by %.3g\n", k, ec);
        assert_true(ec > 1e-2);
    }
    /* one row at a time, and 1 thread: the same bits */
    float *hid2 = malloc(sizeof(float) * 2 * (B - 1) * H), *lg2 = malloc(sizeof(float) * 2 * (B - 1) * V);
    two_blocks(&r, 1, hid2, lg2);
    assert_memory_equal(hid, hid2, sizeof(float) * 2 * (B - 1) * H);
    run r1;
    open_run(&r1, SPLASH_BF16, CPU_ACT_F32, 1);
    two_blocks(&r1, 0, hid2, lg2);
    assert_memory_equal(hid, hid2, sizeof(float) * 2 * (B - 1) * H);
    assert_memory_equal(lg, lg2, sizeof(float) * 2 * (B - 1) * V);
    close_run(&r1);
    /* a shorter block runs too (the block is bidirectional here, so its rows
     * differ from the longer block's) */
    splash_error err = {0};
    assert_int_equal(splash_dflash2_draft(r.d, r.s, block_anchor(1), 4, hid2, lg2, &err), 0);
    free(hid);
    free(lg);
    free(hid2);
    free(lg2);
    close_run(&r);
}

/* candidates / picks of block k against ref.json; scores and q by token */
static void check_selection(const splash_dflash2_row *g, const splash_dflash2_row *s, int k, double *e_score,
                            double *e_q) {
    const json_value *blk = json_at(json_get(ref_json, "blocks"), (size_t)k);
    const json_value *cands = json_get(blk, "candidates"), *gp = json_get(blk, "greedy"), *sp = json_get(blk, "sampled");
    for (int r = 0; r < B - 1; r++) {
        const json_value *row = json_at(cands, (size_t)r);
        assert_int_equal(g[r].n_cand, TOPK);
        for (int j = 0; j < TOPK; j++) {
            int64_t tok;
            assert_int_equal(json_int64(json_at(row, (size_t)j), &tok), 0);
            int found = -1;
            for (int i = 0; i < TOPK; i++)
                if (g[r].cand[i] == tok) found = i;
            if (found < 0) fail_msg("block %d row %d: reference candidate %d missing", k, r, (int)tok);
            double want = ref_gscores[((size_t)k * (B - 1) + r) * TOPK + j];
            double e = fabs(g[r].score[found] - want) / (fabs(want) + 1);
            if (e > *e_score) *e_score = e;
            /* the sampled path's candidates are the same set (same logits) */
            for (int i = 0; i < TOPK; i++)
                if (s[r].cand[i] == tok) {
                    double eq = fabs(s[r].q[i] - ref_sq[((size_t)k * (B - 1) + r) * TOPK + j]);
                    if (eq > *e_q) *e_q = eq;
                }
        }
        int64_t want_g, want_s;
        assert_int_equal(json_int64(json_at(gp, (size_t)r), &want_g), 0);
        assert_int_equal(json_int64(json_at(sp, (size_t)r), &want_s), 0);
        if (g[r].token != want_g) fail_msg("block %d row %d: greedy pick %d, reference %d", k, r, g[r].token, (int)want_g);
        if (s[r].token != want_s) fail_msg("block %d row %d: sampled pick %d, reference %d", k, r, s[r].token, (int)want_s);
    }
}

static void test_selector_reference(void **state) {
    (void)state;
    skip_without_fixture();
    run r;
    open_run(&r, SPLASH_BF16, CPU_ACT_F32, 2);
    float *hid = malloc(sizeof(float) * 2 * (B - 1) * H), *lg = malloc(sizeof(float) * 2 * (B - 1) * V);
    float *rh = malloc(sizeof(float) * (B - 1) * H);
    two_blocks(&r, 0, hid, lg);
    double t = json_get_num(ref_json, "temperature", 0);
    assert_true(t > 0);
    double es = 0, eq = 0, es2 = 0, eq2 = 0;
    for (int k = 0; k < 2; k++) {
        const json_value *us = json_get(json_at(json_get(ref_json, "blocks"), (size_t)k), "uniforms");
        float u[B - 1];
        for (int i = 0; i < B - 1; i++) u[i] = (float)json_at(us, (size_t)i)->num;
        splash_dflash2_row g[B - 1], s[B - 1];
        splash_error err = {0};
        splash_dflash2_select_args ga = {.temperature = 0}, sa = {.temperature = (float)t, .uniform = u};
        /* on our own draft outputs */
        const float *h = hid + (size_t)k * (B - 1) * H, *l = lg + (size_t)k * (B - 1) * V;
        assert_int_equal(splash_dflash2_select(r.d, h, l, block_anchor(k), B - 1, &ga, g, &err), B - 1);
        assert_int_equal(splash_dflash2_select(r.d, h, l, block_anchor(k), B - 1, &sa, s, &err), B - 1);
        check_selection(g, s, k, &es, &eq);
        for (int i = 0; i < B - 1; i++) {
            double sum = 0;
            for (int j = 0; j < TOPK; j++) sum += s[i].q[j];
            assert_true(fabs(sum - 1) < 1e-5);
        }
        /* on the reference's hidden states and logits */
        memcpy(rh, ref_hidden + (size_t)k * B * H + H, sizeof(float) * (B - 1) * H);
        const float *rl = ref_logits + (size_t)k * (B - 1) * V;
        assert_int_equal(splash_dflash2_select(r.d, rh, rl, block_anchor(k), B - 1, &ga, g, &err), B - 1);
        assert_int_equal(splash_dflash2_select(r.d, rh, rl, block_anchor(k), B - 1, &sa, s, &err), B - 1);
        check_selection(g, s, k, &es2, &eq2);
    }
    printf("# selector: our outputs: score err %.3g, q err %.3g; reference inputs: score err %.3g, q err %.3g\n", es, eq,
           es2, eq2);
    assert_true(es < 1e-4 && eq < 1e-4 && es2 < 1e-4 && eq2 < 1e-4);
    /* too many rows */
    splash_dflash2_row g[B];
    splash_error err = {0};
    assert_int_not_equal(splash_dflash2_select(r.d, rh, ref_logits, 17, B, NULL, g, &err), 0);
    free(hid);
    free(lg);
    free(rh);
    close_run(&r);
}

static void test_bad_input(void **state) {
    (void)state;
    skip_without_fixture();
    run r;
    open_run(&r, SPLASH_BF16, CPU_ACT_F32, 1);
    splash_error err = {0};
    float out[(B - 1) * H];
    assert_int_equal(splash_dflash2_append(r.d, r.s, taps, 5, &err), 0);
    assert_int_not_equal(splash_dflash2_draft(r.d, r.s, 17, 1, out, NULL, &err), 0);
    assert_int_not_equal(splash_dflash2_draft(r.d, r.s, 17, B + 1, out, NULL, &err), 0);
    assert_int_not_equal(splash_dflash2_draft(r.d, r.s, V, B, out, NULL, &err), 0);
    assert_int_not_equal(splash_dflash2_append(r.d, r.s, taps, MAX_CTX, &err), 0);
    assert_int_equal(splash_dflash2_state_positions(r.s), 5);
    assert_int_equal(splash_dflash2_draft(r.d, r.s, 17, 4, out, NULL, &err), 0);
    close_run(&r);
    /* the v2 loader refuses a v1 draft */
    splash_package *pkg;
    assert_int_equal(splash_package_open(packed_draft(SPLASH_BF16, "dflash-tiny"), &pkg, &err), 0);
    splash_dflash_options o = {.threads = 1, .max_context = 64};
    splash_dflash2 *d = NULL;
    assert_int_equal(splash_dflash2_load(pkg, &o, &d, &err), SPLASH_E_UNSUPPORTED);
    splash_package_close(pkg);
    /* a DFlash 2 config without selector_rank does not pack */
    char dir[400], path[500], src[600], *text = NULL;
    size_t len = 0;
    snprintf(dir, sizeof dir, "%s/bad-draft", tmp_root);
    assert_int_equal(splash_mkdirs(dir, &err), 0);
    snprintf(src, sizeof src, "%s/tests/fixtures/dflash2-tiny/config.json", root());
    assert_int_equal(splash_read_file(src, &text, &len, &err), 0);
    char *k = strstr(text, "\"selector_rank\"");
    assert_non_null(k);
    memcpy(k, "\"selector_xxxx\"", 15);
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(splash_write_file(path, text, len, &err), 0);
    free(text);
    snprintf(src, sizeof src, "%s/tests/fixtures/dflash2-tiny/model.safetensors", root());
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    char abs[4096];
    if (!realpath(src, abs) || symlink(abs, path)) fail_msg("symlink %s", src);
    char from[512], out_dir[500];
    snprintf(from, sizeof from, "%s/tests/fixtures/dense-tiny", root());
    snprintf(out_dir, sizeof out_dir, "%s/pkg-bad", tmp_root);
    splash_pack_options po = {.from = from, .draft = dir, .out = out_dir, .weights = SPLASH_BF16, .threads = 1, .force = 1};
    splash_pack_stats st;
    assert_int_equal(splash_pack(&po, &st, &err), SPLASH_E_FORMAT);
    assert_non_null(strstr(err.msg, "selector_rank"));
    assert_false(splash_is_dir(out_dir));
}

/* The options and state operations shared with the v1 draft: a window, a
 * larger block, seek, snapshots. */
static void test_state_ops(void **state) {
    (void)state;
    skip_without_fixture();
    run r;
    open_run(&r, SPLASH_BF16, CPU_ACT_F32, 2);
    splash_error err = {0};
    float *hid = malloc(sizeof(float) * 2 * (B - 1) * H), *lg = malloc(sizeof(float) * 2 * (B - 1) * V);
    float *h2 = malloc(sizeof(float) * 16 * H), *l2 = malloc(sizeof(float) * 16 * V);
    two_blocks(&r, 0, hid, lg);
    assert_int_equal(splash_dflash2_max_block(r.d), B);
    assert_true(splash_dflash2_weight_bytes(r.d) > 400000); /* bf16 draft: ~440k parameters */
    /* snapshot after 43 positions: a fresh state loaded from it drafts the same bits */
    size_t nb = splash_dflash2_state_snapshot_bytes(r.s);
    char *snap = malloc(nb);
    splash_dflash2_state_save(r.s, snap);
    splash_dflash2_state *s2;
    assert_int_equal(splash_dflash2_state_new(r.d, &s2, &err), 0);
    assert_int_equal(splash_dflash2_state_load(s2, snap, &err), 0);
    assert_int_equal(splash_dflash2_state_positions(s2), 43);
    assert_int_equal(splash_dflash2_draft(r.d, s2, block_anchor(1), B, h2, l2, &err), 0);
    assert_memory_equal(h2, hid + (B - 1) * H, sizeof(float) * (B - 1) * H);
    snap[0] ^= 1;
    assert_int_equal(splash_dflash2_state_load(s2, snap, &err), SPLASH_E_INVALID);
    /* seek: forward only; the skipped positions are never read */
    assert_int_equal(splash_dflash2_state_seek(r.d, s2, 40, &err), SPLASH_E_INVALID);
    assert_int_equal(splash_dflash2_state_seek(r.d, s2, 50, &err), 0);
    assert_int_equal(splash_dflash2_state_positions(s2), 50);
    assert_int_equal(splash_dflash2_draft(r.d, s2, 17, B, h2, NULL, &err), 0);
    splash_dflash2_state_free(s2);
    free(snap);
    close_run(&r);
    /* a window of 64 over 43 positions (both layers slide with 16) changes
     * nothing; max_block 12 allows a 12-row block and its selection */
    run w;
    splash_dflash_options o = {.threads = 2, .window = 64, .max_block = 12};
    assert_int_equal(splash_package_open(packed(SPLASH_BF16), &w.pkg, &err), 0);
    assert_int_equal(splash_dflash2_load(w.pkg, &o, &w.d, &err), 0);
    assert_int_equal(splash_dflash2_state_new(w.d, &w.s, &err), 0);
    float *hw = malloc(sizeof(float) * 2 * (B - 1) * H), *lw = malloc(sizeof(float) * 2 * (B - 1) * V);
    two_blocks(&w, 0, hw, lw);
    assert_memory_equal(hw, hid, sizeof(float) * 2 * (B - 1) * H);
    assert_int_equal(splash_dflash2_max_block(w.d), 12);
    assert_int_equal(splash_dflash2_draft(w.d, w.s, 17, 12, h2, l2, &err), 0);
    splash_dflash2_row rows[11];
    splash_dflash2_select_args ga = {0};
    assert_int_equal(splash_dflash2_select(w.d, h2, l2, 17, 11, &ga, rows, &err), 11);
    assert_int_not_equal(splash_dflash2_draft(w.d, w.s, 17, 13, h2, l2, &err), 0);
    close_run(&w);
    free(hw);
    free(lw);
    free(hid);
    free(lg);
    free(h2);
    free(l2);
}

static void test_quantized(void **state) {
    (void)state;
    skip_without_fixture();
    struct {
        splash_dtype w;
        int act;
        const char *name;
        double bound;
    } cases[] = {
        {SPLASH_Q8, CPU_ACT_F32, "q8 fp32-act", 3e-2},
        {SPLASH_Q8, CPU_ACT_I8, "q8 int8-act", 5e-2},
        {SPLASH_Q4, CPU_ACT_F32, "q4 fp32-act", 0.3},
        {SPLASH_Q4, CPU_ACT_I8, "q4 int8-act", 0.3},
    };
    float *hid = malloc(sizeof(float) * 2 * (B - 1) * H), *lg = malloc(sizeof(float) * 2 * (B - 1) * V);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        run r;
        open_run(&r, cases[c].w, cases[c].act, 2);
        two_blocks(&r, 0, hid, lg);
        double eh[2], el[2];
        errors(hid, lg, eh, el);
        /* how many greedy picks survive quantisation (printed, not asserted) */
        int same = 0;
        for (int k = 0; k < 2; k++) {
            splash_dflash2_row g[B - 1];
            splash_error err = {0};
            splash_dflash2_select_args ga = {0};
            assert_int_equal(splash_dflash2_select(r.d, hid + (size_t)k * (B - 1) * H, lg + (size_t)k * (B - 1) * V,
                                                   block_anchor(k), B - 1, &ga, g, &err), B - 1);
            const json_value *gp = json_get(json_at(json_get(ref_json, "blocks"), (size_t)k), "greedy");
            for (int i = 0; i < B - 1; i++) same += g[i].token == (int32_t)json_at(gp, (size_t)i)->num;
        }
        printf("# %s: block@40 hidden %.3g logits %.3g; block@43 hidden %.3g logits %.3g; greedy picks kept %d/%d\n",
               cases[c].name, eh[0], el[0], eh[1], el[1], same, 2 * (B - 1));
        for (int k = 0; k < 2; k++) assert_true(eh[k] < cases[c].bound);
        close_run(&r);
    }
    free(hid);
    free(lg);
}

static int teardown(void **state) {
    (void)state;
    if (tmp_root[0]) splash_remove_tree(tmp_root);
    free(taps);
    free(ref_hidden);
    free(ref_noconv);
    free(ref_logits);
    free(ref_gscores);
    free(ref_sq);
    json_free(ref_json);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_hand),
        cmocka_unit_test(test_softcap),
        cmocka_unit_test(test_walk_greedy),
        cmocka_unit_test(test_walk_sampled),
        cmocka_unit_test(test_walk_mask),
        cmocka_unit_test(test_q_sums_to_one),
        cmocka_unit_test(test_walk_bad_input),
        cmocka_unit_test(test_manifest),
        cmocka_unit_test(test_bf16_matches_reference),
        cmocka_unit_test(test_selector_reference),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_state_ops),
        cmocka_unit_test(test_quantized),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
