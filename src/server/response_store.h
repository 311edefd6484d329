/* response_store.h - the bounded in-memory store of the Responses API.
 *
 * `store: true` (the default) keeps a response so that GET
 * /v1/responses/{id} can return it, DELETE can remove it and a later request
 * can continue it with previous_response_id.  For that last use an entry
 * also keeps the conversation the response ends: every input item of the
 * chain (earlier responses' included) followed by its output items, as one
 * JSON array text, so a continuation renders the same prompt bytes as a
 * client re-sending its whole history would.
 *
 * Bounded two ways, the least recently used entry going first: a number of
 * entries and a number of bytes.  Nothing is written to disk: a restart
 * forgets everything (a later previous_response_id is a 404, as for an
 * expired response).  Thread-safe (one mutex; entries are copied in and out).
 */
#ifndef SPLASH_RESPONSE_STORE_H
#define SPLASH_RESPONSE_STORE_H

#include <stddef.h>

#include "base/status.h"
#include "base/strbuf.h"

typedef struct srv_response_store srv_response_store;

/* NULL when out of memory. */
srv_response_store *srv_response_store_new(size_t max_entries, size_t max_bytes);
void srv_response_store_free(srv_response_store *s);

/* Copies the response object and the conversation in, replacing an entry of
 * the same id.  SPLASH_E_RANGE when the one entry is larger than max_bytes,
 * SPLASH_E_NOMEM. */
int srv_response_store_put(srv_response_store *s, const char *id, const char *response, size_t response_len,
                           const char *items, size_t items_len);
/* Appends the stored texts to response and / or items (either may be NULL)
 * and marks the entry as used.  0, or SPLASH_E_NOTFOUND. */
int srv_response_store_get(srv_response_store *s, const char *id, strbuf *response, strbuf *items);
/* 0, or SPLASH_E_NOTFOUND. */
int srv_response_store_delete(srv_response_store *s, const char *id);
/* Entries and bytes held now. */
void srv_response_store_usage(srv_response_store *s, size_t *entries, size_t *bytes);

#endif
