/* gdn_chunked.cu - the gated delta rule by chunks of 64 rows for prefill
 * (gdn.h), the CPU's gdn_chunked.c on the GPU.  Per chunk of L rows, with
 * cum = cumsum(g) and the rows' q, k already l2-normalised (q scaled):
 *
 *   A[i][j] = (beta_i k_i . k_j) exp(cum_i - cum_j)           j < i
 *   U = (I + A)^-1 (beta v),  W = (I + A)^-1 (beta k exp(cum))  (forward substitution)
 *   vnew_i = U_i - W_i S
 *   o_i = (q_i exp(cum_i)) S + sum_{j<=i} (q_i . k_j) exp(cum_i - cum_j) vnew_j
 *   S = S exp(cum_L) + sum_i (k_i exp(cum_L - cum_i)) (x) vnew_i
 *
 * Two kernels.  What a chunk needs before the state reaches it (q and k
 * normalised, the gates, A, the forward substitution giving W and U, the
 * output weights (q_i . k_j) exp(cum_i - cum_j)) does not depend on the
 * state, so gdn_chunk_prep_kernel makes it for many chunks at once (a
 * block per (head, chunk, lane)) into a workspace; the substitution's long
 * dependent chains (~1/4 of a chunk's time when one block did everything
 * in order) then run side by side.  Then one block of 512 threads per
 * (value head, lane) walks the lane's chunks in order (gdn_chunk_state_kernel),
 * copying each chunk's prepared parts in, with everything in shared memory
 * (~220 KB at dk = dv = 128): the state S [dk][dv], the chunk's k, q and W
 * [64][dk+4] (rows padded by four floats: 16-byte aligned for float4 and
 * asynchronous copies, and a float4 per lane of consecutive rows covers the
 * 32 banks in 4 wavefronts), U [64][dv], A [64][64 + 4].  Each phase is a
 * loop over output elements with the column index fastest across threads
 * (so row operands are broadcasts and column operands consecutive),
 * separated by barriers; the three products of dv columns (W S, Q S + A U,
 * K^T U: 3/4 of the arithmetic) give each thread a tile of outputs (4 rows x
 * 2 columns, 4 x 4 for K^T U), so float4s of the row operands and a float2 or
 * float4 of S or U feed 8-16 FMAs (they were bound by shared-memory loads,
 * two per FMA), and the prep's k.k and q.k products give a lane 4 rows x 1
 * column with float4 along the sum (were 2 loads a FMA too).  Sums
 * run in the CPU's order (over r or j ascending, fmaf), products are rounded
 * as the CPU rounds them, so the result is close to cpu_gdn_chunked; the q/k
 * norms and the gates are the recurrence kernel's.  The chunk's outputs go
 * through shared memory (the W buffer, free by then) for the gated norm.
 *
 * Loads.  Both kernels bring their inputs in as asynchronous copies, all in
 * flight at once (copy_rows_async), instead of loops of plain loads that
 * waited for each; the state pass asks L2 for the next chunk's prepared
 * parts while it computes this one (the workspace outgrows L2 at a long
 * prefill), and copies the gate z of the chunk's rows in while it updates
 * the state.
 *
 * Plain fp32 on CUDA cores.  Tensor cores (the A, W S, Q S and K^T U
 * products are small GEMMs) are the next step.
 *
 * C++ used: a template over dk; no STL.
 */
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/gdn.h"

namespace cg = cooperative_groups;
using namespace splash_cuda;

