/* sampling_dist.c - sparse distributions and the speculative acceptance
 * step (lossless rejection sampling) of the DFlash cycle.
 *
 * A distribution lists its candidates in ascending id order, so p(x) is a
 * binary search, the residual max(p - q, 0) is one merge walk over p and q
 * (q may cover any subset: the DFlash 2 selector's 16 candidates), and the
 * inverse-CDF walk has one defined order on every backend.  No allocation:
 * the buffers are the caller's.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/sampling.h"

/* ------------------------------------------------------------------------
 * Distributions.
 * ------------------------------------------------------------------------ */
int splash_dist_init(splash_dist *d, int cap) {
    memset(d, 0, sizeof *d);
    if (cap < 1) return SPLASH_E_INVALID;
    d->ids = malloc((size_t)cap * sizeof *d->ids);
    d->p = malloc((size_t)cap * sizeof *d->p);
    if (!d->ids || !d->p) {
        splash_dist_free(d);
        return SPLASH_E_NOMEM;
    }
    d->cap = cap;
    d->argmax = -1;
    return SPLASH_OK;
}

void splash_dist_free(splash_dist *d) {
    free(d->ids);
    free(d->p);
    memset(d, 0, sizeof *d);
}

double splash_dist_prob(const splash_dist *d, int32_t token) {
    int lo = 0, hi = d->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (d->ids[mid] < token) lo = mid + 1;
        else hi = mid;
    }
    return lo < d->n && d->ids[lo] == token ? d->p[lo] : 0.0;
}

int32_t splash_dist_sample(const splash_dist *d, double u) {
    if (d->greedy) return d->argmax;
    const double target = u * d->sum;
    double acc = 0;
    for (int i = 0; i < d->n; i++) {
        acc += d->p[i];
        if (acc > target) return d->ids[i];
    }
    return d->n ? d->ids[d->n - 1] : -1; /* u * sum rounded up to sum */
}

void splash_dist_point(splash_dist *d, int32_t token) {
    d->n = 1;
    d->ids[0] = token;
    d->p[0] = 1.0;
    d->sum = 1.0;
    d->argmax = token;
    d->greedy = 1;
}

int splash_dist_normalise(splash_dist *d, int n, splash_error *err) {
    double total = 0;
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (!(d->p[i] > 0)) continue;
        d->ids[m] = d->ids[i];
        d->p[m] = d->p[i];
        total += d->p[m++];
    }
    if (m == 0 || !isfinite(total))
        return splash_fail(err, SPLASH_E_INVALID, "sampling: the distribution has no finite positive weight");
    double sum = 0, best = -1;
    int32_t arg = -1;
    for (int i = 0; i < m; i++) {
        d->p[i] /= total;
        sum += d->p[i];
        if (d->p[i] > best) best = d->p[i], arg = d->ids[i];
    }
    d->n = m;
    d->sum = sum;
    d->argmax = arg;
    d->greedy = 0;
    return SPLASH_OK;
}

/* Heapsort of the pairs (ids[i], w[i]) by id. */
static void sift_pair(int32_t *ids, double *w, int root, int n) {
    for (;;) {
        int c = 2 * root + 1;
        if (c >= n) return;
        if (c + 1 < n && ids[c + 1] > ids[c]) c++;
        if (ids[root] >= ids[c]) return;
        int32_t ti = ids[root];
        ids[root] = ids[c], ids[c] = ti;
        double tw = w[root];
        w[root] = w[c], w[c] = tw;
        root = c;
    }
}

static void sort_pairs_by_id(int32_t *ids, double *w, int n) {
    for (int i = n / 2 - 1; i >= 0; i--) sift_pair(ids, w, i, n);
    for (int end = n - 1; end > 0; end--) {
        int32_t ti = ids[0];
        ids[0] = ids[end], ids[end] = ti;
        double tw = w[0];
        w[0] = w[end], w[end] = tw;
        sift_pair(ids, w, 0, end);
    }
}

static int load_pairs(splash_dist *d, const int32_t *ids, int n, splash_error *err) {
    if (n < 1 || n > d->cap)
        return splash_fail(err, SPLASH_E_RANGE, "sampling: %d candidates for a distribution of capacity %d", n,
                           d->cap);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0) return splash_fail(err, SPLASH_E_RANGE, "sampling: negative token id %d", (int)ids[i]);
        d->ids[i] = ids[i];
    }
    return SPLASH_OK;
}

