/* host_emulation.cpp - the CUDA backend's C API (the headers of src/backend/cuda) and
 * the few CUDA runtime calls the CUDA model makes, implemented on the host
 * with the CPU backend, so that the CUDA model's orchestration
 * (src/models/qwen35/cuda_*.cu: weights, descriptor, lanes, row chunks,
 * verify save and commit replay, taps, logits) runs and is tested on a
 * machine without a GPU:
 *
 *   tools/gpu_tests.sh --emulate
 *
 * links test_cuda_model with the model's objects, this file (instead of the
 * kernels and libcudart: nvcc -cudart none) and libsplash.a.  Host C++ (a
 * .cpp: compiled as .cu, nvcc's device-runtime header would already define
 * cudaMalloc and friends).  "Device"
 * memory is host memory; every op is its CPU reference (cpu_matmul,
 * cpu_attention, cpu_gdn_*, ...), so a correct orchestration gives logits
 * equal or very close to the CPU model's, and a wrong stride, lane or offset
 * gives errors of order 1.  The kernels themselves are tested on the GPU by
 * test_cuda_ops; this file says nothing about them.
 *
 * Simplifications that the model cannot see: q4 "tiles" are the canonical
 * q4 bytes (splash_q4_tiled_bytes = the canonical size), a prepared q4
 * activation holds x as fp32, streams are synchronous, and the one error a
 * call can report is bad arguments.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

extern "C" {
#include "backend/cpu/cpu.h"
#include "package/tensor.h"
#include "models/dflash/dflash2.h"
}
#include "backend/cuda/act.h"
#include "backend/cuda/argmax.h"
#include "backend/cuda/blas.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/q4_gemm.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dense_matmul.h"
#include "backend/cuda/dflash.h"
#include "backend/cuda/gdn.h"
#include "backend/cuda/greedy.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/norm.h"
#include "backend/cuda/q4_matmul.h"
#include "backend/cuda/rope.h"
#include "backend/cuda/rows.h"

/* ---- the CUDA runtime calls, on host memory ---------------------------------------- */

extern "C" {
cudaError_t cudaMalloc(void **p, size_t n) {
    *p = aligned_alloc(256, (n + 255) & ~(size_t)255);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) { return cudaMalloc(p, n); }
cudaError_t cudaFreeHost(void *p) { return cudaFree(p); }
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind) {
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind, cudaStream_t) {
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *d, int v, size_t n) {
    memset(d, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t) { return cudaMemset(d, v, n); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int) {
    *s = (cudaStream_t)malloc(1);
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    free(s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
/* Events order streams; the emulated ops run as they are called, in order. */
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int) {
    *e = (cudaEvent_t)malloc(1);
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    free(e);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
/* The "device" is host memory: what the host has free. */
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    const long page = sysconf(_SC_PAGESIZE), avail = sysconf(_SC_AVPHYS_PAGES), all = sysconf(_SC_PHYS_PAGES);
    *free_bytes = avail > 0 && page > 0 ? (size_t)avail * (size_t)page : 0;
    *total_bytes = all > 0 && page > 0 ? (size_t)all * (size_t)page : 0;
    return cudaSuccess;
}
/* Graphs: the emulated ops run as they are called, so nothing can be
 * captured; a capture fails and the model takes its eager path (what it does
 * on a GPU when a capture fails).  The rest is never reached. */
cudaError_t cudaStreamBeginCapture(cudaStream_t, enum cudaStreamCaptureMode) { return cudaErrorStreamCaptureUnsupported; }
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *g) {
    *g = nullptr;
    return cudaErrorStreamCaptureInvalidated;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *, cudaGraph_t, unsigned long long) { return cudaErrorNotSupported; }
cudaError_t cudaGraphDestroy(cudaGraph_t) { return cudaSuccess; }
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t) { return cudaSuccess; }
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t) { return cudaErrorNotSupported; }
const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated error"; }
const char *cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated"; }
}

/* The test asks for the device's name (both spellings of the entry point). */
extern "C" cudaError_t cudaGetDeviceProperties_v2(cudaDeviceProp *p, int) {
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "host emulation (CPU backend)");
    return cudaSuccess;
}
extern "C" cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) { return cudaGetDeviceProperties_v2(p, d); }

/* backend/cuda/device.cu, which runtime/model.c asks before "cuda" is used:
 * one device; its free memory unknown (0: a plan falls back to MemAvailable). */
extern "C" int splash_cuda_device_info(char *name, size_t cap, size_t *free_bytes, size_t *total_bytes) {
    if (name && cap) snprintf(name, cap, "host emulation (CPU backend)");
    if (free_bytes) *free_bytes = 0;
    if (total_bytes) *total_bytes = 0;
    return 1;
}

/* What every nvcc-compiled object calls at start-up to register its (here
 * empty) device code. */
extern "C" void **__cudaRegisterFatBinary(void *) {
    static void *handle;
    return &handle;
}
extern "C" void __cudaRegisterFatBinaryEnd(void **) {}
extern "C" void __cudaUnregisterFatBinary(void **) {}

/* ---- shared state ------------------------------------------------------------------ */

static cpu_ctx *ctx(void) {
    static cpu_ctx c;
    static int ready;
    if (!ready) {
        if (cpu_ctx_init(&c, 1, 512, 8192)) {
            fprintf(stderr, "host emulation: cpu_ctx_init failed\n");
            exit(1);
        }
        ready = 1;
    }
    return &c;
}

static float bf16f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static splash_tensor view(int dtype, int rows, int cols, const void *data) {
    splash_tensor t;
    memset(&t, 0, sizeof t);
    t.name = "emulated";
    t.dtype = (splash_dtype)dtype;
    t.ndim = 2, t.shape[0] = rows, t.shape[1] = cols;
    t.data = (const uint8_t *)data;
    t.bytes = splash_tensor_bytes(t.dtype, 2, t.shape);
    return t;
}

static cpu_attn_lane cpu_lane(const splash_cuda_attn_lane *l) {
    cpu_attn_lane c = {l->pages, l->n_past, l->first_row, l->n_rows};
    return c;
}

/* ---- q4 (canonical bytes stand for the tiles) ---------------------------------------- */

extern "C" size_t splash_q4_tiled_bytes(int rows, int cols) {
    return rows > 0 && cols > 0 && cols % 64 == 0 ? splash_matrix_layout(SPLASH_Q4, rows, cols).bytes : 0;
}
extern "C" size_t splash_q4_tiled_codes_bytes(int rows, int cols) { return splash_q4_tiled_bytes(rows, cols); }
extern "C" int splash_q4_repack_host(const uint8_t *canonical, int rows, int cols, uint8_t *tiled, size_t bytes) {
    const size_t n = splash_q4_tiled_bytes(rows, cols);
    if (!n || bytes < n) return SPLASH_E_INVALID;
    memcpy(tiled, canonical, n);
    return 0;
}
/* Stacked: a canonical matrix of the stack's rows, each part's codes, scales
 * and biases at its first row, zeros between parts. */
