/* attention.c - gated attention's core over paged KV: write a layer's K and
 * V rows into the lanes' pages (quantising to the pool's format), and causal
 * softmax attention per (row, head) that reads every format.
 *
 * Page layout (cpu_kv_layout, docs/architecture.md "KV pages"): a page covers
 * page_tokens consecutive positions of one lane for every attention layer;
 * inside, layer by layer:
 *
 *   K values [kv_heads][page_tokens][head_dim]   f32 | bf16 | int8
 *   K scales [kv_heads][page_tokens]             fp32, int8 only
 *   V values [kv_heads][page_tokens][head_dim]
 *   V scales [kv_heads][page_tokens]             fp32, int8 only
 *
 * each part starting on a 64-byte boundary.  A head's positions are
 * contiguous so one query streams them.  int8 is symmetric with one scale per
 * (token, kv head): scale = max|x| / 127, q = rintf(x / scale) (nearest,
 * ties to even, as cvt.rni on CUDA) clamped to
 * [-127, 127] (all zero when max|x| = 0), x ~= q * scale.  bf16 rounds to
 * nearest even.
 *
 * Reading: a K or V row is widened to fp32 exactly (bf16 and int8 are exact
 * in fp32) and goes through the same cpu_dot / cpu_axpy as f32 pages; the
 * int8 scale multiplies the dot product (K) or the softmax weight (V) rather
 * than every element.  So each format has one fixed arithmetic, identical on
 * the scalar and AVX2 paths.
 *
 * Row r of a lane holds position n_past + r, in page pages[(n_past+r) /
 * page_tokens], and attends to positions [0, n_past + r].  Each (row, head)
 * is one task whose reductions run in position order, so results do not
 * depend on the batch.
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "base/status.h"
#include "package/tensor.h"
#include "runtime/model.h"

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

int cpu_kv_layout_init(cpu_kv_layout *l, int format, int n_layers, int kv_heads, int head_dim,
                       int page_tokens) {
    memset(l, 0, sizeof *l);
    size_t es;
    switch (format) {
    case SPLASH_KV_F32: es = 4; break;
    case SPLASH_KV_BF16: es = 2; break;
    case SPLASH_KV_INT8: es = 1; break;
    default: return SPLASH_E_UNSUPPORTED;
    }
    if (n_layers < 0 || kv_heads < 1 || page_tokens < 1 || head_dim < 1 || head_dim > CPU_KV_MAX_HEAD_DIM)
        return SPLASH_E_INVALID;
    l->format = format;
    l->page_tokens = page_tokens;
    l->kv_heads = kv_heads;
    l->head_dim = head_dim;
    l->n_layers = n_layers;
    l->value_size = (int)es;
    size_t rows = (size_t)kv_heads * (size_t)page_tokens;
    size_t values = align64(rows * (size_t)head_dim * es);
    size_t scales = format == SPLASH_KV_INT8 ? align64(rows * sizeof(float)) : 0;
    l->k_off = 0;
    l->ks_off = values;
    l->v_off = values + scales;
    l->vs_off = l->v_off + values;
    l->layer_bytes = 2 * (values + scales);
    l->page_bytes = (size_t)n_layers * l->layer_bytes;
    return 0;
}

/* ---- the two arithmetic-free conversions and the quantiser, scalar and
 * AVX2: the same operations element by element (IEEE division, rintf = the
 * vector round-to-nearest-even, min/max with the NaN-takes-the-bound order),
 * so both paths store and read the same bits. */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

__attribute__((target("avx2,fma"))) static void widen_bf16_avx(const uint16_t *s, float *d, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(s + i)));
        _mm256_storeu_ps(d + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < n; i++) d[i] = splash_bf16_to_f32(s[i]);
}

__attribute__((target("avx2,fma"))) static void widen_i8_avx(const int8_t *s, float *d, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(s + i)))));
    for (; i < n; i++) d[i] = (float)s[i];
}

__attribute__((target("avx2,fma"))) static float amax_avx(const float *x, int n) {
    __m256 m = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    float l[8], a = 0.0f;
    _mm256_storeu_ps(l, m);
    for (int k = 0; k < 8; k++) a = fmaxf(a, l[k]);
    for (; i < n; i++) a = fmaxf(a, fabsf(x[i]));
    return a;
}

