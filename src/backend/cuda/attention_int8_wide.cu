/* attention_int8_wide.cu - the int8 split kernel's wide layout: the query
 * vectors of lanes with more than one n-tile of 8 (verify and prefill rows);
 * attention_int8.cu keeps the deep layout (decode rows) and, with
 * SPLASH_CUDA_ATTN_WIDE=0, its own wide layout for every lane (an A/B
 * switch; attention.cu dispatches).
 *
 * Why.  attention_int8.cu's wide layout gives warp w n-tile w against all of
 * a stage's positions and widens each int8 K / V word to fp16 in every warp:
 * ~800 instructions a warp per 16 positions, two thirds of them the
 * conversion, 117 M warp instructions for a 27B 16-row verify at 32K
 * context (Nsight Compute, session 31; a scheduler issued in 50% of its
 * cycles), which took 319 us an attention layer (68 MB of K / V: ~5% of the bandwidth).
 * Here the conversion goes: the scores are integer products of the int8 K
 * rows as stored (ldmatrix straight from the staged bytes) with q as three
 * 8-bit digits made once a block, and V is widened to fp16 once per block
 * (the stage's bytes, shared by the block's 4 warps) and read by
 * ldmatrix.trans.
 *
 * A block: one (lane, kv head, split, chunk of <= 32 query vectors), 4
 * warps; warp w takes n-tile w (vectors 8 w .. 8 w + 7 of the chunk) against
 * every position of the split, a stage (64 or 32 positions) at a time:
 *   scores   C[pos][q] = K (16 pos x 32 dims, s8) . D^T (32 dims x 8 q),
 *            for q's digits D = hi (s8), mid, lo (u8): S = 2^16 C_hi +
 *            2^8 C_mid + C_lo, each C exact in int32
 *   softmax  online per query vector, over a stage's positions at once
 *   output   O^T[dim][q] += V^T (16 dims x 16 pos, fp16) . P^T (16 pos x 8 q),
 *            P split into fp16 hi + lo; P^T reaches the B operand's layout
 *            from the scores' C layout by movmatrix (a transpose in registers)
 * Stages are double-buffered (K into its ldmatrix rows, V into a landing
 * area); per stage a barrier, the next stage's copy issued, V widened into
 * one fp16 buffer, a barrier, then the warps' products.  Two forms (WideGeo,
 * chosen per launch by wide_form): stages of 64 positions, copied by the
 * bulk-copy engine (~104 KB of shared memory at head_dim 256: 2 blocks an
 * SM, 239 registers), or, for the short splits of a long context's verify
 * at head_dim 256, stages of 32 copied by cp.async with q's digits in
 * shared memory (~69 KB, 168 registers: 3 blocks an SM).
 *
 * Exactness: q * 2^k (k per query vector: its largest |q| in [2^21, 2^22))
 * rounds to an integer x, |x| <= 2^22, whose bytes are the digits (hi
 * signed: byte 2 is then the arithmetic x >> 16, at most 64 in size); the
 * products are exact (|sums| < 2^31), so a score carries q to 2^-22 of the
 * vector's largest element, as attention_int8.cu's fp16 hi + lo split does.
 * V's int8 values are exact in fp16; P as there (a power of two per block
 * from the split's largest V scale, hi + lo).  The exponentials are __expf
 * (ex2.approx: a few ulp where a weight matters), not expf.  Attention bound
 * 1e-5 in test_cuda_ops (3.2e-6 at 32K context).
 *
 * Smem rows: a K row holds HD + 16 bytes and an fp16 V row 2 HD + 16, so
 * ldmatrix's eight 16-byte row pieces fall on distinct banks.
 *
 * The result for a query vector depends on its own inputs and the split
 * length, never on other lanes (P's power of two: as attention_int8.cu).
 *
 * C++ used: templates over head_dim, a lambda; no STL.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

#include "backend/cuda/attention_int8.cuh"
#include "backend/cuda/attention_split.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/q4_tile.cuh"

using namespace splash_cuda;
using namespace splash_cuda::int8_attn;

namespace {

constexpr int kWarps = 4;
constexpr int kSets = 3; /* row-address and scale sets: stage s uses set s % 3 */

