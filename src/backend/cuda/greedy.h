/* greedy.h - a step's greedy speculative decisions on the GPU: each lane
 * decided by runtime/spec_greedy.h's function (one thread a lane) from the
 * forward's TOP rows and the verify rows' tokens, and its committed rows
 * written into a commit's GDN lane descriptors, so the replay behind it
 * (the CUDA model's commit) needs no trip through the host.
 *
 * Every pointer is device memory.  Errors: SPLASH_E_INVALID for bad
 * arguments, SPLASH_E_IO when the launch fails.
 */
#ifndef SPLASH_CUDA_GREEDY_H
#define SPLASH_CUDA_GREEDY_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/gdn.h"
#include "runtime/spec_greedy.h"

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;

typedef struct splash_cuda_greedy_lane {
    int head;     /* the row of top_ids / top_vals holding its first decision row */
    int row;      /* its first decision row in the batch: tokens[row + 1 + i] is proposal i */
    int n_feed, n_props, limit;
    int commit;   /* its lane in the commit's descriptors (commit[g * n_commit + commit], every g < n_gdn) */
} splash_cuda_greedy_lane;

/* res[i] = lane i's decision (rows head .. head + n_props of top_ids /
 * top_vals, top_k entries a row, the best first); then every GDN layer's
 * descriptor of its commit lane gets n_rows = res[i].c. */
int splash_cuda_greedy_decide(const splash_cuda_greedy_lane *lanes, int n, const int32_t *top_ids,
                              const float *top_vals, int top_k, int vocab, const int32_t *tokens, const int32_t *stop,
                              int n_stop, splash_greedy_result *res, splash_cuda_gdn_lane *commit, int n_gdn,
                              int n_commit, struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif

#endif
