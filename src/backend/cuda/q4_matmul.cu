/* q4_matmul.cu - q4 matrix-vector and small-M (1..16 rows) products for decode
 * and verify, on the tiled layout described in q4_matmul.h.
 *
 * Why it is shaped so.  Decode and verify are bound by the weight bytes read
 * (0.5625 B per weight), so everything serves one goal: keep enough 16-byte
 * loads of codes in flight to saturate HBM while the arithmetic hides under
 * them, for 1 row of x as for 16.
 *
 * - Tensor cores (integer mma.sync m16n8k32, u8 x s8 -> exact int32) do the
 *   dot products, because at M = 16 plain fp32 FMAs would need ~2x the FP32
 *   rate of the chip to keep up with HBM.  The A operand is 16 weight rows x
 *   32 columns of codes q (0..15): a lane's 16 bytes of a (tile, group) are
 *   its A registers of two k-steps after one mask or shift-and-mask per 8
 *   codes (tile_products8).  The B operand is x as three signed 8-bit digits,
 *   after each group of 64 columns of an x row is scaled by its own power of
 *   two (the group's largest |x| in [2^21, 2^22)) and rounded: ~22 bits of x
 *   (as the fp16 hi / lo pair this replaced, session 14), fp32-grade results.
 *   Against that fp16 form (m16n8k16: a LOP3 and an f16x2 op per two codes,
 *   four mma a tile) a tile's arithmetic at M <= 2 is about half, which is
 *   what the decode products were short of (NOTES.md, session 14: the 27B's
 *   products 7-13% faster at M = 1, lm_head 210 -> 180 us, the 27B step 7.23
 *   -> 6.72 ms).
 * - One value a group: the digits' int32 sums become floats through the
 *   accumulator's start value (digit_magic: no conversion instruction), and
 *   a group's S = 65536 S_hi + 256 S_mid + S_lo is their sum, rounded once
 *   (the comment above XFrag says why once); the group affine is then
 *   applied per (row, x row, group) in fp32: acc += (scale 2^-k) S, then acc
 *   += bias sum_g(x), with sum_g(x) and 2^-k precomputed once per activation
 *   (splash_q4_prep_x).  One accumulator per (row, x row) in every mode, so
 *   a row's result does not depend on M; until session 16 each digit had its
 *   own (three at M >= 8: the registers that made M = 16 spill).  Per-group
 *   powers (not one per row) let the preparation run on many blocks with no
 *   row-wide maximum first.
 * - M <= 2 / 4: an n-tile per pair of x rows, each holding both rows' three
 *   digits; M <= 8 / 16: an n-tile per digit and 8 x rows.  A 32-row class
 *   (4 x tiles) measured no faster than two 16-row launches (NOTES.md,
 *   session 19): past 8 rows the per-(row, x row, group) arithmetic, not the
 *   weight bytes, sets the time.
 * - A warp owns R row tiles (16 rows each) and a slice of the groups, U groups
 *   per step.  Weights stream straight into registers, L1 bypassed: all R*U
 *   16-byte loads of a step are issued before any is used (stages = 0), or
 *   the next step's loads are issued before this step is computed (stages = 1,
 *   two register buffers).  Tried and measured slower (NOTES.md): a per-lane
 *   cp.async ring in shared memory (2-3x), a per-warp ring of 4-8 steps
 *   filled by bulk copies (the copy engine; 1.4x at M = 1: bytes in flight
 *   are not what limits these products).  x (small, L1-resident) is read
 *   per group and reused R times; the warps of a block share the column slice,
 *   hence x in L1.
 * - Column split, two levels: a cluster of `ksplit` blocks (grid.x) covers
 *   the same rows, each a contiguous slice of the groups, and inside a block
 *   `wk` warps split the block's slice again (the other warps own more row
 *   tiles).  Partial sums meet in shared memory (the wk slices, added in
 *   slice order), then in distributed shared memory (each block adds up
 *   1/ksplit of the rows in rank order): deterministic, no atomics, no
 *   workspace.  More warps on a mid-size matrix keep more loads in flight:
 *   wk 4 took the 27B's stacked gate|up from 43 to 37 us (NOTES.md).
 * - y = W x, or y += W x (splash_q4_matmul_add: the residual add in the
 *   epilogue, the product rounded before the add).
 * - Grouped (MoE experts, splash_q4_matmul_grouped): grid.z is a (row,
 *   expert) slot; make_view reads the slot's expert id on the device and
 *   points the block at that expert's matrix, its x row and its output, M = 1.
 *   Or, with a plan (splash_q4_group_plan), grid.z is a group of up to 4
 *   slots of one expert: M = the group's size, x rows and outputs per slot,
 *   so an expert that several rows chose is read once (a verify block).
 *   No host synchronisation, so a MoE layer runs inside a CUDA graph.
 *
 * C++ used: templates (the tile shape per instantiation), nothing from the
 * STL.  Shapes enter as kernel arguments; the per-shape choice of
 * instantiation is the preset table at the bottom (measured, see NOTES.md).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cooperative_groups.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/q4_gemm.h"
#include "backend/cuda/q4_matmul.h"
#include "backend/cuda/q4_plan.cuh"
#include "backend/cuda/q4_prep.cuh"
#include "backend/cuda/q4_tile.cuh"

namespace cg = cooperative_groups;
using namespace splash_cuda;

namespace {

constexpr int kTileBytes = 512; /* codes of one (row tile, group) */
constexpr int kSbBytes = 64;    /* scales + biases of one (row tile, group) */
constexpr int kMaxWarps = 8;
constexpr int kMaxKsplit = 8;
/* Slots of a planned group (splash_q4_plan_group): 2, the kernel of one pair of
 * x rows.  Measured (35B-A3B synthetic, 40 layers, H200, session 14): groups
 * of 4 on the kernel of two pairs made an 8-row verify 5.48 ms, groups of 2
 * 5.27 (under ncu a planned product of groups of 4 took 66 us where the fp16
 * kernel before it took 43: twice the digit n-tiles, and registers). */
constexpr int kPlanGroupDefault = 2;

struct Params {
    const uint8_t *codes;   /* [tiles][groups][512] */
    const uint8_t *sb;      /* [tiles][groups][64] */
    const int8_t *x8;       /* [rows][3][cols]: x 2^k's digits hi, mid, lo (splash_q4_xprep) */
    const float *gsum;      /* [groups][gstride] sums of x */
    const float *ginv;      /* [groups][gstride] 2^-k of the group */
    float *y;               /* [M][rows] */
    int rows, tiles, groups, cols, M, ksplit;
    int wk;                 /* warps of a block splitting its groups (the rest own row tiles) */
    int gstride;            /* floats between one group's sums and the next's (the xprep's rows_cap) */
    /* grouped (the GROUPED kernels): block z takes slot j = z / nmat, matrix
     * array z % nmat (codes / codes2), expert idx[j]'s matrix at codes + e *
     * estride (its sb sboff further), x row j / xdiv, M = 1, into y (y2) +
     * j * yslot */
    const int32_t *idx;
    const int32_t *plan;    /* not NULL: block z takes group z / nmat of the plan (splash_q4_group_plan) */
    const uint8_t *codes2;
    float *y2;
    size_t estride, sboff, yslot;
    int n_experts, xdiv, nmat;
    int add;                /* y += the product (rounded first: the bits of a product, then an add) */
};

/* What a block reads and writes: Params' pointers, or for a grouped block its
 * slot's (make_view).  Built field by field: a modified copy of the Params
 * kernel argument miscompiled (nvcc 13, -O3: the codes loads kept the
 * argument's pointer while sb moved; test_q4_matmul's grouped checks). */
struct View {
    const uint8_t *codes, *sb;
    const int8_t *x8;
    const float *gsum, *ginv;
    float *y;
    const int32_t *gslot; /* a planned group's slots (their outputs); NULL: result m at y + m * rows */
    int M;
    int xr[4];            /* MODE 0: x rows 0..3 (indexed by constants only: registers) */
    int xb, xo0, xo1;     /* MODE 1: the x row of the lane's B column, and of its C columns 2t, 2t + 1 */
};

/* x row m's results: y + m * rows, or a planned group's slot m's output */
__device__ __forceinline__ float *out_row(const Params &p, const View &v, int m) {
    return v.gslot ? v.y + (size_t)__ldg(v.gslot + m) * p.yslot : v.y + (size_t)m * p.rows;
}

/* Where a result goes: y = r, or y = y + r (no fused multiply-add: the
 * same bits as a separate add kernel). */
__device__ __forceinline__ void store_y(const Params &p, float *y, float r) { *y = p.add ? __fadd_rn(*y, r) : r; }

/* ---- the int8 view of a tile ------------------------------------------------- */

/* mma.sync m16n8k32, A u8 (codes), B s8 (digits of x), D = A B + C in int32. */
__device__ __forceinline__ void imma16832(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1, int c0, int c1, int c2, int c3) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(c0), "r"(c1), "r"(c2), "r"(c3));
}

/* One (row tile, group) as the A operand of two k32 steps, D = A B + C.  A
 * lane's word of 8 codes (columns 2s at bit 4s, 2s+1 at bit 16+4s: the
 * repack's order for the fp16 view, q4_tile.cuh) gives, masked, the codes of
 * columns {0,4,1,5} as four bytes, and shifted by 4 those of {2,6,3,7}:
 * exactly an A register each, if k runs over the columns in that order.  The
 * x digits are stored in the same order (digit_pos), so B matches with no
 * shuffle.  Step 0 takes the lane's first word of rows g and g+8 (c.x, c.z),
 * step 1 the second (c.y, c.w); xb holds B's (b0, b1) of step 0 then of
 * step 1. */
__device__ __forceinline__ void tile_products8(int (&d)[4], uint4 c, uint4 xb, const int (&acc)[4]) {
    const uint32_t m = 0x0F0F0F0Fu;
    imma16832(d, c.x & m, c.z & m, (c.x >> 4) & m, (c.z >> 4) & m, xb.x, xb.y, acc[0], acc[1], acc[2], acc[3]);
    imma16832(d, c.y & m, c.w & m, (c.y >> 4) & m, (c.w >> 4) & m, xb.z, xb.w, d[0], d[1], d[2], d[3]);
}

/* The int32 sums become fp32 without a conversion instruction: C starts as
 * the bits of K = 1.5 * 2^(23 + 8 digit), whose mantissa's last place is
 * 2^(8 digit), so D's bits are the float K + 2^(8 digit) sum (exact: |sum| <
 * 2^22 for a group, 64 x 15 x 128) and one subtraction of K leaves the sum
 * already weighted by its digit's 2^(8 digit). */
__device__ __forceinline__ int digit_magic(int d) { return d == 0 ? 0x53400000 : d == 1 ? 0x4F400000 : 0x4B400000; }
__device__ __forceinline__ float from_magic(int d, int k) { return __int_as_float(d) - __int_as_float(k); }

/* ---- the kernel ------------------------------------------------------------ */

/* x reaches the tensor core as three signed 8-bit digits per value,
 * x 2^k = 65536 hi + 256 mid + lo, each in [-128, 127] (2^k per (row, group),
 * the group's largest |x| in [2^21, 2^22)).  A group's dot product of a
 * weight row's codes q and an x row is then an integer S = 65536 S_hi + 256
 * S_mid + S_lo, each digit's sum exact in int32 and exact as a float
 * (digit_magic), and (65536 S_hi + 256 S_mid) exact too (a multiple of 256
 * below 2^32: 24 bits); so f = (f_hi + f_mid) + f_lo is S rounded once, in
 * any mode.  Per group: acc += (scale 2^-k) f, then acc += bias sum(x).
 *
 * MODE 0 (M <= 2 NT): an n-tile per pair of x rows (2p, 2p + 1); B column n =
 * g of lane (g, t) is (x row col0_row(n), digit col0_digit(n)): columns 0, 1
 * row 2p's hi, mid; 2, 3 row 2p + 1's; 4 and 6 the two rows' lo (5 and 7
 * repeat them, unused).  Lane t < 2 holds x row 2p + t's hi and mid sums
 * (C columns 2t, 2t + 1) and takes its lo sums from lane t + 2 by a shuffle.
 * MODE 1 (M <= 8 NT): an n-tile per (x tile nt, digit), n = x row 8 nt + g:
 * lane (g, t) holds x rows 8 nt + 2t, 2t + 1 of every digit.
 * Either way every (row, x row) gets the same f and the same fp32 operations
 * in the same order, so a row's result does not depend on M. */
__device__ __forceinline__ int col0_row(int n) { return (n >> 1) & 1; }      /* n: 0..7 -> rows 0 0 1 1 0 0 1 1 */
__device__ __forceinline__ int col0_digit(int n) { return n < 4 ? n & 1 : 2; } /* -> digits 0 1 0 1 2 2 2 2 */

