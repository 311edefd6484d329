/* act.h - elementwise activations of the FFN and MoE on the GPU:
 *
 *   silu_mul    out = silu(g) * u          (SwiGLU's middle; out may alias g or u)
 *   shared_add  fo = fo + sigmoid(s_r) * mo;  x = fo + x
 *               (the MoE block's shared expert, gated by one logit per row,
 *               then the residual add, as models/qwen35/ffn.c)
 *
 * The CPU's formulas (act.c, ffn.c) with explicit rounding of every product
 * and sum, so only expf differs from the CPU.  All pointers are device
 * memory, rows [rows][n] with the given row strides.
 */
#ifndef SPLASH_CUDA_ACT_H
#define SPLASH_CUDA_ACT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;

int splash_cuda_silu_mul(const float *g, size_t ldg, const float *u, size_t ldu, float *out, size_t ldo, int rows,
                         int n, struct CUstream_st *stream);

/* s: [rows] logits of the shared-expert gate, stride lds floats. */
int splash_cuda_moe_shared_add(float *fo, size_t ldf, const float *mo, size_t ldm, const float *s, size_t lds,
                               float *x, size_t ldx, int rows, int n, struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif

#endif
