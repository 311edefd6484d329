/* sampling.c - parameters, the sampler and its row pipeline, logprobs.
 * Elsewhere: the random stream (sampling_rng.c), histories and penalties
 * (sampling_penalties.c), distributions and the speculative acceptance step
 * (sampling_dist.c).
 *
 * The row pipeline never copies or modifies the logits row.  Penalties touch
 * only tokens that occurred, so they become sparse overrides (a bitset over
 * the vocab plus the new values); the mask is a bitset too.  Every pass over
 * the vocab walks 64 tokens at a time: a block whose values cannot pass the
 * pass's threshold (its maximum, vectorised, is below it) is skipped whole;
 * a block with every token allowed and none overridden runs a plain loop;
 * the others visit their set bits.  Filtering never sorts the vocab:
 *   - greedy / top_k: the running best (a k-entry min-heap; quickselect when
 *     k > 1024) is the threshold, so after the first blocks almost every
 *     block is skipped after one vectorised max;
 *   - min_p: a threshold pass (p >= min_p * p_max is a logit threshold);
 *   - top_p alone: one pass computes the softmax total and the mass in
 *     1/16-nat buckets below the maximum, which locates the bucket holding
 *     the cut; only that bucket (and one more for rounding) is sorted.
 * The surviving candidates become a splash_dist sorted by id.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/sampling.h"

#define HEAP_MAX_K 1024 /* above this top_k uses quickselect instead of a heap */
#define BUCKET_SCALE 16 /* top_p buckets per nat below the maximum */
#define N_BUCKETS 512   /* 32 nats of buckets; the last is open-ended */

/* A candidate: processed logit, id, weight exp((v - vmax) / T). */
typedef struct cand {
    float v;
    int32_t id;
    double w;
} cand;

struct splash_sampler {
    int vocab, n_words;
    uint64_t *ov_bits; /* [n_words] tokens whose logit a penalty overrides */
    float *ov_val;     /* [vocab] their values, meaningful where the bit is set */
    int32_t *ov_ids;   /* [vocab] the overridden ids (to clear the bits) */
    float *ov_tmp;     /* [vocab] values as splash_penalties_sparse lists them */
    int n_ov;
    cand *cand;        /* [2 * vocab] candidates / top-k heap, then scratch */
    splash_dist dist;  /* the sampler's own distribution (splash_sample) */
};

/* ------------------------------------------------------------------------
 * Parameters.
 * ------------------------------------------------------------------------ */
void splash_sampling_params_default(splash_sampling_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0;
    p->top_p = 1.0;
    p->repetition_penalty = 1.0;
}

static int check_range(const char *name, double v, double lo, double hi, splash_error *err) {
    if (!isfinite(v)) return splash_fail(err, SPLASH_E_INVALID, "%s must be a finite number", name);
    if (v < lo || v > hi)
        return splash_fail(err, SPLASH_E_RANGE, "%s must be between %g and %g (got %g)", name, lo, hi, v);
    return SPLASH_OK;
}

int splash_sampling_params_validate(const splash_sampling_params *p, splash_error *err) {
    int rc;
    if ((rc = check_range("temperature", p->temperature, 0, 2, err))) return rc;
    if (!isfinite(p->top_p)) return splash_fail(err, SPLASH_E_INVALID, "top_p must be a finite number");
    if (!(p->top_p > 0 && p->top_p <= 1))
        return splash_fail(err, SPLASH_E_RANGE, "top_p must be greater than 0 and at most 1 (got %g)", p->top_p);
    if (p->top_k < -1)
        return splash_fail(err, SPLASH_E_RANGE, "top_k must be a positive integer, or 0 or -1 for no limit (got %d)",
                           p->top_k);
    if ((rc = check_range("min_p", p->min_p, 0, 1, err))) return rc;
    if ((rc = check_range("presence_penalty", p->presence_penalty, -2, 2, err))) return rc;
    if ((rc = check_range("frequency_penalty", p->frequency_penalty, -2, 2, err))) return rc;
    if (!isfinite(p->repetition_penalty))
        return splash_fail(err, SPLASH_E_INVALID, "repetition_penalty must be a finite number");
    if (!(p->repetition_penalty > 0))
        return splash_fail(err, SPLASH_E_RANGE, "repetition_penalty must be greater than 0 (got %g)",
                           p->repetition_penalty);
    if (p->logprobs != 0 && p->logprobs != 1)
        return splash_fail(err, SPLASH_E_INVALID, "logprobs must be true or false");
    if (p->top_logprobs < 0 || p->top_logprobs > SPLASH_MAX_TOP_LOGPROBS)
        return splash_fail(err, SPLASH_E_RANGE, "top_logprobs must be between 0 and %d (got %d)",
                           SPLASH_MAX_TOP_LOGPROBS, p->top_logprobs);
    return SPLASH_OK;
}

