/* attention.cu - KV write and split/combine paged attention (attention.h).
 *
 * Why it is shaped so.  Decode and verify read every K/V byte of the
 * context once per layer; the query side is tiny (decode: G = 6 or 8 query
 * heads per kv head; a 16-row verify: 96 or 128 query vectors).  So a block
 * owns one kv head's positions and all the query vectors that read them: a
 * tile of 32 positions is loaded from the pages once (converted to fp32 into
 * shared memory) and used by every query head of the GQA group and every row
 * of the lane.  Splitting the context into fixed 128-position pieces gives
 * enough blocks for the chip at long contexts; at short ones the query
 * vectors are spread over more blocks instead (the tile is then read again
 * from L2, not from HBM).  Neither choice changes a result.
 *
 * Inside a block, warp w owns QPW query vectors.  Scores: lane t of the warp
 * takes position t of the tile and computes whole dot products (K rows padded
 * by one float in shared memory, so the 32 lanes hit 32 banks; q read as
 * broadcast float4), so no shuffles are needed for a score.  Softmax: online
 * per query vector (warp max / warp sum over the tile).  P.V: lane d owns
 * dims d, d+32, ...; the weight of position t is broadcast by a shuffle.
 *
 * This is the fp32 CUDA-core version, kept for bf16 and f32 pages: each
 * warp walks the fp32 tile for its own query vectors, so the shared-memory
 * traffic grows with the query count (27B int8 at 32K context: 201 us for a
 * decode row, 1.07 ms for a 16-row verify).  int8 pages (serve's default)
 * go to the tensor-core kernel of attention_int8.cu, which writes the same
 * partials; the combine below merges either.
 *
 * C++ used: templates over head_dim and query vectors per warp; no STL.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_split.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"

using namespace splash_cuda;

namespace {

constexpr int kFmtF32 = 0, kFmtBf16 = 1, kFmtInt8 = 2; /* SPLASH_KV_* */
constexpr int kTile = 32;                           /* positions per tile = warp width */
constexpr int kSplit = SPLASH_CUDA_ATTN_SPLIT;
constexpr int kMaxWarps = 16;
constexpr int kMaxQpw = 4;
static_assert(kFlashQ == SPLASH_CUDA_ATTN_FLASH_Q, "splash_cuda_attn_bulk_split counts the flash kernel's blocks");
constexpr int kWholeSplit = 1 << 30; /* the kernels' split for a call of one split over int8 pages */
constexpr int kMaxSplits = 10240; /* the combine's fac[] (40 KB) and part[] (4 KB) within 48 KB of shared memory: 1.3M positions */

size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* ---- KV write ------------------------------------------------------------------ */

struct KvArgs {
    uint8_t *pool;
    const splash_cuda_attn_lane *lanes;
    const float *k, *v;
    size_t ldk, ldv;
    size_t k_off, ks_off, v_off, vs_off, layer_off, page_bytes;
    int format, page_tokens, head_dim, n_lanes;
};

__device__ __forceinline__ const splash_cuda_attn_lane *lane_of_row(const splash_cuda_attn_lane *lanes, int n_lanes,
                                                                    int row) {
    for (int i = 0; i < n_lanes; i++)
        if (row >= lanes[i].first_row && row < lanes[i].first_row + lanes[i].n_rows) return &lanes[i];
    return nullptr;
}

/* One warp per (row, kv head, K or V).  EARLY (splash_cuda_kv_write's
 * early): the row's lane and page found before the programmatic wait (the
 * lanes and page tables: nothing in the chain writes them), so those two
 * dependent loads overlap the kernel before; every thread still waits. */
template <bool EARLY>
__global__ void kv_write_kernel(const KvArgs a) {
    if constexpr (EARLY) pdl_launch_dependents();
    else pdl_begin();
    const int row = blockIdx.x, h = blockIdx.y, isv = blockIdx.z, lane = threadIdx.x;
    const splash_cuda_attn_lane *ln = lane_of_row(a.lanes, a.n_lanes, row);
    const int pos = ln ? ln->n_past + (row - ln->first_row) : 0;
    uint8_t *base = ln ? a.pool + (size_t)ln->pages[pos / a.page_tokens] * a.page_bytes + a.layer_off : nullptr;
    if constexpr (EARLY) pdl_wait();
    if (!ln) return;
    const size_t ri = (size_t)h * a.page_tokens + (size_t)(pos % a.page_tokens);
    const int hd = a.head_dim;
    const float *x = (isv ? a.v + (size_t)row * a.ldv : a.k + (size_t)row * a.ldk) + (size_t)h * hd;
    uint8_t *vals = base + (isv ? a.v_off : a.k_off);
    if (a.format == kFmtF32) {
        float *d = reinterpret_cast<float *>(vals) + ri * hd;
        for (int i = lane; i < hd; i += 32) d[i] = x[i];
    } else if (a.format == kFmtBf16) {
        uint16_t *d = reinterpret_cast<uint16_t *>(vals) + ri * hd;
        for (int i = lane; i < hd; i += 32) d[i] = f32_to_bf16(x[i]);
    } else {
        float amax = 0.f;
        for (int i = lane; i < hd; i += 32) amax = fmaxf(amax, fabsf(x[i]));
        amax = warp_max(amax);
        const float s = amax / 127.0f;
        int8_t *d = reinterpret_cast<int8_t *>(vals) + ri * hd;
        if (lane == 0) reinterpret_cast<float *>(base + (isv ? a.vs_off : a.ks_off))[ri] = s;
        if (!(s > 0.0f)) {
            for (int i = lane; i < hd; i += 32) d[i] = 0;
            return;
        }
        for (int i = lane; i < hd; i += 32) {
            float r = rintf(x[i] / s);
            r = r < 127.0f ? r : 127.0f; /* NaN -> 127, as the CPU */
            r = r > -127.0f ? r : -127.0f;
            d[i] = (int8_t)r;
        }
    }
}

