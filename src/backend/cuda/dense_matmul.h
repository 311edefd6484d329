/* dense_matmul.h - matrix products on the GPU for weights the q4 kernel does
 * not take: plain f32 / bf16 / f16 matrices and canonical q8 (tensor.h),
 * with fp32 activations and fp32 accumulation, any number of rows.
 *
 *   y[m * ldy + r] = sum_c w[r][c] * x[m * ldx + c]
 *
 * Who uses it: the few matrices a q4 package keeps in bf16 (the MoE router,
 * the shared-expert gate, any matrix whose input dimension is not a multiple
 * of 64, e.g. the fixtures' GDN out_proj with 288 inputs) and every matrix of
 * a bf16 or q8 package.  The weights are read in the layout the package
 * stores (no repack): row-major [rows][cols] for plain types; for q8 the
 * codes [rows][cols], then scales and biases [rows][cols/64] bf16, each part
 * 64-byte aligned (splash_matrix_layout).  Element values are exactly the
 * CPU's splash_tensor_row_f32 (bf16/f16 widened exactly; q8 scale * q + bias
 * rounded as two fp32 operations).
 *
 * Shape of the work: a block of 4 warps per 2 output rows and up to 8 rows
 * of x, the warps splitting the rows' 8-column chunks (lane t of warp w sums
 * chunks 32 w + t + 128 i in order), then a warp tree and the 4 warps in
 * order; element by element, a warp per output row, when cols % 8 or x's
 * alignment rule chunks out (dense_matmul.cu).  Sized for latency: these
 * matrices are small in a q4 model (the MoE router, 1 MB: 4.7 us a layer of
 * an 8-row verify's graph, session 26); a bf16 model runs correctly on it,
 * not fast.
 * Results depend only on the row's own x (the sum's order is fixed by the
 * column, not by M), so they are batch-invariant.
 */
#ifndef SPLASH_CUDA_DENSE_MATMUL_H
#define SPLASH_CUDA_DENSE_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;

/* dtype: SPLASH_F32, SPLASH_F16, SPLASH_BF16 or SPLASH_Q8 (package/tensor.h). */
typedef struct splash_cuda_dense_matrix {
    int dtype;
    int rows, cols;
    const uint8_t *data;               /* device: the matrix as stored */
    size_t scales_offset, biases_offset; /* q8 only: parts inside data */
} splash_cuda_dense_matrix;

/* Describes a matrix already on the device (data = its stored bytes). */
int splash_cuda_dense_matrix_init(splash_cuda_dense_matrix *m, int dtype, const void *dev_data, int rows, int cols);

/* y [M][rows] (stride ldy) = w . x [M][cols] (stride ldx).  Device pointers. */
int splash_cuda_dense_matmul(const splash_cuda_dense_matrix *w, const float *x, size_t ldx, int M, float *y,
                             size_t ldy, struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif

#endif
