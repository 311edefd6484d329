/* matmul_act.c - q4/q8 products on quantised activations: the fast path.
 *
 * On a core whose 256-bit FP throughput is the limit (Zen 1: two FP ops per 8
 * weights in the fp32 path), converting every code to float costs more than
 * reading it.  Here each input row is quantised once per call, per group of
 * 64, to int16 (Q = 32767: error <= amax/65534 per value) or int8 (Q = 127),
 * and a group's dot product is integer (AVX2 madd / maddubs, exact) followed
 * by one float conversion and one fma per 8 lanes.  The bias term uses the
 * exact fp32 group sums, as the fp32 path does.
 *
 * Layout of the quantised row (positions p of a group, element e(p)) follows
 * the instructions that read it, so codes need no reordering:
 *   int8  q4: p < 32: e = 2p (low nibbles), else e = 2(p-32)+1 (high nibbles);
 *             int32 lane of p = (p % 32) / 4           (maddubs then madd)
 *   int16 q4: four blocks of 16 in unpacklo/unpackhi order of the low, then
 *             high nibbles; lane of p = (p % 16) / 2   (madd)
 *   q8 (both): e = p; lane of p = (p % 16) / 2
 * The scalar path sums the same elements into the same lanes (integer sums
 * are exact), so both paths give the same bits.
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/reduce.h"

#define G SPLASH_QGROUP

static int elem_of(int act, int bits, int p) {
    if (bits == 8) return p;
    if (act == CPU_ACT_I8) return p < 32 ? 2 * p : 2 * (p - 32) + 1;
    int k = p / 16, t = p % 16;
    int j = k % 2 == 0 ? (t < 8 ? t : 8 + t) : (t < 8 ? 8 + t : 16 + t);
    return 2 * j + (k >= 2);
}

static int lane_of(int act, int bits, int p) { return act == CPU_ACT_I8 && bits == 4 ? (p % 32) / 4 : (p % 16) / 2; }

void cpu_act_quantize(int act, int bits, const float *x, int groups, void *xq, float *xd) {
    float Q = act == CPU_ACT_I8 ? 127.0f : 32767.0f;
    int pos_elem[G];
    for (int p = 0; p < G; p++) pos_elem[p] = elem_of(act, bits, p);
    for (int g = 0; g < groups; g++) {
        const float *xg = x + (size_t)g * G;
        float amax = 0.0f;
        for (int j = 0; j < G; j++) amax = fabsf(xg[j]) > amax ? fabsf(xg[j]) : amax;
        float id = amax > 0.0f ? Q / amax : 0.0f;
        xd[g] = amax / Q;
        for (int p = 0; p < G; p++) {
            float v = nearbyintf(xg[pos_elem[p]] * id);
            v = v > Q ? Q : v < -Q ? -Q : v;
            if (act == CPU_ACT_I8)
                ((int8_t *)xq)[(size_t)g * G + p] = (int8_t)v;
            else
                ((int16_t *)xq)[(size_t)g * G + p] = (int16_t)v;
        }
    }
}

static float dot_scalar(int act, int bits, const uint8_t *qrow, const uint16_t *sc, const uint16_t *bi, int groups,
                        const void *xq, const float *xd, const float *xs) {
    float acc[8] = {0}, bs = 0.0f;
    for (int g = 0; g < groups; g++) {
        int32_t I[8] = {0};
        for (int p = 0; p < G; p++) {
            int e = elem_of(act, bits, p);
            int32_t q = bits == 8 ? qrow[(size_t)g * G + e] : (qrow[(size_t)g * (G / 2) + e / 2] >> (4 * (e & 1))) & 15;
            int32_t xv = act == CPU_ACT_I8 ? ((const int8_t *)xq)[(size_t)g * G + p] : ((const int16_t *)xq)[(size_t)g * G + p];
            I[lane_of(act, bits, p)] += q * xv;
        }
        float sd = splash_bf16_to_f32(sc[g]) * xd[g];
        for (int l = 0; l < 8; l++) acc[l] = fmaf(sd, (float)I[l], acc[l]);
        bs = fmaf(splash_bf16_to_f32(bi[g]), xs[g], bs);
    }
    return hsum8(acc) + bs;
}

#if defined(__x86_64__) || defined(__i386__)
#define HAVE_X86 1

#define LOADU(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define LOAD128(p) _mm_loadu_si128((const __m128i *)(const void *)(p))

AVX static float dot_i8_q4(const uint8_t *qrow, const uint16_t *sc, const uint16_t *bi, int groups, const int8_t *xq,
                           const float *xd, const float *xs) {
    const __m256i mask = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    float bs = 0.0f;
    for (int g = 0; g < groups; g++) {
        __m256i b = LOADU(qrow + (size_t)g * 32);
        __m256i lo = _mm256_and_si256(b, mask), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), mask);
        const int8_t *x = xq + (size_t)g * G;
        __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, LOADU(x)), _mm256_maddubs_epi16(hi, LOADU(x + 32)));
        __m256 I = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(splash_bf16_to_f32(sc[g]) * xd[g]), I, acc);
        bs = fmaf(splash_bf16_to_f32(bi[g]), xs[g], bs);
    }
    return hsum8_avx(acc) + bs;
}

AVX static float dot_i16_q4(const uint8_t *qrow, const uint16_t *sc, const uint16_t *bi, int groups, const int16_t *xq,
                            const float *xd, const float *xs) {
    const __m256i mask = _mm256_set1_epi8(15), z = _mm256_setzero_si256();
    __m256 acc = _mm256_setzero_ps();
    float bs = 0.0f;
    for (int g = 0; g < groups; g++) {
        __m256i b = LOADU(qrow + (size_t)g * 32);
        __m256i lo = _mm256_and_si256(b, mask), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), mask);
        const int16_t *x = xq + (size_t)g * G;
        __m256i I = _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, z), LOADU(x));
        I = _mm256_add_epi32(I, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, z), LOADU(x + 16)));
        I = _mm256_add_epi32(I, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, z), LOADU(x + 32)));
        I = _mm256_add_epi32(I, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, z), LOADU(x + 48)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(splash_bf16_to_f32(sc[g]) * xd[g]), _mm256_cvtepi32_ps(I), acc);
        bs = fmaf(splash_bf16_to_f32(bi[g]), xs[g], bs);
    }
    return hsum8_avx(acc) + bs;
}

/* q8: codes widened to 16 bits; activations int8 (widened) or int16 */
AVX static float dot_q8(int act, const uint8_t *qrow, const uint16_t *sc, const uint16_t *bi, int groups, const void *xq,
                        const float *xd, const float *xs) {
    __m256 acc = _mm256_setzero_ps();
    float bs = 0.0f;
    for (int g = 0; g < groups; g++) {
        const uint8_t *p = qrow + (size_t)g * G;
        __m256i I = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            __m256i q16 = _mm256_cvtepu8_epi16(LOAD128(p + 16 * k));
            __m256i x16 = act == CPU_ACT_I8 ? _mm256_cvtepi8_epi16(LOAD128((const int8_t *)xq + (size_t)g * G + 16 * k))
                                            : LOADU((const int16_t *)xq + (size_t)g * G + 16 * k);
            I = _mm256_add_epi32(I, _mm256_madd_epi16(q16, x16));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(splash_bf16_to_f32(sc[g]) * xd[g]), _mm256_cvtepi32_ps(I), acc);
        bs = fmaf(splash_bf16_to_f32(bi[g]), xs[g], bs);
    }
    return hsum8_avx(acc) + bs;
}
#else
#define HAVE_X86 0
#endif

float cpu_act_dot(int act, int bits, int simd, const uint8_t *qrow, const uint16_t *sc, const uint16_t *bi, int groups,
                  const void *xq, const float *xd, const float *xs) {
#if HAVE_X86
    if (simd) {
        if (bits == 8) return dot_q8(act, qrow, sc, bi, groups, xq, xd, xs);
        if (act == CPU_ACT_I8) return dot_i8_q4(qrow, sc, bi, groups, xq, xd, xs);
        return dot_i16_q4(qrow, sc, bi, groups, xq, xd, xs);
    }
#endif
    return dot_scalar(act, bits, qrow, sc, bi, groups, xq, xd, xs);
}
