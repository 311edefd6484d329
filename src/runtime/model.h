/* model.h - the one entry point through which everything runs a model.
 *
 * `splash eval`, prefill, decoding (the speculative cycle, block size 1 when
 * there is no draft) and verification are all clients of splash_model_forward:
 * a ragged batch of lanes x rows.  The runtime (scheduler, KV pages, prefix
 * cache) sees only this interface and the memory the model declares; it never
 * names an architecture.
 *
 * Memory the model declares (splash_model_needs) and the runtime provides:
 *   - KV pages: one pool of fixed-size pages; one page id covers all attention
 *     layers of a lane for `page_tokens` consecutive positions.
 *   - state slots: per-lane recurrent state (for Qwen3.5: the GDN conv and
 *     delta-rule states of every GDN layer), fp32, the same layout on every
 *     backend so snapshots move between them.
 *
 * Lifetimes: the model owns its weights (mapped from the package) and its
 * scratch; the runtime owns the KV pool and the state slots (allocated through
 * the model's backend with the sizes declared) and hands them over with
 * splash_model_attach_memory().  A lane is the runtime's: it says which slot
 * and which pages a sequence uses.
 */
#ifndef SPLASH_MODEL_H
#define SPLASH_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "runtime/spec_greedy.h"

typedef struct splash_model splash_model;
typedef struct splash_package splash_package;

/* KV storage formats (values + scales where quantised). */
typedef enum splash_kv_format {
    SPLASH_KV_F32,  /* reference: exact, 4 bytes per value */
    SPLASH_KV_BF16,
    SPLASH_KV_INT8, /* symmetric, one fp32 scale per (token, head) */
} splash_kv_format;

/* Activations of the CPU backend's q4/q8 matrix products (plain bf16/f16/f32
 * weights always take fp32 activations).  docs/architecture.md, "CPU
 * kernels", has the speeds and errors behind the default. */
typedef enum splash_cpu_act {
    SPLASH_CPU_ACT_AUTO = 0, /* int8 for q4/q8 weights (the fast path) */
    SPLASH_CPU_ACT_F32,      /* fp32: the exact reference */
    SPLASH_CPU_ACT_INT8,     /* per group of 64, one scale (llama.cpp's q8 activations) */
    SPLASH_CPU_ACT_INT16,    /* the same with 16 bits */
} splash_cpu_act;

/* "auto", "fp32", "int8", "int16" -> SPLASH_CPU_ACT_*, or -1. */
int splash_cpu_act_parse(const char *name);

typedef struct splash_model_options {
    const char *device;       /* "cpu" (NULL too), "cuda", or "auto": cuda when available (splash_device_resolve) */
    int threads;              /* CPU threads; 0 = all cores */
    splash_cpu_act cpu_activations; /* q4/q8 products on the CPU (default auto) */
    int max_rows;             /* most rows in one forward call (scratch is sized for it) */
    int max_lanes;            /* most lanes in one forward call */
    splash_kv_format kv_format;
    int n_taps;               /* target layers whose outputs the draft reads */
    const int *tap_layers;
} splash_model_options;

/* What the model needs from the runtime. */
typedef struct splash_model_needs {
    int page_tokens;          /* tokens per KV page */
    size_t page_bytes;        /* bytes of one KV page (all attention layers) */
    size_t state_bytes;       /* bytes of one recurrent-state slot */
    size_t weight_bytes;      /* weights resident for this model */
    size_t scratch_bytes;     /* scratch for max_rows / max_lanes */
    int vocab;                /* logits per row */
    int max_top;              /* most entries a TOP row may ask for (<= SPLASH_MAX_TOP; 0: no TOP rows) */
    int hidden;               /* width of tap / embedding rows */
    int max_positions;
    /* Memory the model would use to run faster, beyond weight_bytes and
     * scratch_bytes, if the memory plan has it to spare
     * (splash_model_use_spare; 0: none). */
    size_t spare_bytes;
} splash_model_needs;

/* Row flags. */
enum {
    SPLASH_ROW_LOGITS = 1u << 0, /* write this row's logits */
    SPLASH_ROW_TAPS = 1u << 1,   /* write this row's tap hidden states */
    SPLASH_ROW_TOP = 1u << 2,    /* write this row's top batch.top_k logits (below) */
    SPLASH_ROW_DEVICE_TOKEN = 1u << 3, /* the token is batch.device_tokens[token] (below) */
};

/* Most entries a TOP row can ask for (the GPU's top-k bound). */
#define SPLASH_MAX_TOP 64

typedef struct splash_row {
    int32_t token;        /* token id; ignored when embed is set */
    int32_t pos[3];       /* rotary position (t, h, w); text rows: all equal */
    uint32_t flags;       /* SPLASH_ROW_* */
    const float *embed;   /* embedding override [hidden] (images), or NULL */
} splash_row;

