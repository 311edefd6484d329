/* chat_template.c - qwen3.6-chat_template.jinja, translated into C.
 *
 * Why a translation and not a Jinja interpreter: the model family has one
 * template, a general interpreter is thousands of lines with its own bugs, and
 * what matters is the exact bytes.  So each block of the .jinja file is one
 * piece of C below, in the template's order, with the Jinja it implements
 * quoted above it; read the two side by side.  Where Python shows through the
 * template, the Python behaviour is reproduced:
 *   - `|trim` is str.strip(): Python's Unicode whitespace (py_strip);
 *   - `|tojson` is json.dumps(ensure_ascii=False): base/json.h JSON_PYTHON;
 *   - `{{ x }}` of a non-string is str(x) ("None", "True", "1.0", "['a']");
 *   - `'x' in item` is a key test on a dict, a substring test on a string and
 *     a TypeError on a number, as in Python;
 *   - failures that are not raise_exception() calls (a tool call without a
 *     name, string `arguments`, a number where a part was expected) carry the
 *     message Python Jinja raises, so logs read the same as with transformers.
 * A Jinja "undefined" value (a missing key) is a NULL json_value pointer here;
 * JSON null is Python None, a different thing (`is defined` is true for it).
 */
#include "text/chat_template.h"

#include <stdlib.h>

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <utf8proc.h>

#include "base/fs.h"

typedef struct render {
    const json_value *req;
    strbuf *out;
    splash_error *err;
    int add_vision_id;            /* {%- if add_vision_id %} */
    long image_count, video_count; /* the template's two namespaces */
} render;

/* ---- Python and Jinja value semantics ------------------------------------- */