/* ------------------------------------------------------------------------
 * The sampler.
 * ------------------------------------------------------------------------ */
int splash_sampler_create(int vocab, splash_sampler **out, splash_error *err) {
    *out = NULL;
    if (vocab < 1 || vocab > (1 << 30))
        return splash_fail(err, SPLASH_E_RANGE, "sampling: vocab size %d", vocab);
    splash_sampler *s = calloc(1, sizeof *s);
    if (!s) return splash_fail(err, SPLASH_E_NOMEM, "sampling: out of memory");
    s->vocab = vocab;
    s->n_words = (vocab + 63) / 64;
    s->ov_bits = calloc((size_t)s->n_words, sizeof *s->ov_bits);
    s->ov_val = malloc((size_t)vocab * sizeof *s->ov_val);
    s->ov_ids = malloc((size_t)vocab * sizeof *s->ov_ids);
    s->ov_tmp = malloc((size_t)vocab * sizeof *s->ov_tmp);
    s->cand = malloc(2 * (size_t)vocab * sizeof *s->cand);
    if (!s->ov_bits || !s->ov_val || !s->ov_ids || !s->ov_tmp || !s->cand || splash_dist_init(&s->dist, vocab)) {
        splash_sampler_free(s);
        return splash_fail(err, SPLASH_E_NOMEM, "sampling: out of memory for a vocab of %d", vocab);
    }
    *out = s;
    return SPLASH_OK;
}

void splash_sampler_free(splash_sampler *s) {
    if (!s) return;
    free(s->ov_bits);
    free(s->ov_val);
    free(s->ov_ids);
    free(s->ov_tmp);
    free(s->cand);
    splash_dist_free(&s->dist);
    free(s);
}

int splash_sampler_vocab(const splash_sampler *s) { return s->vocab; }
splash_dist *splash_sampler_dist(splash_sampler *s) { return &s->dist; }

/* Max of 64 floats in 8 independent lanes (the compiler vectorises it);
 * NaN in a lane can only make it NaN, which never lets a block be skipped. */
/* NaN never wins (x > m is false), and never hides a larger value: every
 * lane starts at -inf, not at its first value, which may be a NaN. */
