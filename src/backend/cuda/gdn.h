/* gdn.h - Gated DeltaNet on the GPU, everything between a GDN layer's input
 * projections and its out_proj (models.md "Gated DeltaNet", the CPU's
 * gdn_conv.c, gdn_recurrent.c and models/qwen35/gdn.c):
 *
 *   conv        mixed = silu(causal depthwise conv(qkv)), kernel K, with the
 *               conv state (the last K-1 pre-conv rows, oldest first);
 *   gates       beta = sigmoid(b), g = neg_a * softplus(a + dt_bias)
 *               (neg_a = -exp(A_log), computed once at load as the CPU does);
 *   recurrence  per value head h (key head h / (Hv/Hk)), per row:
 *                 q, k = l2norm(q), l2norm(k) (eps 1e-6); q *= dk^-0.5
 *                 S *= exp(g); m = S^T k; delta = beta (v - m);
 *                 S += k (x) delta; o = S^T q
 *               then optionally the gated RMSNorm of o over dv,
 *                 y = (w * (o * rsqrt(mean(o^2) + eps))) * silu(z).
 *               Blocks per (lane, value head, 32 columns of dv) keep S
 *               [dk][dv] fp32 in registers for all of the lane's rows:
 *               decode and verify read and write the state once per layer.
 *
 * Activation layout (rows of the batch, lanes own consecutive rows):
 *   qkv / mixed [rows][conv_dim], conv_dim = 2*Hk*dk + Hv*dv:
 *               [ q: Hk x dk | k: Hk x dk | v: Hv x dv ]
 *   a, b        [rows][Hv]     o, z, y  [rows][Hv * dv]
 * State layout per lane (as the CPU's slots): conv [K-1][conv_dim], delta
 * [Hv][dk][dv] (row i = key dim i).
 *
 * Lanes (device array of splash_cuda_gdn_lane): s_in is read before the
 * first row and the state after the last row is written to s_out, which may
 * be s_in (prefill, decode, commit's replay), a scratch copy, or NULL (the
 * recurrence only: the state after the rows is not written; a verify lane,
 * whose slot stays as it was until commit replays the accepted rows, needs
 * only its rows' outputs).  update_conv says whether the conv state advances
 * (prefill, decode, commit) or not (verify).
 *
 * Commit of a verify block (what the model will do): advance the conv state
 * with the accepted rows' pre-conv inputs (splash_cuda_gdn_conv with y =
 * NULL) and re-run splash_cuda_gdn_recurrent on the saved mixed/a/b rows with
 * s_in = s_out = the slot and no outputs: the same kernel on the same inputs,
 * so the committed state is bit-identical to running those rows directly.
 *
 * Supported: dk in {32, 64, 128}, dv <= 128 (chunked: a multiple of 4), K <= 8.  The recurrence
 * runs rows one after another; long prefills use splash_cuda_gdn_chunked.
 * Numbers agree with the CPU to fp32 rounding (sums over dk run in 4
 * interleaved slices of 4 chains each, then across them).
 */
#ifndef SPLASH_CUDA_GDN_H
#define SPLASH_CUDA_GDN_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;

#define SPLASH_CUDA_GDN_MAX_K 8
#define SPLASH_CUDA_GDN_MAX_DV 128

typedef struct splash_cuda_gdn_lane {
    float *conv_state;  /* [K-1][conv_dim] */
    const float *s_in;  /* [Hv][dk][dv] */
    float *s_out;       /* [Hv][dk][dv], may equal s_in; NULL: not kept (recurrence only) */
    int first_row, n_rows;
    int update_conv;    /* 1: conv state advanced by the rows */
    int reserved;
} splash_cuda_gdn_lane;

/* y[r][c] = silu(sum_k wT[k][c] * in(t - K + 1 + k)[c]) for every lane row
 * (y NULL: no output, the state update only).  wT: the conv weight
 * transposed to [K][C], as the CPU keeps it.  max_lane_rows >= every lane's
 * n_rows.  y must not alias x.  early = 1: the caller's word that no kernel
 * still running may write the lanes, wT or the conv states (the launch
 * before is a q4 product, which waits for all before it: q4_matmul.h,
 * splash_q4_early_loads), so a launch of at most 16 rows a lane (K = 4)
 * reads them before its programmatic wait; the same results either way. */
