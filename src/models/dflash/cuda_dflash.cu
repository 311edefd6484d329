/* cuda_dflash.cu - the DFlash drafts on the CUDA backend (see cuda_dflash.h).
 *
 * The forward is dflash.c's / dflash2.c's, op for op:
 *   block input   [anchor, MASK x (B-1)] embedded on the host (the anchor's
 *                 row dequantised as dflash_ctx.c does, the MASK row once),
 *                 times the v2 embedding scale, two rows uploaded and
 *                 gathered into the block;
 *   each layer    norm; (v2: kernel projection, conv side 0); q, k, v; q/k
 *                 norm and rotary; block attention over the lane's ring and
 *                 the block; o_proj (v2: conv side 1); residual; the same
 *                 around the SwiGLU MLP;
 *   the head      final norm, lm_head over rows 1..B-1, then per version
 *                 (cuda_dflash.h).
 * The draft's weights are its own upload but for the lm_head it shares
 * with the target: opened by the engine (share_target), it reads the CUDA
 * model's device copy (bind_model, splash_model_device_weight: ~0.7 GB of
 * the 27B's not uploaded twice); opened alone (tests, bench --draft) it
 * uploads its own.  The target's embedding stays on the host (two rows a
 * block).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "backend/cpu/cpu.h"
#include "models/dflash/dflash.h"
#include "models/dflash/dflash2.h"
#include "models/dflash/dflash2_draft.h"
#include "models/dflash/dflash_ctx.h"
#include "models/dflash/dflash_lanes.h"
#include "runtime/draft.h"
#include "runtime/model.h"
}
#include "backend/cuda/act.h"
#include "backend/cuda/argmax.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dflash.h"
#include "backend/cuda/norm.h"
#include "backend/cuda/rope.h"
#include "backend/cuda/rows.h"
#include "models/dflash/cuda_dflash.h"
#include "models/qwen35/cuda_model.h"

namespace {

/* One layer's weights on the device. */
struct DLayer {
    const float *input_norm, *post_norm, *q_norm, *k_norm; /* fp32 factors */
    qc_matrix q, k, v, o, gate, up, down;
    qc_matrix qkv, gu;                                      /* q|k|v and gate|up stacked (rows 0: apart, above) */
    const float *attn_base, *ffn_base;                      /* v2: [2][K][H] */
    qc_matrix attn_proj, ffn_proj;                          /* v2: [2*K*G, H] */
};

/* The per-call descriptor: pinned on the host, mirrored on the device,
 * uploaded with one copy.  Byte offsets (256-aligned).  A forward drafts the
 * blocks of up to `lanes` requests together (Blk below). */
struct Desc {
    size_t pos;   /* int32 [R] positions of the blocks' rows (an append pass has its own: adesc_h) */
    size_t gidx;  /* int32 [R] each row's input: block i's anchor row i, every MASK row `lanes` */
    size_t emb;   /* float [lanes + 1][H] the blocks' anchors' input rows, then the MASK's */
    size_t hrow;  /* int32 [Rh] the rows of the proposals' hidden states (every block's rows 1..B-1) */
    size_t ids;   /* int32 [lanes][1 + max_block * top_k] per block: anchor, then each row's candidates */
    size_t ctx;   /* int32 [lanes][2] per block: its lane's n_ctx and lo (the block attention reads them) */
    size_t bytes;
};

/* One request's block in a forward of several: its rows row0 .. row0+B-1 of
 * the activations ([anchor, MASK x (B-1)]), its proposals' hidden states and
 * logits rows hrow0 .. hrow0+B-2 of the head's buffers. */
struct Blk {
    const splash_dflash_kv *kv;
    int32_t anchor;
    int B, row0, hrow0;
    int lane;
    int held;                        /* context positions the attention's launch covers (a bucket: graphs) */
};

/* One lane's rows in an append pass of several: taps [rows][n_in] for
 * positions pos0.. (end: the position after the lane's whole append, which
 * decides what its rings keep), at rows row0.. of the pass. */
struct ABlk {
    splash_dflash_kv *kv;
    const float *taps;
    int rows, pos0, end, row0;
};

struct CDraft {
    splash_dflash_lanes ln;          /* first: dflash_lanes.c's ops take the impl as it */
    splash_dflash *m1;               /* the CPU draft (v1), or */
    splash_dflash2 *m2;              /* (v2): dims and bound tensors */
    splash_dflash_ctx *c;
    int v2;
    splash_dflash_kv *kv;            /* [lanes] rings in device memory */
    void *rings;                     /* the lanes' rings, one allocation */
    cudaStream_t stream;
    /* weights */
    void *wdev;
    size_t wbytes;
    int max_q4_cols;
    int share_head;                  /* lm_head not in wdev: bind_model gives the target's, or its own in head_dev */
    void *head_dev;                  /* its own lm_head when the target keeps none */
    qc_matrix fc, lm_head, hidden_proj, pred, succ;
    const float *hidden_norm, *norm, *inv_freq;
    DLayer layers[SPLASH_DFLASH_MAX_LAYERS];
    /* dims */
    int H, qw, kvw, I, P, K, group, rank, top_k, V, n_in;
    int R;                           /* rows of a forward: the blocks drafted together, or an append chunk */
    int Rh;                          /* proposals' rows of a forward (the head's): at most lanes x (max_block - 1) */
    float embed_scale, mult, softcap;
    /* scratch (one device allocation) */
    void *scratch;
    size_t scratch_bytes;
    float *x, *xn, *xc, *t, *q, *k, *v, *o, *ff, *ff2, *dyn, *in, *hid, *logits, *gate, *pv, *sv, *edges, *cval;
    float *stk;                      /* [R][stk_cols] a stacked product's outputs (q|k|v, then gate|up) */
    int stk_cols;                    /* the widest stack's rows */
    int32_t *ncand, *tok, *cand;     /* [Rc] candidates a row, [Rh] argmax, [Rc][top_k] v1's candidates */
    void *ws;                        /* argmax / top-k */
    size_t ws_bytes;
    void *attn_ws;                   /* the block attention's key tiles */
    size_t attn_ws_bytes;
    splash_q4_xprep xp;
    const float *xp_src;             /* what xp holds (qc_products_xp_src), or NULL */
    size_t xp_ld;
    /* descriptor and results (pinned) */
    Desc dp;
    uint8_t *desc_h, *desc_d;
    cudaEvent_t desc_up;             /* recorded after each upload of desc_h: rewrite it only once that ran */
    /* The append passes' descriptors, two in turn, apart from desc_h so that neither a pass nor the
     * next blocks wait on the host for the other's graph (its upload is the graph's first node, its
     * event recorded after the graph): int32 [R] positions at 0, lanes (-1: the padding up to the
     * pass's bucket) at arow, and each row's lane's end (the position after its rows) at 2 arow. */
    uint8_t *adesc_h[2], *adesc_d[2];
    cudaEvent_t adesc_up[2];
    size_t arow;
    int aslot;                       /* the slot the next pass fills */
    cudaStream_t taps_stream;        /* where the target writes the device taps (bind_device_taps), or NULL */
    cudaEvent_t in_free, taps_in;    /* the draft is done with `in` / the taps' copy into it ran (on taps_stream) */
    cudaEvent_t props_out;           /* propose_device's proposals are written (tok) and copied (h_tok) */
    int dev_m;                       /* propose_device's blocks (blk[0..dev_m)) awaiting fetch_proposals, or 0 */
    int32_t *h_tok, *h_ncand, *h_cand;
    float *h_edges;
    float *mask_row;                 /* host [H] */
    void *pinned;
    splash_dflash2_row rows[SPLASH_DRAFT_MAX_BLOCK];
    Blk *blk;                        /* [lanes] the blocks of one forward (propose_lanes) */
    ABlk *ablk;                      /* [lanes] the lanes of one append pass (append_lanes) */
    int *who;                        /* [lanes] ... and their requests */
    qc_graph_set graphs;             /* the blocks' forwards by shape (cuda_graphs.cu) */
    qc_graph_set agraphs;            /* the append passes by row bucket */
    int use_graphs, append_graphs;   /* append_graphs: SPLASH_DRAFT_APPEND_GRAPHS=0 runs the passes eagerly (an A/B) */
};

size_t up256(size_t n) { return (n + 255) & ~(size_t)255; }

/* v1 at T > 0: the candidates of a row's sparse q (the softmax over its top
 * logits; the rest of the vocabulary gets q = 0, which rejection sampling
 * allows).  32 keep nearly all of a trained draft's mass at T <= 1 while the
 * top-k stays a few tens of microseconds. */
constexpr int kV1Candidates = 32;

#define TRY(x)                                                                                                         \
    do {                                                                                                               \
        int rc_ = (x);                                                                                                 \
        if (rc_) return rc_;                                                                                           \
    } while (0)

/* ---- weights ---------------------------------------------------------------------- */