/* ---- split kernel ---------------------------------------------------------------- */

template <int HD>
__host__ __device__ constexpr size_t split_smem_bytes(int qchunk) {
    return ((size_t)qchunk * HD + (size_t)kTile * (HD + 1) + (size_t)kTile * HD + 2 * kTile) * sizeof(float);
}

/* Four consecutive values of a K or V row as fp32 (exact widening). */
__device__ __forceinline__ float4 load4(const uint8_t *p, int format) {
    if (format == kFmtInt8) {
        const uint32_t w = *reinterpret_cast<const uint32_t *>(p);
        return make_float4((float)(int8_t)(w & 0xFF), (float)(int8_t)((w >> 8) & 0xFF),
                           (float)(int8_t)((w >> 16) & 0xFF), (float)(int8_t)(w >> 24));
    }
    if (format == kFmtBf16) {
        const uint2 w = *reinterpret_cast<const uint2 *>(p);
        return make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xFFFF0000u),
                           __uint_as_float(w.y << 16), __uint_as_float(w.y & 0xFFFF0000u));
    }
    return *reinterpret_cast<const float4 *>(p);
}

template <int HD, int QPW>
__global__ void __launch_bounds__(kMaxWarps * 32) attn_split_kernel(const AttnArgs a) {
    pdl_begin();
    constexpr int DPL = HD / 32; /* output dims per lane */
    extern __shared__ __align__(16) float smem[];
    __shared__ size_t row_off[kTile]; /* byte offset of the tile position's K row (values part) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int kvh = blockIdx.x / a.n_qchunks, qc = blockIdx.x % a.n_qchunks;
    const splash_cuda_attn_lane ln = a.lanes[blockIdx.y];
    const int G = a.group;
    const int qv0 = qc * a.qchunk;
    const int nq = G * ln.n_rows - qv0; /* query vectors of this block */
    if (nq <= 0) return;
    const int nqb = nq < a.qchunk ? nq : a.qchunk;
    const int sp = split_len(a, ln);
    const int p0 = blockIdx.z * sp;
    const int last_lim = ln.n_past + (qv0 + nqb - 1) / G + 1; /* the block's longest context */
    if (p0 >= last_lim) return;
    const int p1 = min(p0 + sp, last_lim);

    float *qs = smem;                       /* [qchunk][HD] */
    float *ks = qs + (size_t)a.qchunk * HD; /* [kTile][HD + 1] */
    float *vs = ks + kTile * (HD + 1);      /* [kTile][HD] */
    float *ksc = vs + kTile * HD;           /* [kTile] K scale (1 unless int8) */
    float *vsc = ksc + kTile;               /* [kTile] */

    for (int i = threadIdx.x; i < nqb * (HD / 4); i += blockDim.x) {
        const int qi = i / (HD / 4), d4 = (i % (HD / 4)) * 4;
        const int qv = qv0 + qi, r = qv / G, h = kvh * G + qv % G;
        *reinterpret_cast<float4 *>(qs + (size_t)qi * HD + d4) =
            *reinterpret_cast<const float4 *>(a.q + (size_t)(ln.first_row + r) * a.ldq + (size_t)h * HD + d4);
    }

    float acc[QPW][DPL], m[QPW], l[QPW];
    int lim[QPW];
#pragma unroll
    for (int k = 0; k < QPW; k++) {
        const int qi = warp + nwarps * k;
        lim[k] = qi < nqb ? ln.n_past + (qv0 + qi) / G + 1 : 0;
        m[k] = -INFINITY, l[k] = 0.f;
#pragma unroll
        for (int j = 0; j < DPL; j++) acc[k][j] = 0.f;
    }

    const size_t vdelta = a.v_off - a.k_off, vsdelta = a.vs_off - a.ks_off;
    const int vsz = a.format == kFmtInt8 ? 1 : a.format == kFmtBf16 ? 2 : 4;
    for (int t0 = p0; t0 < p1; t0 += kTile) {
        __syncthreads(); /* the previous tile is consumed (and qs is written, first time) */
        if (threadIdx.x < kTile) {
            const int t = threadIdx.x, pos = t0 + t;
            if (pos < p1) {
                const size_t ri = (size_t)kvh * a.page_tokens + (size_t)(pos % a.page_tokens);
                const size_t lbase = (size_t)ln.pages[pos / a.page_tokens] * a.page_bytes + a.layer_off;
                row_off[t] = lbase + a.k_off + ri * HD * vsz;
                if (a.format == kFmtInt8) {
                    const float *sc = reinterpret_cast<const float *>(a.pool + lbase + a.ks_off) + ri;
                    ksc[t] = sc[0];
                    vsc[t] = *reinterpret_cast<const float *>(reinterpret_cast<const uint8_t *>(sc) + vsdelta);
                } else {
                    ksc[t] = 1.f, vsc[t] = 1.f;
                }
            } else {
                row_off[t] = 0, ksc[t] = 0.f, vsc[t] = 0.f;
            }
        }
        __syncthreads();
        for (int i = threadIdx.x; i < kTile * (HD / 4); i += blockDim.x) {
            const int t = i / (HD / 4), d4 = (i % (HD / 4)) * 4;
            float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
            if (t0 + t < p1) {
                const uint8_t *p = a.pool + row_off[t] + (size_t)d4 * vsz;
                kv = load4(p, a.format);
                vv = load4(p + vdelta, a.format);
            }
            float *kr = ks + t * (HD + 1) + d4;
            kr[0] = kv.x, kr[1] = kv.y, kr[2] = kv.z, kr[3] = kv.w;
            *reinterpret_cast<float4 *>(vs + t * HD + d4) = vv;
        }
        __syncthreads();

        /* scores: lane = position t0 + lane */
        float s[QPW];
#pragma unroll
        for (int k = 0; k < QPW; k++) s[k] = 0.f;
        const float *krow = ks + lane * (HD + 1);
#pragma unroll 4
        for (int d = 0; d < HD; d += 4) {
            const float k0 = krow[d], k1 = krow[d + 1], k2 = krow[d + 2], k3 = krow[d + 3];
#pragma unroll
            for (int k = 0; k < QPW; k++) {
                const int qi = warp + nwarps * k;
                if (qi < nqb) {
                    const float4 qq = *reinterpret_cast<const float4 *>(qs + (size_t)qi * HD + d);
                    s[k] = fmaf(qq.x, k0, s[k]);
                    s[k] = fmaf(qq.y, k1, s[k]);
                    s[k] = fmaf(qq.z, k2, s[k]);
                    s[k] = fmaf(qq.w, k3, s[k]);
                }
            }
        }
        const int pos = t0 + lane;
        float w[QPW];
#pragma unroll
        for (int k = 0; k < QPW; k++) {
            /* warp-uniform: qi < nqb; invalid query vectors have lim 0 and stay empty */
            const float sc = pos < lim[k] ? __fmul_rn(__fmul_rn(s[k], ksc[lane]), a.scale) : -INFINITY;
            const float mnew = fmaxf(m[k], warp_max(sc));
            float p = 0.f, alpha = 1.f;
            if (mnew != -INFINITY) {
                p = expf(sc - mnew);
                alpha = expf(m[k] - mnew);
            }
            l[k] = fmaf(l[k], alpha, warp_sum(p));
            m[k] = mnew;
#pragma unroll
            for (int j = 0; j < DPL; j++) acc[k][j] *= alpha;
            w[k] = p * vsc[lane];
        }
        const int tn = min(kTile, p1 - t0);
        for (int t = 0; t < tn; t++) {
            float wt[QPW];
#pragma unroll
            for (int k = 0; k < QPW; k++) wt[k] = __shfl_sync(kFull, w[k], t);
            const float *vrow = vs + t * HD + lane;
#pragma unroll
            for (int j = 0; j < DPL; j++) {
                const float vv = vrow[32 * j];
#pragma unroll
                for (int k = 0; k < QPW; k++) acc[k][j] = fmaf(wt[k], vv, acc[k][j]);
            }
        }
    }

#pragma unroll
    for (int k = 0; k < QPW; k++) {
        const int qi = warp + nwarps * k;
        if (qi >= nqb) continue;
        const int qv = qv0 + qi, r = qv / G, h = kvh * G + qv % G;
        const size_t idx = ((size_t)blockIdx.z * a.rows + (size_t)(ln.first_row + r)) * a.n_heads + h;
        float *o = a.part_o + idx * HD + lane;
#pragma unroll
        for (int j = 0; j < DPL; j++) o[32 * j] = acc[k][j];
        if (lane == 0) {
            a.part_ml[2 * idx] = m[k];
            a.part_ml[2 * idx + 1] = l[k];
        }
    }
}

