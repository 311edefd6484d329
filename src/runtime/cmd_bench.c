/* cmd_bench.c - `splash bench` (and bench/bench_cpu, the same code): model
 * speed on the CPU or the GPU: prefill and decode tokens/s, verify blocks,
 * peak memory, and decode stated as a fraction of the memory-bandwidth
 * roofline.
 *
 *   splash bench --synthetic 27b|35b-a3b [--layers N] [--dir PKG] [--device auto|cuda|cpu]
 *             [--prompt N] [--decode N] ...
 *       the production model's speed without its weights: the synthetic
 *       package below (made in PKG, default $TMPDIR/splash-synthetic-SHAPE-LAYERS,
 *       unless it is there already), then the --model measurement with int8 KV
 *       (as served) and int8 activations on the CPU unless told otherwise.
 *   splash bench --make-synthetic PKG [--shape 27b|35b-a3b] [--layers N]
 *             [--hidden N] [--vocab N] [--intermediate N]
 *       every tensor of the shape's package over one random blob (blob.bin,
 *       as large as the largest tensor): full depth in seconds, no
 *       quantising; without --shape a dense model of --hidden etc.
 *   splash bench --make-random PKG [--weights q4] [--hidden 1024] [--layers 24]
 *             [--vocab 32000] [--intermediate 3584]
 *       writes a random Qwen3.5-shaped dense checkpoint (bf16 safetensors,
 *       real architecture, realistic proportions) to PKG.ckpt and packs it
 *       into PKG with the packer (q4 by default), then removes the checkpoint.
 *   splash bench --make-random PKG --shape 27b|35b-a3b [--layers N] [--vocab N]
 *       the same with the production models' exact dimensions (the 35B-A3B
 *       with its 256 experts in the Hugging Face per-expert layout); --layers
 *       keeps the first N layers of the 3:1 pattern.
 *   splash bench --model PKG --draft [--device auto|cuda|cpu] [--prompt N] [--verify-reps N]
 *       the package's draft alone (cmd_bench_draft.c): proposals for 1, 2
 *       and 4 lanes at once, blocks of 16 and 8, greedy and T = 1, after N
 *       positions of context; a cycle's append + proposals.  With
 *       --synthetic the synthetic package's draft (DFlash v1 of the
 *       published drafts' depth and taps).
 *   splash bench --model PKG [--device auto|cuda|cpu] [--threads T] [--prompt 256] [--decode 64]
 *             [--verify-reps 5] [--prefill-reps N] [--prefill-chunk N] [--act fp32,int8,int16] [--decode-prefill]
 *             [--no-bandwidth]
 *             [--kv-format f32|bf16|int8] [--random-route]
 *       measures, for each activation path of the q4/q8 products asked for
 *       (fp32 is the exact reference; int8 the fast path; the default runs
 *       fp32 and int8): prefill of --prompt rows in one PREFILL lane
 *       (--prefill-reps runs, each from an empty slot, their median; by
 *       default 3 up to 8,192 rows, else 1; --prefill-chunk N: in forwards
 *       of N rows, as serve feeds a long prompt, the model sized for them),
 *       --decode decode cycles (VERIFY 1 row + commit 1, as the engine does;
 *       with --decode-prefill PREFILL 1 row, no commit), VERIFY blocks of
 *       8 and 16 rows (commit 0); the logits of the decode steps against the
 *       fp32 path's (relative L2, top-1 agreement); then peak RSS and the
 *       memory bandwidth (read, copy, triad over 1 GiB).  KV pages are f32
 *       unless --kv-format says otherwise (serve's default is int8).  The
 *       device defaults to auto (bench_cpu: cpu).  --random-route (CUDA): a
 *       MoE router's logits replaced by a hash of (layer, position, expert),
 *       so every token's experts are drawn at random (a synthetic package's
 *       all-positive weights route every token alike: its verify rows read
 *       far fewer distinct experts than a real model's; this is the other
 *       extreme).
 *
 * Times are medians over the steps with the 10th-90th percentile spread, and
 * CPU seconds per step (user + system of the whole process) as a figure that
 * load on a shared machine changes less.
 *
 * Roofline: a decoded token reads every weight once (all layer matrices,
 * lm_head, one embedding row; for MoE only the chosen experts: the tensor
 * sizes in the package), plus the GDN state (read and written back) and the
 * KV cache up to the context, so decode cannot beat bandwidth / bytes per
 * token.  Reported against the read-only bandwidth (what decode does) and
 * against STREAM triad; with --device cuda (one run, no activation paths)
 * against --gpu-gbs (default 4300, the H200's copy bandwidth as docs/cuda.md
 * counts it).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "base/fs.h"
#include "base/json.h"
#include "base/mem.h"
#include "base/strbuf.h"
#include "base/threads.h"
#include "package/package.h"
#include "package/packer.h"
#include "runtime/bench_stats.h"
#include "runtime/cmd_bench_draft.h"
#include "runtime/model.h"
#include "commands.h"

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

/* The read kernel must not be compute-bound: 64-bit integer adds of whole
 * 32-byte vectors (AVX2 where the CPU has it). */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
__attribute__((target("avx2"))) static uint64_t read_avx2(const float *a, size_t n) {
    const __m256i *p = (const __m256i *)(const void *)a;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 32 <= n; i += 32, p += 4) {
        s0 = _mm256_add_epi64(s0, _mm256_load_si256(p));
        s1 = _mm256_add_epi64(s1, _mm256_load_si256(p + 1));
        s2 = _mm256_add_epi64(s2, _mm256_load_si256(p + 2));
        s3 = _mm256_add_epi64(s3, _mm256_load_si256(p + 3));
    }
    uint64_t o[4];
    _mm256_storeu_si256((__m256i *)(void *)o, _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)));
    return o[0] + o[1] + o[2] + o[3];
}
#endif

static uint64_t read_scalar(const float *a, size_t n) {
    const uint64_t *p = (const uint64_t *)(const void *)a;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 8 <= n; i += 8, p += 4) s0 += p[0], s1 += p[1], s2 += p[2], s3 += p[3];
    return s0 + s1 + s2 + s3;
}

static void bw_task(void *ctx, size_t t, int worker) {
    (void)worker;
    bw_job *j = ctx;
    size_t i0 = t * j->per_task, i1 = i0 + j->per_task < j->n ? i0 + j->per_task : j->n;
    if (j->kind == 0) {
        uint64_t s;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2"))
            s = read_avx2(j->a + i0, i1 - i0);
        else
#endif
            s = read_scalar(j->a + i0, i1 - i0);
        j->sums[t % 256] = (double)s;
    } else if (j->kind == 1) {
        memcpy(j->b + i0, j->a + i0, (i1 - i0) * sizeof(float));
    } else {
        for (size_t i = i0; i < i1; i++) j->a[i] = j->b[i] + 3.0f * j->c[i];
    }
}

