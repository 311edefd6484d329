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

#include "backend/cuda/argmax.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/dflash.h"

using namespace splash_cuda;

namespace {

constexpr int kThreads = 256;

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

/* Row r of an append pass (blockIdx.y): its lane, position and the lane's end
 * from the device arrays; rows of no lane (padding) and rows the ring would
 * overwrite within the pass (pos < end - cap) write nothing, so no two rows
 * that write share a slot. */
__global__ void ring_write_rows_kernel(const float *k, const float *v, size_t lds, int width, float *ring_k,
                                       float *ring_v, size_t lane_stride, int cap, const int32_t *pos,
                                       const int32_t *lane, const int32_t *end) {
    const int r = blockIdx.y, j = lane[r], p = pos[r];
    if (j < 0 || p < end[r] - cap) return;
    const size_t at = (size_t)j * lane_stride + (size_t)(p % cap) * width;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < width; c += gridDim.x * blockDim.x) {
        ring_k[at + c] = k[(size_t)r * lds + c];
        ring_v[at + c] = v[(size_t)r * lds + c];
    }
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

/* Flash-decoding over the block's keys: the unified key list is the held
 * context positions [cbase, n_ctx) then the block's rows; a block of threads
 * takes kKeyTile keys of it for one kv head and up to kQueryTile of the
 * queries that share that head (every row x the group's heads), so each K/V
 * tile is read from memory once for all of them.  A warp per query in turn:
 * each lane scores two keys (its whole dot product, K padded in shared memory
 * so lanes read different banks), masks the keys its row does not see, and
 * accumulates head_dim / 32 output dims; the tile's (max, sum, acc) go to the
 * workspace and a second kernel merges the tiles. */
constexpr int kKeyTile = 64;
constexpr int kQueryTile = 64; /* the most queries a block takes (fewer when that leaves SMs idle) */
constexpr int kAttnThreads = 256;

struct AttnGeom {
    int g, Q, cbase, nc, n_keys, tiles, qt, qtiles;
};

/* The keys of a lane at n_ctx with positions from lo held: the context
 * positions the ring still holds, then the block's rows.  n_ctx and lo are
 * the arguments' or, with ctx_dev, the device's (kernels only). */
__host__ __device__ inline AttnGeom attn_keys(const splash_cuda_dflash_attn_args &a, int n_ctx, int lo) {
    AttnGeom m;
    m.g = a.heads / a.kv_heads;
    m.Q = a.block * m.g;
    m.cbase = lo > n_ctx - a.cap ? lo : n_ctx - a.cap; /* the ring holds the last cap positions */
    m.nc = n_ctx > m.cbase ? n_ctx - m.cbase : 0;
    m.n_keys = m.nc + a.block;
    m.tiles = (m.n_keys + kKeyTile - 1) / kKeyTile;
    return m;
}

/* The launch's shape: the keys' tiles (with ctx_dev: max_keys'), and the
 * queries a block: 64 (each K/V tile read once for most queries) unless that
 * makes fewer than ~2 blocks an SM of an H200; then 32 or 16 (measured,
 * 27B-width draft: 300 positions 41.6 us at 64, 24.2 at 16; 2,048 positions
 * 70.5 at 64, 77.4 at 16).  The kernels get qt from the host (it must match
 * the grid); a row's result does not depend on it or on the tile count. */
inline AttnGeom attn_launch(const splash_cuda_dflash_attn_args &a) {
    AttnGeom m = attn_keys(a, a.n_ctx, a.lo);
    if (a.ctx_dev) m.n_keys = a.max_keys, m.tiles = (a.max_keys + kKeyTile - 1) / kKeyTile;
    m.qt = kQueryTile;
    while (m.qt > 16 && (size_t)a.kv_heads * m.tiles * ((m.Q + m.qt - 1) / m.qt) < 264) m.qt /= 2;
    m.qtiles = (m.Q + m.qt - 1) / m.qt;
    return m;
}

/* The lane's keys where the kernels run. */
__device__ inline AttnGeom attn_geom(const splash_cuda_dflash_attn_args &a, int qt) {
    AttnGeom m = a.ctx_dev ? attn_keys(a, a.ctx_dev[0], a.ctx_dev[1]) : attn_keys(a, a.n_ctx, a.lo);
    m.qt = qt;
    m.qtiles = (m.Q + qt - 1) / qt;
    return m;
}

/* K rows padded by 4 floats: a lane's float4 reads of its own key row fall on
 * different banks across each quarter-warp. */
__host__ __device__ inline size_t attn_smem(int hd) {
    return ((size_t)kQueryTile * hd + (size_t)kKeyTile * (hd + 4) + (size_t)kKeyTile * hd) * sizeof(float);
}

template <int E> /* head_dim / 32: 1, 2, 4, 8 */
__global__ void __launch_bounds__(kAttnThreads) attention_tile_kernel(const splash_cuda_dflash_attn_args a, float *ws,
                                                                      int qt) {
    extern __shared__ float sm[];
    constexpr int hd = 32 * E; /* == a.head_dim (the wrapper's switch) */
    const AttnGeom m = attn_geom(a, qt);
    const int kh = blockIdx.x, tile = blockIdx.y, q0 = blockIdx.z * m.qt;
    if (tile >= m.tiles) return; /* past the lane's keys (a launch for max_keys) */
    const int n_ctx = a.ctx_dev ? a.ctx_dev[0] : a.n_ctx;
    const int nq = m.Q - q0 < m.qt ? m.Q - q0 : m.qt;
    const size_t kvw = (size_t)a.kv_heads * hd;
    float *qs = sm, *ks = qs + (size_t)kQueryTile * hd, *vs = ks + (size_t)kKeyTile * (hd + 4);
    const int t0 = tile * kKeyTile, nt = m.n_keys - t0 < kKeyTile ? m.n_keys - t0 : kKeyTile;
    /* the tile's queries, keys and values into shared memory: float4s, four in flight a thread
     * before any is stored (a load and its store in one iteration would wait out each load) */
    constexpr int R4 = hd / 4, kLoads = 4;
    for (int base = 0; base < nq * R4; base += kLoads * kAttnThreads) {
        float4 x[kLoads];
#pragma unroll
        for (int u = 0; u < kLoads; u++) {
            const int idx = base + u * kAttnThreads + threadIdx.x;
            if (idx < nq * R4) {
                const int qi = q0 + idx / R4, i = qi / m.g, h = kh * m.g + qi % m.g;
                x[u] = *reinterpret_cast<const float4 *>(a.q + (size_t)i * a.ldq + (size_t)h * hd + (idx % R4) * 4);
            }
        }
#pragma unroll
        for (int u = 0; u < kLoads; u++) {
            const int idx = base + u * kAttnThreads + threadIdx.x;
            if (idx < nq * R4) reinterpret_cast<float4 *>(qs)[idx] = x[u];
        }
    }
    for (int base = 0; base < nt * R4; base += kLoads * kAttnThreads) {
        float4 kx[kLoads], vx[kLoads];
#pragma unroll
        for (int u = 0; u < kLoads; u++) {
            const int idx = base + u * kAttnThreads + threadIdx.x;
            if (idx < nt * R4) {
                const int t = t0 + idx / R4;
                const float *kp, *vp;
                if (t < m.nc) {
                    const size_t off = (size_t)((m.cbase + t) % a.cap) * kvw + (size_t)kh * hd;
                    kp = a.ring_k + off, vp = a.ring_v + off;
                } else {
                    const size_t off = (size_t)(t - m.nc) * a.ldkv + (size_t)kh * hd;
                    kp = a.k + off, vp = a.v + off;
                }
                kx[u] = *reinterpret_cast<const float4 *>(kp + (idx % R4) * 4);
                vx[u] = *reinterpret_cast<const float4 *>(vp + (idx % R4) * 4);
            }
        }
#pragma unroll
        for (int u = 0; u < kLoads; u++) {
            const int idx = base + u * kAttnThreads + threadIdx.x;
            if (idx < nt * R4) {
                *reinterpret_cast<float4 *>(ks + (size_t)(idx / R4) * (hd + 4) + (idx % R4) * 4) = kx[u];
                reinterpret_cast<float4 *>(vs)[idx] = vx[u];
            }
        }
    }
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, W = a.window;
    for (int ql = warp; ql < nq; ql += kAttnThreads / 32) {
        const int qi = q0 + ql, i = qi / m.g, qp = n_ctx + i;
        /* row i's visible keys (dflash_ctx.c attn_task): context positions >= c0, block rows [b0, b1) */
        const int c0 = W > 0 && qp - W + 1 > m.cbase ? qp - W + 1 : m.cbase;
        int b0 = 0, b1 = a.causal ? i + 1 : a.block;
        if (W > 0) {
            if (i - W + 1 > b0) b0 = i - W + 1;
            if (!a.causal && i + W < b1) b1 = i + W;
        }
        const float *q = qs + (size_t)ql * hd;
        float s[2];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int tl = lane + 32 * u, t = t0 + tl;
            bool vis = tl < nt;
            if (vis) vis = t < m.nc ? m.cbase + t >= c0 : (t - m.nc >= b0 && t - m.nc < b1);
            float dot = 0.0f;
            if (vis) { /* four chains over float4s, so the shared loads overlap */
                const float4 *kr = reinterpret_cast<const float4 *>(ks + (size_t)tl * (hd + 4));
                const float4 *q4 = reinterpret_cast<const float4 *>(q);
                float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
#pragma unroll 8
                for (int e = 0; e < 8 * E; e++) {
                    const float4 x = q4[e], k = kr[e];
                    d0 = fmaf(x.x, k.x, d0), d1 = fmaf(x.y, k.y, d1), d2 = fmaf(x.z, k.z, d2), d3 = fmaf(x.w, k.w, d3);
                }
                dot = (d0 + d1) + (d2 + d3);
            }
            s[u] = vis ? dot * a.scale : -INFINITY;
        }
        const float mx = warp_max(fmaxf(s[0], s[1]));
        float acc[E];
#pragma unroll
        for (int e = 0; e < E; e++) acc[e] = 0.0f;
        float l = 0.0f;
        if (mx > -INFINITY) { /* else no key of this tile is visible to the row */
            const float p0 = expf(s[0] - mx), p1 = expf(s[1] - mx);
            l = warp_sum(p0 + p1);
#pragma unroll 4
            for (int tl = 0; tl < nt; tl++) {
                const float pt = __shfl_sync(kFull, tl < 32 ? p0 : p1, tl & 31);
                const float *vr = vs + (size_t)tl * hd;
#pragma unroll
                for (int e = 0; e < E; e++)
                    acc[e] = fmaf(pt, vr[lane + 32 * e], acc[e]);
            }
        }
        float *w = ws + (((size_t)tile * a.kv_heads + kh) * m.Q + qi) * (hd + 2);
        if (lane == 0) w[0] = mx, w[1] = l;
#pragma unroll
        for (int e = 0; e < E; e++) w[2 + lane + 32 * e] = acc[e];
    }
}

