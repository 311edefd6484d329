/* bench_chain.cu - what a chain of dependent weight-streaming phases costs per
 * boundary, three ways.  A decode step is such a chain: each q4 product needs
 * all of the previous kernel's output, and the 27B's products run ~5 us over
 * their bytes at 4.3 TB/s, the 35B-A3B's small kernels 1-7 us each whatever
 * their bytes (docs/cuda.md, session 29).  Whether a persistent decode kernel
 * (phases meeting at grid barriers instead of launch boundaries) would pay is
 * the question this answers before anyone writes one.
 *
 * A phase: y = W x, W [rows][2048 B] (a row: 512 words, each word's mantissa
 * bits a factor in [1, 2), times x[col]), streamed once; x = the previous
 * phase's y (512 floats, all of them: a dependency on every block of the
 * phase before).  A warp takes two rows at a time, every lane's eight 16-byte
 * loads issued before any is used (as the q4 products do).  Phases read
 * distinct weights, at least ~300 MB a pass, so no phase finds its weights in
 * the 50 MB L2 from the pass before.
 *
 * Ways (us per phase = a pass's time / phases, median of 5 passes):
 *   launch    a launch a phase (a CUDA graph of them), as the q4 products are
 *             launched: each starts when the one before has completed
 *   pdl       a launch a phase with programmatic dependent launch: a block
 *             issues its first two rows' loads, then griddepcontrol.wait,
 *             then reads x (the decode chain's other kernels' form); with
 *             the occupancy's blocks an SM, or one
 *   persist   one kernel, blocks resident (SMs x occupancy, or one an SM),
 *             the phases separated by a grid barrier (grid_barrier: a
 *             generation word, or a counter that only grows); each block
 *             issues its next phase's first loads before the barrier, since
 *             weights depend on nothing
 *   stream    the same bytes with no dependency at all: one kernel reading
 *             every phase's weights back to back, a warp's next rows loaded
 *             before the ones it holds are used (the ceiling)
 * Every way's outputs are compared with the launch way's (the same sums in
 * the same order): any difference prints MISMATCH.
 *
 * Usage: bench_chain [MB,MB,...]   (default 1,4.7,17.7,50)
 */
#include <cuda_runtime.h>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/cuda_check.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

using namespace splash_cuda;

namespace {

constexpr int kRowBytes = 2048, kCols = 512, kThreads = 256, kWarps = kThreads / 32;
constexpr int kLoads = kRowBytes / 16 / 32; /* 16-byte loads a lane a row: 4 */

struct Phase {
    const uint4 *w; /* [rows][128] */
    int rows;
};

struct Chain {
    const Phase *ph; /* device [n] */
    int n;
    float *y[2];     /* ping-pong outputs, [max rows] each; phase p reads y[(p + 1) & 1], writes y[p & 1] */
    float *x0;       /* phase 0's x [kCols] */
    unsigned *count, *gen; /* the grid barrier */
};

/* Two rows' loads (r0, r0 + stride; past rows: zero) into w[2][kLoads]. */
__device__ __forceinline__ void load_rows(const Phase &p, int r0, int stride, int lane, uint4 (&w)[2][kLoads]) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = r0 + h * stride;
#pragma unroll
        for (int j = 0; j < kLoads; j++)
            w[h][j] = r < p.rows ? ld_stream16(p.w + (size_t)r * (kRowBytes / 16) + j * 32 + lane)
                                 : make_uint4(0, 0, 0, 0);
    }
}

__device__ __forceinline__ float word_factor(uint32_t v) { return __uint_as_float((v & 0x007FFFFFu) | 0x3F800000u); }

/* The two rows' sums with x (shared), written to y. */
__device__ __forceinline__ void finish_rows(const Phase &p, int r0, int stride, int lane, const uint4 (&w)[2][kLoads],
                                            const float *xs, float *y) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < kLoads; j++) {
            const int c = (j * 32 + lane) * 4;
            acc = fmaf(word_factor(w[h][j].x), xs[c], acc);
            acc = fmaf(word_factor(w[h][j].y), xs[c + 1], acc);
            acc = fmaf(word_factor(w[h][j].z), xs[c + 2], acc);
            acc = fmaf(word_factor(w[h][j].w), xs[c + 3], acc);
        }
        acc = warp_sum(acc);
        const int r = r0 + h * stride;
        if (lane == 0 && r < p.rows) y[r] = acc * (1.0f / 768.0f); /* keeps |y| near 1 phase after phase */
    }
}

