/* tokenizer.h - the byte-level BPE tokenizer of Hugging Face `tokenizer.json`.
 *
 * Everything that defines the tokenization is read from the file, nothing is
 * hard-coded for a model: the vocabulary and merges, the added tokens (special
 * and not), the normaliser (NFC or none), the pre-tokenizer regex (the Qwen3
 * and Qwen3.5 files differ only there) and the byte-level mapping.  The goal is
 * ids identical to Hugging Face `tokenizers` (Rust) for every input; see
 * docs/tokenizer.md for what is supported and where the details come from.
 *
 * Lifetimes and threads: a splash_tokenizer is immutable after load except for
 * its internal piece cache, which is locked, so one tokenizer may be used by
 * any number of threads at once.  Encode and decode allocate their scratch per
 * call and append to caller-owned outputs.  A streaming decoder is a small
 * plain struct owned by its caller (one per generation stream), never shared
 * between threads, and allocates nothing.
 */
#ifndef SPLASH_TOKENIZER_H
#define SPLASH_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/strbuf.h"

typedef struct splash_tokenizer splash_tokenizer;

/* A growable array of token ids; zero-initialise, free with
 * splash_token_vec_free.  Encode appends to it. */
typedef struct splash_token_vec {
    int32_t *ids;
    size_t len, cap;
} splash_token_vec;

void splash_token_vec_free(splash_token_vec *v);
/* Appends one id; 0 or SPLASH_E_NOMEM. */
int splash_token_vec_push(splash_token_vec *v, int32_t id);

/* Loads `tokenizer.json`.  Fails with SPLASH_E_IO (missing file),
 * SPLASH_E_FORMAT (bad JSON or a malformed field) or SPLASH_E_UNSUPPORTED (a
 * model, normaliser, pre-tokenizer or decoder other than byte-level BPE with
 * NFC and regex splits), with a message naming the field. */
int splash_tokenizer_load(const char *tokenizer_json_path, splash_tokenizer **out, splash_error *err);
/* (A path ending in ".gz" is decompressed; when the path does not exist, path + ".gz" is
 * read instead: packages store tokenizer/tokenizer.json.gz.) */
/* The same from the file's text in memory; `name` is used in messages. */
int splash_tokenizer_load_json(const char *json, size_t len, const char *name, splash_tokenizer **out,
                               splash_error *err);
void splash_tokenizer_free(splash_tokenizer *tok);

/* Encode flags. */
enum {
    /* Recognise special added tokens (`"special": true`, e.g. <|im_end|>)
     * written in the text, as Hugging Face does by default.  Without it
     * their text is encoded as plain text (HF `encode_special_tokens=True`,
     * transformers `split_special_tokens=True`).  Non-special added tokens
     * (e.g. Qwen3's <tool_call>) are always recognised, as in HF. */
    SPLASH_ENCODE_SPECIAL = 1 << 0,
};

/* Encodes text[0..len) (which must be valid UTF-8) and appends the ids to
 * out.  SPLASH_E_INVALID for invalid UTF-8, SPLASH_E_NOMEM; on failure out
 * keeps its previous length. */
int splash_tokenizer_encode(const splash_tokenizer *tok, const char *text, size_t len, int flags,
                            splash_token_vec *out, splash_error *err);

/* Decode flags. */
enum {
    SPLASH_DECODE_SKIP_SPECIAL = 1 << 0, /* drop special added tokens */
};

/* Appends the bytes of ids[0..n) to out: raw bytes, which need not be valid
 * UTF-8 when the ids split a character (see splash_utf8_append_lossy).
 * SPLASH_E_RANGE names the first invalid id; out is then unchanged. */
int splash_tokenizer_decode(const splash_tokenizer *tok, const int32_t *ids, size_t n, int flags, strbuf *out,
                            splash_error *err);

/* Appends s[0..n) to out with every maximal invalid UTF-8 subsequence
 * replaced by U+FFFD, as Rust's String::from_utf8_lossy and the WHATWG
 * TextDecoder do (so decode + this equals Hugging Face's decode). */
void splash_utf8_append_lossy(strbuf *out, const char *s, size_t n);

/* Streaming decode for SSE deltas: feed ids one at a time; each call appends
 * only complete UTF-8 characters and holds back a trailing partial sequence
 * (at most 3 bytes) until the next id completes it.  Bytes that can never
 * become valid are emitted as U+FFFD at once, so the concatenation of every
 * output plus flush equals splash_utf8_append_lossy(decode(all ids)). */
typedef struct splash_detok_stream {
    const splash_tokenizer *tok;
    int flags;
    int n_pending;
    unsigned char pending[4];
} splash_detok_stream;

void splash_detok_stream_init(splash_detok_stream *s, const splash_tokenizer *tok, int flags);
/* SPLASH_E_RANGE for an invalid id (the stream is unchanged). */
int splash_detok_stream_feed(splash_detok_stream *s, int32_t id, strbuf *out, splash_error *err);
/* Emits what is held back (an incomplete sequence becomes U+FFFD) and resets. */
void splash_detok_stream_flush(splash_detok_stream *s, strbuf *out);

/* Lookups. */
/* One more than the largest id (model vocabulary and added tokens). */
size_t splash_tokenizer_vocab_size(const splash_tokenizer *tok);
/* The id of an added token by its content ("<|im_end|>"), else of a model
 * vocabulary entry by its byte-level string ("Ġthe"); -1 if none. */
int32_t splash_tokenizer_token_id(const splash_tokenizer *tok, const char *content);
/* The token as written in tokenizer.json ("Ġthe", "<|im_end|>"); NULL for an
 * id that names no token. */
const char *splash_tokenizer_token_str(const splash_tokenizer *tok, int32_t id);
/* The bytes the id decodes to (" the"); 0, or SPLASH_E_RANGE. */
int splash_tokenizer_token_bytes(const splash_tokenizer *tok, int32_t id, const char **bytes, size_t *len);
/* 1 for an added token with "special": true, else 0. */
int splash_tokenizer_is_special(const splash_tokenizer *tok, int32_t id);

#endif
