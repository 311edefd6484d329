/* cuda_model.cu - the CUDA Qwen3.5 behind splash_model_* (qwen35_cuda_ops):
 * load (dimensions, device weights, scratch), the memory the runtime
 * attaches (KV pool, slots: device memory from alloc_memory), slots,
 * commit of verified rows (replay, cuda_model.h), snapshot / restore.  The
 * forward pass is cuda_forward.cu.
 *
 * Everything the forward and commit touch is allocated here: activations
 * and the verify save at load, the attention workspace and the per-forward
 * descriptor at attach (they depend on the pool's longest context).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "models/qwen35/cuda_model.h"

#define DEFAULT_MAX_ROWS 512
#define ATTN_WORKSPACE_BUDGET ((size_t)256 << 20) /* bytes; bounds rows per attention call */
#define HEAD_ROWS 64                              /* logits rows per lm_head pass */
#define GDN_WORKSPACE_BUDGET ((size_t)384 << 20)  /* bytes of prepared GDN chunks (gdn.h): 44 of the 27B's a group */

static size_t maxz(size_t a, size_t b) { return a > b ? a : b; }
static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* ---- scratch ------------------------------------------------------------------- */

/* A bump plan over one allocation: pass 1 sizes (base NULL), pass 2 carves. */
typedef struct bump {
    uint8_t *base;
    size_t off;
} bump;

static void *carve(bump *b, size_t bytes) {
    void *p = b->base ? b->base + b->off : nullptr;
    b->off += align256(bytes ? bytes : 1);
    return p;
}
#define CARVE_F(b, n) ((float *)carve(b, (size_t)(n) * sizeof(float)))

/* A layer's matrices that a product may name (a stack's parts are empty,
 * rows 0, when the stack is used). */
enum { LAYER_MATS = 21 };
static void layer_matrices(qc_layer *L, qc_matrix **mats) {
    qc_matrix *all[LAYER_MATS] = {&L->q_proj, &L->k_proj, &L->v_proj, &L->o_proj, &L->in_qkv, &L->in_z,
                                  &L->in_b, &L->in_a, &L->out_proj, &L->gate, &L->up, &L->down,
                                  &L->router, &L->shared_gate, &L->shared_up, &L->shared_down,
                                  &L->shared_expert_gate, &L->attn_in, &L->gdn_in, &L->ffn_in, &L->gates_in};
    memcpy(mats, all, sizeof all);
}

/* The most weights of a q4 matrix cuBLASLt may take (qc_blas_shape): the
 * size of its fp16 expansion; 0: none. */
static size_t gemm_weights_max(qc_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->d.n_layers; i++) {
        qc_matrix *mats[LAYER_MATS];
        layer_matrices(&m->w.layers[i], mats);
        for (int j = 0; j < LAYER_MATS; j++)
            if (qc_blas_shape(m, mats[j])) n = maxz(n, (size_t)mats[j]->rows * (size_t)mats[j]->cols);
    }
    return n;
}

/* ---- the GEMM's weights kept in fp16 (model.h, splash_model_use_spare) ---------- */

/* Bytes of a matrix's resident fp16 expansion; 0 for one cuBLASLt never takes. */
static size_t f16_copy_bytes(const qc_model *m, const qc_matrix *w) {
    return m->wexp && qc_blas_shape(m, w) ? align256((size_t)w->rows * (size_t)w->cols * sizeof(uint16_t)) : 0;
}

static size_t f16_copies_want(qc_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->d.n_layers; i++) {
        qc_matrix *mats[LAYER_MATS];
        layer_matrices(&m->w.layers[i], mats);
        for (int j = 0; j < LAYER_MATS; j++) n += f16_copy_bytes(m, mats[j]);
    }
    return n;
}

static void drop_f16_copies(qc_model *m) {
    if (!m->f16_copies) return; /* no w16 set (and a failed load may have no layers) */
    for (int i = 0; i < m->d.n_layers; i++) {
        qc_matrix *mats[LAYER_MATS];
        layer_matrices(&m->w.layers[i], mats);
        for (int j = 0; j < LAYER_MATS; j++) mats[j]->w16 = nullptr;
    }
    if (m->f16_copies) cudaFree(m->f16_copies);
    m->f16_copies = nullptr;
}

/* cuBLASLt's matrices, layer by layer (one that no longer fits skipped),
 * each expanded once here instead of before every bulk product: in 4 layers
 * of a 27B 4K forward the expansions cost 1.64 of 29.3 ms (session 23's
 * trace).  The same kernel writes the same fp16 values, so the products give
 * the same results.  Within `bytes` and what the device has free less a
 * margin; a refused allocation takes nothing.  SPLASH_CUDA_F16_COPIES=0
 * takes nothing (an A/B switch). */
static int c_use_spare(void *impl, size_t bytes, size_t *used, splash_error *err) {
    qc_model *m = (qc_model *)impl;
    const cudaStream_t s = (cudaStream_t)m->stream;
    *used = 0;
    cudaError_t e = cudaStreamSynchronize(s); /* no forward may still read the copies dropped here */
    if (e != cudaSuccess) return splash_fail(err, SPLASH_E_IO, "fp16 copies: %s", cudaGetErrorString(e));
    drop_f16_copies(m);
    const char *v = getenv("SPLASH_CUDA_F16_COPIES");
    if (!bytes || !m->wexp || (v && !strcmp(v, "0"))) return 0;
    size_t free_b = 0, total_b = 0;
    const size_t margin = (size_t)512 << 20;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
    const size_t room = free_b > margin ? free_b - margin : 0;
    if (bytes > room) bytes = room;
    size_t take = 0;
    for (int pass = 0; pass < 2; pass++) { /* sizes, then places and expansions */
        uint8_t *base = (uint8_t *)m->f16_copies;
        size_t off = 0;
        for (int i = 0; i < m->d.n_layers; i++) {
            qc_matrix *mats[LAYER_MATS];
            layer_matrices(&m->w.layers[i], mats);
            for (int j = 0; j < LAYER_MATS; j++) {
                const size_t n = f16_copy_bytes(m, mats[j]);
                if (!n || off + n > (pass ? take : bytes)) continue;
                if (pass) {
                    const int rc = splash_q4_expand_f16(&mats[j]->q4, (uint16_t *)(base + off), m->stream);
                    if (rc) {
                        drop_f16_copies(m);
                        return splash_fail(err, rc, "fp16 copy of a %d x %d matrix", mats[j]->rows, mats[j]->cols);
                    }
                    mats[j]->w16 = (const uint16_t *)(base + off);
                }
                off += n;
            }
        }
        if (!pass) {
            if (!off || cudaMalloc(&m->f16_copies, off) != cudaSuccess) {
                (void)cudaGetLastError();
                m->f16_copies = nullptr;
                return 0;
            }
            take = off;
        }
    }
    if ((e = cudaStreamSynchronize(s)) != cudaSuccess) {
        drop_f16_copies(m);
        return splash_fail(err, SPLASH_E_IO, "fp16 copies: %s", cudaGetErrorString(e));
    }
    qc_graphs_clear(&m->graphs); /* a captured forward would still expand into wexp: correct, but slower */
    *used = take;
    return 0;
}

