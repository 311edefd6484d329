/* attention.c - gated attention's core over paged KV: write a layer's K and
 * V rows into the lanes' pages (quantising to the pool's format), and causal
 * softmax attention over every format, tiled so that long prefills reuse
 * each block of K and V for many queries.
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
 * Reading: K and V are widened to fp32 exactly (bf16 and int8 are exact in
 * fp32) a block of positions at a time, and every format then runs the same
 * arithmetic (below, "attention"); the int8 scale multiplies the dot product
 * (K) or the softmax weight (V) rather than every element.  So each format
 * has one fixed arithmetic, identical on the scalar and AVX2 paths.
 *
 * Row r of a lane holds position n_past + r, in page pages[(n_past+r) /
 * page_tokens], and attends to positions [0, n_past + r].  A query's
 * reductions run in position order in blocks fixed by the positions alone,
 * so results do not depend on the batch.
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/exp.h"
#include "backend/cpu/reduce.h"
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

/* ---- attention ----------------------------------------------------------------
 *
 * The arithmetic of one query (row r, head h, kv head g, n = n_past + r + 1
 * positions, scale σ), whatever the batch: positions go in blocks B, the
 * page-aligned runs of blk positions (32 for head_dim <= 256; in general
 * min(32, ATT_BUF / head_dim) rounded down to a multiple of 8, or
 * page_tokens if smaller: a constant of the layout), in order, with the
 * online softmax:
 *
 *   s_t  = (d_t * kσ_t) * σ  (int8; d_t * σ otherwise), where d_t is one
 *          fmaf chain over the head dims in order: d = fmaf(q_c, K_t,c, d)
 *   m'   = max(m, max_B s_t)           (m = -inf before the first block)
 *   α    = exp(m - m');  e_t = exp(s_t - m')       (att_exp below)
 *   l    = fmaf(l, α, hsum8(lanes))    (lane k: e_{b0+k}, e_{b0+8+k}, ... in order)
 *   o    = o * α  (skipped when α == 1: the same bits), then in position
 *          order o = fmaf(w_t, V_t, o) with w_t = e_t * vσ_t (int8) or e_t
 *   out  = o / l
 *
 * A task is a tile of up to ATT_TILE queries of one lane and one kv head
 * (rows x the heads that share it).  Each block of K is widened to fp32 and
 * transposed ([dim][position]) once per tile, so a query's scores come 8
 * positions to a vector with no horizontal sums; each block of V is widened
 * once per tile and a query's output row stays in registers across it.
 * Which queries share a tile changes nothing in any query's arithmetic, so
 * results do not depend on the batch, the tile or the thread count.  att_exp
 * is exp.h's polynomial (about 1 ulp), the same bits on the scalar and AVX2
 * paths. */

#define ATT_TILE 64    /* queries per task at most */
#define ATT_BUF (CPU_ATT_SCRATCH / 3) /* floats of one widened K (and V) block */
#define ATT_MAX_BLK 32 /* positions per block at most */

static inline float att_exp(float x) { return cpu_exp_poly(x); }

/* Scalar path: scores of one query over n positions of a transposed block
 * (Kt[c * ldt + t]); returns their max. */
static float scores_scalar(const float *q, const float *Kt, size_t ldt, int n, int hd, const float *ksc, float scale,
                           float *s) {
    float m = -INFINITY;
    for (int t = 0; t < n; t++) {
        float d = 0.0f;
        for (int c = 0; c < hd; c++) d = fmaf(q[c], Kt[(size_t)c * ldt + t], d);
        s[t] = ksc ? d * ksc[t] * scale : d * scale;
        m = s[t] > m ? s[t] : m;
    }
    return m;
}

static float exp_block_scalar(const float *s, int n, float m, const float *vsc, float *w) {
    float lanes[8] = {0};
    for (int t = 0; t < n; t++) {
        float e = att_exp(s[t] - m);
        lanes[t & 7] += e;
        w[t] = vsc ? e * vsc[t] : e;
    }
    float t0 = lanes[0] + lanes[4], t1 = lanes[1] + lanes[5], t2 = lanes[2] + lanes[6], t3 = lanes[3] + lanes[7];
    return (t0 + t2) + (t1 + t3);
}

