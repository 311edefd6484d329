/* rows.cu - embedding lookup, row gather / scatter and the residual add
 * (rows.h).  One block per row (grid.y), columns strided over its threads:
 * all of it is copying, a few microseconds per forward.
 *
 * The tiled q4 addressing (q4_matmul.h, splash_q4_repack_host): element
 * (r, c) lives in tile T = r / 16, group G = c / 64; inside the group's 512
 * bytes, lane (g = r % 8, t = (c % 64) / 16) holds 16 bytes: word 2h + wi
 * (h = (r % 16) / 8, wi = (c % 16) / 8) packs columns 64G + 16t + 8wi + 0..7,
 * the even column 2s at bits 4s, the odd one 2s + 1 at bits 16 + 4s.  The
 * scale and bias: the group's 64-byte sb block, 8 bytes per g: scale of row
 * g, of row g + 8, bias of row g, of row g + 8 (bf16 each).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/rows.h"
extern "C" {
#include "package/tensor.h"
}

using namespace splash_cuda;

namespace {

constexpr int kThreads = 128;

struct TiledAt {
    size_t word; /* byte offset of the 32-bit word inside the codes part */
    int shift;   /* of the 4-bit code inside it */
    size_t sb;   /* byte offset of the scale inside the sb part (bias: + 4) */
};

__host__ __device__ __forceinline__ TiledAt tiled_at(int groups, int r, int c) {
    const int T = r >> 4, rr = r & 15, g = rr & 7, h = rr >> 3;
    const int G = c >> 6, j = c & 63, t = j >> 4, wi = (j >> 3) & 1, e = j & 7;
    const size_t blk = (size_t)T * groups + G;
    TiledAt a;
    a.word = blk * 512 + (size_t)(g * 4 + t) * 16 + (size_t)(2 * h + wi) * 4;
    a.shift = (e & 1) ? 16 + 4 * (e >> 1) : 4 * (e >> 1);
    a.sb = blk * 64 + (size_t)g * 8 + (size_t)h * 2;
    return a;
}

__global__ void embed_q4_kernel(const splash_q4_matrix w, const int32_t *ids, float *out, size_t ldo) {
    pdl_begin();
    const int i = blockIdx.y, id = ids[i];
    if (id < 0 || id >= w.rows) return; /* no row (an override, or a device token out of range) */
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < w.cols; c += gridDim.x * blockDim.x) {
        const TiledAt a = tiled_at(w.groups, id, c);
        const uint32_t word = *reinterpret_cast<const uint32_t *>(w.codes + a.word);
        const float q = (float)((word >> a.shift) & 15u);
        const float s = bf16_to_f32(*reinterpret_cast<const uint16_t *>(w.sb + a.sb));
        const float b = bf16_to_f32(*reinterpret_cast<const uint16_t *>(w.sb + a.sb + 4));
        out[(size_t)i * ldo + c] = __fadd_rn(__fmul_rn(s, q), b); /* tensor.c: s * q + b */
    }
}

__global__ void embed_dense_kernel(const splash_cuda_dense_matrix w, const int32_t *ids, float *out, size_t ldo) {
    pdl_begin();
    const int i = blockIdx.y, id = ids[i];
    if (id < 0 || id >= w.rows) return; /* no row (an override, or a device token out of range) */
    float *o = out + (size_t)i * ldo;
    const size_t base = (size_t)id * w.cols;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < w.cols; c += gridDim.x * blockDim.x) {
        float v;
        switch (w.dtype) {
        case SPLASH_F32: v = reinterpret_cast<const float *>(w.data)[base + c]; break;
        case SPLASH_BF16: v = bf16_to_f32(reinterpret_cast<const uint16_t *>(w.data)[base + c]); break;
        case SPLASH_F16: v = __half2float(__ushort_as_half(reinterpret_cast<const uint16_t *>(w.data)[base + c])); break;
        default: { /* q8 */
            const size_t g = (size_t)id * (w.cols / SPLASH_QGROUP) + c / SPLASH_QGROUP;
            const float s = bf16_to_f32(reinterpret_cast<const uint16_t *>(w.data + w.scales_offset)[g]);
            const float b = bf16_to_f32(reinterpret_cast<const uint16_t *>(w.data + w.biases_offset)[g]);
            v = __fadd_rn(__fmul_rn(s, (float)w.data[base + c]), b);
        }
        }
        o[c] = v;
    }
}

__global__ void gather_kernel(const float *src, size_t lds, const int32_t *idx, float *dst, size_t ldd, int width) {
    pdl_begin();
    const int i = blockIdx.y;
    const float *s = src + (size_t)idx[i] * lds;
    float *d = dst + (size_t)i * ldd;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < width; c += gridDim.x * blockDim.x) d[c] = s[c];
}

