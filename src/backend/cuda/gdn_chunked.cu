/* gdn_chunked.cu - the gated delta rule by chunks of 64 rows for prefill
 * (gdn.h), the CPU's gdn_chunked.c on the GPU.  Per chunk of L rows, with
 * cum = cumsum(g) and the rows' q, k already l2-normalised (q scaled):
 *
 *   A[i][j] = (beta_i k_i . k_j) exp(cum_i - cum_j)           j < i
 *   U = (I + A)^-1 (beta v),  W = (I + A)^-1 (beta k exp(cum))  (forward substitution)
 *   vnew_i = U_i - W_i S
 *   o_i = (q_i exp(cum_i)) S + sum_{j<=i} (q_i . k_j) exp(cum_i - cum_j) vnew_j
 *   S = S exp(cum_L) + sum_i (k_i exp(cum_L - cum_i)) (x) vnew_i
 *
 * Three kernels.  What a chunk needs before the state reaches it (q and k
 * normalised, the gates, A, the forward substitution giving W and U, the
 * output weights (q_i . k_j) exp(cum_i - cum_j)) does not depend on the
 * state, so gdn_chunk_prep_kernel makes it for many chunks at once (a
 * block per (head, chunk, lane)) into a workspace; the substitution's long
 * dependent chains (~1/4 of a chunk's time when one block did everything
 * in order) then run side by side.  Then one block of 512 threads per
 * (value head, lane) walks the lane's chunks in order (gdn_chunk_state_kernel),
 * copying each chunk's q, k, W and U in, with everything in shared memory
 * (~207 KB at dk = dv = 128 and one block a head, ~158 KB at two): the state
 * S [dk][dv + 8], the chunk's q and W [64][dk + 4], k [64][dk + 8], U
 * [64][dv + 8] (strides chosen so the tensor-core fragments' loads hit 32
 * banks: Plan).  It makes only what reads the state: W S and Q S, vnew, the
 * state's update K^T vnew, and leaves Q S and vnew in the chunk's slot;
 * gdn_chunk_out_kernel then finishes every chunk's outputs at once (+ A vnew,
 * the gated norm), two blocks an SM.  The products (W S, Q S, K^T vnew, A
 * vnew) run on the tensor cores as 3xTF32 (warp_mma: every warp a few 16 x
 * 8 output tiles of one row tile), separated by barriers; on the CUDA cores
 * (session 13's loops: 4 x 2 tiles a thread) they were ~3/4 of the state
 * pass's instructions.  The prep's k.k and q.k products and the forward
 * substitution's work between blocks of 16 rows run there too
 * (pair_weights, forward_substitute).  Sums run in the tensor cores' order,
 * so the results are close to cpu_gdn_chunked (fp32-grade, not bitwise);
 * the q/k norms and the gates are the recurrence kernel's.
 *
 * Launches.  A group is the chunks the workspace holds (44 of the 27B's in
 * the model's 384 MB); a group's three launches, one after the other, each
 * needing the one before.  The results do not depend on the groups.
 *
 * Loads.  The kernels bring their inputs in as asynchronous copies, all in
 * flight at once (copy_rows_async), instead of loops of plain loads that
 * waited for each; the state pass asks L2 for the next chunk's prepared
 * parts while it computes this one (the workspace outgrows L2 at a long
 * prefill).
 *
 * C++ used: a template over dk; no STL.
 */
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/gdn.h"

namespace cg = cooperative_groups;
using namespace splash_cuda;

namespace {

constexpr int kC = SPLASH_CUDA_GDN_CHUNK;
/* The kernels' threads: one block an SM for the prep and the state pass
 * (~150 KB of shared memory for the prep, 158-207 KB for the state pass), so 16 warps to hide
 * latency; at 8 the prep's short loops over independent elements and the
 * state pass's shared loads left the SM idle (NOTES.md, sessions 12, 13). */
constexpr int kThreads = 512;
constexpr int kPrepThreads = 512;

/* SPLASH_GDN_PROBE (bench/gpu/bench_gdn_chunked.sh --probe only; never in
 * the library): thread 0 of every block adds the cycles since its last mark
 * to a phase's total at each mark (the marks follow barriers, so thread 0's
 * time is the block's), and counts state-pass chunks and prep blocks. */
#ifdef SPLASH_GDN_PROBE
__device__ unsigned long long g_probe[32];
#define PROBE_START() long long probe_t = clock64()
#define PROBE(i)                                                                   \
    do {                                                                           \
        if (threadIdx.x == 0) {                                                    \
            const long long probe_now = clock64();                                 \
            atomicAdd(&g_probe[i], (unsigned long long)(probe_now - probe_t));     \
            probe_t = probe_now;                                                   \
        }                                                                          \
    } while (0)
#define PROBE_COUNT(i) do { if (threadIdx.x == 0) atomicAdd(&g_probe[i], 1ull); } while (0)
#else
#define PROBE_START() do { } while (0)
#define PROBE(i) do { } while (0)
#define PROBE_COUNT(i) do { } while (0)
#endif

/* warp_sum (device_util.cuh) of two and of four values at once: the same
 * butterfly, so the same bits each, with the rounds' shuffles interleaved. */
__device__ __forceinline__ void warp_sum2(float &a, float &b) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ta = __shfl_xor_sync(kFull, a, o), tb = __shfl_xor_sync(kFull, b, o);
        a += ta, b += tb;
    }
}
__device__ __forceinline__ void warp_sum4(float (&v)[4]) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float t[4];
#pragma unroll
        for (int k = 0; k < 4; k++) t[k] = __shfl_xor_sync(kFull, v[k], o);
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] += t[k];
    }
}

struct ChunkArgs {
    splash_cuda_gdn_args p;
    float qscale;
    int ns;     /* state pass: blocks (one cluster) per value head, each on dv / ns of its columns: 1, 2, 4 */
    int c0, nc; /* this launch pair's chunks of every lane: [c0, c0 + nc) (the workspace holds nc) */
};

/* Shared-memory plan in floats (dv runtime: the block's columns).  Row
 * strides chosen for the tensor-core fragments' shared loads (warp_mma):
 * a row-major A operand (Qc, W, A: element (g, t)) wants a stride = 4 mod 32,
 * a B operand or a transposed A (S, U, Kc: element (t, g)) one = 8 mod 32,
 * so a warp's 32 loads hit 32 banks. */
template <int DK>
struct Plan {
    static constexpr int KS = DK + 4; /* Qc, W (and the prep's rows: float4-aligned, see the top) */
    static constexpr int KT = DK + 8; /* the state pass's Kc, read transposed */
    static constexpr int AS = kC + 4; /* the outputs' A */
    __host__ __device__ static int ss(int dv) { return dv + 8; } /* S and U rows */
    __host__ __device__ static size_t state_floats(int dv) { /* dv: the block's slice; S, Kc, Qc, W, U, exp(cum_L) */
        return (size_t)DK * ss(dv) + (size_t)kC * KT + 2 * (size_t)kC * KS + (size_t)kC * ss(dv) + 4;
    }
    __host__ __device__ static size_t out_floats(int dv) { /* vnew (then the outputs), A, z */
        return (size_t)kC * ss(dv) + (size_t)kC * AS + (size_t)kC * dv;
    }
};