extern "C" int splash_q4_stacked_rows(const int *rows, int n) {
    int total = 0;
    for (int i = 0; i < n; i++) total += i < n - 1 ? (rows[i] + 15) / 16 * 16 : rows[i];
    return total;
}
extern "C" int splash_q4_repack_stacked_host(const uint8_t *const *canonical, const int *rows, int n, int cols,
                                             uint8_t *tiled, size_t bytes) {
    const int total = splash_q4_stacked_rows(rows, n);
    const splash_qlayout all = splash_matrix_layout(SPLASH_Q4, total, cols);
    if (bytes < all.bytes) return SPLASH_E_INVALID;
    memset(tiled, 0, all.bytes);
    size_t row0 = 0;
    for (int i = 0; i < n; i++) {
        const splash_qlayout l = splash_matrix_layout(SPLASH_Q4, rows[i], cols);
        const size_t qrow = (size_t)cols / 2, srow = (size_t)(cols / 64) * 2; /* bytes per row: codes, scales */
        memcpy(tiled + all.q_offset + row0 * qrow, canonical[i] + l.q_offset, rows[i] * qrow);
        memcpy(tiled + all.scales_offset + row0 * srow, canonical[i] + l.scales_offset, rows[i] * srow);
        memcpy(tiled + all.biases_offset + row0 * srow, canonical[i] + l.biases_offset, rows[i] * srow);
        row0 += (size_t)(rows[i] + 15) / 16 * 16;
    }
    return 0;
}
extern "C" int splash_q4_matrix_init(splash_q4_matrix *m, const void *dev, int rows, int cols) {
    m->rows = rows, m->cols = cols, m->tiles = (rows + 15) / 16, m->groups = cols / 64;
    m->codes = (const uint8_t *)dev, m->sb = nullptr;
    return 0;
}
extern "C" size_t splash_q4_xprep_bytes(int cap_cols) { return (size_t)SPLASH_Q4_MAX_M * cap_cols * sizeof(float) + 256; }
extern "C" int splash_q4_xprep_init(splash_q4_xprep *xp, void *mem, int cap_cols) {
    memset(xp, 0, sizeof *xp);
    xp->x8 = (int8_t *)mem, xp->cap_cols = cap_cols;
    return 0;
}
static int g_early_loads = 1; /* splash_q4_early_loads (on, as on the device): where loads go changes nothing on the host */
extern "C" int splash_q4_early_loads(void) { return g_early_loads; }
extern "C" void splash_q4_set_early_loads(int on) { g_early_loads = on ? 1 : 0; }
/* A switch the emulation reads as the device does (device_util.cuh's env_switch; that header
 * holds device code, which this host file does not compile): the switches that change what the
 * model calls, not how an op computes. */
static int emu_switch(int *state, const char *name, int on) {
    if (*state < 0) {
        const char *e = getenv(name);
        *state = e && *e ? atoi(e) != 0 : on;
    }
    return *state;
}
static int g_moe_norm = -1; /* splash_q4_moe_norm: as on the device, SPLASH_CUDA_MOE_NORM=0 turns it off */
extern "C" int splash_q4_moe_norm(void) { return emu_switch(&g_moe_norm, "SPLASH_CUDA_MOE_NORM", 1); }
extern "C" void splash_q4_set_moe_norm(int on) { g_moe_norm = on ? 1 : 0; }
static int g_attn_early = 1; /* splash_cuda_attn_early_loads (on, as on the device) */
extern "C" int splash_cuda_attn_early_loads(void) { return g_attn_early; }
extern "C" void splash_cuda_set_attn_early_loads(int on) { g_attn_early = on ? 1 : 0; }
extern "C" int splash_q4_prep_x(splash_q4_xprep *xp, const float *x, int M, int cols, int ldx, struct CUstream_st *) {
    if (M < 1 || M > SPLASH_Q4_MAX_M || cols > xp->cap_cols || ldx < cols) return SPLASH_E_INVALID;
    float *d = (float *)xp->x8;
    for (int m = 0; m < M; m++) memcpy(d + (size_t)m * cols, x + (size_t)m * ldx, (size_t)cols * sizeof(float));
    xp->M = M, xp->cols = cols;
    return 0;
}
extern "C" int splash_q4_matmul(const splash_q4_matrix *w, const splash_q4_xprep *xp, float *y, struct CUstream_st *) {
    if (xp->cols != w->cols) return SPLASH_E_MISMATCH;
    splash_tensor t = view(SPLASH_Q4, w->rows, w->cols, w->codes);
    cpu_matmul(ctx(), &t, xp->M, (const float *)xp->x8, (size_t)w->cols, y, (size_t)w->rows);
    return 0;
}

extern "C" int splash_q4_matmul_add(const splash_q4_matrix *w, const splash_q4_xprep *xp, float *y,
                                    struct CUstream_st *) {
    if (xp->cols != w->cols) return SPLASH_E_MISMATCH;
    float *t = (float *)malloc((size_t)xp->M * w->rows * sizeof(float));
    if (!t) return SPLASH_E_NOMEM;
    splash_tensor v = view(SPLASH_Q4, w->rows, w->cols, w->codes);
    cpu_matmul(ctx(), &v, xp->M, (const float *)xp->x8, (size_t)w->cols, t, (size_t)w->rows);
    for (size_t i = 0; i < (size_t)xp->M * w->rows; i++) y[i] += t[i];
    free(t);
    return 0;
}

/* The prefill GEMM with the GPU's roundings (q4_gemm.h): each row of x
 * scaled by 2^k and rounded to fp16, each weight fp16(scale * q + bias) from
 * fp16 scale and bias; sums in double (the GPU's fp32 tensor-core sums differ
 * from these by far less than the roundings).  x kept as fp32 in hi's place. */
extern "C" int splash_q4_tiled_fp16_ok(const uint8_t *, int, int) { return 1; }
extern "C" size_t splash_q4_gemm_x_bytes(int rows_cap, int cols_cap) {
    return (size_t)rows_cap * cols_cap * sizeof(float) + 256; /* + 256: alpha of the uniform preparation */
}
extern "C" int splash_q4_gemm_x_init(splash_q4_gemm_x *xg, void *mem, int rows_cap, int cols_cap) {
    memset(xg, 0, sizeof *xg);
    xg->hi = (uint16_t *)mem, xg->rows_cap = rows_cap, xg->cols_cap = cols_cap;
    return 0;
}
static int emu_gemm_prep(splash_q4_gemm_x *xg, const float *x, int R, int cols, size_t ldx, struct CUstream_st *) {
    if (R < 1 || R > xg->rows_cap || cols > xg->cols_cap || ldx < (size_t)cols) return SPLASH_E_INVALID;
    float *d = (float *)xg->hi;
    for (int n = 0; n < R; n++) memcpy(d + (size_t)n * cols, x + (size_t)n * ldx, (size_t)cols * sizeof(float));
    xg->R = R, xg->cols = cols;
    return 0;
}
/* y [R][w->rows] (= or +=) W x for x rows of stride ldx, with the GPU GEMM's roundings. */
static int emu_gemm_rows(const splash_q4_matrix *w, const float *xin, int R, size_t ldx, float *y, int add) {
    const splash_qlayout L = splash_matrix_layout(SPLASH_Q4, w->rows, w->cols);
    const int cols = w->cols, groups = cols / 64;
    const uint8_t *codes = w->codes + L.q_offset;
    const uint16_t *sc = (const uint16_t *)(w->codes + L.scales_offset), *bi = (const uint16_t *)(w->codes + L.biases_offset);
    float *xr = (float *)malloc((size_t)cols * sizeof(float));
    if (!xr) return SPLASH_E_NOMEM;
    for (int n = 0; n < R; n++) {
        const float *x = xin + (size_t)n * ldx;
        float mx = 0.f;
        for (int c = 0; c < cols; c++) mx = fmaxf(mx, fabsf(x[c]));
        int e = 0;
        if (mx > 0.f) frexpf(mx, &e);
        const int kk = mx > 0.f ? 14 - e : 0;
        for (int c = 0; c < cols; c++) xr[c] = __half2float(__float2half_rn(ldexpf(x[c], kk)));
        for (int r = 0; r < w->rows; r++) {
            double acc = 0;
            for (int c = 0; c < cols; c++) {
                const uint8_t b = codes[(size_t)r * (cols / 2) + c / 2];
                const int q = (c & 1) ? b >> 4 : b & 15;
                const float s16 = __half2float(__float2half_rn(bf16f(sc[(size_t)r * groups + c / 64])));
                const float b16 = __half2float(__float2half_rn(bf16f(bi[(size_t)r * groups + c / 64])));
                acc += (double)__half2float(__float2half_rn(fmaf((float)q, s16, b16))) * xr[c];
            }
            const float v = ldexpf((float)acc, -kk);
            y[(size_t)n * w->rows + r] = add ? y[(size_t)n * w->rows + r] + v : v;
        }
    }
    free(xr);
    return 0;
}

