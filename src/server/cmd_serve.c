/* cmd_serve.c - `splash serve`: flags, start-up lines, signals.
 *
 * Start-up: open the package and start the engine (Loading), identify the
 * chat template (Chat template), listen (Ready).  SIGINT/SIGTERM are blocked
 * in every thread and taken here with sigwait: the first one stops the
 * listener, ends every queued and running request with an error (streams get
 * an error event and [DONE]), waits for the connections to finish and frees
 * the engine; a second one exits at once.
 */
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/fs.h"
#include "base/log.h"
#include "package/default_model.h"
#include "package/download.h"
#include "runtime/model.h"
#include "commands.h"
#include "package/package.h"
#include "server/server.h"
#include "text/chat_template.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: splash serve [--model PKG|OWNER/REPO] [--offline] [--host 127.0.0.1] [--port 8000] [--max-context N[K]]\n"
            "                    [--api-key KEY] [--allowed-host NAME]... [--max-request-size 128M]\n"
            "                    [--served-model-name NAME]... [--default-reasoning-effort E] [--threads N]\n"
            "                    [--device auto|cuda|cpu] [--no-webui]\n"
            "\n"
            "An OpenAI-compatible HTTP server (docs/api.md).\n"
            "  --model          a package directory, or OWNER/REPO fetched into the verified cache\n"
            "                   (docs/download.md: SPLASH_MODEL_BASE_URL, SPLASH_CACHE_DIR);\n"
            "                   default: the demo model that ships with Splash (docs/default-model.md)\n"
            "  --offline        never touch the network: OWNER/REPO must be fully cached\n"
            "  --port           also SPLASH_PORT; 0 picks a free port (printed on the Ready line)\n"
            "  --api-key        also SPLASH_API_KEY; then every endpoint but /, /health, /ready needs it\n"
            "  --allowed-host   a Host / Origin name to accept besides loopback and the bind address\n"
            "  --no-webui       no chat page at / (the API only)\n"
            "  --device         auto|cuda|cpu: where the model runs (default auto: cuda when this build\n"
            "                   has the CUDA backend and a GPU is visible, else cpu; docs/cuda.md)\n"
            "  --max-context    tokens per request, prompt + output (default: the model's, at most 256K)\n"
            "  --max-lanes      requests decoding together (default 4)\n"
            "  --max-queue      requests waiting for a lane before 429 (default 64)\n"
            "  --max-memory     most bytes the runtime may use (default: available RAM minus a margin)\n"
            "  --kv-format      int8|bf16|f32: KV page storage (default int8)\n"
            "  --cpu-activations auto|fp32|int8|int16: activations of q4/q8 products on the CPU\n"
            "                   (default auto = int8; fp32 is the exact reference)\n"
            "  --prefix-cache   on|off: reuse cached prompt pages and recurrent-state snapshots (default on)\n"
            "  --block-size     1..16: decode block, anchor + draft proposals, every step (1 = no draft;\n"
            "                   without a draft always 1); auto: each step runs the block (the package's\n"
            "                   serving.block_size, else its draft's) or 1, whichever measures faster at\n"
            "                   that many requests (greedy and unseeded requests; seeded ones keep the block).\n"
            "                   Default: auto, or 1 when the package's serving.block_size is 1\n"
            "  --default-reasoning-effort  none|minimal|low|medium|high|xhigh|max for requests that\n"
            "                   do not set one (none = thinking off; the others think as usual)\n"
            "  --test-hooks     accept the tests' \"test_script\" request field (tests only)\n");
}

/* "128M", "100K", "4096" -> bytes or tokens (K/M/G = 1024^n) */
static long long parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return -1;
    long long mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024, end++;
    else if (*end == 'M' || *end == 'm') mul = 1024 * 1024, end++;
    else if (*end == 'G' || *end == 'g') mul = 1024LL * 1024 * 1024, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return -1;
    return (long long)(v * (double)mul);
}

static sigset_t stop_signals;

static void *second_signal(void *arg) {
    int sig;
    sigwait(&stop_signals, &sig);
    fprintf(stderr, "Stopping · second signal, exiting now\n");
    _exit(130);
    return NULL;
}

