/* tensor.h - typed views of weights as Splash stores them.
 *
 * Element types, and the two quantised formats (the MLX affine schemes, so an
 * MLX 4-bit checkpoint packs without re-quantising):
 *
 *   q4: affine 4-bit, groups of 64 along the input (last) dimension.
 *       w[r][c] = scale[r][c/64] * q + bias[r][c/64], q in 0..15.
 *   q8: the same with 8-bit q in 0..255.
 *
 * Canonical layout of a quantised [rows, cols] tensor (cols % 64 == 0), one
 * contiguous blob, each part starting at a multiple of 64 bytes:
 *
 *   q      [rows][cols/2] bytes (q4: element 2j in the low nibble of byte j,
 *          2j+1 in the high nibble, as MLX's little-endian uint32 packing)
 *          or [rows][cols] bytes (q8)
 *   scales [rows][cols/64] bf16
 *   biases [rows][cols/64] bf16
 *
 * Rows are contiguous so a matrix-vector kernel streams one row's codes and
 * its few scales; a backend that wants tiles (CUDA) repacks at load.
 * Higher-rank tensors (stacked experts [E, rows, cols]) are E such matrices
 * back to back, each part of each expert 64-byte aligned.
 */
#ifndef SPLASH_TENSOR_H
#define SPLASH_TENSOR_H

#include <stddef.h>
#include <stdint.h>

typedef enum splash_dtype {
    SPLASH_F32,
    SPLASH_F16,
    SPLASH_BF16,
    SPLASH_Q8, /* affine 8-bit, group 64 */
    SPLASH_Q4, /* affine 4-bit, group 64 */
    SPLASH_DTYPE_COUNT,
} splash_dtype;

#define SPLASH_QGROUP 64
#define SPLASH_MAX_DIMS 4

const char *splash_dtype_name(splash_dtype t);
/* Parses "f32", "bf16", "q4"...; returns -1 if unknown. */
int splash_dtype_parse(const char *name);

/* A tensor inside a mapped package (or any memory). */
typedef struct splash_tensor {
    const char *name;
    splash_dtype dtype;
    int ndim;
    int64_t shape[SPLASH_MAX_DIMS]; /* outermost first; last = input dim */
    const uint8_t *data;            /* the blob described above */
    size_t bytes;
} splash_tensor;

static inline uint16_t splash_f32_to_bf16(float f) { /* round to nearest even */
    union { float f; uint32_t u; } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* NaN stays NaN */
    uint32_t rounding = 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)((v.u + rounding) >> 16);
}
static inline float splash_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}
float splash_f16_to_f32(uint16_t h);
uint16_t splash_f32_to_f16(float f);

/* Byte sizes and part offsets of one [rows, cols] matrix in dtype t. */
typedef struct splash_qlayout {
    size_t q_offset, scales_offset, biases_offset; /* 0 for plain types */
    size_t bytes;                                  /* whole matrix, 64-aligned */
} splash_qlayout;
splash_qlayout splash_matrix_layout(splash_dtype t, int64_t rows, int64_t cols);
/* Total bytes of a tensor of this shape (all leading dims stacked). */
size_t splash_tensor_bytes(splash_dtype t, int ndim, const int64_t *shape);
/* Rows x cols of the innermost matrix, and how many matrices are stacked. */
void splash_tensor_matrix_dims(const splash_tensor *t, int64_t *rows, int64_t *cols, int64_t *count);
/* The k-th stacked matrix of a tensor as its own 2-D view. */
splash_tensor splash_tensor_slice(const splash_tensor *t, int64_t k);

/* Dequantises row r of a 2-D tensor into out[cols] (any dtype). */
void splash_tensor_row_f32(const splash_tensor *t, int64_t r, float *out);

#endif
