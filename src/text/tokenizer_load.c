/* tokenizer_load.c - reading a Hugging Face tokenizer.json into a tokenizer.
 *
 * What is accepted, and why only that: Splash serves byte-level BPE models
 * (Qwen3, Qwen3.5), so the file must say model BPE, normaliser NFC or none,
 * pre-tokenizer ByteLevel (optionally after Split steps with a regex or a
 * string, behaviour Isolated), decoder ByteLevel.  Anything else fails with
 * SPLASH_E_UNSUPPORTED naming the field, rather than tokenising differently
 * from the reference.
 *
 * The whole file goes through json_parse (objects with many keys are hash
 * indexed there, so the 150K-entry vocabulary parses in linear time: ~0.5 s
 * for Qwen3's 11 MB file); the tree is freed once the tables are built.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/fs.h"
#include "base/gzip.h"
#include "base/mem.h"
#include "base/json.h"
#include "text/tokenizer_int.h"

/* ---- the byte-level alphabet (GPT-2 bytes_to_unicode) ---------------------
 *
 * Printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand for themselves;
 * the other 68 bytes, in order, are U+0100.. U+0143. */
static int16_t unicode_to_byte[0x144];

static void byte_tables_init(void) {
    for (int i = 0; i < 0x144; i++) unicode_to_byte[i] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        unicode_to_byte[printable ? b : 0x100 + extra++] = (int16_t)b;
    }
}

/* Decodes one UTF-8 sequence of valid UTF-8 s; returns its length. */
static size_t utf8_next(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80 || n < 2) return *cp = c, 1;
    if (c < 0xE0) return *cp = (uint32_t)(c & 0x1F) << 6 | (s[1] & 0x3F), 2;
    if (c < 0xF0 || n < 4) {
        if (n < 3) return *cp = c, 1;
        return *cp = (uint32_t)(c & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F), 3;
    }
    return *cp = (uint32_t)(c & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3F),
           4;
}

/* The ByteLevel decoder's rule for one token string: if every character is
 * in the alphabet, the bytes they stand for; otherwise the string's own UTF-8
 * (Rust: `unwrap_or_else(|| t.as_bytes())`).  Writes to out (at least n
 * bytes) and returns the byte count; *mapped says which rule applied. */
size_t tok_byte_level_decode(const char *str, size_t n, uint8_t *out, int *mapped) {
    const uint8_t *s = (const uint8_t *)str;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += utf8_next(s + i, n - i, &cp);
        if (cp >= 0x144 || unicode_to_byte[cp] < 0) {
            memcpy(out, s, n);
            *mapped = 0;
            return n;
        }
        out[k++] = (uint8_t)unicode_to_byte[cp];
    }
    *mapped = 1;
    return k;
}

/* ---- the vocabulary ------------------------------------------------------ */

typedef struct vocab_entry {
    const char *str; /* into the parsed JSON */
    size_t len;
    int32_t id;
} vocab_entry;

typedef struct vocab_list {
    vocab_entry *e;
    size_t n;
} vocab_list;

/* Reads model.vocab {"token": id, ...}. */
static int vocab_read(const json_value *obj, const char *name, vocab_list *v, splash_error *err) {
    if (!obj || obj->type != JSON_OBJECT) return splash_fail(err, SPLASH_E_FORMAT, "%s: no model.vocab object", name);
    v->e = xmalloc((obj->count ? obj->count : 1) * sizeof *v->e);
    v->n = 0;
    for (size_t i = 0; i < obj->count; i++) {
        int64_t id;
        if (json_int64(obj->items[i], &id) || id < 0 || id > INT32_MAX)
            return splash_fail(err, SPLASH_E_FORMAT, "%s: model.vocab['%s']: expected an id (integer >= 0)", name, obj->keys[i]);
        v->e[v->n++] = (vocab_entry){obj->keys[i], obj->key_lens[i], (int32_t)id};
    }
    return 0;
}

/* ---- components ---------------------------------------------------------- */

static const char *type_of(const json_value *v) { return json_get_string(v, "type", ""); }