template <int MODE, int NT>
struct XFrag {
    static constexpr int NB = MODE == 0 ? NT : 3 * NT; /* n-tiles */
    uint4 b[NB];     /* B: the lane's 16 digits of its column */
    float w[NT][2];  /* 2^-k of the x rows of C columns 2t, 2t + 1 (MODE 0: [p][0] only, the lane's x row) */
    float gs[NT][2]; /* sum(x) of the same x rows (MODE 0: [p][0] only) */
};

/* What a lane reads of x, fixed for the block (made once: per group only the
 * group's offset is added).  Rows are 3 x cols bytes: [digit][cols].  The
 * offsets go through an empty asm so that the compiler keeps them in
 * registers instead of recomputing them for every group. */
template <int NT>
struct LaneX {
    int b[NT];          /* bytes from v.x8 to its B column's digits, columns 16t.. of group 0 (MODE 1: digit hi) */
    int ga[NT], gb[NT]; /* the x rows of its C columns 2t, 2t + 1 (group sums and powers; MODE 0: ga only, its row) */
    int ka, kb;         /* MODE 0: the magic constants of its C columns (their digits) */
};

/* Every lane loads its B column unconditionally: a column of no x row (MODE
 * 0: x rows past M; lanes t >= 2 take row 2p's) reads rows the preparation
 * wrote (zeros up to its 2 / 4 / 8 / 16, a grouped slot's own row) and only
 * feeds C columns whose results are not kept. */
template <int MODE, int NT>
__device__ __forceinline__ LaneX<NT> lane_x(const Params &p, const View &v, int g, int t) {
    LaneX<NT> l;
    if (MODE == 0) {
#pragma unroll
        for (int q = 0; q < NT; q++) {
            const int r0 = v.xr[2 * q], r1 = v.xr[2 * q + 1];
            l.b[q] = ((col0_row(g) ? r1 : r0) * 3 + col0_digit(g)) * p.cols + 16 * t;
            l.ga[q] = t == 1 ? r1 : r0;
            asm volatile("" : "+r"(l.b[q]), "+r"(l.ga[q]));
        }
        l.ka = digit_magic(t < 2 ? 0 : 2), l.kb = digit_magic(t < 2 ? 1 : 2);
    } else {
        l.b[0] = v.xb * 3 * p.cols + 16 * t;
        l.ga[0] = v.xo0, l.gb[0] = v.xo1;
        asm volatile("" : "+r"(l.b[0]), "+r"(l.ga[0]), "+r"(l.gb[0]));
    }
    return l;
}

template <int MODE, int NT>
__device__ __forceinline__ void load_group_x(XFrag<MODE, NT> &x, const Params &p, const View &v, const LaneX<NT> &l,
                                             int G) {
    const float *gi = v.ginv + (size_t)G * p.gstride, *gm = v.gsum + (size_t)G * p.gstride;
    /* __ldg: see the kernel */
    if (MODE == 0) {
#pragma unroll
        for (int q = 0; q < NT; q++) {
            x.b[q] = __ldg(reinterpret_cast<const uint4 *>(v.x8 + l.b[q] + G * 64));
            x.w[q][0] = __ldg(gi + l.ga[q]), x.gs[q][0] = __ldg(gm + l.ga[q]);
        }
    } else {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int8_t *b = v.x8 + l.b[0] + (size_t)nt * 24 * p.cols + G * 64;
#pragma unroll
            for (int d = 0; d < 3; d++) x.b[3 * nt + d] = __ldg(reinterpret_cast<const uint4 *>(b + (size_t)d * p.cols));
            x.w[nt][0] = __ldg(gi + l.ga[0] + 8 * nt), x.w[nt][1] = __ldg(gi + l.gb[0] + 8 * nt);
            x.gs[nt][0] = __ldg(gm + l.ga[0] + 8 * nt), x.gs[nt][1] = __ldg(gm + l.gb[0] + 8 * nt);
        }
    }
}

/* acc[q][c] (C layout: c = 0, 1 row g, columns 2t, 2t + 1; c = 2, 3 row g + 8;
 * MODE 0: c = 0, 2 of lanes t < 2, x row 2q + t) */
template <int MODE, int NT>
__device__ __forceinline__ void group_tile(float (&acc)[NT][4], const XFrag<MODE, NT> &x, const LaneX<NT> &l, uint4 c,
                                           uint2 sb) {
    const float s0 = bf16_lo(sb.x), s1 = bf16_hi(sb.x), b0 = bf16_lo(sb.y), b1 = bf16_hi(sb.y);
#pragma unroll
    for (int q = 0; q < NT; q++) {
        float *a = acc[q];
        if (MODE == 0) {
            int d[4];
            const int k[4] = {l.ka, l.kb, l.ka, l.kb};
            tile_products8(d, c, x.b[q], k);
            /* lane t < 2: hi, mid; lane t + 2: lo (of rows g, g + 8) */
            const float h0 = from_magic(d[0], l.ka), h2 = from_magic(d[2], l.ka);
            const float lo0 = __shfl_down_sync(0xffffffffu, h0, 2), lo2 = __shfl_down_sync(0xffffffffu, h2, 2);
            const float f0 = (h0 + from_magic(d[1], l.kb)) + lo0, f2 = (h2 + from_magic(d[3], l.kb)) + lo2;
            const float w = x.w[q][0], gs = x.gs[q][0];
            a[0] = fmaf(s0 * w, f0, a[0]);
            a[2] = fmaf(s1 * w, f2, a[2]);
            a[0] = fmaf(b0, gs, a[0]);
            a[2] = fmaf(b1, gs, a[2]);
        } else {
            int dh[4], dm[4], dl[4];
            const int kh = digit_magic(0), km = digit_magic(1), kl = digit_magic(2);
            const int ch[4] = {kh, kh, kh, kh}, cm[4] = {km, km, km, km}, cl[4] = {kl, kl, kl, kl};
            tile_products8(dh, c, x.b[3 * q], ch);
            tile_products8(dm, c, x.b[3 * q + 1], cm);
            tile_products8(dl, c, x.b[3 * q + 2], cl);
            float f[4];
#pragma unroll
            for (int i = 0; i < 4; i++) f[i] = (from_magic(dh[i], kh) + from_magic(dm[i], km)) + from_magic(dl[i], kl);
            const float w0 = x.w[q][0], w1 = x.w[q][1];
            a[0] = fmaf(s0 * w0, f[0], a[0]);
            a[1] = fmaf(s0 * w1, f[1], a[1]);
            a[2] = fmaf(s1 * w0, f[2], a[2]);
            a[3] = fmaf(s1 * w1, f[3], a[3]);
            a[0] = fmaf(b0, x.gs[q][0], a[0]);
            a[1] = fmaf(b0, x.gs[q][1], a[1]);
            a[2] = fmaf(b1, x.gs[q][0], a[2]);
            a[3] = fmaf(b1, x.gs[q][1], a[3]);
        }
    }
}

/* The weights of UU groups starting at G for the warp's R tiles, straight into
 * registers (zeros for tiles past the end). */
template <int R, int UU>
__device__ __forceinline__ void load_step(const Params &p, const View &v, uint4 (&cw)[R][UU], uint2 (&sbw)[R][UU],
                                          int tile0, int G, int lane) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        const bool ok = tile0 + r < p.tiles;
#pragma unroll
        for (int u = 0; u < UU; u++) {
            const size_t idx = (size_t)(tile0 + r) * (size_t)p.groups + (size_t)(G + u);
            if (ok) {
                cw[r][u] = ld_stream16(v.codes + idx * kTileBytes + lane * 16);
                sbw[r][u] = ld_stream8(v.sb + idx * kSbBytes + (lane >> 2) * 8);
            } else {
                cw[r][u] = make_uint4(0, 0, 0, 0);
                sbw[r][u] = make_uint2(0, 0);
            }
        }
    }
}

/* Whether a warp computes its row tile r: MODE 0 skips tiles past the
 * matrix's end; MODE 1 computes them (load_step gave them zero codes and
 * scales, and their results are never stored), so the R tiles' mma chains
 * are not each behind a branch and interleave.  Measured (H200, session 19,
 * bench_q4_matmul, each mode's configs swept): MODE 1 without the branch,
 * 27B M = 16 q|k|v 33.6 -> 30.4 us, qkv|z|b|a 34.3 -> 30.9, lm_head 394 ->
 * 347, M = 8 gate|up 51.0 -> 46.9; MODE 0 without it lost at M = 1 (o_proj
 * 11.8 -> 18.7, gate|up 32.7 -> 38.7: its registers and load order
 * changed). */
template <int MODE>
__device__ __forceinline__ bool tile_live(int tile, int tiles) { return MODE != 0 || tile < tiles; }

template <int MODE, int NT, int R, int UU>
__device__ __forceinline__ void compute_step(const Params &p, const View &v,
                                             float (&acc)[R][NT][4], const uint4 (&cw)[R][UU],
                                             const uint2 (&sbw)[R][UU], const LaneX<NT> &l, int tile0, int G) {
    if (MODE == 0) { /* the step's x first (small): its loads wait together, not one group after another */
        XFrag<MODE, NT> x[UU];
#pragma unroll
        for (int u = 0; u < UU; u++) load_group_x<MODE, NT>(x[u], p, v, l, G + u);
#pragma unroll
        for (int u = 0; u < UU; u++)
#pragma unroll
            for (int r = 0; r < R; r++)
                if (tile_live<MODE>(tile0 + r, p.tiles)) group_tile<MODE, NT>(acc[r], x[u], l, cw[r][u], sbw[r][u]);
    } else {
#pragma unroll
        for (int u = 0; u < UU; u++) {
            XFrag<MODE, NT> x;
            load_group_x<MODE, NT>(x, p, v, l, G + u);
#pragma unroll
            for (int r = 0; r < R; r++)
                if (tile_live<MODE>(tile0 + r, p.tiles)) group_tile<MODE, NT>(acc[r], x, l, cw[r][u], sbw[r][u]);
        }
    }
}

/* MODE 1 reaches its weights and x through cursors: pointers set at the
 * warp's first group and moved as the loads go, so that every load is an
 * immediate offset from one of them.  The index form above (MODE 0's)
 * recomputed each load's 64-bit address: ~100 of the M = 16 loop's 562
 * instructions a step (SASS, session 20), where the product issues one
 * instruction every ~2 cycles.  Loads and computes each run over the groups
 * in order (one cursor each: the double buffer loads a step ahead).
 * The weights' cursor has two forms, each where it measured faster (H200,
 * session 20, bench_q4_matmul at the presets): 16 x rows (NT 2) a pointer per
 * row tile (gate|up M = 16 59.6 us, 74-78 with the other form); 8 x rows (NT
 * 1) one pointer and a 32-bit offset per tile, fewer registers (gate|up M = 8
 * 38.3 us against 40.1, down 23.4 / 24.6, lm_head 195 / 205). */
template <int R, int NT>
struct WCursor {
    static constexpr int P = NT == 1 ? 1 : R; /* pointers */
    const uint8_t *c[P], *s[P]; /* tile r's (NT 1: tile 0's) codes and scales at the next group to load, this lane's bytes */
    int off[NT == 1 ? R : 1];   /* NT 1: bytes from tile 0's codes to tile r's (scales: an eighth of it) */
};
template <int NT>
struct XCursor {
    const int8_t *b[3 * NT]; /* x tile nt, digit d: the lane's B column at the next step's first group */
    const float *gi, *gm;    /* 2^-k and sum(x) of its C column 2t's x row (2t + 1 follows) at the next group */
};

/* Tiles past the matrix's end read its last tile (MODE 1 computes them and
 * never stores their results, tile_live). */
template <int R, int NT>
__device__ __forceinline__ void make_cursors(const Params &p, const View &v, const LaneX<NT> &l, WCursor<R, NT> &wc,
                                             XCursor<NT> &xc, int tile0, int G0, int lane) {
    if constexpr (NT == 1) {
        const int t0 = min(tile0, p.tiles - 1);
        const size_t idx = (size_t)t0 * (size_t)p.groups + (size_t)G0;
        wc.c[0] = v.codes + idx * kTileBytes + lane * 16;
        wc.s[0] = v.sb + idx * kSbBytes + (lane >> 2) * 8;
#pragma unroll
        for (int r = 0; r < R; r++) wc.off[r] = (min(tile0 + r, p.tiles - 1) - t0) * p.groups * kTileBytes;
    } else {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const size_t idx = (size_t)min(tile0 + r, p.tiles - 1) * (size_t)p.groups + (size_t)G0;
            wc.c[r] = v.codes + idx * kTileBytes + lane * 16;
            wc.s[r] = v.sb + idx * kSbBytes + (lane >> 2) * 8;
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int d = 0; d < 3; d++) xc.b[3 * nt + d] = v.x8 + l.b[0] + (size_t)(24 * nt + d) * p.cols + (size_t)G0 * 64;
    xc.gi = v.ginv + (size_t)G0 * p.gstride + l.ga[0];
    xc.gm = v.gsum + (size_t)G0 * p.gstride + l.ga[0];
}

