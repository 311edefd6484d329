/* test_cuda_ops.cu - every CUDA op of the Qwen3.5 models against the CPU
 * backend's reference functions (libsplash.a), at the test fixtures' shapes
 * and at the two production models' shapes.  Runs on the GPU machine
 * (tools/gpu_tests.sh).
 *
 * For each op and shape: random inputs (never zeros), outputs poisoned with
 * NaN before the GPU runs (so an unwritten element fails), the CPU reference
 * on the same inputs, and a relative L2 error ||gpu - cpu|| / ||cpu|| (in
 * double) checked against a bound written beside the case.  Ops without
 * arithmetic (KV write, argmax, routing choice) must match exactly.  Then the
 * op is timed: median of 20 launches, each between its own pair of CUDA
 * events, after 3 warm-up launches, behind a spin kernel so that host launch
 * cost is not counted (the host-driven MoE step is timed as wall time on the
 * stream instead).  Bytes moved are counted per op (inputs read once, outputs
 * written once); GB/s and the fraction of the 4.3 TB/s copy bandwidth
 * measured on the H200 (NOTES.md) follow.  Small inputs stay in the 60 MB L2
 * between launches, so their GB/s can exceed HBM; the long-context attention
 * alternates two layers of 68 MB to read from HBM.
 *
 * Prints one line per check as it goes, then the table; exits 1 if any check
 * failed.  Usage: test_cuda_ops [--quick] [--no-timing] [--moe | --gdn]
 * (--moe: the MoE steps only, the fixture's and the 35B-A3B's verify rows;
 * --gdn: the GDN ops only; --quick: the test fixtures' shapes only;
 * --no-timing: checks only, e.g. under compute-sanitizer).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "backend/cpu/cpu.h"
#include "runtime/model.h"
}
#include "backend/cuda/act.h"
#include "backend/cuda/argmax.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/attention_split.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dense_matmul.h"
#include "backend/cuda/dflash.h"
#include "backend/cuda/gdn.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/norm.h"
#include "backend/cuda/q4_matmul.h"
#include "backend/cuda/rope.h"

static const double kCopyGBs = 4300.0; /* measured device-to-device copy, H200 (NOTES.md) */
static const float kEps = 1e-6f;
static const int kTimed = 20, kWarm = 3;

static cpu_ctx g_cpu;
static int g_quick, g_notime;

/* ---- results ------------------------------------------------------------------ */

typedef struct {
    char op[28], shape[56];
    double err, bound, us, bytes;
    int pass;
} Row;
/* the table's rows (the first kMaxRows checks); every check is counted */
enum { kMaxRows = 512 };
static Row g_rows[kMaxRows];
static int g_nrows, g_nchecks, g_fail;

static void report(const char *op, const char *shape, double err, double bound, double us, double bytes) {
    const int pass = isfinite(err) && err <= bound;
    if (!pass) g_fail++;
    g_nchecks++;
    printf("%s %-22s %-44s err %.3g (bound %.3g)\n", pass ? "PASS" : "FAIL", op, shape, err, bound);
    fflush(stdout);
    if (g_nrows < kMaxRows) {
        Row *r = &g_rows[g_nrows++];
        snprintf(r->op, sizeof r->op, "%s", op);
        snprintf(r->shape, sizeof r->shape, "%s", shape);
        r->err = err, r->bound = bound, r->us = us, r->bytes = bytes, r->pass = pass;
    }
}

static void print_table(void) {
    printf("\n| op | shape | rel err | bound | pass | us | MB moved | GB/s | %% of 4.3 TB/s |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < g_nrows; i++) {
        const Row *r = &g_rows[i];
        const double gbs = r->us > 0 ? r->bytes / (r->us * 1e3) : 0;
        if (r->us > 0 && r->bytes > 0)
            printf("| %s | %s | %.2e | %.0e | %s | %.1f | %.2f | %.0f | %.1f |\n", r->op, r->shape, r->err, r->bound,
                   r->pass ? "yes" : "NO", r->us, r->bytes / 1e6, gbs, 100.0 * gbs / kCopyGBs);
        else if (r->us > 0)
            printf("| %s | %s | %.2e | %.0e | %s | %.1f | - | - | - |\n", r->op, r->shape, r->err, r->bound,
                   r->pass ? "yes" : "NO", r->us);
        else
            printf("| %s | %s | %.2e | %.0e | %s | - | - | - | - |\n", r->op, r->shape, r->err, r->bound,
                   r->pass ? "yes" : "NO");
    }
    if (g_nrows < g_nchecks) printf("(the table holds the first %d checks)\n", g_nrows);
    printf("\n%d checks, %d failed\n", g_nchecks, g_fail);
}

/* ---- random numbers (splitmix64) ------------------------------------------------ */

static uint64_t g_rng = 0x5EED5EEDull;
static inline uint64_t rng_u64(void) {
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline float rnd(float lo, float hi) { return lo + (hi - lo) * (float)((rng_u64() >> 40) * (1.0 / 16777216.0)); }
static inline float rnd_normal(void) { /* sum of 4 uniforms, unit variance */
    return (rnd(-1, 1) + rnd(-1, 1) + rnd(-1, 1) + rnd(-1, 1)) * 0.8660254f;
}
static void fill(float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = rnd(lo, hi);
}
/* Rows of varied scale: row r scaled by 2^((r % 5) - 2), so norms see
 * different magnitudes. */
static void fill_rows(float *x, int rows, size_t n) {
    for (int r = 0; r < rows; r++) {
        const float s = ldexpf(1.f, r % 5 - 2);
        for (size_t i = 0; i < n; i++) x[(size_t)r * n + i] = rnd_normal() * s;
    }
}

/* ---- memory helpers ------------------------------------------------------------ */

static void *hmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of host memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}
static float *hfloats(size_t n) { return (float *)hmalloc(n * sizeof(float)); }
static void *dmalloc(size_t n) {
    void *p;
    SPLASH_CUDA_CHECK(cudaMalloc(&p, n ? n : 1));
    return p;
}
static float *dfloats(size_t n) { return (float *)dmalloc(n * sizeof(float)); }
static void up(void *d, const void *h, size_t n) { SPLASH_CUDA_CHECK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice)); }
static void down(void *h, const void *d, size_t n) {
    SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
    SPLASH_CUDA_CHECK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
}
static float *dcopy(const float *h, size_t n) {
    float *d = dfloats(n);
    up(d, h, n * sizeof(float));
    return d;
}
static void poison(void *d, size_t bytes) { SPLASH_CUDA_CHECK(cudaMemset(d, 0xFF, bytes)); } /* NaN floats */

/* ||got - ref|| / ||ref|| in double; inf when got has a non-finite element. */
static double rel_err(const float *got, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        const double d = (double)got[i] - (double)ref[i];
        num += d * d, den += (double)ref[i] * ref[i];
    }
    if (den == 0) return num == 0 ? 0 : INFINITY;
    return sqrt(num / den);
}
static double max2(double a, double b) { return a > b ? a : b; }

/* ---- timing --------------------------------------------------------------------- */

__global__ void spin_kernel(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

static cudaEvent_t g_ev[2 * 32];

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median time of f(i) in us; f returns 0 or an error code (then -1). */
template <typename F>
static double time_us(F f, bool spin = true) {
    if (g_notime) return -1;
    for (int i = 0; i < kWarm; i++)
        if (f(i)) return -1;
    SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
    if (spin) spin_kernel<<<1, 1>>>(60000LL * kTimed); /* ~30 us a launch at ~2 GHz */
    for (int i = 0; i < kTimed; i++) {
        SPLASH_CUDA_CHECK(cudaEventRecord(g_ev[2 * i]));
        if (f(kWarm + i)) return -1;
        SPLASH_CUDA_CHECK(cudaEventRecord(g_ev[2 * i + 1]));
    }
    SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
    double t[32];
    for (int i = 0; i < kTimed; i++) {
        float ms;
        SPLASH_CUDA_CHECK(cudaEventElapsedTime(&ms, g_ev[2 * i], g_ev[2 * i + 1]));
        t[i] = ms * 1e3;
    }
    qsort(t, kTimed, sizeof(double), cmp_double);
    return t[kTimed / 2];
}

/* ---- model shapes ---------------------------------------------------------------- */

typedef struct {
    const char *name;
    int hidden;
    int heads, kv_heads, head_dim, rot_dim;
    int hk, hv, dk, dv;
    int experts, top_k, expert_inter;
} Shape;

/* tests/fixtures (README.md "Geometry"): dense-tiny and moe-tiny */
static const Shape kTiny = {"tiny", 128, 4, 2, 64, 16, 2, 6, 32, 48, 0, 0, 0};
static const Shape kTinyMoe = {"moe-tiny", 128, 4, 1, 64, 16, 2, 4, 32, 48, 8, 2, 64};
static const Shape k27B = {"27B", 5120, 24, 4, 256, 64, 16, 48, 128, 128, 0, 0, 0};
static const Shape k35B = {"35B-A3B", 2048, 16, 2, 256, 64, 16, 32, 128, 128, 256, 8, 512};
/* MoE only: top-8 of 64 small experts, so that 2,100 rows make 16,800 slots (two chunks of
 * the GEMM step, the sort past its shared-memory staging) at a CPU reference's cost */
static const Shape kMoeK8 = {"moe-k8", 128, 4, 1, 64, 16, 2, 4, 32, 48, 64, 8, 64};
/* attention only: the third head_dim the kernels compile */
static const Shape kHd128 = {"hd128", 1024, 8, 2, 128, 32, 0, 0, 0, 0, 0, 0, 0};
static const double kTheta = 1e7;

static int n_shapes(void) { return g_quick ? 2 : 4; }
static const Shape *shape_at(int i) {
    static const Shape *all[4] = {&kTiny, &kTinyMoe, &k27B, &k35B};
    return all[i];
}

/* ==== 1. norms ====================================================================== */

static void test_rmsnorm(const char *name, int n, int rows) {
    const size_t N = (size_t)rows * n;
    float *x = hfloats(N), *w = hfloats(n), *f = hfloats(n), *ref = hfloats(N), *got = hfloats(N);
    fill_rows(x, rows, n);
    for (int i = 0; i < n; i++) w[i] = rnd_normal() * 0.1f, f[i] = 1.0f + w[i];
    for (int r = 0; r < rows; r++) cpu_rmsnorm(x + (size_t)r * n, f, n, kEps, ref + (size_t)r * n);
    float *dx = dcopy(x, N), *dw = dcopy(w, n), *dy = dfloats(N);
    poison(dy, N * 4);
    int rc = splash_cuda_rmsnorm(dx, n, 0, dy, n, 0, dw, 1.0f, n, rows, 1, kEps, NULL);
    down(got, dy, N * 4);
    double err = rc ? INFINITY : rel_err(got, ref, N);
    double us = time_us([&](int) { return splash_cuda_rmsnorm(dx, n, 0, dy, n, 0, dw, 1.0f, n, rows, 1, kEps, NULL); });
    char sh[64];
    snprintf(sh, sizeof sh, "%s %d x %d", name, rows, n);
    report("rmsnorm (1+w)", sh, err, 2e-6, us, 2.0 * N * 4 + n * 4);
    free(x), free(w), free(f), free(ref), free(got);
    cudaFree(dx), cudaFree(dw), cudaFree(dy);
}

static void test_rmsnorm_gated(const Shape *s, int rows) {
    const int n = s->dv, heads = s->hv;
    const size_t N = (size_t)rows * heads * n;
    float *x = hfloats(N), *z = hfloats(N), *w = hfloats(n), *ref = hfloats(N), *got = hfloats(N);
    fill_rows(x, rows * heads, n);
    fill(z, N, -4, 4);
    for (int i = 0; i < n; i++) w[i] = 1.0f + rnd_normal() * 0.1f;
    for (size_t v = 0; v < (size_t)rows * heads; v++) cpu_rmsnorm_gated(x + v * n, w, z + v * n, n, kEps, ref + v * n);
    float *dx = dcopy(x, N), *dz = dcopy(z, N), *dw = dcopy(w, n), *dy = dfloats(N);
    poison(dy, N * 4);
    const size_t ld = (size_t)heads * n;
    auto run = [&](int) { return splash_cuda_rmsnorm_gated(dx, ld, n, dz, ld, n, dy, ld, n, dw, n, rows, heads, kEps, NULL); };
    int rc = run(0);
    down(got, dy, N * 4);
    double err = rc ? INFINITY : rel_err(got, ref, N);
    double us = time_us(run);
    char sh[64];
    snprintf(sh, sizeof sh, "%s %d rows x %d heads x %d", s->name, rows, heads, n);
    report("rmsnorm_gated", sh, err, 2e-6, us, 3.0 * N * 4);
    free(x), free(z), free(w), free(ref), free(got);
    cudaFree(dx), cudaFree(dz), cudaFree(dw), cudaFree(dy);
}

static void test_l2norm(const Shape *s, int rows) {
    const int n = s->dk, heads = s->hk;
    const size_t N = (size_t)rows * heads * n;
    const float scale = (float)pow((double)n, -0.5);
    float *x = hfloats(N), *ref = hfloats(N), *got = hfloats(N);
    fill_rows(x, rows * heads, n);
    memcpy(ref, x, N * 4);
    for (size_t v = 0; v < (size_t)rows * heads; v++) {
        cpu_l2norm(ref + v * n, n, kEps);
        for (int i = 0; i < n; i++) ref[v * n + i] *= scale;
    }
    float *dx = dcopy(x, N);
    const size_t ld = (size_t)heads * n;
    int rc = splash_cuda_l2norm(dx, ld, n, n, rows, heads, kEps, scale, NULL);
    down(got, dx, N * 4);
    double err = rc ? INFINITY : rel_err(got, ref, N);
    double us = time_us([&](int) { return splash_cuda_l2norm(dx, ld, n, n, rows, heads, kEps, 1.0f, NULL); });
    char sh[64];
    snprintf(sh, sizeof sh, "%s %d rows x %d heads x %d", s->name, rows, heads, n);
    report("l2norm (q scaled)", sh, err, 2e-6, us, 2.0 * N * 4);
    free(x), free(ref), free(got);
    cudaFree(dx);
}

/* ==== 2. rotary, q/gate de-interleave, output gate ===================================== */

static int32_t *random_positions(int rows) {
    int32_t *pos = (int32_t *)hmalloc(rows * sizeof(int32_t));
    for (int r = 0; r < rows; r++) pos[r] = r < 3 ? r : r % 3 == 0 ? 262143 - r : (int32_t)(rng_u64() % 262144);
    return pos;
}

static void test_rope(const Shape *s, int rows) {
    const int hd = s->head_dim, heads = s->heads, rot = s->rot_dim;
    const size_t N = (size_t)rows * heads * hd;
    float *x = hfloats(N), *ref = hfloats(N), *got = hfloats(N), *inv = hfloats(rot / 2);
    fill(x, N, -2, 2);
    memcpy(ref, x, N * 4);
    int32_t *pos = random_positions(rows);
    for (int r = 0; r < rows; r++) cpu_rope(ref + (size_t)r * heads * hd, heads, hd, rot, kTheta, pos[r]);
    splash_cuda_rope_inv_freq(inv, rot, kTheta);
    float *dx = dcopy(x, N), *dinv = dcopy(inv, rot / 2);
    int32_t *dpos = (int32_t *)dmalloc(rows * 4);
    up(dpos, pos, rows * 4);
    int rc = splash_cuda_rope(dx, (size_t)heads * hd, rows, heads, hd, rot, dinv, dpos, NULL);
    down(got, dx, N * 4);
    double err = rc ? INFINITY : rel_err(got, ref, N);
    double us = time_us([&](int) { return splash_cuda_rope(dx, (size_t)heads * hd, rows, heads, hd, rot, dinv, dpos, NULL); });
    char sh[64];
    snprintf(sh, sizeof sh, "%s %d rows x %d heads, rot %d/%d", s->name, rows, heads, rot, hd);
    report("rope (pos to 262143)", sh, err, 2e-6, us, 2.0 * rows * heads * rot * 4);
    free(x), free(ref), free(got), free(inv), free(pos);
    cudaFree(dx), cudaFree(dinv), cudaFree(dpos);
}

static void test_attn_prep(const Shape *s, int rows) {
    const int hd = s->head_dim, H = s->heads, KV = s->kv_heads, rot = s->rot_dim;
    const size_t nqg = (size_t)rows * H * 2 * hd, nq = (size_t)rows * H * hd, nk = (size_t)rows * KV * hd;
    float *qg = hfloats(nqg), *k = hfloats(nk), *qw = hfloats(hd), *kw = hfloats(hd), *qf = hfloats(hd),
          *kf = hfloats(hd), *inv = hfloats(rot / 2);
    float *rq = hfloats(nq), *rk = hfloats(nk), *rg = hfloats(nq), *gq = hfloats(nq), *gk = hfloats(nk),
          *gg = hfloats(nq);
    fill_rows(qg, rows, (size_t)H * 2 * hd);
    fill_rows(k, rows, (size_t)KV * hd);
    for (int i = 0; i < hd; i++) {
        qw[i] = rnd_normal() * 0.1f, kw[i] = rnd_normal() * 0.1f;
        qf[i] = 1.0f + qw[i], kf[i] = 1.0f + kw[i];
    }
    int32_t *pos = random_positions(rows);
    memcpy(rk, k, nk * 4);
    for (int r = 0; r < rows; r++) { /* as models/qwen35/attn.c prep_task */
        const float *src = qg + (size_t)r * H * 2 * hd;
        float *q = rq + (size_t)r * H * hd, *kk = rk + (size_t)r * KV * hd;
        for (int h = 0; h < H; h++) {
            cpu_rmsnorm(src + (size_t)h * 2 * hd, qf, hd, kEps, q + (size_t)h * hd);
            memcpy(rg + ((size_t)r * H + h) * hd, src + (size_t)h * 2 * hd + hd, hd * 4);
        }
        for (int h = 0; h < KV; h++) cpu_rmsnorm(kk + (size_t)h * hd, kf, hd, kEps, kk + (size_t)h * hd);
        cpu_rope(q, H, hd, rot, kTheta, pos[r]);
        cpu_rope(kk, KV, hd, rot, kTheta, pos[r]);
    }
    splash_cuda_rope_inv_freq(inv, rot, kTheta);
    float *dqg = dcopy(qg, nqg), *dk = dcopy(k, nk), *dqw = dcopy(qw, hd), *dkw = dcopy(kw, hd),
          *dinv = dcopy(inv, rot / 2), *dq = dfloats(nq), *dg = dfloats(nq);
    int32_t *dpos = (int32_t *)dmalloc(rows * 4);
    up(dpos, pos, rows * 4);
    poison(dq, nq * 4), poison(dg, nq * 4);
    splash_cuda_attn_prep_args a;
    memset(&a, 0, sizeof a);
    a.qg = dqg, a.ldqg = (size_t)H * 2 * hd, a.q = dq, a.ldq = (size_t)H * hd, a.gate = dg, a.ldg = (size_t)H * hd;
    a.k = dk, a.ldk = (size_t)KV * hd, a.q_norm = dqw, a.k_norm = dkw, a.norm_offset = 1.0f, a.eps = kEps;
    a.inv_freq = dinv, a.pos = dpos, a.rows = rows, a.heads = H, a.kv_heads = KV, a.head_dim = hd, a.rot_dim = rot;
    int rc = splash_cuda_attn_prep(&a, NULL);
    down(gq, dq, nq * 4), down(gk, dk, nk * 4), down(gg, dg, nq * 4);
    double err = rc ? INFINITY : max2(rel_err(gq, rq, nq), rel_err(gk, rk, nk));
    if (memcmp(gg, rg, nq * 4)) err = INFINITY; /* the gate is a copy */
    char sh[64];
    snprintf(sh, sizeof sh, "%s %d rows, %d/%d heads x %d", s->name, rows, H, KV, hd);
    { /* early (norm factors and rotary angles made before the programmatic wait) = plain, bitwise */
        float *eq = hfloats(nq), *ek = hfloats(nk), *eg = hfloats(nq);
        up(dk, k, nk * 4);
        poison(dq, nq * 4), poison(dg, nq * 4);
        splash_cuda_attn_prep_args e = a;
        e.early = 1;
        const int rc2 = splash_cuda_attn_prep(&e, NULL);
        down(eq, dq, nq * 4), down(ek, dk, nk * 4), down(eg, dg, nq * 4);
        report("attn_prep early = plain (exact)", sh,
               rc2 || memcmp(eq, gq, nq * 4) || memcmp(ek, gk, nk * 4) || memcmp(eg, gg, nq * 4) ? INFINITY : 0.0, 0,
               -1, 0);
        free(eq), free(ek), free(eg);
    }
    double us = time_us([&](int) { return splash_cuda_attn_prep(&a, NULL); });
    report("attn_prep (norm+rope+gate)", sh, err, 2e-6, us, (nqg + 2.0 * nk + 2.0 * nq) * 4);

    /* the DFlash draft's layout: plain q heads (qhs = head_dim) prepared in place; then k alone (heads 0) */
    float *qp = hfloats(nq);
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < H; h++)
            memcpy(qp + ((size_t)r * H + h) * hd, qg + (size_t)r * H * 2 * hd + (size_t)h * 2 * hd, hd * 4);
    float *dqp = dcopy(qp, nq);
    up(dk, k, nk * 4);
    splash_cuda_attn_prep_args b = a;
    b.qg = dqp, b.ldqg = (size_t)H * hd, b.qhs = (size_t)hd, b.q = dqp, b.gate = NULL;
    rc = splash_cuda_attn_prep(&b, NULL);
    down(gq, dqp, nq * 4), down(gk, dk, nk * 4);
    err = rc ? INFINITY : max2(rel_err(gq, rq, nq), rel_err(gk, rk, nk));
    up(dk, k, nk * 4);
    b.heads = 0, b.qg = NULL, b.q = NULL;
    rc = splash_cuda_attn_prep(&b, NULL);
    down(gk, dk, nk * 4);
    if (rc || rel_err(gk, rk, nk) > err) err = rc ? INFINITY : rel_err(gk, rk, nk);
    b.heads = H, b.qg = dqp, b.q = dqp, b.gate = dg; /* the gate needs the interleaved layout */
    if (splash_cuda_attn_prep(&b, NULL) != SPLASH_E_INVALID) err = INFINITY;
    report("attn_prep plain q in place; k only", sh, err, 2e-6, 0, 0);
    free(qp);
    cudaFree(dqp);

    /* the output gate alone: o *= sigmoid(gate) */
    float *o = hfloats(nq), *ro = hfloats(nq);
    fill(o, nq, -3, 3);
    for (size_t i = 0; i < nq; i++) ro[i] = o[i] * cpu_sigmoid(rg[i]);
    float *dO = dcopy(o, nq);
    rc = splash_cuda_sigmoid_gate(dO, (size_t)H * hd, dg, (size_t)H * hd, rows, H * hd, NULL);
    down(o, dO, nq * 4);
    err = rc ? INFINITY : rel_err(o, ro, nq);
    us = time_us([&](int) { return splash_cuda_sigmoid_gate(dO, (size_t)H * hd, dg, (size_t)H * hd, rows, H * hd, NULL); });
    report("sigmoid_gate", sh, err, 1e-6, us, 3.0 * nq * 4);

    free(qg), free(k), free(qw), free(kw), free(qf), free(kf), free(inv), free(rq), free(rk), free(rg), free(gq);
    free(gk), free(gg), free(pos), free(o), free(ro);
    cudaFree(dqg), cudaFree(dk), cudaFree(dqw), cudaFree(dkw), cudaFree(dinv), cudaFree(dq), cudaFree(dg);
    cudaFree(dpos), cudaFree(dO);
}

