/* bench_q4_wgmma.cu - a feasibility probe for the q4 product of 8-32 rows of
 * x (verify blocks, four lanes of 8) on Hopper's warpgroup products, timed
 * at the 27B's shapes beside what it would replace (bench_q4_matmul's M = 8
 * and 16 rows; four lanes of 8 are two 16-row launches today).
 *
 * Why (docs/cuda.md, session 43): the mma.sync product at M = 8 / 16 keeps
 * the tensor pipe 13-31% busy and runs at 12-18% occupancy (143-255
 * registers), so it is latency-bound, and its 16-row form costs ~2x the
 * 1-row one.  Here a warpgroup takes 64 weight rows: a thread's 16 bytes of
 * 4-bit codes a (64-row tile, 64-column group) become the A fragments of two
 * k-steps in registers (u8: `& 0x0F0F0F0F`, `>> 4 & 0x0F0F0F0F`), and x's
 * three 8-bit digits of M rows are B (N = 3 M, K-major, 128-byte swizzle) in
 * shared memory, 128 columns a chunk, double-buffered by cp.async.  One
 * wgmma m64nNk32 (u8 x s8 -> s32) a k-step; the digits' sums start from
 * 1.5 x 2^(23 + 8 digit) so one subtraction makes each an exact float, as
 * q4_matmul.cu does.  Per group and (row, x row): ((hi + mid) + lo) times x's
 * 2^-k and the row's scale, plus bias times sum(x): the arithmetic a real
 * product does, in this probe's own layouts (random codes, digits and
 * scales; no package layout, no presets, not bitwise q4_matmul's).
 *
 * Checked against a plain reference kernel (every (row, x row) summed in
 * double from the same bytes): the fragment, swizzle and accumulator
 * layouts.  Timed: CUDA events, the median of 21 launches, the weights
 * rotated over buffers of >= 1 GiB in all (the L2 holds ~50 MB).
 *
 * Usage: bench_q4_wgmma [RT] [KSPLIT...]   RT: 64-row tiles a warpgroup (1 | 2)
 *
 * Measured (H200, session 43; docs/cuda.md): correct (rel. L2 1.3e-7 -
 * 4.2e-7) but no faster than q4_matmul.cu's mma.sync product: 27B gate|up
 * M = 8 / 16 / 32 at best 50.9 / 66.6 / 116.6 us against 38.3 / 59.5 / 2 x
 * 59.5.  A form that issued step s + 1's products before converting step
 * s's sums (two accumulator sets, x in three buffers) was no faster (its
 * one run left chunk 0's x uncopied, so its values were wrong; its times do
 * not depend on them) and was removed.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/wgmma.cuh"

using namespace splash_cuda;

namespace {

/* D (64 x 24 NT, s32) += A (64 x 32 u8, registers: mma.sync m16n8k32's A
 * fragment of the lane's warp) B^T (24 NT x 32 s8, K-major, sw128) */
