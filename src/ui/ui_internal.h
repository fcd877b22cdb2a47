/* ui internals shared by the server (server.c), the JSON API (api.c), the event streams
 * (events.c) and the embedded assets (generated at build time by embed.cmake). */
#ifndef TANDEM_UI_INTERNAL_H
#define TANDEM_UI_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <microhttpd.h>

#include "tandem/track.h"
#include "tandem/ui.h"

/* ---- the page's files, compiled in (ui_assets.c, generated) ---- */
typedef struct td__ui_asset {
    const char *name;         /* "index.html", "app.js", ... */
    const char *content_type; /* with charset for text */
    const unsigned char *data;
    size_t nbytes;
    const char *etag; /* quoted, from the file's SHA-256 */
} td__ui_asset;
extern const td__ui_asset td__ui_assets[];
extern const size_t td__ui_nassets;
/* The asset called name exactly, or NULL. */
const td__ui_asset *td__ui_asset_find(const char *name);

typedef struct td__ui_events td__ui_events;
typedef struct td__ui_stream td__ui_stream;
typedef struct td__ui_guard td__ui_guard;

/* Read-only connections handed to request threads: one thread per connection, one td_rundb
 * per thread at a time. */
#define TD__UI_MAX_READERS 16

struct td_ui {
    char *project_dir;
    char *host; /* as given */
    char *url;
    char token[129];
    char cookie_name[32]; /* "tandem_token_<port>": see server.c's request_token */
    int port;
    int loopback;
    int no_token; /* td_ui_options.no_token: GETs on loopback need no token */
    int listen_fd;
    struct MHD_Daemon *mhd;
    /* The read-write connection: kept open for the server's life (a read-only WAL reader needs
     * the -wal and -shm files it keeps), used only to stop runs, under writer_lock. */
    td_rundb *writer;
    pthread_mutex_t writer_lock;
    pthread_mutex_t pool_lock;
    pthread_cond_t pool_cond;
    td_rundb *readers[TD__UI_MAX_READERS]; /* idle ones */
    size_t nidle, nopen;
    td__ui_events *events;
    td__ui_guard *guard;
};

/* A reader connection for this thread (waits while all are busy); NULL with the error recorded
 * when none can be opened. */
td_rundb *td__ui_db_acquire(td_ui *ui);
void td__ui_db_release(td_ui *ui, td_rundb *db);

/* ---- one request and its reply ---- */
typedef struct td__ui_arg {
    char *name, *value; /* percent-decoded */
} td__ui_arg;

typedef struct td__ui_request {
    const char *method; /* "GET", "HEAD" or "POST" (others are refused before routing) */
    char **segs;        /* the path's segments, each percent-decoded on its own */
    size_t nsegs;
    td__ui_arg *args;
    size_t nargs;
    const char *last_event_id; /* Last-Event-ID header (an EventSource reconnecting), or NULL */
} td__ui_request;

typedef struct td__ui_reply {
    int status;
    const char *content_type;
    char *body; /* owned */
    size_t nbytes;
    int fd; /* >= 0: send this file (owned) of fd_nbytes, as an attachment */
    int64_t fd_nbytes;
    char *disposition;     /* Content-Disposition, owned */
    const char *allow;     /* Allow header of a 405 */
    const char *etag;      /* ETag of an asset */
    td__ui_stream *stream; /* an event stream (text/event-stream) */
} td__ui_reply;

/* The value of query parameter name, or NULL. */
const char *td__ui_arg_get(const td__ui_request *req, const char *name);
/* Replies with obj encoded (obj is consumed). */
void td__ui_reply_json(td__ui_reply *rep, int status, json_t *obj);
/* Replies {"error": "..."} with status. */
void td__ui_reply_error(td__ui_reply *rep, int status, const char *fmt, ...) TD_PRINTF(3, 4);

/* Routes /api/... (api.c). */
void td__ui_api(td_ui *ui, const td__ui_request *req, td__ui_reply *rep);

/* ---- shared by api.c and events.c ---- */
/* The metric keys the runs table shows by default. */
extern const char *const td__ui_default_keys[];
extern const size_t td__ui_ndefault_keys;
/* A run as the API shows it: the run object of /api/runs (with "metrics" for keys). */
json_t *td__ui_run_json(td_rundb *db, const td_run *run, const char *const *keys, size_t nkeys);
/* ---- text (buf.c) ---- */
/* n bytes of fd at off (a log file that grows), retrying short reads: 0, or -1 at an error or
 * the end of the file. */
