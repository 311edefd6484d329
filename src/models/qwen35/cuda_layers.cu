/* cuda_layers.cu - one Qwen3.5 layer's halves on the GPU, each adding its
 * output into the residual x (the CPU's attn.c, gdn.c, ffn.c, op for op):
 *
 *   attention  q|gate, k, v = products(xn) (one stacked matrix when it can be, cuda_model.h); attn_prep (q/gate split, q_norm,
 *              k_norm, rotary); KV write into the lanes' pages; attention with
 *              the sigmoid output gate fused, one call per row chunk (the
 *              workspace bound, cuda_model.cu); x += o_proj(o)
 *   GDN        qkv, z, b, a = products(xn); verify rows' qkv | a | b saved for
 *              commit; conv (state advanced for PREFILL lanes only);
 *              recurrence (decode, verify, short prefill) or chunked kernel
 *              (PREFILL lanes of >= 64 rows, as the CPU) with the gated norm
 *              fused; x += out_proj(y)
 *   FFN        x += down(silu(gate xn) * up xn)
 *   MoE        router and shared-expert gate logits; softmax + top-k; the
 *              routed experts (moe.h: bulk prefill rows on the grouped GEMM,
 *              other runs of <= 16 rows device-driven grouped q4 products,
 *              longer runs host-driven); the shared expert;
 *              fo += sigmoid(s) * shared; x += fo.  When every row is on the
 *              grouped step and the shared expert has the experts' shape
 *              (qc_layer.shared_slot), it is one more slot of each row and
 *              the experts' sum adds x: 6 launches a layer instead of 10
 *
 * A residual add is a q4 product adding into x in its epilogue, or a product
 * into tmp then x = x + tmp: the same bits as the CPU's product accumulating
 * into x (one fp32 addition either way).
 */
#include <math.h>
#include <string.h>

#include "backend/cuda/act.h"
#include "backend/cuda/rope.h"
#include "backend/cuda/rows.h"
#include "models/qwen35/cuda_model.h"

/* x += W in: a q4 W adds in its epilogue (splash_q4_matmul_add), others go
 * through tmp and an add. */
static int residual(qc_fwd *f, const qc_matrix *w, const float *in, size_t ld) {
    qc_model *m = f->m;
    const size_t H = (size_t)m->d.hidden;
    if (w->is_q4) {
        const qc_prod p = {w, m->x, 1};
        QC_TRY(f, qc_products(f, in, ld, &p, 1));
        return 0;
    }
    const qc_prod p = {w, m->tmp, 0};
    QC_TRY(f, qc_products(f, in, ld, &p, 1));
    QC_TRY(f, splash_cuda_add_rows(m->x, H, m->tmp, H, f->R, (int)H, m->stream));
    return 0;
}