namespace {

constexpr int kC = SPLASH_CUDA_GDN_CHUNK;
/* Both kernels' threads: one block an SM either way (~150 KB of shared
 * memory for the prep, 170-220 KB for the state pass), so 16 warps to hide
 * latency; at 8 the prep's short loops over independent elements and the
 * state pass's shared loads left the SM idle (NOTES.md, sessions 12, 13). */
constexpr int kThreads = 512;
constexpr int kPrepThreads = 512;

struct ChunkArgs {
    splash_cuda_gdn_args p;
    float qscale;
    int ns;     /* state pass: blocks (one cluster) per value head, each on dv / ns of its columns: 1, 2, 4 */
    int c0, nc; /* this launch pair's chunks of every lane: [c0, c0 + nc) (the workspace holds nc) */
};

/* Shared-memory plan in floats (dv runtime). */
template <int DK>
struct Plan {
    static constexpr int KS = DK + 4; /* padded row stride of Kc, Qc, W (see the top) */
    static constexpr int AS = kC + 4; /* the state pass's A: rows i and i + 4 in other banks */
    __host__ __device__ static size_t w_floats(int dv) {
        return (size_t)kC * (KS > dv ? KS : dv); /* W, later the chunk's outputs [L][dv]; Qc, later z */
    }
    __host__ __device__ static size_t floats(int dv) { /* dv: the block's slice */
        return (size_t)DK * dv + (size_t)kC * KS + 2 * w_floats(dv) + (size_t)kC * dv + (size_t)kC * AS + 10 * kC;
    }
};

/* A prepared chunk in the workspace (floats): q exp(cum) and k exp(cum_L -
 * cum) (q, k normalised, q scaled; each product rounded once, as the state
 * pass used to round it), W = (I + A)^-1 (beta k exp(cum)) [kC][dk]; U =
 * (I + A)^-1 (beta v) [kC][dv]; the output weights (q_i . k_j) exp(cum_i -
 * cum_j) [kC][kC]; exp(cum), exp(cum_L - cum) [kC]; exp(cum_L). */
struct Slot {
    int q, k, w, u, a, ec, kd, el, floats;
    __host__ __device__ Slot(int dk, int dv) {
        q = 0, k = kC * dk, w = 2 * kC * dk, u = 3 * kC * dk, a = u + kC * dv, ec = a + kC * kC, kd = ec + kC;
        el = kd + kC, floats = el + 4;
    }
};
__host__ __device__ inline size_t slot_floats(int hv, int dk, int dv) { return (size_t)hv * Slot(dk, dv).floats; }

/* acc[k] += a * b.k, k = 0..3 (fmaf: the CPU's order per output) */
__device__ __forceinline__ void fma4(float (&acc)[4], float a, float4 b) {
    acc[0] = fmaf(a, b.x, acc[0]), acc[1] = fmaf(a, b.y, acc[1]);
    acc[2] = fmaf(a, b.z, acc[2]), acc[3] = fmaf(a, b.w, acc[3]);
}

/* NC consecutive floats (one float2 load: the tiles' 2 columns), and
 * acc[k] += a * b[k] */
template <int NC>
__device__ __forceinline__ void ld_cols(float (&v)[NC], const float *p) {
    static_assert(NC == 2, "the state pass's tiles are 2 columns wide");
    const float2 t = *reinterpret_cast<const float2 *>(p);
    v[0] = t.x, v[1] = t.y;
}
template <int NC>
__device__ __forceinline__ void fma_cols(float (&acc)[NC], float a, const float (&b)[NC]) {
#pragma unroll
    for (int k = 0; k < NC; k++) acc[k] = fmaf(a, b[k], acc[k]);
}

/* acc[ii][.] += sum_r X[i0 + ii][r] S[r][c0 .. c0 + NC - 1], r ascending
 * (fmaf: the CPU's order per output): a float4 of each X row covers 4 r, so
 * 8 loads feed 16 NC FMAs.  The state pass's tiles are 4 rows x 2 columns:
 * twice the threads of 4 x 4 tiles at <= 128 registers, 16 warps an SM to
 * hide the shared loads' latency (with 8, ncu found a third of the stalls
 * waiting on them and the FMA pipe 32% busy). */
template <int DK, int NC>
__device__ __forceinline__ void rows_times_state(float (&acc)[4][NC], const float *X, int i0, const float *S, int dv,
                                                 int c0) {
    constexpr int KS = Plan<DK>::KS;
#pragma unroll 2
    for (int r = 0; r < DK; r += 4) {
        float4 x[4];
        float sr[4][NC];
#pragma unroll
        for (int ii = 0; ii < 4; ii++) x[ii] = *reinterpret_cast<const float4 *>(X + (size_t)(i0 + ii) * KS + r);
#pragma unroll
        for (int k = 0; k < 4; k++) ld_cols<NC>(sr[k], S + (size_t)(r + k) * dv + c0);
#pragma unroll
        for (int ii = 0; ii < 4; ii++) {
            fma_cols<NC>(acc[ii], x[ii].x, sr[0]), fma_cols<NC>(acc[ii], x[ii].y, sr[1]);
            fma_cols<NC>(acc[ii], x[ii].z, sr[2]), fma_cols<NC>(acc[ii], x[ii].w, sr[3]);
        }
    }
}

__device__ __forceinline__ float lane4(float4 v, int k) { return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w; }

/* rows x w floats from global memory (row stride ss) into shared memory (row
 * stride ds) as asynchronous copies, which the caller commits and waits for:
 * 16-byte pieces when every row starts 16-byte aligned on both sides, else
 * 4-byte ones. */
template <int NT>
__device__ __forceinline__ void copy_rows_async(float *dst, int ds, const float *src, size_t ss, int rows, int w,
                                                int tid) {
    const bool v4 = (w | ds) % 4 == 0 && ss % 4 == 0 && ((uintptr_t)src & 15) == 0 && (smem_addr(dst) & 15) == 0;
    if (v4) {
        const int w4 = w / 4;
        for (int e = tid; e < rows * w4; e += NT) {
            const int i = e / w4, c = 4 * (e % w4);
            cp_async16(smem_addr(dst + (size_t)i * ds + c), src + (size_t)i * ss + c, 16);
        }
    } else {
        for (int e = tid; e < rows * w; e += NT) {
            const int i = e / w, c = e % w;
            cp_async4(smem_addr(dst + (size_t)i * ds + c), src + (size_t)i * ss + c);
        }
    }
}

/* The prep's pair products d[ii] = X_{i0+ii} . Y_j over dk (r ascending,
 * fmaf: the CPU's order), rows of stride KS: a float4 of Y's row (the lane's
 * column j) and four broadcast float4s of X's feed 16 FMAs. */
template <int DK>
__device__ __forceinline__ void dot_4x1(float (&d)[4], const float *X, int i0, const float *Yj) {
    constexpr int KS = Plan<DK>::KS;
#pragma unroll 4
    for (int r = 0; r < DK; r += 4) {
        const float4 y = *reinterpret_cast<const float4 *>(Yj + r);
#pragma unroll
        for (int ii = 0; ii < 4; ii++) {
            const float4 x = *reinterpret_cast<const float4 *>(X + (size_t)(i0 + ii) * KS + r);
            d[ii] = fmaf(x.x, y.x, d[ii]), d[ii] = fmaf(x.y, y.y, d[ii]);
            d[ii] = fmaf(x.z, y.z, d[ii]), d[ii] = fmaf(x.w, y.w, d[ii]);
        }
    }
}

/* A[i][j] = (X_i . Y_j) exp(cum_i - cum_j) for j < i (strict) or j <= i, i
 * < L: a warp per 4 rows x 32 columns (kC = 64: 32 tasks, the upper-right
 * ones skipped). */
template <int DK, int NT>
__device__ __forceinline__ void pair_weights(float *A, const float *X, const float *Y, const float *cum, int L,
                                             bool strict, int warp, int lane) {
    static_assert(kC % 32 == 0, "a task is 32 columns");
    constexpr int KS = Plan<DK>::KS, halves = kC / 32;
    const int tasks = (L + 3) / 4 * halves;
    for (int task = warp; task < tasks; task += NT / 32) {
        const int i0 = 4 * (task / halves), j = 32 * (task % halves) + lane;
        if (32 * (task % halves) > i0 + 3) continue; /* every j of the task is past every i (warp-uniform) */
        float d[4] = {0.f, 0.f, 0.f, 0.f};
        dot_4x1<DK>(d, X, i0, Y + (size_t)j * KS);
#pragma unroll
        for (int ii = 0; ii < 4; ii++) {
            const int i = i0 + ii;
            if (i < L && (strict ? j < i : j <= i)) A[i * kC + j] = __fmul_rn(d[ii], expf(cum[i] - cum[j]));
        }
    }
}

/* x_i -= sum_{j<i} A[i][j] x_j for i = 1 .. L-1, j ascending (fmaf: the
 * CPU's order), over one column X (stride st) of W or U.  The column lives
 * in registers (both loops unrolled over the chunk's kC rows) and A's rows
 * come as broadcast float4s: the loop that read A[i][j] and x_j from shared
 * memory for every FMA was bound by those loads, two a FMA (ncu: ~45% of
 * the prep), and ran each row's chain only after the previous row's; here
 * row i's early terms run while row i - 1 finishes.  Rows past L are
 * computed from zeros and stale A and never stored. */
__device__ __forceinline__ void forward_substitute(float *X, int st, const float *A, int L) {
    float x[kC];
#pragma unroll
    for (int i = 0; i < kC; i++) x[i] = i < L ? X[(size_t)i * st] : 0.f;
#pragma unroll
    for (int i = 1; i < kC; i++) {
#pragma unroll
        for (int j = 0; j < i; j += 4) {
            const float4 a = *reinterpret_cast<const float4 *>(A + i * kC + j);
            x[i] = fmaf(-a.x, x[j], x[i]);
            if (j + 1 < i) x[i] = fmaf(-a.y, x[j + 1], x[i]);
            if (j + 2 < i) x[i] = fmaf(-a.z, x[j + 2], x[i]);
            if (j + 3 < i) x[i] = fmaf(-a.w, x[j + 3], x[i]);
        }
    }
#pragma unroll
    for (int i = 1; i < kC; i++)
        if (i < L) X[(size_t)i * st] = x[i];
}

/* Part 1, every chunk at once: a block per (value head, chunk, lane) makes
 * what the chunk needs before the state reaches it: the normalised q and
 * k, the gates, A and the forward substitution (W, U), the output weights.
 * The chunk is the lane's c0 + blockIdx.y; its slot in the workspace
 * (lane, blockIdx.y, head). */
template <int DK>
__global__ void __launch_bounds__(kPrepThreads, 1) gdn_chunk_prep_kernel(const ChunkArgs ca) {
    pdl_begin();
    constexpr int KS = Plan<DK>::KS;
    const splash_cuda_gdn_args &a = ca.p;
    const int h = blockIdx.x, cy = blockIdx.y;
    const splash_cuda_gdn_lane ln = a.lanes[blockIdx.z];
    const int t0 = (ca.c0 + cy) * kC;
    if (t0 >= ln.n_rows) return;
    extern __shared__ __align__(16) float sm[];
    const int dv = a.dv; /* the head's every column */
    float *Kc = sm;                                  /* [kC][KS] */
    float *Qc = Kc + (size_t)kC * KS;                /* [kC][KS] */
    float *W = Qc + (size_t)kC * KS;                 /* [kC][KS] */
    float *U = W + (size_t)kC * KS;                  /* [kC][dv] */
    float *A = U + (size_t)kC * dv;                  /* [kC][kC] */
    float *cum = A + (size_t)kC * kC, *ecum = cum + kC, *kd = ecum + kC, *bet = kd + kC, *gg = bet + kC;
    float *el = gg + kC;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = kPrepThreads / 32;
    const int kh = h / (a.hv / a.hk);
    const size_t key_dim = (size_t)a.hk * DK;
    const int L = min(kC, ln.n_rows - t0);
    const size_t row0 = (size_t)ln.first_row + t0;

    /* 0. the chunk's q, k (the head's key head) and v rows in, all at once;
     * the gates meanwhile (a thread a row) */
    const float *mrow = a.mixed + row0 * a.ldm;
    copy_rows_async<kPrepThreads>(Qc, KS, mrow + (size_t)kh * DK, a.ldm, L, DK, tid);
    copy_rows_async<kPrepThreads>(Kc, KS, mrow + key_dim + (size_t)kh * DK, a.ldm, L, DK, tid);
    copy_rows_async<kPrepThreads>(U, dv, mrow + 2 * key_dim + (size_t)h * dv, a.ldm, L, dv, tid);
    cp_async_commit();
    if (tid < L) {
        const size_t gi = (row0 + tid) * a.ldab + h;
        bet[tid] = sigmoidf_(a.b[gi]);
        gg[tid] = __fmul_rn(a.neg_a[h], softplusf_(__fadd_rn(a.a[gi], a.dt_bias[h])));
    }
    cp_async_wait<0>();
    __syncthreads();

    /* 1. q, k normalised in place (a warp per row) */
    for (int i = warp; i < L; i += nwarps) {
        for (int which = 0; which < 2; which++) {
            float *x = (which ? Kc : Qc) + (size_t)i * KS;
            float ss = 0.f;
            for (int r = lane; r < DK; r += 32) ss = fmaf(x[r], x[r], ss);
            ss = warp_sum(ss);
            const float rs = 1.0f / sqrtf(ss + 1e-6f);
            for (int r = lane; r < DK; r += 32)
                x[r] = which ? __fmul_rn(x[r], rs) : __fmul_rn(__fmul_rn(x[r], rs), ca.qscale);
        }
    }
    __syncthreads();
    if (tid == 0) { /* cum in row order, as the CPU */
        float c = 0.f;
        for (int i = 0; i < L; i++) cum[i] = c = __fadd_rn(c, gg[i]);
    }
    __syncthreads();

    /* 2. exp(cum), kd, U = beta v, W = beta k */
    const float last = cum[L - 1];
    for (int i = tid; i < L; i += kPrepThreads) {
        ecum[i] = expf(cum[i]);
        kd[i] = expf(last - cum[i]);
    }
    if (tid == 0) el[0] = expf(last);
    for (int e = tid; e < L * dv; e += kPrepThreads) U[e] = __fmul_rn(U[e], bet[e / dv]);
    for (int e = tid; e < L * DK; e += kPrepThreads) {
        const int i = e / DK, r = e % DK;
        W[(size_t)i * KS + r] = __fmul_rn(Kc[(size_t)i * KS + r], bet[i]);
    }
    __syncthreads();

    /* 3. A[i][j] = (kb_i . k_j) exp(cum_i - cum_j), j < i */
    pair_weights<DK, kPrepThreads>(A, W, Kc, cum, L, true, warp, lane);
    __syncthreads();

    /* 4. W_i = kb_i exp(cum_i) */
    for (int e = tid; e < L * DK; e += kPrepThreads) {
        const int i = e / DK, r = e % DK;
        W[(size_t)i * KS + r] = __fmul_rn(W[(size_t)i * KS + r], ecum[i]);
    }
    __syncthreads();

    /* 5. forward substitution, a thread per column of W (dk) and U (dv):
     * row i minus the solved rows j < i, in order */
    for (int col = tid; col < DK + dv; col += kPrepThreads) {
        float *X = col < DK ? W + col : U + (col - DK);
        const int st = col < DK ? KS : dv;
        forward_substitute(X, st, A, L);
    }
    __syncthreads();

    /* 6. the output weights: A <- (q_i . k_j) exp(cum_i - cum_j), j <= i */
    pair_weights<DK, kPrepThreads>(A, Qc, Kc, cum, L, false, warp, lane);
    __syncthreads();

    /* out in float4s (the workspace and its slots are 16-byte aligned) */
    const Slot so(DK, dv);
    float *g = a.ws + (((size_t)blockIdx.z * ca.nc + cy) * a.hv + h) * so.floats;
    for (int e = tid; e < L * DK / 4; e += kPrepThreads) {
        const int i = e / (DK / 4), r = 4 * (e % (DK / 4));
        const size_t sp = (size_t)i * KS + r, gp = (size_t)i * DK + r;
        const float4 q = *reinterpret_cast<const float4 *>(Qc + sp), k = *reinterpret_cast<const float4 *>(Kc + sp);
        const float ec = ecum[i], d = kd[i];
        *reinterpret_cast<float4 *>(g + so.q + gp) =
            make_float4(__fmul_rn(q.x, ec), __fmul_rn(q.y, ec), __fmul_rn(q.z, ec), __fmul_rn(q.w, ec));
        *reinterpret_cast<float4 *>(g + so.k + gp) =
            make_float4(__fmul_rn(k.x, d), __fmul_rn(k.y, d), __fmul_rn(k.z, d), __fmul_rn(k.w, d));
        *reinterpret_cast<float4 *>(g + so.w + gp) = *reinterpret_cast<const float4 *>(W + sp);
    }
    for (int e = tid; e < L * dv / 4; e += kPrepThreads)
        reinterpret_cast<float4 *>(g + so.u)[e] = reinterpret_cast<const float4 *>(U)[e];
    for (int e = tid; e < L * kC / 4; e += kPrepThreads)
        reinterpret_cast<float4 *>(g + so.a)[e] = reinterpret_cast<const float4 *>(A)[e];
    for (int i = tid; i < L; i += kPrepThreads) g[so.ec + i] = ecum[i], g[so.kd + i] = kd[i];
    if (tid == 0) g[so.el] = el[0];
}

/* Part 2, the state's pass: one block per (value head, lane) (or a cluster
 * of ns, each on dv / ns columns) walks chunks [c0, c0 + nc) of its lane
 * in order with the state S in shared memory: the chunk's prepared parts
 * are copied in, then vnew = U - W S, the outputs, the state update. */
template <int DK>
__global__ void __launch_bounds__(kThreads, 1) gdn_chunk_state_kernel(const ChunkArgs ca) {
    pdl_begin();
    constexpr int KS = Plan<DK>::KS;
    const splash_cuda_gdn_args &a = ca.p;
    extern __shared__ __align__(16) float sm[];
    const int ns = ca.ns, h = blockIdx.x / ns, rank = blockIdx.x % ns; /* rank in the head's cluster */
    const int dvf = a.dv, dv = dvf / ns, cs = rank * dv; /* the head's columns; this block's: [cs, cs + dv) */
    float *S = sm;                                   /* [DK][dv] */
    float *Kc = S + (size_t)DK * dv;                 /* [kC][KS] */
    float *Qc = Kc + (size_t)kC * KS;                /* [kC][KS], then the gate z [kC][dv] */
    float *W = Qc + Plan<DK>::w_floats(dv);          /* [kC][KS], then outputs [kC][dv] */
    float *U = W + Plan<DK>::w_floats(dv);           /* [kC][dv] */
    float *A = U + (size_t)kC * dv;                  /* [kC][AS] */
    float *ecum = A + (size_t)kC * Plan<DK>::AS, *kd = ecum + kC;
    float *el = kd + kC;                             /* [1] exp(cum_L) */
    float *rss = el + kC;                            /* [4][kC] sums of o^2 over each quarter of dvf */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = kThreads / 32;
    const splash_cuda_gdn_lane ln = a.lanes[blockIdx.y];
    const size_t hs = (size_t)DK * dvf;
    const int n_chunks = (ln.n_rows + kC - 1) / kC, c1 = min(ca.c0 + ca.nc, n_chunks);
    if (ca.c0 >= c1) return; /* the whole cluster: same lane */

    /* the state: the lane's before its first chunk, else where the last launch left it */
    const float *Sin = (ca.c0 ? ln.s_out : ln.s_in) + (size_t)h * hs + cs;
    for (int e = tid; e < DK * dv; e += kThreads) S[e] = Sin[(size_t)(e / dv) * dvf + e % dv];

    const Slot so(DK, dvf);
    auto slot_at = [&](int c) { return a.ws + (((size_t)blockIdx.y * ca.nc + (c - ca.c0)) * a.hv + h) * so.floats; };
    for (int c = ca.c0; c < c1; c++) {
        const int t0 = c * kC, L = min(kC, ln.n_rows - t0);
        const size_t row0 = (size_t)ln.first_row + t0;
        __syncthreads(); /* the previous chunk is done with every buffer (and S is loaded) */
        const float *g = slot_at(c);
        copy_rows_async<kThreads>(Qc, KS, g + so.q, DK, L, DK, tid);
        copy_rows_async<kThreads>(Kc, KS, g + so.k, DK, L, DK, tid);
        copy_rows_async<kThreads>(W, KS, g + so.w, DK, L, DK, tid);
        copy_rows_async<kThreads>(U, dv, g + so.u + cs, dvf, L, dv, tid);
        copy_rows_async<kThreads>(A, Plan<DK>::AS, g + so.a, kC, L, kC, tid);
        copy_rows_async<kThreads>(ecum, 0, g + so.ec, 0, 1, 2 * kC + 4, tid); /* ecum | kd | el, as in the slot */
        cp_async_commit();
        if (c + 1 < c1) { /* the next chunk's slot: from HBM into L2 while this one computes */
            const char *nx = reinterpret_cast<const char *>(slot_at(c + 1));
            for (size_t off = (size_t)tid * 128; off < (size_t)so.floats * sizeof(float); off += (size_t)kThreads * 128)
                prefetch_l2(nx + off);
        }
        cp_async_wait<0>();
        __syncthreads();

        /* 6. vnew = U - W S (into U) */
        constexpr int TC = 2; /* 4 x TC output tiles, columns fastest across threads */
        const int nti = (L + 3) / 4, ntc = dv / TC;
        for (int t = tid; t < nti * ntc; t += kThreads) {
            const int i0 = 4 * (t / ntc), c0 = TC * (t % ntc);
            float acc[4][TC] = {};
            rows_times_state<DK, TC>(acc, W, i0, S, dv, c0);
#pragma unroll
            for (int ii = 0; ii < 4; ii++)
                if (i0 + ii < L)
#pragma unroll
                    for (int k = 0; k < TC; k++) {
                        float *u = U + (size_t)(i0 + ii) * dv + c0 + k;
                        *u = __fsub_rn(*u, acc[ii][k]);
                    }
        }
        __syncthreads();

        /* 7. o_i = (q_i exp(cum_i)) S + sum_{j<=i} A[i][j] vnew_j  (into the W buffer; Qc
         * holds q exp(cum)) */
        float *O = W;
        for (int t = tid; t < nti * ntc; t += kThreads) {
            const int i0 = 4 * (t / ntc), c0 = TC * (t % ntc);
            float t1[4][TC] = {}, t2[4][TC] = {};
            rows_times_state<DK, TC>(t1, Qc, i0, S, dv, c0);
            const int jmax = min(i0 + 3, L - 1);
            for (int jb = 0; jb <= jmax; jb += 4) { /* a float4 of each A row covers 4 j */
                float4 a4[4];
#pragma unroll
                for (int ii = 0; ii < 4; ii++)
                    a4[ii] = *reinterpret_cast<const float4 *>(A + (size_t)(i0 + ii) * Plan<DK>::AS + jb);
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const int j = jb + k;
                    if (j > jmax) break;
                    float uj[TC];
                    ld_cols<TC>(uj, U + (size_t)j * dv + c0);
#pragma unroll
                    for (int ii = 0; ii < 4; ii++)
                        if (j <= i0 + ii) fma_cols<TC>(t2[ii], lane4(a4[ii], k), uj);
                }
            }
#pragma unroll
            for (int ii = 0; ii < 4; ii++)
                if (i0 + ii < L)
#pragma unroll
                    for (int k = 0; k < TC; k++) O[(size_t)(i0 + ii) * dv + c0 + k] = __fadd_rn(t1[ii][k], t2[ii][k]);
        }
        __syncthreads();
        /* the gate z of the chunk's rows into the Qc buffer (free now), read in 8b */
        float *Z = Qc;
        if (a.y) {
            copy_rows_async<kThreads>(Z, dv, a.z + row0 * a.ldz + (size_t)h * dvf + cs, a.ldz, L, dv, tid);
            cp_async_commit();
        }
        /* 8a. S = S exp(cum_L) + sum_i (k_i kd_i) (x) vnew_i  (Kc holds k kd) */
        const float e_l = el[0];
        const int ntc4 = dv / 4; /* 4 x 4 tiles here: DK / 4 x dv / 4 of them are enough threads */
        for (int t = tid; t < (DK / 4) * ntc4; t += kThreads) {
            const int r0 = 4 * (t / ntc4), c0 = 4 * (t % ntc4);
            float acc[4][4] = {};
            for (int i = 0; i < L; i++) {
                const float4 u4 = *reinterpret_cast<const float4 *>(U + (size_t)i * dv + c0);
                const float4 k4 = *reinterpret_cast<const float4 *>(Kc + (size_t)i * KS + r0);
                fma4(acc[0], k4.x, u4), fma4(acc[1], k4.y, u4), fma4(acc[2], k4.z, u4), fma4(acc[3], k4.w, u4);
            }
#pragma unroll
            for (int rr = 0; rr < 4; rr++)
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    float *sp = S + (size_t)(r0 + rr) * dv + c0 + k;
                    *sp = __fadd_rn(__fmul_rn(*sp, e_l), acc[rr][k]);
                }
        }
        /* 8b. outputs: o, and the gated norm over the head's dvf columns (a
         * warp per row): sums of o^2 per quarter of dvf, added in quarter
         * order whatever ns is, so a lane's numbers do not depend on how
         * many blocks its head had (that depends on the batch) */
        const size_t oc = (size_t)h * dvf + cs;
        const int dq = dvf / 4, q0 = rank * 4 / ns, q1 = (rank + 1) * 4 / ns;
        for (int i = warp; i < L; i += nwarps) {
            const size_t row = row0 + i;
            const float *oi = O + (size_t)i * dv;
            if (a.o)
                for (int c = lane; c < dv; c += 32) a.o[row * a.ldo + oc + c] = oi[c];
            if (a.y)
                for (int q = q0; q < q1; q++) {
                    float ss = 0.f;
                    for (int c = q * dq - cs + lane; c < (q + 1) * dq - cs; c += 32) ss = fmaf(oi[c], oi[c], ss);
                    ss = warp_sum(ss);
                    if (lane == 0) rss[q * kC + i] = ss;
                }
        }
        if (a.y) {
            cp_async_wait<0>(); /* Z: this thread's copies; the barrier makes every thread's visible */
            if (ns > 1) cg::this_cluster().sync(); else __syncthreads();
            for (int i = warp; i < L; i += nwarps) {
                const size_t row = row0 + i;
                const float *oi = O + (size_t)i * dv;
                float ss = 0.f;
                for (int q = 0; q < 4; q++) {
                    const int owner = q * ns / 4; /* the rank that summed quarter q */
                    const float *r = owner == rank ? rss : cg::this_cluster().map_shared_rank(rss, owner);
                    ss = __fadd_rn(ss, r[q * kC + i]);
                }
                const float rs = 1.0f / sqrtf(ss / (float)dvf + a.eps);
                for (int c = lane; c < dv; c += 32)
                    a.y[row * a.ldy + oc + c] =
                        __fmul_rn(__fmul_rn(a.norm_w[cs + c], __fmul_rn(oi[c], rs)), siluf_(Z[(size_t)i * dv + c]));
            }
            if (ns > 1) cg::this_cluster().sync(); /* the peers are done reading rss */
        }
    }
    __syncthreads();
    float *So = ln.s_out + (size_t)h * hs + cs;
    for (int e = tid; e < DK * dv; e += kThreads) So[(size_t)(e / dv) * dvf + e % dv] = S[e];
}

