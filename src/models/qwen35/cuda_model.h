/* cuda_model.h - Qwen3.5 (dense and MoE) on the CUDA backend: the same
 * splash_model_ops contract as the CPU model (qwen35.h), the same memory
 * layouts, the forward composed of the kernels in src/backend/cuda.
 *
 * Files (C-style C++ compiled by nvcc; never part of the default build):
 *   cuda_model.h    this header: device weights, the model, the per-forward
 *                   descriptor, functions shared by the files below
 *   cuda_weights.cu binds the package with the CPU's binder (weights.c), then
 *                   uploads everything into ONE device allocation: q4
 *                   matrices repacked to the q4 kernel's tiles, other
 *                   matrices as stored (dense_matmul.h), fp32 vectors
 *   cuda_model.cu   the ops table: load (scratch), attach (attention
 *                   workspace, descriptor), slots, commit, snapshot, restore
 *   cuda_forward.cu one ragged batch: validation, the descriptor upload,
 *                   embedding, the layer loop, taps, final norm + lm_head
 *   cuda_layers.cu  one layer's mixer and FFN: gated attention, GDN, dense
 *                   FFN, MoE
 *   cuda_graphs.cu  decode-shaped forwards and commits captured as CUDA
 *                   graphs, one per shape key, and replayed
 *
 * Memory shared with the runtime (device memory, splash_model_alloc_memory):
 * KV pages byte for byte the CPU's (splash_cuda_kv_layout == cpu_kv_layout)
 * and state slots in qwen35.h's layout (per GDN layer conv [K-1][C] then
 * delta [Hv][dk][dv], fp32), so pages, slots and snapshots copied between
 * the two backends mean the same thing.
 *
 * VERIFY and commit: replay, as the CPU.  A VERIFY lane's GDN recurrence
 * writes the state after its rows to a scratch copy (the slot is untouched)
 * and the conv state does not advance; each verify row's GDN inputs (pre-conv
 * qkv, a, b: C + 2 Hv floats per GDN layer) are saved.  commit(slot, n)
 * re-runs, per GDN layer, the conv (advancing the conv state) and the
 * recurrence on the first n saved rows in place: the same kernels on the same
 * inputs, so the committed state is bit-identical to PREFILL rows.  Keeping
 * the state after every verify row instead would cost Hv*dk*dv floats per row
 * and GDN layer (3 MB a layer on the 27B: 2.4 GB for a 16-row block), and
 * writing them would cost more bandwidth than the replay's one extra read
 * and write of the state per layer.
 *
 * No allocation on the forward path: activations are sized for max_rows at
 * load, the attention workspace and the descriptor at attach.  One CUDA
 * stream, created at load; a forward ends with a stream synchronisation
 * (logits and taps are on the host then); a commit does not (its replay
 * queues on the stream, before whatever the runtime asks next: the next
 * forward, a snapshot, a restore all run on that stream).
 */
#ifndef SPLASH_QWEN35_CUDA_MODEL_H
#define SPLASH_QWEN35_CUDA_MODEL_H

#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "models/qwen35/qwen35.h"
}
#include "backend/cuda/argmax.h"
#include "backend/cuda/blas.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/dense_matmul.h"
#include "backend/cuda/gdn.h"
#include "backend/cuda/greedy.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/q4_gemm.h"
#include "backend/cuda/q4_matmul.h"

extern "C" const splash_model_ops qwen35_cuda_ops;

/* ---- device weights ---------------------------------------------------------- */

/* A matrix on the device: tiled q4 (q4_matmul.h) or as stored (dense_matmul.h). */
typedef struct qc_matrix {
    int rows, cols;
    int is_q4;
    int gemm;                      /* q4 with fp16-safe scales (splash_q4_tiled_fp16_ok): bulk prefill rows take
                                      the tensor-core GEMM (q4_gemm.h) */
    int part_row[4];               /* a stack's parts: the first row of each (cuda_weights.cu) */
    splash_q4_matrix q4;
    splash_cuda_dense_matrix dense;
    const uint16_t *w16;           /* q4 kept expanded to fp16 for cuBLASLt (splash_model_use_spare: inside
                                      qc_model.f16_copies), or NULL: expanded into wexp before each product */
} qc_matrix;

