/* q4_plan.cuh - the plan of a grouped q4 product (q4_matmul.h,
 * splash_q4_group_plan): a block's device code, shared by the plan's own
 * kernel (q4_matmul.cu) and the MoE route, which builds it right after
 * choosing the experts (moe.cu: no launch of its own).
 *
 * Layout (int32): [0] the number of groups; group g at 1 + kPlanInts g:
 * expert, size n (1..gmax), then n slots (4 entries).  gmax (2 or 4) is
 * splash_q4_plan_group()'s: the grouped product's kernel for plans takes that
 * many x rows.  A slot's rank is the number of earlier slots of its expert;
 * ranks 0, gmax, 2 gmax.. lead a group, the groups numbered in slot order,
 * each the next slots of its expert in slot order.  Out-of-range ids are in
 * no group.  Deterministic: the same ids give the same plan.
 *
 * Device-only C++; every function is inline.
 */
#ifndef SPLASH_CUDA_Q4_PLAN_CUH
#define SPLASH_CUDA_Q4_PLAN_CUH

#include <cuda_runtime.h>
#include <stdint.h>

namespace splash_cuda {

constexpr int kPlanInts = 6;     /* a group: expert, size, up to 4 slots */
constexpr int kPlanSlots = 1024; /* slots a plan takes at most (one block) */

/* Every thread of the block calls it (it holds barriers); idx is read after
 * the first barrier, so the block's own writes to it before the call count.
 * sid, lead: shared arrays of kPlanSlots.  O(S^2) compares: a verify block's
 * 16 rows x 9 slots is ~20,000. */
__device__ __forceinline__ void group_plan_block(const int32_t *idx, int S, int n_experts, int32_t *plan,
                                                 int32_t *sid, int *lead, int gmax) {
    __syncthreads();
    for (int i = threadIdx.x; i < S; i += blockDim.x) {
        const int e = idx[i];
        sid[i] = e >= 0 && e < n_experts ? e : -1;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < S; i += blockDim.x) {
        int rank = 0;
        for (int j = 0; j < i; j++) rank += sid[j] == sid[i];
        lead[i] = sid[i] >= 0 && rank % gmax == 0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < S; i += blockDim.x) {
        if (!lead[i]) continue;
        int g = 0;
        for (int j = 0; j < i; j++) g += lead[j];
        int32_t *gp = plan + 1 + kPlanInts * g;
        int n = 0;
        for (int j = i; j < S && n < gmax; j++)
            if (sid[j] == sid[i]) gp[2 + n++] = j;
        gp[0] = sid[i], gp[1] = n;
    }
    if (threadIdx.x == 0) {
        int ng = 0;
        for (int j = 0; j < S; j++) ng += lead[j];
        plan[0] = ng;
    }
}

} /* namespace splash_cuda */

#endif
