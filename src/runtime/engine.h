/* engine.h - the engine thread: one thread owns the model and runs requests.
 *
 * Connection threads tokenize, validate and build a splash_gen, then submit
 * it; the engine thread admits queued gens into lanes, runs them through
 * splash_model_forward (PREFILL chunks, then the speculative decode cycle:
 * the draft proposes B-1 tokens, one VERIFY forward checks [anchor,
 * proposals] of every decoding lane together, runtime/spec.h accepts a
 * prefix, splash_model_commit keeps it, the draft reads its taps; block size
 * 1 - no draft - is the same cycle with no proposals) and hands the text back
 * through the gen.  A gen is the only object shared between the two sides; it
 * is reference counted (the submitter's reference and the engine's) and every
 * field the engine writes after submit is read under its mutex.
 *
 * Requests join and leave between calls.  Queued gens are admitted by
 * priority, then arrival, and only when the pool has the KV pages for the
 * whole budget (prompt + max_tokens), so a request never runs out of memory
 * half-way.  What each forward call holds is planned by runtime/scheduler.h:
 * every decoding lane's block, plus prefill chunks packed into a row budget
 * (shortest prompt first, bounded overtaking) that shrinks under contention
 * so a slice stays near a time target.
 *
 * Text is produced on the engine side: the streaming detokenizer (complete
 * UTF-8 only), stop tokens (the manifest's eos list), and stop strings
 * matched across token boundaries on the committed text (held back while they
 * may still match, never emitted).  A slow consumer never stalls the engine:
 * text accumulates in the gen until the consumer takes it.
 */
#ifndef SPLASH_ENGINE_H
#define SPLASH_ENGINE_H

#include <pthread.h>
#include <stdint.h>

#include "base/json.h"
#include "base/status.h"
#include "base/strbuf.h"
#include "runtime/sampling.h"

typedef struct splash_engine splash_engine;
typedef struct splash_tokenizer splash_tokenizer;

#define SPLASH_MAX_STOP 4

typedef enum splash_finish {
    SPLASH_FINISH_NONE = 0,  /* still running */
    SPLASH_FINISH_STOP,      /* a stop token or stop string */
    SPLASH_FINISH_LENGTH,    /* max_tokens */
    SPLASH_FINISH_CANCELLED, /* the consumer went away */
    SPLASH_FINISH_ERROR,     /* error[] says why (a forward failed, shutdown) */
} splash_finish;

enum { SPLASH_GEN_QUEUED, SPLASH_GEN_PREFILL, SPLASH_GEN_DECODE, SPLASH_GEN_DONE };

/* One generated token that became text (stop tokens are not recorded).
 * text_end: bytes of the gen's text stream after this token - the text the
 * detokenizer produced, before stop strings are held back or cut - so token i
 * covers text bytes [text_end of i-1, text_end of i).  The APIs use it to
 * count the tokens of the reasoning and for the legacy text_offset. */
typedef struct splash_gen_token {
    int32_t id;
    uint32_t text_end;
} splash_gen_token;

typedef struct splash_gen {
    /* ---- input: set before submit, read-only afterwards ---- */
    int32_t *prompt; /* owned (free()d with the gen) */
    int n_prompt;
    splash_sampling_params sp;
    int max_tokens;              /* > 0 */
    char *stop[SPLASH_MAX_STOP]; /* owned stop strings */
    int n_stop;
    int32_t *script; /* test hook: emit these tokens instead of sampling (owned), or NULL */
    int n_script;
    int priority;    /* admission order: lower first, then arrival (default 0) */
    int block_size;  /* decode block of this request (0 = the engine's; capped at the engine's most;
                        tests and comparisons: greedy output is the same at every block size) */
    /* sp.logprobs = 1: every recorded token also gets a splash_logprobs
     * (raw log-softmax, sp.top_logprobs alternatives) */

    /* ---- shared state, under mu ---- */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state;          /* SPLASH_GEN_* */
    strbuf text;        /* committed text not yet taken */
    int n_tokens;       /* completion tokens so far (stop tokens included) */
    splash_finish finish;
    char error[256];
    int cancel;         /* set by the consumer */
    splash_gen_token *toks; /* [n_recorded] tokens that became text */
    splash_logprobs *lps;   /* [n_recorded] when sp.logprobs, else NULL */
    int n_recorded, cap_recorded;
    double t_submit, t_start, t_first, t_end; /* seconds (monotonic) */
    int n_cached;       /* prompt tokens reused from the prefix cache (set at admission) */
    int n_drafted, n_accepted, n_cycles; /* proposals verified, accepted, decode cycles run */
    int n_prefilled;    /* prompt tokens in the lane's KV so far, cached ones included: set
                           (and cv broadcast) after each prefill chunk; n_prompt once read.
                           Before the first chunk it is 0: progress is max(n_prefilled, n_cached) */
    int refs;

    /* ---- engine-private ---- */
    struct splash_gen *next;
    void *engine; /* set by submit; cancel wakes it */
} splash_gen;

