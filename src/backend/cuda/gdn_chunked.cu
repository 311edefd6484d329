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
 * in order) then run side by side.  Then one block of 256 threads per
 * (value head, lane) walks the lane's chunks in order (gdn_chunk_state_kernel),
 * copying each chunk's prepared parts in, with everything in shared memory
 * (~210 KB at dk = dv = 128): the
 * state S [dk][dv], the chunk's k, q and W [64][dk+1] (rows padded by one
 * float so that a thread per (i, j) pair reads 32 banks), U [64][dv], A
 * [64][64].  Each phase is a loop over output elements with the column index
 * fastest across threads (so row operands are broadcasts and column operands
 * consecutive), separated by barriers; the three products of dv columns
 * (W S, Q S + A U, K^T U: 3/4 of the arithmetic) give each thread a 4 x 4
 * tile of outputs, so a float4 of S or U and four broadcasts feed 16 FMAs
 * (they were bound by shared-memory loads, two per FMA).  Sums run in the CPU's order (over r
 * or j ascending, fmaf), products are rounded as the CPU rounds them, so
 * the result is close to cpu_gdn_chunked; the q/k norms and the gates are the
 * recurrence kernel's.  The chunk's outputs go through shared memory (the W
 * buffer, free by then) for the gated norm.
 *
 * Plain fp32 on CUDA cores: correct first.  Tensor cores (the A, W S, Q S and
 * K^T U products are small GEMMs) are the next step.
 *
 * C++ used: a template over dk; no STL.
 */
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/gdn.h"

namespace cg = cooperative_groups;
using namespace splash_cuda;

namespace {

constexpr int kC = SPLASH_CUDA_GDN_CHUNK;
constexpr int kThreads = 256;
/* The prep kernel's threads: twice the state pass's (its phases are short
 * loops over independent elements, latency-bound at 8 warps an SM; its
 * ~150 KB of shared memory allows one block an SM either way). */
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
    static constexpr int KS = DK + 1; /* padded row stride of Kc, Qc, W */
    __host__ __device__ static size_t w_floats(int dv) {
        return (size_t)kC * (KS > dv ? KS : dv); /* W, later the chunk's outputs [L][dv] */
    }
    __host__ __device__ static size_t floats(int dv) { /* dv: the block's slice */
        return (size_t)DK * dv + 2 * (size_t)kC * KS + w_floats(dv) + (size_t)kC * dv + (size_t)kC * kC + 10 * kC;
    }
};