#if HAVE_X86
#define AVXF AVX

AVXF static inline __m256 att_exp_avx(__m256 x) { return cpu_exp_poly_avx(x); }

/* Kt[c * ldt + t] = K[t * hd + c] for t < n8 (a multiple of 8; rows past the
 * block's are whatever K holds there), 8 x 8 at a time, the last hd % 8
 * dims one by one. */
AVXF static void transpose_avx(const float *K, int n8, int hd, float *Kt, size_t ldt) {
    int c = 0;
    for (; c + 8 <= hd; c += 8)
        for (int t = 0; t < n8; t += 8) {
            const float *r = K + (size_t)t * hd + c;
            __m256 r0 = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(r)), _mm_loadu_ps(r + 4 * (size_t)hd), 1);
            __m256 r1 = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(r + (size_t)hd)), _mm_loadu_ps(r + 5 * (size_t)hd), 1);
            __m256 r2 = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(r + 2 * (size_t)hd)), _mm_loadu_ps(r + 6 * (size_t)hd), 1);
            __m256 r3 = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(r + 3 * (size_t)hd)), _mm_loadu_ps(r + 7 * (size_t)hd), 1);
            __m256 r4 = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(r + 4)), _mm_loadu_ps(r + 4 * (size_t)hd + 4), 1);
            __m256 r5 = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(r + (size_t)hd + 4)), _mm_loadu_ps(r + 5 * (size_t)hd + 4), 1);
            __m256 r6 = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(r + 2 * (size_t)hd + 4)), _mm_loadu_ps(r + 6 * (size_t)hd + 4), 1);
            __m256 r7 = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(r + 3 * (size_t)hd + 4)), _mm_loadu_ps(r + 7 * (size_t)hd + 4), 1);
            /* r0..r3: columns c..c+3 of keys (0|4), (1|5), (2|6), (3|7); r4..r7: columns c+4..c+7 */
            __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
            __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
            __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
            __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
            float *o = Kt + (size_t)c * ldt + t;
            _mm256_storeu_ps(o, _mm256_shuffle_ps(t0, t2, 0x44));
            _mm256_storeu_ps(o + ldt, _mm256_shuffle_ps(t0, t2, 0xEE));
            _mm256_storeu_ps(o + 2 * ldt, _mm256_shuffle_ps(t1, t3, 0x44));
            _mm256_storeu_ps(o + 3 * ldt, _mm256_shuffle_ps(t1, t3, 0xEE));
            _mm256_storeu_ps(o + 4 * ldt, _mm256_shuffle_ps(t4, t6, 0x44));
            _mm256_storeu_ps(o + 5 * ldt, _mm256_shuffle_ps(t4, t6, 0xEE));
            _mm256_storeu_ps(o + 6 * ldt, _mm256_shuffle_ps(t5, t7, 0x44));
            _mm256_storeu_ps(o + 7 * ldt, _mm256_shuffle_ps(t5, t7, 0xEE));
        }
    for (; c < hd; c++)
        for (int t = 0; t < n8; t++) Kt[(size_t)c * ldt + t] = K[(size_t)t * hd + c];
}

/* The same from int8 rows, widening: bytes transposed 8 x 8 by unpacks,
 * then each dim's 8 positions converted at once. */