/* ==== 3. paged attention (int8 / bf16 / f32 pages) ====================================== */

typedef struct {
    int n_past, n_rows;
} LaneSpec;

static const int kPageTokens = 32; /* QWEN35_PAGE_TOKENS */
static const int kKvLayers = 2;    /* two layers: the checks use layer 1, long timings alternate 0 / 1 */

static int layouts_equal(const cpu_kv_layout *c, const splash_cuda_kv_layout *g) {
    return c->format == g->format && c->page_tokens == g->page_tokens && c->kv_heads == g->kv_heads &&
           c->head_dim == g->head_dim && c->n_layers == g->n_layers && c->value_size == g->value_size &&
           c->k_off == g->k_off && c->ks_off == g->ks_off && c->v_off == g->v_off && c->vs_off == g->vs_off &&
           c->layer_bytes == g->layer_bytes && c->page_bytes == g->page_bytes;
}

static const char *fmt_name(int f) { return f == SPLASH_KV_INT8 ? "int8" : f == SPLASH_KV_BF16 ? "bf16" : "f32"; }

/* A page pool shared by the CPU and GPU checks, and the lanes over it. */
typedef struct {
    cpu_kv_layout cl;
    splash_cuda_kv_layout gl;
    int n_pages, n_lanes, rows, max_lane_rows, max_ctx;
    uint8_t *pool;        /* host */
    uint8_t *dpool;       /* device */
    int32_t *pages;       /* host, all lanes' page ids back to back */
    int32_t *dpages;
    cpu_attn_lane *cl_lanes;
    splash_cuda_attn_lane *gl_lanes; /* host copy of the device array */
    splash_cuda_attn_lane *dlanes;
    double kv_bytes;      /* K/V bytes the lanes' contexts hold in one layer */
} KvSetup;

/* Random pool contents in the format's value range: int8 codes in
 * [-127, 127] with scales in [0.002, 0.02], bf16/f32 values in (-1.5, 1.5). */
static void fill_pool(uint8_t *pool, const cpu_kv_layout *l, int n_pages) {
    const size_t vals = (size_t)l->kv_heads * l->page_tokens * l->head_dim;
    const size_t nsc = (size_t)l->kv_heads * l->page_tokens;
    for (int p = 0; p < n_pages; p++)
        for (int L = 0; L < l->n_layers; L++) {
            uint8_t *base = pool + (size_t)p * l->page_bytes + (size_t)L * l->layer_bytes;
            for (int part = 0; part < 2; part++) {
                uint8_t *v = base + (part ? l->v_off : l->k_off);
                if (l->format == SPLASH_KV_INT8) {
                    for (size_t i = 0; i < vals; i += 8) {
                        const uint64_t h = rng_u64();
                        for (int j = 0; j < 8 && i + j < vals; j++)
                            ((int8_t *)v)[i + j] = (int8_t)((int)((h >> (8 * j)) & 0xFF) % 255 - 127);
                    }
                    float *sc = (float *)(base + (part ? l->vs_off : l->ks_off));
                    for (size_t i = 0; i < nsc; i++) sc[i] = rnd(0.002f, 0.02f);
                } else if (l->format == SPLASH_KV_BF16) {
                    uint16_t *d = (uint16_t *)v;
                    for (size_t i = 0; i < vals; i += 4) {
                        const uint64_t h = rng_u64();
                        for (int j = 0; j < 4 && i + j < vals; j++)
                            d[i + j] = splash_f32_to_bf16((float)(int16_t)(h >> (16 * j)) * (1.5f / 32768.f));
                    }
                } else {
                    float *d = (float *)v;
                    for (size_t i = 0; i < vals; i += 2) {
                        const uint64_t h = rng_u64();
                        for (int j = 0; j < 2 && i + j < vals; j++)
                            d[i + j] = (float)(int32_t)(h >> (32 * j)) * (1.5f / 2147483648.f);
                    }
                }
            }
        }
}

static void kv_setup(KvSetup *k, const Shape *s, int format, const LaneSpec *ls, int nl) {
    memset(k, 0, sizeof *k);
    if (cpu_kv_layout_init(&k->cl, format, kKvLayers, s->kv_heads, s->head_dim, kPageTokens) ||
        splash_cuda_kv_layout_init(&k->gl, format, kKvLayers, s->kv_heads, s->head_dim, kPageTokens)) {
        fprintf(stderr, "kv layout init failed\n");
        exit(1);
    }
    k->n_lanes = nl;
    int total_pages = 0;
    for (int i = 0; i < nl; i++) {
        total_pages += (ls[i].n_past + ls[i].n_rows + kPageTokens - 1) / kPageTokens;
        k->rows += ls[i].n_rows;
        if (ls[i].n_rows > k->max_lane_rows) k->max_lane_rows = ls[i].n_rows;
        if (ls[i].n_past + ls[i].n_rows > k->max_ctx) k->max_ctx = ls[i].n_past + ls[i].n_rows;
        k->kv_bytes += (double)(ls[i].n_past + ls[i].n_rows) * s->kv_heads *
                       (2.0 * s->head_dim * k->cl.value_size + (format == SPLASH_KV_INT8 ? 8 : 0));
    }
    k->n_pages = total_pages + 3;
    /* page ids: a random permutation, so a lane's pages are scattered */
    int32_t *perm = (int32_t *)hmalloc(k->n_pages * sizeof(int32_t));
    for (int i = 0; i < k->n_pages; i++) perm[i] = i;
    for (int i = k->n_pages - 1; i > 0; i--) {
        const int j = (int)(rng_u64() % (uint64_t)(i + 1));
        const int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    k->pages = perm;
    k->dpages = (int32_t *)dmalloc(k->n_pages * sizeof(int32_t));
    up(k->dpages, perm, k->n_pages * sizeof(int32_t));
    k->cl_lanes = (cpu_attn_lane *)hmalloc(nl * sizeof(cpu_attn_lane));
    k->gl_lanes = (splash_cuda_attn_lane *)hmalloc(nl * sizeof(splash_cuda_attn_lane));
    int off = 0, row = 0;
    for (int i = 0; i < nl; i++) {
        k->cl_lanes[i].pages = perm + off;
        k->cl_lanes[i].n_past = ls[i].n_past;
        k->cl_lanes[i].first_row = row;
        k->cl_lanes[i].n_rows = ls[i].n_rows;
        k->gl_lanes[i].pages = k->dpages + off;
        k->gl_lanes[i].n_past = ls[i].n_past;
        k->gl_lanes[i].first_row = row;
        k->gl_lanes[i].n_rows = ls[i].n_rows;
        k->gl_lanes[i].reserved = 0;
        off += (ls[i].n_past + ls[i].n_rows + kPageTokens - 1) / kPageTokens;
        row += ls[i].n_rows;
    }
    k->dlanes = (splash_cuda_attn_lane *)dmalloc(nl * sizeof(splash_cuda_attn_lane));
    up(k->dlanes, k->gl_lanes, nl * sizeof(splash_cuda_attn_lane));
    const size_t pb = (size_t)k->n_pages * k->cl.page_bytes;
    k->pool = (uint8_t *)hmalloc(pb);
    memset(k->pool, 0, pb);
    fill_pool(k->pool, &k->cl, k->n_pages);
    k->dpool = (uint8_t *)dmalloc(pb);
    up(k->dpool, k->pool, pb);
}

static void kv_free(KvSetup *k) {
    free(k->pool), free(k->pages), free(k->cl_lanes), free(k->gl_lanes);
    cudaFree(k->dpool), cudaFree(k->dpages), cudaFree(k->dlanes);
}

static void lanes_str(char *buf, size_t n, const char *name, int format, const LaneSpec *ls, int nl) {
    int o = snprintf(buf, n, "%s %s", name, fmt_name(format));
    for (int i = 0; i < nl && o < (int)n; i++)
        o += snprintf(buf + o, n - (size_t)o, "%s%d+%d", i ? "," : " ", ls[i].n_past, ls[i].n_rows);
}

static void test_kv_write(const Shape *s, int format, const LaneSpec *ls, int nl) {
    KvSetup k;
    kv_setup(&k, s, format, ls, nl);
    char sh[64];
    lanes_str(sh, sizeof sh, s->name, format, ls, nl);
    const int w = s->kv_heads * s->head_dim;
    const size_t N = (size_t)k.rows * w;
    float *kk = hfloats(N), *vv = hfloats(N);
    fill_rows(kk, k.rows, w);
    fill_rows(vv, k.rows, w);
    for (int i = 0; i < s->head_dim; i++) vv[i] = 0.f; /* one all-zero head row: scale 0, codes 0 */
    float *dk = dcopy(kk, N), *dv = dcopy(vv, N);
    const size_t pb = (size_t)k.n_pages * k.cl.page_bytes;
    uint8_t *got = (uint8_t *)hmalloc(pb), *before = (uint8_t *)hmalloc(pb);
    memcpy(before, k.pool, pb); /* the pool as kv_setup uploaded it */
    cpu_kv_write(&g_cpu, &k.cl, k.pool, 1, k.cl_lanes, nl, kk, w, vv, w);
    double err = 0;
    for (int early = 0; early < 2; early++) { /* lanes and pages read after the programmatic wait, then before */
        if (early) up(k.dpool, before, pb);
        int rc = splash_cuda_kv_write(&k.gl, k.dpool, 1, k.dlanes, nl, k.rows, dk, w, dv, w, early, NULL);
        down(got, k.dpool, pb);
        size_t diff = 0;
        for (size_t i = 0; i < pb; i++) diff += got[i] != k.pool[i];
        err = max2(err, rc || !layouts_equal(&k.cl, &k.gl) ? INFINITY : (double)diff);
    }
    double us = time_us([&](int) { return splash_cuda_kv_write(&k.gl, k.dpool, 1, k.dlanes, nl, k.rows, dk, w, dv, w, 0, NULL); });
    const double stored = (double)k.rows * s->kv_heads * (2.0 * s->head_dim * k.cl.value_size + (format == SPLASH_KV_INT8 ? 8 : 0));
    report("kv_write, plain and early (bytes differ)", sh, err, 0, us, 2.0 * N * 4 + stored);
    free(kk), free(vv), free(got), free(before);
    cudaFree(dk), cudaFree(dv);
    kv_free(&k);
}

/* The flash kernel's bound (bulk prefill rows over int8 pages: P in fp16). */
static const double kFlashBound = 1e-3;

/* Whether any lane of the call a, run alone, gives its rows other bits
 * than got (the batch's outputs; dO the call's output buffer, poisoned
 * before each run).  min_lane_rows known here (the batch's may be 0: not
 * known), so a lane's call runs only its own layout's kernel, as the
 * model's calls do. */
static int lanes_alone_differ(const splash_cuda_attn_args &a, const KvSetup &k, const LaneSpec *ls, int nl,
                              const float *got, float *dO, size_t N, int w) {
    float *alone = hfloats(N);
    int bad = 0;
    for (int i = 0; i < nl && !bad; i++) {
        splash_cuda_attn_args b = a;
        b.lanes = k.dlanes + i, b.n_lanes = 1, b.layer = 1; /* the batch result's layer (time_us alternates) */
        b.min_lane_rows = b.max_lane_rows = ls[i].n_rows, b.max_ctx = ls[i].n_past + ls[i].n_rows;
        poison(dO, N * 4);
        bad |= splash_cuda_attention(&b, NULL) != 0;
        down(alone, dO, N * 4);
        const size_t r0 = (size_t)k.gl_lanes[i].first_row * w, nr = (size_t)ls[i].n_rows * w;
        bad |= memcmp(alone + r0, got + r0, nr * 4) != 0;
    }
    free(alone);
    return bad;
}

/* Causal GQA attention over the pool vs cpu_attention (+ the output gate). */
static void test_attention(const Shape *s, int format, const LaneSpec *ls, int nl, int use_gate, double bound,
                           int alternate_layers) {
    KvSetup k;
    kv_setup(&k, s, format, ls, nl);
    char sh[64];
    lanes_str(sh, sizeof sh, s->name, format, ls, nl);
    const int hd = s->head_dim, H = s->heads, w = H * hd;
    const size_t N = (size_t)k.rows * w;
    const float scale = (float)pow((double)hd, -0.5);
    float *q = hfloats(N), *gate = hfloats(N), *ref = hfloats(N), *got = hfloats(N);
    fill(q, N, -1.5f, 1.5f);
    fill(gate, N, -4, 4);
    const size_t stride = (size_t)k.max_ctx;
    float *scores = hfloats((size_t)g_cpu.n_threads * stride);
    cpu_attention(&g_cpu, &k.cl, k.pool, 1, k.cl_lanes, nl, H, q, w, ref, w, scale, scores, stride);
    if (use_gate)
        for (size_t i = 0; i < N; i++) ref[i] = ref[i] * cpu_sigmoid(gate[i]);
    float *dq = dcopy(q, N), *dg = dcopy(gate, N), *dO = dfloats(N);
    const size_t wsb = splash_cuda_attn_workspace_bytes(k.rows, H, hd, k.max_ctx, 0);
    void *ws = dmalloc(wsb); /* >= the long split's */
    poison(dO, N * 4);
    splash_cuda_attn_args a;
    memset(&a, 0, sizeof a);
    a.layout = &k.gl, a.pool = k.dpool, a.layer = 1, a.lanes = k.dlanes, a.n_lanes = nl, a.rows = k.rows;
    a.max_lane_rows = k.max_lane_rows, a.max_ctx = k.max_ctx, a.n_heads = H, a.q = dq, a.ldq = w;
    a.gate = use_gate ? dg : NULL, a.ldg = w, a.out = dO, a.ldo = w, a.scale = scale;
    a.workspace = ws, a.workspace_bytes = wsb;
    int rc = splash_cuda_attention(&a, NULL);
    down(got, dO, N * 4);
    double err = rc ? INFINITY : rel_err(got, ref, N);
    double us = time_us([&](int i) {
        a.layer = alternate_layers ? i & 1 : 1;
        return splash_cuda_attention(&a, NULL);
    });
    char op[64];
    snprintf(op, sizeof op, "attention%s", use_gate ? " (+gate)" : "");
    report(op, sh, err, bound, us, k.kv_bytes + (use_gate ? 3.0 : 2.0) * N * 4);
    if (format == SPLASH_KV_INT8 && nl > 1) {
        /* each lane alone gives its rows the same bits as the batch (the int8
         * kernel's layout and stage buffers follow the launch's lanes, its
         * arithmetic only the lane's own: attention_int8.cu) */
        const int bad = lanes_alone_differ(a, k, ls, nl, got, dO, N, w);
        snprintf(op, sizeof op, "attention%s: lane alone = in batch (bits)", use_gate ? " (+gate)" : "");
        report(op, sh, bad ? INFINITY : 0.0, 0, -1, 0);
    }
    /* a at another split: its error against ref (its outputs in got), then its time */
    auto at_split = [&](int split) {
        a.split = split, a.layer = 1;
        poison(dO, N * 4);
        rc = splash_cuda_attention(&a, NULL);
        down(got, dO, N * 4);
        err = rc ? INFINITY : rel_err(got, ref, N);
        us = time_us([&](int i) {
            a.layer = alternate_layers ? i & 1 : 1;
            return splash_cuda_attention(&a, NULL);
        });
    };
    /* the long split of bulk-prefill rows: the same bound, its own timing */
    at_split(SPLASH_CUDA_ATTN_SPLIT_LONG);
    /* 4x the bound: a split sums up to 4,096 positions in one fp32 chain, not
     * 128 (measured 9.95e-6 against 3.27e-6 at a 32K context); int8 pages take
     * the flash kernel, fp16 grade (P in fp16: ~2e-4, attention_int8_flash.cu) */
    const int flash = format == SPLASH_KV_INT8 && splash_cuda_attn_flash();
    snprintf(op, sizeof op, "attention%s, long split%s", use_gate ? " (+gate)" : "", flash ? " (flash)" : "");
    report(op, sh, err, flash ? kFlashBound : 4 * bound, us, k.kv_bytes + (use_gate ? 3.0 : 2.0) * N * 4);
    if (flash) {
        if (nl > 1) { /* each lane alone at the long split: the batch's bits (a flash block holds one lane's vectors) */
            const int bad = lanes_alone_differ(a, k, ls, nl, got, dO, N, w);
            snprintf(op, sizeof op, "attention%s, long split: lane alone (bits)", use_gate ? " (+gate)" : "");
            report(op, sh, bad ? INFINITY : 0.0, 0, -1, 0);
        }
        /* the longer splits bulk lanes take (splash_cuda_attn_bulk_split):
         * twice the long split, and one split holding every context, which
         * writes its outputs from the split blocks with no workspace at all */
        const int whole = (k.max_ctx + SPLASH_CUDA_ATTN_SPLIT_LONG - 1) / SPLASH_CUDA_ATTN_SPLIT_LONG *
                          SPLASH_CUDA_ATTN_SPLIT_LONG;
        const int splits[2] = {2 * SPLASH_CUDA_ATTN_SPLIT_LONG, whole};
        for (int v = 0; v < 2; v++) {
            if (v == 0 && splits[0] >= k.max_ctx) continue; /* one split: the second case */
            a.workspace_bytes = v ? 0 : wsb;
            at_split(splits[v]);
            snprintf(op, sizeof op, "attention%s, split %d%s", use_gate ? " (+gate)" : "", splits[v],
                     v ? " (no workspace)" : "");
            report(op, sh, err, kFlashBound, us, k.kv_bytes + (use_gate ? 3.0 : 2.0) * N * 4);
        }
        a.workspace_bytes = wsb;
    }
    free(q), free(gate), free(ref), free(got), free(scores);
    cudaFree(dq), cudaFree(dg), cudaFree(dO), cudaFree(ws);
    kv_free(&k);
}

/* ==== 4. Gated DeltaNet ================================================================= */

typedef struct {
    int n_rows, update; /* update: 1 conv state advances / state written in place; 0 verify, the state to a
                           scratch copy; 2 verify, the state not kept (s_out NULL) */
} GdnLaneSpec;

static const int kConvK = 4;

static void test_gdn_conv(const Shape *s, const GdnLaneSpec *ls, int nl) {
    const int C = 2 * s->hk * s->dk + s->hv * s->dv, K = kConvK;
    int R = 0, maxr = 0;
    for (int i = 0; i < nl; i++) R += ls[i].n_rows, maxr = ls[i].n_rows > maxr ? ls[i].n_rows : maxr;
    const size_t N = (size_t)R * C, NS = (size_t)nl * (K - 1) * C;
    float *wT = hfloats((size_t)K * C), *x = hfloats(N), *st = hfloats(NS), *rst = hfloats(NS), *ref = hfloats(N),
          *got = hfloats(N), *gst = hfloats(NS);
    fill(wT, (size_t)K * C, -0.6f, 0.6f);
    fill_rows(x, R, C);
    fill(st, NS, -2, 2);
    memcpy(rst, st, NS * 4);
    splash_cuda_gdn_lane *gl = (splash_cuda_gdn_lane *)hmalloc(nl * sizeof *gl);
    float *dwT = dcopy(wT, (size_t)K * C), *dx = dcopy(x, N), *dst = dcopy(st, NS), *dy = dfloats(N);
    int row = 0;
    for (int i = 0; i < nl; i++) {
        float *cs = rst + (size_t)i * (K - 1) * C;
        cpu_gdn_conv(wT, C, K, cs, ls[i].update, x + (size_t)row * C, C, ls[i].n_rows, ref + (size_t)row * C, C, 0, C);
        memset(&gl[i], 0, sizeof gl[i]);
        gl[i].conv_state = dst + (size_t)i * (K - 1) * C;
        gl[i].first_row = row, gl[i].n_rows = ls[i].n_rows, gl[i].update_conv = ls[i].update;
        row += ls[i].n_rows;
    }
    splash_cuda_gdn_lane *dl = (splash_cuda_gdn_lane *)dmalloc(nl * sizeof *gl);
    up(dl, gl, nl * sizeof *gl);
    poison(dy, N * 4);
    int rc = splash_cuda_gdn_conv(dwT, C, K, dl, nl, maxr, dx, C, dy, C, 0, NULL);
    down(got, dy, N * 4);
    down(gst, dst, NS * 4);
    double err = rc ? INFINITY : max2(rel_err(got, ref, N), rel_err(gst, rst, NS));
    char sh[64];
    int o = snprintf(sh, sizeof sh, "%s C=%d rows", s->name, C);
    for (int i = 0; i < nl && o < (int)sizeof sh; i++)
        o += snprintf(sh + o, sizeof sh - (size_t)o, "%s%d%s", i ? "," : " ", ls[i].n_rows,
                      ls[i].update == 1 ? "" : ls[i].update ? "v-" : "v");
    /* early (lanes, taps and states read before the programmatic wait; up to 16 rows a
     * lane its own kernel) = plain, outputs and states to the bit */
    {
        float *got2 = (float *)malloc(N * 4), *gst2 = (float *)malloc(NS * 4);
        up(dst, st, NS * 4);
        poison(dy, N * 4);
        int rc2 = splash_cuda_gdn_conv(dwT, C, K, dl, nl, maxr, dx, C, dy, C, 1, NULL);
        down(got2, dy, N * 4);
        down(gst2, dst, NS * 4);
        report("gdn_conv early = plain (exact)", sh,
               rc2 || memcmp(got2, got, N * 4) || memcmp(gst2, gst, NS * 4) ? INFINITY : 0.0, 0, -1, 0);
        free(got2), free(gst2);
    }
    double us = time_us([&](int) { return splash_cuda_gdn_conv(dwT, C, K, dl, nl, maxr, dx, C, dy, C, 0, NULL); });
    report("gdn_conv (+state)", sh, err, 2e-6, us, 2.0 * N * 4 + 2.0 * NS * 4 + (double)K * C * 4);
    double us_early =
        time_us([&](int) { return splash_cuda_gdn_conv(dwT, C, K, dl, nl, maxr, dx, C, dy, C, 1, NULL); });
    report("gdn_conv early (+state)", sh, err, 2e-6, us_early, 2.0 * N * 4 + 2.0 * NS * 4 + (double)K * C * 4);

    /* y = NULL: the state update alone (commit), every lane advancing */
    up(dst, st, NS * 4);
    memcpy(rst, st, NS * 4);
    row = 0;
    for (int i = 0; i < nl; i++) {
        cpu_gdn_conv_advance(rst + (size_t)i * (K - 1) * C, C, K, x + (size_t)row * C, C, ls[i].n_rows, 0, C);
        gl[i].update_conv = 1;
        row += ls[i].n_rows;
    }
    up(dl, gl, nl * sizeof *gl);
    rc = splash_cuda_gdn_conv(dwT, C, K, dl, nl, maxr, dx, C, NULL, 0, 0, NULL);
    down(gst, dst, NS * 4);
    err = rc ? INFINITY : (memcmp(gst, rst, NS * 4) ? INFINITY : 0.0);
    report("gdn_conv_advance (exact)", sh, err, 0, -1, 0);
    up(dst, st, NS * 4); /* the same with early loads */
    rc = splash_cuda_gdn_conv(dwT, C, K, dl, nl, maxr, dx, C, NULL, 0, 1, NULL);
    down(gst, dst, NS * 4);
    err = rc ? INFINITY : (memcmp(gst, rst, NS * 4) ? INFINITY : 0.0);
    report("gdn_conv_advance early (exact)", sh, err, 0, -1, 0);
    free(wT), free(x), free(st), free(rst), free(ref), free(got), free(gst), free(gl);
    cudaFree(dwT), cudaFree(dx), cudaFree(dst), cudaFree(dy), cudaFree(dl);
}

static void test_gdn_gates(const Shape *s, int rows) {
    const int hv = s->hv;
    const size_t N = (size_t)rows * hv;
    float *a = hfloats(N), *b = hfloats(N), *na = hfloats(hv), *dt = hfloats(hv), *rg = hfloats(N), *rb = hfloats(N),
          *gg = hfloats(N), *gb = hfloats(N);
    fill(a, N, -6, 6);
    fill(b, N, -6, 6);
    a[0] = 30.f; /* past softplus's threshold */
    for (int h = 0; h < hv; h++) na[h] = -expf(logf(rnd(0.05f, 1.f))), dt[h] = rnd_normal();
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < hv; h++) {
            const size_t i = (size_t)r * hv + h;
            rb[i] = cpu_sigmoid(b[i]);
            rg[i] = na[h] * cpu_softplus(a[i] + dt[h]);
        }
    float *da = dcopy(a, N), *db = dcopy(b, N), *dna = dcopy(na, hv), *ddt = dcopy(dt, hv), *dg = dfloats(N),
          *dbeta = dfloats(N);
    poison(dg, N * 4), poison(dbeta, N * 4);
    int rc = splash_cuda_gdn_gates(da, db, hv, dna, ddt, rows, hv, dg, dbeta, hv, NULL);
    down(gg, dg, N * 4), down(gb, dbeta, N * 4);
    double err = rc ? INFINITY : max2(rel_err(gg, rg, N), rel_err(gb, rb, N));
    double us = time_us([&](int) { return splash_cuda_gdn_gates(da, db, hv, dna, ddt, rows, hv, dg, dbeta, hv, NULL); });
    char sh[64];
    snprintf(sh, sizeof sh, "%s %d rows x %d heads", s->name, rows, hv);
    report("gdn_gates", sh, err, 1e-6, us, 4.0 * N * 4);
    free(a), free(b), free(na), free(dt), free(rg), free(rb), free(gg), free(gb);
    cudaFree(da), cudaFree(db), cudaFree(dna), cudaFree(ddt), cudaFree(dg), cudaFree(dbeta);
}

