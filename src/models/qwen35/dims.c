/* dims.c - Qwen3.5 dimensions from the manifest's "model" object
 * (docs/package-format.md), every field checked: a package that disagrees
 * with what the code computes fails at load with the field named, never
 * later inside a kernel. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "models/qwen35/qwen35.h"

static int get_int(const json_value *obj, const char *where, const char *key, int min, int max, int *out,
                   splash_error *err) {
    int64_t v;
    const json_value *j = json_get(obj, key);
    if (!j || json_int64(j, &v) != 0)
        return splash_fail(err, SPLASH_E_FORMAT, "manifest model%s.%s: missing or not an integer", where, key);
    if (v < min || v > max)
        return splash_fail(err, SPLASH_E_FORMAT, "manifest model%s.%s = %lld: outside [%d, %d]", where, key, (long long)v,
                           min, max);
    *out = (int)v;
    return 0;
}

static int get_num(const json_value *obj, const char *where, const char *key, double *out, splash_error *err) {
    const json_value *j = json_get(obj, key);
    if (!j || j->type != JSON_NUMBER || !(j->num > 0) || !isfinite(j->num))
        return splash_fail(err, SPLASH_E_FORMAT, "manifest model%s.%s: missing or not a positive number", where, key);
    *out = j->num;
    return 0;
}

static int get_obj(const json_value *model, const char *key, const json_value **out, splash_error *err) {
    *out = json_get(model, key);
    if (!*out || (*out)->type != JSON_OBJECT)
        return splash_fail(err, SPLASH_E_FORMAT, "manifest model.%s: missing or not an object", key);
    return 0;
}

#define BIG (1 << 30)
#define TRY(x)                                                                                                         \
    do {                                                                                                               \
        int rc_ = (x);                                                                                                 \
        if (rc_) return rc_;                                                                                           \
    } while (0)

int qwen35_dims_parse(const json_value *model, const char *arch, qwen35_dims *d, splash_error *err) {
    memset(d, 0, sizeof *d);
    if (!model || model->type != JSON_OBJECT) return splash_fail(err, SPLASH_E_FORMAT, "manifest: \"model\" missing");
    if (!arch || (strcmp(arch, "qwen3_5") && strcmp(arch, "qwen3_5_moe")))
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "architecture \"%s\" is not qwen3_5 or qwen3_5_moe",
                           arch ? arch : "(none)");
    d->moe = !strcmp(arch, "qwen3_5_moe");
    TRY(get_int(model, "", "hidden", 1, BIG, &d->hidden, err));
    TRY(get_int(model, "", "layers", 1, QWEN35_MAX_LAYERS, &d->n_layers, err));
    TRY(get_int(model, "", "vocab", 1, BIG, &d->vocab, err));
    TRY(get_int(model, "", "max_positions", 1, BIG, &d->max_positions, err));
    double eps;
    TRY(get_num(model, "", "rms_eps", &eps, err));
    d->rms_eps = (float)eps;
    d->tie_embeddings = json_get_bool(model, "tie_embeddings", 0);

    const json_value *lt = json_get(model, "layer_types");
    if (!lt || lt->type != JSON_ARRAY || (int)lt->count != d->n_layers)
        return splash_fail(err, SPLASH_E_FORMAT, "manifest model.layer_types: not an array of %d layer types",
                           d->n_layers);
    for (int i = 0; i < d->n_layers; i++) {
        const char *t = json_string(json_at(lt, (size_t)i));
        if (t && !strcmp(t, "full_attention"))
            d->is_attn[i] = 1, d->n_attn++;
        else if (t && !strcmp(t, "linear_attention"))
            d->n_gdn++;
        else
            return splash_fail(err, SPLASH_E_FORMAT,
                               "manifest model.layer_types[%d]: \"%s\" is neither full_attention nor linear_attention", i,
                               t ? t : "(not a string)");
    }

    const json_value *o;
    if (d->n_attn) {
        TRY(get_obj(model, "attention", &o, err));
        TRY(get_int(o, ".attention", "heads", 1, 4096, &d->heads, err));
        TRY(get_int(o, ".attention", "kv_heads", 1, d->heads, &d->kv_heads, err));
        TRY(get_int(o, ".attention", "head_dim", 1, 4096, &d->head_dim, err));
        TRY(get_int(o, ".attention", "rotary_dim", 0, d->head_dim, &d->rotary_dim, err));
        TRY(get_num(o, ".attention", "rope_theta", &d->rope_theta, err));
        if (d->heads % d->kv_heads)
            return splash_fail(err, SPLASH_E_FORMAT, "manifest model.attention: heads %d not a multiple of kv_heads %d",
                               d->heads, d->kv_heads);
        if (d->rotary_dim % 2)
            return splash_fail(err, SPLASH_E_FORMAT, "manifest model.attention.rotary_dim %d: not even", d->rotary_dim);
    }
    if (d->n_gdn) {
        TRY(get_obj(model, "gdn", &o, err));
        TRY(get_int(o, ".gdn", "key_heads", 1, 4096, &d->hk, err));
        TRY(get_int(o, ".gdn", "value_heads", 1, 4096, &d->hv, err));
        TRY(get_int(o, ".gdn", "key_dim", 1, 4096, &d->dk, err));
        TRY(get_int(o, ".gdn", "value_dim", 1, CPU_GDN_MAX_DV, &d->dv, err));
        TRY(get_int(o, ".gdn", "conv_kernel", 1, 64, &d->conv_kernel, err));
        if (d->hv % d->hk)
            return splash_fail(err, SPLASH_E_FORMAT, "manifest model.gdn: value_heads %d not a multiple of key_heads %d",
                               d->hv, d->hk);
        d->key_dim = d->hk * d->dk;
        d->value_dim = d->hv * d->dv;
        d->conv_dim = 2 * d->key_dim + d->value_dim;
    }
    if (d->moe) {
        TRY(get_obj(model, "moe", &o, err));
        TRY(get_int(o, ".moe", "experts", 1, 65536, &d->experts, err));
        TRY(get_int(o, ".moe", "top_k", 1, d->experts, &d->top_k, err));
        TRY(get_int(o, ".moe", "expert_intermediate", 1, BIG, &d->expert_inter, err));
        TRY(get_int(o, ".moe", "shared_intermediate", 1, BIG, &d->shared_inter, err));
        d->norm_topk = json_get_bool(o, "norm_topk_prob", 1);
    } else {
        TRY(get_obj(model, "ffn", &o, err));
        TRY(get_int(o, ".ffn", "intermediate", 1, BIG, &d->intermediate, err));
    }
    return 0;
}