/* Lane modes. */
enum {
    /* Rows are committed as they run: KV written at n_past.., state advanced. */
    SPLASH_LANE_PREFILL = 0,
    /* Rows are candidates: KV written at n_past.., the state is NOT advanced;
     * each row sees the state after the rows before it.  splash_model_commit
     * then keeps the first n rows.  Every row's numbers are bit-identical to
     * running the same tokens one PREFILL row at a time. */
    SPLASH_LANE_VERIFY = 1,
};

typedef struct splash_lane {
    int slot;              /* recurrent-state slot */
    int n_past;            /* tokens already in this lane's KV and state */
    int first_row, n_rows; /* this lane's rows: batch rows [first_row, first_row+n_rows) */
    const int32_t *pages;  /* page table: page ids for KV positions [0, n_pages*page_tokens) */
    int n_pages;
    int mode;              /* SPLASH_LANE_* */
} splash_lane;

typedef struct splash_batch {
    int n_lanes, n_rows;
    const splash_lane *lanes; /* lanes' rows are contiguous and in lane order */
    const splash_row *rows;
    float *logits;            /* out [rows with LOGITS, vocab], in row order */
    float *taps;              /* out [rows with TAPS, n_taps, hidden] */
    /* TOP rows: the row's top_k (1..SPLASH_MAX_TOP) largest finite logits,
     * best first, equal values by lower id (cpu_top_k's order), in row order
     * [rows with TOP][top_k]; past the finite ones: id -1, value -inf.  What a
     * decision needs when it depends on the best few tokens only (greedy,
     * sampling with top_k; runtime/sampling.h, splash_sampling_top_need):
     * the GPU then copies 8 bytes a candidate instead of the vocabulary. */
    int top_k;
    int32_t *top_ids;
    float *top_logits;
    /* 1: TAPS rows stay in the model's device buffer (splash_model_device_taps)
     * and taps may be NULL; only a model that has one takes it. */
    int taps_on_device;
    /* DEVICE_TOKEN rows: their token is device_tokens[row.token], an int32
     * array in the model's device memory (host memory for a CPU model;
     * splash_model_alloc_memory's kind) written by work already ordered on
     * the model's stream (splash_model_device_stream: a draft's proposals left
     * on the GPU, so the verify needs no trip through the host).  A value
     * outside the vocabulary embeds as nothing (the row's outputs are then
     * meaningless, never a fault). */
    const int32_t *device_tokens;
    /* 1: the caller decides this forward's lanes with splash_model_commit_greedy
     * and reads none of the host outputs above (logits, TOP rows): a model on
     * a GPU may then return with its work queued and copy none of them (a
     * model that decides on the host writes them as usual).  0: every output
     * written when the forward returns. */
    int defer;
} splash_batch;

/* The device a run uses.  want: "cpu" (or NULL), "cuda", or "auto" (cuda when
 * this build has the CUDA backend and a GPU is visible, else cpu).  Sets
 * *device to a static "cpu" or "cuda"; name (cap bytes, may be NULL) gets
 * "NVIDIA H200" or the CPU's description; *free_bytes (may be NULL) the
 * device memory free now (0 on the CPU: the memory plan reads MemAvailable).
 * Fails on an unknown name and on "cuda" without a build or a GPU for it. */
int splash_device_resolve(const char *want, const char **device, char *name, size_t cap, size_t *free_bytes,
                          splash_error *err);

/* Loads the model of a package onto a device. */
int splash_model_load(splash_package *pkg, const splash_model_options *opt, splash_model **out,
                      splash_error *err);
void splash_model_free(splash_model *m);
const splash_model_needs *splash_model_get_needs(const splash_model *m);

/* Hands the runtime-owned memory to the model.  kv_pages: n_pages *
 * page_bytes; states: n_slots * state_bytes (device memory of the model's
 * backend). */
int splash_model_attach_memory(splash_model *m, void *kv_pages, int n_pages, void *states, int n_slots,
                               splash_error *err);
/* Allocates memory of the model's backend (host memory on the CPU).  The
 * runtime calls it for the pool, slots and snapshots; free with _free_memory. */
void *splash_model_alloc_memory(splash_model *m, size_t bytes);
void splash_model_free_memory(splash_model *m, void *p);

/* Zeroes a slot's recurrent state (a new sequence). */
int splash_model_reset_slot(splash_model *m, int slot);

/* Runs one ragged batch.  Fails (without touching any state) on invalid input:
 * token out of range, too many rows, a page table too short, etc. */
int splash_model_forward(splash_model *m, const splash_batch *b, splash_error *err);

/* After a VERIFY forward of a lane on `slot`: advance its state by the first
 * n_accepted rows (0 <= n_accepted <= the lane's n_rows).  The runtime adds
 * n_accepted to the lane's n_past; KV of the other rows is simply ignored. */
int splash_model_commit(splash_model *m, int slot, int n_accepted, splash_error *err);

/* The commits of several lanes verified by one forward: lane i's slot
 * slots[i] advanced by its first n_accepted[i] rows, as splash_model_commit
 * would one after another (the same state), in one call, so a model on a GPU
 * replays them together (one upload, one launch).  A lane with 0 accepted
 * rows is only marked committed; a slot named twice fails the call.  A model
 * with the op checks every lane before any state moves (a bad one fails the
 * call and changes nothing); one without it gets splash_model_commit lane by
 * lane, stopping at the first failure (the lanes before it committed), as
 * does every model when SPLASH_COMMIT_LANES=0 is in the environment (an A/B
 * of the two). */