/* Inputs of a GDN layer's recurrence for R rows. */
typedef struct {
    int R, conv_dim, vd;
    float *mixed, *a, *b, *na, *dt, *z, *nw; /* host */
    float *dmixed, *da, *db, *dna, *ddt, *dz, *dnw;
} GdnIn;

static void gdn_in_make(GdnIn *g, const Shape *s, int R) {
    g->R = R;
    g->conv_dim = 2 * s->hk * s->dk + s->hv * s->dv;
    g->vd = s->hv * s->dv;
    const size_t NM = (size_t)R * g->conv_dim, NH = (size_t)R * s->hv, NV = (size_t)R * g->vd;
    g->mixed = hfloats(NM), g->a = hfloats(NH), g->b = hfloats(NH), g->z = hfloats(NV);
    g->na = hfloats(s->hv), g->dt = hfloats(s->hv), g->nw = hfloats(s->dv);
    fill(g->mixed, NM, -1.2f, 1.2f);
    fill(g->a, NH, -4, 4);
    fill(g->b, NH, -4, 4);
    fill(g->z, NV, -3, 3);
    for (int h = 0; h < s->hv; h++) g->na[h] = -expf(logf(rnd(0.05f, 1.f))), g->dt[h] = rnd_normal();
    for (int i = 0; i < s->dv; i++) g->nw[i] = 1.0f + 0.1f * rnd_normal();
    g->dmixed = dcopy(g->mixed, NM), g->da = dcopy(g->a, NH), g->db = dcopy(g->b, NH), g->dz = dcopy(g->z, NV);
    g->dna = dcopy(g->na, s->hv), g->ddt = dcopy(g->dt, s->hv), g->dnw = dcopy(g->nw, s->dv);
}

static void gdn_in_free(GdnIn *g) {
    free(g->mixed), free(g->a), free(g->b), free(g->z), free(g->na), free(g->dt), free(g->nw);
    cudaFree(g->dmixed), cudaFree(g->da), cudaFree(g->db), cudaFree(g->dz), cudaFree(g->dna), cudaFree(g->ddt);
    cudaFree(g->dnw);
}

/* The CPU reference of one lane, as models/qwen35/gdn.c: Sin -> S over the
 * rows, o and the gated norm y. */
static void cpu_gdn_lane(const Shape *s, const GdnIn *g, int first, int n, const float *Sin, float *S, float *o,
                         float *y) {
    const int dk = s->dk, dv = s->dv, per = s->hv / s->hk;
    const size_t hs = (size_t)dk * dv, kd = (size_t)s->hk * dk;
    const float qscale = (float)pow((double)dk, -0.5);
    float *q = hfloats(dk), *k = hfloats(dk);
    for (int h = 0; h < s->hv; h++) {
        const int kh = h / per;
        for (int t = 0; t < n; t++) {
            const size_t r = (size_t)first + t;
            const float *row = g->mixed + r * g->conv_dim;
            memcpy(q, row + (size_t)kh * dk, dk * 4);
            memcpy(k, row + kd + (size_t)kh * dk, dk * 4);
            cpu_l2norm(q, dk, 1e-6f);
            cpu_l2norm(k, dk, 1e-6f);
            for (int i = 0; i < dk; i++) q[i] *= qscale;
            const float beta = cpu_sigmoid(g->b[r * s->hv + h]);
            const float gg = g->na[h] * cpu_softplus(g->a[r * s->hv + h] + g->dt[h]);
            cpu_gdn_step_from(t ? S + h * hs : Sin + h * hs, S + h * hs, dk, dv, q, k, row + 2 * kd + (size_t)h * dv, gg,
                              beta, o + r * g->vd + (size_t)h * dv);
        }
    }
    for (int t = 0; t < n; t++)
        for (int h = 0; h < s->hv; h++) {
            const size_t p = ((size_t)first + t) * g->vd + (size_t)h * dv;
            cpu_rmsnorm_gated(o + p, g->nw, g->z + p, dv, kEps, y + p);
        }
    free(q), free(k);
}

static void test_gdn_recurrent(const Shape *s, const GdnLaneSpec *ls, int nl) {
    int R = 0;
    for (int i = 0; i < nl; i++) R += ls[i].n_rows;
    GdnIn g;
    gdn_in_make(&g, s, R);
    const size_t hs_all = (size_t)s->hv * s->dk * s->dv, NV = (size_t)R * g.vd;
    float *slots = hfloats(nl * hs_all), *rslots = hfloats(nl * hs_all), *rscratch = hfloats(nl * hs_all);
    float *ro = hfloats(NV), *ry = hfloats(NV), *go = hfloats(NV), *gy = hfloats(NV);
    float *gslots = hfloats(nl * hs_all), *gscratch = hfloats(nl * hs_all);
    fill(slots, nl * hs_all, -0.5f, 0.5f);
    memcpy(rslots, slots, nl * hs_all * 4);
    float *dslots = dcopy(slots, nl * hs_all), *dscratch = dfloats(nl * hs_all), *dO = dfloats(NV), *dY = dfloats(NV);
    poison(dscratch, nl * hs_all * 4), poison(dO, NV * 4), poison(dY, NV * 4);
    splash_cuda_gdn_lane *gl = (splash_cuda_gdn_lane *)hmalloc(nl * sizeof *gl);
    int row = 0;
    for (int i = 0; i < nl; i++) {
        float *slot = rslots + i * hs_all;
        if (ls[i].update == 1) cpu_gdn_lane(s, &g, row, ls[i].n_rows, slot, slot, ro, ry);
        else cpu_gdn_lane(s, &g, row, ls[i].n_rows, slot, rscratch + i * hs_all, ro, ry);
        memset(&gl[i], 0, sizeof gl[i]);
        gl[i].s_in = dslots + i * hs_all;
        gl[i].s_out = ls[i].update == 1 ? dslots + i * hs_all : ls[i].update ? NULL : dscratch + i * hs_all;
        gl[i].first_row = row, gl[i].n_rows = ls[i].n_rows;
        row += ls[i].n_rows;
    }
    splash_cuda_gdn_lane *dl = (splash_cuda_gdn_lane *)dmalloc(nl * sizeof *gl);
    up(dl, gl, nl * sizeof *gl);
    splash_cuda_gdn_args a;
    memset(&a, 0, sizeof a);
    a.lanes = dl, a.n_lanes = nl, a.hk = s->hk, a.hv = s->hv, a.dk = s->dk, a.dv = s->dv;
    a.mixed = g.dmixed, a.ldm = g.conv_dim, a.a = g.da, a.b = g.db, a.ldab = s->hv, a.neg_a = g.dna, a.dt_bias = g.ddt;
    a.o = dO, a.ldo = g.vd, a.z = g.dz, a.ldz = g.vd, a.norm_w = g.dnw, a.y = dY, a.ldy = g.vd, a.eps = kEps;
    int rc = splash_cuda_gdn_recurrent(&a, NULL);
    down(go, dO, NV * 4), down(gy, dY, NV * 4);
    down(gslots, dslots, nl * hs_all * 4), down(gscratch, dscratch, nl * hs_all * 4);
    double err = rc ? INFINITY : max2(rel_err(go, ro, NV), rel_err(gy, ry, NV));
    double serr = 0;
    for (int i = 0; i < nl; i++) {
        if (ls[i].update == 1) serr = max2(serr, rel_err(gslots + i * hs_all, rslots + i * hs_all, hs_all));
        else {
            if (!ls[i].update) serr = max2(serr, rel_err(gscratch + i * hs_all, rscratch + i * hs_all, hs_all));
            if (memcmp(gslots + i * hs_all, slots + i * hs_all, hs_all * 4)) serr = INFINITY; /* verify: slot untouched */
        }
    }
    char sh[64];
    int o = snprintf(sh, sizeof sh, "%s %d/%d x %d/%d rows", s->name, s->hk, s->hv, s->dk, s->dv);
    for (int i = 0; i < nl && o < (int)sizeof sh; i++)
        o += snprintf(sh + o, sizeof sh - (size_t)o, "%s%d%s", i ? "," : " ", ls[i].n_rows,
                      ls[i].update == 1 ? "" : ls[i].update ? "v-" : "v");
    report("gdn_recurrent o, y", sh, err, 1e-5, -1, 0);
    report("gdn_recurrent state", sh, serr, 1e-5, -1, 0);

    /* early (the lanes, states and weights read before the programmatic
     * wait): the same bits, states and untouched slots included */
    up(dslots, slots, nl * hs_all * 4);
    poison(dscratch, nl * hs_all * 4), poison(dO, NV * 4), poison(dY, NV * 4);
    float *eo = hfloats(NV), *ey = hfloats(NV), *es = hfloats(nl * hs_all), *esc = hfloats(nl * hs_all);
    a.early = 1;
    rc = splash_cuda_gdn_recurrent(&a, NULL);
    a.early = 0;
    down(eo, dO, NV * 4), down(ey, dY, NV * 4), down(es, dslots, nl * hs_all * 4), down(esc, dscratch, nl * hs_all * 4);
    const int esame = !rc && !memcmp(eo, go, NV * 4) && !memcmp(ey, gy, NV * 4) && !memcmp(es, gslots, nl * hs_all * 4) &&
                      !memcmp(esc, gscratch, nl * hs_all * 4);
    report("gdn_recurrent early = plain", sh, esame ? 0 : INFINITY, 0, -1, 0);
    free(eo), free(ey), free(es), free(esc);

    /* Timing: one lane of 1 row (decode) and of 16 rows (verify), the state
     * in place, rotating over enough state copies to exceed L2. */
    const int nbuf = (int)(96e6 / (hs_all * 4.0)) + 1;
    float *dbig = dfloats(nbuf * hs_all);
    SPLASH_CUDA_CHECK(cudaMemset(dbig, 0x3C, nbuf * hs_all * 4)); /* every float 0.0115 */
    splash_cuda_gdn_lane *tl = (splash_cuda_gdn_lane *)hmalloc(nbuf * sizeof *tl);
    for (int i = 0; i < nbuf; i++) {
        memset(&tl[i], 0, sizeof tl[i]);
        tl[i].s_in = tl[i].s_out = dbig + i * hs_all;
        tl[i].first_row = 0;
    }
    splash_cuda_gdn_lane *dtl = (splash_cuda_gdn_lane *)dmalloc(nbuf * sizeof *tl);
    const int trows[2] = {1, 16 < R ? 16 : R};
    for (int v = 0; v < 2; v++) {
        for (int i = 0; i < nbuf; i++) tl[i].n_rows = trows[v];
        up(dtl, tl, nbuf * sizeof *tl);
        splash_cuda_gdn_args b = a;
        b.n_lanes = 1;
        double us = time_us([&](int i) {
            b.lanes = dtl + i % nbuf;
            return splash_cuda_gdn_recurrent(&b, NULL);
        });
        char sh2[64];
        snprintf(sh2, sizeof sh2, "%s 1 lane x %d row%s, state rotated", s->name, trows[v], trows[v] > 1 ? "s" : "");
        const double bytes = 2.0 * hs_all * 4 + trows[v] * ((double)g.conv_dim + 2.0 * s->hv + 3.0 * g.vd) * 4;
        report("gdn_recurrent (timing)", sh2, 0, 0, us, bytes);
    }
    free(slots), free(rslots), free(rscratch), free(ro), free(ry), free(go), free(gy), free(gslots), free(gscratch);
    free(gl), free(tl);
    cudaFree(dslots), cudaFree(dscratch), cudaFree(dO), cudaFree(dY), cudaFree(dl), cudaFree(dbig), cudaFree(dtl);
    gdn_in_free(&g);
}

