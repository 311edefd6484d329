/* dflash2.h - the DFlash 2 draft (DFlash2DraftModel) on the CPU backend.
 *
 * DFlash 2 is the v1 draft (dflash.h: Qwen3-style layers over the target's
 * tap features, the target's embedding and lm_head) with four additions
 * (shared/spec/dflash.md "DFlash 2"; checked against z-lab dflash/model.py
 * and llama.cpp src/models/dflash.cpp, see docs/package-format.md "Draft"):
 *
 *  1. A grouped dynamic causal convolution around both sublayers of every
 *     layer.  Per sublayer: xn = norm(x); dyn = kernel_projection(xn), read
 *     as [2][K][H/group]; the sublayer runs on conv(xn, side 0) and its
 *     output becomes conv(out, side 1), with
 *       conv(y, s)_t[c] = sum_{o<K, o<=t} (base[s][o][c] + dyn_t[s][o][c/group]) * y_{t-o}[c]
 *     over the block's rows only (zero before row 0: it never reads the
 *     context or another block).  Both sides' kernels come from the
 *     normalised input of the sublayer.  Context K/V bypass the conv.
 *  2. The block's embeddings are scaled by input_embedding_scale.
 *  3. Draft logits are lm_head(h) * output_multiplier, then soft-capped
 *     tanh(l / c) * c (c = final_logit_softcapping; 0 = no cap).
 *  4. A candidate selector replaces the argmax: per row the top_k draft
 *     logits are the candidates, scored
 *       score_k = logit(cand_k) + < pred_codebook[prev] * hidden_proj(h), succ_codebook[cand_k] >
 *     with prev the anchor for row 0 and the token picked at row i-1 after;
 *     the walk picks greedily (argmax, first of equals) or samples from
 *     q = softmax(score / T) over the candidates, which is also the draft
 *     distribution rejection sampling needs.
 *
 * The API has the shape of dflash.h and follows its options: splash_dflash2
 * (weights + scratch, one per model), splash_dflash2_state (one lane's
 * context K/V: sliding layers a ring of sliding_window positions, full
 * layers every position up to max_context or, with options.window > 0, a
 * ring of the last `window`; it holds [lo, n_ctx), seek jumps forward over
 * positions without taps; save / load copy it as bytes for a snapshot),
 * splash_dflash2_append (committed positions' tap rows), splash_dflash2_draft
 * (one block of up to max(block_size, options.max_block) rows: hidden states
 * and transformed logits; the state is not changed).  Proposal selection is a separate call (splash_dflash2_select)
 * so a caller can constrain it: an optional mask callback gives, row by row,
 * the tokens allowed after the tokens picked so far (grammars).  No call
 * allocates after load / state_new.
 *
 * The conv, the logit transform and the selector walk are also exported on
 * plain arrays (splash_dflash2_conv, _logits_transform, _walk) so tests can
 * check them on hand-made numbers and other backends can compare with them.
 */
#ifndef SPLASH_DFLASH2_H
#define SPLASH_DFLASH2_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "models/dflash/dflash.h" /* splash_dflash_options, the SPLASH_DFLASH_MAX_* limits */
#include "package/package.h"

#define SPLASH_DFLASH2_MAX_TOPK 64
#define SPLASH_DFLASH2_MAX_KERNEL 16

typedef struct splash_dflash2_dims {
    /* as splash_dflash_dims */
    int hidden, n_layers, heads, kv_heads, head_dim, intermediate;
    int block_size, mask_token_id, sliding_window, vocab;
    int n_taps;
    int taps[SPLASH_DFLASH_MAX_TAPS];
    unsigned char sliding[SPLASH_DFLASH_MAX_LAYERS];
    unsigned char causal[SPLASH_DFLASH_MAX_LAYERS];
    float rms_eps;
    double rope_theta;
    /* DFlash 2 */
    int conv_kernel, conv_group; /* K, channels per group */
    int sel_rank, sel_top_k;
    float output_multiplier;     /* 1 when the config has none */
    float softcap;               /* final_logit_softcapping; 0 = none */
    float embed_scale;           /* input_embedding_scale; 1 when none */
} splash_dflash2_dims;

