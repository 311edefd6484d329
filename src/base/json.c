/* json.c - parser, builders and writers for json.h. */
#include "json.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"

/* ---- UTF-8 ---------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s (n bytes available), or 0. */
static size_t utf8_seq_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return n >= 2 && (s[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c < 0xF0) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && s[1] < 0xA0) return 0; /* overlong */
        if (c == 0xED && s[1] >= 0xA0) return 0; /* surrogate */
        return 3;
    }
    if (c < 0xF5) {
        if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
        if (c == 0xF0 && s[1] < 0x90) return 0;
        if (c == 0xF4 && s[1] >= 0x90) return 0;
        return 4;
    }
    return 0;
}

int json_utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t l = utf8_seq_len(p + i, n - i);
        if (!l) return 0;
        i += l;
    }
    return 1;
}

static void put_utf8(strbuf *sb, unsigned cp) {
    char b[4];
    size_t n;
    if (cp < 0x80) b[0] = (char)cp, n = 1;
    else if (cp < 0x800) b[0] = (char)(0xC0 | cp >> 6), b[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
    else if (cp < 0x10000) b[0] = (char)(0xE0 | cp >> 12), b[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), b[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
    else b[0] = (char)(0xF0 | cp >> 18), b[1] = (char)(0x80 | ((cp >> 12) & 0x3F)), b[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), b[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
    sb_append(sb, b, n);
}

/* ---- values ------------------------------------------------------------- */

json_value *json_new(json_type t) {
    json_value *v = xcalloc(1, sizeof *v);
    v->type = t;
    return v;
}

void json_free(json_value *v) {
    if (!v) return;
    for (size_t i = 0; i < v->count; i++) {
        json_free(v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->key_lens);
    free(v->index);
    free(v->str);
    free(v);
}

json_value *json_new_stringn(const char *s, size_t n) {
    json_value *v = json_new(JSON_STRING);
    v->str = xstrndup(s, n);
    v->len = n;
    return v;
}

json_value *json_new_string(const char *s) { return json_new_stringn(s, strlen(s)); }

json_value *json_new_number_lexeme(const char *lexeme) {
    json_value *v = json_new(JSON_NUMBER);
    v->str = xstrdup(lexeme);
    v->len = strlen(lexeme);
    v->num = strtod(lexeme, NULL);
    v->is_int = strpbrk(lexeme, ".eE") == NULL;
    return v;
}

json_value *json_new_int(int64_t x) {
    char b[32];
    snprintf(b, sizeof b, "%lld", (long long)x);
    json_value *v = json_new_number_lexeme(b);
    v->num = (double)x;
    return v;
}

json_value *json_new_double(double x) {
    char b[40];
    json_format_double(b, sizeof b, x);
    json_value *v = json_new_number_lexeme(b);
    v->num = x;
    v->is_int = 0;
    return v;
}

json_value *json_new_bool(int b) { return json_new(b ? JSON_TRUE : JSON_FALSE); }

static void grow(json_value *v, int with_keys) {
    if (v->count < v->cap) return;
    v->cap = v->cap ? v->cap * 2 : 4;
    v->items = xrealloc(v->items, v->cap * sizeof *v->items);
    if (with_keys) {
        v->keys = xrealloc(v->keys, v->cap * sizeof *v->keys);
        v->key_lens = xrealloc(v->key_lens, v->cap * sizeof *v->key_lens);
    }
}

/* FNV-1a over the key bytes. */
static uint32_t key_hash(const char *key, size_t klen) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < klen; i++) h = (h ^ (unsigned char)key[i]) * 16777619u;
    return h;
}

#define INDEX_FROM 16 /* objects with more keys than this get a hash index */

static void index_insert(json_value *obj, size_t pos) {
    size_t mask = obj->index_cap - 1;
    size_t i = key_hash(obj->keys[pos], obj->key_lens[pos]) & mask;
    while (obj->index[i]) i = (i + 1) & mask;
    obj->index[i] = (uint32_t)(pos + 1);
}

static void index_rebuild(json_value *obj) {
    size_t cap = 64;
    while (cap < obj->count * 2 + 2) cap *= 2;
    free(obj->index);
    obj->index = xcalloc(cap, sizeof *obj->index);
    obj->index_cap = cap;
    for (size_t i = 0; i < obj->count; i++) index_insert(obj, i);
}

/* Position of key in obj, or -1. */
static long obj_find(const json_value *obj, const char *key, size_t klen) {
    if (obj->index_cap) {
        size_t mask = obj->index_cap - 1;
        for (size_t i = key_hash(key, klen) & mask; obj->index[i]; i = (i + 1) & mask) {
            size_t pos = obj->index[i] - 1;
            if (obj->key_lens[pos] == klen && !memcmp(obj->keys[pos], key, klen)) return (long)pos;
        }
        return -1;
    }
    for (size_t i = 0; i < obj->count; i++)
        if (obj->key_lens[i] == klen && !memcmp(obj->keys[i], key, klen)) return (long)i;
    return -1;
}

static void obj_setn(json_value *obj, const char *key, size_t klen, json_value *val) {
    long pos = obj_find(obj, key, klen);
    if (pos >= 0) {
        json_free(obj->items[pos]);
        obj->items[pos] = val;
        return;
    }
    grow(obj, 1);
    obj->keys[obj->count] = xstrndup(key, klen);
    obj->key_lens[obj->count] = klen;
    obj->items[obj->count++] = val;
    if (obj->count > INDEX_FROM) {
        if (obj->count * 2 + 2 > obj->index_cap) index_rebuild(obj);
        else index_insert(obj, obj->count - 1);
    }
}

void json_obj_set(json_value *obj, const char *key, json_value *val) { obj_setn(obj, key, strlen(key), val); }

void json_arr_push(json_value *arr, json_value *val) {
    grow(arr, 0);
    arr->items[arr->count++] = val;
}

json_value *json_clone(const json_value *v) {
    if (!v) return NULL;
    json_value *c = json_new(v->type);
    if (v->str) c->str = xstrndup(v->str, v->len);
    c->len = v->len;
    c->num = v->num;
    c->is_int = v->is_int;
    for (size_t i = 0; i < v->count; i++) {
        if (v->type == JSON_OBJECT) obj_setn(c, v->keys[i], v->key_lens[i], json_clone(v->items[i]));
        else json_arr_push(c, json_clone(v->items[i]));
    }
    return c;
}

json_value *json_get(const json_value *obj, const char *key) {
    if (!obj || obj->type != JSON_OBJECT) return NULL;
    long pos = obj_find(obj, key, strlen(key));
    return pos >= 0 ? obj->items[pos] : NULL;
}

json_value *json_at(const json_value *arr, size_t i) {
    if (!arr || (arr->type != JSON_ARRAY && arr->type != JSON_OBJECT) || i >= arr->count) return NULL;
    return arr->items[i];
}

const char *json_string(const json_value *v) { return v && v->type == JSON_STRING ? v->str : NULL; }

int json_is_bool(const json_value *v) { return v && (v->type == JSON_TRUE || v->type == JSON_FALSE); }

int json_int64(const json_value *v, int64_t *out) {
    if (!v || v->type != JSON_NUMBER) return -1;
    if (v->is_int) {
        char *end;
        errno = 0;
        long long x = strtoll(v->str, &end, 10);
        if (*end || errno == ERANGE) return -1;
        *out = x;
        return 0;
    }
    /* 3.0 or 1e3 are integers too when exact */
    double d = v->num;
    if (d != floor(d) || fabs(d) > 9007199254740992.0) return -1;
    *out = (int64_t)d;
    return 0;
}

const char *json_get_string(const json_value *obj, const char *key, const char *dflt) {
    const char *s = json_string(json_get(obj, key));
    return s ? s : dflt;
}

int64_t json_get_int(const json_value *obj, const char *key, int64_t dflt) {
    int64_t x;
    return json_int64(json_get(obj, key), &x) == 0 ? x : dflt;
}

double json_get_num(const json_value *obj, const char *key, double dflt) {
    json_value *v = json_get(obj, key);
    return v && v->type == JSON_NUMBER ? v->num : dflt;
}

int json_get_bool(const json_value *obj, const char *key, int dflt) {
    json_value *v = json_get(obj, key);
    if (!json_is_bool(v)) return dflt;
    return v->type == JSON_TRUE;
}

/* ---- parser ------------------------------------------------------------- */

typedef struct parser {
    const char *s, *end, *start;
    int max_depth;
    char *err;
    size_t err_size;
    int failed;
    strbuf tmp;
} parser;

static void perr(parser *p, const char *what) {
    if (p->failed) return;
    p->failed = 1;
    int line = 1, col = 1;
    for (const char *c = p->start; c < p->s && c < p->end; c++) {
        if (*c == '\n') line++, col = 1;
        else col++;
    }
    if (p->err && p->err_size) snprintf(p->err, p->err_size, "line %d, column %d: %s", line, col, what);
}

static void skip_ws(parser *p) {
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')) p->s++;
}

static int hex4(parser *p, unsigned *out) {
    if (p->end - p->s < 4) return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p->s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    p->s += 4;
    *out = v;
    return 0;
}

/* Parses a string literal at p->s (the opening quote) into p->tmp. */
static int parse_string_raw(parser *p) {
    sb_clear(&p->tmp);
    p->s++; /* opening quote */
    for (;;) {
        const char *run = p->s;
        while (p->s < p->end && *p->s != '"' && *p->s != '\\' && (unsigned char)*p->s >= 0x20) p->s++;
        if (p->s > run) {
            if (!json_utf8_valid(run, (size_t)(p->s - run))) {
                perr(p, "invalid UTF-8 in string");
                return -1;
            }
            sb_append(&p->tmp, run, (size_t)(p->s - run));
        }
        if (p->s >= p->end) {
            perr(p, "unterminated string");
            return -1;
        }
        char c = *p->s;
        if (c == '"') {
            p->s++;
            return p->tmp.oom ? -1 : 0;
        }
        if ((unsigned char)c < 0x20) {
            perr(p, "control character in string");
            return -1;
        }
        p->s++; /* backslash */
        if (p->s >= p->end) {
            perr(p, "unterminated escape");
            return -1;
        }
        c = *p->s++;
        switch (c) {
        case '"': sb_putc(&p->tmp, '"'); break;
        case '\\': sb_putc(&p->tmp, '\\'); break;
        case '/': sb_putc(&p->tmp, '/'); break;
        case 'b': sb_putc(&p->tmp, '\b'); break;
        case 'f': sb_putc(&p->tmp, '\f'); break;
        case 'n': sb_putc(&p->tmp, '\n'); break;
        case 'r': sb_putc(&p->tmp, '\r'); break;
        case 't': sb_putc(&p->tmp, '\t'); break;
        case 'u': {
            unsigned cp;
            if (hex4(p, &cp)) {
                perr(p, "bad \\u escape");
                return -1;
            }
            if (cp >= 0xD800 && cp < 0xDC00) {
                unsigned lo;
                if (p->end - p->s < 6 || p->s[0] != '\\' || p->s[1] != 'u') {
                    perr(p, "unpaired surrogate in \\u escape");
                    return -1;
                }
                p->s += 2;
                if (hex4(p, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                    perr(p, "unpaired surrogate in \\u escape");
                    return -1;
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp < 0xE000) {
                perr(p, "unpaired surrogate in \\u escape");
                return -1;
            }
            put_utf8(&p->tmp, cp);
            break;
        }
        default: perr(p, "bad escape in string"); return -1;
        }
    }
}

static json_value *parse_value(parser *p, int depth);

static json_value *parse_number(parser *p) {
    const char *b = p->s;
    if (p->s < p->end && *p->s == '-') p->s++;
    if (p->s >= p->end) goto bad;
    if (*p->s == '0') p->s++;
    else if (*p->s >= '1' && *p->s <= '9') while (p->s < p->end && *p->s >= '0' && *p->s <= '9') p->s++;
    else goto bad;
    int is_int = 1;
    if (p->s < p->end && *p->s == '.') {
        is_int = 0;
        p->s++;
        if (p->s >= p->end || *p->s < '0' || *p->s > '9') goto bad;
        while (p->s < p->end && *p->s >= '0' && *p->s <= '9') p->s++;
    }
    if (p->s < p->end && (*p->s == 'e' || *p->s == 'E')) {
        is_int = 0;
        p->s++;
        if (p->s < p->end && (*p->s == '+' || *p->s == '-')) p->s++;
        if (p->s >= p->end || *p->s < '0' || *p->s > '9') goto bad;
        while (p->s < p->end && *p->s >= '0' && *p->s <= '9') p->s++;
    }
    json_value *v = json_new(JSON_NUMBER);
    v->len = (size_t)(p->s - b);
    v->str = xstrndup(b, v->len);
    v->num = strtod(v->str, NULL);
    v->is_int = is_int;
    return v;
bad:
    perr(p, "invalid number");
    return NULL;
}

static int match_lit(parser *p, const char *lit) {
    size_t n = strlen(lit);
    if ((size_t)(p->end - p->s) < n || memcmp(p->s, lit, n)) return 0;
    p->s += n;
    return 1;
}

static json_value *parse_value(parser *p, int depth) {
    skip_ws(p);
    if (p->s >= p->end) {
        perr(p, "unexpected end of input");
        return NULL;
    }
    if (depth > p->max_depth) {
        perr(p, "nesting too deep");
        return NULL;
    }
    char c = *p->s;
    if (c == '{') {
        p->s++;
        json_value *obj = json_new(JSON_OBJECT);
        skip_ws(p);
        if (p->s < p->end && *p->s == '}') {
            p->s++;
            return obj;
        }
        for (;;) {
            skip_ws(p);
            if (p->s >= p->end || *p->s != '"') {
                perr(p, "expected a string key");
                goto fail_obj;
            }
            if (parse_string_raw(p)) goto fail_obj;
            size_t klen = p->tmp.len;
            char *key = xstrndup(sb_cstr(&p->tmp), klen);
            skip_ws(p);
            if (p->s >= p->end || *p->s != ':') {
                free(key);
                perr(p, "expected ':'");
                goto fail_obj;
            }
            p->s++;
            json_value *val = parse_value(p, depth + 1);
            if (!val) {
                free(key);
                goto fail_obj;
            }
            obj_setn(obj, key, klen, val);
            free(key);
            skip_ws(p);
            if (p->s < p->end && *p->s == ',') {
                p->s++;
                continue;
            }
            if (p->s < p->end && *p->s == '}') {
                p->s++;
                return obj;
            }
            perr(p, "expected ',' or '}'");
            goto fail_obj;
        }
    fail_obj:
        json_free(obj);
        return NULL;
    }
    if (c == '[') {
        p->s++;
        json_value *arr = json_new(JSON_ARRAY);
        skip_ws(p);
        if (p->s < p->end && *p->s == ']') {
            p->s++;
            return arr;
        }
        for (;;) {
            json_value *val = parse_value(p, depth + 1);
            if (!val) {
                json_free(arr);
                return NULL;
            }
            json_arr_push(arr, val);
            skip_ws(p);
            if (p->s < p->end && *p->s == ',') {
                p->s++;
                continue;
            }
            if (p->s < p->end && *p->s == ']') {
                p->s++;
                return arr;
            }
            perr(p, "expected ',' or ']'");
            json_free(arr);
            return NULL;
        }
    }
    if (c == '"') {
        if (parse_string_raw(p)) return NULL;
        return json_new_stringn(sb_cstr(&p->tmp), p->tmp.len);
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p);
    if (match_lit(p, "true")) return json_new(JSON_TRUE);
    if (match_lit(p, "false")) return json_new(JSON_FALSE);
    if (match_lit(p, "null")) return json_new(JSON_NULL);
    perr(p, "unexpected character");
    return NULL;
}

json_value *json_parse(const char *text, size_t len, int max_depth, char *err, size_t err_size) {
    parser p = {.s = text, .end = text + len, .start = text, .max_depth = max_depth, .err = err, .err_size = err_size};
    sb_init(&p.tmp);
    if (err && err_size) err[0] = 0;
    json_value *v = parse_value(&p, 1);
    if (v) {
        skip_ws(&p);
        if (p.s != p.end) {
            perr(&p, "unexpected data after the JSON value");
            json_free(v);
            v = NULL;
        }
    }
    sb_free(&p.tmp);
    return v;
}

/* ---- number formatting -------------------------------------------------- */

/* Shortest decimal digits that round-trip: fills digits (no dot, no sign)
 * and the decimal exponent e such that x = 0.d1d2... * 10^e. */
static int shortest_digits(double x, char *digits, int *exp10) {
    char b[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(b, sizeof b, "%.*e", prec - 1, x);
        if (strtod(b, NULL) == x) break;
    }
    /* b = "d.ddde[+-]XX" */
    char *e = strchr(b, 'e');
    int ex = atoi(e + 1);
    int n = 0;
    for (char *c = b; c < e; c++)
        if (*c >= '0' && *c <= '9') digits[n++] = *c;
    while (n > 1 && digits[n - 1] == '0') n--;
    digits[n] = 0;
    *exp10 = ex + 1;
    return n;
}

void json_format_python_float(char *out, size_t size, double x) {
    if (isnan(x)) {
        snprintf(out, size, "NaN");
        return;
    }
    if (isinf(x)) {
        snprintf(out, size, x < 0 ? "-Infinity" : "Infinity");
        return;
    }
    if (x == 0) {
        snprintf(out, size, signbit(x) ? "-0.0" : "0.0");
        return;
    }
    char digits[24];
    int e;
    const char *sign = x < 0 ? "-" : "";
    int n = shortest_digits(fabs(x), digits, &e);
    /* Python repr: scientific when exponent (e-1) < -4 or >= 16 */
    int sci_exp = e - 1;
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, sign);
    if (sci_exp < -4 || sci_exp >= 16) {
        sb_putc(&sb, digits[0]);
        if (n > 1) {
            sb_putc(&sb, '.');
            sb_append(&sb, digits + 1, (size_t)(n - 1));
        }
        sb_printf(&sb, "e%c%02d", sci_exp < 0 ? '-' : '+', abs(sci_exp));
    } else if (e <= 0) {
        sb_puts(&sb, "0.");
        for (int i = 0; i < -e; i++) sb_putc(&sb, '0');
        sb_append(&sb, digits, (size_t)n);
    } else if (e >= n) {
        sb_append(&sb, digits, (size_t)n);
        for (int i = n; i < e; i++) sb_putc(&sb, '0');
        sb_puts(&sb, ".0");
    } else {
        sb_append(&sb, digits, (size_t)e);
        sb_putc(&sb, '.');
        sb_append(&sb, digits + e, (size_t)(n - e));
    }
    snprintf(out, size, "%s", sb_cstr(&sb));
    sb_free(&sb);
}

void json_format_double(char *out, size_t size, double x) {
    if (!isfinite(x)) {
        snprintf(out, size, "null");
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, size, "%.*g", prec, x);
        if (strtod(out, NULL) == x) return;
    }
}

/* ---- writer ------------------------------------------------------------- */

void json_write_string(strbuf *sb, const char *s, size_t n, int style) {
    static const char hex[] = "0123456789abcdef";
    sb_putc(sb, '"');
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t run = i;
        while (i < n && p[i] >= 0x20 && p[i] != '"' && p[i] != '\\' && !(p[i] >= 0x7F && (style & JSON_ASCII)) && p[i] != 0x7F) i++;
        if (i > run) sb_append(sb, p + run, i - run);
        if (i >= n) break;
        unsigned char c = p[i];
        if (c == 0x7F && !(style & JSON_ASCII)) { /* DEL passes through (Python does) */
            sb_putc(sb, (char)c);
            i++;
            continue;
        }
        if (c >= 0x80) { /* JSON_ASCII: \uXXXX (surrogate pairs above the BMP) */
            size_t l = utf8_seq_len(p + i, n - i);
            if (!l) { /* invalid byte: emit U+FFFD rather than invalid JSON */
                sb_puts(sb, "\\ufffd");
                i++;
                continue;
            }
            unsigned cp = l == 2 ? (c & 0x1Fu) << 6 | (p[i + 1] & 0x3Fu)
                        : l == 3 ? (c & 0x0Fu) << 12 | (p[i + 1] & 0x3Fu) << 6 | (p[i + 2] & 0x3Fu)
                                 : (c & 0x07u) << 18 | (p[i + 1] & 0x3Fu) << 12 | (p[i + 2] & 0x3Fu) << 6 | (p[i + 3] & 0x3Fu);
            if (cp >= 0x10000) {
                unsigned hi = 0xD800 + ((cp - 0x10000) >> 10), lo = 0xDC00 + ((cp - 0x10000) & 0x3FF);
                sb_printf(sb, "\\u%04x\\u%04x", hi, lo);
            } else sb_printf(sb, "\\u%04x", cp);
            i += l;
            continue;
        }
        switch (c) {
        case '"': sb_puts(sb, "\\\""); break;
        case '\\': sb_puts(sb, "\\\\"); break;
        case '\n': sb_puts(sb, "\\n"); break;
        case '\r': sb_puts(sb, "\\r"); break;
        case '\t': sb_puts(sb, "\\t"); break;
        case '\b': sb_puts(sb, "\\b"); break;
        case '\f': sb_puts(sb, "\\f"); break;
        default: {
            char e[7] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15], 0};
            sb_puts(sb, e);
        }
        }
        i++;
    }
    sb_putc(sb, '"');
}