int splash_cmd_serve(int argc, char **argv) {
    srv_server srv;
    memset(&srv, 0, sizeof srv);
    srv.opt.host = "127.0.0.1";
    srv.opt.port = 8000;
    srv.opt.max_request_size = 128u << 20;
    const char *model = NULL;
    int offline = 0;
    splash_engine_options eo = {.device = "auto", .auto_block = SPLASH_AUTO_BLOCK_DEFAULT};
    eo.kv_format = SPLASH_KV_INT8;
    const char *env = getenv("SPLASH_PORT");
    if (env && *env) srv.opt.port = atoi(env);
    env = getenv("SPLASH_API_KEY");
    if (env && *env) srv.opt.api_key = env;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--test-hooks")) {
            srv.opt.test_hooks = 1;
            continue;
        }
        if (!strcmp(a, "--offline")) {
            offline = 1;
            continue;
        }
        if (!strcmp(a, "--no-webui")) {
            srv.opt.no_webui = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "splash serve: %s needs a value (or is unknown)\n\n", a);
            usage(stderr);
            return 2;
        }
        i++;
        long long n;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--host")) srv.opt.host = v;
        else if (!strcmp(a, "--port")) srv.opt.port = atoi(v);
        else if (!strcmp(a, "--api-key")) srv.opt.api_key = v;
        else if (!strcmp(a, "--threads")) eo.threads = atoi(v);
        else if (!strcmp(a, "--device") && (!strcmp(v, "auto") || !strcmp(v, "cuda") || !strcmp(v, "cpu")))
            eo.device = v;
        else if (!strcmp(a, "--max-lanes")) eo.max_lanes = atoi(v);
        else if (!strcmp(a, "--max-queue")) eo.max_queue = atoi(v);
        else if (!strcmp(a, "--default-reasoning-effort") && srv_reasoning_effort_valid(v))
            srv.opt.default_reasoning_effort = v;
        else if (!strcmp(a, "--body-timeout-ms") && atoi(v) > 0) srv.opt.body_timeout_ms = atoi(v); /* hidden: tests */
        else if (!strcmp(a, "--keepalive-ms") && atoi(v) > 0) srv.opt.keepalive_ms = atoi(v);       /* hidden: tests */
        else if (!strcmp(a, "--allowed-host") && srv.opt.n_allowed_hosts < SRV_MAX_HOSTS)
            srv.opt.allowed_hosts[srv.opt.n_allowed_hosts++] = v;
        else if (!strcmp(a, "--served-model-name") && srv.opt.n_served_names < SRV_MAX_NAMES)
            srv.opt.served_names[srv.opt.n_served_names++] = v;
        else if (!strcmp(a, "--max-context") && (n = parse_size(v)) > 0 && n <= 262144) eo.max_context = (int)n;
        else if (!strcmp(a, "--max-request-size") && (n = parse_size(v)) > 0) srv.opt.max_request_size = (size_t)n;
        else if (!strcmp(a, "--max-memory") && (n = parse_size(v)) > 0) eo.max_memory = (size_t)n;
        else if (!strcmp(a, "--cpu-activations") && splash_cpu_act_parse(v) >= 0) eo.cpu_activations = splash_cpu_act_parse(v);
        else if (!strcmp(a, "--kv-format") && (!strcmp(v, "int8") || !strcmp(v, "bf16") || !strcmp(v, "f32")))
            eo.kv_format = !strcmp(v, "int8") ? SPLASH_KV_INT8 : !strcmp(v, "bf16") ? SPLASH_KV_BF16 : SPLASH_KV_F32;
        else if (!strcmp(a, "--checkpoint-interval") && atoi(v) > 0) eo.checkpoint_interval = atoi(v); /* hidden: tests */
        else if (!strcmp(a, "--kv-pool-pages") && atoi(v) > 1) eo.kv_pool_pages = atoi(v);             /* hidden: tests */
        else if (!strcmp(a, "--block-size") && atoi(v) >= 1 && atoi(v) <= 16)
            eo.block_size = atoi(v), eo.auto_block = SPLASH_AUTO_BLOCK_OFF;
        else if (!strcmp(a, "--block-size") && !strcmp(v, "auto")) eo.auto_block = SPLASH_AUTO_BLOCK_ON, eo.block_size = 0;
        else if (!strcmp(a, "--prefix-cache") && (!strcmp(v, "on") || !strcmp(v, "off")))
            eo.no_prefix_cache = !strcmp(v, "off");
        else {
            fprintf(stderr, "splash serve: bad option %s %s\n\n", a, v);
            usage(stderr);
            return 2;
        }
    }
    char *default_dir = NULL; /* no --model: the package that ships with Splash */
    if (!model) {
        splash_error derr = {0};
        if (splash_default_model_dir(&default_dir, &derr)) {
            fprintf(stderr, "splash serve: %s\n", derr.msg);
            return 2;
        }
        model = default_dir;
    }
    if (srv.opt.port < 0 || srv.opt.port > 65535) {
        fprintf(stderr, "splash serve: --port %d is not a port\n", srv.opt.port);
        return 2;
    }
    /* the model's name: the package directory's last component */
    char name[256];
    snprintf(name, sizeof name, "%s", model);
    size_t nl = strlen(name);
    while (nl > 1 && name[nl - 1] == '/') name[--nl] = 0;
    const char *base = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
    srv.model_name = base;
    if (!srv.opt.n_served_names) srv.opt.served_names[srv.opt.n_served_names++] = base;

    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);

    splash_say("Loading · %s", base);
    splash_error err = {0};
    /* A package directory is used as it is; OWNER/REPO is fetched into (or
     * found in) the verified cache. */
    char *model_dir = NULL;
    int rrc = splash_model_resolve(model, &(splash_download_options){.offline = offline}, &model_dir, &err);
    free(default_dir);
    if (rrc) {
        fprintf(stderr, "splash serve: %s\n", err.msg);
        return 1;
    }
    model = model_dir; /* freed on every return below */
    eo.model_dir = model;
    if (splash_engine_start(&eo, &srv.engine, &err)) {
        fprintf(stderr, "splash serve: %s\n", err.msg);
        free(model_dir);
        return 1;
    }
    if (!srv.opt.default_reasoning_effort) { /* the package's own default (pack --default-reasoning-effort) */
        const json_value *serving = json_get(splash_engine_manifest(srv.engine), "serving");
        const json_value *re = serving ? json_get(serving, "reasoning_effort") : NULL;
        if (re && json_string(re) && srv_reasoning_effort_valid(re->str)) srv.opt.default_reasoning_effort = re->str;
    }
    splash_engine_stats est; /* the device, and the decode cycle (a line only when a draft proposes) */
    splash_engine_get_stats(srv.engine, &est);
    splash_say("Device · %s · %s", est.device, est.device_name);
    if (strcmp(est.draft, "none"))
        splash_say("Draft · %s · block %d%s", est.draft, est.block_size, est.block_auto ? " or 1, chosen step by step" : "");
    else if (json_get(splash_engine_manifest(srv.engine), "draft"))
        splash_say("Draft · in the package, not used: block 1 (%s)",
                   eo.block_size == 1 ? "--block-size 1" : "the package's default; --block-size N or auto uses it");
    char *tmpl = NULL, diff[256];
    size_t tlen = 0;
    char tdir[PATH_MAX];
    snprintf(tdir, sizeof tdir, "%s/tokenizer", model);
    splash_error terr = {0};
    if (!splash_chat_template_read_dir(tdir, &tmpl, &tlen, &terr))
        splash_say("Chat template · %s", splash_chat_template_identify(tmpl, tlen, diff, sizeof diff));
    else
        splash_say("Chat template · native (the package has none)");
    free(tmpl);
    srv.started = splash_now();
    srv.started_wall = (long long)time(NULL);
    srv_http *http = NULL;
    char herr[256];
    if (srv_http_start(&srv, &http, herr, sizeof herr)) {
        fprintf(stderr, "splash serve: %s\n", herr);
        splash_engine_free(srv.engine);
        free(model_dir);
        return 1;
    }
    int ctx = splash_engine_max_context(srv.engine);
    char ctxs[32];
    if (ctx % 1024 == 0) snprintf(ctxs, sizeof ctxs, "%dK", ctx / 1024);
    else snprintf(ctxs, sizeof ctxs, "%d", ctx);
    const char *shown = strchr(srv.opt.host, ':') ? "[%s]" : "%s";
    char hostbuf[80];
    snprintf(hostbuf, sizeof hostbuf, shown, srv.opt.host);
    splash_say("Ready · %s · context %s · http://%s:%d", base, ctxs, hostbuf, srv_http_port(http));

    int sig;
    sigwait(&stop_signals, &sig);
    splash_say("Stopping · releasing engine resources");
    pthread_t t2;
    pthread_create(&t2, NULL, second_signal, NULL);
    pthread_detach(t2);
    srv_http_quiesce(http);
    splash_engine_stop(srv.engine, "the server is stopping");
    /* let the streams write their error event and [DONE] (at most 5 s) */
    for (int i = 0; i < 250 && atomic_load(&srv.n_streams_open) > 0; i++) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    srv_http_stop(http);
    splash_engine_free(srv.engine);
    free(model_dir);
    return 0;
}
