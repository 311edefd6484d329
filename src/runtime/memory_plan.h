/* memory_plan.h - the start-up memory plan: what the runtime may use and how
 * it is split.
 *
 *   budget   = usable memory (CPU: MemAvailable minus a margin), capped by
 *              --max-memory
 *   fixed    = weights (mapped size) + scratch for the workload + reserves
 *   pool     = budget - fixed: state slots (one per lane), the snapshot
 *              budget, and KV pages (the rest)
 *   max context = what one request can hold in the KV pages, at most 256K,
 *              the model's limit or --max-context
 *   spare    = what the pool leaves when its cap bounds the KV pages, up to
 *              what the model would use to run faster (model.h,
 *              splash_model_use_spare): KV pages come first
 *
 * When it does not fit, reason names why (working_set_too_small: the fixed
 * part alone exceeds the budget; kv_pool_does_not_fit: what is left cannot
 * hold one request of the asked context) and the printed breakdown gives
 * every figure.  Pure arithmetic apart from reading /proc/meminfo, so the
 * tests can plan any machine.
 */
#ifndef SPLASH_MEMORY_PLAN_H
#define SPLASH_MEMORY_PLAN_H

#include <stddef.h>

#include "base/strbuf.h"

typedef struct splash_memory_plan_input {
    size_t available;    /* usable memory of the device (0: read MemAvailable) */
    size_t max_memory;   /* --max-memory, 0 = none */
    size_t weight_bytes, scratch_bytes;
    size_t page_bytes, state_bytes;
    int page_tokens;
    int lanes;           /* state slots */
    int model_context;   /* the model's max positions */
    int max_context;     /* --max-context, 0 = as much as fits (at most 256K) */
    size_t pool_cap;     /* most bytes for KV pages (snapshots have their own allowance), 0 = no cap */
    size_t spare_want;   /* the model's spare_bytes (model.h), 0 = none */
} splash_memory_plan_input;

typedef struct splash_memory_plan {
    size_t available, margin, budget;
    size_t weights, scratch, reserves, fixed;
    size_t pool;         /* budget - fixed (0 when it does not fit) */
    size_t slot_bytes;   /* lanes x state */
    size_t snapshot_bytes; int max_snapshots;
    size_t kv_bytes; int n_pages;
    int max_context;
    size_t spare;        /* granted to the model beyond its needs (<= spare_want) */
    size_t deficit;      /* bytes missing when it does not fit */
    const char *reason;  /* NULL when it fits */
} splash_memory_plan;

/* MemAvailable in bytes, or 0 when unknown. */
size_t splash_mem_available(void);
/* 0 when the plan fits, else SPLASH_E_NOMEM with p->reason set. */
int splash_memory_plan_make(const splash_memory_plan_input *in, splash_memory_plan *p);
/* One line per figure ("name  figure"), then the verdict. */
void splash_memory_plan_print(const splash_memory_plan *p, strbuf *out);

#endif
