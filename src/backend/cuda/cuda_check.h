/* cuda_check.h - checking every CUDA runtime call, with file and line.
 *
 * Two forms, because library code and programs fail differently:
 *
 *   SPLASH_CUDA_TRY(call)    library code: on failure prints
 *                            "file:line: call: <cuda error>" on stderr and
 *                            returns SPLASH_E_IO from the enclosing function
 *                            (which must return int).  The device is treated
 *                            as I/O: a failed launch or copy is not bad input.
 *   SPLASH_CUDA_CHECK(call)  tests, benchmarks and start-up code: the same
 *                            message, then exit(1).
 *
 * SPLASH_CUDA_LAUNCHED() checks the last launch (cudaGetLastError) the same way
 * as SPLASH_CUDA_TRY.  Only the runtime API is used, so the header works from
 * C++ (.cu) and from C compiled against the CUDA headers.
 */
#ifndef SPLASH_CUDA_CHECK_H
#define SPLASH_CUDA_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" { /* status.h has no guards of its own; splash_fail etc. are C functions */
#endif
#include "base/status.h"
#ifdef __cplusplus
}
#endif

#define SPLASH_CUDA_REPORT_(expr, e)                                                                     \
    fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, expr, cudaGetErrorString(e),           \
            cudaGetErrorName(e))

#define SPLASH_CUDA_TRY(call)                                                                            \
    do {                                                                                                 \
        cudaError_t splash_cuda_e_ = (call);                                                             \
        if (splash_cuda_e_ != cudaSuccess) {                                                             \
            SPLASH_CUDA_REPORT_(#call, splash_cuda_e_);                                                  \
            return SPLASH_E_IO;                                                                          \
        }                                                                                                \
    } while (0)

#define SPLASH_CUDA_LAUNCHED() SPLASH_CUDA_TRY(cudaGetLastError())

#define SPLASH_CUDA_CHECK(call)                                                                          \
    do {                                                                                                 \
        cudaError_t splash_cuda_e_ = (call);                                                             \
        if (splash_cuda_e_ != cudaSuccess) {                                                             \
            SPLASH_CUDA_REPORT_(#call, splash_cuda_e_);                                                  \
            exit(1);                                                                                     \
        }                                                                                                \
    } while (0)

#endif