#define D4(i) "+r"(d[i]), "+r"(d[i + 1]), "+r"(d[i + 2]), "+r"(d[i + 3])
__device__ __forceinline__ void mma_rs(int (&d)[12], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
                 "wgmma.mma_async.sync.aligned.m64n24k32.s32.u8.s8 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11}, {%12, %13, %14, %15}, %16, p;\n}\n"
                 : D4(0), D4(4), D4(8)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
__device__ __forceinline__ void mma_rs(int (&d)[24], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
                 "wgmma.mma_async.sync.aligned.m64n48k32.s32.u8.s8 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
                 "%20, %21, %22, %23}, {%24, %25, %26, %27}, %28, p;\n}\n"
                 : D4(0), D4(4), D4(8), D4(12), D4(16), D4(20)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
__device__ __forceinline__ void mma_rs(int (&d)[48], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
                 "wgmma.mma_async.sync.aligned.m64n96k32.s32.u8.s8 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
                 "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, "
                 "%39, %40, %41, %42, %43, %44, %45, %46, %47}, {%48, %49, %50, %51}, %52, p;\n}\n"
                 : D4(0), D4(4), D4(8), D4(12), D4(16), D4(20), D4(24), D4(28), D4(32), D4(36), D4(40), D4(44)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
#undef D4

struct Args {
    const uint4 *codes;  /* [tile][group][warp 4][lane 32]: a thread's 16 bytes of a (tile, group) */
    const __half2 *sb;   /* [row][group]: (scale, bias), 4 bytes as a package's group (0.5625 B a weight in all) */
    const int8_t *x8;    /* [digit 3][M][cols]: hi, mid, lo */
    const float *xw;     /* [M][group]: x's 2^-k */
    const float *xs;     /* [M][group]: sum(x) */
    float *part;         /* [ksplit][rows][M] */
    int rows, cols, M;
};

constexpr int kChunk = 128; /* x columns a chunk: one 128-byte row of B a digit row */

/* Bytes of a chunk buffer (two of them): N rows x 128 bytes, then M x 2
 * groups x (2^-k, sum), rounded up to the swizzle's 1,024-byte atoms. */
__host__ __device__ constexpr int buf_bytes(int NT) { return (24 * NT * kChunk + 8 * NT * 2 * 2 * 4 + 1023) / 1024 * 1024; }

/* One warpgroup: RT tiles of 64 rows (blockIdx.x RT ..) over columns
 * [blockIdx.y cols / ksplit, ..), x chunk by chunk. */
template <int NT, int RT>
__global__ void __launch_bounds__(128) q4w_kernel(const Args p) {
    constexpr int N = 24 * NT, M = 8 * NT, ND = 12 * NT, BUF = buf_bytes(NT);
    extern __shared__ __align__(1024) uint8_t smem[];
    const int tid = threadIdx.x, w = tid / 32, l = tid % 32, g = l / 4, t = l % 4;
    const int groups = p.cols / 64, kcols = p.cols / gridDim.y, c0 = blockIdx.y * kcols;
    const int nchunks = kcols / kChunk, tile0 = blockIdx.x * RT;
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem);

    /* chunk c's x digits and factors into buffer c & 1 (cp.async, one group) */
    auto load_chunk = [&](int c) {
        uint8_t *b = smem + (c & 1) * BUF;
        const int col = c0 + c * kChunk;
        for (int i = tid; i < N * 8; i += 128) {
            const int n = i / 8, ch = i % 8, digit = n / M, m = n % M;
            const int8_t *src = p.x8 + ((size_t)digit * M + m) * p.cols + col + 16 * ch;
            const uint32_t dst = sbase + (c & 1) * BUF + wg::sw128(n, ch);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
        }
        float *f = reinterpret_cast<float *>(b + N * kChunk);
        if (tid < 2 * M) {
            const int m = tid % M, which = tid / M, gcol = col / 64;
            const float *src = (which ? p.xs : p.xw) + (size_t)m * groups + gcol;
            const uint32_t dst = (uint32_t)__cvta_generic_to_shared(f + (which * M + m) * 2);
            asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src) : "memory");
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };

    /* the weights a chunk ahead: ring[parity][group of chunk][tile] */
    uint4 ring[2][2][RT];
    __half2 sc[2][2][RT][2];
    auto load_w = [&](int c, int gg, int r, uint4 &cw, __half2 (&s)[2]) {
        const int grp = (c0 + c * kChunk) / 64 + gg, tile = tile0 + r;
        cw = p.codes[((size_t)tile * groups + grp) * 128 + w * 32 + l];
        const int row = tile * 64 + 16 * w + g;
        s[0] = p.sb[(size_t)row * groups + grp];
        s[1] = p.sb[(size_t)(row + 8) * groups + grp];
    };
#pragma unroll
    for (int pc = 0; pc < 2; pc++)
#pragma unroll
        for (int gg = 0; gg < 2; gg++)
#pragma unroll
            for (int r = 0; r < RT; r++)
                if (pc < nchunks) load_w(pc, gg, r, ring[pc][gg][r], sc[pc][gg][r]);

    float acc[RT][NT][2][2];
#pragma unroll
    for (int r = 0; r < RT; r++)
#pragma unroll
        for (int n = 0; n < NT; n++) acc[r][n][0][0] = acc[r][n][0][1] = acc[r][n][1][0] = acc[r][n][1][1] = 0.f;

    /* the digits' start values: 1.5 x 2^(23 + 8 digit); d's n-tile q holds digit 2 - q / NT (hi first) */
    const float kMag[3] = {1.5f * 549755813888.f /* 2^39 */, 1.5f * 2147483648.f /* 2^31 */, 1.5f * 8388608.f};
    load_chunk(0);
    for (int c0i = 0; c0i < nchunks; c0i += 2) {
#pragma unroll
        for (int par = 0; par < 2; par++) {
            const int c = c0i + par;
            asm volatile("cp.async.wait_group 0;" ::: "memory");
            wg::fence_proxy_async();
            __syncthreads();
            if (c + 1 < nchunks) load_chunk(c + 1);
            const uint32_t bx = sbase + par * BUF;
            const float *f = reinterpret_cast<const float *>(smem + par * BUF + N * kChunk);
#pragma unroll
            for (int gg = 0; gg < 2; gg++)
#pragma unroll
                for (int r = 0; r < RT; r++) {
                    const uint4 cw = ring[par][gg][r];
                    const float2 s0 = __half22float2(sc[par][gg][r][0]), s1 = __half22float2(sc[par][gg][r][1]);
                    if (c + 2 < nchunks) load_w(c + 2, gg, r, ring[par][gg][r], sc[par][gg][r]);
                    const uint32_t a0[4] = {cw.x & 0x0F0F0F0Fu, cw.y & 0x0F0F0F0Fu, cw.z & 0x0F0F0F0Fu,
                                            cw.w & 0x0F0F0F0Fu};
                    const uint32_t a1[4] = {cw.x >> 4 & 0x0F0F0F0Fu, cw.y >> 4 & 0x0F0F0F0Fu,
                                            cw.z >> 4 & 0x0F0F0F0Fu, cw.w >> 4 & 0x0F0F0F0Fu};
                    int d[ND];
#pragma unroll
                    for (int i = 0; i < ND; i++) d[i] = __float_as_int(kMag[(i / 4) / NT]);
                    wg::fence();
                    mma_rs(d, a0, wg::desc128(bx + 64 * gg));
                    mma_rs(d, a1, wg::desc128(bx + 64 * gg + 32));
                    wg::commit();
                    wg::wait<0>();
                    wg::fence_regs(d);
#pragma unroll
                    for (int n = 0; n < NT; n++)
#pragma unroll
                        for (int hr = 0; hr < 2; hr++)
#pragma unroll
                            for (int e = 0; e < 2; e++) {
                                const int i = 4 * n + 2 * hr + e;
                                const float hi = __int_as_float(d[i]) - kMag[0];
                                const float mid = __int_as_float(d[i + 4 * NT]) - kMag[1];
                                const float lo = __int_as_float(d[i + 8 * NT]) - kMag[2];
                                const float S = (hi + mid) + lo;
                                const int m = 8 * n + 2 * t + e;
                                const float2 s = hr ? s1 : s0;
                                const float xw = f[m * 2 + gg], xs = f[(M + m) * 2 + gg];
                                acc[r][n][hr][e] = fmaf(S * xw, s.x, acc[r][n][hr][e]);
                                acc[r][n][hr][e] = fmaf(s.y, xs, acc[r][n][hr][e]);
                            }
                }
        }
    }
    float *out = p.part + (size_t)blockIdx.y * p.rows * M;
#pragma unroll
    for (int r = 0; r < RT; r++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int row = (tile0 + r) * 64 + 16 * w + g + 8 * hr, m = 8 * n + 2 * t;
                *reinterpret_cast<float2 *>(out + (size_t)row * M + m) = make_float2(acc[r][n][hr][0], acc[r][n][hr][1]);
            }
}

/* y = the sum of the ksplit partials */
__global__ void reduce_kernel(const float *part, float *y, int n, int ks) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s = part[i];
    for (int k = 1; k < ks; k++) s += part[(size_t)k * n + i];
    y[i] = s;
}

