/* test_wgmma.cu - the wgmma layouts of wgmma.cuh against CPU products, the
 * tiles written through the same helpers the flash attention uses:
 *   s8:  D (64 x 64) = A (64 x 256) B^T, both K-major in two 128-byte column
 *        blocks, eight k-steps of 32, exact in int32;
 *   f16: D (64 x HD) = A (64 x 64, mma.sync A fragments from registers) B,
 *        B (64 x HD) MN-major, 64-column blocks of 64 rows, four k-steps
 *        of 16 each, fp32 accumulation (bound 1e-5 relative).
 * Exit status non-zero on any mismatch.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/wgmma.cuh"

using namespace splash_cuda;

namespace {

constexpr int K8 = 256; /* the s8 product's K: a 27B attention head's dims */
constexpr int HD = 256; /* the f16 product's N */

/* One warpgroup: A and B copied into their swizzled tiles, D = A B^T out. */
__global__ void s8_kernel(const int8_t *A, const int8_t *B, int *D) {
    __shared__ __align__(1024) uint8_t sa[64 * K8], sb[64 * K8];
    const int t = threadIdx.x;
    /* tile: column block kb (128 bytes of K) of all 64 rows, then the next */
    for (int i = t; i < 64 * K8 / 16; i += 128) {
        const int r = i / (K8 / 16), c = i % (K8 / 16), kb = c / 8;
        *reinterpret_cast<uint4 *>(sa + kb * 64 * 128 + wg::sw128(r, c % 8)) =
            *reinterpret_cast<const uint4 *>(A + r * K8 + 16 * c);
        *reinterpret_cast<uint4 *>(sb + kb * 64 * 128 + wg::sw128(r, c % 8)) =
            *reinterpret_cast<const uint4 *>(B + r * K8 + 16 * c);
    }
    wg::fence_proxy_async();
    __syncthreads();
    int d[32];
    for (int i = 0; i < 32; i++) d[i] = 0;
    wg::fence();
    const uint32_t a0 = (uint32_t)__cvta_generic_to_shared(sa), b0 = (uint32_t)__cvta_generic_to_shared(sb);
#pragma unroll
    for (int j = 0; j < K8 / 32; j++) {
        const uint32_t off = (j / 4) * 64 * 128 + (j % 4) * 32;
        wg::mma_s8_64x64x32(d, wg::desc128(a0 + off), wg::desc128(b0 + off), j > 0);
    }
    wg::commit();
    wg::wait<0>();
    wg::fence_regs(d);
    const int w = t / 32, l = t % 32;
    for (int i = 0; i < 32; i++) {
        const int row = 16 * w + l / 4 + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * (l % 4) + i % 2;
        D[row * 64 + col] = d[i];
    }
}

/* B's element (k, n) of a 64 x HD MN-major tile: column block n / 64 of 64 rows x 128 bytes. */
__device__ uint32_t mn_off(int k, int n) { return (n / 64) * 64 * 128 + wg::sw128(k, (n % 64) / 8) + 2 * (n % 8); }

__global__ void f16_kernel(const __half *A, const __half *B, float *D) {
    __shared__ __align__(1024) uint8_t sb[64 * HD * 2];
    const int t = threadIdx.x, w = t / 32, l = t % 32, g = l / 4, q = l % 4;
    for (int i = t; i < 64 * HD; i += 128) {
        const int k = i / HD, n = i % HD;
        *reinterpret_cast<__half *>(sb + mn_off(k, n)) = B[i];
    }
    wg::fence_proxy_async();
    __syncthreads();
    float d[HD / 64][32];
    for (int c = 0; c < HD / 64; c++)
        for (int i = 0; i < 32; i++) d[c][i] = 0.f;
    const uint32_t b0 = (uint32_t)__cvta_generic_to_shared(sb);
    auto pair = [&](int r, int k) {
        __half2 h = __halves2half2(A[r * 64 + k], A[r * 64 + k + 1]);
        return *reinterpret_cast<uint32_t *>(&h);
    };
    uint32_t a[4][4]; /* k-step kk's A fragment, all made before the products (as the kernels do) */
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const int r0 = 16 * w + g, k0 = 16 * kk + 2 * q;
        a[kk][0] = pair(r0, k0), a[kk][1] = pair(r0 + 8, k0), a[kk][2] = pair(r0, k0 + 8), a[kk][3] = pair(r0 + 8, k0 + 8);
    }
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int c = 0; c < HD / 64; c++)
            wg::mma_f16_rs_64x64x16_mn(d[c], a[kk], wg::desc128(b0 + c * 64 * 128 + kk * 16 * 128), kk > 0);
    wg::commit();
    wg::wait<0>();
    for (int c = 0; c < HD / 64; c++) {
        wg::fence_regs(d[c]);
        for (int i = 0; i < 32; i++) {
            const int row = 16 * w + g + 8 * ((i / 2) % 2), col = 64 * c + 8 * (i / 4) + 2 * q + i % 2;
            D[row * HD + col] = d[c][i];
        }
    }
}

