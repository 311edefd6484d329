/* cpu.h - the CPU backend's kernels: the operations a model's forward pass is
 * made of, on fp32 activations and weights that stay in their package encoding
 * (f32, bf16, f16, q8, q4) and are dequantised on the fly.
 *
 * Two rules shape every kernel here:
 *
 *  1. Batch invariance.  A row's result depends only on that row's inputs:
 *     every reduction runs in one fixed order whatever the number of rows in
 *     the call, the thread count or the schedule.  Work is split across
 *     threads by output (rows of a matrix, heads, channels), never inside a
 *     reduction.  So a sequence's logits are bit-identical alone or beside
 *     others.
 *  2. Two code paths, one arithmetic.  Hot kernels have an AVX2+FMA path
 *     (compiled with __attribute__((target)), chosen at run time) and a
 *     portable scalar path.  The scalar path performs the same operations in
 *     the same order (fmaf where the vector path fuses, 32 accumulation lanes
 *     where the vector path keeps 4 registers of 8), so both give the same
 *     numbers; tests compare them.
 *
 * The fixed reductions:
 *   dot of plain rows:   column c accumulates into lane c % 32 (fmaf), lanes
 *                        reduced (l + l+8) + (l+16 + l+24), then 8 -> 1 as
 *                        ((0+4)+(2+6)) + ((1+5)+(3+7)).
 *   dot of q4/q8 rows:   per group g of 64 columns, 8 lanes P_g[l] of the
 *                        group's sum of q x: on fp32 activations two fmaf
 *                        chains over the group's 8 code vectors (q8: column
 *                        blocks 0,2,4,6 and 1,3,5,7; q4: the low nibbles of
 *                        bytes 8j..8j+7 (even columns) and their high nibbles
 *                        (odd columns)), then added; on int8/int16
 *                        activations exact integer sums (matmul_act.c).
 *                        acc_(g mod 2)[l] = fmaf(S_g, P_g[l], acc_(g mod 2)[l])
 *                        with S_g = scale_g (fp32 x) or scale_g * d_g (the
 *                        activations' group scale); bias lanes bl[g mod 8] =
 *                        fmaf(bias_g, xsum_g, bl[g mod 8]) with xsum_g the
 *                        group's sum of x (8 lanes then 8 -> 1), and on
 *                        int8/int16 activations then bl[g mod 8] =
 *                        fmaf(scale_g, qbar * c_g, bl[g mod 8]) (the mean-code
 *                        compensation, matmul_act.c); result =
 *                        hsum8(acc_0 + acc_1) + hsum8(bl).  (w = scale*q + bias,
 *                        so sum w x = scale * sum q x + bias * sum x: half the
 *                        multiplies of dequantising.)
 *
 * A cpu_ctx holds the worker pool and the scratch the kernels need; it is
 * sized once (max rows, widest matrix) so nothing allocates during a forward.
 */
#ifndef SPLASH_CPU_H
#define SPLASH_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "base/threads.h"
#include "package/tensor.h"

/* ---- context and SIMD selection ------------------------------------------ */

typedef struct cpu_ctx {
    splash_pool *pool;
    int n_threads;
    int max_m;          /* most input rows of one matmul */
    int max_cols;       /* widest matrix input dimension */
    float *xsum;        /* [max_m][max_cols/64] group sums of the input rows */
    /* Activations of q4/q8 products (CPU_ACT_*).  F32 is the reference;
     * I8 (and I16) quantise each input row per group of 64 and use integer
     * dot products (AVX2 maddubs / madd), about 2x the speed on a
     * compute-bound core.  Chosen with cpu_set_act (default F32). */
    int act;
    float *xp;          /* F32:  [max_m][max_cols] inputs in q4 order */
    void *xq4, *xq8;    /* I8/I16: [max_m][max_cols] quantised inputs, q4 / column order */
    float *xd;          /* I8/I16: [max_m][2][max_cols/64] their scales, compensation sums */
    float *xt;          /* I8/I16: the same per block of 4 inputs, group by group (matmul_act.c) */
    float *att;         /* [n_threads][CPU_ATT_SCRATCH] attention's K and V blocks (attention.c) */
} cpu_ctx;

