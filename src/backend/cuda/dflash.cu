/* dflash.cu - the DFlash draft's own ops (dflash.h).
 *
 * All of them are small next to the draft's products: a block is at most 16
 * rows, a context ring at most a few thousand positions.  The layouts and
 * masks are dflash_ctx.c's and dflash2.c's; where those fix an order of
 * operations that decides the bits (the conv's fmaf chain, the candidates'
 * order) the kernels keep it.
 */
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/dflash.h"

using namespace splash_cuda;

namespace {

constexpr int kThreads = 256;
constexpr int kTopChunk = 4096;    /* columns a top-k block reduces to k candidates */
constexpr int kTopPairs = 5888;    /* candidates the per-row merge holds in shared memory (46 KB) */
constexpr int kMaxHeadDim = 256;   /* attention: head_dim / 32 accumulators a lane */

/* ---- conv, ring write, transform -------------------------------------------------- */

__global__ void conv_kernel(const float *x, size_t ldx, int hidden, const float *base, const float *dyn, size_t lddyn,
                            int side, int K, int group, float *out, size_t ldo) {
    const int t = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= hidden) return;
    const int G = hidden / group;
    const float *dt = dyn + (size_t)t * lddyn + (size_t)side * K * G;
    float o = 0.0f;
    for (int s = 0; s < K && s <= t; s++) /* dflash2.c: o = fmaf(b + dg, x, o) in tap order */
        o = fmaf(__fadd_rn(base[(size_t)s * hidden + c], dt[(size_t)s * G + c / group]), x[(size_t)(t - s) * ldx + c], o);
    out[(size_t)t * ldo + c] = o;
}

__global__ void ring_write_kernel(const float *src, size_t lds, int width, float *ring, int cap, int pos0) {
    const int r = blockIdx.y;
    float *dst = ring + (size_t)((pos0 + r) % cap) * width;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < width; c += gridDim.x * blockDim.x)
        dst[c] = src[(size_t)r * lds + c];
}

__global__ void transform_kernel(float *x, size_t ldx, int n, float mult, float cap) {
    const int r = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < n; c += gridDim.x * blockDim.x) {
        float l = x[(size_t)r * ldx + c];
        if (mult != 1.0f) l = __fmul_rn(l, mult);
        if (cap > 0) l = __fmul_rn(tanhf(__fdiv_rn(l, cap)), cap);
        x[(size_t)r * ldx + c] = l;
    }
}

/* ---- attention ----------------------------------------------------------------------- */

/* One block per (kv head, row), one warp per query head of the group.  Each
 * lane scores one key of a 32-key step (its whole dot product), the warp
 * keeps an online softmax, and each lane accumulates head_dim / 32 output
 * dims over the step's keys. */
template <int E> /* head_dim / 32 */
__global__ void attention_kernel(const splash_cuda_dflash_attn_args a) {
    extern __shared__ float qs[]; /* [group][head_dim] */
    const int kh = blockIdx.x, i = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = a.heads / a.kv_heads, h = kh * g + warp, hd = a.head_dim;
    const size_t kvw = (size_t)a.kv_heads * hd;
    for (int d = lane; d < hd; d += 32) qs[warp * hd + d] = a.q[(size_t)i * a.ldq + (size_t)h * hd + d];
    __syncwarp();
    const float *q = qs + warp * hd;
    /* the visible keys: context positions [c0, n_ctx), then block rows [b0, b1) (dflash_ctx.c attn_task) */
    const int start = a.n_ctx, qp = start + i, W = a.window;
    int c0 = a.lo;
    if (start - a.cap > c0) c0 = start - a.cap;
    if (W > 0 && qp - W + 1 > c0) c0 = qp - W + 1;
    const int nc = start > c0 ? start - c0 : 0;
    int b0 = 0, b1 = a.causal ? i + 1 : a.block;
    if (W > 0) {
        if (i - W + 1 > b0) b0 = i - W + 1;
        if (!a.causal && i + W < b1) b1 = i + W;
    }
    const int n = nc + (b1 - b0);
    float m = -INFINITY, l = 0.0f, acc[E];
#pragma unroll
    for (int e = 0; e < E; e++) acc[e] = 0.0f;
    for (int t0 = 0; t0 < n; t0 += 32) {
        const int t = t0 + lane;
        const float *kp = nullptr, *vp = nullptr;
        float s = -INFINITY;
        if (t < n) {
            size_t off;
            if (t < nc) {
                off = (size_t)((c0 + t) % a.cap) * kvw + (size_t)kh * hd;
                kp = a.ring_k + off, vp = a.ring_v + off;
            } else {
                off = (size_t)(b0 + t - nc) * a.ldkv + (size_t)kh * hd;
                kp = a.k + off, vp = a.v + off;
            }
            float dot = 0.0f;
            for (int d = 0; d < hd; d += 4) {
                const float4 kv = *reinterpret_cast<const float4 *>(kp + d);
                dot = fmaf(q[d], kv.x, dot);
                dot = fmaf(q[d + 1], kv.y, dot);
                dot = fmaf(q[d + 2], kv.z, dot);
                dot = fmaf(q[d + 3], kv.w, dot);
            }
            s = dot * a.scale;
        }
        const float mn = fmaxf(m, warp_max(s));
        const float corr = expf(m - mn), p = t < n ? expf(s - mn) : 0.0f;
        l = l * corr + warp_sum(p);
        m = mn;
#pragma unroll
        for (int e = 0; e < E; e++) acc[e] *= corr;
        const int cnt = n - t0 < 32 ? n - t0 : 32;
        for (int j = 0; j < cnt; j++) {
            const float pj = __shfl_sync(kFull, p, j);
            const float *vj = reinterpret_cast<const float *>(
                __shfl_sync(kFull, reinterpret_cast<unsigned long long>(vp), j));
#pragma unroll
            for (int e = 0; e < E; e++)
                if (lane + 32 * e < hd) acc[e] = fmaf(pj, vj[lane + 32 * e], acc[e]);
        }
    }
    const float inv = 1.0f / l;
    float *o = a.o + (size_t)i * a.ldo + (size_t)h * hd;
#pragma unroll
    for (int e = 0; e < E; e++)
        if (lane + 32 * e < hd) o[lane + 32 * e] = acc[e] * inv;
}

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

