/* device_util.cuh - small device helpers shared by the CUDA op files
 * (norm.cu, rope.cu, attention.cu, gdn.cu, moe.cu, act.cu, argmax.cu, the
 * q4 products; bench/gpu/stream_probe.cu):
 * warp and block reductions and the scalar activations written the way the
 * CPU backend writes them (act.c), so the two backends compute the same
 * formulas.
 *
 * C++ for .cu files (never included by C): device functions, and the host
 * side of launches (KernelLaunch, launch_kernel; one flag read from the environment
 * once).  Every function is inline.  Block
 * reductions take a caller-provided shared array of 32 floats and end with a
 * __syncthreads(), so the array can be reused right after the call.
 */
#ifndef SPLASH_CUDA_DEVICE_UTIL_CUH
#define SPLASH_CUDA_DEVICE_UTIL_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

namespace splash_cuda {

constexpr unsigned kFull = 0xFFFFFFFFu;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
    return v;
}

/* Sum over the whole block (blockDim.x a multiple of 32); every thread gets
 * the total.  red: __shared__ float[32]. */
__device__ __forceinline__ float block_sum(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = 0.f;
    for (int i = 0; i < nw; i++) t += red[i]; /* fixed order: the same total in every thread */
    __syncthreads();
    return t;
}

/* Largest value over the whole block, as block_sum (every thread gets it). */
__device__ __forceinline__ float block_max(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = red[0];
    for (int i = 1; i < nw; i++) t = fmaxf(t, red[i]);
    __syncthreads();
    return t;
}

/* torch / act.c: sigmoid 1/(1+e^-x), silu x/(1+e^-x), softplus with
 * threshold 20.  IEEE division (nvcc's default -prec-div=true). */
__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* Round to nearest even; NaN stays NaN (tensor.h splash_f32_to_bf16). */
__device__ __forceinline__ uint16_t f32_to_bf16(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Weight streams: read once, kept out of L1 (16 bytes with a 256-byte L2
 * prefetch, or 8 bytes). */
__device__ __forceinline__ uint4 ld_stream16(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 ld_stream8(const void *p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

/* cp.async: 16 bytes global -> shared (a shared-window address), bypassing
 * L1; bytes = 0 writes zeros. */
__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes));
}
/* 4 bytes (for rows that are not 16-byte aligned), through L1 */
__device__ __forceinline__ void cp_async4(uint32_t dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

/* Asks L2 for the line holding p (no register, no wait): data a later
 * phase reads from HBM arrives in L2 while this one computes. */
__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

/* mbarrier and the bulk-copy engine (TMA, sm_90): a ring of shared-memory
 * stages filled by cp.async.bulk, one mbarrier per stage counting the bytes
 * that have landed.  mbar_init by one thread, then mbar_init_fence before
 * any other thread or the copy engine uses the barrier. */
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
/* The phase's one arrival, expecting `bytes` of copies to complete it. */
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
/* Whether the phase of this parity has completed (acquire: the copied bytes
 * are then visible); a waiter spins on it. */
__device__ __forceinline__ bool mbar_try(uint32_t bar, uint32_t parity) {
    uint32_t ok;
    asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                 "selp.u32 %0, 1, 0, p;\n\t}"
                 : "=r"(ok)
                 : "r"(bar), "r"(parity)
                 : "memory");
    return ok != 0;
}
/* Spins until the phase of this parity has completed. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    while (!mbar_try(bar, parity)) {
    }
}
/* global -> this block's shared memory (its own address is a valid
 * shared::cluster address), completion counted on bar; 16-byte aligned, a
 * multiple of 16 bytes. */
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

