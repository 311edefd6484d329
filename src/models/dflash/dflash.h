/* dflash.h - the DFlash v1 draft (z-lab DFlashDraftModel) on the CPU backend.
 *
 * The draft is a few Qwen3-style layers that read the target: its context is
 * the target's hidden states at the tap layers (SPLASH_ROW_TAPS rows of
 * splash_model_forward, [n_taps][hidden] per position, tap order), projected
 * by fc and normalised by hidden_norm; its input is the target's embedding of
 * the block [anchor, MASK x (B-1)]; its output goes through the target's
 * lm_head.  Per layer (shared/spec/dflash.md, z-lab dflash/model.py):
 *
 *   q   = rope(q_norm(q_proj(xn)))                 block rows only
 *   K,V = [k_norm/rope(k_proj(ctx)), v_proj(ctx)]   context, at positions 0..start-1
 *       ; [k_norm/rope(k_proj(xn)),  v_proj(xn)]    block, at start..start+B-1
 *   sliding_attention layers: causal inside the block, and a query at
 *   position t sees keys at positions > t - sliding_window;
 *   full_attention layers: bidirectional inside the block, no window
 *   (the manifest's "causal" array says which, resolved at pack time).
 *
 * Lifetimes and shape of the API (the speculative cycle is built on it):
 *   - splash_dflash: weights bound from the package (mapped, the target's
 *     embed / lm_head included) and scratch for one block; one per model.
 *   - splash_dflash_state: one lane's context K/V cache, persistent across
 *     cycles.  Sliding layers hold a ring of sliding_window positions; full
 *     layers hold every committed position up to max_context, or, with
 *     options.window > 0 (what the engine uses), a ring of the last `window`
 *     positions: a documented approximation (the z-lab full layers see the
 *     whole context), harmless to the output because the draft only
 *     proposes, and it makes a lane's draft state a fixed size that a
 *     snapshot can copy.  The cycle appends the committed positions' tap
 *     rows with splash_dflash_append after each commit; block K/V live only
 *     inside splash_dflash_draft and never persist.
 *   - positions: the state holds [lo, n_ctx).  seek jumps n_ctx forward
 *     over positions whose taps were never computed (the engine computes
 *     taps only for the last window positions of a prompt); attention never
 *     reads before lo.
 *   - splash_dflash_draft: one block at position state->n_ctx (the anchor's
 *     position).
 *   - snapshot: the state as bytes (a header and the rings), stored beside
 *     the target's recurrent state in a prefix-cache snapshot.
 * No call allocates after load / state_new.  One lane per call
 * (runtime/draft.h's DFlash entry, models/dflash/dflash_draft.c, loops over
 * lanes).
 */
#ifndef SPLASH_DFLASH_H
#define SPLASH_DFLASH_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "package/package.h"

#define SPLASH_DFLASH_MAX_TAPS 64
#define SPLASH_DFLASH_MAX_LAYERS 64
#define SPLASH_DFLASH_MAX_BLOCK 64

typedef struct splash_dflash_dims {
    int hidden, n_layers, heads, kv_heads, head_dim, intermediate;
    int block_size, mask_token_id, sliding_window, vocab;
    int n_taps;
    int taps[SPLASH_DFLASH_MAX_TAPS];               /* target layers, in tap order */
    unsigned char sliding[SPLASH_DFLASH_MAX_LAYERS]; /* layer has the window */
    unsigned char causal[SPLASH_DFLASH_MAX_LAYERS];  /* causal inside the block */
    float rms_eps;
    double rope_theta;
} splash_dflash_dims;

typedef struct splash_dflash_options {
    int threads;     /* CPU threads; <= 0: every core */
    int act;         /* CPU_ACT_* for q4/q8 products (0 = fp32, the reference) */
    int max_context; /* positions one state's full layers hold (> 0), when window is 0 */
    int window;      /* > 0: every layer sees at most the last `window` context positions (a ring) */
    int max_block;   /* most rows of a block (0 = the draft's block_size; at most SPLASH_DFLASH_MAX_BLOCK) */
} splash_dflash_options;

typedef struct splash_dflash splash_dflash;
typedef struct splash_dflash_state splash_dflash_state;

/* Binds the package's draft ("draft" in the manifest, draft.* tensors) and the
 * target's embed / lm_head.  SPLASH_E_NOTFOUND when the package has no draft. */
int splash_dflash_load(const splash_package *pkg, const splash_dflash_options *opt, splash_dflash **out,
                       splash_error *err);
void splash_dflash_free(splash_dflash *d);
const splash_dflash_dims *splash_dflash_get_dims(const splash_dflash *d);
/* Bytes of the draft's own tensors in the package (draft.*). */
size_t splash_dflash_weight_bytes(const splash_dflash *d);

/* A lane's context cache (empty).  _bytes: what it holds in memory. */
int splash_dflash_state_new(const splash_dflash *d, splash_dflash_state **out, splash_error *err);
void splash_dflash_state_free(splash_dflash_state *s);
void splash_dflash_state_reset(splash_dflash_state *s);
int splash_dflash_state_positions(const splash_dflash_state *s); /* committed positions appended */
size_t splash_dflash_state_bytes(const splash_dflash_state *s);
/* Moves n_ctx forward to pos (>= n_ctx): positions before it are no longer
 * seen (their taps were never appended). */
int splash_dflash_state_seek(const splash_dflash *d, splash_dflash_state *s, int pos, splash_error *err);
/* The state as bytes: _snapshot_bytes of them; load checks they belong to a
 * state of the same shape. */
size_t splash_dflash_state_snapshot_bytes(const splash_dflash_state *s);
void splash_dflash_state_save(const splash_dflash_state *s, void *dst);
int splash_dflash_state_load(splash_dflash_state *s, const void *src, splash_error *err);

/* Appends n committed positions (state positions n_ctx .. n_ctx+n-1):
 * taps [n][n_taps * hidden], row r = the target's tap outputs at that
 * position, concatenated in tap order (the layout of splash_batch.taps).
 * Without a window, fails without changing the state when full layers would
 * exceed max_context; with one, the rings drop their oldest positions. */
int splash_dflash_append(splash_dflash *d, splash_dflash_state *s, const float *taps, int n, splash_error *err);

/* Drafts one block [anchor, MASK x (block-1)] at positions n_ctx .. n_ctx +
 * block - 1 (2 <= block <= max_block; past the trained block_size the rows
 * are the draft's guesses all the same).  hidden: out [block-1][hidden], the
 * draft's final-normed states of rows 1..block-1; logits: out [block-1][vocab]
 * through the target's lm_head, or NULL.  The state is not changed. */
int splash_dflash_draft(splash_dflash *d, const splash_dflash_state *s, int32_t anchor, int block, float *hidden,
                        float *logits, splash_error *err);

/* The DFlash draft behind runtime/draft.h's ops (dflash_draft.c): one
 * splash_dflash and a state per lane, windowed (options.window). */
struct splash_draft;
struct splash_draft_options;
int splash_dflash_draft_open(splash_package *pkg, const struct splash_draft_options *opt, struct splash_draft **out,
                             splash_error *err);

#endif
