/* cpu.c - the CPU backend's context: worker pool, kernel scratch, and the
 * run-time choice between the AVX2+FMA and the scalar kernel paths.
 *
 * Scratch is sized once for the largest call (rows x widest input) so no
 * kernel allocates while a forward pass runs.
 */
#include "backend/cpu/cpu.h"
#include "backend/cpu/reduce.h"

#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "base/status.h"

static int simd_state = -1; /* -1: not decided yet */

static int simd_detect(void) {
    const char *env = getenv("SPLASH_CPU_SIMD");
    if (env && env[0] == '0') return 0;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

int cpu_simd(void) {
    int s = __atomic_load_n(&simd_state, __ATOMIC_RELAXED);
    if (s < 0) {
        s = simd_detect();
        __atomic_store_n(&simd_state, s, __ATOMIC_RELAXED);
    }
    return s;
}

void cpu_simd_set(int on) {
    int s = on < 0 ? simd_detect() : (on ? simd_detect() : 0);
    __atomic_store_n(&simd_state, s, __ATOMIC_RELAXED);
}

int cpu_ctx_init(cpu_ctx *c, int threads, int max_m, int max_cols) {
    memset(c, 0, sizeof *c);
    if (max_m < 1) max_m = 1;
    if (max_cols < SPLASH_QGROUP) max_cols = SPLASH_QGROUP;
    c->max_cols = (max_cols + SPLASH_QGROUP - 1) / SPLASH_QGROUP * SPLASH_QGROUP;
    c->max_m = max_m;
    size_t groups = (size_t)c->max_cols / SPLASH_QGROUP;
    c->xsum = splash_aligned_alloc(64, (size_t)max_m * groups * sizeof(float));
    c->act = -1;
    if (!c->xsum || cpu_set_act(c, CPU_ACT_F32)) {
        cpu_ctx_free(c);
        return SPLASH_E_NOMEM;
    }
    c->pool = splash_pool_create(threads);
    c->n_threads = splash_pool_size(c->pool);
    c->att = splash_aligned_alloc(64, (size_t)c->n_threads * CPU_ATT_SCRATCH * sizeof(float));
    if (!c->att) {
        cpu_ctx_free(c);
        return SPLASH_E_NOMEM;
    }
    cpu_simd();
    return 0;
}

static void free_act(cpu_ctx *c) {
    free(c->xp);
    free(c->xq4);
    free(c->xq8);
    free(c->xd);
    free(c->xt);
    c->xp = NULL, c->xq4 = c->xq8 = NULL, c->xd = c->xt = NULL;
}

void cpu_ctx_free(cpu_ctx *c) {
    if (!c) return;
    splash_pool_destroy(c->pool);
    free(c->xsum);
    free(c->att);
    free_act(c);
    memset(c, 0, sizeof *c);
}

static size_t act_bytes(const cpu_ctx *c, int act) {
    size_t n = (size_t)c->max_m * (size_t)c->max_cols, groups = (size_t)c->max_cols / SPLASH_QGROUP;
    if (act == CPU_ACT_F32) return n * sizeof(float);
    return 2 * n * (act == CPU_ACT_I8 ? 1 : 2) + (size_t)c->max_m * groups * 2 * sizeof(float) +
           cpu_act_transpose_floats(c->max_m, (int)groups) * sizeof(float);
}

size_t cpu_ctx_scratch_bytes(const cpu_ctx *c) {
    size_t groups = (size_t)c->max_cols / SPLASH_QGROUP;
    return (size_t)c->max_m * groups * sizeof(float) + act_bytes(c, c->act) +
           (size_t)c->n_threads * CPU_ATT_SCRATCH * sizeof(float);
}

int cpu_set_act(cpu_ctx *c, int act) {
    if (act == c->act) return 0;
    size_t n = (size_t)c->max_m * (size_t)c->max_cols, groups = (size_t)c->max_cols / SPLASH_QGROUP;
    cpu_ctx t = *c;
    t.xp = NULL, t.xq4 = t.xq8 = NULL, t.xd = t.xt = NULL;
    if (act == CPU_ACT_F32) {
        t.xp = splash_aligned_alloc(64, n * sizeof(float));
        if (!t.xp) return SPLASH_E_NOMEM;
    } else {
        size_t es = act == CPU_ACT_I8 ? 1 : 2;
        t.xq4 = splash_aligned_alloc(64, n * es);
        t.xq8 = splash_aligned_alloc(64, n * es);
        t.xd = splash_aligned_alloc(64, (size_t)c->max_m * groups * 2 * sizeof(float));
        t.xt = splash_aligned_alloc(64, (cpu_act_transpose_floats(c->max_m, (int)groups) + 1) * sizeof(float));
        if (!t.xq4 || !t.xq8 || !t.xd || !t.xt) {
            free_act(&t);
            return SPLASH_E_NOMEM;
        }
    }
    free_act(c);
    c->xp = t.xp, c->xq4 = t.xq4, c->xq8 = t.xq8, c->xd = t.xd, c->xt = t.xt;
    c->act = act;
    return 0;
}

void cpu_parallel(cpu_ctx *c, size_t n, splash_task_fn fn, void *ctx) {
    splash_pool_run(c->pool, n, fn, ctx);
}
