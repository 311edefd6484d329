/* attention_int8_flash.cu - bulk prefill rows (calls with a split of
 * SPLASH_CUDA_ATTN_SPLIT_LONG or longer: splash_cuda_attn_bulk_split) over
 * int8 pages, flash style, on Hopper's warpgroup products (wgmma.cuh).
 *
 * Why.  A 32K prompt's prefill spent ~40% of its time in attention (27B,
 * 6.0K tokens/s at 32K against 8.7K at 8K).  attention_int8_wide.cu, built
 * for verify rows, puts the positions on M (32 query vectors a block) and is
 * fp32 grade.  Prefill is fp16 grade elsewhere (the products' GEMM), so here
 * the query vectors are the products' M side: a block takes 128 of them (two
 * warpgroups of 64) against one staged copy of each K / V tile:
 *   scores   S (64 q x 64 pos) = Qd (s8, K-major) . K^T (s8, K-major, the
 *            staged rows as they are, swizzled on the copy), one m64n64k32
 *            per 32 dims and digit: q as two 8-bit digits (q 2^k rounded to
 *            x, |x| < 2^14, x = 256 hi + lo), ~15 bits of q, each digit's
 *            sum exact in int32
 *   softmax  online over the stage's 64 positions, base 2
 *   output   O (64 q x HD, fp32) += P' (fp16, the scores' accumulator
 *            fragments as A, in registers) . V (fp16, MN-major: V widened by
 *            the threads that copied it into 128-byte rows of 64 dims), one
 *            m64n64k16 per 16 positions and 64 dims; P' = p vs 2^e (the V
 *            scale of each position, and a power of two from the split's
 *            largest V scale, as the other layouts)
 * so K is never converted.
 *
 * A block: one (lane, kv head, split, chunk of kFlashQ = 128 query vectors),
 * 8 warps, warp w the chunk's vectors 16 w .. 16 w + 15 (vector v: row v /
 * G, head v % G of the kv head's group), warpgroup g the vectors 64 g ..
 * Stages of 64 positions, K and V copied by cp.async two stages ahead; V
 * widened to fp16 into two buffers by the threads that copied it, so a
 * stage needs one barrier (against a barrier before and after a block-wide
 * widening, 27B 1,024 rows at 31,744 positions 4,396 -> 3,899 us, session
 * 37); a warpgroup skips a stage none of its vectors sees.  Each vector's
 * result (the partials or one-split outputs the other layouts write, which
 * the combine merges) depends only on its own inputs, the split and the
 * block's V scales.  Error against cpu_attention ~2e-4 relative, from P' in
 * fp16 (test_cuda_ops' bound 1e-3).  SPLASH_CUDA_ATTN_FLASH=0 sends the
 * long splits' lanes back to attention_int8_wide.cu (an A/B switch).
 *
 * Shared memory (head_dim 256): q digits 2 x 2 x 16 KB, K 2 x 16 KB, V
 * landing 2 x 16 KB, V fp16 2 x 32 KB, all tiles 1,024-byte aligned;
 * 254 registers, no spills.  Head_dim 64 (the test shapes) keeps the
 * 128-byte rows of the K-major tiles half used: its two k-steps read only
 * their first 64 bytes.
 *
 * Measured (H200, bench/gpu/bench_attention.cu, one 27B lane, us and causal
 * TFLOP/s; docs/cuda.md, sessions 37 and 41): 4,096 rows from 0 970 (213);
 * 1,024 rows after 16,384 1,680 (253); 1,024 after 31,744 2,989 (272).  The
 * form before it, on mma.sync with ldmatrix (session 37, removed in session
 * 42), took 1,198 (172), 2,156 (197) and 3,900 (208): it issued on a third
 * of its cycles at 243 registers; the wide kernel 2,522, 3,818 and 7,186.
 * The full 27B's 32K prefill 8,640 against 8,120 tokens/s with the mma.sync
 * form, the 35B-A3B's 15,761 against 15,066.  Three forms measured slower or
 * no faster: each stage's P' V waited for at once (3,066 us at the last
 * shape; leaving it in flight lets it run under the next widening); the
 * groups taking turns at issuing (FlashAttention-3's ping-pong, named
 * barriers: 3,287 us); a group's stage in halves of 32 positions with half
 * j's scores issued beside half j - 1's P' V (223 registers, 3,357 us).  O
 * is not zeroed before the loop: with the P' V's wait in the next stage,
 * ptxas then serialises every wgmma (its C7515 remark).
 *
 * C++ used: templates over head_dim, lambdas; no STL.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/attention_int8.cuh"
#include "backend/cuda/attention_split.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/q4_tile.cuh"
#include "backend/cuda/wgmma.cuh"

using namespace splash_cuda;
using namespace splash_cuda::int8_attn;

namespace {

constexpr int kWarps = kFlashQ / 16;
constexpr int kThreads = kWarps * 32;
constexpr int kSets = 3; /* row-address and scale sets: stage s uses set s % 3 */

