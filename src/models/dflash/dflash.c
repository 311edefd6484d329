/* dflash.c - the DFlash v1 draft forward on the CPU (see dflash.h).
 *
 * Built from the CPU backend's kernels (matmul over the package's weights in
 * any encoding, RMSNorm with the stored factor, NEOX rotary, SwiGLU); the one
 * piece of its own is the attention, because the draft's keys are a
 * contiguous per-lane cache plus the block's own rows with a per-layer mask
 * (causal or not, windowed or not), which the paged kernel does not express.
 * Its reductions are in a fixed order (cpu_dot, cpu_softmax, cpu_axpy in key
 * order), so a row's result does not depend on the thread count.
 */
#include "models/dflash/dflash.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "base/json.h"
#include "base/mem.h"

#define APPEND_CHUNK 64 /* context rows per append pass (scratch rows) */

typedef struct dlayer {
    float *input_norm, *post_norm;   /* [H] factors (plain Qwen3 RMSNorm weights) */
    float *q_norm, *k_norm;          /* [hd] */
    const splash_tensor *q_proj;     /* [heads*hd, H] */
    const splash_tensor *k_proj, *v_proj; /* [kvh*hd, H] */
    const splash_tensor *o_proj;     /* [H, heads*hd] */
    const splash_tensor *gate, *up;  /* [I, H] */
    const splash_tensor *down;       /* [H, I] */
} dlayer;

struct splash_dflash {
    splash_dflash_dims d;
    int max_context;              /* positions a full layer holds (the window when window > 0) */
    int window;                   /* > 0: full layers are a ring of the last `window` positions */
    int max_block;                /* most rows of one draft block */
    size_t weight_bytes;          /* the draft's own tensors (not the target's embed / lm_head) */
    const splash_tensor *embed;   /* [V, H] target */
    const splash_tensor *lm_head; /* [V, H] target (embed when tied) */
    const splash_tensor *fc;      /* [H, n_taps*H] */
    float *hidden_norm, *norm;    /* [H] */
    dlayer layers[SPLASH_DFLASH_MAX_LAYERS];
    float *vec;                   /* every fp32 vector, one allocation */
    cpu_ctx cpu;
    /* scratch, rows = max(block_size, APPEND_CHUNK) */
    float *x, *xn;                /* [R][H] residual, normed */
    float *q, *k, *v, *o;         /* [R][heads*hd], [R][kvh*hd] x2, [R][heads*hd] */
    float *ff, *ff2;              /* [R][I] */
    float *scores;                /* [n_threads][max_context + block_size] */
    size_t scores_stride;
};

struct splash_dflash_state {
    int n_ctx;
    int lo;                             /* first position held: earlier ones were skipped (seek) */
    int n_layers, kvw;
    int cap[SPLASH_DFLASH_MAX_LAYERS];  /* positions held; sliding: a ring, slot = pos % cap */
    float *k[SPLASH_DFLASH_MAX_LAYERS]; /* [cap][kvh*hd] roped, normed keys */
    float *v[SPLASH_DFLASH_MAX_LAYERS]; /* [cap][kvh*hd] */
    float *mem;
    size_t bytes;
};

/* ---- load -------------------------------------------------------------------- */

static int dim_int(const json_value *o, const char *key, int lo, int hi, int *out, splash_error *err) {
    int64_t v;
    const json_value *x = json_get(o, key);
    if (!x || json_int64(x, &v) || v < lo || v > hi)
        return splash_fail(err, SPLASH_E_FORMAT, "manifest draft.%s: expected an integer in [%d, %d]", key, lo, hi);
    *out = (int)v;
    return SPLASH_OK;
}

static int parse_dims(const splash_package *pkg, splash_dflash_dims *d, splash_error *err) {
    const json_value *man = splash_package_manifest(pkg);
    const json_value *o = json_get(man, "draft");
    if (!o || o->type != JSON_OBJECT)
        return splash_fail(err, SPLASH_E_NOTFOUND, "%s: the package has no draft (pack with --draft)", splash_package_dir(pkg));
    const char *arch = json_get_string(o, "architecture", "");
    if (strcmp(arch, "dflash"))
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "manifest draft.architecture \"%s\" is not \"dflash\"", arch);
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
        (rc = dim_int(model, "vocab", 1, 1 << 30, &d->vocab, err)))
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