AVXF static void transpose_i8_avx(const int8_t *K, int n8, int hd, float *Kt, size_t ldt) {
    int c = 0;
    for (; c + 8 <= hd; c += 8)
        for (int t = 0; t < n8; t += 8) {
            const int8_t *r = K + (size_t)t * hd + c;
            __m128i x[8];
            for (int i = 0; i < 8; i++) x[i] = _mm_loadl_epi64((const __m128i *)(const void *)(r + (size_t)i * hd));
            __m128i a0 = _mm_unpacklo_epi8(x[0], x[1]), a1 = _mm_unpacklo_epi8(x[2], x[3]);
            __m128i a2 = _mm_unpacklo_epi8(x[4], x[5]), a3 = _mm_unpacklo_epi8(x[6], x[7]);
            __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1); /* positions 0-3: dims 0-3, 4-7 */
            __m128i b2 = _mm_unpacklo_epi16(a2, a3), b3 = _mm_unpackhi_epi16(a2, a3); /* positions 4-7 */
            __m128i d[4] = {_mm_unpacklo_epi32(b0, b2), _mm_unpackhi_epi32(b0, b2), _mm_unpacklo_epi32(b1, b3),
                            _mm_unpackhi_epi32(b1, b3)}; /* dims (0,1), (2,3), (4,5), (6,7): 8 positions each */
            float *o = Kt + (size_t)c * ldt + t;
            for (int i = 0; i < 4; i++) {
                _mm256_storeu_ps(o + (size_t)(2 * i) * ldt, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(d[i])));
                _mm256_storeu_ps(o + (size_t)(2 * i + 1) * ldt,
                                 _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(d[i], d[i]))));
            }
        }
    for (; c < hd; c++)
        for (int t = 0; t < n8; t++) Kt[(size_t)c * ldt + t] = (float)K[(size_t)t * hd + c];
}

/* scores_scalar's bits, 8 positions to a vector: up to four vectors of
 * positions at once (independent chains), each an fma chain over the dims. */
AVXF static float scores_avx(const float *q, const float *Kt, size_t ldt, int n, int hd, const float *ksc, float scale,
                             float *s) {
    __m256 vs = _mm256_set1_ps(scale), mx = _mm256_set1_ps(-INFINITY);
    int t = 0;
    for (; t < n; t += 32) {
        int nv = (n - t + 7) / 8;
        nv = nv > 4 ? 4 : nv;
        __m256 d0 = _mm256_setzero_ps(), d1 = d0, d2 = d0, d3 = d0;
        const float *k = Kt + t;
        if (nv == 4)
            for (int c = 0; c < hd; c++, k += ldt) {
                __m256 qc = _mm256_broadcast_ss(q + c);
                d0 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k), d0);
                d1 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k + 8), d1);
                d2 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k + 16), d2);
                d3 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k + 24), d3);
            }
        else if (nv == 3)
            for (int c = 0; c < hd; c++, k += ldt) {
                __m256 qc = _mm256_broadcast_ss(q + c);
                d0 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k), d0);
                d1 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k + 8), d1);
                d2 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k + 16), d2);
            }
        else if (nv == 2)
            for (int c = 0; c < hd; c++, k += ldt) {
                __m256 qc = _mm256_broadcast_ss(q + c);
                d0 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k), d0);
                d1 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k + 8), d1);
            }
        else
            for (int c = 0; c < hd; c++, k += ldt) d0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + c), _mm256_loadu_ps(k), d0);
        __m256 d[4] = {d0, d1, d2, d3};
        for (int v = 0; v < nv; v++) {
            int t8 = t + 8 * v, m8 = n - t8 < 8 ? n - t8 : 8;
            __m256 x = d[v];
            if (m8 == 8) {
                if (ksc) x = _mm256_mul_ps(x, _mm256_loadu_ps(ksc + t8));
                x = _mm256_mul_ps(x, vs);
                _mm256_storeu_ps(s + t8, x);
                mx = _mm256_max_ps(mx, x);
            } else {
                float tmp[8];
                _mm256_storeu_ps(tmp, x);
                for (int i = 0; i < m8; i++) {
                    s[t8 + i] = ksc ? tmp[i] * ksc[t8 + i] * scale : tmp[i] * scale;
                    mx = _mm256_max_ps(mx, _mm256_set1_ps(s[t8 + i]));
                }
            }
        }
    }
    float m8[8], m = -INFINITY;
    _mm256_storeu_ps(m8, mx);
    for (int i = 0; i < 8; i++) m = m8[i] > m ? m8[i] : m;
    return m;
}

