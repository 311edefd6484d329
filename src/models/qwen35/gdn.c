/* gdn.c - a Gated DeltaNet layer of Qwen3.5, its state in the lane's slot.
 *
 *   qkv = in_proj_qkv(x); z = in_proj_z(x); b = in_proj_b(x); a = in_proj_a(x)
 *   qkv = silu(causal_conv(qkv))           (conv state: last K-1 pre-conv rows)
 *   q, k = l2norm per key head; q *= dk^-0.5
 *   beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias)
 *   o = gated delta rule per value head j (key head j / (Hv/Hk))
 *   x += out_proj(rmsnorm_gated(o, z) per value head)     (the residual)
 *
 * Three pool runs per layer: the four input projections together; then one
 * task per (lane, key head) doing everything between the projections for
 * that head's channels (conv, l2 norms, g and beta, the delta rule of its
 * value heads, the gated norm); then out_proj adding into the residual.
 *
 * Lanes differ in what happens to the state:
 *   PREFILL: the recurrence, in place, one row after the other;
 *   VERIFY: the recurrence on a scratch copy of the state, each row seeing
 *     the rows before it; the rows' pre-conv inputs and k, v, g, beta are
 *     saved, and qwen35_gdn_commit replays the first n of them on the slot
 *     with the same recurrence code, so a committed row is bit-identical to
 *     a row run as PREFILL.
 * The CPU never runs the chunked algorithm (cpu_gdn_chunked, the CUDA
 * backend's reference): its sums depend on where a prefill call starts, so a
 * prefix restored from a snapshot would differ in the low bits from a cold
 * run, and a row's numbers would depend on how the engine sliced the prompt.
 * With the recurrence every row is computed the same way whatever the
 * slicing, and on the CPU it is not slower: on the default model (dk = dv =
 * 64) an 8K-token prefill spent 0.95 CPU-s in the GDN core against 1.19 s
 * chunked (NOTES.md). */
#include <math.h>
#include <string.h>

#include "models/qwen35/qwen35.h"

typedef struct gdn_job {
    qwen35_fwd *f;
    const qwen35_layer *L;
    float qscale;
} gdn_job;

/* The conv of one lane's rows for channels [c0, c1) */
static void conv_range(const gdn_job *j, const splash_lane *l, int c0, int c1) {
    qwen35_model *m = j->f->m;
    const qwen35_dims *d = &m->d;
    int C = d->conv_dim;
    size_t first = (size_t)l->first_row * C;
    cpu_gdn_conv(j->L->conv_t, C, d->conv_kernel, qwen35_conv_state(m, l->slot, j->L->index),
                 l->mode == SPLASH_LANE_PREFILL, m->qkv + first, (size_t)C, l->n_rows, m->mix1 + first, (size_t)C, c0, c1);
}

/* what commit needs from each verify row */
static void save_verify_rows(gdn_job *j) {
    qwen35_model *m = j->f->m;
    const qwen35_dims *d = &m->d;
    const splash_batch *b = j->f->b;
    int C = d->conv_dim, KD = d->key_dim, VD = d->value_dim, HV = d->hv;
    float *base = m->verify_save + (size_t)j->L->index * m->verify_cap * m->verify_row_floats;
    int vrow = 0;
    for (int i = 0; i < b->n_lanes; i++) {
        const splash_lane *l = &b->lanes[i];
        if (l->mode != SPLASH_LANE_VERIFY) continue;
        for (int r = l->first_row; r < l->first_row + l->n_rows; r++, vrow++) {
            float *s = base + (size_t)vrow * m->verify_row_floats;
            memcpy(s, m->qkv + (size_t)r * C, (size_t)C * sizeof(float));
            memcpy(s + C, m->mix1 + (size_t)r * C + KD, (size_t)(KD + VD) * sizeof(float)); /* k | v */
            memcpy(s + C + KD + VD, m->gg + (size_t)r * HV, (size_t)HV * sizeof(float));
            memcpy(s + C + KD + VD + HV, m->gbeta + (size_t)r * HV, (size_t)HV * sizeof(float));
        }
    }
}

/* The delta rule of one (lane, value head) over the lane's rows. */
static void delta_head(const gdn_job *j, int li, int h, int worker) {
    qwen35_model *m = j->f->m;
    const qwen35_dims *d = &m->d;
    const splash_batch *b = j->f->b;
    const splash_lane *l = &b->lanes[li];
    int kh = h / (d->hv / d->hk), C = d->conv_dim;
    size_t hs = (size_t)d->dk * d->dv;
    float *S = qwen35_delta_state(m, l->slot, j->L->index) + (size_t)h * hs;
    const float *row0 = m->mix1 + (size_t)l->first_row * C;
    const float *q = row0 + (size_t)kh * d->dk, *k = row0 + d->key_dim + (size_t)kh * d->dk;
    const float *v = row0 + 2 * (size_t)d->key_dim + (size_t)h * d->dv;
    const float *g = m->gg + (size_t)l->first_row * d->hv + h, *beta = m->gbeta + (size_t)l->first_row * d->hv + h;
    float *o = m->mix3 + (size_t)l->first_row * d->value_dim + (size_t)h * d->dv;
    const float *Sin = S;
    if (l->mode == SPLASH_LANE_VERIFY) {
        /* on a scratch copy: the first step reads the slot and writes the copy */
        int vl = 0; /* this lane's index among the batch's verify lanes */
        for (int i = 0; i < li; i++) vl += b->lanes[i].mode == SPLASH_LANE_VERIFY;
        S = m->verify_state + ((size_t)vl * d->hv + h) * hs;
    }
    for (int t = 0; t < l->n_rows; t++)
        cpu_gdn_step_from(t ? S : Sin, S, d->dk, d->dv, q + (size_t)t * C, k + (size_t)t * C, v + (size_t)t * C,
                          g[(size_t)t * d->hv], beta[(size_t)t * d->hv], o + (size_t)t * d->value_dim);
}