/* y[i & 1] by selection: an indexed kernel parameter array goes to local memory. */
__device__ __forceinline__ float *ybuf(const Chain &c, int i) { return i & 1 ? c.y[1] : c.y[0]; }

/* x of phase k into shared memory: bypassing L1 (another SM wrote it). */
__device__ __forceinline__ void load_x(const Chain &c, int k, float *xs) {
    const float *x = k ? ybuf(c, k + 1) : c.x0;
    const int prev = k ? c.ph[k - 1].rows : kCols;
    for (int i = threadIdx.x; i < kCols; i += blockDim.x) xs[i] = __ldcg(x + i % prev);
    __syncthreads();
}

/* Phase k's rows from the warp's first pair on, whose loads are in w. */
__device__ __forceinline__ void run_phase(const Chain &c, int k, uint4 (&w)[2][kLoads], const float *xs) {
    const Phase p = c.ph[k];
    const int lane = threadIdx.x & 31, gw = blockIdx.x * kWarps + (threadIdx.x >> 5), nw = gridDim.x * kWarps;
    float *y = ybuf(c, k);
    for (int r0 = gw;; r0 += 2 * nw) {
        finish_rows(p, r0, nw, lane, w, xs, y);
        if (r0 + 2 * nw >= p.rows) break;
        load_rows(p, r0 + 2 * nw, nw, lane, w);
    }
}

/* launch / pdl: one phase. */
template <bool PDL>
__global__ void __launch_bounds__(kThreads) phase_kernel(const Chain c, int k) {
    __shared__ float xs[kCols];
    const int lane = threadIdx.x & 31, gw = blockIdx.x * kWarps + (threadIdx.x >> 5), nw = gridDim.x * kWarps;
    uint4 w[2][kLoads];
    if constexpr (PDL) pdl_launch_dependents();
    load_rows(c.ph[k], gw, nw, lane, w);
    if constexpr (PDL) pdl_wait();
    load_x(c, k, xs);
    run_phase(c, k, w, xs);
}

/* Grid barriers.  GEN: every block arrives on a counter, the last to arrive
 * resets it and opens the next generation; the others poll the generation
 * word (cooperative groups' form).  MONO: a counter that only grows; each
 * block adds one and polls it (acquire) until it reaches the blocks times
 * the phases so far: no reset, one word.  Writes before a barrier are
 * visible to every block after it (the fence, then the release / acquire). */
enum { kGen = 0, kMono = 1 };

template <int BAR>
__device__ __forceinline__ void grid_barrier(unsigned *count, unsigned *gen, unsigned phase) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if constexpr (BAR == kGen) {
            const unsigned g = *(volatile unsigned *)gen;
            if (atomicAdd(count, 1u) == gridDim.x - 1) {
                *count = 0;
                __threadfence();
                atomicExch(gen, g + 1);
            } else {
                while (*(volatile unsigned *)gen == g) {
                }
            }
        } else {
            const unsigned target = gridDim.x * (phase + 1);
            atomicAdd(count, 1u);
            unsigned v;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
            } while (v < target);
        }
        __threadfence();
    }
    __syncthreads();
}

/* persist: every phase, barriers between. */
template <int BAR>
__global__ void __launch_bounds__(kThreads) persist_kernel(const Chain c) {
    __shared__ float xs[kCols];
    const int lane = threadIdx.x & 31, gw = blockIdx.x * kWarps + (threadIdx.x >> 5), nw = gridDim.x * kWarps;
    uint4 w[2][kLoads];
    load_rows(c.ph[0], gw, nw, lane, w);
    for (int k = 0; k < c.n; k++) {
        load_x(c, k, xs);
        run_phase(c, k, w, xs);
        if (k + 1 < c.n) load_rows(c.ph[k + 1], gw, nw, lane, w); /* weights: before the barrier */
        grid_barrier<BAR>(c.count, c.gen, (unsigned)k);
    }
}

/* stream: the same bytes, no dependency, nothing written; a warp's next row
 * pair (of this phase or the next) loaded before the pair it holds is used. */
