/* dflash2.c - the DFlash 2 draft forward and candidate selector on the CPU
 * (see dflash2.h).
 *
 * The context cache (window, seek, snapshot), its append, the block
 * attention and the weights v1 has too are dflash_ctx.c's, shared with the
 * v1 draft; what is v2's own here is the conv around each sublayer, the
 * embedding scale, the logit transform and the selector.  Reductions run in
 * a fixed order (cpu_dot, cpu_softmax, the conv in tap order), so a row's
 * result does not depend on the thread count.
 */
#include "models/dflash/dflash2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "base/json.h"
#include "base/mem.h"
#include "models/dflash/dflash_ctx.h"

struct splash_dflash2 {
    splash_dflash_ctx c;              /* shared with v1: context cache, attention, Qwen3 layers, scratch */
    splash_dflash2_dims d;
    const splash_tensor *hidden_proj; /* [rank, H] selector */
    splash_dflash2_selector sel;      /* codebooks [V, rank] */
    splash_dflash2_conv_weights layers[SPLASH_DFLASH_MAX_LAYERS];
    float *bases;                     /* every conv base kernel, one allocation */
    /* scratch, rows R = max(max_block, APPEND_CHUNK) */
    float *xc, *t;                    /* [R][H] conv output, sublayer output */
    float *dyn;                       /* [R][2*K*G] kernel projection */
    float *gate;                      /* [max_block][rank] selector hidden projection */
    void *walk;                       /* splash_dflash2_walk_scratch */
};

struct splash_dflash2_state {
    splash_dflash_kv kv;
};

/* ---- the pieces on plain arrays ------------------------------------------------- */

void splash_dflash2_conv(const float *x, size_t ldx, int rows, int hidden, const float *base, const float *dyn,
                         size_t lddyn, int side, int kernel, int group, float *out, size_t ldo) {
    int G = hidden / group;
    for (int t = 0; t < rows; t++) {
        const float *dt = dyn + (size_t)t * lddyn + (size_t)side * kernel * G;
        float *o = out + (size_t)t * ldo;
        memset(o, 0, (size_t)hidden * sizeof *o);
        for (int s = 0; s < kernel && s <= t; s++) {
            const float *xr = x + (size_t)(t - s) * ldx, *b = base + (size_t)s * hidden, *ds = dt + (size_t)s * G;
            for (int g = 0; g < G; g++) {
                float dg = ds[g];
                for (int c = g * group; c < (g + 1) * group; c++) o[c] = fmaf(b[c] + dg, xr[c], o[c]);
            }
        }
    }
}

void splash_dflash2_logits_transform(float *l, size_t n, float mult, float cap) {
    if (mult != 1.0f)
        for (size_t i = 0; i < n; i++) l[i] *= mult;
    if (cap > 0)
        for (size_t i = 0; i < n; i++) l[i] = tanhf(l[i] / cap) * cap;
}

#define MAX_PREFIX (SPLASH_DFLASH_MAX_BLOCK + 1)

size_t splash_dflash2_walk_scratch(int vocab, int rank) {
    size_t words = ((size_t)vocab + 31) / 32;
    return 2 * (size_t)rank * sizeof(float) + words * sizeof(uint32_t) + MAX_PREFIX * sizeof(int32_t) + 16;
}

int splash_dflash2_pick(const float *score, int n, float T, float u, float *q) {
    int pick = 0;
    if (T > 0) {
        float mx = -INFINITY, sum = 0;
        for (int k = 0; k < n; k++) {
            q[k] = score[k] / T;
            if (q[k] > mx) mx = q[k];
        }
        for (int k = 0; k < n; k++) sum += q[k] = expf(q[k] - mx);
        float cum = 0;
        pick = -1;
        for (int k = 0; k < n; k++) {
            q[k] /= sum;
            cum += q[k];
            if (pick < 0 && u < cum) pick = k;
        }
        if (pick < 0)
            for (pick = n - 1; pick > 0 && !(q[pick] > 0); pick--) {}
    } else {
        for (int k = 1; k < n; k++)
            if (score[k] > score[pick]) pick = k;
        for (int k = 0; k < n; k++) q[k] = k == pick ? 1.0f : 0.0f;
    }
    return pick;
}

