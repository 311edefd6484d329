/* norm.c - the three normalisations of Qwen3.5, in fp32 and in the order of
 * operations transformers uses:
 *   RMSNorm (input, post, q_norm, k_norm, final): (x * rsqrt(mean x^2 + eps)) * f,
 *     f being the stored factor (1 + w for the zero-centred norms);
 *   gated RMSNorm (GDN output): (w * (x * rsqrt(mean x^2 + eps))) * silu(z);
 *   L2 norm (GDN q and k): x * rsqrt(sum x^2 + eps).
 * The sums of squares use cpu_dot's fixed order.
 */
#include <math.h>

#include "backend/cpu/cpu.h"

void cpu_rmsnorm(const float *x, const float *f, int n, float eps, float *y) {
    float ms = cpu_dot(x, x, n) / (float)n;
    float r = 1.0f / sqrtf(ms + eps);
    for (int i = 0; i < n; i++) y[i] = (x[i] * r) * f[i];
}

void cpu_rmsnorm_gated(const float *x, const float *w, const float *z, int n, float eps, float *y) {
    float ms = cpu_dot(x, x, n) / (float)n;
    float r = 1.0f / sqrtf(ms + eps);
    for (int i = 0; i < n; i++) y[i] = w[i] * (x[i] * r);
    cpu_silu_mul(z, y, n, y); /* silu(z) * (w * (x * r)): the same product */
}

void cpu_l2norm(float *x, int n, float eps) {
    float r = 1.0f / sqrtf(cpu_dot(x, x, n) + eps);
    for (int i = 0; i < n; i++) x[i] *= r;
}
