/* dflash_ctx.h - a DFlash draft's context cache and block attention, shared
 * by v1 (dflash.c) and v2 (dflash2.c).
 *
 * Both drafts are Qwen3-style layers over the target's tap features; v2 adds
 * a conv around each sublayer, a logit transform and a selector, but its
 * context side is v1's exactly.  This module owns that common part:
 *   - the manifest fields both have (splash_dflash_dims) and the weights
 *     both bind (target embed / lm_head, fc, hidden_norm, norm, and per layer
 *     the norms and the attention / SwiGLU projections);
 *   - the CPU context and the block scratch;
 *   - one lane's context K/V cache (splash_dflash_kv: rings, [lo, n_ctx),
 *     seek, snapshot as bytes), its append from tap rows;
 *   - the block attention over context + block (per-layer causal / sliding
 *     mask), from a block input the caller chose (v1: the normed residual,
 *     v2: its conv) to the per-head outputs in o, before o_proj.
 * The public types stay per version (splash_dflash vs splash_dflash2 and
 * their states, dflash.h / dflash2.h); each wraps these structs, so what a
 * version does differently stays in its own file.  Not a public API: only
 * the two drafts include it.
 */
#ifndef SPLASH_DFLASH_CTX_H
#define SPLASH_DFLASH_CTX_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/cpu.h"
#include "base/json.h"
#include "base/status.h"
#include "models/dflash/dflash.h"
#include "package/package.h"

#define SPLASH_DFLASH_APPEND_CHUNK 64 /* context rows per append pass (scratch rows) */

typedef struct splash_dflash_layer {
    float *input_norm, *post_norm;        /* [H] factors (plain Qwen3 RMSNorm weights) */
    float *q_norm, *k_norm;               /* [hd] */
    const splash_tensor *q_proj;          /* [heads*hd, H] */
    const splash_tensor *k_proj, *v_proj; /* [kvh*hd, H] */
    const splash_tensor *o_proj;          /* [H, heads*hd] */
    const splash_tensor *gate, *up;       /* [I, H] */
    const splash_tensor *down;            /* [H, I] */
} splash_dflash_layer;

typedef struct splash_dflash_ctx {
    const char *name;             /* "dflash" / "dflash2": the prefix of error messages */
    uint32_t snap_magic;          /* a snapshot's first word */
    splash_dflash_dims d;         /* the fields v1 and v2 share */
    int max_context;              /* positions a full layer holds (the window when window > 0) */
    int window;                   /* > 0: full layers are a ring of the last `window` positions */
    int max_block;                /* most rows of one draft block */
    size_t weight_bytes;          /* the draft's own tensors (draft.*, not the target's embed / lm_head) */
    const splash_tensor *embed;   /* [V, H] target */
    const splash_tensor *lm_head; /* [V, H] target (embed when tied) */
    const splash_tensor *fc;      /* [H, n_taps*H] */
    float *hidden_norm, *norm;    /* [H] */
    splash_dflash_layer layers[SPLASH_DFLASH_MAX_LAYERS];
    float *vec;                   /* every fp32 vector above, one allocation */
    cpu_ctx cpu;
    /* scratch, rows R = max(max_block, APPEND_CHUNK) */
    float *x, *xn;                /* [R][H] residual, normed */
    float *q, *k, *v, *o;         /* [R][heads*hd], [R][kvh*hd] x2, [R][heads*hd] */
    float *ff, *ff2;              /* [R][I] */
    float *scores;                /* [n_threads][max_context + max_block] */
    size_t scores_stride;
} splash_dflash_ctx;

/* One lane's context cache: positions [lo, n_ctx). */
typedef struct splash_dflash_kv {
    const char *name;                   /* as the ctx's */
    uint32_t snap_magic;
    int n_ctx;
    int lo;                             /* first position held: earlier ones were skipped (seek) */
    int n_layers, kvw;
    int cap[SPLASH_DFLASH_MAX_LAYERS];  /* positions held; a ring, slot = pos % cap */
    float *k[SPLASH_DFLASH_MAX_LAYERS]; /* [cap][kvh*hd] roped, normed keys */
    float *v[SPLASH_DFLASH_MAX_LAYERS]; /* [cap][kvh*hd] */
    float *mem;
    size_t bytes;
} splash_dflash_kv;

/* The shared parts inside each version's model and state (defined in
 * dflash.c and dflash2.c; the draft-interface glue, dflash_lanes.h, uses them). */
struct splash_dflash2;
struct splash_dflash2_state;
splash_dflash_ctx *splash_dflash_ctx_of(splash_dflash *m);
splash_dflash_kv *splash_dflash_kv_of(splash_dflash_state *s);
splash_dflash_ctx *splash_dflash2_ctx_of(struct splash_dflash2 *m);
splash_dflash_kv *splash_dflash2_kv_of(struct splash_dflash2_state *s);

