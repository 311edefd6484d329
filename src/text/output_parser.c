/* output_parser.c - the streaming parser of output_parser.h.
 *
 * Shape: a byte-at-a-time state machine behind a UTF-8 assembler.  The
 * assembler hands the machine whole characters only, and every feed() ends by
 * flushing what the machine decided, so event text always ends on a character
 * boundary.  Tags are ASCII and have their only '<' at position 0, which keeps
 * the hold-back rule simple: `pend` holds a run that is still a prefix of a tag
 * the current state cares about; the first byte that breaks it releases the
 * run (all but that byte are text; that byte may start a new run).
 *
 * Text deltas of one kind are coalesced in `out` and delivered once per feed()
 * or before any other event.  String parameter values are collected raw in
 * `sval` and JSON-escaped when flushed (json_write_string), so the escaper sees
 * whole characters.
 *
 * The states, in the order the template writes them:
 *   M_REASONING  text up to </think>
 *   M_CONTENT    text, <tool_call> (and <think> before any content)
 *   C_OPEN       after <tool_call>: whitespace, then <function=
 *   C_FNAME      the function name up to '>'
 *   C_BODY       whitespace, then <parameter= or </function>
 *   C_PNAME      the parameter name up to '>'
 *   C_VALUE      the value, up to "\n</parameter>" confirmed by what follows
 *   C_AFTER      after </function>: whitespace, then </tool_call>
 *   C_SKIP       a malformed call: everything up to </tool_call>
 */
#include "text/output_parser.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/status.h"

enum { M_REASONING, M_CONTENT, C_OPEN, C_FNAME, C_BODY, C_PNAME, C_VALUE, C_AFTER, C_SKIP };
#define IN_CALL(m) ((m) >= C_OPEN)

enum { FAIL, PARTIAL, FULL };

/* JSON schema types, as a bit set. */
enum { T_STRING = 1, T_INTEGER = 2, T_NUMBER = 4, T_BOOLEAN = 8, T_OBJECT = 16, T_ARRAY = 32, T_NULL = 64 };

#define NAME_MAX_LEN 256 /* longest function or parameter name accepted */
#define CLOSE_WINDOW 256 /* most bytes a value's close sequence may span */
#define ID_CHARS 24

static const char TAG_THINK[] = "<think>";
static const char TAG_THINK_END[] = "</think>";
static const char TAG_CALL[] = "<tool_call>";
static const char TAG_CALL_END[] = "</tool_call>";
static const char TAG_FUNC[] = "<function=";
static const char TAG_FUNC_END[] = "</function>";
static const char TAG_PARAM[] = "<parameter=";
static const char TAG_PARAM_END[] = "</parameter>";

struct splash_output_parser {
    splash_output_cb cb;
    void *ctx;
    const json_value *tools;
    char id_prefix[32];
    uint64_t rng;
    int mode;
    int finished, failed;

    /* text states */
    int think_seen;        /* a reasoning block was opened (prompt or tag) */
    int content_started;   /* content other than held newlines (or a call) went out */
    int reasoning_emitted; /* reasoning text went out since the block opened */
    int strip_lead;        /* drop '\n' until the first other byte */
    size_t nl_held;        /* '\n' held at the end of reasoning/content */
    strbuf pend;           /* bytes that may still be a tag (or a value's close) */
    unsigned char u8[4];   /* an incomplete UTF-8 character */
    int u8_len, u8_need;

    /* output coalescing */
    strbuf out;            /* pending text of kind out_kind */
    int out_kind;          /* -1: none */
    strbuf sval;           /* raw string-value bytes not yet escaped into out */
    strbuf esc;            /* scratch for escaping */

    /* the current call */
    strbuf raw;            /* its text from <tool_call>, for error events */
    strbuf name, pname, val, args;
    strbuf seen;           /* parameter names so far, each NUL-terminated */
    int ncalls;
    int call_index;        /* -1 until CALL_BEGIN */
    int nparams;
    char id[64];
    const json_value *tool;
    unsigned ptypes;       /* T_* of the current parameter */
    int pstring;           /* the current value streams as a JSON string */
    int val_lead;          /* the value's first byte is next (a '\n' there is dropped) */
    int truncating;        /* finish() is closing a cut-off call: no value notes */
    char bad[200];         /* C_SKIP: why the call is malformed */
    char msg[512];
};

static void step(splash_output_parser *p, unsigned char c);

/* ---- matching ------------------------------------------------------------ */

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Is s[0..n) one of lits (FULL, *which set), a proper prefix of one (PARTIAL),
 * or neither (FAIL)?  No literal is a prefix of another. */