/* A prepared chunk in the workspace (floats): q exp(cum) and k exp(cum_L -
 * cum) (q, k normalised, q scaled; each product rounded once, as the state
 * pass used to round it), W = (I + A)^-1 (beta k exp(cum)) [kC][dk]; U =
 * (I + A)^-1 (beta v) [kC][dv], which the state pass replaces with vnew; the
 * output weights (q_i . k_j) exp(cum_i - cum_j) [kC][kC]; exp(cum), exp(cum_L
 * - cum) [kC]; exp(cum_L); Q S, the outputs' part from the state before the
 * chunk [kC][dv] (written by the state pass).  Every part starts 16-byte
 * aligned (dk, dv multiples of 8). */
struct Slot {
    int q, k, w, u, a, ec, kd, el, qs, floats;
    __host__ __device__ Slot(int dk, int dv) {
        q = 0, k = kC * dk, w = 2 * kC * dk, u = 3 * kC * dk, a = u + kC * dv, ec = a + kC * kC, kd = ec + kC;
        el = kd + kC, qs = el + 4, floats = qs + kC * dv;
    }
};
__host__ __device__ inline size_t slot_floats(int hv, int dk, int dv) { return (size_t)hv * Slot(dk, dv).floats; }

/* ---- the state pass's products on the tensor cores ------------------------
 * mma.sync m16n8k8 with tf32 operands, each fp32 operand split into a head
 * and a tail, x = hi + lo: hi x's top 19 bits (sign, exponent, 10 mantissa
 * bits: a tf32 as it is), lo = x - hi exactly, which the tensor core reads
 * truncated to tf32 (it ignores an operand's low 13 bits).  a hi b hi + a hi
 * b lo + a lo b hi then carries ~21 bits of each product (the dropped lo lo
 * term and lo's truncation are ~2^-20 of it), so the sums stay within
 * fp32-grade error of the CPU's, in another order (not bitwise).  Two
 * instructions a split: cvt.rna.tf32.f32 took seven (its rounding and
 * Inf/NaN checks in integer code), which made a first version slower than
 * the CUDA-core loops it replaced (NOTES.md, session 22).  Fragments, per the
 * PTX ISA (g = lane / 4, t = lane % 4): A (16 x 8, row major) a0 (g, t),
 * a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4); B (8 x 8) b0 (t, g),
 * b1 (t + 4, g); C (16 x 8) c0, c1 (g, 2t, 2t + 1), c2, c3 (g + 8, ...). */
__device__ __forceinline__ void tf32_split(float x, uint32_t &hi, uint32_t &lo) {
    hi = __float_as_uint(x) & 0xffffe000u;
    lo = __float_as_uint(__fsub_rn(x, __uint_as_float(hi)));
}
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* An A fragment from its four values (split), then d += A B for a B fragment
 * of two values: the small terms first. */
struct FragA {
    uint32_t hi[4], lo[4];
    __device__ __forceinline__ void set(float v0, float v1, float v2, float v3) {
        tf32_split(v0, hi[0], lo[0]), tf32_split(v1, hi[1], lo[1]);
        tf32_split(v2, hi[2], lo[2]), tf32_split(v3, hi[3], lo[3]);
    }
};
/* The fragments' loads from shared memory (every product here): an A
 * fragment of the row-major operand X [i][k] (row stride st) for rows i0..
 * i0 + 15 at k = kk.., and the B values (t, g), (t + 4, g) of a row-major
 * [k][n] operand at k = kk.., n = c0.. */
__device__ __forceinline__ void frag_a_rows(FragA &f, const float *X, int st, int i0, int kk, int g, int t) {
    const float *p = X + (i0 + g) * st + kk + t;
    f.set(p[0], p[8 * st], p[4], p[8 * st + 4]);
}
__device__ __forceinline__ void frag_b_rows(const float *X, int st, int kk, int c0, int g, int t, float &b0,
                                            float &b1) {
    const float *p = X + (kk + t) * st + c0 + g;
    b0 = p[0], b1 = p[4 * st];
}

__device__ __forceinline__ void mma3(float (&d)[4], const FragA &a, float b0, float b1) {
    uint32_t h0, l0, h1, l1;
    tf32_split(b0, h0, l0), tf32_split(b1, h1, l1);
    mma_tf32(d, a.lo, h0, h1);
    mma_tf32(d, a.hi, l0, l1);
    mma_tf32(d, a.hi, h0, h1);
}
/* d1 += A1 B and d2 += A2 B, B split once: each accumulator gets mma3's
 * three products in mma3's order (the same bits), the two chains interleaved. */
__device__ __forceinline__ void mma3_pair(float (&d1)[4], float (&d2)[4], const FragA &a1, const FragA &a2, float b0,
                                          float b1) {
    uint32_t h0, l0, h1, l1;
    tf32_split(b0, h0, l0), tf32_split(b1, h1, l1);
    mma_tf32(d1, a1.lo, h0, h1), mma_tf32(d2, a2.lo, h0, h1);
    mma_tf32(d1, a1.hi, l0, l1), mma_tf32(d2, a2.hi, l0, l1);
    mma_tf32(d1, a1.hi, h0, h1), mma_tf32(d2, a2.hi, h0, h1);
}

/* A warp's share of an (R x 16) x (Ct x 8) product over k in [0, kmax)
 * (kmax <= K, both multiples of 8; K a constant, so the loop unrolls and the
 * fragments' addresses are immediate offsets): units u = u0 + 16 m (m < MU,
 * u < R Ct; u0 the warp, or the warp + 16 x the units done), unit u the 16 x
 * 8 tile (row tile u % R, column tile u / R); 16 % R == 0, so every unit of a
 * warp has the same row tile and one A fragment a k-step serves them all.
 * la(rt, kk, frag) loads the A fragment of row tile rt at k = kk..kk+7;
 * lb(kk, c0, b0, b1) the B values (t, g) and (t + 4, g) of the column tile
 * at c0. */
template <int MU, int R, int K, class LA, class LB>
__device__ __forceinline__ void warp_mma(float (&acc)[MU][4], int Ct, int kmax, int u0, LA la, LB lb) {
    const int rt = u0 % R, nu = R * Ct;
#pragma unroll
    for (int kk = 0; kk < K; kk += 8) {
        if (kk >= kmax) break; /* warp-uniform */
        FragA a;
        la(rt, kk, a);
#pragma unroll
        for (int m = 0; m < MU; m++) {
            const int u = u0 + 16 * m;
            if (u >= nu) break; /* warp-uniform */
            float b0, b1;
            lb(kk, 8 * (u / R), b0, b1);
            mma3(acc[m], a, b0, b1);
        }
    }
}