/* ---- combine --------------------------------------------------------------------- */

struct CombineArgs {
    const splash_cuda_attn_lane *lanes;
    const float *part_o, *part_ml, *gate;
    float *out;
    size_t ldg, ldo;
    int n_lanes, rows, n_heads, head_dim;
    int n_splits; /* the split kernel's grid.z: splits that exist in the workspace */
    int split;       /* positions per split (lane_splits > 0: the lane's, lane_split_len) */
    int lane_splits;
    int direct1;  /* the split kernel wrote the rows of one split (the int8 kernel does) */
};

/* The split of lane ln (the split kernels' split_len). */
__device__ __forceinline__ int combine_split(const CombineArgs &a, const splash_cuda_attn_lane *ln) {
    return lane_split_of(a.split, a.lane_splits, ln->n_past, ln->n_rows);
}

/* fac[] of the combine kernel, in floats: the splits rounded up to 4.  The
 * final loop reads fac[s] for s < ns in order; ptxas merges the reads of its
 * unrolled remainder (fac[s..s+2]) into one wide shared load that runs past
 * the row's last split, and with exactly `splits` floats allocated that load
 * left the block's shared memory (compute-sanitizer: "Invalid __shared__ read
 * of size 12 bytes" in every thread of every combine block when splits = 1).
 * The padding keeps every such read inside the allocation; the values read
 * beyond ns are never used. */
