/* matmul_act.c - q4/q8 products on quantised activations: the fast path.
 *
 * On a core whose 256-bit FP throughput is the limit (Zen 1 splits every
 * 256-bit operation in two), converting every 4-bit code to float costs more
 * than reading it from memory.  Here each input row is quantised once per
 * call, per group of 64, to int8 (Q = 127) or int16 (Q = 32767) with one
 * scale d = amax/Q, and a group's dot product is integer: for q4 x int8, two
 * AVX2 maddubs (u8 codes x s8 activations -> s16 pairs), one madd against
 * ones (-> 8 int32 lanes), exact; then one int->float conversion and one fma
 * by s_g * d_g per 8 lanes.  The bias term uses the exact fp32 group sums, as
 * the fp32 path does.
 *
 * Mean-code compensation: with e_c = x_c - d xq_c the rounding error, the
 * product is s sum q_c x_c = s d sum q_c xq_c + s sum q_c e_c.  The codes of
 * an affine group sit around the middle of their range, qbar = 7.5 (q4) or
 * 127.5 (q8), so sum q_c e_c ~ qbar sum e_c = qbar (xsum - d sum xq), which
 * costs one fma per group on numbers known per input group (c_g = xsum_g -
 * d_g sum xq, computed when quantising).  What is left is s sum (q_c - qbar)
 * e_c: |error| <= sum_c |s_g (q_c - qbar)| d_g / 2 (half the uncompensated
 * bound, and in practice 2-3x less error on weights quantised from a
 * bell-shaped distribution), plus fp32 rounding: the bound
 * tests/unit/test_cpu_kernels.c checks.
 *
 * Order of the sums (identical in the scalar path, so both give the same
 * bits, and independent of the number of rows, so results are
 * batch-invariant): per group g, 8 lanes of exact integer sums I_g[l];
 * acc_(g mod 2)[l] = fma(s_g * d_g, I_g[l], acc_(g mod 2)[l]); bias lanes
 * bl[g mod 8] = fma(b_g, xsum_g, bl[g mod 8]), then bl[g mod 8] = fma(s_g,
 * qbar * c_g, bl[g mod 8]); y = hsum8(acc_0 + acc_1) + hsum8(bl) (reduce.h:
 * finish_q).
 *
 * Layout of the quantised row (positions p of a group, element e(p)) follows
 * the instructions that read it, so codes need no reordering:
 *   int8  q4: p < 32: e = 2p (low nibbles), else e = 2(p-32)+1 (high nibbles);
 *             int32 lane of p = (p % 32) / 4           (maddubs then madd)
 *   int16 q4: four blocks of 16 in unpacklo/unpackhi order of the low, then
 *             high nibbles; lane of p = (p % 16) / 2   (madd)
 *   q8 (both): e = p; lane of p = (p % 16) / 2
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/reduce.h"

#define G SPLASH_QGROUP
#define NI 4 /* inputs per block kernel call (cpu_act_transpose's layout) */
#define PF_DIST 4096 /* bytes of codes prefetched ahead (decode streams rows from DRAM) */
#define QBAR4 7.5f   /* the middle of the code range: mean-code compensation */
#define QBAR8 127.5f

static int elem_of(int act, int bits, int p) {
    if (bits == 8) return p;
    if (act == CPU_ACT_I8) return p < 32 ? 2 * p : 2 * (p - 32) + 1;
    int k = p / 16, t = p % 16;
    int j = k % 2 == 0 ? (t < 8 ? t : 8 + t) : (t < 8 ? 8 + t : 16 + t);
    return 2 * j + (k >= 2);
}

static int lane_of(int act, int bits, int p) { return act == CPU_ACT_I8 && bits == 4 ? (p % 32) / 4 : (p % 16) / 2; }

/* ---- quantising the inputs ---------------------------------------------------- */

