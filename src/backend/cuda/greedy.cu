/* greedy.cu - a step's greedy decisions on the GPU (greedy.h). */
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/greedy.h"

namespace {

/* One thread a lane: a few tens of compares; the launch is what it costs. */
__global__ void greedy_decide_kernel(const splash_cuda_greedy_lane *lanes, int n, const int32_t *top_ids,
                                     const float *top_vals, int top_k, int vocab, const int32_t *tokens,
                                     const int32_t *stop, int n_stop, splash_greedy_result *res,
                                     splash_cuda_gdn_lane *commit, int n_gdn, int n_commit) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const splash_cuda_greedy_lane l = lanes[i];
    splash_greedy_result r;
    splash_greedy_decide(top_ids + (size_t)l.head * top_k, top_vals + (size_t)l.head * top_k, (size_t)top_k, vocab,
                         tokens + l.row + 1, l.n_feed, l.n_props, l.limit, stop, n_stop, &r);
    res[i] = r;
    if (l.commit >= 0)
        for (int g = 0; g < n_gdn; g++) commit[(size_t)g * n_commit + l.commit].n_rows = r.c;
}

} // namespace

extern "C" int splash_cuda_greedy_decide(const splash_cuda_greedy_lane *lanes, int n, const int32_t *top_ids,
                                         const float *top_vals, int top_k, int vocab, const int32_t *tokens,
                                         const int32_t *stop, int n_stop, splash_greedy_result *res,
                                         splash_cuda_gdn_lane *commit, int n_gdn, int n_commit,
                                         struct CUstream_st *stream) {
    if (n < 0 || (n && (!lanes || !top_ids || !top_vals || !tokens || !res)) || top_k < 1 || vocab < 1 ||
        n_stop < 0 || n_stop > SPLASH_GREEDY_MAX_STOP || (n_stop && !stop) || n_gdn < 0 ||
        (n_gdn && (!commit || n_commit < 1)))
        return SPLASH_E_INVALID;
    if (!n) return SPLASH_OK;
    greedy_decide_kernel<<<(n + 63) / 64, 64, 0, (cudaStream_t)stream>>>(lanes, n, top_ids, top_vals, top_k, vocab,
                                                                          tokens, stop, n_stop, res, commit, n_gdn,
                                                                          n_commit);
    SPLASH_CUDA_LAUNCHED();
    return SPLASH_OK;
}