static void plan_scratch(qc_model *m, bump *b) {
    const qwen35_dims *d = &m->d;
    const size_t R = (size_t)m->max_rows, H = (size_t)d->hidden, hd = (size_t)d->head_dim;
    const size_t qw = (size_t)d->heads * hd, kvw = (size_t)d->kv_heads * hd, C = (size_t)d->conv_dim;
    const size_t VD = (size_t)d->value_dim, Hv = (size_t)d->hv;
    const size_t ffw = d->moe ? (size_t)d->shared_inter : (size_t)d->intermediate;
    m->x = CARVE_F(b, R * H);
    m->xn = CARVE_F(b, R * H);
    m->tmp = CARVE_F(b, R * H);
    m->u1 = CARVE_F(b, R * maxz(2 * qw, C));
    m->u2 = CARVE_F(b, R * maxz(qw, C));
    m->u3 = CARVE_F(b, R * maxz(kvw, VD));
    m->u4 = CARVE_F(b, R * maxz(kvw, VD));
    m->agate = CARVE_F(b, R * qw);
    m->aout = CARVE_F(b, R * qw);
    m->ga = CARVE_F(b, R * Hv);
    m->gb = CARVE_F(b, R * Hv);
    m->ff1 = CARVE_F(b, R * ffw);
    m->ff2 = CARVE_F(b, R * ffw);
    if (d->moe) {
        m->rlog = CARVE_F(b, R * ((size_t)d->experts + 16)); /* a stacked gates_in: E + 1 rows (q4: E rounded up to 16, + 1) */
        m->sgate = CARVE_F(b, R);
        m->topi = (int32_t *)carve(b, R * ((size_t)d->top_k + 1) * sizeof(int32_t));
        m->topw = CARVE_F(b, R * ((size_t)d->top_k + 1));
        m->fo = CARVE_F(b, R * H);
        m->mo = CARVE_F(b, R * H);
    }
    size_t stack = 0; /* the widest stacked matrix (cuda_model.h) */
    for (int i = 0; i < d->n_layers; i++) {
        const qc_layer *L = &m->w.layers[i];
        stack = maxz(stack, maxz((size_t)L->attn_in.rows, maxz((size_t)L->gdn_in.rows, (size_t)L->ffn_in.rows)));
    }
    if (stack) m->fin = CARVE_F(b, R * stack);
    m->head_cap = m->max_rows < HEAD_ROWS ? m->max_rows : HEAD_ROWS;
    m->logits = CARVE_F(b, (size_t)m->head_cap * (size_t)d->vocab);
    const int top_max = d->vocab < SPLASH_MAX_TOP ? d->vocab : SPLASH_MAX_TOP;
    m->top_ids = (int32_t *)carve(b, (size_t)m->head_cap * top_max * sizeof(int32_t));
    m->top_vals = CARVE_F(b, (size_t)m->head_cap * top_max);
    m->top_n = (int32_t *)carve(b, (size_t)m->head_cap * sizeof(int32_t));
    m->top_ws_bytes = maxz(splash_cuda_topk_workspace_bytes(m->head_cap, d->vocab, top_max),
                           splash_cuda_argmax_workspace_bytes(m->head_cap, d->vocab));
    m->top_ws = carve(b, m->top_ws_bytes);
    if (m->n_taps) m->taps = CARVE_F(b, R * (size_t)m->n_taps * H);
    if (d->n_gdn) {
        m->verify_cap = m->max_lanes * QWEN35_MAX_VERIFY_ROWS;
        if (m->verify_cap > m->max_rows) m->verify_cap = m->max_rows;
        m->vsave_row = C + 2 * Hv;
        m->vsave = CARVE_F(b, (size_t)d->n_gdn * (size_t)m->verify_cap * m->vsave_row);
        m->commit_dev =
            (splash_cuda_gdn_lane *)carve(b, (size_t)d->n_gdn * m->max_lanes * sizeof(splash_cuda_gdn_lane));
        m->commit_conv = CARVE_F(b, (size_t)QC_COMMIT_BRANCHES * m->verify_cap * C);
    }
    m->greedy_stop = ((size_t)m->max_lanes * sizeof(splash_cuda_greedy_lane) + 255) & ~(size_t)255;
    m->greedy_res = m->greedy_stop + 256;
    m->greedy_bytes = m->greedy_res + (size_t)m->max_lanes * sizeof(splash_greedy_result);
    m->greedy_dev = (uint8_t *)carve(b, m->greedy_bytes);
    m->gdn_ws = nullptr, m->gdn_ws_floats = 0;
    if (d->n_gdn && m->max_rows >= QWEN35_CHUNKED_MIN_ROWS) { /* the chunked kernel's prepared chunks */
        const int lanes = m->max_lanes < m->max_rows / QWEN35_CHUNKED_MIN_ROWS ? m->max_lanes
                                                                              : m->max_rows / QWEN35_CHUNKED_MIN_ROWS;
        const size_t one = splash_cuda_gdn_chunked_ws_floats(d->hv, d->dk, d->dv, lanes, 1);
        const size_t all = one * (size_t)((m->max_rows + SPLASH_CUDA_GDN_CHUNK - 1) / SPLASH_CUDA_GDN_CHUNK);
        if (one) { /* 0: a shape the chunked kernel does not take (its lanes run the recurrence) */
            m->gdn_ws_floats =
                maxz(one, all < GDN_WORKSPACE_BUDGET / sizeof(float) ? all : GDN_WORKSPACE_BUDGET / sizeof(float));
            m->gdn_ws = CARVE_F(b, m->gdn_ws_floats);
        }
    }
    if (m->w.max_q4_cols) m->xprep_mem = carve(b, splash_q4_xprep_bytes(m->w.max_q4_cols));
    const bool bulk = m->use_gemm && m->w.max_q4_cols && m->max_rows >= QWEN35_CHUNKED_MIN_ROWS; /* lanes exist */
    if (bulk) m->gx_mem = carve(b, splash_q4_gemm_x_bytes(m->max_rows, m->w.max_q4_cols));
    m->wexp = nullptr, m->blas_ws = nullptr;
    if (bulk && m->blas && m->max_rows >= m->blas_min_rows) {
        m->wexp = (uint16_t *)carve(b, gemm_weights_max(m) * sizeof(uint16_t));
        m->blas_ws = carve(b, SPLASH_CUDA_BLAS_WORKSPACE);
    }
}