template <int HD>
struct WgGeo {
    static constexpr int ST = kStage;            /* positions a stage */
    static constexpr int RP = HD / 16;           /* 16-byte pieces of an int8 row */
    static constexpr int KP = HD < 128 ? 128 : HD; /* bytes a K-major row takes: 128-byte rows, half used at HD 64 */
    static constexpr size_t qtile = 64 * KP;     /* one warpgroup's digit: 64 vectors x HD s8 */
    static constexpr size_t ktile = ST * KP;     /* a stage's K, s8 */
    static constexpr size_t vtile = 2 * ST * HD; /* a stage's V, f16 */
    static constexpr size_t ltile = ST * HD;     /* a stage's V as copied, s8 */
    /* bytes from the 1,024-aligned base: q [2 groups][hi, lo], K [2], V fp16 [2], V landing [2],
     * row addresses [kSets][ST], K and V scales [kSets][ST] each, red[kWarps] */
    static constexpr size_t qd = 0, kb = qd + 4 * qtile, v16 = kb + 2 * ktile, vl = v16 + 2 * vtile;
    static constexpr size_t rows = vl + 2 * ltile, ksc = rows + kSets * ST * sizeof(void *);
    static constexpr size_t vsc = ksc + kSets * ST * 4, red = vsc + kSets * ST * 4;
    static constexpr size_t bytes = red + kWarps * 4 + 1024; /* + the base's alignment */
};

