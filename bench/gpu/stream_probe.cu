/* stream_probe.cu - how close to copy bandwidth can ONE kernel launch inside a
 * CUDA graph READ a q4-style weight stream of 17-715 MB, per streaming
 * strategy, and what does a launch cost on its own?
 *
 * Layout mimicked (the tiled q4 matvec weights): a tile = 16 rows, a group =
 * 64 columns, G = 80 groups (5120 columns).  Codes [tiles][G][512 B], then
 * scales [tiles][G][64 B].  A warp owns R = 2 tiles; a step reads U
 * consecutive groups of both tiles: lane l takes bytes l*16..l*16+15 of each
 * 512 B code block and 8 B at (l>>2)*8 of each 64 B scale block.
 *
 * Strategies (every byte is consumed: XOR-folded into a per-warp 128-bit word):
 *   plain  16 B loads over the whole buffer, many blocks (best plain streaming)
 *   A      registers: a lane issues all R*U code loads + R*U scale loads of a
 *          step, then consumes them (as q4_matmul_kernel does); W warps a
 *          block, W/wk tile pairs x wk contiguous group slices.  The order is
 *          forced on ptxas (gate() below); A0 is the same code without the
 *          gate, scheduled as ptxas likes (uses interleaved with the loads)
 *   B      TMA: lane 0 of each warp issues cp.async.bulk copies of a step
 *          into an NS-stage shared-memory ring (one mbarrier a stage); the
 *          whole warp consumes with ld.shared; same decomposition as A
 *   C      B made persistent: SMs*k blocks, each warp an equal contiguous
 *          share of the (tile pair, group step) list, tile-major, its ring
 *          kept full across item and tile boundaries
 * The per-warp words XOR to the XOR of all 16 B words of the buffer, which a
 * separate reference kernel computes: any difference prints MISMATCH.
 *
 * Timing: NL = 20 launches, each at its own base in a 4 GiB pool (bases at
 * least max(64 MiB, buffer) apart, so no launch finds its data in the 50 MB
 * L2), captured into one graph; WARM graph launches, then REPS timed with
 * events; us = total / (REPS * NL).  Copy rate: a 1 GiB device-to-device
 * cudaMemcpyAsync, (read + write bytes) / time, median of 5.
 *
 * Usage: stream_probe [tiles,tiles,...]   (default 384,640,1088,2176,15520)
 */
#include <cuda_runtime.h>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/cuda_check.h"

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using namespace splash_cuda;

constexpr int G = 80;            /* groups per tile row */
constexpr int R = 2;             /* tiles per warp */
constexpr int CB = 512, SB = 64; /* code / scale bytes per (tile, group) */
constexpr int GB = CB + SB;
constexpr int NL = 20, WARM = 3, REPS = 10; /* launches per graph, graph launches */
constexpr size_t MiB = 1ull << 20;
constexpr size_t POOL = 4096 * MiB;
constexpr double TIME_BUDGET_S = 80.0; /* stop sweeping past this (the run must stay < 90 s) */

static size_t buf_bytes(int T) { return (size_t)T * G * GB; }

/* ---- device helpers -------------------------------------------------------- */

/* "memory" clobber: never hoisted above the mbarrier wait that publishes the data */
__device__ __forceinline__ uint4 lds16(uint32_t a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a) : "memory");
    return v;
}
__device__ __forceinline__ uint2 lds8(uint32_t a) {
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a) : "memory");
    return v;
}

__device__ __forceinline__ void fold16(uint4 &a, uint4 v) { a.x ^= v.x, a.y ^= v.y, a.z ^= v.z, a.w ^= v.w; }

/* Batching register loads.  Left alone, ptxas interleaves the uses of a step's
 * loads with the loads (seen in the SASS: a XOR waiting on load 1 sits before
 * load 6), so a warp has only a few loads in flight.  gate() returns 0 at run
 * time (zero is a kernel argument) but neither nvcc nor ptxas can know that:
 * adding it to every loaded word makes each use depend on ALL the step's loads
 * (any = OR of one word of each), so every load is issued before the first use. */
