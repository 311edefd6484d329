/* bench_q4_matmul.cu - speed of the CUDA q4 product at the 27B's shapes,
 * against the measured copy bandwidth of the card.
 *
 * Method (../shared/spec/performance.md): random weights made on the device in
 * the tiled layout (the bytes are what matter), rotating among enough weight
 * buffers that each pass reads at least 1 GiB (the H200's L2 is ~50-60 MB), x
 * random.  Each figure is the median of 60 launches timed one by one with CUDA
 * events, after 5 warm-up launches; a spin kernel in front lets the host queue
 * all 60 so that host launch cost is not counted.  "graph" is the same
 * launches captured in a CUDA graph, time per launch (the decode cycle runs as
 * a graph).  Bytes counted: the tiled matrix, which is exactly the canonical
 * q4 bytes (0.5625 B per weight) when rows % 16 == 0; x (4 B per column per x
 * row, L2-resident) and y are not counted: 0.9% of q_proj's bytes at M = 16,
 * 11% of k_proj's.
 *
 * Ceilings: device-to-device cudaMemcpy (read + write bytes over time) and a
 * read-only streaming kernel.
 *
 * Usage: bench_q4_matmul [--sweep] [--csv FILE] [--only NAME,...] | --gemm [--only NAME,...] | --rows-scan NAME
 *                        | --grouped [--sweep] [--csv FILE] [--locality P]
 *   --sweep  also times every compiled config per (shape, M) (30 launches
 *            each, output checked against the preset's), selects one ksplit
 *            per shape and the fastest config per M class, prints that as
 *            kPresets lines and reports the table for it; --csv writes all
 *            timings there.  With --m M (one class): per shape the fastest
 *            config at the shape's preset ksplit / wk (so the class's bits
 *            stay those of the others) beside the preset's.
 *   --gemm   the prefill GEMM (q4_gemm.h) instead: per shape and R rows of x,
 *            the prep and the product (median of 20 launches, weights rotated
 *            as above), TFLOP/s against the ~990 dense fp16 peak, and the
 *            16-rows-a-launch path it replaces (prep_x + matmul per 16 rows).
 *   --rows-scan  the named shape's M = 1 preset config over row counts from
 *            half to twice the shape's: how the launch's waves of blocks
 *            (their count against the SMs' resident blocks) shape the
 *            bandwidth of one matrix.
 *   --grouped  the 35B-A3B's expert products as the model launches them
 *            (one grouped launch for gate and up, one for down; a decode
 *            row's 9 slots and an 8-row verify's 72 planned slots, random
 *            expert ids, weights from HBM); with --sweep every compiled
 *            config of a grouped block, the best for decode, for verify and
 *            the best pair of one ksplit and wk printed (the experts'
 *            presets: the decode row's classes 0-1, the verify's 2-3);
 *            --locality P: each of a verify row's experts is one of the
 *            row before's with probability P (0: random routing), with
 *            SPLASH_Q4_PLAN_GROUP=2 / 4 the case for the planned groups'
 *            size.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/blas.h"
#include "backend/cuda/q4_gemm.h"
#include "backend/cuda/q4_matmul.h"

#define NRUN 60       /* timed launches per figure */
#define NRUN_SWEEP 30 /* per config of the sweep */
#define NWARM 5

/* ---- helper kernels ---- */

__device__ __forceinline__ uint32_t hash32(uint64_t i, uint32_t seed) {
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)(z ^ (z >> 31));
}

/* Fills `nbuf` tiled matrices of `bytes` each: random codes, finite bf16
 * scales/biases. */
__global__ void fill_weights(uint32_t *pool, size_t words_per_buf, size_t code_words, size_t nbuf, uint32_t seed) {
    const size_t n = words_per_buf * nbuf;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint32_t h = hash32(i, seed);
        if (i % words_per_buf < code_words) {
            pool[i] = h;
        } else { /* two bf16 in (-0.05, 0.05) */
            const float a = ((h & 0xFFFF) / 65536.f - 0.5f) * 0.1f, b = ((h >> 16) / 65536.f - 0.5f) * 0.1f;
            pool[i] = (__float_as_uint(a) >> 16) | (__float_as_uint(b) & 0xFFFF0000u);
        }
    }
}

__global__ void fill_x(float *x, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = (hash32(i, seed) >> 8) / 8388608.f - 1.f;
}

__global__ void spin(long long ns) {
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

__global__ void empty_kernel(void) {}

__global__ void read_stream(const uint4 *p, size_t n, uint32_t *sink) {
    uint32_t acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v;
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p + i));
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) *sink = acc;
}

/* ---- timing ---- */

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static cudaEvent_t ev[2 * NRUN];
static cudaStream_t g_stream = 0; /* where launch functions enqueue (capture stream while timing a graph) */

typedef int (*LaunchFn)(void *ctx, int i);

/* Median of n launches, each between its own pair of events, in us. */
static float time_launches_n(LaunchFn fn, void *ctx, float *spread, int n) {
    for (int i = 0; i < NWARM; i++)
        if (fn(ctx, i)) return -1;
    SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
    spin<<<1, 1>>>(40000LL * n); /* 40 us a launch: the host queues everything behind it */
    for (int i = 0; i < n; i++) {
        SPLASH_CUDA_CHECK(cudaEventRecord(ev[2 * i]));
        if (fn(ctx, NWARM + i)) return -1;
        SPLASH_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1]));
    }
    SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
    float t[NRUN];
    for (int i = 0; i < n; i++) {
        SPLASH_CUDA_CHECK(cudaEventElapsedTime(&t[i], ev[2 * i], ev[2 * i + 1]));
        t[i] *= 1000.f;
    }
    qsort(t, n, sizeof(float), cmp_float);
    if (spread) *spread = t[n * 9 / 10] - t[n / 10];
    return t[n / 2];
}

static float time_launches(LaunchFn fn, void *ctx, float *spread) { return time_launches_n(fn, ctx, spread, NRUN); }

/* Per-launch time of `n` launches captured in one graph (median of 15 replays). */
static float time_graph(LaunchFn fn, void *ctx, int n) {
    cudaStream_t s;
    SPLASH_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    SPLASH_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    g_stream = s;
    int bad = 0;
    for (int i = 0; i < n; i++) bad |= fn(ctx, i);
    g_stream = 0;
    SPLASH_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    if (bad) return -1;
    SPLASH_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    float t[15];
    for (int w = 0; w < 2; w++) SPLASH_CUDA_CHECK(cudaGraphLaunch(exec, s));
    for (int i = 0; i < 15; i++) {
        SPLASH_CUDA_CHECK(cudaEventRecord(ev[0], s));
        SPLASH_CUDA_CHECK(cudaGraphLaunch(exec, s));
        SPLASH_CUDA_CHECK(cudaEventRecord(ev[1], s));
        SPLASH_CUDA_CHECK(cudaEventSynchronize(ev[1]));
        SPLASH_CUDA_CHECK(cudaEventElapsedTime(&t[i], ev[0], ev[1]));
        t[i] *= 1000.f / n;
    }
    qsort(t, 15, sizeof(float), cmp_float);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
    return t[7];
}

