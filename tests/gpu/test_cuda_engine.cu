/* test_cuda_engine.cu - the engine (runtime/engine.c) on the CUDA model and
 * the CUDA draft, through splash_engine_start with device "cuda", on the tiny
 * fixtures: what test_cuda_model and test_cuda_draft check apart (the model's
 * forward, the draft's ops) joined as the server runs them (lanes sharing
 * forwards, the draft fed the target's taps, verify and commit, the prefix
 * cache's snapshots of the CUDA state).
 *
 * Packages (tools/gpu_tests.sh packs them with a tokenizer, which the engine
 * needs): <packages>/engine-dflash (dense-tiny + the dflash-tiny draft) and
 * <packages>/engine-moe (moe-tiny), q4 weights (the CUDA experts are q4).  Four prompts, greedy, 24
 * new tokens each, f32 KV; every engine runs the four at once (4 lanes share
 * every forward) unless said.  Checks, each prompt's tokens and the logits
 * row behind every token (a hash of its bytes, the engine's test hook):
 *   cached prefix = cold    CUDA, block 1, the four again in the same engine
 *                           (four other prompts run between, so the lanes hold
 *                           other states): they restore their shared prefix
 *                           (KV pages and the recurrent state's snapshot) and
 *                           give the same bits;
 *                           at block 8 with the DFlash draft, whose lane state
 *                           comes back too, also the same proposals
 *   alone = in a batch      CUDA, block 1: each prompt run alone gives the
 *                           bits it gets beside the other three
 *   block 8 = block 1       CUDA with the package's draft (engine-dflash):
 *                           the speculative cycle is lossless (tokens and
 *                           rows equal to plain decoding), and it drafted
 *                           (the random dflash-tiny is rarely accepted)
 *   8 requests on 4 lanes   the four prompts twice at once, block 8: four wait
 *                           and take over finished lanes (slots, draft lanes
 *                           and cached prefixes reused), the same bits
 *   oracle block 8, 16      CUDA with the oracle test draft (runtime/draft.h)
 *                           proposing each prompt's block-1 continuation, the
 *                           first 0 / 1 / 3 / 7 (0 / 5 / 11 / 15) of a block
 *                           right: the same tokens and rows, every cycle
 *                           accepting what the oracle made acceptable (the
 *                           commits of 0..15 verify rows on the CUDA model);
 *                           block 8 again with the oracle's proposals in
 *                           device memory (propose_device: its rows apart,
 *                           garbage between), the verify reading them there
 *                           (the package's draft is almost never accepted,
 *                           so this is where accepted device proposals run)
 *   CUDA draft ~ CPU draft  block 8 with the package's draft on both
 *                           engines: the cycles at the same positions propose
 *                           the same tokens (the GPU's draft reads the
 *                           target's taps in its device buffer, model.h
 *                           splash_model_device_taps; wrong taps change them)
 *   CUDA ~ CPU              the tokens of the CPU engine (fp32 activations):
 *                           the share that agrees (a sanity bound: the
 *                           numbers' agreement is test_cuda_model's)
 * Runs on a GPU, or on the CPU through tests/gpu/host_emulation.cpp
 * (tools/gpu_tests.sh --emulate, in CI).  Prints one line per check; exits 1
 * if a check failed.  Usage: test_cuda_engine PACKAGES.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "base/strbuf.h"
#include "runtime/draft.h"
#include "runtime/engine.h"
#include "runtime/model.h"
}

#define NPROMPT 4
#define NOUT 24
#define EOS 300 /* the packages' end of text (tools/gpu_tests.sh writes it) */

static int g_fail;

static void check(int ok, const char *pkg, const char *what, const char *detail) {
    if (!ok) g_fail++;
    printf("%s %-14s %-34s %s\n", ok ? "PASS" : "FAIL", pkg, what, detail ? detail : "");
    fflush(stdout);
}

typedef struct {
    const int32_t *prompt;
    int n_prompt;
    uint64_t seed;           /* the oracle draft's agreement (splash_draft_oracle_add's -1) */
    splash_gen *g;
    int32_t out[NOUT];
    uint64_t hash[NOUT + 1]; /* of the logits row behind output token i */
    int n_out, n_tokens, n_cached;
    splash_gen_take t;
} Job;

static Job *g_hook_jobs;
static int g_hook_n;

/* The proposals an engine made, in order (test_on_propose): job, anchor's
 * position, tokens. */