/* The two forms, by ST, the positions of a stage (wide_form):
 *   64  q's digits in registers, two V landing buffers: ~104 KB at head_dim
 *       256 and 243 registers (239 with bulk copies), 2 blocks an SM;
 *   32  q's digits in shared memory (each lane reads back only what it
 *       wrote), one V landing buffer (the next stage's V copy issued after
 *       the widening): ~69 KB and <= 168 registers, 3 blocks an SM, for
 *       more warps to hide the blocks' load latencies. */
template <int HD, int ST>
struct WideGeo {
    static constexpr bool kQShared = ST < kStage;
    static constexpr int kLandings = ST < kStage ? 1 : 2;
    static constexpr int kBlocks = ST < kStage ? 3 : 2; /* an SM (__launch_bounds__) */
    static constexpr int kUnroll = ST < kStage ? 2 : 4; /* the copy and widening loops (2: no spills at 168 registers) */
    static constexpr int KP = HD + 16;     /* bytes per staged int8 K row */
    static constexpr int VP = 2 * HD + 16; /* bytes per fp16 V row */
    static constexpr int KS = HD / 32;     /* k-steps of the scores (32 dims) */
    static constexpr int DT = HD / 16;     /* dim m-tiles of the output */
    static constexpr int MT = ST / 16;     /* position m-tiles of a stage */
    /* shared memory, bytes: K [2][ST][KP], V landing [kLandings][ST][HD], V fp16 [ST][VP],
     * q's digits [kWarps][KS][3][32 lanes] uint2 (kQShared), row addresses [kSets][ST],
     * K and V scales [kSets][ST] each, red [kWarps], the bulk copies' mbarriers [3] (8-aligned) */
    static constexpr size_t kb = 0, vl = kb + 2 * ST * KP, v16 = vl + (size_t)kLandings * ST * HD;
    static constexpr size_t qd = v16 + (size_t)ST * VP, rows = qd + (kQShared ? (size_t)kWarps * KS * 3 * 32 * 8 : 0);
    static constexpr size_t ksc = rows + kSets * ST * sizeof(void *);
    static constexpr size_t vsc = ksc + kSets * ST * 4, red = vsc + kSets * ST * 4;
    static constexpr size_t bar = (red + kWarps * 4 + 7) & ~(size_t)7, bytes = bar + 3 * 8;
};

/* An 8 x 8 matrix of halves, lane (g, t) holding row g's columns 2t, 2t + 1,
 * transposed: the lane then holds column g's rows 2t, 2t + 1. */
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
    uint32_t r;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(x));
    return r;
}
/* mma.sync m16n8k32, D += A B in int32: A s8 (K codes), B u8 (q's mid and lo digits; imma_ss the hi) */
__device__ __forceinline__ void imma_su(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The warp's B operands: query vector `src` (NULL: zeros) of B column g as
 * the digits of x = q 2^k, lane (g, t) holding dims 32 j + 4 t .. + 3
 * (qb[j][digit][0]) and 32 j + 16 + 4 t .. + 3 ([1]) of digit hi (0), mid
 * (1), lo (2); returns 2^-k (the same in the 4 lanes of column g). */
template <int HD>
__device__ __forceinline__ float q_digits(const float *src, uint32_t (&qb)[HD / 32][3][2]) {
    const int t = threadIdx.x & 3;
    float4 v[HD / 32][2];
    float mx = 0.f;
    const bool al = ((uintptr_t)src & 15) == 0;
#pragma unroll
    for (int j = 0; j < HD / 32; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            v[j][h] = src ? load4(src + 32 * j + 16 * h + 4 * t, al) : make_float4(0.f, 0.f, 0.f, 0.f);
            mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v[j][h].x), fabsf(v[j][h].y)), fmaxf(fabsf(v[j][h].z), fabsf(v[j][h].w))));
        }
    mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 2));
    float sc, inv;
    row_pow2_scale(mx, sc, inv, 22, 126);
