/* moe_route.cuh - one row's expert choice by one warp: what moe.cu's route
 * kernel writes for each row, and what the q4 product's grouped launches
 * that route their own row (q4_matmul.h, splash_q4_route) compute in every
 * block, so the two give the same ids and weights bit for bit.
 *
 * The softmax is the CPU's (max subtracted, expf, divided by the sum; the sum
 * is a warp tree here, not a sequential loop), the top-k is k rounds of a warp
 * argmax (larger p, then lower id; two reduxes a round), and the renormalising
 * sum runs in the order of selection as the CPU's does; the choice is then
 * ranked by id (shuffles).
 *
 * C++ for .cu files: device code only.
 */
#ifndef SPLASH_CUDA_MOE_ROUTE_CUH
#define SPLASH_CUDA_MOE_ROUTE_CUH

#include "backend/cuda/device_util.cuh"

namespace splash_cuda {

/* A lane's part of the choice: lane kk < k holds the kk-th expert chosen,
 * its weight and its rank among the k ids (0 = the lowest). */
struct RouteChoice {
    int id;
    float w;
    int rank;
};

/* The choice of the row x (E logits) by the calling warp, its probabilities
 * in registers (expert lane + 32 j in p[j]; NPL >= E / 32).  A round of the
 * top-k: each lane's best untaken expert (ascending id, strictly larger p),
 * then the warp's largest by one redux over the p's bits (p >= 0, so the bits
 * order as the values; 0 = no candidate, NaN is none) and the lowest id
 * holding it by a second.  No local memory. */
template <int NPL>
__device__ __forceinline__ RouteChoice route_choose(const float *x, int E, int k, int norm) {
    const int lane = threadIdx.x & 31;
    float p[NPL];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < NPL; j++) {
        p[j] = lane + 32 * j < E ? x[lane + 32 * j] : -INFINITY;
        mx = fmaxf(mx, p[j]);
    }
    mx = warp_max(mx);
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < NPL; j++)
        if (lane + 32 * j < E) {
            p[j] = expf(p[j] - mx);
            sum += p[j];
        }
    sum = warp_sum(sum);
#pragma unroll
    for (int j = 0; j < NPL; j++) p[j] = lane + 32 * j < E ? p[j] / sum : -1.f; /* -1: taken (or no expert) */
    RouteChoice c = {0, 0.f, 0};
    for (int kk = 0; kk < k; kk++) {
        float bv = -1.f; /* probabilities are >= 0; taken ones are -1, NaN never compares larger */
        int bj = -1;
#pragma unroll
        for (int j = 0; j < NPL; j++)
            if (p[j] > bv) bv = p[j], bj = j;
        const unsigned key = bj >= 0 ? __float_as_uint(bv) + 1u : 0u;
        const unsigned kmax = __reduce_max_sync(kFull, key);
        int bi;
        if (kmax) {
            bi = __reduce_min_sync(kFull, key == kmax ? lane + 32 * bj : 0x7FFFFFFF);
        } else { /* every untaken p is NaN: the lowest untaken id, as the CPU */
            int lo = 0x7FFFFFFF;
#pragma unroll
            for (int j = NPL - 1; j >= 0; j--)
                if (lane + 32 * j < E && p[j] != -1.f) lo = lane + 32 * j;
            lo = __reduce_min_sync(kFull, lo);
            bi = lo < E ? lo : 0; /* lo < E: k <= E leaves one untaken */
        }
        float own = 0.f; /* the owner lane's p of bi, then taken */
#pragma unroll
        for (int j = 0; j < NPL; j++)
            if (lane + 32 * j == bi) own = p[j], p[j] = -1.f;
        const float w = __shfl_sync(kFull, own, bi & 31);
        if (lane == kk) c.id = bi, c.w = w;
    }
    if (norm) {
        float s = 0.f;
        for (int kk = 0; kk < k; kk++) s += __shfl_sync(kFull, c.w, kk);
        c.w = c.w / s;
    }
    for (int kk = 0; kk < k; kk++) c.rank += __shfl_sync(kFull, c.id, kk) < c.id; /* distinct ids */
    return c;
}

} /* namespace splash_cuda */

#endif
