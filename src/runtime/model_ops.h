/* model_ops.h - what an architecture implements behind splash_model_*.
 *
 * runtime/model.c picks one table by the manifest's "architecture" and
 * forwards every call to it; the rest of the runtime sees only model.h.  The
 * entries mirror model.h one for one (see there for the contracts), with the
 * architecture's own state as the first argument.
 */
#ifndef SPLASH_MODEL_OPS_H
#define SPLASH_MODEL_OPS_H

#include "runtime/model.h"

typedef struct splash_model_ops {
    int (*load)(splash_package *pkg, const splash_model_options *opt, void **impl, splash_error *err);
    void (*free)(void *impl);
    const splash_model_needs *(*needs)(const void *impl);
    int (*attach_memory)(void *impl, void *kv_pages, int n_pages, void *states, int n_slots, splash_error *err);
    void *(*alloc_memory)(void *impl, size_t bytes);
    void (*free_memory)(void *impl, void *p);
    int (*reset_slot)(void *impl, int slot);
    int (*forward)(void *impl, const splash_batch *b, splash_error *err);
    int (*commit)(void *impl, int slot, int n_accepted, splash_error *err);
    int (*commit_lanes)(void *impl, const int *slots, const int *n_accepted, int n, splash_error *err); /* NULL: commit by commit */
    int (*snapshot)(void *impl, int slot, void *dst);
    int (*restore)(void *impl, int slot, const void *src);
    const float *(*device_taps)(void *impl); /* NULL: none (splash_model_device_taps) */
    void *(*device_stream)(void *impl);      /* NULL: none (splash_model_device_stream) */
    int (*finish)(void *impl);               /* NULL: nothing queued, ever (splash_model_finish) */
    const void *(*device_weight)(void *impl, const void *data); /* NULL: none (splash_model_device_weight) */
    int (*use_spare)(void *impl, size_t bytes, size_t *used, splash_error *err); /* NULL: none */
    int (*commit_greedy)(void *impl, const splash_greedy_lane *lanes, int n, const int32_t *stop, int n_stop,
                         splash_greedy_result *res, splash_error *err); /* NULL: decided on the host */
} splash_model_ops;

#endif