static int check_normalizer(splash_tokenizer *tok, const json_value *n, const char *name, splash_error *err) {
    if (!n || n->type == JSON_NULL) return 0;
    const char *t = type_of(n);
    if (!strcmp(t, "NFC")) {
        tok->nfc = 1;
        return 0;
    }
    if (!strcmp(t, "Sequence")) {
        const json_value *list = json_get(n, "normalizers");
        if (!list || list->type != JSON_ARRAY) return splash_fail(err, SPLASH_E_FORMAT, "%s: normalizer.normalizers is not a list", name);
        for (size_t i = 0; i < list->count; i++) {
            int rc = check_normalizer(tok, list->items[i], name, err);
            if (rc) return rc;
        }
        return 0;
    }
    return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: normalizer type '%s' is not supported (only NFC)", name, t);
}

/* Hugging Face's regexes are Oniguruma's.  They read the same in PCRE2 but
 * for \s: Oniguruma's is Unicode White_Space, PCRE2's (with UCP) also takes
 * U+180E.  So \s and \S become \p{White_Space} and \P{White_Space}. */
static char *onig_to_pcre2(const char *re) {
    strbuf sb;
    sb_init(&sb);
    for (const char *p = re; *p; p++) {
        if (*p == '\\' && p[1]) {
            if (p[1] == 's') sb_puts(&sb, "\\p{White_Space}");
            else if (p[1] == 'S') sb_puts(&sb, "\\P{White_Space}");
            else sb_append(&sb, p, 2);
            p++;
        } else {
            sb_putc(&sb, *p);
        }
    }
    return sb_take(&sb, NULL);
}

static int add_split(splash_tokenizer *tok, const char *pattern, int literal, const char *name, splash_error *err) {
    if (tok->n_split == TOK_MAX_SPLITS) return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: too many Split pre-tokenizers", name);
    char *src = literal ? xstrdup(pattern) : onig_to_pcre2(pattern);
    int ecode;
    PCRE2_SIZE eoff;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)src, PCRE2_ZERO_TERMINATED, opts, &ecode, &eoff, NULL);
    free(src);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ecode, msg, sizeof msg);
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: pre-tokenizer regex does not compile (at %zu: %s): %s", name,
                           (size_t)eoff, (const char *)msg, pattern);
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is unavailable */
    tok->split[tok->n_split].code = code;
    tok->split[tok->n_split].pattern = xstrdup(pattern);
    tok->n_split++;
    return 0;
}

#define GPT2_REGEX "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

static int check_byte_level(splash_tokenizer *tok, const json_value *b, const char *name, splash_error *err) {
    if (json_get_bool(b, "add_prefix_space", 0))
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: ByteLevel add_prefix_space=true is not supported", name);
    if (json_get_bool(b, "use_regex", 1)) return add_split(tok, GPT2_REGEX, 0, name, err);
    return 0;
}

static int check_split(splash_tokenizer *tok, const json_value *s, const char *name, splash_error *err) {
    const char *behavior = json_get_string(s, "behavior", "");
    if (strcmp(behavior, "Isolated"))
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: Split behavior '%s' is not supported (only Isolated)", name, behavior);
    if (json_get_bool(s, "invert", 0)) return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: Split invert=true is not supported", name);
    const json_value *pat = json_get(s, "pattern");
    const char *re = json_get_string(pat, "Regex", NULL);
    if (re) return add_split(tok, re, 0, name, err);
    const char *lit = json_get_string(pat, "String", NULL);
    if (lit) return add_split(tok, lit, 1, name, err);
    return splash_fail(err, SPLASH_E_FORMAT, "%s: Split pattern is neither {\"Regex\": ...} nor {\"String\": ...}", name);
}

