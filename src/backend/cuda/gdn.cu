/* gdn.cu - Gated DeltaNet conv, gates and the fused recurrence (gdn.h).
 *
 * conv: one thread per (channel, lane, chunk of 64 rows); the taps are summed
 * oldest first (first tap a product, then fmaf), as gdn_conv.c, then SiLU.
 * Launches of 8 or more rows a lane keep the taps and the last K - 1 inputs in
 * registers and load 8 rows' inputs at once; fewer rows (decode) load them
 * where they are used, which measured faster there.  A launch whose caller
 * allows early loads (decode and verify behind a q4 product) of at most 16
 * rows a lane takes conv_early instead: taps and state read before the
 * programmatic wait, every row's input at once after it.
 * Only rows < K-1 read the conv state and they are all in chunk 0, whose
 * block also writes the new state after its own reads: no block reads state
 * that another writes.
 *
 * recurrence: a cluster of ns = dv / 32 blocks per (value head, lane), each
 * block on 32 state columns, 4 threads per column (thread = column c, slice
 * s; it holds S[s + 4j][c] for j < dk/4 in registers): a column's update
 * needs only its own column and the row's q, k, gates, so splitting dv costs
 * nothing but a sum for the gated norm, and a decode step runs on hv x ns
 * blocks (192 for the 27B) instead of hv.  Rows go in chunks of 16: first
 * everything that does not depend on the state, for all the chunk's rows at
 * once (q and k normalised, a warp a vector, into shared memory; the gates;
 * v and z of the block's columns), so their loads are in flight together;
 * then the rows one after another with no barrier and no global load: the
 * decay, m = S^T k, the rank-1 update and o = S^T q in registers, the sums
 * over dk in four interleaved register chains, then across the four slices
 * by two shuffles; then the gated norm of the chunk's rows (each block sums
 * o^2 over its columns and stores the sums into every block of the cluster,
 * one cluster barrier, then each block adds the blocks' sums in rank order,
 * once a row).
 * The state is read once at the start and written once at the end.
 * Consecutive threads hold consecutive columns, so every load and store of S
 * covers whole 32-byte sectors.  A row's results do not depend on how many
 * rows its lane has (commit's replay gives the verify's bits).
 *
 * C++ used: a template over dk (the register array's size); no STL.
 */
#include <cuda_runtime.h>
#include <cooperative_groups.h>
#include <math.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/gdn.h"

namespace cg = cooperative_groups;
using namespace splash_cuda;