static int template_error(render *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int template_error(render *r, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return splash_fail(r->err, SPLASH_E_TEMPLATE, "%s", msg);
}

/* `obj.key` in Jinja: a dict's item, else undefined (NULL). */
static const json_value *attr(const json_value *obj, const char *key) {
    return obj && obj->type == JSON_OBJECT ? json_get(obj, key) : NULL;
}

static int int_is_zero(const json_value *v) {
    for (size_t i = v->str[0] == '-'; i < v->len; i++)
        if (v->str[i] != '0') return 0;
    return 1;
}

/* Python truthiness; undefined is false. */
static int truthy(const json_value *v) {
    if (!v) return 0;
    switch (v->type) {
    case JSON_NULL:
    case JSON_FALSE: return 0;
    case JSON_TRUE: return 1;
    case JSON_NUMBER: return v->is_int ? !int_is_zero(v) : v->num != 0;
    case JSON_STRING: return v->len > 0;
    default: return v->count > 0;
    }
}

/* `v == 'literal'` */
static int str_eq(const json_value *v, const char *s) {
    size_t n = strlen(s);
    return v && v->type == JSON_STRING && v->len == n && !memcmp(v->str, s, n);
}

static const char *py_type(const json_value *v) {
    switch (v->type) {
    case JSON_NULL: return "NoneType";
    case JSON_FALSE:
    case JSON_TRUE: return "bool";
    case JSON_NUMBER: return v->is_int ? "int" : "float";
    case JSON_STRING: return "str";
    case JSON_ARRAY: return "list";
    default: return "dict";
    }
}

/* jinja2's UndefinedError for `obj.name` used in `'...' + obj.name`. */
static int undefined_error(render *r, const json_value *obj, const char *name) {
    if (!obj || obj->type == JSON_NULL) return template_error(r, "'None' has no attribute '%s'", name);
    return template_error(r, "'%s object' has no attribute '%s'", py_type(obj), name);
}

/* Appends `obj.name` where the template concatenates it to a string. */
static int concat_attr(render *r, strbuf *sb, const json_value *obj, const char *name) {
    const json_value *v = attr(obj, name);
    if (!v) return undefined_error(r, obj, name);
    if (v->type != JSON_STRING) return template_error(r, "can only concatenate str (not \"%s\") to str", py_type(v));
    sb_append(sb, v->str, v->len);
    return 0;
}

/* Python `needle in item` into *found; a TypeError for non-containers. */
static int py_in(render *r, const char *needle, const json_value *item, int *found) {
    size_t n = strlen(needle);
    *found = 0;
    switch (item->type) {
    case JSON_OBJECT: *found = json_get(item, needle) != NULL; return 0;
    case JSON_STRING: *found = memmem(item->str, item->len, needle, n) != NULL; return 0;
    case JSON_ARRAY:
        for (size_t i = 0; i < item->count; i++)
            if (str_eq(item->items[i], needle)) *found = 1;
        return 0;
    default: return template_error(r, "argument of type '%s' is not iterable", py_type(item));
    }
}

/* str.isspace() of Python 3 (Unicode White_Space less U+180E, plus the
 * four information separators U+001C..U+001F). */
static int py_space(int32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* str.strip(): narrows [*b, *e) of s past leading and trailing whitespace. */
static void py_strip(const char *s, size_t *b, size_t *e) {
    const utf8proc_uint8_t *u = (const utf8proc_uint8_t *)s;
    utf8proc_int32_t cp;
    while (*b < *e) {
        utf8proc_ssize_t l = utf8proc_iterate(u + *b, (utf8proc_ssize_t)(*e - *b), &cp);
        if (l <= 0 || !py_space(cp)) break;
        *b += (size_t)l;
    }
    while (*e > *b) {
        size_t k = *e - 1;
        while (k > *b && *e - k < 4 && (u[k] & 0xC0) == 0x80) k--;
        utf8proc_ssize_t l = utf8proc_iterate(u + k, (utf8proc_ssize_t)(*e - k), &cp);
        if (l != (utf8proc_ssize_t)(*e - k) || !py_space(cp)) break;
        *e = k;
    }
}

/* The last occurrence of needle in s[0..n), or NULL (what split()[-1] cuts at). */
static const char *last_of(const char *s, size_t n, const char *needle) {
    size_t m = strlen(needle);
    const char *hit = NULL, *p = s, *end = s + n;
    while ((size_t)(end - p) >= m && (p = memmem(p, (size_t)(end - p), needle, m))) {
        hit = p;
        p += m;
    }
    return hit;
}

/* Python's str.isprintable() for one code point (what repr() leaves as is). */
static int py_printable(int32_t cp) {
    if (cp < 0x80) return cp >= 0x20 && cp < 0x7F;
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return 0;
    default: return 1;
    }
}

/* Python repr() of a str. */
static void py_repr_str(strbuf *sb, const char *s, size_t n) {
    char quote = memchr(s, '\'', n) && !memchr(s, '"', n) ? '"' : '\'';
    const utf8proc_uint8_t *u = (const utf8proc_uint8_t *)s;
    sb_putc(sb, quote);
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t l = utf8proc_iterate(u + i, (utf8proc_ssize_t)(n - i), &cp);
        if (l <= 0) cp = u[i], l = 1; /* cannot happen: parsed JSON is valid UTF-8 */
        if (cp == quote || cp == '\\') sb_putc(sb, '\\'), sb_putc(sb, (char)cp);
        else if (cp == '\t') sb_puts(sb, "\\t");
        else if (cp == '\n') sb_puts(sb, "\\n");
        else if (cp == '\r') sb_puts(sb, "\\r");
        else if (py_printable(cp)) sb_append(sb, s + i, (size_t)l);
        else if (cp <= 0xFF) sb_printf(sb, "\\x%02x", (unsigned)cp);
        else if (cp <= 0xFFFF) sb_printf(sb, "\\u%04x", (unsigned)cp);
        else sb_printf(sb, "\\U%08x", (unsigned)cp);
        i += (size_t)l;
    }
    sb_putc(sb, quote);
}

/* Python str(v) (repr = 0) or repr(v) (repr = 1) of a JSON value as Python
 * json.loads would have built it; undefined prints as nothing. */
static void py_write(strbuf *sb, const json_value *v, int repr) {
    if (!v) return;
    switch (v->type) {
    case JSON_NULL: sb_puts(sb, "None"); break;
    case JSON_TRUE: sb_puts(sb, "True"); break;
    case JSON_FALSE: sb_puts(sb, "False"); break;
    case JSON_NUMBER:
        if (v->is_int) {
            if (int_is_zero(v)) sb_putc(sb, '0');
            else sb_append(sb, v->str, v->len);
        } else if (isinf(v->num)) {
            sb_puts(sb, v->num < 0 ? "-inf" : "inf");
        } else {
            char b[40];
            json_format_python_float(b, sizeof b, v->num);
            sb_puts(sb, b);
        }
        break;
    case JSON_STRING:
        if (repr) py_repr_str(sb, v->str, v->len);
        else sb_append(sb, v->str, v->len);
        break;
    case JSON_ARRAY:
    case JSON_OBJECT: {
        int obj = v->type == JSON_OBJECT;
        sb_putc(sb, obj ? '{' : '[');
        for (size_t i = 0; i < v->count; i++) {
            if (i) sb_puts(sb, ", ");
            if (obj) {
                py_repr_str(sb, v->keys[i], v->key_lens[i]);
                sb_puts(sb, ": ");
            }
            py_write(sb, v->items[i], 1);
        }
        sb_putc(sb, obj ? '}' : ']');
        break;
    }
    }
}