int splash_cuda_gdn_conv(const float *wT, int C, int K, const splash_cuda_gdn_lane *lanes, int n_lanes,
                         int max_lane_rows, const float *x, size_t ldx, float *y, size_t ldy, int early,
                         struct CUstream_st *stream);

/* g[r][h] = neg_a[h] * softplus(a[r][h] + dt_bias[h]); beta[r][h] = sigmoid(b[r][h]). */
int splash_cuda_gdn_gates(const float *a, const float *b, size_t ldab, const float *neg_a, const float *dt_bias,
                          int rows, int hv, float *g, float *beta, size_t ldgb, struct CUstream_st *stream);

typedef struct splash_cuda_gdn_args {
    const splash_cuda_gdn_lane *lanes; /* device [n_lanes] */
    int n_lanes;
    int hk, hv, dk, dv;
    const float *mixed; /* [rows][2*hk*dk + hv*dv] conv output (q | k | v, not normalised) */
    size_t ldm;
    const float *a, *b; /* [rows][hv] raw projections */
    size_t ldab;
    const float *neg_a, *dt_bias; /* [hv] */
    float *o;           /* [rows][hv*dv] core output, or NULL */
    size_t ldo;
    const float *z;     /* [rows][hv*dv] gate input of the gated norm (with y) */
    size_t ldz;
    const float *norm_w;/* [dv] gated-norm weight (not offset) */
    float *y;           /* [rows][hv*dv] gated-norm output, or NULL */
    size_t ldy;
    float eps;          /* of the gated norm */
    float *ws;          /* splash_cuda_gdn_chunked only: device workspace of ws_floats floats, */
    size_t ws_floats;
    int max_lane_rows;  /* and a bound on every lane's n_rows */
    /* splash_cuda_gdn_recurrent: 1 reads the lanes, their states and the
     * weights (neg_a, dt_bias, norm_w) before the programmatic wait, while the
     * kernels before it still run.  Only for a launch whose programmatic
     * chain back to the last launch without the attribute (a q4 product:
     * device_util.cuh) holds no writer of those states: then every writer
     * has completed.  Same results either way. */
    int early;
} splash_cuda_gdn_args;

/* The checks both GDN cores make of their arguments: SPLASH_E_INVALID (a
 * missing pointer, counts out of range, hv not a multiple of hk, y without z
 * or norm_w), SPLASH_E_UNSUPPORTED (dv > SPLASH_CUDA_GDN_MAX_DV), else OK. */
int splash_cuda_gdn_args_check(const splash_cuda_gdn_args *a);
int splash_cuda_gdn_recurrent(const splash_cuda_gdn_args *a, struct CUstream_st *stream);

/* The same function by chunks of SPLASH_CUDA_GDN_CHUNK rows (the UT
 * transform of gdn_chunked.c: a triangular solve inside the chunk, one
 * sequential pass over chunks), for prefill lanes with many rows.  Same
 * arguments and outputs as splash_cuda_gdn_recurrent; agrees with it (and
 * with cpu_gdn_chunked) to fp32 rounding, not bitwise, so a lane's rows must
 * all go through one of the two (verify and commit use the recurrence).
 * Needs a workspace (a->ws): what each chunk needs before the state
 * reaches it is made for many chunks in parallel and kept there; at least
 * splash_cuda_gdn_chunked_ws_floats(hv, dk, dv, n_lanes, 1) floats, and the
 * more chunks it holds (up to every lane's), the fewer launches; 0 for a
 * shape it does not take (dk 32, 64 or 128; dv a multiple of 8 up to
 * SPLASH_CUDA_GDN_MAX_DV: the tensor cores' tiles), whose lanes then go
 * through the recurrence.  Uses up to ~207 KB of shared memory per block at
 * dk = dv = 128. */
#define SPLASH_CUDA_GDN_CHUNK 64
static inline int splash_cuda_gdn_chunked_takes(int dk, int dv) { /* the shapes above */
    return (dk == 32 || dk == 64 || dk == 128) && dv > 0 && dv % 8 == 0 && dv <= SPLASH_CUDA_GDN_MAX_DV;
}
size_t splash_cuda_gdn_chunked_ws_floats(int hv, int dk, int dv, int n_lanes, int chunks);
int splash_cuda_gdn_chunked(const splash_cuda_gdn_args *a, struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif

#endif