static int alloc_scratch(qc_model *m, splash_error *err) {
    bump b = {nullptr, 0};
    plan_scratch(m, &b);
    m->scratch_bytes = b.off;
    cudaError_t e = cudaMalloc(&m->scratch, m->scratch_bytes);
    if (e != cudaSuccess) {
        m->scratch = nullptr;
        return splash_fail(err, SPLASH_E_NOMEM, "cudaMalloc of %zu MiB of scratch for %d rows: %s", m->scratch_bytes >> 20,
                           m->max_rows, cudaGetErrorString(e));
    }
    b.base = (uint8_t *)m->scratch, b.off = 0;
    plan_scratch(m, &b);
    if (m->w.max_q4_cols) splash_q4_xprep_init(&m->xp, m->xprep_mem, m->w.max_q4_cols);
    if (m->gx_mem) splash_q4_gemm_x_init(&m->gx, m->gx_mem, m->max_rows, m->w.max_q4_cols);
    if (m->d.n_gdn) {
        e = cudaMallocHost((void **)&m->commit_host,
                           (size_t)m->d.n_gdn * m->max_lanes * sizeof(splash_cuda_gdn_lane));
        if (e != cudaSuccess) {
            m->commit_host = nullptr;
            return splash_fail(err, SPLASH_E_NOMEM, "cudaMallocHost for commit: %s", cudaGetErrorString(e));
        }
    }
    if ((e = cudaMallocHost((void **)&m->greedy_host, m->greedy_bytes)) != cudaSuccess) {
        m->greedy_host = nullptr;
        return splash_fail(err, SPLASH_E_NOMEM, "cudaMallocHost for the greedy decisions: %s", cudaGetErrorString(e));
    }
    m->pending = (qc_pending *)calloc((size_t)m->max_lanes, sizeof *m->pending);
    m->commit_p = (qc_pending *)calloc((size_t)m->max_lanes, sizeof *m->commit_p);
    m->commit_n = (int *)calloc((size_t)m->max_lanes * 2, sizeof *m->commit_n);
    m->commit_at = m->commit_n ? m->commit_n + m->max_lanes : nullptr;
    m->bulk = (qc_rows *)calloc((size_t)m->max_lanes, sizeof *m->bulk);
    if (!m->pending || !m->commit_p || !m->commit_n || !m->bulk) return splash_fail(err, SPLASH_E_NOMEM, "out of memory");
    if (m->d.moe) {
        int rc = splash_cuda_moe_scratch_init(&m->moe, m->max_rows, m->d.hidden, m->d.expert_inter, m->d.top_k);
        if (rc)
            return splash_fail(err, rc, "MoE scratch for %d rows (hidden %d, expert intermediate %d, top-%d)",
                               m->max_rows, m->d.hidden, m->d.expert_inter, m->d.top_k);
    }
    return 0;
}

/* ---- attach-time buffers -------------------------------------------------------- */

static void free_attach(qc_model *m) {
    qc_graphs_clear(&m->graphs); /* they hold the pointers freed here */
    if (m->attn_ws) cudaFree(m->attn_ws);
    if (m->desc_dev) cudaFree(m->desc_dev);
    if (m->desc_host) cudaFreeHost(m->desc_host);
    free(m->chunks);
    free(m->row_bulk);
    m->attn_ws = nullptr, m->desc_dev = nullptr, m->desc_host = nullptr, m->chunks = nullptr, m->row_bulk = nullptr;
    m->attn_ws_bytes = 0;
}

static void c_free(void *impl) {
    qc_model *m = (qc_model *)impl;
    if (!m) return;
    if (m->stream) cudaStreamSynchronize((cudaStream_t)m->stream);
    free_attach(m);
    drop_f16_copies(m);
    if (m->scratch) cudaFree(m->scratch);
    if (m->commit_host) cudaFreeHost(m->commit_host);
    if (m->greedy_host) cudaFreeHost(m->greedy_host);
    splash_cuda_moe_scratch_free(&m->moe);
    splash_cuda_blas_close(m->blas);
    qc_weights_free(&m->w);
    if (m->stream) cudaStreamDestroy((cudaStream_t)m->stream);
    for (int i = 0; i < QC_COMMIT_BRANCHES; i++) {
        if (m->commit_streams[i]) cudaStreamDestroy((cudaStream_t)m->commit_streams[i]);
        if (m->commit_join[i]) cudaEventDestroy((cudaEvent_t)m->commit_join[i]);
    }
    if (m->commit_fork) cudaEventDestroy((cudaEvent_t)m->commit_fork);
    if (m->commit_up) cudaEventDestroy((cudaEvent_t)m->commit_up);
    if (m->greedy_done) cudaEventDestroy((cudaEvent_t)m->greedy_done);
    free(m->pending);
    free(m->commit_p);
    free(m->commit_n);
    free(m->bulk);
    free(m->tap_layers);
    free(m);
}