int splash_dflash2_walk(const splash_dflash2_selector *sel, const float *gate, const float *logits, int32_t anchor,
                        int rows, const splash_dflash2_select_args *a, splash_dflash2_row *out, void *scratch,
                        splash_error *err) {
    int V = sel->vocab, R = sel->rank, K = sel->top_k;
    float T = a ? a->temperature : 0.0f;
    if (K < 1 || K > SPLASH_DFLASH2_MAX_TOPK || K > V)
        return splash_fail(err, SPLASH_E_INVALID, "dflash2 select: top_k %d outside [1, %d]", K, SPLASH_DFLASH2_MAX_TOPK);
    if (rows < 0 || rows > SPLASH_DFLASH_MAX_BLOCK)
        return splash_fail(err, SPLASH_E_INVALID, "dflash2 select: %d rows", rows);
    if (anchor < 0 || anchor >= V)
        return splash_fail(err, SPLASH_E_INVALID, "dflash2 select: anchor token %d outside the vocabulary", (int)anchor);
    if (T > 0 && !a->uniform)
        return splash_fail(err, SPLASH_E_INVALID, "dflash2 select: sampling (T > 0) needs one uniform per row");
    float *g = scratch, *e = g + R;
    uint32_t *allow = (uint32_t *)(e + R);
    int32_t *prefix = (int32_t *)(allow + ((size_t)V + 31) / 32);
    prefix[0] = anchor;
    for (int row = 0; row < rows; row++) {
        splash_dflash2_row *o = &out[row];
        const float *l = logits + (size_t)row * V;
        if (a && a->mask) {
            int rc = a->mask(a->mask_ctx, row, prefix, allow);
            if (rc < 0) return splash_fail(err, rc, "dflash2 select: the mask of row %d failed", row);
        }
        float unary[SPLASH_DFLASH2_MAX_TOPK];
        int n = cpu_top_k(l, V, K, a && a->mask ? allow : NULL, o->cand, unary);
        o->n_cand = n;
        for (int k = n; k < SPLASH_DFLASH2_MAX_TOPK; k++) o->cand[k] = -1, o->score[k] = -INFINITY, o->q[k] = 0;
        if (!n) return row;
        /* edge(prev -> cand) = < pred[prev] * gate_row, succ[cand] > */
        cpu_dequant_row(sel->pred_codebook, prefix[row], g);
        const float *gr = gate + (size_t)row * R;
        for (int r = 0; r < R; r++) g[r] *= gr[r];
        for (int k = 0; k < n; k++) {
            cpu_dequant_row(sel->succ_codebook, o->cand[k], e);
            o->score[k] = unary[k] + cpu_dot(g, e, R);
        }
        float u = T > 0 ? a->uniform[row] : 0.0f;
        if (T > 0 && !(u >= 0.0f && u < 1.0f))
            return splash_fail(err, SPLASH_E_INVALID, "dflash2 select: uniform %g of row %d outside [0, 1)", (double)u, row);
        int pick = splash_dflash2_pick(o->score, n, T, u, o->q);
        o->pick = pick;
        o->token = o->cand[pick];
        prefix[row + 1] = o->token;
    }
    return rows;
}

/* ---- load -------------------------------------------------------------------- */

static int dim_num(const json_value *o, const char *key, int allow_zero, float *out, splash_error *err) {
    const json_value *x = json_get(o, key);
    if (!x || x->type != JSON_NUMBER || !isfinite(x->num) || x->num < 0 || (!allow_zero && x->num == 0))
        return splash_fail(err, SPLASH_E_FORMAT, "manifest draft.%s: expected a %s number", key,
                           allow_zero ? "non-negative" : "positive");
    *out = (float)x->num;
    return SPLASH_OK;
}