/* A new gen (refs = 1) or NULL. */
splash_gen *splash_gen_new(void);
void splash_gen_release(splash_gen *g);
/* Asks the engine to stop the gen (a disconnected client); safe at any time. */
void splash_gen_cancel(splash_gen *g);

/* What a consumer takes from a gen in one call. */
typedef struct splash_gen_take {
    int state;            /* SPLASH_GEN_* at the time of the take */
    int n_tokens;
    int n_recorded;       /* tokens recorded (splash_gen_token) at the time of the take */
    splash_finish finish; /* != NONE once everything has been taken */
    char error[256];
    double prefill_ms, decode_ms;
    int drafted, accepted, cycles; /* speculation: proposals, accepted ones, cycles (tokens per cycle =
                                      (accepted + cycles) / cycles, counting each cycle's own token) */
} splash_gen_take;

/* Waits up to timeout_ms for new text or the end, moves the pending text into
 * out (appended) and fills *t.  Returns 1 if anything new arrived (text or
 * the end), 0 on timeout. */
int splash_gen_wait(splash_gen *g, int timeout_ms, strbuf *out, splash_gen_take *t);

/* Copies recorded tokens [from, from + max) that exist into toks and, when
 * the gen has logprobs, lps (either may be NULL); returns how many. */
int splash_gen_records(splash_gen *g, int from, int max, splash_gen_token *toks, splash_logprobs *lps);

#define SPLASH_GPU_PREFILL_CHUNK 2048

/* splash_engine_options.auto_block */
typedef enum splash_auto_block {
    SPLASH_AUTO_BLOCK_OFF = 0,     /* the block as resolved, every step */
    SPLASH_AUTO_BLOCK_ON = 1,      /* chosen step by step (serve --block-size auto): a package's
                                      serving.block_size 1 then means the draft's own block or 1 */
    SPLASH_AUTO_BLOCK_DEFAULT = 2, /* chosen step by step unless the package pins serving.block_size
                                      1 (its draft then stays unloaded): serve's default */
} splash_auto_block;

typedef struct splash_engine_options {
    const char *model_dir;
    const char *device; /* "cpu" (NULL too), "cuda" or "auto" (splash_device_resolve) */
    int threads;
    int max_context; /* tokens per request (prompt + output); 0 = the model's limit, capped */
    int max_lanes;   /* requests decoding together (default 4) */
    int max_queue;   /* requests waiting for a lane (default 64) */
    int prefill_chunk; /* rows per forward call (default 256; on a GPU SPLASH_GPU_PREFILL_CHUNK) */
    int slice_ms;      /* prefill slice time target while others decode (default 500, min 64 rows) */
    int kv_format;     /* splash_kv_format (0 = f32, exact; serve passes its --kv-format, int8 by default) */
    int cpu_activations; /* splash_cpu_act of q4/q8 products on the CPU (0 = auto: int8) */
    size_t max_memory; /* --max-memory bytes, 0 = no cap */
    size_t available;  /* usable memory override (tests), 0 = MemAvailable */
    size_t pool_cap;   /* most bytes of KV pages (0 = every lane's full context twice) */
    int checkpoint_interval; /* tokens between prefill checkpoints (default 2048, page multiple) */
    int no_prefix_cache;     /* 1: every request runs cold (tests, comparisons) */
    int kv_pool_pages;       /* tests: at most this many KV pages (0 = what the plan gives) */
    int block_size;          /* decode block, anchor + proposals: 1..16 (1 = no draft); 0 = the draft's own */
    int auto_block;          /* splash_auto_block: each step runs the lanes that follow the engine's block
                                (block_size, or the package's, or the draft's own) at it or at 1, whichever the
                                decode-only steps measured faster at that many lanes (runtime/block_policy.h);
                                greedy and unseeded requests only */
    int draft_window;        /* context positions the draft reads (0 = 2048); the prompt computes taps only for these */
    int full_rows;           /* 1: every decision from whole rows of logits, never TOP rows (runtime/model.h: the
                                model then copies the vocabulary a row); also SPLASH_FULL_ROWS=1 */
    struct splash_draft *test_draft; /* tests: this draft (borrowed, runtime/draft.h) instead of the package's */
    /* tests: called on the engine thread with the target row that decided output token `index` */
    void (*test_on_logits)(void *ctx, const splash_gen *g, int index, const float *row, int vocab);
    /* tests: called with each cycle's proposals; seq[n_seq - 1] of the request is their anchor */
    void (*test_on_propose)(void *ctx, const splash_gen *g, int n_seq, const int32_t *props, int n);
    void *test_ctx;
} splash_engine_options;

