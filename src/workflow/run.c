/* The local executor behind `tandem run`: creates (or resumes) a run, prepares its working
 * directory, runs the setup commands, starts `tandem launch` as a child process, and supervises
 * it: metrics ingest, system metrics, stop requests, max_duration, and the final record (status,
 * exit code, artifacts, logs).
 *
 * The launcher is a separate process found through /proc/self/exe, so this layer depends on
 * launch's command-line contract only. It runs in its own process group: a Ctrl-C at the
 * terminal reaches the supervisor alone, which turns it into one SIGTERM for the launcher (the
 * trainer checkpoints on SIGTERM), instead of every process receiving it at once. Signals are
 * read from a signalfd (core's td_sigwatch) watched on the supervision's event loop (core's
 * loop.h), beside the launchers' stderr pipes and exits; nothing runs in a signal handler. */
#include "tandem/workflow.h"

#include <dirent.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tandem/loop.h"
#include "tandem/os.h"

extern char **environ;

#define INGEST_PERIOD_S     0.5
#define SYSMON_PERIOD_S     2.0
#define LAUNCH_STOP_GRACE_S 30.0 /* passed to launch; we escalate some time after it */
#define KILL_AFTER_S        (LAUNCH_STOP_GRACE_S + 15.0)

/* ---- string vectors and environments ---- */
typedef struct {
    char **v;
    size_t n, cap;
} strvec;

static void sv_push(strvec *s, char *owned) {
    if (s->n + 2 > s->cap) {
        s->cap = s->cap ? 2 * s->cap : 32;
        s->v = td_xrealloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n++] = owned;
    s->v[s->n] = NULL;
}

static void sv_free(strvec *s) {
    for (size_t i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
    memset(s, 0, sizeof *s);
}

static void env_unset(strvec *env, const char *key) {
    size_t klen = strlen(key);
    for (size_t i = 0; i < env->n; i++)
        if (!strncmp(env->v[i], key, klen) && env->v[i][klen] == '=') {
            free(env->v[i]);
            env->v[i] = env->v[--env->n];
            env->v[env->n] = NULL;
            return;
        }
}

static void env_set(strvec *env, const char *key, const char *value) {
    env_unset(env, key);
    sv_push(env, td_xasprintf("%s=%s", key, value));
}

static char *param_env_name(const char *key) {
    char *name = td_xasprintf("TANDEM_PARAM_%s", key);
    for (char *p = name + 13; *p; p++) *p = isalnum((unsigned char)*p) ? (char)toupper(*p) : '_';
    return name;
}

/* ---- signals: read from a signalfd by the loop that acts on them ---- */
static const int watched_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};

static int is_stop_signal(int sig) {
    return sig == SIGINT || sig == SIGTERM || sig == SIGHUP;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Links each entry of the workflow's directory into the run's own working directory, so that
 * inputs (code, data, configs) resolve there as they would in the project, except what the
 * workflow declares as outputs (the first component of each artifact pattern and of a relative
 * checkpoint_dir) and .tandem: those start empty in every run. Two concurrent runs of one
 * workflow then never share an output path (issue 8: one run recorded the other's weights as its
 * artifact). Entries already there (a resumed run) are kept. */
static int is_output_name(const td_workflow *w, const char *name) {
    char first[NAME_MAX + 1];
    for (size_t i = 0; i <= w->nartifacts; i++) {
        const char *pat = i < w->nartifacts ? w->artifacts[i] : w->checkpoint_dir;
        if (!pat || pat[0] == '/') continue;
        while (pat[0] == '.' && pat[1] == '/') pat += 2;
        size_t len = strcspn(pat, "/");
        if (len == 0 || len > NAME_MAX) continue;
        memcpy(first, pat, len);
        first[len] = '\0';
        if (fnmatch(first, name, FNM_PERIOD) == 0) return 1;
    }
    return 0;
}

static td_status prepare_work_dir(const td_workflow *w, const char *project_dir,
                                  const char *work_dir) {
    TD_CHECK(td_mkdirs(work_dir));
    DIR *d = opendir(project_dir);
    if (!d)
        return td_error_errno(TD_ERR_IO, "cannot read the workflow's directory %s (workdir)",
                              project_dir);
    td_status st = TD_OK;
    struct dirent *e;
    while ((e = readdir(d)) && st == TD_OK) {
        const char *n = e->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, ".tandem") || is_output_name(w, n))
            continue;
        char *from = td_xasprintf("%s/%s", project_dir, n);
        char *to = td_xasprintf("%s/%s", work_dir, n);
        struct stat lst;
        if (lstat(to, &lst) != 0 && symlink(from, to) != 0)
            st = td_error_errno(TD_ERR_IO, "cannot link %s into the run's directory as %s", from,
                                to);
        free(from);
        free(to);
    }
    closedir(d);
    return st;
}

/* What is on the terminal's current line: a worker's progress bar that the launcher passed on
 * ending with '\r' (the cursor is back at column 0 and the next redraw overwrites it). Any
 * other line written over it first clears it, so no tail of the bar is left behind. */
typedef struct {
    int tty;             /* our stderr is a terminal */
    int bar_open;        /* the current line holds a bar */
    char bar_prefix[32]; /* "[rank 0] ": the bar's own lines may overwrite it as they are */
} term_state;

