/* gdn_conv.c - the causal depthwise convolution of Gated DeltaNet, with its
 * state (the last K-1 pre-conv inputs), followed by SiLU.
 *
 * Weights come transposed, wT [K][C], so every tap is a contiguous vector
 * over channels; the per-channel sum runs over taps oldest first (fmaf), the
 * same in both paths.  Callers split channels across threads.
 */
#include <string.h>
#include <math.h>

#include "backend/cpu/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_X86 1
__attribute__((target("avx2,fma"))) static void tap_avx(float *acc, const float *w, const float *src, int c0,
                                                         int c1, int first) {
    int c = c0;
    if (first) {
        for (; c + 8 <= c1; c += 8) _mm256_storeu_ps(acc + c, _mm256_mul_ps(_mm256_loadu_ps(w + c), _mm256_loadu_ps(src + c)));
        for (; c < c1; c++) acc[c] = w[c] * src[c];
    } else {
        for (; c + 8 <= c1; c += 8)
            _mm256_storeu_ps(acc + c, _mm256_fmadd_ps(_mm256_loadu_ps(w + c), _mm256_loadu_ps(src + c), _mm256_loadu_ps(acc + c)));
        for (; c < c1; c++) acc[c] = fmaf(w[c], src[c], acc[c]);
    }
}
#else
#define HAVE_X86 0
#endif

static void tap(float *acc, const float *w, const float *src, int c0, int c1, int first) {
#if HAVE_X86
    if (cpu_simd()) {
        tap_avx(acc, w, src, c0, c1, first);
        return;
    }
#endif
    if (first)
        for (int c = c0; c < c1; c++) acc[c] = w[c] * src[c];
    else
        for (int c = c0; c < c1; c++) acc[c] = fmaf(w[c], src[c], acc[c]);
}

void cpu_gdn_conv(const float *wT, int C, int K, float *state, int update, const float *x, size_t ldx, int n,
                  float *y, size_t ldy, int c0, int c1) {
    for (int t = 0; t < n; t++) {
        float *acc = y + (size_t)t * ldy;
        for (int k = 0; k < K; k++) {
            int j = t - (K - 1) + k; /* input index: < 0 lives in the state */
            const float *src = j < 0 ? state + (size_t)(K - 1 + j) * C : x + (size_t)j * ldx;
            tap(acc, wT + (size_t)k * C, src, c0, c1, k == 0);
        }
        cpu_silu_inplace(acc + c0, c1 - c0);
    }
    if (update) cpu_gdn_conv_advance(state, C, K, x, ldx, n, c0, c1);
}

void cpu_gdn_conv_advance(float *state, int C, int K, const float *x, size_t ldx, int n, int c0, int c1) {
    int keep = K - 1;
    size_t bytes = (size_t)(c1 - c0) * sizeof(float);
    if (n >= keep) {
        for (int s = 0; s < keep; s++) memcpy(state + (size_t)s * C + c0, x + (size_t)(n - keep + s) * ldx + c0, bytes);
        return;
    }
    for (int s = 0; s + n < keep; s++) memmove(state + (size_t)s * C + c0, state + (size_t)(s + n) * C + c0, bytes);
    for (int s = 0; s < n; s++) memcpy(state + (size_t)(keep - n + s) * C + c0, x + (size_t)s * ldx + c0, bytes);
}