/* rows x w floats from global memory (row stride ss) into shared memory (row
 * stride ds) as asynchronous copies, which the caller commits and waits for:
 * 16-byte pieces when every row starts 16-byte aligned on both sides, else
 * 4-byte ones. */
template <int NT>
__device__ __forceinline__ void copy_rows_async(float *dst, int ds, const float *src, size_t ss, int rows, int w,
                                                int tid) {
    const bool v4 = (w | ds) % 4 == 0 && ss % 4 == 0 && ((uintptr_t)src & 15) == 0 && (smem_addr(dst) & 15) == 0;
    if (v4) {
        const int w4 = w / 4;
        for (int e = tid; e < rows * w4; e += NT) {
            const int i = e / w4, c = 4 * (e % w4);
            cp_async16(smem_addr(dst + (size_t)i * ds + c), src + (size_t)i * ss + c, 16);
        }
    } else {
        for (int e = tid; e < rows * w; e += NT) {
            const int i = e / w, c = e % w;
            cp_async4(smem_addr(dst + (size_t)i * ds + c), src + (size_t)i * ss + c);
        }
    }
}

/* A[i][j] = (X_i . Y_j) exp(cum_i - cum_j) for j < i (strict) or j <= i, i
 * < L (A's row stride as), X and Y rows of stride KS: X Y^T on the tensor cores (warp_mma, all
 * 64 x 64 tiles; the entries past the diagonal are not stored).  B (k = r, n
 * = j) is Y's row j read along r: with KS = 4 mod 32 a warp's loads hit 32
 * banks as the A operand's do. */
template <int DK, int NT>
__device__ __forceinline__ void pair_weights(float *A, int as, const float *X, const float *Y, const float *cum, int L,
                                             bool strict, int warp, int lane) {
    static_assert(NT == 512, "warp_mma's units assume 16 warps");
    constexpr int KS = Plan<DK>::KS, R = kC / 16, MU = R * (kC / 8) / 16;
    const int g = lane >> 2, t = lane & 3;
    float acc[MU][4] = {};
    warp_mma<MU, R, DK>(
        acc, kC / 8, DK, warp,
        [=](int rt, int kk, FragA &f) { frag_a_rows(f, X, KS, 16 * rt, kk, g, t); },
        [=](int kk, int c0, float &b0, float &b1) { /* Y^T: Y's row c0 + g read along k */
            const float *p = Y + (c0 + g) * KS + kk + t;
            b0 = p[0], b1 = p[4];
        });
#pragma unroll
    for (int m = 0; m < MU; m++) {
        const int u = warp + 16 * m;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = 16 * (u % R) + g + 8 * (e >> 1), j = 8 * (u / R) + 2 * t + (e & 1);
            if (i < L && (strict ? j < i : j <= i)) A[i * as + j] = __fmul_rn(acc[m][e], expf(cum[i] - cum[j]));
        }
    }
}

/* The forward substitution x_i -= sum_{j<i} A[i][j] x_j, i = 1 .. L-1, over
 * every column of W (dk, row stride KS) and U (dv, row stride up), A's row
 * stride AP: by blocks of 16 rows.  Block p's rows first lose the solved rows
 * before the block, A[p][0, 16p) X[0, 16p), on the tensor cores (3xTF32,
 * warp_mma: one row tile, a warp a few column tiles), then the block's own
 * rows in order, a thread per column with its 16 values in registers.  The
 * column-at-a-time substitution it replaces ran 64-long dependent chains on
 * half the threads (2,016 FMAs a column).  Rows past L hold garbage and are
 * never stored. */
constexpr int kPrepAS = kC + 4; /* the prep's A rows: 4 mod 32, for the A fragments */
template <int DK>
__device__ __forceinline__ void forward_substitute(float *W, float *U, int up, int dv, const float *A, int L, int tid) {
    constexpr int KS = Plan<DK>::KS, AP = kPrepAS;
    constexpr int MU = ((DK + SPLASH_CUDA_GDN_MAX_DV) / 8 + 15) / 16;
    const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3, ncol = DK + dv;
    for (int r0 = 0; r0 < L; r0 += 16) {
        if (r0) {
            float acc[MU][4] = {};
            warp_mma<MU, 1, kC>(
                acc, ncol / 8, r0, warp,
                [=](int, int kk, FragA &f) { frag_a_rows(f, A, AP, r0, kk, g, t); },
                [=](int kk, int c0, float &b0, float &b1) {
                    const bool w = c0 < DK; /* a column tile lies in W or in U */
                    frag_b_rows(w ? W : U, w ? KS : up, kk, w ? c0 : c0 - DK, g, t, b0, b1);
                });
#pragma unroll
            for (int m = 0; m < MU; m++) {
                const int u = warp + 16 * m;
                if (u >= ncol / 8) break;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = r0 + g + 8 * (e >> 1), c = 8 * u + 2 * t + (e & 1);
                    float *x = c < DK ? W + i * KS + c : U + i * up + (c - DK);
                    *x = __fsub_rn(*x, acc[m][e]);
                }
            }
            __syncthreads();
        }
        for (int col = tid; col < ncol; col += kPrepThreads) {
            float *X = col < DK ? W + col : U + (col - DK);
            const int st = col < DK ? KS : up;
            float x[16];
#pragma unroll
            for (int i = 0; i < 16; i++) x[i] = r0 + i < L ? X[(r0 + i) * st] : 0.f;
#pragma unroll
            for (int i = 1; i < 16; i++)
#pragma unroll
                for (int j = 0; j < i; j++) x[i] = fmaf(-A[(r0 + i) * AP + r0 + j], x[j], x[i]);
#pragma unroll
            for (int i = 1; i < 16; i++)
                if (r0 + i < L) X[(r0 + i) * st] = x[i];
        }
        __syncthreads();
    }
}

/* Part 1, every chunk at once: a block per (value head, chunk, lane) makes
 * what the chunk needs before the state reaches it: the normalised q and
 * k, the gates, A and the forward substitution (W, U), the output weights.
 * The chunk is the lane's c0 + cy; its slot in the workspace (lane, cy,
 * head). */
