/* test_q4_matmul.cu - the CUDA q4 matrix-vector / small-M product against an
 * fp64 CPU reference.  Runs on the GPU machine (tools/gpu_q4_matmul.sh).
 *
 * For each shape: random float weights are quantised here on the host into the
 * package's canonical q4 layout (tensor.h), repacked with the library's host
 * repack, uploaded; x is random fp32.  The reference dequantises the stored
 * codes/scales/biases and sums in double.  Checked per (shape, M):
 *   - relative L2 error over the checked rows <= kTol (x rows of different
 *     scales, one all-positive, so the per-row power-of-two scaling and the
 *     bias term are exercised);
 *   - every output element written (y is poisoned with NaN first) and finite;
 *   - row 0 of x gives bitwise the same outputs whatever M is (the library
 *     promises results independent of M for a fixed shape).
 * Small odd shapes run every compiled config (r, u, warps, ksplit) and check
 * that configs with the same ksplit agree bitwise.  The largest shapes compare a
 * sample of rows (first and last tiles plus a stride) to keep the fp64
 * reference to seconds; the GPU still computes, and we still check, all rows.
 * The prefill GEMM (q4_gemm.h): fp16-grade bounds against the same fp64
 * reference, row independence, the add form, and which matrices it takes
 * (test_q4_matmul --gemm runs only those).
 * Prints PASS/FAIL lines and ends with "N passed, N failed".
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/blas.h"
#include "backend/cuda/q4_gemm.h"
#include "backend/cuda/q4_matmul.h"

static const double kTol = 2e-5; /* relative L2; fp32-grade results land near 1e-6 */

static int n_pass, n_fail;

static void result(bool ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    if (ok) n_pass++;
    else n_fail++;
}

/* ---- random numbers (splitmix64) ---- */
static uint64_t rng_state;
static inline uint64_t rng_u64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline float rng_uniform(float lo, float hi) { /* [lo, hi) */
    return lo + (hi - lo) * (float)((rng_u64() >> 40) * (1.0 / 16777216.0));
}

static uint16_t f32_to_bf16(float f) { /* round to nearest even, finite inputs */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* A canonical q4 matrix on the host (tensor.h layout). */
typedef struct {
    int rows, cols;
    uint8_t *blob;
    size_t bytes;
    const uint8_t *codes;
    const uint16_t *scales, *biases;
} HostQ4;

static void host_q4_make(HostQ4 *w, int rows, int cols, uint64_t seed) {
    const int groups = cols / 64;
    const size_t codes = (size_t)rows * cols / 2, sb = (size_t)rows * groups * 2;
    w->rows = rows, w->cols = cols;
    w->bytes = align64(codes) + 2 * align64(sb);
    w->blob = (uint8_t *)calloc(1, w->bytes);
    if (!w->blob) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    uint8_t *c = w->blob;
    uint16_t *s = (uint16_t *)(w->blob + align64(codes));
    uint16_t *b = (uint16_t *)(w->blob + align64(codes) + align64(sb));
    rng_state = seed;
    float v[64];
    for (int r = 0; r < rows; r++) {
        const float row_scale = rng_uniform(0.25f, 2.0f);
        for (int G = 0; G < groups; G++) {
            /* an off-centre range per group, so biases are not just -8*scale */
            const float centre = rng_uniform(-0.5f, 0.5f) * row_scale;
            float lo = 1e30f, hi = -1e30f;
            for (int i = 0; i < 64; i++) {
                v[i] = centre + rng_uniform(-1.f, 1.f) * row_scale;
                lo = fminf(lo, v[i]), hi = fmaxf(hi, v[i]);
            }
            const uint16_t sbits = f32_to_bf16((hi - lo) / 15.f), bbits = f32_to_bf16(lo);
            const float sf = bf16_to_f32(sbits), bf = bf16_to_f32(bbits);
            s[(size_t)r * groups + G] = sbits;
            b[(size_t)r * groups + G] = bbits;
            for (int i = 0; i < 64; i += 2) {
                int q0 = (int)lrintf((v[i] - bf) / sf), q1 = (int)lrintf((v[i + 1] - bf) / sf);
                q0 = q0 < 0 ? 0 : q0 > 15 ? 15 : q0;
                q1 = q1 < 0 ? 0 : q1 > 15 ? 15 : q1;
                c[(size_t)r * (cols / 2) + (size_t)G * 32 + i / 2] = (uint8_t)(q0 | (q1 << 4));
            }
        }
    }
    w->codes = c, w->scales = s, w->biases = b;
}

/* Dequantised row r in double: w = scale * q + bias with the stored values. */
static void host_q4_row(const HostQ4 *w, int r, double *out) {
    const int groups = w->cols / 64;
    for (int c = 0; c < w->cols; c++) {
        const uint8_t byte = w->codes[(size_t)r * (w->cols / 2) + c / 2];
        const int q = (c & 1) ? byte >> 4 : byte & 15;
        const double sc = bf16_to_f32(w->scales[(size_t)r * groups + c / 64]);
        const double bi = bf16_to_f32(w->biases[(size_t)r * groups + c / 64]);
        out[c] = sc * q + bi;
    }
}

/* A tiled blob onto the device, described in *dm; the device pointer (cudaFree it). */
static void *upload_tiled(const uint8_t *tiled, int rows, int cols, splash_q4_matrix *dm) {
    const size_t tb = splash_q4_tiled_bytes(rows, cols);
    void *dev;
    SPLASH_CUDA_CHECK(cudaMalloc(&dev, tb));
    SPLASH_CUDA_CHECK(cudaMemcpy(dev, tiled, tb, cudaMemcpyHostToDevice));
    if (splash_q4_matrix_init(dm, dev, rows, cols) != 0) exit(1);
    return dev;
}

/* Rows the fp64 reference checks: all of a small matrix; else the first and
 * last 64 rows and ~2000 strided ones. */
static int pick_rows(int rows, int *out) {
    if (rows <= 4096) {
        for (int r = 0; r < rows; r++) out[r] = r;
        return rows;
    }
    int n = 0;
    for (int r = 0; r < 64; r++) out[n++] = r;
    const int stride = rows / 2000;
    for (int r = 64 + 7; r < rows - 64; r += stride) out[n++] = r;
    for (int r = rows - 64; r < rows; r++) out[n++] = r;
    return n;
}

typedef struct {
    HostQ4 h;
    splash_q4_matrix dm;
    void *dev;
    float *x_host; /* [16][cols] */
    float *x_dev;
    void *xp_mem;
    splash_q4_xprep xp;
    float *y_dev;
    float *y_host; /* [16][rows] */
    int *check_rows, n_check;
    double *ref; /* [16][n_check] */
} Case;

static void case_setup(Case *k, int rows, int cols, uint64_t seed) {
    memset(k, 0, sizeof *k);
    host_q4_make(&k->h, rows, cols, seed);
    const size_t tb = splash_q4_tiled_bytes(rows, cols);
    uint8_t *tiled = (uint8_t *)malloc(tb);
    if (!tiled || splash_q4_repack_host(k->h.blob, rows, cols, tiled, tb) != 0) {
        fprintf(stderr, "repack failed for %dx%d\n", rows, cols);
        exit(1);
    }
    k->dev = upload_tiled(tiled, rows, cols, &k->dm);
    free(tiled);

    /* x: 16 rows, a third of them with a larger spread, one row of constant sign */
    k->x_host = (float *)malloc(sizeof(float) * 16 * cols);
    for (int m = 0; m < 16; m++)
        for (int c = 0; c < cols; c++) {
            float v = rng_uniform(-1.f, 1.f) * (m % 3 == 2 ? 8.f : 1.f);
            k->x_host[(size_t)m * cols + c] = m == 5 ? fabsf(v) + 0.1f : v;
        }
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&k->x_dev, sizeof(float) * 16 * cols));
    SPLASH_CUDA_CHECK(cudaMemcpy(k->x_dev, k->x_host, sizeof(float) * 16 * cols, cudaMemcpyHostToDevice));
    SPLASH_CUDA_CHECK(cudaMalloc(&k->xp_mem, splash_q4_xprep_bytes(cols)));
    if (splash_q4_xprep_init(&k->xp, k->xp_mem, cols) != 0) exit(1);
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&k->y_dev, sizeof(float) * 16 * rows));
    k->y_host = (float *)malloc(sizeof(float) * 16 * rows);

    k->check_rows = (int *)malloc(sizeof(int) * (rows < 4200 ? rows : 4200));
    k->n_check = pick_rows(rows, k->check_rows);
    k->ref = (double *)malloc(sizeof(double) * 16 * k->n_check);
    double *wrow = (double *)malloc(sizeof(double) * cols);
    for (int i = 0; i < k->n_check; i++) {
        host_q4_row(&k->h, k->check_rows[i], wrow);
        for (int m = 0; m < 16; m++) {
            const float *x = k->x_host + (size_t)m * cols;
            double s = 0;
            for (int c = 0; c < cols; c++) s += wrow[c] * (double)x[c];
            k->ref[(size_t)m * k->n_check + i] = s;
        }
    }
    free(wrow);
}

static void case_free(Case *k) {
    free(k->h.blob);
    cudaFree(k->dev);
    free(k->x_host);
    cudaFree(k->x_dev);
    cudaFree(k->xp_mem);
    cudaFree(k->y_dev);
    free(k->y_host);
    free(k->check_rows);
    free(k->ref);
}