uint32_t mix(uint32_t x) {
    x ^= x >> 16, x *= 0x7feb352dU, x ^= x >> 15, x *= 0x846ca68bU, x ^= x >> 16;
    return x;
}

#define CK(x)                                                                                                         \
    do {                                                                                                              \
        cudaError_t e_ = (x);                                                                                         \
        if (e_ != cudaSuccess) {                                                                                      \
            printf("FAIL %s: %s\n", #x, cudaGetErrorString(e_));                                                    \
            exit(1);                                                                                                  \
        }                                                                                                             \
    } while (0)

/* One product on the GPU: A and B up, kernel(dA, dB, dD) on one warpgroup, D down. */
template <typename TA, typename TD, size_t NA, size_t NB, size_t ND>
void run_product(void (*kernel)(const TA *, const TA *, TD *), const TA (&A)[NA], const TA (&B)[NB], TD (&D)[ND]) {
    TA *dA, *dB;
    TD *dD;
    CK(cudaMalloc(&dA, sizeof A));
    CK(cudaMalloc(&dB, sizeof B));
    CK(cudaMalloc(&dD, sizeof D));
    CK(cudaMemcpy(dA, A, sizeof A, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, B, sizeof B, cudaMemcpyHostToDevice));
    kernel<<<1, 128>>>(dA, dB, dD);
    CK(cudaGetLastError());
    CK(cudaMemcpy(D, dD, sizeof D, cudaMemcpyDeviceToHost));
    cudaFree(dA), cudaFree(dB), cudaFree(dD);
}

/* D = A B^T through s8_kernel, exact. */
int test_s8(void) {
    static int8_t A[64 * K8], B[64 * K8];
    static int D[64 * 64];
    for (int i = 0; i < 64 * K8; i++) A[i] = (int8_t)(mix(2 * i) % 255 - 127), B[i] = (int8_t)(mix(2 * i + 1) % 255 - 127);
    run_product(s8_kernel, A, B, D);
    int bad = 0;
    for (int m = 0; m < 64; m++)
        for (int n = 0; n < 64; n++) {
            int s = 0;
            for (int k = 0; k < K8; k++) s += A[m * K8 + k] * B[n * K8 + k];
            if (s != D[m * 64 + n] && bad++ < 5) printf("  s8 D[%d][%d] %d, want %d\n", m, n, D[m * 64 + n], s);
        }
    printf("%s wgmma s8 m64n64k32, K-major sw128 (64 x 64 x %d, exact): %d wrong\n", bad ? "FAIL" : "PASS", K8, bad);
    return bad != 0;
}

int test_f16(void) {
    static __half A[64 * 64], B[64 * HD];
    static float Af[64 * 64], Bf[64 * HD], D[64 * HD];
    for (int i = 0; i < 64 * 64; i++) A[i] = __float2half((float)(mix(3 * i) % 2001) / 1000.f - 1.f), Af[i] = __half2float(A[i]);
    for (int i = 0; i < 64 * HD; i++) B[i] = __float2half((float)(mix(3 * i + 1) % 2001) / 1000.f - 1.f), Bf[i] = __half2float(B[i]);
    run_product(f16_kernel, A, B, D);
    double num = 0, den = 0;
    int shown = 0;
    for (int m = 0; m < 64; m++)
        for (int n = 0; n < HD; n++) {
            double s = 0;
            for (int k = 0; k < 64; k++) s += (double)Af[m * 64 + k] * Bf[k * HD + n];
            const double e = D[m * HD + n] - s;
            num += e * e, den += s * s;
            if (fabs(e) > 1e-3 && shown++ < 5) printf("  f16 D[%d][%d] %g, want %g\n", m, n, D[m * HD + n], s);
        }
    const double rel = sqrt(num / den);
    const int bad = !(rel <= 1e-5);
    printf("%s wgmma f16 m64n64k16, A registers, B MN-major sw128 (64 x %d x 64): rel. L2 %.2e (bound 1e-5)\n",
           bad ? "FAIL" : "PASS", HD, rel);
    return bad;
}

} // namespace

int main(void) {
    const int bad = test_s8() + test_f16();
    printf(bad ? "%d failed\n" : "all passed\n", bad);
    return bad != 0;
}
