/* CPU kernels against straightforward double-precision references, the
 * AVX2 path against the scalar path, and the batch-invariance and
 * chunked-vs-recurrent properties the engine relies on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "runtime/model.h"

/* ---- helpers ------------------------------------------------------------- */

static uint64_t rng_state = 88172645463325252ull;
static double urand(void) { /* xorshift64*, [0, 1) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}
static float nrand(void) { /* roughly normal */
    double s = 0;
    for (int i = 0; i < 6; i++) s += urand();
    return (float)((s - 3.0) * 1.41);
}
static float *rand_vec(size_t n, float scale) {
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = nrand() * scale;
    return v;
}

/* A matrix in a given dtype plus its exact dequantised values (double). */
typedef struct test_mat {
    splash_tensor t;
    uint8_t *blob;
    double *deq; /* [rows][cols] */
} test_mat;

static test_mat make_mat(splash_dtype dt, int rows, int cols) {
    test_mat m;
    memset(&m, 0, sizeof m);
    m.t.name = "test";
    m.t.dtype = dt;
    m.t.ndim = 2;
    m.t.shape[0] = rows;
    m.t.shape[1] = cols;
    splash_qlayout l = splash_matrix_layout(dt, rows, cols);
    m.t.bytes = l.bytes;
    m.blob = calloc(1, l.bytes + 64);
    m.t.data = m.blob;
    m.deq = malloc((size_t)rows * cols * sizeof *m.deq);
    float *w = rand_vec((size_t)rows * cols, 0.5f);
    if (dt == SPLASH_Q4 || dt == SPLASH_Q8) {
        int qmax = dt == SPLASH_Q4 ? 15 : 255, groups = cols / 64;
        uint16_t *sc = (uint16_t *)(m.blob + l.scales_offset), *bi = (uint16_t *)(m.blob + l.biases_offset);
        for (int r = 0; r < rows; r++)
            for (int g = 0; g < groups; g++) {
                float mn = 1e30f, mx = -1e30f;
                for (int j = 0; j < 64; j++) {
                    float x = w[(size_t)r * cols + g * 64 + j];
                    if (x < mn) mn = x;
                    if (x > mx) mx = x;
                }
                uint16_t s16 = splash_f32_to_bf16((mx - mn) / qmax), b16 = splash_f32_to_bf16(mn);
                sc[r * groups + g] = s16;
                bi[r * groups + g] = b16;
                double s = splash_bf16_to_f32(s16), b = splash_bf16_to_f32(b16);
                for (int j = 0; j < 64; j++) {
                    int c = g * 64 + j;
                    long q = lround((w[(size_t)r * cols + c] - b) / s);
                    if (q < 0) q = 0;
                    if (q > qmax) q = qmax;
                    if (dt == SPLASH_Q8)
                        m.blob[(size_t)r * cols + c] = (uint8_t)q;
                    else
                        m.blob[(size_t)r * cols / 2 + c / 2] |= (uint8_t)(q << (4 * (c & 1)));
                    m.deq[(size_t)r * cols + c] = s * (double)q + b;
                }
            }
    } else {
        for (size_t i = 0; i < (size_t)rows * cols; i++) {
            if (dt == SPLASH_F32) {
                memcpy(m.blob + 4 * i, &w[i], 4);
                m.deq[i] = w[i];
            } else if (dt == SPLASH_BF16) {
                uint16_t h = splash_f32_to_bf16(w[i]);
                memcpy(m.blob + 2 * i, &h, 2);
                m.deq[i] = splash_bf16_to_f32(h);
            } else {
                uint16_t h = splash_f32_to_f16(w[i]);
                memcpy(m.blob + 2 * i, &h, 2);
                m.deq[i] = splash_f16_to_f32(h);
            }
        }
    }
    free(w);
    return m;
}

static void free_mat(test_mat *m) {
    free(m->blob);
    free(m->deq);
}

/* ---- matmul ---------------------------------------------------------------- */

static void check_matmul(cpu_ctx *c, splash_dtype dt, int rows, int cols, int m) {
    test_mat w = make_mat(dt, rows, cols);
    size_t ldx = (size_t)cols + 3, ldy = (size_t)rows + 5;
    float *x = rand_vec((size_t)m * ldx, 1.0f);
    float *y = calloc((size_t)m * ldy, sizeof *y);
    cpu_matmul(c, &w.t, m, x, ldx, y, ldy);
    for (int i = 0; i < m; i++)
        for (int o = 0; o < rows; o++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < cols; k++) {
                ref += w.deq[(size_t)o * cols + k] * x[i * ldx + k];
                mag += fabs(w.deq[(size_t)o * cols + k] * x[i * ldx + k]);
            }
            double err = fabs(y[i * ldy + o] - ref);
            if (err > 1e-6 * mag + 1e-30)
                fail_msg("%s %dx%d m=%d: y[%d][%d] = %.9g, want %.9g (mag %g)", splash_dtype_name(dt), rows, cols, m, i,
                         o, y[i * ldy + o], ref, mag);
        }
    /* batch invariance: each input row alone gives the same bits */
    float *y1 = calloc((size_t)rows, sizeof *y1);
    for (int i = 0; i < m; i++) {
        cpu_matmul(c, &w.t, 1, x + i * ldx, ldx, y1, (size_t)rows);
        if (memcmp(y1, y + i * ldy, (size_t)rows * sizeof *y1))
            fail_msg("%s m=%d: row %d differs when computed alone", splash_dtype_name(dt), m, i);
    }
    free(y1);
    free(x);
    free(y);
    free_mat(&w);
}

static void test_matmul_all_dtypes(void **state) {
    (void)state;
    cpu_ctx c;
    assert_int_equal(cpu_ctx_init(&c, 2, 64, 1024), 0);
    const splash_dtype plain[] = {SPLASH_F32, SPLASH_BF16, SPLASH_F16};
    for (int d = 0; d < 3; d++) {
        check_matmul(&c, plain[d], 37, 200, 1);  /* tail of 8 columns */
        check_matmul(&c, plain[d], 70, 288, 13);
        check_matmul(&c, plain[d], 5, 7, 3);     /* narrower than one lane block */
    }
    for (int q = 0; q < 2; q++) {
        splash_dtype dt = q ? SPLASH_Q4 : SPLASH_Q8;
        check_matmul(&c, dt, 37, 128, 1);
        check_matmul(&c, dt, 70, 192, 13); /* row blocks of 4 with a remainder, input blocks of 8 */
        check_matmul(&c, dt, 3, 64, 9);
        check_matmul(&c, dt, 21, 704, 1);  /* 11 groups: a vector block of 8 and a tail of 3 */
        check_matmul(&c, dt, 21, 1024, 10);
        check_matmul(&c, dt, 9, 704, 40); /* more inputs than one accumulator block (32) */
    }
    cpu_ctx_free(&c);
}

