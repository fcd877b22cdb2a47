/* The node agent's link to an executor's supervisor over its stdin and stdout
 * (tandem launch --forward-stdio; include/tandem/launch.h). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tandem/launch.h"
#include "tandem/mirror.h"

/* How often the files are looked at: a log line reaches the supervisor within this. */
#define LINK_PERIOD_MS 200

struct td_agent_link {
    int in_fd, out_fd;
    pid_t agent_tid; /* the thread that runs td_launch_run and reads the signalfd */
    td_mirror_out *mirror;
    pthread_mutex_t lock; /* the mirror: the sender thread and the agent's on_store */
    pthread_t thread;
    bool thread_started;
    atomic_bool closing;
    atomic_int lost; /* "lost NODE" lines: other agents known gone */
    bool broken;     /* the stream to the supervisor failed: nothing more is sent */
    bool stopped;    /* we asked ourselves to stop already */
};

/* Stops the job the way a SIGTERM does: the agent reads it from its signalfd, forwards it to
 * the workers (they checkpoint), and tells the other nodes. Sent to the agent's thread, not to
 * the process: a stop may come before td_launch_run has opened its sigwatch (whose handler
 * passes stray signals on), and until then a process-directed SIGTERM could land on the thread
 * OpenBLAS starts at load time with nothing blocked, and kill the agent there. */
static void stop_self(td_agent_link *l, const char *why) {
    if (l->stopped) return;
    l->stopped = true;
    TD_LOG_WARN("%s: stopping the workers (as SIGTERM)", why);
    syscall(SYS_tgkill, getpid(), l->agent_tid, SIGTERM);
}

/* A line from the supervisor after "go". */
static void on_line(td_agent_link *l, const char *line) {
    if (!strcmp(line, "stop"))
        stop_self(l, "the supervisor asked to stop");
    else if (!strncmp(line, "lost ", 5))
        atomic_fetch_add(&l->lost, 1);
    else
        TD_LOG_WARN("the supervisor sent '%.60s', which this agent does not know; ignored", line);
}

static void *sender(void *arg) {
    td_agent_link *l = arg;
    char buf[512];
    size_t len = 0;
    bool in_open = true;
    while (!atomic_load(&l->closing)) {
        struct pollfd p = {.fd = l->in_fd, .events = POLLIN};
        int r = in_open ? poll(&p, 1, LINK_PERIOD_MS) : poll(NULL, 0, LINK_PERIOD_MS);
        if (r > 0) {
            ssize_t n = read(l->in_fd, buf + len, sizeof buf - 1 - len);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                in_open = false;
                stop_self(l, "the link to the supervisor closed (its host, ssh or the supervisor "
                             "is gone)");
            } else {
                len += (size_t)n;
                char *nl;
                while ((nl = memchr(buf, '\n', len))) {
                    *nl = '\0';
                    on_line(l, buf);
                    len -= (size_t)(nl + 1 - buf);
                    memmove(buf, nl + 1, len);
                }
                if (len == sizeof buf - 1) len = 0; /* a line that long is no command */
            }
        }
        pthread_mutex_lock(&l->lock);
        if (!l->broken && td_mirror_out_poll(l->mirror, NULL) != TD_OK) {
            l->broken = true;
            char why[600];
            snprintf(why, sizeof why, "cannot send logs and metrics to the supervisor (%s)",
                     td_error_msg());
            stop_self(l, why);
        }
        pthread_mutex_unlock(&l->lock);
    }
    return NULL;
}

/* The opening lines, up to "go", one byte at a time: nothing after "go" may be consumed here,
 * and the lines are few. */
static td_status read_opening(td_agent_link *l) {
    char line[600];
    size_t len = 0;
    for (;;) {
        char c;
        ssize_t n = read(l->in_fd, &c, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return td_error_errno(TD_ERR_IO, "--forward-stdio: reading stdin");
        if (n == 0)
            return td_error(TD_ERR_IO, "--forward-stdio: stdin ended before the supervisor's "
                                       "'go' line (is this agent started by an executor?)");
        if (c != '\n') {
            if (len + 1 >= sizeof line)
                return td_error(TD_ERR_FORMAT, "--forward-stdio: a line over %zu bytes on stdin",
                                sizeof line);
            line[len++] = c;
            continue;
        }
        line[len] = '\0';
        len = 0;
        if (!strcmp(line, "go")) return TD_OK;
        if (!strncmp(line, "token ", 6)) {
            setenv(td_var_name(TD_VAR_TANDEM_TOKEN), line + 6, 1);
            memset(line, 0, sizeof line);
        } else if (!strncmp(line, "have ", 5)) {
            TD_CHECK(td_mirror_out_have(l->mirror, line));
        } else {
            return td_error(TD_ERR_FORMAT,
                            "--forward-stdio: '%.60s' on stdin is not an opening line (token, "
                            "have, go)",
                            line);
        }
    }
}

td_status td_agent_link_open(int in_fd, int out_fd, const char *log_dir, const char *metrics_dir,
                             td_agent_link **out) {
    *out = NULL;
    td_agent_link *l = td_xcalloc(1, sizeof *l);
    l->in_fd = in_fd;
    l->out_fd = out_fd;
    l->agent_tid = (pid_t)syscall(SYS_gettid);
    l->mirror = td_mirror_out_new(out_fd);
    pthread_mutex_init(&l->lock, NULL);
    if (log_dir) td_mirror_out_watch(l->mirror, "logs", log_dir);
    if (metrics_dir) td_mirror_out_watch(l->mirror, "metrics", metrics_dir);
    td_status st = read_opening(l);
    if (st == TD_OK) {
        /* The thread starts with every signal blocked (it inherits this mask): the agent's
         * SIGTERM and SIGCHLD belong to its signalfd, never to a thread's default action. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        int err = pthread_create(&l->thread, NULL, sender, l);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (err) st = td_error(TD_ERR_SYS, "--forward-stdio: starting a thread: %s", strerror(err));
        l->thread_started = err == 0;
    }
    if (st != TD_OK) {
        td_agent_link_close(l);
        return st;
    }
    *out = l;
    return TD_OK;
}

void td_agent_link_store_port(void *link, int port) {
    td_agent_link *l = link;
    char value[16];
    snprintf(value, sizeof value, "%d", port);
    pthread_mutex_lock(&l->lock);
    if (!l->broken && td_mirror_out_note(l->mirror, "store_port", value) != TD_OK) {
        l->broken = true;
        TD_LOG_WARN("cannot tell the supervisor the store's port: %s", td_error_msg());
    }
    pthread_mutex_unlock(&l->lock);
}

int td_agent_link_lost_nodes(void *link) {
    return atomic_load(&((td_agent_link *)link)->lost);
}

td_status td_agent_link_close(td_agent_link *l) {
    if (!l) return TD_OK;
    td_status st = TD_OK;
    if (l->thread_started) {
        atomic_store(&l->closing, true);
        pthread_join(l->thread, NULL);
        if (!l->broken) st = td_mirror_out_end(l->mirror);
    }
    td_mirror_out_free(l->mirror);
    pthread_mutex_destroy(&l->lock);
    free(l);
    return st;
}
