/* tandem ui: serve the runs dashboard of this project until SIGINT/SIGTERM. */
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "tandem/loop.h"
#include "tandem/os.h"
#include "tandem/ui.h"

static const char usage_line[] = "usage: tandem ui [--host ADDR] [--port PORT] [--project DIR]\n";

static void help(void) {
    printf("%s\n"
           "Serves the runs dashboard of the project (its .tandem/ run store: --project DIR,\n"
           "else TANDEM_HOME, else the current directory) and prints the address to open.\n"
           "Runs, live charts of every metric, logs and artifacts; stop a running run.\n\n"
           "  --host ADDR    address to listen on (default 127.0.0.1); any other than a\n"
           "                 loopback address makes every request need the access token\n"
           "  --port PORT    port (default 8080; 0 picks a free one)\n"
           "  --project DIR  the project directory holding .tandem/\n\n"
           "The access token is random per start (TANDEM_UI_TOKEN sets it). The API is in\n"
           "docs/ui-api.md. Ctrl-C stops the server.\n",
           usage_line);
}

static int usage_error(const char *fmt, ...) TD_PRINTF(1, 2);
static int usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tandem ui: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n%s", usage_line);
    return 2;
}

/* "--flag VALUE" or "--flag=VALUE": the value, or NULL when this argument is not the flag. */
static const char *flag_value(int argc, char **argv, int *i, const char *flag, int *missing) {
    size_t n = strlen(flag);
    if (strncmp(argv[*i], flag, n)) return NULL;
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (argv[*i][n] != '\0') return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

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

/* The server runs in libmicrohttpd's threads and the events thread; this one only waits, on
 * the event loop every long-lived tandem process runs on, for SIGINT or SIGTERM. Returns the
 * signal, or 0 when the loop itself failed (printed). */
static int wait_for_signal(td_sigwatch *sw) {
    struct signal_wait w = {.sw = sw, .sig = 0};
    td_loop *l = NULL;
    td_status st = td_loop_new(&l);
    if (st == TD_OK) st = td_loop_watch(l, sw->fd, TD_LOOP_READ, on_signal, &w);
    if (st == TD_OK) st = td_loop_run(l);
    if (st != TD_OK) td_error_print(st);
    td_loop_free(l);
    return w.sig;
}

int cmd_ui(int argc, char **argv) {
    td_ui_options opts = {.host = "127.0.0.1", .port = 8080};
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            help();
            return 0;
        } else if ((v = flag_value(argc, argv, &i, "--host", &missing)) || missing) {
            if (missing || !*v)
                return usage_error("%s expects an address, e.g. 127.0.0.1", "--host");
            opts.host = v;
        } else if ((v = flag_value(argc, argv, &i, "--port", &missing)) || missing) {
            int64_t port;
            if (missing || td_parse_i64("--port", v, &port) != TD_OK || port < 0 || port > 65535) {
                td_error_clear();
                return usage_error("%s expects a port from 0 (any free one) to 65535", "--port");
            }
            opts.port = (int)port;
        } else if ((v = flag_value(argc, argv, &i, "--project", &missing)) || missing) {
            if (missing || !*v) return usage_error("%s expects a directory", "--project");
            opts.project_dir = v;
        } else {
            return usage_error("unknown argument '%s'", argv[i]);
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
    printf("tandem ui: serving %s; Ctrl-C stops it\n",
           opts.project_dir ? opts.project_dir : "this project's runs");
    fflush(stdout);
    int sig = wait_for_signal(&sw);
    td_ui_stop(ui);
    td_sigwatch_close(&sw);
    printf("tandem ui: stopped (%s)\n", sig ? strsignal(sig) : "its event loop failed");
    return 0;
}
