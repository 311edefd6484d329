/* The shared runtime's pieces: the KV page pool, the prefix cache (radix
 * tree of pages + recurrent-state snapshots), the memory plan, and, on the
 * tiny fixture packages through the model entry point:
 *
 *   - batch invariance: a request's logits are bit-identical alone and beside
 *     7 other lanes (dense and MoE), and so are tokens sampled with a seed;
 *   - restore: a request that reuses a cached prefix (pages mapped from the
 *     cache, the snapshot restored into another slot) gives bit-identical
 *     logits to a cold run;
 *   - churn: many requests inserting, pinning and evicting pages with random
 *     cancellations leave the pool's and the cache's counters at zero.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/strbuf.h"
#include "package/package.h"
#include "package/packer.h"
#include "runtime/kv_pool.h"
#include "runtime/memory_plan.h"
#include "runtime/model.h"
#include "runtime/prefix_cache.h"
#include "runtime/sampling.h"
#include "runtime/state_cache.h"

#define PT 32

static const char *root(void) {
    const char *r = getenv("SPLASH_ROOT");
    return r && *r ? r : ".";
}

/* ---- pool and tree ------------------------------------------------------------- */

static void test_pool_refcounts(void **st) {
    (void)st;
    splash_kv_pool p;
    assert_int_equal(splash_kv_pool_init(&p, 4), 0);
    int32_t a = splash_kv_pool_alloc(&p), b = splash_kv_pool_alloc(&p);
    assert_true(a >= 0 && b >= 0 && a != b);
    splash_kv_pool_ref(&p, a);
    splash_kv_pool_unref(&p, a);
    assert_int_equal(p.n_free, 2);
    splash_kv_pool_unref(&p, a);
    splash_kv_pool_unref(&p, b);
    assert_int_equal(p.n_free, 4);
    for (int i = 0; i < 4; i++) assert_true(splash_kv_pool_alloc(&p) >= 0);
    assert_int_equal(splash_kv_pool_alloc(&p), -1);
    splash_kv_pool_free(&p);
}

static void fill(int32_t *t, int n, int seed) {
    for (int i = 0; i < n; i++) t[i] = (int32_t)((seed * 7919 + i * 31) % 1000);
}

static void test_tree_match_and_lru(void **st) {
    (void)st;
    splash_kv_pool p;
    splash_state_cache sc;
    splash_prefix_cache pc;
    assert_int_equal(splash_kv_pool_init(&p, 8), 0);
    assert_int_equal(splash_state_cache_init(&sc, NULL, 64, 2), 0);
    assert_int_equal(splash_prefix_cache_init(&pc, PT, &p, &sc), 0);
    int32_t a[3 * PT], b[3 * PT];
    fill(a, 3 * PT, 1);
    memcpy(b, a, sizeof a);
    b[2 * PT + 5] = 999; /* b shares two pages with a */
    splash_pc_node *n = NULL, *path[4];
    for (int i = 0; i < 3; i++) {
        int32_t pg = splash_kv_pool_alloc(&p);
        n = splash_prefix_insert(&pc, n, a + i * PT, NULL, pg);
        assert_non_null(n);
        splash_kv_pool_unref(&p, pg); /* the tree's reference is the only one left */
    }
    assert_int_equal(splash_prefix_match(&pc, a, 3 * PT, path, 4), 3);
    assert_int_equal(splash_prefix_match(&pc, a, 3 * PT - 1, path, 4), 2); /* whole pages only */
    assert_int_equal(splash_prefix_match(&pc, b, 3 * PT, path, 4), 2);
    /* a digest makes a different key */
    uint8_t dg[SPLASH_DIGEST_BYTES] = {1};
    assert_null(splash_prefix_find(&pc, NULL, a, dg));
    assert_non_null(splash_prefix_find(&pc, NULL, a, NULL));
    /* a pinned path is never evicted; the unpinned leaf goes first */
    splash_prefix_pin(&pc, path[0]);
    splash_prefix_pin(&pc, path[1]);
    assert_int_equal(splash_prefix_evictable(&pc), 1);
    assert_int_equal(splash_prefix_evict_one(&pc), 1);
    assert_int_equal(splash_prefix_evict_one(&pc), 0);
    assert_int_equal(p.n_free, 6);
    /* snapshots: a checkpoint gives way to a replay point, never the reverse */
    int s1 = splash_state_cache_take(&sc, SPLASH_SNAP_REPLAY, 1);
    int s2 = splash_state_cache_take(&sc, SPLASH_SNAP_CHECKPOINT, 2);
    assert_true(s1 >= 0 && s2 >= 0);
    sc.snaps[s1].node = path[0], path[0]->snap = s1;
    sc.snaps[s2].node = path[1], path[1]->snap = s2;
    assert_int_equal(splash_state_cache_take(&sc, SPLASH_SNAP_CHECKPOINT, 3), s2); /* evicts the checkpoint */
    assert_int_equal(path[1]->snap, -1);
    assert_int_equal(sc.evicted, 1);
    sc.snaps[s2].kind = SPLASH_SNAP_REPLAY;
    assert_int_equal(splash_state_cache_take(&sc, SPLASH_SNAP_CHECKPOINT, 4), -1); /* only replay points left */
    splash_prefix_unpin(&pc, path[0]);
    splash_prefix_unpin(&pc, path[1]);
    while (splash_prefix_evict_one(&pc)) {}
    assert_int_equal(pc.n_nodes, 0);
    assert_int_equal(sc.n_held, 1); /* the entry that no node owns */
    splash_state_cache_free(&sc);
    assert_int_equal(p.n_free, 8);
    splash_prefix_cache_free(&pc);
    splash_kv_pool_free(&p);
}

