/* rope.h - the elementwise steps of gated attention around its core, on the
 * GPU:
 *
 *   rotary        partial rotary embedding, NEOX pairing (i, i + rot_dim/2),
 *                 dims >= rot_dim passed through, in place (cpu_rope);
 *   attn_prep     everything between the q/k/v projections and the KV write
 *                 in one launch: the q|gate de-interleave of q_proj's output
 *                 ([heads][2*head_dim] per row: q_h then gate_h), q_norm and
 *                 k_norm (RMSNorm per head), rotary on q and k;
 *   sigmoid gate  o *= sigmoid(gate), the output gate (also fused into the
 *                 attention's combine step, attention.h).
 *
 * Rotary angles: inv_freq is computed once on the host by
 * splash_cuda_rope_inv_freq() with exactly cpu_rope's fp32 formula (1 /
 * powf(theta, 2i/rot_dim)), uploaded by the caller, and the kernel forms the
 * angle pos * inv_freq[i] in fp32 as the CPU does.  The only difference from
 * the CPU is then cosf/sinf (CUDA's are within 2 ulp, with full range
 * reduction, so positions up to 262144 are fine).
 *
 * Positions: pos[r] (device int32) is the position of row r.  All pointers
 * are device memory except where marked host.  Nothing is allocated.
 */
#ifndef SPLASH_CUDA_ROPE_H
#define SPLASH_CUDA_ROPE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;

#define SPLASH_CUDA_MAX_HEAD_DIM 1024

/* Host: inv[i] = 1 / theta^(2i / rot_dim) for i < rot_dim / 2 (fp32, as cpu_rope). */
void splash_cuda_rope_inv_freq(float *inv, int rot_dim, double theta);

/* In place on rows x heads vectors x[r * ldx + h * head_dim + i]. */
int splash_cuda_rope(float *x, size_t ldx, int rows, int heads, int head_dim, int rot_dim, const float *inv_freq,
                     const int32_t *pos, struct CUstream_st *stream);

typedef struct splash_cuda_attn_prep_args {
    const float *qg;        /* [rows][heads][2 * head_dim] q_proj output, row stride ldqg (heads 0: unused) */
    size_t ldqg;
    size_t qhs;             /* floats from one q head to the next in qg; 0: 2 * head_dim (q|gate interleaved,
                               the target's); head_dim: plain q heads (the DFlash draft's; qg may be q) */
    float *q;               /* [rows][heads * head_dim] out: rope(rmsnorm(q) * q factor) */
    size_t ldq;
    float *gate;            /* [rows][heads * head_dim] out: the gate halves (qhs 0 only); NULL: not written */
    size_t ldg;
    float *k;               /* [rows][kv_heads * head_dim] in place: rope(rmsnorm(k) * k factor) */
    size_t ldk;
    const float *q_norm;    /* [head_dim] factor = norm_offset + q_norm[i] */
    const float *k_norm;    /* [head_dim] */
    float norm_offset;      /* 1 for stored zero-centred weights, 0 for factors */
    float eps;
    const float *inv_freq;  /* [rot_dim / 2] (splash_cuda_rope_inv_freq) */
    const int32_t *pos;     /* [rows] */
    int rows, heads, kv_heads, head_dim, rot_dim; /* heads 0: k only; rot_dim 0: no rotary */
    /* 1: the caller's word that no kernel still running writes q_norm, k_norm, inv_freq or pos,
     * so the norm factors and the rotary's cos and sin are made before the programmatic wait
     * (splash_cuda_attn_early_loads); the same results either way */
    int early;
} splash_cuda_attn_prep_args;

int splash_cuda_attn_prep(const splash_cuda_attn_prep_args *a, struct CUstream_st *stream);

/* o[r * ldo + i] *= sigmoid(gate[r * ldg + i]) for i < width. */
int splash_cuda_sigmoid_gate(float *o, size_t ldo, const float *gate, size_t ldg, int rows, int width,
                             struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif

#endif