extern "C" int splash_q4_gemm(const splash_q4_matrix *w, const splash_q4_gemm_x *xg, float *y, int add,
                              struct CUstream_st *) {
    if (xg->cols != w->cols) return SPLASH_E_MISMATCH;
    if (!xg->alpha) return emu_gemm_rows(w, (const float *)xg->hi, xg->R, (size_t)w->cols, y, add);
    /* uniform-prepared (fp16 x 2^k, alpha 2^-k): x as those values */
    float *x = (float *)malloc(sizeof(float) * xg->R * xg->cols);
    if (!x) return SPLASH_E_NOMEM;
    for (size_t i = 0; i < (size_t)xg->R * xg->cols; i++) x[i] = __half2float(((const __half *)xg->hi)[i]) * xg->alpha[0];
    const int rc = emu_gemm_rows(w, x, xg->R, (size_t)w->cols, y, add);
    free(x);
    return rc;
}

/* The cuBLASLt path (blas.h, q4_gemm.h's uniform preparation and fp16
 * expansion) with real fp16 values in device memory's place: x rounded to
 * fp16 after one power of two for all rows, weights fp16(scale * q + bias)
 * from fp16 scale and bias, sums in double. */
/* x 2^k rounded to fp16, k putting mx (the rows' largest |x|, or a bound on it) in [2^13, 2^14) */
static int emu_uniform(splash_q4_gemm_x *xg, const float *x, int R, int cols, size_t ldx, float mx) {
    int e = 0;
    if (mx > 0.f) frexpf(mx, &e);
    const int kk = mx > 0.f ? 14 - e : 0;
    __half *h = (__half *)xg->hi;
    for (int n = 0; n < R; n++)
        for (int c = 0; c < cols; c++) h[(size_t)n * cols + c] = __float2half_rn(ldexpf(x[(size_t)n * ldx + c], kk));
    xg->alpha = (float *)((uint8_t *)xg->hi + (size_t)xg->rows_cap * xg->cols_cap * sizeof(float));
    xg->alpha[0] = ldexpf(1.f, -kk), xg->alpha[1] = 0.f, xg->alpha[2] = 1.f;
    xg->R = R, xg->cols = cols;
    return 0;
}
extern "C" int splash_q4_gemm_prep_uniform(splash_q4_gemm_x *xg, const float *x, int R, int cols, size_t ldx,
                                           struct CUstream_st *) {
    if (R < 1 || R > xg->rows_cap || cols > xg->cols_cap || ldx < (size_t)cols) return SPLASH_E_INVALID;
    float mx = 0.f;
    for (int n = 0; n < R; n++)
        for (int c = 0; c < cols; c++) mx = fmaxf(mx, fabsf(x[(size_t)n * ldx + c]));
    return emu_uniform(xg, x, R, cols, ldx, mx);
}
extern "C" int splash_q4_gemm_prep_uniform_amax(splash_q4_gemm_x *xg, const float *x, int R, int cols, size_t ldx,
                                                struct CUstream_st *s) {
    return splash_q4_gemm_prep_uniform(xg, x, R, cols, ldx, s);
}
extern "C" int splash_q4_gemm_prep(splash_q4_gemm_x *xg, const float *x, int R, int cols, size_t ldx,
                                   struct CUstream_st *s) {
    xg->alpha = nullptr;
    return emu_gemm_prep(xg, x, R, cols, ldx, s);
}
extern "C" int splash_q4_expand_f16(const splash_q4_matrix *w, uint16_t *w16, struct CUstream_st *) {
    const splash_qlayout L = splash_matrix_layout(SPLASH_Q4, w->rows, w->cols);
    const int cols = w->cols, groups = cols / 64;
    const uint8_t *codes = w->codes + L.q_offset;
    const uint16_t *sc = (const uint16_t *)(w->codes + L.scales_offset), *bi = (const uint16_t *)(w->codes + L.biases_offset);
    __half *out = (__half *)w16;
    for (int r = 0; r < w->rows; r++)
        for (int c = 0; c < cols; c++) {
            const uint8_t b = codes[(size_t)r * (cols / 2) + c / 2];
            const int q = (c & 1) ? b >> 4 : b & 15;
            const double s16 = __half2float(__float2half_rn(bf16f(sc[(size_t)r * groups + c / 64])));
            const double b16 = __half2float(__float2half_rn(bf16f(bi[(size_t)r * groups + c / 64])));
            out[(size_t)r * cols + c] = __double2half(q * s16 + b16); /* exact, then one rounding: the GPU's fma */
        }
    return 0;
}
struct splash_cuda_blas {
    int unused;
};
extern "C" int splash_cuda_blas_open(splash_cuda_blas **out) {
    const char *env = getenv("SPLASH_CUDA_BLAS");
    *out = env && !strcmp(env, "0") ? nullptr : (splash_cuda_blas *)calloc(1, sizeof **out);
    return *out ? 0 : SPLASH_E_UNSUPPORTED;
}
extern "C" void splash_cuda_blas_close(splash_cuda_blas *b) { free(b); }
extern "C" int splash_cuda_blas_gemm(splash_cuda_blas *b, const uint16_t *w16, int N, int K, const uint16_t *x16, int R,
                                     const float *alpha, const float *beta, float *y, void *ws, struct CUstream_st *) {
    if (!b || !ws || N < 1 || K < 1 || R < 1) return SPLASH_E_INVALID;
    const __half *w = (const __half *)w16, *x = (const __half *)x16;
    for (int n = 0; n < R; n++)
        for (int r = 0; r < N; r++) {
            double acc = 0;
            for (int c = 0; c < K; c++)
                acc += (double)__half2float(w[(size_t)r * K + c]) * __half2float(x[(size_t)n * K + c]);
            float *o = y + (size_t)n * N + r;
            *o = *beta != 0.f ? fmaf(*alpha, (float)acc, *beta * *o) : *alpha * (float)acc;
        }
    return 0;
}

/* ---- plain products and rows ---------------------------------------------------------- */