static void write_err(const char *buf, size_t n) {
    while (n > 0) {
        ssize_t w = write(2, buf, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return; /* nobody reads our stderr: keep supervising anyway */
        buf += w;
        n -= (size_t)w;
    }
}

static void term_clear_bar(term_state *t) {
    if (t->bar_open && t->tty) write_err("\033[K", 3);
    t->bar_open = 0;
}

/* ---- the supervisor ---- */
typedef struct {
    td_rundb *store;
    td_run run;
    const td_workflow *w;
    const char *script;
    const char *params_json; /* for TANDEM_PARAM_* on resume */
    int resuming;
    int base_restarts;
    const char *tandem_bin;
    char *project_dir; /* the workflow's directory (workdir:), whose entries are linked */
    char *work_dir;    /* the run's own working directory: <run_dir>/work */
    td_sigwatch *sigs; /* stop signals and SIGCHLD, read in the loop */
    int nsignals;      /* stop signals received so far */
    int last_signal;
    FILE *out;        /* progress lines */
    int quiet_output; /* detached: nothing to a terminal */
    term_state term;  /* what the launcher's stderr left on our terminal */
} supervisor;

static void progress(supervisor *s, const char *fmt, ...) TD_PRINTF(2, 3);
static void progress(supervisor *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (s->term.bar_open) {
        fflush(s->out);
        term_clear_bar(&s->term);
    }
    fputs("tandem: ", s->out);
    vfprintf(s->out, fmt, ap);
    fputc('\n', s->out);
    fflush(s->out);
    va_end(ap);
}

/* Reads every pending signal before the launchers run (during the setup): stop signals are
 * counted; the first ends the setup, and the supervision's stop decisions (td_exec_stop) take
 * the last one as their first. */
static void read_signals(supervisor *s) {
    for (int sig; (sig = td_sigwatch_next(s->sigs));)
        if (is_stop_signal(sig)) {
            s->nsignals++;
            s->last_signal = sig;
        }
}

static void set_var(strvec *env, td_var v, const char *value) {
    env_set(env, td_var_name(v), value);
}

static td_status build_env(supervisor *s, strvec *env) {
    for (char **e = environ; e && *e; e++) sv_push(env, td_xstrdup(*e));
    /* The workers' output reaches the terminal through pipes (launcher, then us), so a program
     * cannot see that someone is watching: TANDEM_PROGRESS=1 says so (`tandem train` draws its
     * bar on rank 0). The workflow's env may still override it. */
    if (s->term.tty && !td_var_get(TD_VAR_TANDEM_PROGRESS))
        set_var(env, TD_VAR_TANDEM_PROGRESS, "1");
    const td_workflow *w = s->w;
    for (size_t i = 0; i < w->nenv; i++) env_set(env, w->env[i].key, w->env[i].value);
    if (s->resuming) {
        json_t *obj = json_loads(s->params_json ? s->params_json : "{}", 0, NULL);
        const char *k;
        json_t *v;
        if (obj && json_is_object(obj)) json_object_foreach(obj, k, v) {
                char *name = param_env_name(k);
                char *text = json_is_string(v) ? td_xstrdup(json_string_value(v))
                                               : json_dumps(v, JSON_ENCODE_ANY);
                env_set(env, name, text ? text : "");
                free(text);
                free(name);
            }
        json_decref(obj);
    } else {
        for (size_t i = 0; i < w->nparams; i++) {
            char *name = param_env_name(w->params[i].key);
            env_set(env, name, w->params[i].value);
            free(name);
        }
    }
    /* `tandem` in a workflow command means this tandem, installed or not. */
    const char *slash = strrchr(s->tandem_bin, '/');
    if (slash) {
        const char *path = getenv("PATH");
        char *p = td_xasprintf("%.*s:%s", (int)(slash - s->tandem_bin), s->tandem_bin,
                               path && *path ? path : "/usr/local/bin:/usr/bin:/bin");
        env_set(env, "PATH", p);
        free(p);
    }
    set_var(env, TD_VAR_TANDEM_RUN_ID, s->run.id);
    set_var(env, TD_VAR_TANDEM_RUN_DIR, s->run.run_dir);
    set_var(env, TD_VAR_TANDEM_WORK_DIR, s->work_dir);
    set_var(env, TD_VAR_TANDEM_PROJECT_DIR, s->project_dir);
    char *ckpt;
    if (!w->checkpoint_dir)
        ckpt = td_xasprintf("%s/checkpoints", s->run.run_dir);
    else if (w->checkpoint_dir[0] == '/')
        ckpt = td_xstrdup(w->checkpoint_dir);
    else
        ckpt = td_xasprintf("%s/%s", s->work_dir, w->checkpoint_dir);
    td_status st = td_check_output_dir(ckpt, "checkpoint_dir");
    set_var(env, TD_VAR_TANDEM_CHECKPOINT_DIR, ckpt);
    free(ckpt);
    if (s->resuming)
        set_var(env, TD_VAR_TANDEM_RESUME, "1");
    else
        env_unset(env, td_var_name(TD_VAR_TANDEM_RESUME));
    env_unset(env, td_var_name(TD_VAR_TANDEM_METRICS)); /* launch sets one file per rank */
    return st;
}

/* A setup command's output, to setup.log and (attached) to us, until it closes its end; a stop
 * signal meanwhile sends it SIGTERM, once. */
typedef struct {
    supervisor *s;
    pid_t pid;
    int log_fd;
    bool signalled;
} setup_ctx;

static void on_setup_output(td_loop *l, int fd, unsigned events, void *user) {
    (void)events;
    setup_ctx *c = user;
    char buf[8192];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
        td_loop_stop(l);
        return;
    }
    ssize_t w = write(c->log_fd, buf, (size_t)n);
    (void)w;
    if (!c->s->quiet_output) {
        fwrite(buf, 1, (size_t)n, c->s->out);
        fflush(c->s->out);
    }
}

static void on_setup_signal(td_loop *l, int fd, unsigned events, void *user) {
    (void)l, (void)fd, (void)events;
    setup_ctx *c = user;
    read_signals(c->s);
    if (c->s->nsignals && !c->signalled) {
        kill(-c->pid, SIGTERM);
        c->signalled = true;
    }
}

/* Runs each setup command with `sh -c`, output to logs/setup.log and (attached) the terminal.
 * *failed_code is set to the exit code of the first command that fails. */
