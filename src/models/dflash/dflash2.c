/* dflash2.c - the DFlash 2 draft forward and candidate selector on the CPU
 * (see dflash2.h).
 *
 * Built like the v1 draft (dflash.c) from the CPU backend's kernels; the
 * context cache (window, seek, snapshot), its append and the block attention
 * are the v1 ones written again here, because dflash.c keeps them static (it
 * belongs to the speculative-cycle work; sharing them is a later refactor).
 * What is new is the conv around each sublayer, the logit transform and the
 * selector.  Reductions run in a fixed order (cpu_dot, cpu_softmax, the conv
 * in tap order), so a row's result does not depend on the thread count.
 */
#include "models/dflash/dflash2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "base/json.h"
#include "base/mem.h"

#define APPEND_CHUNK 64 /* context rows per append pass (scratch rows) */

typedef struct dlayer2 {
    float *input_norm, *post_norm;         /* [H] plain Qwen3 RMSNorm factors */
    float *q_norm, *k_norm;                /* [hd] */
    float *attn_base, *ffn_base;           /* [2][K][H] conv base kernels */
    const splash_tensor *attn_proj;        /* [2*K*G, H] kernel projection */
    const splash_tensor *ffn_proj;         /* [2*K*G, H] */
    const splash_tensor *q_proj;           /* [heads*hd, H] */
    const splash_tensor *k_proj, *v_proj;  /* [kvh*hd, H] */
    const splash_tensor *o_proj;           /* [H, heads*hd] */
    const splash_tensor *gate, *up;        /* [I, H] */
    const splash_tensor *down;             /* [H, I] */
} dlayer2;

struct splash_dflash2 {
    splash_dflash2_dims d;
    int max_context;                  /* positions a full layer holds (the window when window > 0) */
    int window;                       /* > 0: full layers are a ring of the last `window` positions */
    int max_block;                    /* most rows of one block */
    size_t weight_bytes;              /* draft.* tensors */
    const splash_tensor *embed;       /* [V, H] target */
    const splash_tensor *lm_head;     /* [V, H] target (embed when tied) */
    const splash_tensor *fc;          /* [H, n_taps*H] */
    const splash_tensor *hidden_proj; /* [rank, H] selector */
    splash_dflash2_selector sel;      /* codebooks [V, rank] */
    float *hidden_norm, *norm;        /* [H] */
    dlayer2 layers[SPLASH_DFLASH_MAX_LAYERS];
    float *vec;                       /* every fp32 vector, one allocation */
    cpu_ctx cpu;
    /* scratch, rows R = max(max_block, APPEND_CHUNK) */
    float *x, *xn, *xc, *t;           /* [R][H] residual, normed, conv output, sublayer output */
    float *dyn;                       /* [R][2*K*G] kernel projection */
    float *q, *k, *v, *o;             /* [R][heads*hd], [R][kvh*hd] x2, [R][heads*hd] */
    float *ff, *ff2;                  /* [R][I] */
    float *scores;                    /* [n_threads][max_context + block_size] */
    size_t scores_stride;
    float *gate;                      /* [max_block][rank] selector hidden projection */
    void *walk;                       /* splash_dflash2_walk_scratch */
};

struct splash_dflash2_state {
    int n_ctx;
    int lo;                             /* first position held: earlier ones were skipped (seek) */
    int n_layers, kvw;
    int cap[SPLASH_DFLASH_MAX_LAYERS];  /* positions held; sliding: a ring, slot = pos % cap */
    float *k[SPLASH_DFLASH_MAX_LAYERS]; /* [cap][kvh*hd] roped, normed keys */
    float *v[SPLASH_DFLASH_MAX_LAYERS]; /* [cap][kvh*hd] */
    float *mem;
    size_t bytes;
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

/* The row's top_k allowed finite logits, descending, equal logits by lower id. */
static int top_candidates(const float *l, int vocab, int top_k, const uint32_t *allow, int32_t *cand, float *val) {
    int n = 0;
    for (int t = 0; t < vocab; t++) {
        if (allow && !(allow[t >> 5] >> (t & 31) & 1u)) continue;
        float x = l[t];
        if (!(x > -INFINITY)) continue; /* -inf or NaN: never a candidate */
        if (n == top_k && !(x > val[n - 1])) continue;
        int i = n < top_k ? n++ : n - 1;
        while (i > 0 && x > val[i - 1]) {
            val[i] = val[i - 1];
            cand[i] = cand[i - 1];
            i--;
        }
        val[i] = x;
        cand[i] = t;
    }
    return n;
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
        int n = top_candidates(l, V, K, a && a->mask ? allow : NULL, o->cand, unary);
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
        int pick = 0;
        if (T > 0) {
            float u = a->uniform[row];
            if (!(u >= 0.0f && u < 1.0f))
                return splash_fail(err, SPLASH_E_INVALID, "dflash2 select: uniform %g of row %d outside [0, 1)", (double)u,
                                   row);
            float mx = -INFINITY, sum = 0;
            for (int k = 0; k < n; k++) {
                o->q[k] = o->score[k] / T;
                if (o->q[k] > mx) mx = o->q[k];
            }
            for (int k = 0; k < n; k++) sum += o->q[k] = expf(o->q[k] - mx);
            float cum = 0;
            pick = -1;
            for (int k = 0; k < n; k++) {
                o->q[k] /= sum;
                cum += o->q[k];
                if (pick < 0 && u < cum) pick = k;
            }
            if (pick < 0)
                for (pick = n - 1; pick > 0 && !(o->q[pick] > 0); pick--) {}
        } else {
            for (int k = 1; k < n; k++)
                if (o->score[k] > o->score[pick]) pick = k;
            for (int k = 0; k < n; k++) o->q[k] = k == pick ? 1.0f : 0.0f;
        }
        o->pick = pick;
        o->token = o->cand[pick];
        prefix[row + 1] = o->token;
    }
    return rows;
}

