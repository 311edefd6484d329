/* The DFlash v1 draft (src/models/dflash) against an independent PyTorch
 * implementation (tools/make_dflash_fixture.py, run on the GPU machine in
 * fp32 on bf16 weights; tests/fixtures/dflash-tiny):
 *
 *   - `pack --draft`: the manifest's draft object and the draft tensors;
 *   - bf16 package: the draft's final-normed hidden states and the logits
 *     through the target's lm_head, for a block at position 40 after 40
 *     committed positions and one at 43 after 3 more, relative L2 error
 *     < 1e-4 (rows 1..B-1);
 *   - the sliding window: the reference with the window ignored differs by
 *     far more than the tolerance (so the window is exercised: 43 positions
 *     against a window of 16), and the sliding layer's ring does not grow
 *     with max_context;
 *   - appending context one row at a time or all at once: the same bits;
 *   - bad input fails without touching the state;
 *   - q8 / q4 packages (fp32 and int8 activations): errors printed, loose
 *     bounds.
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
#include "package/package.h"
#include "package/packer.h"

#define H 128
#define B 8
#define V 512
#define TAPW (3 * H)
#define NPOS 43
#define MAX_CTX 256

static char tmp_root[256];
static float *taps, *ref_hidden, *ref_nowin, *ref_logits;
static int have_fixture = -1;

static const char *root(void) {
    const char *r = getenv("SPLASH_ROOT");
    return r && *r ? r : ".";
}

static float *read_f32(const char *name, size_t n) {
    char path[600];
    snprintf(path, sizeof path, "%s/tests/fixtures/dflash-tiny/%s", root(), name);
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
    ref_nowin = read_f32("ref_nowindow_hidden.f32", 2 * B * H);
    ref_logits = read_f32("ref_logits.f32", 2 * (B - 1) * V);
    have_fixture = taps && ref_hidden && ref_nowin && ref_logits;
    return have_fixture;
}

/* Packs dense-tiny + the draft as `w` (once per dtype). */
static const char *packed(splash_dtype w) {
    static char dirs[SPLASH_DTYPE_COUNT][400];
    if (dirs[w][0]) return dirs[w];
    if (!tmp_root[0]) {
        snprintf(tmp_root, sizeof tmp_root, "/tmp/splash-test-dflash-XXXXXX");
        if (!mkdtemp(tmp_root)) fail_msg("mkdtemp");
    }
    char from[512], draft[512];
    snprintf(from, sizeof from, "%s/tests/fixtures/dense-tiny", root());
    snprintf(draft, sizeof draft, "%s/tests/fixtures/dflash-tiny", root());
    snprintf(dirs[w], sizeof dirs[w], "%s/pkg-%s", tmp_root, splash_dtype_name(w));
    splash_pack_options o = {.from = from, .draft = draft, .out = dirs[w], .weights = w, .threads = 2, .force = 1};
    splash_pack_stats st;
    splash_error err = {0};
    if (splash_pack(&o, &st, &err)) fail_msg("pack: %s", err.msg);
    return dirs[w];
}

typedef struct run {
    splash_package *pkg;
    splash_dflash *d;
    splash_dflash_state *s;
} run;

static void open_run(run *r, splash_dtype w, int act, int threads) {
    splash_error err = {0};
    if (splash_package_open(packed(w), &r->pkg, &err)) fail_msg("%s", err.msg);
    splash_dflash_options o = {.threads = threads, .act = act, .max_context = MAX_CTX};
    if (splash_dflash_load(r->pkg, &o, &r->d, &err)) fail_msg("%s", err.msg);
    if (splash_dflash_state_new(r->d, &r->s, &err)) fail_msg("%s", err.msg);
}