static int match_lits(const char *s, size_t n, const char *const *lits, int nlits, int *which) {
    int partial = 0;
    for (int i = 0; i < nlits; i++) {
        size_t l = strlen(lits[i]);
        if (n <= l && !memcmp(s, lits[i], n)) {
            if (n == l) {
                *which = i;
                return FULL;
            }
            partial = 1;
        }
    }
    return partial ? PARTIAL : FAIL;
}

static const char *const VALUE_NEXT[] = {TAG_PARAM, TAG_FUNC_END, TAG_CALL_END};

/* A value ends at "\n?</parameter>" followed by whitespace and one of
 * VALUE_NEXT; a </parameter> followed by anything else is part of the value
 * (a model writing this very parser's tests needs that).  The whitespace
 * between must fit in CLOSE_WINDOW bytes. */
static int match_close(const char *s, size_t n, int *which) {
    if (n > CLOSE_WINDOW) return FAIL; /* bounds the work per byte */
    size_t i = n && s[0] == '\n' ? 1 : 0;
    size_t l = sizeof TAG_PARAM_END - 1;
    if (i == n) return PARTIAL;
    size_t m = n - i < l ? n - i : l;
    if (memcmp(s + i, TAG_PARAM_END, m)) return FAIL;
    if (n - i < l) return PARTIAL;
    i += l;
    while (i < n && is_ws((unsigned char)s[i])) i++;
    if (i == n) return PARTIAL;
    return match_lits(s + i, n - i, VALUE_NEXT, 3, which);
}

/* Does s hold a complete "\n?</parameter>" at its start? */
static int has_param_end(const char *s, size_t n) {
    size_t i = n && s[0] == '\n' ? 1 : 0;
    size_t l = sizeof TAG_PARAM_END - 1;
    return n - i >= l && !memcmp(s + i, TAG_PARAM_END, l);
}

/* ---- events -------------------------------------------------------------- */

static void out_kind(splash_output_parser *p, int kind);

static void flush_sval(splash_output_parser *p) {
    if (!p->sval.len) return;
    sb_clear(&p->esc);
    json_write_string(&p->esc, p->sval.data, p->sval.len, JSON_PYTHON);
    if (p->esc.len >= 2) {
        sb_append(&p->out, p->esc.data + 1, p->esc.len - 2);
        sb_append(&p->args, p->esc.data + 1, p->esc.len - 2);
    }
    sb_clear(&p->sval);
}

static void flush_out(splash_output_parser *p) {
    flush_sval(p);
    if (p->out.len && !p->out.oom) {
        splash_output_event ev = {0};
        ev.kind = (splash_output_kind)p->out_kind;
        ev.index = p->out_kind == SPLASH_OUTPUT_CALL_ARGS ? p->call_index : -1;
        ev.text = p->out.data;
        ev.len = p->out.len;
        p->cb(p->ctx, &ev);
    }
    sb_clear(&p->out);
    p->out_kind = -1;
}

static void out_kind(splash_output_parser *p, int kind) {
    if (p->out_kind != kind) {
        flush_out(p);
        p->out_kind = kind;
    }
}

static void emit(splash_output_parser *p, splash_output_event *ev) {
    flush_out(p);
    p->cb(p->ctx, ev);
}

static void emit_error(splash_output_parser *p, splash_output_err code, int usable, const char *raw, size_t rawlen,
                       const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static void emit_error(splash_output_parser *p, splash_output_err code, int usable, const char *raw, size_t rawlen,
                       const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->msg, sizeof p->msg, fmt, ap);
    va_end(ap);
    splash_output_event ev = {0};
    ev.kind = SPLASH_OUTPUT_ERROR;
    ev.index = p->call_index;
    ev.error = code;
    ev.message = p->msg;
    ev.text = raw ? raw : "";
    ev.len = raw ? rawlen : 0;
    ev.call_usable = p->call_index >= 0 ? usable : 0;
    emit(p, &ev);
}

static void args_put(splash_output_parser *p, const char *s, size_t n) {
    out_kind(p, SPLASH_OUTPUT_CALL_ARGS);
    flush_sval(p);
    sb_append(&p->out, s, n);
    sb_append(&p->args, s, n);
}

static void args_puts(splash_output_parser *p, const char *s) { args_put(p, s, strlen(s)); }

static void args_string(splash_output_parser *p, const char *s, size_t n) {
    sb_clear(&p->esc);
    json_write_string(&p->esc, s, n, JSON_PYTHON);
    args_put(p, p->esc.data, p->esc.len);
}

/* ---- schemas ------------------------------------------------------------- */

static unsigned type_bit(const char *t) {
    static const struct { const char *name; unsigned bit; } map[] = {
        {"string", T_STRING}, {"integer", T_INTEGER}, {"number", T_NUMBER}, {"boolean", T_BOOLEAN},
        {"object", T_OBJECT}, {"array", T_ARRAY},     {"null", T_NULL},
    };
    for (size_t i = 0; t && i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(t, map[i].name)) return map[i].bit;
    return 0;
}

