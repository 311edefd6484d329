/* blas.h - cuBLASLt's fp16 GEMM for the prefill products, loaded at run
 * time, C-callable.
 *
 *   y[n][r] = alpha * sum_c w16[r][c] * x16[n][c]  (+ beta * y[n][r])
 *
 * Why.  With a prefill chunk of hundreds or thousands of rows the q4
 * products are bound by the tensor cores, not by the weight bytes, and
 * cuBLASLt's Hopper kernels (wgmma, TMA, warp specialisation) run fp16 at
 * 740-880 TFLOP/s on the 27B's shapes against 260-320 for q4_gemm.cu's
 * mma.sync kernel (NOTES.md).  The q4 matrix is expanded to fp16 first
 * (splash_q4_expand_f16: 2.5 bytes of traffic a weight), so this pays when
 * the rows are many (QC_BLAS_MIN_ROWS in the model).
 *
 * Loaded with dlopen (libcublasLt.so.<the major version built against>),
 * so the binary starts, and runs every other path, where the library is
 * absent: splash_cuda_blas_open then fails and callers keep q4_gemm.h.
 * SPLASH_CUDA_BLAS=0 in the environment refuses it too (A/B runs).
 *
 * Accuracy: fp16 inputs, fp32 accumulation and output, as q4_gemm.h.
 * Determinism: the same call gives the same bits (no atomics), but the
 * algorithm, so the order of the sums, is cuBLASLt's choice per shape (rows
 * of x included): a row's result may change with the number of rows it is
 * multiplied with.
 *
 * A handle is used by one thread at a time (the model's).  Errors:
 * SPLASH_E_UNSUPPORTED (open: no library, or refused), SPLASH_E_INVALID
 * (bad arguments), SPLASH_E_IO (cuBLASLt failed; message on stderr).
 */
#ifndef SPLASH_CUDA_BLAS_H
#define SPLASH_CUDA_BLAS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;
typedef struct splash_cuda_blas splash_cuda_blas;

/* The workspace a call may use (device memory the caller owns). */
#define SPLASH_CUDA_BLAS_WORKSPACE ((size_t)32 << 20)

int splash_cuda_blas_open(splash_cuda_blas **out);
void splash_cuda_blas_close(splash_cuda_blas *b);

/* w16: fp16 [N][K] row-major; x16: fp16 [R][K]; y: fp32 [R][N] (row stride
 * N); alpha, beta: device scalars (beta 0: y is written, never read). */
int splash_cuda_blas_gemm(splash_cuda_blas *b, const uint16_t *w16, int N, int K, const uint16_t *x16, int R,
                          const float *alpha, const float *beta, float *y, void *workspace,
                          struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif

#endif
