/* attention_int8.cu - the split kernel of paged attention for int8 pages, on
 * the tensor cores (attention_split.cuh; attention.cu dispatches and merges).
 *
 * Why.  The CUDA-core split kernel gave every warp one query vector and
 * walked the K/V tile (widened to fp32 in shared memory) once per warp: six
 * times for a 27B decode row, 96 times for a 16-row verify.  At 32K context
 * that was 201-222 us per attention layer for one row (68 MB of K/V: 16 us of
 * bandwidth) and 1.07 ms for 16 rows (tests/gpu/test_cuda_ops).  Here a
 * block stages its split's K and V bytes once (cp.async, int8 as stored)
 * and the tensor cores do both products for up to 32 query vectors.
 *
 * A block: one (lane, kv head, split of a.split positions, chunk of <= 32
 * query vectors), 4 warps.  The split's positions pass through shared
 * memory 64 at a time, 16 at a time through the tensor cores, in one of
 * two layouts chosen by the lane's own query vectors:
 *   wide (more than one n-tile of 8: verify and prefill rows): warp w takes
 *     n-tile w against all the positions (since session 31 these lanes go to
 *     attention_int8_wide.cu's kernel, which converts nothing per warp; this
 *     layout serves them with SPLASH_CUDA_ATTN_WIDE=0, and a launch with
 *     a.deep_only set skips them);
 *   deep (one n-tile: a decode row, G <= 8): warp w takes positions
 *     16 w .. 16 w + 15 of every 64 with its own online softmax, and at the
 *     end warps 1-3 hand their states to warp 0, which merges them in warp
 *     order.  (Wide alone left 3 of 4 warps idle for a decode row and its
 *     128 positions one after another in one warp: 19 us a 27B attention
 *     layer at 1K context in the decode graph; deep alone re-staged the
 *     positions for every n-tile of a verify: 16 rows at 4K 99 -> 150 us.)
 * A launch whose lanes are all deep and whose blocks fit one wave at 2 an
 * SM (attention.cu: a.stage_bufs = 2) keeps two stage buffers, the next 64
 * positions loading while these are used (~76 KB at head_dim 256);
 * otherwise one (~49 KB, 4 blocks an SM, whose loads overlap each other's
 * arithmetic: two buffers made the 16-row verify at 4K 99 -> 112 us and a
 * 32K decode row 57 -> 64 us).  The buffers change no arithmetic.
 *
 *   scores   C[pos][q] = K (16 pos x 16 dims, A) . Q^T (16 dims x 8 q, B)
 *   softmax  online per query vector (column), max/sum over the 16
 *            positions by shuffles across the 8 lane groups
 *   output   O^T[dim][q] += V^T (16 dims x 16 pos, A) . P^T (16 pos x 8 q, B)
 *
 * Exactness: int8 K and V values are exact in fp16 (the A operands, made by
 * the magic-number trick); q and P are split into fp16 hi + lo parts after a
 * power-of-two scaling (q per query vector, P per block by the split's
 * largest V scale), so both products are fp32-grade like the CUDA-core
 * kernel's (attention bound 1e-5 in test_cuda_ops).
 *
 * Freedom used for contiguous loads: the sum over head dims does not care
 * which k slot holds which dim, so lane (g, t)'s k slots of k-step j are
 * dims 16 (t + 4 (j / 4)) + 4 (j % 4) + 0..3, i.e. one 16-byte piece of a K
 * row covers four k-steps (and q uses the same map); the output dims of
 * the V^T product are free too, so lane g's A fragments of dim m-tile
 * 4 i + e are dims 64 i + 4 g + e and 64 i + 32 + 4 g + e, whole words of
 * V rows.  Shared-memory rows are padded so that these loads hit 32 banks.
 *
 * The result for a query vector depends on its own inputs and the split
 * length, never on other lanes.  P's power of two comes from the V scales of
 * the split's positions up to the block's last row, so a lane's row count
 * could only change bits where a P value's lo part falls below fp16's normal
 * range (P under 2^-17 of the split's largest).
 *
 * C++ used: templates over head_dim; no STL.
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

constexpr int kWarps = 4;
constexpr int kPw = 9; /* floats per row of a warp's 16 x 8 P tile */

