/* `tandem run`: creates (or resumes) a run, prepares its working directory, computes the
 * workers' environment, runs the setup commands, and hands the job to its executor (exec.h:
 * local, ssh or Slurm), whose supervisor runs it to its end and records it.
 *
 * The supervisor runs in its own process group: a Ctrl-C at the terminal reaches it alone,
 * which turns it into one SIGTERM for the launchers (the trainer checkpoints on SIGTERM),
 * instead of every process receiving it at once. Signals are read from a signalfd (core's
 * td_sigwatch), during the setup here and then on the supervisor's event loop; nothing runs in a
 * signal handler. */
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

#include "tandem/cloud.h"
#include "tandem/loop.h"
#include "tandem/os.h"

extern char **environ;

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

/* Copies each entry of the workflow's directory into the run's own working directory (never a
 * link: issue 30), so that inputs (code, data, configs) resolve there as they would in the
 * project and outputs never reach it, except what the
 * workflow declares as outputs (the first component of each artifact pattern and of a relative
 * checkpoint_dir) and .tandem: those start empty in every run. Two concurrent runs of one
 * workflow then never share an output path (issue 8: one run recorded the other's weights as its
 * artifact). Entries already there (a resumed run) are kept. */
static int is_output_name(const td_workflow *w, const char *name) {
    char first[NAME_MAX + 1];
    for (size_t i = 0; i <= w->nartifacts; i++) {
        const char *pat = i < w->nartifacts ? w->artifacts[i] : w->checkpoint_dir;
        if (!pat || pat[0] == '/' || !strncmp(pat, "s3://", 5)) continue;
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
    td_exec_copy_stats cs = {0};
    char *linked = NULL; /* the names linked, for one line at the end */
    while ((e = readdir(d)) && st == TD_OK) {
        const char *n = e->d_name;
        /* .git stays out as from the code sent to other nodes (td__exec_code_tar_script) */
        if (!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, ".tandem") || !strcmp(n, ".git") ||
            is_output_name(w, n))
            continue;
        char *from = td_xasprintf("%s/%s", project_dir, n);
        char *to = td_xasprintf("%s/%s", work_dir, n);
        struct stat lst;
        int64_t bytes = 0, files = 0;
        /* copied, not linked: a write to a name the project has must not reach the project
         * (issue 30; src/exec/workdir.c); except an entry too large to copy for every run,
         * linked as before, and said so */
        if (lstat(to, &lst) == 0) {
        } else if (!td_exec_work_copyable(from, &bytes, &files)) {
            if (symlink(from, to) != 0)
                st = td_error_errno(TD_ERR_IO, "cannot link %s into the run's directory as %s",
                                    from, to);
            else {
                char *more = td_xasprintf("%s%s%s", linked ? linked : "", linked ? ", " : "", n);
                free(linked);
                linked = more;
            }
        } else if (td_exec_work_copy(from, to, &cs) != TD_OK) {
            st = td_error(TD_ERR_IO, "cannot copy %s into the run's directory as %s: %s", from,
                          to, td_error_msg());
        }
        free(from);
        free(to);
    }
    closedir(d);
    if (linked)
        TD_LOG_INFO("linked into the run's work directory, not copied (each over %lld MiB or %d "
                    "files): %s; a write under them reaches the project (docs/executors.md, "
                    "\"The run's working directory\")",
                    (long long)(TD_EXEC_WORK_COPY_MAX_BYTES >> 20), TD_EXEC_WORK_COPY_MAX_FILES,
                    linked);
    free(linked);
    return st;
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
    FILE *out;               /* progress lines */
    int quiet_output;        /* detached: nothing to a terminal */
    int tty;                 /* our stderr is a terminal: the workers may draw progress bars */
    td_exec_secrets secrets; /* values for the workers' environment only (exec.h) */
    td_exec_controller *controller; /* on a detached aws run's controller: its store's push */
} supervisor;

