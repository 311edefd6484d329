/* gdn.cu - Gated DeltaNet conv, gates and the fused recurrence (gdn.h).
 *
 * conv: one thread per (channel, lane, chunk of 64 rows): the taps are summed
 * oldest first (first tap a product, then fmaf), as gdn_conv.c, then SiLU.
 * Only rows < K-1 read the conv state and they are all in chunk 0, whose
 * block also writes the new state after its own reads: no block reads state
 * that another writes.
 *
 * recurrence: one block per (value head, lane), 4 threads per state column
 * (thread = column c, slice s; it holds S[s + 4j][c] for j < dk/4 in
 * registers), so a column's sums over the key dim are a register chain per
 * slice plus two shuffles.  Per row: warp 0 normalises q, warp 1 k (into
 * shared memory), one thread forms exp(g) and beta; a barrier; the decay,
 * m = S^T k, the rank-1 update and o = S^T q in registers; the gated norm is
 * a block sum over the dv columns.  The state is read once at the start and
 * written once at the end.  Consecutive threads hold consecutive columns, so
 * every load and store of S covers whole 32-byte sectors.
 *
 * C++ used: a template over dk (the register array's size); no STL.
 */
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/gdn.h"

using namespace splash_cuda;

namespace {

constexpr int kConvThreads = 128;
constexpr int kConvChunk = 64; /* rows per conv block; >= K - 1 */
constexpr int kSlices = 4;     /* threads per state column */

struct ConvArgs {
    const float *wT;
    const splash_cuda_gdn_lane *lanes;
    const float *x;
    float *y;
    size_t ldx, ldy;
    int C, K;
};

__global__ void gdn_conv_kernel(const ConvArgs a) {
    const int c = blockIdx.x * kConvThreads + threadIdx.x;
    if (c >= a.C) return;
    const splash_cuda_gdn_lane ln = a.lanes[blockIdx.y];
    const int K = a.K, keep = K - 1, C = a.C;
    float *state = ln.conv_state;
    const float *x = a.x + (size_t)ln.first_row * a.ldx + c;
    if (a.y) {
        float *y = a.y + (size_t)ln.first_row * a.ldy + c;
        const int t1 = min(ln.n_rows, (int)(blockIdx.z + 1) * kConvChunk);
        for (int t = blockIdx.z * kConvChunk; t < t1; t++) {
            float acc = 0.f;
            for (int k = 0; k < K; k++) {
                const int j = t - keep + k; /* input row; < 0 lives in the state */
                const float src = j < 0 ? state[(size_t)(keep + j) * C + c] : x[(size_t)j * a.ldx];
                const float w = a.wT[(size_t)k * C + c];
                acc = k ? fmaf(w, src, acc) : __fmul_rn(w, src);
            }
            y[(size_t)t * a.ldy] = siluf_(acc);
        }
    }
    if (blockIdx.z == 0 && ln.update_conv && ln.n_rows > 0) {
        const int n = ln.n_rows;
        float nv[SPLASH_CUDA_GDN_MAX_K - 1];
#pragma unroll
        for (int s = 0; s < SPLASH_CUDA_GDN_MAX_K - 1; s++) {
            if (s < keep) {
                const int j = n - keep + s; /* the input that ends up in slot s */
                nv[s] = j >= 0 ? x[(size_t)j * a.ldx] : state[(size_t)(keep + j) * C + c];
            }
        }
#pragma unroll
        for (int s = 0; s < SPLASH_CUDA_GDN_MAX_K - 1; s++)
            if (s < keep) state[(size_t)s * C + c] = nv[s];
    }
}

__global__ void gdn_gates_kernel(const float *a, const float *b, size_t ldab, const float *neg_a,
                                 const float *dt_bias, int hv, float *g, float *beta, size_t ldgb) {
    const size_t r = blockIdx.y;
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= hv) return;
    beta[r * ldgb + h] = sigmoidf_(b[r * ldab + h]);
    g[r * ldgb + h] = __fmul_rn(neg_a[h], softplusf_(__fadd_rn(a[r * ldab + h], dt_bias[h])));
}

