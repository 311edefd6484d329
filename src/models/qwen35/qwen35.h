/* qwen35.h - the Qwen3.5 hybrid models (dense `qwen3_5` and `qwen3_5_moe`)
 * on the CPU backend.
 *
 * Files:
 *   dims.c     the dimensions, parsed from the manifest's "model" and checked
 *   weights.c  binds every tensor of the package by canonical name, checking
 *              shapes (the first mismatch is named); small vectors are copied
 *              to fp32, matrices stay in the mapped package
 *   qwen35.c   the splash_model_ops table: load, memory, slots, commit,
 *              snapshot, restore, batch validation
 *   forward.c  one ragged batch through the layers: embedding, layer loop,
 *              taps, final norm and lm_head
 *   attn.c     gated attention layers (KV in pages)
 *   gdn.c      Gated DeltaNet layers (conv + delta-rule state in slots;
 *              verify rows on a scratch copy, replayed by commit)
 *   ffn.c      SwiGLU FFN and the MoE block
 *
 * The per-slot state layout (fp32, identical on every backend): for each GDN
 * layer in order, conv state [conv_kernel-1][conv_dim] (the last pre-conv
 * inputs, oldest first), then delta state [Hv][dk][dv].
 */
#ifndef SPLASH_QWEN35_H
#define SPLASH_QWEN35_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "base/json.h"
#include "base/status.h"
#include "package/package.h"
#include "runtime/model.h"
#include "runtime/model_ops.h"

extern const splash_model_ops qwen35_ops;

#define QWEN35_MAX_LAYERS 1024
#define QWEN35_PAGE_TOKENS 32
#define QWEN35_HEAD_TMP_ROWS 16 /* TOP-only rows per lm_head call of the CPU head */
/* Most rows of one VERIFY lane.  Commit needs each verify row's GDN inputs,
 * about 18K floats per GDN layer per row on the 27B, so the buffer for them is
 * sized for max_lanes lanes of this many rows (capped by max_rows). */
#define QWEN35_MAX_VERIFY_ROWS 32
/* CUDA: PREFILL lanes with at least this many rows use the chunked GDN
 * algorithm, shorter ones (and every VERIFY lane) the recurrence.  The CPU
 * backend always runs the recurrence (gdn.c says why). */
#ifndef QWEN35_CHUNKED_MIN_ROWS
#define QWEN35_CHUNKED_MIN_ROWS 64
#endif
/* Activations of q4/q8 products when the options say auto (CPU_ACT_*). */
#define QWEN35_DEFAULT_Q_ACT CPU_ACT_I8

typedef struct qwen35_dims {
    int moe;               /* architecture qwen3_5_moe */
    int hidden, n_layers, vocab, max_positions, tie_embeddings;
    float rms_eps;
    unsigned char is_attn[QWEN35_MAX_LAYERS];
    int n_attn, n_gdn;
    /* gated attention */
    int heads, kv_heads, head_dim, rotary_dim;
    double rope_theta;
    /* Gated DeltaNet */
    int hk, hv, dk, dv, conv_kernel;
    int key_dim, value_dim, conv_dim; /* hk*dk, hv*dv, 2*key_dim + value_dim */
    /* FFN (dense) */
    int intermediate;
    /* MoE */
    int experts, top_k, expert_inter, shared_inter, norm_topk;
} qwen35_dims;

/* Parses manifest "model" (and the architecture name) into d, checking
 * every field; the error names the first bad field. */
int qwen35_dims_parse(const json_value *model, const char *arch, qwen35_dims *d, splash_error *err);

/* What a forward call may ask of a loaded model; qwen35_check_batch
 * (forward.c) applies the rules both backends share. */
typedef struct qwen35_batch_limits {
    const qwen35_dims *d;
    int n_slots, max_rows, max_lanes, n_pages, verify_cap, n_taps;
    int64_t max_context; /* longest lane context the attached KV pool allows */
    int device_taps;     /* the model keeps TAPS rows in a device buffer (batch.taps_on_device) */
} qwen35_batch_limits;
int qwen35_check_batch(const qwen35_batch_limits *lim, const splash_batch *b, splash_error *err);

