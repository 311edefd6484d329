/* dflash_lanes.c - the draft-interface glue DFlash v1 and v2 share (see
 * dflash_lanes.h).
 *
 * The engine keeps each lane's cache at the lane's anchor position: append
 * receives the committed positions' taps in order, jumping forward (seek)
 * over positions the prompt computed no taps for; a position behind the
 * cache is an error (the engine restores a snapshot instead).
 */
#include "models/dflash/dflash_lanes.h"

#include <stdlib.h>

#include "runtime/model.h"

splash_dflash_options splash_dflash_lanes_options(const splash_draft_options *opt, int *window, int *lanes) {
    *window = opt->window > 0 ? opt->window : 2048;
    *lanes = opt->lanes > 0 ? opt->lanes : 1;
    int act = opt->act == SPLASH_CPU_ACT_F32 ? CPU_ACT_F32 : opt->act == SPLASH_CPU_ACT_INT16 ? CPU_ACT_I16 : CPU_ACT_I8;
    return (splash_dflash_options){.threads = opt->threads, .act = act, .window = *window};
}

int splash_dflash_lanes_init(splash_dflash_lanes *L, const char *name, splash_dflash_ctx *c, int lanes,
                             splash_error *err) {
    L->name = name;
    L->c = c;
    L->lanes = lanes;
    L->max_block = c->max_block < SPLASH_DRAFT_MAX_BLOCK ? c->max_block : SPLASH_DRAFT_MAX_BLOCK;
    L->kv = calloc((size_t)lanes, sizeof *L->kv);
    L->hidden = malloc(sizeof(float) * (size_t)c->d.hidden * (size_t)L->max_block);
    if (!L->kv || !L->hidden) return splash_fail(err, SPLASH_E_NOMEM, "out of memory");
    return SPLASH_OK;
}

void splash_dflash_lanes_release(splash_dflash_lanes *L) {
    free(L->kv);
    free(L->hidden);
}

static int lane_ok(const splash_dflash_lanes *L, int lane, splash_error *err) {
    if (lane < 0 || lane >= L->lanes)
        return splash_fail(err, SPLASH_E_RANGE, "%s draft: lane %d outside [0, %d)", L->name, lane, L->lanes);
    return SPLASH_OK;
}

int splash_dflash_lanes_reach(splash_dflash_lanes *L, int lane, int pos, splash_error *err) {
    int rc = lane_ok(L, lane, err);
    if (rc) return rc;
    splash_dflash_kv *s = L->kv[lane];
    if (pos == s->n_ctx) return SPLASH_OK;
    if (pos < s->n_ctx)
        return splash_fail(err, SPLASH_E_INVALID, "%s draft: lane %d holds positions up to %d, asked for %d", L->name,
                           lane, s->n_ctx, pos);
    return splash_dflash_kv_seek(L->c, s, pos, err);
}

int splash_dflash_lanes_append(void *impl, int lane, int pos, const float *taps, int n, splash_error *err) {
    splash_dflash_lanes *L = impl;
    int rc = splash_dflash_lanes_reach(L, lane, pos, err);
    if (rc) return rc;
    return n > 0 ? splash_dflash_ctx_append(L->c, L->kv[lane], taps, n, err) : SPLASH_OK;
}

void splash_dflash_lanes_reset(void *impl, int lane) {
    splash_dflash_lanes *L = impl;
    if (lane >= 0 && lane < L->lanes) L->kv[lane]->n_ctx = L->kv[lane]->lo = 0;
}

void splash_dflash_lanes_snapshot(void *impl, int lane, void *dst) {
    splash_dflash_lanes *L = impl;
    if (lane >= 0 && lane < L->lanes) splash_dflash_kv_save(L->kv[lane], dst);
}

int splash_dflash_lanes_restore(void *impl, int lane, const void *src, splash_error *err) {
    splash_dflash_lanes *L = impl;
    int rc = lane_ok(L, lane, err);
    return rc ? rc : splash_dflash_kv_load(L->kv[lane], src, err);
}

int splash_dflash_lanes_describe(const splash_dflash_lanes *L, const splash_draft_ops *ops, void *impl, int window,
                                 splash_draft *dr, splash_error *err) {
    const splash_dflash_dims *dm = &L->c->d;
    if (dm->n_taps > (int)(sizeof dr->tap_layers / sizeof dr->tap_layers[0]))
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s draft: %d tap layers, at most 64", L->name, dm->n_taps);
    dr->ops = ops;
    dr->impl = impl;
    dr->name = L->name;
    dr->block_size = dm->block_size < SPLASH_DRAFT_MAX_BLOCK ? dm->block_size : SPLASH_DRAFT_MAX_BLOCK;
    dr->max_block = L->max_block;
    dr->n_taps = dm->n_taps;
    for (int i = 0; i < dm->n_taps; i++) dr->tap_layers[i] = dm->taps[i];
    dr->window = window;
    dr->snapshot_bytes = splash_dflash_kv_snapshot_bytes(L->kv[0]);
    dr->state_bytes = (size_t)L->lanes * L->kv[0]->bytes;
    dr->weight_bytes = L->c->weight_bytes;
    return SPLASH_OK;
}