/* ---- load -------------------------------------------------------------------- */

static int dim_int(const json_value *o, const char *key, int lo, int hi, int *out, splash_error *err) {
    int64_t v;
    const json_value *x = json_get(o, key);
    if (!x || json_int64(x, &v) || v < lo || v > hi)
        return splash_fail(err, SPLASH_E_FORMAT, "manifest draft.%s: expected an integer in [%d, %d]", key, lo, hi);
    *out = (int)v;
    return SPLASH_OK;
}

static int dim_num(const json_value *o, const char *key, int allow_zero, float *out, splash_error *err) {
    const json_value *x = json_get(o, key);
    if (!x || x->type != JSON_NUMBER || !isfinite(x->num) || x->num < 0 || (!allow_zero && x->num == 0))
        return splash_fail(err, SPLASH_E_FORMAT, "manifest draft.%s: expected a %s number", key,
                           allow_zero ? "non-negative" : "positive");
    *out = (float)x->num;
    return SPLASH_OK;
}

static int parse_dims(const splash_package *pkg, splash_dflash2_dims *d, splash_error *err) {
    const json_value *man = splash_package_manifest(pkg);
    const json_value *o = json_get(man, "draft");
    if (!o || o->type != JSON_OBJECT)
        return splash_fail(err, SPLASH_E_NOTFOUND, "%s: the package has no draft (pack with --draft)", splash_package_dir(pkg));
    const char *arch = json_get_string(o, "architecture", "");
    if (strcmp(arch, "dflash2"))
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "manifest draft.architecture \"%s\" is not \"dflash2\"", arch);
    const json_value *model = json_get(man, "model");
    int rc;
    memset(d, 0, sizeof *d);
    if ((rc = dim_int(o, "hidden", 1, 1 << 16, &d->hidden, err)) ||
        (rc = dim_int(o, "layers", 1, SPLASH_DFLASH_MAX_LAYERS, &d->n_layers, err)) ||
        (rc = dim_int(o, "heads", 1, 1024, &d->heads, err)) || (rc = dim_int(o, "kv_heads", 1, 1024, &d->kv_heads, err)) ||
        (rc = dim_int(o, "head_dim", 2, CPU_KV_MAX_HEAD_DIM, &d->head_dim, err)) ||
        (rc = dim_int(o, "intermediate", 1, 1 << 20, &d->intermediate, err)) ||
        (rc = dim_int(o, "block_size", 1, SPLASH_DFLASH_MAX_BLOCK, &d->block_size, err)) ||
        (rc = dim_int(o, "mask_token_id", 0, 1 << 30, &d->mask_token_id, err)) ||
        (rc = dim_int(o, "sliding_window", 0, 1 << 30, &d->sliding_window, err)) ||
        (rc = dim_int(model, "vocab", 1, 1 << 30, &d->vocab, err)) ||
        (rc = dim_int(o, "conv_kernel_size", 1, SPLASH_DFLASH2_MAX_KERNEL, &d->conv_kernel, err)) ||
        (rc = dim_int(o, "conv_group_size", 1, 1 << 16, &d->conv_group, err)) ||
        (rc = dim_int(o, "selector_rank", 1, 1 << 16, &d->sel_rank, err)) ||
        (rc = dim_int(o, "selector_top_k", 1, SPLASH_DFLASH2_MAX_TOPK, &d->sel_top_k, err)) ||
        (rc = dim_num(o, "output_multiplier", 0, &d->output_multiplier, err)) ||
        (rc = dim_num(o, "final_logit_softcapping", 1, &d->softcap, err)) ||
        (rc = dim_num(o, "input_embedding_scale", 0, &d->embed_scale, err)))
        return rc;
    if (d->heads % d->kv_heads || d->head_dim % 2)
        return splash_fail(err, SPLASH_E_FORMAT, "manifest draft: heads must be a multiple of kv_heads, head_dim even");
    if (d->mask_token_id >= d->vocab || d->sel_top_k > d->vocab)
        return splash_fail(err, SPLASH_E_FORMAT, "manifest draft: mask_token_id / selector_top_k do not fit the vocabulary");
    if (d->hidden % d->conv_group)
        return splash_fail(err, SPLASH_E_FORMAT, "manifest draft: conv_group_size must divide hidden");
    const json_value *taps = json_get(o, "target_layer_ids"), *lt = json_get(o, "layer_types"),
                     *ca = json_get(o, "causal");
    if (!taps || taps->type != JSON_ARRAY || !taps->count || taps->count > SPLASH_DFLASH_MAX_TAPS)
        return splash_fail(err, SPLASH_E_FORMAT, "manifest draft.target_layer_ids: expected 1..%d layers",
                           SPLASH_DFLASH_MAX_TAPS);
    d->n_taps = (int)taps->count;
    for (int i = 0; i < d->n_taps; i++) {
        int64_t t;
        if (json_int64(taps->items[i], &t) || t < 0 || t > 1 << 20)
            return splash_fail(err, SPLASH_E_FORMAT, "manifest draft.target_layer_ids[%d] is not a layer", i);
        d->taps[i] = (int)t;
    }
    if (!lt || lt->type != JSON_ARRAY || (int)lt->count != d->n_layers || !ca || ca->type != JSON_ARRAY ||
        (int)ca->count != d->n_layers)
        return splash_fail(err, SPLASH_E_FORMAT, "manifest draft.layer_types and draft.causal must list %d layers",
                           d->n_layers);
    for (int i = 0; i < d->n_layers; i++) {
        const char *s = json_string(lt->items[i]);
        if (!s || (strcmp(s, "sliding_attention") && strcmp(s, "full_attention")) || !json_is_bool(ca->items[i]))
            return splash_fail(err, SPLASH_E_FORMAT, "manifest draft layer %d: bad layer_types / causal entry", i);
        d->sliding[i] = !strcmp(s, "sliding_attention");
        d->causal[i] = ca->items[i]->type == JSON_TRUE;
        if (d->sliding[i] && d->sliding_window < 1)
            return splash_fail(err, SPLASH_E_FORMAT, "manifest draft: layer %d is sliding but sliding_window is 0", i);
    }
    const json_value *e = json_get(o, "rms_eps"), *th = json_get(o, "rope_theta");
    if (!e || e->type != JSON_NUMBER || !(e->num > 0) || !th || th->type != JSON_NUMBER || !(th->num > 0))
        return splash_fail(err, SPLASH_E_FORMAT, "manifest draft: rms_eps and rope_theta must be positive numbers");
    d->rms_eps = (float)e->num;
    d->rope_theta = th->num;
    return SPLASH_OK;
}