template <int HD>
struct Geo {
    static constexpr int KW = HD / 4 + ((16 - HD / 4) & 31); /* words per staged K row: = 16 (mod 32) */
    static constexpr int VW = HD / 4 + ((4 - HD / 4) & 31);  /* words per staged V row: = 4 (mod 32) */
    static constexpr int QW = HD / 2 + 2;                    /* words per fp16 q row: = 2 (mod 32) */
    static constexpr int RP = HD / 16;                       /* 16-byte pieces per row; dim m-tiles */
};

template <int HD>
constexpr size_t smem_words(int qchunk, int bufs) {
    return bufs * (size_t)kStage * (Geo<HD>::KW + Geo<HD>::VW + 4) + 2 * (size_t)qchunk * Geo<HD>::QW + qchunk +
           kWarps * 16 * kPw + kWarps;
}

/* Byte e of u and byte e of v as f16x2 (u's in the low half), e = 0..3. */
__device__ __forceinline__ void cross_pairs(uint32_t u, uint32_t v, uint32_t (&p)[4]) {
    const uint32_t lo = prmt(u, v, 0x5140), hi = prmt(u, v, 0x7362); /* u0 v0 u1 v1 | u2 v2 u3 v3 */
    p[0] = biased_to_f16x2(prmt(lo, 0x64646464u, 0x4140));
    p[1] = biased_to_f16x2(prmt(lo, 0x64646464u, 0x4342));
    p[2] = biased_to_f16x2(prmt(hi, 0x64646464u, 0x4140));
    p[3] = biased_to_f16x2(prmt(hi, 0x64646464u, 0x4342));
}

/* The second step of filling a stage buffer (after stage_rows and a
 * barrier; every thread): the K and V rows as stored by cp.async, zeros
 * past p1, consecutive threads on consecutive 16-byte pieces of a row so
 * the shared stores hit every bank; one group. */
template <int HD>
__device__ __forceinline__ void stage_copy(const AttnArgs &a, const uint8_t *const *rowp, uint32_t *Ks, uint32_t *Vs) {
    using GG = Geo<HD>;
    const size_t vdelta = a.v_off - a.k_off;
    for (int i = threadIdx.x; i < 2 * kStage * GG::RP; i += kWarps * 32) {
        const int isv = i >= kStage * GG::RP, ii = isv ? i - kStage * GG::RP : i;
        const int r = ii / GG::RP, c = ii % GG::RP;
        const uint8_t *row = rowp[r];
        cp_async16(smem_addr((isv ? Vs + r * GG::VW : Ks + r * GG::KW) + 4 * c),
                   row ? row + (isv ? vdelta : 0) + (size_t)c * 16 : a.pool, row ? 16 : 0);
    }
    cp_async_commit();
}

/* A warp's running state for its lane's two query vectors of an n-tile
 * (qa, qa + 1): O^T (dims as in the V^T product below, times P's power of
 * two), the running max m and sum l of each. */
template <int HD>
struct TileState {
    float O[Geo<HD>::RP][4];
    float m0, m1, l0, l1;
};

/* One m-tile (positions s0 + 16 mt .. + 15 of a stage buffer) against an
 * n-tile of 8 query vectors (fp16 hi / lo rows qh, ql; lane (g, t) holds
 * vectors qa = 2 t, qa + 1 of it): scores, the online softmax of (m, l)
 * and O += V^T P^T, as a warp. */
