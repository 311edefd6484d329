/* moe.cu - MoE routing and the expert steps (moe.h).
 *
 * route: one warp per row, the row's probabilities in registers.  The
 * softmax is the CPU's (max subtracted, expf, divided by the sum; the sum is
 * a warp tree here, not a sequential loop), the top-k is k rounds of a warp
 * argmax (larger p, then lower id; two reduxes a round), and the
 * renormalising sum runs in the order of selection as the CPU's does; the
 * choice is sorted by id by ranks (shuffles).
 * With a plan the block (then every row) groups the slots by expert after
 * a barrier (q4_plan.cuh): no launch of its own.
 *
 * experts: see moe.h.  Gather and scatter take their row lists by value (a
 * kernel argument of 16 rows), so nothing is copied to the device per expert.
 *
 * C++ used: none beyond the launch helper (device_util.cuh).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

#include "backend/cuda/act.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/moe.h"
#include "backend/cuda/q4_matmul.h"
#include "backend/cuda/q4_plan.cuh"

using namespace splash_cuda;

namespace {

constexpr int kRouteWarps = 4;
constexpr int kGroup = SPLASH_Q4_MAX_M; /* rows of one expert product */

/* Row r's choice by one warp, its probabilities in registers (expert
 * lane + 32 j in p[j]; NPL >= E / 32).  A round of the top-k: each lane's
 * best untaken expert (ascending id, strictly larger p), then the warp's
 * largest by one redux over the p's bits (p >= 0, so the bits order as the
 * values; 0 = no candidate, NaN is none) and the lowest id holding it by a
 * second.  Lane kk keeps the kk-th choice, so the renormalising sum (in the
 * order of selection, as the CPU's) and the sort by id are shuffles: no
 * local memory. */
template <int NPL>
__device__ void route_row(const float *logits, size_t ldl, int r, int E, int k, int norm, int shared, const float *sl,
                          size_t lds, int32_t *idx, float *wout) {
    const int lane = threadIdx.x & 31;
    const float *x = logits + (size_t)r * ldl;
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
    int my_i = 0;
    float my_w = 0.f;
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
        if (lane == kk) my_i = bi, my_w = w;
    }
    if (norm) {
        float s = 0.f;
        for (int kk = 0; kk < k; kk++) s += __shfl_sync(kFull, my_w, kk);
        my_w = my_w / s;
    }
    int rank = 0; /* the choice sorted by expert id (distinct ids) */
    for (int kk = 0; kk < k; kk++) rank += __shfl_sync(kFull, my_i, kk) < my_i;
    const int stride = k + (shared >= 0); /* slots a row */
    if (lane < k) {
        idx[(size_t)r * stride + rank] = my_i;
        wout[(size_t)r * stride + rank] = my_w;
    }
    if (shared >= 0 && lane == 0) { /* the shared expert, last (its id is above the routed ones: ffn.c adds it last) */
        idx[(size_t)r * stride + k] = shared;
        wout[(size_t)r * stride + k] = sigmoidf_(sl[(size_t)r * lds]);
    }
}

/* A warp a row; plan (not NULL: one block holds every row) then groups the
 * block's slots by expert for the grouped products (q4_plan.cuh), in the
 * same launch. */
template <int NPL>
__global__ void moe_route_kernel(const float *logits, size_t ldl, int rows, int E, int k, int norm, int shared,
                                 const float *sl, size_t lds, int32_t *idx, float *wout, int32_t *plan, int gmax) {
    pdl_begin();
    const int warp = threadIdx.x >> 5, r = blockIdx.x * (blockDim.x >> 5) + warp;
    if (r < rows) route_row<NPL>(logits, ldl, r, E, k, norm, shared, sl, lds, idx, wout);
    if (!plan) return;
    __shared__ int32_t sid[kPlanSlots];
    __shared__ int lead[kPlanSlots];
    const int n_ids = shared >= E ? shared + 1 : E; /* ids the grouped products take */
    group_plan_block(idx, rows * (k + (shared >= 0)), n_ids, plan, sid, lead, gmax);
}