/* The shared fields (splash_dflash_parse_dims) and v2's own. */
static int parse_dims(const splash_package *pkg, splash_dflash_dims *c, splash_dflash2_dims *d, splash_error *err) {
    const json_value *o;
    int rc = splash_dflash_parse_dims(pkg, "dflash2", c, &o, err);
    if (rc) return rc;
    memset(d, 0, sizeof *d);
    d->hidden = c->hidden, d->n_layers = c->n_layers, d->heads = c->heads, d->kv_heads = c->kv_heads;
    d->head_dim = c->head_dim, d->intermediate = c->intermediate, d->block_size = c->block_size;
    d->mask_token_id = c->mask_token_id, d->sliding_window = c->sliding_window, d->vocab = c->vocab;
    d->n_taps = c->n_taps;
    memcpy(d->taps, c->taps, sizeof d->taps);
    memcpy(d->sliding, c->sliding, sizeof d->sliding);
    memcpy(d->causal, c->causal, sizeof d->causal);
    d->rms_eps = c->rms_eps;
    d->rope_theta = c->rope_theta;
    if ((rc = splash_dflash_dim_int(o, "conv_kernel_size", 1, SPLASH_DFLASH2_MAX_KERNEL, &d->conv_kernel, err)) ||
        (rc = splash_dflash_dim_int(o, "conv_group_size", 1, 1 << 16, &d->conv_group, err)) ||
        (rc = splash_dflash_dim_int(o, "selector_rank", 1, 1 << 16, &d->sel_rank, err)) ||
        (rc = splash_dflash_dim_int(o, "selector_top_k", 1, SPLASH_DFLASH2_MAX_TOPK, &d->sel_top_k, err)) ||
        (rc = dim_num(o, "output_multiplier", 0, &d->output_multiplier, err)) ||
        (rc = dim_num(o, "final_logit_softcapping", 1, &d->softcap, err)) ||
        (rc = dim_num(o, "input_embedding_scale", 0, &d->embed_scale, err)))
        return rc;
    if (d->sel_top_k > d->vocab)
        return splash_fail(err, SPLASH_E_FORMAT, "manifest draft.selector_top_k is larger than the vocabulary");
    if (d->hidden % d->conv_group)
        return splash_fail(err, SPLASH_E_FORMAT, "manifest draft: conv_group_size must divide hidden");
    return SPLASH_OK;
}

/* The conv kernels and the selector, beside the shared weights. */
static int bind_v2(splash_dflash2 *m, const splash_package *pkg, splash_error *err) {
    const splash_dflash2_dims *d = &m->d;
    int64_t H = d->hidden, K = d->conv_kernel, P = 2 * K * (H / d->conv_group), RK = d->sel_rank;
    int64_t V = d->vocab;
    int rc;
    if ((rc = splash_dflash_bind_matrix(pkg, "draft.selector.hidden_proj", RK, H, &m->hidden_proj, err)) ||
        (rc = splash_dflash_bind_matrix(pkg, "draft.selector.pred_codebook", V, RK, &m->sel.pred_codebook, err)) ||
        (rc = splash_dflash_bind_matrix(pkg, "draft.selector.succ_codebook", V, RK, &m->sel.succ_codebook, err)))
        return rc;
    m->sel.vocab = d->vocab;
    m->sel.rank = d->sel_rank;
    m->sel.top_k = d->sel_top_k;
    m->bases = xcalloc((size_t)d->n_layers * (size_t)(4 * K * H), sizeof *m->bases);
    float *vp = m->bases;
    int64_t base_shape[3] = {2, K, H};
    char n[96];
    for (int l = 0; l < d->n_layers; l++) {
        splash_dflash2_conv_weights *L = &m->layers[l];
        L->attn_base = vp, vp += 2 * K * H;
        L->ffn_base = vp, vp += 2 * K * H;
#define NAME(s) (snprintf(n, sizeof n, "draft.layers.%d." s, l), n)
        if ((rc = splash_dflash_bind_floats(pkg, NAME("attn_conv.base"), 3, base_shape, L->attn_base, err)) ||
            (rc = splash_dflash_bind_floats(pkg, NAME("ffn_conv.base"), 3, base_shape, L->ffn_base, err)) ||
            (rc = splash_dflash_bind_matrix(pkg, NAME("attn_conv.proj"), P, H, &L->attn_proj, err)) ||
            (rc = splash_dflash_bind_matrix(pkg, NAME("ffn_conv.proj"), P, H, &L->ffn_proj, err)))
            return rc;
#undef NAME
    }
    int R = m->c.max_block > SPLASH_DFLASH_APPEND_CHUNK ? m->c.max_block : SPLASH_DFLASH_APPEND_CHUNK;
    m->xc = xcalloc((size_t)R * H, sizeof(float));
    m->t = xcalloc((size_t)R * H, sizeof(float));
    m->dyn = xcalloc((size_t)R * P, sizeof(float));
    m->gate = xcalloc((size_t)m->c.max_block * RK, sizeof(float));
    m->walk = xcalloc(1, splash_dflash2_walk_scratch(d->vocab, d->sel_rank));
    return SPLASH_OK;
}