template <int DK>
__device__ __forceinline__ void chunk_prep_block(const ChunkArgs &ca, const int h, const int cy, const int lz,
                                                 float *sm) {
    constexpr int KS = Plan<DK>::KS;
    const splash_cuda_gdn_args &a = ca.p;
    const splash_cuda_gdn_lane ln = a.lanes[lz];
    const int t0 = (ca.c0 + cy) * kC;
    if (t0 >= ln.n_rows) return;
    const int dv = a.dv; /* the head's every column */
    float *Kc = sm;                                  /* [kC][KS] */
    float *Qc = Kc + (size_t)kC * KS;                /* [kC][KS] */
    float *W = Qc + (size_t)kC * KS;                 /* [kC][KS] */
    const int up = dv + 8;                           /* U's rows: B fragments on 32 banks */
    float *U = W + (size_t)kC * KS;                  /* [kC][up] */
    float *A = U + (size_t)kC * up;                  /* [kC][kPrepAS] */
    float *cum = A + (size_t)kC * kPrepAS, *ecum = cum + kC, *kd = ecum + kC, *bet = kd + kC, *gg = bet + kC;
    float *el = gg + kC;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = kPrepThreads / 32;
    const int kh = h / (a.hv / a.hk);
    const size_t key_dim = (size_t)a.hk * DK;
    const int L = min(kC, ln.n_rows - t0);
    const size_t row0 = (size_t)ln.first_row + t0;
    PROBE_START();
    PROBE_COUNT(24);

    /* 0. the chunk's q, k (the head's key head) and v rows in, all at once;
     * the gates meanwhile (a thread a row) */
    const float *mrow = a.mixed + row0 * a.ldm;
    copy_rows_async<kPrepThreads>(Qc, KS, mrow + (size_t)kh * DK, a.ldm, L, DK, tid);
    copy_rows_async<kPrepThreads>(Kc, KS, mrow + key_dim + (size_t)kh * DK, a.ldm, L, DK, tid);
    copy_rows_async<kPrepThreads>(U, up, mrow + 2 * key_dim + (size_t)h * dv, a.ldm, L, dv, tid);
    cp_async_commit();
    if (tid < L) {
        const size_t gi = (row0 + tid) * a.ldab + h;
        bet[tid] = sigmoidf_(a.b[gi]);
        gg[tid] = __fmul_rn(a.neg_a[h], softplusf_(__fadd_rn(a.a[gi], a.dt_bias[h])));
    }
    cp_async_wait<0>();
    __syncthreads();
    PROBE(16);

    /* 1. cum in row order, as the CPU, by the last warp's first thread (the
     * gates read 16 at once, then their dependent adds in registers),
     * beside the other warps' first rows of: q, k normalised in place (a warp
     * per row, q's and k's sums interleaved) */
    if (tid == kPrepThreads - 32) {
        float c = 0.f;
        for (int i0 = 0; i0 < L; i0 += 16) {
            float gr[16];
#pragma unroll
            for (int i = 0; i < 16; i++) gr[i] = i0 + i < L ? gg[i0 + i] : 0.f;
#pragma unroll
            for (int i = 0; i < 16; i++)
                if (i0 + i < L) cum[i0 + i] = c = __fadd_rn(c, gr[i]);
        }
    }
    for (int i = warp; i < L; i += nwarps) {
        float *xq = Qc + (size_t)i * KS, *xk = Kc + (size_t)i * KS;
        float sq = 0.f, sk = 0.f;
        for (int r = lane; r < DK; r += 32) sq = fmaf(xq[r], xq[r], sq), sk = fmaf(xk[r], xk[r], sk);
        warp_sum2(sq, sk);
        const float rq = 1.0f / sqrtf(sq + 1e-6f), rk = 1.0f / sqrtf(sk + 1e-6f);
        for (int r = lane; r < DK; r += 32) xq[r] = __fmul_rn(__fmul_rn(xq[r], rq), ca.qscale), xk[r] = __fmul_rn(xk[r], rk);
    }
    __syncthreads();

    /* 2. exp(cum), kd, U = beta v, W = beta k */
    const float last = cum[L - 1];
    for (int i = tid; i < L; i += kPrepThreads) {
        ecum[i] = expf(cum[i]);
        kd[i] = expf(last - cum[i]);
    }
    if (tid == 0) el[0] = expf(last);
    for (int e = tid; e < L * dv; e += kPrepThreads) {
        const int i = e / dv, c = e % dv;
        U[i * up + c] = __fmul_rn(U[i * up + c], bet[i]);
    }
    for (int e = tid; e < L * DK; e += kPrepThreads) {
        const int i = e / DK, r = e % DK;
        W[(size_t)i * KS + r] = __fmul_rn(Kc[(size_t)i * KS + r], bet[i]);
    }
    __syncthreads();
    PROBE(17);

    /* 3. A[i][j] = (kb_i . k_j) exp(cum_i - cum_j), j < i */
    pair_weights<DK, kPrepThreads>(A, kPrepAS, W, Kc, cum, L, true, warp, lane);
    __syncthreads();
    PROBE(18);

    /* 4. W_i = kb_i exp(cum_i) */
    for (int e = tid; e < L * DK; e += kPrepThreads) {
        const int i = e / DK, r = e % DK;
        W[(size_t)i * KS + r] = __fmul_rn(W[(size_t)i * KS + r], ecum[i]);
    }
    __syncthreads();
    PROBE(19);

    /* 5. forward substitution over the columns of W (dk) and U (dv) (its own barriers) */
    forward_substitute<DK>(W, U, up, dv, A, L, tid);
    PROBE(20);

    /* 6. the output weights: A <- (q_i . k_j) exp(cum_i - cum_j), j <= i */
    pair_weights<DK, kPrepThreads>(A, kPrepAS, Qc, Kc, cum, L, false, warp, lane);
    __syncthreads();
    PROBE(21);

    /* out in float4s (the workspace and its slots are 16-byte aligned) */
    const Slot so(DK, dv);
    float *g = a.ws + (((size_t)lz * ca.nc + cy) * a.hv + h) * so.floats;
    for (int e = tid; e < L * DK / 4; e += kPrepThreads) {
        const int i = e / (DK / 4), r = 4 * (e % (DK / 4));
        const size_t sp = (size_t)i * KS + r, gp = (size_t)i * DK + r;
        const float4 q = *reinterpret_cast<const float4 *>(Qc + sp), k = *reinterpret_cast<const float4 *>(Kc + sp);
        const float ec = ecum[i], d = kd[i];
        *reinterpret_cast<float4 *>(g + so.q + gp) =
            make_float4(__fmul_rn(q.x, ec), __fmul_rn(q.y, ec), __fmul_rn(q.z, ec), __fmul_rn(q.w, ec));
        *reinterpret_cast<float4 *>(g + so.k + gp) =
            make_float4(__fmul_rn(k.x, d), __fmul_rn(k.y, d), __fmul_rn(k.z, d), __fmul_rn(k.w, d));
        *reinterpret_cast<float4 *>(g + so.w + gp) = *reinterpret_cast<const float4 *>(W + sp);
    }
    for (int e = tid; e < L * dv / 4; e += kPrepThreads) {
        const int i = e / (dv / 4), c = 4 * (e % (dv / 4));
        *reinterpret_cast<float4 *>(g + so.u + i * dv + c) = *reinterpret_cast<const float4 *>(U + i * up + c);
    }
    for (int e = tid; e < L * kC / 4; e += kPrepThreads) {
        const int i = e / (kC / 4), c = 4 * (e % (kC / 4));
        *reinterpret_cast<float4 *>(g + so.a + i * kC + c) = *reinterpret_cast<const float4 *>(A + i * kPrepAS + c);
    }
    for (int i = tid; i < L; i += kPrepThreads) g[so.ec + i] = ecum[i], g[so.kd + i] = kd[i];
    if (tid == 0) g[so.el] = el[0];
    PROBE(22);
}
template <int DK>
__global__ void __launch_bounds__(kPrepThreads, 1) gdn_chunk_prep_kernel(const ChunkArgs ca) {
    pdl_begin();
    extern __shared__ __align__(16) float sm[];
    chunk_prep_block<DK>(ca, blockIdx.x, blockIdx.y, blockIdx.z, sm);
}

