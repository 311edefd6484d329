/* gdn_recurrent.c - one token of the gated delta rule on one value head:
 *
 *   S *= exp(g);  m = S^T k;  delta = beta (v - m);  S += k (x) delta;  o = S^T q
 *
 * S is [dk][dv] fp32 (row i = key dim i).  Two passes over S: decay while
 * accumulating m, then the rank-1 update while accumulating o.  Sums over the
 * key dim run in order i = 0..dk-1 per value column, vectorised across
 * columns, so the AVX2 and scalar paths agree bit for bit.  Decode, verify
 * and commit's replay all go through this one function (commit passes q =
 * NULL; the output never feeds back into S), which is what makes a verified
 * and committed row identical to a prefilled one.  cpu_gdn_step_from reads
 * the old state from one place and writes the new one to another (a verify
 * lane's first row: slot -> scratch, without a separate copy), with the same
 * arithmetic.
 */
#include <math.h>

#include "backend/cpu/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_X86 1
#define AVX __attribute__((target("avx2,fma")))

AVX static void step_avx(const float *Sin, float *S, int dk, int dv, const float *q, const float *k, const float *v,
                         float decay, float beta, float *o, float *m) {
    __m256 vd = _mm256_set1_ps(decay);
    int c;
    for (int i = 0; i < dk; i++) {
        const float *si = Sin + (size_t)i * dv;
        float *s = S + (size_t)i * dv;
        __m256 ki = _mm256_set1_ps(k[i]);
        for (c = 0; c + 8 <= dv; c += 8) {
            __m256 sv = _mm256_mul_ps(_mm256_loadu_ps(si + c), vd);
            _mm256_storeu_ps(s + c, sv);
            _mm256_storeu_ps(m + c, i ? _mm256_fmadd_ps(sv, ki, _mm256_loadu_ps(m + c)) : _mm256_mul_ps(sv, ki));
        }
        for (; c < dv; c++) {
            s[c] = si[c] * decay;
            m[c] = i ? fmaf(s[c], k[i], m[c]) : s[c] * k[i];
        }
    }
    __m256 vb = _mm256_set1_ps(beta);
    for (c = 0; c + 8 <= dv; c += 8)
        _mm256_storeu_ps(m + c, _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(v + c), _mm256_loadu_ps(m + c)), vb));
    for (; c < dv; c++) m[c] = (v[c] - m[c]) * beta; /* m now holds delta */
    for (int i = 0; i < dk; i++) {
        float *s = S + (size_t)i * dv;
        __m256 ki = _mm256_set1_ps(k[i]);
        if (q) {
            __m256 qi = _mm256_set1_ps(q[i]);
            for (c = 0; c + 8 <= dv; c += 8) {
                __m256 sv = _mm256_fmadd_ps(ki, _mm256_loadu_ps(m + c), _mm256_loadu_ps(s + c));
                _mm256_storeu_ps(s + c, sv);
                _mm256_storeu_ps(o + c, i ? _mm256_fmadd_ps(sv, qi, _mm256_loadu_ps(o + c)) : _mm256_mul_ps(sv, qi));
            }
        } else {
            for (c = 0; c + 8 <= dv; c += 8)
                _mm256_storeu_ps(s + c, _mm256_fmadd_ps(ki, _mm256_loadu_ps(m + c), _mm256_loadu_ps(s + c)));
        }
        for (; c < dv; c++) {
            s[c] = fmaf(k[i], m[c], s[c]);
            if (q) o[c] = i ? fmaf(s[c], q[i], o[c]) : s[c] * q[i];
        }
    }
}
#else
#define HAVE_X86 0
#endif

#define MAX_DV CPU_GDN_MAX_DV

void cpu_gdn_step_from(const float *Sin, float *S, int dk, int dv, const float *q, const float *k, const float *v,
                       float g, float beta, float *o) {
    float m[MAX_DV]; /* dv <= MAX_DV is checked when a model loads */
    float decay = expf(g);
#if HAVE_X86
    if (cpu_simd()) {
        step_avx(Sin, S, dk, dv, q, k, v, decay, beta, o, m);
        return;
    }
#endif
    for (int i = 0; i < dk; i++) {
        const float *si = Sin + (size_t)i * dv;
        float *s = S + (size_t)i * dv;
        for (int c = 0; c < dv; c++) {
            s[c] = si[c] * decay;
            m[c] = i ? fmaf(s[c], k[i], m[c]) : s[c] * k[i];
        }
    }
    for (int c = 0; c < dv; c++) m[c] = (v[c] - m[c]) * beta;
    for (int i = 0; i < dk; i++) {
        float *s = S + (size_t)i * dv;
        for (int c = 0; c < dv; c++) {
            s[c] = fmaf(k[i], m[c], s[c]);
            if (q) o[c] = i ? fmaf(s[c], q[i], o[c]) : s[c] * q[i];
        }
    }
}

void cpu_gdn_step(float *S, int dk, int dv, const float *q, const float *k, const float *v, float g, float beta,
                  float *o) {
    cpu_gdn_step_from(S, S, dk, dv, q, k, v, g, beta, o);
}