/* Floats of attention scratch per worker: a widened K block, its
 * transpose and a widened V block, ATT_BUF floats each. */
#define CPU_ATT_SCRATCH (3 * 8192)

/* Creates the pool (threads <= 0: all cores) and the scratch for fp32
 * activations.  Returns 0 or SPLASH_E_NOMEM.  cpu_ctx_scratch_bytes: what
 * that scratch takes. */
int cpu_ctx_init(cpu_ctx *c, int threads, int max_m, int max_cols);
void cpu_ctx_free(cpu_ctx *c);
size_t cpu_ctx_scratch_bytes(const cpu_ctx *c);

/* 1 when the AVX2+FMA+F16C paths run.  Detected once; SPLASH_CPU_SIMD=0 in the
 * environment forces the scalar paths.  cpu_simd_set() overrides it (tests
 * run both paths); pass -1 to return to detection. */
int cpu_simd(void);
void cpu_simd_set(int on);

/* Runs fn(ctx, i, worker) for i in [0, n) on the context's pool. */
void cpu_parallel(cpu_ctx *c, size_t n, splash_task_fn fn, void *ctx);

/* ---- matrices (matmul.c) ------------------------------------------------- */

/* y[i][o] = sum_c W[o][c] * x[i][c] for i < m, o < rows(W).  W is a 2-D
 * tensor (or one slice of a stack) of any dtype; x rows are ldx floats apart,
 * y rows ldy.  Parallel over output rows; each weight row is read once per
 * call, whatever m.  m <= max_m, cols <= max_cols of the context. */
void cpu_matmul(cpu_ctx *c, const splash_tensor *w, int m, const float *x, size_t ldx, float *y,
                size_t ldy);
/* y[i][o] += (W x)[i][o]: the same bits as cpu_matmul into a buffer and then
 * adding it to y (the residual stream), without the extra pass. */
void cpu_matmul_add(cpu_ctx *c, const splash_tensor *w, int m, const float *x, size_t ldx, float *y,
                    size_t ldy);
/* Several matrices over the same x, in one pool run (x prepared once): part
 * k writes (or, with add, adds) W_k x into y_k.  Each output has the bits
 * cpu_matmul would give it.  Consecutive parts of the same input width, up
 * to CPU_MM_MAX_PARTS, share a run. */
#define CPU_MM_MAX_PARTS 8
typedef struct cpu_mm_part {
    const splash_tensor *w;
    float *y;
    size_t ldy;
    int add;
} cpu_mm_part;
void cpu_matmul_parts(cpu_ctx *c, const cpu_mm_part *parts, int n, int m, const float *x, size_t ldx);
/* h = silu(gate x) * (up x) (SwiGLU) in one run when gate and up have the
 * same shape; tmp receives up x.  The bits of two cpu_matmul calls followed
 * by cpu_silu_mul. */
void cpu_matmul_swiglu(cpu_ctx *c, const splash_tensor *gate, const splash_tensor *up, int m, const float *x,
                       size_t ldx, float *h, size_t ldh, float *tmp, size_t ldt);
/* Row r of W as fp32 (q: scale * q + bias). */
void cpu_dequant_row(const splash_tensor *w, int64_t r, float *out);
/* Activations for q4/q8 products (see cpu_ctx).  cpu_set_act allocates the
 * scratch the mode needs: 0 or SPLASH_E_NOMEM (the mode is then unchanged).
 * Not during a forward. */
enum { CPU_ACT_F32 = 0, CPU_ACT_I16 = 1, CPU_ACT_I8 = 2 };
int cpu_set_act(cpu_ctx *c, int act);
/* The fixed-order fp32 dot product described above. */
float cpu_dot(const float *a, const float *b, int n);
/* out[k] = cpu_dot(a, B_k, len) for k < n (rows B_k ldb apart): the same
 * bits, four rows at a time when len is a multiple of 32. */
void cpu_dot_rows(const float *a, const float *B, size_t ldb, int n, int len, float *out);