AVXF static float exp_block_avx(const float *s, int n, float m, const float *vsc, float *w) {
    __m256 vm = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
    int t = 0;
    for (; t + 8 <= n; t += 8) {
        __m256 x = att_exp_avx(_mm256_sub_ps(_mm256_loadu_ps(s + t), vm));
        acc = _mm256_add_ps(acc, x);
        _mm256_storeu_ps(w + t, vsc ? _mm256_mul_ps(x, _mm256_loadu_ps(vsc + t)) : x);
    }
    if (t < n) {
        float tail[8] = {0}, wt[8];
        for (int k = 0; t + k < n; k++) tail[k] = s[t + k];
        __m256 keep = _mm256_cmp_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_ps((float)(n - t)), _CMP_LT_OQ);
        __m256 x = _mm256_and_ps(keep, att_exp_avx(_mm256_sub_ps(_mm256_loadu_ps(tail), vm)));
        acc = _mm256_add_ps(acc, x); /* + 0 in the lanes past n: the same sums */
        _mm256_storeu_ps(wt, x);
        for (int k = 0; t + k < n; k++) w[t + k] = vsc ? wt[k] * vsc[t + k] : wt[k];
    }
    return hsum8_avx(acc);
}

/* The running denominator after a block: α = att_exp(m_old - m), l =
 * fmaf(l, α, bsum); returns α (the scalar path's bits, without libm's fmaf
 * call). */
AVXF static float rescale_avx(float m_old, float m, float bsum, float *l) {
    float alpha = _mm256_cvtss_f32(att_exp_avx(_mm256_set1_ps(m_old - m)));
    *l = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(*l), _mm_set_ss(alpha), _mm_set_ss(bsum)));
    return alpha;
}
/* A whole block of 32 positions in registers: scores_avx, exp_block_avx
 * and rescale_avx's operations in their order (the same bits), with the
 * four exponentials interleaved and no round trip through memory.  Updates
 * *m and *l, writes the weights w[32]; returns α. */
AVXF static float full_block_avx(const float *q, const float *Kt, size_t ldt, int hd, const float *ksc,
                                 const float *vsc, float scale, float *m, float *l, float *w) {
    __m256 d0 = _mm256_setzero_ps(), d1 = d0, d2 = d0, d3 = d0;
    const float *k = Kt;
    for (int c = 0; c < hd; c++, k += ldt) {
        __m256 qc = _mm256_broadcast_ss(q + c);
        d0 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k), d0);
        d1 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k + 8), d1);
        d2 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k + 16), d2);
        d3 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k + 24), d3);
    }
    if (ksc) {
        d0 = _mm256_mul_ps(d0, _mm256_loadu_ps(ksc)), d1 = _mm256_mul_ps(d1, _mm256_loadu_ps(ksc + 8));
        d2 = _mm256_mul_ps(d2, _mm256_loadu_ps(ksc + 16)), d3 = _mm256_mul_ps(d3, _mm256_loadu_ps(ksc + 24));
    }
    __m256 vs = _mm256_set1_ps(scale);
    d0 = _mm256_mul_ps(d0, vs), d1 = _mm256_mul_ps(d1, vs), d2 = _mm256_mul_ps(d2, vs), d3 = _mm256_mul_ps(d3, vs);
    __m256 mx = _mm256_max_ps(_mm256_max_ps(d0, d1), _mm256_max_ps(d2, d3));
    float m8[8], bm = -INFINITY;
    _mm256_storeu_ps(m8, mx);
    for (int i = 0; i < 8; i++) bm = m8[i] > bm ? m8[i] : bm;
    float mn = *m > bm ? *m : bm;
    __m256 vm = _mm256_set1_ps(mn);
    __m256 e0 = att_exp_avx(_mm256_sub_ps(d0, vm)), e1 = att_exp_avx(_mm256_sub_ps(d1, vm));
    __m256 e2 = att_exp_avx(_mm256_sub_ps(d2, vm)), e3 = att_exp_avx(_mm256_sub_ps(d3, vm));
    float bsum = hsum8_avx(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_setzero_ps(), e0), e1), e2), e3));
    if (vsc) {
        e0 = _mm256_mul_ps(e0, _mm256_loadu_ps(vsc)), e1 = _mm256_mul_ps(e1, _mm256_loadu_ps(vsc + 8));
        e2 = _mm256_mul_ps(e2, _mm256_loadu_ps(vsc + 16)), e3 = _mm256_mul_ps(e3, _mm256_loadu_ps(vsc + 24));
    }
    _mm256_storeu_ps(w, e0), _mm256_storeu_ps(w + 8, e1), _mm256_storeu_ps(w + 16, e2), _mm256_storeu_ps(w + 24, e3);
    float alpha = rescale_avx(*m, mn, bsum, l);
    *m = mn;
    return alpha;
}

