/* forward.c - one ragged batch (lanes x rows) through Qwen3.5.
 *
 * All rows of all lanes travel together through every matrix product (each
 * weight row is read once per batch); the lanes part only where they must:
 * attention reads each lane's pages, GDN advances (PREFILL) or scratch-copies
 * (VERIFY) each lane's slot.  The batch is validated completely before
 * anything is written, so a bad batch fails without touching KV or state.
 *
 * Per layer:  x += Mixer(rmsnorm(x) * (1+w_in));  x += FFN(rmsnorm(x) * (1+w_post))
 * (each block adds its output into x itself: the last matrix product of the
 * block accumulates into the residual, same bits as adding afterwards)
 * then the LOGITS and TOP rows: rmsnorm(x) * (1+w_final) -> lm_head (a TOP
 * row then keeps its best top_k logits: cpu_top_k).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/qwen35/qwen35.h"

void qwen35_rows(qwen35_model *m, int R, splash_task_fn fn, void *ctx) { cpu_parallel(&m->cpu, (size_t)R, fn, ctx); }

/* ---- validation ------------------------------------------------------------ */

/* The rules of a forward call for both backends (the CUDA model calls it
 * with its own limits): nothing runs unless the whole batch is valid. */

int qwen35_check_batch(const qwen35_batch_limits *m, const splash_batch *b, splash_error *err) {
    const qwen35_dims *d = m->d;
    if (!b || !b->lanes || !b->rows) return splash_fail(err, SPLASH_E_INVALID, "forward: empty batch");
    if (m->n_slots <= 0) return splash_fail(err, SPLASH_E_INVALID, "forward: no memory attached");
    if (b->n_rows < 1 || b->n_rows > m->max_rows)
        return splash_fail(err, SPLASH_E_RANGE, "forward: %d rows, the model was loaded for 1..%d", b->n_rows,
                           m->max_rows);
    if (b->n_lanes < 1 || b->n_lanes > m->max_lanes)
        return splash_fail(err, SPLASH_E_RANGE, "forward: %d lanes, the model was loaded for 1..%d", b->n_lanes,
                           m->max_lanes);
    int next = 0, verify_rows = 0;
    for (int i = 0; i < b->n_lanes; i++) {
        const splash_lane *l = &b->lanes[i];
        if (l->first_row != next || l->n_rows < 1 || l->first_row + l->n_rows > b->n_rows)
            return splash_fail(err, SPLASH_E_INVALID,
                               "forward: lane %d has rows [%d, %d); lanes must cover the rows contiguously, in order", i,
                               l->first_row, l->first_row + l->n_rows);
        next += l->n_rows;
        if (l->slot < 0 || l->slot >= m->n_slots)
            return splash_fail(err, SPLASH_E_RANGE, "forward: lane %d slot %d outside [0, %d)", i, l->slot, m->n_slots);
        for (int j = 0; j < i; j++)
            if (b->lanes[j].slot == l->slot)
                return splash_fail(err, SPLASH_E_INVALID, "forward: lanes %d and %d share slot %d", j, i, l->slot);
        if (l->mode != SPLASH_LANE_PREFILL && l->mode != SPLASH_LANE_VERIFY)
            return splash_fail(err, SPLASH_E_INVALID, "forward: lane %d mode %d unknown", i, l->mode);
        if (l->mode == SPLASH_LANE_VERIFY) {
            if (l->n_rows > QWEN35_MAX_VERIFY_ROWS)
                return splash_fail(err, SPLASH_E_RANGE, "forward: verify lane %d has %d rows (at most %d)", i, l->n_rows,
                                   QWEN35_MAX_VERIFY_ROWS);
            verify_rows += l->n_rows;
        }
        if (l->n_past < 0 || (int64_t)l->n_past + l->n_rows > d->max_positions)
            return splash_fail(err, SPLASH_E_RANGE, "forward: lane %d positions [%d, %d) beyond the model's %d", i,
                               l->n_past, l->n_past + l->n_rows, d->max_positions);
        if (d->n_attn) {
            int64_t need = ((int64_t)l->n_past + l->n_rows + QWEN35_PAGE_TOKENS - 1) / QWEN35_PAGE_TOKENS;
            if (!l->pages || l->n_pages < need)
                return splash_fail(err, SPLASH_E_RANGE, "forward: lane %d needs %lld pages for %d positions, has %d", i,
                                   (long long)need, l->n_past + l->n_rows, l->pages ? l->n_pages : 0);
            if ((int64_t)l->n_past + l->n_rows > m->max_context)
                return splash_fail(err, SPLASH_E_RANGE, "forward: lane %d context %d exceeds the attached pool (%lld)", i,
                                   l->n_past + l->n_rows, (long long)m->max_context);
            for (int64_t p = 0; p < need; p++)
                if (l->pages[p] < 0 || l->pages[p] >= m->n_pages)
                    return splash_fail(err, SPLASH_E_RANGE, "forward: lane %d page[%lld] = %d outside the pool [0, %d)",
                                       i, (long long)p, l->pages[p], m->n_pages);
        }
    }
    if (next != b->n_rows)
        return splash_fail(err, SPLASH_E_INVALID, "forward: lanes cover %d rows of %d", next, b->n_rows);
    if (verify_rows > m->verify_cap && d->n_gdn)
        return splash_fail(err, SPLASH_E_RANGE, "forward: %d verify rows, at most %d", verify_rows, m->verify_cap);
    for (int r = 0; r < b->n_rows; r++) {
        const splash_row *row = &b->rows[r];
        const int dev = (row->flags & SPLASH_ROW_DEVICE_TOKEN) != 0;
        if (dev && (!b->device_tokens || row->embed || row->token < 0))
            return splash_fail(err, SPLASH_E_INVALID, "forward: row %d's token on the device: %s", r,
                               !b->device_tokens ? "the batch has no array" : "not with an embedding or a negative index");
        if (!dev && !row->embed && (row->token < 0 || row->token >= d->vocab))
            return splash_fail(err, SPLASH_E_RANGE, "forward: row %d token %d outside the vocabulary [0, %d)", r,
                               row->token, d->vocab);
        if (row->flags & ~(uint32_t)(SPLASH_ROW_LOGITS | SPLASH_ROW_TAPS | SPLASH_ROW_TOP | SPLASH_ROW_DEVICE_TOKEN))
            return splash_fail(err, SPLASH_E_INVALID, "forward: row %d has unknown flags 0x%x", r, row->flags);
        if ((row->flags & SPLASH_ROW_LOGITS) && !b->logits)
            return splash_fail(err, SPLASH_E_INVALID, "forward: row %d asks for logits but the batch has no buffer", r);
        if ((row->flags & SPLASH_ROW_TOP) && (!b->top_ids || !b->top_logits))
            return splash_fail(err, SPLASH_E_INVALID, "forward: row %d asks for its top logits but the batch has no buffer", r);
        if ((row->flags & SPLASH_ROW_TOP) && (b->top_k < 1 || b->top_k > SPLASH_MAX_TOP || b->top_k > d->vocab))
            return splash_fail(err, SPLASH_E_RANGE, "forward: top_k %d outside [1, %d]", b->top_k,
                               d->vocab < SPLASH_MAX_TOP ? d->vocab : SPLASH_MAX_TOP);
        if ((row->flags & SPLASH_ROW_TAPS) && (m->n_taps == 0 || (!b->taps && !(b->taps_on_device && m->device_taps))))
            return splash_fail(err, SPLASH_E_INVALID, "forward: row %d asks for taps but %s", r,
                               m->n_taps ? "the batch has no buffer" : "the model was loaded without tap layers");
    }
    return 0;
}