__attribute__((target("avx2,fma"))) static int quant_avx(const float *x, int n, float s, int8_t *q) {
    __m256 vs = _mm256_set1_ps(s), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 r = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm256_max_ps(_mm256_min_ps(r, hi), lo);
        __m256i w = _mm256_cvtps_epi32(r);
        __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        _mm_storel_epi64((__m128i *)(void *)(q + i), _mm_packs_epi16(p16, p16));
    }
    return i;
}
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

static void widen_bf16(const uint16_t *s, float *d, int n) {
#if HAVE_X86
    if (cpu_simd()) {
        widen_bf16_avx(s, d, n);
        return;
    }
#endif
    for (int i = 0; i < n; i++) d[i] = splash_bf16_to_f32(s[i]);
}

static void widen_i8(const int8_t *s, float *d, int n) {
#if HAVE_X86
    if (cpu_simd()) {
        widen_i8_avx(s, d, n);
        return;
    }
#endif
    for (int i = 0; i < n; i++) d[i] = (float)s[i];
}

void cpu_kv_quant_int8(const float *x, int n, int8_t *q, float *scale) {
    float amax = 0.0f;
    int simd = HAVE_X86 && cpu_simd();
#if HAVE_X86
    if (simd) amax = amax_avx(x, n);
#endif
    if (!simd)
        for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    float s = amax / 127.0f;
    *scale = s;
    if (!(s > 0.0f)) {
        memset(q, 0, (size_t)n);
        return;
    }
    int i = 0;
#if HAVE_X86
    if (simd) i = quant_avx(x, n, s, q);
#endif
    for (; i < n; i++) {
        float r = rintf(x[i] / s);
        r = r < 127.0f ? r : 127.0f; /* NaN -> 127, as the vector min */
        r = r > -127.0f ? r : -127.0f;
        q[i] = (int8_t)r;
    }
}

/* Index of the (kv head h, position pos) row of a lane inside its page, and
 * the page's layer block. */
static inline uint8_t *layer_base(const cpu_kv_layout *l, uint8_t *pool, const int32_t *pages, int layer, int pos) {
    return pool + (size_t)pages[pos / l->page_tokens] * l->page_bytes + (size_t)layer * l->layer_bytes;
}

static inline size_t row_index(const cpu_kv_layout *l, int h, int pos) {
    return (size_t)h * l->page_tokens + (size_t)(pos % l->page_tokens);
}

/* Stores one head row x[head_dim] of K (v = 0) or V (v = 1). */
static void store_row(const cpu_kv_layout *l, uint8_t *base, int v, size_t ri, const float *x) {
    int hd = l->head_dim;
    uint8_t *vals = base + (v ? l->v_off : l->k_off);
    switch (l->format) {
    case SPLASH_KV_F32: memcpy((float *)(void *)vals + ri * hd, x, (size_t)hd * sizeof(float)); break;
    case SPLASH_KV_BF16: {
        uint16_t *d = (uint16_t *)(void *)vals + ri * hd;
        for (int i = 0; i < hd; i++) d[i] = splash_f32_to_bf16(x[i]);
        break;
    }
    default: {
        float *sc = (float *)(void *)(base + (v ? l->vs_off : l->ks_off));
        cpu_kv_quant_int8(x, hd, (int8_t *)vals + ri * hd, &sc[ri]);
        break;
    }
    }
}

/* Row of K or V as fp32: returns a pointer to the stored floats (f32) or
 * widens into tmp; *scale = the int8 row scale, 1 otherwise. */
static inline const float *load_row(const cpu_kv_layout *l, const uint8_t *base, int v, size_t ri, float *tmp,
                                    float *scale) {
    int hd = l->head_dim;
    const uint8_t *vals = base + (v ? l->v_off : l->k_off);
    *scale = 1.0f;
    switch (l->format) {
    case SPLASH_KV_F32: return (const float *)(const void *)vals + ri * hd;
    case SPLASH_KV_BF16: {
        widen_bf16((const uint16_t *)(const void *)vals + ri * hd, tmp, hd);
        return tmp;
    }
    default: {
        widen_i8((const int8_t *)vals + ri * hd, tmp, hd);
        *scale = ((const float *)(const void *)(base + (v ? l->vs_off : l->ks_off)))[ri];
        return tmp;
    }
    }
}

