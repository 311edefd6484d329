/* cuda_forward.cu - one ragged batch (lanes x rows) through Qwen3.5 on the
 * GPU: the CPU's forward.c composed of the device kernels.
 *
 *   1. validate the batch on the host, with forward.c's rules and messages
 *      (nothing is written before the batch is known good);
 *   2. the descriptor (cuda_model.h): positions, token ids, the verify-save
 *      map, the LOGITS and TAPS rows, page tables, and the lane arrays the
 *      kernels take (whole lanes for the KV write, lanes cut to each
 *      attention call's rows, GDN lanes per layer with their state pointers),
 *      written to pinned memory and uploaded with one copy;
 *   3. embedding, then per layer  x += Mixer(rmsnorm(x));  x += FFN(rmsnorm(x))
 *      (cuda_layers.cu), taps after the layers that have them;
 *   4. the LOGITS and TOP rows, gathered in row order, 64 at a time through
 *      the final norm and lm_head (then each row's top k when any row is
 *      TOP: 8 bytes a candidate to the host instead of the vocabulary), each
 *      pass copied to the host.
 *
 * Matrix products (qc_products): the rows of bulk-prefill lanes (PREFILL
 * lanes of >= QWEN35_CHUNKED_MIN_ROWS rows, the lanes the chunked GDN takes)
 * go through the tensor-core GEMM (q4_gemm.h: fp16-grade, bound by the
 * arithmetic), every other row through the q4 product 16 rows a launch (one
 * prepared activation per 16 rows shared by every matrix that reads it;
 * fp32-grade, bound by the weight bytes).  A row's result depends on its own
 * lane only (both kernels' results are independent of the other rows), so a
 * decode or verify lane gets the same numbers alone or beside a prefill.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/norm.h"
#include "backend/cuda/rows.h"
#include "models/qwen35/cuda_model.h"

/* ---- products ----------------------------------------------------------------- */

/* Non-q4 matrices of p over all R rows; returns the q4 matrices' columns (0:
 * none) in *q4_cols. */
static int dense_products(struct CUstream_st *stream, const float *x, size_t ldx, int R, const qc_prod *p, int n,
                          int *q4_cols) {
    *q4_cols = 0;
    for (int j = 0; j < n; j++) {
        const qc_matrix *w = p[j].w;
        if (j && w->cols != p[0].w->cols) return SPLASH_E_INVALID;
        if (w->is_q4) {
            *q4_cols = w->cols;
            continue;
        }
        if (p[j].add) return SPLASH_E_INVALID; /* adding products are q4 (cuda_layers.cu's residual) */
        int rc = splash_cuda_dense_matmul(&w->dense, x, ldx, R, p[j].y, (size_t)w->rows, stream);
        if (rc) return rc;
    }
    return 0;
}

/* Rows [r0, r1) through the q4 matrices of p (those with gemm == 0 only when
 * skip_gemm), 16 rows a launch, each 16 rows prepared once in xp.  *xp_src
 * (ld xp_ld): what a fused producer already prepared in xp (rows 0..15), NULL
 * for nothing; set to NULL once xp holds something else. */
static int q4_by16(splash_q4_xprep *xp, const float **xp_src, size_t xp_ld, struct CUstream_st *stream,
                   const float *x, size_t ldx, int r0, int r1, const qc_prod *p, int n, int q4_cols, int skip_gemm) {
    const cudaStream_t s = (cudaStream_t)stream;
    for (int a = r0; a < r1; a += SPLASH_Q4_MAX_M) {
        const int M = r1 - a < SPLASH_Q4_MAX_M ? r1 - a : SPLASH_Q4_MAX_M;
        int rc = 0, prepped = 0;
        for (int j = 0; j < n; j++) {
            const qc_matrix *w = p[j].w;
            if (!w->is_q4 || (skip_gemm && w->gemm)) continue;
            if (!prepped) {
                if (a || x != *xp_src || ldx != xp_ld || xp->cols != q4_cols || xp->M != M) {
                    *xp_src = nullptr;
                    if ((rc = splash_q4_prep_x(xp, x + (size_t)a * ldx, M, q4_cols, (int)ldx, s))) return rc;
                }
                prepped = 1;
            }
            float *y = p[j].y + (size_t)a * w->rows;
            if ((rc = p[j].add ? splash_q4_matmul_add(&w->q4, xp, y, s) : splash_q4_matmul(&w->q4, xp, y, s)))
                return rc;
        }
    }
    return 0;
}

