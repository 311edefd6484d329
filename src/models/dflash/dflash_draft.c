/* dflash_draft.c - the DFlash v1 draft behind runtime/draft.h's ops.
 *
 * One splash_dflash (weights, scratch) and one windowed state per engine
 * lane.  The engine keeps each lane's state at the lane's anchor position:
 * append receives the committed positions' taps in order (jumping forward
 * over positions the prompt computed no taps for), propose drafts the block
 * [anchor, MASK x n] at the anchor's position and returns the n rows' logits
 * through the target's lm_head; proposal selection is the runtime's.
 */
#include <stdio.h>
#include <stdlib.h>

#include "backend/cpu/cpu.h"
#include "models/dflash/dflash.h"
#include "runtime/draft.h"
#include "runtime/model.h"

typedef struct dfd {
    splash_dflash *m;
    splash_dflash_state **st; /* [lanes] */
    int lanes;
    float *hidden;            /* [max_block - 1][hidden] draft output the cycle does not read */
} dfd;

static int lane_ok(const dfd *d, int lane, splash_error *err) {
    if (lane < 0 || lane >= d->lanes) return splash_fail(err, SPLASH_E_RANGE, "dflash draft: lane %d outside [0, %d)", lane, d->lanes);
    return SPLASH_OK;
}

/* Moves the lane's state to pos (a gap: positions without taps). */
static int reach(dfd *d, int lane, int pos, splash_error *err) {
    splash_dflash_state *s = d->st[lane];
    int at = splash_dflash_state_positions(s);
    if (pos == at) return SPLASH_OK;
    if (pos < at)
        return splash_fail(err, SPLASH_E_INVALID, "dflash draft: lane %d holds positions up to %d, asked for %d", lane, at,
                           pos);
    return splash_dflash_state_seek(d->m, s, pos, err);
}

static int dfd_propose(void *impl, const splash_draft_req *r, float *logits, int32_t *tokens, splash_error *err) {
    (void)tokens;
    dfd *d = impl;
    int rc = lane_ok(d, r->lane, err);
    if (rc || (rc = reach(d, r->lane, r->n_seq - 1, err))) return rc;
    rc = splash_dflash_draft(d->m, d->st[r->lane], r->seq[r->n_seq - 1], r->n + 1, d->hidden, logits, err);
    return rc ? rc : SPLASH_DRAFT_LOGITS;
}

static int dfd_append(void *impl, int lane, int pos, const float *taps, int n, splash_error *err) {
    dfd *d = impl;
    int rc = lane_ok(d, lane, err);
    if (rc || (rc = reach(d, lane, pos, err))) return rc;
    return n > 0 ? splash_dflash_append(d->m, d->st[lane], taps, n, err) : SPLASH_OK;
}

static void dfd_reset(void *impl, int lane) {
    dfd *d = impl;
    if (lane >= 0 && lane < d->lanes) splash_dflash_state_reset(d->st[lane]);
}

static void dfd_snapshot(void *impl, int lane, void *dst) {
    dfd *d = impl;
    if (lane >= 0 && lane < d->lanes) splash_dflash_state_save(d->st[lane], dst);
}

static int dfd_restore(void *impl, int lane, const void *src, splash_error *err) {
    dfd *d = impl;
    int rc = lane_ok(d, lane, err);
    return rc ? rc : splash_dflash_state_load(d->st[lane], src, err);
}

static void dfd_free(void *impl) {
    dfd *d = impl;
    for (int i = 0; d->st && i < d->lanes; i++) splash_dflash_state_free(d->st[i]);
    free(d->st);
    free(d->hidden);
    splash_dflash_free(d->m);
    free(d);
}

static const splash_draft_ops dfd_ops = {dfd_propose, dfd_append, dfd_reset, dfd_snapshot, dfd_restore, dfd_free};

int splash_dflash_draft_open(splash_package *pkg, const splash_draft_options *opt, splash_draft **out,
                             splash_error *err) {
    *out = NULL;
    int window = opt->window > 0 ? opt->window : 2048, lanes = opt->lanes > 0 ? opt->lanes : 1;
    int act = opt->act == SPLASH_CPU_ACT_F32 ? CPU_ACT_F32 : opt->act == SPLASH_CPU_ACT_INT16 ? CPU_ACT_I16 : CPU_ACT_I8;
    splash_dflash_options o = {.threads = opt->threads, .act = act, .window = window,
                               .max_block = opt->max_block > 0 ? opt->max_block : 0};
    dfd *d = calloc(1, sizeof *d);
    splash_draft *dr = calloc(1, sizeof *dr);
    if (!d || !dr) {
        free(d);
        free(dr);
        return splash_fail(err, SPLASH_E_NOMEM, "out of memory");
    }
    int rc = splash_dflash_load(pkg, &o, &d->m, err);
    if (rc) {
        free(d);
        free(dr);
        return rc;
    }
    const splash_dflash_dims *dm = splash_dflash_get_dims(d->m);
    int max_block = o.max_block > dm->block_size ? o.max_block : dm->block_size;
    if (max_block > SPLASH_DRAFT_MAX_BLOCK) max_block = SPLASH_DRAFT_MAX_BLOCK;
    d->lanes = lanes;
    d->st = calloc((size_t)lanes, sizeof *d->st);
    d->hidden = malloc(sizeof(float) * (size_t)dm->hidden * (size_t)max_block);
    if (!d->st || !d->hidden) {
        dfd_free(d);
        free(dr);
        return splash_fail(err, SPLASH_E_NOMEM, "out of memory");
    }
    for (int i = 0; i < lanes; i++)
        if ((rc = splash_dflash_state_new(d->m, &d->st[i], err))) {
            dfd_free(d);
            free(dr);
            return rc;
        }
    if (dm->n_taps > (int)(sizeof dr->tap_layers / sizeof dr->tap_layers[0])) {
        dfd_free(d);
        free(dr);
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "dflash draft: %d tap layers, at most 64", dm->n_taps);
    }
    dr->ops = &dfd_ops;
    dr->impl = d;
    dr->name = "dflash";
    dr->block_size = dm->block_size < SPLASH_DRAFT_MAX_BLOCK ? dm->block_size : SPLASH_DRAFT_MAX_BLOCK;
    dr->max_block = max_block;
    dr->n_taps = dm->n_taps;
    for (int i = 0; i < dm->n_taps; i++) dr->tap_layers[i] = dm->taps[i];
    dr->window = window;
    dr->snapshot_bytes = splash_dflash_state_snapshot_bytes(d->st[0]);
    dr->state_bytes = (size_t)lanes * splash_dflash_state_bytes(d->st[0]);
    dr->weight_bytes = splash_dflash_weight_bytes(d->m);
    *out = dr;
    return SPLASH_OK;
}