/* Runs one product (cfg NULL = preset) into k->y_host; returns rel. L2 error
 * over the checked rows, or -1 if an element was unwritten / not finite. */
static double run_one(Case *k, int M, const splash_q4_config *cfg, int *rc_out) {
    const int rows = k->h.rows;
    SPLASH_CUDA_CHECK(cudaMemset(k->y_dev, 0xFF, sizeof(float) * 16 * rows)); /* NaN */
    int rc = splash_q4_prep_x(&k->xp, k->x_dev, M, k->h.cols, k->h.cols, NULL);
    if (!rc) rc = cfg ? splash_q4_matmul_cfg(&k->dm, &k->xp, k->y_dev, cfg, NULL) : splash_q4_matmul(&k->dm, &k->xp, k->y_dev, NULL);
    *rc_out = rc;
    if (rc) return -1;
    SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
    SPLASH_CUDA_CHECK(cudaMemcpy(k->y_host, k->y_dev, sizeof(float) * 16 * rows, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < (size_t)M * rows; i++)
        if (!isfinite(k->y_host[i])) return -1;
    double num = 0, den = 0;
    for (int m = 0; m < M; m++)
        for (int i = 0; i < k->n_check; i++) {
            const double ref = k->ref[(size_t)m * k->n_check + i];
            const double d = (double)k->y_host[(size_t)m * rows + k->check_rows[i]] - ref;
            num += d * d, den += ref * ref;
        }
    return sqrt(num / den);
}

static void cfg_str(const splash_q4_config *c, char *buf, size_t n) {
    snprintf(buf, n, "r%d u%d s%d w%d k%d wk%d", c->r, c->u, c->stages, c->warps, c->ksplit, c->wk);
}

/* Preset path for M = 1, 2, 4, 8, 16 (plus odd M on small shapes) and the
 * bitwise M-independence of row 0. */
static void test_shape(const char *name, int rows, int cols, uint64_t seed, int odd_m) {
    Case k;
    case_setup(&k, rows, cols, seed);
    float *y0 = (float *)malloc(sizeof(float) * rows);
    const int ms_main[] = {1, 2, 4, 8, 16}, ms_odd[] = {1, 2, 3, 4, 5, 8, 11, 16};
    const int *ms = odd_m ? ms_odd : ms_main;
    const int nm = odd_m ? 8 : 5;
    for (int i = 0; i < nm; i++) {
        const int M = ms[i];
        splash_q4_config cfg;
        splash_q4_config_pick(rows, cols, M, &cfg);
        char cs[64];
        cfg_str(&cfg, cs, sizeof cs);
        int rc;
        const double err = run_one(&k, M, NULL, &rc);
        result(rc == 0 && err >= 0 && err <= kTol, "%-10s %6dx%-6d M=%-2d [%s] rel_l2=%.3g (rc %d)", name, rows,
               cols, M, cs, err, rc);
        if (rc == 0 && err >= 0) {
            if (i == 0) memcpy(y0, k.y_host, sizeof(float) * rows);
            else
                result(memcmp(y0, k.y_host, sizeof(float) * rows) == 0, "%-10s %6dx%-6d M=%-2d row 0 bitwise equal to M=1",
                       name, rows, cols, M);
        }
    }
    free(y0);
    case_free(&k);
}

/* Every compiled config on a small shape, each M class; configs sharing a
 * ksplit must agree bitwise. */
static void test_all_configs(const char *name, int rows, int cols, uint64_t seed) {
    Case k;
    case_setup(&k, rows, cols, seed);
    /* (r, u, stages) as compiled in q4_matmul.cu */
    int rus[64][3];
    const int nrus = splash_q4_compiled_variants(rus, 64);
    result(nrus > 0 && nrus <= 64, "%d compiled variants", nrus);
    static const int warps[] = {1, 3, 4, 8}, ks[] = {1, 2, 4, 8}, wks[] = {1, 2, 4, 8}, ms[] = {1, 3, 7, 13};
    float *base = (float *)malloc(sizeof(float) * 16 * rows), *y2 = (float *)malloc(sizeof(float) * 16 * rows);
    const size_t xp_bytes = splash_q4_xprep_bytes(cols);
    for (int mi = 0; mi < 4; mi++) {
        const int M = ms[mi];
        int worst_ok = 1, n = 0, nbit = 0, bit_ok = 1, padded_ok = 1;
        double worst = 0;
        char worst_cfg[64] = "";
        for (int kw = 0; kw < 16; kw++) { /* (ksplit, wk): one arithmetic order each */
            const int ki = kw / 4, wki = kw % 4;
            int have_base = 0;
            for (int ri = 0; ri < nrus; ri++)
                for (int wi = 0; wi < 4; wi++) {
                    splash_q4_config c = {rus[ri][0], rus[ri][1], rus[ri][2], warps[wi], ks[ki], wks[wki]};
                    const int ck = splash_q4_config_check(&c, rows, cols);
                    if (ck == SPLASH_E_UNSUPPORTED && ks[ki] == 1 && warps[wi] == 1 && wks[wki] == 1) {
                        result(false, "config r%d u%d s%d refused", c.r, c.u, c.stages);
                        continue;
                    }
                    if (ck != 0) continue;
                    int rc;
                    /* the preparation's blocks the other way round (splash_q4_prep_padded: by
                     * default for the padded rows only, else all 16), the xprep poisoned first
                     * (0xFF: NaN sums, -1 digits) so a read of a row a setting does not write
                     * shows; then the default, whose result the checks use, poisoned too */
                    const int was = splash_q4_prep_padded();
                    SPLASH_CUDA_CHECK(cudaMemset(k.xp_mem, 0xFF, xp_bytes));
                    splash_q4_set_prep_padded(!was);
                    (void)run_one(&k, M, &c, &rc);
                    splash_q4_set_prep_padded(was);
                    memcpy(y2, k.y_host, sizeof(float) * M * rows);
                    const int rc2 = rc;
                    SPLASH_CUDA_CHECK(cudaMemset(k.xp_mem, 0xFF, xp_bytes));
                    const double err = run_one(&k, M, &c, &rc);
                    if (rc2 || rc || memcmp(y2, k.y_host, sizeof(float) * M * rows)) padded_ok = 0;
                    n++;
                    if (rc || err < 0 || err > kTol) {
                        worst_ok = 0;
                        cfg_str(&c, worst_cfg, sizeof worst_cfg);
                        worst = err;
                        continue;
                    }
                    if (err > worst && worst_ok) {
                        worst = err;
                        cfg_str(&c, worst_cfg, sizeof worst_cfg);
                    }
                    if (!have_base) {
                        memcpy(base, k.y_host, sizeof(float) * M * rows);
                        have_base = 1;
                    } else {
                        nbit++;
                        if (memcmp(base, k.y_host, sizeof(float) * M * rows) != 0) bit_ok = 0;
                    }
                }
        }
        result(worst_ok && n > 0, "%-10s %6dx%-6d M=%-2d all %d configs, worst rel_l2=%.3g [%s]", name, rows, cols, M,
               n, worst, worst_cfg);
        result(bit_ok, "%-10s %6dx%-6d M=%-2d %d configs bitwise equal to their (ksplit, wk)'s first", name, rows, cols, M,
               nbit);
        result(padded_ok, "%-10s %6dx%-6d M=%-2d %d configs: preparation of the padded rows only = of 16 (bitwise)", name,
               rows, cols, M, n);
    }
    free(base), free(y2);
    case_free(&k);
}

/* Stacked parts (splash_q4_repack_stacked_host) against each part's fp64
 * reference, the padding rows between parts exactly 0; then y += W x
 * (splash_q4_matmul_add) bitwise equal to fl(y + product) for M = 1, 5, 16. */
static void test_stacked_add(void) {
    const int cols = 320, n = 3, prow[3] = {40, 24, 70};
    HostQ4 parts[3];
    const uint8_t *src[3];
    for (int i = 0; i < n; i++) host_q4_make(&parts[i], prow[i], cols, 41 + i), src[i] = parts[i].blob;
    const int rows = splash_q4_stacked_rows(prow, n);
    result(rows == 48 + 32 + 70, "stacked rows %d (parts start on tiles)", rows);
    const size_t tb = splash_q4_tiled_bytes(rows, cols);
    uint8_t *tiled = (uint8_t *)malloc(tb);
    result(tiled && splash_q4_repack_stacked_host(src, prow, n, cols, tiled, tb) == 0, "stacked repack");
    splash_q4_matrix dm;
    void *dev = upload_tiled(tiled, rows, cols, &dm);
    free(tiled);
    float *xh = (float *)malloc(sizeof(float) * 16 * cols), *yh = (float *)malloc(sizeof(float) * 16 * rows);
    float *base = (float *)malloc(sizeof(float) * 16 * rows), *sum = (float *)malloc(sizeof(float) * 16 * rows);
    for (int i = 0; i < 16 * cols; i++) xh[i] = rng_uniform(-2.f, 2.f);
    for (int i = 0; i < 16 * rows; i++) base[i] = rng_uniform(-50.f, 50.f);
    float *xd, *yd;
    void *xpm;
    splash_q4_xprep xp;
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&xd, sizeof(float) * 16 * cols));
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&yd, sizeof(float) * 16 * rows));
    SPLASH_CUDA_CHECK(cudaMalloc(&xpm, splash_q4_xprep_bytes(cols)));
    splash_q4_xprep_init(&xp, xpm, cols);
    SPLASH_CUDA_CHECK(cudaMemcpy(xd, xh, sizeof(float) * 16 * cols, cudaMemcpyHostToDevice));
    double *wrow = (double *)malloc(sizeof(double) * cols);
    const int ms[3] = {1, 5, 16};
    for (int t = 0; t < 3; t++) {
        const int M = ms[t];
        SPLASH_CUDA_CHECK(cudaMemset(yd, 0xFF, sizeof(float) * 16 * rows));
        int rc = splash_q4_prep_x(&xp, xd, M, cols, cols, NULL);
        if (!rc) rc = splash_q4_matmul(&dm, &xp, yd, NULL);
        SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
        SPLASH_CUDA_CHECK(cudaMemcpy(yh, yd, sizeof(float) * M * rows, cudaMemcpyDeviceToHost));
        double num = 0, den = 0;
        int pad_ok = 1, r0 = 0;
        for (int i = 0; i < n; i++) {
            for (int r = 0; r < prow[i]; r++) {
                host_q4_row(&parts[i], r, wrow);
                for (int m = 0; m < M; m++) {
                    double ref = 0;
                    for (int c = 0; c < cols; c++) ref += wrow[c] * (double)xh[(size_t)m * cols + c];
                    const double d = (double)yh[(size_t)m * rows + r0 + r] - ref;
                    num += d * d, den += ref * ref;
                }
            }
            const int end = i < n - 1 ? r0 + (prow[i] + 15) / 16 * 16 : rows;
            for (int r = r0 + prow[i]; r < end; r++)
                for (int m = 0; m < M; m++) pad_ok &= yh[(size_t)m * rows + r] == 0.f;
            r0 = end;
        }
        const double rel = sqrt(num / den);
        result(!rc && rel < kTol && pad_ok, "stacked 40|24|70 x %d, M=%d: rel L2 %.2e, padding rows zero: %s", cols, M,
               rel, pad_ok ? "yes" : "no");
        /* y += W x on top of base */
        SPLASH_CUDA_CHECK(cudaMemcpy(yd, base, sizeof(float) * M * rows, cudaMemcpyHostToDevice));
        rc = splash_q4_matmul_add(&dm, &xp, yd, NULL);
        SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
        SPLASH_CUDA_CHECK(cudaMemcpy(sum, yd, sizeof(float) * M * rows, cudaMemcpyDeviceToHost));
        int same = 1;
        for (int i = 0; i < M * rows; i++) {
            volatile float want = base[i] + yh[i]; /* one fp32 addition */
            same &= memcmp((const void *)&want, &sum[i], sizeof(float)) == 0;
        }
        result(!rc && same, "matmul_add M=%d: y + W x bitwise equal to the product, then an add", M);
    }
    free(wrow), free(xh), free(yh), free(base), free(sum);
    for (int i = 0; i < n; i++) free(parts[i].blob);
    cudaFree(dev), cudaFree(xd), cudaFree(yd), cudaFree(xpm);
}