/* Part 2, the state's pass: one block per (value head, lane) (or a cluster
 * of ns, each on dv / ns of the head's columns) walks chunks [c0, c0 + nc)
 * of its lane in order with the state S in shared memory.  Only the products
 * that read S are made here, on the tensor cores: the chunk's q, k, W and U
 * are copied in, then W S and Q S in one pass over S (one split of each S
 * fragment for both), vnew = U - W S, and S = S exp(cum_L) + K^T vnew.  Q S
 * (the outputs' part from the state before the chunk) and vnew go to the
 * chunk's slot (Slot.qs, Slot.u in place), where part 3 finishes the
 * outputs, every chunk at once: made here, the rest of the outputs and the
 * gated norm took half of a chunk's time on the pass's serial path
 * (bench_gdn_chunked --probe, NOTES.md, session 39). */
template <int DK>
__device__ __forceinline__ void chunk_state_block(const ChunkArgs &ca, const int bx, const int ly, float *sm) {
    constexpr int KS = Plan<DK>::KS, KT = Plan<DK>::KT;
    constexpr int MU = kC / 16 * (SPLASH_CUDA_GDN_MAX_DV / 8) / 16; /* units a warp, [kC][dv] */
    constexpr int MS = DK / 16 * (SPLASH_CUDA_GDN_MAX_DV / 8) / 16; /* units a warp, the state [DK][dv] */
    static_assert(MU <= 4, "the units of W S and Q S fit the registers");
    static_assert(16 % (kC / 16) == 0 && 16 % (DK / 16) == 0, "a warp's units share their row tile");
    const splash_cuda_gdn_args &a = ca.p;
    const int ns = ca.ns, h = bx / ns, rank = bx % ns; /* rank in the head's cluster */
    const int dvf = a.dv, dv = dvf / ns, cs = rank * dv; /* the head's columns; this block's: [cs, cs + dv) */
    const int SS = Plan<DK>::ss(dv);
    float *S = sm;                                   /* [DK][SS] */
    float *Kc = S + (size_t)DK * SS;                 /* [kC][KT] */
    float *Qc = Kc + (size_t)kC * KT;                /* [kC][KS] */
    float *W = Qc + (size_t)kC * KS;                 /* [kC][KS] */
    float *U = W + (size_t)kC * KS;                  /* [kC][SS] */
    float *el = U + (size_t)kC * SS;                 /* [4]: exp(cum_L) first */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3; /* the fragments' coordinates */
    const splash_cuda_gdn_lane ln = a.lanes[ly];
    const size_t hs = (size_t)DK * dvf;
    const int n_chunks = (ln.n_rows + kC - 1) / kC, c1 = min(ca.c0 + ca.nc, n_chunks);
    if (ca.c0 >= c1) return; /* the whole cluster: same lane */

    /* the state: the lane's before its first chunk, else where the last launch left it */
    const float *Sin = (ca.c0 ? ln.s_out : ln.s_in) + (size_t)h * hs + cs;
    for (int e = tid; e < DK * dv; e += kThreads)
        S[(size_t)(e / dv) * SS + e % dv] = Sin[(size_t)(e / dv) * dvf + e % dv];

    const Slot so(DK, dvf);
    auto slot_at = [&](int c) { return a.ws + (((size_t)ly * ca.nc + (c - ca.c0)) * a.hv + h) * so.floats; };
    const int Ct = dv / 8, nu = kC / 16 * Ct; /* column tiles of 8; units of [kC][dv] */
    PROBE_START();
    for (int c = ca.c0; c < c1; c++) {
        const int t0 = c * kC, L = min(kC, ln.n_rows - t0);
        __syncthreads(); /* the previous chunk is done with every buffer (and S is loaded) */
        float *gs = slot_at(c);
        copy_rows_async<kThreads>(Qc, KS, gs + so.q, DK, L, DK, tid);
        copy_rows_async<kThreads>(Kc, KT, gs + so.k, DK, L, DK, tid);
        copy_rows_async<kThreads>(W, KS, gs + so.w, DK, L, DK, tid);
        copy_rows_async<kThreads>(U, SS, gs + so.u + cs, dvf, L, dv, tid);
        copy_rows_async<kThreads>(el, 0, gs + so.el, 0, 1, 4, tid);
        cp_async_commit();
        /* a short chunk's rows past L as zeros: the products run over all kC
         * rows, and stale values (NaN even, in memory never written) would
         * reach the state through 0 x stale */
        for (int e = tid; e < (kC - L) * DK; e += kThreads) {
            const int i = L + e / DK, r = e % DK;
            Qc[(size_t)i * KS + r] = 0.f, Kc[(size_t)i * KT + r] = 0.f, W[(size_t)i * KS + r] = 0.f;
        }
        for (int e = tid; e < (kC - L) * dv; e += kThreads) U[(size_t)(L + e / dv) * SS + e % dv] = 0.f;
        if (c + 1 < c1) { /* the next chunk's q, k, W and U (the slot's start): from HBM into L2 meanwhile */
            const char *nx = reinterpret_cast<const char *>(slot_at(c + 1));
            for (size_t off = (size_t)tid * 128; off < (size_t)so.a * sizeof(float); off += (size_t)kThreads * 128)
                prefetch_l2(nx + off);
        }
        cp_async_wait<0>();
        __syncthreads();
        PROBE(0);
        PROBE_COUNT(8);

        /* 6. W S and Q S (warp_mma's units and order: a warp's units share row tile
         * warp % 4), then vnew = U - W S into U and Q S to the slot */
        {
            float aw[MU][4] = {}, aq[MU][4] = {};
            const int rt = warp % (kC / 16);
#pragma unroll
            for (int kk = 0; kk < DK; kk += 8) {
                FragA fw, fq;
                frag_a_rows(fw, W, KS, 16 * rt, kk, g, t);
                frag_a_rows(fq, Qc, KS, 16 * rt, kk, g, t);
#pragma unroll
                for (int m = 0; m < MU; m++) {
                    const int u = warp + 16 * m;
                    if (u >= nu) break; /* warp-uniform */
                    float b0, b1;
                    frag_b_rows(S, SS, kk, 8 * (u / (kC / 16)), g, t, b0, b1);
                    mma3_pair(aw[m], aq[m], fw, fq, b0, b1);
                }
            }
#pragma unroll
            for (int m = 0; m < MU; m++) {
                const int u = warp + 16 * m;
                if (u >= nu) break;
                const int i = 16 * rt + g, cc = 8 * (u / (kC / 16)) + 2 * t;
                float *p = U + (size_t)i * SS + cc;
                p[0] = __fsub_rn(p[0], aw[m][0]), p[1] = __fsub_rn(p[1], aw[m][1]);
                p[8 * SS] = __fsub_rn(p[8 * SS], aw[m][2]), p[8 * SS + 1] = __fsub_rn(p[8 * SS + 1], aw[m][3]);
                float *q = gs + so.qs + (size_t)i * dvf + cs + cc;
                if (i < L) *reinterpret_cast<float2 *>(q) = make_float2(aq[m][0], aq[m][1]);
                if (i + 8 < L) *reinterpret_cast<float2 *>(q + 8 * dvf) = make_float2(aq[m][2], aq[m][3]);
            }
        }
        __syncthreads();
        PROBE(1);
        /* vnew's rows to the slot, for the outputs */
        for (int e = tid; e < L * (dv / 4); e += kThreads) {
            const int i = e / (dv / 4), cc = 4 * (e % (dv / 4));
            *reinterpret_cast<float4 *>(gs + so.u + (size_t)i * dvf + cs + cc) =
                *reinterpret_cast<const float4 *>(U + (size_t)i * SS + cc);
        }

        /* 8. S = S exp(cum_L) + sum_i (k_i kd_i) (x) vnew_i  (Kc holds k kd; A = Kc^T),
         * a warp's units four at a time (8 at once spilled registers at dk = 128) */
        const float e_l = el[0];
#pragma unroll 1
        for (int m0 = 0; m0 < MS; m0 += 4) {
            float acc[4][4] = {};
            warp_mma<4, DK / 16, kC>(acc, Ct, kC, warp + 16 * m0,
                        [=](int rt, int kk, FragA &f) {
                            const float *p = Kc + (kk + t) * KT + 16 * rt + g;
                            f.set(p[0], p[8], p[4 * KT], p[4 * KT + 8]);
                        },
                        [=](int kk, int c0, float &b0, float &b1) { frag_b_rows(U, SS, kk, c0, g, t, b0, b1); });
#pragma unroll
            for (int m = 0; m < 4; m++) {
                const int u = warp + 16 * (m0 + m);
                if (u >= DK / 16 * Ct) break;
                const int r = 16 * (u % (DK / 16)) + g, cc = 8 * (u / (DK / 16)) + 2 * t;
                float *p = S + (size_t)r * SS + cc;
                p[0] = __fadd_rn(__fmul_rn(p[0], e_l), acc[m][0]), p[1] = __fadd_rn(__fmul_rn(p[1], e_l), acc[m][1]);
                p[8 * SS] = __fadd_rn(__fmul_rn(p[8 * SS], e_l), acc[m][2]);
                p[8 * SS + 1] = __fadd_rn(__fmul_rn(p[8 * SS + 1], e_l), acc[m][3]);
            }
        }
        PROBE(2);
    }
    __syncthreads();
    float *So = ln.s_out + (size_t)h * hs + cs;
    for (int e = tid; e < DK * dv; e += kThreads)
        So[(size_t)(e / dv) * dvf + e % dv] = S[(size_t)(e / dv) * SS + e % dv];
}