extern "C" int splash_cuda_dense_matrix_init(splash_cuda_dense_matrix *m, int dtype, const void *dev, int rows,
                                             int cols) {
    memset(m, 0, sizeof *m);
    m->dtype = dtype, m->rows = rows, m->cols = cols, m->data = (const uint8_t *)dev;
    return dtype == SPLASH_Q4 ? SPLASH_E_UNSUPPORTED : 0;
}
extern "C" int splash_cuda_dense_matmul(const splash_cuda_dense_matrix *w, const float *x, size_t ldx, int M, float *y,
                                        size_t ldy, struct CUstream_st *) {
    splash_tensor t = view(w->dtype, w->rows, w->cols, w->data);
    for (int r0 = 0; r0 < M; r0 += 512) /* the context's max_m */
        cpu_matmul(ctx(), &t, M - r0 < 512 ? M - r0 : 512, x + (size_t)r0 * ldx, ldx, y + (size_t)r0 * ldy, ldy);
    return 0;
}
extern "C" int splash_cuda_embed_rows_q4(const splash_q4_matrix *w, const int32_t *ids, int n, float *out, size_t ldo,
                                         struct CUstream_st *) {
    splash_tensor t = view(SPLASH_Q4, w->rows, w->cols, w->codes);
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < w->rows) splash_tensor_row_f32(&t, ids[i], out + (size_t)i * ldo);
    return 0;
}
extern "C" int splash_cuda_embed_rows_dense(const splash_cuda_dense_matrix *w, const int32_t *ids, int n, float *out,
                                            size_t ldo, struct CUstream_st *) {
    splash_tensor t = view(w->dtype, w->rows, w->cols, w->data);
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < w->rows) splash_tensor_row_f32(&t, ids[i], out + (size_t)i * ldo);
    return 0;
}
extern "C" int splash_cuda_gather_rows(const float *src, size_t lds, const int32_t *idx, int n, float *dst, size_t ldd,
                                       int width, struct CUstream_st *) {
    for (int i = 0; i < n; i++) memcpy(dst + (size_t)i * ldd, src + (size_t)idx[i] * lds, (size_t)width * sizeof(float));
    return 0;
}
extern "C" int splash_cuda_scatter_rows(const float *src, size_t lds, const int32_t *map, int rows, float *dst,
                                        size_t ldd, int width, struct CUstream_st *) {
    for (int r = 0; r < rows; r++)
        if (map[r] >= 0) memcpy(dst + (size_t)map[r] * ldd, src + (size_t)r * lds, (size_t)width * sizeof(float));
    return 0;
}
extern "C" int splash_cuda_add_rows(float *y, size_t ldy, const float *x, size_t ldx, int rows, int width,
                                    struct CUstream_st *) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < width; c++) y[(size_t)r * ldy + c] += x[(size_t)r * ldx + c];
    return 0;
}

/* ---- norms, rotary, activations -------------------------------------------------------- */

extern "C" int splash_cuda_rmsnorm(const float *x, size_t ldx, size_t hsx, float *y, size_t ldy, size_t hsy,
                                   const float *w, float offset, int n, int rows, int heads, float eps,
                                   struct CUstream_st *) {
    float *f = (float *)malloc((size_t)n * sizeof(float));
    for (int i = 0; i < n; i++) f[i] = offset + w[i];
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < heads; h++) cpu_rmsnorm(x + r * ldx + h * hsx, f, n, eps, y + r * ldy + h * hsy);
    free(f);
    return 0;
}

extern "C" int splash_cuda_attn_prep(const splash_cuda_attn_prep_args *a, struct CUstream_st *) {
    const int hd = a->head_dim, half = a->rot_dim / 2;
    float *qf = (float *)malloc((size_t)hd * sizeof(float)), *kf = (float *)malloc((size_t)hd * sizeof(float));
    if ((a->heads && (!a->qg || !a->q || !a->q_norm)) || (a->qhs && (a->qhs < (size_t)hd || a->gate))) {
        free(qf), free(kf);
        return SPLASH_E_INVALID;
    }
    for (int i = 0; i < hd; i++) qf[i] = (a->heads ? a->norm_offset + a->q_norm[i] : 0), kf[i] = a->norm_offset + a->k_norm[i];
    for (int r = 0; r < a->rows; r++) {
        for (int j = 0; j < a->heads + a->kv_heads; j++) {
            const int is_q = j < a->heads;
            float *dst = is_q ? a->q + r * a->ldq + (size_t)j * hd : a->k + r * a->ldk + (size_t)(j - a->heads) * hd;
            const float *src = is_q ? a->qg + r * a->ldqg + (size_t)j * (a->qhs ? a->qhs : 2 * (size_t)hd) : dst;
            if (is_q && a->gate) memcpy(a->gate + r * a->ldg + (size_t)j * hd, src + hd, (size_t)hd * sizeof(float));
            cpu_rmsnorm(src, is_q ? qf : kf, hd, a->eps, dst);
            for (int i = 0; i < half; i++) {
                const float ang = (float)a->pos[r] * a->inv_freq[i], c = cosf(ang), s = sinf(ang);
                const float x1 = dst[i], x2 = dst[i + half];
                dst[i] = x1 * c - x2 * s;
                dst[i + half] = x2 * c + x1 * s;
            }
        }
    }
    free(qf), free(kf);
    return 0;
}

extern "C" int splash_cuda_silu_mul(const float *g, size_t ldg, const float *u, size_t ldu, float *out, size_t ldo,
                                    int rows, int n, struct CUstream_st *) {
    for (int r = 0; r < rows; r++) cpu_silu_mul(g + r * ldg, u + r * ldu, n, out + r * ldo);
    return 0;
}

extern "C" int splash_cuda_moe_shared_add(float *fo, size_t ldf, const float *mo, size_t ldm, const float *s,
                                          size_t lds, float *x, size_t ldx, int rows, int n, struct CUstream_st *) {
    for (int r = 0; r < rows; r++) {
        const float sg = cpu_sigmoid(s[r * lds]);
        for (int i = 0; i < n; i++) {
            fo[r * ldf + i] = fo[r * ldf + i] + sg * mo[r * ldm + i];
            x[r * ldx + i] = fo[r * ldf + i] + x[r * ldx + i];
        }
    }
    return 0;
}

/* ---- attention --------------------------------------------------------------------------- */

static cpu_kv_layout cpu_layout(const splash_cuda_kv_layout *l) {
    cpu_kv_layout c;
    cpu_kv_layout_init(&c, l->format, l->n_layers, l->kv_heads, l->head_dim, l->page_tokens);
    return c;
}

extern "C" int splash_cuda_kv_layout_init(splash_cuda_kv_layout *l, int format, int n_layers, int kv_heads,
                                          int head_dim, int page_tokens) {
    cpu_kv_layout c;
    int rc = cpu_kv_layout_init(&c, format, n_layers, kv_heads, head_dim, page_tokens);
    if (rc) return rc;
    l->format = c.format, l->page_tokens = c.page_tokens, l->kv_heads = c.kv_heads, l->head_dim = c.head_dim;
    l->n_layers = c.n_layers, l->value_size = c.value_size;
    l->k_off = c.k_off, l->ks_off = c.ks_off, l->v_off = c.v_off, l->vs_off = c.vs_off;
    l->layer_bytes = c.layer_bytes, l->page_bytes = c.page_bytes;
    return 0;
}

extern "C" int splash_cuda_kv_write(const splash_cuda_kv_layout *l, uint8_t *pool, int layer,
                                    const splash_cuda_attn_lane *lanes, int n_lanes, int rows, const float *k,
                                    size_t ldk, const float *v, size_t ldv, int, struct CUstream_st *) {
    cpu_kv_layout c = cpu_layout(l);
    cpu_attn_lane *cl = (cpu_attn_lane *)malloc(sizeof *cl * (size_t)(n_lanes ? n_lanes : 1));
    for (int i = 0; i < n_lanes; i++) {
        cl[i] = cpu_lane(&lanes[i]);
        if (lanes[i].first_row + lanes[i].n_rows > rows) return SPLASH_E_INVALID;
    }
    cpu_kv_write(ctx(), &c, pool, layer, cl, n_lanes, k, ldk, v, ldv);
    free(cl);
    return 0;
}

extern "C" size_t splash_cuda_attn_workspace_bytes(int rows, int n_heads, int head_dim, int max_ctx, int split) {
    if (rows < 1 || n_heads < 1 || head_dim < 1 || max_ctx < 1 || split < 0 || split % 64) return 0;
    const int sp = split ? split : SPLASH_CUDA_ATTN_SPLIT;
    return (size_t)rows * n_heads * head_dim * 4 * ((max_ctx + sp - 1) / sp) + 64; /* the GPU's order of size */
}