static int check_pre_tokenizer(splash_tokenizer *tok, const json_value *p, const char *name, splash_error *err) {
    const char *t = type_of(p);
    if (!strcmp(t, "ByteLevel")) return check_byte_level(tok, p, name, err);
    if (!strcmp(t, "Sequence")) {
        const json_value *list = json_get(p, "pretokenizers");
        if (!list || list->type != JSON_ARRAY || list->count == 0)
            return splash_fail(err, SPLASH_E_FORMAT, "%s: pre_tokenizer.pretokenizers is not a list", name);
        for (size_t i = 0; i < list->count; i++) {
            const json_value *step = list->items[i];
            const char *st = type_of(step);
            int last = i + 1 == list->count, rc;
            if (!strcmp(st, "Split") && !last) rc = check_split(tok, step, name, err);
            else if (!strcmp(st, "ByteLevel") && last) rc = check_byte_level(tok, step, name, err);
            else
                rc = splash_fail(err, SPLASH_E_UNSUPPORTED,
                                 "%s: pre-tokenizer step %zu '%s' is not supported (Split steps, then ByteLevel last)", name, i, st);
            if (rc) return rc;
        }
        return 0;
    }
    return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: pre_tokenizer type '%s' is not supported (need ByteLevel)", name,
                       p && p->type != JSON_NULL ? t : "null");
}

/* Decoder and post-processor: only ByteLevel (directly or alone in a
 * Sequence); the post-processor may also be null. */
static int is_byte_level(const json_value *v, const char *list_key) {
    const char *t = type_of(v);
    if (!strcmp(t, "ByteLevel")) return 1;
    if (!strcmp(t, "Sequence")) {
        const json_value *list = json_get(v, list_key);
        if (!list || list->type != JSON_ARRAY) return 0;
        for (size_t i = 0; i < list->count; i++)
            if (!is_byte_level(list->items[i], list_key)) return 0;
        return 1;
    }
    return 0;
}

static int check_model(splash_tokenizer *tok, const json_value *m, const char *name, splash_error *err) {
    const char *t = json_get_string(m, "type", "BPE");
    if (strcmp(t, "BPE")) return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: model type '%s' is not supported (only BPE)", name, t);
    const json_value *drop = json_get(m, "dropout");
    if (drop && drop->type != JSON_NULL) return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: BPE dropout is not supported", name);
    const char *pre = json_get_string(m, "continuing_subword_prefix", ""), *suf = json_get_string(m, "end_of_word_suffix", "");
    if (*pre || *suf)
        return splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: BPE continuing_subword_prefix / end_of_word_suffix are not supported", name);
    return 0;
}

/* ---- added tokens -------------------------------------------------------- */

static int trie_add(added_matcher *m, const char *s, size_t n, int32_t token) {
    if (!m->nodes) {
        m->cap = 64;
        m->nodes = xmalloc(m->cap * sizeof *m->nodes);
        m->nodes[0] = (trie_node){-1, -1, -1, 0};
        m->n_nodes = 1;
    }
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t c = m->nodes[node].child;
        while (c >= 0 && m->nodes[c].byte != b) c = m->nodes[c].sibling;
        if (c < 0) {
            if (m->n_nodes == m->cap) {
                m->cap *= 2;
                m->nodes = xrealloc(m->nodes, m->cap * sizeof *m->nodes);
            }
            c = (int32_t)m->n_nodes++;
            m->nodes[c] = (trie_node){-1, m->nodes[node].child, -1, b};
            m->nodes[node].child = c;
        }
        node = c;
    }
    m->first[(uint8_t)s[0]] = 1;
    if (m->nodes[node].token < 0) m->nodes[node].token = token; /* the first of equal contents wins */
    m->n_tokens++;
    return 0;
}

static int read_added(splash_tokenizer *tok, const json_value *list, const char *name, splash_error *err) {
    if (!list || list->type == JSON_NULL) return 0;
    if (list->type != JSON_ARRAY) return splash_fail(err, SPLASH_E_FORMAT, "%s: added_tokens is not a list", name);
    tok->added = xcalloc(list->count ? list->count : 1, sizeof *tok->added);
    for (size_t i = 0; i < list->count; i++) {
        const json_value *a = list->items[i];
        const json_value *content = json_get(a, "content");
        int64_t id;
        if (!content || content->type != JSON_STRING || content->len == 0 || json_int64(json_get(a, "id"), &id) || id < 0 ||
            id > INT32_MAX)
            return splash_fail(err, SPLASH_E_FORMAT, "%s: added_tokens[%zu] needs a non-empty content and an id", name, i);
        added_token *t = &tok->added[tok->n_added++];
        t->id = (int32_t)id;
        t->content = xstrndup(content->str, content->len);
        t->len = content->len;
        t->single_word = json_get_bool(a, "single_word", 0);
        t->lstrip = json_get_bool(a, "lstrip", 0);
        t->rstrip = json_get_bool(a, "rstrip", 0);
        t->normalized = json_get_bool(a, "normalized", 1);
        t->special = json_get_bool(a, "special", 0);
    }
    return 0;
}