static int bind_matrix(const splash_package *pkg, const char *name, int64_t rows, int64_t cols,
                       const splash_tensor **out, splash_error *err) {
    int64_t shape[2] = {rows, cols};
    return splash_package_get(pkg, name, 2, shape, out, err);
}

/* An f32/bf16/f16 tensor of `ndim` dims copied to fp32 at dst (n elements). */
static int bind_floats(const splash_package *pkg, const char *name, int ndim, const int64_t *shape, float *dst,
                       splash_error *err) {
    const splash_tensor *t;
    int rc = splash_package_get(pkg, name, ndim, shape, &t, err);
    if (rc) return rc;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    if (t->dtype != SPLASH_F32 && t->dtype != SPLASH_BF16 && t->dtype != SPLASH_F16)
        return splash_fail(err, SPLASH_E_FORMAT, "%s: a vector must be stored as a float type", name);
    splash_tensor v = *t;
    v.ndim = 2;
    v.shape[0] = 1;
    v.shape[1] = n;
    splash_tensor_row_f32(&v, 0, dst);
    return SPLASH_OK;
}

int splash_dflash2_load(const splash_package *pkg, const splash_dflash_options *opt, splash_dflash2 **out,
                        splash_error *err) {
    *out = NULL;
    splash_dflash2_dims dims;
    int rc = parse_dims(pkg, &dims, err);
    if (rc) return rc;
    if (!opt || (opt->max_context < 1 && opt->window < 1))
        return splash_fail(err, SPLASH_E_INVALID, "dflash2: max_context or window must be positive");
    if (opt->max_block < 0 || opt->max_block > SPLASH_DFLASH_MAX_BLOCK)
        return splash_fail(err, SPLASH_E_INVALID, "dflash2: max_block %d outside [0, %d]", opt->max_block,
                           SPLASH_DFLASH_MAX_BLOCK);
    splash_dflash2 *m = xcalloc(1, sizeof *m);
    m->d = dims;
    m->window = opt->window > 0 ? opt->window : 0;
    m->max_context = m->window ? m->window : opt->max_context;
    m->max_block = opt->max_block > dims.block_size ? opt->max_block : dims.block_size;
    for (size_t i = 0; i < splash_package_tensor_count(pkg); i++) {
        const splash_tensor *t = splash_package_tensor_at(pkg, i);
        if (!strncmp(t->name, "draft.", 6)) m->weight_bytes += t->bytes;
    }
    const splash_dflash2_dims *d = &m->d;
    int64_t H = d->hidden, hd = d->head_dim, qw = (int64_t)d->heads * hd, kvw = (int64_t)d->kv_heads * hd,
            I = d->intermediate, K = d->conv_kernel, P = 2 * K * (H / d->conv_group), RK = d->sel_rank;
    size_t nvec = (size_t)(2 * H) + (size_t)d->n_layers * (size_t)(2 * H + 2 * hd + 4 * K * H);
    m->vec = xcalloc(nvec, sizeof *m->vec);
    float *vp = m->vec;
    m->hidden_norm = vp, vp += H;
    m->norm = vp, vp += H;
    char n[96];
    if ((rc = bind_matrix(pkg, "embed", d->vocab, H, &m->embed, err))) goto fail;
    m->lm_head = splash_package_find(pkg, "lm_head");
    if (!m->lm_head) m->lm_head = m->embed;
    else if ((rc = bind_matrix(pkg, "lm_head", d->vocab, H, &m->lm_head, err))) goto fail;
    if ((rc = bind_matrix(pkg, "draft.fc", H, (int64_t)d->n_taps * H, &m->fc, err)) ||
        (rc = bind_floats(pkg, "draft.hidden_norm", 1, &H, m->hidden_norm, err)) ||
        (rc = bind_floats(pkg, "draft.norm", 1, &H, m->norm, err)) ||
        (rc = bind_matrix(pkg, "draft.selector.hidden_proj", RK, H, &m->hidden_proj, err)) ||
        (rc = bind_matrix(pkg, "draft.selector.pred_codebook", d->vocab, RK, &m->sel.pred_codebook, err)) ||
        (rc = bind_matrix(pkg, "draft.selector.succ_codebook", d->vocab, RK, &m->sel.succ_codebook, err)))
        goto fail;
    m->sel.vocab = d->vocab;
    m->sel.rank = d->sel_rank;
    m->sel.top_k = d->sel_top_k;
    int64_t base_shape[3] = {2, K, H};
    for (int l = 0; l < d->n_layers; l++) {
        dlayer2 *L = &m->layers[l];
        L->input_norm = vp, vp += H;
        L->post_norm = vp, vp += H;
        L->q_norm = vp, vp += hd;
        L->k_norm = vp, vp += hd;
        L->attn_base = vp, vp += 2 * K * H;
        L->ffn_base = vp, vp += 2 * K * H;
#define NAME(s) (snprintf(n, sizeof n, "draft.layers.%d." s, l), n)
        if ((rc = bind_floats(pkg, NAME("input_norm"), 1, &H, L->input_norm, err)) ||
            (rc = bind_floats(pkg, NAME("post_norm"), 1, &H, L->post_norm, err)) ||
            (rc = bind_floats(pkg, NAME("attn.q_norm"), 1, &hd, L->q_norm, err)) ||
            (rc = bind_floats(pkg, NAME("attn.k_norm"), 1, &hd, L->k_norm, err)) ||
            (rc = bind_floats(pkg, NAME("attn_conv.base"), 3, base_shape, L->attn_base, err)) ||
            (rc = bind_floats(pkg, NAME("ffn_conv.base"), 3, base_shape, L->ffn_base, err)) ||
            (rc = bind_matrix(pkg, NAME("attn_conv.proj"), P, H, &L->attn_proj, err)) ||
            (rc = bind_matrix(pkg, NAME("ffn_conv.proj"), P, H, &L->ffn_proj, err)) ||
            (rc = bind_matrix(pkg, NAME("attn.q_proj"), qw, H, &L->q_proj, err)) ||
            (rc = bind_matrix(pkg, NAME("attn.k_proj"), kvw, H, &L->k_proj, err)) ||
            (rc = bind_matrix(pkg, NAME("attn.v_proj"), kvw, H, &L->v_proj, err)) ||
            (rc = bind_matrix(pkg, NAME("attn.o_proj"), H, qw, &L->o_proj, err)) ||
            (rc = bind_matrix(pkg, NAME("ffn.gate"), I, H, &L->gate, err)) ||
            (rc = bind_matrix(pkg, NAME("ffn.up"), I, H, &L->up, err)) ||
            (rc = bind_matrix(pkg, NAME("ffn.down"), H, I, &L->down, err)))
            goto fail;
#undef NAME
    }
    int R = m->max_block > APPEND_CHUNK ? m->max_block : APPEND_CHUNK;
    int64_t cols = (int64_t)d->n_taps * H;
    if (I > cols) cols = I;
    if (qw > cols) cols = qw;
    if (cpu_ctx_init(&m->cpu, opt->threads, R, (int)cols)) {
        rc = splash_fail(err, SPLASH_E_NOMEM, "dflash2: out of memory for the CPU scratch");
        goto fail;
    }
    if (opt->act && cpu_set_act(&m->cpu, opt->act)) {
        rc = splash_fail(err, SPLASH_E_NOMEM, "dflash2: out of memory for the activation scratch");
        goto fail;
    }
    m->x = xcalloc((size_t)R * H, sizeof(float));
    m->xn = xcalloc((size_t)R * H, sizeof(float));
    m->xc = xcalloc((size_t)R * H, sizeof(float));
    m->t = xcalloc((size_t)R * H, sizeof(float));
    m->dyn = xcalloc((size_t)R * P, sizeof(float));
    m->q = xcalloc((size_t)R * qw, sizeof(float));
    m->o = xcalloc((size_t)R * qw, sizeof(float));
    m->k = xcalloc((size_t)R * kvw, sizeof(float));
    m->v = xcalloc((size_t)R * kvw, sizeof(float));
    m->ff = xcalloc((size_t)R * I, sizeof(float));
    m->ff2 = xcalloc((size_t)R * I, sizeof(float));
    m->scores_stride = (size_t)m->max_context + (size_t)m->max_block;
    m->scores = xcalloc((size_t)m->cpu.n_threads * m->scores_stride, sizeof(float));
    m->gate = xcalloc((size_t)m->max_block * RK, sizeof(float));
    m->walk = xcalloc(1, splash_dflash2_walk_scratch(d->vocab, d->sel_rank));
    *out = m;
    return SPLASH_OK;
fail:
    splash_dflash2_free(m);
    return rc;
}

