/* q4_gemm.cu - q4 x fp16 products for prefill on the tensor cores
 * (q4_gemm.h), on q4_matmul.h's tiled layout.
 *
 * Why it is shaped so.  With many rows of x the weights are reused across
 * rows and the product is bound by the tensor cores, so the weights are
 * dequantised once per block into fp16 A fragments and multiplied against as
 * many x rows as the block's registers hold.
 *
 * - A block computes 256 weight rows (16 row tiles) x BN rows of x (64 or
 *   128), walking the groups (64 columns) in order.  Per group a stage of
 *   shared memory holds the tiles' codes (16 x 512 B, in the A-fragment order
 *   of the tiled layout), their scales and biases (16 x 64 B) and x's BN x 64
 *   fp16 columns; cp.async fills kStages stages ahead, so HBM and L2 latency
 *   hide under the arithmetic of the stages in between.
 * - 8 warps, 4 along the weight rows x 2 along x: a warp turns its 4 tiles'
 *   codes into fp16 weights (q4_tile.cuh's exact q, then scale * q + bias in
 *   one f16x2 fma) and runs 4 k-steps x 4 tiles x BN/16 n-tiles of
 *   mma.sync m16n8k16 per group, fp32 accumulators in registers.
 * - x in shared memory: row n's 64 columns are 8 chunks of 16 bytes; a lane
 *   (g, t) reads chunks 2t and 2t+1 of row g (the columns the tiled layout's
 *   permuted k order gives it), stored at chunk ^ (n & 7) so the 8 lanes of a
 *   phase hit distinct banks.
 * - Grid: x = blocks of BN rows of x (the fast index), y = blocks of 256
 *   weight rows: the blocks in flight share weight rows, so the weights come
 *   from HBM about once and x is re-read from L2.
 * - Epilogue: y = acc * 2^-k (the row's scale taken out), or y += that.
 *
 * C++ used: templates (BN), nothing from the STL.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/q4_gemm.h"
#include "backend/cuda/q4_tile.cuh"

using namespace splash_cuda;

namespace {

constexpr int kTiles = 16;   /* row tiles (16 weight rows) per block */
constexpr int kWarpTiles = 4; /* of them per warp */
constexpr int kThreads = 256;
constexpr int kStages = 4;
constexpr int kCodeBytes = kTiles * 512;
constexpr int kSbBytes = kTiles * 64;

template <int BN>
struct Tile {
    static constexpr int x_bytes = BN * 128; /* BN rows x 64 fp16 */
    static constexpr int stage = kCodeBytes + kSbBytes + x_bytes;
    static constexpr int smem = kStages * stage;
    static constexpr int NT = BN / 16; /* n-tiles of 8 x rows per warp (a warp has BN / 2 rows) */
};

struct GemmParams {
    const uint8_t *codes, *sb; /* [tiles][groups][512], [tiles][groups][64] */
    const uint16_t *xhi;       /* [R][cols] */
    const float *inv_scale;    /* [R] */
    float *y;                  /* [R][rows] */
    int rows, tiles, groups, cols, R, add;
    /* grouped (MoE experts): block x = tile (tile_e, tile_n0) of the sorted
     * slots, block z = matrix array (codes / codes2 -> y / y2); expert e's
     * matrix at codes + e * estride (sb sboff further); its rows are sorted
     * positions off[e] + n0 + n, x row perm[pos] / xdiv (xdiv 0: pos) */
    const int32_t *off, *perm, *tile_e, *tile_n0, *n_tiles;
    const uint8_t *codes2;
    float *y2;
    size_t estride, sboff;
    int xdiv;
};

/* What a block reads and writes (built field by field, as q4_matmul.cu's
 * View: never a modified copy of the kernel argument). */
struct Block {
    const uint8_t *codes, *sb;
    float *y;
    int n;     /* rows of x in this block */
    int ybase; /* y row of its first */
};

