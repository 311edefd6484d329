/* q4_gemm.h - q4 matrix products for prefill (many rows of x) on tensor
 * cores, reading the same tiled matrices as q4_matmul.h, C-callable.
 *
 *   y[n][r] = sum_c w[r][c] * x[n][c],   w[r][c] = scale * q + bias   (n < R)
 *
 * Where q4_matmul.h's kernel streams the weights once per 16 rows of x
 * (decode and verify: bound by the weight bytes), this one is bound by the
 * arithmetic: a block holds 256 weight rows x 128 rows of x, the weights are
 * made fp16 (scale * q + bias, one f16x2 fma per two weights) and multiplied
 * on the tensor cores against fp16 x, fp32 accumulation.
 *
 * Accuracy: fp16-grade, not q4_matmul's fp32 grade: w rounded to fp16
 * (2^-11 relative), x to fp16 after scaling each row by a power of two (its
 * largest |x| just under 2^14); measured relative L2 ~1e-4..1e-3 against
 * fp64 (test_q4_matmul).  Only for matrices whose scales and biases suit
 * fp16 (splash_q4_tiled_fp16_ok: |scale| >= 2^-14 or 0, every weight
 * < 2^15 in magnitude); the caller keeps q4_matmul for the others.
 * Determinism: a row's result depends on that row of x and the matrix only
 * (no split of the column range; the same order for every R).
 *
 * Errors: SPLASH_E_INVALID for bad shapes or arguments, SPLASH_E_IO when the
 * CUDA runtime refuses (message on stderr, see cuda_check.h).
 */
#ifndef SPLASH_CUDA_Q4_GEMM_H
#define SPLASH_CUDA_Q4_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/q4_matmul.h"

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;

/* 1 when the GEMM may use the tiled matrix whose host copy is `tiled` (the
 * blob splash_q4_repack_host or _stacked_host wrote): every scale is 0 or
 * at least 2^-14 in magnitude (an fp16 normal, so its conversion is exact)
 * and |15 * scale| + |bias| < 2^15 (no weight overflows fp16). */
int splash_q4_tiled_fp16_ok(const uint8_t *tiled, int rows, int cols);

/* x prepared for the GEMM: rows of fp16 x * 2^k[n], and 2^-k[n]. */
typedef struct splash_q4_gemm_x {
    uint16_t *hi;     /* fp16 [rows_cap][cols_cap], row stride cols */
    float *inv_scale; /* [rows_cap] */
    float *alpha;     /* [3]: after splash_q4_gemm_prep_uniform, the rows' one 2^-k, then 0 and 1 (the scalars
                         a dense fp16 GEMM takes as alpha and beta: blas.h) */
    uint32_t *amax;   /* [1] the uniform preparation's largest |x| (float bits) */
    int R, cols;      /* set by splash_q4_gemm_prep */
    int rows_cap, cols_cap;
} splash_q4_gemm_x;

size_t splash_q4_gemm_x_bytes(int rows_cap, int cols_cap);
/* Carves the arrays out of dev_mem (splash_q4_gemm_x_bytes, 256-aligned). */
int splash_q4_gemm_x_init(splash_q4_gemm_x *xg, void *dev_mem, int rows_cap, int cols_cap);
/* x: device fp32 [R][cols], row stride ldx floats.  Sets xg->R, xg->cols. */
int splash_q4_gemm_prep(splash_q4_gemm_x *xg, const float *x, int R, int cols, size_t ldx, struct CUstream_st *stream);
/* The same with one power of two for all R rows (the largest |x| among
 * them just under 2^14): inv_scale[n] = alpha[0] for every row, so
 * splash_q4_gemm reads it too, and a dense GEMM that scales all its rows
 * alike by one alpha (blas.h) can take it.  Scaling by a power of two is
 * exact, so a row's fp16 values are those of its own scaling unless they
 * fall below fp16's normal range (2^-14 of 2^14: 28 binades under the
 * largest |x|). */
int splash_q4_gemm_prep_uniform(splash_q4_gemm_x *xg, const float *x, int R, int cols, size_t ldx,
                                struct CUstream_st *stream);

/* The same with the rows' largest |x| already in xg->amax (float bits),
 * as splash_q4_prep_silu_mul_amax leaves it for these rows: the scaling
 * pass alone, the same results. */