__global__ void hash_logits_kernel(float *logits, size_t ldl, int rows, int E, const int32_t *pos, int salt) {
    pdl_begin();
    const int r = blockIdx.y;
    if (r >= rows) return;
    const int p = pos[r];
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < E; e += gridDim.x * blockDim.x)
        logits[(size_t)r * ldl + e] = splash_moe_hash_logit(salt, p, e);
}

struct RowList {
    int n;
    int rows[kGroup];
    float w[kGroup];
};

__global__ void gather_kernel(const float *xn, size_t ldx, float *mx, int H, const RowList l) {
    pdl_begin();
    const int i = blockIdx.y;
    const float *src = xn + (size_t)l.rows[i] * ldx;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < H; c += gridDim.x * blockDim.x) mx[(size_t)i * H + c] = src[c];
}

/* fo[row_i] = fo[row_i] + mo[i] * w_i, as ffn.c (one expert at a time) */
__global__ void scatter_add_kernel(float *fo, size_t ldf, const float *mo, int H, const RowList l) {
    pdl_begin();
    const int i = blockIdx.y;
    float *dst = fo + (size_t)l.rows[i] * ldf;
    const float w = l.w[i];
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < H; c += gridDim.x * blockDim.x)
        dst[c] = __fadd_rn(dst[c], __fmul_rn(mo[(size_t)i * H + c], w));
}

/* fo[r] = sum over k of mo[slot r * K + k] * w[r * K + k], k ascending (the
 * route sorts a row's experts by id: ffn.c's order), from 0 as ffn.c.  A
 * slot's output row is the slot itself (inv NULL) or inv[slot] (the GEMM
 * step's sorted order; -1: a bad id, left out).  x (not NULL): then x[r] +=
 * fo[r], the residual (splash_cuda_moe_shared_add's last add, same bits). */
__global__ void combine_kernel(float *fo, size_t ldf, const float *mo, const int32_t *inv, const float *w, int H,
                               int K, float *x, size_t ldx) {
    pdl_begin();
    const int r = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < H; c += gridDim.x * blockDim.x) {
        float f = 0.f;
        for (int k = 0; k < K; k++) {
            const size_t slot = (size_t)r * K + k;
            const int p = inv ? inv[slot] : (int)slot;
            if (p >= 0) f = __fadd_rn(f, __fmul_rn(mo[(size_t)p * H + c], w[slot]));
        }
        fo[(size_t)r * ldf + c] = f;
        if (x) x[(size_t)r * ldx + c] = __fadd_rn(f, x[(size_t)r * ldx + c]);
    }
}

/* The slots (rows x K ids) sorted by expert, for the grouped GEMM: counts,
 * offsets and the tile list by one thread (E is small), then a thread per
 * expert walks the slots in order (within an expert, ascending slot: the
 * same positions whatever the timing).  One block of kSortThreads. */
constexpr int kSortThreads = 1024;
constexpr int kGemmChunkRows = 2048; /* rows per GEMM-step chunk at most: 16,384 slots of the 35B-A3B, ~285 MB */
constexpr int kSortSmemIds = 8192; /* ids staged in shared memory up to this many slots (32 KB + 8 KB static);
                                      a multiple of 4, see the launch */

__global__ void __launch_bounds__(kSortThreads) moe_sort_kernel(const int32_t *idx, int S, int E, int bn, int32_t *off,
                                                                int32_t *perm, int32_t *inv, int32_t *tile_e,
                                                                int32_t *tile_n0, int32_t *n_tiles) {
    pdl_begin();
    __shared__ int cnt[SPLASH_CUDA_MOE_MAX_EXPERTS], soff[SPLASH_CUDA_MOE_MAX_EXPERTS];
    extern __shared__ int sid[]; /* [S rounded up to 4] when S <= kSortSmemIds */
    const bool staged = S <= kSortSmemIds;
    for (int e = threadIdx.x; e < E; e += kSortThreads) cnt[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < S; i += kSortThreads) {
        const int e = idx[i];
        if (staged) sid[i] = e;
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
        else inv[i] = -1;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0, t = 0;
        for (int e = 0; e < E; e++) {
            soff[e] = off[e] = run;
            for (int n0 = 0; n0 < cnt[e]; n0 += bn) tile_e[t] = e, tile_n0[t] = n0, t++;
            run += cnt[e];
        }
        off[E] = run;
        *n_tiles = t;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += kSortThreads) {
        if (!cnt[e]) continue;
        int p = soff[e];
        for (int i = 0; i < S; i++)
            if ((staged ? sid[i] : idx[i]) == e) perm[p] = i, inv[i] = p++;
    }
}

