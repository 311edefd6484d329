/* cmd_eval.c - `splash eval`: a token sequence through a model, the smallest
 * client of splash_model_forward.
 *
 * It behaves as a one-lane runtime would: allocates the KV pages and one
 * state slot the model declares, prefills in chunks of at most max_rows, and
 * with --incremental N continues after N tokens with the decode cycle of
 * block size 1 (a VERIFY lane of one row, then commit(1)); with --chunk C
 * the continuation runs in VERIFY blocks of C rows, each fully committed
 * (the shape of speculative verification).  Every position's logits can be
 * written out ([T, vocab] float32 little-endian); it prints the sequence's
 * perplexity (mean NLL of token t+1 given tokens 0..t) and the speed.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/fs.h"
#include "base/json.h"
#include "base/status.h"
#include "commands.h"
#include "package/package.h"
#include "runtime/model.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: splash eval --model PKG (--tokens 1,2,3 | --tokens-file F) [--incremental N]\n"
            "                   [--chunk C] [--logits-out FILE] [--threads T] [--max-rows R]\n"
            "                   [--kv-format f32|bf16|int8] [--cpu-activations auto|fp32|int8|int16]\n"
            "                   [--logits all|last] [--device auto|cuda|cpu] [--profile]\n"
            "\n"
            "Runs a token sequence through the model and prints its perplexity and speed.\n"
            "  --tokens-file    a JSON array of ids or a comma-separated list\n"
            "  --incremental N  prefill the first N tokens in one pass, then one token per\n"
            "                   step (a verify row of 1 and commit, the decode cycle)\n"
            "  --chunk C        after the first N tokens, verify blocks of C rows, each\n"
            "                   fully committed\n"
            "  --logits-out F   write every position's logits, float32 [T, vocab]\n"
            "  --max-rows R     rows per forward call (default 512)\n"
            "  --kv-format F    KV page storage: f32 (default, exact), bf16 or int8\n"
            "  --cpu-activations A  activations of q4/q8 products on the CPU: auto (default:\n"
            "                   int8 for q4/q8 packages), fp32 (the exact reference), int8, int16\n"
            "  --logits last    logits only for the last row of each forward call (as a server\n"
            "                   prefills); perplexity then counts those rows only\n"
            "  --device D       auto (default: cuda when built with CUDA and a GPU is visible), cuda, cpu\n"
            "  --profile        print the model's time per part of the forward pass (stderr)\n");
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* "1,2, 3" or "[1, 2, 3]" into a new array */
static int parse_tokens(const char *text, int32_t **out, int *n, splash_error *err) {
    *out = NULL;
    *n = 0;
    const char *p = text;
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
    if (*p == '[') {
        char msg[256];
        json_value *v = json_parse(text, strlen(text), 4, msg, sizeof msg);
        if (!v || v->type != JSON_ARRAY) {
            json_free(v);
            return splash_fail(err, SPLASH_E_FORMAT, "tokens: not a JSON array (%s)", v ? "not an array" : msg);
        }
        int32_t *t = malloc((v->count ? v->count : 1) * sizeof *t);
        for (size_t i = 0; i < v->count; i++) {
            int64_t x;
            if (json_int64(json_at(v, i), &x) || x < 0 || x > INT32_MAX) {
                free(t);
                json_free(v);
                return splash_fail(err, SPLASH_E_FORMAT, "tokens[%zu]: not a token id", i);
            }
            t[i] = (int32_t)x;
        }
        *n = (int)v->count;
        *out = t;
        json_free(v);
        return 0;
    }
    size_t cap = 16;
    int32_t *t = malloc(cap * sizeof *t);
    while (*p) {
        while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r' || *p == ',') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) {
            free(t);
            return splash_fail(err, SPLASH_E_FORMAT, "tokens: \"%.20s\" is not a token id", p);
        }
        if ((size_t)*n == cap) t = realloc(t, (cap *= 2) * sizeof *t);
        t[(*n)++] = (int32_t)x;
        p = end;
    }
    *out = t;
    return 0;
}

typedef struct eval_run {
    splash_model *m;
    const int32_t *tokens;
    int T, vocab;
    int32_t *pages;
    splash_row *rows;
    float *logits;
    FILE *out;
    int last_only; /* --logits last */
    double nll;
    int n_nll;
    double seconds[2]; /* prefill, continuation */
    int counted[2];
} eval_run;

