/* cpu.c - the CPU backend's context: worker pool, kernel scratch, and the
 * run-time choice between the AVX2+FMA and the scalar kernel paths.
 *
 * Scratch is sized once for the largest call (rows x widest input) so no
 * kernel allocates while a forward pass runs.
 */
#include "backend/cpu/cpu.h"

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
    c->pool = splash_pool_create(threads);
    c->n_threads = splash_pool_size(c->pool);
    c->max_m = max_m;
    c->max_cols = max_cols;
    size_t groups = (size_t)(max_cols + SPLASH_QGROUP - 1) / SPLASH_QGROUP;
    c->xsum = splash_aligned_alloc(64, (size_t)max_m * groups * sizeof(float));
    c->xq = splash_aligned_alloc(64, (size_t)max_m * groups * SPLASH_QGROUP * 2);
    c->xd = splash_aligned_alloc(64, (size_t)max_m * groups * sizeof(float));
    const char *act = getenv("SPLASH_CPU_ACT");
    c->act = !act ? CPU_ACT_F32 : !strcmp(act, "int8") ? CPU_ACT_I8 : !strcmp(act, "int16") ? CPU_ACT_I16 : CPU_ACT_F32;
    if (!c->xsum || !c->xq || !c->xd) {
        cpu_ctx_free(c);
        return SPLASH_E_NOMEM;
    }
    cpu_simd();
    return 0;
}

void cpu_ctx_free(cpu_ctx *c) {
    if (!c) return;
    splash_pool_destroy(c->pool);
    free(c->xsum);
    free(c->xq);
    free(c->xd);
    memset(c, 0, sizeof *c);
}

size_t cpu_ctx_scratch_bytes(const cpu_ctx *c) {
    size_t groups = (size_t)(c->max_cols + SPLASH_QGROUP - 1) / SPLASH_QGROUP;
    return (size_t)c->max_m * groups * (2 * sizeof(float) + 2 * SPLASH_QGROUP);
}

void cpu_set_act(cpu_ctx *c, int act) { c->act = act; }

void cpu_parallel(cpu_ctx *c, size_t n, splash_task_fn fn, void *ctx) {
    splash_pool_run(c->pool, n, fn, ctx);
}