int upload_walk(qc_upload *w, void *ctx) {
    CDraft *d = (CDraft *)ctx;
    const splash_dflash_ctx *c = d->c;
    const splash_dflash_dims *dm = &c->d;
    const size_t H = (size_t)dm->hidden, hd = (size_t)dm->head_dim;
    TRY(qc_upload_matrix(w, c->fc, &d->fc));
    if (!d->share_head) TRY(qc_upload_matrix(w, c->lm_head, &d->lm_head));
    TRY(qc_upload_vec(w, c->hidden_norm, H, "draft.hidden_norm", &d->hidden_norm));
    TRY(qc_upload_vec(w, c->norm, H, "draft.norm", &d->norm));
    float inv[SPLASH_CUDA_MAX_HEAD_DIM / 2];
    splash_cuda_rope_inv_freq(inv, dm->head_dim, dm->rope_theta);
    TRY(qc_upload_vec(w, inv, hd / 2, "draft inv_freq", &d->inv_freq));
    for (int l = 0; l < dm->n_layers; l++) {
        const splash_dflash_layer *L = &c->layers[l];
        DLayer *o = &d->layers[l];
        TRY(qc_upload_vec(w, L->input_norm, H, "draft input_norm", &o->input_norm));
        TRY(qc_upload_vec(w, L->post_norm, H, "draft post_norm", &o->post_norm));
        TRY(qc_upload_vec(w, L->q_norm, hd, "draft q_norm", &o->q_norm));
        TRY(qc_upload_vec(w, L->k_norm, hd, "draft k_norm", &o->k_norm));
        /* the matrices that read one input stacked as the target's (one launch each) */
        const splash_tensor *qkv[3] = {L->q_proj, L->k_proj, L->v_proj}, *gu[2] = {L->gate, L->up};
        qc_matrix *const qkv_apart[3] = {&o->q, &o->k, &o->v}, *const gu_apart[2] = {&o->gate, &o->up};
        TRY(qc_upload_inputs(w, qkv, 3, &o->qkv, qkv_apart));
        TRY(qc_upload_inputs(w, gu, 2, &o->gu, gu_apart));
        if (o->qkv.rows > d->stk_cols) d->stk_cols = o->qkv.rows;
        if (o->gu.rows > d->stk_cols) d->stk_cols = o->gu.rows;
        TRY(qc_upload_matrix(w, L->o_proj, &o->o));
        TRY(qc_upload_matrix(w, L->down, &o->down));
        if (d->v2) {
            const splash_dflash2_conv_weights *cw = splash_dflash2_layer_conv(d->m2, l);
            const size_t base = 2 * (size_t)d->K * H;
            TRY(qc_upload_vec(w, cw->attn_base, base, "draft attn_conv.base", &o->attn_base));
            TRY(qc_upload_vec(w, cw->ffn_base, base, "draft ffn_conv.base", &o->ffn_base));
            TRY(qc_upload_matrix(w, cw->attn_proj, &o->attn_proj));
            TRY(qc_upload_matrix(w, cw->ffn_proj, &o->ffn_proj));
        }
    }
    if (d->v2) {
        const splash_dflash2_selector *sel = splash_dflash2_get_selector(d->m2);
        TRY(qc_upload_matrix(w, splash_dflash2_hidden_proj(d->m2), &d->hidden_proj));
        TRY(qc_upload_matrix(w, sel->pred_codebook, &d->pred));
        TRY(qc_upload_matrix(w, sel->succ_codebook, &d->succ));
    }
    return 0;
}

/* ---- products ------------------------------------------------------------------------ */

/* Every product of the draft goes through here, so d->xp_src always says
 * what the prepared activation holds (a fused producer below, or the last
 * product's input). */
int products(CDraft *d, const float *x, size_t ldx, int R, const qc_prod *p, int n) {
    return qc_products_xp_src(&d->xp, &d->xp_src, d->xp_ld, d->stream, x, ldx, R, p, n);
}

int prod(CDraft *d, const float *x, size_t ldx, int R, const qc_matrix *w, float *y) {
    const qc_prod p = {w, y, 0};
    return products(d, x, ldx, R, &p, 1);
}

/* y += W x (the residual): q4 adds in the product's epilogue; others through t. */
int prod_add(CDraft *d, const float *x, size_t ldx, int R, const qc_matrix *w, float *y) {
    if (w->is_q4) {
        const qc_prod p = {w, y, 1};
        return products(d, x, ldx, R, &p, 1);
    }
    TRY(prod(d, x, ldx, R, w, d->t));
    return splash_cuda_add_rows(y, (size_t)d->H, d->t, (size_t)d->H, R, d->H, d->stream);
}

/* 1 when rows of `cols` floats feeding the q4 matrix w can be made by a
 * fused producer (one launch: the op and the product's preparation). */
bool fused_prep_ok(const CDraft *d, const qc_matrix *w, int cols) {
    return w->is_q4 && d->max_q4_cols >= cols && cols <= SPLASH_Q4_MAX_COLS && cols % SPLASH_Q4_GROUP == 0;
}

/* y = rmsnorm(x) * w per row (w: factors, as the CPU draft stores them);
 * prepared for `next` (the product that reads y) in the same launch when it
 * is q4. */
int norm_rows(CDraft *d, const float *x, float *y, const float *w, int rows, const qc_matrix *next = nullptr) {
    if (next && fused_prep_ok(d, next, d->H)) {
        d->xp_src = nullptr;
        TRY(splash_q4_prep_rmsnorm(&d->xp, x, (size_t)d->H, w, d->c->d.rms_eps, y, (size_t)d->H, rows, d->H,
                                   d->stream));
        d->xp_src = y, d->xp_ld = (size_t)d->H;
        return 0;
    }
    d->xp_src = nullptr; /* y may be what xp was prepared from */
    return splash_cuda_rmsnorm(x, (size_t)d->H, 0, y, (size_t)d->H, 0, w, 0.0f, d->H, rows, 1, d->c->d.rms_eps,
                               d->stream);
}

/* Where a layer's q, k and v rows are: the parts of its stack's output or
 * their own buffers (row strides ldq, ldkv). */
struct QKV {
    float *q, *k, *v;
    size_t ldq, ldkv;
};

/* q, k, v (q only when with_q; a stack makes all three) of rows of x. */
int qkv_products(CDraft *d, const DLayer *L, const float *x, int rows, bool with_q, QKV *o) {
    if (L->qkv.rows) {
        const qc_prod p = {&L->qkv, d->stk, 0};
        TRY(products(d, x, (size_t)d->H, rows, &p, 1));
        const size_t ld = (size_t)L->qkv.rows;
        *o = {d->stk + L->qkv.part_row[0], d->stk + L->qkv.part_row[1], d->stk + L->qkv.part_row[2], ld, ld};
        return 0;
    }
    *o = {d->q, d->k, d->v, (size_t)d->qw, (size_t)d->kvw};
    const qc_prod p[3] = {{&L->k, d->k, 0}, {&L->v, d->v, 0}, {&L->q, d->q, 0}};
    return products(d, x, (size_t)d->H, rows, p, with_q ? 3 : 2);
}

/* q/k norm per head and rotary of `rows` rows of k (and q when q is set) at
 * positions pos, in place: one launch (the target's attention prep on plain
 * q heads: rmsnorm with the stored factors, then the rotary over the whole head). */
int qk_prep(CDraft *d, const DLayer *L, float *q, size_t ldq, float *k, size_t ldk, int rows, const int32_t *pos) {
    const splash_dflash_dims *dm = &d->c->d;
    splash_cuda_attn_prep_args a = {};
    a.qg = q, a.ldqg = ldq, a.qhs = (size_t)dm->head_dim, a.q = q, a.ldq = ldq;
    a.k = k, a.ldk = ldk, a.q_norm = L->q_norm, a.k_norm = L->k_norm, a.norm_offset = 0.0f;
    a.eps = dm->rms_eps, a.inv_freq = d->inv_freq, a.pos = pos, a.rows = rows, a.heads = q ? dm->heads : 0;
    a.kv_heads = dm->kv_heads, a.head_dim = dm->head_dim, a.rot_dim = dm->head_dim;
    return splash_cuda_attn_prep(&a, d->stream);
}

/* Where a layer's gate and up rows are (row stride ld): its stack's output or ff, ff2. */
struct GU {
    float *g, *u;
    size_t ld;
};

int gu_products(CDraft *d, const DLayer *L, const float *x, int rows, GU *o) {
    if (L->gu.rows) {
        const qc_prod p = {&L->gu, d->stk, 0};
        *o = {d->stk + L->gu.part_row[0], d->stk + L->gu.part_row[1], (size_t)L->gu.rows};
        return products(d, x, (size_t)d->H, rows, &p, 1);
    }
    *o = {d->ff, d->ff2, (size_t)d->I};
    const qc_prod p[2] = {{&L->gate, d->ff, 0}, {&L->up, d->ff2, 0}};
    return products(d, x, (size_t)d->H, rows, p, 2);
}

/* v2: xc = conv side `side` of src, with the sublayer's base kernels and the
 * dynamic ones in dyn (its kernel projection of the normed input), block by
 * block (the conv is causal over a block's rows: blocks drafted together must
 * not see each other). */
int conv(CDraft *d, const float *base, int side, const float *src, const Blk *blk, int n) {
    for (int i = 0; i < n; i++) {
        const size_t r0 = (size_t)blk[i].row0;
        TRY(splash_cuda_dflash_conv(src + r0 * d->H, (size_t)d->H, blk[i].B, d->H, base + (size_t)side * d->K * d->H,
                                    d->dyn + r0 * d->P, (size_t)d->P, side, d->K, d->group, d->xc + r0 * d->H,
                                    (size_t)d->H, d->stream));
    }
    return 0;
}