template <int HD>
__device__ __forceinline__ void mtile_step(TileState<HD> &ts, const uint32_t *KB, const uint32_t *VB, const float *kscb,
                                           const float *vscb, int mt, int s0, const uint32_t *qh, const uint32_t *ql,
                                           float qi0, float qi1, int lim0, int lim1, float scale, float psc, float *P) {
    using GG = Geo<HD>;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float (&O)[GG::RP][4] = ts.O;
    float &m0 = ts.m0, &m1 = ts.m1, &l0 = ts.l0, &l1 = ts.l1;
    /* scores of positions s0 + 16 mt + g (S[0], S[1]) and + 8 (S[2], S[3]) for qa, qa + 1;
     * the hi and lo products in two chains */
    float S[4] = {0.f, 0.f, 0.f, 0.f}, S2[4] = {0.f, 0.f, 0.f, 0.f};
    const uint32_t *k0 = KB + (16 * mt + g) * GG::KW, *k1 = k0 + 8 * GG::KW;
#pragma unroll
    for (int i = 0; i < HD / 64; i++) {
        const uint4 wa = *reinterpret_cast<const uint4 *>(k0 + 4 * (t + 4 * i));
        const uint4 wb = *reinterpret_cast<const uint4 *>(k1 + 4 * (t + 4 * i));
        const uint32_t ra[4] = {wa.x, wa.y, wa.z, wa.w}, rb[4] = {wb.x, wb.y, wb.z, wb.w};
#pragma unroll
        for (int sub = 0; sub < 4; sub++) {
            uint32_t a0, a1, a2, a3;
            word_pairs(ra[sub] ^ 0x80808080u, a0, a2);
            word_pairs(rb[sub] ^ 0x80808080u, a1, a3);
            const int qw = 8 * (t + 4 * i) + 2 * sub; /* dims 16 (t + 4 i) + 4 sub .. + 3 */
            const uint2 bh = *reinterpret_cast<const uint2 *>(qh + qw);
            const uint2 bl = *reinterpret_cast<const uint2 *>(ql + qw);
            mma16816(S, a0, a1, a2, a3, bh.x, bh.y);
            mma16816(S2, a0, a1, a2, a3, bl.x, bl.y);
        }
    }
    const int ra_ = 16 * mt + g, rb_ = ra_ + 8, pa = s0 + ra_, pb = s0 + rb_; /* in the stage */
    const float kA = kscb[ra_], kB = kscb[rb_];
    const float s00 = pa < lim0 ? __fmul_rn(__fmul_rn(__fmul_rn(S[0] + S2[0], qi0), kA), scale) : -INFINITY;
    const float s01 = pa < lim1 ? __fmul_rn(__fmul_rn(__fmul_rn(S[1] + S2[1], qi1), kA), scale) : -INFINITY;
    const float s10 = pb < lim0 ? __fmul_rn(__fmul_rn(__fmul_rn(S[2] + S2[2], qi0), kB), scale) : -INFINITY;
    const float s11 = pb < lim1 ? __fmul_rn(__fmul_rn(__fmul_rn(S[3] + S2[3], qi1), kB), scale) : -INFINITY;
    float c0 = fmaxf(s00, s10), c1 = fmaxf(s01, s11);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
        c0 = fmaxf(c0, __shfl_xor_sync(kFull, c0, o));
        c1 = fmaxf(c1, __shfl_xor_sync(kFull, c1, o));
    }
    const float mn0 = fmaxf(m0, c0), mn1 = fmaxf(m1, c1);
    const float al0 = mn0 == -INFINITY ? 1.f : expf(m0 - mn0), al1 = mn1 == -INFINITY ? 1.f : expf(m1 - mn1);
    const float e00 = mn0 == -INFINITY ? 0.f : expf(s00 - mn0), e10 = mn0 == -INFINITY ? 0.f : expf(s10 - mn0);
    const float e01 = mn1 == -INFINITY ? 0.f : expf(s01 - mn1), e11 = mn1 == -INFINITY ? 0.f : expf(s11 - mn1);
    float r0 = e00 + e10, r1 = e01 + e11;
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
        r0 += __shfl_xor_sync(kFull, r0, o);
        r1 += __shfl_xor_sync(kFull, r1, o);
    }
    l0 = fmaf(l0, al0, r0), l1 = fmaf(l1, al1, r1);
    m0 = mn0, m1 = mn1;
