/* packer.c - checkpoint -> Splash package (see packer.h and
 * docs/package-format.md).
 *
 * Three phases, so that bad input never leaves anything behind:
 *
 *   1. plan:  read config.json, open the safetensors, and build one `spec`
 *             per canonical tensor: where each of its matrices comes from in
 *             the checkpoint (`slice`), its canonical shape, and the dtype it
 *             will be stored as.  Every lookup and shape check happens here.
 *   2. write: stream each file of the package into PKG.tmp-XXXXXX, hashing as
 *             it goes; quantisation runs on the worker pool, in row blocks.
 *   3. commit: manifest.json, fsync, rename into place.
 *
 * A slice is "matrix k of the canonical tensor starts at element `elem` of
 * checkpoint tensor w, rows contiguous": that one idea covers plain 2-D
 * tensors, per-expert tensors (one w per expert), fused gate_up_proj (gate
 * rows then up rows of each expert) and MLX's stacked switch_mlp, in float or
 * MLX-quantised form (codes + scales + biases at the same element offsets).
 */
#include "package/packer.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/fs.h"
#include "base/gzip.h"
#include "base/json.h"
#include "base/mem.h"
#include "base/sha256.h"
#include "base/threads.h"
#include "package/package.h"
#include "package/quantize.h"
#include "package/safetensors.h"
#include "text/chat_template.h"

/* ---- plan types ----------------------------------------------------------- */

enum kind {
    K_MATRIX, /* projection / embedding / lm_head: --weights decides */
    K_GATE,   /* router, shared-expert gate: bf16, or MLX q8 kept */
    K_NORM1,  /* zero-centred norm: f32, stored 1 + w (MLX: already) */
    K_VEC,    /* f32 as is: A_log, dt_bias, GDN norm, conv */
    K_MTP,    /* verbatim */
};

typedef struct slice {
    const splash_st_tensor *w, *s, *b; /* s, b: MLX scales / biases, else NULL */
    int bits;                          /* 0: float source; 4 or 8: MLX codes */
    int64_t elem;                      /* logical element offset of row 0 in w */
} slice;

typedef struct spec {
    char name[96];
    int kind;
    int file; /* index into packer.files */
    int ndim;
    int64_t shape[SPLASH_MAX_DIMS];
    int64_t rows, cols, count;
    slice *slices; /* count */
    splash_dtype dtype;
    int copy_codes; /* MLX codes already in the stored format */
    uint64_t offset; /* in its file, set while writing */
} spec;

typedef struct model_cfg {
    int moe;
    int64_t hidden, layers, vocab, max_pos;
    int64_t heads, kv_heads, head_dim, rotary_dim;
    int64_t kh, vh, dk, dv, conv_k;
    int64_t inter;
    int64_t experts, top_k, expert_inter, shared_inter;
    int norm_topk, tie;
    double rms_eps, rope_theta;
    int *full; /* per layer: 1 = full attention */
} model_cfg;

/* A DFlash draft packed beside the target: v1 (z-lab DFlashDraftModel) or
 * DFlash 2 (DFlash2DraftModel: v1 plus the per-layer dynamic convolutions,
 * the candidate selector and the logit transforms). */
#define DRAFT_MAX_TAPS 64
typedef struct draft_cfg {
    int v2; /* DFlash2DraftModel */
    int64_t hidden, layers, heads, kv_heads, head_dim, inter;
    int64_t block_size, mask_token_id, sliding_window;
    int64_t n_taps, taps[DRAFT_MAX_TAPS];
    double rms_eps, rope_theta;
    const json_value *rms_eps_v, *rope_theta_v; /* the config's lexemes, when present */
    int *sliding, *causal; /* per layer */
    /* v2 only */
    int64_t conv_kernel, conv_group, sel_rank, sel_top_k;
    double out_mult, softcap, embed_scale;    /* 1 / 0 (none) / 1 when absent */
    const json_value *out_mult_v, *softcap_v, *embed_scale_v; /* lexemes, when present */
} draft_cfg;

typedef struct out_file {
    char *rel;
    char *path;
    int fd;
    uint64_t pos;
    splash_sha256 *hash;
    uint8_t *buf;
    size_t n;
    char hex[65];
} out_file;

typedef struct packer {
    const splash_pack_options *opt;
    splash_pack_stats *stats;
    json_value *config;
    const json_value *text; /* text_config or config */
    const char *config_path;
    model_cfg cfg;
    splash_st *st;
    uint8_t *used;
    const char *prefix;
    const char *expert_form;
    int mlx_quant, mlx_bits, mlx_norms;
    spec *specs;
    size_t n_specs, cap_specs;
    char **files; /* package-relative paths of the .bin files, in write order */
    size_t n_files;
    splash_pool *pool;
    char *tmp;
    /* manifest records of written files */
    json_value *file_list;
    const char *from;       /* the checkpoint being planned (messages) */
    /* the draft (--draft) */
    json_value *dconfig;
    char *dconfig_path;
    draft_cfg dc;
    splash_st *dst;
    uint8_t *dused;
} packer;

/* ---- small helpers --------------------------------------------------------- */

static const char *shape_str(int ndim, const int64_t *shape, char *buf, size_t size) {
    return splash_st_shape_str(ndim, shape, buf, size);
}

static const splash_st_tensor *lookup(packer *p, const char *name) {
    const splash_st_tensor *t = splash_st_find(p->st, name);
    if (t) p->used[t - splash_st_at(p->st, 0)] = 1;
    return t;
}

static int starts_with(const char *s, const char *prefix) { return !strncmp(s, prefix, strlen(prefix)); }
static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static int add_file(packer *p, const char *rel) {
    p->files = xrealloc(p->files, (p->n_files + 1) * sizeof *p->files);
    p->files[p->n_files] = xstrdup(rel);
    return (int)p->n_files++;
}

static spec *add_spec(packer *p, int file, const char *name, int kind, int ndim, const int64_t *shape) {
    if (p->n_specs == p->cap_specs) {
        p->cap_specs = p->cap_specs ? 2 * p->cap_specs : 64;
        p->specs = xrealloc(p->specs, p->cap_specs * sizeof *p->specs);
    }
    spec *s = &p->specs[p->n_specs++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->kind = kind;
    s->file = file;
    s->ndim = ndim;
    for (int i = 0; i < ndim; i++) s->shape[i] = shape[i];
    s->cols = ndim >= 1 ? shape[ndim - 1] : 1;
    s->rows = ndim >= 2 ? shape[ndim - 2] : 1;
    s->count = 1;
    for (int i = 0; i + 2 < ndim; i++) s->count *= shape[i];
    s->slices = xcalloc((size_t)s->count, sizeof *s->slices);
    return s;
}

/* ---- config ---------------------------------------------------------------- */

static const json_value *cfg_get(packer *p, const char *key) {
    const json_value *v = json_get(p->text, key);
    if (!v && p->text != p->config) v = json_get(p->config, key);
    return v && v->type != JSON_NULL ? v : NULL;
}

static int cfg_int(packer *p, const char *key, int64_t dflt, int64_t *out, splash_error *err) {
    const json_value *v = cfg_get(p, key);
    if (!v) {
        *out = dflt;
        return SPLASH_OK;
    }
    if (json_int64(v, out) || *out < 0)
        return splash_fail(err, SPLASH_E_FORMAT, "%s: \"%s\" must be a non-negative integer", p->config_path, key);
    return SPLASH_OK;
}

/* A rope parameter: rope_parameters.key, rope_scaling.key, or key itself. */
static const json_value *rope_get(packer *p, const char *key) {
    const char *holders[] = {"rope_parameters", "rope_scaling"};
    for (int i = 0; i < 2; i++) {
        const json_value *h = cfg_get(p, holders[i]);
        const json_value *v = h && h->type == JSON_OBJECT ? json_get(h, key) : NULL;
        if (v && v->type != JSON_NULL) return v;
    }
    return cfg_get(p, key);
}

static int known_arch(const char *s, int *moe) {
    static const char *dense[] = {"Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration", "qwen3_5", "qwen3_5_text"};
    static const char *sparse[] = {"Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe",
                                   "qwen3_5_moe_text"};
    for (int i = 0; i < 4; i++) {
        if (!strcmp(s, dense[i])) return *moe = 0, 1;
        if (!strcmp(s, sparse[i])) return *moe = 1, 1;
    }
    return 0;
}

static int read_config(packer *p, splash_error *err) {
    char *text = NULL;
    size_t len = 0;
    int rc = splash_read_file(p->config_path, &text, &len, err);
    if (rc) return rc; /* "<from>/config.json: <reason>" */
    char jerr[256];
    p->config = json_parse(text, len, 64, jerr, sizeof jerr);
    free(text);
    if (!p->config) return splash_fail(err, SPLASH_E_FORMAT, "%s: not JSON: %s", p->config_path, jerr);
    if (p->config->type != JSON_OBJECT) return splash_fail(err, SPLASH_E_FORMAT, "%s: not a JSON object", p->config_path);
    const json_value *tc = json_get(p->config, "text_config");
    p->text = tc && tc->type == JSON_OBJECT ? tc : p->config;

    /* architecture: architectures[] first, else model_type (top, then text) */
    model_cfg *c = &p->cfg;
    int found = 0, moe = 0;
    const json_value *archs = json_get(p->config, "architectures");
    char seen[256] = "";
    if (archs && archs->type == JSON_ARRAY) {
        for (size_t i = 0; i < archs->count && !found; i++) {
            const char *a = json_string(archs->items[i]);
            if (!a) continue;
            found = known_arch(a, &moe);
            if (strlen(seen) + strlen(a) + 4 < sizeof seen) strcat(strcat(seen, seen[0] ? ", " : ""), a);
        }
    }
    const char *mt = json_get_string(p->config, "model_type", NULL);
    const char *tmt = json_get_string(p->text, "model_type", NULL);
    if (!found && !(archs && archs->type == JSON_ARRAY && archs->count)) {
        if (mt) found = known_arch(mt, &moe);
        if (!found && tmt) found = known_arch(tmt, &moe);
    }
    if (!found)
        return splash_fail(err, SPLASH_E_UNSUPPORTED,
                           "%s: unknown architecture (architectures [%s], model_type %s): splash packs Qwen3.5 models "
                           "(Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration, Qwen3_5MoeForCausalLM, "
                           "Qwen3_5MoeForConditionalGeneration)",
                           p->config_path, seen, mt ? mt : (tmt ? tmt : "missing"));
    c->moe = moe;

    /* dimensions, with the transformers 5.17 defaults where a key is absent */
    struct {
        const char *key;
        int64_t dflt;
        int64_t *out;
    } ints[] = {
        {"hidden_size", moe ? 2048 : 4096, &c->hidden},
        {"num_hidden_layers", moe ? 40 : 32, &c->layers},
        {"vocab_size", 248320, &c->vocab},
        {"max_position_embeddings", 32768, &c->max_pos},
        {"num_attention_heads", 16, &c->heads},
        {"num_key_value_heads", moe ? 2 : 4, &c->kv_heads},
        {"head_dim", 256, &c->head_dim},
        {"linear_conv_kernel_dim", 4, &c->conv_k},
        {"linear_key_head_dim", 128, &c->dk},
        {"linear_value_head_dim", 128, &c->dv},
        {"linear_num_key_heads", 16, &c->kh},
        {"linear_num_value_heads", 32, &c->vh},
        {"intermediate_size", 12288, &c->inter},
        {"num_experts", 256, &c->experts},
        {"num_experts_per_tok", 8, &c->top_k},
        {"moe_intermediate_size", 512, &c->expert_inter},
        {"shared_expert_intermediate_size", 512, &c->shared_inter},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if ((rc = cfg_int(p, ints[i].key, ints[i].dflt, ints[i].out, err))) return rc;
    const json_value *v = cfg_get(p, "rms_norm_eps");
    c->rms_eps = v && v->type == JSON_NUMBER ? v->num : 1e-6;
    c->norm_topk = 1; /* transformers 5.17 always renormalises the top-k */
    v = cfg_get(p, "norm_topk_prob");
    if (v && json_is_bool(v)) c->norm_topk = v->type == JSON_TRUE;
    v = json_get(p->text, "tie_word_embeddings");
    if (!v || !json_is_bool(v)) v = json_get(p->config, "tie_word_embeddings");
    c->tie = v && v->type == JSON_TRUE;

    const json_value *rt = NULL;
    const char *holders[] = {"rope_parameters", "rope_scaling"};
    for (int i = 0; i < 2 && !rt; i++) {
        const json_value *h = cfg_get(p, holders[i]);
        if (h && h->type == JSON_OBJECT && !(rt = json_get(h, "rope_type"))) rt = json_get(h, "type");
    }
    if (rt && json_string(rt) && strcmp(json_string(rt), "default"))
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: rope_type \"%s\" is not supported (only \"default\")",
                           p->config_path, json_string(rt));
    v = rope_get(p, "rope_theta");
    c->rope_theta = v && v->type == JSON_NUMBER ? v->num : 10000.0;
    v = rope_get(p, "partial_rotary_factor");
    double prf = v && v->type == JSON_NUMBER ? v->num : 0.25;
    c->rotary_dim = (int64_t)((double)c->head_dim * prf);

    const char *bad = NULL;
    if (!c->hidden || !c->layers || !c->vocab) bad = "hidden_size, num_hidden_layers and vocab_size must be positive";
    else if (!c->heads || !c->kv_heads || c->heads % c->kv_heads) bad = "num_attention_heads must be a positive multiple of num_key_value_heads";
    else if (!c->head_dim || c->rotary_dim <= 0 || c->rotary_dim > c->head_dim || c->rotary_dim % 2) bad = "head_dim * partial_rotary_factor must be an even number of dimensions within head_dim";
    else if (!c->kh || !c->vh || c->vh % c->kh) bad = "linear_num_value_heads must be a positive multiple of linear_num_key_heads";
    else if (!c->dk || !c->dv || !c->conv_k) bad = "linear key/value head dims and conv kernel must be positive";
    else if (!moe && !c->inter) bad = "intermediate_size must be positive";
    else if (moe && (!c->experts || !c->top_k || c->top_k > c->experts || !c->expert_inter)) bad = "MoE sizes (num_experts, num_experts_per_tok, moe_intermediate_size) are invalid";
    if (bad) return splash_fail(err, SPLASH_E_FORMAT, "%s: %s", p->config_path, bad);

    c->full = xcalloc((size_t)c->layers, sizeof *c->full);
    const json_value *lt = cfg_get(p, "layer_types");
    if (lt) {
        if (lt->type != JSON_ARRAY || (int64_t)lt->count != c->layers)
            return splash_fail(err, SPLASH_E_FORMAT, "%s: layer_types must list %" PRId64 " layers", p->config_path, c->layers);
        for (int64_t i = 0; i < c->layers; i++) {
            const char *s = json_string(lt->items[i]);
            if (s && !strcmp(s, "full_attention")) c->full[i] = 1;
            else if (!s || strcmp(s, "linear_attention"))
                return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: layer_types[%" PRId64 "] is %s%s%s (expected "
                                   "\"linear_attention\" or \"full_attention\")", p->config_path, i, s ? "\"" : "",
                                   s ? s : "not a string", s ? "\"" : "");
        }
    } else {
        int64_t interval;
        if ((rc = cfg_int(p, "full_attention_interval", 4, &interval, err))) return rc;
        if (!interval) return splash_fail(err, SPLASH_E_FORMAT, "%s: full_attention_interval is 0", p->config_path);
        for (int64_t i = 0; i < c->layers; i++) c->full[i] = (i + 1) % interval == 0;
    }

    /* MLX quantisation: {"group_size": 64, "bits": 4, per-path overrides...} */
    const json_value *q = json_get(p->config, "quantization");
    if (!q) q = json_get(p->text, "quantization");
    if (q && q->type == JSON_OBJECT) {
        int64_t gs = json_get_int(q, "group_size", 64), bits = json_get_int(q, "bits", 4);
        const char *mode = json_get_string(q, "mode", "affine");
        if (gs != SPLASH_QGROUP || (bits != 4 && bits != 8) || strcmp(mode, "affine"))
            return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: MLX quantization %s %" PRId64 "-bit group %" PRId64
                               " is not supported (affine 4- or 8-bit, group 64)", p->config_path, mode, bits, gs);
        p->mlx_quant = 1;
        p->mlx_bits = (int)bits;
    }
    return SPLASH_OK;
}

