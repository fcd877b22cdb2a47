/* The node agent: token and store, the attempt loop (rendezvous, spawn, monitor, restart) and
 * the monitor, on the agent's one event loop (core's loop.h), which lives as long as the agent:
 * worker pipes and a signalfd watched, the store and stall checks, the caller's periodic work
 * and the exit barrier's count as timers, the wait before a restart a one-shot timer. Only the
 * rendezvous waits elsewhere (on the store, rdzv.c). Signal handlers do no work:
 * SIGCHLD/SIGTERM/SIGINT/SIGHUP are blocked and read from the signalfd.
 *
 * Per-attempt store keys beside the rendezvous ones (see rdzv.c), multi-node only:
 *   failed  the root cause, first failure in the group wins (compare_set)
 *   stop    the signal number a launcher received, for the others to forward
 *   done    count of nodes whose workers all exited 0
 *   exit    count of agents leaving; the store host waits for all before stopping the store
 *   beat/<node>  the node agent's heartbeat, carrying its workers' progress (stall.c)
 * and, on a resume, resume_step (rdzv.c): the step every rank resumes from, node 0's. */
#include "launch_internal.h"
#include "stall.h"

#include "tandem/endrec.h"
#include "tandem/loop.h"
#include "tandem/os.h"
#include "tandem/tensor.h"
#include "tandem/track.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

void td_launch_options_init(td_launch_options *o) {
    memset(o, 0, sizeof *o);
    o->min_nodes = o->max_nodes = 1;
    o->nproc_per_node = 1;
    o->node_rank = -1;
    o->monitor_interval_s = 0.1;
    o->grace_s = 2.0;
    o->stop_grace_s = 30.0;
    o->rdzv_timeout_s = 300.0;
    o->last_call_s = 3.0;
    o->stall_timeout_s = (double)td_env_int(TD_ENV_STALL_TIMEOUT_MS) / 1000.0;
    o->out_fd = STDOUT_FILENO;
    o->err_fd = STDERR_FILENO;
}

typedef enum { OUTCOME_OK, OUTCOME_FAILED, OUTCOME_STOPPED } outcome_kind;

typedef struct {
    const td_launch_options *o;
    bool multi;
    td_sigwatch *sigs; /* SIGCHLD, SIGTERM, SIGINT, SIGHUP */
    int sig_fd;        /* sigs->fd, watched by the event loops */
    char token[129];
    char run_id[256];
    char store_host[256]; /* how agents and workers reach the store */
    int store_port;
    td_store_server_t *server;
    td_store_t *store;     /* multi-node agents only */
    td_store_t *own_store; /* single node with a stall timeout: our client of our own store */
    char *path;            /* the worker command, resolved */
    int ncores;
    td_loop *loop;        /* the one event loop of this agent: every wait of its own runs on it */
    td__spot_watch *spot; /* TANDEM_SPOT_WATCH=1: IMDS's spot notices, on the loop; or NULL */
    td__ckpt_s3 *s3;      /* node 0 with TANDEM_CHECKPOINT_URL: its checkpoints in S3 (ckpt_s3.c) */
    int *redirects, *tee; /* --redirects/--tee per local rank (TD_LAUNCH_STD_* bits), or NULL */
    char *std_root;       /* their files' run directory, BASE/<run id>_XXXXXX, or NULL */
} agent;

typedef struct {
    int restart;
    char ns[512];
    td__rdzv_result rz;
    td__workers ws;
    outcome_kind outcome;
    char cause[512]; /* root cause of a failure */
    int failed_idx;  /* this node's worker whose failure is the group's cause, or -1 */
    int stop_sig;    /* signal that stopped the job (received here or on another node) */
    double stop_at;  /* when it arrived */
    bool teardown;
    double kill_at;      /* when teardown escalates to SIGKILL */
    uint64_t kill_timer; /* its timer on the monitor's loop, once armed (it stays armed) */
    bool killed;
    bool done_published;
    bool store_lost;
    bool cause_from_other; /* the group's cause is another node's failure */
    td__stall *stall;      /* the stall check, or NULL (--stall-timeout 0) */
    int silent_nodes;      /* agents whose heartbeat stopped: they will not check out */
    int64_t resume_step;   /* on a resume: the step every rank resumes from; -1: none */
} attempt;

/* The same token on every node without a shared secret: anyone who knows the id can compute
 * it, which is why the caller warns. */
static void token_from_id(const char *id, char *out) {
    uint64_t h[2] = {0x74616e64656d3031ull, 0x726476427a3a3a31ull};
    for (const unsigned char *p = (const unsigned char *)id; *p; p++) {
        h[0] = td_mix64(h[0] ^ *p);
        h[1] = td_mix64(h[1] + h[0]);
    }
    sprintf(out, "rdzv-%016llx%016llx", (unsigned long long)h[0], (unsigned long long)h[1]);
}

static td_status resolve_command(const char *cmd, char **path) {
    if (strchr(cmd, '/')) {
        if (access(cmd, X_OK) != 0)
            return td_error_errno(TD_ERR_USAGE, "worker command '%s' is not executable", cmd);
        *path = td_xstrdup(cmd);
        return TD_OK;
    }
    *path = td__which(cmd);
    return *path ? TD_OK : td_error(TD_ERR_USAGE, "worker command '%s' not found in PATH", cmd);
}

static td_status mkdir_p(const char *dir, const char *what) {
    td_status st = td_mkdirs(dir);
    return st == TD_OK ? TD_OK : td_error(st, "%s %s: %s", what, dir, td_error_msg());
}

/* LD_LIBRARY_PATH=... without the shipped bundle's library directory (TANDEM_BUNDLE_LIB, set by
 * its wrapper: docs/cloud.md, "Shipping tandem"); NULL when nothing is left. Those libraries are
 * tandem's: a worker's python must load the instance's own libssl, libsqlite3 or libz, not ours
 * (another build, maybe older than what it was linked against). A worker's `tandem` goes through
 * the wrapper again, which puts them back for it. */
static char *without_bundle_libs(const char *entry) {
    const char *bundle = td_var_get(TD_VAR_TANDEM_BUNDLE_LIB);
    const char *prefix = "LD_LIBRARY_PATH=";
    if (!bundle || !*bundle || strncmp(entry, prefix, strlen(prefix))) return td_xstrdup(entry);
    const char *v = entry + strlen(prefix);
    size_t nb = strlen(bundle);
    char *out = td_xcalloc(strlen(entry) + 1, 1);
    strcpy(out, prefix);
    bool any = false;
    while (*v) {
        const char *end = strchr(v, ':');
        size_t n = end ? (size_t)(end - v) : strlen(v);
        if (n && !(n == nb && !strncmp(v, bundle, nb))) {
            if (any) strcat(out, ":");
            strncat(out, v, n);
            any = true;
        }
        v += n + (end ? 1 : 0);
    }
    if (!any) {
        free(out);
        return NULL;
    }
    return out;
}

/* The worker's environment: ours, with the launcher's variables replacing any inherited ones. */
static char **build_env(char **vars, int nvars) {
    size_t nenv = 0;
    while (environ[nenv]) nenv++;
    char **env = td_xcalloc(nenv + (size_t)nvars + 1, sizeof *env);
    size_t k = 0;
    for (size_t i = 0; i < nenv; i++) {
        bool replaced = false;
        for (int j = 0; j < nvars && !replaced; j++) {
            size_t nl = (size_t)(strchr(vars[j], '=') - vars[j]);
            replaced = !strncmp(environ[i], vars[j], nl) && environ[i][nl] == '=';
        }
        char *kept = replaced ? NULL : without_bundle_libs(environ[i]);
        if (kept) env[k++] = kept;
    }
    for (int j = 0; j < nvars; j++) env[k++] = vars[j];
    return env;
}

static void free_env(char **env) {
    if (!env) return;
    for (char **e = env; *e; e++) free(*e);
    free(env);
}

