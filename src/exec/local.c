/* The local carrier: the run's nodes as `tandem launch` child processes of tandem run, on this
 * machine. The supervisor (supervisor.h) makes the decisions; this file starts the launchers,
 * passes their stderr through to ours, samples their system metrics, ends them softly (SIGTERM:
 * they stop their workers at a step boundary with a checkpoint) or hard (SIGKILL to the whole
 * tree), and, once every launcher has exited, reads how the attempt ended from their end
 * records (endrec.h).
 *
 * The launcher is a separate process (this tandem's own binary), so this layer depends on
 * launch's command-line contract only. Several nodes on this host meet at node 0's rendezvous
 * store on a loopback port with a random token. The launchers restart their own workers
 * (--max-restarts): the supervisor restarts nothing itself for this carrier. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exec/supervisor.h"
#include "tandem/endrec.h"
#include "tandem/os.h"

#define LAUNCH_STOP_GRACE_S 30.0 /* passed to launch; the supervisor escalates some time after */
#define KILL_AFTER_S        (LAUNCH_STOP_GRACE_S + 15.0)

/* ---- the terminal ----
 * What is on the terminal's current line: a worker's progress bar that the launcher passed on
 * ending with '\r' (the cursor is back at column 0 and the next redraw overwrites it). Any other
 * line written over it first clears it, so no tail of the bar is left behind. */
typedef struct {
    int tty;             /* our stderr is a terminal */
    int bar_open;        /* the current line holds a bar */
    char bar_prefix[32]; /* "[rank 0] ": the bar's own lines may overwrite it as they are */
} term_state;

static void term_clear_bar(term_state *t) {
    if (t->bar_open && t->tty) td__exec_write_all(STDERR_FILENO, "\033[K", 3);
    t->bar_open = 0;
}

/* One complete segment of a launcher's stderr, with its terminator. */
static void term_write(term_state *t, const char *seg, size_t len) {
    int redraw = len > 0 && seg[len - 1] == '\r';
    size_t plen = strlen(t->bar_prefix);
    int same_source = t->bar_open && plen > 0 && len >= plen && !memcmp(seg, t->bar_prefix, plen);
    if (t->bar_open && !same_source) term_clear_bar(t);
    td__exec_write_all(STDERR_FILENO, seg, len);
    t->bar_open = redraw;
    if (redraw) {
        const char *end =
            memchr(seg, ']', len < sizeof t->bar_prefix - 2 ? len : sizeof t->bar_prefix - 2);
        size_t n = end && seg[0] == '[' ? (size_t)(end - seg) + 1 : 0;
        if (n && n < len && seg[n] == ' ') n++;
        memcpy(t->bar_prefix, seg, n);
        t->bar_prefix[n] = '\0';
    }
}

/* ---- the launchers ---- */
typedef struct {
    pid_t pid;
    int done;
    int code;
    int err_fd; /* read end of the launcher's stderr, -1 once closed */
    char *seg;  /* the segment (up to '\n' or '\r') being assembled */
    size_t seg_len, seg_cap;
} launcher;

typedef struct {
    td__carrier base;
    const td_exec_job *job;
    td__sup *sup;
    int failed;      /* the first launcher that exited non-zero while others ran, -1: none */
    int failed_code; /* its exit code */
    char **env;      /* the job's environment plus what the launchers need (NULL-terminated) */
    size_t nenv;
    launcher *nodes;
    int n, alive;
    bool stopping; /* the supervisor asked the launchers to stop */
    td_sysmon *mon;
    term_state term;
} local_carrier;

/* Copies what a launcher wrote to stderr through to ours, segment by segment (the launcher
 * writes whole lines, and progress-bar redraws ending in '\r', in one write each). Nothing is
 * parsed from it: how the launcher ended comes back in its end record. */
