/* q4_matmul.h - q4 matrix-vector and small-M matrix products on the GPU
 * (decode: M = 1; verify: M = 2..16 rows), C-callable.
 *
 *   y[m][r] = sum_c w[r][c] * x[m][c],   w[r][c] = scale * q + bias  (tensor.h)
 *
 * Three steps, three owners of memory (all device memory belongs to the caller):
 *
 * 1. Load time: splash_q4_repack_host() turns the package's canonical q4 blob
 *    (tensor.h: codes [rows][cols/2], scales, biases) into the tiled layout the
 *    kernel streams, which is exactly as many bytes (plus zero rows up to a
 *    multiple of 16).  Upload it, then splash_q4_matrix_init() describes it.
 *      codes [tiles][groups][32 lanes][16 B]: the 16 rows x 64 columns of one
 *            (row tile, group) are 512 contiguous bytes, each lane's 16 bytes
 *            already in the order the tensor-core A fragment wants;
 *      sb    [tiles][groups][8][4] bf16: for lane row g the scales of rows g
 *            and g+8, then their biases (one 8-byte load per lane and group).
 * 2. Per activation: splash_q4_prep_x() scales each 64-column group of a row
 *    of x (fp32 [M][cols]) by a power of two 2^k (the group's max |x| in
 *    [2^21, 2^22)), rounds it to an integer (within 2^-22 of the group's max)
 *    held as three signed 8-bit digits, and sums each group in fp32.  One
 *    prepared activation serves every matrix that reads it (q/k/v, gate/up).
 * 3. splash_q4_matmul(): one launch, y fp32 [M][rows].
 *
 * Accuracy: fp32-grade (rel. L2 ~1e-6 against fp64), not bf16-grade: the
 * tensor cores multiply exact 4-bit codes by x's digits into exact int32
 * sums, which are scaled and accumulated in fp32.
 * Determinism: for a given matrix shape the result for row m depends only on
 * x[m], not on M or on the other rows (the split of the column range is a
 * function of the shape alone; each digit's sums are accumulated on their
 * own and added at the end, in the same order for every M).
 *
 * Errors: SPLASH_E_INVALID for bad shapes or arguments, SPLASH_E_UNSUPPORTED
 * for a config that is not compiled in, SPLASH_E_IO when the CUDA runtime
 * refuses (message on stderr, see cuda_check.h).
 */
#ifndef SPLASH_CUDA_Q4_MATMUL_H
#define SPLASH_CUDA_Q4_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st; /* cudaStream_t without the CUDA headers; NULL = default stream */

#define SPLASH_Q4_MAX_M 16 /* rows of x per call (decode 1, verify up to 16) */
#define SPLASH_Q4_MAX_COLS 32768 /* inputs of a q4 matrix the preparation accepts (the models: at most 17,408) */
#define SPLASH_Q4_TILE_ROWS 16
#define SPLASH_Q4_GROUP 64

/* A tiled q4 matrix in device memory (see above).  Does not own the memory. */
typedef struct splash_q4_matrix {
    int rows, cols;       /* logical [rows, cols]: rows = outputs, cols = inputs */
    int tiles, groups;    /* ceil(rows / 16), cols / 64 */
    const uint8_t *codes; /* [tiles][groups][512 B] */
    const uint8_t *sb;    /* [tiles][groups][64 B] */
} splash_q4_matrix;

/* Bytes of the tiled form (codes part, then sb part, each a multiple of 64). */
size_t splash_q4_tiled_bytes(int rows, int cols);
size_t splash_q4_tiled_codes_bytes(int rows, int cols);

/* Host repack: canonical blob (splash_matrix_layout(SPLASH_Q4, rows, cols))
 * -> tiled blob of splash_q4_tiled_bytes() bytes.  cols % 64 == 0. */
int splash_q4_repack_host(const uint8_t *canonical, int rows, int cols, uint8_t *tiled, size_t tiled_bytes);