/* Rows [t0, t0+n) as one lane of the given mode; logits scored and written. */
static int run_rows(eval_run *e, int t0, int n, int mode, int phase, splash_error *err) {
    for (int r = 0; r < n; r++) {
        int t = t0 + r;
        uint32_t fl = !e->last_only || r == n - 1 ? SPLASH_ROW_LOGITS : 0;
        e->rows[r] = (splash_row){e->tokens[t], {t, t, t}, fl, NULL};
    }
    const splash_model_needs *nd = splash_model_get_needs(e->m);
    int n_pages = (e->T + nd->page_tokens - 1) / nd->page_tokens;
    splash_lane lane = {0, t0, 0, n, e->pages, n_pages, mode};
    splash_batch b = {.n_lanes = 1, .n_rows = n, .lanes = &lane, .rows = e->rows, .logits = e->logits};
    double t = now();
    int rc = splash_model_forward(e->m, &b, err);
    if (!rc && mode == SPLASH_LANE_VERIFY) rc = splash_model_commit(e->m, 0, n, err);
    e->seconds[phase] += now() - t;
    e->counted[phase] += n;
    if (rc) return rc;
    int n_out = e->last_only ? 1 : n;
    for (int k = 0; k < n_out; k++) {
        int pos = t0 + (e->last_only ? n - 1 : k);
        const float *lg = e->logits + (size_t)k * e->vocab;
        if (pos + 1 < e->T) {
            double mx = lg[0], s = 0;
            for (int v = 1; v < e->vocab; v++) mx = lg[v] > mx ? lg[v] : mx;
            for (int v = 0; v < e->vocab; v++) s += exp((double)lg[v] - mx);
            e->nll += mx + log(s) - lg[e->tokens[pos + 1]];
            e->n_nll++;
        }
    }
    if (e->out && fwrite(e->logits, sizeof(float) * (size_t)e->vocab, (size_t)n_out, e->out) != (size_t)n_out)
        return splash_fail(err, SPLASH_E_IO, "writing logits: %s", strerror(errno));
    return 0;
}

