/* act.cu - SwiGLU's silu(g) * u and the MoE shared-expert add (act.h).
 * Grid: (column blocks, rows); grid-stride over columns. */
#include <cuda_runtime.h>

#include "backend/cuda/act.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"

using namespace splash_cuda;

namespace {

__global__ void silu_mul_kernel(const float *g, size_t ldg, const float *u, size_t ldu, float *out, size_t ldo,
                                int n) {
    pdl_begin();
    const size_t r = blockIdx.y;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[r * ldo + i] = __fmul_rn(siluf_(g[r * ldg + i]), u[r * ldu + i]);
}

__global__ void shared_add_kernel(float *fo, size_t ldf, const float *mo, size_t ldm, const float *s, size_t lds,
                                  float *x, size_t ldx, int n) {
    pdl_begin();
    const size_t r = blockIdx.y;
    const float sg = sigmoidf_(s[r * lds]);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float f = __fadd_rn(fo[r * ldf + i], __fmul_rn(sg, mo[r * ldm + i]));
        fo[r * ldf + i] = f;
        x[r * ldx + i] = __fadd_rn(f, x[r * ldx + i]);
    }
}

dim3 grid_for(int n, int rows) { return dim3((unsigned)((n + 1023) / 1024), (unsigned)rows); }

} /* namespace */

extern "C" int splash_cuda_silu_mul(const float *g, size_t ldg, const float *u, size_t ldu, float *out, size_t ldo,
                                    int rows, int n, struct CUstream_st *stream) {
    if (!g || !u || !out || rows < 0 || rows > 65535 || n < 0) return SPLASH_E_INVALID;
    if (!rows || !n) return SPLASH_OK;
    SPLASH_CUDA_TRY(
        launch_kernel(silu_mul_kernel, grid_for(n, rows), 256, 0, (cudaStream_t)stream, g, ldg, u, ldu, out, ldo, n));
    return SPLASH_OK;
}

extern "C" int splash_cuda_moe_shared_add(float *fo, size_t ldf, const float *mo, size_t ldm, const float *s,
                                          size_t lds, float *x, size_t ldx, int rows, int n,
                                          struct CUstream_st *stream) {
    if (!fo || !mo || !s || !x || rows < 0 || rows > 65535 || n < 0) return SPLASH_E_INVALID;
    if (!rows || !n) return SPLASH_OK;
    SPLASH_CUDA_TRY(launch_kernel(shared_add_kernel, grid_for(n, rows), 256, 0, (cudaStream_t)stream, fo, ldf, mo, ldm,
                                  s, lds, x, ldx, n));
    return SPLASH_OK;
}
