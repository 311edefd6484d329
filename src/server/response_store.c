/* response_store.c - a mutex, a doubly linked list in use order (most recent
 * first) and a linear search by id.  A linear search is enough: the store
 * holds at most a few thousand entries and a lookup costs one strcmp each,
 * next to a request that then renders and tokenizes a whole conversation. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "server/response_store.h"

typedef struct entry {
    struct entry *prev, *next;
    char *id, *response, *items;
    size_t response_len, items_len, bytes;
} entry;

struct srv_response_store {
    pthread_mutex_t mu;
    entry *head, *tail;
    size_t n, bytes, max_entries, max_bytes;
};

srv_response_store *srv_response_store_new(size_t max_entries, size_t max_bytes) {
    srv_response_store *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    pthread_mutex_init(&s->mu, NULL);
    s->max_entries = max_entries;
    s->max_bytes = max_bytes;
    return s;
}

static void unlink_entry(srv_response_store *s, entry *e) {
    if (e->prev) e->prev->next = e->next;
    else s->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else s->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(srv_response_store *s, entry *e) {
    e->next = s->head;
    if (s->head) s->head->prev = e;
    s->head = e;
    if (!s->tail) s->tail = e;
}

static void drop(srv_response_store *s, entry *e) {
    unlink_entry(s, e);
    s->n--;
    s->bytes -= e->bytes;
    free(e->id);
    free(e->response);
    free(e->items);
    free(e);
}

static entry *find(srv_response_store *s, const char *id) {
    for (entry *e = s->head; e; e = e->next)
        if (!strcmp(e->id, id)) return e;
    return NULL;
}

void srv_response_store_free(srv_response_store *s) {
    if (!s) return;
    while (s->head) drop(s, s->head);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static char *copy(const char *p, size_t n) {
    char *c = malloc(n + 1);
    if (c) {
        memcpy(c, p, n);
        c[n] = 0;
    }
    return c;
}

int srv_response_store_put(srv_response_store *s, const char *id, const char *response, size_t response_len,
                           const char *items, size_t items_len) {
    size_t bytes = strlen(id) + response_len + items_len + sizeof(entry);
    if (bytes > s->max_bytes) return SPLASH_E_RANGE;
    entry *e = calloc(1, sizeof *e);
    if (!e || !(e->id = strdup(id)) || !(e->response = copy(response, response_len)) ||
        !(e->items = copy(items, items_len))) {
        if (e) {
            free(e->id);
            free(e->response);
        }
        free(e);
        return SPLASH_E_NOMEM;
    }
    e->response_len = response_len;
    e->items_len = items_len;
    e->bytes = bytes;
    pthread_mutex_lock(&s->mu);
    entry *old = find(s, id);
    if (old) drop(s, old);
    while (s->tail && (s->n + 1 > s->max_entries || s->bytes + bytes > s->max_bytes)) drop(s, s->tail);
    push_front(s, e);
    s->n++;
    s->bytes += bytes;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int srv_response_store_get(srv_response_store *s, const char *id, strbuf *response, strbuf *items) {
    pthread_mutex_lock(&s->mu);
    entry *e = find(s, id);
    if (e) {
        unlink_entry(s, e);
        push_front(s, e);
        if (response) sb_append(response, e->response, e->response_len);
        if (items) sb_append(items, e->items, e->items_len);
    }
    pthread_mutex_unlock(&s->mu);
    return e ? 0 : SPLASH_E_NOTFOUND;
}

int srv_response_store_delete(srv_response_store *s, const char *id) {
    pthread_mutex_lock(&s->mu);
    entry *e = find(s, id);
    if (e) drop(s, e);
    pthread_mutex_unlock(&s->mu);
    return e ? 0 : SPLASH_E_NOTFOUND;
}

void srv_response_store_usage(srv_response_store *s, size_t *entries, size_t *bytes) {
    pthread_mutex_lock(&s->mu);
    *entries = s->n;
    *bytes = s->bytes;
    pthread_mutex_unlock(&s->mu);
}
