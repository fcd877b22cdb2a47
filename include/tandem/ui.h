/* tandem ui: the runs dashboard, served over HTTP from the run store.
 *
 * One embedded server (libmicrohttpd, a thread per connection) serves the page (its assets are
 * compiled into the binary), a JSON API over the project's run store and server-sent events
 * that follow running runs (new metric points, status, log lines). It reads the store through
 * read-only connections; it writes only to stop a run (the one action, which needs the access
 * token) and, as `tandem ps` does, to mark failed a run whose supervisor has died.
 *
 * Access: a random 32-hex-digit token is made at every start (or taken from the options), and
 * every request needs it, whatever the address, as Jupyter does: on a shared machine any local
 * user can reach a loopback port. no_token lets GETs through without it on a loopback address
 * (POST still needs it). Clients that trickle a request (slowloris) are cut after 10 s and
 * bounded per address. The API and its rules are in docs/ui-api.md.
 */
#ifndef TANDEM_UI_H
#define TANDEM_UI_H

#include "tandem/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_ui_options {
    const char *project_dir; /* holds .tandem/; NULL = TANDEM_HOME, else the current directory */
    const char *host;        /* address to listen on; NULL = "127.0.0.1" */
    int port;                /* 0 = any free port (td_ui_port says which) */
    const char *token;       /* NULL = a fresh random one; else 16 to 128 characters of
                              * [A-Za-z0-9_-] */
    int no_token;            /* 1: GETs need no token (any local user then reads every run);
                              * only on a loopback address, else td_ui_start refuses */
} td_ui_options;

typedef struct td_ui td_ui;

/* Opens the run store, binds host:port and starts serving from threads of its own; returns at
 * once. The caller should block SIGPIPE-raising signals as it sees fit: the server never raises
 * SIGPIPE itself. TD_ERR_INVALID for a bad token or host, or no_token on an address that is not
 * loopback; TD_ERR_SYS when the port is taken. */
td_status td_ui_start(const td_ui_options *opts, td_ui **out);
/* Stops serving: open event streams end, connections close, threads are joined. NULL is a
 * no-op. */
void td_ui_stop(td_ui *ui);

/* The port it listens on. */
int td_ui_port(const td_ui *ui);
/* The access token. */
const char *td_ui_token(const td_ui *ui);
/* "http://HOST:PORT/?token=TOKEN", the address to open (HOST is this machine's name when it
 * listens on every interface). */
const char *td_ui_url(const td_ui *ui);
/* 1 when it listens on a loopback address, else 0. */
int td_ui_is_loopback(const td_ui *ui);
/* 1 when every request needs the token (the default), 0 when GETs are served without it
 * (no_token). */
int td_ui_needs_token(const td_ui *ui);

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_UI_H */