/* Many "requests" share prefixes, pin their paths, insert their pages, are
 * cancelled at random points, and eviction runs under pressure: afterwards
 * every counter is back to zero. */
static void test_churn_no_leak(void **st) {
    (void)st;
    enum { PAGES = 64, REQS = 1000 };
    splash_kv_pool p;
    splash_state_cache sc;
    splash_prefix_cache pc;
    assert_int_equal(splash_kv_pool_init(&p, PAGES), 0);
    assert_int_equal(splash_state_cache_init(&sc, NULL, 16, 4), 0);
    assert_int_equal(splash_prefix_cache_init(&pc, PT, &p, &sc), 0);
    srand(7);
    int32_t toks[8 * PT];
    for (int r = 0; r < REQS; r++) {
        int n_pages = 1 + rand() % 8;
        fill(toks, 8 * PT, rand() % 5); /* five conversations */
        toks[(rand() % (n_pages * PT))] = rand() % 1000; /* each request diverges somewhere */
        splash_pc_node *path[8];
        int32_t pages[8];
        int m = splash_prefix_match(&pc, toks, n_pages * PT, path, 8);
        for (int i = 0; i < m; i++) splash_prefix_pin(&pc, path[i]), pages[i] = path[i]->page, splash_kv_pool_ref(&p, pages[i]);
        while (p.n_free < n_pages - m && splash_prefix_evict_one(&pc)) {}
        int k = m, ok = 1;
        for (; k < n_pages; k++)
            if ((pages[k] = splash_kv_pool_alloc(&p)) < 0) {
                ok = 0;
                break;
            }
        int done = ok ? (rand() % 4 ? n_pages : rand() % n_pages) : k; /* cancelled part-way */
        for (int i = m; i < done; i++) {
            path[i] = splash_prefix_insert(&pc, i ? path[i - 1] : NULL, toks + i * PT, NULL, pages[i]);
            assert_non_null(path[i]);
            splash_prefix_pin(&pc, path[i]);
            if (rand() % 3 == 0 && path[i]->snap < 0) {
                int s = splash_state_cache_take(&sc, rand() % 3, pc.tick);
                if (s >= 0) sc.snaps[s].node = path[i], path[i]->snap = s;
            }
        }
        int pinned = done > m ? done : m;
        for (int i = 0; i < pinned; i++) splash_prefix_unpin(&pc, path[i]);
        for (int i = 0; i < k; i++) splash_kv_pool_unref(&p, pages[i]);
        assert_int_equal(splash_kv_pool_used(&p), pc.n_nodes);
    }
    while (splash_prefix_evict_one(&pc)) {}
    assert_int_equal(pc.n_nodes, 0);
    assert_int_equal(sc.n_held, 0);
    assert_int_equal(splash_kv_pool_used(&p), 0);
    assert_true(p.allocs == p.releases);
    splash_prefix_cache_free(&pc);
    splash_state_cache_free(&sc);
    splash_kv_pool_free(&p);
}