/* One layer; every pointer is device memory inside qc_weights.dev. */
typedef struct qc_layer {
    int is_attn, index;            /* index: ordinal among attention (or GDN) layers */
    const float *input_norm, *post_norm; /* [H] factors (1 + w) */
    /* attention */
    qc_matrix q_proj;              /* [heads*2*hd, H], q|gate interleaved per head */
    qc_matrix k_proj, v_proj;      /* [kvh*hd, H] */
    qc_matrix o_proj;              /* [H, heads*hd] */
    const float *q_norm, *k_norm;  /* [hd] factors */
    /* GDN */
    qc_matrix in_qkv;              /* [C, H] */
    qc_matrix in_z;                /* [Hv*dv, H] */
    qc_matrix in_b, in_a;          /* [Hv, H] */
    qc_matrix out_proj;            /* [H, Hv*dv] */
    const float *conv_t;           /* [K][C] */
    const float *neg_a, *dt_bias;  /* [Hv] */
    const float *gnorm;            /* [dv] */
    /* dense FFN */
    qc_matrix gate, up, down;      /* [I, H], [I, H], [H, I] */
    /* MoE */
    qc_matrix router;              /* [E, H] */
    qc_matrix shared_gate, shared_up, shared_down, shared_expert_gate;
    const splash_q4_matrix *experts_gate, *experts_up, *experts_down; /* host arrays [E + 1] */
    int experts_gemm;              /* every expert fp16-safe: bulk prefill rows take splash_cuda_moe_experts_gemm */
    /* The shared expert as expert E of the arrays above (q4 and the routed
     * experts' shapes): shared_gate, shared_up and shared_down are then views
     * of it, and rows on the grouped step run it as one more slot (one
     * launch chain for both; qc_moe_layer). */
    int shared_slot;
    /* The matrices that read one input stacked into one matrix (one
     * launch): one q4 matrix when all are q4 (splash_q4_repack_stacked_host),
     * one dense matrix when all are f32 / bf16 / f16 of one dtype
     * (put_dense_stacked); rows = 0 when not, and then the parts above are
     * used.  When stacked, the parts above are left empty and their outputs
     * share one buffer, row stride the stack's rows, part i at column
     * part_row[i]: attention q|gate, k, v; GDN qkv, z, b, a; FFN (or shared
     * expert) gate, up; MoE router, shared-expert gate. */
    qc_matrix attn_in, gdn_in, ffn_in, gates_in;
} qc_layer;

typedef struct qc_weights {
    void *dev;                     /* the one device allocation */
    size_t bytes;
    qc_matrix embed, lm_head;      /* lm_head == embed when tied */
    const void *lm_head_data;      /* the package bytes lm_head came from (splash_model_device_weight) */
    const float *final_norm;       /* [H] */
    const float *inv_freq;         /* [rotary_dim / 2] (splash_cuda_rope_inv_freq) */
    qc_layer *layers;              /* host [n_layers] */
    splash_q4_matrix *experts;     /* host [n_layers][3][E + 1] (qc_layer.shared_slot) */
    int max_q4_cols;               /* widest input of a q4 matrix (the xprep capacity) */
} qc_weights;

int qc_weights_upload(const splash_package *pkg, const qwen35_dims *d, qc_weights *w, splash_error *err);
/* Uploading into one device allocation (cuda_weights.cu; also the DFlash
 * draft's, models/dflash/cuda_dflash.cu): a walk over the tensors runs
 * twice, first adding up sizes (dev NULL: nothing is copied), then copying
 * into the one cudaMalloc; every part 256-byte aligned. */
