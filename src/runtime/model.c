/* model.c - splash_model_*: the one place that maps a package's architecture
 * (and the options' device) to its implementation.  Everything else in the
 * runtime calls model.h and never names an architecture; adding one is a line
 * in `architectures`.
 *
 * Devices: "cpu" (NULL: the library default, so tests stay on the reference)
 * and "cuda"; "auto" (the command line's default) picks cuda when it can.
 * The CUDA implementation lives in .cu files that only nvcc builds
 * (src/backend/cuda, src/models/qwen35/cuda_*.cu).  A build with CUDA
 * (SPLASH_CUDA: the Makefile's CUDA=1, the default wherever nvcc exists)
 * references it directly; a build without references it weakly, so a
 * program that links the objects itself (tools/gpu_tests.sh) still gets it,
 * and otherwise it is NULL and device "cuda" says so. */
#include "runtime/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/qwen35/qwen35.h"
#include "package/package.h"
#include "runtime/model_ops.h"

#ifdef SPLASH_CUDA
#define SPLASH_CUDA_REF
#else
#define SPLASH_CUDA_REF __attribute__((weak))
#endif
extern const splash_model_ops qwen35_cuda_ops SPLASH_CUDA_REF;
/* backend/cuda/device.cu: visible devices (0 without a driver), device 0's name and memory */
int splash_cuda_device_info(char *name, size_t cap, size_t *free_bytes, size_t *total_bytes) SPLASH_CUDA_REF;

struct splash_model {
    const splash_model_ops *ops;
    void *impl;
};

static const struct {
    const char *name;
    const splash_model_ops *ops;  /* device "cpu" */
    const splash_model_ops *cuda; /* device "cuda"; NULL when not linked in */
} architectures[] = {
    {"qwen3_5", &qwen35_ops, &qwen35_cuda_ops},
    {"qwen3_5_moe", &qwen35_ops, &qwen35_cuda_ops},
};

int splash_cpu_act_parse(const char *name) {
    static const char *names[] = {"auto", "fp32", "int8", "int16"};
    for (int i = 0; name && i < 4; i++)
        if (!strcmp(name, names[i])) return i;
    return -1;
}

/* 1 when the CUDA backend is in the program: always in a CUDA build; through
 * the weak references, only when a program links the CUDA objects itself. */
static int cuda_linked(void) {
#ifdef SPLASH_CUDA
    return 1;
#else
    return splash_cuda_device_info && &qwen35_cuda_ops;
#endif
}

int splash_device_resolve(const char *want, const char **device, char *name, size_t cap, size_t *free_bytes,
                          splash_error *err) {
    int ask_cuda = want && !strcmp(want, "cuda"), is_auto = want && !strcmp(want, "auto");
    *device = "cpu";
    if (name && cap) snprintf(name, cap, "CPU");
    if (free_bytes) *free_bytes = 0;
    if (want && !ask_cuda && !is_auto && strcmp(want, "cpu"))
        return splash_fail(err, SPLASH_E_INVALID, "device \"%s\": expected auto, cuda or cpu", want);
    if (!ask_cuda && !is_auto) return 0;
    if (!cuda_linked()) {
        if (ask_cuda)
            return splash_fail(err, SPLASH_E_UNSUPPORTED,
                               "device \"cuda\": this build has no CUDA backend (build where nvcc exists; docs/cuda.md)");
        return 0;
    }
    char nm[256];
    size_t fb = 0;
    if (splash_cuda_device_info(nm, sizeof nm, &fb, NULL) < 1) {
        if (ask_cuda) return splash_fail(err, SPLASH_E_UNSUPPORTED, "device \"cuda\": no CUDA device is visible");
        return 0;
    }
    *device = "cuda";
    if (name && cap) snprintf(name, cap, "%s", nm);
    if (free_bytes) *free_bytes = fb;
    return 0;
}

int splash_model_load(splash_package *pkg, const splash_model_options *opt, splash_model **out, splash_error *err) {
    *out = NULL;
    const char *arch = splash_package_architecture(pkg);
    const splash_model_ops *ops = NULL;
    const char *device;
    int rc = splash_device_resolve(opt ? opt->device : NULL, &device, NULL, 0, NULL, err);
    if (rc) return rc;
    int found = 0, cuda = !strcmp(device, "cuda");
    for (size_t i = 0; arch && i < sizeof architectures / sizeof architectures[0]; i++)
        if (!strcmp(arch, architectures[i].name)) {
            found = 1;
            ops = cuda ? architectures[i].cuda : architectures[i].ops;
        }
    if (!found)
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: architecture \"%s\" is not one Splash runs (qwen3_5, qwen3_5_moe)",
                           splash_package_dir(pkg), arch ? arch : "(none)");
    if (!ops)
        return splash_fail(err, SPLASH_E_UNSUPPORTED,
                           "device \"cuda\": this build has no CUDA backend (it is linked by tools/gpu_tests.sh; docs/cuda.md)");
    splash_model *m = calloc(1, sizeof *m);
    if (!m) return splash_fail(err, SPLASH_E_NOMEM, "out of memory");
    m->ops = ops;
    splash_model_options o = {0};
    if (opt) o = *opt;
    o.device = device;
    rc = ops->load(pkg, &o, &m->impl, err);
    if (rc) {
        free(m);
        return rc;
    }
    *out = m;
    return 0;
}

void splash_model_free(splash_model *m) {
    if (!m) return;
    m->ops->free(m->impl);
    free(m);
}

const splash_model_needs *splash_model_get_needs(const splash_model *m) { return m->ops->needs(m->impl); }