/* The fused producers (splash_q4_prep_rmsnorm / _silu_mul): y against an fp64
 * host reference, and the prepared activation bitwise what splash_q4_prep_x(y)
 * makes (compared through a product: every byte of hi, lo and the group sums
 * reaches y), for rows 1, 5, 16 and 20 (rows past 16: y only, and the bits
 * the same row gets when it comes alone: a row's y must not depend on where
 * it sits in the batch, or a lane's results would). */
static void test_fused_prep(int cols) {
    const int rows_max = 20, rows = 48;
    HostQ4 h;
    host_q4_make(&h, rows, cols, 51);
    const size_t tb = splash_q4_tiled_bytes(rows, cols);
    uint8_t *tiled = (uint8_t *)malloc(tb);
    splash_q4_repack_host(h.blob, rows, cols, tiled, tb);
    splash_q4_matrix dm;
    void *dev = upload_tiled(tiled, rows, cols, &dm);
    free(tiled);
    const size_t n = (size_t)rows_max * cols;
    float *xh = (float *)malloc(n * 4), *uh = (float *)malloc(n * 4), *wh = (float *)malloc((size_t)cols * 4);
    float *yh = (float *)malloc(n * 4), *p1 = (float *)malloc(16 * rows * 4), *p2 = (float *)malloc(16 * rows * 4);
    float *y1 = (float *)malloc((size_t)cols * 4); /* one row made alone */
    float *y3 = (float *)malloc(n * 4), *p3 = (float *)malloc(16 * rows * 4); /* the other early-loads setting */
    for (size_t i = 0; i < n; i++) xh[i] = rng_uniform(-3.f, 3.f), uh[i] = rng_uniform(-2.f, 2.f);
    for (int i = 0; i < cols; i++) wh[i] = rng_uniform(0.5f, 1.5f);
    float *xd, *ud, *wd, *yd, *pd;
    void *xpm;
    splash_q4_xprep xp;
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&xd, n * 4));
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&ud, n * 4));
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&wd, (size_t)cols * 4));
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&yd, n * 4));
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&pd, 16 * rows * 4));
    SPLASH_CUDA_CHECK(cudaMalloc(&xpm, splash_q4_xprep_bytes(cols)));
    splash_q4_xprep_init(&xp, xpm, cols);
    SPLASH_CUDA_CHECK(cudaMemcpy(xd, xh, n * 4, cudaMemcpyHostToDevice));
    SPLASH_CUDA_CHECK(cudaMemcpy(ud, uh, n * 4, cudaMemcpyHostToDevice));
    SPLASH_CUDA_CHECK(cudaMemcpy(wd, wh, (size_t)cols * 4, cudaMemcpyHostToDevice));
    const int rs[4] = {1, 5, 16, 20};
    for (int mode = 0; mode < 2; mode++)
        for (int t = 0; t < 4; t++) {
            const int R = rs[t], M = R < 16 ? R : 16;
            /* the fused preparation and the product; y and the product's M rows to the host */
            auto run = [&](float *p_out, float *y_out) {
                SPLASH_CUDA_CHECK(cudaMemset(yd, 0xFF, n * 4));
                int r = mode == 0 ? splash_q4_prep_rmsnorm(&xp, xd, cols, wd, 1e-6f, yd, cols, R, cols, NULL)
                                  : splash_q4_prep_silu_mul(&xp, xd, cols, ud, cols, yd, cols, R, cols, NULL);
                if (!r) r = splash_q4_matmul(&dm, &xp, pd, NULL);
                SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
                SPLASH_CUDA_CHECK(cudaMemcpy(p_out, pd, (size_t)M * rows * 4, cudaMemcpyDeviceToHost));
                SPLASH_CUDA_CHECK(cudaMemcpy(y_out, yd, (size_t)R * cols * 4, cudaMemcpyDeviceToHost));
                return r;
            };
            int rc = run(p1, yh);
            /* again under another setting: y and the product bitwise those of the run above */
            auto again = [&]() {
                const int rc2 = run(p3, y3);
                return !rc && !rc2 && !memcmp(p3, p1, (size_t)M * rows * 4) && !memcmp(y3, yh, (size_t)R * cols * 4);
            };
            if (mode == 0) { /* the norm factors read before the programmatic wait or after */
                const int was = splash_q4_early_loads();
                splash_q4_set_early_loads(!was);
                const int same = again();
                splash_q4_set_early_loads(was);
                result(same, "fused prep rmsnorm, %d rows x %d: early loads %s = %s (bitwise)", R, cols,
                       was ? "off" : "on", was ? "on" : "off");
            }
            { /* the preparation's blocks the other way round (splash_q4_prep_padded), the xprep
               * poisoned first */
                const int was = splash_q4_prep_padded();
                splash_q4_set_prep_padded(!was);
                SPLASH_CUDA_CHECK(cudaMemset(xpm, 0xFF, splash_q4_xprep_bytes(cols)));
                const int same = again();
                splash_q4_set_prep_padded(was);
                result(same, "fused prep %s, %d rows x %d: padded rows only %s = %s (bitwise)", mode ? "silu" : "rmsnorm",
                       R, cols, was ? "off" : "on", was ? "on" : "off");
            }
            if (!rc) rc = splash_q4_prep_x(&xp, yd, M, cols, cols, NULL);
            if (!rc) rc = splash_q4_matmul(&dm, &xp, pd, NULL);
            SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
            SPLASH_CUDA_CHECK(cudaMemcpy(p2, pd, (size_t)M * rows * 4, cudaMemcpyDeviceToHost));
            double num = 0, den = 0;
            for (int r = 0; r < R; r++) {
                const float *x = xh + (size_t)r * cols, *u = uh + (size_t)r * cols;
                double ss = 0;
                for (int c = 0; c < cols; c++) ss += (double)x[c] * x[c];
                const double rsd = 1.0 / sqrt(ss / cols + 1e-6);
                for (int c = 0; c < cols; c++) {
                    const double ref = mode == 0 ? x[c] * rsd * wh[c] : x[c] / (1.0 + exp(-(double)x[c])) * u[c];
                    const double d = yh[(size_t)r * cols + c] - ref;
                    num += d * d, den += ref * ref;
                }
            }
            const double rel = sqrt(num / den);
            const int same = !memcmp(p1, p2, (size_t)M * rows * 4);
            result(!rc && rel < 1e-6 && same, "fused prep %s, %d rows x %d: y rel L2 %.2e; prepared as prep_x(y): %s",
                   mode == 0 ? "rmsnorm" : "silu_mul", R, cols, rel, same ? "yes" : "no");
            int alone = 1;
            for (int r = 16; r < R && !rc; r += 3) { /* rows 16 and 19, each made as row 0 of its own call */
                const size_t off = (size_t)r * cols;
                rc = mode == 0 ? splash_q4_prep_rmsnorm(&xp, xd + off, cols, wd, 1e-6f, yd, cols, 1, cols, NULL)
                               : splash_q4_prep_silu_mul(&xp, xd + off, cols, ud + off, cols, yd, cols, 1, cols, NULL);
                SPLASH_CUDA_CHECK(cudaMemcpy(y1, yd, (size_t)cols * 4, cudaMemcpyDeviceToHost));
                alone &= !rc && !memcmp(y1, yh + off, (size_t)cols * 4);
            }
            if (R > 16)
                result(alone, "fused prep %s, %d rows x %d: rows past 16 = the same rows alone (bitwise)",
                       mode == 0 ? "rmsnorm" : "silu_mul", R, cols);
        }
    free(h.blob), free(xh), free(uh), free(wh), free(yh), free(p1), free(p2), free(y1), free(y3), free(p3);
    cudaFree(dev), cudaFree(xd), cudaFree(ud), cudaFree(wd), cudaFree(yd), cudaFree(pd), cudaFree(xpm);
}

