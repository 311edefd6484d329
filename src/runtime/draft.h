/* draft.h - what the speculative cycle asks of a draft, without naming one.
 *
 * The engine (runtime/engine.c) decodes every lane in cycles: the draft
 * proposes up to B-1 tokens after the lane's anchor, the target verifies the
 * block in one forward, the cycle accepts a prefix (runtime/spec.h) and
 * commits it.  A draft is an ops table plus its context, like a model
 * (runtime/model_ops.h): the runtime calls these entries and never knows
 * whether DFlash, a test oracle or a lookup table answers.
 *
 * A draft keeps per-lane state (the lane index is the engine's lane, 0 ..
 * max_lanes-1) that follows the lane's committed positions:
 *   - append: after the target ran rows with SPLASH_ROW_TAPS, their tap
 *     rows ([n][n_taps * hidden], the layout of splash_batch.taps) for
 *     positions pos .. pos+n-1.  pos may jump forward over positions whose
 *     taps were never computed (the engine asks for taps only for the last
 *     `window` positions of a prompt); it never goes back.
 *   - propose: the anchor is the lane's last known token at position
 *     n_seq-1; the state holds positions before it.  The draft fills either
 *     logits [n][vocab] (proposal selection then happens in runtime/spec.h
 *     with the request's sampling parameters and the DRAFT random stream),
 *     n deterministic tokens (q = the point mass), or - a draft that picks
 *     its own proposals, DFlash 2's selector - n tokens plus each one's
 *     sparse q (r->q[i]: the candidates row i was drawn from, drawn with
 *     (seed, n_seq + i, SPLASH_RNG_DRAFT); the cycle's rejection sampling
 *     uses that q).  Such a draft may use logits as its scratch.
 *   - snapshot / restore: the lane's state as snapshot_bytes bytes, stored
 *     with the target's recurrent state in the prefix cache's snapshots, so a
 *     restored prefix brings back both.  The bytes live where the target's
 *     do (splash_model_alloc_memory: device memory beside a CUDA model), so
 *     a draft on the GPU copies with the direction read from the pointers.
 * append is called only for drafts that read taps (n_taps > 0).
 *
 * Lifetimes: open returns a splash_draft the caller frees with
 * splash_draft_free; the package (for a model draft) must outlive it.
 */
#ifndef SPLASH_DRAFT_H
#define SPLASH_DRAFT_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "runtime/sampling.h"
#include "runtime/spec.h"

struct splash_model; /* runtime/model.h */

typedef struct splash_package splash_package;

#define SPLASH_DRAFT_MAX_BLOCK 16 /* most rows of a block: anchor + 15 proposals */

enum { SPLASH_DRAFT_LOGITS = 1, SPLASH_DRAFT_TOKENS = 2, SPLASH_DRAFT_SPARSE = 3 };

/* One lane's proposal request. */
typedef struct splash_draft_req {
    int lane;
    const int32_t *seq; /* the request's tokens: prompt, then its output so far; seq[n_seq-1] is the anchor */
    int n_seq;
    int n;              /* proposals wanted, 1 .. max_block-1 */
    const splash_sampling_params *sp;
    splash_spec_q *q;   /* [n] out: each proposal's q (SPLASH_DRAFT_SPARSE) */
} splash_draft_req;

/* One lane's committed rows of taps (append_lanes). */
typedef struct splash_draft_taps {
    int lane, pos;
    const float *taps; /* [n][n_taps * hidden] */
    int n;
} splash_draft_taps;