int qc_attn_layer(qc_fwd *f, const qc_layer *L) {
    qc_model *m = f->m;
    const qwen35_dims *d = &m->d;
    const int R = f->R, hd = d->head_dim;
    const size_t H = (size_t)d->hidden, qw = (size_t)d->heads * hd, kvw = (size_t)d->kv_heads * hd;
    float *qg = m->u1, *q = m->u2, *k = m->u3, *v = m->u4;
    size_t ldqg = 2 * qw, ldk = kvw; /* k and v share ldk */
    if (L->attn_in.rows) { /* stacked q|gate, k, v */
        const qc_prod in = {&L->attn_in, m->fin, 0};
        QC_TRY(f, qc_products(f, m->xn, H, &in, 1));
        ldqg = ldk = (size_t)L->attn_in.rows;
        qg = m->fin, k = m->fin + L->attn_in.part_row[1], v = m->fin + L->attn_in.part_row[2];
    } else {
        const qc_prod in[3] = {{&L->q_proj, qg, 0}, {&L->k_proj, k, 0}, {&L->v_proj, v, 0}};
        QC_TRY(f, qc_products(f, m->xn, H, in, 3));
    }

    splash_cuda_attn_prep_args pa;
    memset(&pa, 0, sizeof pa);
    pa.qg = qg, pa.ldqg = ldqg;
    pa.q = q, pa.ldq = qw;
    pa.gate = m->agate, pa.ldg = qw;
    pa.k = k, pa.ldk = ldk;
    pa.q_norm = L->q_norm, pa.k_norm = L->k_norm, pa.norm_offset = 0.f; /* stored factors (1 + w) */
    pa.eps = d->rms_eps;
    pa.inv_freq = m->w.inv_freq;
    pa.pos = qc_desc_i32(m, m->plan.pos);
    pa.rows = R, pa.heads = d->heads, pa.kv_heads = d->kv_heads, pa.head_dim = hd, pa.rot_dim = d->rotary_dim;
    /* the norms and inv_freq are weights and the positions, lanes and page tables the
     * descriptor's (uploaded before the forward): no kernel writes them */
    const int early = splash_cuda_attn_early_loads();
    pa.early = early;
    QC_TRY(f, splash_cuda_attn_prep(&pa, m->stream));

    const splash_cuda_attn_lane *whole = (const splash_cuda_attn_lane *)(m->desc_dev + m->plan.alanes);
    QC_TRY(f, splash_cuda_kv_write(&m->kv, m->kv_pool, L->index, whole, f->b->n_lanes, R, k, ldk, v, ldk, early,
                                   m->stream));

    const splash_cuda_attn_lane *cut = (const splash_cuda_attn_lane *)(m->desc_dev + m->plan.clanes);
    for (int c = 0; c < f->n_chunks; c++) {
        const qc_chunk *ch = &m->chunks[c];
        splash_cuda_attn_args a;
        memset(&a, 0, sizeof a);
        a.layout = &m->kv, a.pool = m->kv_pool, a.layer = L->index;
        a.lanes = cut + (size_t)c * m->max_lanes, a.n_lanes = ch->n_lanes;
        a.rows = ch->r1 - ch->r0, a.min_lane_rows = ch->min_lane_rows, a.max_lane_rows = ch->max_lane_rows;
        a.max_ctx = ch->max_ctx;
        a.n_heads = d->heads;
        a.q = q + (size_t)ch->r0 * qw, a.ldq = qw;
        a.gate = m->agate + (size_t)ch->r0 * qw, a.ldg = qw;
        a.out = m->aout + (size_t)ch->r0 * qw, a.ldo = qw;
        a.scale = (float)pow((double)hd, -0.5);
        a.split = ch->split;
        a.workspace = m->attn_ws, a.workspace_bytes = m->attn_ws_bytes;
        QC_TRY(f, splash_cuda_attention(&a, m->stream));
    }
    return residual(f, &L->o_proj, m->aout, qw);
}