/* A fused preparation's outputs on the device: the xprep (16 rows) and the
 * GEMM's rows (rows x cols), for the fused-prep tests' two sides. */
struct PrepOut {
    void *xpm, *gm;
    splash_q4_xprep xp;
    splash_q4_gemm_x g;
};
static void prep_out_init(PrepOut *o, int rows, int cols) {
    SPLASH_CUDA_CHECK(cudaMalloc(&o->xpm, splash_q4_xprep_bytes(cols)));
    SPLASH_CUDA_CHECK(cudaMalloc(&o->gm, splash_q4_gemm_x_bytes(rows, cols)));
    splash_q4_xprep_init(&o->xp, o->xpm, cols);
    splash_q4_gemm_x_init(&o->g, o->gm, rows, cols);
}
static void prep_out_free(PrepOut *o) { cudaFree(o->xpm), cudaFree(o->gm); }

/* splash_q4_prep_rmsnorm_gemm: y and the prepared activation bitwise what
 * splash_q4_prep_rmsnorm makes, and rows [r0, r1) of y as the GEMM's fp16
 * rows with the same values as splash_q4_gemm_prep_uniform's after their
 * alphas (each x 2^k rounded once: the same rounding, the power of two
 * apart), save values below fp16's normal range; every row's inv_scale the
 * alpha.  r0 inside the first 16 rows (the prep kernel's blocks) and r1 past
 * them (the rows kernel's). */
static void test_fused_prep_gemm(int cols) {
    const int rows = 40, r0 = 3, r1 = 37, R = r1 - r0, n = rows * cols;
    float *xh = (float *)malloc((size_t)n * 4), *wh = (float *)malloc((size_t)cols * 4);
    for (int i = 0; i < n; i++) xh[i] = rng_uniform(-3.f, 3.f);
    xh[(size_t)20 * cols + 7] = 900.f; /* a row dominated by one value: near the bound */
    for (int i = 0; i < cols; i++) wh[i] = rng_uniform(-1.5f, 1.5f);
    wh[7] = -1.5f;
    float *xd, *wd, *y1d, *y2d;
    PrepOut o1, o2;
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&xd, (size_t)n * 4));
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&wd, (size_t)cols * 4));
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&y1d, (size_t)n * 4));
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&y2d, (size_t)n * 4));
    prep_out_init(&o1, rows, cols), prep_out_init(&o2, rows, cols);
    splash_q4_xprep &xp1 = o1.xp, &xp2 = o2.xp;
    splash_q4_gemm_x &g1 = o1.g, &g2 = o2.g;
    SPLASH_CUDA_CHECK(cudaMemcpy(xd, xh, (size_t)n * 4, cudaMemcpyHostToDevice));
    SPLASH_CUDA_CHECK(cudaMemcpy(wd, wh, (size_t)cols * 4, cudaMemcpyHostToDevice));
    int rc = splash_q4_prep_rmsnorm_gemm(&xp1, &g1, r0, r1, xd, cols, wd, 1e-6f, y1d, cols, rows, cols, NULL);
    if (!rc) rc = splash_q4_prep_rmsnorm(&xp2, xd, cols, wd, 1e-6f, y2d, cols, rows, cols, NULL);
    if (!rc) rc = splash_q4_gemm_prep_uniform(&g2, y2d + (size_t)r0 * cols, R, cols, (size_t)cols, NULL);
    SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
    const size_t nh = (size_t)R * cols, xb = (size_t)16 * 3 * cols;
    float *y1 = (float *)malloc((size_t)n * 4), *y2 = (float *)malloc((size_t)n * 4), *inv = (float *)malloc((size_t)R * 4);
    __half *h1 = (__half *)malloc(nh * 2), *h2 = (__half *)malloc(nh * 2);
    int8_t *d1 = (int8_t *)malloc(xb), *d2 = (int8_t *)malloc(xb);
    float a1[3], a2[3];
    SPLASH_CUDA_CHECK(cudaMemcpy(y1, y1d, (size_t)n * 4, cudaMemcpyDeviceToHost));
    SPLASH_CUDA_CHECK(cudaMemcpy(y2, y2d, (size_t)n * 4, cudaMemcpyDeviceToHost));
    SPLASH_CUDA_CHECK(cudaMemcpy(h1, g1.hi, nh * 2, cudaMemcpyDeviceToHost));
    SPLASH_CUDA_CHECK(cudaMemcpy(h2, g2.hi, nh * 2, cudaMemcpyDeviceToHost));
    SPLASH_CUDA_CHECK(cudaMemcpy(inv, g1.inv_scale, (size_t)R * 4, cudaMemcpyDeviceToHost));
    SPLASH_CUDA_CHECK(cudaMemcpy(a1, g1.alpha, sizeof a1, cudaMemcpyDeviceToHost));
    SPLASH_CUDA_CHECK(cudaMemcpy(a2, g2.alpha, sizeof a2, cudaMemcpyDeviceToHost));
    SPLASH_CUDA_CHECK(cudaMemcpy(d1, xp1.x8, xb, cudaMemcpyDeviceToHost));
    SPLASH_CUDA_CHECK(cudaMemcpy(d2, xp2.x8, xb, cudaMemcpyDeviceToHost));
    const int same_y = !memcmp(y1, y2, (size_t)n * 4), same_x8 = !memcmp(d1, d2, xb);
    size_t differ = 0, below = 0, inv_bad = 0;
    for (size_t i = 0; i < nh; i++) {
        const double v1 = (double)__half2float(h1[i]) * a1[0], v2 = (double)__half2float(h2[i]) * a2[0];
        if (v1 == v2) continue;
        if (fabs(__half2float(h1[i])) < 6.1035e-05) below++; /* under 2^-14: subnormal in the fused rows */
        else differ++;
    }
    for (int i = 0; i < R; i++) inv_bad += inv[i] != a1[0];
    const int shape_ok = g1.R == R && g1.cols == cols && a1[1] == 0.f && a1[2] == 1.f;
    result(rc == 0 && same_y && same_x8 && differ == 0 && inv_bad == 0 && shape_ok && below * 1000 < nh,
           "fused prep rmsnorm + GEMM rows [%d, %d) of %d x %d: y %s, xprep %s, fp16 rows x alpha = the uniform "
           "preparation's but %zu (%zu subnormal), alpha 2^%d vs 2^%d",
           r0, r1, rows, cols, same_y ? "bitwise" : "DIFFERS", same_x8 ? "bitwise" : "DIFFERS", differ, below,
           (int)log2f(a1[0]), (int)log2f(a2[0]));
    result(splash_q4_prep_rmsnorm_gemm(&xp1, &g1, 5, 5, xd, cols, wd, 1e-6f, y1d, cols, rows, cols, NULL) ==
                   SPLASH_E_INVALID &&
               splash_q4_prep_rmsnorm_gemm(&xp1, &g1, 0, rows + 1, xd, cols, wd, 1e-6f, y1d, cols, rows, cols,
                                           NULL) == SPLASH_E_INVALID,
           "fused prep rmsnorm + GEMM: empty or out-of-range row ranges refused");
    free(xh), free(wh), free(y1), free(y2), free(inv), free(h1), free(h2), free(d1), free(d2);
    cudaFree(xd), cudaFree(wd), cudaFree(y1d), cudaFree(y2d);
    prep_out_free(&o1), prep_out_free(&o2);
}

/* splash_q4_prep_silu_mul_amax: y and the prepared activation bitwise what
 * splash_q4_prep_silu_mul makes, the largest |y| of rows [r0, r1) in
 * xg->amax (the exact maximum, from the prep kernel's rows or the rows
 * kernel's: the largest value placed in one or the other), and
 * splash_q4_gemm_prep_uniform_amax's fp16 rows, scales and alpha bitwise
 * splash_q4_gemm_prep_uniform's; rows of stride cols (float4 loads) and
 * cols + 1 (scalar loads: y and the amax only). */