/* round to nearest even (as cvtps2dq), clamp to [-Q, Q]; NaN -> -Q (as the
 * vector path, whose conversion gives INT_MIN) */
static inline float quant1(float v, float Q) {
    const float magic = 12582912.0f; /* 1.5 * 2^23 */
    if (fabsf(v) < 4194304.0f) v = (v + magic) - magic;
    v = v > Q ? Q : v;
    return v >= -Q ? v : -Q;
}

/* One group in column order; returns the scale, *sum = the sum of the
 * quantised values. */
static float quant_group_scalar(int act, const float *xg, void *out, int32_t *sum) {
    float Q = act == CPU_ACT_I8 ? 127.0f : 32767.0f;
    float amax = 0.0f;
    for (int j = 0; j < G; j++) amax = fabsf(xg[j]) > amax ? fabsf(xg[j]) : amax;
    float id = amax > 0.0f ? Q / amax : 0.0f;
    int32_t t = 0;
    for (int j = 0; j < G; j++) {
        float v = quant1(xg[j] * id, Q);
        t += (int32_t)v;
        if (act == CPU_ACT_I8)
            ((int8_t *)out)[j] = (int8_t)v;
        else
            ((int16_t *)out)[j] = (int16_t)v;
    }
    *sum = t;
    return amax / Q;
}

#if defined(__x86_64__) || defined(__i386__)
#define HAVE_X86 1
#define LOADU(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define LOAD128(p) _mm_loadu_si128((const __m128i *)(const void *)(p))

/* One group to int8 in column order; returns the scale and *sum.  Same
 * rounding and clamping as quant_group_scalar. */
AVX static float quant_group_i8_avx(const float *xg, int8_t *out, int32_t *sum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[8], m = _mm256_setzero_ps();
    for (int k = 0; k < 8; k++) {
        v[k] = _mm256_loadu_ps(xg + 8 * k);
        m = _mm256_max_ps(_mm256_andnot_ps(sign, v[k]), m); /* a NaN |v| yields m: ignored, as in the scalar loop */
    }
    __m128 t = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    t = _mm_max_ps(t, _mm_movehl_ps(t, t));
    t = _mm_max_ss(t, _mm_movehdup_ps(t));
    float amax = _mm_cvtss_f32(t);
    float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256i tot = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        __m256i q[4];
        for (int k = 0; k < 4; k++) {
            __m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(v[4 * h + k], vid));
            q[k] = _mm256_max_epi32(_mm256_min_epi32(r, hi), lo);
            tot = _mm256_add_epi32(tot, q[k]);
        }
        __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(void *)(out + 32 * h), _mm256_permutevar8x32_epi32(w, order));
    }
    int32_t part[8];
    _mm256_storeu_si256((__m256i *)(void *)part, tot);
    *sum = part[0] + part[1] + part[2] + part[3] + part[4] + part[5] + part[6] + part[7];
    return amax / 127.0f;
}

/* Column order -> the int8 q4 order (evens, then odds) of one group. */
AVX static void evens_odds_i8_avx(const int8_t *in, int8_t *out) {
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12,
                                           14, 1, 3, 5, 7, 9, 11, 13, 15);
    __m256i a = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(LOADU(in), split), 0xD8);      /* E0 E1 O0 O1 */
    __m256i b = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(LOADU(in + 32), split), 0xD8); /* E2 E3 O2 O3 */
    _mm256_storeu_si256((__m256i *)(void *)out, _mm256_permute2x128_si256(a, b, 0x20));
    _mm256_storeu_si256((__m256i *)(void *)(out + 32), _mm256_permute2x128_si256(a, b, 0x31));
}
#else
#define HAVE_X86 0
#endif

