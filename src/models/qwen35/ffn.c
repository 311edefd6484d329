/* ffn.c - the feed-forward half of a Qwen3.5 layer.
 *
 * Dense:  x += down(silu(gate x) * up x)    (gate and up in one pool run,
 *         down adding into the residual)
 * MoE:    p = softmax(router x) (fp32); the top_k experts, weights
 *         renormalised by their sum; out = sum over the chosen experts in
 *         ascending expert id of w_e * expert_e(x)  +  sigmoid(shared_gate x) *
 *         shared(x), accumulated in that order as transformers does.
 *
 * The MoE runs expert by expert: the rows routed to an expert are gathered
 * and go through its three matrices together (each expert's weights read once
 * per batch), then scattered back with their weights.  Experts are visited in
 * ascending id, so every row accumulates in the same order whatever else is
 * in the batch.
 */
#include <string.h>

#include "models/qwen35/qwen35.h"

typedef struct ffn_job {
    qwen35_fwd *f;
} ffn_job;

void qwen35_ffn_layer(qwen35_fwd *f, const qwen35_layer *L) {
    qwen35_model *m = f->m;
    size_t H = (size_t)m->d.hidden, I = (size_t)m->d.intermediate;
    cpu_matmul_swiglu(&m->cpu, L->gate, L->up, f->R, m->xn, H, m->ff1, I, m->ff2, I);
    cpu_matmul_add(&m->cpu, L->down, f->R, m->ff1, I, m->x, H);
}

/* softmax, top-k, renormalisation; the choice sorted by expert id */
static void route_task(void *ctx, size_t r, int worker) {
    (void)worker;
    const ffn_job *j = ctx;
    qwen35_model *m = j->f->m;
    const qwen35_dims *d = &m->d;
    float *p = m->router + r * (size_t)d->experts;
    cpu_softmax(p, d->experts);
    int *idx = m->topk + r * (size_t)d->top_k;
    float *w = m->topw + r * (size_t)d->top_k;
    for (int k = 0; k < d->top_k; k++) { /* k-th largest; ties go to the lower id */
        int best = -1;
        for (int e = 0; e < d->experts; e++) {
            int taken = 0;
            for (int q = 0; q < k; q++) taken |= idx[q] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        idx[k] = best;
        w[k] = p[best];
    }
    if (d->norm_topk) {
        float sum = 0.0f;
        for (int k = 0; k < d->top_k; k++) sum += w[k];
        for (int k = 0; k < d->top_k; k++) w[k] /= sum;
    }
    for (int a = 1; a < d->top_k; a++) /* insertion sort by expert id */
        for (int b = a; b > 0 && idx[b - 1] > idx[b]; b--) {
            int ti = idx[b];
            idx[b] = idx[b - 1], idx[b - 1] = ti;
            float tw = w[b];
            w[b] = w[b - 1], w[b - 1] = tw;
        }
}

/* out += sigmoid(shared gate) * shared; then x += out */
static void shared_add_task(void *ctx, size_t r, int worker) {
    (void)worker;
    const ffn_job *j = ctx;
    qwen35_model *m = j->f->m;
    size_t H = (size_t)m->d.hidden;
    float s = cpu_sigmoid(m->sgate[r]);
    float *fo = m->fo + r * H, *x = m->x + r * H;
    const float *mo = m->mo + r * H;
    for (size_t i = 0; i < H; i++) {
        fo[i] = fo[i] + s * mo[i];
        x[i] = fo[i] + x[i];
    }
}

void qwen35_moe_layer(qwen35_fwd *f, const qwen35_layer *L) {
    qwen35_model *m = f->m;
    const qwen35_dims *d = &m->d;
    int R = f->R;
    size_t H = (size_t)d->hidden, Ie = (size_t)d->expert_inter, Is = (size_t)d->shared_inter;
    cpu_mm_part rp[2] = {{L->router, m->router, (size_t)d->experts, 0}, {L->shared_expert_gate, m->sgate, 1, 0}};
    cpu_matmul_parts(&m->cpu, rp, 2, R, m->xn, H);
    ffn_job j = {f};
    qwen35_rows(m, R, route_task, &j);
    memset(m->fo, 0, (size_t)R * H * sizeof(float));
    for (int e = 0; e < d->experts; e++) {
        int n = 0;
        for (int r = 0; r < R; r++)
            for (int k = 0; k < d->top_k; k++)
                if (m->topk[(size_t)r * d->top_k + k] == e) {
                    m->erows[n] = r;
                    m->erw[n++] = m->topw[(size_t)r * d->top_k + k];
                }
        if (!n) continue;
        for (int i = 0; i < n; i++) memcpy(m->mx + (size_t)i * H, m->xn + (size_t)m->erows[i] * H, H * sizeof(float));
        splash_tensor gate = splash_tensor_slice(L->experts_gate, e);
        splash_tensor up = splash_tensor_slice(L->experts_up, e);
        splash_tensor down = splash_tensor_slice(L->experts_down, e);
        cpu_matmul_swiglu(&m->cpu, &gate, &up, n, m->mx, H, m->ff1, Ie, m->ff2, Ie);
        cpu_matmul(&m->cpu, &down, n, m->ff1, Ie, m->mo, H);
        for (int i = 0; i < n; i++) {
            float *fo = m->fo + (size_t)m->erows[i] * H, w = m->erw[i];
            const float *mo = m->mo + (size_t)i * H;
            for (size_t c = 0; c < H; c++) fo[c] = fo[c] + mo[c] * w;
        }
    }
    cpu_matmul_swiglu(&m->cpu, L->shared_gate, L->shared_up, R, m->xn, H, m->ff1, Is, m->ff2, Is);
    cpu_matmul(&m->cpu, L->shared_down, R, m->ff1, Is, m->mo, H);
    qwen35_rows(m, R, shared_add_task, &j);
}