/* ---- elementwise and norms (vec.c, norm.c, act.c) ------------------------ */

/* y[i] = fmaf(a, x[i], y[i]) */
void cpu_axpy(float a, const float *x, float *y, int n);
/* y = fmaf(a[k], X_k, y) for k = 0..n-1 in order (rows X_k ldx apart, w
 * columns): the bits of n cpu_axpy calls, with y in registers. */
void cpu_axpy_rows(const float *a, const float *X, size_t ldx, int n, float *y, int w);
/* y[i] += x[i] */
void cpu_add(const float *x, float *y, int n);

/* y = x * rsqrt(mean(x^2) + eps) * f   (f = the stored factor, 1+w for the
 * zero-centred norms).  y may alias x. */
void cpu_rmsnorm(const float *x, const float *f, int n, float eps, float *y);
/* Gated RMSNorm of GDN: y = (w * (x * rsqrt(mean(x^2)+eps))) * silu(z). */
void cpu_rmsnorm_gated(const float *x, const float *w, const float *z, int n, float eps, float *y);
/* x *= rsqrt(sum(x^2) + eps) */
void cpu_l2norm(float *x, int n, float eps);

float cpu_sigmoid(float x);
float cpu_silu(float x);
float cpu_softplus(float x); /* torch: x > 20 ? x : log1p(exp(x)) */
/* out[i] = silu(g[i]) * u[i] */
void cpu_silu_mul(const float *g, const float *u, int n, float *out);
/* x[i] = silu(x[i]) */
void cpu_silu_inplace(float *x, int n);
/* In-place softmax in fp32 (max subtracted). */
void cpu_softmax(float *x, int n);
/* The k largest finite values of x[0..n) (only columns whose bit is set in
 * allow, when allow is not NULL), descending, equal values by lower column:
 * ids[] their columns, vals[] the values.  Returns how many (< k when fewer
 * are finite).  -inf and NaN are never chosen.  The reference of the GPU's
 * top-k (backend/cuda/argmax.h) and of sampling's top_k order. */
int cpu_top_k(const float *x, int n, int k, const uint32_t *allow, int32_t *ids, float *vals);

/* ---- rotary (rope.c) ----------------------------------------------------- */

/* Rotates the first rot_dim dims of each of n_heads vectors (head_dim apart)
 * by position pos, NEOX pairing (i, i + rot_dim/2), inv_freq[i] =
 * theta^(-2i/rot_dim) computed in fp32 as transformers does. */
void cpu_rope(float *x, int n_heads, int head_dim, int rot_dim, double theta, int32_t pos);

/* ---- attention over paged KV (attention.c) ------------------------------- */

/* Where K and V of one attention layer live in a page.  A page holds, for
 * each attention layer in order, four parts, each starting on a 64-byte
 * boundary (the same layout on every backend):
 *   K values [kv_heads][page_tokens][head_dim]  f32 | bf16 | int8
 *   K scales [kv_heads][page_tokens]            fp32, int8 only (empty otherwise)
 *   V values, V scales                          likewise
 * int8: symmetric, scale = max|x|/127 per (token, kv head), x ~= q * scale. */
typedef struct cpu_kv_layout {
    int format;          /* SPLASH_KV_* */
    int page_tokens, kv_heads, head_dim, n_layers;
    int value_size;      /* bytes per stored value: 4, 2, 1 */
    size_t k_off, ks_off, v_off, vs_off; /* the parts inside one layer's block */
    size_t layer_bytes;  /* one layer's block */
    size_t page_bytes;   /* all layers */
} cpu_kv_layout;

#define CPU_KV_MAX_HEAD_DIM 1024

/* Fills l for a SPLASH_KV_* format; returns 0, SPLASH_E_UNSUPPORTED for an
 * unknown format, SPLASH_E_INVALID for bad sizes (head_dim above
 * CPU_KV_MAX_HEAD_DIM). */
int cpu_kv_layout_init(cpu_kv_layout *l, int format, int n_layers, int kv_heads, int head_dim,
                       int page_tokens);