__device__ __forceinline__ float ex2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ uint32_t half2_bits(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

/* The block's query vectors wq0 .. wq0 + 15 as two 8-bit digits:
 * lane (v = lane / 2, half lane & 1) scales vector v's half of the dims by
 * a power of two (|q 2^k| < 2^14) and rounds it to x = 256 hi + lo, lo in
 * [-128, 127]; store(v, d, hi, lo) takes the digits of dims d .. d + 3 as
 * two words (zeros for v >= nv).  Returns 2^-k of vector lane / 2. */
template <int HD, typename Store>
__device__ __forceinline__ float q_digits(const AttnArgs &a, const splash_cuda_attn_lane &ln, int kvh, int wq0, int nv,
                                          Store store) {
    const int lane = threadIdx.x & 31, v = lane >> 1, d0 = (lane & 1) * (HD / 2);
    const float *src = nullptr;
    if (v < nv) {
        const int qv = wq0 + v, r = qv / a.group, h = kvh * a.group + qv % a.group;
        src = a.q + (size_t)(ln.first_row + r) * a.ldq + (size_t)h * HD + d0;
    }
    const bool al = ((uintptr_t)src & 15) == 0;
    float mx = 0.f;
    if (src)
#pragma unroll 4
        for (int i = 0; i < HD / 2; i += 4) {
            const float4 x = load4(src + i, al);
            mx = fmaxf(mx, fmaxf(fmaxf(fabsf(x.x), fabsf(x.y)), fmaxf(fabsf(x.z), fabsf(x.w))));
        }
    mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
    float sc, inv;
    row_pow2_scale(mx, sc, inv, 14, 126); /* |q 2^k| < 2^14: hi = (x + 128) >> 8 within [-64, 64] */
#pragma unroll 4
    for (int i = 0; i < HD / 2; i += 4) {
        uint32_t wh = 0, wl = 0;
        if (src) {
            const float4 x = load4(src + i, al);
            const int x0 = __float2int_rn(x.x * sc), x1 = __float2int_rn(x.y * sc);
            const int x2 = __float2int_rn(x.z * sc), x3 = __float2int_rn(x.w * sc);
            wl = bytes_of(x0, x1, x2, x3, 0x40); /* lo: the low byte as signed */
            wh = bytes_of((x0 + 128) >> 8, (x1 + 128) >> 8, (x2 + 128) >> 8, (x3 + 128) >> 8, 0x40);
        }
        store(v, d0 + i, wh, wl);
    }
    return inv;
}

/* The online softmax over a stage's 8 n-tiles of 8 positions for a
 * lane's two vectors (r 0: g, 1: g + 8): s[n][i] the scores (base 2, masked
 * to -inf) of vector i / 2 at the tile's positions 2 t + i % 2, c[r] the
 * lane's largest of them; m, l the running max and this lane's share of
 * the sum.  Out: al[r] the factor the vector's O takes, pa[n][r] its P' =
 * p vs psc at the tile's two positions as f16x2 (vs: the V scales, at the
 * lane's first position). */
__device__ __forceinline__ void online_softmax(const float (&s)[8][4], float (&c)[2], float (&m)[2], float (&l)[2],
                                               const float *vs, float psc, uint32_t (&pa)[8][2], float (&al)[2]) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        c[r] = fmaxf(c[r], __shfl_xor_sync(kFull, c[r], 1));
        c[r] = fmaxf(c[r], __shfl_xor_sync(kFull, c[r], 2));
        const float mn = fmaxf(m[r], c[r]), mx = mn == -INFINITY ? 0.f : mn; /* -inf - 0: every weight 0 */
        al[r] = ex2(m[r] - mx);
        m[r] = mn;
        c[r] = mx;
    }
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < 8; n++) {
        const float2 v2 = *reinterpret_cast<const float2 *>(vs + 8 * n);
        const float va = v2.x * psc, vb = v2.y * psc;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float p0 = ex2(s[n][2 * r] - c[r]), p1 = ex2(s[n][2 * r + 1] - c[r]);
            sum[r] += p0 + p1;
            pa[n][r] = half2_bits(p0 * va, p1 * vb);
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) l[r] = fmaf(l[r], al[r], sum[r]);
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

/* The lane's two vectors g = lane / 4 and g + 8 of the
 * warp's wq0 .. (nv of them; qinv from q_digits): qf[r] = 2^-k scale log2
 * e, lim[r] the first position the vector does not see (at most p1; 0 past
 * nv). */
__device__ __forceinline__ void flash_vectors(const AttnArgs &a, const splash_cuda_attn_lane &ln, int wq0, int nv,
                                              int p1, float qinv, float (&qf)[2], int (&lim)[2]) {
    const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int v = g + 8 * r;
        qf[r] = __shfl_sync(kFull, qinv, 2 * v) * a.scale * kLog2e;
        lim[r] = v < nv ? min(ln.n_past + (wq0 + v) / a.group + 1, p1) : 0;
    }
}

/* P's power of two psc (and its inverse) from the split's largest V scale,
 * the warps' shares in red[] (split_start's, after a barrier): P' = p vs psc
 * <= 2^14 (p <= 1). */
__device__ __forceinline__ void split_p_scale(const float *red, int warps, float &psc, float &pinv) {
    float vm = 0.f;
    for (int w = 0; w < warps; w++) vm = fmaxf(vm, red[w]);
    row_pow2_scale(vm, psc, pinv);
}

/* The end for the lane's two vectors (flash_vectors'): the
 * sums l over the quad, then each vector's partial or output (write_vector),
 * its O as o_of(r, o) gives it: o[n][0] and o[n][2] dims 8 n + 2 t and + 1
 * of vector g + 8 r. */