extern "C" int splash_cuda_attention(const splash_cuda_attn_args *a, struct CUstream_st *) {
    const splash_cuda_kv_layout *l = a->layout;
    const int sp = a->split ? a->split : SPLASH_CUDA_ATTN_SPLIT;
    const bool whole = l->format == 2 /* SPLASH_KV_INT8 */ && a->max_ctx <= sp; /* one split: no workspace (attention.h) */
    if (!whole &&
        a->workspace_bytes < splash_cuda_attn_workspace_bytes(a->rows, a->n_heads, l->head_dim, a->max_ctx, a->split))
        return SPLASH_E_RANGE;
    cpu_kv_layout c = cpu_layout(l);
    cpu_attn_lane *cl = (cpu_attn_lane *)malloc(sizeof *cl * (size_t)a->n_lanes);
    for (int i = 0; i < a->n_lanes; i++) {
        cl[i] = cpu_lane(&a->lanes[i]);
        if (cl[i].first_row + cl[i].n_rows > a->rows || cl[i].n_rows > a->max_lane_rows ||
            cl[i].n_past + cl[i].n_rows > a->max_ctx)
            return SPLASH_E_INVALID; /* the kernel would read outside its grid */
    }
    float *scores = (float *)malloc(sizeof(float) * (size_t)(a->max_ctx + 16));
    cpu_attention(ctx(), &c, a->pool, a->layer, cl, a->n_lanes, a->n_heads, a->q, a->ldq, a->out, a->ldo, a->scale,
                  scores, (size_t)(a->max_ctx + 16));
    if (a->gate)
        for (int i = 0; i < a->n_lanes; i++)
            for (int r = cl[i].first_row; r < cl[i].first_row + cl[i].n_rows; r++)
                for (int e = 0; e < a->n_heads * l->head_dim; e++)
                    a->out[r * a->ldo + e] *= cpu_sigmoid(a->gate[r * a->ldg + e]);
    free(scores), free(cl);
    return 0;
}

/* ---- Gated DeltaNet ------------------------------------------------------------------------ */

extern "C" int splash_cuda_gdn_conv(const float *wT, int C, int K, const splash_cuda_gdn_lane *lanes, int n_lanes,
                                    int max_lane_rows, const float *x, size_t ldx, float *y, size_t ldy, int,
                                    struct CUstream_st *) {
    for (int i = 0; i < n_lanes; i++) {
        const splash_cuda_gdn_lane *l = &lanes[i];
        if (l->n_rows > max_lane_rows) return SPLASH_E_INVALID;
        const float *xl = x + (size_t)l->first_row * ldx;
        if (y)
            cpu_gdn_conv(wT, C, K, l->conv_state, l->update_conv, xl, ldx, l->n_rows, y + (size_t)l->first_row * ldy,
                         ldy, 0, C);
        else if (l->update_conv)
            cpu_gdn_conv_advance(l->conv_state, C, K, xl, ldx, l->n_rows, 0, C);
    }
    return 0;
}

/* chunked: the CPU's chunked algorithm, else its recurrence */
static int gdn(const splash_cuda_gdn_args *a, int chunked) {
    const int dk = a->dk, dv = a->dv, kd = a->hk * dk;
    const float qscale = (float)pow((double)dk, -0.5);
    const size_t hs = (size_t)dk * dv;
    for (int i = 0; i < a->n_lanes; i++) {
        const splash_cuda_gdn_lane *l = &a->lanes[i];
        const int n = l->n_rows;
        float *q = (float *)malloc(sizeof(float) * (size_t)n * dk), *k = (float *)malloc(sizeof(float) * (size_t)n * dk);
        float *g = (float *)malloc(sizeof(float) * n), *beta = (float *)malloc(sizeof(float) * n);
        float *o = (float *)malloc(sizeof(float) * (size_t)n * dv);
        float *scratch = (float *)malloc(sizeof(float) * cpu_gdn_chunk_scratch(dk, dv));
        float *none = l->s_out ? NULL : (float *)malloc(sizeof(float) * hs); /* s_out NULL: the state is not kept */
        for (int h = 0; h < a->hv; h++) {
            const int kh = h / (a->hv / a->hk);
            float *S = none ? none : l->s_out + (size_t)h * hs;
            if (S != l->s_in + (size_t)h * hs) memcpy(S, l->s_in + (size_t)h * hs, hs * sizeof(float));
            for (int t = 0; t < n; t++) {
                const size_t row = (size_t)l->first_row + t;
                const float *m = a->mixed + row * a->ldm;
                memcpy(q + (size_t)t * dk, m + (size_t)kh * dk, sizeof(float) * dk);
                memcpy(k + (size_t)t * dk, m + kd + (size_t)kh * dk, sizeof(float) * dk);
                cpu_l2norm(q + (size_t)t * dk, dk, 1e-6f);
                cpu_l2norm(k + (size_t)t * dk, dk, 1e-6f);
                for (int e = 0; e < dk; e++) q[(size_t)t * dk + e] *= qscale;
                beta[t] = cpu_sigmoid(a->b[row * a->ldab + h]);
                g[t] = a->neg_a[h] * cpu_softplus(a->a[row * a->ldab + h] + a->dt_bias[h]);
            }
            const float *v = a->mixed + (size_t)l->first_row * a->ldm + 2 * (size_t)kd + (size_t)h * dv;
            if (chunked)
                cpu_gdn_chunked(S, dk, dv, n, q, k, (size_t)dk, v, a->ldm, g, beta, 1, o, (size_t)dv, scratch);
            else
                for (int t = 0; t < n; t++)
                    cpu_gdn_step(S, dk, dv, q + (size_t)t * dk, k + (size_t)t * dk, v + (size_t)t * a->ldm, g[t], beta[t],
                                 o + (size_t)t * dv);
            for (int t = 0; t < n; t++) {
                const size_t row = (size_t)l->first_row + t, oc = (size_t)h * dv;
                if (a->o) memcpy(a->o + row * a->ldo + oc, o + (size_t)t * dv, sizeof(float) * dv);
                if (a->y)
                    cpu_rmsnorm_gated(o + (size_t)t * dv, a->norm_w, a->z + row * a->ldz + oc, dv, a->eps,
                                      a->y + row * a->ldy + oc);
            }
        }
        free(q), free(k), free(g), free(beta), free(o), free(scratch), free(none);
    }
    return 0;
}
extern "C" int splash_cuda_gdn_recurrent(const splash_cuda_gdn_args *a, struct CUstream_st *) { return gdn(a, 0); }
extern "C" size_t splash_cuda_gdn_chunked_ws_floats(int hv, int dk, int dv, int n_lanes, int chunks) {
    if (!splash_cuda_gdn_chunked_takes(dk, dv)) return 0; /* as the GPU's */
    return (size_t)hv * (3 * 64 * dk + 2 * 64 * dv + 64 * 64 + 3 * 64 + 4) * n_lanes * chunks; /* as the GPU's */
}
extern "C" int splash_cuda_gdn_chunked(const splash_cuda_gdn_args *a, struct CUstream_st *) {
    if (!a->ws || a->ws_floats < splash_cuda_gdn_chunked_ws_floats(a->hv, a->dk, a->dv, a->n_lanes, 1) ||
        a->max_lane_rows < 1)
        return SPLASH_E_INVALID;
    return gdn(a, 1);
}

/* ---- MoE ---------------------------------------------------------------------------------------- */

