/* dense_matmul.cu - products with plain or q8 weights (dense_matmul.h).
 *
 * These matrices are small (the MoE router: 1 MB, the shared-expert gate:
 * 4 KB), so their time is load latency, not bytes: what matters is how many
 * loads a lane waits for one after another.
 *
 * When cols % 8 == 0 and x's rows are 16-byte aligned (every model matrix):
 * grid (ceil(rows / RB), ceil(M / 8)), 4 warps a block splitting the columns
 * of the block's RB = 2 output rows (kRowsBlock), up to 8 rows of x.  Warp w,
 * lane t takes the 8-column chunks 32 w + t + 128 i (16 B of bf16 codes
 * each), every chunk of a step loaded before any is used, each x chunk read
 * once for the RB rows;
 * the sums go through a warp tree and then the 4 warps in order, so a row's
 * result depends neither on M nor on the other rows.  Until session 26 a
 * warp owned a whole output row (65 blocks for the 35B-A3B's 257 stacked
 * gate rows, a lane 8 chunks and, at 8 rows of x, 128 x loads in a row): a
 * verify block's router cost 14.5 us a layer in the graph (trace, 4 layers)
 * against 3.7 for one row.
 *
 * Otherwise (odd widths, unaligned x) grid (ceil(rows / 4), ceil(M / 8)), a
 * warp per output row, lane t reads w[r][t], w[r][t + 32], ... one element at
 * a time.
 *
 * C++ used: a template over the stored type; no STL.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dense_matmul.h"
#include "backend/cuda/device_util.cuh"
extern "C" {
#include "package/tensor.h"
}

using namespace splash_cuda;

namespace {

constexpr int kWarps = 4;
constexpr int kRowsX = 8;  /* x rows a block */
constexpr int kChunks = 4; /* 8-column chunks of each output row a lane loads before using them */
/* Output rows a block of dense_chunks_kernel.  Measured (H200, session 26,
 * the 35B-A3B synthetic, 40 layers, interleaved, medians of 2 rounds, with a
 * switch since removed): 2 and 4 alike in decode and verify at 1K (2.189 /
 * 2.201 ms a step, 8 rows 3.665 / 3.695), the 4K prefill 12.56K / 12.09K
 * tokens/s (main 11.89K); events on the router alone put 1, 2 and 4 within
 * 0.3 us. */
constexpr int kRowsBlock = 2;

struct Args {
    const uint8_t *w;
    const uint16_t *scales, *biases; /* q8 */
    const float *x;
    float *y;
    size_t ldx, ldy;
    int rows, cols, M;
};

__device__ __forceinline__ float f16_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* Element c of row r as the CPU's splash_tensor_row_f32 computes it. */
template <int DT>
__device__ __forceinline__ float weight_at(const Args &a, int r, int c) {
    const size_t i = (size_t)r * a.cols + c;
    if (DT == SPLASH_F32) return reinterpret_cast<const float *>(a.w)[i];
    if (DT == SPLASH_BF16) return bf16_to_f32(reinterpret_cast<const uint16_t *>(a.w)[i]);
    if (DT == SPLASH_F16) return f16_to_f32(reinterpret_cast<const uint16_t *>(a.w)[i]);
    /* q8: scale * q + bias, two roundings as the CPU (no FMA) */
    const size_t g = (size_t)r * (a.cols / SPLASH_QGROUP) + c / SPLASH_QGROUP;
    return __fadd_rn(__fmul_rn(bf16_to_f32(a.scales[g]), (float)a.w[i]), bf16_to_f32(a.biases[g]));
}

/* Eight consecutive weights of a row as stored (bf16 / f16: one 16-byte
 * load; f32: two; q8: 8 codes and the group's scale and bias). */
template <int DT>
struct Chunk {
    uint4 v[DT == SPLASH_F32 ? 2 : 1];
    float s, b;
};

template <int DT>
__device__ __forceinline__ void load_chunk(const Args &a, int r, int ch, Chunk<DT> &c) {
    const size_t i = (size_t)r * a.cols + (size_t)ch * 8; /* element index, a multiple of 8 */
    if constexpr (DT == SPLASH_F32) {
        c.v[0] = __ldg(reinterpret_cast<const uint4 *>(a.w + 4 * i));
        c.v[1] = __ldg(reinterpret_cast<const uint4 *>(a.w + 4 * i) + 1);
    } else if constexpr (DT == SPLASH_Q8) {
        const uint2 q = __ldg(reinterpret_cast<const uint2 *>(a.w + i));
        c.v[0] = make_uint4(q.x, q.y, 0, 0);
        const size_t g = (size_t)r * (a.cols / SPLASH_QGROUP) + (size_t)ch * 8 / SPLASH_QGROUP;
        c.s = bf16_to_f32(__ldg(a.scales + g)), c.b = bf16_to_f32(__ldg(a.biases + g));
    } else {
        c.v[0] = __ldg(reinterpret_cast<const uint4 *>(a.w + 2 * i));
    }
}