/* How many clusters of ns state-pass blocks (dv / ns columns each) the GPU
 * holds at once: clusters live inside a GPC, so the SM count alone does
 * not tell.  Asked once per (ns, columns) and remembered; a forward of a new
 * batch shape runs eagerly before the model captures it (cuda_graphs.cu), so
 * the first ask never falls inside a graph capture. */
template <int DK>
int clusters_resident(int ns, int dv) {
    static int known[3][SPLASH_CUDA_GDN_MAX_DV / 4 + 1]; /* [ns 1, 2, 4][block columns / 4]; 0: not asked yet */
    int &n = known[ns == 4 ? 2 : ns - 1][dv / ns / 4];
    if (!n) {
        KernelLaunch c(dim3((unsigned)ns, 1, 1), dim3(kThreads, 1, 1), Plan<DK>::floats(dv / ns) * sizeof(float), 0,
                       (unsigned)ns, false);
        int got = 0;
        if (cudaOccupancyMaxActiveClusters(&got, gdn_chunk_state_kernel<DK>, &c.lc) != cudaSuccess || got < 1)
            got = -1, (void)cudaGetLastError(); /* unknown: this split is not taken */
        n = got;
    }
    return n;
}

template <int DK>
int launch_chunked(const ChunkArgs &ca_in, int max_split, cudaStream_t s) {
    static bool attr_set = false; /* once per instantiation; setting it again is harmless */
    const size_t prep_smem = (3 * (size_t)kC * Plan<DK>::KS + (size_t)kC * SPLASH_CUDA_GDN_MAX_DV + (size_t)kC * kC +
                              6 * (size_t)kC) * sizeof(float);
    if (!attr_set) {
        SPLASH_CUDA_TRY(cudaFuncSetAttribute(gdn_chunk_state_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)(Plan<DK>::floats(SPLASH_CUDA_GDN_MAX_DV) * sizeof(float))));
        SPLASH_CUDA_TRY(cudaFuncSetAttribute(gdn_chunk_prep_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)prep_smem));
        attr_set = true;
    }
    /* Split each head's columns over 2 or 4 blocks (a cluster) while the
     * heads alone leave SMs idle (one 27B lane: 48 heads on 132 SMs; the
     * 35B-A3B's 32), as long as every block is resident at once (a block
     * walks all its chunks: a second wave would double the time).  The
     * state pass's work is all dv-side (the prep made the k-side), so it
     * divides; each block still copies the chunk's q, k, W and A. */
    ChunkArgs ca = ca_in;
    ca.ns = 1;
    for (int ns = max_split; ns >= 2; ns /= 2) /* whole 4 x 4 tiles a block */
        if (ca.p.dv % (4 * ns) == 0 &&
            clusters_resident<DK>(ns, ca.p.dv) >= ca.p.hv * ca.p.n_lanes) {
            ca.ns = ns;
            break;
        }
    SPLASH_CUDA_TRY(launch_kernel(gdn_chunk_prep_kernel<DK>, dim3((unsigned)ca.p.hv, (unsigned)ca.nc, (unsigned)ca.p.n_lanes),
                                  kPrepThreads, prep_smem, s, ca));
    KernelLaunch c(dim3((unsigned)(ca.p.hv * ca.ns), (unsigned)ca.p.n_lanes, 1), dim3(kThreads, 1, 1),
                   Plan<DK>::floats(ca.p.dv / ca.ns) * sizeof(float), s, (unsigned)ca.ns);
    SPLASH_CUDA_TRY(cudaLaunchKernelEx(&c.lc, gdn_chunk_state_kernel<DK>, ca));
    return SPLASH_OK;
}

} /* namespace */