template <int BN, bool GROUPED>
__device__ __forceinline__ bool make_block(const GemmParams &p, Block &b, int *xrow) {
    int n0, n, ybase;
    if (!GROUPED) {
        b.codes = p.codes, b.sb = p.sb, b.y = p.y;
        n0 = blockIdx.x * BN, n = min(BN, p.R - n0), ybase = n0;
    } else {
        const int t = blockIdx.x;
        if (t >= *p.n_tiles) return false;
        const int e = p.tile_e[t], base = p.off[e];
        n0 = p.tile_n0[t], n = min(BN, p.off[e + 1] - base - n0), ybase = base + n0;
        b.codes = (blockIdx.z ? p.codes2 : p.codes) + (size_t)e * p.estride;
        b.sb = b.codes + p.sboff;
        b.y = blockIdx.z ? p.y2 : p.y;
    }
    b.n = n, b.ybase = ybase;
    for (int i = threadIdx.x; i < BN; i += kThreads) {
        const int pos = ybase + i;
        xrow[i] = i >= n ? -1 : !GROUPED ? pos : p.xdiv ? p.perm[pos] / p.xdiv : pos;
    }
    __syncthreads();
    return true;
}

__device__ __forceinline__ uint4 lds128(uint32_t a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
    return v;
}
__device__ __forceinline__ uint2 lds64(uint32_t a) {
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a));
    return v;
}

/* Group G of the block's tiles and x rows into the stage at `st`. */
template <int BN>
__device__ __forceinline__ void load_stage(const GemmParams &p, const Block &b, const int *xrow, uint32_t st, int tile0,
                                           int G) {
    const int tid = threadIdx.x;
    for (int i = tid; i < kTiles * 32; i += kThreads) { /* codes: 32 chunks a tile */
        const int T = tile0 + (i >> 5);
        const bool ok = T < p.tiles;
        const uint8_t *src = b.codes + (ok ? ((size_t)T * p.groups + G) * 512 + (size_t)(i & 31) * 16 : 0);
        cp_async16(st + i * 16, src, ok ? 16 : 0);
    }
    if (tid < kTiles * 4) { /* scales and biases: 4 chunks a tile */
        const int T = tile0 + (tid >> 2);
        const bool ok = T < p.tiles;
        const uint8_t *src = b.sb + (ok ? ((size_t)T * p.groups + G) * 64 + (size_t)(tid & 3) * 16 : 0);
        cp_async16(st + kCodeBytes + tid * 16, src, ok ? 16 : 0);
    }
    for (int i = tid; i < BN * 8; i += kThreads) { /* x: 8 chunks a row, swizzled */
        const int n = i >> 3, k = i & 7;
        const int xr = xrow[n];
        const uint16_t *src = p.xhi + (xr >= 0 ? (size_t)xr * p.cols + (size_t)G * 64 + k * 8 : 0);
        const bool ok = xr >= 0;
        cp_async16(st + kCodeBytes + kSbBytes + n * 128 + ((k ^ (n & 7)) << 4), src, ok ? 16 : 0);
    }
}

/* bf16 (the low or high half of u) -> fp16 broadcast to both halves. */
__device__ __forceinline__ uint32_t bf16_to_h2(float f) {
    const __half h = __float2half_rn(f);
    const __half2 h2 = __halves2half2(h, h);
    return *reinterpret_cast<const uint32_t *>(&h2);
}

__device__ __forceinline__ uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* The A fragments of one tile: exact q, then scale * q + bias per row. */
__device__ __forceinline__ void weights_tile(ATile &A, uint4 c, uint2 sb) {
    dequant_tile(A, c);
    const uint32_t s0 = bf16_to_h2(bf16_lo(sb.x)), s1 = bf16_to_h2(bf16_hi(sb.x));
    const uint32_t b0 = bf16_to_h2(bf16_lo(sb.y)), b1 = bf16_to_h2(bf16_hi(sb.y));
#pragma unroll
    for (int s = 0; s < 4; s++) {
        A.a[0][s] = hfma2(A.a[0][s], s0, b0), A.a[1][s] = hfma2(A.a[1][s], s0, b0); /* row g */
        A.a[2][s] = hfma2(A.a[2][s], s1, b1), A.a[3][s] = hfma2(A.a[3][s], s1, b1); /* row g + 8 */
    }
}

