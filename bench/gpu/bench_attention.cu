/* bench_attention.cu - one attention call over int8 pages at a prefill
 * chunk's shape: R rows of one lane after P positions, the production
 * shapes' heads, timed with the lane's bulk split (splash_cuda_attn_bulk_split,
 * where longer than the long split), the long split (bulk prefill: the
 * flash kernel, or with SPLASH_CUDA_ATTN_FLASH=0 the wide split kernel) and
 * the default split (the lane's own: attention.h; where its workspace fits 4 GB), with the causal FLOPs a second (2 x 2 x head_dim a (query vector,
 * position it sees)).  No reference: test_cuda_ops checks the values.
 *
 * Usage: bench/gpu/bench_attention.sh (builds it) or bench_attention
 *        [27b|35b|hd128] [P:R ...]   (default 27b 0:4096
 *        16384:1024 31744:1024); BENCH_SPLITS=512,1024 also times those
 *        splits (the split kernels: verify rows take the wide layout);
 *        BENCH_LANES=4 makes every case 4 such lanes in one call
 */
#include <cuda_runtime.h>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_check.h"
#include "bench_timing.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int kPageTokens = 32; /* QWEN35_PAGE_TOKENS */

struct Shape {
    const char *name;
    int heads, kv_heads, head_dim;
};
const Shape kShapes[] = {{"27b", 24, 4, 256}, {"35b", 16, 2, 256}, {"hd128", 16, 2, 128}};

/* One page's bytes: int8 K / V in [-127, 127], scales in [0.01, 0.05). */
std::vector<uint8_t> random_page(const splash_cuda_kv_layout &l) {
    std::vector<uint8_t> p(l.page_bytes, 0);
    uint32_t s = 12345;
    for (int h = 0; h < l.kv_heads; h++)
        for (int t = 0; t < l.page_tokens; t++) {
            const size_t ri = (size_t)h * l.page_tokens + t;
            for (int d = 0; d < l.head_dim; d++) {
                p[l.k_off + ri * l.head_dim + d] = (uint8_t)(int8_t)((int)(bench::mix(s++) % 255) - 127);
                p[l.v_off + ri * l.head_dim + d] = (uint8_t)(int8_t)((int)(bench::mix(s++) % 255) - 127);
            }
            const float ks = 0.01f + 0.04f * (float)(bench::mix(s++) % 1000) / 1000.f, vs = 0.01f + 0.04f * (float)(bench::mix(s++) % 1000) / 1000.f;
            memcpy(&p[l.ks_off + ri * 4], &ks, 4);
            memcpy(&p[l.vs_off + ri * 4], &vs, 4);
        }
    return p;
}

} // namespace

