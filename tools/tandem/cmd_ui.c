/* tandem ui: serve the runs dashboard of this project until SIGINT/SIGTERM. */
#include <limits.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "tandem/exec.h"
#include "tandem/loop.h"
#include "tandem/os.h"
#include "tandem/ui.h"

enum { OPT_HOST = 1, OPT_PORT, OPT_PROJECT, OPT_NO_TOKEN };

static const cli_opt ui_opts[] = {
    {OPT_HOST, "host", 0, "ADDR", "address to listen on (default 127.0.0.1)", 0},
    {OPT_PORT, "port", 0, "PORT", "port (default 8080; 0 picks a free one)", 0},
    {OPT_PROJECT, "project", 0, "DIR", "the project directory holding .tandem/", 0},
    {OPT_NO_TOKEN, "no-token", 0, NULL,
     "serve the page and the API without the access token (a\n"
     "loopback address only): every user of this machine can then\n"
     "read every run's logs and artifacts; stopping a run still\n"
     "needs the token",
     0},
    {0},
};

static const cli_command ui_cmd = {
    .name = "tandem ui",
    .usage = "[--host ADDR] [--port PORT] [--project DIR] [--no-token]",
    .about = "Serves the runs dashboard of the project (its .tandem/ run store: --project DIR,\n"
             "else TANDEM_HOME, else the current directory) and prints the address to open.\n"
             "Runs, live charts of every metric, logs and artifacts; stop a running run.\n",
    .opts = ui_opts,
    .epilog = "Every request needs the access token of the printed URL (opening it once sets a\n"
              "cookie), whatever the address: other users of this machine can reach a loopback\n"
              "port too. The token is random per start (TANDEM_UI_TOKEN sets it). The API is in\n"
              "docs/ui-api.md. Ctrl-C stops the server.\n",
};

struct signal_wait {
    td_sigwatch *sw;
    int sig;
};

static void on_signal(td_loop *l, int fd, unsigned events, void *user) {
    (void)fd, (void)events;
    struct signal_wait *w = user;
    w->sig = td_sigwatch_next(w->sw);
    if (w->sig) td_loop_stop(l);
}

/* Runs that live in the cloud (tandem run -d of an aws run) are pulled from their store in S3
 * every few seconds while they have not ended, so the page shows them live as it shows local
 * runs: the server reads the store, and the pull keeps the store current. Off the loop's thread
 * (S3 calls block), one pass at a time. */
#define REMOTE_PULL_PERIOD_S 3.0
struct remote_pull {
    const char *project_dir;
    int busy;
};

static void pull_remote_runs(void *user) {
    struct remote_pull *rp = user;
    td_rundb *store = NULL;
    td_run *runs = NULL;
    size_t n = 0;
    if (td_rundb_open(rp->project_dir, &store) == TD_OK &&
        td_run_list(store, TD_RUN_LIST_ALL, &runs, &n) == TD_OK)
        for (size_t i = 0; i < n; i++)
            if (!td_run_status_is_final(runs[i].status) && td_run_is_remote(&runs[i]) &&
                td_exec_remote_refresh(store, &runs[i]) != TD_OK) {
                fprintf(stderr, "tandem ui: warning: %s\n", td_error_msg());
                td_error_clear();
            }
    td_error_clear();
    td_runs_free(runs, n);
    td_rundb_close(store);
}

static void pulled_remote_runs(td_loop *l, void *user) {
    (void)l;
    ((struct remote_pull *)user)->busy = 0;
}

static void on_pull_timer(td_loop *l, void *user) {
    struct remote_pull *rp = user;
    if (rp->busy) return;
    if (td_loop_queue_work(l, pull_remote_runs, pulled_remote_runs, rp))
        rp->busy = 1;
    else
        td_error_clear();
}

/* The server runs in libmicrohttpd's threads and the events thread; this one only waits, on
 * the event loop every long-lived tandem process runs on, for SIGINT or SIGTERM (and pulls the
 * runs that live in the cloud). Returns the signal, or 0 when the loop itself failed
 * (printed). */