int splash_dflash2_load(const splash_package *pkg, const splash_dflash_options *opt, splash_dflash2 **out,
                        splash_error *err) {
    *out = NULL;
    splash_dflash_dims common;
    splash_dflash2_dims dims;
    int rc = parse_dims(pkg, &common, &dims, err);
    if (rc) return rc;
    splash_dflash2 *m = xcalloc(1, sizeof *m);
    m->d = dims;
    if ((rc = splash_dflash_ctx_load(&m->c, "dflash2", 0x32464c53u /* "SLF2" */, pkg, opt, &common, err)) ||
        (rc = bind_v2(m, pkg, err))) {
        splash_dflash2_free(m);
        return rc;
    }
    *out = m;
    return SPLASH_OK;
}

void splash_dflash2_free(splash_dflash2 *m) {
    if (!m) return;
    splash_dflash_ctx_release(&m->c);
    float *bufs[] = {m->bases, m->xc, m->t, m->dyn, m->gate};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(m->walk);
    free(m);
}

splash_dflash_ctx *splash_dflash2_ctx_of(splash_dflash2 *m) { return &m->c; }
splash_dflash_kv *splash_dflash2_kv_of(splash_dflash2_state *s) { return &s->kv; }
const splash_dflash2_dims *splash_dflash2_get_dims(const splash_dflash2 *d) { return &d->d; }
const splash_dflash2_conv_weights *splash_dflash2_layer_conv(const splash_dflash2 *d, int l) { return &d->layers[l]; }
const splash_tensor *splash_dflash2_hidden_proj(const splash_dflash2 *d) { return d->hidden_proj; }
const splash_dflash2_selector *splash_dflash2_get_selector(const splash_dflash2 *d) { return &d->sel; }
int splash_dflash2_max_block(const splash_dflash2 *d) { return d->c.max_block; }
size_t splash_dflash2_weight_bytes(const splash_dflash2 *d) { return d->c.weight_bytes; }

/* ---- state ------------------------------------------------------------------- */

int splash_dflash2_state_new(const splash_dflash2 *m, splash_dflash2_state **out, splash_error *err) {
    splash_dflash2_state *s = calloc(1, sizeof *s);
    if (!s) return splash_fail(err, SPLASH_E_NOMEM, "dflash2: out of memory for a draft state");
    int rc = splash_dflash_kv_init(&s->kv, &m->c, err);
    if (rc) {
        free(s);
        return rc;
    }
    *out = s;
    return SPLASH_OK;
}

void splash_dflash2_state_free(splash_dflash2_state *s) {
    if (!s) return;
    splash_dflash_kv_release(&s->kv);
    free(s);
}

void splash_dflash2_state_reset(splash_dflash2_state *s) { s->kv.n_ctx = s->kv.lo = 0; }
int splash_dflash2_state_positions(const splash_dflash2_state *s) { return s->kv.n_ctx; }
size_t splash_dflash2_state_bytes(const splash_dflash2_state *s) { return s->kv.bytes; }

int splash_dflash2_state_seek(const splash_dflash2 *m, splash_dflash2_state *s, int pos, splash_error *err) {
    return splash_dflash_kv_seek(&m->c, &s->kv, pos, err);
}

size_t splash_dflash2_state_snapshot_bytes(const splash_dflash2_state *s) {
    return splash_dflash_kv_snapshot_bytes(&s->kv);
}
void splash_dflash2_state_save(const splash_dflash2_state *s, void *dst) { splash_dflash_kv_save(&s->kv, dst); }
int splash_dflash2_state_load(splash_dflash2_state *s, const void *src, splash_error *err) {
    return splash_dflash_kv_load(&s->kv, src, err);
}

/* No conv on the context: v1's append. */
int splash_dflash2_append(splash_dflash2 *m, splash_dflash2_state *s, const float *taps, int n, splash_error *err) {
    return splash_dflash_ctx_append(&m->c, &s->kv, taps, n, err);
}

