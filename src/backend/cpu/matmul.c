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
 * One call can carry several matrices that read the same input rows (a GDN
 * layer's four input projections, attention's q/k/v, gate and up): the
 * inputs are prepared once and the tasks of all the matrices go to the pool
 * in one run, which matters when a decode step is ~120 such runs.  Outputs
 * can be stored, added to (the residual stream: y += W x gives the bits of
 * computing W x and then adding), or, for gate/up, combined as silu(g) * u.
 *
 * Quantised rows use sum_c (s q_c + b) x_c = s * sum q_c x_c + b * sum x_c per
 * group; the group sums of x are computed once per call.  On fp32
 * activations a q4 group is dotted against x reordered per group (the 32
 * even columns, then the 32 odd ones), so one byte load gives 8 low-nibble
 * codes for 8 consecutive even columns and their 8 high nibbles for the odd
 * ones.  When the context asks for quantised activations (ctx->act), q4/q8
 * rows go to matmul_act.c instead; plain rows always take the fp32 path.
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/reduce.h"
#include "base/status.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

#define G SPLASH_QGROUP
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define PF_DIST 4096 /* bytes of codes prefetched ahead (decode streams rows from DRAM) */
#define OB 4 /* weight rows unpacked together (fp32 q paths, m > 1) */
#define MB 32 /* input rows per accumulator block (fp32 q paths, m > 1) */

enum { MM_PARTS, MM_SWIGLU };

/* ---- plain rows (f32, bf16, f16) -------------------------------------------- */

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

/* ---- q4/q8 rows on fp32 activations: scalar --------------------------------- */

/* A group's codes as the 8 vectors the AVX2 path builds (qf[8v + l]: vector
 * v, lane l), and the x offset each vector is dotted with.  q4 (x in q4
 * order): vectors 2j / 2j+1 = low / high nibbles of bytes 8j..8j+7, against
 * xp[8j..] / xp[32+8j..].  q8: vector v = codes 8v..8v+7 against x[8v..]. */
static const int off_q4[8] = {0, 32, 8, 40, 16, 48, 24, 56};
static const int off_q8[8] = {0, 8, 16, 24, 32, 40, 48, 56};

static inline void unpack_scalar(int bits, const uint8_t *qg, float qf[G]) {
    if (bits == 8) {
        for (int j = 0; j < G; j++) qf[j] = (float)qg[j];
        return;
    }
    for (int j = 0; j < 4; j++)
        for (int l = 0; l < 8; l++) {
            qf[8 * (2 * j) + l] = (float)(qg[8 * j + l] & 15);
            qf[8 * (2 * j + 1) + l] = (float)(qg[8 * j + l] >> 4);
        }
}

/* p0 = vectors 0, 2, 4, 6 and p1 = 1, 3, 5, 7 as two fma chains; P = p0 + p1 */
static inline void group_dot_scalar(const float qf[G], const float *xg, const int off[8], float P[8]) {
    for (int l = 0; l < 8; l++) {
        float p0 = qf[l] * xg[off[0] + l], p1 = qf[8 + l] * xg[off[1] + l];
        for (int v = 2; v < 8; v += 2) {
            p0 = fmaf(qf[8 * v + l], xg[off[v] + l], p0);
            p1 = fmaf(qf[8 * (v + 1) + l], xg[off[v + 1] + l], p1);
        }
        P[l] = p0 + p1;
    }
}

