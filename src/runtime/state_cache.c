/* state_cache.c - budgeted recurrent-state snapshots (see state_cache.h). */
#include "runtime/state_cache.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "runtime/model.h"
#include "runtime/prefix_cache.h"

int splash_state_cache_init(splash_state_cache *sc, splash_model *model, size_t state_bytes, int max_snaps) {
    memset(sc, 0, sizeof *sc);
    sc->model = model;
    sc->state_bytes = state_bytes;
    sc->max_snaps = max_snaps > 0 ? max_snaps : 0;
    sc->snaps = calloc((size_t)(sc->max_snaps ? sc->max_snaps : 1), sizeof *sc->snaps);
    return sc->snaps ? 0 : SPLASH_E_NOMEM;
}

void splash_state_cache_free(splash_state_cache *sc) {
    for (int i = 0; sc->snaps && i < sc->max_snaps; i++)
        if (sc->snaps[i].buf) splash_state_cache_drop(sc, i);
    free(sc->snaps);
    memset(sc, 0, sizeof *sc);
}

void splash_state_cache_drop(splash_state_cache *sc, int i) {
    splash_snap *s = &sc->snaps[i];
    if (!s->buf) return;
    if (s->node && s->node->snap == i) s->node->snap = -1;
    if (sc->model) splash_model_free_memory(sc->model, s->buf);
    else free(s->buf);
    memset(s, 0, sizeof *s);
    sc->n_held--;
}

int splash_state_cache_take(splash_state_cache *sc, int kind, uint64_t tick) {
    if (!sc->max_snaps || !sc->state_bytes) return -1;
    int freei = -1;
    for (int i = 0; i < sc->max_snaps && freei < 0; i++)
        if (!sc->snaps[i].buf) freei = i;
    if (freei < 0) { /* evict: lowest kind first, then least recently used */
        int best = -1;
        for (int i = 0; i < sc->max_snaps; i++) {
            const splash_snap *s = &sc->snaps[i];
            if (s->kind > kind) continue; /* never trade a more useful snapshot for a less useful one */
            if (best < 0 || s->kind < sc->snaps[best].kind ||
                (s->kind == sc->snaps[best].kind && s->last_used < sc->snaps[best].last_used))
                best = i;
        }
        if (best < 0) return -1;
        splash_state_cache_drop(sc, best);
        sc->evicted++;
        freei = best;
    }
    void *buf = sc->model ? splash_model_alloc_memory(sc->model, sc->state_bytes) : calloc(1, sc->state_bytes);
    if (!buf) return -1;
    sc->snaps[freei] = (splash_snap){buf, NULL, kind, tick};
    sc->n_held++;
    sc->taken++;
    return freei;
}