int splash_cmd_eval(int argc, char **argv) {
    const char *model_dir = NULL, *tokens_arg = NULL, *tokens_file = NULL, *logits_out = NULL, *device = "auto";
    int incremental = -1, chunk = 0, threads = 0, max_rows = 512, last_only = 0, profile = 0;
    splash_kv_format kv_format = SPLASH_KV_F32;
    splash_cpu_act cpu_act = SPLASH_CPU_ACT_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--profile")) {
            profile = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "splash eval: %s needs a value (or is unknown)\n\n", a);
            usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(a, "--model")) model_dir = v;
        else if (!strcmp(a, "--tokens")) tokens_arg = v;
        else if (!strcmp(a, "--tokens-file")) tokens_file = v;
        else if (!strcmp(a, "--logits-out")) logits_out = v;
        else if (!strcmp(a, "--incremental")) incremental = atoi(v);
        else if (!strcmp(a, "--chunk")) chunk = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--device") && (!strcmp(v, "auto") || !strcmp(v, "cuda") || !strcmp(v, "cpu"))) device = v;
        else if (!strcmp(a, "--max-rows")) max_rows = atoi(v);
        else if (!strcmp(a, "--logits") && (!strcmp(v, "all") || !strcmp(v, "last"))) last_only = !strcmp(v, "last");
        else if (!strcmp(a, "--cpu-activations") && splash_cpu_act_parse(v) >= 0)
            cpu_act = (splash_cpu_act)splash_cpu_act_parse(v);
        else if (!strcmp(a, "--kv-format") && (!strcmp(v, "f32") || !strcmp(v, "bf16") || !strcmp(v, "int8")))
            kv_format = !strcmp(v, "int8") ? SPLASH_KV_INT8 : !strcmp(v, "bf16") ? SPLASH_KV_BF16 : SPLASH_KV_F32;
        else {
            fprintf(stderr, "splash eval: unknown option %s\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model_dir || (!tokens_arg == !tokens_file) || chunk < 0 || max_rows < 1) {
        fprintf(stderr, "splash eval: --model and one of --tokens / --tokens-file are required\n\n");
        usage(stderr);
        return 2;
    }
    splash_error err = {0};
    int rc = 0;
    int32_t *tokens = NULL;
    int T = 0;
    char *text = NULL;
    splash_package *pkg = NULL;
    splash_model *m = NULL;
    eval_run e;
    memset(&e, 0, sizeof e);
    void *kv = NULL, *states = NULL;
    if (tokens_file) {
        size_t len;
        if ((rc = splash_read_file(tokens_file, &text, &len, &err))) goto done;
    }
    if ((rc = parse_tokens(tokens_file ? text : tokens_arg, &tokens, &T, &err))) goto done;
    if (T < 1) {
        rc = splash_fail(&err, SPLASH_E_INVALID, "no tokens");
        goto done;
    }
    if (incremental < 0) incremental = chunk ? 0 : T;
    if (incremental > T) incremental = T;
    if ((rc = splash_package_open(model_dir, &pkg, &err))) goto done;
    if (profile) setenv("SPLASH_PROFILE", "1", 1); /* the model reports at free */
    char device_name[128];
    if ((rc = splash_device_resolve(device, &device, device_name, sizeof device_name, NULL, &err))) goto done;
    splash_model_options opt = {.device = device, .threads = threads, .max_rows = max_rows, .max_lanes = 1, .kv_format = kv_format,
                                .cpu_activations = cpu_act};
    if ((rc = splash_model_load(pkg, &opt, &m, &err))) goto done;
    const splash_model_needs *nd = splash_model_get_needs(m);
    int n_pages = (T + nd->page_tokens - 1) / nd->page_tokens;
    kv = splash_model_alloc_memory(m, nd->page_bytes * (size_t)n_pages + 1);
    states = splash_model_alloc_memory(m, nd->state_bytes + 1);
    e.pages = malloc(sizeof(int32_t) * (size_t)n_pages);
    e.rows = malloc(sizeof(splash_row) * (size_t)max_rows);
    e.logits = malloc(sizeof(float) * (size_t)max_rows * (size_t)nd->vocab);
    if (!kv || !states || !e.pages || !e.rows || !e.logits) {
        rc = splash_fail(&err, SPLASH_E_NOMEM, "out of memory for %d pages of KV and the logits", n_pages);
        goto done;
    }
    for (int i = 0; i < n_pages; i++) e.pages[i] = i;
    if ((rc = splash_model_attach_memory(m, kv, n_pages, states, 1, &err))) goto done;
    splash_model_reset_slot(m, 0);
    e.m = m;
    e.tokens = tokens;
    e.T = T;
    e.vocab = nd->vocab;
    e.last_only = last_only;
    if (logits_out && !(e.out = fopen(logits_out, "wb"))) {
        rc = splash_fail(&err, SPLASH_E_IO, "%s: %s", logits_out, strerror(errno));
        goto done;
    }
    for (int t = 0; t < incremental && !rc; t += max_rows)
        rc = run_rows(&e, t, incremental - t < max_rows ? incremental - t : max_rows, SPLASH_LANE_PREFILL, 0, &err);
    int step = chunk ? chunk : 1;
    for (int t = incremental; t < T && !rc; t += step)
        rc = run_rows(&e, t, T - t < step ? T - t : step, SPLASH_LANE_VERIFY, 1, &err);
    if (rc) goto done;
    if (e.out && fclose(e.out)) {
        e.out = NULL;
        rc = splash_fail(&err, SPLASH_E_IO, "%s: %s", logits_out, strerror(errno));
        goto done;
    }
    e.out = NULL;
    double total = e.seconds[0] + e.seconds[1];
    printf("device %s (%s)\n", device, device_name);
    printf("tokens %d: prefill %d, then %d in verify blocks of %d\n", T, e.counted[0], e.counted[1], step);
    if (e.n_nll)
        printf("perplexity %.6f  mean_nll %.6f  (%d predictions)\n", exp(e.nll / e.n_nll), e.nll / e.n_nll, e.n_nll);
    printf("time %.3f s  %.1f tokens/s", total, total > 0 ? T / total : 0.0);
    if (e.counted[0] && e.seconds[0] > 0) printf("  prefill %.1f tokens/s", e.counted[0] / e.seconds[0]);
    if (e.counted[1] && e.seconds[1] > 0) printf("  steps %.1f tokens/s", e.counted[1] / e.seconds[1]);
    printf("\n");
done:
    fflush(stdout); /* before --profile's report on stderr */
    if (rc) fprintf(stderr, "splash eval: %s\n", err.msg);
    if (e.out) fclose(e.out);
    if (m) {
        splash_model_free_memory(m, kv);
        splash_model_free_memory(m, states);
        splash_model_free(m);
    }
    splash_package_close(pkg);
    free(e.pages);
    free(e.rows);
    free(e.logits);
    free(tokens);
    free(text);
    return rc ? 1 : 0;
}
