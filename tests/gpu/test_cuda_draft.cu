/* test_cuda_draft.cu - the DFlash drafts on the GPU (models/dflash/cuda_dflash.cu)
 * against the CPU drafts (dflash.c, dflash2.c), through runtime/draft.h's
 * ops, on the tiny fixtures: dense-tiny packed with dflash-tiny (v1: a
 * sliding and a full layer) and with dflash2-tiny (v2: conv, embedding
 * scale, logit transform, selector), each as q4 and bf16.
 *
 * The packages are made beforehand (tools/gpu_tests.sh packs them):
 * <packages>/dflash-q4, dflash-bf16, dflash2-q4, dflash2-bf16.  Both drafts
 * open the same package with 2 lanes and a 40-position window (the sliding
 * layers hold 16); the CPU with fp32 activations, its exact path.  The taps
 * are random (the drafts do not care where they come from).  Cases:
 *   block after 37           append 37 positions, draft a block of 8
 *   block after the wrap     append 50 more (both rings wrap), a block of 16
 *   seek                     lane 1 jumps to position 10, appends 20, block 4
 *   propose greedy           the tokens (v1: the GPU's argmax against the
 *                            CPU's logits; v2: the selector's walk) equal
 *   propose T=1              v2: tokens equal, q within 1e-4; v1: the GPU's
 *                            sparse q is the softmax of the CPU's top-32
 *                            logits (within 1e-4), its pick the same draw
 *   snapshot                 the GPU's bytes against the CPU's (header
 *                            equal, rings within 1e-5); a GPU snapshot
 *                            restored into lane 1 drafts the same bits as
 *                            lane 0; a CPU snapshot restored on the GPU
 *                            drafts what the CPU drafts
 *   lanes together           propose_lanes over 6 requests (5 lanes, 80
 *                            rows: three forwards) = each proposed alone,
 *                            greedy and T=1, bit for bit
 *   append lanes together    append_lanes over 6 lanes' rows (two passes,
 *                            a chunked lane, a seek, a lane twice) = append
 *                            lane by lane: the snapshots byte for byte
 *   append behind            refused by both
 * Hidden states and logits are compared row by row (relative L2, worst row,
 * bound 1e-4).  Prints one line per check, then a table; exits 1 if a check
 * failed.  Usage: test_cuda_draft PACKAGES (or $SPLASH_TEST_PACKAGES).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "models/dflash/dflash.h"
#include "models/dflash/dflash2.h"
#include "models/dflash/dflash2_draft.h"
#include "package/package.h"
#include "runtime/draft.h"
#include "runtime/model.h"
}
#include "backend/cuda/cuda_check.h"
#include "models/dflash/cuda_dflash.h"

#define WINDOW 40
#define LANES 5
#define MAXB 16

/* ---- results ---------------------------------------------------------------------------- */

typedef struct {
    char fixture[24], what[40];
    double worst, bound;
    int pass;
} Row;
/* the table's rows (the first kMaxRows checks); every check is counted */
enum { kMaxRows = 256 };
static Row g_rows[kMaxRows];
static int g_nrows, g_nchecks, g_fail;

static void report(const char *fixture, const char *what, double worst, double bound) {
    const int pass = isfinite(worst) && worst <= bound;
    if (!pass) g_fail++;
    printf("%s %-14s %-36s worst %.3g (bound %.0e)\n", pass ? "PASS" : "FAIL", fixture, what, worst, bound);
    fflush(stdout);
    g_nchecks++;
    if (g_nrows < kMaxRows) {
        Row *r = &g_rows[g_nrows++];
        snprintf(r->fixture, sizeof r->fixture, "%s", fixture);
        snprintf(r->what, sizeof r->what, "%s", what);
        r->worst = worst, r->bound = bound, r->pass = pass;
    }
}

static void report_exact(const char *fixture, const char *what, int same) {
    report(fixture, what, same ? 0.0 : INFINITY, 0.0);
}