/* What the device kernels support; the first unsupported dimension named. */
static int check_dims(const qwen35_dims *d, splash_error *err) {
    if (d->n_attn && d->head_dim != 64 && d->head_dim != 128 && d->head_dim != 256)
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "CUDA backend: attention head_dim %d (64, 128 or 256)", d->head_dim);
    if (d->n_gdn && d->dk != 32 && d->dk != 64 && d->dk != 128)
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "CUDA backend: GDN key_dim %d (32, 64 or 128)", d->dk);
    if (d->n_gdn && (d->dv > SPLASH_CUDA_GDN_MAX_DV || d->dv % 4))
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "CUDA backend: GDN value_dim %d (a multiple of 4, at most %d)",
                           d->dv, SPLASH_CUDA_GDN_MAX_DV);
    if (d->n_gdn && d->conv_kernel > SPLASH_CUDA_GDN_MAX_K)
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "CUDA backend: GDN conv_kernel %d (at most %d)", d->conv_kernel,
                           SPLASH_CUDA_GDN_MAX_K);
    if (d->moe && (d->experts > SPLASH_CUDA_MOE_MAX_EXPERTS || d->top_k > SPLASH_CUDA_MOE_MAX_TOPK ||
                   d->hidden % 64 || d->expert_inter % 64))
        return splash_fail(err, SPLASH_E_UNSUPPORTED,
                           "CUDA backend: MoE with %d experts, top-%d, hidden %d, expert intermediate %d (at most %d "
                           "experts, top-%d, widths multiples of 64)",
                           d->experts, d->top_k, d->hidden, d->expert_inter, SPLASH_CUDA_MOE_MAX_EXPERTS,
                           SPLASH_CUDA_MOE_MAX_TOPK);
    return 0;
}

static int c_load(splash_package *pkg, const splash_model_options *opt, void **impl, splash_error *err) {
    *impl = nullptr;
    splash_model_options o;
    memset(&o, 0, sizeof o);
    if (opt) o = *opt;
    if (o.max_rows <= 0) o.max_rows = DEFAULT_MAX_ROWS;
    if (o.max_lanes <= 0) o.max_lanes = 1;
    if (o.max_rows > 65535 || o.max_lanes > 4096)
        return splash_fail(err, SPLASH_E_RANGE, "model options: max_rows %d / max_lanes %d beyond the CUDA backend's "
                           "65535 / 4096", o.max_rows, o.max_lanes);
    if (o.n_taps < 0 || (o.n_taps > 0 && !o.tap_layers))
        return splash_fail(err, SPLASH_E_INVALID, "model options: n_taps %d without tap_layers", o.n_taps);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1)
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "device \"cuda\": no CUDA device is visible");
    qc_model *m = (qc_model *)calloc(1, sizeof *m);
    if (!m) return splash_fail(err, SPLASH_E_NOMEM, "out of memory");
    int rc;
    const json_value *model = json_get(splash_package_manifest(pkg), "model");
    const qwen35_dims *d = &m->d;
    if ((rc = qwen35_dims_parse(model, splash_package_architecture(pkg), &m->d, err))) goto fail;
    if ((rc = check_dims(d, err))) goto fail;
    if (d->n_attn &&
        (rc = splash_cuda_kv_layout_init(&m->kv, (int)o.kv_format, d->n_attn, d->kv_heads, d->head_dim,
                                         QWEN35_PAGE_TOKENS))) {
        rc = splash_fail(err, rc, "KV format %d: the CUDA backend implements f32, bf16 and int8 pages", (int)o.kv_format);
        goto fail;
    }
    for (int i = 0; i < o.n_taps; i++)
        if (o.tap_layers[i] < 0 || o.tap_layers[i] >= d->n_layers) {
            rc = splash_fail(err, SPLASH_E_INVALID, "model options: tap layer %d outside [0, %d)", o.tap_layers[i],
                             d->n_layers);
            goto fail;
        }
    if (o.n_taps) {
        m->tap_layers = (int *)malloc((size_t)o.n_taps * sizeof(int));
        if (!m->tap_layers) {
            rc = splash_fail(err, SPLASH_E_NOMEM, "out of memory");
            goto fail;
        }
        memcpy(m->tap_layers, o.tap_layers, (size_t)o.n_taps * sizeof(int));
    }
    m->n_taps = o.n_taps;
    m->max_rows = o.max_rows;
    m->max_lanes = o.max_lanes;
    m->use_graphs = qc_graphs_enabled();
    {
        const char *v = getenv("SPLASH_CUDA_GEMM"); /* 0: every product 16 rows a launch (fp32-grade prefill) */
        m->use_gemm = !(v && !strcmp(v, "0"));
        v = getenv("SPLASH_TEST_RANDOM_ROUTE"); /* splash bench --random-route */
        m->hash_route = v && !strcmp(v, "1");
    }
    {
        cudaStream_t s;
        cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        if (e != cudaSuccess) {
            rc = splash_fail(err, SPLASH_E_IO, "cudaStreamCreate: %s", cudaGetErrorString(e));
            goto fail;
        }
        m->stream = s;
        m->graphs.stream = s;
        for (int i = 0; i < QC_COMMIT_BRANCHES && e == cudaSuccess; i++) {
            cudaEvent_t ev;
            if ((e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) == cudaSuccess) m->commit_streams[i] = s;
            if (e == cudaSuccess && (e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) == cudaSuccess)
                m->commit_join[i] = ev;
        }
        cudaEvent_t ev;
        if (e == cudaSuccess && (e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) == cudaSuccess)
            m->commit_fork = ev;
        if (e == cudaSuccess && (e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) == cudaSuccess)
            m->commit_up = ev;
        if (e == cudaSuccess && (e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) == cudaSuccess)
            m->greedy_done = ev;
        if (e != cudaSuccess) {
            rc = splash_fail(err, SPLASH_E_IO, "the commit's streams: %s", cudaGetErrorString(e));
            goto fail;
        }
    }
    if ((rc = qc_weights_upload(pkg, d, &m->w, err))) {
        splash_error_prefix(err, "%s", splash_package_dir(pkg));
        goto fail;
    }
    m->gdn_state_floats = d->n_gdn ? (size_t)(d->conv_kernel - 1) * d->conv_dim + (size_t)d->hv * d->dk * d->dv : 0;
    m->state_floats = (size_t)d->n_gdn * m->gdn_state_floats;
    /* cuBLASLt for long prefill chunks, when the library is there (else the
     * built-in GEMM takes them: same results within fp16 roundings) */
    { /* tests: the fixtures' prompts are short and their matrices small */
        const char *v = getenv("SPLASH_CUDA_BLAS_MIN_ROWS"), *w = getenv("SPLASH_CUDA_BLAS_MIN_WEIGHTS");
        m->blas_min_rows = v && atoi(v) > 0 ? atoi(v) : QC_BLAS_MIN_ROWS;
        m->blas_min_weights = w && atoll(w) > 0 ? (size_t)atoll(w) : QC_BLAS_MIN_WEIGHTS;
    }
    if (m->use_gemm && o.max_rows >= m->blas_min_rows && gemm_weights_max(m) && splash_cuda_blas_open(&m->blas))
        m->blas = nullptr;
    if ((rc = alloc_scratch(m, err))) goto fail;
    m->needs.page_tokens = QWEN35_PAGE_TOKENS;
    m->needs.page_bytes = d->n_attn ? m->kv.page_bytes : 0;
    m->needs.state_bytes = m->state_floats * sizeof(float);
    m->needs.weight_bytes = m->w.bytes;
    m->needs.scratch_bytes = m->scratch_bytes;
    m->needs.vocab = d->vocab;
    m->needs.max_top = splash_cuda_topk_max_k(d->vocab); /* its per-row merge bounds chunks x k */
    if (m->needs.max_top > SPLASH_MAX_TOP) m->needs.max_top = SPLASH_MAX_TOP;
    m->needs.hidden = d->hidden;
    m->needs.max_positions = d->max_positions;
    m->needs.spare_bytes = f16_copies_want(m);
    *impl = m;
    return 0;