/* ---- memory plan ---------------------------------------------------------------- */

static void test_memory_plan(void **st) {
    (void)st;
    const size_t MiB = 1u << 20;
    splash_memory_plan_input in = {.available = 8192 * MiB, .weight_bytes = 4096 * MiB, .scratch_bytes = 256 * MiB,
                                   .page_bytes = 2 * MiB, .state_bytes = 64 * MiB, .page_tokens = 32, .lanes = 4,
                                   .model_context = 262144};
    splash_memory_plan p;
    assert_int_equal(splash_memory_plan_make(&in, &p), 0);
    /* margin 5% + 256 MiB = 665.6 MiB; reserves 16 + 32 MiB */
    assert_int_equal(p.margin, 8192 * MiB / 20 + 256 * MiB);
    assert_int_equal(p.budget, 8192 * MiB - p.margin);
    assert_int_equal(p.fixed, 4096 * MiB + 256 * MiB + 48 * MiB);
    assert_int_equal(p.pool, p.budget - p.fixed);
    assert_int_equal(p.slot_bytes, 256 * MiB);
    assert_int_equal(p.kv_bytes + p.snapshot_bytes + p.slot_bytes <= p.pool, 1);
    assert_int_equal(p.max_context, p.n_pages * 32 < 262144 ? p.n_pages * 32 : 262144);
    assert_null(p.reason);
    /* --max-memory below the weights */
    in.max_memory = 4000 * MiB;
    assert_int_not_equal(splash_memory_plan_make(&in, &p), 0);
    assert_string_equal(p.reason, "working_set_too_small");
    strbuf b;
    sb_init(&b);
    splash_memory_plan_print(&p, &b);
    const char *want[] = {"budget", "weights", "scratch", "reserves", "fixed", "pool", "kv pages", "deficit",
                          "working_set_too_small"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) assert_non_null(strstr(b.data, want[i]));
    sb_free(&b);
    /* room for the weights but not for a 128K context */
    in.max_memory = 4096 * MiB + 256 * MiB + 48 * MiB + 256 * MiB + 100 * MiB;
    in.max_context = 131072;
    assert_int_not_equal(splash_memory_plan_make(&in, &p), 0);
    assert_string_equal(p.reason, "kv_pool_does_not_fit");
    assert_true(p.deficit > 0);
}

/* The model's spare wish gets only what the KV cap leaves: nothing when the
 * pages take the whole pool, the wish or the rest (whichever is less) when
 * the cap bounds them; the pages and snapshots do not change with it. */
