/* attention_int8_flash.cu - bulk prefill rows (calls with a split of
 * SPLASH_CUDA_ATTN_SPLIT_LONG or longer: splash_cuda_attn_bulk_split) over
 * int8 pages, flash style: the query
 * vectors are the products' M side, so a block of 8 warps takes 128 of them
 * against one staged copy of each K / V tile, and a warp's scores become
 * its P operand in registers.
 *
 * Why.  A 32K prompt's prefill spent ~40% of its time in attention (27B,
 * 6.0K tokens/s at 32K against 8.7K at 8K: ~4.5 us a token per 1K of
 * average context, ~90 TFLOP/s).  attention_int8_wide.cu, built for verify
 * rows, puts the positions on M: a block takes 32 query vectors, so each
 * staged tile serves 32 vectors, and its arithmetic is fp32 grade: q as
 * three 8-bit digits (three integer mma per score tile) and P as fp16 hi +
 * lo (two fp16 mma per output tile).  Prefill is fp16 grade elsewhere (the
 * products' GEMM), so here:
 *   scores   S[q][pos] = Qd (16 q x 32 dims, s8) . K^T (32 dims x 8 pos,
 *            s8, ldmatrix straight from the staged rows), q as two 8-bit
 *            digits (q 2^k rounded to an integer x, |x| < 2^14, x = 256 hi
 *            + lo, lo in [-128, 127]): ~15 bits of q; each digit's sum is
 *            exact in int32 and, started from the bits of 1.5 * 2^23, exact
 *            as a float (|sum| < 2^22 at head_dim 256 with |K| <= 127)
 *   softmax  online per query vector over 32 positions at a time, base 2
 *   output   O[q][dim] += P' (16 q x 16 pos, fp16) . V (16 pos x 8 dims,
 *            fp16, widened once a block, ldmatrix.trans), P' = p vs 2^e
 *            (the V scale of each position, and a power of two from the
 *            split's largest V scale, as the other layouts), P' formed from
 *            the scores' C fragments with no shuffle
 * so a (16 q, 32 pos) piece takes 2 x 8 integer mma for the scores and 16
 * fp16 mma for the output at head_dim 256, and K is never converted.
 *
 * A block: one (lane, kv head, split, chunk of <= 128 query vectors), 8
 * warps, warp w the chunk's vectors 16 w .. 16 w + 15 (vector v: row v / G,
 * head v % G of the kv head's group).  Stages of 64 positions, K and V
 * copied by cp.async two stages ahead (stage_copy_async); V widened to
 * fp16 into two buffers by the threads that copied it (widen_own), so a
 * stage needs one barrier: measured against a barrier before and after a
 * block-wide widening, 27B 1,024 rows at 31,744 positions 4,396 -> 3,899
 * us.  The warps take a stage in two halves of 32 positions (a warp skips
 * positions none of its vectors sees).  ~204 KB of shared memory at
 * head_dim 256 and 243 registers: 1 block an SM, 8 warps.
 *
 * Results per vector: the same partials / one-split outputs as the other
 * layouts (the combine merges them), depending only on the vector's own
 * inputs, the split, and (where P' falls below fp16's normal range) the
 * power of two from the block's V scales, as the other layouts.  Error
 * against cpu_attention: ~2e-4 relative, from P' in fp16 (test_cuda_ops'
 * bound 1e-3).  SPLASH_CUDA_ATTN_FLASH=0 sends the long splits' lanes back
 * to attention_int8_wide.cu (an A/B switch).
 *
 * Measured (H200, bench/gpu/bench_attention.cu, one 27B lane, us and
 * causal TFLOP/s, flash / wide): 4,096 rows from 0 1,481 (139) / 2,522
 * (82); 1,024 rows after 16,384 2,160 (197) / 3,818 (111); 1,024 after
 * 31,744 3,899 (208) / 7,186 (113).  Nsight Compute at the middle shape:
 * a scheduler issues in 34% of its cycles (2 warps each: registers and
 * shared memory allow one block), the largest stalls fixed-latency
 * dependencies and the shared / MUFU scoreboard: latency, not a pipe,
 * bounds it.
 *
 * C++ used: templates over head_dim, a lambda; no STL.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/attention_int8.cuh"
#include "backend/cuda/attention_split.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/q4_tile.cuh"

using namespace splash_cuda;
using namespace splash_cuda::int8_attn;

namespace {

constexpr int kWarps = kFlashQ / 16;
constexpr int kThreads = kWarps * 32;
constexpr int kSets = 3;                 /* row-address and scale sets: stage s uses set s % 3 */
constexpr int kMagic = 0x4B400000;       /* the bits of 1.5 * 2^23 */
constexpr float kMagicF = 12582912.0f;   /* 1.5 * 2^23 */