/* The byte distance between consecutive experts of a host array of n device
 * matrices, when it is one constant (the loader's layout); 0 otherwise. */
size_t expert_stride(const splash_q4_matrix *m, int n) {
    if (n < 2) return 1; /* any nonzero stride: only expert 0 exists */
    const size_t st = (size_t)(m[1].codes - m[0].codes);
    if (m[1].codes <= m[0].codes) return 0;
    for (int e = 2; e < n; e++)
        if (m[e].codes != m[0].codes + (size_t)e * st || m[e].sb - m[e].codes != m[0].sb - m[0].codes) return 0;
    return st;
}

/* The device-driven steps' checks: the experts' shapes, and their strides
 * (the loader's layout: one constant each, gate's equal to up's). */
int expert_strides(const splash_q4_matrix *gate, const splash_q4_matrix *up, const splash_q4_matrix *down, int n,
                   int H, int I, size_t *sg, size_t *sd) {
    if (gate[0].rows != I || gate[0].cols != H || down[0].rows != H || down[0].cols != I) return SPLASH_E_MISMATCH;
    *sg = expert_stride(gate, n), *sd = expert_stride(down, n);
    return !*sg || *sg != expert_stride(up, n) || !*sd ? SPLASH_E_UNSUPPORTED : SPLASH_OK;
}

size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* One group of up to 16 rows through expert e; fo accumulates. */
int run_group(const splash_q4_matrix *gate, const splash_q4_matrix *up, const splash_q4_matrix *down,
              const RowList &l, const float *xn, size_t ldx, float *fo, size_t ldf, splash_cuda_moe_scratch *s,
              cudaStream_t st) {
    const int H = s->hidden, I = s->inter, n = l.n;
    const dim3 gh((unsigned)((H + 1023) / 1024), (unsigned)n);
    SPLASH_CUDA_TRY(launch_kernel(gather_kernel, gh, 256, 0, st, xn, ldx, s->mx, H, l));
    int rc = splash_q4_prep_x(&s->xh, s->mx, n, H, H, st);
    if (!rc) rc = splash_q4_matmul(gate, &s->xh, s->h1, st);
    if (!rc) rc = splash_q4_matmul(up, &s->xh, s->h2, st);
    if (!rc) rc = splash_cuda_silu_mul(s->h1, I, s->h2, I, s->h1, I, n, I, st);
    if (!rc) rc = splash_q4_prep_x(&s->xi, s->h1, n, I, I, st);
    if (!rc) rc = splash_q4_matmul(down, &s->xi, s->mo, st);
    if (rc) return rc;
    SPLASH_CUDA_TRY(launch_kernel(scatter_add_kernel, gh, 256, 0, st, fo, ldf, s->mo, H, l));
    return SPLASH_OK;
}

} /* namespace */

extern "C" int splash_cuda_moe_route(const float *logits, size_t ldl, int rows, int n_experts, int top_k,
                                     int norm_topk, int shared, const float *sl, size_t lds, int32_t *idx, float *w,
                                     int32_t *plan, struct CUstream_st *stream) {
    if (!logits || !idx || !w || rows < 0 || n_experts < 1 || n_experts > SPLASH_CUDA_MOE_MAX_EXPERTS ||
        top_k < 1 || top_k > SPLASH_CUDA_MOE_MAX_TOPK || top_k > n_experts || (shared >= 0 && !sl) ||
        (plan && (rows > kGroup || shared >= SPLASH_CUDA_MOE_MAX_EXPERTS)))
        return SPLASH_E_INVALID;
    if (!rows) return SPLASH_OK;
    const int warps = plan ? rows : kRouteWarps; /* a plan: every row in one block */
    const unsigned blocks = (unsigned)((rows + warps - 1) / warps);
    auto kernel = n_experts <= 256 ? moe_route_kernel<8> : moe_route_kernel<32>; /* probabilities a lane holds */
    SPLASH_CUDA_TRY(launch_kernel(kernel, blocks, warps * 32, 0, (cudaStream_t)stream, logits, ldl, rows, n_experts,
                                  top_k, norm_topk, shared, sl, lds, idx, w, plan, splash_q4_plan_group()));
    return SPLASH_OK;
}

