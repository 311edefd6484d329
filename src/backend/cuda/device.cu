/* device.cu - which CUDA device the process would use, for the runtime's
 * device choice (runtime/model.c, "auto") and the start-up lines.  Device 0
 * only: Splash runs one model on one GPU for now. */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

extern "C" int splash_cuda_device_info(char *name, size_t cap, size_t *free_bytes, size_t *total_bytes) {
    int n = 0;
    if (name && cap) name[0] = 0;
    if (free_bytes) *free_bytes = 0;
    if (total_bytes) *total_bytes = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        cudaGetLastError(); /* a machine without a driver: clear the sticky error, report none */
        return 0;
    }
    cudaDeviceProp p;
    if (name && cap && cudaGetDeviceProperties(&p, 0) == cudaSuccess) snprintf(name, cap, "%s", p.name);
    size_t f = 0, t = 0;
    if ((free_bytes || total_bytes) && cudaSetDevice(0) == cudaSuccess && cudaMemGetInfo(&f, &t) == cudaSuccess) {
        if (free_bytes) *free_bytes = f;
        if (total_bytes) *total_bytes = t;
    }
    return n;
}