extern "C" int splash_q4_group_plan(const int32_t *, int, int, int32_t *, struct CUstream_st *) {
    return 0; /* as the route's plan: the emulated grouped step needs none */
}
extern "C" int splash_cuda_moe_hash_logits(float *logits, size_t ldl, int rows, int E, const int32_t *pos, int salt,
                                           struct CUstream_st *) {
    if (!logits || !pos || rows < 0 || E < 1 || ldl < (size_t)E) return SPLASH_E_INVALID;
    for (int r = 0; r < rows; r++)
        for (int e = 0; e < E; e++) logits[(size_t)r * ldl + e] = splash_moe_hash_logit(salt, pos[r], e);
    return SPLASH_OK;
}
extern "C" int splash_cuda_moe_route(const float *logits, size_t ldl, int rows, int E, int top_k, int norm_topk,
                                     int shared, const float *sl, size_t lds, int32_t *idx, float *w, int32_t *,
                                     struct CUstream_st *) { /* the plan: the emulated grouped step needs none */
    float *p = (float *)malloc(sizeof(float) * E);
    const int stride = top_k + (shared >= 0);
    for (int r = 0; r < rows; r++) {
        memcpy(p, logits + r * ldl, sizeof(float) * E);
        cpu_softmax(p, E);
        int32_t *id = idx + (size_t)r * stride;
        float *wt = w + (size_t)r * stride;
        for (int kk = 0; kk < top_k; kk++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int q = 0; q < kk; q++) taken |= id[q] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            id[kk] = best, wt[kk] = p[best];
        }
        if (norm_topk) {
            float s = 0.f;
            for (int kk = 0; kk < top_k; kk++) s += wt[kk];
            for (int kk = 0; kk < top_k; kk++) wt[kk] /= s;
        }
        for (int x = 1; x < top_k; x++)
            for (int y = x; y > 0 && id[y - 1] > id[y]; y--) {
                int32_t ti = id[y];
                id[y] = id[y - 1], id[y - 1] = ti;
                float tw = wt[y];
                wt[y] = wt[y - 1], wt[y - 1] = tw;
            }
        if (shared >= 0) id[top_k] = shared, wt[top_k] = cpu_sigmoid(sl[r * lds]);
    }
    free(p);
    return 0;
}

extern "C" int splash_cuda_moe_scratch_init(splash_cuda_moe_scratch *s, int max_rows, int hidden, int inter,
                                            int top_k) {
    memset(s, 0, sizeof *s);
    s->max_rows = max_rows, s->hidden = hidden, s->inter = inter, s->top_k = top_k;
    s->dev = malloc(1);
    s->mx = (float *)malloc(sizeof(float) * (size_t)max_rows * hidden);
    s->h1 = (float *)malloc(sizeof(float) * (size_t)max_rows * inter);
    s->h2 = (float *)malloc(sizeof(float) * (size_t)max_rows * inter);
    s->mo = (float *)malloc(sizeof(float) * (size_t)max_rows * hidden);
    s->smo = (float *)malloc(sizeof(float) * SPLASH_Q4_MAX_M * (top_k + 1) * hidden); /* the grouped step's slots */
    return 0;
}
extern "C" void splash_cuda_moe_scratch_free(splash_cuda_moe_scratch *s) {
    if (!s->dev) return;
    free(s->dev), free(s->mx), free(s->h1), free(s->h2), free(s->mo), free(s->smo);
    memset(s, 0, sizeof *s);
}

/* The experts of k slots a row, each expert's rows together (ascending id):
 * the host-driven step's arithmetic, which every step matches.  fo NULL: each
 * slot's output (unweighted) into s->smo instead, for splash_cuda_moe_sum (a
 * row's slots ascend by id, so its sum there is the one made here). */
static int emu_experts(const splash_q4_matrix *gate, const splash_q4_matrix *up, const splash_q4_matrix *down, int E,
                       const int32_t *idx, const float *w, int rows, int k, const float *xn, size_t ldx, float *fo,
                       size_t ldf, splash_cuda_moe_scratch *s) {
    const int H = s->hidden, I = s->inter;
    for (int r = 0; fo && r < rows; r++) memset(fo + r * ldf, 0, sizeof(float) * H);
    int *er = (int *)malloc(sizeof(int) * rows), *es = (int *)malloc(sizeof(int) * rows);
    float *ew = (float *)malloc(sizeof(float) * rows);
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int r = 0; r < rows; r++)
            for (int kk = 0; kk < k; kk++)
                if (idx[r * k + kk] == e) er[n] = r, es[n] = r * k + kk, ew[n++] = w[r * k + kk];
        if (!n) continue;
        for (int i = 0; i < n; i++) memcpy(s->mx + (size_t)i * H, xn + er[i] * ldx, sizeof(float) * H);
        splash_tensor g = view(SPLASH_Q4, gate[e].rows, gate[e].cols, gate[e].codes);
        splash_tensor u = view(SPLASH_Q4, up[e].rows, up[e].cols, up[e].codes);
        splash_tensor d = view(SPLASH_Q4, down[e].rows, down[e].cols, down[e].codes);
        cpu_matmul(ctx(), &g, n, s->mx, H, s->h1, I);
        cpu_matmul(ctx(), &u, n, s->mx, H, s->h2, I);
        for (int i = 0; i < n; i++) cpu_silu_mul(s->h1 + (size_t)i * I, s->h2 + (size_t)i * I, I, s->h1 + (size_t)i * I);
        cpu_matmul(ctx(), &d, n, s->h1, I, s->mo, H);
        for (int i = 0; i < n; i++)
            if (fo)
                for (int c = 0; c < H; c++) fo[er[i] * ldf + c] = fo[er[i] * ldf + c] + s->mo[(size_t)i * H + c] * ew[i];
            else
                memcpy(s->smo + (size_t)es[i] * H, s->mo + (size_t)i * H, sizeof(float) * H);
    }
    free(er), free(es), free(ew);
    return 0;
}

extern "C" int splash_cuda_moe_experts(const splash_q4_matrix *gate, const splash_q4_matrix *up,
                                       const splash_q4_matrix *down, int E, const int32_t *idx, const float *w,
                                       int rows, const float *xn, size_t ldx, float *fo, size_t ldf,
                                       splash_cuda_moe_scratch *s, struct CUstream_st *) {
    return emu_experts(gate, up, down, E, idx, w, rows, s->top_k, xn, ldx, fo, ldf, s);
}

/* Grouped: the same arithmetic per row (the emulated prep keeps x's fp32 rows in hi). */
/* The GEMM step: each (row, expert) through the GPU GEMM's roundings, summed
 * over the row's experts in ascending id (the device's combine). */
extern "C" int splash_cuda_moe_experts_gemm(const splash_q4_matrix *gate, const splash_q4_matrix *up,
                                            const splash_q4_matrix *down, int E, const int32_t *idx, const float *w,
                                            int rows, const float *xn, size_t ldx, float *fo, size_t ldf,
                                            splash_cuda_moe_scratch *s, struct CUstream_st *) {
    const int H = s->hidden, I = s->inter, k = s->top_k;
    float *g = (float *)malloc(sizeof(float) * I), *u = (float *)malloc(sizeof(float) * I);
    float *dd = (float *)malloc(sizeof(float) * H);
    int rc = g && u && dd ? 0 : SPLASH_E_NOMEM;
    for (int r = 0; r < rows && !rc; r++) {
        float *f = fo + (size_t)r * ldf;
        for (int c = 0; c < H; c++) f[c] = 0.f;
        for (int kk = 0; kk < k && !rc; kk++) {
            const int e = idx[r * k + kk];
            if (e < 0 || e >= E) continue;
            rc = emu_gemm_rows(&gate[e], xn + (size_t)r * ldx, 1, ldx, g, 0);
            if (!rc) rc = emu_gemm_rows(&up[e], xn + (size_t)r * ldx, 1, ldx, u, 0);
            cpu_silu_mul(g, u, I, g);
            if (!rc) rc = emu_gemm_rows(&down[e], g, 1, (size_t)I, dd, 0);
            for (int c = 0; c < H; c++) {
                const float t = dd[c] * w[r * k + kk];
                f[c] = f[c] + t;
            }
        }
    }
    free(g), free(u), free(dd);
    return rc;
}