void cpu_act_prepare(int act, int m, const float *x, size_t ldx, const float *xs, int groups, void *xq4, void *xq8,
                     size_t xq_stride, float *xd, int simd) {
    size_t es = act == CPU_ACT_I8 ? 1 : 2;
    int pos_elem[G];
    for (int p = 0; p < G; p++) pos_elem[p] = elem_of(act, 4, p);
    for (int i = 0; i < m; i++)
        for (int g = 0; g < groups; g++) {
            const float *xg = x + (size_t)i * ldx + (size_t)g * G;
            size_t off = (size_t)i * xq_stride + (size_t)g * G * es;
            uint8_t nat[G * 2];
            uint8_t *dst8 = xq8 ? (uint8_t *)xq8 + off : nat;
            float *d = xd + (size_t)i * 2 * groups + g;
            int32_t sum;
#if HAVE_X86
            if (simd && act == CPU_ACT_I8) {
                d[0] = quant_group_i8_avx(xg, (int8_t *)dst8, &sum);
                d[groups] = fmaf(-d[0], (float)sum, xs[(size_t)i * groups + g]);
                if (xq4) evens_odds_i8_avx((const int8_t *)dst8, (int8_t *)((uint8_t *)xq4 + off));
                continue;
            }
#endif
            d[0] = quant_group_scalar(act, xg, dst8, &sum);
            d[groups] = fmaf(-d[0], (float)sum, xs[(size_t)i * groups + g]);
            if (!xq4) continue;
            uint8_t *dst4 = (uint8_t *)xq4 + off;
            for (int p = 0; p < G; p++) memcpy(dst4 + p * es, dst8 + (size_t)pos_elem[p] * es, es);
        }
}

/* ---- scalar dot products -------------------------------------------------------- */

static float dot_scalar(int act, int bits, const uint8_t *qrow, const uint16_t *sc, const uint16_t *bi, int groups,
                        const void *xq, const float *xd, const float *xs) {
    float acc[2][8] = {{0}}, bl[8] = {0};
    for (int g = 0; g < groups; g++) {
        int32_t I[8] = {0};
        for (int p = 0; p < G; p++) {
            int e = elem_of(act, bits, p);
            int32_t q = bits == 8 ? qrow[(size_t)g * G + e] : (qrow[(size_t)g * (G / 2) + e / 2] >> (4 * (e & 1))) & 15;
            int32_t xv = act == CPU_ACT_I8 ? ((const int8_t *)xq)[(size_t)g * G + p] : ((const int16_t *)xq)[(size_t)g * G + p];
            I[lane_of(act, bits, p)] += q * xv;
        }
        float s = splash_bf16_to_f32(sc[g]), sd = s * xd[g];
        for (int l = 0; l < 8; l++) acc[g & 1][l] = fmaf(sd, (float)I[l], acc[g & 1][l]);
        bl[g & 7] = fmaf(splash_bf16_to_f32(bi[g]), xs[g], bl[g & 7]);
        bl[g & 7] = fmaf(s, (bits == 4 ? QBAR4 : QBAR8) * xd[groups + g], bl[g & 7]);
    }
    return finish_q(acc[0], acc[1], bl);
}

/* ---- AVX2 dot products ------------------------------------------------------------ */

#if HAVE_X86

/* The integer sums of one group: 8 int32 lanes. */
AVX static inline __m256i grp_i8_q4(const uint8_t *q, const int8_t *x) {
    const __m256i mask = _mm256_set1_epi8(15);
    __m256i b = LOADU(q);
    __m256i lo = _mm256_and_si256(b, mask), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), mask);
    __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, LOADU(x)), _mm256_maddubs_epi16(hi, LOADU(x + 32)));
    return _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
}

AVX static inline __m256i grp_i16_q4(const uint8_t *q, const int16_t *x) {
    const __m256i mask = _mm256_set1_epi8(15), z = _mm256_setzero_si256();
    __m256i b = LOADU(q);
    __m256i lo = _mm256_and_si256(b, mask), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), mask);
    __m256i I = _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, z), LOADU(x));
    I = _mm256_add_epi32(I, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, z), LOADU(x + 16)));
    I = _mm256_add_epi32(I, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, z), LOADU(x + 32)));
    return _mm256_add_epi32(I, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, z), LOADU(x + 48)));
}

