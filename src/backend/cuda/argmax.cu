/* argmax.cu - two-pass argmax per row (argmax.h).  Pass 1: grid (chunks,
 * rows), 256 threads, each thread scans its columns in ascending order
 * (strict >, so the lowest index wins a tie), then a tree merge that also
 * prefers the lower index on equal values.  Pass 2: one block per row merges
 * the chunk results the same way. */
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/argmax.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"

using namespace splash_cuda;

namespace {

constexpr int kChunk = 4096;
constexpr int kThreads = 256;

struct Best {
    float v;
    int i; /* -1: none */
};

__device__ __forceinline__ Best better(Best a, Best b) {
    if (b.i < 0) return a;
    if (a.i < 0 || b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
    return a;
}

__device__ Best block_best(Best b) {
    __shared__ float sv[kThreads / 32];
    __shared__ int si[kThreads / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        Best x;
        x.v = __shfl_xor_sync(kFull, b.v, o);
        x.i = __shfl_xor_sync(kFull, b.i, o);
        b = better(b, x);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) sv[warp] = b.v, si[warp] = b.i;
    __syncthreads();
    Best r = {-INFINITY, -1};
    for (int w = 0; w < kThreads / 32; w++) r = better(r, Best{sv[w], si[w]});
    return r;
}

__global__ void argmax_chunks(const float *x, size_t ldx, int n, int chunks, float *pv, int *pi) {
    pdl_begin();
    const int row = blockIdx.y, c0 = blockIdx.x * kChunk, c1 = min(n, c0 + kChunk);
    const float *xr = x + (size_t)row * ldx;
    Best b = {-INFINITY, -1};
    for (int c = c0 + threadIdx.x; c < c1; c += kThreads) {
        const float v = xr[c];
        if (v > b.v) b.v = v, b.i = c; /* NaN and -inf never pass */
    }
    b = block_best(b);
    if (threadIdx.x == 0) {
        pv[(size_t)row * chunks + blockIdx.x] = b.v;
        pi[(size_t)row * chunks + blockIdx.x] = b.i;
    }
}

__global__ void argmax_rows(const float *pv, const int *pi, int chunks, int32_t *idx, float *val) {
    pdl_begin();
    const int row = blockIdx.x;
    Best b = {-INFINITY, -1};
    for (int c = threadIdx.x; c < chunks; c += kThreads)
        b = better(b, Best{pv[(size_t)row * chunks + c], pi[(size_t)row * chunks + c]});
    b = block_best(b);
    if (threadIdx.x == 0) {
        idx[row] = b.i;
        if (val) val[row] = b.i >= 0 ? b.v : -INFINITY;
    }
}

int n_chunks(int n) { return (n + kChunk - 1) / kChunk; }

} /* namespace */

extern "C" size_t splash_cuda_argmax_workspace_bytes(int rows, int n) {
    if (rows < 1 || n < 1) return 0;
    const size_t pairs = (size_t)rows * n_chunks(n);
    return ((pairs * sizeof(float) + 255) & ~(size_t)255) + pairs * sizeof(int);
}

extern "C" int splash_cuda_argmax(const float *x, size_t ldx, int rows, int n, int32_t *idx, float *val,
                                  void *workspace, size_t workspace_bytes, struct CUstream_st *stream) {
    if (!x || !idx || !workspace || rows < 0 || rows > 65535 || n < 1 || ldx < (size_t)n) return SPLASH_E_INVALID;
    if (!rows) return SPLASH_OK;
    if (workspace_bytes < splash_cuda_argmax_workspace_bytes(rows, n)) return SPLASH_E_RANGE;
    const int chunks = n_chunks(n);
    const size_t pairs = (size_t)rows * chunks;
    float *pv = (float *)workspace;
    int *pi = (int *)((uint8_t *)workspace + ((pairs * sizeof(float) + 255) & ~(size_t)255));
    const cudaStream_t s = (cudaStream_t)stream;
    SPLASH_CUDA_TRY(launch_kernel(argmax_chunks, dim3((unsigned)chunks, (unsigned)rows), kThreads, 0, s, x, ldx, n,
                                  chunks, pv, pi));
    SPLASH_CUDA_TRY(launch_kernel(argmax_rows, (unsigned)rows, kThreads, 0, s, pv, pi, chunks, idx, val));
    return SPLASH_OK;
}

extern "C" int splash_cuda_lm_head_argmax(const splash_q4_matrix *w, const splash_q4_xprep *xp, float *logits,
                                          int32_t *idx, float *val, void *workspace, size_t workspace_bytes,
                                          struct CUstream_st *stream) {
    if (!w || !xp) return SPLASH_E_INVALID;
    int rc = splash_q4_matmul(w, xp, logits, stream);
    if (rc) return rc;
    return splash_cuda_argmax(logits, (size_t)w->rows, xp->M, w->rows, idx, val, workspace, workspace_bytes, stream);
}