int splash_model_attach_memory(splash_model *m, void *kv_pages, int n_pages, void *states, int n_slots,
                               splash_error *err) {
    return m->ops->attach_memory(m->impl, kv_pages, n_pages, states, n_slots, err);
}

void *splash_model_alloc_memory(splash_model *m, size_t bytes) { return m->ops->alloc_memory(m->impl, bytes); }

void splash_model_free_memory(splash_model *m, void *p) { m->ops->free_memory(m->impl, p); }

int splash_model_reset_slot(splash_model *m, int slot) { return m->ops->reset_slot(m->impl, slot); }

int splash_model_forward(splash_model *m, const splash_batch *b, splash_error *err) {
    return m->ops->forward(m->impl, b, err);
}

int splash_model_commit(splash_model *m, int slot, int n_accepted, splash_error *err) {
    return m->ops->commit(m->impl, slot, n_accepted, err);
}

int splash_model_commit_lanes(splash_model *m, const int *slots, const int *n_accepted, int n, splash_error *err) {
    if (n < 0 || (n > 0 && (!slots || !n_accepted)))
        return splash_fail(err, SPLASH_E_INVALID, "commit: %d lanes without their slots and counts", n);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (slots[i] == slots[j]) return splash_fail(err, SPLASH_E_INVALID, "commit: slot %d named twice", slots[i]);
    static int lanes_off = -1; /* SPLASH_COMMIT_LANES=0: lane by lane (an A/B switch) */
    if (lanes_off < 0) {
        const char *v = getenv("SPLASH_COMMIT_LANES");
        lanes_off = v && !strcmp(v, "0");
    }
    if (m->ops->commit_lanes && !lanes_off && n > 0) return m->ops->commit_lanes(m->impl, slots, n_accepted, n, err);
    for (int i = 0; i < n; i++) {
        int rc = m->ops->commit(m->impl, slots[i], n_accepted[i], err);
        if (rc) return rc;
    }
    return SPLASH_OK;
}

int splash_model_commit_greedy(splash_model *m, const splash_greedy_lane *lanes, int n, const int32_t *stop,
                               int n_stop, splash_greedy_result *res, splash_error *err) {
    if (n < 0 || (n > 0 && (!lanes || !res)) || n_stop < 0 || n_stop > SPLASH_GREEDY_MAX_STOP || (n_stop && !stop))
        return splash_fail(err, SPLASH_E_INVALID, "commit greedy: %d lanes, %d stop ids", n, n_stop);
    for (int i = 0; i < n; i++) {
        const splash_greedy_lane *l = &lanes[i];
        if (l->n_feed < 1 || l->n_props < 0 || l->n_props + 1 > SPLASH_GREEDY_MAX_ROWS || l->limit < 1 || l->row < 0)
            return splash_fail(err, SPLASH_E_RANGE, "commit greedy: lane %d: %d fed, %d proposed, limit %d", i,
                               l->n_feed, l->n_props, l->limit);
        for (int j = 0; j < i; j++)
            if (lanes[j].slot == l->slot)
                return splash_fail(err, SPLASH_E_INVALID, "commit greedy: slot %d named twice", l->slot);
    }
    if (m->ops->commit_greedy) { /* SPLASH_E_UNSUPPORTED: not this forward (it then wrote the host outputs) */
        const int rc = m->ops->commit_greedy(m->impl, lanes, n, stop, n_stop, res, err);
        if (rc != SPLASH_E_UNSUPPORTED) return rc;
        memset(err, 0, sizeof *err);
    }
    int *slots = malloc(sizeof *slots * (size_t)(2 * n + 1)), *counts = slots + n;
    if (!slots) return splash_fail(err, SPLASH_E_NOMEM, "out of memory");
    int rc = splash_model_finish(m) ? splash_fail(err, SPLASH_E_IO, "commit greedy: the forward failed") : 0;
    for (int i = 0; i < n && !rc; i++) {
        const splash_greedy_lane *l = &lanes[i];
        if (!l->top_ids || !l->top_logits || l->top_k < 1 || (l->n_props && !l->props)) {
            rc = splash_fail(err, SPLASH_E_INVALID, "commit greedy: lane %d without its host rows", i);
            break;
        }
        splash_greedy_decide(l->top_ids, l->top_logits, (size_t)l->top_k, splash_model_get_needs(m)->vocab, l->props, l->n_feed,
                             l->n_props, l->limit, stop, n_stop, &res[i]);
        slots[i] = l->slot, counts[i] = res[i].c;
    }
    if (!rc) rc = splash_model_commit_lanes(m, slots, counts, n, err);
    free(slots);
    return rc;
}

int splash_model_snapshot(splash_model *m, int slot, void *dst) { return m->ops->snapshot(m->impl, slot, dst); }

int splash_model_restore(splash_model *m, int slot, const void *src) { return m->ops->restore(m->impl, slot, src); }

int splash_model_finish(splash_model *m) { return m->ops->finish ? m->ops->finish(m->impl) : SPLASH_OK; }

void *splash_model_device_stream(splash_model *m) {
    return m->ops->device_stream ? m->ops->device_stream(m->impl) : NULL;
}

int splash_model_use_spare(splash_model *m, size_t bytes, size_t *used, splash_error *err) {
    *used = 0;
    return m->ops->use_spare ? m->ops->use_spare(m->impl, bytes, used, err) : SPLASH_OK;
}

const void *splash_model_device_weight(splash_model *m, const void *data) {
    return m->ops->device_weight && data ? m->ops->device_weight(m->impl, data) : NULL;
}

const float *splash_model_device_taps(splash_model *m) {
    return m->ops->device_taps ? m->ops->device_taps(m->impl) : NULL;
}
