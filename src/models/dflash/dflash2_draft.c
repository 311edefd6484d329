/* dflash2_draft.c - the DFlash 2 draft behind runtime/draft.h's ops.
 *
 * Mirrors dflash_draft.c (v1): one splash_dflash2 (weights, scratch) and one
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

#include "backend/cpu/cpu.h"
#include "runtime/model.h"

_Static_assert(SPLASH_DFLASH2_MAX_TOPK <= SPLASH_SPEC_MAX_CAND, "a selector row's candidates fit a splash_spec_q");

typedef struct dfd2 {
    splash_dflash2 *m;
    splash_dflash2_state **st; /* [lanes] */
    int lanes;
    float *hidden;             /* [max_block - 1][hidden] the block's final-normed states (the selector's input) */
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

static int lane_ok(const dfd2 *d, int lane, splash_error *err) {
    if (lane < 0 || lane >= d->lanes)
        return splash_fail(err, SPLASH_E_RANGE, "dflash2 draft: lane %d outside [0, %d)", lane, d->lanes);
    return SPLASH_OK;
}

/* Moves the lane's state to pos (a gap: positions without taps). */
static int reach(dfd2 *d, int lane, int pos, splash_error *err) {
    splash_dflash2_state *s = d->st[lane];
    int at = splash_dflash2_state_positions(s);
    if (pos == at) return SPLASH_OK;
    if (pos < at)
        return splash_fail(err, SPLASH_E_INVALID, "dflash2 draft: lane %d holds positions up to %d, asked for %d", lane,
                           at, pos);
    return splash_dflash2_state_seek(d->m, s, pos, err);
}

static int dfd2_propose(void *impl, const splash_draft_req *r, float *logits, int32_t *tokens, splash_error *err) {
    dfd2 *d = impl;
    int rc = lane_ok(d, r->lane, err);
    if (rc || (rc = reach(d, r->lane, r->n_seq - 1, err))) return rc;
    if (!logits || !r->q) return splash_fail(err, SPLASH_E_INVALID, "dflash2 draft: no logits or q buffer");
    const int32_t anchor = r->seq[r->n_seq - 1];
    if ((rc = splash_dflash2_draft(d->m, d->st[r->lane], anchor, r->n + 1, d->hidden, logits, err))) return rc;
    float u[SPLASH_DRAFT_MAX_BLOCK];
    splash_dflash2_select_args a;
    splash_dflash2_draft_args(r->sp, (uint64_t)r->n_seq, r->n, u, &a);
    int got = splash_dflash2_select(d->m, d->hidden, logits, anchor, r->n, &a, d->rows, err);
    if (got < 0) return got;
    if (got < r->n) /* only a mask can end the walk early, or a row of no finite logit */
        return splash_fail(err, SPLASH_E_INVALID, "dflash2 draft: row %d has no candidate", got);
    splash_dflash2_draft_rows(d->rows, r->n, tokens, r->q);
    return SPLASH_DRAFT_SPARSE;
}

static int dfd2_append(void *impl, int lane, int pos, const float *taps, int n, splash_error *err) {
    dfd2 *d = impl;
    int rc = lane_ok(d, lane, err);
    if (rc || (rc = reach(d, lane, pos, err))) return rc;
    return n > 0 ? splash_dflash2_append(d->m, d->st[lane], taps, n, err) : SPLASH_OK;
}

static void dfd2_reset(void *impl, int lane) {
    dfd2 *d = impl;
    if (lane >= 0 && lane < d->lanes) splash_dflash2_state_reset(d->st[lane]);
}

static void dfd2_snapshot(void *impl, int lane, void *dst) {
    dfd2 *d = impl;
    if (lane >= 0 && lane < d->lanes) splash_dflash2_state_save(d->st[lane], dst);
}

static int dfd2_restore(void *impl, int lane, const void *src, splash_error *err) {
    dfd2 *d = impl;
    int rc = lane_ok(d, lane, err);
    return rc ? rc : splash_dflash2_state_load(d->st[lane], src, err);
}

static void dfd2_free(void *impl) {
    dfd2 *d = impl;
    for (int i = 0; d->st && i < d->lanes; i++) splash_dflash2_state_free(d->st[i]);
    free(d->st);
    free(d->hidden);
    splash_dflash2_free(d->m);
    free(d);
}

static const splash_draft_ops dfd2_ops = {dfd2_propose, dfd2_append, dfd2_reset, dfd2_snapshot, dfd2_restore, dfd2_free};

int splash_dflash2_draft_open(splash_package *pkg, const splash_draft_options *opt, splash_draft **out,
                              splash_error *err) {
    *out = NULL;
    int window = opt->window > 0 ? opt->window : 2048, lanes = opt->lanes > 0 ? opt->lanes : 1;
    int act = opt->act == SPLASH_CPU_ACT_F32 ? CPU_ACT_F32 : opt->act == SPLASH_CPU_ACT_INT16 ? CPU_ACT_I16 : CPU_ACT_I8;
    int want = opt->max_block > SPLASH_DRAFT_MAX_BLOCK ? SPLASH_DRAFT_MAX_BLOCK : opt->max_block;
    splash_dflash_options o = {.threads = opt->threads, .act = act, .window = window, .max_block = want > 0 ? want : 0};
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
    const splash_dflash2_dims *dm = splash_dflash2_get_dims(d->m);
    int max_block = splash_dflash2_max_block(d->m);
    if (max_block > SPLASH_DRAFT_MAX_BLOCK) max_block = SPLASH_DRAFT_MAX_BLOCK;
    d->lanes = lanes;
    d->st = calloc((size_t)lanes, sizeof *d->st);
    d->hidden = malloc(sizeof(float) * (size_t)dm->hidden * (size_t)max_block);
    if (!d->st || !d->hidden) {
        dfd2_free(d);
        free(dr);
        return splash_fail(err, SPLASH_E_NOMEM, "out of memory");
    }
    for (int i = 0; i < lanes; i++)
        if ((rc = splash_dflash2_state_new(d->m, &d->st[i], err))) {
            dfd2_free(d);
            free(dr);
            return rc;
        }
    if (dm->n_taps > (int)(sizeof dr->tap_layers / sizeof dr->tap_layers[0])) {
        dfd2_free(d);
        free(dr);
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "dflash2 draft: %d tap layers, at most 64", dm->n_taps);
    }
    dr->ops = &dfd2_ops;
    dr->impl = d;
    dr->name = "dflash2";
    dr->block_size = dm->block_size < SPLASH_DRAFT_MAX_BLOCK ? dm->block_size : SPLASH_DRAFT_MAX_BLOCK;
    dr->max_block = max_block;
    dr->n_taps = dm->n_taps;
    for (int i = 0; i < dm->n_taps; i++) dr->tap_layers[i] = dm->taps[i];
    dr->window = window;
    dr->snapshot_bytes = splash_dflash2_state_snapshot_bytes(d->st[0]);
    dr->state_bytes = (size_t)lanes * splash_dflash2_state_bytes(d->st[0]);
    dr->weight_bytes = splash_dflash2_weight_bytes(d->m);
    *out = dr;
    return SPLASH_OK;
}