__device__ __forceinline__ uint32_t gate(uint32_t any, uint32_t zero) {
    uint32_t z;
    asm("and.b32 %0, %1, %2;" : "=r"(z) : "r"(any), "r"(zero));
    return z;
}
__device__ __forceinline__ uint4 addz(uint4 v, uint32_t z) { return make_uint4(v.x + z, v.y + z, v.z + z, v.w + z); }
__device__ __forceinline__ uint2 addz(uint2 v, uint32_t z) { return make_uint2(v.x + z, v.y + z); }

/* A scale block's 8 B chunk c = lane>>2 is read by 4 lanes; only lane%4 == 0
 * folds it (4 equal XORs would cancel), into the half of its 16 B word it
 * occupies (c even: bytes 0-7 = .x .y; c odd: bytes 8-15 = .z .w), so the sum
 * over warps is exactly the XOR of the buffer's 16 B words. */
struct SMask { uint32_t lo, hi; };
__device__ __forceinline__ SMask smask(int lane) {
    const uint32_t own = (lane & 3) ? 0u : ~0u;
    const bool odd = (lane >> 2) & 1;
    return {odd ? 0u : own, odd ? own : 0u};
}
__device__ __forceinline__ void fold8(uint4 &a, uint2 v, SMask m) {
    a.x ^= v.x & m.lo, a.y ^= v.y & m.lo, a.z ^= v.x & m.hi, a.w ^= v.y & m.hi;
}

__device__ __forceinline__ uint4 warp_xor(uint4 a) {
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        a.x ^= __shfl_xor_sync(~0u, a.x, o), a.y ^= __shfl_xor_sync(~0u, a.y, o);
        a.z ^= __shfl_xor_sync(~0u, a.z, o), a.w ^= __shfl_xor_sync(~0u, a.w, o);
    }
    return a;
}
/* one 16 B word per warp: combined order-independently by XOR on the host side */
__device__ __forceinline__ void warp_out(uint4 a, uint4 *out, size_t i) {
    a = warp_xor(a);
    if ((threadIdx.x & 31) == 0) out[i] = a;
}

/* ---- mbarrier / TMA: device_util.cuh's, with a wait that traps ------------- */

__device__ __forceinline__ void mbar_wait_or_trap(uint32_t bar, uint32_t parity) {
    if (mbar_try(bar, parity)) return;
    const long long t0 = clock64();
    while (!mbar_try(bar, parity))
        if (clock64() - t0 > (1ll << 32)) __trap(); /* ~2 s: a protocol bug; fail loudly, never hang */
}

/* ---- kernels ----------------------------------------------------------------- */

__global__ void kEmpty() {}

__global__ void kFill(uint32_t *p, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull; /* splitmix-style hash: non-trivial XOR sums */
        x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29;
        p[i] = (uint32_t)x;
    }
}

/* Reference checksum (plain loads, no strategy code) and the fold of per-warp outputs. */
__global__ void kXorAll(const uint4 *__restrict__ p, size_t n, unsigned *res) {
    uint4 a = make_uint4(0, 0, 0, 0);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        fold16(a, p[i]);
    a = warp_xor(a);
    if ((threadIdx.x & 31) == 0)
        atomicXor(res + 0, a.x), atomicXor(res + 1, a.y), atomicXor(res + 2, a.z), atomicXor(res + 3, a.w);
}

/* plain: GS = grid-stride with UNR loads in flight a thread; !GS = one block
 * per 256*UNR words, no loop */