template <int HD, typename OOf>
__device__ __forceinline__ void flash_write(const AttnArgs &a, const splash_cuda_attn_lane &ln, int kvh, int wq0, int nv,
                                            const float (&m)[2], const float (&l)[2], float pinv, OOf o_of) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float ls = l[r];
        ls += __shfl_xor_sync(kFull, ls, 1);
        ls += __shfl_xor_sync(kFull, ls, 2);
        const int v = g + 8 * r;
        if (v >= nv) continue;
        float o[HD / 8][4];
        o_of(r, o);
        write_vector<HD>(a, ln, kvh, wq0 + v, ln.n_past + (wq0 + v) / a.group + 1, blockIdx.z, o, 0, pinv,
                         m[r] * kLn2, ls, t == 0, [t](int n, int h) { return 8 * n + 2 * t + h; });
    }
}

/* A stage's copy (after its rows and a barrier; every thread): K rows into
 * the swizzled K-major tile (piece c of row r: column block c / 8, chunk c
 * % 8), V rows into the landing area; piece i of each is thread i mod
 * kThreads's (widen_own's); zeros past p1; one group. */
template <int HD>
__device__ __forceinline__ void copy_stage(const AttnArgs &a, const uint8_t *const *rowp, uint8_t *Kt, uint8_t *Vl) {
    using F = WgGeo<HD>;
    const size_t vdelta = a.v_off - a.k_off;
#pragma unroll 2
    for (int i = threadIdx.x; i < F::ST * F::RP; i += kThreads) {
        const int r = i / F::RP, c = i % F::RP;
        const uint8_t *row = rowp[r];
        cp_async16(smem_addr(Kt + (c / 8) * F::ST * 128 + wg::sw128(r, c % 8)), row ? row + (size_t)c * 16 : a.pool,
                   row ? 16 : 0);
        cp_async16(smem_addr(Vl + r * HD + 16 * c), row ? row + vdelta + (size_t)c * 16 : a.pool, row ? 16 : 0);
    }
    cp_async_commit();
}

/* The V pieces this thread copied widened to fp16 into the MN-major tile
 * (dims 16 c .. 16 c + 15 of position r: column block c / 4, chunks 2 (c %
 * 4) and + 1 of row r), then the proxy fence that lets wgmma read them and
 * the thread's K pieces after the barrier. */
template <int HD>
__device__ __forceinline__ void widen_own(const uint8_t *Vl, uint8_t *V16) {
    using F = WgGeo<HD>;
    static_assert(F::ST * F::RP % kThreads == 0, "a thread's V pieces are tid + kThreads m in copy_stage");
#pragma unroll
    for (int i = threadIdx.x; i < F::ST * F::RP; i += kThreads) {
        const int r = i / F::RP, c = i % F::RP;
        const uint4 w = *reinterpret_cast<const uint4 *>(Vl + r * HD + 16 * c);
        uint4 o0, o1;
        word_pairs(w.x ^ 0x80808080u, o0.x, o0.y);
        word_pairs(w.y ^ 0x80808080u, o0.z, o0.w);
        word_pairs(w.z ^ 0x80808080u, o1.x, o1.y);
        word_pairs(w.w ^ 0x80808080u, o1.z, o1.w);
        uint8_t *blk = V16 + (c / 4) * F::ST * 128;
        *reinterpret_cast<uint4 *>(blk + wg::sw128(r, 2 * (c % 4))) = o0;
        *reinterpret_cast<uint4 *>(blk + wg::sw128(r, 2 * (c % 4) + 1)) = o1;
    }
    wg::fence_proxy_async();
}

/* A group's scores of the stage's 64 positions against its 64 vectors
 * into hi / lo, the digits' sums: issued and committed. */
