/* quantize.h - affine q4 / q8 quantisation, group 64 (the MLX schemes).
 *
 * Per group of 64 consecutive inputs of a row:
 *
 *   bias  = min(w) rounded DOWN to bf16
 *   scale = (max(w) - bias) / (2^bits - 1) rounded UP to bf16
 *   q     = clamp(round((w - bias) / scale), 0, 2^bits - 1)
 *   w'    = scale * q + bias
 *
 * The codes are chosen against the bf16 scale and bias actually stored, and
 * the directed rounding keeps [bias, bias + (2^bits-1)*scale] covering the
 * group, so every element dequantises within scale/2 of its value (rounding to
 * nearest instead could push the group's min or max outside the range and clamp
 * it by up to one bf16 ulp of the value, which for a group far from zero is
 * more than half a step).  A constant group gets scale 0, q 0, bias = w
 * rounded down; its error is that rounding only.
 */
#ifndef SPLASH_QUANTIZE_H
#define SPLASH_QUANTIZE_H

#include <stddef.h>
#include <stdint.h>

#include "package/tensor.h"

/* bf16 of x rounded toward -inf / +inf (x finite). */
uint16_t splash_bf16_round_down(float x);
uint16_t splash_bf16_round_up(float x);

/* Quantises one row of `cols` (a multiple of 64) finite floats.  t is
 * SPLASH_Q4 or SPLASH_Q8.  codes: cols/2 (q4, packed as tensor.h says) or cols
 * bytes; scales, biases: cols/64 bf16 each.  Returns 0, or -1 if a value is
 * not finite (nothing sensible to store: the caller names the tensor). */
int splash_quantize_row(splash_dtype t, const float *w, int64_t cols, uint8_t *codes, uint16_t *scales,
                        uint16_t *biases);

/* Quantises rows [r0, r1) of a [rows, cols] matrix into their places in the
 * canonical blob `out` (splash_matrix_layout(t, rows, cols).bytes; zeroing the
 * padding is the caller's).  w holds just those rows: (r1-r0) x cols floats.
 * Returns 0, or -1 with *bad_row set at the first row with a non-finite value
 * (or a group whose range overflows float). */
int splash_quantize_rows(splash_dtype t, const float *w, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                         uint8_t *out, int64_t *bad_row);

#endif
