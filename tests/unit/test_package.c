/* Package format, safetensors reader, quantiser, `splash pack` and verify.
 *
 * References are independent of the code under test: tensor layouts worked
 * out by hand from docs/package-format.md, checkpoint tensors read back by a
 * small safetensors parser in this file, quantisation error bounds from the
 * group's own min and max.  Synthetic checkpoints are written here for the
 * error cases; tests/fixtures (tiny transformers / mlx-lm checkpoints) are
 * packed in every precision when present. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fs.h"
#include "base/gzip.h"
#include "base/json.h"
#include "package/package.h"
#include "package/packer.h"
#include "package/quantize.h"
#include "package/safetensors.h"
#include "package/tensor.h"
#include "text/chat_template.h"

/* ---- helpers ----------------------------------------------------------------- */

static const char *root(void) {
    const char *r = getenv("SPLASH_ROOT");
    return r && *r ? r : ".";
}

static char *tmpdir(void) {
    char *t = strdup("/tmp/splash-test-pkg-XXXXXX");
    assert_non_null(mkdtemp(t));
    return t;
}

static char *join(const char *a, const char *b) { return splash_path_join(a, b); }

static int dir_entries(const char *dir) { /* -1 if missing */
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static uint32_t rng_state;
static float frand(void) { /* uniform [-1, 1) */
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)(rng_state >> 8) / 8388608.0f - 1.0f;
}

static void write_text(const char *path, const char *text) {
    splash_error err;
    assert_int_equal(splash_write_file(path, text, strlen(text), &err), 0);
}

/* ---- a safetensors writer for synthetic checkpoints -------------------------- */

typedef struct entry {
    char name[128];
    const char *dtype;
    int ndim;
    int64_t shape[4];
    uint8_t *data;
    size_t bytes;
} entry;

typedef struct ckpt {
    entry e[512];
    int n;
} ckpt;

static entry *ck_find(ckpt *c, const char *name) {
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->e[i].name, name)) return &c->e[i];
    return NULL;
}