/* Several canonical q4 matrices of the same cols stacked row-wise into the
 * tiled form of one matrix (the matrices that read one activation, q|k|v or
 * gate|up, become one launch).  Each part starts on a tile: part i's rows
 * begin at row sum_{j<i} roundup(rows[j], 16), and the rows between parts
 * are zero (scale and bias 0: their products are 0).
 * splash_q4_stacked_rows: the stack's rows (-1 for bad arguments); its
 * splash_q4_tiled_bytes is what repack_stacked writes. */
int splash_q4_stacked_rows(const int *rows, int n);
int splash_q4_repack_stacked_host(const uint8_t *const *canonical, const int *rows, int n, int cols, uint8_t *tiled,
                                  size_t tiled_bytes);

/* Describes a tiled blob already on the device. */
int splash_q4_matrix_init(splash_q4_matrix *m, const void *dev_tiled, int rows, int cols);

/* A prepared activation: up to 16 rows of up to `cap_cols` columns.  Each
 * group of 64 columns of a row has its own power-of-two scale 2^k[m][G] (its
 * largest |x| in [2^21, 2^22)), so no step of the preparation needs a whole
 * row: the groups are prepared in parallel. */
typedef struct splash_q4_xprep {
    int8_t *x8;        /* [rows_cap][3][cols]: round(x[m] 2^k[m][G]) = 65536 hi + 256 mid + lo, digits in
                          [-128, 127], each 16-column run stored in the kernel's order (q4_matmul.cu) */
    float *gsum;       /* [cols/64][rows_cap] fp32 sum of x[m] over each group, 0 for m in [M, 16) */
    float *ginv;       /* [cols/64][rows_cap] 2^-k[m][G] */
    int M, cols, cap_cols;
    int rows_cap;      /* 16; more for the grouped product's one-row activations (prep_silu_mul_rows) */
} splash_q4_xprep;

size_t splash_q4_xprep_bytes(int cap_cols);
/* Carves the four arrays out of dev_mem (splash_q4_xprep_bytes(cap_cols), 256-aligned). */
int splash_q4_xprep_init(splash_q4_xprep *xp, void *dev_mem, int cap_cols);
/* The same for rows_cap >= 16 rows (0 / SPLASH_E_INVALID for bad sizes,
 * among them rows_cap x 3 x cap_cols of 2^31 or more: the digits' offsets
 * are 32-bit). */
size_t splash_q4_xprep_rows_bytes(int cap_cols, int rows_cap);
int splash_q4_xprep_rows_init(splash_q4_xprep *xp, void *dev_mem, int cap_cols, int rows_cap);
/* x: device fp32 [M][cols], row stride ldx floats.  Sets xp->M, xp->cols. */
int splash_q4_prep_x(splash_q4_xprep *xp, const float *x, int M, int cols, int ldx, struct CUstream_st *stream);
/* The op that makes a q4 product's input, fused with its preparation (one
 * launch instead of two; the model's norms and SwiGLU): y (fp32 [rows][cols],
 * stride ldy) is written for all rows, and its first min(rows, 16) rows are
 * prepared in xp exactly as splash_q4_prep_x(y) would prepare them.
 *   rmsnorm:  y = (x * (1 / sqrt(mean(x^2) + eps))) * w   (w: the stored factors)
 *   silu_mul: y = silu(g) * u   (y may alias g or u: a thread reads before it writes) */
int splash_q4_prep_rmsnorm(splash_q4_xprep *xp, const float *x, size_t ldx, const float *w, float eps, float *y,
                           size_t ldy, int rows, int cols, struct CUstream_st *stream);
int splash_q4_prep_silu_mul(splash_q4_xprep *xp, const float *g, size_t ldg, const float *u, size_t ldu, float *y,
                            size_t ldy, int rows, int cols, struct CUstream_st *stream);
/* A MoE layer's weighted sum, left by splash_cuda_moe_experts_grouped (fo
 * NULL) to the RMS preparation that reads the residual next: row r's sum is
 * f = sum over k < K of mo[(r K + k) ldm ..] w[r K + k], k ascending from 0. */
