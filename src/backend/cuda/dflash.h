/* dflash.h - the ops of a DFlash draft on the GPU that the target's kernels
 * do not cover (the draft's Qwen3 layers otherwise use norm.h, rope.h,
 * q4_matmul.h, dense_matmul.h, act.h, rows.h, and argmax.h for the top-k):
 *
 *   conv        DFlash 2's grouped dynamic causal conv over a block's rows
 *               (splash_dflash2_conv: the same fmaf chain in tap order, so
 *               the result is the CPU's bit for bit);
 *   ring write  an append pass's rows of context K and V into their lanes'
 *               rings (slot = pos % cap), lane and position read from device
 *               arrays (a graph serves every pass of its row count);
 *   attention   the block's queries over the context ring and the block's own
 *               keys, with the per-layer mask of dflash_ctx.c (sliding window,
 *               causal or not inside the block): tiles of 64 keys, each read
 *               once for every query of its kv head, then the tiles' partial
 *               softmaxes merged (a workspace of the caller's);
 *   transform   l = l * mult, then tanh(l / cap) * cap (cap > 0), in place
 *               (splash_dflash2_logits_transform);
 *   edges       the selector's scores for every (previous pick, candidate)
 *               pair of a block: unary + < pred[prev] * gate_row, succ[cand] >,
 *               so the greedy or sampled walk over them is a few comparisons
 *               on the host.
 *
 * Every pointer is device memory unless marked host; [rows][width] arrays
 * with a row stride in floats.  Nothing is allocated; workspaces are the
 * caller's.  Errors: SPLASH_E_INVALID for bad arguments, SPLASH_E_IO when a
 * launch fails.
 */
#ifndef SPLASH_CUDA_DFLASH_H
#define SPLASH_CUDA_DFLASH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;

#define SPLASH_CUDA_DFLASH_MAX_RANK 1024

/* out_t[c] = sum_{o<K, o<=t} (base[o][c] + dyn_t[side][o][c / group]) * x_{t-o}[c]
 * (base: the side's [K][hidden]; dyn row t at dyn + t * lddyn, [2][K][hidden / group]). */
int splash_cuda_dflash_conv(const float *x, size_t ldx, int rows, int hidden, const float *base, const float *dyn,
                            size_t lddyn, int side, int kernel, int group, float *out, size_t ldo,
                            struct CUstream_st *stream);

/* For each row r < rows of lane j = lane[r] (-1: a padding row, skipped) at
 * position p = pos[r]: lane j's rings (ring_k / ring_v + j * lane_stride
 * floats) get k[r] and v[r] (width floats) at slot p % cap, unless
 * p < end[r] - cap (the lane's later rows of the pass take that slot; end[r]:
 * the position after the lane's rows).  pos, lane and end: device int32 [rows]. */
int splash_cuda_dflash_ring_write_rows(const float *k, const float *v, size_t lds, int rows, int width, float *ring_k,
                                       float *ring_v, size_t lane_stride, int cap, const int32_t *pos,
                                       const int32_t *lane, const int32_t *end, struct CUstream_st *stream);
typedef struct splash_cuda_dflash_attn_args {
    const float *q;                /* [block][heads * hd] normed, roped (every array 16-byte aligned, strides
                                      multiples of 4 floats) */
    size_t ldq;
    const float *k, *v;            /* the block's own keys / values [block][kv_heads * hd] */
    size_t ldkv;
    const float *ring_k, *ring_v;  /* the lane's context [cap][kv_heads * hd]; position p at slot p % cap */
    float *o;                      /* [block][heads * hd] */
    size_t ldo;
    int block, heads, kv_heads, head_dim;
    int n_ctx;                     /* the block's row 0 is at position n_ctx; context positions < n_ctx */
    int lo;                        /* the first context position held */
    const int32_t *ctx_dev;        /* when not NULL: n_ctx and lo read from this device int32 pair when the
                                      kernels run (a captured graph replays with the lane's later values)
                                      instead of the two fields above, and the launch covers max_keys keys
                                      (tiles past the lane's keys return at once: the same bits) */
    int max_keys;                  /* with ctx_dev: at least the held context positions + block */
    int cap;                       /* the ring's positions */
    int window;                    /* sliding window (a query at t sees keys > t - window); 0: none */
    int causal;                    /* inside the block: keys up to the query's row, else all rows */
    float scale;
    void *ws;                      /* splash_cuda_dflash_attention_workspace_bytes(block, heads, head_dim, keys) */
    size_t ws_bytes;
} splash_cuda_dflash_attn_args;
/* keys: the most context positions held (the ring's cap) + block. */
size_t splash_cuda_dflash_attention_workspace_bytes(int block, int heads, int head_dim, int max_keys);
/* head_dim 32, 64, 128 or 256 (else SPLASH_E_UNSUPPORTED). */
int splash_cuda_dflash_attention(const splash_cuda_dflash_attn_args *a, struct CUstream_st *stream);

int splash_cuda_dflash_logits_transform(float *x, size_t ldx, int rows, int n, float mult, float cap,
                                        struct CUstream_st *stream);

/* The selector's edge scores of a block of `rows` rows, k candidates a row:
 *   edges[(i * k + p) * k + j] = val[i][j] + sum_r (pred_p[r] * gate[i][r]) * succ[i * k + j][r]
 * for p < (i ? n_cand[i - 1] : 1), j < n_cand[i]; others are left as they
 * are.  pred_p is row 0 of pred (the anchor's codebook row) for i = 0, else
 * row 1 + (i - 1) * k + p (row i-1's candidate p); succ [rows * k][rank] the
 * candidates' successor rows; gate [rows][rank]; val, n_cand as topk wrote. */
int splash_cuda_dflash_edges(const float *gate, const float *pred, const float *succ, const float *val,
                             const int32_t *n_cand, int rows, int k, int rank, float *edges,
                             struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif

#endif
