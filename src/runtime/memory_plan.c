/* memory_plan.c - the start-up memory plan (see memory_plan.h). */
#include "runtime/memory_plan.h"

#include <stdio.h>
#include <string.h>

#include "base/status.h"

#define MAX_CONTEXT_CAP 262144
#define MIB ((size_t)1 << 20)

size_t splash_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

int splash_memory_plan_make(const splash_memory_plan_input *in, splash_memory_plan *p) {
    memset(p, 0, sizeof *p);
    p->available = in->available ? in->available : splash_mem_available();
    /* margin: what the OS, the server and page cache need: 5% + 256 MiB, at most 2 GiB */
    p->margin = p->available / 20 + 256 * MIB;
    if (p->margin > 2048 * MIB) p->margin = 2048 * MIB;
    p->budget = p->available > p->margin ? p->available - p->margin : 0;
    if (in->max_memory && in->max_memory < p->budget) p->budget = in->max_memory;
    p->weights = in->weight_bytes;
    p->scratch = in->scratch_bytes;
    p->reserves = 16 * MIB + p->scratch / 8; /* buffers of the server, token records, logits */
    p->fixed = p->weights + p->scratch + p->reserves;
    p->slot_bytes = (size_t)in->lanes * in->state_bytes;
    int want = in->model_context > 0 ? in->model_context : MAX_CONTEXT_CAP;
    if (want > MAX_CONTEXT_CAP) want = MAX_CONTEXT_CAP;
    if (in->max_context > 0 && in->max_context < want) want = in->max_context;
    size_t pt = (size_t)(in->page_tokens > 0 ? in->page_tokens : 1);
    size_t min_pages = ((size_t)want + pt - 1) / pt;
    if (p->fixed + p->slot_bytes > p->budget) {
        p->reason = "working_set_too_small";
        p->deficit = p->fixed + p->slot_bytes - p->budget;
        return SPLASH_E_NOMEM;
    }
    p->pool = p->budget - p->fixed;
    size_t rest = p->pool - p->slot_bytes;
    /* snapshots: an eighth of the pool, at most 64, at least 2 when there is
     * room.  Their own allowance, decided before the KV cap: a smaller KV
     * format must not mean fewer snapshots (more re-processing). */
    if (in->state_bytes) {
        size_t n = rest / 8 / in->state_bytes;
        if (n > 64) n = 64;
        if (n < 2 && rest >= 2 * in->state_bytes + min_pages * in->page_bytes) n = 2;
        p->max_snapshots = (int)n;
        p->snapshot_bytes = n * in->state_bytes;
    }
    size_t kv = rest - p->snapshot_bytes;
    const int capped = in->pool_cap && kv > in->pool_cap;
    if (capped) kv = in->pool_cap; /* the cap bounds KV pages only */
    size_t pages = in->page_bytes ? kv / in->page_bytes : 0;
    if (pages > (size_t)1 << 30) pages = (size_t)1 << 30;
    p->n_pages = (int)pages;
    p->kv_bytes = pages * in->page_bytes;
    /* what the cap left (without it the pages take all but a page's remainder) */
    size_t left = capped ? rest - p->snapshot_bytes - p->kv_bytes : 0;
    p->spare = in->spare_want < left ? in->spare_want : left;
    size_t ctx = pages * pt;
    p->max_context = (int)(ctx < (size_t)want ? ctx : (size_t)want);
    /* one request of the asked context (or, with no ask, of 4K) must fit */
    size_t need_pages = in->max_context > 0 ? min_pages : (size_t)(4096 < want ? 4096 : want) / pt;
    if (pages < need_pages || pages < 2) {
        p->reason = "kv_pool_does_not_fit";
        p->deficit = (need_pages > pages ? need_pages - pages : 2 - pages) * in->page_bytes;
        return SPLASH_E_NOMEM;
    }
    return 0;
}

static void line(strbuf *o, const char *name, size_t bytes) {
    sb_printf(o, "  %-22s %10.1f MiB\n", name, (double)bytes / (double)MIB);
}

void splash_memory_plan_print(const splash_memory_plan *p, strbuf *o) {
    sb_printf(o, "memory plan:\n");
    line(o, "available", p->available);
    line(o, "margin", p->margin);
    line(o, "budget", p->budget);
    line(o, "weights", p->weights);
    line(o, "scratch", p->scratch);
    line(o, "reserves", p->reserves);
    line(o, "fixed", p->fixed);
    line(o, "pool", p->pool);
    line(o, "state slots", p->slot_bytes);
    sb_printf(o, "  %-22s %10.1f MiB (%d)\n", "snapshots", (double)p->snapshot_bytes / (double)MIB, p->max_snapshots);
    sb_printf(o, "  %-22s %10.1f MiB (%d pages)\n", "kv pages", (double)p->kv_bytes / (double)MIB, p->n_pages);
    sb_printf(o, "  %-22s %10d tokens\n", "max context", p->max_context);
    line(o, "spare (model)", p->spare);
    if (p->reason) {
        line(o, "deficit", p->deficit);
        sb_printf(o, "  does not fit: %s\n", p->reason);
    }
}