namespace {

constexpr int kConvThreads = 128;
constexpr int kConvChunk = 64; /* rows per conv block; >= K - 1 */
constexpr int kConvAhead = 8;  /* rows whose inputs a conv thread loads before using them */
constexpr int kConvWindowRows = 8; /* launches with this many rows a lane or more take the window */
constexpr int kConvEarlyRows = 16; /* early launches (conv_early) of at most this many rows a lane */
constexpr int kConvEarlyK = 4;     /* and this K (the models') */
constexpr int kSlices = 4;     /* threads per state column */
constexpr int kRecRows = 16;   /* rows a recurrence block prepares at once */
constexpr int kRecCols = 32;   /* state columns a recurrence block owns */
constexpr int kRecWarps = kRecCols * kSlices / 32;
constexpr int kRecMaxNs = SPLASH_CUDA_GDN_MAX_DV / kRecCols; /* blocks of a cluster */

struct ConvArgs {
    const float *wT;
    const splash_cuda_gdn_lane *lanes;
    const float *x;
    float *y;
    size_t ldx, ldy;
    int C, K;
};

/* A lane's conv rows [t0, t1) of channel c (x, y at the lane's first row and
 * channel c), taps and inputs loaded where they are used: fewer than
 * kConvWindowRows rows a lane (decode), where the window below cost a 27B
 * decode step ~0.1 ms of 6.3 (session 23). */
__device__ __forceinline__ void conv_rows_direct(const ConvArgs &a, const float *state, const float *x, float *y, int c,
                                                 int t0, int t1) {
    const int K = a.K, keep = K - 1, C = a.C;
    for (int t = t0; t < t1; t++) {
        float acc = 0.f;
        for (int k = 0; k < K; k++) {
            const int j = t - keep + k; /* input row; < 0 lives in the state */
            const float src = j < 0 ? state[(size_t)(keep + j) * C + c] : x[(size_t)j * a.ldx];
            const float w = a.wT[(size_t)k * C + c];
            acc = k ? fmaf(w, src, acc) : __fmul_rn(w, src);
        }
        y[(size_t)t * a.ldy] = siluf_(acc);
    }
}

/* The same rows with the taps and the last K - 1 inputs in registers (the
 * window: win[s] the input K - 1 - s rows back), kConvAhead rows' inputs
 * loaded before any of them is used: a row then costs one load of x, not K
 * loads of x and K of the taps each waiting for the row before's store
 * (session 23, 27B: a 4K prefill's conv 0.88 -> 0.63 ms in 4 layers, verify
 * 16 12.51 -> 12.39 ms).  The same sums in the same order. */
__device__ __forceinline__ void conv_rows_window(const ConvArgs &a, const float *state, const float *x, float *y, int c,
                                                 int t0, int t1) {
    const int K = a.K, keep = K - 1, C = a.C;
    float w[SPLASH_CUDA_GDN_MAX_K], win[SPLASH_CUDA_GDN_MAX_K - 1];
#pragma unroll
    for (int k = 0; k < SPLASH_CUDA_GDN_MAX_K; k++) w[k] = k < K ? a.wT[(size_t)k * C + c] : 0.f;
#pragma unroll
    for (int s = 0; s < SPLASH_CUDA_GDN_MAX_K - 1; s++) {
        const int j = t0 - keep + s; /* < 0: in the state */
        win[s] = s >= keep ? 0.f : j < 0 ? state[(size_t)(keep + j) * C + c] : x[(size_t)j * a.ldx];
    }
    for (int t = t0; t < t1; t += kConvAhead) {
        float xv[kConvAhead];
#pragma unroll
        for (int r = 0; r < kConvAhead; r++) xv[r] = t + r < t1 ? x[(size_t)(t + r) * a.ldx] : 0.f;
#pragma unroll
        for (int r = 0; r < kConvAhead; r++) {
            if (t + r >= t1) break;
            /* oldest tap first (first a product, then fmaf), as gdn_conv.c */
            float acc = keep ? __fmul_rn(w[0], win[0]) : __fmul_rn(w[0], xv[r]);
#pragma unroll
            for (int k = 1; k < SPLASH_CUDA_GDN_MAX_K; k++)
                if (k < keep) acc = fmaf(w[k], win[k], acc);
                else if (k == keep) acc = fmaf(w[k], xv[r], acc);
#pragma unroll
            for (int s = 0; s < SPLASH_CUDA_GDN_MAX_K - 2; s++)
                if (s + 1 < keep) win[s] = win[s + 1];
#pragma unroll
            for (int s = 0; s < SPLASH_CUDA_GDN_MAX_K - 1; s++)
                if (s == keep - 1) win[s] = xv[r];
            y[(size_t)(t + r) * a.ldy] = siluf_(acc);
        }
    }
}

/* The early form (splash_cuda_gdn_conv's `early`) of a launch of at most
 * kConvEarlyRows rows a lane (one chunk), for the models' K = 4: the lane,
 * the taps and the state's K - 1 rows are read between launch_dependents and
 * the wait, so their loads overlap the kernels still running; after the wait
 * every row's input at once, then the rows as conv_rows_direct (the same
 * operations on the same values: the same bits) and the state update.  K a
 * constant and the rows unrolled, so taps, state and inputs stay in
 * registers. */
template <int K>
__device__ __forceinline__ void conv_early(const ConvArgs &a, int c) {
    constexpr int keep = K - 1;
    const splash_cuda_gdn_lane ln = a.lanes[blockIdx.y];
    const int C = a.C;
    float w[K], st[keep];
#pragma unroll
    for (int k = 0; k < K; k++) w[k] = a.wT[(size_t)k * C + c];
#pragma unroll
    for (int s = 0; s < keep; s++) st[s] = ln.conv_state[(size_t)s * C + c];
    pdl_wait();
    const float *x = a.x + (size_t)ln.first_row * a.ldx + c;
    const int n = ln.n_rows;
    float xv[kConvEarlyRows];
#pragma unroll
    for (int t = 0; t < kConvEarlyRows; t++) xv[t] = t < n ? x[(size_t)t * a.ldx] : 0.f;
    if (a.y) {
        float *y = a.y + (size_t)ln.first_row * a.ldy + c;
#pragma unroll
        for (int t = 0; t < kConvEarlyRows; t++) {
            if (t >= n) break;
            float acc = 0.f;
#pragma unroll
            for (int k = 0; k < K; k++) { /* oldest tap first, input t - keep + k (< 0: state) */
                const float src = t - keep + k < 0 ? st[t + k] : xv[t - keep + k];
                acc = k ? fmaf(w[k], src, acc) : __fmul_rn(w[k], src);
            }
            y[(size_t)t * a.ldy] = siluf_(acc);
        }
    }
    if (ln.update_conv && n > 0) {
        /* slot s takes input n - keep + s (< 0: the state's slot n + s), read again where it
         * lies (a register picked by the runtime n would put the arrays in local memory) */
        float nv[keep];
#pragma unroll
        for (int s = 0; s < keep; s++) {
            const int j = n - keep + s;
            nv[s] = j >= 0 ? x[(size_t)j * a.ldx] : ln.conv_state[(size_t)(keep + j) * C + c];
        }
#pragma unroll
        for (int s = 0; s < keep; s++) ln.conv_state[(size_t)s * C + c] = nv[s];
    }
}

template <bool kWindow, bool kEarly>
__global__ void gdn_conv_kernel(const ConvArgs a) {
    if constexpr (kEarly) {
        pdl_launch_dependents();
        const int c = blockIdx.x * kConvThreads + threadIdx.x;
        if (c < a.C) conv_early<kConvEarlyK>(a, c);
        return;
    }
    pdl_begin();
    const int c = blockIdx.x * kConvThreads + threadIdx.x;
    if (c >= a.C) return;
    const splash_cuda_gdn_lane ln = a.lanes[blockIdx.y];
    const int K = a.K, keep = K - 1, C = a.C;
    float *state = ln.conv_state;
    const float *x = a.x + (size_t)ln.first_row * a.ldx + c;
    if (a.y) {
        float *y = a.y + (size_t)ln.first_row * a.ldy + c;
        const int t0 = blockIdx.z * kConvChunk, t1 = min(ln.n_rows, t0 + kConvChunk);
        if constexpr (kWindow) conv_rows_window(a, state, x, y, c, t0, t1);
        else conv_rows_direct(a, state, x, y, c, t0, t1);
    }
    if (blockIdx.z == 0 && ln.update_conv && ln.n_rows > 0) {
        const int n = ln.n_rows;
        float nv[SPLASH_CUDA_GDN_MAX_K - 1];
#pragma unroll
        for (int s = 0; s < SPLASH_CUDA_GDN_MAX_K - 1; s++) {
            if (s < keep) {
                const int j = n - keep + s; /* the input that ends up in slot s */
                nv[s] = j >= 0 ? x[(size_t)j * a.ldx] : state[(size_t)(keep + j) * C + c];
            }
        }
#pragma unroll
        for (int s = 0; s < SPLASH_CUDA_GDN_MAX_K - 1; s++)
            if (s < keep) state[(size_t)s * C + c] = nv[s];
    }
}

__global__ void gdn_gates_kernel(const float *a, const float *b, size_t ldab, const float *neg_a,
                                 const float *dt_bias, int hv, float *g, float *beta, size_t ldgb) {
    pdl_begin();
    const size_t r = blockIdx.y;
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= hv) return;
    beta[r * ldgb + h] = sigmoidf_(b[r * ldab + h]);
    g[r * ldgb + h] = __fmul_rn(neg_a[h], softplusf_(__fadd_rn(a[r * ldab + h], dt_bias[h])));
}