struct RecArgs {
    splash_cuda_gdn_args p;
    float qscale;
};

template <int DK>
__global__ void __launch_bounds__(512) gdn_recurrent_kernel(const RecArgs ra) {
    constexpr int NJ = DK / kSlices;
    const splash_cuda_gdn_args &a = ra.p;
    __shared__ float qn[DK], kn[DK];
    __shared__ float gb[2]; /* exp(g), beta */
    __shared__ float red[32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    const int c = tid >> 2, sl = tid & 3;
    const int dv = a.dv, h = blockIdx.x;
    const bool col = c < dv;
    const splash_cuda_gdn_lane ln = a.lanes[blockIdx.y];
    const int kh = h / (a.hv / a.hk);
    const size_t key_dim = (size_t)a.hk * DK;
    const size_t hs = (size_t)DK * dv;

    float S[NJ];
    const float *Sin = ln.s_in + (size_t)h * hs;
#pragma unroll
    for (int j = 0; j < NJ; j++) S[j] = col ? Sin[(size_t)(sl + kSlices * j) * dv + c] : 0.f;

    for (int t = 0; t < ln.n_rows; t++) {
        const size_t row = (size_t)ln.first_row + t;
        const float *mrow = a.mixed + row * a.ldm;
        for (int task = warp; task < 3; task += nwarps) {
            if (task < 2) { /* 0: q, 1: k of key head kh */
                const float *src = mrow + (size_t)task * key_dim + (size_t)kh * DK;
                float ss = 0.f;
                for (int i = lane; i < DK; i += 32) ss = fmaf(src[i], src[i], ss);
                ss = warp_sum(ss);
                const float rs = 1.0f / sqrtf(ss + 1e-6f);
                float *dst = task ? kn : qn;
                for (int i = lane; i < DK; i += 32)
                    dst[i] = task ? __fmul_rn(src[i], rs) : __fmul_rn(__fmul_rn(src[i], rs), ra.qscale);
            } else if (lane == 0) {
                const float av = a.a[row * a.ldab + h], bv = a.b[row * a.ldab + h];
                const float g = __fmul_rn(a.neg_a[h], softplusf_(__fadd_rn(av, a.dt_bias[h])));
                gb[0] = expf(g);
                gb[1] = sigmoidf_(bv);
            }
        }
        __syncthreads();
        const float decay = gb[0], beta = gb[1];
        const float v = col ? mrow[2 * key_dim + (size_t)h * dv + c] : 0.f;
        float mp = 0.f;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            S[j] = __fmul_rn(S[j], decay);
            mp = fmaf(S[j], kn[sl + kSlices * j], mp);
        }
        mp += __shfl_xor_sync(kFull, mp, 1);
        mp += __shfl_xor_sync(kFull, mp, 2);
        const float delta = __fmul_rn(__fsub_rn(v, mp), beta);
        float op = 0.f;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            S[j] = fmaf(kn[sl + kSlices * j], delta, S[j]);
            op = fmaf(S[j], qn[sl + kSlices * j], op);
        }
        op += __shfl_xor_sync(kFull, op, 1);
        op += __shfl_xor_sync(kFull, op, 2);
        const size_t oc = (size_t)h * dv + c;
        if (a.o && col && sl == 0) a.o[row * a.ldo + oc] = op;
        if (a.y) {
            const float ss = block_sum(col && sl == 0 ? op * op : 0.f, red);
            const float rs = 1.0f / sqrtf(ss / (float)dv + a.eps);
            if (col && sl == 0)
                a.y[row * a.ldy + oc] =
                    __fmul_rn(__fmul_rn(a.norm_w[c], __fmul_rn(op, rs)), siluf_(a.z[row * a.ldz + oc]));
        }
        __syncthreads(); /* qn, kn, gb are rewritten by the next row */
    }

    if (col) {
        float *So = ln.s_out + (size_t)h * hs;
#pragma unroll
        for (int j = 0; j < NJ; j++) So[(size_t)(sl + kSlices * j) * dv + c] = S[j];
    }
}