#pragma unroll
    for (int j = 0; j < HD / 32; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int x0 = __float2int_rn(v[j][h].x * sc), x1 = __float2int_rn(v[j][h].y * sc);
            const int x2 = __float2int_rn(v[j][h].z * sc), x3 = __float2int_rn(v[j][h].w * sc);
            qb[j][0][h] = bytes_of(x0, x1, x2, x3, 0x62);
            qb[j][1][h] = bytes_of(x0, x1, x2, x3, 0x51);
            qb[j][2][h] = bytes_of(x0, x1, x2, x3, 0x40);
        }
    return inv;
}

/* The warp's B operands as wide_stage reads them, digit d of k-step j as
 * (word h 0, word h 1): held in registers, or (QS) in the warp's shared
 * area, each lane's own words (no sync: the lane that wrote them reads them). */
template <int HD, bool QS>
struct QDigits {
    uint32_t b[HD / 32][3][2];
    __device__ __forceinline__ float load(const float *src, uint2 *) { return q_digits<HD>(src, b); }
    __device__ __forceinline__ uint2 get(int j, int d) const { return make_uint2(b[j][d][0], b[j][d][1]); }
};
template <int HD>
struct QDigits<HD, true> {
    const uint2 *p; /* the lane's first word pair: p[(3 j + d) * 32] */
    __device__ __forceinline__ float load(const float *src, uint2 *area) {
        uint32_t b[HD / 32][3][2];
        const float inv = q_digits<HD>(src, b);
        uint2 *w = area + (threadIdx.x & 31);
#pragma unroll
        for (int j = 0; j < HD / 32; j++)
#pragma unroll
            for (int d = 0; d < 3; d++) w[(3 * j + d) * 32] = make_uint2(b[j][d][0], b[j][d][1]);
        p = w;
        return inv;
    }
    __device__ __forceinline__ uint2 get(int j, int d) const { return p[(3 * j + d) * 32]; }
};

/* A stage's copy by cp.async (stage_copy_async, the block's 4 warps). */
template <int HD, int ST, int PART>
__device__ __forceinline__ void wide_copy(const AttnArgs &a, const uint8_t *const *rowp, uint8_t *Kb, uint8_t *Vl) {
    stage_copy_async<HD, ST, WideGeo<HD, ST>::KP, kWarps * 32, WideGeo<HD, ST>::kUnroll, PART>(a, rowp, Kb, Vl);
}

/* wide_copy by the bulk-copy engine (wide_form chooses): a row a thread,
 * PART 1: K rows by threads 0 .. ST - 1, 2: V rows by them, 3: K by them
 * and V by threads ST .. 2 ST - 1; each thread arrives on its buffer's
 * mbarrier expecting its row's bytes, then copies it.  Rows past p1 are not
 * copied: their scores are masked (wide_stage's lim) and the stale int8
 * bytes of their V widen to finite values that meet zero weights. */
template <int HD, int ST, int PART>
__device__ __forceinline__ void wide_bulk(const AttnArgs &a, const uint8_t *const *rowp, uint8_t *Kb, uint8_t *Vl,
                                          uint32_t kbar, uint32_t vbar) {
    int i = threadIdx.x;
    if (i >= (PART == 3 ? 2 * ST : ST)) return;
    const bool isv = PART == 2 || (PART == 3 && i >= ST);
    if (PART == 3 && isv) i -= ST;
    const uint8_t *row = rowp[i];
    const uint32_t bar = isv ? vbar : kbar;
    mbar_expect_tx(bar, row ? HD : 0);
    if (row)
        bulk_copy_g2s(smem_addr(isv ? Vl + i * HD : Kb + i * WideGeo<HD, ST>::KP), isv ? row + (a.v_off - a.k_off) : row,
                      HD, bar);
}

