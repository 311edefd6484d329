/* logprobs.h - token log-probabilities in the two OpenAI reply shapes.
 *
 * The engine records, per generated token, a splash_logprobs (the raw model
 * log-softmax of the chosen token and of the top alternatives, see
 * runtime/sampling.h); these writers only format them:
 *
 *   Chat Completions: choices[].logprobs.content[] =
 *       {"token", "logprob", "bytes": [..], "top_logprobs": [{"token", "logprob", "bytes"}]}
 *   legacy completions: choices[].logprobs =
 *       {"tokens": [..], "token_logprobs": [..], "top_logprobs": [{token: logprob}], "text_offset": [..]}
 *
 * A token's string is its bytes as UTF-8 (a token that ends inside a
 * character shows U+FFFD; `bytes` has the exact bytes).  -inf (and NaN)
 * logprobs are written as -9999.0, as OpenAI does.
 */
#ifndef SPLASH_SERVER_LOGPROBS_H
#define SPLASH_SERVER_LOGPROBS_H

#include "base/strbuf.h"
#include "runtime/sampling.h"
#include "text/tokenizer.h"

/* One logprob as a JSON number. */
void srv_logprob_write(strbuf *b, float lp);

/* One Chat Completions content entry. */
void srv_logprobs_chat_entry(strbuf *b, const splash_tokenizer *tk, const splash_logprobs *lp);

/* The legacy object, built token by token. */
typedef struct srv_legacy_logprobs {
    strbuf tokens, values, tops, offsets; /* the inside of each array */
    int n;
} srv_legacy_logprobs;

void srv_legacy_logprobs_init(srv_legacy_logprobs *l);
void srv_legacy_logprobs_free(srv_legacy_logprobs *l);
void srv_legacy_logprobs_add(srv_legacy_logprobs *l, const splash_tokenizer *tk, const splash_logprobs *lp,
                             size_t text_offset);
/* Writes the object and clears l for the next chunk. */
void srv_legacy_logprobs_write(strbuf *b, srv_legacy_logprobs *l);

#endif
