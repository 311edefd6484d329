/* dflash_ctx.c - a DFlash draft's context cache and block attention, shared
 * by v1 and v2 (see dflash_ctx.h).
 *
 * Built from the CPU backend's kernels; the one piece of its own is the
 * attention, because the draft's keys are a contiguous per-lane cache plus
 * the block's own rows with a per-layer mask (causal or not, windowed or
 * not), which the paged kernel does not express.  Its reductions are in a
 * fixed order (cpu_dot, cpu_softmax, cpu_axpy in key order), so a row's
 * result does not depend on the thread count.
 */
#include "models/dflash/dflash_ctx.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"

/* ---- load -------------------------------------------------------------------- */

int splash_dflash_dim_int(const json_value *o, const char *key, int lo, int hi, int *out, splash_error *err) {
    int64_t v;
    const json_value *x = json_get(o, key);
    if (!x || json_int64(x, &v) || v < lo || v > hi)
        return splash_fail(err, SPLASH_E_FORMAT, "manifest draft.%s: expected an integer in [%d, %d]", key, lo, hi);
    *out = (int)v;
    return SPLASH_OK;
}

int splash_dflash_parse_dims(const splash_package *pkg, const char *arch, splash_dflash_dims *d,
                             const json_value **draft, splash_error *err) {
    const json_value *man = splash_package_manifest(pkg);
    const json_value *o = json_get(man, "draft");
    if (!o || o->type != JSON_OBJECT)
        return splash_fail(err, SPLASH_E_NOTFOUND, "%s: the package has no draft (pack with --draft)", splash_package_dir(pkg));
    const char *a = json_get_string(o, "architecture", "");
    if (strcmp(a, arch))
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "manifest draft.architecture \"%s\" is not \"%s\"", a, arch);
    *draft = o;
    const json_value *model = json_get(man, "model");
    int rc;
    memset(d, 0, sizeof *d);
    if ((rc = splash_dflash_dim_int(o, "hidden", 1, 1 << 16, &d->hidden, err)) ||
        (rc = splash_dflash_dim_int(o, "layers", 1, SPLASH_DFLASH_MAX_LAYERS, &d->n_layers, err)) ||
        (rc = splash_dflash_dim_int(o, "heads", 1, 1024, &d->heads, err)) ||
        (rc = splash_dflash_dim_int(o, "kv_heads", 1, 1024, &d->kv_heads, err)) ||
        (rc = splash_dflash_dim_int(o, "head_dim", 2, CPU_KV_MAX_HEAD_DIM, &d->head_dim, err)) ||
        (rc = splash_dflash_dim_int(o, "intermediate", 1, 1 << 20, &d->intermediate, err)) ||
        (rc = splash_dflash_dim_int(o, "block_size", 1, SPLASH_DFLASH_MAX_BLOCK, &d->block_size, err)) ||
        (rc = splash_dflash_dim_int(o, "mask_token_id", 0, 1 << 30, &d->mask_token_id, err)) ||
        (rc = splash_dflash_dim_int(o, "sliding_window", 0, 1 << 30, &d->sliding_window, err)) ||
        (rc = splash_dflash_dim_int(model, "vocab", 1, 1 << 30, &d->vocab, err)))
        return rc;
    if (d->heads % d->kv_heads || d->head_dim % 2)
        return splash_fail(err, SPLASH_E_FORMAT, "manifest draft: heads must be a multiple of kv_heads, head_dim even");
    if (d->mask_token_id >= d->vocab)
        return splash_fail(err, SPLASH_E_FORMAT, "manifest draft.mask_token_id is outside the vocabulary");
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

int splash_dflash_bind_matrix(const splash_package *pkg, const char *name, int64_t rows, int64_t cols,
                              const splash_tensor **out, splash_error *err) {
    int64_t shape[2] = {rows, cols};
    return splash_package_get(pkg, name, 2, shape, out, err);
}