/* ---- checkpoint lookups with shape checks ----------------------------------- */

static int missing(packer *p, const char *hf, const char *canon, splash_error *err) {
    return splash_fail(err, SPLASH_E_NOTFOUND, "%s: tensor %s (for %s) is not in the checkpoint", p->from, hf, canon);
}

static int misshapen(const splash_st_tensor *t, const char *canon, int ndim, const int64_t *want, const char *what,
                     splash_error *err) {
    char a[128], b[128];
    return splash_fail(err, SPLASH_E_MISMATCH, "%s: tensor %s (for %s) is %s %s, expected %s%s", t->file, t->name, canon,
                       splash_st_dtype_name(t->dtype), shape_str(t->ndim, t->shape, a, sizeof a),
                       shape_str(ndim, want, b, sizeof b), what);
}

static int same_shape(const splash_st_tensor *t, int ndim, const int64_t *shape) {
    if (t->ndim != ndim) return 0;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != shape[i]) return 0;
    return 1;
}

/* Finds checkpoint tensor `hf` holding logical shape [.., rows, cols] (float,
 * or MLX codes + scales + biases) and fills out->w/s/b/bits (elem = 0). */
static int get_matrix(packer *p, const char *hf, const char *canon, int ndim, const int64_t *shape, slice *out,
                      splash_error *err) {
    memset(out, 0, sizeof *out);
    const splash_st_tensor *t = lookup(p, hf);
    if (!t) return missing(p, hf, canon, err);
    if (splash_st_is_float(t->dtype)) {
        if (!same_shape(t, ndim, shape)) return misshapen(t, canon, ndim, shape, "", err);
        out->w = t;
        return SPLASH_OK;
    }
    if (t->dtype != SPLASH_ST_U32 || !ends_with(hf, ".weight"))
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: tensor %s (for %s) has dtype %s (expected a float type, or "
                           "MLX U32 codes with .scales and .biases)", t->file, hf, canon, splash_st_dtype_name(t->dtype));
    int64_t cols = shape[ndim - 1];
    int64_t packed[SPLASH_MAX_DIMS], grouped[SPLASH_MAX_DIMS];
    memcpy(packed, shape, (size_t)ndim * sizeof *shape);
    memcpy(grouped, shape, (size_t)ndim * sizeof *shape);
    int bits = 0;
    if (t->ndim == ndim && cols % SPLASH_QGROUP == 0 && (t->shape[ndim - 1] * 32) % cols == 0)
        bits = (int)(t->shape[ndim - 1] * 32 / cols);
    packed[ndim - 1] = bits ? t->shape[ndim - 1] : cols / 8;
    grouped[ndim - 1] = cols / SPLASH_QGROUP;
    if (!bits || !same_shape(t, ndim, packed)) {
        char b[128];
        char what[200];
        snprintf(what, sizeof what, " (U32 codes of logical shape %s, group %d)", shape_str(ndim, shape, b, sizeof b),
                 SPLASH_QGROUP);
        return misshapen(t, canon, ndim, packed, what, err);
    }
    if (bits != 4 && bits != 8)
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: tensor %s (for %s) is MLX %d-bit: only 4- and 8-bit pack",
                           t->file, hf, canon, bits);
    char base[200];
    snprintf(base, sizeof base, "%.*s", (int)(strlen(hf) - strlen("weight")), hf);
    const char *sfx[2] = {"scales", "biases"};
    const splash_st_tensor *sb[2];
    for (int i = 0; i < 2; i++) {
        char name[220];
        snprintf(name, sizeof name, "%s%s", base, sfx[i]);
        sb[i] = lookup(p, name);
        if (!sb[i]) return missing(p, name, canon, err);
        if (!splash_st_is_float(sb[i]->dtype) || !same_shape(sb[i], ndim, grouped))
            return misshapen(sb[i], canon, ndim, grouped, " (float, one per group of 64: MLX group size must be 64)", err);
    }
    out->w = t;
    out->s = sb[0];
    out->b = sb[1];
    out->bits = bits;
    return SPLASH_OK;
}

static int get_vector(packer *p, const char *hf, const char *canon, int64_t n, slice *out, splash_error *err) {
    memset(out, 0, sizeof *out);
    const splash_st_tensor *t = lookup(p, hf);
    if (!t) return missing(p, hf, canon, err);
    if (!splash_st_is_float(t->dtype) || !same_shape(t, 1, &n)) return misshapen(t, canon, 1, &n, " (float)", err);
    out->w = t;
    return SPLASH_OK;
}

/* ---- the plan --------------------------------------------------------------- */

static void hf_name(packer *p, char *buf, size_t size, int64_t layer, const char *suffix) {
    if (layer >= 0) snprintf(buf, size, "%slayers.%" PRId64 ".%s", p->prefix, layer, suffix);
    else snprintf(buf, size, "%s%s", p->prefix, suffix);
}

static splash_dtype choose_dtype(packer *p, spec *s) {
    splash_dtype w = p->opt->weights;
    const slice *sl = &s->slices[0];
    switch (s->kind) {
    case K_NORM1:
    case K_VEC: return SPLASH_F32;
    case K_MTP:
        return sl->w->dtype == SPLASH_ST_F32 ? SPLASH_F32 : sl->w->dtype == SPLASH_ST_F16 ? SPLASH_F16 : SPLASH_BF16;
    case K_GATE:
        if (w != SPLASH_BF16 && sl->bits == 8) return SPLASH_Q8; /* MLX q8 router: kept */
        return SPLASH_BF16;
    default:
        if (w == SPLASH_BF16 || s->cols % SPLASH_QGROUP) return SPLASH_BF16;
        return w;
    }
}

/* One canonical matrix tensor from one checkpoint tensor. */
static int plan_matrix(packer *p, int file, const char *canon, int kind, int64_t layer, const char *suffix,
                       int64_t rows, int64_t cols, splash_error *err) {
    char hf[256];
    hf_name(p, hf, sizeof hf, layer, suffix);
    int64_t shape[2] = {rows, cols};
    spec *s = add_spec(p, file, canon, kind, 2, shape);
    return get_matrix(p, hf, canon, 2, shape, &s->slices[0], err);
}

static int plan_vector(packer *p, int file, const char *canon, int kind, int64_t layer, const char *suffix, int64_t n,
                       splash_error *err) {
    char hf[256];
    hf_name(p, hf, sizeof hf, layer, suffix);
    spec *s = add_spec(p, file, canon, kind, 1, &n);
    return get_vector(p, hf, canon, n, &s->slices[0], err);
}

static int plan_conv(packer *p, int file, const char *canon, int64_t layer, int64_t channels, int64_t k,
                     splash_error *err) {
    char hf[256];
    hf_name(p, hf, sizeof hf, layer, "linear_attn.conv1d.weight");
    int64_t shape[2] = {channels, k};
    spec *s = add_spec(p, file, canon, K_VEC, 2, shape);
    const splash_st_tensor *t = lookup(p, hf);
    if (!t) return missing(p, hf, canon, err);
    /* [C,1,K] (transformers), [C,K,1] (MLX) and [C,K] have the same memory layout */
    int64_t hf_shape[3] = {channels, 1, k}, mlx_shape[3] = {channels, k, 1};
    if (!splash_st_is_float(t->dtype) ||
        !(same_shape(t, 3, hf_shape) || same_shape(t, 3, mlx_shape) || same_shape(t, 2, shape)))
        return misshapen(t, canon, 3, hf_shape, " (or MLX's [C, K, 1])", err);
    s->slices[0].w = t;
    return SPLASH_OK;
}

static int plan_experts(packer *p, int file, int64_t L, splash_error *err) {
    const model_cfg *c = &p->cfg;
    int64_t E = c->experts, I = c->expert_inter, H = c->hidden;
    char name[96], hf[256];
    int64_t gshape[3] = {E, I, H}, dshape[3] = {E, H, I};
    const char *which[3] = {"gate", "up", "down"};
    spec *s[3];
    for (int w = 0; w < 3; w++) {
        snprintf(name, sizeof name, "layers.%" PRId64 ".moe.experts_%s", L, which[w]);
        add_spec(p, file, name, K_MATRIX, 3, w == 2 ? dshape : gshape);
    }
    for (int w = 0; w < 3; w++) s[w] = &p->specs[p->n_specs - 3 + (size_t)w]; /* after the reallocs */
    char per[256], fused[256], mlx[256];
    hf_name(p, per, sizeof per, L, "mlp.experts.0.gate_proj.weight");
    hf_name(p, fused, sizeof fused, L, "mlp.experts.gate_up_proj");
    hf_name(p, mlx, sizeof mlx, L, "mlp.switch_mlp.gate_proj.weight");
    const char *form = splash_st_find(p->st, per) ? "per-expert"
                       : splash_st_find(p->st, fused) ? "fused"
                       : splash_st_find(p->st, mlx) ? "mlx" : NULL;
    if (!form)
        return splash_fail(err, SPLASH_E_NOTFOUND, "%s: layer %" PRId64 " has no MoE experts: none of %s, %s, %s is in the "
                           "checkpoint", p->opt->from, L, per, fused, mlx);
    if (p->expert_form && p->expert_form != form) /* the same literal when the same form */
        return splash_fail(err, SPLASH_E_FORMAT, "%s: layer %" PRId64 " stores its experts %s, earlier layers %s",
                           p->opt->from, L, form, p->expert_form);
    p->expert_form = form;
    int rc;
    if (!strcmp(form, "per-expert")) {
        int64_t g2[2] = {I, H}, d2[2] = {H, I};
        for (int64_t e = 0; e < E; e++)
            for (int w = 0; w < 3; w++) {
                char sfx[96];
                snprintf(sfx, sizeof sfx, "mlp.experts.%" PRId64 ".%s_proj.weight", e, which[w]);
                hf_name(p, hf, sizeof hf, L, sfx);
                if ((rc = get_matrix(p, hf, s[w]->name, 2, w == 2 ? d2 : g2, &s[w]->slices[e], err))) return rc;
            }
    } else if (!strcmp(form, "fused")) {
        int64_t gu[3] = {E, 2 * I, H};
        slice a, d;
        if ((rc = get_matrix(p, fused, s[0]->name, 3, gu, &a, err))) return rc;
        hf_name(p, hf, sizeof hf, L, "mlp.experts.down_proj");
        if ((rc = get_matrix(p, hf, s[2]->name, 3, dshape, &d, err))) return rc;
        for (int64_t e = 0; e < E; e++) {
            s[0]->slices[e] = a, s[0]->slices[e].elem = e * 2 * I * H;         /* gate rows first */
            s[1]->slices[e] = a, s[1]->slices[e].elem = e * 2 * I * H + I * H; /* then up rows */
            s[2]->slices[e] = d, s[2]->slices[e].elem = e * H * I;
        }
    } else {
        for (int w = 0; w < 3; w++) {
            char sfx[96];
            slice a;
            snprintf(sfx, sizeof sfx, "mlp.switch_mlp.%s_proj.weight", which[w]);
            hf_name(p, hf, sizeof hf, L, sfx);
            if ((rc = get_matrix(p, hf, s[w]->name, 3, w == 2 ? dshape : gshape, &a, err))) return rc;
            for (int64_t e = 0; e < E; e++) s[w]->slices[e] = a, s[w]->slices[e].elem = e * s[w]->rows * s[w]->cols;
        }
    }
    return SPLASH_OK;
}