/* Part 3, every chunk at once again: a block per (value head, chunk, lane)
 * finishes the chunk's outputs from its slot, which the state pass completed:
 * o_i = (q_i exp(cum_i)) S + sum_{j<=i} A[i][j] vnew_j over the head's dv
 * columns, the accumulators starting from the state pass's Q S (fp32, as
 * they held it) and the A vnew product continuing in warp_mma's order, so
 * the bits of the one product the state pass made before; then o itself
 * (a.o) and the gated norm y = norm_w (o rs) silu(z), rs from the sums of
 * o^2 over each quarter of dv added in quarter order (as when a head's
 * columns were split over blocks).  ~84 KB of shared memory and at most 64
 * registers a thread: two blocks an SM, one's loads beside the other's work. */
template <int DK>
__device__ __forceinline__ void chunk_out_block(const ChunkArgs &ca, const int h, const int cy, const int lz,
                                                float *sm) {
    constexpr int AS = Plan<DK>::AS;
    constexpr int MU = kC / 16 * (SPLASH_CUDA_GDN_MAX_DV / 8) / 16; /* units a warp, outputs [kC][dv] */
    static_assert(MU <= 4, "the outputs' units fit the registers");
    const splash_cuda_gdn_args &a = ca.p;
    const splash_cuda_gdn_lane ln = a.lanes[lz];
    const int t0 = (ca.c0 + cy) * kC;
    if (t0 >= ln.n_rows) return;
    const int dv = a.dv, SS = Plan<DK>::ss(dv);
    float *U = sm;                                   /* [kC][SS]: vnew, then the outputs [kC][dv] */
    float *A = U + (size_t)kC * SS;                  /* [kC][AS] */
    float *Z = A + (size_t)kC * AS;                  /* [kC][dv]: the gate z */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = kThreads / 32;
    const int g = lane >> 2, t = lane & 3;
    const int L = min(kC, ln.n_rows - t0);
    const size_t row0 = (size_t)ln.first_row + t0;
    PROBE_START();
    PROBE_COUNT(15);

    const Slot so(DK, dv);
    const float *gs = a.ws + (((size_t)lz * ca.nc + cy) * a.hv + h) * so.floats;
    copy_rows_async<kThreads>(U, SS, gs + so.u, dv, L, dv, tid);
    copy_rows_async<kThreads>(A, AS, gs + so.a, kC, L, kC, tid);
    if (a.y) copy_rows_async<kThreads>(Z, dv, a.z + row0 * a.ldz + (size_t)h * dv, a.ldz, L, dv, tid);
    cp_async_commit();
    /* vnew's rows past L as zeros: 0 x stale (NaN even) would reach the rows kept */
    for (int e = tid; e < (kC - L) * dv; e += kThreads) U[(size_t)(L + e / dv) * SS + e % dv] = 0.f;
    const int Ct = dv / 8, nu = kC / 16 * Ct, rt = warp % (kC / 16);
    float acc[MU][4];
#pragma unroll
    for (int m = 0; m < MU; m++) { /* Q S, rows past L as zeros (never stored) */
        const int u = warp + 16 * m, i = 16 * rt + g, cc = 8 * (u / (kC / 16)) + 2 * t;
        const float *q = gs + so.qs + (size_t)i * dv + cc;
        const float2 v0 = u < nu && i < L ? *reinterpret_cast<const float2 *>(q) : make_float2(0.f, 0.f);
        const float2 v1 = u < nu && i + 8 < L ? *reinterpret_cast<const float2 *>(q + 8 * dv) : make_float2(0.f, 0.f);
        acc[m][0] = v0.x, acc[m][1] = v0.y, acc[m][2] = v1.x, acc[m][3] = v1.y;
    }
    cp_async_wait<0>();
    __syncthreads();
    PROBE(9);

    warp_mma<MU, kC / 16, kC>(acc, Ct, 16 * (rt + 1), warp,
                              [=](int rt_, int kk, FragA &f) { /* A's j > i entries are not the chunk's */
                                  const int i = 16 * rt_ + g, j = kk + t;
                                  const float *p = A + i * AS + j;
                                  f.set(j <= i ? p[0] : 0.f, j <= i + 8 ? p[8 * AS] : 0.f, j + 4 <= i ? p[4] : 0.f,
                                        j + 4 <= i + 8 ? p[8 * AS + 4] : 0.f);
                              },
                              [=](int kk, int c0, float &b0, float &b1) { frag_b_rows(U, SS, kk, c0, g, t, b0, b1); });
    __syncthreads(); /* every warp is done reading vnew: the outputs take its place */
    float *O = U;
#pragma unroll
    for (int m = 0; m < MU; m++) {
        const int u = warp + 16 * m;
        if (u >= nu) break;
        const int i = 16 * rt + g, cc = 8 * (u / (kC / 16)) + 2 * t;
        *reinterpret_cast<float2 *>(O + (size_t)i * dv + cc) = make_float2(acc[m][0], acc[m][1]);
        *reinterpret_cast<float2 *>(O + (size_t)(i + 8) * dv + cc) = make_float2(acc[m][2], acc[m][3]);
    }
    __syncthreads();
    PROBE(10);

    const size_t oc = (size_t)h * dv;
    const int dq = dv / 4;
#pragma unroll
    for (int k = 0; k < kC / 16; k++) { /* a warp's rows, unrolled: their loads and sums interleave */
        const int i = warp + nwarps * k;
        if (i >= L) break;
        const size_t row = row0 + i;
        const float *oi = O + (size_t)i * dv;
        if (a.o)
            for (int c = lane; c < dv; c += 32) a.o[row * a.ldo + oc + c] = oi[c];
        if (a.y) {
            float sq[4] = {}; /* each quarter's sum as a warp, then the four in order */
#pragma unroll
            for (int q = 0; q < 4; q++)
                for (int c = q * dq + lane; c < (q + 1) * dq; c += 32) sq[q] = fmaf(oi[c], oi[c], sq[q]);
            warp_sum4(sq);
            float ss = 0.f;
#pragma unroll
            for (int q = 0; q < 4; q++) ss = __fadd_rn(ss, sq[q]);
            const float rs = 1.0f / sqrtf(ss / (float)dv + a.eps);
            const float *zr = Z + (size_t)i * dv;
            for (int c = lane; c < dv; c += 32)
                a.y[row * a.ldy + oc + c] = __fmul_rn(__fmul_rn(a.norm_w[c], __fmul_rn(oi[c], rs)), siluf_(zr[c]));
        }
    }
    PROBE(11);
}
template <int DK>
__global__ void __launch_bounds__(kThreads, 1) gdn_chunk_state_kernel(const ChunkArgs ca) {
    pdl_begin();
    extern __shared__ __align__(16) float sm[];
    chunk_state_block<DK>(ca, blockIdx.x, blockIdx.y, sm);
}
template <int DK>
__global__ void __launch_bounds__(kThreads, 2) gdn_chunk_out_kernel(const ChunkArgs ca) {
    pdl_begin();
    extern __shared__ __align__(16) float sm[];
    chunk_out_block<DK>(ca, blockIdx.x, blockIdx.y, blockIdx.z, sm);
}