/* A stage's copy in the launch's form (BULK: wide_bulk, kbar / vbar the
 * buffers' mbarriers; else wide_copy). */
template <int HD, int ST, bool BULK, int PART>
__device__ __forceinline__ void stage_copy(const AttnArgs &a, const uint8_t *const *rowp, uint8_t *Kb, uint8_t *Vl,
                                           uint32_t kbar, uint32_t vbar) {
    if (BULK)
        wide_bulk<HD, ST, PART>(a, rowp, Kb, Vl, kbar, vbar);
    else
        wide_copy<HD, ST, PART>(a, rowp, Kb, Vl);
}

/* The landed V rows as fp16 (every thread; 8 bytes in, 16 out, so a warp's
 * stores are contiguous). */
template <int HD, int ST>
__device__ __forceinline__ void wide_widen(const uint8_t *Vl, uint8_t *V16) {
    constexpr int U = HD / 8;
#pragma unroll(WideGeo<HD, ST>::kUnroll)
    for (int i = threadIdx.x; i < ST * U; i += kWarps * 32) {
        const int r = i / U, c = i % U;
        const uint2 w = *reinterpret_cast<const uint2 *>(Vl + r * HD + 8 * c);
        uint4 o;
        word_pairs(w.x ^ 0x80808080u, o.x, o.y);
        word_pairs(w.y ^ 0x80808080u, o.z, o.w);
        *reinterpret_cast<uint4 *>(V16 + r * WideGeo<HD, ST>::VP + 16 * c) = o;
    }
}

/* A warp's running state for its lane's two query vectors of the n-tile
 * (qa = 2t, qa + 1): O^T (dims 16 d + g, + 8 of m-tile d; times P's power
 * of two), max m and sum l of each. */
template <int HD>
struct WideState {
    float O[HD / 16][4];
    float m0, m1, l0, l1;
};

/* One stage (positions s0 .. s0 + ST - 1, the first nmt m-tiles of them in
 * the split) against the warp's n-tile, as a warp.  kaddr / vaddr: the
 * lane's ldmatrix addresses in this stage's K rows and the fp16 V rows. */
template <int HD, int ST, typename Q>
__device__ __forceinline__ void wide_stage(WideState<HD> &ws, uint32_t kaddr, uint32_t vaddr, const float *ksc,
                                           const float *vsc, int s0, int nmt, const Q &q, float qs0, float qs1,
                                           int lim0, int lim1, float psc) {
    using W = WideGeo<HD, ST>;
    constexpr int MT = W::MT;
    const int lane = threadIdx.x & 31, g = lane >> 2;
    /* scores: the three digits' sums of positions s0 + 16 mt + g (C[0], C[1]) and + 8 ([2], [3]) */
    int acc[MT][3][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int d = 0; d < 3; d++) acc[mt][d][0] = acc[mt][d][1] = acc[mt][d][2] = acc[mt][d][3] = 0;
#pragma unroll
    for (int j = 0; j < W::KS; j++) {
        const uint2 q0 = q.get(j, 0), q1 = q.get(j, 1), q2 = q.get(j, 2);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            if (mt < nmt) {
                uint32_t k[4];
                ldsm_x4(kaddr + mt * 16 * W::KP + j * 32, k);
                imma_ss(acc[mt][0], k, q0.x, q0.y);
                imma_su(acc[mt][1], k, q1.x, q1.y);
                imma_su(acc[mt][2], k, q2.x, q2.y);
            }
        }
    }
    float s[MT][4];
    float c0 = -INFINITY, c1 = -INFINITY;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = 16 * mt + g + 8 * (i >> 1), odd = i & 1;
            const float S = fmaf((float)acc[mt][0][i], 65536.f, fmaf((float)acc[mt][1][i], 256.f, (float)acc[mt][2][i]));
            const float x = mt < nmt && s0 + r < (odd ? lim1 : lim0) ? __fmul_rn(__fmul_rn(S, ksc[r]), odd ? qs1 : qs0)
                                                                     : -INFINITY;
            s[mt][i] = x;
            if (odd)
                c1 = fmaxf(c1, x);
            else
                c0 = fmaxf(c0, x);
        }
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
        c0 = fmaxf(c0, __shfl_xor_sync(kFull, c0, o));
        c1 = fmaxf(c1, __shfl_xor_sync(kFull, c1, o));
    }
    /* exponentials by __expf (ex2.approx of x log2 e: within a few ulp
     * where they matter); a max still -inf (no position yet) subtracts 0,
     * so every -inf gives 0 and no NaN */
    const float mn0 = fmaxf(ws.m0, c0), mn1 = fmaxf(ws.m1, c1);
    const float mx0 = mn0 == -INFINITY ? 0.f : mn0, mx1 = mn1 == -INFINITY ? 0.f : mn1;
    const float al0 = __expf(ws.m0 - mx0), al1 = __expf(ws.m1 - mx1);
    float r0 = 0.f, r1 = 0.f;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float e = __expf(s[mt][i] - (i & 1 ? mx1 : mx0));
            s[mt][i] = e;
            if (i & 1)
                r1 += e;
            else
                r0 += e;
        }
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
        r0 += __shfl_xor_sync(kFull, r0, o);
        r1 += __shfl_xor_sync(kFull, r1, o);
    }
    ws.l0 = fmaf(ws.l0, al0, r0), ws.l1 = fmaf(ws.l1, al1, r1);
    ws.m0 = mn0, ws.m1 = mn1;
    if (__any_sync(kFull, al0 != 1.f || al1 != 1.f)) /* past the first stages a new max is rare */