/* The model's q4 rows: its xprep, which the fused producers fill (xp_src). */
static int model_by16(qc_model *m, const float *x, size_t ldx, int r0, int r1, const qc_prod *p, int n, int q4_cols,
                      int skip_gemm) {
    return q4_by16(&m->xp, &m->xp_src, m->xp_ld, m->stream, x, ldx, r0, r1, p, n, q4_cols, skip_gemm);
}

/* Rows [r0, r1) through the q4 matrices of p that take the GEMM: x prepared
 * once, then per matrix one launch of q4_gemm.h, or for QC_BLAS_MIN_ROWS rows
 * or more (when cuBLASLt loaded) the matrix expanded to fp16 and cuBLASLt's
 * GEMM (x with one power of two for the range, its alpha). */
static int q4_gemm_rows(qc_model *m, const float *x, size_t ldx, int r0, int r1, const qc_prod *p, int n, int q4_cols) {
    const int R = r1 - r0;
    int blas = 0; /* some matrix takes cuBLASLt: x prepared for it (q4_gemm reads that preparation too) */
    for (int j = 0; j < n && m->wexp && R >= m->blas_min_rows; j++) blas |= qc_blas_shape(m, p[j].w);
    /* the RMS norm before may have made this preparation already (norm_rows) */
    const int made = blas && x == m->gx_src && ldx == (size_t)m->d.hidden && r0 == m->gx_r0 && r1 == m->gx_r1 &&
                     q4_cols == m->gx.cols;
    /* the SwiGLU before may have found the rows' largest |x| (silu_mul) */
    const int amax = blas && x == m->ax_src && ldx == m->ax_ld && r0 == m->ax_r0 && r1 == m->ax_r1;
    m->gx_src = nullptr, m->ax_src = nullptr;
    const float *x0 = x + (size_t)r0 * ldx;
    int rc = made   ? 0
             : amax ? splash_q4_gemm_prep_uniform_amax(&m->gx, x0, R, q4_cols, ldx, m->stream)
             : blas ? splash_q4_gemm_prep_uniform(&m->gx, x0, R, q4_cols, ldx, m->stream)
                    : splash_q4_gemm_prep(&m->gx, x0, R, q4_cols, ldx, m->stream);
    for (int j = 0; j < n && !rc; j++) {
        const qc_matrix *w = p[j].w;
        if (!w->is_q4 || !w->gemm) continue;
        float *y = p[j].y + (size_t)r0 * w->rows;
        if (!blas || !qc_blas_shape(m, w)) {
            rc = splash_q4_gemm(&w->q4, &m->gx, y, p[j].add, m->stream);
            continue;
        }
        const uint16_t *w16 = w->w16 ? w->w16 : m->wexp; /* resident (splash_model_use_spare), or expanded now */
        rc = w->w16 ? 0 : splash_q4_expand_f16(&w->q4, m->wexp, m->stream);
        if (!rc)
            rc = splash_cuda_blas_gemm(m->blas, w16, w->rows, w->cols, m->gx.hi, R, m->gx.alpha,
                                       m->gx.alpha + (p[j].add ? 2 : 1), y, m->blas_ws, m->stream);
    }
    return rc;
}

int qc_products_rows(qc_model *m, const float *x, size_t ldx, int R, const qc_prod *p, int n) {
    int q4_cols, rc = dense_products(m->stream, x, ldx, R, p, n, &q4_cols);
    return rc || !q4_cols ? rc : model_by16(m, x, ldx, 0, R, p, n, q4_cols, 0);
}

int qc_products_xp(splash_q4_xprep *xp, struct CUstream_st *stream, const float *x, size_t ldx, int R,
                   const qc_prod *p, int n) {
    const float *none = nullptr;
    return qc_products_xp_src(xp, &none, 0, stream, x, ldx, R, p, n);
}

int qc_products_xp_src(splash_q4_xprep *xp, const float **xp_src, size_t xp_ld, struct CUstream_st *stream,
                       const float *x, size_t ldx, int R, const qc_prod *p, int n) {
    int q4_cols, rc = dense_products(stream, x, ldx, R, p, n, &q4_cols);
    return rc || !q4_cols ? rc : q4_by16(xp, xp_src, xp_ld, stream, x, ldx, 0, R, p, n, q4_cols, 0);
}