extern "C" int splash_cuda_moe_hash_logits(float *logits, size_t ldl, int rows, int n_experts, const int32_t *pos,
                                           int salt, struct CUstream_st *stream) {
    if (!logits || !pos || rows < 0 || rows > 65535 || n_experts < 1 || ldl < (size_t)n_experts) return SPLASH_E_INVALID;
    if (!rows) return SPLASH_OK;
    SPLASH_CUDA_TRY(launch_kernel(hash_logits_kernel, dim3((unsigned)((n_experts + 255) / 256), (unsigned)rows), 256, 0,
                                  (cudaStream_t)stream, logits, ldl, rows, n_experts, pos, salt));
    return SPLASH_OK;
}

extern "C" int splash_cuda_moe_scratch_init(splash_cuda_moe_scratch *s, int max_rows, int hidden, int inter,
                                            int top_k) {
    if (!s) return SPLASH_E_INVALID;
    memset(s, 0, sizeof *s);
    if (max_rows < 1 || hidden < 64 || hidden % 64 || inter < 64 || inter % 64 || top_k < 1 ||
        top_k > SPLASH_CUDA_MOE_MAX_TOPK)
        return SPLASH_E_INVALID;
    s->max_rows = max_rows, s->hidden = hidden, s->inter = inter, s->top_k = top_k;
    const size_t bxh = align256(splash_q4_xprep_bytes(hidden)), bxi = align256(splash_q4_xprep_bytes(inter));
    const size_t bH = align256((size_t)kGroup * hidden * sizeof(float));
    const size_t bI = align256((size_t)kGroup * inter * sizeof(float));
    /* grouped: one slot per (row, k) of up to 16 rows, k <= top_k + 1 (a
     * shared expert run as one more) */
    const int slots = kGroup * (top_k + 1);
    const size_t bxs = align256(splash_q4_xprep_rows_bytes(inter, slots));
    const size_t bsI = align256((size_t)slots * inter * sizeof(float)), bsH = align256((size_t)slots * hidden * sizeof(float));
    const size_t bpl = align256(splash_q4_group_plan_ints(slots) * sizeof(int32_t));
    uint8_t *d;
    SPLASH_CUDA_TRY(cudaMalloc((void **)&d, bxh + bxi + 2 * bH + 2 * bI + bxs + 2 * bsI + bsH + bpl));
    s->dev = d;
    splash_q4_xprep_init(&s->xh, d, hidden);
    splash_q4_xprep_init(&s->xi, d + bxh, inter);
    s->mx = (float *)(d + bxh + bxi);
    s->mo = (float *)(d + bxh + bxi + bH);
    s->h1 = (float *)(d + bxh + bxi + 2 * bH);
    s->h2 = (float *)(d + bxh + bxi + 2 * bH + bI);
    uint8_t *g = d + bxh + bxi + 2 * bH + 2 * bI;
    splash_q4_xprep_rows_init(&s->xs, g, inter, slots);
    s->sg = (float *)(g + bxs);
    s->su = (float *)(g + bxs + bsI);
    s->smo = (float *)(g + bxs + 2 * bsI);
    s->plan = (int32_t *)(g + bxs + 2 * bsI + bsH);
    /* the GEMM step works in chunks of gemm_rows rows (splash_cuda_moe_experts_gemm) */
    s->gemm_rows = max_rows < kGemmChunkRows ? max_rows : kGemmChunkRows;
    if (s->gemm_rows > 65535 / top_k) s->gemm_rows = 65535 / top_k;
    const size_t n = (size_t)s->gemm_rows * top_k;
    {
        const size_t bo = align256((SPLASH_CUDA_MOE_MAX_EXPERTS + 1) * 4), bp = align256(n * 4);
        s->tiles_cap = (int)(n / SPLASH_Q4_GEMM_GROUP_ROWS + (n < SPLASH_CUDA_MOE_MAX_EXPERTS ? n : SPLASH_CUDA_MOE_MAX_EXPERTS) + 1);
        const size_t bt = align256((size_t)s->tiles_cap * 4);
        const size_t bgx = align256(splash_q4_gemm_x_bytes(s->gemm_rows, hidden));
        const size_t bgs = align256(splash_q4_gemm_x_bytes((int)n, inter));
        const size_t bgI = align256(n * inter * sizeof(float)), bgH = align256(n * hidden * sizeof(float));
        uint8_t *q;
        const cudaError_t e2 = cudaMalloc((void **)&q, bo + 2 * bp + 2 * bt + 256 + bgx + bgs + 2 * bgI + bgH);
        if (e2 != cudaSuccess) {
            SPLASH_CUDA_REPORT_("cudaMalloc", e2);
            splash_cuda_moe_scratch_free(s);
            return SPLASH_E_IO;
        }
        s->dev2 = q;
        s->off = (int32_t *)q, q += bo;
        s->perm = (int32_t *)q, q += bp;
        s->inv = (int32_t *)q, q += bp;
        s->tile_e = (int32_t *)q, q += bt;
        s->tile_n0 = (int32_t *)q, q += bt;
        s->n_tiles = (int32_t *)q, q += 256;
        splash_q4_gemm_x_init(&s->gx, q, s->gemm_rows, hidden), q += bgx;
        splash_q4_gemm_x_init(&s->gxs, q, (int)n, inter), q += bgs;
        s->gg = (float *)q, q += bgI;
        s->gu = (float *)q, q += bgI;
        s->gd = (float *)q;
    }
    const size_t nh = (size_t)max_rows * top_k; /* the host-driven step's ids and weights */
    cudaError_t e = cudaMallocHost((void **)&s->idx_host, nh * sizeof(int32_t));
    if (e == cudaSuccess) e = cudaMallocHost((void **)&s->w_host, nh * sizeof(float));
    if (e != cudaSuccess) {
        SPLASH_CUDA_REPORT_("cudaMallocHost", e);
        splash_cuda_moe_scratch_free(s);
        return SPLASH_E_IO;
    }
    return SPLASH_OK;
}