int qc_gdn_layer(qc_fwd *f, const qc_layer *L) {
    qc_model *m = f->m;
    const qwen35_dims *d = &m->d;
    const int R = f->R, gi = L->index;
    const size_t H = (size_t)d->hidden, C = (size_t)d->conv_dim, VD = (size_t)d->value_dim, Hv = (size_t)d->hv;
    float *qkv = m->u1, *mixed = m->u2, *z = m->u3, *y = m->u4, *ga = m->ga, *gb = m->gb;
    size_t ldqkv = C, ldz = VD, ldab = Hv;
    if (L->gdn_in.rows) { /* stacked qkv, z, b, a */
        const qc_prod in = {&L->gdn_in, m->fin, 0};
        QC_TRY(f, qc_products(f, m->xn, H, &in, 1));
        ldqkv = ldz = ldab = (size_t)L->gdn_in.rows;
        const int *pr = L->gdn_in.part_row;
        qkv = m->fin, z = m->fin + pr[1], gb = m->fin + pr[2], ga = m->fin + pr[3];
    } else {
        const qc_prod in[4] = {{&L->in_qkv, qkv, 0}, {&L->in_z, z, 0}, {&L->in_b, gb, 0}, {&L->in_a, ga, 0}};
        QC_TRY(f, qc_products(f, m->xn, H, in, 4));
    }

    if (f->n_vrows) { /* what commit replays: pre-conv qkv | a | b */
        const int32_t *map = qc_desc_i32(m, m->plan.vmap);
        float *save = m->vsave + (size_t)gi * m->verify_cap * m->vsave_row;
        QC_TRY(f, splash_cuda_scatter_rows(qkv, ldqkv, map, R, save, m->vsave_row, (int)C, m->stream));
        QC_TRY(f, splash_cuda_scatter_rows(ga, ldab, map, R, save + C, m->vsave_row, (int)Hv, m->stream));
        QC_TRY(f, splash_cuda_scatter_rows(gb, ldab, map, R, save + C + Hv, m->vsave_row, (int)Hv, m->stream));
    }

    /* The states and weights read before the conv's and the recurrence's
     * programmatic waits (splash_q4_early_loads): only when the last launch
     * before the conv without the attribute is a q4 product (it starts after
     * every earlier kernel, every writer of these states among them, has
     * completed; the verify's scatters after it write none of them), i.e. no
     * bulk prefill rows on the GEMM and q4 inputs. */
    const int q4_in = L->gdn_in.rows ? L->gdn_in.is_q4
                                     : L->in_qkv.is_q4 && L->in_z.is_q4 && L->in_b.is_q4 && L->in_a.is_q4;
    const int early = splash_q4_early_loads() && q4_in && !f->n_bulk;
    const splash_cuda_gdn_lane *lanes =
        (const splash_cuda_gdn_lane *)(m->desc_dev + m->plan.glanes) + (size_t)gi * m->max_lanes;
    QC_TRY(f, splash_cuda_gdn_conv(L->conv_t, (int)C, d->conv_kernel, lanes, f->b->n_lanes, f->max_lane_rows, qkv,
                                   ldqkv, mixed, C, early, m->stream));
    splash_cuda_gdn_args a;
    memset(&a, 0, sizeof a);
    a.hk = d->hk, a.hv = d->hv, a.dk = d->dk, a.dv = d->dv;
    a.mixed = mixed, a.ldm = C;
    a.a = ga, a.b = gb, a.ldab = ldab;
    a.neg_a = L->neg_a, a.dt_bias = L->dt_bias;
    a.z = z, a.ldz = ldz, a.norm_w = L->gnorm, a.y = y, a.ldy = VD;
    a.eps = d->rms_eps;
    a.early = early;
    if (f->n_rec) {
        a.lanes = lanes, a.n_lanes = f->n_rec;
        QC_TRY(f, splash_cuda_gdn_recurrent(&a, m->stream));
    }
    if (f->n_chunked) {
        a.lanes = lanes + f->n_rec, a.n_lanes = f->n_chunked;
        a.ws = m->gdn_ws, a.ws_floats = m->gdn_ws_floats, a.max_lane_rows = f->max_lane_rows;
        QC_TRY(f, splash_cuda_gdn_chunked(&a, m->stream));
    }
    return residual(f, &L->out_proj, y, VD);
}

/* g = silu(g) * u in place, prepared for the down product when it can be
 * (splash_q4_prep_silu_mul); with one bulk range long enough for cuBLASLt,
 * its rows' largest |g| found too, for the down product's uniform
 * preparation (q4_gemm_rows then skips that amax pass: 27B, 32,768 rows,
 * ~0.5 ms a layer). */
static int silu_mul(qc_fwd *f, float *g, size_t ldg, const float *u, size_t ldu, int width) {
    qc_model *m = f->m;
    m->xp_src = nullptr, m->ax_src = nullptr;
    if (qc_prep_ok(m, width)) {
        if (const qc_rows *b = qc_blas_bulk(f)) {
            QC_TRY(f, splash_q4_prep_silu_mul_amax(&m->xp, &m->gx, b->r0, b->r1, g, ldg, u, ldu, g, ldg, f->R, width,
                                                   m->stream));
            m->ax_src = g, m->ax_ld = ldg, m->ax_r0 = b->r0, m->ax_r1 = b->r1;
        } else {
            QC_TRY(f, splash_q4_prep_silu_mul(&m->xp, g, ldg, u, ldu, g, ldg, f->R, width, m->stream));
        }
        m->xp_src = g, m->xp_ld = ldg;
        return 0;
    }
    QC_TRY(f, splash_cuda_silu_mul(g, ldg, u, ldu, g, ldg, f->R, width, m->stream));
    return 0;
}

/* silu(gate xn) * up xn for the FFN's (or the shared expert's) gate / up:
 * stacked or apart; *h and *ldh: where it is. */