/* The same bits from 1 or 2 threads, and from the scalar and AVX2 paths,
 * for every activation path. */
static void test_matmul_threads_and_paths(void **state) {
    (void)state;
    cpu_ctx c1, c2;
    assert_int_equal(cpu_ctx_init(&c1, 1, 40, 704), 0);
    assert_int_equal(cpu_ctx_init(&c2, 2, 40, 704), 0);
    const splash_dtype all[] = {SPLASH_F32, SPLASH_BF16, SPLASH_F16, SPLASH_Q8, SPLASH_Q4};
    const int acts[3] = {CPU_ACT_F32, CPU_ACT_I16, CPU_ACT_I8};
    int simd = cpu_simd();
    for (int a = 0; a < 3; a++) {
        assert_int_equal(cpu_set_act(&c1, acts[a]), 0);
        assert_int_equal(cpu_set_act(&c2, acts[a]), 0);
        for (int d = 0; d < 5; d++) {
            if (acts[a] != CPU_ACT_F32 && all[d] < SPLASH_Q8) continue;
            int rows = 67, cols = all[d] >= SPLASH_Q8 ? 704 : 232;
            for (int mi = 0; mi < 3; mi++) { /* decode, a verify block, more than one input block */
                const int ms[3] = {1, 11, 40};
                int m = ms[mi];
                test_mat w = make_mat(all[d], rows, cols);
                float *x = rand_vec((size_t)m * cols, 1.0f);
                float *ya = calloc((size_t)m * rows, sizeof(float)), *yb = calloc((size_t)m * rows, sizeof(float));
                cpu_matmul(&c1, &w.t, m, x, cols, ya, rows);
                cpu_matmul(&c2, &w.t, m, x, cols, yb, rows);
                assert_memory_equal(ya, yb, (size_t)m * rows * sizeof(float));
                if (simd) {
                    cpu_simd_set(0);
                    cpu_matmul(&c2, &w.t, m, x, cols, yb, rows);
                    cpu_simd_set(-1);
                    if (memcmp(ya, yb, (size_t)m * rows * sizeof(float)))
                        fail_msg("%s act %d m=%d: scalar and AVX2 paths differ", splash_dtype_name(all[d]), acts[a], m);
                }
                free(x);
                free(ya);
                free(yb);
                free_mat(&w);
            }
        }
    }
    cpu_ctx_free(&c1);
    cpu_ctx_free(&c2);
}

/* The quantised-activation paths (int16, int8) against the fp32 path on the
 * same weights.  Each input group g is quantised to xq = round(x / d_g),
 * d_g = amax_g / Q (Q = 127 or 32767), so |x - d_g xq| <= d_g / 2.  The
 * kernels compute s_g d_g sum q xq + b_g sum x + s_g qbar (sum x - d_g sum xq)
 * (the bias and mean-code terms from exact fp32 sums, qbar = 7.5 for q4, 127.5
 * for q8), which differs from s_g sum q x + b_g sum x by s_g sum (q - qbar)
 * (d_g xq - x), so
 *     |y_quantised - y_exact| <= sum_g sum_(c in g) |s_g (q_c - qbar)| d_g / 2
 * plus fp32 rounding, which both paths keep below 4e-6 of sum |w_c x_c| +
 * sum |s_g q_c x_c| at these sizes.  The test asserts that bound on the
 * difference to the fp32 path, for one input (the decode kernels) and for
 * several (the block kernels), across a vector block of 8 groups and a tail;
 * and batch invariance and scalar = AVX2 bits. */
static void test_matmul_quantised_activations(void **state) {
    (void)state;
    cpu_ctx c, cf;
    assert_int_equal(cpu_ctx_init(&c, 2, 16, 704), 0);
    assert_int_equal(cpu_ctx_init(&cf, 2, 16, 704), 0);
    for (int mode = 0; mode < 4; mode++) {
        int act = mode < 2 ? CPU_ACT_I16 : CPU_ACT_I8;
        double Q = act == CPU_ACT_I8 ? 127.0 : 32767.0;
        assert_int_equal(cpu_set_act(&c, act), 0);
        splash_dtype dt = mode % 2 ? SPLASH_Q4 : SPLASH_Q8;
        for (int shape = 0; shape < 2; shape++) {
            int rows = 45, cols = shape ? 704 : 192, m = shape ? 11 : 1;
            test_mat w = make_mat(dt, rows, cols);
            splash_qlayout lay = splash_matrix_layout(dt, rows, cols);
            const uint16_t *sc = (const uint16_t *)(const void *)(w.blob + lay.scales_offset);
            const uint16_t *bi = (const uint16_t *)(const void *)(w.blob + lay.biases_offset);
            float *x = rand_vec((size_t)m * cols, 1.0f), *y = calloc((size_t)m * rows, sizeof(float));
            float *yf = calloc((size_t)m * rows, sizeof(float));
            float *y1 = calloc(rows, sizeof(float)), *ys = calloc((size_t)m * rows, sizeof(float));
            cpu_matmul(&c, &w.t, m, x, cols, y, rows);
            cpu_matmul(&cf, &w.t, m, x, cols, yf, rows);
            double worst = 0;
            for (int i = 0; i < m; i++) {
                for (int o = 0; o < rows; o++) {
                    double bound = 0, mag = 0;
                    for (int g = 0; g < cols / 64; g++) {
                        double amax = 0, s = splash_bf16_to_f32(sc[o * (cols / 64) + g]);
                        double b = splash_bf16_to_f32(bi[o * (cols / 64) + g]), qbar = dt == SPLASH_Q4 ? 7.5 : 127.5;
                        for (int k = g * 64; k < g * 64 + 64; k++) amax = fmax(amax, fabs(x[i * cols + k]));
                        for (int k = g * 64; k < g * 64 + 64; k++) {
                            double sq = w.deq[(size_t)o * cols + k] - b; /* s * q */
                            bound += fabs(sq - s * qbar) * amax / Q / 2;
                            mag += fabs(w.deq[(size_t)o * cols + k] * x[i * cols + k]) + fabs(sq * x[i * cols + k]);
                        }
                    }
                    double diff = fabs((double)y[i * rows + o] - yf[i * rows + o]);
                    if (diff > bound + 4e-6 * mag)
                        fail_msg("%s act %d: y[%d][%d] = %.7g, fp32 path %.7g, beyond the bound %.3g", splash_dtype_name(dt),
                                 act, i, o, y[i * rows + o], yf[i * rows + o], bound + 4e-6 * mag);
                    if (diff / (bound + 4e-6 * mag) > worst) worst = diff / (bound + 4e-6 * mag);
                }
                cpu_matmul(&c, &w.t, 1, x + i * cols, cols, y1, rows);
                assert_memory_equal(y1, y + i * rows, sizeof(float) * rows);
            }
            printf("# act %d %s cols %d: worst error / bound %.3f\n", act, splash_dtype_name(dt), cols, worst);
            assert_true(worst > 0.01); /* the bound is not vacuous: errors reach a visible part of it */
            if (cpu_simd()) {
                cpu_simd_set(0);
                cpu_matmul(&c, &w.t, m, x, cols, ys, rows);
                cpu_simd_set(-1);
                if (memcmp(ys, y, sizeof(float) * m * rows))
                    fail_msg("%s act %d: scalar and AVX2 paths differ", splash_dtype_name(dt), act);
            }
            free(x), free(y), free(yf), free(y1), free(ys);
            free_mat(&w);
        }
    }
    cpu_ctx_free(&c);
    cpu_ctx_free(&cf);
}

