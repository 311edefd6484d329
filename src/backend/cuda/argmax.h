/* argmax.h - greedy decoding's argmax over the vocabulary on the GPU, and
 * lm_head + argmax in one call (the q4 product, then the reduction).
 *
 * The rule is the CPU sampler's greedy rule (runtime/sampling.c): the largest
 * value; ties go to the lowest index; NaN is never chosen; a row with no value
 * above -inf gives index -1.  Two passes: blocks reduce chunks of 4096
 * columns of each row to (value, index) pairs in the workspace, then one block
 * per row reduces the pairs.  Exact (no arithmetic), so it matches the CPU
 * bit for bit on the same logits.
 */
#ifndef SPLASH_CUDA_ARGMAX_H
#define SPLASH_CUDA_ARGMAX_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/q4_matmul.h"

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;

size_t splash_cuda_argmax_workspace_bytes(int rows, int n);

/* x [rows][n] (stride ldx) -> idx[rows] (and val[rows], the maximum, when
 * val is not NULL).  Device pointers; the workspace is the caller's. */
int splash_cuda_argmax(const float *x, size_t ldx, int rows, int n, int32_t *idx, float *val, void *workspace,
                       size_t workspace_bytes, struct CUstream_st *stream);

/* logits = lm_head . x (splash_q4_matmul, [xp->M][w->rows]), then the argmax
 * of each row. */
int splash_cuda_lm_head_argmax(const splash_q4_matrix *w, const splash_q4_xprep *xp, float *logits, int32_t *idx,
                               float *val, void *workspace, size_t workspace_bytes, struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif

#endif