__host__ __device__ constexpr size_t combine_fac_floats(int splits) { return ((size_t)splits + 3) & ~(size_t)3; }

/* One block per (head, row, 64 dims): merge the row's splits.  Thread (d,
 * sg) sums the splits sg, sg + 16, ... of dim d in order, then the 16 group
 * sums are added in group order: a fixed order that depends on the row's
 * split count only.  (One thread per dim walking every split took 16 us for
 * a 32K-context decode row, 257 dependent steps per thread on 24 blocks.) */
constexpr int kCombineDims = 64, kCombineGroups = 16;

__global__ void __launch_bounds__(kCombineDims * kCombineGroups) attn_combine_kernel(const CombineArgs a) {
    pdl_begin();
    extern __shared__ __align__(16) float fac[]; /* [combine_fac_floats(n_splits)] */
    __shared__ float red[32];
    __shared__ float part[kCombineGroups][kCombineDims];
    const int h = blockIdx.x, row = blockIdx.y, hd = a.head_dim;
    const splash_cuda_attn_lane *ln = lane_of_row(a.lanes, a.n_lanes, row);
    if (!ln) return;
    const int ctx = ln->n_past + (row - ln->first_row) + 1;
    /* ctx <= max_ctx is the caller's promise (attention.h); a lane that breaks
     * it gets a wrong result for its last positions, never a read outside
     * the workspace or fac. */
    const int sp = combine_split(a, ln), ns = min((ctx + sp - 1) / sp, a.n_splits);
    if (ns == 1 && a.direct1) return; /* done by the split kernel */
    const size_t stride = (size_t)a.rows * a.n_heads; /* between splits, in (row, head) units */
    const size_t base = (size_t)row * a.n_heads + h;
    float mx = -INFINITY;
    for (int s = threadIdx.x; s < ns; s += blockDim.x) mx = fmaxf(mx, a.part_ml[2 * (s * stride + base)]);
    mx = warp_max(mx);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = -INFINITY;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) mx = fmaxf(mx, red[i]);
    __syncthreads();
    float lsum = 0.f;
    for (int s = threadIdx.x; s < ns; s += blockDim.x) {
        const float ms = a.part_ml[2 * (s * stride + base)];
        const float f = ms == -INFINITY ? 0.f : expf(ms - mx);
        fac[s] = f;
        lsum = fmaf(a.part_ml[2 * (s * stride + base) + 1], f, lsum);
    }
    lsum = block_sum(lsum, red); /* also the barrier after fac[] */
    const int dl = threadIdx.x % kCombineDims, sg = threadIdx.x / kCombineDims;
    const int d = blockIdx.z * kCombineDims + dl;
    float v = 0.f;
    if (d < hd)
        for (int s = sg; s < ns; s += kCombineGroups) v = fmaf(a.part_o[(s * stride + base) * hd + d], fac[s], v);
    part[sg][dl] = v;
    __syncthreads();
    if (sg || d >= hd) return;
    v = 0.f;
#pragma unroll
    for (int i = 0; i < kCombineGroups; i++) v += part[i][dl];
    v *= 1.0f / lsum;
    if (a.gate) v = __fmul_rn(v, sigmoidf_(a.gate[(size_t)row * a.ldg + (size_t)h * hd + d]));
    a.out[(size_t)row * a.ldo + (size_t)h * hd + d] = v;
}