/* A sublayer's input from the normed residual xn (rows rows): xn itself
 * (v1), or its conv side 0 with the kernels projected from xn (v2). */
int sublayer_in(CDraft *d, const qc_matrix *proj, const float *base, int rows, const Blk *blk, int n,
                const float **in) {
    *in = d->xn;
    if (!d->v2) return 0;
    TRY(prod(d, d->xn, (size_t)d->H, rows, proj, d->dyn));
    TRY(conv(d, base, 0, d->xn, blk, n));
    *in = d->xc;
    return 0;
}

/* The residual after a sublayer: x += W in (v1), or x += conv side 1 of W in (v2). */
int sublayer_out(CDraft *d, const float *in, size_t ld, const qc_matrix *w, const float *base, int rows,
                 const Blk *blk, int n) {
    if (!d->v2) return prod_add(d, in, ld, rows, w, d->x);
    TRY(prod(d, in, ld, rows, w, d->t));
    TRY(conv(d, base, 1, d->t, blk, n));
    return splash_cuda_add_rows(d->x, (size_t)d->H, d->xc, (size_t)d->H, rows, d->H, d->stream);
}

/* ---- blocks ----------------------------------------------------------------------------- */

/* The per-block ids of the descriptor (anchor, then its rows' candidates). */
int32_t *block_ids(CDraft *d, uint8_t *desc, int i) {
    return (int32_t *)(desc + d->dp.ids) + (size_t)i * (1 + (size_t)d->ln.max_block * d->top_k);
}

/* The blocks blk[0..n) (rows laid out one after the other from row 0, each
 * [anchor, MASK x (B-1)] of its lane) into the descriptor (host side): the
 * rows' positions and inputs, the hidden rows, the anchors, each lane's
 * n_ctx and lo.  Waits for the last upload of the descriptor first. */
int blocks_fill(CDraft *d, const Blk *blk, int n) {
    const size_t H = (size_t)d->H;
    SPLASH_CUDA_TRY(cudaEventSynchronize(d->desc_up));
    int32_t *pos = (int32_t *)(d->desc_h + d->dp.pos), *gidx = (int32_t *)(d->desc_h + d->dp.gidx);
    int32_t *hrow = (int32_t *)(d->desc_h + d->dp.hrow), *ctx = (int32_t *)(d->desc_h + d->dp.ctx);
    float *emb = (float *)(d->desc_h + d->dp.emb);
    for (int i = 0; i < n; i++) {
        const Blk &b = blk[i];
        for (int r = 0; r < b.B; r++) {
            pos[b.row0 + r] = b.kv->n_ctx + r, gidx[b.row0 + r] = r ? n : i;
            if (r) hrow[b.hrow0 + r - 1] = b.row0 + r;
        }
        cpu_dequant_row(d->c->embed, b.anchor, emb + i * H); /* dflash_ctx.c's embedding, then the v2 scale */
        if (d->embed_scale != 1.0f)
            for (size_t j = 0; j < H; j++) emb[i * H + j] *= d->embed_scale;
        block_ids(d, d->desc_h, i)[0] = b.anchor;
        ctx[2 * i] = b.kv->n_ctx, ctx[2 * i + 1] = b.kv->lo;
    }
    memcpy(emb + n * H, d->mask_row, H * sizeof(float));
    return 0;
}

/* The device side of blocks_fill's blocks, on the draft's stream and nothing
 * else (a graph may capture it): the descriptor's upload, then every layer
 * together: the products, norms and MLP over all rows (each weight read once
 * for all blocks), the conv and the attention block by block over each one's
 * lane (n_ctx and lo read on the device, the launch covering b.held context
 * positions).  Then the final norm and hid = the proposals' hidden states
 * (every block's rows 1..B-1, at hrow0..). */
int blocks_run(CDraft *d, const Blk *blk, int n) {
    const splash_dflash_dims *dm = &d->c->d;
    const size_t H = (size_t)d->H;
    const int rows = blk[n - 1].row0 + blk[n - 1].B, hrows = blk[n - 1].hrow0 + blk[n - 1].B - 1;
    SPLASH_CUDA_TRY(cudaMemcpyAsync(d->desc_d, d->desc_h, d->dp.bytes, cudaMemcpyHostToDevice, d->stream));
    const int32_t *pos_d = (const int32_t *)(d->desc_d + d->dp.pos), *ctx_d = (const int32_t *)(d->desc_d + d->dp.ctx);
    TRY(splash_cuda_gather_rows((const float *)(d->desc_d + d->dp.emb), H, (const int32_t *)(d->desc_d + d->dp.gidx),
                                rows, d->x, H, d->H, d->stream));
    const float scale = (float)pow((double)dm->head_dim, -0.5);
    for (int l = 0; l < dm->n_layers; l++) {
        const DLayer *L = &d->layers[l];
        /* attention */
        TRY(norm_rows(d, d->x, d->xn, L->input_norm, rows,
                      d->v2 ? &L->attn_proj : L->qkv.rows ? &L->qkv : &L->k));
        const float *ain;
        TRY(sublayer_in(d, &L->attn_proj, L->attn_base, rows, blk, n, &ain));
        QKV qkv;
        TRY(qkv_products(d, L, ain, rows, true, &qkv));
        TRY(qk_prep(d, L, qkv.q, qkv.ldq, qkv.k, qkv.ldkv, rows, pos_d));
        for (int i = 0; i < n; i++) { /* the workspace is reused block after block (one stream) */
            const Blk &b = blk[i];
            const size_t r0 = (size_t)b.row0;
            splash_cuda_dflash_attn_args a = {};
            a.q = qkv.q + r0 * qkv.ldq, a.ldq = qkv.ldq, a.k = qkv.k + r0 * qkv.ldkv, a.v = qkv.v + r0 * qkv.ldkv;
            a.ldkv = qkv.ldkv, a.ring_k = b.kv->k[l], a.ring_v = b.kv->v[l];
            a.o = d->o + r0 * d->qw, a.ldo = (size_t)d->qw;
            a.block = b.B, a.heads = dm->heads, a.kv_heads = dm->kv_heads, a.head_dim = dm->head_dim;
            a.n_ctx = b.kv->n_ctx, a.lo = b.kv->lo, a.cap = b.kv->cap[l];
            a.ctx_dev = ctx_d + 2 * i, a.max_keys = (b.held < a.cap ? b.held : a.cap) + b.B;
            a.window = dm->sliding[l] ? dm->sliding_window : 0;
            a.causal = dm->causal[l], a.scale = scale, a.ws = d->attn_ws, a.ws_bytes = d->attn_ws_bytes;
            TRY(splash_cuda_dflash_attention(&a, d->stream));
        }
        TRY(sublayer_out(d, d->o, (size_t)d->qw, &L->o, L->attn_base, rows, blk, n));
        /* MLP */
        TRY(norm_rows(d, d->x, d->xn, L->post_norm, rows,
                      d->v2 ? &L->ffn_proj : L->gu.rows ? &L->gu : &L->gate));
        const float *fin;
        TRY(sublayer_in(d, &L->ffn_proj, L->ffn_base, rows, blk, n, &fin));
        GU gu;
        TRY(gu_products(d, L, fin, rows, &gu));
        d->xp_src = nullptr; /* the gate rows are rewritten either way */
        const bool aligned = gu.ld % 4 == 0 && (gu.u - gu.g) % 4 == 0; /* the fused prep's float4s */
        if (aligned && fused_prep_ok(d, &L->down, d->I)) { /* silu(gate) * up prepared for down in the same launch */
            TRY(splash_q4_prep_silu_mul(&d->xp, gu.g, gu.ld, gu.u, gu.ld, gu.g, gu.ld, rows, d->I, d->stream));
            d->xp_src = gu.g, d->xp_ld = gu.ld;
        } else {
            TRY(splash_cuda_silu_mul(gu.g, gu.ld, gu.u, gu.ld, gu.g, gu.ld, rows, d->I, d->stream));
        }
        TRY(sublayer_out(d, gu.g, gu.ld, &L->down, L->ffn_base, rows, blk, n));
    }
    TRY(norm_rows(d, d->x, d->xn, d->norm, rows));
    return splash_cuda_gather_rows(d->xn, H, (const int32_t *)(d->desc_d + d->dp.hrow), hrows, d->hid, H, d->H,
                                   d->stream);
}

/* logits [rows][V] of the proposals' hidden states hid (v2: transformed). */
int head_logits(CDraft *d, int rows) {
    if (!d->lm_head.rows) return SPLASH_E_INVALID; /* shared, and bind_model has not run */
    TRY(prod(d, d->hid, (size_t)d->H, rows, &d->lm_head, d->logits));
    if (d->v2)
        TRY(splash_cuda_dflash_logits_transform(d->logits, (size_t)d->V, rows, d->V, d->mult, d->softcap, d->stream));
    return 0;
}

/* A block's context bucket: its lane's positions since lo rounded up to a
 * power of two (at least 64, at most the widest ring), so a graph keyed by it
 * serves the lane's cycles until its context outgrows the bucket. */