static void progress(supervisor *s, const char *fmt, ...) TD_PRINTF(2, 3);
static void progress(supervisor *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
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
    if (s->tty && !td_var_get(TD_VAR_TANDEM_PROGRESS)) set_var(env, TD_VAR_TANDEM_PROGRESS, "1");
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
    /* PATH: the workflow's env: PATH when it has one, with $PATH (or ${PATH}) in it standing
     * for ours; and `tandem` in a workflow command means this tandem, installed or not: its
     * directory first. */
    const char *path = getenv("PATH"), *wpath = NULL;
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    for (size_t i = 0; i < w->nenv; i++)
        if (!strcmp(w->env[i].key, "PATH")) wpath = w->env[i].value;
    char *p = td_xstrdup(wpath ? wpath : path);
    for (const char *const *form = (const char *const[]){"${PATH}", "$PATH", NULL}; *form;
         form++)
        for (char *at; wpath && (at = strstr(p, *form));) {
            char *q = td_xasprintf("%.*s%s%s", (int)(at - p), p, path, at + strlen(*form));
            free(p);
            p = q;
            if (strlen(p) > 65536) break; /* a PATH naming itself twice: enough */
        }
    const char *slash = strrchr(s->tandem_bin, '/');
    if (slash) {
        char *q = td_xasprintf("%.*s:%s", (int)(slash - s->tandem_bin), s->tandem_bin, p);
        free(p);
        p = q;
    }
    env_set(env, "PATH", p);
    free(p);
    set_var(env, TD_VAR_TANDEM_RUN_ID, s->run.id);
    set_var(env, TD_VAR_TANDEM_RUN_DIR, s->run.run_dir);
    set_var(env, TD_VAR_TANDEM_WORK_DIR, s->work_dir);
    set_var(env, TD_VAR_TANDEM_PROJECT_DIR, s->project_dir);
    char *ckpt;
    /* checkpoint_dir: s3://B/P: the workers write RUN/checkpoints as usual, and node 0's agent
     * mirrors it to s3://B/P/RUN_ID (src/launch/ckpt_s3.c), which a resume reads back. */
    int s3 = w->checkpoint_dir && !strncmp(w->checkpoint_dir, "s3://", 5);
    if (s3) {
        size_t n = strlen(w->checkpoint_dir);
        while (n > 5 && w->checkpoint_dir[n - 1] == '/') n--;
        char *url = td_xasprintf("%.*s/%s", (int)n, w->checkpoint_dir, s->run.id);
        set_var(env, TD_VAR_TANDEM_CHECKPOINT_URL, url);
        free(url);
    } else {
        env_unset(env, td_var_name(TD_VAR_TANDEM_CHECKPOINT_URL));
    }
    if (!w->checkpoint_dir || s3)
        ckpt = td_run_path(s->run.run_dir, TD_RUN_PATH_CHECKPOINTS);
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
    char *log_path = td_run_path(s->run.run_dir, TD_RUN_PATH_SETUP_LOG);
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

/* The job as an executor (exec.h) takes it: what was prepared here (run, work dir, environment,
 * signals). */
static td_exec_job job_of(const supervisor *s, char *const *env, char *const *env_named) {
    return (td_exec_job){
        .store = s->store,
        .run = &s->run,
        .work_dir = s->work_dir,
        .script = s->script,
        .tandem_bin = s->tandem_bin,
        .env = env,
        .env_named = env_named,
        .max_restarts = s->w->max_restarts,
        .max_duration_s = s->w->max_duration_s,
        .artifacts = (const char *const *)s->w->artifacts,
        .nartifacts = s->w->nartifacts,
        .artifacts_to = s->w->artifacts_to,
        .node_setup = (const char *const *)s->w->node_setup,
        .nnode_setup = s->w->nnode_setup,
        .resuming = s->resuming,
        .base_restarts = s->base_restarts,
        .slurm = &s->w->slurm,
        .ssh = &s->w->ssh,
        .aws = &s->w->aws,
        .project_dir = s->project_dir,
        .sigs = s->sigs,
        .stop_signal = s->nsignals ? s->last_signal : 0,
        .out = s->out,
        .quiet_output = s->quiet_output,
        .term_tty = s->tty,
        .secrets = s->secrets.v,
        .on_loop = s->controller ? td_exec_controller_on_loop : NULL,
        .on_loop_user = s->controller,
    };
}

/* Runs the setup, then hands the job to its executor (exec: local, ssh or Slurm), which
 * supervises it to its end and records the outcome. Returns the CLI exit code. */
static int supervise(supervisor *s) {
    strvec env = {0};
    int cli_code = 1, setup_code = 0;
    double t0 = td_now_s();
    td_status st = td_run_set_supervisor(s->store, s->run.id, (int64_t)getpid());
    /* Another executor's run is pending until its scheduler starts it. */
    if (st == TD_OK && !s->w->executor)
        st = td_run_set_status(s->store, s->run.id, TD_RUN_RUNNING, -1, NULL);
    if (st == TD_OK) st = prepare_work_dir(s->w, s->project_dir, s->work_dir);
    if (st == TD_OK) st = build_env(s, &env);
    if (st == TD_OK) st = run_setup(s, env.v, &setup_code);
    strvec named = {0}; /* the workflow's env: names, which a remote node gets whatever ours */
    for (size_t i = 0; i < s->w->nenv; i++) sv_push(&named, td_xstrdup(s->w->env[i].key));
    td_exec_job job = job_of(s, env.v, named.v);
    if (st != TD_OK) {
        /* The supervisor itself could not go on: say why in the run, then in the output. */
        char *why = td_xasprintf("supervisor error: %s", td_error_msg());
        td_error_print(st);
        if (td_run_set_status(s->store, s->run.id, TD_RUN_FAILED, -1, why) != TD_OK)
            td_error_clear();
        free(why);
    } else if (setup_code && s->nsignals) {
        cli_code =
            td_exec_end_before_job(&job, TD_RUN_STOPPED, setup_code, "stopped during setup", t0);
    } else if (setup_code) {
        char note[96];
        snprintf(note, sizeof note, "setup command failed with exit code %d", setup_code);
        cli_code = td_exec_end_before_job(&job, TD_RUN_FAILED, setup_code, note, t0);
    } else {
        const td_executor *ex =
            s->w->executor ? td_executor_find(s->w->executor) : &td_executor_local;
        cli_code = ex->run(&job);
    }
    sv_free(&env);
    sv_free(&named);
    return cli_code;
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
    char *path = td_run_path(run->run_dir, TD_RUN_PATH_LOCK);
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

/* tandem run --resume: the run found, locked, checked resumable, and marked resumed; its own
 * command and parameters come back (and its workflow, when none was given: *synth). */
static td_status resume_run(td_rundb *store, const char *id, supervisor *s, const td_workflow **w,
                            td_workflow **synth, int *lock_fd, int in_cloud) {
    TD_CHECK(td_run_find(store, id, &s->run));
    TD_CHECK(lock_run(&s->run, lock_fd));
    TD_CHECK(td_run_reap_stale(store, &s->run));
    /* a run that lived in the cloud: how its last life ended is in its store, not here yet */
    if (td_run_is_remote(&s->run) && td_exec_remote_refresh(store, &s->run) != TD_OK) {
        if (in_cloud) return td_error(TD_ERR_PEER, "%s", td_error_msg());
        TD_LOG_WARN("%s; resuming it from what this machine has", td_error_msg());
        td_error_clear();
    }
    if (!td_run_status_is_final(s->run.status) || s->run.status == TD_RUN_SUCCEEDED)
        return td_error(TD_ERR_INVALID,
                        "run %s is %s; only preempted, stopped or failed runs can be resumed%s",
                        s->run.id, td_run_status_str(s->run.status),
                        s->run.status == TD_RUN_SUCCEEDED ? "" : " (tandem stop it first)");
    /* a run that lived in the cloud (tandem run -d of an aws run), resumed attached: its
     * supervisor is this process from now on, no longer its controller (resumed with -d: a new
     * controller's, whose handoff rewrites remote.json) */
    if (td_run_is_remote(&s->run) && !in_cloud) {
        char *remote = td_run_path(s->run.run_dir, TD_RUN_PATH_REMOTE);
        char *etags = td_xasprintf("%s/.remote-etags", s->run.run_dir);
        unlink(remote);
        unlink(etags);
        free(remote);
        free(etags);
    }
    /* resumed in the cloud, a run that lived here: the new controller takes its last life from
     * the store, so it goes there first, as it ended (before it is marked resumed below) */
    if (in_cloud && !td_run_is_remote(&s->run)) {
        char *url = NULL;
        TD_CHECK(td_exec_remote_store_url((*w)->checkpoint_dir, s->run.id, &url));
        td_status st = td_exec_remote_seed(&(*w)->aws, url, &s->run);
        free(url);
        TD_CHECK(st);
    }
    if (!*w) *w = *synth = workflow_from_run(&s->run);
    s->script = td_xstrdup(s->run.command ? s->run.command : "true");
    s->params_json = td_xstrdup(s->run.params_json ? s->run.params_json : "{}");
    s->resuming = 1;
    s->base_restarts = s->run.restarts + 1;
    TD_CHECK(td_run_set_restarts(store, s->run.id, s->base_restarts));
    TD_CHECK(td_run_request_stop(store, s->run.id, 0));
    TD_CHECK(td_run_set_status(store, s->run.id, TD_RUN_RESUMED, -1,
                               "resumed with tandem run --resume"));
    s->run.restarts = s->base_restarts;
    return TD_OK;
}

/* A new run of the workflow: created and locked. */
static td_status create_run(td_rundb *store, const td_workflow *w, const td_run_options *opts,
                            supervisor *s, int *lock_fd) {
    if (!w) return td_error(TD_ERR_USAGE, "no workflow given");
    if (w->nproc_per_node < 1)
        return td_error(TD_ERR_USAGE,
                        "workflow '%s': nproc_per_node: %s is not counted yet (tandem run counts "
                        "it with td_launch_nproc_resolve where the workers run)",
                        w->name, w->nproc_spec[0] ? w->nproc_spec : "0");
    char *script = NULL;
    TD_CHECK(td_workflow_script(w, &script));
    s->script = script;
    s->params_json = td_workflow_params_json(w);
    td_run_spec spec = {.workflow = w->name,
                        .command = s->script,
                        .params_json = s->params_json,
                        .nodes = w->nodes,
                        .nproc_per_node = w->nproc_per_node,
                        .tags = opts->tags,
                        .group = opts->group,
                        .notes = opts->notes};
    /* the controller of a detached aws run: the submitter's number, so both say one id */
    const char *dash = opts->controller_of ? strrchr(opts->controller_of, '-') : NULL;
    if (dash) spec.min_n = strtoll(dash + 1, NULL, 10);
    TD_CHECK(td_run_create(store, &spec, &s->run));
    if (opts->controller_of && strcmp(s->run.id, opts->controller_of))
        return td_error(TD_ERR_EXISTS,
                        "--controller-of %s: this project made run %s instead (it has runs of "
                        "workflow '%s' numbered past it); the controller's project must be fresh",
                        opts->controller_of, s->run.id, w->name);
    return lock_run(&s->run, lock_fd);
}

/* The background supervisor (tandem run -d), in the grandchild: its output to
 * logs/supervisor.log, its own store connection, its pid recorded; then it tells the parent it
 * runs (a byte on ready_fd) and supervises. Never returns. */
static void detached_supervisor(supervisor *s, const td_run_options *opts, const char *run_dir,
                                int ready_fd) {
    char *log_path = td_run_path(run_dir, TD_RUN_PATH_SUPERVISOR_LOG);
    int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) dup2(devnull, 0);
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
    }
    free(log_path);
    FILE *out = fdopen(dup(1), "w");
    s->out = out ? out : stdout;
    s->quiet_output = 1;
    int code = 1;
    if (td_sigwatch_open(s->sigs, watched_signals, (int)TD_ARRAY_LEN(watched_signals)) == TD_OK &&
        td_rundb_open(opts->project_dir, &s->store) == TD_OK &&
        td_run_set_supervisor(s->store, s->run.id, (int64_t)getpid()) == TD_OK) {
        ssize_t wr = write(ready_fd, "k", 1);
        (void)wr;
        close(ready_fd);
        /* on the controller of a detached aws run: the store kept in S3 as the run goes (a
         * timer on the supervisor's loop, through the job's on_loop), the last state after */
        if (opts->controller_store &&
            td_exec_controller_start(&s->run, td_rundb_project_dir(s->store), &s->w->aws,
                                     opts->controller_store, &s->controller) != TD_OK) {
            td_error_print(TD_ERR_IO);
            td_error_clear();
        }
        code = supervise(s);
        td_exec_controller_finish(s->controller);
        s->controller = NULL;
    } else {
        td_error_print(TD_ERR_IO);
        close(ready_fd);
    }
    td_rundb_close(s->store);
    fflush(NULL);
    _exit(code);
}