static unsigned value_bit(const json_value *v) {
    switch (v->type) {
    case JSON_NULL: return T_NULL;
    case JSON_FALSE:
    case JSON_TRUE: return T_BOOLEAN;
    case JSON_NUMBER: return v->is_int ? T_INTEGER : T_NUMBER;
    case JSON_STRING: return T_STRING;
    case JSON_ARRAY: return T_ARRAY;
    case JSON_OBJECT: return T_OBJECT;
    }
    return 0;
}

/* The types a parameter schema allows: "type" (a name or a list), else the
 * union of anyOf/oneOf branches, else the types of "enum" / "const" values.
 * 0 means no type information (the value is then a string). */
static unsigned schema_types(const json_value *s, int depth) {
    if (!s || s->type != JSON_OBJECT || depth > 8) return 0;
    unsigned m = 0;
    const json_value *t = json_get(s, "type");
    if (t && t->type == JSON_STRING) m |= type_bit(t->str);
    for (size_t i = 0; t && t->type == JSON_ARRAY && i < t->count; i++) m |= type_bit(json_string(t->items[i]));
    if (m) return m;
    static const char *const unions[] = {"anyOf", "oneOf"};
    for (int u = 0; u < 2; u++) {
        const json_value *a = json_get(s, unions[u]);
        for (size_t i = 0; a && a->type == JSON_ARRAY && i < a->count; i++) m |= schema_types(a->items[i], depth + 1);
    }
    if (m) return m;
    const json_value *e = json_get(s, "enum");
    for (size_t i = 0; e && e->type == JSON_ARRAY && i < e->count; i++) m |= value_bit(e->items[i]);
    const json_value *c = json_get(s, "const");
    if (c) m |= value_bit(c);
    return m;
}

/* The tool's function object ({name, parameters|input_schema}), or NULL. */
static const json_value *find_tool(const json_value *tools, const char *name, size_t n) {
    if (!tools || tools->type != JSON_ARRAY) return NULL;
    for (size_t i = 0; i < tools->count; i++) {
        const json_value *fn = json_get(tools->items[i], "function");
        if (!fn || fn->type != JSON_OBJECT) fn = tools->items[i];
        const json_value *nm = json_get(fn, "name");
        if (nm && nm->type == JSON_STRING && nm->len == n && !memcmp(nm->str, name, n)) return fn;
    }
    return NULL;
}

static const json_value *param_schema(const json_value *fn, const char *pname) {
    const json_value *params = json_get(fn, "parameters");
    if (!params) params = json_get(fn, "input_schema");
    return json_get(json_get(params, "properties"), pname);
}

/* ---- ids ----------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void make_id(splash_output_parser *p) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    size_t n = strlen(p->id_prefix);
    memcpy(p->id, p->id_prefix, n);
    for (size_t i = 0; i < ID_CHARS; i++) p->id[n + i] = abc[splitmix64(&p->rng) % 62];
    p->id[n + ID_CHARS] = 0;
}

/* ---- calls --------------------------------------------------------------- */

static void call_start(splash_output_parser *p) {
    p->mode = C_OPEN;
    p->content_started = 1; /* a <think> after a call is text */
    sb_clear(&p->raw);
    sb_puts(&p->raw, TAG_CALL);
    sb_clear(&p->args);
    sb_clear(&p->seen);
    sb_clear(&p->pend);
    p->call_index = -1;
    p->nparams = 0;
    p->tool = NULL;
    p->bad[0] = 0;
}

/* Closes the current call: closes its arguments object, reports code (if
 * any), sends CALL_END, and goes back to content. */