extern "C" int splash_cuda_moe_experts_grouped(const splash_q4_matrix *gate, const splash_q4_matrix *up,
                                               const splash_q4_matrix *down, int E, const int32_t *idx, const float *w,
                                               const int32_t *, int rows, int k, const splash_q4_xprep *xp, float *fo,
                                               size_t ldf, float *x, size_t ldx, splash_cuda_moe_scratch *s,
                                               struct CUstream_st *) {
    if (rows > SPLASH_Q4_MAX_M || xp->M != rows || k < 1 || k > s->top_k + 1) return SPLASH_E_INVALID;
    int rc = emu_experts(gate, up, down, E, idx, w, rows, k, (const float *)xp->x8, (size_t)xp->cols, fo, ldf, s);
    for (int r = 0; fo && x && !rc && r < rows; r++)
        for (int c = 0; c < s->hidden; c++) x[r * ldx + c] = fo[r * ldf + c] + x[r * ldx + c];
    return rc;
}

extern "C" int splash_cuda_moe_sum(const splash_q4_moe_sum *ms, int rows, int H, float *x, size_t ldx,
                                   struct CUstream_st *) {
    if (!ms || !ms->mo || !ms->w || !ms->fo || rows < 0 || H < 1 || ms->K < 1 || ms->ldm != (size_t)H ||
        ms->ldf < (size_t)H || (x && ldx < (size_t)H))
        return SPLASH_E_INVALID;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < H; c++) {
            float f = 0.f;
            for (int kk = 0; kk < ms->K; kk++) f = f + ms->mo[(size_t)(r * ms->K + kk) * H + c] * ms->w[r * ms->K + kk];
            ms->fo[r * ms->ldf + c] = f;
            if (x) x[r * ldx + c] = f + x[r * ldx + c];
        }
    return 0;
}

extern "C" void splash_cuda_rope_inv_freq(float *inv, int rot_dim, double theta) {
    for (int i = 0; i < rot_dim / 2; i++) inv[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)rot_dim);
}

/* ---- fused producers of a prepared activation (q4_matmul.h) -------------------------------- */

extern "C" int splash_q4_prep_rmsnorm(splash_q4_xprep *xp, const float *x, size_t ldx, const float *w, float eps,
                                      float *y, size_t ldy, int rows, int cols, struct CUstream_st *s) {
    int rc = splash_cuda_rmsnorm(x, ldx, 0, y, ldy, 0, w, 0.f, cols, rows, 1, eps, s);
    return rc ? rc : splash_q4_prep_x(xp, y, rows < SPLASH_Q4_MAX_M ? rows : SPLASH_Q4_MAX_M, cols, (int)ldy, s);
}
extern "C" int splash_q4_prep_rmsnorm_moe(splash_q4_xprep *xp, float *x, size_t ldx, const splash_q4_moe_sum *ms,
                                          const float *w, float eps, float *y, size_t ldy, int rows, int cols,
                                          struct CUstream_st *s) {
    if (rows < 1 || rows > SPLASH_Q4_MAX_M || !ms || ms->K > SPLASH_Q4_MOE_SUM_MAX_K) return SPLASH_E_INVALID;
    int rc = splash_cuda_moe_sum(ms, rows, cols, x, ldx, s);
    return rc ? rc : splash_q4_prep_rmsnorm(xp, x, ldx, w, eps, y, ldy, rows, cols, s);
}
/* ... and rows [r0, r1) of y as the uniform preparation (above), with the power of two from the bound
 * sqrt(cols) max|w| (+1%) rather than the rows' largest |y| (q4_matmul.cu's rms_gemm_scale) */
extern "C" int splash_q4_prep_rmsnorm_gemm(splash_q4_xprep *xp, splash_q4_gemm_x *xg, int r0, int r1, const float *x,
                                           size_t ldx, const float *w, float eps, float *y, size_t ldy, int rows,
                                           int cols, struct CUstream_st *s) {
    if (r0 < 0 || r1 <= r0 || r1 > rows || r1 - r0 > xg->rows_cap || cols > xg->cols_cap) return SPLASH_E_INVALID;
    int rc = splash_q4_prep_rmsnorm(xp, x, ldx, w, eps, y, ldy, rows, cols, s);
    if (rc) return rc;
    float mw = 0.f;
    for (int c = 0; c < cols; c++) mw = fmaxf(mw, fabsf(w[c]));
    return emu_uniform(xg, y + (size_t)r0 * ldy, r1 - r0, cols, ldy, sqrtf((float)cols) * mw * 1.01f);
}
extern "C" int splash_q4_prep_silu_mul(splash_q4_xprep *xp, const float *g, size_t ldg, const float *u, size_t ldu,
                                       float *y, size_t ldy, int rows, int cols, struct CUstream_st *s) {
    int rc = splash_cuda_silu_mul(g, ldg, u, ldu, y, ldy, rows, cols, s);
    return rc ? rc : splash_q4_prep_x(xp, y, rows < SPLASH_Q4_MAX_M ? rows : SPLASH_Q4_MAX_M, cols, (int)ldy, s);
}
/* the amax the GPU leaves in xg is found again by splash_q4_gemm_prep_uniform_amax above */
extern "C" int splash_q4_prep_silu_mul_amax(splash_q4_xprep *xp, splash_q4_gemm_x *xg, int r0, int r1, const float *g,
                                            size_t ldg, const float *u, size_t ldu, float *y, size_t ldy, int rows,
                                            int cols, struct CUstream_st *s) {
    if (!xg || r0 < 0 || r1 <= r0 || r1 > rows) return SPLASH_E_INVALID;
    return splash_q4_prep_silu_mul(xp, g, ldg, u, ldu, y, ldy, rows, cols, s);
}

extern "C" int splash_cuda_rope(float *x, size_t ldx, int rows, int heads, int head_dim, int rot_dim,
                                const float *inv_freq, const int32_t *pos, struct CUstream_st *) {
    const int half = rot_dim / 2;
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < heads; h++) {
            float *v = x + r * ldx + (size_t)h * head_dim;
            for (int i = 0; i < half; i++) {
                const float ang = (float)pos[r] * inv_freq[i], c = cosf(ang), s = sinf(ang);
                const float x1 = v[i], x2 = v[i + half];
                v[i] = x1 * c - x2 * s;
                v[i + half] = x2 * c + x1 * s;
            }
        }
    return 0;
}

/* ---- the greedy decisions (greedy.h): runtime/spec_greedy.h's function, lane by lane ---------- */

extern "C" int splash_cuda_greedy_decide(const splash_cuda_greedy_lane *lanes, int n, const int32_t *top_ids,
                                         const float *top_vals, int top_k, int vocab, const int32_t *tokens,
                                         const int32_t *stop, int n_stop, splash_greedy_result *res,
                                         splash_cuda_gdn_lane *commit, int n_gdn, int n_commit, struct CUstream_st *) {
    if (n < 0 || top_k < 1 || n_stop < 0 || n_stop > SPLASH_GREEDY_MAX_STOP || (n_gdn && n_commit < 1))
        return SPLASH_E_INVALID;
    for (int i = 0; i < n; i++) {
        const splash_cuda_greedy_lane *l = &lanes[i];
        splash_greedy_decide(top_ids + (size_t)l->head * top_k, top_vals + (size_t)l->head * top_k, (size_t)top_k,
                             vocab, tokens + l->row + 1, l->n_feed, l->n_props, l->limit, stop, n_stop, &res[i]);
        if (l->commit >= 0)
            for (int g = 0; g < n_gdn; g++) commit[(size_t)g * n_commit + l->commit].n_rows = res[i].c;
    }
    return 0;
}