/* Detached: double fork so the supervisor is nobody's child and leads its own session. Stop
 * signals are blocked from here on and read from its signalfd once it runs, so a `tandem stop`
 * issued right after `tandem run -d` returns is never lost. *store is closed here (an SQLite
 * connection must not cross fork()). */
static td_status run_detached(supervisor *s, const td_run_options *opts, td_rundb **store,
                              int *exit_code) {
    int ready[2];
    if (pipe2(ready, O_CLOEXEC) != 0) return td_error_errno(TD_ERR_SYS, "pipe");
    sigset_t block, old;
    sigemptyset(&block);
    for (size_t i = 0; i < TD_ARRAY_LEN(watched_signals); i++)
        sigaddset(&block, watched_signals[i]);
    sigprocmask(SIG_BLOCK, &block, &old);
    char *run_dir = td_xstrdup(s->run.run_dir);
    td_rundb_close(*store);
    *store = NULL;
    fflush(NULL);
    pid_t mid = fork();
    if (mid < 0) {
        td_status st = td_error_errno(TD_ERR_SYS, "fork");
        sigprocmask(SIG_SETMASK, &old, NULL);
        close(ready[0]);
        close(ready[1]);
        free(run_dir);
        return st;
    }
    if (mid == 0) {
        /* Forked children end with _exit: they are process images of the CLI that must not
         * return into its main(). */
        setsid();
        pid_t sup = fork();
        if (sup != 0) _exit(sup < 0 ? 1 : 0);
        close(ready[0]);
        detached_supervisor(s, opts, run_dir, ready[1]);
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
    td_status st = TD_OK;
    if (n != 1)
        st = td_error(TD_ERR_SYS,
                      "the background supervisor of run %s did not start; see "
                      "%s/logs/supervisor.log",
                      s->run.id, run_dir);
    else
        *exit_code = 0;
    free(run_dir);
    return st;
}

/* tandem run -d of an aws run: handed to a controller in the cloud (exec.h,
 * td_exec_controller_handoff), which runs the same workflow as this run; nothing of it stays
 * here. What the controller needs of this machine goes with it: the workflow file, the code
 * (RUN/work, prepared as for any run), the parameters, and in a private file the AWS
 * credentials as found here, the workflow's secrets and the switch's shutdown command. */
static td_status run_in_cloud(supervisor *s) {
    const td_workflow *w = s->w;
    if (!w->file)
        return td_error(TD_ERR_USAGE,
                        "tandem run -d of an aws run ships its workflow file to the controller: "
                        "write the workflow in a file (tandem run -f FILE NAME)");
    char *url = NULL;
    TD_CHECK(td_exec_remote_store_url(w->checkpoint_dir, s->run.id, &url));
    td_status st = prepare_work_dir(w, s->project_dir, s->work_dir);
    strvec params = {0}, fwd = {0};
    for (size_t i = 0; i < w->nparams; i++)
        sv_push(&params, td_xasprintf("%s=%s", w->params[i].key, w->params[i].value));
    td_exec_secrets creds = {0};
    td_exec_secrets_add_aws(&creds);
    td_aws_creds found = {0};
    const char *role = w->aws.controller_profile ? w->aws.controller_profile
                                                 : w->aws.iam_instance_profile;
    if (!role && td_aws_creds_load(w->aws.profile, &found) == TD_OK) {
        if (td_exec_secrets_set(&creds, "AWS_ACCESS_KEY_ID", found.access_key_id) != TD_OK ||
            td_exec_secrets_set(&creds, "AWS_SECRET_ACCESS_KEY", found.secret_access_key) !=
                TD_OK ||
            (found.session_token &&
             td_exec_secrets_set(&creds, "AWS_SESSION_TOKEN", found.session_token) != TD_OK))
            td_error_clear();
    } else {
        td_error_clear(); /* the controller's own role (aws.iam_instance_profile) */
    }
    td_aws_creds_free(&found);
    for (size_t i = 0; i < creds.count; i++) {
        /* with a role of its own, the controller keeps no keys of ours */
        if (role && (!strncmp(creds.v[i], "AWS_ACCESS_KEY_ID=", 18) ||
                     !strncmp(creds.v[i], "AWS_SECRET", 10) ||
                     !strncmp(creds.v[i], "AWS_SESSION", 11)))
            continue;
        sv_push(&fwd, td_xstrdup(creds.v[i]));
    }
    td_exec_secrets_free(&creds);
    for (size_t i = 0; i < s->secrets.count; i++) sv_push(&fwd, td_xstrdup(s->secrets.v[i]));
    const char *shutdown = getenv("TANDEM_SHUTDOWN_CMD");
    if (shutdown && *shutdown) sv_push(&fwd, td_xasprintf("TANDEM_SHUTDOWN_CMD=%s", shutdown));
    /* stdout is the run's id alone (tandem run -d prints it there); the handoff's progress
     * lines go to stderr */
    if (s->out == stdout) s->out = stderr;
    if (st == TD_OK) {
        td_exec_job job = job_of(s, environ, NULL);
        td_exec_handoff h = {.workflow_file = w->file,
                             .workflow_name = w->name,
                             .params = params.v,
                             .store_url = url,
                             .forward_env = fwd.v,
                             .resume = s->resuming};
        st = td_exec_controller_handoff(&job, &h);
    }
    if (st != TD_OK) {
        char *why = td_xasprintf("%s", td_error_msg());
        if (td_run_set_status(s->store, s->run.id, TD_RUN_FAILED, -1, why) != TD_OK)
            td_error_clear();
        st = td_error(st, "%s", why);
        free(why);
    }
    for (size_t i = 0; i < fwd.n; i++) /* secrets: wiped before they are freed */
        memset(fwd.v[i], 0, strlen(fwd.v[i]));
    sv_free(&fwd);
    sv_free(&params);
    free(url);
    return st;
}

td_status td_workflow_secrets(const td_workflow *w, td_exec_secrets *out) {
    memset(out, 0, sizeof *out);
    td_status st = TD_OK;
    for (size_t i = 0; w && i < w->nsecrets && st == TD_OK; i++) {
        const char *v = getenv(w->secrets[i]);
        if (!v)
            st = td_error(TD_ERR_INVALID,
                          "%s%sworkflow '%s': secret %s is not set in tandem run's environment: "
                          "export it, or remove it from secrets:",
                          w->file ? w->file : "", w->file ? ": " : "", w->name, w->secrets[i]);
        else
            st = td_exec_secrets_set(out, w->secrets[i], v);
    }
    /* Implicit secrets: what node 0's agent needs to keep the checkpoints in S3 as we would
     * (ckpt_s3.c), the credentials as we found them (a profile's too, resolved here). An aws
     * node with an instance profile has a role of its own: the user's keys then stay here. */
    int s3 = w && w->checkpoint_dir && !strncmp(w->checkpoint_dir, "s3://", 5);
    int own_role = w && w->executor && !strcmp(w->executor, "aws") && w->aws.iam_instance_profile;
    if (st == TD_OK && s3 && own_role) {
        for (const char *const *k = td_exec_aws_secret_names; *k && st == TD_OK; k++)
            if (strncmp(*k, "AWS_ACCESS_KEY_ID", 17) && strncmp(*k, "AWS_SECRET", 10) &&
                strncmp(*k, "AWS_SESSION", 11) && getenv(*k) && *getenv(*k))
                st = td_exec_secrets_set(out, *k, getenv(*k));
    } else if (st == TD_OK && s3) {
        td_exec_secrets_add_aws(out);
        td_aws_creds creds = {0};
        if (td_aws_creds_load(w->aws.profile, &creds) == TD_OK) {
            st = td_exec_secrets_set(out, "AWS_ACCESS_KEY_ID", creds.access_key_id);
            if (st == TD_OK)
                st = td_exec_secrets_set(out, "AWS_SECRET_ACCESS_KEY", creds.secret_access_key);
            if (st == TD_OK && creds.session_token)
                st = td_exec_secrets_set(out, "AWS_SESSION_TOKEN", creds.session_token);
        } else {
            td_error_clear(); /* none here: the node's own (files, role), or its clear error */
        }
        td_aws_creds_free(&creds);
    }
    if (st != TD_OK) td_exec_secrets_free(out);
    return st;
}

td_status td_workflow_run(const td_workflow *w, const td_run_options *opts, char **run_id_out,
                          int *exit_code) {
    td_status st = TD_OK;
    td_rundb *store = NULL;
    supervisor s;
    memset(&s, 0, sizeof s);
    td_workflow *synth = NULL;
    int lock_fd = -1;
    *exit_code = 1;
    if (run_id_out) *run_id_out = NULL;
    if ((opts->controller_of || opts->controller_store) &&
        (!opts->controller_of || !opts->controller_store || !opts->detach ||
         (opts->resume_run && strcmp(opts->resume_run, opts->controller_of))))
        return td_error(TD_ERR_USAGE,
                        "--controller-of RUN and --controller-store S3URL go together, with -d "
                        "(and --resume RUN, the same run, for a resumed run): tandem run -d of an "
                        "aws run sets them on its controller");
    /* tandem run -d of an aws run, a resume too: handed to a controller in the cloud */
    int in_cloud = opts->detach && !opts->controller_of && w && w->executor &&
                   !strcmp(w->executor, "aws");
    /* Before anything starts: a secret that is not set stops the run before it exists. */
    TD_CHECK(td_workflow_secrets(w, &s.secrets));
    st = td_rundb_open(opts->project_dir, &store);
    if (st != TD_OK) goto out;
    /* the controller of a resumed run: the run's last life, as its store in S3 keeps it, made
     * this project's run first (the controller's project is fresh) */
    if (opts->resume_run && opts->controller_of && w)
        st = td_exec_controller_adopt(store, &w->aws, opts->controller_store, opts->resume_run);
    if (st != TD_OK) goto out;
    if (opts->resume_run)
        st = resume_run(store, opts->resume_run, &s, &w, &synth, &lock_fd, in_cloud);
    else
        st = create_run(store, w, opts, &s, &lock_fd);
    if (st != TD_OK) goto out;
    s.w = w;
    s.tandem_bin = opts->tandem_bin ? td_xstrdup(opts->tandem_bin) : td_self_exe();
    s.out = opts->out ? opts->out : stdout;
    /* another executor's workers draw no progress bar: their output reaches no terminal */
    s.tty = !opts->detach && isatty(STDERR_FILENO) && !w->executor;
    if (w->workdir && w->workdir[0] == '/')
        s.project_dir = td_xstrdup(w->workdir);
    else if (w->workdir)
        s.project_dir = td_xasprintf("%s/%s", td_rundb_project_dir(store), w->workdir);
    else
        s.project_dir = td_xstrdup(td_rundb_project_dir(store));
    s.work_dir = td_run_path(s.run.run_dir, TD_RUN_PATH_WORK);
    if (run_id_out) *run_id_out = td_xstrdup(s.run.id);

    td_sigwatch sigs = {.fd = -1};
    s.sigs = &sigs;
    if (in_cloud) {
        s.store = store;
        st = run_in_cloud(&s);
        if (st == TD_OK) *exit_code = 0;
    } else if (opts->detach) {
        st = run_detached(&s, opts, &store, exit_code);
    } else {
        st = td_sigwatch_open(&sigs, watched_signals, (int)TD_ARRAY_LEN(watched_signals));
        if (st == TD_OK) {
            s.store = store;
            *exit_code = supervise(&s);
            td_sigwatch_close(&sigs);
        }
    }
out:
    if (lock_fd >= 0) close(lock_fd); /* the group's own copies keep holding it */
    if (st != TD_OK && run_id_out) {
        free(*run_id_out);
        *run_id_out = NULL;
    }
    td_rundb_close(store);
    td_run_clear(&s.run);
    td_workflow_free(synth);
    td_exec_secrets_free(&s.secrets);
    free((char *)s.tandem_bin);
    free(s.work_dir);
    free(s.project_dir);
    free((char *)s.script);
    free((char *)s.params_json);
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