/* ---- {%- macro render_content(content, do_vision_count, is_system_content=false) %} */

static int render_content(render *r, const json_value *content, int do_vision_count, int is_system_content,
                          strbuf *sb) {
    /* {%- if content is string %} {{- content }} */
    if (content && content->type == JSON_STRING) {
        sb_append(sb, content->str, content->len);
        return 0;
    }
    /* {%- elif content is none or content is undefined %} {{- '' }}
     * (undefined takes the list branch first in Jinja, with nothing to iterate) */
    if (!content || content->type == JSON_NULL) return 0;
    /* {%- else %} {{- raise_exception('Unexpected content type.') }} */
    if (content->type != JSON_ARRAY) return template_error(r, "Unexpected content type.");
    /* {%- elif content is iterable and content is not mapping %} {%- for item in content %} */
    for (size_t i = 0; i < content->count; i++) {
        const json_value *item = content->items[i];
        int hit, rc;
        /* {%- if 'image' in item or 'image_url' in item or item.type == 'image' %} */
        if ((rc = py_in(r, "image", item, &hit))) return rc;
        if (!hit && (rc = py_in(r, "image_url", item, &hit))) return rc;
        if (hit || str_eq(attr(item, "type"), "image")) {
            if (is_system_content) return template_error(r, "System message cannot contain images.");
            if (do_vision_count) r->image_count++;
            if (r->add_vision_id) sb_printf(sb, "Picture %ld: ", r->image_count);
            sb_puts(sb, "<|vision_start|><|image_pad|><|vision_end|>");
            continue;
        }
        /* {%- elif 'video' in item or item.type == 'video' %} */
        if ((rc = py_in(r, "video", item, &hit))) return rc;
        if (hit || str_eq(attr(item, "type"), "video")) {
            if (is_system_content) return template_error(r, "System message cannot contain videos.");
            if (do_vision_count) r->video_count++;
            if (r->add_vision_id) sb_printf(sb, "Video %ld: ", r->video_count);
            sb_puts(sb, "<|vision_start|><|video_pad|><|vision_end|>");
            continue;
        }
        /* {%- elif 'text' in item %} {{- item.text }} */
        if ((rc = py_in(r, "text", item, &hit))) return rc;
        if (hit) {
            py_write(sb, attr(item, "text"), 0);
            continue;
        }
        return template_error(r, "Unexpected item type in content.");
    }
    return 0;
}

/* `render_content(...)|trim`, rendered into buf; *text / *len is the
 * stripped part (never NULL). */
static int content_trimmed(render *r, const json_value *msg, int do_vision_count, int is_system_content,
                           strbuf *buf, const char **text, size_t *len) {
    sb_clear(buf);
    int rc = render_content(r, attr(msg, "content"), do_vision_count, is_system_content, buf);
    if (rc) return rc;
    size_t b = 0, e = buf->len;
    const char *s = sb_cstr(buf);
    py_strip(s, &b, &e);
    *text = s + b;
    *len = e - b;
    return 0;
}

/* ---- the tools block and the system message ------------------------------- */

static const char tools_head[] = "# Tools\n\nYou have access to the following functions:\n\n<tools>";
static const char tools_tail[] =
    "\n</tools>"
    "\n"
    "\n"
    "If you choose to call a function ONLY reply in the following format with NO suffix:\n"
    "\n"
    "<tool_call>\n"
    "<function=example_function_name>\n"
    "<parameter=example_parameter_1>\n"
    "value_1\n"
    "</parameter>\n"
    "<parameter=example_parameter_2>\n"
    "This is the value for the second parameter\n"
    "that can span\n"
    "multiple lines\n"
    "</parameter>\n"
    "</function>\n"
    "</tool_call>\n"
    "\n"
    "<IMPORTANT>\n"
    "Reminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n"
    "</IMPORTANT>";

