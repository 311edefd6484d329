/* q4_prep.cuh - one 64-column group of a prepared q4 activation
 * (splash_q4_xprep, q4_matmul.h) made from a warp's values: the group's power
 * of two, x's three 8-bit digits in the product's order, the group's sum and
 * 2^-k.  The preparations of q4_matmul.cu make every group through it; a
 * kernel that produces a product's input may make it too, with the same bits
 * (session 28 had the GDN recurrence do so: measured no faster, removed;
 * docs/cuda.md).
 *
 * Device-only C++; every function is inline.
 */
#ifndef SPLASH_CUDA_Q4_PREP_CUH
#define SPLASH_CUDA_Q4_PREP_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/q4_tile.cuh"

namespace splash_cuda {

/* The M classes (x rows 1..16): <= 2, 4, 8, 16 rows, class c taking 2 << c
 * rows of x (the preparation pads to them: prep_padded_rows) on its own
 * kernel and preset (q4_matmul.cu). */
__host__ __device__ inline int mclass(int M) { return M <= 2 ? 0 : M <= 4 ? 1 : M <= 8 ? 2 : 3; }
__host__ __device__ inline int prep_padded_rows(int M) { return 2 << mclass(M); }

/* The group's largest |x| scaled into [2^21, 2^22): three signed digits of
 * 8 bits hold any integer of that size. */
constexpr int kDigitsTop = 22;

/* q = 65536 hi + 256 mid + lo, each digit in [-128, 127] (|q| <= 2^22:
 * |hi| <= 65). */
__device__ __forceinline__ void digits(int q, int (&d)[3]) {
    const int lo = ((q + 128) & 255) - 128;
    const int r = (q - lo) >> 8; /* exact: q - lo is a multiple of 256 */
    const int mid = ((r + 128) & 255) - 128;
    d[0] = (r - mid) >> 8, d[1] = mid, d[2] = lo;
}

/* Where column j of a 16-column chunk is stored: the order in which the
 * kernel's A registers hold the codes (tile_products8), so that a lane's 16
 * bytes are its B registers: 0 4 1 5 2 6 3 7, then 8 12 9 13 10 14 11 15. */
__device__ __forceinline__ int digit_pos(int j) { return (j & 8) | ((j & 3) << 1) | ((j >> 2) & 1); }

/* Group G of prepared row m from its lanes' two values v each (columns c =
 * 64 G + 2 lane, c + 1): the group's power of two and digits (q4_matmul.cu's
 * comment above XFrag), its sum and 2^-k.  The whole warp calls it.  o: where
 * it writes, any type with an xprep's x8 [rows_cap][3][cols], gsum and ginv
 * [cols / 64][gstride], cols and Mp (the rows whose digits are written: a
 * product's padded M); q4_matmul.cu's PrepArgs. */
template <class Out>
__device__ __forceinline__ void prep_group(const Out &o, int m, int G, int c, float2 v) {
    float scale = 1.f, inv = 1.f;
    const float mx = warp_max(fmaxf(fabsf(v.x), fabsf(v.y))); /* zero for rows >= M */
    row_pow2_scale(mx, scale, inv, kDigitsTop, 126);
    /* a NaN or inf of x makes the group's results NaN (fmaxf drops NaNs, and
     * digits cannot hold either) */
    const bool bad = __any_sync(0xffffffffu, !(isfinite(v.x) && isfinite(v.y)));
    if (bad) inv = __int_as_float(0x7fc00000);
    if (m < o.Mp) {
        int d0[3], d1[3];
        digits(bad ? 0 : __float2int_rn(v.x * scale), d0); /* exact scaling: a power of two */
        digits(bad ? 0 : __float2int_rn(v.y * scale), d1);
        const int j = c & 15;
        int8_t *row = o.x8 + (size_t)m * 3 * o.cols + (c - j);
#pragma unroll
        for (int d = 0; d < 3; d++) {
            row[(size_t)d * o.cols + digit_pos(j)] = (int8_t)d0[d];
            row[(size_t)d * o.cols + digit_pos(j + 1)] = (int8_t)d1[d];
        }
    }
    const float s = warp_sum(v.x + v.y);
    if ((threadIdx.x & 31) == 0) o.gsum[(size_t)G * o.gstride + m] = s, o.ginv[(size_t)G * o.gstride + m] = inv;
}

} /* namespace splash_cuda */

#endif