static void test_fused_prep_silu_amax(int cols) {
    const int rows = 40, r0 = 3, r1 = 37, R = r1 - r0;
    for (int v = 0; v < 3; v++) {
        const int ld = v == 2 ? cols + 1 : cols, big_row = v == 1 ? 5 : 20;
        const size_t n = (size_t)rows * ld;
        float *gh = (float *)malloc(n * 4), *uh = (float *)malloc(n * 4);
        for (size_t i = 0; i < n; i++) gh[i] = rng_uniform(-4.f, 4.f), uh[i] = rng_uniform(-2.f, 2.f);
        gh[(size_t)big_row * ld + 9] = 40.f, uh[(size_t)big_row * ld + 9] = -30.f; /* the largest |y| */
        gh[(size_t)1 * ld + 3] = 90.f, uh[(size_t)1 * ld + 3] = 90.f;              /* larger, outside [r0, r1) */
        float *gd, *ud, *y1d, *y2d;
        PrepOut o1, o2;
        SPLASH_CUDA_CHECK(cudaMalloc((void **)&gd, n * 4));
        SPLASH_CUDA_CHECK(cudaMalloc((void **)&ud, n * 4));
        SPLASH_CUDA_CHECK(cudaMalloc((void **)&y1d, n * 4));
        SPLASH_CUDA_CHECK(cudaMalloc((void **)&y2d, n * 4));
        prep_out_init(&o1, rows, cols), prep_out_init(&o2, rows, cols);
        splash_q4_xprep &xp1 = o1.xp, &xp2 = o2.xp;
        splash_q4_gemm_x &g1 = o1.g, &g2 = o2.g;
        SPLASH_CUDA_CHECK(cudaMemcpy(gd, gh, n * 4, cudaMemcpyHostToDevice));
        SPLASH_CUDA_CHECK(cudaMemcpy(ud, uh, n * 4, cudaMemcpyHostToDevice));
        SPLASH_CUDA_CHECK(cudaMemset(y1d, 0xFF, n * 4));
        SPLASH_CUDA_CHECK(cudaMemset(y2d, 0xFF, n * 4));
        int rc = splash_q4_prep_silu_mul_amax(&xp1, &g1, r0, r1, gd, ld, ud, ld, y1d, ld, rows, cols, NULL);
        if (!rc) rc = splash_q4_prep_silu_mul(&xp2, gd, ld, ud, ld, y2d, ld, rows, cols, NULL);
        const int gemm = ld % 4 == 0;
        if (!rc && gemm) rc = splash_q4_gemm_prep_uniform_amax(&g1, y1d + (size_t)r0 * ld, R, cols, ld, NULL);
        if (!rc && gemm) rc = splash_q4_gemm_prep_uniform(&g2, y2d + (size_t)r0 * ld, R, cols, ld, NULL);
        SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
        float *y1 = (float *)malloc(n * 4), *y2 = (float *)malloc(n * 4);
        const size_t nh = (size_t)R * cols, xb = (size_t)16 * 3 * cols;
        uint16_t *h1 = (uint16_t *)calloc(nh, 2), *h2 = (uint16_t *)calloc(nh, 2);
        int8_t *d1 = (int8_t *)malloc(xb), *d2 = (int8_t *)malloc(xb);
        float a1[3] = {0, 0, 0}, a2[3] = {0, 0, 0}, i1 = 0, i2 = 0;
        uint32_t amax = 0;
        SPLASH_CUDA_CHECK(cudaMemcpy(y1, y1d, n * 4, cudaMemcpyDeviceToHost));
        SPLASH_CUDA_CHECK(cudaMemcpy(y2, y2d, n * 4, cudaMemcpyDeviceToHost));
        SPLASH_CUDA_CHECK(cudaMemcpy(d1, xp1.x8, xb, cudaMemcpyDeviceToHost));
        SPLASH_CUDA_CHECK(cudaMemcpy(d2, xp2.x8, xb, cudaMemcpyDeviceToHost));
        SPLASH_CUDA_CHECK(cudaMemcpy(&amax, g1.amax, 4, cudaMemcpyDeviceToHost));
        if (gemm) {
            SPLASH_CUDA_CHECK(cudaMemcpy(h1, g1.hi, nh * 2, cudaMemcpyDeviceToHost));
            SPLASH_CUDA_CHECK(cudaMemcpy(h2, g2.hi, nh * 2, cudaMemcpyDeviceToHost));
            SPLASH_CUDA_CHECK(cudaMemcpy(a1, g1.alpha, sizeof a1, cudaMemcpyDeviceToHost));
            SPLASH_CUDA_CHECK(cudaMemcpy(a2, g2.alpha, sizeof a2, cudaMemcpyDeviceToHost));
            SPLASH_CUDA_CHECK(cudaMemcpy(&i1, g1.inv_scale + R - 1, 4, cudaMemcpyDeviceToHost));
            SPLASH_CUDA_CHECK(cudaMemcpy(&i2, g2.inv_scale + R - 1, 4, cudaMemcpyDeviceToHost));
        }
        float mx = 0.f;
        for (int r = r0; r < r1; r++)
            for (int c = 0; c < cols; c++) mx = fmaxf(mx, fabsf(y2[(size_t)r * ld + c]));
        int same_y = 1;
        for (int r = 0; r < rows; r++) same_y &= !memcmp(y1 + (size_t)r * ld, y2 + (size_t)r * ld, (size_t)cols * 4);
        const int same_x8 = !memcmp(d1, d2, xb), same_h = !memcmp(h1, h2, nh * 2) && !memcmp(a1, a2, sizeof a1) && i1 == i2;
        float got;
        memcpy(&got, &amax, 4);
        result(rc == 0 && same_y && same_x8 && got == mx && mx > 1000.f && (same_h || !gemm),
               "fused prep silu_mul + amax, rows [%d, %d) of %d x %d (stride %d, largest in row %d): y %s, xprep %s, "
               "amax %g (rows' %g), uniform fp16 rows %s",
               r0, r1, rows, cols, ld, big_row, same_y ? "bitwise" : "DIFFERS", same_x8 ? "bitwise" : "DIFFERS",
               (double)got, (double)mx, !gemm ? "-" : same_h ? "bitwise" : "DIFFER");
        free(gh), free(uh), free(y1), free(y2), free(h1), free(h2), free(d1), free(d2);
        cudaFree(gd), cudaFree(ud), cudaFree(y1d), cudaFree(y2d);
        prep_out_free(&o1), prep_out_free(&o2);
    }
}

/* splash_q4_matmul_grouped: slot j = expert idx[j] times x row j / xdiv,
 * bitwise the plain product's row, for x prepared as one activation (gate /
 * up: xdiv K, two matrix arrays) and as one-row activations (down: xdiv 1,
 * splash_q4_prep_silu_mul_rows); an out-of-range id leaves its slot alone.
 * Each slot on its own, and planned (splash_q4_group_plan, groups of up to
 * splash_q4_plan_group(): expert 3's five slots in groups of 2, 2 and 1 (or 4
 * and 1), expert 1's two in one). */
