/* cuda_weights.cu - a Qwen3.5 package's weights into one device allocation.
 *
 * The tensors are found and shape-checked by the CPU's binder
 * (qwen35_weights_bind, weights.c), so both backends accept exactly the same
 * packages and name the same first bad tensor; its fp32 vectors (norm
 * factors, conv transposed to [K][C], -exp(A_log), dt_bias, the gated-norm
 * weight) are uploaded as they are, so the arithmetic starts from the same
 * numbers.  Then two passes over the same walk: the first adds up sizes
 * (every part 256-byte aligned), the second copies into the one cudaMalloc:
 *
 *   q4 matrices       repacked on the host into the q4 kernel's tiles
 *                     (splash_q4_repack_host: the same byte count, plus zero
 *                     rows up to a multiple of 16), stacked experts one
 *                     matrix after another; the matrices that read one input
 *                     (q|k|v, the GDN's qkv|z|b|a, gate|up) stacked into one
 *                     matrix when they can be (one launch instead of 2-4,
 *                     and a longer stream for the kernel);
 *   other matrices    bytes as stored (bf16, f16, f32, canonical q8), for
 *                     splash_cuda_dense_matmul;
 *   vectors           fp32.
 *
 * MoE experts must be q4 (the grouped expert product is the q4 kernel's).
 * The host binding is freed once everything is on the device.
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/rope.h"
#include "models/qwen35/cuda_model.h"

namespace {

constexpr size_t kAlign = 256;

size_t align_up(size_t n) { return (n + kAlign - 1) & ~(kAlign - 1); }

/* Reserves n bytes; the device address (NULL while sizing). */
uint8_t *reserve(qc_upload *w, size_t n) {
    uint8_t *p = w->dev ? w->dev + w->off : nullptr;
    w->off += align_up(n);
    return p;
}

int copy_up(qc_upload *w, uint8_t *dst, const void *src, size_t n, const char *name) {
    if (!w->dev) return 0;
    cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice);
    if (e != cudaSuccess)
        return splash_fail(w->err, SPLASH_E_IO, "upload of %s (%zu bytes): %s", name, n, cudaGetErrorString(e));
    return 0;
}

/* A staging buffer of at least n bytes (the copying pass only). */
int stage(qc_upload *w, size_t n) {
    if (!w->dev || w->stage_bytes >= n) return 0;
    uint8_t *p = (uint8_t *)realloc(w->stage, n);
    if (!p) return splash_fail(w->err, SPLASH_E_NOMEM, "out of memory staging %zu bytes of weights", n);
    w->stage = p, w->stage_bytes = n;
    return 0;
}

/* One q4 matrix (rows x cols canonical at src) tiled onto the device;
 * *gemm (when not NULL): whether the prefill GEMM may read it. */
int put_q4(qc_upload *w, const uint8_t *src, int rows, int cols, const char *name, splash_q4_matrix *out, int *gemm) {
    if (cols > SPLASH_Q4_MAX_COLS)
        return splash_fail(w->err, SPLASH_E_UNSUPPORTED, "tensor %s: %d inputs; the CUDA q4 kernels take at most %d",
                           name, cols, SPLASH_Q4_MAX_COLS);
    const size_t tb = splash_q4_tiled_bytes(rows, cols);
    uint8_t *d = reserve(w, tb);
    if (cols > w->max_q4_cols) w->max_q4_cols = cols;
    if (!w->dev) return 0;
    int rc = stage(w, tb);
    if (rc) return rc;
    if (splash_q4_repack_host(src, rows, cols, w->stage, tb))
        return splash_fail(w->err, SPLASH_E_FORMAT, "tensor %s: cannot be tiled for the q4 kernel", name);
    if (gemm) *gemm = splash_q4_tiled_fp16_ok(w->stage, rows, cols);
    if ((rc = copy_up(w, d, w->stage, tb, name))) return rc;
    splash_q4_matrix_init(out, d, rows, cols);
    return 0;
}

} /* namespace */