int held_bucket(const splash_dflash_kv *kv) {
    int cap = 0;
    for (int l = 0; l < kv->n_layers; l++) cap = kv->cap[l] > cap ? kv->cap[l] : cap;
    const int held = kv->n_ctx - kv->lo;
    int b = 64;
    while (b < held && b < cap) b *= 2;
    return b < cap ? b : cap;
}

/* The blocks' forward for blk[0..n) (blocks_fill, then blocks_run), then
 * their logits and, when greedy, every row's argmax to h_tok: as a CUDA
 * graph per shape (the blocks' lanes, sizes and context buckets) once a
 * shape has run, else eagerly. */
enum { kHeadArgmax = 1, kHeadTop = 2 }; /* what a group's head makes for the host (bits) */

struct GroupRun {
    CDraft *d;
    const Blk *blk;
    int n, hrows, head;
};

int group_body(void *p) {
    const GroupRun *g = (const GroupRun *)p;
    CDraft *d = g->d;
    TRY(blocks_run(d, g->blk, g->n));
    TRY(head_logits(d, g->hrows));
    const cudaStream_t s = d->stream;
    if (g->head & kHeadArgmax) { /* greedy v1: every row's argmax */
        TRY(splash_cuda_argmax(d->logits, (size_t)d->V, g->hrows, d->V, d->tok, nullptr, d->ws, d->ws_bytes, s));
        SPLASH_CUDA_TRY(
            cudaMemcpyAsync(d->h_tok, d->tok, (size_t)g->hrows * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
    }
    if (g->head & kHeadTop) { /* v1 sampling: every row's top_k logits and their values (h_edges) */
        const int k = d->top_k;
        TRY(splash_cuda_topk(d->logits, (size_t)d->V, g->hrows, d->V, k, d->cand, d->cval, (size_t)k, d->ncand, d->ws,
                             d->ws_bytes, s));
        SPLASH_CUDA_TRY(
            cudaMemcpyAsync(d->h_ncand, d->ncand, (size_t)g->hrows * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
        SPLASH_CUDA_TRY(
            cudaMemcpyAsync(d->h_cand, d->cand, (size_t)g->hrows * k * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
        SPLASH_CUDA_TRY(
            cudaMemcpyAsync(d->h_edges, d->cval, (size_t)g->hrows * k * sizeof(float), cudaMemcpyDeviceToHost, s));
    }
    return 0;
}

int group_forward(CDraft *d, Blk *blk, int n, int head, bool wait = true) {
    const int hrows = blk[n - 1].hrow0 + blk[n - 1].B - 1;
    int key[QC_GRAPH_KEY_MAX], nk = 0;
    key[nk++] = n, key[nk++] = head;
    for (int i = 0; i < n; i++) {
        blk[i].held = held_bucket(blk[i].kv);
        if (nk + 3 <= QC_GRAPH_KEY_MAX) key[nk++] = blk[i].lane, key[nk++] = blk[i].B, key[nk++] = blk[i].held;
        else nk = QC_GRAPH_KEY_MAX + 1; /* too many blocks to key: eagerly */
    }
    TRY(blocks_fill(d, blk, n));
    GroupRun g = {d, blk, n, hrows, head};
    qc_graph *gr = d->use_graphs && nk <= QC_GRAPH_KEY_MAX ? qc_graph_find(&d->graphs, key, nk) : nullptr;
    int rc = qc_graph_run(&d->graphs, gr, group_body, &g);
    d->xp_src = nullptr; /* a replay ran the body's products without its bookkeeping */
    SPLASH_CUDA_TRY(cudaEventRecord(d->desc_up, d->stream)); /* blocks_fill waits for it */
    if (!rc && head && wait) SPLASH_CUDA_TRY(cudaStreamSynchronize(d->stream));
    return rc;
}

int codebook_rows(CDraft *d, const qc_matrix *w, const int32_t *ids, int n, float *out) {
    if (w->is_q4) return splash_cuda_embed_rows_q4(&w->q4, ids, n, out, (size_t)d->rank, d->stream);
    return splash_cuda_embed_rows_dense(&w->dense, ids, n, out, (size_t)d->rank, d->stream);
}

/* v2: candidates and edge scores of block i's rows to the host (h_ncand, h_cand, h_edges). */
int select_edges(CDraft *d, const Blk &b, int i) {
    const int n = b.B - 1, k = d->top_k;
    int32_t *ids = block_ids(d, d->desc_d, i);
    TRY(splash_cuda_topk(d->logits + (size_t)b.hrow0 * d->V, (size_t)d->V, n, d->V, k, ids + 1, d->cval, (size_t)k,
                         d->ncand, d->ws, d->ws_bytes, d->stream));
    TRY(prod(d, d->hid + (size_t)b.hrow0 * d->H, (size_t)d->H, n, &d->hidden_proj, d->gate));
    TRY(codebook_rows(d, &d->pred, ids, 1 + (n - 1) * k, d->pv));
    TRY(codebook_rows(d, &d->succ, ids + 1, n * k, d->sv));
    TRY(splash_cuda_dflash_edges(d->gate, d->pv, d->sv, d->cval, d->ncand, n, k, d->rank, d->edges, d->stream));
    SPLASH_CUDA_TRY(cudaMemcpyAsync(d->h_ncand, d->ncand, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost, d->stream));
    SPLASH_CUDA_TRY(
        cudaMemcpyAsync(d->h_cand, ids + 1, (size_t)n * k * sizeof(int32_t), cudaMemcpyDeviceToHost, d->stream));
    SPLASH_CUDA_TRY(cudaMemcpyAsync(d->h_edges, d->edges, (size_t)n * k * k * sizeof(float), cudaMemcpyDeviceToHost,
                                    d->stream));
    SPLASH_CUDA_TRY(cudaStreamSynchronize(d->stream));
    return 0;
}

/* The proposals from the candidates on the host, row by row with dflash2.c's
 * rule (splash_dflash2_pick): v2 (chain) scores a row's candidates by the
 * edges from the previous row's pick; v1 by their logits (a sparse q: the
 * softmax at the request's temperature over the top_k, which the cycle's
 * rejection sampling takes as the draft distribution, lossless as any q). */
int walk(CDraft *d, int row0, int n, int chain, const splash_dflash2_select_args *a, splash_error *err) {
    const int k = d->top_k;
    int prev = 0; /* row 0's predecessor: the anchor (pred row 0) */
    for (int i = 0; i < n; i++) {
        splash_dflash2_row *o = &d->rows[i];
        const size_t hr = (size_t)(row0 + i); /* the row in the host buffers */
        const int nc = d->h_ncand[hr];
        if (nc < 1 || nc > k) return splash_fail(err, SPLASH_E_INVALID, "%s draft: row %d has no candidate", d->ln.name, i);
        const float *sc = d->h_edges + (chain ? (hr * k + prev) * k : hr * k);
        o->n_cand = nc;
        for (int j = 0; j < SPLASH_DFLASH2_MAX_TOPK; j++) {
            o->cand[j] = j < nc ? d->h_cand[hr * k + j] : -1;
            o->score[j] = j < nc ? sc[j] : -INFINITY;
            o->q[j] = 0;
        }
        const float u = a->temperature > 0 ? a->uniform[i] : 0.0f;
        o->pick = splash_dflash2_pick(o->score, nc, a->temperature, u, o->q);
        o->token = o->cand[o->pick];
        prev = o->pick;
    }
    return 0;
}

/* A failed step: the stream drained first (the next call rewrites the pinned
 * descriptor an upload of this one may still read). */
int fail_gpu(CDraft *d, splash_error *err, int rc, const char *what) {
    cudaStreamSynchronize(d->stream);
    return splash_fail(err, rc, "draft on the GPU: %s failed (%s)", what, splash_status_name(rc));
}

/* A block's arguments (dflash_ctx.c's checks, and the rows the scratch holds). */
int check_block(CDraft *d, const splash_dflash_kv *kv, int32_t anchor, int B, splash_error *err) {
    int rc = splash_dflash_ctx_check(d->c, kv, anchor, B, d->ln.hidden, err);
    if (!rc && B > d->ln.max_block)
        rc = splash_fail(err, SPLASH_E_INVALID, "draft: block %d past %d", B, d->ln.max_block);
    return rc;
}

/* ---- the draft ops ---------------------------------------------------------------------- */

/* A request's block: its lane moved to the anchor's position and the block checked. */
int prepare_block(CDraft *d, const splash_draft_req *r, Blk *b, splash_error *err) {
    int rc = splash_dflash_lanes_reach(&d->ln, r->lane, r->n_seq - 1, err);
    if (rc) return rc;
    b->kv = d->ln.kv[r->lane], b->anchor = r->seq[r->n_seq - 1], b->B = r->n + 1, b->lane = r->lane;
    if ((rc = check_block(d, b->kv, b->anchor, b->B, err))) return rc;
    if ((d->v2 || r->sp->temperature > 0) && !r->q)
        return splash_fail(err, SPLASH_E_INVALID, "%s draft: no q buffer", d->ln.name);
    return 0;
}

/* A greedy block's n proposals from the head's argmax copied to h_tok:
 * SPLASH_DRAFT_TOKENS, or a failure for a row with no finite logit. */
int greedy_tokens(const CDraft *d, const Blk &b, int n, int32_t *out, splash_error *err) {
    for (int i = 0; i < n; i++)
        if ((out[i] = d->h_tok[b.hrow0 + i]) < 0)
            return splash_fail(err, SPLASH_E_INVALID, "dflash draft: row %d has no finite logit", i);
    return SPLASH_DRAFT_TOKENS;
}

/* The proposals of the blocks blk[0..m) (requests r[who[j]]) from one
 * forward: a greedy v1 request takes its rows' argmax (one argmax and one copy
 * for all of them), the others their sparse q's candidates, block by block. */
void propose_group(CDraft *d, const splash_draft_req *r, Blk *blk, const int *who, int m,
                   int32_t *const *tokens, int *kinds, splash_error *errs) {
    int head = 0; /* v2's candidates and edges come block by block after the forward */
    for (int j = 0; j < m && !d->v2; j++) head |= r[who[j]].sp->temperature > 0 ? kHeadTop : kHeadArgmax;
    int rc = group_forward(d, blk, m, head);
    if (rc) {
        for (int j = 0; j < m; j++) kinds[who[j]] = fail_gpu(d, &errs[who[j]], rc, "the block");
        return;
    }
    for (int j = 0; j < m; j++) {
        const splash_draft_req *q = &r[who[j]];
        const Blk &b = blk[j];
        int32_t *out = tokens[who[j]];
        splash_error *err = &errs[who[j]];
        int kind = SPLASH_DRAFT_TOKENS;
        if (d->v2 || q->sp->temperature > 0) { /* proposals with a sparse q, drawn on the host */
            float u[SPLASH_DRAFT_MAX_BLOCK];
            splash_dflash2_select_args a;
            splash_dflash2_draft_args(q->sp, (uint64_t)q->n_seq, q->n, u, &a);
            if (d->v2 && (rc = select_edges(d, b, j))) kind = fail_gpu(d, err, rc, "the candidates");
            else if (!(kind = walk(d, d->v2 ? 0 : b.hrow0, q->n, d->v2, &a, err))) {
                splash_dflash2_draft_rows(d->rows, q->n, out, q->q);
                kind = SPLASH_DRAFT_SPARSE;
            }
        } else {
            kind = greedy_tokens(d, b, q->n, out, err);
        }
        kinds[who[j]] = kind;
    }
}

/* Several lanes' proposals (draft.h, propose_lanes; errs[i]: request i's): their blocks drafted
 * together, as many as one forward holds (R rows, one anchor row of the
 * descriptor a lane; a lane met twice starts a new forward).  Each request's
 * result is the one propose gives it alone: a row's numbers do not depend on
 * the other rows of a product, and the conv and attention run block by block. */
int cd_propose_lanes(void *impl, const splash_draft_req *r, int n, float *const *, int32_t *const *tokens, int *kinds,
                     splash_error *errs) {
    CDraft *d = (CDraft *)impl;
    int m = 0, rows = 0, hrows = 0;
    for (int i = 0; i <= n; i++) {
        Blk b = {};
        if (i < n && (kinds[i] = prepare_block(d, &r[i], &b, &errs[i]))) continue;
        int full = i == n || m == d->ln.lanes || rows + b.B > d->R;
        for (int j = 0; j < m && !full; j++) full = r[d->who[j]].lane == r[i].lane;
        if (full && m) {
            propose_group(d, r, d->blk, d->who, m, tokens, kinds, errs);
            m = rows = hrows = 0;
        }
        if (i == n) break;
        b.row0 = rows, b.hrow0 = hrows;
        d->blk[m] = b, d->who[m++] = i;
        rows += b.B, hrows += b.B - 1;
    }
    return 0;
}

/* Greedy v1 proposals left on the device (draft.h, propose_device): the
 * requests' blocks as one forward (as propose_lanes groups them, so the same
 * proposals), its argmax in tok, the target's stream ordered after it; their
 * copy to h_tok rides along and fetch_proposals reads it. */
int cd_propose_device(void *impl, const splash_draft_req *r, int n, const int32_t **base, int *first,
                      splash_error *err) {
    CDraft *d = (CDraft *)impl;
    d->dev_m = 0;
    if (d->v2 || !d->taps_stream || n < 1 || n > d->ln.lanes) return SPLASH_E_UNSUPPORTED;
    int rows = 0, hrows = 0;
    for (int i = 0; i < n; i++) {
        if (r[i].sp->temperature > 0) return SPLASH_E_UNSUPPORTED;
        for (int j = 0; j < i; j++)
            if (r[j].lane == r[i].lane) return SPLASH_E_UNSUPPORTED;
        Blk b = {};
        int rc = prepare_block(d, &r[i], &b, err);
        if (rc) return rc;
        if (rows + b.B > d->R) return SPLASH_E_UNSUPPORTED; /* more than one forward */
        b.row0 = rows, b.hrow0 = hrows;
        d->blk[i] = b;
        rows += b.B, hrows += b.B - 1;
    }
    int rc = group_forward(d, d->blk, n, kHeadArgmax, false);
    if (rc) return fail_gpu(d, err, rc, "the block");
    SPLASH_CUDA_TRY(cudaEventRecord(d->props_out, d->stream));
    SPLASH_CUDA_TRY(cudaStreamWaitEvent(d->taps_stream, d->props_out, 0));
    *base = d->tok;
    for (int i = 0; i < n; i++) first[i] = d->blk[i].hrow0;
    d->dev_m = n;
    return 0;
}

/* propose_device's proposals on the host, as propose_lanes gives them. */
int cd_fetch_proposals(void *impl, const splash_draft_req *r, int n, int32_t *const *tokens, int *kinds,
                       splash_error *errs) {
    CDraft *d = (CDraft *)impl;
    const bool pending = n == d->dev_m;
    d->dev_m = 0;
    const cudaError_t e = pending ? cudaEventSynchronize(d->props_out) : cudaSuccess;
    for (int j = 0; j < n; j++)
        kinds[j] = !pending || e != cudaSuccess
                       ? splash_fail(&errs[j], SPLASH_E_INVALID, "dflash draft: %s",
                                     pending ? cudaGetErrorString(e) : "no proposals on the device to fetch")
                       : greedy_tokens(d, d->blk[j], r[j].n, tokens[j], &errs[j]);
    return 0;
}

int cd_propose(void *impl, const splash_draft_req *r, float *logits, int32_t *tokens, splash_error *err) {
    splash_error none;
    int kind;
    cd_propose_lanes(impl, r, 1, &logits, &tokens, &kind, err ? err : &none);
    return kind;
}

/* The rows an append pass computes: its rows rounded up to a power of two
 * (at most R), so the passes of a decode cycle (1 to a block's rows a lane)
 * meet a few graphs; the padding rows are computed and dropped. */
int append_bucket(const CDraft *d, int rows) {
    int b = 1;
    while (b < rows) b *= 2;
    return b < d->R ? b : d->R;
}

struct AppendRun {
    CDraft *d;
    int rows; /* the bucket */
    int slot; /* its descriptor */
};

/* The device side of an append pass, on the draft's stream alone (a graph
 * may capture it): the descriptor's upload, fc and the hidden norm over the
 * pass's rows, then each layer's k and v, their norm and rotary at the rows'
 * positions and one ring write of every row into its lane's rings (lane,
 * position and the lane's end read from the descriptor: one graph serves
 * every pass of a bucket whatever its lanes and positions). */
int append_body(void *p) {
    const AppendRun *g = (const AppendRun *)p;
    CDraft *d = g->d;
    const splash_dflash_dims *dm = &d->c->d;
    const int rows = g->rows;
    const uint8_t *ad = d->adesc_d[g->slot];
    SPLASH_CUDA_TRY(
        cudaMemcpyAsync(d->adesc_d[g->slot], d->adesc_h[g->slot], 3 * d->arow, cudaMemcpyHostToDevice, d->stream));
    const int32_t *pos_d = (const int32_t *)ad, *lane_d = (const int32_t *)(ad + d->arow);
    const int32_t *end_d = (const int32_t *)(ad + 2 * d->arow);
    TRY(prod(d, d->in, (size_t)d->n_in, rows, &d->fc, d->x));
    TRY(norm_rows(d, d->x, d->xn, d->hidden_norm, rows));
    const size_t lane_stride = d->kv[0].bytes / sizeof(float); /* alloc_rings: the lanes' rings one after another */
    for (int l = 0; l < dm->n_layers; l++) {
        const DLayer *L = &d->layers[l];
        QKV kv; /* k and v (a stack's q comes along) */
        TRY(qkv_products(d, L, d->xn, rows, false, &kv));
        TRY(qk_prep(d, L, nullptr, 0, kv.k, kv.ldkv, rows, pos_d));
        TRY(splash_cuda_dflash_ring_write_rows(kv.k, kv.v, kv.ldkv, rows, d->kvw, d->kv[0].k[l], d->kv[0].v[l],
                                               lane_stride, d->kv[0].cap[l], pos_d, lane_d, end_d, d->stream));
    }
    return 0;
}

/* One pass of lanes' appends (ABlk, rows one after the other from row 0):
 * the taps into `in`, then append_body over the pass's bucket of rows (a
 * graph per bucket once a bucket has run).  Every row is computed; the ring
 * write drops those a lane's ring would not keep (a long append into a
 * sliding layer).  Not waited for: the kernels run on the
 * draft's stream while the engine goes on (the next propose, snapshot or
 * restore queues behind them on that stream); the taps are copied out of the
 * caller's buffers before this returns (a pageable host buffer's copy is
 * staged before cudaMemcpyAsync returns, a device buffer's - on_device: the
 * target's, which its next forward rewrites - is waited for). */
int append_pass(CDraft *d, const ABlk *a, int m, bool on_device) {
    const AppendRun g = {d, append_bucket(d, a[m - 1].row0 + a[m - 1].rows), d->aslot};
    d->aslot ^= 1;
    SPLASH_CUDA_TRY(cudaEventSynchronize(d->adesc_up[g.slot])); /* the graph that last read this slot has run */
    int32_t *pos = (int32_t *)d->adesc_h[g.slot], *lane = (int32_t *)(d->adesc_h[g.slot] + d->arow);
    int32_t *end = (int32_t *)(d->adesc_h[g.slot] + 2 * d->arow);
    for (int r = 0; r < g.rows; r++) pos[r] = 0, lane[r] = -1, end[r] = 0;
    for (int i = 0; i < m; i++)
        for (int r = 0; r < a[i].rows; r++) {
            const int at = a[i].row0 + r;
            pos[at] = a[i].pos0 + r, lane[at] = (int32_t)(a[i].kv - d->kv), end[at] = a[i].end;
        }
    /* the device taps' copy on the target's stream when bound: after the forward that wrote
     * them and before the next one, and after the draft's last use of `in`; the draft's
     * kernels wait for it on the device.  Else on the draft's stream, waited for. */
    const bool bound = on_device && d->taps_stream;
    const cudaStream_t cs = bound ? d->taps_stream : d->stream;
    if (bound) {
        SPLASH_CUDA_TRY(cudaEventRecord(d->in_free, d->stream));
        SPLASH_CUDA_TRY(cudaStreamWaitEvent(cs, d->in_free, 0));
    }
    for (int i = 0; i < m; i++)
        SPLASH_CUDA_TRY(cudaMemcpyAsync(d->in + (size_t)a[i].row0 * d->n_in, a[i].taps,
                                        (size_t)a[i].rows * d->n_in * sizeof(float),
                                        on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice, cs));
    if (bound) {
        SPLASH_CUDA_TRY(cudaEventRecord(d->taps_in, cs));
        SPLASH_CUDA_TRY(cudaStreamWaitEvent(d->stream, d->taps_in, 0));
    } else if (on_device) {
        SPLASH_CUDA_TRY(cudaStreamSynchronize(d->stream));
    }
    const int key[2] = {g.slot, g.rows};
    qc_graph *gr = d->append_graphs ? qc_graph_find(&d->agraphs, key, 2) : nullptr;
    const int rc = qc_graph_run(&d->agraphs, gr, append_body, (void *)&g);
    d->xp_src = nullptr; /* a replay ran the body's products without its bookkeeping */
    SPLASH_CUDA_TRY(cudaEventRecord(d->adesc_up[g.slot], d->stream)); /* the slot's next fill waits for it */
    return rc;
}

/* A lane's append checked and its rings moved to pos. */
int prepare_append(CDraft *d, int lane, int pos, const float *taps, int n, splash_error *err) {
    int rc = splash_dflash_lanes_reach(&d->ln, lane, pos, err);
    return rc ? rc : splash_dflash_ctx_append_check(d->c, d->ln.kv[lane], taps, n, err);
}

int append_rows(void *impl, int lane, int pos, const float *taps, int n, bool on_device, splash_error *err) {
    CDraft *d = (CDraft *)impl;
    int rc = prepare_append(d, lane, pos, taps, n, err);
    if (rc || n <= 0) return rc;
    splash_dflash_kv *kv = d->ln.kv[lane];
    for (int r0 = 0; r0 < n; r0 += SPLASH_DFLASH_APPEND_CHUNK) {
        const int rows = n - r0 < SPLASH_DFLASH_APPEND_CHUNK ? n - r0 : SPLASH_DFLASH_APPEND_CHUNK;
        const ABlk a = {kv, taps + (size_t)r0 * d->n_in, rows, kv->n_ctx + r0, kv->n_ctx + n, 0};
        if ((rc = append_pass(d, &a, 1, on_device))) return fail_gpu(d, err, rc, "the append");
    }
    kv->n_ctx += n;
    return 0;
}

int cd_append(void *impl, int lane, int pos, const float *taps, int n, splash_error *err) {
    return append_rows(impl, lane, pos, taps, n, false, err);
}

/* The target's TAPS rows from its device buffer (draft.h, append_device). */
int cd_append_device(void *impl, int lane, int pos, const float *taps, int n, splash_error *err) {
    return append_rows(impl, lane, pos, taps, n, true, err);
}

/* Several lanes' appends (draft.h, append_lanes; errs[i]: lane entry i's): lanes whose rows fit one
 * pass (R rows) go through it together, a longer one alone by chunks; a lane
 * met twice starts a new pass.  The rings get what append gives each alone. */
int cd_append_lanes(void *impl, const splash_draft_taps *t, int n, int on_device, int *status, splash_error *errs) {
    CDraft *d = (CDraft *)impl;
    int m = 0, rows = 0;
    for (int i = 0; i <= n; i++) {
        int full = i == n;
        if (!full) {
            if (t[i].n <= 0 || t[i].n > d->R) { /* nothing, or a chunked append of its own */
                status[i] = append_rows(d, t[i].lane, t[i].pos, t[i].taps, t[i].n, on_device, &errs[i]);
                continue;
            }
            full = m == d->ln.lanes || rows + t[i].n > d->R;
            for (int j = 0; j < m && !full; j++) full = t[d->who[j]].lane == t[i].lane;
        }
        if (full && m) {
            const int rc = append_pass(d, d->ablk, m, on_device);
            for (int j = 0; j < m; j++)
                if (!(status[d->who[j]] = rc ? fail_gpu(d, &errs[d->who[j]], rc, "the append") : 0))
                    d->ablk[j].kv->n_ctx += d->ablk[j].rows;
            m = rows = 0;
        }
        if (i == n) break;
        if ((status[i] = prepare_append(d, t[i].lane, t[i].pos, t[i].taps, t[i].n, &errs[i]))) continue;
        splash_dflash_kv *kv = d->ln.kv[t[i].lane];
        d->ablk[m] = {kv, t[i].taps, t[i].n, kv->n_ctx, kv->n_ctx + t[i].n, rows};
        d->who[m++] = i;
        rows += t[i].n;
    }
    return 0;
}

/* Snapshots live where the target's do (splash_model_alloc_memory: device
 * memory beside the CUDA model, host memory in the tests): every copy is
 * cudaMemcpyDefault, which reads the direction from the pointers. */
void cd_snapshot(void *impl, int lane, void *dst) {
    CDraft *d = (CDraft *)impl;
    if (lane < 0 || lane >= d->ln.lanes) return;
    const splash_dflash_kv *kv = d->ln.kv[lane];
    uint8_t hdr[SPLASH_DFLASH_SNAP_HEADER];
    splash_dflash_kv_save_header(kv, hdr);
    cudaError_t e = cudaMemcpyAsync(dst, hdr, sizeof hdr, cudaMemcpyDefault, d->stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync((char *)dst + sizeof hdr, kv->mem, kv->bytes, cudaMemcpyDefault, d->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(d->stream);
    if (e != cudaSuccess) { /* the op has no status: a zero header is refused when restored */
        SPLASH_CUDA_REPORT_("draft snapshot", e);
        memset(hdr, 0, sizeof hdr);
        cudaMemcpy(dst, hdr, sizeof hdr, cudaMemcpyDefault);
    }
}

int cd_restore(void *impl, int lane, const void *src, splash_error *err) {
    CDraft *d = (CDraft *)impl;
    if (lane < 0 || lane >= d->ln.lanes)
        return splash_fail(err, SPLASH_E_RANGE, "%s draft: lane %d outside [0, %d)", d->ln.name, lane, d->ln.lanes);
    splash_dflash_kv *kv = d->ln.kv[lane], tmp = *kv;
    uint8_t hdr[SPLASH_DFLASH_SNAP_HEADER];
    SPLASH_CUDA_TRY(cudaMemcpyAsync(hdr, src, sizeof hdr, cudaMemcpyDefault, d->stream));
    SPLASH_CUDA_TRY(cudaStreamSynchronize(d->stream));
    int rc = splash_dflash_kv_load_header(&tmp, hdr, err);
    if (rc) return rc;
    SPLASH_CUDA_TRY(cudaMemcpyAsync(kv->mem, (const char *)src + sizeof hdr, kv->bytes, cudaMemcpyDefault, d->stream));
    SPLASH_CUDA_TRY(cudaStreamSynchronize(d->stream));
    kv->n_ctx = tmp.n_ctx, kv->lo = tmp.lo;
    return 0;
}

void cd_free(void *impl) {
    CDraft *d = (CDraft *)impl;
    if (!d) return;
    if (d->stream) cudaStreamSynchronize(d->stream);
    qc_graphs_clear(&d->graphs);
    qc_graphs_clear(&d->agraphs);
    if (d->wdev) cudaFree(d->wdev);
    if (d->head_dev) cudaFree(d->head_dev);
    if (d->scratch) cudaFree(d->scratch);
    if (d->rings) cudaFree(d->rings);
    if (d->desc_d) cudaFree(d->desc_d);
    if (d->pinned) cudaFreeHost(d->pinned);
    if (d->stream) cudaStreamDestroy(d->stream);
    if (d->desc_up) cudaEventDestroy(d->desc_up);
    for (int i = 0; i < 2; i++)
        if (d->adesc_up[i]) cudaEventDestroy(d->adesc_up[i]);
    if (d->in_free) cudaEventDestroy(d->in_free);
    if (d->taps_in) cudaEventDestroy(d->taps_in);
    if (d->props_out) cudaEventDestroy(d->props_out);
    free(d->kv);
    free(d->blk);
    free(d->ablk);
    free(d->who);
    free(d->mask_row);
    splash_dflash_lanes_release(&d->ln);
    splash_dflash_free(d->m1);
    splash_dflash2_free(d->m2);
    free(d);
}

/* The target's stream for the device taps' copies (draft.h, bind_device_taps). */
void cd_bind_device_taps(void *impl, void *stream) { ((CDraft *)impl)->taps_stream = (cudaStream_t)stream; }

int head_walk(qc_upload *w, void *ctx) {
    CDraft *d = (CDraft *)ctx;
    return qc_upload_matrix(w, d->c->lm_head, &d->lm_head);
}

/* The lm_head shared with the target (draft.h, bind_model): the CUDA model's
 * device copy of the same package bytes, else an upload of its own. */
int cd_bind_model(void *impl, splash_model *model, splash_error *err) {
    CDraft *d = (CDraft *)impl;
    if (!d->share_head || d->lm_head.rows) return 0;
    const qc_matrix *m = (const qc_matrix *)splash_model_device_weight(model, d->c->lm_head->data);
    if (m && m->rows == d->V && m->cols == d->H) {
        d->lm_head = *m;
        return 0;
    }
    size_t bytes = 0;
    int cols = 0;
    return qc_upload_run(head_walk, d, &d->head_dev, &bytes, &cols, err);
}

const splash_draft_ops cd_ops = {cd_propose, cd_append,         splash_dflash_lanes_reset, cd_snapshot,
                                 cd_restore, cd_free,           cd_append_device,          cd_propose_lanes,
                                 cd_append_lanes, cd_bind_device_taps, cd_bind_model,
                                 cd_propose_device, cd_fetch_proposals};

/* ---- open ----------------------------------------------------------------------------------- */

/* What the kernels take, checked once with the reason. */
int check_dims(const CDraft *d, splash_error *err) {
    const splash_dflash_dims *dm = &d->c->d;
    if (dm->head_dim != 32 && dm->head_dim != 64 && dm->head_dim != 128 && dm->head_dim != 256)
        return splash_fail(err, SPLASH_E_UNSUPPORTED,
                           "%s draft on the GPU: head_dim %d (the block attention takes 32, 64, 128 or 256)", d->ln.name,
                           dm->head_dim);
    if (d->top_k > SPLASH_CUDA_MAX_TOPK || d->top_k > d->V || d->rank > SPLASH_CUDA_DFLASH_MAX_RANK ||
        (size_t)(d->V + 4095) / 4096 * d->top_k > 5888)
        return splash_fail(err, SPLASH_E_UNSUPPORTED,
                           "%s draft on the GPU: %d candidates a row (at most %d), selector rank %d (at most %d), "
                           "vocabulary %d",
                           d->ln.name, d->top_k, SPLASH_CUDA_MAX_TOPK, d->rank, SPLASH_CUDA_DFLASH_MAX_RANK, d->V);
    return 0;
}

/* The activations [R][width] and the head's buffers, one device allocation. */
int alloc_scratch(CDraft *d, splash_error *err) {
    const size_t R = (size_t)d->R, Rh = (size_t)d->Rh, H = (size_t)d->H, nb = (size_t)d->ln.max_block;
    const size_t k = (size_t)d->top_k, lanes = (size_t)d->ln.lanes;
    const size_t Rc = Rh > nb ? Rh : nb; /* rows of candidates: v1's of a whole forward, v2's of a block */
    size_t ws = splash_cuda_argmax_workspace_bytes((int)Rh, d->V);
    const size_t tw = splash_cuda_topk_workspace_bytes((int)Rc, d->V, (int)k);
    if (tw > ws) ws = tw;
    const size_t sizes[] = {R * H,  R * H, R * H, R * H, R * d->qw, R * d->kvw, R * d->kvw, R * d->qw, R * d->I,
                            R * d->I, R * d->P, R * d->n_in, Rh * H, Rh * d->V, nb * d->rank,
                            (1 + nb * k) * d->rank, nb * k * d->rank, nb * k * k, Rc * k, R * d->stk_cols};
    float **ptrs[] = {&d->x,   &d->xn,  &d->xc, &d->t,   &d->q,      &d->k,    &d->v,  &d->o,  &d->ff,    &d->ff2,
                      &d->dyn, &d->in,  &d->hid, &d->logits, &d->gate, &d->pv, &d->sv, &d->edges, &d->cval, &d->stk};
    const size_t n = sizeof sizes / sizeof sizes[0];
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += up256(sizes[i] * sizeof(float));
    const size_t xp = splash_q4_xprep_bytes(d->max_q4_cols > 0 ? d->max_q4_cols : 64);
    const splash_dflash_dims *dm = &d->c->d;
    d->attn_ws_bytes = splash_cuda_dflash_attention_workspace_bytes((int)nb, dm->heads, dm->head_dim,
                                                                    d->c->max_context + (int)nb);
    total += up256(Rc * sizeof(int32_t)) + up256(Rh * sizeof(int32_t)) + up256(Rc * k * sizeof(int32_t)) + up256(ws) +
             up256(d->attn_ws_bytes) + up256(xp);
    d->scratch_bytes = total;
    cudaError_t e = cudaMalloc(&d->scratch, total);
    if (e != cudaSuccess) {
        d->scratch = nullptr;
        return splash_fail(err, SPLASH_E_NOMEM, "draft on the GPU: cudaMalloc of %zu MiB of scratch: %s", total >> 20,
                           cudaGetErrorString(e));
    }
    /* zeroed: an append pass's padding rows read `in` rows no append wrote yet (their results are dropped) */
    if ((e = cudaMemset(d->scratch, 0, total)) != cudaSuccess)
        return splash_fail(err, SPLASH_E_IO, "draft on the GPU: zeroing the scratch: %s", cudaGetErrorString(e));
    uint8_t *p = (uint8_t *)d->scratch;
    for (size_t i = 0; i < n; i++) *ptrs[i] = (float *)p, p += up256(sizes[i] * sizeof(float));
    d->ncand = (int32_t *)p, p += up256(Rc * sizeof(int32_t));
    d->tok = (int32_t *)p, p += up256(Rh * sizeof(int32_t));
    d->cand = (int32_t *)p, p += up256(Rc * k * sizeof(int32_t));
    d->ws = p, d->ws_bytes = ws, p += up256(ws);
    d->attn_ws = p, p += up256(d->attn_ws_bytes);
    if (splash_q4_xprep_init(&d->xp, p, d->max_q4_cols > 0 ? d->max_q4_cols : 64))
        return splash_fail(err, SPLASH_E_INVALID, "draft on the GPU: the q4 activation of %d columns", d->max_q4_cols);
    /* the descriptor and the results */
    Desc &dp = d->dp;
    size_t off = 0;
    dp.pos = off, off += up256(R * sizeof(int32_t));
    dp.gidx = off, off += up256(R * sizeof(int32_t));
    dp.emb = off, off += up256((lanes + 1) * H * sizeof(float));
    dp.hrow = off, off += up256(Rh * sizeof(int32_t));
    dp.ids = off, off += up256(lanes * (1 + nb * k) * sizeof(int32_t));
    dp.ctx = off, off += up256(lanes * 2 * sizeof(int32_t));
    dp.bytes = off;
    d->arow = up256(R * sizeof(int32_t));
    const size_t abytes = 3 * d->arow; /* an append pass's descriptor (adesc_h) */
    const size_t edges = nb * k * k > Rc * k ? nb * k * k : Rc * k; /* v2's edges of a block, v1's top values */
    const size_t res = up256(Rh * sizeof(int32_t)) + up256(Rc * sizeof(int32_t)) + up256(Rc * k * sizeof(int32_t)) +
                       edges * sizeof(float);
    const size_t dbytes = dp.bytes + 2 * abytes;
    if ((e = cudaMalloc(&d->desc_d, dbytes)) != cudaSuccess || (e = cudaMallocHost(&d->pinned, dbytes + res)) != cudaSuccess) {
        d->pinned = nullptr;
        return splash_fail(err, SPLASH_E_NOMEM, "draft on the GPU: the descriptor: %s", cudaGetErrorString(e));
    }
    memset(d->pinned, 0, dbytes + res);
    d->desc_h = (uint8_t *)d->pinned;
    for (int i = 0; i < 2; i++)
        d->adesc_h[i] = d->desc_h + dp.bytes + i * abytes, d->adesc_d[i] = d->desc_d + dp.bytes + i * abytes;
    uint8_t *h = d->desc_h + dbytes;
    d->h_tok = (int32_t *)h, h += up256(Rh * sizeof(int32_t));
    d->h_ncand = (int32_t *)h, h += up256(Rc * sizeof(int32_t));
    d->h_cand = (int32_t *)h, h += up256(Rc * k * sizeof(int32_t));
    d->h_edges = (float *)h;
    return 0;
}

/* Each lane's rings in one zeroed device allocation (a snapshot copies never-written slots too). */
int alloc_rings(CDraft *d, int lanes, splash_error *err) {
    d->kv = (splash_dflash_kv *)calloc((size_t)lanes, sizeof *d->kv);
    if (!d->kv) return splash_fail(err, SPLASH_E_NOMEM, "out of memory");
    for (int i = 0; i < lanes; i++) splash_dflash_kv_shape(&d->kv[i], d->c);
    const size_t per = d->kv[0].bytes;
    cudaError_t e = cudaMalloc(&d->rings, per * lanes);
    if (e == cudaSuccess) e = cudaMemset(d->rings, 0, per * lanes);
    if (e != cudaSuccess)
        return splash_fail(err, SPLASH_E_NOMEM, "draft on the GPU: %d lanes' context rings (%zu MiB): %s", lanes,
                           per * lanes >> 20, cudaGetErrorString(e));
    for (int i = 0; i < lanes; i++) {
        splash_dflash_kv_place(&d->kv[i], (float *)((uint8_t *)d->rings + per * i));
        d->ln.kv[i] = &d->kv[i];
    }
    return 0;
}

int open_draft(CDraft *d, splash_package *pkg, const splash_draft_options *opt, int *window, splash_error *err) {
    int lanes;
    splash_dflash_options o = splash_dflash_lanes_options(opt, window, &lanes);
    o.threads = 1; /* the CPU draft only binds and describes; its forward never runs */
    o.act = CPU_ACT_F32;
    const char *arch = json_get_string(json_get(splash_package_manifest(pkg), "draft"), "architecture", "");
    d->v2 = !strcmp(arch, "dflash2");
    int rc;
    if (d->v2) {
        const int want = opt->max_block > SPLASH_DRAFT_MAX_BLOCK ? SPLASH_DRAFT_MAX_BLOCK : opt->max_block;
        o.max_block = want > 0 ? want : 0;
        if ((rc = splash_dflash2_load(pkg, &o, &d->m2, err))) return rc;
        d->c = splash_dflash2_ctx_of(d->m2);
        const splash_dflash2_dims *d2 = splash_dflash2_get_dims(d->m2);
        d->K = d2->conv_kernel, d->group = d2->conv_group, d->rank = d2->sel_rank, d->top_k = d2->sel_top_k;
        d->embed_scale = d2->embed_scale, d->mult = d2->output_multiplier, d->softcap = d2->softcap;
        d->P = 2 * d->K * (d2->hidden / d->group);
    } else {
        o.max_block = opt->max_block > 0 ? opt->max_block : 0;
        if ((rc = splash_dflash_load(pkg, &o, &d->m1, err))) return rc;
        d->c = splash_dflash_ctx_of(d->m1);
        d->embed_scale = 1.0f, d->mult = 1.0f, d->rank = 1, d->top_k = kV1Candidates, d->P = 1;
    }
    const splash_dflash_dims *dm = &d->c->d;
    if ((rc = splash_dflash_lanes_init(&d->ln, d->v2 ? "dflash2" : "dflash", d->c, lanes, err))) return rc;
    d->H = dm->hidden, d->qw = dm->heads * dm->head_dim, d->kvw = dm->kv_heads * dm->head_dim;
    d->I = dm->intermediate, d->V = dm->vocab, d->n_in = dm->n_taps * dm->hidden;
    if (!d->v2 && d->top_k > d->V) d->top_k = d->V;
    d->R = d->ln.max_block > SPLASH_DFLASH_APPEND_CHUNK ? d->ln.max_block : SPLASH_DFLASH_APPEND_CHUNK;
    /* a forward's blocks hold one anchor row each: at most R - 1 proposals' rows */
    d->Rh = lanes * (d->ln.max_block - 1) < d->R - 1 ? lanes * (d->ln.max_block - 1) : d->R - 1;
    d->blk = (Blk *)calloc((size_t)lanes, sizeof *d->blk);
    d->ablk = (ABlk *)calloc((size_t)lanes, sizeof *d->ablk);
    d->who = (int *)calloc((size_t)lanes, sizeof *d->who);
    if (!d->blk || !d->ablk || !d->who) return splash_fail(err, SPLASH_E_NOMEM, "out of memory");
    if ((rc = check_dims(d, err))) return rc;
    d->mask_row = (float *)malloc((size_t)d->H * sizeof(float));
    if (!d->mask_row) return splash_fail(err, SPLASH_E_NOMEM, "out of memory");
    cpu_dequant_row(d->c->embed, dm->mask_token_id, d->mask_row);
    if (d->embed_scale != 1.0f)
        for (int i = 0; i < d->H; i++) d->mask_row[i] *= d->embed_scale;
    cudaError_t e = cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        d->stream = nullptr;
        return splash_fail(err, SPLASH_E_IO, "draft on the GPU: a stream: %s", cudaGetErrorString(e));
    }
    d->graphs.stream = d->agraphs.stream = d->stream;
    d->use_graphs = qc_graphs_enabled();
    const char *ag = getenv("SPLASH_DRAFT_APPEND_GRAPHS");
    d->append_graphs = d->use_graphs && !(ag && !strcmp(ag, "0"));
    if ((e = cudaEventCreateWithFlags(&d->desc_up, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&d->adesc_up[0], cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&d->adesc_up[1], cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&d->in_free, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&d->taps_in, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&d->props_out, cudaEventDisableTiming)) != cudaSuccess) {
        return splash_fail(err, SPLASH_E_IO, "draft on the GPU: an event: %s", cudaGetErrorString(e));
    }
    d->share_head = opt->share_target;
    if ((rc = qc_upload_run(upload_walk, d, &d->wdev, &d->wbytes, &d->max_q4_cols, err))) return rc;
    if (d->share_head && d->H > d->max_q4_cols) d->max_q4_cols = d->H; /* the shared lm_head's input */
    if ((rc = alloc_scratch(d, err))) return rc;
    return alloc_rings(d, lanes, err);
}

} /* namespace */

extern "C" int splash_dflash_cuda_open(splash_package *pkg, const splash_draft_options *opt, splash_draft **out,
                                       splash_error *err) {
    *out = nullptr;
    CDraft *d = (CDraft *)calloc(1, sizeof(CDraft));
    splash_draft *dr = (splash_draft *)calloc(1, sizeof *dr);
    if (!d || !dr) {
        free(d);
        free(dr);
        return splash_fail(err, SPLASH_E_NOMEM, "out of memory");
    }
    int window = 0;
    int rc = open_draft(d, pkg, opt, &window, err);
    if (!rc) rc = splash_dflash_lanes_describe(&d->ln, &cd_ops, d, window, dr, err);
    /* the memory plan's budget was read before the draft opened: count all it holds on the device
     * beside its lane states (its weights, with its own lm_head unless shared; its scratch) */
    if (!rc) dr->weight_bytes = d->wbytes + d->scratch_bytes;
    if (rc) {
        cd_free(d);
        free(dr);
        return rc;
    }
    *out = dr;
    return 0;
}

extern "C" int splash_dflash_cuda_forward(splash_draft *dr, int lane, int32_t anchor, int block, float *hidden,
                                          float *logits, splash_error *err) {
    CDraft *d = (CDraft *)dr->impl;
    if (lane < 0 || lane >= d->ln.lanes) return splash_fail(err, SPLASH_E_RANGE, "draft: lane %d", lane);
    Blk b = {d->ln.kv[lane], anchor, block, 0, 0, lane, 0};
    int rc = hidden ? check_block(d, b.kv, anchor, block, err) : splash_fail(err, SPLASH_E_INVALID, "draft: no hidden");
    if (rc) return rc;
    b.held = held_bucket(b.kv);
    if ((rc = blocks_fill(d, &b, 1)) || (rc = blocks_run(d, &b, 1)) || (logits && (rc = head_logits(d, block - 1))))
        return fail_gpu(d, err, rc, "the block");
    SPLASH_CUDA_TRY(cudaEventRecord(d->desc_up, d->stream));
    SPLASH_CUDA_TRY(cudaMemcpyAsync(hidden, d->hid, (size_t)(block - 1) * d->H * sizeof(float), cudaMemcpyDeviceToHost,
                                    d->stream));
    if (logits)
        SPLASH_CUDA_TRY(cudaMemcpyAsync(logits, d->logits, (size_t)(block - 1) * d->V * sizeof(float),
                                        cudaMemcpyDeviceToHost, d->stream));
    SPLASH_CUDA_TRY(cudaStreamSynchronize(d->stream));
    return 0;
}