typedef struct qwen35_layer {
    int is_attn;
    int index;                  /* ordinal among attention (or GDN) layers */
    float *input_norm, *post_norm; /* [H] factors (1 + w) */
    /* attention */
    const splash_tensor *q_proj; /* [heads*2*hd, H] query/gate interleaved per head */
    const splash_tensor *k_proj, *v_proj; /* [kvh*hd, H] */
    const splash_tensor *o_proj; /* [H, heads*hd] */
    float *q_norm, *k_norm;      /* [hd] factors */
    /* GDN */
    const splash_tensor *in_qkv; /* [conv_dim, H] */
    const splash_tensor *in_z;   /* [Hv*dv, H] */
    const splash_tensor *in_b, *in_a; /* [Hv, H] */
    const splash_tensor *out_proj;    /* [H, Hv*dv] */
    float *conv_t;               /* [K][conv_dim] conv weight transposed */
    float *neg_a;                /* [Hv] -exp(A_log) */
    float *dt_bias;              /* [Hv] */
    float *gnorm;                /* [dv] gated-norm weight (not offset) */
    /* dense FFN */
    const splash_tensor *gate, *up; /* [I, H] */
    const splash_tensor *down;      /* [H, I] */
    /* MoE */
    const splash_tensor *router;    /* [E, H] */
    const splash_tensor *experts_gate, *experts_up; /* [E, Ie, H] */
    const splash_tensor *experts_down;              /* [E, H, Ie] */
    const splash_tensor *shared_gate, *shared_up;   /* [Is, H] */
    const splash_tensor *shared_down;               /* [H, Is] */
    const splash_tensor *shared_expert_gate;        /* [1, H] */
    float *vec;                  /* the layer's fp32 vectors, one allocation */
} qwen35_layer;

typedef struct qwen35_weights {
    const splash_tensor *embed;   /* [V, H] */
    const splash_tensor *lm_head; /* [V, H] (embed when tied) */
    float *final_norm;            /* [H] factor */
    qwen35_layer *layers;         /* [n_layers] */
    size_t bytes;                 /* weights resident (mapped) */
    int max_cols;                 /* widest matrix input dimension */
} qwen35_weights;

int qwen35_weights_bind(const splash_package *pkg, const qwen35_dims *d, qwen35_weights *w, splash_error *err);
void qwen35_weights_free(qwen35_weights *w, const qwen35_dims *d);

/* A VERIFY lane of the last forward, kept for commit. */
typedef struct qwen35_pending {
    int slot, first, n_rows; /* first: index of its first row in the verify save */
} qwen35_pending;

/* Wall time per part of the forward pass, kept when SPLASH_PROFILE is set in
 * the environment at load (`splash eval --profile`) and printed to stderr
 * when the model is freed. */
enum {
    QWEN35_PROF_EMBED, QWEN35_PROF_NORM, QWEN35_PROF_ATTN_PROJ, QWEN35_PROF_ATTN_KV, QWEN35_PROF_ATTN_CORE,
    QWEN35_PROF_ATTN_OUT, QWEN35_PROF_GDN_PROJ, QWEN35_PROF_GDN_CORE, QWEN35_PROF_GDN_OUT, QWEN35_PROF_FFN,
    QWEN35_PROF_HEAD, QWEN35_PROF_N
};

