/* cupti_trace.cpp - kernel timeline of any CUDA program, graphs included, for
 * a machine without Nsight Systems.
 *
 *   g++ -shared -fPIC -O2 -I$CUDA/include tools/cupti_trace.cpp -o libtrace.so -L<cupti dir> -lcupti
 *   CUDA_INJECTION64_PATH=$PWD/libtrace.so SPLASH_TRACE_OUT=trace.csv program ...
 *
 * The CUDA driver loads the library named by CUDA_INJECTION64_PATH when the
 * program initialises CUDA and calls InitializeInjection(); from then on CUPTI
 * records every kernel's start and end as the GPU timestamps them
 * (CONCURRENT_KERNEL activity: kernels are not serialised), inside CUDA graphs
 * too, which Nsight Compute cannot time.  At exit the records go to
 * SPLASH_TRACE_OUT as CSV: start_ns,end_ns,graph_id,graph_node,grid,block,name
 * (demangled, template arguments kept).  tools/trace_summary.py reads it.
 */
#include <cupti.h>
#include <cxxabi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *g_out;
static const size_t kBuf = 8u << 20;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = (uint8_t *)aligned_alloc(8, kBuf);
    *size = *buffer ? kBuf : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t *buffer, size_t, size_t valid) {
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        int status = 0;
        char *dem = abi::__cxa_demangle(k->name, NULL, NULL, &status);
        const char *name = status == 0 && dem ? dem : k->name;
        if (g_out) {
            fprintf(g_out, "%llu,%llu,%u,%llu,%dx%dx%d,%dx%dx%d,\"", (unsigned long long)k->start,
                    (unsigned long long)k->end, k->graphId, (unsigned long long)k->graphNodeId, k->gridX, k->gridY,
                    k->gridZ, k->blockX, k->blockY, k->blockZ);
            for (const char *c = name; *c; c++) fputc(*c == '"' ? '\'' : *c, g_out);
            fputs("\"\n", g_out);
        }
        free(dem);
    }
    free(buffer);
}

static void flush_at_exit(void) {
    cuptiActivityFlushAll(1);
    if (g_out) fclose(g_out), g_out = NULL;
}

extern "C" int InitializeInjection(void) {
    const char *path = getenv("SPLASH_TRACE_OUT");
    g_out = fopen(path && *path ? path : "trace.csv", "w");
    if (!g_out) return 0;
    fputs("start_ns,end_ns,graph_id,graph_node,grid,block,name\n", g_out);
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "cupti_trace: CUPTI refused the kernel activity\n");
        return 0;
    }
    atexit(flush_at_exit);
    return 1;
}
