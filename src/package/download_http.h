/* download_http.h - the transport under download.c: one HTTP GET through
 * libcurl into a file (hashed as it arrives, resumable) or into memory, and
 * the progress display.  Internal to src/package/download*.c.
 *
 * Split from download.c so the policy there (which file, when to resume,
 * re-fetch or give up) reads without the libcurl plumbing, and so the one
 * place that talks to the network is small enough to audit: http and https
 * only (also after redirects), connect timeout 30 s, a transfer slower than
 * 1 KiB/s for SPLASH_DOWNLOAD_STALL_S seconds (60) is abandoned.
 */
#ifndef SPLASH_DOWNLOAD_HTTP_H
#define SPLASH_DOWNLOAD_HTTP_H

#include <stdint.h>

#include "base/sha256.h"
#include "base/status.h"
#include "base/strbuf.h"

/* ---- progress ------------------------------------------------------------ */

enum { DL_SHOW_NONE, DL_SHOW_LINES, DL_SHOW_BAR };

typedef struct dl_progress {
    int mode;         /* DL_SHOW_* */
    char label[240];  /* "OWNER/REPO@REV" */
    int64_t total;    /* bytes of every listed file */
    int64_t done;     /* bytes present: finished files + the current file's */
    int64_t received; /* bytes that came over the network in this run */
    double t_start, t_draw, t_line;
    double ring_t[16]; /* (time, received) samples ~250 ms apart: the speed */
    int64_t ring_b[16];
    int ring_n, ring_i;
    int on_screen; /* a bar is drawn and not yet ended with a newline */
} dl_progress;

void dl_progress_init(dl_progress *p, int mode, const char *label, int64_t total);
/* Adds to done and received; redraws when due. */
void dl_progress_add(dl_progress *p, int64_t done, int64_t received);
/* Takes bytes back from done (a file that starts over). */
void dl_progress_drop(dl_progress *p, int64_t done);
/* Prints one line (a newline is added), clearing the bar first. */
void dl_progress_say(dl_progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Final bar or line, then a newline. */
void dl_progress_end(dl_progress *p);

/* ---- one GET --------------------------------------------------------------- */

enum {
    DL_FETCH_OK,
    DL_FETCH_HTTP,      /* status >= 400 (in status) */
    DL_FETCH_NETWORK,   /* connection, timeout, cut-off transfer */
    DL_FETCH_LOCAL,     /* writing the file failed */
    DL_FETCH_TOO_LONG,  /* more bytes than the limit */
    DL_FETCH_BAD_RANGE, /* a 206 that does not start where we asked */
    DL_FETCH_REFUSED,   /* not retryable: bad URL, redirect loop or to another protocol */
};

typedef struct dl_fetch {
    /* in */
    const char *url;
    int64_t offset;      /* > 0: ask for bytes offset- (the sink already holds offset bytes) */
    int64_t limit;       /* most bytes the sink may hold in the end */
    int fd;              /* file sink, or -1 for memory */
    strbuf *mem;         /* memory sink */
    splash_sha256 **hash; /* file sink: fed every byte; replaced when the server restarts at 0 */
    dl_progress *progress;
    /* out */
    int outcome;         /* DL_FETCH_* */
    int transient;       /* worth retrying (cut-off transfer, timeout, 408/429/5xx) */
    long status;         /* last HTTP status, 0 if none */
    int64_t size;        /* bytes in the sink at the end */
    int restarted;       /* Range was ignored (200): the sink was emptied and refilled */
    char why[512];       /* for everything but OK and HTTP */
} dl_fetch;

/* Runs the GET described by f.  Returns 0 when outcome is DL_FETCH_OK, else
 * -1 with outcome, status and why set (no splash_error: the caller names the
 * model and file). */
int dl_fetch_run(dl_fetch *f);

/* Seconds since an arbitrary start (monotonic). */
double dl_now(void);

#endif