/* The chunked form (prefill) against cpu_gdn_chunked on the same inputs, and
 * against the GPU recurrence; then both timed on one long lane. */
static void test_gdn_chunked(const Shape *s, const int *lane_rows, int nl, int timing_rows) {
    int R = 0;
    for (int i = 0; i < nl; i++) R += lane_rows[i];
    GdnIn g;
    gdn_in_make(&g, s, R);
    const int dk = s->dk, dv = s->dv, hv = s->hv, per = hv / s->hk;
    const size_t hs = (size_t)dk * dv, hs_all = hs * hv, NV = (size_t)R * g.vd, kd = (size_t)s->hk * dk;
    /* CPU: normalised q, k, the gates, then cpu_gdn_chunked per (lane, head) */
    float *qn = hfloats((size_t)R * kd), *kn = hfloats((size_t)R * kd), *gg = hfloats((size_t)R * hv),
          *gb = hfloats((size_t)R * hv);
    const float qscale = (float)pow((double)dk, -0.5);
    for (int r = 0; r < R; r++) {
        const float *row = g.mixed + (size_t)r * g.conv_dim;
        memcpy(qn + (size_t)r * kd, row, kd * 4);
        memcpy(kn + (size_t)r * kd, row + kd, kd * 4);
        for (int kh = 0; kh < s->hk; kh++) {
            float *q = qn + (size_t)r * kd + (size_t)kh * dk, *k = kn + (size_t)r * kd + (size_t)kh * dk;
            cpu_l2norm(q, dk, 1e-6f);
            cpu_l2norm(k, dk, 1e-6f);
            for (int i = 0; i < dk; i++) q[i] *= qscale;
        }
        for (int h = 0; h < hv; h++) {
            gb[(size_t)r * hv + h] = cpu_sigmoid(g.b[(size_t)r * hv + h]);
            gg[(size_t)r * hv + h] = g.na[h] * cpu_softplus(g.a[(size_t)r * hv + h] + g.dt[h]);
        }
    }
    float *slots = hfloats(nl * hs_all), *rslots = hfloats(nl * hs_all), *ro = hfloats(NV), *ry = hfloats(NV);
    float *scratch = hfloats(cpu_gdn_chunk_scratch(dk, dv));
    fill(slots, nl * hs_all, -0.5f, 0.5f);
    memcpy(rslots, slots, nl * hs_all * 4);
    splash_cuda_gdn_lane *gl = (splash_cuda_gdn_lane *)hmalloc(nl * sizeof *gl);
    float *dslots = dcopy(slots, nl * hs_all), *dslots2 = dcopy(slots, nl * hs_all);
    float *dO = dfloats(NV), *dY = dfloats(NV);
    int row = 0;
    for (int i = 0; i < nl; i++) {
        const int n = lane_rows[i];
        for (int h = 0; h < hv; h++) {
            const size_t q0 = (size_t)row * kd + (size_t)(h / per) * dk;
            cpu_gdn_chunked(rslots + i * hs_all + h * hs, dk, dv, n, qn + q0, kn + q0, kd,
                            g.mixed + (size_t)row * g.conv_dim + 2 * kd + (size_t)h * dv, g.conv_dim,
                            gg + (size_t)row * hv + h, gb + (size_t)row * hv + h, hv, ro + (size_t)row * g.vd + (size_t)h * dv,
                            g.vd, scratch);
        }
        for (int t = 0; t < n; t++)
            for (int h = 0; h < hv; h++) {
                const size_t p = (size_t)(row + t) * g.vd + (size_t)h * dv;
                cpu_rmsnorm_gated(ro + p, g.nw, g.z + p, dv, kEps, ry + p);
            }
        memset(&gl[i], 0, sizeof gl[i]);
        gl[i].s_in = gl[i].s_out = dslots + i * hs_all;
        gl[i].first_row = row, gl[i].n_rows = n;
        row += n;
    }
    splash_cuda_gdn_lane *dl = (splash_cuda_gdn_lane *)dmalloc(nl * sizeof *gl);
    up(dl, gl, nl * sizeof *gl);
    splash_cuda_gdn_args a;
    memset(&a, 0, sizeof a);
    a.lanes = dl, a.n_lanes = nl, a.hk = s->hk, a.hv = hv, a.dk = dk, a.dv = dv;
    a.mixed = g.dmixed, a.ldm = g.conv_dim, a.a = g.da, a.b = g.db, a.ldab = hv, a.neg_a = g.dna, a.dt_bias = g.ddt;
    a.o = dO, a.ldo = g.vd, a.z = g.dz, a.ldz = g.vd, a.norm_w = g.dnw, a.y = dY, a.ldy = g.vd, a.eps = kEps;
    int max_rows = 0;
    for (int i = 0; i < nl; i++) max_rows = lane_rows[i] > max_rows ? lane_rows[i] : max_rows;
    /* a workspace of 2 chunks a lane: groups of two chunks, a lane's chunks over several groups */
    a.ws_floats = splash_cuda_gdn_chunked_ws_floats(hv, dk, dv, nl, 2), a.ws = dfloats(a.ws_floats);
    a.max_lane_rows = max_rows;
    poison(dO, NV * 4), poison(dY, NV * 4);
    int rc = splash_cuda_gdn_chunked(&a, NULL);
    float *go = hfloats(NV), *gy = hfloats(NV), *gs = hfloats(nl * hs_all);
    down(go, dO, NV * 4), down(gy, dY, NV * 4), down(gs, dslots, nl * hs_all * 4);
    double err = rc ? INFINITY : max2(max2(rel_err(go, ro, NV), rel_err(gy, ry, NV)), rel_err(gs, rslots, nl * hs_all));
    char sh[64];
    int o = snprintf(sh, sizeof sh, "%s %d/%d x %d/%d rows", s->name, s->hk, hv, dk, dv);
    for (int i = 0; i < nl && o < (int)sizeof sh; i++) o += snprintf(sh + o, sizeof sh - (size_t)o, "%s%d", i ? "," : " ", lane_rows[i]);
    report("gdn_chunked o,y,state", sh, err, 1e-5, -1, 0);

    /* the GPU recurrence on the same inputs: the two forms agree */
    for (int i = 0; i < nl; i++) gl[i].s_in = gl[i].s_out = dslots2 + i * hs_all;
    up(dl, gl, nl * sizeof *gl);
    float *ro2 = hfloats(NV), *rs2 = hfloats(nl * hs_all);
    rc = splash_cuda_gdn_recurrent(&a, NULL);
    down(ro2, dO, NV * 4), down(rs2, dslots2, nl * hs_all * 4);
    err = rc ? INFINITY : max2(rel_err(go, ro2, NV), rel_err(gs, rs2, nl * hs_all));
    report("gdn_chunked vs recurrent", sh, err, 2e-5, -1, 0);

    /* timing: one lane of timing_rows rows, chunked and recurrent */
    GdnIn t;
    gdn_in_make(&t, s, timing_rows);
    float *dst = dfloats(hs_all);
    SPLASH_CUDA_CHECK(cudaMemset(dst, 0x3C, hs_all * 4));
    splash_cuda_gdn_lane tl;
    memset(&tl, 0, sizeof tl);
    tl.s_in = tl.s_out = dst, tl.n_rows = timing_rows;
    splash_cuda_gdn_lane *dtl = (splash_cuda_gdn_lane *)dmalloc(sizeof tl);
    up(dtl, &tl, sizeof tl);
    const size_t TV = (size_t)timing_rows * t.vd;
    float *tO = dfloats(TV), *tY = dfloats(TV);
    splash_cuda_gdn_args b = a;
    b.lanes = dtl, b.n_lanes = 1, b.mixed = t.dmixed, b.a = t.da, b.b = t.db, b.z = t.dz, b.o = tO, b.y = tY;
    b.max_lane_rows = timing_rows; /* every chunk in the workspace: one group */
    b.ws_floats = splash_cuda_gdn_chunked_ws_floats(hv, dk, dv, 1, (timing_rows + SPLASH_CUDA_GDN_CHUNK - 1) /
                                                                       SPLASH_CUDA_GDN_CHUNK);
    b.ws = dfloats(b.ws_floats);
    const double bytes = timing_rows * ((double)t.conv_dim + 2.0 * hv + 3.0 * t.vd) * 4 + 2.0 * hs_all * 4;
    snprintf(sh, sizeof sh, "%s 1 lane x %d rows (prefill)", s->name, timing_rows);
    { /* one lane: the chunked kernel splits each head's columns over 2-4 blocks (a cluster) */
        float *c1 = hfloats(TV), *c2 = hfloats(TV);
        int rc1 = splash_cuda_gdn_chunked(&b, NULL);
        down(c1, tY, TV * 4);
        SPLASH_CUDA_CHECK(cudaMemset(dst, 0x3C, hs_all * 4));
        int rc2 = splash_cuda_gdn_recurrent(&b, NULL);
        down(c2, tY, TV * 4);
        SPLASH_CUDA_CHECK(cudaMemset(dst, 0x3C, hs_all * 4));
        report("gdn_chunked 1 lane (split heads) vs recurrent, y", sh, rc1 || rc2 ? INFINITY : rel_err(c1, c2, TV), 1e-4,
               -1, 0);
        /* the same bits from a workspace of one chunk (a group's three
         * launches a chunk) and of a quarter of them, at least 2, as from all
         * at once */
        const int n_chunks = (timing_rows + SPLASH_CUDA_GDN_CHUNK - 1) / SPLASH_CUDA_GDN_CHUNK;
        const int ws_chunks[2] = {1, n_chunks / 4 > 2 ? n_chunks / 4 : 2};
        int differ = 0;
        for (int v = 0; v < 2; v++) {
            splash_cuda_gdn_args b1 = b;
            b1.ws_floats = splash_cuda_gdn_chunked_ws_floats(hv, dk, dv, 1, ws_chunks[v]);
            rc2 |= splash_cuda_gdn_chunked(&b1, NULL);
            down(c2, tY, TV * 4);
            SPLASH_CUDA_CHECK(cudaMemset(dst, 0x3C, hs_all * 4));
            differ |= memcmp(c1, c2, TV * 4) != 0;
        }
        report("gdn_chunked: groups of 1, of n/4 = all (bitwise)", sh, rc1 || rc2 || differ ? INFINITY : 0, 0, -1,
               0);
        free(c1), free(c2);
    }
    double us = time_us([&](int) { return splash_cuda_gdn_chunked(&b, NULL); });
    report("gdn_chunked (timing)", sh, 0, 0, us, bytes);
    us = time_us([&](int) { return splash_cuda_gdn_recurrent(&b, NULL); });
    report("gdn_recurrent (timing)", sh, 0, 0, us, bytes);

    free(qn), free(kn), free(gg), free(gb), free(slots), free(rslots), free(ro), free(ry), free(scratch), free(gl);
    free(go), free(gy), free(gs), free(ro2), free(rs2);
    cudaFree(dslots), cudaFree(dslots2), cudaFree(dO), cudaFree(dY), cudaFree(dl), cudaFree(dst), cudaFree(dtl);
    cudaFree(tO), cudaFree(tY), cudaFree(a.ws), cudaFree(b.ws);
    gdn_in_free(&g);
    gdn_in_free(&t);
}

/* ==== 5. MoE ============================================================================ */

/* models/qwen35/ffn.c route_task, for one row */
static void cpu_route(const float *logits, int E, int k, int norm, int *idx, float *w) {
    float *p = hfloats(E);
    memcpy(p, logits, E * 4);
    cpu_softmax(p, E);
    for (int kk = 0; kk < k; kk++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int q = 0; q < kk; q++) taken |= idx[q] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        idx[kk] = best;
        w[kk] = p[best];
    }
    if (norm) {
        float sum = 0.0f;
        for (int kk = 0; kk < k; kk++) sum += w[kk];
        for (int kk = 0; kk < k; kk++) w[kk] /= sum;
    }
    for (int a = 1; a < k; a++)
        for (int b = a; b > 0 && idx[b - 1] > idx[b]; b--) {
            int ti = idx[b];
            idx[b] = idx[b - 1], idx[b - 1] = ti;
            float tw = w[b];
            w[b] = w[b - 1], w[b - 1] = tw;
        }
    free(p);
}

/* A random q4 matrix in the package's canonical layout (any codes, scales
 * and biases are a valid matrix), and its tiled copy on the device. */
typedef struct {
    uint8_t *blob;
    splash_tensor t;
    void *dev;
    splash_q4_matrix dm;
    size_t tiled_bytes;
} Q4;

static void q4_make(Q4 *m, int rows, int cols) {
    const splash_qlayout L = splash_matrix_layout(SPLASH_Q4, rows, cols);
    m->blob = (uint8_t *)hmalloc(L.bytes);
    memset(m->blob, 0, L.bytes);
    for (size_t i = 0; i < (size_t)rows * cols / 2; i += 8) {
        const uint64_t h = rng_u64();
        memcpy(m->blob + i, &h, 8);
    }
    const size_t ng = (size_t)rows * (cols / 64);
    uint16_t *sc = (uint16_t *)(m->blob + L.scales_offset), *bi = (uint16_t *)(m->blob + L.biases_offset);
    const float mag = 1.0f / (4.6f * sqrtf((float)cols)); /* outputs of order 1 for unit inputs */
    for (size_t i = 0; i < ng; i++) {
        const float s = mag * rnd(0.5f, 1.5f);
        sc[i] = splash_f32_to_bf16(s);
        bi[i] = splash_f32_to_bf16(-7.5f * s * rnd(0.8f, 1.2f));
    }
    memset(&m->t, 0, sizeof m->t);
    m->t.name = "q4";
    m->t.dtype = SPLASH_Q4;
    m->t.ndim = 2;
    m->t.shape[0] = rows, m->t.shape[1] = cols;
    m->t.data = m->blob;
    m->t.bytes = L.bytes;
    m->tiled_bytes = splash_q4_tiled_bytes(rows, cols);
    uint8_t *tiled = (uint8_t *)hmalloc(m->tiled_bytes);
    if (splash_q4_repack_host(m->blob, rows, cols, tiled, m->tiled_bytes)) {
        fprintf(stderr, "q4 repack failed\n");
        exit(1);
    }
    m->dev = dmalloc(m->tiled_bytes);
    up(m->dev, tiled, m->tiled_bytes);
    free(tiled);
    splash_q4_matrix_init(&m->dm, m->dev, rows, cols);
}

static void q4_free(Q4 *m) {
    free(m->blob);
    cudaFree(m->dev);
}

/* dense_matmul (weights as stored: f32 / f16 / bf16 / canonical q8) against
 * a double-precision product of the same element values (tensor.h's
 * formulas).  ldx > cols with ldx % 4 != 0 takes the element-at-a-time path;
 * otherwise 8-column chunks. */
static void test_dense(const char *name, int dtype, int rows, int cols, int M, int ldx) {
    const size_t n = (size_t)rows * cols;
    const size_t sc_off = (n + 63) & ~(size_t)63, ng = (size_t)rows * (cols / 64);
    const size_t bi_off = sc_off + ((ng * 2 + 63) & ~(size_t)63);
    const size_t bytes = dtype == SPLASH_F32 ? 4 * n : dtype == SPLASH_Q8 ? bi_off + 2 * ng : 2 * n;
    uint8_t *w = (uint8_t *)hmalloc(bytes);
    float *wv = hfloats(n); /* element values */
    for (size_t i = 0; i < n; i++) {
        const float v = rnd_normal() * 0.05f;
        if (dtype == SPLASH_F32) {
            memcpy(w + 4 * i, &v, 4), wv[i] = v;
        } else if (dtype == SPLASH_BF16) {
            const uint16_t h = splash_f32_to_bf16(v);
            memcpy(w + 2 * i, &h, 2), wv[i] = splash_bf16_to_f32(h);
        } else if (dtype == SPLASH_F16) {
            const uint16_t h = __half_as_ushort(__float2half(v));
            memcpy(w + 2 * i, &h, 2), wv[i] = splash_f16_to_f32(h);
        } else {
            w[i] = (uint8_t)(rng_u64() & 255);
        }
    }
    if (dtype == SPLASH_Q8) {
        uint16_t *scl = (uint16_t *)(w + sc_off), *bia = (uint16_t *)(w + bi_off);
        for (size_t g = 0; g < ng; g++) {
            scl[g] = splash_f32_to_bf16(rnd(0.001f, 0.01f));
            bia[g] = splash_f32_to_bf16(rnd(-0.5f, 0.5f));
        }
        for (size_t i = 0; i < n; i++) {
            const size_t g = (i / cols) * (cols / 64) + (i % cols) / 64;
            wv[i] = splash_bf16_to_f32(scl[g]) * (float)w[i] + splash_bf16_to_f32(bia[g]); /* two roundings */
        }
    }
    float *x = hfloats((size_t)M * ldx), *ref = hfloats((size_t)M * rows), *got = hfloats((size_t)M * rows);
    fill(x, (size_t)M * ldx, -2, 2);
    for (int m = 0; m < M; m++)
        for (int r = 0; r < rows; r++) {
            double acc = 0;
            for (int c = 0; c < cols; c++) acc += (double)wv[(size_t)r * cols + c] * x[(size_t)m * ldx + c];
            ref[(size_t)m * rows + r] = (float)acc;
        }
    uint8_t *dw = (uint8_t *)dmalloc(bytes);
    up(dw, w, bytes);
    float *dx = dcopy(x, (size_t)M * ldx), *dy = dfloats((size_t)M * rows);
    poison(dy, (size_t)M * rows * 4);
    splash_cuda_dense_matrix dm;
    int rc = splash_cuda_dense_matrix_init(&dm, dtype, dw, rows, cols);
    if (!rc) rc = splash_cuda_dense_matmul(&dm, dx, ldx, M, dy, rows, NULL);
    down(got, dy, (size_t)M * rows * 4);
    const double err = rc ? INFINITY : rel_err(got, ref, (size_t)M * rows);
    const double us = time_us([&](int) { return splash_cuda_dense_matmul(&dm, dx, ldx, M, dy, rows, NULL); });
    static const char *dn[] = {"f32", "f16", "bf16", "q8"};
    const int di = dtype == SPLASH_F32 ? 0 : dtype == SPLASH_F16 ? 1 : dtype == SPLASH_BF16 ? 2 : 3;
    char sh[64];
    snprintf(sh, sizeof sh, "%s %s %dx%d M %d%s", name, dn[di], rows, cols, M, ldx % 4 ? " (scalar)" : "");
    report("dense_matmul", sh, err, 1e-5, us, (double)bytes + 4.0 * M * (cols + rows));
    /* the last x row alone gives that row's bits: a decode row and a verify
     * block's row agree (the sums' order depends on neither M nor the block) */
    if (M > 1) {
        float *alone = hfloats(rows), *dy1 = dfloats(rows);
        poison(dy1, (size_t)rows * 4);
        rc = rc ? rc : splash_cuda_dense_matmul(&dm, dx + (size_t)(M - 1) * ldx, ldx, 1, dy1, rows, NULL);
        down(alone, dy1, (size_t)rows * 4);
        report("dense_matmul row alone", sh,
               rc || memcmp(alone, got + (size_t)(M - 1) * rows, (size_t)rows * 4) ? INFINITY : 0.0, 0, -1, 0);
        free(alone);
        cudaFree(dy1);
    }
    free(w), free(wv), free(x), free(ref), free(got);
    cudaFree(dw), cudaFree(dx), cudaFree(dy);
}