typedef struct qc_upload {
    uint8_t *dev;                  /* base of the allocation, or NULL while sizing */
    size_t off;                    /* next free byte */
    uint8_t *stage;                /* host staging for repacks */
    size_t stage_bytes;
    int max_q4_cols;
    splash_error *err;
} qc_upload;
/* A matrix: q4 repacked to the kernel's tiles, else bytes as stored. */
int qc_upload_matrix(qc_upload *w, const splash_tensor *t, qc_matrix *out);
/* The tensors t[0..n) (n <= 4) that read one input: one stacked matrix when
 * they can be (all q4 of the same columns: qc_matrix.part_row says where
 * each part's rows start, on a 16-row tile; or all f32 / bf16 / f16 of one
 * dtype, one after another), so one launch makes every output; else each its
 * own (apart[i]) and the stack's rows are 0. */
int qc_upload_inputs(qc_upload *w, const splash_tensor *const *t, int n, qc_matrix *stack, qc_matrix *const *apart);
/* n fp32 values; *out their device address (NULL while sizing). */
int qc_upload_vec(qc_upload *w, const float *src, size_t n, const char *name, const float **out);
/* Runs walk(w, ctx) to size, allocates *dev (*bytes), runs it again to copy;
 * *max_q4_cols (when not NULL): the widest q4 matrix's inputs. */
int qc_upload_run(int (*walk)(qc_upload *, void *), void *ctx, void **dev, size_t *bytes, int *max_q4_cols,
                  splash_error *err);
void qc_weights_free(qc_weights *w);

/* ---- the per-forward descriptor ------------------------------------------------- */

/* Everything a forward tells the device, written into pinned host memory and
 * uploaded with one copy.  Byte offsets into that buffer (and into its device
 * mirror); each part 256-byte aligned. */
typedef struct qc_desc_plan {
    size_t pos, tok, vmap, head_rows, tap_rows; /* int32 [max_rows] each */
    size_t pages;                  /* int32 [max_lanes][pages_per_lane] */
    size_t alanes;                 /* splash_cuda_attn_lane [max_lanes]: whole lanes (KV write) */
    size_t clanes;                 /* splash_cuda_attn_lane [max_chunks][max_lanes]: per attention call */
    size_t glanes;                 /* splash_cuda_gdn_lane [n_gdn][max_lanes] */
    size_t bytes;
} qc_desc_plan;

/* One attention call: batch rows [r0, r1) and the lanes that own them. */
typedef struct qc_chunk {
    int r0, r1, n_lanes, min_lane_rows, max_lane_rows, max_ctx;
    int split;                     /* splash_cuda_attn_args.split: 0, or the long split for bulk-prefill rows */
} qc_chunk;

/* Batch rows [r0, r1). */
typedef struct qc_rows {
    int r0, r1;
} qc_rows;

typedef struct qc_pending {
    int slot, first, n_rows;       /* first: its first row in the verify save */
} qc_pending;

/* ---- CUDA graphs (cuda_graphs.cu) ------------------------------------------------- */

#define QC_MAX_GRAPHS 16     /* shape keys kept, least recently used evicted */
#define QC_GRAPH_LANES 64    /* batches of more lanes run eagerly */
#define QC_COMMIT_BRANCHES 8 /* GDN layers replayed at once by a commit */
/* Bulk-prefill ranges of at least this many rows take cuBLASLt (blas.h)
 * when it loaded: below it the fp16 expansion of each matrix costs more
 * than the faster GEMM saves (NOTES.md, bench_q4_matmul --gemm). */
#define QC_BLAS_MIN_ROWS 256
/* ... and matrices of at least this many weights whose rows are a multiple
 * of 8 (cuBLASLt's fast kernels want 16-byte aligned rows of y): on the
 * default model's small matrices the expansion and the library's per-call
 * cost lost to q4_gemm (eval of 1,024 tokens 3,663-3,829 -> 2,726-2,877
 * tokens/s; NOTES.md), and such a model then never loads the library. */