AVX static inline __m256i grp_i8_q8(const uint8_t *q, const int8_t *x) {
    __m256i I = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        I = _mm256_add_epi32(I, _mm256_madd_epi16(_mm256_cvtepu8_epi16(LOAD128(q + 16 * k)),
                                                  _mm256_cvtepi8_epi16(LOAD128(x + 16 * k))));
    return I;
}

AVX static inline __m256i grp_i16_q8(const uint8_t *q, const int16_t *x) {
    __m256i I = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        I = _mm256_add_epi32(I, _mm256_madd_epi16(_mm256_cvtepu8_epi16(LOAD128(q + 16 * k)), LOADU(x + 16 * k)));
    return I;
}

/* One row . one input: blocks of 8 groups (their scales s*d and bias terms
 * vectorised), then the remaining groups one by one into the same lanes.
 * QB: code bytes per group; XT: activation type. */
#define DEFINE_ROW(name, GRP, QB, XT, QBAR)                                                                            \
    AVX static float name(const uint8_t *qrow, const uint16_t *sc, const uint16_t *bi, int groups, const XT *xq,       \
                          const float *xd, const float *xs) {                                                          \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, bl = a0;                                                             \
        float S[8] __attribute__((aligned(32)));                                                                       \
        const float *xc = xd + groups;                                                                                 \
        int g = 0;                                                                                                     \
        for (; g + 8 <= groups; g += 8) {                                                                              \
            __m256 s8 = bf16x8_avx(sc + g);                                                                            \
            _mm256_store_ps(S, _mm256_mul_ps(s8, _mm256_loadu_ps(xd + g)));                                            \
            bl = _mm256_fmadd_ps(bf16x8_avx(bi + g), _mm256_loadu_ps(xs + g), bl);                                     \
            bl = _mm256_fmadd_ps(s8, _mm256_mul_ps(_mm256_set1_ps(QBAR), _mm256_loadu_ps(xc + g)), bl);                \
            const uint8_t *q = qrow + (size_t)g * QB;                                                                  \
            const XT *x = xq + (size_t)g * G;                                                                          \
            for (int pf = 0; pf < 8 * QB; pf += 64) _mm_prefetch((const char *)(q + PF_DIST + pf), _MM_HINT_T0);       \
            _Pragma("GCC unroll 4") for (int k = 0; k < 8; k += 2) {                                                   \
                __m256i I0 = GRP(q + (size_t)k * QB, x + (size_t)k * G);                                               \
                __m256i I1 = GRP(q + (size_t)(k + 1) * QB, x + (size_t)(k + 1) * G);                                   \
                a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(S + k), _mm256_cvtepi32_ps(I0), a0);                          \
                a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(S + k + 1), _mm256_cvtepi32_ps(I1), a1);                      \
            }                                                                                                          \
        }                                                                                                              \
        if (g == groups) return hsum8_avx(_mm256_add_ps(a0, a1)) + hsum8_avx(bl);                                      \
        float blv[8];                                                                                                  \
        _mm256_storeu_ps(blv, bl);                                                                                     \
        for (; g < groups; g++) {                                                                                      \
            __m256 I = _mm256_cvtepi32_ps(GRP(qrow + (size_t)g * QB, xq + (size_t)g * G));                             \
            float sg = splash_bf16_to_f32(sc[g]);                                                                      \
            __m256 s = _mm256_set1_ps(sg * xd[g]);                                                                     \
            if (g & 1)                                                                                                 \
                a1 = _mm256_fmadd_ps(s, I, a1);                                                                        \
            else                                                                                                       \
                a0 = _mm256_fmadd_ps(s, I, a0);                                                                        \
            blv[g & 7] = fmaf(splash_bf16_to_f32(bi[g]), xs[g], blv[g & 7]);                                           \
            blv[g & 7] = fmaf(sg, QBAR * xc[g], blv[g & 7]);                                                           \
        }                                                                                                              \
        return hsum8_avx(_mm256_add_ps(a0, a1)) + hsum8(blv);                                                          \
    }