extern "C" void splash_cuda_moe_scratch_free(splash_cuda_moe_scratch *s) {
    if (!s) return;
    if (s->dev) cudaFree(s->dev);
    if (s->dev2) cudaFree(s->dev2);
    if (s->idx_host) cudaFreeHost(s->idx_host);
    if (s->w_host) cudaFreeHost(s->w_host);
    memset(s, 0, sizeof *s);
}

extern "C" int splash_cuda_moe_experts(const splash_q4_matrix *gate, const splash_q4_matrix *up,
                                       const splash_q4_matrix *down, int n_experts, const int32_t *idx,
                                       const float *w, int rows, const float *xn, size_t ldx, float *fo, size_t ldf,
                                       splash_cuda_moe_scratch *s, struct CUstream_st *stream) {
    if (!gate || !up || !down || !idx || !w || !xn || !fo || !s || !s->dev || rows < 0 || rows > s->max_rows ||
        n_experts < 1 || n_experts > SPLASH_CUDA_MOE_MAX_EXPERTS || ldx < (size_t)s->hidden ||
        ldf < (size_t)s->hidden)
        return SPLASH_E_INVALID;
    const cudaStream_t st = (cudaStream_t)stream;
    const int H = s->hidden, k = s->top_k;
    if (!rows) return SPLASH_OK;
    SPLASH_CUDA_TRY(cudaMemset2DAsync(fo, ldf * sizeof(float), 0, (size_t)H * sizeof(float), (size_t)rows, st));
    const size_t n = (size_t)rows * k;
    SPLASH_CUDA_TRY(cudaMemcpyAsync(s->idx_host, idx, n * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
    SPLASH_CUDA_TRY(cudaMemcpyAsync(s->w_host, w, n * sizeof(float), cudaMemcpyDeviceToHost, st));
    SPLASH_CUDA_TRY(cudaStreamSynchronize(st));
    for (size_t i = 0; i < n; i++)
        if (s->idx_host[i] < 0 || s->idx_host[i] >= n_experts) return SPLASH_E_INVALID;
    /* Experts in ascending id; each one's rows in ascending row (a row picks
     * an expert at most once), in groups of 16. */
    for (int e = 0; e < n_experts; e++) {
        RowList l;
        l.n = 0;
        for (int r = 0; r < rows; r++)
            for (int kk = 0; kk < k; kk++)
                if (s->idx_host[(size_t)r * k + kk] == e) {
                    l.rows[l.n] = r;
                    l.w[l.n++] = s->w_host[(size_t)r * k + kk];
                    if (l.n == kGroup) {
                        int rc = run_group(&gate[e], &up[e], &down[e], l, xn, ldx, fo, ldf, s, st);
                        if (rc) return rc;
                        l.n = 0;
                    }
                }
        if (l.n) {
            int rc = run_group(&gate[e], &up[e], &down[e], l, xn, ldx, fo, ldf, s, st);
            if (rc) return rc;
        }
    }
    return SPLASH_OK;
}

extern "C" int splash_cuda_moe_experts_grouped(const splash_q4_matrix *gate, const splash_q4_matrix *up,
                                               const splash_q4_matrix *down, int n_experts, const int32_t *idx,
                                               const float *w, const int32_t *plan, int rows, int K,
                                               const splash_q4_xprep *xp, float *fo,
                                               size_t ldf, float *x, size_t ldx, splash_cuda_moe_scratch *s,
                                               struct CUstream_st *stream) {
    if (!gate || !up || !down || !idx || !w || !xp || !s || !s->dev || rows < 0 || rows > kGroup ||
        n_experts < 1 || n_experts > SPLASH_CUDA_MOE_MAX_EXPERTS || (fo && ldf < (size_t)s->hidden) || K < 1 ||
        K > s->top_k + 1 || (x && ldx < (size_t)s->hidden))
        return SPLASH_E_INVALID;
    if (!rows) return SPLASH_OK;
    const int H = s->hidden, I = s->inter, S = rows * K;
    if (xp->M != rows || xp->cols != H) return SPLASH_E_MISMATCH;
    size_t sg, sd;
    int rc = expert_strides(gate, up, down, n_experts, H, I, &sg, &sd);
    if (rc) return rc;
    /* gate and up of every (row, k) slot in one launch, x row = slot / K */
    rc = splash_q4_matmul_grouped(gate, up, n_experts, sg, idx, plan, S, K, xp, s->sg, s->su, (size_t)I, stream);
    if (!rc) rc = splash_q4_prep_silu_mul_rows(&s->xs, s->sg, I, s->su, I, s->sg, I, S, I, stream);
    if (!rc)
        rc = splash_q4_matmul_grouped(down, nullptr, n_experts, sd, idx, plan, S, 1, &s->xs, s->smo, nullptr, (size_t)H,
                                      stream);
    if (rc || !fo) return rc; /* fo NULL: the sum is the caller's (splash_q4_prep_rmsnorm_moe) */
    const splash_q4_moe_sum ms = {s->smo, (size_t)H, w, K, fo, ldf};
    return splash_cuda_moe_sum(&ms, rows, H, x, ldx, stream);
}

extern "C" int splash_cuda_moe_sum(const splash_q4_moe_sum *ms, int rows, int H, float *x, size_t ldx,
                                   struct CUstream_st *stream) {
    if (!ms || !ms->mo || !ms->w || !ms->fo || rows < 0 || rows > 65535 || H < 1 || ms->K < 1 ||
        ms->ldm < (size_t)H || ms->ldf < (size_t)H || (x && ldx < (size_t)H))
        return SPLASH_E_INVALID;
    if (!rows) return SPLASH_OK;
    if (ms->ldm != (size_t)H) return SPLASH_E_UNSUPPORTED; /* the kernel's slots are H apart */
    SPLASH_CUDA_TRY(launch_kernel(combine_kernel, dim3((unsigned)((H + 255) / 256), (unsigned)rows), 256, 0,
                                  (cudaStream_t)stream, ms->fo, ms->ldf, ms->mo, nullptr, ms->w, H, ms->K, x, ldx));
    return SPLASH_OK;
}

/* One chunk of splash_cuda_moe_experts_gemm: rows * top_k <= 65535 slots
 * (the elementwise kernels' grid.y). */
static int experts_gemm_chunk(const splash_q4_matrix *gate, const splash_q4_matrix *up, const splash_q4_matrix *down,
                              int n_experts, const int32_t *idx, const float *w, int rows, const float *xn, size_t ldx,
                              float *fo, size_t ldf, splash_cuda_moe_scratch *s, struct CUstream_st *stream) {
    const int H = s->hidden, I = s->inter, K = s->top_k, S = rows * K;
    size_t sg, sd;
    int rc = expert_strides(gate, up, down, n_experts, H, I, &sg, &sd);
    if (rc) return rc;
    const cudaStream_t st = (cudaStream_t)stream;
    /* sid[] rounded up to 4 ids: ptxas merges the staged walk's unrolled
     * remainder reads into one 12-byte load that would pass the end of exactly
     * S ids (compute-sanitizer, session 6; the attention combine's fac[] had
     * the same fault, docs/cuda.md "Shared-memory sizing") */
    const size_t sort_smem = S <= kSortSmemIds ? ((size_t)S + 3) / 4 * 4 * 4 : 0;
    SPLASH_CUDA_TRY(launch_kernel(moe_sort_kernel, 1, kSortThreads, sort_smem, st, idx, S, n_experts,
                                  SPLASH_Q4_GEMM_GROUP_ROWS, s->off, s->perm, s->inv, s->tile_e, s->tile_n0,
                                  s->n_tiles));
    const int active = S < n_experts ? S : n_experts; /* experts with slots, at most */
    splash_q4_gemm_groups g = {s->off, s->perm, s->tile_e, s->tile_n0, s->n_tiles,
                               S / SPLASH_Q4_GEMM_GROUP_ROWS + active + 1, K};
    rc = splash_q4_gemm_prep(&s->gx, xn, rows, H, ldx, stream);
    if (!rc) rc = splash_q4_gemm_grouped(gate, up, sg, &g, &s->gx, s->gg, s->gu, stream);
    if (!rc) rc = splash_cuda_silu_mul(s->gg, I, s->gu, I, s->gg, I, S, I, stream);
    if (!rc) rc = splash_q4_gemm_prep(&s->gxs, s->gg, S, I, I, stream);
    g.xdiv = 0; /* down reads the slots' hidden states in sorted order */
    if (!rc) rc = splash_q4_gemm_grouped(down, nullptr, sd, &g, &s->gxs, s->gd, nullptr, stream);
    if (rc) return rc;
    SPLASH_CUDA_TRY(launch_kernel(combine_kernel, dim3((unsigned)((H + 255) / 256), (unsigned)rows), 256, 0, st, fo,
                                  ldf, s->gd, s->inv, w, H, K, (float *)nullptr, (size_t)0));
    return SPLASH_OK;
}

extern "C" int splash_cuda_moe_experts_gemm(const splash_q4_matrix *gate, const splash_q4_matrix *up,
                                            const splash_q4_matrix *down, int n_experts, const int32_t *idx,
                                            const float *w, int rows, const float *xn, size_t ldx, float *fo, size_t ldf,
                                            splash_cuda_moe_scratch *s, struct CUstream_st *stream) {
    if (!gate || !up || !down || !idx || !w || !xn || !fo || !s || !s->dev2 || rows < 0 || rows > s->max_rows ||
        n_experts < 1 || n_experts > SPLASH_CUDA_MOE_MAX_EXPERTS || ldx < (size_t)s->hidden || ldf < (size_t)s->hidden)
        return SPLASH_E_INVALID;
    /* Chunks of rows: every step is row-independent, so a row's result is
     * the same bits in any chunk (a 16K-row 35B-A3B prefill forward was
     * refused: 131,072 slots past the elementwise kernels' 65,535 rows), and
     * the scratch is sized for a chunk, not for max_rows. */
    const int K = s->top_k, chunk = s->gemm_rows;
    for (int r0 = 0; r0 < rows; r0 += chunk) {
        const int n = rows - r0 < chunk ? rows - r0 : chunk;
        const int rc = experts_gemm_chunk(gate, up, down, n_experts, idx + (size_t)r0 * K, w + (size_t)r0 * K, n,
                                          xn + (size_t)r0 * ldx, ldx, fo + (size_t)r0 * ldf, ldf, s, stream);
        if (rc) return rc;
    }
    return SPLASH_OK;
}