struct RecArgs {
    splash_cuda_gdn_args p;
    float qscale;
    int ns; /* blocks (one cluster) per value head, kRecCols columns each */
};

/* Row-chunk buffers of one block (rows t0 .. t0 + kRecRows - 1 of its lane).
 * q and k are kept permuted so a thread of slice sl reads its key dims sl,
 * sl + 4, ... as consecutive float4: element i at [i & 3][i >> 2], each slice
 * padded by 4 floats (the four slices' float4 then fall in distinct banks). */
template <int DK>
struct RecSmem {
    static constexpr int NJ = DK / kSlices, SS = NJ + 4;
    float qn[kRecRows][kSlices * SS], kn[kRecRows][kSlices * SS];
    float v[kRecRows][kRecCols], z[kRecRows][kRecCols], o[kRecRows][kRecCols];
    float2 gb[kRecRows]; /* exp(g), beta */
    /* The gated norm's sums of o^2: [chunk parity][block r of the cluster][row],
     * block r's sum over its columns, stored here by block r itself (two
     * buffers: a block may store chunk c + 1's before a peer has read chunk
     * c's, never chunk c + 2's, which waits for the barrier the peer passes
     * only after its reads), and rs[row], the row's 1 / rms. */
    float ssq[2][kRecMaxNs][kRecRows];
    float rs[kRecRows];
};