static int system_block(render *r, const json_value *first, strbuf *buf) {
    const json_value *tools = json_get(r->req, "tools");
    int is_system = str_eq(attr(first, "role"), "system");
    const char *c;
    size_t n;
    int rc;
    /* {%- if tools and tools is iterable and tools is not mapping %} */
    if (truthy(tools) && (tools->type == JSON_ARRAY || tools->type == JSON_STRING)) {
        sb_puts(r->out, "<|im_start|>system\n");
        sb_puts(r->out, tools_head);
        /* {%- for tool in tools %} {{- "\n" }} {{- tool | tojson }} */
        if (tools->type == JSON_ARRAY) {
            for (size_t i = 0; i < tools->count; i++) {
                sb_putc(r->out, '\n');
                json_write(r->out, tools->items[i], JSON_PYTHON);
            }
        } else { /* a string iterates over its characters */
            const utf8proc_uint8_t *u = (const utf8proc_uint8_t *)tools->str;
            for (size_t i = 0; i < tools->len;) {
                utf8proc_int32_t cp;
                utf8proc_ssize_t l = utf8proc_iterate(u + i, (utf8proc_ssize_t)(tools->len - i), &cp);
                if (l <= 0) l = 1;
                sb_putc(r->out, '\n');
                json_write_string(r->out, tools->str + i, (size_t)l, JSON_PYTHON);
                i += (size_t)l;
            }
        }
        sb_puts(r->out, tools_tail);
        /* {%- if messages[0].role == 'system' %}
         *     {%- set content = render_content(messages[0].content, false, true)|trim %}
         *     {%- if content %} {{- '\n\n' + content }} */
        if (is_system) {
            if ((rc = content_trimmed(r, first, 0, 1, buf, &c, &n))) return rc;
            if (n) {
                sb_puts(r->out, "\n\n");
                sb_append(r->out, c, n);
            }
        }
        sb_puts(r->out, "<|im_end|>\n");
    } else if (is_system) {
        /* {{- '<|im_start|>system\n' + content + '<|im_end|>\n' }} */
        if ((rc = content_trimmed(r, first, 0, 1, buf, &c, &n))) return rc;
        sb_puts(r->out, "<|im_start|>system\n");
        sb_append(r->out, c, n);
        sb_puts(r->out, "<|im_end|>\n");
    }
    return 0;
}

/* ---- ns.last_query_index: the last user message that is not a tool result */

static int last_query_index(render *r, const json_value *messages, strbuf *buf, size_t *index) {
    /* {%- for message in messages[::-1] %}
     *     {%- if ns.multi_step_tool and message.role == "user" %}
     *         {%- set content = render_content(message.content, false)|trim %}
     *         {%- if not(content.startswith('<tool_response>') and content.endswith('</tool_response>')) %} */
    static const char open[] = "<tool_response>", close[] = "</tool_response>";
    const size_t no = sizeof open - 1, nc = sizeof close - 1;
    for (size_t k = messages->count; k-- > 0;) {
        const json_value *m = messages->items[k];
        if (!str_eq(attr(m, "role"), "user")) continue;
        const char *c;
        size_t n;
        int rc = content_trimmed(r, m, 0, 0, buf, &c, &n);
        if (rc) return rc;
        int is_result = n >= no && !memcmp(c, open, no) && n >= nc && !memcmp(c + n - nc, close, nc);
        if (!is_result) {
            *index = k;
            return 0;
        }
    }
    /* {%- if ns.multi_step_tool %} {{- raise_exception('No user query found in messages.') }} */
    return template_error(r, "No user query found in messages.");
}

/* ---- {%- elif message.role == "assistant" %} ------------------------------ */