static int swiglu(qc_fwd *f, const qc_matrix *stack, const qc_matrix *gate, const qc_matrix *up, int width, float **h,
                  size_t *ldh) {
    qc_model *m = f->m;
    const size_t H = (size_t)m->d.hidden, I = (size_t)width;
    int rc;
    if (stack->rows) {
        const qc_prod in = {stack, m->fin, 0};
        const size_t ld = (size_t)stack->rows;
        QC_TRY(f, qc_products(f, m->xn, H, &in, 1));
        if ((rc = silu_mul(f, m->fin, ld, m->fin + stack->part_row[1], ld, width))) return rc;
        *h = m->fin, *ldh = ld;
        return 0;
    }
    const qc_prod in[2] = {{gate, m->ff1, 0}, {up, m->ff2, 0}};
    QC_TRY(f, qc_products(f, m->xn, H, in, 2));
    if ((rc = silu_mul(f, m->ff1, I, m->ff2, I, width))) return rc;
    *h = m->ff1, *ldh = I;
    return 0;
}

int qc_ffn_layer(qc_fwd *f, const qc_layer *L) {
    float *h;
    size_t ldh;
    int rc = swiglu(f, &L->ffn_in, &L->gate, &L->up, f->m->d.intermediate, &h, &ldh);
    if (rc) return rc;
    return residual(f, &L->down, h, ldh);
}

/* The routed experts of rows [r0, r1) into fo: bulk prefill rows on the
 * GEMM; the others device-driven (no host sync: graphs), 16 rows at a time
 * (several verify lanes: each 16 with its own plan, so an expert shared by
 * their slots is read once per 4 of them), on xn's prepared form from the
 * norm when it holds these rows.  Per row the same bits as the host-driven
 * step (splash_cuda_moe_experts), so a row's numbers depend on its lane only.
 * shared (rows [0, R <= 16) only): the route appended the shared expert
 * (expert E) to each row, and the sum also adds x += fo. */
static int moe_experts(qc_fwd *f, const qc_layer *L, int r0, int r1, int bulk, const int32_t *plan, int shared) {
    qc_model *m = f->m;
    const qwen35_dims *d = &m->d;
    const size_t H = (size_t)d->hidden, K = (size_t)d->top_k + (shared ? 1 : 0); /* slots a row */
    const int n = r1 - r0;
    if (n <= 0) return 0;
    if (!bulk && n > SPLASH_Q4_MAX_M) {
        for (int c = r0; c < r1; c += SPLASH_Q4_MAX_M) {
            const int c1 = r1 - c < SPLASH_Q4_MAX_M ? r1 : c + SPLASH_Q4_MAX_M;
            QC_TRY(f, splash_q4_group_plan(m->topi + (size_t)c * K, (c1 - c) * (int)K, d->experts, m->moe.plan, m->stream));
            int rc = moe_experts(f, L, c, c1, 0, m->moe.plan, 0);
            if (rc) return rc;
        }
        return 0;
    }
    const int32_t *idx = m->topi + (size_t)r0 * K;
    const float *w = m->topw + (size_t)r0 * K, *xn = m->xn + (size_t)r0 * H;
    float *fo = m->fo + (size_t)r0 * H;
    if (bulk)
        return splash_cuda_moe_experts_gemm(L->experts_gate, L->experts_up, L->experts_down, d->experts, idx, w, n, xn, H,
                                            fo, H, &m->moe, m->stream);
    if (r0 || m->xp_src != m->xn || m->xp_ld != H || m->xp.cols != (int)H || m->xp.M != n) {
        int rc = splash_q4_prep_x(&m->xp, xn, n, (int)H, (int)H, m->stream);
        if (rc) return rc;
        m->xp_src = r0 ? nullptr : m->xn, m->xp_ld = H;
    }
    /* the residual's sum left to the next RMS norm (qc_fwd.moe_sum_rows): rows [0, n) */
    const int defer = shared && !r0 && splash_q4_moe_norm();
    QC_TRY(f, splash_cuda_moe_experts_grouped(L->experts_gate, L->experts_up, L->experts_down, d->experts + shared, idx,
                                              w, plan, n, (int)K, &m->xp, defer ? nullptr : fo, H,
                                              shared ? m->x + (size_t)r0 * H : nullptr, H, &m->moe, m->stream));
    if (defer) {
        const splash_q4_moe_sum ms = {m->moe.smo, H, w, (int)K, fo, H};
        f->moe_sum = ms, f->moe_sum_rows = n;
    }
    return 0;
}