/* EARLY (splash_cuda_gdn_args.early): the lane, its state and the weights
 * are read between launch_dependents and the wait, so their loads overlap
 * the kernels before; otherwise after both (pdl_begin). */
template <int DK, bool EARLY>
__global__ void __launch_bounds__(kRecCols * kSlices) gdn_recurrent_kernel(const RecArgs ra) {
    if constexpr (EARLY) pdl_launch_dependents();
    else pdl_begin();
    constexpr int NJ = DK / kSlices, SS = RecSmem<DK>::SS;
    const splash_cuda_gdn_args &a = ra.p;
    __shared__ __align__(16) RecSmem<DK> sm;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = kRecWarps;
    const int cl = tid >> 2, sl = tid & 3;         /* local column, key-dim slice */
    const int h = blockIdx.x / ra.ns, rank = blockIdx.x % ra.ns;
    const int c0 = rank * kRecCols, dv = a.dv, c = c0 + cl;
    const bool col = c < dv;
    const splash_cuda_gdn_lane ln = a.lanes[blockIdx.y];
    const int kh = h / (a.hv / a.hk);
    const size_t key_dim = (size_t)a.hk * DK, hs = (size_t)DK * dv, oc = (size_t)h * dv + c;

    float S[NJ]; /* S[sl + 4j][c] */
    const float *Sin = ln.s_in + (size_t)h * hs;
#pragma unroll
    for (int j = 0; j < NJ; j++) S[j] = col ? Sin[(size_t)(sl + kSlices * j) * dv + c] : 0.f;
    /* EARLY: the weights too (the gated norm's factor of the column this
     * thread writes there: i % kRecCols = tid % kRecCols, blockDim a multiple) */
    float e_na = 0.f, e_dt = 0.f, e_nw = 0.f;
    if constexpr (EARLY) {
        e_na = a.neg_a[h], e_dt = a.dt_bias[h];
        if (a.y && c0 + tid % kRecCols < dv) e_nw = a.norm_w[c0 + tid % kRecCols];
        pdl_wait();
    }
    /* Every block of the cluster running before any stores into a peer's
     * shared memory: arrived here, waited for before the first store.  After
     * the programmatic wait: arriving before it cost ~4 us a GDN layer
     * (session 40: 27B decode 6.20 ms against 6.02, 35B-A3B 2.20 against
     * 2.07; here 6.02 against 6.09 and 2.04 against 2.06, one round). */
    if (ra.ns > 1) asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    bool cluster_up = ra.ns == 1;

    for (int t0 = 0; t0 < ln.n_rows; t0 += kRecRows) {
        const int nt = min(kRecRows, ln.n_rows - t0);
        /* Everything a row needs that does not depend on the state, for the
         * chunk's rows at once (their loads in flight together): normalised
         * q and k (a warp a vector), the gates, v and z of the block's columns. */
        constexpr int kTasks = 2 * kRecRows / kRecWarps, kVals = kRecRows * kRecCols / (kRecWarps * 32);
        float x[kTasks][DK / 32]; /* every load issued before any is used */
#pragma unroll
        for (int j = 0; j < kTasks; j++) {
            const int task = warp + kRecWarps * j, t = task >> 1, isk = task & 1;
            if (task < 2 * nt) {
                const float *src = a.mixed + ((size_t)ln.first_row + t0 + t) * a.ldm + (size_t)isk * key_dim + (size_t)kh * DK;
#pragma unroll
                for (int i = 0; i < DK / 32; i++) x[j][i] = src[lane + 32 * i];
            }
        }
        float vz[2][kVals];
#pragma unroll
        for (int j = 0; j < kVals; j++) {
            const int i = tid + kRecWarps * 32 * j, t = i / kRecCols, cc = i % kRecCols;
            const size_t row = (size_t)ln.first_row + t0 + t;
            const bool ok = t < nt && c0 + cc < dv;
            vz[0][j] = ok ? a.mixed[row * a.ldm + 2 * key_dim + (size_t)h * dv + c0 + cc] : 0.f;
            vz[1][j] = ok && a.y ? a.z[row * a.ldz + (size_t)h * dv + c0 + cc] : 0.f;
        }
        if (tid < nt) {
            const size_t row = (size_t)ln.first_row + t0 + tid;
            const float av = a.a[row * a.ldab + h], bv = a.b[row * a.ldab + h];
            const float na = EARLY ? e_na : a.neg_a[h], dt = EARLY ? e_dt : a.dt_bias[h];
            const float g = __fmul_rn(na, softplusf_(__fadd_rn(av, dt)));
            sm.gb[tid] = make_float2(expf(g), sigmoidf_(bv));
        }
#pragma unroll
        for (int j = 0; j < kTasks; j++) {
            const int task = warp + kRecWarps * j, t = task >> 1, isk = task & 1;
            if (task < 2 * nt) { /* uniform in the warp */
                float ss = 0.f;
#pragma unroll
                for (int i = 0; i < DK / 32; i++) ss = fmaf(x[j][i], x[j][i], ss);
                ss = warp_sum(ss);
                const float rs = 1.0f / sqrtf(ss + 1e-6f);
                float *dst = isk ? sm.kn[t] : sm.qn[t];
#pragma unroll
                for (int i = 0; i < DK / 32; i++) {
                    const int e = lane + 32 * i;
                    dst[(e & 3) * SS + (e >> 2)] =
                        isk ? __fmul_rn(x[j][i], rs) : __fmul_rn(__fmul_rn(x[j][i], rs), ra.qscale);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < kVals; j++) {
            const int i = tid + kRecWarps * 32 * j;
            sm.v[i / kRecCols][i % kRecCols] = vz[0][j], sm.z[i / kRecCols][i % kRecCols] = vz[1][j];
        }
        __syncthreads();

        /* The recurrence, row after row: registers and shared reads only.
         * The sums over the key dims run in four interleaved chains, then
         * across the four slices of the column. */
        for (int t = 0; t < nt; t++) {
            const float2 gb = sm.gb[t];
            const float4 *kp = reinterpret_cast<const float4 *>(&sm.kn[t][sl * SS]);
            const float4 *qp = reinterpret_cast<const float4 *>(&sm.qn[t][sl * SS]);
            float m[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int i = 0; i < NJ / 4; i++) {
                const float4 k4 = kp[i];
                S[4 * i] = __fmul_rn(S[4 * i], gb.x), S[4 * i + 1] = __fmul_rn(S[4 * i + 1], gb.x);
                S[4 * i + 2] = __fmul_rn(S[4 * i + 2], gb.x), S[4 * i + 3] = __fmul_rn(S[4 * i + 3], gb.x);
                m[0] = fmaf(S[4 * i], k4.x, m[0]), m[1] = fmaf(S[4 * i + 1], k4.y, m[1]);
                m[2] = fmaf(S[4 * i + 2], k4.z, m[2]), m[3] = fmaf(S[4 * i + 3], k4.w, m[3]);
            }
            float mp = (m[0] + m[1]) + (m[2] + m[3]);
            mp += __shfl_xor_sync(kFull, mp, 1);
            mp += __shfl_xor_sync(kFull, mp, 2);
            const float delta = __fmul_rn(__fsub_rn(sm.v[t][cl], mp), gb.y);
            float op[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int i = 0; i < NJ / 4; i++) {
                const float4 k4 = kp[i], q4 = qp[i];
                S[4 * i] = fmaf(k4.x, delta, S[4 * i]), S[4 * i + 1] = fmaf(k4.y, delta, S[4 * i + 1]);
                S[4 * i + 2] = fmaf(k4.z, delta, S[4 * i + 2]), S[4 * i + 3] = fmaf(k4.w, delta, S[4 * i + 3]);
                op[0] = fmaf(S[4 * i], q4.x, op[0]), op[1] = fmaf(S[4 * i + 1], q4.y, op[1]);
                op[2] = fmaf(S[4 * i + 2], q4.z, op[2]), op[3] = fmaf(S[4 * i + 3], q4.w, op[3]);
            }
            float o = (op[0] + op[1]) + (op[2] + op[3]);
            o += __shfl_xor_sync(kFull, o, 1);
            o += __shfl_xor_sync(kFull, o, 2);
            if (sl == 0) {
                sm.o[t][cl] = o;
                if (a.o && col) a.o[((size_t)ln.first_row + t0 + t) * a.ldo + oc] = o;
            }
        }

        /* The gated norm over the head's dv columns: each block sums o^2
         * over its own columns (a warp a row) and stores the sum into every
         * block of the cluster; after one cluster barrier a thread a row adds
         * the blocks' sums in rank order (the same total in every block).
         * Until session 40 every output element read the peers' sums itself
         * after the barrier (ns dependent remote loads each) and a second
         * barrier kept the sums alive until all had. */
        if (a.y) {
            const int par = (t0 / kRecRows) & 1;
            cg::cluster_group cluster = cg::this_cluster();
            __syncthreads();
            if (!cluster_up) {
                asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
                cluster_up = true;
            }
            for (int t = warp; t < nt; t += nwarps) {
                float s = 0.f;
                for (int cc = lane; cc < kRecCols; cc += 32) s = fmaf(sm.o[t][cc], sm.o[t][cc], s);
                s = warp_sum(s);
                float *own = &sm.ssq[par][rank][t];
                if (lane < ra.ns) *(ra.ns > 1 ? cluster.map_shared_rank(own, lane) : own) = s; /* lane r: block r's copy */
            }
            if (ra.ns > 1) cluster.sync(); else __syncthreads();
            if (tid < nt) {
                float ss = 0.f;
                for (int r = 0; r < ra.ns; r++) ss += sm.ssq[par][r][tid];
                sm.rs[tid] = 1.0f / sqrtf(ss / (float)dv + a.eps);
            }
            __syncthreads();
            for (int i = tid; i < nt * kRecCols; i += blockDim.x) {
                const int t = i / kRecCols, cc = i % kRecCols;
                if (c0 + cc >= dv) continue;
                const size_t row = (size_t)ln.first_row + t0 + t, idx = (size_t)h * dv + c0 + cc;
                const float nw = EARLY ? e_nw : a.norm_w[c0 + cc];
                a.y[row * a.ldy + idx] = __fmul_rn(__fmul_rn(nw, __fmul_rn(sm.o[t][cc], sm.rs[t])), siluf_(sm.z[t][cc]));
            }
        }
        __syncthreads(); /* the chunk's buffers are rewritten by the next */
    }

    /* the arrival above waited for where no norm did (a lane of no rows, or
     * no norm); a block never exits before a peer's stores into it: those
     * precede the peer's arrival at the barrier this block passed */
    if (!cluster_up) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
    if (col && ln.s_out) { /* NULL: a verify lane's state is not kept (gdn.h) */
        float *So = ln.s_out + (size_t)h * hs;
#pragma unroll
        for (int j = 0; j < NJ; j++) So[(size_t)(sl + kSlices * j) * dv + c] = S[j];
    }
}

template <int DK>
int launch_rec(const RecArgs &ra, cudaStream_t s) {
    KernelLaunch c(dim3((unsigned)(ra.p.hv * ra.ns), (unsigned)ra.p.n_lanes, 1), dim3(kRecCols * kSlices, 1, 1), 0, s,
                   (unsigned)ra.ns, pdl_for("gdn_recurrent"));
    SPLASH_CUDA_TRY(ra.p.early ? cudaLaunchKernelEx(&c.lc, gdn_recurrent_kernel<DK, true>, ra)
                               : cudaLaunchKernelEx(&c.lc, gdn_recurrent_kernel<DK, false>, ra));
    return SPLASH_OK;
}

} /* namespace */

extern "C" int splash_cuda_gdn_conv(const float *wT, int C, int K, const splash_cuda_gdn_lane *lanes, int n_lanes,
                                    int max_lane_rows, const float *x, size_t ldx, float *y, size_t ldy, int early,
                                    struct CUstream_st *stream) {
    if (!wT || !lanes || !x || C < 1 || K < 1 || K > SPLASH_CUDA_GDN_MAX_K || n_lanes < 0 || n_lanes > 65535 ||
        max_lane_rows < 0)
        return SPLASH_E_INVALID;
    if (n_lanes == 0 || max_lane_rows == 0) return SPLASH_OK;
    const int chunks = y ? (max_lane_rows + kConvChunk - 1) / kConvChunk : 1;
    if (chunks > 65535) return SPLASH_E_INVALID;
    ConvArgs a = {wT, lanes, x, y, ldx, ldy, C, K};
    KernelLaunch c(dim3((unsigned)((C + kConvThreads - 1) / kConvThreads), (unsigned)n_lanes, (unsigned)chunks),
                   dim3(kConvThreads, 1, 1), 0, (cudaStream_t)stream, 1, pdl_for("gdn_conv"));
    if (early && K == kConvEarlyK && max_lane_rows <= kConvEarlyRows)
        SPLASH_CUDA_TRY(cudaLaunchKernelEx(&c.lc, gdn_conv_kernel<false, true>, a));
    else if (max_lane_rows >= kConvWindowRows)
        SPLASH_CUDA_TRY(cudaLaunchKernelEx(&c.lc, gdn_conv_kernel<true, false>, a));
    else
        SPLASH_CUDA_TRY(cudaLaunchKernelEx(&c.lc, gdn_conv_kernel<false, false>, a));
    return SPLASH_OK;
}

extern "C" int splash_cuda_gdn_gates(const float *a, const float *b, size_t ldab, const float *neg_a,
                                     const float *dt_bias, int rows, int hv, float *g, float *beta, size_t ldgb,
                                     struct CUstream_st *stream) {
    if (!a || !b || !neg_a || !dt_bias || !g || !beta || rows < 0 || rows > 65535 || hv < 1) return SPLASH_E_INVALID;
    if (rows == 0) return SPLASH_OK;
    SPLASH_CUDA_TRY(launch_kernel(gdn_gates_kernel, dim3((unsigned)((hv + 63) / 64), (unsigned)rows), 64, 0,
                                  (cudaStream_t)stream, a, b, ldab, neg_a, dt_bias, hv, g, beta, ldgb));
    return SPLASH_OK;
}

extern "C" int splash_cuda_gdn_args_check(const splash_cuda_gdn_args *a) {
    if (!a || !a->lanes || !a->mixed || !a->a || !a->b || !a->neg_a || !a->dt_bias || a->n_lanes < 0 ||
        a->n_lanes > 65535 || a->hk < 1 || a->hv < 1 || a->hv % a->hk || a->hv > 65535 || a->dv < 1 ||
        (a->y && (!a->z || !a->norm_w)))
        return SPLASH_E_INVALID;
    if (a->dv > SPLASH_CUDA_GDN_MAX_DV) return SPLASH_E_UNSUPPORTED;
    return SPLASH_OK;
}

extern "C" int splash_cuda_gdn_recurrent(const splash_cuda_gdn_args *a, struct CUstream_st *stream) {
    const int rc = splash_cuda_gdn_args_check(a);
    if (rc || a->n_lanes == 0) return rc;
    RecArgs ra;
    ra.p = *a;
    ra.qscale = (float)pow((double)a->dk, -0.5); /* as the CPU (gdn.c) */
    ra.ns = (a->dv + kRecCols - 1) / kRecCols;
    const cudaStream_t s = (cudaStream_t)stream;
    switch (a->dk) {
    case 32: return launch_rec<32>(ra, s);
    case 64: return launch_rec<64>(ra, s);
    case 128: return launch_rec<128>(ra, s);
    default: return SPLASH_E_UNSUPPORTED;
    }
}
