/* matmul.c - y = x W^T for a few to a few hundred input rows, weights in
 * their package encoding (f32, bf16, f16, q8, q4), dequantised on the fly.
 *
 * Threads split the output rows (each task a block of weight rows); inside a
 * task every weight row is streamed once and dotted with every input row, so
 * a verify block of 8-16 rows costs little more weight traffic than decoding
 * one.  The per-(row, input) reduction is the fixed one described in cpu.h,
 * identical in the AVX2 and scalar paths and independent of m, so results are
 * batch-invariant and path-independent.
 *
 * Quantised rows use sum_c (s q_c + b) x_c = s * sum q_c x_c + b * sum x_c per
 * group; the group sums of x are computed once per call (into ctx->xsum).
 * When the context asks for quantised activations (ctx->act), q4/q8 rows go
 * to matmul_act.c instead; plain rows always take the fp32 path.
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/reduce.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

#define G SPLASH_QGROUP
#define OB 4 /* weight rows unpacked together (q paths, m > 1) */
#define MB 8 /* input rows per accumulator block (q paths, m > 1) */

static inline float plain_elem(splash_dtype t, const uint8_t *row, int c) {
    switch (t) {
    case SPLASH_F32: {
        float f;
        memcpy(&f, row + 4 * (size_t)c, 4);
        return f;
    }
    case SPLASH_BF16: {
        uint16_t h;
        memcpy(&h, row + 2 * (size_t)c, 2);
        return splash_bf16_to_f32(h);
    }
    default: {
        uint16_t h;
        memcpy(&h, row + 2 * (size_t)c, 2);
        return splash_f16_to_f32(h);
    }
    }
}

static float dot_plain_scalar(splash_dtype t, const uint8_t *row, const float *x, int n) {
    float acc[32] = {0};
    int c = 0;
    for (; c + 32 <= n; c += 32)
        for (int l = 0; l < 32; l++) acc[l] = fmaf(plain_elem(t, row, c + l), x[c + l], acc[l]);
    for (int l = 0; c + l < n; l++) acc[l] = fmaf(plain_elem(t, row, c + l), x[c + l], acc[l]);
    return reduce32(acc);
}

static void xsum_scalar(const float *x, int groups, float *out) {
    for (int g = 0; g < groups; g++) {
        const float *xg = x + (size_t)g * G;
        float s[8];
        for (int l = 0; l < 8; l++) {
            s[l] = xg[l];
            for (int k = 1; k < 8; k++) s[l] += xg[8 * k + l];
        }
        out[g] = hsum8(s);
    }
}

/* Unpacks group g of a q4/q8 row to its integer values as floats. */
static inline void unpack_scalar(int bits, const uint8_t *qrow, int g, float *qf) {
    if (bits == 8) {
        const uint8_t *p = qrow + (size_t)g * G;
        for (int j = 0; j < G; j++) qf[j] = (float)p[j];
    } else {
        const uint8_t *p = qrow + (size_t)g * (G / 2);
        for (int j = 0; j < G / 2; j++) {
            qf[2 * j] = (float)(p[j] & 15);
            qf[2 * j + 1] = (float)(p[j] >> 4);
        }
    }
}

static float dot_q_scalar(int bits, const uint8_t *qrow, const uint16_t *sc, const uint16_t *bi, int groups,
                          const float *x, const float *xs) {
    float acc[8] = {0}, bs = 0.0f, qf[G];
    for (int g = 0; g < groups; g++) {
        unpack_scalar(bits, qrow, g, qf);
        const float *xg = x + (size_t)g * G;
        float s = splash_bf16_to_f32(sc[g]), b = splash_bf16_to_f32(bi[g]);
        for (int l = 0; l < 8; l++) {
            float p0 = qf[l] * xg[l];
            p0 = fmaf(qf[16 + l], xg[16 + l], p0);
            p0 = fmaf(qf[32 + l], xg[32 + l], p0);
            p0 = fmaf(qf[48 + l], xg[48 + l], p0);
            float p1 = qf[8 + l] * xg[8 + l];
            p1 = fmaf(qf[24 + l], xg[24 + l], p1);
            p1 = fmaf(qf[40 + l], xg[40 + l], p1);
            p1 = fmaf(qf[56 + l], xg[56 + l], p1);
            acc[l] = fmaf(s, p0 + p1, acc[l]);
        }
        bs = fmaf(b, xs[g], bs);
    }
    return hsum8(acc) + bs;
}

/* ---- AVX2 + FMA ------------------------------------------------------------ */

#if HAVE_X86

