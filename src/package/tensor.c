/* tensor.c - dtype names, byte layouts and row dequantisation of the
 * tensors a package stores (the encodings are described in tensor.h and
 * docs/package-format.md).
 *
 * Plain dtypes (f32, f16, bf16) are stored densely: a stacked [E, rows, cols]
 * tensor is simply row-major with no padding between matrices.  Quantised
 * matrices are padded to 64 bytes per part (codes, scales, biases), so a stack
 * is E such padded blobs back to back and every part of every expert starts
 * 64-byte aligned.  splash_matrix_layout() is the one place that says so.
 */
#include "package/tensor.h"

#include <math.h>
#include <string.h>

static const char *const dtype_names[SPLASH_DTYPE_COUNT] = {"f32", "f16", "bf16", "q8", "q4"};

const char *splash_dtype_name(splash_dtype t) {
    return (unsigned)t < SPLASH_DTYPE_COUNT ? dtype_names[t] : "?";
}

int splash_dtype_parse(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < SPLASH_DTYPE_COUNT; i++)
        if (!strcmp(name, dtype_names[i])) return i;
    return -1;
}

/* ---- half precision ------------------------------------------------------ */

float splash_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ffu;
    union { uint32_t u; float f; } v;
    if (exp == 0x1f) {
        v.u = sign | 0x7f800000u | (man << 13); /* inf / NaN (payload kept) */
    } else if (exp) {
        v.u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man) { /* subnormal: man * 2^-24 exactly */
        v.f = (float)man * 0x1p-24f;
        v.u |= sign;
    } else {
        v.u = sign;
    }
    return v.f;
}

uint16_t splash_f32_to_f16(float f) { /* round to nearest even */
    union { float f; uint32_t u; } v = {f};
    uint16_t sign = (uint16_t)((v.u >> 16) & 0x8000u);
    uint32_t a = v.u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x1ffu); /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {                       /* below the smallest normal 2^-14 */
        /* subnormal: value / 2^-24, rounded half to even (float arithmetic is exact here) */
        float x = fabsf(f) * 0x1p24f;
        float r = nearbyintf(x); /* default rounding mode: nearest even */
        return sign | (uint16_t)r;
    }
    uint32_t rounding = 0xfffu + ((a >> 13) & 1u);
    a += rounding;
    return sign | (uint16_t)(((a >> 23) - 112) << 10 | ((a >> 13) & 0x3ffu));
}

/* ---- layouts ------------------------------------------------------------- */

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static size_t elem_size(splash_dtype t) {
    switch (t) {
    case SPLASH_F32: return 4;
    case SPLASH_F16:
    case SPLASH_BF16: return 2;
    default: return 0;
    }
}

splash_qlayout splash_matrix_layout(splash_dtype t, int64_t rows, int64_t cols) {
    splash_qlayout l = {0, 0, 0, 0};
    if (rows < 0 || cols < 0) return l;
    if (t == SPLASH_Q4 || t == SPLASH_Q8) {
        size_t codes = (size_t)rows * (size_t)(t == SPLASH_Q4 ? cols / 2 : cols);
        size_t sb = (size_t)rows * (size_t)(cols / SPLASH_QGROUP) * 2;
        l.q_offset = 0;
        l.scales_offset = align64(codes);
        l.biases_offset = l.scales_offset + align64(sb);
        l.bytes = l.biases_offset + align64(sb);
        return l;
    }
    l.bytes = (size_t)rows * (size_t)cols * elem_size(t);
    return l;
}

static void matrix_dims(int ndim, const int64_t *shape, int64_t *rows, int64_t *cols, int64_t *count) {
    int64_t r = 1, c = 1, n = 1;
    if (ndim >= 1) c = shape[ndim - 1];
    if (ndim >= 2) r = shape[ndim - 2];
    for (int i = 0; i + 2 < ndim; i++) n *= shape[i];
    *rows = r, *cols = c, *count = n;
}

size_t splash_tensor_bytes(splash_dtype t, int ndim, const int64_t *shape) {
    int64_t rows, cols, count;
    matrix_dims(ndim, shape, &rows, &cols, &count);
    return (size_t)count * splash_matrix_layout(t, rows, cols).bytes;
}

void splash_tensor_matrix_dims(const splash_tensor *t, int64_t *rows, int64_t *cols, int64_t *count) {
    matrix_dims(t->ndim, t->shape, rows, cols, count);
}

splash_tensor splash_tensor_slice(const splash_tensor *t, int64_t k) {
    int64_t rows, cols, count;
    matrix_dims(t->ndim, t->shape, &rows, &cols, &count);
    splash_qlayout l = splash_matrix_layout(t->dtype, rows, cols);
    splash_tensor s = *t;
    s.ndim = 2;
    memset(s.shape, 0, sizeof s.shape);
    s.shape[0] = rows;
    s.shape[1] = cols;
    s.data = t->data + (size_t)k * l.bytes;
    s.bytes = l.bytes;
    return s;
}

void splash_tensor_row_f32(const splash_tensor *t, int64_t r, float *out) {
    int64_t rows, cols, count;
    matrix_dims(t->ndim, t->shape, &rows, &cols, &count);
    (void)rows;
    switch (t->dtype) {
    case SPLASH_F32: {
        memcpy(out, t->data + (size_t)r * (size_t)cols * 4, (size_t)cols * 4);
        return;
    }
    case SPLASH_BF16: {
        const uint8_t *p = t->data + (size_t)r * (size_t)cols * 2;
        for (int64_t c = 0; c < cols; c++) {
            uint16_t h;
            memcpy(&h, p + 2 * c, 2);
            out[c] = splash_bf16_to_f32(h);
        }
        return;
    }
    case SPLASH_F16: {
        const uint8_t *p = t->data + (size_t)r * (size_t)cols * 2;
        for (int64_t c = 0; c < cols; c++) {
            uint16_t h;
            memcpy(&h, p + 2 * c, 2);
            out[c] = splash_f16_to_f32(h);
        }
        return;
    }
    case SPLASH_Q8:
    case SPLASH_Q4: {
        splash_qlayout l = splash_matrix_layout(t->dtype, rows, cols);
        int64_t groups = cols / SPLASH_QGROUP;
        size_t row_codes = (size_t)(t->dtype == SPLASH_Q4 ? cols / 2 : cols);
        const uint8_t *q = t->data + l.q_offset + (size_t)r * row_codes;
        const uint8_t *sp = t->data + l.scales_offset + (size_t)r * (size_t)groups * 2;
        const uint8_t *bp = t->data + l.biases_offset + (size_t)r * (size_t)groups * 2;
        for (int64_t g = 0; g < groups; g++) {
            uint16_t sh, bh;
            memcpy(&sh, sp + 2 * g, 2);
            memcpy(&bh, bp + 2 * g, 2);
            float s = splash_bf16_to_f32(sh), b = splash_bf16_to_f32(bh);
            float *o = out + g * SPLASH_QGROUP;
            if (t->dtype == SPLASH_Q8) {
                const uint8_t *qg = q + g * SPLASH_QGROUP;
                for (int j = 0; j < SPLASH_QGROUP; j++) o[j] = s * (float)qg[j] + b;
            } else {
                const uint8_t *qg = q + g * (SPLASH_QGROUP / 2);
                for (int j = 0; j < SPLASH_QGROUP / 2; j++) {
                    o[2 * j] = s * (float)(qg[j] & 15) + b;
                    o[2 * j + 1] = s * (float)(qg[j] >> 4) + b;
                }
            }
        }
        return;
    }
    default:
        memset(out, 0, (size_t)cols * sizeof *out);
    }
}