template <int DK>
constexpr size_t prep_smem_bytes() {
    return (3 * (size_t)kC * Plan<DK>::KS + (size_t)kC * (SPLASH_CUDA_GDN_MAX_DV + 8) + (size_t)kC * kPrepAS +
            6 * (size_t)kC) * sizeof(float);
}
template <int DK>
size_t out_smem_bytes(int dv) {
    return Plan<DK>::out_floats(dv) * sizeof(float);
}
/* The state pass's shared memory at dv / ns columns a block. */
template <int DK>
size_t state_smem_bytes(int dv, int ns) {
    return Plan<DK>::state_floats(dv / ns) * sizeof(float);
}

/* How many clusters of ns state-pass blocks (dv / ns columns each) the GPU
 * holds at once: clusters live inside a GPC, so the SM count alone does not
 * tell.  Asked once per (ns, columns) and remembered; a forward of a new
 * batch shape runs eagerly before the model captures it (cuda_graphs.cu), so
 * the first ask never falls inside a graph capture. */
template <int DK>
int clusters_resident(int ns, int dv) {
    static int known[3][SPLASH_CUDA_GDN_MAX_DV / 4 + 1]; /* [ns 1, 2, 4][block columns / 4]; 0: not asked */
    int &n = known[ns == 4 ? 2 : ns - 1][dv / ns / 4];
    if (!n) {
        KernelLaunch c(dim3((unsigned)ns, 1, 1), dim3(kThreads, 1, 1), state_smem_bytes<DK>(dv, ns), 0,
                       (unsigned)ns, false);
        int got = 0;
        const cudaError_t e = cudaOccupancyMaxActiveClusters(&got, gdn_chunk_state_kernel<DK>, &c.lc);
        if (e != cudaSuccess || got < 1) got = -1, (void)cudaGetLastError(); /* unknown: this split is not taken */
        n = got;
    }
    return n;
}

template <int DK>
int set_smem_limits() {
    static bool attr_set = false; /* once per instantiation; setting it again is harmless */
    if (!attr_set) {
        SPLASH_CUDA_TRY(cudaFuncSetAttribute(gdn_chunk_state_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)state_smem_bytes<DK>(SPLASH_CUDA_GDN_MAX_DV, 1)));
        SPLASH_CUDA_TRY(cudaFuncSetAttribute(gdn_chunk_prep_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)prep_smem_bytes<DK>()));
        SPLASH_CUDA_TRY(cudaFuncSetAttribute(gdn_chunk_out_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)out_smem_bytes<DK>(SPLASH_CUDA_GDN_MAX_DV)));
        attr_set = true;
    }
    return SPLASH_OK;
}