static float dot_q_scalar(int bits, const uint8_t *qrow, const uint16_t *sc, const uint16_t *bi, int groups,
                          const float *x, const float *xs) {
    float acc[2][8] = {{0}}, bl[8] = {0}, qf[G], P[8];
    size_t qb = (size_t)G * (size_t)bits / 8;
    const int *off = bits == 4 ? off_q4 : off_q8;
    for (int g = 0; g < groups; g++) {
        unpack_scalar(bits, qrow + (size_t)g * qb, qf);
        group_dot_scalar(qf, x + (size_t)g * G, off, P);
        float s = splash_bf16_to_f32(sc[g]);
        for (int l = 0; l < 8; l++) acc[g & 1][l] = fmaf(s, P[l], acc[g & 1][l]);
        bl[g & 7] = fmaf(splash_bf16_to_f32(bi[g]), xs[g], bl[g & 7]);
    }
    return finish_q(acc[0], acc[1], bl);
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

static void q4_order_scalar(const float *x, int groups, float *out) {
    for (int g = 0; g < groups; g++)
        for (int j = 0; j < 32; j++) {
            out[(size_t)g * G + j] = x[(size_t)g * G + 2 * j];
            out[(size_t)g * G + 32 + j] = x[(size_t)g * G + 2 * j + 1];
        }
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

AVX static void q4_order_avx(const float *x, int groups, float *out) {
    for (int g = 0; g < groups; g++) {
        const float *xg = x + (size_t)g * G;
        float *o = out + (size_t)g * G;
        for (int k = 0; k < 4; k++) { /* columns 16k..16k+15 -> evens 8k.., odds 32+8k.. */
            __m256 a = _mm256_loadu_ps(xg + 16 * k), b = _mm256_loadu_ps(xg + 16 * k + 8);
            __m256 ev = _mm256_shuffle_ps(a, b, 0x88), od = _mm256_shuffle_ps(a, b, 0xDD); /* a0 a2 b0 b2 | a4 a6 b4 b6 */
            _mm256_storeu_ps(o + 8 * k, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(ev), 0xD8)));
            _mm256_storeu_ps(o + 32 + 8 * k, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(od), 0xD8)));
        }
    }
}

/* The 8 code vectors of one group (see unpack_scalar). */
AVX static ALWAYS_INLINE void unpack_avx(int bits, const uint8_t *qg, __m256 q[8]) {
    if (bits == 8) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            q[k] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(qg + 8 * k))));
        return;
    }
    const __m256i mask = _mm256_set1_epi32(15);
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(qg + 8 * j)));
        q[2 * j] = _mm256_cvtepi32_ps(_mm256_and_si256(w, mask));
        q[2 * j + 1] = _mm256_cvtepi32_ps(_mm256_srli_epi32(w, 4));
    }
}

AVX static ALWAYS_INLINE __m256 group_dot_avx(int bits, const __m256 q[8], const float *xg) {
    const int *off = bits == 4 ? off_q4 : off_q8;
    __m256 p0 = _mm256_mul_ps(q[0], _mm256_loadu_ps(xg + off[0]));
    __m256 p1 = _mm256_mul_ps(q[1], _mm256_loadu_ps(xg + off[1]));
    p0 = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xg + off[2]), p0);
    p1 = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xg + off[3]), p1);
    p0 = _mm256_fmadd_ps(q[4], _mm256_loadu_ps(xg + off[4]), p0);
    p1 = _mm256_fmadd_ps(q[5], _mm256_loadu_ps(xg + off[5]), p1);
    p0 = _mm256_fmadd_ps(q[6], _mm256_loadu_ps(xg + off[6]), p0);
    p1 = _mm256_fmadd_ps(q[7], _mm256_loadu_ps(xg + off[7]), p1);
    return _mm256_add_ps(p0, p1);
}

/* One row, one input (decode): codes stay in registers.  Inlined into a
 * version per code width so the offsets and unpacking are constants. */
AVX static ALWAYS_INLINE float dot_q_avx_t(int bits, const uint8_t *qrow, const uint16_t *sc, const uint16_t *bi, int groups,
                           const float *x, const float *xs) {
    size_t qb = (size_t)G * (size_t)bits / 8;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, bl = a0;
    float S[8] __attribute__((aligned(32)));
    int g = 0;
    for (; g + 8 <= groups; g += 8) {
        _mm256_store_ps(S, bf16x8_avx(sc + g));
        bl = _mm256_fmadd_ps(bf16x8_avx(bi + g), _mm256_loadu_ps(xs + g), bl);
        const uint8_t *q = qrow + (size_t)g * qb;
        for (size_t pf = 0; pf < 8 * qb; pf += 64) _mm_prefetch((const char *)(q + PF_DIST + pf), _MM_HINT_T0);
#pragma GCC unroll 4
        for (int k = 0; k < 8; k += 2) {
            __m256 qv[8];
            unpack_avx(bits, q + (size_t)k * qb, qv);
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(S + k), group_dot_avx(bits, qv, x + (size_t)(g + k) * G), a0);
            unpack_avx(bits, q + (size_t)(k + 1) * qb, qv);
            a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(S + k + 1), group_dot_avx(bits, qv, x + (size_t)(g + k + 1) * G), a1);
        }
    }
    if (g == groups) return hsum8_avx(_mm256_add_ps(a0, a1)) + hsum8_avx(bl);
    float blv[8];
    _mm256_storeu_ps(blv, bl);
    for (; g < groups; g++) {
        __m256 qv[8];
        unpack_avx(bits, qrow + (size_t)g * qb, qv);
        __m256 p = group_dot_avx(bits, qv, x + (size_t)g * G);
        __m256 s = _mm256_set1_ps(splash_bf16_to_f32(sc[g]));
        if (g & 1)
            a1 = _mm256_fmadd_ps(s, p, a1);
        else
            a0 = _mm256_fmadd_ps(s, p, a0);
        blv[g & 7] = fmaf(splash_bf16_to_f32(bi[g]), xs[g], blv[g & 7]);
    }
    return hsum8_avx(_mm256_add_ps(a0, a1)) + hsum8(blv);
}