/* Added tokens are tried in HF's order: the special ones, then the others. */
static void build_matchers(splash_tokenizer *tok) {
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < tok->n_added; i++) {
            added_token *t = &tok->added[i];
            if (t->special != (pass == 0)) continue;
            if (t->normalized && tok->nfc) {
                /* Match the content as the normaliser would leave it. */
                char *norm = NULL;
                utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)t->content, (utf8proc_ssize_t)t->len,
                                                  (utf8proc_uint8_t **)&norm, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
                if (n > 0) trie_add(&tok->norm_match, norm, (size_t)n, (int32_t)i);
                free(norm);
            } else {
                trie_add(t->normalized ? &tok->norm_match : &tok->raw_match, t->content, t->len, (int32_t)i);
            }
        }
}

/* ---- the whole file ------------------------------------------------------ */

#define MAX_IDS (1 << 24) /* ids beyond this are taken as a broken file */

static int load_vocab_and_merges(splash_tokenizer *tok, const json_value *model, vocab_list *vocab, const char *name,
                                 splash_error *err) {
    /* Ids, strings and bytes for every id. */
    size_t n_ids = 0;
    for (size_t i = 0; i < vocab->n; i++)
        if ((size_t)vocab->e[i].id + 1 > n_ids) n_ids = (size_t)vocab->e[i].id + 1;
    for (size_t i = 0; i < tok->n_added; i++)
        if ((size_t)tok->added[i].id + 1 > n_ids) n_ids = (size_t)tok->added[i].id + 1;
    if (n_ids == 0) return splash_fail(err, SPLASH_E_FORMAT, "%s: the vocabulary is empty", name);
    if (n_ids > MAX_IDS) return splash_fail(err, SPLASH_E_RANGE, "%s: token id %zu is beyond %d", name, n_ids - 1, MAX_IDS);
    tok->n_ids = n_ids;
    tok->flags = xcalloc(n_ids, 1);
    tok->str_off = xmalloc(n_ids * sizeof *tok->str_off);
    const char **str = xcalloc(n_ids, sizeof *str);
    size_t *slen = xcalloc(n_ids, sizeof *slen);
    int rc = 0;
    for (size_t i = 0; i < vocab->n; i++) {
        int32_t id = vocab->e[i].id;
        if (str[id]) {
            rc = splash_fail(err, SPLASH_E_FORMAT, "%s: model.vocab gives id %d to two tokens", name, id);
            goto out;
        }
        str[id] = vocab->e[i].str;
        slen[id] = vocab->e[i].len;
        tok->flags[id] = TF_PRESENT;
    }
    for (size_t i = 0; i < tok->n_added; i++) {
        added_token *t = &tok->added[i];
        if (str[t->id] && !(tok->flags[t->id] & TF_ADDED) && (slen[t->id] != t->len || memcmp(str[t->id], t->content, t->len))) {
            rc = splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: added token '%s' has id %d, which the vocabulary gives to '%s'", name,
                             t->content, t->id, str[t->id]);
            goto out;
        }
        str[t->id] = t->content;
        slen[t->id] = t->len;
        tok->flags[t->id] = TF_PRESENT | TF_ADDED | (t->special ? TF_SPECIAL : 0);
    }
    size_t total = 0;
    for (size_t i = 0; i < n_ids; i++) total += slen[i] + 1;
    if (total > UINT32_MAX) {
        rc = splash_fail(err, SPLASH_E_RANGE, "%s: the vocabulary is too large", name);
        goto out;
    }
    tok->strs = xmalloc(total);
    tok->bytes = xmalloc(total);
    tok->byte_off = xmalloc((n_ids + 1) * sizeof *tok->byte_off);
    uint8_t *mapped = xcalloc(n_ids, 1);
    size_t so = 0, bo = 0;
    for (size_t i = 0; i < n_ids; i++) {
        tok->str_off[i] = (uint32_t)so;
        if (slen[i]) memcpy(tok->strs + so, str[i], slen[i]);
        tok->strs[so + slen[i]] = 0;
        so += slen[i] + 1;
        tok->byte_off[i] = (uint32_t)bo;
        int m = 0;
        bo += tok_byte_level_decode(str[i] ? str[i] : "", slen[i], tok->bytes + bo, &m);
        mapped[i] = (uint8_t)m;
    }
    tok->byte_off[n_ids] = (uint32_t)bo;

    /* The encoder's map: model vocabulary entries written in the byte-level
     * alphabet (the only strings BPE can produce). */
    const json_value *merges = json_get(model, "merges");
    size_t n_merges = merges && merges->type == JSON_ARRAY ? merges->count : 0;
    if (bpe_init(&tok->bpe, n_ids, n_merges, tok->bytes, tok->byte_off)) {
        rc = splash_fail(err, SPLASH_E_NOMEM, "%s: out of memory", name);
        goto out_mapped;
    }
    tok->bpe.ignore_merges = json_get_bool(model, "ignore_merges", 0);
    for (size_t i = 0; i < n_ids; i++)
        if ((tok->flags[i] & (TF_PRESENT | TF_ADDED)) == TF_PRESENT && mapped[i]) bpe_vocab_add(&tok->bpe, (int32_t)i);
    for (int b = 0; b < 256; b++)
        if (tok->bpe.byte_id[b] < 0) {
            rc = splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: the vocabulary lacks the byte-level token of byte 0x%02X", name, b);
            goto out_mapped;
        }

    /* Merges: "a b" strings or [a, b] pairs of byte-level strings. */
    uint8_t *buf = NULL;
    size_t buf_cap = 0;
    if (!merges || merges->type != JSON_ARRAY) {
        rc = splash_fail(err, SPLASH_E_FORMAT, "%s: model.merges is not a list", name);
        goto out_mapped;
    }
    for (size_t r = 0; !rc && r < merges->count; r++) {
        const json_value *m = merges->items[r];
        const char *a, *b;
        size_t alen, blen;
        if (m->type == JSON_STRING) {
            a = m->str, alen = m->len;
            const char *sp = memchr(a, ' ', alen);
            if (!sp || memchr(sp + 1, ' ', alen - (size_t)(sp + 1 - a))) {
                rc = splash_fail(err, SPLASH_E_FORMAT, "%s: merges[%zu] '%.*s' is not two tokens", name, r, (int)alen, a);
                break;
            }
            b = sp + 1, blen = alen - (size_t)(b - a), alen = (size_t)(sp - a);
        } else if (m->type == JSON_ARRAY && m->count == 2 && json_string(m->items[0]) && json_string(m->items[1])) {
            a = m->items[0]->str, alen = m->items[0]->len;
            b = m->items[1]->str, blen = m->items[1]->len;
        } else {
            rc = splash_fail(err, SPLASH_E_FORMAT, "%s: merges[%zu] is neither \"a b\" nor [a, b]", name, r);
            break;
        }
        if (alen + blen > buf_cap) {
            buf_cap = 2 * (alen + blen) + 64;
            buf = xrealloc(buf, buf_cap);
        }
        int ma, mb;
        size_t na = tok_byte_level_decode(a, alen, buf, &ma);
        size_t nb = tok_byte_level_decode(b, blen, buf + na, &mb);
        int32_t ia = ma ? bpe_lookup(&tok->bpe, buf, na) : -1;
        int32_t ib = mb ? bpe_lookup(&tok->bpe, buf + na, nb) : -1;
        int32_t inew = ia >= 0 && ib >= 0 ? bpe_lookup(&tok->bpe, buf, na + nb) : -1;
        if (inew < 0) {
            rc = splash_fail(err, SPLASH_E_FORMAT, "%s: merges[%zu] (%.*s, %.*s): %s is not in the vocabulary", name, r, (int)alen, a,
                             (int)blen, b, ia < 0 ? "the left token" : ib < 0 ? "the right token" : "the merged token");
            break;
        }
        if (bpe_merge_add(&tok->bpe, ia, ib, (uint32_t)r, inew)) {
            rc = splash_fail(err, SPLASH_E_NOMEM, "%s: out of memory", name);
            break;
        }
    }
    free(buf);
