/* attn.c - a gated full-attention layer of Qwen3.5 over paged KV.
 *
 *   q|gate = q_proj(x) (per head [q_h | gate_h]),  k = k_proj(x),  v = v_proj(x)
 *   q = rope(rmsnorm(q) * q_norm),  k = rope(rmsnorm(k) * k_norm)
 *   K, V of row r -> the lane's page at position n_past + r
 *   o = softmax(q K^T / sqrt(hd)) V  (causal, GQA)  * sigmoid(gate)
 *   x += o_proj(o)                                   (the residual)
 *
 * Pool runs: q/k/v together, the attention, o_proj adding into the
 * residual; plus the norms/rotary and the gate when the batch has more than
 * one row (a single row runs them inline).
 */
#include <math.h>

#include "models/qwen35/qwen35.h"

typedef struct attn_job {
    qwen35_fwd *f;
    const qwen35_layer *L;
} attn_job;

/* q_norm / k_norm and rotary, one row */
static void prep_task(void *ctx, size_t r, int worker) {
    (void)worker;
    const attn_job *j = ctx;
    qwen35_model *m = j->f->m;
    const qwen35_dims *d = &m->d;
    int hd = d->head_dim;
    size_t qw = (size_t)d->heads * hd, kvw = (size_t)d->kv_heads * hd;
    const float *qg = m->qkv + r * 2 * qw;
    float *q = m->mix1 + r * qw, *k = m->mix2 + r * kvw;
    for (int h = 0; h < d->heads; h++) cpu_rmsnorm(qg + (size_t)h * 2 * hd, j->L->q_norm, hd, d->rms_eps, q + (size_t)h * hd);
    for (int h = 0; h < d->kv_heads; h++) cpu_rmsnorm(k + (size_t)h * hd, j->L->k_norm, hd, d->rms_eps, k + (size_t)h * hd);
    int32_t pos = j->f->b->rows[r].pos[0];
    if (d->rotary_dim) {
        cpu_rope(q, d->heads, hd, d->rotary_dim, d->rope_theta, pos);
        cpu_rope(k, d->kv_heads, hd, d->rotary_dim, d->rope_theta, pos);
    }
}

static void gate_task(void *ctx, size_t r, int worker) {
    (void)worker;
    const attn_job *j = ctx;
    qwen35_model *m = j->f->m;
    int hd = m->d.head_dim;
    size_t qw = (size_t)m->d.heads * hd;
    const float *qg = m->qkv + r * 2 * qw;
    float *o = m->mix4 + r * qw;
    for (int h = 0; h < m->d.heads; h++)
        for (int i = 0; i < hd; i++) o[(size_t)h * hd + i] *= cpu_sigmoid(qg[(size_t)h * 2 * hd + hd + i]);
}

void qwen35_attn_layer(qwen35_fwd *f, const qwen35_layer *L) {
    qwen35_model *m = f->m;
    const qwen35_dims *d = &m->d;
    int R = f->R, hd = d->head_dim;
    size_t H = (size_t)d->hidden, qw = (size_t)d->heads * hd, kvw = (size_t)d->kv_heads * hd;
    cpu_mm_part in[3] = {{L->q_proj, m->qkv, 2 * qw, 0}, {L->k_proj, m->mix2, kvw, 0}, {L->v_proj, m->mix3, kvw, 0}};
    cpu_matmul_parts(&m->cpu, in, 3, R, m->xn, H);
    attn_job j = {f, L};
    qwen35_rows(m, R, prep_task, &j);
    qwen35_prof(m, QWEN35_PROF_ATTN_PROJ);
    cpu_kv_write(&m->cpu, &m->kv, m->kv_pool, L->index, m->alanes, f->b->n_lanes, m->mix2, kvw, m->mix3, kvw);
    qwen35_prof(m, QWEN35_PROF_ATTN_KV);
    cpu_attention(&m->cpu, &m->kv, m->kv_pool, L->index, m->alanes, f->b->n_lanes, d->heads, m->mix1, qw, m->mix4, qw,
                  (float)pow((double)hd, -0.5), NULL, 0);
    qwen35_prof(m, QWEN35_PROF_ATTN_CORE);
    qwen35_rows(m, R, gate_task, &j);
    cpu_matmul_add(&m->cpu, L->o_proj, R, m->mix4, qw, m->x, H);
    qwen35_prof(m, QWEN35_PROF_ATTN_OUT);
}