/* Fused products give exactly the bits of separate ones: several matrices
 * of mixed types over one input (set and add), and gate/up with SwiGLU. */
static void test_matmul_fused(void **state) {
    (void)state;
    cpu_ctx c;
    assert_int_equal(cpu_ctx_init(&c, 2, 9, 704), 0);
    const int acts[3] = {CPU_ACT_F32, CPU_ACT_I16, CPU_ACT_I8};
    int cols = 704;
    for (int a = 0; a < 3; a++) {
        assert_int_equal(cpu_set_act(&c, acts[a]), 0);
        for (int m = 1; m <= 9; m += 8) {
            test_mat w[3] = {make_mat(SPLASH_Q4, 37, cols), make_mat(SPLASH_Q8, 20, cols), make_mat(SPLASH_BF16, 5, cols)};
            float *x = rand_vec((size_t)m * cols, 1.0f);
            float *sep[3], *fused[3];
            for (int k = 0; k < 3; k++) {
                int rows = (int)w[k].t.shape[0];
                sep[k] = calloc((size_t)m * rows, sizeof(float));
                fused[k] = rand_vec((size_t)m * rows, 1.0f); /* part 1 adds into this */
                cpu_matmul(&c, &w[k].t, m, x, cols, sep[k], rows);
            }
            float *base1 = malloc(sizeof(float) * m * 20);
            memcpy(base1, fused[1], sizeof(float) * m * 20);
            cpu_mm_part parts[3] = {{&w[0].t, fused[0], 37, 0}, {&w[1].t, fused[1], 20, 1}, {&w[2].t, fused[2], 5, 0}};
            cpu_matmul_parts(&c, parts, 3, m, x, cols);
            assert_memory_equal(fused[0], sep[0], sizeof(float) * m * 37);
            assert_memory_equal(fused[2], sep[2], sizeof(float) * m * 5);
            for (int i = 0; i < m * 20; i++) base1[i] = base1[i] + sep[1][i];
            assert_memory_equal(fused[1], base1, sizeof(float) * m * 20);
            /* cpu_matmul_add alone */
            memcpy(fused[1], base1, sizeof(float) * m * 20);
            cpu_matmul_add(&c, &w[1].t, m, x, cols, fused[1], 20);
            for (int i = 0; i < m * 20; i++) base1[i] = base1[i] + sep[1][i];
            assert_memory_equal(fused[1], base1, sizeof(float) * m * 20);
            /* parts of different input widths (the first 192 columns of x) run
             * separately, with the same bits */
            test_mat narrow = make_mat(SPLASH_Q4, 6, 192);
            float *yn = calloc((size_t)m * 6, sizeof(float)), *yn2 = calloc((size_t)m * 6, sizeof(float));
            cpu_matmul(&c, &narrow.t, m, x, cols, yn, 6);
            cpu_mm_part mixed[2] = {{&w[0].t, fused[0], 37, 0}, {&narrow.t, yn2, 6, 0}};
            cpu_matmul_parts(&c, mixed, 2, m, x, cols);
            assert_memory_equal(fused[0], sep[0], sizeof(float) * m * 37);
            assert_memory_equal(yn, yn2, sizeof(float) * m * 6);
            free(yn), free(yn2);
            free_mat(&narrow);
            /* SwiGLU: gate = w[0], up = a second q4 matrix of the same shape */
            test_mat up = make_mat(SPLASH_Q4, 37, cols);
            float *u = calloc((size_t)m * 37, sizeof(float)), *h = calloc((size_t)m * 37, sizeof(float));
            float *tmp = calloc((size_t)m * 37, sizeof(float)), *want = calloc((size_t)m * 37, sizeof(float));
            cpu_matmul(&c, &up.t, m, x, cols, u, 37);
            cpu_silu_mul(sep[0], u, m * 37, want);
            cpu_matmul_swiglu(&c, &w[0].t, &up.t, m, x, cols, h, 37, tmp, 37);
            assert_memory_equal(h, want, sizeof(float) * m * 37);
            free(u), free(h), free(tmp), free(want), free(base1), free(x);
            free_mat(&up);
            for (int k = 0; k < 3; k++) free(sep[k]), free(fused[k]), free_mat(&w[k]);
        }
    }
    cpu_ctx_free(&c);
}

/* ---- norms, activations, rotary ------------------------------------------ */

static void test_norms(void **state) {
    (void)state;
    int n = 77;
    float *x = rand_vec(n, 2.0f), *f = rand_vec(n, 1.0f), *z = rand_vec(n, 1.5f), y[77];
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + 1e-6);
    cpu_rmsnorm(x, f, n, 1e-6f, y);
    for (int i = 0; i < n; i++) assert_float_equal(y[i], x[i] * r * f[i], 2e-6 * (1 + fabs(x[i] * r * f[i])));
    cpu_rmsnorm_gated(x, f, z, n, 1e-6f, y);
    for (int i = 0; i < n; i++) {
        double want = f[i] * x[i] * r * (z[i] / (1 + exp(-(double)z[i])));
        assert_float_equal(y[i], want, 2e-6 * (1 + fabs(want)));
    }
    memcpy(y, x, sizeof y);
    cpu_l2norm(y, n, 1e-6f);
    double rl = 1.0 / sqrt(ss + 1e-6);
    for (int i = 0; i < n; i++) assert_float_equal(y[i], x[i] * rl, 2e-7);
    assert_float_equal(cpu_softplus(30.0f), 30.0f, 0);
    assert_float_equal(cpu_softplus(0.5f), log1p(exp(0.5)), 1e-7);
    assert_float_equal(cpu_sigmoid(0.0f), 0.5f, 0);
    float sm[4] = {1, 2, 3, 1000};
    cpu_softmax(sm, 3);
    assert_float_equal(sm[2], exp(3) / (exp(1) + exp(2) + exp(3)), 1e-7);
    free(x);
    free(f);
    free(z);
}