template <int R, int NT, int UU>
__device__ __forceinline__ void load_step_cursor(WCursor<R, NT> &wc, uint4 (&cw)[R][UU], uint2 (&sbw)[R][UU]) {
    if constexpr (NT == 1) {
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int u = 0; u < UU; u++) {
                cw[r][u] = ld_stream16(wc.c[0] + wc.off[r] + u * kTileBytes);
                sbw[r][u] = ld_stream8(wc.s[0] + wc.off[r] / (kTileBytes / kSbBytes) + u * kSbBytes);
            }
        wc.c[0] += UU * kTileBytes;
        wc.s[0] += UU * kSbBytes;
    } else {
#pragma unroll
        for (int r = 0; r < R; r++) {
#pragma unroll
            for (int u = 0; u < UU; u++) {
                cw[r][u] = ld_stream16(wc.c[r] + u * kTileBytes);
                sbw[r][u] = ld_stream8(wc.s[r] + u * kSbBytes);
            }
            wc.c[r] += UU * kTileBytes;
            wc.s[r] += UU * kSbBytes;
        }
    }
}

/* MODE 1's compute_step: x of each group from the cursor (load_group_x's
 * values: the C columns' x rows are 2t and 2t + 1, 8 nt further a tile) */
template <int NT, int R, int UU>
__device__ __forceinline__ void compute_step_cursor(const Params &p, float (&acc)[R][NT][4], const uint4 (&cw)[R][UU],
                                                    const uint2 (&sbw)[R][UU], const LaneX<NT> &l, XCursor<NT> &xc) {
#pragma unroll
    for (int u = 0; u < UU; u++) {
        XFrag<1, NT> x;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int d = 0; d < 3; d++)
                x.b[3 * nt + d] = __ldg(reinterpret_cast<const uint4 *>(xc.b[3 * nt + d] + u * 64));
            x.w[nt][0] = __ldg(xc.gi + 8 * nt), x.w[nt][1] = __ldg(xc.gi + 8 * nt + 1);
            x.gs[nt][0] = __ldg(xc.gm + 8 * nt), x.gs[nt][1] = __ldg(xc.gm + 8 * nt + 1);
        }
        xc.gi += p.gstride, xc.gm += p.gstride;
#pragma unroll
        for (int r = 0; r < R; r++) group_tile<1, NT>(acc[r], x, l, cw[r][u], sbw[r][u]);
    }
#pragma unroll
    for (int k = 0; k < 3 * NT; k++) xc.b[k] += UU * 64;
}

/* A step's loads and its arithmetic, by index (MODE 0) or by cursor (MODE 1). */
template <int MODE, int NT, int R, int UU>
__device__ __forceinline__ void load_any(const Params &p, const View &v, WCursor<R, NT> &wc, uint4 (&cw)[R][UU],
                                         uint2 (&sbw)[R][UU], int tile0, int G, int lane) {
    if constexpr (MODE == 1) load_step_cursor<R, NT, UU>(wc, cw, sbw);
    else load_step<R, UU>(p, v, cw, sbw, tile0, G, lane);
}
template <int MODE, int NT, int R, int UU>
__device__ __forceinline__ void compute_any(const Params &p, const View &v, float (&acc)[R][NT][4],
                                            const uint4 (&cw)[R][UU], const uint2 (&sbw)[R][UU], const LaneX<NT> &l,
                                            XCursor<NT> &xc, int tile0, int G) {
    if constexpr (MODE == 1) compute_step_cursor<NT, R, UU>(p, acc, cw, sbw, l, xc);
    else compute_step<MODE, NT, R, UU>(p, v, acc, cw, sbw, l, tile0, G);
}

/* Shared memory of a block: the partial sums [wk][rows of the block][kPartStride]
 * when ksplit > 1 or wk > 1.  A row's 16 x rows are padded to 17 floats so
 * that the sums' reads (consecutive threads, consecutive rows, one x row)
 * fall in different banks: with 16 every read was a 16-way bank conflict
 * (ncu, session 20: 94% of the shared loads' wavefronts excess). */
constexpr int kPartStride = 17;
__host__ __device__ constexpr size_t part_bytes(int warps, int r) { return (size_t)warps * r * 16 * kPartStride * 4; }

/* A block's view: Params' own pointers, or for a grouped block (Params'
 * grouped fields) its slot's matrix, x row and output, or its planned
 * group's; false when the slot's expert id is out of range or the group
 * does not exist (the block then writes nothing: every block of its cluster
 * has the same slot / group).  x rows are relative to v.x8 / gsum / ginv. */
template <int MODE, bool GROUPED>
__device__ __forceinline__ bool make_view(const Params &p, View &v, int lane) {
    const int g = lane >> 2, t = lane & 3;
    v.gslot = nullptr;
    /* MODE 0: x rows 0..3; MODE 1: B column's row g, C columns' rows 2t, 2t + 1 */
    v.xr[0] = 0, v.xr[1] = 1, v.xr[2] = 2, v.xr[3] = 3, v.xb = g, v.xo0 = 2 * t, v.xo1 = 2 * t + 1;
    if (!GROUPED) {
        v.codes = p.codes, v.sb = p.sb, v.x8 = p.x8;
        v.gsum = p.gsum, v.ginv = p.ginv, v.y = p.y, v.M = p.M;
        return true;
    }
    const int j = blockIdx.z / p.nmat, mat = blockIdx.z % p.nmat;
    int e;
    if (p.plan) { /* up to splash_q4_plan_group() slots */
        if (j >= __ldg(p.plan)) return false;
        const int32_t *gp = p.plan + 1 + kPlanInts * j; /* expert, size, slots */
        e = __ldg(gp), v.M = __ldg(gp + 1), v.gslot = gp + 2;
        /* x rows by slot (columns past the group's size read its first: they
         * are dead, but must be finite) */
#pragma unroll
        for (int i = 0; i < 4; i++) v.xr[i] = __ldg(v.gslot + min(i, v.M - 1)) / p.xdiv;
        v.xb = __ldg(v.gslot + min(v.xb, v.M - 1)) / p.xdiv;
        v.xo0 = __ldg(v.gslot + min(v.xo0, v.M - 1)) / p.xdiv;
        v.xo1 = __ldg(v.gslot + min(v.xo1, v.M - 1)) / p.xdiv;
        v.x8 = p.x8, v.gsum = p.gsum, v.ginv = p.ginv;
        v.y = mat ? p.y2 : p.y;
    } else { /* MODE 0, one x row: row (the lanes of x row 1 read it too: M = 1) */
        e = __ldg(p.idx + j);
        const int row = j / p.xdiv;
        v.x8 = p.x8 + (size_t)row * 3 * p.cols;
        v.gsum = p.gsum + row, v.ginv = p.ginv + row;
        v.xr[1] = v.xr[2] = v.xr[3] = 0;
        v.y = (mat ? p.y2 : p.y) + (size_t)j * p.yslot;
        v.M = 1;
    }
    if (e < 0 || e >= p.n_experts) return false;
    v.codes = (mat ? p.codes2 : p.codes) + (size_t)e * p.estride;
    v.sb = v.codes + p.sboff;
    return true;
}

template <int MODE, int NT, int R, int U, int S, bool GROUPED>
__global__ void __launch_bounds__(kMaxWarps * 32) q4_matmul_kernel(const Params p) {
    extern __shared__ __align__(16) uint8_t smem[];
    /* Launched without the programmatic attribute (launch() below): the
     * product starts when its predecessor has completed, so it may read x,
     * its scales and the slots' expert ids through the non-coherent path
     * (__ldg).  Measured on the 27B synthetic step (4 / 8 layers, one call):
     * 0.794 / 1.227 ms this way, 0.841 / 1.304 ms with the products
     * programmatically launched and x read with coherent loads (NOTES.md,
     * session 8).  Nor does staging x in shared memory after pdl_wait pay
     * for the early launch (session 25, MODE 0: the 27B step 6.33 -> 7.51
     * ms; the staging sits between the wait and the first use of x, +2-4 us
     * a product, and gate|up's 96 -> 98 registers cost a block an SM), nor
     * reading it through L2 (ld.global.cg, coherent after the wait) with the
     * first step's weights asked of L2 before it (session 34: the 27B step
     * 6.01 -> 6.21 ms; x from L2 alone costs 0.35 ms, the early launch saves
     * 0.15).  It still lets its successor be scheduled at once
     * (device_util.cuh). */
    static_assert(MODE == 0 || !GROUPED, "grouped launches are MODE 0 (launch_for): MODE 1's cursors assume x rows 0..M-1");
    pdl_launch_dependents();
    View v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (!make_view<MODE, GROUPED>(p, v, lane)) return;
    const int g = lane >> 2, t = lane & 3;
    const int rank = blockIdx.x; /* column slice = rank in the cluster */
    const int wr = nwarps / p.wk, wrow = warp % wr, wkk = warp / wr; /* row tiles / group slice of this warp */
    const int tile0 = (blockIdx.y * wr + wrow) * R;
    const int Gr0 = (int)((long long)rank * p.groups / p.ksplit);
    const int Gr1 = (int)((long long)(rank + 1) * p.groups / p.ksplit);
    const int G0 = Gr0 + (Gr1 - Gr0) * wkk / p.wk, G1 = Gr0 + (Gr1 - Gr0) * (wkk + 1) / p.wk;
    const LaneX<NT> l = lane_x<MODE, NT>(p, v, g, t);

    float acc[R][NT][4];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int q = 0; q < NT; q++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[r][q][c] = 0.f;

    WCursor<R, NT> wc;
    XCursor<NT> xc;
    if constexpr (MODE == 1) make_cursors<R, NT>(p, v, l, wc, xc, tile0, G0, lane);
    const int nsteps = (G1 - G0) / U;
    if constexpr (S == 0) {
        /* load a step, use it */
        for (int step = 0; step < nsteps; step++) {
            uint4 cw[R][U];
            uint2 sbw[R][U];
            load_any<MODE, NT, R, U>(p, v, wc, cw, sbw, tile0, G0 + step * U, lane);
            compute_any<MODE, NT, R, U>(p, v, acc, cw, sbw, l, xc, tile0, G0 + step * U);
        }
    } else {
        /* two register buffers: the next step's loads are in flight while
         * this one is computed */
        uint4 ca[R][U], cb[R][U];
        uint2 sa[R][U], sb[R][U];
        if (nsteps > 0) load_any<MODE, NT, R, U>(p, v, wc, ca, sa, tile0, G0, lane);
        for (int step = 0; step < nsteps; step += 2) {
            if (step + 1 < nsteps) load_any<MODE, NT, R, U>(p, v, wc, cb, sb, tile0, G0 + (step + 1) * U, lane);
            compute_any<MODE, NT, R, U>(p, v, acc, ca, sa, l, xc, tile0, G0 + step * U);
            if (step + 1 < nsteps) {
                if (step + 2 < nsteps) load_any<MODE, NT, R, U>(p, v, wc, ca, sa, tile0, G0 + (step + 2) * U, lane);
                compute_any<MODE, NT, R, U>(p, v, acc, cb, sb, l, xc, tile0, G0 + (step + 1) * U);
            }
        }
    }
    for (int G = G0 + nsteps * U; G < G1; G++) { /* the groups left over */
        uint4 cw[R][1];
        uint2 sbw[R][1];
        load_any<MODE, NT, R, 1>(p, v, wc, cw, sbw, tile0, G, lane);
        compute_any<MODE, NT, R, 1>(p, v, acc, cw, sbw, l, xc, tile0, G);
    }

    /* Where this lane's results go: (row within the block, x row m). */
#define Q4_EACH_RESULT(BODY)                                                                                   \
    _Pragma("unroll") for (int r = 0; r < R; r++) {                                                            \
        _Pragma("unroll") for (int nt = 0; nt < NT; nt++) {                                                    \
            _Pragma("unroll") for (int c = 0; c < 4; c++) {                                                    \
                if (MODE == 0 && ((c & 1) || t >= 2)) continue;                                                \
                const int m = MODE == 0 ? 2 * nt + t : 8 * nt + 2 * t + (c & 1);                               \
                const int lrow = (wrow * R + r) * 16 + g + 8 * (c >> 1);                                       \
                const float a_ = acc[r][nt][c];                                                                 \
                BODY                                                                                           \
            }                                                                                                  \
        }                                                                                                      \
    }

    const int rb = wr * R * 16; /* rows per block */
    if (p.ksplit == 1 && p.wk == 1) {
        Q4_EACH_RESULT({
            const int row = blockIdx.y * rb + lrow;
            if (m < v.M && row < p.rows) store_y(p, out_row(p, v, m) + row, a_);
        })
        return;
    }
    /* partial sums [wk][rb][kPartStride]: the warps' group slices added in slice order
     * into slice 0, then (ksplit > 1) the cluster's ranks in rank order */
    float *part = reinterpret_cast<float *>(smem);
    Q4_EACH_RESULT({
        if (m < v.M) part[(wkk * rb + lrow) * kPartStride + m] = a_;
    })
#undef Q4_EACH_RESULT
    if (p.wk > 1) {
        __syncthreads();
        for (int i = threadIdx.x; i < rb * v.M; i += blockDim.x) {
            const int m = i / rb, lrow = i % rb;
            float s = part[lrow * kPartStride + m];
            for (int q = 1; q < p.wk; q++) s += part[(q * rb + lrow) * kPartStride + m];
            if (p.ksplit == 1) {
                const int row = blockIdx.y * rb + lrow;
                if (row < p.rows) store_y(p, out_row(p, v, m) + row, s);
            } else {
                part[lrow * kPartStride + m] = s; /* only this thread reads or writes this slot */
            }
        }
        if (p.ksplit == 1) return;
    }
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    const int per = rb / p.ksplit; /* rows this block adds up */
    const int r0 = (int)cluster.block_rank() * per;
    for (int i = threadIdx.x; i < per * v.M; i += blockDim.x) {
        const int m = i / per, lrow = r0 + i % per;
        float s = 0.f;
        for (int q = 0; q < p.ksplit; q++) s += cluster.map_shared_rank(part, q)[lrow * kPartStride + m];
        const int row = blockIdx.y * rb + lrow;
        if (row < p.rows) store_y(p, out_row(p, v, m) + row, s);
    }
    cluster.sync(); /* keep this block's partials alive until every rank has read them */
}