/* Weight k (0..7) of a chunk, the value weight_at gives. */
template <int DT>
__device__ __forceinline__ float chunk_at(const Chunk<DT> &c, int k) {
    if constexpr (DT == SPLASH_F32) {
        const uint4 v = c.v[k >> 2];
        const uint32_t u = (k & 3) == 0 ? v.x : (k & 3) == 1 ? v.y : (k & 3) == 2 ? v.z : v.w;
        return __uint_as_float(u);
    }
    if constexpr (DT == SPLASH_Q8) {
        const uint32_t u = (k >> 2) ? c.v[0].y : c.v[0].x;
        return __fadd_rn(__fmul_rn(c.s, (float)(uint8_t)(u >> (8 * (k & 3)))), c.b);
    }
    const uint4 v = c.v[0];
    const uint32_t u = (k >> 1) == 0 ? v.x : (k >> 1) == 1 ? v.y : (k >> 1) == 2 ? v.z : v.w;
    const uint16_t h = (k & 1) ? (uint16_t)(u >> 16) : (uint16_t)(u & 0xFFFF);
    return DT == SPLASH_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

/* Chunks: a block of RB = kRowsBlock output rows, its warps splitting the
 * columns (the header).  Rows past the matrix read its last row and store
 * nothing. */
template <int DT>
__global__ void __launch_bounds__(kWarps * 32) dense_chunks_kernel(const Args a) {
    constexpr int RB = kRowsBlock;
    __shared__ float part[kWarps][RB][kRowsX];
    pdl_begin();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r0 = blockIdx.x * RB;
    const int m0 = blockIdx.y * kRowsX, nm = min(kRowsX, a.M - m0);
    const float *x = a.x + (size_t)m0 * a.ldx;
    const int nch = a.cols / 8;
    float acc[RB][kRowsX];
#pragma unroll
    for (int i = 0; i < RB; i++)
#pragma unroll
        for (int j = 0; j < kRowsX; j++) acc[i][j] = 0.f;
    for (int base = warp * 32 + lane; base < nch; base += kWarps * 32 * kChunks) {
        Chunk<DT> c[kChunks][RB];
#pragma unroll
        for (int u = 0; u < kChunks; u++)
            if (base + kWarps * 32 * u < nch)
#pragma unroll
                for (int i = 0; i < RB; i++) load_chunk<DT>(a, min(r0 + i, a.rows - 1), base + kWarps * 32 * u, c[u][i]);
#pragma unroll
        for (int u = 0; u < kChunks; u++) {
            const int ch = base + kWarps * 32 * u;
            if (ch >= nch) break;
#pragma unroll
            for (int j = 0; j < kRowsX; j++) {
                if (j >= nm) break;
                const float4 *xp = reinterpret_cast<const float4 *>(x + (size_t)j * a.ldx + 8 * ch);
                const float4 x0 = xp[0], x1 = xp[1]; /* coherent loads (device_util.cuh) */
                const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
                for (int i = 0; i < RB; i++)
#pragma unroll
                    for (int k = 0; k < 8; k++) acc[i][j] = fmaf(chunk_at<DT>(c[u][i], k), xv[k], acc[i][j]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RB; i++)
#pragma unroll
        for (int j = 0; j < kRowsX; j++) {
            const float s = warp_sum(acc[i][j]);
            if (lane == 0) part[warp][i][j] = s;
        }
    __syncthreads();
    const int t = threadIdx.x, i = t / kRowsX, j = t % kRowsX;
    if (t < RB * kRowsX && r0 + i < a.rows && j < nm) {
        float s = part[0][i][j];
#pragma unroll
        for (int w = 1; w < kWarps; w++) s += part[w][i][j];
        a.y[(size_t)(m0 + j) * a.ldy + r0 + i] = s;
    }
}

/* Odd widths or unaligned x: a warp an output row, one element a lane and step. */
template <int DT>
__global__ void __launch_bounds__(kWarps * 32) dense_scalar_kernel(const Args a) {
    pdl_begin();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r = blockIdx.x * kWarps + warp;
    if (r >= a.rows) return; /* whole warps */
    const int m0 = blockIdx.y * kRowsX, nm = min(kRowsX, a.M - m0);
    const float *x = a.x + (size_t)m0 * a.ldx;
    float acc[kRowsX];
#pragma unroll
    for (int j = 0; j < kRowsX; j++) acc[j] = 0.f;
    for (int c = lane; c < a.cols; c += 32) {
        const float w = weight_at<DT>(a, r, c);
#pragma unroll
        for (int j = 0; j < kRowsX; j++)
            if (j < nm) acc[j] = fmaf(w, x[(size_t)j * a.ldx + c], acc[j]);
    }
#pragma unroll
    for (int j = 0; j < kRowsX; j++) {
        const float s = warp_sum(acc[j]);
        if (lane == 0 && j < nm) a.y[(size_t)(m0 + j) * a.ldy + r] = s;
    }
}

size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

template <int DT>
cudaError_t launch(const Args &a, int M, bool vec, cudaStream_t s) {
    const unsigned gy = (unsigned)((M + kRowsX - 1) / kRowsX);
    if (!vec) return launch_kernel(dense_scalar_kernel<DT>, dim3((unsigned)((a.rows + kWarps - 1) / kWarps), gy),
                                   kWarps * 32, 0, s, a);
    return launch_kernel(dense_chunks_kernel<DT>, dim3((unsigned)((a.rows + kRowsBlock - 1) / kRowsBlock), gy),
                         kWarps * 32, 0, s, a);
}

} /* namespace */

extern "C" int splash_cuda_dense_matrix_init(splash_cuda_dense_matrix *m, int dtype, const void *dev_data, int rows,
                                             int cols) {
    if (!m || !dev_data || rows < 1 || cols < 1) return SPLASH_E_INVALID;
    if (dtype != SPLASH_F32 && dtype != SPLASH_BF16 && dtype != SPLASH_F16 && dtype != SPLASH_Q8)
        return SPLASH_E_UNSUPPORTED;
    if (dtype == SPLASH_Q8 && cols % SPLASH_QGROUP) return SPLASH_E_INVALID;
    m->dtype = dtype, m->rows = rows, m->cols = cols;
    m->data = (const uint8_t *)dev_data;
    m->scales_offset = m->biases_offset = 0;
    if (dtype == SPLASH_Q8) { /* tensor.h: codes, scales, biases, each 64-byte aligned */
        m->scales_offset = align64((size_t)rows * cols);
        m->biases_offset = m->scales_offset + align64((size_t)rows * (cols / SPLASH_QGROUP) * 2);
    }
    return SPLASH_OK;
}

extern "C" int splash_cuda_dense_matmul(const splash_cuda_dense_matrix *w, const float *x, size_t ldx, int M,
                                        float *y, size_t ldy, struct CUstream_st *stream) {
    if (!w || !w->data || !x || !y || M < 0 || ldx < (size_t)w->cols || ldy < (size_t)w->rows) return SPLASH_E_INVALID;
    if (M == 0) return SPLASH_OK;
    if ((M + kRowsX - 1) / kRowsX > 65535) return SPLASH_E_INVALID;
    Args a;
    a.w = w->data;
    a.scales = reinterpret_cast<const uint16_t *>(w->data + w->scales_offset);
    a.biases = reinterpret_cast<const uint16_t *>(w->data + w->biases_offset);
    a.x = x, a.y = y, a.ldx = ldx, a.ldy = ldy;
    a.rows = w->rows, a.cols = w->cols, a.M = M;
    const cudaStream_t s = (cudaStream_t)stream;
    /* 8-column chunks: whole chunks per row, 16-byte aligned weight rows
     * (the package aligns a tensor's data to 64 bytes) and x rows */
    const bool vec = w->cols % 8 == 0 && ldx % 4 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)w->data & 15) == 0;
    cudaError_t e;
    switch (w->dtype) {
    case SPLASH_F32: e = launch<SPLASH_F32>(a, M, vec, s); break;
    case SPLASH_BF16: e = launch<SPLASH_BF16>(a, M, vec, s); break;
    case SPLASH_F16: e = launch<SPLASH_F16>(a, M, vec, s); break;
    case SPLASH_Q8: e = launch<SPLASH_Q8>(a, M, vec, s); break;
    default: return SPLASH_E_UNSUPPORTED;
    }
    SPLASH_CUDA_TRY(e);
    return SPLASH_OK;
}