static void test_grouped(int rows, int cols) {
    const int E = 5, R = 3, K = 4, S = R * K;
    const size_t tb = splash_q4_tiled_bytes(rows, cols), st = (tb + 255) & ~(size_t)255;
    uint8_t *pool[2];
    splash_q4_matrix m[2][5];
    for (int a = 0; a < 2; a++) {
        SPLASH_CUDA_CHECK(cudaMalloc((void **)&pool[a], st * E));
        for (int e = 0; e < E; e++) {
            HostQ4 h;
            host_q4_make(&h, rows, cols, 100 + 10 * a + e);
            uint8_t *tiled = (uint8_t *)malloc(tb);
            splash_q4_repack_host(h.blob, rows, cols, tiled, tb);
            SPLASH_CUDA_CHECK(cudaMemcpy(pool[a] + st * e, tiled, tb, cudaMemcpyHostToDevice));
            splash_q4_matrix_init(&m[a][e], pool[a] + st * e, rows, cols);
            free(tiled), free(h.blob);
        }
    }
    const int32_t idx_h[S] = {4, 1, 0, 3, 3, 3, 2, 3, -1, 3, 1, 7};
    int32_t *idx, *plan;
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&idx, sizeof idx_h));
    SPLASH_CUDA_CHECK(cudaMemcpy(idx, idx_h, sizeof idx_h, cudaMemcpyHostToDevice));
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&plan, splash_q4_group_plan_ints(S) * sizeof(int32_t)));
    float *xh = (float *)malloc(sizeof(float) * S * cols);
    for (int i = 0; i < S * cols; i++) xh[i] = rng_uniform(-2.f, 2.f);
    float *xd, *ud, *y, *y2, *yr;
    void *xpm, *xsm;
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&xd, sizeof(float) * S * cols));
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&ud, sizeof(float) * S * cols));
    SPLASH_CUDA_CHECK(cudaMemcpy(xd, xh, sizeof(float) * S * cols, cudaMemcpyHostToDevice));
    SPLASH_CUDA_CHECK(cudaMemcpy(ud, xh, sizeof(float) * S * cols, cudaMemcpyHostToDevice));
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&y, sizeof(float) * S * rows));
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&y2, sizeof(float) * S * rows));
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&yr, sizeof(float) * 16 * rows));
    SPLASH_CUDA_CHECK(cudaMalloc(&xpm, splash_q4_xprep_bytes(cols)));
    SPLASH_CUDA_CHECK(cudaMalloc(&xsm, splash_q4_xprep_rows_bytes(cols, 32)));
    splash_q4_xprep xp, xs;
    splash_q4_xprep_init(&xp, xpm, cols);
    splash_q4_xprep_rows_init(&xs, xsm, cols, 32);
    float *g1 = (float *)malloc(sizeof(float) * S * rows), *g2 = (float *)malloc(sizeof(float) * S * rows);
    float *ref = (float *)malloc(sizeof(float) * 16 * rows);
    int rc = splash_q4_group_plan(idx, S, E, plan, NULL);
    for (int planned = 0; planned < 2; planned++) {
        const int32_t *pl = planned ? plan : NULL;
        const char *how = planned ? "planned" : "slot by slot";
        /* gate / up: x rows prepared together, slot j reads row j / K */
        if (!rc) rc = splash_q4_prep_x(&xp, xd, R, cols, cols, NULL);
        SPLASH_CUDA_CHECK(cudaMemset(y, 0xFF, sizeof(float) * S * rows));
        SPLASH_CUDA_CHECK(cudaMemset(y2, 0xFF, sizeof(float) * S * rows));
        if (!rc) rc = splash_q4_matmul_grouped(&m[0][0], &m[1][0], E, st, idx, pl, S, K, &xp, y, y2, rows, NULL);
        SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
        SPLASH_CUDA_CHECK(cudaMemcpy(g1, y, sizeof(float) * S * rows, cudaMemcpyDeviceToHost));
        SPLASH_CUDA_CHECK(cudaMemcpy(g2, y2, sizeof(float) * S * rows, cudaMemcpyDeviceToHost));
        int same = !rc, first_bad = -1;
        for (int a = 0; a < 2; a++) {
            for (int e = 0; e < E; e++) {
                if (splash_q4_matmul(&m[a][e], &xp, yr, NULL)) same = 0;
                SPLASH_CUDA_CHECK(cudaMemcpy(ref, yr, sizeof(float) * R * rows, cudaMemcpyDeviceToHost));
                for (int j = 0; j < S; j++)
                    if (idx_h[j] == e &&
                        memcmp((a ? g2 : g1) + (size_t)j * rows, ref + (size_t)(j / K) * rows, sizeof(float) * rows)) {
                        if (same && first_bad < 0) first_bad = j;
                        same = 0;
                    }
            }
            for (int j = 0; j < S; j++) /* out of range: never written (0xFF bytes: a NaN pattern) */
                if ((idx_h[j] < 0 || idx_h[j] >= E) && *(const uint32_t *)((a ? g2 : g1) + (size_t)j * rows) != 0xFFFFFFFFu)
                    same = 0;
        }
        if (first_bad >= 0)
            printf("   first slot off: %d (expert %d, x row %d)\n", first_bad, idx_h[first_bad], first_bad / K);
        result(same, "grouped %dx%d %s, 2 arrays, %d slots of %d x rows: each slot = the plain product's row, bitwise",
               rows, cols, how, S, R);
        /* down-style: every slot its own prepared row (silu(x) * x), xdiv 1 */
        if (!rc) rc = splash_q4_prep_silu_mul_rows(&xs, xd, cols, ud, cols, xd, cols, S, cols, NULL);
        SPLASH_CUDA_CHECK(cudaMemset(y, 0xFF, sizeof(float) * S * rows));
        if (!rc) rc = splash_q4_matmul_grouped(&m[0][0], NULL, E, st, idx, pl, S, 1, &xs, y, NULL, rows, NULL);
        SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
        SPLASH_CUDA_CHECK(cudaMemcpy(g1, y, sizeof(float) * S * rows, cudaMemcpyDeviceToHost));
        same = !rc;
        for (int j = 0; j < S; j++) { /* the plain product of slot j's row, prepared alone */
            if (idx_h[j] < 0 || idx_h[j] >= E) {
                if (*(const uint32_t *)(g1 + (size_t)j * rows) != 0xFFFFFFFFu) same = 0;
                continue;
            }
            if (splash_q4_prep_x(&xp, xd + (size_t)j * cols, 1, cols, cols, NULL) ||
                splash_q4_matmul(&m[0][idx_h[j]], &xp, yr, NULL))
                same = 0;
            SPLASH_CUDA_CHECK(cudaMemcpy(ref, yr, sizeof(float) * rows, cudaMemcpyDeviceToHost));
            if (memcmp(g1 + (size_t)j * rows, ref, sizeof(float) * rows)) {
                if (same) printf("   slot %d: grouped %g, plain %g\n", j, g1[(size_t)j * rows], ref[0]);
                same = 0;
            }
        }
        result(same, "grouped %dx%d %s, %d one-row activations (prep_silu_mul_rows): each slot bitwise", rows, cols,
               how, S);
        SPLASH_CUDA_CHECK(cudaMemcpy(xd, xh, sizeof(float) * S * cols, cudaMemcpyHostToDevice)); /* x again */
    }
    free(xh), free(g1), free(g2), free(ref);
    cudaFree(pool[0]), cudaFree(pool[1]), cudaFree(idx), cudaFree(plan), cudaFree(xd), cudaFree(ud), cudaFree(y);
    cudaFree(y2), cudaFree(yr), cudaFree(xpm), cudaFree(xsm);
}

/* The prefill GEMM (q4_gemm.h) at R rows of x: relative L2 against fp64 over
 * sampled weight rows x every x row <= kGemmTol (and per x row <= 4x that),
 * every output written and finite; the first rows of a shorter call (the
 * other tile width when R > 64) bitwise equal; y += W x bitwise the product
 * then an fp32 add. */
static const double kGemmTol = 2e-3; /* fp16 weights and x: ~2^-11 each */

/* R rows of x for the GEMMs (malloc'd): three spreads (1, 1e-3, 300), row 5
 * of constant sign. */
static float *gemm_rows_x(int R, int cols) {
    float *xh = (float *)malloc(sizeof(float) * R * cols);
    if (!xh) exit(1);
    for (int n = 0; n < R; n++)
        for (int c = 0; c < cols; c++) {
            float v = rng_uniform(-1.f, 1.f) * (n % 3 == 2 ? 300.f : n % 3 == 1 ? 1e-3f : 1.f);
            xh[(size_t)n * cols + c] = n == 5 ? fabsf(v) + 0.1f : v;
        }
    return xh;
}

static void test_gemm(const char *name, int rows, int cols, int R, uint64_t seed) {
    HostQ4 h;
    host_q4_make(&h, rows, cols, seed);
    const size_t tb = splash_q4_tiled_bytes(rows, cols);
    uint8_t *tiled = (uint8_t *)malloc(tb);
    if (!tiled || splash_q4_repack_host(h.blob, rows, cols, tiled, tb) != 0) exit(1);
    result(splash_q4_tiled_fp16_ok(tiled, rows, cols) == 1, "gemm %s: random scales suit fp16", name);
    splash_q4_matrix dm;
    void *wdev = upload_tiled(tiled, rows, cols, &dm);
    free(tiled);

    float *xh = gemm_rows_x(R, cols);
    float *xd, *yd, *y2d;
    void *xgm;
    splash_q4_gemm_x xg;
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&xd, sizeof(float) * R * cols));
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&yd, sizeof(float) * R * rows));
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&y2d, sizeof(float) * R * rows));
    SPLASH_CUDA_CHECK(cudaMalloc(&xgm, splash_q4_gemm_x_bytes(R, cols)));
    SPLASH_CUDA_CHECK(cudaMemcpy(xd, xh, sizeof(float) * R * cols, cudaMemcpyHostToDevice));
    if (splash_q4_gemm_x_init(&xg, xgm, R, cols)) exit(1);
    SPLASH_CUDA_CHECK(cudaMemset(yd, 0xFF, sizeof(float) * R * rows)); /* NaN */
    int rc = splash_q4_gemm_prep(&xg, xd, R, cols, (size_t)cols, NULL);
    if (!rc) rc = splash_q4_gemm(&dm, &xg, yd, 0, NULL);
    SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
    float *yh = (float *)malloc(sizeof(float) * R * rows);
    SPLASH_CUDA_CHECK(cudaMemcpy(yh, yd, sizeof(float) * R * rows, cudaMemcpyDeviceToHost));

    int finite = 1;
    for (size_t i = 0; i < (size_t)R * rows; i++) finite &= isfinite(yh[i]) ? 1 : 0;
    int *check = (int *)malloc(sizeof(int) * (rows < 4200 ? rows : 4200));
    const int n_all = pick_rows(rows, check);
    const int nc = n_all < 600 ? n_all : 600; /* R x 600 rows of fp64 keeps the reference to seconds */
    double *wr = (double *)malloc(sizeof(double) * cols);
    double *num = (double *)calloc((size_t)R, sizeof(double)), *den = (double *)calloc((size_t)R, sizeof(double));
    for (int i = 0; i < nc; i++) {
        const int r = check[(long)i * n_all / nc]; /* spread over the sampled rows */
        host_q4_row(&h, r, wr);
        for (int n = 0; n < R; n++) {
            const float *x = xh + (size_t)n * cols;
            double s = 0;
            for (int c = 0; c < cols; c++) s += wr[c] * (double)x[c];
            const double d = (double)yh[(size_t)n * rows + r] - s;
            num[n] += d * d, den[n] += s * s;
        }
    }
    double tn = 0, td = 0, worst = 0;
    for (int n = 0; n < R; n++) {
        tn += num[n], td += den[n];
        const double e = sqrt(num[n] / (den[n] > 0 ? den[n] : 1));
        if (e > worst) worst = e;
    }
    const double err = sqrt(tn / (td > 0 ? td : 1));
    result(rc == 0 && finite && err <= kGemmTol && worst <= 4 * kGemmTol,
           "gemm %s %dx%d, R=%d: rel L2 %.2e, worst x row %.2e (%d weight rows checked)", name, rows, cols, R, err, worst,
           nc);

    /* a shorter call: its rows bitwise the longer call's */
    const int R2 = R > 64 ? 37 : (R + 1) / 2;
    float *y2h = (float *)malloc(sizeof(float) * R * rows);
    rc = splash_q4_gemm_prep(&xg, xd, R2, cols, (size_t)cols, NULL);
    if (!rc) rc = splash_q4_gemm(&dm, &xg, y2d, 0, NULL);
    SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
    SPLASH_CUDA_CHECK(cudaMemcpy(y2h, y2d, sizeof(float) * R2 * rows, cudaMemcpyDeviceToHost));
    result(rc == 0 && !memcmp(y2h, yh, sizeof(float) * R2 * rows), "gemm %s: R=%d rows bitwise those of R=%d", name, R2,
           R);

    /* y += W x: the product rounded, then added */
    for (size_t i = 0; i < (size_t)R * rows; i++) y2h[i] = rng_uniform(-4.f, 4.f);
    SPLASH_CUDA_CHECK(cudaMemcpy(y2d, y2h, sizeof(float) * R * rows, cudaMemcpyHostToDevice));
    rc = splash_q4_gemm_prep(&xg, xd, R, cols, (size_t)cols, NULL);
    if (!rc) rc = splash_q4_gemm(&dm, &xg, y2d, 1, NULL);
    SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
    float *sum = (float *)malloc(sizeof(float) * R * rows);
    SPLASH_CUDA_CHECK(cudaMemcpy(sum, y2d, sizeof(float) * R * rows, cudaMemcpyDeviceToHost));
    int same = rc == 0;
    for (size_t i = 0; i < (size_t)R * rows && same; i++) {
        volatile float a = y2h[i] + yh[i]; /* one fp32 add, no contraction */
        same = memcmp((const void *)&a, sum + i, 4) == 0;
    }
    result(same, "gemm %s: y += W x bitwise y + (W x)", name);

    free(xh), free(yh), free(y2h), free(sum), free(check), free(wr), free(num), free(den), free(h.blob);
    cudaFree(xd), cudaFree(yd), cudaFree(y2d), cudaFree(xgm), cudaFree(wdev);
}

