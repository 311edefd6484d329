/* quantize.c - affine group-64 quantisation (see quantize.h for the rule and
 * why the scale and bias are rounded outward). */
#include "package/quantize.h"

#include <math.h>
#include <string.h>

uint16_t splash_bf16_round_down(float x) {
    union { float f; uint32_t u; } v = {x};
    uint16_t h = (uint16_t)(v.u >> 16); /* truncation: toward zero */
    if ((v.u & 0xffffu) && (v.u & 0x80000000u)) h++; /* negative: one ulp further from zero */
    return h;
}

uint16_t splash_bf16_round_up(float x) {
    union { float f; uint32_t u; } v = {x};
    uint16_t h = (uint16_t)(v.u >> 16);
    if ((v.u & 0xffffu) && !(v.u & 0x80000000u)) h++;
    return h;
}

int splash_quantize_row(splash_dtype t, const float *w, int64_t cols, uint8_t *codes, uint16_t *scales,
                        uint16_t *biases) {
    const int levels = t == SPLASH_Q4 ? 15 : 255;
    int64_t groups = cols / SPLASH_QGROUP;
    for (int64_t g = 0; g < groups; g++) {
        const float *x = w + g * SPLASH_QGROUP;
        float lo = x[0], hi = x[0];
        uint32_t bad = 0; /* any exponent all ones: inf or NaN (comparisons would skip a NaN) */
        for (int j = 0; j < SPLASH_QGROUP; j++) {
            uint32_t u;
            memcpy(&u, &x[j], 4);
            bad |= (u & 0x7f800000u) == 0x7f800000u;
            lo = x[j] < lo ? x[j] : lo;
            hi = x[j] > hi ? x[j] : hi;
        }
        if (bad) return -1;
        uint16_t bh = splash_bf16_round_down(lo);
        float b = splash_bf16_to_f32(bh);
        float span = (hi - b) / (float)levels;
        if (!isfinite(span)) return -1;
        uint16_t sh = span > 0 ? splash_bf16_round_up(span) : 0;
        float s = splash_bf16_to_f32(sh);
        float inv = s > 0 ? 1.0f / s : 0.0f;
        uint8_t q[SPLASH_QGROUP];
        /* nearest code: (x - b) / s lies in [0, levels] up to float rounding, so
         * adding 0.5 and truncating rounds it (ties up; either neighbour of a tie
         * is within s/2); the clamp absorbs the rounding at both ends */
        for (int j = 0; j < SPLASH_QGROUP; j++) {
            int r = (int)((x[j] - b) * inv + 0.5f);
            q[j] = (uint8_t)(r < 0 ? 0 : r > levels ? levels : r);
        }
        scales[g] = sh;
        biases[g] = bh;
        if (t == SPLASH_Q4) {
            uint8_t *c = codes + g * (SPLASH_QGROUP / 2);
            for (int j = 0; j < SPLASH_QGROUP / 2; j++) c[j] = (uint8_t)(q[2 * j] | (q[2 * j + 1] << 4));
        } else {
            memcpy(codes + g * SPLASH_QGROUP, q, SPLASH_QGROUP);
        }
    }
    return 0;
}

int splash_quantize_rows(splash_dtype t, const float *w, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                         uint8_t *out, int64_t *bad_row) {
    splash_qlayout l = splash_matrix_layout(t, rows, cols);
    size_t row_codes = (size_t)(t == SPLASH_Q4 ? cols / 2 : cols);
    size_t groups = (size_t)(cols / SPLASH_QGROUP);
    for (int64_t r = r0; r < r1; r++) {
        uint16_t *s = (uint16_t *)(out + l.scales_offset) + (size_t)r * groups;
        uint16_t *b = (uint16_t *)(out + l.biases_offset) + (size_t)r * groups;
        if (splash_quantize_row(t, w + (size_t)(r - r0) * (size_t)cols, cols, out + l.q_offset + (size_t)r * row_codes,
                                s, b) != 0) {
            if (bad_row) *bad_row = r;
            return -1;
        }
    }
    return 0;
}