int splash_model_commit_lanes(splash_model *m, const int *slots, const int *n_accepted, int n, splash_error *err);

/* A greedy lane verified by the last forward (splash_model_commit_greedy):
 * its decision rows are the batch's rows row .. row + n_props, TOP rows;
 * the proposals are the tokens of rows row + 1 .. row + n_props.  The host's
 * copy of the same rows (top_ids / top_logits: [n_props + 1][top_k], the
 * batch's; props: [n_props]) is read only by a model that decides on the
 * host. */
typedef struct splash_greedy_lane {
    int slot;
    int row;      /* the batch row of its first decision row: its feed's last (the lane's first row + n_feed - 1) */
    int n_feed;   /* its rows before the proposals (the batch row of its first row is row - n_feed + 1) */
    int n_props;  /* n_props + 1 <= SPLASH_GREEDY_MAX_ROWS */
    int limit;    /* the most rows it may commit, >= 1 (a page boundary: runtime/engine.c) */
    const int32_t *top_ids;
    const float *top_logits;
    int top_k;
    const int32_t *props;
} splash_greedy_lane;

/* The greedy decision of n lanes verified by the last forward, and their
 * commits, in one call: lane i decides as splash_greedy_decide
 * (runtime/spec_greedy.h) into res[i], with stop[0..n_stop) (n_stop <=
 * SPLASH_GREEDY_MAX_STOP) as the stop ids, and commits res[i].c rows (as
 * splash_model_commit_lanes would; a lane whose status is not 0 commits
 * res[i].c rows all the same: the caller ends it).  A model on a GPU
 * decides there, right behind the forward (a forward of batch.defer = 1 may
 * still be running when this is called), queues the commits behind the
 * decision and returns once the decisions are on the host, the replays
 * still running; the batch's host outputs (logits, TOP rows, taps) are then
 * written too.  Other models decide on the host from each lane's top_ids,
 * top_logits and props.  Errors (bad lanes, no TOP rows) change nothing. */
/* (A model on a GPU that cannot decide the last forward on the device - its TOP
 * rows were not one head pass - decides on the host like the others: its
 * deferred forward then wrote the host outputs.) */
int splash_model_commit_greedy(splash_model *m, const splash_greedy_lane *lanes, int n, const int32_t *stop,
                               int n_stop, splash_greedy_result *res, splash_error *err);

/* Copies a slot's recurrent state to / from a snapshot buffer of state_bytes
 * (allocated with splash_model_alloc_memory). */
int splash_model_snapshot(splash_model *m, int slot, void *dst);
int splash_model_restore(splash_model *m, int slot, const void *src);

/* The model's own buffer of the last forward's TAPS rows, in batch.taps's
 * layout ([rows with TAPS][n_taps][hidden]), in the memory of its backend
 * (device memory on a GPU), valid until the next forward; NULL when the
 * model keeps none (the CPU model, or loaded without tap layers).  A draft
 * on the same device reads it there (runtime/draft.h, append_device) instead
 * of the rows travelling to the host and back (batch.taps_on_device). */
const float *splash_model_device_taps(splash_model *m);

/* The device queue (a cudaStream_t on the CUDA backend) the model's forwards
 * run on, in the order it takes them, or NULL.  A reader of the device taps
 * that orders its reads on it (runtime/draft.h, bind_device_taps) needs no
 * host wait: the model's next forward queues behind them. */
void *splash_model_device_stream(splash_model *m);

/* The model's device copy of the package tensor whose bytes start at `data`
 * (splash_tensor.data), in its backend's form (the CUDA model: a `const
 * qc_matrix *`, models/qwen35/cuda_model.h), or NULL when it keeps none.  A
 * draft on the same device reads the weights it shares with the target
 * there instead of uploading its own (runtime/draft.h, bind_model: the
 * DFlash drafts' lm_head, ~0.7 GB on the 27B). */
const void *splash_model_device_weight(splash_model *m, const void *data);

/* Hands the model up to `bytes` of memory beyond its needs
 * (needs->spare_bytes: the CUDA model keeps its prefill GEMM's weights in
 * fp16 there, so no forward expands them from q4); 0 releases what an
 * earlier call took.  The model takes whole pieces in its own order while
 * they fit (bounded also by what its device has free), and sets *used to
 * what it took; a model without such a use, or an allocation refused, takes
 * nothing and is not an error.  Results are the same either way.  Between
 * forwards only (the engine calls it once, after its memory plan:
 * memory_plan.h, spare). */
int splash_model_use_spare(splash_model *m, size_t bytes, size_t *used, splash_error *err);

/* Waits until the model's queued device work has run (a commit returns
 * before its work on the GPU is done; the next forward waits for it anyway):
 * for timing a commit on its own.  0, or a status when that work failed. */
int splash_model_finish(splash_model *m);

#endif