/* ---- pieces ------------------------------------------------------------------ */

typedef struct row_job {
    qwen35_fwd *f;
    const float *factor;
    const float *in;
    float *out;
} row_job;

static void embed_task(void *ctx, size_t r, int worker) {
    (void)worker;
    qwen35_fwd *f = ctx;
    const splash_row *row = &f->b->rows[r];
    float *x = f->m->x + r * (size_t)f->m->d.hidden;
    int32_t t = row->token;
    if (row->flags & SPLASH_ROW_DEVICE_TOKEN) t = f->b->device_tokens[t]; /* this model's device is the host */
    if (row->embed)
        memcpy(x, row->embed, (size_t)f->m->d.hidden * sizeof(float));
    else if (t < 0 || t >= f->m->d.vocab) /* a device token out of range embeds as nothing (model.h) */
        memset(x, 0, (size_t)f->m->d.hidden * sizeof(float));
    else
        cpu_dequant_row(f->m->w.embed, t, x);
}

static void norm_task(void *ctx, size_t r, int worker) {
    (void)worker;
    row_job *j = ctx;
    size_t H = (size_t)j->f->m->d.hidden;
    cpu_rmsnorm(j->in + r * H, j->factor, (int)H, j->f->m->d.rms_eps, j->out + r * H);
}

/* xn = rmsnorm(x) * factor for every row */
static void norm_rows(qwen35_fwd *f, const float *factor) {
    row_job j = {f, factor, f->m->x, f->m->xn};
    qwen35_rows(f->m, f->R, norm_task, &j);
}

static void write_taps(qwen35_fwd *f, int layer) {
    qwen35_model *m = f->m;
    size_t H = (size_t)m->d.hidden;
    for (int t = 0; t < m->n_taps; t++) {
        if (m->tap_layers[t] != layer) continue;
        int k = 0;
        for (int r = 0; r < f->R; r++)
            if (f->b->rows[r].flags & SPLASH_ROW_TAPS) {
                memcpy(f->b->taps + ((size_t)k * m->n_taps + t) * H, m->x + r * H, H * sizeof(float));
                k++;
            }
    }
}


/* lm_head over the n normed head rows in m->xn (row order): runs of LOGITS
 * rows straight into b->logits, runs of TOP-only rows QWEN35_HEAD_TMP_ROWS at
 * a time into m->head_tmp; every TOP row keeps its top b->top_k from
 * whichever holds its logits.  SPLASH_E_NOMEM when head_tmp cannot be made. */