/* dense_matmul's cases: the fixtures' shapes, odd ones, and (not --quick)
 * the 35B-A3B's router and shared-expert gate at decode and verify rows. */
static void test_dense_all(void) {
    test_dense("tiny", SPLASH_BF16, 8, 128, 16, 128); /* the moe-tiny router */
    test_dense("odd", SPLASH_BF16, 37, 100, 3, 101);
    test_dense("tiny", SPLASH_F32, 48, 288, 9, 288);
    test_dense("tiny", SPLASH_F16, 40, 512, 2, 513);
    test_dense("tiny", SPLASH_Q8, 96, 256, 11, 256);
    test_dense("tiny", SPLASH_Q8, 33, 192, 5, 193);
    test_dense("odd rows", SPLASH_BF16, 257, 1096, 10, 1096); /* 137 chunks: some lanes 2; the last block one row */
    if (g_quick) return;
    test_dense("35B router", SPLASH_BF16, 256, 2048, 1, 2048);
    test_dense("35B router", SPLASH_BF16, 256, 2048, 8, 2048);
    test_dense("35B router+gate", SPLASH_BF16, 257, 2048, 1, 2048); /* stacked, as the model launches it */
    test_dense("35B router+gate", SPLASH_BF16, 257, 2048, 8, 2048);
    test_dense("35B router+gate", SPLASH_BF16, 257, 2048, 16, 2048);
    test_dense("35B shared gate", SPLASH_BF16, 1, 2048, 1, 2048);
}

static void test_moe(const Shape *s, int rows) {
    const int E = s->experts, k = s->top_k, H = s->hidden, I = s->expert_inter;
    char sh[64];
    snprintf(sh, sizeof sh, "%s %d rows, E=%d top-%d", s->name, rows, E, k);
    /* routing */
    float *logits = hfloats((size_t)rows * E);
    for (size_t i = 0; i < (size_t)rows * E; i++) logits[i] = 2.0f * rnd_normal();
    if (rows > 16) /* one expert chosen by every row: its rows go in groups of 16 */
        for (int r = 0; r < rows; r++) logits[(size_t)r * E + 3] += 12.0f;
    int *ridx = (int *)hmalloc((size_t)rows * k * sizeof(int));
    float *rw = hfloats((size_t)rows * k);
    for (int r = 0; r < rows; r++) cpu_route(logits + (size_t)r * E, E, k, 1, ridx + (size_t)r * k, rw + (size_t)r * k);
    float *dlog = dcopy(logits, (size_t)rows * E), *dw = dfloats((size_t)rows * k);
    int32_t *didx = (int32_t *)dmalloc((size_t)rows * k * 4);
    SPLASH_CUDA_CHECK(cudaMemset(didx, 0xFF, (size_t)rows * k * 4));
    poison(dw, (size_t)rows * k * 4);
    int rc = splash_cuda_moe_route(dlog, E, rows, E, k, 1, -1, NULL, 0, didx, dw, NULL, NULL);
    int32_t *gidx = (int32_t *)hmalloc((size_t)rows * k * 4);
    float *gw = hfloats((size_t)rows * k);
    down(gidx, didx, (size_t)rows * k * 4), down(gw, dw, (size_t)rows * k * 4);
    double err = rc ? INFINITY : rel_err(gw, rw, (size_t)rows * k);
    for (size_t i = 0; i < (size_t)rows * k; i++)
        if (gidx[i] != ridx[i]) err = INFINITY;
    double us =
        time_us([&](int) { return splash_cuda_moe_route(dlog, E, rows, E, k, 1, -1, NULL, 0, didx, dw, NULL, NULL); });
    report("moe_route (ids exact)", sh, err, 1e-6, us, (double)rows * E * 4 + 8.0 * rows * k);

    { /* benchmarks' hashed router logits (moe.h): the host's values, bit for bit */
        int32_t *hpos = (int32_t *)hmalloc(rows * sizeof(int32_t));
        for (int r = 0; r < rows; r++) hpos[r] = 1000 + 37 * r;
        int32_t *dpos = (int32_t *)dmalloc(rows * sizeof(int32_t));
        SPLASH_CUDA_CHECK(cudaMemcpy(dpos, hpos, rows * sizeof(int32_t), cudaMemcpyHostToDevice));
        float *dh = dfloats((size_t)rows * (E + 3)), *gh = hfloats((size_t)rows * (E + 3));
        rc = splash_cuda_moe_hash_logits(dh, E + 3, rows, E, dpos, 5, NULL);
        down(gh, dh, (size_t)rows * (E + 3) * 4);
        double herr = rc ? INFINITY : 0.0;
        for (int r = 0; r < rows; r++)
            for (int e = 0; e < E; e++)
                if (gh[(size_t)r * (E + 3) + e] != splash_moe_hash_logit(5, hpos[r], e)) herr = INFINITY;
        report("moe_hash_logits (exact)", sh, herr, 0, -1, 0);
        free(hpos), free(gh), cudaFree(dpos), cudaFree(dh);
    }

    /* experts: weights only for the experts chosen */
    Q4 *gate = (Q4 *)hmalloc(E * sizeof(Q4)), *upm = (Q4 *)hmalloc(E * sizeof(Q4)), *dn = (Q4 *)hmalloc(E * sizeof(Q4));
    char *used = (char *)hmalloc(E);
    memset(used, 0, E);
    for (size_t i = 0; i < (size_t)rows * k; i++) used[ridx[i]] = 1;
    int first = -1, n_used = 0;
    for (int e = 0; e < E; e++)
        if (used[e]) {
            q4_make(&gate[e], I, H), q4_make(&upm[e], I, H), q4_make(&dn[e], H, I);
            if (first < 0) first = e;
            n_used++;
        }
    splash_q4_matrix *mg = (splash_q4_matrix *)hmalloc(E * sizeof(splash_q4_matrix));
    splash_q4_matrix *mu = (splash_q4_matrix *)hmalloc(E * sizeof(splash_q4_matrix));
    splash_q4_matrix *md = (splash_q4_matrix *)hmalloc(E * sizeof(splash_q4_matrix));
    for (int e = 0; e < E; e++) { /* experts never chosen describe the first chosen one (never read) */
        const int src = used[e] ? e : first;
        mg[e] = gate[src].dm, mu[e] = upm[src].dm, md[e] = dn[src].dm;
    }
    const size_t NH = (size_t)rows * H;
    float *xn = hfloats(NH), *ref = hfloats(NH), *got = hfloats(NH);
    fill_rows(xn, rows, H);
    memset(ref, 0, NH * 4);
    float *mx = hfloats(NH), *ff1 = hfloats((size_t)rows * I), *ff2 = hfloats((size_t)rows * I), *mo = hfloats(NH);
    int *erows = (int *)hmalloc(rows * sizeof(int));
    float *erw = hfloats(rows);
    for (int e = 0; e < E; e++) { /* models/qwen35/ffn.c qwen35_moe_layer */
        int n = 0;
        for (int r = 0; r < rows; r++)
            for (int kk = 0; kk < k; kk++)
                if (ridx[(size_t)r * k + kk] == e) erows[n] = r, erw[n++] = rw[(size_t)r * k + kk];
        if (!n) continue;
        for (int i = 0; i < n; i++) memcpy(mx + (size_t)i * H, xn + (size_t)erows[i] * H, H * 4);
        cpu_matmul_swiglu(&g_cpu, &gate[e].t, &upm[e].t, n, mx, H, ff1, I, ff2, I);
        cpu_matmul(&g_cpu, &dn[e].t, n, ff1, I, mo, H);
        for (int i = 0; i < n; i++) {
            float *fo = ref + (size_t)erows[i] * H, w = erw[i];
            for (int c = 0; c < H; c++) fo[c] = fo[c] + mo[(size_t)i * H + c] * w;
        }
    }
    splash_cuda_moe_scratch sc;
    if (splash_cuda_moe_scratch_init(&sc, rows, H, I, k)) {
        fprintf(stderr, "moe scratch init failed\n");
        exit(1);
    }
    float *dxn = dcopy(xn, NH), *dfo = dfloats(NH);
    poison(dfo, NH * 4);
    rc = splash_cuda_moe_experts(mg, mu, md, E, didx, dw, rows, dxn, H, dfo, H, &sc, NULL);
    down(got, dfo, NH * 4);
    err = rc ? INFINITY : rel_err(got, ref, NH);
    us = time_us([&](int) { return splash_cuda_moe_experts(mg, mu, md, E, didx, dw, rows, dxn, H, dfo, H, &sc, NULL); },
                 false);
    char sh2[64];
    snprintf(sh2, sizeof sh2, "%s %d rows, %d experts x 3 x %dx%d", s->name, rows, n_used, I, H);
    report("moe_experts (host-driven)", sh2, err, 1e-5, us, 3.0 * n_used * splash_q4_tiled_bytes(I, H) + 2.0 * NH * 4);

    { /* the device-driven steps: experts laid out as the loader does, a shared
       * expert after them (expert E: qc_layer.shared_slot) */
        Q4 shq[3];
        q4_make(&shq[0], I, H), q4_make(&shq[1], I, H), q4_make(&shq[2], H, I);
        uint8_t *pool[3];
        splash_q4_matrix *gm[3];
        const Q4 *src[3] = {gate, upm, dn};
        const int mr[3] = {I, I, H}, mc[3] = {H, H, I};
        for (int t = 0; t < 3; t++) {
            const size_t tb = splash_q4_tiled_bytes(mr[t], mc[t]), st = (tb + 255) & ~(size_t)255;
            pool[t] = (uint8_t *)dmalloc(st * (E + 1));
            SPLASH_CUDA_CHECK(cudaMemset(pool[t], 0, st * (E + 1)));
            gm[t] = (splash_q4_matrix *)hmalloc((E + 1) * sizeof(splash_q4_matrix));
            for (int e = 0; e <= E; e++) {
                const Q4 *q = e == E ? &shq[t] : used[e] ? &src[t][e] : NULL;
                if (q) SPLASH_CUDA_CHECK(cudaMemcpy(pool[t] + st * e, q->dm.codes, tb, cudaMemcpyDeviceToDevice));
                splash_q4_matrix_init(&gm[t][e], pool[t] + st * e, mr[t], mc[t]);
            }
        }
        void *xpm = dmalloc(splash_q4_xprep_bytes(H));
        splash_q4_xprep xp;
        splash_q4_xprep_init(&xp, xpm, H);
        float *gfo = hfloats(NH);
        poison(dfo, NH * 4);
        if (rows <= SPLASH_Q4_MAX_M) {
        rc = splash_q4_prep_x(&xp, dxn, rows, H, H, NULL);
        if (!rc)
            rc = splash_cuda_moe_experts_grouped(gm[0], gm[1], gm[2], E, didx, dw, NULL, rows, k, &xp, dfo, H, NULL, 0,
                                                 &sc, NULL);
        down(gfo, dfo, NH * 4);
        err = rc ? INFINITY : rel_err(gfo, ref, NH);
        if (memcmp(gfo, got, NH * 4)) err = INFINITY; /* the same bits as the host-driven step */
        us = time_us([&](int) {
            return splash_cuda_moe_experts_grouped(gm[0], gm[1], gm[2], E, didx, dw, NULL, rows, k, &xp, dfo, H, NULL, 0,
                                                   &sc, NULL);
        });
        report("moe_experts (grouped, = host-driven bits)", sh2, err, 1e-5, us,
               3.0 * rows * k * splash_q4_tiled_bytes(I, H) + 2.0 * NH * 4);
        /* the same with the slots grouped by expert (a plan): the same bits */
        poison(dfo, NH * 4);
        rc = splash_q4_group_plan(didx, rows * k, E, sc.plan, NULL);
        if (!rc)
            rc = splash_cuda_moe_experts_grouped(gm[0], gm[1], gm[2], E, didx, dw, sc.plan, rows, k, &xp, dfo, H, NULL,
                                                 0, &sc, NULL);
        down(gfo, dfo, NH * 4);
        err = rc ? INFINITY : rel_err(gfo, ref, NH);
        if (memcmp(gfo, got, NH * 4)) err = INFINITY;
        us = time_us([&](int) {
            return splash_cuda_moe_experts_grouped(gm[0], gm[1], gm[2], E, didx, dw, sc.plan, rows, k, &xp, dfo, H, NULL,
                                                   0, &sc, NULL);
        });
        report("moe_experts (grouped by expert, = host-driven bits)", sh2, err, 1e-5, us,
               3.0 * n_used * splash_q4_tiled_bytes(I, H) + 2.0 * NH * 4);

        /* the shared expert as slot k of each row: the route appends (E, sigmoid of
         * its gate logit), the grouped step runs k + 1 slots and adds the residual;
         * against ffn.c's order: routed sum, + sigmoid(s) * shared, x += that */
        const int k1 = k + 1;
        float *sl = hfloats(rows), *x0 = hfloats(NH), *rfo = hfloats(NH), *rx = hfloats(NH), *gx = hfloats(NH);
        fill(sl, rows, -4, 4), fill(x0, NH, -4, 4);
        cpu_matmul_swiglu(&g_cpu, &shq[0].t, &shq[1].t, rows, xn, H, ff1, I, ff2, I);
        cpu_matmul(&g_cpu, &shq[2].t, rows, ff1, I, mo, H);
        for (int r = 0; r < rows; r++) {
            const float sgm = cpu_sigmoid(sl[r]);
            for (int c = 0; c < H; c++) {
                const size_t j = (size_t)r * H + c;
                rfo[j] = ref[j] + sgm * mo[j];
                rx[j] = rfo[j] + x0[j];
            }
        }
        float *dsl = dcopy(sl, rows), *dx0 = dcopy(x0, NH), *dw1 = dfloats((size_t)rows * k1);
        int32_t *didx1 = (int32_t *)dmalloc((size_t)rows * k1 * 4);
        rc = splash_cuda_moe_route(dlog, E, rows, E, k, 1, E, dsl, 1, didx1, dw1, sc.plan, NULL); /* + the plan */
        int32_t *gidx1 = (int32_t *)hmalloc((size_t)rows * k1 * 4);
        float *gw1 = hfloats((size_t)rows * k1);
        down(gidx1, didx1, (size_t)rows * k1 * 4), down(gw1, dw1, (size_t)rows * k1 * 4);
        err = rc ? INFINITY : 0.0;
        for (int r = 0; r < rows; r++)
            for (int kk = 0; kk < k1; kk++) {
                const size_t i = (size_t)r * k1 + kk;
                const int want_i = kk < k ? ridx[(size_t)r * k + kk] : E;
                const float want_w = kk < k ? gw[(size_t)r * k + kk] : cpu_sigmoid(sl[r]);
                if (gidx1[i] != want_i) err = INFINITY;
                err = max2(err, fabs((double)gw1[i] - want_w) / fabs((double)want_w));
            }
        report("moe_route + shared slot (ids exact)", sh, err, 1e-6, -1, 0);
        poison(dfo, NH * 4);
        if (!rc)
            rc = splash_cuda_moe_experts_grouped(gm[0], gm[1], gm[2], E + 1, didx1, dw1, sc.plan, rows, k1, &xp, dfo, H,
                                                 dx0, H, &sc, NULL);
        down(gfo, dfo, NH * 4), down(gx, dx0, NH * 4);
        err = rc ? INFINITY : max2(rel_err(gfo, rfo, NH), rel_err(gx, rx, NH));
        SPLASH_CUDA_CHECK(cudaMemcpy(dx0, x0, NH * 4, cudaMemcpyHostToDevice));
        us = time_us([&](int) {
            return splash_cuda_moe_experts_grouped(gm[0], gm[1], gm[2], E + 1, didx1, dw1, sc.plan, rows, k1, &xp, dfo,
                                                   H, dx0, H, &sc, NULL);
        });
        report("moe_experts (grouped by the route's plan + shared slot + residual)", sh2, err, 1e-5, us,
               3.0 * rows * k1 * splash_q4_tiled_bytes(I, H) + 3.0 * NH * 4);
        free(sl), free(x0), free(rfo), free(rx), free(gx), free(gidx1), free(gw1);
        cudaFree(dsl), cudaFree(dx0), cudaFree(dw1), cudaFree(didx1);
        }
        /* the GEMM step (bulk prefill): fp16-grade against the fp32 reference, and a
         * row's result independent of the other rows (the first rows alone: same bits) */
        poison(dfo, NH * 4);
        rc = splash_cuda_moe_experts_gemm(gm[0], gm[1], gm[2], E, didx, dw, rows, dxn, H, dfo, H, &sc, NULL);
        down(gfo, dfo, NH * 4);
        err = rc ? INFINITY : rel_err(gfo, ref, NH);
        const int part = rows < 37 ? rows : 37;
        float *pfo = hfloats((size_t)part * H);
        poison(dfo, NH * 4);
        rc = splash_cuda_moe_experts_gemm(gm[0], gm[1], gm[2], E, didx, dw, part, dxn, H, dfo, H, &sc, NULL);
        down(pfo, dfo, (size_t)part * H * 4);
        if (rc || memcmp(pfo, gfo, (size_t)part * H * 4)) err = INFINITY;
        us = time_us([&](int) {
            return splash_cuda_moe_experts_gemm(gm[0], gm[1], gm[2], E, didx, dw, rows, dxn, H, dfo, H, &sc, NULL);
        });
        report("moe_experts (GEMM, fp16; first rows alone = bits)", sh2, err, 3e-3, us,
               3.0 * n_used * splash_q4_tiled_bytes(I, H) + 2.0 * NH * 4);
        free(pfo);
        for (int t = 0; t < 3; t++) cudaFree(pool[t]), free(gm[t]), q4_free(&shq[t]);
        cudaFree(xpm), free(gfo);
    }

    splash_cuda_moe_scratch_free(&sc);
    for (int e = 0; e < E; e++)
        if (used[e]) q4_free(&gate[e]), q4_free(&upm[e]), q4_free(&dn[e]);
    free(gate), free(upm), free(dn), free(used), free(mg), free(mu), free(md), free(logits), free(ridx), free(rw);
    free(gidx), free(gw), free(xn), free(ref), free(got), free(mx), free(ff1), free(ff2), free(mo), free(erows), free(erw);
    cudaFree(dlog), cudaFree(dw), cudaFree(didx), cudaFree(dxn), cudaFree(dfo);
}

