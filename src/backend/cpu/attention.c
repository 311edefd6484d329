/* attention.c - gated attention's core over paged KV: write a layer's K and
 * V rows into the lanes' pages, and causal softmax attention per (row, head).
 *
 * Page layout (cpu_kv_layout): a page covers page_tokens consecutive
 * positions of one lane for every attention layer; inside, layer by layer,
 * K then V, each [kv_heads][page_tokens][head_dim].  A head's positions are
 * contiguous so a query streams them; later formats keep the same order with
 * narrower values (bf16), or int8 values followed by a [kv_heads]
 * [page_tokens] fp32 scale array (one scale per token and head).
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
#include "runtime/model.h"

int cpu_kv_layout_init(cpu_kv_layout *l, int format, int n_layers, int kv_heads, int head_dim,
                       int page_tokens) {
    memset(l, 0, sizeof *l);
    if (format != SPLASH_KV_F32) return SPLASH_E_UNSUPPORTED;
    l->format = format;
    l->page_tokens = page_tokens;
    l->kv_heads = kv_heads;
    l->head_dim = head_dim;
    l->n_layers = n_layers;
    l->k_bytes = (size_t)kv_heads * (size_t)page_tokens * (size_t)head_dim * sizeof(float);
    l->layer_bytes = 2 * l->k_bytes;
    l->page_bytes = (size_t)n_layers * l->layer_bytes;
    return 0;
}

/* K (v = 0) or V (v = 1) of kv head h at position pos of a lane. */
static inline float *kv_at(const cpu_kv_layout *l, uint8_t *pool, const int32_t *pages, int layer, int v, int h,
                           int pos) {
    size_t page = (size_t)pages[pos / l->page_tokens];
    int t = pos % l->page_tokens;
    uint8_t *base = pool + page * l->page_bytes + (size_t)layer * l->layer_bytes + (v ? l->k_bytes : 0);
    return (float *)(void *)base + ((size_t)h * l->page_tokens + t) * l->head_dim;
}

void cpu_kv_write(cpu_ctx *c, const cpu_kv_layout *l, uint8_t *pool, int layer, const cpu_attn_lane *lanes,
                  int n_lanes, const float *k, size_t ldk, const float *v, size_t ldv) {
    (void)c;
    size_t hb = (size_t)l->head_dim * sizeof(float);
    for (int li = 0; li < n_lanes; li++) {
        const cpu_attn_lane *ln = &lanes[li];
        for (int r = 0; r < ln->n_rows; r++) {
            int row = ln->first_row + r, pos = ln->n_past + r;
            for (int h = 0; h < l->kv_heads; h++) {
                memcpy(kv_at(l, pool, ln->pages, layer, 0, h, pos), k + (size_t)row * ldk + (size_t)h * l->head_dim, hb);
                memcpy(kv_at(l, pool, ln->pages, layer, 1, h, pos), v + (size_t)row * ldv + (size_t)h * l->head_dim, hb);
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
    float mx = -INFINITY;
    for (int t = 0; t < n_pos; t++) {
        s[t] = cpu_dot(q, kv_at(l, j->pool, ln->pages, j->layer, 0, kvh, t), hd) * j->scale;
        if (s[t] > mx) mx = s[t];
    }
    float sum = 0.0f;
    for (int t = 0; t < n_pos; t++) {
        s[t] = expf(s[t] - mx);
        sum += s[t];
    }
    float *o = j->out + (size_t)row * j->ldo + (size_t)h * hd;
    memset(o, 0, (size_t)hd * sizeof *o);
    for (int t = 0; t < n_pos; t++) cpu_axpy(s[t] / sum, kv_at(l, j->pool, ln->pages, j->layer, 1, kvh, t), o, hd);
}

void cpu_attention(cpu_ctx *c, const cpu_kv_layout *l, const uint8_t *pool, int layer,
                   const cpu_attn_lane *lanes, int n_lanes, int n_heads, const float *q, size_t ldq,
                   float *out, size_t ldo, float scale, float *scores, size_t scores_stride) {
    int n_rows = 0;
    for (int li = 0; li < n_lanes; li++) n_rows += lanes[li].n_rows;
    attn_job j = {l, (uint8_t *)pool, layer, lanes, n_lanes, n_heads, q, ldq, out, ldo, scale, scores, scores_stride};
    cpu_parallel(c, (size_t)n_rows * (size_t)n_heads, attn_task, &j);
}