/* ---- the product under test ---- */

typedef struct {
    uint8_t *pool;
    size_t buf_bytes;
    int nbuf, rows, cols;
    splash_q4_xprep *xp;
    float *y;
    const splash_q4_config *cfg; /* NULL: preset */
} MatCtx;

static int launch_mat(void *p, int i) {
    MatCtx *c = (MatCtx *)p;
    splash_q4_matrix m;
    splash_q4_matrix_init(&m, c->pool + (size_t)(i % c->nbuf) * c->buf_bytes, c->rows, c->cols);
    int rc = c->cfg ? splash_q4_matmul_cfg(&m, c->xp, c->y, c->cfg, (struct CUstream_st *)g_stream)
                    : splash_q4_matmul(&m, c->xp, c->y, (struct CUstream_st *)g_stream);
    return rc;
}

typedef struct {
    splash_q4_xprep *xp;
    const float *x;
    int M, cols;
} PrepCtx;

static int launch_prep(void *p, int i) {
    (void)i;
    PrepCtx *c = (PrepCtx *)p;
    return splash_q4_prep_x(c->xp, c->x, c->M, c->cols, c->cols, (struct CUstream_st *)g_stream);
}

static int launch_empty(void *p, int i) {
    (void)p, (void)i;
    empty_kernel<<<1, 32, 0, g_stream>>>();
    return cudaGetLastError() != cudaSuccess;
}

typedef struct {
    void *a, *b;
    size_t bytes;
} CopyCtx;

static int launch_copy(void *p, int i) {
    (void)i;
    CopyCtx *c = (CopyCtx *)p;
    return cudaMemcpyAsync(c->b, c->a, c->bytes, cudaMemcpyDeviceToDevice, g_stream) != cudaSuccess;
}

typedef struct {
    const uint4 *p;
    size_t n;
    uint32_t *sink;
    int blocks;
} ReadCtx;

static int launch_read(void *p, int i) {
    (void)i;
    ReadCtx *c = (ReadCtx *)p;
    read_stream<<<c->blocks, 512, 0, g_stream>>>(c->p, c->n, c->sink);
    return cudaGetLastError() != cudaSuccess;
}

/* ---- main ---- */

typedef struct {
    const char *name;
    int rows, cols;
} Shape;

static const Shape kShapes[] = {
    {"attn.q_proj", 12288, 5120}, {"attn.k/v_proj", 1024, 5120}, {"attn.o_proj", 5120, 6144},
    {"gdn.in_proj_qkv", 10240, 5120}, {"gdn.in_proj_z", 6144, 5120}, {"gdn.out_proj", 5120, 6144},
    {"ffn.gate/up", 17408, 5120}, {"ffn.down", 5120, 17408}, {"lm_head", 248320, 5120},
    /* the stacks the CUDA model launches (cuda_weights.cu) */
    {"attn q|k|v", 14336, 5120}, {"gdn qkv|z|b|a", 16480, 5120}, {"ffn gate|up", 34816, 5120},
    /* the 35B-A3B's experts (--only: their presets are swept as plain products) and lm_head */
    {"moe gate/up", 512, 2048}, {"moe down", 2048, 512}, {"lm_head 35b", 248320, 2048},
    /* the 35B-A3B's dense stacks (cuda_weights.cu): GDN qkv|z|b|a, out_proj = attention o_proj, attention q|k|v */
    {"35b qkv|z|b|a", 12352, 2048}, {"35b out/o_proj", 2048, 4096}, {"35b attn q|k|v", 9216, 2048},
};
#define NSHAPES (int)(sizeof kShapes / sizeof kShapes[0])
static const int kMs[] = {1, 2, 4, 8, 16};
#define NMS 5

/* ---- --rows-scan ---- */

static int rows_scan(const char *name, int sms) {
    const Shape *sh = NULL;
    for (int i = 0; i < NSHAPES; i++)
        if (!strcmp(kShapes[i].name, name)) sh = &kShapes[i];
    if (!sh) {
        fprintf(stderr, "--rows-scan: no shape named %s\n", name);
        return 2;
    }
    splash_q4_config cfg;
    if (splash_q4_config_pick(sh->rows, sh->cols, 1, &cfg)) return 1;
    const int max_rows = 2 * sh->rows;
    const size_t bytes = (splash_q4_tiled_bytes(max_rows, sh->cols) + 255) & ~(size_t)255;
    int nbuf = (int)(((size_t)1 << 30) / bytes) + 1;
    if (nbuf < 2) nbuf = 2;
    MatCtx mc;
    mc.buf_bytes = bytes, mc.nbuf = nbuf, mc.cols = sh->cols, mc.cfg = &cfg;
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&mc.pool, bytes * nbuf));
    fill_weights<<<4096, 256>>>((uint32_t *)mc.pool, bytes / 4, splash_q4_tiled_codes_bytes(max_rows, sh->cols) / 4, nbuf,
                                77u);
    float *x;
    void *xmem;
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&x, sizeof(float) * sh->cols));
    fill_x<<<64, 256>>>(x, (size_t)sh->cols, 5u);
    SPLASH_CUDA_CHECK(cudaMalloc(&xmem, splash_q4_xprep_bytes(sh->cols)));
    splash_q4_xprep xp;
    splash_q4_xprep_init(&xp, xmem, sh->cols);
    if (splash_q4_prep_x(&xp, x, 1, sh->cols, sh->cols, NULL)) return 1;
    mc.xp = &xp;
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&mc.y, sizeof(float) * max_rows));
    printf("%s x %d at M = 1, config r %d u %d stages %d warps %d ksplit %d wk %d, %d SMs\n", sh->name, sh->cols, cfg.r,
           cfg.u, cfg.stages, cfg.warps, cfg.ksplit, cfg.wk, sms);
    printf("| rows | row tiles | blocks (tiles / (r x warps / wk) x ksplit) | us | GB/s |\n|---|---|---|---|---|\n");
    for (int k = 16; k <= 64; k++) {
        const int rows = (int)((int64_t)sh->rows * k / 32 / 16 * 16);
        mc.rows = rows;
        const int tiles = rows / 16, per_block = cfg.r * cfg.warps / cfg.wk;
        const int blocks = (tiles + per_block - 1) / per_block * cfg.ksplit;
        float sp;
        const float us = time_launches(launch_mat, &mc, &sp);
        printf("| %d | %d | %d | %.2f | %.0f |\n", rows, tiles, blocks, us, splash_q4_tiled_bytes(rows, sh->cols) / (us * 1e3));
    }
    return 0;
}