static void write_number(strbuf *sb, const json_value *v, int style) {
    if (!(style & JSON_PYTHON)) {
        sb_append(sb, v->str, v->len);
        return;
    }
    if (v->is_int) { /* Python int: exact, "-0" is 0 */
        const char *s = v->str;
        int neg = s[0] == '-';
        const char *d = s + neg;
        int zero = 1;
        for (const char *c = d; *c; c++)
            if (*c != '0') zero = 0;
        if (zero) sb_putc(sb, '0');
        else sb_append(sb, v->str, v->len);
        return;
    }
    char b[40];
    json_format_python_float(b, sizeof b, v->num);
    sb_puts(sb, b);
}

static void indent(strbuf *sb, int level) {
    sb_putc(sb, '\n');
    for (int i = 0; i < level; i++) sb_puts(sb, "  ");
}

static void write_value(strbuf *sb, const json_value *v, int style, int level) {
    int pretty = style & JSON_PRETTY;
    const char *comma = (style & JSON_PYTHON) && !pretty ? ", " : ",";
    const char *colon = (style & (JSON_PYTHON | JSON_PRETTY)) ? ": " : ":";
    switch (v->type) {
    case JSON_NULL: sb_puts(sb, "null"); break;
    case JSON_TRUE: sb_puts(sb, "true"); break;
    case JSON_FALSE: sb_puts(sb, "false"); break;
    case JSON_NUMBER: write_number(sb, v, style); break;
    case JSON_STRING: json_write_string(sb, v->str, v->len, style); break;
    case JSON_ARRAY:
    case JSON_OBJECT: {
        int obj = v->type == JSON_OBJECT;
        sb_putc(sb, obj ? '{' : '[');
        for (size_t i = 0; i < v->count; i++) {
            if (i) sb_puts(sb, comma);
            if (pretty) indent(sb, level + 1);
            if (obj) {
                json_write_string(sb, v->keys[i], v->key_lens[i], style);
                sb_puts(sb, colon);
            }
            write_value(sb, v->items[i], style, level + 1);
        }
        if (pretty && v->count) indent(sb, level);
        sb_putc(sb, obj ? '}' : ']');
        break;
    }
    }
}

void json_write(strbuf *sb, const json_value *v, int style) { write_value(sb, v, style, 0); }