void splash_dflash2_free(splash_dflash2 *m) {
    if (!m) return;
    if (m->cpu.pool) cpu_ctx_free(&m->cpu);
    float *bufs[] = {m->vec, m->x, m->xn, m->xc, m->t, m->dyn, m->q, m->o, m->k, m->v, m->ff, m->ff2, m->scores, m->gate};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(m->walk);
    free(m);
}

const splash_dflash2_dims *splash_dflash2_get_dims(const splash_dflash2 *d) { return &d->d; }
int splash_dflash2_max_block(const splash_dflash2 *d) { return d->max_block; }
size_t splash_dflash2_weight_bytes(const splash_dflash2 *d) { return d->weight_bytes; }

/* ---- state ------------------------------------------------------------------- */

int splash_dflash2_state_new(const splash_dflash2 *m, splash_dflash2_state **out, splash_error *err) {
    const splash_dflash2_dims *d = &m->d;
    splash_dflash2_state *s = calloc(1, sizeof *s);
    if (!s) return splash_fail(err, SPLASH_E_NOMEM, "dflash2: out of memory for a draft state");
    s->n_layers = d->n_layers;
    s->kvw = d->kv_heads * d->head_dim;
    size_t total = 0;
    for (int l = 0; l < d->n_layers; l++) {
        s->cap[l] = d->sliding[l] && d->sliding_window < m->max_context ? d->sliding_window : m->max_context;
        total += 2 * (size_t)s->cap[l] * (size_t)s->kvw;
    }
    s->mem = malloc(total * sizeof(float));
    if (!s->mem) {
        free(s);
        return splash_fail(err, SPLASH_E_NOMEM, "dflash2: out of memory for a draft state (%zu bytes)", total * 4);
    }
    float *p = s->mem;
    for (int l = 0; l < d->n_layers; l++) {
        s->k[l] = p, p += (size_t)s->cap[l] * s->kvw;
        s->v[l] = p, p += (size_t)s->cap[l] * s->kvw;
    }
    s->bytes = total * sizeof(float);
    *out = s;
    return SPLASH_OK;
}