static int plan_layer(packer *p, int64_t L, splash_error *err) {
    const model_cfg *c = &p->cfg;
    char rel[64], n[96];
    snprintf(rel, sizeof rel, "target/layer-%" PRId64 ".bin", L);
    int f = add_file(p, rel);
    int64_t H = c->hidden;
    int rc = 0;
#define CANON(fmt) (snprintf(n, sizeof n, "layers.%" PRId64 "." fmt, L), n)
    if ((rc = plan_vector(p, f, CANON("input_norm"), K_NORM1, L, "input_layernorm.weight", H, err))) return rc;
    if (c->full[L]) {
        int64_t q = c->heads * c->head_dim, kv = c->kv_heads * c->head_dim;
        if ((rc = plan_matrix(p, f, CANON("attn.q_proj"), K_MATRIX, L, "self_attn.q_proj.weight", 2 * q, H, err)) ||
            (rc = plan_matrix(p, f, CANON("attn.k_proj"), K_MATRIX, L, "self_attn.k_proj.weight", kv, H, err)) ||
            (rc = plan_matrix(p, f, CANON("attn.v_proj"), K_MATRIX, L, "self_attn.v_proj.weight", kv, H, err)) ||
            (rc = plan_matrix(p, f, CANON("attn.o_proj"), K_MATRIX, L, "self_attn.o_proj.weight", H, q, err)) ||
            (rc = plan_vector(p, f, CANON("attn.q_norm"), K_NORM1, L, "self_attn.q_norm.weight", c->head_dim, err)) ||
            (rc = plan_vector(p, f, CANON("attn.k_norm"), K_NORM1, L, "self_attn.k_norm.weight", c->head_dim, err)))
            return rc;
    } else {
        int64_t conv = 2 * c->kh * c->dk + c->vh * c->dv, v = c->vh * c->dv;
        if ((rc = plan_matrix(p, f, CANON("gdn.in_proj_qkv"), K_MATRIX, L, "linear_attn.in_proj_qkv.weight", conv, H, err)) ||
            (rc = plan_matrix(p, f, CANON("gdn.in_proj_z"), K_MATRIX, L, "linear_attn.in_proj_z.weight", v, H, err)) ||
            (rc = plan_matrix(p, f, CANON("gdn.in_proj_b"), K_MATRIX, L, "linear_attn.in_proj_b.weight", c->vh, H, err)) ||
            (rc = plan_matrix(p, f, CANON("gdn.in_proj_a"), K_MATRIX, L, "linear_attn.in_proj_a.weight", c->vh, H, err)) ||
            (rc = plan_conv(p, f, CANON("gdn.conv"), L, conv, c->conv_k, err)) ||
            (rc = plan_vector(p, f, CANON("gdn.A_log"), K_VEC, L, "linear_attn.A_log", c->vh, err)) ||
            (rc = plan_vector(p, f, CANON("gdn.dt_bias"), K_VEC, L, "linear_attn.dt_bias", c->vh, err)) ||
            (rc = plan_vector(p, f, CANON("gdn.norm"), K_VEC, L, "linear_attn.norm.weight", c->dv, err)) ||
            (rc = plan_matrix(p, f, CANON("gdn.out_proj"), K_MATRIX, L, "linear_attn.out_proj.weight", H, v, err)))
            return rc;
    }
    if ((rc = plan_vector(p, f, CANON("post_norm"), K_NORM1, L, "post_attention_layernorm.weight", H, err))) return rc;
    if (!c->moe) {
        int64_t I = c->inter;
        if ((rc = plan_matrix(p, f, CANON("ffn.gate"), K_MATRIX, L, "mlp.gate_proj.weight", I, H, err)) ||
            (rc = plan_matrix(p, f, CANON("ffn.up"), K_MATRIX, L, "mlp.up_proj.weight", I, H, err)) ||
            (rc = plan_matrix(p, f, CANON("ffn.down"), K_MATRIX, L, "mlp.down_proj.weight", H, I, err)))
            return rc;
    } else {
        int64_t Is = c->shared_inter;
        if ((rc = plan_matrix(p, f, CANON("moe.router"), K_GATE, L, "mlp.gate.weight", c->experts, H, err)) ||
            (rc = plan_experts(p, f, L, err)))
            return rc;
        if (Is > 0 &&
            ((rc = plan_matrix(p, f, CANON("moe.shared_gate"), K_MATRIX, L, "mlp.shared_expert.gate_proj.weight", Is, H, err)) ||
             (rc = plan_matrix(p, f, CANON("moe.shared_up"), K_MATRIX, L, "mlp.shared_expert.up_proj.weight", Is, H, err)) ||
             (rc = plan_matrix(p, f, CANON("moe.shared_down"), K_MATRIX, L, "mlp.shared_expert.down_proj.weight", H, Is, err)) ||
             (rc = plan_matrix(p, f, CANON("moe.shared_expert_gate"), K_GATE, L, "mlp.shared_expert_gate.weight", 1, H, err))))
            return rc;
    }
#undef CANON
    return SPLASH_OK;
}

static int is_vision(const char *name) {
    return starts_with(name, "model.visual.") || starts_with(name, "visual.") || starts_with(name, "vision_tower.") ||
           starts_with(name, "model.vision_tower.");
}

/* "mtp." part of a checkpoint name, or NULL. */
static const char *mtp_name(const char *name) {
    static const char *pre[] = {"", "model.", "model.language_model.", "language_model.model.", "language_model."};
    for (size_t i = 0; i < sizeof pre / sizeof pre[0]; i++)
        if (starts_with(name, pre[i]) && starts_with(name + strlen(pre[i]), "mtp.")) return name + strlen(pre[i]);
    return NULL;
}

static int plan_draft(packer *p, splash_error *err);

/* The stored dtype of every planned tensor (--weights and the kind decide). */
static void choose_dtypes(packer *p) {
    for (size_t i = 0; i < p->n_specs; i++) {
        spec *sp = &p->specs[i];
        sp->dtype = choose_dtype(p, sp);
        sp->copy_codes = sp->slices[0].bits && (int)sp->dtype == (sp->slices[0].bits == 4 ? SPLASH_Q4 : SPLASH_Q8);
        if (sp->slices[0].bits) {
            if (sp->copy_codes) p->stats->copied_quantized++;
            else p->stats->requantized++;
        }
    }
}

static int plan(packer *p, splash_error *err) {
    const model_cfg *c = &p->cfg;
    static const char *prefixes[] = {"model.language_model.", "model.", "language_model.model."};
    for (size_t i = 0; i < 3 && !p->prefix; i++) {
        char n[128];
        snprintf(n, sizeof n, "%sembed_tokens.weight", prefixes[i]);
        if (splash_st_find(p->st, n)) p->prefix = prefixes[i];
    }
    if (!p->prefix)
        return splash_fail(err, SPLASH_E_NOTFOUND, "%s: tensor model.embed_tokens.weight (for embed) is not in the "
                           "checkpoint (nor model.language_model.embed_tokens.weight, "
                           "language_model.model.embed_tokens.weight)", p->opt->from);
    /* an mlx-lm conversion stores conv1d [C, K, 1] and norms with 1 added */
    for (int64_t L = 0; L < c->layers; L++) {
        if (c->full[L]) continue;
        char n[256];
        hf_name(p, n, sizeof n, L, "linear_attn.conv1d.weight");
        const splash_st_tensor *t = splash_st_find(p->st, n);
        if (t && t->ndim == 3 && t->shape[2] == 1 && t->shape[1] > 1) p->mlx_norms = 1;
        break;
    }
    if (!strcmp(p->prefix, "language_model.model.")) p->mlx_norms = 1;

    int rc;
    int64_t H = c->hidden;
    int f = add_file(p, "target/embedding.bin");
    spec *s = add_spec(p, f, "embed", K_MATRIX, 2, (int64_t[]){c->vocab, H});
    char n[256];
    hf_name(p, n, sizeof n, -1, "embed_tokens.weight");
    if ((rc = get_matrix(p, n, "embed", 2, s->shape, &s->slices[0], err))) return rc;

    f = add_file(p, "target/head.bin");
    if ((rc = plan_vector(p, f, "final_norm", K_NORM1, -1, "norm.weight", H, err))) return rc;
    const char *heads[] = {"lm_head.weight", "language_model.lm_head.weight", "model.lm_head.weight"};
    const char *head = NULL;
    for (size_t i = 0; i < 3 && !head; i++)
        if (splash_st_find(p->st, heads[i])) head = heads[i];
    if (!c->tie) {
        if (!head) return missing(p, "lm_head.weight", "lm_head", err);
        s = add_spec(p, f, "lm_head", K_MATRIX, 2, (int64_t[]){c->vocab, H});
        if ((rc = get_matrix(p, head, "lm_head", 2, s->shape, &s->slices[0], err))) return rc;
    } else if (head) {
        lookup(p, head); /* tied: the checkpoint's copy is not needed */
    }
    for (int64_t L = 0; L < c->layers; L++)
        if ((rc = plan_layer(p, L, err))) return rc;

    /* mtp.* verbatim; vision skipped; anything else left over is reported */
    int mtp_file = -1;
    size_t n_st = splash_st_count(p->st);
    for (size_t i = 0; i < n_st; i++) {
        const splash_st_tensor *t = splash_st_at(p->st, i);
        const char *m = mtp_name(t->name);
        if (is_vision(t->name)) {
            p->used[i] = 1;
            p->stats->vision_skipped++;
            continue;
        }
        if (!m) continue;
        p->used[i] = 1;
        if (!splash_st_is_float(t->dtype) || t->dtype == SPLASH_ST_F64 || t->ndim > SPLASH_MAX_DIMS) {
            fprintf(stderr, "splash pack: note: %s (%s, %d dims) not kept: mtp tensors are kept only as f32/f16/bf16 "
                    "of at most %d dims\n", t->name, splash_st_dtype_name(t->dtype), t->ndim, SPLASH_MAX_DIMS);
            continue;
        }
        if (splash_st_numel(t) == 0) continue; /* an empty tensor has nothing to keep */
        if (mtp_file < 0) mtp_file = add_file(p, "target/mtp.bin");
        int64_t one = 1;
        spec *ms = add_spec(p, mtp_file, m, K_MTP, t->ndim ? t->ndim : 1, t->ndim ? t->shape : &one);
        ms->slices[0].w = t;
        p->stats->mtp_tensors++;
    }
    if (p->dst && (rc = plan_draft(p, err))) return rc;
    choose_dtypes(p);
    size_t unused = 0;
    const char *first = NULL;
    for (size_t i = 0; i < n_st; i++)
        if (!p->used[i]) {
            if (!first) first = splash_st_at(p->st, i)->name;
            unused++;
        }
    p->stats->unused = unused;
    if (unused)
        fprintf(stderr, "splash pack: warning: %zu checkpoint tensors are not used by the model (first: %s)\n", unused, first);
    if (p->stats->vision_skipped)
        fprintf(stderr, "splash pack: note: %zu vision tensors skipped (the vision tower is not packed yet)\n",
                p->stats->vision_skipped);
    if (p->stats->requantized)
        fprintf(stderr, "splash pack: note: %zu MLX %d-bit tensors dequantised and re-encoded as %s (--weights differs "
                "from the checkpoint's bits)\n", p->stats->requantized, p->mlx_bits, splash_dtype_name(p->opt->weights));
    return SPLASH_OK;
}

/* ---- output files -------------------------------------------------------------- */

#define OUT_BUF (8u << 20)

static int of_open(out_file *f, const char *dir, const char *rel, splash_error *err) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->rel = xstrdup(rel);
    f->path = splash_path_join(dir, rel);
    f->fd = open(f->path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (f->fd < 0) return splash_fail(err, SPLASH_E_IO, "%s: %s", f->path, strerror(errno));
    f->hash = splash_sha256_new();
    f->buf = xmalloc(OUT_BUF);
    return SPLASH_OK;
}

