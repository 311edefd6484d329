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
 * One block of 256 threads per (value head, lane) walks the lane's chunks in
 * order with everything in shared memory (~210 KB at dk = dv = 128): the
 * state S [dk][dv], the chunk's k, q and W [64][dk+1] (rows padded by one
 * float so that a thread per (i, j) pair reads 32 banks), U [64][dv], A
 * [64][64].  Each phase is a loop over output elements with the column index
 * fastest across threads (so row operands are broadcasts and column operands
 * consecutive), separated by barriers.  Sums run in the CPU's order (over r
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
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/gdn.h"

using namespace splash_cuda;

namespace {

constexpr int kC = SPLASH_CUDA_GDN_CHUNK;
constexpr int kThreads = 256;

struct ChunkArgs {
    splash_cuda_gdn_args p;
    float qscale;
};

/* Shared-memory plan in floats (dv runtime). */
template <int DK>
struct Plan {
    static constexpr int KS = DK + 1; /* padded row stride of Kc, Qc, W */
    __host__ __device__ static size_t w_floats(int dv) {
        return (size_t)kC * (KS > dv ? KS : dv); /* W, later the chunk's outputs [L][dv] */
    }
    __host__ __device__ static size_t floats(int dv) {
        return (size_t)DK * dv + 2 * (size_t)kC * KS + w_floats(dv) + (size_t)kC * dv + (size_t)kC * kC + 6 * kC;
    }
};

template <int DK>
__global__ void __launch_bounds__(kThreads, 1) gdn_chunked_kernel(const ChunkArgs ca) {
    constexpr int KS = Plan<DK>::KS;
    const splash_cuda_gdn_args &a = ca.p;
    extern __shared__ __align__(16) float sm[];
    const int dv = a.dv, h = blockIdx.x;
    float *S = sm;                                   /* [DK][dv] */
    float *Kc = S + (size_t)DK * dv;                 /* [kC][KS] */
    float *Qc = Kc + (size_t)kC * KS;                /* [kC][KS] */
    float *W = Qc + (size_t)kC * KS;                 /* [kC][KS], then outputs [kC][dv] */
    float *U = W + Plan<DK>::w_floats(dv);           /* [kC][dv] */
    float *A = U + (size_t)kC * dv;                  /* [kC][kC] */
    float *cum = A + (size_t)kC * kC, *ecum = cum + kC, *kd = ecum + kC, *bet = kd + kC, *gg = bet + kC;
    float *el = gg + kC;                             /* [1] exp(cum_L) */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = kThreads / 32;
    const splash_cuda_gdn_lane ln = a.lanes[blockIdx.y];
    const int kh = h / (a.hv / a.hk);
    const size_t key_dim = (size_t)a.hk * DK, hs = (size_t)DK * dv;

    const float *Sin = ln.s_in + (size_t)h * hs;
    for (int e = tid; e < DK * dv; e += kThreads) S[e] = Sin[e];

    for (int t0 = 0; t0 < ln.n_rows; t0 += kC) {
        const int L = min(kC, ln.n_rows - t0);
        const size_t row0 = (size_t)ln.first_row + t0;
        __syncthreads(); /* the previous chunk is done with every buffer (and S is loaded) */

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
        for (int i = tid; i < L; i += kThreads) {
            ecum[i] = expf(cum[i]);
            kd[i] = expf(last - cum[i]);
        }
        if (tid == 0) el[0] = expf(last);
        for (int e = tid; e < L * dv; e += kThreads) {
            const int i = e / dv, c = e % dv;
            U[(size_t)i * dv + c] = __fmul_rn(a.mixed[(row0 + i) * a.ldm + 2 * key_dim + (size_t)h * dv + c], bet[i]);
        }
        for (int e = tid; e < L * DK; e += kThreads) {
            const int i = e / DK, r = e % DK;
            W[(size_t)i * KS + r] = __fmul_rn(Kc[(size_t)i * KS + r], bet[i]);
        }
        __syncthreads();

        /* 3. A[i][j] = (kb_i . k_j) exp(cum_i - cum_j), j < i */
        for (int p = tid; p < L * L; p += kThreads) {
            const int i = p / L, j = p % L;
            if (j >= i) continue;
            const float *wi = W + (size_t)i * KS, *kj = Kc + (size_t)j * KS;
            float d = 0.f;
            for (int r = 0; r < DK; r++) d = fmaf(wi[r], kj[r], d);
            A[i * kC + j] = __fmul_rn(d, expf(cum[i] - cum[j]));
        }
        __syncthreads();

        /* 4. W_i = kb_i exp(cum_i) */
        for (int e = tid; e < L * DK; e += kThreads) {
            const int i = e / DK, r = e % DK;
            W[(size_t)i * KS + r] = __fmul_rn(W[(size_t)i * KS + r], ecum[i]);
        }
        __syncthreads();

        /* 5. forward substitution, a thread per column of W (dk) and U (dv):
         * row i minus the solved rows j < i, in order */
        for (int col = tid; col < DK + dv; col += kThreads) {
            float *X = col < DK ? W + col : U + (col - DK);
            const int st = col < DK ? KS : dv;
            for (int i = 1; i < L; i++) {
                float x = X[(size_t)i * st];
                for (int j = 0; j < i; j++) x = fmaf(-A[i * kC + j], X[(size_t)j * st], x);
                X[(size_t)i * st] = x;
            }
        }
        __syncthreads();

        /* 6. vnew = U - W S (into U);  A <- (q_i . k_j) exp(cum_i - cum_j), j <= i */
        for (int e = tid; e < L * dv; e += kThreads) {
            const int i = e / dv, c = e % dv;
            const float *wi = W + (size_t)i * KS;
            float t = 0.f;
            for (int r = 0; r < DK; r++) t = fmaf(wi[r], S[(size_t)r * dv + c], t);
            U[(size_t)i * dv + c] = __fsub_rn(U[(size_t)i * dv + c], t);
        }
        for (int p = tid; p < L * L; p += kThreads) {
            const int i = p / L, j = p % L;
            if (j > i) continue;
            const float *qi = Qc + (size_t)i * KS, *kj = Kc + (size_t)j * KS;
            float d = 0.f;
            for (int r = 0; r < DK; r++) d = fmaf(qi[r], kj[r], d);
            A[i * kC + j] = __fmul_rn(d, expf(cum[i] - cum[j]));
        }
        __syncthreads();

        /* 7. o_i = (q_i exp(cum_i)) S + sum_{j<=i} A[i][j] vnew_j  (into the W buffer) */
        float *O = W;
        for (int e = tid; e < L * dv; e += kThreads) {
            const int i = e / dv, c = e % dv;
            const float *qi = Qc + (size_t)i * KS;
            const float ei = ecum[i];
            float t1 = 0.f, t2 = 0.f;
            for (int r = 0; r < DK; r++) t1 = fmaf(__fmul_rn(qi[r], ei), S[(size_t)r * dv + c], t1);
            for (int j = 0; j <= i; j++) t2 = fmaf(A[i * kC + j], U[(size_t)j * dv + c], t2);
            O[(size_t)i * dv + c] = __fadd_rn(t1, t2);
        }
        __syncthreads();

        /* 8a. S = S exp(cum_L) + sum_i (k_i kd_i) (x) vnew_i */
        const float e_l = el[0];
        for (int e = tid; e < DK * dv; e += kThreads) {
            const int r = e / dv, c = e % dv;
            float t = 0.f;
            for (int i = 0; i < L; i++) t = fmaf(__fmul_rn(Kc[(size_t)i * KS + r], kd[i]), U[(size_t)i * dv + c], t);
            S[e] = __fadd_rn(__fmul_rn(S[e], e_l), t);
        }
        /* 8b. outputs: o, and the gated norm (a warp per row) */
        for (int i = warp; i < L; i += nwarps) {
            const size_t row = row0 + i, oc = (size_t)h * dv;
            const float *oi = O + (size_t)i * dv;
            float ss = 0.f;
            for (int c = lane; c < dv; c += 32) {
                ss = fmaf(oi[c], oi[c], ss);
                if (a.o) a.o[row * a.ldo + oc + c] = oi[c];
            }
            if (a.y) {
                ss = warp_sum(ss);
                const float rs = 1.0f / sqrtf(ss / (float)dv + a.eps);
                for (int c = lane; c < dv; c += 32)
                    a.y[row * a.ldy + oc + c] =
                        __fmul_rn(__fmul_rn(a.norm_w[c], __fmul_rn(oi[c], rs)), siluf_(a.z[row * a.ldz + oc + c]));
            }
        }
    }
    __syncthreads();
    float *So = ln.s_out + (size_t)h * hs;
    for (int e = tid; e < DK * dv; e += kThreads) So[e] = S[e];
}

template <int DK>
int launch_chunked(const ChunkArgs &ca, cudaStream_t s) {
    static bool attr_set = false; /* once per instantiation; setting it again is harmless */
    if (!attr_set) {
        SPLASH_CUDA_TRY(cudaFuncSetAttribute(gdn_chunked_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)(Plan<DK>::floats(SPLASH_CUDA_GDN_MAX_DV) * sizeof(float))));
        attr_set = true;
    }
    const size_t smem = Plan<DK>::floats(ca.p.dv) * sizeof(float);
    gdn_chunked_kernel<DK><<<dim3((unsigned)ca.p.hv, (unsigned)ca.p.n_lanes), kThreads, smem, s>>>(ca);
    SPLASH_CUDA_LAUNCHED();
    return SPLASH_OK;
}

} /* namespace */

extern "C" int splash_cuda_gdn_chunked(const splash_cuda_gdn_args *a, struct CUstream_st *stream) {
    const int rc = splash_cuda_gdn_args_check(a);
    if (rc || a->n_lanes == 0) return rc;
    ChunkArgs ca;
    ca.p = *a;
    ca.qscale = (float)pow((double)a->dk, -0.5); /* as the CPU (gdn.c) */
    const cudaStream_t s = (cudaStream_t)stream;
    switch (a->dk) {
    case 32: return launch_chunked<32>(ca, s);
    case 64: return launch_chunked<64>(ca, s);
    case 128: return launch_chunked<128>(ca, s);
    default: return SPLASH_E_UNSUPPORTED;
    }
}