static void end_call(splash_output_parser *p, splash_output_err code, int usable, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void end_call(splash_output_parser *p, splash_output_err code, int usable, const char *fmt, ...) {
    if (p->call_index >= 0) args_puts(p, p->nparams ? "}" : "{}");
    if (code != SPLASH_OUTPUT_ERR_NONE) {
        char m[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m, sizeof m, fmt, ap);
        va_end(ap);
        emit_error(p, code, usable, p->raw.data, p->raw.len, "%s", m);
    }
    if (p->call_index >= 0) {
        splash_output_event ev = {0};
        ev.kind = SPLASH_OUTPUT_CALL_END;
        ev.index = p->call_index;
        ev.id = p->id;
        ev.name = sb_cstr(&p->name);
        ev.text = sb_cstr(&p->args);
        ev.len = p->args.len;
        emit(p, &ev);
    }
    p->call_index = -1;
    p->mode = M_CONTENT;
    p->strip_lead = 1;
    p->nl_held = 0;
    sb_clear(&p->raw);
    sb_clear(&p->pend);
}

/* A <tool_call> arrived while a call was still open: close that one (the
 * tag's bytes are not part of its raw text) and start the next. */
static void end_call_restart(splash_output_parser *p, splash_output_err code, int usable, const char *what) {
    size_t l = sizeof TAG_CALL - 1;
    if (p->raw.len >= l) p->raw.len -= l, p->raw.data[p->raw.len] = 0;
    end_call(p, code, usable, "%s", what);
    call_start(p);
}

static const char *call_name(splash_output_parser *p) { return p->call_index >= 0 ? sb_cstr(&p->name) : "?"; }

/* The call is malformed at byte c: skip to </tool_call>, then report. */
static void go_bad(splash_output_parser *p, unsigned char c, const char *what) {
    snprintf(p->bad, sizeof p->bad, "malformed tool call%s%s%s: %s", p->call_index >= 0 ? " to '" : "",
             p->call_index >= 0 ? sb_cstr(&p->name) : "", p->call_index >= 0 ? "'" : "", what);
    p->mode = C_SKIP;
    sb_clear(&p->pend);
    if (c == '<') sb_putc(&p->pend, '<');
}

static void begin_call(splash_output_parser *p) {
    p->call_index = p->ncalls++;
    make_id(p);
    p->tool = find_tool(p->tools, p->name.data, p->name.len);
    splash_output_event ev = {0};
    ev.kind = SPLASH_OUTPUT_CALL_BEGIN;
    ev.index = p->call_index;
    ev.id = p->id;
    ev.name = p->name.data;
    emit(p, &ev);
    if (!p->tool)
        emit_error(p, SPLASH_OUTPUT_ERR_UNKNOWN_TOOL, 1, p->name.data, p->name.len,
                   "the model called an unknown tool '%s'", p->name.data);
    p->mode = C_BODY;
}

static void begin_param(splash_output_parser *p) {
    for (size_t i = 0; i < p->seen.len; i += strlen(p->seen.data + i) + 1)
        if (!strcmp(p->seen.data + i, p->pname.data)) {
            emit_error(p, SPLASH_OUTPUT_ERR_MALFORMED, 1, p->pname.data, p->pname.len,
                       "parameter '%s' of '%s' is given twice; the last value wins", p->pname.data, p->name.data);
            break;
        }
    sb_append(&p->seen, p->pname.data, p->pname.len + 1);
    p->ptypes = p->tool ? schema_types(param_schema(p->tool, p->pname.data), 0) : 0;
    p->pstring = !p->ptypes || ((p->ptypes & T_STRING) && !(p->ptypes & ~(unsigned)(T_STRING | T_NULL)));
    args_puts(p, p->nparams ? ", " : "{");
    args_string(p, p->pname.data, p->pname.len);
    args_puts(p, p->pstring ? ": \"" : ": ");
    p->nparams++;
    p->val_lead = 1;
    sb_clear(&p->val);
    sb_clear(&p->pend);
    p->mode = C_VALUE;
}

static void value_put(splash_output_parser *p, unsigned char c) {
    if (p->pstring) {
        out_kind(p, SPLASH_OUTPUT_CALL_ARGS);
        sb_putc(&p->sval, (char)c);
    } else {
        sb_putc(&p->val, (char)c);
    }
}

static const char *types_name(unsigned m) {
    if (m & T_OBJECT) return "an object";
    if (m & T_ARRAY) return "an array";
    if (m & T_BOOLEAN) return "a boolean";
    if (m & (T_INTEGER | T_NUMBER)) return "a number";
    return "null";
}

/* The value is complete: close the string, or parse the typed value. */
static void close_value(splash_output_parser *p) {
    if (p->pstring) {
        args_puts(p, "\"");
        return;
    }
    char err[128];
    json_value *v = json_parse(p->val.data ? p->val.data : "", p->val.len, JSON_DEFAULT_MAX_DEPTH, err, sizeof err);
    /* A JSON string is never taken as parsed: the template writes string
     * values raw, so quotes in the text are part of the string. */
    int ok = v && v->type != JSON_STRING && (v->type == JSON_NULL || (value_bit(v) & p->ptypes) ||
                                             (v->type == JSON_NUMBER && (p->ptypes & (T_INTEGER | T_NUMBER))));
    if (ok) {
        strbuf sb;
        sb_init(&sb);
        json_write(&sb, v, JSON_PYTHON);
        args_put(p, sb.data, sb.len);
        if (sb.oom) p->failed = 1;
        sb_free(&sb);
    } else {
        args_string(p, p->val.data ? p->val.data : "", p->val.len);
        if (!(p->ptypes & T_STRING) && !p->truncating)
            emit_error(p, SPLASH_OUTPUT_ERR_VALUE, 1, p->val.data, p->val.len,
                       "parameter '%s' of '%s' should be %s; kept as a string", p->pname.data, p->name.data,
                       types_name(p->ptypes));
    }
    json_free(v);
}

/* ---- the machine --------------------------------------------------------- */

/* One byte of reasoning or content text (not a tag). */
static void text_put(splash_output_parser *p, unsigned char c) {
    int kind = p->mode == M_REASONING ? SPLASH_OUTPUT_REASONING : SPLASH_OUTPUT_CONTENT;
    if (c == '\n') {
        if (!p->strip_lead) p->nl_held++;
        return;
    }
    out_kind(p, kind);
    for (; p->nl_held; p->nl_held--) sb_putc(&p->out, '\n');
    sb_putc(&p->out, (char)c);
    p->strip_lead = 0;
    if (kind == SPLASH_OUTPUT_REASONING) p->reasoning_emitted = 1;
    else p->content_started = 1;
}

static void reasoning_end(splash_output_parser *p) {
    p->nl_held = 0;
    if (p->reasoning_emitted) {
        splash_output_event ev = {0};
        ev.kind = SPLASH_OUTPUT_REASONING_END;
        ev.index = -1;
        emit(p, &ev);
    }
    p->reasoning_emitted = 0;
}

static void text_step(splash_output_parser *p, unsigned char c) {
    if (!p->pend.len && c != '<') {
        text_put(p, c);
        return;
    }
    sb_putc(&p->pend, (char)c);
    const char *lits[2];
    int nlits = 0, which = 0;
    if (p->mode == M_REASONING) {
        lits[nlits++] = TAG_THINK_END;
    } else {
        lits[nlits++] = TAG_CALL;
        if (!p->think_seen && !p->content_started) lits[nlits++] = TAG_THINK;
    }
    int r = match_lits(p->pend.data, p->pend.len, lits, nlits, &which);
    if (r == PARTIAL) return;
    if (r == FULL) {
        sb_clear(&p->pend);
        if (lits[which] == TAG_THINK_END) {
            reasoning_end(p);
            p->mode = M_CONTENT;
            p->strip_lead = 1;
        } else if (lits[which] == TAG_THINK) {
            p->nl_held = 0;
            p->think_seen = 1;
            p->reasoning_emitted = 0;
            p->mode = M_REASONING;
            p->strip_lead = 1;
        } else {
            p->nl_held = 0;
            call_start(p);
        }
        return;
    }
    /* Not a tag: everything before c is text, and c may start a tag. */
    size_t n = p->pend.len - 1;
    for (size_t i = 0; i < n; i++) text_put(p, (unsigned char)p->pend.data[i]);
    sb_clear(&p->pend);
    text_step(p, c);
}

static void struct_tag(splash_output_parser *p, const char *tag) {
    switch (p->mode) {
    case C_OPEN:
        if (tag == TAG_FUNC) {
            p->mode = C_FNAME;
            sb_clear(&p->name);
        } else if (tag == TAG_CALL_END) {
            end_call(p, SPLASH_OUTPUT_ERR_MALFORMED, 0, "empty <tool_call>");
        } else {
            end_call_restart(p, SPLASH_OUTPUT_ERR_MALFORMED, 0, "a <tool_call> without a function");
        }
        break;
    case C_BODY:
        if (tag == TAG_PARAM) {
            p->mode = C_PNAME;
            sb_clear(&p->pname);
        } else if (tag == TAG_FUNC_END) {
            p->mode = C_AFTER;
        } else if (tag == TAG_CALL_END) {
            end_call(p, SPLASH_OUTPUT_ERR_MALFORMED, 1, "the call to '%s' is missing </function>", p->name.data);
        } else {
            end_call_restart(p, SPLASH_OUTPUT_ERR_MALFORMED, 1, "a tool call is missing </function></tool_call>");
        }
        break;
    case C_AFTER:
        if (tag == TAG_CALL_END) end_call(p, SPLASH_OUTPUT_ERR_NONE, 1, "%s", "");
        else end_call_restart(p, SPLASH_OUTPUT_ERR_MALFORMED, 1, "a tool call is missing </tool_call>");
        break;
    case C_SKIP:
        if (tag == TAG_CALL_END) end_call(p, SPLASH_OUTPUT_ERR_MALFORMED, 0, "%s", p->bad);
        else end_call_restart(p, SPLASH_OUTPUT_ERR_MALFORMED, 0, p->bad);
        break;
    }
}

/* C_OPEN, C_BODY, C_AFTER, C_SKIP: whitespace and tags. */
static void struct_step(splash_output_parser *p, unsigned char c) {
    static const char *const open_lits[] = {TAG_FUNC, TAG_CALL_END, TAG_CALL};
    static const char *const body_lits[] = {TAG_PARAM, TAG_FUNC_END, TAG_CALL_END, TAG_CALL};
    static const char *const end_lits[] = {TAG_CALL_END, TAG_CALL};
    if (!p->pend.len && c != '<' && (is_ws(c) || p->mode == C_SKIP)) return;
    sb_putc(&p->pend, (char)c);
    const char *const *lits = p->mode == C_OPEN ? open_lits : p->mode == C_BODY ? body_lits : end_lits;
    int nlits = p->mode == C_OPEN ? 3 : p->mode == C_BODY ? 4 : 2;
    int which = 0;
    int r = match_lits(p->pend.data, p->pend.len, lits, nlits, &which);
    if (r == PARTIAL) return;
    if (r == FULL) {
        sb_clear(&p->pend);
        struct_tag(p, lits[which]);
        return;
    }
    switch (p->mode) {
    case C_SKIP:
        sb_clear(&p->pend);
        if (c == '<') sb_putc(&p->pend, '<');
        break;
    case C_AFTER: {
        /* The call is whole but </tool_call> is missing: end it, and the
         * bytes held here are content again. */
        char held[16];
        size_t n = p->pend.len < sizeof held ? p->pend.len : sizeof held;
        memcpy(held, p->pend.data, n);
        if (p->raw.len >= n) p->raw.len -= n, p->raw.data[p->raw.len] = 0;
        end_call(p, SPLASH_OUTPUT_ERR_MALFORMED, 1, "the call to '%s' is missing </tool_call>", p->name.data);
        for (size_t i = 0; i < n; i++) step(p, (unsigned char)held[i]);
        break;
    }
    case C_OPEN: go_bad(p, c, "expected <function=NAME> after <tool_call>"); break;
    default: go_bad(p, c, "expected <parameter=NAME> or </function>"); break;
    }
}

/* C_FNAME, C_PNAME: a name up to '>'. */
static void name_step(splash_output_parser *p, unsigned char c) {
    strbuf *nb = p->mode == C_FNAME ? &p->name : &p->pname;
    if (c == '>') {
        size_t a = 0, b = nb->len;
        while (a < b && is_ws((unsigned char)nb->data[a])) a++;
        while (b > a && is_ws((unsigned char)nb->data[b - 1])) b--;
        if (a == b) {
            go_bad(p, c, p->mode == C_FNAME ? "empty function name" : "empty parameter name");
            return;
        }
        memmove(nb->data, nb->data + a, b - a);
        nb->len = b - a;
        nb->data[nb->len] = 0;
        if (p->mode == C_FNAME) begin_call(p);
        else begin_param(p);
        return;
    }
    if (c == '\n' || c == '<' || c == 0 || nb->len >= NAME_MAX_LEN) {
        go_bad(p, c, p->mode == C_FNAME ? "bad function name" : "bad parameter name");
        return;
    }
    sb_putc(nb, (char)c);
}

static void value_step(splash_output_parser *p, unsigned char c) {
    if (p->val_lead) {
        p->val_lead = 0;
        if (c == '\n') return;
    }
    if (!p->pend.len && c != '\n' && c != '<') {
        value_put(p, c);
        return;
    }
    sb_putc(&p->pend, (char)c);
    for (;;) {
        int which = 0;
        int r = match_close(p->pend.data, p->pend.len, &which);
        if (r == PARTIAL) return;
        if (r == FULL) {
            sb_clear(&p->pend);
            close_value(p);
            p->mode = C_BODY;
            struct_tag(p, VALUE_NEXT[which]);
            return;
        }
        /* The first byte is value text, and so is everything up to the next
         * byte that could start a close. */
        size_t k = 1;
        while (k < p->pend.len && p->pend.data[k] != '\n' && p->pend.data[k] != '<') k++;
        for (size_t i = 0; i < k; i++) value_put(p, (unsigned char)p->pend.data[i]);
        memmove(p->pend.data, p->pend.data + k, p->pend.len - k);
        p->pend.len -= k;
        p->pend.data[p->pend.len] = 0;
        if (!p->pend.len) return;
    }
}

static void step(splash_output_parser *p, unsigned char c) {
    if (IN_CALL(p->mode)) sb_putc(&p->raw, (char)c);
    switch (p->mode) {
    case M_REASONING:
    case M_CONTENT: text_step(p, c); break;
    case C_FNAME:
    case C_PNAME: name_step(p, c); break;
    case C_VALUE: value_step(p, c); break;
    default: struct_step(p, c); break;
    }
}

/* ---- UTF-8 assembly ------------------------------------------------------ */

static int lead_len(unsigned char c) {
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

static int cont_ok(unsigned char lead, int pos, unsigned char c) {
    if ((c & 0xC0) != 0x80) return 0;
    if (pos == 1) {
        if (lead == 0xE0 && c < 0xA0) return 0; /* overlong */
        if (lead == 0xED && c >= 0xA0) return 0; /* surrogate */
        if (lead == 0xF0 && c < 0x90) return 0;
        if (lead == 0xF4 && c >= 0x90) return 0;
    }
    return 1;
}

static void replacement(splash_output_parser *p) {
    step(p, 0xEF);
    step(p, 0xBF);
    step(p, 0xBD);
}

static void feed_byte(splash_output_parser *p, unsigned char c) {
    if (p->u8_len) {
        if (cont_ok(p->u8[0], p->u8_len, c)) {
            p->u8[p->u8_len++] = c;
            if (p->u8_len == p->u8_need) {
                for (int i = 0; i < p->u8_len; i++) step(p, p->u8[i]);
                p->u8_len = 0;
            }
            return;
        }
        replacement(p); /* an incomplete character; c starts afresh */
        p->u8_len = 0;
    }
    if (c < 0x80) {
        step(p, c);
        return;
    }
    int need = lead_len(c);
    if (!need) {
        replacement(p);
        return;
    }
    p->u8[0] = c;
    p->u8_len = 1;
    p->u8_need = need;
}

/* ---- public -------------------------------------------------------------- */

static int check_oom(splash_output_parser *p) {
    strbuf *all[] = {&p->pend, &p->out, &p->sval, &p->esc, &p->raw, &p->name, &p->pname, &p->val, &p->args, &p->seen};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]->oom) p->failed = 1;
    return p->failed ? SPLASH_E_NOMEM : SPLASH_OK;
}