static int write_all(out_file *f, const void *data, size_t n, splash_error *err) {
    const uint8_t *d = data;
    while (n) {
        ssize_t w = write(f->fd, d, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return splash_fail(err, SPLASH_E_IO, "%s: write failed: %s", f->path, strerror(errno));
        d += w;
        n -= (size_t)w;
    }
    return SPLASH_OK;
}

static int of_flush(out_file *f, splash_error *err) {
    int rc = f->n ? write_all(f, f->buf, f->n, err) : 0;
    f->n = 0;
    return rc;
}

static int of_write(out_file *f, const void *data, size_t n, splash_error *err) {
    splash_sha256_update(f->hash, data, n);
    f->pos += n;
    if (f->n + n <= OUT_BUF) {
        memcpy(f->buf + f->n, data, n);
        f->n += n;
        return SPLASH_OK;
    }
    int rc = of_flush(f, err);
    if (rc) return rc;
    if (n >= OUT_BUF / 2) return write_all(f, data, n, err);
    memcpy(f->buf, data, n);
    f->n = n;
    return SPLASH_OK;
}

static int of_pad(out_file *f, size_t align, splash_error *err) {
    static const uint8_t zeros[4096];
    while (f->pos % align) {
        size_t k = align - (size_t)(f->pos % align);
        if (k > sizeof zeros) k = sizeof zeros;
        int rc = of_write(f, zeros, k, err);
        if (rc) return rc;
    }
    return SPLASH_OK;
}

/* Pads (bin files), flushes, fsyncs, closes, and records the file. */
static int of_close(packer *p, out_file *f, size_t align, splash_error *err) {
    int rc = align ? of_pad(f, align, err) : 0;
    if (!rc) rc = of_flush(f, err);
    if (!rc && fsync(f->fd) != 0) rc = splash_fail(err, SPLASH_E_IO, "%s: fsync failed: %s", f->path, strerror(errno));
    if (f->fd >= 0 && close(f->fd) != 0 && !rc) rc = splash_fail(err, SPLASH_E_IO, "%s: close failed: %s", f->path, strerror(errno));
    f->fd = -1;
    if (f->hash) splash_sha256_finish(f->hash, f->hex);
    f->hash = NULL;
    if (!rc) {
        json_value *e = json_new(JSON_OBJECT);
        json_obj_set(e, "path", json_new_string(f->rel));
        json_obj_set(e, "size", json_new_int((int64_t)f->pos));
        json_obj_set(e, "sha256", json_new_string(f->hex));
        json_arr_push(p->file_list, e);
        p->stats->total_bytes += f->pos;
        p->stats->files++;
    }
    free(f->buf);
    free(f->rel);
    free(f->path);
    f->buf = NULL, f->rel = NULL, f->path = NULL;
    return rc;
}

static void of_abort(out_file *f) {
    if (f->fd >= 0) close(f->fd);
    if (f->hash) {
        char hex[65];
        splash_sha256_finish(f->hash, hex);
    }
    free(f->buf);
    free(f->rel);
    free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

/* ---- conversions --------------------------------------------------------------- */

/* Rows [r, r+n) of matrix `sl` (cols wide) as f32. */
static int read_rows(const slice *sl, int64_t cols, int64_t r, int64_t n, float *out) {
    int64_t e0 = sl->elem + r * cols;
    if (!sl->bits) return splash_st_read_f32(sl->w, (size_t)e0, (size_t)(n * cols), out);
    int64_t groups = cols / SPLASH_QGROUP;
    float sc[SPLASH_QGROUP * 4], bi[SPLASH_QGROUP * 4]; /* per-row group params, chunked */
    for (int64_t i = 0; i < n; i++) {
        int64_t e = e0 + i * cols;
        const uint8_t *codes = sl->w->data + (size_t)(e * sl->bits / 8);
        float *o = out + i * cols;
        for (int64_t g0 = 0; g0 < groups; g0 += SPLASH_QGROUP * 4) {
            int64_t ng = groups - g0 < SPLASH_QGROUP * 4 ? groups - g0 : SPLASH_QGROUP * 4;
            if (splash_st_read_f32(sl->s, (size_t)(e / SPLASH_QGROUP + g0), (size_t)ng, sc) ||
                splash_st_read_f32(sl->b, (size_t)(e / SPLASH_QGROUP + g0), (size_t)ng, bi))
                return -1;
            for (int64_t g = 0; g < ng; g++)
                for (int j = 0; j < SPLASH_QGROUP; j++) {
                    int64_t c = (g0 + g) * SPLASH_QGROUP + j;
                    unsigned q = sl->bits == 4 ? (codes[c / 2] >> (4 * (c & 1))) & 15u : codes[c];
                    o[c] = sc[g] * (float)q + bi[g];
                }
        }
    }
    return 0;
}

typedef struct qjob {
    const slice *sl;
    splash_dtype dtype;
    int64_t cols, r0, n; /* rows r0..r0+n of the matrix in this pass */
    float *f;            /* n x cols */
    uint8_t *codes;      /* n x row_codes */
    uint16_t *scales, *biases; /* whole matrix */
    int failed;          /* 1 read, 2 non-finite */
    int64_t bad_row;
} qjob;

#define QTASK_ROWS 16

static void qtask(void *ctx, size_t task, int worker) {
    (void)worker;
    qjob *j = ctx;
    int64_t a = (int64_t)task * QTASK_ROWS, b = a + QTASK_ROWS < j->n ? a + QTASK_ROWS : j->n;
    size_t row_codes = (size_t)(j->dtype == SPLASH_Q4 ? j->cols / 2 : j->cols);
    size_t groups = (size_t)(j->cols / SPLASH_QGROUP);
    float *f = j->f + (size_t)a * (size_t)j->cols;
    if (read_rows(j->sl, j->cols, j->r0 + a, b - a, f)) {
        j->failed = 1;
        return;
    }
    for (int64_t r = a; r < b; r++) {
        size_t R = (size_t)(j->r0 + r);
        if (splash_quantize_row(j->dtype, j->f + (size_t)r * (size_t)j->cols, j->cols, j->codes + (size_t)r * row_codes,
                                j->scales + R * groups, j->biases + R * groups)) {
            j->failed = 2;
            j->bad_row = j->r0 + r;
            return;
        }
    }
}

static int fail_read(const spec *s, const slice *sl, splash_error *err) {
    return splash_fail(err, SPLASH_E_FORMAT, "%s: tensor %s (for %s): cannot read its values", sl->w->file, sl->w->name,
                       s->name);
}

/* One [rows, cols] matrix of spec s, quantised by us. */
static int write_quantized(packer *p, out_file *f, const spec *s, const slice *sl, splash_error *err) {
    int64_t rows = s->rows, cols = s->cols;
    size_t groups = (size_t)(cols / SPLASH_QGROUP), row_codes = (size_t)(s->dtype == SPLASH_Q4 ? cols / 2 : cols);
    int64_t chunk = (int64_t)((8u << 20) / (size_t)cols);
    if (chunk < QTASK_ROWS) chunk = QTASK_ROWS;
    if (chunk > rows) chunk = rows;
    qjob j = {.sl = sl, .dtype = s->dtype, .cols = cols};
    j.f = malloc((size_t)chunk * (size_t)cols * sizeof *j.f);
    j.codes = malloc((size_t)chunk * row_codes);
    j.scales = malloc((size_t)rows * groups * 2);
    j.biases = malloc((size_t)rows * groups * 2);
    int rc = SPLASH_OK;
    if (!j.f || !j.codes || !j.scales || !j.biases)
        rc = splash_fail(err, SPLASH_E_NOMEM, "out of memory quantising %s", s->name);
    for (int64_t r = 0; !rc && r < rows; r += chunk) {
        j.r0 = r;
        j.n = rows - r < chunk ? rows - r : chunk;
        splash_pool_run(p->pool, (size_t)((j.n + QTASK_ROWS - 1) / QTASK_ROWS), qtask, &j);
        if (j.failed == 1) rc = fail_read(s, sl, err);
        else if (j.failed == 2)
            rc = splash_fail(err, SPLASH_E_INVALID, "%s: tensor %s (for %s): row %" PRId64 " holds a non-finite value",
                             sl->w->file, sl->w->name, s->name, j.bad_row);
        else rc = of_write(f, j.codes, (size_t)j.n * row_codes, err);
    }
    if (!rc) rc = of_pad(f, 64, err);
    if (!rc) rc = of_write(f, j.scales, (size_t)rows * groups * 2, err);
    if (!rc) rc = of_pad(f, 64, err);
    if (!rc) rc = of_write(f, j.biases, (size_t)rows * groups * 2, err);
    if (!rc) rc = of_pad(f, 64, err);
    free(j.f);
    free(j.codes);
    free(j.scales);
    free(j.biases);
    return rc;
}

/* MLX scales or biases of one matrix, as bf16. */
static int write_group_params(out_file *f, const splash_st_tensor *t, int64_t first, int64_t n, splash_error *err) {
    if (t->dtype == SPLASH_ST_BF16) return of_write(f, t->data + first * 2, (size_t)n * 2, err);
    float tmp[1024];
    uint16_t h[1024];
    for (int64_t i = 0; i < n; i += 1024) {
        int64_t k = n - i < 1024 ? n - i : 1024;
        if (splash_st_read_f32(t, (size_t)(first + i), (size_t)k, tmp)) return -1;
        for (int64_t x = 0; x < k; x++) h[x] = splash_f32_to_bf16(tmp[x]);
        int rc = of_write(f, h, (size_t)k * 2, err);
        if (rc) return rc;
    }
    return SPLASH_OK;
}

static int write_copied_codes(out_file *f, const spec *s, const slice *sl, splash_error *err) {
    int64_t rows = s->rows, cols = s->cols;
    int rc = of_write(f, sl->w->data + (size_t)(sl->elem * sl->bits / 8), (size_t)(rows * cols * sl->bits / 8), err);
    if (!rc) rc = of_pad(f, 64, err);
    if (!rc) rc = write_group_params(f, sl->s, sl->elem / SPLASH_QGROUP, rows * cols / SPLASH_QGROUP, err);
    if (!rc) rc = of_pad(f, 64, err);
    if (!rc) rc = write_group_params(f, sl->b, sl->elem / SPLASH_QGROUP, rows * cols / SPLASH_QGROUP, err);
    if (!rc) rc = of_pad(f, 64, err);
    if (rc == -1) rc = splash_fail(err, SPLASH_E_FORMAT, "%s: cannot read the scales/biases of %s", sl->w->file, sl->w->name);
    return rc;
}

static int same_plain_dtype(splash_st_dtype a, splash_dtype b) {
    return (a == SPLASH_ST_BF16 && b == SPLASH_BF16) || (a == SPLASH_ST_F32 && b == SPLASH_F32) ||
           (a == SPLASH_ST_F16 && b == SPLASH_F16);
}

static int write_plain(out_file *f, const spec *s, const slice *sl, int plus_one, splash_error *err) {
    int64_t rows = s->rows, cols = s->cols;
    size_t es = s->dtype == SPLASH_F32 ? 4 : 2;
    if (!sl->bits && !plus_one && same_plain_dtype(sl->w->dtype, s->dtype))
        return of_write(f, sl->w->data + (size_t)sl->elem * es, (size_t)(rows * cols) * es, err);
    int64_t chunk = (int64_t)((1u << 20) / (size_t)cols);
    if (chunk < 1) chunk = 1;
    float *tmp = malloc((size_t)chunk * (size_t)cols * sizeof *tmp);
    uint8_t *o = malloc((size_t)chunk * (size_t)cols * es);
    int rc = tmp && o ? SPLASH_OK : splash_fail(err, SPLASH_E_NOMEM, "out of memory converting %s", s->name);
    for (int64_t r = 0; !rc && r < rows; r += chunk) {
        int64_t n = rows - r < chunk ? rows - r : chunk;
        if (read_rows(sl, cols, r, n, tmp)) {
            rc = fail_read(s, sl, err);
            break;
        }
        size_t m = (size_t)(n * cols);
        for (size_t i = 0; i < m; i++) {
            float x = plus_one ? 1.0f + tmp[i] : tmp[i];
            if (s->dtype == SPLASH_F32) memcpy(o + 4 * i, &x, 4);
            else {
                uint16_t h = s->dtype == SPLASH_BF16 ? splash_f32_to_bf16(x) : splash_f32_to_f16(x);
                memcpy(o + 2 * i, &h, 2);
            }
        }
        rc = of_write(f, o, m * es, err);
    }
    free(tmp);
    free(o);
    return rc;
}

static int write_spec(packer *p, out_file *f, spec *s, json_value *tensors, splash_error *err) {
    int rc = of_pad(f, SPLASH_TENSOR_ALIGN, err);
    if (rc) return rc;
    s->offset = f->pos;
    int plus_one = s->kind == K_NORM1 && !p->mlx_norms;
    for (int64_t k = 0; !rc && k < s->count; k++) {
        const slice *sl = &s->slices[k];
        if (s->dtype == SPLASH_Q4 || s->dtype == SPLASH_Q8)
            rc = s->copy_codes ? write_copied_codes(f, s, sl, err) : write_quantized(p, f, s, sl, err);
        else
            rc = write_plain(f, s, sl, plus_one, err);
    }
    if (rc) return rc;
    size_t bytes = splash_tensor_bytes(s->dtype, s->ndim, s->shape);
    if (f->pos - s->offset != bytes)
        return splash_fail(err, SPLASH_E_INVALID, "internal error: %s wrote %" PRIu64 " bytes, its layout has %zu", s->name,
                           f->pos - s->offset, bytes);
    p->stats->bytes_by_dtype[s->dtype] += bytes;
    p->stats->tensors++;
    json_value *e = json_new(JSON_OBJECT);
    json_obj_set(e, "name", json_new_string(s->name));
    json_obj_set(e, "file", json_new_string(p->files[s->file]));
    json_obj_set(e, "offset", json_new_int((int64_t)s->offset));
    json_obj_set(e, "dtype", json_new_string(splash_dtype_name(s->dtype)));
    json_value *shape = json_new(JSON_ARRAY);
    for (int d = 0; d < s->ndim; d++) json_arr_push(shape, json_new_int(s->shape[d]));
    json_obj_set(e, "shape", shape);
    json_obj_set(e, "bytes", json_new_int((int64_t)bytes));
    json_arr_push(tensors, e);
    return SPLASH_OK;
}

/* ---- tokenizer and special tokens -------------------------------------------- */

static json_value *read_json_file(const char *path, splash_error *err, int *rc) {
    char *text = NULL;
    size_t len = 0;
    *rc = splash_read_file(path, &text, &len, err);
    if (*rc) return NULL;
    char jerr[256];
    json_value *v = json_parse(text, len, 128, jerr, sizeof jerr);
    free(text);
    if (!v) *rc = splash_fail(err, SPLASH_E_FORMAT, "%s: not JSON: %s", path, jerr);
    return v;
}

/* tokenizer.json holds a 150k-key vocabulary, and building all of it is
 * slow (json_parse checks each object key against the earlier ones), while
 * only "added_tokens" is needed here: find that top-level value by skipping
 * over the others, and parse just it. */
static size_t skip_ws(const char *s, size_t n, size_t i) {
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

static size_t skip_string(const char *s, size_t n, size_t i) { /* i at the opening quote */
    for (i++; i < n && s[i] != '"'; i++)
        if (s[i] == '\\') i++;
    return i < n ? i + 1 : n;
}

static size_t skip_value(const char *s, size_t n, size_t i) {
    if (i >= n) return n;
    if (s[i] == '"') return skip_string(s, n, i);
    if (s[i] == '{' || s[i] == '[') {
        int depth = 0;
        while (i < n) {
            char c = s[i];
            if (c == '"') {
                i = skip_string(s, n, i);
                continue;
            }
            if (c == '{' || c == '[') depth++;
            if ((c == '}' || c == ']') && --depth == 0) return i + 1;
            i++;
        }
        return n;
    }
    while (i < n && !strchr(",}] \t\r\n", s[i])) i++;
    return i;
}

static json_value *parse_top_level_value(const char *s, size_t n, const char *key, const char *path, splash_error *err,
                                         int *rc) {
    size_t klen = strlen(key), i = skip_ws(s, n, 0);
    *rc = SPLASH_OK;
    if (i >= n || s[i] != '{') {
        *rc = splash_fail(err, SPLASH_E_FORMAT, "%s: not a JSON object", path);
        return NULL;
    }
    i = skip_ws(s, n, i + 1);
    while (i < n && s[i] == '"') {
        size_t k0 = i + 1, k1 = skip_string(s, n, i);
        i = skip_ws(s, n, k1);
        if (i >= n || s[i] != ':') break;
        i = skip_ws(s, n, i + 1);
        size_t v0 = i;
        i = skip_value(s, n, i);
        if (k1 - 1 - k0 == klen && !memcmp(s + k0, key, klen)) {
            char jerr[256];
            json_value *v = json_parse(s + v0, i - v0, 64, jerr, sizeof jerr);
            if (!v) *rc = splash_fail(err, SPLASH_E_FORMAT, "%s: \"%s\" is not JSON: %s", path, key, jerr);
            return v;
        }
        i = skip_ws(s, n, i);
        if (i < n && s[i] == ',') i = skip_ws(s, n, i + 1);
        else break;
    }
    if (i >= n || s[i] != '}') *rc = splash_fail(err, SPLASH_E_FORMAT, "%s: not JSON (near byte %zu)", path, i);
    return NULL;
}

static int copy_file(packer *p, const char *src, const char *rel, const char *data, size_t len, splash_error *err) {
    char *text = NULL;
    size_t n = len;
    int rc = SPLASH_OK;
    if (!data) {
        rc = splash_read_file(src, &text, &n, err);
        if (rc) return rc;
        data = text;
    }
    out_file f;
    rc = of_open(&f, p->tmp, rel, err);
    if (!rc) rc = of_write(&f, data, n, err);
    if (!rc) rc = of_close(p, &f, 0, err);
    else of_abort(&f);
    free(text);
    return rc;
}

/* The manifest's "chat_template": "absent", "native" (the template Splash
 * renders in C, src/text/chat_template.h), or a one-line description of the
 * first difference from it. */
static const char *chat_template_status(const char *text, char *buf, size_t size) {
    if (!text) return "absent";
    return splash_chat_template_identify(text, strlen(text), buf, size);
}

static void push_unique(json_value *arr, int64_t id) {
    for (size_t i = 0; i < arr->count; i++) {
        int64_t x;
        if (!json_int64(arr->items[i], &x) && x == id) return;
    }
    json_arr_push(arr, json_new_int(id));
}

/* id or list of ids -> arr */
static void push_ids(json_value *arr, const json_value *v) {
    int64_t id;
    if (!v) return;
    if (v->type == JSON_ARRAY) {
        for (size_t i = 0; i < v->count; i++)
            if (!json_int64(v->items[i], &id) && id >= 0) push_unique(arr, id);
    } else if (!json_int64(v, &id) && id >= 0) {
        push_unique(arr, id);
    }
}

static int64_t added_token_id(const json_value *tok, const char *content) {
    const json_value *added = tok ? json_get(tok, "added_tokens") : NULL;
    if (!added || added->type != JSON_ARRAY) return -1;
    for (size_t i = 0; i < added->count; i++) {
        const char *c = json_get_string(added->items[i], "content", NULL);
        int64_t id;
        if (c && !strcmp(c, content) && !json_int64(json_get(added->items[i], "id"), &id)) return id;
    }
    return -1;
}

static int build_tokens(packer *p, json_value *manifest, splash_error *err) {
    const char *from = p->opt->from;
    int rc = SPLASH_OK;
    json_value *tok = NULL, *tcfg = NULL, *gen = NULL;
    char *path;
    static const char *copies[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "vocab.json",
                                   "merges.txt", "special_tokens_map.json"};
    int any = 0;
    for (size_t i = 0; i < sizeof copies / sizeof copies[0]; i++) {
        path = splash_path_join(from, copies[i]);
        if (splash_is_file(path)) any = 1;
        free(path);
    }
    path = splash_path_join(from, "tokenizer_config.json");
    if (splash_is_file(path)) tcfg = read_json_file(path, err, &rc);
    free(path);
    if (rc) goto done;
    path = splash_path_join(from, "tokenizer.json");
    if (splash_is_file(path)) {
        char *text = NULL;
        size_t len = 0;
        rc = splash_read_file(path, &text, &len, err);
        json_value *added = rc ? NULL : parse_top_level_value(text, len, "added_tokens", path, err, &rc);
        free(text);
        if (added) { /* {"added_tokens": [...]}: what added_token_id reads */
            tok = json_new(JSON_OBJECT);
            json_obj_set(tok, "added_tokens", added);
        }
    }
    free(path);
    if (rc) goto done;
    path = splash_path_join(from, "generation_config.json");
    if (splash_is_file(path)) gen = read_json_file(path, err, &rc);
    free(path);
    if (rc) goto done;

    char *tdir = splash_path_join(p->tmp, "tokenizer");
    if (any) rc = splash_mkdirs(tdir, err);
    free(tdir);
    for (size_t i = 0; !rc && i < sizeof copies / sizeof copies[0]; i++) {
        path = splash_path_join(from, copies[i]);
        if (splash_is_file(path) && !strcmp(copies[i], "tokenizer.json")) {
            /* stored gzipped (docs/package-format.md): 11.4 MB of Qwen3 tokenizer is 2.1 MB */
            char *text = NULL, *gz = NULL;
            size_t len = 0, gzlen = 0;
            rc = splash_read_file(path, &text, &len, err);
            if (!rc) rc = splash_gzip(text, len, &gz, &gzlen, err);
            if (!rc) rc = copy_file(p, NULL, "tokenizer/tokenizer.json.gz", gz, gzlen, err);
            free(text);
            free(gz);
        } else if (splash_is_file(path)) {
            char rel[96];
            snprintf(rel, sizeof rel, "tokenizer/%s", copies[i]);
            rc = copy_file(p, path, rel, NULL, 0, err);
        }
        free(path);
    }
    if (rc) goto done;

    /* chat template: chat_template.jinja, else tokenizer_config's string (written out as the .jinja) */
    char *tmpl = NULL;
    path = splash_path_join(from, "chat_template.jinja");
    if (splash_is_file(path)) rc = splash_read_file(path, &tmpl, NULL, err);
    free(path);
    if (!rc && !tmpl && tcfg) {
        const json_value *ct = json_get(tcfg, "chat_template");
        const char *s = json_string(ct);
        if (!s && ct && ct->type == JSON_ARRAY)
            for (size_t i = 0; i < ct->count && !s; i++)
                if (!strcmp(json_get_string(ct->items[i], "name", ""), "default"))
                    s = json_get_string(ct->items[i], "template", NULL);
        if (s) {
            tmpl = xstrdup(s);
            rc = copy_file(p, NULL, "tokenizer/chat_template.jinja", tmpl, strlen(tmpl), err);
        }
    }
    if (rc) {
        free(tmpl);
        goto done;
    }
    json_value *tokens = json_new(JSON_OBJECT);
    json_value *eos = json_new(JSON_ARRAY);
    if (gen) push_ids(eos, json_get(gen, "eos_token_id"));
    push_ids(eos, cfg_get(p, "eos_token_id"));
    if (tcfg && tok) { /* tokenizer_config's eos_token by content */
        const json_value *e = json_get(tcfg, "eos_token");
        const char *c = json_string(e) ? json_string(e) : json_get_string(e, "content", NULL);
        int64_t id = c ? added_token_id(tok, c) : -1;
        if (id >= 0) push_unique(eos, id);
    }
    /* drop ids the model cannot produce (a config's defaults on a tiny model) */
    for (size_t i = 0; i < eos->count;) {
        int64_t id;
        json_int64(eos->items[i], &id);
        if (id >= p->cfg.vocab) {
            fprintf(stderr, "splash pack: note: eos id %" PRId64 " >= vocab %" PRId64 ", left out\n", id, p->cfg.vocab);
            json_free(eos->items[i]);
            memmove(eos->items + i, eos->items + i + 1, (eos->count - i - 1) * sizeof *eos->items);
            eos->count--;
        } else {
            i++;
        }
    }
    if (eos->count) json_obj_set(tokens, "eos", eos);
    else json_free(eos);

    int64_t pad = -1;
    const json_value *pv = cfg_get(p, "pad_token_id");
    if (!pv && gen) pv = json_get(gen, "pad_token_id");
    if (pv) json_int64(pv, &pad);
    if (pad < 0 && tcfg && tok) {
        const json_value *e = json_get(tcfg, "pad_token");
        const char *c = json_string(e) ? json_string(e) : json_get_string(e, "content", NULL);
        if (c) pad = added_token_id(tok, c);
    }
    if (pad >= 0 && pad < p->cfg.vocab) json_obj_set(tokens, "pad", json_new_int(pad));

    static const struct {
        const char *key, *content, *config_key;
    } named[] = {
        {"im_start", "<|im_start|>", NULL},
        {"im_end", "<|im_end|>", NULL},
        {"endoftext", "<|endoftext|>", NULL},
        {"think_start", "<think>", NULL},
        {"think_end", "</think>", NULL},
        {"tool_call_start", "<tool_call>", NULL},
        {"tool_call_end", "</tool_call>", NULL},
        {"vision_start", "<|vision_start|>", "vision_start_token_id"},
        {"vision_end", "<|vision_end|>", "vision_end_token_id"},
        {"image_pad", "<|image_pad|>", "image_token_id"},
    };
    char dropped[256] = "";
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        int64_t id = added_token_id(tok, named[i].content);
        if (id < 0 && named[i].config_key) {
            const json_value *v = json_get(p->config, named[i].config_key);
            if (!v || json_int64(v, &id)) id = -1;
        }
        if (id >= 0 && id < p->cfg.vocab) json_obj_set(tokens, named[i].key, json_new_int(id));
        else if (id >= p->cfg.vocab && strlen(dropped) < sizeof dropped - 48)
            snprintf(dropped + strlen(dropped), sizeof dropped - strlen(dropped), " %s %" PRId64, named[i].key, id);
    }
    if (dropped[0])
        fprintf(stderr, "splash pack: note: token ids beyond the vocab (%" PRId64 ") left out:%s\n", p->cfg.vocab, dropped);
    json_obj_set(manifest, "tokens", tokens);
    char what[512];
    json_obj_set(manifest, "chat_template", json_new_string(chat_template_status(tmpl, what, sizeof what)));
    free(tmpl);
done:
    json_free(tok);
    json_free(tcfg);
    json_free(gen);
    return rc;
}

/* ---- manifest ------------------------------------------------------------------- */

static json_value *num_from_config(packer *p, const json_value *v, double fallback) {
    (void)p;
    if (v && v->type == JSON_NUMBER) return json_clone(v);
    return json_new_double(fallback);
}

static json_value *model_json(packer *p) {
    const model_cfg *c = &p->cfg;
    json_value *m = json_new(JSON_OBJECT);
    json_obj_set(m, "hidden", json_new_int(c->hidden));
    json_obj_set(m, "layers", json_new_int(c->layers));
    json_obj_set(m, "vocab", json_new_int(c->vocab));
    json_obj_set(m, "rms_eps", num_from_config(p, cfg_get(p, "rms_norm_eps"), c->rms_eps));
    json_obj_set(m, "max_positions", json_new_int(c->max_pos));
    json_obj_set(m, "tie_embeddings", json_new_bool(c->tie));
    json_value *lt = json_new(JSON_ARRAY);
    for (int64_t i = 0; i < c->layers; i++) json_arr_push(lt, json_new_string(c->full[i] ? "full_attention" : "linear_attention"));
    json_obj_set(m, "layer_types", lt);
    json_value *a = json_new(JSON_OBJECT);
    json_obj_set(a, "heads", json_new_int(c->heads));
    json_obj_set(a, "kv_heads", json_new_int(c->kv_heads));
    json_obj_set(a, "head_dim", json_new_int(c->head_dim));
    json_obj_set(a, "rotary_dim", json_new_int(c->rotary_dim));
    json_obj_set(a, "rope_theta", num_from_config(p, rope_get(p, "rope_theta"), c->rope_theta));
    json_obj_set(m, "attention", a);
    json_value *g = json_new(JSON_OBJECT);
    json_obj_set(g, "key_heads", json_new_int(c->kh));
    json_obj_set(g, "value_heads", json_new_int(c->vh));
    json_obj_set(g, "key_dim", json_new_int(c->dk));
    json_obj_set(g, "value_dim", json_new_int(c->dv));
    json_obj_set(g, "conv_kernel", json_new_int(c->conv_k));
    json_obj_set(m, "gdn", g);
    if (!c->moe) {
        json_value *f = json_new(JSON_OBJECT);
        json_obj_set(f, "intermediate", json_new_int(c->inter));
        json_obj_set(m, "ffn", f);
    } else {
        json_value *e = json_new(JSON_OBJECT);
        json_obj_set(e, "experts", json_new_int(c->experts));
        json_obj_set(e, "top_k", json_new_int(c->top_k));
        json_obj_set(e, "expert_intermediate", json_new_int(c->expert_inter));
        json_obj_set(e, "shared_intermediate", json_new_int(c->shared_inter));
        json_obj_set(e, "norm_topk_prob", json_new_bool(c->norm_topk));
        json_obj_set(m, "moe", e);
    }
    return m;
}

static json_value *source_json(packer *p) {
    json_value *s = json_new(JSON_OBJECT);
    char *abs = realpath(p->opt->from, NULL);
    json_obj_set(s, "path", json_new_string(abs ? abs : p->opt->from));
    free(abs);
    const json_value *a = json_get(p->config, "architectures");
    json_obj_set(s, "architectures", a && a->type == JSON_ARRAY ? json_clone(a) : json_new(JSON_ARRAY));
    json_obj_set(s, "mlx", json_new_bool(p->mlx_quant || p->mlx_norms));
    if (p->mlx_quant) json_obj_set(s, "mlx_bits", json_new_int(p->mlx_bits));
    json_obj_set(s, "tensor_prefix", json_new_string(p->prefix));
    if (p->expert_form) json_obj_set(s, "expert_form", json_new_string(p->expert_form));
    return s;
}

/* Pretty, except that each tensor and file entry takes one line (a package
 * has hundreds of tensors; a line each keeps the manifest readable). */
static void write_manifest_text(strbuf *sb, const json_value *m) {
    sb_puts(sb, "{\n");
    for (size_t i = 0; i < m->count; i++) {
        const json_value *v = m->items[i];
        sb_puts(sb, "  ");
        json_write_string(sb, m->keys[i], strlen(m->keys[i]), JSON_PRETTY);
        sb_puts(sb, ": ");
        if (v->type == JSON_ARRAY && (!strcmp(m->keys[i], "tensors") || !strcmp(m->keys[i], "files"))) {
            sb_puts(sb, "[\n");
            for (size_t k = 0; k < v->count; k++) {
                sb_puts(sb, "    ");
                json_write(sb, v->items[k], JSON_PYTHON);
                sb_puts(sb, k + 1 < v->count ? ",\n" : "\n");
            }
            sb_puts(sb, "  ]");
        } else {
            strbuf tmp;
            sb_init(&tmp);
            json_write(&tmp, v, JSON_PRETTY);
            const char *t = sb_cstr(&tmp);
            for (; *t; t++) {
                sb_putc(sb, *t);
                if (*t == '\n') sb_puts(sb, "  ");
            }
            sb_free(&tmp);
        }
        sb_puts(sb, i + 1 < m->count ? ",\n" : "\n");
    }
    sb_puts(sb, "}\n");
}

/* ---- commit --------------------------------------------------------------------- */

static int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* fsync the staging directory's subdirectory `name` (target, draft), so its
 * entries are on disk before the commit's renames. */
static void fsync_tmp_sub(const packer *p, const char *name) {
    char *d = splash_path_join(p->tmp, name);
    fsync_dir(d);
    free(d);
}

static char *parent_dir(const char *path) {
    char *d = xstrdup(path);
    char *slash = strrchr(d, '/');
    if (!slash) {
        free(d);
        return xstrdup(".");
    }
    if (slash == d) slash[1] = 0;
    else *slash = 0;
    return d;
}

static int commit(packer *p, splash_error *err) {
    const char *out = p->opt->out;
    char *old = NULL;
    if (splash_is_dir(out) || splash_is_file(out)) {
        if (!p->opt->force)
            return splash_fail(err, SPLASH_E_INVALID, "%s already exists (remove it or pass --force)", out);
        size_t n = strlen(out) + 16;
        old = xmalloc(n);
        snprintf(old, n, "%s.old-XXXXXX", out);
        if (!mkdtemp(old)) {
            free(old);
            return splash_fail(err, SPLASH_E_IO, "%s: cannot make a name to move the old package aside: %s", out, strerror(errno));
        }
        rmdir(old);
        if (rename(out, old) != 0) {
            int e = errno;
            free(old);
            return splash_fail(err, SPLASH_E_IO, "%s: cannot move the old package aside: %s", out, strerror(e));
        }
    }
    if (rename(p->tmp, out) != 0) {
        int e = errno;
        if (old) rename(old, out);
        free(old);
        return splash_fail(err, SPLASH_E_IO, "cannot rename %s to %s: %s", p->tmp, out, strerror(e));
    }
    char *parent = parent_dir(out);
    fsync_dir(parent);
    free(parent);
    if (old) {
        splash_remove_tree(old);
        free(old);
    }
    free(p->tmp);
    p->tmp = NULL; /* nothing to clean up any more */
    return SPLASH_OK;
}

/* ---- entry point ----------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the DFlash draft (--draft) ---------------------------------------------------
 *
 * A z-lab DFlashDraftModel checkpoint: config.json (Qwen3 dims, layer_types,
 * sliding_window, block_size, dflash_config {mask_token_id, target_layer_ids})
 * and fc / hidden_norm / layers.N.* / norm tensors.  Its tensors go to
 * draft/model.bin (fc, hidden_norm, norm) and draft/layer-<i>.bin under
 * "draft." names, quantised by the same rules as the target's; its norms are
 * plain Qwen3 RMSNorm factors, stored as is (K_VEC), not 1 + w.
 *
 * A DFlash2DraftModel checkpoint adds, per layer, attention_conv.* and
 * mlp_conv.* (base_kernel [2, K, H] f32 as is; kernel_projection [2*K*H/group,
 * H] a matrix) in the layer's file, and candidate_selector.* (hidden_projection
 * [rank, H], the two codebooks [vocab, rank], matrices) in draft/selector.bin;
 * the manifest's draft object says "dflash2" and carries the conv, selector
 * and logit values. */

static const json_value *dcfg_get(packer *p, const char *key) {
    const json_value *d = json_get(p->dconfig, "dflash_config");
    const json_value *v = d && d->type == JSON_OBJECT ? json_get(d, key) : NULL;
    if (!v || v->type == JSON_NULL) v = json_get(p->dconfig, key);
    return v && v->type != JSON_NULL ? v : NULL;
}

static int dcfg_int(packer *p, const char *key, int64_t dflt, int64_t *out, splash_error *err) {
    const json_value *v = dcfg_get(p, key);
    if (!v) {
        if (dflt < 0) return splash_fail(err, SPLASH_E_FORMAT, "%s: \"%s\" is missing", p->dconfig_path, key);
        *out = dflt;
        return SPLASH_OK;
    }
    if (json_int64(v, out) || *out < 0)
        return splash_fail(err, SPLASH_E_FORMAT, "%s: \"%s\" must be a non-negative integer", p->dconfig_path, key);
    return SPLASH_OK;
}

/* A positive finite number from dflash_config or the top level (z-lab's
 * _draft_value order), or dflt when absent; *lex keeps the config's value. */
static int dcfg_num(packer *p, const char *key, double dflt, int allow_zero, double *out, const json_value **lex,
                    splash_error *err) {
    const json_value *v = dcfg_get(p, key);
    *lex = NULL;
    if (!v) {
        *out = dflt;
        return SPLASH_OK;
    }
    if (v->type != JSON_NUMBER || !isfinite(v->num) || v->num < 0 || (!allow_zero && v->num == 0))
        return splash_fail(err, SPLASH_E_FORMAT, "%s: \"%s\" must be a %s number", p->dconfig_path, key,
                           allow_zero ? "non-negative" : "positive");
    *out = v->num;
    *lex = v;
    return SPLASH_OK;
}

/* DFlash 2's additions (dflash_config, else the top level, as z-lab's
 * _draft_value and llama.cpp's converter read them): conv_kernel_size,
 * conv_group_size, selector_rank, selector_top_k (required), and
 * output_multiplier, final_logit_softcapping, input_embedding_scale
 * (absent: 1, no cap, 1). */
static int read_draft2_config(packer *p, splash_error *err) {
    draft_cfg *d = &p->dc;
    int rc;
    if ((rc = dcfg_int(p, "conv_kernel_size", -1, &d->conv_kernel, err)) ||
        (rc = dcfg_int(p, "conv_group_size", -1, &d->conv_group, err)) ||
        (rc = dcfg_int(p, "selector_rank", -1, &d->sel_rank, err)) ||
        (rc = dcfg_int(p, "selector_top_k", -1, &d->sel_top_k, err)))
        return rc;
    const char *bad = NULL;
    if (d->conv_kernel < 1 || d->conv_kernel > 16) bad = "conv_kernel_size must be 1..16";
    else if (d->conv_group < 1 || d->hidden % d->conv_group) bad = "conv_group_size must divide hidden_size";
    else if (d->sel_rank < 1 || d->sel_rank > 65536) bad = "selector_rank must be 1..65536";
    else if (d->sel_top_k < 1 || d->sel_top_k > 64 || d->sel_top_k > p->cfg.vocab) bad = "selector_top_k must be 1..64";
    if (bad) return splash_fail(err, SPLASH_E_FORMAT, "%s: %s", p->dconfig_path, bad);
    const json_value *vs = json_get(p->dconfig, "vocab_size");
    int64_t vocab;
    if (vs && (json_int64(vs, &vocab) || vocab != p->cfg.vocab))
        return splash_fail(err, SPLASH_E_FORMAT, "%s: vocab_size differs from the target's (%" PRId64 "): the selector's "
                           "codebooks are indexed by target tokens", p->dconfig_path, p->cfg.vocab);
    if ((rc = dcfg_num(p, "output_multiplier", 1.0, 0, &d->out_mult, &d->out_mult_v, err)) ||
        (rc = dcfg_num(p, "final_logit_softcapping", 0.0, 1, &d->softcap, &d->softcap_v, err)) ||
        (rc = dcfg_num(p, "input_embedding_scale", 1.0, 0, &d->embed_scale, &d->embed_scale_v, err)))
        return rc;
    return SPLASH_OK;
}

static int read_draft_config(packer *p, splash_error *err) {
    char *text = NULL;
    size_t len = 0;
    int rc = splash_read_file(p->dconfig_path, &text, &len, err);
    if (rc) return rc;
    char jerr[256];
    p->dconfig = json_parse(text, len, 64, jerr, sizeof jerr);
    free(text);
    if (!p->dconfig) return splash_fail(err, SPLASH_E_FORMAT, "%s: not JSON: %s", p->dconfig_path, jerr);
    if (p->dconfig->type != JSON_OBJECT) return splash_fail(err, SPLASH_E_FORMAT, "%s: not a JSON object", p->dconfig_path);
    const json_value *archs = json_get(p->dconfig, "architectures");
    const char *arch = archs && archs->type == JSON_ARRAY && archs->count ? json_string(archs->items[0]) : NULL;
    if (!arch || (strcmp(arch, "DFlashDraftModel") && strcmp(arch, "DFlash2DraftModel")))
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: architectures[0] is %s: splash packs DFlash drafts "
                           "(\"DFlashDraftModel\" or \"DFlash2DraftModel\")", p->dconfig_path, arch ? arch : "missing");
    draft_cfg *d = &p->dc;
    d->v2 = !strcmp(arch, "DFlash2DraftModel");
    struct {
        const char *key;
        int64_t dflt;
        int64_t *out;
    } ints[] = {
        {"hidden_size", -1, &d->hidden},      {"num_hidden_layers", -1, &d->layers},
        {"num_attention_heads", -1, &d->heads}, {"num_key_value_heads", -1, &d->kv_heads},
        {"intermediate_size", -1, &d->inter},  {"block_size", 16, &d->block_size},
        {"mask_token_id", -1, &d->mask_token_id}, {"sliding_window", 0, &d->sliding_window},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if ((rc = dcfg_int(p, ints[i].key, ints[i].dflt, ints[i].out, err))) return rc;
    if (!d->heads || !d->kv_heads || d->heads % d->kv_heads)
        return splash_fail(err, SPLASH_E_FORMAT, "%s: num_attention_heads must be a positive multiple of "
                           "num_key_value_heads", p->dconfig_path);
    if ((rc = dcfg_int(p, "head_dim", d->hidden / d->heads, &d->head_dim, err))) return rc;
    const char *bad = NULL;
    if (d->hidden != p->cfg.hidden) bad = "hidden_size differs from the target's";
    else if (!d->layers || !d->inter || !d->head_dim || d->head_dim % 2) bad = "num_hidden_layers, intermediate_size and an even head_dim must be positive";
    else if (!d->block_size || d->block_size > 64) bad = "block_size must be 1..64";
    else if (d->mask_token_id >= p->cfg.vocab) bad = "mask_token_id is outside the target's vocabulary";
    if (bad) return splash_fail(err, SPLASH_E_FORMAT, "%s: %s", p->dconfig_path, bad);
    const json_value *taps = dcfg_get(p, "target_layer_ids");
    if (!taps || taps->type != JSON_ARRAY || !taps->count || taps->count > DRAFT_MAX_TAPS)
        return splash_fail(err, SPLASH_E_FORMAT, "%s: dflash_config.target_layer_ids must list 1..%d target layers",
                           p->dconfig_path, DRAFT_MAX_TAPS);
    d->n_taps = (int64_t)taps->count;
    for (size_t i = 0; i < taps->count; i++)
        if (json_int64(taps->items[i], &d->taps[i]) || d->taps[i] < 0 || d->taps[i] >= p->cfg.layers)
            return splash_fail(err, SPLASH_E_FORMAT, "%s: target_layer_ids[%zu] is not a layer of the %" PRId64
                               "-layer target", p->dconfig_path, i, p->cfg.layers);
    d->rms_eps_v = dcfg_get(p, "rms_norm_eps");
    d->rms_eps = d->rms_eps_v && d->rms_eps_v->type == JSON_NUMBER ? d->rms_eps_v->num : 1e-6;
    const json_value *rp = json_get(p->dconfig, "rope_parameters");
    if (!rp || rp->type != JSON_OBJECT) rp = json_get(p->dconfig, "rope_scaling");
    const json_value *rt = rp && rp->type == JSON_OBJECT ? json_get(rp, "rope_type") : NULL;
    if (rt && json_string(rt) && strcmp(json_string(rt), "default"))
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: rope_type \"%s\" is not supported (only \"default\")",
                           p->dconfig_path, json_string(rt));
    d->rope_theta_v = rp && rp->type == JSON_OBJECT ? json_get(rp, "rope_theta") : NULL;
    if (!d->rope_theta_v || d->rope_theta_v->type != JSON_NUMBER) d->rope_theta_v = dcfg_get(p, "rope_theta");
    d->rope_theta = d->rope_theta_v && d->rope_theta_v->type == JSON_NUMBER ? d->rope_theta_v->num : 10000.0;
    /* per layer: sliding from layer_types; causal inside the block from
     * is_causal, else (z-lab) causal exactly on sliding layers */
    d->sliding = xcalloc((size_t)d->layers, sizeof *d->sliding);
    d->causal = xcalloc((size_t)d->layers, sizeof *d->causal);
    const json_value *lt = json_get(p->dconfig, "layer_types");
    if (lt && lt->type != JSON_NULL && (lt->type != JSON_ARRAY || (int64_t)lt->count != d->layers))
        return splash_fail(err, SPLASH_E_FORMAT, "%s: layer_types must list %" PRId64 " layers", p->dconfig_path, d->layers);
    const json_value *ic = dcfg_get(p, "is_causal");
    for (int64_t i = 0; i < d->layers; i++) {
        const char *s = lt && lt->type == JSON_ARRAY ? json_string(lt->items[i]) : "full_attention";
        if (!s || (strcmp(s, "full_attention") && strcmp(s, "sliding_attention")))
            return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: layer_types[%" PRId64 "] must be \"full_attention\" or "
                               "\"sliding_attention\"", p->dconfig_path, i);
        d->sliding[i] = !strcmp(s, "sliding_attention");
        d->causal[i] = ic && json_is_bool(ic) ? ic->type == JSON_TRUE : d->sliding[i];
        if (d->sliding[i] && !d->sliding_window)
            return splash_fail(err, SPLASH_E_FORMAT, "%s: layer %" PRId64 " is sliding_attention but sliding_window is "
                               "missing or 0", p->dconfig_path, i);
    }
    return d->v2 ? read_draft2_config(p, err) : SPLASH_OK;
}

