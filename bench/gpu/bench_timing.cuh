/* bench_timing.cuh - what the GPU benches here share: a hash for their
 * random inputs and the median of a call timed with events (header only:
 * each bench is one nvcc command, bench_*.sh). */
#ifndef SPLASH_BENCH_GPU_TIMING_CUH
#define SPLASH_BENCH_GPU_TIMING_CUH

#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace bench {

inline uint32_t mix(uint32_t x) {
    x ^= x >> 16, x *= 0x7feb352dU, x ^= x >> 15, x *= 0x846ca68bU, x ^= x >> 16;
    return x;
}

/* The median of reps timings (us, events around the call) after one
 * warm-up; call() returns 0 or an error code, which ends the program
 * (what names it). */
template <class F>
double median_us(F call, int reps, const char *what) {
    cudaEvent_t e0, e1;
    SPLASH_CUDA_CHECK(cudaEventCreate(&e0));
    SPLASH_CUDA_CHECK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int i = 0; i < reps + 1; i++) {
        SPLASH_CUDA_CHECK(cudaEventRecord(e0));
        if (call()) {
            fprintf(stderr, "%s failed\n", what);
            exit(1);
        }
        SPLASH_CUDA_CHECK(cudaEventRecord(e1));
        SPLASH_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        SPLASH_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (i) t.push_back(ms * 1000.f);
    }
    std::sort(t.begin(), t.end());
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return t[t.size() / 2];
}

} // namespace bench

#endif