static void pump_stderr(launcher *a, term_state *t) {
    if (a->err_fd < 0) return;
    char buf[8192];
    for (int eof = 0; !eof;) {
        ssize_t n = read(a->err_fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) return;
        if (n <= 0) {
            eof = 1;
            n = 0;
        }
        for (ssize_t i = 0; i < n; i++) {
            if (a->seg_len + 1 >= a->seg_cap) {
                a->seg_cap = a->seg_cap ? 2 * a->seg_cap : 1024;
                a->seg = td_xrealloc(a->seg, a->seg_cap);
            }
            a->seg[a->seg_len++] = buf[i];
            if (buf[i] != '\n' && buf[i] != '\r' && a->seg_len < 65536) continue;
            term_write(t, a->seg, a->seg_len);
            a->seg_len = 0;
        }
    }
    if (a->seg_len) term_write(t, a->seg, a->seg_len); /* a last line without its newline */
    a->seg_len = 0;
    close(a->err_fd);
    a->err_fd = -1;
}

static void env_set(local_carrier *lc, const char *key, const char *value) {
    size_t klen = strlen(key);
    for (size_t i = 0; i < lc->nenv; i++)
        if (!strncmp(lc->env[i], key, klen) && lc->env[i][klen] == '=') {
            free(lc->env[i]);
            lc->env[i] = value ? td_xasprintf("%s=%s", key, value) : lc->env[--lc->nenv];
            if (!value) lc->env[lc->nenv] = NULL;
            return;
        }
    if (!value) return;
    lc->env = td_xrealloc(lc->env, (lc->nenv + 2) * sizeof *lc->env);
    lc->env[lc->nenv++] = td_xasprintf("%s=%s", key, value);
    lc->env[lc->nenv] = NULL;
}

typedef struct {
    char **v;
    size_t n;
} args;

static void arg(args *a, char *owned) {
    a->v = td_xrealloc(a->v, (a->n + 2) * sizeof *a->v);
    a->v[a->n++] = owned;
    a->v[a->n] = NULL;
}

static void args_free(args *a) {
    for (size_t i = 0; i < a->n; i++) free(a->v[i]);
    free(a->v);
}

/* tandem launch's command line for node `node_rank` (launch's contract). */
static void launch_argv(const local_carrier *lc, int node_rank, int port, args *argv) {
    const td_exec_job *job = lc->job;
    const td_run *run = job->run;
    arg(argv, td_xstrdup(job->tandem_bin));
    arg(argv, td_xstrdup("launch"));
    arg(argv, td_xasprintf("--nnodes=%d", run->nodes));
    arg(argv, td_xasprintf("--nproc-per-node=%d", run->nproc_per_node));
    if (run->nodes == 1) {
        arg(argv, td_xstrdup("--standalone"));
    } else {
        arg(argv, td_xasprintf("--node-rank=%d", node_rank));
        arg(argv, td_xasprintf("--rdzv-endpoint=127.0.0.1:%d", port));
    }
    arg(argv, td_xasprintf("--rdzv-id=%s", run->id));
    arg(argv, td_xasprintf("--max-restarts=%d", job->max_restarts));
    arg(argv, td_xasprintf("--stop-grace=%g", LAUNCH_STOP_GRACE_S));
    arg(argv, td_xasprintf("--log-dir=%s/logs", run->run_dir));
    arg(argv, td_xasprintf("--metrics-dir=%s/metrics", run->run_dir));
    char *end = td_exec_end_record_path(run, node_rank);
    arg(argv, td_xasprintf("--end-record=%s", end));
    free(end);
    for (size_t i = 0; i < job->nnode_setup; i++)
        arg(argv, td_xasprintf("--node-setup=%s", job->node_setup[i]));
    arg(argv, td_xstrdup("--"));
    arg(argv, td_xstrdup("/bin/sh"));
    arg(argv, td_xstrdup("-c"));
    /* dash does not exec the last command, so the worker launch watches is this shell. On a
     * stop the launcher signals the worker's process group: without a trap the shell would die
     * of SIGTERM at once (a failure to the launcher) while the program is still saving its
     * checkpoint. With `trap : TERM` the shell waits for the program and exits with its status
     * (143 after a checkpoint); the program itself gets the default SIGTERM disposition. */
    arg(argv, td_xasprintf("trap : TERM\n%s", job->script));
}