/* ---- selector edges ---------------------------------------------------------------------- */

/* One block per (row i, previous candidate p); a warp per candidate j. */
__global__ void edges_kernel(const float *gate, const float *pred, const float *succ, const float *val,
                             const int32_t *n_cand, int k, int rank, float *edges) {
    __shared__ float g[SPLASH_CUDA_DFLASH_MAX_RANK];
    const int i = blockIdx.x, p = blockIdx.y;
    const int np = i ? n_cand[i - 1] : 1, nj = n_cand[i];
    if (p >= np) return;
    const float *pr = pred + (size_t)(i ? 1 + (size_t)(i - 1) * k + p : 0) * rank;
    for (int r = threadIdx.x; r < rank; r += blockDim.x) g[r] = __fmul_rn(pr[r], gate[(size_t)i * rank + r]);
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int j = warp; j < nj; j += nw) {
        const float *s = succ + ((size_t)i * k + j) * rank;
        float dot = 0.0f;
        for (int r = lane; r < rank; r += 32) dot = fmaf(g[r], s[r], dot);
        dot = warp_sum(dot);
        if (lane == 0) edges[((size_t)i * k + p) * k + j] = val[(size_t)i * k + j] + dot;
    }
}

int top_chunks(int n) { return (n + kTopChunk - 1) / kTopChunk; }

} /* namespace */

extern "C" int splash_cuda_dflash_conv(const float *x, size_t ldx, int rows, int hidden, const float *base,
                                       const float *dyn, size_t lddyn, int side, int kernel, int group, float *out,
                                       size_t ldo, struct CUstream_st *stream) {
    if (!x || !base || !dyn || !out || rows < 0 || rows > 65535 || hidden < 1 || kernel < 1 || group < 1 ||
        hidden % group || (side != 0 && side != 1) || ldx < (size_t)hidden || ldo < (size_t)hidden ||
        lddyn < (size_t)2 * kernel * (hidden / group) || x == out)
        return SPLASH_E_INVALID;
    if (!rows) return SPLASH_OK;
    conv_kernel<<<dim3((unsigned)((hidden + kThreads - 1) / kThreads), (unsigned)rows), kThreads, 0,
                  (cudaStream_t)stream>>>(x, ldx, hidden, base, dyn, lddyn, side, kernel, group, out, ldo);
    SPLASH_CUDA_LAUNCHED();
    return SPLASH_OK;
}

extern "C" int splash_cuda_dflash_ring_write(const float *src, size_t lds, int rows, int width, float *ring, int cap,
                                             int pos0, struct CUstream_st *stream) {
    if (!src || !ring || rows < 0 || rows > 65535 || width < 1 || lds < (size_t)width || cap < 1 || pos0 < 0)
        return SPLASH_E_INVALID;
    if (!rows) return SPLASH_OK;
    ring_write_kernel<<<dim3((unsigned)((width + kThreads - 1) / kThreads), (unsigned)rows), kThreads, 0,
                        (cudaStream_t)stream>>>(src, lds, width, ring, cap, pos0);
    SPLASH_CUDA_LAUNCHED();
    return SPLASH_OK;
}