int qc_upload_matrix(qc_upload *w, const splash_tensor *t, qc_matrix *out) {
    int64_t rows, cols, count;
    splash_tensor_matrix_dims(t, &rows, &cols, &count);
    memset(out, 0, sizeof *out);
    out->rows = (int)rows, out->cols = (int)cols;
    if (t->dtype == SPLASH_Q4) {
        out->is_q4 = 1;
        return put_q4(w, t->data, (int)rows, (int)cols, t->name, &out->q4, &out->gemm);
    }
    uint8_t *d = reserve(w, t->bytes);
    if (!w->dev) return 0;
    int rc = copy_up(w, d, t->data, t->bytes, t->name);
    if (rc) return rc;
    rc = splash_cuda_dense_matrix_init(&out->dense, (int)t->dtype, d, (int)rows, (int)cols);
    if (rc)
        return splash_fail(w->err, SPLASH_E_UNSUPPORTED, "tensor %s: %s is not a format the CUDA backend reads", t->name,
                           splash_dtype_name(t->dtype));
    return 0;
}

namespace {

/* The tensors t[0..n) (n <= 4) stacked into one q4 matrix when they can be
 * (all single q4 matrices with the same columns): 1 in *stacked and out
 * filled; else 0 and nothing reserved (the caller puts them one by one). */
int put_stacked(qc_upload *w, const splash_tensor *const *t, int n, qc_matrix *out, int *stacked) {
    const uint8_t *src[4];
    int rows[4];
    int64_t r, c, count, cols = -1;
    *stacked = 0;
    memset(out, 0, sizeof *out);
    if (n < 1 || n > 4) return 0;
    for (int i = 0; i < n; i++) {
        splash_tensor_matrix_dims(t[i], &r, &c, &count);
        if (t[i]->dtype != SPLASH_Q4 || count != 1 || (cols >= 0 && c != cols) || r > (1 << 24)) return 0;
        cols = c, src[i] = t[i]->data, rows[i] = (int)r;
    }
    if (cols > SPLASH_Q4_MAX_COLS) return 0; /* put_q4 names it */
    const int total = splash_q4_stacked_rows(rows, n);
    if (total < 0) return 0;
    *stacked = 1;
    out->rows = total, out->cols = (int)cols, out->is_q4 = 1;
    for (int i = 0, row = 0; i < n; i++) {
        out->part_row[i] = row;
        row += (rows[i] + 15) / 16 * 16;
    }
    const size_t tb = splash_q4_tiled_bytes(total, (int)cols);
    uint8_t *d = reserve(w, tb);
    if ((int)cols > w->max_q4_cols) w->max_q4_cols = (int)cols;
    if (!w->dev) return 0;
    int rc = stage(w, tb);
    if (rc) return rc;
    if (splash_q4_repack_stacked_host(src, rows, n, (int)cols, w->stage, tb))
        return splash_fail(w->err, SPLASH_E_FORMAT, "tensors from %s on: cannot be stacked for the q4 kernel", t[0]->name);
    out->gemm = splash_q4_tiled_fp16_ok(w->stage, total, (int)cols);
    if ((rc = copy_up(w, d, w->stage, tb, t[0]->name))) return rc;
    splash_q4_matrix_init(&out->q4, d, total, (int)cols);
    return 0;
}

/* Stacked experts [E, rows, cols], q4 only, into out[0..E). */
int put_experts(qc_upload *w, const splash_tensor *t, splash_q4_matrix *out, int *gemm) {
    if (t->dtype != SPLASH_Q4)
        return splash_fail(w->err, SPLASH_E_UNSUPPORTED,
                           "tensor %s: experts stored as %s; the CUDA backend runs q4 experts only (pack with --weights q4)",
                           t->name, splash_dtype_name(t->dtype));
    int64_t rows, cols, count;
    splash_tensor_matrix_dims(t, &rows, &cols, &count);
    for (int64_t e = 0; e < count; e++) {
        splash_tensor s = splash_tensor_slice(t, e);
        int ok = 0;
        int rc = put_q4(w, s.data, (int)rows, (int)cols, t->name, &out[e], &ok);
        if (!ok) *gemm = 0;
        if (rc) return rc;
    }
    return 0;
}

} /* namespace */