static void test_memory_plan_spare(void **st) {
    (void)st;
    const size_t MiB = 1u << 20;
    splash_memory_plan_input in = {.available = 8192 * MiB, .weight_bytes = 4096 * MiB, .scratch_bytes = 256 * MiB,
                                   .page_bytes = 2 * MiB, .state_bytes = 64 * MiB, .page_tokens = 32, .lanes = 4,
                                   .model_context = 262144, .spare_want = 1024 * MiB};
    splash_memory_plan p, q;
    assert_int_equal(splash_memory_plan_make(&in, &p), 0); /* no cap: every byte to pages */
    assert_int_equal(p.spare, 0);
    in.pool_cap = 1000 * MiB;
    assert_int_equal(splash_memory_plan_make(&in, &p), 0);
    const size_t left = p.pool - p.slot_bytes - p.snapshot_bytes - p.kv_bytes;
    assert_int_equal(p.kv_bytes, 1000 * MiB);
    assert_true(left > 1024 * MiB);
    assert_int_equal(p.spare, 1024 * MiB); /* the wish, all of it */
    in.spare_want = (size_t)64 << 30;
    assert_int_equal(splash_memory_plan_make(&in, &q), 0);
    assert_int_equal(q.spare, left); /* the rest, no more */
    assert_int_equal(q.kv_bytes, p.kv_bytes);
    assert_int_equal(q.snapshot_bytes, p.snapshot_bytes);
    strbuf b;
    sb_init(&b);
    splash_memory_plan_print(&q, &b);
    assert_non_null(strstr(b.data, "spare (model)"));
    sb_free(&b);
}

/* ---- on the fixtures ------------------------------------------------------------ */

typedef struct fx {
    char pkg_dir[512];
    splash_package *pkg;
    splash_model *m;
    const splash_model_needs *nd;
    void *kv, *states;
    int n_pages;
} fx;

enum { LANES = 8, MAXR = 512, NP = 64 };

static int fx_open(const char *name, fx *f) {
    memset(f, 0, sizeof *f);
    char from[512];
    snprintf(from, sizeof from, "%s/tests/fixtures/%s", root(), name);
    if (access(from, R_OK)) return -1;
    char tmpl[] = "/tmp/splash-rt-XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    snprintf(f->pkg_dir, sizeof f->pkg_dir, "%s/pkg", tmpl);
    splash_error err = {0};
    splash_pack_options o = {.from = from, .out = f->pkg_dir, .weights = SPLASH_BF16, .threads = 2, .force = 1};
    splash_pack_stats ps;
    if (splash_pack(&o, &ps, &err)) fail_msg("pack %s: %s", name, err.msg);
    if (splash_package_open(f->pkg_dir, &f->pkg, &err)) fail_msg("%s", err.msg);
    splash_model_options mo = {.threads = 2, .max_rows = MAXR, .max_lanes = LANES, .kv_format = SPLASH_KV_F32};
    if (splash_model_load(f->pkg, &mo, &f->m, &err)) fail_msg("%s", err.msg);
    f->nd = splash_model_get_needs(f->m);
    f->n_pages = NP;
    f->kv = splash_model_alloc_memory(f->m, f->nd->page_bytes * NP);
    f->states = splash_model_alloc_memory(f->m, f->nd->state_bytes * LANES);
    if (splash_model_attach_memory(f->m, f->kv, NP, f->states, LANES, &err)) fail_msg("%s", err.msg);
    return 0;
}

static void fx_close(fx *f) {
    splash_model_free_memory(f->m, f->kv);
    splash_model_free_memory(f->m, f->states);
    splash_model_free(f->m);
    splash_package_close(f->pkg);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->pkg_dir);
    (void)!system(cmd);
}

typedef struct req {
    int slot, n_past, n_rows;
    const int32_t *tok; /* whole sequence */
    const int32_t *pages;
} req;

/* One forward of n lanes, every row's logits (row order). */
static void forward(fx *f, const req *rs, int n, float *logits) {
    splash_lane lanes[LANES];
    static splash_row rows[MAXR];
    int r = 0;
    for (int i = 0; i < n; i++) {
        lanes[i] = (splash_lane){rs[i].slot, rs[i].n_past, r, rs[i].n_rows, rs[i].pages, 8, SPLASH_LANE_PREFILL};
        for (int k = 0; k < rs[i].n_rows; k++, r++) {
            int t = rs[i].n_past + k;
            rows[r] = (splash_row){rs[i].tok[t], {t, t, t}, SPLASH_ROW_LOGITS, NULL};
        }
    }
    splash_batch b = {.n_lanes = n, .n_rows = r, .lanes = lanes, .rows = rows, .logits = logits};
    splash_error err = {0};
    if (splash_model_forward(f->m, &b, &err)) fail_msg("forward: %s", err.msg);
}