template <int HD>
__device__ __forceinline__ void issue_scores(int (&hi)[32], int (&lo)[32], uint32_t q0, uint32_t kt) {
    using F = WgGeo<HD>;
#pragma unroll
    for (int j = 0; j < HD / 32; j++) {
        const uint32_t off = (j / 4) * F::ST * 128 + (j % 4) * 32, qoff = (j / 4) * 64 * 128 + (j % 4) * 32;
        const uint64_t kd = wg::desc128(kt + off);
        wg::mma_s8_64x64x32(hi, wg::desc128(q0 + qoff), kd, j > 0);
        wg::mma_s8_64x64x32(lo, wg::desc128(q0 + (uint32_t)F::qtile + qoff), kd, j > 0);
    }
    wg::commit();
}

/* The lane's scores of the stage's 8 n-tiles (positions s0 + 8 n + 2 t,
 * + 1) as online_softmax takes them: base 2, -inf past each vector's
 * limit, and the lane's largest a vector in c. */
__device__ __forceinline__ void score_floats(const int (&hi)[32], const int (&lo)[32], const float *ks, int s0,
                                             const float (&qf)[2], const int (&lim)[2], float (&s)[8][4],
                                             float (&c)[2]) {
    const int t = threadIdx.x & 3;
    c[0] = c[1] = -INFINITY;
#pragma unroll
    for (int n = 0; n < 8; n++) {
        const float2 k2 = *reinterpret_cast<const float2 *>(ks + 8 * n + 2 * t);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = i >> 1, pos = s0 + 8 * n + 2 * t + (i & 1);
            /* 256 hi + lo is exact in int32 (|hi| < 2^22, |lo| < 2^22): one rounding, as fmaf's */
            const float S = (float)(hi[4 * n + i] * 256 + lo[4 * n + i]);
            const float x = pos < lim[r] ? S * (i & 1 ? k2.y : k2.x) * qf[r] : -INFINITY;
            s[n][i] = x;
            c[r] = fmaxf(c[r], x);
        }
    }
}

/* The last stage's O += P' V done (before the group's V tile is written again, or O is read). */
template <int HD>
__device__ __forceinline__ void pv_done(float (&O)[HD / 64][32]) {
    wg::wait<0>();
#pragma unroll
    for (int cb = 0; cb < HD / 64; cb++) wg::fence_regs(O[cb]);
}

/* A group's running state: O, the max m (base 2, scaled) and this lane's
 * share of the sum l of its two vectors, whether O holds a product yet. */
template <int HD>
struct WgState {
    float O[HD / 64][32];
    float m[2], l[2];
    int started; /* O holds a product */
};

/* A warpgroup's stage: positions s0 .. s0 + 63 against its 64 vectors (the
 * lane's two: g and g + 8 of its warp's 16).  q0 / kt / vt: shared
 * addresses of the group's hi digits (lo one qtile further), the stage's K
 * and fp16 V; ks / vs the positions' scales; qf, lim as flash_vectors
 * gives them; p.O[c][4 n + i]: dims 64 c + 8 n + 2 t + i % 2 of vector i / 2
 * (while p.started is 0 the first P' V replaces it).
 * The stage's P' V is left in flight: the next stage (or pv_done) waits. */
template <int HD>
__device__ __forceinline__ void wg_stage(WgState<HD> &p, uint32_t q0, uint32_t kt, uint32_t vt, const float *ks,
                                         const float *vs, int s0, const float (&qf)[2], const int (&lim)[2], float psc) {
    using F = WgGeo<HD>;
    const int t = threadIdx.x & 3;
    float(&O)[HD / 64][32] = p.O;
    int hi[32], lo[32];
    pv_done<HD>(O);
    wg::fence();
    issue_scores<HD>(hi, lo, q0, kt);
    wg::wait<0>();
    wg::fence_regs(hi);
    wg::fence_regs(lo);
    float s[8][4], c[2];
    score_floats(hi, lo, ks, s0, qf, lim, s, c);
    float al[2];
    uint32_t pa[8][2];
    online_softmax(s, c, p.m, p.l, vs + 2 * t, psc, pa, al);
    if (p.started && __any_sync(kFull, al[0] != 1.f || al[1] != 1.f))
#pragma unroll
        for (int cb = 0; cb < HD / 64; cb++)
#pragma unroll
            for (int i = 0; i < 32; i++) O[cb][i] *= al[(i >> 1) & 1];
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const uint32_t a[4] = {pa[2 * kk][0], pa[2 * kk][1], pa[2 * kk + 1][0], pa[2 * kk + 1][1]};
#pragma unroll
        for (int cb = 0; cb < HD / 64; cb++)
            wg::mma_f16_rs_64x64x16_mn(O[cb], a, wg::desc128(vt + cb * F::ST * 128 + kk * 16 * 128), p.started | kk);
    }
    p.started = 1;
    wg::commit(); /* waited for by the next stage (pv_done): it overlaps the next widening */
}