/* The code of weight (row, col) in the tiled layout (the fragment's byte b
 * of word j, nibble s: row 16 w + g + 8 (j % 2), k 32 s + 16 (j / 2) + 4 t + b). */
__device__ int code_at(const uint4 *codes, int groups, int row, int col) {
    const int tile = row / 64, rr = row % 64, w = rr / 16, g = rr % 8, h = (rr % 16) / 8;
    const int grp = col / 64, kk = col % 64, s = kk / 32, k = kk % 32, j = (k / 16) * 2 + h, t = (k % 16) / 4,
              b = k % 4;
    const uint4 v = codes[((size_t)tile * groups + grp) * 128 + w * 32 + 4 * g + t];
    const uint32_t word = j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
    return (int)(word >> (8 * b + 4 * s) & 15u);
}

__global__ void reference_kernel(const Args p, double *y) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, groups = p.cols / 64;
    if (i >= p.rows * p.M) return;
    const int row = i / p.M, m = i % p.M;
    double acc = 0;
    for (int grp = 0; grp < groups; grp++) {
        long long S = 0;
        for (int kk = 0; kk < 64; kk++) {
            const int col = grp * 64 + kk, q = code_at(p.codes, groups, row, col);
            const long long x = 65536LL * p.x8[(size_t)m * p.cols + col] +
                                256LL * p.x8[((size_t)p.M + m) * p.cols + col] + p.x8[((size_t)2 * p.M + m) * p.cols + col];
            S += q * x;
        }
        const float2 s = __half22float2(p.sb[(size_t)row * groups + grp]);
        acc += (double)s.x * (double)S * p.xw[(size_t)m * groups + grp] + (double)s.y * p.xs[(size_t)m * groups + grp];
    }
    y[i] = acc;
}

