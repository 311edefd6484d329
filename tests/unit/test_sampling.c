/* Sampling: the keyed random stream (Random123 known answers, uniformity),
 * parameter validation, histories and penalties (hand-computed numbers),
 * every filter on crafted rows and against a naive full-sort reference on a
 * 248K vocab, sampling frequencies (G-test), raw logprobs, and the lossless
 * rejection-sampling identity (closed form from the code's own decisions, to
 * 1e-12, and a G-test over 10^6 cycles), including a q on a candidate subset. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/sampling.h"

/* ------------------------------------------------------------------------
 * Helpers: an independent generator for test data, statistics, a reference.
 * ------------------------------------------------------------------------ */
static uint64_t sm_state = 42;
static uint64_t splitmix(void) {
    uint64_t z = (sm_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rnd01(void) { return (double)(splitmix() >> 11) * 0x1p-53; }
static double rnd_normal(void) {
    double a = rnd01(), b = rnd01();
    return sqrt(-2 * log(a + 1e-300)) * cos(6.283185307179586 * b);
}

/* Chi-square quantiles by Wilson-Hilferty at z = +-4.75 (tail ~1e-6): a
 * correct generator passes with near certainty, a biased one fails. */
static double chi2_upper(int df) {
    double a = 2.0 / (9.0 * df);
    return df * pow(1 - a + 4.75 * sqrt(a), 3);
}
static double chi2_lower(int df) {
    double a = 2.0 / (9.0 * df);
    return df * pow(1 - a - 4.75 * sqrt(a), 3);
}

static double chi2_uniform(const long *counts, int bins, long total) {
    double e = (double)total / bins, x = 0;
    for (int i = 0; i < bins; i++) x += (counts[i] - e) * (counts[i] - e) / e;
    return x;
}

/* G = 2 sum O ln(O / E); +inf when something was observed where E = 0. */
static double g_stat(const long *obs, const double *p, int n, long total) {
    double g = 0;
    for (int i = 0; i < n; i++) {
        if (obs[i] == 0) continue;
        if (p[i] <= 0) return INFINITY;
        g += obs[i] * log(obs[i] / (p[i] * total));
    }
    return 2 * g;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static int support(const double *p, int n) {
    int k = 0;
    for (int i = 0; i < n; i++) k += p[i] > 0;
    return k;
}

/* The naive reference pipeline on an already processed row (masked tokens at
 * -inf): sort everything, then min_p, top_k, top_p in vLLM's order.  Writes
 * the dense probability of every token into pref[V]. */
typedef struct rcand {
    double v;
    int id;
} rcand;
static int rcmp(const void *a, const void *b) {
    const rcand *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}
static void reference(const float *row, int V, double T, int top_k, double top_p, double min_p, double *pref) {
    rcand *c = malloc((size_t)V * sizeof *c);
    int n = 0;
    for (int t = 0; t < V; t++)
        if (row[t] > -INFINITY) c[n++] = (rcand){row[t], t};
    qsort(c, (size_t)n, sizeof *c, rcmp);
    double *w = malloc((size_t)(n ? n : 1) * sizeof *w);
    for (int i = 0; i < n; i++) w[i] = exp((c[i].v - c[0].v) / T);
    int m = n;
    if (min_p > 0)
        for (m = 0; m < n && w[m] >= min_p; m++) {
        }
    if (top_k > 0 && top_k < m) m = top_k;
    double total = 0;
    for (int i = 0; i < m; i++) total += w[i];
    if (top_p < 1) {
        double acc = 0;
        int cut = m;
        for (int i = 0; i < m; i++) {
            acc += w[i];
            if (acc >= top_p * total) {
                cut = i + 1;
                break;
            }
        }
        m = cut;
        total = 0;
        for (int i = 0; i < m; i++) total += w[i];
    }
    for (int t = 0; t < V; t++) pref[t] = 0;
    for (int i = 0; i < m; i++) pref[c[i].id] = w[i] / total;
    free(c);
    free(w);
}

static void dense(const splash_dist *d, double *out, int V) {
    for (int t = 0; t < V; t++) out[t] = 0;
    for (int i = 0; i < d->n; i++) {
        assert_true(d->ids[i] >= 0 && d->ids[i] < V);
        if (i) assert_true(d->ids[i] > d->ids[i - 1]);
        out[d->ids[i]] = d->p[i];
    }
}

static void expect_dist(const splash_dist *d, int V, const double *want, double tol) {
    double *got = malloc((size_t)V * sizeof *got);
    dense(d, got, V);
    for (int t = 0; t < V; t++) {
        if ((got[t] > 0) != (want[t] > 0)) fail_msg("token %d: got p=%.17g, want %.17g", t, got[t], want[t]);
        if (fabs(got[t] - want[t]) > tol) fail_msg("token %d: got p=%.17g, want %.17g", t, got[t], want[t]);
    }
    free(got);
}

static splash_sampling_params params(double T) {
    splash_sampling_params p;
    splash_sampling_params_default(&p);
    p.temperature = T;
    return p;
}

/* ------------------------------------------------------------------------
 * The random stream.
 * ------------------------------------------------------------------------ */
static void test_philox_known_answers(void **state) {
    (void)state;
    /* Random123 tests/kat_vectors, the three "philox4x32 10" lines. */
    static const uint32_t v[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e,
         0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb,
         0x5001e420, 0x24126ea1},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        splash_philox4x32_10(v[i], v[i] + 4, out);
        for (int j = 0; j < 4; j++) assert_int_equal(out[j], v[i][6 + j]);
    }
    /* The key layout: counter {index, purpose, lo(position), hi(position)},
     * key {lo(seed), hi(seed)}, u = ((w0 >> 5) * 2^26 + (w1 >> 6)) / 2^53. */
    double u = splash_rng_uniform(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3u, 0x243f6a88u);
    assert_true(u == ((double)(0xd16cfe09u >> 5) * 67108864.0 + (double)(0x94fdcceb >> 6)) / 9007199254740992.0);
    u = splash_rng_uniform(~0ull, ~0ull, 0xffffffffu, 0xffffffffu);
    assert_true(u == ((double)(0x408f276du >> 5) * 67108864.0 + (double)(0x41c83b0eu >> 6)) / 9007199254740992.0);
    float f = splash_rng_uniform_f32(0, 0, 0, 0);
    assert_true(f == (float)((double)(0x6627e8d5u >> 8) / 16777216.0));
    assert_true(splash_rng_uniform(0, 0, 0, 0) ==
                ((double)(0x6627e8d5u >> 5) * 67108864.0 + (double)(0xe169c58du >> 6)) / 9007199254740992.0);
}

static void test_rng_keys(void **state) {
    (void)state;
    /* Same keys, same numbers; any key field changes them. */
    double a = splash_rng_uniform(7, 1000, SPLASH_RNG_ACCEPT, 0);
    assert_true(a == splash_rng_uniform(7, 1000, SPLASH_RNG_ACCEPT, 0));
    assert_true(a != splash_rng_uniform(8, 1000, SPLASH_RNG_ACCEPT, 0));
    assert_true(a != splash_rng_uniform(7, 1001, SPLASH_RNG_ACCEPT, 0));
    assert_true(a != splash_rng_uniform(7, 1000, SPLASH_RNG_RESIDUAL, 0));
    assert_true(a != splash_rng_uniform(7, 1000, SPLASH_RNG_ACCEPT, 1));
    assert_true(a != splash_rng_uniform(7, 1000 + (1ull << 32), SPLASH_RNG_ACCEPT, 0));
    assert_true(a != splash_rng_uniform(7 + (1ull << 32), 1000, SPLASH_RNG_ACCEPT, 0));
    /* 20000 positions x 4 purposes: all in [0,1), all distinct. */
    enum { N = 20000 };
    static double d[4 * N];
    for (int i = 0; i < N; i++)
        for (int k = 0; k < 4; k++) {
            d[4 * i + k] = splash_rng_uniform(99, (uint64_t)i, (uint32_t)k + 1, 0);
            assert_true(d[4 * i + k] >= 0 && d[4 * i + k] < 1);
        }
    qsort(d, 4 * N, sizeof *d, cmp_double);
    for (int i = 1; i < 4 * N; i++) assert_true(d[i] != d[i - 1]);
}

static void test_rng_uniformity(void **state) {
    (void)state;
    enum { BINS = 1000, N = 1000000, B2 = 64 };
    static long c[BINS], c2[B2 * B2], cf[BINS];
    /* The engine's pattern: one request, consecutive positions. */
    double prev = 0, mean = 0;
    for (long i = 0; i < N; i++) {
        double u = splash_rng_uniform(12345, (uint64_t)i, SPLASH_RNG_SAMPLE, 0);
        c[(int)(u * BINS)]++;
        mean += u;
        if (i & 1) c2[(int)(prev * B2) * B2 + (int)(u * B2)]++;
        prev = u;
    }
    double x = chi2_uniform(c, BINS, N);
    printf("# chi2 1-D %.1f (df %d, accept %.1f..%.1f)\n", x, BINS - 1, chi2_lower(BINS - 1), chi2_upper(BINS - 1));
    assert_true(x < chi2_upper(BINS - 1) && x > chi2_lower(BINS - 1));
    double x2 = chi2_uniform(c2, B2 * B2, N / 2);
    printf("# chi2 pairs %.1f (df %d)\n", x2, B2 * B2 - 1);
    assert_true(x2 < chi2_upper(B2 * B2 - 1) && x2 > chi2_lower(B2 * B2 - 1));
    assert_true(fabs(mean / N - 0.5) < 5 * sqrt(1.0 / 12 / N));
    /* Across requests: consecutive seeds at one position, float draws. */
    for (long i = 0; i < N; i++) cf[(int)(splash_rng_uniform_f32((uint64_t)i, 17, SPLASH_RNG_DRAFT, 0) * BINS)]++;
    x = chi2_uniform(cf, BINS, N);
    printf("# chi2 seeds/f32 %.1f\n", x);
    assert_true(x < chi2_upper(BINS - 1) && x > chi2_lower(BINS - 1));

    /* The thresholds reject broken generators: a Weyl sequence (too even),
     * a squared uniform (biased), pairs that follow each other. */
    memset(c, 0, sizeof c);
    for (long i = 0; i < N; i++) c[(int)(fmod(i * 0.6180339887498949, 1.0) * BINS)]++;
    assert_false(chi2_uniform(c, BINS, N) > chi2_lower(BINS - 1));
    memset(c, 0, sizeof c);
    for (long i = 0; i < N; i++) {
        double u = splash_rng_uniform(12345, (uint64_t)i, SPLASH_RNG_SAMPLE, 0);
        c[(int)(u * u * BINS)]++;
    }
    assert_false(chi2_uniform(c, BINS, N) < chi2_upper(BINS - 1));
    memset(c2, 0, sizeof c2);
    for (long i = 0; i < N / 2; i++) {
        double u = splash_rng_uniform(12345, (uint64_t)i, SPLASH_RNG_SAMPLE, 0), v = fmod(u + 0.5 + 0.01 * rnd01(), 1.0);
        c2[(int)(u * B2) * B2 + (int)(v * B2)]++;
    }
    assert_false(chi2_uniform(c2, B2 * B2, N / 2) < chi2_upper(B2 * B2 - 1));
}

/* ------------------------------------------------------------------------
 * Parameters.
 * ------------------------------------------------------------------------ */
static void expect_invalid(splash_sampling_params p, int code, const char *prefix) {
    splash_error err = {0};
    assert_int_equal(splash_sampling_params_validate(&p, &err), code);
    if (strncmp(err.msg, prefix, strlen(prefix))) fail_msg("message '%s' does not start with '%s'", err.msg, prefix);
}

static void test_validation(void **state) {
    (void)state;
    splash_sampling_params p = params(1.0), q;
    assert_int_equal(splash_sampling_params_validate(&p, NULL), 0);
    p.temperature = 0, p.top_p = 1, p.top_k = -1, p.min_p = 1, p.presence_penalty = -2, p.frequency_penalty = 2;
    p.repetition_penalty = 0.01, p.logprobs = 1, p.top_logprobs = 20;
    assert_int_equal(splash_sampling_params_validate(&p, NULL), 0);
    p = params(2.0);
    assert_int_equal(splash_sampling_params_validate(&p, NULL), 0);
#define BAD(field, value, code, prefix) (q = params(1.0), q.field = (value), expect_invalid(q, code, prefix))
    BAD(temperature, 2.01, SPLASH_E_RANGE, "temperature must be between 0 and 2 (got 2.01)");
    BAD(temperature, -0.5, SPLASH_E_RANGE, "temperature ");
    BAD(temperature, NAN, SPLASH_E_INVALID, "temperature ");
    BAD(top_p, 0.0, SPLASH_E_RANGE, "top_p must be greater than 0");
    BAD(top_p, 1.5, SPLASH_E_RANGE, "top_p ");
    BAD(top_p, NAN, SPLASH_E_INVALID, "top_p ");
    BAD(top_k, -2, SPLASH_E_RANGE, "top_k ");
    BAD(min_p, -0.1, SPLASH_E_RANGE, "min_p ");
    BAD(min_p, 1.1, SPLASH_E_RANGE, "min_p ");
    BAD(presence_penalty, 2.5, SPLASH_E_RANGE, "presence_penalty must be between -2 and 2");
    BAD(frequency_penalty, -3, SPLASH_E_RANGE, "frequency_penalty ");
    BAD(frequency_penalty, INFINITY, SPLASH_E_INVALID, "frequency_penalty ");
    BAD(repetition_penalty, 0.0, SPLASH_E_RANGE, "repetition_penalty must be greater than 0");
    BAD(repetition_penalty, -1.0, SPLASH_E_RANGE, "repetition_penalty ");
    BAD(top_logprobs, 21, SPLASH_E_RANGE, "top_logprobs must be between 0 and 20");
    BAD(top_logprobs, -1, SPLASH_E_RANGE, "top_logprobs ");
    BAD(logprobs, 2, SPLASH_E_INVALID, "logprobs ");
#undef BAD
}

/* ------------------------------------------------------------------------
 * Histories and penalties.
 * ------------------------------------------------------------------------ */
static void test_history(void **state) {
    (void)state;
    splash_token_history h;
    assert_int_equal(splash_history_init(&h, 1), 0);
    int32_t prompt[] = {5, 9, 5}, out[] = {9, 3, 3, 3};
    assert_int_equal(splash_history_add(&h, prompt, 3, 1), 0);
    assert_int_equal(splash_history_add(&h, out, 4, 0), 0);
    const splash_history_entry *e = splash_history_find(&h, 5);
    assert_non_null(e);
    assert_int_equal(e->n_prompt, 2);
    assert_int_equal(e->n_output, 0);
    e = splash_history_find(&h, 9);
    assert_int_equal(e->n_prompt, 1);
    assert_int_equal(e->n_output, 1);
    assert_int_equal(splash_history_find(&h, 3)->n_output, 3);
    assert_null(splash_history_find(&h, 4));
    int32_t bad = -1;
    assert_int_equal(splash_history_add(&h, &bad, 1, 0), SPLASH_E_RANGE);
    /* Growth far past the hint keeps every count. */
    for (int32_t t = 0; t < 20000; t++) {
        int32_t tt = t * 7 + 1;
        for (int r = 0; r <= t % 3; r++) assert_int_equal(splash_history_add(&h, &tt, 1, 0), 0);
    }
    for (int32_t t = 0; t < 20000; t++) {
        e = splash_history_find(&h, t * 7 + 1);
        assert_non_null(e);
        uint32_t want = (uint32_t)(t % 3 + 1) + (t * 7 + 1 == 9 ? 1 : 0);
        assert_int_equal(e->n_output, want);
    }
    splash_history_clear(&h);
    assert_int_equal(h.n, 0);
    assert_null(splash_history_find(&h, 5));
    splash_history_free(&h);
}

static void test_penalties_hand_computed(void **state) {
    (void)state;
    /* prompt {5, 3}, output {3, 3, 7}; extra (draft rows) {7, 9, 7}.
     * rep 2, frequency 0.5, presence 0.25:
     *   t1  1.0   untouched                          -> 1.0
     *   t3  2.0   prompt+out 2: 2/2 - 0.5*2 - 0.25    -> -0.25
     *   t5 -1.0   prompt only: -1*2 (no presence)     -> -2.0
     *   t7  0.5   out 1 + extra 2: 0.5/2 - 1.5 - 0.25 -> -1.5
     *   t9  4.0   extra 1: 4/2 - 0.5 - 0.25           -> 1.25
     *   t2 -3.0   untouched                          -> -3.0 */
    splash_token_history h;
    assert_int_equal(splash_history_init(&h, 4), 0);
    int32_t prompt[] = {5, 3}, out[] = {3, 3, 7}, extra[] = {7, 9, 7};
    splash_history_add(&h, prompt, 2, 1);
    splash_history_add(&h, out, 3, 0);
    splash_sampling_params p = params(1.0);
    p.repetition_penalty = 2, p.frequency_penalty = 0.5, p.presence_penalty = 0.25;
    float row[10] = {0, 1.0f, -3.0f, 2.0f, 0, -1.0f, 0, 0.5f, 0, 4.0f};
    float want[10] = {0, 1.0f, -3.0f, -0.25f, 0, -2.0f, 0, -1.5f, 0, 1.25f};
    float r[10];
    memcpy(r, row, sizeof r);
    assert_int_equal(splash_penalties_apply(r, 10, &p, &h, extra, 3, NULL), 0);
    for (int t = 0; t < 10; t++) assert_true(r[t] == want[t]);
    /* Sparse: the same values, each affected token once. */
    int32_t ids[16];
    float vals[16];
    int n = splash_penalties_sparse(&p, &h, extra, 3, row, 10, ids, vals, NULL);
    assert_int_equal(n, 4);
    int seen = 0;
    for (int i = 0; i < n; i++) {
        assert_true(vals[i] == want[ids[i]]);
        seen |= 1 << ids[i];
    }
    assert_int_equal(seen, (1 << 3) | (1 << 5) | (1 << 7) | (1 << 9));
    /* Extra tokens equal appending them to the history. */
    splash_token_history h2;
    splash_history_init(&h2, 4);
    splash_history_add(&h2, prompt, 2, 1);
    splash_history_add(&h2, out, 3, 0);
    splash_history_add(&h2, extra, 3, 0);
    float r2[10];
    memcpy(r2, row, sizeof r2);
    splash_penalties_apply(r2, 10, &p, &h2, NULL, 0, NULL);
    assert_memory_equal(r, r2, sizeof r);
    /* Negative presence rewards output tokens; a token outside the vocab fails. */
    p = params(1.0);
    p.presence_penalty = -1.5;
    memcpy(r, row, sizeof r);
    splash_penalties_apply(r, 10, &p, &h, NULL, 0, NULL);
    assert_true(r[3] == 3.5f && r[7] == 2.0f && r[5] == -1.0f && r[9] == 4.0f);
    int32_t big = 10;
    splash_error err = {0};
    assert_int_equal(splash_penalties_apply(r, 10, &p, &h, &big, 1, &err), SPLASH_E_RANGE);
    assert_non_null(strstr(err.msg, "outside the vocab"));
    /* Through the sampler: greedy picks 9 (4.0) raw, 1 (1.0) once penalised. */
    splash_sampler *s;
    assert_int_equal(splash_sampler_create(10, &s, NULL), 0);
    p = params(0);
    int32_t tok;
    assert_int_equal(splash_sample(s, &p, row, &h, extra, 3, NULL, 0, &tok, NULL), 0);
    assert_int_equal(tok, 9);
    p.repetition_penalty = 2, p.frequency_penalty = 0.5, p.presence_penalty = 0.25;
    assert_int_equal(splash_sample(s, &p, row, &h, extra, 3, NULL, 0, &tok, NULL), 0);
    assert_int_equal(tok, 9); /* 1.25 still beats 1.0 */
    p.presence_penalty = 0.5;  /* 9 -> 1.0: tie with token 1, lowest id wins */
    assert_int_equal(splash_sample(s, &p, row, &h, extra, 3, NULL, 0, &tok, NULL), 0);
    assert_int_equal(tok, 1);
    /* The row is never modified, and the overrides do not leak into the next row. */
    assert_true(row[9] == 4.0f);
    p.presence_penalty = 0.25;
    assert_int_equal(splash_sample(s, &p, row, NULL, NULL, 0, NULL, 0, &tok, NULL), 0);
    assert_int_equal(tok, 9);
    splash_sampler_free(s);
    /* A negative presence penalty lifts token 700 (1.0 -> 3.5) above the raw
     * best (token 5, 3.0), although its 64-token block looks hopeless raw. */
    enum { BIGV = 1000 };
    static float lifted[BIGV];
    lifted[5] = 3.0f, lifted[700] = 1.0f;
    int32_t t700 = 700;
    splash_history_clear(&h);
    splash_history_add(&h, &t700, 1, 0);
    assert_int_equal(splash_sampler_create(BIGV, &s, NULL), 0);
    p = params(0);
    p.presence_penalty = -2.5;
    assert_int_equal(splash_sample(s, &p, lifted, &h, NULL, 0, NULL, 0, &tok, NULL), 0);
    assert_int_equal(tok, 700);
    p = params(1.0);
    p.presence_penalty = -2.5, p.top_k = 1;
    assert_int_equal(splash_sample(s, &p, lifted, &h, NULL, 0, NULL, 0, &tok, NULL), 0);
    assert_int_equal(tok, 700);
    p.top_k = 0, p.min_p = 0.5;
    assert_int_equal(splash_sampler_process(s, &p, lifted, &h, NULL, 0, NULL, NULL, NULL), 0);
    assert_int_equal(splash_sampler_dist(s)->n, 2); /* exp(-0.5) >= 0.5: token 5 stays */
    assert_true(fabs(splash_dist_prob(splash_sampler_dist(s), 700) - 1 / (1 + exp(-0.5))) < 1e-12);
    splash_sampler_free(s);
    splash_history_free(&h);
    splash_history_free(&h2);
}

/* ------------------------------------------------------------------------
 * The row pipeline.
 * ------------------------------------------------------------------------ */
static void test_greedy_and_mask(void **state) {
    (void)state;
    enum { V = 70 };
    splash_sampler *s;
    assert_int_equal(splash_sampler_create(V, &s, NULL), 0);
    float row[V];
    for (int t = 0; t < V; t++) row[t] = -1.0f;
    row[3] = 2.0f, row[7] = 3.0f, row[12] = 3.0f, row[66] = 3.0f, row[69] = 5.0f;
    splash_sampling_params p = params(0);
    int32_t tok = -1;
    uint64_t mask[2] = {~0ull, ~0ull};
    mask[1] &= ~(1ull << (69 - 64)); /* forbid 69 */
    assert_int_equal(splash_sample(s, &p, row, NULL, NULL, 0, mask, 0, &tok, NULL), 0);
    assert_int_equal(tok, 7); /* ties at 3.0: lowest id */
    mask[0] &= ~(1ull << 7);
    assert_int_equal(splash_sample(s, &p, row, NULL, NULL, 0, mask, 0, &tok, NULL), 0);
    assert_int_equal(tok, 12);
    assert_true(s != NULL && splash_sampler_dist(s)->greedy && splash_sampler_dist(s)->n == 1);
    /* Only {3, 66} allowed (bits past the vocab are ignored). */
    mask[0] = 1ull << 3, mask[1] = (1ull << 2) | (~0ull << 6);
    assert_int_equal(splash_sample(s, &p, row, NULL, NULL, 0, mask, 0, &tok, NULL), 0);
    assert_int_equal(tok, 66);
    p = params(1.0);
    assert_int_equal(splash_sampler_process(s, &p, row, NULL, NULL, 0, mask, NULL, NULL), 0);
    splash_dist *d = splash_sampler_dist(s);
    assert_int_equal(d->n, 2);
    assert_int_equal(d->ids[0], 3);
    assert_int_equal(d->ids[1], 66);
    assert_true(fabs(d->p[0] - 1 / (1 + exp(1.0))) < 1e-12);
    /* NaN and -inf are never chosen; nothing left is an error. */
    row[3] = NAN, row[66] = -INFINITY;
    splash_error err = {0};
    p = params(0);
    assert_int_equal(splash_sample(s, &p, row, NULL, NULL, 0, mask, 0, &tok, &err), SPLASH_E_INVALID);
    assert_non_null(strstr(err.msg, "no token"));
    p = params(0.7);
    assert_int_equal(splash_sample(s, &p, row, NULL, NULL, 0, mask, 0, &tok, &err), SPLASH_E_INVALID);
    mask[1] |= 1ull << 1; /* 65 (-1.0) */
    assert_int_equal(splash_sample(s, &p, row, NULL, NULL, 0, mask, 0, &tok, NULL), 0);
    assert_int_equal(tok, 65);
    row[5] = INFINITY;
    assert_int_equal(splash_sample(s, &p, row, NULL, NULL, 0, NULL, 0, &tok, &err), SPLASH_E_RANGE);
    splash_sampler_free(s);
}

/* probs {0.1, 0.4, 0.2, 0.3} as logits; every expectation below by hand. */
static void check_small(splash_sampler *s, double T, int top_k, double top_p, double min_p, const double want[4]) {
    const float row[4] = {logf(0.1f), logf(0.4f), logf(0.2f), logf(0.3f)};
    splash_sampling_params p = params(T);
    p.top_k = top_k, p.top_p = top_p, p.min_p = min_p;
    assert_int_equal(splash_sampler_process(s, &p, row, NULL, NULL, 0, NULL, NULL, NULL), 0);
    expect_dist(splash_sampler_dist(s), 4, want, 1e-6);
}

static void test_filters_hand_computed(void **state) {
    (void)state;
    splash_sampler *s;
    assert_int_equal(splash_sampler_create(4, &s, NULL), 0);
    check_small(s, 1, 0, 1, 0, (double[]){0.1, 0.4, 0.2, 0.3});
    /* top_p: the shortest prefix reaching the mass (the crossing token kept). */
    check_small(s, 1, 0, 0.65, 0, (double[]){0, 4 / 7.0, 0, 3 / 7.0});
    check_small(s, 1, 0, 0.75, 0, (double[]){0, 4 / 9.0, 2 / 9.0, 3 / 9.0});
    check_small(s, 1, 0, 0.39, 0, (double[]){0, 1, 0, 0});
    check_small(s, 1, 0, 0.95, 0, (double[]){0.1, 0.4, 0.2, 0.3});
    /* temperature first: T = 0.5 squares the probabilities (.01 .16 .04 .09)/.3 */
    check_small(s, 0.5, 0, 1, 0, (double[]){1 / 30.0, 16 / 30.0, 4 / 30.0, 9 / 30.0});
    check_small(s, 0.5, 0, 0.8, 0, (double[]){0, 16 / 25.0, 0, 9 / 25.0});
    /* top_k, with top_p on the renormalised top-k: {.4,.3}/.7, .571 >= .5 */
    check_small(s, 1, 2, 1, 0, (double[]){0, 4 / 7.0, 0, 3 / 7.0});
    check_small(s, 1, 2, 0.5, 0, (double[]){0, 1, 0, 0});
    check_small(s, 1, 0, 0.5, 0, (double[]){0, 4 / 7.0, 0, 3 / 7.0});
    check_small(s, 1, 3, 1, 0, (double[]){0, 4 / 9.0, 2 / 9.0, 3 / 9.0});
    check_small(s, 1, 4, 1, 0, (double[]){0.1, 0.4, 0.2, 0.3});
    check_small(s, 1, 9, 1, 0, (double[]){0.1, 0.4, 0.2, 0.3});
    /* min_p: p >= min_p * p_max (0.3 * 0.4 = 0.12; 0.6 * 0.4 = 0.24) */
    check_small(s, 1, 0, 1, 0.3, (double[]){0, 4 / 9.0, 2 / 9.0, 3 / 9.0});
    check_small(s, 1, 0, 1, 0.6, (double[]){0, 4 / 7.0, 0, 3 / 7.0});
    /* min_p after temperature: ratios .0625 .25 .5625 of the max */
    check_small(s, 0.5, 0, 1, 0.3, (double[]){0, 16 / 25.0, 0, 9 / 25.0});
    /* min_p before top_p (vLLM): {.444 .333 .222}, .777 >= .75 keeps two;
     * without min_p .4 + .3 = .7 < .75 keeps three. */
    check_small(s, 1, 0, 0.75, 0.3, (double[]){0, 4 / 7.0, 0, 3 / 7.0});
    check_small(s, 1, 2, 1, 0.6, (double[]){0, 4 / 7.0, 0, 3 / 7.0});
    check_small(s, 1, 3, 1, 0.6, (double[]){0, 4 / 7.0, 0, 3 / 7.0});
    splash_sampler_free(s);

    /* Exact boundaries: four equal logits weigh exactly 1 each; top_p 0.5
     * keeps the two lowest ids (the mass 2/4 reaches 0.5: vLLM's rule masks a
     * token when the mass below it is <= 1 - top_p).  min_p 1 keeps the ties. */
    assert_int_equal(splash_sampler_create(4, &s, NULL), 0);
    const float flat[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    splash_sampling_params fp = params(1.0);
    fp.top_p = 0.5;
    assert_int_equal(splash_sampler_process(s, &fp, flat, NULL, NULL, 0, NULL, NULL, NULL), 0);
    expect_dist(splash_sampler_dist(s), 4, (double[]){0.5, 0.5, 0, 0}, 0);
    fp.top_p = 0.5000001;
    assert_int_equal(splash_sampler_process(s, &fp, flat, NULL, NULL, 0, NULL, NULL, NULL), 0);
    expect_dist(splash_sampler_dist(s), 4, (double[]){1 / 3.0, 1 / 3.0, 1 / 3.0, 0}, 1e-15);
    fp.top_p = 1, fp.min_p = 1, fp.top_k = 3;
    assert_int_equal(splash_sampler_process(s, &fp, flat, NULL, NULL, 0, NULL, NULL, NULL), 0);
    expect_dist(splash_sampler_dist(s), 4, (double[]){1 / 3.0, 1 / 3.0, 1 / 3.0, 0}, 1e-15);
    splash_sampler_free(s);
    /* The same boundary after top_k and after min_p (a fifth, negligible token). */
    assert_int_equal(splash_sampler_create(5, &s, NULL), 0);
    const float flat5[5] = {0.5f, 0.5f, 0.5f, 0.5f, -100.0f};
    fp = params(1.0);
    fp.top_p = 0.5, fp.top_k = 4;
    assert_int_equal(splash_sampler_process(s, &fp, flat5, NULL, NULL, 0, NULL, NULL, NULL), 0);
    expect_dist(splash_sampler_dist(s), 5, (double[]){0.5, 0.5, 0, 0, 0}, 0);
    fp.top_k = 0, fp.min_p = 0.5;
    assert_int_equal(splash_sampler_process(s, &fp, flat5, NULL, NULL, 0, NULL, NULL, NULL), 0);
    expect_dist(splash_sampler_dist(s), 5, (double[]){0.5, 0.5, 0, 0, 0}, 0);
    splash_sampler_free(s);

    /* top_k ties at the boundary go to the lowest ids: logits 5 at {1,3},
     * 3 at {2,4,6}; top_k 3 keeps {1,3,2}. */
    assert_int_equal(splash_sampler_create(7, &s, NULL), 0);
    const float row[7] = {1, 5, 3, 5, 3, 2, 3};
    splash_sampling_params p = params(1.0);
    p.top_k = 3;
    assert_int_equal(splash_sampler_process(s, &p, row, NULL, NULL, 0, NULL, NULL, NULL), 0);
    double z = 2 * exp(5.0) + exp(3.0);
    expect_dist(splash_sampler_dist(s), 7, (double[]){0, exp(5.0) / z, exp(3.0) / z, exp(5.0) / z, 0, 0, 0}, 1e-12);
    assert_int_equal(splash_sampler_dist(s)->argmax, 1);
    splash_sampler_free(s);
}

/* A model-like row: normal logits with a few strong tokens, a 10% mask and
 * penalties on 300 history tokens; the naive reference sees the same row. */
static void check_large(int V, double T, int top_k, double top_p, double min_p) {
    float *row = malloc((size_t)V * sizeof *row), *proc = malloc((size_t)V * sizeof *proc);
    double *want = malloc((size_t)V * sizeof *want);
    uint64_t *mask = calloc((size_t)(V + 63) / 64, sizeof *mask);
    for (int t = 0; t < V; t++) {
        row[t] = (float)(2.0 * rnd_normal());
        if (rnd01() < 0.0005) row[t] += 9.0f;
        if (rnd01() < 0.9) mask[t / 64] |= 1ull << (t % 64);
    }
    splash_token_history h;
    splash_history_init(&h, 16);
    for (int i = 0; i < 300; i++) {
        int32_t t = (int32_t)(splitmix() % (uint64_t)V);
        splash_history_add(&h, &t, 1, i < 100);
    }
    splash_sampling_params p = params(T);
    p.top_k = top_k, p.top_p = top_p, p.min_p = min_p;
    p.repetition_penalty = 1.3, p.presence_penalty = 0.4, p.frequency_penalty = 0.2;
    for (int t = 0; t < V; t++) {
        float v = row[t];
        const splash_history_entry *e = splash_history_find(&h, t);
        if (e) {
            v = v > 0 ? v / 1.3f : v * 1.3f;
            if (e->n_output) {
                v -= 0.2f * (float)e->n_output;
                v -= 0.4f;
            }
        }
        proc[t] = mask[t / 64] >> (t % 64) & 1 ? v : -INFINITY;
    }
    reference(proc, V, T, top_k, top_p, min_p, want);
    splash_sampler *s;
    assert_int_equal(splash_sampler_create(V, &s, NULL), 0);
    assert_int_equal(splash_sampler_process(s, &p, row, &h, NULL, 0, mask, NULL, NULL), 0);
    printf("# V=%d T=%g top_k=%d top_p=%g min_p=%g: %d candidates\n", V, T, top_k, top_p, min_p,
           splash_sampler_dist(s)->n);
    expect_dist(splash_sampler_dist(s), V, want, 1e-12);
    splash_sampler_free(s);
    splash_history_free(&h);
    free(row), free(proc), free(want), free(mask);
}

static void test_filters_against_reference(void **state) {
    (void)state;
    check_large(248320, 1.0, 0, 0.9, 0);   /* top_p alone: the bucket path */
    check_large(248320, 1.0, 20, 0.95, 0); /* the API's defaults */
    check_large(50000, 1.5, 0, 0.97, 0);
    check_large(50000, 0.7, 0, 0.95, 0.05);
    check_large(50000, 1.3, 2500, 0.8, 0);  /* quickselect */
    check_large(50000, 1.0, 3000, 1.0, 0.001);
    check_large(50000, 1.0, 0, 1.0, 0);     /* no filter */
    check_large(50000, 0.05, 0, 0.5, 0);    /* nearly greedy */
}

/* ------------------------------------------------------------------------
 * Sampling frequencies.
 * ------------------------------------------------------------------------ */
static void test_sampling_distribution(void **state) {
    (void)state;
    enum { V = 8, N = 1000000 };
    const float row[V] = {1.0f, 2.5f, 0.3f, 2.0f, -1.0f, 1.7f, 0.9f, 2.2f};
    double want[V], loose[V];
    reference(row, V, 0.8, 5, 0.9, 0, want);
    reference(row, V, 0.8, 5, 1.0, 0, loose); /* a sampler that forgot top_p */
    assert_int_equal(support(want, V), 4);
    splash_sampler *s;
    assert_int_equal(splash_sampler_create(V, &s, NULL), 0);
    splash_sampling_params p = params(0.8);
    p.top_k = 5, p.top_p = 0.9, p.seed = 2024;
    assert_int_equal(splash_sampler_process(s, &p, row, NULL, NULL, 0, NULL, NULL, NULL), 0);
    static long obs[V];
    for (long i = 0; i < N; i++) {
        int32_t t = splash_dist_sample(splash_sampler_dist(s), splash_rng_uniform(p.seed, (uint64_t)i, SPLASH_RNG_SAMPLE, 0));
        obs[t]++;
    }
    double g = g_stat(obs, want, V, N), g_loose = g_stat(obs, loose, V, N);
    printf("# G = %.2f (df %d, limit %.1f); against the unfiltered p: %g\n", g, support(want, V) - 1,
           chi2_upper(support(want, V) - 1), g_loose);
    assert_true(g < chi2_upper(support(want, V) - 1));
    assert_true(g_loose > chi2_upper(support(loose, V) - 1));
    /* splash_sample draws the same tokens (SAMPLE at its position). */
    for (long i = 0; i < 2000; i++) {
        int32_t a, b = splash_dist_sample(splash_sampler_dist(s), splash_rng_uniform(p.seed, (uint64_t)i, SPLASH_RNG_SAMPLE, 0));
        assert_int_equal(splash_sample(s, &p, row, NULL, NULL, 0, NULL, (uint64_t)i, &a, NULL), 0);
        assert_int_equal(a, b);
    }
    splash_sampler_free(s);
}

static void test_batch_invariance(void **state) {
    (void)state;
    /* Two requests' rows interleaved through one sampler, or each alone in
     * its own: the same tokens.  Different positions give different draws. */
    enum { V = 1000, STEPS = 64 };
    static float rows[2][V];
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < V; t++) rows[r][t] = (float)rnd_normal();
    splash_sampling_params p[2] = {params(1.0), params(0.8)};
    p[0].seed = 1, p[1].seed = 2, p[1].top_k = 50, p[1].presence_penalty = 0.5;
    splash_token_history h[2];
    int32_t alone[2][STEPS], mixed[2][STEPS];
    splash_sampler *s, *s2;
    assert_int_equal(splash_sampler_create(V, &s, NULL), 0);
    assert_int_equal(splash_sampler_create(V, &s2, NULL), 0);
    for (int r = 0; r < 2; r++) {
        splash_history_init(&h[r], 4);
        for (int i = 0; i < STEPS; i++) {
            assert_int_equal(splash_sample(s, &p[r], rows[r], &h[r], NULL, 0, NULL, 100 + i, &alone[r][i], NULL), 0);
            splash_history_add(&h[r], &alone[r][i], 1, 0);
        }
        splash_history_clear(&h[r]);
    }
    for (int i = 0; i < STEPS; i++)
        for (int r = 1; r >= 0; r--) {
            assert_int_equal(splash_sample(s2, &p[r], rows[r], &h[r], NULL, 0, NULL, 100 + i, &mixed[r][i], NULL), 0);
            splash_history_add(&h[r], &mixed[r][i], 1, 0);
        }
    assert_memory_equal(alone, mixed, sizeof alone);
    int distinct = 0;
    for (int i = 1; i < STEPS; i++) distinct += alone[0][i] != alone[0][0];
    assert_true(distinct > STEPS / 2);
    splash_history_free(&h[0]), splash_history_free(&h[1]);
    splash_sampler_free(s), splash_sampler_free(s2);
}

/* ------------------------------------------------------------------------
 * Logprobs.
 * ------------------------------------------------------------------------ */
static void test_logprobs(void **state) {
    (void)state;
    splash_sampler *s;
    assert_int_equal(splash_sampler_create(6, &s, NULL), 0);
    /* weights 1 2 3 4 0 4 -> Z = 14 */
    const float row[6] = {0, logf(2), logf(3), logf(4), -INFINITY, logf(4)};
    splash_logprobs lp;
    assert_int_equal(splash_sampler_logprobs(s, row, 2, 3, &lp, NULL), 0);
    assert_true(fabs(lp.logprob - log(3.0 / 14)) < 1e-6);
    assert_int_equal(lp.n_top, 3);
    assert_int_equal(lp.top_ids[0], 3); /* tie at 4: lowest id first */
    assert_int_equal(lp.top_ids[1], 5);
    assert_int_equal(lp.top_ids[2], 2);
    assert_true(fabs(lp.top_logprobs[0] - log(4.0 / 14)) < 1e-6);
    assert_true(fabs(lp.top_logprobs[2] - log(3.0 / 14)) < 1e-6);
    assert_int_equal(splash_sampler_logprobs(s, row, 4, 0, &lp, NULL), 0);
    assert_true(isinf(lp.logprob) && lp.logprob < 0);
    assert_int_equal(lp.n_top, 0);
    assert_int_equal(splash_sampler_logprobs(s, row, 0, 20, &lp, NULL), 0);
    assert_int_equal(lp.n_top, 5); /* the -inf token is not listed */
    assert_int_equal(splash_sampler_logprobs(s, row, 6, 1, &lp, NULL), SPLASH_E_RANGE);
    assert_int_equal(splash_sampler_logprobs(s, row, 0, 21, &lp, NULL), SPLASH_E_RANGE);
    /* Raw: penalties and temperature of the previous row change nothing. */
    splash_token_history h;
    splash_history_init(&h, 4);
    int32_t t3 = 3;
    splash_history_add(&h, &t3, 1, 0);
    splash_sampling_params p = params(0.3);
    p.presence_penalty = 2;
    int32_t tok;
    assert_int_equal(splash_sample(s, &p, row, &h, NULL, 0, NULL, 0, &tok, NULL), 0);
    assert_int_equal(splash_sampler_logprobs(s, row, 3, 1, &lp, NULL), 0);
    assert_true(fabs(lp.logprob - log(4.0 / 14)) < 1e-6);
    assert_int_equal(lp.top_ids[0], 3);
    splash_history_free(&h);
    splash_sampler_free(s);
}

/* ------------------------------------------------------------------------
 * Speculative acceptance.
 * ------------------------------------------------------------------------ */
/* The acceptance probability of x: the measure of {u : accept}, found by
 * bisection on the code's own decision (it must be a threshold in u). */
static double accept_prob(const splash_dist *p, const splash_dist *q, int32_t x) {
    if (!splash_spec_accept(p, q, x, 0.0)) return 0;
    if (splash_spec_accept(p, q, x, nextafter(1.0, 0.0))) return 1;
    double lo = 0, hi = 1;
    for (int i = 0; i < 80; i++) {
        double mid = 0.5 * (lo + hi);
        if (splash_spec_accept(p, q, x, mid)) lo = mid;
        else hi = mid;
    }
    return hi;
}

/* The residual's mass per token: residual(u) walks ids upward as u grows, so
 * token y owns [inf{u : r(u) >= y}, inf{u : r(u) > y}). */
static double residual_boundary(const splash_dist *p, const splash_dist *q, int32_t x, int32_t y) {
    if (splash_spec_residual(p, q, x, 0.0) > y) return 0;
    if (splash_spec_residual(p, q, x, nextafter(1.0, 0.0)) <= y) return 1;
    double lo = 0, hi = 1;
    for (int i = 0; i < 80; i++) {
        double mid = 0.5 * (lo + hi);
        if (splash_spec_residual(p, q, x, mid) > y) hi = mid;
        else lo = mid;
    }
    return hi;
}

/* out[y] = P(emit y) = sum_x q(x) [ a(x) [y == x] + (1 - a(x)) r_x(y) ];
 * q NULL = the deterministic draft x0. */
static void closed_form(const splash_dist *p, const splash_dist *q, int32_t x0, int V, double *out) {
    for (int y = 0; y < V; y++) out[y] = 0;
    for (int x = 0; x < V; x++) {
        double qx = q ? splash_dist_prob(q, x) : x == x0;
        if (qx == 0) continue;
        double a = accept_prob(p, q, x);
        out[x] += qx * a;
        double prev = 0;
        for (int y = 0; y < V; y++) {
            double b = residual_boundary(p, q, x, y);
            assert_true(b >= prev);
            out[y] += qx * (1 - a) * (b - prev);
            prev = b;
        }
        assert_true(prev == 1);
    }
}

static void expect_identity(const splash_dist *p, const splash_dist *q, int32_t x0, int V) {
    double got[64], want[64];
    closed_form(p, q, x0, V, got);
    dense(p, want, V);
    for (int y = 0; y < V; y++)
        if (fabs(got[y] - want[y]) > 1e-12) fail_msg("token %d: emitted with %.17g, p = %.17g", y, got[y], want[y]);
}

static void test_rejection_identity_closed_form(void **state) {
    (void)state;
    enum { V = 9 };
    splash_dist p, q;
    splash_dist_init(&p, V);
    splash_dist_init(&q, V);
    int32_t ids[V];
    double w[V];
    for (int trial = 0; trial < 40; trial++) {
        /* p and q with their own zeros: q(x) > 0 = p(x), p(x) > 0 = q(x). */
        int n = 0;
        for (int t = 0; t < V; t++)
            if (t % 3 != 0 || trial % 2) ids[n] = t, w[n++] = rnd01() < 0.2 ? 0 : rnd01();
        w[0] += 0.01;
        assert_int_equal(splash_dist_from_weights(&p, ids, w, n, NULL), 0);
        n = 0;
        for (int t = 0; t < V; t++)
            if (t % 3 != 1) ids[n] = t, w[n++] = rnd01() < 0.2 ? 0 : rnd01() * rnd01();
        w[1] += 0.01;
        assert_int_equal(splash_dist_from_weights(&q, ids, w, n, NULL), 0);
        expect_identity(&p, &q, -1, V);
        expect_identity(&p, NULL, (int32_t)(splitmix() % V), V); /* deterministic draft */
        expect_identity(&p, &p, -1, V);                          /* q == p: always accepted */
    }
    /* The DFlash 2 selector: q = softmax over 4 candidates only. */
    const int32_t cids[4] = {7, 2, 5, 0};
    const float scores[4] = {1.5f, -0.5f, 0.25f, 2.0f};
    assert_int_equal(splash_dist_from_scores(&q, cids, scores, 4, 0.7, NULL), 0);
    assert_int_equal(q.n, 4);
    double z = 0;
    for (int i = 0; i < 4; i++) z += exp(scores[i] / 0.7);
    assert_true(fabs(splash_dist_prob(&q, 7) - exp(1.5 / 0.7) / z) < 1e-12);
    assert_true(splash_dist_prob(&q, 3) == 0);
    for (int t = 0; t < V; t++) ids[t] = t, w[t] = rnd01() + 0.05;
    assert_int_equal(splash_dist_from_weights(&p, ids, w, V, NULL), 0);
    expect_identity(&p, &q, -1, V);
    /* A greedy target accepts only its argmax and otherwise emits it. */
    const float row[V] = {0, 1, 3, 2, 3, 0, 0, 0, 0};
    splash_sampler *s;
    splash_sampler_create(V, &s, NULL);
    splash_sampling_params gp = params(0);
    assert_int_equal(splash_sampler_process(s, &gp, row, NULL, NULL, 0, NULL, &p, NULL), 0);
    assert_true(p.greedy && p.argmax == 2);
    assert_int_equal(splash_spec_accept(&p, &q, 2, 0.999), 1);
    assert_int_equal(splash_spec_accept(&p, &q, 4, 0.0), 0);
    int32_t tok;
    assert_int_equal(splash_spec_verify_row(&p, &q, 7, 1, 1, &tok), 0);
    assert_int_equal(tok, 2);
    assert_int_equal(splash_spec_verify_row(&p, NULL, 2, 1, 1, &tok), 1);
    expect_identity(&p, &q, -1, V);
    splash_sampler_free(s);
    /* Greedy selector: the point mass on the best score, lowest id on ties. */
    const float tie[3] = {1.0f, 2.0f, 2.0f};
    const int32_t tids[3] = {9, 8, 4};
    assert_int_equal(splash_dist_from_scores(&q, tids, tie, 3, 0, NULL), 0);
    assert_true(q.greedy && q.argmax == 4);
    splash_error err = {0};
    const int32_t dup[2] = {3, 3};
    assert_int_equal(splash_dist_from_scores(&q, dup, tie, 2, 1.0, &err), SPLASH_E_INVALID);
    splash_dist_free(&p);
    splash_dist_free(&q);
}

/* 10^6 draft rows: x ~ q with DRAFT, then verify_row (ACCEPT, RESIDUAL); the
 * emitted tokens follow p.  p comes from the pipeline (top_k zeros); one q is
 * full, one is a 4-candidate selector. */
static void run_cycle_gtest(const splash_dist *p, const splash_dist *q, int V, uint64_t seed, double *accept_rate) {
    enum { N = 1000000 };
    long obs[64] = {0}, acc = 0;
    double want[64];
    dense(p, want, V);
    for (long i = 0; i < N; i++) {
        int32_t x = splash_dist_sample(q, splash_rng_uniform(seed, (uint64_t)i, SPLASH_RNG_DRAFT, 0)), tok;
        acc += splash_spec_verify_row(p, q, x, seed, (uint64_t)i, &tok);
        assert_true(tok >= 0 && tok < V);
        obs[tok]++;
    }
    double g = g_stat(obs, want, V, N);
    int df = support(want, V) - 1;
    printf("# cycle G = %.2f (df %d, limit %.1f), accepted %.3f\n", g, df, chi2_upper(df), (double)acc / N);
    assert_true(g < chi2_upper(df));
    /* The same draws against q instead of p must fail (the test has power). */
    double qd[64];
    dense(q, qd, V);
    assert_true(g_stat(obs, qd, V, N) > chi2_upper(df));
    *accept_rate = (double)acc / N;
}

static void test_rejection_identity_sampled(void **state) {
    (void)state;
    enum { V = 10 };
    float row[V];
    for (int t = 0; t < V; t++) row[t] = (float)rnd_normal();
    splash_sampler *s;
    splash_sampler_create(V, &s, NULL);
    splash_sampling_params sp = params(1.0);
    sp.top_k = 6, sp.top_p = 0.95;
    splash_dist p, q;
    splash_dist_init(&p, V);
    splash_dist_init(&q, V);
    assert_int_equal(splash_sampler_process(s, &sp, row, NULL, NULL, 0, NULL, &p, NULL), 0);
    int32_t ids[V];
    double w[V];
    for (int t = 0; t < V; t++) ids[t] = t, w[t] = rnd01();
    assert_int_equal(splash_dist_from_weights(&q, ids, w, V, NULL), 0);
    double full_rate, subset_rate;
    run_cycle_gtest(&p, &q, V, 77, &full_rate);
    /* The closed-form acceptance rate sum_x min(p(x), q(x)) bounds the test. */
    double overlap = 0;
    for (int t = 0; t < V; t++) overlap += fmin(splash_dist_prob(&p, t), splash_dist_prob(&q, t));
    assert_true(fabs(full_rate - overlap) < 0.005);
    int32_t cids[4] = {p.argmax, (p.argmax + 1) % V, (p.argmax + 3) % V, (p.argmax + 5) % V};
    float scores[4] = {1.0f, 0.5f, 0.0f, -0.5f};
    assert_int_equal(splash_dist_from_scores(&q, cids, scores, 4, 1.0, NULL), 0);
    run_cycle_gtest(&p, &q, V, 78, &subset_rate);
    splash_dist_free(&p);
    splash_dist_free(&q);
    splash_sampler_free(s);
}

/* Draft row i of a block sees the proposals before it as output tokens. */
static void test_extra_rows(void **state) {
    (void)state;
    enum { V = 300 };
    float row[V];
    for (int t = 0; t < V; t++) row[t] = (float)rnd_normal();
    splash_token_history h, h2;
    splash_history_init(&h, 8);
    splash_history_init(&h2, 8);
    int32_t prompt[5] = {1, 2, 3, 4, 5}, props[3] = {10, 3, 10};
    splash_history_add(&h, prompt, 5, 1);
    splash_history_add(&h2, prompt, 5, 1);
    splash_history_add(&h2, props, 3, 0);
    splash_sampling_params p = params(0.9);
    p.top_k = 40, p.frequency_penalty = 0.7, p.repetition_penalty = 1.2;
    splash_sampler *s;
    splash_sampler_create(V, &s, NULL);
    splash_dist a, b;
    splash_dist_init(&a, V);
    splash_dist_init(&b, V);
    assert_int_equal(splash_sampler_process(s, &p, row, &h, props, 3, NULL, &a, NULL), 0);
    assert_int_equal(splash_sampler_process(s, &p, row, &h2, NULL, 0, NULL, &b, NULL), 0);
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.ids, b.ids, (size_t)a.n * sizeof *a.ids);
    assert_memory_equal(a.p, b.p, (size_t)a.n * sizeof *a.p);
    int32_t bad[1] = {V};
    assert_int_equal(splash_sampler_process(s, &p, row, &h, bad, 1, NULL, &a, NULL), SPLASH_E_RANGE);
    splash_dist small;
    splash_dist_init(&small, 10);
    splash_error err = {0};
    assert_int_equal(splash_sampler_process(s, &p, row, &h, NULL, 0, NULL, &small, &err), SPLASH_E_RANGE);
    p.top_k = 10;
    assert_int_equal(splash_sampler_process(s, &p, row, &h, NULL, 0, NULL, &small, NULL), 0);
    splash_dist_free(&small);
    splash_dist_free(&a), splash_dist_free(&b);
    splash_history_free(&h), splash_history_free(&h2);
    splash_sampler_free(s);
}

/* ------------------------------------------------------------------------
 * TOP rows: a row known by its best entries decides as the whole row does.
 * ------------------------------------------------------------------------ */

/* The row's best n entries as a model's TOP row: best first, equal values by
 * lower id, -inf / NaN skipped, -1 / -inf past the finite ones. */
static void top_entries(const float *row, int V, int n, int32_t *ids, float *vals) {
    rcand *c = malloc((size_t)V * sizeof *c);
    int m = 0;
    for (int t = 0; t < V; t++)
        if (row[t] > -INFINITY) c[m++] = (rcand){row[t], t};
    qsort(c, (size_t)m, sizeof *c, rcmp);
    for (int i = 0; i < n; i++) {
        ids[i] = i < m ? c[i].id : -1;
        vals[i] = i < m ? (float)c[i].v : -INFINITY;
    }
    free(c);
}

static void test_top_rows(void **state) {
    (void)state;
    enum { N = 64 };
    const int Vs[] = {40, 7000};
    const double Ts[] = {0, 0.3, 1.0, 1.7};
    const int ks[] = {1, 5, 20, 64};
    const double top_ps[] = {1.0, 0.9, 0.5};
    const double min_ps[] = {0, 0.05};
    int32_t ids[N];
    float vals[N];
    int checked = 0;
    for (int vi = 0; vi < 2; vi++) {
        const int V = Vs[vi];
        float *row = malloc((size_t)V * sizeof *row);
        splash_sampler *s;
        assert_int_equal(splash_sampler_create(V, &s, NULL), 0);
        splash_dist full, top;
        assert_int_equal(splash_dist_init(&full, V), 0);
        assert_int_equal(splash_dist_init(&top, V), 0);
        for (int trial = 0; trial < 12; trial++) {
            for (int t = 0; t < V; t++) { /* coarse values: many ties; a few -inf and NaN */
                double u = rnd01();
                row[t] = u < 0.05 ? -INFINITY : u < 0.07 ? NAN : (float)(floor(rnd_normal() * 8) / 4);
            }
            if (trial == 0) /* fewer finite entries than the largest top_k */
                for (int t = 30; t < V; t++) row[t] = -INFINITY;
            top_entries(row, V, N, ids, vals);
            for (size_t a = 0; a < sizeof Ts / sizeof Ts[0]; a++)
                for (size_t b = 0; b < sizeof ks / sizeof ks[0]; b++)
                    for (size_t c = 0; c < sizeof top_ps / sizeof top_ps[0]; c++)
                        for (size_t d = 0; d < sizeof min_ps / sizeof min_ps[0]; d++) {
                            splash_sampling_params p = params(Ts[a]);
                            p.top_k = ks[b], p.top_p = top_ps[c], p.min_p = min_ps[d];
                            const int need = splash_sampling_top_need(&p, V);
                            assert_int_equal(need, Ts[a] == 0 ? 1 : ks[b] < V ? ks[b] : 0);
                            if (!need) continue; /* top_k >= V: no limit, the whole row (checked below) */
                            assert_int_equal(splash_sampler_process(s, &p, row, NULL, NULL, 0, NULL, &full, NULL), 0);
                            assert_int_equal(splash_sampler_process_top(s, &p, ids, vals, N, &top, NULL), 0);
                            assert_int_equal(top.n, full.n);
                            assert_int_equal(top.greedy, full.greedy);
                            assert_int_equal(top.argmax, full.argmax);
                            assert_memory_equal(top.ids, full.ids, (size_t)full.n * sizeof *full.ids);
                            assert_memory_equal(top.p, full.p, (size_t)full.n * sizeof *full.p); /* bit for bit */
                            /* a TOP row of exactly the entries needed decides the same */
                            assert_int_equal(splash_sampler_process_top(s, &p, ids, vals, need, &top, NULL), 0);
                            assert_memory_equal(top.p, full.p, (size_t)full.n * sizeof *full.p);
                            /* one entry fewer is refused, never guessed */
                            splash_error err = {0};
                            if (need > 1) {
                                assert_int_equal(splash_sampler_process_top(s, &p, ids, vals, need - 1, &top, &err),
                                                 SPLASH_E_INVALID);
                                assert_non_null(strstr(err.msg, "needs more"));
                            }
                            checked++;
                        }
        }
        /* nothing finite: both refuse */
        for (int t = 0; t < V; t++) row[t] = -INFINITY;
        top_entries(row, V, N, ids, vals);
        splash_sampling_params p = params(1.0);
        p.top_k = 20;
        assert_int_equal(splash_sampler_process(s, &p, row, NULL, NULL, 0, NULL, &full, NULL), SPLASH_E_INVALID);
        assert_int_equal(splash_sampler_process_top(s, &p, ids, vals, N, &top, NULL), SPLASH_E_INVALID);
        splash_dist_free(&full);
        splash_dist_free(&top);
        splash_sampler_free(s);
        free(row);
    }
    printf("# %d (row, parameters) pairs decided alike from TOP rows\n", checked);
    { /* a NaN first in its lane of a 64-token block once hid the lane's larger values from the block skip */
        float r2[128];
        for (int t = 0; t < 128; t++) r2[t] = t < 64 ? 1.0f : 0.0f;
        r2[65] = NAN, r2[73] = 5.0f; /* lane 1: the final merge starts from lane 0 */
        splash_sampler *s;
        assert_int_equal(splash_sampler_create(128, &s, NULL), 0);
        splash_sampling_params p = params(0);
        int32_t tok = -1;
        assert_int_equal(splash_sample(s, &p, r2, NULL, NULL, 0, NULL, 0, &tok, NULL), 0);
        assert_int_equal(tok, 73);
        splash_sampler_free(s);
    }
    /* requests that need the whole row */
    splash_sampling_params p = params(1.0);
    assert_int_equal(splash_sampling_top_need(&p, 1000), 0); /* no top_k */
    p.top_k = 1000;
    assert_int_equal(splash_sampling_top_need(&p, 1000), 0); /* top_k = vocab: off */
    p.top_k = 20;
    assert_int_equal(splash_sampling_top_need(&p, 1000), 20);
    p.presence_penalty = 0.5;
    assert_int_equal(splash_sampling_top_need(&p, 1000), 0);
    p = params(0);
    p.repetition_penalty = 1.1;
    assert_int_equal(splash_sampling_top_need(&p, 1000), 0);
    p = params(0);
    p.logprobs = 1;
    assert_int_equal(splash_sampling_top_need(&p, 1000), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_rng_keys),
        cmocka_unit_test(test_rng_uniformity),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_history),
        cmocka_unit_test(test_penalties_hand_computed),
        cmocka_unit_test(test_greedy_and_mask),
        cmocka_unit_test(test_filters_hand_computed),
        cmocka_unit_test(test_filters_against_reference),
        cmocka_unit_test(test_sampling_distribution),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_rejection_identity_closed_form),
        cmocka_unit_test(test_rejection_identity_sampled),
        cmocka_unit_test(test_extra_rows),
        cmocka_unit_test(test_top_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
