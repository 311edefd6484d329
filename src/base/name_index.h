/* name_index.h - find an array element by its name in O(1).
 *
 * The array (tensors of a package, of a safetensors file...) stays the
 * caller's; the index holds only positions, in an open-addressing table of
 * twice the element count, and asks the caller for the name at a position.
 */
#ifndef SPLASH_NAME_INDEX_H
#define SPLASH_NAME_INDEX_H

#include <stddef.h>

typedef const char *(*splash_name_at)(const void *items, size_t i);

typedef struct splash_name_index {
    size_t *slots; /* position + 1, 0 = empty */
    size_t size;   /* power of two, or 0 before init */
    splash_name_at name_at;
    const void *items;
} splash_name_index;

/* Sizes the index for n names of items (whose names name_at gives). */
void splash_name_index_init(splash_name_index *ix, size_t n, splash_name_at name_at, const void *items);
void splash_name_index_free(splash_name_index *ix);
/* Adds position i: returns -1, or the position that already has that name
 * (then nothing is added). */
long splash_name_index_add(splash_name_index *ix, size_t i);
/* The position named name, or -1. */
long splash_name_index_find(const splash_name_index *ix, const char *name);

#endif