static int bind_matrix(const splash_package *pkg, const char *name, int64_t rows, int64_t cols,
                       const splash_tensor **out, splash_error *err) {
    int64_t shape[2] = {rows, cols};
    return splash_package_get(pkg, name, 2, shape, out, err);
}

/* A vector tensor copied to fp32 at dst. */
static int bind_vector(const splash_package *pkg, const char *name, int64_t n, float *dst, splash_error *err) {
    const splash_tensor *t;
    int rc = splash_package_get(pkg, name, 1, &n, &t, err);
    if (rc) return rc;
    splash_tensor v = *t;
    v.ndim = 2;
    v.shape[0] = 1;
    v.shape[1] = n;
    splash_tensor_row_f32(&v, 0, dst);
    return SPLASH_OK;
}

int splash_dflash_load(const splash_package *pkg, const splash_dflash_options *opt, splash_dflash **out,
                       splash_error *err) {
    *out = NULL;
    splash_dflash_dims dims;
    int rc = parse_dims(pkg, &dims, err);
    if (rc) return rc;
    if (!opt || (opt->max_context < 1 && opt->window < 1))
        return splash_fail(err, SPLASH_E_INVALID, "dflash: max_context or window must be positive");
    if (opt->max_block < 0 || opt->max_block > SPLASH_DFLASH_MAX_BLOCK)
        return splash_fail(err, SPLASH_E_INVALID, "dflash: max_block %d outside [0, %d]", opt->max_block,
                           SPLASH_DFLASH_MAX_BLOCK);
    splash_dflash *m = xcalloc(1, sizeof *m);
    m->d = dims;
    m->window = opt->window > 0 ? opt->window : 0;
    m->max_context = m->window ? m->window : opt->max_context;
    m->max_block = opt->max_block > dims.block_size ? opt->max_block : dims.block_size;
    const splash_dflash_dims *d = &m->d;
    int64_t H = d->hidden, hd = d->head_dim, qw = (int64_t)d->heads * hd, kvw = (int64_t)d->kv_heads * hd,
            I = d->intermediate;
    size_t nvec = (size_t)(2 * H) + (size_t)d->n_layers * (size_t)(2 * H + 2 * hd);
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
        (rc = bind_vector(pkg, "draft.hidden_norm", H, m->hidden_norm, err)) ||
        (rc = bind_vector(pkg, "draft.norm", H, m->norm, err)))
        goto fail;
    for (int l = 0; l < d->n_layers; l++) {
        dlayer *L = &m->layers[l];
        L->input_norm = vp, vp += H;
        L->post_norm = vp, vp += H;
        L->q_norm = vp, vp += hd;
        L->k_norm = vp, vp += hd;
#define NAME(s) (snprintf(n, sizeof n, "draft.layers.%d." s, l), n)
        if ((rc = bind_vector(pkg, NAME("input_norm"), H, L->input_norm, err)) ||
            (rc = bind_vector(pkg, NAME("post_norm"), H, L->post_norm, err)) ||
            (rc = bind_vector(pkg, NAME("attn.q_norm"), hd, L->q_norm, err)) ||
            (rc = bind_vector(pkg, NAME("attn.k_norm"), hd, L->k_norm, err)) ||
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
    for (size_t i = 0; i < splash_package_tensor_count(pkg); i++) {
        const splash_tensor *t = splash_package_tensor_at(pkg, i);
        if (!strncmp(t->name, "draft.", 6)) m->weight_bytes += t->bytes;
    }
    int R = m->max_block > APPEND_CHUNK ? m->max_block : APPEND_CHUNK;
    int64_t cols = (int64_t)d->n_taps * H;
    if (I > cols) cols = I;
    if (qw > cols) cols = qw;
    if (cpu_ctx_init(&m->cpu, opt->threads, R, (int)cols)) {
        rc = splash_fail(err, SPLASH_E_NOMEM, "dflash: out of memory for the CPU scratch");
        goto fail;
    }
    if (opt->act && cpu_set_act(&m->cpu, opt->act)) {
        rc = splash_fail(err, SPLASH_E_NOMEM, "dflash: out of memory for the activation scratch");
        goto fail;
    }
    m->x = xcalloc((size_t)R * H, sizeof(float));
    m->xn = xcalloc((size_t)R * H, sizeof(float));
    m->q = xcalloc((size_t)R * qw, sizeof(float));
    m->o = xcalloc((size_t)R * qw, sizeof(float));
    m->k = xcalloc((size_t)R * kvw, sizeof(float));
    m->v = xcalloc((size_t)R * kvw, sizeof(float));
    m->ff = xcalloc((size_t)R * I, sizeof(float));
    m->ff2 = xcalloc((size_t)R * I, sizeof(float));
    m->scores_stride = (size_t)m->max_context + (size_t)m->max_block;
    m->scores = xcalloc((size_t)m->cpu.n_threads * m->scores_stride, sizeof(float));
    *out = m;
    return SPLASH_OK;
fail:
    splash_dflash_free(m);
    return rc;
}

void splash_dflash_free(splash_dflash *m) {
    if (!m) return;
    if (m->cpu.pool) cpu_ctx_free(&m->cpu);
    free(m->vec);
    free(m->x);
    free(m->xn);
    free(m->q);
    free(m->o);
    free(m->k);
    free(m->v);
    free(m->ff);
    free(m->ff2);
    free(m->scores);
    free(m);
}

const splash_dflash_dims *splash_dflash_get_dims(const splash_dflash *d) { return &d->d; }

/* ---- state ------------------------------------------------------------------- */

int splash_dflash_state_new(const splash_dflash *m, splash_dflash_state **out, splash_error *err) {
    const splash_dflash_dims *d = &m->d;
    splash_dflash_state *s = calloc(1, sizeof *s);
    if (!s) return splash_fail(err, SPLASH_E_NOMEM, "dflash: out of memory for a draft state");
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
        return splash_fail(err, SPLASH_E_NOMEM, "dflash: out of memory for a draft state (%zu bytes)", total * 4);
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

void splash_dflash_state_free(splash_dflash_state *s) {
    if (!s) return;
    free(s->mem);
    free(s);
}

void splash_dflash_state_reset(splash_dflash_state *s) { s->n_ctx = s->lo = 0; }
int splash_dflash_state_positions(const splash_dflash_state *s) { return s->n_ctx; }
size_t splash_dflash_state_bytes(const splash_dflash_state *s) { return s->bytes; }
size_t splash_dflash_weight_bytes(const splash_dflash *d) { return d->weight_bytes; }

int splash_dflash_state_seek(const splash_dflash *m, splash_dflash_state *s, int pos, splash_error *err) {
    if (pos < s->n_ctx || (!m->window && pos > m->max_context))
        return splash_fail(err, SPLASH_E_INVALID, "dflash seek: position %d before %d or past max_context %d", pos,
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
#define SNAP_MAGIC 0x44464c53u /* "SLFD" */

size_t splash_dflash_state_snapshot_bytes(const splash_dflash_state *s) { return sizeof(snap_header) + s->bytes; }

void splash_dflash_state_save(const splash_dflash_state *s, void *dst) {
    snap_header h = {SNAP_MAGIC, (uint32_t)s->n_layers, s->n_ctx, s->lo, s->bytes, {0}};
    memcpy(dst, &h, sizeof h);
    memcpy((char *)dst + sizeof h, s->mem, s->bytes);
}

int splash_dflash_state_load(splash_dflash_state *s, const void *src, splash_error *err) {
    snap_header h;
    memcpy(&h, src, sizeof h);
    if (h.magic != SNAP_MAGIC || h.n_layers != (uint32_t)s->n_layers || h.bytes != s->bytes || h.n_ctx < h.lo ||
        h.lo < 0)
        return splash_fail(err, SPLASH_E_INVALID, "dflash: the snapshot is not one of this draft's states");
    memcpy(s->mem, (const char *)src + sizeof h, s->bytes);
    s->n_ctx = h.n_ctx;
    s->lo = h.lo;
    return SPLASH_OK;
}

/* ---- per-row helpers ------------------------------------------------------------ */

typedef struct row_job {
    splash_dflash *m;
    const float *nf;   /* norm factor */
    const dlayer *L;
    int pos0;          /* position of row 0 */
    int q;             /* rows carry queries too */
} row_job;

static void norm_task(void *ctx, size_t r, int worker) {
    (void)worker;
    const row_job *j = ctx;
    int H = j->m->d.hidden;
    cpu_rmsnorm(j->m->x + r * H, j->nf, H, j->m->d.rms_eps, j->m->xn + r * H);
}

/* q_norm / k_norm and rotary of row r (k in m->k, q in m->q when j->q) */
static void qk_task(void *ctx, size_t r, int worker) {
    (void)worker;
    const row_job *j = ctx;
    splash_dflash *m = j->m;
    const splash_dflash_dims *d = &m->d;
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

int splash_dflash_append(splash_dflash *m, splash_dflash_state *s, const float *taps, int n, splash_error *err) {
    const splash_dflash_dims *d = &m->d;
    if (n < 0 || (n && !taps)) return splash_fail(err, SPLASH_E_INVALID, "dflash append: bad rows");
    if (s->n_layers != d->n_layers) return splash_fail(err, SPLASH_E_INVALID, "dflash append: state of another draft");
    if (!m->window && (int64_t)s->n_ctx + n > m->max_context)
        return splash_fail(err, SPLASH_E_INVALID, "dflash append: %d + %d positions exceed max_context %d", s->n_ctx, n,
                           m->max_context);
    size_t H = (size_t)d->hidden, in = (size_t)d->n_taps * H, kvw = (size_t)s->kvw;
    for (int r0 = 0; r0 < n; r0 += APPEND_CHUNK) {
        int rows = n - r0 < APPEND_CHUNK ? n - r0 : APPEND_CHUNK;
        int pos0 = s->n_ctx + r0;
        /* ctx = hidden_norm(fc(taps)) into xn */
        cpu_matmul(&m->cpu, m->fc, rows, taps + (size_t)r0 * in, in, m->x, H);
        row_job nj = {m, m->hidden_norm, NULL, 0, 0};
        cpu_parallel(&m->cpu, (size_t)rows, norm_task, &nj);
        for (int l = 0; l < d->n_layers; l++) {
            const dlayer *L = &m->layers[l];
            /* a sliding layer computes only the positions its ring keeps */
            int keep_from = s->n_ctx + n - s->cap[l], skip = keep_from > pos0 ? keep_from - pos0 : 0;
            if (skip >= rows) continue;
            const float *src = m->xn + (size_t)skip * H;
            int nr = rows - skip;
            cpu_mm_part parts[2] = {{L->k_proj, m->k, kvw, 0}, {L->v_proj, m->v, kvw, 0}};
            cpu_matmul_parts(&m->cpu, parts, 2, nr, src, H);
            row_job qj = {m, NULL, L, pos0 + skip, 0};
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
    splash_dflash *m;
    const splash_dflash_state *s;
    int l, block;
    float scale;
} attn_job;

/* task = row * heads + head: softmax over the visible context and block keys */
static void attn_task(void *ctx, size_t task, int worker) {
    const attn_job *j = ctx;
    splash_dflash *m = j->m;
    const splash_dflash_dims *d = &m->d;
    const splash_dflash_state *s = j->s;
    int hd = d->head_dim, heads = d->heads, l = j->l;
    int i = (int)(task / (size_t)heads), h = (int)(task % (size_t)heads);
    int kh = h / (heads / d->kv_heads);
    size_t kvw = (size_t)s->kvw;
    int start = s->n_ctx, qp = start + i, W = d->sliding_window;
    int sliding = d->sliding[l], causal = d->causal[l];
    const float *q = m->q + (size_t)i * heads * hd + (size_t)h * hd;
    float *sc = m->scores + (size_t)worker * m->scores_stride;
    int c0 = s->lo; /* earlier positions were skipped (seek) */
    if (sliding && qp - W + 1 > c0) c0 = qp - W + 1;
    if (start - s->cap[l] > c0) c0 = start - s->cap[l]; /* a full layer's ring holds the last window positions */
    int nc = start > c0 ? start - c0 : 0;
    int n = 0;
    for (int p = c0; p < start; p++) {
        int slot = p % s->cap[l];
        sc[n++] = cpu_dot(q, s->k[l] + (size_t)slot * kvw + (size_t)kh * hd, hd) * j->scale;
    }
    int b0 = 0, b1 = j->block; /* visible block rows [b0, b1) */
    if (causal) b1 = i + 1;
    if (sliding) {
        if (i - W + 1 > b0) b0 = i - W + 1;
        if (!causal && i + W < b1) b1 = i + W;
    }
    for (int b = b0; b < b1; b++) sc[n++] = cpu_dot(q, m->k + (size_t)b * kvw + (size_t)kh * hd, hd) * j->scale;
    cpu_softmax(sc, n);
    float *o = m->o + (size_t)i * heads * hd + (size_t)h * hd;
    memset(o, 0, (size_t)hd * sizeof *o);
    for (int t = 0; t < nc; t++) {
        int slot = (c0 + t) % s->cap[l];
        cpu_axpy(sc[t], s->v[l] + (size_t)slot * kvw + (size_t)kh * hd, o, hd);
    }
    for (int b = b0; b < b1; b++) cpu_axpy(sc[nc + b - b0], m->v + (size_t)b * kvw + (size_t)kh * hd, o, hd);
}

int splash_dflash_draft(splash_dflash *m, const splash_dflash_state *s, int32_t anchor, int block, float *hidden,
                        float *logits, splash_error *err) {
    const splash_dflash_dims *d = &m->d;
    if (block < 2 || block > m->max_block)
        return splash_fail(err, SPLASH_E_INVALID, "dflash draft: block %d outside [2, %d]", block, m->max_block);
    if (anchor < 0 || anchor >= d->vocab)
        return splash_fail(err, SPLASH_E_INVALID, "dflash draft: anchor token %d outside the vocabulary", (int)anchor);
    if (s->n_layers != d->n_layers) return splash_fail(err, SPLASH_E_INVALID, "dflash draft: state of another draft");
    if (!hidden) return splash_fail(err, SPLASH_E_INVALID, "dflash draft: no output buffer");
    size_t H = (size_t)d->hidden, hd = (size_t)d->head_dim, qw = (size_t)d->heads * hd, kvw = (size_t)s->kvw,
           I = (size_t)d->intermediate;
    for (int r = 0; r < block; r++) cpu_dequant_row(m->embed, r ? d->mask_token_id : anchor, m->x + (size_t)r * H);
    for (int l = 0; l < d->n_layers; l++) {
        const dlayer *L = &m->layers[l];
        row_job nj = {m, L->input_norm, L, s->n_ctx, 1};
        cpu_parallel(&m->cpu, (size_t)block, norm_task, &nj);
        cpu_mm_part in[3] = {{L->q_proj, m->q, qw, 0}, {L->k_proj, m->k, kvw, 0}, {L->v_proj, m->v, kvw, 0}};
        cpu_matmul_parts(&m->cpu, in, 3, block, m->xn, H);
        cpu_parallel(&m->cpu, (size_t)block, qk_task, &nj);
        attn_job aj = {m, s, l, block, (float)pow((double)hd, -0.5)};
        cpu_parallel(&m->cpu, (size_t)block * (size_t)d->heads, attn_task, &aj);
        cpu_matmul_add(&m->cpu, L->o_proj, block, m->o, qw, m->x, H);
        row_job pj = {m, L->post_norm, L, 0, 0};
        cpu_parallel(&m->cpu, (size_t)block, norm_task, &pj);
        cpu_matmul_swiglu(&m->cpu, L->gate, L->up, block, m->xn, H, m->ff, I, m->ff2, I);
        cpu_matmul_add(&m->cpu, L->down, block, m->ff, I, m->x, H);
    }
    row_job fj = {m, m->norm, NULL, 0, 0};
    cpu_parallel(&m->cpu, (size_t)block, norm_task, &fj);
    memcpy(hidden, m->xn + H, (size_t)(block - 1) * H * sizeof(float));
    if (logits) cpu_matmul(&m->cpu, m->lm_head, block - 1, m->xn + H, H, logits, (size_t)d->vocab);
    return SPLASH_OK;
}