/* Launches whose rows have at most kCombineSmallSplits splits (prefill
 * chunks, verify blocks at short contexts): one block of head_dim threads a
 * (head, row), a thread a dim walking the row's splits in order, each warp
 * finding the splits' max and sum itself (lane s the split s).  The same
 * operations in the same order as attn_combine_kernel's for such rows (its
 * group g sums splits g and g + 16, the groups are added in order starting
 * from +0; its block_sum's total is warp 0's shuffle tree plus zeros), so the
 * same bits, without that kernel's 1,024 threads a (head, row, 64 dims),
 * most of them idle here: a 2,048-row 27B prefill chunk launched 208K such
 * blocks, 1.2 ms of a 4K prefill's 32.8 (session 22's trace; 0.12 ms with
 * this kernel).  Decode and verify gain too (27B, 1K context: a step 6.421 ->
 * 6.366 ms, verify 16 12.71 -> 12.37; session 23). */
constexpr int kCombineSmallSplits = 2 * kCombineGroups; /* a warp's lanes hold the splits' max and sum */

__global__ void attn_combine_small_kernel(const CombineArgs a) {
    pdl_begin();
    const int h = blockIdx.x, row = blockIdx.y, hd = a.head_dim, d = threadIdx.x, lane = threadIdx.x & 31;
    const splash_cuda_attn_lane *ln = lane_of_row(a.lanes, a.n_lanes, row);
    if (!ln) return;
    const int ctx = ln->n_past + (row - ln->first_row) + 1;
    const int sp = combine_split(a, ln), ns = min((ctx + sp - 1) / sp, a.n_splits); /* <= kCombineSmallSplits */
    if (ns == 1 && a.direct1) return; /* done by the split kernel */
    const size_t stride = (size_t)a.rows * a.n_heads, base = (size_t)row * a.n_heads + h;
    const float ms = lane < ns ? a.part_ml[2 * (lane * stride + base)] : -INFINITY;
    const float mx = warp_max(ms);
    const float f = lane < ns && ms != -INFINITY ? expf(ms - mx) : 0.f;
    const float lsum = warp_sum(lane < ns ? fmaf(a.part_ml[2 * (lane * stride + base) + 1], f, 0.f) : 0.f);
    float o[kCombineSmallSplits]; /* every split's value loaded before the sum (a decode row's latency) */
#pragma unroll
    for (int s = 0; s < kCombineSmallSplits; s++) o[s] = s < ns ? a.part_o[(s * stride + base) * hd + d] : 0.f;
    float v = 0.f;
#pragma unroll
    for (int s = 0; s < kCombineGroups; s++) { /* group s: splits s, s + 16, as attn_combine_kernel's thread sg = s */
        const float f0 = __shfl_sync(kFull, f, s), f1 = __shfl_sync(kFull, f, s + kCombineGroups);
        float gs = fmaf(o[s], f0, 0.f);
        if (s + kCombineGroups < ns) gs = fmaf(o[s + kCombineGroups], f1, gs);
        if (s < ns) v += gs;
    }
    v *= 1.0f / lsum;
    if (a.gate) v = __fmul_rn(v, sigmoidf_(a.gate[(size_t)row * a.ldg + (size_t)h * hd + d]));
    a.out[(size_t)row * a.ldo + (size_t)h * hd + d] = v;
}

/* ---- dispatch ---------------------------------------------------------------------- */

int sm_count() {
    static int n = 0; /* benign race: every thread computes the same value */
    if (!n) {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v < 1)
            v = 132;
        n = v;
    }
    return n;
}

template <int HD, int QPW>
int launch_split(const AttnArgs &a, dim3 grid, int nwarps, cudaStream_t s) {
    static bool attr_set = false; /* once per instantiation; setting it again is harmless */
    const size_t smem = split_smem_bytes<HD>(a.qchunk);
    if (!attr_set) {
        SPLASH_CUDA_TRY(cudaFuncSetAttribute(attn_split_kernel<HD, QPW>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)split_smem_bytes<HD>(kMaxWarps * kMaxQpw)));
        attr_set = true;
    }
    SPLASH_CUDA_TRY(launch_kernel(attn_split_kernel<HD, QPW>, grid, nwarps * 32, smem, s, a));
    return SPLASH_OK;
}

template <int HD>
int launch_split_hd(const AttnArgs &a, dim3 grid, int qpw, int nwarps, cudaStream_t s) {
    switch (qpw) {
    case 1: return launch_split<HD, 1>(a, grid, nwarps, s);
    case 2: return launch_split<HD, 2>(a, grid, nwarps, s);
    default: return launch_split<HD, 4>(a, grid, nwarps, s);
    }
}

} /* namespace */

/* ---- C API --------------------------------------------------------------------------- */