typedef struct splash_draft_ops {
    /* Fills logits [n][vocab] and returns SPLASH_DRAFT_LOGITS, fills
     * tokens[n] and returns SPLASH_DRAFT_TOKENS, or fills tokens[n] and
     * r->q[n] and returns SPLASH_DRAFT_SPARSE; a negative status on error. */
    int (*propose)(void *impl, const splash_draft_req *r, float *logits, int32_t *tokens, splash_error *err);
    int (*append)(void *impl, int lane, int pos, const float *taps, int n, splash_error *err);
    void (*reset)(void *impl, int lane);
    void (*snapshot)(void *impl, int lane, void *dst);
    int (*restore)(void *impl, int lane, const void *src, splash_error *err);
    void (*free)(void *impl);
    /* append with taps in the target's device buffer (splash_model_device_taps,
     * the same device): read before it returns (the next forward rewrites
     * them).  NULL: the draft takes host rows only. */
    int (*append_device)(void *impl, int lane, int pos, const float *taps, int n, splash_error *err);
    /* propose for n requests at once (a draft whose cost is reading its
     * weights drafts them together: one forward for the lanes of a cycle):
     * request i fills logits[i] / tokens[i] / r[i].q as propose would and
     * kinds[i] is what propose would return (a negative status: that request
     * failed, errs[i] says why).  Each request's proposals must be the ones
     * propose gives it alone.  Returns 0.  NULL: the engine calls propose
     * lane by lane. */
    int (*propose_lanes)(void *impl, const splash_draft_req *r, int n, float *const *logits, int32_t *const *tokens,
                         int *kinds, splash_error *errs);
    /* append (on_device: append_device) for n lanes at once, one pass of the
     * draft's products for all their rows; status[i]: 0 or entry i's
     * failure (errs[i] says why).  Each lane's state must be what append
     * gives it alone.  Returns 0.  NULL: the engine appends lane by lane. */
    int (*append_lanes)(void *impl, const splash_draft_taps *t, int n, int on_device, int *status, splash_error *errs);
    /* The device taps (append_device, append_lanes' on_device) are written
     * on `stream` (splash_model_device_stream): the draft then orders its
     * reads of them on that stream (after the forward that wrote them,
     * before the next) and no longer waits for them on the host.  NULL: the
     * draft waits for its reads before append returns. */
    void (*bind_device_taps)(void *impl, void *stream);
    /* Once the target model is loaded: a draft opened with share_target
     * takes the weights it shares with the target from the model's device
     * copies (splash_model_device_weight), or uploads its own where the model
     * keeps none; it proposes only after this.  0 or a status.  NULL: the
     * draft shares nothing. */
    int (*bind_model)(void *impl, struct splash_model *model, splash_error *err);
    /* Greedy proposals left on the device (the decode cycle without a host
     * wait between the draft and the verify): proposes r[0..n) as
     * propose_lanes would for requests whose proposals are their rows'
     * argmax, but returns without waiting: request i's r[i].n proposals are
     * int32s at *base + first[i] in device memory (valid until the next
     * propose), written on the draft's stream and, once bound
     * (bind_device_taps), ordered before what the target's stream runs next,
     * so its forward reads them as DEVICE_TOKEN rows (model.h).  0, or a
     * status when the requests cannot go this way (not all greedy, more than
     * one forward's worth, ...): nothing is queued then and the engine calls
     * propose_lanes.  After the forward, fetch_proposals gives the host the
     * same tokens[i] and kinds[i] propose_lanes would have (waiting for them
     * if they are not in yet).  NULL: no such path. */
    int (*propose_device)(void *impl, const splash_draft_req *r, int n, const int32_t **base, int *first,
                          splash_error *err);
    int (*fetch_proposals)(void *impl, const splash_draft_req *r, int n, int32_t *const *tokens, int *kinds,
                           splash_error *errs);
} splash_draft_ops;

typedef struct splash_draft {
    const splash_draft_ops *ops;
    void *impl;
    const char *name;       /* "dflash", "dflash2", "oracle", "random" */
    int block_size;         /* the draft's own block (the engine's default B) */
    int max_block;          /* most rows propose can fill plus one (<= SPLASH_DRAFT_MAX_BLOCK) */
    int n_taps;             /* target layers it reads (0: none) */
    int tap_layers[64];
    int window;             /* context positions it can use (taps beyond are wasted) */
    size_t snapshot_bytes;  /* one lane's state as bytes (0: nothing to keep) */
    size_t state_bytes;     /* memory of all its lane states */
    size_t weight_bytes;    /* its own weights */
} splash_draft;

typedef struct splash_draft_options {
    int threads;     /* CPU threads (0 = every core) */
    int act;         /* splash_cpu_act of q4/q8 products (auto = int8, as the target) */
    int lanes;       /* lane states to keep */
    int window;      /* context positions (0 = 2048) */
    int max_block;   /* most rows of a block (0 = the draft's own block size) */
    const char *device; /* "cuda": the draft on the GPU (models/dflash/cuda_dflash.h); NULL or "cpu": the CPU */
    int share_target;   /* 1: bind_model follows the target's load (the engine): weights the target holds on
                           the device (the CUDA drafts' lm_head) are not uploaded twice */
} splash_draft_options;

/* The package's draft (manifest "draft"), by its architecture.
 * SPLASH_E_NOTFOUND when the package has none. */
int splash_draft_open(splash_package *pkg, const splash_draft_options *opt, splash_draft **out, splash_error *err);
void splash_draft_free(splash_draft *d);

/* ---- test drafts (engine test option; never chosen by a package) ---- */

/* Oracle: proposes the continuation of a registered reference sequence: of
 * the n proposals asked, the first `agree` follow the reference (whose
 * tokens 0..n_seq-1 must equal the request's), the others are wrong tokens
 * ((reference + 1) % vocab), so a correct cycle accepts exactly `agree`.
 * A request matching no reference (or past its end) gets wrong tokens. */
splash_draft *splash_draft_oracle_new(int vocab, int block_size);
/* Registers a reference (copied); agree: proposals per cycle that agree, or
 * -1: the request's sampling seed says (a greedy request's seed changes
 * nothing else, so one reference serves every agreement count). */
int splash_draft_oracle_add(splash_draft *d, const int32_t *ref, int n, int agree);
/* The same oracle with propose_lanes (each request answered as propose
 * answers it), which counts its calls and the most requests one held: the
 * engine's one-call-for-all-lanes path under test. */
splash_draft *splash_draft_oracle_lanes_new(int vocab, int block_size);
void splash_draft_oracle_lanes_counts(const splash_draft *d, int *calls, int *max_requests);
/* The same oracle with propose_device / fetch_proposals, its "device" memory
 * the host's (so for a CPU model only): the engine's path for proposals left
 * on the device, under test with proposals that are accepted.  At most
 * SPLASH_DRAFT_MAX_LANES_TEST requests a call. */
#define SPLASH_DRAFT_MAX_LANES_TEST 16
splash_draft *splash_draft_oracle_device_new(int vocab, int block_size);

/* Random: logits [n][vocab] drawn from the keyed stream (request seed,
 * position), so a lane's proposals never depend on its neighbours. */
splash_draft *splash_draft_random_new(int vocab, int block_size);

#endif
