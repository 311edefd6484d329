/* cmd_tokenize.c - `splash tokenize` and `splash detokenize`.
 *
 * Thin drivers over tokenizer.h, made for tests and for people: text on
 * stdin to a JSON array of ids, and back.  With --jsonl each input line is
 * one JSON value (a string to tokenize, an id array to detokenize) and each
 * output line its result, so a whole corpus goes through one process.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fs.h"
#include "base/json.h"
#include "base/mem.h"
#include "commands.h"
#include "text/tokenizer.h"

typedef struct tok_opts {
    const char *model, *dir;
    int jsonl, add_special, split_special, skip_special;
} tok_opts;

static void usage(FILE *f, int detok) {
    if (!detok)
        fprintf(f,
                "usage: splash tokenize (--model PKG | --tokenizer-dir DIR) [--jsonl] [--split-special] [--add-special]\n"
                "\n"
                "Reads UTF-8 text on stdin (all of it, byte for byte, trailing newline included)\n"
                "and prints its token ids as a JSON array.\n"
                "  --model PKG          a Splash package (tokenizer in PKG/tokenizer/tokenizer.json)\n"
                "  --tokenizer-dir DIR  a directory holding tokenizer.json\n"
                "  --jsonl              each input line is a JSON string; prints one id array per line\n"
                "  --split-special      encode special-token text (<|im_end|>) as plain text; by default\n"
                "                       special tokens written in the text are recognised, as in Hugging Face\n"
                "  --add-special        add the post-processor's special tokens (HF add_special_tokens);\n"
                "                       byte-level post-processors, as Qwen's, add none\n");
    else
        fprintf(f,
                "usage: splash detokenize (--model PKG | --tokenizer-dir DIR) [--jsonl] [--skip-special]\n"
                "\n"
                "Reads a JSON array of token ids on stdin and prints the text (invalid UTF-8 from\n"
                "split characters becomes U+FFFD, as in Hugging Face).\n"
                "  --jsonl          each input line is an id array; prints one JSON string per line\n"
                "  --skip-special   leave out special tokens\n");
}

static int parse_args(int argc, char **argv, tok_opts *o, int detok) {
    memset(o, 0, sizeof *o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "--model") || !strcmp(a, "--tokenizer-dir")) && i + 1 < argc) {
            if (a[2] == 'm') o->model = argv[++i];
            else o->dir = argv[++i];
        } else if (!strcmp(a, "--jsonl")) {
            o->jsonl = 1;
        } else if (!detok && !strcmp(a, "--add-special")) {
            o->add_special = 1;
        } else if (!detok && !strcmp(a, "--split-special")) {
            o->split_special = 1;
        } else if (detok && !strcmp(a, "--skip-special")) {
            o->skip_special = 1;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout, detok);
            return 0;
        } else {
            fprintf(stderr, "splash %s: unknown or incomplete option '%s'\n\n", argv[0], a);
            usage(stderr, detok);
            return 2;
        }
    }
    if (!o->model == !o->dir) {
        fprintf(stderr, "splash %s: give exactly one of --model PKG and --tokenizer-dir DIR\n\n", argv[0]);
        usage(stderr, detok);
        return 2;
    }
    return -1;
}

static splash_tokenizer *open_tokenizer(const tok_opts *o, const char *cmd) {
    char *path;
    if (o->model) {
        char *d = splash_path_join(o->model, "tokenizer");
        path = splash_path_join(d, "tokenizer.json");
        free(d);
    } else {
        path = splash_path_join(o->dir, "tokenizer.json");
    }
    splash_tokenizer *tok = NULL;
    splash_error err = {0};
    if (splash_tokenizer_load(path, &tok, &err)) fprintf(stderr, "splash %s: %s\n", cmd, err.msg);
    free(path);
    return tok;
}

/* Reads all of stdin; NULL (message printed) on failure. */
static char *read_stdin(size_t *len, const char *cmd) {
    strbuf sb;
    sb_init(&sb);
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, stdin)) > 0) sb_append(&sb, buf, n);
    if (ferror(stdin) || sb.oom) {
        fprintf(stderr, "splash %s: cannot read stdin\n", cmd);
        sb_free(&sb);
        return NULL;
    }
    sb_cstr(&sb);
    return sb_take(&sb, len);
}

static void put_ids(strbuf *sb, const int32_t *ids, size_t n) {
    sb_putc(sb, '[');
    for (size_t i = 0; i < n; i++) sb_printf(sb, i ? ",%d" : "%d", ids[i]);
    sb_puts(sb, "]\n");
}

/* Calls fn on each non-blank line of text[0..len) with its 1-based number. */
typedef int (*line_fn)(void *ctx, const char *line, size_t n, size_t lineno);

static int each_line(const char *text, size_t len, line_fn fn, void *ctx) {
    size_t lineno = 0;
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - text) : len;
        lineno++;
        size_t j = i;
        while (j < end && (text[j] == ' ' || text[j] == '\t' || text[j] == '\r')) j++;
        if (j < end) {
            int rc = fn(ctx, text + i, end - i, lineno);
            if (rc) return rc;
        }
        i = end + 1;
    }
    return 0;
}

typedef struct line_ctx {
    const splash_tokenizer *tok;
    int flags;
    strbuf out;
    splash_token_vec ids;
    const char *cmd;
} line_ctx;