splash_output_parser *splash_output_parser_new(const splash_output_opts *opts, splash_output_cb cb, void *ctx) {
    static _Atomic uint64_t counter;
    splash_output_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    splash_output_opts o = {0};
    if (opts) o = *opts;
    p->cb = cb;
    p->ctx = ctx;
    p->tools = o.tools;
    snprintf(p->id_prefix, sizeof p->id_prefix, "%s", o.id_prefix ? o.id_prefix : "call_");
    if (o.id_seed) {
        p->rng = o.id_seed;
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        p->rng = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ (uint64_t)(uintptr_t)p ^
                 atomic_fetch_add(&counter, 1) << 40;
        splitmix64(&p->rng);
    }
    p->mode = o.in_reasoning ? M_REASONING : M_CONTENT;
    p->think_seen = o.in_reasoning != 0;
    p->strip_lead = o.in_reasoning != 0;
    p->out_kind = -1;
    p->call_index = -1;
    sb_init(&p->pend);
    sb_init(&p->out);
    sb_init(&p->sval);
    sb_init(&p->esc);
    sb_init(&p->raw);
    sb_init(&p->name);
    sb_init(&p->pname);
    sb_init(&p->val);
    sb_init(&p->args);
    sb_init(&p->seen);
    return p;
}

int splash_output_parser_feed(splash_output_parser *p, const char *text, size_t n) {
    if (p->finished) return SPLASH_E_INVALID;
    if (p->failed) return SPLASH_E_NOMEM;
    for (size_t i = 0; i < n; i++) feed_byte(p, (unsigned char)text[i]);
    flush_out(p);
    return check_oom(p);
}