#pragma unroll
    for (int d = 0; d < GG::RP; d++) O[d][0] *= al0, O[d][1] *= al1, O[d][2] *= al0, O[d][3] *= al1;

    /* P^T as the B operand: through the warp's tile, P[pos][q] */
    const float vA = __fmul_rn(vscb[ra_], psc), vB = __fmul_rn(vscb[rb_], psc);
    P[g * kPw + 2 * t] = e00 * vA, P[g * kPw + 2 * t + 1] = e01 * vA;
    P[(g + 8) * kPw + 2 * t] = e10 * vB, P[(g + 8) * kPw + 2 * t + 1] = e11 * vB;
    __syncwarp();
    uint32_t bh0, bh1, bl0, bl1;
    split_pair(P[(2 * t) * kPw + g], P[(2 * t + 1) * kPw + g], bh0, bl0);
    split_pair(P[(2 * t + 8) * kPw + g], P[(2 * t + 9) * kPw + g], bh1, bl1);
    __syncwarp();

    /* O^T += V^T P^T: dim m-tile 4 i + e holds dims 64 i + 4 g + e and 64 i + 32 + 4 g + e */
    const uint32_t *vr = VB + 16 * mt * GG::VW;
#pragma unroll
    for (int i = 0; i < HD / 64; i++) {
        const int wA = 16 * i + g, wB = wA + 8;
        uint32_t pa0[4], pa1[4], pa2[4], pa3[4];
        cross_pairs(vr[(2 * t) * GG::VW + wA] ^ 0x80808080u, vr[(2 * t + 1) * GG::VW + wA] ^ 0x80808080u, pa0);
        cross_pairs(vr[(2 * t) * GG::VW + wB] ^ 0x80808080u, vr[(2 * t + 1) * GG::VW + wB] ^ 0x80808080u, pa1);
        cross_pairs(vr[(2 * t + 8) * GG::VW + wA] ^ 0x80808080u, vr[(2 * t + 9) * GG::VW + wA] ^ 0x80808080u,
                    pa2);
        cross_pairs(vr[(2 * t + 8) * GG::VW + wB] ^ 0x80808080u, vr[(2 * t + 9) * GG::VW + wB] ^ 0x80808080u,
                    pa3);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            mma16816(O[4 * i + e], pa0[e], pa1[e], pa2[e], pa3[e], bh0, bh1);
            mma16816(O[4 * i + e], pa0[e], pa1[e], pa2[e], pa3[e], bl0, bl1);
        }
    }
}