AVX static float dot_q4_avx(const uint8_t *qrow, const uint16_t *sc, const uint16_t *bi, int groups, const float *x,
                            const float *xs) {
    return dot_q_avx_t(4, qrow, sc, bi, groups, x, xs);
}

AVX static float dot_q8_avx(const uint8_t *qrow, const uint16_t *sc, const uint16_t *bi, int groups, const float *x,
                            const float *xs) {
    return dot_q_avx_t(8, qrow, sc, bi, groups, x, xs);
}

/* Up to OB rows x MB inputs: each group of each row is unpacked once and
 * dotted with every input; per (row, input) the same sums as dot_q_avx. */
AVX static ALWAYS_INLINE void block_q_avx_t(int bits, const uint8_t *q, size_t row_bytes, const uint16_t *sc,
                                             const uint16_t *bi, int groups, int nr, const float *x, size_t ldx,
                                             const float *xs, size_t lds, int ni, float *y, size_t ldy, int add) {
    size_t qb = (size_t)G * (size_t)bits / 8;
    __m256 acc[OB][MB][2], bl[OB][MB];
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < ni; i++) acc[r][i][0] = acc[r][i][1] = bl[r][i] = _mm256_setzero_ps();
    for (int g8 = 0; g8 < groups; g8 += 8) {
        int nk = groups - g8 < 8 ? groups - g8 : 8;
        float S[OB][8] __attribute__((aligned(32)));
        for (int r = 0; r < nr; r++) {
            const uint16_t *sr = sc + (size_t)r * groups + g8, *br = bi + (size_t)r * groups + g8;
            if (nk == 8) {
                _mm256_store_ps(S[r], bf16x8_avx(sr));
                __m256 b = bf16x8_avx(br);
                for (int i = 0; i < ni; i++)
                    bl[r][i] = _mm256_fmadd_ps(b, _mm256_loadu_ps(xs + (size_t)i * lds + g8), bl[r][i]);
            } else {
                for (int k = 0; k < nk; k++) S[r][k] = splash_bf16_to_f32(sr[k]);
                for (int i = 0; i < ni; i++) {
                    float blv[8];
                    _mm256_storeu_ps(blv, bl[r][i]);
                    for (int k = 0; k < nk; k++) blv[k] = fmaf(splash_bf16_to_f32(br[k]), xs[(size_t)i * lds + g8 + k], blv[k]);
                    bl[r][i] = _mm256_loadu_ps(blv);
                }
            }
        }
        for (int k = 0; k < nk; k++) {
            int g = g8 + k;
            __m256 qv[OB][8];
            for (int r = 0; r < nr; r++) unpack_avx(bits, q + (size_t)r * row_bytes + (size_t)g * qb, qv[r]);
            for (int i = 0; i < ni; i++) {
                const float *xg = x + (size_t)i * ldx + (size_t)g * G;
                for (int r = 0; r < nr; r++)
                    acc[r][i][k & 1] = _mm256_fmadd_ps(_mm256_set1_ps(S[r][k]), group_dot_avx(bits, qv[r], xg), acc[r][i][k & 1]);
            }
        }
    }
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < ni; i++) {
            float v = hsum8_avx(_mm256_add_ps(acc[r][i][0], acc[r][i][1])) + hsum8_avx(bl[r][i]);
            float *yo = y + (size_t)i * ldy + r;
            *yo = add ? *yo + v : v;
        }
}