static void die(const char *what, const splash_error *err) {
    fprintf(stderr, "FATAL %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

/* Worst relative L2 over rows of [rows][n]. */
static double worst_row(const float *a, const float *b, int rows, int n) {
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        double d = 0, s = 0;
        for (int i = 0; i < n; i++) {
            const double x = a[(size_t)r * n + i], y = b[(size_t)r * n + i];
            d += (x - y) * (x - y), s += y * y;
        }
        const double e = s > 0 ? sqrt(d / s) : sqrt(d);
        if (!(e <= worst)) worst = e; /* NaN sticks */
    }
    return worst;
}

/* ---- one fixture ------------------------------------------------------------------------- */

typedef struct {
    const char *label;
    splash_package *pkg;
    splash_draft *cpu, *gpu;
    splash_dflash *m1;  /* the CPU model the reference forwards run on (v1, or v2) */
    splash_dflash2 *m2;
    int v2, H, V, n_in;
    float *taps;      /* [200][n_in] */
    int32_t seq[256]; /* the tokens the lanes hold (their values do not matter to the drafts) */
} Fx;

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform [-2, 2) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) * (4.0 / 16777216.0) - 2.0);
}

static int fx_open(Fx *f, const char *packages, const char *name) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", packages, name);
    splash_error err = {};
    if (splash_package_open(dir, &f->pkg, &err)) {
        printf("SKIP %s: %s\n", name, err.msg);
        return 1;
    }
    splash_draft_options o = {};
    o.threads = 2, o.act = SPLASH_CPU_ACT_F32, o.lanes = LANES, o.window = WINDOW, o.max_block = MAXB;
    o.device = "cpu";
    if (splash_draft_open(f->pkg, &o, &f->cpu, &err)) die("the CPU draft", &err);
    o.device = "cuda";
    if (splash_draft_open(f->pkg, &o, &f->gpu, &err)) die("the GPU draft", &err);
    f->v2 = !strcmp(f->cpu->name, "dflash2");
    splash_dflash_options mo = {};
    mo.threads = 2, mo.act = 0, mo.window = WINDOW, mo.max_block = MAXB;
    if (f->v2 ? splash_dflash2_load(f->pkg, &mo, &f->m2, &err) : splash_dflash_load(f->pkg, &mo, &f->m1, &err))
        die("the CPU reference model", &err);
    const json_value *m = splash_package_manifest(f->pkg);
    f->H = (int)json_get(json_get(m, "draft"), "hidden")->num;
    f->V = (int)json_get(json_get(m, "model"), "vocab")->num;
    f->n_in = f->cpu->n_taps * f->H;
    if (f->gpu->n_taps != f->cpu->n_taps || f->gpu->snapshot_bytes != f->cpu->snapshot_bytes ||
        f->gpu->max_block != f->cpu->max_block)
        die("the drafts describe themselves differently", NULL);
    f->taps = (float *)malloc(sizeof(float) * 200 * f->n_in);
    for (size_t i = 0; i < (size_t)200 * f->n_in; i++) f->taps[i] = frand();
    for (int i = 0; i < 256; i++) f->seq[i] = (int32_t)((i * 37 + 11) % (f->V - 1));
    return 0;
}

static void append_both(Fx *f, int lane, int pos, int tap0, int n) {
    splash_error err = {};
    if (f->cpu->ops->append(f->cpu->impl, lane, pos, f->taps + (size_t)tap0 * f->n_in, n, &err)) die("CPU append", &err);
    if (f->gpu->ops->append(f->gpu->impl, lane, pos, f->taps + (size_t)tap0 * f->n_in, n, &err)) die("GPU append", &err);
}

/* The CPU draft's forward of a lane (the drafts' own functions on the state the ops keep). */
static void cpu_forward(Fx *f, int lane, int32_t anchor, int block, float *hidden, float *logits);