#define SPLASH_Q4_MOE_SUM_MAX_K 16
typedef struct splash_q4_moe_sum {
    const float *mo; /* [rows * K][ldm] the slots' outputs */
    size_t ldm;
    const float *w;  /* [rows][K] the slots' weights */
    int K;
    float *fo;       /* [rows][ldf]: f is written here too, as the sum's own launch writes it */
    size_t ldf;
} splash_q4_moe_sum;
/* rmsnorm of x after x += f (ms), in one launch: x, fo, y and xp as the sum's
 * launch (splash_cuda_moe_sum) then splash_q4_prep_rmsnorm make them, to the
 * bit.  rows <= 16; SPLASH_E_UNSUPPORTED past 4,096 columns (a row's blocks
 * are one cluster of at most 8). */
int splash_q4_prep_rmsnorm_moe(splash_q4_xprep *xp, float *x, size_t ldx, const splash_q4_moe_sum *ms,
                               const float *w, float eps, float *y, size_t ldy, int rows, int cols,
                               struct CUstream_st *stream);
/* silu_mul with every row (up to xp->rows_cap) prepared as its own one-row
 * activation, for splash_q4_matmul_grouped (xdiv 1). */
int splash_q4_prep_silu_mul_rows(splash_q4_xprep *xp, const float *g, size_t ldg, const float *u, size_t ldu,
                                 float *y, size_t ldy, int rows, int cols, struct CUstream_st *stream);

/* How one launch is cut up.  Arithmetic order depends on ksplit and wk only. */
typedef struct splash_q4_config {
    int r;      /* row tiles (16 rows) per warp: 1, 2, 4 */
    int u;      /* groups per step per warp: 2, 4, 8 */
    int stages; /* 0: a step's loads, then its arithmetic; 1: next step's loads in flight meanwhile */
    int warps;  /* warps per block, 1..8, each on its own row tiles */
    int ksplit; /* blocks per cluster splitting the columns: 1, 2, 4, 8 */
    int wk;     /* warps of a block splitting its share of the columns: 1, 2, 4, 8 (divides warps) */
} splash_q4_config;

/* The shipped preset for this shape and M on this GPU (tables keyed by SM
 * count and memory size, measured: the H200's today), else a generic rule
 * sized by the SM count.  Always succeeds for valid shapes. */
int splash_q4_config_pick(int rows, int cols, int M, splash_q4_config *cfg);
/* The config splash_q4_matmul_grouped takes for `slots` slots (its class by
 * slots / 8; a shape's grouped verify configs may differ from its plain ones). */
int splash_q4_config_pick_grouped(int rows, int cols, int slots, splash_q4_config *cfg);
/* 0 if cfg is compiled in and valid for this shape, else SPLASH_E_UNSUPPORTED. */
int splash_q4_config_check(const splash_q4_config *cfg, int rows, int cols);
/* The compiled (r, u, stages) triples, in order (for sweeps and tests):
 * writes up to max of them to out, returns how many there are. */
int splash_q4_compiled_variants(int (*out)[3], int max);

/* y: device fp32 [M][rows] (row stride rows), M = xp->M, xp->cols == w->cols.
 * Nothing is allocated; y is written, never read. */
int splash_q4_matmul(const splash_q4_matrix *w, const splash_q4_xprep *xp, float *y, struct CUstream_st *stream);
int splash_q4_matmul_cfg(const splash_q4_matrix *w, const splash_q4_xprep *xp, float *y,
                         const splash_q4_config *cfg, struct CUstream_st *stream);
/* y += W x: y read and written, the product rounded to fp32 before the add
 * (the same bits as splash_q4_matmul into a scratch row, then an add); the
 * residual stream's x += W h without the scratch and the add's launch. */
int splash_q4_matmul_add(const splash_q4_matrix *w, const splash_q4_xprep *xp, float *y, struct CUstream_st *stream);

