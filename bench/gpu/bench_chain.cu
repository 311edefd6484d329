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
 *   ring      one kernel, one block an SM, whose weights never wait for a
 *             dependency: a producer warp streams the block's rows of every
 *             phase, in phase order, into a ring of shared-memory stages
 *             (bulk copies, an mbarrier a stage), stopping only when the ring
 *             is full; the consumer warps wait for the previous phase (a
 *             counter that only grows), read x, then use the stages.  The
 *             ring runs ahead across the dependency, so HBM can keep
 *             streaming while the consumers wait: the form a decode
 *             megakernel would take.  Forms: 12 stages of 16 KB (192 KB an
 *             SM, ~25 MB on the chip) or 4; a block's rows contiguous or its
 *             stages interleaved with the other blocks' (the chip reads one
 *             moving window, as stream does); one group of 8 consumer warps
 *             or two taking alternate stages; and a bound that skips the
 *             wait for the previous phase (its results are wrong).  After
 *             the table, where one form's time goes (clock64 in each block:
 *             the producer's waits for a free stage, consumer thread 0's
 *             waits for the previous phase, for x, for its stages, and its
 *             phase ends)
 *   stream    the same bytes with no dependency at all: one kernel reading
 *             every phase's weights back to back, a warp's next rows loaded
 *             before the ones it holds are used (the ceiling)
 * Every way's outputs are compared with the launch way's (the same sums in
 * the same order): any difference prints MISMATCH.
 *
 * Usage: bench_chain [MB,MB,...]     phases of one size each (default 1,4.7,17.7,50)
 *        bench_chain -l MB,MB,...    one chain: the list (a "layer") repeated to
 *                                    300 MB+, us per layer (e.g. the 27B's GDN
 *                                    layer: 47,0.01,17.7,0.01,100,0.01,50,0.01)
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
    unsigned long long *probe; /* ring_kernel<..., PROBE>: [blocks][kProbes], cycles (kTotalNs: ns) */
};
/* where a ring block's time goes (SM cycles, summed over the phases; the
 * total also in ns, which scales the rest): the producer's
 * waits for a free stage; consumer thread 0's waits for the previous phase,
 * its x, its stages' landing, and its phase's end (barrier, fence, count) */
enum { kProdWait = 0, kDepWait, kXLoad, kFullWait, kEnd, kTotal, kTotalNs, kProbes };
__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

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

/* ring: see the top.  A block takes the same rows of every phase (StageWalk);
 * the stream of its rows, phase after phase, is cut into stages of up to
 * STAGE_ROWS rows.  CG groups of kWarps warps consume (group g the stages it
 * with it % CG == g, warp w of the group row w of a stage, in finish_rows'
 * order: the launch way's bits), warp CG kWarps produces (its lane 0 issues
 * the copies).  A phase ends with the consumers' barrier and one release
 * add to the counter; the next waits for gridDim.x (k + 1) on it. */
constexpr int kStageRows = 8;

__device__ __forceinline__ void block_rows(int rows, int &r0, int &r1) {
    r0 = (int)((long long)blockIdx.x * rows / gridDim.x);
    r1 = (int)((long long)(blockIdx.x + 1) * rows / gridDim.x);
}

/* the consumers' barrier (named barrier 1: the producer warp never joins) */
template <int CG>
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(CG * kThreads) : "memory"); }

/* A block's stages of a phase: its contiguous share of the rows (ILV false),
 * or every gridDim.x-th stage of them (ILV true: the chip reads one moving
 * window, as the stream kernel does); r is a stage's first row, n() its rows. */
template <int STAGE_ROWS, bool ILV>
struct StageWalk {
    int r, r1, step;
    __device__ StageWalk(int rows) {
        if (ILV) {
            r = blockIdx.x * STAGE_ROWS, r1 = rows, step = gridDim.x * STAGE_ROWS;
        } else {
            block_rows(rows, r, r1);
            step = STAGE_ROWS;
        }
    }
    __device__ bool more() const { return r < r1; }
    __device__ int n() const { return min(STAGE_ROWS, r1 - r); }
    __device__ void next() { r += step; }
};

