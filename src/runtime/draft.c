/* draft.c - the one place that maps a package's draft architecture to its
 * implementation (like model.c for targets), and the two test drafts the
 * engine tests plug in through splash_engine_options.test_draft.
 */
#include "runtime/draft.h"

#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "models/dflash/dflash.h"
#include "models/dflash/dflash2_draft.h"
#include "package/package.h"

#ifdef SPLASH_CUDA
#define SPLASH_CUDA_REF
#else
#define SPLASH_CUDA_REF __attribute__((weak))
#endif
/* models/dflash/cuda_dflash.cu: both DFlash versions on the GPU (NULL when not linked in) */
int splash_dflash_cuda_open(splash_package *pkg, const splash_draft_options *opt, splash_draft **out,
                            splash_error *err) SPLASH_CUDA_REF;

typedef int (*draft_open_fn)(splash_package *pkg, const splash_draft_options *opt, splash_draft **out,
                             splash_error *err);

static const struct {
    const char *name;
    draft_open_fn open; /* device "cpu" */
    draft_open_fn cuda; /* device "cuda" */
} drafts[] = {
    {"dflash", splash_dflash_draft_open, splash_dflash_cuda_open},
    {"dflash2", splash_dflash2_draft_open, splash_dflash_cuda_open},
};

int splash_draft_open(splash_package *pkg, const splash_draft_options *opt, splash_draft **out, splash_error *err) {
    *out = NULL;
    const json_value *o = json_get(splash_package_manifest(pkg), "draft");
    if (!o || o->type != JSON_OBJECT)
        return splash_fail(err, SPLASH_E_NOTFOUND, "%s: the package has no draft", splash_package_dir(pkg));
    const char *arch = json_get_string(o, "architecture", "");
    int cuda = opt->device && !strcmp(opt->device, "cuda");
    for (size_t i = 0; i < sizeof drafts / sizeof drafts[0]; i++) {
        if (strcmp(arch, drafts[i].name)) continue;
        if (!cuda) return drafts[i].open(pkg, opt, out, err);
        if (!drafts[i].cuda)
            return splash_fail(err, SPLASH_E_UNSUPPORTED, "draft \"%s\" on device cuda: this build has no CUDA backend",
                               arch);
        return drafts[i].cuda(pkg, opt, out, err);
    }
    return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: draft architecture \"%s\" is not one Splash runs (dflash, dflash2)",
                       splash_package_dir(pkg), arch);
}

void splash_draft_free(splash_draft *d) {
    if (!d) return;
    if (d->ops && d->ops->free) d->ops->free(d->impl);
    free(d);
}

/* ---- test drafts ------------------------------------------------------------------ */

typedef struct oracle_ref {
    int32_t *tok;
    int n, agree;
} oracle_ref;

typedef struct oracle {
    int vocab;
    oracle_ref *refs;
    int n_refs;
    int lanes_calls, lanes_max; /* propose_lanes (the lanes variant): calls, and the most requests in one */
    int32_t dev[SPLASH_DRAFT_MAX_LANES_TEST][SPLASH_DRAFT_MAX_BLOCK + 3]; /* the device variant's "device" tokens */
    int dev_n;                  /* ... requests proposed that way and not yet fetched */
} oracle;

static int oracle_propose(void *impl, const splash_draft_req *r, float *logits, int32_t *tokens, splash_error *err) {
    (void)logits;
    (void)err;
    oracle *o = impl;
    const oracle_ref *ref = NULL;
    for (int i = 0; i < o->n_refs && !ref; i++)
        if (o->refs[i].n >= r->n_seq && !memcmp(o->refs[i].tok, r->seq, sizeof(int32_t) * (size_t)r->n_seq))
            ref = &o->refs[i];
    for (int i = 0; i < r->n; i++) {
        int p = r->n_seq + i; /* the position proposal i stands for */
        int32_t want = ref && p < ref->n ? ref->tok[p] : (r->seq[r->n_seq - 1] + i) % o->vocab;
        int agree = ref && ref->agree < 0 ? (int)r->sp->seed : ref ? ref->agree : 0;
        tokens[i] = ref && p < ref->n && i < agree ? want : (want + 1) % o->vocab;
    }
    return SPLASH_DRAFT_TOKENS;
}

static int none_append(void *impl, int lane, int pos, const float *taps, int n, splash_error *err) {
    (void)impl, (void)lane, (void)pos, (void)taps, (void)n, (void)err;
    return SPLASH_OK;
}
static void none_reset(void *impl, int lane) { (void)impl, (void)lane; }

static void oracle_free(void *impl) {
    oracle *o = impl;
    for (int i = 0; i < o->n_refs; i++) free(o->refs[i].tok);
    free(o->refs);
    free(o);
}

static const splash_draft_ops oracle_ops = {.propose = oracle_propose, .append = none_append, .reset = none_reset, .free = oracle_free};

/* The lanes variant: propose_lanes answers each request as propose does, and counts. */
static int oracle_propose_lanes(void *impl, const splash_draft_req *r, int n, float *const *logits,
                                int32_t *const *tokens, int *kinds, splash_error *errs) {
    oracle *o = impl;
    o->lanes_calls++;
    if (n > o->lanes_max) o->lanes_max = n;
    for (int i = 0; i < n; i++) kinds[i] = oracle_propose(impl, &r[i], logits[i], tokens[i], &errs[i]);
    return SPLASH_OK;
}