template <int BN, bool GROUPED>
__global__ void __launch_bounds__(kThreads, 1) q4_gemm_kernel(const GemmParams p) {
    pdl_begin();
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ int xrow[BN]; /* the x row of each of the block's rows (-1: none) */
    Block blk;
    if (!make_block<BN, GROUPED>(p, blk, xrow)) return;
    constexpr int NT = Tile<BN>::NT;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = warp & 3, wn = warp >> 2;
    const int tile0 = blockIdx.y * kTiles;
    const uint32_t base = smem_addr(smem);

    float acc[kWarpTiles][NT][4] = {};

#pragma unroll
    for (int s = 0; s < kStages - 1; s++) {
        if (s < p.groups) load_stage<BN>(p, blk, xrow, base + s * Tile<BN>::stage, tile0, s);
        cp_async_commit();
    }
    for (int G = 0; G < p.groups; G++) {
        cp_async_wait<kStages - 2>();
        __syncthreads(); /* stage G is in; every warp is done with stage G - 1 */
        const int Gn = G + kStages - 1;
        if (Gn < p.groups) load_stage<BN>(p, blk, xrow, base + (Gn % kStages) * Tile<BN>::stage, tile0, Gn);
        cp_async_commit();

        const uint32_t st = base + (G % kStages) * Tile<BN>::stage;
        ATile A[kWarpTiles];
#pragma unroll
        for (int r = 0; r < kWarpTiles; r++) {
            const int T = wm * kWarpTiles + r;
            weights_tile(A[r], lds128(st + T * 512 + lane * 16), lds64(st + kCodeBytes + T * 64 + g * 8));
        }
        const uint32_t xs = st + kCodeBytes + kSbBytes;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int n = wn * (BN / 2) + nt * 8 + g;
            const uint32_t row = xs + n * 128;
            const uint4 v0 = lds128(row + (((2 * t) ^ (n & 7)) << 4));
            const uint4 v1 = lds128(row + (((2 * t + 1) ^ (n & 7)) << 4));
            const uint32_t b[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
            for (int r = 0; r < kWarpTiles; r++) tile_products(acc[r][nt], A[r], b);
        }
    }
    cp_async_wait<0>();

    /* acc[r][nt][c]: weight row g (+8 for c >= 2) of tile r, x row 2t (+1 for odd c) of n-tile nt */
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int c01 = 0; c01 < 2; c01++) {
            const int n = wn * (BN / 2) + nt * 8 + 2 * t + c01;
            if (n >= blk.n) continue;
            const float inv = p.inv_scale[xrow[n]];
            float *yr = blk.y + (size_t)(blk.ybase + n) * p.rows;
#pragma unroll
            for (int r = 0; r < kWarpTiles; r++) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int row = (tile0 + wm * kWarpTiles + r) * 16 + g + 8 * h;
                    if (row >= p.rows) continue;
                    const float v = __fmul_rn(acc[r][nt][2 * h + c01], inv);
                    yr[row] = p.add ? __fadd_rn(yr[row], v) : v;
                }
            }
        }
    }
}

/* grid.x: blocks of BN rows of x, or (grouped) the tile bound; grid.z: matrix arrays */
template <int BN, bool GROUPED>
int launch_gemm(const GemmParams &p, int grid_x, int grid_z, cudaStream_t stream) {
    static bool attr_set = false; /* benign race: every thread sets the same value */
    auto fn = q4_gemm_kernel<BN, GROUPED>;
    if (!attr_set) {
        SPLASH_CUDA_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile<BN>::smem));
        attr_set = true;
    }
    const dim3 grid((unsigned)grid_x, (unsigned)((p.tiles + kTiles - 1) / kTiles), (unsigned)grid_z);
    SPLASH_CUDA_TRY(launch_kernel(fn, grid, kThreads, Tile<BN>::smem, stream, p));
    return SPLASH_OK;
}