/* ---- the prepared activation ------------------------------------------------ */

/* x -> per-group scaled 8-bit digits, fp32 group sums and 2^-k per (row,
 * group), optionally made by the op that produces x (RMS norm, silu(g) * u),
 * which then also writes x as fp32 rows.  A warp prepares one group of 64
 * columns (two per lane) at a time; grid.y is the row, grid.x spreads a row's
 * groups over blocks.  No step needs the whole row except the RMS norm's sum
 * of squares, which every block of the row computes itself (the row is in L2;
 * the same code, so the same sum in every block).  Blocks m < prep_rows also
 * prepare their row (m >= M: zeros, zero group sums, 2^-k = 1); blocks m >=
 * prep_rows only compute y (rows beyond the first chunk of 16, which the
 * caller prepares from y later: the same bits). */
constexpr int kPrepThreads = 256;
constexpr int kPrepWarps = kPrepThreads / 32;
constexpr int kPrepGroupsPerBlock = kPrepWarps; /* a group a warp */

enum { PREP_X = 0, PREP_RMS = 1, PREP_SILU = 2 };

struct PrepArgs {
    const float *x, *u, *w; /* x (SILU: g); u (SILU); w (RMS factors) */
    size_t ldx, ldu, ldy;
    float *y;               /* RMS / SILU: the rows made, fp32 */
    float eps;
    int rows;               /* rows with data (y rows) */
    int M, Mp;              /* rows prepared, and padded to the kernel's 2 / 4 / 8 / 16 (zeros) */
    int prep_rows;          /* rows m < prep_rows get the prepared form (16, or every row) */
    int gstride;            /* the xprep's rows_cap */
    int cols;
    int8_t *x8;
    float *gsum, *ginv;
    /* RMS (splash_q4_prep_rmsnorm_gemm): rows [h0, h1) of y also as the
     * prefill GEMM's fp16 rows (q4_gemm.h's uniform preparation) */
    uint16_t *h16;          /* [h1 - h0][cols]; NULL: none */
    float *h16_inv, *h16_alpha;
    int h0, h1;
    /* SILU (splash_q4_prep_silu_mul_amax): the largest |y| of rows [a0, a1)
     * into *amax (float bits, atomicMax: non-negative floats order as their
     * bits), the amax pass of q4_gemm.h's uniform preparation done here */
    uint32_t *amax;         /* NULL: none */
    int a0, a1;
};

/* 1 / sqrt(mean(x^2) + eps) of one row, by the whole block (every thread
 * calls it): both RMS kernels take it from here, so a row's factor has the
 * same bits in either. */
template <class Row>
__device__ __forceinline__ float rms_factor_of(const PrepArgs &a, Row xr, float *red) {
    float ss = 0.f; /* rows need not be 16-byte aligned: scalar loads */
    for (int i = threadIdx.x; i < a.cols / 4; i += kPrepThreads) {
        const float *q = xr(4 * i); /* columns 4i .. 4i + 3 */
        const float v0 = q[0], v1 = q[1], v2 = q[2], v3 = q[3];
        ss = fmaf(v0, v0, ss), ss = fmaf(v1, v1, ss), ss = fmaf(v2, v2, ss), ss = fmaf(v3, v3, ss);
    }
    ss = block_sum(ss, red);
    return 1.0f / sqrtf(ss / (float)a.cols + a.eps);
}

__device__ __forceinline__ float rms_factor(const PrepArgs &a, const float *xr, float *red) {
    return rms_factor_of(a, [xr](int c) { return xr + c; }, red);
}

/* The power of two of a prefill's fp16 rows (PrepArgs.h16) from a bound on
 * |y| instead of their largest |y| (which needs a pass over every row before
 * any is scaled, q4_gemm.cu's amax kernel): x_i^2 is at most the row's sum
 * of squares, so |x_i| rs <= sqrt(cols) and |y| <= sqrt(cols) max|w|; 1%
 * over it for rs's roundings.  The bound's 2^k scales it just under 2^14, as
 * the uniform preparation scales its largest |x|: both are powers of two, so
 * the GEMM's results are the same bits unless a value falls below fp16's
 * normal range (2^-14, now 27 binades under the bound).  Every block of
 * every row computes the same 2^k. */
__device__ __forceinline__ void rms_gemm_scale(const PrepArgs &a, float *red, float &scale, float &inv) {
    float mw = 0.f;
    for (int i = threadIdx.x; i < a.cols; i += kPrepThreads) mw = fmaxf(mw, fabsf(a.w[i]));
    mw = block_max(mw, red);
    row_pow2_scale(sqrtf((float)a.cols) * mw * 1.01f, scale, inv);
}

/* The scalars beside fp16 row m: its 2^-k, and (the first row) the GEMM's
 * alpha and betas (q4_gemm.h); one thread of the row calls it. */
__device__ __forceinline__ void h16_row_done(const PrepArgs &a, int m, float inv) {
    a.h16_inv[m - a.h0] = inv;
    if (m == a.h0) a.h16_alpha[0] = inv, a.h16_alpha[1] = 0.f, a.h16_alpha[2] = 1.f;
}

/* EARLY (PREP_RMS, splash_q4_early_loads): the lane's two norm factors are
 * read between launch_dependents and the wait, while the kernels before
 * still run (weights: nothing writes them); otherwise after the row's sum of
 * squares. */
template <int MODE, bool EARLY>
__global__ void __launch_bounds__(kPrepThreads) q4_prep_kernel(const PrepArgs a) {
    float2 e_w = make_float2(0.f, 0.f);
    if constexpr (EARLY) {
        pdl_launch_dependents();
        const int c = 64 * (blockIdx.x * kPrepGroupsPerBlock + (threadIdx.x >> 5)) + 2 * (threadIdx.x & 31);
        if (c < a.cols) e_w = make_float2(a.w[c], a.w[c + 1]);
        pdl_wait();
    } else {
        pdl_begin();
    }
    __shared__ float red[32];
    const int m = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int groups = a.cols / 64;
    const bool data = m < a.rows;
    float rs = 1.f;
    if (MODE == PREP_RMS && data) /* uniform in the block: block_sum sees every thread */
        rs = rms_factor(a, a.x + (size_t)m * a.ldx, red);
    const bool h16 = MODE == PREP_RMS && a.h16 && m >= a.h0 && m < a.h1; /* uniform too */
    float hs = 1.f, hinv = 1.f;
    if (h16) {
        rms_gemm_scale(a, red, hs, hinv);
        if (blockIdx.x == 0 && threadIdx.x == 0) h16_row_done(a, m, hinv);
    }
    const int G = blockIdx.x * kPrepGroupsPerBlock + warp;
    float vmax = 0.f; /* SILU: the largest |y| of this thread's columns (a.amax) */
    if (G < groups) {
        const int c = 64 * G + 2 * lane; /* this lane's two columns */
        float2 v = make_float2(0.f, 0.f);
        if (data) {
            const float *xr = a.x + (size_t)m * a.ldx + c;
            v = make_float2(xr[0], xr[1]);
            if (MODE == PREP_SILU) {
                const float *ur = a.u + (size_t)m * a.ldu + c;
                v.x = __fmul_rn(siluf_(v.x), ur[0]), v.y = __fmul_rn(siluf_(v.y), ur[1]);
                vmax = fmaxf(fabsf(v.x), fabsf(v.y));
            }
            if (MODE == PREP_RMS && EARLY) /* norm.h's rmsnorm: (x * rs) * w */
                v.x = __fmul_rn(__fmul_rn(v.x, rs), e_w.x), v.y = __fmul_rn(__fmul_rn(v.y, rs), e_w.y);
            else if (MODE == PREP_RMS)
                v.x = __fmul_rn(__fmul_rn(v.x, rs), a.w[c]), v.y = __fmul_rn(__fmul_rn(v.y, rs), a.w[c + 1]);
            if (MODE != PREP_X) {
                float *yr = a.y + (size_t)m * a.ldy + c;
                yr[0] = v.x, yr[1] = v.y;
            }
            if (h16) /* q4_gemm.cu's uniform preparation: x 2^k rounded to fp16 */
                *reinterpret_cast<__half2 *>(a.h16 + (size_t)(m - a.h0) * a.cols + c) =
                    __floats2half2_rn(v.x * hs, v.y * hs);
        }
        if (m < a.prep_rows) prep_group(a, m, G, c, v);
    }
    if (MODE == PREP_SILU && a.amax && data && m >= a.a0 && m < a.a1) { /* uniform in the block */
        vmax = block_max(vmax, red);
        if (threadIdx.x == 0) atomicMax(a.amax, __float_as_uint(vmax));
    }
}

/* PREP_RMS of x after a MoE layer's weighted sum (splash_q4_prep_rmsnorm_moe):
 * x += f, f = sum over k of mo[slot r K + k] w[slot], k ascending from 0 (moe.cu's
 * combine_kernel: the same operations, so the same bits), then the RMS
 * preparation of the new x as q4_prep_kernel<PREP_RMS> makes it.  The row's
 * sum of squares needs every column of the new x, and x is updated in place, so
 * a row's blocks are one cluster: each makes the new x of its own 8 groups into
 * its shared memory, the row's sum then reads the cluster's shared memory in
 * rms_factor's order (the same sum), and no block reads a column of x that
 * another block writes.  EARLY (splash_q4_early_loads): the norm factors, the
 * slot weights and x itself are read before the programmatic wait, which the
 * caller allows only behind the layer's last q4 product (the products wait for
 * every kernel before them, and none after the route writes w or x). */