/* After every launcher exited: the rest of their stderr, their end records, the attempt's end
 * for the supervisor. The code is the first non-zero launcher's (node 0 first). */
static void attempt_over(local_carrier *lc) {
    td__sup_exit e = {.code = 0, .worker_code = -1};
    int *codes = td_xcalloc((size_t)lc->n, sizeof *codes);
    for (int i = 0; i < lc->n; i++) {
        launcher *a = &lc->nodes[i];
        codes[i] = a->code;
        if (a->code != 0 && e.code == 0) e.code = a->code;
        if (i == lc->failed) e.code = a->code; /* the one that failed first, not one stopped */
        if (a->err_fd >= 0) {
            fcntl(a->err_fd, F_SETFL, fcntl(a->err_fd, F_GETFL) & ~O_NONBLOCK);
            pump_stderr(a, &lc->term); /* to EOF: the launcher has exited */
        }
    }
    td_exec_end_summary ends;
    td_exec_end_records_read(lc->job->run, lc->n, codes, &ends);
    free(codes);
    e.worker_code = ends.worker_code;
    e.node_restarts = ends.restarts;
    snprintf(e.cause, sizeof e.cause, "%s", ends.cause);
    td__sup_attempt_over(lc->sup, &e);
}

static void on_stderr(td_loop *l, int fd, unsigned events, void *user) {
    (void)events;
    local_carrier *lc = user;
    for (int i = 0; i < lc->n; i++) {
        if (lc->nodes[i].err_fd != fd) continue;
        td_loop_unwatch(l, fd); /* watched again below unless the pump reached its end */
        pump_stderr(&lc->nodes[i], &lc->term);
        if (lc->nodes[i].err_fd >= 0) td_loop_watch(l, fd, TD_LOOP_READ, on_stderr, lc);
        return;
    }
}

/* A launcher that failed while the others run: they must not wait for it (node 0 hosts the
 * rendezvous store; the others would wait for it until the rendezvous timeout). Its own end
 * record, written before it exited, says why. */
static void node_failed(local_carrier *lc, int i) {
    lc->failed = i;
    lc->failed_code = lc->nodes[i].code;
    char why[1200];
    snprintf(why, sizeof why, "node %d: its launcher exited with code %d; see tandem logs %s", i,
             lc->nodes[i].code, lc->job->run->id);
    char *path = td_exec_end_record_path(lc->job->run, i);
    td_end_record r;
    if (td_end_record_read(path, &r) == TD_OK) {
        if (r.cause[0])
            snprintf(why, sizeof why, "%.500s%s%.500s", r.cause, r.failure_line[0] ? ": " : "",
                     r.failure_line);
        td_end_record_clear(&r);
    }
    td_error_clear();
    free(path);
    td__sup_node_lost(lc->sup, i, why);
}

static void on_exit_(td_loop *l, pid_t pid, int status, void *user) {
    (void)l;
    local_carrier *lc = user;
    for (int i = 0; i < lc->n; i++)
        if (lc->nodes[i].pid == pid && !lc->nodes[i].done) {
            lc->nodes[i].done = 1;
            lc->nodes[i].code = td_wait_exit_code(status);
            lc->alive--;
            if (lc->nodes[i].code != 0 && lc->alive > 0 && lc->failed < 0 && !lc->stopping)
                node_failed(lc, i);
        }
    if (lc->alive == 0) attempt_over(lc);
}

/* Ends every launcher started so far and waits for them: a start that failed half way. */
static void kill_started(local_carrier *lc) {
    for (int j = 0; j < lc->n; j++)
        if (lc->nodes[j].pid > 0 && !lc->nodes[j].done) td_kill_tree(lc->nodes[j].pid, SIGKILL);
    for (int j = 0; j < lc->n; j++)
        if (lc->nodes[j].pid > 0 && !lc->nodes[j].done) td_waitpid(lc->nodes[j].pid, NULL, 0);
    for (int j = 0; j < lc->n; j++) lc->nodes[j].done = 1;
}