static td_status run_setup(supervisor *s, char *const *envp, int *failed_code) {
    *failed_code = 0;
    if (!s->w->nsetup) return TD_OK;
    char *log_path = td_xasprintf("%s/logs/setup.log", s->run.run_dir);
    int log_fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    td_status st = TD_OK;
    if (log_fd < 0) {
        st = td_error_errno(TD_ERR_IO, "cannot open %s", log_path);
        free(log_path);
        return st;
    }
    for (size_t i = 0; i < s->w->nsetup && st == TD_OK && !*failed_code; i++) {
        read_signals(s);
        if (s->nsignals) {
            *failed_code = 130;
            break;
        }
        progress(s, "setup: %s", s->w->setup[i]);
        int p[2];
        if (pipe2(p, O_CLOEXEC) != 0) {
            st = td_error_errno(TD_ERR_SYS, "pipe");
            break;
        }
        char *argv[] = {"/bin/sh", "-c", s->w->setup[i], NULL};
        td_spawn_opts so;
        td_spawn_opts_init(&so);
        so.argv = argv;
        so.envp = envp;
        so.cwd = s->work_dir;
        so.out_fd = so.err_fd = p[1];
        so.death_signal = SIGTERM;
        pid_t pid;
        st = td_spawn(&so, &pid);
        close(p[1]);
        if (st != TD_OK) {
            close(p[0]);
            break;
        }
        setup_ctx sc = {.s = s, .pid = pid, .log_fd = log_fd};
        td_loop *l = NULL;
        st = td_loop_new(&l);
        if (st == TD_OK) st = td_loop_watch(l, p[0], TD_LOOP_READ, on_setup_output, &sc);
        if (st == TD_OK) st = td_loop_watch(l, s->sigs->fd, TD_LOOP_READ, on_setup_signal, &sc);
        if (st == TD_OK) st = td_loop_run(l);
        if (st != TD_OK) kill(-pid, SIGKILL); /* not watched: not left running either */
        td_loop_free(l);
        close(p[0]);
        int status = 0;
        td_waitpid(pid, &status, 0);
        int code = td_wait_exit_code(status);
        if (code != 0) {
            *failed_code = code;
            progress(s, "setup command failed with exit code %d: %s", code, s->w->setup[i]);
        }
    }
    close(log_fd);
    free(log_path);
    return st;
}

typedef struct {
    pid_t pid;
    int done;
    int code;
    int err_fd; /* read end of the launcher's stderr, -1 once closed */
    char *seg;  /* the segment (up to '\n' or '\r') being assembled */
    size_t seg_len, seg_cap;
} agent_proc;

