/* safetensors.h - read-only access to a Hugging Face checkpoint's tensors.
 *
 * A checkpoint is one or more *.safetensors files, optionally with an index
 * (model.safetensors.index.json, whose weight_map says which file holds each
 * tensor).  Every file is memory-mapped; nothing is copied, so a 50 GB
 * checkpoint costs address space, not memory.  Each file is checked in full
 * when opened: the 8-byte header length and the JSON header lie inside the
 * file, every tensor's dtype is known, its byte range matches its shape and
 * lies inside the file.  An error names the file (and tensor), so a
 * truncated download says which shard to fetch again.
 *
 * File format: u64 little-endian N, N bytes of JSON
 *   {"name": {"dtype": "BF16", "shape": [r, c], "data_offsets": [begin, end]},
 *    "__metadata__": {...}}
 * then the data section; offsets are relative to its start.
 */
#ifndef SPLASH_SAFETENSORS_H
#define SPLASH_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef enum splash_st_dtype {
    SPLASH_ST_BOOL,
    SPLASH_ST_U8,
    SPLASH_ST_I8,
    SPLASH_ST_U16,
    SPLASH_ST_I16,
    SPLASH_ST_F16,
    SPLASH_ST_BF16,
    SPLASH_ST_U32, /* MLX packs quantised codes into U32 */
    SPLASH_ST_I32,
    SPLASH_ST_F32,
    SPLASH_ST_U64,
    SPLASH_ST_I64,
    SPLASH_ST_F64,
    SPLASH_ST_F8_E4M3,
    SPLASH_ST_F8_E5M2,
    SPLASH_ST_DTYPE_COUNT,
} splash_st_dtype;

#define SPLASH_ST_MAX_DIMS 8

typedef struct splash_st_tensor {
    const char *name;
    const char *file; /* path of the file that holds it */
    splash_st_dtype dtype;
    int ndim;
    int64_t shape[SPLASH_ST_MAX_DIMS];
    const uint8_t *data; /* inside the map; not necessarily aligned */
    size_t bytes;
} splash_st_tensor;

typedef struct splash_st splash_st;

/* Opens a directory (index if present, else every *.safetensors in it,
 * sorted) or a single .safetensors file.  A tensor name found in two files,
 * or listed in the index but absent from its file, is an error. */
int splash_st_open(const char *path, splash_st **out, splash_error *err);
void splash_st_close(splash_st *st);

size_t splash_st_count(const splash_st *st);
const splash_st_tensor *splash_st_at(const splash_st *st, size_t i);
/* NULL when absent. */
const splash_st_tensor *splash_st_find(const splash_st *st, const char *name);
/* Number of files opened and the path of the i-th. */
size_t splash_st_file_count(const splash_st *st);
const char *splash_st_file_path(const splash_st *st, size_t i);

const char *splash_st_dtype_name(splash_st_dtype d);
size_t splash_st_dtype_size(splash_st_dtype d);
int64_t splash_st_numel(const splash_st_tensor *t);
/* Is the dtype a float type splash_st_read_f32 converts (F16, BF16, F32, F64)? */
int splash_st_is_float(splash_st_dtype d);

/* Converts elements [first, first + n) of a float tensor to f32.  Returns 0,
 * or -1 if the dtype is not a float type or the range is outside. */
int splash_st_read_f32(const splash_st_tensor *t, size_t first, size_t n, float *out);

/* "[a, b, c]" into buf. */
const char *splash_st_shape_str(int ndim, const int64_t *shape, char *buf, size_t size);

#endif