int splash_dflash_bind_floats(const splash_package *pkg, const char *name, int ndim, const int64_t *shape, float *dst,
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

int splash_dflash_ctx_load(splash_dflash_ctx *c, const char *name, uint32_t snap_magic, const splash_package *pkg,
                           const splash_dflash_options *opt, const splash_dflash_dims *dims, splash_error *err) {
    if (!opt || (opt->max_context < 1 && opt->window < 1))
        return splash_fail(err, SPLASH_E_INVALID, "%s: max_context or window must be positive", name);
    if (opt->max_block < 0 || opt->max_block > SPLASH_DFLASH_MAX_BLOCK)
        return splash_fail(err, SPLASH_E_INVALID, "%s: max_block %d outside [0, %d]", name, opt->max_block,
                           SPLASH_DFLASH_MAX_BLOCK);
    c->name = name;
    c->snap_magic = snap_magic;
    c->d = *dims;
    c->window = opt->window > 0 ? opt->window : 0;
    c->max_context = c->window ? c->window : opt->max_context;
    c->max_block = opt->max_block > dims->block_size ? opt->max_block : dims->block_size;
    const splash_dflash_dims *d = &c->d;
    int64_t H = d->hidden, hd = d->head_dim, qw = (int64_t)d->heads * hd, kvw = (int64_t)d->kv_heads * hd,
            I = d->intermediate;
    size_t nvec = (size_t)(2 * H) + (size_t)d->n_layers * (size_t)(2 * H + 2 * hd);
    c->vec = xcalloc(nvec, sizeof *c->vec);
    float *vp = c->vec;
    c->hidden_norm = vp, vp += H;
    c->norm = vp, vp += H;
    char n[96];
    int rc;
    if ((rc = splash_dflash_bind_matrix(pkg, "embed", d->vocab, H, &c->embed, err))) return rc;
    c->lm_head = splash_package_find(pkg, "lm_head");
    if (!c->lm_head) c->lm_head = c->embed;
    else if ((rc = splash_dflash_bind_matrix(pkg, "lm_head", d->vocab, H, &c->lm_head, err))) return rc;
    if ((rc = splash_dflash_bind_matrix(pkg, "draft.fc", H, (int64_t)d->n_taps * H, &c->fc, err)) ||
        (rc = splash_dflash_bind_floats(pkg, "draft.hidden_norm", 1, &H, c->hidden_norm, err)) ||
        (rc = splash_dflash_bind_floats(pkg, "draft.norm", 1, &H, c->norm, err)))
        return rc;
    for (int l = 0; l < d->n_layers; l++) {
        splash_dflash_layer *L = &c->layers[l];
        L->input_norm = vp, vp += H;
        L->post_norm = vp, vp += H;
        L->q_norm = vp, vp += hd;
        L->k_norm = vp, vp += hd;
#define NAME(s) (snprintf(n, sizeof n, "draft.layers.%d." s, l), n)
        if ((rc = splash_dflash_bind_floats(pkg, NAME("input_norm"), 1, &H, L->input_norm, err)) ||
            (rc = splash_dflash_bind_floats(pkg, NAME("post_norm"), 1, &H, L->post_norm, err)) ||
            (rc = splash_dflash_bind_floats(pkg, NAME("attn.q_norm"), 1, &hd, L->q_norm, err)) ||
            (rc = splash_dflash_bind_floats(pkg, NAME("attn.k_norm"), 1, &hd, L->k_norm, err)) ||
            (rc = splash_dflash_bind_matrix(pkg, NAME("attn.q_proj"), qw, H, &L->q_proj, err)) ||
            (rc = splash_dflash_bind_matrix(pkg, NAME("attn.k_proj"), kvw, H, &L->k_proj, err)) ||
            (rc = splash_dflash_bind_matrix(pkg, NAME("attn.v_proj"), kvw, H, &L->v_proj, err)) ||
            (rc = splash_dflash_bind_matrix(pkg, NAME("attn.o_proj"), H, qw, &L->o_proj, err)) ||
            (rc = splash_dflash_bind_matrix(pkg, NAME("ffn.gate"), I, H, &L->gate, err)) ||
            (rc = splash_dflash_bind_matrix(pkg, NAME("ffn.up"), I, H, &L->up, err)) ||
            (rc = splash_dflash_bind_matrix(pkg, NAME("ffn.down"), H, I, &L->down, err)))
            return rc;
#undef NAME
    }
    for (size_t i = 0; i < splash_package_tensor_count(pkg); i++) {
        const splash_tensor *t = splash_package_tensor_at(pkg, i);
        if (!strncmp(t->name, "draft.", 6)) c->weight_bytes += t->bytes;
    }
    int R = c->max_block > SPLASH_DFLASH_APPEND_CHUNK ? c->max_block : SPLASH_DFLASH_APPEND_CHUNK;
    int64_t cols = (int64_t)d->n_taps * H;
    if (I > cols) cols = I;
    if (qw > cols) cols = qw;
    if (cpu_ctx_init(&c->cpu, opt->threads, R, (int)cols))
        return splash_fail(err, SPLASH_E_NOMEM, "%s: out of memory for the CPU scratch", name);
    if (opt->act && cpu_set_act(&c->cpu, opt->act))
        return splash_fail(err, SPLASH_E_NOMEM, "%s: out of memory for the activation scratch", name);
    c->x = xcalloc((size_t)R * H, sizeof(float));
    c->xn = xcalloc((size_t)R * H, sizeof(float));
    c->q = xcalloc((size_t)R * qw, sizeof(float));
    c->o = xcalloc((size_t)R * qw, sizeof(float));
    c->k = xcalloc((size_t)R * kvw, sizeof(float));
    c->v = xcalloc((size_t)R * kvw, sizeof(float));
    c->ff = xcalloc((size_t)R * I, sizeof(float));
    c->ff2 = xcalloc((size_t)R * I, sizeof(float));
    c->scores_stride = (size_t)c->max_context + (size_t)c->max_block;
    c->scores = xcalloc((size_t)c->cpu.n_threads * c->scores_stride, sizeof(float));
    return SPLASH_OK;
}

void splash_dflash_ctx_release(splash_dflash_ctx *c) {
    if (c->cpu.pool) cpu_ctx_free(&c->cpu);
    float *bufs[] = {c->vec, c->x, c->xn, c->q, c->o, c->k, c->v, c->ff, c->ff2, c->scores};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

/* ---- a lane's context cache ------------------------------------------------------ */

void splash_dflash_kv_shape(splash_dflash_kv *s, const splash_dflash_ctx *c) {
    const splash_dflash_dims *d = &c->d;
    memset(s, 0, sizeof *s);
    s->name = c->name;
    s->snap_magic = c->snap_magic;
    s->n_layers = d->n_layers;
    s->kvw = d->kv_heads * d->head_dim;
    for (int l = 0; l < d->n_layers; l++) {
        s->cap[l] = d->sliding[l] && d->sliding_window < c->max_context ? d->sliding_window : c->max_context;
        s->bytes += 2 * (size_t)s->cap[l] * (size_t)s->kvw * sizeof(float);
    }
}

void splash_dflash_kv_place(splash_dflash_kv *s, float *mem) {
    s->mem = mem;
    for (int l = 0; l < s->n_layers; l++) {
        s->k[l] = mem, mem += (size_t)s->cap[l] * s->kvw;
        s->v[l] = mem, mem += (size_t)s->cap[l] * s->kvw;
    }
}

int splash_dflash_kv_init(splash_dflash_kv *s, const splash_dflash_ctx *c, splash_error *err) {
    splash_dflash_kv_shape(s, c);
    float *mem = calloc(1, s->bytes); /* zeroed: a snapshot copies slots never written too */
    if (!mem) return splash_fail(err, SPLASH_E_NOMEM, "%s: out of memory for a draft state (%zu bytes)", c->name, s->bytes);
    splash_dflash_kv_place(s, mem);
    return SPLASH_OK;
}

void splash_dflash_kv_release(splash_dflash_kv *s) { free(s->mem); }

int splash_dflash_kv_seek(const splash_dflash_ctx *c, splash_dflash_kv *s, int pos, splash_error *err) {
    if (pos < s->n_ctx || (!c->window && pos > c->max_context))
        return splash_fail(err, SPLASH_E_INVALID, "%s seek: position %d before %d or past max_context %d", c->name, pos,
                           s->n_ctx, c->max_context);
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

size_t splash_dflash_kv_snapshot_bytes(const splash_dflash_kv *s) { return sizeof(snap_header) + s->bytes; }

_Static_assert(sizeof(snap_header) == SPLASH_DFLASH_SNAP_HEADER, "the snapshot header's size");

void splash_dflash_kv_save_header(const splash_dflash_kv *s, void *dst) {
    snap_header h = {s->snap_magic, (uint32_t)s->n_layers, s->n_ctx, s->lo, s->bytes, {0}};
    memcpy(dst, &h, sizeof h);
}

int splash_dflash_kv_load_header(splash_dflash_kv *s, const void *src, splash_error *err) {
    snap_header h;
    memcpy(&h, src, sizeof h);
    if (h.magic != s->snap_magic || h.n_layers != (uint32_t)s->n_layers || h.bytes != s->bytes || h.n_ctx < h.lo ||
        h.lo < 0)
        return splash_fail(err, SPLASH_E_INVALID, "%s: the snapshot is not one of this draft's states", s->name);
    s->n_ctx = h.n_ctx;
    s->lo = h.lo;
    return SPLASH_OK;
}

void splash_dflash_kv_save(const splash_dflash_kv *s, void *dst) {
    splash_dflash_kv_save_header(s, dst);
    memcpy((char *)dst + sizeof(snap_header), s->mem, s->bytes);
}

int splash_dflash_kv_load(splash_dflash_kv *s, const void *src, splash_error *err) {
    splash_dflash_kv tmp = *s; /* the rings change only with a header that fits */
    int rc = splash_dflash_kv_load_header(&tmp, src, err);
    if (rc) return rc;
    memcpy(s->mem, (const char *)src + sizeof(snap_header), s->bytes);
    s->n_ctx = tmp.n_ctx;
    s->lo = tmp.lo;
    return SPLASH_OK;
}

/* ---- per-row tasks -------------------------------------------------------------- */

typedef struct row_job {
    splash_dflash_ctx *c;
    const float *src;  /* [rows][H] */
    float *dst;        /* [rows][H] */
    const float *nf;   /* norm factor */
    const splash_dflash_layer *L;
    int pos0;          /* position of row 0 */
    int q;             /* rows carry queries too */
} row_job;

static void norm_task(void *ctx, size_t r, int worker) {
    (void)worker;
    const row_job *j = ctx;
    int H = j->c->d.hidden;
    cpu_rmsnorm(j->src + r * H, j->nf, H, j->c->d.rms_eps, j->dst + r * H);
}

/* q_norm / k_norm and rotary of row r (k in c->k, q in c->q when j->q) */
static void qk_task(void *ctx, size_t r, int worker) {
    (void)worker;
    const row_job *j = ctx;
    splash_dflash_ctx *c = j->c;
    const splash_dflash_dims *d = &c->d;
    int hd = d->head_dim;
    float *k = c->k + r * (size_t)d->kv_heads * hd;
    for (int h = 0; h < d->kv_heads; h++) cpu_rmsnorm(k + (size_t)h * hd, j->L->k_norm, hd, d->rms_eps, k + (size_t)h * hd);
    cpu_rope(k, d->kv_heads, hd, hd, d->rope_theta, j->pos0 + (int32_t)r);
    if (!j->q) return;
    float *q = c->q + r * (size_t)d->heads * hd;
    for (int h = 0; h < d->heads; h++) cpu_rmsnorm(q + (size_t)h * hd, j->L->q_norm, hd, d->rms_eps, q + (size_t)h * hd);
    cpu_rope(q, d->heads, hd, hd, d->rope_theta, j->pos0 + (int32_t)r);
}

void splash_dflash_ctx_norm(splash_dflash_ctx *c, const float *src, float *dst, const float *nf, int rows) {
    row_job j = {c, src, dst, nf, NULL, 0, 0};
    cpu_parallel(&c->cpu, (size_t)rows, norm_task, &j);
}

/* ---- append ------------------------------------------------------------------- */

int splash_dflash_ctx_append_check(const splash_dflash_ctx *c, const splash_dflash_kv *s, const float *taps, int n,
                                   splash_error *err) {
    if (n < 0 || (n && !taps)) return splash_fail(err, SPLASH_E_INVALID, "%s append: bad rows", c->name);
    if (s->n_layers != c->d.n_layers)
        return splash_fail(err, SPLASH_E_INVALID, "%s append: state of another draft", c->name);
    if (!c->window && (int64_t)s->n_ctx + n > c->max_context)
        return splash_fail(err, SPLASH_E_INVALID, "%s append: %d + %d positions exceed max_context %d", c->name,
                           s->n_ctx, n, c->max_context);
    return SPLASH_OK;
}

int splash_dflash_ctx_append(splash_dflash_ctx *c, splash_dflash_kv *s, const float *taps, int n, splash_error *err) {
    const splash_dflash_dims *d = &c->d;
    int rc = splash_dflash_ctx_append_check(c, s, taps, n, err);
    if (rc) return rc;
    size_t H = (size_t)d->hidden, in = (size_t)d->n_taps * H, kvw = (size_t)s->kvw;
    for (int r0 = 0; r0 < n; r0 += SPLASH_DFLASH_APPEND_CHUNK) {
        int rows = n - r0 < SPLASH_DFLASH_APPEND_CHUNK ? n - r0 : SPLASH_DFLASH_APPEND_CHUNK;
        int pos0 = s->n_ctx + r0;
        /* ctx = hidden_norm(fc(taps)) into xn */
        cpu_matmul(&c->cpu, c->fc, rows, taps + (size_t)r0 * in, in, c->x, H);
        splash_dflash_ctx_norm(c, c->x, c->xn, c->hidden_norm, rows);
        for (int l = 0; l < d->n_layers; l++) {
            const splash_dflash_layer *L = &c->layers[l];
            /* a sliding layer computes only the positions its ring keeps */
            int keep_from = s->n_ctx + n - s->cap[l], skip = keep_from > pos0 ? keep_from - pos0 : 0;
            if (skip >= rows) continue;
            const float *src = c->xn + (size_t)skip * H;
            int nr = rows - skip;
            cpu_mm_part parts[2] = {{L->k_proj, c->k, kvw, 0}, {L->v_proj, c->v, kvw, 0}};
            cpu_matmul_parts(&c->cpu, parts, 2, nr, src, H);
            row_job qj = {c, NULL, NULL, NULL, L, pos0 + skip, 0};
            cpu_parallel(&c->cpu, (size_t)nr, qk_task, &qj);
            for (int r = 0; r < nr; r++) {
                int slot = (pos0 + skip + r) % s->cap[l];
                memcpy(s->k[l] + (size_t)slot * kvw, c->k + (size_t)r * kvw, kvw * sizeof(float));
                memcpy(s->v[l] + (size_t)slot * kvw, c->v + (size_t)r * kvw, kvw * sizeof(float));
            }
        }
    }
    s->n_ctx += n;
    return SPLASH_OK;
}

/* ---- a block ------------------------------------------------------------------- */

int splash_dflash_ctx_check(const splash_dflash_ctx *c, const splash_dflash_kv *s, int32_t anchor, int block,
                            const float *hidden, splash_error *err) {
    if (block < 2 || block > c->max_block)
        return splash_fail(err, SPLASH_E_INVALID, "%s draft: block %d outside [2, %d]", c->name, block, c->max_block);
    if (anchor < 0 || anchor >= c->d.vocab)
        return splash_fail(err, SPLASH_E_INVALID, "%s draft: anchor token %d outside the vocabulary", c->name,
                           (int)anchor);
    if (s->n_layers != c->d.n_layers)
        return splash_fail(err, SPLASH_E_INVALID, "%s draft: state of another draft", c->name);
    if (!hidden) return splash_fail(err, SPLASH_E_INVALID, "%s draft: no output buffer", c->name);
    return SPLASH_OK;
}

void splash_dflash_ctx_embed(splash_dflash_ctx *c, int32_t anchor, int block, float scale) {
    size_t H = (size_t)c->d.hidden;
    for (int r = 0; r < block; r++) {
        float *x = c->x + (size_t)r * H;
        cpu_dequant_row(c->embed, r ? c->d.mask_token_id : anchor, x);
        if (scale != 1.0f)
            for (size_t i = 0; i < H; i++) x[i] *= scale;
    }
}

typedef struct attn_job {
    splash_dflash_ctx *c;
    const splash_dflash_kv *s;
    int l, block;
    float scale;
} attn_job;

/* task = row * heads + head: softmax over the visible context and block keys
 * (sliding: a query at position t sees keys at positions > t - window;
 * causal: block keys up to its own row, else the whole block). */
static void attn_task(void *ctx, size_t task, int worker) {
    const attn_job *j = ctx;
    splash_dflash_ctx *c = j->c;
    const splash_dflash_dims *d = &c->d;
    const splash_dflash_kv *s = j->s;
    int hd = d->head_dim, heads = d->heads, l = j->l;
    int i = (int)(task / (size_t)heads), h = (int)(task % (size_t)heads);
    int kh = h / (heads / d->kv_heads);
    size_t kvw = (size_t)s->kvw;
    int start = s->n_ctx, qp = start + i, W = d->sliding_window;
    int sliding = d->sliding[l], causal = d->causal[l];
    const float *q = c->q + (size_t)i * heads * hd + (size_t)h * hd;
    float *sc = c->scores + (size_t)worker * c->scores_stride;
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
    for (int b = b0; b < b1; b++) sc[n++] = cpu_dot(q, c->k + (size_t)b * kvw + (size_t)kh * hd, hd) * j->scale;
    cpu_softmax(sc, n);
    float *o = c->o + (size_t)i * heads * hd + (size_t)h * hd;
    memset(o, 0, (size_t)hd * sizeof *o);
    for (int t = 0; t < nc; t++)
        cpu_axpy(sc[t], s->v[l] + (size_t)((c0 + t) % s->cap[l]) * kvw + (size_t)kh * hd, o, hd);
    for (int b = b0; b < b1; b++) cpu_axpy(sc[nc + b - b0], c->v + (size_t)b * kvw + (size_t)kh * hd, o, hd);
}

void splash_dflash_ctx_attend(splash_dflash_ctx *c, const splash_dflash_kv *s, int l, const float *in, int block) {
    const splash_dflash_dims *d = &c->d;
    const splash_dflash_layer *L = &c->layers[l];
    size_t H = (size_t)d->hidden, hd = (size_t)d->head_dim, qw = (size_t)d->heads * hd, kvw = (size_t)s->kvw;
    cpu_mm_part parts[3] = {{L->q_proj, c->q, qw, 0}, {L->k_proj, c->k, kvw, 0}, {L->v_proj, c->v, kvw, 0}};
    cpu_matmul_parts(&c->cpu, parts, 3, block, in, H);
    row_job qj = {c, NULL, NULL, NULL, L, s->n_ctx, 1};
    cpu_parallel(&c->cpu, (size_t)block, qk_task, &qj);
    attn_job aj = {c, s, l, block, (float)pow((double)hd, -0.5)};
    cpu_parallel(&c->cpu, (size_t)block * (size_t)d->heads, attn_task, &aj);
}

void splash_dflash_ctx_finish(splash_dflash_ctx *c, int block, float *hidden, float *logits) {
    size_t H = (size_t)c->d.hidden;
    splash_dflash_ctx_norm(c, c->x, c->xn, c->norm, block);
    memcpy(hidden, c->xn + H, (size_t)(block - 1) * H * sizeof(float));
    if (logits) cpu_matmul(&c->cpu, c->lm_head, block - 1, c->xn + H, H, logits, (size_t)c->d.vocab);
}
