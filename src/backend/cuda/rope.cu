/* rope.cu - rotary, the fused q/k preparation of gated attention, and the
 * sigmoid output gate (rope.h).
 *
 * attn_prep: one block per (head, row) with the q heads first and the kv
 * heads after them in grid.x.  The block loads its head vector into shared
 * memory (q from the interleaved q|gate row or plain q heads, possibly in
 * place; k in place), normalises it,
 * then rotates pairs (i, i + rot/2).  Products and sums are written with
 * explicit rounding (__fmul_rn etc.) so that nvcc does not contract them into
 * FMAs: the arithmetic is then the CPU's (norm.c, rope.c), operation for
 * operation, except the sum of squares' order and cosf/sinf.
 */
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/rope.h"

using namespace splash_cuda;

namespace {

/* (x1, x2) -> (x1 c - x2 s, x2 c + x1 s), as cpu_rope */
__device__ __forceinline__ void rotate_pair(float x1, float x2, float c, float s, float *o1, float *o2) {
    *o1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    *o2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

__global__ void rope_kernel(float *x, size_t ldx, int head_dim, int half, const float *inv_freq,
                            const int32_t *pos) {
    pdl_begin();
    const int r = blockIdx.y;
    float *v = x + (size_t)r * ldx + (size_t)blockIdx.x * head_dim;
    const float p = (float)pos[r];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float a = __fmul_rn(p, inv_freq[i]);
        float s, c;
        sincosf(a, &s, &c);
        rotate_pair(v[i], v[i + half], c, s, &v[i], &v[i + half]);
    }
}

/* EARLY (splash_cuda_attn_prep_args.early): this thread's norm factors and
 * its rotary pairs' cos and sin are made between launch_dependents and the
 * wait, while the product before still runs (weights and positions); the
 * same operations on the same values as after it.  A thread's indices are
 * threadIdx.x + q blockDim.x: at most kPrepPer of head_dim (the launch's
 * threads are >= head_dim / 4) and kPrepRot of the rotary half. */
constexpr int kPrepPer = 4, kPrepRot = 2;

template <bool EARLY>
__global__ void attn_prep_kernel(const splash_cuda_attn_prep_args a) {
    float e_f[kPrepPer], e_c[kPrepRot], e_s[kPrepRot];
    if constexpr (EARLY) {
        pdl_launch_dependents();
        const int r = blockIdx.y, hd = a.head_dim, half = a.rot_dim / 2;
        const float *w = (int)blockIdx.x < a.heads ? a.q_norm : a.k_norm;
#pragma unroll
        for (int q = 0; q < kPrepPer; q++) {
            const int i = threadIdx.x + q * blockDim.x;
            e_f[q] = i < hd ? __fadd_rn(a.norm_offset, w[i]) : 0.f;
        }
        const float p = half ? (float)a.pos[r] : 0.f;
#pragma unroll
        for (int q = 0; q < kPrepRot; q++) {
            const int i = threadIdx.x + q * blockDim.x;
            float sn = 0.f, cs = 1.f; /* into scalars, as the plain path */
            if (i < half) sincosf(__fmul_rn(p, a.inv_freq[i]), &sn, &cs);
            e_s[q] = sn, e_c[q] = cs;
        }
        pdl_wait();
    } else {
        pdl_begin();
    }
    extern __shared__ float buf[]; /* [head_dim] */
    __shared__ float red[32];
    const int r = blockIdx.y, j = blockIdx.x, hd = a.head_dim;
    const bool is_q = j < a.heads;
    const float *src;
    float *dst;
    const float *w;
    if (is_q) {
        src = a.qg + (size_t)r * a.ldqg + (size_t)j * (a.qhs ? a.qhs : 2 * (size_t)hd);
        dst = a.q + (size_t)r * a.ldq + (size_t)j * hd;
        w = a.q_norm;
    } else {
        dst = a.k + (size_t)r * a.ldk + (size_t)(j - a.heads) * hd;
        src = dst;
        w = a.k_norm;
    }
    float ss = 0.f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        const float v = src[i];
        buf[i] = v;
        ss = fmaf(v, v, ss);
    }
    if (is_q && a.gate) {
        float *g = a.gate + (size_t)r * a.ldg + (size_t)j * hd;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) g[i] = src[hd + i];
    }
    ss = block_sum(ss, red); /* ends with a barrier: buf is complete */
    const float rs = 1.0f / sqrtf(ss / (float)hd + a.eps);
    if constexpr (EARLY) {
#pragma unroll
        for (int q = 0; q < kPrepPer; q++) {
            const int i = threadIdx.x + q * blockDim.x;
            if (i < hd) buf[i] = __fmul_rn(__fmul_rn(buf[i], rs), e_f[q]);
        }
    } else {
        for (int i = threadIdx.x; i < hd; i += blockDim.x)
            buf[i] = __fmul_rn(__fmul_rn(buf[i], rs), __fadd_rn(a.norm_offset, w[i]));
    }
    __syncthreads();
    const int half = a.rot_dim / 2;
    if constexpr (EARLY) {
#pragma unroll
        for (int q = 0; q < kPrepRot; q++) {
            const int i = threadIdx.x + q * blockDim.x;
            if (i < half) rotate_pair(buf[i], buf[i + half], e_c[q], e_s[q], &dst[i], &dst[i + half]);
        }
    } else {
        const float p = half ? (float)a.pos[r] : 0.f;
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            const float ang = __fmul_rn(p, a.inv_freq[i]);
            float s, c;
            sincosf(ang, &s, &c);
            rotate_pair(buf[i], buf[i + half], c, s, &dst[i], &dst[i + half]);
        }
    }
    for (int i = a.rot_dim + threadIdx.x; i < hd; i += blockDim.x) dst[i] = buf[i];
}

