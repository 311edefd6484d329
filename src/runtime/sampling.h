/* sampling.h - turning one row of logits into a token, and the speculative
 * acceptance step built on it.
 *
 * Used by the server (parameter validation, logprobs), the runtime (sampling
 * the next token of every lane) and the DFlash cycle (draft proposals,
 * lossless rejection sampling).  Shaped by three constraints:
 *
 *   - No allocation per row.  A splash_sampler is created once for a vocab
 *     size and owns all scratch; distributions (splash_dist) are caller-owned
 *     buffers of a fixed capacity; token histories grow only when a request
 *     sees a token it never saw before (amortised, NULL-checked).
 *   - Batch invariance.  Every random number is a pure function of
 *     (request seed, position, purpose, index) - Philox4x32-10, see
 *     splash_rng_uniform - so a request's tokens never depend on its batch
 *     neighbours, on the thread, or on how many draws other code made.
 *   - One processed distribution per row.  The pipeline (mask, penalties,
 *     temperature, min_p, top_k, top_p) produces a sparse distribution p
 *     over candidate ids; plain sampling, the acceptance test and the
 *     residual of rejection sampling all read that one object, so the DFlash
 *     cycle and plain decoding cannot disagree.
 *
 * Conventions (docs/sampling.md has the reasoning):
 *   - repetition_penalty (HF/vLLM): over tokens seen in the prompt or the
 *     output, positive logits are divided by it, others multiplied.
 *   - presence/frequency (OpenAI/vLLM): over output tokens only,
 *     logit -= frequency * count, then -= presence * (count > 0).
 *     Repetition is applied first.
 *   - order: mask, penalties, temperature, min_p, top_k, top_p (vLLM's);
 *     top_p is measured on the distribution renormalised after min_p/top_k.
 *   - temperature 0 = greedy: argmax of the processed logits, ties to the
 *     lowest id; no filter and no random number is involved.
 *   - logprobs report the raw model log-softmax (before mask, penalties and
 *     temperature), as OpenAI and vLLM (its default) do.
 *   - ties anywhere (top_k boundary, argmax) go to the lowest token id.
 */
#ifndef SPLASH_SAMPLING_H
#define SPLASH_SAMPLING_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* ------------------------------------------------------------------------
 * The keyed random stream.
 *
 * splash_rng_uniform(seed, position, purpose, index) =
 *     w = Philox4x32-10(counter = {index, purpose, lo32(position), hi32(position)},
 *                       key     = {lo32(seed), hi32(seed)})
 *     u = ((w[0] >> 5) * 2^26 + (w[1] >> 6)) * 2^-53        (in [0, 1), 53 bits)
 * splash_rng_uniform_f32: u = (w[0] >> 8) * 2^-24          (in [0, 1), 24 bits)
 * Philox4x32-10 is Random123's (Salmon et al., SC'11): multipliers
 * 0xD2511F53, 0xCD9E8D57, Weyl key increments 0x9E3779B9, 0xBB67AE85, ten
 * rounds; integer arithmetic only, so a CUDA kernel reproduces it bit for bit
 * (the conversions are exact in double / float).
 *
 * position = the index in the request's sequence of the token being decided
 * (the prompt holds 0..n_prompt-1, so the first generated token has position
 * n_prompt).  index distinguishes several draws for the same decision
 * (0 for everything in this module).
 * ------------------------------------------------------------------------ */
enum splash_rng_purpose {
    SPLASH_RNG_SAMPLE = 1,   /* the target's own token (plain decoding, bonus row) */
    SPLASH_RNG_ACCEPT = 2,   /* the rejection-sampling coin of a draft row */
    SPLASH_RNG_RESIDUAL = 3, /* the replacement drawn from max(p - q, 0) */
    SPLASH_RNG_DRAFT = 4,    /* the draft's own sampling of its proposal */
};

void splash_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
double splash_rng_uniform(uint64_t seed, uint64_t position, uint32_t purpose, uint32_t index);
float splash_rng_uniform_f32(uint64_t seed, uint64_t position, uint32_t purpose, uint32_t index);

/* ------------------------------------------------------------------------
 * Parameters.
 * ------------------------------------------------------------------------ */
#define SPLASH_MAX_TOP_LOGPROBS 20
#define SPLASH_SAMPLING_MAX_EXTRA 64 /* most "as if appended" tokens (a draft block) */

typedef struct splash_sampling_params {
    double temperature;        /* [0, 2]; 0 = greedy */
    int top_k;                 /* >= 0, or -1; 0 and -1 = off */
    double top_p;              /* (0, 1]; 1 = off */
    double min_p;              /* [0, 1]; 0 = off */
    double presence_penalty;   /* [-2, 2]; 0 = off; output tokens only */
    double frequency_penalty;  /* [-2, 2]; 0 = off; output tokens only */
    double repetition_penalty; /* > 0; 1 = off; prompt + output tokens */
    uint64_t seed;             /* the server draws one when the request has none */
    int seed_given;            /* the request named its seed: its output must be reproducible (an "auto"
                                  block keeps the engine's block for it, block_policy.h) */
    int logprobs;              /* 1 = report the chosen token's logprob */
    int top_logprobs;          /* [0, SPLASH_MAX_TOP_LOGPROBS] alternatives */
} splash_sampling_params;