/* A prepared chunk in the workspace (floats): q (normalised, scaled), k,
 * W = (I + A)^-1 (beta k exp(cum)) [kC][dk]; U = (I + A)^-1 (beta v)
 * [kC][dv]; the output weights (q_i . k_j) exp(cum_i - cum_j) [kC][kC];
 * exp(cum), exp(cum_L - cum) [kC]; exp(cum_L). */
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

    /* 1. q, k normalised (a warp per row); gates */
    for (int i = warp; i < L; i += nwarps) {
        const float *mrow = a.mixed + (row0 + i) * a.ldm;
        for (int which = 0; which < 2; which++) {
            const float *src = mrow + (size_t)which * key_dim + (size_t)kh * DK;
            float ss = 0.f;
            for (int r = lane; r < DK; r += 32) ss = fmaf(src[r], src[r], ss);
            ss = warp_sum(ss);
            const float rs = 1.0f / sqrtf(ss + 1e-6f);
            float *dst = (which ? Kc : Qc) + (size_t)i * KS;
            for (int r = lane; r < DK; r += 32)
                dst[r] = which ? __fmul_rn(src[r], rs) : __fmul_rn(__fmul_rn(src[r], rs), ca.qscale);
        }
        if (lane == 0) {
            const size_t gi = (row0 + i) * a.ldab + h;
            bet[i] = sigmoidf_(a.b[gi]);
            gg[i] = __fmul_rn(a.neg_a[h], softplusf_(__fadd_rn(a.a[gi], a.dt_bias[h])));
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
    for (int e = tid; e < L * dv; e += kPrepThreads) {
        const int i = e / dv, c = e % dv;
        U[(size_t)i * dv + c] = __fmul_rn(a.mixed[(row0 + i) * a.ldm + 2 * key_dim + (size_t)h * dv + c], bet[i]);
    }
    for (int e = tid; e < L * DK; e += kPrepThreads) {
        const int i = e / DK, r = e % DK;
        W[(size_t)i * KS + r] = __fmul_rn(Kc[(size_t)i * KS + r], bet[i]);
    }
    __syncthreads();

    /* 3. A[i][j] = (kb_i . k_j) exp(cum_i - cum_j), j < i */
    for (int p = tid; p < L * L; p += kPrepThreads) {
        const int i = p / L, j = p % L;
        if (j >= i) continue;
        const float *wi = W + (size_t)i * KS, *kj = Kc + (size_t)j * KS;
        float d = 0.f;
        for (int r = 0; r < DK; r++) d = fmaf(wi[r], kj[r], d);
        A[i * kC + j] = __fmul_rn(d, expf(cum[i] - cum[j]));
    }
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
        for (int i = 1; i < L; i++) {
            float x = X[(size_t)i * st];
#pragma unroll 8 /* the loads of 8 steps ahead of their chain of fmas */
            for (int j = 0; j < i; j++) x = fmaf(-A[i * kC + j], X[(size_t)j * st], x);
            X[(size_t)i * st] = x;
        }
    }
    __syncthreads();

    /* 6. the output weights: A <- (q_i . k_j) exp(cum_i - cum_j), j <= i */
    for (int p = tid; p < L * L; p += kPrepThreads) {
        const int i = p / L, j = p % L;
        if (j > i) continue;
        const float *qi = Qc + (size_t)i * KS, *kj = Kc + (size_t)j * KS;
        float d = 0.f;
        for (int r = 0; r < DK; r++) d = fmaf(qi[r], kj[r], d);
        A[i * kC + j] = __fmul_rn(d, expf(cum[i] - cum[j]));
    }
    __syncthreads();

    const Slot so(DK, dv);
    float *g = a.ws + (((size_t)blockIdx.z * ca.nc + cy) * a.hv + h) * so.floats;
    for (int e = tid; e < L * DK; e += kPrepThreads) {
        const int i = e / DK, r = e % DK;
        g[so.q + e] = Qc[(size_t)i * KS + r], g[so.k + e] = Kc[(size_t)i * KS + r], g[so.w + e] = W[(size_t)i * KS + r];
    }
    for (int e = tid; e < L * dv; e += kPrepThreads) g[so.u + e] = U[e];
    for (int e = tid; e < L * kC; e += kPrepThreads) g[so.a + e] = A[e];
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
    float *Qc = Kc + (size_t)kC * KS;                /* [kC][KS] */
    float *W = Qc + (size_t)kC * KS;                 /* [kC][KS], then outputs [kC][dv] */
    float *U = W + Plan<DK>::w_floats(dv);           /* [kC][dv] */
    float *A = U + (size_t)kC * dv;                  /* [kC][kC] */
    float *ecum = A + (size_t)kC * kC, *kd = ecum + kC;
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
    for (int c = ca.c0; c < c1; c++) {
        const int t0 = c * kC, L = min(kC, ln.n_rows - t0);
        const size_t row0 = (size_t)ln.first_row + t0;
        __syncthreads(); /* the previous chunk is done with every buffer (and S is loaded) */
        const float *g = a.ws + (((size_t)blockIdx.y * ca.nc + (c - ca.c0)) * a.hv + h) * so.floats;
        for (int e = tid; e < L * DK; e += kThreads) {
            const int i = e / DK, r = e % DK;
            Qc[(size_t)i * KS + r] = g[so.q + e], Kc[(size_t)i * KS + r] = g[so.k + e];
            W[(size_t)i * KS + r] = g[so.w + e];
        }
        for (int e = tid; e < L * dv; e += kThreads) {
            const int i = e / dv, col = e % dv;
            U[e] = g[so.u + (size_t)i * dvf + cs + col];
        }
        for (int e = tid; e < L * kC; e += kThreads) A[e] = g[so.a + e];
        for (int i = tid; i < L; i += kThreads) ecum[i] = g[so.ec + i], kd[i] = g[so.kd + i];
        if (tid == 0) el[0] = g[so.el];
        __syncthreads();

        /* 6. vnew = U - W S (into U) */
        const int nti = (L + 3) / 4, ntc = dv / 4; /* 4 x 4 output tiles, columns fastest across threads */
        for (int t = tid; t < nti * ntc; t += kThreads) {
            const int i0 = 4 * (t / ntc), c0 = 4 * (t % ntc);
            float acc[4][4] = {};
            for (int r = 0; r < DK; r++) {
                const float4 s4 = *reinterpret_cast<const float4 *>(S + (size_t)r * dv + c0);
#pragma unroll
                for (int ii = 0; ii < 4; ii++) fma4(acc[ii], W[(size_t)(i0 + ii) * KS + r], s4);
            }
#pragma unroll
            for (int ii = 0; ii < 4; ii++)
                if (i0 + ii < L)
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        float *u = U + (size_t)(i0 + ii) * dv + c0 + k;
                        *u = __fsub_rn(*u, acc[ii][k]);
                    }
        }
        __syncthreads();

        /* 7. o_i = (q_i exp(cum_i)) S + sum_{j<=i} A[i][j] vnew_j  (into the W buffer) */
        float *O = W;
        for (int t = tid; t < nti * ntc; t += kThreads) {
            const int i0 = 4 * (t / ntc), c0 = 4 * (t % ntc);
            float t1[4][4] = {}, t2[4][4] = {}, ei[4];
#pragma unroll
            for (int ii = 0; ii < 4; ii++) ei[ii] = ecum[min(i0 + ii, L - 1)];
            for (int r = 0; r < DK; r++) {
                const float4 s4 = *reinterpret_cast<const float4 *>(S + (size_t)r * dv + c0);
#pragma unroll
                for (int ii = 0; ii < 4; ii++) fma4(t1[ii], __fmul_rn(Qc[(size_t)(i0 + ii) * KS + r], ei[ii]), s4);
            }
            for (int j = 0; j <= min(i0 + 3, L - 1); j++) {
                const float4 u4 = *reinterpret_cast<const float4 *>(U + (size_t)j * dv + c0);
#pragma unroll
                for (int ii = 0; ii < 4; ii++)
                    if (j <= i0 + ii) fma4(t2[ii], A[(i0 + ii) * kC + j], u4);
            }
#pragma unroll
            for (int ii = 0; ii < 4; ii++)
                if (i0 + ii < L)
#pragma unroll
                    for (int k = 0; k < 4; k++) O[(size_t)(i0 + ii) * dv + c0 + k] = __fadd_rn(t1[ii][k], t2[ii][k]);
        }
        __syncthreads();
        /* 8a. S = S exp(cum_L) + sum_i (k_i kd_i) (x) vnew_i */
        const float e_l = el[0];
        for (int t = tid; t < (DK / 4) * ntc; t += kThreads) {
            const int r0 = 4 * (t / ntc), c0 = 4 * (t % ntc);
            float acc[4][4] = {};
            for (int i = 0; i < L; i++) {
                const float4 u4 = *reinterpret_cast<const float4 *>(U + (size_t)i * dv + c0);
                const float kdi = kd[i];
#pragma unroll
                for (int rr = 0; rr < 4; rr++) fma4(acc[rr], __fmul_rn(Kc[(size_t)i * KS + r0 + rr], kdi), u4);
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
                        __fmul_rn(__fmul_rn(a.norm_w[cs + c], __fmul_rn(oi[c], rs)), siluf_(a.z[row * a.ldz + oc + c]));
            }
            if (ns > 1) cg::this_cluster().sync(); /* the peers are done reading rss */
        }
    }
    __syncthreads();
    float *So = ln.s_out + (size_t)h * hs + cs;
    for (int e = tid; e < DK * dv; e += kThreads) So[(size_t)(e / dv) * dvf + e % dv] = S[e];
}

template <int DK>
int launch_chunked(const ChunkArgs &ca, cudaStream_t s) {
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
    /* Split each head's columns over 2 blocks while the heads alone leave
     * SMs idle (one 27B lane: 48 heads on 132 SMs).  The k-side work of a
     * chunk (A, the substitution of W, q k^T) is repeated per block; the
     * dv-side (3/4 of it) is divided.  4 blocks measured slower: 35B-A3B,
     * one lane of 1,024 rows, 2.94 ms at 4 against 2.53 ms for the
     * recurrence (NOTES.md). */
    static int sms = 0;
    if (!sms) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            sms = 1, (void)cudaGetLastError();
    }
    ca.ns = 1;
    if (a->dv % 8 == 0 && (long)a->hv * a->n_lanes * 2 <= sms) ca.ns = 2; /* halves of 4 x 4 tiles */
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
        case 32: rc2 = launch_chunked<32>(ca, s); break;
        case 64: rc2 = launch_chunked<64>(ca, s); break;
        case 128: rc2 = launch_chunked<128>(ca, s); break;
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