template <int HD>
struct FlashGeo {
    static constexpr int ST = kStage;     /* positions a stage */
    static constexpr int KP = HD + 16;    /* bytes per staged int8 K row and per q digit row */
    static constexpr int VP = 2 * HD + 16; /* bytes per fp16 V row */
    static constexpr int KS = HD / 32;    /* k-steps of the scores */
    static constexpr int NT = HD / 8;     /* n-tiles of the output */
    /* shared memory, bytes: K [2][ST][KP], V landing [2][ST][HD], V fp16 [2][ST][VP], q digits
     * [kWarps][hi, lo][16][KP], row addresses [kSets][ST], K and V scales [kSets][ST] each, red[kWarps] */
    static constexpr size_t kb = 0, vl = kb + 2 * ST * KP, v16 = vl + 2 * (size_t)ST * HD;
    static constexpr size_t qd = v16 + 2 * (size_t)ST * VP, rows = qd + (size_t)kWarps * 2 * 16 * KP;
    static constexpr size_t ksc = rows + kSets * ST * sizeof(void *);
    static constexpr size_t vsc = ksc + kSets * ST * 4, red = vsc + kSets * ST * 4;
    static constexpr size_t bytes = red + kWarps * 4;
};

/* The warp's query vectors as two 8-bit digits into its shared area (hi at
 * qd, lo at qd + 16 KP; row v = the warp's vector v, zeros past nv): q_digits.
 * Returns 2^-k of vector lane / 2. */
template <int HD>
__device__ __forceinline__ float load_q_digits(const AttnArgs &a, const splash_cuda_attn_lane &ln, int kvh, int wq0,
                                               int nv, uint8_t *qd) {
    using F = FlashGeo<HD>;
    const float inv = q_digits<HD>(a, ln, kvh, wq0, nv, [qd](int v, int d, uint32_t wh, uint32_t wl) {
        *reinterpret_cast<uint32_t *>(qd + v * F::KP + d) = wh;
        *reinterpret_cast<uint32_t *>(qd + (16 + v) * F::KP + d) = wl;
    });
    __syncwarp();
    return inv;
}

/* A warp's running state: O[n] (c 0, 1: vector g, dims 8 n + 2 t, + 1; c 2,
 * 3: vector g + 8, times P's power of two), the max m (base 2, scaled) and
 * this lane's share of the sum l of each of its two vectors. */
template <int HD>
struct FlashState {
    float O[HD / 8][4];
    float m[2], l[2];
};

/* Positions s0 .. s0 + 31 against the warp's 16 vectors.  kaddr / vaddr /
 * qaddr: the lane's ldmatrix addresses at these positions' K rows, their
 * fp16 V rows and the warp's digit rows; ks / vs: the positions' scales;
 * qf[i]: 2^-k scale log2 e of vector g (i 0) and g + 8 (1); lim[i]: the
 * first position the vector does not see (its context, at most p1). */