__global__ void sigmoid_gate_kernel(float *o, size_t ldo, const float *gate, size_t ldg, int width) {
    pdl_begin();
    const size_t r = blockIdx.y;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x)
        o[r * ldo + i] = __fmul_rn(o[r * ldo + i], sigmoidf_(gate[r * ldg + i]));
}

} /* namespace */

extern "C" void splash_cuda_rope_inv_freq(float *inv, int rot_dim, double theta) {
    for (int i = 0; i < rot_dim / 2; i++) {
        float e = (float)(2 * i) / (float)rot_dim;
        inv[i] = 1.0f / powf((float)theta, e);
    }
}

extern "C" int splash_cuda_rope(float *x, size_t ldx, int rows, int heads, int head_dim, int rot_dim,
                                const float *inv_freq, const int32_t *pos, struct CUstream_st *stream) {
    if (!x || rows < 0 || rows > 65535 || heads < 0 || head_dim < 1 || rot_dim < 0 || rot_dim > head_dim ||
        rot_dim % 2)
        return SPLASH_E_INVALID;
    if (rows == 0 || heads == 0 || rot_dim == 0) return SPLASH_OK;
    if (!inv_freq || !pos) return SPLASH_E_INVALID;
    const int half = rot_dim / 2;
    SPLASH_CUDA_TRY(launch_kernel(rope_kernel, dim3((unsigned)heads, (unsigned)rows), half >= 128 ? 128 : 32, 0,
                                  (cudaStream_t)stream, x, ldx, head_dim, half, inv_freq, pos));
    return SPLASH_OK;
}

extern "C" int splash_cuda_attn_prep(const splash_cuda_attn_prep_args *a, struct CUstream_st *stream) {
    if (!a || (a->heads && (!a->qg || !a->q || !a->q_norm)) || !a->k || !a->k_norm || a->rows < 0 ||
        a->rows > 65535 || a->heads < 0 || a->kv_heads < 1 || a->head_dim < 1 ||
        a->head_dim > SPLASH_CUDA_MAX_HEAD_DIM || a->rot_dim < 0 || a->rot_dim > a->head_dim || a->rot_dim % 2 ||
        (a->rot_dim && (!a->inv_freq || !a->pos)) || (a->qhs && (a->qhs < (size_t)a->head_dim || a->gate)))
        return SPLASH_E_INVALID;
    if (a->rows == 0) return SPLASH_OK;
    const int threads = a->head_dim >= 512 ? 256 : a->head_dim >= 128 ? 128 : 64;
    SPLASH_CUDA_TRY(launch_kernel(a->early ? attn_prep_kernel<true> : attn_prep_kernel<false>,
                                  dim3((unsigned)(a->heads + a->kv_heads), (unsigned)a->rows),
                                  threads, (size_t)a->head_dim * sizeof(float), (cudaStream_t)stream, *a));
    return SPLASH_OK;
}

extern "C" int splash_cuda_sigmoid_gate(float *o, size_t ldo, const float *gate, size_t ldg, int rows, int width,
                                        struct CUstream_st *stream) {
    if (!o || !gate || rows < 0 || rows > 65535 || width < 0) return SPLASH_E_INVALID;
    if (rows == 0 || width == 0) return SPLASH_OK;
    const int blocks = (width + 1023) / 1024;
    SPLASH_CUDA_TRY(launch_kernel(sigmoid_gate_kernel, dim3((unsigned)blocks, (unsigned)rows), 256, 0,
                                  (cudaStream_t)stream, o, ldo, gate, ldg, width));
    return SPLASH_OK;
}