#endif

static void transpose_i8(const int8_t *K, int n8, int hd, float *Kt, size_t ldt) {
#if HAVE_X86
    if (cpu_simd()) {
        transpose_i8_avx(K, n8, hd, Kt, ldt);
        return;
    }
#endif
    for (int c = 0; c < hd; c++)
        for (int t = 0; t < n8; t++) Kt[(size_t)c * ldt + t] = (float)K[(size_t)t * hd + c];
}

static void transpose_block(const float *K, int n8, int hd, float *Kt, size_t ldt) {
#if HAVE_X86
    if (cpu_simd()) {
        transpose_avx(K, n8, hd, Kt, ldt);
        return;
    }
#endif
    for (int c = 0; c < hd; c++)
        for (int t = 0; t < n8; t++) Kt[(size_t)c * ldt + t] = K[(size_t)t * hd + c];
}

typedef struct attn_job {
    const cpu_kv_layout *l;
    const uint8_t *pool;
    int layer;
    const cpu_attn_lane *lanes;
    int n_lanes, n_heads, group, tile;
    const float *q;
    size_t ldq;
    float *out;
    size_t ldo;
    float scale;
    int simd, blk;
    float *scratch; /* the context's per-worker blocks */
} attn_job;

/* One block of K or V rows (positions [p0, p0 + n) of kv head g, inside one
 * page) as fp32 rows: the stored rows (f32) or widened into buf; the int8
 * scales into sc. */
static const float *block_rows(const attn_job *j, const uint8_t *base, int v, int g, int p0, int n, float *buf,
                               float *sc) {
    const cpu_kv_layout *l = j->l;
    int hd = l->head_dim;
    size_t ri = row_index(l, g, p0);
    const uint8_t *vals = base + (v ? l->v_off : l->k_off);
    switch (l->format) {
    case SPLASH_KV_F32: return (const float *)(const void *)vals + ri * hd;
    case SPLASH_KV_BF16: widen_bf16((const uint16_t *)(const void *)vals + ri * hd, buf, n * hd); return buf;
    default:
        widen_i8((const int8_t *)vals + ri * hd, buf, n * hd);
        memcpy(sc, (const float *)(const void *)(base + (v ? l->vs_off : l->ks_off)) + ri, (size_t)n * sizeof(float));
        return buf;
    }
}

/* K of a block, positions [p0, p0 + nb) of kv head g inside one page,
 * transposed into kt (ldt positions to a dim, zero past nb up to a multiple
 * of 8); the int8 scales into sc.  buf: room for the block's rows. */