static int tokenize_line(void *p, const char *line, size_t n, size_t lineno) {
    line_ctx *c = p;
    char jerr[160];
    json_value *v = json_parse(line, n, 8, jerr, sizeof jerr);
    if (!v || v->type != JSON_STRING) {
        fprintf(stderr, "splash %s: line %zu: %s\n", c->cmd, lineno, v ? "expected a JSON string" : jerr);
        json_free(v);
        return 1;
    }
    splash_error err = {0};
    c->ids.len = 0;
    int rc = splash_tokenizer_encode(c->tok, v->str, v->len, c->flags, &c->ids, &err);
    json_free(v);
    if (rc) {
        fprintf(stderr, "splash %s: line %zu: %s\n", c->cmd, lineno, err.msg);
        return 1;
    }
    put_ids(&c->out, c->ids.ids, c->ids.len);
    return 0;
}

/* The ids of a JSON array of integers into ids; 0, or 1 with a message. */
static int parse_ids(const char *text, size_t n, splash_token_vec *ids, char *msg, size_t msg_size) {
    json_value *v = json_parse(text, n, 8, msg, msg_size);
    if (!v) return 1;
    int rc = 0;
    if (v->type != JSON_ARRAY) {
        snprintf(msg, msg_size, "expected a JSON array of token ids");
        rc = 1;
    }
    for (size_t i = 0; !rc && i < v->count; i++) {
        int64_t id;
        if (json_int64(v->items[i], &id) || id < INT32_MIN || id > INT32_MAX) {
            snprintf(msg, msg_size, "element %zu is not an integer token id", i);
            rc = 1;
        } else if (splash_token_vec_push(ids, (int32_t)id)) {
            snprintf(msg, msg_size, "out of memory");
            rc = 1;
        }
    }
    json_free(v);
    return rc;
}

static int detokenize_line(void *p, const char *line, size_t n, size_t lineno) {
    line_ctx *c = p;
    char msg[160];
    c->ids.len = 0;
    if (parse_ids(line, n, &c->ids, msg, sizeof msg)) {
        fprintf(stderr, "splash %s: line %zu: %s\n", c->cmd, lineno, msg);
        return 1;
    }
    strbuf raw, text;
    sb_init(&raw);
    sb_init(&text);
    splash_error err = {0};
    int rc = splash_tokenizer_decode(c->tok, c->ids.ids, c->ids.len, c->flags, &raw, &err);
    if (rc) {
        fprintf(stderr, "splash %s: line %zu: %s\n", c->cmd, lineno, err.msg);
    } else {
        splash_utf8_append_lossy(&text, raw.data ? raw.data : "", raw.len);
        json_write_string(&c->out, text.data ? text.data : "", text.len, JSON_COMPACT);
        sb_putc(&c->out, '\n');
    }
    sb_free(&raw);
    sb_free(&text);
    return rc ? 1 : 0;
}

static int run(int argc, char **argv, int detok) {
    tok_opts o;
    int rc = parse_args(argc, argv, &o, detok);
    if (rc >= 0) return rc;
    rc = 0;
    const char *cmd = argv[0];
    splash_tokenizer *tok = open_tokenizer(&o, cmd);
    if (!tok) return 1;
    size_t len;
    char *text = read_stdin(&len, cmd);
    if (!text) {
        splash_tokenizer_free(tok);
        return 1;
    }
    line_ctx c = {.tok = tok, .cmd = cmd};
    sb_init(&c.out);
    if (detok) c.flags = o.skip_special ? SPLASH_DECODE_SKIP_SPECIAL : 0;
    else c.flags = o.split_special ? 0 : SPLASH_ENCODE_SPECIAL;
    /* --add-special: the load accepts only post-processors that add nothing. */
    if (o.jsonl) {
        rc = each_line(text, len, detok ? detokenize_line : tokenize_line, &c);
    } else if (!detok) {
        splash_error err = {0};
        rc = splash_tokenizer_encode(tok, text, len, c.flags, &c.ids, &err);
        if (rc) fprintf(stderr, "splash %s: %s\n", cmd, err.msg);
        else put_ids(&c.out, c.ids.ids, c.ids.len);
        rc = rc ? 1 : 0;
    } else {
        char msg[160];
        splash_error err = {0};
        strbuf raw;
        sb_init(&raw);
        if (parse_ids(text, len, &c.ids, msg, sizeof msg)) {
            fprintf(stderr, "splash %s: %s\n", cmd, msg);
            rc = 1;
        } else if (splash_tokenizer_decode(tok, c.ids.ids, c.ids.len, c.flags, &raw, &err)) {
            fprintf(stderr, "splash %s: %s\n", cmd, err.msg);
            rc = 1;
        } else {
            splash_utf8_append_lossy(&c.out, raw.data ? raw.data : "", raw.len);
        }
        sb_free(&raw);
    }
    if (!rc && c.out.oom) {
        fprintf(stderr, "splash %s: out of memory\n", cmd);
        rc = 1;
    }
    if (!rc && c.out.len && fwrite(c.out.data, 1, c.out.len, stdout) != c.out.len) rc = 1;
    if (fflush(stdout)) rc = 1;
    sb_free(&c.out);
    splash_token_vec_free(&c.ids);
    free(text);
    splash_tokenizer_free(tok);
    return rc;
}

int splash_cmd_tokenize(int argc, char **argv) { return run(argc, argv, 0); }

int splash_cmd_detokenize(int argc, char **argv) { return run(argc, argv, 1); }