#pragma unroll
        for (int d = 0; d < W::DT; d++) ws.O[d][0] *= al0, ws.O[d][1] *= al1, ws.O[d][2] *= al0, ws.O[d][3] *= al1;

    /* P^T as the B operand of m-tile mt: (positions g, qa | qa + 1) as hi + lo
     * halves, transposed to (vector g, positions 2t, 2t + 1) */
    uint32_t bh[MT][2], bl[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const float vA = __fmul_rn(vsc[16 * mt + g], psc), vB = __fmul_rn(vsc[16 * mt + g + 8], psc);
        uint32_t h0, l0, h1, l1;
        split_pair(s[mt][0] * vA, s[mt][1] * vA, h0, l0);
        split_pair(s[mt][2] * vB, s[mt][3] * vB, h1, l1);
        bh[mt][0] = movmatrix_trans(h0), bh[mt][1] = movmatrix_trans(h1);
        bl[mt][0] = movmatrix_trans(l0), bl[mt][1] = movmatrix_trans(l1);
    }
    /* O^T += V^T P^T */
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        if (mt >= nmt) continue;
#pragma unroll
        for (int d = 0; d < W::DT; d++) {
            uint32_t v[4];
            ldsm_x4_trans(vaddr + mt * 16 * W::VP + d * 32, v);
            mma16816(ws.O[d], v[0], v[1], v[2], v[3], bh[mt][0], bh[mt][1]);
            mma16816(ws.O[d], v[0], v[1], v[2], v[3], bl[mt][0], bl[mt][1]);
        }
    }
}