static void block_kt(const attn_job *j, const uint8_t *base, int g, int p0, int nb, float *buf, float *kt, size_t ldt,
                     float *sc) {
    const cpu_kv_layout *l = j->l;
    int hd = l->head_dim, n8 = (nb + 7) & ~7;
    size_t ri = row_index(l, g, p0);
    const uint8_t *vals = base + l->k_off;
    if (l->format == SPLASH_KV_INT8) {
        memcpy(sc, (const float *)(const void *)(base + l->ks_off) + ri, (size_t)nb * sizeof(float));
        const int8_t *k8 = (const int8_t *)vals + ri * hd;
        if (n8 > nb) { /* padded with zero rows in buf */
            int8_t *b8 = (int8_t *)(void *)buf;
            memcpy(b8, k8, (size_t)nb * hd);
            memset(b8 + (size_t)nb * hd, 0, (size_t)(n8 - nb) * hd);
            k8 = b8;
        }
        transpose_i8(k8, n8, hd, kt, ldt);
        return;
    }
    const float *K;
    if (l->format == SPLASH_KV_BF16) {
        widen_bf16((const uint16_t *)(const void *)vals + ri * hd, buf, nb * hd);
        K = buf;
    } else if (n8 > nb) {
        memcpy(buf, (const float *)(const void *)vals + ri * hd, (size_t)nb * hd * sizeof(float));
        K = buf;
    } else {
        K = (const float *)(const void *)vals + ri * hd;
    }
    if (n8 > nb) memset(buf + (size_t)nb * hd, 0, (size_t)(n8 - nb) * hd * sizeof(float));
    transpose_block(K, n8, hd, kt, ldt);
}

/* per query of a tile: the running max and denominator, the output row */
typedef struct att_q {
    const float *q;
    float *o;
    int n_pos;
    float m, l;
} att_q;

static void attn_task(void *ctx, size_t task, int worker) {
    const attn_job *j = ctx;
    const cpu_kv_layout *l = j->l;
    /* task -> (lane, kv head, first query); a lane's queries go row by row,
     * the group's heads inside a row */
    const cpu_attn_lane *ln = j->lanes;
    int per_head = 0;
    size_t first = 0;
    for (int li = 0; li < j->n_lanes; li++) {
        ln = &j->lanes[li];
        per_head = (ln->n_rows * j->group + j->tile - 1) / j->tile; /* tiles per kv head */
        size_t n = (size_t)l->kv_heads * (size_t)per_head;
        if (task < first + n) break;
        first += n;
    }
    int local = (int)(task - first), g = local / per_head, i0 = (local % per_head) * j->tile;
    int nq = ln->n_rows * j->group - i0 < j->tile ? ln->n_rows * j->group - i0 : j->tile;
    int hd = l->head_dim, pt = l->page_tokens, blk = j->blk, int8 = l->format == SPLASH_KV_INT8;
    att_q qs[ATT_TILE];
    int n_max = 0;
    for (int k = 0; k < nq; k++) {
        int i = i0 + k, r = i / j->group, h = g * j->group + i % j->group, row = ln->first_row + r;
        qs[k] = (att_q){j->q + (size_t)row * j->ldq + (size_t)h * hd, j->out + (size_t)row * j->ldo + (size_t)h * hd,
                        ln->n_past + r + 1, -INFINITY, 0.0f};
        memset(qs[k].o, 0, (size_t)hd * sizeof(float));
        if (qs[k].n_pos > n_max) n_max = qs[k].n_pos;
    }
    /* kbuf: the widened K rows, padded with zero rows to a multiple of 8;
     * kt: K transposed, ldt positions to a dim */
    float *kbuf = j->scratch + (size_t)worker * CPU_ATT_SCRATCH, *kt = kbuf + ATT_BUF, *vbuf = kt + ATT_BUF;
    float ksc[ATT_MAX_BLK], vsc[ATT_MAX_BLK];
    float sk[ATT_MAX_BLK], wk[ATT_MAX_BLK]; /* one query's scores, then weights */
    int simd = HAVE_X86 && j->simd;
    (void)simd; /* only the AVX2 branches read it */
    size_t ldt = (size_t)((blk + 7) & ~7);
    for (int p0 = 0; p0 < n_max; p0 += blk) {
        /* the block: [p0, p0 + nb) inside page p0 / pt */
        int in_page = pt - p0 % pt, nb = n_max - p0 < blk ? n_max - p0 : blk;
        if (nb > in_page) nb = in_page;
        const uint8_t *base = j->pool + (size_t)ln->pages[p0 / pt] * l->page_bytes + (size_t)j->layer * l->layer_bytes;
        const float *V = block_rows(j, base, 1, g, p0, nb, vbuf, vsc);
        block_kt(j, base, g, p0, nb, kbuf, kt, ldt, ksc);
        for (int k = 0; k < nq; k++) {
            att_q *a = &qs[k];
            int n = a->n_pos - p0 < nb ? a->n_pos - p0 : nb; /* the positions it sees */
            if (n <= 0) continue;
            float bm, m, alpha, bsum;
#if HAVE_X86
            if (simd && n == 32) {
                alpha = full_block_avx(a->q, kt, ldt, hd, int8 ? ksc : NULL, int8 ? vsc : NULL, j->scale, &a->m, &a->l,
                                       wk);
            } else if (simd) {
                bm = scores_avx(a->q, kt, ldt, n, hd, int8 ? ksc : NULL, j->scale, sk);
                m = a->m > bm ? a->m : bm;
                bsum = exp_block_avx(sk, n, m, int8 ? vsc : NULL, wk);
                alpha = rescale_avx(a->m, m, bsum, &a->l);
                a->m = m;
            } else
#endif
            {
                bm = scores_scalar(a->q, kt, ldt, n, hd, int8 ? ksc : NULL, j->scale, sk);
                m = a->m > bm ? a->m : bm;
                bsum = exp_block_scalar(sk, n, m, int8 ? vsc : NULL, wk);
                alpha = att_exp(a->m - m);
                a->l = fmaf(a->l, alpha, bsum);
                a->m = m;
            }
            if (alpha != 1.0f)
                for (int c = 0; c < hd; c++) a->o[c] *= alpha;
            cpu_axpy_rows(wk, V, (size_t)hd, n, a->o, hd); /* the bits of n cpu_axpy calls */
        }
    }
    for (int k = 0; k < nq; k++)
        for (int c = 0; c < hd; c++) qs[k].o[c] /= qs[k].l;
}