/* Everything between the projections for one (lane, key head): the conv of
 * its q, k and value-head channels, the l2 norms and q scaling, g and beta of
 * its value heads, their delta rule, and their gated norms. */
static void head_task(void *ctx, size_t task, int worker) {
    const gdn_job *j = ctx;
    qwen35_model *m = j->f->m;
    const qwen35_dims *d = &m->d;
    int li = (int)(task / (size_t)d->hk), kh = (int)(task % (size_t)d->hk);
    const splash_lane *l = &j->f->b->lanes[li];
    int per = d->hv / d->hk, h0 = kh * per, C = d->conv_dim;
    conv_range(j, l, kh * d->dk, (kh + 1) * d->dk);
    conv_range(j, l, d->key_dim + kh * d->dk, d->key_dim + (kh + 1) * d->dk);
    conv_range(j, l, 2 * d->key_dim + h0 * d->dv, 2 * d->key_dim + (h0 + per) * d->dv);
    for (int r = l->first_row; r < l->first_row + l->n_rows; r++) {
        float *row = m->mix1 + (size_t)r * C;
        float *q = row + (size_t)kh * d->dk, *k = row + d->key_dim + (size_t)kh * d->dk;
        cpu_l2norm(q, d->dk, 1e-6f);
        cpu_l2norm(k, d->dk, 1e-6f);
        for (int i = 0; i < d->dk; i++) q[i] *= j->qscale;
        size_t o = (size_t)r * d->hv;
        for (int h = h0; h < h0 + per; h++) {
            m->gbeta[o + h] = cpu_sigmoid(m->gb[o + h]);
            m->gg[o + h] = j->L->neg_a[h] * cpu_softplus(m->ga[o + h] + j->L->dt_bias[h]);
        }
    }
    for (int h = h0; h < h0 + per; h++) delta_head(j, li, h, worker);
    for (int r = l->first_row; r < l->first_row + l->n_rows; r++)
        for (int h = h0; h < h0 + per; h++) {
            size_t p = (size_t)r * d->value_dim + (size_t)h * d->dv;
            cpu_rmsnorm_gated(m->mix3 + p, j->L->gnorm, m->mix2 + p, d->dv, d->rms_eps, m->mix4 + p);
        }
}

void qwen35_gdn_layer(qwen35_fwd *f, const qwen35_layer *L) {
    qwen35_model *m = f->m;
    const qwen35_dims *d = &m->d;
    int R = f->R;
    size_t H = (size_t)d->hidden;
    cpu_mm_part in[4] = {{L->in_qkv, m->qkv, (size_t)d->conv_dim, 0},
                         {L->in_z, m->mix2, (size_t)d->value_dim, 0},
                         {L->in_b, m->gb, (size_t)d->hv, 0},
                         {L->in_a, m->ga, (size_t)d->hv, 0}};
    cpu_matmul_parts(&m->cpu, in, 4, R, m->xn, H);
    qwen35_prof(m, QWEN35_PROF_GDN_PROJ);
    gdn_job j = {f, L, (float)pow((double)d->dk, -0.5)};
    cpu_parallel(&m->cpu, (size_t)f->b->n_lanes * d->hk, head_task, &j);
    if (m->n_pending) save_verify_rows(&j);
    qwen35_prof(m, QWEN35_PROF_GDN_CORE);
    cpu_matmul_add(&m->cpu, L->out_proj, R, m->mix4, (size_t)d->value_dim, m->x, H);
    qwen35_prof(m, QWEN35_PROF_GDN_OUT);
}

/* ---- commit ------------------------------------------------------------------ */

typedef struct commit_job {
    qwen35_model *m;
    const qwen35_pending *p;
    int n;
} commit_job;

/* task = (GDN layer, value head), plus one more per layer for the conv state */
static void commit_task(void *ctx, size_t task, int worker) {
    (void)worker;
    const commit_job *j = ctx;
    qwen35_model *m = j->m;
    const qwen35_dims *d = &m->d;
    int layer = (int)(task / (size_t)(d->hv + 1)), h = (int)(task % (size_t)(d->hv + 1));
    int C = d->conv_dim, KD = d->key_dim, VD = d->value_dim;
    size_t rf = m->verify_row_floats;
    const float *save = m->verify_save + ((size_t)layer * m->verify_cap + j->p->first) * rf;
    if (h == d->hv) {
        cpu_gdn_conv_advance(qwen35_conv_state(m, j->p->slot, layer), C, d->conv_kernel, save, rf, j->n, 0, C);
        return;
    }
    int kh = h / (d->hv / d->hk);
    float *S = qwen35_delta_state(m, j->p->slot, layer) + (size_t)h * d->dk * d->dv;
    for (int t = 0; t < j->n; t++) {
        const float *s = save + (size_t)t * rf;
        cpu_gdn_step(S, d->dk, d->dv, NULL, s + C + (size_t)kh * d->dk, s + C + KD + (size_t)h * d->dv, s[C + KD + VD + h],
                     s[C + KD + VD + d->hv + h], NULL);
    }
}

void qwen35_gdn_commit(qwen35_model *m, const qwen35_pending *p, int n) {
    commit_job j = {m, p, n};
    cpu_parallel(&m->cpu, (size_t)m->d.n_gdn * (size_t)(m->d.hv + 1), commit_task, &j);
}
