/* attention.h - gated attention's core over paged KV on the GPU: writing new
 * K/V rows into the lanes' pages (quantising to the pool's format) and
 * causal GQA softmax attention for decode and verify (1..16 rows a lane,
 * several lanes; more rows work, at prefill speed of a simple kernel).
 *
 * Page layout: byte for byte the CPU backend's (cpu_kv_layout, attention.c),
 * so pages, snapshots and prefix-cache entries move between backends.  A page
 * covers page_tokens consecutive positions of one lane for every attention
 * layer; per layer, each part 64-byte aligned:
 *   K values [kv_heads][page_tokens][head_dim]  f32 | bf16 | int8
 *   K scales [kv_heads][page_tokens]            fp32, int8 only
 *   V values, V scales                          likewise
 * int8 is symmetric, one scale per (token, kv head): scale = max|x| / 127,
 * q = rint(x / scale) clamped to [-127, 127] (all zero when max|x| = 0).  The
 * GPU quantiser performs the CPU's operations (IEEE division, round to
 * nearest even), so the stored bytes are identical; bf16 rounds to nearest
 * even, identical too.
 *
 * Lanes: a device array of splash_cuda_attn_lane.  Row r of a lane (global
 * row first_row + r of q and out) is position n_past + r and attends to
 * positions [0, n_past + r].  pages is a device array of the lane's page ids,
 * pages[pos / page_tokens].  Rows that belong to no lane are left untouched.
 *
 * Attention = two launches (flash-decoding):
 *  1. split: one block per (kv head, query chunk, lane, split of
 *     SPLASH_CUDA_ATTN_SPLIT positions, or the call's split; a call that
 *     takes the default gives a lane of 2+ rows a split of its own, the
 *     default doubled until its context needs at most 256 / kv_heads of
 *     them: 512 positions for a 27B verify at 32K, where 128 made 256
 *     partials of every query vector; SPLASH_CUDA_ATTN_LANE_SPLIT=0 turns
 *     it off).  The block loads its query vectors
 *     (the G = n_heads / kv_heads query heads of the kv head times the lane's
 *     rows: one K/V tile in shared memory serves all of them) and keeps an
 *     online softmax per query vector; it writes the unnormalised partial
 *     output, max and sum.  int8 pages: the split's K/V bytes are staged as
 *     stored and both products run on the tensor cores (attention_int8.cu);
 *     bf16 / f32 pages: tiles of 32 positions widened to fp32, CUDA cores.
 *     Calls with a split of SPLASH_CUDA_ATTN_SPLIT_LONG or longer over
 *     int8 pages (bulk prefill) take attention_int8_flash.cu instead:
 *     blocks of 128 query vectors, fp16 grade (splash_cuda_attn_flash).
 *  2. combine: one block per (row, head, 64 dims) merges the row's splits,
 *     divides, and applies the output gate sigmoid(gate) when gate is not
 *     NULL.  Not launched for a call of one split over int8 pages: the
 *     split blocks write every output.
 * The arithmetic per (row, head) depends only on its own inputs and the
 * split length (the call's, or one its lane's rows and context set):
 * results do not depend on the batch (other lanes, how many rows, max_ctx).  They agree with cpu_attention to fp32 rounding (the
 * softmax is accumulated online and in a different order).
 *
 * Workspace: splash_cuda_attn_workspace_bytes(rows, n_heads, head_dim,
 * max_ctx), device memory owned by the caller.  Nothing is allocated here.
 * head_dim must be 64, 128 or 256 (SPLASH_E_UNSUPPORTED otherwise).
 */
#ifndef SPLASH_CUDA_ATTENTION_H
#define SPLASH_CUDA_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;

/* Positions per split block by default: fixes the arithmetic.  The environment's
 * SPLASH_CUDA_ATTN_SPLIT (a multiple of 64 up to 4,096, read at its first use)
 * replaces it for the whole process: an A/B switch (docs/cuda.md, "Session 30"). */
#define SPLASH_CUDA_ATTN_SPLIT 128
/* The shortest split for bulk prefill rows (splash_cuda_attn_args.split):
 * 32x fewer partials to write and merge than the default, and still
 * thousands of blocks.  A call whose split is this or longer over int8 pages
 * runs the flash kernel (splash_cuda_attn_flash); a bulk lane's split is
 * splash_cuda_attn_bulk_split's. */
#define SPLASH_CUDA_ATTN_SPLIT_LONG 4096

/* The split a bulk prefill lane of n_rows rows whose last row sees ctx
 * positions takes: SPLASH_CUDA_ATTN_SPLIT_LONG doubled while the lane's
 * flash blocks at the doubled length (kv heads x blocks of its query
 * vectors x splits of its context) would still number
 * SPLASH_CUDA_ATTN_BULK_BLOCKS: a prompt in one forward takes one split
 * (outputs written by the split blocks themselves: no partials, no
 * combine, no workspace over int8 pages), a short chunk far into its
 * context a few.  It depends only on the lane's own rows and context, so a
 * lane's results never depend on the others in its batch. */