/* Loads the package, model and tokenizer, allocates the pool, starts the
 * engine thread. */
int splash_engine_start(const splash_engine_options *opt, splash_engine **out, splash_error *err);
/* Stops the thread: every queued and running gen ends with error `why`
 * (NULL: "the server is stopping"); later submits fail.  The engine's
 * tokenizer and figures stay readable until splash_engine_free. */
void splash_engine_stop(splash_engine *e, const char *why);
/* Stops (if needed) and frees the model, the pool and the tokenizer. */
void splash_engine_free(splash_engine *e);

/* Queues a gen (the engine takes its own reference).  SPLASH_E_RANGE when the
 * queue is full (429), SPLASH_E_INVALID when the gen cannot fit the pool,
 * SPLASH_E_UNSUPPORTED when the engine is stopping. */
int splash_engine_submit(splash_engine *e, splash_gen *g, splash_error *err);

const splash_tokenizer *splash_engine_tokenizer(const splash_engine *e);
/* The package manifest (for token ids and the model name). */
const json_value *splash_engine_manifest(const splash_engine *e);
int splash_engine_max_context(const splash_engine *e);
int splash_engine_vocab(const splash_engine *e);

typedef struct splash_engine_stats {
    int queued, active, max_lanes, max_queue;
    int pages_total, pages_free, page_tokens, slots_total, slots_free; /* pages_free: unused + cached unpinned */
    uint64_t requests_done, prompt_tokens, completion_tokens;
    uint64_t admissions_deferred; /* times a queued request had a lane free and too few pages (it waited) */
    double prefill_seconds, decode_seconds;
    size_t weight_bytes, pool_bytes;
    /* the memory plan (bytes) */
    size_t plan_budget, plan_fixed, plan_scratch, plan_kv_bytes, plan_snapshot_bytes;
    int plan_max_snapshots;
    size_t plan_spare_bytes; /* memory the model took beyond its needs (model.h, splash_model_use_spare) */
    /* the prefix cache and snapshots */
    int pages_cached, pages_pinned;
    uint64_t cache_lookups, cache_hits, cached_tokens, pages_evicted, prefill_tokens;
    int snapshots_held;
    size_t snapshot_bytes;
    uint64_t snapshots_taken, snapshots_evicted, snapshots_restored;
    const char *device;      /* "cpu" or "cuda" (static) */
    char device_name[128];   /* "NVIDIA H200", or "CPU" */
    /* the decode cycle */
    const char *draft;  /* "dflash", a test draft's name, or "none" (a static string) */
    int block_size;
    int block_auto;     /* the block is chosen step by step (splash_engine_options.auto_block) */
    uint64_t auto_steps[2]; /* steps that chose block 1 / the block */
    double auto_rate[2][2]; /* tokens a second measured at 1 and 4 lanes: [lanes 1, 4][block 1, the block] */
    int auto_best[2];       /* the faster way measured at 1 and 4 lanes: 1 the block, 0 block 1, -1 not yet */
    uint64_t spec_cycles, spec_drafted, spec_accepted;
    uint64_t spec_device_cycles; /* lane cycles whose proposals went from the draft to the verify on the device */
    uint64_t spec_model_decided; /* lane cycles decided and committed by the model (splash_model_commit_greedy) */
    uint64_t spec_steps; /* decode-only steps, whose time the split below covers */
    double spec_draft_seconds, spec_verify_seconds, spec_accept_seconds, spec_commit_seconds;
    uint64_t rows_decided, rows_decided_top; /* target rows decisions were read from; of them TOP rows (model.h) */
} splash_engine_stats;
/* Drops every cached page and snapshot no running request pins (done on the
 * engine thread between steps); for tests and leak checks.  Returns the
 * pages still allocated afterwards: 0 when idle and nothing leaked. */
int splash_engine_flush_cache(splash_engine *e);
void splash_engine_get_stats(splash_engine *e, splash_engine_stats *s);

double splash_now(void); /* monotonic seconds */

#endif
