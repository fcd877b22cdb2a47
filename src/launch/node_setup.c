/* A node's setup (tandem launch --node-setup; a workflow's node_setup:): commands run once on
 * this node, before it joins the group and starts its workers, the place to install packages
 * or build the code on a fresh machine. Each runs with /bin/sh -c in the launcher's directory
 * and environment (what the workers get, less their per-rank variables), in a process group of
 * its own. Its output goes to LOG_DIR/node-setup-N.log (the executors mirror the log directory
 * back to the run) and to our stderr, line by line with "[node-setup N] " in front.
 *
 * On the agent's terms: a stop signal (SIGTERM, SIGINT, SIGHUP: a stop the supervisor asked
 * for arrives as one) ends the command's group and the agent, with no workers started; a
 * failing command ends the agent with its cause (which command, its exit code, where the log
 * is), which goes into the end record. One event loop watches the output, the command's exit
 * and the signals. */
#include "launch_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tandem/loop.h"
#include "tandem/os.h"

typedef struct {
    int log_fd, err_fd;
    char prefix[48];
    char line[4096];
    size_t len;
    pid_t pid;
    int status;
    bool exited, out_done;
    int stop_sig; /* a stop signal that came */
    td_sigwatch *sigs;
} setup_cmd;

/* A full disk or a closed stderr must not stop the setup: write errors are not fatal here. */
static void write_all(int fd, const char *s, size_t n) {
    if (fd >= 0) (void)td__write_all(fd, s, n);
}

/* One line (or a full buffer) of the command's output, to our stderr with the prefix. */
static void emit(setup_cmd *c) {
    if (!c->len) return;
    write_all(c->err_fd, c->prefix, strlen(c->prefix));
    write_all(c->err_fd, c->line, c->len);
    if (c->line[c->len - 1] != '\n') write_all(c->err_fd, "\n", 1);
    c->len = 0;
}

static void maybe_stop(td_loop *l, setup_cmd *c) {
    if (c->exited && c->out_done) td_loop_stop(l);
}

static void on_output(td_loop *l, int fd, unsigned events, void *user) {
    (void)events;
    setup_cmd *c = user;
    char buf[8192];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
        emit(c);
        td_loop_unwatch(l, fd);
        c->out_done = true;
        maybe_stop(l, c);
        return;
    }
    write_all(c->log_fd, buf, (size_t)n);
    for (ssize_t i = 0; i < n; i++) {
        c->line[c->len++] = buf[i];
        if (buf[i] == '\n' || c->len == sizeof c->line) emit(c);
    }
}

static void on_exit_(td_loop *l, pid_t pid, int status, void *user) {
    (void)pid;
    setup_cmd *c = user;
    c->status = status;
    c->exited = true;
    maybe_stop(l, c);
}

static void on_signal(td_loop *l, int fd, unsigned events, void *user) {
    (void)l, (void)fd, (void)events;
    setup_cmd *c = user;
    for (int sig; (sig = td_sigwatch_next(c->sigs));) {
        if (sig == SIGCHLD || c->exited) continue;
        if (!c->stop_sig)
            TD_LOG_INFO("received SIG%s during the node setup; ending it", sigabbrev_np(sig));
        c->stop_sig = sig;
        kill(-c->pid, SIGTERM); /* its group: the command and what it started */
    }
}

/* Runs one command to its end (or a stop). */
static td_status run_one(setup_cmd *c, const char *command) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return td_error_errno(TD_ERR_SYS, "node setup: pipe");
    char *argv[] = {"/bin/sh", "-c", (char *)command, NULL};
    td_spawn_opts so;
    td_spawn_opts_init(&so);
    so.argv = argv;
    so.out_fd = so.err_fd = p[1];
    so.death_signal = SIGTERM; /* the agent gone: the setup has nobody to report to */
    td_status st = td_spawn(&so, &c->pid);
    close(p[1]);
    if (st != TD_OK) {
        close(p[0]);
        return st;
    }
    c->exited = c->out_done = false;
    c->len = 0;
    td_loop *l = NULL;
    st = td_loop_new(&l);
    if (st == TD_OK) st = td_loop_watch(l, p[0], TD_LOOP_READ, on_output, c);
    if (st == TD_OK) st = td_loop_watch_child(l, c->pid, on_exit_, c);
    if (st == TD_OK) st = td_loop_watch(l, c->sigs->fd, TD_LOOP_READ, on_signal, c);
    if (st == TD_OK) st = td_loop_run(l);
    if (st != TD_OK) { /* not watched: not left running either */
        kill(-c->pid, SIGKILL);
        if (!c->exited) td_waitpid(c->pid, &c->status, 0);
    }
    td_loop_free(l);
    close(p[0]);
    return st;
}

static int node_label(const td_launch_options *o, char *out, size_t nbytes) {
    if (o->node_rank >= 0) return snprintf(out, nbytes, "%d", o->node_rank);
    if (o->standalone || !o->rdzv_endpoint) return snprintf(out, nbytes, "0"); /* one node */
    char host[256] = "node";
    gethostname(host, sizeof host - 1);
    return snprintf(out, nbytes, "%s", host);
}

td_status td__node_setup(const td_launch_options *o, td_sigwatch *sigs, int *exit_code,
                         bool *stopped) {
    *stopped = false;
    if (o->nnode_setup <= 0) return TD_OK;
    char label[256];
    node_label(o, label, sizeof label);
    char *log_path = o->log_dir ? td_xasprintf("%s/node-setup-%s.log", o->log_dir, label) : NULL;
    setup_cmd c = {.log_fd = -1, .err_fd = o->err_fd, .sigs = sigs};
    snprintf(c.prefix, sizeof c.prefix, "[node-setup %.32s] ", label);
    if (log_path) {
        c.log_fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (c.log_fd < 0) {
            td_status st =
                td_error_errno(TD_ERR_IO, "node setup: cannot open its log %s", log_path);
            free(log_path);
            return st;
        }
    }
    td_status st = TD_OK;
    double t0 = td_now_s();
    for (int i = 0; i < o->nnode_setup && st == TD_OK; i++) {
        const char *cmd = o->node_setup[i];
        char head[600];
        int n = snprintf(head, sizeof head, "$ %.500s\n", cmd);
        write_all(c.log_fd, head, (size_t)TD_MIN(n, (int)sizeof head - 1));
        TD_LOG_INFO("node setup %d/%d on node %s: %s", i + 1, o->nnode_setup, label, cmd);
        st = run_one(&c, cmd);
        if (st != TD_OK) break;
        if (c.stop_sig) {
            *stopped = true;
            *exit_code = c.stop_sig == SIGINT ? 130 : 143;
            break;
        }
        int code = td_wait_exit_code(c.status);
        if (code != 0)
            st = td_error(TD_ERR_IO,
                          "node setup failed on node %s: '%.200s' exited with code %d; its output "
                          "is in %s",
                          label, cmd, code, log_path ? log_path : "the launcher's stderr");
    }
    if (st == TD_OK && !*stopped)
        TD_LOG_INFO("node setup on node %s done in %.1f s", label, td_now_s() - t0);
    if (c.log_fd >= 0) close(c.log_fd);
    free(log_path);
    return st;
}