static void batch_invariance(const char *name) {
    fx f;
    if (fx_open(name, &f)) {
        skip();
        return;
    }
    int V = f.nd->vocab;
    int32_t tok[LANES][64], pages[LANES][8];
    for (int l = 0; l < LANES; l++) {
        for (int t = 0; t < 64; t++) tok[l][t] = (int32_t)((l * 131 + t * 17 + 3) % V);
        for (int p = 0; p < 8; p++) pages[l][p] = (int32_t)(l * 8 + (p * 5) % 8);
    }
    float *alone = malloc(sizeof(float) * 40 * V), *mixed = malloc(sizeof(float) * MAXR * V);
    float *mixed3 = malloc(sizeof(float) * 16 * V);
    /* lane 3 alone: 24 prompt rows, then 16 more */
    splash_model_reset_slot(f.m, 3);
    req a = {3, 0, 24, tok[3], pages[3]};
    forward(&f, &a, 1, alone);
    a = (req){3, 24, 16, tok[3], pages[3]};
    forward(&f, &a, 1, alone + (size_t)24 * V);
    /* the same beside 7 others of other lengths, in another arrangement */
    for (int s = 0; s < LANES; s++) splash_model_reset_slot(f.m, s);
    for (int step = 0; step < 2; step++) {
        req rs[LANES];
        int n = 0, row3 = 0, rows = 0;
        for (int l = LANES - 1; l >= 0; l--) { /* reverse order: lane 3 lands in the middle */
            int past = step ? (l == 3 ? 24 : 9 + l) : 0, cnt = step ? (l == 3 ? 16 : 1 + l) : (l == 3 ? 24 : 9 + l);
            rs[n++] = (req){l, past, cnt, tok[l], pages[l]};
            if (l == 3) row3 = rows;
            rows += cnt;
        }
        forward(&f, rs, n, mixed);
        int off = step ? 24 : 0, cnt = step ? 16 : 24;
        assert_memory_equal(alone + (size_t)off * V, mixed + (size_t)row3 * V, sizeof(float) * cnt * V);
        if (step) memcpy(mixed3, mixed + (size_t)row3 * V, sizeof(float) * 16 * V);
    }
    /* sampled with a seed: the same tokens from both */
    splash_sampler *smp;
    splash_error err = {0};
    assert_int_equal(splash_sampler_create(V, &smp, &err), 0);
    splash_sampling_params sp;
    splash_sampling_params_default(&sp);
    sp.temperature = 1.0f;
    sp.seed = 42;
    for (int t = 0; t < 16; t++) {
        int32_t x, y;
        assert_int_equal(splash_sample(smp, &sp, alone + (size_t)(24 + t) * V, NULL, NULL, 0, NULL, (uint64_t)(24 + t), &x, &err), 0);
        assert_int_equal(splash_sample(smp, &sp, mixed3 + (size_t)t * V, NULL, NULL, 0, NULL, (uint64_t)(24 + t), &y, &err), 0);
        assert_int_equal(x, y);
    }
    splash_sampler_free(smp);
    free(alone);
    free(mixed);
    free(mixed3);
    fx_close(&f);
}

static void test_batch_invariance_dense(void **st) { (void)st; batch_invariance("dense-tiny"); }
static void test_batch_invariance_moe(void **st) { (void)st; batch_invariance("moe-tiny"); }