static void test_rope(void **state) {
    (void)state;
    int heads = 3, hd = 64, rot = 16, pos = 1234;
    double theta = 1e7;
    float *x = rand_vec((size_t)heads * hd, 1.0f), *y = malloc(sizeof(float) * heads * hd);
    memcpy(y, x, sizeof(float) * heads * hd);
    cpu_rope(y, heads, hd, rot, theta, pos);
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < hd; i++) {
            const float *v = x + h * hd;
            double want;
            if (i >= rot) {
                want = v[i];
            } else {
                int j = i % (rot / 2);
                double a = pos * pow(theta, -2.0 * j / rot);
                want = i < rot / 2 ? v[j] * cos(a) - v[j + rot / 2] * sin(a) : v[j + rot / 2] * cos(a) + v[j] * sin(a);
            }
            assert_float_equal(y[h * hd + i], want, 2e-4); /* fp32 angle at pos 1234 */
        }
    free(x);
    free(y);
}

/* ---- attention over paged KV --------------------------------------------- */

static void test_attention_paged(void **state) {
    (void)state;
    cpu_ctx c;
    assert_int_equal(cpu_ctx_init(&c, 2, 8, 64), 0);
    cpu_kv_layout l;
    assert_int_equal(cpu_kv_layout_init(&l, 99, 2, 2, 16, 32), SPLASH_E_UNSUPPORTED);
    int n_layers = 2, kvh = 2, hd = 16, heads = 4, layer = 1;
    assert_int_equal(cpu_kv_layout_init(&l, SPLASH_KV_F32, n_layers, kvh, hd, 32), 0);
    assert_int_equal(l.page_bytes, (size_t)n_layers * 2 * kvh * 32 * hd * 4);
    int n_pool = 8;
    uint8_t *pool = calloc(n_pool, l.page_bytes);
    /* lane 0: 70 positions already there + 3 rows, pages 5,1,6; lane 1: 0 + 2 rows, page 2 */
    int32_t pages0[3] = {5, 1, 6}, pages1[1] = {2};
    int past0 = 70, rows0 = 3, rows1 = 2, total0 = past0 + rows0;
    int kw = kvh * hd;
    float *kall = rand_vec((size_t)total0 * kw, 1.0f), *vall = rand_vec((size_t)total0 * kw, 1.0f);
    float *k1 = rand_vec((size_t)rows1 * kw, 1.0f), *v1 = rand_vec((size_t)rows1 * kw, 1.0f);
    /* fill lane 0's past through the writer too (as one 70-row prefill) */
    cpu_attn_lane pre = {pages0, 0, 0, past0};
    cpu_kv_write(&c, &l, pool, layer, &pre, 1, kall, kw, vall, kw);
    /* now the batch: rows 0..2 lane 0, rows 3..4 lane 1 */
    int nr = rows0 + rows1;
    float *kb = malloc(sizeof(float) * nr * kw), *vb = malloc(sizeof(float) * nr * kw);
    memcpy(kb, kall + (size_t)past0 * kw, sizeof(float) * rows0 * kw);
    memcpy(vb, vall + (size_t)past0 * kw, sizeof(float) * rows0 * kw);
    memcpy(kb + rows0 * kw, k1, sizeof(float) * rows1 * kw);
    memcpy(vb + rows0 * kw, v1, sizeof(float) * rows1 * kw);
    cpu_attn_lane lanes[2] = {{pages0, past0, 0, rows0}, {pages1, 0, rows0, rows1}};
    cpu_kv_write(&c, &l, pool, layer, lanes, 2, kb, kw, vb, kw);
    float *q = rand_vec((size_t)nr * heads * hd, 1.0f), *out = calloc((size_t)nr * heads * hd, sizeof(float));
    float *scores = malloc(sizeof(float) * 2 * 128);
    float scale = 0.25f;
    cpu_attention(&c, &l, pool, layer, lanes, 2, heads, q, heads * hd, out, heads * hd, scale, scores, 128);
    for (int row = 0; row < nr; row++) {
        int lane1 = row >= rows0;
        int n_pos = lane1 ? row - rows0 + 1 : past0 + row + 1;
        const float *K = lane1 ? k1 : kall, *V = lane1 ? v1 : vall;
        for (int h = 0; h < heads; h++) {
            int g = h / (heads / kvh);
            const float *qh = q + (size_t)row * heads * hd + h * hd;
            double s[128], mx = -1e300, sum = 0;
            for (int t = 0; t < n_pos; t++) {
                s[t] = 0;
                for (int d = 0; d < hd; d++) s[t] += (double)qh[d] * K[(size_t)t * kw + g * hd + d];
                s[t] *= scale;
                if (s[t] > mx) mx = s[t];
            }
            for (int t = 0; t < n_pos; t++) sum += (s[t] = exp(s[t] - mx));
            for (int d = 0; d < hd; d++) {
                double o = 0;
                for (int t = 0; t < n_pos; t++) o += s[t] / sum * V[(size_t)t * kw + g * hd + d];
                assert_float_equal(out[(size_t)row * heads * hd + h * hd + d], o, 1e-5);
            }
        }
    }
    /* lane 1 alone gives the same bits */
    float *out1 = calloc((size_t)rows1 * heads * hd, sizeof(float));
    cpu_attn_lane alone = {pages1, 0, 0, rows1};
    cpu_attention(&c, &l, pool, layer, &alone, 1, heads, q + (size_t)rows0 * heads * hd, heads * hd, out1, heads * hd,
                  scale, scores, 128);
    assert_memory_equal(out1, out + (size_t)rows0 * heads * hd, sizeof(float) * rows1 * heads * hd);
    free(out1);
    free(pool), free(kall), free(vall), free(k1), free(v1), free(kb), free(vb), free(q), free(out), free(scores);
    cpu_ctx_free(&c);
}

/* ---- Gated DeltaNet ------------------------------------------------------- */

static double dsilu(double x) { return x / (1 + exp(-x)); }