extern "C" int splash_cuda_kv_layout_init(splash_cuda_kv_layout *l, int format, int n_layers, int kv_heads,
                                          int head_dim, int page_tokens) {
    if (!l) return SPLASH_E_INVALID;
    memset(l, 0, sizeof *l);
    size_t es;
    switch (format) {
    case kFmtF32: es = 4; break;
    case kFmtBf16: es = 2; break;
    case kFmtInt8: es = 1; break;
    default: return SPLASH_E_UNSUPPORTED;
    }
    if (n_layers < 0 || kv_heads < 1 || page_tokens < 1 || head_dim < 1 || head_dim > 1024) return SPLASH_E_INVALID;
    l->format = format;
    l->page_tokens = page_tokens;
    l->kv_heads = kv_heads;
    l->head_dim = head_dim;
    l->n_layers = n_layers;
    l->value_size = (int)es;
    const size_t rows = (size_t)kv_heads * (size_t)page_tokens;
    const size_t values = align64(rows * (size_t)head_dim * es);
    const size_t scales = format == kFmtInt8 ? align64(rows * sizeof(float)) : 0;
    l->k_off = 0;
    l->ks_off = values;
    l->v_off = values + scales;
    l->vs_off = l->v_off + values;
    l->layer_bytes = 2 * (values + scales);
    l->page_bytes = (size_t)n_layers * l->layer_bytes;
    return SPLASH_OK;
}

extern "C" int splash_cuda_kv_write(const splash_cuda_kv_layout *l, uint8_t *pool, int layer,
                                    const splash_cuda_attn_lane *lanes, int n_lanes, int rows, const float *k,
                                    size_t ldk, const float *v, size_t ldv, int early, struct CUstream_st *stream) {
    if (!l || !pool || !lanes || !k || !v || layer < 0 || layer >= l->n_layers || n_lanes < 0 || rows < 0 ||
        l->kv_heads > 65535)
        return SPLASH_E_INVALID;
    if (l->format != kFmtF32 && l->format != kFmtBf16 && l->format != kFmtInt8) return SPLASH_E_UNSUPPORTED;
    if (rows == 0 || n_lanes == 0) return SPLASH_OK;
    KvArgs a;
    a.pool = pool, a.lanes = lanes, a.k = k, a.v = v, a.ldk = ldk, a.ldv = ldv;
    a.k_off = l->k_off, a.ks_off = l->ks_off, a.v_off = l->v_off, a.vs_off = l->vs_off;
    a.layer_off = (size_t)layer * l->layer_bytes, a.page_bytes = l->page_bytes;
    a.format = l->format, a.page_tokens = l->page_tokens, a.head_dim = l->head_dim, a.n_lanes = n_lanes;
    SPLASH_CUDA_TRY(launch_kernel(early ? kv_write_kernel<true> : kv_write_kernel<false>,
                                  dim3((unsigned)rows, (unsigned)l->kv_heads, 2), 32, 0, (cudaStream_t)stream, a));
    return SPLASH_OK;
}

/* On unless set; SPLASH_CUDA_ATTN_EARLY=0 in the environment turns it off at
 * the first read (an A/B switch: docs/cuda.md, "Session 28"). */
static int g_attn_early = -1; /* benign race: every thread computes the same value */

extern "C" int splash_cuda_attn_early_loads(void) { return env_switch(&g_attn_early, "SPLASH_CUDA_ATTN_EARLY", 1); }

extern "C" void splash_cuda_set_attn_early_loads(int on) { g_attn_early = on ? 1 : 0; }

/* The default split, SPLASH_CUDA_ATTN_SPLIT unless the environment's
 * SPLASH_CUDA_ATTN_SPLIT (a multiple of 64 up to 4,096) names another at the
 * first read: an A/B switch (docs/cuda.md, "Session 30").  Read once, so the
 * workspace's size and every call agree. */
static int g_split = 0; /* benign race: every thread computes the same value */

static int default_split() {
    if (!g_split) {
        const char *e = getenv("SPLASH_CUDA_ATTN_SPLIT");
        const int v = e && *e ? atoi(e) : 0;
        g_split = v >= 64 && v <= 4096 && v % 64 == 0 ? v : kSplit;
    }
    return g_split;
}

/* Whether int8 lanes of more than one n-tile take attention_int8_wide.cu's
 * kernel: on unless SPLASH_CUDA_ATTN_WIDE=0 (read once), an A/B switch
 * (docs/cuda.md, "Session 31"). */
static int g_attn_wide = -1;
static bool wide_kernel() { return env_switch(&g_attn_wide, "SPLASH_CUDA_ATTN_WIDE", 1); }

/* Whether calls over int8 pages with a split of SPLASH_CUDA_ATTN_SPLIT_LONG or
 * longer take attention_int8_flash.cu
 * (SPLASH_CUDA_ATTN_FLASH=0: attention_int8_wide.cu's, an A/B switch, read once). */
static int g_attn_flash = -1;
extern "C" int splash_cuda_attn_flash(void) { return env_switch(&g_attn_flash, "SPLASH_CUDA_ATTN_FLASH", 1); }

/* Whether a call that takes the default split gives each lane its own
 * (lane_split_len; SPLASH_CUDA_ATTN_LANE_SPLIT=0: every lane the default, an
 * A/B switch, read once). */
static int g_lane_split = -1;
static bool lane_split_on() { return env_switch(&g_lane_split, "SPLASH_CUDA_ATTN_LANE_SPLIT", 1); }

