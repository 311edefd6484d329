/* tokenizer.c - encode, decode, streaming decode and lookups.
 *
 * Encode follows the stages of Hugging Face's TokenizerImpl::encode for a
 * single sequence, in the same order, because each stage's boundaries change
 * the result of the next:
 *   1. added tokens with "normalized": false are cut out of the raw text
 *      (leftmost-longest; special ones only with SPLASH_ENCODE_SPECIAL);
 *   2. each remaining section is normalised (NFC) on its own;
 *   3. added tokens with "normalized": true are cut out of the normalised text;
 *   4. the Split regexes cut each section into pieces (matches and the gaps
 *      between them are both pieces: behaviour Isolated);
 *   5. BPE turns each piece's bytes into ids (bpe.c).
 * Loading tokenizer.json is in tokenizer_load.c.
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/json.h"
#include "text/tokenizer_int.h"

/* ---- token vectors ------------------------------------------------------- */

void splash_token_vec_free(splash_token_vec *v) {
    free(v->ids);
    memset(v, 0, sizeof *v);
}

int splash_token_vec_push(splash_token_vec *v, int32_t id) {
    if (v->len == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 256;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p) return SPLASH_E_NOMEM;
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->len++] = id;
    return 0;
}

/* ---- character classes for lstrip / rstrip / single_word ------------------
 *
 * HF decides these with Rust `regex`: \s is Unicode White_Space, \w is
 * alphabetic, marks, decimal digits, connector punctuation and joiners. */