int qc_products(qc_fwd *f, const float *x, size_t ldx, const qc_prod *p, int n) {
    qc_model *m = f->m;
    int q4_cols, rc = dense_products(m->stream, x, ldx, f->R, p, n, &q4_cols);
    if (rc || !q4_cols) return rc;
    int r = 0; /* rows before r are done */
    for (int i = 0; i < f->n_bulk; i++) {
        const qc_rows b = m->bulk[i];
        if ((rc = model_by16(m, x, ldx, r, b.r0, p, n, q4_cols, 0))) return rc;
        if ((rc = q4_gemm_rows(m, x, ldx, b.r0, b.r1, p, n, q4_cols))) return rc;
        if ((rc = model_by16(m, x, ldx, b.r0, b.r1, p, n, q4_cols, 1))) return rc; /* matrices the GEMM refuses */
        r = b.r1;
    }
    return model_by16(m, x, ldx, r, f->R, p, n, q4_cols, 0);
}

/* ---- validation (forward.c's rules, shared) ------------------------------------------------ */

static int validate(qc_model *m, const splash_batch *b, splash_error *err) {
    /* d, n_slots, max_rows, max_lanes, n_pages, verify_cap, n_taps, max_context, device_taps (m->taps) */
    qwen35_batch_limits lim = {&m->d, m->n_slots, m->max_rows, m->max_lanes, m->n_pages, m->verify_cap, m->n_taps,
                               (int64_t)m->ctx_cap, 1};
    int rc = qwen35_check_batch(&lim, b, err);
    for (int r = 0; !rc && r < b->n_rows; r++)
        if ((b->rows[r].flags & SPLASH_ROW_TOP) && b->top_k > m->needs.max_top)
            rc = splash_fail(err, SPLASH_E_RANGE, "forward: top_k %d, the GPU's top-k takes at most %d here", b->top_k,
                             m->needs.max_top);
    return rc;
}

/* ---- the descriptor ------------------------------------------------------------------ */

/* GDN lanes of the chunked kernel: PREFILL lanes of at least
 * QWEN35_CHUNKED_MIN_ROWS rows, as the CPU (gdn.c); the rest run the
 * recurrence. */
static int chunked_lane(const splash_lane *l) {
    return l->mode == SPLASH_LANE_PREFILL && l->n_rows >= QWEN35_CHUNKED_MIN_ROWS;
}

/* SPLASH_CUDA_ATTN_BULK (read once), an A/B switch: 2 (unset) a bulk lane's
 * split splash_cuda_attn_bulk_split's and calls as long as the workspace
 * allows at the forward's contexts; 1 the shortest long split, same calls;
 * 0 that split in calls sized at the pool's longest context (session 37's). */
static int bulk_policy(void) {
    static const int v = [] {
        const char *e = getenv("SPLASH_CUDA_ATTN_BULK");
        return e && (e[0] == '0' || e[0] == '1') && !e[1] ? e[0] - '0' : 2;
    }();
    return v;
}

/* Rows of bulk-prefill lanes one attention call takes at the given split
 * and longest context: all of them in one split over int8 pages (outputs
 * written by the split blocks: attention.h), else what the workspace
 * holds.  At least the attach's attn_rows_long, which it sized at the
 * shortest long split and the longest context. */
