/* cmd_bench_draft.c - `splash bench --draft`: the package's draft alone, at
 * its own shapes, on the device the model would run on (the CUDA draft on
 * cuda): what a decode cycle spends before and after the target's verify.
 *
 * Each of up to four lanes is first given --prompt positions of context
 * (random tap rows, appended 64 at a time, as a prompt's prefill feeds it);
 * then, for blocks of 16 and 8 rows and 1, 2 and 4 lanes at once, greedy
 * and at T = 1, one call proposing for every lane (propose_lanes where the
 * draft has it, else propose lane by lane, as the engine calls them) is
 * timed --verify-reps times (at least 5; the first, which makes the CUDA
 * draft's graph of that shape, is not counted).  Proposing does not move a
 * lane, so every timed proposal sees the same context.  Last, a cycle's
 * whole draft work for 1 and 4 lanes: the append of 8 committed rows to each
 * (the CUDA draft does not wait for it) and the next block of 16's proposals
 * (which does), so its time less the proposals' alone is the append's.
 * Medians, with the 10th-90th percentile spread, in ms per call and per lane.
 *
 * The numbers are speed only: a synthetic package's draft (splash bench
 * --synthetic) proposes noise.
 */
#include "runtime/cmd_bench_draft.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "package/package.h"
#include "runtime/bench_stats.h"
#include "runtime/draft.h"
#include "runtime/engine.h"

#define LANES 4

/* The table's row of reps timings: ms a call [p10, p90], ms a lane. */
static void print_row(const char *call, int block, int k, int temp, double *t, int reps) {
    const stat3 s = splash_bench_stats(t, reps);
    printf("| %s | %d | %d | %d | %.3f | [%.3f, %.3f] | %.3f |\n", call, block, k, temp, 1e3 * s.med, 1e3 * s.p10,
           1e3 * s.p90, 1e3 * s.med / k);
}

typedef struct bench_lanes {
    splash_draft *d;
    int vocab, ctx;               /* ctx: every lane's position (the anchor's is ctx) */
    int32_t *seq;                 /* [ctx + 1 + the appends' rows] the lanes' tokens (every lane the same) */
    float *logits[LANES];         /* [max_block - 1][vocab] each (a draft that returns logits) */
    int32_t *tokens[LANES];       /* [max_block - 1] */
    splash_spec_q *q[LANES];      /* [max_block - 1] */
} bench_lanes;

/* One call proposing n - 1 tokens for each of lanes 0..k-1; 0 or a status. */
static int propose_once(bench_lanes *b, int k, int n, const splash_sampling_params *sp, splash_error *errs) {
    splash_draft_req r[LANES];
    int kinds[LANES];
    for (int i = 0; i < k; i++) r[i] = (splash_draft_req){i, b->seq, b->ctx + 1, n - 1, sp, b->q[i]};
    const splash_draft_ops *o = b->d->ops;
    if (o->propose_lanes && k > 1)
        o->propose_lanes(b->d->impl, r, k, b->logits, b->tokens, kinds, errs);
    else
        for (int i = 0; i < k; i++) kinds[i] = o->propose(b->d->impl, &r[i], b->logits[i], b->tokens[i], &errs[i]);
    for (int i = 0; i < k; i++)
        if (kinds[i] < 0) {
            errs[0] = errs[i];
            return kinds[i];
        }
    return 0;
}

/* Appends n rows of taps to each of lanes 0..k-1 at their positions; 0 or a status. */
static int append_once(bench_lanes *b, int k, int n, const float *taps, const int *pos, splash_error *errs) {
    const splash_draft_ops *o = b->d->ops;
    splash_draft_taps t[LANES];
    int status[LANES];
    for (int i = 0; i < k; i++) t[i] = (splash_draft_taps){i, pos[i], taps, n};
    if (o->append_lanes && k > 1)
        o->append_lanes(b->d->impl, t, k, 0, status, errs);
    else
        for (int i = 0; i < k; i++) status[i] = o->append(b->d->impl, i, pos[i], taps, n, &errs[i]);
    for (int i = 0; i < k; i++)
        if (status[i]) {
            errs[0] = errs[i];
            return status[i];
        }
    return 0;
}