template <int UNR, bool GS>
__global__ void __launch_bounds__(256) kPlain(const uint4 *__restrict__ p, size_t n, uint4 *__restrict__ out,
                                              uint32_t zero) {
    uint4 acc = make_uint4(0, 0, 0, 0);
    const size_t stride = GS ? (size_t)gridDim.x * blockDim.x : blockDim.x;
    size_t i = GS ? (size_t)blockIdx.x * blockDim.x + threadIdx.x : (size_t)blockIdx.x * blockDim.x * UNR + threadIdx.x;
    for (; i < n; i += UNR * stride) {
        uint4 v[UNR];
#pragma unroll
        for (int k = 0; k < UNR; k++)
            v[k] = i + k * stride < n ? ld_stream16(p + i + k * stride) : make_uint4(0, 0, 0, 0);
        uint32_t any = 0;
#pragma unroll
        for (int k = 0; k < UNR; k++) any |= v[k].x;
        const uint32_t z = gate(any, zero);
#pragma unroll
        for (int k = 0; k < UNR; k++) fold16(acc, addz(v[k], z));
        if (!GS) break;
    }
    warp_out(acc, out, ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
}

/* A: one step of UU groups for tiles t0, t0+1 (zeros past the last tile):
 * all loads first, then the use, like load_step/compute_step; GATE forces that
 * order on ptxas (A), without it ptxas schedules as it likes (A0) */
template <int UU, bool GATE>
__device__ __forceinline__ void a_step(uint4 &acc, const uint8_t *codes, const uint8_t *sc, int T, int t0, int g,
                                       int lane, SMask m, uint32_t zero) {
    uint4 c[R][UU];
    uint2 s[R][UU];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const bool ok = t0 + r < T;
#pragma unroll
        for (int u = 0; u < UU; u++) {
            const size_t idx = (size_t)(t0 + r) * G + g + u;
            c[r][u] = ok ? ld_stream16(codes + idx * CB + lane * 16) : make_uint4(0, 0, 0, 0);
            s[r][u] = ok ? ld_stream8(sc + idx * SB + (lane >> 2) * 8) : make_uint2(0, 0);
        }
    }
    uint32_t z = 0;
    if (GATE) {
        uint32_t any = 0;
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int u = 0; u < UU; u++) any |= c[r][u].x | s[r][u].x;
        z = gate(any, zero);
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int u = 0; u < UU; u++) fold16(acc, addz(c[r][u], z)), fold8(acc, addz(s[r][u], z), m);
}

/* A: block of W warps = W/WK tile pairs x WK contiguous group slices (warp %
 * (W/WK) = tile pair, warp / (W/WK) = slice, as q4_matmul_kernel); groups left
 * over after whole U-steps are read one at a time, as there. */
template <int U, int W, int WK, bool GATE>
__global__ void __launch_bounds__(W * 32) kA(const uint8_t *__restrict__ codes, const uint8_t *__restrict__ sc, int T,
                                             uint4 *__restrict__ out, uint32_t zero) {
    static_assert(W % WK == 0, "W must be a multiple of WK");
    constexpr int WR = W / WK;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int t0 = (blockIdx.x * WR + warp % WR) * R, wkk = warp / WR;
    const int G0 = G * wkk / WK, G1 = G * (wkk + 1) / WK;
    const SMask m = smask(lane);
    uint4 acc = make_uint4(0, 0, 0, 0);
    if (t0 < T) {
        const int nsteps = (G1 - G0) / U;
        for (int st = 0; st < nsteps; st++) a_step<U, GATE>(acc, codes, sc, T, t0, G0 + st * U, lane, m, zero);
        for (int g = G0 + nsteps * U; g < G1; g++) a_step<1, GATE>(acc, codes, sc, T, t0, g, lane, m, zero);
    }
    warp_out(acc, out, (size_t)blockIdx.x * W + warp);
}

/* B (PERS = false) and C (PERS = true).  Each warp has its own NS-stage ring
 * in dynamic shared memory; a stage holds one step: codes of the R tiles
 * [r][u][512], then their scales [r][u][64].  Stage s serves steps s, s+NS,
 * ...; its mbarrier (count 1: lane 0's arrive.expect_tx) completes phase k
 * when the k-th fill's bytes have landed, so step j waits on parity
 * (j/NS)&1.  Lane 0 refills a stage only after the whole warp has read it
 * (__syncwarp), so a barrier is never more than one phase ahead of its
 * waiters.  No proxy fence before the refill: as in CUTLASS's TMA pipelines,
 * the generic-proxy reads were issued before the bulk copy that overwrites. */
