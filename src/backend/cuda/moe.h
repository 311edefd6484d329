/* moe.h - the routed experts of the MoE block on the GPU (models.md "FFN",
 * models/qwen35/ffn.c):
 *
 *   route    p = softmax(router logits) in fp32; the top_k experts (ties to
 *            the lower id), their weights renormalised by their sum when
 *            norm_topk; the choice then sorted by expert id.
 *   experts  fo[r] = sum over r's experts e, in ascending e, of
 *            w_e * down_e(silu(gate_e x_r) * up_e x_r), on the q4 product
 *            (q4_matmul.h) with the rows routed to one expert gathered into
 *            one product of up to 16 rows (each expert's weights are read
 *            once per 16 of its rows).
 *
 * splash_cuda_moe_experts (any rows) is host-driven: it copies the
 * routing (rows x top_k ids and weights) to pinned host memory, waits for the
 * stream, and launches per active expert gather, prep, gate, up, silu*up,
 * prep, down and a weighted scatter-add.  Correct and batch-invariant (a
 * row's sum runs over its experts in ascending id whatever else is in the
 * batch) but it synchronises once per layer and costs ~8 launches per active
 * expert, so it cannot run inside a CUDA graph; splash_cuda_moe_experts_grouped
 * (rows <= 16) is the device-driven step that can.
 *
 * The shared expert is three plain q4 products plus splash_cuda_moe_shared_add
 * (act.h), or, on the device-driven step when it has the routed experts'
 * shapes, one more slot of each row (the route's `shared`), its weight the
 * sigmoid of its gate logit, the residual added by the step's sum.
 */
#ifndef SPLASH_CUDA_MOE_H
#define SPLASH_CUDA_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/q4_gemm.h"
#include "backend/cuda/q4_matmul.h"

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;

#ifdef __CUDACC__
__host__ __device__
#endif
static inline float splash_moe_hash_logit(int salt, int pos, int e) {
    uint32_t h = (uint32_t)salt * 0x9E3779B1u ^ (uint32_t)pos * 0x85EBCA77u ^ (uint32_t)e * 0xC2B2AE3Du;
    h ^= h >> 16, h *= 0x7FEB352Du, h ^= h >> 15, h *= 0x846CA68Bu, h ^= h >> 16;
    return (float)(h >> 8) * (1.0f / 2097152.0f) - 4.0f; /* 24 bits: exact */
}

#define SPLASH_CUDA_MOE_MAX_EXPERTS 1024
#define SPLASH_CUDA_MOE_MAX_TOPK 32

/* logits [rows][n_experts] (stride ldl) -> idx [rows][top_k] ascending
 * expert id, w [rows][top_k] their weights.  shared >= 0: a shared expert
 * run as one more slot a row (splash_cuda_moe_experts_grouped): idx and w
 * are [rows][top_k + 1], slot top_k holding expert id `shared` with weight
 * sigmoid(sl[r * lds]), its gate logit (the weight ffn.c gives it; the id
 * must be above every routed one, so the sum adds it last as ffn.c does).
 * plan (not NULL; rows <= 16): the same launch also writes the slots'
 * grouping by expert (splash_q4_group_plan's, over ids below n_experts, or
 * below shared + 1) for splash_cuda_moe_experts_grouped; the scratch's plan
 * holds one. */
int splash_cuda_moe_route(const float *logits, size_t ldl, int rows, int n_experts, int top_k, int norm_topk,
                          int shared, const float *sl, size_t lds, int32_t *idx, float *w, int32_t *plan,
                          struct CUstream_st *stream);

/* Benchmarks on synthetic packages (SPLASH_TEST_RANDOM_ROUTE, the CUDA
 * model): logits[r][e] = a hash of (salt, pos[r], e) as a float in [-4, 4),
 * a multiple of 2^-21, so the route picks experts at random per (layer,
 * position), the same whichever rows a forward holds (a synthetic package's
 * all-positive weights route every token alike; a real model's routing lies
 * between the two).  splash_moe_hash_logit is the value (host and device). */
int splash_cuda_moe_hash_logits(float *logits, size_t ldl, int rows, int n_experts, const int32_t *pos, int salt,
                                struct CUstream_st *stream);

/* Scratch of the experts step: device buffers for 16 gathered rows and two
 * prepared activations, pinned host buffers for the routing. */
typedef struct splash_cuda_moe_scratch {
    int max_rows, hidden, inter, top_k;
    void *dev;                /* one device allocation for everything below */
    splash_q4_xprep xh, xi;   /* prepared gathered rows (cap hidden) / hidden states (cap inter) */
    float *mx;                /* [16][hidden] gathered input rows */
    float *h1, *h2;           /* [16][inter] gate and up outputs */
    float *mo;                /* [16][hidden] down output */
    int32_t *idx_host;        /* pinned [max_rows][top_k] */
    float *w_host;            /* pinned [max_rows][top_k] */
    /* the grouped step: one slot per (row, k), up to 16 rows */
    splash_q4_xprep xs;       /* each slot's hidden state prepared alone (rows_cap 16 * (top_k + 1)) */
    float *sg, *su;           /* [slots][inter] gate (then silu(gate) * up) and up outputs */
    float *smo;               /* [slots][hidden] down outputs */
    int32_t *plan;            /* the slots grouped by expert (splash_cuda_moe_route's plan) */
    /* the GEMM step (splash_cuda_moe_experts_gemm): gemm_rows * top_k slots sorted by expert */
    int gemm_rows;            /* rows per chunk of the GEMM step: min(max_rows, 2048, 65535 / top_k) */
    void *dev2;
    int32_t *off;             /* [SPLASH_CUDA_MOE_MAX_EXPERTS + 1] first sorted position of each expert */
    int32_t *perm, *inv;      /* [slots] the slot at each position; each slot's position (-1: bad id) */
    int32_t *tile_e, *tile_n0, *n_tiles; /* the GEMM's tiles (q4_gemm.h) */
    int tiles_cap;
    splash_q4_gemm_x gx, gxs; /* the rows (cap hidden), the slots' hidden states (cap inter), prepared */
    float *gg, *gu;           /* [slots][inter] gate (then silu(gate) * up), up */
    float *gd;                /* [slots][hidden] down outputs */
} splash_cuda_moe_scratch;