/* A block of `block` rows on lane at the lane's position: hidden and logits both sides. */
static void case_block(Fx *f, int lane, int block, const char *what) {
    const int n = block - 1;
    float *hc = (float *)malloc(sizeof(float) * n * f->H), *hg = (float *)malloc(sizeof(float) * n * f->H);
    float *lc = (float *)malloc(sizeof(float) * n * f->V), *lg = (float *)malloc(sizeof(float) * n * f->V);
    const int32_t anchor = 7;
    cpu_forward(f, lane, anchor, block, hc, lc);
    splash_error err = {};
    if (splash_dflash_cuda_forward(f->gpu, lane, anchor, block, hg, lg, &err)) die("GPU forward", &err);
    char w[64];
    snprintf(w, sizeof w, "%s: hidden", what);
    report(f->label, w, worst_row(hg, hc, n, f->H), 1e-4);
    snprintf(w, sizeof w, "%s: logits", what);
    report(f->label, w, worst_row(lg, lc, n, f->V), 1e-4);
    free(hc), free(hg), free(lc), free(lg);
}

/* propose through the ops on both sides at the lane's position. */
static void case_propose(Fx *f, int lane, int n_seq, int n, double T) {
    splash_sampling_params sp = {};
    sp.temperature = T, sp.top_p = 1, sp.repetition_penalty = 1, sp.seed = 1234;
    splash_spec_q qc[MAXB], qg[MAXB];
    int32_t tc[MAXB], tg[MAXB];
    float *lc = (float *)malloc(sizeof(float) * MAXB * f->V), *lg = (float *)malloc(sizeof(float) * MAXB * f->V);
    splash_draft_req rc = {lane, f->seq, n_seq, n, &sp, qc}, rg = {lane, f->seq, n_seq, n, &sp, qg};
    splash_error err = {};
    const int kc = f->cpu->ops->propose(f->cpu->impl, &rc, lc, tc, &err);
    if (kc < 0) die("CPU propose", &err);
    const int kg = f->gpu->ops->propose(f->gpu->impl, &rg, lg, tg, &err);
    if (kg < 0) die("GPU propose", &err);
    char w[64];
    if (f->v2) {
        int same = kc == SPLASH_DRAFT_SPARSE && kg == SPLASH_DRAFT_SPARSE;
        double dq = 0;
        for (int i = 0; same && i < n; i++) {
            same = tc[i] == tg[i] && qc[i].n == qg[i].n;
            for (int j = 0; same && j < qc[i].n; j++) {
                same = qc[i].ids[j] == qg[i].ids[j];
                if (fabs(qc[i].p[j] - qg[i].p[j]) > dq) dq = fabs(qc[i].p[j] - qg[i].p[j]);
            }
        }
        snprintf(w, sizeof w, "propose T=%g: tokens, candidates", T);
        report_exact(f->label, w, same);
        snprintf(w, sizeof w, "propose T=%g: q", T);
        report(f->label, w, same ? dq : INFINITY, 1e-4);
    } else if (T > 0) { /* the GPU's sparse q: the softmax of the CPU's top logits, the pick by the same draw */
        int same = kc == SPLASH_DRAFT_LOGITS && kg == SPLASH_DRAFT_SPARSE;
        double dq = 0;
        float u[MAXB];
        splash_dflash2_select_args a;
        splash_dflash2_draft_args(&sp, (uint64_t)n_seq, n, u, &a);
        for (int i = 0; same && i < n; i++) {
            const int k = qg[i].n;
            float top[SPLASH_SPEC_MAX_CAND], q[SPLASH_SPEC_MAX_CAND];
            const float *row = lc + (size_t)i * f->V;
            for (int j = 0; same && j < k; j++) { /* candidate j: the j-th largest CPU logit (ties: lower id) */
                int best = -1;
                for (int t = 0; t < f->V; t++) {
                    int taken = 0;
                    for (int p = 0; p < j && !taken; p++) taken = qg[i].ids[p] == t;
                    if (!taken && (best < 0 || row[t] > row[best])) best = t;
                }
                same = qg[i].ids[j] == best;
                top[j] = row[best];
            }
            if (!same || k < 1) break;
            const int pick = splash_dflash2_pick(top, k, (float)T, u[i], q);
            same = tg[i] == qg[i].ids[pick];
            for (int j = 0; j < k; j++)
                if (fabs(q[j] - qg[i].p[j]) > dq) dq = fabs(q[j] - qg[i].p[j]);
        }
        snprintf(w, sizeof w, "propose T=%g: top logits, pick", T);
        report_exact(f->label, w, same);
        snprintf(w, sizeof w, "propose T=%g: q", T);
        report(f->label, w, same ? dq : INFINITY, 1e-4);
    } else { /* the GPU's argmax against the CPU's logits */
        int same = kc == SPLASH_DRAFT_LOGITS && kg == SPLASH_DRAFT_TOKENS;
        for (int i = 0; same && i < n; i++) {
            int best = 0;
            for (int t = 1; t < f->V; t++)
                if (lc[(size_t)i * f->V + t] > lc[(size_t)i * f->V + best]) best = t;
            same = tg[i] == best;
        }
        report_exact(f->label, "propose greedy: tokens", same);
    }
    free(lc), free(lg);
}