template <int U, int NS, int W, int WK, bool PERS>
__global__ void __launch_bounds__(W * 32) kB(const uint8_t *__restrict__ codes, const uint8_t *__restrict__ sc, int T,
                                             uint4 *__restrict__ out) {
    constexpr uint32_t STAGE = R * U * GB;
    constexpr int SPT = (G + U - 1) / U; /* steps per tile pair (C's work items) */
    extern __shared__ __align__(128) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t ring = smem_addr(smem) + warp * NS * STAGE;
    const uint32_t bars = smem_addr(smem) + W * NS * STAGE + warp * NS * 8;

    /* this warp's steps */
    int t0 = 0, G0 = 0, G1 = G, nsteps = 0;
    long long i0 = 0;
    if constexpr (!PERS) {
        static_assert(W % WK == 0, "W must be a multiple of WK");
        constexpr int WR = W / WK;
        t0 = (blockIdx.x * WR + warp % WR) * R;
        const int wkk = warp / WR;
        G0 = G * wkk / WK, G1 = G * (wkk + 1) / WK;
        nsteps = t0 < T ? (G1 - G0 + U - 1) / U : 0; /* last step may be short */
    } else {
        const long long items = (long long)((T + R - 1) / R) * SPT;
        const long long nw = (long long)gridDim.x * W, gw = (long long)blockIdx.x * W + warp;
        i0 = gw * items / nw;
        nsteps = (int)((gw + 1) * items / nw - i0);
    }
    /* step j -> first tile tt, first group g, groups n */
    auto locate = [&](int j, int &tt, int &g, int &n) {
        if constexpr (!PERS) {
            tt = t0, g = G0 + j * U, n = min(U, G1 - g);
        } else {
            const long long i = i0 + j;
            tt = (int)(i / SPT) * R, g = (int)(i % SPT) * U, n = min(U, G - g);
        }
    };
    auto issue = [&](int j) { /* lane 0 only */
        int tt, g, n;
        locate(j, tt, g, n);
        const uint32_t st = ring + (j % NS) * STAGE, bar = bars + (j % NS) * 8;
        const int nv = min(R, T - tt); /* tiles present (tt < T always) */
        mbar_expect_tx(bar, (uint32_t)(nv * n * GB));
        for (int r = 0; r < nv; r++) {
            const size_t idx = (size_t)(tt + r) * G + g;
            bulk_copy_g2s(st + r * U * CB, codes + idx * CB, n * CB, bar);
            bulk_copy_g2s(st + R * U * CB + r * U * SB, sc + idx * SB, n * SB, bar);
        }
    };

    if (lane == 0) {
        for (int s = 0; s < NS; s++) mbar_init(bars + s * 8, 1);
        mbar_init_fence(); /* the inits visible to the async proxy (the bulk copies' complete_tx) */
        for (int j = 0; j < min(NS, nsteps); j++) issue(j);
    }
    __syncwarp(); /* inits done before any lane waits */

    const SMask m = smask(lane);
    uint4 acc = make_uint4(0, 0, 0, 0);
    for (int j = 0; j < nsteps; j++) {
        int tt, g, n;
        locate(j, tt, g, n);
        const int s = j % NS;
        mbar_wait_or_trap(bars + s * 8, (uint32_t)(j / NS) & 1u);
        const uint32_t st = ring + s * STAGE;
        const int nv = min(R, T - tt);
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int u = 0; u < U; u++)
                if (r < nv && u < n) {
                    fold16(acc, lds16(st + (r * U + u) * CB + lane * 16));
                    fold8(acc, lds8(st + R * U * CB + (r * U + u) * SB + (lane >> 2) * 8), m);
                }
        __syncwarp(); /* the whole warp has read stage s */
        if (lane == 0 && j + NS < nsteps) issue(j + NS);
    }
    warp_out(acc, out, (size_t)blockIdx.x * W + warp);
}

/* ---- host: configurations ----------------------------------------------------- */

static int g_nsm = 0;
static cudaStream_t g_s;
static cudaEvent_t g_e0, g_e1;
static unsigned *g_res;

static std::string sfmt(const char *f, ...) {
    char b[160];
    va_list ap;
    va_start(ap, f), vsnprintf(b, sizeof b, f, ap), va_end(ap);
    return b;
}

typedef void (*KernFn)(const uint8_t *, const uint8_t *, int, uint4 *);

struct Cfg {
    std::string strat, setting;
    int threads = 32;
    std::function<int(int)> grid;                                                /* blocks for T tiles */
    std::function<void(int, const uint8_t *, int, uint4 *, cudaStream_t)> launch; /* grid, base, T, out, stream */
};

static int tiles_blocks(int T, int tile_pairs_per_block) {
    const int pairs = (T + R - 1) / R;
    return (pairs + tile_pairs_per_block - 1) / tile_pairs_per_block;
}

