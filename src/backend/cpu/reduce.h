/* reduce.h - internal to the CPU backend: the fixed horizontal reductions
 * every dot product ends with (cpu.h describes the order), shared by the
 * scalar and AVX2 paths of matmul.c and matmul_act.c so they cannot drift,
 * and the interface between matmul.c (jobs, input preparation, fp32 kernels)
 * and matmul_act.c (quantised-activation kernels).
 */
#ifndef SPLASH_CPU_REDUCE_H
#define SPLASH_CPU_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "package/tensor.h"

/* 8 -> 1 as ((0+4)+(2+6)) + ((1+5)+(3+7)) */
static inline float hsum8(const float v[8]) {
    float t0 = v[0] + v[4], t1 = v[1] + v[5], t2 = v[2] + v[6], t3 = v[3] + v[7];
    return (t0 + t2) + (t1 + t3);
}

/* 32 lanes -> 8 as (l + l+8) + (l+16 + l+24), then hsum8 */
static inline float reduce32(const float acc[32]) {
    float v[8];
    for (int l = 0; l < 8; l++) v[l] = (acc[l] + acc[8 + l]) + (acc[16 + l] + acc[24 + l]);
    return hsum8(v);
}

/* The end of every q4/q8 dot product: two accumulators of 8 lanes (even and
 * odd groups) added lane by lane, then hsum8; plus hsum8 of the 8 bias lanes. */
static inline float finish_q(const float a0[8], const float a1[8], const float bl[8]) {
    float v[8];
    for (int l = 0; l < 8; l++) v[l] = a0[l] + a1[l];
    return hsum8(v) + hsum8(bl);
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define AVX __attribute__((target("avx2,fma,f16c")))
AVX static inline float hsum8_avx(__m256 v) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* t0..t3 */
    __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));                                   /* t0+t2, t1+t3 */
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
}
/* 8 bf16 values as fp32 */
AVX static inline __m256 bf16x8_avx(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif

/* ---- the prepared input rows of one product ------------------------------- */

/* Everything a kernel reads about the input rows, prepared once per call
 * (and shared by every matrix of a fused call).  Row i of each array is
 * i * its stride into it. */
typedef struct mm_in {
    int m, cols, groups;
    const float *x;
    size_t ldx;
    const float *xs;  /* [m][groups] group sums of x, fp32 (bias terms) */
    const float *xp;  /* [m][cols] fp32 x in q4 order: per group evens, then odds */
    int act;          /* CPU_ACT_* of xq4 / xq8 */
    const void *xq4;  /* [m][cols] quantised x in the q4 kernels' order */
    const void *xq8;  /* [m][cols] quantised x in column order (q8 kernels) */
    size_t xq_stride; /* bytes between rows of xq4 / xq8 */
    const float *xd;  /* [m][2][groups] their scales d_g (amax / Q), then
                         c_g = xsum_g - d_g * sum(xq) (matmul_act.c) */
    const float *xt;  /* [m/4][groups][3][4] d_g, xsum_g, c_g of 4 inputs at a
                         time (cpu_act_transpose; NULL: not prepared) */
} mm_in;

/* matmul_act.c: quantises input rows (x rows ldx apart, their group sums xs
 * rows groups apart) per group of 64: xq8 in column order, xq4 in the q4
 * layout, xd as in mm_in.  Either destination may be NULL. */
void cpu_act_prepare(int act, int m, const float *x, size_t ldx, const float *xs, int groups, void *xq4, void *xq8,
                     size_t xq_stride, float *xd, int simd);
/* The block kernels' view of xd and xs: for each block of 4 inputs, group
 * by group, [d_g of the 4][xsum_g of the 4][c_g of the 4] (a short last
 * block repeats its last input).  cpu_act_transpose_floats: its size. */
size_t cpu_act_transpose_floats(int m, int groups);
void cpu_act_transpose(int m, int groups, const float *xd, const float *xs, float *xt);
/* y[i * ldy + r] (+)= row r of a q4/q8 matrix . input i, for rows [r0, r1)
 * and inputs [0, in->m), on quantised activations. */
void cpu_act_rows(int bits, const uint8_t *q, size_t row_bytes, const uint16_t *sc, const uint16_t *bi, int r0,
                  int r1, const mm_in *in, float *y, size_t ldy, int add, int simd);

#endif
