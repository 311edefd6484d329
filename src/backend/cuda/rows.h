/* rows.h - whole-row data movement on the GPU that the model forward needs
 * between the arithmetic ops:
 *
 *   embed rows    x[i] = row ids[i] of a weight matrix, dequantised to fp32
 *                 exactly as the CPU's splash_tensor_row_f32 (ids[i] < 0:
 *                 row i is left untouched, for rows the caller fills itself,
 *                 e.g. image embeddings).  From a tiled q4 matrix (the
 *                 embedding shares the lm_head's tiles when they are tied) or
 *                 a plain / q8 one (dense_matmul.h).
 *   gather rows   dst[i] = src[idx[i]]                 (logits rows, taps)
 *   scatter rows  dst[map[r]] = src[r] for map[r] >= 0 (verify rows saved
 *                 for commit)
 *   add rows      y[r] = y[r] + x[r]                   (the residual)
 *
 * Every array is device memory, [rows][width] with a row stride in floats;
 * index arrays are device int32.  Nothing is allocated.
 */
#ifndef SPLASH_CUDA_ROWS_H
#define SPLASH_CUDA_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/dense_matmul.h"
#include "backend/cuda/q4_matmul.h"

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;

/* out[i] = the embedding row ids[i] (read on the device); an id outside [0,
 * w->rows) leaves out[i] as it was (an override, or a bad device token). */
int splash_cuda_embed_rows_q4(const splash_q4_matrix *w, const int32_t *ids, int n, float *out, size_t ldo,
                              struct CUstream_st *stream);
int splash_cuda_embed_rows_dense(const splash_cuda_dense_matrix *w, const int32_t *ids, int n, float *out,
                                 size_t ldo, struct CUstream_st *stream);

int splash_cuda_gather_rows(const float *src, size_t lds, const int32_t *idx, int n, float *dst, size_t ldd,
                            int width, struct CUstream_st *stream);
int splash_cuda_scatter_rows(const float *src, size_t lds, const int32_t *map, int rows, float *dst, size_t ldd,
                             int width, struct CUstream_st *stream);
int splash_cuda_add_rows(float *y, size_t ldy, const float *x, size_t ldx, int rows, int width,
                         struct CUstream_st *stream);

/* Host: element (r, c) of a tiled q4 matrix given as host bytes (codes part
 * then sb part, q4_matmul.h), for tests of the tiled addressing. */
float splash_q4_tiled_at_host(const uint8_t *tiled, int rows, int cols, int r, int c);

#ifdef __cplusplus
}
#endif

#endif
