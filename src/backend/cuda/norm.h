/* norm.h - the normalisations of Qwen3.5 on the GPU, per vector, fp32:
 *
 *   RMSNorm        y = x * rsqrt(mean(x^2) + eps) * (offset + w)
 *                  offset 1 for the zero-centred norms when w is the stored
 *                  offset (input/post norms, q_norm, k_norm, final norm),
 *                  0 when w already holds the factor (as the CPU backend's
 *                  weights do: qwen35_layer.input_norm = 1 + w);
 *   gated RMSNorm  y = (w * (x * rsqrt(mean(x^2) + eps))) * silu(z)
 *                  (GDN output, per value head; w not offset);
 *   L2 norm        y = (x * rsqrt(sum(x^2) + eps)) * scale
 *                  (GDN q and k; scale = dk^-0.5 for q, 1 for k).
 *
 * The same formulas and operation order as src/backend/cpu/norm.c; only the
 * sum of squares is added in a different order (a warp/block tree instead of
 * cpu_dot's 32 lanes), so results agree to fp32 rounding (~1e-7), not bitwise.
 *
 * Addressing: a call normalises rows x heads vectors of n floats; element i of
 * vector (r, h) is at p[r * ld + h * hs + i] for each array (x, z, y), so one
 * call covers a [rows][hidden] activation (heads = 1), or the per-head norms
 * of an interleaved projection output (hs = 2 * head_dim).  y may alias x
 * (each element is read before it is written, by the same thread).  All
 * pointers are device memory; nothing is allocated.
 *
 * Errors: SPLASH_E_INVALID for bad arguments, SPLASH_E_IO when the launch
 * fails (cuda_check.h).
 */
#ifndef SPLASH_CUDA_NORM_H
#define SPLASH_CUDA_NORM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st; /* cudaStream_t; NULL = the default stream */

int splash_cuda_rmsnorm(const float *x, size_t ldx, size_t hsx, float *y, size_t ldy, size_t hsy, const float *w,
                        float offset, int n, int rows, int heads, float eps, struct CUstream_st *stream);

int splash_cuda_rmsnorm_gated(const float *x, size_t ldx, size_t hsx, const float *z, size_t ldz, size_t hsz,
                              float *y, size_t ldy, size_t hsy, const float *w, int n, int rows, int heads,
                              float eps, struct CUstream_st *stream);

/* In place: x = (x * rsqrt(sum(x^2) + eps)) * scale. */
int splash_cuda_l2norm(float *x, size_t ldx, size_t hsx, int n, int rows, int heads, float eps, float scale,
                       struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif

#endif