void splash_dflash2_state_free(splash_dflash2_state *s) {
    if (!s) return;
    free(s->mem);
    free(s);
}

void splash_dflash2_state_reset(splash_dflash2_state *s) { s->n_ctx = s->lo = 0; }
int splash_dflash2_state_positions(const splash_dflash2_state *s) { return s->n_ctx; }
size_t splash_dflash2_state_bytes(const splash_dflash2_state *s) { return s->bytes; }

int splash_dflash2_state_seek(const splash_dflash2 *m, splash_dflash2_state *s, int pos, splash_error *err) {
    if (pos < s->n_ctx || (!m->window && pos > m->max_context))
        return splash_fail(err, SPLASH_E_INVALID, "dflash2 seek: position %d before %d or past max_context %d", pos,
                           s->n_ctx, m->max_context);
    if (pos > s->n_ctx) s->n_ctx = s->lo = pos;
    return SPLASH_OK;
}

/* A snapshot: this header, then the rings exactly as the state holds them. */
typedef struct snap_header {
    uint32_t magic, n_layers;
    int32_t n_ctx, lo;
    uint64_t bytes;
    uint8_t pad[40]; /* 64 bytes: the rings stay aligned */
} snap_header;
#define SNAP_MAGIC 0x32464c53u /* "SLF2" */

