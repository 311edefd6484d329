/* argmax.cu - two-pass argmax per row (argmax.h).  Pass 1: grid (chunks,
 * rows), 256 threads, each thread scans its columns in ascending order
 * (strict >, so the lowest index wins a tie), then a tree merge that also
 * prefers the lower index on equal values.  Pass 2: one block per row merges
 * the chunk results the same way.  The top-k has the same two passes, each
 * block taking its k best by k rounds of a block-wide first. */
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

constexpr int kTopChunk = 4096; /* columns a top-k block reduces to k candidates */
constexpr int kTopPairs = 5888; /* candidates the per-row merge holds in shared memory (46 KB) */

int top_chunks(int n) { return (n + kTopChunk - 1) / kTopChunk; }

/* ---- top-k ----------------------------------------------------------------------------- */

struct Cand {
    float v;
    int i;
};

/* a before b: larger value, then lower column; -inf (taken, or never a candidate) last */
__device__ __forceinline__ bool before(Cand a, Cand b) { return a.v > b.v || (a.v == b.v && a.i < b.i && a.v > -INFINITY); }

__device__ __forceinline__ Cand warp_first(Cand c) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        Cand d = {__shfl_xor_sync(kFull, c.v, o), __shfl_xor_sync(kFull, c.i, o)};
        if (before(d, c)) c = d;
    }
    return c;
}

/* The first of the block (every thread gets it); red: 2 * 32 words. */
__device__ Cand block_first(Cand c, float *rv, int *ri) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    c = warp_first(c);
    if (lane == 0) rv[warp] = c.v, ri[warp] = c.i;
    __syncthreads();
    Cand b = {-INFINITY, -1};
    for (int w = 0; w < nw; w++) {
        Cand d = {rv[w], ri[w]};
        if (before(d, b)) b = d;
    }
    __syncthreads();
    return b;
}

/* k rounds over sv/si[0, n) (shared: values, columns): each round takes the
 * first remaining candidate.  Each thread keeps the first of its own strided
 * entries (slot) and rescans only when it gave the round's winner (columns
 * are unique), so no thread touches another's entries.  Writes the winners
 * to ov/oi[0, k) (-inf / -1 once none is left) and returns how many. */
__device__ int take_first_k(float *sv, const int *si, int n, int k, float *ov, int *oi) {
    __shared__ float rv[32];
    __shared__ int ri[32];
    int slot = -1;
    auto scan = [&]() {
        slot = -1;
        for (int j = threadIdx.x; j < n; j += blockDim.x)
            if (sv[j] > -INFINITY && (slot < 0 || before(Cand{sv[j], si[j]}, Cand{sv[slot], si[slot]}))) slot = j;
    };
    scan();
    int got = 0;
    for (; got < k; got++) {
        const Cand w = block_first(slot >= 0 ? Cand{sv[slot], si[slot]} : Cand{-INFINITY, -1}, rv, ri);
        if (!(w.v > -INFINITY)) break;
        if (threadIdx.x == 0) ov[got] = w.v, oi[got] = w.i;
        if (slot >= 0 && si[slot] == w.i) { /* this thread's entry won */
            sv[slot] = -INFINITY;
            scan();
        }
    }
    for (int j = got + threadIdx.x; j < k; j += blockDim.x) ov[j] = -INFINITY, oi[j] = -1;
    return got;
}

/* Phase 1: block (chunk, row) reduces kTopChunk columns to k candidates. */
__global__ void topk_chunks(const float *x, size_t ldx, int n, int k, int chunks, float *pv, int *pi) {
    __shared__ float sv[kTopChunk];
    __shared__ int si[kTopChunk];
    const int row = blockIdx.y, c0 = blockIdx.x * kTopChunk;
    const int len = n - c0 < kTopChunk ? n - c0 : kTopChunk;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        const float v = x[(size_t)row * ldx + c0 + j];
        sv[j] = v > -INFINITY ? v : -INFINITY; /* NaN and -inf: never a candidate */
        si[j] = c0 + j;
    }
    __syncthreads();
    const size_t o = ((size_t)row * chunks + blockIdx.x) * k;
    take_first_k(sv, si, len, k, pv + o, pi + o);
}

/* Phase 2: one block per row merges its chunks' candidates. */
__global__ void topk_rows(const float *pv, const int *pi, int chunks, int k, int32_t *cand, float *val, size_t ldc,
                          int32_t *n_cand) {
    __shared__ float sv[kTopPairs];
    __shared__ int si[kTopPairs];
    const int row = blockIdx.x, len = chunks * k;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        sv[j] = pv[(size_t)row * len + j];
        si[j] = pi[(size_t)row * len + j];
    }
    __syncthreads();
    const int got = take_first_k(sv, si, len, k, val + (size_t)row * ldc, cand + (size_t)row * ldc);
    if (threadIdx.x == 0) n_cand[row] = got;
}

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

extern "C" int splash_cuda_topk_max_k(int n) {
    if (n < 1) return 0;
    int k = kTopPairs / top_chunks(n); /* min(that, SPLASH_CUDA_MAX_TOPK, n) */
    if (k > SPLASH_CUDA_MAX_TOPK) k = SPLASH_CUDA_MAX_TOPK;
    return k < n ? k : n;
}

extern "C" size_t splash_cuda_topk_workspace_bytes(int rows, int n, int k) {
    if (rows < 1 || n < 1 || k < 1) return 0;
    const size_t pairs = (size_t)rows * top_chunks(n) * k;
    return ((pairs * sizeof(float) + 255) & ~(size_t)255) + pairs * sizeof(int);
}

extern "C" int splash_cuda_topk(const float *x, size_t ldx, int rows, int n, int k, int32_t *cand, float *val,
                                       size_t ldc, int32_t *n_cand, void *workspace, size_t workspace_bytes,
                                       struct CUstream_st *stream) {
    if (!x || !cand || !val || !n_cand || !workspace || rows < 0 || rows > 65535 || n < 1 || ldx < (size_t)n ||
        k < 1 || k > SPLASH_CUDA_MAX_TOPK || k > n || ldc < (size_t)k)
        return SPLASH_E_INVALID;
    const int chunks = top_chunks(n);
    if (chunks * k > kTopPairs) return SPLASH_E_INVALID; /* a vocabulary past ~376K at k = 64 */
    if (!rows) return SPLASH_OK;
    if (workspace_bytes < splash_cuda_topk_workspace_bytes(rows, n, k)) return SPLASH_E_RANGE;
    const size_t pairs = (size_t)rows * chunks * k;
    float *pv = (float *)workspace;
    int *pi = (int *)((uint8_t *)workspace + ((pairs * sizeof(float) + 255) & ~(size_t)255));
    const cudaStream_t s = (cudaStream_t)stream;
    topk_chunks<<<dim3((unsigned)chunks, (unsigned)rows), kThreads, 0, s>>>(x, ldx, n, k, chunks, pv, pi);
    SPLASH_CUDA_LAUNCHED();
    topk_rows<<<(unsigned)rows, kThreads, 0, s>>>(pv, pi, chunks, k, cand, val, ldc, n_cand);
    SPLASH_CUDA_LAUNCHED();
    return SPLASH_OK;
}