/* propose_lanes (the blocks of several lanes through one forward) against
 * propose lane by lane, on the GPU draft: the same tokens and q, bit for bit.
 * Five blocks of 16 rows: lane 0 at 87, lane 1 at 30, lanes 2-4 empty at 0
 * (80 rows: two forwards, the first full), then lane 0 again (a lane met twice
 * starts a new forward). */
static void case_lanes(Fx *f, double T) {
    splash_sampling_params sp = {};
    sp.temperature = T, sp.top_p = 1, sp.repetition_penalty = 1, sp.seed = 99;
    enum { NR = 6, N = 15 };
    static const int lane[NR] = {0, 1, 2, 3, 4, 0}, n_seq[NR] = {88, 31, 1, 1, 1, 88};
    static splash_spec_q qa[NR][MAXB], qt[NR][MAXB];
    int32_t ta[NR][MAXB], tt[NR][MAXB];
    float *logits[NR] = {};
    int32_t *tokens[NR];
    int kinds[NR];
    splash_draft_req r[NR];
    splash_error err = {}, errs[NR] = {};
    int same = f->gpu->ops->propose_lanes != nullptr;
    for (int i = 0; i < NR; i++) r[i] = {lane[i], f->seq, n_seq[i], N, &sp, qt[i]}, tokens[i] = tt[i];
    if (same && f->gpu->ops->propose_lanes(f->gpu->impl, r, NR, logits, tokens, kinds, errs)) die("propose_lanes", errs);
    for (int i = 0; same && i < NR; i++)
        if (kinds[i] < 0) die("propose_lanes", &errs[i]);
    for (int i = 0; same && i < NR; i++) {
        splash_draft_req a = r[i];
        a.q = qa[i];
        const int k = f->gpu->ops->propose(f->gpu->impl, &a, nullptr, ta[i], &err);
        if (k < 0) die("GPU propose", &err);
        same = k == kinds[i] && !memcmp(ta[i], tt[i], sizeof(int32_t) * N);
        for (int j = 0; same && k == SPLASH_DRAFT_SPARSE && j < N; j++)
            same = qa[i][j].n == qt[i][j].n && !memcmp(qa[i][j].ids, qt[i][j].ids, sizeof(int32_t) * qa[i][j].n) &&
                   !memcmp(qa[i][j].p, qt[i][j].p, sizeof(float) * qa[i][j].n);
    }
    char w[64];
    snprintf(w, sizeof w, "lanes together = alone, T=%g", T);
    report_exact(f->label, w, same);
    if (T > 0) return;
    /* a bad request among good ones: only it fails, with its own message */
    memset(errs, 0, sizeof errs);
    r[1].n = MAXB; /* a block of MAXB + 1 rows */
    if (f->gpu->ops->propose_lanes(f->gpu->impl, r, 3, logits, tokens, kinds, errs)) die("propose_lanes", errs);
    const int alone_ok = kinds[0] > 0 && kinds[2] > 0 && kinds[1] < 0 && strstr(errs[1].msg, "block") &&
                         !errs[0].msg[0] && !errs[2].msg[0] && !memcmp(tt[0], ta[0], sizeof(int32_t) * N);
    report_exact(f->label, "lanes together: one bad request", alone_ok);
}