static void test_gdn_conv(void **state) {
    (void)state;
    int C = 40, K = 4, n = 6;
    float *wT = rand_vec((size_t)K * C, 0.5f), *st = rand_vec((size_t)(K - 1) * C, 1.0f);
    float *x = rand_vec((size_t)n * C, 1.0f), *y = calloc((size_t)n * C, sizeof(float));
    float *st0 = malloc(sizeof(float) * (K - 1) * C);
    memcpy(st0, st, sizeof(float) * (K - 1) * C);
    cpu_gdn_conv(wT, C, K, st, 1, x, C, n, y, C, 0, C);
    for (int t = 0; t < n; t++)
        for (int c = 0; c < C; c++) {
            double a = 0;
            for (int k = 0; k < K; k++) {
                int j = t - (K - 1) + k;
                a += (double)wT[k * C + c] * (j < 0 ? st0[(K - 1 + j) * C + c] : x[j * C + c]);
            }
            assert_float_equal(y[t * C + c], dsilu(a), 1e-6);
        }
    for (int s = 0; s < K - 1; s++) assert_memory_equal(st + s * C, x + (n - (K - 1) + s) * C, sizeof(float) * C);
    /* row by row with updates (decode) = all rows at once, bit for bit; also
     * split across two channel ranges */
    float *st2 = malloc(sizeof(float) * (K - 1) * C), *y2 = calloc((size_t)n * C, sizeof(float));
    memcpy(st2, st0, sizeof(float) * (K - 1) * C);
    for (int t = 0; t < n; t++) {
        cpu_gdn_conv(wT, C, K, st2, 1, x + t * C, C, 1, y2 + t * C, C, 0, 17);
        cpu_gdn_conv(wT, C, K, st2, 1, x + t * C, C, 1, y2 + t * C, C, 17, C);
    }
    assert_memory_equal(y2, y, sizeof(float) * n * C);
    assert_memory_equal(st2, st, sizeof(float) * (K - 1) * C);
    /* advance with fewer rows than the state holds */
    memcpy(st2, st0, sizeof(float) * (K - 1) * C);
    cpu_gdn_conv_advance(st2, C, K, x, C, 1, 0, C);
    assert_memory_equal(st2, st0 + C, sizeof(float) * (K - 2) * C);
    assert_memory_equal(st2 + (K - 2) * C, x, sizeof(float) * C);
    free(wT), free(st), free(x), free(y), free(st0), free(st2), free(y2);
}

/* Random GDN inputs for one head: q, k L2-normalised (q scaled), g <= 0. */
typedef struct gdn_in {
    int n, dk, dv;
    float *q, *k, *v, *g, *beta;
} gdn_in;

static gdn_in gdn_random(int n, int dk, int dv, float g_scale) {
    gdn_in in = {n, dk, dv, rand_vec((size_t)n * dk, 1), rand_vec((size_t)n * dk, 1), rand_vec((size_t)n * dv, 1),
                 malloc(sizeof(float) * n), malloc(sizeof(float) * n)};
    for (int t = 0; t < n; t++) {
        cpu_l2norm(in.q + t * dk, dk, 1e-6f);
        cpu_l2norm(in.k + t * dk, dk, 1e-6f);
        for (int i = 0; i < dk; i++) in.q[t * dk + i] *= 1.0f / sqrtf((float)dk);
        in.g[t] = -(float)urand() * g_scale;
        in.beta[t] = (float)urand();
    }
    return in;
}
static void gdn_free(gdn_in *in) { free(in->q), free(in->k), free(in->v), free(in->g), free(in->beta); }

static void test_gdn_step_reference(void **state) {
    (void)state;
    int dk = 16, dv = 24, n = 5;
    gdn_in in = gdn_random(n, dk, dv, 1.0f);
    float *S = rand_vec((size_t)dk * dv, 0.3f), *o = malloc(sizeof(float) * dv);
    double *R = malloc(sizeof(double) * dk * dv);
    for (int i = 0; i < dk * dv; i++) R[i] = S[i];
    for (int t = 0; t < n; t++) {
        cpu_gdn_step(S, dk, dv, in.q + t * dk, in.k + t * dk, in.v + t * dv, in.g[t], in.beta[t], o);
        double d = exp(in.g[t]), m[64], ro[64];
        for (int c = 0; c < dv; c++) {
            m[c] = 0;
            for (int i = 0; i < dk; i++) m[c] += (R[i * dv + c] *= d, R[i * dv + c] * in.k[t * dk + i]);
        }
        for (int c = 0; c < dv; c++) {
            double delta = in.beta[t] * (in.v[t * dv + c] - m[c]);
            ro[c] = 0;
            for (int i = 0; i < dk; i++) R[i * dv + c] += in.k[t * dk + i] * delta;
            for (int i = 0; i < dk; i++) ro[c] += R[i * dv + c] * in.q[t * dk + i];
            assert_float_equal(o[c], ro[c], 1e-5);
        }
    }
    for (int i = 0; i < dk * dv; i++) assert_float_equal(S[i], R[i], 1e-5);
    free(S), free(o), free(R);
    gdn_free(&in);
}

/* The chunked algorithm and the recurrence compute the same function. */
static void test_gdn_chunked_matches_recurrent(void **state) {
    (void)state;
    const int dks[2] = {32, 16}, dvs[2] = {48, 16}, ns[2] = {150, 64};
    for (int cfg = 0; cfg < 2; cfg++) {
        int dk = dks[cfg], dv = dvs[cfg], n = ns[cfg];
        gdn_in in = gdn_random(n, dk, dv, cfg ? 3.0f : 0.3f);
        float *S0 = rand_vec((size_t)dk * dv, 0.3f);
        float *Sa = malloc(sizeof(float) * dk * dv), *Sb = malloc(sizeof(float) * dk * dv);
        memcpy(Sa, S0, sizeof(float) * dk * dv);
        memcpy(Sb, S0, sizeof(float) * dk * dv);
        float *oa = malloc(sizeof(float) * n * dv), *ob = malloc(sizeof(float) * n * dv);
        for (int t = 0; t < n; t++)
            cpu_gdn_step(Sa, dk, dv, in.q + t * dk, in.k + t * dk, in.v + t * dv, in.g[t], in.beta[t], oa + t * dv);
        float *scratch = malloc(sizeof(float) * cpu_gdn_chunk_scratch(dk, dv));
        cpu_gdn_chunked(Sb, dk, dv, n, in.q, in.k, dk, in.v, dv, in.g, in.beta, 1, ob, dv, scratch);
        double e2 = 0, r2 = 0, s2 = 0, t2 = 0;
        for (int i = 0; i < n * dv; i++) e2 += (oa[i] - ob[i]) * (double)(oa[i] - ob[i]), r2 += (double)oa[i] * oa[i];
        for (int i = 0; i < dk * dv; i++) s2 += (Sa[i] - Sb[i]) * (double)(Sa[i] - Sb[i]), t2 += (double)Sa[i] * Sa[i];
        if (getenv("SHOWERR")) printf("chunked vs recurrent: out %.3g state %.3g\n", sqrt(e2 / r2), sqrt(s2 / t2));
        if (sqrt(e2 / r2) > 2e-6 || sqrt(s2 / t2) > 2e-6)
            fail_msg("dk %d dv %d n %d: chunked vs recurrent rel error out %.3g state %.3g", dk, dv, n, sqrt(e2 / r2),
                     sqrt(s2 / t2));
        free(S0), free(Sa), free(Sb), free(oa), free(ob), free(scratch);
        gdn_free(&in);
    }
}