/* Neutral values: temperature 1, top_p 1, everything else off, seed 0.
 * (The server then applies the model's defaults, e.g. top_p 0.95, top_k 20.) */
void splash_sampling_params_default(splash_sampling_params *p);

/* Checks every range above.  On failure returns SPLASH_E_RANGE (or
 * SPLASH_E_INVALID for a non-number) with a message that starts with the
 * OpenAI parameter name, e.g. "temperature must be between 0 and 2 (got 3)". */
int splash_sampling_params_validate(const splash_sampling_params *p, splash_error *err);

/* ------------------------------------------------------------------------
 * Token history: counts per distinct token, for the penalties.
 *
 * A dense array of entries plus an open-addressing index, so applying the
 * penalties costs O(distinct tokens), never O(vocab).  Growth reallocates
 * (doubling) when a new distinct token arrives; init with a capacity hint to
 * avoid it.
 * ------------------------------------------------------------------------ */
typedef struct splash_history_entry {
    int32_t token;
    uint32_t n_prompt; /* occurrences in the prompt */
    uint32_t n_output; /* occurrences in the generated output */
} splash_history_entry;

typedef struct splash_token_history {
    int n, cap;                     /* distinct tokens, capacity of entries */
    splash_history_entry *entries;  /* [cap], first n used, in arrival order */
    int32_t *index;                 /* [index_cap]: entry + 1, 0 = empty */
    int index_cap;                  /* power of two, >= 2 * cap */
} splash_token_history;

int splash_history_init(splash_token_history *h, int capacity_hint); /* SPLASH_E_NOMEM */
void splash_history_free(splash_token_history *h);
void splash_history_clear(splash_token_history *h);
/* Records tokens (>= 0) as prompt (is_prompt = 1) or output tokens. */
int splash_history_add(splash_token_history *h, const int32_t *tokens, int n, int is_prompt);
/* The entry of a token, or NULL if never seen. */
const splash_history_entry *splash_history_find(const splash_token_history *h, int32_t token);

/* Whether any penalty is not neutral. */
int splash_penalties_active(const splash_sampling_params *p);

/* Penalised values of the affected tokens, as if `extra` (n_extra <=
 * SPLASH_SAMPLING_MAX_EXTRA output tokens) had been appended to h (h may be
 * NULL): for every distinct token of h and extra, ids[i] and values[i]
 * computed from logits[ids[i]].  ids/values need room for h->n + n_extra.
 * Returns the count, or a negative status when a token is outside
 * [0, vocab). */
int splash_penalties_sparse(const splash_sampling_params *p, const splash_token_history *h,
                            const int32_t *extra, int n_extra, const float *logits, int vocab,
                            int32_t *ids, float *values, splash_error *err);
/* The same, written into the row in place. */
int splash_penalties_apply(float *logits, int vocab, const splash_sampling_params *p,
                           const splash_token_history *h, const int32_t *extra, int n_extra,
                           splash_error *err);

/* ------------------------------------------------------------------------
 * Distributions: the processed p of a row, or a draft's q.
 *
 * Sparse: candidates in ascending id order with their probabilities (double,
 * summing to 1 up to rounding).  Tokens not listed have probability 0.  A
 * greedy distribution is the point mass on argmax.
 * ------------------------------------------------------------------------ */
typedef struct splash_dist {
    int n, cap;
    int32_t *ids;   /* [cap] ascending */
    double *p;      /* [cap] */
    double sum;     /* sum of p[0..n) in id order (the sampling walk's total) */
    int32_t argmax; /* most probable candidate, lowest id on ties */
    int greedy;     /* 1: the point mass of a temperature-0 row */
} splash_dist;

int splash_dist_init(splash_dist *d, int cap); /* SPLASH_E_NOMEM */
void splash_dist_free(splash_dist *d);
/* The point mass on token (a greedy row, a deterministic draft). */
void splash_dist_point(splash_dist *d, int32_t token);
/* For a caller that filled ids[0..n) (ascending, distinct) and p[0..n) with
 * non-negative weights: drops zero weights, normalises, sets sum and argmax.
 * Fails when no weight is positive and finite. */
int splash_dist_normalise(splash_dist *d, int n, splash_error *err);
/* p(token), 0 when not a candidate (binary search). */
double splash_dist_prob(const splash_dist *d, int32_t token);
/* Inverse CDF in ascending id order: the first candidate whose cumulative
 * probability exceeds u * sum. */
int32_t splash_dist_sample(const splash_dist *d, double u);
/* q = softmax(scores / temperature) over n given candidates (any order,
 * distinct ids); temperature 0 = point mass on the best score (lowest id on
 * ties).  For the DFlash 2 selector, whose q covers only its candidates. */
