/* dflash2_draft.c - the DFlash 2 draft behind runtime/draft.h's ops.
 *
 * Mirrors dflash_draft.c (v1), with the lane handling both share in
 * dflash_lanes.c: one splash_dflash2 (weights, scratch) and one
 * windowed state per engine lane, kept at the lane's anchor position; append
 * receives the committed positions' taps in order (jumping forward over
 * positions the prompt computed no taps for).  propose drafts the block
 * [anchor, MASK x n] and then runs the candidate selector itself - greedy at
 * temperature 0, else sampling each row from q = softmax(score / T) over its
 * top_k candidates with the keyed DRAFT stream - and returns the picks with
 * each row's sparse q (SPLASH_DRAFT_SPARSE), which the cycle's rejection
 * sampling uses as the draft distribution.  The request's other sampling
 * parameters (top_k, top_p, penalties) shape only the target's p: any q is
 * lossless as long as the proposals are drawn from it.  The selector's mask
 * callback is NULL for now (grammars will fill it).
 */
#include "models/dflash/dflash2_draft.h"

#include <stdlib.h>

#include "models/dflash/dflash_lanes.h"
#include "runtime/model.h"

_Static_assert(SPLASH_DFLASH2_MAX_TOPK <= SPLASH_SPEC_MAX_CAND, "a selector row's candidates fit a splash_spec_q");

typedef struct dfd2 {
    splash_dflash_lanes ln;    /* first: the shared ops (dflash_lanes.h) take the impl as it */
    splash_dflash2 *m;
    splash_dflash2_state **st; /* [lanes] */
    splash_dflash2_row rows[SPLASH_DRAFT_MAX_BLOCK]; /* the selector's outcome of one block */
} dfd2;

void splash_dflash2_draft_args(const splash_sampling_params *sp, uint64_t pos0, int n, float *uniform,
                               splash_dflash2_select_args *a) {
    *a = (splash_dflash2_select_args){.temperature = sp->temperature > 0 ? (float)sp->temperature : 0.0f,
                                      .uniform = NULL, .mask = NULL, .mask_ctx = NULL};
    if (!(sp->temperature > 0)) return;
    for (int i = 0; i < n; i++) uniform[i] = splash_rng_uniform_f32(sp->seed, pos0 + (uint64_t)i, SPLASH_RNG_DRAFT, 0);
    a->uniform = uniform;
}

void splash_dflash2_draft_rows(const splash_dflash2_row *rows, int n, int32_t *tokens, splash_spec_q *q) {
    for (int i = 0; i < n; i++) {
        const splash_dflash2_row *r = &rows[i];
        tokens[i] = r->token;
        q[i].n = r->n_cand;
        for (int k = 0; k < r->n_cand; k++) {
            q[i].ids[k] = r->cand[k];
            q[i].p[k] = r->q[k];
        }
    }
}

static int dfd2_propose(void *impl, const splash_draft_req *r, float *logits, int32_t *tokens, splash_error *err) {
    dfd2 *d = impl;
    int rc = splash_dflash_lanes_reach(&d->ln, r->lane, r->n_seq - 1, err);
    if (rc) return rc;
    if (!logits || !r->q) return splash_fail(err, SPLASH_E_INVALID, "dflash2 draft: no logits or q buffer");
    const int32_t anchor = r->seq[r->n_seq - 1];
    if ((rc = splash_dflash2_draft(d->m, d->st[r->lane], anchor, r->n + 1, d->ln.hidden, logits, err))) return rc;
    float u[SPLASH_DRAFT_MAX_BLOCK];
    splash_dflash2_select_args a;
    splash_dflash2_draft_args(r->sp, (uint64_t)r->n_seq, r->n, u, &a);
    int got = splash_dflash2_select(d->m, d->ln.hidden, logits, anchor, r->n, &a, d->rows, err);
    if (got < 0) return got;
    if (got < r->n) /* only a mask can end the walk early, or a row of no finite logit */
        return splash_fail(err, SPLASH_E_INVALID, "dflash2 draft: row %d has no candidate", got);
    splash_dflash2_draft_rows(d->rows, r->n, tokens, r->q);
    return SPLASH_DRAFT_SPARSE;
}

static void dfd2_free(void *impl) {
    dfd2 *d = impl;
    for (int i = 0; d->st && i < d->ln.lanes; i++) splash_dflash2_state_free(d->st[i]);
    free(d->st);
    splash_dflash_lanes_release(&d->ln);
    splash_dflash2_free(d->m);
    free(d);
}

/* host taps only, lane by lane */
static const splash_draft_ops dfd2_ops = {.propose = dfd2_propose,
                                          .append = splash_dflash_lanes_append,
                                          .reset = splash_dflash_lanes_reset,
                                          .snapshot = splash_dflash_lanes_snapshot,
                                          .restore = splash_dflash_lanes_restore,
                                          .free = dfd2_free};

int splash_dflash2_draft_open(splash_package *pkg, const splash_draft_options *opt, splash_draft **out,
                              splash_error *err) {
    *out = NULL;
    int window, lanes;
    splash_dflash_options o = splash_dflash_lanes_options(opt, &window, &lanes);
    int want = opt->max_block > SPLASH_DRAFT_MAX_BLOCK ? SPLASH_DRAFT_MAX_BLOCK : opt->max_block;
    o.max_block = want > 0 ? want : 0;
    dfd2 *d = calloc(1, sizeof *d);
    splash_draft *dr = calloc(1, sizeof *dr);
    if (!d || !dr) {
        free(d);
        free(dr);
        return splash_fail(err, SPLASH_E_NOMEM, "out of memory");
    }
    int rc = splash_dflash2_load(pkg, &o, &d->m, err);
    if (rc) {
        free(d);
        free(dr);
        return rc;
    }
    d->st = calloc((size_t)lanes, sizeof *d->st);
    if (!d->st) rc = splash_fail(err, SPLASH_E_NOMEM, "out of memory");
    if (!rc) rc = splash_dflash_lanes_init(&d->ln, "dflash2", splash_dflash2_ctx_of(d->m), lanes, err);
    for (int i = 0; !rc && i < lanes; i++)
        if (!(rc = splash_dflash2_state_new(d->m, &d->st[i], err))) d->ln.kv[i] = splash_dflash2_kv_of(d->st[i]);
    if (rc || (rc = splash_dflash_lanes_describe(&d->ln, &dfd2_ops, d, window, dr, err))) {
        dfd2_free(d);
        free(dr);
        return rc;
    }
    *out = dr;
    return SPLASH_OK;
}