DEFINE_ROW(row_i8_q4, grp_i8_q4, 32, int8_t, QBAR4)
DEFINE_ROW(row_i16_q4, grp_i16_q4, 32, int16_t, QBAR4)
DEFINE_ROW(row_i8_q8, grp_i8_q8, 64, int8_t, QBAR8)
DEFINE_ROW(row_i16_q8, grp_i16_q8, 64, int16_t, QBAR8)

/* ---- blocks of inputs (verify, prefill) ------------------------------------------
 * Unpacking a group's codes (q4: the low and high nibble vectors; q8: codes
 * widened to 16 bits) and the integer dot against one input. */

AVX static inline void unp_q4_i8(const uint8_t *q, __m256i u[4]) {
    const __m256i mask = _mm256_set1_epi8(15);
    __m256i b = LOADU(q);
    u[0] = _mm256_and_si256(b, mask);
    u[1] = _mm256_and_si256(_mm256_srli_epi16(b, 4), mask);
}
AVX static inline __m256i dot_q4_i8(const __m256i u[4], const int8_t *x) {
    __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(u[0], LOADU(x)), _mm256_maddubs_epi16(u[1], LOADU(x + 32)));
    return _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
}
AVX static inline void unp_q4_i16(const uint8_t *q, __m256i u[4]) {
    const __m256i mask = _mm256_set1_epi8(15), z = _mm256_setzero_si256();
    __m256i b = LOADU(q);
    __m256i lo = _mm256_and_si256(b, mask), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), mask);
    u[0] = _mm256_unpacklo_epi8(lo, z), u[1] = _mm256_unpackhi_epi8(lo, z);
    u[2] = _mm256_unpacklo_epi8(hi, z), u[3] = _mm256_unpackhi_epi8(hi, z);
}
AVX static inline __m256i dot_q4_i16(const __m256i u[4], const int16_t *x) {
    __m256i I = _mm256_madd_epi16(u[0], LOADU(x));
    I = _mm256_add_epi32(I, _mm256_madd_epi16(u[1], LOADU(x + 16)));
    I = _mm256_add_epi32(I, _mm256_madd_epi16(u[2], LOADU(x + 32)));
    return _mm256_add_epi32(I, _mm256_madd_epi16(u[3], LOADU(x + 48)));
}
AVX static inline void unp_q8(const uint8_t *q, __m256i u[4]) {
    for (int k = 0; k < 4; k++) u[k] = _mm256_cvtepu8_epi16(LOAD128(q + 16 * k));
}
AVX static inline __m256i dot_q8_i8(const __m256i u[4], const int8_t *x) {
    __m256i I = _mm256_setzero_si256();
    for (int k = 0; k < 4; k++) I = _mm256_add_epi32(I, _mm256_madd_epi16(u[k], _mm256_cvtepi8_epi16(LOAD128(x + 16 * k))));
    return I;
}
AVX static inline __m256i dot_q8_i16(const __m256i u[4], const int16_t *x) {
    __m256i I = _mm256_setzero_si256();
    for (int k = 0; k < 4; k++) I = _mm256_add_epi32(I, _mm256_madd_epi16(u[k], LOADU(x + 16 * k)));
    return I;
}

