/* mem.h - the two allocator tiers.
 *
 * x*(): for start-up and tools, where running out of memory is fatal; they
 * print and abort instead of returning NULL.  Anything a request can trigger
 * uses plain malloc/calloc/realloc and handles NULL (SPLASH_E_NOMEM).
 */
#ifndef SPLASH_MEM_H
#define SPLASH_MEM_H

#include <stddef.h>

void *xmalloc(size_t n);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);

/* Allocation aligned to `align` bytes (a power of two >= sizeof(void*));
 * free with free().  Returns NULL on failure. */
void *splash_aligned_alloc(size_t align, size_t n);

#endif
