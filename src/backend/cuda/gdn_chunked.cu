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
 * Two kernels.  What a chunk needs before the state reaches it (q and k
 * normalised, the gates, A, the forward substitution giving W and U, the
 * output weights (q_i . k_j) exp(cum_i - cum_j)) does not depend on the
 * state, so gdn_chunk_prep_kernel makes it for many chunks at once (a
 * block per (head, chunk, lane)) into a workspace; the substitution's long
 * dependent chains (~1/4 of a chunk's time when one block did everything
 * in order) then run side by side.  Then one block of 512 threads per
 * (value head, lane) walks the lane's chunks in order (gdn_chunk_state_kernel),
 * copying each chunk's prepared parts in, with everything in shared memory
 * (~227 KB at dk = dv = 128 and one block a head, ~178 KB at two): the state
 * S [dk][dv + 8], the chunk's q and W [64][dk + 4], k [64][dk + 8], U
 * [64][dv + 8], A [64][64 + 4] (strides chosen so the tensor-core fragments'
 * loads hit 32 banks: Plan).  The state pass's three products of dv columns
 * (W S, Q S + A U, K^T U) run on the tensor cores as 3xTF32 (warp_mma:
 * every warp a few 16 x 8 output tiles of one row tile), separated by
 * barriers; on the CUDA cores (session 13's loops: 4 x 2 tiles a thread)
 * they were ~3/4 of the pass's instructions.  The prep's k.k and q.k
 * products and the forward substitution's work between blocks of 16 rows
 * run there too (pair_weights, forward_substitute).  Sums run in the tensor
 * cores' order, so the results are close to cpu_gdn_chunked (fp32-grade, not
 * bitwise); the q/k norms and the gates are the recurrence kernel's.  The chunk's outputs
 * go through shared memory (the W buffer, free by then) for the gated norm.
 *
 * Launches.  A group is the chunks the workspace holds; when a lane has
 * more chunks than that, groups take half the workspace each and one launch of
 * gdn_chunk_pass_kernel runs a group's state pass beside the next group's
 * prep (the state pass's blocks hold one head's columns each, 96 of 132
 * SMs on the 27B, and the prep's blocks fill the rest): the prep no longer
 * waits for the state pass before it, nor the state pass for a whole prep
 * (SPLASH_CUDA_GDN_OVERLAP=0: the two kernels a group, one after the
 * other).  The results do not depend on the groups.
 *
 * Loads.  Both kernels bring their inputs in as asynchronous copies, all in
 * flight at once (copy_rows_async), instead of loops of plain loads that
 * waited for each; the state pass asks L2 for the next chunk's prepared
 * parts while it computes this one (the workspace outgrows L2 at a long
 * prefill), and copies the gate z of the chunk's rows in while it updates
 * the state.
 *
 * C++ used: a template over dk; no STL.
 */
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/gdn.h"

namespace cg = cooperative_groups;
using namespace splash_cuda;

namespace {

constexpr int kC = SPLASH_CUDA_GDN_CHUNK;
/* Both kernels' threads: one block an SM either way (~150 KB of shared
 * memory for the prep, 170-220 KB for the state pass), so 16 warps to hide
 * latency; at 8 the prep's short loops over independent elements and the
 * state pass's shared loads left the SM idle (NOTES.md, sessions 12, 13). */
constexpr int kThreads = 512;
constexpr int kPrepThreads = 512;

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
    static constexpr int AS = kC + 4; /* the state pass's A */
    __host__ __device__ static int ss(int dv) { return dv + 8; } /* S and U rows */
    __host__ __device__ static size_t w_floats(int dv) {
        return (size_t)kC * (KS > dv ? KS : dv); /* W, later the chunk's outputs [L][dv]; Qc, later z */
    }
    __host__ __device__ static size_t floats(int dv) { /* dv: the block's slice */
        return (size_t)DK * ss(dv) + (size_t)kC * KT + 2 * w_floats(dv) + (size_t)kC * ss(dv) + (size_t)kC * AS +
               10 * kC;
    }
};

/* A prepared chunk in the workspace (floats): q exp(cum) and k exp(cum_L -
 * cum) (q, k normalised, q scaled; each product rounded once, as the state
 * pass used to round it), W = (I + A)^-1 (beta k exp(cum)) [kC][dk]; U =
 * (I + A)^-1 (beta v) [kC][dv]; the output weights (q_i . k_j) exp(cum_i -
 * cum_j) [kC][kC]; exp(cum), exp(cum_L - cum) [kC]; exp(cum_L). */
struct Slot {
    int q, k, w, u, a, ec, kd, el, floats;
    __host__ __device__ Slot(int dk, int dv) {
        q = 0, k = kC * dk, w = 2 * kC * dk, u = 3 * kC * dk, a = u + kC * dv, ec = a + kC * kC, kd = ec + kC;
        el = kd + kC, floats = el + 4;
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

    /* 1. q, k normalised in place (a warp per row) */
    for (int i = warp; i < L; i += nwarps) {
        for (int which = 0; which < 2; which++) {
            float *x = (which ? Kc : Qc) + (size_t)i * KS;
            float ss = 0.f;
            for (int r = lane; r < DK; r += 32) ss = fmaf(x[r], x[r], ss);
            ss = warp_sum(ss);
            const float rs = 1.0f / sqrtf(ss + 1e-6f);
            for (int r = lane; r < DK; r += 32)
                x[r] = which ? __fmul_rn(x[r], rs) : __fmul_rn(__fmul_rn(x[r], rs), ca.qscale);
        }
    }
    __syncthreads();
    if (tid == 0) { /* cum in row order, as the CPU */
        float c = 0.f;
        for (int i = 0; i < L; i++) cum[i] = c = __fadd_rn(c, gg[i]);
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

    /* 3. A[i][j] = (kb_i . k_j) exp(cum_i - cum_j), j < i */
    pair_weights<DK, kPrepThreads>(A, kPrepAS, W, Kc, cum, L, true, warp, lane);
    __syncthreads();

    /* 4. W_i = kb_i exp(cum_i) */
    for (int e = tid; e < L * DK; e += kPrepThreads) {
        const int i = e / DK, r = e % DK;
        W[(size_t)i * KS + r] = __fmul_rn(W[(size_t)i * KS + r], ecum[i]);
    }
    __syncthreads();

    /* 5. forward substitution over the columns of W (dk) and U (dv) (its own barriers) */
    forward_substitute<DK>(W, U, up, dv, A, L, tid);

    /* 6. the output weights: A <- (q_i . k_j) exp(cum_i - cum_j), j <= i */
    pair_weights<DK, kPrepThreads>(A, kPrepAS, Qc, Kc, cum, L, false, warp, lane);
    __syncthreads();

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
}
template <int DK>
__global__ void __launch_bounds__(kPrepThreads, 1) gdn_chunk_prep_kernel(const ChunkArgs ca) {
    pdl_begin();
    extern __shared__ __align__(16) float sm[];
    chunk_prep_block<DK>(ca, blockIdx.x, blockIdx.y, blockIdx.z, sm);
}

/* Part 2, the state's pass: one block per (value head, lane) (or a cluster
 * of ns, each on dv / ns of the head's columns) walks chunks [c0, c0 + nc)
 * of its lane in order with the state S in shared memory: the chunk's
 * prepared parts are copied in, then vnew = U - W S, the outputs Q S + A
 * vnew, the state update S e + K^T vnew, each product on the tensor cores
 * (warp_mma: 16 warps share its 16 x 8 tiles). */
template <int DK>
__device__ __forceinline__ void chunk_state_block(const ChunkArgs &ca, const int bx, const int ly, float *sm) {
    constexpr int KS = Plan<DK>::KS, KT = Plan<DK>::KT, AS = Plan<DK>::AS;
    constexpr int MU = kC / 16 * (SPLASH_CUDA_GDN_MAX_DV / 8) / 16; /* units a warp, outputs [kC][dv] */
    constexpr int MS = DK / 16 * (SPLASH_CUDA_GDN_MAX_DV / 8) / 16; /* units a warp, the state [DK][dv] */
    static_assert(MU <= 4, "the outputs' units fit the registers");
    static_assert(16 % (kC / 16) == 0 && 16 % (DK / 16) == 0, "a warp's units share their row tile");
    const splash_cuda_gdn_args &a = ca.p;
    const int ns = ca.ns, h = bx / ns, rank = bx % ns; /* rank in the head's cluster */
    const int dvf = a.dv, dv = dvf / ns, cs = rank * dv; /* the head's columns; this block's: [cs, cs + dv) */
    const int SS = Plan<DK>::ss(dv);
    float *S = sm;                                   /* [DK][SS] */
    float *Kc = S + (size_t)DK * SS;                 /* [kC][KT] */
    float *Qc = Kc + (size_t)kC * KT;                /* [kC][KS], then the gate z [kC][dv] */
    float *W = Qc + Plan<DK>::w_floats(dv);          /* [kC][KS], then outputs [kC][dv] */
    float *U = W + Plan<DK>::w_floats(dv);           /* [kC][SS] */
    float *A = U + (size_t)kC * SS;                  /* [kC][AS] */
    float *ecum = A + (size_t)kC * AS, *kd = ecum + kC;
    float *el = kd + kC;                             /* [1] exp(cum_L) */
    float *rss = el + kC;                            /* [4][kC] sums of o^2 over each quarter of dvf */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = kThreads / 32;
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
    const int Ct = dv / 8; /* column tiles of 8 */
    for (int c = ca.c0; c < c1; c++) {
        const int t0 = c * kC, L = min(kC, ln.n_rows - t0);
        const size_t row0 = (size_t)ln.first_row + t0;
        __syncthreads(); /* the previous chunk is done with every buffer (and S is loaded) */
        const float *gs = slot_at(c);
        copy_rows_async<kThreads>(Qc, KS, gs + so.q, DK, L, DK, tid);
        copy_rows_async<kThreads>(Kc, KT, gs + so.k, DK, L, DK, tid);
        copy_rows_async<kThreads>(W, KS, gs + so.w, DK, L, DK, tid);
        copy_rows_async<kThreads>(U, SS, gs + so.u + cs, dvf, L, dv, tid);
        copy_rows_async<kThreads>(A, AS, gs + so.a, kC, L, kC, tid);
        copy_rows_async<kThreads>(ecum, 0, gs + so.ec, 0, 1, 2 * kC + 4, tid); /* ecum | kd | el, as in the slot */
        cp_async_commit();
        /* a short chunk's rows past L as zeros: the products run over all kC
         * rows, and stale values (NaN even, in memory never written) would
         * reach the state through 0 x stale */
        for (int e = tid; e < (kC - L) * DK; e += kThreads) {
            const int i = L + e / DK, r = e % DK;
            Qc[(size_t)i * KS + r] = 0.f, Kc[(size_t)i * KT + r] = 0.f, W[(size_t)i * KS + r] = 0.f;
        }
        for (int e = tid; e < (kC - L) * dv; e += kThreads) U[(size_t)(L + e / dv) * SS + e % dv] = 0.f;
        if (c + 1 < c1) { /* the next chunk's slot: from HBM into L2 while this one computes */
            const char *nx = reinterpret_cast<const char *>(slot_at(c + 1));
            for (size_t off = (size_t)tid * 128; off < (size_t)so.floats * sizeof(float); off += (size_t)kThreads * 128)
                prefetch_l2(nx + off);
        }
        cp_async_wait<0>();
        __syncthreads();

        /* B operands: S [r][c] and U [j][c] at (t, g) and (t + 4, g) */
        auto b_of = [&](const float *X) {
            return [=](int kk, int c0, float &b0, float &b1) { frag_b_rows(X, SS, kk, c0, g, t, b0, b1); };
        };
        /* a row-major A operand [i][k], row stride st */
        auto a_rows = [&](const float *X, int st) {
            return [=](int rt, int kk, FragA &f) { frag_a_rows(f, X, st, 16 * rt, kk, g, t); };
        };

        /* 6. vnew = U - W S (into U) */
        {
            float acc[MU][4] = {};
            warp_mma<MU, kC / 16, DK>(acc, Ct, DK, warp, a_rows(W, KS), b_of(S));
#pragma unroll
            for (int m = 0; m < MU; m++) {
                const int u = warp + 16 * m;
                if (u >= kC / 16 * Ct) break;
                const int i = 16 * (u % (kC / 16)) + g, cc = 8 * (u / (kC / 16)) + 2 * t;
                float *p = U + (size_t)i * SS + cc;
                p[0] = __fsub_rn(p[0], acc[m][0]), p[1] = __fsub_rn(p[1], acc[m][1]);
                p[8 * SS] = __fsub_rn(p[8 * SS], acc[m][2]), p[8 * SS + 1] = __fsub_rn(p[8 * SS + 1], acc[m][3]);
            }
        }
        __syncthreads();

        /* 7. o_i = (q_i exp(cum_i)) S + sum_{j<=i} A[i][j] vnew_j  (into the W buffer; Qc
         * holds q exp(cum)); A's j > i entries are not the chunk's (masked) */
        float *O = W;
        {
            float acc[MU][4] = {};
            const int rt = warp % (kC / 16);
            warp_mma<MU, kC / 16, DK>(acc, Ct, DK, warp, a_rows(Qc, KS), b_of(S));
            warp_mma<MU, kC / 16, kC>(acc, Ct, 16 * (rt + 1), warp,
                         [=](int rt_, int kk, FragA &f) {
                             const int i = 16 * rt_ + g, j = kk + t;
                             const float *p = A + i * AS + j;
                             f.set(j <= i ? p[0] : 0.f, j <= i + 8 ? p[8 * AS] : 0.f, j + 4 <= i ? p[4] : 0.f,
                                   j + 4 <= i + 8 ? p[8 * AS + 4] : 0.f);
                         },
                         b_of(U));
#pragma unroll
            for (int m = 0; m < MU; m++) {
                const int u = warp + 16 * m;
                if (u >= kC / 16 * Ct) break;
                const int i = 16 * rt + g, cc = 8 * (u / (kC / 16)) + 2 * t;
                *reinterpret_cast<float2 *>(O + (size_t)i * dv + cc) = make_float2(acc[m][0], acc[m][1]);
                *reinterpret_cast<float2 *>(O + (size_t)(i + 8) * dv + cc) = make_float2(acc[m][2], acc[m][3]);
            }
        }
        __syncthreads();
        /* the gate z of the chunk's rows into the Qc buffer (free now), read in 8b */
        float *Z = Qc;
        if (a.y) {
            copy_rows_async<kThreads>(Z, dv, a.z + row0 * a.ldz + (size_t)h * dvf + cs, a.ldz, L, dv, tid);
            cp_async_commit();
        }
        /* 8a. S = S exp(cum_L) + sum_i (k_i kd_i) (x) vnew_i  (Kc holds k kd; A = Kc^T),
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
                        b_of(U));
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
        /* 8b. outputs: o, and the gated norm over the head's dvf columns (a
         * warp per row): sums of o^2 per quarter of dvf, added in quarter
         * order whatever ns is, so a lane's numbers do not depend on how
         * many blocks its head had (that depends on the batch) */
        const size_t oc = (size_t)h * dvf + cs;
        const int dq = dvf / 4, q0 = rank * 4 / ns, q1 = (rank + 1) * 4 / ns;
        for (int i = warp; i < L; i += nwarps) {
            const size_t row = row0 + i;
            const float *oi = O + (size_t)i * dv;
            if (a.o)
                for (int c = lane; c < dv; c += 32) a.o[row * a.ldo + oc + c] = oi[c];
            if (a.y)
                for (int q = q0; q < q1; q++) {
                    float ss = 0.f;
                    for (int c = q * dq - cs + lane; c < (q + 1) * dq - cs; c += 32) ss = fmaf(oi[c], oi[c], ss);
                    ss = warp_sum(ss);
                    if (lane == 0) rss[q * kC + i] = ss;
                }
        }
        if (a.y) {
            cp_async_wait<0>(); /* Z: this thread's copies; the barrier makes every thread's visible */
            if (ns > 1) cg::this_cluster().sync(); else __syncthreads();
            for (int i = warp; i < L; i += nwarps) {
                const size_t row = row0 + i;
                const float *oi = O + (size_t)i * dv;
                float ss = 0.f;
                for (int q = 0; q < 4; q++) {
                    const int owner = q * ns / 4; /* the rank that summed quarter q */
                    const float *r = owner == rank ? rss : cg::this_cluster().map_shared_rank(rss, owner);
                    ss = __fadd_rn(ss, r[q * kC + i]);
                }
                const float rs = 1.0f / sqrtf(ss / (float)dvf + a.eps);
                for (int c = lane; c < dv; c += 32)
                    a.y[row * a.ldy + oc + c] =
                        __fmul_rn(__fmul_rn(a.norm_w[cs + c], __fmul_rn(oi[c], rs)), siluf_(Z[(size_t)i * dv + c]));
            }
            if (ns > 1) cg::this_cluster().sync(); /* the peers are done reading rss */
        }
    }
    __syncthreads();
    float *So = ln.s_out + (size_t)h * hs + cs;
    for (int e = tid; e < DK * dv; e += kThreads)
        So[(size_t)(e / dv) * dvf + e % dv] = S[(size_t)(e / dv) * SS + e % dv];
}
template <int DK>
__global__ void __launch_bounds__(kThreads, 1) gdn_chunk_state_kernel(const ChunkArgs ca) {
    pdl_begin();
    extern __shared__ __align__(16) float sm[];
    chunk_state_block<DK>(ca, blockIdx.x, blockIdx.y, sm);
}

/* A group's state pass and the next group's prep in one launch, over the
 * workspace's two halves (state reads one, prep writes the other): the
 * state pass's blocks (one or two an SM's worth of heads: 96 of 132 SMs on
 * the 27B) come first in the grid, the prep's fill the SMs they leave and
 * then the whole chip, so a group's prep no longer waits for the state
 * pass before it.  Blocks [0, n_state) are state blocks (x = head x ns +
 * rank, then lane; clusters of ns: whole clusters, as the state kernel's
 * grid), then n_prep prep blocks (head, chunk, lane), then padding to a
 * multiple of ns. */
struct PassArgs {
    ChunkArgs state, prep;
    int n_state, n_prep;
};
template <int DK>
__global__ void __launch_bounds__(kThreads, 1) gdn_chunk_pass_kernel(const PassArgs pa) {
    static_assert(kThreads == kPrepThreads, "one block size for both parts");
    pdl_begin();
    extern __shared__ __align__(16) float sm[];
    const int b = blockIdx.x;
    if (b < pa.n_state) {
        const int per = pa.state.p.hv * pa.state.ns;
        chunk_state_block<DK>(pa.state, b % per, b / per, sm);
    } else if (b - pa.n_state < pa.n_prep) {
        const int p = b - pa.n_state, hv = pa.prep.p.hv;
        chunk_prep_block<DK>(pa.prep, p % hv, p / hv % pa.prep.nc, p / hv / pa.prep.nc, sm);
    }
}

template <int DK>
constexpr size_t prep_smem_bytes() {
    return (3 * (size_t)kC * Plan<DK>::KS + (size_t)kC * (SPLASH_CUDA_GDN_MAX_DV + 8) + (size_t)kC * kPrepAS +
            6 * (size_t)kC) * sizeof(float);
}
/* The state pass's shared memory at dv / ns columns a block; the pass
 * kernel's: the larger of it and the prep's. */
template <int DK>
size_t state_smem_bytes(int dv, int ns, bool pass) {
    const size_t st = Plan<DK>::floats(dv / ns) * sizeof(float);
    return pass && prep_smem_bytes<DK>() > st ? prep_smem_bytes<DK>() : st;
}

/* How many clusters of ns state-pass blocks (dv / ns columns each) the GPU
 * holds at once (pass: in the pass kernel, with its shared memory):
 * clusters live inside a GPC, so the SM count alone does not tell.  Asked
 * once per (kernel, ns, columns) and remembered; a forward of a new batch
 * shape runs eagerly before the model captures it (cuda_graphs.cu), so the
 * first ask never falls inside a graph capture. */
template <int DK>
int clusters_resident(int ns, int dv, bool pass) {
    static int known[2][3][SPLASH_CUDA_GDN_MAX_DV / 4 + 1]; /* [pass][ns 1, 2, 4][block columns / 4]; 0: not asked */
    int &n = known[pass][ns == 4 ? 2 : ns - 1][dv / ns / 4];
    if (!n) {
        KernelLaunch c(dim3((unsigned)ns, 1, 1), dim3(kThreads, 1, 1), state_smem_bytes<DK>(dv, ns, pass), 0,
                       (unsigned)ns, false);
        int got = 0;
        const cudaError_t e = pass ? cudaOccupancyMaxActiveClusters(&got, gdn_chunk_pass_kernel<DK>, &c.lc)
                                   : cudaOccupancyMaxActiveClusters(&got, gdn_chunk_state_kernel<DK>, &c.lc);
        if (e != cudaSuccess || got < 1) got = -1, (void)cudaGetLastError(); /* unknown: this split is not taken */
        n = got;
    }
    return n;
}

template <int DK>
int set_smem_limits() {
    static bool attr_set = false; /* once per instantiation; setting it again is harmless */
    if (!attr_set) {
        const int st = (int)state_smem_bytes<DK>(SPLASH_CUDA_GDN_MAX_DV, 1, true);
        SPLASH_CUDA_TRY(cudaFuncSetAttribute(gdn_chunk_state_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)state_smem_bytes<DK>(SPLASH_CUDA_GDN_MAX_DV, 1, false)));
        SPLASH_CUDA_TRY(cudaFuncSetAttribute(gdn_chunk_prep_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)prep_smem_bytes<DK>()));
        SPLASH_CUDA_TRY(cudaFuncSetAttribute(gdn_chunk_pass_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize, st));
        attr_set = true;
    }
    return SPLASH_OK;
}

/* Split each head's columns over 2 or 4 blocks (a cluster) while the heads
 * alone leave SMs idle (one 27B lane: 48 heads on 132 SMs; the 35B-A3B's
 * 32), as long as every block is resident at once (a block walks all its
 * chunks: a second wave would double the time).  The state pass's work is
 * all dv-side (the prep made the k-side), so it divides; each block still
 * copies the chunk's q, k, W and A. */
template <int DK>
int state_split(const splash_cuda_gdn_args &p, int max_split, bool pass) {
    for (int ns = max_split; ns >= 2; ns /= 2) /* whole column tiles of 8 a block */
        if (p.dv % (8 * ns) == 0 && clusters_resident<DK>(ns, p.dv, pass) >= p.hv * p.n_lanes) return ns;
    return 1;
}

/* One group's prep, then its state pass: two launches. */
template <int DK>
int launch_chunked(const ChunkArgs &ca_in, int max_split, cudaStream_t s) {
    if (int rc = set_smem_limits<DK>()) return rc;
    ChunkArgs ca = ca_in;
    ca.ns = state_split<DK>(ca.p, max_split, false);
    SPLASH_CUDA_TRY(launch_kernel(gdn_chunk_prep_kernel<DK>, dim3((unsigned)ca.p.hv, (unsigned)ca.nc, (unsigned)ca.p.n_lanes),
                                  kPrepThreads, prep_smem_bytes<DK>(), s, ca));
    KernelLaunch c(dim3((unsigned)(ca.p.hv * ca.ns), (unsigned)ca.p.n_lanes, 1), dim3(kThreads, 1, 1),
                   state_smem_bytes<DK>(ca.p.dv, ca.ns, false), s, (unsigned)ca.ns);
    SPLASH_CUDA_TRY(cudaLaunchKernelEx(&c.lc, gdn_chunk_state_kernel<DK>, ca));
    return SPLASH_OK;
}

/* Every group through the pass kernel, groups of `group` chunks in the
 * workspace's two halves (base: a copy of the call's, ws its first half;
 * half: the floats of one): the first launch preps group 0, launch k runs
 * group k - 1's state pass and group k's prep, the last the last group's
 * state pass alone. */
template <int DK>
int launch_overlapped(const ChunkArgs &base, size_t half, int group, int chunks, int max_split, cudaStream_t s) {
    if (int rc = set_smem_limits<DK>()) return rc;
    const int ns = state_split<DK>(base.p, max_split, true);
    const int groups = (chunks + group - 1) / group;
    for (int k = 0; k <= groups; k++) {
        PassArgs pa;
        pa.state = pa.prep = base;
        pa.state.ns = pa.prep.ns = ns;
        pa.n_state = pa.n_prep = 0;
        if (k > 0) { /* group k - 1's state pass, over half (k - 1) % 2 */
            pa.state.c0 = (k - 1) * group, pa.state.nc = min(group, chunks - pa.state.c0);
            pa.state.p.ws = base.p.ws + ((k - 1) & 1) * half;
            pa.n_state = base.p.hv * ns * base.p.n_lanes;
        }
        if (k < groups) { /* group k's prep, into half k % 2 */
            pa.prep.c0 = k * group, pa.prep.nc = min(group, chunks - pa.prep.c0);
            pa.prep.p.ws = base.p.ws + (k & 1) * half;
            pa.n_prep = base.p.hv * pa.prep.nc * base.p.n_lanes;
        }
        const int blocks = (pa.n_state + pa.n_prep + ns - 1) / ns * ns;
        KernelLaunch c(dim3((unsigned)blocks, 1, 1), dim3(kThreads, 1, 1), state_smem_bytes<DK>(base.p.dv, ns, true),
                       s, (unsigned)ns);
        SPLASH_CUDA_TRY(cudaLaunchKernelEx(&c.lc, gdn_chunk_pass_kernel<DK>, pa));
    }
    return SPLASH_OK;
}

/* SPLASH_CUDA_GDN_OVERLAP=0 (read once): every group's prep and state pass
 * as two launches, one after the other (an A/B switch). */
bool overlap_on() {
    static const bool on = [] {
        const char *e = getenv("SPLASH_CUDA_GDN_OVERLAP");
        return !(e && e[0] == '0');
    }();
    return on;
}

/* A call's chunks (every lane's) in groups: per, the workspace floats of
 * a chunk of every lane; fit, the chunks the workspace holds. */
template <int DK>
int run_groups(ChunkArgs ca, size_t per, size_t fit, int chunks, int max_split, cudaStream_t s) {
    /* more chunks than the workspace holds: groups of half of it, the pass
     * kernel overlapping a group's state pass with the next group's prep
     * (the results do not depend on the groups: each chunk's prep is its
     * own, the state pass carries S between launches through s_out).  Not
     * for a lane the workspace holds (a 2,048-row chunk of a served prefill
     * is 32 chunks of the 27B's 37): cut in two for the overlap, 1,024 rows
     * took 600 us against 576 as one group (H200, test_cuda_ops) */
    const int pair = (size_t)chunks > fit && fit >= 2 ? (int)(fit / 2) : 0;
    if (overlap_on() && pair) return launch_overlapped<DK>(ca, per * (size_t)pair, pair, chunks, max_split, s);
    const int group = fit < (size_t)chunks ? (int)fit : chunks;
    for (ca.c0 = 0; ca.c0 < chunks; ca.c0 += group) {
        ca.nc = chunks - ca.c0 < group ? chunks - ca.c0 : group;
        if (int rc = launch_chunked<DK>(ca, max_split, s)) return rc;
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
    case 32: return run_groups<32>(ca, per, fit, chunks, max_split, (cudaStream_t)stream);
    case 64: return run_groups<64>(ca, per, fit, chunks, max_split, (cudaStream_t)stream);
    case 128: return run_groups<128>(ca, per, fit, chunks, max_split, (cudaStream_t)stream);
    default: return SPLASH_E_UNSUPPORTED;
    }
}

extern "C" size_t splash_cuda_gdn_chunked_ws_floats(int hv, int dk, int dv, int n_lanes, int chunks) {
    if (hv < 1 || dk < 1 || dv < 1 || n_lanes < 1 || chunks < 1) return 0;
    if (!splash_cuda_gdn_chunked_takes(dk, dv)) return 0;
    return slot_floats(hv, dk, dv) * (size_t)n_lanes * (size_t)chunks;
}