fail:
    c_free(m);
    return rc;
}

static const splash_model_needs *c_needs(const void *impl) { return &((const qc_model *)impl)->needs; }

/* The descriptor's parts (cuda_model.h); the page tables last, so a forward
 * uploads only the prefix it uses. */
static qc_desc_plan plan_desc(const qc_model *m) {
    qc_desc_plan p;
    size_t off = 0;
    const size_t R = (size_t)m->max_rows, L = (size_t)m->max_lanes;
#define PART(field, bytes) (p.field = off, off += align256(bytes))
    PART(pos, R * 4);
    PART(tok, R * 4);
    PART(vmap, R * 4);
    PART(head_rows, R * 4);
    PART(tap_rows, R * 4);
    PART(alanes, L * sizeof(splash_cuda_attn_lane));
    PART(clanes, (size_t)m->max_chunks * L * sizeof(splash_cuda_attn_lane));
    PART(glanes, (size_t)m->d.n_gdn * L * sizeof(splash_cuda_gdn_lane));
    PART(pages, L * (size_t)m->pages_per_lane * 4);
#undef PART
    p.bytes = off;
    return p;
}

static int c_attach(void *impl, void *kv_pages, int n_pages, void *states, int n_slots, splash_error *err) {
    qc_model *m = (qc_model *)impl;
    const qwen35_dims *d = &m->d;
    if (n_pages < 0 || n_slots < 1 || (n_pages > 0 && !kv_pages) || (m->state_floats && !states))
        return splash_fail(err, SPLASH_E_INVALID, "attach: %d pages at %p, %d slots at %p", n_pages, kv_pages, n_slots,
                           states);
    cudaStreamSynchronize((cudaStream_t)m->stream);
    free_attach(m);
    m->kv_pool = nullptr, m->states = nullptr, m->n_pages = 0, m->n_slots = 0, m->n_pending = 0;
    int ctx = d->max_positions, ws_rows = m->max_rows, ws_rows_long = m->max_rows; /* no attention: one chunk */
    size_t ws = 0;
    if (d->n_attn) {
        const int64_t pool_ctx = (int64_t)n_pages * QWEN35_PAGE_TOKENS;
        if (pool_ctx < ctx) ctx = (int)pool_ctx;
        if (ctx > 0) {
            /* rows per call of either split that the workspace budget holds */
            for (int kind = 0; kind < 2; kind++) {
                const int split = kind ? SPLASH_CUDA_ATTN_SPLIT_LONG : 0;
                const size_t one = splash_cuda_attn_workspace_bytes(1, d->heads, d->head_dim, ctx, split);
                if (!one) return splash_fail(err, SPLASH_E_RANGE, "attach: attention context %d unsupported", ctx);
                size_t rows = ATTN_WORKSPACE_BUDGET / one;
                if (rows < 1) rows = 1;
                if (rows > (size_t)m->max_rows) rows = (size_t)m->max_rows;
                (kind ? ws_rows_long : ws_rows) = (int)rows;
                ws = maxz(ws, splash_cuda_attn_workspace_bytes((int)rows, d->heads, d->head_dim, ctx, split));
            }
        }
    }
    m->ctx_cap = ctx;
    m->pages_per_lane = d->n_attn ? (ctx + QWEN35_PAGE_TOKENS - 1) / QWEN35_PAGE_TOKENS : 0;
    m->attn_rows = ws_rows, m->attn_rows_long = ws_rows_long;
    /* a call ends when full (a bulk call holds at least ws_rows_long rows:
     * its forward's contexts and split need no more workspace than the
     * pool's longest context at the shortest long split), where the rows
     * change kind or split (at most twice a bulk lane: into it and out of
     * it), or at the last row */
    m->max_chunks = (m->max_rows + ws_rows - 1) / ws_rows + (m->max_rows + ws_rows_long - 1) / ws_rows_long +
                    2 * m->max_lanes + 1;
    m->plan = plan_desc(m);
    cudaError_t e = cudaSuccess;
    if (ws) e = cudaMalloc(&m->attn_ws, ws);
    if (e == cudaSuccess) e = cudaMalloc((void **)&m->desc_dev, m->plan.bytes);
    if (e == cudaSuccess) e = cudaMallocHost((void **)&m->desc_host, m->plan.bytes);
    m->chunks = (qc_chunk *)calloc((size_t)m->max_chunks, sizeof *m->chunks);
    m->row_bulk = (uint8_t *)malloc((size_t)m->max_rows);
    if (e != cudaSuccess || !m->chunks || !m->row_bulk) {
        free_attach(m); /* what was allocated (the pointers started NULL) */
        return splash_fail(err, SPLASH_E_NOMEM, "attach: attention workspace (%zu MiB) and forward descriptor: %s",
                           ws >> 20, e != cudaSuccess ? cudaGetErrorString(e) : "out of host memory");
    }
    m->attn_ws_bytes = ws;
    m->kv_pool = (uint8_t *)kv_pages;
    m->n_pages = n_pages;
    m->states = (float *)states;
    m->n_slots = n_slots;
    return 0;
}