/* bf16 tensor of random values mean + scale * U(-1, 1) */
static void ck_bf16(ckpt *c, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2, float mean, float scale) {
    entry *e = &c->e[c->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->dtype = "BF16";
    e->ndim = ndim;
    int64_t d[3] = {d0, d1, d2};
    size_t n = 1;
    for (int i = 0; i < ndim; i++) e->shape[i] = d[i], n *= (size_t)d[i];
    e->bytes = n * 2;
    e->data = malloc(e->bytes ? e->bytes : 1);
    for (size_t i = 0; i < n; i++) {
        uint16_t h = splash_f32_to_bf16(mean + scale * frand());
        memcpy(e->data + 2 * i, &h, 2);
    }
}

static void ck_free(ckpt *c) {
    for (int i = 0; i < c->n; i++) free(c->e[i].data);
    c->n = 0;
}

static void ck_remove(ckpt *c, const char *name) {
    entry *e = ck_find(c, name);
    assert_non_null(e);
    free(e->data);
    *e = c->e[--c->n];
}

static void write_st(const char *path, const ckpt *c) {
    char hdr[65536];
    size_t o = 0, off = 0;
    o += (size_t)snprintf(hdr + o, sizeof hdr - o, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < c->n; i++) {
        const entry *e = &c->e[i];
        o += (size_t)snprintf(hdr + o, sizeof hdr - o, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", e->name, e->dtype);
        for (int d = 0; d < e->ndim; d++) o += (size_t)snprintf(hdr + o, sizeof hdr - o, "%s%lld", d ? "," : "", (long long)e->shape[d]);
        o += (size_t)snprintf(hdr + o, sizeof hdr - o, "],\"data_offsets\":[%zu,%zu]}", off, off + e->bytes);
        off += e->bytes;
    }
    o += (size_t)snprintf(hdr + o, sizeof hdr - o, "}");
    while (o % 8) hdr[o++] = ' ';
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t n = o;
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(n >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(hdr, 1, o, f);
    for (int i = 0; i < c->n; i++) fwrite(c->e[i].data, 1, c->e[i].bytes, f);
    fclose(f);
}

/* The synthetic dense model: 2 layers (GDN, attention), hidden 64, vocab 96. */
enum { H = 64, V = 96, I = 128 };

static const char *CONFIG =
    "{\"architectures\": [\"Qwen3_5ForCausalLM\"], \"model_type\": \"qwen3_5_text\",\n"
    " \"hidden_size\": 64, \"num_hidden_layers\": 2, \"vocab_size\": 96, \"intermediate_size\": 128,\n"
    " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 32,\n"
    " \"linear_num_key_heads\": 1, \"linear_num_value_heads\": 2, \"linear_key_head_dim\": 16,\n"
    " \"linear_value_head_dim\": 32, \"linear_conv_kernel_dim\": 4, \"rms_norm_eps\": 1e-06,\n"
    " \"max_position_embeddings\": 1024, \"tie_word_embeddings\": false, \"eos_token_id\": 93,\n"
    " \"layer_types\": [\"linear_attention\", \"full_attention\"],\n"
    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0, \"partial_rotary_factor\": 0.5}}\n";

static void synth(ckpt *c) {
    rng_state = 12345;
    c->n = 0;
    ck_bf16(c, "model.embed_tokens.weight", 2, V, H, 0, 0, 1);
    ck_bf16(c, "model.norm.weight", 1, H, 0, 0, 0, 0.1f);
    ck_bf16(c, "lm_head.weight", 2, V, H, 0, 0, 0.2f);
    const char *L0 = "model.layers.0.", *L1 = "model.layers.1.";
    char n[160];
#define NAME(l, s) (snprintf(n, sizeof n, "%s%s", l, s), n)
    for (int l = 0; l < 2; l++) {
        const char *p = l ? L1 : L0;
        ck_bf16(c, NAME(p, "input_layernorm.weight"), 1, H, 0, 0, 0, 0.1f);
        ck_bf16(c, NAME(p, "post_attention_layernorm.weight"), 1, H, 0, 0, 0, 0.1f);
        ck_bf16(c, NAME(p, "mlp.gate_proj.weight"), 2, I, H, 0, 0, 0.125f);
        ck_bf16(c, NAME(p, "mlp.up_proj.weight"), 2, I, H, 0, 0.5f, 0.125f); /* far from zero: bias matters */
        ck_bf16(c, NAME(p, "mlp.down_proj.weight"), 2, H, I, 0, 0, 0.09f);
    }
    ck_bf16(c, NAME(L0, "linear_attn.in_proj_qkv.weight"), 2, 96, H, 0, 0, 0.125f);
    ck_bf16(c, NAME(L0, "linear_attn.in_proj_z.weight"), 2, 64, H, 0, 0, 0.125f);
    ck_bf16(c, NAME(L0, "linear_attn.in_proj_b.weight"), 2, 2, H, 0, 0, 0.125f);
    ck_bf16(c, NAME(L0, "linear_attn.in_proj_a.weight"), 2, 2, H, 0, 0, 0.125f);
    ck_bf16(c, NAME(L0, "linear_attn.conv1d.weight"), 3, 96, 1, 4, 0, 0.5f);
    ck_bf16(c, NAME(L0, "linear_attn.A_log"), 1, 2, 0, 0, -1, 0.5f);
    ck_bf16(c, NAME(L0, "linear_attn.dt_bias"), 1, 2, 0, 0, 0, 0.5f);
    ck_bf16(c, NAME(L0, "linear_attn.norm.weight"), 1, 32, 0, 0, 1, 0.1f);
    ck_bf16(c, NAME(L0, "linear_attn.out_proj.weight"), 2, H, 64, 0, 0, 0.125f);
    ck_bf16(c, NAME(L1, "self_attn.q_proj.weight"), 2, 128, H, 0, 0, 0.125f);
    ck_bf16(c, NAME(L1, "self_attn.k_proj.weight"), 2, 32, H, 0, 0, 0.125f);
    ck_bf16(c, NAME(L1, "self_attn.v_proj.weight"), 2, 32, H, 0, 0, 0.125f);
    ck_bf16(c, NAME(L1, "self_attn.o_proj.weight"), 2, H, 64, 0, 0, 0.125f);
    ck_bf16(c, NAME(L1, "self_attn.q_norm.weight"), 1, 32, 0, 0, 0, 0.1f);
    ck_bf16(c, NAME(L1, "self_attn.k_norm.weight"), 1, 32, 0, 0, 0, 0.1f);
#undef NAME
}

typedef struct world {
    char *base, *ck, *outdir, *out;
} world;

static void world_make(world *w, const ckpt *c, const char *config) {
    w->base = tmpdir();
    w->ck = join(w->base, "ck");
    w->outdir = join(w->base, "out");
    w->out = join(w->outdir, "pkg");
    mkdir(w->ck, 0755);
    char *p = join(w->ck, "config.json");
    write_text(p, config);
    free(p);
    p = join(w->ck, "model.safetensors");
    if (c) write_st(p, c);
    free(p);
}

static void world_free(world *w) {
    splash_remove_tree(w->base);
    free(w->base), free(w->ck), free(w->outdir), free(w->out);
}

static int pack(const char *from, const char *out, splash_dtype weights, splash_error *err) {
    splash_pack_options o = {.from = from, .out = out, .weights = weights, .threads = 2, .force = 1};
    memset(err, 0, sizeof *err);
    return splash_pack(&o, NULL, err);
}

static void contains(const char *msg, const char *frag) {
    if (!strstr(msg, frag)) fail_msg("error '%s' lacks '%s'", msg, frag);
}

/* Packing w fails; the message names every fragment; nothing is left behind. */
static void expect_pack_error(world *w, const char *frag1, const char *frag2) {
    splash_error err;
    int rc = pack(w->ck, w->out, SPLASH_Q4, &err);
    assert_true(rc < 0);
    if (frag1) contains(err.msg, frag1);
    if (frag2) contains(err.msg, frag2);
    int out_entries = dir_entries(w->outdir); /* -1: the packer never got to create it */
    assert_true(out_entries <= 0);             /* no package, no PKG.tmp-* */
    assert_int_equal(dir_entries(w->base), out_entries < 0 ? 1 : 2);
}

/* ---- tensor layouts and conversions ---------------------------------------------- */

static void test_layouts(void **state) {
    (void)state;
    /* the docs' example: q4 [10240, 5120] = 26214400 codes + 2 x 1638400 */
    assert_int_equal(splash_matrix_layout(SPLASH_Q4, 10240, 5120).bytes, 29491200);
    splash_qlayout l = splash_matrix_layout(SPLASH_Q8, 3, 64); /* 192 codes, 6 B scales, 6 B biases */
    assert_int_equal(l.q_offset, 0);
    assert_int_equal(l.scales_offset, 192);
    assert_int_equal(l.biases_offset, 256);
    assert_int_equal(l.bytes, 320);
    l = splash_matrix_layout(SPLASH_Q4, 6, 128); /* 384 codes, 24 B each */
    assert_int_equal(l.scales_offset, 384);
    assert_int_equal(l.biases_offset, 448);
    assert_int_equal(l.bytes, 512);
    int64_t s3[3] = {8, 64, 128};
    assert_int_equal(splash_tensor_bytes(SPLASH_Q4, 3, s3), 8 * (4096 + 256 + 256)); /* 64x128: 4096 codes, 256 B scales */
    assert_int_equal(splash_tensor_bytes(SPLASH_BF16, 3, s3), 8 * 64 * 128 * 2);
    int64_t v[1] = {6};
    assert_int_equal(splash_tensor_bytes(SPLASH_F32, 1, v), 24);
    assert_int_equal(splash_dtype_parse("q4"), SPLASH_Q4);
    assert_int_equal(splash_dtype_parse("bf16"), SPLASH_BF16);
    assert_int_equal(splash_dtype_parse("int4"), -1);
    assert_string_equal(splash_dtype_name(SPLASH_Q8), "q8");
}

static void test_half_conversions(void **state) {
    (void)state;
    assert_int_equal(splash_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(splash_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(splash_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(splash_f32_to_f16(65520.0f), 0x7c00); /* ties to even: overflows */
    assert_int_equal(splash_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(splash_f32_to_f16(0x1p-24f), 0x0001);
    assert_int_equal(splash_f32_to_f16(0x1p-25f), 0x0000);  /* tie: to even (0) */
    assert_int_equal(splash_f32_to_f16(0x1.8p-24f), 0x0002); /* tie: to even (2) */
    assert_int_equal(splash_f32_to_f16(0.1f), 0x2e66);
    assert_true(splash_f32_to_f16(NAN) > 0x7c00);
    assert_true(splash_f16_to_f32(0x3555) == 0.333251953125f);
    assert_true(splash_f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(splash_f16_to_f32(0x8400) == -0x1p-14f);
    assert_true(isinf(splash_f16_to_f32(0xfc00)) && splash_f16_to_f32(0xfc00) < 0);
    assert_true(isnan(splash_f16_to_f32(0x7e00)));
    assert_int_equal(splash_f32_to_bf16(1.00390625f), 0x3f80); /* tie to even */
    assert_int_equal(splash_bf16_round_down(1.00390625f), 0x3f80);
    assert_int_equal(splash_bf16_round_up(1.00390625f), 0x3f81);
    assert_int_equal(splash_bf16_round_down(-1.00390625f), 0xbf81);
    assert_int_equal(splash_bf16_round_up(-1.00390625f), 0xbf80);
    assert_int_equal(splash_bf16_round_up(1.0f), 0x3f80); /* exact stays */
}

/* ---- quantiser ---------------------------------------------------------------- */

/* Dequantises element c of row r from the blob by hand (the layout of the docs). */
static float deq_by_hand(splash_dtype t, const uint8_t *blob, int64_t rows, int64_t cols, int64_t r, int64_t c,
                         float *scale) {
    int64_t groups = cols / 64;
    size_t codes = (size_t)(rows * (t == SPLASH_Q4 ? cols / 2 : cols));
    size_t so = (codes + 63) / 64 * 64, sb = (size_t)(rows * groups * 2);
    size_t bo = so + (sb + 63) / 64 * 64;
    unsigned q = t == SPLASH_Q4 ? (blob[r * cols / 2 + c / 2] >> (c % 2 ? 4 : 0)) & 15 : blob[r * cols + c];
    uint16_t sh, bh;
    memcpy(&sh, blob + so + 2 * (size_t)(r * groups + c / 64), 2);
    memcpy(&bh, blob + bo + 2 * (size_t)(r * groups + c / 64), 2);
    union { uint32_t u; float f; } s = {(uint32_t)sh << 16}, b = {(uint32_t)bh << 16};
    *scale = s.f;
    return s.f * (float)q + b.f;
}

static void check_quant(splash_dtype t) {
    const int64_t rows = 7, cols = 256;
    const float levels = t == SPLASH_Q4 ? 15.0f : 255.0f;
    float *w = malloc(sizeof(float) * rows * cols);
    rng_state = 99;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float x = frand();
            switch (r) {
            case 0: x *= 0.05f; break;                          /* small, centred */
            case 1: x = 1.0f + 0.01f * x; break;                /* narrow, far from zero */
            case 2: x = -3.0f + 0.002f * x; break;              /* narrower, negative */
            case 3: x = c < 64 ? 0.37f : (c < 128 ? -2.5f : x); break; /* two constant groups */
            case 4: x = c % 64 == 5 ? 40.0f : 0.01f * x; break; /* an outlier per group */
            case 5: x = 1000.0f * x; break;
            default: /* codes times 1/8, spanning all levels: exactly representable */
                x = (float)(c % 64 == 63 ? (int)levels : (int)(c % 64) % ((int)levels + 1)) * 0.125f;
                break;
            }
            w[r * cols + c] = x;
        }
    splash_qlayout l = splash_matrix_layout(t, rows, cols);
    uint8_t *blob = calloc(1, l.bytes);
    int64_t bad = -1;
    assert_int_equal(splash_quantize_rows(t, w, rows, cols, 0, rows, blob, &bad), 0);
    splash_tensor tt = {.name = "w", .dtype = t, .ndim = 2, .shape = {rows, cols}, .data = blob, .bytes = l.bytes};
    float *row = malloc(sizeof(float) * cols);
    for (int64_t r = 0; r < rows; r++) {
        splash_tensor_row_f32(&tt, r, row);
        double se = 0, st = 0;
        for (int64_t g = 0; g < cols / 64; g++) {
            float lo = INFINITY, hi = -INFINITY;
            for (int j = 0; j < 64; j++) {
                float x = w[r * cols + g * 64 + j];
                lo = fminf(lo, x), hi = fmaxf(hi, x);
            }
            /* ideal step, widened by the outward bf16 rounding of the bias (one
             * bf16 ulp of lo: at most |lo| 2^-7) and of the scale (2^-7 relative) */
            float step = (hi - lo) / levels;
            float slack = (fabsf(lo) * 0x1p-7f) / levels;
            float bound_step = (step + slack) * (1 + 0x1p-7f);
            for (int j = 0; j < 64; j++) {
                int64_t c = g * 64 + j;
                float s;
                float d = deq_by_hand(t, blob, rows, cols, r, c, &s);
                assert_true(isfinite(d));
                assert_true(d == row[c]); /* the library's row decode agrees with the docs' layout */
                float e = fabsf(d - w[r * cols + c]);
                if (s > bound_step) fail_msg("row %lld group %lld: scale %g > %g (range %g..%g)", (long long)r, (long long)g, s, bound_step, lo, hi);
                if (hi == lo && splash_bf16_to_f32(splash_f32_to_bf16(lo)) == lo) {
                    assert_true(s == 0.0f); /* a constant the bias holds exactly: scale 0, exact */
                    assert_true(e == 0.0f);
                } else if (e > 0.5f * s * (1 + 1e-5f) + 1e-6f * fabsf(w[r * cols + c])) {
                    fail_msg("row %lld col %lld: |%g - %g| = %g > scale/2 = %g", (long long)r, (long long)c, d,
                             w[r * cols + c], e, 0.5f * s);
                }
                se += (double)e * e;
                st += (double)s * s;
            }
        }
        if (r != 3 && r != 6) assert_true(se <= 0.15 * st); /* uniform data: ~1/12 of scale^2 */
        if (r == 6) assert_true(se == 0); /* the representable ramp comes back exactly */
    }
    /* a non-finite value is refused, naming its row */
    w[3 * cols + 17] = NAN;
    assert_int_equal(splash_quantize_rows(t, w, rows, cols, 0, rows, blob, &bad), -1);
    assert_int_equal(bad, 3);
    w[3 * cols + 17] = INFINITY;
    assert_int_equal(splash_quantize_rows(t, w + 3 * cols, rows, cols, 3, 4, blob, &bad), -1);
    free(row);
    free(blob);
    free(w);
}

static void test_quantize_q4(void **state) {
    (void)state;
    check_quant(SPLASH_Q4);
}
static void test_quantize_q8(void **state) {
    (void)state;
    check_quant(SPLASH_Q8);
}

/* ---- safetensors reader ----------------------------------------------------------- */

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(data, 1, n, f);
    fclose(f);
}

static void st_expect_error(const char *path, const char *frag1, const char *frag2) {
    splash_st *st = NULL;
    splash_error err = {0};
    assert_true(splash_st_open(path, &st, &err) < 0);
    assert_null(st);
    contains(err.msg, path);
    if (frag1) contains(err.msg, frag1);
    if (frag2) contains(err.msg, frag2);
}

static void write_raw_st(const char *path, const char *header, size_t data_bytes) {
    size_t n = strlen(header);
    uint8_t *buf = calloc(1, 8 + n + data_bytes);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, header, n);
    write_bytes(path, buf, 8 + n + data_bytes);
    free(buf);
}

static void test_safetensors_reader(void **state) {
    (void)state;
    char *dir = tmpdir();
    char *p = join(dir, "a.safetensors");
    /* a good file with F32, F16, BF16, U32, I64 tensors */
    const char *hdr = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                      "\"h\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[16,20]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[20,24]},"
                      "\"u\":{\"dtype\":\"U32\",\"shape\":[1,1],\"data_offsets\":[24,28]},"
                      "\"i\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[28,36]}}";
    size_t n = strlen(hdr);
    uint8_t buf[1024] = {0};
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, hdr, n);
    float xs[4] = {1.5f, -2, 3, 4};
    uint16_t hs[2] = {0x3c00, 0xc000}, bs[2] = {0x3f80, 0x4040};
    memcpy(buf + 8 + n, xs, 16);
    memcpy(buf + 8 + n + 16, hs, 4);
    memcpy(buf + 8 + n + 20, bs, 4);
    write_bytes(p, buf, 8 + n + 36);
    splash_st *st = NULL;
    splash_error err = {0};
    assert_int_equal(splash_st_open(dir, &st, &err), 0);
    assert_int_equal(splash_st_count(st), 5);
    const splash_st_tensor *t = splash_st_find(st, "x");
    assert_non_null(t);
    assert_int_equal(t->dtype, SPLASH_ST_F32);
    assert_int_equal(t->ndim, 2);
    float out[4];
    assert_int_equal(splash_st_read_f32(t, 1, 3, out), 0);
    assert_true(out[0] == -2 && out[2] == 4);
    assert_int_equal(splash_st_read_f32(splash_st_find(st, "h"), 0, 2, out), 0);
    assert_true(out[0] == 1 && out[1] == -2);
    assert_int_equal(splash_st_read_f32(splash_st_find(st, "b"), 0, 2, out), 0);
    assert_true(out[0] == 1 && out[1] == 3);
    assert_int_equal(splash_st_read_f32(splash_st_find(st, "u"), 0, 1, out), -1);
    assert_int_equal(splash_st_find(st, "i")->dtype, SPLASH_ST_I64);
    assert_null(splash_st_find(st, "nope"));
    splash_st_close(st);

    /* truncated inside the data: names the file and the tensor cut off */
    write_bytes(p, buf, 8 + n + 30);
    st_expect_error(p, "tensor i", "truncated");
    /* truncated inside the header, and shorter than the length prefix */
    write_bytes(p, buf, 8 + n / 2);
    st_expect_error(p, "header length", NULL);
    write_bytes(p, buf, 5);
    st_expect_error(p, "truncated", NULL);
    /* a header that is not JSON */
    write_raw_st(p, "{\"x\": {\"dtype\": \"F32\", oops}}", 16);
    st_expect_error(p, "not JSON", NULL);
    /* offsets beyond the data */
    write_raw_st(p, "{\"w\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[100,108]}}", 16);
    st_expect_error(p, "tensor w", "outside");
    /* offsets that disagree with the shape */
    write_raw_st(p, "{\"w\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,6]}}", 16);
    st_expect_error(p, "tensor w", "needs 8");
    /* unknown dtype */
    write_raw_st(p, "{\"w\":{\"dtype\":\"Q7\",\"shape\":[4],\"data_offsets\":[0,4]}}", 16);
    st_expect_error(p, "tensor w", "Q7");
    remove(p);

    /* an index naming a tensor its file lacks */
    write_raw_st(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    char *idx = join(dir, "model.safetensors.index.json");
    write_text(idx, "{\"metadata\": {}, \"weight_map\": {\"w\": \"a.safetensors\", \"v\": \"a.safetensors\"}}");
    st = NULL;
    assert_true(splash_st_open(dir, &st, &err) < 0);
    contains(err.msg, "tensor v");
    contains(err.msg, "a.safetensors");
    write_text(idx, "{\"weight_map\": {\"w\": \"a.safetensors\"}}");
    assert_int_equal(splash_st_open(dir, &st, &err), 0);
    splash_st_close(st);
    write_text(idx, "not json");
    assert_true(splash_st_open(dir, &st, &err) < 0);
    contains(err.msg, "model.safetensors.index.json");
    free(idx);
    free(p);
    splash_remove_tree(dir);
    free(dir);
}

/* ---- packing a synthetic checkpoint --------------------------------------------------- */

static float bf16_at(const entry *e, size_t i) {
    uint16_t h;
    memcpy(&h, e->data + 2 * i, 2);
    return splash_bf16_to_f32(h);
}

static void test_pack_synthetic(void **state) {
    (void)state;
    ckpt c;
    synth(&c);
    world w;
    world_make(&w, &c, CONFIG);
    splash_error err;
    for (int k = 0; k < 3; k++) {
        splash_dtype wt = k == 0 ? SPLASH_BF16 : k == 1 ? SPLASH_Q8 : SPLASH_Q4;
        int rc = pack(w.ck, w.out, wt, &err);
        if (rc) fail_msg("pack: %s", err.msg);
        assert_int_equal(dir_entries(w.outdir), 1); /* just the package */
        splash_package *pkg = NULL;
        if (splash_package_open(w.out, &pkg, &err)) fail_msg("open: %s", err.msg);
        assert_string_equal(splash_package_architecture(pkg), "qwen3_5");
        assert_int_equal(splash_package_tensor_count(pkg), 3 + 2 * 5 + 9 + 6);
        assert_int_equal(splash_package_verify(w.out, 0, &err), 0);
        const json_value *m = splash_package_manifest(pkg);
        const json_value *model = json_get(m, "model");
        assert_int_equal(json_get_int(model, "hidden", 0), 64);
        assert_int_equal(json_get_int(model, "vocab", 0), 96);
        assert_int_equal(json_get_int(json_get(model, "attention"), "rotary_dim", 0), 16);
        assert_true(json_get_num(json_get(model, "attention"), "rope_theta", 0) == 1e6);
        assert_int_equal(json_get_int(json_get(model, "gdn"), "value_heads", 0), 2);
        assert_int_equal(json_get_int(json_get(model, "ffn"), "intermediate", 0), 128);
        int64_t eos = -1;
        json_int64(json_at(json_get(json_get(m, "tokens"), "eos"), 0), &eos);
        assert_int_equal(eos, 93);
        assert_string_equal(json_get_string(json_get(m, "quantization"), "weights", ""), splash_dtype_name(wt));

        const splash_tensor *t;
        /* norms: 1 + w in f32; the GDN norm as is; conv [C, K]; A_log as is */
        int64_t shH[1] = {H};
        assert_int_equal(splash_package_get(pkg, "final_norm", 1, shH, &t, &err), 0);
        assert_int_equal(t->dtype, SPLASH_F32);
        const entry *e = ck_find(&c, "model.norm.weight");
        for (int i = 0; i < H; i++) assert_true(((const float *)t->data)[i] == 1.0f + bf16_at(e, i));
        t = splash_package_find(pkg, "layers.0.gdn.norm");
        e = ck_find(&c, "model.layers.0.linear_attn.norm.weight");
        for (int i = 0; i < 32; i++) assert_true(((const float *)t->data)[i] == bf16_at(e, i));
        int64_t conv_shape[2] = {96, 4};
        assert_int_equal(splash_package_get(pkg, "layers.0.gdn.conv", 2, conv_shape, &t, &err), 0);
        e = ck_find(&c, "model.layers.0.linear_attn.conv1d.weight");
        for (int i = 0; i < 96 * 4; i++) assert_true(((const float *)t->data)[i] == bf16_at(e, (size_t)i));
        t = splash_package_find(pkg, "layers.1.attn.k_norm");
        e = ck_find(&c, "model.layers.1.self_attn.k_norm.weight");
        for (int i = 0; i < 32; i++) assert_true(((const float *)t->data)[i] == 1.0f + bf16_at(e, i));
        /* a shape check names the tensor */
        int64_t wrong[2] = {96, 5};
        assert_true(splash_package_get(pkg, "layers.0.gdn.conv", 2, wrong, &t, &err) < 0);
        contains(err.msg, "layers.0.gdn.conv");
        assert_true(splash_package_get(pkg, "layers.0.attn.q_proj", 0, NULL, &t, &err) < 0);
        contains(err.msg, "layers.0.attn.q_proj");

        /* every matrix: bf16 exact, q8/q4 within the group bound */
        const char *mats[][2] = {{"embed", "model.embed_tokens.weight"},
                                 {"lm_head", "lm_head.weight"},
                                 {"layers.0.ffn.up", "model.layers.0.mlp.up_proj.weight"},
                                 {"layers.1.ffn.down", "model.layers.1.mlp.down_proj.weight"},
                                 {"layers.0.gdn.in_proj_b", "model.layers.0.linear_attn.in_proj_b.weight"},
                                 {"layers.1.attn.q_proj", "model.layers.1.self_attn.q_proj.weight"}};
        for (size_t mi = 0; mi < sizeof mats / sizeof mats[0]; mi++) {
            t = splash_package_find(pkg, mats[mi][0]);
            e = ck_find(&c, mats[mi][1]);
            assert_non_null(t);
            assert_int_equal(t->dtype, wt);
            assert_true(t->shape[0] == e->shape[0] && t->shape[1] == e->shape[1]);
            int64_t cols = e->shape[1];
            float *row = malloc(sizeof(float) * (size_t)cols);
            for (int64_t r = 0; r < e->shape[0]; r++) {
                splash_tensor_row_f32(t, r, row);
                for (int64_t g = 0; g < cols / 64; g++) {
                    float lo = INFINITY, hi = -INFINITY;
                    for (int j = 0; j < 64; j++) {
                        float x = bf16_at(e, (size_t)(r * cols + g * 64 + j));
                        lo = fminf(lo, x), hi = fmaxf(hi, x);
                    }
                    float tol = wt == SPLASH_BF16 ? 0.0f
                                                  : 0.5f * ((hi - lo) / (wt == SPLASH_Q4 ? 15 : 255) + fabsf(lo) * 0x1p-7f) * 1.01f;
                    for (int j = 0; j < 64; j++) {
                        size_t i = (size_t)(r * cols + g * 64 + j);
                        if (fabsf(row[g * 64 + j] - bf16_at(e, i)) > tol)
                            fail_msg("%s [%lld, %lld]: %g vs %g", mats[mi][0], (long long)r, (long long)(g * 64 + j),
                                     row[g * 64 + j], bf16_at(e, i));
                    }
                }
            }
            free(row);
        }
        /* o_proj has 64 inputs: quantised; gdn.out_proj too; both are plain here */
        splash_package_close(pkg);
    }
    /* a second pack without --force refuses and keeps the package */
    splash_pack_options o = {.from = w.ck, .out = w.out, .weights = SPLASH_Q4};
    assert_true(splash_pack(&o, NULL, &err) < 0);
    contains(err.msg, "exists");
    assert_int_equal(dir_entries(w.outdir), 1);
    world_free(&w);
    ck_free(&c);
}

static void test_pack_tokenizer_and_tokens(void **state) {
    (void)state;
    ckpt c;
    synth(&c);
    world w;
    world_make(&w, &c, CONFIG);
    char *p = join(w.ck, "tokenizer.json");
    write_text(p, "{\"version\": \"1.0\", \"added_tokens\": ["
                  "{\"id\": 90, \"content\": \"<|endoftext|>\", \"special\": true},"
                  "{\"id\": 91, \"content\": \"<|im_start|>\", \"special\": true},"
                  "{\"id\": 92, \"content\": \"<|im_end|>\", \"special\": true},"
                  "{\"id\": 94, \"content\": \"<think>\", \"special\": false},"
                  "{\"id\": 95, \"content\": \"</think>\", \"special\": false},"
                  "{\"id\": 88, \"content\": \"<tool_call>\", \"special\": false},"
                  "{\"id\": 89, \"content\": \"</tool_call>\", \"special\": false},"
                  "{\"id\": 80, \"content\": \"<|vision_start|>\", \"special\": true}],"
                  " \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}");
    free(p);
    p = join(w.ck, "tokenizer_config.json");
    write_text(p, "{\"pad_token\": \"<|endoftext|>\", \"eos_token\": \"<|im_end|>\", "
                  "\"chat_template\": \"{% for m in messages %}{{ m.content }}{% endfor %}\"}");
    free(p);
    p = join(w.ck, "generation_config.json");
    write_text(p, "{\"eos_token_id\": [92, 90], \"pad_token_id\": 90}");
    free(p);
    splash_error err;
    if (pack(w.ck, w.out, SPLASH_BF16, &err)) fail_msg("pack: %s", err.msg);
    splash_package *pkg;
    if (splash_package_open(w.out, &pkg, &err)) fail_msg("open: %s", err.msg);
    const json_value *tok = json_get(splash_package_manifest(pkg), "tokens");
    const json_value *eos = json_get(tok, "eos");
    assert_non_null(eos);
    int64_t ids[3] = {-1, -1, -1};
    assert_int_equal(eos->count, 3); /* generation_config's, then config.json's 93 */
    for (int i = 0; i < 3; i++) json_int64(eos->items[i], &ids[i]);
    assert_int_equal(ids[0], 92);
    assert_int_equal(ids[1], 90);
    assert_int_equal(ids[2], 93);
    assert_int_equal(json_get_int(tok, "pad", -1), 90);
    assert_int_equal(json_get_int(tok, "im_start", -1), 91);
    assert_int_equal(json_get_int(tok, "im_end", -1), 92);
    assert_int_equal(json_get_int(tok, "endoftext", -1), 90);
    assert_int_equal(json_get_int(tok, "think_start", -1), 94);
    assert_int_equal(json_get_int(tok, "think_end", -1), 95);
    assert_int_equal(json_get_int(tok, "tool_call_start", -1), 88);
    assert_int_equal(json_get_int(tok, "tool_call_end", -1), 89);
    assert_int_equal(json_get_int(tok, "vision_start", -1), 80);
    assert_null(json_get(tok, "image_pad"));
    const char *ct = json_get_string(splash_package_manifest(pkg), "chat_template", "");
    assert_true(strcmp(ct, "absent") && strcmp(ct, "native")); /* present, and not the known template */
    const char *tp = splash_package_file(pkg, "tokenizer/chat_template.jinja");
    assert_non_null(tp);
    char *text;
    assert_int_equal(splash_read_file(tp, &text, NULL, &err), 0);
    assert_string_equal(text, "{% for m in messages %}{{ m.content }}{% endfor %}");
    free(text);
    /* tokenizer.json is stored gzipped, and reads back as the source's bytes */
    assert_null(splash_package_file(pkg, "tokenizer/tokenizer.json"));
    const char *tj = splash_package_file(pkg, "tokenizer/tokenizer.json.gz");
    assert_non_null(tj);
    char *want, *got, *tjson = join(w.ck, "tokenizer.json"), *plain = strdup(tj);
    size_t wl, gl;
    plain[strlen(plain) - 3] = 0; /* the .json path: read with its .gz fallback */
    assert_int_equal(splash_read_file(tjson, &want, &wl, &err), 0);
    assert_int_equal(splash_read_file_or_gz(plain, &got, &gl, &err), 0);
    assert_int_equal(gl, wl);
    assert_memory_equal(got, want, wl);
    free(want), free(got), free(tjson), free(plain);
    assert_non_null(splash_package_file(pkg, "tokenizer/tokenizer_config.json"));
    assert_null(splash_package_file(pkg, "tokenizer/generation_config.json"));
    splash_package_close(pkg);
    assert_int_equal(splash_package_verify(w.out, 0, &err), 0);
    /* the known template, as chat_template.jinja: "native" */
    p = join(w.ck, "chat_template.jinja");
    write_text(p, splash_chat_template_builtin(NULL));
    free(p);
    if (pack(w.ck, w.out, SPLASH_BF16, &err)) fail_msg("pack: %s", err.msg);
    if (splash_package_open(w.out, &pkg, &err)) fail_msg("open: %s", err.msg);
    assert_string_equal(json_get_string(splash_package_manifest(pkg), "chat_template", ""), "native");
    splash_package_close(pkg);
    world_free(&w);
    ck_free(&c);
}

static void test_pack_errors(void **state) {
    (void)state;
    ckpt c;
    world w;

    /* a missing tensor */
    synth(&c);
    ck_remove(&c, "model.layers.1.self_attn.k_proj.weight");
    world_make(&w, &c, CONFIG);
    expect_pack_error(&w, "model.layers.1.self_attn.k_proj.weight", "not in the checkpoint");
    world_free(&w);
    ck_free(&c);

    /* a misshapen tensor: names the file, the tensor and both shapes */
    synth(&c);
    entry *e = ck_find(&c, "model.layers.0.linear_attn.in_proj_z.weight");
    e->shape[0] = 63;
    e->bytes = 63 * H * 2;
    world_make(&w, &c, CONFIG);
    expect_pack_error(&w, "model.safetensors: tensor model.layers.0.linear_attn.in_proj_z.weight", "[63, 64], expected [64, 64]");
    world_free(&w);
    ck_free(&c);

    /* unknown architecture */
    synth(&c);
    char cfg[4096];
    const char *a = strstr(CONFIG, "Qwen3_5ForCausalLM");
    snprintf(cfg, sizeof cfg, "%.*sLlamaForCausalLM%s", (int)(a - CONFIG), CONFIG, a + strlen("Qwen3_5ForCausalLM"));
    world_make(&w, &c, cfg);
    expect_pack_error(&w, "config.json", "unknown architecture");
    world_free(&w);

    /* config.json that is not JSON */
    world_make(&w, &c, "{\"architectures\": [\"Qwen3_5ForCausalLM\"], hidden_size: 64}");
    expect_pack_error(&w, "config.json", "not JSON");
    world_free(&w);

    /* no config at all */
    world_make(&w, &c, CONFIG);
    char *p = join(w.ck, "config.json");
    remove(p);
    free(p);
    expect_pack_error(&w, "config.json", NULL);
    world_free(&w);

    /* a truncated safetensors file: names the file and a tensor */
    world_make(&w, &c, CONFIG);
    p = join(w.ck, "model.safetensors");
    assert_int_equal(truncate(p, splash_file_size(p) - 100), 0);
    expect_pack_error(&w, p, "truncated");
    free(p);
    world_free(&w);

    /* an unsupported rope */
    const char *yarn = "{\"architectures\": [\"Qwen3_5ForCausalLM\"], \"hidden_size\": 64, "
                       "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}";
    world_make(&w, &c, yarn);
    expect_pack_error(&w, "config.json", "yarn");
    world_free(&w);

    /* a non-finite weight is refused (while writing: the temporary directory goes) */
    e = ck_find(&c, "model.layers.0.mlp.gate_proj.weight");
    uint16_t nan = 0x7fc0;
    memcpy(e->data + 2 * 70, &nan, 2);
    world_make(&w, &c, CONFIG);
    expect_pack_error(&w, "model.layers.0.mlp.gate_proj.weight", "non-finite");
    world_free(&w);
    ck_free(&c);
}

/* Tensor mapped by package_open outside its file, wrong bytes, bad version. */
static void test_package_open_errors(void **state) {
    (void)state;
    ckpt c;
    synth(&c);
    world w;
    world_make(&w, &c, CONFIG);
    splash_error err;
    if (pack(w.ck, w.out, SPLASH_Q4, &err)) fail_msg("pack: %s", err.msg);
    char *mp = join(w.out, "manifest.json");
    char *orig;
    size_t len;
    assert_int_equal(splash_read_file(mp, &orig, &len, &err), 0);
    struct {
        const char *key;
        int64_t value;
        const char *frag;
    } cases[] = {{"offset", 1 << 20, "outside"}, {"bytes", 4, "bytes"}, {"offset", 32, "multiple of 64"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char jerr[128];
        json_value *m = json_parse(orig, len, 64, jerr, sizeof jerr);
        json_value *t = json_at(json_get(m, "tensors"), 5);
        json_obj_set(t, cases[k].key, json_new_int(cases[k].value));
        strbuf sb;
        sb_init(&sb);
        json_write(&sb, m, JSON_PRETTY);
        write_text(mp, sb_cstr(&sb));
        sb_free(&sb);
        splash_package *pkg = NULL;
        assert_true(splash_package_open(w.out, &pkg, &err) < 0);
        assert_null(pkg);
        contains(err.msg, json_get_string(t, "name", "?"));
        contains(err.msg, cases[k].frag);
        json_free(m);
    }
    write_text(mp, orig);
    splash_package *pkg = NULL;
    assert_int_equal(splash_package_open(w.out, &pkg, &err), 0);
    splash_package_close(pkg);
    /* a shortened section file: open names it; verify names it */
    char *f = join(w.out, "target/layer-1.bin");
    assert_int_equal(truncate(f, splash_file_size(f) - 1), 0);
    assert_true(splash_package_open(w.out, &pkg, &err) < 0);
    contains(err.msg, "layer-1.bin");
    assert_int_equal(splash_package_verify(w.out, 0, &err), SPLASH_E_MISMATCH);
    contains(err.msg, "layer-1.bin");
    contains(err.msg, "size");
    free(f);
    /* another format version */
    char *v2 = strdup(orig);
    char *at = strstr(v2, "\"version\": 1");
    at[strlen("\"version\": ")] = '2';
    write_text(mp, v2);
    assert_true(splash_package_open(w.out, &pkg, &err) < 0);
    contains(err.msg, "version 2");
    free(v2);
    free(orig);
    free(mp);
    world_free(&w);
    ck_free(&c);
}

/* ---- the fixtures ------------------------------------------------------------------- */

typedef struct fx {
    char *data;
    size_t len;
    json_value *hdr;
    const uint8_t *base;
} fx;

/* The fixture's single model.safetensors, parsed by hand (not by the reader under test). */
static int fx_open(fx *f, const char *name) {
    memset(f, 0, sizeof *f);
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/%s/model.safetensors", root(), name);
    splash_error err;
    if (splash_read_file(path, &f->data, &f->len, &err)) return -1;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | (uint8_t)f->data[i];
    char jerr[128];
    f->hdr = json_parse(f->data + 8, (size_t)n, 16, jerr, sizeof jerr);
    assert_non_null(f->hdr);
    f->base = (const uint8_t *)f->data + 8 + n;
    return 0;
}

static void fx_close(fx *f) {
    json_free(f->hdr);
    free(f->data);
}

static const uint8_t *fx_tensor(fx *f, const char *name, size_t *bytes, const char **dtype) {
    const json_value *e = json_get(f->hdr, name);
    if (!e) fail_msg("fixture lacks %s", name);
    int64_t a, b;
    json_int64(json_at(json_get(e, "data_offsets"), 0), &a);
    json_int64(json_at(json_get(e, "data_offsets"), 1), &b);
    *bytes = (size_t)(b - a);
    if (dtype) *dtype = json_get_string(e, "dtype", "");
    return f->base + a;
}

static char *fixture_dir(const char *name) {
    char *d = malloc(1024);
    snprintf(d, 1024, "%s/tests/fixtures/%s", root(), name);
    if (!splash_is_dir(d)) {
        free(d);
        return NULL;
    }
    return d;
}

static splash_package *pack_open(const char *fixture, const char *out, splash_dtype wt) {
    char *from = fixture_dir(fixture);
    if (!from) return NULL;
    splash_error err;
    if (pack(from, out, wt, &err)) fail_msg("pack %s %s: %s", fixture, splash_dtype_name(wt), err.msg);
    free(from);
    if (splash_package_verify(out, 0, &err)) fail_msg("verify %s: %s", out, err.msg);
    splash_package *pkg = NULL;
    if (splash_package_open(out, &pkg, &err)) fail_msg("open %s: %s", out, err.msg);
    return pkg;
}

static void test_fixture_dense(void **state) {
    (void)state;
    fx f;
    if (fx_open(&f, "dense-tiny")) skip();
    char *base = tmpdir();
    char *out = join(base, "dense");
    splash_package *pkg = pack_open("dense-tiny", out, SPLASH_BF16);
    const json_value *m = splash_package_manifest(pkg);
    const json_value *model = json_get(m, "model");
    assert_int_equal(json_get_int(model, "hidden", 0), 128);
    assert_int_equal(json_get_int(model, "layers", 0), 8);
    assert_int_equal(json_get_int(model, "vocab", 0), 512);
    assert_int_equal(json_get_int(json_get(model, "attention"), "rotary_dim", 0), 16);
    assert_int_equal(json_get_int(json_get(model, "attention"), "kv_heads", 0), 2);
    assert_true(json_get_num(json_get(model, "attention"), "rope_theta", 0) == 1e7);
    assert_int_equal(json_get_int(json_get(model, "gdn"), "value_heads", 0), 6);
    assert_int_equal(json_get_int(json_get(model, "gdn"), "value_dim", 0), 48);
    assert_int_equal(json_get_int(json_get(model, "ffn"), "intermediate", 0), 192);
    assert_string_equal(json_string(json_at(json_get(model, "layer_types"), 3)), "full_attention");
    assert_string_equal(json_string(json_at(json_get(model, "layer_types"), 4)), "linear_attention");
    assert_int_equal(splash_package_tensor_count(pkg), 109);
    /* every bf16 tensor is the checkpoint's bytes; norms 1 + w; GDN norm, A_log as is */
    const char *same[][2] = {{"embed", "model.embed_tokens.weight"},
                             {"lm_head", "lm_head.weight"},
                             {"layers.3.attn.q_proj", "model.layers.3.self_attn.q_proj.weight"},
                             {"layers.0.gdn.in_proj_qkv", "model.layers.0.linear_attn.in_proj_qkv.weight"},
                             {"layers.6.gdn.out_proj", "model.layers.6.linear_attn.out_proj.weight"},
                             {"layers.7.ffn.down", "model.layers.7.mlp.down_proj.weight"}};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        const splash_tensor *t = splash_package_find(pkg, same[i][0]);
        size_t n;
        const uint8_t *src = fx_tensor(&f, same[i][1], &n, NULL);
        assert_non_null(t);
        assert_int_equal(t->bytes, n);
        assert_memory_equal(t->data, src, n);
    }
    const char *f32s[][2] = {{"layers.0.gdn.A_log", "model.layers.0.linear_attn.A_log"},
                             {"layers.0.gdn.dt_bias", "model.layers.0.linear_attn.dt_bias"},
                             {"layers.0.gdn.norm", "model.layers.0.linear_attn.norm.weight"},
                             {"layers.0.gdn.conv", "model.layers.0.linear_attn.conv1d.weight"},
                             {"layers.3.attn.q_norm", "model.layers.3.self_attn.q_norm.weight"},
                             {"layers.5.post_norm", "model.layers.5.post_attention_layernorm.weight"},
                             {"final_norm", "model.norm.weight"}};
    for (size_t i = 0; i < sizeof f32s / sizeof f32s[0]; i++) {
        const splash_tensor *t = splash_package_find(pkg, f32s[i][0]);
        size_t n;
        const uint8_t *src = fx_tensor(&f, f32s[i][1], &n, NULL);
        assert_int_equal(t->dtype, SPLASH_F32);
        assert_int_equal(t->bytes, n * 2);
        int plus = i >= 4;
        for (size_t k = 0; k < n / 2; k++) {
            uint16_t h;
            memcpy(&h, src + 2 * k, 2);
            float want = (plus ? 1.0f : 0.0f) + splash_bf16_to_f32(h);
            assert_true(((const float *)t->data)[k] == want);
        }
    }
    int64_t conv[2] = {2 * 2 * 32 + 6 * 48, 4};
    const splash_tensor *t;
    splash_error err;
    assert_int_equal(splash_package_get(pkg, "layers.1.gdn.conv", 2, conv, &t, &err), 0);
    splash_package_close(pkg);

    /* q8 / q4: the matrices with 128 inputs quantised, out_proj (288 inputs) bf16 */
    for (int k = 0; k < 2; k++) {
        splash_dtype wt = k ? SPLASH_Q4 : SPLASH_Q8;
        pkg = pack_open("dense-tiny", out, wt);
        assert_int_equal(splash_package_find(pkg, "layers.0.gdn.in_proj_qkv")->dtype, wt);
        assert_int_equal(splash_package_find(pkg, "layers.0.gdn.in_proj_a")->dtype, wt);
        assert_int_equal(splash_package_find(pkg, "embed")->dtype, wt);
        assert_int_equal(splash_package_find(pkg, "layers.0.gdn.out_proj")->dtype, SPLASH_BF16);
        assert_int_equal(splash_package_find(pkg, "layers.3.attn.o_proj")->dtype, wt); /* 4 x 64 inputs */
        assert_int_equal(splash_package_find(pkg, "layers.0.input_norm")->dtype, SPLASH_F32);
        /* relative error of one quantised matrix against the bf16 checkpoint */
        t = splash_package_find(pkg, "layers.2.ffn.gate");
        size_t n;
        const uint8_t *src = fx_tensor(&f, "model.layers.2.mlp.gate_proj.weight", &n, NULL);
        float row[128];
        double num = 0, den = 0;
        for (int64_t r = 0; r < t->shape[0]; r++) {
            splash_tensor_row_f32(t, r, row);
            for (int c = 0; c < 128; c++) {
                uint16_t h;
                memcpy(&h, src + 2 * (size_t)(r * 128 + c), 2);
                double x = splash_bf16_to_f32(h);
                num += (row[c] - x) * (row[c] - x);
                den += x * x;
            }
        }
        double rel = sqrt(num / den);
        /* q4 of uniform-ish weights: about 1/(15 sqrt 3) of the range ~ 0.1; q8 ~ 1/16 of that */
        assert_true(rel < (wt == SPLASH_Q4 ? 0.15 : 0.01));
        assert_true(rel > (wt == SPLASH_Q4 ? 0.01 : 0.0005));
        splash_package_close(pkg);
    }

    /* corrupting one byte makes verify fail, naming the file */
    char *lf = join(out, "target/layer-2.bin");
    FILE *fp = fopen(lf, "r+b");
    fseek(fp, 100, SEEK_SET);
    int ch = fgetc(fp);
    fseek(fp, 100, SEEK_SET);
    fputc(ch ^ 1, fp);
    fclose(fp);
    assert_int_equal(splash_package_verify(out, 0, &err), SPLASH_E_MISMATCH);
    contains(err.msg, "layer-2.bin");
    contains(err.msg, "sha256");
    free(lf);
    fx_close(&f);
    splash_remove_tree(base);
    free(base);
    free(out);
}

static void test_fixture_moe_forms(void **state) {
    (void)state;
    fx f;
    if (fx_open(&f, "moe-tiny")) skip();
    char *base = tmpdir();
    char *a = join(base, "per"), *b = join(base, "fused");
    for (int k = 0; k < 3; k++) {
        splash_dtype wt = k == 0 ? SPLASH_BF16 : k == 1 ? SPLASH_Q8 : SPLASH_Q4;
        splash_package *pa = pack_open("moe-tiny", a, wt);
        splash_package *pb = pack_open("moe-tiny-fused", b, wt);
        assert_non_null(pb);
        assert_string_equal(splash_package_architecture(pa), "qwen3_5_moe");
        const json_value *moe = json_get(json_get(splash_package_manifest(pa), "model"), "moe");
        assert_int_equal(json_get_int(moe, "experts", 0), 8);
        assert_int_equal(json_get_int(moe, "top_k", 0), 2);
        assert_int_equal(json_get_int(moe, "expert_intermediate", 0), 64);
        assert_int_equal(json_get_int(moe, "shared_intermediate", 0), 64);
        /* the two on-disk forms give the same tensors, byte for byte */
        size_t n = splash_package_tensor_count(pa);
        assert_int_equal(n, 3 + 6 * 11 + 2 * 8 + 8 * 8);
        assert_int_equal(splash_package_tensor_count(pb), n + 2); /* + mtp.fc.weight, mtp.norm.weight */
        for (size_t i = 0; i < n; i++) {
            const splash_tensor *x = splash_package_tensor_at(pa, i);
            const splash_tensor *y = splash_package_find(pb, x->name);
            if (!y) fail_msg("%s missing from the fused package", x->name);
            assert_int_equal(x->dtype, y->dtype);
            assert_int_equal(x->bytes, y->bytes);
            assert_int_equal(x->ndim, y->ndim);
            if (memcmp(x->data, y->data, x->bytes)) fail_msg("%s differs (%s)", x->name, splash_dtype_name(wt));
        }
        const splash_tensor *t = splash_package_find(pa, "layers.4.moe.router");
        assert_int_equal(t->dtype, SPLASH_BF16); /* the router stays bf16 */
        assert_int_equal(splash_package_find(pa, "layers.4.moe.shared_expert_gate")->dtype, SPLASH_BF16);
        t = splash_package_find(pa, "layers.4.moe.experts_up");
        assert_int_equal(t->dtype, wt);
        assert_int_equal(t->ndim, 3);
        assert_true(t->shape[0] == 8 && t->shape[1] == 64 && t->shape[2] == 128);
        if (wt == SPLASH_BF16) {
            /* expert e of the stack is the checkpoint's experts.e tensor */
            for (int e = 0; e < 8; e++) {
                char name[128];
                const char *which[3] = {"gate", "up", "down"};
                for (int w = 0; w < 3; w++) {
                    snprintf(name, sizeof name, "model.layers.4.mlp.experts.%d.%s_proj.weight", e, which[w]);
                    size_t nb;
                    const uint8_t *src = fx_tensor(&f, name, &nb, NULL);
                    char cn[64];
                    snprintf(cn, sizeof cn, "layers.4.moe.experts_%s", which[w]);
                    splash_tensor s = splash_tensor_slice(splash_package_find(pa, cn), e);
                    assert_int_equal(s.bytes, nb);
                    assert_memory_equal(s.data, src, nb);
                }
            }
            /* mtp tensors verbatim */
            fx g;
            assert_int_equal(fx_open(&g, "moe-tiny-fused"), 0);
            size_t nb;
            const uint8_t *src = fx_tensor(&g, "mtp.fc.weight", &nb, NULL);
            t = splash_package_find(pb, "mtp.fc.weight");
            assert_non_null(t);
            assert_int_equal(t->dtype, SPLASH_BF16);
            assert_true(t->shape[0] == 128 && t->shape[1] == 256);
            assert_memory_equal(t->data, src, nb);
            assert_non_null(splash_package_file(pb, "target/mtp.bin"));
            fx_close(&g);
        } else {
            /* expert slices decode within the q bound of the bf16 experts */
            splash_tensor s = splash_tensor_slice(t, 5);
            size_t nb;
            const uint8_t *src = fx_tensor(&f, "model.layers.4.mlp.experts.5.up_proj.weight", &nb, NULL);
            float row[128];
            for (int64_t r = 0; r < 64; r++) {
                splash_tensor_row_f32(&s, r, row);
                for (int c = 0; c < 128; c++) {
                    uint16_t h;
                    memcpy(&h, src + 2 * (size_t)(r * 128 + c), 2);
                    assert_true(fabsf(row[c] - splash_bf16_to_f32(h)) < (wt == SPLASH_Q4 ? 0.1f : 0.01f));
                }
            }
        }
        splash_package_close(pa);
        splash_package_close(pb);
    }
    fx_close(&f);
    splash_remove_tree(base);
    free(base);
    free(a);
    free(b);
}

static void test_fixture_mlx(void **state) {
    (void)state;
    fx f;
    if (fx_open(&f, "dense-tiny-mlx")) skip();
    char *base = tmpdir();
    char *out = join(base, "mlx");
    /* q4: codes, scales and biases copied as they are */
    splash_package *pkg = pack_open("dense-tiny-mlx", out, SPLASH_Q4);
    const char *mats[][2] = {{"layers.2.ffn.down", "language_model.model.layers.2.mlp.down_proj"},
                             {"embed", "language_model.model.embed_tokens"},
                             {"lm_head", "language_model.lm_head"},
                             {"layers.0.gdn.in_proj_b", "language_model.model.layers.0.linear_attn.in_proj_b"}};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
        const splash_tensor *t = splash_package_find(pkg, mats[i][0]);
        assert_int_equal(t->dtype, SPLASH_Q4);
        splash_qlayout l = splash_matrix_layout(SPLASH_Q4, t->shape[0], t->shape[1]);
        const char *parts[3] = {"weight", "scales", "biases"};
        size_t offs[3] = {l.q_offset, l.scales_offset, l.biases_offset};
        for (int k = 0; k < 3; k++) {
            char name[160];
            snprintf(name, sizeof name, "%s.%s", mats[i][1], parts[k]);
            size_t nb;
            const char *dt;
            const uint8_t *src = fx_tensor(&f, name, &nb, &dt);
            assert_string_equal(dt, k ? "BF16" : "U32");
            assert_memory_equal(t->data + offs[k], src, nb);
        }
    }
    /* norms already had 1 added: stored as they are; conv [C, K, 1] -> [C, K] */
    const char *f32s[][2] = {{"layers.0.input_norm", "language_model.model.layers.0.input_layernorm.weight"},
                             {"layers.3.attn.k_norm", "language_model.model.layers.3.self_attn.k_norm.weight"},
                             {"final_norm", "language_model.model.norm.weight"},
                             {"layers.0.gdn.conv", "language_model.model.layers.0.linear_attn.conv1d.weight"},
                             {"layers.0.gdn.norm", "language_model.model.layers.0.linear_attn.norm.weight"}};
    for (size_t i = 0; i < sizeof f32s / sizeof f32s[0]; i++) {
        const splash_tensor *t = splash_package_find(pkg, f32s[i][0]);
        size_t nb;
        const uint8_t *src = fx_tensor(&f, f32s[i][1], &nb, NULL);
        assert_int_equal(t->dtype, SPLASH_F32);
        for (size_t k = 0; k < nb / 2; k++) {
            uint16_t h;
            memcpy(&h, src + 2 * k, 2);
            assert_true(((const float *)t->data)[k] == splash_bf16_to_f32(h));
        }
    }
    assert_int_equal(splash_package_find(pkg, "layers.0.gdn.out_proj")->dtype, SPLASH_BF16);
    assert_int_equal(json_get_bool(json_get(splash_package_manifest(pkg), "source"), "mlx", 0), 1);
    splash_package_close(pkg);

    /* bf16: dequantised, scale * q + bias rounded to bf16 */
    pkg = pack_open("dense-tiny-mlx", out, SPLASH_BF16);
    const splash_tensor *t = splash_package_find(pkg, "layers.2.ffn.down");
    assert_int_equal(t->dtype, SPLASH_BF16);
    size_t nq, ns, nbias;
    const uint8_t *q = fx_tensor(&f, "language_model.model.layers.2.mlp.down_proj.weight", &nq, NULL);
    const uint8_t *sc = fx_tensor(&f, "language_model.model.layers.2.mlp.down_proj.scales", &ns, NULL);
    const uint8_t *bi = fx_tensor(&f, "language_model.model.layers.2.mlp.down_proj.biases", &nbias, NULL);
    for (int64_t r = 0; r < 128; r++)
        for (int64_t c = 0; c < 192; c++) {
            uint32_t word;
            memcpy(&word, q + 4 * (size_t)(r * 24 + c / 8), 4);
            unsigned code = (word >> (4 * (c % 8))) & 15;
            uint16_t sh, bh, got;
            memcpy(&sh, sc + 2 * (size_t)(r * 3 + c / 64), 2);
            memcpy(&bh, bi + 2 * (size_t)(r * 3 + c / 64), 2);
            memcpy(&got, t->data + 2 * (size_t)(r * 192 + c), 2);
            float want = splash_bf16_to_f32(sh) * (float)code + splash_bf16_to_f32(bh);
            assert_int_equal(got, splash_f32_to_bf16(want));
        }
    splash_package_close(pkg);
    /* q8: re-encoded from the dequantised values: close to them */
    pkg = pack_open("dense-tiny-mlx", out, SPLASH_Q8);
    assert_int_equal(splash_package_find(pkg, "layers.2.ffn.down")->dtype, SPLASH_Q8);
    splash_package_close(pkg);
    fx_close(&f);
    splash_remove_tree(base);
    free(base);
    free(out);
}

/* MLX's rule, written independently of quantize.c: scale = bf16((max-min)/levels),
 * bias = bf16(min), q = clamp(round((w - bias) / scale)); codes packed into
 * little-endian uint32 words, element j of a word at bits j*bits. */
static void mlx_quant(int bits, const uint8_t *bf16, int64_t rows, int64_t cols, uint8_t *codes, uint8_t *scales,
                      uint8_t *biases) {
    int levels = (1 << bits) - 1;
    memset(codes, 0, (size_t)(rows * cols * bits / 8));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < cols / 64; g++) {
            float w[64], lo = INFINITY, hi = -INFINITY;
            for (int j = 0; j < 64; j++) {
                uint16_t h;
                memcpy(&h, bf16 + 2 * (size_t)(r * cols + g * 64 + j), 2);
                w[j] = splash_bf16_to_f32(h);
                lo = fminf(lo, w[j]), hi = fmaxf(hi, w[j]);
            }
            uint16_t sh = splash_f32_to_bf16((hi - lo) / (float)levels), bh = splash_f32_to_bf16(lo);
            float sc = splash_bf16_to_f32(sh), bi = splash_bf16_to_f32(bh);
            memcpy(scales + 2 * (size_t)(r * (cols / 64) + g), &sh, 2);
            memcpy(biases + 2 * (size_t)(r * (cols / 64) + g), &bh, 2);
            for (int j = 0; j < 64; j++) {
                long q = sc > 0 ? lrintf((w[j] - bi) / sc) : 0;
                q = q < 0 ? 0 : q > levels ? levels : q;
                int64_t c = g * 64 + j, bit = (r * cols + c) * bits;
                uint32_t word;
                memcpy(&word, codes + bit / 32 * 4, 4);
                word |= (uint32_t)q << (bit % 32);
                memcpy(codes + bit / 32 * 4, &word, 4);
            }
        }
}

static entry *ck_new(ckpt *c, const char *name, const char *dtype, int ndim, const int64_t *shape, size_t bytes) {
    entry *e = &c->e[c->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->dtype = dtype;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->bytes = bytes;
    e->data = calloc(1, bytes ? bytes : 1);
    return e;
}

/* An MLX-quantised (quant) or plain bf16 copy of a float entry. */
static void ck_add_maybe_quant(ckpt *c, const char *name, int ndim, const int64_t *shape, const uint8_t *bf16, int bits) {
    if (!bits) {
        entry *e = ck_new(c, name, "BF16", ndim, shape, 0);
        size_t n = 1;
        for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
        free(e->data);
        e->bytes = 2 * n;
        e->data = malloc(e->bytes);
        memcpy(e->data, bf16, e->bytes);
        return;
    }
    int64_t cols = shape[ndim - 1], rows = 1;
    for (int i = 0; i < ndim - 1; i++) rows *= shape[i];
    int64_t ws[3], ss[3];
    memcpy(ws, shape, sizeof(int64_t) * (size_t)ndim);
    memcpy(ss, shape, sizeof(int64_t) * (size_t)ndim);
    ws[ndim - 1] = cols * bits / 32;
    ss[ndim - 1] = cols / 64;
    char base[128], n2[160];
    snprintf(base, sizeof base, "%.*s", (int)(strlen(name) - strlen("weight")), name);
    entry *w = ck_new(c, name, "U32", ndim, ws, (size_t)(rows * cols * bits / 8));
    snprintf(n2, sizeof n2, "%sscales", base);
    entry *sc = ck_new(c, n2, "BF16", ndim, ss, (size_t)(rows * cols / 64 * 2));
    snprintf(n2, sizeof n2, "%sbiases", base);
    entry *bi = ck_new(c, n2, "BF16", ndim, ss, (size_t)(rows * cols / 64 * 2));
    mlx_quant(bits, bf16, rows, cols, w->data, sc->data, bi->data);
}

/* moe-tiny rewritten with mlx-lm's stacked experts (switch_mlp), either in
 * bf16 or MLX-quantised (experts 4-bit, router and shared-expert gate 8-bit). */
static void make_switch_mlp(const char *dir, int quant) {
    fx f;
    assert_int_equal(fx_open(&f, "moe-tiny"), 0);
    ckpt *c = calloc(1, sizeof *c);
    const int64_t E = 8, Ie = 64, Hd = 128;
    for (size_t i = 0; i < f.hdr->count; i++) {
        const char *name = f.hdr->keys[i];
        if (!strcmp(name, "__metadata__") || strstr(name, ".mlp.experts.")) continue;
        const json_value *sh = json_get(f.hdr->items[i], "shape");
        int64_t shape[3];
        for (size_t d = 0; d < sh->count; d++) json_int64(sh->items[d], &shape[d]);
        size_t nb;
        const uint8_t *src = fx_tensor(&f, name, &nb, NULL);
        int bits = quant && (strstr(name, "mlp.gate.weight") || strstr(name, "shared_expert_gate.weight")) ? 8 : 0;
        ck_add_maybe_quant(c, name, (int)sh->count, shape, src, bits);
    }
    for (int L = 0; L < 8; L++) {
        const char *which[3] = {"gate", "up", "down"};
        for (int w = 0; w < 3; w++) {
            int64_t shape[3] = {E, w == 2 ? Hd : Ie, w == 2 ? Ie : Hd};
            size_t one = (size_t)(Ie * Hd * 2);
            uint8_t *stack = malloc((size_t)E * one);
            for (int e = 0; e < E; e++) {
                char n[160];
                snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.%s_proj.weight", L, e, which[w]);
                size_t nb;
                memcpy(stack + (size_t)e * one, fx_tensor(&f, n, &nb, NULL), one);
            }
            char n[160];
            snprintf(n, sizeof n, "model.layers.%d.mlp.switch_mlp.%s_proj.weight", L, which[w]);
            ck_add_maybe_quant(c, n, 3, shape, stack, quant ? 4 : 0);
            free(stack);
        }
    }
    fx_close(&f);
    mkdir(dir, 0755);
    char *p = join(dir, "model.safetensors");
    write_st(p, c);
    free(p);
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/moe-tiny/config.json", root());
    char *text;
    size_t len;
    splash_error err;
    assert_int_equal(splash_read_file(path, &text, &len, &err), 0);
    char jerr[128];
    json_value *cfg = json_parse(text, len, 64, jerr, sizeof jerr);
    free(text);
    if (quant) {
        json_value *q = json_new(JSON_OBJECT);
        json_obj_set(q, "group_size", json_new_int(64));
        json_obj_set(q, "bits", json_new_int(4));
        json_obj_set(cfg, "quantization", q);
    }
    strbuf sb;
    sb_init(&sb);
    json_write(&sb, cfg, JSON_PRETTY);
    p = join(dir, "config.json");
    write_text(p, sb_cstr(&sb));
    free(p);
    sb_free(&sb);
    json_free(cfg);
    ck_free(c);
    free(c);
}

static void test_mlx_switch_mlp(void **state) {
    (void)state;
    char *from = fixture_dir("moe-tiny");
    if (!from) skip();
    char *base = tmpdir();
    char *ref = join(base, "ref"), *ck = join(base, "ck"), *out = join(base, "out");
    splash_error err;
    /* bf16 switch_mlp: the same package as the per-expert checkpoint, byte for byte */
    make_switch_mlp(ck, 0);
    for (int k = 0; k < 2; k++) {
        splash_dtype wt = k ? SPLASH_Q4 : SPLASH_BF16;
        if (pack(from, ref, wt, &err)) fail_msg("%s", err.msg);
        if (pack(ck, out, wt, &err)) fail_msg("%s", err.msg);
        splash_package *a, *b;
        assert_int_equal(splash_package_open(ref, &a, &err), 0);
        assert_int_equal(splash_package_open(out, &b, &err), 0);
        assert_int_equal(splash_package_tensor_count(a), splash_package_tensor_count(b));
        for (size_t i = 0; i < splash_package_tensor_count(a); i++) {
            const splash_tensor *x = splash_package_tensor_at(a, i), *y = splash_package_find(b, x->name);
            assert_non_null(y);
            assert_int_equal(x->bytes, y->bytes);
            if (memcmp(x->data, y->data, x->bytes)) fail_msg("%s differs", x->name);
        }
        assert_string_equal(json_get_string(json_get(splash_package_manifest(b), "source"), "expert_form", ""), "mlx");
        splash_package_close(a);
        splash_package_close(b);
    }
    splash_remove_tree(ck);
    /* MLX-quantised: q4 copies the expert codes and keeps the 8-bit router as q8 */
    make_switch_mlp(ck, 1);
    if (pack(ck, out, SPLASH_Q4, &err)) fail_msg("%s", err.msg);
    splash_package *pkg;
    assert_int_equal(splash_package_open(out, &pkg, &err), 0);
    fx g; /* the checkpoint just written, read back by the hand parser */
    char *data;
    size_t len;
    char *sp = join(ck, "model.safetensors");
    assert_int_equal(splash_read_file(sp, &data, &len, &err), 0);
    free(sp);
    memset(&g, 0, sizeof g);
    g.data = data;
    g.len = len;
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--) hn = hn << 8 | (uint8_t)data[i];
    char jerr[128];
    g.hdr = json_parse(data + 8, (size_t)hn, 16, jerr, sizeof jerr);
    g.base = (const uint8_t *)data + 8 + hn;
    const splash_tensor *t = splash_package_find(pkg, "layers.5.moe.experts_down");
    assert_int_equal(t->dtype, SPLASH_Q4);
    size_t nq, ns, nbias;
    const uint8_t *q = fx_tensor(&g, "model.layers.5.mlp.switch_mlp.down_proj.weight", &nq, NULL);
    const uint8_t *sc = fx_tensor(&g, "model.layers.5.mlp.switch_mlp.down_proj.scales", &ns, NULL);
    const uint8_t *bi = fx_tensor(&g, "model.layers.5.mlp.switch_mlp.down_proj.biases", &nbias, NULL);
    for (int e = 0; e < 8; e++) { /* each expert: codes, scales, biases at the layout's offsets */
        splash_tensor s = splash_tensor_slice(t, e);
        splash_qlayout l = splash_matrix_layout(SPLASH_Q4, 128, 64);
        assert_memory_equal(s.data + l.q_offset, q + (size_t)e * nq / 8, nq / 8);
        assert_memory_equal(s.data + l.scales_offset, sc + (size_t)e * ns / 8, ns / 8);
        assert_memory_equal(s.data + l.biases_offset, bi + (size_t)e * nbias / 8, nbias / 8);
    }
    t = splash_package_find(pkg, "layers.5.moe.router");
    assert_int_equal(t->dtype, SPLASH_Q8);
    q = fx_tensor(&g, "model.layers.5.mlp.gate.weight", &nq, NULL);
    assert_memory_equal(t->data, q, nq);
    assert_int_equal(splash_package_find(pkg, "layers.5.moe.shared_expert_gate")->dtype, SPLASH_Q8);
    assert_int_equal(splash_package_find(pkg, "layers.5.moe.shared_up")->dtype, SPLASH_Q4); /* bf16 in, quantised by us */
    splash_package_close(pkg);
    /* bf16: the router dequantised */
    if (pack(ck, out, SPLASH_BF16, &err)) fail_msg("%s", err.msg);
    assert_int_equal(splash_package_open(out, &pkg, &err), 0);
    t = splash_package_find(pkg, "layers.5.moe.router");
    assert_int_equal(t->dtype, SPLASH_BF16);
    sc = fx_tensor(&g, "model.layers.5.mlp.gate.scales", &ns, NULL);
    bi = fx_tensor(&g, "model.layers.5.mlp.gate.biases", &nbias, NULL);
    for (int64_t r = 0; r < 8; r++)
        for (int64_t col = 0; col < 128; col++) {
            uint16_t sh, bh, got;
            memcpy(&sh, sc + 2 * (size_t)(r * 2 + col / 64), 2);
            memcpy(&bh, bi + 2 * (size_t)(r * 2 + col / 64), 2);
            memcpy(&got, t->data + 2 * (size_t)(r * 128 + col), 2);
            float want = splash_bf16_to_f32(sh) * (float)q[r * 128 + col] + splash_bf16_to_f32(bh);
            assert_int_equal(got, splash_f32_to_bf16(want));
        }
    splash_package_close(pkg);
    fx_close(&g);
    splash_remove_tree(base);
    free(base), free(ref), free(ck), free(out), free(from);
}

/* A checkpoint split over two shards with an index, float32 and float16
 * tensors among them: the same package as the single bf16 file. */
static void test_pack_shards_and_dtypes(void **state) {
    (void)state;
    ckpt c;
    synth(&c);
    world w;
    world_make(&w, &c, CONFIG);
    splash_error err;
    if (pack(w.ck, w.out, SPLASH_Q4, &err)) fail_msg("%s", err.msg);
    char *ref = join(w.base, "ref");
    assert_int_equal(rename(w.out, ref), 0);
    /* lm_head as F32 (the bf16 values widened: same package), a norm as F16 (exact here) */
    entry *e = ck_find(&c, "lm_head.weight");
    uint8_t *f32 = malloc(e->bytes * 2);
    for (size_t i = 0; i < e->bytes / 2; i++) {
        float x = bf16_at(e, i);
        memcpy(f32 + 4 * i, &x, 4);
    }
    free(e->data);
    e->data = f32, e->bytes *= 2, e->dtype = "F32";
    e = ck_find(&c, "model.layers.1.self_attn.q_norm.weight");
    for (size_t i = 0; i < e->bytes / 2; i++) {
        uint16_t h = splash_f32_to_f16(bf16_at(e, i));
        assert_true(splash_f16_to_f32(h) == bf16_at(e, i)); /* 0.1-scale values: exact in f16 */
        memcpy(e->data + 2 * i, &h, 2);
    }
    e->dtype = "F16";
    ckpt a = {.n = 0}, b = {.n = 0};
    for (int i = 0; i < c.n; i++) (i % 2 ? &a : &b)->e[(i % 2 ? &a : &b)->n++] = c.e[i];
    char *p = join(w.ck, "model.safetensors");
    remove(p);
    free(p);
    p = join(w.ck, "model-00001-of-00002.safetensors");
    write_st(p, &a);
    free(p);
    p = join(w.ck, "model-00002-of-00002.safetensors");
    write_st(p, &b);
    free(p);
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    for (int i = 0; i < c.n; i++)
        sb_printf(&sb, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "", c.e[i].name, i % 2 ? 1 : 2);
    sb_puts(&sb, "}}");
    p = join(w.ck, "model.safetensors.index.json");
    write_text(p, sb_cstr(&sb));
    free(p);
    sb_free(&sb);
    if (pack(w.ck, w.out, SPLASH_Q4, &err)) fail_msg("%s", err.msg);
    /* every file of the two packages has the same hash */
    splash_package *x, *y;
    assert_int_equal(splash_package_open(ref, &x, &err), 0);
    assert_int_equal(splash_package_open(w.out, &y, &err), 0);
    const json_value *fx_ = json_get(splash_package_manifest(x), "files"), *fy = json_get(splash_package_manifest(y), "files");
    assert_int_equal(fx_->count, fy->count);
    for (size_t i = 0; i < fx_->count; i++)
        assert_string_equal(json_get_string(fx_->items[i], "sha256", "x"), json_get_string(fy->items[i], "sha256", "y"));
    splash_package_close(x);
    splash_package_close(y);
    free(ref);
    world_free(&w);
    ck_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layouts),
        cmocka_unit_test(test_half_conversions),
        cmocka_unit_test(test_quantize_q4),
        cmocka_unit_test(test_quantize_q8),
        cmocka_unit_test(test_safetensors_reader),
        cmocka_unit_test(test_pack_synthetic),
        cmocka_unit_test(test_pack_tokenizer_and_tokens),
        cmocka_unit_test(test_pack_errors),
        cmocka_unit_test(test_package_open_errors),
        cmocka_unit_test(test_fixture_dense),
        cmocka_unit_test(test_fixture_moe_forms),
        cmocka_unit_test(test_fixture_mlx),
        cmocka_unit_test(test_mlx_switch_mlp),
        cmocka_unit_test(test_pack_shards_and_dtypes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