/* Grouped (MoE experts: one launch, the expert ids read on the device, no
 * host synchronisation, so it runs inside a CUDA graph).  Slot j in
 * [0, slots) multiplies expert idx[j]'s matrix by x row j / xdiv of xp (one
 * row each): y[j * ldy + r], r < rows.  The experts' matrices are first[0],
 * first[1], ... laid out every `stride` bytes (as the loader places a stacked
 * expert tensor); first2 / y2 (NULL: none) is a second such array read with
 * the same x rows (gate and up in one launch).  Ids outside [0, n_experts)
 * leave their slot's y unwritten.  Each slot's result is the bits
 * splash_q4_matmul gives for that row (the shape's preset, M-independent;
 * the launch's R / U / stages / warps are the preset's class for slots / 8
 * rows). */
int splash_q4_matmul_grouped(const splash_q4_matrix *first, const splash_q4_matrix *first2, int n_experts,
                             size_t stride, const int32_t *idx, const int32_t *plan, int slots, int xdiv,
                             const splash_q4_xprep *xp, float *y, float *y2, size_t ldy, struct CUstream_st *stream);
/* The same with a given config instead of the shape's preset (every grouped
 * block carries one slot, or a planned group's <= 4 x rows, on the class-0
 * kernel whatever the config's class): bench_q4_matmul --grouped sweeps it. */
int splash_q4_matmul_grouped_cfg(const splash_q4_matrix *first, const splash_q4_matrix *first2, int n_experts,
                                 size_t stride, const int32_t *idx, const int32_t *plan, int slots, int xdiv,
                                 const splash_q4_xprep *xp, float *y, float *y2, size_t ldy, const splash_q4_config *cfg,
                                 struct CUstream_st *stream);

/* The plan of a grouped product (plan, not NULL, above; idx is then not
 * read): idx's slots of each expert in groups of up to splash_q4_plan_group(),
 * so one block reads an expert for up to that many slots (the slots' x rows as
 * M <= 4 rows: the same bits per slot).  plan: device int32 of splash_q4_group_plan_ints(slots)
 * (0: more slots than one plan takes, 1,024), written on the device (graphs:
 * no host synchronisation); reused by every product over the same idx. */
size_t splash_q4_group_plan_ints(int slots);
/* The most slots a planned group holds: 2, or 4 with SPLASH_Q4_PLAN_GROUP=4
 * (an A/B switch: the kernel for 2 carries one pair of x rows, for 4 two). */
int splash_q4_plan_group(void);

/* Whether kernels chained by programmatic launch read what no kernel still
 * running can write (weights; states whose writers precede the last launch
 * without the attribute) before their wait, overlapping those loads with the
 * kernels before: the RMS preparation's norm factors here (w, which no
 * kernel may then write: the model's stored factors), the GDN conv's and
 * recurrence's states and weights where the model knows the chain allows it
 * (splash_cuda_gdn_conv's early, splash_cuda_gdn_args.early).  On unless SPLASH_CUDA_EARLY=0 (read at the
 * first call) or set off: an A/B switch, the same results either way. */
int splash_q4_early_loads(void);
void splash_q4_set_early_loads(int on);
/* Whether a preparation of M <= 16 rows (not each_row) launches blocks for
 * the Mp rows (M padded to 2 / 4 / 8 / 16) a product reads instead of all 16:
 * a decode step's RMS preparation of the 27B then runs 20 blocks, not 160.
 * On unless SPLASH_CUDA_PREP_PADDED=0 (read at the first call) or set: an
 * A/B switch, the same results either way (test_q4_matmul, every config). */
int splash_q4_prep_padded(void);
void splash_q4_set_prep_padded(int on);
/* Whether the model leaves a MoE layer's weighted sum of rows <= 16 to the
 * next RMS preparation (splash_q4_prep_rmsnorm_moe: one launch instead of
 * two).  On unless SPLASH_CUDA_MOE_NORM=0 (read at the first call) or set:
 * an A/B switch, the same results either way. */
int splash_q4_moe_norm(void);
void splash_q4_set_moe_norm(int on);
int splash_q4_group_plan(const int32_t *idx, int slots, int n_experts, int32_t *plan, struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif

#endif