AVX static void block_q_avx(int bits, const uint8_t *q, size_t row_bytes, const uint16_t *sc, const uint16_t *bi,
                            int groups, int nr, const float *x, size_t ldx, const float *xs, size_t lds, int ni,
                            float *y, size_t ldy, int add) {
    if (bits == 4)
        block_q_avx_t(4, q, row_bytes, sc, bi, groups, nr, x, ldx, xs, lds, ni, y, ldy, add);
    else
        block_q_avx_t(8, q, row_bytes, sc, bi, groups, nr, x, ldx, xs, lds, ni, y, ldy, add);
}

#endif

/* ---- the job --------------------------------------------------------------- */

typedef struct mm_mat {
    splash_dtype dtype;
    int rows, bits;
    const uint8_t *data;
    size_t row_bytes; /* plain: bytes per row; q: code bytes per row */
    const uint16_t *scales, *biases;
    float *y;
    size_t ldy;
    int add; /* y += W x */
    int task0, rows_per_task;
} mm_mat;

typedef struct mm_job {
    mm_mat mats[CPU_MM_MAX_PARTS];
    int n_mats, mode, simd;
    mm_in in;
    float *tmp; /* MM_SWIGLU: the up outputs */
    size_t ldt;
} mm_job;

/* y[i][r] (+)= row r . input i for rows [r0, r1) of one matrix */
static void mm_rows(const mm_job *j, const mm_mat *mt, int r0, int r1, float *y, size_t ldy, int add) {
    const mm_in *in = &j->in;
    int m = in->m;
    if (mt->bits && in->act != CPU_ACT_F32) {
        cpu_act_rows(mt->bits, mt->data, mt->row_bytes, mt->scales, mt->biases, r0, r1, in, y, ldy, add, j->simd);
        return;
    }
    if (mt->bits) {
        int gs = in->groups;
        const float *x = mt->bits == 4 ? in->xp : in->x;
        size_t ldx = mt->bits == 4 ? (size_t)in->cols : in->ldx;
#if HAVE_X86
        if (j->simd && m > 1) {
            for (int r = r0; r < r1; r += OB) {
                int nr = r1 - r < OB ? r1 - r : OB;
                for (int i = 0; i < m; i += MB)
                    block_q_avx(mt->bits, mt->data + (size_t)r * mt->row_bytes, mt->row_bytes,
                                mt->scales + (size_t)r * gs, mt->biases + (size_t)r * gs, gs, nr, x + (size_t)i * ldx,
                                ldx, in->xs + (size_t)i * gs, (size_t)gs, m - i < MB ? m - i : MB,
                                y + (size_t)i * ldy + r, ldy, add);
            }
            return;
        }
#endif
        for (int r = r0; r < r1; r++) {
            const uint8_t *qr = mt->data + (size_t)r * mt->row_bytes;
            const uint16_t *sr = mt->scales + (size_t)r * gs, *br = mt->biases + (size_t)r * gs;
            for (int i = 0; i < m; i++) {
                const float *xi = x + (size_t)i * ldx, *xs = in->xs + (size_t)i * gs;
                float v;
#if HAVE_X86
                if (j->simd)
                    v = mt->bits == 4 ? dot_q4_avx(qr, sr, br, gs, xi, xs) : dot_q8_avx(qr, sr, br, gs, xi, xs);
                else
#endif
                    v = dot_q_scalar(mt->bits, qr, sr, br, gs, xi, xs);
                float *yo = y + (size_t)i * ldy + r;
                *yo = add ? *yo + v : v;
            }
        }
        return;
    }
    /* plain rows: for each input, every row of the (cache-sized) block */
    for (int i = 0; i < m; i++) {
        const float *xi = in->x + (size_t)i * in->ldx;
        float *yi = y + (size_t)i * ldy;
        for (int r = r0; r < r1; r++) {
            const uint8_t *row = mt->data + (size_t)r * mt->row_bytes;
            float v;
#if HAVE_X86
            if (j->simd)
                v = dot_plain_avx(mt->dtype, row, xi, in->cols);
            else
#endif
                v = dot_plain_scalar(mt->dtype, row, xi, in->cols);
            yi[r] = add ? yi[r] + v : v;
        }
    }
}