static void *c_alloc(void *impl, size_t bytes) {
    qc_model *m = (qc_model *)impl;
    const cudaStream_t s = (cudaStream_t)m->stream;
    void *p = nullptr;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) return nullptr;
    /* zeroed on our stream and waited for: the stream is non-blocking, so a
     * memset on the legacy stream would not be ordered before our kernels */
    if (cudaMemsetAsync(p, 0, bytes ? bytes : 1, s) != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess) {
        cudaFree(p);
        return nullptr;
    }
    return p;
}

static void c_free_mem(void *impl, void *p) {
    qc_model *m = (qc_model *)impl;
    if (!p) return;
    cudaStreamSynchronize((cudaStream_t)m->stream); /* nothing of ours still reads it */
    cudaFree(p);
}

static int slot_ok(const qc_model *m, int slot) { return m->n_slots > 0 && slot >= 0 && slot < m->n_slots; }

/* The slot's entry in pending (its rows verified by the last forward), or -1. */
static int pending_at(const qc_model *m, int slot) {
    for (int k = 0; k < m->n_pending; k++)
        if (m->pending[k].slot == slot) return k;
    return -1;
}

static void drop_pending(qc_model *m, int slot) {
    for (int i = 0; i < m->n_pending; i++)
        if (m->pending[i].slot == slot) m->pending[i] = m->pending[--m->n_pending];
}

static int c_reset(void *impl, int slot) {
    qc_model *m = (qc_model *)impl;
    if (!slot_ok(m, slot)) return SPLASH_E_RANGE;
    if (m->state_floats) { /* synchronous, like every call here but forward's kernels: callers may copy slots next */
        SPLASH_CUDA_TRY(cudaMemsetAsync(m->states + (size_t)slot * m->state_floats, 0, m->state_floats * sizeof(float),
                                        (cudaStream_t)m->stream));
        SPLASH_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)m->stream));
    }
    drop_pending(m, slot);
    return 0;
}

/* The replay's kernels (what a commit graph holds): per GDN layer the conv
 * (advancing the conv states; its outputs into the branch's commit_conv) and
 * the recurrence in place, both over the committing lanes at once, each lane
 * on its rows [first, first + n) of the verify save (its descriptor's
 * first_row and n_rows).  The layers do not depend on each other: layer gi
 * runs on branch gi % QC_COMMIT_BRANCHES, forked from the model's stream and
 * joined back (captured, the graph's parallel branches), so the ~2
 * latency-bound kernels a layer overlap instead of queueing (27B: 48 layers). */
typedef struct replay_ctx {
    qc_model *m;
    int n_lanes, max_rows; /* max_rows: the lanes' verified rows, which bound their n_rows */
} replay_ctx;

static int replay_kernels(void *ctx) {
    const replay_ctx *r = (const replay_ctx *)ctx;
    qc_model *m = r->m;
    const qwen35_dims *d = &m->d;
    const cudaStream_t s = (cudaStream_t)m->stream;
    const int C = d->conv_dim, Hv = d->hv;
    const int nb = d->n_gdn < QC_COMMIT_BRANCHES ? d->n_gdn : QC_COMMIT_BRANCHES;
    /* Early loads (splash_q4_early_loads): a branch's first kernel waits for the fork in
     * full, and each later one follows the layer before's recurrence, which writes only that
     * layer's delta states; the lanes, taps, this layer's conv and delta states and the saved
     * rows were all written before the fork. */
    const int early = splash_q4_early_loads();
    SPLASH_CUDA_TRY(cudaEventRecord((cudaEvent_t)m->commit_fork, s));
    for (int b = 0; b < nb; b++)
        SPLASH_CUDA_TRY(cudaStreamWaitEvent((cudaStream_t)m->commit_streams[b], (cudaEvent_t)m->commit_fork, 0));
    for (int li = 0; li < d->n_layers; li++) {
        const qc_layer *L = &m->w.layers[li];
        if (L->is_attn) continue;
        const int gi = L->index, b = gi % QC_COMMIT_BRANCHES;
        const cudaStream_t bs = (cudaStream_t)m->commit_streams[b];
        const splash_cuda_gdn_lane *lanes = m->commit_dev + (size_t)gi * r->n_lanes;
        float *conv = m->commit_conv + (size_t)b * m->verify_cap * C;
        const float *save = m->vsave + (size_t)gi * m->verify_cap * m->vsave_row;
        int rc = splash_cuda_gdn_conv(L->conv_t, C, d->conv_kernel, lanes, r->n_lanes, r->max_rows, save, m->vsave_row,
                                      conv, (size_t)C, early, bs);
        if (rc) return rc;
        splash_cuda_gdn_args a;
        memset(&a, 0, sizeof a);
        a.lanes = lanes, a.n_lanes = r->n_lanes;
        a.hk = d->hk, a.hv = Hv, a.dk = d->dk, a.dv = d->dv;
        a.mixed = conv, a.ldm = (size_t)C;
        a.a = save + C, a.b = save + C + Hv, a.ldab = m->vsave_row;
        a.neg_a = L->neg_a, a.dt_bias = L->dt_bias;
        a.eps = d->rms_eps;
        a.early = early;
        if ((rc = splash_cuda_gdn_recurrent(&a, bs))) return rc;
    }
    for (int b = 0; b < nb; b++) {
        SPLASH_CUDA_TRY(cudaEventRecord((cudaEvent_t)m->commit_join[b], (cudaStream_t)m->commit_streams[b]));
        SPLASH_CUDA_TRY(cudaStreamWaitEvent(s, (cudaEvent_t)m->commit_join[b], 0));
    }
    return 0;
}