template <int HD>
__device__ __forceinline__ void flash_half(FlashState<HD> &fs, uint32_t qaddr, uint32_t kaddr, uint32_t vaddr,
                                           const float *ks, const float *vs, int s0, const float (&qf)[2],
                                           const int (&lim)[2], float psc) {
    using F = FlashGeo<HD>;
    const int t = threadIdx.x & 3;
    /* scores: digit sums of vectors g (i 0, 1) and g + 8 (i 2, 3), positions 8 n + 2 t, + 1 */
    int acc[4][2][4];
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
        for (int d = 0; d < 2; d++) acc[n][d][0] = acc[n][d][1] = acc[n][d][2] = acc[n][d][3] = kMagic;
#pragma unroll
    for (int j = 0; j < F::KS; j++) {
        uint32_t qh[4], ql[4];
        ldsm_x4(qaddr + 32 * j, qh);
        ldsm_x4(qaddr + 16 * F::KP + 32 * j, ql);
#pragma unroll
        for (int np = 0; np < 2; np++) {
            uint32_t k[4]; /* b0, b1 of positions 16 np .. + 7, then of + 8 .. + 15 */
            ldsm_x4(kaddr + 16 * np * F::KP + 32 * j, k);
            imma_ss(acc[2 * np][0], qh, k[0], k[1]);
            imma_ss(acc[2 * np][1], ql, k[0], k[1]);
            imma_ss(acc[2 * np + 1][0], qh, k[2], k[3]);
            imma_ss(acc[2 * np + 1][1], ql, k[2], k[3]);
        }
    }
    float s[4][4], c[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 4; n++) {
        const float2 k2 = *reinterpret_cast<const float2 *>(ks + 8 * n + 2 * t);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = i >> 1, pos = s0 + 8 * n + 2 * t + (i & 1);
            const float S = fmaf(__int_as_float(acc[n][0][i]) - kMagicF, 256.f, __int_as_float(acc[n][1][i]) - kMagicF);
            const float x = pos < lim[r] ? S * (i & 1 ? k2.y : k2.x) * qf[r] : -INFINITY;
            s[n][i] = x;
            c[r] = fmaxf(c[r], x);
        }
    }
    float al[2];
    uint32_t pa[4][2]; /* P' of n-tile n: vector g's pair, vector g + 8's */
    online_softmax<4>(s, c, fs.m, fs.l, vs + 2 * t, psc, pa, al);
    if (__any_sync(kFull, al[0] != 1.f || al[1] != 1.f))
#pragma unroll
        for (int n = 0; n < F::NT; n++) fs.O[n][0] *= al[0], fs.O[n][1] *= al[0], fs.O[n][2] *= al[1], fs.O[n][3] *= al[1];
    /* O += P' V, 16 positions a k-step: A = (n-tile 2 kk: a0 vector g, a1 g + 8; 2 kk + 1: a2, a3) */
#pragma unroll
    for (int kk = 0; kk < 2; kk++) {
        const uint32_t a0 = pa[2 * kk][0], a1 = pa[2 * kk][1], a2 = pa[2 * kk + 1][0], a3 = pa[2 * kk + 1][1];
#pragma unroll
        for (int d2 = 0; d2 < F::NT / 2; d2++) {
            uint32_t v[4]; /* b0, b1 of dims 16 d2 .. + 7, then of + 8 .. + 15 */
            ldsm_x4_trans(vaddr + 16 * kk * F::VP + 32 * d2, v);
            mma16816(fs.O[2 * d2], a0, a1, a2, a3, v[0], v[1]);
            mma16816(fs.O[2 * d2 + 1], a0, a1, a2, a3, v[2], v[3]);
        }
    }
}

/* The V pieces this thread copied (stage_copy_async's: 16 bytes of a row,
 * pieces tid, tid + kThreads, ...) widened to fp16: no barrier between the
 * copy's wait and the widening, since a thread reads only what its own
 * cp.async wrote. */