/* DFlash 2's base_kernel [2, K, H] (before / after the sublayer, tap, channel),
 * stored f32 as is: two [K, H] matrices of the one checkpoint tensor. */
static int plan_conv_base(packer *p, int file, const char *canon, int64_t layer, const char *suffix, int64_t k,
                          int64_t h, splash_error *err) {
    char hf[256];
    hf_name(p, hf, sizeof hf, layer, suffix);
    int64_t shape[3] = {2, k, h};
    spec *s = add_spec(p, file, canon, K_VEC, 3, shape);
    const splash_st_tensor *t = lookup(p, hf);
    if (!t) return missing(p, hf, canon, err);
    if (!splash_st_is_float(t->dtype) || !same_shape(t, 3, shape)) return misshapen(t, canon, 3, shape, " (float)", err);
    for (int i = 0; i < 2; i++) {
        s->slices[i].w = t;
        s->slices[i].elem = i * k * h;
    }
    return SPLASH_OK;
}

static int plan_draft(packer *p, splash_error *err) {
    const draft_cfg *d = &p->dc;
    splash_st *tst = p->st;
    uint8_t *tused = p->used;
    const char *tprefix = p->prefix;
    p->st = p->dst;
    p->used = p->dused;
    p->prefix = "";
    p->from = p->opt->draft;
    int rc = 0;
    int64_t H = d->hidden, q = d->heads * d->head_dim, kv = d->kv_heads * d->head_dim, I = d->inter;
    int f = add_file(p, "draft/model.bin");
    if ((rc = plan_matrix(p, f, "draft.fc", K_MATRIX, -1, "fc.weight", H, d->n_taps * H, err)) ||
        (rc = plan_vector(p, f, "draft.hidden_norm", K_VEC, -1, "hidden_norm.weight", H, err)) ||
        (rc = plan_vector(p, f, "draft.norm", K_VEC, -1, "norm.weight", H, err)))
        goto done;
    for (int64_t L = 0; L < d->layers && !rc; L++) {
        char rel[64], n[96];
        snprintf(rel, sizeof rel, "draft/layer-%" PRId64 ".bin", L);
        f = add_file(p, rel);
#define DCANON(fmt) (snprintf(n, sizeof n, "draft.layers.%" PRId64 "." fmt, L), n)
        if ((rc = plan_vector(p, f, DCANON("input_norm"), K_VEC, L, "input_layernorm.weight", H, err)) ||
            (rc = plan_matrix(p, f, DCANON("attn.q_proj"), K_MATRIX, L, "self_attn.q_proj.weight", q, H, err)) ||
            (rc = plan_matrix(p, f, DCANON("attn.k_proj"), K_MATRIX, L, "self_attn.k_proj.weight", kv, H, err)) ||
            (rc = plan_matrix(p, f, DCANON("attn.v_proj"), K_MATRIX, L, "self_attn.v_proj.weight", kv, H, err)) ||
            (rc = plan_matrix(p, f, DCANON("attn.o_proj"), K_MATRIX, L, "self_attn.o_proj.weight", H, q, err)) ||
            (rc = plan_vector(p, f, DCANON("attn.q_norm"), K_VEC, L, "self_attn.q_norm.weight", d->head_dim, err)) ||
            (rc = plan_vector(p, f, DCANON("attn.k_norm"), K_VEC, L, "self_attn.k_norm.weight", d->head_dim, err)) ||
            (rc = plan_vector(p, f, DCANON("post_norm"), K_VEC, L, "post_attention_layernorm.weight", H, err)) ||
            (rc = plan_matrix(p, f, DCANON("ffn.gate"), K_MATRIX, L, "mlp.gate_proj.weight", I, H, err)) ||
            (rc = plan_matrix(p, f, DCANON("ffn.up"), K_MATRIX, L, "mlp.up_proj.weight", I, H, err)) ||
            (rc = plan_matrix(p, f, DCANON("ffn.down"), K_MATRIX, L, "mlp.down_proj.weight", H, I, err)))
            break;
        if (d->v2) {
            int64_t K = d->conv_kernel, proj = 2 * K * (H / d->conv_group);
            if ((rc = plan_conv_base(p, f, DCANON("attn_conv.base"), L, "attention_conv.base_kernel", K, H, err)) ||
                (rc = plan_matrix(p, f, DCANON("attn_conv.proj"), K_MATRIX, L, "attention_conv.kernel_projection.weight",
                                  proj, H, err)) ||
                (rc = plan_conv_base(p, f, DCANON("ffn_conv.base"), L, "mlp_conv.base_kernel", K, H, err)) ||
                (rc = plan_matrix(p, f, DCANON("ffn_conv.proj"), K_MATRIX, L, "mlp_conv.kernel_projection.weight", proj,
                                  H, err)))
                break;
        }
#undef DCANON
    }
    if (!rc && d->v2) {
        /* the codebooks are embeddings [vocab, rank]: z-lab names them without
         * ".weight" (its loader maps them); accept both spellings */
        f = add_file(p, "draft/selector.bin");
        int64_t R = d->sel_rank, V = p->cfg.vocab;
        const char *books[2][3] = {{"draft.selector.pred_codebook", "candidate_selector.predecessor_codebook",
                                    "candidate_selector.predecessor_codebook.weight"},
                                   {"draft.selector.succ_codebook", "candidate_selector.successor_codebook",
                                    "candidate_selector.successor_codebook.weight"}};
        rc = plan_matrix(p, f, "draft.selector.hidden_proj", K_MATRIX, -1, "candidate_selector.hidden_projection.weight",
                         R, H, err);
        for (int b = 0; b < 2 && !rc; b++)
            rc = plan_matrix(p, f, books[b][0], K_MATRIX, -1, splash_st_find(p->st, books[b][1]) ? books[b][1] : books[b][2],
                             V, R, err);
    }
    if (!rc) {
        size_t n_st = splash_st_count(p->dst), unused = 0;
        const char *first = NULL;
        for (size_t i = 0; i < n_st; i++)
            if (!p->dused[i]) {
                if (!first) first = splash_st_at(p->dst, i)->name;
                unused++;
            }
        if (unused)
            fprintf(stderr, "splash pack: warning: %zu draft tensors are not used (first: %s)\n", unused, first);
    }
done:
    p->st = tst;
    p->used = tused;
    p->prefix = tprefix;
    p->from = p->opt->from;
    return rc;
}

