/* q4_tile.cuh - the fp16 tensor-core view of one (row tile, group) of a tiled
 * q4 matrix (q4_matmul.h's layout), the prefill GEMM's (q4_gemm.cu): a lane's
 * 16 bytes of codes become the A fragments of mma.sync m16n8k16 (exact q as
 * fp16), and tile_products runs the group's four k-steps against a lane's 8
 * words of x.  The small-M products (q4_matmul.cu) read the same bytes as
 * 8-bit A fragments instead and share the bf16 helpers and row_pow2_scale;
 * row_pow2_scale is the power-of-two scaling of x before it is split (q4_gemm.cu
 * per row into fp16, q4_matmul.cu per 64-column group of a row into 8-bit
 * digits).
 *
 * Device-only C++; every function is inline.
 */
#ifndef SPLASH_CUDA_Q4_TILE_CUH
#define SPLASH_CUDA_Q4_TILE_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace splash_cuda {

/* One 32-bit word of codes (nibbles at bits 4s and 16+4s, s = 0..3) -> four
 * f16x2 registers of exact q: a[s] = (q at bit 4s, q at bit 16+4s). */
__device__ __forceinline__ void dequant_word(uint32_t w, uint32_t (&a)[4]) {
    const uint32_t w8 = w >> 8;
    uint32_t t0, t1, t2, t3;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(t0) : "r"(w), "n"(0x000F000F), "n"(0x64006400));
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(t1) : "r"(w), "n"(0x00F000F0), "n"(0x64006400));
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(t2) : "r"(w8), "n"(0x000F000F), "n"(0x64006400));
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(t3) : "r"(w8), "n"(0x00F000F0), "n"(0x64006400));
    /* 1024 + q  -> q;   1024 + 16q -> (1024 + 16q) / 16 - 64 = q */
    asm("sub.f16x2 %0, %1, %2;" : "=r"(a[0]) : "r"(t0), "r"(0x64006400));
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(a[1]) : "r"(t1), "r"(0x2C002C00), "r"(0xD400D400));
    asm("sub.f16x2 %0, %1, %2;" : "=r"(a[2]) : "r"(t2), "r"(0x64006400));
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(a[3]) : "r"(t3), "r"(0x2C002C00), "r"(0xD400D400));
}

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float bf16_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t u) { return __uint_as_float(u & 0xFFFF0000u); }

/* The A operand of one (row tile, group): lane (g, t) holds in c.x/c.y row
 * g's columns 16t..16t+15 of the group and in c.z/c.w row g+8's, in the nibble
 * order the repack chose: step j (columns 16t+4j..+3) takes a[j>>1][2(j&1)]
 * and [2(j&1)+1] from row g's word and the same from row g+8's. */
struct ATile {
    uint32_t a[4][4]; /* [word x, y, z, w][s] */
};
__device__ __forceinline__ void dequant_tile(ATile &A, uint4 c) {
    dequant_word(c.x, A.a[0]);
    dequant_word(c.y, A.a[1]);
    dequant_word(c.z, A.a[2]);
    dequant_word(c.w, A.a[3]);
}
/* d += A * B over the group's 4 k-steps; b[2j], b[2j+1] = x columns 16t+4j.. */
__device__ __forceinline__ void tile_products(float (&d)[4], const ATile &A, const uint32_t (&b)[8]) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int w = j >> 1, s = 2 * (j & 1);
        mma16816(d, A.a[w][s], A.a[2 + w][s], A.a[w][s + 1], A.a[2 + w][s + 1], b[2 * j], b[2 * j + 1]);
    }
}

/* The power of two 2^k that puts the largest |x| (mx) of what is scaled (a
 * row or a group of one) in [2^(top-1), 2^top) (fp16 hi / lo parts: top 14;
 * q4_matmul.cu's 8-bit digits: 22), and 2^-k; 1 and 1 for all zeros or a
 * non-finite mx.  |k| <= lim: the digits need 126 (mx up to 2^128 must land
 * below 2^22, where any larger value would overflow them). */
__device__ __forceinline__ void row_pow2_scale(float mx, float &scale, float &inv, int top = 14, int lim = 100) {
    scale = 1.f, inv = 1.f;
    if (mx > 0.f && mx < 3.0e38f) {
        int e;
        frexpf(mx, &e); /* mx = f * 2^e, f in [0.5, 1): mx * 2^(top-e) in [2^(top-1), 2^top) */
        const int kk = max(-lim, min(lim, top - e));
        scale = ldexpf(1.f, kk), inv = ldexpf(1.f, -kk);
    }
}

} /* namespace splash_cuda */

#endif