/* Whether int8 calls take the query-chunk rule of session 43 (one wave of
 * blocks, equal chunks): on unless SPLASH_CUDA_ATTN_QCHUNK=0 (read once). */
static int g_qchunk_rule = -1;
static bool qchunk_rule() { return env_switch(&g_qchunk_rule, "SPLASH_CUDA_ATTN_QCHUNK", 1); }

static int split_of(int split) { return split ? split : default_split(); }
static int n_splits(int max_ctx, int split) { return (max_ctx + split - 1) / split; }

extern "C" size_t splash_cuda_attn_workspace_bytes(int rows, int n_heads, int head_dim, int max_ctx, int split) {
    if (rows < 1 || n_heads < 1 || head_dim < 1 || max_ctx < 1 || split < 0 || split % 64) return 0;
    const size_t units = (size_t)n_splits(max_ctx, split_of(split)) * rows * n_heads;
    return align64(units * head_dim * sizeof(float)) + align64(units * 2 * sizeof(float));
}

extern "C" int splash_cuda_attention(const splash_cuda_attn_args *a, struct CUstream_st *stream) {
    if (!a || !a->layout || !a->pool || !a->lanes || !a->q || !a->out || !a->workspace) return SPLASH_E_INVALID;
    const splash_cuda_kv_layout *l = a->layout;
    const int hd = l->head_dim;
    if (a->layer < 0 || a->layer >= l->n_layers || a->n_lanes < 0 || a->n_lanes > 65535 || a->rows < 0 ||
        a->rows > 65535 || a->max_lane_rows < 0 || a->min_lane_rows < 0 || a->min_lane_rows > a->max_lane_rows ||
        a->max_ctx < 0 || a->n_heads < 1 || a->n_heads % l->kv_heads ||
        a->n_heads > 65535 || a->split < 0 || a->split % 64 || a->max_ctx > kMaxSplits * split_of(a->split))
        return SPLASH_E_INVALID;
    const int split = split_of(a->split);
    if (hd != 64 && hd != 128 && hd != 256) return SPLASH_E_UNSUPPORTED;
    if (l->format != kFmtF32 && l->format != kFmtBf16 && l->format != kFmtInt8) return SPLASH_E_UNSUPPORTED;
    if (a->rows == 0 || a->n_lanes == 0 || a->max_lane_rows == 0 || a->max_ctx == 0) return SPLASH_OK;
    const cudaStream_t s = (cudaStream_t)stream;
    const int G = a->n_heads / l->kv_heads;
    /* the default split: a lane of 2+ rows takes its own (lane_split_of), so
     * where every lane has 2+ rows the grid needs at most lane_splits splits */
    const int lane_splits = a->split == 0 && lane_split_on() ? (kLaneBlocks + l->kv_heads - 1) / l->kv_heads : 0;
    const int splits = lane_splits && a->min_lane_rows > 1 && n_splits(a->max_ctx, split) > lane_splits
                           ? lane_splits
                           : n_splits(a->max_ctx, split);
    /* int8 pages in one split: every vector's output written by its split
     * block (write_vector), no partials and no combine */
    const bool whole = l->format == kFmtInt8 && splits == 1;
    if (!whole && a->workspace_bytes < splash_cuda_attn_workspace_bytes(a->rows, a->n_heads, hd, a->max_ctx, a->split))
        return SPLASH_E_RANGE;
    const int nq = G * a->max_lane_rows;

    /* Query vectors per block: all of them when the (lane, kv head, split)
     * blocks already fill the chip (int8: once; the others: twice), else
     * spread over more blocks.  The int8 kernel takes them in n-tiles of 8,
     * at most kInt8MaxQ a block, in chunks of equal n-tiles: blocks of one
     * or two n-tiles and unequal chunks (32 + 16 for 48 vectors) measured
     * slower than fewer, fuller ones (docs/cuda.md, session 43;
     * SPLASH_CUDA_ATTN_QCHUNK=0: the rule before, an A/B switch). */
    const bool int8 = l->format == kFmtInt8, qrule = int8 && qchunk_rule();
    const long long base = (long long)a->n_lanes * l->kv_heads * splits, want = (qrule ? 1LL : 2LL) * sm_count();
    int qchunks = 1;
    if (base < want) qchunks = (int)((want + base - 1) / base);
    if (qchunks > nq) qchunks = nq;
    int qchunk = (nq + qchunks - 1) / qchunks;
    if (qrule && qchunk > kInt8MaxQ) {
        qchunks = (nq + kInt8MaxQ - 1) / kInt8MaxQ;
        qchunk = (nq + qchunks - 1) / qchunks;
    }
    if (int8) qchunk = qchunk > kInt8MaxQ ? kInt8MaxQ : (qchunk + 7) / 8 * 8;
    if (qchunk > kMaxWarps * kMaxQpw) qchunk = kMaxWarps * kMaxQpw;
    qchunks = (nq + qchunk - 1) / qchunk;
    const int qpw = qchunk <= kMaxWarps ? 1 : qchunk <= 2 * kMaxWarps ? 2 : 4;
    const int nwarps = (qchunk + qpw - 1) / qpw;
    if ((long long)l->kv_heads * qchunks > 0x7FFFFFFFLL) return SPLASH_E_INVALID;

    AttnArgs k;
    k.pool = a->pool, k.lanes = a->lanes, k.q = a->q;
    const size_t units = (size_t)splits * a->rows * a->n_heads;
    k.part_o = (float *)a->workspace;
    k.part_ml = (float *)((uint8_t *)a->workspace + align64(units * hd * sizeof(float)));
    k.ldq = a->ldq;
    k.k_off = l->k_off, k.ks_off = l->ks_off, k.v_off = l->v_off, k.vs_off = l->vs_off;
    k.layer_off = (size_t)a->layer * l->layer_bytes, k.page_bytes = l->page_bytes;
    k.format = l->format, k.page_tokens = l->page_tokens;
    k.n_heads = a->n_heads, k.group = G, k.rows = a->rows;
    k.qchunk = qchunk, k.n_qchunks = qchunks;
    k.scale = a->scale;
    /* one split: the kernels' split as long as any context, so that a lane
     * past max_ctx (the caller's promise broken) still gets outputs, never
     * a partial written into a workspace it was not given */
    k.split = whole ? kWholeSplit : split;
    k.lane_splits = whole ? 0 : lane_splits, k.max_ctx = a->max_ctx;
    k.heavy_first = 0;
    k.out = a->out, k.gate = a->gate, k.ldo = a->ldo, k.ldg = a->ldg;
    const dim3 grid((unsigned)(l->kv_heads * qchunks), (unsigned)a->n_lanes, (unsigned)splits);
    /* attention_int8.cu: two stage buffers (2 blocks an SM) only where every
     * lane is deep and the blocks fit one wave of them; else one (4 an SM) */
    const long long blocks = (long long)grid.x * grid.y * grid.z;
    k.stage_bufs = G * a->max_lane_rows <= kInt8NTile && blocks <= 2LL * sm_count() ? 2 : 1;
    k.deep_only = 0;
    int rc = SPLASH_OK;
    if (int8 && a->split >= SPLASH_CUDA_ATTN_SPLIT_LONG && splash_cuda_attn_flash()) {
        /* bulk prefill rows: every lane in blocks of kFlashQ query vectors,
         * the blocks of a lane's last rows (the longest) first, so that the
         * short ones fill the last wave */
        k.qchunk = kFlashQ, k.n_qchunks = (nq + kFlashQ - 1) / kFlashQ;
        k.heavy_first = 1;
        rc = attn_int8_flash_launch(k, hd, dim3((unsigned)(l->kv_heads * k.n_qchunks), grid.y, grid.z), s);
    } else if (int8) {
        /* lanes of more than one n-tile to attention_int8_wide.cu (unless
         * SPLASH_CUDA_ATTN_WIDE=0), the others to attention_int8.cu; a kernel
         * runs only where the lanes' row counts say it has lanes */
        const bool any_wide = G * a->max_lane_rows > kInt8NTile;
        const bool any_deep = a->min_lane_rows < 1 || G * a->min_lane_rows <= kInt8NTile;
        k.deep_only = any_wide && wide_kernel();
        if (any_deep || !k.deep_only) rc = attn_int8_split_launch(k, hd, grid, s);
        if (!rc && k.deep_only) rc = attn_int8_wide_launch(k, hd, grid, s);
    } else if (hd == 64)
        rc = launch_split_hd<64>(k, grid, qpw, nwarps, s);
    else if (hd == 128)
        rc = launch_split_hd<128>(k, grid, qpw, nwarps, s);
    else
        rc = launch_split_hd<256>(k, grid, qpw, nwarps, s);
    if (rc || whole) return rc;

    CombineArgs c;
    c.lanes = a->lanes, c.part_o = k.part_o, c.part_ml = k.part_ml, c.gate = a->gate, c.out = a->out;
    c.ldg = a->ldg, c.ldo = a->ldo;
    c.n_lanes = a->n_lanes, c.rows = a->rows, c.n_heads = a->n_heads, c.head_dim = hd;
    c.n_splits = splits, c.split = split, c.lane_splits = k.lane_splits, c.direct1 = int8;
    if (splits <= kCombineSmallSplits) {
        SPLASH_CUDA_TRY(launch_kernel(attn_combine_small_kernel, dim3((unsigned)a->n_heads, (unsigned)a->rows),
                                      (unsigned)hd, 0, s, c));
        return SPLASH_OK;
    }
    SPLASH_CUDA_TRY(
        launch_kernel(attn_combine_kernel,
                      dim3((unsigned)a->n_heads, (unsigned)a->rows, (unsigned)((hd + kCombineDims - 1) / kCombineDims)),
                      kCombineDims * kCombineGroups, combine_fac_floats(splits) * sizeof(float), s, c));
    return SPLASH_OK;
}