static inline float block_max64(const float *x) {
    float m[8];
    for (int j = 0; j < 8; j++) m[j] = -INFINITY;
    for (int i = 0; i < 64; i += 8)
        for (int j = 0; j < 8; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    for (int j = 1; j < 8; j++) m[0] = m[j] > m[0] ? m[j] : m[0];
    return m[0];
}

/* An upper bound of the processed logits of a full block: the raw maximum
 * or an override, whichever is larger. */
static inline float block_bound(const splash_sampler *s, const float *logits, int base, uint64_t ov) {
    float m = block_max64(logits + base);
    while (ov) {
        const float o = s->ov_val[base + __builtin_ctzll(ov)];
        m = o > m ? o : m;
        ov &= ov - 1;
    }
    return m;
}

/* Visits the allowed tokens t of the row in ascending order, with v the
 * processed logit (the penalty override, or the raw logit), running the
 * statements that follow the arguments.  A full block of 64 tokens is
 * skipped whole when an upper bound of its values is <= floor (re-evaluated
 * per block), so the statements must ignore v <= floor themselves: they may
 * still see such tokens in blocks that were not skipped. */
#define FOR_EACH_TOKEN(s, logits, mask, floor, t, v, ...)                                           \
    do {                                                                                           \
        const int vocab_ = (s)->vocab;                                                             \
        for (int w_ = 0; w_ < (s)->n_words; w_++) {                                                \
            const int base_ = w_ * 64, end_ = base_ + 64 < vocab_ ? base_ + 64 : vocab_;           \
            uint64_t allow_ = (mask) ? (mask)[w_] : ~(uint64_t)0;                                  \
            const uint64_t ov_ = (s)->ov_bits[w_];                                                 \
            if (!allow_) continue;                                                                 \
            if (end_ - base_ == 64 && block_bound((s), (logits), base_, ov_) <= (floor)) continue;  \
            if (allow_ == ~(uint64_t)0 && ov_ == 0) {                                              \
                for (int t = base_; t < end_; t++) {                                               \
                    const float v = (logits)[t];                                                   \
                    __VA_ARGS__                                                                    \
                }                                                                                  \
            } else {                                                                               \
                if (end_ - base_ < 64) allow_ &= ((uint64_t)1 << (end_ - base_)) - 1;              \
                while (allow_) {                                                                   \
                    const int t = base_ + __builtin_ctzll(allow_);                                 \
                    allow_ &= allow_ - 1;                                                          \
                    const float v = (ov_ >> (t - base_)) & 1 ? (s)->ov_val[t] : (logits)[t];       \
                    __VA_ARGS__                                                                    \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    } while (0)

static int set_overrides(splash_sampler *s, const splash_sampling_params *p, const float *logits,
                         const splash_token_history *h, const int32_t *extra, int n_extra, splash_error *err) {
    s->n_ov = 0;
    if (!splash_penalties_active(p) || ((!h || h->n == 0) && n_extra == 0)) return SPLASH_OK;
    int n = splash_penalties_sparse(p, h, extra, n_extra, logits, s->vocab, s->ov_ids, s->ov_tmp, err);
    if (n < 0) return n;
    for (int i = 0; i < n; i++) {
        int32_t t = s->ov_ids[i];
        s->ov_val[t] = s->ov_tmp[i];
        s->ov_bits[t >> 6] |= (uint64_t)1 << (t & 63);
    }
    s->n_ov = n;
    return SPLASH_OK;
}

static void clear_overrides(splash_sampler *s) {
    for (int i = 0; i < s->n_ov; i++) s->ov_bits[s->ov_ids[i] >> 6] = 0;
    s->n_ov = 0;
}

/* a ranks before b: higher logit, then lower id. */
static inline int better(const cand *a, const cand *b) { return a->v > b->v || (a->v == b->v && a->id < b->id); }

static int cmp_rank(const void *a, const void *b) {
    return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

static int cmp_id(const void *a, const void *b) {
    int32_t x = ((const cand *)a)->id, y = ((const cand *)b)->id;
    return (x > y) - (x < y);
}

/* Min-heap on rank: the root is the worst of the kept candidates. */
static void heap_sift_down(cand *h, int n, int i) {
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && better(&h[c], &h[c + 1])) c++;
        if (!better(&h[i], &h[c])) return;
        cand t = h[i];
        h[i] = h[c], h[c] = t;
        i = c;
    }
}

static void heap_push(cand *h, int n, cand x) {
    int i = n;
    h[i] = x;
    while (i > 0 && better(&h[(i - 1) / 2], &h[i])) {
        cand t = h[i];
        h[i] = h[(i - 1) / 2], h[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static inline void swap_cand(cand *a, cand *b) {
    cand t = *a;
    *a = *b, *b = t;
}

/* Reorders a[0..n) so that a[0..k) are the k best (in no order). */
static void select_best(cand *a, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (better(&a[mid], &a[lo])) swap_cand(&a[mid], &a[lo]);
        if (better(&a[hi], &a[lo])) swap_cand(&a[hi], &a[lo]);
        if (better(&a[hi], &a[mid])) swap_cand(&a[hi], &a[mid]);
        swap_cand(&a[mid], &a[hi]); /* the median of three is the pivot, at hi */
        int store = lo;
        for (int i = lo; i < hi; i++)
            if (better(&a[i], &a[hi])) swap_cand(&a[i], &a[store++]);
        swap_cand(&a[store], &a[hi]);
        if (store == k - 1) return;
        if (store > k - 1) hi = store - 1;
        else lo = store + 1;
    }
}

/* The k best allowed tokens with logits > -inf, sorted best first. */
static int top_k(splash_sampler *s, const float *logits, const uint64_t *mask, int k) {
    cand *c = s->cand;
    int n = 0;
    if (k <= HEAP_MAX_K) {
        FOR_EACH_TOKEN(s, logits, mask, n < k ? -INFINITY : c[0].v, t, v, {
            if (n < k) {
                if (v > -INFINITY) heap_push(c, n++, (cand){v, t, 0});
            } else if (v > c[0].v) { /* ties lose: t is above every id in the heap */
                c[0] = (cand){v, t, 0};
                heap_sift_down(c, n, 0);
            }
        });
    } else {
        FOR_EACH_TOKEN(s, logits, mask, -INFINITY, t, v, {
            if (v > -INFINITY) c[n++] = (cand){v, t, 0};
        });
        if (n > k) {
            select_best(c, n, k);
            n = k;
        }
    }
    qsort(c, (size_t)n, sizeof *c, cmp_rank);
    return n;
}

static inline double weight(float v, double vmax, double temperature) {
    return exp(((double)v - vmax) / temperature);
}

/* Keeps the shortest best-first prefix of c whose mass reaches top_p * total;
 * c is sorted best first.  All of c when rounding never reaches it. */
static int cut_top_p(const cand *c, int n, double top_p, double total) {
    const double target = top_p * total;
    double acc = 0;
    for (int i = 0; i < n; i++) {
        acc += c[i].w;
        if (acc >= target) return i + 1;
    }
    return n;
}

static int no_token(splash_error *err) {
    return splash_fail(err, SPLASH_E_INVALID,
                       "sampling: no token can be chosen (every token is masked or has a -inf/NaN logit)");
}

static inline int bucket_of(double x) { /* x = (v - vmax) / T <= 0 */
    return -x < (double)N_BUCKETS / BUCKET_SCALE ? (int)(-x * BUCKET_SCALE) : N_BUCKETS - 1;
}

/* top_p without top_k or min_p, never sorting the vocab.  One pass sums the
 * softmax total and the mass of each bucket (1/16 nat wide) below the
 * maximum; the first bucket B where the running mass reaches top_p holds the
 * cut.  Tokens in buckets < B are kept; those in B and B + 1 (slack for
 * summation-order rounding) are sorted by rank and cut exactly; the result
 * stays in id order.  Returns the count. */
static int top_p_alone(splash_sampler *s, const splash_sampling_params *p, const float *logits,
                       const uint64_t *mask, double vmax) {
    const double T = p->temperature;
    double mass[N_BUCKETS] = {0}, total = 0;
    FOR_EACH_TOKEN(s, logits, mask, -INFINITY, t, v, {
        if (v > -INFINITY) {
            double x = ((double)v - vmax) / T, e = exp(x);
            total += e;
            mass[bucket_of(x)] += e;
        }
    });
    const double target = p->top_p * total;
    int cut_b = N_BUCKETS - 1;
    double acc = 0;
    for (int b = 0; b < N_BUCKETS; b++) {
        acc += mass[b];
        if (acc >= target) {
            cut_b = b;
            break;
        }
    }
    const int last = cut_b + 1 < N_BUCKETS ? cut_b + 1 : cut_b;
    const float floor_v = last == N_BUCKETS - 1 ? -INFINITY
                        : (float)(vmax - T * (last + 1.0) / BUCKET_SCALE) - 1e-3f * (1.0f + fabsf((float)vmax));
    cand *c = s->cand, *edge = s->cand + s->vocab; /* the second half holds the boundary buckets */
    int n = 0, n_edge = 0;
    double sure = 0;
    FOR_EACH_TOKEN(s, logits, mask, floor_v, t, v, {
        if (v > -INFINITY) {
            double x = ((double)v - vmax) / T;
            int b = bucket_of(x);
            if (b <= last) {
                c[n] = (cand){v, t, exp(x)};
                if (b < cut_b) sure += c[n].w;
                else edge[n_edge++] = c[n];
                n++;
            }
        }
    });
    qsort(edge, (size_t)n_edge, sizeof *edge, cmp_rank);
    int keep = n_edge;
    acc = sure;
    for (int i = 0; i < n_edge; i++) {
        acc += edge[i].w;
        if (acc >= target) {
            keep = i + 1;
            break;
        }
    }
    if (sure >= target) keep = 0; /* rounding: the sure buckets already reach it */
    if (keep == n_edge) return n;
    /* Drop the boundary tokens ranked after the last kept one. */
    const cand *lastk = keep ? &edge[keep - 1] : NULL;
    int m = 0;
    for (int i = 0; i < n; i++) {
        int b = bucket_of(((double)c[i].v - vmax) / T);
        if (b < cut_b || (lastk && !better(lastk, &c[i]))) c[m++] = c[i];
    }
    return m;
}

/* The filters after the candidates are gathered: c[0..n) either the top_k
 * best first (by_id 0) or every survivor in id order (by_id 1), vmax the
 * row's maximum.  Weights, min_p, top_p, then id order.  Returns the count. */
static int filter_tail(const splash_sampling_params *p, cand *c, int n, double vmax, int by_id) {
    const double T = p->temperature;
    for (int i = 0; i < n; i++) c[i].w = weight(c[i].v, vmax, T);
    if (p->min_p > 0.0) { /* keeps the order; the best candidate has w = 1 >= min_p */
        int m = 0;
        for (int i = 0; i < n; i++)
            if (c[i].w >= p->min_p) c[m++] = c[i];
        n = m;
    }
    if (p->top_p < 1.0) {
        if (by_id) qsort(c, (size_t)n, sizeof *c, cmp_rank);
        by_id = 0;
        double total = 0;
        for (int i = 0; i < n; i++) total += c[i].w;
        n = cut_top_p(c, n, p->top_p, total);
    }
    if (!by_id) qsort(c, (size_t)n, sizeof *c, cmp_id);
    return n;
}

/* The filters of a sampled row: candidates into s->cand, with weights.
 * Returns the count (>= 1) or a negative status. */
static int filter_row(splash_sampler *s, const splash_sampling_params *p, const float *logits,
                      const uint64_t *mask, splash_error *err) {
    const double T = p->temperature;
    const int k = p->top_k > 0 && p->top_k < s->vocab ? p->top_k : 0;
    const int use_top_p = p->top_p < 1.0, use_min_p = p->min_p > 0.0;
    cand *c = s->cand;
    int n = 0, by_id;
    double vmax;
    if (k) {
        n = top_k(s, logits, mask, k);
        if (n == 0) return no_token(err);
        vmax = c[0].v;
        by_id = 0;
    } else {
        float best = -INFINITY;
        FOR_EACH_TOKEN(s, logits, mask, best, t, v, {
            if (v > best) best = v;
        });
        if (!(best > -INFINITY)) return no_token(err);
        vmax = best;
        by_id = 1;
    }
    if (isinf(vmax)) return splash_fail(err, SPLASH_E_RANGE, "sampling: the logits contain +inf");
    if (!k) {
        if (use_min_p) {
            /* p >= min_p * p_max  <=>  (v - vmax) / T >= log(min_p); gathered with
             * slack, decided exactly on the weights below. */
            const double floor_x = log(p->min_p) - 1e-6;
            const float floor_v = (float)(vmax + T * floor_x) - 1e-3f * (1.0f + fabsf((float)vmax));
            FOR_EACH_TOKEN(s, logits, mask, floor_v, t, v, {
                if (((double)v - vmax) / T >= floor_x) c[n++] = (cand){v, t, 0};
            });
        } else if (use_top_p) {
            n = top_p_alone(s, p, logits, mask, vmax);
            return n;
        } else {
            FOR_EACH_TOKEN(s, logits, mask, -INFINITY, t, v, {
                if (v > -INFINITY) c[n++] = (cand){v, t, 0};
            });
        }
    }
    return filter_tail(p, c, n, vmax, by_id);
}

/* The candidates of a filtered row into out. */
static int to_dist(splash_sampler *s, int n, splash_dist *out, splash_error *err) {
    if (n > out->cap)
        return splash_fail(err, SPLASH_E_RANGE, "sampling: %d candidates for a distribution of capacity %d", n, out->cap);
    for (int i = 0; i < n; i++) {
        out->ids[i] = s->cand[i].id;
        out->p[i] = s->cand[i].w;
    }
    return splash_dist_normalise(out, n, err);
}

int splash_sampling_top_need(const splash_sampling_params *p, int vocab) {
    if (splash_penalties_active(p) || p->logprobs) return 0;
    if (p->temperature == 0) return 1;
    return p->top_k > 0 && p->top_k < vocab ? p->top_k : 0;
}

int splash_sampler_process_top(splash_sampler *s, const splash_sampling_params *p, const int32_t *ids,
                               const float *vals, int n, splash_dist *out, splash_error *err) {
    if (!out) out = &s->dist;
    const int need = splash_sampling_top_need(p, s->vocab);
    if (need < 1 || need > n)
        return splash_fail(err, SPLASH_E_INVALID, "sampling: the request needs %s, the row holds its best %d",
                           need ? "more of the row" : "the whole row", n);
    int m = 0; /* the finite entries (the model writes them first) */
    while (m < need && ids[m] >= 0 && ids[m] < s->vocab && vals[m] > -INFINITY) m++;
    if (!m) return no_token(err);
    if (p->temperature == 0) {
        splash_dist_point(out, ids[0]);
        return SPLASH_OK;
    }
    if (isinf(vals[0])) return splash_fail(err, SPLASH_E_RANGE, "sampling: the logits contain +inf");
    cand *c = s->cand; /* what top_k() gathers from the whole row: the same entries in the same order */
    for (int i = 0; i < m; i++) c[i] = (cand){vals[i], ids[i], 0};
    return to_dist(s, filter_tail(p, c, m, c[0].v, 0), out, err);
}

int splash_sampler_process(splash_sampler *s, const splash_sampling_params *p, const float *logits,
                           const splash_token_history *h, const int32_t *extra, int n_extra,
                           const uint64_t *mask, splash_dist *out, splash_error *err) {
    if (!out) out = &s->dist;
    if (n_extra < 0 || n_extra > SPLASH_SAMPLING_MAX_EXTRA)
        return splash_fail(err, SPLASH_E_RANGE, "sampling: %d extra tokens (at most %d)", n_extra,
                           SPLASH_SAMPLING_MAX_EXTRA);
    for (int j = 0; j < n_extra; j++)
        if (extra[j] < 0 || extra[j] >= s->vocab)
            return splash_fail(err, SPLASH_E_RANGE, "sampling: extra token %d outside the vocab (%d)",
                               (int)extra[j], s->vocab);
    if (!(p->temperature >= 0))
        return splash_fail(err, SPLASH_E_RANGE, "sampling: temperature %g", p->temperature);
    int rc = set_overrides(s, p, logits, h, extra, n_extra, err);
    if (rc) return rc;
    if (p->temperature == 0) {
        float best = -INFINITY;
        int32_t arg = -1;
        FOR_EACH_TOKEN(s, logits, mask, best, t, v, {
            if (v > best) best = v, arg = t; /* strict: ties keep the lowest id */
        });
        if (arg < 0) rc = no_token(err);
        else splash_dist_point(out, arg);
    } else {
        int n = filter_row(s, p, logits, mask, err);
        rc = n < 0 ? n : to_dist(s, n, out, err);
    }
    clear_overrides(s);
    return rc;
}

int splash_sample(splash_sampler *s, const splash_sampling_params *p, const float *logits,
                  const splash_token_history *h, const int32_t *extra, int n_extra,
                  const uint64_t *mask, uint64_t position, int32_t *token, splash_error *err) {
    int rc = splash_sampler_process(s, p, logits, h, extra, n_extra, mask, &s->dist, err);
    if (rc) return rc;
    *token = s->dist.greedy ? s->dist.argmax
                            : splash_dist_sample(&s->dist, splash_rng_uniform(p->seed, position, SPLASH_RNG_SAMPLE, 0));
    return SPLASH_OK;
}

int splash_sampler_logprobs(splash_sampler *s, const float *logits, int32_t token, int n_top,
                            splash_logprobs *out, splash_error *err) {
    const int V = s->vocab;
    if (token < 0 || token >= V)
        return splash_fail(err, SPLASH_E_RANGE, "sampling: token %d outside the vocab (%d)", (int)token, V);
    if (n_top < 0 || n_top > SPLASH_MAX_TOP_LOGPROBS)
        return splash_fail(err, SPLASH_E_RANGE, "top_logprobs must be between 0 and %d (got %d)",
                           SPLASH_MAX_TOP_LOGPROBS, n_top);
    float mx = -INFINITY; /* no overrides are set between rows: this is the raw row */
    FOR_EACH_TOKEN(s, logits, (const uint64_t *)NULL, mx, t, v, {
        if (v > mx) mx = v;
    });
    if (isinf(mx) && mx > 0) return splash_fail(err, SPLASH_E_RANGE, "sampling: the logits contain +inf");
    double sum = 0;
    if (mx > -INFINITY)
        for (int t = 0; t < V; t++)
            if (logits[t] > -INFINITY) sum += exp((double)logits[t] - mx);
    const double lse = (double)mx + log(sum);
    out->token = token;
    out->logprob = logits[token] > -INFINITY ? (float)((double)logits[token] - lse) : -INFINITY;
    out->n_top = 0;
    if (n_top > 0 && mx > -INFINITY) {
        int n = top_k(s, logits, NULL, n_top);
        for (int i = 0; i < n; i++) {
            out->top_ids[i] = s->cand[i].id;
            out->top_logprobs[i] = (float)((double)s->cand[i].v - lse);
        }
        out->n_top = n;
    }
    return SPLASH_OK;
}
