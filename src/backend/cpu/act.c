/* act.c - activations and the fp32 softmax, in the order of operations torch
 * uses (sigmoid 1/(1+e^-x), silu x/(1+e^-x), softplus with threshold 20).
 *
 * Sigmoid and SiLU, which run on every FFN and GDN element, use exp.h's
 * exponential (the same bits on the scalar and AVX2 paths, about 1 ulp from
 * expf) so that the AVX2 loops below match the scalar functions exactly;
 * softplus and the softmax (router, a few values per row) keep libm's expf.
 */
#include <math.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/exp.h"

float cpu_sigmoid(float x) { return 1.0f / (1.0f + cpu_exp_poly(-x)); }

float cpu_silu(float x) { return x / (1.0f + cpu_exp_poly(-x)); }

float cpu_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

#if defined(__x86_64__) || defined(__i386__)
#define HAVE_X86 1
#define AVX __attribute__((target("avx2,fma,f16c")))

AVX static inline __m256 silu_avx(__m256 x) {
    __m256 e = cpu_exp_poly_avx(_mm256_xor_ps(x, _mm256_set1_ps(-0.0f))); /* -x */
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

AVX static int silu_mul_avx(const float *g, const float *u, int n, float *out) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(silu_avx(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
    return i;
}

AVX static int silu_rows_avx(float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, silu_avx(_mm256_loadu_ps(x + i)));
    return i;
}
#else
#define HAVE_X86 0
#endif

void cpu_silu_mul(const float *g, const float *u, int n, float *out) {
    int i = 0;
#if HAVE_X86
    if (cpu_simd()) i = silu_mul_avx(g, u, n, out);
#endif
    for (; i < n; i++) out[i] = cpu_silu(g[i]) * u[i];
}

void cpu_silu_inplace(float *x, int n) {
    int i = 0;
#if HAVE_X86
    if (cpu_simd()) i = silu_rows_avx(x, n);
#endif
    for (; i < n; i++) x[i] = cpu_silu(x[i]);
}

void cpu_softmax(float *x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    for (int i = 0; i < n; i++) x[i] /= sum;
}