extern "C" int splash_cuda_dflash_attention(const splash_cuda_dflash_attn_args *a, struct CUstream_st *stream) {
    if (!a || !a->q || !a->k || !a->v || !a->o || a->block < 1 || a->block > 65535 || a->heads < 1 ||
        a->kv_heads < 1 || a->heads % a->kv_heads || a->heads / a->kv_heads > 32 || a->head_dim < 32 ||
        a->head_dim > kMaxHeadDim || a->head_dim % 32 || a->n_ctx < 0 || a->lo < 0 || a->lo > a->n_ctx ||
        a->cap < 1 || a->window < 0 || (a->n_ctx > a->lo && (!a->ring_k || !a->ring_v)))
        return SPLASH_E_INVALID;
    const int g = a->heads / a->kv_heads;
    const dim3 grid((unsigned)a->kv_heads, (unsigned)a->block);
    const size_t smem = (size_t)g * a->head_dim * sizeof(float);
    const cudaStream_t s = (cudaStream_t)stream;
    switch (a->head_dim / 32) {
    case 1: attention_kernel<1><<<grid, 32 * g, smem, s>>>(*a); break;
    case 2: attention_kernel<2><<<grid, 32 * g, smem, s>>>(*a); break;
    case 4: attention_kernel<4><<<grid, 32 * g, smem, s>>>(*a); break;
    default: attention_kernel<8><<<grid, 32 * g, smem, s>>>(*a); break; /* 3, 5..8: the tail lanes skip */
    }
    SPLASH_CUDA_LAUNCHED();
    return SPLASH_OK;
}

extern "C" int splash_cuda_dflash_logits_transform(float *x, size_t ldx, int rows, int n, float mult, float cap,
                                                   struct CUstream_st *stream) {
    if (!x || rows < 0 || rows > 65535 || n < 1 || ldx < (size_t)n || !(cap >= 0)) return SPLASH_E_INVALID;
    if (!rows || (mult == 1.0f && cap == 0)) return SPLASH_OK;
    const int bx = (n + kThreads - 1) / kThreads < 256 ? (n + kThreads - 1) / kThreads : 256;
    transform_kernel<<<dim3((unsigned)bx, (unsigned)rows), kThreads, 0, (cudaStream_t)stream>>>(x, ldx, n, mult, cap);
    SPLASH_CUDA_LAUNCHED();
    return SPLASH_OK;
}

extern "C" size_t splash_cuda_dflash_topk_workspace_bytes(int rows, int n, int k) {
    if (rows < 1 || n < 1 || k < 1) return 0;
    const size_t pairs = (size_t)rows * top_chunks(n) * k;
    return ((pairs * sizeof(float) + 255) & ~(size_t)255) + pairs * sizeof(int);
}

extern "C" int splash_cuda_dflash_topk(const float *x, size_t ldx, int rows, int n, int k, int32_t *cand, float *val,
                                       size_t ldc, int32_t *n_cand, void *workspace, size_t workspace_bytes,
                                       struct CUstream_st *stream) {
    if (!x || !cand || !val || !n_cand || !workspace || rows < 0 || rows > 65535 || n < 1 || ldx < (size_t)n ||
        k < 1 || k > SPLASH_CUDA_DFLASH_MAX_TOPK || k > n || ldc < (size_t)k)
        return SPLASH_E_INVALID;
    const int chunks = top_chunks(n);
    if (chunks * k > kTopPairs) return SPLASH_E_INVALID; /* a vocabulary past ~376K at k = 64 */
    if (!rows) return SPLASH_OK;
    if (workspace_bytes < splash_cuda_dflash_topk_workspace_bytes(rows, n, k)) return SPLASH_E_RANGE;
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

extern "C" int splash_cuda_dflash_edges(const float *gate, const float *pred, const float *succ, const float *val,
                                        const int32_t *n_cand, int rows, int k, int rank, float *edges,
                                        struct CUstream_st *stream) {
    if (!gate || !pred || !succ || !val || !n_cand || !edges || rows < 0 || rows > 65535 || k < 1 ||
        k > SPLASH_CUDA_DFLASH_MAX_TOPK || rank < 1 || rank > SPLASH_CUDA_DFLASH_MAX_RANK)
        return SPLASH_E_INVALID;
    if (!rows) return SPLASH_OK;
    edges_kernel<<<dim3((unsigned)rows, (unsigned)k), kThreads, 0, (cudaStream_t)stream>>>(gate, pred, succ, val,
                                                                                            n_cand, k, rank, edges);
    SPLASH_CUDA_LAUNCHED();
    return SPLASH_OK;
}