/* Starts launcher i; node 0 inherits the store's listening socket. */
static td_status spawn_launcher(local_carrier *lc, int i, int port, int listen_fd) {
    args argv = {0};
    launch_argv(lc, i, port, &argv);
    int errp[2];
    if (pipe2(errp, O_CLOEXEC) != 0) {
        args_free(&argv);
        return td_error_errno(TD_ERR_SYS, "pipe");
    }
    /* Detached, the workers' output is in the rank logs already; only the launcher's stderr
     * goes on to supervisor.log. The launcher's group dies with us (a kill -9 of the supervisor
     * must not leave the launcher and its workers training as orphans): SIGTERM, so it stops
     * its workers at a step boundary with a checkpoint. */
    td_spawn_opts so;
    td_spawn_opts_init(&so);
    so.argv = argv.v;
    so.cwd = lc->job->work_dir;
    so.out_fd = lc->job->quiet_output ? TD_SPAWN_DEVNULL : TD_SPAWN_INHERIT;
    so.err_fd = errp[1];
    so.death_signal = SIGTERM;
    const char *fd_var = td_var_name(TD_VAR_TANDEM_STORE_LISTEN_FD);
    if (i == 0 && listen_fd >= 0) {
        char fdtext[16];
        snprintf(fdtext, sizeof fdtext, "%d", listen_fd);
        env_set(lc, fd_var, fdtext);
        so.keep_fds = &listen_fd;
        so.nkeep = 1;
    }
    so.envp = lc->env;
    td_status st = td_spawn(&so, &lc->nodes[i].pid);
    if (i == 0 && listen_fd >= 0) env_set(lc, fd_var, NULL);
    close(errp[1]);
    fcntl(errp[0], F_SETFL, fcntl(errp[0], F_GETFL) | O_NONBLOCK);
    lc->nodes[i].err_fd = errp[0];
    args_free(&argv);
    if (st != TD_OK) lc->nodes[i].pid = 0;
    return st;
}

/* One `tandem launch` per node, watched on the supervisor's loop. Several nodes meet at node
 * 0's store on a loopback port with a random token: tandem starts these nodes itself, so it
 * hands the secret over; we bind the port and node 0 inherits the socket, so it cannot be taken
 * in between. On failure the launchers started so far are killed. */
static td_status local_start(td__carrier *c, td__sup *sup, bool resume) {
    local_carrier *lc = (local_carrier *)c;
    (void)resume; /* the job's environment says it (TANDEM_RESUME); the launchers restart */
    lc->sup = sup;
    lc->failed = -1;
    lc->stopping = false;
    td_loop *l = td__sup_loop(sup);
    int port = 0, listen_fd = -1;
    for (int i = 0; i < lc->n; i++) {
        free(lc->nodes[i].seg);
        lc->nodes[i] = (launcher){.err_fd = -1};
    }
    if (lc->n > 1) {
        char token[33];
        TD_CHECK(td_listen_tcp("127.0.0.1", 0, 512, &listen_fd, &port));
        td_status st = td_random_hex(token, 16);
        if (st != TD_OK) {
            close(listen_fd);
            return st;
        }
        env_set(lc, td_var_name(TD_VAR_TANDEM_TOKEN), token);
    }
    /* Each launcher writes its end record in RUN/end; one of an earlier attempt must go. */
    td_status st = td_exec_end_records_reset(lc->job->run, lc->n);
    for (int i = 0; st == TD_OK && i < lc->n; i++) {
        st = spawn_launcher(lc, i, port, i == 0 ? listen_fd : -1);
        if (i == 0 && listen_fd >= 0) close(listen_fd); /* node 0 has it now */
        if (i == 0) listen_fd = -1;
        if (st == TD_OK && lc->nodes[i].err_fd >= 0)
            st = td_loop_watch(l, lc->nodes[i].err_fd, TD_LOOP_READ, on_stderr, lc);
        if (st == TD_OK) st = td_loop_watch_child(l, lc->nodes[i].pid, on_exit_, lc);
        if (st == TD_OK) lc->alive++;
    }
    if (listen_fd >= 0) close(listen_fd);
    if (st != TD_OK) {
        for (int i = 0; i < lc->n; i++)
            if (lc->nodes[i].err_fd >= 0) td_loop_unwatch(l, lc->nodes[i].err_fd);
        kill_started(lc);
        lc->alive = 0;
        return st;
    }
    const td_run *run = lc->job->run;
    td__sup_say(sup, "run %s: %d node%s x %d worker%s started; logs in %s/logs", run->id, lc->n,
                lc->n > 1 ? "s" : "", run->nproc_per_node, run->nproc_per_node > 1 ? "s" : "",
                run->run_dir);
    td__sup_running_now(sup);
    return TD_OK;
}