typedef struct {
    float us, spread, graph_us; /* the reported config */
    float preset_us;            /* the preset compiled in, same method */
    splash_q4_config cfg;
    double bytes;
} Row;

/* The sweep: every compiled (r, u, stages) x warps x ksplit. */
#define MAXVAR 64
static int kVariants[MAXVAR][3], NVAR; /* splash_q4_compiled_variants, filled in main */
static const int kSweepWarps[] = {2, 4, 8}, kSweepKs[] = {1, 2, 4, 8}, kSweepWk[] = {1, 2, 4, 8};
#define NCAND (NVAR * 3 * 4 * 4)
#define MAXCAND (MAXVAR * 3 * 4 * 4)

typedef struct {
    splash_q4_config c;
    float us[NMS]; /* < 0: not valid for the shape, or wrong output */
} Cand;

static splash_q4_config cand_config(int i) {
    const int v = i / 48, w = (i / 16) % 3, k = (i / 4) % 4, wk = i % 4;
    splash_q4_config c = {kVariants[v][0], kVariants[v][1], kVariants[v][2], kSweepWarps[w], kSweepKs[k], kSweepWk[wk]};
    return c;
}

/* One (ksplit, wk) for the shape (the arithmetic order: results must not
 * depend on M), then per M class the fastest config: class 0 by the mean over
 * M = 1, 2, class 1 at M = 4, class 2 at M = 8, class 3 at M = 16; the pair
 * minimising the sum of the four. */
static int select_presets(const Cand *cand, int *ks_out, int *wk_out, splash_q4_config out[4]) {
    float best_score = 1e30f;
    int found = 0;
    for (int kw = 0; kw < 16; kw++) {
        const int ks = kSweepKs[kw / 4], wk = kSweepWk[kw % 4];
        float b[4] = {1e30f, 1e30f, 1e30f, 1e30f};
        int bi[4] = {-1, -1, -1, -1};
        for (int i = 0; i < NCAND; i++) {
            const Cand *c = &cand[i];
            if (c->c.ksplit != ks || c->c.wk != wk) continue;
            if (c->us[0] > 0 && c->us[1] > 0) {
                const float v = (c->us[0] + c->us[1]) / 2;
                if (v < b[0]) b[0] = v, bi[0] = i;
            }
            for (int k = 1; k < 4; k++)
                if (c->us[k + 1] > 0 && c->us[k + 1] < b[k]) b[k] = c->us[k + 1], bi[k] = i;
        }
        if (bi[0] < 0 || bi[1] < 0 || bi[2] < 0 || bi[3] < 0) continue;
        if (b[0] + b[1] + b[2] + b[3] < best_score) {
            best_score = b[0] + b[1] + b[2] + b[3];
            *ks_out = ks, *wk_out = wk;
            for (int k = 0; k < 4; k++) out[k] = cand[bi[k]].c;
            found = 1;
        }
    }
    return found;
}

/* 1 when name is one of the comma-separated names in list. */
static int name_listed(const char *list, const char *name) {
    const size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        const size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n)) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

/* ---- the prefill GEMM (--gemm) ---- */

typedef struct {
    uint8_t *pool;
    size_t buf_bytes;
    int nbuf, rows, cols, R;
    splash_q4_gemm_x *xg;
    splash_q4_xprep *xp;
    const float *x;
    float *y;
} GemmCtx;

static int launch_gemm(void *p, int i) {
    GemmCtx *c = (GemmCtx *)p;
    splash_q4_matrix m;
    splash_q4_matrix_init(&m, c->pool + (size_t)(i % c->nbuf) * c->buf_bytes, c->rows, c->cols);
    return splash_q4_gemm(&m, c->xg, c->y, 0, (struct CUstream_st *)g_stream);
}

static int launch_gemm_prep(void *p, int i) {
    (void)i;
    GemmCtx *c = (GemmCtx *)p;
    return splash_q4_gemm_prep(c->xg, c->x, c->R, c->cols, (size_t)c->cols, (struct CUstream_st *)g_stream);
}

static int launch_by16(void *p, int i) { /* what the model did before the GEMM: prep + product per 16 rows */
    GemmCtx *c = (GemmCtx *)p;
    splash_q4_matrix m;
    splash_q4_matrix_init(&m, c->pool + (size_t)(i % c->nbuf) * c->buf_bytes, c->rows, c->cols);
    for (int r0 = 0; r0 < c->R; r0 += 16) {
        const int M = c->R - r0 < 16 ? c->R - r0 : 16;
        int rc = splash_q4_prep_x(c->xp, c->x + (size_t)r0 * c->cols, M, c->cols, c->cols, (struct CUstream_st *)g_stream);
        if (!rc) rc = splash_q4_matmul(&m, c->xp, c->y + (size_t)r0 * c->rows, (struct CUstream_st *)g_stream);
        if (rc) return rc;
    }
    return 0;
}

/* the cuBLASLt path (blas.h): uniform prep; expansion; the fp16 GEMM */
static splash_cuda_blas *g_blas;
static uint16_t *g_w16;
static void *g_blas_ws;

static int launch_prep_uniform(void *p, int i) {
    (void)i;
    GemmCtx *c = (GemmCtx *)p;
    return splash_q4_gemm_prep_uniform(c->xg, c->x, c->R, c->cols, (size_t)c->cols, (struct CUstream_st *)g_stream);
}

static int launch_expand(void *p, int i) {
    GemmCtx *c = (GemmCtx *)p;
    splash_q4_matrix m;
    splash_q4_matrix_init(&m, c->pool + (size_t)(i % c->nbuf) * c->buf_bytes, c->rows, c->cols);
    return splash_q4_expand_f16(&m, g_w16, (struct CUstream_st *)g_stream);
}

static int launch_blas(void *p, int i) {
    (void)i;
    GemmCtx *c = (GemmCtx *)p;
    return splash_cuda_blas_gemm(g_blas, g_w16, c->rows, c->cols, c->xg->hi, c->R, c->xg->alpha, c->xg->alpha + 1, c->y,
                                 g_blas_ws, (struct CUstream_st *)g_stream);
}

