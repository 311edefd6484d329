/* weights.c - binds a package's tensors to the Qwen3.5 layer layout.
 *
 * Every tensor is looked up by its canonical name (docs/package-format.md)
 * with the shape the dimensions imply; the package's lookup names the first
 * missing or misshapen tensor.  Matrices stay where they are (mapped, in
 * their stored encoding); the few small vectors (norm factors, conv taps,
 * A_log, dt_bias) are copied to fp32 once, transformed to what the kernels
 * use (conv transposed to [K][C], -exp(A_log)).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "models/qwen35/qwen35.h"

typedef struct binder {
    const splash_package *pkg;
    qwen35_weights *w;
    splash_error *err;
} binder;

static int matrix(binder *b, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2,
                  const splash_tensor **out) {
    int64_t shape[3] = {d0, d1, d2};
    int rc = splash_package_get(b->pkg, name, ndim, shape, out, b->err);
    if (rc) return rc;
    const splash_tensor *t = *out;
    int64_t cols = shape[ndim - 1];
    if (t->dtype >= SPLASH_DTYPE_COUNT)
        return splash_fail(b->err, SPLASH_E_FORMAT, "tensor %s: unknown dtype", name);
    if ((t->dtype == SPLASH_Q4 || t->dtype == SPLASH_Q8) && cols % SPLASH_QGROUP)
        return splash_fail(b->err, SPLASH_E_FORMAT, "tensor %s: %s with input dimension %lld, not a multiple of %d", name,
                           splash_dtype_name(t->dtype), (long long)cols, SPLASH_QGROUP);
    size_t want = splash_tensor_bytes(t->dtype, ndim, shape);
    if (t->bytes < want)
        return splash_fail(b->err, SPLASH_E_FORMAT, "tensor %s: %zu bytes, but %s of this shape needs %zu", name,
                           t->bytes, splash_dtype_name(t->dtype), want);
    b->w->bytes += t->bytes;
    if (cols > b->w->max_cols) b->w->max_cols = (int)cols;
    return 0;
}

/* A 1-D or 2-D plain tensor copied to fp32 (n values). */
static int vector(binder *b, const char *name, int ndim, int64_t d0, int64_t d1, float *out) {
    const splash_tensor *t;
    int64_t shape[2] = {d0, d1};
    int rc = splash_package_get(b->pkg, name, ndim, shape, &t, b->err);
    if (rc) return rc;
    if (t->dtype != SPLASH_F32 && t->dtype != SPLASH_BF16 && t->dtype != SPLASH_F16)
        return splash_fail(b->err, SPLASH_E_FORMAT, "tensor %s: stored as %s, expected f32, bf16 or f16", name,
                           splash_dtype_name(t->dtype));
    int64_t rows = ndim == 2 ? d0 : 1, cols = ndim == 2 ? d1 : d0;
    if (t->bytes < (size_t)(rows * cols) * (t->dtype == SPLASH_F32 ? 4 : 2))
        return splash_fail(b->err, SPLASH_E_FORMAT, "tensor %s: truncated", name);
    for (int64_t r = 0; r < rows; r++) splash_tensor_row_f32(t, r, out + r * cols);
    b->w->bytes += t->bytes;
    return 0;
}

#define TRY(x)                                                                                                         \
    do {                                                                                                               \
        int rc_ = (x);                                                                                                 \
        if (rc_) return rc_;                                                                                           \
    } while (0)