int td__ui_pread_all(int fd, char *buf, size_t n, int64_t off);
typedef struct td__ui_buf {
    char *p; /* NUL-terminated, owned */
    size_t n, cap;
} td__ui_buf;
void td__ui_buf_put(td__ui_buf *b, const char *s, size_t n);
void td__ui_buf_str(td__ui_buf *b, const char *s);
/* The shortest text that reads back as the same double; null for NaN and infinities (JSON has
 * neither). */
void td__ui_buf_num(td__ui_buf *b, double v);
/* v encoded compactly (v is consumed). */
void td__ui_buf_json(td__ui_buf *b, json_t *v);
/* text as a valid UTF-8 JSON string: invalid bytes become U+FFFD. */
json_t *td__ui_json_text(const char *text, size_t nbytes);
/* "/api/runs/<id>/logs/<name>" style paths: s percent-encoded for one path segment. */
char *td__ui_url_segment(const char *s);
/* The log files of a run directory: rank-<R>.log (label R), then setup.log and supervisor.log
 * (labels "setup", "supervisor"). */
typedef struct td__ui_log {
    char *label; /* "0", "1", ..., "setup", "supervisor" */
    int rank;    /* -1 for setup/supervisor */
    char *path;
    int64_t nbytes;
} td__ui_log;
void td__ui_logs_list(const char *run_dir, td__ui_log **out, size_t *count);
/* The run's restart/resume marks, as the store keeps them (marks.c):
 * [{"kind": "resume"|"restart", "rank", "step", "time" (or null)}], by rank, then in the order
 * stored; the first 1000 stored (*partial = 1 when there are more). */
json_t *td__ui_marks_json(td_rundb *db, const td_run *run, int *partial);
void td__ui_logs_free(td__ui_log *logs, size_t count);
/* The JSON label of a log: its rank as a number, or "setup"/"supervisor". */
json_t *td__ui_log_label_json(const td__ui_log *log);

/* ---- the connection guard (guard.c): slow and idle clients ---- */
/* Seconds a connection has to send a whole request (from its start, or from the end of its
 * previous answer), however slowly its bytes come. */
#define TD__UI_REQUEST_S 10
/* Connections without a whole request yet, from one client address and from all: over either,
 * the oldest of them is closed. */
#define TD__UI_PENDING_PER_IP 32
#define TD__UI_PENDING_TOTAL  256
td_status td__ui_guard_start(td__ui_guard **out);
/* After libmicrohttpd has stopped; NULL is a no-op. */
void td__ui_guard_stop(td__ui_guard *g);
/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback (cls: the guard). */
void td__ui_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                         enum MHD_ConnectionNotificationCode code);
/* The handler answered a request on c: c is no longer pending. */
void td__ui_guard_answered(td__ui_guard *g, struct MHD_Connection *c);
/* c's request is done and it waits for another (keep-alive): pending again, from now. */
void td__ui_guard_waiting(td__ui_guard *g, struct MHD_Connection *c);
/* Connections closed by the guard so far. */
uint64_t td__ui_guard_ncut(td__ui_guard *g);

/* ---- server-sent events (events.c): one poller thread for every stream ---- */
td_status td__ui_events_start(td_ui *ui, td__ui_events **out);
/* Ends every stream (their readers return end-of-stream) and joins the poller. */
void td__ui_events_stop(td__ui_events *ev);
/* Frees it, once no connection holds a stream any more (after MHD has stopped). */
void td__ui_events_free(td__ui_events *ev);
/* A stream following run (resolved, exact id): points after `since` (has_since = 0: after the
 * newest point now), status, logs, resets. */
td__ui_stream *td__ui_stream_run(td__ui_events *ev, td_rundb *db, const td_run *run, int64_t since,
                                 int has_since);
/* A stream of the runs table: runs that appear or change; keys: the metrics their objects
 * carry (copied). */
td__ui_stream *td__ui_stream_runs(td__ui_events *ev, td_rundb *db, const char *const *keys,
                                  size_t nkeys);
/* Up to max bytes of the stream, blocking until there are some (a ping after 15 s of
 * silence); -1 at the end of the stream. */
ssize_t td__ui_stream_read(td__ui_stream *s, char *buf, size_t max);
/* The connection is done with the stream. */
void td__ui_stream_release(td__ui_stream *s);

#endif
