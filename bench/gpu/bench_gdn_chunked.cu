/* bench_gdn_chunked.cu - one splash_cuda_gdn_chunked call (the chunked GDN
 * of a prefill: prep and state pass, gated norm) at a production shape, one
 * lane of R rows, the model's workspace (384 MB, GDN_WORKSPACE_BUDGET in
 * cuda_model.cu), timed with events (median of 3 after a warm-up), with the
 * time a 64-row chunk.  Built with -DSPLASH_GDN_PROBE (bench_gdn_chunked.sh --probe), it
 * also prints where the kernels' blocks spend their cycles, phase by phase
 * (gdn_chunked.cu's probe: thread 0's clock at each phase's barrier).  No
 * reference: test_cuda_ops checks the values.
 *
 * Usage: bench/gpu/bench_gdn_chunked.sh [--probe] [27b|35b] [R ...]
 *        (default 27b 2048 32768)
 */
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gdn.h"
#include "bench_timing.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifdef SPLASH_GDN_PROBE
extern "C" int splash_cuda_gdn_probe_read(unsigned long long *out, int n, int reset);
extern "C" const char *splash_cuda_gdn_probe_name(int i);
#endif

namespace {

struct Shape {
    const char *name;
    int hk, hv, dk, dv;
};
const Shape kShapes[] = {{"27b", 16, 48, 128, 128}, {"35b", 16, 32, 128, 128}};
constexpr size_t kWorkspaceBytes = (size_t)384 << 20;

/* n floats uniform in [lo, hi) on the device */
float *random_dev(size_t n, float lo, float hi, uint32_t seed) {
    std::vector<float> h(n);
    for (size_t i = 0; i < n; i++) h[i] = lo + (hi - lo) * (float)(bench::mix(seed + (uint32_t)i) >> 8) / 16777216.f;
    float *d = nullptr;
    SPLASH_CUDA_CHECK(cudaMalloc(&d, n * sizeof(float)));
    SPLASH_CUDA_CHECK(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

} // namespace

int main(int argc, char **argv) {
    const Shape *s = &kShapes[0];
    std::vector<int> rows;
    for (int i = 1; i < argc; i++) {
        bool named = false;
        for (const Shape &k : kShapes)
            if (!strcmp(argv[i], k.name)) s = &k, named = true;
        if (named) continue;
        const int r = atoi(argv[i]);
        if (r < 1) {
            fprintf(stderr, "usage: bench_gdn_chunked [27b|35b] [R ...]\n");
            return 2;
        }
        rows.push_back(r);
    }
    if (rows.empty()) rows = {2048, 32768};
    const int R = *std::max_element(rows.begin(), rows.end());
    const size_t key = (size_t)s->hk * s->dk, val = (size_t)s->hv * s->dv, ldm = 2 * key + val;
    /* q, k, v as the conv leaves them; the gates' raw projections; weights */
    float *mixed = random_dev((size_t)R * ldm, -1.f, 1.f, 1);
    float *ga = random_dev((size_t)R * s->hv, -2.f, 2.f, 2), *gb = random_dev((size_t)R * s->hv, -2.f, 2.f, 3);
    float *neg_a = random_dev(s->hv, -1.f, -0.05f, 4), *dt_bias = random_dev(s->hv, -0.5f, 0.5f, 5);
    float *z = random_dev((size_t)R * val, -2.f, 2.f, 6), *norm_w = random_dev(s->dv, 0.5f, 1.5f, 7);
    float *y = nullptr, *state = nullptr, *ws = nullptr;
    const size_t state_floats = (size_t)s->hv * s->dk * s->dv;
    SPLASH_CUDA_CHECK(cudaMalloc(&y, (size_t)R * val * sizeof(float)));
    SPLASH_CUDA_CHECK(cudaMalloc(&state, state_floats * sizeof(float)));
    SPLASH_CUDA_CHECK(cudaMemset(state, 0, state_floats * sizeof(float)));
    const size_t one = splash_cuda_gdn_chunked_ws_floats(s->hv, s->dk, s->dv, 1, 1);
    const size_t ws_floats = std::max(one, kWorkspaceBytes / sizeof(float));
    SPLASH_CUDA_CHECK(cudaMalloc(&ws, ws_floats * sizeof(float)));
    splash_cuda_gdn_lane *lane_d = nullptr;
    SPLASH_CUDA_CHECK(cudaMalloc(&lane_d, sizeof *lane_d));

    printf("# chunked GDN, %s (hk %d, hv %d, dk %d, dv %d), one lane, workspace %zu chunks\n", s->name, s->hk, s->hv,
           s->dk, s->dv, ws_floats / one);
    printf("| rows | chunks | us a call | us a chunk |\n|---|---|---|---|\n");
    for (int n : rows) {
        splash_cuda_gdn_lane ln;
        memset(&ln, 0, sizeof ln);
        ln.s_in = state, ln.s_out = state, ln.first_row = 0, ln.n_rows = n;
        SPLASH_CUDA_CHECK(cudaMemcpy(lane_d, &ln, sizeof ln, cudaMemcpyHostToDevice));
        splash_cuda_gdn_args a;
        memset(&a, 0, sizeof a);
        a.lanes = lane_d, a.n_lanes = 1, a.hk = s->hk, a.hv = s->hv, a.dk = s->dk, a.dv = s->dv;
        a.mixed = mixed, a.ldm = ldm, a.a = ga, a.b = gb, a.ldab = (size_t)s->hv, a.neg_a = neg_a, a.dt_bias = dt_bias;
        a.z = z, a.ldz = val, a.norm_w = norm_w, a.y = y, a.ldy = val, a.eps = 1e-6f;
        a.ws = ws, a.ws_floats = ws_floats, a.max_lane_rows = n;
        const double us =
            bench::median_us([&] { return splash_cuda_gdn_chunked(&a, NULL); }, 3, "splash_cuda_gdn_chunked");
        const int chunks = (n + SPLASH_CUDA_GDN_CHUNK - 1) / SPLASH_CUDA_GDN_CHUNK;
        printf("| %d | %d | %.1f | %.2f |\n", n, chunks, us, us / chunks);
#ifdef SPLASH_GDN_PROBE
        /* one more call, probed alone */
        unsigned long long p[32];
        splash_cuda_gdn_probe_read(p, 32, 1);
        if (splash_cuda_gdn_chunked(&a, NULL)) return 1;
        SPLASH_CUDA_CHECK(cudaDeviceSynchronize());
        const int np = splash_cuda_gdn_probe_read(p, 32, 1);
        int khz = 0;
        SPLASH_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
        /* phases 0..7 per state-pass chunk (count at 8), 9..14 per output block (count at 15),
         * 16..23 per prep block (count at 24) */
        for (int i = 0; i < np; i++) {
            const char *nm = splash_cuda_gdn_probe_name(i);
            const unsigned long long cnt = p[i < 8 ? 8 : i < 16 ? 15 : 24];
            if (!nm || !p[i] || i == 8 || i == 15 || i == 24 || !cnt) continue;
            printf("|   %-34s | %8.0f cycles | %6.2f us |\n", nm, (double)p[i] / cnt, (double)p[i] / cnt / khz * 1e3);
        }
        printf("|   (%llu state-pass chunks, %llu output blocks, %llu prep blocks; clock %d MHz) |\n", p[8], p[15], p[24],
               khz / 1000);
#endif
    }
    return 0;
}