#define SPLASH_CUDA_ATTN_BULK_BLOCKS 1024
#define SPLASH_CUDA_ATTN_FLASH_Q 128 /* query vectors a flash block takes */
static inline int splash_cuda_attn_bulk_split(int n_rows, int ctx, int n_heads, int kv_heads) {
    int split = SPLASH_CUDA_ATTN_SPLIT_LONG;
    if (n_rows < 1 || ctx < 1 || kv_heads < 1 || n_heads < kv_heads) return split;
    const long long row_blocks =
        (long long)kv_heads * (((long long)(n_heads / kv_heads) * n_rows + SPLASH_CUDA_ATTN_FLASH_Q - 1) /
                               SPLASH_CUDA_ATTN_FLASH_Q);
    while (split < ctx && split <= (1 << 29)) {
        const int next = 2 * split;
        if (row_blocks * ((ctx + next - 1) / next) < SPLASH_CUDA_ATTN_BULK_BLOCKS) break;
        split = next;
    }
    return split;
}

/* The CPU's cpu_kv_layout, field for field (format is SPLASH_KV_* of
 * runtime/model.h: F32 0, BF16 1, INT8 2). */
typedef struct splash_cuda_kv_layout {
    int format;
    int page_tokens, kv_heads, head_dim, n_layers;
    int value_size;
    size_t k_off, ks_off, v_off, vs_off; /* parts inside one layer's block */
    size_t layer_bytes, page_bytes;
} splash_cuda_kv_layout;

/* The same sizes and offsets as cpu_kv_layout_init (tests compare them). */
int splash_cuda_kv_layout_init(splash_cuda_kv_layout *l, int format, int n_layers, int kv_heads, int head_dim,
                               int page_tokens);

/* Whether the model's attention kernels read what nothing in their chain
 * writes before their programmatic waits: attn_prep's norm factors and
 * rotary angles (rope.h, splash_cuda_attn_prep_args.early) and kv_write's
 * lanes and pages.  On unless SPLASH_CUDA_ATTN_EARLY=0 (read at the first
 * call) or set: an A/B switch, the same results either way. */
int splash_cuda_attn_early_loads(void);
void splash_cuda_set_attn_early_loads(int on);

/* Whether calls with a long split over int8 pages (bulk prefill rows) run
 * the flash-style kernel (attention_int8_flash.cu: q as two 8-bit digits, P
 * in fp16, ~2e-4 relative) instead of the fp32-grade split kernels.  On
 * unless SPLASH_CUDA_ATTN_FLASH=0 (read at the first call): an A/B switch. */
int splash_cuda_attn_flash(void);

typedef struct splash_cuda_attn_lane {
    const int32_t *pages; /* device: page ids, pages[pos / page_tokens] */
    int n_past;           /* positions before the lane's first row */
    int first_row, n_rows;
    int reserved;
} splash_cuda_attn_lane;

/* Stores k, v ([rows][kv_heads * head_dim], row strides ldk, ldv) of layer
 * `layer` at positions n_past + r of their lanes.  rows: the row count of k
 * and v (rows of no lane are skipped).  early = 1: the caller's word that no
 * kernel still running writes the lanes or their page tables, which are then
 * read before the programmatic wait; the same results either way. */
int splash_cuda_kv_write(const splash_cuda_kv_layout *l, uint8_t *pool, int layer,
                         const splash_cuda_attn_lane *lanes, int n_lanes, int rows, const float *k, size_t ldk,
                         const float *v, size_t ldv, int early, struct CUstream_st *stream);

/* split: positions per split (0: SPLASH_CUDA_ATTN_SPLIT), as the call's.
 * A call over int8 pages whose split holds max_ctx (one split) writes its
 * outputs from the split blocks and needs none of it. */
size_t splash_cuda_attn_workspace_bytes(int rows, int n_heads, int head_dim, int max_ctx, int split);

typedef struct splash_cuda_attn_args {
    const splash_cuda_kv_layout *layout; /* host */
    const uint8_t *pool;                 /* device: the page pool */
    int layer;
    const splash_cuda_attn_lane *lanes;  /* device [n_lanes] */
    int n_lanes;
    int rows;                            /* rows of q / out (every lane's rows lie below) */
    int max_lane_rows;                   /* >= every lane's n_rows */
    int min_lane_rows;                   /* <= every lane's n_rows, or 0 (not known): int8 pages, which of the
                                            split kernel's layouts the call needs */
    int max_ctx;                         /* >= every lane's n_past + n_rows */
    int n_heads;                         /* query heads, a multiple of kv_heads */
    const float *q;                      /* [rows][n_heads * head_dim] */
    size_t ldq;
    const float *gate;                   /* [rows][n_heads * head_dim] or NULL */
    size_t ldg;
    float *out;                          /* [rows][n_heads * head_dim] */
    size_t ldo;
    float scale;                         /* head_dim^-0.5 */
    int split;                           /* positions per split block: 0 (SPLASH_CUDA_ATTN_SPLIT) or a multiple of
                                            64; a row's bits depend on it, so a lane keeps one */
    void *workspace;
    size_t workspace_bytes;
} splash_cuda_attn_args;

int splash_cuda_attention(const splash_cuda_attn_args *a, struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif

#endif