/* append_lanes against append lane by lane, on the GPU draft: the lanes'
 * snapshots equal byte for byte.  Six appends: lanes 2 (5 rows), 3 (a seek to
 * 3, 30 rows), 4 (40 rows: past the pass's 64, a second pass), 0 (3 rows at
 * 87), 1 (70 rows: chunks of its own) and 2 again (a new pass); then every
 * lane is put back as it was. */
static void case_append_lanes(Fx *f) {
    enum { NT = 6 };
    static const int lane[NT] = {2, 3, 4, 0, 1, 2}, pos[NT] = {0, 3, 0, 87, 30, 5}, tap0[NT] = {0, 10, 50, 100, 110, 180};
    static const int rows[NT] = {5, 30, 40, 3, 70, 2};
    const size_t nb = f->gpu->snapshot_bytes;
    uint8_t *before = (uint8_t *)malloc(nb * LANES), *together = (uint8_t *)malloc(nb * LANES);
    uint8_t *alone = (uint8_t *)malloc(nb * LANES);
    splash_error err = {};
    const splash_draft_ops *o = f->gpu->ops;
    for (int l = 0; l < LANES; l++) o->snapshot(f->gpu->impl, l, before + nb * l);
    splash_draft_taps t[NT];
    int status[NT], ok = o->append_lanes != nullptr;
    splash_error errs[NT] = {};
    for (int i = 0; i < NT; i++) t[i] = {lane[i], pos[i], f->taps + (size_t)tap0[i] * f->n_in, rows[i]};
    if (ok && o->append_lanes(f->gpu->impl, t, NT, 0, status, errs)) die("append_lanes", errs);
    for (int i = 0; ok && i < NT; i++) ok = status[i] == 0;
    for (int l = 0; l < LANES; l++) o->snapshot(f->gpu->impl, l, together + nb * l);
    for (int l = 0; l < LANES; l++)
        if (o->restore(f->gpu->impl, l, before + nb * l, &err)) die("GPU restore", &err);
    for (int i = 0; i < NT; i++)
        if (o->append(f->gpu->impl, lane[i], pos[i], t[i].taps, rows[i], &err)) die("GPU append", &err);
    for (int l = 0; l < LANES; l++) o->snapshot(f->gpu->impl, l, alone + nb * l);
    report_exact(f->label, "append lanes together = alone", ok && !memcmp(together, alone, nb * LANES));
    for (int l = 0; l < LANES; l++)
        if (o->restore(f->gpu->impl, l, before + nb * l, &err)) die("GPU restore", &err);
    free(before), free(together), free(alone);
}

/* Appends of one row a call (auto block's block-1 steps) against one append
 * of all the rows: lanes 0 and 1 from position 0, 40 rows each, one row a
 * call in turn (past the sliding layers' rings); their snapshots equal byte
 * for byte.  Then a restore right after an append: the lane is what was
 * restored (a draft that defers its appends must land them before it, not
 * on it: tried in session 20, see NOTES.md). */