void cpu_kv_write(cpu_ctx *c, const cpu_kv_layout *l, uint8_t *pool, int layer, const cpu_attn_lane *lanes,
                  int n_lanes, const float *k, size_t ldk, const float *v, size_t ldv) {
    (void)c;
    for (int li = 0; li < n_lanes; li++) {
        const cpu_attn_lane *ln = &lanes[li];
        for (int r = 0; r < ln->n_rows; r++) {
            int row = ln->first_row + r, pos = ln->n_past + r;
            uint8_t *base = layer_base(l, pool, ln->pages, layer, pos);
            for (int h = 0; h < l->kv_heads; h++) {
                size_t ri = row_index(l, h, pos);
                store_row(l, base, 0, ri, k + (size_t)row * ldk + (size_t)h * l->head_dim);
                store_row(l, base, 1, ri, v + (size_t)row * ldv + (size_t)h * l->head_dim);
            }
        }
    }
}

typedef struct attn_job {
    const cpu_kv_layout *l;
    uint8_t *pool;
    int layer;
    const cpu_attn_lane *lanes;
    int n_lanes, n_heads;
    const float *q;
    size_t ldq;
    float *out;
    size_t ldo;
    float scale;
    float *scores;
    size_t scores_stride;
} attn_job;

/* scores s[t] = (q . K_t) * kscale_t * scale; softmax in position order;
 * o = sum_t fmaf((s[t] / sum) * vscale_t, V_t, o) in position order. */
static void attn_task(void *ctx, size_t task, int worker) {
    const attn_job *j = ctx;
    const cpu_kv_layout *l = j->l;
    int row = (int)(task / (size_t)j->n_heads), h = (int)(task % (size_t)j->n_heads);
    const cpu_attn_lane *ln = j->lanes;
    for (int li = 0; li < j->n_lanes; li++)
        if (row >= j->lanes[li].first_row && row < j->lanes[li].first_row + j->lanes[li].n_rows) ln = &j->lanes[li];
    int hd = l->head_dim;
    int kvh = h / (j->n_heads / l->kv_heads);
    int n_pos = ln->n_past + (row - ln->first_row) + 1;
    const float *q = j->q + (size_t)row * j->ldq + (size_t)h * hd;
    float *s = j->scores + (size_t)worker * j->scores_stride;
    float tmp[CPU_KV_MAX_HEAD_DIM], sc;
    float mx = -INFINITY;
    for (int t = 0; t < n_pos; t++) {
        const float *kr = load_row(l, layer_base(l, j->pool, ln->pages, j->layer, t), 0, row_index(l, kvh, t), tmp, &sc);
        s[t] = l->format == SPLASH_KV_INT8 ? cpu_dot(q, kr, hd) * sc * j->scale : cpu_dot(q, kr, hd) * j->scale;
        if (s[t] > mx) mx = s[t];
    }
    float sum = 0.0f;
    for (int t = 0; t < n_pos; t++) {
        s[t] = expf(s[t] - mx);
        sum += s[t];
    }
    float *o = j->out + (size_t)row * j->ldo + (size_t)h * hd;
    memset(o, 0, (size_t)hd * sizeof *o);
    for (int t = 0; t < n_pos; t++) {
        const float *vr = load_row(l, layer_base(l, j->pool, ln->pages, j->layer, t), 1, row_index(l, kvh, t), tmp, &sc);
        cpu_axpy(l->format == SPLASH_KV_INT8 ? s[t] / sum * sc : s[t] / sum, vr, o, hd);
    }
}

void cpu_attention(cpu_ctx *c, const cpu_kv_layout *l, const uint8_t *pool, int layer,
                   const cpu_attn_lane *lanes, int n_lanes, int n_heads, const float *q, size_t ldq,
                   float *out, size_t ldo, float scale, float *scores, size_t scores_stride) {
    int n_rows = 0;
    for (int li = 0; li < n_lanes; li++) n_rows += lanes[li].n_rows;
    attn_job j = {l, (uint8_t *)pool, layer, lanes, n_lanes, n_heads, q, ldq, out, ldo, scale, scores, scores_stride};
    cpu_parallel(c, (size_t)n_rows * (size_t)n_heads, attn_task, &j);
}