typedef struct {
    int job, n_seq, n;
    int32_t props[8];
} Proposal;
#define MAX_PROPS 1024
static Proposal g_props[MAX_PROPS];
static int g_nprops;

static void on_propose(void *, const splash_gen *g, int n_seq, const int32_t *props, int n) {
    for (int i = 0; i < g_hook_n && g_nprops < MAX_PROPS; i++)
        if (g_hook_jobs[i].g == g) {
            Proposal *q = &g_props[g_nprops++];
            q->job = i, q->n_seq = n_seq, q->n = n < 8 ? n : 8;
            memcpy(q->props, props, sizeof(int32_t) * (size_t)q->n);
        }
}

/* The proposals of job j that an engine made at anchor position n_seq
 * (NULL: none), in a recorded list. */
static const Proposal *find_props(const Proposal *list, int n, int j, int n_seq) {
    for (int i = 0; i < n; i++)
        if (list[i].job == j && list[i].n_seq == n_seq) return &list[i];
    return nullptr;
}

static uint64_t fnv(const float *row, int n) {
    const unsigned char *b = (const unsigned char *)row;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof(float) * (size_t)n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void on_logits(void *, const splash_gen *g, int index, const float *row, int vocab) {
    for (int i = 0; i < g_hook_n; i++)
        if (g_hook_jobs[i].g == g && index <= NOUT) g_hook_jobs[i].hash[index] = fnv(row, vocab);
}

/* The oracle draft with its proposals in device memory: the oracle's
 * propose_device fills a host array (its rows apart, garbage between), copied
 * here to a device buffer whose address the engine hands the verify; fetch is
 * the oracle's.  The copy is synchronous, so the model's stream sees it. */
static struct {
    const splash_draft_ops *inner;
    splash_draft_ops ops;
    int32_t *dev;
    size_t cap; /* entries */
} g_devoracle;

static int devoracle_propose(void *impl, const splash_draft_req *r, int n, const int32_t **base, int *first,
                             splash_error *err) {
    const int32_t *host = NULL;
    int rc = g_devoracle.inner->propose_device(impl, r, n, &host, first, err);
    if (rc) return rc;
    size_t end = 0; /* entries the rows span, the garbage between them included */
    for (int i = 0; i < n; i++)
        if ((size_t)(first[i] + r[i].n) > end) end = (size_t)(first[i] + r[i].n);
    if (end > g_devoracle.cap) return splash_fail(err, SPLASH_E_INVALID, "device oracle: %zu entries", end);
    if (cudaMemcpy(g_devoracle.dev, host, end * sizeof(int32_t), cudaMemcpyHostToDevice) != cudaSuccess)
        return splash_fail(err, SPLASH_E_IO, "device oracle: the copy to the device failed");
    *base = g_devoracle.dev;
    return SPLASH_OK;
}

static splash_draft *device_oracle(int vocab, int block) {
    splash_draft *d = splash_draft_oracle_device_new(vocab, block);
    if (!d) return NULL;
    if (!g_devoracle.dev) {
        g_devoracle.cap = (size_t)SPLASH_DRAFT_MAX_LANES_TEST * (SPLASH_DRAFT_MAX_BLOCK + 3);
        if (cudaMalloc((void **)&g_devoracle.dev, g_devoracle.cap * sizeof(int32_t)) != cudaSuccess) {
            splash_draft_free(d);
            return NULL;
        }
    }
    g_devoracle.inner = d->ops;
    g_devoracle.ops = *d->ops;
    g_devoracle.ops.propose_device = devoracle_propose;
    d->ops = &g_devoracle.ops;
    return d;
}

static splash_engine *start_hooks(const char *pkg, const char *device, int block, splash_draft *draft, int hooks) {
    splash_engine_options o;
    memset(&o, 0, sizeof o);
    o.model_dir = pkg, o.device = device, o.threads = 2, o.max_context = 512, o.max_lanes = NPROMPT;
    o.max_queue = 64, o.prefill_chunk = 256, o.kv_format = SPLASH_KV_F32, o.cpu_activations = SPLASH_CPU_ACT_F32;
    o.block_size = block, o.test_draft = draft;
    if (hooks) o.test_on_logits = on_logits, o.test_on_propose = on_propose;
    splash_engine *e = NULL;
    splash_error err;
    memset(&err, 0, sizeof err);
    if (splash_engine_start(&o, &e, &err)) {
        fprintf(stderr, "FATAL engine on %s (%s, block %d): %s\n", pkg, device, block, err.msg);
        exit(1);
    }
    return e;
}

static splash_engine *start(const char *pkg, const char *device, int block, splash_draft *draft) {
    return start_hooks(pkg, device, block, draft, 1);
}

/* Submits jobs [0, n) at once and waits for all. */
static void run(splash_engine *e, Job *jobs, int n) {
    g_hook_jobs = jobs, g_hook_n = n;
    splash_error err;
    memset(&err, 0, sizeof err);
    for (int i = 0; i < n; i++) {
        Job *j = &jobs[i];
        splash_gen *g = splash_gen_new();
        g->prompt = (int32_t *)malloc(sizeof(int32_t) * (size_t)j->n_prompt);
        memcpy(g->prompt, j->prompt, sizeof(int32_t) * (size_t)j->n_prompt);
        g->n_prompt = j->n_prompt, g->max_tokens = NOUT;
        g->sp.temperature = 0.0; /* greedy (a new gen samples at T = 1) */
        g->sp.seed = j->seed;
        memset(j->hash, 0, sizeof j->hash);
        j->g = g;
        if (splash_engine_submit(e, g, &err)) {
            fprintf(stderr, "FATAL submit: %s\n", err.msg);
            exit(1);
        }
    }
    for (int i = 0; i < n; i++) {
        Job *j = &jobs[i];
        strbuf sb;
        sb_init(&sb);
        splash_gen_take &t = j->t;
        do splash_gen_wait(j->g, 1000, &sb, &t);
        while (!(t.state == SPLASH_GEN_DONE && t.finish != SPLASH_FINISH_NONE));
        if (t.finish == SPLASH_FINISH_ERROR) {
            fprintf(stderr, "FATAL job %d: %s\n", i, t.error);
            exit(1);
        }
        j->n_tokens = t.n_tokens;
        j->n_cached = j->g->n_cached;
        splash_gen_token toks[NOUT];
        j->n_out = splash_gen_records(j->g, 0, NOUT, toks, NULL);
        for (int k = 0; k < j->n_out; k++) j->out[k] = toks[k].id;
        sb_free(&sb);
        splash_gen_release(j->g);
        j->g = NULL;
    }
    g_hook_n = 0;
}

/* 1 when b's tokens (and, rows set, the rows behind them) equal a's */
static int same(const Job *a, const Job *b, int rows) {
    if (a->n_out != b->n_out || memcmp(a->out, b->out, sizeof(int32_t) * (size_t)a->n_out)) return 0;
    return !rows || !memcmp(a->hash, b->hash, sizeof a->hash);
}

/* Prompts of 33 to 61 tokens below the fixtures' 512 ids, sharing their first
 * 32 (the prefix cache restores them for the later ones). */
static int32_t g_prompts[NPROMPT][64];
static const int g_plen[NPROMPT] = {33, 36, 58, 61};

/* Four unrelated prompts of 40 tokens: run between a cold and a warm run, they
 * overwrite the lanes' states, so a restore that left part of a state alone
 * would show. */
static int32_t g_other[NPROMPT][40];

static void others_run(splash_engine *e) {
    Job o[NPROMPT];
    for (int p = 0; p < NPROMPT; p++) {
        memset(&o[p], 0, sizeof o[p]);
        o[p].prompt = g_other[p], o[p].n_prompt = 40;
    }
    const int n = g_nprops;
    run(e, o, NPROMPT);
    g_nprops = n; /* their proposals are not the runs' under test */
}

static void jobs_init(Job *jobs) {
    for (int p = 0; p < NPROMPT; p++) {
        memset(&jobs[p], 0, sizeof jobs[p]);
        jobs[p].prompt = g_prompts[p], jobs[p].n_prompt = g_plen[p];
    }
}

static void test_package(const char *dir, const char *name, int has_draft) {
    char pkg[1024];
    snprintf(pkg, sizeof pkg, "%s/%s", dir, name);
    Job base[NPROMPT], alone[NPROMPT], spec[NPROMPT], cpu[NPROMPT];
    char msg[160];

    splash_engine *e = start(pkg, "cuda", 1, NULL);
    splash_engine_stats st;
    splash_engine_get_stats(e, &st);
    printf("device: %s (%s)\n", st.device, st.device_name);
    jobs_init(base);
    run(e, base, NPROMPT);
    /* again, the prefix cache warm: the prompts restore their cached pages and recurrent state */
    others_run(e);
    jobs_init(alone);
    run(e, alone, NPROMPT);
    int ok = 1, cached = 0;
    for (int p = 0; p < NPROMPT; p++) ok &= same(&base[p], &alone[p], 1), cached += alone[p].n_cached;
    snprintf(msg, sizeof msg, "%d prompt tokens restored", cached);
    check(ok && cached > 0, name, "cached prefix = cold (tokens, rows)", msg);
    /* alone: each prompt by itself, the cache flushed between (cold, as in the batch's first run) */
    jobs_init(alone);
    ok = 1;
    for (int p = 0; p < NPROMPT; p++) {
        splash_engine_flush_cache(e);
        run(e, &alone[p], 1);
        ok &= same(&base[p], &alone[p], 1);
    }
    splash_engine_free(e);
    check(ok, name, "alone = in a batch (tokens, rows)", NULL);

    if (has_draft) {
        /* the CPU engine's proposals first: the GPU's draft reads the target's taps on the
         * device (splash_model_device_taps) where the CPU's reads host rows */
        static Proposal cpu_props[MAX_PROPS];
        e = start(pkg, "cpu", 8, NULL);
        jobs_init(cpu);
        g_nprops = 0;
        run(e, cpu, NPROMPT);
        splash_engine_free(e);
        const int n_cpu_props = g_nprops;
        memcpy(cpu_props, g_props, sizeof(Proposal) * (size_t)n_cpu_props);

        e = start(pkg, "cuda", 8, NULL);
        jobs_init(spec);
        g_nprops = 0;
        run(e, spec, NPROMPT);
        splash_engine_get_stats(e, &st);
        {
            /* again, warm: the CUDA model's and the CUDA draft's states come back from the
             * prefix cache's snapshots; the same tokens and rows, the same proposals */
            static Proposal first[MAX_PROPS];
            const int n_first = g_nprops;
            memcpy(first, g_props, sizeof(Proposal) * (size_t)n_first);
            Job again[NPROMPT];
            others_run(e);
            jobs_init(again);
            g_nprops = 0;
            run(e, again, NPROMPT);
            int same_props = g_nprops == n_first, cached = 0, rok = 1;
            for (int i = 0; same_props && i < g_nprops; i++) { /* by (job, position): lanes may start apart */
                const Proposal *c = find_props(first, n_first, g_props[i].job, g_props[i].n_seq);
                same_props = c && c->n == g_props[i].n &&
                             !memcmp(c->props, g_props[i].props, sizeof(int32_t) * (size_t)c->n);
            }
            for (int p = 0; p < NPROMPT; p++) rok &= same(&spec[p], &again[p], 1), cached += again[p].n_cached;
            snprintf(msg, sizeof msg, "%d prompt tokens restored, %d cycles", cached, g_nprops);
            check(rok && same_props && cached > 0, name, "block 8, cached prefix = cold (+ proposals)", msg);
            g_nprops = n_first;
            memcpy(g_props, first, sizeof(Proposal) * (size_t)n_first);
        }
        splash_engine_free(e);
        /* the cycles both made (the same anchor position; the outputs may part, so not all) */
        int both = 0, equal = 0;
        for (int i = 0; i < g_nprops; i++) {
            const Proposal *c = find_props(cpu_props, n_cpu_props, g_props[i].job, g_props[i].n_seq);
            if (!c || c->n != g_props[i].n) continue;
            both++;
            equal += !memcmp(c->props, g_props[i].props, sizeof(int32_t) * (size_t)c->n);
        }
        /* emulated, the draft's numbers are the CPU's: all; on a GPU a near tie may part them */
        const double bound = strstr(st.device_name, "emulation") ? 1.0 : 0.9;
        snprintf(msg, sizeof msg, "%d of %d cycles at the same positions propose the same (bound %.0f%%)", equal, both,
                 100 * bound);
        check(both >= NPROMPT && equal >= bound * both, name, "CUDA draft ~ CPU draft (proposals)", msg);
        ok = 1;
        for (int p = 0; p < NPROMPT; p++) {
            if (same(&base[p], &spec[p], 1)) continue;
            ok = 0;
            int k = 0, r = 0;
            while (k < base[p].n_out && k < spec[p].n_out && base[p].out[k] == spec[p].out[k]) k++;
            while (r <= NOUT && base[p].hash[r] == spec[p].hash[r]) r++;
            printf("   prompt %d: %d / %d tokens, first different token %d, first different row %d\n", p, spec[p].n_out,
                   base[p].n_out, k, r);
        }
        snprintf(msg, sizeof msg, "draft %s, %llu cycles, %llu drafted, %llu accepted", st.draft,
                 (unsigned long long)st.spec_cycles, (unsigned long long)st.spec_drafted,
                 (unsigned long long)st.spec_accepted);
        check(ok && st.spec_drafted > 0 && strcmp(st.draft, "none"), name, "block 8 = block 1 (tokens, rows)", msg);
        /* greedy requests: their proposals went from the draft to the verify on the device
         * (draft.h, propose_device), so the checks above hold for that path */
        snprintf(msg, sizeof msg, "%llu of %llu lane cycles", (unsigned long long)st.spec_device_cycles,
                 (unsigned long long)st.spec_cycles);
        check(st.spec_device_cycles > 0 && st.spec_device_cycles <= st.spec_cycles, name,
              "proposals to the verify on the device", msg);

        /* eight requests on the four lanes (four wait, then take over finished lanes:
         * the CUDA model's slots and the draft's lanes reused, cached prefixes restored) */
        e = start(pkg, "cuda", 8, NULL);
        Job eight[2 * NPROMPT];
        jobs_init(eight), jobs_init(eight + NPROMPT);
        const int n_keep = g_nprops;
        run(e, eight, 2 * NPROMPT);
        g_nprops = n_keep;
        splash_engine_free(e);
        ok = 1;
        for (int i = 0; i < 2 * NPROMPT; i++) ok &= same(&base[i % NPROMPT], &eight[i], 1);
        check(ok, name, "8 requests on 4 lanes, block 8 = block 1", NULL);
    }

    /* the oracle draft: prompt p's cycles propose its block-1 continuation, the first
     * kk[p] of each block right, so every cycle accepts exactly min(kk, proposals)
     * and the commits of 0..15 rows run on the CUDA model; the third run's proposals
     * go to the verify from device memory; the fourth's too, without the logits
     * hook: its rows are TOP rows, and the CUDA model decides and commits its greedy
     * steps (splash_model_commit_greedy), the tokens compared alone */
    for (int bi = 0; bi < 4; bi++) {
        static const int blocks[4] = {8, 16, 8, 8};
        static const int kks[4][NPROMPT] = {{0, 1, 3, 7}, {0, 5, 11, 15}, {2, 7, 4, 6}, {2, 7, 4, 6}};
        const int block = blocks[bi], *kk = kks[bi], dev = bi >= 2, model_decides = bi == 3;
        splash_draft *d = dev ? device_oracle(512, block) : splash_draft_oracle_new(512, block);
        for (int p = 0; p < NPROMPT && d; p++) {
            int32_t seq[64 + NOUT + 1];
            memcpy(seq, g_prompts[p], sizeof(int32_t) * (size_t)g_plen[p]);
            memcpy(seq + g_plen[p], base[p].out, sizeof(int32_t) * (size_t)base[p].n_out);
            int n = g_plen[p] + base[p].n_out;
            if (base[p].n_tokens > base[p].n_out) seq[n++] = EOS; /* it stopped on the stop token */
            if (splash_draft_oracle_add(d, seq, n, -1)) splash_draft_free(d), d = NULL;
        }
        if (!d) {
            fprintf(stderr, "FATAL oracle draft\n");
            exit(1);
        }
        e = start_hooks(pkg, "cuda", block, d, !model_decides);
        jobs_init(spec);
        for (int p = 0; p < NPROMPT; p++) spec[p].seed = (uint64_t)kk[p];
        run(e, spec, NPROMPT);
        splash_engine_get_stats(e, &st);
        splash_engine_free(e);
        splash_draft_free(d);
        ok = !dev || (st.spec_device_cycles > 0 && st.spec_device_cycles <= st.spec_cycles);
        ok &= model_decides ? st.spec_model_decided > 0 && st.spec_model_decided <= st.spec_cycles
                            : st.spec_model_decided == 0;
        int accepted = 0;
        for (int p = 0; p < NPROMPT; p++) {
            const splash_gen_take *t = &spec[p].t;
            ok &= same(&base[p], &spec[p], !model_decides) && t->accepted <= kk[p] * t->cycles;
            if (kk[p] == 0) ok &= t->accepted == 0;
            if (kk[p] == block - 1) ok &= t->accepted == t->drafted && t->accepted > 0;
            accepted += t->accepted;
        }
        snprintf(msg, sizeof msg,
                 "agreeing %d / %d / %d / %d a cycle: %d accepted, %llu of %llu lane cycles on the device, %llu "
                 "decided by the model",
                 kk[0], kk[1], kk[2], kk[3], accepted, (unsigned long long)st.spec_device_cycles,
                 (unsigned long long)st.spec_cycles, (unsigned long long)st.spec_model_decided);
        char what[80];
        snprintf(what, sizeof what, "oracle block %d%s = block 1", block,
                 model_decides ? ", decided by the model (tokens)" : dev ? ", proposals on the device" : "");
        check(ok, name, what, msg);
    }

    e = start(pkg, "cpu", 1, NULL);
    jobs_init(cpu);
    run(e, cpu, NPROMPT);
    splash_engine_free(e);
    int agree = 0, total = 0;
    for (int p = 0; p < NPROMPT; p++) {
        int k = 0; /* tokens equal up to the first difference (after it the contexts differ) */
        while (k < cpu[p].n_out && k < base[p].n_out && cpu[p].out[k] == base[p].out[k]) k++;
        agree += k, total += cpu[p].n_out;
    }
    snprintf(msg, sizeof msg, "%d of %d tokens before the first difference (bound 75%%)", agree, total);
    check(total > 0 && agree >= 0.75 * total, name, "CUDA ~ CPU (greedy tokens)", msg);
}

/* The memory plan's spare memory reaches the model (memory_plan.h, model.h): with every
 * q4 matrix on cuBLASLt (the fixtures' prompts and matrices are below the served minimums)
 * the model wants its GEMM's weights in fp16, the plan's KV cap leaves room, and the engine
 * hands it over; a 120-token prompt (one prefill forward on cuBLASLt) then gives the tokens
 * and rows of an engine without the copies (SPLASH_CUDA_F16_COPIES=0). */
static void test_spare(const char *dir, const char *name) {
    char pkg[1024], msg[160];
    snprintf(pkg, sizeof pkg, "%s/%s", dir, name);
    static int32_t prompt[120];
    for (int i = 0; i < 120; i++) prompt[i] = (int32_t)((i * 173 + 11) % 511) + 1;
    setenv("SPLASH_CUDA_BLAS_MIN_ROWS", "64", 1);
    setenv("SPLASH_CUDA_BLAS_MIN_WEIGHTS", "1", 1);
    Job with, without;
    size_t spare[2];
    for (int i = 0; i < 2; i++) {
        if (i) setenv("SPLASH_CUDA_F16_COPIES", "0", 1);
        Job *j = i ? &without : &with;
        memset(j, 0, sizeof *j);
        j->prompt = prompt, j->n_prompt = 120;
        splash_engine *e = start(pkg, "cuda", 1, NULL);
        splash_engine_stats st;
        splash_engine_get_stats(e, &st);
        spare[i] = st.plan_spare_bytes;
        run(e, j, 1);
        splash_engine_free(e);
    }
    unsetenv("SPLASH_CUDA_F16_COPIES");
    unsetenv("SPLASH_CUDA_BLAS_MIN_ROWS");
    unsetenv("SPLASH_CUDA_BLAS_MIN_WEIGHTS");
    snprintf(msg, sizeof msg, "%zu bytes taken, %zu with the switch off", spare[0], spare[1]);
    check(spare[0] > 0 && spare[1] == 0, name, "plan's spare to the model", msg);
    check(with.n_out > 0 && same(&with, &without, 1), name, "fp16 copies = expanded (tokens, rows)", NULL);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : getenv("SPLASH_TEST_PACKAGES");
    if (!dir) {
        fprintf(stderr, "usage: test_cuda_engine PACKAGES (or $SPLASH_TEST_PACKAGES)\n");
        return 2;
    }
    /* greedy proposals to the verify on the device (the engine's default; SPLASH_DEVICE_PROPOSALS=0
     * is its off switch): every CUDA engine here takes that path, and the checks below hold for it */
    unsetenv("SPLASH_DEVICE_PROPOSALS");
    for (int p = 0; p < NPROMPT; p++)
        for (int i = 0; i < 64; i++) g_prompts[p][i] = (int32_t)(((i < 32 ? 0 : p * 977) + i * 131 + 7) % 511) + 1;
    for (int p = 0; p < NPROMPT; p++)
        for (int i = 0; i < 40; i++) g_other[p][i] = (int32_t)((p * 53 + i * 197 + 3) % 511) + 1;
    test_package(dir, "engine-dflash", 1);
    test_package(dir, "engine-moe", 0);
    test_spare(dir, "engine-moe");
    printf("%s\n", g_fail ? "FAILED" : "all checks passed");
    return g_fail ? 1 : 0;
}