static json_value *int_array(const int64_t *v, int64_t n) {
    json_value *a = json_new(JSON_ARRAY);
    for (int64_t i = 0; i < n; i++) json_arr_push(a, json_new_int(v[i]));
    return a;
}

static json_value *draft_json(packer *p) {
    const draft_cfg *d = &p->dc;
    json_value *m = json_new(JSON_OBJECT);
    json_obj_set(m, "architecture", json_new_string(d->v2 ? "dflash2" : "dflash"));
    if (d->v2) json_obj_set(m, "source_architecture", json_new_string("DFlash2DraftModel"));
    char *abs = realpath(p->opt->draft, NULL);
    json_obj_set(m, "source", json_new_string(abs ? abs : p->opt->draft));
    free(abs);
    json_obj_set(m, "block_size", json_new_int(d->block_size));
    json_obj_set(m, "mask_token_id", json_new_int(d->mask_token_id));
    json_obj_set(m, "target_layer_ids", int_array(d->taps, d->n_taps));
    json_obj_set(m, "hidden", json_new_int(d->hidden));
    json_obj_set(m, "layers", json_new_int(d->layers));
    json_obj_set(m, "heads", json_new_int(d->heads));
    json_obj_set(m, "kv_heads", json_new_int(d->kv_heads));
    json_obj_set(m, "head_dim", json_new_int(d->head_dim));
    json_obj_set(m, "intermediate", json_new_int(d->inter));
    json_obj_set(m, "rms_eps", num_from_config(p, d->rms_eps_v, d->rms_eps));
    json_obj_set(m, "rope_theta", num_from_config(p, d->rope_theta_v, d->rope_theta));
    json_value *lt = json_new(JSON_ARRAY), *ca = json_new(JSON_ARRAY);
    for (int64_t i = 0; i < d->layers; i++) {
        json_arr_push(lt, json_new_string(d->sliding[i] ? "sliding_attention" : "full_attention"));
        json_arr_push(ca, json_new_bool(d->causal[i]));
    }
    json_obj_set(m, "layer_types", lt);
    json_obj_set(m, "causal", ca);
    json_obj_set(m, "sliding_window", json_new_int(d->sliding_window));
    if (d->v2) {
        json_obj_set(m, "conv_kernel_size", json_new_int(d->conv_kernel));
        json_obj_set(m, "conv_group_size", json_new_int(d->conv_group));
        json_obj_set(m, "selector_rank", json_new_int(d->sel_rank));
        json_obj_set(m, "selector_top_k", json_new_int(d->sel_top_k));
        json_obj_set(m, "output_multiplier", num_from_config(p, d->out_mult_v, d->out_mult));
        json_obj_set(m, "final_logit_softcapping", num_from_config(p, d->softcap_v, d->softcap));
        json_obj_set(m, "input_embedding_scale", num_from_config(p, d->embed_scale_v, d->embed_scale));
    }
    return m;
}

