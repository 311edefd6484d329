/* gdn_chunked.c - the gated delta rule over many tokens of one head, chunk by
 * chunk (64 tokens), as transformers' torch_chunk_gated_delta_rule: inside a
 * chunk the delta-rule updates are condensed by the UT transform (a unit
 * lower-triangular solve), then one sequential pass carries the state from
 * chunk to chunk.  Per chunk of L tokens, with cum = cumsum(g):
 *
 *   A[i][j]  = (beta_i k_i . k_j) exp(cum_i - cum_j)          j < i
 *   U        = (I + A)^-1 (beta v)       W = (I + A)^-1 (beta k exp(cum))
 *   vnew_i   = U_i - W_i S
 *   o_i      = (q_i exp(cum_i)) S + sum_{j<=i} (q_i . k_j) exp(cum_i - cum_j) vnew_j
 *   S        = S exp(cum_L) + sum_i (k_i exp(cum_L - cum_i)) (x) vnew_i
 *
 * A shorter last chunk is the padded chunk of transformers without the
 * padding (padded tokens have k = v = 0 and g = 0, so they change nothing).
 * It computes the same function as the recurrence (gdn_recurrent.c) up to
 * fp32 rounding; prefill uses it for long runs of rows, where its matrix
 * products beat dk*dv work per token.
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"

#define C CPU_GDN_CHUNK

size_t cpu_gdn_chunk_scratch(int dk, int dv) {
    return (size_t)C + 2 * (size_t)C * C + (size_t)C * (2 * (size_t)dk + (size_t)dv) + 2 * (size_t)dv + (size_t)C +
           (size_t)(dk > C ? dk : C);
}

/* Every sum below is a chain over its reduction index in increasing order:
 * y = fmaf(a_k, X_k, y) elementwise (cpu_axpy_rows: the bits of one cpu_axpy
 * per k, with y held in registers), or a cpu_dot (cpu_dot_rows: several at
 * once, the same bits).  exp(cum_i - cum_j) is computed once per pair. */
void cpu_gdn_chunked(float *S, int dk, int dv, int n, const float *q, const float *k, size_t ldqk, const float *v,
                     size_t ldv, const float *g, const float *beta, size_t ldgb, float *o, size_t ldo,
                     float *scratch) {
    float *cum = scratch;                  /* [C] */
    float *A = cum + C;                    /* [C][C] strictly lower */
    float *E = A + (size_t)C * C;          /* [C][C] exp(cum_i - cum_j), j <= i */
    float *kb = E + (size_t)C * C;         /* [C][dk] beta k */
    float *W = kb + (size_t)C * dk;        /* [C][dk] */
    float *U = W + (size_t)C * dk;         /* [C][dv], becomes vnew */
    float *tmp = U + (size_t)C * dv;       /* [dv] */
    float *tmp2 = tmp + dv;                /* [dv] */
    float *kd = tmp2 + dv;                 /* [C] exp(cum_L - cum_i) */
    float *coef = kd + C;                  /* [max(C, dk)] the coefficients of one chain */
    float d[C];
    for (int t0 = 0; t0 < n; t0 += C) {
        int L = n - t0 < C ? n - t0 : C;
        const float *qc = q + (size_t)t0 * ldqk, *kc = k + (size_t)t0 * ldqk, *vc = v + (size_t)t0 * ldv;
        for (int i = 0; i < L; i++) cum[i] = (i ? cum[i - 1] : 0.0f) + g[(size_t)(t0 + i) * ldgb];
        for (int i = 0; i < L; i++) {
            float b = beta[(size_t)(t0 + i) * ldgb];
            const float *ki = kc + (size_t)i * ldqk, *vi = vc + (size_t)i * ldv;
            for (int r = 0; r < dk; r++) kb[(size_t)i * dk + r] = ki[r] * b;
            for (int c = 0; c < dv; c++) U[(size_t)i * dv + c] = vi[c] * b;
            for (int j = 0; j < i; j++) E[i * C + j] = expf(cum[i] - cum[j]);
            E[i * C + i] = expf(cum[i] - cum[i]);
        }
        for (int i = 1; i < L; i++) {
            cpu_dot_rows(kb + (size_t)i * dk, kc, ldqk, i, dk, d);
            for (int j = 0; j < i; j++) A[i * C + j] = d[j] * E[i * C + j];
        }
        /* forward substitution: rows of U and W in order, each minus the
         * earlier solved rows */
        for (int i = 0; i < L; i++) {
            float e = expf(cum[i]);
            float *Wi = W + (size_t)i * dk, *Ui = U + (size_t)i * dv;
            for (int r = 0; r < dk; r++) Wi[r] = kb[(size_t)i * dk + r] * e;
            for (int j = 0; j < i; j++) coef[j] = -A[i * C + j];
            cpu_axpy_rows(coef, U, (size_t)dv, i, Ui, dv);
            cpu_axpy_rows(coef, W, (size_t)dk, i, Wi, dk);
        }
        /* vnew_i = U_i - W_i S  (in U) */
        for (int i = 0; i < L; i++) {
            memset(tmp, 0, (size_t)dv * sizeof *tmp);
            cpu_axpy_rows(W + (size_t)i * dk, S, (size_t)dv, dk, tmp, dv);
            float *Ui = U + (size_t)i * dv;
            for (int c = 0; c < dv; c++) Ui[c] -= tmp[c];
        }
        /* outputs: inter-chunk read of S plus intra-chunk attention */
        for (int i = 0; i < L; i++) {
            const float *qi = qc + (size_t)i * ldqk;
            float e = expf(cum[i]);
            memset(tmp, 0, (size_t)dv * sizeof *tmp);
            for (int r = 0; r < dk; r++) coef[r] = qi[r] * e;
            cpu_axpy_rows(coef, S, (size_t)dv, dk, tmp, dv);
            memset(tmp2, 0, (size_t)dv * sizeof *tmp2);
            cpu_dot_rows(qi, kc, ldqk, i + 1, dk, d);
            for (int j = 0; j <= i; j++) coef[j] = d[j] * E[i * C + j];
            cpu_axpy_rows(coef, U, (size_t)dv, i + 1, tmp2, dv);
            float *oi = o + (size_t)(t0 + i) * ldo;
            for (int c = 0; c < dv; c++) oi[c] = tmp[c] + tmp2[c];
        }
        /* state: S exp(cum_L) + sum_i kd_i (x) vnew_i */
        float last = cum[L - 1], el = expf(last);
        for (int i = 0; i < L; i++) kd[i] = expf(last - cum[i]);
        for (int r = 0; r < dk; r++) {
            memset(tmp, 0, (size_t)dv * sizeof *tmp);
            for (int i = 0; i < L; i++) coef[i] = kc[(size_t)i * ldqk + r] * kd[i];
            cpu_axpy_rows(coef, U, (size_t)dv, L, tmp, dv);
            float *Sr = S + (size_t)r * dv;
            for (int c = 0; c < dv; c++) Sr[c] = Sr[c] * el + tmp[c];
        }
    }
}
