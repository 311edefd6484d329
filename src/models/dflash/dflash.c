/* dflash.c - the DFlash v1 draft forward on the CPU (see dflash.h).
 *
 * The context cache, its append, the block attention and the shared weights
 * are dflash_ctx.c's (v2 uses them too); what is v1's own is the layer loop
 * of a block: attention on the normed residual, o_proj and the SwiGLU MLP
 * added straight to the residual, plain lm_head logits.
 */
#include "models/dflash/dflash.h"

#include <stdlib.h>

#include "base/mem.h"
#include "models/dflash/dflash_ctx.h"

struct splash_dflash {
    splash_dflash_ctx c;
};

struct splash_dflash_state {
    splash_dflash_kv kv;
};

/* ---- load -------------------------------------------------------------------- */

int splash_dflash_load(const splash_package *pkg, const splash_dflash_options *opt, splash_dflash **out,
                       splash_error *err) {
    *out = NULL;
    splash_dflash_dims dims;
    const json_value *o;
    int rc = splash_dflash_parse_dims(pkg, "dflash", &dims, &o, err);
    if (rc) return rc;
    splash_dflash *m = xcalloc(1, sizeof *m);
    if ((rc = splash_dflash_ctx_load(&m->c, "dflash", 0x44464c53u /* "SLFD" */, pkg, opt, &dims, err))) {
        splash_dflash_free(m);
        return rc;
    }
    *out = m;
    return SPLASH_OK;
}

void splash_dflash_free(splash_dflash *m) {
    if (!m) return;
    splash_dflash_ctx_release(&m->c);
    free(m);
}

splash_dflash_ctx *splash_dflash_ctx_of(splash_dflash *m) { return &m->c; }
splash_dflash_kv *splash_dflash_kv_of(splash_dflash_state *s) { return &s->kv; }
const splash_dflash_dims *splash_dflash_get_dims(const splash_dflash *d) { return &d->c.d; }
size_t splash_dflash_weight_bytes(const splash_dflash *d) { return d->c.weight_bytes; }

/* ---- state ------------------------------------------------------------------- */

int splash_dflash_state_new(const splash_dflash *m, splash_dflash_state **out, splash_error *err) {
    splash_dflash_state *s = calloc(1, sizeof *s);
    if (!s) return splash_fail(err, SPLASH_E_NOMEM, "dflash: out of memory for a draft state");
    int rc = splash_dflash_kv_init(&s->kv, &m->c, err);
    if (rc) {
        free(s);
        return rc;
    }
    *out = s;
    return SPLASH_OK;
}

void splash_dflash_state_free(splash_dflash_state *s) {
    if (!s) return;
    splash_dflash_kv_release(&s->kv);
    free(s);
}

void splash_dflash_state_reset(splash_dflash_state *s) { s->kv.n_ctx = s->kv.lo = 0; }
int splash_dflash_state_positions(const splash_dflash_state *s) { return s->kv.n_ctx; }
size_t splash_dflash_state_bytes(const splash_dflash_state *s) { return s->kv.bytes; }

int splash_dflash_state_seek(const splash_dflash *m, splash_dflash_state *s, int pos, splash_error *err) {
    return splash_dflash_kv_seek(&m->c, &s->kv, pos, err);
}

size_t splash_dflash_state_snapshot_bytes(const splash_dflash_state *s) {
    return splash_dflash_kv_snapshot_bytes(&s->kv);
}
void splash_dflash_state_save(const splash_dflash_state *s, void *dst) { splash_dflash_kv_save(&s->kv, dst); }
int splash_dflash_state_load(splash_dflash_state *s, const void *src, splash_error *err) {
    return splash_dflash_kv_load(&s->kv, src, err);
}

int splash_dflash_append(splash_dflash *m, splash_dflash_state *s, const float *taps, int n, splash_error *err) {
    return splash_dflash_ctx_append(&m->c, &s->kv, taps, n, err);
}

/* ---- draft ------------------------------------------------------------------- */

int splash_dflash_draft(splash_dflash *m, const splash_dflash_state *s, int32_t anchor, int block, float *hidden,
                        float *logits, splash_error *err) {
    splash_dflash_ctx *c = &m->c;
    const splash_dflash_dims *d = &c->d;
    int rc = splash_dflash_ctx_check(c, &s->kv, anchor, block, hidden, err);
    if (rc) return rc;
    size_t H = (size_t)d->hidden, qw = (size_t)d->heads * (size_t)d->head_dim, I = (size_t)d->intermediate;
    splash_dflash_ctx_embed(c, anchor, block, 1.0f);
    for (int l = 0; l < d->n_layers; l++) {
        const splash_dflash_layer *L = &c->layers[l];
        splash_dflash_ctx_norm(c, c->x, c->xn, L->input_norm, block);
        splash_dflash_ctx_attend(c, &s->kv, l, c->xn, block);
        cpu_matmul_add(&c->cpu, L->o_proj, block, c->o, qw, c->x, H);
        splash_dflash_ctx_norm(c, c->x, c->xn, L->post_norm, block);
        cpu_matmul_swiglu(&c->cpu, L->gate, L->up, block, c->xn, H, c->ff, I, c->ff2, I);
        cpu_matmul_add(&c->cpu, L->down, block, c->ff, I, c->x, H);
    }
    splash_dflash_ctx_finish(c, block, hidden, logits);
    return SPLASH_OK;
}
