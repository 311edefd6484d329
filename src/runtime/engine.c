/* engine.c - the engine thread (see engine.h).
 *
 * One loop: admit queued gens into free lanes while the pool has their pages,
 * drop cancelled lanes, ask the scheduler (runtime/scheduler.h) which lanes
 * run and how many prompt rows each prefill lane gets, let the draft propose
 * for every decoding lane, build one ragged batch (prefill chunks for lanes
 * still reading their prompt, a VERIFY block [feed, proposals] for decoding
 * lanes), run it, then per lane: decide (runtime/spec.h), commit, feed the
 * draft the committed positions' taps, turn the tokens into text.  All model
 * and draft calls happen on this thread.
 */
#include "runtime/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "package/package.h"
#include "runtime/block_policy.h"
#include "runtime/draft.h"
#include "runtime/kv_pool.h"
#include "runtime/memory_plan.h"
#include "runtime/model.h"
#include "runtime/prefix_cache.h"
#include "runtime/scheduler.h"
#include "runtime/spec.h"
#include "runtime/state_cache.h"
#include "text/tokenizer.h"

double splash_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- gens ----------------------------------------------------------------------- */

splash_gen *splash_gen_new(void) {
    splash_gen *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    sb_init(&g->text);
    g->refs = 1;
    g->max_tokens = 1;
    splash_sampling_params_default(&g->sp);
    return g;
}

void splash_gen_release(splash_gen *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    int left = --g->refs;
    pthread_mutex_unlock(&g->mu);
    if (left) return;
    free(g->prompt);
    free(g->script);
    for (int i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g->toks);
    free(g->lps);
    sb_free(&g->text);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

struct splash_engine;
static void engine_wake(struct splash_engine *e);

void splash_gen_cancel(splash_gen *g) {
    pthread_mutex_lock(&g->mu);
    g->cancel = 1;
    struct splash_engine *e = g->state != SPLASH_GEN_DONE ? (struct splash_engine *)g->engine : NULL;
    pthread_mutex_unlock(&g->mu);
    if (e) engine_wake(e);
}

int splash_gen_wait(splash_gen *g, int timeout_ms, strbuf *out, splash_gen_take *t) {
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&g->mu);
    while (!g->text.len && g->state != SPLASH_GEN_DONE)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &dl)) break;
    int got = g->text.len > 0 || g->state == SPLASH_GEN_DONE;
    if (g->text.len) {
        sb_append(out, g->text.data, g->text.len);
        sb_clear(&g->text);
    }
    memset(t, 0, sizeof *t);
    t->state = g->state;
    t->n_tokens = g->n_tokens;
    t->n_recorded = g->n_recorded;
    t->finish = g->state == SPLASH_GEN_DONE ? g->finish : SPLASH_FINISH_NONE;
    memcpy(t->error, g->error, sizeof t->error);
    if (g->t_first > 0) t->prefill_ms = 1e3 * (g->t_first - g->t_start);
    if (g->t_end > 0 && g->t_first > 0) t->decode_ms = 1e3 * (g->t_end - g->t_first);
    t->drafted = g->n_drafted;
    t->accepted = g->n_accepted;
    t->cycles = g->n_cycles;
    pthread_mutex_unlock(&g->mu);
    return got;
}

int splash_gen_records(splash_gen *g, int from, int max, splash_gen_token *toks, splash_logprobs *lps) {
    pthread_mutex_lock(&g->mu);
    int n = from >= 0 && from < g->n_recorded ? g->n_recorded - from : 0;
    if (n > max) n = max;
    if (n > 0 && toks) memcpy(toks, g->toks + from, sizeof *toks * (size_t)n);
    if (n > 0 && lps && g->lps) memcpy(lps, g->lps + from, sizeof *lps * (size_t)n);
    pthread_mutex_unlock(&g->mu);
    return n;
}

/* ---- the engine ----------------------------------------------------------------- */

typedef struct lane {
    splash_gen *g;        /* NULL: free */
    int slot;
    int32_t *pages;       /* [pages_per_lane] page table; the lane holds a pool reference on each */
    int n_pages;
    splash_pc_node **nodes; /* [pages_per_lane] cache node of each complete page (pinned), or NULL */
    int n_nodes;          /* pages [0, n_nodes) are in the cache */
    int32_t *seq;         /* [pages_per_lane * page_tokens] tokens fed: prompt, then the sampled ones */
    int junction, replay, prompt_page; /* snapshot points (page-aligned positions; 0 = none) */
    int decode_snap;      /* state-cache entry this lane took while decoding, or -1 */
    splash_pc_node *decode_node; /* ... and its node (pinned by the lane) */
    int n_past;           /* tokens in the KV and state */
    int n_out;            /* tokens generated */
    int32_t feed[SPLASH_DRAFT_MAX_BLOCK]; /* known tokens at n_past.. not committed yet; the last is the anchor */
    int n_feed;
    int32_t props[SPLASH_DRAFT_MAX_BLOCK]; /* this step's proposals */
    int n_props, dkind;   /* ... how many, SPLASH_DRAFT_LOGITS / _TOKENS / _SPARSE */
    int dev_first;        /* this step, proposals on the device: the first one's index in e->dev_props, else -1 */
    float *dlogits;       /* [max_block - 1][vocab] the draft's logits of this step (with a draft) */
    splash_spec_q dq[SPLASH_DRAFT_MAX_BLOCK]; /* the proposals' q from a SPARSE draft */
    int taps_from;        /* first prompt position whose taps the draft gets (the last window positions) */
    int tap_row, tap_first; /* this step: the lane's first row in the batch's taps, and its row in the lane */
    int batch_row;        /* this step: its first row in the batch */
    int logit_row;        /* this step: index into logits (or the TOP rows when use_top), or -1 */
    int use_top;          /* this step: the lane's rows come back as TOP rows (top_ids / top_logits) */
    int in_batch, decoding;
    int cycling;          /* this step: committed a cycle, its later phases (cycle_end) due */
    int32_t out[SPLASH_DRAFT_MAX_BLOCK]; /* ... the cycle's decided tokens, */
    int cy_k, cy_j, cy_good, cy_c, cy_n0; /* accepted, emitted - 1, rows that stand, committed, n_past before */
    int cy_verified;      /* its rows were VERIFY rows: the model commits cy_c of them (cycle_commit_lanes) */
    int overtaken;        /* the scheduler's count (scheduler.h) */
    uint64_t arrival;     /* admission order */
    splash_token_history hist;
    splash_detok_stream ds;
    strbuf held;          /* decoded text that may still start a stop string */
    uint32_t text_total;  /* bytes the detokenizer produced so far */
} lane;

typedef struct spec_times {
    double draft, verify, accept, commit; /* seconds */
} spec_times;

struct splash_engine {
    splash_package *pkg;
    splash_model *model;
    splash_tokenizer *tok;
    splash_sampler *sampler;
    const splash_model_needs *needs;
    int vocab, max_context, max_lanes, max_queue, chunk, pages_per_lane;
    void *kv, *states;
    int n_pages;
    splash_kv_pool pool;
    splash_prefix_cache pc;
    splash_state_cache sc;
    splash_memory_plan plan;
    size_t spare_used; /* of plan.spare, what the model took (splash_model_use_spare) */
    int checkpoint_interval, use_cache, flush_req, flush_left, im_start;
    uint64_t cache_hits, cached_tokens, prefill_tokens;
    splash_engine_stats pub; /* cache figures published under mu by the engine thread */
    lane *lanes;
    splash_sched sched;
    splash_sched_lane *slanes; /* [max_lanes] the scheduler's view of the lanes */
    uint64_t admitted;
    int32_t stop_ids[8];
    int n_stop_ids;
    splash_row *rows;
    splash_lane *blanes;
    float *logits;        /* [max_lanes * max_block][vocab] */
    int32_t *top_ids;     /* [max_lanes * max_block][SPLASH_MAX_TOP] TOP rows (the step's top_k apart) */
    float *top_logits;
    int top_k;            /* this step's TOP entries a row */
    int full_rows;        /* 1: every decision from whole rows of logits (no TOP rows) */
    float *taps;          /* [rows][n_taps * hidden] when the draft reads taps from the host */
    int device_taps;      /* the draft reads them in the model's device buffer (splash_model_device_taps) */
    /* the speculative cycle */
    splash_draft *draft;  /* NULL: block size 1 */
    int own_draft;
    int draft_lanes;      /* the draft's propose_lanes drafts a cycle's lanes in one call (SPLASH_DRAFT_LANES=0: lane by lane) */
    splash_draft_req *dreq; /* [max_lanes] a cycle's requests to the draft, */
    lane **dwho;          /* their lanes, */
    float **dlog;         /* the lanes' logits and proposals buffers, */
    int32_t **dtok;
    int *dkind;           /* and the draft's answers, */
    splash_error *derr;   /* each with its own error */
    splash_draft_taps *dtaps; /* [max_lanes] a cycle phase's appends to the draft */
    int device_props;     /* greedy proposals may stay on the device for the verify (draft.h, propose_device) */
    int step_dev;         /* this step: requests (e->dreq[0..step_dev)) whose proposals are on the device */
    const int32_t *dev_props; /* ... where they are (batch.device_tokens) */
    int *dfirst;          /* [max_lanes] */
    int *cslots, *ccounts; /* [max_lanes] a step's commits: the lanes' slots and accepted rows */
    uint64_t spec_device_cycles;
    int greedy_model;     /* greedy steps decided and committed by the model (splash_model_commit_greedy;
                             SPLASH_MODEL_DECIDES=0: by the engine) */
    splash_greedy_lane *glanes; /* [max_lanes] such a step's lanes, */
    splash_greedy_result *gres; /* their decisions, */
    lane **gwho;                /* and whose they are */
    uint64_t spec_model_decided;
    int block, max_block; /* default rows per decoding lane, and the most a gen may ask */
    int auto_block;       /* the block chosen step by step (block_policy.h) ... */
    int step_spec;        /* ... this step's choice for the lanes that follow it: e->block (1) or 1 (0) */
    int step_auto_lanes;  /* this step's decoding lanes that follow it, */
    int step_auto_tokens; /* and the tokens they emitted */
    splash_block_policy bpol;
    uint64_t auto_steps[2];
    splash_dist q;        /* draft distribution scratch (spec.h) */
    size_t model_snap;    /* bytes of the model's part of a snapshot (the draft's follows) */
    const char *device;   /* "cpu" or "cuda" (splash_device_resolve) */
    char device_name[128];
    void (*on_logits)(void *ctx, const splash_gen *g, int index, const float *row, int vocab);
    void (*on_propose)(void *ctx, const splash_gen *g, int n_seq, const int32_t *props, int n);
    void *hook_ctx;
    uint64_t spec_cycles, spec_drafted, spec_accepted, spec_steps;
    uint64_t rows_decided, rows_decided_top;
    spec_times spec_t;

    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stopping;
    splash_gen *qhead, *qtail;
    int n_queued, n_active;
    uint64_t requests_done, prompt_tokens, completion_tokens;
    uint64_t admissions_deferred; /* admit() found a lane free and too few pages for the next gen */
    double prefill_seconds, decode_seconds;
};

