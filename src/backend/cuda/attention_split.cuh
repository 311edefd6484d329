/* attention_split.cuh - what attention.cu's dispatch shares with the split
 * kernels: the split kernels' arguments and the tensor-core split kernel for
 * int8 pages (attention_int8.cu).  Both kernels write the same partials
 * (unnormalised output, max, sum per query vector and split), which
 * attention.cu's combine merges; so does attention_int8_flash.cu, the int8
 * kernel of bulk prefill rows.
 *
 * Device/host C++ for nvcc only.
 */
#ifndef SPLASH_CUDA_ATTENTION_SPLIT_CUH
#define SPLASH_CUDA_ATTENTION_SPLIT_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/attention.h"

namespace splash_cuda {

struct AttnArgs {
    const uint8_t *pool;
    const splash_cuda_attn_lane *lanes;
    const float *q;
    float *part_o;  /* [splits][rows][n_heads][HD] */
    float *part_ml; /* [splits][rows][n_heads][2] */
    size_t ldq;
    size_t k_off, ks_off, v_off, vs_off, layer_off, page_bytes;
    int format, page_tokens;
    int n_heads, group, rows;
    int qchunk, n_qchunks; /* query vectors per block, blocks per (lane, kv head) */
    int split;             /* positions per split block (a multiple of 64); see lane_splits */
    int lane_splits;       /* > 0: a lane's split is lane_split_len(split, its context, lane_splits) (split_len) */
    int max_ctx;           /* the call's longest context (host choices only) */
    int stage_bufs;        /* the int8 kernel's stage buffers: 1 or 2 (attention.cu chooses) */
    int deep_only;         /* attention_int8.cu skips lanes of more than one n-tile (the wide kernel's) */
    int heavy_first;       /* block_span: grid.x's blocks from a lane's last query chunk down, kv heads inner */
    /* the int8 kernel: a query vector whose whole context is one split (ctx
     * <= split) gets its final output here, gated; the combine skips it */
    float *out;
    const float *gate;
    size_t ldo, ldg;
    float scale;
};

/* A lane's split where the call takes the default split (AttnArgs.lane_splits):
 * the split doubled until the lane's context (n_past + n_rows) needs at most
 * max_splits of them, kLaneBlocks / kv_heads (attention.cu): 64 for the 27B,
 * 128 for the 35B-A3B.  Short splits spread a short context over enough
 * blocks; at 32K the default 128 made 256 partials of every query vector to
 * write and merge (50 MB for a 27B verify of 8 rows, about its K / V
 * bytes).  A function of the lane and the model alone, so a lane's bits do
 * not depend on the batch (docs/cuda.md, session 42). */
constexpr int kLaneBlocks = 256; /* a lane's (kv head, split) pairs at most */
__host__ __device__ inline int lane_split_len(int split, int ctx, int max_splits) {
    while ((ctx + split - 1) / split > max_splits) split *= 2;
    return split;
}
/* Only lanes of 2+ rows (verify) take it.  Decode rows with it too
 * measured slower in the model twice (27B at 32K 7.16 against 6.76 ms a
 * token, session 42; 7.17 against 6.79 and the 35B-A3B 2.51 against 2.46,
 * session 43): a row just past 32,768 positions doubles to splits of 1,024
 * (33), which bench_attention put at 76.8 us against 53.6 at 512.  Nor did a
 * larger cap help (256 -> 362 (kv head, split) pairs: the 27B's verify at
 * 32K 8 rows 109 -> 118 us, 16 rows 210 -> 184, four lanes of 8 414 -> 433;
 * mixed in the model), so neither is a switch any more (docs/cuda.md,
 * session 43). */
__host__ __device__ inline int lane_split_of(int split, int max_splits, int n_past, int n_rows) {
    return max_splits && n_rows > 1 ? lane_split_len(split, n_past + n_rows, max_splits) : split;
}
__device__ __forceinline__ int split_len(const AttnArgs &a, const splash_cuda_attn_lane &ln) {
    return lane_split_of(a.split, a.lane_splits, ln.n_past, ln.n_rows);
}

/* Query vectors one block of the int8 kernel takes at most: an n-tile of
 * kInt8NTile per warp, 4 warps (a lane of one n-tile, "deep": its warps split
 * the positions). */
constexpr int kInt8NTile = 8;
constexpr int kInt8MaxQ = 4 * kInt8NTile;

/* The int8 kernel over grid (kv_heads * n_qchunks, lanes, splits);
 * a.qchunk a multiple of 8, <= kInt8MaxQ; head_dim 64, 128 or 256.
 * attn_int8_split_launch: every lane (a.deep_only: the deep ones);
 * attn_int8_wide_launch (attention_int8_wide.cu): the lanes of more than
 * one n-tile, the others' blocks return at once. */
int attn_int8_split_launch(const AttnArgs &a, int head_dim, dim3 grid, cudaStream_t s);
int attn_int8_wide_launch(const AttnArgs &a, int head_dim, dim3 grid, cudaStream_t s);

/* Query vectors a block of attention_int8_flash.cu takes (16 a warp, 8
 * warps, two warpgroups): the long splits' calls over int8 pages (bulk
 * prefill rows), every lane of the call, a.qchunk = kFlashQ. */
constexpr int kFlashQ = 128;
int attn_int8_flash_launch(const AttnArgs &a, int head_dim, dim3 grid, cudaStream_t s);

} /* namespace splash_cuda */

#endif