#define QC_BLAS_MIN_WEIGHTS ((size_t)8 << 20)
#define QC_GRAPH_KEY_MAX (7 + QC_GRAPH_LANES)

/* One shape key's graph: seen once -> eager; twice -> captured, then replayed. */
typedef struct qc_graph {
    int key[QC_GRAPH_KEY_MAX];
    int n_key;                     /* 0: an empty entry */
    int seen;                      /* forwards of this key before its capture */
    int failed;                    /* the capture failed: eager for good */
    void *exec;                    /* cudaGraphExec_t */
    uint64_t last_use;
} qc_graph;

/* The graphs of one stream's work (the model's forwards and commits; the
 * DFlash draft's blocks): QC_MAX_GRAPHS keys, least recently used evicted. */
typedef struct qc_graph_set {
    qc_graph graphs[QC_MAX_GRAPHS];
    uint64_t clock;
    struct CUstream_st *stream;    /* where they are captured and launched */
} qc_graph_set;

/* ---- the model ------------------------------------------------------------------ */

typedef struct qc_model {
    qwen35_dims d;
    qc_weights w;
    struct CUstream_st *stream;
    int max_rows, max_lanes;
    int n_taps;
    int *tap_layers;
    splash_model_needs needs;
    splash_cuda_kv_layout kv;
    size_t state_floats;           /* per slot */
    size_t gdn_state_floats;       /* per GDN layer: conv + delta */
    /* runtime memory (attach) */
    uint8_t *kv_pool;
    int n_pages;
    float *states;
    int n_slots;
    int ctx_cap;                   /* longest context: min(pool, max_positions) */
    int pages_per_lane;            /* ceil(ctx_cap / page_tokens) */
    int attn_rows;                 /* rows per attention call (bounds the workspace) */
    int attn_rows_long;            /* the same for bulk-prefill rows (SPLASH_CUDA_ATTN_SPLIT_LONG) */
    int max_chunks;                /* attention calls of a forward at most */
    uint8_t *row_bulk;             /* host [max_rows]: 1 for a row of a bulk-prefill lane (build_desc) */
    void *attn_ws;                 /* device */
    size_t attn_ws_bytes;
    qc_chunk *chunks;              /* host [max_chunks] */
    qc_desc_plan plan;
    uint8_t *desc_host;            /* pinned */
    uint8_t *desc_dev;
    /* scratch: one device allocation (load), activations [max_rows][width] */
    void *scratch;
    float *x, *xn, *tmp;           /* residual, normed, a product before its residual add  [R][H] */
    float *u1;                     /* attn q|gate / GDN pre-conv qkv   [R][max(2*heads*hd, C)] */
    float *u2;                     /* attn q / GDN conv output          [R][max(heads*hd, C)] */
    float *u3;                     /* attn k / GDN z                    [R][max(kvh*hd, Hv*dv)] */
    float *u4;                     /* attn v / GDN gated-norm output    [R][max(kvh*hd, Hv*dv)] */
    float *agate, *aout;           /* attn gate, attention output       [R][heads*hd] */
    float *ga, *gb;                /* GDN a, b projections              [R][Hv] */
    float *ff1, *ff2;              /* FFN / shared-expert hidden        [R][max(I, Is)] */
    float *rlog, *sgate;           /* MoE router logits [R][E + 16] (with the shared-expert gate's when
                                      stacked: qc_layer.gates_in), shared-expert gate logit [R] */
    int32_t *topi;                 /* MoE choice [R][top_k + 1] (+ 1: qc_layer.shared_slot) */
    float *topw;                   /* its weights [R][top_k + 1] */
    float *fo, *mo;                /* MoE routed sum, shared-expert output [R][H] */
    float *fin;                    /* a stacked matrix's outputs          [R][widest stack] */
    float *logits;                 /* [head_cap][vocab] */
    int head_cap;
    int32_t *top_ids;              /* TOP rows: [head_cap][batch top_k] (argmax.h) */
    float *top_vals;
    int32_t *top_n;                /* [head_cap] */
    void *top_ws;                  /* the top-k's / argmax's workspace for head_cap rows */
    size_t top_ws_bytes;
    float *taps;                   /* [R][n_taps][H] */
    float *vsave;                  /* [n_gdn][verify_cap][C + 2 Hv]: pre-conv qkv | a | b */
    int verify_cap;
    size_t vsave_row;              /* C + 2 Hv */
    float *gdn_ws;                 /* the chunked GDN kernel's workspace (gdn.h), gdn_ws_floats */
    size_t gdn_ws_floats;
    void *xprep_mem;
    splash_q4_xprep xp;            /* prepared activation of the q4 products */
    void *gx_mem;
    splash_q4_gemm_x gx;           /* x prepared for the GEMM: [max_rows][max_q4_cols] fp16 (none when
                                      max_rows < QWEN35_CHUNKED_MIN_ROWS) */
    splash_cuda_blas *blas;        /* cuBLASLt (blas.h) when it loaded and the GEMM is on, else NULL */
    uint16_t *wexp;                /* [the largest GEMM matrix] fp16: a q4 matrix expanded for blas (NULL: none) */
    void *f16_copies;              /* the matrices' resident fp16 expansions (qc_matrix.w16), or NULL */
    void *blas_ws;                 /* SPLASH_CUDA_BLAS_WORKSPACE bytes */
    int blas_min_rows;             /* QC_BLAS_MIN_ROWS, or SPLASH_CUDA_BLAS_MIN_ROWS (tests) */
    size_t blas_min_weights;       /* QC_BLAS_MIN_WEIGHTS, or SPLASH_CUDA_BLAS_MIN_WEIGHTS (tests) */
    const float *xp_src;           /* what xp holds (its first 16 rows, stride xp_ld) when a fused producer
                                      made it (norm, SwiGLU: qc_products then skips the prep); else NULL */
    size_t xp_ld;
    const float *gx_src;           /* gx holds rows [gx_r0, gx_r1) of this (stride hidden): the RMS norm made them
                                      (splash_q4_prep_rmsnorm_gemm) for the next cuBLASLt products; used once */
    int gx_r0, gx_r1;
    const float *ax_src;           /* gx.amax holds the largest |x| of rows [ax_r0, ax_r1) of this (stride ax_ld):
                                      the SwiGLU found it (splash_q4_prep_silu_mul_amax) for the down product's
                                      uniform preparation; used once */
    size_t ax_ld;
    int ax_r0, ax_r1;
    splash_cuda_moe_scratch moe;
    size_t scratch_bytes;
    /* commit: [n_gdn][max_lanes] lanes, pinned + device; the layers' replays are
     * independent, so they run on QC_COMMIT_BRANCHES streams forked from
     * stream (a graph's parallel branches), each branch its own conv output */
    splash_cuda_gdn_lane *commit_host, *commit_dev;
    struct CUstream_st *commit_streams[QC_COMMIT_BRANCHES];
    struct CUevent_st *commit_fork, *commit_join[QC_COMMIT_BRANCHES];
    struct CUevent_st *commit_up;  /* after the last upload of commit_host: the next commit rewrites it after it */
    float *commit_conv;            /* [QC_COMMIT_BRANCHES][verify_cap][conv_dim] */
    qc_pending *pending;           /* [max_lanes] */
    qc_pending *commit_p;          /* [max_lanes] a commit's lanes with rows to replay, */
    int *commit_n, *commit_at;     /* [max_lanes] their counts; each lane's pending entry */
    qc_rows *bulk;                 /* [max_lanes] this forward's bulk-prefill row ranges (qc_fwd.n_bulk) */
    int n_pending;
    /* greedy decisions (c_commit_greedy): [max_lanes] splash_cuda_greedy_lane, then
     * [SPLASH_GREEDY_MAX_STOP] stop ids at greedy_stop, [max_lanes] splash_greedy_result at
     * greedy_res; pinned and device, one upload and one copy back a call */
    uint8_t *greedy_host, *greedy_dev;
    size_t greedy_stop, greedy_res, greedy_bytes;
    struct CUevent_st *greedy_done; /* after the results' copy back */
    /* what the last forward leaves a decision: its TOP rows' k (0: no TOP rows, or not all in
     * one head pass: top_ids then holds the last pass only), its head rows and rows */
    int dec_top_k, dec_n_head, dec_rows;
    /* graphs of forward / commit shapes (cuda_graphs.cu) */
    int use_graphs;                /* SPLASH_CUDA_GRAPHS != 0 */
    int use_gemm;                  /* SPLASH_CUDA_GEMM != 0: bulk prefill rows on the GEMM (gx_mem carved) */
    int hash_route;                /* SPLASH_TEST_RANDOM_ROUTE=1 (benchmarks): router logits hashed (moe.h) */
    qc_graph_set graphs;           /* .stream: the model's stream */
} qc_model;

