/* spec.c - proposal selection and acceptance of a speculative cycle (see
 * spec.h).  Thin on purpose: every probability comes from the sampling
 * module's one pipeline (splash_sampler_process) and every coin from its
 * keyed stream, so the cycle cannot drift from plain sampling. */
#include "runtime/spec.h"

int splash_spec_select(splash_sampler *s, splash_dist *q, const splash_sampling_params *sp,
                       const splash_token_history *h, const float *draft, int n, uint64_t pos0, int32_t *props,
                       splash_error *err) {
    const int V = splash_sampler_vocab(s);
    for (int i = 0; i < n; i++) {
        int rc = splash_sampler_process(s, sp, draft + (size_t)i * V, h, props, i, NULL, q, err);
        if (rc) return rc;
        props[i] = q->greedy ? q->argmax : splash_dist_sample(q, splash_rng_uniform(sp->seed, pos0 + (uint64_t)i, SPLASH_RNG_DRAFT, 0));
    }
    return SPLASH_OK;
}

/* q from a sparse draft row; the proposal x must be one of its candidates. */
static int sparse_dist(splash_dist *q, const splash_spec_q *sq, int32_t x, splash_error *err) {
    if (sq->n < 1 || sq->n > SPLASH_SPEC_MAX_CAND)
        return splash_fail(err, SPLASH_E_INVALID, "spec: a draft row with %d candidates", sq->n);
    double w[SPLASH_SPEC_MAX_CAND];
    for (int k = 0; k < sq->n; k++) w[k] = sq->p[k];
    int rc = splash_dist_from_weights(q, sq->ids, w, sq->n, err);
    if (!rc && !(splash_dist_prob(q, x) > 0))
        rc = splash_fail(err, SPLASH_E_INVALID, "spec: the draft proposed %d outside its own q", (int)x);
    return rc;
}

int splash_spec_decide(splash_sampler *s, splash_dist *q, const splash_sampling_params *sp,
                       const splash_token_history *h, const splash_spec_block *b, int32_t *out, splash_error *err) {
    const int V = splash_sampler_vocab(s);
    splash_dist *p = splash_sampler_dist(s);
    for (int i = 0; i <= b->n; i++) {
        const uint64_t pos = b->pos0 + (uint64_t)i;
        if (b->forced) {
            if (b->forced[i] < 0 || b->forced[i] >= V)
                return splash_fail(err, SPLASH_E_RANGE, "spec: forced token %d outside the vocab (%d)", (int)b->forced[i], V);
            splash_dist_point(p, b->forced[i]);
        } else {
            int rc = b->top_ids ? splash_sampler_process_top(s, sp, b->top_ids + (size_t)i * b->top_n,
                                                             b->top_logits + (size_t)i * b->top_n, b->top_n, p, err)
                                : splash_sampler_process(s, sp, b->target + (size_t)i * V, h, b->props, i, NULL, p, err);
            if (rc) return rc;
        }
        if (i == b->n) { /* every proposal stood: the row's own token */
            out[i] = p->greedy ? p->argmax : splash_dist_sample(p, splash_rng_uniform(sp->seed, pos, SPLASH_RNG_SAMPLE, 0));
            return i;
        }
        const splash_dist *qi = NULL; /* deterministic proposal: the point mass */
        if (b->draft && !p->greedy) {
            /* p is the sampler's own buffer: q goes to the caller's */
            int rc = splash_sampler_process(s, sp, b->draft + (size_t)i * V, h, b->props, i, NULL, q, err);
            if (rc) return rc;
            qi = q;
        } else if (b->sparse && !p->greedy) {
            int rc = sparse_dist(q, &b->sparse[i], b->props[i], err);
            if (rc) return rc;
            qi = q;
        }
        if (!splash_spec_verify_row(p, qi, b->props[i], sp->seed, pos, &out[i])) return i;
    }
    return b->n; /* not reached */
}
