/* dense_matmul.cu - products with plain or q8 weights (dense_matmul.h).
 *
 * Grid (ceil(rows / 4), ceil(M / 8)), 4 warps a block, a warp per output
 * row: lane t reads w[r][t], w[r][t + 32], ... (coalesced), widens each
 * weight once and multiplies it into up to 8 rows of x, then the 8 sums go
 * through a warp tree.  x rows are read through L1/L2 (every warp of the
 * grid reads the same few rows).
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
constexpr int kRowsX = 8; /* x rows per warp */

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

template <int DT>
__global__ void __launch_bounds__(kWarps * 32) dense_matmul_kernel(const Args a) {
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
    const dim3 grid((unsigned)((w->rows + kWarps - 1) / kWarps), (unsigned)((M + kRowsX - 1) / kRowsX));
    const cudaStream_t s = (cudaStream_t)stream;
    switch (w->dtype) {
    case SPLASH_F32: dense_matmul_kernel<SPLASH_F32><<<grid, kWarps * 32, 0, s>>>(a); break;
    case SPLASH_BF16: dense_matmul_kernel<SPLASH_BF16><<<grid, kWarps * 32, 0, s>>>(a); break;
    case SPLASH_F16: dense_matmul_kernel<SPLASH_F16><<<grid, kWarps * 32, 0, s>>>(a); break;
    case SPLASH_Q8: dense_matmul_kernel<SPLASH_Q8><<<grid, kWarps * 32, 0, s>>>(a); break;
    default: return SPLASH_E_UNSUPPORTED;
    }
    SPLASH_CUDA_LAUNCHED();
    return SPLASH_OK;
}