template <int HD, int ST, bool BULK>
__global__ void __launch_bounds__(kWarps * 32, WideGeo<HD, ST>::kBlocks) attn_int8_wide_kernel(const AttnArgs a) {
    pdl_begin();
    using W = WideGeo<HD, ST>;
    extern __shared__ __align__(16) uint8_t smw[];
    uint8_t *Kb = smw + W::kb, *Vl = smw + W::vl, *V16 = smw + W::v16;
    const uint8_t **rowp = reinterpret_cast<const uint8_t **>(smw + W::rows);
    float *ksc = reinterpret_cast<float *>(smw + W::ksc), *vsc = reinterpret_cast<float *>(smw + W::vsc);
    float *red = reinterpret_cast<float *>(smw + W::red);
    /* BULK: the stages' mbarriers: K + V of buffer 0 and 1 (two landings),
     * or K of buffer 0 and 1 and the V landing (one) */
    const uint32_t bar0 = smem_addr(smw + W::bar), vbar = W::kLandings == 2 ? 0 : bar0 + 16;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    BlockSpan b;
    if (!block_span(a, false, true, b)) return; /* deep lanes are attention_int8.cu's */
    const splash_cuda_attn_lane ln = b.ln;
    const int G = a.group, kvh = b.kvh, qv0 = b.qv0, nqb = b.nqb, nqt = b.nqt, p0 = b.p0, p1 = b.p1;
    const int nst = (p1 - p0 + ST - 1) / ST;
    if (BULK && tid == 0) { /* used after the barrier before the first copy */
        mbar_init(bar0, W::kLandings == 2 ? 2 * ST : ST);
        mbar_init(bar0 + 8, W::kLandings == 2 ? 2 * ST : ST);
        if (W::kLandings == 1) mbar_init(vbar, ST);
        mbar_init_fence();
    }

    /* 1. rows of the first two stages, the split's largest V scale, the first
     * stage's copy in flight; meanwhile the warp's q digits */
    split_start<HD, ST>(a, ln, kvh, p0, p1, nst, rowp, ksc, vsc, red);
    __syncthreads();
    stage_copy<HD, ST, BULK, 3>(a, rowp, Kb, Vl, bar0, W::kLandings == 2 ? bar0 : vbar);

    const bool active = warp < nqt;
    const int qa = 8 * warp + 2 * t; /* the lane's C columns: vectors qa, qa + 1 of the chunk */
    QDigits<HD, W::kQShared> qd;
    float qinv_g;
    {
        const int qn = 8 * warp + g; /* the lane's B column */
        const float *src = nullptr;
        if (active && qn < nqb) {
            const int qv = qv0 + qn, r = qv / G, h = kvh * G + qv % G;
            src = a.q + (size_t)(ln.first_row + r) * a.ldq + (size_t)h * HD;
        }
        qinv_g = qd.load(src, reinterpret_cast<uint2 *>(smw + W::qd) + warp * W::KS * 3 * 32);
    }
    /* a score is S 2^-k scale (the lane's vectors' 2^-k from the lanes of their B columns) */
    const float qs0 = __fmul_rn(__shfl_sync(kFull, qinv_g, 8 * t), a.scale);
    const float qs1 = __fmul_rn(__shfl_sync(kFull, qinv_g, 8 * t + 4), a.scale);
    const int lim0 = active && qa < nqb ? ln.n_past + (qv0 + qa) / G + 1 : 0;
    const int lim1 = active && qa + 1 < nqb ? ln.n_past + (qv0 + qa + 1) / G + 1 : 0;

    WideState<HD> ws;
#pragma unroll
    for (int d = 0; d < W::DT; d++) ws.O[d][0] = ws.O[d][1] = ws.O[d][2] = ws.O[d][3] = 0.f;
    ws.m0 = ws.m1 = -INFINITY, ws.l0 = ws.l1 = 0.f;
    const uint32_t kaddr0 = smem_addr(Kb) + ((lane & 7) + 8 * ((lane >> 3) & 1)) * W::KP + 16 * (lane >> 4);
    const uint32_t vaddr = smem_addr(V16) + ((lane & 7) + 8 * (lane >> 4)) * W::VP + 16 * ((lane >> 3) & 1);
    float psc = 1.f, pinv = 1.f;

    /* 2. per stage: wait for its copy; the barrier (its bytes visible, the
     * previous stage consumed); the next stage's K copy (and V, with two
     * landings) and the one after's rows; V widened; a barrier; (one
     * landing: the next stage's V copy;) the warps' products */
    for (int st = 0; st < nst; st++) { /* uniform */
        const int s0 = p0 + st * ST, buf = st & 1, set = st % kSets;
        const uint8_t *const *next = rowp + ((st + 1) % kSets) * ST;
        uint8_t *const vland = Vl + (W::kLandings == 2 ? buf * ST * HD : 0);
        if (BULK) { /* buffer buf's phase st / 2; the landing's st */
            mbar_wait(bar0 + 8 * buf, (st >> 1) & 1);
            if (W::kLandings == 1) mbar_wait(vbar, st & 1);
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (st == 0) { /* red[] is written (the first barrier) */
            float vm = 0.f;
#pragma unroll
            for (int w = 0; w < kWarps; w++) vm = fmaxf(vm, red[w]);
            row_pow2_scale(vm, psc, pinv); /* P' = p * vsc * psc <= 2^14 (p <= 1) */
        }
        if (st + 1 < nst) {
            const uint32_t nbar = bar0 + 8 * (buf ^ 1);
            if (W::kLandings == 2)
                stage_copy<HD, ST, BULK, 3>(a, next, Kb + (buf ^ 1) * ST * W::KP, Vl + (buf ^ 1) * ST * HD, nbar, nbar);
            else
                stage_copy<HD, ST, BULK, 1>(a, next, Kb + (buf ^ 1) * ST * W::KP, Vl, nbar, 0);
        }
        if (st + 2 < nst) {
            const int s2 = (st + 2) % kSets;
            stage_rows<HD, ST>(a, ln, kvh, s0 + 2 * ST, p1, rowp + s2 * ST, ksc + s2 * ST, vsc + s2 * ST);
        }
        wide_widen<HD, ST>(vland, V16);
        __syncthreads();
        if (W::kLandings == 1 && st + 1 < nst) /* the landing is free now */
            stage_copy<HD, ST, BULK, 2>(a, next, Kb, Vl, 0, vbar);
        if (active) {
            /* a whole stage (all but a lane's last) in its own copy, the m-tile
             * count a constant: no guards between the loads and products */
            const int nmt = (min(p1 - s0, ST) + 15) / 16;
            const uint32_t kaddr = kaddr0 + buf * ST * W::KP;
            const float *ks = ksc + set * ST, *vs = vsc + set * ST;
            if (nmt == W::MT)
                wide_stage<HD, ST>(ws, kaddr, vaddr, ks, vs, s0, W::MT, qd, qs0, qs1, lim0, lim1, psc);
            else
                wide_stage<HD, ST>(ws, kaddr, vaddr, ks, vs, s0, nmt, qd, qs0, qs1, lim0, lim1, psc);
        }
    }
    if (!active) return;

    /* 3. the partials of qa, qa + 1 (or their outputs: write_vector) */
    const auto dim = [g](int d, int h) { return 16 * d + g + 8 * h; };
    if (qa < nqb) write_vector<HD>(a, ln, kvh, qv0 + qa, lim0, blockIdx.z, ws.O, 0, pinv, ws.m0, ws.l0, g == 0, dim);
    if (qa + 1 < nqb)
        write_vector<HD>(a, ln, kvh, qv0 + qa + 1, lim1, blockIdx.z, ws.O, 1, pinv, ws.m1, ws.l1, g == 0, dim);
}

template <int HD, int ST, bool BULK>
int launch(const AttnArgs &a, dim3 grid, cudaStream_t s) {
    static bool attr_set = false; /* once per instantiation; setting it again is harmless */
    if (!attr_set) {
        SPLASH_CUDA_TRY(cudaFuncSetAttribute(attn_int8_wide_kernel<HD, ST, BULK>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)WideGeo<HD, ST>::bytes));
        attr_set = true;
    }
    SPLASH_CUDA_TRY(
        launch_kernel(attn_int8_wide_kernel<HD, ST, BULK>, grid, kWarps * 32, WideGeo<HD, ST>::bytes, s, a));
    return SPLASH_OK;
}