static int sort_and_check(splash_dist *d, int n, splash_error *err) {
    sort_pairs_by_id(d->ids, d->p, n);
    for (int i = 1; i < n; i++)
        if (d->ids[i] == d->ids[i - 1])
            return splash_fail(err, SPLASH_E_INVALID, "sampling: token %d listed twice", (int)d->ids[i]);
    return SPLASH_OK;
}

int splash_dist_from_scores(splash_dist *d, const int32_t *ids, const float *scores, int n,
                            double temperature, splash_error *err) {
    int rc = load_pairs(d, ids, n, err);
    if (rc) return rc;
    if (!(temperature >= 0) || !isfinite(temperature))
        return splash_fail(err, SPLASH_E_RANGE, "sampling: temperature %g", temperature);
    double smax = -INFINITY;
    for (int i = 0; i < n; i++) {
        d->p[i] = scores[i];
        if (scores[i] > smax) smax = scores[i];
    }
    if ((rc = sort_and_check(d, n, err))) return rc;
    if (!(smax > -INFINITY) || isinf(smax))
        return splash_fail(err, SPLASH_E_INVALID, "sampling: no finite candidate score");
    if (temperature == 0) {
        for (int i = 0; i < n; i++)
            if (d->p[i] == smax) { /* ascending ids: the first is the lowest */
                splash_dist_point(d, d->ids[i]);
                return SPLASH_OK;
            }
    }
    for (int i = 0; i < n; i++) d->p[i] = d->p[i] > -INFINITY ? exp((d->p[i] - smax) / temperature) : 0.0;
    return splash_dist_normalise(d, n, err);
}

int splash_dist_from_weights(splash_dist *d, const int32_t *ids, const double *weights, int n,
                             splash_error *err) {
    int rc = load_pairs(d, ids, n, err);
    if (rc) return rc;
    for (int i = 0; i < n; i++) {
        if (!(weights[i] >= 0) || !isfinite(weights[i]))
            return splash_fail(err, SPLASH_E_INVALID, "sampling: weight %g of token %d", weights[i], (int)ids[i]);
        d->p[i] = weights[i];
    }
    if ((rc = sort_and_check(d, n, err))) return rc;
    return splash_dist_normalise(d, n, err);
}

/* ------------------------------------------------------------------------
 * Speculative acceptance.
 * ------------------------------------------------------------------------ */
int splash_spec_accept(const splash_dist *p, const splash_dist *q, int32_t x, double u) {
    if (p->greedy) return x == p->argmax;
    const double qx = q ? splash_dist_prob(q, x) : 1.0;
    return u * qx < splash_dist_prob(p, x);
}

/* max(p_i - q(id_i), 0) for p's candidates in order; j walks q's ids. */
static inline double residual_at(const splash_dist *p, const splash_dist *q, int32_t x, int i, int *j) {
    const int32_t id = p->ids[i];
    double qv;
    if (q) {
        while (*j < q->n && q->ids[*j] < id) (*j)++;
        qv = *j < q->n && q->ids[*j] == id ? q->p[*j] : 0.0;
    } else {
        qv = id == x ? 1.0 : 0.0;
    }
    const double r = p->p[i] - qv;
    return r > 0 ? r : 0.0;
}

int32_t splash_spec_residual(const splash_dist *p, const splash_dist *q, int32_t x, double u) {
    if (p->greedy) return p->argmax;
    double total = 0;
    int j = 0;
    for (int i = 0; i < p->n; i++) total += residual_at(p, q, x, i, &j);
    if (!(total > 0)) return splash_dist_sample(p, u);
    const double target = u * total;
    double acc = 0;
    int32_t last = -1;
    j = 0;
    for (int i = 0; i < p->n; i++) {
        const double r = residual_at(p, q, x, i, &j);
        if (r > 0) {
            acc += r;
            last = p->ids[i];
            if (acc > target) return last;
        }
    }
    return last;
}

int splash_spec_verify_row(const splash_dist *p, const splash_dist *q, int32_t x, uint64_t seed,
                           uint64_t position, int32_t *token) {
    const double u = p->greedy ? 0.0 : splash_rng_uniform(seed, position, SPLASH_RNG_ACCEPT, 0);
    if (splash_spec_accept(p, q, x, u)) {
        *token = x;
        return 1;
    }
    *token = splash_spec_residual(p, q, x, p->greedy ? 0.0 : splash_rng_uniform(seed, position, SPLASH_RNG_RESIDUAL, 0));
    return 0;
}
