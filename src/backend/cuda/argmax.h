/* argmax.h - picking tokens from rows of logits on the GPU: greedy
 * decoding's argmax over the vocabulary, lm_head + argmax in one call (the q4
 * product, then the reduction), and each row's top k (sampling with top_k,
 * the DFlash 2 selector's candidates).
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

/* Each row's top k (<= SPLASH_CUDA_MAX_TOPK) finite values of x [rows][n]:
 * cand[r * ldc + j] their columns, val[r * ldc + j] their values, descending
 * (equal values: lower column first); entries past n_cand[r] are -1 / -inf.
 * cpu_top_k's result exactly (no arithmetic).  Two passes as the argmax: a
 * block per 4,096 columns keeps its k best, one block per row merges them. */
#define SPLASH_CUDA_MAX_TOPK 64
size_t splash_cuda_topk_workspace_bytes(int rows, int n, int k);
/* The largest k the top-k takes over rows of n (at most SPLASH_CUDA_MAX_TOPK;
 * 64 up to ~376K columns). */
int splash_cuda_topk_max_k(int n);
int splash_cuda_topk(const float *x, size_t ldx, int rows, int n, int k, int32_t *cand, float *val, size_t ldc,
                     int32_t *n_cand, void *workspace, size_t workspace_bytes, struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif

#endif