/* The cuBLASLt path (blas.h): the matrix expanded to fp16 (every weight
 * bitwise fp16(fp16(scale) * q + fp16(bias)), one rounding), x prepared
 * with one power of two for all rows, then the GEMM: relative L2 against
 * fp64 within the GEMM's bounds, a NaN-filled y written (beta 0 never
 * reads it), y += W x (beta 1) within fp32 roundings of y + W x, and
 * splash_q4_gemm reading the uniform preparation within the same bounds.
 * Skipped (reported) where the library does not load. */
static void test_blas(const char *name, int rows, int cols, int R, uint64_t seed) {
    splash_cuda_blas *bl = NULL;
    if (splash_cuda_blas_open(&bl)) {
        printf("SKIP blas %s: cuBLASLt did not load\n", name);
        return;
    }
    HostQ4 h;
    host_q4_make(&h, rows, cols, seed);
    const size_t tb = splash_q4_tiled_bytes(rows, cols);
    uint8_t *tiled = (uint8_t *)malloc(tb);
    if (!tiled || splash_q4_repack_host(h.blob, rows, cols, tiled, tb) != 0) exit(1);
    splash_q4_matrix dm;
    void *wdev = upload_tiled(tiled, rows, cols, &dm);
    free(tiled);
    const size_t nw = (size_t)rows * cols;
    uint16_t *w16d, *w16h = (uint16_t *)malloc(nw * 2);
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&w16d, nw * 2));
    int rc = splash_q4_expand_f16(&dm, w16d, NULL);
    SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
    SPLASH_CUDA_CHECK(cudaMemcpy(w16h, w16d, nw * 2, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    const int groups = cols / 64;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            const uint8_t byte = h.codes[(size_t)r * (cols / 2) + c / 2];
            const int q = (c & 1) ? byte >> 4 : byte & 15;
            const double s16 = __half2float(__float2half_rn(bf16_to_f32(h.scales[(size_t)r * groups + c / 64])));
            const double b16 = __half2float(__float2half_rn(bf16_to_f32(h.biases[(size_t)r * groups + c / 64])));
            const __half e = __double2half(q * s16 + b16); /* exact in double, one rounding */
            bad += memcmp(&e, w16h + (size_t)r * cols + c, 2) != 0;
        }
    result(rc == 0 && bad == 0, "blas %s %dx%d: fp16 expansion bitwise (%zu of %zu weights differ)", name, rows, cols,
           bad, nw);

    float *xh = gemm_rows_x(R, cols);
    float *xd, *yd, *y2d;
    void *xgm, *ws;
    splash_q4_gemm_x xg;
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&xd, sizeof(float) * R * cols));
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&yd, sizeof(float) * R * rows));
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&y2d, sizeof(float) * R * rows));
    SPLASH_CUDA_CHECK(cudaMalloc(&xgm, splash_q4_gemm_x_bytes(R, cols)));
    SPLASH_CUDA_CHECK(cudaMalloc(&ws, SPLASH_CUDA_BLAS_WORKSPACE));
    SPLASH_CUDA_CHECK(cudaMemcpy(xd, xh, sizeof(float) * R * cols, cudaMemcpyHostToDevice));
    if (splash_q4_gemm_x_init(&xg, xgm, R, cols)) exit(1);
    SPLASH_CUDA_CHECK(cudaMemset(yd, 0xFF, sizeof(float) * R * rows)); /* NaN */
    rc = splash_q4_gemm_prep_uniform(&xg, xd, R, cols, (size_t)cols, NULL);
    if (!rc) rc = splash_cuda_blas_gemm(bl, w16d, rows, cols, xg.hi, R, xg.alpha, xg.alpha + 1, yd, ws, NULL);
    if (!rc) rc = splash_q4_gemm(&dm, &xg, y2d, 0, NULL); /* the built-in GEMM on the uniform preparation */
    SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
    float *yh = (float *)malloc(sizeof(float) * R * rows), *y2h = (float *)malloc(sizeof(float) * R * rows);
    SPLASH_CUDA_CHECK(cudaMemcpy(yh, yd, sizeof(float) * R * rows, cudaMemcpyDeviceToHost));
    SPLASH_CUDA_CHECK(cudaMemcpy(y2h, y2d, sizeof(float) * R * rows, cudaMemcpyDeviceToHost));
    int finite = 1;
    for (size_t i = 0; i < (size_t)R * rows; i++) finite &= isfinite(yh[i]) && isfinite(y2h[i]) ? 1 : 0;
    int *check = (int *)malloc(sizeof(int) * (rows < 4200 ? rows : 4200));
    const int n_all = pick_rows(rows, check);
    const int nc = n_all < 600 ? n_all : 600;
    double *wr = (double *)malloc(sizeof(double) * cols);
    double *num = (double *)calloc((size_t)2 * R, sizeof(double)), *den = (double *)calloc((size_t)R, sizeof(double));
    for (int i = 0; i < nc; i++) {
        const int r = check[(long)i * n_all / nc];
        host_q4_row(&h, r, wr);
        for (int n = 0; n < R; n++) {
            double s = 0;
            for (int c = 0; c < cols; c++) s += wr[c] * (double)xh[(size_t)n * cols + c];
            const double d0 = yh[(size_t)n * rows + r] - s, d1 = y2h[(size_t)n * rows + r] - s;
            num[n] += d0 * d0, num[R + n] += d1 * d1, den[n] += s * s;
        }
    }
    double tn[2] = {0, 0}, td = 0, worst[2] = {0, 0};
    for (int n = 0; n < R; n++) {
        td += den[n];
        for (int k = 0; k < 2; k++) {
            tn[k] += num[k * R + n];
            const double e = sqrt(num[k * R + n] / (den[n] > 0 ? den[n] : 1));
            if (e > worst[k]) worst[k] = e;
        }
    }
    free(num), free(den);
    const double e0 = sqrt(tn[0] / (td > 0 ? td : 1)), e1 = sqrt(tn[1] / (td > 0 ? td : 1));
    result(rc == 0 && finite && e0 <= kGemmTol && worst[0] <= 4 * kGemmTol,
           "blas %s %dx%d, R=%d: rel L2 %.2e, worst x row %.2e", name, rows, cols, R, e0, worst[0]);
    result(rc == 0 && e1 <= kGemmTol && worst[1] <= 4 * kGemmTol,
           "blas %s: q4_gemm on the uniform preparation rel L2 %.2e, worst x row %.2e", name, e1, worst[1]);

    /* y += W x: beta 1 (fp32: within a few roundings of y + the product) */
    for (size_t i = 0; i < (size_t)R * rows; i++) y2h[i] = rng_uniform(-4.f, 4.f);
    SPLASH_CUDA_CHECK(cudaMemcpy(y2d, y2h, sizeof(float) * R * rows, cudaMemcpyHostToDevice));
    rc = splash_cuda_blas_gemm(bl, w16d, rows, cols, xg.hi, R, xg.alpha, xg.alpha + 2, y2d, ws, NULL);
    SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
    float *sum = (float *)malloc(sizeof(float) * R * rows);
    SPLASH_CUDA_CHECK(cudaMemcpy(sum, y2d, sizeof(float) * R * rows, cudaMemcpyDeviceToHost));
    double worst_add = 0;
    for (size_t i = 0; i < (size_t)R * rows; i++) {
        const double want = (double)y2h[i] + yh[i];
        const double e = fabs(sum[i] - want) / (fabs(want) + 1e-30);
        if (fabs(want) > 1e-3 && e > worst_add) worst_add = e;
    }
    result(rc == 0 && worst_add <= 1e-6, "blas %s: y += W x within %.1e of y + (W x)", name, worst_add);

    free(xh), free(yh), free(y2h), free(sum), free(check), free(wr), free(h.blob), free(w16h);
    cudaFree(xd), cudaFree(yd), cudaFree(y2d), cudaFree(xgm), cudaFree(ws), cudaFree(wdev), cudaFree(w16d);
    splash_cuda_blas_close(bl);
}