static int head(qwen35_model *m, const splash_batch *b, int n) {
    const size_t H = (size_t)m->d.hidden, V = (size_t)m->d.vocab, K = (size_t)b->top_k;
    int li = 0, ti = 0;
    for (int k = 0; k < n;) {
        const int log = (b->rows[m->head_rows[k]].flags & SPLASH_ROW_LOGITS) != 0;
        int e = k + 1;
        while (e < n && ((b->rows[m->head_rows[e]].flags & SPLASH_ROW_LOGITS) != 0) == log &&
               (log || e - k < QWEN35_HEAD_TMP_ROWS))
            e++;
        if (!log && !m->head_tmp && !(m->head_tmp = malloc(sizeof(float) * V * QWEN35_HEAD_TMP_ROWS))) return SPLASH_E_NOMEM;
        float *out = log ? b->logits + (size_t)li * V : m->head_tmp;
        cpu_matmul(&m->cpu, m->w.lm_head, e - k, m->xn + (size_t)k * H, H, out, V);
        for (int r = k; r < e; r++) {
            if (!(b->rows[m->head_rows[r]].flags & SPLASH_ROW_TOP)) continue;
            int32_t *ids = b->top_ids + (size_t)ti * K;
            float *vals = b->top_logits + (size_t)ti * K;
            for (int c = cpu_top_k(out + (size_t)(r - k) * V, (int)V, (int)K, NULL, ids, vals); c < (int)K; c++)
                ids[c] = -1, vals[c] = -INFINITY;
            ti++;
        }
        if (log) li += e - k;
        k = e;
    }
    return 0;
}
/* ---- the pass ----------------------------------------------------------------- */

int qwen35_forward(void *impl, const splash_batch *b, splash_error *err) {
    qwen35_model *m = impl;
    qwen35_batch_limits lim = {.d = &m->d, .n_slots = m->n_slots, .max_rows = m->max_rows, .max_lanes = m->max_lanes,
                               .n_pages = m->n_pages, .verify_cap = m->verify_cap, .n_taps = m->n_taps,
                               .max_context = (int64_t)m->max_context};
    int rc = qwen35_check_batch(&lim, b, err);
    if (rc) return rc;
    const qwen35_dims *d = &m->d;
    qwen35_fwd f = {m, b, b->n_rows};
    /* uncommitted verify rows of the previous call are dropped */
    m->n_pending = 0;
    int vrow = 0;
    for (int i = 0; i < b->n_lanes; i++) {
        const splash_lane *l = &b->lanes[i];
        m->alanes[i] = (cpu_attn_lane){l->pages, l->n_past, l->first_row, l->n_rows};
        if (l->mode == SPLASH_LANE_VERIFY) {
            m->pending[m->n_pending++] = (qwen35_pending){l->slot, vrow, l->n_rows};
            vrow += l->n_rows;
        }
    }
    if (m->profile) {
        m->prof_t = qwen35_clock(CLOCK_MONOTONIC);
        m->prof_c = qwen35_clock(CLOCK_PROCESS_CPUTIME_ID);
        m->prof_calls++;
        m->prof_rows += f.R;
    }
    qwen35_rows(m, f.R, embed_task, &f);
    qwen35_prof(m, QWEN35_PROF_EMBED);
    for (int li = 0; li < d->n_layers; li++) {
        const qwen35_layer *L = &m->w.layers[li];
        norm_rows(&f, L->input_norm);
        qwen35_prof(m, QWEN35_PROF_NORM);
        if (L->is_attn) /* each block adds its output into x */
            qwen35_attn_layer(&f, L);
        else
            qwen35_gdn_layer(&f, L);
        norm_rows(&f, L->post_norm);
        qwen35_prof(m, QWEN35_PROF_NORM);
        if (d->moe)
            qwen35_moe_layer(&f, L);
        else
            qwen35_ffn_layer(&f, L);
        if (m->n_taps) write_taps(&f, li);
        qwen35_prof(m, QWEN35_PROF_FFN);
    }
    /* the LOGITS and TOP rows, compacted in row order, through the final norm */
    int n = 0;
    size_t H = (size_t)d->hidden;
    for (int r = 0; r < f.R; r++)
        if (b->rows[r].flags & (SPLASH_ROW_LOGITS | SPLASH_ROW_TOP)) m->head_rows[n++] = r;
    if (n) {
        for (int k = 0; k < n; k++)
            if (m->head_rows[k] != k) memcpy(m->x + (size_t)k * H, m->x + (size_t)m->head_rows[k] * H, H * sizeof(float));
        row_job j = {&f, m->w.final_norm, m->x, m->xn};
        qwen35_rows(m, n, norm_task, &j);
        if (head(m, b, n)) return splash_fail(err, SPLASH_E_NOMEM, "forward: out of memory for the top logits");
    }
    qwen35_prof(m, QWEN35_PROF_HEAD);
    return 0;
}
