/* vec.c - elementwise vector helpers with an AVX2 path.  Elementwise means
 * no reduction, so both paths give identical bits (fmaf = vfmadd). */
#include <math.h>

#include "backend/cpu/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

__attribute__((target("avx2,fma"))) static void axpy_avx(float a, const float *x, float *y, int n) {
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

__attribute__((target("avx2,fma"))) static void add_avx(const float *x, float *y, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] += x[i];
}
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

void cpu_axpy(float a, const float *x, float *y, int n) {
#if HAVE_X86
    if (cpu_simd()) {
        axpy_avx(a, x, y, n);
        return;
    }
#endif
    for (int i = 0; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

void cpu_add(const float *x, float *y, int n) {
#if HAVE_X86
    if (cpu_simd()) {
        add_avx(x, y, n);
        return;
    }
#endif
    for (int i = 0; i < n; i++) y[i] += x[i];
}