template <int HD>
__global__ void __launch_bounds__(kWarps * 32) attn_int8_kernel(const AttnArgs a) {
    pdl_begin();
    using GG = Geo<HD>;
    extern __shared__ __align__(16) uint32_t sm[];
    const int nb = a.stage_bufs;                               /* 1 or 2 stage buffers */
    uint32_t *Ks = sm;                                         /* [nb][kStage][KW] int8 K rows */
    uint32_t *Vs = Ks + nb * kStage * GG::KW;                  /* [nb][kStage][VW] int8 V rows */
    float *ksc = reinterpret_cast<float *>(Vs + nb * kStage * GG::VW); /* [nb][kStage] the stages' K scales */
    float *vsc = ksc + nb * kStage;                            /* [nb][kStage] */
    const uint8_t **rowp = reinterpret_cast<const uint8_t **>(vsc + nb * kStage); /* [nb][kStage] K rows */
    uint32_t *Qh = reinterpret_cast<uint32_t *>(rowp + nb * kStage); /* [qchunk][QW] fp16 hi of q * 2^k */
    uint32_t *Ql = Qh + (size_t)a.qchunk * GG::QW;             /* lo */
    float *qinv = reinterpret_cast<float *>(Ql + (size_t)a.qchunk * GG::QW); /* [qchunk] 2^-k */
    float *Pw = qinv + a.qchunk;                               /* [kWarps][16][kPw] */
    float *red = Pw + kWarps * 16 * kPw;                       /* [kWarps] */
    float *mrg = reinterpret_cast<float *>(sm);                /* [kWarps - 1][RP * 4 + 4][32], over the stages at the end */
    static_assert((kWarps - 1) * (GG::RP * 4 + 4) * 32 <= kStage * (GG::KW + GG::VW), "merge area");

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    BlockSpan b;
    if (!block_span(a, a.deep_only, false, b)) return; /* a.deep_only: wide lanes are attention_int8_wide.cu's */
    const splash_cuda_attn_lane ln = b.ln;
    const int G = a.group, kvh = b.kvh, qv0 = b.qv0, nqb = b.nqb, nqt = b.nqt, p0 = b.p0, p1 = b.p1, nst = b.nst;
    const bool deep = b.deep;

    /* 1. the first stage (two with two buffers) in flight; meanwhile the
     * split's largest V scale and the query vectors as fp16 hi + lo of
     * q * 2^k (a warp per vector; zero past nqb) */
    stage_rows<HD>(a, ln, kvh, p0, p1, rowp, ksc, vsc);
    if (nb == 2 && nst > 1) stage_rows<HD>(a, ln, kvh, p0 + kStage, p1, rowp + kStage, ksc + kStage, vsc + kStage);
    __syncthreads();
    stage_copy<HD>(a, rowp, Ks, Vs);
    if (nb == 2) {
        if (nst > 1)
            stage_copy<HD>(a, rowp + kStage, Ks + kStage * GG::KW, Vs + kStage * GG::VW);
        else
            cp_async_commit(); /* one group per stage, empty or not: the wait below counts them */
    }
    split_vmax(a, ln, kvh, p0, p1, red);
    for (int qi = warp; qi < nqt * 8; qi += kWarps) {
        float v[HD / 32];
        float mx = 0.f;
        const float *src = nullptr;
        if (qi < nqb) {
            const int qv = qv0 + qi, r = qv / G, h = kvh * G + qv % G;
            src = a.q + (size_t)(ln.first_row + r) * a.ldq + (size_t)h * HD;
        }
#pragma unroll
        for (int j = 0; j < HD / 32; j++) {
            v[j] = src ? src[lane + 32 * j] : 0.f;
            mx = fmaxf(mx, fabsf(v[j]));
        }
        mx = warp_max(mx);
        float sc, inv;
        row_pow2_scale(mx, sc, inv);
        __half *qh = reinterpret_cast<__half *>(Qh + (size_t)qi * GG::QW);
        __half *ql = reinterpret_cast<__half *>(Ql + (size_t)qi * GG::QW);
#pragma unroll
        for (int j = 0; j < HD / 32; j++) {
            const float x = v[j] * sc;
            const __half h = __float2half_rn(x);
            qh[lane + 32 * j] = h;
            ql[lane + 32 * j] = __float2half_rn(x - __half2float(h));
        }
        if (lane == 0) qinv[qi] = inv;
    }

    /* 2. per stage of kStage positions, 16 at a time through mtile_step.
     * deep (the lane's query vectors fit one n-tile: a decode row): warp w
     * takes m-tile w of every stage against that n-tile, its own online
     * softmax, and the warps' states merge in warp order at the end; wide:
     * warp w takes n-tile w against every m-tile.  Either way a query
     * vector's arithmetic depends on its own lane and the split alone. */
    const int nt = deep ? 0 : warp;        /* the warp's n-tile */
    const bool active = deep || warp < nqt; /* wide: warp = its n-tile */
    TileState<HD> ts;
#pragma unroll
    for (int d = 0; d < GG::RP; d++) ts.O[d][0] = ts.O[d][1] = ts.O[d][2] = ts.O[d][3] = 0.f;
    ts.m0 = ts.m1 = -INFINITY, ts.l0 = ts.l1 = 0.f; /* query vectors qa, qa + 1 of the n-tile */
    const int qa = 8 * nt + 2 * t;
    const int lim0 = active && qa < nqb ? ln.n_past + (qv0 + qa) / G + 1 : 0;
    const int lim1 = active && qa + 1 < nqb ? ln.n_past + (qv0 + qa + 1) / G + 1 : 0;
    float psc = 1.f, pinv = 1.f;
    float *P = Pw + warp * 16 * kPw;
    const uint32_t *qh = Qh + (size_t)(8 * nt + g) * GG::QW, *ql = Ql + (size_t)(8 * nt + g) * GG::QW;
    for (int st = 0; st < nst; st++) { /* uniform */
        const int s0 = p0 + st * kStage, buf = nb == 2 ? st & 1 : 0;
        if (nb == 2)
            cp_async_wait<1>(); /* this stage's group (the next one may still fly) */
        else
            cp_async_wait<0>();
        __syncthreads();
        if (st == 0) { /* red[] and the q rows are written (the barrier above) */
            float vm = 0.f;
#pragma unroll
            for (int w = 0; w < kWarps; w++) vm = fmaxf(vm, red[w]);
            row_pow2_scale(vm, psc, pinv); /* P' = p * vsc * psc <= 2^14 (p <= 1) */
        }
        if (active) {
            const float qi0 = qinv[qa], qi1 = qinv[qa + 1];
            const uint32_t *KB = Ks + buf * kStage * GG::KW, *VB = Vs + buf * kStage * GG::VW;
            const float *kscb = ksc + buf * kStage, *vscb = vsc + buf * kStage;
            const int mts = (min(p1 - s0, kStage) + 15) / 16;
            const int mt1 = deep ? min(warp + 1, mts) : mts; /* deep: m-tile warp alone */
            for (int mt = deep ? warp : 0; mt < mt1; mt++)
                mtile_step<HD>(ts, KB, VB, kscb, vscb, mt, s0, qh, ql, qi0, qi1, lim0, lim1, a.scale, psc, P);
        }
        __syncthreads(); /* buffer buf is consumed */
        if (st + nb < nst) { /* uniform */
            stage_rows<HD>(a, ln, kvh, s0 + nb * kStage, p1, rowp + buf * kStage, ksc + buf * kStage, vsc + buf * kStage);
            __syncthreads();
            stage_copy<HD>(a, rowp + buf * kStage, Ks + buf * kStage * GG::KW, Vs + buf * kStage * GG::VW);
        } else if (nb == 2) {
            cp_async_commit();
        }
    }
    float (&O)[GG::RP][4] = ts.O;
    float &m0 = ts.m0, &m1 = ts.m1, &l0 = ts.l0, &l1 = ts.l1;

    /* 3. deep: warps 1.. hand their states to warp 0 (over the stage buffers:
     * every warp is past the last barrier above), which merges them in warp
     * order */
    if (deep) {
        constexpr int kMrg = GG::RP * 4 + 4; /* floats a lane hands over */
        if (warp) {
            float *w = mrg + (size_t)(warp - 1) * kMrg * 32 + lane;
#pragma unroll
            for (int d = 0; d < GG::RP; d++)
#pragma unroll
                for (int c = 0; c < 4; c++) w[(4 * d + c) * 32] = O[d][c];
            w[(4 * GG::RP) * 32] = m0, w[(4 * GG::RP + 1) * 32] = m1;
            w[(4 * GG::RP + 2) * 32] = l0, w[(4 * GG::RP + 3) * 32] = l1;
        }
        __syncthreads();
        if (warp) return;
        for (int src = 0; src < kWarps - 1; src++) {
            const float *w = mrg + (size_t)src * kMrg * 32 + lane;
            const float mw0 = w[(4 * GG::RP) * 32], mw1 = w[(4 * GG::RP + 1) * 32];
            /* a state that saw no position (m = -inf) adds nothing; otherwise
             * both rescale to the larger max (exp(-inf) = 0 for an empty own state) */
            const float mn0 = fmaxf(m0, mw0), mn1 = fmaxf(m1, mw1);
            const float a0 = mw0 == -INFINITY ? 1.f : expf(m0 - mn0), b0 = mw0 == -INFINITY ? 0.f : expf(mw0 - mn0);
            const float a1 = mw1 == -INFINITY ? 1.f : expf(m1 - mn1), b1 = mw1 == -INFINITY ? 0.f : expf(mw1 - mn1);
#pragma unroll
            for (int d = 0; d < GG::RP; d++) {
                if (d % 4 == 0) asm volatile("" ::: "memory"); /* a few loads ahead, not all 64: registers */
                O[d][0] = fmaf(O[d][0], a0, w[(4 * d + 0) * 32] * b0);
                O[d][1] = fmaf(O[d][1], a1, w[(4 * d + 1) * 32] * b1);
                O[d][2] = fmaf(O[d][2], a0, w[(4 * d + 2) * 32] * b0);
                O[d][3] = fmaf(O[d][3], a1, w[(4 * d + 3) * 32] * b1);
            }
            l0 = fmaf(l0, a0, w[(4 * GG::RP + 2) * 32] * b0);
            l1 = fmaf(l1, a1, w[(4 * GG::RP + 3) * 32] * b1);
            if (mw0 != -INFINITY) m0 = mn0;
            if (mw1 != -INFINITY) m1 = mn1;
        }
    }
    if (!active) return;

    /* 4. the partials of qa, qa + 1: O (times 2^-k of P), max, sum; or,
     * when the split is the query vector's whole context, its output: the
     * combine's operations on one split (o / l, then the gate), so the same
     * bits */
    const auto dim = [g](int d, int h) { return 64 * (d >> 2) + 4 * g + (d & 3) + 32 * h; };
    if (qa < nqb) write_vector<HD>(a, ln, kvh, qv0 + qa, lim0, blockIdx.z, O, 0, pinv, m0, l0, g == 0, dim);
    if (qa + 1 < nqb) write_vector<HD>(a, ln, kvh, qv0 + qa + 1, lim1, blockIdx.z, O, 1, pinv, m1, l1, g == 0, dim);
}

template <int HD>
int launch(const AttnArgs &a, dim3 grid, cudaStream_t s) {
    static bool attr_set = false; /* once per instantiation; setting it again is harmless */
    if (!attr_set) {
        SPLASH_CUDA_TRY(cudaFuncSetAttribute(attn_int8_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)(smem_words<HD>(kInt8MaxQ, 2) * 4)));
        attr_set = true;
    }
    SPLASH_CUDA_TRY(launch_kernel(attn_int8_kernel<HD>, grid, kWarps * 32, smem_words<HD>(a.qchunk, a.stage_bufs) * 4, s, a));
    return SPLASH_OK;
}

} /* namespace */

int splash_cuda::attn_int8_split_launch(const AttnArgs &a, int head_dim, dim3 grid, cudaStream_t s) {
    if (a.qchunk < 8 || a.qchunk > kInt8MaxQ || a.qchunk % 8 || a.stage_bufs < 1 || a.stage_bufs > 2)
        return SPLASH_E_INVALID;
    switch (head_dim) {
    case 64: return launch<64>(a, grid, s);
    case 128: return launch<128>(a, grid, s);
    case 256: return launch<256>(a, grid, s);
    default: return SPLASH_E_UNSUPPORTED;
    }
}
