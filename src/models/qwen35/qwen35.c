/* qwen35.c - the Qwen3.5 model behind splash_model_* (the ops table):
 * loading (dimensions, weights, scratch), the memory the model declares and
 * the runtime attaches, slots, commit of verified rows, snapshot / restore.
 * The forward pass is in forward.c.
 *
 * Everything a forward needs is allocated here, at load (activations for
 * max_rows rows, the verify save, per-thread GDN scratch; the CPU context
 * holds the attention blocks), so a forward never allocates.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "models/qwen35/qwen35.h"

#define DEFAULT_MAX_ROWS 512

static size_t maxz(size_t a, size_t b) { return a > b ? a : b; }

/* One scratch array of n floats, 64-byte aligned, counted in needs. */
static float *scratch(qwen35_model *m, size_t n, int *bad) {
    if (n == 0) n = 1;
    float *p = splash_aligned_alloc(64, n * sizeof(float));
    if (!p) *bad = 1;
    m->needs.scratch_bytes += n * sizeof(float);
    return p;
}

static void print_profile(const qwen35_model *m) {
    static const char *names[QWEN35_PROF_N] = {"embed", "norms", "attn q/k/v + rope", "attn kv write", "attn core",
                                               "attn gate + o_proj", "gdn projections", "gdn core", "gdn out_proj",
                                               "ffn", "final norm + lm_head"};
    double total = 0, cpu = 0;
    for (int k = 0; k < QWEN35_PROF_N; k++) total += m->prof[k], cpu += m->prof_cpu[k];
    fprintf(stderr, "profile: %ld forward calls, %ld rows, %.3f s wall, %.3f s CPU (all threads)\n", m->prof_calls,
            m->prof_rows, total, cpu);
    for (int k = 0; k < QWEN35_PROF_N; k++)
        fprintf(stderr, "  %-22s %9.3f s %5.1f%%  CPU %9.3f s\n", names[k], m->prof[k],
                total > 0 ? 100.0 * m->prof[k] / total : 0.0, m->prof_cpu[k]);
}

static void q_free(void *impl) {
    qwen35_model *m = impl;
    if (!m) return;
    if (m->profile) print_profile(m);
    float **bufs[] = {&m->x, &m->xn, &m->fo, &m->qkv, &m->mix1, &m->mix2, &m->mix3, &m->mix4, &m->gb, &m->ga,
                      &m->gg, &m->gbeta, &m->ff1, &m->ff2, &m->mx, &m->mo, &m->router, &m->topw, &m->erw,
                      &m->sgate, &m->verify_state, &m->verify_save};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(*bufs[i]);
    free(m->topk);
    free(m->erows);
    free(m->head_rows);
    free(m->head_tmp);
    free(m->pending);
    free(m->alanes);
    free(m->tap_layers);
    cpu_ctx_free(&m->cpu);
    qwen35_weights_free(&m->w, &m->d);
    free(m);
}