__global__ void __launch_bounds__(kThreads) stream_kernel(const Chain c, float *sink) {
    const int lane = threadIdx.x & 31, gw = blockIdx.x * kWarps + (threadIdx.x >> 5), nw = gridDim.x * kWarps;
    float keep = 0.f;
    int k = 0, r = gw;
    while (k < c.n && r >= c.ph[k].rows) k++;
    if (k >= c.n) return;
    uint4 a[2][kLoads], b[2][kLoads];
    load_rows(c.ph[k], r, nw, lane, a);
    for (;;) {
        int k2 = k, r2 = r + 2 * nw;
        while (k2 < c.n && r2 >= c.ph[k2].rows) k2++, r2 = gw;
        const bool more = k2 < c.n;
        if (more) load_rows(c.ph[k2], r2, nw, lane, b);
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int j = 0; j < kLoads; j++) keep += word_factor(a[h][j].x ^ a[h][j].y ^ a[h][j].z ^ a[h][j].w);
        if (!more) break;
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int j = 0; j < kLoads; j++) a[h][j] = b[h][j];
        k = k2, r = r2;
    }
    if (keep == -1.f) *sink = keep; /* never: keeps the loads */
}

__global__ void fill_kernel(uint4 *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        p[i] = make_uint4(h, h * 3266489917u, h ^ 0x9E3779B9u, h * 668265263u);
    }
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

} /* namespace */