/* The MoE layer's weighted sum added by the next RMS preparation
 * (splash_q4_prep_rmsnorm_moe) against the sum's own launch then
 * splash_q4_prep_rmsnorm: fo, x, y and a q4 product of the prepared rows
 * equal to the bit, with early loads on and off, the xprep poisoned before
 * each (H past 4,096: refused as unsupported).  Then both timed. */
static void test_prep_rmsnorm_moe(int H, int rows, int K) {
    char sh[64];
    snprintf(sh, sizeof sh, "H %d, %d rows x %d slots", H, rows, K);
    const size_t NH = (size_t)rows * H, MO = (size_t)rows * K * H;
    float *mo = hfloats(MO), *w = hfloats((size_t)rows * K), *x = hfloats(NH), *nw = hfloats(H);
    fill(mo, MO, -1.f, 1.f), fill(w, (size_t)rows * K, 0.f, 0.5f), fill(x, NH, -2.f, 2.f), fill(nw, H, 0.5f, 1.5f);
    float *dmo = dcopy(mo, MO), *dw = dcopy(w, (size_t)rows * K), *dnw = dcopy(nw, H);
    float *dx[2] = {dfloats(NH), dfloats(NH)}, *dfo[2] = {dfloats(NH), dfloats(NH)}, *dy[2] = {dfloats(NH), dfloats(NH)};
    const int P = 256; /* the product's rows */
    Q4 q;
    q4_make(&q, P, H);
    float *dp[2] = {dfloats((size_t)16 * P), dfloats((size_t)16 * P)};
    const size_t xpb = splash_q4_xprep_bytes(H);
    void *xpm = dmalloc(xpb);
    splash_q4_xprep xp;
    splash_q4_xprep_init(&xp, xpm, H);
    /* path 0: the sum's launch, then the norm's; path 1: the one launch */
    auto run = [&](int path) {
        const splash_q4_moe_sum ms = {dmo, (size_t)H, dw, K, dfo[path], (size_t)H};
        int rc = path ? splash_q4_prep_rmsnorm_moe(&xp, dx[path], H, &ms, dnw, kEps, dy[path], H, rows, H, NULL)
                      : splash_cuda_moe_sum(&ms, rows, H, dx[path], H, NULL);
        if (!rc && !path) rc = splash_q4_prep_rmsnorm(&xp, dx[path], H, dnw, kEps, dy[path], H, rows, H, NULL);
        return rc;
    };
    float *h[2][4];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) h[i][j] = hfloats(j == 3 ? (size_t)rows * P : NH);
    auto outputs = [&](int path, float **o) {
        const int rc = splash_q4_matmul(&q.dm, &xp, dp[path], NULL);
        down(o[0], dfo[path], NH * 4), down(o[1], dx[path], NH * 4), down(o[2], dy[path], NH * 4);
        down(o[3], dp[path], (size_t)rows * P * 4);
        return rc;
    };
    const int was = splash_q4_early_loads();
    double err = 0;
    if (H > 4096) {
        up(dx[1], x, NH * 4);
        const splash_q4_moe_sum ms = {dmo, (size_t)H, dw, K, dfo[1], (size_t)H};
        err = splash_q4_prep_rmsnorm_moe(&xp, dx[1], H, &ms, dnw, kEps, dy[1], H, rows, H, NULL) == SPLASH_E_UNSUPPORTED
                  ? 0 : INFINITY;
        report("prep_rmsnorm_moe refused (exact)", sh, err, 0, -1, 0);
    } else {
        for (int early = 0; early < 2; early++) {
            splash_q4_set_early_loads(early);
            for (int path = 0; path < 2; path++) {
                up(dx[path], x, NH * 4);
                poison(dfo[path], NH * 4), poison(dy[path], NH * 4), poison(xpm, xpb);
                if (run(path) || outputs(path, h[path])) err = INFINITY;
            }
            for (int j = 0; j < 4; j++)
                if (memcmp(h[0][j], h[1][j], (j == 3 ? (size_t)rows * P : NH) * 4)) err = INFINITY;
        }
        splash_q4_set_early_loads(was);
        /* and against the host: x + the sum in k order, then the norm (the CPU's rmsnorm) */
        float *rx = hfloats(NH), *ry = hfloats(NH);
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < H; c++) {
                float f = 0.f;
                for (int k = 0; k < K; k++) f += mo[((size_t)r * K + k) * H + c] * w[(size_t)r * K + k];
                rx[(size_t)r * H + c] = f + x[(size_t)r * H + c];
            }
        for (int r = 0; r < rows; r++) cpu_rmsnorm(rx + (size_t)r * H, nw, H, kEps, ry + (size_t)r * H);
        err = max2(err, max2(rel_err(h[1][1], rx, NH), rel_err(h[1][2], ry, NH)));
        report("prep_rmsnorm_moe = sum, then prep_rmsnorm (bits)", sh, err, 1e-6, -1, 0);
        free(rx), free(ry);
        up(dx[0], x, NH * 4), up(dx[1], x, NH * 4);
        const double bytes = (double)(MO + 3 * NH) * 4;
        double us = time_us([&](int) { return run(0); });
        report("moe_sum, then prep_rmsnorm (2 launches)", sh, 0, 0, us, bytes);
        us = time_us([&](int) { return run(1); });
        report("prep_rmsnorm_moe (1 launch)", sh, 0, 0, us, bytes);
    }
    for (int i = 0; i < 2; i++) {
        cudaFree(dx[i]), cudaFree(dfo[i]), cudaFree(dy[i]), cudaFree(dp[i]);
        for (int j = 0; j < 4; j++) free(h[i][j]);
    }
    q4_free(&q);
    cudaFree(xpm), cudaFree(dmo), cudaFree(dw), cudaFree(dnw);
    free(mo), free(w), free(x), free(nw);
}

/* The plan's layout (q4_plan.cuh) on the host, one slot at a time: a slot
 * whose rank among its expert's slots is a multiple of gmax leads a group of
 * the next gmax slots of that expert, groups numbered in slot order. */
static void host_plan(const int32_t *idx, int S, int n_experts, int gmax, int32_t *plan) {
    int ng = 0;
    for (int i = 0; i < S; i++) {
        const int e = idx[i];
        if (e < 0 || e >= n_experts) continue;
        int rank = 0;
        for (int j = 0; j < i; j++) rank += idx[j] == e;
        if (rank % gmax) continue;
        int32_t *gp = plan + 1 + 6 * ng++;
        int n = 0;
        for (int j = i; j < S && n < gmax; j++)
            if (idx[j] == e) gp[2 + n++] = j;
        gp[0] = e, gp[1] = n;
    }
    plan[0] = ng;
}

/* 0 when two plans hold the same groups (entries past a group's size are unspecified). */
static double plans_differ(const int32_t *a, const int32_t *b) {
    if (a[0] != b[0]) return INFINITY;
    for (int g = 0; g < a[0]; g++) {
        const int32_t *x = a + 1 + 6 * g, *y = b + 1 + 6 * g;
        if (x[0] != y[0] || x[1] != y[1] || x[1] < 1 || x[1] > 4) return INFINITY;
        for (int i = 0; i < x[1]; i++)
            if (x[2 + i] != y[2 + i]) return INFINITY;
    }
    return 0;
}

/* splash_q4_group_plan against host_plan, exactly: ids from few experts (groups of several),
 * some outside [0, n_experts), S from one slot to the most a plan takes. */
static void test_group_plan(void) {
    const int sizes[] = {1, 9, 31, 72, 144, 333, 1024}, E = 40, gmax = splash_q4_plan_group();
    for (int t = 0; t < (int)(sizeof sizes / sizeof sizes[0]); t++) {
        const int S = sizes[t];
        int32_t *ids = (int32_t *)hmalloc((size_t)S * 4), *want = (int32_t *)hmalloc(splash_q4_group_plan_ints(S) * 4),
                *got = (int32_t *)hmalloc(splash_q4_group_plan_ints(S) * 4);
        for (int i = 0; i < S; i++) {
            const uint64_t u = rng_u64();
            ids[i] = u % 17 == 0 ? -1 : u % 23 == 0 ? E + (int)(u % 5) : (int)((u >> 8) % (S < 100 ? 6 : E));
        }
        host_plan(ids, S, E, gmax, want);
        int32_t *didx = (int32_t *)dmalloc((size_t)S * 4), *dplan = (int32_t *)dmalloc(splash_q4_group_plan_ints(S) * 4);
        up(didx, ids, (size_t)S * 4);
        SPLASH_CUDA_CHECK(cudaMemset(dplan, 0xFF, splash_q4_group_plan_ints(S) * 4));
        const int rc = splash_q4_group_plan(didx, S, E, dplan, NULL);
        down(got, dplan, splash_q4_group_plan_ints(S) * 4);
        char sh[64];
        snprintf(sh, sizeof sh, "%d slots, %d experts, groups of %d", S, E, gmax);
        report("q4 group plan = host", sh, rc ? INFINITY : plans_differ(got, want), 0, -1, 0);
        free(ids), free(want), free(got);
        cudaFree(didx), cudaFree(dplan);
    }
}

/* The route's plan at its widest (16 rows of 1,023 experts and a shared
 * one, id 1,023: ~64 KB of probabilities in one block): ids as the CPU's,
 * and every slot in exactly one group of its expert, groups of <= 4 in slot
 * order. */
static void test_route_plan_wide(void) {
    const int rows = 16, E = SPLASH_CUDA_MOE_MAX_EXPERTS - 1, k = 8, k1 = k + 1, S = rows * k1;
    float *logits = hfloats((size_t)rows * E), *sl = hfloats(rows);
    for (size_t i = 0; i < (size_t)rows * E; i++) logits[i] = 2.0f * rnd_normal();
    for (int r = 0; r < rows; r++) logits[(size_t)r * E + 5] += 12.0f; /* one expert for every row: 4 groups */
    fill(sl, rows, -3, 3);
    int *ridx = (int *)hmalloc((size_t)rows * k * sizeof(int));
    float *rw = hfloats((size_t)rows * k);
    for (int r = 0; r < rows; r++) cpu_route(logits + (size_t)r * E, E, k, 1, ridx + (size_t)r * k, rw + (size_t)r * k);
    float *dlog = dcopy(logits, (size_t)rows * E), *dsl = dcopy(sl, rows), *dw = dfloats(S);
    int32_t *didx = (int32_t *)dmalloc((size_t)S * 4), *dplan = (int32_t *)dmalloc(splash_q4_group_plan_ints(S) * 4);
    const int rc = splash_cuda_moe_route(dlog, E, rows, E, k, 1, E, dsl, 1, didx, dw, dplan, NULL);
    int32_t *gidx = (int32_t *)hmalloc((size_t)S * 4), *plan = (int32_t *)hmalloc(splash_q4_group_plan_ints(S) * 4);
    down(gidx, didx, (size_t)S * 4), down(plan, dplan, splash_q4_group_plan_ints(S) * 4);
    double err = rc ? INFINITY : 0.0;
    for (int r = 0; r < rows; r++)
        for (int kk = 0; kk < k1; kk++)
            if (gidx[r * k1 + kk] != (kk < k ? ridx[r * k + kk] : E)) err = INFINITY;
    int *seen = (int *)hmalloc(S * sizeof(int));
    memset(seen, 0, S * sizeof(int));
    const int ng = plan[0];
    for (int g = 0; g < ng && g <= S; g++) {
        const int32_t *gp = plan + 1 + 6 * g;
        if (gp[1] < 1 || gp[1] > 4) err = INFINITY;
        for (int i = 0; i < gp[1] && i < 4; i++) {
            const int sl_ = gp[2 + i];
            if (sl_ < 0 || sl_ >= S || gidx[sl_] != gp[0] || (i && sl_ <= gp[1 + i])) err = INFINITY;
            else seen[sl_]++;
        }
    }
    for (int i = 0; i < S; i++)
        if (seen[i] != 1) err = INFINITY;
    int32_t *want = (int32_t *)hmalloc(splash_q4_group_plan_ints(S) * 4);
    host_plan(gidx, S, E + 1, splash_q4_plan_group(), want);
    if (plans_differ(plan, want)) err = INFINITY;
    free(want);
    report("moe_route + plan (16 x 1,023 + 1 experts)", "ids = CPU, plan = host", err, 0, -1, 0);
    free(logits), free(sl), free(ridx), free(rw), free(gidx), free(plan), free(seen);
    cudaFree(dlog), cudaFree(dsl), cudaFree(dw), cudaFree(didx), cudaFree(dplan);
}

/* The route's edges against the CPU's, ids exactly: a row of equal logits (every p ties: the
 * lowest ids), a row whose 10 largest logits tie across the top-8 boundary (the 8 lowest of
 * them), a row of NaN logits (every p NaN: the lowest ids; weights NaN); E = 256 (8
 * probabilities a lane) and 1,023 (32). */
static void test_route_edges(int E) {
    const int rows = 3, k = 8;
    const int tie[10] = {3, 17, 40, 63, 64, 100, 130, 200, 201, E - 1}; /* the top 8: all but 201, E - 1 */
    float *logits = hfloats((size_t)rows * E);
    for (int e = 0; e < E; e++) logits[e] = 0.f, logits[(size_t)E + e] = 2.0f * rnd_normal(), logits[2 * (size_t)E + e] = NAN;
    for (int i = 0; i < 10; i++) logits[(size_t)E + tie[i]] = 10.f; /* the others ~N(0, 4): below 10 */
    int *ridx = (int *)hmalloc((size_t)rows * k * sizeof(int));
    float *rw = hfloats((size_t)rows * k);
    for (int r = 0; r < rows; r++) cpu_route(logits + (size_t)r * E, E, k, 1, ridx + (size_t)r * k, rw + (size_t)r * k);
    float *dlog = dcopy(logits, (size_t)rows * E), *dw = dfloats((size_t)rows * k);
    int32_t *didx = (int32_t *)dmalloc((size_t)rows * k * 4);
    const int rc = splash_cuda_moe_route(dlog, E, rows, E, k, 1, -1, NULL, 0, didx, dw, NULL, NULL);
    int32_t *gidx = (int32_t *)hmalloc((size_t)rows * k * 4);
    float *gw = hfloats((size_t)rows * k);
    down(gidx, didx, (size_t)rows * k * 4), down(gw, dw, (size_t)rows * k * 4);
    double err = rc ? INFINITY : rel_err(gw, rw, (size_t)2 * k); /* the finite rows' weights */
    for (int i = 0; i < rows * k; i++)
        if (gidx[i] != ridx[i]) err = INFINITY;
    for (int i = 2 * k; i < rows * k; i++)
        if (!isnan(gw[i])) err = INFINITY;
    char sh[64];
    snprintf(sh, sizeof sh, "E=%d top-%d: equal, tied at the top 10, NaN", E, k);
    report("moe_route edges (ids exact)", sh, err, 1e-6, -1, 0);
    free(logits), free(ridx), free(rw), free(gidx), free(gw);
    cudaFree(dlog), cudaFree(dw), cudaFree(didx);
}

/* silu(g) * u and the shared-expert add, at a model's FFN widths */
static void test_elementwise(const Shape *s, int rows, int inter) {
    const size_t NI = (size_t)rows * inter, NH = (size_t)rows * s->hidden;
    float *g = hfloats(NI), *u = hfloats(NI), *ref = hfloats(NI), *got = hfloats(NI);
    fill(g, NI, -8, 8), fill(u, NI, -2, 2);
    cpu_silu_mul(g, u, (int)NI, ref);
    float *dg = dcopy(g, NI), *du = dcopy(u, NI), *dO = dfloats(NI);
    poison(dO, NI * 4);
    int rc = splash_cuda_silu_mul(dg, inter, du, inter, dO, inter, rows, inter, NULL);
    down(got, dO, NI * 4);
    double err = rc ? INFINITY : rel_err(got, ref, NI);
    double us = time_us([&](int) { return splash_cuda_silu_mul(dg, inter, du, inter, dO, inter, rows, inter, NULL); });
    char sh[64];
    snprintf(sh, sizeof sh, "%s %d x %d", s->name, rows, inter);
    report("silu_mul", sh, err, 1e-6, us, 3.0 * NI * 4);

    const int H = s->hidden;
    float *fo = hfloats(NH), *mo = hfloats(NH), *x = hfloats(NH), *sg = hfloats(rows), *rfo = hfloats(NH),
          *rx = hfloats(NH), *gfo = hfloats(NH), *gx = hfloats(NH);
    fill(fo, NH, -1, 1), fill(mo, NH, -1, 1), fill(x, NH, -4, 4), fill(sg, rows, -5, 5);
    for (int r = 0; r < rows; r++) { /* ffn.c shared_add_task */
        const float sgm = cpu_sigmoid(sg[r]);
        for (int i = 0; i < H; i++) {
            const size_t j = (size_t)r * H + i;
            rfo[j] = fo[j] + sgm * mo[j];
            rx[j] = rfo[j] + x[j];
        }
    }
    float *dfo = dcopy(fo, NH), *dmo = dcopy(mo, NH), *dx = dcopy(x, NH), *dsg = dcopy(sg, rows);
    rc = splash_cuda_moe_shared_add(dfo, H, dmo, H, dsg, 1, dx, H, rows, H, NULL);
    down(gfo, dfo, NH * 4), down(gx, dx, NH * 4);
    err = rc ? INFINITY : max2(rel_err(gfo, rfo, NH), rel_err(gx, rx, NH));
    us = time_us([&](int) { return splash_cuda_moe_shared_add(dfo, H, dmo, H, dsg, 1, dx, H, rows, H, NULL); });
    snprintf(sh, sizeof sh, "%s %d x %d", s->name, rows, H);
    report("moe_shared_add", sh, err, 1e-6, us, 5.0 * NH * 4);
    free(g), free(u), free(ref), free(got), free(fo), free(mo), free(x), free(sg), free(rfo), free(rx), free(gfo), free(gx);
    cudaFree(dg), cudaFree(du), cudaFree(dO), cudaFree(dfo), cudaFree(dmo), cudaFree(dx), cudaFree(dsg);
}

/* ==== 6. argmax, lm_head + argmax ======================================================== */

static int host_argmax(const float *x, int n) { /* runtime/sampling.c greedy: strict >, NaN never */
    float best = -INFINITY;
    int arg = -1;
    for (int i = 0; i < n; i++)
        if (x[i] > best) best = x[i], arg = i;
    return arg;
}

static __device__ __forceinline__ uint32_t hash32(uint64_t i, uint32_t seed) {
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)(z ^ (z >> 31));
}

/* Random tiled q4 weights on the device: codes random, scales and biases
 * finite bf16 in (-0.05, 0.05). */
__global__ void fill_tiled(uint32_t *w, size_t words, size_t code_words, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x) {
        const uint32_t h = hash32(i, seed);
        if (i < code_words) {
            w[i] = h;
        } else {
            const float a = ((h & 0xFFFF) / 65536.f - 0.5f) * 0.1f, b = ((h >> 16) / 65536.f - 0.5f) * 0.1f;
            w[i] = (__float_as_uint(a) >> 16) | (__float_as_uint(b) & 0xFFFF0000u);
        }
    }
}

