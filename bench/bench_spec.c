/* bench_spec.c - the speculative decode cycle on the CPU, through splash_engine.
 *
 *   bench_spec --model PKG [--threads T] [--lanes 1] [--prompt 128] [--decode 64]
 *              [--blocks 8,16]
 *
 * PKG needs a tokenizer (the engine loads one).  Every request decodes a
 * scripted token stream (the engine's test hook: the target still runs every
 * verify row, only the chosen id is fixed), so acceptance is set by the
 * draft, not by the random weights:
 *   - plain: block size 1, no draft - one VERIFY row, commit 1 per token;
 *   - oracle B k: the test oracle proposes the script, agreeing for exactly k
 *     of the B-1 proposals of each cycle, so a cycle emits k+1 tokens; k = 0
 *     is the worst case (every row past the anchor wasted), k = B-1 the best;
 *   - draft: when the package has one (manifest "draft"), its own proposals
 *     at its block size (on random weights they are all rejected: the line
 *     shows what the draft forward costs, not what it buys).
 * For each: ms per decode step (one cycle of every lane) split into draft /
 * verify (the target's forward) /
 * accept (decide + emit) / commit (commit + the draft's taps + cache), from
 * decode-only steps; tokens per cycle; decode tokens/s; speed-up over plain;
 * and verify(B rows) / verify(1 row).  A benchmark prints; it asserts nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"
#include "runtime/draft.h"
#include "runtime/engine.h"

static unsigned rng = 20261130u;
static int32_t rand_token(int vocab) {
    rng = rng * 1103515245u + 12345u;
    int span = vocab > 20000 ? 20000 : vocab - 200;
    return 100 + (int32_t)((rng >> 8) % (unsigned)span);
}

typedef struct result {
    double draft, verify, accept, commit; /* ms per cycle */
    double tokens_per_cycle, tok_s, verify_step_ms;
    long cycles;
    char draft_name[16];
    int block;
} result;