static void case_append_rowwise(Fx *f) {
    enum { N = 40 };
    const size_t nb = f->gpu->snapshot_bytes;
    uint8_t *before = (uint8_t *)malloc(nb * LANES), *one = (uint8_t *)malloc(nb * 2), *rows = (uint8_t *)malloc(nb * 2);
    splash_error err = {};
    const splash_draft_ops *o = f->gpu->ops;
    void *g = f->gpu->impl;
    for (int l = 0; l < LANES; l++) o->snapshot(g, l, before + nb * l);
    const float *tp[2] = {f->taps, f->taps + (size_t)50 * f->n_in};
    for (int l = 0; l < 2; l++) {
        o->reset(g, l);
        if (o->append(g, l, 0, tp[l], N, &err)) die("GPU append", &err);
    }
    for (int l = 0; l < 2; l++) o->snapshot(g, l, one + nb * l);
    for (int l = 0; l < 2; l++) o->reset(g, l);
    for (int r = 0; r < N; r++)
        for (int l = 0; l < 2; l++)
            if (o->append(g, l, r, tp[l] + (size_t)r * f->n_in, 1, &err)) die("GPU append", &err);
    for (int l = 0; l < 2; l++) o->snapshot(g, l, rows + nb * l);
    report_exact(f->label, "rows one a call = one append", !memcmp(one, rows, nb * 2));
    if (o->append(g, 0, N, f->taps + (size_t)N * f->n_in, 3, &err)) die("GPU append", &err);
    if (o->restore(g, 0, before, &err)) die("GPU restore", &err);
    o->snapshot(g, 0, rows);
    report_exact(f->label, "restore right after an append", !memcmp(rows, before, nb));
    for (int l = 0; l < LANES; l++)
        if (o->restore(g, l, before + nb * l, &err)) die("GPU restore", &err);
    free(before), free(one), free(rows);
}

static void case_snapshot(Fx *f) {
    const size_t nb = f->cpu->snapshot_bytes;
    uint8_t *sc = (uint8_t *)malloc(nb), *sg = (uint8_t *)malloc(nb);
    f->cpu->ops->snapshot(f->cpu->impl, 0, sc);
    f->gpu->ops->snapshot(f->gpu->impl, 0, sg);
    report_exact(f->label, "snapshot: header", !memcmp(sc, sg, 64));
    const size_t nf = (nb - 64) / 4;
    report(f->label, "snapshot: rings", worst_row((const float *)(sg + 64), (const float *)(sc + 64), 1, (int)nf), 1e-5);
    /* a GPU snapshot into lane 1: the same bits as lane 0 */
    splash_error err = {};
    if (f->gpu->ops->restore(f->gpu->impl, 1, sg, &err)) die("GPU restore", &err);
    const int n = 7;
    float *h0 = (float *)malloc(sizeof(float) * n * f->H), *h1 = (float *)malloc(sizeof(float) * n * f->H);
    float *l0 = (float *)malloc(sizeof(float) * n * f->V), *l1 = (float *)malloc(sizeof(float) * n * f->V);
    if (splash_dflash_cuda_forward(f->gpu, 0, 9, n + 1, h0, l0, &err) ||
        splash_dflash_cuda_forward(f->gpu, 1, 9, n + 1, h1, l1, &err))
        die("GPU forward", &err);
    report_exact(f->label, "snapshot: restored lane = lane 0",
                 !memcmp(h0, h1, sizeof(float) * n * f->H) && !memcmp(l0, l1, sizeof(float) * n * f->V));
    /* the CPU's snapshot on the GPU: what the CPU drafts */
    if (f->gpu->ops->restore(f->gpu->impl, 1, sc, &err)) die("GPU restore of a CPU snapshot", &err);
    if (splash_dflash_cuda_forward(f->gpu, 1, 9, n + 1, h1, l1, &err)) die("GPU forward", &err);
    cpu_forward(f, 0, 9, n + 1, h0, l0);
    report(f->label, "CPU snapshot on the GPU: logits", worst_row(l1, l0, n, f->V), 1e-4);
    free(sc), free(sg), free(h0), free(h1), free(l0), free(l1);
}

static void case_behind(Fx *f) {
    splash_error err = {};
    const int c = f->cpu->ops->append(f->cpu->impl, 0, 3, f->taps, 1, &err);
    const int g = f->gpu->ops->append(f->gpu->impl, 0, 3, f->taps, 1, &err);
    report_exact(f->label, "append behind the lane: refused", c < 0 && g < 0);
}