int qc_upload_vec(qc_upload *w, const float *src, size_t n, const char *name, const float **out) {
    uint8_t *d = reserve(w, n * sizeof(float));
    *out = (const float *)d;
    return copy_up(w, d, src, n * sizeof(float), name);
}

namespace {

#define TRY(x)                                                                                                         \
    do {                                                                                                               \
        int rc_ = (x);                                                                                                 \
        if (rc_) return rc_;                                                                                           \
    } while (0)

/* The tensors t[0..n) stacked into one dense matrix when they can be (all
 * single f32, bf16 or f16 matrices of one dtype and the same columns: their
 * rows one after another, so each row's product is the one it has alone):
 * 1 in *stacked; else 0, out zeroed and nothing reserved.  In q4 packages
 * the MoE router and the shared-expert gate (bf16 [E, H] and [1, H]): one
 * launch instead of two, the second a one-block kernel (3.3 us of a
 * 35B-A3B layer, NOTES.md). */
int put_dense_stacked(qc_upload *w, const splash_tensor *const *t, int n, qc_matrix *out, int *stacked) {
    int64_t r, c, count, cols = -1, rows = 0;
    *stacked = 0;
    memset(out, 0, sizeof *out);
    if (n < 2 || n > 4) return 0;
    for (int i = 0; i < n; i++) {
        const int dt = (int)t[i]->dtype;
        splash_tensor_matrix_dims(t[i], &r, &c, &count);
        if ((dt != SPLASH_F32 && dt != SPLASH_BF16 && dt != SPLASH_F16) || dt != (int)t[0]->dtype || count != 1 ||
            (cols >= 0 && c != cols) || t[i]->bytes != (size_t)(r * c) * (dt == SPLASH_F32 ? 4 : 2))
            return 0;
        cols = c, out->part_row[i] = (int)rows, rows += r;
    }
    if (rows > (1 << 24)) return 0;
    *stacked = 1;
    out->rows = (int)rows, out->cols = (int)cols;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += t[i]->bytes;
    uint8_t *d = reserve(w, total);
    if (!w->dev) return 0;
    for (size_t i = 0, at = 0; i < (size_t)n; at += t[i]->bytes, i++)
        TRY(copy_up(w, d + at, t[i]->data, t[i]->bytes, t[i]->name));
    if (splash_cuda_dense_matrix_init(&out->dense, (int)t[0]->dtype, d, (int)rows, (int)cols))
        return splash_fail(w->err, SPLASH_E_UNSUPPORTED, "tensors from %s on: cannot be stacked", t[0]->name);
    return 0;
}

} /* namespace */

int qc_upload_inputs(qc_upload *w, const splash_tensor *const *t, int n, qc_matrix *stack, qc_matrix *const *apart) {
    int st;
    TRY(put_stacked(w, t, n, stack, &st));
    if (!st) TRY(put_dense_stacked(w, t, n, stack, &st));
    for (int i = 0; !st && i < n; i++) TRY(qc_upload_matrix(w, t[i], apart[i]));
    return 0;
}

