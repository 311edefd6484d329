/* bench_sampling.c - time of one row through the sampler at the Qwen3.5
 * vocab (248320), for the settings the server meets most.  Prints ns per
 * row.  The rows are model-like: normal logits (sd 2) with a few strong
 * tokens.  "cold" cycles through 8 rows (8 MiB: mostly out of cache, as a
 * row read long after the head wrote it); "hot" repeats one cached row (as
 * right after the head). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "runtime/sampling.h"

enum { V = 248320, ROWS = 8 };

static uint64_t state = 1;
static double rnd01(void) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float *rows;
static splash_sampler *sampler;
static splash_token_history history;
static int n_rows = ROWS;

static void run(const char *name, const splash_sampling_params *p, const splash_token_history *h, int logprobs) {
    int iters = 0;
    double t0 = now(), t;
    long sink = 0;
    do {
        int32_t tok;
        const float *row = rows + (size_t)(iters % n_rows) * V;
        splash_error err;
        if (splash_sample(sampler, p, row, h, NULL, 0, NULL, (uint64_t)iters, &tok, &err)) {
            fprintf(stderr, "%s: %s\n", name, err.msg);
            exit(1);
        }
        if (logprobs) {
            splash_logprobs lp;
            splash_sampler_logprobs(sampler, row, tok, 20, &lp, NULL);
            sink += lp.n_top;
        }
        sink += tok;
        iters++;
        t = now();
    } while (t - t0 < 0.5 || iters < 10);
    printf("%-4s %-44s %10.0f ns/row  (%d candidates, %d rows)\n", n_rows == 1 ? "hot" : "cold", name, (t - t0) / iters * 1e9,
           splash_sampler_dist(sampler)->n, iters + (int)(sink & 0));
}

int main(void) {
    rows = malloc((size_t)ROWS * V * sizeof *rows);
    for (size_t i = 0; i < (size_t)ROWS * V; i++) {
        double a = rnd01(), b = rnd01();
        rows[i] = (float)(2.0 * sqrt(-2 * log(a + 1e-300)) * cos(6.283185307179586 * b));
        if (rnd01() < 0.0005) rows[i] += 9.0f;
    }
    splash_error err;
    if (splash_sampler_create(V, &sampler, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    splash_history_init(&history, 4096);
    for (int i = 0; i < 4000; i++) {
        int32_t t = (int32_t)(rnd01() * V);
        splash_history_add(&history, &t, 1, i < 3000);
    }
    printf("vocab %d\n", V);
    splash_sampling_params p;
    splash_sampling_params_default(&p);
    p.temperature = 0;
    run("temperature 0 (greedy)", &p, NULL, 0);
    p.temperature = 1, p.top_k = 20, p.top_p = 0.95;
    run("T 1, top_k 20, top_p 0.95", &p, NULL, 0);
    p.repetition_penalty = 1.1, p.presence_penalty = 0.5;
    run("  + penalties over 4000 history tokens", &p, &history, 0);
    p.repetition_penalty = 1, p.presence_penalty = 0;
    run("  + logprobs, top_logprobs 20", &p, NULL, 1);
    p.top_k = 0;
    run("T 1, top_p 0.95 (no top_k)", &p, NULL, 0);
    p.top_p = 1, p.min_p = 0.05;
    run("T 1, min_p 0.05", &p, NULL, 0);
    p.min_p = 0;
    run("T 1, no filter", &p, NULL, 0);
    n_rows = 1;
    splash_sampling_params_default(&p);
    p.temperature = 0;
    run("temperature 0 (greedy)", &p, NULL, 0);
    p.temperature = 1, p.top_k = 20, p.top_p = 0.95;
    run("T 1, top_k 20, top_p 0.95", &p, NULL, 0);
    p.repetition_penalty = 1.1, p.presence_penalty = 0.5;
    run("  + penalties over 4000 history tokens", &p, &history, 0);
    splash_history_free(&history);
    splash_sampler_free(sampler);
    free(rows);
    return 0;
}