__global__ void fill_kernel(uint32_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
        p[i] = h;
    }
}

struct Shape {
    const char *name;
    int rows, cols;
};

template <int NT, int RT>
double run_shape(const Shape &sh, int ks, bool check) {
    const int M = 8 * NT, rows = (sh.rows + 64 * RT - 1) / (64 * RT) * (64 * RT), cols = sh.cols, groups = cols / 64;
    if (cols % (2 * kChunk * ks)) return -1; /* chunks in pairs a split */
    const size_t wbytes = (size_t)rows * cols / 2 + (size_t)rows * groups * 4, nbuf = std::max<size_t>(1, (1ull << 30) / wbytes);
    std::vector<uint4 *> codes(nbuf);
    for (auto &c : codes) {
        SPLASH_CUDA_CHECK(cudaMalloc(&c, wbytes));
        fill_kernel<<<1024, 256>>>(reinterpret_cast<uint32_t *>(c), wbytes / 4, (uint32_t)(size_t)c);
    }
    const size_t cbytes = (size_t)rows * cols / 2; /* a buffer: the codes, then the scales */
    auto sb_of = [&](uint4 *c) { return reinterpret_cast<__half2 *>(reinterpret_cast<uint8_t *>(c) + cbytes); };
    int8_t *x8;
    float *xw, *xs, *part, *y;
    double *ref;
    SPLASH_CUDA_CHECK(cudaMalloc(&x8, (size_t)3 * M * cols));
    SPLASH_CUDA_CHECK(cudaMalloc(&xw, (size_t)M * groups * 4));
    SPLASH_CUDA_CHECK(cudaMalloc(&xs, (size_t)M * groups * 4));
    SPLASH_CUDA_CHECK(cudaMalloc(&part, (size_t)ks * rows * M * 4));
    SPLASH_CUDA_CHECK(cudaMalloc(&y, (size_t)rows * M * 4));
    SPLASH_CUDA_CHECK(cudaMalloc(&ref, (size_t)rows * M * 8));
    fill_kernel<<<256, 256>>>(reinterpret_cast<uint32_t *>(x8), (size_t)3 * M * cols / 4, 7u);
    { /* scales, 2^-k and sums: small floats of either sign */
        std::vector<__half> h((size_t)rows * groups * 2);
        uint32_t st = 12345;
        auto rnd = [&] { st = st * 1664525u + 1013904223u; return ((float)(st >> 8) / 16777216.f - 0.5f); };
        for (auto &v : h) v = __float2half(rnd() * 1e-3f);
        for (auto c : codes) SPLASH_CUDA_CHECK(cudaMemcpy(sb_of(c), h.data(), h.size() * 2, cudaMemcpyHostToDevice));
        std::vector<float> a((size_t)M * groups), b((size_t)M * groups);
        for (auto &v : a) v = std::ldexp(1.f, -20 - (int)(rnd() * 4 + 2));
        for (auto &v : b) v = rnd() * 8.f;
        SPLASH_CUDA_CHECK(cudaMemcpy(xw, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
        SPLASH_CUDA_CHECK(cudaMemcpy(xs, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
    }
    Args a{codes[0], sb_of(codes[0]), x8, xw, xs, part, rows, cols, M};
    const int smem = 2 * buf_bytes(NT);
    auto kern = q4w_kernel<NT, RT>;
    SPLASH_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const dim3 grid((unsigned)(rows / 64 / RT), (unsigned)ks);
    auto launch = [&](int i) {
        a.codes = codes[i % nbuf], a.sb = sb_of(codes[i % nbuf]);
        kern<<<grid, 128, smem>>>(a);
        reduce_kernel<<<(rows * M + 255) / 256, 256>>>(part, y, rows * M, ks);
    };
    double err = 0;
    if (check) {
        launch(0);
        reference_kernel<<<(rows * M + 127) / 128, 128>>>(a, ref);
        SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<float> hy((size_t)rows * M);
        std::vector<double> hr((size_t)rows * M);
        SPLASH_CUDA_CHECK(cudaMemcpy(hy.data(), y, hy.size() * 4, cudaMemcpyDeviceToHost));
        SPLASH_CUDA_CHECK(cudaMemcpy(hr.data(), ref, hr.size() * 8, cudaMemcpyDeviceToHost));
        double num = 0, den = 0;
        for (size_t i = 0; i < hy.size(); i++) num += (hy[i] - hr[i]) * (hy[i] - hr[i]), den += hr[i] * hr[i];
        err = std::sqrt(num / (den > 0 ? den : 1));
    }
    for (int i = 0; i < 3; i++) launch(i);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    std::vector<float> us;
    for (int i = 0; i < 21; i++) {
        cudaEventRecord(e0);
        launch(i + 1);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        us.push_back(ms * 1000.f);
    }
    SPLASH_CUDA_CHECK(cudaGetLastError());
    std::sort(us.begin(), us.end());
    const double med = us[us.size() / 2];
    printf("| %s | %d x %d | %d | %d | %d | %.1f | %.0f | %s%.1e |\n", sh.name, rows, cols, M, RT, ks, med,
           wbytes / med * 1e-3, check ? "" : "(not checked) ", err);
    for (auto c : codes) cudaFree(c);
    cudaFree(x8), cudaFree(xw), cudaFree(xs), cudaFree(part), cudaFree(y), cudaFree(ref);
    return med;
}

} // namespace

int main(int argc, char **argv) {
    const int RT = argc > 1 ? atoi(argv[1]) : 1;
    std::vector<int> kss;
    for (int i = 2; i < argc; i++) kss.push_back(atoi(argv[i]));
    if (kss.empty()) kss = {1, 4};
    const Shape shapes[] = {{"ffn gate|up", 34816, 5120}, {"gdn qkv|z|b|a", 16480, 5120}, {"ffn.down", 5120, 17408},
                            {"gdn.out_proj", 5120, 6144}, {"lm_head", 248320, 5120}};
    printf("| shape | rows x cols | M | RT | ksplit | us | GB/s (weights) | rel. L2 vs reference |\n"
           "|---|---|---|---|---|---|---|---|\n");
    for (const Shape &sh : shapes)
        for (int ks : kss) {
            const bool check = sh.rows * (double)sh.cols < 2e8; /* the reference is slow on lm_head */
            if (RT == 2) {
                run_shape<1, 2>(sh, ks, check), run_shape<2, 2>(sh, ks, check), run_shape<4, 2>(sh, ks, check);
            } else {
                run_shape<1, 1>(sh, ks, check), run_shape<2, 1>(sh, ks, check), run_shape<4, 1>(sh, ks, check);
            }
        }
    return 0;
}