static void close_run(run *r) {
    splash_dflash_state_free(r->s);
    splash_dflash_free(r->d);
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

/* The two fixture blocks: hidden [2][B-1][H], logits [2][B-1][V]. */
static void two_blocks(run *r, int one_by_one, float *hid, float *lg) {
    splash_error err = {0};
    splash_dflash_state_reset(r->s);
    if (one_by_one) {
        for (int p = 0; p < 40; p++)
            if (splash_dflash_append(r->d, r->s, taps + (size_t)p * TAPW, 1, &err)) fail_msg("%s", err.msg);
    } else if (splash_dflash_append(r->d, r->s, taps, 40, &err)) {
        fail_msg("%s", err.msg);
    }
    assert_int_equal(splash_dflash_state_positions(r->s), 40);
    if (splash_dflash_draft(r->d, r->s, 17, B, hid, lg, &err)) fail_msg("%s", err.msg);
    if (splash_dflash_append(r->d, r->s, taps + (size_t)40 * TAPW, 3, &err)) fail_msg("%s", err.msg);
    if (splash_dflash_draft(r->d, r->s, 301, B, hid + (B - 1) * H, lg + (B - 1) * V, &err)) fail_msg("%s", err.msg);
}

/* errors of both blocks against the reference: hidden and logits */
static void errors(const float *hid, const float *lg, double e_h[2], double e_l[2]) {
    for (int k = 0; k < 2; k++) {
        e_h[k] = rel_l2(hid + (size_t)k * (B - 1) * H, ref_hidden + (size_t)k * B * H + H, (size_t)(B - 1) * H);
        e_l[k] = rel_l2(lg + (size_t)k * (B - 1) * V, ref_logits + (size_t)k * (B - 1) * V, (size_t)(B - 1) * V);
    }
}

static void test_manifest(void **state) {
    (void)state;
    if (!fixture()) skip();
    splash_package *pkg;
    splash_error err = {0};
    if (splash_package_open(packed(SPLASH_Q4), &pkg, &err)) fail_msg("%s", err.msg);
    const json_value *d = json_get(splash_package_manifest(pkg), "draft");
    assert_non_null(d);
    assert_string_equal(json_get_string(d, "architecture", ""), "dflash");
    assert_int_equal(json_get_int(d, "block_size", 0), 8);
    assert_int_equal(json_get_int(d, "mask_token_id", 0), 511);
    assert_int_equal(json_get_int(d, "sliding_window", 0), 16);
    assert_int_equal(json_get_int(d, "head_dim", 0), 32);
    assert_true(json_get_num(d, "rms_eps", 0) == 1e-5);
    assert_true(json_get_num(d, "rope_theta", 0) == 1e6);
    const json_value *t = json_get(d, "target_layer_ids");
    assert_int_equal(t->count, 3);
    assert_int_equal((int)t->items[0]->num, 1);
    assert_int_equal((int)t->items[1]->num, 4);
    assert_int_equal((int)t->items[2]->num, 6);
    const json_value *c = json_get(d, "causal");
    assert_int_equal(c->count, 2);
    assert_true(c->items[0]->type == JSON_TRUE && c->items[1]->type == JSON_FALSE);
    assert_string_equal(json_string(json_get(d, "layer_types")->items[0]), "sliding_attention");
    const splash_tensor *fc = splash_package_find(pkg, "draft.fc");
    assert_non_null(fc);
    assert_int_equal(fc->dtype, SPLASH_Q4);
    assert_int_equal(fc->shape[1], TAPW);
    const splash_tensor *n = splash_package_find(pkg, "draft.layers.1.attn.k_norm");
    assert_non_null(n);
    assert_int_equal(n->dtype, SPLASH_F32);
    /* plain factors: the checkpoint's w, not 1 + w (weights ~ 1 + 0.2 N(0,1)) */
    assert_true(fabsf(((const float *)n->data)[0] - 1.0f) < 1.0f);
    assert_non_null(splash_package_find(pkg, "draft.layers.0.ffn.down"));
    assert_non_null(splash_package_file(pkg, "draft/layer-1.bin"));
    splash_package_close(pkg);
}

static void test_bf16_matches_reference(void **state) {
    (void)state;
    if (!fixture()) skip();
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
    /* the window matters here: ignoring it is far off */
    for (int k = 0; k < 2; k++) {
        double ew = rel_l2(hid + (size_t)k * (B - 1) * H, ref_nowin + (size_t)k * B * H + H, (size_t)(B - 1) * H);
        printf("# window ignored: block %d differs by %.3g\n", k, ew);
        assert_true(ew > 1e-2);
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
    /* memory: full layer max_context positions, sliding layer its window */
    size_t kvw = 2 * 32;
    assert_int_equal(splash_dflash_state_bytes(r.s), (MAX_CTX + 16) * kvw * 2 * sizeof(float));
    free(hid);
    free(lg);
    free(hid2);
    free(lg2);
    close_run(&r);
}

static void test_bad_input(void **state) {
    (void)state;
    if (!fixture()) skip();
    run r;
    open_run(&r, SPLASH_BF16, CPU_ACT_F32, 1);
    splash_error err = {0};
    float out[(B - 1) * H];
    assert_int_equal(splash_dflash_append(r.d, r.s, taps, 5, &err), 0);
    assert_int_not_equal(splash_dflash_draft(r.d, r.s, 17, 1, out, NULL, &err), 0);
    assert_int_not_equal(splash_dflash_draft(r.d, r.s, 17, B + 1, out, NULL, &err), 0);
    assert_int_not_equal(splash_dflash_draft(r.d, r.s, V, B, out, NULL, &err), 0);
    assert_int_not_equal(splash_dflash_append(r.d, r.s, taps, MAX_CTX, &err), 0);
    assert_int_equal(splash_dflash_state_positions(r.s), 5);
    assert_int_equal(splash_dflash_draft(r.d, r.s, 17, 4, out, NULL, &err), 0);
    close_run(&r);
    /* a package without a draft */
    char from[512], out_dir[600];
    snprintf(from, sizeof from, "%s/tests/fixtures/dense-tiny", root());
    packed(SPLASH_BF16);
    snprintf(out_dir, sizeof out_dir, "%s/pkg-nodraft", tmp_root);
    splash_pack_options o = {.from = from, .out = out_dir, .weights = SPLASH_BF16, .threads = 2, .force = 1};
    splash_pack_stats st;
    assert_int_equal(splash_pack(&o, &st, &err), 0);
    splash_package *pkg;
    assert_int_equal(splash_package_open(out_dir, &pkg, &err), 0);
    splash_dflash_options dopt = {.threads = 1, .max_context = 64};
    splash_dflash *d = NULL;
    assert_int_equal(splash_dflash_load(pkg, &dopt, &d, &err), SPLASH_E_NOTFOUND);
    splash_package_close(pkg);
}

static void test_quantized(void **state) {
    (void)state;
    if (!fixture()) skip();
    struct {
        splash_dtype w;
        int act;
        const char *name;
        double bound;
    } cases[] = {
        {SPLASH_Q8, CPU_ACT_F32, "q8 fp32-act", 2e-2},
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
        printf("# %s: block@40 hidden %.3g logits %.3g; block@43 hidden %.3g logits %.3g\n", cases[c].name, eh[0], el[0],
               eh[1], el[1]);
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
    free(ref_nowin);
    free(ref_logits);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_manifest),
        cmocka_unit_test(test_bf16_matches_reference),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_quantized),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