/* One complete segment of the launcher's stderr, with its terminator. */
static void term_write(term_state *t, const char *seg, size_t len) {
    int redraw = len > 0 && seg[len - 1] == '\r';
    size_t plen = strlen(t->bar_prefix);
    int same_source = t->bar_open && plen > 0 && len >= plen && !memcmp(seg, t->bar_prefix, plen);
    if (t->bar_open && !same_source) term_clear_bar(t);
    write_err(seg, len);
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

/* Copies what the launcher wrote to stderr through to ours, segment by segment (the launcher
 * writes whole lines, and progress-bar redraws ending in '\r', in one write each). Nothing is
 * parsed from it: how the launcher ended comes back in its end record (endrec.h). */
static void pump_stderr(agent_proc *a, term_state *t) {
    if (a->err_fd < 0) return;
    char buf[8192];
    int eof = 0;
    while (!eof) {
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

static void launch_argv(supervisor *s, int node_rank, int port, strvec *argv) {
    const td_workflow *w = s->w;
    sv_push(argv, td_xstrdup(s->tandem_bin));
    sv_push(argv, td_xstrdup("launch"));
    sv_push(argv, td_xasprintf("--nnodes=%d", s->run.nodes));
    sv_push(argv, td_xasprintf("--nproc-per-node=%d", s->run.nproc_per_node));
    if (s->run.nodes == 1) {
        sv_push(argv, td_xstrdup("--standalone"));
    } else {
        sv_push(argv, td_xasprintf("--node-rank=%d", node_rank));
        sv_push(argv, td_xasprintf("--rdzv-endpoint=127.0.0.1:%d", port));
    }
    sv_push(argv, td_xasprintf("--rdzv-id=%s", s->run.id));
    sv_push(argv, td_xasprintf("--max-restarts=%d", w->max_restarts));
    sv_push(argv, td_xasprintf("--stop-grace=%g", LAUNCH_STOP_GRACE_S));
    sv_push(argv, td_xasprintf("--log-dir=%s/logs", s->run.run_dir));
    sv_push(argv, td_xasprintf("--metrics-dir=%s/metrics", s->run.run_dir));
    char *end = td_exec_end_record_path(&s->run, node_rank);
    sv_push(argv, td_xasprintf("--end-record=%s", end));
    free(end);
    sv_push(argv, td_xstrdup("--"));
    sv_push(argv, td_xstrdup("/bin/sh"));
    sv_push(argv, td_xstrdup("-c"));
    /* dash does not exec the last command, so the worker launch watches is this shell. On a
     * stop the launcher signals the worker's process group: without a trap the shell would die
     * of SIGTERM at once (a failure to the launcher) while the program is still saving its
     * checkpoint. With `trap : TERM` the shell waits for the program and exits with its status
     * (143 after a checkpoint); the program itself gets the default SIGTERM disposition. */
    sv_push(argv, td_xasprintf("trap : TERM\n%s", s->script));
}

/* A workflow for another executor (executor: slurm): after the setup it gets what was
 * prepared here (run, work dir, environment, signals) and runs the job to its end and record. */
static int run_on_executor(supervisor *s, strvec *env) {
    td_exec_job job = {
        .store = s->store,
        .run = &s->run,
        .work_dir = s->work_dir,
        .script = s->script,
        .tandem_bin = s->tandem_bin,
        .env = env->v,
        .max_restarts = s->w->max_restarts,
        .max_duration_s = s->w->max_duration_s,
        .artifacts = (const char *const *)s->w->artifacts,
        .nartifacts = s->w->nartifacts,
        .resuming = s->resuming,
        .base_restarts = s->base_restarts,
        .slurm = &s->w->slurm,
        .ssh = &s->w->ssh,
        .project_dir = s->project_dir,
        .sigs = s->sigs,
        .stop_signal = s->nsignals ? s->last_signal : 0,
        .out = s->out,
        .quiet_output = s->quiet_output,
    };
    return td_executor_find(s->w->executor)->run(&job);
}

/* ---- the local launchers' attempt, on the event loop ----
 * Descriptors: the signalfd (stop requests) and each launcher's stderr. Children: the launchers.
 * Timers: the metrics ingest and the system-metrics sample (periodic), max_duration and the
 * kill deadline of a stop (one-shot). The loop ends when every launcher has exited. */
typedef struct {
    supervisor *s;
    agent_proc *agents;
    int nagents, alive;
    td_ingester *ing;
    td_sysmon *mon;
    double t0;
    td_exec_stop stop; /* the stop decisions (exec.h), shared with the other carriers */
    int killed;
    uint64_t kill_timer; /* the kill deadline, once a stop began */
    int restarts;        /* as the system-metrics sample last saw them */
    char *note;          /* the run's note, from the stop's cause */
    size_t note_size;
} local_sup;

static void signal_launchers(local_sup *ls, int sig) {
    for (int i = 0; i < ls->nagents; i++)
        if (!ls->agents[i].done) kill(ls->agents[i].pid, sig);
}

static void kill_launchers(td_loop *l, void *user) {
    (void)l;
    local_sup *ls = user;
    if (ls->killed) return;
    ls->killed = 1;
    progress(ls->s, "run %s: killing what is left of it", ls->s->run.id);
    for (int i = 0; i < ls->nagents; i++)
        if (!ls->agents[i].done) td_kill_tree(ls->agents[i].pid, SIGKILL);
}

/* A stop begins: SIGTERM to every launcher (they checkpoint), SIGKILL after KILL_AFTER_S. */
static void begin_stop(td_loop *l, local_sup *ls) {
    signal_launchers(ls, SIGTERM);
    ls->kill_timer = td_loop_timer(l, KILL_AFTER_S, 0, kill_launchers, ls);
}

/* tandem stop recorded its request (a SIGTERM without one is a preemption). */
static bool stop_asked(void *user) {
    supervisor *s = user;
    return td_exec_stop_requested(s->store, s->run.id);
}

/* What the shared stop decisions (td_exec_stop) ask of this carrier. */
static void stop_step(td_loop *l, local_sup *ls, td_exec_stop_step step) {
    supervisor *s = ls->s;
    switch (step) {
    case TD_EXEC_STOP_NONE:
        return;
    case TD_EXEC_STOP_SOFT:
        if (!ls->stop.preempt)
            snprintf(ls->note, ls->note_size, "%s%s", ls->stop.last_signal ? "stopped by " : "",
                     ls->stop.stopped_by);
        if (ls->stop.last_signal)
            progress(s,
                     "%s run %s (asking the workers to checkpoint and exit; " TD_STOP_ESCALATE_HINT
                     " kills them now)",
                     ls->stop.preempt ? "SIGTERM: preempting" : "stopping", s->run.id);
        else
            progress(s, "run %s: %s; stopping it", s->run.id, ls->stop.stopped_by);
        begin_stop(l, ls);
        return;
    case TD_EXEC_STOP_AGAIN:
        if (!ls->killed)
            progress(s,
                     "run %s: SIG%s again %.1f s into the stop, taken as the same request; "
                     "still waiting for the workers' checkpoint (" TD_STOP_ESCALATE_HINT
                     " kills them now)",
                     s->run.id, sigabbrev_np(ls->stop.last_signal),
                     td_now_s() - ls->stop.signals.began_s);
        return;
    case TD_EXEC_STOP_HARD:
        td_loop_cancel(l, ls->kill_timer);
        ls->kill_timer = td_loop_timer(l, 0, 0, kill_launchers, ls);
        return;
    }
}

static void on_signal_fd(td_loop *l, int fd, unsigned events, void *user) {
    (void)fd, (void)events;
    local_sup *ls = user;
    for (int sig; (sig = td_sigwatch_next(ls->s->sigs));)
        stop_step(l, ls, td_exec_stop_signal(&ls->stop, sig, td_now_s(), stop_asked, ls->s));
}

static void on_max_duration(td_loop *l, void *user) {
    local_sup *ls = user;
    stop_step(l, ls, td_exec_stop_max_duration(&ls->stop, ls->s->w->max_duration_s, td_now_s()));
}

static void on_launcher_stderr(td_loop *l, int fd, unsigned events, void *user) {
    (void)events;
    local_sup *ls = user;
    for (int i = 0; i < ls->nagents; i++) {
        if (ls->agents[i].err_fd != fd) continue;
        td_loop_unwatch(l, fd); /* watched again below unless the pump reached its end */
        pump_stderr(&ls->agents[i], &ls->s->term);
        if (ls->agents[i].err_fd >= 0) td_loop_watch(l, fd, TD_LOOP_READ, on_launcher_stderr, ls);
        return;
    }
}

static void on_launcher_exit(td_loop *l, pid_t pid, int status, void *user) {
    local_sup *ls = user;
    for (int i = 0; i < ls->nagents; i++)
        if (ls->agents[i].pid == pid && !ls->agents[i].done) {
            ls->agents[i].done = 1;
            ls->agents[i].code = td_wait_exit_code(status);
            ls->alive--;
        }
    if (ls->alive == 0) td_loop_stop(l);
}

static void on_ingest(td_loop *l, void *user) {
    (void)l;
    local_sup *ls = user;
    /* A full disk is said once, by the ingester itself; it retries from its offset. */
    td_status ist = td_ingester_poll(ls->ing, NULL);
    if (ist != TD_OK && ist != TD_ERR_NOSPACE)
        TD_LOG_WARN("metrics ingest: %s (will retry)", td_error_msg());
    td_error_clear();
}

/* CPU, memory and GPU use of each launcher's process tree, and the restarts it reports. */
static void on_sysmon(td_loop *l, void *user) {
    (void)l;
    local_sup *ls = user;
    supervisor *s = ls->s;
    for (int i = 0; i < ls->nagents; i++) {
        if (ls->agents[i].done) continue;
        int r = -1;
        if (td_sysmon_sample(ls->mon, s->store, &s->run, ls->agents[i].pid, &r) != TD_OK) {
            TD_LOG_DEBUG("system metrics: %s", td_error_msg());
            td_error_clear();
        }
        if (r >= 0 && s->base_restarts + r > ls->restarts) {
            ls->restarts = s->base_restarts + r;
            if (td_run_set_restarts(s->store, s->run.id, ls->restarts) != TD_OK) td_error_clear();
        }
    }
}

static td_status watch_launchers(local_sup *ls) {
    supervisor *s = ls->s;
    td_loop *l = NULL;
    td_status st = td_loop_new(&l);
    if (st == TD_OK) st = td_loop_watch(l, s->sigs->fd, TD_LOOP_READ, on_signal_fd, ls);
    for (int i = 0; st == TD_OK && i < ls->nagents; i++) {
        if (ls->agents[i].err_fd >= 0)
            st = td_loop_watch(l, ls->agents[i].err_fd, TD_LOOP_READ, on_launcher_stderr, ls);
        if (st == TD_OK) st = td_loop_watch_child(l, ls->agents[i].pid, on_launcher_exit, ls);
    }
    if (st != TD_OK) {
        /* Cannot supervise: end the launchers rather than leave them unwatched. */
        for (int i = 0; i < ls->nagents; i++) td_kill_tree(ls->agents[i].pid, SIGKILL);
        for (int i = 0; i < ls->nagents; i++) td_waitpid(ls->agents[i].pid, NULL, 0);
        td_loop_free(l);
        return st;
    }
    td_loop_timer(l, 0, INGEST_PERIOD_S, on_ingest, ls);
    td_loop_timer(l, 0.5, SYSMON_PERIOD_S, on_sysmon, ls);
    if (s->w->max_duration_s > 0)
        td_loop_timer(l, s->w->max_duration_s - (td_now_s() - ls->t0), 0, on_max_duration, ls);
    if (s->nsignals) /* a stop that came after the setup, before the loop */
        stop_step(l, ls, td_exec_stop_signal(&ls->stop, s->last_signal, td_now_s(), stop_asked, s));
    while (!td_loop_stopped(l))
        if ((st = td_loop_turn(l, -1)) != TD_OK) {
            /* epoll itself failed: say so and keep supervising rather than spin */
            TD_LOG_WARN("event loop: %s", td_error_msg());
            td_error_clear();
            sleep_s(0.01);
        }
    td_loop_free(l);
    return TD_OK;
}

/* Starts one `tandem launch` per node (node i's stderr on agents[i].err_fd). Several nodes on
 * this host meet at node 0's store on a loopback port with a random token: tandem starts these
 * nodes itself, so it hands the secret over; we bind the port and node 0 inherits the socket, so
 * it cannot be taken in between. On failure the launchers started so far are killed. */
static td_status start_launchers(supervisor *s, strvec *env, agent_proc *agents, int nagents) {
    int port = 0, listen_fd = -1;
    for (int i = 0; i < nagents; i++) agents[i].err_fd = -1;
    if (nagents > 1) {
        char token[33];
        TD_CHECK(td_listen_tcp("127.0.0.1", 0, 512, &listen_fd, &port));
        td_status st = td_random_hex(token, 16);
        if (st != TD_OK) {
            close(listen_fd);
            return st;
        }
        set_var(env, TD_VAR_TANDEM_TOKEN, token);
    }
    /* Each launcher writes its end record in RUN/end; one of an earlier attempt must go. */
    td_status st = td_exec_end_records_reset(&s->run, nagents);
    for (int i = 0; st == TD_OK && i < nagents; i++) {
        strvec argv = {0};
        launch_argv(s, i, port, &argv);
        int errp[2];
        if (pipe2(errp, O_CLOEXEC) != 0) {
            st = td_error_errno(TD_ERR_SYS, "pipe");
            sv_free(&argv);
            break;
        }
        /* Detached, the workers' output is in the rank logs already; only the launcher's
         * stderr goes on to supervisor.log. The launcher's group dies with us (issue 8: a kill
         * -9 of the supervisor left the launcher and its workers training as orphans): SIGTERM,
         * so it stops its workers at a step boundary with a checkpoint. */
        td_spawn_opts so;
        td_spawn_opts_init(&so);
        so.argv = argv.v;
        so.envp = env->v;
        so.cwd = s->work_dir;
        so.out_fd = s->quiet_output ? TD_SPAWN_DEVNULL : TD_SPAWN_INHERIT;
        so.err_fd = errp[1];
        so.death_signal = SIGTERM;
        if (i == 0 && listen_fd >= 0) {
            char fdtext[16];
            snprintf(fdtext, sizeof fdtext, "%d", listen_fd);
            set_var(env, TD_VAR_TANDEM_STORE_LISTEN_FD, fdtext);
            so.envp = env->v;
            so.keep_fds = &listen_fd;
            so.nkeep = 1;
        }
        st = td_spawn(&so, &agents[i].pid);
        if (i == 0 && listen_fd >= 0) {
            env_unset(env, td_var_name(TD_VAR_TANDEM_STORE_LISTEN_FD));
            close(listen_fd); /* node 0 has it now */
            listen_fd = -1;
        }
        close(errp[1]);
        fcntl(errp[0], F_SETFL, fcntl(errp[0], F_GETFL) | O_NONBLOCK);
        agents[i].err_fd = errp[0];
        sv_free(&argv);
        if (st != TD_OK) agents[i].pid = 0;
    }
    if (listen_fd >= 0) close(listen_fd);
    if (st != TD_OK) {
        for (int j = 0; j < nagents; j++)
            if (agents[j].pid > 0) td_kill_tree(agents[j].pid, SIGKILL);
        for (int j = 0; j < nagents; j++)
            if (agents[j].pid > 0) td_waitpid(agents[j].pid, NULL, 0);
        return st;
    }
    progress(s, "run %s: %d node%s x %d worker%s started; logs in %s/logs", s->run.id, nagents,
             nagents > 1 ? "s" : "", s->run.nproc_per_node, s->run.nproc_per_node > 1 ? "s" : "",
             s->run.run_dir);
    return TD_OK;
}

/* After the launchers exited: the rest of their stderr, their end records, the restarts they
 * made, the last metrics. Returns the launchers' exit code: the first non-zero (node 0 first). */
static int finish_launchers(local_sup *ls, td_exec_end_summary *ends) {
    supervisor *s = ls->s;
    int launch_code = 0;
    for (int i = 0; i < ls->nagents; i++)
        if (ls->agents[i].code != 0) {
            launch_code = ls->agents[i].code;
            break;
        }
    int *codes = td_xcalloc((size_t)ls->nagents, sizeof *codes);
    for (int i = 0; i < ls->nagents; i++) {
        agent_proc *a = &ls->agents[i];
        codes[i] = a->code;
        if (a->err_fd >= 0) {
            fcntl(a->err_fd, F_SETFL, fcntl(a->err_fd, F_GETFL) & ~O_NONBLOCK);
            pump_stderr(a, &s->term); /* to EOF: the launcher has exited */
        }
    }
    td_exec_end_records_read(&s->run, ls->nagents, codes, ends);
    free(codes);
    if (s->base_restarts + ends->restarts > ls->restarts &&
        td_run_set_restarts(s->store, s->run.id, s->base_restarts + ends->restarts) != TD_OK)
        td_error_clear();
    td_status ist = td_ingester_poll(ls->ing, NULL);
    if (ist != TD_OK && ist != TD_ERR_NOSPACE)
        TD_LOG_WARN("final metrics ingest: %s", td_error_msg());
    td_error_clear();
    if (td_ingester_malformed(ls->ing))
        progress(s, "%zu malformed metrics line%s skipped", td_ingester_malformed(ls->ing),
                 td_ingester_malformed(ls->ing) > 1 ? "s" : "");
    return launch_code;
}

/* How the run ended, from the stop (if any), the launchers' exit code and their end records:
 * the run's status, its note (in note) and tandem run's exit code (*cli_code). *launch_code
 * becomes the failing worker's own exit code where the records give it. */
static td_run_status run_outcome(const supervisor *s, int stop_requested, int preempt_signal,
                                 int *launch_code, const td_exec_end_summary *ends, char *note,
                                 size_t nbytes, int *cli_code) {
    if (stop_requested) {
        *cli_code = *launch_code == 143 ? 143 : 1;
        return TD_RUN_STOPPED;
    }
    if (*launch_code == 0) {
        *cli_code = 0;
        return TD_RUN_SUCCEEDED;
    }
    if (*launch_code == 143) {
        *cli_code = 143;
        snprintf(note, nbytes,
                 "preempted: the workers checkpointed and exited 143; "
                 "continue with tandem run --resume %s",
                 s->run.id);
        return TD_RUN_PREEMPTED;
    }
    *cli_code = 1;
    if (*launch_code == 130) {
        snprintf(note, nbytes, "the launcher was interrupted (SIGINT)");
        return TD_RUN_STOPPED;
    }
    if (ends->cause[0]) {
        snprintf(note, nbytes, "%s", ends->cause);
        /* The job's exit code is the failing worker's, as its launcher's record gives it. */
        if (*launch_code == 1 && ends->worker_code > 0) *launch_code = ends->worker_code;
    } else if (!note[0]) {
        snprintf(note, nbytes, "exit code %d; see tandem logs %s", *launch_code, s->run.id);
    }
    if (preempt_signal) {
        char tmp[512];
        snprintf(tmp, sizeof tmp,
                 "received SIGTERM but the workers did not all checkpoint and exit 143: %.400s",
                 note);
        snprintf(note, nbytes, "%s", tmp);
    }
    return TD_RUN_FAILED;
}

/* The run's end in the store: artifacts, log files, status, exit code and note; then the line
 * that says so. TD_ERR_NOSPACE is said here (the job's outcome stands; the disk is full). */
static td_status record_run(supervisor *s, td_run_status final, int launch_code, char *note,
                            size_t nbytes, double t0) {
    if (s->w->nartifacts) {
        size_t copied = 0;
        if (td_artifacts_collect(s->store, &s->run, s->work_dir,
                                 (const char *const *)s->w->artifacts, s->w->nartifacts,
                                 &copied) != TD_OK) {
            TD_LOG_WARN("artifacts: %s", td_error_msg());
            td_error_clear();
        } else if (copied) {
            progress(s, "%zu artifact file%s stored", copied, copied > 1 ? "s" : "");
        }
    }
    td_log_file *logs = NULL;
    size_t nlogs = 0;
    if (td_logs_scan(s->store, &s->run, &logs, &nlogs) == TD_OK)
        td_log_files_free(logs, nlogs);
    else
        td_error_clear();
    td_status st =
        td_run_set_status(s->store, s->run.id, final, launch_code, note[0] ? note : NULL);
    if (st == TD_ERR_NOSPACE) {
        /* The store freed its reserve and still could not write: the job's outcome stands (it
         * is not a supervisor failure); the message names the disk. */
        td_error_print(st);
        progress(s, "run %s %s after %.1f s (exit code %d), but its record could not be written",
                 s->run.id, td_run_status_str(final), td_now_s() - t0, launch_code);
        return TD_OK;
    }
    TD_CHECK(st);
    /* The stored note: the store adds to it what it met (a full disk). */
    td_run cur = {0};
    if (td_run_find(s->store, s->run.id, &cur) == TD_OK && cur.note && *cur.note)
        snprintf(note, nbytes, "%s", cur.note);
    td_run_clear(&cur);
    td_error_clear();
    progress(s, "run %s %s after %.1f s (exit code %d)%s%s", s->run.id, td_run_status_str(final),
             td_now_s() - t0, launch_code, note[0] ? ": " : "", note);
    return TD_OK;
}

/* Runs setup and the launchers, supervises them to the end and records the outcome (another
 * executor's run goes to exec after the setup). Returns the CLI exit code. */
static int supervise(supervisor *s) {
    td_status st;
    strvec env = {0};
    agent_proc *agents = NULL;
    td_ingester *ing = NULL;
    td_sysmon *mon = NULL;
    int nagents = 0, launch_code = -1, stop_requested = 0, preempt_signal = 0, cli_code = 1;
    char note[1100] = "";
    td_exec_end_summary ends = {.worker_code = -1};
    double t0 = td_now_s();

    st = td_run_set_supervisor(s->store, s->run.id, (int64_t)getpid());
    /* Another executor's run is pending until its scheduler starts it. */
    if (st == TD_OK && !s->w->executor)
        st = td_run_set_status(s->store, s->run.id, TD_RUN_RUNNING, -1, NULL);
    if (st == TD_OK) st = prepare_work_dir(s->w, s->project_dir, s->work_dir);
    if (st == TD_OK) st = build_env(s, &env);
    int setup_code = 0;
    if (st == TD_OK) st = run_setup(s, env.v, &setup_code);
    if (st != TD_OK) goto fail;
    if (setup_code) {
        stop_requested = s->nsignals > 0;
        if (stop_requested)
            snprintf(note, sizeof note, "stopped during setup");
        else
            snprintf(note, sizeof note, "setup command failed with exit code %d", setup_code);
        launch_code = setup_code;
        goto record;
    }
    if (s->w->executor) {
        cli_code = run_on_executor(s, &env);
        goto out;
    }

    char *metrics_dir = td_xasprintf("%s/metrics", s->run.run_dir);
    st = td_ingester_new(s->store, s->run.id, metrics_dir, &ing);
    free(metrics_dir);
    if (st != TD_OK) goto fail;
    mon = td_sysmon_new();
    nagents = s->run.nodes;
    agents = td_xcalloc((size_t)nagents, sizeof *agents);
    st = start_launchers(s, &env, agents, nagents);
    if (st != TD_OK) goto fail;

    /* The launchers' attempt, on one event loop (core's loop.h): watch_launchers. */
    local_sup ls = {.s = s,
                    .agents = agents,
                    .nagents = nagents,
                    .alive = nagents,
                    .ing = ing,
                    .mon = mon,
                    .restarts = s->base_restarts,
                    .t0 = t0,
                    .note = note,
                    .note_size = sizeof note};
    st = watch_launchers(&ls);
    if (st != TD_OK) goto fail;
    stop_requested = ls.stop.active && !ls.stop.preempt;
    preempt_signal = ls.stop.preempt;
    launch_code = finish_launchers(&ls, &ends);

record:;
    td_run_status final = run_outcome(s, stop_requested, preempt_signal, &launch_code, &ends, note,
                                      sizeof note, &cli_code);
    st = record_run(s, final, launch_code, note, sizeof note, t0);
    if (st == TD_OK) goto out;
fail:
    /* The supervisor itself could not go on: say why in the run, then in the output. */
    {
        char *why = td_xasprintf("supervisor error: %s", td_error_msg());
        td_error_print(st);
        if (td_run_set_status(s->store, s->run.id, TD_RUN_FAILED, launch_code, why) != TD_OK)
            td_error_clear();
        free(why);
        cli_code = 1;
    }
out:
    td_ingester_free(ing);
    td_sysmon_free(mon);
    for (int i = 0; agents && i < nagents; i++)
        if (agents[i].err_fd >= 0) close(agents[i].err_fd);
    for (int i = 0; agents && i < nagents; i++) free(agents[i].seg);
    free(agents);
    sv_free(&env);
    return cli_code;
}

static char *self_exe(void) {
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return td_xstrdup("tandem");
    buf[n] = '\0';
    return td_xstrdup(buf);
}

/* A workflow standing in for one that is gone from the file: the stored command only. */
static td_workflow *workflow_from_run(const td_run *r) {
    td_workflow *w = td_xcalloc(1, sizeof *w);
    w->name = td_xstrdup(r->workflow);
    w->commands = td_xcalloc(1, sizeof *w->commands);
    w->commands[0] = td_xstrdup(r->command ? r->command : "true");
    w->ncommands = 1;
    w->nodes = r->nodes;
    w->nproc_per_node = r->nproc_per_node;
    return w;
}

/* The run's lock: an exclusive flock on <run_dir>/lock, taken before the run is touched and
 * inherited (no close-on-exec) by the supervisor, the launcher and every worker, so it is held
 * exactly while any process of the run's group lives. A second group (a resume, or a run
 * started on the same directory) is refused while it is. */
static td_status lock_run(const td_run *run, int *fd_out) {
    *fd_out = -1;
    char *path = td_xasprintf("%s/lock", run->run_dir);
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    td_status st = TD_OK;
    if (fd < 0) {
        st = td_error_errno(TD_ERR_IO, "cannot open the lock of run %s (%s)", run->id, path);
    } else if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        st = errno == EWOULDBLOCK
                 ? td_error(TD_ERR_EXISTS,
                            "run %s is in use: processes of its group (supervisor, launcher or "
                            "workers) are still alive and hold %s; wait for them or stop them "
                            "(tandem stop %s) before starting another group on it",
                            run->id, path, run->id)
                 : td_error_errno(TD_ERR_IO, "cannot lock run %s (%s)", run->id, path);
        close(fd);
        fd = -1;
    }
    free(path);
    *fd_out = fd;
    return st;
}

td_status td_workflow_run(const td_workflow *w, const td_run_options *opts, char **run_id_out,
                          int *exit_code) {
    td_status st = TD_OK;
    td_rundb *store = NULL;
    supervisor s;
    memset(&s, 0, sizeof s);
    char *script = NULL, *params_json = NULL;
    td_workflow *synth = NULL;
    *exit_code = 1;
    if (run_id_out) *run_id_out = NULL;
    TD_CHECK(td_rundb_open(opts->project_dir, &store));

    int lock_fd = -1;
    if (opts->resume_run) {
        TD_CHECK_GOTO(td_run_find(store, opts->resume_run, &s.run), st, out);
        TD_CHECK_GOTO(lock_run(&s.run, &lock_fd), st, out);
        TD_CHECK_GOTO(td_run_reap_stale(store, &s.run), st, out);
        if (!td_run_status_is_final(s.run.status) || s.run.status == TD_RUN_SUCCEEDED) {
            st = td_error(TD_ERR_INVALID,
                          "run %s is %s; only preempted, stopped or failed runs can be resumed%s",
                          s.run.id, td_run_status_str(s.run.status),
                          s.run.status == TD_RUN_SUCCEEDED ? "" : " (tandem stop it first)");
            goto out;
        }
        if (!w) w = synth = workflow_from_run(&s.run);
        script = td_xstrdup(s.run.command ? s.run.command : "true");
        params_json = td_xstrdup(s.run.params_json ? s.run.params_json : "{}");
        s.resuming = 1;
        s.base_restarts = s.run.restarts + 1;
        TD_CHECK_GOTO(td_run_set_restarts(store, s.run.id, s.base_restarts), st, out);
        TD_CHECK_GOTO(td_run_request_stop(store, s.run.id, 0), st, out);
        TD_CHECK_GOTO(td_run_set_status(store, s.run.id, TD_RUN_RESUMED, -1,
                                        "resumed with tandem run --resume"),
                      st, out);
        s.run.restarts = s.base_restarts;
    } else {
        if (!w) {
            st = td_error(TD_ERR_USAGE, "no workflow given");
            goto out;
        }
        TD_CHECK_GOTO(td_workflow_script(w, &script), st, out);
        params_json = td_workflow_params_json(w);
        td_run_spec spec = {w->name, script, params_json, w->nodes, w->nproc_per_node};
        TD_CHECK_GOTO(td_run_create(store, &spec, &s.run), st, out);
        TD_CHECK_GOTO(lock_run(&s.run, &lock_fd), st, out);
    }
    s.w = w;
    s.script = script;
    s.params_json = params_json;
    s.tandem_bin = opts->tandem_bin ? td_xstrdup(opts->tandem_bin) : self_exe();
    s.out = opts->out ? opts->out : stdout;
    /* another executor's workers draw no progress bar: their output reaches no terminal */
    s.term.tty = !opts->detach && isatty(STDERR_FILENO) && !w->executor;
    if (w->workdir && w->workdir[0] == '/')
        s.project_dir = td_xstrdup(w->workdir);
    else if (w->workdir)
        s.project_dir = td_xasprintf("%s/%s", td_rundb_project_dir(store), w->workdir);
    else
        s.project_dir = td_xstrdup(td_rundb_project_dir(store));
    s.work_dir = td_xasprintf("%s/work", s.run.run_dir);
    if (run_id_out) *run_id_out = td_xstrdup(s.run.id);

    td_sigwatch sigs = {.fd = -1};
    s.sigs = &sigs;
    if (!opts->detach) {
        TD_CHECK_GOTO(td_sigwatch_open(&sigs, watched_signals, (int)TD_ARRAY_LEN(watched_signals)),
                      st, out);
        s.store = store;
        *exit_code = supervise(&s);
        td_sigwatch_close(&sigs);
        goto out;
    }

    /* Detached: double fork so the supervisor is nobody's child and leads its own session.
     * Stop signals are blocked from here on and read from its signalfd once it runs, so a
     * `tandem stop` issued right after `tandem run -d` returns is never lost. */
    int ready[2];
    if (pipe2(ready, O_CLOEXEC) != 0) {
        st = td_error_errno(TD_ERR_SYS, "pipe");
        goto out;
    }
    sigset_t block, old;
    sigemptyset(&block);
    for (size_t i = 0; i < TD_ARRAY_LEN(watched_signals); i++)
        sigaddset(&block, watched_signals[i]);
    sigprocmask(SIG_BLOCK, &block, &old);
    char *run_dir = td_xstrdup(s.run.run_dir);
    td_rundb_close(store); /* an SQLite connection must not cross fork() */
    store = NULL;
    fflush(NULL);
    pid_t mid = fork();
    if (mid < 0) {
        st = td_error_errno(TD_ERR_SYS, "fork");
        sigprocmask(SIG_SETMASK, &old, NULL);
        close(ready[0]);
        close(ready[1]);
        free(run_dir);
        goto out;
    }
    if (mid == 0) {
        /* Forked children below end with _exit: they are process images of the CLI that must
         * not return into its main(). */
        setsid();
        pid_t sup = fork();
        if (sup != 0) _exit(sup < 0 ? 1 : 0);
        close(ready[0]);
        char *log_path = td_xasprintf("%s/logs/supervisor.log", run_dir);
        int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        int devnull = open("/dev/null", O_RDWR);
        if (devnull >= 0) dup2(devnull, 0);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        free(log_path);
        FILE *out = fdopen(dup(1), "w");
        s.out = out ? out : stdout;
        s.quiet_output = 1;
        int code = 1;
        if (td_sigwatch_open(&sigs, watched_signals, (int)TD_ARRAY_LEN(watched_signals)) == TD_OK &&
            td_rundb_open(opts->project_dir, &s.store) == TD_OK &&
            td_run_set_supervisor(s.store, s.run.id, (int64_t)getpid()) == TD_OK) {
            ssize_t wr = write(ready[1], "k", 1);
            (void)wr;
            close(ready[1]);
            code = supervise(&s);
        } else {
            td_error_print(TD_ERR_IO);
            close(ready[1]);
        }
        td_rundb_close(s.store);
        fflush(NULL);
        _exit(code);
    }
    close(ready[1]);
    int status = 0;
    while (waitpid(mid, &status, 0) < 0 && errno == EINTR) {
    }
    char byte = 0;
    ssize_t n;
    while ((n = read(ready[0], &byte, 1)) < 0 && errno == EINTR) {
    }
    close(ready[0]);
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (n != 1)
        st = td_error(TD_ERR_SYS,
                      "the background supervisor of run %s did not start; see "
                      "%s/logs/supervisor.log",
                      s.run.id, run_dir);
    else
        *exit_code = 0;
    free(run_dir);
out:
    if (lock_fd >= 0) close(lock_fd); /* the group's own copies keep holding it */
    if (st != TD_OK && run_id_out) {
        free(*run_id_out);
        *run_id_out = NULL;
    }
    td_rundb_close(store);
    td_run_clear(&s.run);
    td_workflow_free(synth);
    free((char *)s.tandem_bin);
    free(s.work_dir);
    free(s.project_dir);
    free(script);
    free(params_json);
    return st;
}

td_status td_run_stop(td_rundb *store, const char *run_id, double wait_s, td_run *final_out) {
    td_run r;
    TD_CHECK(td_run_find(store, run_id, &r));
    td_status st = td_run_reap_stale(store, &r);
    if (st != TD_OK) goto out;
    if (td_run_status_is_final(r.status)) {
        st = td_error(TD_ERR_INVALID, "run %s already ended (%s)", r.id,
                      td_run_status_str(r.status));
        goto out;
    }
    st = td_run_request_stop(store, r.id, 1);
    if (st == TD_ERR_NOSPACE) {
        /* The request could not be recorded; the signal still reaches the supervisor (it will
         * take the stop for a preemption, since it cannot read the request). */
        TD_LOG_WARN("%s; stopping run %s anyway", td_error_msg(), r.id);
        td_error_clear();
        st = TD_OK;
    }
    if (st != TD_OK) goto out;
    if (r.supervisor_pid <= 0 || td_run_signal_supervisor(&r, SIGTERM) != 0) {
        /* Nobody to ask (a pending run whose supervisor never started): record it directly. */
        st = td_run_set_status(store, r.id, TD_RUN_STOPPED, -2, "stopped before it started");
        if (st == TD_OK) {
            td_run_clear(&r);
            st = td_run_find(store, run_id, &r);
        }
        goto out;
    }
    double deadline = td_now_s() + wait_s;
    while (td_now_s() < deadline) {
        td_run cur;
        st = td_run_find(store, r.id, &cur);
        if (st != TD_OK) goto out;
        if (td_run_status_is_final(cur.status)) {
            td_run_clear(&r);
            r = cur;
            break;
        }
        td_run_clear(&cur);
        sleep_s(0.1);
    }
out:
    if (st == TD_OK && final_out)
        *final_out = r;
    else
        td_run_clear(&r);
    return st;
}