/* ---- the CPU forward through the CPU draft's own state ---------------------------------------- */

/* dflash_draft.c / dflash2_draft.c keep their model and states behind the
 * ops; the test reaches them through a snapshot: a fresh CPU state loaded
 * with the lane's bytes, then splash_dflash(2)_draft on it. */
static void cpu_forward(Fx *f, int lane, int32_t anchor, int block, float *hidden, float *logits) {
    splash_error err = {};
    splash_dflash *m1 = f->m1;
    splash_dflash2 *m2 = f->m2;
    uint8_t *snap = (uint8_t *)malloc(f->cpu->snapshot_bytes);
    f->cpu->ops->snapshot(f->cpu->impl, lane, snap);
    if (f->v2) {
        splash_dflash2_state *s;
        if (splash_dflash2_state_new(m2, &s, &err) || splash_dflash2_state_load(s, snap, &err) ||
            splash_dflash2_draft(m2, s, anchor, block, hidden, logits, &err))
            die("CPU v2 forward", &err);
        splash_dflash2_state_free(s);
    } else {
        splash_dflash_state *s;
        if (splash_dflash_state_new(m1, &s, &err) || splash_dflash_state_load(s, snap, &err) ||
            splash_dflash_draft(m1, s, anchor, block, hidden, logits, &err))
            die("CPU v1 forward", &err);
        splash_dflash_state_free(s);
    }
    free(snap);
}

static void print_table(void) {
    printf("\n| fixture | case | worst row rel L2 / max abs | bound | pass |\n|---|---|---|---|---|\n");
    for (int i = 0; i < g_nrows; i++)
        printf("| %s | %s | %.2e | %.0e | %s |\n", g_rows[i].fixture, g_rows[i].what, g_rows[i].worst, g_rows[i].bound,
               g_rows[i].pass ? "yes" : "NO");
    if (g_nrows < g_nchecks) printf("(the table holds the first %d checks)\n", g_nrows);
    printf("\n%d checks, %d failed\n", g_nchecks, g_fail);
}

int main(int argc, char **argv) {
    const char *packages = argc > 1 ? argv[1] : getenv("SPLASH_TEST_PACKAGES");
    if (!packages || !*packages) {
        fprintf(stderr, "usage: test_cuda_draft PACKAGES_DIR (or SPLASH_TEST_PACKAGES)\n");
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("no CUDA device: nothing tested\n");
        return 1;
    }
    const char *names[][2] = {{"dflash-q4", "v1 q4"}, {"dflash-bf16", "v1 bf16"}, {"dflash2-q4", "v2 q4"},
                              {"dflash2-bf16", "v2 bf16"}};
    int ran = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        Fx f = {};
        f.label = names[i][1];
        if (fx_open(&f, packages, names[i][0])) continue;
        ran++;
        append_both(&f, 0, 0, 0, 37);
        case_block(&f, 0, 8, "block 8 after 37");
        case_propose(&f, 0, 38, 7, 0.0);
        case_propose(&f, 0, 38, 7, 1.0);
        append_both(&f, 0, 37, 37, 50);
        case_block(&f, 0, 16, "block 16 after the wrap (87)");
        case_propose(&f, 0, 88, 15, 0.0);
        append_both(&f, 1, 10, 100, 20);
        case_block(&f, 1, 4, "lane 1: seek to 10, 20, block 4");
        case_lanes(&f, 0.0);
        case_lanes(&f, 1.0);
        case_append_lanes(&f);
        case_append_rowwise(&f);
        case_snapshot(&f);
        case_behind(&f);
        splash_draft_free(f.cpu);
        splash_draft_free(f.gpu);
        splash_dflash_free(f.m1);
        splash_dflash2_free(f.m2);
        splash_package_close(f.pkg);
        free(f.taps);
    }
    print_table();
    if (!ran) printf("no draft package found under %s: nothing tested\n", packages);
    return g_fail || !ran ? 1 : 0;
}