AVX static inline __m256 load8_plain(splash_dtype t, const uint8_t *row, int c) {
    switch (t) {
    case SPLASH_F32: return _mm256_loadu_ps((const float *)(const void *)(row + 4 * (size_t)c));
    case SPLASH_BF16: {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(row + 2 * (size_t)c));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    default: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(row + 2 * (size_t)c)));
    }
}

AVX static float dot_plain_avx(splash_dtype t, const uint8_t *row, const float *x, int n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int c = 0;
    for (; c + 32 <= n; c += 32) {
        a0 = _mm256_fmadd_ps(load8_plain(t, row, c), _mm256_loadu_ps(x + c), a0);
        a1 = _mm256_fmadd_ps(load8_plain(t, row, c + 8), _mm256_loadu_ps(x + c + 8), a1);
        a2 = _mm256_fmadd_ps(load8_plain(t, row, c + 16), _mm256_loadu_ps(x + c + 16), a2);
        a3 = _mm256_fmadd_ps(load8_plain(t, row, c + 24), _mm256_loadu_ps(x + c + 24), a3);
    }
    if (c == n) return hsum8_avx(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    float acc[32];
    _mm256_storeu_ps(acc, a0);
    _mm256_storeu_ps(acc + 8, a1);
    _mm256_storeu_ps(acc + 16, a2);
    _mm256_storeu_ps(acc + 24, a3);
    for (int l = 0; c + l < n; l++) acc[l] = fmaf(plain_elem(t, row, c + l), x[c + l], acc[l]);
    return reduce32(acc);
}

AVX static void xsum_avx(const float *x, int groups, float *out) {
    for (int g = 0; g < groups; g++) {
        const float *xg = x + (size_t)g * G;
        __m256 s = _mm256_loadu_ps(xg);
        for (int k = 1; k < 8; k++) s = _mm256_add_ps(s, _mm256_loadu_ps(xg + 8 * k));
        out[g] = hsum8_avx(s);
    }
}

/* The 8 vectors (columns 8k..8k+7) of group g's integer codes. */
AVX static inline void unpack_avx(int bits, const uint8_t *qrow, int g, __m256 q[8]) {
    if (bits == 8) {
        const uint8_t *p = qrow + (size_t)g * G;
        for (int k = 0; k < 8; k++)
            q[k] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(p + 8 * k))));
    } else {
        const uint8_t *p = qrow + (size_t)g * (G / 2);
        const __m128i mask = _mm_set1_epi8(15);
        for (int h = 0; h < 2; h++) { /* 16 bytes = 32 values */
            __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * h));
            __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
            __m128i e0 = _mm_unpacklo_epi8(lo, hi), e1 = _mm_unpackhi_epi8(lo, hi); /* values in order */
            q[4 * h + 0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e0));
            q[4 * h + 1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(e0, 8)));
            q[4 * h + 2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e1));
            q[4 * h + 3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(e1, 8)));
        }
    }
}

AVX static inline __m256 group_dot_avx(const __m256 q[8], const float *xg) {
    __m256 p0 = _mm256_mul_ps(q[0], _mm256_loadu_ps(xg));
    __m256 p1 = _mm256_mul_ps(q[1], _mm256_loadu_ps(xg + 8));
    p0 = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xg + 16), p0);
    p1 = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xg + 24), p1);
    p0 = _mm256_fmadd_ps(q[4], _mm256_loadu_ps(xg + 32), p0);
    p1 = _mm256_fmadd_ps(q[5], _mm256_loadu_ps(xg + 40), p1);
    p0 = _mm256_fmadd_ps(q[6], _mm256_loadu_ps(xg + 48), p0);
    p1 = _mm256_fmadd_ps(q[7], _mm256_loadu_ps(xg + 56), p1);
    return _mm256_add_ps(p0, p1);
}

/* One row, one input (decode): codes stay in registers. */
AVX static float dot_q_avx(int bits, const uint8_t *qrow, const uint16_t *sc, const uint16_t *bi, int groups,
                           const float *x, const float *xs) {
    __m256 acc = _mm256_setzero_ps();
    float bs = 0.0f;
    for (int g = 0; g < groups; g++) {
        __m256 q[8];
        unpack_avx(bits, qrow, g, q);
        __m256 p = group_dot_avx(q, x + (size_t)g * G);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(splash_bf16_to_f32(sc[g])), p, acc);
        bs = fmaf(splash_bf16_to_f32(bi[g]), xs[g], bs);
    }
    return hsum8_avx(acc) + bs;
}

/* Up to OB rows x MB inputs: each group of each row is unpacked once and
 * dotted with every input. */