static int is_white_space(int32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static int is_word(int32_t c) {
    if (c == 0x200C || c == 0x200D) return 1;
    switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

/* The character starting at s[i] (valid UTF-8); *len its byte count. */
static int32_t char_at(const char *s, size_t n, size_t i, size_t *len) {
    utf8proc_int32_t c;
    utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
    *len = l > 0 ? (size_t)l : 1;
    return l > 0 ? c : -1;
}

/* The start of the character that ends at s[i] (i > 0). */
static size_t char_before(const char *s, size_t i) {
    do i--;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80);
    return i;
}

/* ---- encode -------------------------------------------------------------- */

typedef struct enc_ctx {
    const splash_tokenizer *tok;
    int flags;
    splash_token_vec *out;
    bpe_scratch scr;
    pcre2_match_data *md[TOK_MAX_SPLITS];
    splash_error *err;
} enc_ctx;

/* Stage 4 and 5: the regex splits, one level per Split step, then BPE. */
static int pretokenize(enc_ctx *c, int level, const char *s, size_t n) {
    if (n == 0) return 0;
    const splash_tokenizer *tok = c->tok;
    if (level == tok->n_split) return bpe_encode(&tok->bpe, (const uint8_t *)s, n, c->out, &c->scr);
    pcre2_code *re = tok->split[level].code;
    pcre2_match_data *md = c->md[level];
    size_t last = 0, pos = 0;
    int rc;
    while (pos <= n) {
        int m = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (m == PCRE2_ERROR_NOMATCH) break;
        if (m < 0) {
            PCRE2_UCHAR msg[200];
            pcre2_get_error_message(m, msg, sizeof msg);
            return splash_fail(c->err, m == PCRE2_ERROR_NOMEMORY ? SPLASH_E_NOMEM : SPLASH_E_RANGE,
                               "pre-tokenizer regex failed on a piece of %zu bytes: %s", n, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms > last && (rc = pretokenize(c, level + 1, s + last, ms - last))) return rc;
        if (me > ms && (rc = pretokenize(c, level + 1, s + ms, me - ms))) return rc;
        last = me;
        if (me == ms) { /* an empty match: step over one character, as Oniguruma's iterator does */
            size_t l;
            if (me >= n) break;
            char_at(s, n, me, &l);
            pos = me + l;
        } else {
            pos = me;
        }
    }
    return last < n ? pretokenize(c, level + 1, s + last, n - last) : 0;
}

/* The leftmost-longest added token in s[from..n): 1 and its span, or 0. */
static int find_added(const added_matcher *m, const char *s, size_t n, size_t from, size_t *ms, size_t *me, int32_t *token) {
    if (!m->n_tokens) return 0;
    const uint8_t *u = (const uint8_t *)s;
    for (size_t i = from; i < n; i++) {
        if (!m->first[u[i]]) continue;
        int32_t node = 0, best = -1;
        size_t best_end = 0;
        for (size_t j = i; j < n; j++) {
            int32_t ch = m->nodes[node].child;
            while (ch >= 0 && m->nodes[ch].byte != u[j]) ch = m->nodes[ch].sibling;
            if (ch < 0) break;
            node = ch;
            if (m->nodes[node].token >= 0) best = m->nodes[node].token, best_end = j + 1;
        }
        if (best >= 0) {
            *ms = i, *me = best_end, *token = best;
            return 1;
        }
    }
    return 0;
}

typedef int (*section_fn)(enc_ctx *c, const char *s, size_t n);

/* Stages 1 and 3: HF AddedVocabulary::find_matches.  Text between tokens
 * goes to next(); a skipped match (a special token without
 * SPLASH_ENCODE_SPECIAL, a single_word token inside a word) is left as text
 * and the search resumes after it, as the Aho-Corasick iterator does. */
static int split_added(enc_ctx *c, const added_matcher *m, const char *s, size_t n, section_fn next) {
    size_t start_offset = 0, pos = 0, ms, me;
    int32_t ti;
    int rc;
    while (find_added(m, s, n, pos, &ms, &me, &ti)) {
        pos = me;
        const added_token *t = &c->tok->added[ti];
        if (t->special && !(c->flags & SPLASH_ENCODE_SPECIAL)) continue;
        size_t l;
        if (t->single_word) {
            int before = ms > 0 && is_word(char_at(s, n, char_before(s, ms), &l));
            int after = me < n && is_word(char_at(s, n, me, &l));
            if (before || after) continue;
        }
        size_t start = ms, stop = me;
        if (t->lstrip) {
            while (start > start_offset) {
                size_t b = char_before(s, start);
                if (!is_white_space(char_at(s, n, b, &l))) break;
                start = b;
            }
        }
        if (t->rstrip)
            while (stop < n && is_white_space(char_at(s, n, stop, &l))) stop += l;
        if (start_offset < start && (rc = next(c, s + start_offset, start - start_offset))) return rc;
        if ((rc = splash_token_vec_push(c->out, t->id))) return splash_fail(c->err, rc, "out of memory");
        start_offset = stop;
    }
    return start_offset < n ? next(c, s + start_offset, n - start_offset) : 0;
}

static int after_normalize(enc_ctx *c, const char *s, size_t n) { return pretokenize(c, 0, s, n); }

/* Stage 2: NFC.  Text made only of characters below U+0300 (lead bytes
 * below 0xCC) is already NFC: none of them decomposes differently or
 * combines with a neighbour, so it skips utf8proc. */
static int normalize(enc_ctx *c, const char *s, size_t n) {
    const splash_tokenizer *tok = c->tok;
    int needs = 0;
    if (tok->nfc)
        for (size_t i = 0; i < n && !needs; i++) needs = (unsigned char)s[i] >= 0xCC;
    if (!needs) return split_added(c, &tok->norm_match, s, n, after_normalize);
    utf8proc_uint8_t *norm = NULL;
    utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &norm, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (m < 0) {
        free(norm);
        return splash_fail(c->err, m == UTF8PROC_ERROR_NOMEM ? SPLASH_E_NOMEM : SPLASH_E_INVALID, "NFC normalisation failed: %s",
                           utf8proc_errmsg(m));
    }
    int rc = split_added(c, &tok->norm_match, (const char *)norm, (size_t)m, after_normalize);
    free(norm);
    return rc;
}

int splash_tokenizer_encode(const splash_tokenizer *tok, const char *text, size_t len, int flags, splash_token_vec *out,
                            splash_error *err) {
    if (len && !text) return splash_fail(err, SPLASH_E_INVALID, "encode: no text");
    if (!json_utf8_valid(text, len)) return splash_fail(err, SPLASH_E_INVALID, "encode: the text is not valid UTF-8");
    enc_ctx c = {.tok = tok, .flags = flags, .out = out, .err = err};
    size_t before = out->len;
    int rc = 0;
    for (int i = 0; i < tok->n_split; i++) {
        c.md[i] = pcre2_match_data_create_from_pattern(tok->split[i].code, NULL);
        if (!c.md[i]) rc = splash_fail(err, SPLASH_E_NOMEM, "out of memory");
    }
    if (!rc) rc = split_added(&c, &tok->raw_match, text, len, normalize);
    if (rc == SPLASH_E_NOMEM && (!err || !err->msg[0])) splash_fail(err, rc, "out of memory while encoding");
    for (int i = 0; i < tok->n_split; i++) pcre2_match_data_free(c.md[i]);
    bpe_scratch_free(&c.scr);
    if (rc) out->len = before;
    return rc;
}

/* ---- decode -------------------------------------------------------------- */

static int check_id(const splash_tokenizer *tok, int32_t id, splash_error *err) {
    if (id < 0 || (size_t)id >= tok->n_ids || !(tok->flags[id] & TF_PRESENT))
        return splash_fail(err, SPLASH_E_RANGE, "token id %d is not in the vocabulary (size %zu)", id, tok->n_ids);
    return 0;
}

int splash_tokenizer_decode(const splash_tokenizer *tok, const int32_t *ids, size_t n, int flags, strbuf *out, splash_error *err) {
    for (size_t i = 0; i < n; i++) {
        int rc = check_id(tok, ids[i], err);
        if (rc) return rc;
    }
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if ((flags & SPLASH_DECODE_SKIP_SPECIAL) && (tok->flags[id] & TF_SPECIAL)) continue;
        sb_append(out, tok->bytes + tok->byte_off[id], tok->byte_off[id + 1] - tok->byte_off[id]);
    }
    return out->oom ? splash_fail(err, SPLASH_E_NOMEM, "out of memory while decoding") : 0;
}

/* The WHATWG UTF-8 decoder, one byte at a time, with the state kept as the
 * bytes of the incomplete sequence (pend[0] is its lead byte).  Complete
 * characters are appended to out; a byte that cannot continue the sequence
 * turns the sequence so far into one U+FFFD and is then read again. */
static const char REPLACEMENT[] = "\xEF\xBF\xBD";

static void utf8_feed(strbuf *out, unsigned char *pend, int *npend, const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (*npend == 0) {
            size_t j = i;
            while (j < n && s[j] < 0x80) j++;
            if (j > i) {
                sb_append(out, s + i, j - i);
                i = j;
                continue;
            }
            unsigned char b = s[i++];
            if (b >= 0xC2 && b <= 0xF4) pend[(*npend)++] = b;
            else sb_append(out, REPLACEMENT, 3);
            continue;
        }
        unsigned char b = s[i], lead = pend[0];
        int need = lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
        unsigned lo = 0x80, hi = 0xBF;
        if (*npend == 1) {
            if (lead == 0xE0) lo = 0xA0;
            else if (lead == 0xED) hi = 0x9F;
            else if (lead == 0xF0) lo = 0x90;
            else if (lead == 0xF4) hi = 0x8F;
        }
        if (b < lo || b > hi) {
            sb_append(out, REPLACEMENT, 3);
            *npend = 0;
            continue; /* b is read again as a new start */
        }
        pend[(*npend)++] = b;
        i++;
        if (*npend == need) {
            sb_append(out, pend, (size_t)need);
            *npend = 0;
        }
    }
}