/* ---- x prepared: fp16 rows scaled by a power of two ------------------------ */

constexpr int kPrepThreads = 256;

__global__ void __launch_bounds__(kPrepThreads) q4_gemm_prep_kernel(const float *x, size_t ldx, int cols,
                                                                    uint16_t *hi, float *inv_scale) {
    pdl_begin();
    __shared__ float red[32];
    const int n = blockIdx.x, n4 = cols / 4;
    const float4 *xr = reinterpret_cast<const float4 *>(x + (size_t)n * ldx);
    float mx = 0.f;
    for (int i = threadIdx.x; i < n4; i += kPrepThreads) {
        const float4 v = xr[i];
        mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    mx = warp_max(mx);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = 0.f;
    for (int i = 0; i < kPrepThreads / 32; i++) mx = fmaxf(mx, red[i]);
    float scale, inv;
    row_pow2_scale(mx, scale, inv);
    uint2 *hr = reinterpret_cast<uint2 *>(hi + (size_t)n * cols);
    for (int i = threadIdx.x; i < n4; i += kPrepThreads) {
        const float4 v = xr[i];
        const __half2 h01 = __floats2half2_rn(v.x * scale, v.y * scale), h23 = __floats2half2_rn(v.z * scale, v.w * scale);
        hr[i] = make_uint2(*reinterpret_cast<const uint32_t *>(&h01), *reinterpret_cast<const uint32_t *>(&h23));
    }
    if (threadIdx.x == 0) inv_scale[n] = inv;
}

/* One power of two for all rows (splash_q4_gemm_prep_uniform): first the
 * largest |x| of every row into *amax (non-negative floats order as their
 * bits), then each row scaled by it. */
__global__ void __launch_bounds__(kPrepThreads) q4_gemm_amax_kernel(const float *x, size_t ldx, int cols,
                                                                    uint32_t *amax) {
    pdl_begin();
    __shared__ float red[32];
    const float4 *xr = reinterpret_cast<const float4 *>(x + (size_t)blockIdx.x * ldx);
    float mx = 0.f;
    for (int i = threadIdx.x; i < cols / 4; i += kPrepThreads) {
        const float4 v = xr[i];
        mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    mx = warp_max(mx);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < kPrepThreads / 32; i++) mx = fmaxf(mx, red[i]);
        atomicMax(amax, __float_as_uint(mx));
    }
}

__global__ void __launch_bounds__(kPrepThreads) q4_gemm_prep_uniform_kernel(const float *x, size_t ldx, int cols,
                                                                            const uint32_t *amax, uint16_t *hi,
                                                                            float *inv_scale, float *alpha) {
    pdl_begin();
    const int n = blockIdx.x;
    float scale, inv;
    row_pow2_scale(__uint_as_float(*amax), scale, inv);
    const float4 *xr = reinterpret_cast<const float4 *>(x + (size_t)n * ldx);
    uint2 *hr = reinterpret_cast<uint2 *>(hi + (size_t)n * cols);
    for (int i = threadIdx.x; i < cols / 4; i += kPrepThreads) {
        const float4 v = xr[i];
        const __half2 h01 = __floats2half2_rn(v.x * scale, v.y * scale), h23 = __floats2half2_rn(v.z * scale, v.w * scale);
        hr[i] = make_uint2(*reinterpret_cast<const uint32_t *>(&h01), *reinterpret_cast<const uint32_t *>(&h23));
    }
    if (threadIdx.x == 0) {
        inv_scale[n] = inv;
        if (n == 0) alpha[0] = inv, alpha[1] = 0.f, alpha[2] = 1.f;
    }
}

/* ---- the matrix expanded to fp16 (splash_q4_expand_f16) ---------------------- */

constexpr int kExpandThreads = 256;
constexpr size_t kPairCodes = 512, kPairSb = 64; /* bytes of one (row tile, group) */

