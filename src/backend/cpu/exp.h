/* exp.h - internal to the CPU backend: the exponential every hot kernel
 * uses (attention's softmax, SiLU, sigmoid), written once for the scalar
 * path and once for AVX2 with the same operations in the same order, so
 * both give the same bits (libm's expf has no vector twin that matches it).
 *
 * Cephes' expf: n = rint(x log2 e); r = x - n ln2 (in two parts); exp(r) by
 * a degree-5 polynomial, r + r^2 P(r) + 1; times 2^n.  About 1 ulp over the
 * range.  Inputs above 88 are clamped to 88 (e^88 ~ 1.65e38); inputs below
 * -87, and NaN, give 0.
 */
#ifndef SPLASH_CPU_EXP_H
#define SPLASH_CPU_EXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define CPU_EXP_LOG2E 1.44269504088896341f
#define CPU_EXP_C1 0.693359375f
#define CPU_EXP_C2 -2.12194440e-4f
#define CPU_EXP_P0 1.9875691500e-4f
#define CPU_EXP_P1 1.3981999507e-3f
#define CPU_EXP_P2 8.3334519073e-3f
#define CPU_EXP_P3 4.1665795894e-2f
#define CPU_EXP_P4 1.6666665459e-1f
#define CPU_EXP_P5 5.0000001201e-1f

static inline float cpu_exp_poly(float x) {
    if (!(x >= -87.0f)) return 0.0f;
    x = x < 88.0f ? x : 88.0f;
    float n = rintf(x * CPU_EXP_LOG2E);
    float r = fmaf(n, -CPU_EXP_C1, x);
    r = fmaf(n, -CPU_EXP_C2, r);
    float p = fmaf(CPU_EXP_P0, r, CPU_EXP_P1);
    p = fmaf(p, r, CPU_EXP_P2);
    p = fmaf(p, r, CPU_EXP_P3);
    p = fmaf(p, r, CPU_EXP_P4);
    p = fmaf(p, r, CPU_EXP_P5);
    float y = fmaf(p, r * r, r) + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float two;
    memcpy(&two, &bits, sizeof two);
    return y * two;
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

__attribute__((target("avx2,fma,f16c"))) static inline __m256 cpu_exp_poly_avx(__m256 x) {
    __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(CPU_EXP_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-CPU_EXP_C1), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-CPU_EXP_C2), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(CPU_EXP_P0), r, _mm256_set1_ps(CPU_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CPU_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CPU_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CPU_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CPU_EXP_P5));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(keep, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}
#endif

#endif