static void test_argmax(const char *name, int rows, int V, int hidden) {
    const size_t N = (size_t)rows * V;
    float *x = hfloats(N);
    for (size_t i = 0; i < N; i++) x[i] = 3.0f * rnd_normal();
    if (rows > 4) {
        float *r1 = x + V, *r2 = x + 2 * (size_t)V, *r3 = x + 3 * (size_t)V, *r4 = x + 4 * (size_t)V;
        r1[V - 7] = 100.f, r1[V / 2 + 3] = 100.f, r1[V / 3] = 100.f; /* tie: the lowest index wins */
        for (int i = 0; i < V; i++) r2[i] = -INFINITY;                 /* nothing: -1 */
        r3[0] = NAN, r3[V - 1] = 50.f;                                 /* NaN is never chosen */
        for (int i = 0; i < V; i++) r4[i] = -INFINITY;
        r4[V - 1] = -1e30f;
    }
    int32_t *want = (int32_t *)hmalloc(rows * 4), *got = (int32_t *)hmalloc(rows * 4);
    for (int r = 0; r < rows; r++) want[r] = host_argmax(x + (size_t)r * V, V);
    float *dx = dcopy(x, N), *dval = dfloats(rows);
    int32_t *didx = (int32_t *)dmalloc(rows * 4);
    const size_t wsb = splash_cuda_argmax_workspace_bytes(rows, V);
    void *ws = dmalloc(wsb);
    SPLASH_CUDA_CHECK(cudaMemset(didx, 0x7F, rows * 4));
    int rc = splash_cuda_argmax(dx, V, rows, V, didx, dval, ws, wsb, NULL);
    down(got, didx, rows * 4);
    double err = rc ? INFINITY : 0;
    for (int r = 0; r < rows; r++) err += got[r] != want[r];
    double us = time_us([&](int) { return splash_cuda_argmax(dx, V, rows, V, didx, dval, ws, wsb, NULL); });
    char sh[64];
    snprintf(sh, sizeof sh, "%s %d x %d (ties, -inf, NaN rows)", name, rows, V);
    report("argmax (rows differ)", sh, err, 0, us, (double)N * 4);

    /* lm_head (q4, random tiled weights) + argmax */
    const size_t tb = splash_q4_tiled_bytes(V, hidden), cb = splash_q4_tiled_codes_bytes(V, hidden);
    void *dW = dmalloc(tb);
    fill_tiled<<<1024, 256>>>((uint32_t *)dW, tb / 4, cb / 4, 1234u);
    SPLASH_CUDA_CHECK(cudaGetLastError());
    splash_q4_matrix W;
    splash_q4_matrix_init(&W, dW, V, hidden);
    float *h = hfloats((size_t)rows * hidden);
    fill_rows(h, rows, hidden);
    float *dh = dcopy(h, (size_t)rows * hidden), *dlog = dfloats(N);
    void *xpm = dmalloc(splash_q4_xprep_bytes(hidden));
    splash_q4_xprep xp;
    splash_q4_xprep_init(&xp, xpm, hidden);
    rc = splash_q4_prep_x(&xp, dh, rows, hidden, hidden, NULL);
    if (!rc) rc = splash_cuda_lm_head_argmax(&W, &xp, dlog, didx, dval, ws, wsb, NULL);
    down(x, dlog, N * 4), down(got, didx, rows * 4);
    err = rc ? INFINITY : 0;
    for (int r = 0; r < rows; r++) err += got[r] != host_argmax(x + (size_t)r * V, V);
    us = time_us([&](int) { return splash_cuda_lm_head_argmax(&W, &xp, dlog, didx, dval, ws, wsb, NULL); });
    snprintf(sh, sizeof sh, "%s M=%d, %d x %d q4", name, rows, V, hidden);
    report("lm_head+argmax", sh, err, 0, us, (double)tb + 2.0 * N * 4);
    free(x), free(want), free(got), free(h);
    cudaFree(dx), cudaFree(dval), cudaFree(didx), cudaFree(ws), cudaFree(dW), cudaFree(dh), cudaFree(dlog), cudaFree(xpm);
}

/* ==== 7. the DFlash draft's ops (dflash.h) =========================================================== */

/* The block attention against a double reference written from dflash_ctx.c's
 * attn_task (the same visible keys: context ring [c0, n_ctx), block rows
 * [b0, b1)). */
static void test_dflash_attention(const char *name, int block, int heads, int kvh, int hd, int n_ctx, int lo, int cap,
                                  int window, int causal) {
    const size_t qw = (size_t)heads * hd, kvw = (size_t)kvh * hd;
    float *q = hfloats(block * qw), *k = hfloats(block * kvw), *v = hfloats(block * kvw);
    float *rk = hfloats(cap * kvw), *rv = hfloats(cap * kvw), *ref = hfloats(block * qw), *got = hfloats(block * qw);
    fill(q, block * qw, -1, 1), fill(k, block * kvw, -1, 1), fill(v, block * kvw, -1, 1);
    fill(rk, cap * kvw, -1, 1), fill(rv, cap * kvw, -1, 1);
    const float scale = (float)pow((double)hd, -0.5);
    double *sc = (double *)hmalloc(((size_t)cap + block) * sizeof(double));
    for (int i = 0; i < block; i++)
        for (int h = 0; h < heads; h++) {
            const int kh = h / (heads / kvh), qp = n_ctx + i;
            int c0 = lo;
            if (n_ctx - cap > c0) c0 = n_ctx - cap;
            if (window > 0 && qp - window + 1 > c0) c0 = qp - window + 1;
            const int nc = n_ctx > c0 ? n_ctx - c0 : 0;
            int b0 = 0, b1 = causal ? i + 1 : block;
            if (window > 0) {
                if (i - window + 1 > b0) b0 = i - window + 1;
                if (!causal && i + window < b1) b1 = i + window;
            }
            const float *qi = q + i * qw + (size_t)h * hd;
            int n = 0;
            double mx = -INFINITY, sum = 0;
            for (int t = 0; t < nc + b1 - b0; t++) {
                const float *kt = t < nc ? rk + (size_t)((c0 + t) % cap) * kvw : k + (size_t)(b0 + t - nc) * kvw;
                double d = 0;
                for (int e = 0; e < hd; e++) d += (double)qi[e] * kt[(size_t)kh * hd + e];
                sc[n++] = d * scale;
                if (d * scale > mx) mx = d * scale;
            }
            for (int t = 0; t < n; t++) sum += sc[t] = exp(sc[t] - mx);
            for (int e = 0; e < hd; e++) {
                double o = 0;
                for (int t = 0; t < n; t++) {
                    const float *vt = t < nc ? rv + (size_t)((c0 + t) % cap) * kvw : v + (size_t)(b0 + t - nc) * kvw;
                    o += sc[t] / sum * vt[(size_t)kh * hd + e];
                }
                ref[i * qw + (size_t)h * hd + e] = (float)o;
            }
        }
    float *dq = dcopy(q, block * qw), *dk = dcopy(k, block * kvw), *dv = dcopy(v, block * kvw);
    float *drk = dcopy(rk, cap * kvw), *drv = dcopy(rv, cap * kvw), *dout = dfloats(block * qw);
    poison(dout, block * qw * 4);
    splash_cuda_dflash_attn_args a = {};
    a.q = dq, a.ldq = qw, a.k = dk, a.v = dv, a.ldkv = kvw, a.ring_k = drk, a.ring_v = drv, a.o = dout, a.ldo = qw;
    a.block = block, a.heads = heads, a.kv_heads = kvh, a.head_dim = hd, a.n_ctx = n_ctx, a.lo = lo, a.cap = cap;
    a.window = window, a.causal = causal, a.scale = scale;
    a.ws_bytes = splash_cuda_dflash_attention_workspace_bytes(block, heads, hd, cap + block);
    a.ws = dmalloc(a.ws_bytes);
    const int rc = splash_cuda_dflash_attention(&a, NULL);
    down(got, dout, block * qw * 4);
    const double err = rc ? INFINITY : rel_err(got, ref, block * qw);
    const double us = time_us([&](int) { return splash_cuda_dflash_attention(&a, NULL); });
    const int held = n_ctx - lo < cap ? n_ctx - lo : cap;
    char sh[80];
    snprintf(sh, sizeof sh, "%s %d rows, %d/%d x %d, %d ctx%s%s", name, block, heads, kvh, hd, held,
             window ? " sliding" : "", causal ? " causal" : "");
    report("dflash block attention", sh, err, 1e-5, us, ((double)held + block) * kvw * 8 + 2.0 * block * qw * 4);
    /* the same with n_ctx and lo read on the device and the launch sized for the ring's every
     * key (a captured graph's form): the same bits; the arguments' own n_ctx / lo are ignored */
    int32_t *dctx = (int32_t *)dmalloc(2 * sizeof(int32_t));
    const int32_t ctx[2] = {n_ctx, lo};
    up(dctx, ctx, sizeof ctx);
    splash_cuda_dflash_attn_args b = a;
    b.ctx_dev = dctx, b.max_keys = cap + block, b.n_ctx = 0, b.lo = 0;
    float *got2 = hfloats(block * qw);
    poison(dout, block * qw * 4);
    int rc2 = splash_cuda_dflash_attention(&b, NULL);
    down(got2, dout, block * qw * 4);
    double err2 = rc2 || memcmp(got, got2, block * qw * 4) ? INFINITY : 0;
    b.max_keys = block - 1; /* fewer than the block's own keys: refused */
    if (splash_cuda_dflash_attention(&b, NULL) != SPLASH_E_INVALID) err2 = INFINITY;
    report("dflash attention, ctx on device", sh, err2, 0, 0, 0);
    free(got2);
    cudaFree(dctx);
    free(q), free(k), free(v), free(rk), free(rv), free(ref), free(got), free(sc);
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(drk), cudaFree(drv), cudaFree(dout), cudaFree(a.ws);
}

/* The conv (bitwise: dflash2.c's fmaf chain) and the logit transform (tanhf may differ by an ulp). */
static void test_dflash_conv(const char *name, int rows, int hidden, int K, int group, int V) {
    const int G = hidden / group, P = 2 * K * G;
    float *x = hfloats((size_t)rows * hidden), *base = hfloats((size_t)2 * K * hidden), *dyn = hfloats((size_t)rows * P);
    float *ref = hfloats((size_t)rows * hidden), *got = hfloats((size_t)rows * hidden);
    fill(x, (size_t)rows * hidden, -2, 2), fill(base, (size_t)2 * K * hidden, -1, 1), fill(dyn, (size_t)rows * P, -1, 1);
    float *dx = dcopy(x, (size_t)rows * hidden), *db = dcopy(base, (size_t)2 * K * hidden), *dd = dcopy(dyn, (size_t)rows * P);
    float *dout = dfloats((size_t)rows * hidden);
    for (int side = 0; side < 2; side++) {
        for (int t = 0; t < rows; t++)
            for (int c = 0; c < hidden; c++) {
                float o = 0;
                for (int s = 0; s < K && s <= t; s++)
                    o = fmaf(base[((size_t)side * K + s) * hidden + c] + dyn[(size_t)t * P + ((size_t)side * K + s) * G + c / group],
                             x[(size_t)(t - s) * hidden + c], o);
                ref[(size_t)t * hidden + c] = o;
            }
        poison(dout, (size_t)rows * hidden * 4);
        const float *bs = db + (size_t)side * K * hidden;
        int rc = splash_cuda_dflash_conv(dx, hidden, rows, hidden, bs, dd, P, side, K, group, dout, hidden, NULL);
        down(got, dout, (size_t)rows * hidden * 4);
        double err = rc ? INFINITY : 0;
        for (size_t i = 0; i < (size_t)rows * hidden; i++) err += memcmp(&got[i], &ref[i], 4) != 0;
        double us = time_us([&](int) {
            return splash_cuda_dflash_conv(dx, hidden, rows, hidden, bs, dd, P, side, K, group, dout, hidden, NULL);
        });
        char sh[80];
        snprintf(sh, sizeof sh, "%s %d x %d, K %d, group %d, side %d (bits)", name, rows, hidden, K, group, side);
        report("dflash conv", sh, err, 0, us, (double)rows * hidden * 8 + (double)rows * P * 4);
    }
    /* transform: l * 3, then tanh(l / 6) * 6 */
    float *l = hfloats((size_t)rows * V), *lr = hfloats((size_t)rows * V);
    fill(l, (size_t)rows * V, -12, 12);
    for (size_t i = 0; i < (size_t)rows * V; i++) lr[i] = tanhf(l[i] * 3.0f / 6.0f) * 6.0f;
    float *dl = dcopy(l, (size_t)rows * V);
    int rc = splash_cuda_dflash_logits_transform(dl, V, rows, V, 3.0f, 6.0f, NULL);
    down(l, dl, (size_t)rows * V * 4);
    double err = rc ? INFINITY : rel_err(l, lr, (size_t)rows * V);
    double us = time_us([&](int) { return splash_cuda_dflash_logits_transform(dl, V, rows, V, 1.0f, 6.0f, NULL); });
    char sh[64];
    snprintf(sh, sizeof sh, "%s %d x %d, x3, cap 6", name, rows, V);
    report("dflash logit transform", sh, err, 1e-6, us, (double)rows * V * 8);
    free(x), free(base), free(dyn), free(ref), free(got), free(l), free(lr);
    cudaFree(dx), cudaFree(db), cudaFree(dd), cudaFree(dout), cudaFree(dl);
}

/* An append pass's ring write against a host copy, bitwise: 3 lanes' rows (one
 * lane longer than its ring, so its early rows map to slots its later rows
 * take: the kernel must leave them to the later rows, whatever the order its
 * blocks run in), padding rows of no lane, and a lane past the ring's wrap;
 * slots no row writes keep their bytes. */
static void test_dflash_ring_write(const char *name, int width, int cap) {
    const int lanes = 3, n[lanes] = {cap + cap / 2 + 3, 5, 1}, p0[lanes] = {7, 3 * cap - 2, 0};
    int rows = 0;
    for (int j = 0; j < lanes; j++) rows += n[j];
    const int padded = rows + 4;
    const size_t lds = (size_t)width + 8, stride = (size_t)cap * width + 64; /* lanes' rings apart, row stride > width */
    float *k = hfloats((size_t)padded * lds), *v = hfloats((size_t)padded * lds);
    float *rk = hfloats(lanes * stride), *rv = hfloats(lanes * stride), *gk = hfloats(lanes * stride), *gv = hfloats(lanes * stride);
    fill(k, (size_t)padded * lds, -1, 1), fill(v, (size_t)padded * lds, -1, 1);
    fill(rk, lanes * stride, -1, 1), fill(rv, lanes * stride, -1, 1);
    int32_t *pos = (int32_t *)hmalloc(padded * 4), *lane = (int32_t *)hmalloc(padded * 4), *end = (int32_t *)hmalloc(padded * 4);
    float *dk = dcopy(k, (size_t)padded * lds), *dv = dcopy(v, (size_t)padded * lds);
    float *drk = dcopy(rk, lanes * stride), *drv = dcopy(rv, lanes * stride);
    for (int j = 0, r = 0; j < lanes; j++)
        for (int i = 0; i < n[j]; i++, r++) pos[r] = p0[j] + i, lane[r] = j, end[r] = p0[j] + n[j];
    for (int r = rows; r < padded; r++) pos[r] = r, lane[r] = -1, end[r] = 0;
    for (int r = 0; r < padded; r++) /* the reference: every row in order, the later rows winning */
        if (lane[r] >= 0) {
            const size_t at = (size_t)lane[r] * stride + (size_t)(pos[r] % cap) * width;
            memcpy(rk + at, k + r * lds, (size_t)width * 4), memcpy(rv + at, v + r * lds, (size_t)width * 4);
        }
    int32_t *dpos = (int32_t *)dmalloc(padded * 4), *dlane = (int32_t *)dmalloc(padded * 4), *dend = (int32_t *)dmalloc(padded * 4);
    up(dpos, pos, padded * 4), up(dlane, lane, padded * 4), up(dend, end, padded * 4);
    int rc = splash_cuda_dflash_ring_write_rows(dk, dv, lds, padded, width, drk, drv, stride, cap, dpos, dlane, dend, NULL);
    down(gk, drk, lanes * stride * 4), down(gv, drv, lanes * stride * 4);
    double err = rc ? INFINITY : 0;
    for (size_t i = 0; i < lanes * stride; i++) err += memcmp(&gk[i], &rk[i], 4) != 0 || memcmp(&gv[i], &rv[i], 4) != 0;
    double us = time_us([&](int) {
        return splash_cuda_dflash_ring_write_rows(dk, dv, lds, padded, width, drk, drv, stride, cap, dpos, dlane, dend, NULL);
    });
    char sh[96];
    snprintf(sh, sizeof sh, "%s %d rows (%d padding) x %d, ring %d (bits)", name, rows, padded - rows, width, cap);
    report("dflash ring write", sh, err, 0, us, (double)rows * width * 16);
    free(k), free(v), free(rk), free(rv), free(gk), free(gv), free(pos), free(lane), free(end);
    cudaFree(dk), cudaFree(dv), cudaFree(drk), cudaFree(drv), cudaFree(dpos), cudaFree(dlane), cudaFree(dend);
}

/* top-k (exact: dflash2.c's candidates: descending, equal values by lower id, no -inf / NaN),
 * then the selector's edges against a double reference. */