static int assistant_message(render *r, const json_value *m, size_t index, size_t last_query, const char *c,
                             size_t clen) {
    strbuf *out = r->out;
    /* {%- set reasoning_content = '' %}
     * {%- if message.reasoning_content is string %} {%- set reasoning_content = message.reasoning_content %} */
    const char *rs = "";
    size_t rlen = 0;
    const json_value *rc_v = attr(m, "reasoning_content");
    if (rc_v && rc_v->type == JSON_STRING) {
        rs = rc_v->str;
        rlen = rc_v->len;
    } else if (memmem(c, clen, "</think>", 8)) {
        /* {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %} */
        const char *close = memmem(c, clen, "</think>", 8);
        size_t blen = (size_t)(close - c);
        while (blen && c[blen - 1] == '\n') blen--;
        const char *open = last_of(c, blen, "<think>");
        rs = open ? open + 7 : c;
        rlen = (size_t)(c + blen - rs);
        while (rlen && *rs == '\n') rs++, rlen--;
        /* {%- set content = content.split('</think>')[-1].lstrip('\n') %} */
        const char *after = last_of(c, clen, "</think>") + 8;
        clen -= (size_t)(after - c);
        c = after;
        while (clen && *c == '\n') c++, clen--;
    }
    /* {%- set reasoning_content = reasoning_content|trim %} */
    size_t rb = 0, re = rlen;
    py_strip(rs, &rb, &re);
    /* {%- if (preserve_thinking is defined and preserve_thinking is true) or (loop.index0 > ns.last_query_index) %} */
    const json_value *preserve = json_get(r->req, "preserve_thinking");
    sb_puts(out, "<|im_start|>assistant\n");
    if ((preserve && preserve->type == JSON_TRUE) || index > last_query) {
        sb_puts(out, "<think>\n");
        sb_append(out, rs + rb, re - rb);
        sb_puts(out, "\n</think>\n\n");
    }
    sb_append(out, c, clen);

    /* {%- if message.tool_calls and message.tool_calls is iterable and message.tool_calls is not mapping %} */
    const json_value *calls = attr(m, "tool_calls");
    if (truthy(calls) && calls->type == JSON_STRING) /* iterating a string: 'x'.name */
        return undefined_error(r, calls, "name");
    if (truthy(calls) && calls->type == JSON_ARRAY) {
        size_t cb = 0, ce = clen;
        py_strip(c, &cb, &ce);
        for (size_t i = 0; i < calls->count; i++) {
            /* {%- if tool_call.function is defined %} {%- set tool_call = tool_call.function %} */
            const json_value *call = calls->items[i];
            const json_value *fn = attr(call, "function");
            if (fn) call = fn;
            /* {%- if loop.first %} {%- if content|trim %} '\n\n<tool_call>\n<function=' ... */
            if (i > 0) sb_puts(out, "\n<tool_call>\n<function=");
            else if (ce > cb) sb_puts(out, "\n\n<tool_call>\n<function=");
            else sb_puts(out, "<tool_call>\n<function=");
            int rc = concat_attr(r, out, call, "name");
            if (rc) return rc;
            sb_puts(out, ">\n");
            /* {%- if tool_call.arguments is defined %}
             *     {%- for args_name, args_value in tool_call.arguments|items %} */
            const json_value *args = attr(call, "arguments");
            if (args) {
                if (args->type != JSON_OBJECT) return template_error(r, "Can only get item pairs from a mapping.");
                for (size_t a = 0; a < args->count; a++) {
                    const json_value *v = args->items[a];
                    sb_puts(out, "<parameter=");
                    sb_append(out, args->keys[a], args->key_lens[a]);
                    sb_puts(out, ">\n");
                    /* {%- set args_value = args_value | string if args_value is string
                     *                      else args_value | tojson | safe %} */
                    if (v->type == JSON_STRING) sb_append(out, v->str, v->len);
                    else json_write(out, v, JSON_PYTHON);
                    sb_puts(out, "\n</parameter>\n");
                }
            }
            sb_puts(out, "</function>\n</tool_call>");
        }
    }
    sb_puts(out, "<|im_end|>\n");
    return 0;
}

/* ---- the whole template ----------------------------------------------------- */

/* messages that is truthy but not a list: what Jinja does with it. */
static int messages_not_a_list(render *r, const json_value *messages) {
    /* `messages[0].role`: a string has a first character (whose .role is
     * undefined, so no user query is found); other values have no element 0 */
    if (messages->type == JSON_STRING) return template_error(r, "No user query found in messages.");
    return template_error(r, "%s object has no element 0", py_type(messages));
}

