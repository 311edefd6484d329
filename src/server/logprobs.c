/* logprobs.c - token log-probabilities in the two OpenAI reply shapes
 * (logprobs.h). */
#include "server/logprobs.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/json.h"

void srv_logprob_write(strbuf *b, float lp) {
    if (!isfinite(lp)) {
        sb_puts(b, "-9999.0");
        return;
    }
    char s[40];
    json_format_double(s, sizeof s, (double)lp);
    sb_puts(b, s);
}

/* The token's bytes (none for an id the tokenizer does not know). */
static void token_bytes(const splash_tokenizer *tk, int32_t id, const char **p, size_t *n) {
    if (splash_tokenizer_token_bytes(tk, id, p, n)) {
        *p = "";
        *n = 0;
    }
}

static void token_string(strbuf *b, const char *p, size_t n) {
    strbuf s;
    sb_init(&s);
    splash_utf8_append_lossy(&s, p, n);
    json_write_string(b, s.data ? s.data : "", s.len, JSON_COMPACT);
    sb_free(&s);
}

/* "token":..,"logprob":..,"bytes":[..] */
static void chat_fields(strbuf *b, const splash_tokenizer *tk, int32_t id, float lp) {
    const char *p;
    size_t n;
    token_bytes(tk, id, &p, &n);
    sb_puts(b, "\"token\":");
    token_string(b, p, n);
    sb_puts(b, ",\"logprob\":");
    srv_logprob_write(b, lp);
    sb_puts(b, ",\"bytes\":[");
    for (size_t i = 0; i < n; i++) sb_printf(b, i ? ",%u" : "%u", (unsigned)(unsigned char)p[i]);
    sb_putc(b, ']');
}

void srv_logprobs_chat_entry(strbuf *b, const splash_tokenizer *tk, const splash_logprobs *lp) {
    sb_putc(b, '{');
    chat_fields(b, tk, lp->token, lp->logprob);
    sb_puts(b, ",\"top_logprobs\":[");
    for (int i = 0; i < lp->n_top; i++) {
        sb_puts(b, i ? ",{" : "{");
        chat_fields(b, tk, lp->top_ids[i], lp->top_logprobs[i]);
        sb_putc(b, '}');
    }
    sb_puts(b, "]}");
}

void srv_legacy_logprobs_init(srv_legacy_logprobs *l) {
    memset(l, 0, sizeof *l);
    sb_init(&l->tokens);
    sb_init(&l->values);
    sb_init(&l->tops);
    sb_init(&l->offsets);
}

void srv_legacy_logprobs_free(srv_legacy_logprobs *l) {
    sb_free(&l->tokens);
    sb_free(&l->values);
    sb_free(&l->tops);
    sb_free(&l->offsets);
}

void srv_legacy_logprobs_add(srv_legacy_logprobs *l, const splash_tokenizer *tk, const splash_logprobs *lp,
                             size_t text_offset) {
    const char *sep = l->n ? "," : "";
    const char *p;
    size_t n;
    token_bytes(tk, lp->token, &p, &n);
    sb_puts(&l->tokens, sep);
    token_string(&l->tokens, p, n);
    sb_puts(&l->values, sep);
    srv_logprob_write(&l->values, lp->logprob);
    sb_printf(&l->offsets, "%s%zu", sep, text_offset);
    /* {token: logprob}: an object, so two ids with the same string keep the first (the likelier) */
    sb_printf(&l->tops, "%s{", sep);
    strbuf seen[SPLASH_MAX_TOP_LOGPROBS];
    int n_seen = 0;
    for (int i = 0; i < lp->n_top; i++) {
        token_bytes(tk, lp->top_ids[i], &p, &n);
        strbuf *k = &seen[n_seen];
        sb_init(k);
        token_string(k, p, n);
        int dup = 0;
        for (int j = 0; j < n_seen && !dup; j++) dup = seen[j].len == k->len && !memcmp(seen[j].data, k->data, k->len);
        if (dup) {
            sb_free(k);
            continue;
        }
        if (n_seen) sb_putc(&l->tops, ',');
        sb_append(&l->tops, k->data, k->len);
        sb_putc(&l->tops, ':');
        srv_logprob_write(&l->tops, lp->top_logprobs[i]);
        n_seen++;
    }
    for (int j = 0; j < n_seen; j++) sb_free(&seen[j]);
    sb_putc(&l->tops, '}');
    l->n++;
}

void srv_legacy_logprobs_write(strbuf *b, srv_legacy_logprobs *l) {
    sb_puts(b, "{\"tokens\":[");
    sb_append(b, l->tokens.data, l->tokens.len);
    sb_puts(b, "],\"token_logprobs\":[");
    sb_append(b, l->values.data, l->values.len);
    sb_puts(b, "],\"top_logprobs\":[");
    sb_append(b, l->tops.data, l->tops.len);
    sb_puts(b, "],\"text_offset\":[");
    sb_append(b, l->offsets.data, l->offsets.len);
    sb_puts(b, "]}");
    sb_clear(&l->tokens);
    sb_clear(&l->values);
    sb_clear(&l->tops);
    sb_clear(&l->offsets);
    l->n = 0;
}