/* ---- the DFlash draft's ops (dflash.h): dflash2.c's and dflash_ctx.c's arithmetic ------------ */

extern "C" int splash_cuda_dflash_conv(const float *x, size_t ldx, int rows, int hidden, const float *base,
                                       const float *dyn, size_t lddyn, int side, int kernel, int group, float *out,
                                       size_t ldo, struct CUstream_st *) {
    splash_dflash2_conv(x, ldx, rows, hidden, base, dyn, lddyn, side, kernel, group, out, ldo);
    return 0;
}
extern "C" int splash_cuda_dflash_ring_write_rows(const float *k, const float *v, size_t lds, int rows, int width,
                                                  float *ring_k, float *ring_v, size_t lane_stride, int cap,
                                                  const int32_t *pos, const int32_t *lane, const int32_t *end,
                                                  struct CUstream_st *) {
    for (int r = 0; r < rows; r++) {
        if (lane[r] < 0 || pos[r] < end[r] - cap) continue;
        const size_t at = (size_t)lane[r] * lane_stride + (size_t)(pos[r] % cap) * width;
        memcpy(ring_k + at, k + r * lds, (size_t)width * sizeof(float));
        memcpy(ring_v + at, v + r * lds, (size_t)width * sizeof(float));
    }
    return 0;
}
extern "C" size_t splash_cuda_dflash_attention_workspace_bytes(int block, int heads, int head_dim, int max_keys) {
    return block > 0 && heads > 0 && head_dim > 0 && max_keys > 0 ? 256 : 0;
}
/* dflash_ctx.c attn_task: scores in key order, cpu_softmax, cpu_axpy in key order. */
extern "C" int splash_cuda_dflash_attention(const splash_cuda_dflash_attn_args *a, struct CUstream_st *) {
    const int hd = a->head_dim, g = a->heads / a->kv_heads, W = a->window;
    const size_t kvw = (size_t)a->kv_heads * hd;
    const int n_ctx = a->ctx_dev ? a->ctx_dev[0] : a->n_ctx, lo = a->ctx_dev ? a->ctx_dev[1] : a->lo;
    if (a->ctx_dev && (a->max_keys < a->block || (n_ctx - lo < a->cap ? n_ctx - lo : a->cap) + a->block > a->max_keys))
        return SPLASH_E_INVALID; /* the GPU's launch would not cover the lane's keys */
    float *sc = (float *)malloc(((size_t)a->cap + a->block) * sizeof(float));
    for (int i = 0; i < a->block; i++)
        for (int h = 0; h < a->heads; h++) {
            const int kh = h / g, start = n_ctx, qp = start + i;
            const float *q = a->q + i * a->ldq + (size_t)h * hd;
            int c0 = lo;
            if (start - a->cap > c0) c0 = start - a->cap;
            if (W > 0 && qp - W + 1 > c0) c0 = qp - W + 1;
            const int nc = start > c0 ? start - c0 : 0;
            int n = 0, b0 = 0, b1 = a->causal ? i + 1 : a->block;
            if (W > 0) {
                if (i - W + 1 > b0) b0 = i - W + 1;
                if (!a->causal && i + W < b1) b1 = i + W;
            }
            for (int p = c0; p < start; p++)
                sc[n++] = cpu_dot(q, a->ring_k + (size_t)(p % a->cap) * kvw + (size_t)kh * hd, hd) * a->scale;
            for (int b = b0; b < b1; b++) sc[n++] = cpu_dot(q, a->k + b * a->ldkv + (size_t)kh * hd, hd) * a->scale;
            cpu_softmax(sc, n);
            float *o = a->o + i * a->ldo + (size_t)h * hd;
            memset(o, 0, (size_t)hd * sizeof *o);
            for (int t = 0; t < nc; t++)
                cpu_axpy(sc[t], a->ring_v + (size_t)((c0 + t) % a->cap) * kvw + (size_t)kh * hd, o, hd);
            for (int b = b0; b < b1; b++) cpu_axpy(sc[nc + b - b0], a->v + b * a->ldkv + (size_t)kh * hd, o, hd);
        }
    free(sc);
    return 0;
}
extern "C" int splash_cuda_dflash_logits_transform(float *x, size_t ldx, int rows, int n, float mult, float cap,
                                                   struct CUstream_st *) {
    for (int r = 0; r < rows; r++) splash_dflash2_logits_transform(x + r * ldx, (size_t)n, mult, cap);
    return 0;
}
extern "C" int splash_cuda_dflash_edges(const float *gate, const float *pred, const float *succ, const float *val,
                                        const int32_t *n_cand, int rows, int k, int rank, float *edges,
                                        struct CUstream_st *) {
    float *g = (float *)malloc((size_t)rank * sizeof(float));
    for (int i = 0; i < rows; i++)
        for (int p = 0; p < (i ? n_cand[i - 1] : 1); p++) {
            const float *pr = pred + (size_t)(i ? 1 + (size_t)(i - 1) * k + p : 0) * rank;
            for (int r = 0; r < rank; r++) g[r] = pr[r] * gate[(size_t)i * rank + r];
            for (int j = 0; j < n_cand[i]; j++)
                edges[((size_t)i * k + p) * k + j] = val[(size_t)i * k + j] + cpu_dot(g, succ + ((size_t)i * k + j) * rank, rank);
        }
    free(g);
    return 0;
}

/* ---- argmax and top-k (argmax.h): the greedy rule, largest value, ties to the lowest index ---------------- */

extern "C" int splash_cuda_topk_max_k(int n) { return n < SPLASH_CUDA_MAX_TOPK ? n : SPLASH_CUDA_MAX_TOPK; }
extern "C" size_t splash_cuda_topk_workspace_bytes(int rows, int n, int k) {
    return rows > 0 && n > 0 && k > 0 ? 256 : 0;
}
extern "C" int splash_cuda_topk(const float *x, size_t ldx, int rows, int n, int k, int32_t *cand, float *val,
                                size_t ldc, int32_t *n_cand, void *, size_t, struct CUstream_st *) {
    for (int r = 0; r < rows; r++) {
        int32_t *c = cand + r * ldc;
        float *v = val + r * ldc;
        const int m = cpu_top_k(x + r * ldx, n, k, NULL, c, v);
        for (int j = m; j < k; j++) c[j] = -1, v[j] = -INFINITY;
        n_cand[r] = m;
    }
    return 0;
}


extern "C" size_t splash_cuda_argmax_workspace_bytes(int rows, int n) { return rows > 0 && n > 0 ? 256 : 0; }
extern "C" int splash_cuda_argmax(const float *x, size_t ldx, int rows, int n, int32_t *idx, float *val, void *, size_t,
                                  struct CUstream_st *) {
    for (int r = 0; r < rows; r++) {
        int best = -1;
        for (int c = 0; c < n; c++)
            if (x[r * ldx + c] > -INFINITY && (best < 0 || x[r * ldx + c] > x[r * ldx + best])) best = c;
        idx[r] = best;
        if (val) val[r] = best >= 0 ? x[r * ldx + best] : -INFINITY;
    }
    return 0;
}