static int alloc_scratch(qwen35_model *m, splash_error *err) {
    const qwen35_dims *d = &m->d;
    size_t R = (size_t)m->max_rows, H = (size_t)d->hidden;
    size_t hd = (size_t)d->head_dim, qw = (size_t)d->heads * hd, kvw = (size_t)d->kv_heads * hd;
    size_t ffw = d->moe ? maxz((size_t)d->expert_inter, (size_t)d->shared_inter) : (size_t)d->intermediate;
    int bad = 0;
    m->x = scratch(m, R * H, &bad);
    m->xn = scratch(m, R * H, &bad);
    m->fo = scratch(m, R * H, &bad);
    m->qkv = scratch(m, R * maxz(2 * qw, (size_t)d->conv_dim), &bad);
    m->mix1 = scratch(m, R * maxz(qw, (size_t)d->conv_dim), &bad);
    m->mix2 = scratch(m, R * maxz(kvw, (size_t)d->value_dim), &bad);
    m->mix3 = scratch(m, R * maxz(kvw, (size_t)d->value_dim), &bad);
    m->mix4 = scratch(m, R * maxz(qw, (size_t)d->value_dim), &bad);
    size_t hv = (size_t)d->hv;
    m->gb = scratch(m, R * hv, &bad);
    m->ga = scratch(m, R * hv, &bad);
    m->gg = scratch(m, R * hv, &bad);
    m->gbeta = scratch(m, R * hv, &bad);
    m->ff1 = scratch(m, R * ffw, &bad);
    m->ff2 = scratch(m, R * ffw, &bad);
    if (d->moe) {
        m->mx = scratch(m, R * H, &bad);
        m->mo = scratch(m, R * H, &bad);
        m->router = scratch(m, R * (size_t)d->experts, &bad);
        m->topw = scratch(m, R * (size_t)d->top_k, &bad);
        m->erw = scratch(m, R, &bad);
        m->sgate = scratch(m, R, &bad);
        m->topk = calloc(R * (size_t)d->top_k, sizeof(int));
        m->erows = calloc(R, sizeof(int));
        if (!m->topk || !m->erows) bad = 1;
    }
    m->head_rows = calloc(R, sizeof(int));
    m->pending = calloc((size_t)m->max_lanes, sizeof *m->pending);
    m->alanes = calloc((size_t)m->max_lanes, sizeof *m->alanes);
    if (!m->head_rows || !m->pending || !m->alanes) bad = 1;
    if (d->n_gdn) {
        size_t delta = hv * (size_t)d->dk * (size_t)d->dv;
        m->verify_state = scratch(m, (size_t)m->max_lanes * delta, &bad);
        m->verify_cap = m->max_lanes * QWEN35_MAX_VERIFY_ROWS;
        if (m->verify_cap > m->max_rows) m->verify_cap = m->max_rows;
        m->verify_row_floats = (size_t)d->conv_dim + (size_t)d->key_dim + (size_t)d->value_dim + 2 * hv;
        m->verify_save = scratch(m, (size_t)d->n_gdn * (size_t)m->verify_cap * m->verify_row_floats, &bad);
    }
    if (bad)
        return splash_fail(err, SPLASH_E_NOMEM, "out of memory allocating %zu MiB of scratch for %d rows",
                           m->needs.scratch_bytes >> 20, m->max_rows);
    return 0;
}

/* The activations of q4/q8 products: auto = int8 when the package has q4/q8
 * matrices (bf16 packages have none, so the choice does not matter there). */
static int cpu_act_of(const splash_package *pkg, splash_cpu_act a) {
    switch (a) {
    case SPLASH_CPU_ACT_F32: return CPU_ACT_F32;
    case SPLASH_CPU_ACT_INT8: return CPU_ACT_I8;
    case SPLASH_CPU_ACT_INT16: return CPU_ACT_I16;
    default: break;
    }
    for (size_t i = 0; i < splash_package_tensor_count(pkg); i++) {
        splash_dtype t = splash_package_tensor_at(pkg, i)->dtype;
        if (t == SPLASH_Q4 || t == SPLASH_Q8) return QWEN35_DEFAULT_Q_ACT;
    }
    return CPU_ACT_F32;
}

