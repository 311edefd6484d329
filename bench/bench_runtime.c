/* bench_runtime.c - the shared runtime end to end on the CPU: time to first
 * token of a long prompt cold and replayed (prefix cache + state snapshot),
 * and aggregate decode tokens/s at 1, 4 and 16 concurrent requests.
 *
 *   bench_runtime --model PKG [--threads T] [--prompt 2000] [--decode 64]
 *                 [--concurrency 1,4,16] [--chunk 256] [--slice-ms 500]
 *
 * PKG needs a tokenizer (the engine loads one): the serve tests' package
 * (tools/make_test_model.py OUT && splash pack --from OUT --out PKG --weights
 * q8, see tests/node/serve_util.mjs) is the usual one.  It goes through
 * splash_engine (the same thread, scheduler, pool and cache as `splash
 * serve`) without HTTP, so the figures are the runtime's, not the server's.
 * Prompts are random token ids; decode lanes emit a scripted token stream
 * (the engine's test hook: every forward, commit and sample step still runs,
 * only the chosen id is fixed) so every request produces exactly --decode
 * tokens.  The prompt length is deliberately not a page multiple: the
 * replayed request must still run its last token, and the snapshot it can
 * restore is the one at the last whole page before that.  Last, a long
 * prompt arrives while one stream decodes and the stream's worst gap between
 * tokens during that prefill is reported (the scheduler's slice bound).
 * A benchmark prints; it asserts nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"
#include "runtime/engine.h"

static unsigned rng = 20261130u;
static int32_t rand_token(int vocab) {
    rng = rng * 1103515245u + 12345u;
    int span = vocab > 20000 ? 20000 : vocab - 200;
    return 100 + (int32_t)((rng >> 8) % (unsigned)span);
}

static splash_gen *make_gen(const int32_t *prompt, int n_prompt, int n_out, int vocab) {
    splash_gen *g = splash_gen_new();
    if (!g) return NULL;
    g->prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    g->script = malloc(sizeof(int32_t) * (size_t)n_out);
    if (!g->prompt || !g->script) {
        splash_gen_release(g);
        return NULL;
    }
    memcpy(g->prompt, prompt, sizeof(int32_t) * (size_t)n_prompt);
    g->n_prompt = n_prompt;
    for (int i = 0; i < n_out; i++) g->script[i] = rand_token(vocab);
    g->n_script = n_out;
    g->max_tokens = n_out;
    g->sp.temperature = 0;
    return g;
}

/* Waits for every gen to end; returns 0 when all ended without an error. */
static int wait_all(splash_gen **gs, int n) {
    int bad = 0;
    strbuf text;
    sb_init(&text);
    for (int i = 0; i < n; i++) {
        splash_gen_take t;
        do {
            splash_gen_wait(gs[i], 1000, &text, &t);
            sb_clear(&text);
        } while (t.finish == SPLASH_FINISH_NONE);
        if (t.finish == SPLASH_FINISH_ERROR) {
            fprintf(stderr, "request %d failed: %s\n", i, t.error);
            bad = 1;
        }
    }
    sb_free(&text);
    return bad;
}

static double ttft(splash_engine *e, const int32_t *prompt, int n, int *cached) {
    splash_gen *g = make_gen(prompt, n, 1, splash_engine_vocab(e));
    splash_error err = {0};
    if (!g || splash_engine_submit(e, g, &err)) {
        fprintf(stderr, "submit: %s\n", err.msg);
        exit(1);
    }
    wait_all(&g, 1);
    double s = g->t_first - g->t_submit;
    *cached = g->n_cached;
    splash_gen_release(g);
    return s;
}