static int wait_for_signal(td_sigwatch *sw, const char *project_dir) {
    struct signal_wait w = {.sw = sw, .sig = 0};
    struct remote_pull rp = {.project_dir = project_dir};
    td_loop *l = NULL;
    td_status st = td_loop_new(&l);
    if (st == TD_OK) st = td_loop_watch(l, sw->fd, TD_LOOP_READ, on_signal, &w);
    if (st == TD_OK) td_loop_timer(l, 0, REMOTE_PULL_PERIOD_S, on_pull_timer, &rp);
    if (st == TD_OK) st = td_loop_run(l);
    if (st != TD_OK) td_error_print(st);
    td_loop_free(l);
    return w.sig;
}

/* Each connection is a socket and the server's dup of it: the usual soft limit of 1024
 * descriptors would cap it near 450 connections, the hard limit allows more. Best effort: the
 * server sizes itself to whatever limit it finds. */
static void raise_fd_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > 4096 ? 4096 : rl.rlim_max;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        rl.rlim_cur = want;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int cmd_ui(int argc, char **argv) {
    td_ui_options opts = {.host = "127.0.0.1", .port = 8080};
    cli_parser p;
    cli_init(&p, &ui_cmd, argc, argv);
    for (int c; (c = cli_next(&p)) != CLI_END;) {
        int64_t port;
        switch (c) {
        case CLI_EXIT:
            return p.exit_code;
        case CLI_ARG:
            return cli_error(&ui_cmd, "unexpected argument '%s'", p.value);
        case OPT_HOST:
            if (!*p.value) return cli_error(&ui_cmd, "--host expects an address, e.g. 127.0.0.1");
            opts.host = p.value;
            break;
        case OPT_PORT:
            if (td_parse_i64("--port", p.value, &port) != TD_OK || port < 0 || port > 65535) {
                td_error_clear();
                return cli_error(&ui_cmd,
                                 "--port '%s': expects a port from 0 (any free one) "
                                 "to 65535",
                                 p.value);
            }
            opts.port = (int)port;
            break;
        case OPT_PROJECT:
            if (!*p.value) return cli_error(&ui_cmd, "--project expects a directory");
            opts.project_dir = p.value;
            break;
        case OPT_NO_TOKEN:
            opts.no_token = 1;
            break;
        }
    }
    /* TANDEM_UI_TOKEN: a fixed token (a reverse proxy or a bookmark that outlives restarts). */
    const char *token = td_env_str(TD_ENV_UI_TOKEN);
    if (token && *token) opts.token = token;

    /* Signals through a descriptor, blocked before the server's threads start so that none of
     * them takes SIGINT/SIGTERM (td_sigwatch also passes on what a thread started before main,
     * OpenBLAS's, would take). */
    td_sigwatch sw;
    const int sigs[] = {SIGINT, SIGTERM};
    td_status st = td_sigwatch_open(&sw, sigs, 2);
    if (st != TD_OK) {
        td_error_print(st);
        return 1;
    }
    raise_fd_limit();
    td_ui *ui = NULL;
    st = td_ui_start(&opts, &ui);
    if (st != TD_OK) {
        td_error_print(st);
        td_sigwatch_close(&sw);
        return st == TD_ERR_INVALID ? 2 : 1;
    }
    printf("tandem ui: %s\n", td_ui_url(ui));
    if (!td_ui_is_loopback(ui))
        printf("tandem ui: listening on %s, not a loopback address: every request needs the "
               "token, so share this URL only with people who may see and stop these runs\n",
               opts.host);
    if (!td_ui_needs_token(ui))
        printf("tandem ui: warning: --no-token: every user of this machine can read these runs' "
               "logs, metrics and artifacts through port %d (stopping a run still needs the "
               "token); leave --no-token out to keep them private\n",
               td_ui_port(ui));
    printf("tandem ui: serving %s; Ctrl-C stops it\n",
           opts.project_dir ? opts.project_dir : "this project's runs");
    fflush(stdout);
    int sig = wait_for_signal(&sw, opts.project_dir);
    td_ui_stop(ui);
    td_sigwatch_close(&sw);
    printf("tandem ui: stopped (%s)\n", sig ? strsignal(sig) : "its event loop failed");
    return 0;
}