size_t splash_dflash2_state_snapshot_bytes(const splash_dflash2_state *s) { return sizeof(snap_header) + s->bytes; }

void splash_dflash2_state_save(const splash_dflash2_state *s, void *dst) {
    snap_header h = {SNAP_MAGIC, (uint32_t)s->n_layers, s->n_ctx, s->lo, s->bytes, {0}};
    memcpy(dst, &h, sizeof h);
    memcpy((char *)dst + sizeof h, s->mem, s->bytes);
}

int splash_dflash2_state_load(splash_dflash2_state *s, const void *src, splash_error *err) {
    snap_header h;
    memcpy(&h, src, sizeof h);
    if (h.magic != SNAP_MAGIC || h.n_layers != (uint32_t)s->n_layers || h.bytes != s->bytes || h.n_ctx < h.lo || h.lo < 0)
        return splash_fail(err, SPLASH_E_INVALID, "dflash2: the snapshot is not one of this draft's states");
    memcpy(s->mem, (const char *)src + sizeof h, s->bytes);
    s->n_ctx = h.n_ctx;
    s->lo = h.lo;
    return SPLASH_OK;
}

/* ---- per-row tasks -------------------------------------------------------------- */

typedef struct row_job {
    splash_dflash2 *m;
    const float *src;  /* [rows][H] */
    float *dst;        /* [rows][H] */
    const float *nf;   /* norm factor */
    const dlayer2 *L;
    int pos0;          /* position of row 0 */
    int q;             /* rows carry queries too */
} row_job;

static void norm_task(void *ctx, size_t r, int worker) {
    (void)worker;
    const row_job *j = ctx;
    int H = j->m->d.hidden;
    cpu_rmsnorm(j->src + r * H, j->nf, H, j->m->d.rms_eps, j->dst + r * H);
}

/* q_norm / k_norm and rotary of row r (k in m->k, q in m->q when j->q) */
static void qk_task(void *ctx, size_t r, int worker) {
    (void)worker;
    const row_job *j = ctx;
    splash_dflash2 *m = j->m;
    const splash_dflash2_dims *d = &m->d;
    int hd = d->head_dim;
    float *k = m->k + r * (size_t)d->kv_heads * hd;
    for (int h = 0; h < d->kv_heads; h++) cpu_rmsnorm(k + (size_t)h * hd, j->L->k_norm, hd, d->rms_eps, k + (size_t)h * hd);
    cpu_rope(k, d->kv_heads, hd, hd, d->rope_theta, j->pos0 + (int32_t)r);
    if (!j->q) return;
    float *q = m->q + r * (size_t)d->heads * hd;
    for (int h = 0; h < d->heads; h++) cpu_rmsnorm(q + (size_t)h * hd, j->L->q_norm, hd, d->rms_eps, q + (size_t)h * hd);
    cpu_rope(q, d->heads, hd, hd, d->rope_theta, j->pos0 + (int32_t)r);
}

/* ---- append ------------------------------------------------------------------- */

int splash_dflash2_append(splash_dflash2 *m, splash_dflash2_state *s, const float *taps, int n, splash_error *err) {
    const splash_dflash2_dims *d = &m->d;
    if (n < 0 || (n && !taps)) return splash_fail(err, SPLASH_E_INVALID, "dflash2 append: bad rows");
    if (s->n_layers != d->n_layers) return splash_fail(err, SPLASH_E_INVALID, "dflash2 append: state of another draft");
    if (!m->window && (int64_t)s->n_ctx + n > m->max_context)
        return splash_fail(err, SPLASH_E_INVALID, "dflash2 append: %d + %d positions exceed max_context %d", s->n_ctx, n,
                           m->max_context);
    size_t H = (size_t)d->hidden, in = (size_t)d->n_taps * H, kvw = (size_t)s->kvw;
    for (int r0 = 0; r0 < n; r0 += APPEND_CHUNK) {
        int rows = n - r0 < APPEND_CHUNK ? n - r0 : APPEND_CHUNK;
        int pos0 = s->n_ctx + r0;
        /* ctx = hidden_norm(fc(taps)) into xn; no conv on the context */
        cpu_matmul(&m->cpu, m->fc, rows, taps + (size_t)r0 * in, in, m->x, H);
        row_job nj = {m, m->x, m->xn, m->hidden_norm, NULL, 0, 0};
        cpu_parallel(&m->cpu, (size_t)rows, norm_task, &nj);
        for (int l = 0; l < d->n_layers; l++) {
            const dlayer2 *L = &m->layers[l];
            /* a sliding layer computes only the positions its ring keeps */
            int keep_from = s->n_ctx + n - s->cap[l], skip = keep_from > pos0 ? keep_from - pos0 : 0;
            if (skip >= rows) continue;
            const float *src = m->xn + (size_t)skip * H;
            int nr = rows - skip;
            cpu_mm_part parts[2] = {{L->k_proj, m->k, kvw, 0}, {L->v_proj, m->v, kvw, 0}};
            cpu_matmul_parts(&m->cpu, parts, 2, nr, src, H);
            row_job qj = {m, NULL, NULL, NULL, L, pos0 + skip, 0};
            cpu_parallel(&m->cpu, (size_t)nr, qk_task, &qj);
            for (int r = 0; r < nr; r++) {
                int slot = (pos0 + skip + r) % s->cap[l];
                memcpy(s->k[l] + (size_t)slot * kvw, m->k + (size_t)r * kvw, kvw * sizeof(float));
                memcpy(s->v[l] + (size_t)slot * kvw, m->v + (size_t)r * kvw, kvw * sizeof(float));
            }
        }
    }
    s->n_ctx += n;
    return SPLASH_OK;
}