/* One weight row x NI inputs (prefill, verify).  The row's codes are
 * unpacked once per group and dotted with each input (integer lanes, then
 * acc_(g mod 2) in registers); the scalar parts run across the inputs in
 * 128-bit vectors: the group scales s_g * d_g, the bias lanes bl[g mod 8] and
 * both 8 -> 1 sums, from the inputs' d_g, group sums and compensation sums
 * laid out group by group for the block (cpu_act_transpose).  Per (row,
 * input) these are the operations of the row kernels above in the same order,
 * so a row's result does not depend on the block.  ni <= NI inputs (xq rows
 * xq_stride bytes apart); xt: the block's [gs][3][NI] (d, xsum, c);
 * y[i * ldy] (+)= the dot (NI: defined with cpu_act_transpose below). */

/* hsum8 of NI lane vectors at once: [hsum8(v[0]), ..., hsum8(v[3])] */
AVX static inline __m128 hsum8x4_avx(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
    __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(v0), _mm256_extractf128_ps(v0, 1)); /* l + l+4 */
    __m128 t1 = _mm_add_ps(_mm256_castps256_ps128(v1), _mm256_extractf128_ps(v1, 1));
    __m128 t2 = _mm_add_ps(_mm256_castps256_ps128(v2), _mm256_extractf128_ps(v2, 1));
    __m128 t3 = _mm_add_ps(_mm256_castps256_ps128(v3), _mm256_extractf128_ps(v3, 1));
    __m128 u01 = _mm_add_ps(_mm_shuffle_ps(t0, t1, 0x44), _mm_shuffle_ps(t0, t1, 0xEE)); /* (0+2), (1+3) of v0, v1 */
    __m128 u23 = _mm_add_ps(_mm_shuffle_ps(t2, t3, 0x44), _mm_shuffle_ps(t2, t3, 0xEE));
    return _mm_add_ps(_mm_shuffle_ps(u01, u23, 0x88), _mm_shuffle_ps(u01, u23, 0xDD));
}

/* The bias lanes of one row and NI inputs: bl[g mod 8] = fma(b_g, xsum_g,
 * bl); then fma(s_g, QBAR * c_g, bl), groups in order; returns hsum8 of the
 * lanes for each input.  xt: the block's [gs][3][NI]. */
#define BIAS_LANE(k)                                                                                                   \
    {                                                                                                                  \
        const float *t = xt + (size_t)(g + (k)) * 3 * NI;                                                              \
        __m128 l = _mm_fmadd_ps(_mm_set1_ps(splash_bf16_to_f32(bi[g + (k)])), _mm_load_ps(t + NI), b##k);            \
        b##k = _mm_fmadd_ps(_mm_set1_ps(splash_bf16_to_f32(sc[g + (k)])), _mm_mul_ps(qbar, _mm_load_ps(t + 2 * NI)), l); \
    }
AVX static inline __m128 bias_lanes_avx(const uint16_t *sc, const uint16_t *bi, int gs, const float *xt, float QBAR) {
    const __m128 qbar = _mm_set1_ps(QBAR);
    __m128 b0 = _mm_setzero_ps(), b1 = b0, b2 = b0, b3 = b0, b4 = b0, b5 = b0, b6 = b0, b7 = b0;
    int g = 0;
    for (; g + 8 <= gs; g += 8) {
        BIAS_LANE(0) BIAS_LANE(1) BIAS_LANE(2) BIAS_LANE(3) BIAS_LANE(4) BIAS_LANE(5) BIAS_LANE(6) BIAS_LANE(7)
    }
    int rem = gs - g;
    if (rem > 0) BIAS_LANE(0)
    if (rem > 1) BIAS_LANE(1)
    if (rem > 2) BIAS_LANE(2)
    if (rem > 3) BIAS_LANE(3)
    if (rem > 4) BIAS_LANE(4)
    if (rem > 5) BIAS_LANE(5)
    if (rem > 6) BIAS_LANE(6)
    return _mm_add_ps(_mm_add_ps(_mm_add_ps(b0, b4), _mm_add_ps(b2, b6)), _mm_add_ps(_mm_add_ps(b1, b5), _mm_add_ps(b3, b7)));
}
#undef BIAS_LANE

/* acc_(g mod 2) of NI inputs for group g: codes unpacked once, integer dot
 * per input, then acc = fma(s_g * d_g, I, acc). */
#define GROUP_STEP(UNP, DOT, QB, a0, a1, a2, a3)                                                                       \
    {                                                                                                                  \
        float S[NI] __attribute__((aligned(16)));                                                                      \
        _mm_store_ps(S, _mm_mul_ps(_mm_set1_ps(splash_bf16_to_f32(sc[g])), _mm_load_ps(xt + (size_t)g * 3 * NI)));     \
        __m256i u[4];                                                                                                  \
        UNP(q + (size_t)g * QB, u);                                                                                    \
        size_t o = (size_t)g * G;                                                                                      \
        a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(S), _mm256_cvtepi32_ps(DOT(u, x0 + o)), a0);                          \
        a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(S + 1), _mm256_cvtepi32_ps(DOT(u, x1 + o)), a1);                      \
        a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(S + 2), _mm256_cvtepi32_ps(DOT(u, x2 + o)), a2);                      \
        a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(S + 3), _mm256_cvtepi32_ps(DOT(u, x3 + o)), a3);                      \
    }