typedef struct qwen35_model {
    qwen35_dims d;
    qwen35_weights w;
    cpu_ctx cpu;
    int max_rows, max_lanes;
    int n_taps;
    int *tap_layers;
    splash_model_needs needs;
    cpu_kv_layout kv;
    size_t state_floats;     /* per slot */
    size_t gdn_state_floats; /* per GDN layer: conv + delta */
    /* runtime memory (attach) */
    uint8_t *kv_pool;
    int n_pages;
    float *states;
    int n_slots;
    size_t max_context;      /* longest lane context the attached KV pool allows */
    /* activations, [max_rows][width] each */
    float *x, *xn, *fo;      /* residual, normed, MoE block output [R][H] */
    float *qkv;              /* attn q+gate / GDN pre-conv        [R][max(2*heads*hd, conv_dim)] */
    float *mix1;             /* attn q / GDN conv out (q|k|v)     [R][max(heads*hd, conv_dim)] */
    float *mix2;             /* attn k / GDN z                    [R][max(kvh*hd, Hv*dv)] */
    float *mix3;             /* attn v / GDN core output          [R][max(kvh*hd, Hv*dv)] */
    float *mix4;             /* attn output / GDN normed output   [R][max(heads*hd, Hv*dv)] */
    float *gb, *ga, *gg, *gbeta; /* GDN b, a, g, beta             [R][Hv] */
    float *ff1, *ff2;        /* FFN / expert hidden               [R][max(I, Ie, Is)] */
    float *mx, *mo;          /* MoE gathered input / expert out   [R][H] */
    float *router;           /* MoE router probabilities          [R][E] */
    int *topk;               /* [R][top_k] chosen experts, ascending id */
    float *topw;             /* [R][top_k] their weights */
    int *erows;              /* [R] rows routed to one expert */
    float *erw;              /* [R] their weights */
    float *sgate;            /* [R] shared-expert gate logits */
    int *head_rows;          /* [R] rows with LOGITS or TOP */
    float *head_tmp;         /* [QWEN35_HEAD_TMP_ROWS][vocab] logits of TOP-only rows (made on first use) */
    float *verify_state;     /* [max_lanes][Hv][dk][dv] a verify lane's delta state */
    /* verify save, per GDN layer [verify_cap][verify_row_floats]:
     * pre-conv [conv_dim] | k [Hk*dk] | v [Hv*dv] | g [Hv] | beta [Hv] */
    float *verify_save;
    int verify_cap;
    size_t verify_row_floats;
    qwen35_pending *pending; /* [max_lanes] */
    int n_pending;
    cpu_attn_lane *alanes;   /* [max_lanes] per-forward lane views */
    int profile;             /* SPLASH_PROFILE was set at load */
    double prof_t, prof_c;   /* the last mark: wall, process CPU */
    double prof[QWEN35_PROF_N], prof_cpu[QWEN35_PROF_N]; /* seconds per part: wall, CPU */
    long prof_rows, prof_calls;
} qwen35_model;

/* Per-forward context shared by the layer functions. */
typedef struct qwen35_fwd {
    qwen35_model *m;
    const splash_batch *b;
    int R;                   /* rows */
} qwen35_fwd;

/* The delta-rule/conv state of GDN layer `index` in a slot. */
static inline float *qwen35_conv_state(qwen35_model *m, int slot, int index) {
    return m->states + (size_t)slot * m->state_floats + (size_t)index * m->gdn_state_floats;
}
static inline float *qwen35_delta_state(qwen35_model *m, int slot, int index) {
    return qwen35_conv_state(m, slot, index) + (size_t)(m->d.conv_kernel - 1) * m->d.conv_dim;
}

/* Profiling: the time since the last mark goes to part k (nothing unless
 * profiling). */
static inline double qwen35_clock(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static inline void qwen35_prof(qwen35_model *m, int k) {
    if (!m->profile) return;
    double t = qwen35_clock(CLOCK_MONOTONIC), c = qwen35_clock(CLOCK_PROCESS_CPUTIME_ID);
    m->prof[k] += t - m->prof_t;
    m->prof_cpu[k] += c - m->prof_c;
    m->prof_t = t;
    m->prof_c = c;
}

int qwen35_forward(void *impl, const splash_batch *b, splash_error *err);
void qwen35_attn_layer(qwen35_fwd *f, const qwen35_layer *L);
void qwen35_gdn_layer(qwen35_fwd *f, const qwen35_layer *L);
void qwen35_gdn_commit(qwen35_model *m, const qwen35_pending *p, int n);
void qwen35_ffn_layer(qwen35_fwd *f, const qwen35_layer *L);
void qwen35_moe_layer(qwen35_fwd *f, const qwen35_layer *L);

/* Runs fn over rows [0, R) on the pool (elementwise per-row work). */
void qwen35_rows(qwen35_model *m, int R, splash_task_fn fn, void *ctx);

#endif