template <int STAGES, int STAGE_ROWS = kStageRows, bool WAIT = true, bool PROBE = false, bool ILV = false, int CG = 1>
__global__ void __launch_bounds__(CG * kThreads + 32) ring_kernel(const Chain c) {
    unsigned long long pt[kProbes] = {}, t0 = PROBE ? clock64() : 0, n0 = PROBE ? now_ns() : 0, ta = 0;
#define RING_T0() if (PROBE) ta = clock64()
#define RING_T1(i) if (PROBE) pt[i] += clock64() - ta
    constexpr int kStageBytes = STAGE_ROWS * kRowBytes;
    extern __shared__ __align__(128) uint8_t smem[];
    uint8_t *ring = smem;
    float *xs = reinterpret_cast<float *>(smem + (size_t)STAGES * kStageBytes);
    uint64_t *bars = reinterpret_cast<uint64_t *>(xs + kCols); /* full [STAGES], empty [STAGES] */
    const uint32_t full0 = (uint32_t)__cvta_generic_to_shared(bars), empty0 = full0 + 8 * STAGES;
    const uint32_t ring0 = (uint32_t)__cvta_generic_to_shared(ring);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(full0 + 8 * s, 1), mbar_init(empty0 + 8 * s, kWarps);
        mbar_init_fence();
    }
    __syncthreads();
    if (warp == CG * kWarps) { /* the producer */
        if (lane) return;
        int it = 0;
        for (int k = 0; k < c.n; k++) {
            const Phase p = c.ph[k];
            for (StageWalk<STAGE_ROWS, ILV> st(p.rows); st.more(); st.next(), it++) {
                const int s = it % STAGES, round = it / STAGES;
                RING_T0();
                if (round) mbar_wait(empty0 + 8 * s, (round - 1) & 1);
                RING_T1(kProdWait);
                const uint32_t bytes = (uint32_t)st.n() * kRowBytes;
                mbar_expect_tx(full0 + 8 * s, bytes);
                bulk_copy_g2s(ring0 + s * kStageBytes, p.w + (size_t)st.r * (kRowBytes / 16), bytes, full0 + 8 * s);
            }
        }
        if (PROBE) c.probe[blockIdx.x * kProbes + kProdWait] = pt[kProdWait];
        return;
    }
    int it = 0;
    for (int k = 0; k < c.n; k++) {
        RING_T0();
        if (k && WAIT) { /* every block's phase k - 1 done (WAIT false: a bound, the results wrong) */
            if (threadIdx.x == 0) {
                const unsigned target = gridDim.x * (unsigned)k;
                unsigned v;
                do {
                    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c.count) : "memory");
                } while (v < target);
            }
            consumers_sync<CG>();
        }
        RING_T1(kDepWait);
        RING_T0();
        {
            const float *x = k ? ybuf(c, k + 1) : c.x0;
            const int prev = k ? c.ph[k - 1].rows : kCols;
            for (int i = threadIdx.x; i < kCols; i += CG * kThreads) xs[i] = __ldcg(x + i % prev);
            consumers_sync<CG>();
        }
        RING_T1(kXLoad);
        const Phase p = c.ph[k];
        float *y = ybuf(c, k);
        for (StageWalk<STAGE_ROWS, ILV> st(p.rows); st.more(); st.next(), it++) {
            const int s = it % STAGES, round = it / STAGES, r = st.r;
            if (it % CG != warp / kWarps) continue; /* another group's stage */
            RING_T0();
            mbar_wait(full0 + 8 * s, round & 1);
            RING_T1(kFullWait);
            for (int rw = warp % kWarps; rw < st.n(); rw += kWarps) { /* finish_rows' sums, in its order */
                const uint4 *w = reinterpret_cast<const uint4 *>(ring + (size_t)s * kStageBytes) + rw * (kRowBytes / 16);
                float acc = 0.f;
#pragma unroll
                for (int j = 0; j < kLoads; j++) {
                    const uint4 v = w[j * 32 + lane];
                    const int cc = (j * 32 + lane) * 4;
                    acc = fmaf(word_factor(v.x), xs[cc], acc);
                    acc = fmaf(word_factor(v.y), xs[cc + 1], acc);
                    acc = fmaf(word_factor(v.z), xs[cc + 2], acc);
                    acc = fmaf(word_factor(v.w), xs[cc + 3], acc);
                }
                acc = warp_sum(acc);
                if (lane == 0) y[r + rw] = acc * (1.0f / 768.0f);
            }
            __syncwarp();
            if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(empty0 + 8 * s) : "memory");
        }
        RING_T0();
        consumers_sync<CG>(); /* the block's y written */
        if (threadIdx.x == 0) /* release, cumulative over the writes the barrier ordered before it (no full fence) */
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c.count) : "memory");
        RING_T1(kEnd);
    }
    if (PROBE && threadIdx.x == 0) {
        pt[kTotal] = clock64() - t0, pt[kTotalNs] = now_ns() - n0;
        for (int i = kDepWait; i < kProbes; i++) c.probe[blockIdx.x * kProbes + i] = pt[i];
    }
#undef RING_T0
#undef RING_T1
}