static int bind_layer(binder *b, const qwen35_dims *d, int i, qwen35_layer *L) {
    char n[128];
    int64_t H = d->hidden;
#define NAME(s) (snprintf(n, sizeof n, "layers.%d.%s", i, s), n)
    size_t nvec = 2 * (size_t)H;
    if (L->is_attn)
        nvec += 2 * (size_t)d->head_dim;
    else
        nvec += (size_t)d->conv_kernel * d->conv_dim + (size_t)d->conv_dim * d->conv_kernel + 2 * (size_t)d->hv +
                (size_t)d->dv;
    L->vec = malloc(nvec * sizeof(float));
    if (!L->vec) return splash_fail(b->err, SPLASH_E_NOMEM, "out of memory binding layer %d", i);
    float *v = L->vec;
    L->input_norm = v, v += H;
    L->post_norm = v, v += H;
    TRY(vector(b, NAME("input_norm"), 1, H, 0, L->input_norm));
    TRY(vector(b, NAME("post_norm"), 1, H, 0, L->post_norm));
    if (L->is_attn) {
        int64_t hd = d->head_dim;
        TRY(matrix(b, NAME("attn.q_proj"), 2, (int64_t)d->heads * 2 * hd, H, 0, &L->q_proj));
        TRY(matrix(b, NAME("attn.k_proj"), 2, (int64_t)d->kv_heads * hd, H, 0, &L->k_proj));
        TRY(matrix(b, NAME("attn.v_proj"), 2, (int64_t)d->kv_heads * hd, H, 0, &L->v_proj));
        TRY(matrix(b, NAME("attn.o_proj"), 2, H, (int64_t)d->heads * hd, 0, &L->o_proj));
        L->q_norm = v, v += hd;
        L->k_norm = v, v += hd;
        TRY(vector(b, NAME("attn.q_norm"), 1, hd, 0, L->q_norm));
        TRY(vector(b, NAME("attn.k_norm"), 1, hd, 0, L->k_norm));
    } else {
        int C = d->conv_dim, K = d->conv_kernel;
        TRY(matrix(b, NAME("gdn.in_proj_qkv"), 2, C, H, 0, &L->in_qkv));
        TRY(matrix(b, NAME("gdn.in_proj_z"), 2, d->value_dim, H, 0, &L->in_z));
        TRY(matrix(b, NAME("gdn.in_proj_b"), 2, d->hv, H, 0, &L->in_b));
        TRY(matrix(b, NAME("gdn.in_proj_a"), 2, d->hv, H, 0, &L->in_a));
        TRY(matrix(b, NAME("gdn.out_proj"), 2, H, d->value_dim, 0, &L->out_proj));
        float *conv = v; /* [C][K] as stored, then transposed after it */
        v += (size_t)C * K;
        L->conv_t = v, v += (size_t)K * C;
        TRY(vector(b, NAME("gdn.conv"), 2, C, K, conv));
        for (int c = 0; c < C; c++)
            for (int k = 0; k < K; k++) L->conv_t[(size_t)k * C + c] = conv[(size_t)c * K + k];
        L->neg_a = v, v += d->hv;
        L->dt_bias = v, v += d->hv;
        L->gnorm = v, v += d->dv;
        TRY(vector(b, NAME("gdn.A_log"), 1, d->hv, 0, L->neg_a));
        for (int j = 0; j < d->hv; j++) L->neg_a[j] = -expf(L->neg_a[j]);
        TRY(vector(b, NAME("gdn.dt_bias"), 1, d->hv, 0, L->dt_bias));
        TRY(vector(b, NAME("gdn.norm"), 1, d->dv, 0, L->gnorm));
    }
    if (d->moe) {
        int64_t E = d->experts, Ie = d->expert_inter, Is = d->shared_inter;
        TRY(matrix(b, NAME("moe.router"), 2, E, H, 0, &L->router));
        TRY(matrix(b, NAME("moe.experts_gate"), 3, E, Ie, H, &L->experts_gate));
        TRY(matrix(b, NAME("moe.experts_up"), 3, E, Ie, H, &L->experts_up));
        TRY(matrix(b, NAME("moe.experts_down"), 3, E, H, Ie, &L->experts_down));
        TRY(matrix(b, NAME("moe.shared_gate"), 2, Is, H, 0, &L->shared_gate));
        TRY(matrix(b, NAME("moe.shared_up"), 2, Is, H, 0, &L->shared_up));
        TRY(matrix(b, NAME("moe.shared_down"), 2, H, Is, 0, &L->shared_down));
        TRY(matrix(b, NAME("moe.shared_expert_gate"), 2, 1, H, 0, &L->shared_expert_gate));
    } else {
        int64_t I = d->intermediate;
        TRY(matrix(b, NAME("ffn.gate"), 2, I, H, 0, &L->gate));
        TRY(matrix(b, NAME("ffn.up"), 2, I, H, 0, &L->up));
        TRY(matrix(b, NAME("ffn.down"), 2, H, I, 0, &L->down));
    }
#undef NAME
    return 0;
}

int qwen35_weights_bind(const splash_package *pkg, const qwen35_dims *d, qwen35_weights *w, splash_error *err) {
    memset(w, 0, sizeof *w);
    binder b = {pkg, w, err};
    int rc;
    w->layers = calloc((size_t)d->n_layers, sizeof *w->layers);
    w->final_norm = malloc((size_t)d->hidden * sizeof(float));
    if (!w->layers || !w->final_norm) {
        rc = splash_fail(err, SPLASH_E_NOMEM, "out of memory binding weights");
        goto fail;
    }
    if ((rc = matrix(&b, "embed", 2, d->vocab, d->hidden, 0, &w->embed))) goto fail;
    if ((rc = vector(&b, "final_norm", 1, d->hidden, 0, w->final_norm))) goto fail;
    if (d->tie_embeddings)
        w->lm_head = w->embed;
    else if ((rc = matrix(&b, "lm_head", 2, d->vocab, d->hidden, 0, &w->lm_head)))
        goto fail;
    for (int i = 0, na = 0, ng = 0; i < d->n_layers; i++) {
        qwen35_layer *L = &w->layers[i];
        L->is_attn = d->is_attn[i];
        L->index = L->is_attn ? na++ : ng++;
        if ((rc = bind_layer(&b, d, i, L))) goto fail;
    }
    return 0;
fail:
    qwen35_weights_free(w, d);
    return rc;
}

void qwen35_weights_free(qwen35_weights *w, const qwen35_dims *d) {
    if (w->layers)
        for (int i = 0; i < d->n_layers; i++) free(w->layers[i].vec);
    free(w->layers);
    free(w->final_norm);
    memset(w, 0, sizeof *w);
}