/* Programmatic dependent launch (sm_90).  Every kernel but the q4 products
 * (q4_matmul.cu says why) is launched with the attribute (KernelLaunch,
 * unless SPLASH_CUDA_PDL=0), so a kernel may be scheduled while its
 * predecessor in the stream still runs: its blocks take the SM slots the
 * predecessor leaves free (its tail) and wait there.  The rules, for every
 * kernel:
 *   - pdl_launch_dependents() first: the successor may be scheduled now (it
 *     only launches once every block of this grid has said so or exited, so
 *     it never takes slots this grid's own blocks wait for);
 *   - pdl_wait() before reading anything an earlier kernel wrote and before
 *     writing anything an earlier kernel reads: it returns when the
 *     predecessor has completed and its memory is visible.  The predecessor
 *     itself waited for its own, so one wait covers every earlier kernel.
 * Most kernels call pdl_begin() (both) on entry.  Both are no-ops in a launch
 * without the attribute.
 * Data any kernel writes is read with plain (coherent) loads, never __ldg or
 * ld.global.nc: the non-coherent path needs data read-only for the reader's
 * whole lifetime, and under programmatic launch that lifetime overlaps the
 * writers'.  Only the weights (ld_stream16/8, dense_matmul's w) and kernels
 * launched without the attribute (the q4 products) take it. */
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_begin() {
    pdl_launch_dependents();
    pdl_wait();
}

/* Whether launches carry the programmatic-dependent-launch attribute:
 * SPLASH_CUDA_PDL=0 turns it off (an A/B switch); read once (an inline
 * function's static is one object in the whole program). */
inline bool pdl_enabled() {
    static const bool on = [] {
        const char *v = getenv("SPLASH_CUDA_PDL");
        return !(v && v[0] == '0');
    }();
    return on;
}

/* Whether the kernel called `name` is launched with the attribute:
 * pdl_enabled() and name not in SPLASH_CUDA_PDL_OFF (a comma-separated list,
 * read once), an A/B switch for one kernel's early launch without a
 * rebuild (docs/cuda.md, "Verify, session 21"). */
inline bool pdl_for(const char *name) {
    static const char *off = getenv("SPLASH_CUDA_PDL_OFF");
    if (!pdl_enabled()) return false;
    if (!off || !*off) return true;
    const size_t n = strlen(name);
    for (const char *p = off; (p = strstr(p, name)) != NULL; p += n)
        if ((p == off || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return false;
    return true;
}

/* An A/B switch of the environment (host side), read once into *state
 * (-1: not yet): `name` set to a number turns it on (nonzero) or off (0),
 * else it is `on`. */
inline int env_switch(int *state, const char *name, int on) {
    if (*state < 0) {
        const char *e = getenv(name);
        *state = e && *e ? atoi(e) != 0 : on;
    }
    return *state;
}

/* A launch configuration (host side) with the programmatic-dependent-launch
 * attribute (above; pdl false: without) and, for cx > 1, clusters of cx
 * blocks along x: construct in place, launch with cudaLaunchKernelEx(&c.lc,
 * kernel, args...).  Not copyable: lc points at attr. */
struct KernelLaunch {
    cudaLaunchConfig_t lc;
    cudaLaunchAttribute attr[2];
    KernelLaunch(dim3 grid, dim3 block, size_t smem, cudaStream_t s, unsigned cx = 1, bool pdl = true) : lc(), attr() {
        lc.gridDim = grid, lc.blockDim = block, lc.dynamicSmemBytes = smem, lc.stream = s;
        lc.attrs = attr;
        lc.numAttrs = 0;
        if (cx > 1) {
            cudaLaunchAttribute &a = attr[lc.numAttrs++];
            a.id = cudaLaunchAttributeClusterDimension;
            a.val.clusterDim.x = cx, a.val.clusterDim.y = 1, a.val.clusterDim.z = 1;
        }
        if (pdl && pdl_enabled()) {
            cudaLaunchAttribute &a = attr[lc.numAttrs++];
            a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
            a.val.programmaticStreamSerializationAllowed = 1;
        }
    }
    KernelLaunch(const KernelLaunch &) = delete;
    KernelLaunch &operator=(const KernelLaunch &) = delete;
};

/* kernel<<<grid, block, smem, s>>>(args...) through KernelLaunch; returns the
 * launch's error. */
template <typename... P, typename... A>
cudaError_t launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A &&...args) {
    KernelLaunch c(grid, block, smem, s);
    return cudaLaunchKernelEx(&c.lc, kernel, static_cast<A &&>(args)...);
}

} /* namespace splash_cuda */

#endif