template <int ST, bool BULK>
int launch_hd(const AttnArgs &a, int head_dim, dim3 grid, cudaStream_t s) {
    switch (head_dim) {
    case 64: return launch<64, ST, BULK>(a, grid, s);
    case 128: return launch<128, ST, BULK>(a, grid, s);
    case 256: return launch<256, ST, BULK>(a, grid, s);
    default: return SPLASH_E_UNSUPPORTED;
    }
}

/* The form a launch takes, by the call's longest context (max_ctx, or the
 * graph's bound for it) and split, from what each form measured (H200,
 * session 32, docs/cuda.md: test_cuda_ops' attention rows, full-depth 27B):
 *   >= 16K positions in splits of <= 128 at head_dim 256 (a long context's
 *     verify before its lanes had splits of their own, session 42; now only
 *     with SPLASH_CUDA_ATTN_LANE_SPLIT=0 or a call's own split): stages of
 *     32, cp.async -- 3 blocks an SM hide more of a short split's prologue
 *     (32K, 16 rows: 249 -> 237 us); the same form loses at 1K (35B-A3B
 *     1,000 + 16: 40.2 -> 42.8 us) and in long splits (4,096 positions: 338
 *     -> 404);
 *   >= 16K positions in longer splits (a long prompt's prefill): stages of
 *     64, bulk copies (a 4,096 split at 32K: 338 -> 310 us; 27B 32K
 *     prefill 5,833 -> 6,045 tokens/s); bulk copies lose at head_dim 128
 *     and in the tiny shapes' long splits (hd128 4,096 split: 183 -> 204);
 *   else stages of 64, cp.async (as before: at 1K the default is unchanged).
 * Contexts between the measured 1K-4K and 32K are not measured.
 * SPLASH_CUDA_ATTN_WIDE_STAGE=32|64 and SPLASH_CUDA_ATTN_WIDE_COPY=async|bulk
 * force either choice (A/B switches, read once). */