AVX static void block_q_avx(int bits, const uint8_t *const *qrow, const uint16_t *const *sc,
                            const uint16_t *const *bi, int nr, int groups, const float *x, size_t ldx,
                            const float *xs, size_t lds, int ni, float *y, size_t ldy) {
    __m256 acc[OB][MB];
    float bs[OB][MB];
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < ni; i++) acc[r][i] = _mm256_setzero_ps(), bs[r][i] = 0.0f;
    for (int g = 0; g < groups; g++) {
        __m256 q[OB][8];
        float s[OB], b[OB];
        for (int r = 0; r < nr; r++) {
            unpack_avx(bits, qrow[r], g, q[r]);
            s[r] = splash_bf16_to_f32(sc[r][g]);
            b[r] = splash_bf16_to_f32(bi[r][g]);
        }
        for (int i = 0; i < ni; i++) {
            const float *xg = x + (size_t)i * ldx + (size_t)g * G;
            float xsg = xs[(size_t)i * lds + g];
            for (int r = 0; r < nr; r++) {
                acc[r][i] = _mm256_fmadd_ps(_mm256_set1_ps(s[r]), group_dot_avx(q[r], xg), acc[r][i]);
                bs[r][i] = fmaf(b[r], xsg, bs[r][i]);
            }
        }
    }
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < ni; i++) y[(size_t)i * ldy + r] = hsum8_avx(acc[r][i]) + bs[r][i];
}

#endif

/* ---- the job --------------------------------------------------------------- */

typedef struct mm_job {
    splash_dtype dtype;
    int rows, cols, groups, bits;
    const uint8_t *data;
    size_t row_bytes; /* plain: bytes per row; q: code bytes per row */
    const uint16_t *scales, *biases;
    int m;
    const float *x;
    size_t ldx;
    float *y;
    size_t ldy;
    const float *xsum;
    int act;          /* CPU_ACT_*: quantised activations in xq/xd unless F32 */
    const void *xq;
    const float *xd;
    int rows_per_task;
    int simd;
} mm_job;

static void mm_task(void *ctx, size_t task, int worker) {
    (void)worker;
    const mm_job *j = ctx;
    int r0 = (int)task * j->rows_per_task;
    int r1 = r0 + j->rows_per_task;
    if (r1 > j->rows) r1 = j->rows;
    if (j->act != CPU_ACT_F32) { /* quantised activations: matmul_act.c */
        int gs = j->groups;
        size_t xstride = (size_t)gs * G * (j->act == CPU_ACT_I16 ? 2 : 1);
        for (int r = r0; r < r1; r++) {
            const uint8_t *qr = j->data + (size_t)r * j->row_bytes;
            const uint16_t *sr = j->scales + (size_t)r * gs, *br = j->biases + (size_t)r * gs;
            for (int i = 0; i < j->m; i++)
                j->y[(size_t)i * j->ldy + r] =
                    cpu_act_dot(j->act, j->bits, j->simd, qr, sr, br, gs, (const uint8_t *)j->xq + (size_t)i * xstride,
                                j->xd + (size_t)i * gs, j->xsum + (size_t)i * gs);
        }
        return;
    }
    if (j->dtype == SPLASH_Q4 || j->dtype == SPLASH_Q8) {
        int gs = j->groups;
#if HAVE_X86
        if (j->simd && j->m > 1) {
            for (int r = r0; r < r1; r += OB) {
                int nr = r1 - r < OB ? r1 - r : OB;
                const uint8_t *qr[OB];
                const uint16_t *sr[OB], *br[OB];
                for (int k = 0; k < nr; k++) {
                    qr[k] = j->data + (size_t)(r + k) * j->row_bytes;
                    sr[k] = j->scales + (size_t)(r + k) * gs;
                    br[k] = j->biases + (size_t)(r + k) * gs;
                }
                for (int i = 0; i < j->m; i += MB) {
                    int ni = j->m - i < MB ? j->m - i : MB;
                    block_q_avx(j->bits, qr, sr, br, nr, gs, j->x + (size_t)i * j->ldx, j->ldx,
                                j->xsum + (size_t)i * gs, (size_t)gs, ni, j->y + (size_t)i * j->ldy + r, j->ldy);
                }
            }
            return;
        }
#endif
        for (int r = r0; r < r1; r++) {
            const uint8_t *qr = j->data + (size_t)r * j->row_bytes;
            const uint16_t *sr = j->scales + (size_t)r * gs, *br = j->biases + (size_t)r * gs;
            for (int i = 0; i < j->m; i++) {
                const float *xi = j->x + (size_t)i * j->ldx, *xs = j->xsum + (size_t)i * gs;
                float v;
#if HAVE_X86
                if (j->simd)
                    v = dot_q_avx(j->bits, qr, sr, br, gs, xi, xs);
                else
#endif
                    v = dot_q_scalar(j->bits, qr, sr, br, gs, xi, xs);
                j->y[(size_t)i * j->ldy + r] = v;
            }
        }
        return;
    }
    /* plain rows: for each input, every row of the (cache-sized) block */
    for (int i = 0; i < j->m; i++) {
        const float *xi = j->x + (size_t)i * j->ldx;
        float *yi = j->y + (size_t)i * j->ldy;
        for (int r = r0; r < r1; r++) {
            const uint8_t *row = j->data + (size_t)r * j->row_bytes;
#if HAVE_X86
            if (j->simd)
                yi[r] = dot_plain_avx(j->dtype, row, xi, j->cols);
            else
#endif
                yi[r] = dot_plain_scalar(j->dtype, row, xi, j->cols);
        }
    }
}