/* Split each head's columns over 2 or 4 blocks (a cluster) while the heads
 * alone leave SMs idle (one 27B lane: 48 heads on 132 SMs; the 35B-A3B's
 * 32), as long as every block is resident at once (a block walks all its
 * chunks: a second wave would double the time).  The state pass's work is
 * all dv-side (the prep made the k-side), so it divides; each block still
 * copies the chunk's q, k and W.  Since session 39 a cluster's blocks share
 * nothing (the gated norm that summed across them moved to the outputs'
 * kernel); the launch keeps its clusters, whose residency the occupancy API
 * answers, as measured. */
template <int DK>
int state_split(const splash_cuda_gdn_args &p, int max_split) {
    for (int ns = max_split; ns >= 2; ns /= 2) /* whole column tiles of 8 a block */
        if (p.dv % (8 * ns) == 0 && clusters_resident<DK>(ns, p.dv) >= p.hv * p.n_lanes) return ns;
    return 1;
}

/* One group: its prep, its state pass, its outputs (three launches; each
 * needs all of the one before: a chunk's state pass the state from the
 * chunks before it, its outputs the state pass's Q S and vnew). */
template <int DK>
int launch_group(const ChunkArgs &ca_in, int max_split, cudaStream_t s) {
    ChunkArgs ca = ca_in;
    ca.ns = state_split<DK>(ca.p, max_split);
    const dim3 chunks_grid((unsigned)ca.p.hv, (unsigned)ca.nc, (unsigned)ca.p.n_lanes);
    SPLASH_CUDA_TRY(launch_kernel(gdn_chunk_prep_kernel<DK>, chunks_grid, kPrepThreads, prep_smem_bytes<DK>(), s, ca));
    KernelLaunch c(dim3((unsigned)(ca.p.hv * ca.ns), (unsigned)ca.p.n_lanes, 1), dim3(kThreads, 1, 1),
                   state_smem_bytes<DK>(ca.p.dv, ca.ns), s, (unsigned)ca.ns);
    SPLASH_CUDA_TRY(cudaLaunchKernelEx(&c.lc, gdn_chunk_state_kernel<DK>, ca));
    SPLASH_CUDA_TRY(launch_kernel(gdn_chunk_out_kernel<DK>, chunks_grid, kThreads, out_smem_bytes<DK>(ca.p.dv), s, ca));
    return SPLASH_OK;
}

/* A call's chunks (every lane's) in groups of the `fit` chunks the
 * workspace holds.  The results do not depend on the groups: each chunk's
 * prep and outputs are its own, and the state pass carries S between
 * launches through s_out.  (Session 38 overlapped a group's state pass with
 * the next group's prep in one launch; with the outputs out of the state
 * pass, the prep on the SMs the state pass leaves became the longer part:
 * 27B 32K 18.6 ms against 15.7 for the groups one after the other, before
 * Q S moved into the state pass.) */
template <int DK>
int run_groups(ChunkArgs ca, size_t fit, int chunks, int max_split, cudaStream_t s) {
    if (int rc = set_smem_limits<DK>()) return rc;
    const int group = fit < (size_t)chunks ? (int)fit : chunks;
    for (ca.c0 = 0; ca.c0 < chunks; ca.c0 += group) {
        ca.nc = chunks - ca.c0 < group ? chunks - ca.c0 : group;
        if (int rc = launch_group<DK>(ca, max_split, s)) return rc;
    }
    return SPLASH_OK;
}

} /* namespace */

extern "C" int splash_cuda_gdn_chunked(const splash_cuda_gdn_args *a, struct CUstream_st *stream) {
    const int rc = splash_cuda_gdn_args_check(a);
    if (rc || a->n_lanes == 0) return rc;
    if (!splash_cuda_gdn_chunked_takes(a->dk, a->dv)) return SPLASH_E_UNSUPPORTED; /* gdn.h */
    ChunkArgs ca;
    ca.p = *a;
    /* SPLASH_CUDA_GDN_SPLIT=1|2 caps the state pass's split of a head (4;
     * state_split): an A/B switch */
    static const int max_split = [] {
        const char *e = getenv("SPLASH_CUDA_GDN_SPLIT");
        return e && (atoi(e) == 1 || atoi(e) == 2) ? atoi(e) : 4;
    }();
    ca.qscale = (float)pow((double)a->dk, -0.5); /* as the CPU (gdn.c) */
    ca.ns = 1, ca.c0 = 0, ca.nc = 0;
    /* the lanes' chunks in groups the workspace holds: a prep launch makes
     * a group's chunks (every lane's, in parallel), the state pass walks them */
    const size_t per = slot_floats(a->hv, a->dk, a->dv) * (size_t)a->n_lanes;
    const int chunks = (a->max_lane_rows + kC - 1) / kC;
    if (!a->ws || a->ws_floats < per || a->max_lane_rows < 1) return SPLASH_E_INVALID;
    const size_t fit = a->ws_floats / per;
    switch (a->dk) {
    case 32: return run_groups<32>(ca, fit, chunks, max_split, (cudaStream_t)stream);
    case 64: return run_groups<64>(ca, fit, chunks, max_split, (cudaStream_t)stream);
    case 128: return run_groups<128>(ca, fit, chunks, max_split, (cudaStream_t)stream);
    default: return SPLASH_E_UNSUPPORTED;
    }
}

extern "C" size_t splash_cuda_gdn_chunked_ws_floats(int hv, int dk, int dv, int n_lanes, int chunks) {
    if (hv < 1 || dk < 1 || dv < 1 || n_lanes < 1 || chunks < 1) return 0;
    if (!splash_cuda_gdn_chunked_takes(dk, dv)) return 0;
    return slot_floats(hv, dk, dv) * (size_t)n_lanes * (size_t)chunks;
}

#ifdef SPLASH_GDN_PROBE
/* The probe's totals (bench_gdn_chunked.cu): n of them into out, zeroed after
 * when reset; returns how many there are. */
extern "C" int splash_cuda_gdn_probe_read(unsigned long long *out, int n, int reset) {
    unsigned long long h[32];
    if (cudaMemcpyFromSymbol(h, g_probe, sizeof h) != cudaSuccess) return 0;
    for (int i = 0; i < n && i < 32; i++) out[i] = h[i];
    if (reset) {
        memset(h, 0, sizeof h);
        if (cudaMemcpyToSymbol(g_probe, h, sizeof h) != cudaSuccess) return 0;
    }
    return 32;
}
extern "C" const char *splash_cuda_gdn_probe_name(int i) {
    static const char *const names[32] = {
        "state: copies in, S out", "state: vnew = U - W S", "state: vnew out, S update", 0, 0, 0, 0, 0,
        "state chunks", "out: copies in", "out: Q S + A vnew", "out: o, gated norm", 0, 0, 0, "out blocks",
        "prep: q k v gates in", "prep: norms, cum, scales", "prep: A = kb k^T", "prep: W scaled",
        "prep: substitution", "prep: q k^T", "prep: out to workspace", 0, "prep blocks"};
    return i >= 0 && i < 32 ? names[i] : 0;
}
#endif
