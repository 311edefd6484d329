/* norm.cu - RMSNorm, gated RMSNorm and L2 norm per vector (norm.h).
 *
 * One block per vector (grid = heads x rows), 32..256 threads by length: a
 * block-wide sum of squares, then one more pass that scales (the second read
 * of x hits L1).  The vectors are short (128..5120 floats) and every op here
 * is a few microseconds at most; what matters is one launch for all rows and
 * heads, which is also why the strides are general: the per-head q_norm of
 * an interleaved q|gate projection is one call.
 *
 * C++ used: one template (the mode); nothing from the STL.
 */
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/norm.h"

using namespace splash_cuda;

namespace {

enum { RMS = 0, GATED = 1, L2 = 2 };

struct NormArgs {
    const float *x, *z, *w;
    float *y;
    size_t ldx, hsx, ldz, hsz, ldy, hsy;
    float offset, eps, scale;
    int n;
};

template <int MODE>
__global__ void norm_kernel(const NormArgs a) {
    pdl_begin();
    __shared__ float red[32];
    const size_t r = blockIdx.y, h = blockIdx.x;
    const float *x = a.x + r * a.ldx + h * a.hsx;
    float *y = a.y + r * a.ldy + h * a.hsy;
    float ss = 0.f;
    for (int i = threadIdx.x; i < a.n; i += blockDim.x) ss = fmaf(x[i], x[i], ss);
    ss = block_sum(ss, red);
    if (MODE == L2) {
        const float rs = 1.0f / sqrtf(ss + a.eps);
        for (int i = threadIdx.x; i < a.n; i += blockDim.x) y[i] = __fmul_rn(__fmul_rn(x[i], rs), a.scale);
        return;
    }
    const float ms = ss / (float)a.n;
    const float rs = 1.0f / sqrtf(ms + a.eps);
    if (MODE == RMS) {
        for (int i = threadIdx.x; i < a.n; i += blockDim.x)
            y[i] = __fmul_rn(__fmul_rn(x[i], rs), __fadd_rn(a.offset, a.w[i]));
    } else {
        const float *z = a.z + r * a.ldz + h * a.hsz;
        for (int i = threadIdx.x; i < a.n; i += blockDim.x)
            y[i] = __fmul_rn(__fmul_rn(a.w[i], __fmul_rn(x[i], rs)), siluf_(z[i]));
    }
}

int threads_for(int n) { return n >= 2048 ? 256 : n >= 512 ? 128 : n >= 128 ? 64 : 32; }

template <int MODE>
int launch(const NormArgs &a, int rows, int heads, cudaStream_t s) {
    if (rows == 0 || heads == 0) return SPLASH_OK;
    SPLASH_CUDA_TRY(launch_kernel(norm_kernel<MODE>, dim3((unsigned)heads, (unsigned)rows), threads_for(a.n), 0, s, a));
    return SPLASH_OK;
}

bool dims_ok(int n, int rows, int heads) { return n > 0 && rows >= 0 && rows <= 65535 && heads >= 0 && heads <= 65535; }

} /* namespace */

extern "C" int splash_cuda_rmsnorm(const float *x, size_t ldx, size_t hsx, float *y, size_t ldy, size_t hsy,
                                   const float *w, float offset, int n, int rows, int heads, float eps,
                                   struct CUstream_st *stream) {
    if (!x || !y || !w || !dims_ok(n, rows, heads)) return SPLASH_E_INVALID;
    NormArgs a = {x, nullptr, w, y, ldx, hsx, 0, 0, ldy, hsy, offset, eps, 1.f, n};
    return launch<RMS>(a, rows, heads, (cudaStream_t)stream);
}

extern "C" int splash_cuda_rmsnorm_gated(const float *x, size_t ldx, size_t hsx, const float *z, size_t ldz,
                                         size_t hsz, float *y, size_t ldy, size_t hsy, const float *w, int n,
                                         int rows, int heads, float eps, struct CUstream_st *stream) {
    if (!x || !z || !y || !w || !dims_ok(n, rows, heads)) return SPLASH_E_INVALID;
    NormArgs a = {x, z, w, y, ldx, hsx, ldz, hsz, ldy, hsy, 0.f, eps, 1.f, n};
    return launch<GATED>(a, rows, heads, (cudaStream_t)stream);
}

extern "C" int splash_cuda_l2norm(float *x, size_t ldx, size_t hsx, int n, int rows, int heads, float eps,
                                  float scale, struct CUstream_st *stream) {
    if (!x || !dims_ok(n, rows, heads)) return SPLASH_E_INVALID;
    NormArgs a = {x, nullptr, nullptr, x, ldx, hsx, 0, 0, ldx, hsx, 0.f, eps, scale, n};
    return launch<L2>(a, rows, heads, (cudaStream_t)stream);
}