int main(int argc, char **argv) {
    const Shape *s = &kShapes[0];
    std::vector<std::pair<int, int>> cases;
    for (int i = 1; i < argc; i++) {
        int p, r;
        bool named = false;
        for (const Shape &k : kShapes)
            if (!strcmp(argv[i], k.name)) s = &k, named = true;
        if (named) continue;
        if (sscanf(argv[i], "%d:%d", &p, &r) != 2 || p < 0 || r < 1) {
            fprintf(stderr, "usage: bench_attention [27b|35b|hd128] [P:R ...]\n");
            return 2;
        }
        cases.push_back({p, r});
    }
    if (cases.empty()) cases = {{0, 4096}, {16384, 1024}, {31744, 1024}};
    splash_cuda_kv_layout l;
    if (splash_cuda_kv_layout_init(&l, 2 /* SPLASH_KV_INT8 */, 1, s->kv_heads, s->head_dim, kPageTokens)) return 1;
    const std::vector<uint8_t> page = random_page(l);
    /* BENCH_SPLITS=a,b,...: splits (multiples of 64 below the long split) timed after the default one */
    std::vector<int> extra;
    if (const char *e = getenv("BENCH_SPLITS"))
        for (const char *c = e; *c;) {
            const int v = atoi(c);
            if (v >= 64 && v % 64 == 0 && v < SPLASH_CUDA_ATTN_SPLIT_LONG) extra.push_back(v);
            c = strchr(c, ',');
            if (!c) break;
            c++;
        }
    /* BENCH_LANES=N: N lanes of the same P:R, each on pages of its own (a
     * batch of verify lanes; the rows column is a lane's) */
    const char *bl = getenv("BENCH_LANES");
    const int NL = bl && atoi(bl) > 1 ? atoi(bl) : 1;
    printf("| shape | n_past | rows | kernel | us | causal TFLOP/s |\n|---|---|---|---|---|---|\n");
    for (auto [P, R] : cases) {
        const int ctx = P + R, lane_pages = (ctx + kPageTokens - 1) / kPageTokens, w = s->heads * s->head_dim;
        const int n_pages = lane_pages * NL, RT = R * NL;
        uint8_t *pool;
        SPLASH_CUDA_CHECK(cudaMalloc(&pool, (size_t)n_pages * l.page_bytes));
        for (int i = 0; i < n_pages; i++)
            SPLASH_CUDA_CHECK(cudaMemcpy(pool + (size_t)i * l.page_bytes, page.data(), l.page_bytes, cudaMemcpyHostToDevice));
        std::vector<int32_t> ids(n_pages);
        for (int i = 0; i < n_pages; i++) ids[i] = i;
        int32_t *dids;
        SPLASH_CUDA_CHECK(cudaMalloc(&dids, ids.size() * 4));
        SPLASH_CUDA_CHECK(cudaMemcpy(dids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
        std::vector<splash_cuda_attn_lane> ln(NL);
        for (int i = 0; i < NL; i++) ln[i] = {dids + (size_t)i * lane_pages, P, i * R, R, 0};
        splash_cuda_attn_lane *dln;
        SPLASH_CUDA_CHECK(cudaMalloc(&dln, ln.size() * sizeof ln[0]));
        SPLASH_CUDA_CHECK(cudaMemcpy(dln, ln.data(), ln.size() * sizeof ln[0], cudaMemcpyHostToDevice));
        std::vector<float> q((size_t)RT * w);
        uint32_t seed = 99;
        for (float &x : q) x = ((float)(bench::mix(seed++) % 2001) - 1000.f) / 500.f;
        float *dq, *dgate, *dout;
        SPLASH_CUDA_CHECK(cudaMalloc(&dq, q.size() * 4));
        SPLASH_CUDA_CHECK(cudaMalloc(&dgate, q.size() * 4));
        SPLASH_CUDA_CHECK(cudaMalloc(&dout, q.size() * 4));
        SPLASH_CUDA_CHECK(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
        SPLASH_CUDA_CHECK(cudaMemcpy(dgate, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
        /* vectors x positions seen: rows r sees P + r + 1 */
        const double seen = (double)NL * s->heads * ((double)R * P + (double)R * (R + 1) / 2);
        const double flop = 4.0 * s->head_dim * seen;
        /* the lane's bulk split (one split: no workspace), the shortest long
         * split, the default split (where its workspace stays under 4 GB) */
        const int bulk = splash_cuda_attn_bulk_split(R, ctx, s->heads, s->kv_heads);
        for (int mode = 2; mode >= -(int)extra.size(); mode--) {
            const int long_split = mode > 0;
            if (mode == 0 && splash_cuda_attn_workspace_bytes(RT, s->heads, s->head_dim, ctx, 0) > (4ull << 30)) continue;
            if (mode == 2 && bulk == SPLASH_CUDA_ATTN_SPLIT_LONG) continue; /* the same call as mode 1 */
            const int split = mode == 2 ? bulk : long_split ? SPLASH_CUDA_ATTN_SPLIT_LONG : mode < 0 ? extra[-mode - 1] : 0;
            splash_cuda_attn_args a;
            memset(&a, 0, sizeof a);
            a.layout = &l, a.pool = pool, a.layer = 0, a.lanes = dln, a.n_lanes = NL, a.rows = RT;
            a.max_lane_rows = a.min_lane_rows = R, a.max_ctx = ctx, a.n_heads = s->heads;
            a.q = dq, a.ldq = w, a.gate = dgate, a.ldg = w, a.out = dout, a.ldo = w;
            a.scale = 1.0f / sqrtf((float)s->head_dim);
            a.split = split;
            a.workspace_bytes = ctx <= a.split ? 0 : splash_cuda_attn_workspace_bytes(RT, s->heads, s->head_dim, ctx, a.split);
            SPLASH_CUDA_CHECK(cudaMalloc(&a.workspace, a.workspace_bytes ? a.workspace_bytes : 256));
            const double us =
                bench::median_us([&] { return splash_cuda_attention(&a, NULL); }, 5, "splash_cuda_attention");
            char kern[48];
            if (a.split)
                snprintf(kern, sizeof kern, "%s %d, %s", long_split ? "long" : "split", a.split,
                         !long_split ? "int8" : splash_cuda_attn_flash() ? "flash" : "wide");
            else /* the lane's own split from the default (SPLASH_CUDA_ATTN_LANE_SPLIT=0: 128 for every lane) */
                snprintf(kern, sizeof kern, "split default, int8");
            printf("| %s | %d | %d | %s | %.1f | %.1f |\n", s->name, P, R, kern, us, flop / us * 1e-6);
            cudaFree(a.workspace);
        }
        cudaFree(pool), cudaFree(dids), cudaFree(dln), cudaFree(dq), cudaFree(dgate), cudaFree(dout);
    }
    return 0;
}