static int render_all(render *r, strbuf *buf) {
    strbuf *out = r->out;
    /* {%- if not messages %} {{- raise_exception('No messages provided.') }} */
    const json_value *messages = json_get(r->req, "messages");
    if (!truthy(messages)) return template_error(r, "No messages provided.");
    if (messages->type != JSON_ARRAY) return messages_not_a_list(r, messages);
    const size_t n = messages->count;
    json_value *const *msgs = messages->items;

    int rc = system_block(r, msgs[0], buf);
    if (rc) return rc;
    size_t last_query = 0;
    if ((rc = last_query_index(r, messages, buf, &last_query))) return rc;

    /* {%- for message in messages %} */
    for (size_t i = 0; i < n; i++) {
        const json_value *m = msgs[i];
        /* {%- set content = render_content(message.content, true)|trim %} */
        const char *c;
        size_t clen;
        if ((rc = content_trimmed(r, m, 1, 0, buf, &c, &clen))) return rc;
        const json_value *role = attr(m, "role");
        if (str_eq(role, "system")) {
            /* {%- if not loop.first %} {{- raise_exception('System message must be at the beginning.') }} */
            if (i != 0) return template_error(r, "System message must be at the beginning.");
        } else if (str_eq(role, "user")) {
            /* {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }} */
            sb_puts(out, "<|im_start|>user\n");
            sb_append(out, c, clen);
            sb_puts(out, "<|im_end|>\n");
        } else if (str_eq(role, "assistant")) {
            if ((rc = assistant_message(r, m, i, last_query, c, clen))) return rc;
        } else if (str_eq(role, "tool")) {
            /* {%- if loop.previtem and loop.previtem.role != "tool" %} {{- '<|im_start|>user' }} */
            if (i > 0 && truthy(msgs[i - 1]) && !str_eq(attr(msgs[i - 1], "role"), "tool"))
                sb_puts(out, "<|im_start|>user");
            /* {{- '\n<tool_response>\n' }} {{- content }} {{- '\n</tool_response>' }} */
            sb_puts(out, "\n<tool_response>\n");
            sb_append(out, c, clen);
            sb_puts(out, "\n</tool_response>");
            /* {%- if not loop.last and loop.nextitem.role != "tool" %} {{- '<|im_end|>\n' }}
             * {%- elif loop.last %} {{- '<|im_end|>\n' }} */
            if (i + 1 == n || !str_eq(attr(msgs[i + 1], "role"), "tool")) sb_puts(out, "<|im_end|>\n");
        } else {
            return template_error(r, "Unexpected message role.");
        }
    }

    /* {%- if add_generation_prompt %} {{- '<|im_start|>assistant\n' }}
     *     {%- if enable_thinking is defined and enable_thinking is false %} '<think>\n\n</think>\n\n'
     *     {%- else %} '<think>\n' */
    if (truthy(json_get(r->req, "add_generation_prompt"))) {
        const json_value *thinking = json_get(r->req, "enable_thinking");
        sb_puts(out, "<|im_start|>assistant\n");
        sb_puts(out, thinking && thinking->type == JSON_FALSE ? "<think>\n\n</think>\n\n" : "<think>\n");
    }
    return 0;
}

int splash_chat_template_render(const json_value *request, strbuf *out, splash_error *err) {
    if (!request || request->type != JSON_OBJECT)
        return splash_fail(err, SPLASH_E_INVALID, "the chat request must be a JSON object");
    size_t start = out->len;
    render r = {.req = request, .out = out, .err = err};
    r.add_vision_id = truthy(json_get(request, "add_vision_id"));
    strbuf buf; /* one message's rendered content, reused */
    sb_init(&buf);
    int rc = render_all(&r, &buf);
    if (!rc && (out->oom || buf.oom))
        rc = splash_fail(err, SPLASH_E_NOMEM, "out of memory rendering the chat template");
    sb_free(&buf);
    if (rc && out->len > start) {
        out->len = start;
        out->data[start] = 0;
    }
    return rc;
}

/* ---- known templates ------------------------------------------------------- */

static const char qwen36_template[] =
#include "qwen36_template.inc"
    ;

static const struct known_template {
    const char *name;
    const char *text;
    size_t len;
} known_templates[] = {
    {"Qwen3.6", qwen36_template, sizeof qwen36_template - 1},
};

const char *splash_chat_template_builtin(size_t *len) {
    if (len) *len = known_templates[0].len;
    return known_templates[0].text;
}