/* The int8 quantiser of KV rows: *scale = max|x| / 127, q[i] = rintf(x[i] /
 * scale) (nearest, ties to even) clamped to [-127, 127] (0 when the row is
 * all zero).  Scalar and AVX2 paths store the same bits (finite inputs). */
void cpu_kv_quant_int8(const float *x, int n, int8_t *q, float *scale);

/* One lane's view for attention. */
typedef struct cpu_attn_lane {
    const int32_t *pages;
    int n_past;            /* KV positions before the lane's first row */
    int first_row, n_rows; /* rows of the q/out arrays */
} cpu_attn_lane;

/* Writes k, v ([rows][kv_heads*head_dim]) of layer `layer` into the lanes'
 * pages at positions n_past + r. */
void cpu_kv_write(cpu_ctx *c, const cpu_kv_layout *l, uint8_t *pool, int layer, const cpu_attn_lane *lanes,
                  int n_lanes, const float *k, size_t ldk, const float *v, size_t ldv);
/* out[row][h*hd..] = softmax(q_h . K^T * scale) V over positions
 * [0, n_past + r] of the lane, kv head h / (n_heads / kv_heads), with the
 * block-wise online softmax that attention.c describes (the same bits for a
 * row whatever else is in the call).  Scratch comes from the context
 * (c->att); scores and scores_stride are not used (pass NULL, 0). */
void cpu_attention(cpu_ctx *c, const cpu_kv_layout *l, const uint8_t *pool, int layer,
                   const cpu_attn_lane *lanes, int n_lanes, int n_heads, const float *q, size_t ldq,
                   float *out, size_t ldo, float scale, float *scores, size_t scores_stride);

/* ---- Gated DeltaNet (gdn_conv.c, gdn_recurrent.c, gdn_chunked.c) --------- */

/* Causal depthwise conv + SiLU over n rows for channels [c0, c1):
 * y[t][c] = silu(sum_k wT[k][c] * in(t - K + 1 + k)[c]), in(j < 0) =
 * state[K - 1 + j][c] (state [K-1][C], oldest first).  wT is the conv weight
 * transposed to [K][C].  When update, the state becomes the last K-1 inputs.
 * x rows ldx apart, y rows ldy apart (y must not alias x). */
void cpu_gdn_conv(const float *wT, int C, int K, float *state, int update, const float *x, size_t ldx,
                  int n, float *y, size_t ldy, int c0, int c1);
/* The conv state after appending n input rows, channels [c0, c1) (what a
 * PREFILL does and what commit replays). */
void cpu_gdn_conv_advance(float *state, int C, int K, const float *x, size_t ldx, int n, int c0, int c1);

/* One token of the gated delta rule on one value head's state S [dk][dv]:
 * S *= exp(g); m = S^T k; delta = beta (v - m); S += k (x) delta;
 * o = S^T q (skipped when q is NULL: commit replays without output). */
void cpu_gdn_step(float *S, int dk, int dv, const float *q, const float *k, const float *v, float g,
                  float beta, float *o);
/* The same step reading the state from Sin and writing it to S (Sin may be
 * S): the bits of copying Sin to S and stepping there. */
void cpu_gdn_step_from(const float *Sin, float *S, int dk, int dv, const float *q, const float *k, const float *v,
                       float g, float beta, float *o);
/* n tokens of one head by the chunked algorithm (chunk 64, UT transform), as
 * transformers' torch_chunk_gated_delta_rule.  q, k rows ldqk apart; v, o
 * rows ldv apart; g and beta ldgb apart.  S is updated in place.  scratch:
 * cpu_gdn_chunk_scratch(dk, dv) floats. */
size_t cpu_gdn_chunk_scratch(int dk, int dv);
void cpu_gdn_chunked(float *S, int dk, int dv, int n, const float *q, const float *k, size_t ldqk,
                     const float *v, size_t ldv, const float *g, const float *beta, size_t ldgb, float *o,
                     size_t ldo, float *scratch);

#define CPU_GDN_CHUNK 64
#define CPU_GDN_MAX_DV 2048 /* widest value head cpu_gdn_step takes */

#endif