namespace {

/* Whether layer L's shared expert can run as expert E (qc_layer.shared_slot):
 * q4, single matrices of the routed experts' shapes (then the upload puts it
 * right after them, at the arrays' stride), and E + 1 experts within what
 * the grouped step takes. */
bool shared_fits(const qwen35_dims *d, const qwen35_layer *L) {
    if (d->experts + 1 > SPLASH_CUDA_MOE_MAX_EXPERTS) return false;
    const splash_tensor *t[3] = {L->shared_gate, L->shared_up, L->shared_down};
    const int64_t want[3][2] = {{d->expert_inter, d->hidden}, {d->expert_inter, d->hidden}, {d->hidden, d->expert_inter}};
    for (int j = 0; j < 3; j++) {
        int64_t r, c, count;
        splash_tensor_matrix_dims(t[j], &r, &c, &count);
        if (t[j]->dtype != SPLASH_Q4 || count != 1 || r != want[j][0] || c != want[j][1]) return false;
    }
    return true;
}

/* The whole walk, in one order for both passes. */
int walk(qc_upload *w, const qwen35_dims *d, const qwen35_weights *hw, const float *inv_freq, qc_weights *out) {
    const size_t H = (size_t)d->hidden;
    TRY(qc_upload_matrix(w, hw->embed, &out->embed));
    if (hw->lm_head == hw->embed)
        out->lm_head = out->embed;
    else
        TRY(qc_upload_matrix(w, hw->lm_head, &out->lm_head));
    out->lm_head_data = hw->lm_head->data;
    TRY(qc_upload_vec(w, hw->final_norm, H, "final_norm", &out->final_norm));
    if (d->rotary_dim) TRY(qc_upload_vec(w, inv_freq, (size_t)d->rotary_dim / 2, "inv_freq", &out->inv_freq));
    const size_t E = (size_t)d->experts;
    for (int i = 0; i < d->n_layers; i++) {
        const qwen35_layer *L = &hw->layers[i];
        qc_layer *o = &out->layers[i];
        o->is_attn = L->is_attn, o->index = L->index;
        TRY(qc_upload_vec(w, L->input_norm, H, "input_norm", &o->input_norm));
        TRY(qc_upload_vec(w, L->post_norm, H, "post_norm", &o->post_norm));
        if (L->is_attn) {
            const splash_tensor *in[3] = {L->q_proj, L->k_proj, L->v_proj};
            qc_matrix *const apart[3] = {&o->q_proj, &o->k_proj, &o->v_proj};
            TRY(qc_upload_inputs(w, in, 3, &o->attn_in, apart));
            TRY(qc_upload_matrix(w, L->o_proj, &o->o_proj));
            TRY(qc_upload_vec(w, L->q_norm, (size_t)d->head_dim, "q_norm", &o->q_norm));
            TRY(qc_upload_vec(w, L->k_norm, (size_t)d->head_dim, "k_norm", &o->k_norm));
        } else {
            const splash_tensor *in[4] = {L->in_qkv, L->in_z, L->in_b, L->in_a};
            qc_matrix *const apart[4] = {&o->in_qkv, &o->in_z, &o->in_b, &o->in_a};
            TRY(qc_upload_inputs(w, in, 4, &o->gdn_in, apart));
            TRY(qc_upload_matrix(w, L->out_proj, &o->out_proj));
            TRY(qc_upload_vec(w, L->conv_t, (size_t)d->conv_kernel * d->conv_dim, "conv", &o->conv_t));
            TRY(qc_upload_vec(w, L->neg_a, (size_t)d->hv, "A_log", &o->neg_a));
            TRY(qc_upload_vec(w, L->dt_bias, (size_t)d->hv, "dt_bias", &o->dt_bias));
            TRY(qc_upload_vec(w, L->gnorm, (size_t)d->dv, "gdn.norm", &o->gnorm));
        }
        if (d->moe) {
            splash_q4_matrix *ex = out->experts + (size_t)i * 3 * (E + 1);
            const splash_tensor *gates[2] = {L->router, L->shared_expert_gate};
            qc_matrix *const gates_apart[2] = {&o->router, &o->shared_expert_gate};
            TRY(qc_upload_inputs(w, gates, 2, &o->gates_in, gates_apart));
            o->experts_gemm = 1;
            o->shared_slot = shared_fits(d, L);
            const splash_tensor *ev[3] = {L->experts_gate, L->experts_up, L->experts_down};
            const splash_tensor *sv[3] = {L->shared_gate, L->shared_up, L->shared_down};
            qc_matrix *const sm[3] = {&o->shared_gate, &o->shared_up, &o->shared_down};
            for (int j = 0; j < 3; j++) {
                splash_q4_matrix *x = ex + (size_t)j * (E + 1);
                TRY(put_experts(w, ev[j], x, &o->experts_gemm));
                if (o->shared_slot) { /* right after expert E - 1: the arrays' stride holds */
                    TRY(qc_upload_matrix(w, sv[j], sm[j]));
                    x[E] = sm[j]->q4;
                }
            }
            o->experts_gate = ex, o->experts_up = ex + E + 1, o->experts_down = ex + 2 * (E + 1);
            if (!o->shared_slot) {
                const splash_tensor *in[2] = {L->shared_gate, L->shared_up};
                qc_matrix *const apart[2] = {&o->shared_gate, &o->shared_up};
                TRY(qc_upload_inputs(w, in, 2, &o->ffn_in, apart));
                TRY(qc_upload_matrix(w, L->shared_down, &o->shared_down));
            }
        } else {
            const splash_tensor *in[2] = {L->gate, L->up};
            qc_matrix *const apart[2] = {&o->gate, &o->up};
            TRY(qc_upload_inputs(w, in, 2, &o->ffn_in, apart));
            TRY(qc_upload_matrix(w, L->down, &o->down));
        }
    }
    return 0;
}

} /* namespace */