#define DEFINE_BLOCK(name, UNP, DOT, QB, XT, QBAR)                                                                     \
    AVX static void name(const uint8_t *q, const uint16_t *sc, const uint16_t *bi, int gs, const uint8_t *xq,           \
                         size_t xq_stride, const float *xt, int ni, float *y, size_t ldy, int add) {                   \
        __m128 hb = bias_lanes_avx(sc, bi, gs, xt, QBAR);                                                              \
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;                                             \
        __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;                                                             \
        const XT *x0 = (const XT *)(const void *)xq;                                                                   \
        const XT *x1 = (const XT *)(const void *)(xq + (ni > 1 ? 1 : 0) * xq_stride);                                \
        const XT *x2 = (const XT *)(const void *)(xq + (ni > 2 ? 2 : 0) * xq_stride);                                \
        const XT *x3 = (const XT *)(const void *)(xq + (ni > 3 ? 3 : 0) * xq_stride);                                \
        int g = 0;                                                                                                     \
        for (; g + 2 <= gs; g += 2) {                                                                                  \
            GROUP_STEP(UNP, DOT, QB, a00, a01, a02, a03)                                                               \
            g++;                                                                                                       \
            GROUP_STEP(UNP, DOT, QB, a10, a11, a12, a13)                                                               \
            g--;                                                                                                       \
        }                                                                                                              \
        if (g < gs) GROUP_STEP(UNP, DOT, QB, a00, a01, a02, a03)                                                       \
        __m128 v = hsum8x4_avx(_mm256_add_ps(a00, a10), _mm256_add_ps(a01, a11), _mm256_add_ps(a02, a12),              \
                               _mm256_add_ps(a03, a13));                                                               \
        float r[NI];                                                                                                   \
        _mm_storeu_ps(r, _mm_add_ps(v, hb));                                                                           \
        for (int i = 0; i < ni; i++) {                                                                                 \
            float *yo = y + (size_t)i * ldy;                                                                           \
            *yo = add ? *yo + r[i] : r[i];                                                                             \
        }                                                                                                              \
    }

DEFINE_BLOCK(block_q4_i8, unp_q4_i8, dot_q4_i8, 32, int8_t, QBAR4)
DEFINE_BLOCK(block_q4_i16, unp_q4_i16, dot_q4_i16, 32, int16_t, QBAR4)
DEFINE_BLOCK(block_q8_i8, unp_q8, dot_q8_i8, 64, int8_t, QBAR8)
DEFINE_BLOCK(block_q8_i16, unp_q8, dot_q8_i16, 64, int16_t, QBAR8)
#undef GROUP_STEP
#undef DEFINE_BLOCK
#endif