typedef struct splash_dflash2 splash_dflash2;
typedef struct splash_dflash2_state splash_dflash2_state;

/* Binds the package's DFlash 2 draft (manifest draft.architecture "dflash2")
 * and the target's embed / lm_head.  SPLASH_E_NOTFOUND without a draft,
 * SPLASH_E_UNSUPPORTED for a v1 draft (load that with splash_dflash_load). */
int splash_dflash2_load(const splash_package *pkg, const splash_dflash_options *opt, splash_dflash2 **out,
                        splash_error *err);
void splash_dflash2_free(splash_dflash2 *d);
const splash_dflash2_dims *splash_dflash2_get_dims(const splash_dflash2 *d);
/* Most rows of one block: max(block_size, options.max_block). */
int splash_dflash2_max_block(const splash_dflash2 *d);
/* Bytes of the draft's own tensors in the package (draft.*). */
size_t splash_dflash2_weight_bytes(const splash_dflash2 *d);

/* A lane's context cache (empty); as splash_dflash_state_*. */
int splash_dflash2_state_new(const splash_dflash2 *d, splash_dflash2_state **out, splash_error *err);
void splash_dflash2_state_free(splash_dflash2_state *s);
void splash_dflash2_state_reset(splash_dflash2_state *s);
int splash_dflash2_state_positions(const splash_dflash2_state *s);
size_t splash_dflash2_state_bytes(const splash_dflash2_state *s);
/* Moves n_ctx forward to pos over positions whose taps were never appended
 * (attention never reads before the first position held). */
int splash_dflash2_state_seek(const splash_dflash2 *d, splash_dflash2_state *s, int pos, splash_error *err);
/* The state as bytes (_snapshot_bytes of them); load checks they belong to
 * a state of the same shape. */
size_t splash_dflash2_state_snapshot_bytes(const splash_dflash2_state *s);
void splash_dflash2_state_save(const splash_dflash2_state *s, void *dst);
int splash_dflash2_state_load(splash_dflash2_state *s, const void *src, splash_error *err);

/* Appends n committed positions: taps [n][n_taps * hidden] (the layout of
 * splash_batch.taps).  Without a window, fails without changing the state
 * when full layers would exceed max_context. */
int splash_dflash2_append(splash_dflash2 *d, splash_dflash2_state *s, const float *taps, int n, splash_error *err);

/* Drafts one block [anchor, MASK x (block-1)] at positions n_ctx ..
 * n_ctx + block - 1 (2 <= block <= block_size).  hidden: out [block-1][hidden],
 * the final-normed states of rows 1..block-1; logits: out [block-1][vocab],
 * lm_head(hidden) * output_multiplier, soft-capped (NULL: not computed).
 * The state is not changed. */
int splash_dflash2_draft(splash_dflash2 *d, const splash_dflash2_state *s, int32_t anchor, int block, float *hidden,
                         float *logits, splash_error *err);

/* ---- proposal selection ---------------------------------------------------- */

/* Fills allow (a bitset of vocab bits, word w bit b = token 32w + b; 1 =
 * allowed) for draft row `row`, given prefix = [anchor, picks of rows
 * 0..row-1] (row + 1 tokens).  It must set every word.  Returns 0, or a
 * negative SPLASH_E_* code that aborts the selection. */
typedef int (*splash_dflash2_mask_fn)(void *ctx, int row, const int32_t *prefix, uint32_t *allow);

typedef struct splash_dflash2_select_args {
    float temperature;            /* <= 0: greedy walk */
    const float *uniform;         /* [rows] in [0, 1): row i's draw (T > 0; the caller's keyed stream) */
    splash_dflash2_mask_fn mask;  /* NULL: every token allowed */
    void *mask_ctx;
} splash_dflash2_select_args;