/* The greedy decisions of c_commit_greedy (its lanes and stop ids in greedy_host), queued on
 * the stream: the lanes uploaded, the kernel (which writes each lane's count into the commit's
 * descriptors when n_commit > 0: the replay behind it reads them), the results copied back,
 * greedy_done recorded. */
static int greedy_queue(qc_model *m, int n, int n_stop, int n_commit) {
    const cudaStream_t s = (cudaStream_t)m->stream;
    uint8_t *gd = m->greedy_dev;
    SPLASH_CUDA_TRY(cudaMemcpyAsync(gd, m->greedy_host, m->greedy_res, cudaMemcpyHostToDevice, s));
    int rc = splash_cuda_greedy_decide((const splash_cuda_greedy_lane *)gd, n, m->top_ids, m->top_vals, m->dec_top_k,
                                       m->d.vocab, qc_desc_i32(m, m->plan.tok), (const int32_t *)(gd + m->greedy_stop),
                                       n_stop, (splash_greedy_result *)(gd + m->greedy_res), m->commit_dev,
                                       n_commit ? m->d.n_gdn : 0, n_commit, m->stream);
    if (rc) return rc;
    SPLASH_CUDA_TRY(cudaMemcpyAsync(m->greedy_host + m->greedy_res, gd + m->greedy_res,
                                    (size_t)n * sizeof(splash_greedy_result), cudaMemcpyDeviceToHost, s));
    SPLASH_CUDA_TRY(cudaEventRecord((cudaEvent_t)m->greedy_done, s));
    return 0;
}

/* A replay's counts from the device: its lanes' greedy decisions (greedy_queue) between the
 * descriptors' upload and the replay. */
typedef struct qc_decide {
    int n, n_stop;
} qc_decide;

/* Replays the first n[i] saved verify rows of p[i] on its slot, every lane
 * at once, as a PREFILL of those rows would: the lanes' descriptors uploaded,
 * then the kernels, a graph per shape (the lanes' places and verified rows in
 * the save: the counts travel in the descriptors, so one graph serves every
 * count).  Not waited for: the next forward, snapshot or restore queues
 * behind it on the stream, while the host goes on (the draft's append and next
 * proposals run on the draft's stream meanwhile); the pinned commit_host is
 * rewritten only after its last upload ran (commit_up).  dec: the counts decided on
 * the device instead (c_commit_greedy), n[] then the lanes' verified rows. */
static int replay(qc_model *m, const qc_pending *p, const int *n, int n_lanes, const qc_decide *dec) {
    const qwen35_dims *d = &m->d;
    const cudaStream_t s = (cudaStream_t)m->stream;
    SPLASH_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)m->commit_up));
    int max_rows = 0;
    for (int i = 0; i < n_lanes; i++) max_rows = p[i].n_rows > max_rows ? p[i].n_rows : max_rows;
    for (int gi = 0; gi < d->n_gdn; gi++)
        for (int i = 0; i < n_lanes; i++) {
            splash_cuda_gdn_lane *l = &m->commit_host[(size_t)gi * n_lanes + i];
            memset(l, 0, sizeof *l);
            l->conv_state = qc_conv_state(m, p[i].slot, gi);
            l->s_in = l->s_out = qc_delta_state(m, p[i].slot, gi);
            l->first_row = p[i].first, l->n_rows = n[i], l->update_conv = 1;
        }
    SPLASH_CUDA_TRY(cudaMemcpyAsync(m->commit_dev, m->commit_host,
                                    (size_t)d->n_gdn * n_lanes * sizeof(splash_cuda_gdn_lane), cudaMemcpyHostToDevice,
                                    s));
    SPLASH_CUDA_TRY(cudaEventRecord((cudaEvent_t)m->commit_up, s));
    if (dec) {
        int rc = greedy_queue(m, dec->n, dec->n_stop, n_lanes);
        if (rc) return rc;
    }
    replay_ctx r = {m, n_lanes, max_rows};
    int key[QC_GRAPH_KEY_MAX], nk = 0;
    key[nk++] = 2; /* a commit (forward keys start with 1) */
    for (int i = 0; i < n_lanes && nk + 2 <= QC_GRAPH_KEY_MAX; i++) key[nk++] = p[i].first, key[nk++] = p[i].n_rows;
    const bool graph = m->use_graphs && nk == 1 + 2 * n_lanes;
    return graph ? qc_graph_run(&m->graphs, qc_graph_find(&m->graphs, key, nk), replay_kernels, &r)
                 : replay_kernels(&r);
}

/* The commits of n lanes (model.h, splash_model_commit_lanes): every lane
 * checked first, then the lanes with rows to keep replayed together. */
static int c_commit_lanes(void *impl, const int *slots, const int *n_acc, int n, splash_error *err) {
    qc_model *m = (qc_model *)impl;
    int *at = m->commit_at;
    if (n > m->max_lanes)
        return splash_fail(err, SPLASH_E_RANGE, "commit: %d lanes, more than the %d a forward holds", n, m->max_lanes);
    for (int i = 0; i < n; i++) {
        const int slot = slots[i];
        if (!slot_ok(m, slot))
            return splash_fail(err, SPLASH_E_RANGE, "commit: slot %d outside [0, %d)", slot, m->n_slots);
        if ((at[i] = pending_at(m, slot)) < 0)
            return splash_fail(err, SPLASH_E_INVALID,
                               "commit: slot %d has no verified rows (commit follows the VERIFY forward, before the next one)",
                               slot);
        const qc_pending *p = &m->pending[at[i]];
        if (n_acc[i] < 0 || n_acc[i] > p->n_rows)
            return splash_fail(err, SPLASH_E_RANGE, "commit: %d rows accepted of the %d verified on slot %d", n_acc[i],
                               p->n_rows, slot);
    }
    qc_pending *p = m->commit_p;
    int *cnt = m->commit_n, k = 0;
    for (int i = 0; i < n; i++)
        if (n_acc[i] > 0) p[k] = m->pending[at[i]], cnt[k++] = n_acc[i];
    if (k > 0 && m->d.n_gdn) {
        int rc = replay(m, p, cnt, k, nullptr);
        if (rc) return splash_fail(err, rc, "commit: the GDN replay on the device failed (%s)", splash_status_name(rc));
    }
    for (int i = 0; i < n; i++) drop_pending(m, slots[i]); /* by slot: removal moves the last entry */
    return 0;
}