void splash_utf8_append_lossy(strbuf *out, const char *s, size_t n) {
    if (json_utf8_valid(s, n)) {
        sb_append(out, s, n);
        return;
    }
    unsigned char pend[4];
    int npend = 0;
    utf8_feed(out, pend, &npend, (const unsigned char *)s, n);
    if (npend) sb_append(out, REPLACEMENT, 3);
}

void splash_detok_stream_init(splash_detok_stream *s, const splash_tokenizer *tok, int flags) {
    memset(s, 0, sizeof *s);
    s->tok = tok;
    s->flags = flags;
}

int splash_detok_stream_feed(splash_detok_stream *s, int32_t id, strbuf *out, splash_error *err) {
    const splash_tokenizer *tok = s->tok;
    int rc = check_id(tok, id, err);
    if (rc) return rc;
    if ((s->flags & SPLASH_DECODE_SKIP_SPECIAL) && (tok->flags[id] & TF_SPECIAL)) return 0;
    utf8_feed(out, s->pending, &s->n_pending, tok->bytes + tok->byte_off[id], tok->byte_off[id + 1] - tok->byte_off[id]);
    return out->oom ? splash_fail(err, SPLASH_E_NOMEM, "out of memory while decoding") : 0;
}

void splash_detok_stream_flush(splash_detok_stream *s, strbuf *out) {
    if (s->n_pending) sb_append(out, REPLACEMENT, 3);
    s->n_pending = 0;
}

/* ---- lookups ------------------------------------------------------------- */

size_t splash_tokenizer_vocab_size(const splash_tokenizer *tok) { return tok->n_ids; }

int32_t splash_tokenizer_token_id(const splash_tokenizer *tok, const char *content) {
    size_t n = strlen(content);
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == n && !memcmp(tok->added[i].content, content, n)) return tok->added[i].id;
    /* A vocabulary string: look its bytes up, then check the string. */
    uint8_t stackbuf[256];
    uint8_t *buf = n <= sizeof stackbuf ? stackbuf : malloc(n);
    if (!buf) return -1;
    int ok;
    size_t k = tok_byte_level_decode(content, n, buf, &ok);
    int32_t id = ok ? bpe_lookup(&tok->bpe, buf, k) : -1;
    if (buf != stackbuf) free(buf);
    if (id >= 0 && strcmp(tok->strs + tok->str_off[id], content)) id = -1;
    return id;
}

const char *splash_tokenizer_token_str(const splash_tokenizer *tok, int32_t id) {
    if (id < 0 || (size_t)id >= tok->n_ids || !(tok->flags[id] & TF_PRESENT)) return NULL;
    return tok->strs + tok->str_off[id];
}

int splash_tokenizer_token_bytes(const splash_tokenizer *tok, int32_t id, const char **bytes, size_t *len) {
    int rc = check_id(tok, id, NULL);
    if (rc) return rc;
    *bytes = (const char *)tok->bytes + tok->byte_off[id];
    *len = tok->byte_off[id + 1] - tok->byte_off[id];
    return 0;
}

int splash_tokenizer_is_special(const splash_tokenizer *tok, int32_t id) {
    return id >= 0 && (size_t)id < tok->n_ids && (tok->flags[id] & TF_SPECIAL) != 0;
}