/* Runs `lanes` requests of n_out scripted tokens each; figures from the engine's stats. */
static int measure(const char *model, int threads, int lanes, int block, splash_draft *draft, int32_t **prompts,
                   int n_prompt, int32_t **scripts, int n_out, result *r) {
    splash_engine_options eo = {.model_dir = model, .threads = threads, .max_lanes = lanes, .max_queue = 2 * lanes,
                                .max_context = n_prompt + n_out + 64, .block_size = block, .test_draft = draft};
    splash_engine *e;
    splash_error err = {0};
    if (splash_engine_start(&eo, &e, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    splash_gen **gs = calloc((size_t)lanes, sizeof *gs);
    for (int i = 0; i < lanes; i++) {
        splash_gen *g = gs[i] = splash_gen_new();
        g->prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
        g->script = malloc(sizeof(int32_t) * (size_t)n_out);
        memcpy(g->prompt, prompts[i], sizeof(int32_t) * (size_t)n_prompt);
        memcpy(g->script, scripts[i], sizeof(int32_t) * (size_t)n_out);
        g->n_prompt = n_prompt;
        g->n_script = n_out;
        g->max_tokens = n_out;
        g->sp.temperature = 0;
        if (splash_engine_submit(e, g, &err)) {
            fprintf(stderr, "submit: %s\n", err.msg);
            return 1;
        }
    }
    strbuf text;
    sb_init(&text);
    double first = 1e30, end = 0;
    long toks = 0;
    for (int i = 0; i < lanes; i++) {
        splash_gen_take t;
        do {
            splash_gen_wait(gs[i], 1000, &text, &t);
            sb_clear(&text);
        } while (t.finish == SPLASH_FINISH_NONE);
        if (t.finish == SPLASH_FINISH_ERROR) fprintf(stderr, "request %d failed: %s\n", i, t.error);
        if (gs[i]->t_first < first) first = gs[i]->t_first;
        if (gs[i]->t_end > end) end = gs[i]->t_end;
        toks += t.n_tokens - 1; /* the first token comes from the prefill */
        splash_gen_release(gs[i]);
    }
    sb_free(&text);
    free(gs);
    splash_engine_stats st;
    splash_engine_get_stats(e, &st);
    splash_engine_free(e); /* st.draft names a static string */
    double steps = st.spec_steps ? (double)st.spec_steps : 1, cyc = st.spec_cycles ? (double)st.spec_cycles : 1;
    /* a decode-only step runs one cycle of every lane: per-cycle figures are per step */
    r->draft = 1e3 * st.spec_draft_seconds / steps;
    r->verify = 1e3 * st.spec_verify_seconds / steps;
    r->accept = 1e3 * st.spec_accept_seconds / steps;
    r->commit = 1e3 * st.spec_commit_seconds / steps;
    r->verify_step_ms = r->verify;
    r->cycles = (long)st.spec_cycles;
    r->tokens_per_cycle = (double)(st.spec_accepted + st.spec_cycles) / cyc;
    r->tok_s = (double)toks / (end - first);
    snprintf(r->draft_name, sizeof r->draft_name, "%s", st.draft);
    r->block = st.block_size;
    return 0;
}

static void print(const char *name, const result *r, const result *plain) {
    double total = r->draft + r->verify + r->accept + r->commit;
    printf("%-14s %7.2f %7.2f %7.2f %7.2f %8.2f   %5.2f   %8.1f   %5.2fx   %6.2f\n", name, r->draft, r->verify,
           r->accept, r->commit, total, r->tokens_per_cycle, r->tok_s, plain ? r->tok_s / plain->tok_s : 1.0,
           plain ? r->verify_step_ms / plain->verify_step_ms : 1.0);
}

int main(int argc, char **argv) {
    const char *model = NULL, *blocks = "8,16";
    int threads = 0, lanes = 1, n_prompt = 128, n_out = 64;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "%s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--lanes")) lanes = atoi(v);
        else if (!strcmp(a, "--prompt")) n_prompt = atoi(v);
        else if (!strcmp(a, "--decode")) n_out = atoi(v);
        else if (!strcmp(a, "--blocks")) blocks = v;
        else {
            fprintf(stderr, "unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (!model || lanes < 1 || n_prompt < 1 || n_out < 2) {
        fprintf(stderr, "usage: bench_spec --model PKG [--threads T] [--lanes 1] [--prompt 128] [--decode 64] "
                        "[--blocks 8,16]\n");
        return 2;
    }
    /* the vocab, from a first engine (no draft) */
    splash_engine_options eo = {.model_dir = model, .threads = 1, .max_lanes = 1, .max_context = 256, .block_size = 1};
    splash_engine *e;
    splash_error err = {0};
    if (splash_engine_start(&eo, &e, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int vocab = splash_engine_vocab(e);
    splash_engine_free(e);
    int32_t **prompts = malloc(sizeof *prompts * (size_t)lanes), **scripts = malloc(sizeof *scripts * (size_t)lanes);
    int32_t **refs = malloc(sizeof *refs * (size_t)lanes);
    for (int i = 0; i < lanes; i++) {
        prompts[i] = malloc(sizeof(int32_t) * (size_t)n_prompt);
        scripts[i] = malloc(sizeof(int32_t) * (size_t)n_out);
        refs[i] = malloc(sizeof(int32_t) * (size_t)(n_prompt + n_out));
        for (int k = 0; k < n_prompt; k++) prompts[i][k] = rand_token(vocab);
        for (int k = 0; k < n_out; k++) scripts[i][k] = rand_token(vocab);
        memcpy(refs[i], prompts[i], sizeof(int32_t) * (size_t)n_prompt);
        memcpy(refs[i] + n_prompt, scripts[i], sizeof(int32_t) * (size_t)n_out);
    }
    printf("model %s, threads %d, lanes %d, prompt %d, %d scripted tokens per request\n", model, threads, lanes,
           n_prompt, n_out);
    printf("%-14s %7s %7s %7s %7s %8s   %5s   %8s   %6s   %6s\n", "ms per step", "draft", "verify", "accept", "commit",
           "total", "tok/c", "tok/s", "speed", "verify/1");
    result plain;
    if (measure(model, threads, lanes, 1, NULL, prompts, n_prompt, scripts, n_out, &plain)) return 1;
    print("plain (B 1)", &plain, NULL);
    for (const char *p = blocks; *p;) {
        int b = atoi(p);
        if (b >= 2 && b <= SPLASH_DRAFT_MAX_BLOCK) {
            int ks[3] = {0, b / 2, b - 1};
            for (int i = 0; i < 3; i++) {
                splash_draft *d = splash_draft_oracle_new(vocab, b);
                for (int l = 0; l < lanes; l++) splash_draft_oracle_add(d, refs[l], n_prompt + n_out, ks[i]);
                result r;
                if (measure(model, threads, lanes, b, d, prompts, n_prompt, scripts, n_out, &r)) return 1;
                char name[32];
                snprintf(name, sizeof name, "oracle %d k %d", b, ks[i]);
                print(name, &r, &plain);
                splash_draft_free(d);
            }
        }
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    /* the package's own draft (block 0 = its own size); a package without one runs plain again */
    result r;
    if (measure(model, threads, lanes, 0, NULL, prompts, n_prompt, scripts, n_out, &r)) return 1;
    if (strcmp(r.draft_name, "none")) {
        char name[32];
        snprintf(name, sizeof name, "%s %d", r.draft_name, r.block);
        print(name, &r, &plain);
    } else {
        printf("package draft  (the package has none)\n");
    }
    for (int i = 0; i < lanes; i++) {
        free(prompts[i]);
        free(scripts[i]);
        free(refs[i]);
    }
    free(prompts);
    free(scripts);
    free(refs);
    return 0;
}