int qc_moe_sum_flush(qc_fwd *f) {
    if (!f->moe_sum_rows) return 0;
    qc_model *m = f->m;
    const size_t H = (size_t)m->d.hidden;
    const int rows = f->moe_sum_rows;
    f->moe_sum_rows = 0;
    QC_TRY(f, splash_cuda_moe_sum(&f->moe_sum, rows, (int)H, m->x, H, m->stream));
    return 0;
}

int qc_moe_layer(qc_fwd *f, const qc_layer *L) {
    qc_model *m = f->m;
    const qwen35_dims *d = &m->d;
    const int R = f->R;
    const size_t H = (size_t)d->hidden, E = (size_t)d->experts;
    const float *sgate = m->sgate; /* the shared-expert gate's logits, stride lds */
    size_t ldl = E, lds = 1;
    if (L->gates_in.rows) { /* stacked: one launch */
        const qc_prod in = {&L->gates_in, m->rlog, 0};
        QC_TRY(f, qc_products(f, m->xn, H, &in, 1));
        ldl = lds = (size_t)L->gates_in.rows, sgate = m->rlog + L->gates_in.part_row[1];
    } else {
        const qc_prod gates[2] = {{&L->router, m->rlog, 0}, {&L->shared_expert_gate, m->sgate, 0}};
        QC_TRY(f, qc_products(f, m->xn, H, gates, 2));
    }
    if (m->hash_route) /* benchmarks: experts at random per (layer, position) (moe.h) */
        QC_TRY(f, splash_cuda_moe_hash_logits(m->rlog, ldl, R, d->experts, qc_desc_i32(m, m->plan.pos),
                                              L->is_attn * 1024 + L->index, m->stream)); /* salt: the layer */
    /* Every row on the grouped step (decode, verify: moe_experts' choice):
     * the shared expert runs as one more slot of each row (expert E, weight
     * sigmoid of its gate logit) and the experts' sum adds the residual, 6
     * launches instead of 10 (the shared expert's two products, its silu
     * prep and the add; the same sums in ffn.c's order). */
    const int grouped_all = R <= SPLASH_Q4_MAX_M && !(f->n_bulk && L->experts_gemm); /* one grouped run, rows [0, R) */
    /* several rows: the route also groups the slots by expert, so an expert
     * chosen by several rows is read once for up to 4 of them (verify) */
    int32_t *plan = grouped_all && R > 1 ? m->moe.plan : nullptr;
    const int shared = L->shared_slot && grouped_all;
    QC_TRY(f, splash_cuda_moe_route(m->rlog, ldl, R, d->experts, d->top_k, d->norm_topk, shared ? d->experts : -1,
                                    sgate, lds, m->topi, m->topw, plan, m->stream));
    if (shared) {
        QC_TRY(f, moe_experts(f, L, 0, R, 0, plan, 1));
        return 0;
    }
    int r = 0; /* rows before r are done: bulk prefill ranges on the GEMM, the rest between them */
    for (int i = 0; i < f->n_bulk && L->experts_gemm; i++) {
        QC_TRY(f, moe_experts(f, L, r, m->bulk[i].r0, 0, nullptr, 0));
        QC_TRY(f, moe_experts(f, L, m->bulk[i].r0, m->bulk[i].r1, 1, nullptr, 0));
        r = m->bulk[i].r1;
    }
    QC_TRY(f, moe_experts(f, L, r, R, 0, plan, 0)); /* plan: r == 0 here (grouped_all) */
    float *h;
    size_t ldh;
    int rc = swiglu(f, &L->ffn_in, &L->shared_gate, &L->shared_up, d->shared_inter, &h, &ldh);
    if (rc) return rc;
    const qc_prod down = {&L->shared_down, m->mo, 0};
    QC_TRY(f, qc_products(f, h, ldh, &down, 1));
    QC_TRY(f, splash_cuda_moe_shared_add(m->fo, H, m->mo, H, sgate, lds, m->x, H, R, (int)H, m->stream));
    return 0;
}
