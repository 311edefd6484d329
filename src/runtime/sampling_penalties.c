/* sampling_penalties.c - token histories and the repetition, presence and
 * frequency penalties.
 *
 * A penalty touches only tokens that occurred, so the history is sparse: a
 * dense entry array (iterated when penalising) and an open-addressing index
 * (looked up when counting a new token or an "as if appended" draft token).
 * The penalties are computed in float, like vLLM and HF do on fp32 logits:
 *     v = logit
 *     if seen in prompt or output and rep != 1:  v = v > 0 ? v / rep : v * rep
 *     v -= frequency * n_output;  v -= presence * (n_output > 0)    (vLLM's order)
 * where n_output counts output tokens plus the extra (draft) tokens.
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/sampling.h"

/* ------------------------------------------------------------------------
 * History.
 * ------------------------------------------------------------------------ */
static uint32_t hash_token(int32_t t) { return (uint32_t)t * 0x9E3779B1u; }

static int rebuild_index(splash_token_history *h, int index_cap) {
    int32_t *index = calloc((size_t)index_cap, sizeof *index);
    if (!index) return SPLASH_E_NOMEM;
    for (int e = 0; e < h->n; e++) {
        uint32_t i = hash_token(h->entries[e].token) & (uint32_t)(index_cap - 1);
        while (index[i]) i = (i + 1) & (uint32_t)(index_cap - 1);
        index[i] = e + 1;
    }
    free(h->index);
    h->index = index;
    h->index_cap = index_cap;
    return SPLASH_OK;
}

int splash_history_init(splash_token_history *h, int capacity_hint) {
    memset(h, 0, sizeof *h);
    int cap = 64;
    while (cap < capacity_hint && cap < (1 << 28)) cap *= 2;
    h->entries = malloc((size_t)cap * sizeof *h->entries);
    if (!h->entries) return SPLASH_E_NOMEM;
    h->cap = cap;
    if (rebuild_index(h, 2 * cap) != SPLASH_OK) {
        splash_history_free(h);
        return SPLASH_E_NOMEM;
    }
    return SPLASH_OK;
}

void splash_history_free(splash_token_history *h) {
    free(h->entries);
    free(h->index);
    memset(h, 0, sizeof *h);
}

void splash_history_clear(splash_token_history *h) {
    h->n = 0;
    if (h->index) memset(h->index, 0, (size_t)h->index_cap * sizeof *h->index);
}

static int32_t *find_slot(const splash_token_history *h, int32_t token) {
    uint32_t mask = (uint32_t)(h->index_cap - 1);
    uint32_t i = hash_token(token) & mask;
    while (h->index[i] && h->entries[h->index[i] - 1].token != token) i = (i + 1) & mask;
    return &h->index[i];
}

const splash_history_entry *splash_history_find(const splash_token_history *h, int32_t token) {
    if (!h || !h->index) return NULL;
    int32_t e = *find_slot(h, token);
    return e ? &h->entries[e - 1] : NULL;
}

int splash_history_add(splash_token_history *h, const int32_t *tokens, int n, int is_prompt) {
    if (!h->index) return SPLASH_E_INVALID;
    for (int k = 0; k < n; k++) {
        int32_t t = tokens[k];
        if (t < 0) return SPLASH_E_RANGE;
        int32_t *slot = find_slot(h, t);
        if (!*slot) {
            if (h->n == h->cap) {
                if (h->cap >= (1 << 28)) return SPLASH_E_NOMEM;
                splash_history_entry *grown = realloc(h->entries, (size_t)h->cap * 2 * sizeof *grown);
                if (!grown) return SPLASH_E_NOMEM;
                h->entries = grown;
                h->cap *= 2;
                if (rebuild_index(h, 2 * h->cap) != SPLASH_OK) return SPLASH_E_NOMEM;
                slot = find_slot(h, t);
            }
            h->entries[h->n] = (splash_history_entry){.token = t};
            *slot = ++h->n;
        }
        splash_history_entry *e = &h->entries[*slot - 1];
        if (is_prompt) e->n_prompt++;
        else e->n_output++;
    }
    return SPLASH_OK;
}