/* Best of 5 passes, GB/s (1e9 bytes). */
static double bandwidth(splash_pool *pool, int kind, float *a, float *b, float *c, size_t n) {
    bw_job j = {a, b, c, n, 1 << 22, kind, {0}};
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

/* splitmix64 from a state of its own (one per chunk of a tensor, so chunks
 * are generated in parallel and the file does not depend on the threads). */
static uint64_t mix_next(uint64_t *st) {
    uint64_t z = (*st += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Dimensions of a random checkpoint. */
typedef struct shape {
    int H, L, V, I;          /* hidden, layers, vocab, dense FFN */
    int heads, kvh, hd;      /* gated attention */
    int hk, hv, dk, dv;      /* GDN */
    int experts, topk, moe_I, shared_I; /* MoE (experts 0: dense) */
    /* the synthetic package's DFlash (v1) draft: layers, taps, heads, kv heads, FFN width (head_dim 128, hidden H) */
    int d_layers, d_taps, d_heads, d_kvh, d_I;
} shape;

/* The 27B and 35B-A3B (docs/cuda.md "Shapes", shared/spec/models.md); NULL for another name. */
static int named_shape(const char *name, shape *s) {
    if (!strcmp(name, "27b")) {
        *s = (shape){.H = 5120, .L = 64, .V = 248320, .I = 17408, .heads = 24, .kvh = 4, .hd = 256,
                     .hk = 16, .hv = 48, .dk = 128, .dv = 128,
                     .d_layers = 5, .d_taps = 5, .d_heads = 32, .d_kvh = 8, .d_I = 17408};
        return 1;
    }
    if (!strcmp(name, "35b-a3b")) {
        *s = (shape){.H = 2048, .L = 40, .V = 248320, .I = 0, .heads = 16, .kvh = 2, .hd = 256,
                     .hk = 16, .hv = 32, .dk = 128, .dv = 128, .experts = 256, .topk = 8, .moe_I = 512, .shared_I = 512,
                     .d_layers = 6, .d_taps = 8, .d_heads = 16, .d_kvh = 4, .d_I = 6144};
        return 1;
    }
    return 0;
}

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

/* The values of a checkpoint: chunks of GEN_CHUNK values of every tensor,
 * each from its own generator, written at its offset (pwrite). */
#define GEN_CHUNK ((size_t)1 << 22)
typedef struct gen_chunk {
    int tensor;
    size_t first, n;  /* values [first, first + n) of the tensor */
    uint64_t offset;  /* bytes into the file */
} gen_chunk;
typedef struct gen_job {
    const rt *t;
    const gen_chunk *chunks;
    int fd, failed;
} gen_job;

static void gen_task(void *ctx, size_t k, int worker) {
    (void)worker;
    gen_job *j = ctx;
    const gen_chunk *c = &j->chunks[k];
    const rt *t = &j->t[c->tensor];
    uint16_t *buf = malloc(c->n * sizeof *buf);
    if (!buf) {
        j->failed = 1;
        return;
    }
    uint64_t st = 0x243F6A8885A308D3ull ^ ((uint64_t)c->tensor << 40) ^ (uint64_t)(c->first / GEN_CHUNK);
    float sd = t->kind == 0 ? 1.0f / sqrtf((float)t->shape[t->ndim - 1]) : 0.1f;
    if (strstr(t->name, "embed_tokens")) sd = 1.0f;
    for (size_t e = 0; e < c->n; e += 2) {
        uint64_t z = mix_next(&st);
        for (size_t h = 0; h < 2 && e + h < c->n; h++) {
            double u = (double)(uint32_t)(z >> (32 * h)) * 0x1p-32; /* [0, 1) */
            float v;
            switch (t->kind) {
            case 2: v = logf(0.05f + 0.95f * (float)u); break;          /* A_log */
            case 3: v = 0.5f * 1.7320508f * (float)(2 * u - 1); break;  /* dt_bias, conv: sd 0.5 */
            case 4: v = 1.0f + 0.1f * 1.7320508f * (float)(2 * u - 1); break; /* gated norm around 1 */
            default: v = sd * 1.7320508f * (float)(2 * u - 1);          /* unit variance times sd */
            }
            buf[e + h] = splash_f32_to_bf16(v);
        }
    }
    const char *p = (const char *)buf;
    size_t left = c->n * sizeof *buf;
    off_t off = (off_t)c->offset;
    while (left) {
        ssize_t w = pwrite(j->fd, p, left, off);
        if (w <= 0) {
            j->failed = 1;
            break;
        }
        p += w, off += w, left -= (size_t)w;
    }
    free(buf);
}

static int make_checkpoint(const char *dir, const shape *sh) {
    const int H = sh->H, L = sh->L, V = sh->V, I = sh->I, heads = sh->heads, kvh = sh->kvh, hd = sh->hd;
    const int hk = sh->hk, hv = sh->hv, dk = sh->dk, dv = sh->dv, E = sh->experts;
    int conv = 2 * hk * dk + hv * dv;
    rt *t = calloc((size_t)L * (24 + 3 * (size_t)E) + 8, sizeof *t);
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
        if (E) {
            A("mlp.gate.weight", 0, 2, E, H, 0);
            for (int e = 0; e < E; e++) {
                char ex[64];
                snprintf(ex, sizeof ex, "mlp.experts.%d.gate_proj.weight", e);
                A(ex, 0, 2, sh->moe_I, H, 0);
                snprintf(ex, sizeof ex, "mlp.experts.%d.up_proj.weight", e);
                A(ex, 0, 2, sh->moe_I, H, 0);
                snprintf(ex, sizeof ex, "mlp.experts.%d.down_proj.weight", e);
                A(ex, 0, 2, H, sh->moe_I, 0);
            }
            A("mlp.shared_expert.gate_proj.weight", 0, 2, sh->shared_I, H, 0);
            A("mlp.shared_expert.up_proj.weight", 0, 2, sh->shared_I, H, 0);
            A("mlp.shared_expert.down_proj.weight", 0, 2, H, sh->shared_I, 0);
            A("mlp.shared_expert_gate.weight", 0, 2, 1, H, 0);
        } else {
            A("mlp.gate_proj.weight", 0, 2, I, H, 0);
            A("mlp.up_proj.weight", 0, 2, I, H, 0);
            A("mlp.down_proj.weight", 0, 2, H, I, 0);
        }
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
    uint64_t data0 = 8 + hl; /* the values start after the length and the header */
    size_t n_chunks = 0;
    for (int i = 0; i < n; i++) {
        size_t cnt = 1;
        for (int d = 0; d < t[i].ndim; d++) cnt *= (size_t)t[i].shape[d];
        n_chunks += (cnt + GEN_CHUNK - 1) / GEN_CHUNK;
    }
    gen_chunk *chunks = calloc(n_chunks ? n_chunks : 1, sizeof *chunks);
    size_t k = 0;
    uint64_t at = data0;
    for (int i = 0; i < n; i++) {
        size_t cnt = 1;
        for (int d = 0; d < t[i].ndim; d++) cnt *= (size_t)t[i].shape[d];
        for (size_t first = 0; first < cnt; first += GEN_CHUNK) {
            size_t m = cnt - first < GEN_CHUNK ? cnt - first : GEN_CHUNK;
            chunks[k++] = (gen_chunk){i, first, m, at};
            at += 2 * m;
        }
    }
    if (fflush(f)) {
        perror(path);
        return 1;
    }
    gen_job gj = {t, chunks, fileno(f), 0};
    splash_pool *pool = splash_pool_create(0);
    splash_pool_run(pool, n_chunks, gen_task, &gj);
    splash_pool_destroy(pool);
    free(chunks);
    if (gj.failed || fclose(f)) {
        fprintf(stderr, "%s: writing the values failed\n", path);
        return 1;
    }
    free(path);
    strbuf cfg;
    sb_init(&cfg);
    if (E)
        sb_printf(&cfg,
                  "{\"architectures\": [\"Qwen3_5MoeForCausalLM\"], \"model_type\": \"qwen3_5_moe_text\",\n"
                  " \"num_experts\": %d, \"num_experts_per_tok\": %d, \"moe_intermediate_size\": %d,\n"
                  " \"shared_expert_intermediate_size\": %d, \"hidden_size\": %d,\n",
                  E, sh->topk, sh->moe_I, sh->shared_I, H);
    else
        sb_printf(&cfg, "{\"architectures\": [\"Qwen3_5ForCausalLM\"], \"model_type\": \"qwen3_5_text\", \"hidden_size\": %d,\n",
                  H);
    sb_printf(&cfg,
              " \"intermediate_size\": %d, \"num_hidden_layers\": %d, \"vocab_size\": %d, \"num_attention_heads\": %d,\n"
              " \"num_key_value_heads\": %d, \"head_dim\": %d, \"hidden_act\": \"silu\", \"max_position_embeddings\": 262144,\n"
              " \"rms_norm_eps\": 1e-06, \"tie_word_embeddings\": false, \"attention_bias\": false,\n"
              " \"linear_conv_kernel_dim\": 4, \"linear_num_key_heads\": %d, \"linear_num_value_heads\": %d,\n"
              " \"linear_key_head_dim\": %d, \"linear_value_head_dim\": %d, \"partial_rotary_factor\": 0.25,\n"
              " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000.0, \"partial_rotary_factor\": 0.25},\n"
              " \"layer_types\": [%s], \"dtype\": \"bfloat16\"}\n",
              I, L, V, heads, kvh, hd, hk, hv, dk, dv, types.data);
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

/* ---- a synthetic package: the shape's exact tensors over one shared blob ----------
 * For timing at full depth without weights: every tensor of the package is
 * listed at offset 0 of one file (blob.bin, as large as the largest tensor),
 * so a 64-layer 27B costs one ~0.7 GB file and no quantising.  Every 2-byte
 * aligned pair of the blob is a bf16 (and every 4-byte word an f32) between
 * 2^-7 and 2^-5 (high byte 0x3C, low byte random), so scales, biases, norms
 * and gates are small positive numbers and half the q4 codes random: the
 * kernels read the bytes of the real model; the outputs mean nothing. */
typedef struct synth {
    strbuf t;       /* the manifest's tensor entries */
    size_t biggest; /* bytes of the largest tensor */
    int n;
} synth;

static void synth_add(synth *y, const char *name, splash_dtype dt, int ndim, int64_t d0, int64_t d1, int64_t d2) {
    const int64_t shape[3] = {d0, d1, d2};
    size_t bytes = splash_tensor_bytes(dt, ndim, shape);
    if (bytes > y->biggest) y->biggest = bytes;
    sb_printf(&y->t, "%s\n  {\"name\": \"%s\", \"file\": \"blob.bin\", \"offset\": 0, \"dtype\": \"%s\", \"shape\": [", y->n++ ? "," : "",
              name, splash_dtype_name(dt));
    for (int d = 0; d < ndim; d++) sb_printf(&y->t, "%s%lld", d ? ", " : "", (long long)shape[d]);
    sb_printf(&y->t, "], \"bytes\": %zu}", bytes);
}

static int make_synthetic(const char *dir, const shape *sh) {
    const int H = sh->H, L = sh->L, hd = sh->hd, E = sh->experts;
    const int64_t conv = 2 * (int64_t)sh->hk * sh->dk + (int64_t)sh->hv * sh->dv, vdim = (int64_t)sh->hv * sh->dv;
    synth y = {{0}, 0, 0};
    sb_init(&y.t);
    strbuf types;
    sb_init(&types);
    char nm[128];
    synth_add(&y, "embed", SPLASH_Q4, 2, sh->V, H, 0);
    synth_add(&y, "lm_head", SPLASH_Q4, 2, sh->V, H, 0);
    synth_add(&y, "final_norm", SPLASH_F32, 1, H, 0, 0);
    for (int i = 0; i < L; i++) {
        const int attn = (i + 1) % 4 == 0; /* the 3:1 pattern */
        sb_printf(&types, "%s\"%s\"", i ? ", " : "", attn ? "full_attention" : "linear_attention");
#define T(suffix, dt, nd, a, b, c) (snprintf(nm, sizeof nm, "layers.%d.%s", i, suffix), synth_add(&y, nm, dt, nd, a, b, c))
        T("input_norm", SPLASH_F32, 1, H, 0, 0);
        T("post_norm", SPLASH_F32, 1, H, 0, 0);
        if (attn) {
            T("attn.q_proj", SPLASH_Q4, 2, 2 * (int64_t)sh->heads * hd, H, 0);
            T("attn.k_proj", SPLASH_Q4, 2, (int64_t)sh->kvh * hd, H, 0);
            T("attn.v_proj", SPLASH_Q4, 2, (int64_t)sh->kvh * hd, H, 0);
            T("attn.o_proj", SPLASH_Q4, 2, H, (int64_t)sh->heads * hd, 0);
            T("attn.q_norm", SPLASH_F32, 1, hd, 0, 0);
            T("attn.k_norm", SPLASH_F32, 1, hd, 0, 0);
        } else {
            T("gdn.in_proj_qkv", SPLASH_Q4, 2, conv, H, 0);
            T("gdn.in_proj_z", SPLASH_Q4, 2, vdim, H, 0);
            T("gdn.in_proj_b", SPLASH_Q4, 2, sh->hv, H, 0);
            T("gdn.in_proj_a", SPLASH_Q4, 2, sh->hv, H, 0);
            T("gdn.out_proj", SPLASH_Q4, 2, H, vdim, 0);
            T("gdn.conv", SPLASH_F32, 2, conv, 4, 0);
            T("gdn.A_log", SPLASH_F32, 1, sh->hv, 0, 0);
            T("gdn.dt_bias", SPLASH_F32, 1, sh->hv, 0, 0);
            T("gdn.norm", SPLASH_F32, 1, sh->dv, 0, 0);
        }
        if (E) {
            T("moe.router", SPLASH_BF16, 2, E, H, 0);
            T("moe.experts_gate", SPLASH_Q4, 3, E, sh->moe_I, H);
            T("moe.experts_up", SPLASH_Q4, 3, E, sh->moe_I, H);
            T("moe.experts_down", SPLASH_Q4, 3, E, H, sh->moe_I);
            T("moe.shared_gate", SPLASH_Q4, 2, sh->shared_I, H, 0);
            T("moe.shared_up", SPLASH_Q4, 2, sh->shared_I, H, 0);
            T("moe.shared_down", SPLASH_Q4, 2, H, sh->shared_I, 0);
            T("moe.shared_expert_gate", SPLASH_BF16, 2, 1, H, 0);
        } else {
            T("ffn.gate", SPLASH_Q4, 2, sh->I, H, 0);
            T("ffn.up", SPLASH_Q4, 2, sh->I, H, 0);
            T("ffn.down", SPLASH_Q4, 2, H, sh->I, 0);
        }
#undef T
    }
    /* the draft: DFlash v1 of the published drafts' depth and taps (its heads and FFN width
     * assumed: Qwen3-style, head_dim 128), every layer full attention over a 2,048-position
     * window as served, taps spread over the target's layers from 1 */
    const int DL = sh->d_layers, dq = sh->d_heads * 128, dkv = sh->d_kvh * 128;
    strbuf draft;
    sb_init(&draft);
    if (DL > 0) {
        synth_add(&y, "draft.fc", SPLASH_Q4, 2, H, (int64_t)sh->d_taps * H, 0);
        synth_add(&y, "draft.hidden_norm", SPLASH_F32, 1, H, 0, 0);
        synth_add(&y, "draft.norm", SPLASH_F32, 1, H, 0, 0);
        for (int l = 0; l < DL; l++) {
#define T(suffix, dt, nd, a, b) (snprintf(nm, sizeof nm, "draft.layers.%d.%s", l, suffix), synth_add(&y, nm, dt, nd, a, b, 0))
            T("input_norm", SPLASH_F32, 1, H, 0);
            T("post_norm", SPLASH_F32, 1, H, 0);
            T("attn.q_norm", SPLASH_F32, 1, 128, 0);
            T("attn.k_norm", SPLASH_F32, 1, 128, 0);
            T("attn.q_proj", SPLASH_Q4, 2, dq, H);
            T("attn.k_proj", SPLASH_Q4, 2, dkv, H);
            T("attn.v_proj", SPLASH_Q4, 2, dkv, H);
            T("attn.o_proj", SPLASH_Q4, 2, H, dq);
            T("ffn.gate", SPLASH_Q4, 2, sh->d_I, H);
            T("ffn.up", SPLASH_Q4, 2, sh->d_I, H);
            T("ffn.down", SPLASH_Q4, 2, H, sh->d_I);
#undef T
        }
        sb_printf(&draft, " \"draft\": {\"architecture\": \"dflash\", \"block_size\": 16, \"mask_token_id\": %d, "
                          "\"hidden\": %d, \"layers\": %d, \"heads\": %d, \"kv_heads\": %d, \"head_dim\": 128, "
                          "\"intermediate\": %d, \"rms_eps\": 1e-06, \"rope_theta\": 10000000.0, \"sliding_window\": 0,\n"
                          "  \"target_layer_ids\": [",
                  sh->V - 2, H, DL, sh->d_heads, sh->d_kvh, sh->d_I);
        for (int i = 0; i < sh->d_taps; i++) { /* 1 .. L - 1, evenly (0 for a one-layer target) */
            const int tap = L < 2 ? 0 : 1 + (sh->d_taps > 1 ? i * (L - 2) / (sh->d_taps - 1) : 0);
            sb_printf(&draft, "%s%d", i ? ", " : "", tap);
        }
        sb_printf(&draft, "], \"layer_types\": [");
        for (int l = 0; l < DL; l++) sb_printf(&draft, "%s\"full_attention\"", l ? ", " : "");
        sb_printf(&draft, "], \"causal\": [");
        for (int l = 0; l < DL; l++) sb_printf(&draft, "%sfalse", l ? ", " : "");
        sb_printf(&draft, "]},\n");
    }
    const size_t blob = (y.biggest + SPLASH_SECTION_ALIGN - 1) / SPLASH_SECTION_ALIGN * SPLASH_SECTION_ALIGN;
    splash_error err = {0};
    int rc = splash_mkdirs(dir, &err);
    char *path = splash_path_join(dir, "blob.bin");
    FILE *f = rc ? NULL : fopen(path, "wb");
    uint8_t *buf = malloc(1 << 20);
    uint64_t st = 0x9E3779B97F4A7C15ull;
    for (size_t done = 0; f && buf && done < blob; done += 1 << 20) {
        for (size_t k = 0; k < (1 << 20); k += 8) {
            uint64_t z = mix_next(&st);
            for (int b = 0; b < 8; b += 2) buf[k + b] = (uint8_t)(z >> (8 * b)), buf[k + b + 1] = 0x3C;
        }
        if (fwrite(buf, 1, blob - done < (1 << 20) ? blob - done : (1 << 20), f) == 0) break;
    }
    free(buf);
    if (!f || fclose(f)) {
        fprintf(stderr, "%s: %s\n", path, rc ? err.msg : "cannot be written");
        free(path);
        sb_free(&y.t);
        sb_free(&types);
        sb_free(&draft);
        return 1;
    }
    free(path);
    strbuf m;
    sb_init(&m);
    sb_printf(&m, "{\"format\": \"%s\", \"version\": %d, \"architecture\": \"%s\",\n \"model\": {\"hidden\": %d, \"layers\": %d, "
                  "\"vocab\": %d, \"rms_eps\": 1e-06, \"max_positions\": 262144, \"tie_embeddings\": false,\n  \"layer_types\": [%s],\n"
                  "  \"attention\": {\"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"rotary_dim\": %d, \"rope_theta\": 10000000.0},\n"
                  "  \"gdn\": {\"key_heads\": %d, \"value_heads\": %d, \"key_dim\": %d, \"value_dim\": %d, \"conv_kernel\": 4},\n",
              SPLASH_PACKAGE_FORMAT, SPLASH_PACKAGE_VERSION, E ? "qwen3_5_moe" : "qwen3_5", H, L, sh->V, types.data,
              sh->heads, sh->kvh, hd, hd / 4, sh->hk, sh->hv, sh->dk, sh->dv);
    if (E)
        sb_printf(&m, "  \"moe\": {\"experts\": %d, \"top_k\": %d, \"expert_intermediate\": %d, \"shared_intermediate\": %d}},\n",
                  E, sh->topk, sh->moe_I, sh->shared_I);
    else
        sb_printf(&m, "  \"ffn\": {\"intermediate\": %d}},\n", sh->I);
    if (draft.data) sb_printf(&m, "%s", draft.data);
    sb_printf(&m, " \"synthetic\": \"every tensor reads the start of blob.bin (splash bench --make-synthetic)\",\n"
                  " \"files\": [{\"path\": \"blob.bin\", \"size\": %zu, \"sha256\": \"%064d\"}],\n \"tensors\": [%s]}\n",
              blob, 0, y.t.data);
    path = splash_path_join(dir, "manifest.json");
    rc = splash_write_file(path, m.data, m.len, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    free(path);
    sb_free(&m);
    sb_free(&y.t);
    sb_free(&types);
    sb_free(&draft);
    return rc ? 1 : 0;
}

/* ---- model timing -------------------------------------------------------------- */

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)ru.ru_stime.tv_usec;
}

/* Weight bytes one decoded token reads: every tensor once, except the
 * embedding (one row) and, for MoE, the experts (top_k of E). */
static double weight_bytes_per_token(const splash_package *pkg) {
    const json_value *moe = json_get(json_get(splash_package_manifest(pkg), "model"), "moe");
    double frac = moe ? json_get_num(moe, "top_k", 1) / json_get_num(moe, "experts", 1) : 1.0;
    double total = 0;
    for (size_t i = 0; i < splash_package_tensor_count(pkg); i++) {
        const splash_tensor *t = splash_package_tensor_at(pkg, i);
        if (!strncmp(t->name, "mtp.", 4) || !strncmp(t->name, "draft.", 6)) continue; /* not the target's */
        if (!strcmp(t->name, "embed"))
            total += (double)t->bytes / (double)t->shape[0];
        else if (strstr(t->name, ".moe.experts_"))
            total += (double)t->bytes * frac;
        else
            total += (double)t->bytes;
    }
    return total;
}


typedef struct bench_result {
    double prefill_tps, prefill_cpu;   /* tokens/s (median over the runs); CPU seconds per token */
    double prefill_first_tps;          /* the first run's tokens/s (first launches, library loads) */
    stat3 step;                        /* decode step seconds */
    double step_cpu;                   /* CPU seconds per decode step */
    stat3 verify8, verify16;           /* seconds per VERIFY block + its commit */
    stat3 verify4x8;                   /* four lanes of 8 rows in one forward + their commits */
    double weight_bytes, state_bytes, kv_bytes; /* read per decoded token (state: read + written) */
    double rss_mb;
    float *logits;                     /* [decode][vocab] of the decode steps */
    int vocab;
} bench_result;

/* n rows of one lane at pos; each row asks for `flag` (LOGITS, or TOP: the
 * argmax, what a greedy cycle reads, b->top_k = 1). */
static int forward(splash_model *m, splash_batch *b, splash_lane *lane, splash_row *rows, int pos, int n, int mode,
                   int vocab, uint32_t flag) {
    splash_error err = {0};
    for (int r = 0; r < n; r++) {
        int p = pos + r;
        rows[r] = (splash_row){(int32_t)(((int64_t)p * 7919) % vocab), {p, p, p}, flag, NULL};
    }
    lane->n_past = pos;
    lane->n_rows = n;
    lane->mode = mode;
    b->n_rows = n;
    if (splash_model_forward(m, b, &err)) {
        fprintf(stderr, "forward: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* One load of the model with activation path `act` (fp32, int8, int16). */
static int bench_model(const char *dir, const char *device, int threads, int prompt, int prefill_reps,
                       int prefill_chunk, int decode, int vreps, const char *act, int decode_prefill, int kv_format,
                       bench_result *res) {
    splash_error err = {0};
    memset(res, 0, sizeof *res);
    splash_package *pkg;
    if (splash_package_open(dir, &pkg, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    enum { LANES = 4 }; /* the multi-lane verify: LANES lanes of 8 rows */
    /* rows a prefill forward takes: the whole prompt, or --prefill-chunk's (as serve feeds a long
     * prompt: the engine's prefill chunk), which the model's scratch is then sized for */
    const int chunk = prefill_chunk > 0 && prefill_chunk < prompt ? prefill_chunk : prompt;
    int max_rows = chunk > 8 * LANES ? chunk : 8 * LANES;
    splash_model_options o = {.device = device, .threads = threads, .max_rows = max_rows, .max_lanes = LANES,
                              .kv_format = kv_format, .cpu_activations = (splash_cpu_act)splash_cpu_act_parse(act)};
    splash_model *m;
    if (splash_model_load(pkg, &o, &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const splash_model_needs *nd = splash_model_get_needs(m);
    int T = prompt + decode + 16, n_pages = (T + nd->page_tokens - 1) / nd->page_tokens;
    void *kv = splash_model_alloc_memory(m, nd->page_bytes * (size_t)n_pages * LANES + 1);
    void *st = splash_model_alloc_memory(m, nd->state_bytes * LANES + 1);
    int32_t *pages = malloc(sizeof(int32_t) * (size_t)n_pages * LANES); /* lane i: pages [i n_pages, (i + 1) n_pages) */
    for (int i = 0; i < n_pages * LANES; i++) pages[i] = i;
    if (!kv || !st || splash_model_attach_memory(m, kv, n_pages * LANES, st, LANES, &err)) {
        fprintf(stderr, "attach: %s\n", err.msg);
        return 1;
    }
    /* what a model can use beyond its needs, all it wants (serve grants what its memory plan
     * leaves past the KV pages: memory_plan.h, spare) */
    size_t spare = 0;
    if (splash_model_use_spare(m, SIZE_MAX, &spare, &err)) {
        fprintf(stderr, "spare: %s\n", err.msg);
        return 1;
    }
    if (spare) fprintf(stderr, "spare memory taken by the model: %.1f MB of %.1f MB wanted\n", spare / 1e6,
                       nd->spare_bytes / 1e6);
    for (int i = 0; i < LANES; i++) splash_model_reset_slot(m, i);
    const int gpu = device && !strcmp(device, "cuda");
    int32_t top_id[8 * LANES];
    float top_val[8 * LANES];
    int V = nd->vocab;
    splash_row *rows = calloc((size_t)max_rows, sizeof *rows);
    float *logits = malloc(sizeof(float) * (size_t)V * (size_t)max_rows);
    res->logits = malloc(sizeof(float) * (size_t)V * (size_t)(decode > 0 ? decode : 1));
    res->vocab = V;
    splash_lane lane = {0, 0, 0, chunk, pages, n_pages, SPLASH_LANE_PREFILL};
    splash_batch b = {.n_lanes = 1, .n_rows = chunk, .lanes = &lane, .rows = rows, .logits = logits,
                      .top_k = 1, .top_ids = top_id, .top_logits = top_val};
    /* prefill (only the last row's logits are needed, as a server would), prefill_reps
     * times from an empty slot: the first run pays first launches and library loads, and
     * one short run alone is noisy (a 1K prompt's 0.16 s: 5.7-6.6K tokens/s, session 32);
     * in forwards of `chunk` rows, each after the last (n_past) */
    double t0, c0 = cpu_seconds();
    double *pt = calloc((size_t)prefill_reps, sizeof *pt);
    for (int k = 0; k < prefill_reps; k++) {
        splash_model_reset_slot(m, 0);
        t0 = now();
        for (int p0 = 0; p0 < prompt; p0 += chunk) {
            const int n = prompt - p0 < chunk ? prompt - p0 : chunk;
            for (int r = 0; r < n; r++) {
                const int p = p0 + r;
                rows[r] = (splash_row){(int32_t)(((int64_t)p * 7919) % V), {p, p, p},
                                       p == prompt - 1 ? SPLASH_ROW_LOGITS : 0, NULL};
            }
            lane.n_past = p0, lane.n_rows = n, b.n_rows = n;
            if (splash_model_forward(m, &b, &err)) {
                fprintf(stderr, "prefill: %s\n", err.msg);
                return 1;
            }
        }
        pt[k] = now() - t0;
    }
    res->prefill_tps = prompt / splash_bench_stats(pt, prefill_reps).med;
    res->prefill_first_tps = prompt / pt[0];
    res->prefill_cpu = (cpu_seconds() - c0) / ((double)prompt * prefill_reps);
    free(pt);
    /* decode: VERIFY 1 + commit 1 per token (the engine's cycle), or PREFILL 1 */
    double *steps = calloc((size_t)decode + 1, sizeof *steps);
    c0 = cpu_seconds();
    for (int i = 0; i < decode; i++) {
        t0 = now();
        int mode = decode_prefill ? SPLASH_LANE_PREFILL : SPLASH_LANE_VERIFY;
        /* the GPU returns the argmax as the engine's greedy cycle reads it; the CPU its
         * logits, which main compares between activation paths */
        uint32_t flag = gpu ? SPLASH_ROW_TOP : SPLASH_ROW_LOGITS;
        if (forward(m, &b, &lane, rows, prompt + i, 1, mode, V, flag) ||
            (!decode_prefill && (splash_model_commit(m, 0, 1, &err) || splash_model_finish(m)))) {
            fprintf(stderr, "decode: %s\n", err.msg);
            return 1;
        }
        steps[i] = now() - t0;
        if (!gpu) memcpy(res->logits + (size_t)i * V, logits, sizeof(float) * (size_t)V);
    }
    res->step_cpu = decode ? (cpu_seconds() - c0) / decode : 0;
    /* the first step warms caches */
    res->step = splash_bench_stats(steps + (decode > 1), decode - (decode > 1));
    /* verify cycles: a block of 8 or 16 rows, each row's argmax read (TOP), and the
     * commit of every row (the state advances; the next block's rows overwrite
     * the same KV positions) */
    double *vt = calloc((size_t)vreps + 1, sizeof *vt);
    for (int which = 0; which < 2; which++) {
        int n = which ? 16 : 8;
        for (int k = 0; k < vreps; k++) {
            t0 = now();
            if (forward(m, &b, &lane, rows, prompt + decode, n, SPLASH_LANE_VERIFY, V, SPLASH_ROW_TOP) ||
                splash_model_commit(m, 0, n, &err) || splash_model_finish(m))
                return 1;
            vt[k] = now() - t0;
        }
        if (which)
            res->verify16 = splash_bench_stats(vt, vreps);
        else
            res->verify8 = splash_bench_stats(vt, vreps);
    }
    /* LANES lanes of 8 rows in one forward (lane 0 at the prompt's end, the others at
     * the same positions over their own pages and states), then the lanes' commit (one call) */
    splash_lane ml[LANES];
    for (int i = 0; i < LANES; i++) {
        ml[i] = (splash_lane){i, prompt + decode, 8 * i, 8, pages + (size_t)i * n_pages, n_pages, SPLASH_LANE_VERIFY};
        for (int r = 0; r < 8; r++) {
            int p = prompt + decode + r;
            rows[8 * i + r] = (splash_row){(int32_t)(((int64_t)(p + 101 * i) * 7919) % V), {p, p, p}, SPLASH_ROW_TOP, NULL};
        }
    }
    splash_batch mb = {.n_lanes = LANES, .n_rows = 8 * LANES, .lanes = ml, .rows = rows, .top_k = 1, .top_ids = top_id,
                       .top_logits = top_val};
    int slots[LANES], counts[LANES]; /* every lane commits its 8 rows */
    for (int i = 0; i < LANES; i++) slots[i] = i, counts[i] = 8;
    for (int k = 0; k < vreps; k++) {
        t0 = now();
        if (splash_model_forward(m, &mb, &err)) {
            fprintf(stderr, "verify %d lanes: %s\n", LANES, err.msg);
            return 1;
        }
        if (splash_model_commit_lanes(m, slots, counts, LANES, &err)) { /* as the engine commits a step's lanes */
            fprintf(stderr, "commit of %d lanes: %s\n", LANES, err.msg);
            return 1;
        }
        if (splash_model_finish(m)) return 1; /* the commits timed too, not left to the next forward */
        vt[k] = now() - t0;
    }
    res->verify4x8 = splash_bench_stats(vt, vreps);
    free(vt);
    free(steps);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    res->weight_bytes = weight_bytes_per_token(pkg);
    res->state_bytes = 2.0 * (double)nd->state_bytes;
    /* KV read at the mean context of the decode steps: every attention layer's K and V
     * up to the position (page_bytes covers page_tokens positions of all layers) */
    res->kv_bytes = (double)nd->page_bytes / nd->page_tokens * (prompt + 0.5 * decode);
    res->rss_mb = (double)ru.ru_maxrss / 1024.0;
    if (device && !strcmp(device, "cuda")) act = "cuda"; /* the label: the GPU has one path */
    printf("%-5s prefill %d tokens: %.1f tokens/s (%.1f ms CPU per token; median of %d runs, the first %.1f)\n", act,
           prompt, res->prefill_tps, 1e3 * res->prefill_cpu, prefill_reps, res->prefill_first_tps);
    if (chunk < prompt) printf("%-5s (the prompt in forwards of %d rows, as --prefill-chunk)\n", act, chunk);
    /* ms to 1 us: tools/gpu_synthetic_bench.sh fits full depth from these (x16 for the 27B) */
    printf("%-5s decode: median %.3f ms/token [p10 %.3f, p90 %.3f] = %.2f tokens/s; %.2f ms CPU per token\n", act,
           1e3 * res->step.med, 1e3 * res->step.p10, 1e3 * res->step.p90, 1.0 / res->step.med, 1e3 * res->step_cpu);
    printf("%-5s verify 8 rows: %.3f ms [%.3f, %.3f] = %.2fx one row; 16 rows: %.3f ms [%.3f, %.3f] = %.2fx\n", act,
           1e3 * res->verify8.med, 1e3 * res->verify8.p10, 1e3 * res->verify8.p90, res->verify8.med / res->step.med,
           1e3 * res->verify16.med, 1e3 * res->verify16.p10, 1e3 * res->verify16.p90, res->verify16.med / res->step.med);
    printf("%-5s verify 4 lanes x 8 rows: %.3f ms [%.3f, %.3f] = %.2fx one row (each verify with its commit; rows read as argmax)\n",
           act, 1e3 * res->verify4x8.med, 1e3 * res->verify4x8.p10, 1e3 * res->verify4x8.p90,
           res->verify4x8.med / res->step.med);
    splash_model_free_memory(m, kv);
    splash_model_free_memory(m, st);
    splash_model_free(m);
    splash_package_close(pkg);
    free(pages), free(rows), free(logits);
    return 0;
}

/* relative L2 distance and top-1 agreement of b's decode logits to a's */
static void compare_logits(const bench_result *a, const bench_result *b, int n, double *rel, double *top1) {
    double num = 0, den = 0;
    int agree = 0;
    for (int t = 0; t < n; t++) {
        const float *x = a->logits + (size_t)t * a->vocab, *y = b->logits + (size_t)t * a->vocab;
        int ia = 0, ib = 0;
        for (int v = 0; v < a->vocab; v++) {
            num += ((double)y[v] - x[v]) * ((double)y[v] - x[v]);
            den += (double)x[v] * x[v];
            if (x[v] > x[ia]) ia = v;
            if (y[v] > y[ib]) ib = v;
        }
        agree += ia == ib;
    }
    *rel = den > 0 ? sqrt(num / den) : 0;
    *top1 = n ? (double)agree / n : 0;
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

static double load_average(void) {
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1) l = -1;
        fclose(f);
    }
    return l;
}

/* A dense model of hidden H and FFN I with the proportions of --make-random's. */
static shape generic_shape(int H, int I) {
    shape sh = {.H = H, .L = 24, .V = 32000, .I = I, .heads = H / 128, .hd = 128, .dk = 128, .dv = 128};
    if (!sh.heads) sh.heads = 1;
    sh.kvh = sh.heads / 4 ? sh.heads / 4 : 1;
    sh.d_layers = 2, sh.d_taps = 3, sh.d_heads = sh.heads, sh.d_kvh = sh.kvh, sh.d_I = I;
    sh.hk = H / 256 ? H / 256 : 1;
    sh.hv = 2 * sh.hk;
    return sh;
}

int splash_cmd_bench(int argc, char **argv) {
    const int as_splash = !strcmp(argv[0], "bench"); /* `splash bench`, else bench/bench_cpu */
    const char *prog = as_splash ? "splash bench" : "bench_cpu";
    const char *model = NULL, *make = NULL, *synth_dir = NULL, *weights = "q4", *act_list = NULL;
    const char *device = as_splash ? "auto" : "cpu", *shape_name = NULL, *synthetic = NULL, *dir = NULL;
    int threads = 0, prompt = 256, decode = 64, vreps = 5, H = 1024, L = 0, V = 0, I = 3584, bw = 1, dprefill = 0;
    int kv_format = -1, random_route = 0, draft = 0, prefill_reps = 0, prefill_chunk = 0;
    double gpu_gbs = 4300;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--model")) model = v, i++;
        else if (!strcmp(a, "--make-random")) make = v, i++;
        else if (!strcmp(a, "--make-synthetic")) synth_dir = v, i++;
        else if (!strcmp(a, "--synthetic")) synthetic = v, i++;
        else if (!strcmp(a, "--dir")) dir = v, i++;
        else if (!strcmp(a, "--weights")) weights = v, i++;
        else if (!strcmp(a, "--threads")) threads = atoi(v), i++;
        else if (!strcmp(a, "--prompt")) prompt = atoi(v), i++;
        else if (!strcmp(a, "--decode")) decode = atoi(v), i++;
        else if (!strcmp(a, "--verify-reps")) vreps = atoi(v), i++;
        else if (!strcmp(a, "--prefill-reps") && atoi(v) > 0) prefill_reps = atoi(v), i++;
        else if (!strcmp(a, "--prefill-chunk") && atoi(v) > 0) prefill_chunk = atoi(v), i++;
        else if (!strcmp(a, "--act")) act_list = v, i++;
        else if (!strcmp(a, "--hidden")) H = atoi(v), i++;
        else if (!strcmp(a, "--layers")) L = atoi(v), i++;
        else if (!strcmp(a, "--vocab")) V = atoi(v), i++;
        else if (!strcmp(a, "--intermediate")) I = atoi(v), i++;
        else if (!strcmp(a, "--shape")) shape_name = v, i++;
        else if (!strcmp(a, "--device")) device = v, i++;
        else if (!strcmp(a, "--gpu-gbs")) gpu_gbs = atof(v), i++;
        else if (!strcmp(a, "--no-bandwidth")) bw = 0;
        else if (!strcmp(a, "--decode-prefill")) dprefill = 1;
        else if (!strcmp(a, "--random-route")) random_route = 1;
        else if (!strcmp(a, "--draft")) draft = 1;
        else if (!strcmp(a, "--kv-format") && (!strcmp(v, "f32") || !strcmp(v, "bf16") || !strcmp(v, "int8")))
            kv_format = !strcmp(v, "int8") ? SPLASH_KV_INT8 : !strcmp(v, "bf16") ? SPLASH_KV_BF16 : SPLASH_KV_F32, i++;
        else {
            const int help = !strcmp(a, "--help") || !strcmp(a, "-h");
            if (!help) fprintf(stderr, "%s: unknown option or bad value: %s\n", prog, a);
            fprintf(help ? stdout : stderr,
                    "usage: %s --synthetic 27b|35b-a3b [--layers N] [--dir PKG] [--device auto|cuda|cpu] [--prompt N]\n"
                    "                 [--decode N] ...  (the model's speed without its weights: a synthetic package,\n"
                    "                 then --model on it with int8 KV)\n"
                    "       %s --make-synthetic PKG [--shape 27b|35b-a3b] [--layers N] [--hidden N] [--vocab N]\n"
                    "                 [--intermediate N]  (every tensor over one random blob: full depth in seconds)\n"
                    "       %s --make-random PKG [--weights q4|q8|bf16] [--hidden N] [--layers N]\n"
                    "                 [--vocab N] [--intermediate N]\n"
                    "       %s --make-random PKG --shape 27b|35b-a3b [--layers N] [--vocab N]\n"
                    "       %s --model PKG [--device auto|cuda|cpu] [--threads T] [--prompt N] [--decode N]\n"
                    "                 [--verify-reps N] [--prefill-reps N] [--prefill-chunk N] [--act fp32,int8,int16]\n"
                    "                 [--decode-prefill] [--no-bandwidth] [--gpu-gbs 4300] [--kv-format f32|bf16|int8]\n"
                    "                 [--random-route]\n"
                    "       %s --model PKG --draft [--device auto|cuda|cpu] [--prompt N] [--verify-reps N]\n"
                    "                 (the package's draft alone: propose for 1-4 lanes, append)\n",
                    prog, prog, prog, prog, prog, prog);
            return help ? 0 : 2;
        }
    }
    if (synthetic) { /* make the package when it is not there, then measure it as served */
        shape sy;
        if (!named_shape(synthetic, &sy) || L < 0) {
            fprintf(stderr, L < 0 ? "%s: --layers takes a positive count\n" : "%s: --synthetic takes 27b or 35b-a3b (not %s)\n",
                    prog, synthetic);
            return 2;
        }
        if (L > 0) sy.L = L;
        static char path[1024];
        if (!dir) {
            const char *tmp = getenv("TMPDIR");
            snprintf(path, sizeof path, "%s/splash-synthetic-%s-%d", tmp && *tmp ? tmp : "/tmp", synthetic, sy.L);
            dir = path;
        }
        char *manifest = splash_path_join(dir, "manifest.json");
        int have = manifest && splash_is_file(manifest);
        if (have && draft) { /* a package made before synthetic packages had a draft: made again */
            splash_package *p = NULL;
            splash_error e = {0};
            have = !splash_package_open(dir, &p, &e) && json_get(splash_package_manifest(p), "draft");
            splash_package_close(p);
        }
        free(manifest);
        if (!have) {
            double t = now();
            if (make_synthetic(dir, &sy)) return 1;
            printf("synthetic package %s (%s, %d layers) written in %.1f s\n", dir, synthetic, sy.L, now() - t);
        }
        model = dir;
        if (kv_format < 0) kv_format = SPLASH_KV_INT8;
        if (!act_list) act_list = "int8";
    }
    if (kv_format < 0) kv_format = SPLASH_KV_F32;
    if (!act_list) act_list = "fp32,int8";
    if (random_route) { /* the CUDA model reads it when it opens (backend/cuda/moe.h) */
        if (!strcmp(device, "cpu")) {
            fprintf(stderr, "%s: --random-route is a CUDA benchmark option (--device cuda)\n", prog);
            return 2;
        }
        setenv("SPLASH_TEST_RANDOM_ROUTE", "1", 1);
    }
    shape sh; /* of --make-synthetic / --make-random: --shape's, else a dense one of --hidden etc. */
    if (synth_dir || make) {
        sh = generic_shape(H, I);
        if (shape_name && !named_shape(shape_name, &sh)) {
            fprintf(stderr, "%s: --shape %s: expected 27b or 35b-a3b\n", prog, shape_name);
            return 2;
        }
        if (L > 0) sh.L = L;
        if (V > 0) sh.V = V;
        if (!shape_name && (H < 64 || H % 64 || I < 64 || I % 64 || sh.V < 1)) {
            fprintf(stderr, "%s: --hidden and --intermediate: multiples of 64; --vocab >= 1\n", prog);
            return 2;
        }
    }
    if (synth_dir) {
        double t = now();
        if (make_synthetic(synth_dir, &sh)) return 1;
        printf("synthetic package %s (%s, %d layers) written in %.1f s\n", synth_dir, shape_name ? shape_name : "dense",
               sh.L, now() - t);
        return 0;
    }
    if (make) {
        char ckpt[1024];
        snprintf(ckpt, sizeof ckpt, "%s.ckpt", make);
        double t = now();
        if (make_checkpoint(ckpt, &sh)) return 1;
        printf("random checkpoint written to %s in %.1f s\n", ckpt, now() - t);
        splash_pack_options po = {.from = ckpt, .out = make, .weights = (splash_dtype)splash_dtype_parse(weights),
                                  .threads = threads, .force = 1};
        splash_pack_stats ps;
        splash_error err = {0};
        if ((int)po.weights < 0 || splash_pack(&po, &ps, &err)) {
            fprintf(stderr, "pack: %s\n", err.msg);
            return 1;
        }
        splash_remove_tree(ckpt);
        printf("packed %s (%s): %.1f MB in %.1f s\n", make, weights, (double)ps.total_bytes / 1e6, ps.seconds);
        return 0;
    }
    if (!model || prompt < 1 || decode < 2 || vreps < 1) {
        fprintf(stderr, "%s: --model PKG (or --synthetic SHAPE, --make-random PKG); --prompt >= 1, --decode >= 2, "
                        "--verify-reps >= 1\n", prog);
        return 2;
    }
    if (!prefill_reps) prefill_reps = prompt <= 8192 ? 3 : 1;
    if (threads <= 0) {
        splash_pool *p = splash_pool_create(0);
        threads = splash_pool_size(p);
        splash_pool_destroy(p);
    }
    if (strcmp(device, "cpu") && strcmp(device, "cuda") && strcmp(device, "auto")) {
        fprintf(stderr, "%s: --device takes auto, cuda or cpu (not %s)\n", prog, device);
        return 2;
    }
    {
        splash_error err = {0};
        if (splash_device_resolve(device, &device, NULL, 0, NULL, &err)) {
            fprintf(stderr, "%s: %s\n", prog, err.msg);
            return 1;
        }
    }
    if (draft) return splash_bench_draft(model, device, threads, prompt, vreps);
    int cuda = !strcmp(device, "cuda");
    const char *acts[3];
    char actbuf[64];
    snprintf(actbuf, sizeof actbuf, "%s", cuda ? "auto" : act_list); /* the GPU has one path */
    int n_acts = 0;
    for (char *tok = strtok(actbuf, ","); tok && n_acts < 3; tok = strtok(NULL, ",")) {
        if (cuda) {
            acts[n_acts++] = "cuda";
            break;
        }
        if (splash_cpu_act_parse(tok) <= 0) {
            fprintf(stderr, "%s: --act takes fp32, int8, int16 (not %s)\n", prog, tok);
            return 2;
        }
        acts[n_acts++] = tok;
    }
    bench_result r[3];
    printf("model %s, device %s, %d threads, load average %.2f\n", model, device, threads, load_average());
    for (int i = 0; i < n_acts; i++)
        if (bench_model(model, device, threads, prompt, prefill_reps, prefill_chunk, decode, vreps,
                        cuda ? "auto" : acts[i], dprefill, kv_format, &r[i]))
            return 1;
    for (int i = 1; i < n_acts; i++) {
        double rel, top1;
        compare_logits(&r[0], &r[i], decode, &rel, &top1);
        printf("%s vs %s logits over the %d decode steps: rel L2 %.3g, top-1 agreement %.3f\n", acts[i], acts[0], decode,
               rel, top1);
    }
    double per_token = r[0].weight_bytes + r[0].state_bytes + r[0].kv_bytes;
    printf("read per decoded token: %.1f MB weights + %.1f MB GDN state (read + write) + %.1f MB KV = %.1f MB; "
           "peak RSS %.1f MB\n",
           r[0].weight_bytes / 1e6, r[0].state_bytes / 1e6, r[0].kv_bytes / 1e6, per_token / 1e6, r[n_acts - 1].rss_mb);
    if (cuda) {
        double gbs = per_token / r[0].step.med / 1e9;
        printf("decode (cuda): %.2f tokens/s = %.0f%% of the %.0f GB/s roofline (%.1f tokens/s)\n", 1.0 / r[0].step.med,
               100.0 * gbs / gpu_gbs, gpu_gbs, gpu_gbs * 1e9 / per_token);
        free(r[0].logits);
        return 0;
    }
    if (!bw) {
        for (int i = 0; i < n_acts; i++) free(r[i].logits);
        return 0;
    }
    double rd, cp, tr;
    measure_bandwidth(threads, &rd, &cp, &tr);
    printf("memory bandwidth (%d threads): read %.2f GB/s, copy %.2f GB/s, triad %.2f GB/s; load average %.2f\n",
           threads, rd, cp, tr, load_average());
    for (int i = 0; i < n_acts; i++) {
        double gbs = per_token / r[i].step.med / 1e9;
        printf("decode (%s): %.2f tokens/s = %.0f%% of the read-bandwidth roofline (%.1f tokens/s), %.0f%% of triad\n",
               acts[i], 1.0 / r[i].step.med, 100.0 * gbs / rd, rd * 1e9 / per_token, 100.0 * gbs / tr);
    }
    for (int i = 0; i < n_acts; i++) free(r[i].logits);
    return 0;
}
