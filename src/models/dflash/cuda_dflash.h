/* cuda_dflash.h - the DFlash drafts (v1 and v2) on the CUDA backend, behind
 * runtime/draft.h's ops: what a CUDA engine proposes with.
 *
 * The CPU draft (dflash.c / dflash2.c, loaded with one thread) binds and
 * checks the package's draft and keeps the dimensions; this file uploads its
 * weights into one device allocation (q4 matrices in the q4 kernel's tiles,
 * others as stored, vectors fp32, q|k|v and gate|up stacked where they can be:
 * cuda_model.h's qc_upload) and runs the same
 * forward with the backend's kernels (norm, rope, q4 / dense products,
 * SwiGLU, rows) and the draft's own (backend/cuda/dflash.h: conv, ring
 * write, block attention, logit transform, selector edges; argmax.h: argmax, top-k).
 *
 * Per lane, the context K/V rings live on the device in the CPU's layout
 * (dflash_ctx.h's splash_dflash_kv with device memory), so a snapshot is the
 * CPU's bytes and the lane glue (dflash_lanes.c: reach, reset, describe) is
 * shared.  append takes the target's tap rows from the host (the engine's
 * batch) or from the CUDA model's device buffer (append_device), 64 rows a
 * pass; append_lanes puts several lanes' rows through one pass (fc and the
 * k / v products once for all, the rings written lane by lane).
 *
 * propose (propose_lanes: the blocks of several lanes through one forward,
 * each weight read once for all; the conv and the block attention block by
 * block; then each block's proposals as below):
 *   v2: logits -> transform -> top-k candidates, the selector's gate and the
 *       edge scores of every (previous pick, candidate) pair on the device;
 *       the walk over them (greedy or sampled with the keyed DRAFT stream)
 *       on the host with dflash2.c's splash_dflash2_pick: SPLASH_DRAFT_SPARSE.
 *   v1: greedy: the argmax on the device, SPLASH_DRAFT_TOKENS (the runtime's
 *       greedy selection of the same logits would pick the same tokens);
 *       sampling: each row's top 32 logits to the host (one top-k over every
 *       lane's rows, in the blocks' graph), q = their softmax at
 *       the request's temperature, the proposal drawn from it with the keyed
 *       DRAFT stream: SPLASH_DRAFT_SPARSE (the CPU draft hands over whole
 *       rows of logits instead, 0.6 MB a row on a 151K vocabulary; any q is
 *       lossless, this one drops the mass outside the top 32).
 * Nothing is allocated after open but the CUDA graphs of the blocks'
 * shapes (propose: a cycle's blocks are filled into the descriptor on the
 * host, and their forward, logits and greedy argmax run as one graph per
 * shape once the shape has run eagerly; SPLASH_CUDA_GRAPHS=0: eagerly).  One
 * stream; propose ends with a synchronisation (the engine reads the
 * proposals), append does not (the next op queues behind it).
 */
#ifndef SPLASH_CUDA_DFLASH_DRAFT_H
#define SPLASH_CUDA_DFLASH_DRAFT_H

#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct splash_package;
struct splash_draft;
struct splash_draft_options;

/* The package's draft (v1 or v2) on the GPU; as splash_draft_open. */
int splash_dflash_cuda_open(struct splash_package *pkg, const struct splash_draft_options *opt,
                            struct splash_draft **out, splash_error *err);

/* Tests: the block forward of a lane as splash_dflash_draft / _dflash2_draft
 * compute it: hidden [block-1][hidden] and (when not NULL) logits
 * [block-1][vocab] (v2: transformed) to the host; the lane is not changed. */
int splash_dflash_cuda_forward(struct splash_draft *d, int lane, int32_t anchor, int block, float *hidden,
                               float *logits, splash_error *err);

#ifdef __cplusplus
}
#endif

#endif