static int q_load(splash_package *pkg, const splash_model_options *opt, void **impl, splash_error *err) {
    *impl = NULL;
    splash_model_options o;
    memset(&o, 0, sizeof o);
    if (opt) o = *opt;
    if (o.device && strcmp(o.device, "cpu"))
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "device \"%s\": this model runs on the CPU only for now", o.device);
    if (o.max_rows <= 0) o.max_rows = DEFAULT_MAX_ROWS;
    if (o.max_lanes <= 0) o.max_lanes = 1;
    if (o.n_taps < 0 || (o.n_taps > 0 && !o.tap_layers))
        return splash_fail(err, SPLASH_E_INVALID, "model options: n_taps %d without tap_layers", o.n_taps);
    qwen35_model *m = calloc(1, sizeof *m);
    if (!m) return splash_fail(err, SPLASH_E_NOMEM, "out of memory");
    int rc;
    const json_value *model = json_get(splash_package_manifest(pkg), "model");
    if ((rc = qwen35_dims_parse(model, splash_package_architecture(pkg), &m->d, err))) goto fail;
    const qwen35_dims *d = &m->d;
    if (d->n_attn && /* a model of GDN layers only has no pages (page_bytes 0), as the CUDA model */
        (rc = cpu_kv_layout_init(&m->kv, o.kv_format, d->n_attn, d->kv_heads, d->head_dim, QWEN35_PAGE_TOKENS))) {
        rc = splash_fail(err, rc, "KV format %d with head_dim %d: the CPU backend implements f32, bf16 and int8 "
                         "pages, head_dim up to %d", (int)o.kv_format, d->head_dim, CPU_KV_MAX_HEAD_DIM);
        goto fail;
    }
    for (int i = 0; i < o.n_taps; i++)
        if (o.tap_layers[i] < 0 || o.tap_layers[i] >= d->n_layers) {
            rc = splash_fail(err, SPLASH_E_INVALID, "model options: tap layer %d outside [0, %d)", o.tap_layers[i],
                             d->n_layers);
            goto fail;
        }
    if (o.n_taps) {
        m->tap_layers = xmalloc((size_t)o.n_taps * sizeof(int));
        memcpy(m->tap_layers, o.tap_layers, (size_t)o.n_taps * sizeof(int));
    }
    m->n_taps = o.n_taps;
    m->max_rows = o.max_rows;
    m->max_lanes = o.max_lanes;
    const char *prof = getenv("SPLASH_PROFILE");
    m->profile = prof && *prof && strcmp(prof, "0");
    if ((rc = qwen35_weights_bind(pkg, d, &m->w, err))) {
        splash_error_prefix(err, "%s", splash_package_dir(pkg));
        goto fail;
    }
    if (cpu_ctx_init(&m->cpu, o.threads, m->max_rows, m->w.max_cols)) {
        rc = splash_fail(err, SPLASH_E_NOMEM, "out of memory creating the CPU context");
        goto fail;
    }
    if ((unsigned)o.cpu_activations > SPLASH_CPU_ACT_INT16) {
        rc = splash_fail(err, SPLASH_E_INVALID, "model options: cpu_activations %d unknown", (int)o.cpu_activations);
        goto fail;
    }
    if (cpu_set_act(&m->cpu, cpu_act_of(pkg, o.cpu_activations))) {
        rc = splash_fail(err, SPLASH_E_NOMEM, "out of memory for the quantised activations");
        goto fail;
    }
    m->gdn_state_floats = d->n_gdn ? (size_t)(d->conv_kernel - 1) * d->conv_dim + (size_t)d->hv * d->dk * d->dv : 0;
    m->state_floats = (size_t)d->n_gdn * m->gdn_state_floats;
    m->needs.scratch_bytes = cpu_ctx_scratch_bytes(&m->cpu);
    if ((rc = alloc_scratch(m, err))) goto fail;
    m->needs.page_tokens = QWEN35_PAGE_TOKENS;
    m->needs.page_bytes = m->kv.page_bytes;
    m->needs.state_bytes = m->state_floats * sizeof(float);
    m->needs.weight_bytes = m->w.bytes;
    m->needs.vocab = d->vocab;
    m->needs.max_top = d->vocab < SPLASH_MAX_TOP ? d->vocab : SPLASH_MAX_TOP;
    m->needs.hidden = d->hidden;
    m->needs.max_positions = d->max_positions;
    *impl = m;
    return 0;
fail:
    q_free(m);
    return rc;
}

static const splash_model_needs *q_needs(const void *impl) { return &((const qwen35_model *)impl)->needs; }