static void mm_task(void *ctx, size_t task, int worker) {
    (void)worker;
    const mm_job *j = ctx;
    int k = 0;
    while (k + 1 < j->n_mats && (int)task >= j->mats[k + 1].task0) k++;
    const mm_mat *mt = &j->mats[k];
    int r0 = ((int)task - mt->task0) * mt->rows_per_task;
    int r1 = r0 + mt->rows_per_task < mt->rows ? r0 + mt->rows_per_task : mt->rows;
    if (j->mode != MM_SWIGLU) {
        mm_rows(j, mt, r0, r1, mt->y, mt->ldy, mt->add);
        return;
    }
    /* gate rows into y, up rows into tmp, then y = silu(gate) * up */
    mm_rows(j, &j->mats[0], r0, r1, j->mats[0].y, j->mats[0].ldy, 0);
    mm_rows(j, &j->mats[1], r0, r1, j->tmp, j->ldt, 0);
    for (int i = 0; i < j->in.m; i++) {
        float *g = j->mats[0].y + (size_t)i * j->mats[0].ldy, *u = j->tmp + (size_t)i * j->ldt;
        cpu_silu_mul(g + r0, u + r0, r1 - r0, g + r0);
    }
}

/* Binds matrix w to a job slot; returns its weight bytes. */
static size_t bind_mat(mm_mat *mt, const splash_tensor *w, float *y, size_t ldy, int *cols) {
    int64_t rows64, cols64, count;
    splash_tensor_matrix_dims(w, &rows64, &cols64, &count);
    memset(mt, 0, sizeof *mt);
    mt->dtype = w->dtype;
    mt->rows = (int)rows64;
    *cols = (int)cols64;
    mt->data = w->data;
    mt->y = y;
    mt->ldy = ldy;
    if (w->dtype == SPLASH_Q4 || w->dtype == SPLASH_Q8) {
        splash_qlayout l = splash_matrix_layout(w->dtype, rows64, cols64);
        mt->bits = w->dtype == SPLASH_Q4 ? 4 : 8;
        mt->row_bytes = (size_t)cols64 * (size_t)mt->bits / 8;
        mt->scales = (const uint16_t *)(const void *)(w->data + l.scales_offset);
        mt->biases = (const uint16_t *)(const void *)(w->data + l.biases_offset);
        return (size_t)rows64 * (mt->row_bytes + (size_t)(cols64 / G) * 4);
    }
    mt->row_bytes = (size_t)cols64 * (w->dtype == SPLASH_F32 ? 4 : 2);
    return (size_t)rows64 * mt->row_bytes;
}