/* Scales outside fp16's normal range (or weights beyond 2^15) keep a matrix
 * off the GEMM. */
static void test_gemm_fp16_ok(void) {
    HostQ4 h;
    host_q4_make(&h, 32, 128, 77);
    const size_t tb = splash_q4_tiled_bytes(32, 128);
    uint8_t *tiled = (uint8_t *)malloc(tb);
    uint16_t *s = (uint16_t *)h.scales, *b = (uint16_t *)h.biases;
    const uint16_t s0 = s[3], b0 = b[5];
    s[3] = f32_to_bf16(1e-6f);
    splash_q4_repack_host(h.blob, 32, 128, tiled, tb);
    result(splash_q4_tiled_fp16_ok(tiled, 32, 128) == 0, "gemm: a scale of 1e-6 refused");
    s[3] = 0;
    splash_q4_repack_host(h.blob, 32, 128, tiled, tb);
    result(splash_q4_tiled_fp16_ok(tiled, 32, 128) == 1, "gemm: a scale of 0 accepted");
    s[3] = s0, b[5] = f32_to_bf16(40000.f);
    splash_q4_repack_host(h.blob, 32, 128, tiled, tb);
    result(splash_q4_tiled_fp16_ok(tiled, 32, 128) == 0, "gemm: a bias of 40000 refused");
    b[5] = b0;
    free(tiled), free(h.blob);
}

static void test_errors(void) {
    splash_q4_config c = {3, 4, 0, 8, 1, 1};
    result(splash_q4_config_check(&c, 64, 128) == SPLASH_E_UNSUPPORTED, "config r=3 refused");
    splash_q4_config c2 = {1, 4, 0, 8, 16, 1};
    result(splash_q4_config_check(&c2, 64, 2048) == SPLASH_E_UNSUPPORTED, "ksplit 16 refused");
    splash_q4_config c3 = {1, 4, 0, 6, 1, 4};
    result(splash_q4_config_check(&c3, 64, 2048) == SPLASH_E_UNSUPPORTED, "wk not dividing warps refused");
    splash_q4_config c4 = {1, 4, 0, 8, 8, 8};
    result(splash_q4_config_check(&c4, 64, 2048) == SPLASH_E_UNSUPPORTED, "ksplit x wk beyond the groups refused");
    result(splash_q4_tiled_bytes(64, 100) == 0, "cols not a multiple of 64 refused");
    uint8_t b[64];
    result(splash_q4_repack_host(b, 64, 100, b, sizeof b) == SPLASH_E_INVALID, "repack of a bad shape refused");
    splash_q4_xprep xp;
    void *mem;
    SPLASH_CUDA_CHECK(cudaMalloc(&mem, splash_q4_xprep_bytes(128)));
    splash_q4_xprep_init(&xp, mem, 128);
    float *x;
    SPLASH_CUDA_CHECK(cudaMalloc((void **)&x, sizeof(float) * 17 * 128));
    result(splash_q4_prep_x(&xp, x, 17, 128, 128, NULL) == SPLASH_E_INVALID, "M=17 refused");
    result(splash_q4_prep_x(&xp, x, 1, 192, 192, NULL) == SPLASH_E_INVALID, "cols beyond capacity refused");
    result(splash_q4_xprep_rows_bytes(32768, 65535) == 0 && splash_q4_xprep_rows_bytes(32768, 16) > 0,
           "an xprep of 2^31 digit bytes or more refused");
    cudaFree(x);
    cudaFree(mem);
}

/* A NaN or an inf in an x row makes that row's results NaN (its group's 2^-k
 * is NaN: 8-bit digits cannot carry either), every other row's stay finite
 * and equal to those of the same rows without it; at M = 1, 3 (pairs) and 9
 * (digit n-tiles). */
static void test_nonfinite(void) {
    Case k;
    case_setup(&k, 64, 256, 61);
    float *yref = (float *)malloc(sizeof(float) * 16 * 64);
    const int Ms[3] = {1, 3, 9};
    for (int mi = 0; mi < 3; mi++) {
        const int M = Ms[mi], bad = M - 1; /* the last row gets the non-finite value */
        for (int v = 0; v < 2; v++) {
            SPLASH_CUDA_CHECK(cudaMemcpy(k.x_dev, k.x_host, sizeof(float) * 16 * 256, cudaMemcpyHostToDevice));
            int rc = splash_q4_prep_x(&k.xp, k.x_dev, M, 256, 256, NULL);
            if (!rc) rc = splash_q4_matmul(&k.dm, &k.xp, k.y_dev, NULL);
            SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
            SPLASH_CUDA_CHECK(cudaMemcpy(yref, k.y_dev, sizeof(float) * M * 64, cudaMemcpyDeviceToHost));
            const float inject = v ? INFINITY : NAN;
            SPLASH_CUDA_CHECK(cudaMemcpy(k.x_dev + (size_t)bad * 256 + 130, &inject, sizeof inject, cudaMemcpyHostToDevice));
            if (!rc) rc = splash_q4_prep_x(&k.xp, k.x_dev, M, 256, 256, NULL);
            if (!rc) rc = splash_q4_matmul(&k.dm, &k.xp, k.y_dev, NULL);
            SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
            SPLASH_CUDA_CHECK(cudaMemcpy(k.y_host, k.y_dev, sizeof(float) * M * 64, cudaMemcpyDeviceToHost));
            int nan_rows = 1, others_same = 1;
            for (int r = 0; r < 64; r++) nan_rows &= isnan(k.y_host[(size_t)bad * 64 + r]) != 0;
            for (int i = 0; i < bad * 64; i++) others_same &= memcmp(&k.y_host[i], &yref[i], sizeof(float)) == 0;
            result(rc == 0 && nan_rows && others_same, "M=%d, %s in x row %d: that row NaN, the others unchanged", M,
                   v ? "inf" : "NaN", bad);
        }
    }
    free(yref);
    case_free(&k);
}

/* test_q4_matmul [--gemm]: everything, or only the prefill GEMM's checks */
int main(int argc, char **argv) {
    cudaDeviceProp prop;
    SPLASH_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    const int gemm_only = argc > 1 && !strcmp(argv[1], "--gemm");
    test_gemm_fp16_ok();
    test_gemm("odd", 40, 320, 1, 51);
    test_gemm("odd", 300, 192, 77, 52);
    test_gemm("small", 256, 1024, 64, 53);
    test_gemm("tail", 520, 512, 300, 54);
    test_gemm("gdn qkv|z|b|a", 16480, 5120, 256, 55);
    test_gemm("ffn down", 5120, 17408, 130, 56);
    test_blas("odd", 300, 192, 77, 57);
    test_blas("tail", 520, 512, 300, 58);
    test_blas("ffn down", 5120, 17408, 260, 59);
    if (gemm_only) {
        printf("%d passed, %d failed\n", n_pass, n_fail);
        return n_fail ? 1 : 0;
    }
    test_errors();
    test_nonfinite();
    test_all_configs("odd", 128, 192, 11);
    test_all_configs("ragged", 40, 320, 12);
    test_all_configs("small", 256, 1024, 13);
    test_stacked_add();
    test_grouped(64, 256);
    test_grouped(512, 2048);
    test_grouped(2048, 512);
    test_fused_prep(5120);
    test_fused_prep(17408);
    test_fused_prep_gemm(5120);
    test_fused_prep_gemm(2048);
    test_fused_prep_silu_amax(17408);
    test_fused_prep_silu_amax(1024);
    test_shape("odd", 128, 192, 21, 1);
    test_shape("ragged", 40, 320, 22, 1);
    test_shape("q_proj", 12288, 5120, 31, 0);
    test_shape("k/v_proj", 1024, 5120, 32, 1);
    test_shape("o/out_proj", 5120, 6144, 33, 0);
    test_shape("in_qkv", 10240, 5120, 34, 0);
    test_shape("in_z", 6144, 5120, 35, 0);
    test_shape("gate/up", 17408, 5120, 36, 0);
    test_shape("down", 5120, 17408, 37, 0);
    test_shape("lm_head", 248320, 5120, 38, 0);
    /* the stacks the CUDA model makes of the 27B's matrices (cuda_weights.cu) */
    test_shape("attn q|k|v", 14336, 5120, 39, 0);
    test_shape("gdn qkv|z|b|a", 16480, 5120, 40, 0);
    test_shape("ffn gate|up", 34816, 5120, 42, 0);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