template <int STAGES, int STAGE_ROWS = kStageRows>
constexpr size_t ring_smem() { return (size_t)STAGES * STAGE_ROWS * kRowBytes + kCols * 4 + 16 * STAGES; }

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
    /* chains: each a list of phase sizes (MB) and how many units (phases, or layers) it holds */
    struct Run {
        std::vector<double> mb;
        int units;
    };
    std::vector<Run> runs;
    const bool layer = argc > 2 && !strcmp(argv[1], "-l");
    std::vector<double> sizes = {1, 4.7, 17.7, 50};
    if (argc > 1) {
        sizes.clear();
        for (char *s = strtok(argv[layer ? 2 : 1], ","); s; s = strtok(nullptr, ",")) sizes.push_back(atof(s));
    }
    if (layer) {
        double per = 0;
        for (double mb : sizes) per += mb;
        Run r = {{}, std::max(2, (int)(600.0 / per))};
        for (int l = 0; l < r.units; l++) r.mb.insert(r.mb.end(), sizes.begin(), sizes.end());
        runs.push_back(r);
    } else {
        for (double mb : sizes) {
            const int n = (int)std::min<size_t>(std::max<size_t>(16, (size_t)(300.0 / mb)), (size_t)(1000.0 / mb));
            runs.push_back({std::vector<double>(n, mb), n});
        }
    }
    int dev = 0, sms = 0;
    SPLASH_CUDA_CHECK(cudaGetDevice(&dev));
    SPLASH_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    int occ = 0;
    SPLASH_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, persist_kernel<kGen>, kThreads, 0));
    /* the ring's forms: stages x rows a stage; the last waits for nothing (a bound: its results are wrong) */
    struct RingForm {
        const void *fn;
        size_t smem;
        int threads;
        const char *name;
    };
    const RingForm rings[] = {
        {(const void *)ring_kernel<12>, ring_smem<12>(), kThreads + 32, "ring, 12 x 16 KB"},
        {(const void *)ring_kernel<4>, ring_smem<4>(), kThreads + 32, "ring, 4 x 16 KB"},
        {(const void *)ring_kernel<12, kStageRows, true, false, true>, ring_smem<12>(), kThreads + 32,
         "ring, 12 x 16 KB, interleaved"},
        {(const void *)ring_kernel<12, kStageRows, true, false, true, 2>, ring_smem<12>(), 2 * kThreads + 32,
         "ring, 12 x 16 KB, interleaved, 2 groups"},
        {(const void *)ring_kernel<12, kStageRows, false, false, true, 2>, ring_smem<12>(), 2 * kThreads + 32,
         "ring, 12 x 16 KB, interleaved, 2 groups, no wait (bound)"},
    };
    constexpr int kRings = sizeof rings / sizeof rings[0];
    for (const RingForm &f : rings)
        SPLASH_CUDA_CHECK(cudaFuncSetAttribute(f.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)f.smem));
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
    unsigned long long *probe;
    SPLASH_CUDA_CHECK(cudaMalloc(&probe, (size_t)sms * kProbes * 8));
    const void *probe_fn[2] = {(const void *)ring_kernel<12, kStageRows, true, true, true, 2>,
                               (const void *)ring_kernel<12, kStageRows, false, true, true, 2>};
    for (const void *f : probe_fn)
        SPLASH_CUDA_CHECK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ring_smem<12>()));
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
    printf("us a %s (over the ideal)\n", layer ? "layer" : "phase");
    printf("| %s MB | %ss | ideal us (4.3 TB/s) | launch | pdl | pdl, 1 block an SM | persist, gen barrier | "
           "persist, monotonic | persist, monotonic, 1 block an SM |",
           layer ? "layer" : "phase", layer ? "layer" : "phase");
    for (const RingForm &f : rings) printf(" %s |", f.name);
    printf(" stream (no dependency) |\n|---|---|---|");
    for (int i = 0; i < 7 + kRings; i++) printf("---|");
    printf("\n");
    for (const Run &run_ : runs) {
        const int n = (int)run_.mb.size();
        std::vector<Phase> hp(n);
        size_t at = 0;
        for (int k = 0; k < n; k++) {
            const int rows = std::max(1, (int)(run_.mb[k] * 1e6 / kRowBytes));
            if (at + (size_t)rows * kRowBytes > pool_bytes) at = 0; /* past the pool: start over (never for these sizes) */
            hp[k] = {pool + at / 16, rows};
            at += (size_t)rows * kRowBytes;
        }
        size_t total = 0;
        for (int k = 0; k < n; k++) total += (size_t)hp[k].rows * kRowBytes;
        const int rows_last = hp[n - 1].rows;
        Phase *dp;
        SPLASH_CUDA_CHECK(cudaMalloc(&dp, n * sizeof(Phase)));
        SPLASH_CUDA_CHECK(cudaMemcpy(dp, hp.data(), n * sizeof(Phase), cudaMemcpyHostToDevice));
        Chain c = {dp, n, {y0, y1}, x0, bar, bar + 1, probe}; /* bar: zeroed before each persistent run */
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
         * 5 persist MONO (one block an SM), 6.. the rings, last stream */
        constexpr int kWays = 7 + kRings;
        auto run = [&](int way) {
            if (way < kGraphs) {
                SPLASH_CUDA_CHECK(cudaGraphLaunch(gx[way], st));
            } else if (way < kWays - 1) {
                void *args[] = {(void *)&c};
                SPLASH_CUDA_CHECK(cudaMemsetAsync(bar, 0, 8, st));
                const bool ring = way >= 6;
                const void *fn = way == 3 ? (const void *)persist_kernel<kGen>
                                 : ring   ? rings[way - 6].fn
                                          : (const void *)persist_kernel<kMono>;
                const dim3 blocks(way >= 5 ? sms : grid), threads(ring ? rings[way - 6].threads : kThreads);
                SPLASH_CUDA_CHECK(cudaLaunchCooperativeKernel(fn, blocks, threads, args, ring ? rings[way - 6].smem : 0, st));
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
            if (way == 0) SPLASH_CUDA_CHECK(cudaMemcpy(ref, last, (size_t)rows_last * 4, cudaMemcpyDeviceToDevice));
            if (way >= 1 && way < kWays - 2) { /* every way but the bound and stream (which writes nothing) */
                std::vector<float> a(rows_last), b(rows_last);
                SPLASH_CUDA_CHECK(cudaMemcpy(a.data(), ref, (size_t)rows_last * 4, cudaMemcpyDeviceToHost));
                SPLASH_CUDA_CHECK(cudaMemcpy(b.data(), last, (size_t)rows_last * 4, cudaMemcpyDeviceToHost));
                if (memcmp(a.data(), b.data(), (size_t)rows_last * 4)) same = false, printf("way %d differs\n", way);
            }
            std::vector<double> t;
            for (int rep = 0; rep < 5; rep++) {
                SPLASH_CUDA_CHECK(cudaEventRecord(e0, st));
                run(way);
                SPLASH_CUDA_CHECK(cudaEventRecord(e1, st));
                SPLASH_CUDA_CHECK(cudaEventSynchronize(e1));
                float ms = 0;
                SPLASH_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
                t.push_back(ms * 1e3 / run_.units);
            }
            us[way] = median(t);
        }
        const double ideal = total / 4.3e6 / run_.units;
        printf("| %.1f | %d | %.2f |", total / 1e6 / run_.units, run_.units, ideal);
        for (int way = 0; way < kWays; way++) printf(" %.2f (+%.2f) |", us[way], us[way] - ideal);
        printf("%s\n", same ? "" : " MISMATCH");
        for (int w = 0; w < 2; w++) { /* where the 12 x 16 KB ring's time goes, with and without its waits */
            void *args[] = {(void *)&c};
            const void *fn = probe_fn[w];
            for (int rep = 0; rep < 2; rep++) { /* the second run's */
                SPLASH_CUDA_CHECK(cudaMemsetAsync(bar, 0, 8, st));
                SPLASH_CUDA_CHECK(cudaLaunchCooperativeKernel(fn, dim3(sms), dim3(2 * kThreads + 32), args, ring_smem<12>(), st));
            }
            std::vector<unsigned long long> hpb((size_t)sms * kProbes);
            SPLASH_CUDA_CHECK(cudaStreamSynchronize(st)); /* st does not synchronise with the legacy stream */
            SPLASH_CUDA_CHECK(cudaMemcpy(hpb.data(), probe, hpb.size() * 8, cudaMemcpyDeviceToHost));
            static const char *names[kProbes] = {"producer waits for a stage", "waits for the previous phase", "x",
                                                 "waits for stages", "phase end", "total", "total (globaltimer)"};
            printf("  ring 12 x 16 KB, interleaved, 2 groups%s, us a %s, mean / max over blocks:", w ? " no wait" : "", layer ? "layer" : "phase");
            for (int i = 0; i < kProbes; i++) {
                double sum = 0, mx = 0;
                for (int b = 0; b < sms; b++) {
                    const unsigned long long *q = &hpb[(size_t)b * kProbes];
                    const double ns_cycle = q[kTotal] ? (double)q[kTotalNs] / q[kTotal] : 0;
                    const double v = (i == kTotalNs ? q[i] : q[i] * ns_cycle) / 1e3 / run_.units;
                    sum += v, mx = std::max(mx, v);
                }
                printf(" %s %.2f / %.2f;", names[i], sum / sms, mx);
            }
            printf("\n");
        }
        for (int gi = 0; gi < kGraphs; gi++) SPLASH_CUDA_CHECK(cudaGraphExecDestroy(gx[gi]));
        SPLASH_CUDA_CHECK(cudaFree(dp));
    }
    return 0;
}