/* One (row tile, group) pair's fp16 weights (weights_tile) from its codes and
 * scales: each lane's 16 columns of rows g and g + 8 stored as two 16-byte
 * runs. */
__device__ __forceinline__ void expand_pair(uint4 codes16, uint2 sb8, unsigned i, unsigned groups, int rows,
                                            size_t cols, uint16_t *w16, int g, int t) {
    const unsigned T = i / groups, G = i % groups;
    ATile A;
    weights_tile(A, codes16, sb8);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const size_t row = (size_t)T * 16 + g + 8 * h;
        if (row >= (size_t)rows) continue;
        uint4 *dst = reinterpret_cast<uint4 *>(w16 + row * cols + (size_t)G * 64 + 16 * t);
        dst[0] = make_uint4(A.a[2 * h][0], A.a[2 * h][1], A.a[2 * h][2], A.a[2 * h][3]);
        dst[1] = make_uint4(A.a[2 * h + 1][0], A.a[2 * h + 1][1], A.a[2 * h + 1][2], A.a[2 * h + 1][3]);
    }
}

/* A warp per (row tile, group) pair, two pairs a loop step with both pairs'
 * loads issued before either's stores (one pair a step left ~576 bytes of
 * loads in flight a warp: the expansion ran at ~55% of the copy bandwidth,
 * 2.3 TB/s of traffic, session 22; this way 1.70 -> 1.64 ms in 4 layers of
 * a 27B 4K prefill, session 23: the loads in flight were not the main
 * limit); 32-bit pair indices (the largest matrix, the lm_head, has 1.24M
 * pairs). */