template <int HD>
__device__ __forceinline__ void widen_own(const uint8_t *Vl, uint8_t *V16) {
    using F = FlashGeo<HD>;
    constexpr int RP = HD / 16;
    static_assert(F::ST * RP % kThreads == 0, "a thread's V pieces are tid + kThreads m in stage_copy_async");
#pragma unroll
    for (int i = threadIdx.x; i < F::ST * RP; i += kThreads) {
        const int r = i / RP, c = i % RP;
        const uint4 w = *reinterpret_cast<const uint4 *>(Vl + r * HD + 16 * c);
        uint4 o0, o1;
        word_pairs(w.x ^ 0x80808080u, o0.x, o0.y);
        word_pairs(w.y ^ 0x80808080u, o0.z, o0.w);
        word_pairs(w.z ^ 0x80808080u, o1.x, o1.y);
        word_pairs(w.w ^ 0x80808080u, o1.z, o1.w);
        /* (Nsight Compute counts these stores' 2-way bank conflicts; storing
         * the halves in an order that avoids them measured no faster.) */
        uint4 *d = reinterpret_cast<uint4 *>(V16 + r * F::VP + 32 * c);
        d[0] = o0, d[1] = o1;
    }
}

template <int HD>
__global__ void __launch_bounds__(kThreads, 1) attn_int8_flash_kernel(const AttnArgs a) {
    pdl_begin();
    using F = FlashGeo<HD>;
    constexpr int ST = F::ST;
    extern __shared__ __align__(16) uint8_t smf[];
    uint8_t *Kb = smf + F::kb, *Vl = smf + F::vl, *V16 = smf + F::v16;
    const uint8_t **rowp = reinterpret_cast<const uint8_t **>(smf + F::rows);
    float *ksc = reinterpret_cast<float *>(smf + F::ksc), *vsc = reinterpret_cast<float *>(smf + F::vsc);
    float *red = reinterpret_cast<float *>(smf + F::red);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    BlockSpan b;
    if (!block_span(a, false, false, b)) return;
    const splash_cuda_attn_lane ln = b.ln;
    const int G = a.group, kvh = b.kvh, p0 = b.p0, p1 = b.p1, nst = b.nst;

    /* 1. rows of the first two stages, the split's largest V scale, the
     * first stage's copy in flight; meanwhile the warps' q digits */
    split_start<HD, ST>(a, ln, kvh, p0, p1, nst, rowp, ksc, vsc, red);
    __syncthreads();
    stage_copy_async<HD, ST, F::KP, kThreads, 2, 3>(a, rowp, Kb, Vl);

    const int wq0 = b.qv0 + 16 * warp, nv = max(0, min(16, b.nqb - 16 * warp));
    uint8_t *qd = smf + F::qd + (size_t)warp * 2 * 16 * F::KP;
    const float qinv = load_q_digits<HD>(a, ln, kvh, wq0, nv, qd);
    float qf[2];
    int lim[2];
    flash_vectors(a, ln, wq0, nv, p1, qinv, qf, lim);
    const int wlim = nv ? min(ln.n_past + (wq0 + nv - 1) / G + 1, p1) : 0; /* the warp's last position + 1 */

    FlashState<HD> fs;
#pragma unroll
    for (int n = 0; n < F::NT; n++) fs.O[n][0] = fs.O[n][1] = fs.O[n][2] = fs.O[n][3] = 0.f;
    fs.m[0] = fs.m[1] = -INFINITY, fs.l[0] = fs.l[1] = 0.f;
    const uint32_t qaddr = smem_addr(qd) + ((lane & 7) + 8 * ((lane >> 3) & 1)) * F::KP + 16 * (lane >> 4);
    const uint32_t kaddr0 = smem_addr(Kb) + ((lane & 7) + 8 * (lane >> 4)) * F::KP + 16 * ((lane >> 3) & 1);
    const uint32_t vaddr = smem_addr(V16) + ((lane & 7) + 8 * ((lane >> 3) & 1)) * F::VP + 16 * (lane >> 4);
    float psc = 1.f, pinv = 1.f;

    /* 2. one barrier a stage: stage st computed (its two halves of 32
     * positions; a warp skips what none of its vectors sees); stage st + 1's
     * copy waited for and its V widened by the threads that copied it, into
     * the other fp16 buffer; the barrier (st consumed, st + 1 visible);
     * stage st + 2's copy and stage st + 3's rows.  Stage 0 first: */
    cp_async_wait<0>();
    widen_own<HD>(Vl, V16);
    __syncthreads();
    split_p_scale(red, kWarps, psc, pinv); /* red[] is written (the first barrier) */
    if (nst > 1) stage_copy_async<HD, ST, F::KP, kThreads, 2, 3>(a, rowp + ST, Kb + ST * F::KP, Vl + ST * HD);
    if (nst > 2) stage_rows<HD, ST>(a, ln, kvh, p0 + 2 * ST, p1, rowp + 2 * ST, ksc + 2 * ST, vsc + 2 * ST);
    for (int st = 0; st < nst; st++) { /* uniform */
        const int buf = st & 1, set = st % kSets;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int sh = p0 + st * ST + 32 * h;
            if (sh >= wlim) break; /* warp-uniform */
            flash_half<HD>(fs, qaddr, kaddr0 + (buf * ST + 32 * h) * F::KP, vaddr + (buf * ST + 32 * h) * F::VP,
                           ksc + set * ST + 32 * h, vsc + set * ST + 32 * h, sh, qf, lim, psc);
        }
        if (st + 1 < nst) {
            cp_async_wait<0>();
            widen_own<HD>(Vl + (buf ^ 1) * ST * HD, V16 + (buf ^ 1) * ST * F::VP);
        }
        __syncthreads();
        if (st + 2 < nst)
            stage_copy_async<HD, ST, F::KP, kThreads, 2, 3>(a, rowp + ((st + 2) % kSets) * ST, Kb + buf * ST * F::KP,
                                                            Vl + buf * ST * HD);
        if (st + 3 < nst) {
            const int s3 = (st + 3) % kSets;
            stage_rows<HD, ST>(a, ln, kvh, p0 + (st + 3) * ST, p1, rowp + s3 * ST, ksc + s3 * ST, vsc + s3 * ST);
        }
    }

    /* 3. each vector's partial or output: o[n][0] and [2] its dims 8 n + 2 t and + 1 */
    flash_write<HD>(a, ln, kvh, wq0, nv, fs.m, fs.l, pinv, [&fs](int r, float (&o)[HD / 8][4]) {
#pragma unroll
        for (int n = 0; n < F::NT; n++) o[n][0] = o[n][1] = fs.O[n][2 * r], o[n][2] = o[n][3] = fs.O[n][2 * r + 1];
    });
}