static void publish(splash_engine *e);
static int lane_auto(const splash_engine *e, const splash_gen *g);

static void engine_wake(struct splash_engine *e) {
    pthread_mutex_lock(&e->mu);
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static int pages_for(const splash_engine *e, const splash_gen *g) {
    int pt = e->needs->page_tokens;
    return (g->n_prompt + g->max_tokens + pt - 1) / pt;
}

static void gen_push_text(splash_gen *g, const char *s, size_t n) {
    if (!n) return;
    pthread_mutex_lock(&g->mu);
    sb_append(&g->text, s, n);
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void gen_finish(splash_gen *g, splash_finish f, const char *error) {
    pthread_mutex_lock(&g->mu);
    if (g->state != SPLASH_GEN_DONE) {
        g->finish = f;
        if (error) snprintf(g->error, sizeof g->error, "%s", error);
        g->state = SPLASH_GEN_DONE;
        g->t_end = splash_now();
        if (g->t_first == 0) g->t_first = g->t_end;
        if (g->t_start == 0) g->t_start = g->t_end;
    }
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* ---- the lane's pages, the prefix cache and snapshots ----------------------------
 * Engine thread only (under e->mu where the stats read them). */

/* Unpins the lane's cache nodes and drops its page references: pages the
 * cache holds stay (evictable), the others are free again. */
static void lane_release_pages(splash_engine *e, lane *l) {
    for (int i = 0; i < l->n_nodes; i++)
        if (l->nodes[i]) splash_prefix_unpin(&e->pc, l->nodes[i]);
    for (int i = 0; i < l->n_pages; i++) splash_kv_pool_unref(&e->pool, l->pages[i]);
    l->n_nodes = 0;
    l->n_pages = 0;
    l->decode_snap = -1;
}

/* Puts the lane's newly complete pages into the cache (pinned). */
static void lane_insert_pages(splash_engine *e, lane *l) {
    int pt = e->needs->page_tokens;
    while (e->use_cache && (l->n_nodes + 1) * pt <= l->n_past) {
        int i = l->n_nodes;
        splash_pc_node *parent = i ? l->nodes[i - 1] : NULL;
        if (i && !parent) return;
        splash_pc_node *n = splash_prefix_insert(&e->pc, parent, l->seq + (size_t)i * pt, NULL, l->pages[i]);
        l->nodes[i] = n;
        l->n_nodes++;
        if (!n) return; /* out of memory: the rest of this lane stays private */
        splash_prefix_pin(&e->pc, n);
    }
}

/* Snapshot of the lane's state at n_past (page-aligned, its page in the
 * cache) onto that page's node.  Returns the entry or -1. */
static int lane_snapshot(splash_engine *e, lane *l, int kind) {
    int pt = e->needs->page_tokens, k = l->n_past / pt;
    if (!e->use_cache || l->n_past % pt || k < 1 || k > l->n_nodes || !l->nodes[k - 1]) return -1;
    splash_pc_node *n = l->nodes[k - 1];
    if (n->snap >= 0) {
        splash_snap *s = &e->sc.snaps[n->snap];
        if (s->kind < kind) s->kind = kind;
        s->last_used = ++e->pc.tick;
        return -1;
    }
    int i = splash_state_cache_take(&e->sc, kind, ++e->pc.tick);
    if (i < 0) return -1;
    if (splash_model_snapshot(e->model, l->slot, e->sc.snaps[i].buf)) {
        splash_state_cache_drop(&e->sc, i);
        return -1;
    }
    if (e->draft && e->draft->snapshot_bytes) /* the draft's state at the same position follows */
        e->draft->ops->snapshot(e->draft->impl, l->slot, (char *)e->sc.snaps[i].buf + e->model_snap);
    e->sc.snaps[i].node = n;
    n->snap = i;
    return i;
}

/* After a prefill chunk: snapshots due at n_past. */
static void lane_prefill_snapshots(splash_engine *e, lane *l) {
    int p = l->n_past;
    if (p == l->junction) lane_snapshot(e, l, SPLASH_SNAP_JUNCTION);
    if (p == l->replay || p == l->prompt_page) lane_snapshot(e, l, SPLASH_SNAP_REPLAY);
    if (e->checkpoint_interval && p % e->checkpoint_interval == 0) lane_snapshot(e, l, SPLASH_SNAP_CHECKPOINT);
}

/* The next snapshot point past n_past, or INT32_MAX. */
static int lane_next_point(const splash_engine *e, const lane *l) {
    int p = l->n_past, best = INT32_MAX;
    int pts[3] = {l->junction, l->replay, l->prompt_page};
    for (int i = 0; i < 3; i++)
        if (pts[i] > p && pts[i] < best) best = pts[i];
    if (e->checkpoint_interval) {
        int c = (p / e->checkpoint_interval + 1) * e->checkpoint_interval;
        if (c < best) best = c;
    }
    return best;
}

/* Ends a lane's gen and gives its slot and pages back. */
static void lane_end(splash_engine *e, lane *l, splash_finish f, const char *error) {
    splash_gen *g = l->g;
    if (f == SPLASH_FINISH_STOP || f == SPLASH_FINISH_LENGTH) { /* what was held back is text after all */
        splash_detok_stream_flush(&l->ds, &l->held);
        gen_push_text(g, l->held.data, l->held.len);
    }
    sb_clear(&l->held);
    pthread_mutex_lock(&e->mu);
    lane_release_pages(e, l);
    e->n_active--;
    e->requests_done++;
    e->prompt_tokens += (uint64_t)g->n_prompt;
    e->completion_tokens += (uint64_t)l->n_out;
    /* the pool's figures with the count: a reader that sees the request gone sees its pages
     * back (else until the step's end; a status read in between saw an idle engine holding them) */
    publish(e);
    pthread_mutex_unlock(&e->mu);
    gen_finish(g, f, error);
    l->n_pages = 0;
    l->g = NULL;
    splash_gen_release(g);
}

static int lane_cancelled(lane *l) {
    pthread_mutex_lock(&l->g->mu);
    int c = l->g->cancel;
    pthread_mutex_unlock(&l->g->mu);
    return c;
}

/* Longest suffix of s that is a proper prefix of a stop string. */
static size_t stop_holdback(const splash_gen *g, const char *s, size_t n) {
    size_t best = 0;
    for (int i = 0; i < g->n_stop; i++) {
        size_t sl = strlen(g->stop[i]);
        for (size_t k = sl - 1 < n ? sl - 1 : n; k > best; k--)
            if (!memcmp(s + n - k, g->stop[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

/* Appends a token record (and its logprobs) to the gen; SPLASH_E_NOMEM. */
static int gen_record(splash_gen *g, int32_t tok, uint32_t text_end, const splash_logprobs *lp) {
    int rc = 0;
    pthread_mutex_lock(&g->mu);
    if (g->n_recorded == g->cap_recorded) {
        int cap = g->cap_recorded ? 2 * g->cap_recorded : 64;
        splash_gen_token *t = realloc(g->toks, sizeof *t * (size_t)cap);
        if (t) g->toks = t;
        splash_logprobs *p = lp ? realloc(g->lps, sizeof *p * (size_t)cap) : NULL;
        if (p) g->lps = p;
        if (t && (p || !lp)) g->cap_recorded = cap;
        else rc = SPLASH_E_NOMEM;
    }
    if (!rc) {
        g->toks[g->n_recorded] = (splash_gen_token){tok, text_end};
        if (lp && g->lps) g->lps[g->n_recorded] = *lp;
        g->n_recorded++;
    }
    pthread_mutex_unlock(&g->mu);
    return rc;
}

/* A new token of the lane: stop tokens, text, stop strings, max_tokens.
 * lp: its logprobs when the request asked for them.  Returns 1 when the lane
 * ended. */
static int lane_token(splash_engine *e, lane *l, int32_t tok, const splash_logprobs *lp) {
    splash_gen *g = l->g;
    l->n_out++;
    if (l->decoding && lane_auto(e, g)) e->step_auto_tokens++;
    pthread_mutex_lock(&g->mu);
    g->n_tokens = l->n_out;
    if (l->n_out == 1) {
        g->t_first = splash_now();
        g->state = SPLASH_GEN_DECODE; /* consumers stop sending keep-alives */
    }
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; i < e->n_stop_ids; i++)
        if (tok == e->stop_ids[i]) {
            lane_end(e, l, SPLASH_FINISH_STOP, NULL);
            return 1;
        }
    splash_history_add(&l->hist, &tok, 1, 0);
    splash_error err = {0};
    size_t before = l->held.len;
    if (splash_detok_stream_feed(&l->ds, tok, &l->held, &err)) {
        lane_end(e, l, SPLASH_FINISH_ERROR, err.msg);
        return 1;
    }
    l->text_total += (uint32_t)(l->held.len - before);
    if (gen_record(g, tok, l->text_total, lp)) {
        lane_end(e, l, SPLASH_FINISH_ERROR, "out of memory for the token records");
        return 1;
    }
    if (l->held.len > before && g->n_stop) {
        /* earliest stop string that now appears (it can start in held-back text) */
        size_t cut = (size_t)-1;
        for (int i = 0; i < g->n_stop; i++) {
            const char *p = memmem(l->held.data, l->held.len, g->stop[i], strlen(g->stop[i]));
            if (p && (size_t)(p - l->held.data) < cut) cut = (size_t)(p - l->held.data);
        }
        if (cut != (size_t)-1) {
            gen_push_text(g, l->held.data, cut);
            sb_clear(&l->held);
            splash_detok_stream_init(&l->ds, e->tok, SPLASH_DECODE_SKIP_SPECIAL);
            lane_end(e, l, SPLASH_FINISH_STOP, NULL);
            return 1;
        }
    }
    size_t keep = stop_holdback(g, l->held.data, l->held.len);
    if (l->held.len > keep) {
        gen_push_text(g, l->held.data, l->held.len - keep);
        memmove(l->held.data, l->held.data + l->held.len - keep, keep);
        l->held.len = keep;
    }
    if (l->n_out >= g->max_tokens) {
        lane_end(e, l, SPLASH_FINISH_LENGTH, NULL);
        return 1;
    }
    l->decoding = 1;
    return 0;
}

/* Places g on lane l: the longest cached prefix of its prompt whose end has
 * a snapshot (or the root) is restored and its pages mapped, the rest of the
 * budget gets fresh pages, evicting unpinned cache pages when the pool is
 * short.  Returns 0, or 1 when the pool cannot hold it now (it waits). */
static int lane_claim(splash_engine *e, lane *l, splash_gen *g) {
    int pt = e->needs->page_tokens, total = pages_for(e, g);
    splash_pc_node **path = l->nodes;
    int m = 0, j = 0;
    if (e->use_cache) {
        m = splash_prefix_match(&e->pc, g->prompt, g->n_prompt - 1, path, total); /* >= 1 row must run */
        for (j = m; j > 0 && path[j - 1]->snap < 0; j--) {}
    }
    for (int i = 0; i < j; i++) splash_prefix_pin(&e->pc, path[i]);
    while (e->pool.n_free < total - j && splash_prefix_evict_one(&e->pc)) {}
    if (e->pool.n_free < total - j) {
        for (int i = 0; i < j; i++) splash_prefix_unpin(&e->pc, path[i]);
        return 1;
    }
    for (int i = 0; i < j; i++) {
        l->pages[i] = path[i]->page;
        splash_kv_pool_ref(&e->pool, path[i]->page);
    }
    for (int i = j; i < total; i++) l->pages[i] = splash_kv_pool_alloc(&e->pool);
    l->n_pages = total;
    l->n_nodes = j;
    if (j) {
        splash_snap *s = &e->sc.snaps[path[j - 1]->snap];
        splash_model_restore(e->model, l->slot, s->buf);
        splash_error derr = {0};
        if (e->draft && e->draft->snapshot_bytes &&
            e->draft->ops->restore(e->draft->impl, l->slot, (char *)s->buf + e->model_snap, &derr)) {
            LOG_WARN("draft state not restored (%s): the draft starts empty", derr.msg);
            e->draft->ops->reset(e->draft->impl, l->slot);
        }
        s->last_used = ++e->pc.tick;
        e->sc.restored++;
        e->cache_hits++;
        e->cached_tokens += (uint64_t)(j * pt);
    } else {
        splash_model_reset_slot(e->model, l->slot);
        if (e->draft) e->draft->ops->reset(e->draft->impl, l->slot);
    }
    /* the draft reads at most `window` positions: the prompt's earlier ones get no taps */
    l->taps_from = e->draft ? g->n_prompt - e->draft->window : 0;
    l->n_feed = 0;
    memcpy(l->seq, g->prompt, sizeof(int32_t) * (size_t)g->n_prompt);
    l->n_past = j * pt;
    l->junction = m > j ? m * pt : 0;
    /* replay point: the last whole page before the generation prompt (the last <|im_start|>) */
    l->replay = 0;
    for (int i = g->n_prompt - 1; i >= 0 && e->im_start >= 0; i--)
        if (g->prompt[i] == e->im_start) {
            l->replay = i / pt * pt;
            break;
        }
    l->prompt_page = g->n_prompt / pt * pt;
    l->decode_snap = -1;
    pthread_mutex_lock(&g->mu);
    g->n_cached = j * pt;
    pthread_mutex_unlock(&g->mu);
    return 0;
}

static void lane_begin(splash_engine *e, lane *l, splash_gen *g) {
    l->g = g;
    l->n_out = 0;
    l->text_total = 0;
    l->decoding = 0;
    l->n_feed = 0;
    l->overtaken = 0;
    l->arrival = ++e->admitted;
    splash_history_clear(&l->hist);
    splash_history_add(&l->hist, g->prompt, g->n_prompt, 1);
    splash_detok_stream_init(&l->ds, e->tok, SPLASH_DECODE_SKIP_SPECIAL);
    sb_clear(&l->held);
    e->n_active++;
    pthread_mutex_lock(&g->mu);
    g->state = SPLASH_GEN_PREFILL;
    g->t_start = splash_now();
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* Under e->mu: moves queued gens into free lanes, by priority then arrival,
 * while their pages fit (the best waits rather than be passed by smaller
 * ones, so it cannot starve); ends cancelled queued gens. */
static void admit(splash_engine *e) {
    while (e->qhead) {
        splash_gen *g = NULL, **link = NULL;
        int cancelled = 0;
        for (splash_gen **p = &e->qhead; *p; p = &(*p)->next) { /* the queue is in arrival order */
            pthread_mutex_lock(&(*p)->mu);
            cancelled = (*p)->cancel;
            pthread_mutex_unlock(&(*p)->mu);
            if (cancelled || !g || splash_sched_better((*p)->priority, 1, g->priority, 0)) g = *p, link = p;
            if (cancelled) break;
        }
        lane *free_lane = NULL;
        for (int i = 0; i < e->max_lanes && !free_lane; i++)
            if (!e->lanes[i].g) free_lane = &e->lanes[i];
        if (!cancelled) {
            if (!free_lane) return;
            if (lane_claim(e, free_lane, g)) { /* too few pages: it waits */
                e->admissions_deferred++;
                return;
            }
        }
        *link = g->next;
        if (e->qtail == g) {
            e->qtail = NULL;
            for (splash_gen *q = e->qhead; q; q = q->next) e->qtail = q;
        }
        e->n_queued--;
        if (cancelled) { /* ended in the queue: still a request done */
            e->requests_done++;
            gen_finish(g, SPLASH_FINISH_CANCELLED, NULL);
            splash_gen_release(g);
            continue;
        }
        lane_begin(e, free_lane, g);
        publish(e);
    }
}

/* The scheduler's view of the lanes, then its plan (rows per lane). */
static int lane_block(const splash_engine *e, const splash_gen *g);

static void plan(splash_engine *e) {
    for (int i = 0; i < e->max_lanes; i++) {
        lane *l = &e->lanes[i];
        splash_sched_lane *s = &e->slanes[i];
        memset(s, 0, sizeof *s);
        if (l->g && lane_cancelled(l)) lane_end(e, l, SPLASH_FINISH_CANCELLED, NULL);
        if (!l->g) continue;
        s->active = 1;
        s->decoding = l->decoding;
        s->decode_rows = l->decoding ? lane_block(e, l->g) : 0;
        s->remaining = l->g->n_prompt - l->n_past;
        s->limit = lane_next_point(e, l) - l->n_past; /* a chunk ends where a snapshot is due */
        s->priority = l->g->priority;
        s->arrival = l->arrival;
        s->overtaken = l->overtaken;
    }
    splash_sched_plan(&e->sched, e->slanes, e->max_lanes);
    for (int i = 0; i < e->max_lanes; i++) e->lanes[i].overtaken = e->slanes[i].overtaken;
}

/* ---- the decode cycle -------------------------------------------------------------
 * Per decoding lane and step: propose (the draft, then splash_spec_select on
 * its logits; a SPARSE draft picks its proposals itself and hands over each
 * one's q), verify [feed..., proposals] in the shared forward, decide
 * (splash_spec_decide), commit the rows whose inputs stood, feed the draft
 * their taps, emit.  `feed` holds the lane's known tokens that the target
 * has not committed yet: normally just the anchor (the last emitted token);
 * more when a commit stopped at a page boundary so the state there could be
 * snapshotted - those rows run again (same bits) at the head of the next
 * block instead of being lost.  Block size 1 (no draft) is the same code with
 * no proposals: one VERIFY row, commit 1, the token drawn as splash_sample. */

/* Whether the lane's block follows the step's auto choice: a request with
 * its own block, or sampled with a seed of its own (its output depends on
 * the block, and must not on timing), keeps its block. */
static int lane_auto(const splash_engine *e, const splash_gen *g) {
    return e->auto_block && g->block_size <= 0 && !(g->sp.temperature > 0 && g->sp.seed_given);
}

static int lane_block(const splash_engine *e, const splash_gen *g) {
    int b = g->block_size > 0 ? g->block_size : lane_auto(e, g) && !e->step_spec ? 1 : e->block;
    return b < 1 ? 1 : b > e->max_block ? e->max_block : b;
}

/* The best logits a lane's decisions need (TOP rows of that many), or 0 for
 * whole rows: the test hook reads whole rows, and so do penalties and
 * logprobs (splash_sampling_top_need). */
static int lane_top_need(const splash_engine *e, const splash_gen *g) {
    if (e->full_rows || e->on_logits) return 0;
    int need = splash_sampling_top_need(&g->sp, e->vocab);
    return need <= e->needs->max_top ? need : 0;
}

/* A lane's decision rows this step: whole rows of logits, or TOP rows. */
static splash_spec_block lane_rows(const splash_engine *e, const lane *l) {
    splash_spec_block b = {0};
    if (l->use_top) {
        b.top_ids = e->top_ids + (size_t)l->logit_row * e->top_k;
        b.top_logits = e->top_logits + (size_t)l->logit_row * e->top_k;
        b.top_n = e->top_k;
    } else {
        b.target = e->logits + (size_t)l->logit_row * e->vocab;
    }
    return b;
}

/* The scripted token (test hook) of output index i. */
static int32_t script_token(const splash_engine *e, const splash_gen *g, int i) {
    return i < g->n_script ? g->script[i] : (e->n_stop_ids ? e->stop_ids[0] : 0);
}

/* Emits out[0..n) decided by the target rows [n][vocab] (NULL: TOP rows,
 * which only lanes without logprobs or the hook get); 1 when the lane ended. */
static int lane_emit(splash_engine *e, lane *l, const float *rows, const int32_t *out, int n) {
    for (int i = 0; i < n; i++) {
        splash_gen *g = l->g;
        const float *row = rows ? rows + (size_t)i * e->vocab : NULL;
        if (e->on_logits && row) e->on_logits(e->hook_ctx, g, l->n_out, row, e->vocab);
        splash_logprobs lp;
        splash_error err = {0};
        if (g->sp.logprobs && !row) splash_fail(&err, SPLASH_E_INVALID, "logprobs need whole rows of logits");
        if (g->sp.logprobs && (!row || splash_sampler_logprobs(e->sampler, row, out[i], g->sp.top_logprobs, &lp, &err))) {
            lane_end(e, l, SPLASH_FINISH_ERROR, err.msg);
            return 1;
        }
        if (lane_token(e, l, out[i], g->sp.logprobs ? &lp : NULL)) return 1;
    }
    return 0;
}

/* Before the forward: how many proposals the lane wants (l->n_props) and,
 * when any, its request to the draft in r.  1 when it wants some. */
static int cycle_want(splash_engine *e, lane *l, splash_draft_req *r) {
    splash_gen *g = l->g;
    int np = lane_block(e, g) - l->n_feed, left = g->max_tokens - l->n_out - 1; /* the last token needs no proposal */
    if (np > left) np = left;
    if (!e->draft || np < 0) np = 0;
    l->n_props = np;
    l->dkind = 0;
    if (!np) return 0;
    *r = (splash_draft_req){l->slot, l->seq, l->n_past + l->n_feed, np, &g->sp, l->dq}; /* seq[n_seq - 1]: the anchor */
    return 1;
}

/* After the draft answered r with kind: the proposals checked (and selected
 * from the draft's logits).  0, or 1 when the lane ended. */
static int cycle_proposed(splash_engine *e, lane *l, const splash_draft_req *r, int kind, splash_error *err) {
    splash_gen *g = l->g;
    const int np = r->n;
    if (kind == SPLASH_DRAFT_LOGITS &&
        splash_spec_select(e->sampler, &e->q, &g->sp, &l->hist, l->dlogits, np, (uint64_t)r->n_seq, l->props, err))
        kind = SPLASH_E_INVALID;
    if (kind != SPLASH_DRAFT_LOGITS && kind != SPLASH_DRAFT_TOKENS && kind != SPLASH_DRAFT_SPARSE) {
        lane_end(e, l, SPLASH_FINISH_ERROR, err->msg[0] ? err->msg : "the draft failed");
        return 1;
    }
    for (int i = 0; i < np; i++)
        if (l->props[i] < 0 || l->props[i] >= e->vocab) {
            lane_end(e, l, SPLASH_FINISH_ERROR, "the draft proposed a token outside the vocabulary");
            return 1;
        }
    l->dkind = kind;
    if (e->on_propose) e->on_propose(e->hook_ctx, g, r->n_seq, l->props, np);
    return 0;
}

/* Before the forward: the proposals of every decoding lane in the plan, from
 * one call for all of them when the draft drafts lanes together. */
static void cycle_propose(splash_engine *e) {
    int n = 0;
    for (int i = 0; i < e->max_lanes; i++) e->lanes[i].dev_first = -1;
    for (int i = 0; i < e->max_lanes; i++) {
        lane *l = &e->lanes[i];
        if (l->g && e->slanes[i].rows && l->decoding && cycle_want(e, l, &e->dreq[n])) {
            e->dwho[n] = l;
            e->dlog[n] = l->dlogits;
            e->dtok[n++] = l->props;
        }
    }
    if (!n) return;
    const splash_draft_ops *o = e->draft->ops;
    memset(e->derr, 0, sizeof *e->derr * (size_t)n);
    int greedy = e->device_props;
    for (int i = 0; i < n && greedy; i++) greedy = e->dreq[i].sp->temperature <= 0;
    if (greedy && !o->propose_device(e->draft->impl, e->dreq, n, &e->dev_props, e->dfirst, &e->derr[0])) {
        /* the verify reads them on the device; cycle_fetch checks them after it */
        for (int i = 0; i < n; i++) e->dwho[i]->dev_first = e->dfirst[i];
        e->step_dev = n;
        return;
    }
    memset(e->derr, 0, sizeof *e->derr * (size_t)n);
    if (o->propose_lanes && n > 1 && e->draft_lanes)
        o->propose_lanes(e->draft->impl, e->dreq, n, e->dlog, e->dtok, e->dkind, e->derr);
    else
        for (int i = 0; i < n; i++)
            e->dkind[i] = o->propose(e->draft->impl, &e->dreq[i], e->dlog[i], e->dtok[i], &e->derr[i]);
    for (int i = 0; i < n; i++) cycle_proposed(e, e->dwho[i], &e->dreq[i], e->dkind[i], &e->derr[i]);
}

/* After the forward that verified proposals left on the device: the host's
 * copy of them, checked as cycle_proposed checks any (a lane whose
 * proposals fail ends; its verified rows are dropped with the next forward). */
static void cycle_fetch(splash_engine *e) {
    const int n = e->step_dev;
    if (!n) return;
    e->step_dev = 0;
    memset(e->derr, 0, sizeof *e->derr * (size_t)n);
    for (int i = 0; i < n; i++) e->dtok[i] = e->dwho[i]->props, e->dwho[i]->dev_first = -1;
    e->draft->ops->fetch_proposals(e->draft->impl, e->dreq, n, e->dtok, e->dkind, e->derr);
    for (int i = 0; i < n; i++)
        if (e->dwho[i]->g) cycle_proposed(e, e->dwho[i], &e->dreq[i], e->dkind[i], &e->derr[i]);
    e->spec_device_cycles += (uint64_t)n;
}

/* The draft's taps of rows [r0, r1) of the lane's rows this step (row r at
 * position n_past0 + r; the lane's first TAPS row is row `first`). */
static splash_draft_taps lane_taps(const splash_engine *e, const lane *l, int n_past0, int first, int r0, int r1) {
    size_t w = (size_t)e->draft->n_taps * e->needs->hidden, at = (size_t)(l->tap_row + r0 - first) * w;
    const float *base = e->device_taps ? splash_model_device_taps(e->model) : e->taps;
    return (splash_draft_taps){l->slot, n_past0 + r0, base + at, r1 - r0};
}

/* One lane's taps into the draft, from wherever they are (device or host). */
static int draft_append_taps(const splash_engine *e, const splash_draft_taps *t, splash_error *err) {
    const splash_draft_ops *o = e->draft->ops;
    return e->device_taps ? o->append_device(e->draft->impl, t->lane, t->pos, t->taps, t->n, err)
                          : o->append(e->draft->impl, t->lane, t->pos, t->taps, t->n, err);
}

/* Taps rows [r0, r1) of the lane's rows this step into the draft (lane_taps).  1 when the lane ended. */
static int draft_append(splash_engine *e, lane *l, int n_past0, int first, int r0, int r1) {
    if (!e->draft || !e->draft->n_taps || r1 <= r0) return 0;
    splash_draft_taps t = lane_taps(e, l, n_past0, first, r0, r1);
    splash_error err = {0};
    int rc = draft_append_taps(e, &t, &err);
    if (rc) {
        lane_end(e, l, SPLASH_FINISH_ERROR, err.msg);
        return 1;
    }
    return 0;
}

/* Decoding crossed into a new page: keep the state there (only the lane's latest). */
static void lane_decode_snapshot(splash_engine *e, lane *l) {
    if (l->n_past % e->needs->page_tokens) return;
    int prev = l->decode_snap;
    int now = lane_snapshot(e, l, SPLASH_SNAP_REPLAY);
    if (now >= 0) {
        if (prev >= 0 && l->decode_node && l->decode_node->snap == prev) splash_state_cache_drop(&e->sc, prev);
        l->decode_node = e->sc.snaps[now].node;
        l->decode_snap = now;
    }
}

/* The most rows a decoding lane may commit this cycle out of `want`: up to the
 * page boundary when its pages go to the prefix cache (a snapshot there). */
static int lane_commit_limit(const splash_engine *e, const lane *l, int want) {
    const int pt = e->needs->page_tokens, n0 = l->n_past, edge = (n0 / pt + 1) * pt;
    return e->use_cache && edge < n0 + want ? edge - n0 : want;
}

/* A lane's cycle after its decision (k proposals accepted, out[j] the last
 * token emitted, c rows committed): its counts, positions and tokens. */
static void cycle_cut(splash_engine *e, lane *l, int k, int j, int c, int verified) {
    const int nf = l->n_feed, n0 = l->n_past, good = nf + j;
    l->cy_verified = verified;
    l->n_past += c;
    for (int r = nf; r < good; r++) l->seq[n0 + r] = l->props[r - nf];
    l->seq[n0 + good] = l->out[j];
    l->cy_k = k, l->cy_j = j, l->cy_good = good, l->cy_c = c, l->cy_n0 = n0;
}

/* After the decode forward (VERIFY rows, or one PREFILL row when nothing was
 * proposed: verified = 0, nothing to commit), a cycle ends in phases run for
 * all its lanes: decide (this function, lane by lane), the model's commit of
 * every lane at once (cycle_commit_lanes), then (cycle_end) the draft fed the
 * taps of the rows up to the commit, the pages and a snapshot, the draft fed
 * the rest, emit.  The model and the draft see every lane's rows of a phase
 * at once (commit_lanes, append_lanes).  0, or 1 when the lane ended. */
static int cycle_commit(splash_engine *e, lane *l, spec_times *tm, int verified) {
    splash_gen *g = l->g;
    int nf = l->n_feed, np = l->n_props;
    int32_t forced[SPLASH_DRAFT_MAX_BLOCK];
    if (g->script)
        for (int i = 0; i <= np; i++) forced[i] = script_token(e, g, l->n_out + i);
    splash_spec_block b = lane_rows(e, l); /* rows nf-1 .. nf-1+np */
    b.draft = l->dkind == SPLASH_DRAFT_LOGITS ? l->dlogits : NULL;
    b.props = l->props;
    b.n = np;
    b.pos0 = (uint64_t)(g->n_prompt + l->n_out);
    b.forced = g->script ? forced : NULL;
    b.sparse = l->dkind == SPLASH_DRAFT_SPARSE ? l->dq : NULL;
    splash_error err = {0};
    double t = splash_now();
    int k = splash_spec_decide(e->sampler, &e->q, &g->sp, &l->hist, &b, l->out, &err);
    tm->accept += splash_now() - t;
    if (k < 0) {
        lane_end(e, l, SPLASH_FINISH_ERROR, err.msg);
        return 1;
    }
    t = splash_now();
    /* rows whose inputs stand: the feed and the accepted proposals before any stop token */
    const int j = splash_spec_first_stop(l->out, k, e->stop_ids, e->n_stop_ids);
    cycle_cut(e, l, k, j, lane_commit_limit(e, l, nf + j), verified);
    tm->commit += splash_now() - t;
    return 0;
}

/* The greedy lanes of a step whose model decides and commits them (splash_model_commit_greedy,
 * runtime/spec_greedy.h: the same decision and the same cut as cycle_commit's), in one call
 * right behind the forward; the phases after it as cycle_commit's lanes (already committed:
 * cy_verified 0).  Every lane of the step is one (step's `greedy`). */
static void cycle_commit_model(splash_engine *e, spec_times *tm) {
    int n = 0;
    for (int i = 0; i < e->max_lanes; i++) {
        lane *l = &e->lanes[i];
        if (!l->in_batch || !l->g) continue; /* ended by cycle_fetch: its rows are dropped with the next forward */
        const splash_spec_block b = lane_rows(e, l);
        e->glanes[n] = (splash_greedy_lane){l->slot, l->batch_row + l->n_feed - 1, l->n_feed, l->n_props,
                                            lane_commit_limit(e, l, l->n_feed + l->n_props), b.top_ids,
                                            b.top_logits, b.top_n, l->props};
        e->gwho[n++] = l;
    }
    splash_error err = {0};
    double t = splash_now();
    int rc = splash_model_commit_greedy(e->model, e->glanes, n, e->stop_ids, e->n_stop_ids, e->gres, &err);
    tm->verify += splash_now() - t; /* mostly the wait for the forward */
    t = splash_now();
    for (int i = 0; i < n; i++) {
        lane *l = e->gwho[i];
        const splash_greedy_result *r = &e->gres[i];
        if (rc || r->status) {
            lane_end(e, l, SPLASH_FINISH_ERROR,
                     rc ? err.msg : "sampling: no token can be chosen (every token is masked or has a -inf/NaN logit)");
            continue;
        }
        for (int k = 0; k <= r->k; k++) l->out[k] = r->out[k];
        cycle_cut(e, l, r->k, r->j, r->c, 0);
        l->cycling = 1;
    }
    if (!rc) e->spec_model_decided += (uint64_t)n;
    tm->commit += splash_now() - t;
}

/* The model's commit of every cycling lane whose rows were verified, in one
 * call (splash_model_commit_lanes); when it fails, those lanes end. */
static void cycle_commit_lanes(splash_engine *e, spec_times *tm) {
    double t = splash_now();
    int n = 0;
    for (int i = 0; i < e->max_lanes; i++) {
        const lane *l = &e->lanes[i];
        if (l->g && l->cycling && l->cy_verified) e->cslots[n] = l->slot, e->ccounts[n++] = l->cy_c;
    }
    splash_error err = {0};
    if (n && splash_model_commit_lanes(e->model, e->cslots, e->ccounts, n, &err))
        for (int i = 0; i < e->max_lanes; i++) {
            lane *l = &e->lanes[i];
            if (l->g && l->cycling && l->cy_verified) {
                lane_end(e, l, SPLASH_FINISH_ERROR, err.msg);
                l->cycling = 0;
            }
        }
    tm->commit += splash_now() - t;
}

/* Phase `part` of the draft's feeding for the cycling lanes: the draft holds
 * positions before the anchor (row nf-1), first up to the commit (part 0), so
 * a snapshot there has both states at the same position, then the rest
 * (part 1).  One call for all lanes when the draft appends lanes together. */
static void cycle_append(splash_engine *e, int part) {
    if (!e->draft || !e->draft->n_taps) return;
    int n = 0;
    for (int i = 0; i < e->max_lanes; i++) {
        lane *l = &e->lanes[i];
        if (!l->g || !l->cycling) continue;
        int first = l->n_feed - 1, r0 = part ? (l->cy_c > first ? l->cy_c : first) : first;
        int r1 = part ? l->cy_good : l->cy_c;
        if (r1 <= r0) continue;
        e->dtaps[n] = lane_taps(e, l, l->cy_n0, first, r0, r1);
        e->dwho[n++] = l;
    }
    if (!n) return;
    const splash_draft_ops *o = e->draft->ops;
    memset(e->derr, 0, sizeof *e->derr * (size_t)n);
    if (o->append_lanes && n > 1 && e->draft_lanes) {
        o->append_lanes(e->draft->impl, e->dtaps, n, e->device_taps, e->dkind, e->derr);
    } else {
        for (int i = 0; i < n; i++) e->dkind[i] = draft_append_taps(e, &e->dtaps[i], &e->derr[i]);
    }
    for (int i = 0; i < n; i++)
        if (e->dkind[i]) lane_end(e, e->dwho[i], SPLASH_FINISH_ERROR, e->derr[i].msg);
}

/* The last phase of a lane's cycle: the next feed, the counts, the tokens out. */
static void cycle_emit(splash_engine *e, lane *l, spec_times *tm) {
    splash_gen *g = l->g;
    int nf = l->n_feed, np = l->n_props, k = l->cy_k, j = l->cy_j;
    double t = splash_now();
    l->n_feed = 0;
    for (int r = l->cy_c; r < l->cy_good; r++) l->feed[l->n_feed++] = r < nf ? l->feed[r] : l->props[r - nf];
    l->feed[l->n_feed++] = l->out[j];
    pthread_mutex_lock(&g->mu);
    g->n_drafted += np;
    g->n_accepted += k;
    g->n_cycles++;
    pthread_mutex_unlock(&g->mu);
    e->spec_drafted += (uint64_t)np;
    e->spec_accepted += (uint64_t)k;
    e->spec_cycles++;
    tm->commit += splash_now() - t;
    t = splash_now();
    lane_emit(e, l, lane_rows(e, l).target, l->out, j + 1);
    tm->accept += splash_now() - t;
}

/* The phases after cycle_commit, for every lane that committed this step. */
static void cycle_end(splash_engine *e, spec_times *tm) {
    double t = splash_now();
    cycle_append(e, 0);
    for (int i = 0; i < e->max_lanes; i++) {
        lane *l = &e->lanes[i];
        if (!l->g || !l->cycling) continue;
        lane_insert_pages(e, l);
        lane_decode_snapshot(e, l);
    }
    cycle_append(e, 1);
    tm->commit += splash_now() - t;
    for (int i = 0; i < e->max_lanes; i++) {
        lane *l = &e->lanes[i];
        if (l->g && l->cycling) cycle_emit(e, l, tm);
        l->cycling = 0;
    }
}

/* This step, a decoding lane that the model may decide and commit itself
 * (cycle_commit_model): greedy, verifying proposals, its rows TOP rows, and
 * nothing that reads the rows on the host (logprobs, a test script). */
static int lane_model_decides(const splash_engine *e, const lane *l, int mode) {
    const splash_gen *g = l->g;
    return l->decoding && mode == SPLASH_LANE_VERIFY && l->use_top && g->sp.temperature == 0 && !g->sp.logprobs &&
           !g->script && l->n_props + 1 <= SPLASH_GREEDY_MAX_ROWS && e->n_stop_ids <= SPLASH_GREEDY_MAX_STOP;
}

static void step(splash_engine *e) {
    int n_rows = 0, n_lanes = 0, n_logits = 0, n_tops = 0, n_taps = 0;
    int greedy = e->greedy_model; /* every lane of the step one the model decides */
    double t0 = splash_now();
    int any_prefill = 0, any_decode = 0;
    int taps = e->draft && e->draft->n_taps;
    spec_times tm = {0};
    e->step_auto_lanes = e->step_auto_tokens = 0;
    for (int i = 0; e->auto_block && i < e->max_lanes; i++)
        e->step_auto_lanes += e->lanes[i].g && e->lanes[i].decoding && lane_auto(e, e->lanes[i].g);
    e->step_spec = e->step_auto_lanes ? splash_block_choose(&e->bpol, e->step_auto_lanes) : 1;
    plan(e);
    cycle_propose(e); /* the drafts first: their proposals go in the batch */
    tm.draft = splash_now() - t0;
    e->top_k = 0; /* the TOP entries of this step: what its neediest lane asks */
    for (int i = 0; i < e->max_lanes; i++) {
        lane *l = &e->lanes[i];
        l->use_top = l->g && e->slanes[i].rows ? lane_top_need(e, l->g) : 0;
        if (l->use_top > e->top_k) e->top_k = l->use_top;
    }
    for (int i = 0; i < e->max_lanes; i++) {
        lane *l = &e->lanes[i];
        l->in_batch = 0;
        l->logit_row = -1;
        if (!l->g || !e->slanes[i].rows) continue;
        const uint32_t decide = l->use_top ? SPLASH_ROW_TOP : SPLASH_ROW_LOGITS;
        int *n_out = l->use_top ? &n_tops : &n_logits;
        splash_lane *bl = &e->blanes[n_lanes];
        bl->slot = l->slot;
        bl->n_past = l->n_past;
        bl->first_row = n_rows;
        bl->pages = l->pages;
        bl->n_pages = l->n_pages;
        l->tap_row = n_taps;
        l->batch_row = n_rows;
        if (l->decoding) {
            int nf = l->n_feed, n = nf + l->n_props;
            any_decode = 1;
            /* Nothing proposed and one row fed: the row is accepted whatever it
             * predicts, so it goes in as a PREFILL (state advanced in place) and
             * the commit's GDN replay is skipped; same numbers, one pass less. */
            bl->mode = l->n_props == 0 && nf == 1 ? SPLASH_LANE_PREFILL : SPLASH_LANE_VERIFY;
            bl->n_rows = n;
            greedy &= lane_model_decides(e, l, bl->mode);
            for (int r = 0; r < n; r++) {
                int p = l->n_past + r;
                uint32_t fl = r >= nf - 1 ? decide | (taps ? SPLASH_ROW_TAPS : 0) : 0;
                int32_t t = r < nf ? l->feed[r] : l->props[r - nf];
                if (r >= nf && l->dev_first >= 0) /* a proposal still on the device */
                    t = l->dev_first + r - nf, fl |= SPLASH_ROW_DEVICE_TOKEN;
                e->rows[n_rows++] = (splash_row){t, {p, p, p}, fl, NULL};
            }
            l->logit_row = *n_out;
            *n_out += l->n_props + 1;
            if (taps) n_taps += l->n_props + 1;
        } else {
            int n = e->slanes[i].rows;
            any_prefill += n;
            greedy = 0;
            bl->mode = SPLASH_LANE_PREFILL;
            bl->n_rows = n;
            l->tap_first = -1;
            for (int r = 0; r < n; r++) {
                int p = l->n_past + r;
                int last = p == l->g->n_prompt - 1;
                uint32_t fl = last ? decide : 0;
                if (taps && p >= l->taps_from) {
                    fl |= SPLASH_ROW_TAPS;
                    if (l->tap_first < 0) l->tap_first = r;
                    n_taps++;
                }
                e->rows[n_rows++] = (splash_row){l->g->prompt[p], {p, p, p}, fl, NULL};
                if (last) l->logit_row = (*n_out)++;
            }
        }
        l->in_batch = 1;
        n_lanes++;
    }
    if (!n_lanes) {
        pthread_mutex_lock(&e->mu);
        publish(e);
        pthread_mutex_unlock(&e->mu);
        return;
    }
    splash_batch b = {n_lanes, n_rows, e->blanes, e->rows, e->logits, taps ? e->taps : NULL,
                      e->top_k, e->top_ids, e->top_logits, taps && e->device_taps, e->step_dev ? e->dev_props : NULL,
                      greedy};
    splash_error err = {0};
    e->rows_decided += (uint64_t)(n_logits + n_tops);
    e->rows_decided_top += (uint64_t)n_tops;
    double tf = splash_now();
    int rc = splash_model_forward(e->model, &b, &err);
    tm.verify = splash_now() - tf;
    double td = splash_now();
    cycle_fetch(e);
    tm.draft += splash_now() - td;
    if (greedy && !rc) cycle_commit_model(e, &tm);
    for (int i = 0, k = 0; i < e->max_lanes; i++) {
        lane *l = &e->lanes[i];
        if (!l->in_batch) continue;
        const splash_lane *bl = &e->blanes[k++];
        if (!l->g) continue; /* ended by cycle_fetch */
        if (rc) {
            lane_end(e, l, SPLASH_FINISH_ERROR, err.msg);
            continue;
        }
        if (l->decoding) {
            if (!greedy) l->cycling = !cycle_commit(e, l, &tm, bl->mode == SPLASH_LANE_VERIFY);
            continue;
        }
        int n0 = l->n_past;
        l->n_past += bl->n_rows;
        if (l->tap_first >= 0 && draft_append(e, l, n0, l->tap_first, l->tap_first, bl->n_rows)) continue;
        lane_insert_pages(e, l);
        e->prefill_tokens += (uint64_t)bl->n_rows;
        lane_prefill_snapshots(e, l);
        pthread_mutex_lock(&l->g->mu); /* prompt progress (return_progress, the chat page) */
        l->g->n_prefilled = l->n_past;
        pthread_cond_broadcast(&l->g->cv);
        pthread_mutex_unlock(&l->g->mu);
        if (l->logit_row < 0) continue;
        /* the prompt is read: its last row decides the first token (a block of one row) */
        splash_gen *g = l->g;
        int32_t forced = g->script ? script_token(e, g, 0) : -1, tok;
        splash_spec_block sb = lane_rows(e, l);
        sb.pos0 = (uint64_t)g->n_prompt;
        sb.forced = g->script ? &forced : NULL;
        if (splash_spec_decide(e->sampler, &e->q, &g->sp, &l->hist, &sb, &tok, &err) < 0) {
            lane_end(e, l, SPLASH_FINISH_ERROR, err.msg);
            continue;
        }
        l->seq[l->n_past] = tok;
        l->feed[0] = tok;
        l->n_feed = 1;
        lane_emit(e, l, sb.target, &tok, 1);
    }
    cycle_commit_lanes(e, &tm);
    cycle_end(e, &tm);
    double dt = splash_now() - t0;
    if (any_prefill) splash_sched_observe(&e->sched, n_rows, dt);
    pthread_mutex_lock(&e->mu);
    if (any_prefill) e->prefill_seconds += dt;
    else e->decode_seconds += dt;
    if (any_decode && !any_prefill && e->step_auto_lanes) {
        splash_block_observe(&e->bpol, e->step_auto_lanes, e->step_spec, dt, e->step_auto_tokens);
        e->auto_steps[e->step_spec]++;
    }
    if (any_decode && !any_prefill) { /* the cycle's split, from decode-only steps */
        e->spec_t.draft += tm.draft;
        e->spec_t.verify += tm.verify;
        e->spec_t.accept += tm.accept;
        e->spec_t.commit += tm.commit;
        e->spec_steps++;
    }
    publish(e);
    pthread_mutex_unlock(&e->mu);
}

/* Under e->mu, on the engine thread (or with it stopped): copies the pool and
 * cache figures for splash_engine_get_stats. */
static void publish(splash_engine *e) {
    splash_engine_stats *c = &e->pub;
    int evictable = splash_prefix_evictable(&e->pc);
    c->pages_free = e->pool.n_free + evictable; /* what a request can get: cached pages nobody pins are reclaimed */
    c->pages_cached = e->pc.n_nodes;
    c->pages_pinned = e->pc.n_nodes - evictable;
    c->cache_lookups = e->pc.lookups;
    c->cache_hits = e->cache_hits;
    c->cached_tokens = e->cached_tokens;
    c->pages_evicted = e->pc.pages_evicted;
    c->prefill_tokens = e->prefill_tokens;
    c->auto_steps[0] = e->auto_steps[0], c->auto_steps[1] = e->auto_steps[1];
    for (int k = 0; k < 2; k++) /* at 1 and 4 lanes, block 1 and the block */
        for (int w = 0; w < 2; w++) c->auto_rate[k][w] = splash_block_rate_of(&e->bpol, k ? 4 : 1, w);
    c->auto_best[0] = splash_block_best(&e->bpol, 1), c->auto_best[1] = splash_block_best(&e->bpol, 4);
    c->snapshots_held = e->sc.n_held;
    c->snapshot_bytes = splash_state_cache_bytes(&e->sc);
    c->snapshots_taken = e->sc.taken;
    c->snapshots_evicted = e->sc.evicted;
    c->snapshots_restored = e->sc.restored;
    c->spec_cycles = e->spec_cycles;
    c->spec_device_cycles = e->spec_device_cycles;
    c->spec_model_decided = e->spec_model_decided;
    c->spec_drafted = e->spec_drafted;
    c->spec_accepted = e->spec_accepted;
    c->spec_steps = e->spec_steps;
    c->spec_draft_seconds = e->spec_t.draft;
    c->spec_verify_seconds = e->spec_t.verify;
    c->spec_accept_seconds = e->spec_t.accept;
    c->spec_commit_seconds = e->spec_t.commit;
    c->rows_decided = e->rows_decided;
    c->rows_decided_top = e->rows_decided_top;
}

/* Under e->mu: a requested flush drops every unpinned cache page and snapshot. */
static void flush_cache(splash_engine *e) {
    if (!e->flush_req) return;
    while (splash_prefix_evict_one(&e->pc)) {}
    for (int i = 0; i < e->sc.max_snaps; i++)
        if (e->sc.snaps[i].buf && (!e->sc.snaps[i].node || !e->sc.snaps[i].node->pins)) splash_state_cache_drop(&e->sc, i);
    e->flush_left = splash_kv_pool_used(&e->pool);
    e->flush_req = 0;
    publish(e);
    pthread_cond_broadcast(&e->cv);
}

static void *engine_main(void *arg) {
    splash_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        flush_cache(e);
        admit(e);
        while (!e->stopping && !e->n_active) {
            pthread_cond_wait(&e->cv, &e->mu);
            flush_cache(e);
            admit(e);
        }
        int stopping = e->stopping;
        pthread_mutex_unlock(&e->mu);
        if (stopping) break;
        step(e);
    }
    return NULL;
}

/* ---- start / stop ---------------------------------------------------------------- */

/* What the cycle adds to the scratch of the plan's memory: the draft's lane
 * states (the device's, beside the model), and on the CPU, whose budget is
 * host memory, the host arrays too: logits of up to max_block rows per lane
 * (the model's scratch counts one), the taps rows, the draft's logits.  On a
 * GPU those arrays are host memory the device budget does not hold (~335 MB
 * of a 27B's four lanes of 16 rows were counted against it until session 14). */
static size_t cycle_scratch_bytes(const splash_engine *e) {
    if (!e->draft) return 0;
    if (strcmp(e->device, "cpu")) return e->draft->state_bytes;
    size_t V = (size_t)e->vocab, L = (size_t)e->max_lanes, B = (size_t)e->max_block;
    size_t taps = e->draft->n_taps ? ((size_t)e->chunk + L * B) * (size_t)e->draft->n_taps * (size_t)e->needs->hidden : 0;
    return sizeof(float) * (L * (B - 1) * V + taps + L * (B - 1) * V) + e->draft->state_bytes;
}

int splash_engine_start(const splash_engine_options *opt, splash_engine **out, splash_error *err) {
    *out = NULL;
    splash_engine *e = calloc(1, sizeof *e);
    if (!e) return splash_fail(err, SPLASH_E_NOMEM, "out of memory");
    int rc;
    e->max_lanes = opt->max_lanes > 0 ? opt->max_lanes : 4;
    e->max_queue = opt->max_queue > 0 ? opt->max_queue : 64;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    if ((rc = splash_package_open(opt->model_dir, &e->pkg, err))) goto fail;
    /* tokenizer/tokenizer.json.gz (packages from now on) or tokenizer.json (older ones) */
    const char *tj = splash_package_file(e->pkg, "tokenizer/tokenizer.json");
    if (!tj) tj = splash_package_file(e->pkg, "tokenizer/tokenizer.json.gz");
    if (!tj) {
        rc = splash_fail(err, SPLASH_E_NOTFOUND, "%s: the package has no tokenizer/tokenizer.json(.gz)", opt->model_dir);
        goto fail;
    }
    if ((rc = splash_tokenizer_load(tj, &e->tok, err))) goto fail;
    /* the draft: the test's, or the package's (none at block size 1, or when the package has none) */
    if (opt->block_size < 0 || opt->block_size > SPLASH_DRAFT_MAX_BLOCK) {
        rc = splash_fail(err, SPLASH_E_RANGE, "block size %d outside [1, %d]", opt->block_size, SPLASH_DRAFT_MAX_BLOCK);
        goto fail;
    }
    size_t device_free; /* CUDA: device memory free before the model loads (the plan's budget); CPU: 0 */
    if ((rc = splash_device_resolve(opt->device, &e->device, e->device_name, sizeof e->device_name, &device_free,
                                    err)))
        goto fail;
    /* rows per prefill forward: on a GPU a forward reads the weights once and
     * its products run at tensor-core speed only with many rows (27B, H200:
     * 1,981 tokens/s at 256 rows, 5,598 at 2,048, 5,980 at 4,096; NOTES.md);
     * the scheduler still cuts it down while other lanes decode */
    e->chunk = opt->prefill_chunk > 0 ? opt->prefill_chunk : !strcmp(e->device, "cuda") ? SPLASH_GPU_PREFILL_CHUNK : 256;
    splash_sched_init(&e->sched, e->chunk, 64, opt->slice_ms > 0 ? 1e-3 * opt->slice_ms : 0.5);
    /* the block size asked for: the option, else the package's serving.block_size (pack
     * --default-block-size), else 0 = the draft's own */
    int want_block = opt->block_size;
    if (!want_block && !opt->test_draft) {
        const json_value *serving = json_get(splash_package_manifest(e->pkg), "serving");
        const json_value *bs = serving ? json_get(serving, "block_size") : NULL;
        if (bs && bs->type == JSON_NUMBER && bs->num >= 1 && bs->num <= SPLASH_DRAFT_MAX_BLOCK) want_block = (int)bs->num;
        /* asked for auto: the package's 1 is one of the two ways (by default it pins block 1) */
        if (opt->auto_block == SPLASH_AUTO_BLOCK_ON && want_block == 1) want_block = 0;
    }
    if (opt->test_draft) {
        e->draft = opt->test_draft;
    } else if (want_block != 1) { /* the draft runs where the target does (models/dflash/cuda_dflash.h on cuda) */
        splash_draft_options dopt = {.threads = opt->threads, .act = opt->cpu_activations, .lanes = e->max_lanes,
                                     .window = opt->draft_window, .max_block = SPLASH_DRAFT_MAX_BLOCK,
                                     .device = e->device, .share_target = 1};
        rc = splash_draft_open(e->pkg, &dopt, &e->draft, err);
        if (rc == SPLASH_E_UNSUPPORTED && !opt->block_size) { /* not asked for: decode without it */
            LOG_WARN("the package's draft is not used (%s): block 1", err->msg);
            *err = (splash_error){0};
            rc = 0;
        }
        if (rc == SPLASH_E_NOTFOUND) rc = 0;
        else if (rc) goto fail;
        else e->own_draft = 1;
    }
    e->max_block = e->draft ? e->draft->max_block : 1;
    e->block = want_block > 0 ? want_block : e->draft ? e->draft->block_size : 1;
    if (e->block > e->max_block) e->block = e->max_block;
    e->step_spec = 1;
    e->auto_block = opt->auto_block && e->draft && e->block > 1;
    e->on_logits = opt->test_on_logits;
    const char *fr = getenv("SPLASH_FULL_ROWS"); /* an A/B switch, as SPLASH_CUDA_GRAPHS */
    e->full_rows = opt->full_rows || (fr && atoi(fr) != 0);
    e->on_propose = opt->test_on_propose;
    e->hook_ctx = opt->test_ctx;
    splash_model_options mo = {.device = e->device, .threads = opt->threads, .max_rows = e->chunk + e->max_lanes * e->max_block,
                               .max_lanes = e->max_lanes, .kv_format = (splash_kv_format)opt->kv_format,
                               .cpu_activations = (splash_cpu_act)opt->cpu_activations,
                               .n_taps = e->draft ? e->draft->n_taps : 0,
                               .tap_layers = e->draft ? e->draft->tap_layers : NULL};
    if ((rc = splash_model_load(e->pkg, &mo, &e->model, err))) goto fail;
    /* the draft takes the weights it shares with the target from the loaded model (draft.h) */
    if (e->draft && e->own_draft && e->draft->ops->bind_model &&
        (rc = e->draft->ops->bind_model(e->draft->impl, e->model, err)))
        goto fail;
    e->needs = splash_model_get_needs(e->model);
    e->vocab = e->needs->vocab;
    if (e->max_block > e->needs->page_tokens) e->max_block = e->block = e->needs->page_tokens; /* see cycle_finish */
    e->model_snap = (e->needs->state_bytes + 63) / 64 * 64;
    size_t draft_snap = e->draft ? e->draft->snapshot_bytes : 0;
    if (!draft_snap) e->model_snap = e->needs->state_bytes;
    e->max_context = e->needs->max_positions > 0 ? e->needs->max_positions : 4096;
    if (e->max_context > 262144) e->max_context = 262144;
    if (opt->max_context > 0 && opt->max_context < e->max_context) e->max_context = opt->max_context;
    {
        /* the memory plan: the pool is what the budget leaves, capped (default: every lane's
         * full context twice over, so finished requests stay cached beside running ones) */
        size_t pt = (size_t)e->needs->page_tokens;
        size_t want_pages = ((size_t)e->max_context + pt - 1) / pt;
        splash_memory_plan_input pi = {
            .available = opt->available ? opt->available : device_free, /* 0 on the CPU: MemAvailable */
            .max_memory = opt->max_memory,
            .weight_bytes = e->needs->weight_bytes + (e->draft ? e->draft->weight_bytes : 0),
            .scratch_bytes = e->needs->scratch_bytes + cycle_scratch_bytes(e),
            .page_bytes = e->needs->page_bytes, .state_bytes = e->model_snap + draft_snap,
            .page_tokens = e->needs->page_tokens, .lanes = e->max_lanes,
            .model_context = e->max_context, .max_context = opt->max_context,
            .pool_cap = opt->pool_cap ? opt->pool_cap : 2 * (size_t)e->max_lanes * want_pages * e->needs->page_bytes,
            .spare_want = e->needs->spare_bytes};
        if (splash_memory_plan_make(&pi, &e->plan)) {
            strbuf b;
            sb_init(&b);
            splash_memory_plan_print(&e->plan, &b);
            rc = splash_fail(err, SPLASH_E_NOMEM, "the model does not fit (%s)\n%s", e->plan.reason, b.data ? b.data : "");
            sb_free(&b);
            goto fail;
        }
    }
    e->max_context = e->plan.max_context;
    e->pages_per_lane = (e->max_context + e->needs->page_tokens - 1) / e->needs->page_tokens;
    e->n_pages = e->plan.n_pages;
    if (opt->kv_pool_pages > 1 && opt->kv_pool_pages < e->n_pages) {
        e->n_pages = opt->kv_pool_pages;
        int cap = e->n_pages * e->needs->page_tokens;
        if (cap < e->max_context) e->max_context = cap;
        e->pages_per_lane = (e->max_context + e->needs->page_tokens - 1) / e->needs->page_tokens;
    }
    e->use_cache = !opt->no_prefix_cache;
    e->checkpoint_interval = opt->checkpoint_interval > 0 ? opt->checkpoint_interval : 2048;
    e->checkpoint_interval = (e->checkpoint_interval + e->needs->page_tokens - 1) / e->needs->page_tokens *
                             e->needs->page_tokens;
    e->kv = splash_model_alloc_memory(e->model, e->needs->page_bytes * (size_t)e->n_pages + 1);
    e->states = splash_model_alloc_memory(e->model, e->needs->state_bytes * (size_t)e->max_lanes + 1);
    if (splash_kv_pool_init(&e->pool, e->n_pages) ||
        splash_state_cache_init(&e->sc, e->model, e->model_snap + draft_snap, e->plan.max_snapshots) ||
        splash_prefix_cache_init(&e->pc, e->needs->page_tokens, &e->pool, &e->sc)) {
        rc = splash_fail(err, SPLASH_E_NOMEM, "out of memory for the KV pool (%d pages)", e->n_pages);
        goto fail;
    }
    e->lanes = calloc((size_t)e->max_lanes, sizeof *e->lanes);
    e->slanes = calloc((size_t)e->max_lanes, sizeof *e->slanes);
    e->dreq = calloc((size_t)e->max_lanes, sizeof *e->dreq);
    e->dwho = calloc((size_t)e->max_lanes, sizeof *e->dwho);
    e->dlog = calloc((size_t)e->max_lanes, sizeof *e->dlog);
    e->dtok = calloc((size_t)e->max_lanes, sizeof *e->dtok);
    e->dkind = calloc((size_t)e->max_lanes, sizeof *e->dkind);
    e->derr = calloc((size_t)e->max_lanes, sizeof *e->derr);
    e->dtaps = calloc((size_t)e->max_lanes, sizeof *e->dtaps);
    e->dfirst = calloc((size_t)e->max_lanes, sizeof *e->dfirst);
    e->cslots = calloc((size_t)e->max_lanes * 2, sizeof *e->cslots);
    e->glanes = calloc((size_t)e->max_lanes, sizeof *e->glanes);
    e->gres = calloc((size_t)e->max_lanes, sizeof *e->gres);
    e->gwho = calloc((size_t)e->max_lanes, sizeof *e->gwho);
    e->ccounts = e->cslots ? e->cslots + e->max_lanes : NULL;
    e->rows = malloc(sizeof(splash_row) * (size_t)(e->chunk + e->max_lanes * e->max_block));
    e->blanes = malloc(sizeof(splash_lane) * (size_t)e->max_lanes);
    e->logits = malloc(sizeof(float) * (size_t)e->vocab * (size_t)e->max_lanes * (size_t)e->max_block);
    e->top_ids = malloc(sizeof(int32_t) * SPLASH_MAX_TOP * (size_t)e->max_lanes * (size_t)e->max_block);
    e->top_logits = malloc(sizeof(float) * SPLASH_MAX_TOP * (size_t)e->max_lanes * (size_t)e->max_block);
    /* A draft on the model's device reads the taps where the model leaves them (a 27B's
     * 2,048-row prefill chunk: ~210 MB that would cross to the host and back); else a host
     * buffer for every row of a forward. */
    const char *dt = getenv("SPLASH_DEVICE_TAPS"); /* 0: through the host (an A/B switch, as SPLASH_FULL_ROWS) */
    e->device_taps = e->draft && e->draft->n_taps && e->draft->ops->append_device &&
                     splash_model_device_taps(e->model) && !(dt && !strcmp(dt, "0"));
    if (e->device_taps && e->draft->ops->bind_device_taps) /* the draft's reads ordered on the model's queue */
        e->draft->ops->bind_device_taps(e->draft->impl, splash_model_device_stream(e->model));
    if (e->draft && e->draft->n_taps && !e->device_taps)
        e->taps = malloc(sizeof(float) * (size_t)(e->chunk + e->max_lanes * e->max_block) * (size_t)e->draft->n_taps *
                         (size_t)e->needs->hidden);
    if ((e->draft && e->draft->n_taps && !e->device_taps && !e->taps) || splash_dist_init(&e->q, e->vocab)) {
        rc = splash_fail(err, SPLASH_E_NOMEM, "out of memory for the decode cycle");
        goto fail;
    }
    const char *dl = getenv("SPLASH_DRAFT_LANES"); /* 0: lane by lane (an A/B switch) */
    e->draft_lanes = !(dl && !strcmp(dl, "0"));
    /* Greedy proposals straight from the draft's device memory into the verify (the CUDA
     * draft declines unless its writes are ordered on the model's stream: bound above).
     * SPLASH_DEVICE_PROPOSALS=0 turns it off (an A/B switch: on the H200 the default model
     * served at block 8 measured the same tokens a second either way, session 22; it is the
     * first step of the cycle as one graph, docs/cuda.md). */
    const char *dp = getenv("SPLASH_DEVICE_PROPOSALS");
    e->device_props = e->draft && e->draft->ops->propose_device && e->draft->ops->fetch_proposals &&
                      !(dp && !strcmp(dp, "0"));
    /* Greedy steps decided and committed by the model right behind the forward: on a GPU the
     * forward is not waited for and the host waits once, for the decisions, while the commit
     * runs (the default model served at block 8 on the H200: +5% one lane, +3% four; docs/
     * cuda.md, session 36); other models decide on the host as the engine would.
     * SPLASH_MODEL_DECIDES=0: the engine decides (an A/B switch). */
    const char *md = getenv("SPLASH_MODEL_DECIDES");
    e->greedy_model = !(md && !strcmp(md, "0"));
    if (!e->kv || !e->states || !e->lanes || !e->slanes || !e->rows || !e->blanes || !e->logits || !e->top_ids ||
        !e->top_logits || !e->dreq || !e->dwho || !e->dlog || !e->dtok || !e->dkind || !e->derr || !e->dtaps ||
        !e->dfirst || !e->cslots || !e->glanes || !e->gres || !e->gwho) {
        rc = splash_fail(err, SPLASH_E_NOMEM, "out of memory for the KV pool (%d pages)", e->n_pages);
        goto fail;
    }
    if ((rc = splash_model_attach_memory(e->model, e->kv, e->n_pages, e->states, e->max_lanes, err))) goto fail;
    /* what the plan leaves past the KV cap, to the model (its prefill's fp16 weights on the
     * GPU), after the pool and slots are allocated so they never lose to it */
    if (e->plan.spare && (rc = splash_model_use_spare(e->model, e->plan.spare, &e->spare_used, err))) goto fail;
    publish(e);
    for (int i = 0; i < e->max_lanes; i++) {
        lane *l = &e->lanes[i];
        l->slot = i;
        l->pages = malloc(sizeof(int32_t) * (size_t)e->pages_per_lane);
        l->nodes = calloc((size_t)e->pages_per_lane, sizeof *l->nodes);
        l->seq = malloc(sizeof(int32_t) * (size_t)e->pages_per_lane * (size_t)e->needs->page_tokens);
        l->decode_snap = -1;
        sb_init(&l->held);
        if (e->max_block > 1) l->dlogits = malloc(sizeof(float) * (size_t)(e->max_block - 1) * (size_t)e->vocab);
        if (!l->pages || !l->nodes || !l->seq || (e->max_block > 1 && !l->dlogits) || splash_history_init(&l->hist, 256)) {
            rc = splash_fail(err, SPLASH_E_NOMEM, "out of memory");
            goto fail;
        }
    }
    if ((rc = splash_sampler_create(e->vocab, &e->sampler, err))) goto fail;
    /* stop tokens: the manifest's eos list, <|im_end|> and <|endoftext|> */
    const json_value *toks = json_get(splash_package_manifest(e->pkg), "tokens");
    const json_value *eos = json_get(toks, "eos");
    for (size_t i = 0; eos && eos->type == JSON_ARRAY && i < eos->count && e->n_stop_ids < 6; i++) {
        int64_t id;
        if (!json_int64(eos->items[i], &id)) e->stop_ids[e->n_stop_ids++] = (int32_t)id;
    }
    e->im_start = (int)json_get_int(toks, "im_start", -1);
    static const char *extra[] = {"im_end", "endoftext"};
    for (int k = 0; k < 2; k++) {
        int64_t id = json_get_int(toks, extra[k], -1);
        int dup = 0;
        for (int i = 0; i < e->n_stop_ids; i++) dup |= e->stop_ids[i] == id;
        if (id >= 0 && !dup) e->stop_ids[e->n_stop_ids++] = (int32_t)id;
    }
    if (pthread_create(&e->thread, NULL, engine_main, e)) {
        rc = splash_fail(err, SPLASH_E_NOMEM, "could not start the engine thread");
        goto fail;
    }
    e->started = 1;
    *out = e;
    return 0;
fail:
    splash_engine_free(e);
    return rc;
}

void splash_engine_stop(splash_engine *e, const char *why) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (e->started) {
        pthread_join(e->thread, NULL);
        e->started = 0;
    }
    const char *msg = why ? why : "the server is stopping";
    for (int i = 0; e->lanes && i < e->max_lanes; i++)
        if (e->lanes[i].g) lane_end(e, &e->lanes[i], SPLASH_FINISH_ERROR, msg);
    pthread_mutex_lock(&e->mu);
    while (e->qhead) {
        splash_gen *g = e->qhead;
        e->qhead = g->next;
        e->n_queued--;
        e->requests_done++;
        gen_finish(g, SPLASH_FINISH_ERROR, msg);
        splash_gen_release(g);
    }
    e->qtail = NULL;
    pthread_mutex_unlock(&e->mu);
}

void splash_engine_free(splash_engine *e) {
    if (!e) return;
    splash_engine_stop(e, NULL);
    for (int i = 0; e->lanes && i < e->max_lanes; i++) {
        free(e->lanes[i].pages);
        free(e->lanes[i].nodes);
        free(e->lanes[i].seq);
        free(e->lanes[i].dlogits);
        splash_history_free(&e->lanes[i].hist);
        sb_free(&e->lanes[i].held);
    }
    if (e->pc.buckets) splash_prefix_cache_free(&e->pc);
    splash_state_cache_free(&e->sc);
    splash_kv_pool_free(&e->pool);
    if (e->model) {
        splash_model_free_memory(e->model, e->kv);
        splash_model_free_memory(e->model, e->states);
        splash_model_free(e->model);
    }
    splash_sampler_free(e->sampler);
    if (e->own_draft) splash_draft_free(e->draft);
    splash_dist_free(&e->q);
    free(e->taps);
    splash_tokenizer_free(e->tok);
    splash_package_close(e->pkg);
    free(e->lanes);
    free(e->slanes);
    free(e->dreq);
    free(e->dwho);
    free(e->cslots);
    free(e->glanes);
    free(e->gres);
    free(e->gwho);
    free(e->dlog);
    free(e->dtok);
    free(e->dkind);
    free(e->derr);
    free(e->dtaps);
    free(e->dfirst);
    free(e->rows);
    free(e->blanes);
    free(e->logits);
    free(e->top_ids);
    free(e->top_logits);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

int splash_engine_submit(splash_engine *e, splash_gen *g, splash_error *err) {
    if (pages_for(e, g) > e->pages_per_lane || g->n_prompt < 1)
        return splash_fail(err, SPLASH_E_INVALID, "the request needs %d tokens, more than the context of %d",
                           g->n_prompt + g->max_tokens, e->max_context);
    pthread_mutex_lock(&e->mu);
    if (e->stopping) {
        pthread_mutex_unlock(&e->mu);
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "the server is stopping");
    }
    if (e->n_queued >= e->max_queue) {
        pthread_mutex_unlock(&e->mu);
        return splash_fail(err, SPLASH_E_RANGE, "the request queue is full (%d waiting)", e->n_queued);
    }
    pthread_mutex_lock(&g->mu);
    g->refs++;
    g->engine = e;
    g->state = SPLASH_GEN_QUEUED;
    g->t_submit = splash_now();
    pthread_mutex_unlock(&g->mu);
    g->next = NULL;
    if (e->qtail) e->qtail->next = g;
    else e->qhead = g;
    e->qtail = g;
    e->n_queued++;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

const splash_tokenizer *splash_engine_tokenizer(const splash_engine *e) { return e->tok; }
const json_value *splash_engine_manifest(const splash_engine *e) { return splash_package_manifest(e->pkg); }
int splash_engine_max_context(const splash_engine *e) { return e->max_context; }
int splash_engine_vocab(const splash_engine *e) { return e->vocab; }

void splash_engine_get_stats(splash_engine *e, splash_engine_stats *s) {
    memset(s, 0, sizeof *s);
    pthread_mutex_lock(&e->mu);
    s->queued = e->n_queued;
    s->active = e->n_active;
    s->max_lanes = e->max_lanes;
    s->max_queue = e->max_queue;
    s->pages_total = e->n_pages;
    s->plan_budget = e->plan.budget;
    s->plan_fixed = e->plan.fixed;
    s->plan_scratch = e->plan.scratch;
    s->plan_kv_bytes = e->plan.kv_bytes;
    s->plan_snapshot_bytes = e->plan.snapshot_bytes;
    s->plan_max_snapshots = e->plan.max_snapshots;
    s->plan_spare_bytes = e->spare_used;
    const splash_engine_stats *c = &e->pub; /* the engine thread's figures as of its last step */
    s->pages_free = c->pages_free;
    s->pages_cached = c->pages_cached;
    s->pages_pinned = c->pages_pinned;
    s->cache_lookups = c->cache_lookups;
    s->cache_hits = c->cache_hits;
    s->cached_tokens = c->cached_tokens;
    s->pages_evicted = c->pages_evicted;
    s->prefill_tokens = c->prefill_tokens;
    s->snapshots_held = c->snapshots_held;
    s->snapshot_bytes = c->snapshot_bytes;
    s->snapshots_taken = c->snapshots_taken;
    s->snapshots_evicted = c->snapshots_evicted;
    s->snapshots_restored = c->snapshots_restored;
    s->spec_cycles = c->spec_cycles;
    s->spec_device_cycles = c->spec_device_cycles;
    s->spec_model_decided = c->spec_model_decided;
    s->spec_drafted = c->spec_drafted;
    s->spec_accepted = c->spec_accepted;
    s->spec_steps = c->spec_steps;
    s->spec_draft_seconds = c->spec_draft_seconds;
    s->spec_verify_seconds = c->spec_verify_seconds;
    s->spec_accept_seconds = c->spec_accept_seconds;
    s->spec_commit_seconds = c->spec_commit_seconds;
    s->rows_decided = c->rows_decided;
    s->rows_decided_top = c->rows_decided_top;
    s->device = e->device;
    snprintf(s->device_name, sizeof s->device_name, "%s", e->device_name);
    s->draft = e->draft ? e->draft->name : "none";
    s->block_size = e->block;
    s->block_auto = e->auto_block;
    s->auto_steps[0] = c->auto_steps[0], s->auto_steps[1] = c->auto_steps[1];
    memcpy(s->auto_rate, c->auto_rate, sizeof s->auto_rate);
    s->auto_best[0] = c->auto_best[0], s->auto_best[1] = c->auto_best[1];
    s->page_tokens = e->needs->page_tokens;
    s->slots_total = e->max_lanes;
    s->slots_free = e->max_lanes - e->n_active;
    s->requests_done = e->requests_done;
    s->admissions_deferred = e->admissions_deferred;
    s->prompt_tokens = e->prompt_tokens;
    s->completion_tokens = e->completion_tokens;
    s->prefill_seconds = e->prefill_seconds;
    s->decode_seconds = e->decode_seconds;
    s->weight_bytes = e->needs->weight_bytes;
    s->pool_bytes = e->needs->page_bytes * (size_t)e->n_pages + e->needs->state_bytes * (size_t)e->max_lanes +
                    (e->draft ? e->draft->state_bytes : 0);
    pthread_mutex_unlock(&e->mu);
}

int splash_engine_flush_cache(splash_engine *e) {
    pthread_mutex_lock(&e->mu);
    if (!e->started) { /* no engine thread: flush here */
        e->flush_req = 1;
        flush_cache(e);
    } else {
        e->flush_req = 1;
        pthread_cond_broadcast(&e->cv);
        while (e->flush_req) pthread_cond_wait(&e->cv, &e->mu);
    }
    int left = e->flush_left;
    pthread_mutex_unlock(&e->mu);
    return left;
}