/* One "NAME=value" of the worker contract (core.h's TD_VAR_MAP). */
static char *var(td_var v, const char *fmt, ...) TD_PRINTF(2, 3);
static char *var(td_var v, const char *fmt, ...) {
    char value[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(value, sizeof value, fmt, ap);
    va_end(ap);
    return td_xasprintf("%s=%s", td_var_name(v), value);
}

static char **worker_env(const agent *a, const attempt *t, int local_rank) {
    const td_launch_options *o = a->o;
    int rank = t->rz.rank_offset + local_rank;
    char *v[TD_VAR_COUNT];
    int n = 0;
    v[n++] = var(TD_VAR_RANK, "%d", rank);
    v[n++] = var(TD_VAR_LOCAL_RANK, "%d", local_rank);
    v[n++] = var(TD_VAR_WORLD_SIZE, "%d", t->rz.world_size);
    v[n++] = var(TD_VAR_LOCAL_WORLD_SIZE, "%d", o->nproc_per_node);
    v[n++] = var(TD_VAR_GROUP_RANK, "%d", t->rz.group_rank);
    v[n++] = var(TD_VAR_GROUP_WORLD_SIZE, "%d", t->rz.nnodes);
    /* Not torchrun's, but what Lightning (LightningEnvironment, SLURM-less multi-node) and many
     * scripts read for the node: a script must not silently become node 0 of 1. */
    v[n++] = var(TD_VAR_NODE_RANK, "%d", t->rz.group_rank);
    v[n++] = var(TD_VAR_NUM_NODES, "%d", t->rz.nnodes);
    v[n++] = var(TD_VAR_ROLE_RANK, "%d", rank);
    v[n++] = var(TD_VAR_ROLE_WORLD_SIZE, "%d", t->rz.world_size);
    v[n++] = var(TD_VAR_ROLE_NAME, "%s", o->role && *o->role ? o->role : "default");
    v[n++] = var(TD_VAR_MASTER_ADDR, "%s", t->rz.master_addr);
    v[n++] = var(TD_VAR_MASTER_PORT, "%d", t->rz.master_port);
    v[n++] = var(TD_VAR_TORCHELASTIC_RESTART_COUNT, "%d", t->restart);
    v[n++] = var(TD_VAR_TORCHELASTIC_MAX_RESTARTS, "%d", o->max_restarts);
    v[n++] = var(TD_VAR_TORCHELASTIC_RUN_ID, "%s", a->run_id);
    /* torch.distributed then builds its own TCPStore at MASTER_ADDR:MASTER_PORT. */
    v[n++] = var(TD_VAR_TORCHELASTIC_USE_AGENT_STORE, "False");
    /* torchrun's: the inherited value, else 1 (NCCL errors end the process, not hang it). */
    const char *nccl = getenv(td_var_name(TD_VAR_TORCH_NCCL_ASYNC_ERROR_HANDLING));
    v[n++] = var(TD_VAR_TORCH_NCCL_ASYNC_ERROR_HANDLING, "%s", nccl ? nccl : "1");
    const char *omp = td_var_get(TD_VAR_OMP_NUM_THREADS);
    char threads[32];
    if (omp) {
        snprintf(threads, sizeof threads, "%s", omp);
    } else {
        snprintf(threads, sizeof threads, "%d", TD_MAX(1, a->ncores / o->nproc_per_node));
        v[n++] = var(TD_VAR_OMP_NUM_THREADS, "%s", threads);
    }
    const char *tnt = td_var_get(TD_VAR_TANDEM_NUM_THREADS);
    if (!tnt || !strcmp(tnt, "0")) v[n++] = var(TD_VAR_TANDEM_NUM_THREADS, "%s", threads);
    v[n++] = var(TD_VAR_TANDEM_STORE_ADDR, "%s:%d", a->store_host, a->store_port);
    v[n++] = var(TD_VAR_TANDEM_TOKEN, "%s", a->token);
    v[n++] = var(TD_VAR_TANDEM_RUN_ID, "%s", a->run_id);
    v[n++] = var(TD_VAR_TANDEM_RESTART_COUNT, "%d", t->restart);
    v[n++] = var(TD_VAR_TANDEM_NODE_RANK, "%d", t->rz.group_rank);
    /* One BLAS kernel for the group: nodes whose CPUs or environments would pick other OpenBLAS
     * cores compute other bits (tensor.h, numerics); node 0's choice wins. One node needs no
     * pin: its workers share the launcher's environment. */
    if (t->rz.nnodes > 1 && t->rz.blas_core[0] && strcmp(t->rz.blas_core, "unknown"))
        v[n++] = var(TD_VAR_OPENBLAS_CORETYPE, "%s", t->rz.blas_core);
    /* And one build of tandem's kernels: the lowest x86-64 level among the nodes (a node whose
     * tandem has no build of it says so as its workers start: isa.c). */
    if (t->rz.nnodes > 1 && !strncmp(t->rz.isa_level, "x86-64", 6))
        v[n++] = var(TD_VAR_TANDEM_ISA, "%s", t->rz.isa_level);
    if (o->metrics_dir)
        v[n++] = var(TD_VAR_TANDEM_METRICS, "%s/rank-%d.jsonl", o->metrics_dir, rank);
    /* Every rank resumes from one step, whatever its own directory holds (decide_resume). */
    if (t->resume_step >= 0)
        v[n++] = var(TD_VAR_TANDEM_RESUME_STEP, "%lld", (long long)t->resume_step);
    /* Always set, 0 too: an inherited value must not make workers publish for nobody. */
    v[n++] = var(TD_VAR_TANDEM_HEARTBEAT_MS, "%d",
                 o->stall_timeout_s > 0 ? td__stall_heartbeat_ms(o->stall_timeout_s) : 0);
    return build_env(v, n);
}

static void store_key_str(const attempt *t, const char *name, char *key, size_t nbytes) {
    snprintf(key, nbytes, "%s/%s", t->ns, name);
}

static const char *sig_name(int sig) {
    const char *s = sigabbrev_np(sig);
    return s ? s : "?";
}

static void start_teardown(attempt *t, int sig, double grace_s) {
    if (t->teardown) return;
    t->teardown = true;
    t->kill_at = td_now_s() + grace_s;
    td__workers_signal(&t->ws, sig, false);
}

static void fail_group(agent *a, attempt *t);

/* A local failure: the first one here, and (multi-node) the first in the group unless another
 * node published one before us. */
static void on_local_failure(agent *a, attempt *t, int idx) {
    td__worker *w = &t->ws.w[idx];
    char how[128];
    td_wait_describe(w->status, how, sizeof how);
    snprintf(t->cause, sizeof t->cause, "worker rank %d (local rank %d on node %d, pid %d) %s",
             w->rank, w->local_rank, t->rz.group_rank, (int)w->pid, how);
    fail_group(a, t);
    if (t->outcome == OUTCOME_FAILED && !t->cause_from_other) t->failed_idx = idx;
}

/* The stall check's verdict (stall.c) is a failure like a worker's. */
static void on_stall(agent *a, attempt *t, const char *cause) {
    snprintf(t->cause, sizeof t->cause, "%s", cause);
    fail_group(a, t);
    /* A stopped worker acts on the SIGTERM only once it runs again (as scancel does). */
    td__workers_signal(&t->ws, SIGCONT, false);
}

/* t->cause is this node's failure: tear down, and publish it as the group's unless another node
 * was first (then print ours as a consequence and take theirs). */
static void fail_group(agent *a, attempt *t) {
    t->outcome = OUTCOME_FAILED;
    start_teardown(t, SIGTERM, a->o->grace_s);
    if (a->multi && !t->store_lost) {
        char key[600];
        store_key_str(t, "failed", key, sizeof key);
        void *actual = NULL;
        size_t n = 0;
        if (td_store_compare_set(a->store, key, NULL, 0, t->cause, strlen(t->cause), &actual, &n) ==
                TD_OK &&
            actual && (n != strlen(t->cause) || memcmp(actual, t->cause, n))) {
            TD_LOG_WARN("%s (after another node's failure)", t->cause);
            snprintf(t->cause, sizeof t->cause, "%.*s", (int)TD_MIN(n, 500), (char *)actual);
            t->cause_from_other = true;
        }
        free(actual);
    }
}

static void on_signal(agent *a, attempt *t, int sig, bool remote) {
    if (t->teardown && t->stop_sig) {
        /* A second signal: no more patience. Except within a second of the first: wrappers
         * (timeout(1), srun, shells) often deliver one stop request twice in a burst. */
        if (!remote && td_now_s() - t->stop_at > 1.0) {
            TD_LOG_WARN("second SIG%s: killing the workers now", sig_name(sig));
            td__workers_signal(&t->ws, SIGKILL, true);
            t->killed = true;
        }
        return;
    }
    if (t->outcome == OUTCOME_FAILED) return; /* already tearing down for a failure */
    t->stop_sig = sig;
    t->stop_at = td_now_s();
    t->outcome = OUTCOME_STOPPED;
    TD_LOG_INFO("%s SIG%s: forwarding it to the workers (SIGKILL after %.0f s)",
                remote ? "another node's launcher received" : "received", sig_name(sig),
                a->o->stop_grace_s);
    start_teardown(t, sig, a->o->stop_grace_s);
    if (a->multi && !remote && !t->store_lost) {
        char key[600], val[16];
        store_key_str(t, "stop", key, sizeof key);
        int len = snprintf(val, sizeof val, "%d", sig);
        if (td_store_set(a->store, key, val, (size_t)len) != TD_OK)
            TD_LOG_WARN("could not tell the other nodes to stop: %s", td_error_msg());
    }
}

/* SIGCHLD needs nothing here: the loop reaps after every wakeup. */
static void read_signals(agent *a, attempt *t) {
    for (int sig; (sig = td_sigwatch_next(a->sigs));)
        if (sig != SIGCHLD) on_signal(a, t, sig, false);
}

static void lose_store(agent *a, attempt *t);

/* The other nodes' news, once per monitor interval. */
static void check_store(agent *a, attempt *t) {
    char key[600];
    void *v = NULL;
    size_t n = 0;
    td_status st;
    store_key_str(t, "failed", key, sizeof key);
    st = td_store_get(a->store, key, &v, &n, 0);
    if (st == TD_OK) {
        if (t->outcome != OUTCOME_FAILED) {
            /* a peer's words: escaped before they reach a terminal or a log */
            td_escape_text(t->cause, sizeof t->cause, v, n);
            t->outcome = OUTCOME_FAILED;
            start_teardown(t, SIGTERM, a->o->grace_s);
        }
        free(v);
        return;
    }
    if (st != TD_ERR_NOTFOUND) goto lost;
    store_key_str(t, "stop", key, sizeof key);
    st = td_store_get(a->store, key, &v, &n, 0);
    if (st == TD_OK) {
        int sig = atoi((char *)v);
        free(v);
        if (!t->stop_sig && sig > 0 && sig < 65) on_signal(a, t, sig, true);
        return;
    }
    if (st != TD_ERR_NOTFOUND) goto lost;
    td_error_clear();
    return;
lost:
    lose_store(a, t);
}

/* A store request failed (the detail is td_error_msg()): the group cannot go on. */
static void lose_store(agent *a, attempt *t) {
    t->store_lost = true;
    if (t->outcome == OUTCOME_OK && !t->teardown) {
        snprintf(t->cause, sizeof t->cause,
                 "lost the rendezvous store at %s:%d (did node 0's launcher die?): %s",
                 a->store_host, a->store_port, td_error_msg());
        t->outcome = OUTCOME_FAILED;
        start_teardown(t, SIGTERM, a->o->grace_s);
    }
}

/* Heartbeats and the workers' collective progress, once per stall period (stall.c). */
static void check_stall(agent *a, attempt *t) {
    char cause[sizeof t->cause];
    if (td__stall_check(t->stall, &t->ws, cause, sizeof cause) != TD_OK)
        lose_store(a, t);
    else if (cause[0])
        on_stall(a, t, cause);
}

/* Local workers all succeeded: are all nodes done? */
static bool group_done(agent *a, attempt *t) {
    if (!a->multi) return true;
    char key[600];
    store_key_str(t, "done", key, sizeof key);
    int64_t v = 0;
    if (td_store_add(a->store, key, t->done_published ? 0 : 1, &v) != TD_OK) {
        t->store_lost = true;
        snprintf(t->cause, sizeof t->cause, "lost the rendezvous store at %s:%d: %s", a->store_host,
                 a->store_port, td_error_msg());
        t->outcome = OUTCOME_FAILED;
        return true;
    }
    t->done_published = true;
    return v >= t->rz.nnodes;
}

/* Turns the agent's loop until over(user) says the phase is over; over is asked before every
 * turn, so it plays the part of a before-sleep hook (loop.h) that ends the phase before the loop
 * sleeps again. It never gives up: a failing epoll (it does not, short of a kernel out of
 * memory) is retried after a pause, not spun on, and workers are never left unwatched. */
static void run_until(agent *a, bool (*over)(void *user), void *user) {
    while (!over(user))
        if (td_loop_turn(a->loop, -1) != TD_OK) {
            TD_LOG_WARN("event loop: %s", td_error_msg());
            td_error_clear();
            nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
        }
}

/* The caller's periodic work (td_launch_options.on_tick: tandem launch's system metrics). */
static void on_caller_tick(td_loop *l, void *user) {
    (void)l;
    const td_launch_options *o = ((agent *)user)->o;
    o->on_tick(o->tick_user);
}

/* The monitor runs on the agent's event loop (loop.h): the signalfd and the workers' pipes are
 * watched descriptors, the store check and the stall check are periodic timers, the SIGKILL
 * deadline of a teardown is a one-shot timer, and before every turn workers_over reaps workers
 * and decides when the attempt is over. Then the pipes' last output, on the same loop.
 * Everything it adds to the loop it removes again: the loop outlives the attempt. */
typedef struct {
    agent *a;
    attempt *t;
    double stall_period;
    uint64_t tick, stall_tick, drain_timer;
    bool drain_over; /* the pipes were waited for long enough */
} monitor_ctx;

/* A grandchild may hold a worker's pipe open after the worker exited: its output is waited for
 * this long, no longer. */
#define DRAIN_S 1.0

static void on_signal_fd(td_loop *l, int fd, unsigned events, void *user) {
    (void)l, (void)fd, (void)events;
    monitor_ctx *m = user;
    read_signals(m->a, m->t);
}

static void on_worker_fd(td_loop *l, int fd, unsigned events, void *user) {
    (void)events;
    td__workers *ws = &((monitor_ctx *)user)->t->ws;
    td__workers_pump_fd(ws, fd);
    for (int i = 0; i < ws->n; i++)
        if (ws->w[i].out.fd == fd || ws->w[i].err.fd == fd) return;
    td_loop_unwatch(l, fd); /* at its end: the pump closed it */
}

/* The other nodes' news, once per monitor interval; also while this node's workers are done
 * and it waits for the others. */
static void on_tick(td_loop *l, void *user) {
    (void)l;
    monitor_ctx *m = user;
    if (m->a->multi && !m->t->store_lost && !m->t->teardown) check_store(m->a, m->t);
}

/* The stall check: its heartbeat also tells the other nodes this one is still here. */
static void on_stall_tick(td_loop *l, void *user) {
    (void)l;
    monitor_ctx *m = user;
    if (!m->t->store_lost && !m->t->teardown) check_stall(m->a, m->t);
}

static void on_kill_deadline(td_loop *l, void *user) {
    (void)l;
    monitor_ctx *m = user;
    attempt *t = m->t;
    if (t->killed || td__workers_running(&t->ws) == 0) return;
    TD_LOG_WARN("workers still running %.1f s after SIGTERM: sending SIGKILL",
                t->outcome == OUTCOME_STOPPED ? m->a->o->stop_grace_s : m->a->o->grace_s);
    td__workers_signal(&t->ws, SIGKILL, true);
    t->killed = true;
}

/* Before every turn: reaps workers and decides when the attempt is over. */
static bool workers_over(void *user) {
    monitor_ctx *m = user;
    attempt *t = m->t;
    int failed = -1;
    td__workers_reap(&t->ws, &failed);
    if (failed >= 0 && !t->teardown) on_local_failure(m->a, t, failed);
    if (t->teardown && !t->killed && !t->kill_timer)
        t->kill_timer = td_loop_timer(m->a->loop, t->kill_at - td_now_s(), 0, on_kill_deadline, m);
    /* or the store was lost; outcome says which */
    return td__workers_running(&t->ws) == 0 && (t->teardown || group_done(m->a, t));
}

/* The stall check of this attempt (stall.c), when there is one. */
static void start_stall(agent *a, attempt *t, monitor_ctx *m) {
    const td_launch_options *o = a->o;
    if (!(o->stall_timeout_s > 0)) return;
    td__stall_params sp = {.store = a->multi ? a->store : a->own_store,
                           .ns = t->ns,
                           .run_id = a->run_id,
                           .restart = t->restart,
                           .node = t->rz.group_rank,
                           .nnodes = t->rz.nnodes,
                           .rank_offset = t->rz.rank_offset,
                           .nlocal = t->ws.n,
                           .world_size = t->rz.world_size,
                           .timeout_s = o->stall_timeout_s,
                           .monitor_s = o->monitor_interval_s};
    if (sp.store) {
        t->stall = td__stall_new(&sp);
        m->stall_period = td__stall_period_s(&sp);
    }
}

static td_status watch_workers(agent *a, attempt *t, monitor_ctx *m) {
    td_status st = td_loop_watch(a->loop, a->sig_fd, TD_LOOP_READ, on_signal_fd, m);
    for (int i = 0; st == TD_OK && i < t->ws.n; i++) {
        if (t->ws.w[i].out.fd >= 0)
            st = td_loop_watch(a->loop, t->ws.w[i].out.fd, TD_LOOP_READ, on_worker_fd, m);
        if (st == TD_OK && t->ws.w[i].err.fd >= 0)
            st = td_loop_watch(a->loop, t->ws.w[i].err.fd, TD_LOOP_READ, on_worker_fd, m);
    }
    return st;
}

static void unwatch_workers(agent *a, attempt *t) {
    for (int i = 0; i < t->ws.n; i++) {
        td_loop_unwatch(a->loop, t->ws.w[i].out.fd);
        td_loop_unwatch(a->loop, t->ws.w[i].err.fd);
    }
}

static bool pipes_over(void *user) {
    monitor_ctx *m = user;
    return m->drain_over || td__workers_open_streams(&m->t->ws) == 0;
}

static void on_drain_deadline(td_loop *l, void *user) {
    (void)l;
    ((monitor_ctx *)user)->drain_over = true;
}

/* The workers are gone: what is left in their pipes, until every pipe ends or DRAIN_S passes,
 * then the pipes are closed. Signals wait on the signalfd meanwhile (the attempt's outcome is
 * decided). */
static void drain_workers(agent *a, attempt *t, monitor_ctx *m, bool watched) {
    if (watched) {
        m->drain_timer = td_loop_timer(a->loop, DRAIN_S, 0, on_drain_deadline, m);
        run_until(a, pipes_over, m);
        td_loop_cancel(a->loop, m->drain_timer);
    }
    unwatch_workers(a, t);
    td__workers_close_streams(&t->ws);
}

static void monitor(agent *a, attempt *t) {
    const td_launch_options *o = a->o;
    monitor_ctx m = {.a = a, .t = t};
    start_stall(a, t, &m);
    td_status st = watch_workers(a, t, &m);
    if (st == TD_OK) {
        m.tick = td_loop_timer(a->loop, 0, o->monitor_interval_s, on_tick, &m);
        if (t->stall) m.stall_tick = td_loop_timer(a->loop, 0, m.stall_period, on_stall_tick, &m);
        run_until(a, workers_over, &m);
    } else {
        /* The loop cannot watch them (no memory for epoll): stop them. */
        TD_LOG_ERROR("cannot watch the workers: %s", td_error_msg());
        snprintf(t->cause, sizeof t->cause, "cannot watch the workers: %s", td_error_msg());
        t->outcome = OUTCOME_FAILED;
        start_teardown(t, SIGKILL, 0);
        for (int i = 0; i < t->ws.n; i++)
            if (t->ws.w[i].running) waitpid(t->ws.w[i].pid, &t->ws.w[i].status, 0);
    }
    td_loop_unwatch(a->loop, a->sig_fd);
    td_loop_cancel(a->loop, m.tick);
    td_loop_cancel(a->loop, m.stall_tick);
    td_loop_cancel(a->loop, t->kill_timer);
    if (t->teardown) td__workers_signal(&t->ws, SIGKILL, true); /* grandchildren */
    drain_workers(a, t, &m, st == TD_OK);
    if (t->stall) {
        /* Silent for the stall time: it froze (a live agent's teardown is much shorter). */
        t->silent_nodes = td__stall_silent_nodes(t->stall, o->stall_timeout_s);
        td__stall_free(t->stall);
        t->stall = NULL;
    }
}

static int stop_exit_code(const attempt *t) {
    if (t->stop_sig == SIGINT) return 130;
    for (int i = 0; i < t->ws.n; i++) {
        int s = t->ws.w[i].status;
        if (!(WIFEXITED(s) && (WEXITSTATUS(s) == 0 || WEXITSTATUS(s) == 143))) return 1;
    }
    return 143;
}

/* Connects to the rendezvous store within the rendezvous timeout, a second at a time: between
 * the tries a stop signal ends the wait (TD_ERR_INTERRUPTED; the signal stays queued for the
 * caller), so that a supervisor stopping the run (node 0 failed and its store is gone) is not
 * kept waiting for the whole timeout. */
static td_status connect_store(agent *a) {
    const td_launch_options *o = a->o;
    double t0 = td_now_s();
    for (;;) {
        double left = o->rdzv_timeout_s - (td_now_s() - t0);
        int ms = (int)(TD_MAX(0.001, TD_MIN(left, 1.0)) * 1000);
        td_status st = td_store_connect(a->store_host, a->store_port, a->token, ms, &a->store);
        if (st == TD_OK) return TD_OK;
        if (td_now_s() - t0 >= o->rdzv_timeout_s)
            return td_error(st, "%s (for %.0f s, the rendezvous timeout)", td_error_msg(),
                            o->rdzv_timeout_s);
        if (a->sig_fd >= 0 && td_loop_wait_readable(a->sig_fd, 0))
            return td_error(TD_ERR_INTERRUPTED,
                            "a signal came while this node waited for the rendezvous store at "
                            "%s:%d",
                            a->store_host, a->store_port);
        td_error_clear();
    }
}

static td_status setup_store(agent *a) {
    const td_launch_options *o = a->o;
    td_status st;
    if (!a->multi) {
        snprintf(a->store_host, sizeof a->store_host, "127.0.0.1");
        TD_CHECK(td_store_server_start("127.0.0.1", 0, a->token, &a->server));
        a->store_port = td_store_server_port(a->server);
        return TD_OK;
    }
    TD_CHECK(
        td__parse_endpoint(o->rdzv_endpoint, a->store_host, sizeof a->store_host, &a->store_port));
    if (a->store_port == 0 && (o->node_rank != 0 || !o->on_store))
        return td_error(TD_ERR_USAGE,
                        "--rdzv-endpoint %s: port 0 (any free port) works only for node rank 0 "
                        "started by an executor, which tells the other nodes the port; give a "
                        "port",
                        o->rdzv_endpoint);
    const char *lfd = td_var_get(TD_VAR_TANDEM_STORE_LISTEN_FD);
    if (o->node_rank == 0 && lfd) {
        /* The socket our parent (the `tandem run` supervisor) bound for us: the port in the
         * endpoint it gave every node is held from the moment it was picked. */
        int64_t fd;
        TD_CHECK(td_parse_i64(td_var_name(TD_VAR_TANDEM_STORE_LISTEN_FD), lfd, &fd));
        TD_CHECK(td_store_server_start_fd((int)fd, a->token, &a->server));
        if (td_store_server_port(a->server) != a->store_port)
            return td_error(TD_ERR_USAGE,
                            "%s=%s listens on port %d, but --rdzv-endpoint says %d; they must "
                            "agree",
                            td_var_name(TD_VAR_TANDEM_STORE_LISTEN_FD), lfd,
                            td_store_server_port(a->server), a->store_port);
    } else if (o->node_rank == 0) {
        /* Where the endpoint says: a 127.0.0.1 endpoint must not listen on every interface
         * (issue 8). Only when this host cannot bind the endpoint's address (its name resolves
         * to another address here than elsewhere) does the store take all interfaces, saying
         * so. */
        st = td_store_server_start(a->store_host, a->store_port, a->token, &a->server);
        if (st != TD_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", td_error_msg());
            st = td_store_server_start(NULL, a->store_port, a->token, &a->server);
            if (st == TD_OK)
                TD_LOG_WARN("the rendezvous store cannot bind %s here (%s); it listens on every "
                            "interface, port %d, instead",
                            a->store_host, why, a->store_port);
        }
        if (st != TD_OK)
            return td_error(st,
                            "node rank 0 cannot host the rendezvous store on port %d (%s); pick "
                            "a free port in --rdzv-endpoint",
                            a->store_port, td_error_msg());
    } else if (o->node_rank < 0) {
        /* Without node ranks, the agent on the endpoint's host hosts it: binding the endpoint
         * address succeeds only there (or fails because a store is already up). */
        if (td_store_server_start(a->store_host, a->store_port, a->token, &a->server) != TD_OK) {
            a->server = NULL;
            td_error_clear();
        }
    }
    if (a->server) {
        if (a->store_port == 0) a->store_port = td_store_server_port(a->server);
        TD_LOG_DEBUG("hosting the rendezvous store on port %d", a->store_port);
        if (o->on_store) o->on_store(o->executor_link, a->store_port);
    }
    return connect_store(a);
}

/* How many other node agents the executor knows are gone (td_launch_options.lost_nodes). */
static int lost_nodes(const agent *a) {
    const td_launch_options *o = a->o;
    return o->lost_nodes ? o->lost_nodes(o->executor_link) : 0;
}

/* Every agent checks out of the last attempt; the store host waits for them so that nobody
 * loses the store while still tearing down: it reads the count every BARRIER_POLL_S, a timer on
 * the agent's loop, until all are out or wait_s passed. */
#define BARRIER_POLL_S 0.02

typedef struct {
    agent *a;
    char key[600];
    int64_t v;  /* the agents checked out */
    int expect; /* the agents that will: a frozen one will not (its stall said so) */
    double deadline;
    bool store_failed, done;
} barrier_ctx;

/* All are out, but for those the executor saw go (it may say so while we wait). */
static bool barrier_reached(const barrier_ctx *b) {
    return b->v >= b->expect - lost_nodes(b->a);
}

static bool barrier_over(void *user) {
    return ((barrier_ctx *)user)->done;
}

static void on_barrier_tick(td_loop *l, void *user) {
    (void)l;
    barrier_ctx *b = user;
    if (td_store_add(b->a->store, b->key, 0, &b->v) != TD_OK)
        b->store_failed = b->done = true;
    else
        b->done = barrier_reached(b) || td_now_s() >= b->deadline;
}

static void exit_barrier(agent *a, const attempt *t, double wait_s) {
    if (!a->multi || !a->store || t->store_lost) return;
    barrier_ctx b = {.a = a, .expect = t->rz.nnodes - t->silent_nodes};
    store_key_str(t, "exit", b.key, sizeof b.key);
    if (td_store_add(a->store, b.key, 1, &b.v) != TD_OK || !a->server) return;
    b.deadline = td_now_s() + wait_s;
    b.done = barrier_reached(&b) || !(wait_s > 0);
    uint64_t timer =
        b.done ? 0 : td_loop_timer(a->loop, BARRIER_POLL_S, BARRIER_POLL_S, on_barrier_tick, &b);
    run_until(a, barrier_over, &b);
    td_loop_cancel(a->loop, timer);
    if (!b.store_failed && !barrier_reached(&b))
        TD_LOG_WARN("%lld of %d node agents checked out; stopping the store anyway", (long long)b.v,
                    t->rz.nnodes);
}

/* Restart k (1-based) waits 0 for the first, then TANDEM_RESTART_BACKOFF_MS doubling per
 * restart up to 30 s: a group that dies at once is not restarted in a tight loop (50 restarts
 * in 0.2 s were seen), and a one-off failure still restarts at once. */
static double restart_backoff_s(int k) {
    if (k <= 1) return 0;
    double base = (double)td_env_int(TD_ENV_RESTART_BACKOFF_MS) / 1000.0;
    double w = base;
    for (int i = 2; i < k && w < 30.0; i++) w *= 2;
    return TD_MIN(w, 30.0);
}

/* The wait before a restart, on the agent's loop: a one-shot timer, cut short by a stop signal
 * on the watched signalfd (reaped workers ring it too: SIGCHLD is read and passed over). */
typedef struct {
    agent *a;
    int sig; /* the stop signal that cut it short, or 0 */
    bool done;
} backoff_ctx;

static void on_backoff_signal(td_loop *l, int fd, unsigned events, void *user) {
    (void)l, (void)fd, (void)events;
    backoff_ctx *b = user;
    for (int sig; !b->sig && (sig = td_sigwatch_next(b->a->sigs));)
        if (sig != SIGCHLD) b->sig = sig;
    if (b->sig) b->done = true;
}

static bool backoff_over(void *user) {
    return ((backoff_ctx *)user)->done;
}

static void on_backoff_over(td_loop *l, void *user) {
    (void)l;
    ((backoff_ctx *)user)->done = true;
}

/* Sleeps wait_s; returns the stop signal that cut it short, or 0. */
static int backoff(agent *a, double wait_s) {
    if (!(wait_s > 0)) return 0;
    backoff_ctx b = {.a = a};
    if (td_loop_watch(a->loop, a->sig_fd, TD_LOOP_READ, on_backoff_signal, &b) != TD_OK)
        td_error_clear(); /* not cut short, then: the wait is bounded */
    uint64_t timer = td_loop_timer(a->loop, wait_s, 0, on_backoff_over, &b);
    run_until(a, backoff_over, &b);
    td_loop_cancel(a->loop, timer);
    td_loop_unwatch(a->loop, a->sig_fd);
    return b.sig;
}

/* More workers than this per core is a typo, not a plan (issue 8: 1000 on 2 cores was started). */
#define MAX_WORKERS_PER_CORE 32

static td_status validate(const td_launch_options *o) {
    if (o->argc < 1 || !o->argv || !o->argv[0])
        return td_error(TD_ERR_USAGE, "no worker command: tandem launch [options] -- CMD ARGS...");
    if (o->nproc_per_node < 1)
        return td_error(TD_ERR_USAGE, "--nproc-per-node %d: need at least 1", o->nproc_per_node);
    int cores = td_num_cores();
    if (o->nproc_per_node > MAX_WORKERS_PER_CORE * cores)
        return td_error(TD_ERR_USAGE,
                        "--nproc-per-node %d on a machine with %d core%s: at most %d (%d per "
                        "core); one worker per core is usual (--nproc-per-node auto)",
                        o->nproc_per_node, cores, cores == 1 ? "" : "s",
                        MAX_WORKERS_PER_CORE * cores, MAX_WORKERS_PER_CORE);
    if (o->min_nodes < 1 || o->max_nodes < o->min_nodes)
        return td_error(TD_ERR_USAGE, "--nnodes %d:%d: need 1 <= N <= M", o->min_nodes,
                        o->max_nodes);
    if (o->max_restarts < 0)
        return td_error(TD_ERR_USAGE, "--max-restarts %d: need >= 0", o->max_restarts);
    if (o->restarts_before < 0)
        return td_error(TD_ERR_USAGE, "--restarts-before %d: need >= 0", o->restarts_before);
    if (!(o->monitor_interval_s > 0) || o->grace_s < 0 || o->stop_grace_s < 0)
        return td_error(TD_ERR_USAGE, "--monitor-interval must be > 0 and grace periods >= 0");
    if (o->on_tick && !(o->tick_period_s > 0))
        return td_error(TD_ERR_USAGE, "td_launch_options.on_tick needs a tick_period_s > 0, not %g",
                        o->tick_period_s);
    if (!(o->stall_timeout_s >= 0))
        return td_error(TD_ERR_USAGE,
                        "--stall-timeout %g: need seconds >= 0 (0 turns the stall check off; "
                        "the default comes from TANDEM_STALL_TIMEOUT_MS)",
                        o->stall_timeout_s);
    if (o->standalone && o->max_nodes > 1)
        return td_error(TD_ERR_USAGE, "--standalone runs one node, but --nnodes is %d:%d",
                        o->min_nodes, o->max_nodes);
    if (!o->standalone && !o->rdzv_endpoint && o->max_nodes > 1)
        return td_error(TD_ERR_USAGE,
                        "--nnodes %d:%d needs --rdzv-endpoint HOST:PORT (the node-0 agent hosts "
                        "the store there)",
                        o->min_nodes, o->max_nodes);
    if (o->node_rank >= o->max_nodes)
        return td_error(TD_ERR_USAGE, "--node-rank %d is not below --nnodes %d", o->node_rank,
                        o->max_nodes);
    if (o->end_record && td_check_output_file(o->end_record, "--end-record") != TD_OK)
        return TD_ERR_USAGE;
    const char *std_flags[] = {"--redirects", "--tee"}, *std_specs[] = {o->redirects, o->tee};
    for (int k = 0; k < 2; k++) {
        int bits;
        if (td_launch_std_parse(std_specs[k], 0, &bits) != TD_OK)
            return td_error(TD_ERR_USAGE,
                            "%s '%s': %s; expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both) "
                            "for every local rank, or LOCAL_RANK:VALUE,... such as 0:3,1:2",
                            std_flags[k], std_specs[k], td_error_msg());
    }
    return TD_OK;
}

static td_end_worker end_worker(const attempt *t, const td__worker *w) {
    int s = w->status;
    return (td_end_worker){.rank = w->rank,
                           .local_rank = w->local_rank,
                           .node = t->rz.group_rank,
                           .exit_code = w->running ? -1 : td_wait_exit_code(s),
                           .signal = !w->running && WIFSIGNALED(s) ? WTERMSIG(s) : 0};
}

/* The typed record of how this agent ended (endrec.h), for the supervisor that started it. */
static void write_end_record(const td_launch_options *o, const attempt *t, td_status st,
                             int exit_code, const char *error) {
    td_end_record r = {.exit_code = exit_code,
                       .node_rank = t->rz.group_rank,
                       .nnodes = t->rz.nnodes ? t->rz.nnodes : o->min_nodes,
                       .restarts = t->restart,
                       .max_restarts = o->max_restarts,
                       .stop_signal = t->stop_sig};
    if (st != TD_OK)
        r.outcome = TD_END_ERROR;
    else if (exit_code == 0)
        r.outcome = TD_END_SUCCEEDED;
    else if (exit_code == 130)
        r.outcome = TD_END_INTERRUPTED;
    else if (exit_code == 143)
        r.outcome = TD_END_PREEMPTED;
    else if (t->outcome == OUTCOME_STOPPED)
        r.outcome = TD_END_STOPPED;
    else
        r.outcome = TD_END_FAILED;
    snprintf(r.cause, sizeof r.cause, "%s", st != TD_OK ? error : t->cause);
    if (t->failed_idx >= 0 && t->failed_idx < t->ws.n) {
        const td__worker *w = &t->ws.w[t->failed_idx];
        r.has_failure = true;
        r.failure = end_worker(t, w);
        snprintf(r.failure_line, sizeof r.failure_line, "%s", w->last_err);
    }
    r.nworkers = t->ws.n;
    r.workers = t->ws.n ? td_xcalloc((size_t)t->ws.n, sizeof *r.workers) : NULL;
    for (int i = 0; i < t->ws.n; i++) r.workers[i] = end_worker(t, &t->ws.w[i]);
    if (td_end_record_write(o->end_record, &r) != TD_OK) {
        TD_LOG_WARN("could not write the end record: %s", td_error_msg());
        td_error_clear();
    }
    free(r.workers);
}

/* The run id and the store token of this job: given, or made here (single node), or derived
 * from the id (multi-node without TANDEM_TOKEN, with a warning). */
static td_status pick_identity(agent *a) {
    const td_launch_options *o = a->o;
    if (o->rdzv_id && *o->rdzv_id)
        snprintf(a->run_id, sizeof a->run_id, "%s", o->rdzv_id);
    else if (a->multi)
        snprintf(a->run_id, sizeof a->run_id, "none");
    else
        TD_CHECK(td_random_hex(a->run_id, 8));
    const char *tok = td_var_get(TD_VAR_TANDEM_TOKEN);
    if (tok) {
        snprintf(a->token, sizeof a->token, "%s", tok);
    } else if (!a->multi) {
        TD_CHECK(td_random_hex(a->token, 16));
    } else {
        token_from_id(a->run_id, a->token);
        TD_LOG_WARN("TANDEM_TOKEN is not set: the store token is derived from --rdzv-id '%s', so "
                    "anyone who can reach %s and knows the id can join or disturb this job. "
                    "Export the same secret on every node, e.g. "
                    "TANDEM_TOKEN=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \\n')",
                    a->run_id, o->rdzv_endpoint);
    }
    return TD_OK;
}

/* torchrun's --redirects/--tee: which streams of which local rank go to files, and the run's
 * directory for them, made as torchrun makes it (DefaultLogsSpecs): BASE/<run id>_XXXXXX, a
 * fresh one per launcher, so that runs that share an id (multi-node "none") and the nodes of
 * one job on a shared LOG_DIR never write into each other's files. BASE is --log-dir, or a new
 * directory under $TMPDIR (torchrun: torchelastic_XXXXXX). Nothing is made when no stream of
 * this node goes to a file. */
static td_status plan_std_files(agent *a) {
    const td_launch_options *o = a->o;
    int n = o->nproc_per_node, any = 0;
    a->redirects = td_xcalloc((size_t)n, sizeof *a->redirects);
    a->tee = td_xcalloc((size_t)n, sizeof *a->tee);
    for (int i = 0; i < n; i++) {
        TD_CHECK(td_launch_std_parse(o->redirects, i, &a->redirects[i]));
        TD_CHECK(td_launch_std_parse(o->tee, i, &a->tee[i]));
        any |= a->redirects[i] | a->tee[i];
    }
    if (!any) return TD_OK;
    char *base = NULL;
    if (o->log_dir) {
        base = td_xstrdup(o->log_dir);
    } else {
        const char *tmp = getenv("TMPDIR");
        base = td_xasprintf("%s/tandem-launch-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(base)) {
            td_status st = td_error_errno(TD_ERR_IO, "--redirects/--tee: cannot make %s", base);
            free(base);
            return st;
        }
    }
    char id[sizeof a->run_id];
    snprintf(id, sizeof id, "%s", a->run_id);
    for (char *c = id; *c; c++)
        if (*c == '/') *c = '_'; /* one directory level, whatever the id */
    a->std_root = td_xasprintf("%s/%s_XXXXXX", base, id);
    free(base);
    if (!mkdtemp(a->std_root))
        return td_error_errno(TD_ERR_IO, "--redirects/--tee: cannot make %s", a->std_root);
    TD_LOG_INFO("worker output files (--redirects/--tee): %s/attempt_N/LOCAL_RANK/stdout.log, "
                "stderr.log",
                a->std_root);
    return TD_OK;
}

/* Everything an agent holds across its attempts: the signalfd, the identity, the directories,
 * the store, and the event loop with the caller's periodic work on it. */
static td_status open_agent(agent *a, td_sigwatch *sigs) {
    const td_launch_options *o = a->o;
    a->multi = !o->standalone && o->rdzv_endpoint;
    a->ncores = td_num_cores();
    /* Before any thread exists (the store server's), so that every thread has them blocked. */
    static const int watched[] = {SIGCHLD, SIGTERM, SIGINT, SIGHUP};
    TD_CHECK(td_sigwatch_open(sigs, watched, (int)TD_ARRAY_LEN(watched)));
    a->sigs = sigs;
    a->sig_fd = sigs->fd;
    TD_CHECK(pick_identity(a));
    if (o->log_dir) TD_CHECK(mkdir_p(o->log_dir, "--log-dir"));
    if (o->metrics_dir) TD_CHECK(mkdir_p(o->metrics_dir, "--metrics-dir"));
    TD_CHECK(plan_std_files(a));
    TD_CHECK(setup_store(a));
    if (!a->multi && o->stall_timeout_s > 0)
        TD_CHECK(td_store_connect(a->store_host, a->store_port, a->token, 10000, &a->own_store));
    TD_CHECK(td_loop_new(&a->loop));
    if (o->on_tick) td_loop_timer(a->loop, 0, o->tick_period_s, on_caller_tick, a);
    TD_CHECK(td__spot_watch_start(a->loop, o, &a->spot));
    return TD_OK;
}

static void close_agent(agent *a, td_sigwatch *sigs) {
    td__spot_watch_free(a->spot);
    td__ckpt_s3_free(a->s3);
    td_loop_free(a->loop);
    if (a->store) td_store_close(a->store);
    if (a->own_store) td_store_close(a->own_store);
    if (a->server) td_store_server_stop(a->server);
    td_sigwatch_close(sigs);
    free(a->path);
    free(a->redirects);
    free(a->tee);
    free(a->std_root);
}

/* The group of this attempt: the rendezvous of the node agents, or this node alone. *stopped: a
 * stop signal cut the rendezvous short (*exit_code says which); no workers are started. */
static td_status join_group(agent *a, attempt *t, int *exit_code, bool *stopped) {
    const td_launch_options *o = a->o;
    if (!a->multi) {
        t->rz.group_rank = 0;
        t->rz.nnodes = 1;
        t->rz.rank_offset = 0;
        t->rz.world_size = o->nproc_per_node;
        snprintf(t->rz.master_addr, sizeof t->rz.master_addr, "127.0.0.1");
        TD_CHECK(td_pick_free_port(&t->rz.master_port));
        return TD_OK;
    }
    td__rdzv_params p = {.store = a->store,
                         .ns = t->ns,
                         .min_nodes = o->min_nodes,
                         .max_nodes = o->max_nodes,
                         .node_rank = o->node_rank,
                         .nproc = o->nproc_per_node,
                         .store_host = a->store_host,
                         .store_port = a->store_port,
                         .timeout_s = o->rdzv_timeout_s,
                         .last_call_s = o->last_call_s,
                         .sig_fd = a->sig_fd};
    td_status st = td__rdzv_join(&p, &t->rz);
    if (st != TD_ERR_INTERRUPTED) return st;
    int sig = SIGTERM;
    for (int got; (got = td_sigwatch_next(a->sigs));)
        if (got != SIGCHLD) sig = got;
    TD_LOG_INFO("received SIG%s during rendezvous; no workers were started", sig_name(sig));
    *exit_code = sig == SIGINT ? 130 : 143;
    *stopped = true;
    return TD_OK;
}

/* Where this node stands in the group, and (multi-node, once) the BLAS kernel it adopts. */
static void describe_group(const agent *a, const attempt *t) {
    const td_launch_options *o = a->o;
    if (t->rz.nnodes > 1 && t->restart == o->restarts_before) {
        const char *mine = td_var_get(TD_VAR_OPENBLAS_CORETYPE);
        td_numerics num;
        td_numerics_get(&num);
        if (strcasecmp(num.blas_core, t->rz.blas_core))
            TD_LOG_INFO("node 0 runs OpenBLAS core %s, this node %s%s%s%s: its workers get "
                        "OPENBLAS_CORETYPE=%s, so every rank runs one BLAS kernel",
                        t->rz.blas_core, num.blas_core, mine ? " (OPENBLAS_CORETYPE=" : "",
                        mine ? mine : "", mine ? ")" : "", t->rz.blas_core);
        if (strcmp(td_isa_level(), t->rz.isa_level))
            TD_LOG_INFO("the lowest x86-64 level among the nodes is %s, this node's tandem runs "
                        "%s: its workers get TANDEM_ISA=%s, so every rank runs one build of "
                        "tandem's kernels",
                        t->rz.isa_level, td_isa_level(), t->rz.isa_level);
    }
    td_log(a->multi && t->restart == o->restarts_before ? TD_LOG_INFO : TD_LOG_DEBUG,
           "node %d of %d: ranks %d..%d of %d, MASTER_ADDR=%s MASTER_PORT=%d, store "
           "%s:%d",
           t->rz.group_rank, t->rz.nnodes, t->rz.rank_offset,
           t->rz.rank_offset + o->nproc_per_node - 1, t->rz.world_size, t->rz.master_addr,
           t->rz.master_port, a->store_host, a->store_port);
}

/* On a failure, the workers already started are killed and reaped. */
static td_status spawn_workers(agent *a, attempt *t) {
    const td_launch_options *o = a->o;
    char ***wenv = td_xcalloc((size_t)o->nproc_per_node, sizeof *wenv);
    for (int i = 0; i < o->nproc_per_node; i++) wenv[i] = worker_env(a, t, i);
    /* torchrun's attempt_<restart> under the run's directory: each attempt's files apart */
    char *std_dir = a->std_root ? td_xasprintf("%s/attempt_%d", a->std_root, t->restart) : NULL;
    td__spawn_args args = {.n = o->nproc_per_node,
                           .rank_offset = t->rz.rank_offset,
                           .path = a->path,
                           .argv = o->argv,
                           .envs = wenv,
                           .out_fd = o->out_fd,
                           .err_fd = o->err_fd,
                           .log_dir = o->log_dir,
                           .restart_count = t->restart,
                           .redirects = a->redirects,
                           .tee = a->tee,
                           .std_dir = std_dir};
    td_status st = td__workers_spawn(&t->ws, &args);
    free(std_dir);
    for (int i = 0; i < o->nproc_per_node; i++) free_env(wenv[i]);
    free(wenv);
    if (st != TD_OK) {
        td__workers_signal(&t->ws, SIGKILL, true);
        for (int i = 0; i < t->ws.n; i++)
            if (t->ws.w[i].running) waitpid(t->ws.w[i].pid, NULL, 0);
    }
    return st;
}

/* What follows a monitored attempt: true to restart the group, else *exit_code is the job's. */
static bool attempt_over(agent *a, attempt *t, int *exit_code) {
    const td_launch_options *o = a->o;
    if (t->outcome == OUTCOME_OK) {
        *exit_code = 0;
        exit_barrier(a, t, 10.0);
        return false;
    }
    if (t->outcome == OUTCOME_STOPPED) {
        *exit_code = stop_exit_code(t);
        TD_LOG_INFO("stopped by SIG%s; exit code %d", sig_name(t->stop_sig), *exit_code);
        exit_barrier(a, t, o->stop_grace_s + 10.0);
        return false;
    }
    TD_LOG_ERROR("%s", t->cause);
    if (t->restart < o->max_restarts && !t->store_lost) {
        double wait_s = restart_backoff_s(t->restart + 1);
        if (wait_s > 0)
            TD_LOG_WARN("restarting all workers in %.1f s (restart %d of %d)", wait_s,
                        t->restart + 1, o->max_restarts);
        else
            TD_LOG_WARN("restarting all workers (restart %d of %d)", t->restart + 1,
                        o->max_restarts);
        int sig = backoff(a, wait_s);
        if (!sig) return true;
        TD_LOG_INFO("received SIG%s while waiting to restart; no workers were started",
                    sig_name(sig));
        *exit_code = sig == SIGINT ? 130 : 143;
        return false;
    }
    if (o->max_restarts > 0)
        TD_LOG_ERROR("giving up after %d restart%s", t->restart, t->restart == 1 ? "" : "s");
    *exit_code = 1;
    exit_barrier(a, t, o->grace_s + 10.0);
    return false;
}

/* The step the user names (TANDEM_RESUME_STEP in the agent's environment), or -2 when none. */
static td_status named_step(int64_t *step) {
    const char *v = td_var_get(TD_VAR_TANDEM_RESUME_STEP);
    *step = -2;
    if (!v || !*v) return TD_OK;
    if (td_parse_i64(td_var_name(TD_VAR_TANDEM_RESUME_STEP), v, step) != TD_OK || *step < 0)
        return td_error(TD_ERR_USAGE,
                        "%s=%s: expected the step of a checkpoint, an integer >= 0 (unset it to "
                        "resume from node 0's newest)",
                        td_var_name(TD_VAR_TANDEM_RESUME_STEP), v);
    return TD_OK;
}

/* A stop signal cut a wait before the workers started: *exit_code says which, *stopped set;
 * true. Any other status: false. */
static bool stopped_while(agent *a, td_status st, const char *what, int *exit_code,
                          bool *stopped) {
    if (st != TD_ERR_INTERRUPTED) return false;
    int sig = SIGTERM;
    for (int got; (got = td_sigwatch_next(a->sigs));)
        if (got != SIGCHLD) sig = got;
    td_error_clear();
    TD_LOG_INFO("received SIG%s while %s; no workers were started", sig_name(sig), what);
    *exit_code = sig == SIGINT ? 130 : 143;
    *stopped = true;
    return true;
}

/* Before the workers start: the node holding rank 0 mirrors its checkpoints to S3 (ckpt_s3.c),
 * every node checks the bucket; on a resume (TANDEM_RESUME=1, or a restart) the step every rank
 * resumes from is decided once, by node 0's agent after its restore and upload: the user's
 * TANDEM_RESUME_STEP, else the newest committed checkpoint in its TANDEM_CHECKPOINT_DIR. It
 * goes to the other nodes through the store; each restores exactly that step from S3 when it
 * lacks it, then takes what it still lacks of it from node 0's agent (ckpt_peer.c: without S3
 * or a shared disk, the only copy is node 0's, and Lightning and the HF Trainer read it on
 * every rank), and every worker gets it as TANDEM_RESUME_STEP. *stopped: a stop signal came
 * while waiting for node 0 or the others (*exit_code says which); no workers are started. */
static td_status decide_resume(agent *a, attempt *t, int *exit_code, bool *stopped) {
    const td_launch_options *o = a->o;
    const char *rv = td_var_get(TD_VAR_TANDEM_RESUME);
    bool resume = (rv && !strcmp(rv, "1")) || t->restart > 0;
    bool node0 = t->rz.group_rank == 0;
    t->resume_step = -1;
    if (a->s3) {
        TD_CHECK(td__ckpt_s3_resume(a->s3));
    } else {
        TD_CHECK(td__ckpt_s3_open(a->loop, resume, node0, &a->s3));
        td__ckpt_s3_set_node(a->s3, t->rz.group_rank); /* another node's own files (HF's RNG) */
    }
    if (!resume) return TD_OK;
    int64_t step;
    TD_CHECK(named_step(&step));
    const char *dir = td_var_get(TD_VAR_TANDEM_CHECKPOINT_DIR);
    td__rdzv_params p = {.store = a->store,
                         .ns = t->ns,
                         .timeout_s = o->rdzv_timeout_s,
                         .sig_fd = a->sig_fd};
    if (node0) {
        bool named = step >= 0;
        if (!named) step = dir ? td__ckpt_newest_step(dir) : -1;
        if (a->multi) {
            TD_CHECK(td__ckpt_peer_offer(&p, dir, step)); /* before the step: it is read after */
            TD_CHECK(td__rdzv_publish_step(&p, step));
        }
        if (step >= 0)
            TD_LOG_INFO("resuming from step %lld (%s); every rank gets %s=%lld", (long long)step,
                        named ? "named by TANDEM_RESUME_STEP"
                              : "the newest committed checkpoint on node 0",
                        td_var_name(TD_VAR_TANDEM_RESUME_STEP), (long long)step);
        else
            TD_LOG_INFO("resuming: node 0 holds no committed checkpoint%s%s; every rank starts "
                        "at step 0",
                        dir ? " in " : "", dir ? dir : " (no TANDEM_CHECKPOINT_DIR)");
        if (a->multi) {
            td_status st = td__ckpt_peer_serve(&p, t->rz.nnodes, dir, step);
            if (stopped_while(a, st, "sending the checkpoint to the other nodes", exit_code,
                              stopped))
                return TD_OK;
            TD_CHECK(st);
        }
    } else if (a->multi) {
        td_status st = td__rdzv_wait_step(&p, &step);
        if (stopped_while(a, st, "waiting for node 0's resume step", exit_code, stopped))
            return TD_OK;
        TD_CHECK(st);
        TD_LOG_INFO("resuming from step %lld, node 0's choice", (long long)step);
        TD_CHECK(td__ckpt_s3_restore_step(a->s3, step));
        st = td__ckpt_peer_fetch(&p, t->rz.group_rank, dir, step);
        if (stopped_while(a, st, "receiving node 0's checkpoint", exit_code, stopped))
            return TD_OK;
        TD_CHECK(st);
    }
    t->resume_step = step;
    return TD_OK;
}

/* A restarted group's mark in the metrics contract (docs/metrics-format.md): one `restart` event
 * line in each of this node's workers' files, through track's writer, before the workers start
 * again, at the step they go on from (the resume step, 0 without a checkpoint). The UI draws it;
 * the store deletes nothing for it. A file that cannot be written is a warning: the restart
 * goes on without its mark. */
static void mark_restart(const agent *a, const attempt *t) {
    const td_launch_options *o = a->o;
    if (t->restart <= 0 || !o->metrics_dir) return;
    int64_t step = t->resume_step >= 0 ? t->resume_step : 0;
    for (int i = 0; i < o->nproc_per_node; i++) {
        char *name = td_metrics_file_name(t->rz.rank_offset + i);
        char *path = td_xasprintf("%s/%s", o->metrics_dir, name);
        /* the mark goes into a stream the rank has; a rank that never logged (an SDK script logs
         * from rank 0 only) gets none, not a file of its own */
        struct stat sb;
        if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            free(name);
            free(path);
            continue;
        }
        td_metrics_sink *sink = NULL;
        td_status st = td_metrics_sink_open(path, &sink);
        if (st == TD_OK) st = td_metrics_sink_event(sink, TD_RUN_EVENT_RESTART, step);
        if (st != TD_OK) {
            TD_LOG_WARN("the restart's event in %s: %s", path, td_error_msg());
            td_error_clear();
        }
        td_metrics_sink_close(sink);
        free(name);
        free(path);
    }
}