template <int DK>
int launch_rec(const RecArgs &ra, cudaStream_t s) {
    const int threads = (ra.p.dv + 7) / 8 * 32; /* 8 columns per warp */
    gdn_recurrent_kernel<DK><<<dim3((unsigned)ra.p.hv, (unsigned)ra.p.n_lanes), threads, 0, s>>>(ra);
    SPLASH_CUDA_LAUNCHED();
    return SPLASH_OK;
}

} /* namespace */

extern "C" int splash_cuda_gdn_conv(const float *wT, int C, int K, const splash_cuda_gdn_lane *lanes, int n_lanes,
                                    int max_lane_rows, const float *x, size_t ldx, float *y, size_t ldy,
                                    struct CUstream_st *stream) {
    if (!wT || !lanes || !x || C < 1 || K < 1 || K > SPLASH_CUDA_GDN_MAX_K || n_lanes < 0 || n_lanes > 65535 ||
        max_lane_rows < 0)
        return SPLASH_E_INVALID;
    if (n_lanes == 0 || max_lane_rows == 0) return SPLASH_OK;
    const int chunks = y ? (max_lane_rows + kConvChunk - 1) / kConvChunk : 1;
    if (chunks > 65535) return SPLASH_E_INVALID;
    ConvArgs a = {wT, lanes, x, y, ldx, ldy, C, K};
    gdn_conv_kernel<<<dim3((unsigned)((C + kConvThreads - 1) / kConvThreads), (unsigned)n_lanes, (unsigned)chunks),
                      kConvThreads, 0, (cudaStream_t)stream>>>(a);
    SPLASH_CUDA_LAUNCHED();
    return SPLASH_OK;
}

extern "C" int splash_cuda_gdn_gates(const float *a, const float *b, size_t ldab, const float *neg_a,
                                     const float *dt_bias, int rows, int hv, float *g, float *beta, size_t ldgb,
                                     struct CUstream_st *stream) {
    if (!a || !b || !neg_a || !dt_bias || !g || !beta || rows < 0 || rows > 65535 || hv < 1) return SPLASH_E_INVALID;
    if (rows == 0) return SPLASH_OK;
    gdn_gates_kernel<<<dim3((unsigned)((hv + 63) / 64), (unsigned)rows), 64, 0, (cudaStream_t)stream>>>(
        a, b, ldab, neg_a, dt_bias, hv, g, beta, ldgb);
    SPLASH_CUDA_LAUNCHED();
    return SPLASH_OK;
}

extern "C" int splash_cuda_gdn_args_check(const splash_cuda_gdn_args *a) {
    if (!a || !a->lanes || !a->mixed || !a->a || !a->b || !a->neg_a || !a->dt_bias || a->n_lanes < 0 ||
        a->n_lanes > 65535 || a->hk < 1 || a->hv < 1 || a->hv % a->hk || a->hv > 65535 || a->dv < 1 ||
        (a->y && (!a->z || !a->norm_w)))
        return SPLASH_E_INVALID;
    if (a->dv > SPLASH_CUDA_GDN_MAX_DV) return SPLASH_E_UNSUPPORTED;
    return SPLASH_OK;
}

extern "C" int splash_cuda_gdn_recurrent(const splash_cuda_gdn_args *a, struct CUstream_st *stream) {
    const int rc = splash_cuda_gdn_args_check(a);
    if (rc || a->n_lanes == 0) return rc;
    RecArgs ra;
    ra.p = *a;
    ra.qscale = (float)pow((double)a->dk, -0.5); /* as the CPU (gdn.c) */
    const cudaStream_t s = (cudaStream_t)stream;
    switch (a->dk) {
    case 32: return launch_rec<32>(ra, s);
    case 64: return launch_rec<64>(ra, s);
    case 128: return launch_rec<128>(ra, s);
    default: return SPLASH_E_UNSUPPORTED;
    }
}