/* Scalar and AVX2 paths of the recurrence are bit-identical. */
static void test_gdn_step_paths(void **state) {
    (void)state;
    if (!cpu_simd()) skip();
    int dk = 32, dv = 44, n = 4;
    gdn_in in = gdn_random(n, dk, dv, 1.0f);
    float *Sa = rand_vec((size_t)dk * dv, 0.3f), *Sb = malloc(sizeof(float) * dk * dv);
    memcpy(Sb, Sa, sizeof(float) * dk * dv);
    float oa[44], ob[44];
    for (int t = 0; t < n; t++) {
        cpu_gdn_step(Sa, dk, dv, in.q + t * dk, in.k + t * dk, in.v + t * dv, in.g[t], in.beta[t], oa);
        cpu_simd_set(0);
        cpu_gdn_step(Sb, dk, dv, in.q + t * dk, in.k + t * dk, in.v + t * dv, in.g[t], in.beta[t], ob);
        cpu_simd_set(-1);
        assert_memory_equal(oa, ob, sizeof oa);
    }
    assert_memory_equal(Sa, Sb, sizeof(float) * dk * dv);
    /* without q (commit's replay) the state evolves identically */
    float *Sc = malloc(sizeof(float) * dk * dv);
    memcpy(Sc, Sa, sizeof(float) * dk * dv);
    cpu_gdn_step(Sa, dk, dv, in.q, in.k, in.v, in.g[0], in.beta[0], oa);
    cpu_gdn_step(Sc, dk, dv, NULL, in.k, in.v, in.g[0], in.beta[0], NULL);
    assert_memory_equal(Sa, Sc, sizeof(float) * dk * dv);
    /* reading the state from elsewhere (a verify lane's first row) = copy, then step; both paths */
    float *Sd = malloc(sizeof(float) * dk * dv);
    for (int p = 0; p < 2; p++) {
        memcpy(Sc, Sb, sizeof(float) * dk * dv);
        if (p) cpu_simd_set(0);
        cpu_gdn_step(Sc, dk, dv, in.q, in.k, in.v, in.g[1], in.beta[1], oa);
        cpu_gdn_step_from(Sb, Sd, dk, dv, in.q, in.k, in.v, in.g[1], in.beta[1], ob);
        cpu_simd_set(-1);
        assert_memory_equal(Sc, Sd, sizeof(float) * dk * dv);
        assert_memory_equal(oa, ob, sizeof oa);
    }
    free(Sa), free(Sb), free(Sc), free(Sd);
    gdn_free(&in);
}

/* ---- prefill kernels: long attention, blocked products, chunked GDN ------- */

/* Attention over many pages (several 32-position blocks per query, blocks
 * cut by the causal limit, tiles of many queries): against a double
 * reference within a stated bound, and bit-identical for each lane alone,
 * on 1 thread and on the scalar path.  head_dim 64 (whole 8 x 8
 * transposes) and 40 (dims left over); GQA groups of 3. */
static void run_long_attn(cpu_ctx *c, const cpu_kv_layout *l, const uint8_t *pool, const cpu_attn_lane *lanes, int n,
                          int heads, const float *q, float *out) {
    int hd = l->head_dim;
    cpu_attention(c, l, pool, 1, lanes, n, heads, q, (size_t)heads * hd, out, (size_t)heads * hd, 1.0f / sqrtf((float)hd),
                  NULL, 0);
}