/* ---- load ------------------------------------------------------------------ */

/* manifest draft.<key> as an int in [lo, hi]. */
int splash_dflash_dim_int(const json_value *o, const char *key, int lo, int hi, int *out, splash_error *err);
/* The shared fields of the manifest's draft, whose architecture must be
 * `arch`; *draft: the manifest's draft object, for the version's own fields. */
int splash_dflash_parse_dims(const splash_package *pkg, const char *arch, splash_dflash_dims *d,
                             const json_value **draft, splash_error *err);
/* An f32/bf16/f16 tensor of `ndim` dims copied to fp32 at dst. */
int splash_dflash_bind_floats(const splash_package *pkg, const char *name, int ndim, const int64_t *shape, float *dst,
                              splash_error *err);
int splash_dflash_bind_matrix(const splash_package *pkg, const char *name, int64_t rows, int64_t cols,
                              const splash_tensor **out, splash_error *err);
/* Checks the options, binds the shared weights, sets up the CPU context and
 * the scratch.  c zeroed before; on failure, release c. */
int splash_dflash_ctx_load(splash_dflash_ctx *c, const char *name, uint32_t snap_magic, const splash_package *pkg,
                           const splash_dflash_options *opt, const splash_dflash_dims *dims, splash_error *err);
void splash_dflash_ctx_release(splash_dflash_ctx *c);

/* ---- a lane's context cache ---------------------------------------------------- */

int splash_dflash_kv_init(splash_dflash_kv *s, const splash_dflash_ctx *c, splash_error *err);
/* kv_init in two steps, for rings in other memory (the CUDA draft's device
 * memory): shape fills everything but the memory (empty, caps, bytes);
 * place points the rings into mem (bytes of it, each layer's k then v). */
void splash_dflash_kv_shape(splash_dflash_kv *s, const splash_dflash_ctx *c);
void splash_dflash_kv_place(splash_dflash_kv *s, float *mem);
void splash_dflash_kv_release(splash_dflash_kv *s);
int splash_dflash_kv_seek(const splash_dflash_ctx *c, splash_dflash_kv *s, int pos, splash_error *err);
/* A snapshot is a SPLASH_DFLASH_SNAP_HEADER-byte header (magic, layers,
 * n_ctx, lo, bytes), then the rings exactly as mem holds them (each layer's
 * k then v).  The header alone: for a backend whose rings live elsewhere
 * (models/dflash/cuda_dflash.cu); load_header checks it and sets n_ctx, lo. */
#define SPLASH_DFLASH_SNAP_HEADER 64
void splash_dflash_kv_save_header(const splash_dflash_kv *s, void *dst);
int splash_dflash_kv_load_header(splash_dflash_kv *s, const void *src, splash_error *err);
size_t splash_dflash_kv_snapshot_bytes(const splash_dflash_kv *s);
void splash_dflash_kv_save(const splash_dflash_kv *s, void *dst);
int splash_dflash_kv_load(splash_dflash_kv *s, const void *src, splash_error *err);
/* An append's arguments against the state (rows, the draft, max_context). */
int splash_dflash_ctx_append_check(const splash_dflash_ctx *c, const splash_dflash_kv *s, const float *taps, int n,
                                   splash_error *err);
/* splash_dflash_append / splash_dflash2_append (no conv on the context). */
int splash_dflash_ctx_append(splash_dflash_ctx *c, splash_dflash_kv *s, const float *taps, int n, splash_error *err);

/* ---- a block ------------------------------------------------------------------- */

/* Checks a draft call's arguments (the state's shape, block, anchor, output). */
int splash_dflash_ctx_check(const splash_dflash_ctx *c, const splash_dflash_kv *s, int32_t anchor, int block,
                            const float *hidden, splash_error *err);
/* x = the block's embeddings [anchor, MASK x (block-1)], times scale when it is not 1. */
void splash_dflash_ctx_embed(splash_dflash_ctx *c, int32_t anchor, int block, float scale);
/* dst = rmsnorm(src, nf), rows [rows][H]. */
void splash_dflash_ctx_norm(splash_dflash_ctx *c, const float *src, float *dst, const float *nf, int rows);
/* Layer l's attention of the block at positions s->n_ctx..: q, k, v from
 * in [block][H], q/k norm and rotary, softmax over the visible context and
 * block keys; out: c->o [block][heads*hd] (o_proj is the caller's). */
void splash_dflash_ctx_attend(splash_dflash_ctx *c, const splash_dflash_kv *s, int l, const float *in, int block);
/* xn = norm(x); hidden = rows 1..block-1 of xn; logits (or NULL) = lm_head(them). */
void splash_dflash_ctx_finish(splash_dflash_ctx *c, int block, float *hidden, float *logits);

#endif