/* 1 when bulk prefill rows may take cuBLASLt for w (its shape; blas.h). */
static inline int qc_blas_shape(const qc_model *m, const qc_matrix *w) {
    return w->is_q4 && w->gemm && w->rows % 8 == 0 && (size_t)w->rows * (size_t)w->cols >= m->blas_min_weights;
}

/* Per-forward context shared by the layer functions. */
typedef struct qc_fwd {
    qc_model *m;
    const splash_batch *b;
    int R;
    int max_lane_rows;
    int n_rec;                     /* GDN lanes run by the recurrence: glanes[gi][0, n_rec) */
    int n_chunked;                 /* and by the chunked kernel: glanes[gi][n_rec, n_rec + n_chunked) */
    int n_chunks;                  /* attention calls: m->chunks[0, n_chunks) */
    int n_vrows;                   /* verify rows (saved for commit) */
    int n_bulk;                    /* m->bulk[0, n_bulk): rows of PREFILL lanes of >= QWEN35_CHUNKED_MIN_ROWS rows,
                                      adjacent lanes merged: their q4 products run on the GEMM */
    int n_head, n_tap;             /* rows with LOGITS or TOP, with TAPS */
    int n_top;                     /* rows with TOP (the head then keeps each head row's top b->top_k) */
    /* a MoE layer's weighted sum of rows [0, moe_sum_rows) not yet added to x
     * (splash_q4_moe_norm): the next RMS norm of x adds it in its own launch
     * (splash_q4_prep_rmsnorm_moe); anything else that reads x first calls
     * qc_moe_sum_flush */
    int moe_sum_rows;
    splash_q4_moe_sum moe_sum;
    const char *what;              /* the op that failed */
} qc_fwd;