static void test_attention_long(void **state) {
    (void)state;
    cpu_ctx c2, c1;
    assert_int_equal(cpu_ctx_init(&c2, 2, 8, 64), 0);
    assert_int_equal(cpu_ctx_init(&c1, 1, 8, 64), 0);
    const int hds[2] = {64, 40}, formats[2] = {SPLASH_KV_F32, SPLASH_KV_INT8};
    enum { KVH = 2, HEADS = 6, NL = 3 };
    const int past[NL] = {700, 0, 95}, rows[NL] = {37, 45, 3};
    for (int hi = 0; hi < 2; hi++)
        for (int fi = 0; fi < 2; fi++) {
            int hd = hds[hi], kw = KVH * hd, qw = HEADS * hd;
            cpu_kv_layout l;
            assert_int_equal(cpu_kv_layout_init(&l, formats[fi], 2, KVH, hd, 32), 0);
            int n_pool = 0, total = 0;
            for (int i = 0; i < NL; i++) n_pool += (past[i] + rows[i] + 31) / 32, total += rows[i];
            uint8_t *pool = calloc((size_t)n_pool, l.page_bytes);
            int32_t *pages[NL];
            float *K[NL], *V[NL];
            cpu_attn_lane lanes[NL];
            int next = 0, r0 = 0;
            for (int i = 0; i < NL; i++) {
                int np = (past[i] + rows[i] + 31) / 32, T = past[i] + rows[i];
                pages[i] = malloc(sizeof(int32_t) * np);
                for (int p = 0; p < np; p++) pages[i][p] = (int32_t)((n_pool - 1 - next++) * 1); /* reversed order */
                K[i] = rand_vec((size_t)T * kw, 1.0f);
                V[i] = rand_vec((size_t)T * kw, 1.0f);
                cpu_attn_lane all = {pages[i], 0, 0, T};
                cpu_kv_write(&c2, &l, pool, 1, &all, 1, K[i], kw, V[i], kw);
                lanes[i] = (cpu_attn_lane){pages[i], past[i], r0, rows[i]};
                r0 += rows[i];
            }
            float *q = rand_vec((size_t)total * qw, 1.5f), *out = malloc(sizeof(float) * total * qw);
            float *other = malloc(sizeof(float) * total * qw);
            run_long_attn(&c2, &l, pool, lanes, NL, HEADS, q, out);
            /* reference: the stored K and V (int8: as the pages hold them), double */
            double worst = 0;
            int row = 0;
            for (int i = 0; i < NL; i++)
                for (int r = 0; r < rows[i]; r++, row++) {
                    int n_pos = past[i] + r + 1;
                    for (int h = 0; h < HEADS; h++) {
                        int g = h / (HEADS / KVH);
                        const float *qh = q + (size_t)row * qw + h * hd;
                        double *sc = malloc(sizeof(double) * n_pos), mx = -1e300, sum = 0;
                        for (int t = 0; t < n_pos; t++) {
                            const float *kr = K[i] + (size_t)t * kw + g * hd;
                            int8_t q8[64];
                            float ks = 1.0f;
                            if (formats[fi] == SPLASH_KV_INT8) cpu_kv_quant_int8(kr, hd, q8, &ks);
                            double d = 0;
                            for (int e = 0; e < hd; e++) d += (double)qh[e] * (formats[fi] == SPLASH_KV_INT8 ? q8[e] * (double)ks : kr[e]);
                            sc[t] = d / sqrt((double)hd);
                            mx = fmax(mx, sc[t]);
                        }
                        for (int t = 0; t < n_pos; t++) sum += (sc[t] = exp(sc[t] - mx));
                        for (int e = 0; e < hd; e++) {
                            double o = 0, mag = 0;
                            for (int t = 0; t < n_pos; t++) {
                                const float *vr = V[i] + (size_t)t * kw + g * hd;
                                int8_t q8[64];
                                float vs = 1.0f;
                                double ve = vr[e];
                                if (formats[fi] == SPLASH_KV_INT8) cpu_kv_quant_int8(vr, hd, q8, &vs), ve = q8[e] * (double)vs;
                                o += sc[t] / sum * ve;
                                mag += sc[t] / sum * fabs(ve);
                            }
                            /* fp32 rounding of scores (hd-term chains), exp (~1 ulp) and sums */
                            double err = fabs(out[(size_t)row * qw + h * hd + e] - o), bound = 4e-6 * (mag + 1e-3);
                            if (err > bound)
                                fail_msg("hd %d format %d: row %d head %d dim %d: %.8g vs %.8g", hd, formats[fi], row, h, e,
                                         out[(size_t)row * qw + h * hd + e], o);
                            worst = fmax(worst, err / bound);
                        }
                        free(sc);
                    }
                }
            printf("# long attention hd %d %s: worst error / bound %.3f\n", hd, formats[fi] == SPLASH_KV_INT8 ? "int8" : "f32",
                   worst);
            run_long_attn(&c1, &l, pool, lanes, NL, HEADS, q, other);
            assert_memory_equal(out, other, sizeof(float) * total * qw);
            if (cpu_simd()) {
                cpu_simd_set(0);
                run_long_attn(&c2, &l, pool, lanes, NL, HEADS, q, other);
                cpu_simd_set(-1);
                assert_memory_equal(out, other, sizeof(float) * total * qw);
            }
            for (int i = 0, off = 0; i < NL; off += rows[i], i++) {
                cpu_attn_lane alone = lanes[i];
                alone.first_row = 0;
                run_long_attn(&c2, &l, pool, &alone, 1, HEADS, q + (size_t)off * qw, other);
                assert_memory_equal(other, out + (size_t)off * qw, sizeof(float) * rows[i] * qw);
                /* and one row at a time (decode), the last rows of the lane */
                for (int r = rows[i] - 2 < 0 ? 0 : rows[i] - 2; r < rows[i]; r++) {
                    cpu_attn_lane one = {pages[i], past[i] + r, 0, 1};
                    run_long_attn(&c2, &l, pool, &one, 1, HEADS, q + (size_t)(off + r) * qw, other);
                    assert_memory_equal(other, out + (size_t)(off + r) * qw, sizeof(float) * qw);
                }
            }
            for (int i = 0; i < NL; i++) free(pages[i]), free(K[i]), free(V[i]);
            free(pool), free(q), free(out), free(other);
        }
    cpu_ctx_free(&c2);
    cpu_ctx_free(&c1);
}

/* The chained helpers give exactly the bits of the calls they replace. */
static void test_dot_axpy_rows(void **state) {
    (void)state;
    const int lens[4] = {64, 96, 40, 13};
    for (int li = 0; li < 4; li++)
        for (int path = 0; path < 2; path++) {
            int len = lens[li], n = 11;
            size_t ld = (size_t)len + 5;
            float *a = rand_vec((size_t)len, 1.0f), *B = rand_vec((size_t)n * ld, 1.0f), got[11], want[11];
            if (path) cpu_simd_set(0);
            cpu_dot_rows(a, B, ld, n, len, got);
            cpu_simd_set(-1);
            for (int k = 0; k < n; k++) want[k] = cpu_dot(a, B + (size_t)k * ld, len);
            assert_memory_equal(got, want, sizeof want);
            float *y0 = rand_vec((size_t)len, 1.0f), *y1 = malloc(sizeof(float) * len);
            memcpy(y1, y0, sizeof(float) * len);
            if (path) cpu_simd_set(0);
            cpu_axpy_rows(a, B, ld, n, y0, len);
            cpu_simd_set(-1);
            for (int k = 0; k < n; k++) cpu_axpy(a[k], B + (size_t)k * ld, y1, len);
            assert_memory_equal(y0, y1, sizeof(float) * len);
            free(a), free(B), free(y0), free(y1);
        }
}

/* The chunked GDN kernel computes, bit for bit, the straightforward chunked
 * algorithm written with one cpu_dot / cpu_axpy per step (below), on both
 * paths. */