/* Every planned .bin file into p->tmp, in plan order; records the files in
 * p->file_list and the tensors in `tensors`. */
static int write_bins(packer *p, json_value *tensors, splash_error *err) {
    int rc = SPLASH_OK;
    size_t next = 0;
    for (size_t fi = 0; !rc && fi < p->n_files; fi++) {
        out_file f;
        rc = of_open(&f, p->tmp, p->files[fi], err);
        if (rc) {
            of_abort(&f);
            break;
        }
        while (!rc && next < p->n_specs && p->specs[next].file == (int)fi) rc = write_spec(p, &f, &p->specs[next++], tensors, err);
        if (!rc) rc = of_close(p, &f, SPLASH_SECTION_ALIGN, err);
        else of_abort(&f);
        if (!rc && p->opt->progress) fprintf(stderr, "  %s\n", p->files[fi]);
    }
    return rc;
}

/* Writes `manifest` as PKG.tmp/manifest.json and fsyncs it. */
static int write_manifest_file(packer *p, const json_value *manifest, splash_error *err) {
    strbuf sb;
    sb_init(&sb);
    write_manifest_text(&sb, manifest);
    char *mpath = splash_path_join(p->tmp, "manifest.json");
    int rc = sb.oom ? splash_fail(err, SPLASH_E_NOMEM, "out of memory writing the manifest")
                    : splash_write_file(mpath, sb.data, sb.len, err);
    if (!rc) {
        int fd = open(mpath, O_RDONLY);
        if (fd < 0 || fsync(fd) != 0) rc = splash_fail(err, SPLASH_E_IO, "%s: fsync failed", mpath);
        if (fd >= 0) close(fd);
    }
    free(mpath);
    sb_free(&sb);
    return rc;
}

static int write_package(packer *p, splash_error *err) {
    json_value *manifest = json_new(JSON_OBJECT);
    json_value *tensors = json_new(JSON_ARRAY);
    p->file_list = json_new(JSON_ARRAY);
    int rc = SPLASH_OK;
    char *target = splash_path_join(p->tmp, "target");
    rc = splash_mkdirs(target, err);
    free(target);
    if (!rc && p->dst) {
        char *dd = splash_path_join(p->tmp, "draft");
        rc = splash_mkdirs(dd, err);
        free(dd);
    }
    if (!rc) rc = write_bins(p, tensors, err);
    json_obj_set(manifest, "format", json_new_string(SPLASH_PACKAGE_FORMAT));
    json_obj_set(manifest, "version", json_new_int(SPLASH_PACKAGE_VERSION));
    json_obj_set(manifest, "architecture", json_new_string(p->cfg.moe ? "qwen3_5_moe" : "qwen3_5"));
    json_obj_set(manifest, "source", source_json(p));
    json_value *q = json_new(JSON_OBJECT);
    json_obj_set(q, "weights", json_new_string(splash_dtype_name(p->opt->weights)));
    json_obj_set(q, "group_size", json_new_int(SPLASH_QGROUP));
    json_obj_set(manifest, "quantization", q);
    json_obj_set(manifest, "model", model_json(p));
    if (p->dst) json_obj_set(manifest, "draft", draft_json(p));
    if (p->opt->default_reasoning_effort || p->opt->default_block_size) {
        json_value *serving = json_new(JSON_OBJECT);
        if (p->opt->default_reasoning_effort)
            json_obj_set(serving, "reasoning_effort", json_new_string(p->opt->default_reasoning_effort));
        if (p->opt->default_block_size) json_obj_set(serving, "block_size", json_new_int(p->opt->default_block_size));
        json_obj_set(manifest, "serving", serving);
    }
    if (!rc) rc = build_tokens(p, manifest, err);
    if (!rc) {
        json_obj_set(manifest, "tensors", tensors);
        tensors = NULL;
        json_obj_set(manifest, "files", p->file_list);
        p->file_list = NULL;
        rc = write_manifest_file(p, manifest, err);
        if (!rc) {
            fsync_tmp_sub(p, "target");
            if (p->dst) fsync_tmp_sub(p, "draft");
            fsync_dir(p->tmp);
        }
    }
    json_free(tensors);
    json_free(p->file_list);
    p->file_list = NULL;
    json_free(manifest);
    return rc;
}