__global__ void __launch_bounds__(kExpandThreads) q4_expand_kernel(const uint8_t *codes, const uint8_t *sb, int rows,
                                                                   int groups, unsigned pairs, uint16_t *w16) {
    pdl_begin();
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const size_t cols = (size_t)groups * 64;
    const unsigned warps = gridDim.x * (kExpandThreads / 32);
    for (unsigned i = blockIdx.x * (kExpandThreads / 32) + (threadIdx.x >> 5); i < pairs; i += 2 * warps) {
        const unsigned i2 = i + warps;
        const uint4 c0 = ld_stream16(codes + (size_t)i * kPairCodes + lane * 16);
        const uint2 s0 = ld_stream8(sb + (size_t)i * kPairSb + g * 8);
        uint4 c1 = make_uint4(0, 0, 0, 0);
        uint2 s1 = make_uint2(0, 0);
        if (i2 < pairs) {
            c1 = ld_stream16(codes + (size_t)i2 * kPairCodes + lane * 16);
            s1 = ld_stream8(sb + (size_t)i2 * kPairSb + g * 8);
        }
        expand_pair(c0, s0, i, (unsigned)groups, rows, cols, w16, g, t);
        if (i2 < pairs) expand_pair(c1, s1, i2, (unsigned)groups, rows, cols, w16, g, t);
    }
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

bool shape_ok(int rows, int cols) { return rows > 0 && cols > 0 && cols % 64 == 0; }

float bf16_host(const uint8_t *p) {
    const uint32_t u = (uint32_t)(p[0] | (p[1] << 8)) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

} /* namespace */

/* ---- C API ---------------------------------------------------------------------- */

extern "C" int splash_q4_tiled_fp16_ok(const uint8_t *tiled, int rows, int cols) {
    if (!tiled || !shape_ok(rows, cols)) return 0;
    const size_t n = (size_t)((rows + 15) / 16) * (size_t)(cols / 64); /* (tile, group) pairs */
    const uint8_t *sb = tiled + splash_q4_tiled_codes_bytes(rows, cols);
    for (size_t i = 0; i < n * 8; i++) { /* [8][4] bf16 a pair: s(g), s(g+8), b(g), b(g+8) */
        const uint8_t *e = sb + i * 8;
        for (int h = 0; h < 2; h++) {
            const float s = fabsf(bf16_host(e + 2 * h)), b = fabsf(bf16_host(e + 4 + 2 * h));
            if (!(s == 0.f || s >= 0x1p-14f)) return 0; /* also NaN */
            if (!(15.f * s + b < 32768.f)) return 0;
        }
    }
    return 1;
}

extern "C" size_t splash_q4_gemm_x_bytes(int rows_cap, int cols_cap) {
    if (rows_cap <= 0 || cols_cap <= 0 || cols_cap % 64) return 0;
    return align256((size_t)rows_cap * cols_cap * 2) + align256((size_t)rows_cap * 4) + 256;
}

extern "C" int splash_q4_gemm_x_init(splash_q4_gemm_x *xg, void *dev_mem, int rows_cap, int cols_cap) {
    if (!xg || !dev_mem || !splash_q4_gemm_x_bytes(rows_cap, cols_cap)) return SPLASH_E_INVALID;
    uint8_t *p = (uint8_t *)dev_mem;
    xg->hi = (uint16_t *)p;
    p += align256((size_t)rows_cap * cols_cap * 2);
    xg->inv_scale = (float *)p;
    p += align256((size_t)rows_cap * 4);
    xg->alpha = (float *)p, xg->amax = (uint32_t *)(p + 64);
    xg->R = 0, xg->cols = 0;
    xg->rows_cap = rows_cap, xg->cols_cap = cols_cap;
    return SPLASH_OK;
}

static bool prep_args_ok(const splash_q4_gemm_x *xg, const float *x, int R, int cols, size_t ldx) {
    return xg && x && R > 0 && R <= xg->rows_cap && cols > 0 && cols % 64 == 0 && cols <= xg->cols_cap &&
           ldx >= (size_t)cols && ldx % 4 == 0 && ((uintptr_t)x & 15) == 0;
}

extern "C" int splash_q4_gemm_prep(splash_q4_gemm_x *xg, const float *x, int R, int cols, size_t ldx,
                                   struct CUstream_st *stream) {
    if (!prep_args_ok(xg, x, R, cols, ldx)) return SPLASH_E_INVALID;
    SPLASH_CUDA_TRY(launch_kernel(q4_gemm_prep_kernel, R, kPrepThreads, 0, (cudaStream_t)stream, x, ldx, cols, xg->hi,
                                  xg->inv_scale));
    xg->R = R, xg->cols = cols;
    return SPLASH_OK;
}

extern "C" int splash_q4_gemm_prep_uniform(splash_q4_gemm_x *xg, const float *x, int R, int cols, size_t ldx,
                                           struct CUstream_st *stream) {
    if (!prep_args_ok(xg, x, R, cols, ldx)) return SPLASH_E_INVALID;
    const cudaStream_t s = (cudaStream_t)stream;
    SPLASH_CUDA_TRY(cudaMemsetAsync(xg->amax, 0, sizeof *xg->amax, s));
    SPLASH_CUDA_TRY(launch_kernel(q4_gemm_amax_kernel, R, kPrepThreads, 0, s, x, ldx, cols, xg->amax));
    SPLASH_CUDA_TRY(launch_kernel(q4_gemm_prep_uniform_kernel, R, kPrepThreads, 0, s, x, ldx, cols,
                                  (const uint32_t *)xg->amax, xg->hi, xg->inv_scale, xg->alpha));
    xg->R = R, xg->cols = cols;
    return SPLASH_OK;
}

extern "C" int splash_q4_gemm_prep_uniform_amax(splash_q4_gemm_x *xg, const float *x, int R, int cols, size_t ldx,
                                                struct CUstream_st *stream) {
    if (!prep_args_ok(xg, x, R, cols, ldx)) return SPLASH_E_INVALID;
    SPLASH_CUDA_TRY(launch_kernel(q4_gemm_prep_uniform_kernel, R, kPrepThreads, 0, (cudaStream_t)stream, x, ldx, cols,
                                  (const uint32_t *)xg->amax, xg->hi, xg->inv_scale, xg->alpha));
    xg->R = R, xg->cols = cols;
    return SPLASH_OK;
}

extern "C" int splash_q4_expand_f16(const splash_q4_matrix *w, uint16_t *w16, struct CUstream_st *stream) {
    if (!w || !w16 || !w->codes || !w->sb || w->rows <= 0 || w->groups <= 0 || ((uintptr_t)w16 & 15))
        return SPLASH_E_INVALID;
    const size_t pairs = (size_t)w->tiles * (size_t)w->groups;
    if (pairs > 0x7fffffffu) return SPLASH_E_UNSUPPORTED; /* the kernel's 32-bit pair indices */
    const size_t blocks = (pairs + kExpandThreads / 32 - 1) / (kExpandThreads / 32);
    const unsigned grid = (unsigned)(blocks < 132 * 16 ? blocks : 132 * 16); /* the rest by the warps' loop */
    SPLASH_CUDA_TRY(launch_kernel(q4_expand_kernel, grid, kExpandThreads, 0, (cudaStream_t)stream, w->codes, w->sb,
                                  w->rows, w->groups, (unsigned)pairs, w16));
    return SPLASH_OK;
}

extern "C" int splash_q4_gemm(const splash_q4_matrix *w, const splash_q4_gemm_x *xg, float *y, int add,
                              struct CUstream_st *stream) {
    if (!w || !xg || !y || xg->R <= 0 || xg->cols != w->cols || !w->codes || !w->sb) return SPLASH_E_INVALID;
    if ((unsigned)w->tiles > 65535u * kTiles) return SPLASH_E_INVALID;
    GemmParams p;
    memset(&p, 0, sizeof p);
    p.codes = w->codes, p.sb = w->sb, p.xhi = xg->hi, p.inv_scale = xg->inv_scale, p.y = y;
    p.rows = w->rows, p.tiles = w->tiles, p.groups = w->groups, p.cols = w->cols, p.R = xg->R, p.add = add ? 1 : 0;
    const cudaStream_t s = (cudaStream_t)stream;
    return xg->R <= 64 ? launch_gemm<64, false>(p, (xg->R + 63) / 64, 1, s)
                       : launch_gemm<128, false>(p, (xg->R + 127) / 128, 1, s);
}

extern "C" int splash_q4_gemm_grouped(const splash_q4_matrix *first, const splash_q4_matrix *first2, size_t stride,
                                      const splash_q4_gemm_groups *gr, const splash_q4_gemm_x *xg, float *y, float *y2,
                                      struct CUstream_st *stream) {
    if (!first || !gr || !xg || !y || (first2 && !y2) || !gr->off || !gr->tile_e || !gr->tile_n0 || !gr->n_tiles ||
        (gr->xdiv && !gr->perm) || gr->xdiv < 0 || gr->tiles_cap < 1 || gr->tiles_cap > 2147483647 / 2 ||
        xg->R <= 0 || xg->cols != first->cols || !stride)
        return SPLASH_E_INVALID;
    if (first2 && (first2->rows != first->rows || first2->cols != first->cols || first2->sb - first2->codes != first->sb - first->codes))
        return SPLASH_E_MISMATCH;
    GemmParams p;
    memset(&p, 0, sizeof p);
    p.codes = first->codes, p.sb = first->sb, p.codes2 = first2 ? first2->codes : nullptr;
    p.xhi = xg->hi, p.inv_scale = xg->inv_scale, p.y = y, p.y2 = y2;
    p.rows = first->rows, p.tiles = first->tiles, p.groups = first->groups, p.cols = first->cols, p.R = xg->R;
    p.off = gr->off, p.perm = gr->perm, p.tile_e = gr->tile_e, p.tile_n0 = gr->tile_n0, p.n_tiles = gr->n_tiles;
    p.estride = stride, p.sboff = (size_t)(first->sb - first->codes), p.xdiv = gr->xdiv;
    return launch_gemm<SPLASH_Q4_GEMM_GROUP_ROWS, true>(p, gr->tiles_cap, first2 ? 2 : 1, (cudaStream_t)stream);
}
