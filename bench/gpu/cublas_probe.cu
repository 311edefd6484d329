/* cublas_probe.cu - would cuBLASLt's fp16 GEMM beat q4_gemm.cu for prefill?
 *
 * For the 27B's stacked prefill shapes (out rows N x cols K) and R rows of x:
 * y[R][N] fp32 = x[R][K] fp16 . W[N][K]^T fp16, fp32 accumulation, timed
 * with CUDA events (median of 20 after 3 warm-ups) for every algorithm the
 * heuristic offers (up to 8); prints the heuristic's first and the best, as
 * TFLOP/s.  Also the cost of making W: a kernel that reads 0.5625 B and
 * writes 2 B per weight (the q4 -> fp16 expansion's traffic), so the two can
 * be added up.  Weights rotate over >= 1 GiB as in bench_q4_matmul.
 *
 *   nvcc -std=c++17 -O3 -arch=sm_90a -Isrc bench/gpu/cublas_probe.cu -lcublasLt -o /tmp/cublas_probe
 */
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));           \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)
#define CB(x)                                                                                    \
    do {                                                                                         \
        cublasStatus_t s_ = (x);                                                                 \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                       \
            fprintf(stderr, "%s:%d cublas %d\n", __FILE__, __LINE__, (int)s_);                   \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

__global__ void fill_h(__half *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)(i * 2654435761u) ^ seed;
        h ^= h >> 15, h *= 0x2c1b3c6dU, h ^= h >> 12;
        p[i] = __float2half(((h >> 8) / 8388608.f - 1.f) * 0.05f);
    }
}

/* The expansion's traffic: 0.5625 B read, 2 B written per weight. */
__global__ void expand_like(const uint4 *src, size_t n16, uint4 *dst) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = src[i]; /* 16 B of codes -> 32 weights -> 64 B */
        uint4 o = make_uint4(v.x, v.y ^ 1u, v.z, v.w);
        for (int k = 0; k < 4; k++) dst[4 * i + k] = o, o.x += 3u;
    }
}

static int cmpf(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

int main(void) {
    struct { const char *name; int N, K; } shapes[] = {
        {"ffn gate|up", 34816, 5120}, {"gdn qkv|z|b|a", 16480, 5120}, {"attn q|k|v", 14336, 5120},
        {"ffn.down", 5120, 17408},    {"out_proj", 5120, 6144},
    };
    const int Rs[] = {256, 512, 1024, 2048, 4096, 8192};
    cublasLtHandle_t lt;
    CB(cublasLtCreate(&lt));
    size_t ws_bytes = 64u << 20;
    void *ws;
    CK(cudaMalloc(&ws, ws_bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("%-14s %5s %9s %9s %9s %7s  %s\n", "shape", "R", "heur us", "best us", "TFLOP/s", "algos", "expand us (traffic)");
    for (auto &sh : shapes) {
        const size_t wn = (size_t)sh.N * sh.K;
        const int nbuf = (int)((1ull << 30) / (wn * 2) + 1);
        __half *W, *X;
        float *Y;
        CK(cudaMalloc(&W, wn * 2 * nbuf));
        CK(cudaMalloc(&X, (size_t)8192 * sh.K * 2));
        CK(cudaMalloc(&Y, (size_t)8192 * sh.N * 4));
        fill_h<<<1024, 256>>>(W, wn * nbuf, 1);
        fill_h<<<1024, 256>>>(X, (size_t)8192 * sh.K, 2);
        /* expansion-like traffic */
        float et[20];
        {
            const size_t n16 = wn / 32;
            for (int i = 0; i < 23; i++) {
                if (i >= 3) CK(cudaEventRecord(e0));
                expand_like<<<132 * 8, 256>>>((const uint4 *)(W + (size_t)(i % nbuf) * wn), n16,
                                              (uint4 *)(W + (size_t)((i + 1) % nbuf) * wn));
                if (i >= 3) {
                    CK(cudaEventRecord(e1));
                    CK(cudaEventSynchronize(e1));
                    CK(cudaEventElapsedTime(&et[i - 3], e0, e1));
                }
            }
            qsort(et, 20, sizeof(float), cmpf);
        }
        for (int R : Rs) {
            cublasLtMatmulDesc_t op;
            CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
            cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
            CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
            CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
            cublasLtMatrixLayout_t la, lb, ld;
            CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16F, sh.K, sh.N, sh.K)); /* W^T: K x N col-major */
            CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16F, sh.K, R, sh.K));    /* x: K x R col-major */
            CB(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, sh.N, R, sh.N));    /* y: N x R col-major */
            cublasLtMatmulPreference_t pref;
            CB(cublasLtMatmulPreferenceCreate(&pref));
            CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                    sizeof ws_bytes));
            cublasLtMatmulHeuristicResult_t res[8];
            int nres = 0;
            CB(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 8, res, &nres));
            const float alpha = 1.f, beta = 0.f;
            float heur = 0, best = 1e30f;
            for (int a = 0; a < nres; a++) {
                float t[20];
                for (int i = 0; i < 23; i++) {
                    if (i >= 3) CK(cudaEventRecord(e0));
                    CB(cublasLtMatmul(lt, op, &alpha, W + (size_t)(i % nbuf) * wn, la, X, lb, &beta, Y, ld, Y, ld,
                                      &res[a].algo, ws, ws_bytes, 0));
                    if (i >= 3) {
                        CK(cudaEventRecord(e1));
                        CK(cudaEventSynchronize(e1));
                        CK(cudaEventElapsedTime(&t[i - 3], e0, e1));
                    }
                }
                qsort(t, 20, sizeof(float), cmpf);
                const float us = t[10] * 1000.f;
                if (a == 0) heur = us;
                if (us < best) best = us;
            }
            const double fl = 2.0 * sh.N * (double)sh.K * R;
            printf("%-14s %5d %9.1f %9.1f %9.1f %7d  %.1f (%.0f GB/s)\n", sh.name, R, heur, best, fl / best * 1e-6,
                   nres, et[10] * 1000.f, wn * 2.5625 / (et[10] * 1e-3) * 1e-9);
            cublasLtMatmulPreferenceDestroy(pref);
            cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
            cublasLtMatmulDescDestroy(op);
        }
        CK(cudaFree(W));
        CK(cudaFree(X));
        CK(cudaFree(Y));
    }
    return 0;
}
