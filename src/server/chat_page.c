/* chat_page.c - GET / and /index.html: the built-in chat page.
 *
 * The page is one file, src/server/chat_page.html: HTML, one inline <style>
 * and one inline <script>, written for Splash (no third-party code, nothing
 * fetched from another origin).  It is compiled into the binary with the
 * assembler's `.incbin`, which copies the file's bytes into .rodata as they
 * are: no generated source to keep out of git, no tool beyond the compiler
 * (xxd -i would need vim's xxd; C23 #embed needs gcc 15).  The path is
 * relative to the repository root, where make runs the compiler; -MMD does
 * not see .incbin, so the Makefile names the HTML as a prerequisite of this
 * object.
 *
 * Headers.  The Content-Security-Policy allows the page's inline <style> and
 * <script> by their SHA-256, computed here once from the embedded bytes (so
 * the policy cannot drift from the page), and nothing else: no other script
 * or style, no inline handlers or style attributes, no frames, plugins,
 * forms or base URL; fetches go to the same origin only, images are data:
 * URLs only (the icon).  The page may not be framed
 * (frame-ancestors, X-Frame-Options) and sends no Referer.  The ETag is the
 * page's hash and Cache-Control is no-cache: a browser revalidates on every
 * load (a 304 while the binary is the same) so a new build's page shows at
 * once.  X-Content-Type-Options: nosniff is added by http.c to every reply.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/sha256.h"
#include "server/server.h"

__asm__(".section .rodata\n"
        ".balign 16\n"
        ".globl splash_chat_page_html\n"
        ".hidden splash_chat_page_html\n"
        "splash_chat_page_html:\n"
        ".incbin \"src/server/chat_page.html\"\n"
        ".globl splash_chat_page_html_end\n"
        ".hidden splash_chat_page_html_end\n"
        "splash_chat_page_html_end:\n"
        ".byte 0\n"
        ".previous\n");
extern const char splash_chat_page_html[], splash_chat_page_html_end[];

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char csp[512], etag[40];

/* SHA-256 of data as base64 (the CSP hash-source form) into out[45]. */
static void sha256_b64(const char *data, size_t n, char out[45]) {
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char hex[65];
    unsigned char d[33] = {0};
    splash_sha256_hex(data, n, hex);
    for (int i = 0; i < 32; i++) sscanf(hex + 2 * i, "%2hhx", &d[i]);
    int k = 0;
    for (int i = 0; i < 33; i += 3) {
        unsigned w = (unsigned)d[i] << 16 | (unsigned)d[i + 1] << 8 | d[i + 2];
        out[k++] = al[w >> 18 & 63];
        out[k++] = al[w >> 12 & 63];
        out[k++] = al[w >> 6 & 63];
        out[k++] = i + 2 < 32 ? al[w & 63] : '=';
    }
    out[k] = 0;
}

/* The text between the first `open` tag that starts a line and the next
 * `close`: its hash, or 'none' (the page then gets no such element). */
static void element_hash(const char *page, size_t n, const char *open, const char *close, char *out, size_t size) {
    const char *a = page;
    while ((a = memmem(a, n - (size_t)(a - page), open, strlen(open))) && a > page && a[-1] != '\n') a++;
    const char *b = a ? memmem(a, n - (size_t)(a - page), close, strlen(close)) : NULL;
    if (!a || !b) {
        snprintf(out, size, "'none'");
        return;
    }
    a += strlen(open);
    char h[45];
    sha256_b64(a, (size_t)(b - a), h);
    snprintf(out, size, "'sha256-%s'", h);
}

static void page_init(void) {
    const char *p = splash_chat_page_html;
    size_t n = (size_t)(splash_chat_page_html_end - p);
    char script[64], style[64], hex[65];
    element_hash(p, n, "<script>", "</script>", script, sizeof script);
    element_hash(p, n, "<style>", "</style>", style, sizeof style);
    snprintf(csp, sizeof csp,
             "default-src 'none'; script-src %s; style-src %s; connect-src 'self'; img-src data:; "
             "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
             script, style);
    splash_sha256_hex(p, n, hex);
    snprintf(etag, sizeof etag, "\"%.32s\"", hex);
}

void srv_chat_page(const srv_request *q, srv_reply *r) {
    pthread_once(&once, page_init);
    const char *h[] = {"Content-Security-Policy", csp, "Cache-Control", "no-cache", "ETag", etag,
                       "X-Frame-Options", "DENY", "Referrer-Policy", "no-referrer",
                       "Cross-Origin-Opener-Policy", "same-origin", "Cross-Origin-Resource-Policy", "same-origin"};
    memcpy(r->headers, h, sizeof h);
    r->content_type = "text/html; charset=utf-8";
    if (q->if_none_match && (strstr(q->if_none_match, etag) || !strcmp(q->if_none_match, "*"))) {
        r->status = 304;
        return;
    }
    r->status = 200;
    sb_append(&r->body, splash_chat_page_html, (size_t)(splash_chat_page_html_end - splash_chat_page_html));
}