template <int UNR, bool GS>
static void addPlain(std::vector<Cfg> &v, int bpsm) {
    Cfg c;
    c.strat = "plain", c.threads = 256;
    c.setting = GS ? sfmt("gs/b%d/x%d", bpsm, UNR) : sfmt("flat/x%d", UNR);
    c.grid = [bpsm](int T) {
        if (GS) return g_nsm * bpsm;
        return (int)((buf_bytes(T) / 16 + 256 * UNR - 1) / (256 * UNR));
    };
    c.launch = [](int grid, const uint8_t *base, int T, uint4 *out, cudaStream_t s) {
        kPlain<UNR, GS><<<grid, 256, 0, s>>>(reinterpret_cast<const uint4 *>(base), buf_bytes(T) / 16, out, 0u);
    };
    v.push_back(c);
}

template <int U, int W, int WK, bool GATE>
static void addA(std::vector<Cfg> &v) {
    Cfg c;
    c.strat = GATE ? "A" : "A0", c.threads = W * 32, c.setting = sfmt("W%d/wk%d/U%d", W, WK, U);
    c.grid = [](int T) { return tiles_blocks(T, W / WK); };
    c.launch = [](int grid, const uint8_t *base, int T, uint4 *out, cudaStream_t s) {
        kA<U, W, WK, GATE><<<grid, W * 32, 0, s>>>(base, base + (size_t)T * G * CB, T, out, 0u);
    };
    v.push_back(c);
}

/* Allow the ring's dynamic shared memory; blocks per SM that fit (0: none). */
static int prep_smem(KernFn k, int threads, size_t smem) {
    int optin = 0, dev = 0;
    SPLASH_CUDA_CHECK(cudaGetDevice(&dev));
    SPLASH_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (smem > (size_t)optin) return 0;
    SPLASH_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    SPLASH_CUDA_CHECK(
        cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, (int)cudaSharedmemCarveoutMaxShared));
    int occ = 0;
    SPLASH_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k, threads, smem));
    return occ;
}

/* B (PERS false, k unused) and C (PERS, k blocks an SM) */
template <int U, int NS, int W, int WK, bool PERS>
static void addBC(std::vector<Cfg> &v, int k) {
    const size_t smem = (size_t)W * NS * ((size_t)R * U * GB + 8); /* rings + mbarriers */
    const int occ = prep_smem(kB<U, NS, W, WK, PERS>, W * 32, smem);
    const std::string name = PERS ? sfmt("W%d/k%d/U%d/NS%d", W, k, U, NS) : sfmt("W%d/wk%d/U%d/NS%d", W, WK, U, NS);
    if (occ < (PERS ? k : 1)) { /* C: an SM's k blocks must be resident together, or it is not persistent */
        printf("# skip %s %s: %d blocks/SM fit (%zu B shared memory)\n", PERS ? "C" : "B", name.c_str(), occ, smem);
        return;
    }
    Cfg c;
    c.strat = PERS ? "C" : "B", c.threads = W * 32, c.setting = PERS ? name : name + sfmt("/o%d", occ);
    c.grid = [k](int T) { return PERS ? g_nsm * k : tiles_blocks(T, W / WK); };
    c.launch = [smem](int grid, const uint8_t *base, int T, uint4 *out, cudaStream_t s) {
        kB<U, NS, W, WK, PERS><<<grid, W * 32, smem, s>>>(base, base + (size_t)T * G * CB, T, out);
    };
    v.push_back(c);
}

template <int W, int WK, bool GATE>
static void addA3(std::vector<Cfg> &v) { addA<2, W, WK, GATE>(v), addA<4, W, WK, GATE>(v), addA<8, W, WK, GATE>(v); }
template <int U, int W, int WK, bool PERS>
static void addNS(std::vector<Cfg> &v, int k) {
    addBC<U, 2, W, WK, PERS>(v, k), addBC<U, 4, W, WK, PERS>(v, k), addBC<U, 6, W, WK, PERS>(v, k);
}
template <int W, int WK, bool PERS>
static void addBC6(std::vector<Cfg> &v, int k) { addNS<2, W, WK, PERS>(v, k), addNS<4, W, WK, PERS>(v, k); }

/* ---- host: measurement ---------------------------------------------------------- */

