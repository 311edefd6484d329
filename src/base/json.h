/* json.h - JSON values that keep what the text said.
 *
 * Why not cJSON or jansson: Splash must re-serialise request JSON exactly as
 * Python's json.dumps would (the chat template's `tojson`: key order kept,
 * 1.0 stays 1.0, 1e-07, integers beyond 2^53 and 2^64 exact).  Libraries that
 * store numbers as doubles lose that, so values here keep the number's source
 * lexeme beside its double.  Objects keep insertion order (duplicate keys: the
 * last one wins, as in Python).
 *
 * Ownership: a parsed tree and every value built with json_new_* is freed
 * with json_free() on its root; json_obj_set / json_arr_push take ownership
 * of the child.
 */
#ifndef SPLASH_JSON_H
#define SPLASH_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "strbuf.h"

typedef enum json_type {
    JSON_NULL,
    JSON_FALSE,
    JSON_TRUE,
    JSON_NUMBER,
    JSON_STRING,
    JSON_ARRAY,
    JSON_OBJECT,
} json_type;

typedef struct json_value json_value;
struct json_value {
    json_type type;
    char *str;   /* string: decoded UTF-8 (may contain NUL); number: lexeme */
    size_t len;  /* bytes in str */
    double num;  /* number value (also set for integers) */
    int is_int;  /* number lexeme has no fraction or exponent */
    size_t count, cap;
    json_value **items; /* array elements or object values */
    char **keys;        /* object keys (NUL-terminated UTF-8) */
    size_t *key_lens;
    uint32_t *index;    /* objects with many keys: open-addressing hash of
                           key -> position+1, so building and lookup stay
                           linear (tokenizer.json has 150K-key objects) */
    size_t index_cap;   /* power of two, or 0 while the object is small */
};

#define JSON_DEFAULT_MAX_DEPTH 128

/* Parses exactly one JSON value (surrounding whitespace allowed).  Strings
 * must be valid UTF-8 and \u escapes valid (lone surrogates rejected).  On
 * error returns NULL and writes "line L, column C: what" into err. */
json_value *json_parse(const char *text, size_t len, int max_depth, char *err, size_t err_size);
void json_free(json_value *v);

/* Lookups: NULL if absent or if v is not of the right type. */
json_value *json_get(const json_value *obj, const char *key);
json_value *json_at(const json_value *arr, size_t i);
const char *json_string(const json_value *v); /* NULL unless a string */
int json_is_bool(const json_value *v);
/* The value as int64 if it is an integer number in range; else returns -1. */
int json_int64(const json_value *v, int64_t *out);
/* Convenience getters with defaults. */
const char *json_get_string(const json_value *obj, const char *key, const char *dflt);
int64_t json_get_int(const json_value *obj, const char *key, int64_t dflt);
double json_get_num(const json_value *obj, const char *key, double dflt);
int json_get_bool(const json_value *obj, const char *key, int dflt);

/* Builders. */
json_value *json_new(json_type t);
json_value *json_new_string(const char *s);
json_value *json_new_stringn(const char *s, size_t n);
json_value *json_new_int(int64_t x);
json_value *json_new_double(double x);  /* lexeme: shortest round-trip */
json_value *json_new_number_lexeme(const char *lexeme);
json_value *json_new_bool(int b);
/* Sets key (replacing an existing value in place), takes ownership of val. */
void json_obj_set(json_value *obj, const char *key, json_value *val);
void json_arr_push(json_value *arr, json_value *val);
json_value *json_clone(const json_value *v);

/* Serialisation styles. */
enum {
    JSON_COMPACT = 0,      /* {"a":1,"b":[1,2]}  numbers as their lexeme */
    JSON_PRETTY = 1,       /* 2-space indent */
    JSON_PYTHON = 2,       /* json.dumps(ensure_ascii=False): ", " and ": ",
                              numbers as Python would print them */
    JSON_ASCII = 4,        /* escape non-ASCII as \uXXXX (with PYTHON: ensure_ascii=True) */
};
void json_write(strbuf *sb, const json_value *v, int style);
/* Writes s as a JSON string literal (quotes included). */
void json_write_string(strbuf *sb, const char *s, size_t n, int style);
/* Python repr() of a double: "1.0", "1e-07", "1e+16", "inf" (as Infinity
 * in JSON), shortest digits that round-trip. */
void json_format_python_float(char *out, size_t size, double x);
/* The shortest "%.*g" form of x that round-trips (for JSON_COMPACT). */
void json_format_double(char *out, size_t size, double x);

/* Checks that s[0..n) is valid UTF-8 (no surrogates, no overlongs). */
int json_utf8_valid(const char *s, size_t n);

#endif