static void chunked_reference(float *S, int dk, int dv, int n, const float *q, const float *k, const float *v,
                              const float *g, const float *beta, float *o) {
    enum { C = CPU_GDN_CHUNK };
    float cum[C], *A = malloc(sizeof(float) * C * C), *kb = malloc(sizeof(float) * C * dk);
    float *W = malloc(sizeof(float) * C * dk), *U = malloc(sizeof(float) * C * dv);
    float *tmp = malloc(sizeof(float) * dv), *tmp2 = malloc(sizeof(float) * dv), kd[C];
    for (int t0 = 0; t0 < n; t0 += C) {
        int L = n - t0 < C ? n - t0 : C;
        const float *qc = q + (size_t)t0 * dk, *kc = k + (size_t)t0 * dk, *vc = v + (size_t)t0 * dv;
        for (int i = 0; i < L; i++) cum[i] = (i ? cum[i - 1] : 0.0f) + g[t0 + i];
        for (int i = 0; i < L; i++) {
            for (int r = 0; r < dk; r++) kb[i * dk + r] = kc[i * dk + r] * beta[t0 + i];
            for (int c = 0; c < dv; c++) U[i * dv + c] = vc[i * dv + c] * beta[t0 + i];
        }
        for (int i = 0; i < L; i++)
            for (int j = 0; j < i; j++) A[i * C + j] = cpu_dot(kb + i * dk, kc + j * dk, dk) * expf(cum[i] - cum[j]);
        for (int i = 0; i < L; i++) {
            float e = expf(cum[i]);
            for (int r = 0; r < dk; r++) W[i * dk + r] = kb[i * dk + r] * e;
            for (int j = 0; j < i; j++) {
                cpu_axpy(-A[i * C + j], U + j * dv, U + i * dv, dv);
                cpu_axpy(-A[i * C + j], W + j * dk, W + i * dk, dk);
            }
        }
        for (int i = 0; i < L; i++) {
            memset(tmp, 0, sizeof(float) * dv);
            for (int r = 0; r < dk; r++) cpu_axpy(W[i * dk + r], S + r * dv, tmp, dv);
            for (int c = 0; c < dv; c++) U[i * dv + c] -= tmp[c];
        }
        for (int i = 0; i < L; i++) {
            const float *qi = qc + i * dk;
            float e = expf(cum[i]);
            memset(tmp, 0, sizeof(float) * dv);
            for (int r = 0; r < dk; r++) cpu_axpy(qi[r] * e, S + r * dv, tmp, dv);
            memset(tmp2, 0, sizeof(float) * dv);
            for (int j = 0; j <= i; j++) cpu_axpy(cpu_dot(qi, kc + j * dk, dk) * expf(cum[i] - cum[j]), U + j * dv, tmp2, dv);
            for (int c = 0; c < dv; c++) o[(size_t)(t0 + i) * dv + c] = tmp[c] + tmp2[c];
        }
        float el = expf(cum[L - 1]);
        for (int i = 0; i < L; i++) kd[i] = expf(cum[L - 1] - cum[i]);
        for (int r = 0; r < dk; r++) {
            memset(tmp, 0, sizeof(float) * dv);
            for (int i = 0; i < L; i++) cpu_axpy(kc[i * dk + r] * kd[i], U + i * dv, tmp, dv);
            for (int c = 0; c < dv; c++) S[r * dv + c] = S[r * dv + c] * el + tmp[c];
        }
    }
    free(A), free(kb), free(W), free(U), free(tmp), free(tmp2);
}

static void test_gdn_chunked_exact(void **state) {
    (void)state;
    const int dks[3] = {64, 32, 16}, dvs[3] = {64, 48, 16}, ns[3] = {150, 64, 70};
    for (int cfg = 0; cfg < 3; cfg++)
        for (int path = 0; path < 2; path++) {
            int dk = dks[cfg], dv = dvs[cfg], n = ns[cfg];
            gdn_in in = gdn_random(n, dk, dv, 0.5f);
            float *S0 = rand_vec((size_t)dk * dv, 0.3f), *Sa = malloc(sizeof(float) * dk * dv);
            float *Sb = malloc(sizeof(float) * dk * dv), *oa = malloc(sizeof(float) * n * dv);
            float *ob = malloc(sizeof(float) * n * dv), *scratch = malloc(sizeof(float) * cpu_gdn_chunk_scratch(dk, dv));
            memcpy(Sa, S0, sizeof(float) * dk * dv);
            memcpy(Sb, S0, sizeof(float) * dk * dv);
            if (path) cpu_simd_set(0);
            chunked_reference(Sa, dk, dv, n, in.q, in.k, in.v, in.g, in.beta, oa);
            cpu_gdn_chunked(Sb, dk, dv, n, in.q, in.k, dk, in.v, dv, in.g, in.beta, 1, ob, dv, scratch);
            cpu_simd_set(-1);
            assert_memory_equal(oa, ob, sizeof(float) * n * dv);
            assert_memory_equal(Sa, Sb, sizeof(float) * dk * dv);
            free(S0), free(Sa), free(Sb), free(oa), free(ob), free(scratch);
            gdn_free(&in);
        }
}

/* Quantised-activation products of many rows on narrow matrices (fewer than
 * 8 groups: the hidden size of the small models) and wide ones: each input
 * alone gives the same bits, and the scalar path too. */
static void test_matmul_act_blocks(void **state) {
    (void)state;
    cpu_ctx c;
    assert_int_equal(cpu_ctx_init(&c, 2, 16, 1024), 0);
    const int colss[3] = {256, 1024, 576}, ms[3] = {13, 6, 16};
    for (int act = CPU_ACT_I16; act <= CPU_ACT_I8; act++) {
        assert_int_equal(cpu_set_act(&c, act), 0);
        for (int dq = 0; dq < 2; dq++)
            for (int si = 0; si < 3; si++) {
                int rows = 37, cols = colss[si], m = ms[si];
                test_mat w = make_mat(dq ? SPLASH_Q8 : SPLASH_Q4, rows, cols);
                float *x = rand_vec((size_t)m * cols, 1.0f), *y = malloc(sizeof(float) * m * rows);
                float *y1 = malloc(sizeof(float) * rows), *ys = malloc(sizeof(float) * m * rows);
                cpu_matmul(&c, &w.t, m, x, cols, y, rows);
                for (int i = 0; i < m; i++) {
                    cpu_matmul(&c, &w.t, 1, x + (size_t)i * cols, cols, y1, rows);
                    assert_memory_equal(y1, y + (size_t)i * rows, sizeof(float) * rows);
                }
                cpu_simd_set(0);
                cpu_matmul(&c, &w.t, m, x, cols, ys, rows);
                cpu_simd_set(-1);
                assert_memory_equal(ys, y, sizeof(float) * m * rows);
                free(x), free(y), free(y1), free(ys);
                free_mat(&w);
            }
    }
    cpu_ctx_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_all_dtypes),
        cmocka_unit_test(test_matmul_threads_and_paths),
        cmocka_unit_test(test_matmul_quantised_activations),
        cmocka_unit_test(test_matmul_fused),
        cmocka_unit_test(test_norms),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_attention_paged),
        cmocka_unit_test(test_gdn_conv),
        cmocka_unit_test(test_gdn_step_reference),
        cmocka_unit_test(test_gdn_chunked_matches_recurrent),
        cmocka_unit_test(test_gdn_step_paths),
        cmocka_unit_test(test_attention_long),
        cmocka_unit_test(test_dot_axpy_rows),
        cmocka_unit_test(test_gdn_chunked_exact),
        cmocka_unit_test(test_matmul_act_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