void cpu_attention(cpu_ctx *c, const cpu_kv_layout *l, const uint8_t *pool, int layer,
                   const cpu_attn_lane *lanes, int n_lanes, int n_heads, const float *q, size_t ldq,
                   float *out, size_t ldo, float scale, float *scores, size_t scores_stride) {
    (void)scores, (void)scores_stride;
    int group = n_heads / l->kv_heads, n_q = 0;
    for (int li = 0; li < n_lanes; li++) n_q += lanes[li].n_rows * n_heads;
    /* tiles as large as the work allows while every thread gets some: the
     * tile size changes no result */
    int tile = n_q / (c->n_threads > 0 ? c->n_threads : 1);
    tile = tile < 1 ? 1 : tile > ATT_TILE ? ATT_TILE : tile;
    size_t n_tasks = 0;
    for (int li = 0; li < n_lanes; li++)
        n_tasks += (size_t)l->kv_heads * (size_t)((lanes[li].n_rows * group + tile - 1) / tile);
    /* a multiple of 8 (hd <= CPU_KV_MAX_HEAD_DIM = ATT_BUF / 8), or a whole
     * page when pages are shorter: blocks padded to 8 fit the buffers */
    int blk = ATT_BUF / l->head_dim;
    blk = blk > ATT_MAX_BLK ? ATT_MAX_BLK : blk >= 8 ? blk & ~7 : blk;
    blk = blk > l->page_tokens ? l->page_tokens : blk;
    attn_job j = {l, pool, layer, lanes, n_lanes, n_heads, group, tile, q, ldq, out, ldo, scale, cpu_simd(), blk, c->att};
    cpu_parallel(c, n_tasks, attn_task, &j);
}