static int q_attach(void *impl, void *kv_pages, int n_pages, void *states, int n_slots, splash_error *err) {
    qwen35_model *m = impl;
    if (n_pages < 0 || n_slots < 1 || (n_pages > 0 && !kv_pages) || (m->state_floats && !states))
        return splash_fail(err, SPLASH_E_INVALID, "attach: %d pages at %p, %d slots at %p", n_pages, kv_pages, n_slots,
                           states);
    size_t ctx = 0;
    if (m->d.n_attn) {
        ctx = (size_t)n_pages * QWEN35_PAGE_TOKENS;
        if (ctx > (size_t)m->d.max_positions) ctx = (size_t)m->d.max_positions;
    }
    m->max_context = ctx;
    m->kv_pool = kv_pages;
    m->n_pages = n_pages;
    m->states = states;
    m->n_slots = n_slots;
    m->n_pending = 0;
    return 0;
}

static void *q_alloc(void *impl, size_t bytes) {
    (void)impl;
    void *p = splash_aligned_alloc(64, bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

static void q_free_mem(void *impl, void *p) {
    (void)impl;
    free(p);
}

static int slot_ok(const qwen35_model *m, int slot) { return m->n_slots > 0 && slot >= 0 && slot < m->n_slots; }

static int q_reset(void *impl, int slot) {
    qwen35_model *m = impl;
    if (!slot_ok(m, slot)) return SPLASH_E_RANGE;
    if (m->state_floats) memset(m->states + (size_t)slot * m->state_floats, 0, m->state_floats * sizeof(float));
    for (int i = 0; i < m->n_pending; i++)
        if (m->pending[i].slot == slot) m->pending[i] = m->pending[--m->n_pending];
    return 0;
}

static int q_commit(void *impl, int slot, int n, splash_error *err) {
    qwen35_model *m = impl;
    if (!slot_ok(m, slot)) return splash_fail(err, SPLASH_E_RANGE, "commit: slot %d outside [0, %d)", slot, m->n_slots);
    int k = -1;
    for (int i = 0; i < m->n_pending; i++)
        if (m->pending[i].slot == slot) k = i;
    if (k < 0)
        return splash_fail(err, SPLASH_E_INVALID,
                           "commit: slot %d has no verified rows (commit follows the VERIFY forward, before the next one)",
                           slot);
    qwen35_pending p = m->pending[k];
    if (n < 0 || n > p.n_rows)
        return splash_fail(err, SPLASH_E_RANGE, "commit: %d rows accepted of the %d verified on slot %d", n, p.n_rows,
                           slot);
    if (n > 0 && m->d.n_gdn) qwen35_gdn_commit(m, &p, n);
    m->pending[k] = m->pending[--m->n_pending];
    return 0;
}

static int q_snapshot(void *impl, int slot, void *dst) {
    qwen35_model *m = impl;
    if (!slot_ok(m, slot) || (!dst && m->state_floats)) return SPLASH_E_RANGE;
    if (m->state_floats) memcpy(dst, m->states + (size_t)slot * m->state_floats, m->state_floats * sizeof(float));
    return 0;
}

static int q_restore(void *impl, int slot, const void *src) {
    qwen35_model *m = impl;
    if (!slot_ok(m, slot) || (!src && m->state_floats)) return SPLASH_E_RANGE;
    if (m->state_floats) memcpy(m->states + (size_t)slot * m->state_floats, src, m->state_floats * sizeof(float));
    for (int i = 0; i < m->n_pending; i++)
        if (m->pending[i].slot == slot) m->pending[i] = m->pending[--m->n_pending];
    return 0;
}

const splash_model_ops qwen35_ops = {
    .load = q_load,
    .free = q_free,
    .needs = q_needs,
    .attach_memory = q_attach,
    .alloc_memory = q_alloc,
    .free_memory = q_free_mem,
    .reset_slot = q_reset,
    .forward = qwen35_forward,
    .commit = q_commit,
    .snapshot = q_snapshot,
    .restore = q_restore,
};