int splash_dist_from_scores(splash_dist *d, const int32_t *ids, const float *scores, int n,
                            double temperature, splash_error *err);
/* A distribution from given non-negative weights (normalised here). */
int splash_dist_from_weights(splash_dist *d, const int32_t *ids, const double *weights, int n,
                             splash_error *err);

/* ------------------------------------------------------------------------
 * The sampler: scratch for one vocab size, and the row pipeline.
 *
 * A token mask is a bitset of (vocab + 63) / 64 words: bit (t % 64) of word
 * t / 64 set = token t allowed.  NULL = all allowed.
 * ------------------------------------------------------------------------ */
typedef struct splash_sampler splash_sampler;

int splash_sampler_create(int vocab, splash_sampler **out, splash_error *err);
void splash_sampler_free(splash_sampler *s);
int splash_sampler_vocab(const splash_sampler *s);
/* The sampler's own distribution buffer (what splash_sample fills). */
splash_dist *splash_sampler_dist(splash_sampler *s);

/* Processes one row of logits [vocab] (not modified) into out (cap >= vocab;
 * NULL = the sampler's own): mask, penalties from h as if extra[0..n_extra)
 * were appended (DFlash draft row i: the proposals before it), temperature,
 * filters.  Fails with SPLASH_E_INVALID when no token is left (all masked,
 * -inf or NaN) and SPLASH_E_RANGE on +inf logits when sampling. */
int splash_sampler_process(splash_sampler *s, const splash_sampling_params *p, const float *logits,
                           const splash_token_history *h, const int32_t *extra, int n_extra,
                           const uint64_t *mask, splash_dist *out, splash_error *err);

/* How many of a row's best logits decide this request's rows: 1 for greedy,
 * top_k when top_k limits the candidates (the other filters then act on those
 * only), 0 when the whole row is needed (penalties, logprobs, no top_k).  A
 * model's TOP rows (runtime/model.h) of at least that many entries then
 * replace the logits. */
int splash_sampling_top_need(const splash_sampling_params *p, int vocab);

/* splash_sampler_process of a row known only by its top n logits (ids and
 * values best first, equal values by lower id, -1 / -inf past the finite
 * ones: a TOP row), with no history, extra tokens or mask: the same
 * distribution, bit for bit, when 1 <= splash_sampling_top_need(p) <= n.
 * SPLASH_E_INVALID when the request needs more than the row holds. */
int splash_sampler_process_top(splash_sampler *s, const splash_sampling_params *p, const int32_t *ids,
                               const float *vals, int n, splash_dist *out, splash_error *err);

/* process + draw with (p->seed, position, SPLASH_RNG_SAMPLE, 0); greedy rows
 * draw nothing. */
int splash_sample(splash_sampler *s, const splash_sampling_params *p, const float *logits,
                  const splash_token_history *h, const int32_t *extra, int n_extra,
                  const uint64_t *mask, uint64_t position, int32_t *token, splash_error *err);

/* Raw log-softmax of the row: logprob of `token` and the n_top most likely
 * tokens (descending, lowest id on ties).  Tokens with -inf or NaN logits
 * have logprob -inf (the server writes OpenAI's -9999.0). */
typedef struct splash_logprobs {
    int32_t token;
    float logprob;
    int n_top;
    int32_t top_ids[SPLASH_MAX_TOP_LOGPROBS];
    float top_logprobs[SPLASH_MAX_TOP_LOGPROBS];
} splash_logprobs;

int splash_sampler_logprobs(splash_sampler *s, const float *logits, int32_t token, int n_top,
                            splash_logprobs *out, splash_error *err);

/* ------------------------------------------------------------------------
 * Speculative acceptance (lossless rejection sampling).
 *
 * p: the target's processed distribution at a draft row (with penalties and
 * masks as if the earlier proposals were accepted); q: the distribution the
 * draft drew its proposal x from, or NULL for a deterministic draft (q = the
 * point mass on x).  q may cover any subset of the vocab (q = 0 elsewhere).
 * If x ~ q, then "accept x, else draw from the residual" yields exactly p.
 * A greedy p accepts iff x == p->argmax and replaces x by it otherwise.
 * ------------------------------------------------------------------------ */
/* 1 iff u * q(x) < p(x). */
int splash_spec_accept(const splash_dist *p, const splash_dist *q, int32_t x, double u);
/* A draw from max(p - q, 0) renormalised (inverse CDF in id order); when it
 * is empty (p == q up to rounding) a draw from p.  x is read only when q is
 * NULL (the point mass on x). */
int32_t splash_spec_residual(const splash_dist *p, const splash_dist *q, int32_t x, double u);
/* One draft row with the keyed stream: returns 1 and *token = x when x is
 * accepted (u from ACCEPT at position), else 0 and *token = the residual draw
 * (u from RESIDUAL at position). */
int splash_spec_verify_row(const splash_dist *p, const splash_dist *q, int32_t x, uint64_t seed,
                           uint64_t position, int32_t *token);

#endif