struct WideForm {
    int stage; /* 32, 64; 0: by the launch */
    int bulk;  /* 0, 1; -1: by the launch */
};
constexpr long kWideLong = 16384; /* positions: a long context */

WideForm wide_form_env() {
    const char *st = getenv("SPLASH_CUDA_ATTN_WIDE_STAGE"), *cp = getenv("SPLASH_CUDA_ATTN_WIDE_COPY");
    WideForm f = {0, -1};
    if (st && (atoi(st) == 32 || atoi(st) == 64)) f.stage = atoi(st);
    if (cp && !strcmp(cp, "bulk")) f.bulk = 1;
    if (cp && !strcmp(cp, "async")) f.bulk = 0;
    return f;
}

WideForm wide_form(const AttnArgs &a, int head_dim) {
    static const WideForm forced = wide_form_env(); /* once (a thread-safe local static) */
    WideForm f = forced;
    const bool lng = a.max_ctx >= kWideLong;
    /* lanes with splits of their own (lane_splits) keep stages of 64: the stage
     * sets where the online softmax rescales, and a form chosen by the
     * call's longest context would make a lane's bits depend on the batch
     * (their splits at 16K+ are 256+ positions anyway) */
    if (!f.stage) f.stage = lng && head_dim == 256 && a.split <= 128 && !a.lane_splits ? 32 : 64;
    if (f.bulk < 0) f.bulk = lng && f.stage == kStage;
    return f;
}

} /* namespace */

int splash_cuda::attn_int8_wide_launch(const AttnArgs &a, int head_dim, dim3 grid, cudaStream_t s) {
    if (a.qchunk < 8 || a.qchunk > kInt8MaxQ || a.qchunk % 8) return SPLASH_E_INVALID;
    const WideForm f = wide_form(a, head_dim);
    if (f.stage == 32)
        return f.bulk ? launch_hd<32, true>(a, head_dim, grid, s) : launch_hd<32, false>(a, head_dim, grid, s);
    return f.bulk ? launch_hd<kStage, true>(a, head_dim, grid, s) : launch_hd<kStage, false>(a, head_dim, grid, s);
}
