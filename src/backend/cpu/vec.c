/* vec.c - elementwise vector helpers with an AVX2 path.  Elementwise means
 * no reduction across lanes, so both paths give identical bits (fmaf =
 * vfmadd); cpu_axpy_rows chains several axpys into one y kept in registers,
 * each element's chain in the same order as the separate calls. */
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

/* y = fmaf(a[k], X_k, y) for k < n, y held in registers 64, 32 or 8
 * columns at a time (the remaining columns one by one) */
__attribute__((target("avx2,fma"))) static void axpy_rows_avx(const float *a, const float *X, size_t ldx, int n,
                                                               float *y, int w) {
    int c = 0;
    for (; c + 64 <= w; c += 64) {
        __m256 y0 = _mm256_loadu_ps(y + c), y1 = _mm256_loadu_ps(y + c + 8), y2 = _mm256_loadu_ps(y + c + 16),
               y3 = _mm256_loadu_ps(y + c + 24), y4 = _mm256_loadu_ps(y + c + 32), y5 = _mm256_loadu_ps(y + c + 40),
               y6 = _mm256_loadu_ps(y + c + 48), y7 = _mm256_loadu_ps(y + c + 56);
        for (int k = 0; k < n; k++) {
            const float *x = X + (size_t)k * ldx + c;
            __m256 ak = _mm256_broadcast_ss(a + k);
            y0 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(x), y0);
            y1 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(x + 8), y1);
            y2 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(x + 16), y2);
            y3 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(x + 24), y3);
            y4 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(x + 32), y4);
            y5 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(x + 40), y5);
            y6 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(x + 48), y6);
            y7 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(x + 56), y7);
        }
        _mm256_storeu_ps(y + c, y0), _mm256_storeu_ps(y + c + 8, y1);
        _mm256_storeu_ps(y + c + 16, y2), _mm256_storeu_ps(y + c + 24, y3);
        _mm256_storeu_ps(y + c + 32, y4), _mm256_storeu_ps(y + c + 40, y5);
        _mm256_storeu_ps(y + c + 48, y6), _mm256_storeu_ps(y + c + 56, y7);
    }
    for (; c + 32 <= w; c += 32) {
        __m256 y0 = _mm256_loadu_ps(y + c), y1 = _mm256_loadu_ps(y + c + 8), y2 = _mm256_loadu_ps(y + c + 16),
               y3 = _mm256_loadu_ps(y + c + 24);
        for (int k = 0; k < n; k++) {
            const float *x = X + (size_t)k * ldx + c;
            __m256 ak = _mm256_broadcast_ss(a + k);
            y0 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(x), y0);
            y1 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(x + 8), y1);
            y2 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(x + 16), y2);
            y3 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(x + 24), y3);
        }
        _mm256_storeu_ps(y + c, y0), _mm256_storeu_ps(y + c + 8, y1);
        _mm256_storeu_ps(y + c + 16, y2), _mm256_storeu_ps(y + c + 24, y3);
    }
    for (; c + 8 <= w; c += 8) {
        __m256 y0 = _mm256_loadu_ps(y + c);
        for (int k = 0; k < n; k++) y0 = _mm256_fmadd_ps(_mm256_broadcast_ss(a + k), _mm256_loadu_ps(X + (size_t)k * ldx + c), y0);
        _mm256_storeu_ps(y + c, y0);
    }
    for (; c < w; c++) {
        float t = y[c];
        for (int k = 0; k < n; k++) t = fmaf(a[k], X[(size_t)k * ldx + c], t);
        y[c] = t;
    }
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

void cpu_axpy_rows(const float *a, const float *X, size_t ldx, int n, float *y, int w) {
#if HAVE_X86
    if (cpu_simd()) {
        axpy_rows_avx(a, X, ldx, n, y, w);
        return;
    }
#endif
    for (int k = 0; k < n; k++)
        for (int c = 0; c < w; c++) y[c] = fmaf(a[k], X[(size_t)k * ldx + c], y[c]);
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

int cpu_top_k(const float *x, int n, int k, const uint32_t *allow, int32_t *ids, float *vals) {
    int m = 0;
    if (k < 1) return 0;
    for (int t = 0; t < n; t++) {
        if (allow && !(allow[t >> 5] >> (t & 31) & 1u)) continue;
        float v = x[t];
        if (!(v > -INFINITY)) continue; /* -inf or NaN */
        if (m == k && !(v > vals[m - 1])) continue; /* ties keep the lower column already held */
        int i = m < k ? m++ : m - 1;
        while (i > 0 && v > vals[i - 1]) {
            vals[i] = vals[i - 1];
            ids[i] = ids[i - 1];
            i--;
        }
        vals[i] = v;
        ids[i] = t;
    }
    return m;
}