int splash_output_parser_finish(splash_output_parser *p) {
    if (p->finished) return SPLASH_E_INVALID;
    if (p->failed) return SPLASH_E_NOMEM;
    if (p->u8_len) {
        p->u8_len = 0;
        replacement(p);
    }
    /* What is held is text after all (a lone "<tool_ca" at the very end is
     * what the model wrote, not a tag). */
    size_t n = p->pend.len;
    switch (p->mode) {
    case M_REASONING:
    case M_CONTENT:
        for (size_t i = 0; i < n; i++) text_put(p, (unsigned char)p->pend.data[i]);
        sb_clear(&p->pend);
        if (p->mode == M_REASONING) {
            reasoning_end(p);
        } else if (p->nl_held) {
            out_kind(p, SPLASH_OUTPUT_CONTENT);
            for (; p->nl_held; p->nl_held--) sb_putc(&p->out, '\n');
        }
        break;
    case C_VALUE:
        p->truncating = 1;
        if (!has_param_end(p->pend.data, n))
            for (size_t i = 0; i < n; i++) value_put(p, (unsigned char)p->pend.data[i]);
        sb_clear(&p->pend);
        close_value(p);
        end_call(p, SPLASH_OUTPUT_ERR_TRUNCATED, 0, "the output ended inside the call to '%s'", p->name.data);
        break;
    case C_AFTER:
        end_call(p, SPLASH_OUTPUT_ERR_TRUNCATED, 1, "the output ended before </tool_call> of the call to '%s'",
                 p->name.data);
        break;
    case C_SKIP:
        end_call(p, SPLASH_OUTPUT_ERR_MALFORMED, 0, "%s (and the output ended before </tool_call>)", p->bad);
        break;
    default:
        end_call(p, SPLASH_OUTPUT_ERR_TRUNCATED, 0, "the output ended inside a tool call%s%s%s",
                 p->call_index >= 0 ? " to '" : "", p->call_index >= 0 ? call_name(p) : "",
                 p->call_index >= 0 ? "'" : "");
        break;
    }
    flush_out(p);
    p->finished = 1;
    return check_oom(p);
}