int splash_q4_gemm_prep_uniform_amax(splash_q4_gemm_x *xg, const float *x, int R, int cols, size_t ldx,
                                     struct CUstream_st *stream);

/* The SwiGLU preparation (q4_matmul.h's splash_q4_prep_silu_mul: y, and xp
 * for the first rows) that also leaves the largest |y| of rows [r0, r1) in
 * xg->amax, for splash_q4_gemm_prep_uniform_amax of those rows: the
 * uniform preparation's amax pass (a read of every row: ~0.5 ms of a 27B
 * FFN's 32,768 rows) made while y is written. */
int splash_q4_prep_silu_mul_amax(splash_q4_xprep *xp, splash_q4_gemm_x *xg, int r0, int r1, const float *g,
                                 size_t ldg, const float *u, size_t ldu, float *y, size_t ldy, int rows, int cols,
                                 struct CUstream_st *stream);

/* An RMS norm (q4_matmul.h's splash_q4_prep_rmsnorm: y, and xp for the
 * first rows) that also writes rows [r0, r1) of y as this preparation, for
 * a prefill's bulk rows: x_g = y[r0..r1), xg->R = r1 - r0.  One power of
 * two for the rows as splash_q4_gemm_prep_uniform, but from a bound on |y|
 * (sqrt(cols) max|w|, +1%) rather than their largest |y|, so no pass over
 * the rows comes first: the fp16 values are the uniform preparation's
 * times a power of two (the same products, to the bit, after alpha) unless
 * they fall below fp16's normal range. */
int splash_q4_prep_rmsnorm_gemm(splash_q4_xprep *xp, splash_q4_gemm_x *xg, int r0, int r1, const float *x, size_t ldx,
                                const float *w, float eps, float *y, size_t ldy, int rows, int cols,
                                struct CUstream_st *stream);

/* The tiled matrix expanded to fp16, row-major [w->rows][w->cols]:
 * w16[r * cols + c] = fp16(scale * q + bias), one rounding (f16x2 fma of
 * the scale and bias made fp16, as q4_gemm's weights), for a dense fp16
 * GEMM (blas.h).  Only for matrices splash_q4_tiled_fp16_ok accepts. */
int splash_q4_expand_f16(const splash_q4_matrix *w, uint16_t *w16, struct CUstream_st *stream);

/* y: device fp32 [R][w->rows] (row stride w->rows), R = xg->R, xg->cols ==
 * w->cols.  add = 0: y = W x (written, never read); add = 1: y += W x (the
 * product rounded to fp32 before the add). */
int splash_q4_gemm(const splash_q4_matrix *w, const splash_q4_gemm_x *xg, float *y, int add,
                   struct CUstream_st *stream);

/* Grouped (MoE experts in prefill: no host synchronisation).  The (row,
 * expert) slots are sorted by expert (splash_cuda_moe_experts_gemm makes
 * this on the device): expert e's slots take the sorted positions
 * [off[e], off[e + 1]), in tiles of SPLASH_Q4_GEMM_GROUP_ROWS positions
 * (tile t: expert tile_e[t], first position off[e] + tile_n0[t]; *n_tiles
 * tiles, at most tiles_cap).  Position p multiplies expert e's matrix by x
 * row perm[p] / xdiv of xg (xdiv 0: row p) into y row p (stride rows);
 * first2 / y2 (NULL: none): a second matrix array read with the same x rows
 * (gate and up).  The experts' matrices lie every `stride` bytes from first
 * (first2), as the loader places a stacked expert tensor. */
#define SPLASH_Q4_GEMM_GROUP_ROWS 64
typedef struct splash_q4_gemm_groups {
    const int32_t *off;              /* device [n_experts + 1] */
    const int32_t *perm;             /* device [positions] */
    const int32_t *tile_e, *tile_n0; /* device [tiles_cap] */
    const int32_t *n_tiles;          /* device [1] */
    int tiles_cap;                   /* the launch's bound on the tiles */
    int xdiv;
} splash_q4_gemm_groups;

int splash_q4_gemm_grouped(const splash_q4_matrix *first, const splash_q4_matrix *first2, size_t stride,
                           const splash_q4_gemm_groups *g, const splash_q4_gemm_x *xg, float *y, float *y2,
                           struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif

#endif