/* us per kernel: NL launches (launch_i(i) for i < NL) in one graph */
static double time_graph(const std::function<void(int)> &launch_i) {
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    SPLASH_CUDA_CHECK(cudaStreamBeginCapture(g_s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < NL; i++) {
        launch_i(i);
        SPLASH_CUDA_CHECK(cudaGetLastError());
    }
    SPLASH_CUDA_CHECK(cudaStreamEndCapture(g_s, &gr));
    SPLASH_CUDA_CHECK(cudaGraphInstantiate(&ge, gr, 0));
    for (int i = 0; i < WARM; i++) SPLASH_CUDA_CHECK(cudaGraphLaunch(ge, g_s));
    SPLASH_CUDA_CHECK(cudaEventRecord(g_e0, g_s));
    for (int i = 0; i < REPS; i++) SPLASH_CUDA_CHECK(cudaGraphLaunch(ge, g_s));
    SPLASH_CUDA_CHECK(cudaEventRecord(g_e1, g_s));
    SPLASH_CUDA_CHECK(cudaEventSynchronize(g_e1));
    float ms = 0.f;
    SPLASH_CUDA_CHECK(cudaEventElapsedTime(&ms, g_e0, g_e1));
    SPLASH_CUDA_CHECK(cudaGraphExecDestroy(ge));
    SPLASH_CUDA_CHECK(cudaGraphDestroy(gr));
    return ms * 1e3 / (REPS * NL);
}

/* XOR of n 16 B words at p (device) into h[4] */
static void xor_all(const void *p, size_t n, unsigned h[4]) {
    SPLASH_CUDA_CHECK(cudaMemsetAsync(g_res, 0, 16, g_s));
    kXorAll<<<g_nsm * 8, 256, 0, g_s>>>(reinterpret_cast<const uint4 *>(p), n, g_res);
    SPLASH_CUDA_CHECK(cudaGetLastError());
    SPLASH_CUDA_CHECK(cudaMemcpyAsync(h, g_res, 16, cudaMemcpyDeviceToHost, g_s));
    SPLASH_CUDA_CHECK(cudaStreamSynchronize(g_s));
}

struct Res {
    std::string strat, setting;
    int T;
    double us, gbs;
};

int main(int argc, char **argv) {
    const auto t_start = std::chrono::steady_clock::now();
    auto now = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count(); };

    std::vector<int> tiles = {384, 640, 1088, 2176, 15520};
    if (argc > 1) {
        tiles.clear();
        for (char *p = argv[1], *e; *p; p = *e ? e + 1 : e) {
            const long t = strtol(p, &e, 10);
            if (e == p || t <= 0 || t > 1000000 || (*e && *e != ',')) {
                fprintf(stderr, "usage: %s [tiles,tiles,...]  (positive integers; bad: '%s')\n", argv[0], argv[1]);
                return 2;
            }
            tiles.push_back((int)t);
        }
    }
    for (int T : tiles)
        if (buf_bytes(T) + 64 * MiB > POOL) {
            fprintf(stderr, "tiles=%d: %zu B does not fit the %zu B pool\n", T, buf_bytes(T), POOL);
            return 2;
        }

    SPLASH_CUDA_CHECK(cudaSetDevice(0));
    cudaDeviceProp prop;
    SPLASH_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    g_nsm = prop.multiProcessorCount;
    printf("# %s: %d SMs, L2 %d MB, shared memory/block (opt-in) %zu B\n", prop.name, g_nsm, prop.l2CacheSize >> 20,
           (size_t)prop.sharedMemPerBlockOptin);
    printf("# layout: G=%d groups, R=%d tiles/warp, %d B codes + %d B scales per (tile, group); %d launches/graph, "
           "%d timed graph launches\n",
           G, R, CB, SB, NL, REPS);

    uint8_t *pool = nullptr;
    SPLASH_CUDA_CHECK(cudaMalloc(&pool, POOL));
    SPLASH_CUDA_CHECK(cudaStreamCreateWithFlags(&g_s, cudaStreamNonBlocking));
    SPLASH_CUDA_CHECK(cudaEventCreate(&g_e0));
    SPLASH_CUDA_CHECK(cudaEventCreate(&g_e1));
    SPLASH_CUDA_CHECK(cudaMalloc(&g_res, 16));

    /* copy ceiling: 1 GiB D2D, read + write bytes */
    const size_t cpb = 1024 * MiB;
    SPLASH_CUDA_CHECK(cudaMemsetAsync(pool, 0x5a, POOL, g_s));
    SPLASH_CUDA_CHECK(cudaMemcpyAsync(pool + 2 * cpb, pool, cpb, cudaMemcpyDeviceToDevice, g_s)); /* warm-up */
    std::vector<float> cms;
    for (int i = 0; i < 5; i++) {
        SPLASH_CUDA_CHECK(cudaEventRecord(g_e0, g_s));
        SPLASH_CUDA_CHECK(cudaMemcpyAsync(pool + 2 * cpb, pool, cpb, cudaMemcpyDeviceToDevice, g_s));
        SPLASH_CUDA_CHECK(cudaEventRecord(g_e1, g_s));
        SPLASH_CUDA_CHECK(cudaEventSynchronize(g_e1));
        float ms = 0.f;
        SPLASH_CUDA_CHECK(cudaEventElapsedTime(&ms, g_e0, g_e1));
        cms.push_back(ms);
    }
    std::sort(cms.begin(), cms.end());
    const double copy_gbs = 2.0 * cpb / (cms[2] * 1e-3) / 1e9;
    printf("# [%5.1fs] copy bandwidth (1 GiB D2D memcpy, read+write, median of 5): %.0f GB/s\n", now(), copy_gbs);

    /* pattern: a hash of the word index, so checksums are not trivially zero */
    kFill<<<g_nsm * 8, 256, 0, g_s>>>(reinterpret_cast<uint32_t *>(pool), POOL / 4);
    SPLASH_CUDA_CHECK(cudaGetLastError());
    SPLASH_CUDA_CHECK(cudaStreamSynchronize(g_s));

    std::vector<Cfg> cfgs;
    addPlain<4, true>(cfgs, 4), addPlain<4, true>(cfgs, 8), addPlain<8, false>(cfgs, 0);
    addA3<4, 4, true>(cfgs), addA3<4, 1, true>(cfgs), addA3<8, 4, true>(cfgs), addA3<8, 8, true>(cfgs);
    addA3<4, 4, false>(cfgs), addA3<4, 1, false>(cfgs), addA3<8, 4, false>(cfgs), addA3<8, 8, false>(cfgs);
    addBC6<4, 4, false>(cfgs, 0), addBC6<4, 1, false>(cfgs, 0);
    addBC6<8, 4, false>(cfgs, 0), addBC6<8, 8, false>(cfgs, 0);
    for (int k = 1; k <= 2; k++) addBC6<4, 1, true>(cfgs, k), addBC6<8, 1, true>(cfgs, k);

    size_t cap = 1; /* per-warp output words: the most any launch writes */
    for (const Cfg &c : cfgs)
        for (int T : tiles) cap = std::max(cap, (size_t)c.grid(T) * c.threads / 32);
    uint4 *out = nullptr;
    SPLASH_CUDA_CHECK(cudaMalloc(&out, cap * sizeof(uint4)));

    /* fixed per-launch cost: empty kernels, same graph shape */
    const double e_small = time_graph([&](int) { kEmpty<<<1, 32, 0, g_s>>>(); });
    const double e_big = time_graph([&](int) { kEmpty<<<g_nsm * 8, 256, 0, g_s>>>(); });
    printf("# [%5.1fs] empty kernel in a graph: %.2f us per launch (1x32), %.2f us (%dx256)\n", now(), e_small, e_big,
           g_nsm * 8);

    std::vector<Res> results;
    int mism = 0;
    bool out_of_time = false;
    for (int T : tiles) {
        if (out_of_time) break;
        const size_t bytes = buf_bytes(T);
        const double mb = bytes / 1e6;
        /* bases: spaced max(64 MiB, buffer) so consecutive launches share nothing in L2 */
        const size_t sp = std::max(64 * MiB, (bytes + 2 * MiB - 1) / (2 * MiB) * (2 * MiB));
        const size_t slots = (POOL - bytes) / sp + 1;
        std::vector<size_t> offs(NL);
        for (int i = 0; i < NL; i++) offs[i] = (i % slots) * sp;
        const size_t voff = offs[1 % NL]; /* checksums at a nonzero base */
        unsigned ref[4];
        xor_all(pool + voff, bytes / 16, ref);
        printf("\n# [%5.1fs] tiles=%d (%d rows) %.1f MB, %zu distinct bases %zu MiB apart, ref checksum "
               "%08x%08x%08x%08x%s\n",
               now(), T, T * 16, mb, std::min(slots, (size_t)NL), sp / MiB, ref[3], ref[2], ref[1], ref[0],
               slots < 2 ? "  (WARNING: one base only, L2 may serve repeats)" : "");
        printf("%-6s %-22s %6s %8s %9s %8s %6s\n", "strat", "setting", "tiles", "MB", "us", "GB/s", "%copy");
        for (const Cfg &c : cfgs) {
            if (now() > TIME_BUDGET_S) {
                printf("# time budget (%.0f s) reached: sweep stopped here\n", TIME_BUDGET_S);
                out_of_time = true;
                break;
            }
            const int grid = c.grid(T);
            const size_t nw = (size_t)grid * c.threads / 32;
            /* correctness: one launch, fold the per-warp words, compare */
            SPLASH_CUDA_CHECK(cudaMemsetAsync(out, 0, nw * sizeof(uint4), g_s));
            c.launch(grid, pool + voff, T, out, g_s);
            SPLASH_CUDA_CHECK(cudaGetLastError());
            unsigned got[4];
            xor_all(out, nw, got);
            const bool bad = memcmp(got, ref, sizeof ref) != 0;
            mism += bad;
            const double us = time_graph([&](int i) { c.launch(grid, pool + offs[i], T, out, g_s); });
            const double gbs = bytes / (us * 1e3);
            printf("%-6s %-22s %6d %8.1f %9.2f %8.0f %6.1f", c.strat.c_str(), c.setting.c_str(), T, mb, us, gbs,
                   100.0 * gbs / copy_gbs);
            if (bad)
                printf("   <<<<<<<<<< MISMATCH: got %08x%08x%08x%08x", got[3], got[2], got[1], got[0]);
            printf("\n");
            fflush(stdout);
            results.push_back({c.strat, c.setting, T, us, gbs});
        }
    }

    /* best setting of each strategy per size; "over" = us minus the time a
     * copy-rate read of the same bytes would take (launch + ramp + tail; it
     * goes negative on big buffers, where a pure read beats the copy's rate) */
    printf("\n# [%5.1fs] best per size (over_us = us - bytes/copy rate; empty launch = %.2f us)\n", now(), e_small);
    printf("%-6s %-22s %6s %8s %9s %8s %6s %8s\n", "strat", "setting", "tiles", "MB", "us", "GB/s", "%copy", "over_us");
    const char *strats[] = {"plain", "A", "A0", "B", "C"};
    for (int T : tiles) {
        const double mb = buf_bytes(T) / 1e6, ideal_us = buf_bytes(T) / (copy_gbs * 1e3);
        for (const char *s : strats) {
            const Res *b = nullptr;
            for (const Res &r : results)
                if (r.T == T && r.strat == s && (!b || r.us < b->us)) b = &r;
            if (b)
                printf("%-6s %-22s %6d %8.1f %9.2f %8.0f %6.1f %8.2f\n", s, b->setting.c_str(), T, mb, b->us, b->gbs,
                       100.0 * b->gbs / copy_gbs, b->us - ideal_us);
        }
    }
    if (mism)
        printf("\n#### %d CHECKSUM MISMATCH(ES): the affected strategies did not read every byte exactly once ####\n",
               mism);
    else
        printf("\n# all %zu checksums match the reference\n", results.size());
    printf("# [%5.1fs] done\n", now());

    SPLASH_CUDA_CHECK(cudaFree(out)); SPLASH_CUDA_CHECK(cudaFree(g_res)); SPLASH_CUDA_CHECK(cudaFree(pool));
    SPLASH_CUDA_CHECK(cudaEventDestroy(g_e0));
    SPLASH_CUDA_CHECK(cudaEventDestroy(g_e1));
    SPLASH_CUDA_CHECK(cudaStreamDestroy(g_s));
    return mism ? 1 : 0;
}
