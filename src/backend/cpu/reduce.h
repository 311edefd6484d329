/* reduce.h - internal to the CPU backend: the fixed horizontal reductions
 * every dot product ends with (cpu.h describes the order), shared by the
 * scalar and AVX2 paths of matmul.c and matmul_act.c so they cannot drift,
 * and the quantised-activation entry points of matmul_act.c. */
#ifndef SPLASH_CPU_REDUCE_H
#define SPLASH_CPU_REDUCE_H

#include <stddef.h>
#include <stdint.h>

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

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define AVX __attribute__((target("avx2,fma,f16c")))
AVX static inline float hsum8_avx(__m256 v) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* t0..t3 */
    __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));                                   /* t0+t2, t1+t3 */
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
}
#endif

/* matmul_act.c: quantises one input row for q4/q8 rows (bits) into xq
 * (groups*64 int8 or int16 values in the kernel's layout) and xd (scales);
 * and one row's dot with it. */
void cpu_act_quantize(int act, int bits, const float *x, int groups, void *xq, float *xd);
float cpu_act_dot(int act, int bits, int simd, const uint8_t *qrow, const uint16_t *sc, const uint16_t *bi, int groups,
                  const void *xq, const float *xd, const float *xs);

#endif