void cpu_matmul(cpu_ctx *c, const splash_tensor *w, int m, const float *x, size_t ldx, float *y, size_t ldy) {
    int64_t rows64, cols64, count;
    splash_tensor_matrix_dims(w, &rows64, &cols64, &count);
    if (m <= 0 || rows64 <= 0) return;
    mm_job j;
    memset(&j, 0, sizeof j);
    j.dtype = w->dtype;
    j.rows = (int)rows64;
    j.cols = (int)cols64;
    j.m = m;
    j.x = x, j.ldx = ldx, j.y = y, j.ldy = ldy;
    j.data = w->data;
    j.simd = cpu_simd();
    size_t weight_row_bytes;
    if (w->dtype == SPLASH_Q4 || w->dtype == SPLASH_Q8) {
        splash_qlayout l = splash_matrix_layout(w->dtype, rows64, cols64);
        j.bits = w->dtype == SPLASH_Q4 ? 4 : 8;
        j.groups = j.cols / G;
        j.row_bytes = (size_t)j.cols * (size_t)j.bits / 8;
        j.scales = (const uint16_t *)(const void *)(w->data + l.scales_offset);
        j.biases = (const uint16_t *)(const void *)(w->data + l.biases_offset);
        /* group sums of every input row (m <= c->max_m, cols <= c->max_cols) */
        for (int i = 0; i < m; i++) {
#if HAVE_X86
            if (j.simd)
                xsum_avx(x + (size_t)i * ldx, j.groups, c->xsum + (size_t)i * j.groups);
            else
#endif
                xsum_scalar(x + (size_t)i * ldx, j.groups, c->xsum + (size_t)i * j.groups);
        }
        j.xsum = c->xsum;
        j.act = c->act;
        if (j.act != CPU_ACT_F32) {
            size_t xstride = (size_t)j.groups * G * (j.act == CPU_ACT_I16 ? 2 : 1);
            for (int i = 0; i < m; i++)
                cpu_act_quantize(j.act, j.bits, x + (size_t)i * ldx, j.groups, (uint8_t *)c->xq + (size_t)i * xstride,
                                 c->xd + (size_t)i * j.groups);
            j.xq = c->xq;
            j.xd = c->xd;
        }
        weight_row_bytes = j.row_bytes + (size_t)j.groups * 4;
    } else {
        j.row_bytes = (size_t)j.cols * (w->dtype == SPLASH_F32 ? 4 : 2);
        weight_row_bytes = j.row_bytes;
    }
    /* Tasks: blocks of rows whose weights stay in L2 while every input row
     * passes over them, and enough tasks to keep every worker busy. */
    int rpt = (int)(65536 / (weight_row_bytes ? weight_row_bytes : 1));
    if (rpt > 64) rpt = 64;
    if (rpt < 1) rpt = 1;
    int want_tasks = 4 * c->n_threads;
    if ((j.rows + rpt - 1) / rpt < want_tasks) rpt = j.rows / want_tasks;
    if (rpt < 1) rpt = 1;
    if (rpt > OB) rpt = (rpt + OB - 1) / OB * OB;
    j.rows_per_task = rpt;
    cpu_parallel(c, (size_t)((j.rows + rpt - 1) / rpt), mm_task, &j);
}

void cpu_dequant_row(const splash_tensor *w, int64_t r, float *out) { splash_tensor_row_f32(w, r, out); }

float cpu_dot(const float *a, const float *b, int n) {
#if HAVE_X86
    if (cpu_simd()) return dot_plain_avx(SPLASH_F32, (const uint8_t *)a, b, n);
#endif
    return dot_plain_scalar(SPLASH_F32, (const uint8_t *)a, b, n);
}