/* Prepares the inputs for the job's matrices and runs its tasks. */
static void mm_run(cpu_ctx *c, mm_job *j, size_t total_bytes, int m, const float *x, size_t ldx, int cols) {
    mm_in *in = &j->in;
    memset(in, 0, sizeof *in);
    in->m = m, in->x = x, in->ldx = ldx, in->cols = cols, in->groups = cols / G;
    in->act = c->act;
    j->simd = cpu_simd();
    int any_q = 0, any_q4 = 0, any_q8 = 0;
    for (int k = 0; k < j->n_mats; k++) {
        any_q |= j->mats[k].bits != 0;
        any_q4 |= j->mats[k].bits == 4;
        any_q8 |= j->mats[k].bits == 8;
    }
    if (any_q) {
        int gs = in->groups;
        for (int i = 0; i < m; i++) {
#if HAVE_X86
            if (j->simd)
                xsum_avx(x + (size_t)i * ldx, gs, c->xsum + (size_t)i * gs);
            else
#endif
                xsum_scalar(x + (size_t)i * ldx, gs, c->xsum + (size_t)i * gs);
        }
        in->xs = c->xsum;
        if (c->act == CPU_ACT_F32) {
            if (any_q4) {
                for (int i = 0; i < m; i++) {
#if HAVE_X86
                    if (j->simd)
                        q4_order_avx(x + (size_t)i * ldx, gs, c->xp + (size_t)i * cols);
                    else
#endif
                        q4_order_scalar(x + (size_t)i * ldx, gs, c->xp + (size_t)i * cols);
                }
                in->xp = c->xp;
            }
        } else {
            in->xq_stride = (size_t)cols * (c->act == CPU_ACT_I8 ? 1 : 2);
            cpu_act_prepare(c->act, m, x, ldx, c->xsum, gs, any_q4 ? c->xq4 : NULL, any_q8 ? c->xq8 : NULL,
                            in->xq_stride, c->xd, j->simd);
            in->xq4 = c->xq4;
            in->xq8 = c->xq8;
            in->xd = c->xd;
            if (j->simd && m > 1 && c->xt) {
                cpu_act_transpose(m, gs, c->xd, c->xsum, c->xt);
                in->xt = c->xt;
            }
        }
    }
    /* Tasks: row blocks of about total / (8 threads) bytes, within [16 KB,
     * 128 KB] (a task's weights stay in L2 while every input passes over
     * them; enough tasks that a late worker costs little). */
    size_t want = total_bytes / (8 * (size_t)c->n_threads);
    if (want < 16384) want = 16384;
    if (want > 131072) want = 131072;
    int n_tasks = 0;
    int n_list = j->mode == MM_SWIGLU ? 1 : j->n_mats;
    for (int k = 0; k < n_list; k++) {
        mm_mat *mt = &j->mats[k];
        size_t rb = mt->bits ? mt->row_bytes + (size_t)in->groups * 4 : mt->row_bytes;
        if (j->mode == MM_SWIGLU) rb *= 2;
        int rpt = (int)(want / (rb ? rb : 1));
        if (rpt < 1) rpt = 1;
        if (rpt > OB) rpt = (rpt + OB - 1) / OB * OB;
        mt->rows_per_task = rpt;
        mt->task0 = n_tasks;
        n_tasks += (mt->rows + rpt - 1) / rpt;
    }
    j->n_mats = n_list;
    cpu_parallel(c, (size_t)n_tasks, mm_task, j);
}

static int64_t input_width(const splash_tensor *w) {
    int64_t rows, cols, count;
    splash_tensor_matrix_dims(w, &rows, &cols, &count);
    return cols;
}

void cpu_matmul_parts(cpu_ctx *c, const cpu_mm_part *parts, int n, int m, const float *x, size_t ldx) {
    if (m <= 0 || n <= 0) return;
    /* one run for up to CPU_MM_MAX_PARTS matrices of the same input width */
    int k = 1;
    while (k < n && k < CPU_MM_MAX_PARTS && input_width(parts[k].w) == input_width(parts[0].w)) k++;
    mm_job j;
    memset(&j, 0, sizeof j);
    size_t total = 0;
    int cols = 0;
    for (int i = 0; i < k; i++) {
        total += bind_mat(&j.mats[i], parts[i].w, parts[i].y, parts[i].ldy, &cols);
        j.mats[i].add = parts[i].add;
    }
    j.n_mats = k;
    j.mode = MM_PARTS;
    mm_run(c, &j, total, m, x, ldx, cols);
    if (k < n) cpu_matmul_parts(c, parts + k, n - k, m, x, ldx);
}

void cpu_matmul(cpu_ctx *c, const splash_tensor *w, int m, const float *x, size_t ldx, float *y, size_t ldy) {
    cpu_mm_part p = {w, y, ldy, 0};
    cpu_matmul_parts(c, &p, 1, m, x, ldx);
}

void cpu_matmul_add(cpu_ctx *c, const splash_tensor *w, int m, const float *x, size_t ldx, float *y, size_t ldy) {
    cpu_mm_part p = {w, y, ldy, 1};
    cpu_matmul_parts(c, &p, 1, m, x, ldx);
}