int qc_upload_run(int (*walk)(qc_upload *, void *), void *ctx, void **dev, size_t *bytes, int *max_q4_cols,
                  splash_error *err) {
    qc_upload w;
    memset(&w, 0, sizeof w);
    w.err = err;
    *dev = nullptr;
    int rc = walk(&w, ctx); /* sizes */
    if (!rc) {
        *bytes = w.off;
        cudaError_t e = cudaMalloc(dev, w.off ? w.off : 1);
        if (e != cudaSuccess) {
            *dev = nullptr;
            rc = splash_fail(err, SPLASH_E_NOMEM, "cudaMalloc of %zu MiB of weights: %s", w.off >> 20,
                             cudaGetErrorString(e));
        }
    }
    if (!rc) {
        w.dev = (uint8_t *)*dev, w.off = 0, w.max_q4_cols = 0;
        rc = walk(&w, ctx); /* copies */
        if (max_q4_cols) *max_q4_cols = w.max_q4_cols;
    }
    free(w.stage);
    if (rc && *dev) {
        cudaFree(*dev);
        *dev = nullptr;
    }
    return rc;
}

namespace {

struct TargetWalk {
    const qwen35_dims *d;
    const qwen35_weights *hw;
    const float *inv_freq;
    qc_weights *out;
};

int target_walk(qc_upload *w, void *ctx) {
    const TargetWalk *t = (const TargetWalk *)ctx;
    return walk(w, t->d, t->hw, t->inv_freq, t->out);
}

} /* namespace */

int qc_weights_upload(const splash_package *pkg, const qwen35_dims *d, qc_weights *out, splash_error *err) {
    memset(out, 0, sizeof *out);
    qwen35_weights hw;
    int rc = qwen35_weights_bind(pkg, d, &hw, err);
    if (rc) return rc;
    float *inv_freq = nullptr;
    out->layers = (qc_layer *)calloc((size_t)d->n_layers, sizeof *out->layers);
    if (d->moe)
        out->experts = (splash_q4_matrix *)calloc((size_t)d->n_layers * 3 * ((size_t)d->experts + 1), sizeof *out->experts);
    if (d->rotary_dim) inv_freq = (float *)malloc((size_t)d->rotary_dim / 2 * sizeof(float));
    if (!out->layers || (d->moe && !out->experts) || (d->rotary_dim && !inv_freq)) {
        rc = splash_fail(err, SPLASH_E_NOMEM, "out of memory for the CUDA weight tables");
    } else {
        if (d->rotary_dim) splash_cuda_rope_inv_freq(inv_freq, d->rotary_dim, d->rope_theta);
        TargetWalk t = {d, &hw, inv_freq, out};
        rc = qc_upload_run(target_walk, &t, &out->dev, &out->bytes, &out->max_q4_cols, err);
    }
    free(inv_freq);
    qwen35_weights_free(&hw, d);
    if (rc) qc_weights_free(out);
    return rc;
}

void qc_weights_free(qc_weights *w) {
    if (w->dev) cudaFree(w->dev);
    free(w->layers);
    free(w->experts);
    memset(w, 0, sizeof *w);
}