/* One block per (kv head, query): the tiles' partial softmaxes merged. */
__global__ void attention_merge_kernel(const splash_cuda_dflash_attn_args a, const float *ws, int qt) {
    const AttnGeom m = attn_geom(a, qt);
    const int kh = blockIdx.x / m.Q, qi = blockIdx.x % m.Q, hd = a.head_dim, e = threadIdx.x;
    const size_t stride = (size_t)a.kv_heads * m.Q * (hd + 2);
    const float *w = ws + ((size_t)kh * m.Q + qi) * (hd + 2);
    float M = -INFINITY;
    for (int t = 0; t < m.tiles; t++) M = fmaxf(M, w[t * stride]);
    float L = 0.0f, o = 0.0f;
    for (int t = 0; t < m.tiles; t++) {
        const float mt = w[t * stride];
        if (!(mt > -INFINITY)) continue;
        const float f = expf(mt - M);
        L = fmaf(w[t * stride + 1], f, L);
        if (e < hd) o = fmaf(w[t * stride + 2 + e], f, o);
    }
    const int i = qi / m.g, h = kh * m.g + qi % m.g;
    if (e < hd) a.o[(size_t)i * a.ldo + (size_t)h * hd + e] = o / L;
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

extern "C" int splash_cuda_dflash_ring_write_rows(const float *k, const float *v, size_t lds, int rows, int width,
                                                  float *ring_k, float *ring_v, size_t lane_stride, int cap,
                                                  const int32_t *pos, const int32_t *lane, const int32_t *end,
                                                  struct CUstream_st *stream) {
    if (!k || !v || !ring_k || !ring_v || !pos || !lane || !end || rows < 0 || rows > 65535 || width < 1 ||
        lds < (size_t)width || cap < 1)
        return SPLASH_E_INVALID;
    if (!rows) return SPLASH_OK;
    ring_write_rows_kernel<<<dim3((unsigned)((width + kThreads - 1) / kThreads), (unsigned)rows), kThreads, 0,
                             (cudaStream_t)stream>>>(k, v, lds, width, ring_k, ring_v, lane_stride, cap, pos, lane, end);
    SPLASH_CUDA_LAUNCHED();
    return SPLASH_OK;
}

extern "C" size_t splash_cuda_dflash_attention_workspace_bytes(int block, int heads, int head_dim, int max_keys) {
    if (block < 1 || heads < 1 || head_dim < 1 || max_keys < 1) return 0;
    const size_t tiles = ((size_t)max_keys + kKeyTile - 1) / kKeyTile;
    return tiles * (size_t)block * heads * (head_dim + 2) * sizeof(float); /* kv_heads x Q = block x heads */
}

extern "C" int splash_cuda_dflash_attention(const splash_cuda_dflash_attn_args *a, struct CUstream_st *stream) {
    if (!a || !a->q || !a->k || !a->v || !a->o || !a->ws || a->block < 1 || a->block > 65535 || a->heads < 1 ||
        a->kv_heads < 1 || a->heads % a->kv_heads || a->n_ctx < 0 || a->lo < 0 || a->lo > a->n_ctx || a->cap < 1 ||
        a->window < 0 || ((a->n_ctx > a->lo || a->ctx_dev) && (!a->ring_k || !a->ring_v)) ||
        (a->ctx_dev && a->max_keys < a->block))
        return SPLASH_E_INVALID;
    if (a->head_dim != 32 && a->head_dim != 64 && a->head_dim != 128 && a->head_dim != 256) return SPLASH_E_UNSUPPORTED;
    const uintptr_t addr = (uintptr_t)a->q | (uintptr_t)a->k | (uintptr_t)a->v | (uintptr_t)a->ring_k |
                           (uintptr_t)a->ring_v;
    if ((addr & 15) || (a->ldq & 3) || (a->ldkv & 3)) return SPLASH_E_INVALID; /* the tiles' float4 loads */
    const AttnGeom m = attn_launch(*a);
    if (a->ws_bytes < splash_cuda_dflash_attention_workspace_bytes(a->block, a->heads, a->head_dim, m.n_keys))
        return SPLASH_E_RANGE;
    const cudaStream_t s = (cudaStream_t)stream;
    const size_t smem = attn_smem(a->head_dim);
    const dim3 grid((unsigned)a->kv_heads, (unsigned)m.tiles, (unsigned)m.qtiles);
    float *ws = (float *)a->ws;
    static bool attr_set[4];
#define LAUNCH(E, slot)                                                                                                \
    do {                                                                                                               \
        if (!attr_set[slot]) {                                                                                         \
            SPLASH_CUDA_TRY(cudaFuncSetAttribute(attention_tile_kernel<E>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                                 (int)attn_smem(32 * E)));                                             \
            attr_set[slot] = true;                                                                                     \
        }                                                                                                              \
        attention_tile_kernel<E><<<grid, kAttnThreads, smem, s>>>(*a, ws, m.qt);                                      \
    } while (0)
    switch (a->head_dim) {
    case 32: LAUNCH(1, 0); break;
    case 64: LAUNCH(2, 1); break;
    case 128: LAUNCH(4, 2); break;
    default: LAUNCH(8, 3); break;
    }
#undef LAUNCH
    SPLASH_CUDA_LAUNCHED();
    attention_merge_kernel<<<(unsigned)(a->kv_heads * m.Q), (unsigned)((a->head_dim + 31) / 32 * 32), 0, s>>>(*a, ws,
                                                                                                           m.qt);
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

extern "C" int splash_cuda_dflash_edges(const float *gate, const float *pred, const float *succ, const float *val,
                                        const int32_t *n_cand, int rows, int k, int rank, float *edges,
                                        struct CUstream_st *stream) {
    if (!gate || !pred || !succ || !val || !n_cand || !edges || rows < 0 || rows > 65535 || k < 1 ||
        k > SPLASH_CUDA_MAX_TOPK || rank < 1 || rank > SPLASH_CUDA_DFLASH_MAX_RANK)
        return SPLASH_E_INVALID;
    if (!rows) return SPLASH_OK;
    edges_kernel<<<dim3((unsigned)rows, (unsigned)k), kThreads, 0, (cudaStream_t)stream>>>(gate, pred, succ, val,
                                                                                            n_cand, k, rank, edges);
    SPLASH_CUDA_LAUNCHED();
    return SPLASH_OK;
}