/* The attempts: rendezvous, spawn, monitor, and again after a failure while restarts are left.
 * t holds the last one, for the end record. */
static td_status run_attempts(agent *a, attempt *t, int *exit_code) {
    /* A group restarted outside this launcher (a new Slurm step after a lost launcher) goes on
     * counting: its workers see the restart (TORCHELASTIC_RESTART_COUNT, and they resume), and
     * the end record and max_restarts count it. */
    for (int restart = a->o->restarts_before;; restart++) {
        td__workers_free(&t->ws);
        memset(t, 0, sizeof *t);
        t->restart = restart;
        t->failed_idx = -1;
        snprintf(t->ns, sizeof t->ns, "tandem.launch/%s/attempt%d", a->run_id, restart);
        bool stopped = false;
        TD_CHECK(join_group(a, t, exit_code, &stopped));
        if (stopped) return TD_OK;
        describe_group(a, t);
        TD_CHECK(decide_resume(a, t, exit_code, &stopped));
        if (stopped) return TD_OK;
        mark_restart(a, t);
        TD_CHECK(spawn_workers(a, t));
        monitor(a, t);
        if (!attempt_over(a, t, exit_code)) return TD_OK;
    }
}

td_status td_launch_run(const td_launch_options *o, int *exit_code) {
    *exit_code = 1;
    agent a = {.o = o, .sig_fd = -1};
    attempt t;
    memset(&t, 0, sizeof t);
    t.failed_idx = -1;
    td_sigwatch sigs = {.fd = -1};

    /* A usage error ends here too, and goes into the end record (but for --end-record's own). */
    td_status st = validate(o);
    if (st == TD_OK) st = resolve_command(o->argv[0], &a.path);
    if (st != TD_OK) st = TD_ERR_USAGE;
    if (st == TD_OK) st = open_agent(&a, &sigs);
    bool stopped = false;
    if (st == TD_ERR_INTERRUPTED) { /* a stop while waiting for the store: no workers */
        int sig = SIGTERM;
        for (int got; (got = td_sigwatch_next(&sigs));)
            if (got != SIGCHLD) sig = got;
        TD_LOG_INFO("received SIG%s while waiting for the rendezvous store; no workers were "
                    "started",
                    sig_name(sig));
        td_error_clear();
        *exit_code = sig == SIGINT ? 130 : 143;
        stopped = true;
        st = TD_OK;
    }
    if (st == TD_OK && !stopped) st = td__node_setup(o, &sigs, exit_code, &stopped);
    if (st == TD_OK && !stopped) st = run_attempts(&a, &t, exit_code);
    if (st == TD_OK) td__ckpt_s3_end(a.s3); /* the last checkpoint (a stop's), before we exit */
    if (st != TD_OK) *exit_code = st == TD_ERR_USAGE ? 2 : 1;
    if (o->end_record && td_file_kind(o->end_record) == NULL) {
        char error[TD_END_TEXT];
        snprintf(error, sizeof error, "%s", st != TD_OK ? td_error_msg() : "");
        const char *spot = td__spot_watch_cause(a.spot); /* why the stop came, when it did */
        if (spot && !t.cause[0]) snprintf(t.cause, sizeof t.cause, "%s", spot);
        write_end_record(o, &t, st, *exit_code, error);
    }
    td__workers_free(&t.ws);
    close_agent(&a, &sigs);
    return st;
}