/* Allocates (cudaMalloc, cudaMallocHost): 0, SPLASH_E_INVALID, or
 * SPLASH_E_IO when the runtime refuses.  hidden, inter: multiples of 64.
 * The GEMM step's part is (2 inter + hidden) floats + (hidden + inter) fp16
 * per slot of a chunk (the 35B-A3B at 512 rows: ~58 MB; at most ~285 MB). */
int splash_cuda_moe_scratch_init(splash_cuda_moe_scratch *s, int max_rows, int hidden, int inter, int top_k);
void splash_cuda_moe_scratch_free(splash_cuda_moe_scratch *s);

/* gate, up ([inter, hidden]) and down ([hidden, inter]): host arrays of
 * n_experts q4 matrices on the device (only the experts chosen are read).
 * idx, w: splash_cuda_moe_route's output on the device.  xn [rows][hidden]
 * (stride ldx) in, fo [rows][hidden] (stride ldf) out, fully written.
 * Returns after enqueueing the last launch (the routing copy is waited for). */
int splash_cuda_moe_experts(const splash_q4_matrix *gate, const splash_q4_matrix *up, const splash_q4_matrix *down,
                            int n_experts, const int32_t *idx, const float *w, int rows, const float *xn, size_t ldx,
                            float *fo, size_t ldf, splash_cuda_moe_scratch *s, struct CUstream_st *stream);

/* The same step device-driven, for rows <= 16 (decode, verify): no host
 * synchronisation, 4 launches (gate and up of every (row, k) slot in one
 * grouped q4 product, silu * up with each slot prepared alone, the grouped
 * down product, the weighted sum), so it runs inside a CUDA graph.  k: slots
 * a row in idx and w, top_k or top_k + 1 (a shared expert as one more:
 * splash_cuda_moe_route's `shared`, an id below n_experts whose matrices are
 * the shared expert's).  xp holds xn's rows prepared (xp->M == rows).  The
 * experts must be laid out as the loader does (every stride equal; else
 * SPLASH_E_UNSUPPORTED).  fo: the same bits as splash_cuda_moe_experts
 * (every product and the sum in its order).  x (not NULL): x += fo after,
 * the residual, as splash_cuda_moe_shared_add adds it.  fo NULL: no sum (3
 * launches); the slots' outputs stay in s->smo (rows * k rows of s->hidden
 * floats) for splash_cuda_moe_sum or splash_q4_prep_rmsnorm_moe, which must
 * run before the next step uses s.  plan (not NULL: the
 * route's over these idx, or splash_q4_group_plan's): the slots grouped by
 * expert, each expert read once per 4 of its slots (the host-driven step:
 * once per 16 of its rows; without a plan, once per slot). */
int splash_cuda_moe_experts_grouped(const splash_q4_matrix *gate, const splash_q4_matrix *up,
                                    const splash_q4_matrix *down, int n_experts, const int32_t *idx, const float *w,
                                    const int32_t *plan, int rows, int k, const splash_q4_xprep *xp, float *fo,
                                    size_t ldf, float *x, size_t ldx, splash_cuda_moe_scratch *s,
                                    struct CUstream_st *stream);

/* The step's weighted sum alone: ms->fo[r] = sum over k of ms->mo[(r K + k)
 * H ..] ms->w[r K + k], k ascending from 0; x (not NULL) += fo[r].  ms->ldm
 * must be H (SPLASH_E_UNSUPPORTED otherwise). */
int splash_cuda_moe_sum(const splash_q4_moe_sum *ms, int rows, int H, float *x, size_t ldx, struct CUstream_st *stream);

/* The same step for the rows of bulk prefill lanes, on the tensor-core
 * GEMM (q4_gemm.h: fp16-grade, not the bits of the steps above), device-
 * driven: the (row, k) slots sorted by expert on the device (one block;
 * within an expert in slot order), x prepared once, gate and up of every
 * slot in one grouped GEMM (each expert's weights read once per 64 of its
 * slots), silu * up, the grouped down GEMM, the weighted sum over each row's
 * experts in ascending id.  A row's result depends on its own x and routing
 * only.  Ids outside [0, n_experts) add nothing.  Experts laid out as the
 * loader does (else SPLASH_E_UNSUPPORTED); every matrix fp16-safe
 * (splash_q4_tiled_fp16_ok: the caller's to know). */
int splash_cuda_moe_experts_gemm(const splash_q4_matrix *gate, const splash_q4_matrix *up,
                                 const splash_q4_matrix *down, int n_experts, const int32_t *idx, const float *w,
                                 int rows, const float *xn, size_t ldx, float *fo, size_t ldf,
                                 splash_cuda_moe_scratch *s, struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif

#endif