static void test_dflash_select(const char *name, int rows, int V, int k, int rank) {
    const size_t N = (size_t)rows * V;
    float *x = hfloats(N);
    for (size_t i = 0; i < N; i++) x[i] = (float)(int)(rnd(-8, 8) * 64) / 64.0f; /* many ties */
    x[3] = NAN, x[V + 5] = -INFINITY, x[2 * (size_t)V + V - 1] = 100.0f, x[2 * (size_t)V + 7] = 100.0f;
    int32_t *want = (int32_t *)hmalloc((size_t)rows * k * 4), *got = (int32_t *)hmalloc((size_t)rows * k * 4);
    float *wval = hfloats((size_t)rows * k), *gval = hfloats((size_t)rows * k);
    int32_t *gn = (int32_t *)hmalloc(rows * 4);
    int short_rows = 0; /* the CPU's top-k is the reference (every row has k finite values) */
    for (int r = 0; r < rows; r++)
        short_rows += cpu_top_k(x + (size_t)r * V, V, k, NULL, want + (size_t)r * k, wval + (size_t)r * k) != k;
    float *dx = dcopy(x, N), *dval = dfloats((size_t)rows * k);
    int32_t *dc = (int32_t *)dmalloc((size_t)rows * k * 4), *dn = (int32_t *)dmalloc(rows * 4);
    const size_t wsb = splash_cuda_topk_workspace_bytes(rows, V, k);
    void *ws = dmalloc(wsb);
    int rc = splash_cuda_topk(dx, V, rows, V, k, dc, dval, k, dn, ws, wsb, NULL);
    down(got, dc, (size_t)rows * k * 4), down(gval, dval, (size_t)rows * k * 4), down(gn, dn, rows * 4);
    double err = rc ? INFINITY : short_rows;
    for (int r = 0; r < rows; r++) err += gn[r] != k;
    for (size_t i = 0; i < (size_t)rows * k; i++) err += got[i] != want[i] || gval[i] != wval[i];
    double us = time_us([&](int) { return splash_cuda_topk(dx, V, rows, V, k, dc, dval, k, dn, ws, wsb, NULL); });
    char sh[80];
    snprintf(sh, sizeof sh, "%s %d x %d, k %d (ties, NaN, -inf)", name, rows, V, k);
    report("dflash top-k", sh, err, 0, us, (double)N * 4);
    /* the largest k it takes (the model's max_top): past it the call refuses */
    const int kmax = splash_cuda_topk_max_k(V);
    int bounds = kmax == (V < 64 ? V : 64) ? 0 : 1;
    bounds += splash_cuda_topk_max_k(400000) != 60; /* 98 chunks of 4,096: 5,888 / 98 */
    if (kmax < 64) bounds += splash_cuda_topk(dx, V, rows, V, kmax + 1, dc, dval, k, dn, ws, wsb, NULL) != SPLASH_E_INVALID;
    snprintf(sh, sizeof sh, "%s: the largest k (%d) and past it", name, kmax);
    report("dflash top-k", sh, bounds, 0, -1, 0);
    /* edges: gate [rows][rank], pred rows [1 + (rows-1) k][rank], succ rows [rows k][rank] */
    const size_t np = 1 + (size_t)(rows - 1) * k, ns = (size_t)rows * k;
    float *gate = hfloats((size_t)rows * rank), *pred = hfloats(np * rank), *succ = hfloats(ns * rank);
    float *ref = hfloats(ns * k), *ge = hfloats(ns * k);
    fill(gate, (size_t)rows * rank, -1, 1), fill(pred, np * rank, -1, 1), fill(succ, ns * rank, -1, 1);
    for (size_t i = 0; i < ns * k; i++) ref[i] = 0;
    for (int i = 0; i < rows; i++)
        for (int p = 0; p < (i ? k : 1); p++)
            for (int j = 0; j < k; j++) {
                const float *pr = pred + (i ? 1 + (size_t)(i - 1) * k + p : 0) * rank;
                double d = 0;
                for (int r = 0; r < rank; r++)
                    d += (double)(pr[r] * gate[(size_t)i * rank + r]) * succ[((size_t)i * k + j) * rank + r];
                ref[((size_t)i * k + p) * k + j] = (float)(wval[(size_t)i * k + j] + d);
            }
    float *dg = dcopy(gate, (size_t)rows * rank), *dp = dcopy(pred, np * rank), *ds = dcopy(succ, ns * rank);
    float *de = dfloats(ns * k);
    SPLASH_CUDA_CHECK(cudaMemset(de, 0, ns * k * 4)); /* row 0 writes p = 0 only */
    rc = splash_cuda_dflash_edges(dg, dp, ds, dval, dn, rows, k, rank, de, NULL);
    down(ge, de, ns * k * 4);
    err = rc ? INFINITY : rel_err(ge, ref, ns * k);
    us = time_us([&](int) { return splash_cuda_dflash_edges(dg, dp, ds, dval, dn, rows, k, rank, de, NULL); });
    snprintf(sh, sizeof sh, "%s %d rows x %d x %d, rank %d", name, rows, k, k, rank);
    report("dflash selector edges", sh, err, 1e-5, us, (double)(np + ns) * rank * 4);
    free(x), free(want), free(got), free(wval), free(gval), free(gn), free(gate), free(pred), free(succ), free(ref), free(ge);
    cudaFree(dx), cudaFree(dval), cudaFree(dc), cudaFree(dn), cudaFree(ws), cudaFree(dg), cudaFree(dp), cudaFree(ds),
        cudaFree(de);
}

/* ==== argument errors ====================================================================== */

static void test_errors(void) {
    double bad = 0;
    splash_cuda_kv_layout l;
    bad += splash_cuda_kv_layout_init(&l, 7, 1, 1, 64, 32) != SPLASH_E_UNSUPPORTED;
    bad += splash_cuda_kv_layout_init(&l, SPLASH_KV_INT8, 1, 1, 100, 32) != 0; /* valid layout ... */
    splash_cuda_attn_args a;
    memset(&a, 0, sizeof a);
    int dummy;
    a.layout = &l, a.pool = (const uint8_t *)&dummy, a.lanes = (const splash_cuda_attn_lane *)&dummy;
    a.q = (const float *)&dummy, a.out = (float *)&dummy, a.workspace = &dummy;
    a.n_lanes = a.rows = a.max_lane_rows = a.max_ctx = 1, a.n_heads = 1;
    bad += splash_cuda_attention(&a, NULL) != SPLASH_E_UNSUPPORTED; /* ... but head_dim 100 has no kernel */
    splash_cuda_gdn_args g;
    memset(&g, 0, sizeof g);
    g.lanes = (const splash_cuda_gdn_lane *)&dummy, g.mixed = g.a = g.b = g.neg_a = g.dt_bias = (const float *)&dummy;
    g.n_lanes = 1, g.hk = 2, g.hv = 3, g.dk = 128, g.dv = 128;
    bad += splash_cuda_gdn_recurrent(&g, NULL) != SPLASH_E_INVALID; /* hv not a multiple of hk */
    g.hv = 4, g.dk = 96;
    bad += splash_cuda_gdn_recurrent(&g, NULL) != SPLASH_E_UNSUPPORTED;
    /* the chunked kernel's shapes: dv a multiple of 8 (its tensor-core column tiles); the
     * model runs other shapes' lanes through the recurrence when the workspace size is 0 */
    bad += splash_cuda_gdn_chunked_ws_floats(4, 128, 44, 1, 1) != 0;
    bad += splash_cuda_gdn_chunked_ws_floats(4, 96, 128, 1, 1) != 0;
    bad += splash_cuda_gdn_chunked_ws_floats(4, 128, 48, 1, 1) == 0;
    g.dk = 128, g.dv = 44, g.max_lane_rows = 64, g.ws = (float *)&dummy, g.ws_floats = 1u << 30;
    bad += splash_cuda_gdn_chunked(&g, NULL) != SPLASH_E_UNSUPPORTED;
    bad += splash_cuda_moe_route((const float *)&dummy, 8, 1, 8, 9, 1, -1, NULL, 0, (int32_t *)&dummy, (float *)&dummy,
                                 NULL, NULL) != SPLASH_E_INVALID; /* top_k > experts */
    bad += splash_cuda_moe_route((const float *)&dummy, 8, 1, 8, 2, 1, 8, NULL, 0, (int32_t *)&dummy, (float *)&dummy,
                                 NULL, NULL) != SPLASH_E_INVALID; /* a shared slot without its logits */
    bad += splash_cuda_moe_route((const float *)&dummy, 8, 1, 8, 2, 1, SPLASH_CUDA_MOE_MAX_EXPERTS, (const float *)&dummy,
                                 1, (int32_t *)&dummy, (float *)&dummy, (int32_t *)&dummy,
                                 NULL) != SPLASH_E_INVALID; /* a planned shared id past what the grouped step takes */
    bad += splash_cuda_rmsnorm((const float *)&dummy, 1, 0, (float *)&dummy, 1, 0, NULL, 1.f, 1, 1, 1, kEps, NULL) !=
           SPLASH_E_INVALID;
    report("argument errors refused", "-", bad, 0, -1, 0);
}

/* Every GDN op at every shape. */
static void test_gdn(void) {
    const GdnLaneSpec lanes[4] = {{1, 1}, {16, 0}, {2, 1}, {100, 1}};
    const GdnLaneSpec few[4] = {{1, 1}, {16, 0}, {2, 1}, {5, 1}}; /* <= 16 rows a lane: the early conv's launches */
    const GdnLaneSpec rec[4] = {{1, 1}, {16, 0}, {40, 1}, {8, 2}};
    const int chunk_rows[3] = {200, 64, 5}, chunk_rows_big[2] = {130, 1};
    for (int i = 0; i < n_shapes(); i++) {
        const Shape *sh = shape_at(i);
        const int big = sh->hidden > 1024;
        test_gdn_conv(sh, lanes, 4);
        test_gdn_conv(sh, few, 4);
        test_gdn_gates(sh, 16);
        test_gdn_recurrent(sh, rec, 4);
        test_gdn_chunked(sh, big ? chunk_rows_big : chunk_rows, big ? 2 : 3, big ? 1024 : 256);
    }
}

/* Section 3: KV write and attention (--attention: alone). */
static void test_attention_all(void) {
    const LaneSpec tiny[3] = {{0, 5}, {40, 1}, {100, 16}};
    const int fmts[3] = {SPLASH_KV_INT8, SPLASH_KV_BF16, SPLASH_KV_F32};
    for (int f = 0; f < 3; f++) {
        test_kv_write(&kTiny, fmts[f], tiny, 3);
        test_attention(&kTiny, fmts[f], tiny, 3, f == 0, 1e-5, 0);
    }
    /* a lane's rows across a split's end (128; the long split's 4,096): in one
     * block, vectors of one split (written by the split kernel) beside longer ones */
    const LaneSpec edge[2] = {{120, 16}, {4090, 12}};
    test_attention(&kTiny, SPLASH_KV_INT8, edge, 2, 1, 1e-5, 0);
    const LaneSpec moe_tiny[2] = {{7, 16}, {63, 2}};
    test_attention(&kTinyMoe, SPLASH_KV_INT8, moe_tiny, 2, 1, 1e-5, 0);
    test_attention(&kTinyMoe, SPLASH_KV_BF16, moe_tiny, 2, 0, 1e-5, 0);
    if (!g_quick) {
        /* 2047 and 3000 (16 and 24 splits of 128) alone take the small combine, in the
         * batch (5000: 40 splits) the wide one: the lane-alone check holds them equal */
        const LaneSpec dec[5] = {{37, 1}, {700, 1}, {2047, 1}, {3000, 1}, {5000, 1}};
        const LaneSpec ver[2] = {{300, 16}, {4000, 16}};
        const LaneSpec mix[2] = {{1000, 16}, {10, 1}};
        const LaneSpec dec32k[1] = {{32767, 1}};
        const LaneSpec ver32k[1] = {{32752, 16}};
        const LaneSpec edge27[2] = {{120, 16}, {4090, 12}};
        for (int f = 0; f < 2; f++) {
            const int fmt = f ? SPLASH_KV_BF16 : SPLASH_KV_INT8;
            test_kv_write(&k27B, fmt, ver, 2);
            test_attention(&k27B, fmt, dec, 5, 0, 1e-5, 0);
            test_attention(&k27B, fmt, ver, 2, 1, 1e-5, 0);
            test_attention(&k35B, fmt, mix, 2, 1, 1e-5, 0);
        }
        test_attention(&k27B, SPLASH_KV_INT8, edge27, 2, 1, 1e-5, 0);
        test_attention(&kHd128, SPLASH_KV_INT8, ver, 2, 1, 1e-5, 0);
        test_attention(&kHd128, SPLASH_KV_INT8, mix, 2, 0, 1e-5, 0);
        test_attention(&k27B, SPLASH_KV_INT8, dec32k, 1, 0, 1e-5, 1);
        test_attention(&k27B, SPLASH_KV_INT8, ver32k, 1, 1, 1e-5, 1);
        test_attention(&k35B, SPLASH_KV_INT8, ver32k, 1, 1, 1e-5, 1);
        /* lanes with splits of their own (the default split: lane_split_len):
         * a 32K verify lane (512 positions), a 16K decode row (256) and a
         * short verify lane (128) in one call, each alone the batch's bits */
        const LaneSpec own[3] = {{32752, 8}, {16000, 1}, {300, 8}};
        test_attention(&k27B, SPLASH_KV_INT8, own, 3, 1, 1e-5, 1);
        test_attention(&k35B, SPLASH_KV_INT8, own, 3, 0, 1e-5, 0);
        test_attention(&k27B, SPLASH_KV_BF16, own, 3, 0, 1e-5, 0);
        using splash_cuda::lane_split_len;
        const int ls_bad = lane_split_len(128, 1, 64) != 128 || lane_split_len(128, 8192, 64) != 128 ||
                           lane_split_len(128, 8193, 64) != 256 || lane_split_len(128, 32768, 64) != 512 ||
                           lane_split_len(128, 32769, 64) != 1024 || lane_split_len(128, 32768, 128) != 256 ||
                           lane_split_len(64, 4097, 64) != 128;
        report("attention: a lane's own split", "at most 64 / 128 splits", ls_bad ? INFINITY : 0.0, 0, -1, 0);
        /* the bulk lanes' split (attention.h): a prompt in one forward one
         * split; a 2,048-row chunk deep in its context a few; a short lane
         * far in the shortest long split */
        const struct { const Shape *s; int rows, ctx, split; } bs[6] = {
            {&k27B, 32768, 32768, 32768}, {&k27B, 2048, 30000, 8192}, {&k27B, 64, 100000, 4096},
            {&k27B, 4096, 4096, 4096},    {&k35B, 32768, 32768, 32768}, {&k35B, 2048, 30000, 8192}};
        int bad = 0;
        for (int i = 0; i < 6; i++)
            bad |= splash_cuda_attn_bulk_split(bs[i].rows, bs[i].ctx, bs[i].s->heads, bs[i].s->kv_heads) != bs[i].split;
        report("attention: bulk lanes' split", "27B, 35B-A3B", bad ? INFINITY : 0.0, 0, -1, 0);
        /* prefill-sized lanes (the long split's flash kernel: blocks of 128
         * query vectors, a lane across the split's end at 4,096) */
        const LaneSpec pre[2] = {{3900, 300}, {0, 200}};
        test_attention(&k27B, SPLASH_KV_INT8, pre, 2, 1, 1e-5, 0);
        test_attention(&k35B, SPLASH_KV_INT8, pre, 2, 1, 1e-5, 0);
        test_attention(&kHd128, SPLASH_KV_INT8, pre, 2, 0, 1e-5, 0);
    }
}

int main(int argc, char **argv) {
    int moe_only = 0, gdn_only = 0, dense_only = 0, attn_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) g_quick = 1;
        else if (!strcmp(argv[i], "--no-timing")) g_notime = 1;
        else if (!strcmp(argv[i], "--moe")) moe_only = 1;
        else if (!strcmp(argv[i], "--gdn")) gdn_only = 1;
        else if (!strcmp(argv[i], "--dense")) dense_only = 1;
        else if (!strcmp(argv[i], "--attention")) attn_only = 1;
        else {
            fprintf(stderr, "usage: test_cuda_ops [--quick] [--no-timing] [--moe | --gdn | --dense | --attention]\n");
            return 2;
        }
    }
    cudaDeviceProp prop;
    SPLASH_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    for (int i = 0; i < 2 * 32; i++) SPLASH_CUDA_CHECK(cudaEventCreate(&g_ev[i]));
    if (cpu_ctx_init(&g_cpu, 0, 64, 8192)) {
        fprintf(stderr, "cpu_ctx_init failed\n");
        return 1;
    }
    printf("CPU reference: %d threads, SIMD %d\n", g_cpu.n_threads, cpu_simd());
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (moe_only) { /* the MoE experts steps alone (--quick: the fixture's shape only) */
        test_moe(&kTinyMoe, 40);
        test_moe(&kTinyMoe, 100);
        if (!g_quick) { /* verify blocks (SPLASH_Q4_PLAN_GROUP=2 / 4 times the planned groups' two kernels) */
            test_moe(&k35B, 8);
            test_moe(&k35B, 16);
        }
        print_table();
        return g_fail ? 1 : 0;
    }

    if (gdn_only) { /* the GDN ops alone */
        test_gdn();
        print_table();
        return g_fail ? 1 : 0;
    }
    if (attn_only) { /* KV write and attention alone (an attention switch's check) */
        test_attention_all();
        print_table();
        return g_fail ? 1 : 0;
    }
    if (dense_only) { /* dense_matmul alone */
        test_dense_all();
        print_table();
        return g_fail ? 1 : 0;
    }
    test_errors();

    /* 1. norms */
    test_rmsnorm("tiny", kTiny.hidden, 16);
    if (!g_quick) {
        test_rmsnorm("27B", k27B.hidden, 1);
        test_rmsnorm("27B", k27B.hidden, 16);
        test_rmsnorm("35B-A3B", k35B.hidden, 16);
    }
    for (int i = 0; i < n_shapes(); i++) {
        test_rmsnorm_gated(shape_at(i), 16);
        test_l2norm(shape_at(i), 16);
    }

    /* 2. rotary, attention prep, output gate */
    for (int i = 0; i < n_shapes(); i++) {
        test_rope(shape_at(i), 16);
        test_attn_prep(shape_at(i), 16);
    }

    /* 3. KV write and attention */
    test_attention_all();

    /* 4. GDN */
    test_gdn();

    /* 5. MoE and the FFN's elementwise ops */
    test_moe(&kTinyMoe, 16);
    test_moe(&kTinyMoe, 40); /* every row on expert 3: groups of 16, 16, 8 */
    test_moe(&kTinyMoe, 100); /* expert 3 in two tiles of the GEMM step */
    test_moe(&kMoeK8, 2100);  /* the GEMM step in chunks of 2,048 rows */
    test_prep_rmsnorm_moe(128, 5, 3);   /* one block a row (a cluster of one) */
    test_prep_rmsnorm_moe(640, 3, 9);   /* 10 groups: a cluster of 2, the second block's 2 */
    test_prep_rmsnorm_moe(2048, 1, 9);  /* the 35B-A3B's decode row */
    test_prep_rmsnorm_moe(2048, 16, 9); /* and 16-row verify */
    test_prep_rmsnorm_moe(4096, 7, 16); /* a cluster of 8, the most slots */
    test_prep_rmsnorm_moe(8192, 2, 9);  /* refused */
    test_route_plan_wide();
    test_group_plan();
    test_route_edges(256);
    test_route_edges(SPLASH_CUDA_MOE_MAX_EXPERTS - 1);
    test_elementwise(&kTiny, 16, 192);
    test_dense_all();
    if (!g_quick) {
        test_moe(&k35B, 1);
        test_moe(&k35B, 8);
        test_moe(&k35B, 16); /* a 16-row verify block: 128 / 144 slots */
        test_elementwise(&k27B, 16, 17408);
        test_elementwise(&k35B, 16, 512);
    }

    /* 6. argmax */
    test_argmax("tiny", 16, 512, kTiny.hidden);
    if (!g_quick) {
        test_argmax("vocab", 1, 248320, 5120);
        test_argmax("vocab", 16, 248320, 5120);
    }

    /* 7. the DFlash draft's own ops: the fixtures' drafts (dflash-tiny, dflash2-tiny) and a
     * draft of the 27B's widths (32 / 8 heads x 128, hidden 5120, window 2048) */
    test_dflash_attention("tiny", 8, 4, 2, 32, 37, 0, 16, 16, 0);
    test_dflash_attention("tiny", 16, 4, 2, 32, 87, 0, 40, 0, 1);
    test_dflash_attention("tiny, seek", 4, 4, 2, 64, 30, 10, 40, 0, 0);
    test_dflash_attention("tiles masked", 8, 4, 2, 32, 500, 0, 200, 50, 0);  /* early tiles: no key visible */
    test_dflash_attention("2 query tiles", 16, 16, 2, 64, 200, 0, 128, 0, 1); /* 128 queries a kv head */
    test_dflash_conv("tiny", 16, 128, 2, 16, 512);
    test_dflash_ring_write("tiny", 64, 16);
    test_dflash_select("tiny", 15, 512, 16, 64);
    if (!g_quick) {
        test_dflash_attention("27B draft", 16, 32, 8, 128, 5000, 0, 2048, 2048, 0);
        test_dflash_attention("27B draft", 16, 32, 8, 128, 300, 0, 2048, 0, 0);
        test_dflash_conv("27B draft", 16, 5120, 2, 16, 248320);
        test_dflash_ring_write("27B draft", 1024, 2048);
        test_dflash_select("vocab", 15, 248320, 16, 256);
        test_dflash_select("vocab", 15, 248320, 64, 256);
    }

    print_table();
    cpu_ctx_free(&g_cpu);
    return g_fail ? 1 : 0;
}