/* ------------------------------------------------------------------------
 * Penalties.
 * ------------------------------------------------------------------------ */
int splash_penalties_active(const splash_sampling_params *p) {
    return p->repetition_penalty != 1.0 || p->presence_penalty != 0.0 || p->frequency_penalty != 0.0;
}

static float penalise(const splash_sampling_params *p, float v, uint32_t n_prompt, uint32_t n_output) {
    const float rep = (float)p->repetition_penalty;
    if (rep != 1.0f && (n_prompt || n_output)) v = v > 0.0f ? v / rep : v * rep;
    if (n_output) {
        v -= (float)p->frequency_penalty * (float)n_output;
        v -= (float)p->presence_penalty;
    }
    return v;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The one implementation of both entry points: every distinct token of h and
 * extra is visited once and its penalised value (computed from logits[t]) is
 * either listed in ids/values or, when ids is NULL, written to out[t].  Each
 * token is written once and depends only on its own logit, so in place
 * (out == logits) is safe. */
static int visit(const splash_sampling_params *p, const splash_token_history *h, const int32_t *extra,
                 int n_extra, const float *logits, int vocab, int32_t *ids, float *values, float *out,
                 splash_error *err) {
    if (n_extra < 0 || n_extra > SPLASH_SAMPLING_MAX_EXTRA)
        return splash_fail(err, SPLASH_E_RANGE, "sampling: %d extra tokens (at most %d)", n_extra,
                           SPLASH_SAMPLING_MAX_EXTRA);
    int32_t sorted[SPLASH_SAMPLING_MAX_EXTRA];
    for (int j = 0; j < n_extra; j++) {
        if (extra[j] < 0 || extra[j] >= vocab)
            return splash_fail(err, SPLASH_E_RANGE, "sampling: extra token %d outside the vocab (%d)",
                               (int)extra[j], vocab);
        sorted[j] = extra[j];
    }
    qsort(sorted, (size_t)n_extra, sizeof *sorted, cmp_i32);
    if (h) /* checked before anything is written, so a failure leaves out untouched */
        for (int i = 0; i < h->n; i++)
            if (h->entries[i].token >= vocab)
                return splash_fail(err, SPLASH_E_RANGE, "sampling: history token %d outside the vocab (%d)",
                                   (int)h->entries[i].token, vocab);
    int n = 0;
    /* Each distinct extra token once, with its history counts added. */
    for (int j = 0; j < n_extra; j++) {
        if (j > 0 && sorted[j] == sorted[j - 1]) continue;
        int t = sorted[j];
        uint32_t n_out = 1;
        while (j + (int)n_out < n_extra && sorted[j + (int)n_out] == t) n_out++;
        const splash_history_entry *e = splash_history_find(h, t);
        float v = penalise(p, logits[t], e ? e->n_prompt : 0, (e ? e->n_output : 0) + n_out);
        if (ids) ids[n] = t, values[n] = v;
        else out[t] = v;
        n++;
    }
    if (!h) return n;
    /* History tokens that are not among the extras. */
    for (int i = 0; i < h->n; i++) {
        const splash_history_entry *e = &h->entries[i];
        if (n_extra && bsearch(&e->token, sorted, (size_t)n_extra, sizeof *sorted, cmp_i32)) continue;
        float v = penalise(p, logits[e->token], e->n_prompt, e->n_output);
        if (ids) ids[n] = e->token, values[n] = v;
        else out[e->token] = v;
        n++;
    }
    return n;
}

int splash_penalties_sparse(const splash_sampling_params *p, const splash_token_history *h,
                            const int32_t *extra, int n_extra, const float *logits, int vocab,
                            int32_t *ids, float *values, splash_error *err) {
    return visit(p, h, extra, n_extra, logits, vocab, ids, values, NULL, err);
}

int splash_penalties_apply(float *logits, int vocab, const splash_sampling_params *p,
                           const splash_token_history *h, const int32_t *extra, int n_extra,
                           splash_error *err) {
    if (!splash_penalties_active(p)) return SPLASH_OK;
    int n = visit(p, h, extra, n_extra, logits, vocab, NULL, NULL, logits, err);
    return n < 0 ? n : SPLASH_OK;
}