static int bulk_call_rows(const qc_model *m, int split, int ctx) {
    const qwen35_dims *d = &m->d;
    if (bulk_policy() == 0) return m->attn_rows_long;
    if (m->kv.format == SPLASH_KV_INT8 && ctx <= split) return m->max_rows;
    int lo = m->attn_rows_long, hi = m->max_rows; /* lo fits: the largest that does */
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if (splash_cuda_attn_workspace_bytes(mid, d->heads, d->head_dim, ctx, split) <= m->attn_ws_bytes)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Fills the pinned descriptor and the host-side plan in f; returns the bytes
 * to upload (everything before the page tables, then the tables used). */
static size_t build_desc(qc_fwd *f) {
    qc_model *m = f->m;
    const qwen35_dims *d = &m->d;
    const splash_batch *b = f->b;
    const qc_desc_plan *p = &m->plan;
    uint8_t *h = m->desc_host;
    int32_t *pos = (int32_t *)(h + p->pos), *tok = (int32_t *)(h + p->tok), *vmap = (int32_t *)(h + p->vmap);
    int32_t *head = (int32_t *)(h + p->head_rows), *tap = (int32_t *)(h + p->tap_rows);
    f->n_head = f->n_tap = f->n_top = 0;
    for (int r = 0; r < f->R; r++) {
        const splash_row *row = &b->rows[r];
        pos[r] = row->pos[0];
        tok[r] = row->embed || (row->flags & SPLASH_ROW_DEVICE_TOKEN) ? -1 : row->token; /* run(): device tokens */
        vmap[r] = -1;
        if (row->flags & (SPLASH_ROW_LOGITS | SPLASH_ROW_TOP)) head[f->n_head++] = r;
        if (row->flags & SPLASH_ROW_TOP) f->n_top++;
        if (row->flags & SPLASH_ROW_TAPS) tap[f->n_tap++] = r;
    }
    /* lanes: page tables, whole attention lanes, the verify map and pending list */
    splash_cuda_attn_lane *al = (splash_cuda_attn_lane *)(h + p->alanes);
    int32_t *pages_h = (int32_t *)(h + p->pages);
    int32_t *pages_d = qc_desc_i32(m, p->pages);
    int vrow = 0;
    f->max_lane_rows = 0;
    m->n_pending = 0; /* uncommitted verify rows of the previous call are dropped */
    for (int i = 0; i < b->n_lanes; i++) {
        const splash_lane *l = &b->lanes[i];
        if (l->n_rows > f->max_lane_rows) f->max_lane_rows = l->n_rows;
        memset(&al[i], 0, sizeof al[i]);
        if (d->n_attn) {
            const int need = (l->n_past + l->n_rows + QWEN35_PAGE_TOKENS - 1) / QWEN35_PAGE_TOKENS;
            memcpy(pages_h + (size_t)i * m->pages_per_lane, l->pages, (size_t)need * sizeof(int32_t));
            al[i].pages = pages_d + (size_t)i * m->pages_per_lane;
        }
        al[i].n_past = l->n_past, al[i].first_row = l->first_row, al[i].n_rows = l->n_rows;
        if (l->mode == SPLASH_LANE_VERIFY) {
            qc_pending *pd = &m->pending[m->n_pending++];
            pd->slot = l->slot, pd->first = vrow, pd->n_rows = l->n_rows;
            for (int r = 0; r < l->n_rows; r++) vmap[l->first_row + r] = vrow++;
        }
    }
    f->n_vrows = vrow;
    /* bulk-prefill rows for the GEMM: chunked lanes, adjacent ones merged
     * unless cuBLASLt may take them (its algorithm, so a row's bits, depends
     * on the range's rows, which must not depend on other lanes) */
    f->n_bulk = 0;
    for (int i = 0; i < b->n_lanes && m->gx_mem; i++) {
        const splash_lane *l = &b->lanes[i];
        if (!chunked_lane(l)) continue;
        if (f->n_bulk && m->bulk[f->n_bulk - 1].r1 == l->first_row && !m->wexp)
            m->bulk[f->n_bulk - 1].r1 += l->n_rows;
        else
            m->bulk[f->n_bulk++] = qc_rows{l->first_row, l->first_row + l->n_rows};
    }
    /* attention calls: batch rows [r0, r1) each, lanes cut to them; the
     * rows of bulk-prefill lanes in calls of their own with the lane's long
     * split (splash_cuda_attn_bulk_split: from its own rows and context, so
     * its bits never depend on other lanes); a call ends where the kind or
     * the split changes, or where the workspace is full */
    f->n_chunks = 0;
    if (d->n_attn) {
        splash_cuda_attn_lane *cl = (splash_cuda_attn_lane *)(h + p->clanes);
        memset(m->row_bulk, 0, (size_t)f->R);
        for (int i = 0; i < b->n_lanes; i++) {
            const splash_lane *l = &b->lanes[i];
            if (!chunked_lane(l)) continue;
            const int split = bulk_policy() == 2 ? splash_cuda_attn_bulk_split(l->n_rows, l->n_past + l->n_rows,
                                                                               d->heads, d->kv_heads)
                                                 : SPLASH_CUDA_ATTN_SPLIT_LONG;
            int kind = 1;
            while ((SPLASH_CUDA_ATTN_SPLIT_LONG << (kind - 1)) < split) kind++;
            memset(m->row_bulk + l->first_row, kind, (size_t)l->n_rows);
        }
        for (int r0 = 0, r1; r0 < f->R; r0 = r1) {
            const int kind = m->row_bulk[r0];
            const int split = kind ? SPLASH_CUDA_ATTN_SPLIT_LONG << (kind - 1) : 0;
            int cap = m->attn_rows;
            if (kind) { /* the workspace at the longest context of the kind's lanes */
                int ctx = 0;
                for (int i = 0; i < b->n_lanes; i++) {
                    const splash_lane *l = &b->lanes[i];
                    if (l->n_rows && m->row_bulk[l->first_row] == kind && l->n_past + l->n_rows > ctx)
                        ctx = l->n_past + l->n_rows;
                }
                cap = bulk_call_rows(m, split, ctx);
            }
            for (r1 = r0 + 1; r1 < f->R && r1 - r0 < cap && m->row_bulk[r1] == kind; r1++) {
            }
            qc_chunk *c = &m->chunks[f->n_chunks];
            splash_cuda_attn_lane *out = cl + (size_t)f->n_chunks * m->max_lanes;
            c->r0 = r0, c->r1 = r1, c->split = split;
            c->n_lanes = c->min_lane_rows = c->max_lane_rows = c->max_ctx = 0;
            for (int i = 0; i < b->n_lanes; i++) {
                const int a0 = al[i].first_row > c->r0 ? al[i].first_row : c->r0;
                const int a1 = al[i].first_row + al[i].n_rows < c->r1 ? al[i].first_row + al[i].n_rows : c->r1;
                if (a0 >= a1) continue;
                splash_cuda_attn_lane *o = &out[c->n_lanes++];
                *o = al[i];
                o->n_past = al[i].n_past + (a0 - al[i].first_row);
                o->first_row = a0 - c->r0;
                o->n_rows = a1 - a0;
                if (o->n_rows > c->max_lane_rows) c->max_lane_rows = o->n_rows;
                if (!c->min_lane_rows || o->n_rows < c->min_lane_rows) c->min_lane_rows = o->n_rows;
                if (o->n_past + o->n_rows > c->max_ctx) c->max_ctx = o->n_past + o->n_rows;
            }
            f->n_chunks++;
        }
    }
    /* GDN lanes per layer: the recurrence's first, then the chunked kernel's */
    f->n_rec = f->n_chunked = 0;
    if (d->n_gdn) {
        splash_cuda_gdn_lane *gl = (splash_cuda_gdn_lane *)(h + p->glanes);
        for (int gi = 0; gi < d->n_gdn; gi++) {
            splash_cuda_gdn_lane *o = gl + (size_t)gi * m->max_lanes;
            int k = 0;
            for (int pass = 0; pass < 2; pass++) {
                for (int i = 0; i < b->n_lanes; i++) {
                    const splash_lane *l = &b->lanes[i];
                    const int verify = l->mode == SPLASH_LANE_VERIFY;
                    /* no workspace: a shape the chunked kernel does not take (the recurrence runs it) */
                    if ((chunked_lane(l) && m->gdn_ws) == (pass == 0)) continue;
                    splash_cuda_gdn_lane *g = &o[k++];
                    memset(g, 0, sizeof *g);
                    g->conv_state = qc_conv_state(m, l->slot, gi);
                    g->s_in = qc_delta_state(m, l->slot, gi);
                    /* a verify lane's state after its rows is not kept: the slot stays
                     * as it was and commit replays the accepted rows */
                    g->s_out = verify ? NULL : qc_delta_state(m, l->slot, gi);
                    g->first_row = l->first_row, g->n_rows = l->n_rows;
                    g->update_conv = !verify;
                }
                if (gi == 0) {
                    if (pass == 0)
                        f->n_rec = k;
                    else
                        f->n_chunked = k - f->n_rec;
                }
            }
        }
    }
    return p->pages + (size_t)(d->n_attn ? b->n_lanes : 0) * m->pages_per_lane * sizeof(int32_t);
}

/* ---- pieces ----------------------------------------------------------------------------- */

static int embed(qc_fwd *f) {
    qc_model *m = f->m;
    const size_t H = (size_t)m->d.hidden;
    const cudaStream_t s = (cudaStream_t)m->stream;
    const int32_t *ids = qc_desc_i32(m, m->plan.tok);
    if (m->w.embed.is_q4)
        QC_TRY(f, splash_cuda_embed_rows_q4(&m->w.embed.q4, ids, f->R, m->x, H, m->stream));
    else
        QC_TRY(f, splash_cuda_embed_rows_dense(&m->w.embed.dense, ids, f->R, m->x, H, m->stream));
    for (int r = 0; r < f->R; r++) /* embedding overrides (images) */
        if (f->b->rows[r].embed)
            SPLASH_CUDA_TRY(cudaMemcpyAsync(m->x + (size_t)r * H, f->b->rows[r].embed, H * sizeof(float),
                                            cudaMemcpyHostToDevice, s));
    return 0;
}

/* out = rmsnorm(in) * factor, prepared for the q4 products that read it
 * when it can be (one launch: splash_q4_prep_rmsnorm), and for a layer's
 * norm (layer 1; the head's rows go to lm_head 16 at a time) when the
 * forward holds one bulk-prefill range long enough for cuBLASLt, that range
 * as the GEMM's fp16 rows too (q4_gemm_rows then skips its amax and uniform
 * passes: measured at 4K rows of 4 27B layers, 0.48 ms less for 0.09 ms more
 * in the norms, session 24). */
static int norm_rows(qc_fwd *f, const float *in, const float *factor, int rows, float *out, int layer) {
    qc_model *m = f->m;
    const size_t H = (size_t)m->d.hidden;
    m->xp_src = nullptr;
    m->gx_src = nullptr, m->ax_src = nullptr;
    const qc_rows *b = layer ? qc_blas_bulk(f) : nullptr;
    const int gemm = qc_prep_ok(m, (int)H) && b;
    if (f->moe_sum_rows && in == m->x && rows == f->moe_sum_rows && !gemm && qc_prep_ok(m, (int)H)) {
        /* the MoE layer's sum added by the norm's launch (qc_fwd.moe_sum_rows) */
        const int rc = splash_q4_prep_rmsnorm_moe(&m->xp, m->x, H, &f->moe_sum, factor, m->d.rms_eps, out, H, rows,
                                                  (int)H, m->stream);
        if (rc != SPLASH_E_UNSUPPORTED) {
            f->moe_sum_rows = 0;
            QC_TRY(f, rc);
            m->xp_src = out, m->xp_ld = H;
            return 0;
        }
    }
    int rc = qc_moe_sum_flush(f);
    if (rc) return rc;
    if (gemm) { /* layer: rows = f->R */
        QC_TRY(f, splash_q4_prep_rmsnorm_gemm(&m->xp, &m->gx, b->r0, b->r1, in, H, factor, m->d.rms_eps, out, H, rows,
                                              (int)H, m->stream));
        m->xp_src = out, m->xp_ld = H;
        m->gx_src = out, m->gx_r0 = b->r0, m->gx_r1 = b->r1;
        return 0;
    }
    if (qc_prep_ok(m, (int)H)) {
        QC_TRY(f, splash_q4_prep_rmsnorm(&m->xp, in, H, factor, m->d.rms_eps, out, H, rows, (int)H, m->stream));
        m->xp_src = out, m->xp_ld = H;
        return 0;
    }
    QC_TRY(f, splash_cuda_rmsnorm(in, H, 0, out, H, 0, factor, 0.f, (int)H, rows, 1, m->d.rms_eps, m->stream));
    return 0;
}

static int write_taps(qc_fwd *f, int layer) {
    qc_model *m = f->m;
    const size_t H = (size_t)m->d.hidden;
    int rc = qc_moe_sum_flush(f); /* the taps are x's rows */
    if (rc) return rc;
    for (int t = 0; t < m->n_taps; t++)
        if (m->tap_layers[t] == layer)
            QC_TRY(f, splash_cuda_gather_rows(m->x, H, qc_desc_i32(m, m->plan.tap_rows), f->n_tap, m->taps + (size_t)t * H,
                                              (size_t)m->n_taps * H, (int)H, m->stream));
    return 0;
}

/* Head rows [k0, k0 + nk) (LOGITS and TOP rows compacted in row order)
 * through the final norm and lm_head into m->logits; with TOP rows in the
 * batch, every pass row's top b->top_k into m->top_ids / top_vals (the argmax
 * for one: the same order, a cheaper kernel). */
static int head_pass(qc_fwd *f, int k0, int nk) {
    qc_model *m = f->m;
    const size_t H = (size_t)m->d.hidden;
    const int32_t *rows = qc_desc_i32(m, m->plan.head_rows);
    QC_TRY(f, splash_cuda_gather_rows(m->x, H, rows + k0, nk, m->tmp, H, (int)H, m->stream));
    int rc = norm_rows(f, m->tmp, m->w.final_norm, nk, m->xn, 0);
    if (rc) return rc;
    const qc_prod p = {&m->w.lm_head, m->logits, 0};
    QC_TRY(f, qc_products_rows(m, m->xn, H, nk, &p, 1));
    if (!f->n_top) return 0;
    const int V = m->d.vocab, K = f->b->top_k;
    if (K == 1)
        QC_TRY(f, splash_cuda_argmax(m->logits, (size_t)V, nk, V, m->top_ids, m->top_vals, m->top_ws, m->top_ws_bytes,
                                     m->stream));
    else
        QC_TRY(f, splash_cuda_topk(m->logits, (size_t)V, nk, V, K, m->top_ids, m->top_vals, (size_t)K, m->top_n,
                                   m->top_ws, m->top_ws_bytes, m->stream));
    return 0;
}

/* Copies the results of head rows [k0, k0 + nk) (one pass) to the host: the
 * LOGITS rows' logits, the TOP rows' entries, each run of consecutive rows of
 * a kind in one copy (a block's rows are one run). */
static int copy_head(qc_fwd *f, int k0, int nk) {
    qc_model *m = f->m;
    const splash_batch *b = f->b;
    const cudaStream_t s = (cudaStream_t)m->stream;
    const int32_t *head = (const int32_t *)(m->desc_host + m->plan.head_rows);
    const size_t V = (size_t)m->d.vocab, K = (size_t)b->top_k;
    int li = 0, ti = 0; /* outputs before this pass */
    for (int h = 0; h < k0; h++) {
        li += (b->rows[head[h]].flags & SPLASH_ROW_LOGITS) != 0;
        ti += (b->rows[head[h]].flags & SPLASH_ROW_TOP) != 0;
    }
    for (int kind = 0; kind < 2; kind++) {
        const uint32_t flag = kind ? SPLASH_ROW_TOP : SPLASH_ROW_LOGITS;
        int out = kind ? ti : li;
        for (int h = 0; h < nk;) {
            if (!(b->rows[head[k0 + h]].flags & flag)) {
                h++;
                continue;
            }
            int e = h + 1;
            while (e < nk && (b->rows[head[k0 + e]].flags & flag)) e++;
            const size_t n = (size_t)(e - h);
            if (kind) {
                SPLASH_CUDA_TRY(cudaMemcpyAsync(b->top_ids + out * K, m->top_ids + h * K, n * K * sizeof(int32_t),
                                                cudaMemcpyDeviceToHost, s));
                SPLASH_CUDA_TRY(cudaMemcpyAsync(b->top_logits + out * K, m->top_vals + h * K, n * K * sizeof(float),
                                                cudaMemcpyDeviceToHost, s));
            } else {
                SPLASH_CUDA_TRY(cudaMemcpyAsync(b->logits + out * V, m->logits + h * V, n * V * sizeof(float),
                                                cudaMemcpyDeviceToHost, s));
            }
            out += (int)n;
            h = e;
        }
    }
    return 0;
}

/* Up to head_cap LOGITS rows: one pass, copied after the forward (outside a
 * graph); more: passes of head_cap rows, each copied before the next. */
static int head(qc_fwd *f) {
    qc_model *m = f->m;
    int rc = qc_moe_sum_flush(f); /* x complete: the head's rows and what the host may read */
    if (rc) return rc;
    if (f->n_head <= m->head_cap) return f->n_head ? head_pass(f, 0, f->n_head) : 0;
    for (int k0 = 0; k0 < f->n_head; k0 += m->head_cap) {
        const int nk = f->n_head - k0 < m->head_cap ? f->n_head - k0 : m->head_cap;
        rc = head_pass(f, k0, nk);
        if (!rc) rc = copy_head(f, k0, nk);
        if (rc) return rc;
    }
    return 0;
}

/* Everything between the descriptor upload and the copies to the host: what
 * a graph holds (cuda_graphs.cu). */
static int body(void *ctx) {
    qc_fwd *f = (qc_fwd *)ctx;
    qc_model *m = f->m;
    const qwen35_dims *d = &m->d;
    int rc = embed(f);
    if (rc) return rc;
    for (int li = 0; li < d->n_layers; li++) {
        const qc_layer *L = &m->w.layers[li];
        if ((rc = norm_rows(f, m->x, L->input_norm, f->R, m->xn, 1))) return rc;
        if ((rc = L->is_attn ? qc_attn_layer(f, L) : qc_gdn_layer(f, L))) return rc; /* each adds into x */
        if ((rc = norm_rows(f, m->x, L->post_norm, f->R, m->xn, 1))) return rc;
        if ((rc = d->moe ? qc_moe_layer(f, L) : qc_ffn_layer(f, L))) return rc;
        if (f->n_tap && (rc = write_taps(f, li))) return rc;
    }
    return head(f);
}

/* The forward's graph shape key (cuda_graphs.cu), or 0 when it runs eagerly:
 * graphs off, embedding overrides (host copies), chunked GDN lanes or more
 * than QC_GRAPH_LANES lanes (prefill: its kernels are long, launches do not
 * matter), LOGITS and TOP rows beyond one lm_head pass.  Sets every attention
 * call's max_ctx to the key's context bucket: the longest context rounded up
 * to a power of two (at least 1,024, at most the pool's). */
static int graph_key(qc_fwd *f, int *key) {
    qc_model *m = f->m;
    const splash_batch *b = f->b;
    if (!m->use_graphs || f->n_chunked || b->n_lanes > QC_GRAPH_LANES || f->n_head > m->head_cap) return 0;
    for (int r = 0; r < f->R; r++)
        if (b->rows[r].embed) return 0;
    int ctx = 0;
    for (int c = 0; c < f->n_chunks; c++)
        if (m->chunks[c].max_ctx > ctx) ctx = m->chunks[c].max_ctx;
    int bucket = 0;
    if (f->n_chunks) {
        bucket = 1024;
        while (bucket < ctx) bucket *= 2;
        if (bucket > m->ctx_cap) bucket = m->ctx_cap;
        for (int c = 0; c < f->n_chunks; c++) m->chunks[c].max_ctx = bucket;
    }
    int n = 0;
    key[n++] = 1; /* a forward (commit keys start with 2) */
    key[n++] = f->R, key[n++] = b->n_lanes, key[n++] = f->n_head, key[n++] = f->n_tap, key[n++] = bucket;
    key[n++] = f->n_top ? b->top_k : 0;
    for (int i = 0; i < b->n_lanes; i++) key[n++] = b->lanes[i].n_rows * 2 + (b->lanes[i].mode == SPLASH_LANE_VERIFY);
    return n;
}

static int run(qc_fwd *f) {
    qc_model *m = f->m;
    const cudaStream_t s = (cudaStream_t)m->stream;
    const size_t up = build_desc(f);
    SPLASH_CUDA_TRY(cudaMemcpyAsync(m->desc_dev, m->desc_host, up, cudaMemcpyHostToDevice, s));
    /* DEVICE_TOKEN rows: their tokens copied into the descriptor on the device, a run
     * of consecutive rows (a lane's proposals) a copy */
    const splash_batch *b = f->b;
    for (int r0 = 0, r1; b->device_tokens && r0 < f->R; r0 = r1) {
        r1 = r0 + 1;
        if (!(b->rows[r0].flags & SPLASH_ROW_DEVICE_TOKEN)) continue;
        while (r1 < f->R && (b->rows[r1].flags & SPLASH_ROW_DEVICE_TOKEN) &&
               b->rows[r1].token == b->rows[r0].token + (r1 - r0))
            r1++;
        SPLASH_CUDA_TRY(cudaMemcpyAsync(qc_desc_i32(m, m->plan.tok) + r0, b->device_tokens + b->rows[r0].token,
                                        (size_t)(r1 - r0) * sizeof(int32_t), cudaMemcpyDeviceToDevice, s));
    }
    int key[QC_GRAPH_KEY_MAX];
    const int nk = graph_key(f, key);
    int rc = nk ? qc_graph_run(&m->graphs, qc_graph_find(&m->graphs, key, nk), body, f) : body(f);
    if (rc) return rc;
    /* what a greedy decision on the device reads (c_commit_greedy): every head row's TOP entries
     * in top_ids when the head was one pass; the rows' tokens stay in the descriptor */
    m->dec_top_k = f->n_top && f->n_head <= m->head_cap ? b->top_k : 0;
    m->dec_n_head = f->n_head, m->dec_rows = f->R;
    /* deferred and decidable on the device: the caller reads no host output (model.h), so
     * nothing is copied (a copy to pageable memory would wait for the forward) nor waited for */
    const bool defer = b->defer && m->dec_top_k;
    if (!defer && f->n_head && f->n_head <= m->head_cap && (rc = copy_head(f, 0, f->n_head))) return rc;
    if (f->n_tap && f->b->taps) /* else they stay in m->taps (batch.taps_on_device: a draft on this device) */
        SPLASH_CUDA_TRY(cudaMemcpyAsync(f->b->taps, m->taps, (size_t)f->n_tap * m->n_taps * m->d.hidden * sizeof(float),
                                        cudaMemcpyDeviceToHost, s));
    if (!defer) SPLASH_CUDA_TRY(cudaStreamSynchronize(s));
    return 0;
}

int qc_forward(void *impl, const splash_batch *b, splash_error *err) {
    qc_model *m = (qc_model *)impl;
    int rc = validate(m, b, err);
    if (rc) return rc;
    qc_fwd f;
    memset(&f, 0, sizeof f);
    f.m = m, f.b = b, f.R = b->n_rows;
    m->dec_top_k = 0; /* until this forward's head is queued */
    rc = run(&f);
    if (rc) {
        cudaStreamSynchronize((cudaStream_t)m->stream);
        m->n_pending = 0;
        return splash_fail(err, rc, "forward on the GPU: %s failed (%s)", f.what ? f.what : "a CUDA call",
                           splash_status_name(rc));
    }
    return 0;
}
