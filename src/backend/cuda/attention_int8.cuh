/* attention_int8.cuh - what the int8 split kernel's two files share: its
 * deep layout (attention_int8.cu: decode rows, and every lane when
 * SPLASH_CUDA_ATTN_WIDE=0) and its wide layout (attention_int8_wide.cu:
 * verify and prefill rows).  The stage of kStage positions, the rows'
 * addresses and scales, the split's largest V scale, the int8 -> fp16
 * conversion, the fp16 hi / lo split of P, and a query vector's partial (or
 * final output) at the end.  Both layouts write the partials attention.cu's
 * combine merges.  The flash kernel (attention_int8_flash.cu) shares the
 * stages and these; its own pieces (q's digits, the online softmax of a
 * lane's two vectors, their scales and limits, P's power of two, their end)
 * are in its file.
 *
 * Device-only C++; every function is inline.
 */
#ifndef SPLASH_CUDA_ATTENTION_INT8_CUH
#define SPLASH_CUDA_ATTENTION_INT8_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/attention_split.cuh"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/q4_tile.cuh"

namespace splash_cuda {
namespace int8_attn {

constexpr int kStage = 64; /* positions a stage buffer holds */

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

/* fp16x2 of two biased bytes (x ^ 0x80) placed at bytes 0 and 2: 1024 + u - 1152 = x. */
__device__ __forceinline__ uint32_t biased_to_f16x2(uint32_t w) {
    uint32_t r;
    asm("sub.f16x2 %0, %1, %2;" : "=r"(r) : "r"(w), "r"(0x64806480u));
    return r;
}

/* One word of 4 int8 (already ^ 0x80808080) -> f16x2 (bytes 0, 1) and (bytes 2, 3). */
__device__ __forceinline__ void word_pairs(uint32_t u, uint32_t &p01, uint32_t &p23) {
    p01 = biased_to_f16x2(prmt(u, 0x64646464u, 0x4140));
    p23 = biased_to_f16x2(prmt(u, 0x64646464u, 0x4342));
}

/* x -> fp16 hi and lo (x - hi) packed with y's as f16x2 (x low). */
__device__ __forceinline__ void split_pair(float x, float y, uint32_t &hi, uint32_t &lo) {
    const __half2 h = __floats2half2_rn(x, y);
    const __half2 l = __floats2half2_rn(x - __low2float(h), y - __high2float(h));
    hi = *reinterpret_cast<const uint32_t *>(&h);
    lo = *reinterpret_cast<const uint32_t *>(&l);
}

/* ldmatrix: four 8 x 8 matrices of 16-bit elements (lane l gives the address
 * of matrix l / 8's row l % 8), as they are or transposed. */
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
/* mma.sync m16n8k32, D += A B in int32, A and B s8 */
__device__ __forceinline__ void imma_ss(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Byte `sel` picks (0x40: byte 0, 0x51: byte 1, 0x62: byte 2) of x0..x3, as one word (x0's low). */
__device__ __forceinline__ uint32_t bytes_of(int x0, int x1, int x2, int x3, uint32_t sel) {
    return prmt(prmt((uint32_t)x0, (uint32_t)x1, sel), prmt((uint32_t)x2, (uint32_t)x3, sel), 0x5410);
}

__device__ __forceinline__ float4 load4(const float *p, bool aligned) {
    if (aligned) return *reinterpret_cast<const float4 *>(p);
    return make_float4(p[0], p[1], p[2], p[3]);
}

/* A block's place in the grid (kv_heads * n_qchunks, lanes, splits): lane,
 * kv head (grid.x's outer index, or with a.heavy_first its inner one, the
 * chunks then from the lane's last down), the chunk's query vectors qv0 ..
 * qv0 + nqb - 1 (nqt n-tiles of kInt8NTile), the split's positions p0 ..
 * p1 - 1 (up to the block's longest context) in nst stages of kStage, and
 * whether the lane is deep (its vectors fit one n-tile).  False: nothing
 * for this block (no vectors in its chunk, the split past its contexts, or
 * a lane of the kind it skips). */
struct BlockSpan {
    splash_cuda_attn_lane ln;
    int kvh, qv0, nqb, nqt, p0, p1, nst;
    bool deep;
};
__device__ __forceinline__ bool block_span(const AttnArgs &a, bool skip_wide, bool skip_deep, BlockSpan &b) {
    const int kvn = a.n_heads / a.group;
    const int qc = a.heavy_first ? a.n_qchunks - 1 - (int)blockIdx.x / kvn : (int)blockIdx.x % a.n_qchunks;
    b.kvh = a.heavy_first ? (int)blockIdx.x % kvn : (int)blockIdx.x / a.n_qchunks;
    b.ln = a.lanes[blockIdx.y];
    const int G = a.group, nq = G * b.ln.n_rows - qc * a.qchunk;
    b.deep = G * b.ln.n_rows <= kInt8NTile;
    if (nq <= 0 || (b.deep ? skip_deep : skip_wide)) return false;
    b.qv0 = qc * a.qchunk, b.nqb = min(nq, a.qchunk), b.nqt = (b.nqb + 7) / 8;
    const int sp = split_len(a, b.ln);
    b.p0 = blockIdx.z * sp;
    const int last_lim = b.ln.n_past + (b.qv0 + b.nqb - 1) / G + 1; /* the block's longest context */
    if (b.p0 >= last_lim) return false;
    b.p1 = min(b.p0 + sp, last_lim);
    b.nst = (b.p1 - b.p0 + kStage - 1) / kStage;
    return true;
}

/* A stage's positions s0 .. s0 + ST - 1 of the split (up to p1), first
 * step (threads < ST): a position's K row address, NULL past p1, and
 * its scales; plain coherent loads (kv_write's).  The layouts' stage copies
 * (cp.async) read them after a barrier. */
template <int HD, int ST = kStage>
__device__ __forceinline__ void stage_rows(const AttnArgs &a, const splash_cuda_attn_lane &ln, int kvh, int s0, int p1,
                                           const uint8_t **rowp, float *ksc, float *vsc) {
    const int tid = threadIdx.x;
    if (tid >= ST) return;
    const int pos = s0 + tid;
    const uint8_t *row = nullptr;
    float sk = 0.f, sv = 0.f;
    if (pos < p1) {
        const size_t lb = (size_t)ln.pages[pos / a.page_tokens] * a.page_bytes + a.layer_off;
        const size_t ri = (size_t)kvh * a.page_tokens + (size_t)(pos % a.page_tokens);
        row = a.pool + lb + a.k_off + ri * HD;
        sk = reinterpret_cast<const float *>(a.pool + lb + a.ks_off)[ri];
        sv = reinterpret_cast<const float *>(a.pool + lb + a.vs_off)[ri];
    }
    rowp[tid] = row, ksc[tid] = sk, vsc[tid] = sv;
}

/* The largest V scale of positions p0 .. p1 - 1, this warp's share (every
 * thread calls it; warp_max of the threads' maxima, lane 0 stores it in
 * red[warp]); the block's is the max of red[] after a barrier. */
__device__ __forceinline__ void split_vmax(const AttnArgs &a, const splash_cuda_attn_lane &ln, int kvh, int p0, int p1,
                                           float *red) {
    float vmax = 0.f;
    for (int pos = p0 + (int)threadIdx.x; pos < p1; pos += blockDim.x) {
        const size_t lb = (size_t)ln.pages[pos / a.page_tokens] * a.page_bytes + a.layer_off;
        const size_t ri = (size_t)kvh * a.page_tokens + (size_t)(pos % a.page_tokens);
        vmax = fmaxf(vmax, reinterpret_cast<const float *>(a.pool + lb + a.vs_off)[ri]); /* kv_write's: coherent */
    }
    vmax = warp_max(vmax);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = vmax;
}

/* A split block's start (every thread; read the results after a barrier):
 * the rows of its first two stages of ST positions (nst: the split's
 * stages) and this warp's share of the split's largest V scale in
 * red[warp], from the scales just staged when the split is those two
 * stages (each thread reads what it wrote), else split_vmax. */
template <int HD, int ST>
__device__ __forceinline__ void split_start(const AttnArgs &a, const splash_cuda_attn_lane &ln, int kvh, int p0, int p1,
                                            int nst, const uint8_t **rowp, float *ksc, float *vsc, float *red) {
    stage_rows<HD, ST>(a, ln, kvh, p0, p1, rowp, ksc, vsc);
    if (nst > 1) stage_rows<HD, ST>(a, ln, kvh, p0 + ST, p1, rowp + ST, ksc + ST, vsc + ST);
    if (nst <= 2) {
        const int tid = threadIdx.x;
        float vm = tid < ST ? fmaxf(vsc[tid], nst > 1 ? vsc[ST + tid] : 0.f) : 0.f;
        vm = warp_max(vm);
        if ((tid & 31) == 0) red[tid >> 5] = vm;
    } else {
        split_vmax(a, ln, kvh, p0, p1, red);
    }
}

/* A stage's copy (after its stage_rows and a barrier; every one of the
 * block's THREADS), PART 1: K rows into their ldmatrix rows (KP bytes
 * apart), 2: V rows into the landing area (HD apart), 3: both; by cp.async,
 * zeros past p1; consecutive threads on consecutive 16-byte pieces; one
 * group. */
template <int HD, int ST, int KP, int THREADS, int UNROLL, int PART>
__device__ __forceinline__ void stage_copy_async(const AttnArgs &a, const uint8_t *const *rowp, uint8_t *Kb,
                                                 uint8_t *Vl) {
    constexpr int RP = HD / 16, i0 = PART & 1 ? 0 : ST * RP, i1 = PART & 2 ? 2 * ST * RP : ST * RP;
    const size_t vdelta = a.v_off - a.k_off;
#pragma unroll(UNROLL)
    for (int i = i0 + threadIdx.x; i < i1; i += THREADS) {
        const int isv = i >= ST * RP, ii = isv ? i - ST * RP : i;
        const int r = ii / RP, c = ii % RP;
        const uint8_t *row = rowp[r];
        cp_async16(smem_addr(isv ? Vl + r * HD + 16 * c : Kb + r * KP + 16 * c),
                   row ? row + (isv ? vdelta : 0) + (size_t)c * 16 : a.pool, row ? 16 : 0);
    }
    cp_async_commit();
}

/* The end of query vector qv (the block's, its context lim) in split z: from its
 * state's O (as the V^T P^T product leaves it: O[d][c] and O[d][2 + c] are
 * this lane's dims dim(d, 0) and dim(d, 1) of the lane's vector c, times P's
 * power of two, which pinv undoes), max m and sum l, either
 *   the partial of split z (lead: the lane that writes m and l), or
 *   when the split is the vector's whole context, its output: the combine's
 *   operations on one split (o / l, then the gate), so the same bits; later
 *   splits of the block's longer rows have nothing of such a vector. */
template <int HD, int NP, typename DimOf>
__device__ __forceinline__ void write_vector(const AttnArgs &a, const splash_cuda_attn_lane &ln, int kvh, int qv, int lim,
                                             int z, const float (&O)[NP][4], int c, float pinv, float m, float l, bool lead,
                                             DimOf dim) {
    const int G = a.group, r = qv / G, h = kvh * G + qv % G;
    const size_t row = (size_t)(ln.first_row + r);
    if (lim <= split_len(a, ln)) {
        if (z) return;
        float *o = a.out + row * a.ldo + (size_t)h * HD;
        const float *gt = a.gate ? a.gate + row * a.ldg + (size_t)h * HD : nullptr;
        const float il = 1.0f / l;
#pragma unroll
        for (int d = 0; d < NP; d++) {
            const int d0 = dim(d, 0), d1 = dim(d, 1);
            float v0 = __fmul_rn(O[d][c], pinv) * il, v1 = __fmul_rn(O[d][2 + c], pinv) * il;
            if (gt) v0 = __fmul_rn(v0, sigmoidf_(gt[d0])), v1 = __fmul_rn(v1, sigmoidf_(gt[d1]));
            o[d0] = v0, o[d1] = v1;
        }
        return;
    }
    const size_t idx = ((size_t)z * a.rows + row) * a.n_heads + h;
    float *o = a.part_o + idx * HD;
#pragma unroll
    for (int d = 0; d < NP; d++) {
        o[dim(d, 0)] = __fmul_rn(O[d][c], pinv);
        o[dim(d, 1)] = __fmul_rn(O[d][2 + c], pinv);
    }
    if (lead) a.part_ml[2 * idx] = m, a.part_ml[2 * idx + 1] = l;
}

} /* namespace int8_attn */
} /* namespace splash_cuda */

#endif