static const splash_draft_ops oracle_lanes_ops = {.propose = oracle_propose,
                                                  .append = none_append,
                                                  .reset = none_reset,
                                                  .free = oracle_free,
                                                  .propose_lanes = oracle_propose_lanes};

/* The device variant (a CPU model's device memory is the host's): propose_device
 * answers each request as propose does into dev, its rows 3 entries apart with
 * garbage between (a reader off by one sees it); fetch_proposals copies them out. */
static int oracle_propose_device(void *impl, const splash_draft_req *r, int n, const int32_t **base, int *first,
                                 splash_error *err) {
    oracle *o = impl;
    o->dev_n = 0;
    if (n > SPLASH_DRAFT_MAX_LANES_TEST) return SPLASH_E_UNSUPPORTED;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < SPLASH_DRAFT_MAX_BLOCK + 3; k++) o->dev[i][k] = -1 - k;
        if (oracle_propose(impl, &r[i], NULL, o->dev[i] + 3, err) != SPLASH_DRAFT_TOKENS) return SPLASH_E_INVALID;
        first[i] = i * (SPLASH_DRAFT_MAX_BLOCK + 3) + 3;
    }
    *base = &o->dev[0][0];
    o->dev_n = n;
    return SPLASH_OK;
}

static int oracle_fetch(void *impl, const splash_draft_req *r, int n, int32_t *const *tokens, int *kinds,
                        splash_error *errs) {
    oracle *o = impl;
    for (int i = 0; i < n; i++) {
        kinds[i] = n == o->dev_n ? SPLASH_DRAFT_TOKENS
                                 : splash_fail(&errs[i], SPLASH_E_INVALID, "oracle: no proposals to fetch");
        if (kinds[i] > 0) memcpy(tokens[i], o->dev[i] + 3, sizeof(int32_t) * (size_t)r[i].n);
    }
    o->dev_n = 0;
    return SPLASH_OK;
}

static const splash_draft_ops oracle_device_ops = {.propose = oracle_propose,
                                                   .append = none_append,
                                                   .reset = none_reset,
                                                   .free = oracle_free,
                                                   .propose_lanes = oracle_propose_lanes,
                                                   .propose_device = oracle_propose_device,
                                                   .fetch_proposals = oracle_fetch};

static splash_draft *test_draft(const char *name, const splash_draft_ops *ops, void *impl, int block_size) {
    splash_draft *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->ops = ops;
    d->impl = impl;
    d->name = name;
    d->block_size = block_size < 1 ? 1 : block_size > SPLASH_DRAFT_MAX_BLOCK ? SPLASH_DRAFT_MAX_BLOCK : block_size;
    d->max_block = SPLASH_DRAFT_MAX_BLOCK;
    d->window = 2048;
    return d;
}

splash_draft *splash_draft_oracle_new(int vocab, int block_size) {
    oracle *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->vocab = vocab;
    splash_draft *d = test_draft("oracle", &oracle_ops, o, block_size);
    if (!d) free(o);
    return d;
}

splash_draft *splash_draft_oracle_lanes_new(int vocab, int block_size) {
    splash_draft *d = splash_draft_oracle_new(vocab, block_size);
    if (d) d->ops = &oracle_lanes_ops;
    return d;
}

splash_draft *splash_draft_oracle_device_new(int vocab, int block_size) {
    splash_draft *d = splash_draft_oracle_new(vocab, block_size);
    if (d) d->ops = &oracle_device_ops;
    return d;
}

void splash_draft_oracle_lanes_counts(const splash_draft *d, int *calls, int *max_requests) {
    const oracle *o = d->impl;
    *calls = o->lanes_calls, *max_requests = o->lanes_max;
}

int splash_draft_oracle_add(splash_draft *d, const int32_t *ref, int n, int agree) {
    oracle *o = d->impl;
    oracle_ref *r = realloc(o->refs, sizeof *r * (size_t)(o->n_refs + 1));
    if (!r) return SPLASH_E_NOMEM;
    o->refs = r;
    r = &o->refs[o->n_refs];
    r->tok = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    if (!r->tok) return SPLASH_E_NOMEM;
    memcpy(r->tok, ref, sizeof(int32_t) * (size_t)n);
    r->n = n;
    r->agree = agree;
    o->n_refs++;
    return SPLASH_OK;
}

typedef struct rnd_draft {
    int vocab;
} rnd_draft;

#define RANDOM_DRAFT_PURPOSE 0x7e57u /* its own stream, apart from the sampling purposes */

static int random_propose(void *impl, const splash_draft_req *r, float *logits, int32_t *tokens, splash_error *err) {
    (void)tokens;
    (void)err;
    const rnd_draft *o = impl;
    for (int i = 0; i < r->n; i++)
        for (int t = 0; t < o->vocab; t++) /* peaked enough that proposals differ in probability */
            logits[(size_t)i * o->vocab + t] =
                6.0f * splash_rng_uniform_f32(r->sp->seed, (uint64_t)(r->n_seq + i), RANDOM_DRAFT_PURPOSE, (uint32_t)t);
    return SPLASH_DRAFT_LOGITS;
}

static const splash_draft_ops random_ops = {.propose = random_propose, .append = none_append, .reset = none_reset, .free = free};

splash_draft *splash_draft_random_new(int vocab, int block_size) {
    rnd_draft *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->vocab = vocab;
    splash_draft *d = test_draft("random", &random_ops, o, block_size);
    if (!d) free(o);
    return d;
}