void cpu_matmul_swiglu(cpu_ctx *c, const splash_tensor *gate, const splash_tensor *up, int m, const float *x,
                       size_t ldx, float *h, size_t ldh, float *tmp, size_t ldt) {
    if (m <= 0) return;
    int64_t gr, gc, gn, ur, uc, un;
    splash_tensor_matrix_dims(gate, &gr, &gc, &gn);
    splash_tensor_matrix_dims(up, &ur, &uc, &un);
    if (gr != ur || gc != uc) { /* not a pair: the same arithmetic, unfused */
        cpu_matmul(c, gate, m, x, ldx, h, ldh);
        cpu_matmul(c, up, m, x, ldx, tmp, ldt);
        for (int i = 0; i < m; i++) cpu_silu_mul(h + (size_t)i * ldh, tmp + (size_t)i * ldt, (int)gr, h + (size_t)i * ldh);
        return;
    }
    mm_job j;
    memset(&j, 0, sizeof j);
    int cols;
    size_t total = bind_mat(&j.mats[0], gate, h, ldh, &cols);
    total += bind_mat(&j.mats[1], up, tmp, ldt, &cols);
    j.n_mats = 2;
    j.mode = MM_SWIGLU;
    j.tmp = tmp;
    j.ldt = ldt;
    mm_run(c, &j, total, m, x, ldx, cols);
}

void cpu_dequant_row(const splash_tensor *w, int64_t r, float *out) { splash_tensor_row_f32(w, r, out); }

#if HAVE_X86
/* Four dots of a with rows B_0..B_3 (len a multiple of 32): per row the
 * lanes of dot_plain_avx ((a0 + a1) + (a2 + a3)), then the four hsum8s
 * together in 128-bit halves, each performing hsum8's additions. */
AVX static __m128 dots4_avx(const float *a, const float *B, size_t ldb, int len) {
    __m128 u[2];
    for (int p = 0; p < 2; p++) {
        const float *ka = B + (size_t)(2 * p) * ldb, *kb = ka + ldb;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (int c = 0; c < len; c += 32) {
            __m256 q0 = _mm256_loadu_ps(a + c), q1 = _mm256_loadu_ps(a + c + 8), q2 = _mm256_loadu_ps(a + c + 16),
                   q3 = _mm256_loadu_ps(a + c + 24);
            a0 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(ka + c), a0);
            b0 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(kb + c), b0);
            a1 = _mm256_fmadd_ps(q1, _mm256_loadu_ps(ka + c + 8), a1);
            b1 = _mm256_fmadd_ps(q1, _mm256_loadu_ps(kb + c + 8), b1);
            a2 = _mm256_fmadd_ps(q2, _mm256_loadu_ps(ka + c + 16), a2);
            b2 = _mm256_fmadd_ps(q2, _mm256_loadu_ps(kb + c + 16), b2);
            a3 = _mm256_fmadd_ps(q3, _mm256_loadu_ps(ka + c + 24), a3);
            b3 = _mm256_fmadd_ps(q3, _mm256_loadu_ps(kb + c + 24), b3);
        }
        __m256 va = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
        __m256 vb = _mm256_add_ps(_mm256_add_ps(b0, b1), _mm256_add_ps(b2, b3));
        __m128 ta = _mm_add_ps(_mm256_castps256_ps128(va), _mm256_extractf128_ps(va, 1)); /* l + l+4 */
        __m128 tb = _mm_add_ps(_mm256_castps256_ps128(vb), _mm256_extractf128_ps(vb, 1));
        u[p] = _mm_add_ps(_mm_shuffle_ps(ta, tb, 0x44), _mm_shuffle_ps(ta, tb, 0xEE)); /* (0+2), (1+3) of each */
    }
    return _mm_add_ps(_mm_shuffle_ps(u[0], u[1], 0x88), _mm_shuffle_ps(u[0], u[1], 0xDD));
}
#endif

void cpu_dot_rows(const float *a, const float *B, size_t ldb, int n, int len, float *out) {
    int k = 0;
#if HAVE_X86
    if (cpu_simd() && len % 32 == 0)
        for (; k + 4 <= n; k += 4) _mm_storeu_ps(out + k, dots4_avx(a, B + (size_t)k * ldb, ldb, len));
#endif
    for (; k < n; k++) out[k] = cpu_dot(a, B + (size_t)k * ldb, len);
}

float cpu_dot(const float *a, const float *b, int n) {
#if HAVE_X86
    if (cpu_simd()) return dot_plain_avx(SPLASH_F32, (const uint8_t *)a, b, n);
#endif
    return dot_plain_scalar(SPLASH_F32, (const uint8_t *)a, b, n);
}