int main(int argc, char **argv) {
    std::vector<double> sizes = {1, 4.7, 17.7, 50};
    if (argc > 1) {
        sizes.clear();
        for (char *s = strtok(argv[1], ","); s; s = strtok(nullptr, ",")) sizes.push_back(atof(s));
    }
    int dev = 0, sms = 0;
    SPLASH_CUDA_CHECK(cudaGetDevice(&dev));
    SPLASH_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    int occ = 0;
    SPLASH_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, persist_kernel<kGen>, kThreads, 0));
    const int grid = sms * occ;
    const size_t pool_bytes = (size_t)1 << 30;
    uint4 *pool;
    SPLASH_CUDA_CHECK(cudaMalloc(&pool, pool_bytes));
    fill_kernel<<<sms * 8, 256>>>(pool, pool_bytes / 16, 12345u);
    const int max_rows = (int)(pool_bytes / kRowBytes);
    float *y0, *y1, *x0, *sink, *ref;
    unsigned *bar;
    SPLASH_CUDA_CHECK(cudaMalloc(&y0, (size_t)max_rows * 4));
    SPLASH_CUDA_CHECK(cudaMalloc(&y1, (size_t)max_rows * 4));
    SPLASH_CUDA_CHECK(cudaMalloc(&x0, kCols * 4));
    SPLASH_CUDA_CHECK(cudaMalloc(&sink, 4));
    SPLASH_CUDA_CHECK(cudaMalloc(&bar, 8));
    SPLASH_CUDA_CHECK(cudaMalloc(&ref, (size_t)max_rows * 4));
    std::vector<float> hx(kCols);
    for (int i = 0; i < kCols; i++) hx[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    SPLASH_CUDA_CHECK(cudaMemcpy(x0, hx.data(), kCols * 4, cudaMemcpyHostToDevice));
    cudaStream_t st;
    SPLASH_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    SPLASH_CUDA_CHECK(cudaEventCreate(&e0));
    SPLASH_CUDA_CHECK(cudaEventCreate(&e1));
    printf("device SMs %d, %d blocks of %d threads a SM (persist grid %d)\n\n", sms, occ, kThreads, grid);
    printf("us a phase (over the ideal)\n");
    printf("| phase MB | phases | ideal us (4.3 TB/s) | launch | pdl | pdl, 1 block an SM | persist, gen barrier | "
           "persist, monotonic | persist, monotonic, 1 block an SM | stream (no dependency) |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (double mb : sizes) {
        const int rows = std::max(1, (int)(mb * 1e6 / kRowBytes));
        const size_t phase_bytes = (size_t)rows * kRowBytes;
        int n = (int)std::max<size_t>(16, (size_t)300e6 / phase_bytes);
        n = std::min<int>(n, (int)(pool_bytes / phase_bytes));
        std::vector<Phase> hp(n);
        for (int k = 0; k < n; k++) hp[k] = {pool + (size_t)k * phase_bytes / 16, rows};
        Phase *dp;
        SPLASH_CUDA_CHECK(cudaMalloc(&dp, n * sizeof(Phase)));
        SPLASH_CUDA_CHECK(cudaMemcpy(dp, hp.data(), n * sizeof(Phase), cudaMemcpyHostToDevice));
        Chain c = {dp, n, {y0, y1}, x0, bar, bar + 1}; /* bar: zeroed before each persistent run */
        /* graphs of n launches: plain, programmatic, programmatic with one block an SM */
        constexpr int kGraphs = 3;
        cudaGraphExec_t gx[kGraphs];
        for (int gi = 0; gi < kGraphs; gi++) {
            cudaGraph_t g;
            SPLASH_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            for (int k = 0; k < n; k++) {
                KernelLaunch lc(dim3(gi == 2 ? sms : grid), dim3(kThreads), 0, st, 1, gi != 0);
                SPLASH_CUDA_CHECK(gi ? cudaLaunchKernelEx(&lc.lc, phase_kernel<true>, c, k)
                      : cudaLaunchKernelEx(&lc.lc, phase_kernel<false>, c, k));
            }
            SPLASH_CUDA_CHECK(cudaStreamEndCapture(st, &g));
            SPLASH_CUDA_CHECK(cudaGraphInstantiate(&gx[gi], g, 0));
            SPLASH_CUDA_CHECK(cudaGraphDestroy(g));
        }
        /* ways: 0-2 the graphs; 3 persist GEN (occ blocks an SM), 4 persist MONO (occ an SM),
         * 5 persist MONO (one block an SM), 6 stream */
        constexpr int kWays = 7;
        auto run = [&](int way) {
            if (way < kGraphs) {
                SPLASH_CUDA_CHECK(cudaGraphLaunch(gx[way], st));
            } else if (way < 6) {
                void *args[] = {(void *)&c};
                SPLASH_CUDA_CHECK(cudaMemsetAsync(bar, 0, 8, st));
                const void *fn = way == 3 ? (const void *)persist_kernel<kGen> : (const void *)persist_kernel<kMono>;
                const dim3 blocks(way == 5 ? sms : grid);
                SPLASH_CUDA_CHECK(cudaLaunchCooperativeKernel(fn, blocks, dim3(kThreads), args, 0, st));
            } else {
                stream_kernel<<<grid, kThreads, 0, st>>>(c, sink);
                SPLASH_CUDA_CHECK(cudaGetLastError());
            }
        };
        double us[kWays];
        const float *last = c.y[(n - 1) & 1];
        bool same = true;
        for (int way = 0; way < kWays; way++) {
            run(way);
            SPLASH_CUDA_CHECK(cudaStreamSynchronize(st));
            if (way == 0) SPLASH_CUDA_CHECK(cudaMemcpy(ref, last, (size_t)rows * 4, cudaMemcpyDeviceToDevice));
            if (way >= 1 && way <= 5) {
                std::vector<float> a(rows), b(rows);
                SPLASH_CUDA_CHECK(cudaMemcpy(a.data(), ref, (size_t)rows * 4, cudaMemcpyDeviceToHost));
                SPLASH_CUDA_CHECK(cudaMemcpy(b.data(), last, (size_t)rows * 4, cudaMemcpyDeviceToHost));
                if (memcmp(a.data(), b.data(), (size_t)rows * 4)) same = false, printf("way %d differs\n", way);
            }
            std::vector<double> t;
            for (int rep = 0; rep < 5; rep++) {
                SPLASH_CUDA_CHECK(cudaEventRecord(e0, st));
                run(way);
                SPLASH_CUDA_CHECK(cudaEventRecord(e1, st));
                SPLASH_CUDA_CHECK(cudaEventSynchronize(e1));
                float ms = 0;
                SPLASH_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
                t.push_back(ms * 1e3 / n);
            }
            us[way] = median(t);
        }
        const double ideal = phase_bytes / 4.3e6;
        printf("| %.1f | %d | %.2f |", phase_bytes / 1e6, n, ideal);
        for (int way = 0; way < kWays; way++) printf(" %.2f (+%.2f) |", us[way], us[way] - ideal);
        printf("%s\n", same ? "" : " MISMATCH");
        for (int gi = 0; gi < kGraphs; gi++) SPLASH_CUDA_CHECK(cudaGraphExecDestroy(gx[gi]));
        SPLASH_CUDA_CHECK(cudaFree(dp));
    }
    return 0;
}