/* p->tmp = "<base>.tmp-XXXXXX", a fresh directory beside base (so that
 * renames out of it stay on one file system). */
static int make_tmp(packer *p, const char *base, splash_error *err) {
    size_t n = strlen(base) + 16;
    p->tmp = xmalloc(n);
    snprintf(p->tmp, n, "%s.tmp-XXXXXX", base);
    /* strip trailing slashes of base before the suffix */
    char *q = strstr(p->tmp, ".tmp-XXXXXX");
    while (q > p->tmp && q[-1] == '/') memmove(q - 1, q, strlen(q) + 1), q--;
    if (!mkdtemp(p->tmp)) {
        int rc = splash_fail(err, SPLASH_E_IO, "%s: cannot create a temporary directory: %s", p->tmp, strerror(errno));
        free(p->tmp);
        p->tmp = NULL;
        return rc;
    }
    chmod(p->tmp, 0755);
    return SPLASH_OK;
}

/* Frees everything a packer holds (p->tmp is removed first when set). */
static void packer_free(packer *p) {
    if (p->tmp) {
        splash_remove_tree(p->tmp);
        free(p->tmp);
        p->tmp = NULL;
    }
    if (p->pool) splash_pool_destroy(p->pool);
    for (size_t i = 0; i < p->n_specs; i++) free(p->specs[i].slices);
    free(p->specs);
    for (size_t i = 0; i < p->n_files; i++) free(p->files[i]);
    free(p->files);
    free(p->used);
    free(p->cfg.full);
    if (p->st) splash_st_close(p->st);
    if (p->dst) splash_st_close(p->dst);
    free(p->dused);
    free(p->dc.sliding);
    free(p->dc.causal);
    json_free(p->dconfig);
    free(p->dconfig_path);
    json_free(p->config);
}

int splash_pack(const splash_pack_options *opt, splash_pack_stats *stats, splash_error *err) {
    double t0 = now_s();
    splash_pack_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    if (!opt->from || !opt->out) return splash_fail(err, SPLASH_E_INVALID, "pack needs --from and --out");
    if (opt->weights != SPLASH_Q4 && opt->weights != SPLASH_Q8 && opt->weights != SPLASH_BF16)
        return splash_fail(err, SPLASH_E_INVALID, "--weights must be q4, q8 or bf16");
    if (!opt->force && (splash_is_dir(opt->out) || splash_is_file(opt->out)))
        return splash_fail(err, SPLASH_E_INVALID, "%s already exists (remove it or pass --force)", opt->out);

    packer P, *p = &P;
    memset(p, 0, sizeof *p);
    p->opt = opt;
    p->stats = stats;
    char *config_path = splash_path_join(opt->from, "config.json");
    p->config_path = config_path;
    p->from = opt->from;
    int rc = read_config(p, err);
    if (!rc) rc = splash_st_open(opt->from, &p->st, err);
    if (!rc && opt->draft) {
        p->dconfig_path = splash_path_join(opt->draft, "config.json");
        rc = read_draft_config(p, err);
        if (!rc) rc = splash_st_open(opt->draft, &p->dst, err);
        if (!rc) p->dused = xcalloc(splash_st_count(p->dst) + 1, 1);
    }
    if (!rc) {
        p->used = xcalloc(splash_st_count(p->st) + 1, 1);
        rc = plan(p, err);
    }
    if (!rc) {
        char *parent = parent_dir(opt->out);
        rc = splash_mkdirs(parent, err);
        free(parent);
    }
    if (!rc) rc = make_tmp(p, opt->out, err);
    if (!rc) {
        p->pool = splash_pool_create(opt->threads);
        rc = write_package(p, err);
    }
    if (!rc) rc = commit(p, err);
    snprintf(stats->architecture, sizeof stats->architecture, "%s", p->cfg.moe ? "qwen3_5_moe" : "qwen3_5");
    packer_free(p);
    free(config_path);
    stats->seconds = now_s() - t0;
    return rc;
}

/* ---- a draft into an existing package (--into) -------------------------------------
 *
 * The target's checkpoint is not needed: the draft is checked (read_draft_config,
 * plan_draft: the same code as --draft) against the dimensions the package's
 * manifest records in "model", planned and written by the same functions, and
 * the manifest is rewritten with the target's entries as they were.  The result
 * equals a package packed in one go with --from ... --draft: the draft's
 * tensors after the target's, its files after the last target/ file, and the
 * "draft" object after "model" (or where the replaced one was).
 *
 * Commit: everything is written into PKG.tmp-XXXXXX (draft/..., manifest.json)
 * and fsynced first; then an existing PKG/draft moves aside, the new draft/
 * moves in, and the new manifest replaces the old one last; a failing rename
 * undoes the earlier ones.  Target files are never opened for writing. */

/* The target dimensions a draft is checked against, from manifest "model". */
static int cfg_from_manifest(packer *p, const json_value *m, const char *mpath, splash_error *err) {
    const json_value *model = json_get(m, "model");
    const char *keys[3] = {"hidden", "layers", "vocab"};
    int64_t *outs[3] = {&p->cfg.hidden, &p->cfg.layers, &p->cfg.vocab};
    if (!model || model->type != JSON_OBJECT)
        return splash_fail(err, SPLASH_E_FORMAT, "%s: no \"model\" object", mpath);
    for (int i = 0; i < 3; i++) {
        const json_value *v = json_get(model, keys[i]);
        if (!v || json_int64(v, outs[i]) || *outs[i] <= 0)
            return splash_fail(err, SPLASH_E_FORMAT, "%s: model.%s must be a positive integer", mpath, keys[i]);
    }
    p->cfg.moe = !strcmp(json_get_string(m, "architecture", ""), "qwen3_5_moe");
    return SPLASH_OK;
}

static int is_draft_file(const json_value *e) { return starts_with(json_get_string(e, "path", ""), "draft/"); }

/* The old manifest with its draft (object, tensors, files) replaced by the new
 * one; takes ownership of draft, tensors and files. */
/* The old manifest's "serving" with block_size set (block_size > 0), or a copy of it. */
static json_value *attach_serving(const json_value *old, int block_size) {
    json_value *s = old && old->type == JSON_OBJECT ? json_clone(old) : json_new(JSON_OBJECT);
    if (block_size > 0) json_obj_set(s, "block_size", json_new_int(block_size)); /* replaces one there */
    return s;
}

static json_value *attach_manifest(const json_value *old, json_value *draft, json_value *tensors, json_value *files,
                                   int block_size) {
    json_value *m = json_new(JSON_OBJECT);
    int had_draft = json_get(old, "draft") != NULL, had_serving = json_get(old, "serving") != NULL;
    for (size_t i = 0; i < old->count; i++) {
        const char *k = old->keys[i];
        const json_value *v = old->items[i];
        if (!strcmp(k, "draft")) {
            json_obj_set(m, k, draft);
            draft = NULL;
        } else if (!strcmp(k, "tensors") && v->type == JSON_ARRAY) {
            json_value *a = json_new(JSON_ARRAY);
            for (size_t t = 0; t < v->count; t++)
                if (!starts_with(json_get_string(v->items[t], "name", ""), "draft.")) json_arr_push(a, json_clone(v->items[t]));
            for (size_t t = 0; t < tensors->count; t++) json_arr_push(a, json_clone(tensors->items[t]));
            json_obj_set(m, k, a);
        } else if (!strcmp(k, "files") && v->type == JSON_ARRAY) {
            size_t after = 0; /* the new draft files go after the last target/ file */
            for (size_t f = 0; f < v->count; f++)
                if (starts_with(json_get_string(v->items[f], "path", ""), "target/")) after = f + 1;
            json_value *a = json_new(JSON_ARRAY);
            for (size_t f = 0; f <= v->count; f++) {
                if (f == after)
                    for (size_t n = 0; n < files->count; n++) json_arr_push(a, json_clone(files->items[n]));
                if (f < v->count && !is_draft_file(v->items[f])) json_arr_push(a, json_clone(v->items[f]));
            }
            json_obj_set(m, k, a);
        } else if (!strcmp(k, "serving")) {
            json_obj_set(m, k, attach_serving(v, block_size));
        } else {
            json_obj_set(m, k, json_clone(v));
        }
        if (!strcmp(k, "model") && !had_draft) {
            json_obj_set(m, "draft", draft);
            draft = NULL;
        }
    }
    if (draft) json_obj_set(m, "draft", draft);
    if (!had_serving && block_size > 0) json_obj_set(m, "serving", attach_serving(NULL, block_size));
    json_free(tensors);
    json_free(files);
    return m;
}

/* Moves PKG.tmp/draft and PKG.tmp/manifest.json into PKG (see above). */
static int commit_draft(packer *p, const char *pkg, splash_error *err) {
    char *cur = splash_path_join(pkg, "draft"), *fresh = splash_path_join(p->tmp, "draft");
    char *man = splash_path_join(pkg, "manifest.json"), *fresh_man = splash_path_join(p->tmp, "manifest.json");
    char *old = NULL;
    int rc = SPLASH_OK;
    if (splash_is_dir(cur) || splash_is_file(cur)) {
        old = splash_path_join(p->tmp, "draft.old"); /* inside PKG.tmp: removed with it */
        if (rename(cur, old) != 0) {
            rc = splash_fail(err, SPLASH_E_IO, "%s: cannot move the old draft aside: %s", cur, strerror(errno));
            goto done;
        }
    }
    if (rename(fresh, cur) != 0) {
        rc = splash_fail(err, SPLASH_E_IO, "cannot rename %s to %s: %s", fresh, cur, strerror(errno));
        if (old) rename(old, cur);
        goto done;
    }
    if (rename(fresh_man, man) != 0) {
        rc = splash_fail(err, SPLASH_E_IO, "cannot rename %s to %s: %s", fresh_man, man, strerror(errno));
        rename(cur, fresh);
        if (old) rename(old, cur);
        goto done;
    }
    fsync_dir(pkg);
done:
    free(cur);
    free(fresh);
    free(man);
    free(fresh_man);
    free(old);
    return rc;
}

int splash_pack_draft_into(const splash_pack_options *opt, splash_pack_stats *stats, splash_error *err) {
    double t0 = now_s();
    splash_pack_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    if (!opt->into || !opt->draft) return splash_fail(err, SPLASH_E_INVALID, "pack --into needs --draft");
    splash_pack_options o = *opt;
    o.from = NULL;
    packer P, *p = &P;
    memset(p, 0, sizeof *p);
    p->opt = &o;
    p->stats = stats;

    /* the package as it is: opened (format, files, sizes) and its manifest kept */
    splash_package *pkg = NULL;
    int rc = splash_package_open(opt->into, &pkg, err);
    if (rc) return rc;
    json_value *old = json_clone(splash_package_manifest(pkg));
    splash_package_close(pkg);
    char *mpath = splash_path_join(opt->into, "manifest.json");
    json_value *tensors = NULL, *draft = NULL, *manifest = NULL;
    const json_value *had = json_get(old, "draft");
    if (had && !opt->force)
        rc = splash_fail(err, SPLASH_E_INVALID, "%s already has a draft (%s from %s): pass --force to replace it",
                         opt->into, json_get_string(had, "architecture", "?"), json_get_string(had, "source", "?"));
    if (!rc) rc = cfg_from_manifest(p, old, mpath, err);
    if (!rc && !opt->weights_given) { /* the draft is quantised like the target */
        const json_value *q = json_get(old, "quantization");
        int t = splash_dtype_parse(q ? json_get_string(q, "weights", "") : "");
        if (t != SPLASH_Q4 && t != SPLASH_Q8 && t != SPLASH_BF16)
            rc = splash_fail(err, SPLASH_E_FORMAT, "%s: quantization.weights must be q4, q8 or bf16 (or pass --weights)",
                             mpath);
        else o.weights = (splash_dtype)t;
    }
    if (!rc && o.weights != SPLASH_Q4 && o.weights != SPLASH_Q8 && o.weights != SPLASH_BF16)
        rc = splash_fail(err, SPLASH_E_INVALID, "--weights must be q4, q8 or bf16");

    /* the draft: checked and planned exactly as with --from ... --draft */
    if (!rc) {
        p->dconfig_path = splash_path_join(opt->draft, "config.json");
        rc = read_draft_config(p, err);
    }
    if (!rc) rc = splash_st_open(opt->draft, &p->dst, err);
    if (!rc) {
        p->dused = xcalloc(splash_st_count(p->dst) + 1, 1);
        rc = plan_draft(p, err);
    }
    if (!rc) choose_dtypes(p);

    /* written beside the package, then moved in */
    if (!rc) rc = make_tmp(p, opt->into, err);
    if (!rc) {
        char *dd = splash_path_join(p->tmp, "draft");
        rc = splash_mkdirs(dd, err);
        free(dd);
    }
    if (!rc) {
        p->pool = splash_pool_create(opt->threads);
        tensors = json_new(JSON_ARRAY);
        p->file_list = json_new(JSON_ARRAY);
        rc = write_bins(p, tensors, err);
    }
    if (!rc) {
        draft = draft_json(p);
        manifest = attach_manifest(old, draft, tensors, p->file_list, opt->default_block_size);
        draft = tensors = NULL;
        p->file_list = NULL;
        rc = write_manifest_file(p, manifest, err);
    }
    if (!rc) {
        fsync_tmp_sub(p, "draft");
        fsync_dir(p->tmp);
        rc = commit_draft(p, opt->into, err);
    }
    json_free(tensors);
    json_free(p->file_list);
    p->file_list = NULL;
    json_free(manifest);
    json_free(old);
    free(mpath);
    snprintf(stats->architecture, sizeof stats->architecture, "%s", p->dc.v2 ? "dflash2" : "dflash");
    packer_free(p);
    stats->seconds = now_s() - t0;
    return rc;
}
