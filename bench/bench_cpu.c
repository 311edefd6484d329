/* bench_cpu.c - CPU engine speed: prefill and decode tokens/s, peak memory,
 * and decode stated as a fraction of the machine's memory-bandwidth roofline.
 *
 *   bench_cpu --make-random PKG [--weights q4] [--hidden 1024] [--layers 24]
 *             [--vocab 32000] [--intermediate 3584]
 *       writes a random Qwen3.5-shaped dense checkpoint (bf16 safetensors,
 *       real architecture, realistic proportions) to PKG.ckpt and packs it
 *       into PKG with the packer (q4 by default), then removes the checkpoint.
 *   bench_cpu --model PKG [--threads T] [--prompt 256] [--decode 64]
 *       measures, for each activation path of the q4/q8 products (fp32, the
 *       reference; int16; int8), prefill of --prompt rows in one PREFILL lane
 *       and --decode decode cycles (VERIFY 1 row + commit 1); then peak RSS
 *       and memory bandwidth (1 GiB read, copy, triad).
 *
 * Roofline: a decoded token reads every weight once (all layer matrices,
 * lm_head, one embedding row; for MoE only the chosen experts), so decode
 * cannot beat bandwidth / bytes-per-token.  Reported against the read-only
 * bandwidth (what decode does) and against STREAM triad.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "base/fs.h"
#include "base/json.h"
#include "base/mem.h"
#include "base/strbuf.h"
#include "base/threads.h"
#include "package/package.h"
#include "package/packer.h"
#include "runtime/model.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- memory bandwidth -------------------------------------------------------- */

typedef struct bw_job {
    float *a, *b, *c;
    size_t n, per_task;
    int kind; /* 0 read, 1 copy, 2 triad */
    double sums[256];
} bw_job;

static void bw_task(void *ctx, size_t t, int worker) {
    (void)worker;
    bw_job *j = ctx;
    size_t i0 = t * j->per_task, i1 = i0 + j->per_task < j->n ? i0 + j->per_task : j->n;
    if (j->kind == 0) {
        float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
        for (size_t i = i0; i + 8 <= i1; i += 8) {
            s0 += j->a[i], s1 += j->a[i + 1], s2 += j->a[i + 2], s3 += j->a[i + 3];
            s4 += j->a[i + 4], s5 += j->a[i + 5], s6 += j->a[i + 6], s7 += j->a[i + 7];
        }
        j->sums[t % 256] = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
    } else if (j->kind == 1) {
        memcpy(j->b + i0, j->a + i0, (i1 - i0) * sizeof(float));
    } else {
        for (size_t i = i0; i < i1; i++) j->a[i] = j->b[i] + 3.0f * j->c[i];
    }
}

/* Best of 5 passes, GB/s (1e9 bytes). */
static double bandwidth(splash_pool *pool, int kind, float *a, float *b, float *c, size_t n) {
    bw_job j = {a, b, c, n, 1 << 20, kind, {0}};
    size_t tasks = (n + j.per_task - 1) / j.per_task;
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t = now();
        splash_pool_run(pool, tasks, bw_task, &j);
        t = now() - t;
        double bytes = (double)n * sizeof(float) * (kind == 0 ? 1 : kind == 1 ? 2 : 3);
        if (bytes / t > best) best = bytes / t;
    }
    return best / 1e9;
}

/* ---- random checkpoint ------------------------------------------------------- */

static uint64_t rng = 0x243F6A8885A308D3ull;
static double urand(void) {
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}
static float nrand(void) { return (float)((urand() + urand() + urand() + urand() - 2.0) * 1.7320508); }

typedef struct rt {
    char name[128];
    int ndim;
    int64_t shape[3];
    int kind; /* 0 matrix normal/sqrt(fan_in), 1 zero-centred norm, 2 A_log, 3 dt_bias/conv, 4 gated norm */
} rt;

static void add(rt *t, int *n, const char *name, int kind, int ndim, int64_t d0, int64_t d1, int64_t d2) {
    rt *r = &t[(*n)++];
    snprintf(r->name, sizeof r->name, "%s", name);
    r->kind = kind, r->ndim = ndim;
    r->shape[0] = d0, r->shape[1] = d1, r->shape[2] = d2;
}