/* The forward's bulk-prefill range when it has one and it is long enough for
 * cuBLASLt, else NULL: the producers of a GEMM input (the RMS norm, the
 * SwiGLU) then prepare that range for it as they write. */
static inline const qc_rows *qc_blas_bulk(const qc_fwd *f) {
    const qc_model *m = f->m;
    return f->n_bulk == 1 && m->wexp && m->bulk[0].r1 - m->bulk[0].r0 >= m->blas_min_rows ? &m->bulk[0] : NULL;
}

/* Device pointers of the descriptor's parts. */
static inline int32_t *qc_desc_i32(const qc_model *m, size_t off) { return (int32_t *)(m->desc_dev + off); }

/* The recurrent state of GDN layer gi in a slot (device). */
static inline float *qc_conv_state(const qc_model *m, int slot, int gi) {
    return m->states + (size_t)slot * m->state_floats + (size_t)gi * m->gdn_state_floats;
}
static inline float *qc_delta_state(const qc_model *m, int slot, int gi) {
    return qc_conv_state(m, slot, gi) + (size_t)(m->d.conv_kernel - 1) * m->d.conv_dim;
}

/* A product y_j = W_j x for matrices that read the same input. */
typedef struct qc_prod {
    const qc_matrix *w;
    float *y;                      /* [R][w->rows], dense */
    int add;                       /* q4 only: y += W x (splash_q4_matmul_add) */
} qc_prod;