void splash_output_parser_free(splash_output_parser *p) {
    if (!p) return;
    sb_free(&p->pend);
    sb_free(&p->out);
    sb_free(&p->sval);
    sb_free(&p->esc);
    sb_free(&p->raw);
    sb_free(&p->name);
    sb_free(&p->pname);
    sb_free(&p->val);
    sb_free(&p->args);
    sb_free(&p->seen);
    free(p);
}

/* ---- whole-text convenience ---------------------------------------------- */

static char *dupn(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    if (n) memcpy(d, s, n);
    d[n] = 0;
    return d;
}

void splash_output_collect(void *ctx, const splash_output_event *ev) {
    splash_output_result *r = ctx;
    switch (ev->kind) {
    case SPLASH_OUTPUT_REASONING: sb_append(&r->reasoning, ev->text, ev->len); break;
    case SPLASH_OUTPUT_CONTENT: sb_append(&r->content, ev->text, ev->len); break;
    case SPLASH_OUTPUT_REASONING_END:
    case SPLASH_OUTPUT_CALL_ARGS: break;
    case SPLASH_OUTPUT_CALL_BEGIN: {
        if (r->ncalls == r->calls_cap) {
            size_t cap = r->calls_cap ? 2 * r->calls_cap : 4;
            splash_output_call *c = realloc(r->calls, cap * sizeof *c);
            if (!c) {
                r->oom = 1;
                return;
            }
            r->calls = c;
            r->calls_cap = cap;
        }
        splash_output_call *c = &r->calls[r->ncalls++];
        memset(c, 0, sizeof *c);
        c->id = dupn(ev->id, strlen(ev->id));
        c->name = dupn(ev->name, strlen(ev->name));
        c->complete = 1;
        if (!c->id || !c->name) r->oom = 1;
        break;
    }
    case SPLASH_OUTPUT_CALL_END:
        if (ev->index >= 0 && (size_t)ev->index < r->ncalls) {
            splash_output_call *c = &r->calls[ev->index];
            free(c->arguments);
            c->arguments = dupn(ev->text, ev->len);
            c->arguments_len = ev->len;
            if (!c->arguments) r->oom = 1;
        }
        break;
    case SPLASH_OUTPUT_ERROR: {
        if (ev->index >= 0 && (size_t)ev->index < r->ncalls && !ev->call_usable) r->calls[ev->index].complete = 0;
        if (r->nerrors == r->errors_cap) {
            size_t cap = r->errors_cap ? 2 * r->errors_cap : 4;
            splash_output_error *e = realloc(r->errors, cap * sizeof *e);
            if (!e) {
                r->oom = 1;
                return;
            }
            r->errors = e;
            r->errors_cap = cap;
        }
        splash_output_error *e = &r->errors[r->nerrors++];
        e->code = ev->error;
        e->index = ev->index;
        e->call_usable = ev->call_usable;
        e->message = dupn(ev->message, strlen(ev->message));
        e->raw = dupn(ev->text, ev->len);
        e->raw_len = ev->len;
        if (!e->message || !e->raw) r->oom = 1;
        break;
    }
    }
}

int splash_output_parse(const char *text, size_t n, const splash_output_opts *opts, splash_output_result *res) {
    memset(res, 0, sizeof *res);
    sb_init(&res->reasoning);
    sb_init(&res->content);
    splash_output_parser *p = splash_output_parser_new(opts, splash_output_collect, res);
    if (!p) return SPLASH_E_NOMEM;
    int rc = splash_output_parser_feed(p, text, n);
    if (!rc) rc = splash_output_parser_finish(p);
    splash_output_parser_free(p);
    sb_cstr(&res->reasoning);
    sb_cstr(&res->content);
    if (!rc && (res->oom || res->reasoning.oom || res->content.oom)) rc = SPLASH_E_NOMEM;
    return rc;
}

void splash_output_result_free(splash_output_result *res) {
    if (!res) return;
    sb_free(&res->reasoning);
    sb_free(&res->content);
    for (size_t i = 0; i < res->ncalls; i++) {
        free(res->calls[i].id);
        free(res->calls[i].name);
        free(res->calls[i].arguments);
    }
    for (size_t i = 0; i < res->nerrors; i++) {
        free(res->errors[i].message);
        free(res->errors[i].raw);
    }
    free(res->calls);
    free(res->errors);
    memset(res, 0, sizeof *res);
}