static int bench_gemm(const char *only) {
    static const int kRs[] = {64, 128, 256, 512, 1024, 2048, 4096};
    const int nR = (int)(sizeof kRs / sizeof kRs[0]), Rmax = kRs[nR - 1];
    if (splash_cuda_blas_open(&g_blas)) printf("cuBLASLt did not load: its columns are empty\n");
    else SPLASH_CUDA_CHECK(cudaMalloc(&g_blas_ws, SPLASH_CUDA_BLAS_WORKSPACE));
    printf("\nprefill GEMM (q4_gemm.h): median of 20 launches; TFLOP/s = 2 rows cols R / product time\n"
           "cuBLASLt (blas.h): x prepared with one scale (prep), the matrix expanded to fp16 (expand), the GEMM\n");
    printf("| shape | rows x cols | R | prep us | product us | TFLOP/s | weights GB/s | 16-row path us | speed-up |"
           " blas prep us | expand us | blas us | blas TFLOP/s | blas total vs q4_gemm |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int si = 0; si < NSHAPES; si++) {
        const Shape *sh = &kShapes[si];
        if (only ? !name_listed(only, sh->name) : (si < 9 && si != 5 && si != 7)) continue; /* default: stacks, down, out_proj */
        const size_t bytes = (splash_q4_tiled_bytes(sh->rows, sh->cols) + 255) & ~(size_t)255;
        int nbuf = (int)(((size_t)1 << 30) / bytes) + 1;
        if (nbuf < 2) nbuf = 2;
        GemmCtx gc;
        memset(&gc, 0, sizeof gc);
        gc.buf_bytes = bytes, gc.nbuf = nbuf, gc.rows = sh->rows, gc.cols = sh->cols;
        SPLASH_CUDA_CHECK(cudaMalloc((void **)&gc.pool, bytes * nbuf));
        fill_weights<<<4096, 256>>>((uint32_t *)gc.pool, bytes / 4, splash_q4_tiled_codes_bytes(sh->rows, sh->cols) / 4,
                                    nbuf, 777u + si);
        float *x;
        void *xgm, *xpm;
        SPLASH_CUDA_CHECK(cudaMalloc((void **)&x, sizeof(float) * Rmax * sh->cols));
        fill_x<<<1024, 256>>>(x, (size_t)Rmax * sh->cols, 55u + si);
        SPLASH_CUDA_CHECK(cudaMalloc(&xgm, splash_q4_gemm_x_bytes(Rmax, sh->cols)));
        SPLASH_CUDA_CHECK(cudaMalloc(&xpm, splash_q4_xprep_bytes(sh->cols)));
        splash_q4_gemm_x xg;
        splash_q4_xprep xp;
        splash_q4_gemm_x_init(&xg, xgm, Rmax, sh->cols);
        splash_q4_xprep_init(&xp, xpm, sh->cols);
        gc.xg = &xg, gc.xp = &xp, gc.x = x;
        SPLASH_CUDA_CHECK(cudaMalloc((void **)&gc.y, sizeof(float) * Rmax * sh->rows));
        if (g_blas) SPLASH_CUDA_CHECK(cudaMalloc((void **)&g_w16, (size_t)sh->rows * sh->cols * 2));
        for (int ri = 0; ri < nR; ri++) {
            gc.R = kRs[ri];
            const float prep = time_launches_n(launch_gemm_prep, &gc, NULL, 20);
            launch_gemm_prep(&gc, 0);
            const float us = time_launches_n(launch_gemm, &gc, NULL, 20);
            const float old = gc.R <= 256 ? time_launches_n(launch_by16, &gc, NULL, 10) : -1.f;
            const double tf = 2.0 * sh->rows * sh->cols * gc.R / (us * 1e6);
            printf("| %s | %dx%d | %d | %.1f | %.1f | %.0f | %.0f |", sh->name, sh->rows, sh->cols, gc.R, prep, us, tf,
                   (double)bytes / (us * 1e3));
            if (old > 0) printf(" %.1f | %.2fx |", old, old / (prep + us));
            else printf(" - | - |");
            if (!g_blas) {
                printf(" - | - | - | - | - |\n");
                continue;
            }
            const float bprep = time_launches_n(launch_prep_uniform, &gc, NULL, 20);
            launch_prep_uniform(&gc, 0);
            const float ex = time_launches_n(launch_expand, &gc, NULL, 20);
            const float bl = time_launches_n(launch_blas, &gc, NULL, 20);
            printf(" %.1f | %.1f | %.1f | %.0f | %.2fx |\n", bprep, ex, bl, 2.0 * sh->rows * sh->cols * gc.R / (bl * 1e6),
                   (prep + us) / (bprep + ex + bl));
        }
        if (g_blas) cudaFree(g_w16);
        cudaFree(gc.pool), cudaFree(x), cudaFree(xgm), cudaFree(xpm), cudaFree(gc.y);
    }
    return 0;
}

/* ---- --grouped: the 35B-A3B's experts as the model launches them ---- */

/* A MoE layer's grouped products (moe.h, splash_cuda_moe_experts_grouped):
 * gate and up of every (row, k) slot in one launch, then down, each block
 * reading its slot's expert id (decode: 1 row, 8 routed experts + the shared
 * one as expert 256, 9 slots) or its planned group of slots (verify: 8 rows,
 * 72 slots, splash_q4_group_plan).  The ids are random, 64 sets rotated, and
 * the experts' arrays are rotated among copies of >= 1 GiB in all, so the
 * weights come from HBM as in a real step (a layer's experts are not in L2).
 * A grouped block always runs the class-0 kernel, with the config of the
 * shape's class for slots / 8 (decode: class 0, verify: class 3); the sweep
 * prints the configs best for the decode launch and for the verify launch,
 * and the best pair under one ksplit and wk (the shape's, so that a slot's
 * bits do not depend on the launch). */
#define G_EXPERTS 256 /* routed; the shared expert is id G_EXPERTS */
#define G_K 8
#define G_SETS 64
#define G_VROWS 8

typedef struct {
    uint8_t *pool;       /* nbuf copies of one expert array of (G_EXPERTS + 1) matrices (gate: two arrays) */
    size_t stride, buf_bytes;
    int nbuf, rows, cols, down;
    int n_rows;          /* 1 (decode) or G_VROWS (verify) */
    const int32_t *idx;  /* [G_SETS][G_VROWS * (G_K + 1)] */
    const int32_t *plan; /* [G_SETS][plan_ints]; used when n_rows > 1 */
    size_t plan_ints;
    const splash_q4_xprep *xp;
    float *y, *y2;
    const splash_q4_config *cfg; /* NULL: preset */
} GroupCtx;

static int log2i(int v) { /* 1, 2, 4, 8 -> 0..3 (ksplit, wk) */
    int k = 0;
    while (v > 1) v >>= 1, k++;
    return k;
}