template <bool EARLY>
__global__ void __launch_bounds__(kPrepThreads) q4_prep_moe_kernel(const PrepArgs a, const splash_q4_moe_sum ms,
                                                                   float *x /* a.x, written */) {
    __shared__ float red[32];
    __shared__ float xs[kPrepGroupsPerBlock * 64]; /* the new x of this block's groups */
    cg::cluster_group cluster = cg::this_cluster();
    const int m = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int G = blockIdx.x * kPrepGroupsPerBlock + warp, c = 64 * G + 2 * lane, own = 64 * warp + 2 * lane;
    const bool data = m < a.rows, mine = data && G < a.cols / 64; /* uniform in the block / the warp */
    float2 wn = make_float2(0.f, 0.f), x0 = make_float2(0.f, 0.f);
    float wk[SPLASH_Q4_MOE_SUM_MAX_K];
    if constexpr (EARLY) pdl_launch_dependents();
    else pdl_begin();
    if (mine) {
        wn = make_float2(a.w[c], a.w[c + 1]);
        x0 = make_float2(a.x[(size_t)m * a.ldx + c], a.x[(size_t)m * a.ldx + c + 1]);
#pragma unroll
        for (int k = 0; k < SPLASH_Q4_MOE_SUM_MAX_K; k++)
            if (k < ms.K) wk[k] = ms.w[(size_t)m * ms.K + k];
    }
    if constexpr (EARLY) pdl_wait();
    float2 f = make_float2(0.f, 0.f), v = make_float2(0.f, 0.f);
    if (mine) {
        const float *mo = ms.mo + (size_t)m * ms.K * ms.ldm + c;
#pragma unroll
        for (int k = 0; k < SPLASH_Q4_MOE_SUM_MAX_K; k++)
            if (k < ms.K) {
                f.x = __fadd_rn(f.x, __fmul_rn(mo[(size_t)k * ms.ldm], wk[k]));
                f.y = __fadd_rn(f.y, __fmul_rn(mo[(size_t)k * ms.ldm + 1], wk[k]));
            }
        v = make_float2(__fadd_rn(f.x, x0.x), __fadd_rn(f.y, x0.y));
        xs[own] = v.x, xs[own + 1] = v.y;
    }
    cluster.sync(); /* every block's new x in its shared memory */
    float rs = 1.f;
    if (data) /* uniform in the block: block_sum sees every thread */
        rs = rms_factor_of(a, [&cluster, xsp = &xs[0]](int col) {
            constexpr int kOwn = kPrepGroupsPerBlock * 64; /* columns a block owns */
            return cluster.map_shared_rank(xsp, col / kOwn) + col % kOwn;
        }, red);
    cluster.sync(); /* no block leaves while another may read its shared memory */
    if (G >= a.cols / 64) return;
    if (mine) {
        float *fr = ms.fo + (size_t)m * ms.ldf + c, *xr = x + (size_t)m * a.ldx + c;
        float *yr = a.y + (size_t)m * a.ldy + c;
        fr[0] = f.x, fr[1] = f.y;
        xr[0] = v.x, xr[1] = v.y;
        v.x = __fmul_rn(__fmul_rn(v.x, rs), wn.x), v.y = __fmul_rn(__fmul_rn(v.y, rs), wn.y); /* norm.h's rmsnorm */
        yr[0] = v.x, yr[1] = v.y;
    }
    if (m < a.prep_rows) prep_group(a, m, G, c, v);
}

/* The RMS norm's rows past the prepared ones (a prefill's bulk), one block a
 * row: y only, so a row's squares are summed once, not once per block of
 * the row as q4_prep_kernel does it (its blocks prepare a row's groups in
 * parallel; for a 4,096-row 27B prefill that read every row ~10 times).
 * rms_factor and the same products: the bits q4_prep_kernel<PREP_RMS> gives
 * a row (test_q4_matmul). */
__global__ void __launch_bounds__(kPrepThreads) q4_rms_rows_kernel(const PrepArgs a) {
    pdl_begin();
    __shared__ float red[32];
    const int m = a.prep_rows + (int)blockIdx.x;
    const float *xr = a.x + (size_t)m * a.ldx;
    const float rs = rms_factor(a, xr, red);
    float *yr = a.y + (size_t)m * a.ldy;
    if (!(a.h16 && m >= a.h0 && m < a.h1)) {
        for (int c = threadIdx.x; c < a.cols; c += kPrepThreads) yr[c] = __fmul_rn(__fmul_rn(xr[c], rs), a.w[c]);
        return;
    }
    float hs, hinv;
    rms_gemm_scale(a, red, hs, hinv);
    __half2 *hr = reinterpret_cast<__half2 *>(a.h16 + (size_t)(m - a.h0) * a.cols);
    for (int i = threadIdx.x; i < a.cols / 2; i += kPrepThreads) {
        const float v0 = __fmul_rn(__fmul_rn(xr[2 * i], rs), a.w[2 * i]);
        const float v1 = __fmul_rn(__fmul_rn(xr[2 * i + 1], rs), a.w[2 * i + 1]);
        yr[2 * i] = v0, yr[2 * i + 1] = v1;
        hr[i] = __floats2half2_rn(v0 * hs, v1 * hs);
    }
    if (threadIdx.x == 0) h16_row_done(a, m, hinv);
}

/* The SwiGLU's rows past the prepared ones (a prefill's bulk), one block a
 * row, y only: the same products as q4_prep_kernel<PREP_SILU> (the same
 * bits), in float4s when every row allows, and the row's largest |y| into
 * a.amax for rows in [a0, a1).  A grid of a block per row and 8 warps' 512
 * columns, as q4_prep_kernel's, ran 32,768 27B rows in 1.9 ms. */