/* The forward's rows x [f->R][cols] (stride ldx) through every matrix of p
 * (all with cols inputs): the rows of bulk-prefill lanes (f->n_bulk ranges)
 * on the GEMM for the matrices that allow it (qc_matrix.gemm: one prepared
 * x per range), every other q4 row 16 at a time (one prepared activation per
 * 16 rows serves all matrices), non-q4 matrices in one call each.  A row's
 * numbers depend on its lane (bulk prefill or not), never on other lanes.
 * 0 or a SPLASH_E_* code. */
int qc_products(qc_fwd *f, const float *x, size_t ldx, const qc_prod *p, int n);
/* R rows that belong to no lane (the LOGITS rows of the head): 16 at a time. */
int qc_products_rows(qc_model *m, const float *x, size_t ldx, int R, const qc_prod *p, int n);
/* The same for a caller with its own prepared activation (the DFlash draft):
 * xp (capacity >= the q4 matrices' columns) and stream. */
int qc_products_xp(splash_q4_xprep *xp, struct CUstream_st *stream, const float *x, size_t ldx, int R,
                   const qc_prod *p, int n);
/* ... and when a fused producer may have prepared xp: *xp_src (row stride
 * xp_ld) is what xp holds (splash_q4_prep_rmsnorm / _silu_mul wrote it), or
 * NULL; set to NULL once xp is prepared from anything else. */
int qc_products_xp_src(splash_q4_xprep *xp, const float **xp_src, size_t xp_ld, struct CUstream_st *stream,
                       const float *x, size_t ldx, int R, const qc_prod *p, int n);

/* 1 when rows of `cols` floats can be made by a fused producer into m->xp
 * (splash_q4_prep_rmsnorm / _silu_mul), which then records m->xp_src. */
static inline int qc_prep_ok(const qc_model *m, int cols) {
    return m->w.max_q4_cols >= cols && cols <= SPLASH_Q4_MAX_COLS && cols % SPLASH_Q4_GROUP == 0;
}

int qc_forward(void *impl, const splash_batch *b, splash_error *err);
/* Adds a MoE layer's pending weighted sum (qc_fwd.moe_sum_rows) to x in a
 * launch of its own; nothing when none is pending. */
int qc_moe_sum_flush(qc_fwd *f);

/* Graphs: qc_graph_find returns key's entry (made, evicting the least
 * recently used, when new; NULL for a bad key); qc_graph_run runs body(ctx)
 * on the model's stream: eagerly the first time, then captured and replayed
 * (0 or body's / a launch's SPLASH_E_* code).  qc_graphs_clear drops them. */
qc_graph *qc_graph_find(qc_graph_set *gs, const int *key, int n);
int qc_graph_run(qc_graph_set *gs, qc_graph *g, int (*body)(void *), void *ctx);
void qc_graphs_clear(qc_graph_set *gs);
int qc_graphs_enabled(void);
int qc_attn_layer(qc_fwd *f, const qc_layer *L);
int qc_gdn_layer(qc_fwd *f, const qc_layer *L);
int qc_ffn_layer(qc_fwd *f, const qc_layer *L);
int qc_moe_layer(qc_fwd *f, const qc_layer *L);

/* Sets f->what and returns rc when rc is an error (for one-line checks). */
#define QC_TRY(f, call)                                                                                                \
    do {                                                                                                               \
        int qc_rc_ = (call);                                                                                           \
        if (qc_rc_) {                                                                                                  \
            (f)->what = #call;                                                                                         \
            return qc_rc_;                                                                                             \
        }                                                                                                              \
    } while (0)

#endif