int splash_chat_template_read_dir(const char *dir, char **text, size_t *len, splash_error *err) {
    *text = NULL;
    *len = 0;
    char *path = splash_path_join(dir, "chat_template.jinja");
    int rc = SPLASH_E_NOTFOUND;
    if (splash_is_file(path)) rc = splash_read_file(path, text, len, err);
    free(path);
    if (rc != SPLASH_E_NOTFOUND) return rc;

    path = splash_path_join(dir, "tokenizer_config.json");
    char *data;
    size_t n;
    if (!splash_is_file(path) || splash_read_file(path, &data, &n, NULL) != 0) {
        free(path);
        return splash_fail(err, SPLASH_E_NOTFOUND, "%s has no chat_template.jinja and no tokenizer_config.json", dir);
    }
    char perr[160];
    json_value *cfg = json_parse(data, n, JSON_DEFAULT_MAX_DEPTH, perr, sizeof perr);
    free(data);
    if (!cfg) {
        rc = splash_fail(err, SPLASH_E_FORMAT, "%s: %s", path, perr);
        free(path);
        return rc;
    }
    const json_value *t = json_get(cfg, "chat_template");
    if (t && t->type == JSON_ARRAY) { /* [{"name": "default", "template": "..."}, ...] */
        const json_value *found = NULL;
        for (size_t i = 0; i < t->count; i++)
            if (str_eq(json_get(t->items[i], "name"), "default")) found = json_get(t->items[i], "template");
        t = found;
    }
    if (t && t->type == JSON_STRING) {
        *text = malloc(t->len + 1);
        if (*text) {
            memcpy(*text, t->str, t->len + 1);
            *len = t->len;
            rc = 0;
        } else rc = splash_fail(err, SPLASH_E_NOMEM, "out of memory reading %s", path);
    } else {
        rc = splash_fail(err, SPLASH_E_NOTFOUND, "%s has no chat_template.jinja and %s no chat_template", dir, path);
    }
    json_free(cfg);
    free(path);
    return rc;
}

static size_t trim_end(const char *s, size_t n) {
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == '\f' ||
                 s[n - 1] == '\v'))
        n--;
    return n;
}

/* Up to 40 bytes of s from p on one line: newlines as \n, other control
 * bytes as '?', "..." when cut. */
static void snippet(char *dst, size_t size, const char *p, const char *end) {
    size_t k = 0, taken = 0;
    for (; p < end && taken < 40 && k + 6 < size; p++, taken++) {
        if (*p == '\n') dst[k++] = '\\', dst[k++] = 'n';
        else dst[k++] = (*p >= 0x20 && *p < 0x7F) || (*p & 0x80) ? *p : '?';
    }
    if (p < end) { /* cut: drop a character the cut may have split, then mark it */
        while (k && (dst[k - 1] & 0xC0) == 0x80) k--;
        if (k && (dst[k - 1] & 0x80)) k--;
        if (k + 4 <= size) dst[k++] = '.', dst[k++] = '.', dst[k++] = '.';
    }
    dst[k] = 0;
}

const char *splash_chat_template_identify(const char *text, size_t len, char *buf, size_t size) {
    size_t n = trim_end(text, len);
    for (size_t t = 0; t < sizeof known_templates / sizeof known_templates[0]; t++) {
        const struct known_template *k = &known_templates[t];
        if (trim_end(k->text, k->len) == n && !memcmp(k->text, text, n)) return "native";
    }
    const struct known_template *k = &known_templates[0];
    size_t kn = trim_end(k->text, k->len), i = 0;
    if (n == 0) {
        snprintf(buf, size, "empty, not the known %s template", k->name);
        return buf;
    }
    while (i < n && i < kn && text[i] == k->text[i]) i++;
    size_t line = 1, col = 1;
    for (size_t j = 0; j < i; j++) {
        if (text[j] == '\n') line++, col = 1;
        else col++;
    }
    char got[96], want[96];
    snippet(got, sizeof got, text + i, text + n);
    snippet(want, sizeof want, k->text + i, k->text + kn);
    if (i == kn)
        snprintf(buf, size, "not the known %s template: extra text from line %zu, column %zu: \"%s\"", k->name, line,
                 col, got);
    else if (i == n)
        snprintf(buf, size, "not the known %s template: ends at line %zu, column %zu, before \"%s\"", k->name, line,
                 col, want);
    else
        snprintf(buf, size, "not the known %s template: line %zu, column %zu has \"%s\" where the known one has \"%s\"",
                 k->name, line, col, got, want);
    return buf;
}