template <int HD>
int launch(const AttnArgs &a, dim3 grid, cudaStream_t s) {
    static bool attr_set = false; /* once per instantiation; setting it again is harmless */
    if (!attr_set) {
        SPLASH_CUDA_TRY(cudaFuncSetAttribute(attn_int8_flash_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)FlashGeo<HD>::bytes));
        attr_set = true;
    }
    SPLASH_CUDA_TRY(launch_kernel(attn_int8_flash_kernel<HD>, grid, kThreads, FlashGeo<HD>::bytes, s, a));
    return SPLASH_OK;
}

} /* namespace */

/* head_dim 128 and 256 take the warpgroup form (attention_int8_flash_wg.cu)
 * unless SPLASH_CUDA_ATTN_WGMMA=0 (read once): an A/B switch. */
static int g_flash_wg = -1;

int splash_cuda::attn_int8_flash_launch(const AttnArgs &a, int head_dim, dim3 grid, cudaStream_t s) {
    if (a.qchunk != kFlashQ) return SPLASH_E_INVALID;
    if (head_dim % 128 == 0 && env_switch(&g_flash_wg, "SPLASH_CUDA_ATTN_WGMMA", 1))
        return attn_int8_flash_wg_launch(a, head_dim, grid, s);
    switch (head_dim) {
    case 64: return launch<64>(a, grid, s);
    case 128: return launch<128>(a, grid, s);
    case 256: return launch<256>(a, grid, s);
    default: return SPLASH_E_UNSUPPORTED;
    }
}
