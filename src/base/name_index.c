#include "name_index.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"

static uint64_t hash_name(const char *s) { /* FNV-1a */
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static size_t *slot_for(const splash_name_index *ix, const char *name) {
    size_t mask = ix->size - 1;
    for (size_t i = hash_name(name) & mask;; i = (i + 1) & mask) {
        size_t *s = &ix->slots[i];
        if (!*s || !strcmp(ix->name_at(ix->items, *s - 1), name)) return s;
    }
}

void splash_name_index_init(splash_name_index *ix, size_t n, splash_name_at name_at, const void *items) {
    size_t size = 16;
    while (size < n * 2) size *= 2;
    ix->slots = xcalloc(size, sizeof *ix->slots);
    ix->size = size;
    ix->name_at = name_at;
    ix->items = items;
}

void splash_name_index_free(splash_name_index *ix) {
    free(ix->slots);
    memset(ix, 0, sizeof *ix);
}

long splash_name_index_add(splash_name_index *ix, size_t i) {
    size_t *s = slot_for(ix, ix->name_at(ix->items, i));
    if (*s) return (long)(*s - 1);
    *s = i + 1;
    return -1;
}

long splash_name_index_find(const splash_name_index *ix, const char *name) {
    if (!ix->size) return -1;
    size_t *s = slot_for(ix, name);
    return *s ? (long)(*s - 1) : -1;
}