out_mapped:
    free(mapped);
out:
    free(str);
    free(slen);
    return rc;
}

int splash_tokenizer_load_json(const char *json, size_t len, const char *name, splash_tokenizer **out, splash_error *err) {
    *out = NULL;
    if (!name) name = "tokenizer.json";
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, byte_tables_init);
    splash_tokenizer *tok = xcalloc(1, sizeof *tok);
    vocab_list vocab = {0};
    json_value *root = NULL;
    int rc;
    char jerr[200];
    root = json_parse(json, len, JSON_DEFAULT_MAX_DEPTH, jerr, sizeof jerr);
    if (!root) {
        rc = splash_fail(err, SPLASH_E_FORMAT, "%s: not valid JSON: %s", name, jerr);
        goto fail;
    }
    if (root->type != JSON_OBJECT) {
        rc = splash_fail(err, SPLASH_E_FORMAT, "%s: not a tokenizer: the top level must be an object with \"model\"", name);
        goto fail;
    }
    const json_value *model = json_get(root, "model");
    if (!model || model->type != JSON_OBJECT) {
        rc = splash_fail(err, SPLASH_E_FORMAT, "%s: no \"model\" object", name);
        goto fail;
    }
    if ((rc = check_model(tok, model, name, err))) goto fail;
    if ((rc = check_normalizer(tok, json_get(root, "normalizer"), name, err))) goto fail;
    if ((rc = check_pre_tokenizer(tok, json_get(root, "pre_tokenizer"), name, err))) goto fail;
    const json_value *dec = json_get(root, "decoder");
    if (!dec || !is_byte_level(dec, "decoders")) {
        rc = splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: decoder '%s' is not supported (only ByteLevel)", name,
                         dec && dec->type != JSON_NULL ? type_of(dec) : "null");
        goto fail;
    }
    const json_value *post = json_get(root, "post_processor");
    if (post && post->type != JSON_NULL && !is_byte_level(post, "processors")) {
        rc = splash_fail(err, SPLASH_E_UNSUPPORTED, "%s: post_processor '%s' is not supported (only ByteLevel or null)", name,
                         type_of(post));
        goto fail;
    }
    if ((rc = read_added(tok, json_get(root, "added_tokens"), name, err))) goto fail;
    if ((rc = vocab_read(json_get(model, "vocab"), name, &vocab, err))) goto fail;
    if ((rc = load_vocab_and_merges(tok, model, &vocab, name, err))) goto fail;
    build_matchers(tok);
    json_free(root);
    free(vocab.e);
    *out = tok;
    return 0;
fail:
    json_free(root);
    free(vocab.e);
    splash_tokenizer_free(tok);
    return rc;
}

int splash_tokenizer_load(const char *path, splash_tokenizer **out, splash_error *err) {
    char *data;
    size_t len;
    *out = NULL;
    int rc = splash_read_file_or_gz(path, &data, &len, err); /* packages store tokenizer.json.gz */
    if (rc) return rc;
    rc = splash_tokenizer_load_json(data, len, path, out, err);
    free(data);
    return rc;
}

void splash_tokenizer_free(splash_tokenizer *tok) {
    if (!tok) return;
    bpe_free(&tok->bpe);
    free(tok->flags);
    free(tok->strs);
    free(tok->str_off);
    free(tok->bytes);
    free(tok->byte_off);
    for (size_t i = 0; i < tok->n_added; i++) free(tok->added[i].content);
    free(tok->added);
    free(tok->raw_match.nodes);
    free(tok->norm_match.nodes);
    for (int i = 0; i < tok->n_split; i++) {
        pcre2_code_free(tok->split[i].code);
        free(tok->split[i].pattern);
    }
    free(tok);
}
