/* wgmma.cuh - Hopper's warpgroup matrix products (wgmma.mma_async, sm_90a)
 * as the kernels use them: the 128-byte-swizzled shared-memory tiles they
 * read, the tiles' descriptors, and the two product shapes of the flash
 * attention (attention_int8_flash.cu).
 *
 * Why wgmma.  mma.sync feeds the tensor cores a warp's registers, so every
 * operand passes through ldmatrix and the register file, and a kernel at
 * 243 registers issues on ~a third of its cycles (docs/cuda.md, session 39).
 * wgmma reads its B operand (and A, in the SS form) from shared memory
 * itself, asynchronously, for a warpgroup of 4 warps (64 rows of M) at once.
 *
 * The layout (PTX ISA, "Shared memory matrix layout"; CUTLASS's canonical
 * GMMA layouts): rows of 128 bytes, 8 rows a 1,024-byte atom, the 16-byte
 * chunk c of row r stored at chunk c ^ (r mod 8) of its row (sw128), the
 * tile 1,024-byte aligned.  A descriptor holds the start address, the
 * stride between 8-row groups (sbo: 1,024 here) and, for operands wider
 * than one row, the stride between 128-byte column blocks (lbo; unused by
 * the shapes below).
 *   K-major (a row is one M or N index, 128 bytes of K): a k-step's 32 bytes
 *     (k16 of f16, k32 of s8) start at row byte 32 j: the hardware swizzles
 *     the address it forms, so the start moves by 32 bytes a step.
 *   MN-major (a row is one K index, 64 16-bit elements of N): the B of the
 *     f16 product below (imm-trans-b 1); a k-step of 16 rows starts 2,048
 *     bytes further.
 * tests/gpu/test_wgmma.cu checks both layouts against a CPU product.
 *
 * Accumulators live in registers the asm names; the compiler does not know
 * a wgmma is still writing them, so every read after wait() first passes
 * them through fence_regs (an empty volatile asm that "changes" them).
 */
#ifndef SPLASH_CUDA_WGMMA_CUH
#define SPLASH_CUDA_WGMMA_CUH

#include <stdint.h>

namespace splash_cuda {
namespace wg {

/* Byte offset of 16-byte chunk c (0..7) of row r in a 128-byte-swizzled tile. */
__device__ __forceinline__ uint32_t sw128(int r, int c) { return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)); }

/* The descriptor of a 128-byte-swizzled operand starting at shared address addr. */
__device__ __forceinline__ uint64_t desc128(uint32_t addr, uint32_t lbo = 16) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((lbo & 0x3FFFF) >> 4) << 16 | (uint64_t)(1024 >> 4) << 32 |
           (uint64_t)1 << 62;
}

/* Before a warpgroup's first wgmma, and after other instructions touched its accumulators or A registers. */
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
/* Until at most N committed groups of this warpgroup are in flight. */
template <int N>
__device__ __forceinline__ void wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/* Generic-proxy writes to shared memory (st.shared, cp.async) made visible to
 * the async proxy wgmma reads through: by each writer, before the barrier. */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void fence_regs(int (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

#define SPLASH_WG_OP(c, x) c(x)
#define SPLASH_WG_8(c, d, i)                                                                                          \
    SPLASH_WG_OP(c, d[i]), SPLASH_WG_OP(c, d[i + 1]), SPLASH_WG_OP(c, d[i + 2]), SPLASH_WG_OP(c, d[i + 3]),             \
        SPLASH_WG_OP(c, d[i + 4]), SPLASH_WG_OP(c, d[i + 5]), SPLASH_WG_OP(c, d[i + 6]), SPLASH_WG_OP(c, d[i + 7])
#define SPLASH_WG_32(c, d) SPLASH_WG_8(c, d, 0), SPLASH_WG_8(c, d, 8), SPLASH_WG_8(c, d, 16), SPLASH_WG_8(c, d, 24)
#define SPLASH_WG_REGS32                                                                                              \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "  \
    "%24, %25, %26, %27, %28, %29, %30, %31}"

/* D (64 x 64, s32) = (acc ? D : 0) + A B^T: A 64 x 32 s8 and B 64 x 32 s8,
 * both K-major from shared memory.  D's element (row 16 w + l / 4 + 8 (i / 2
 * % 2), column 8 (i / 4) + 2 (l % 4) + i % 2) is d[i] of lane l of the
 * warpgroup's warp w: mma.sync's C layout, an n-tile every 4 registers. */
__device__ __forceinline__ void mma_s8_64x64x32(int (&d)[32], uint64_t a, uint64_t b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 " SPLASH_WG_REGS32 ", %32, %33, p;\n}\n"
                 : SPLASH_WG_32("+r", d)
                 : "l"(a), "l"(b), "r"(acc));
}

/* D (64 x 64, f32) = (acc ? D : 0) + A B: A 64 x 16 f16 in registers (mma.sync
 * m16n8k16's A fragment of the lane's warp, rows 16 w ..), B 16 x 64 f16
 * MN-major from shared memory (a row of 128 bytes a K index).  D as above. */
__device__ __forceinline__ void mma_f16_rs_64x64x16_mn(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " SPLASH_WG_REGS32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : SPLASH_WG_32("+f", d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}

#undef SPLASH_WG_REGS32
#undef SPLASH_WG_32
#undef SPLASH_WG_8
#undef SPLASH_WG_OP

} /* namespace wg */
} /* namespace splash_cuda */

#endif