size_t cpu_act_transpose_floats(int m, int groups) { return (size_t)((m + NI - 1) / NI) * (size_t)groups * 3 * NI; }

void cpu_act_transpose(int m, int groups, const float *xd, const float *xs, float *xt) {
    for (int i0 = 0; i0 < m; i0 += NI)
        for (int g = 0; g < groups; g++) {
            float *t = xt + ((size_t)(i0 / NI) * groups + g) * 3 * NI;
            for (int k = 0; k < NI; k++) {
                int i = i0 + k < m ? i0 + k : m - 1; /* a short block repeats its last input */
                t[k] = xd[(size_t)i * 2 * groups + g];
                t[NI + k] = xs[(size_t)i * groups + g];
                t[2 * NI + k] = xd[(size_t)i * 2 * groups + groups + g];
            }
        }
}

static float act_dot(int act, int bits, int simd, const uint8_t *qrow, const uint16_t *sc, const uint16_t *bi,
                     int groups, const void *xq, const float *xd, const float *xs) {
#if HAVE_X86
    if (simd) {
        if (bits == 4)
            return act == CPU_ACT_I8 ? row_i8_q4(qrow, sc, bi, groups, xq, xd, xs)
                                     : row_i16_q4(qrow, sc, bi, groups, xq, xd, xs);
        return act == CPU_ACT_I8 ? row_i8_q8(qrow, sc, bi, groups, xq, xd, xs)
                                 : row_i16_q8(qrow, sc, bi, groups, xq, xd, xs);
    }
#endif
    return dot_scalar(act, bits, qrow, sc, bi, groups, xq, xd, xs);
}

void cpu_act_rows(int bits, const uint8_t *q, size_t row_bytes, const uint16_t *sc, const uint16_t *bi, int r0,
                  int r1, const mm_in *in, float *y, size_t ldy, int add, int simd) {
    int gs = in->groups;
    const uint8_t *xq = bits == 4 ? in->xq4 : in->xq8;
#if HAVE_X86
    if (simd && in->m > 1 && in->xt) {
        int i8 = in->act == CPU_ACT_I8;
        for (int r = r0; r < r1; r++) {
            const uint8_t *qr = q + (size_t)r * row_bytes;
            const uint16_t *sr = sc + (size_t)r * gs, *br = bi + (size_t)r * gs;
            for (int i = 0; i < in->m; i += NI) {
                int ni = in->m - i < NI ? in->m - i : NI;
                const uint8_t *xi = xq + (size_t)i * in->xq_stride;
                const float *xt = in->xt + (size_t)(i / NI) * gs * 3 * NI;
                float *yo = y + (size_t)i * ldy + r;
                if (bits == 4 && i8)
                    block_q4_i8(qr, sr, br, gs, xi, in->xq_stride, xt, ni, yo, ldy, add);
                else if (bits == 4)
                    block_q4_i16(qr, sr, br, gs, xi, in->xq_stride, xt, ni, yo, ldy, add);
                else if (i8)
                    block_q8_i8(qr, sr, br, gs, xi, in->xq_stride, xt, ni, yo, ldy, add);
                else
                    block_q8_i16(qr, sr, br, gs, xi, in->xq_stride, xt, ni, yo, ldy, add);
            }
        }
        return;
    }
#endif
    /* row-major: a weight row stays in L1 while every input passes over it */
    for (int r = r0; r < r1; r++) {
        const uint8_t *qr = q + (size_t)r * row_bytes;
        const uint16_t *sr = sc + (size_t)r * gs, *br = bi + (size_t)r * gs;
        for (int i = 0; i < in->m; i++) {
            float v = act_dot(in->act, bits, simd, qr, sr, br, gs, xq + (size_t)i * in->xq_stride,
                              in->xd + (size_t)i * 2 * gs, in->xs + (size_t)i * gs);
            float *yo = y + (size_t)i * ldy + r;
            *yo = add ? *yo + v : v;
        }
    }
}