static int launch_grouped(void *p, int i) {
    GroupCtx *c = (GroupCtx *)p;
    const int set = i % G_SETS, slots = c->n_rows * (G_K + 1);
    const uint8_t *base = c->pool + (size_t)(i % c->nbuf) * c->buf_bytes;
    splash_q4_matrix m, m2;
    splash_q4_matrix_init(&m, base, c->rows, c->cols);
    splash_q4_matrix_init(&m2, base + c->stride * (G_EXPERTS + 1), c->rows, c->cols);
    const int32_t *idx = c->idx + (size_t)set * G_VROWS * (G_K + 1);
    const int32_t *plan = c->n_rows > 1 ? c->plan + (size_t)set * c->plan_ints : NULL;
    const int xdiv = c->down ? 1 : G_K + 1;
    const splash_q4_matrix *m2p = c->down ? NULL : &m2;
    float *y2 = c->down ? NULL : c->y2;
    struct CUstream_st *s = (struct CUstream_st *)g_stream;
    if (!c->cfg)
        return splash_q4_matmul_grouped(&m, m2p, G_EXPERTS + 1, c->stride, idx, plan, slots, xdiv, c->xp, c->y, y2,
                                        (size_t)c->rows, s);
    return splash_q4_matmul_grouped_cfg(&m, m2p, G_EXPERTS + 1, c->stride, idx, plan, slots, xdiv, c->xp, c->y, y2,
                                        (size_t)c->rows, c->cfg, s);
}

/* rel. L2 of the slots' outputs (gate, and up) against ref; copies them to ref when ref_set */
static double grouped_diff(GroupCtx *c, float *ref, float *tmp, int ref_set) {
    const size_t n = (size_t)c->n_rows * (G_K + 1) * c->rows;
    SPLASH_CUDA_CHECK(cudaMemcpy(tmp, c->y, sizeof(float) * n, cudaMemcpyDeviceToHost));
    if (!c->down) SPLASH_CUDA_CHECK(cudaMemcpy(tmp + n, c->y2, sizeof(float) * n, cudaMemcpyDeviceToHost));
    const size_t all = c->down ? n : 2 * n;
    if (ref_set) {
        memcpy(ref, tmp, sizeof(float) * all);
        return 0;
    }
    double num = 0, den = 0;
    for (size_t k = 0; k < all; k++) {
        const double d = (double)tmp[k] - ref[k];
        num += d * d, den += (double)ref[k] * ref[k];
    }
    return den > 0 ? sqrt(num / den) : 1.0;
}