int main(int argc, char **argv) {
    const char *model = NULL, *conc = "1,4,16";
    int threads = 0, n_prompt = 2000, n_decode = 64, chunk = 256, slice_ms = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "%s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--prompt")) n_prompt = atoi(v);
        else if (!strcmp(a, "--decode")) n_decode = atoi(v);
        else if (!strcmp(a, "--chunk")) chunk = atoi(v);
        else if (!strcmp(a, "--slice-ms")) slice_ms = atoi(v);
        else if (!strcmp(a, "--concurrency")) conc = v;
        else {
            fprintf(stderr, "unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (!model || n_prompt < 64 || n_decode < 1) {
        fprintf(stderr, "usage: bench_runtime --model PKG [--threads T] [--prompt N>=64] [--decode N] "
                        "[--concurrency 1,4,16] [--chunk 256] [--slice-ms 500]\n");
        return 2;
    }
    int max_c = 1;
    for (const char *p = conc; *p;) {
        int c = atoi(p);
        if (c > max_c) max_c = c;
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    splash_engine_options eo = {.model_dir = model, .threads = threads, .max_lanes = max_c,
                                .max_queue = 2 * max_c, .prefill_chunk = chunk, .slice_ms = slice_ms,
                                .max_context = n_prompt + 256 + n_decode};
    splash_engine *e;
    splash_error err = {0};
    if (splash_engine_start(&eo, &e, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int vocab = splash_engine_vocab(e);
    printf("model %s, threads %d, lanes %d, chunk %d, slice target %d ms\n", model, threads, max_c, chunk,
           slice_ms ? slice_ms : 500);

    /* ---- time to first token: cold, replayed, next turn ---- */
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)(n_prompt + 128));
    for (int i = 0; i < n_prompt + 128; i++) prompt[i] = rand_token(vocab);
    int cached;
    double cold = ttft(e, prompt, n_prompt, &cached);
    printf("ttft cold      %5d prompt tokens: %8.1f ms (cached %d)\n", n_prompt, 1e3 * cold, cached);
    double warm = ttft(e, prompt, n_prompt, &cached);
    printf("ttft replayed  %5d prompt tokens: %8.1f ms (cached %d), %.1fx faster\n", n_prompt, 1e3 * warm, cached,
           cold / warm);
    double next = ttft(e, prompt, n_prompt + 100, &cached);
    printf("ttft next turn %5d prompt tokens: %8.1f ms (cached %d)\n", n_prompt + 100, 1e3 * next, cached);

    /* ---- aggregate decode tokens/s at each concurrency ---- */
    for (const char *p = conc; *p;) {
        int c = atoi(p);
        splash_gen **gs = calloc((size_t)c, sizeof *gs);
        int32_t short_prompt[32];
        for (int i = 0; i < c; i++) {
            for (int k = 0; k < 32; k++) short_prompt[k] = rand_token(vocab);
            gs[i] = make_gen(short_prompt, 32, n_decode, vocab);
        }
        double t0 = splash_now();
        for (int i = 0; i < c; i++)
            if (splash_engine_submit(e, gs[i], &err)) {
                fprintf(stderr, "submit: %s\n", err.msg);
                return 1;
            }
        wait_all(gs, c);
        double t1 = splash_now(), first = 1e30, end = 0;
        long toks = 0;
        for (int i = 0; i < c; i++) {
            if (gs[i]->t_first < first) first = gs[i]->t_first;
            if (gs[i]->t_end > end) end = gs[i]->t_end;
            toks += gs[i]->n_tokens;
            splash_gen_release(gs[i]);
        }
        free(gs);
        /* the first token of each request comes from its prefill: decode is the rest */
        printf("decode %2d concurrent: %5ld tokens, %8.1f tokens/s aggregate (%.1f per stream), wall %.2f s\n", c,
               toks, (double)(toks - c) / (end - first), (double)(toks - c) / (end - first) / c, t1 - t0);
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    /* ---- a long prompt arriving beside a decoding stream: the stream's worst gap ---- */
    {
        splash_gen *a = make_gen(prompt, 64, n_decode * 4, vocab);
        int32_t *lp = malloc(sizeof(int32_t) * (size_t)n_prompt);
        for (int i = 0; i < n_prompt; i++) lp[i] = rand_token(vocab);
        splash_gen *b = make_gen(lp, n_prompt, 1, vocab);
        free(lp);
        if (splash_engine_submit(e, a, &err)) return 1;
        strbuf text;
        sb_init(&text);
        splash_gen_take t;
        do splash_gen_wait(a, 1000, &text, &t);
        while (!t.n_tokens && t.finish == SPLASH_FINISH_NONE);
        if (splash_engine_submit(e, b, &err)) return 1;
        double last = splash_now(), worst = 0;
        int seen = t.n_tokens;
        while (t.finish == SPLASH_FINISH_NONE) {
            splash_gen_wait(a, 1000, &text, &t);
            sb_clear(&text);
            if (t.n_tokens != seen) {
                double now = splash_now();
                pthread_mutex_lock(&b->mu);
                int b_prefilling = b->t_first == 0;
                pthread_mutex_unlock(&b->mu);
                if (now - last > worst && b_prefilling) worst = now - last;
                last = now;
                seen = t.n_tokens;
            }
        }
        wait_all(&b, 1);
        printf("stall: %d-token prompt prefilled in %.1f ms beside a decoding stream; the stream's worst "
               "token gap meanwhile %.1f ms\n", n_prompt, 1e3 * (b->t_first - b->t_submit), 1e3 * worst);
        sb_free(&text);
        splash_gen_release(a);
        splash_gen_release(b);
    }
    free(prompt);
    splash_engine_free(e);
    return 0;
}