/* ---- draft ------------------------------------------------------------------- */

/* xc = conv side `side` of src over the block (kernel from m->dyn) */
static void conv(splash_dflash2 *m, const float *base, int side, const float *src, int block) {
    const splash_dflash2_dims *d = &m->d;
    int K = d->conv_kernel, P = 2 * K * (d->hidden / d->conv_group);
    splash_dflash2_conv(src, (size_t)d->hidden, block, d->hidden, base + (size_t)side * K * d->hidden, m->dyn, (size_t)P,
                        side, K, d->conv_group, m->xc, (size_t)d->hidden);
}

int splash_dflash2_draft(splash_dflash2 *m, const splash_dflash2_state *s, int32_t anchor, int block, float *hidden,
                         float *logits, splash_error *err) {
    splash_dflash_ctx *c = &m->c;
    const splash_dflash2_dims *d = &m->d;
    int rc = splash_dflash_ctx_check(c, &s->kv, anchor, block, hidden, err);
    if (rc) return rc;
    size_t H = (size_t)d->hidden, qw = (size_t)d->heads * (size_t)d->head_dim, I = (size_t)d->intermediate,
           P = 2 * (size_t)d->conv_kernel * (H / (size_t)d->conv_group);
    splash_dflash_ctx_embed(c, anchor, block, d->embed_scale);
    for (int l = 0; l < d->n_layers; l++) {
        const splash_dflash_layer *L = &c->layers[l];
        const splash_dflash2_conv_weights *L2 = &m->layers[l];
        /* attention: kernels from xn = input_norm(x); q, k, v from conv0(xn) */
        splash_dflash_ctx_norm(c, c->x, c->xn, L->input_norm, block);
        cpu_matmul(&c->cpu, L2->attn_proj, block, c->xn, H, m->dyn, P);
        conv(m, L2->attn_base, 0, c->xn, block);
        splash_dflash_ctx_attend(c, &s->kv, l, m->xc, block);
        cpu_matmul(&c->cpu, L->o_proj, block, c->o, qw, m->t, H);
        conv(m, L2->attn_base, 1, m->t, block);
        for (int r = 0; r < block; r++) cpu_add(m->xc + (size_t)r * H, c->x + (size_t)r * H, (int)H);
        /* MLP: kernels from xn = post_norm(x); the MLP runs on conv0(xn) */
        splash_dflash_ctx_norm(c, c->x, c->xn, L->post_norm, block);
        cpu_matmul(&c->cpu, L2->ffn_proj, block, c->xn, H, m->dyn, P);
        conv(m, L2->ffn_base, 0, c->xn, block);
        cpu_matmul_swiglu(&c->cpu, L->gate, L->up, block, m->xc, H, c->ff, I, c->ff2, I);
        cpu_matmul(&c->cpu, L->down, block, c->ff, I, m->t, H);
        conv(m, L2->ffn_base, 1, m->t, block);
        for (int r = 0; r < block; r++) cpu_add(m->xc + (size_t)r * H, c->x + (size_t)r * H, (int)H);
    }
    splash_dflash_ctx_finish(c, block, hidden, logits);
    if (logits)
        splash_dflash2_logits_transform(logits, (size_t)(block - 1) * (size_t)d->vocab, d->output_multiplier, d->softcap);
    return SPLASH_OK;
}

/* ---- select -------------------------------------------------------------------- */

int splash_dflash2_select(splash_dflash2 *m, const float *hidden, const float *logits, int32_t anchor, int rows,
                          const splash_dflash2_select_args *a, splash_dflash2_row *out, splash_error *err) {
    const splash_dflash2_dims *d = &m->d;
    if (rows < 0 || rows > m->c.max_block - 1)
        return splash_fail(err, SPLASH_E_INVALID, "dflash2 select: %d rows outside [0, %d]", rows, m->c.max_block - 1);
    if (rows && (!hidden || !logits || !out)) return splash_fail(err, SPLASH_E_INVALID, "dflash2 select: missing buffers");
    if (!rows) return 0;
    cpu_matmul(&m->c.cpu, m->hidden_proj, rows, hidden, (size_t)d->hidden, m->gate, (size_t)d->sel_rank);
    return splash_dflash2_walk(&m->sel, m->gate, logits, anchor, rows, a, out, m->walk, err);
}