static void local_stop(td__carrier *c, bool hard) {
    local_carrier *lc = (local_carrier *)c;
    lc->stopping = true;
    for (int i = 0; i < lc->n; i++) {
        if (lc->nodes[i].done || lc->nodes[i].pid <= 0) continue;
        if (hard)
            td_kill_tree(lc->nodes[i].pid, SIGKILL);
        else
            kill(lc->nodes[i].pid, SIGTERM);
    }
}

/* CPU, memory and GPU use of each launcher's process tree, and the restarts it reports. */
static void local_sample(td__carrier *c) {
    local_carrier *lc = (local_carrier *)c;
    int most = -1;
    for (int i = 0; i < lc->n; i++) {
        if (lc->nodes[i].done || lc->nodes[i].pid <= 0) continue;
        int r = -1;
        if (td_sysmon_sample(lc->mon, lc->job->store, lc->job->run, lc->nodes[i].pid, &r) !=
            TD_OK) {
            TD_LOG_DEBUG("system metrics: %s", td_error_msg());
            td_error_clear();
        }
        most = TD_MAX(most, r);
    }
    if (most > 0) td__sup_restarts_seen(lc->sup, most);
}

static void local_before_say(td__carrier *c) {
    local_carrier *lc = (local_carrier *)c;
    if (lc->term.bar_open) {
        fflush(lc->job->out);
        term_clear_bar(&lc->term);
    }
}

static const td__carrier_ops local_ops = {
    .name = "local",
    .start = local_start,
    .stop = local_stop,
    .sample = local_sample,
    .before_say = local_before_say,
};

static int local_run(const td_exec_job *job) {
    local_carrier lc = {.base = {&local_ops}, .job = job, .n = job->run->nodes, .failed = -1};
    for (char *const *e = job->env; e && *e; e++) {
        lc.env = td_xrealloc(lc.env, (lc.nenv + 2) * sizeof *lc.env);
        lc.env[lc.nenv++] = td_xstrdup(*e);
        lc.env[lc.nenv] = NULL;
    }
    /* The secrets: in the launchers' environment, which their workers inherit (exec.h). */
    for (char *const *e = job->secrets; e && *e; e++) {
        char *name = td_xasprintf("%.*s", (int)strcspn(*e, "="), *e);
        env_set(&lc, name, strchr(*e, '=') + 1);
        free(name);
    }
    lc.term.tty = job->term_tty;
    lc.nodes = td_xcalloc((size_t)lc.n, sizeof *lc.nodes);
    for (int i = 0; i < lc.n; i++) lc.nodes[i].err_fd = -1;
    lc.mon = td_sysmon_new();
    int cli = td__supervise(job, &lc.base, 0, KILL_AFTER_S, NULL, td_now_s());
    for (int i = 0; i < lc.n; i++) {
        if (lc.nodes[i].err_fd >= 0) close(lc.nodes[i].err_fd);
        free(lc.nodes[i].seg);
    }
    if (lc.alive > 0) kill_started(&lc); /* never left running unwatched */
    free(lc.nodes);
    td_sysmon_free(lc.mon);
    for (size_t i = 0; i < lc.nenv; i++) free(lc.env[i]);
    free(lc.env);
    return cli;
}

/* No cancel_orphan or describe: the launchers die with their supervisor (their death signal),
 * so nothing is left to cancel, and td_executor_of_run never answers local (it leaves no mark in
 * the run directory). */
const td_executor td_executor_local = {
    .name = "local",
    .run = local_run,
};
