/* blas.cu - cuBLASLt through dlopen (blas.h).
 *
 * Only the types come from cublasLt.h; every function is looked up in the
 * library at open, so nothing links against it.  A call's descriptors and
 * algorithm (the heuristic's first answer for its shape) are kept in a small
 * table keyed by the shape, so a prefill chunk's products cost one host
 * lookup each after the first chunk of that size.
 */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/blas.h"
#include "backend/cuda/cuda_check.h"

namespace {

#define SPLASH_BLAS_FNS(X)                                                                                   \
    X(GetVersion)                                                                                    \
    X(Create)                                                                                        \
    X(Destroy)                                                                                       \
    X(MatmulDescCreate)                                                                              \
    X(MatmulDescDestroy)                                                                             \
    X(MatmulDescSetAttribute)                                                                        \
    X(MatrixLayoutCreate)                                                                            \
    X(MatrixLayoutDestroy)                                                                           \
    X(MatmulPreferenceCreate)                                                                        \
    X(MatmulPreferenceDestroy)                                                                       \
    X(MatmulPreferenceSetAttribute)                                                                  \
    X(MatmulAlgoGetHeuristic)                                                                        \
    X(Matmul)

struct Fns {
#define X(name) decltype(&cublasLt##name) name; /* cublasLt<name> */
    SPLASH_BLAS_FNS(X)
#undef X
};

/* One shape's descriptors and algorithm. */
struct Plan {
    int N, K, R, used;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
};

constexpr int kPlans = 64;

#define STR_(x) #x
#define STR(x) STR_(x)

} /* namespace */

struct splash_cuda_blas {
    void *lib;
    Fns f;
    cublasLtHandle_t lt;
    Plan plans[kPlans];
    int next; /* the entry a new shape replaces when the table is full */
};

static void drop_plan(splash_cuda_blas *b, Plan *p) {
    if (!p->used) return;
    b->f.MatrixLayoutDestroy(p->a);
    b->f.MatrixLayoutDestroy(p->b);
    b->f.MatrixLayoutDestroy(p->d);
    b->f.MatmulDescDestroy(p->op);
    p->used = 0;
}

extern "C" void splash_cuda_blas_close(splash_cuda_blas *b) {
    if (!b) return;
    for (int i = 0; i < kPlans; i++) drop_plan(b, &b->plans[i]);
    if (b->lt) b->f.Destroy(b->lt);
    if (b->lib) dlclose(b->lib);
    free(b);
}

extern "C" int splash_cuda_blas_open(splash_cuda_blas **out) {
    *out = nullptr;
    const char *env = getenv("SPLASH_CUDA_BLAS");
    if (env && !strcmp(env, "0")) return SPLASH_E_UNSUPPORTED;
    /* the major version the headers describe: another's ABI may differ */
    static const char *const names[] = {"libcublasLt.so." STR(CUBLAS_VER_MAJOR),
                                        "/usr/local/cuda/lib64/libcublasLt.so." STR(CUBLAS_VER_MAJOR)};
    void *lib = nullptr;
    for (size_t i = 0; i < sizeof names / sizeof *names && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) return SPLASH_E_UNSUPPORTED;
    splash_cuda_blas *b = (splash_cuda_blas *)calloc(1, sizeof *b);
    if (!b) {
        dlclose(lib);
        return SPLASH_E_NOMEM;
    }
    b->lib = lib;
    bool ok = true;
#define X(name) ok = ok && (*(void **)&b->f.name = dlsym(lib, "cublasLt" #name)) != nullptr;
    SPLASH_BLAS_FNS(X)
#undef X
    if (!ok || b->f.GetVersion() / 10000 != CUBLAS_VER_MAJOR ||
        b->f.Create(&b->lt) != CUBLAS_STATUS_SUCCESS) {
        b->lt = nullptr;
        splash_cuda_blas_close(b);
        return SPLASH_E_UNSUPPORTED;
    }
    *out = b;
    return SPLASH_OK;
}

/* The plan of shape (N, K, R): found, or made (descriptors + the
 * heuristic's algorithm); NULL when cuBLASLt refuses the shape. */
static Plan *plan_for(splash_cuda_blas *b, int N, int K, int R) {
    for (int i = 0; i < kPlans; i++) {
        Plan *p = &b->plans[i];
        if (p->used && p->N == N && p->K == K && p->R == R) return p;
    }
    Plan *p = &b->plans[b->next];
    b->next = (b->next + 1) % kPlans;
    drop_plan(b, p);
    const Fns &f = b->f;
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_DEVICE;
    const size_t ws = SPLASH_CUDA_BLAS_WORKSPACE;
    /* column-major view: y^T (N x R) = (w16 as K x N)^T (x16 as K x R) */
    bool ok = f.MatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
    if (!ok) return nullptr;
    bool la = false, lb = false, ld = false;
    ok = f.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS &&
         f.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS &&
         f.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm) ==
             CUBLAS_STATUS_SUCCESS &&
         (la = f.MatrixLayoutCreate(&p->a, CUDA_R_16F, K, N, K) == CUBLAS_STATUS_SUCCESS) &&
         (lb = f.MatrixLayoutCreate(&p->b, CUDA_R_16F, K, R, K) == CUBLAS_STATUS_SUCCESS) &&
         (ld = f.MatrixLayoutCreate(&p->d, CUDA_R_32F, N, R, N) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulPreference_t pref = nullptr;
    cublasLtMatmulHeuristicResult_t res;
    int n = 0;
    ok = ok && f.MatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
         f.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ==
             CUBLAS_STATUS_SUCCESS &&
         f.MatmulAlgoGetHeuristic(b->lt, p->op, p->a, p->b, p->d, p->d, pref, 1, &res, &n) ==
             CUBLAS_STATUS_SUCCESS &&
         n > 0;
    if (pref) f.MatmulPreferenceDestroy(pref);
    if (!ok) {
        if (la) f.MatrixLayoutDestroy(p->a);
        if (lb) f.MatrixLayoutDestroy(p->b);
        if (ld) f.MatrixLayoutDestroy(p->d);
        f.MatmulDescDestroy(p->op);
        return nullptr;
    }
    p->algo = res.algo;
    p->N = N, p->K = K, p->R = R, p->used = 1;
    return p;
}

extern "C" int splash_cuda_blas_gemm(splash_cuda_blas *b, const uint16_t *w16, int N, int K, const uint16_t *x16, int R,
                                     const float *alpha, const float *beta, float *y, void *workspace,
                                     struct CUstream_st *stream) {
    if (!b || !w16 || !x16 || !alpha || !beta || !y || !workspace || N <= 0 || K <= 0 || R <= 0 || K % 8)
        return SPLASH_E_INVALID;
    Plan *p = plan_for(b, N, K, R);
    if (!p) {
        fprintf(stderr, "cuBLASLt: no algorithm for an fp16 GEMM of %d x %d by %d rows\n", N, K, R);
        return SPLASH_E_IO;
    }
    const cublasStatus_t st = b->f.Matmul(b->lt, p->op, alpha, w16, p->a, x16, p->b, beta, y, p->d, y, p->d,
                                                  &p->algo, workspace, SPLASH_CUDA_BLAS_WORKSPACE,
                                                  (cudaStream_t)stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cuBLASLt: fp16 GEMM of %d x %d by %d rows: status %d\n", N, K, R, (int)st);
        return SPLASH_E_IO;
    }
    return SPLASH_OK;
}
