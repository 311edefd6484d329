/* act.c - scalar activations and the fp32 softmax, written as torch computes
 * them (sigmoid 1/(1+e^-x), silu x/(1+e^-x), softplus with threshold 20). */
#include <math.h>

#include "backend/cpu/cpu.h"

float cpu_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

float cpu_silu(float x) { return x / (1.0f + expf(-x)); }

float cpu_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

void cpu_silu_mul(const float *g, const float *u, int n, float *out) {
    for (int i = 0; i < n; i++) out[i] = cpu_silu(g[i]) * u[i];
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