extern "C" int splash_cuda_gdn_chunked(const splash_cuda_gdn_args *a, struct CUstream_st *stream) {
    const int rc = splash_cuda_gdn_args_check(a);
    if (rc || a->n_lanes == 0) return rc;
    if (a->dv % 4) return SPLASH_E_UNSUPPORTED; /* the 4 x 4 output tiles */
    ChunkArgs ca;
    ca.p = *a;
    /* SPLASH_CUDA_GDN_SPLIT=1|2 caps the state pass's split of a head (4;
     * launch_chunked): an A/B switch */
    static const int max_split = [] {
        const char *e = getenv("SPLASH_CUDA_GDN_SPLIT");
        return e && (atoi(e) == 1 || atoi(e) == 2) ? atoi(e) : 4;
    }();
    ca.qscale = (float)pow((double)a->dk, -0.5); /* as the CPU (gdn.c) */
    /* the lanes' chunks in groups the workspace holds: a prep launch makes
     * a group's chunks (every lane's, in parallel), the state pass walks them */
    const size_t per = slot_floats(a->hv, a->dk, a->dv) * (size_t)a->n_lanes;
    const int chunks = (a->max_lane_rows + kC - 1) / kC;
    if (!a->ws || a->ws_floats < per || a->max_lane_rows < 1) return SPLASH_E_INVALID;
    const size_t fit = a->ws_floats / per;
    const int group = fit < (size_t)chunks ? (int)fit : chunks;
    const cudaStream_t s = (cudaStream_t)stream;
    for (ca.c0 = 0; ca.c0 < chunks; ca.c0 += group) {
        ca.nc = chunks - ca.c0 < group ? chunks - ca.c0 : group;
        int rc2;
        switch (a->dk) {
        case 32: rc2 = launch_chunked<32>(ca, max_split, s); break;
        case 64: rc2 = launch_chunked<64>(ca, max_split, s); break;
        case 128: rc2 = launch_chunked<128>(ca, max_split, s); break;
        default: return SPLASH_E_UNSUPPORTED;
        }
        if (rc2) return rc2;
    }
    return SPLASH_OK;
}

extern "C" size_t splash_cuda_gdn_chunked_ws_floats(int hv, int dk, int dv, int n_lanes, int chunks) {
    if (hv < 1 || dk < 1 || dv < 1 || n_lanes < 1 || chunks < 1) return 0;
    return slot_floats(hv, dk, dv) * (size_t)n_lanes * (size_t)chunks;
}