template <int HD>
__global__ void __launch_bounds__(kThreads, 1) attn_int8_flash_kernel(const AttnArgs a) {
    pdl_begin();
    using F = WgGeo<HD>;
    constexpr int ST = F::ST;
    extern __shared__ __align__(16) uint8_t smw[];
    uint8_t *sm = smw + ((1024 - (smem_addr(smw) & 1023)) & 1023);
    uint8_t *Kt = sm + F::kb, *Vl = sm + F::vl, *V16 = sm + F::v16;
    const uint8_t **rowp = reinterpret_cast<const uint8_t **>(sm + F::rows);
    float *ksc = reinterpret_cast<float *>(sm + F::ksc), *vsc = reinterpret_cast<float *>(sm + F::vsc);
    float *red = reinterpret_cast<float *>(sm + F::red);

    const int tid = threadIdx.x, warp = tid >> 5, grp = warp >> 2;
    BlockSpan b;
    if (!block_span(a, false, false, b)) return;
    const splash_cuda_attn_lane ln = b.ln;
    const int G = a.group, kvh = b.kvh, p0 = b.p0, p1 = b.p1, nst = b.nst;

    /* 1. rows of the first two stages, the split's largest V scale, the
     * first stage's copy in flight; meanwhile the warps' q digits */
    split_start<HD, ST>(a, ln, kvh, p0, p1, nst, rowp, ksc, vsc, red);
    __syncthreads();
    copy_stage<HD>(a, rowp, Kt, Vl);

    const int wq0 = b.qv0 + 16 * warp, nv = max(0, min(16, b.nqb - 16 * warp));
    uint8_t *qg = sm + F::qd + (size_t)grp * 2 * F::qtile; /* the group's hi digits, then its lo */
    const int wr = 16 * (warp & 3);                        /* the warp's first row in its group's tile */
    const float qinv = q_digits<HD>(a, ln, kvh, wq0, nv, [qg, wr](int v, int d, uint32_t wh, uint32_t wl) {
        const uint32_t at = (d / 128) * 64 * 128 + wg::sw128(wr + v, (d % 128) / 16) + d % 16;
        *reinterpret_cast<uint32_t *>(qg + at) = wh;
        *reinterpret_cast<uint32_t *>(qg + F::qtile + at) = wl;
    });
    float qf[2];
    int lim[2];
    flash_vectors(a, ln, wq0, nv, p1, qinv, qf, lim);
    /* the group's last position + 1 (its last vector's context), 0 when it has none */
    const int gq0 = b.qv0 + 64 * grp, gnv = max(0, min(64, b.nqb - 64 * grp));
    const int glim = gnv ? min(ln.n_past + (gq0 + gnv - 1) / G + 1, p1) : 0;

    /* O is first written by a product (started 0: scale-d 0), not zeroed:
     * ptxas serialises every wgmma of a loop whose accumulators other
     * instructions define before it (C7515), which the zeros did */
    WgState<HD> pp;
    pp.m[0] = pp.m[1] = -INFINITY, pp.l[0] = pp.l[1] = 0.f;
    pp.started = 0;
    const uint32_t q0 = smem_addr(qg), kt0 = smem_addr(Kt), vt0 = smem_addr(V16);
    float psc = 1.f, pinv = 1.f;

    /* 2. one barrier a stage: stage st computed by
     * each group that sees it; stage st + 1's copy waited for and its V
     * widened by the threads that copied it; the barrier; stage st + 2's
     * copy and stage st + 3's rows.  The q digits' proxy fence is stage
     * 0's widening's. */
    cp_async_wait<0>();
    widen_own<HD>(Vl, V16);
    __syncthreads();
    split_p_scale(red, kWarps, psc, pinv); /* red[] is written (the first barrier) */
    if (nst > 1) copy_stage<HD>(a, rowp + ST, Kt + F::ktile, Vl + F::ltile);
    if (nst > 2) stage_rows<HD, ST>(a, ln, kvh, p0 + 2 * ST, p1, rowp + 2 * ST, ksc + 2 * ST, vsc + 2 * ST);
    for (int st = 0; st < nst; st++) { /* uniform */
        const int buf = st & 1, set = st % kSets, s0 = p0 + st * ST;
        const uint32_t kt = kt0 + buf * (uint32_t)F::ktile, vt = vt0 + buf * (uint32_t)F::vtile;
        const float *ks = ksc + set * ST, *vs = vsc + set * ST;
        if (s0 < glim) /* uniform in the group */
            wg_stage<HD>(pp, q0, kt, vt, ks, vs, s0, qf, lim, psc);
        else
            pv_done<HD>(pp.O);
        if (st + 1 < nst) {
            cp_async_wait<0>();
            widen_own<HD>(Vl + (buf ^ 1) * F::ltile, V16 + (buf ^ 1) * F::vtile);
        }
        __syncthreads();
        if (st + 2 < nst)
            copy_stage<HD>(a, rowp + ((st + 2) % kSets) * ST, Kt + buf * F::ktile, Vl + buf * F::ltile);
        if (st + 3 < nst) {
            const int s3 = (st + 3) % kSets;
            stage_rows<HD, ST>(a, ln, kvh, p0 + (st + 3) * ST, p1, rowp + s3 * ST, ksc + s3 * ST, vsc + s3 * ST);
        }
    }

    /* 3. each vector's partial or output: o[8 cb + n][0] and [2] its dims 64 cb + 8 n + 2 t and + 1 */
    pv_done<HD>(pp.O);
    float(&O)[HD / 64][32] = pp.O;
    if (!pp.started) /* the group saw none of the split: O is 0 */
#pragma unroll
        for (int cb = 0; cb < HD / 64; cb++)
#pragma unroll
            for (int i = 0; i < 32; i++) O[cb][i] = 0.f;
    flash_write<HD>(a, ln, kvh, wq0, nv, pp.m, pp.l, pinv, [&O](int r, float (&o)[HD / 8][4]) {
#pragma unroll
        for (int cb = 0; cb < HD / 64; cb++)
#pragma unroll
            for (int n = 0; n < 8; n++) {
                o[8 * cb + n][0] = o[8 * cb + n][1] = O[cb][4 * n + 2 * r];
                o[8 * cb + n][2] = o[8 * cb + n][3] = O[cb][4 * n + 2 * r + 1];
            }
    });
}

template <int HD>
int launch(const AttnArgs &a, dim3 grid, cudaStream_t s) {
    static bool attr_set = false; /* once per instantiation; setting it again is harmless */
    if (!attr_set) {
        SPLASH_CUDA_TRY(cudaFuncSetAttribute(attn_int8_flash_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)WgGeo<HD>::bytes));
        attr_set = true;
    }
    SPLASH_CUDA_TRY(launch_kernel(attn_int8_flash_kernel<HD>, grid, kThreads, WgGeo<HD>::bytes, s, a));
    return SPLASH_OK;
}

} /* namespace */

int splash_cuda::attn_int8_flash_launch(const AttnArgs &a, int head_dim, dim3 grid, cudaStream_t s) {
    if (a.qchunk != kFlashQ) return SPLASH_E_INVALID;
    switch (head_dim) {
    case 64: return launch<64>(a, grid, s);
    case 128: return launch<128>(a, grid, s);
    case 256: return launch<256>(a, grid, s);
    default: return SPLASH_E_UNSUPPORTED;
    }
}