static int bench_grouped(int sweep, FILE *csv, double locality) {
    static const struct {
        const char *name;
        int rows, cols, down;
    } kG[] = {{"experts gate|up", 512, 2048, 0}, {"experts down", 2048, 512, 1}};
    const int S = G_VROWS * (G_K + 1);
    /* the id sets: per row 8 distinct routed experts, then the shared one; with
     * locality p each of a row's experts is, with probability p, one of the row
     * before's (neighbouring tokens share experts: p = 0 is random routing) */
    int32_t *idx_h = (int32_t *)malloc(sizeof(int32_t) * G_SETS * S);
    uint32_t st = 12345u;
    int repeats = 0;
    for (int set = 0; set < G_SETS; set++)
        for (int r = 0; r < G_VROWS; r++) {
            int32_t *row = idx_h + (size_t)set * S + r * (G_K + 1);
            const int32_t *prev = r ? row - (G_K + 1) : NULL;
            for (int k = 0; k < G_K; k++) {
                int e, dup;
                st = st * 1664525u + 1013904223u;
                const int from_prev = prev && (double)(st >> 8) / 16777216.0 < locality;
                do {
                    st = st * 1664525u + 1013904223u;
                    e = from_prev ? prev[(st >> 8) % G_K] : (int)((st >> 8) % G_EXPERTS), dup = 0;
                    for (int j = 0; j < k; j++) dup |= row[j] == e;
                } while (dup);
                row[k] = e;
                if (prev)
                    for (int j = 0; j < G_K; j++) repeats += prev[j] == e;
            }
            row[G_K] = G_EXPERTS;
        }
    if (csv) fprintf(csv, "shape,rows,cols,kind,r,u,stages,warps,ksplit,wk,decode_us,verify_us,ok\n");
    int32_t *idx, *plan;
    const size_t plan_ints = splash_q4_group_plan_ints(S);
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&idx, sizeof(int32_t) * G_SETS * S));
    SPLASH_CUDA_CHECK(cudaMemcpy(idx, idx_h, sizeof(int32_t) * G_SETS * S, cudaMemcpyHostToDevice));
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&plan, sizeof(int32_t) * G_SETS * plan_ints));
    for (int set = 0; set < G_SETS; set++)
        if (splash_q4_group_plan(idx + (size_t)set * S, S, G_EXPERTS + 1, plan + (size_t)set * plan_ints, NULL)) return 1;
    printf("\ngrouped expert products (35B-A3B: %d experts + the shared one, top-%d; decode: 1 row, %d slots; verify: %d rows,"
           " %d slots planned in groups of %d; locality %.2f: %.1f%% of a row's routed experts the row before's), events,"
           " median\n",
           G_EXPERTS, G_K, G_K + 1, G_VROWS, S, splash_q4_plan_group(), locality,
           100.0 * repeats / ((double)G_SETS * (G_VROWS - 1) * G_K));
    printf("| shape | config (r u s w k wk) decode / (r u s w) verify | decode us | verify us | decode in a graph us | verify in a graph us |\n"
           "|---|---|---|---|---|---|\n");
    for (int gi = 0; gi < 2; gi++) {
        GroupCtx c;
        memset(&c, 0, sizeof c);
        c.rows = kG[gi].rows, c.cols = kG[gi].cols, c.down = kG[gi].down;
        c.stride = (splash_q4_tiled_bytes(c.rows, c.cols) + 255) & ~(size_t)255;
        c.buf_bytes = c.stride * (G_EXPERTS + 1) * (c.down ? 1 : 2);
        c.nbuf = (int)(((size_t)1 << 30) / c.buf_bytes) + 1;
        SPLASH_CUDA_CHECK(cudaMalloc((void **)&c.pool, c.buf_bytes * c.nbuf));
        for (int b = 0; b < c.nbuf * (c.down ? 1 : 2) * (G_EXPERTS + 1); b++) /* each matrix: codes, then scales */
            fill_weights<<<64, 256>>>((uint32_t *)(c.pool + (size_t)b * c.stride), c.stride / 4,
                                      splash_q4_tiled_codes_bytes(c.rows, c.cols) / 4, 1, 4321u + b);
        /* x: G_VROWS rows for gate|up; one row a slot for down (as prep_silu_mul_rows leaves them) */
        const int xrows = c.down ? S : G_VROWS, cap = xrows < 16 ? 16 : xrows;
        float *x;
        void *xmem[2];
        SPLASH_CUDA_CHECK(cudaMalloc((void **)&x, sizeof(float) * (size_t)xrows * c.cols * 2));
        fill_x<<<256, 256>>>(x, (size_t)xrows * c.cols * 2, 7u + gi);
        for (int v = 0; v < 2; v++) SPLASH_CUDA_CHECK(cudaMalloc(&xmem[v], splash_q4_xprep_rows_bytes(c.cols, cap)));
        splash_q4_xprep xp[2]; /* decode, verify */
        float *ys;
        SPLASH_CUDA_CHECK(cudaMalloc((void **)&ys, sizeof(float) * (size_t)xrows * c.cols));
        const size_t nout = (size_t)S * c.rows;
        SPLASH_CUDA_CHECK(cudaMalloc((void **)&c.y, sizeof(float) * nout));
        SPLASH_CUDA_CHECK(cudaMalloc((void **)&c.y2, sizeof(float) * nout));
        float *ref[2], *tmp = (float *)malloc(sizeof(float) * 2 * nout);
        for (int v = 0; v < 2; v++) ref[v] = (float *)malloc(sizeof(float) * 2 * nout);
        c.idx = idx, c.plan = plan, c.plan_ints = plan_ints;
        float pre[2], preg[2];
        splash_q4_config pc[2]; /* the preset's decode and verify configs (splash_q4_matmul_grouped's classes) */
        splash_q4_config_pick_grouped(c.rows, c.cols, 1, &pc[0]);
        splash_q4_config_pick_grouped(c.rows, c.cols, 8 * SPLASH_Q4_MAX_M, &pc[1]);
        for (int v = 0; v < 2; v++) {
            splash_q4_xprep_rows_init(&xp[v], xmem[v], c.cols, cap);
            c.n_rows = v ? G_VROWS : 1;
            const int nx = c.down ? c.n_rows * (G_K + 1) : c.n_rows;
            int rc = c.down ? splash_q4_prep_silu_mul_rows(&xp[v], x, (size_t)c.cols, x + (size_t)xrows * c.cols,
                                                            (size_t)c.cols, ys, (size_t)c.cols, nx, c.cols, NULL)
                            : splash_q4_prep_x(&xp[v], x, nx, c.cols, c.cols, NULL);
            if (rc) return 1;
            c.xp = &xp[v], c.cfg = NULL;
            pre[v] = time_launches(launch_grouped, &c, NULL);
            preg[v] = time_graph(launch_grouped, &c, 20);
            launch_grouped(&c, 0);
            grouped_diff(&c, ref[v], tmp, 1);
        }
        printf("| %s (preset) | %d %d %d %d %d %d / %d %d %d %d | %.2f | %.2f | %.2f | %.2f |\n", kG[gi].name, pc[0].r,
               pc[0].u, pc[0].stages, pc[0].warps, pc[0].ksplit, pc[0].wk, pc[1].r, pc[1].u, pc[1].stages, pc[1].warps,
               pre[0], pre[1], preg[0], preg[1]);
        if (!sweep) goto next;
        {
            float best[2] = {1e30f, 1e30f}; /* decode, verify */
            splash_q4_config bc[2];
            /* per (ksplit, wk): the best decode and verify configs under it */
            float pb[4][4][2];
            splash_q4_config pcfg[4][4][2];
            for (int a = 0; a < 4; a++)
                for (int b = 0; b < 4; b++) pb[a][b][0] = pb[a][b][1] = 1e30f;
            memset(bc, 0, sizeof bc);
            for (int ci = 0; ci < NCAND; ci++) {
                splash_q4_config cf = cand_config(ci);
                if (splash_q4_config_check(&cf, c.rows, c.cols)) continue;
                float us[2];
                int ok = 1;
                for (int v = 0; v < 2; v++) {
                    c.n_rows = v ? G_VROWS : 1, c.xp = &xp[v], c.cfg = &cf;
                    us[v] = time_launches_n(launch_grouped, &c, NULL, NRUN_SWEEP);
                    launch_grouped(&c, 0);
                    ok &= us[v] > 0 && grouped_diff(&c, ref[v], tmp, 0) < 1e-5;
                }
                if (csv)
                    fprintf(csv, "%s,%d,%d,grouped,%d,%d,%d,%d,%d,%d,%.2f,%.2f,%s\n", kG[gi].name, c.rows, c.cols, cf.r,
                            cf.u, cf.stages, cf.warps, cf.ksplit, cf.wk, us[0], us[1], ok ? "ok" : "BAD");
                if (!ok) continue;
                const int a = log2i(cf.ksplit), b = log2i(cf.wk);
                for (int v = 0; v < 2; v++) {
                    if (us[v] < best[v]) best[v] = us[v], bc[v] = cf;
                    if (us[v] < pb[a][b][v]) pb[a][b][v] = us[v], pcfg[a][b][v] = cf;
                }
            }
            int ba = -1, bb = -1; /* the pair: decode + verify least under one ksplit and wk */
            for (int a = 0; a < 4; a++)
                for (int b = 0; b < 4; b++)
                    if (pb[a][b][0] < 1e30f && pb[a][b][1] < 1e30f &&
                        (ba < 0 || pb[a][b][0] + pb[a][b][1] < pb[ba][bb][0] + pb[ba][bb][1]))
                        ba = a, bb = b;
            static const char *what[3] = {"best decode", "best verify", "best pair"};
            for (int k = 0; k < 3; k++) {
                const splash_q4_config *cd = k < 2 ? &bc[k] : ba >= 0 ? &pcfg[ba][bb][0] : NULL;
                const splash_q4_config *cv = k < 2 ? &bc[k] : ba >= 0 ? &pcfg[ba][bb][1] : NULL;
                if ((k < 2 && best[k] >= 1e30f) || !cd) continue;
                float t[2], tg[2];
                for (int v = 0; v < 2; v++) {
                    c.n_rows = v ? G_VROWS : 1, c.xp = &xp[v], c.cfg = v ? cv : cd;
                    t[v] = time_launches(launch_grouped, &c, NULL);
                    tg[v] = time_graph(launch_grouped, &c, 20);
                }
                printf("| %s (%s) | %d %d %d %d %d %d / %d %d %d %d | %.2f | %.2f | %.2f | %.2f |\n", kG[gi].name, what[k],
                       cd->r, cd->u, cd->stages, cd->warps, cd->ksplit, cd->wk, cv->r, cv->u, cv->stages, cv->warps, t[0],
                       t[1], tg[0], tg[1]);
            }
        }
    next:
        cudaFree(c.pool), cudaFree(x), cudaFree(xmem[0]), cudaFree(xmem[1]), cudaFree(ys), cudaFree(c.y), cudaFree(c.y2);
        free(tmp), free(ref[0]), free(ref[1]);
    }
    cudaFree(idx), cudaFree(plan), free(idx_h);
    return 0;
}