/* One draft row's outcome.  Candidates are the row's top_k allowed tokens
 * with a finite logit, in descending logit order (equal logits: lower token
 * id first); entries past n_cand are token -1, score -inf, q 0.
 * Sampling: the pick is the first k with uniform < q_0 + ... + q_k (the
 * last candidate of positive q if rounding leaves none).  Greedy: q is 1 at
 * the pick, 0 elsewhere. */
typedef struct splash_dflash2_row {
    int32_t token;                          /* the pick */
    int pick;                               /* its index in cand */
    int n_cand;
    int32_t cand[SPLASH_DFLASH2_MAX_TOPK];
    float score[SPLASH_DFLASH2_MAX_TOPK];   /* selector scores given the previous pick */
    float q[SPLASH_DFLASH2_MAX_TOPK];       /* draft distribution over cand */
} splash_dflash2_row;

/* Walks rows 0..rows-1 of a drafted block (hidden, logits as
 * splash_dflash2_draft wrote them; rows < max_block) from the anchor.
 * Returns the number of rows proposed (rows, or fewer when a mask leaves a
 * row without candidates: the walk stops there), or a negative code. */
int splash_dflash2_select(splash_dflash2 *d, const float *hidden, const float *logits, int32_t anchor, int rows,
                          const splash_dflash2_select_args *a, splash_dflash2_row *out, splash_error *err);

/* ---- the pieces, on plain arrays ----------------------------------------------- */

/* One side of the grouped dynamic causal conv over a block of `rows` rows:
 * out_t[c] = sum_{o<K, o<=t} (base[o][c] + dyn_t[side][o][c / group]) * x_{t-o}[c]
 * with base the side's [K][hidden] kernel and dyn_t (row t, lddyn floats
 * apart) the kernel projection [2][K][hidden/group].  out must not alias x. */
void splash_dflash2_conv(const float *x, size_t ldx, int rows, int hidden, const float *base, const float *dyn,
                         size_t lddyn, int side, int kernel, int group, float *out, size_t ldo);

/* The pick of a row from its candidates' scores (n >= 1): greedy (T <= 0)
 * the first of the largest, q 1 there and 0 elsewhere; sampling q =
 * softmax(score / T), the first k with u < q_0 + ... + q_k (the last of
 * positive q if rounding leaves none).  q: out [n]. */
int splash_dflash2_pick(const float *score, int n, float T, float u, float *q);

/* l = l * mult, then (cap > 0) l = tanh(l / cap) * cap, in place. */
void splash_dflash2_logits_transform(float *logits, size_t n, float mult, float cap);

/* The selector on its own: codebooks [vocab][rank] (any package dtype),
 * gate [rows][rank] = hidden_proj(h) of each row, logits [rows][vocab].
 * scratch: splash_dflash2_walk_scratch(vocab, rank) bytes, 16-byte aligned. */
typedef struct splash_dflash2_selector {
    int vocab, rank, top_k;
    const splash_tensor *pred_codebook, *succ_codebook;
} splash_dflash2_selector;
size_t splash_dflash2_walk_scratch(int vocab, int rank);
int splash_dflash2_walk(const splash_dflash2_selector *sel, const float *gate, const float *logits, int32_t anchor,
                        int rows, const splash_dflash2_select_args *a, splash_dflash2_row *out, void *scratch,
                        splash_error *err);

/* ---- the bound weights, for other backends (models/dflash/cuda_dflash.cu) ---------- */

typedef struct splash_dflash2_conv_weights {
    float *attn_base, *ffn_base;    /* [2][K][H] conv base kernels, fp32 */
    const splash_tensor *attn_proj; /* [2*K*G, H] kernel projection */
    const splash_tensor *ffn_proj;  /* [2*K*G, H] */
} splash_dflash2_conv_weights;
const splash_dflash2_conv_weights *splash_dflash2_layer_conv(const splash_dflash2 *d, int layer);
const splash_tensor *splash_dflash2_hidden_proj(const splash_dflash2 *d); /* [rank, H] */
const splash_dflash2_selector *splash_dflash2_get_selector(const splash_dflash2 *d);

#endif
