/* dflash_draft.c - the DFlash v1 draft behind runtime/draft.h's ops.
 *
 * One splash_dflash (weights, scratch) and one windowed state per engine
 * lane.  The engine keeps each lane's state at the lane's anchor position:
 * append receives the committed positions' taps in order (jumping forward
 * over positions the prompt computed no taps for), propose drafts the block
 * [anchor, MASK x n] at the anchor's position and returns the n rows' logits
 * through the target's lm_head; proposal selection is the runtime's.  The
 * lane handling (append, reset, snapshot, restore) is dflash_lanes.c's,
 * shared with the v2 draft.
 */
#include <stdlib.h>

#include "models/dflash/dflash.h"
#include "models/dflash/dflash_lanes.h"
#include "runtime/draft.h"

typedef struct dfd {
    splash_dflash_lanes ln;   /* first: the shared ops (dflash_lanes.h) take the impl as it */
    splash_dflash *m;
    splash_dflash_state **st; /* [lanes] */
} dfd;

static int dfd_propose(void *impl, const splash_draft_req *r, float *logits, int32_t *tokens, splash_error *err) {
    (void)tokens;
    dfd *d = impl;
    int rc = splash_dflash_lanes_reach(&d->ln, r->lane, r->n_seq - 1, err);
    if (rc) return rc;
    rc = splash_dflash_draft(d->m, d->st[r->lane], r->seq[r->n_seq - 1], r->n + 1, d->ln.hidden, logits, err);
    return rc ? rc : SPLASH_DRAFT_LOGITS;
}

static void dfd_free(void *impl) {
    dfd *d = impl;
    for (int i = 0; d->st && i < d->ln.lanes; i++) splash_dflash_state_free(d->st[i]);
    free(d->st);
    splash_dflash_lanes_release(&d->ln);
    splash_dflash_free(d->m);
    free(d);
}

/* host taps only, lane by lane */
static const splash_draft_ops dfd_ops = {.propose = dfd_propose,
                                         .append = splash_dflash_lanes_append,
                                         .reset = splash_dflash_lanes_reset,
                                         .snapshot = splash_dflash_lanes_snapshot,
                                         .restore = splash_dflash_lanes_restore,
                                         .free = dfd_free};

int splash_dflash_draft_open(splash_package *pkg, const splash_draft_options *opt, splash_draft **out,
                             splash_error *err) {
    *out = NULL;
    int window, lanes;
    splash_dflash_options o = splash_dflash_lanes_options(opt, &window, &lanes);
    o.max_block = opt->max_block > 0 ? opt->max_block : 0;
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
    d->st = calloc((size_t)lanes, sizeof *d->st);
    if (!d->st) rc = splash_fail(err, SPLASH_E_NOMEM, "out of memory");
    if (!rc) rc = splash_dflash_lanes_init(&d->ln, "dflash", splash_dflash_ctx_of(d->m), lanes, err);
    for (int i = 0; !rc && i < lanes; i++)
        if (!(rc = splash_dflash_state_new(d->m, &d->st[i], err))) d->ln.kv[i] = splash_dflash_kv_of(d->st[i]);
    if (rc || (rc = splash_dflash_lanes_describe(&d->ln, &dfd_ops, d, window, dr, err))) {
        dfd_free(d);
        free(dr);
        return rc;
    }
    *out = dr;
    return SPLASH_OK;
}