static int c_commit(void *impl, int slot, int n, splash_error *err) { return c_commit_lanes(impl, &slot, &n, 1, err); }

/* Greedy lanes decided on the device and committed (model.h, splash_model_commit_greedy):
 * every lane checked against the last forward first (its verified rows, its decision rows
 * among the head's), then the decisions queued between the commit descriptors' upload and the
 * replay (each lane's count written into them on the device: the replay's graph is the one
 * commit_lanes uses for the same verified rows), and the host waits for the decisions only. */
static int c_commit_greedy(void *impl, const splash_greedy_lane *gl, int n, const int32_t *stop, int n_stop,
                           splash_greedy_result *res, splash_error *err) {
    qc_model *m = (qc_model *)impl;
    if (n > m->max_lanes)
        return splash_fail(err, SPLASH_E_RANGE, "commit greedy: %d lanes, more than the %d a forward holds", n,
                           m->max_lanes);
    if (n > 0 && !m->dec_top_k) /* model.c decides on the host from the rows the forward copied */
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "commit greedy: the last forward's TOP rows are not on the device");
    const int32_t *head = (const int32_t *)(m->desc_host + m->plan.head_rows);
    splash_cuda_greedy_lane *dl = (splash_cuda_greedy_lane *)m->greedy_host;
    int *at = m->commit_at;
    SPLASH_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)m->greedy_done)); /* greedy_host's last upload ran */
    for (int i = 0; i < n; i++) {
        const splash_greedy_lane *l = &gl[i];
        if (!slot_ok(m, l->slot) || (at[i] = pending_at(m, l->slot)) < 0) /* model.c refused a slot named twice */
            return splash_fail(err, SPLASH_E_INVALID, "commit greedy: slot %d has no verified rows", l->slot);
        int h = 0;
        while (h < m->dec_n_head && head[h] != l->row) h++;
        bool rows_ok = l->n_feed + l->n_props <= m->pending[at[i]].n_rows && h + l->n_props < m->dec_n_head;
        for (int r = 1; rows_ok && r <= l->n_props; r++) rows_ok = head[h + r] == l->row + r;
        if (!rows_ok)
            return splash_fail(err, SPLASH_E_RANGE,
                               "commit greedy: slot %d: rows %d..%d are not its verified decision rows", l->slot, l->row,
                               l->row + l->n_props);
        dl[i] = {h, l->row, l->n_feed, l->n_props, l->limit, i};
    }
    if (n_stop) memcpy(m->greedy_host + m->greedy_stop, stop, (size_t)n_stop * sizeof(int32_t));
    qc_pending *p = m->commit_p;
    int *cnt = m->commit_n;
    for (int i = 0; i < n; i++) p[i] = m->pending[at[i]], cnt[i] = p[i].n_rows; /* the decisions write the counts */
    const qc_decide dec = {n, n_stop};
    int rc = n <= 0 ? 0 : m->d.n_gdn ? replay(m, p, cnt, n, &dec) : greedy_queue(m, n, n_stop, 0);
    if (!rc && n > 0 && cudaEventSynchronize((cudaEvent_t)m->greedy_done) != cudaSuccess) rc = SPLASH_E_IO;
    if (rc) return splash_fail(err, rc, "commit greedy: the decisions on the device failed (%s)", splash_status_name(rc));
    if (n > 0) memcpy(res, m->greedy_host + m->greedy_res, (size_t)n * sizeof *res);
    for (int i = 0; i < n; i++) drop_pending(m, gl[i].slot);
    return 0;
}

static int c_snapshot(void *impl, int slot, void *dst) {
    qc_model *m = (qc_model *)impl;
    if (!slot_ok(m, slot) || (!dst && m->state_floats)) return SPLASH_E_RANGE;
    if (!m->state_floats) return 0;
    const cudaStream_t s = (cudaStream_t)m->stream;
    SPLASH_CUDA_TRY(cudaMemcpyAsync(dst, m->states + (size_t)slot * m->state_floats, m->state_floats * sizeof(float),
                                    cudaMemcpyDeviceToDevice, s));
    SPLASH_CUDA_TRY(cudaStreamSynchronize(s));
    return 0;
}

static int c_restore(void *impl, int slot, const void *src) {
    qc_model *m = (qc_model *)impl;
    if (!slot_ok(m, slot) || (!src && m->state_floats)) return SPLASH_E_RANGE;
    if (m->state_floats) {
        const cudaStream_t s = (cudaStream_t)m->stream;
        SPLASH_CUDA_TRY(cudaMemcpyAsync(m->states + (size_t)slot * m->state_floats, src, m->state_floats * sizeof(float),
                                        cudaMemcpyDeviceToDevice, s));
        SPLASH_CUDA_TRY(cudaStreamSynchronize(s));
    }
    drop_pending(m, slot);
    return 0;
}

/* The last forward's TAPS rows, on the device (model.h, splash_model_device_taps). */
static const float *c_device_taps(void *impl) {
    const qc_model *m = (const qc_model *)impl;
    return m->n_taps ? m->taps : nullptr;
}

/* The stream every forward, commit, snapshot and restore runs on (model.h). */
static void *c_device_stream(void *impl) { return ((qc_model *)impl)->stream; }

/* Waits for what the stream holds: a commit's replay (model.h, splash_model_finish). */
static int c_finish(void *impl) {
    SPLASH_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)((qc_model *)impl)->stream));
    return 0;
}

/* The device lm_head for a draft that shares it (model.h, splash_model_device_weight). */
static const void *c_device_weight(void *impl, const void *data) {
    const qc_model *m = (const qc_model *)impl;
    return data == m->w.lm_head_data ? (const void *)&m->w.lm_head : NULL;
}

extern "C" const splash_model_ops qwen35_cuda_ops = {
    c_load, c_free, c_needs, c_attach, c_alloc, c_free_mem, c_reset, qc_forward, c_commit, c_commit_lanes, c_snapshot,
    c_restore,
    c_device_taps, c_device_stream, c_finish, c_device_weight, c_use_spare, c_commit_greedy,
};
