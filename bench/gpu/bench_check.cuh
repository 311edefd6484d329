/* bench_check.cuh - CK(call): a CUDA runtime call checked in the GPU
 * benchmarks (stream_probe.cu, bench_chain.cu): on failure, print what failed
 * and where, then exit. */
#ifndef SPLASH_BENCH_CHECK_CUH
#define SPLASH_BENCH_CHECK_CUH

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(call)                                                                                           \
    do {                                                                                                   \
        const cudaError_t e_ = (call);                                                                     \
        if (e_ != cudaSuccess) {                                                                           \
            fprintf(stderr, "CUDA error '%s' at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #call); \
            exit(1);                                                                                       \
        }                                                                                                  \
    } while (0)

#endif