/* ---- draft ------------------------------------------------------------------- */

typedef struct attn_job {
    splash_dflash2 *m;
    const splash_dflash2_state *s;
    int l, block;
    float scale;
} attn_job;

/* task = row * heads + head: softmax over the visible context and block keys
 * (sliding: a query at position t sees keys at positions > t - window;
 * causal: block keys up to its own row, else the whole block). */
static void attn_task(void *ctx, size_t task, int worker) {
    const attn_job *j = ctx;
    splash_dflash2 *m = j->m;
    const splash_dflash2_dims *d = &m->d;
    const splash_dflash2_state *s = j->s;
    int hd = d->head_dim, heads = d->heads, l = j->l;
    int i = (int)(task / (size_t)heads), h = (int)(task % (size_t)heads);
    int kh = h / (heads / d->kv_heads);
    size_t kvw = (size_t)s->kvw;
    int start = s->n_ctx, qp = start + i, W = d->sliding_window;
    int sliding = d->sliding[l], causal = d->causal[l];
    const float *q = m->q + (size_t)i * heads * hd + (size_t)h * hd;
    float *sc = m->scores + (size_t)worker * m->scores_stride;
    int c0 = s->lo;                                     /* earlier positions were skipped (seek) */
    if (start - s->cap[l] > c0) c0 = start - s->cap[l]; /* a ring holds the last cap positions */
    if (sliding && qp - W + 1 > c0) c0 = qp - W + 1;
    int nc = start > c0 ? start - c0 : 0;
    int n = 0;
    for (int p = c0; p < start; p++)
        sc[n++] = cpu_dot(q, s->k[l] + (size_t)(p % s->cap[l]) * kvw + (size_t)kh * hd, hd) * j->scale;
    int b0 = 0, b1 = causal ? i + 1 : j->block; /* visible block rows [b0, b1) */
    if (sliding) {
        if (i - W + 1 > b0) b0 = i - W + 1;
        if (!causal && i + W < b1) b1 = i + W;
    }
    for (int b = b0; b < b1; b++) sc[n++] = cpu_dot(q, m->k + (size_t)b * kvw + (size_t)kh * hd, hd) * j->scale;
    cpu_softmax(sc, n);
    float *o = m->o + (size_t)i * heads * hd + (size_t)h * hd;
    memset(o, 0, (size_t)hd * sizeof *o);
    for (int t = 0; t < nc; t++)
        cpu_axpy(sc[t], s->v[l] + (size_t)((c0 + t) % s->cap[l]) * kvw + (size_t)kh * hd, o, hd);
    for (int b = b0; b < b1; b++) cpu_axpy(sc[nc + b - b0], m->v + (size_t)b * kvw + (size_t)kh * hd, o, hd);
}

/* xc = conv side `side` of src over the block (kernel from m->dyn) */
static void conv(splash_dflash2 *m, const float *base, int side, const float *src, int block) {
    const splash_dflash2_dims *d = &m->d;
    int K = d->conv_kernel, P = 2 * K * (d->hidden / d->conv_group);
    splash_dflash2_conv(src, (size_t)d->hidden, block, d->hidden, base + (size_t)side * K * d->hidden, m->dyn, (size_t)P,
                        side, K, d->conv_group, m->xc, (size_t)d->hidden);
}