__global__ void __launch_bounds__(kPrepThreads) q4_silu_rows_kernel(const PrepArgs a) {
    pdl_begin();
    __shared__ float red[32];
    const int m = a.prep_rows + (int)blockIdx.x;
    const float *gr = a.x + (size_t)m * a.ldx, *ur = a.u + (size_t)m * a.ldu;
    float *yr = a.y + (size_t)m * a.ldy;
    float vmax = 0.f;
    const bool v4 = ((uintptr_t)gr & 15) == 0 && ((uintptr_t)ur & 15) == 0 && ((uintptr_t)yr & 15) == 0;
    if (v4) { /* cols % 64 == 0 */
        for (int i = threadIdx.x; i < a.cols / 4; i += kPrepThreads) {
            const float4 g = reinterpret_cast<const float4 *>(gr)[i], u = reinterpret_cast<const float4 *>(ur)[i];
            const float4 v = make_float4(__fmul_rn(siluf_(g.x), u.x), __fmul_rn(siluf_(g.y), u.y),
                                         __fmul_rn(siluf_(g.z), u.z), __fmul_rn(siluf_(g.w), u.w));
            reinterpret_cast<float4 *>(yr)[i] = v;
            vmax = fmaxf(vmax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
        }
    } else {
        for (int c = threadIdx.x; c < a.cols; c += kPrepThreads) {
            const float v = __fmul_rn(siluf_(gr[c]), ur[c]);
            yr[c] = v;
            vmax = fmaxf(vmax, fabsf(v));
        }
    }
    if (a.amax && m >= a.a0 && m < a.a1) { /* uniform in the block */
        vmax = block_max(vmax, red);
        if (threadIdx.x == 0) atomicMax(a.amax, __float_as_uint(vmax));
    }
}

/* ---- the group plan (q4_plan.cuh) ---------------------------------------------- */

constexpr int kPlanThreads = 256;

__global__ void __launch_bounds__(kPlanThreads) group_plan_kernel(const int32_t *idx, int S, int n_experts,
                                                                 int32_t *plan, int gmax) {
    pdl_begin();
    __shared__ int32_t sid[kPlanSlots];
    __shared__ int lead[kPlanSlots];
    group_plan_block(idx, S, n_experts, plan, sid, lead, gmax);
}

/* ---- instantiations and dispatch -------------------------------------------- */

typedef int (*LaunchFn)(const Params &p, int warps, int ksplit, int rowgroups, cudaStream_t s);

template <int MODE, int NT, int R, int U, int S, bool GROUPED>
int launch(const Params &p, int warps, int ksplit, int rowgroups, cudaStream_t stream) {
    auto fn = q4_matmul_kernel<MODE, NT, R, U, S, GROUPED>;
    const size_t smem = ksplit > 1 || p.wk > 1 ? part_bytes(warps, R) : 0;
    KernelLaunch c(dim3((unsigned)ksplit, (unsigned)rowgroups, GROUPED ? (unsigned)(p.nmat * p.M) : 1u), /* M: slots */
                   dim3((unsigned)(warps * 32), 1, 1), smem, stream, (unsigned)ksplit, false /* no PDL: see the kernel */);
    SPLASH_CUDA_TRY(cudaLaunchKernelEx(&c.lc, fn, p));
    return SPLASH_OK;
}

/* The compiled (r, u, stages) per mode. */
struct Variant {
    int r, u, s;
};
constexpr Variant kVariants[] = {
    {1, 4, 0}, {1, 8, 0}, {2, 2, 0}, {2, 4, 0}, {2, 8, 0}, {4, 2, 0}, {4, 4, 0},
    {1, 2, 1}, {1, 4, 1}, {2, 2, 1}, {2, 4, 1}, {4, 2, 1},
};
constexpr int kNumVariants = sizeof kVariants / sizeof kVariants[0];

template <int MODE, int NT, bool GROUPED = false>
LaunchFn pick_launch(int r, int u, int s) {
#define Q4_V(R_, U_, S_) \
    if (r == R_ && u == U_ && s == S_) return launch<MODE, NT, R_, U_, S_, GROUPED>;
    Q4_V(1, 4, 0) Q4_V(1, 8, 0) Q4_V(2, 2, 0) Q4_V(2, 4, 0) Q4_V(2, 8, 0) Q4_V(4, 2, 0) Q4_V(4, 4, 0)
    Q4_V(1, 2, 1) Q4_V(1, 4, 1) Q4_V(2, 2, 1) Q4_V(2, 4, 1) Q4_V(4, 2, 1)
#undef Q4_V
    return nullptr;
}

/* M = 0: grouped, one x row a slot; M = -1: grouped by a plan, up to
 * splash_q4_plan_group() slots a block. */
LaunchFn launch_for(int M, int r, int u, int s) {
    if (M == 0) return pick_launch<0, 1, true>(r, u, s);
    if (M == -1) return splash_q4_plan_group() <= 2 ? pick_launch<0, 1, true>(r, u, s) : pick_launch<0, 2, true>(r, u, s);
    switch (mclass(M)) {
    case 0: return pick_launch<0, 1>(r, u, s);
    case 1: return pick_launch<0, 2>(r, u, s);
    case 2: return pick_launch<1, 1>(r, u, s);
    default: return pick_launch<1, 2>(r, u, s);
    }
}

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

bool shape_ok(int rows, int cols) { return rows > 0 && cols > 0 && cols % 64 == 0; }

/* Measured presets, one table per GPU (kTables: SM count and memory size;
 * the H200's from NOTES.md, 2026-11-30): selected by bench_q4_matmul --sweep,
 * one (ksplit, wk) per shape so that results do not depend on M; r/u/stages/
 * warps per M class (<= 2, 4, 8, 16).  A GPU without a table gets the
 * generic rule; a new GPU: run the sweep there and add its table.  The
 * 27B's stacks, o_proj / out_proj and down were swept again after the
 * per-group x scales and live-row x loads changed the kernel (session 8:
 * down M = 1 27.7 -> 24.4 us, M = 16 63.1 -> 43.4; gate|up M = 16 91.4 ->
 * 73.6; events, bench_q4_matmul).  Session 16 swept every shape the two
 * models launch (but the experts') after the one-value-a-group change:
 * the 27B's gate|up 35.2 -> 32.7 us at M = 1 and 86.7 -> 71.9 at M = 16,
 * down 22.9 -> 20.8 and 49.9 -> 42.6 (NOTES.md).  Session 19 swept the M = 8
 * and 16 classes again (the shape's ksplit / wk) once MODE 1 computed every
 * tile (tile_live): 27B M = 16 q|k|v 34.8 -> 30.3, gate|up 103 -> 70 (the old
 * config under the new code), lm_head 407 -> 347 (NOTES.md).  Session 20
 * swept them once more after MODE 1's cursors (session 19's presets ->
 * best): M = 16 gate|up 70.3 -> 59.6, lm_head 348 -> 324; M = 8 gate|up 47.3
 * -> 39.5, o_proj 15.8 -> 15.0 (the old config under cursors: 39.9). */
struct Preset {
    int rows, cols;
    int ksplit, wk; /* per shape: the arithmetic order (results must not depend on M) */
    splash_q4_config c[4]; /* M <= 2, 4, 8, 16 (ksplit and wk filled in below) */
    /* grouped launches of verify blocks (slots / 8 in (4, 8], (8, 16]), where
     * they differ from the plain product's classes 2, 3 (r 0: the same) */
    splash_q4_config grouped[2];
};
const Preset kH200[] = {
    {12288, 5120, 1, 4, {{2, 4, 0, 4, 0, 0}, {2, 4, 0, 4, 0, 0}, {2, 2, 1, 4, 0, 0}, {2, 2, 0, 4, 0, 0}}, {}},  /* attn.q_proj */
    {1024, 5120, 2, 8, {{1, 4, 0, 8, 0, 0}, {1, 4, 1, 8, 0, 0}, {1, 4, 0, 8, 0, 0}, {1, 4, 1, 8, 0, 0}}, {}},   /* attn.k/v_proj */
    /* attn.o_proj, gdn.out_proj: ksplit 2 since session 25 (bench_q4_matmul --sweep, events, against
     * ksplit 1: M = 1 11.87 vs 11.97 us, M = 8 13.41 vs 15.20, M = 16 18.02 vs 21.18) */
    {5120, 6144, 2, 4, {{1, 4, 0, 4, 0, 0}, {2, 4, 0, 4, 0, 0}, {2, 2, 1, 4, 0, 0}, {2, 2, 0, 4, 0, 0}}, {}},
    {10240, 5120, 4, 1, {{2, 4, 0, 2, 0, 0}, {2, 4, 0, 2, 0, 0}, {2, 2, 1, 2, 0, 0}, {2, 2, 0, 2, 0, 0}}, {}},  /* gdn.in_proj_qkv */
    {6144, 5120, 8, 1, {{1, 2, 1, 4, 0, 0}, {1, 2, 1, 4, 0, 0}, {4, 2, 1, 2, 0, 0}, {4, 2, 1, 2, 0, 0}}, {}},   /* gdn.in_proj_z */
    {17408, 5120, 2, 1, {{2, 4, 0, 2, 0, 0}, {2, 4, 0, 2, 0, 0}, {2, 2, 1, 2, 0, 0}, {2, 2, 0, 2, 0, 0}}, {}},  /* ffn.gate/up */
    {5120, 17408, 2, 4, {{1, 4, 0, 4, 0, 0}, {2, 4, 0, 4, 0, 0}, {2, 2, 1, 4, 0, 0}, {2, 2, 0, 4, 0, 0}}, {}},  /* ffn.down */
    {248320, 5120, 1, 1, {{1, 4, 0, 2, 0, 0}, {1, 4, 0, 2, 0, 0}, {2, 2, 1, 2, 0, 0}, {2, 2, 0, 2, 0, 0}}, {}}, /* lm_head */
    {248320, 2048, 1, 1, {{2, 4, 0, 2, 0, 0}, {2, 4, 0, 2, 0, 0}, {2, 2, 1, 2, 0, 0}, {2, 2, 0, 2, 0, 0}}, {}}, /* 35B-A3B lm_head */
    /* the stacks the CUDA model launches (cuda_weights.cu) */
    {14336, 5120, 1, 4, {{2, 4, 0, 4, 0, 0}, {1, 4, 0, 4, 0, 0}, {4, 2, 1, 4, 0, 0}, {4, 2, 1, 4, 0, 0}}, {}},  /* attn q|k|v */
    {16480, 5120, 1, 4, {{2, 4, 0, 4, 0, 0}, {1, 4, 0, 4, 0, 0}, {4, 2, 1, 4, 0, 0}, {4, 2, 1, 4, 0, 0}}, {}},  /* gdn qkv|z|b|a */
    {34816, 5120, 1, 4, {{4, 2, 0, 4, 0, 0}, {2, 4, 0, 4, 0, 0}, {2, 2, 1, 4, 0, 0}, {2, 2, 0, 4, 0, 0}}, {}},  /* ffn gate|up */
    /* the 35B-A3B's experts (and its shared expert's down), mostly launched grouped (9
     * slots x gate, up at decode).  Session 6 left the generic rule's ksplit 8 (a block
     * had one group of 64 columns between two cluster barriers) for ksplit 2 (the grouped
     * step 47.8 -> 28.4 us at 1 row, 279 -> 99 us at 8 rows, test_cuda_ops); session 17
     * swept the grouped launches themselves (bench_q4_matmul --grouped --sweep, events,
     * one row's 9 slots / 8 rows' 72 planned): ksplit 1 and wk 2 / 1, the decode classes'
     * configs apart from the verify classes' (grouped launches pick the class by slots /
     * 8): gate|up 13.0 -> 9.7 us / 46.5 -> 25.7, down 9.2 -> 7.7 / 26.2 -> 17.0.
     * Session 19: plain products of these shapes (the shared expert of more
     * than 16 rows: 4 lanes x 8) got their own classes 2, 3 once MODE 1 computed
     * every tile (bench_q4_matmul --sweep --m 8 / 16: gate / up 23.0 / 29.7 ->
     * 10.8 / 13.3 us, down 13.2 / 16.0 -> 7.4 / 8.6); the grouped verify
     * launches keep theirs (grouped[]) */
    {512, 2048, 1, 2, {{1, 8, 0, 4, 0, 0}, {1, 8, 0, 4, 0, 0}, {2, 4, 1, 4, 0, 0}, {1, 4, 1, 4, 0, 0}},
     {{4, 2, 0, 4, 0, 0}, {4, 2, 0, 4, 0, 0}}}, /* experts gate, up */
    {2048, 512, 1, 1, {{1, 4, 1, 4, 0, 0}, {1, 4, 1, 4, 0, 0}, {1, 4, 0, 4, 0, 0}, {1, 4, 1, 2, 0, 0}},
     {{4, 2, 0, 4, 0, 0}, {4, 2, 0, 4, 0, 0}}}, /* experts down */
    /* the 35B-A3B's dense stacks (session 15; M = 1 in events, swept vs the generic rule): GDN
     * qkv|z|b|a 9.86 vs 9.92 us, out_proj = attention o_proj 7.84 vs 11.65 (the rule's ksplit 8 left
     * each block 8 groups between cluster barriers), attention q|k|v 8.93 vs 9.47 */
    {12352, 2048, 1, 4, {{1, 4, 0, 4, 0, 0}, {2, 4, 0, 4, 0, 0}, {2, 2, 1, 4, 0, 0}, {2, 2, 0, 4, 0, 0}}, {}}, /* 35B-A3B qkv|z|b|a */
    {2048, 4096, 1, 8, {{1, 8, 0, 8, 0, 0}, {1, 4, 0, 8, 0, 0}, {1, 4, 0, 8, 0, 0}, {1, 4, 1, 8, 0, 0}}, {}},  /* 35B-A3B out/o_proj */
    {9216, 2048, 1, 4, {{1, 4, 0, 4, 0, 0}, {2, 4, 0, 4, 0, 0}, {2, 2, 1, 4, 0, 0}, {2, 2, 0, 4, 0, 0}}, {}},  /* 35B-A3B attn q|k|v */
    {0, 0, 0, 0, {}, {}},                                                                   /* terminator */
};

struct PresetTable {
    int sms, min_gib, max_gib; /* the GPU: SM count, memory in [min_gib, max_gib] GiB */
    const Preset *presets;
};
const PresetTable kTables[] = {
    {132, 130, 150, kH200}, /* H200: 132 SMs, 141 GB (an H100 SXM has 132 SMs and 80 GB: no table yet) */
};

/* The current device's SM count and memory (GiB), read once. */
struct DeviceKey {
    int sms, gib;
};
DeviceKey device_key() {
    static DeviceKey k = {0, 0}; /* benign race: every thread computes the same values */
    if (!k.sms) {
        int dev = 0, sms = 0;
        size_t free_b = 0, total_b = 0;
        DeviceKey d = {132, 141}; /* no device to ask (a build check): the H200 */
        if (cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && sms > 0 &&
            cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
            d.sms = sms, d.gib = (int)(total_b >> 30);
        else
            (void)cudaGetLastError();
        k = d;
    }
    return k;
}

const Preset *presets_for(DeviceKey k) {
    for (const PresetTable &t : kTables)
        if (t.sms == k.sms && k.gib >= t.min_gib && k.gib <= t.max_gib) return t.presets;
    return nullptr;
}


} /* namespace */

/* ---- C API ---------------------------------------------------------------------- */

extern "C" size_t splash_q4_tiled_codes_bytes(int rows, int cols) {
    if (!shape_ok(rows, cols)) return 0;
    return (size_t)((rows + 15) / 16) * (size_t)(cols / 64) * kTileBytes;
}

extern "C" size_t splash_q4_tiled_bytes(int rows, int cols) {
    if (!shape_ok(rows, cols)) return 0;
    return (size_t)((rows + 15) / 16) * (size_t)(cols / 64) * (kTileBytes + kSbBytes);
}

extern "C" int splash_q4_repack_host(const uint8_t *canonical, int rows, int cols, uint8_t *tiled,
                                     size_t tiled_bytes) {
    if (!canonical || !tiled || !shape_ok(rows, cols)) return SPLASH_E_INVALID;
    if (tiled_bytes < splash_q4_tiled_bytes(rows, cols)) return SPLASH_E_RANGE;
    const int groups = cols / 64, tiles = (rows + 15) / 16;
    /* Canonical parts, as splash_matrix_layout() places them. */
    const size_t codes_bytes = (size_t)rows * (size_t)(cols / 2);
    const size_t sb_part = (size_t)rows * (size_t)groups * 2;
    const uint8_t *codes = canonical;
    const uint8_t *scales = canonical + align_up(codes_bytes, 64);
    const uint8_t *biases = scales + align_up(sb_part, 64);
    uint8_t *out_codes = tiled, *out_sb = tiled + splash_q4_tiled_codes_bytes(rows, cols);
    for (int T = 0; T < tiles; T++) {
        for (int G = 0; G < groups; G++) {
            const size_t idx = (size_t)T * groups + G;
            uint8_t *oc = out_codes + idx * kTileBytes;
            uint8_t *os = out_sb + idx * kSbBytes;
            for (int lane = 0; lane < 32; lane++) {
                const int g = lane >> 2, t = lane & 3;
                for (int h = 0; h < 2; h++) {
                    const int row = T * 16 + g + 8 * h;
                    for (int wi = 0; wi < 2; wi++) {
                        uint32_t word = 0;
                        if (row < rows) {
                            /* columns 64G + 16t + 8wi + 0..7 = 4 canonical bytes */
                            const uint8_t *src = codes + (size_t)row * (cols / 2) + (size_t)(64 * G + 16 * t + 8 * wi) / 2;
                            for (int s = 0; s < 4; s++) {
                                word |= (uint32_t)(src[s] & 15u) << (4 * s);
                                word |= (uint32_t)(src[s] >> 4) << (16 + 4 * s);
                            }
                        }
                        uint8_t *dst = oc + lane * 16 + (2 * h + wi) * 4;
                        dst[0] = (uint8_t)word, dst[1] = (uint8_t)(word >> 8);
                        dst[2] = (uint8_t)(word >> 16), dst[3] = (uint8_t)(word >> 24);
                    }
                }
            }
            for (int g = 0; g < 8; g++) {
                uint8_t *dst = os + g * 8;
                const int r0 = T * 16 + g, r1 = r0 + 8;
                const uint8_t z[2] = {0, 0};
                const uint8_t *s0 = r0 < rows ? scales + ((size_t)r0 * groups + G) * 2 : z;
                const uint8_t *s1 = r1 < rows ? scales + ((size_t)r1 * groups + G) * 2 : z;
                const uint8_t *b0 = r0 < rows ? biases + ((size_t)r0 * groups + G) * 2 : z;
                const uint8_t *b1 = r1 < rows ? biases + ((size_t)r1 * groups + G) * 2 : z;
                memcpy(dst + 0, s0, 2), memcpy(dst + 2, s1, 2), memcpy(dst + 4, b0, 2), memcpy(dst + 6, b1, 2);
            }
        }
    }
    return SPLASH_OK;
}

extern "C" int splash_q4_stacked_rows(const int *rows, int n) {
    if (!rows || n < 1) return -1;
    long long total = 0;
    for (int i = 0; i < n; i++) {
        if (rows[i] < 1) return -1;
        total += i < n - 1 ? (rows[i] + 15) / 16 * 16 : rows[i];
    }
    return total > INT32_MAX ? -1 : (int)total;
}

extern "C" int splash_q4_repack_stacked_host(const uint8_t *const *canonical, const int *rows, int n, int cols,
                                             uint8_t *tiled, size_t tiled_bytes) {
    const int total = splash_q4_stacked_rows(rows, n);
    if (!canonical || !tiled || total < 0 || !shape_ok(total, cols)) return SPLASH_E_INVALID;
    if (tiled_bytes < splash_q4_tiled_bytes(total, cols)) return SPLASH_E_RANGE;
    /* each part tiled on its own (zero rows up to its tile's end), then its
     * codes and its sb placed at its first tile */
    uint8_t *out_codes = tiled, *out_sb = tiled + splash_q4_tiled_codes_bytes(total, cols);
    const size_t groups = (size_t)(cols / 64);
    size_t tile0 = 0;
    for (int i = 0; i < n; i++) {
        if (!canonical[i]) return SPLASH_E_INVALID;
        const size_t pb = splash_q4_tiled_bytes(rows[i], cols), pc = splash_q4_tiled_codes_bytes(rows[i], cols);
        uint8_t *part = (uint8_t *)malloc(pb);
        if (!part) return SPLASH_E_NOMEM;
        int rc = splash_q4_repack_host(canonical[i], rows[i], cols, part, pb);
        if (!rc) {
            memcpy(out_codes + tile0 * groups * kTileBytes, part, pc);
            memcpy(out_sb + tile0 * groups * kSbBytes, part + pc, pb - pc);
        }
        free(part);
        if (rc) return rc;
        tile0 += (size_t)(rows[i] + 15) / 16;
    }
    return SPLASH_OK;
}

extern "C" int splash_q4_matrix_init(splash_q4_matrix *m, const void *dev_tiled, int rows, int cols) {
    if (!m || !dev_tiled || !shape_ok(rows, cols)) return SPLASH_E_INVALID;
    m->rows = rows, m->cols = cols;
    m->tiles = (rows + 15) / 16, m->groups = cols / 64;
    m->codes = (const uint8_t *)dev_tiled;
    m->sb = m->codes + splash_q4_tiled_codes_bytes(rows, cols);
    return SPLASH_OK;
}

/* The prepared activation's arrays, for rows_cap rows: the digits
 * [rows_cap][3][cap_cols] bytes, the group sums and the group powers
 * [groups][rows_cap] floats each.  (The kernel reads no row past M: x rows
 * past M are not loaded, a grouped slot's second x row is its own.) */
static size_t xp_digit_bytes(int cap_cols, int rows_cap) { return align_up((size_t)rows_cap * 3 * cap_cols, 256); }
static size_t xp_gsum_bytes(int cap_cols, int rows_cap) { return align_up((size_t)(cap_cols / 64) * rows_cap * 4, 256); }

extern "C" size_t splash_q4_xprep_rows_bytes(int cap_cols, int rows_cap) {
    if (cap_cols <= 0 || cap_cols % 64 || rows_cap < SPLASH_Q4_MAX_M || rows_cap > 65535) return 0;
    if ((size_t)rows_cap * 3 * cap_cols > INT32_MAX) return 0; /* the kernel's x offsets are int */
    return xp_digit_bytes(cap_cols, rows_cap) + 2 * xp_gsum_bytes(cap_cols, rows_cap);
}

extern "C" int splash_q4_xprep_rows_init(splash_q4_xprep *xp, void *dev_mem, int cap_cols, int rows_cap) {
    if (!xp || !dev_mem || !splash_q4_xprep_rows_bytes(cap_cols, rows_cap) || ((uintptr_t)dev_mem & 255))
        return SPLASH_E_INVALID;
    const size_t h = xp_digit_bytes(cap_cols, rows_cap);
    uint8_t *b = (uint8_t *)dev_mem;
    xp->x8 = (int8_t *)b;
    xp->gsum = (float *)(b + h);
    xp->ginv = (float *)(b + h + xp_gsum_bytes(cap_cols, rows_cap));
    xp->M = 0, xp->cols = 0, xp->cap_cols = cap_cols, xp->rows_cap = rows_cap;
    return SPLASH_OK;
}

extern "C" size_t splash_q4_xprep_bytes(int cap_cols) { return splash_q4_xprep_rows_bytes(cap_cols, SPLASH_Q4_MAX_M); }

extern "C" int splash_q4_xprep_init(splash_q4_xprep *xp, void *dev_mem, int cap_cols) {
    return splash_q4_xprep_rows_init(xp, dev_mem, cap_cols, SPLASH_Q4_MAX_M);
}

/* The launch behind the prep entry points: rows >= 1 rows of data; the first
 * min(rows, 16) prepared as one activation of M rows (padded with zero rows
 * to 2 / 4 / 8 / 16), or (each_row) every row as its own one-row activation for
 * the grouped product. */
static int prep(splash_q4_xprep *xp, int mode, PrepArgs &a, int each_row, cudaStream_t s) {
    if (!xp || !a.x || a.rows < 1 || a.rows > 65535 || a.cols <= 0 || a.cols % 64 || a.cols > xp->cap_cols ||
        a.cols > SPLASH_Q4_MAX_COLS || a.ldx < (size_t)a.cols || (each_row && a.rows > xp->rows_cap))
        return SPLASH_E_INVALID;
    if (each_row) {
        a.M = a.Mp = a.prep_rows = a.rows;
    } else {
        a.M = a.rows < SPLASH_Q4_MAX_M ? a.rows : SPLASH_Q4_MAX_M;
        a.Mp = prep_padded_rows(a.M); /* x rows of the kernel's mode (rows past M: zeros) */
        a.prep_rows = SPLASH_Q4_MAX_M;
    }
    a.gstride = xp->rows_cap;
    a.x8 = xp->x8, a.gsum = xp->gsum, a.ginv = xp->ginv;
    /* the RMS norm's and the SwiGLU's rows past the prepared ones: a launch of their own */
    const int bulk = (mode == PREP_RMS || mode == PREP_SILU) && a.rows > a.prep_rows ? a.rows - a.prep_rows : 0;
    /* grid rows: every row of data past the prepared ones (y only: X), else the prepared
     * 16; by default (splash_q4_prep_padded) only the Mp rows a product reads (Mp == prep_rows
     * but for an M below 16, where the blocks of rows Mp..15 wrote zero sums no kernel reads) */
    const int grid_rows = a.rows > a.prep_rows && !bulk ? a.rows : splash_q4_prep_padded() ? a.Mp : a.prep_rows;
    const dim3 grid((unsigned)((a.cols / 64 + kPrepGroupsPerBlock - 1) / kPrepGroupsPerBlock), (unsigned)grid_rows);
    void (*const fn)(PrepArgs) = mode == PREP_X     ? q4_prep_kernel<PREP_X, false>
                                 : mode == PREP_RMS ? (splash_q4_early_loads() ? q4_prep_kernel<PREP_RMS, true>
                                                                                : q4_prep_kernel<PREP_RMS, false>)
                                                    : q4_prep_kernel<PREP_SILU, false>;
    SPLASH_CUDA_TRY(launch_kernel(fn, grid, kPrepThreads, 0, s, a));
    if (bulk)
        SPLASH_CUDA_TRY(launch_kernel(mode == PREP_RMS ? q4_rms_rows_kernel : q4_silu_rows_kernel, dim3((unsigned)bulk),
                                      kPrepThreads, 0, s, a));
    xp->M = a.M, xp->cols = a.cols;
    return SPLASH_OK;
}

extern "C" int splash_q4_prep_x(splash_q4_xprep *xp, const float *x, int M, int cols, int ldx,
                                struct CUstream_st *stream) {
    if (M < 1 || M > SPLASH_Q4_MAX_M || ldx < 0) return SPLASH_E_INVALID;
    PrepArgs a;
    memset(&a, 0, sizeof a);
    a.x = x, a.ldx = (size_t)ldx, a.rows = M, a.cols = cols;
    return prep(xp, PREP_X, a, 0, (cudaStream_t)stream);
}

extern "C" int splash_q4_prep_rmsnorm(splash_q4_xprep *xp, const float *x, size_t ldx, const float *w, float eps,
                                      float *y, size_t ldy, int rows, int cols, struct CUstream_st *stream) {
    if (!w || !y || ldy < (size_t)(cols > 0 ? cols : 0)) return SPLASH_E_INVALID;
    PrepArgs a;
    memset(&a, 0, sizeof a);
    a.x = x, a.ldx = ldx, a.w = w, a.eps = eps, a.y = y, a.ldy = ldy, a.rows = rows, a.cols = cols;
    return prep(xp, PREP_RMS, a, 0, (cudaStream_t)stream);
}

extern "C" int splash_q4_prep_rmsnorm_gemm(splash_q4_xprep *xp, splash_q4_gemm_x *xg, int r0, int r1, const float *x,
                                           size_t ldx, const float *w, float eps, float *y, size_t ldy, int rows,
                                           int cols, struct CUstream_st *stream) {
    if (!xg || !xg->hi || !w || !y || cols <= 0 || ldy < (size_t)cols || r0 < 0 || r1 <= r0 || r1 > rows ||
        r1 - r0 > xg->rows_cap || cols > xg->cols_cap)
        return SPLASH_E_INVALID;
    PrepArgs a;
    memset(&a, 0, sizeof a);
    a.x = x, a.ldx = ldx, a.w = w, a.eps = eps, a.y = y, a.ldy = ldy, a.rows = rows, a.cols = cols;
    a.h16 = xg->hi, a.h16_inv = xg->inv_scale, a.h16_alpha = xg->alpha, a.h0 = r0, a.h1 = r1;
    const int rc = prep(xp, PREP_RMS, a, 0, (cudaStream_t)stream);
    if (!rc) xg->R = r1 - r0, xg->cols = cols;
    return rc;
}

extern "C" int splash_q4_prep_rmsnorm_moe(splash_q4_xprep *xp, float *x, size_t ldx, const splash_q4_moe_sum *ms,
                                          const float *w, float eps, float *y, size_t ldy, int rows, int cols,
                                          struct CUstream_st *stream) {
    if (!xp || !x || !ms || !ms->mo || !ms->w || !ms->fo || !w || !y || rows < 1 || rows > SPLASH_Q4_MAX_M ||
        cols <= 0 || cols % 64 || cols > xp->cap_cols || ldx < (size_t)cols || ldy < (size_t)cols ||
        ms->ldm < (size_t)cols || ms->ldf < (size_t)cols || ms->K < 1 || ms->K > SPLASH_Q4_MOE_SUM_MAX_K)
        return SPLASH_E_INVALID;
    const int cx = (cols / 64 + kPrepGroupsPerBlock - 1) / kPrepGroupsPerBlock; /* a row's blocks: one cluster */
    if (cx > 8) return SPLASH_E_UNSUPPORTED;
    PrepArgs a;
    memset(&a, 0, sizeof a);
    a.x = x, a.ldx = ldx, a.w = w, a.eps = eps, a.y = y, a.ldy = ldy, a.rows = rows, a.cols = cols;
    a.M = rows, a.Mp = prep_padded_rows(rows), a.prep_rows = SPLASH_Q4_MAX_M;
    a.gstride = xp->rows_cap;
    a.x8 = xp->x8, a.gsum = xp->gsum, a.ginv = xp->ginv;
    const int grid_rows = splash_q4_prep_padded() ? a.Mp : a.prep_rows;
    KernelLaunch lc(dim3((unsigned)cx, (unsigned)grid_rows), dim3(kPrepThreads), 0, (cudaStream_t)stream, (unsigned)cx);
    SPLASH_CUDA_TRY(cudaLaunchKernelEx(&lc.lc, splash_q4_early_loads() ? q4_prep_moe_kernel<true> : q4_prep_moe_kernel<false>,
                                       a, *ms, x));
    xp->M = a.M, xp->cols = a.cols;
    return SPLASH_OK;
}

/* silu(g) * u prepared as one activation (each_row 0) or row by row (1). */
static int prep_silu(splash_q4_xprep *xp, const float *g, size_t ldg, const float *u, size_t ldu, float *y, size_t ldy,
                     int rows, int cols, int each_row, struct CUstream_st *stream) {
    if (!u || !y || ldu < (size_t)(cols > 0 ? cols : 0) || ldy < (size_t)(cols > 0 ? cols : 0)) return SPLASH_E_INVALID;
    PrepArgs a;
    memset(&a, 0, sizeof a);
    a.x = g, a.ldx = ldg, a.u = u, a.ldu = ldu, a.y = y, a.ldy = ldy, a.rows = rows, a.cols = cols;
    return prep(xp, PREP_SILU, a, each_row, (cudaStream_t)stream);
}

extern "C" int splash_q4_prep_silu_mul(splash_q4_xprep *xp, const float *g, size_t ldg, const float *u, size_t ldu,
                                       float *y, size_t ldy, int rows, int cols, struct CUstream_st *stream) {
    return prep_silu(xp, g, ldg, u, ldu, y, ldy, rows, cols, 0, stream);
}

extern "C" int splash_q4_prep_silu_mul_amax(splash_q4_xprep *xp, splash_q4_gemm_x *xg, int r0, int r1, const float *g,
                                            size_t ldg, const float *u, size_t ldu, float *y, size_t ldy, int rows,
                                            int cols, struct CUstream_st *stream) {
    if (!xg || !xg->amax || !u || !y || r0 < 0 || r1 <= r0 || r1 > rows || ldu < (size_t)(cols > 0 ? cols : 0) ||
        ldy < (size_t)(cols > 0 ? cols : 0))
        return SPLASH_E_INVALID;
    const cudaStream_t s = (cudaStream_t)stream;
    SPLASH_CUDA_TRY(cudaMemsetAsync(xg->amax, 0, sizeof *xg->amax, s));
    PrepArgs a;
    memset(&a, 0, sizeof a);
    a.x = g, a.ldx = ldg, a.u = u, a.ldu = ldu, a.y = y, a.ldy = ldy, a.rows = rows, a.cols = cols;
    a.amax = xg->amax, a.a0 = r0, a.a1 = r1;
    return prep(xp, PREP_SILU, a, 0, s);
}

extern "C" int splash_q4_prep_silu_mul_rows(splash_q4_xprep *xp, const float *g, size_t ldg, const float *u,
                                            size_t ldu, float *y, size_t ldy, int rows, int cols,
                                            struct CUstream_st *stream) {
    return prep_silu(xp, g, ldg, u, ldu, y, ldy, rows, cols, 1, stream);
}

static bool variant_compiled(int r, int u, int s) {
    for (int i = 0; i < kNumVariants; i++)
        if (kVariants[i].r == r && kVariants[i].u == u && kVariants[i].s == s) return true;
    return false;
}

extern "C" int splash_q4_compiled_variants(int (*out)[3], int max) {
    for (int i = 0; i < kNumVariants && i < max; i++) out[i][0] = kVariants[i].r, out[i][1] = kVariants[i].u, out[i][2] = kVariants[i].s;
    return kNumVariants;
}

extern "C" int splash_q4_config_check(const splash_q4_config *cfg, int rows, int cols) {
    if (!cfg || !shape_ok(rows, cols)) return SPLASH_E_INVALID;
    if (!variant_compiled(cfg->r, cfg->u, cfg->stages)) return SPLASH_E_UNSUPPORTED;
    if (cfg->warps < 1 || cfg->warps > kMaxWarps) return SPLASH_E_UNSUPPORTED;
    const int k = cfg->ksplit, wk = cfg->wk;
    if (!(k == 1 || k == 2 || k == 4 || k == 8) || k > kMaxKsplit) return SPLASH_E_UNSUPPORTED;
    if (!(wk == 1 || wk == 2 || wk == 4 || wk == 8) || cfg->warps % wk || k * wk > cols / 64) return SPLASH_E_UNSUPPORTED;
    const long long tiles = (rows + 15) / 16, per_block = (long long)(cfg->warps / wk) * cfg->r;
    if ((tiles + per_block - 1) / per_block > 65535) return SPLASH_E_UNSUPPORTED;
    return SPLASH_OK;
}

/* The preset (or the generic rule) for M rows, of a grouped launch or not. */
static int config_pick(int rows, int cols, int M, int grouped, splash_q4_config *cfg) {
    if (!cfg || !shape_ok(rows, cols) || M < 1 || M > SPLASH_Q4_MAX_M) return SPLASH_E_INVALID;
    const int mc = mclass(M);
    const DeviceKey dk = device_key();
    for (const Preset *p = presets_for(dk); p && p->rows; p++) {
        if (p->rows == rows && p->cols == cols) {
            *cfg = grouped && mc >= 2 && p->grouped[mc - 2].r ? p->grouped[mc - 2] : p->c[mc];
            cfg->ksplit = p->ksplit, cfg->wk = p->wk;
            return SPLASH_OK;
        }
    }
    /* Generic rule (what the swept presets mostly are): 2 tiles a warp, 4
     * groups a step at M <= 4 and 2 above; with >= 16 groups 4 warps a block
     * splitting the groups (wk 4), else 2 warps on their own tiles; ksplit from
     * the shape alone (results must not depend on M): enough blocks for two
     * per SM. */
    const int tiles = (rows + 15) / 16, groups = cols / 64;
    cfg->r = 2;
    cfg->u = mc <= 1 ? 4 : 2;
    cfg->stages = 0;
    cfg->wk = groups >= 16 ? 4 : 1;
    cfg->warps = cfg->wk == 4 ? 4 : 2;
    const long long blocks = (tiles + (cfg->warps / cfg->wk) * 2 - 1) / ((cfg->warps / cfg->wk) * 2);
    int k = 1;
    while (k < kMaxKsplit && 2 * k * cfg->wk <= groups && blocks * k < 2LL * dk.sms) k *= 2;
    cfg->ksplit = k;
    return SPLASH_OK;
}

extern "C" int splash_q4_config_pick(int rows, int cols, int M, splash_q4_config *cfg) {
    return config_pick(rows, cols, M, 0, cfg);
}

extern "C" int splash_q4_config_pick_grouped(int rows, int cols, int slots, splash_q4_config *cfg) {
    /* The M class by slots / 8 (about the token rows of a 35B-A3B launch: a
     * row's top-8 and its shared expert): a decode row's 9 slots take the
     * class-0 config, a verify block's 72 the class-3 one.  The shape's
     * ksplit and wk are one for every class, so a slot's bits do not change. */
    const int m = slots < 1 ? 1 : (slots + 7) / 8;
    return config_pick(rows, cols, m < SPLASH_Q4_MAX_M ? m : SPLASH_Q4_MAX_M, 1, cfg);
}

static int matmul(const splash_q4_matrix *w, const splash_q4_xprep *xp, float *y, const splash_q4_config *cfg, int add,
                  struct CUstream_st *stream) {
    if (!w || !xp || !y || !cfg) return SPLASH_E_INVALID;
    if (xp->cols != w->cols || xp->M < 1 || xp->M > SPLASH_Q4_MAX_M) return SPLASH_E_MISMATCH;
    int rc = splash_q4_config_check(cfg, w->rows, w->cols);
    if (rc) return rc;
    LaunchFn fn = launch_for(xp->M, cfg->r, cfg->u, cfg->stages);
    if (!fn) return SPLASH_E_UNSUPPORTED;
    Params p;
    p.codes = w->codes, p.sb = w->sb;
    p.x8 = xp->x8, p.gsum = xp->gsum, p.ginv = xp->ginv;
    p.y = y;
    p.rows = w->rows, p.tiles = w->tiles, p.groups = w->groups, p.cols = w->cols;
    p.M = xp->M, p.ksplit = cfg->ksplit, p.wk = cfg->wk;
    p.gstride = xp->rows_cap;
    p.add = add;
    const int per_block = cfg->warps / cfg->wk * cfg->r;
    return fn(p, cfg->warps, cfg->ksplit, (w->tiles + per_block - 1) / per_block, (cudaStream_t)stream);
}

extern "C" int splash_q4_matmul_cfg(const splash_q4_matrix *w, const splash_q4_xprep *xp, float *y,
                                    const splash_q4_config *cfg, struct CUstream_st *stream) {
    return matmul(w, xp, y, cfg, 0, stream);
}

static int picked(const splash_q4_matrix *w, const splash_q4_xprep *xp, float *y, int add, struct CUstream_st *stream) {
    if (!w || !xp) return SPLASH_E_INVALID;
    splash_q4_config cfg;
    int rc = splash_q4_config_pick(w->rows, w->cols, xp->M, &cfg);
    if (rc) return rc;
    return matmul(w, xp, y, &cfg, add, stream);
}

extern "C" int splash_q4_matmul(const splash_q4_matrix *w, const splash_q4_xprep *xp, float *y,
                                struct CUstream_st *stream) {
    return picked(w, xp, y, 0, stream);
}

extern "C" int splash_q4_matmul_add(const splash_q4_matrix *w, const splash_q4_xprep *xp, float *y,
                                    struct CUstream_st *stream) {
    return picked(w, xp, y, 1, stream);
}

/* On unless set off; SPLASH_CUDA_EARLY=0 in the environment turns it off at
 * the first read (an A/B switch: docs/cuda.md, "Session 27"). */
static int g_early_loads = -1; /* benign race: every thread computes the same value */

extern "C" int splash_q4_early_loads(void) { return env_switch(&g_early_loads, "SPLASH_CUDA_EARLY", 1); }

extern "C" void splash_q4_set_early_loads(int on) { g_early_loads = on ? 1 : 0; }

/* On unless set; SPLASH_CUDA_PREP_PADDED=0 in the environment turns it off at
 * the first read (an A/B switch: docs/cuda.md, "Session 28"). */
static int g_prep_padded = -1; /* benign race, as g_early_loads */

extern "C" int splash_q4_prep_padded(void) { return env_switch(&g_prep_padded, "SPLASH_CUDA_PREP_PADDED", 1); }

extern "C" void splash_q4_set_prep_padded(int on) { g_prep_padded = on ? 1 : 0; }

/* On unless set; SPLASH_CUDA_MOE_NORM=0 in the environment turns it off at
 * the first read (an A/B switch: docs/cuda.md, "Session 28"). */
static int g_moe_norm = -1; /* benign race, as g_early_loads */

extern "C" int splash_q4_moe_norm(void) { return env_switch(&g_moe_norm, "SPLASH_CUDA_MOE_NORM", 1); }

extern "C" void splash_q4_set_moe_norm(int on) { g_moe_norm = on ? 1 : 0; }

extern "C" int splash_q4_plan_group(void) {
    static int g = 0; /* benign race: every thread computes the same value */
    if (!g) {
        const char *e = getenv("SPLASH_Q4_PLAN_GROUP");
        g = e && atoi(e) == 4 ? 4 : e && atoi(e) == 2 ? 2 : kPlanGroupDefault;
    }
    return g;
}

extern "C" size_t splash_q4_group_plan_ints(int slots) {
    return slots >= 1 && slots <= kPlanSlots ? 1 + (size_t)kPlanInts * slots : 0;
}

extern "C" int splash_q4_group_plan(const int32_t *idx, int slots, int n_experts, int32_t *plan,
                                    struct CUstream_st *stream) {
    if (!idx || !plan || n_experts < 1) return SPLASH_E_INVALID;
    if (slots < 1 || slots > kPlanSlots) return SPLASH_E_UNSUPPORTED;
    SPLASH_CUDA_TRY(launch_kernel(group_plan_kernel, 1, kPlanThreads, 0, (cudaStream_t)stream, idx, slots, n_experts, plan,
                                  splash_q4_plan_group()));
    return SPLASH_OK;
}

extern "C" int splash_q4_matmul_grouped(const splash_q4_matrix *first, const splash_q4_matrix *first2, int n_experts,
                                        size_t stride, const int32_t *idx, const int32_t *plan, int slots, int xdiv,
                                        const splash_q4_xprep *xp, float *y, float *y2, size_t ldy,
                                        struct CUstream_st *stream) {
    if (!first) return SPLASH_E_INVALID;
    splash_q4_config cfg;
    int rc = splash_q4_config_pick_grouped(first->rows, first->cols, slots, &cfg);
    if (rc) return rc;
    return splash_q4_matmul_grouped_cfg(first, first2, n_experts, stride, idx, plan, slots, xdiv, xp, y, y2, ldy, &cfg,
                                        stream);
}

extern "C" int splash_q4_matmul_grouped_cfg(const splash_q4_matrix *first, const splash_q4_matrix *first2,
                                            int n_experts, size_t stride, const int32_t *idx, const int32_t *plan,
                                            int slots, int xdiv, const splash_q4_xprep *xp, float *y, float *y2,
                                            size_t ldy, const splash_q4_config *cfg, struct CUstream_st *stream) {
    if (!first || !cfg || !(idx || plan) || !xp || !y || n_experts < 1 || slots < 1 || xdiv < 1 || (first2 && !y2) ||
        ldy < (size_t)first->rows || (size_t)slots * (first2 ? 2 : 1) > 65535 || (n_experts > 1 && !stride))
        return SPLASH_E_INVALID;
    if (xp->cols != first->cols || (slots - 1) / xdiv >= xp->M ||
        (first2 && (first2->rows != first->rows || first2->cols != first->cols || first2->sb - first2->codes != first->sb - first->codes)))
        return SPLASH_E_MISMATCH;
    int rc = splash_q4_config_check(cfg, first->rows, first->cols);
    if (rc) return rc;
    LaunchFn fn = launch_for(plan ? -1 : 0, cfg->r, cfg->u, cfg->stages);
    if (!fn) return SPLASH_E_UNSUPPORTED;
    Params p;
    memset(&p, 0, sizeof p);
    p.codes = first->codes, p.codes2 = first2 ? first2->codes : nullptr;
    p.sboff = (size_t)(first->sb - first->codes), p.estride = stride;
    p.x8 = xp->x8, p.gsum = xp->gsum, p.ginv = xp->ginv;
    p.y = y, p.y2 = y2, p.yslot = ldy;
    p.rows = first->rows, p.tiles = first->tiles, p.groups = first->groups, p.cols = first->cols;
    p.M = slots; /* the launch's grid.z (slots, or at most as many groups); each block's view has its own M */
    p.ksplit = cfg->ksplit, p.wk = cfg->wk, p.gstride = xp->rows_cap;
    p.idx = idx, p.plan = plan, p.n_experts = n_experts, p.xdiv = xdiv, p.nmat = first2 ? 2 : 1;
    const int per_block = cfg->warps / cfg->wk * cfg->r;
    return fn(p, cfg->warps, cfg->ksplit, (first->tiles + per_block - 1) / per_block, (cudaStream_t)stream);
}