int splash_bench_draft(const char *model_dir, const char *device, int threads, int ctx, int reps) {
    splash_error err = {0}, errs[LANES] = {{0}};
    splash_package *pkg = NULL;
    bench_lanes b = {0};
    float *taps = NULL;
    int rc = 1;
    if (reps < 5) reps = 5;
    if (splash_package_open(model_dir, &pkg, &err)) {
        fprintf(stderr, "draft bench: %s\n", err.msg);
        return 1;
    }
    splash_draft_options dopt = {.threads = threads, .lanes = LANES, .window = 2048, .max_block = SPLASH_DRAFT_MAX_BLOCK,
                                 .device = device};
    if (splash_draft_open(pkg, &dopt, &b.d, &err)) {
        fprintf(stderr, "draft bench: %s\n", err.msg);
        splash_package_close(pkg);
        return 1;
    }
    const splash_draft *d = b.d;
    const size_t n_in = (size_t)d->n_taps * (size_t)json_get_num(json_get(splash_package_manifest(pkg), "draft"),
                                                                    "hidden", 0);
    b.vocab = (int)json_get_num(json_get(splash_package_manifest(pkg), "model"), "vocab", 0);
    b.ctx = ctx;
    const int nb = d->max_block;
    const int n_seq = ctx + 1 + 2 * 8 * (reps + 5); /* room for the cycles' appends (4 untimed a config) */
    b.seq = malloc(sizeof(int32_t) * (size_t)n_seq);
    taps = malloc(sizeof(float) * 64 * n_in);
    double *t = malloc(sizeof(double) * (size_t)reps);
    int ok = b.seq && taps && t && n_in > 0 && b.vocab > 0;
    for (int i = 0; ok && i < LANES; i++) {
        b.logits[i] = malloc(sizeof(float) * (size_t)(nb - 1) * (size_t)b.vocab);
        b.tokens[i] = malloc(sizeof(int32_t) * (size_t)nb);
        b.q[i] = malloc(sizeof(splash_spec_q) * (size_t)nb);
        ok = b.logits[i] && b.tokens[i] && b.q[i];
    }
    if (!ok) {
        fprintf(stderr, "draft bench: out of memory\n");
        goto done;
    }
    uint64_t st = 0x2545F4914F6CDD1Dull;
    for (int i = 0; i < n_seq; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        b.seq[i] = (int32_t)((st >> 33) % (uint64_t)b.vocab);
    }
    for (size_t i = 0; i < 64 * n_in; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        taps[i] = (float)((int)(st >> 40) % 2001 - 1000) * 1e-3f; /* [-1, 1] */
    }
    printf("draft %s: %d tap layers, max block %d, %d lanes of %d context positions, device %s\n", d->name,
           d->n_taps, nb, LANES, ctx, device);
    double t0 = splash_now();
    for (int l = 0; l < LANES; l++)
        for (int p = 0; p < ctx; p += 64) {
            const int n = ctx - p < 64 ? ctx - p : 64;
            if (d->ops->append(d->impl, l, p, taps, n, &err)) {
                fprintf(stderr, "draft bench: append: %s\n", err.msg);
                goto done;
            }
        }
    printf("context: %d positions x %d lanes appended in %.1f ms\n", ctx, LANES, 1e3 * (splash_now() - t0));
    printf("| call | block | lanes | T | ms a call | [p10, p90] | ms a lane |\n|---|---|---|---|---|---|---|\n");
    static const int blocks[2] = {16, 8}, lanes[3] = {1, 2, 4};
    for (int bi = 0; bi < 2; bi++) {
        const int n = blocks[bi] < nb ? blocks[bi] : nb;
        for (int temp = 0; temp < 2; temp++)
            for (int li = 0; li < 3; li++) {
                splash_sampling_params sp = {.temperature = temp ? 1.0f : 0.0f, .top_p = 1, .repetition_penalty = 1,
                                             .seed = 7};
                const int k = lanes[li];
                if (propose_once(&b, k, n, &sp, errs)) { /* the shape's first call (its graph made) */
                    fprintf(stderr, "draft bench: propose: %s\n", errs[0].msg);
                    goto done;
                }
                for (int r = 0; r < reps; r++) {
                    double s = splash_now();
                    if (propose_once(&b, k, n, &sp, errs)) {
                        fprintf(stderr, "draft bench: propose: %s\n", errs[0].msg);
                        goto done;
                    }
                    t[r] = splash_now() - s;
                }
                print_row("propose", n, k, temp, t, reps);
            }
    }
    /* cycles: every lane moves 8 positions a cycle (lanes past k are not used again) */
    const splash_sampling_params greedy = {.temperature = 0.0f, .top_p = 1, .repetition_penalty = 1, .seed = 7};
    int pos[LANES];
    for (int li = 0; li < 3; li += 2) { /* 1 and 4 lanes */
        const int k = lanes[li], n = 16 < nb ? 16 : nb;
        /* 4 cycles untimed first: an append graph's key (its descriptor slot, two in turn, and
         * its rows) runs eagerly once, then is captured (docs/cuda.md, session 36) */
        for (int r = -4; r < reps; r++) {
            double s = splash_now();
            for (int i = 0; i < k; i++) pos[i] = b.ctx;
            b.ctx += 8;
            if (append_once(&b, k, 8, taps, pos, errs) || propose_once(&b, k, n, &greedy, errs)) {
                fprintf(stderr, "draft bench: cycle: %s\n", errs[0].msg);
                goto done;
            }
            if (r >= 0) t[r] = splash_now() - s;
        }
        print_row("append 8 rows + propose", n, k, 0, t, reps);
    }
    rc = 0;
done:
    for (int i = 0; i < LANES; i++) free(b.logits[i]), free(b.tokens[i]), free(b.q[i]);
    free(b.seq);
    free(taps);
    free(t);
    splash_draft_free(b.d);
    splash_package_close(pkg);
    return rc;
}
