/* cuda_graphs.cu - decode-shaped forwards (and commits) replayed as CUDA graphs.
 *
 * Why.  A 27B decode step is ~1,300 kernels; launched one by one from the
 * host they cost more than they compute (the q4 products of a layer are
 * ~50 us of HBM time, the launches around them as much again, NOTES.md).
 * A graph is launched with one call and its kernels follow each other on
 * the device without the host.
 *
 * What makes it possible: a forward's kernels take only device pointers
 * fixed at load / attach (weights, scratch, the pools, the descriptor's
 * device mirror) and sizes that follow from the batch's *shape*: rows,
 * lanes and their modes and row counts, LOGITS / TAPS row counts, and the
 * attention's longest context, which the forward rounds up to a bucket
 * (the split blocks past a lane's context return at once, and a row's
 * result does not depend on the split count: same bits).  Everything else
 * (positions, tokens, page tables, state pointers) travels in the
 * descriptor, uploaded before the graph runs.  So one graph serves every
 * forward of one shape key.
 *
 * Policy: a shape is launched eagerly the first time it is seen (that run
 * also does one-time set-up such as kernel attributes, which must not
 * happen inside a capture), captured on its second forward, replayed from
 * then on.  QC_MAX_GRAPHS keys are kept, least recently used evicted; a
 * capture that fails marks its key eager for good.  Attach and free drop
 * every graph (the pointers they hold change).  SPLASH_CUDA_GRAPHS=0 in the
 * environment turns graphs off (before/after measurements, debugging).
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "models/qwen35/cuda_model.h"

static void graph_drop(qc_graph *g) {
    if (g->exec) cudaGraphExecDestroy((cudaGraphExec_t)g->exec);
    memset(g, 0, sizeof *g);
}

void qc_graphs_clear(qc_graph_set *gs) {
    for (int i = 0; i < QC_MAX_GRAPHS; i++) graph_drop(&gs->graphs[i]);
}

int qc_graphs_enabled(void) {
    const char *v = getenv("SPLASH_CUDA_GRAPHS");
    return !(v && !strcmp(v, "0"));
}

qc_graph *qc_graph_find(qc_graph_set *gs, const int *key, int n) {
    if (n < 1 || n > QC_GRAPH_KEY_MAX) return nullptr;
    qc_graph *lru = &gs->graphs[0];
    for (int i = 0; i < QC_MAX_GRAPHS; i++) {
        qc_graph *g = &gs->graphs[i];
        if (g->n_key == n && !memcmp(g->key, key, (size_t)n * sizeof(int))) {
            g->last_use = ++gs->clock;
            return g;
        }
        if (g->last_use < lru->last_use) lru = g;
    }
    graph_drop(lru); /* an empty entry has last_use 0: taken first */
    memcpy(lru->key, key, (size_t)n * sizeof(int));
    lru->n_key = n;
    lru->last_use = ++gs->clock;
    return lru;
}

/* Captures body(ctx) on the stream into g's executable graph; 0, or nonzero
 * when the capture or its instantiation failed (nothing has run then). */
static int capture(qc_graph_set *gs, qc_graph *g, int (*body)(void *), void *ctx) {
    const cudaStream_t s = (cudaStream_t)gs->stream;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return -1;
    const int rc = body(ctx);
    cudaGraph_t graph = nullptr;
    const cudaError_t e = cudaStreamEndCapture(s, &graph);
    cudaGraphExec_t exec = nullptr;
    int bad = rc || e != cudaSuccess || !graph || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess;
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError(); /* a failed capture leaves its error behind; the eager run reports its own */
    if (bad) return -1;
    g->exec = exec;
    return 0;
}

int qc_graph_run(qc_graph_set *gs, qc_graph *g, int (*body)(void *), void *ctx) {
    if (!g || g->failed) return body(ctx);
    if (!g->exec) {
        if (g->seen++ == 0) return body(ctx); /* the first time eagerly (one-time set-up) */
        if (capture(gs, g, body, ctx)) {
            g->failed = 1;
            return body(ctx);
        }
    }
    SPLASH_CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)g->exec, (cudaStream_t)gs->stream));
    return 0;
}