int splash_dflash2_draft(splash_dflash2 *m, const splash_dflash2_state *s, int32_t anchor, int block, float *hidden,
                         float *logits, splash_error *err) {
    const splash_dflash2_dims *d = &m->d;
    if (block < 2 || block > m->max_block)
        return splash_fail(err, SPLASH_E_INVALID, "dflash2 draft: block %d outside [2, %d]", block, m->max_block);
    if (anchor < 0 || anchor >= d->vocab)
        return splash_fail(err, SPLASH_E_INVALID, "dflash2 draft: anchor token %d outside the vocabulary", (int)anchor);
    if (s->n_layers != d->n_layers) return splash_fail(err, SPLASH_E_INVALID, "dflash2 draft: state of another draft");
    if (!hidden) return splash_fail(err, SPLASH_E_INVALID, "dflash2 draft: no output buffer");
    size_t H = (size_t)d->hidden, hd = (size_t)d->head_dim, qw = (size_t)d->heads * hd, kvw = (size_t)s->kvw,
           I = (size_t)d->intermediate, P = 2 * (size_t)d->conv_kernel * (H / (size_t)d->conv_group);
    for (int r = 0; r < block; r++) {
        float *x = m->x + (size_t)r * H;
        cpu_dequant_row(m->embed, r ? d->mask_token_id : anchor, x);
        if (d->embed_scale != 1.0f)
            for (size_t c = 0; c < H; c++) x[c] *= d->embed_scale;
    }
    for (int l = 0; l < d->n_layers; l++) {
        const dlayer2 *L = &m->layers[l];
        /* attention: kernels from xn = input_norm(x); q, k, v from conv0(xn) */
        row_job nj = {m, m->x, m->xn, L->input_norm, L, s->n_ctx, 1};
        cpu_parallel(&m->cpu, (size_t)block, norm_task, &nj);
        cpu_matmul(&m->cpu, L->attn_proj, block, m->xn, H, m->dyn, P);
        conv(m, L->attn_base, 0, m->xn, block);
        cpu_mm_part in[3] = {{L->q_proj, m->q, qw, 0}, {L->k_proj, m->k, kvw, 0}, {L->v_proj, m->v, kvw, 0}};
        cpu_matmul_parts(&m->cpu, in, 3, block, m->xc, H);
        cpu_parallel(&m->cpu, (size_t)block, qk_task, &nj);
        attn_job aj = {m, s, l, block, (float)pow((double)hd, -0.5)};
        cpu_parallel(&m->cpu, (size_t)block * (size_t)d->heads, attn_task, &aj);
        cpu_matmul(&m->cpu, L->o_proj, block, m->o, qw, m->t, H);
        conv(m, L->attn_base, 1, m->t, block);
        for (int r = 0; r < block; r++) cpu_add(m->xc + (size_t)r * H, m->x + (size_t)r * H, (int)H);
        /* MLP: kernels from xn = post_norm(x); the MLP runs on conv0(xn) */
        row_job pj = {m, m->x, m->xn, L->post_norm, L, 0, 0};
        cpu_parallel(&m->cpu, (size_t)block, norm_task, &pj);
        cpu_matmul(&m->cpu, L->ffn_proj, block, m->xn, H, m->dyn, P);
        conv(m, L->ffn_base, 0, m->xn, block);
        cpu_matmul_swiglu(&m->cpu, L->gate, L->up, block, m->xc, H, m->ff, I, m->ff2, I);
        cpu_matmul(&m->cpu, L->down, block, m->ff, I, m->t, H);
        conv(m, L->ffn_base, 1, m->t, block);
        for (int r = 0; r < block; r++) cpu_add(m->xc + (size_t)r * H, m->x + (size_t)r * H, (int)H);
    }
    row_job fj = {m, m->x, m->xn, m->norm, NULL, 0, 0};
    cpu_parallel(&m->cpu, (size_t)block, norm_task, &fj);
    memcpy(hidden, m->xn + H, (size_t)(block - 1) * H * sizeof(float));
    if (logits) {
        cpu_matmul(&m->cpu, m->lm_head, block - 1, m->xn + H, H, logits, (size_t)d->vocab);
        splash_dflash2_logits_transform(logits, (size_t)(block - 1) * (size_t)d->vocab, d->output_multiplier, d->softcap);
    }
    return SPLASH_OK;
}

/* ---- select -------------------------------------------------------------------- */

int splash_dflash2_select(splash_dflash2 *m, const float *hidden, const float *logits, int32_t anchor, int rows,
                          const splash_dflash2_select_args *a, splash_dflash2_row *out, splash_error *err) {
    const splash_dflash2_dims *d = &m->d;
    if (rows < 0 || rows > m->max_block - 1)
        return splash_fail(err, SPLASH_E_INVALID, "dflash2 select: %d rows outside [0, %d]", rows, m->max_block - 1);
    if (rows && (!hidden || !logits || !out)) return splash_fail(err, SPLASH_E_INVALID, "dflash2 select: missing buffers");
    if (!rows) return 0;
    cpu_matmul(&m->cpu, m->hidden_proj, rows, hidden, (size_t)d->hidden, m->gate, (size_t)d->sel_rank);
    return splash_dflash2_walk(&m->sel, m->gate, logits, anchor, rows, a, out, m->walk, err);
}