static int cmp_rt(const void *a, const void *b) { return strcmp(((const rt *)a)->name, ((const rt *)b)->name); }

static int make_checkpoint(const char *dir, int H, int L, int V, int I) {
    int heads = H / 128, kvh = heads / 4 ? heads / 4 : 1, hd = 128, hk = H / 256 ? H / 256 : 1, hv = 2 * hk, dk = 128, dv = 128;
    int conv = 2 * hk * dk + hv * dv;
    rt *t = calloc((size_t)L * 20 + 8, sizeof *t);
    int n = 0;
    char nm[128];
    add(t, &n, "model.embed_tokens.weight", 0, 2, V, H, 0);
    add(t, &n, "lm_head.weight", 0, 2, V, H, 0);
    add(t, &n, "model.norm.weight", 1, 1, H, 0, 0);
    strbuf types;
    sb_init(&types);
    for (int i = 0; i < L; i++) {
        int attn = (i + 1) % 4 == 0;
        sb_printf(&types, "%s\"%s\"", i ? ", " : "", attn ? "full_attention" : "linear_attention");
#define A(suffix, kind, nd, a, b, c) (snprintf(nm, sizeof nm, "model.layers.%d.%s", i, suffix), add(t, &n, nm, kind, nd, a, b, c))
        A("input_layernorm.weight", 1, 1, H, 0, 0);
        A("post_attention_layernorm.weight", 1, 1, H, 0, 0);
        A("mlp.gate_proj.weight", 0, 2, I, H, 0);
        A("mlp.up_proj.weight", 0, 2, I, H, 0);
        A("mlp.down_proj.weight", 0, 2, H, I, 0);
        if (attn) {
            A("self_attn.q_proj.weight", 0, 2, 2 * heads * hd, H, 0);
            A("self_attn.k_proj.weight", 0, 2, kvh * hd, H, 0);
            A("self_attn.v_proj.weight", 0, 2, kvh * hd, H, 0);
            A("self_attn.o_proj.weight", 0, 2, H, heads * hd, 0);
            A("self_attn.q_norm.weight", 1, 1, hd, 0, 0);
            A("self_attn.k_norm.weight", 1, 1, hd, 0, 0);
        } else {
            A("linear_attn.in_proj_qkv.weight", 0, 2, conv, H, 0);
            A("linear_attn.in_proj_z.weight", 0, 2, hv * dv, H, 0);
            A("linear_attn.in_proj_b.weight", 0, 2, hv, H, 0);
            A("linear_attn.in_proj_a.weight", 0, 2, hv, H, 0);
            A("linear_attn.out_proj.weight", 0, 2, H, hv * dv, 0);
            A("linear_attn.conv1d.weight", 3, 3, conv, 1, 4);
            A("linear_attn.A_log", 2, 1, hv, 0, 0);
            A("linear_attn.dt_bias", 3, 1, hv, 0, 0);
            A("linear_attn.norm.weight", 4, 1, dv, 0, 0);
        }
#undef A
    }
    qsort(t, (size_t)n, sizeof *t, cmp_rt);
    splash_error err = {0};
    if (splash_mkdirs(dir, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    strbuf hdr;
    sb_init(&hdr);
    sb_puts(&hdr, "{\"__metadata__\":{\"format\":\"pt\"}");
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t cnt = 1;
        for (int d = 0; d < t[i].ndim; d++) cnt *= (size_t)t[i].shape[d];
        sb_printf(&hdr, ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[", t[i].name);
        for (int d = 0; d < t[i].ndim; d++) sb_printf(&hdr, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        sb_printf(&hdr, "],\"data_offsets\":[%zu,%zu]}", off, off + 2 * cnt);
        off += 2 * cnt;
    }
    sb_putc(&hdr, '}');
    while (hdr.len % 8) sb_putc(&hdr, ' ');
    char *path = splash_path_join(dir, "model.safetensors");
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return 1;
    }
    uint64_t hl = hdr.len;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr.data, 1, hdr.len, f);
    uint16_t *buf = xmalloc(sizeof(uint16_t) << 20);
    for (int i = 0; i < n; i++) {
        size_t cnt = 1;
        for (int d = 0; d < t[i].ndim; d++) cnt *= (size_t)t[i].shape[d];
        float sd = t[i].kind == 0 ? 1.0f / sqrtf((float)t[i].shape[t[i].ndim - 1]) : 0.1f;
        if (strstr(t[i].name, "embed_tokens")) sd = 1.0f;
        for (size_t done = 0; done < cnt;) {
            size_t k = cnt - done < (1u << 20) ? cnt - done : (1u << 20);
            for (size_t e = 0; e < k; e++) {
                float v;
                switch (t[i].kind) {
                case 2: v = logf(0.05f + 0.95f * (float)urand()); break;
                case 3: v = 0.5f * nrand(); break;
                case 4: v = 1.0f + 0.1f * nrand(); break;
                default: v = sd * nrand();
                }
                buf[e] = splash_f32_to_bf16(v);
            }
            fwrite(buf, 2, k, f);
            done += k;
        }
    }
    free(buf);
    if (fclose(f)) {
        perror(path);
        return 1;
    }
    free(path);
    strbuf cfg;
    sb_init(&cfg);
    sb_printf(&cfg,
              "{\"architectures\": [\"Qwen3_5ForCausalLM\"], \"model_type\": \"qwen3_5_text\", \"hidden_size\": %d,\n"
              " \"intermediate_size\": %d, \"num_hidden_layers\": %d, \"vocab_size\": %d, \"num_attention_heads\": %d,\n"
              " \"num_key_value_heads\": %d, \"head_dim\": %d, \"hidden_act\": \"silu\", \"max_position_embeddings\": 262144,\n"
              " \"rms_norm_eps\": 1e-06, \"tie_word_embeddings\": false, \"attention_bias\": false,\n"
              " \"linear_conv_kernel_dim\": 4, \"linear_num_key_heads\": %d, \"linear_num_value_heads\": %d,\n"
              " \"linear_key_head_dim\": %d, \"linear_value_head_dim\": %d, \"partial_rotary_factor\": 0.25,\n"
              " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000.0, \"partial_rotary_factor\": 0.25},\n"
              " \"layer_types\": [%s], \"dtype\": \"bfloat16\"}\n",
              H, I, L, V, heads, kvh, hd, hk, hv, dk, dv, types.data);
    path = splash_path_join(dir, "config.json");
    int rc = splash_write_file(path, cfg.data, cfg.len, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    free(path);
    sb_free(&cfg);
    sb_free(&hdr);
    sb_free(&types);
    free(t);
    return rc ? 1 : 0;
}

/* ---- model timing -------------------------------------------------------------- */

/* Bytes one decoded token reads: every tensor once, except the embedding
 * (one row) and, for MoE, the experts (top_k of E). */
static double bytes_per_token(const splash_package *pkg) {
    const json_value *moe = json_get(json_get(splash_package_manifest(pkg), "model"), "moe");
    double frac = moe ? json_get_num(moe, "top_k", 1) / json_get_num(moe, "experts", 1) : 1.0;
    double total = 0;
    for (size_t i = 0; i < splash_package_tensor_count(pkg); i++) {
        const splash_tensor *t = splash_package_tensor_at(pkg, i);
        if (!strncmp(t->name, "mtp.", 4)) continue;
        if (!strcmp(t->name, "embed"))
            total += (double)t->bytes / (double)t->shape[0];
        else if (strstr(t->name, ".moe.experts_"))
            total += (double)t->bytes * frac;
        else
            total += (double)t->bytes;
    }
    return total;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct bench_result {
    double prefill_tps, decode_tps, bytes_per_token, weight_bytes, rss_mb;
} bench_result;

/* One load of the model (act: "fp32", "int16" or "int8" activations for the
 * q4/q8 products, through SPLASH_CPU_ACT). */
static int bench_model(const char *dir, int threads, int prompt, int decode, const char *act, bench_result *res) {
    splash_error err = {0};
    setenv("SPLASH_CPU_ACT", act, 1);
    splash_package *pkg;
    if (splash_package_open(dir, &pkg, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int max_rows = prompt > 16 ? prompt : 16;
    splash_model_options o = {.threads = threads, .max_rows = max_rows, .max_lanes = 1, .kv_format = SPLASH_KV_F32};
    splash_model *m;
    if (splash_model_load(pkg, &o, &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const splash_model_needs *nd = splash_model_get_needs(m);
    int T = prompt + decode, n_pages = (T + nd->page_tokens - 1) / nd->page_tokens;
    void *kv = splash_model_alloc_memory(m, nd->page_bytes * (size_t)n_pages + 1);
    void *st = splash_model_alloc_memory(m, nd->state_bytes + 1);
    int32_t *pages = malloc(sizeof(int32_t) * (size_t)n_pages);
    for (int i = 0; i < n_pages; i++) pages[i] = i;
    if (!kv || !st || splash_model_attach_memory(m, kv, n_pages, st, 1, &err)) {
        fprintf(stderr, "attach: %s\n", err.msg);
        return 1;
    }
    splash_model_reset_slot(m, 0);
    splash_row *rows = calloc((size_t)max_rows, sizeof *rows);
    float *logits = malloc(sizeof(float) * (size_t)nd->vocab * (size_t)max_rows);
    for (int r = 0; r < prompt; r++)
        rows[r] = (splash_row){(int32_t)((r * 7919) % nd->vocab), {r, r, r}, r == prompt - 1 ? SPLASH_ROW_LOGITS : 0, NULL};
    splash_lane lane = {0, 0, 0, prompt, pages, n_pages, SPLASH_LANE_PREFILL};
    splash_batch b = {1, prompt, &lane, rows, logits, NULL};
    double t0 = now();
    if (splash_model_forward(m, &b, &err)) {
        fprintf(stderr, "prefill: %s\n", err.msg);
        return 1;
    }
    double t_prefill = now() - t0;
    double *steps = calloc((size_t)decode + 1, sizeof *steps);
    for (int i = 0; i < decode; i++) {
        int pos = prompt + i;
        rows[0] = (splash_row){(int32_t)((pos * 7919) % nd->vocab), {pos, pos, pos}, SPLASH_ROW_LOGITS, NULL};
        lane = (splash_lane){0, pos, 0, 1, pages, n_pages, SPLASH_LANE_VERIFY};
        b.n_rows = 1;
        t0 = now();
        if (splash_model_forward(m, &b, &err) || splash_model_commit(m, 0, 1, &err)) {
            fprintf(stderr, "decode: %s\n", err.msg);
            return 1;
        }
        steps[i] = now() - t0;
    }
    /* the median step (the machine may be shared; the first step warms caches) */
    int ns = decode > 1 ? decode - 1 : 0;
    qsort(steps + 1, (size_t)ns, sizeof *steps, cmp_double);
    double t_step = ns ? steps[1 + ns / 2] : 0, t_best = ns ? steps[1] : 0;
    free(steps);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    res->bytes_per_token = bytes_per_token(pkg);
    res->weight_bytes = (double)nd->weight_bytes;
    res->prefill_tps = prompt / t_prefill;
    res->decode_tps = t_step > 0 ? 1.0 / t_step : 0;
    res->rss_mb = (double)ru.ru_maxrss / 1024.0;
    printf("%s activations: prefill %d tokens %.2f s (%.1f tokens/s); decode median %.2f ms/token (%.2f tokens/s, "
           "%.2f GB/s of weights), best %.2f ms\n",
           act, prompt, t_prefill, res->prefill_tps, 1e3 * t_step, res->decode_tps,
           res->decode_tps * res->bytes_per_token / 1e9, 1e3 * t_best);
    splash_model_free_memory(m, kv);
    splash_model_free_memory(m, st);
    splash_model_free(m);
    splash_package_close(pkg);
    free(pages), free(rows), free(logits);
    return 0;
}

static void measure_bandwidth(int threads, double *read, double *copy, double *triad) {
    size_t n = (size_t)1 << 28; /* 1 GiB of floats */
    float *a = splash_aligned_alloc(64, n * 4), *b = splash_aligned_alloc(64, n * 4), *c = NULL;
    splash_pool *pool = splash_pool_create(threads);
    for (size_t i = 0; i < n; i++) a[i] = (float)(i & 1023), b[i] = 1.0f;
    *read = bandwidth(pool, 0, a, b, c, n);
    *copy = bandwidth(pool, 1, a, b, c, n);
    free(a);
    free(b);
    size_t n3 = n / 3;
    a = splash_aligned_alloc(64, n3 * 4), b = splash_aligned_alloc(64, n3 * 4), c = splash_aligned_alloc(64, n3 * 4);
    for (size_t i = 0; i < n3; i++) a[i] = 0, b[i] = 1, c[i] = 2;
    *triad = bandwidth(pool, 2, a, b, c, n3);
    free(a), free(b), free(c);
    splash_pool_destroy(pool);
}

int main(int argc, char **argv) {
    const char *model = NULL, *make = NULL, *weights = "q4";
    int threads = 0, prompt = 256, decode = 64, H = 1024, L = 24, V = 32000, I = 3584, bw = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--model")) model = v, i++;
        else if (!strcmp(a, "--make-random")) make = v, i++;
        else if (!strcmp(a, "--weights")) weights = v, i++;
        else if (!strcmp(a, "--threads")) threads = atoi(v), i++;
        else if (!strcmp(a, "--prompt")) prompt = atoi(v), i++;
        else if (!strcmp(a, "--decode")) decode = atoi(v), i++;
        else if (!strcmp(a, "--hidden")) H = atoi(v), i++;
        else if (!strcmp(a, "--layers")) L = atoi(v), i++;
        else if (!strcmp(a, "--vocab")) V = atoi(v), i++;
        else if (!strcmp(a, "--intermediate")) I = atoi(v), i++;
        else if (!strcmp(a, "--no-bandwidth")) bw = 0;
        else {
            fprintf(stderr, "usage: bench_cpu --make-random PKG [--weights q4|q8|bf16] [--hidden N] [--layers N]\n"
                            "                 [--vocab N] [--intermediate N]\n"
                            "       bench_cpu --model PKG [--threads T] [--prompt N] [--decode N] [--no-bandwidth]\n");
            return 2;
        }
    }
    if (make) {
        char ckpt[1024];
        snprintf(ckpt, sizeof ckpt, "%s.ckpt", make);
        double t = now();
        if (make_checkpoint(ckpt, H, L, V, I)) return 1;
        printf("random checkpoint written to %s in %.1f s\n", ckpt, now() - t);
        splash_pack_options po = {.from = ckpt, .out = make, .weights = (splash_dtype)splash_dtype_parse(weights),
                                  .force = 1};
        splash_pack_stats ps;
        splash_error err = {0};
        if ((int)po.weights < 0 || splash_pack(&po, &ps, &err)) {
            fprintf(stderr, "pack: %s\n", err.msg);
            return 1;
        }
        splash_remove_tree(ckpt);
        printf("packed %s (%s): %.1f MB\n", make, weights, (double)ps.total_bytes / 1e6);
        return 0;
    }
    if (!model) {
        fprintf(stderr, "bench_cpu: --model PKG or --make-random PKG\n");
        return 2;
    }
    if (threads <= 0) {
        splash_pool *p = splash_pool_create(0);
        threads = splash_pool_size(p);
        splash_pool_destroy(p);
    }
    bench_result r[3];
    const char *acts[3] = {"fp32", "int16", "int8"};
    printf("model %s, %d threads\n", model, threads);
    for (int i = 0; i < 3; i++)
        if (bench_model(model, threads, prompt, decode, acts[i], &r[i])) return 1;
    printf("weights %.1f MB, %.1f MB read per decoded token; peak RSS %.1f MB\n", r[0].weight_bytes / 1e6,
           r[0].bytes_per_token / 1e6, r[2].rss_mb);
    if (!bw) return 0;
    double rd, cp, tr;
    measure_bandwidth(threads, &rd, &cp, &tr);
    printf("memory bandwidth: read %.2f GB/s, copy %.2f GB/s, triad %.2f GB/s\n", rd, cp, tr);
    for (int i = 0; i < 3; i++) {
        double gbs = r[i].decode_tps * r[i].bytes_per_token / 1e9;
        printf("decode (%s) at %.0f%% of the read-bandwidth roofline (%.1f tokens/s), %.0f%% of triad\n", acts[i],
               100.0 * gbs / rd, rd * 1e9 / r[i].bytes_per_token, 100.0 * gbs / tr);
    }
    return 0;
}