int main(int argc, char **argv) {
    int sweep = 0, gemm = 0, grouped = 0;
    double locality = 0; /* --grouped: the share of a verify row's experts taken from the row before */
    const char *csv_path = NULL, *only = NULL, *scan = NULL;
    int m_only = 0; /* --m M: time that M only (a profiler's single launch) */
    NVAR = splash_q4_compiled_variants(kVariants, MAXVAR);
    if (NVAR > MAXVAR) return 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sweep")) sweep = 1;
        else if (!strcmp(argv[i], "--gemm")) gemm = 1;
        else if (!strcmp(argv[i], "--grouped")) grouped = 1;
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv_path = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--m") && i + 1 < argc) m_only = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rows-scan") && i + 1 < argc) scan = argv[++i];
        else if (!strcmp(argv[i], "--locality") && i + 1 < argc) locality = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--sweep] [--csv FILE] [--only NAME,NAME...] [--m M] | --gemm [--only NAME,...] | "
                            "--rows-scan NAME | --grouped [--sweep] [--csv FILE] [--locality P]\n",
                    argv[0]);
            return 2;
        }
    }
    FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
    if (csv && !grouped) fprintf(csv, "shape,rows,cols,M,r,u,stages,warps,ksplit,wk,us,spread_us,GBps,ok\n");

    cudaDeviceProp prop;
    SPLASH_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MB, %.0f GB memory\n", prop.name, prop.multiProcessorCount,
           prop.l2CacheSize >> 20, prop.totalGlobalMem / 1e9);
    for (int i = 0; i < 2 * NRUN; i++) SPLASH_CUDA_CHECK(cudaEventCreate(&ev[i]));
    if (gemm) return bench_gemm(only);
    if (grouped) return bench_grouped(sweep, csv, locality);
    if (scan) return rows_scan(scan, prop.multiProcessorCount);

    /* Ceilings. */
    const size_t cbytes = (size_t)1 << 30;
    CopyCtx cc;
    cc.bytes = cbytes;
    SPLASH_CUDA_CHECK(cudaMalloc(&cc.a, cbytes));
    SPLASH_CUDA_CHECK(cudaMalloc(&cc.b, cbytes));
    fill_x<<<4096, 256>>>((float *)cc.a, cbytes / 4, 1);
    fill_x<<<4096, 256>>>((float *)cc.b, cbytes / 4, 2);
    float sp;
    const float copy_us = time_launches(launch_copy, &cc, &sp);
    const double copy_gbs = 2.0 * cbytes / (copy_us * 1e3);
    ReadCtx rc = {(const uint4 *)cc.a, cbytes / 16, NULL, prop.multiProcessorCount * 4};
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&rc.sink, 4));
    const float read_us = time_launches(launch_read, &rc, NULL);
    const double read_gbs = cbytes / (read_us * 1e3);
    const float empty_us = time_launches(launch_empty, NULL, NULL);
    printf("copy (D2D 1 GiB, read+write): %.0f GB/s (%.1f us, p10-p90 %.1f us)\n", copy_gbs, copy_us, sp);
    printf("read-only stream (1 GiB): %.0f GB/s; empty kernel between events: %.2f us\n", read_gbs, empty_us);
    cudaFree(cc.a);
    cudaFree(cc.b);

    Row rows[NSHAPES][NMS];
    memset(rows, 0, sizeof rows);
    float prep_us[NMS] = {-1, -1, -1, -1, -1};
    static Cand cand[MAXCAND];
    char preset_lines[NSHAPES][320];
    memset(preset_lines, 0, sizeof preset_lines);

    for (int si = 0; si < NSHAPES; si++) {
        const Shape *sh = &kShapes[si];
        if (only && !name_listed(only, sh->name)) {
            rows[si][0].bytes = -1; /* not measured: left out of the table */
            continue;
        }
        if (si == 5 && (!only || name_listed(only, kShapes[2].name))) { /* out_proj has o_proj's shape: same figures */
            memcpy(rows[si], rows[2], sizeof rows[si]);
            continue;
        }
        const size_t bytes = (splash_q4_tiled_bytes(sh->rows, sh->cols) + 255) & ~(size_t)255;
        int nbuf = (int)(((size_t)1 << 30) / bytes) + 1;
        if (nbuf < 2) nbuf = 2;
        MatCtx mc;
        mc.buf_bytes = bytes, mc.nbuf = nbuf, mc.rows = sh->rows, mc.cols = sh->cols;
        SPLASH_CUDA_CHECK(cudaMalloc((void **)&mc.pool, bytes * nbuf));
        fill_weights<<<4096, 256>>>((uint32_t *)mc.pool, bytes / 4, splash_q4_tiled_codes_bytes(sh->rows, sh->cols) / 4,
                                    nbuf, 1234u + si);
        float *x;
        void *xmem;
        SPLASH_CUDA_CHECK(cudaMalloc((void **)&x, sizeof(float) * 16 * sh->cols));
        fill_x<<<64, 256>>>(x, 16 * (size_t)sh->cols, 99u + si);
        SPLASH_CUDA_CHECK(cudaMalloc(&xmem, splash_q4_xprep_bytes(sh->cols)));
        splash_q4_xprep xp;
        splash_q4_xprep_init(&xp, xmem, sh->cols);
        mc.xp = &xp;
        SPLASH_CUDA_CHECK(cudaMalloc((void **)&mc.y, sizeof(float) * 16 * sh->rows));
        float *yref = (float *)malloc(sizeof(float) * 16 * sh->rows), *ytry = (float *)malloc(sizeof(float) * 16 * sh->rows);
        for (int i = 0; i < NCAND; i++) {
            cand[i].c = cand_config(i);
            for (int mi = 0; mi < NMS; mi++) cand[i].us[mi] = -1;
        }
        for (int mi = 0; mi < NMS; mi++) {
            const int M = kMs[mi];
            if (m_only && M != m_only) continue;
            PrepCtx pc = {&xp, x, M, sh->cols};
            const float pu = time_launches(launch_prep, &pc, NULL);
            if (prep_us[mi] < 0) prep_us[mi] = pu; /* the first shape measured (5,120 columns but for down) */
            Row *rw = &rows[si][mi];
            rw->bytes = (double)splash_q4_tiled_bytes(sh->rows, sh->cols);
            splash_q4_config_pick(sh->rows, sh->cols, M, &rw->cfg);
            mc.cfg = NULL;
            rw->preset_us = rw->us = time_launches(launch_mat, &mc, &rw->spread);
            /* the preset's output (buffer 0) is the reference for the sweep */
            launch_mat(&mc, 0);
            SPLASH_CUDA_CHECK(cudaMemcpy(yref, mc.y, sizeof(float) * M * sh->rows, cudaMemcpyDeviceToHost));
            if (csv)
                fprintf(csv, "%s,%d,%d,%d,%d,%d,%d,%d,%d,%d,%.2f,%.2f,%.1f,preset\n", sh->name, sh->rows, sh->cols, M,
                        rw->cfg.r, rw->cfg.u, rw->cfg.stages, rw->cfg.warps, rw->cfg.ksplit, rw->cfg.wk, rw->us, rw->spread,
                        rw->bytes / (rw->us * 1e3));
            if (!sweep) continue;
            for (int ci = 0; ci < NCAND; ci++) {
                splash_q4_config c = cand[ci].c;
                if (splash_q4_config_check(&c, sh->rows, sh->cols)) continue;
                mc.cfg = &c;
                float spr = 0.f;
                const float us = time_launches_n(launch_mat, &mc, &spr, NRUN_SWEEP);
                launch_mat(&mc, 0);
                SPLASH_CUDA_CHECK(cudaMemcpy(ytry, mc.y, sizeof(float) * M * sh->rows, cudaMemcpyDeviceToHost));
                double num = 0, den = 0;
                for (size_t k = 0; k < (size_t)M * sh->rows; k++) {
                    const double d = (double)ytry[k] - yref[k];
                    num += d * d, den += (double)yref[k] * yref[k];
                }
                const int ok = us > 0 && sqrt(num / den) < 1e-5;
                if (ok) cand[ci].us[mi] = us;
                if (csv)
                    fprintf(csv, "%s,%d,%d,%d,%d,%d,%d,%d,%d,%d,%.2f,%.2f,%.1f,%s\n", sh->name, sh->rows, sh->cols, M, c.r,
                            c.u, c.stages, c.warps, c.ksplit, c.wk, us, spr, rw->bytes / (us * 1e3), ok ? "ok" : "BAD");
            }
            mc.cfg = NULL;
        }
        splash_q4_config sel[4];
        int ks = 0, wk = 0;
        const int have_sel = sweep && select_presets(cand, &ks, &wk, sel);
        if (sweep && m_only) { /* one class swept: its best config at the shape's own ksplit / wk (its bits) */
            int mi = 0;
            while (mi < NMS && kMs[mi] != m_only) mi++;
            splash_q4_config pre;
            splash_q4_config_pick(sh->rows, sh->cols, m_only, &pre);
            int best = -1;
            for (int i = 0; mi < NMS && i < NCAND; i++)
                if (cand[i].us[mi] > 0 && cand[i].c.ksplit == pre.ksplit && cand[i].c.wk == pre.wk &&
                    (best < 0 || cand[i].us[mi] < cand[best].us[mi]))
                    best = i;
            if (best >= 0)
                snprintf(preset_lines[si], sizeof preset_lines[si],
                         "    %s (M = %d, ksplit %d, wk %d): {%d, %d, %d, %d, 0, 0} %.2f us; the preset {%d, %d, %d, %d} "
                         "%.2f us",
                         sh->name, m_only, pre.ksplit, pre.wk, cand[best].c.r, cand[best].c.u, cand[best].c.stages,
                         cand[best].c.warps, cand[best].us[mi], pre.r, pre.u, pre.stages, pre.warps,
                         rows[si][mi].preset_us);
        }
        if (have_sel)
            snprintf(preset_lines[si], sizeof preset_lines[si],
                     "    {%d, %d, %d, %d, {{%d, %d, %d, %d, 0, 0}, {%d, %d, %d, %d, 0, 0}, {%d, %d, %d, %d, 0, 0}, "
                     "{%d, %d, %d, %d, 0, 0}}}, /* %s */",
                     sh->rows, sh->cols, ks, wk, sel[0].r, sel[0].u, sel[0].stages, sel[0].warps, sel[1].r, sel[1].u,
                     sel[1].stages, sel[1].warps, sel[2].r, sel[2].u, sel[2].stages, sel[2].warps, sel[3].r, sel[3].u,
                     sel[3].stages, sel[3].warps, sh->name);
        /* the reported figures: the selected config (or the preset), full method */
        for (int mi = 0; mi < NMS; mi++) {
            const int M = kMs[mi];
            if (m_only && M != m_only) continue;
            Row *rw = &rows[si][mi];
            PrepCtx pc = {&xp, x, M, sh->cols};
            launch_prep(&pc, 0);
            splash_q4_config c = rw->cfg;
            if (have_sel) {
                c = sel[M <= 2 ? 0 : M <= 4 ? 1 : M <= 8 ? 2 : 3];
                c.ksplit = ks, c.wk = wk;
                rw->cfg = c;
                mc.cfg = &c;
                rw->us = time_launches(launch_mat, &mc, &rw->spread);
            }
            rw->graph_us = time_graph(launch_mat, &mc, nbuf < 20 ? nbuf : 20);
            mc.cfg = NULL;
        }
        free(yref);
        free(ytry);
        cudaFree(mc.pool);
        cudaFree(x);
        cudaFree(xmem);
        cudaFree(mc.y);
    }
    if (csv) fclose(csv);

    printf("\nprep_x (x -> scaled fp16 hi/lo + group sums, the first shape's columns): ");
    for (int mi = 0; mi < NMS; mi++) printf("M=%d %.2f us  ", kMs[mi], prep_us[mi]);
    printf("\n");
    if (sweep) {
        printf("\npresets selected by the sweep (for kPresets in q4_matmul.cu):\n");
        for (int si = 0; si < NSHAPES; si++)
            if (preset_lines[si][0]) printf("%s\n", preset_lines[si]);
    }
    printf("\nq4 product, %s; copy ceiling %.0f GB/s, read-only %.0f GB/s\n",
           sweep ? "configs selected by the sweep" : "preset configs", copy_gbs, read_gbs);
    printf("| shape | rows x cols | M | config (r u s w k wk) | time us (events, median) | p10-p90 us | us in a graph | "
           "GB/s weights | of copy bw | vs M=1 | compiled preset us |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int si = 0; si < NSHAPES; si++)
        for (int mi = 0; mi < NMS; mi++) {
            const Row *rw = &rows[si][mi];
            if (rows[si][0].bytes < 0 || rw->us <= 0) continue; /* left out (--only, --m) */
            const double gbs = rw->bytes / (rw->us * 1e3);
            printf("| %s | %dx%d | %d | %d %d %d %d %d %d | %.2f | %.2f | %.2f | %.0f | %.1f%% | %.2fx | %.2f |\n",
                   kShapes[si].name, kShapes[si].rows, kShapes[si].cols, kMs[mi], rw->cfg.r, rw->cfg.u, rw->cfg.stages,
                   rw->cfg.warps, rw->cfg.ksplit, rw->cfg.wk, rw->us, rw->spread, rw->graph_us, gbs, 100.0 * gbs / copy_gbs,
                   rows[si][0].us > 0 ? rw->us / rows[si][0].us : 0.0, rw->preset_us);
        }
    return 0;
}