__global__ void scatter_kernel(const float *src, size_t lds, const int32_t *map, float *dst, size_t ldd, int width) {
    pdl_begin();
    const int r = blockIdx.y, to = map[r];
    if (to < 0) return;
    const float *s = src + (size_t)r * lds;
    float *d = dst + (size_t)to * ldd;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < width; c += gridDim.x * blockDim.x) d[c] = s[c];
}

__global__ void add_kernel(float *y, size_t ldy, const float *x, size_t ldx, int width) {
    pdl_begin();
    const size_t r = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < width; c += gridDim.x * blockDim.x)
        y[r * ldy + c] = __fadd_rn(y[r * ldy + c], x[r * ldx + c]);
}

dim3 grid_for(int width, int rows) { return dim3((unsigned)((width + 4 * kThreads - 1) / (4 * kThreads)), (unsigned)rows); }

unsigned embed_blocks(int cols) { return (unsigned)((cols + kThreads - 1) / kThreads); }

bool rows_ok(int rows, int width) { return rows >= 0 && rows <= 65535 && width >= 0; }

} /* namespace */

extern "C" int splash_cuda_embed_rows_q4(const splash_q4_matrix *w, const int32_t *ids, int n, float *out, size_t ldo,
                                         struct CUstream_st *stream) {
    if (!w || !w->codes || !ids || !out || !rows_ok(n, 1) || ldo < (size_t)w->cols) return SPLASH_E_INVALID;
    if (!n) return SPLASH_OK;
    /* a block per kThreads columns: one block walking a 5,120-wide row took
     * 17.6 us of a 27B decode step (tools/trace_summary.py) */
    SPLASH_CUDA_TRY(launch_kernel(embed_q4_kernel, dim3(embed_blocks(w->cols), (unsigned)n), kThreads, 0,
                                  (cudaStream_t)stream, *w, ids, out, ldo));
    return SPLASH_OK;
}

extern "C" int splash_cuda_embed_rows_dense(const splash_cuda_dense_matrix *w, const int32_t *ids, int n, float *out,
                                            size_t ldo, struct CUstream_st *stream) {
    if (!w || !w->data || !ids || !out || !rows_ok(n, 1) || ldo < (size_t)w->cols) return SPLASH_E_INVALID;
    if (!n) return SPLASH_OK;
    SPLASH_CUDA_TRY(launch_kernel(embed_dense_kernel, dim3(embed_blocks(w->cols), (unsigned)n), kThreads, 0,
                                  (cudaStream_t)stream, *w, ids, out, ldo));
    return SPLASH_OK;
}

extern "C" int splash_cuda_gather_rows(const float *src, size_t lds, const int32_t *idx, int n, float *dst, size_t ldd,
                                       int width, struct CUstream_st *stream) {
    if (!src || !idx || !dst || !rows_ok(n, width)) return SPLASH_E_INVALID;
    if (!n || !width) return SPLASH_OK;
    SPLASH_CUDA_TRY(launch_kernel(gather_kernel, grid_for(width, n), kThreads, 0, (cudaStream_t)stream, src, lds, idx,
                                  dst, ldd, width));
    return SPLASH_OK;
}

extern "C" int splash_cuda_scatter_rows(const float *src, size_t lds, const int32_t *map, int rows, float *dst,
                                        size_t ldd, int width, struct CUstream_st *stream) {
    if (!src || !map || !dst || !rows_ok(rows, width)) return SPLASH_E_INVALID;
    if (!rows || !width) return SPLASH_OK;
    SPLASH_CUDA_TRY(launch_kernel(scatter_kernel, grid_for(width, rows), kThreads, 0, (cudaStream_t)stream, src, lds,
                                  map, dst, ldd, width));
    return SPLASH_OK;
}

extern "C" int splash_cuda_add_rows(float *y, size_t ldy, const float *x, size_t ldx, int rows, int width,
                                    struct CUstream_st *stream) {
    if (!y || !x || !rows_ok(rows, width)) return SPLASH_E_INVALID;
    if (!rows || !width) return SPLASH_OK;
    SPLASH_CUDA_TRY(
        launch_kernel(add_kernel, grid_for(width, rows), kThreads, 0, (cudaStream_t)stream, y, ldy, x, ldx, width));
    return SPLASH_OK;
}

extern "C" float splash_q4_tiled_at_host(const uint8_t *tiled, int rows, int cols, int r, int c) {
    const TiledAt a = tiled_at(cols / 64, r, c);
    const uint8_t *sb = tiled + splash_q4_tiled_codes_bytes(rows, cols);
    uint32_t word;
    memcpy(&word, tiled + a.word, 4);
    uint16_t sh, bh;
    memcpy(&sh, sb + a.sb, 2);
    memcpy(&bh, sb + a.sb + 4, 2);
    return splash_bf16_to_f32(sh) * (float)((word >> a.shift) & 15u) + splash_bf16_to_f32(bh);
}