/* A request restored from the cache = a cold run, bit for bit. */
static void restore_equals_cold(const char *name) {
    fx f;
    if (fx_open(name, &f)) {
        skip();
        return;
    }
    int V = f.nd->vocab;
    splash_kv_pool pool;
    splash_state_cache sc;
    splash_prefix_cache pc;
    assert_int_equal(splash_kv_pool_init(&pool, NP), 0);
    assert_int_equal(splash_state_cache_init(&sc, f.m, f.nd->state_bytes, 4), 0);
    assert_int_equal(splash_prefix_cache_init(&pc, PT, &pool, &sc), 0);
    int32_t a[100], b[100];
    for (int t = 0; t < 100; t++) a[t] = b[t] = (int32_t)((t * 37 + 11) % V);
    for (int t = 70; t < 100; t++) b[t] = (int32_t)((t * 53 + 5) % V); /* b leaves a at 70 */
    /* request A on slot 0: prefill to 64 (a page boundary), snapshot, insert its pages */
    int32_t pa[4];
    for (int i = 0; i < 4; i++) pa[i] = splash_kv_pool_alloc(&pool);
    float *lg = malloc(sizeof(float) * MAXR * V), *cold = malloc(sizeof(float) * 100 * V);
    splash_model_reset_slot(f.m, 0);
    req r = {0, 0, 64, a, pa};
    forward(&f, &r, 1, lg);
    splash_pc_node *n0 = splash_prefix_insert(&pc, NULL, a, NULL, pa[0]);
    splash_pc_node *n1 = splash_prefix_insert(&pc, n0, a + PT, NULL, pa[1]);
    int s = splash_state_cache_take(&sc, SPLASH_SNAP_REPLAY, 1);
    assert_true(s >= 0);
    assert_int_equal(splash_model_snapshot(f.m, 0, sc.snaps[s].buf), 0);
    sc.snaps[s].node = n1, n1->snap = s;
    r = (req){0, 64, 36, a, pa}; /* A goes on (writes its own pages 2, 3) */
    forward(&f, &r, 1, lg);
    for (int i = 0; i < 4; i++) splash_kv_pool_unref(&pool, pa[i]);
    /* B cold on slot 1 with its own pages, in one call: a row's numbers do not
     * depend on where a prefill call starts (the CPU runs the GDN recurrence,
     * never the chunked algorithm), so no split at the snapshot is needed */
    int32_t pb[4];
    for (int i = 0; i < 4; i++) pb[i] = splash_kv_pool_alloc(&pool);
    splash_model_reset_slot(f.m, 1);
    r = (req){1, 0, 100, b, pb};
    forward(&f, &r, 1, cold);
    /* B from the cache on slot 2: match, restore, map the shared pages, prefill the rest */
    splash_pc_node *path[4];
    int m = splash_prefix_match(&pc, b, 99, path, 4);
    assert_int_equal(m, 2);
    assert_true(path[1]->snap >= 0);
    int32_t pw[4] = {path[0]->page, path[1]->page, splash_kv_pool_alloc(&pool), splash_kv_pool_alloc(&pool)};
    assert_int_equal(splash_model_restore(f.m, 2, sc.snaps[path[1]->snap].buf), 0);
    r = (req){2, 64, 36, b, pw};
    forward(&f, &r, 1, lg);
    assert_memory_equal(cold + (size_t)64 * V, lg, sizeof(float) * 36 * V);
    /* the shared pages are untouched: A's cached prefix still restores to the same logits */
    splash_kv_pool_unref(&pool, pw[2]);
    splash_kv_pool_unref(&pool, pw[3]);
    for (int i = 0; i < 4; i++) splash_kv_pool_unref(&pool, pb[i]);
    splash_prefix_cache_free(&pc);
    splash_state_cache_free(&sc);
    assert_int_equal(splash_kv_pool_used(&pool), 0);
    splash_kv_pool_free(&pool);
    free(lg);
    free(cold);
    fx_close(&f);
}

static void test_restore_dense(void **st) { (void)st; restore_equals_cold("dense-tiny"); }
static void test_restore_moe(void **st) { (void)st; restore_equals_cold("moe-tiny"); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_refcounts),
        cmocka_unit_test(test_tree_match_and_lru),
        cmocka_unit_test(test_churn_no_leak),
        cmocka_unit_test(test_memory_plan),
        cmocka_unit_test(test_memory_plan_spare),
        cmocka_unit_test(test_batch_invariance_dense),
        cmocka_unit_test(test_batch_invariance_moe),
        cmocka_unit_test(test_restore_dense),
        cmocka_unit_test(test_restore_moe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
