/* tandem launch: torchrun-compatible flag parsing; the work is td_launch_run (src/launch). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "tandem/gpu.h"
#include "tandem/launch.h"
#include "tandem/os.h"
#include "tandem/track.h"

enum {
    OPT_NNODES = 1,
    OPT_NPROC,
    OPT_NODE_RANK,
    OPT_RDZV_ENDPOINT,
    OPT_RDZV_ID,
    OPT_RDZV_BACKEND,
    OPT_STANDALONE,
    OPT_MAX_RESTARTS,
    OPT_RESTARTS_BEFORE,
    OPT_LOG_DIR,
    OPT_METRICS_DIR,
    OPT_END_RECORD,
    OPT_MONITOR_INTERVAL,
    OPT_GRACE,
    OPT_STOP_GRACE,
    OPT_RDZV_TIMEOUT,
    OPT_RDZV_LAST_CALL,
    OPT_STALL_TIMEOUT,
    OPT_MASTER_ADDR,
    OPT_MASTER_PORT,
    OPT_FORWARD_STDIO,
    OPT_LINK,
    OPT_NODE_SETUP,
    OPT_MODULE,
    OPT_NO_PYTHON,
    OPT_ROLE,
    OPT_START_METHOD,
    OPT_REDIRECTS,
    OPT_TEE,
};

static const cli_opt launch_opts[] = {
    {OPT_NNODES, "nnodes", 0, "N[:M]", "nodes to wait for (N), up to M (default 1)", 0},
    {OPT_NPROC, "nproc-per-node", 0, "K",
     "workers on this node (default 1): a number, gpu (one\n"
     "per visible GPU), cpu (one per core), auto (gpu if\n"
     "a GPU is visible, else cpu)",
     0},
    {OPT_NODE_RANK, "node-rank", 0, "R", "this node's rank (default: order of arrival)", 0},
    {OPT_RDZV_ENDPOINT, "rdzv-endpoint", 0, "H:P", "rendezvous store; node 0 hosts it (multi-node)",
     0},
    {OPT_RDZV_ID, "rdzv-id", 0, "ID", "job id shared by all nodes", 0},
    {OPT_RDZV_BACKEND, "rdzv-backend", 0, "NAME",
     "accepted for torchrun: c10d and static both mean the\nstore at --rdzv-endpoint", 0},
    {OPT_STANDALONE, "standalone", 0, NULL, "single node, private store on 127.0.0.1", 0},
    {OPT_MAX_RESTARTS, "max-restarts", 0, "R", "restart the whole group up to R times (default 0)",
     0},
    {OPT_RESTARTS_BEFORE, "restarts-before", 0, "K",
     "the group was restarted K times before this launcher\n"
     "started (an executor's new Slurm step): the first\n"
     "attempt is restart K and resumes; K counts against\n"
     "--max-restarts (default 0)",
     0},
    {OPT_LOG_DIR, "log-dir", 0, "DIR",
     "also append worker output to DIR/rank-R.log; the\n"
     "base of --redirects/--tee's files",
     0},
    {OPT_REDIRECTS, "redirects", 'r', "V",
     "workers' streams to files only: 0 none, 1 stdout,\n"
     "2 stderr, 3 both, or LOCAL_RANK:V,... (0:3,1:2);\n"
     "BASE/RUNID_X/attempt_N/LOCAL_RANK/stdout.log (BASE:\n"
     "--log-dir, else a new dir under $TMPDIR)",
     0},
    {OPT_TEE, "tee", 't', "V", "the same streams to files and the console", 0},
    {OPT_MODULE, "module", 'm', NULL,
     "the command is a Python module: PYTHON -u -m MODULE\n"
     "ARGS (PYTHON: see below)",
     0},
    {OPT_NO_PYTHON, "no-python", 0, NULL, "run the command itself, even a SCRIPT.py (its #!)", 0},
    {OPT_ROLE, "role", 0, "NAME", "the workers' ROLE_NAME (default 'default')", 0},
    {OPT_START_METHOD, "start-method", 0, "M",
     "accepted for torchrun (spawn, fork, forkserver):\n"
     "workers are always exec'd processes",
     0},
    {OPT_METRICS_DIR, "metrics-dir", 0, "DIR", "workers get TANDEM_METRICS=DIR/rank-R.jsonl", 0},
    {OPT_END_RECORD, "end-record", 0, "FILE",
     "write how this agent ended there, as JSON\n"
     "(outcome, exit codes, first failure, restarts);\n"
     "%n in FILE is this node's rank, as in Slurm's\n"
     "file patterns",
     0},
    {OPT_MONITOR_INTERVAL, "monitor-interval", 0, "S", "worker/store check period (default 0.1)",
     0},
    {OPT_GRACE, "grace", 0, "S", "SIGTERM->SIGKILL after a failure (default 2)", 0},
    {OPT_STOP_GRACE, "stop-grace", 0, "S",
     "SIGTERM->SIGKILL when the launcher is signalled\n(default 30)", 0},
    {OPT_RDZV_TIMEOUT, "rdzv-timeout", 0, "S", "how long nodes wait for each other (default 300)",
     0},
    {OPT_RDZV_LAST_CALL, "rdzv-last-call", 0, "S",
     "with N:M, extra wait for more nodes (default 3)", 0},
    {OPT_STALL_TIMEOUT, "stall-timeout", 0, "S",
     "fail/restart the group when a rank is stuck in a\n"
     "collective or a node agent is silent this long;\n"
     "0 = off (default TANDEM_STALL_TIMEOUT_MS: 120 s)",
     0},
    {OPT_MASTER_ADDR, "master-addr", 0, "HOST", "torchrun's static form of --rdzv-endpoint...", 0},
    {OPT_MASTER_PORT, "master-port", 0, "PORT", "...with this port (default 29500)", 0},
    {OPT_FORWARD_STDIO, "forward-stdio", 0, NULL,
     "node agent of an executor (ssh): stdout carries the\n"
     "rank logs and metrics, stdin the supervisor's\n"
     "requests (needs --log-dir; docs/executors.md)",
     0},
    {OPT_NODE_SETUP, "node-setup", 0, "CMD",
     "run CMD (/bin/sh -c) once on this node before its\n"
     "workers; repeatable, in order; output in\n"
     "LOG_DIR/node-setup-N.log (docs/launch.md)",
     CLI_REPEAT},
    {OPT_LINK, "link", 0, "HOST:PORT",
     "node agent of the Slurm executor without a shared\n"
     "file system: the same over a connection back to\n"
     "the supervisor (TANDEM_TOKEN; needs --log-dir)",
     0},
    {0},
};

/* The options end at the worker command (torchrun: the script); torchrun's underscore spellings
 * (--nproc_per_node) are accepted, and a repeated option takes the later value, as argparse
 * does. */
static const cli_command launch_cmd = {
    .name = "tandem launch",
    .usage = "[options] -- CMD ARGS...\n"
             "[options] SCRIPT.py ARGS...   (runs PYTHON -u SCRIPT.py ARGS)\n"
             "[options] -m MODULE ARGS...   (runs PYTHON -u -m MODULE ARGS)",
    .opts = launch_opts,
    .epilog = "PYTHON is the first of $TANDEM_PYTHON, $PYTHON_EXEC, $PYTHON, the active\n"
              "virtual environment's $VIRTUAL_ENV/bin/python3, and python3 on PATH.\n"
              "Given none of --nnodes/--node-rank/--rdzv-endpoint/--master-*/--standalone, the\n"
              "topology comes from the scheduler that started one launcher per node: Slurm\n"
              "(srun --ntasks-per-node=1), Open MPI (mpirun --map-by ppr:1:node\n"
              "-x MASTER_ADDR), SkyPilot, dstack, SageMaker (docs/launch.md);\n"
              "TANDEM_LAUNCH_DETECT=0 turns it off.\n"
              "Flags also accept torchrun's underscore spellings (--nproc_per_node) and\n"
              "--flag=value.\n"
              "Exit: 0 ok, 1 a worker failed, 2 usage, 130 SIGINT, 143 SIGTERM (workers\n"
              "checkpointed).\n",
    .flags = CLI_UNDERSCORES | CLI_STOP_AT_ARG,
};

static int parse_int(const char *flag, const char *s, int lo, int *out) {
    int64_t v;
    if (td_parse_i64(flag, s, &v) != TD_OK || v < lo || v > 1000000) {
        td_error_clear();
        return cli_error(&launch_cmd, "%s '%s': expected an integer >= %d", flag, s, lo);
    }
    *out = (int)v;
    return 0;
}

static int parse_secs(const char *flag, const char *s, double *out) {
    if (td_parse_f64(flag, s, out) != TD_OK || *out < 0) {
        td_error_clear();
        return cli_error(&launch_cmd, "%s '%s': expected seconds >= 0", flag, s);
    }
    return 0;
}

/* --nproc-per-node: torchrun's values, by the one rule (td_launch_nproc_resolve). */
static int parse_nproc(const char *flag, const char *val, int *out) {
    char note[512];
    if (td_launch_nproc_resolve(flag, val, td_gpu_device_count, out, note, sizeof note) != TD_OK) {
        int rc = cli_error(&launch_cmd, "%s", td_error_msg());
        td_error_clear();
        return rc;
    }
    if (note[0]) TD_LOG_INFO("%s", note);
    return 0;
}

static int check_std(const char *flag, const char *val) {
    int bits;
    if (td_launch_std_parse(val, 0, &bits) == TD_OK) return 0;
    char why[256];
    snprintf(why, sizeof why, "%s", td_error_msg());
    td_error_clear();
    return cli_error(&launch_cmd,
                     "%s '%s': %s; expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both) for every "
                     "local rank, or LOCAL_RANK:VALUE,... such as 0:3,1:2",
                     flag, val, why);
}

static int parse_nnodes(const char *s, td_launch_options *o) {
    char buf[64];
    snprintf(buf, sizeof buf, "%s", s);
    char *colon = strchr(buf, ':');
    if (colon) *colon = '\0';
    if (parse_int("--nnodes", buf, 1, &o->min_nodes)) return 2;
    o->max_nodes = o->min_nodes;
    if (colon && parse_int("--nnodes", colon + 1, o->min_nodes, &o->max_nodes)) return 2;
    return 0;
}

/* For an executor's agent: stop signals stay blocked to the end (td_launch_run reads them from
 * its signalfd, and one that arrives after it has returned must not kill the process before
 * the link's last bytes are sent), and a broken link is an EPIPE the sender reports. */
static void hold_stop_signals(void) {
    sigset_t stops;
    sigemptyset(&stops);
    sigaddset(&stops, SIGTERM);
    sigaddset(&stops, SIGINT);
    sigaddset(&stops, SIGHUP);
    sigprocmask(SIG_BLOCK, &stops, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* --forward-stdio: the link to the supervisor keeps stdin and stdout for itself (close-on-exec
 * copies), and 0 and 1 become /dev/null, so that neither a worker (which inherits them) nor a
 * stray printf can steal or corrupt a byte of it. Workers' output reaches the supervisor
 * through the rank logs only. */
static int open_link(td_launch_options *o, td_agent_link **link) {
    if (!o->log_dir) {
        fprintf(stderr, "tandem launch: --forward-stdio needs --log-dir (the rank logs are what "
                        "it forwards)\n");
        return 2;
    }
    int in = fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3),
        out = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (in < 0 || out < 0 || null_fd < 0 || dup2(null_fd, STDIN_FILENO) < 0 ||
        dup2(null_fd, STDOUT_FILENO) < 0) {
        perror("tandem launch: --forward-stdio");
        return 1;
    }
    close(null_fd);
    hold_stop_signals();
    o->out_fd = o->err_fd = STDOUT_FILENO; /* /dev/null now: the rank logs have every line */
    td_status st = td_agent_link_open(in, out, o->log_dir, o->metrics_dir, link);
    if (st != TD_OK) {
        td_error_print(st);
        return 1;
    }
    o->on_store = td_agent_link_store_port;
    o->on_note = td_agent_link_note;
    o->lost_nodes = td_agent_link_lost_nodes;
    o->executor_link = *link;
    return 0;
}

/* --link: as --forward-stdio, over TCP to the supervisor (once this node's rank is known).
 * The workers' lines reach it through the rank logs, and this launcher's own messages, once
 * the link is up, through LOG_DIR/node-N.log: the job's output file is on a disk the
 * supervisor cannot read. */
static int connect_link(td_launch_options *o, const char *endpoint, td_agent_link **link) {
    if (!o->log_dir) {
        fprintf(stderr, "tandem launch: --link needs --log-dir (the rank logs are what it "
                        "forwards)\n");
        return 2;
    }
    if (o->node_rank < 0) {
        fprintf(stderr, "tandem launch: --link needs this node's rank (--node-rank, or a "
                        "scheduler's variables such as SLURM_NODEID)\n");
        return 2;
    }
    hold_stop_signals();
    td_status st = td_mkdirs(o->log_dir);
    if (st == TD_OK && o->metrics_dir) st = td_mkdirs(o->metrics_dir);
    if (st == TD_OK)
        st = td_agent_link_connect(endpoint, o->node_rank, o->log_dir, o->metrics_dir, link);
    if (st != TD_OK) {
        td_error_print(st);
        return 1;
    }
    char *path = td_xasprintf("%s/node-%d.log", o->log_dir, o->node_rank);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    int null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (fd >= 0)
        TD_LOG_INFO("linked to the supervisor at %s; this launcher's messages go on in %s",
                    endpoint, path);
    if (fd < 0 || null_fd < 0 || dup2(fd, STDERR_FILENO) < 0 || dup2(null_fd, STDOUT_FILENO) < 0)
        TD_LOG_WARN("cannot write this launcher's messages to %s: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    if (null_fd >= 0) close(null_fd);
    free(path);
    o->out_fd = o->err_fd = STDOUT_FILENO; /* /dev/null: the rank logs have every line */
    o->on_note = td_agent_link_note;
    o->lost_nodes = td_agent_link_lost_nodes;
    o->executor_link = *link;
    return 0;
}

/* TANDEM_SYS_METRICS (set by the Slurm and ssh executors, whose supervisor cannot see this
 * machine's /proc): the agent samples its workers every SYS_PERIOD_S into
 * METRICS_DIR/sys-HOST.jsonl, which reaches the run store like the workers' metric files (the
 * shared run directory, or the agent link). The sample is a periodic timer on the agent's event
 * loop (td_launch_options.on_tick), in the agent's thread. */
#define SYS_PERIOD_S 2.0

typedef struct {
    td_sysmon *mon;
    char *path;
    double t0;
    bool failed; /* a sample could not be written: said once, not sampled any more */
} sys_sampler;

static void sys_sample(void *user) {
    sys_sampler *s = user;
    if (s->failed) return;
    if (td_sysmon_sample_to_file(s->mon, s->path, getpid(), s->t0) != TD_OK) {
        TD_LOG_WARN("system metrics: %s (not sampled any more)", td_error_msg());
        s->failed = true;
    }
    td_error_clear();
}

static void sys_sampler_start(sys_sampler *s, td_launch_options *o) {
    const char *t0 = td_var_get(TD_VAR_TANDEM_SYS_METRICS);
    if (!t0 || !*t0 || !o->metrics_dir) return;
    if (td_parse_f64(td_var_name(TD_VAR_TANDEM_SYS_METRICS), t0, &s->t0) != TD_OK) {
        td_error_print(TD_ERR_INVALID);
        return;
    }
    char host[256] = "node";
    gethostname(host, sizeof host - 1);
    for (char *c = host; *c; c++) /* a file name the agent link forwards */
        if (!isalnum((unsigned char)*c) && *c != '.' && *c != '-' && *c != '_') *c = '_';
    s->path = td_xasprintf("%s/sys-%s.jsonl", o->metrics_dir, host);
    s->mon = td_sysmon_new();
    o->on_tick = sys_sample;
    o->tick_user = s;
    o->tick_period_s = SYS_PERIOD_S;
}

static void sys_sampler_stop(sys_sampler *s) {
    td_sysmon_free(s->mon);
    free(s->path);
}

int cmd_launch(int argc, char **argv) {
    td_launch_options o;
    td_launch_options_init(&o);
    const char *master_addr = NULL, *master_port = "29500";
    char *endpoint_buf = NULL;
    char **cmd = NULL;
    int ncmd = 0, rc = 0;
    bool rdzv_flags = false; /* a flag that says where this node stands: no scheduler detection */
    bool forward = false;    /* --forward-stdio */
    const char *link_endpoint = NULL;       /* --link */
    bool module = false, no_python = false; /* -m, --no-python */
    char **setup = NULL;                    /* --node-setup, in order */
    int nsetup = 0;
    cli_parser p;
    cli_init(&p, &launch_cmd, argc, argv);
    for (int c; (c = cli_next(&p)) != CLI_END;) {
        const char *val = p.value, *flag = p.given;
        switch (c) {
        case CLI_EXIT:
            return p.exit_code;
        case OPT_FORWARD_STDIO:
            forward = true;
            break;
        case OPT_STANDALONE:
            o.standalone = true;
            rdzv_flags = true;
            break;
        case OPT_LINK:
            link_endpoint = val;
            break;
        case OPT_NNODES:
            rdzv_flags = true;
            rc = parse_nnodes(val, &o);
            break;
        case OPT_NPROC:
            rc = parse_nproc(flag, val, &o.nproc_per_node);
            break;
        case OPT_MODULE:
            module = true;
            break;
        case OPT_NO_PYTHON:
            no_python = true;
            break;
        case OPT_ROLE:
            if (!*val) rc = cli_error(&launch_cmd, "%s '': expected a name (ROLE_NAME)", flag);
            o.role = val;
            break;
        case OPT_START_METHOD: /* Python's multiprocessing start methods: nothing to start here */
            if (strcmp(val, "spawn") && strcmp(val, "fork") && strcmp(val, "forkserver"))
                rc = cli_error(&launch_cmd,
                               "%s '%s': expected spawn, fork or forkserver (torchrun's choices; "
                               "tandem execs every worker, so each means the same)",
                               flag, val);
            break;
        case OPT_REDIRECTS:
            rc = check_std(flag, val);
            o.redirects = val;
            break;
        case OPT_TEE:
            rc = check_std(flag, val);
            o.tee = val;
            break;
        case OPT_NODE_RANK:
            rdzv_flags = true;
            rc = parse_int(flag, val, 0, &o.node_rank);
            break;
        case OPT_RDZV_ENDPOINT:
            rdzv_flags = true;
            o.rdzv_endpoint = val;
            break;
        case OPT_RDZV_ID:
            o.rdzv_id = val;
            break;
        case OPT_RDZV_BACKEND: /* c10d / static: both mean "the store at the endpoint" here */
            break;
        case OPT_MAX_RESTARTS:
            rc = parse_int(flag, val, 0, &o.max_restarts);
            break;
        case OPT_RESTARTS_BEFORE:
            rc = parse_int(flag, val, 0, &o.restarts_before);
            break;
        case OPT_LOG_DIR:
            o.log_dir = val;
            break;
        case OPT_METRICS_DIR:
            o.metrics_dir = val;
            break;
        case OPT_END_RECORD:
            o.end_record = val;
            break;
        case OPT_MONITOR_INTERVAL:
            rc = parse_secs(flag, val, &o.monitor_interval_s);
            if (!rc && o.monitor_interval_s <= 0) o.monitor_interval_s = 0.1;
            break;
        case OPT_GRACE:
            rc = parse_secs(flag, val, &o.grace_s);
            break;
        case OPT_STOP_GRACE:
            rc = parse_secs(flag, val, &o.stop_grace_s);
            break;
        case OPT_RDZV_TIMEOUT:
            rc = parse_secs(flag, val, &o.rdzv_timeout_s);
            break;
        case OPT_RDZV_LAST_CALL:
            rc = parse_secs(flag, val, &o.last_call_s);
            break;
        case OPT_STALL_TIMEOUT:
            rc = parse_secs(flag, val, &o.stall_timeout_s);
            break;
        case OPT_MASTER_ADDR:
            rdzv_flags = true;
            master_addr = val;
            break;
        case OPT_MASTER_PORT:
            rdzv_flags = true;
            master_port = val;
            break;
        case OPT_NODE_SETUP:
            setup = td_xrealloc(setup, (size_t)(nsetup + 1) * sizeof *setup);
            setup[nsetup++] = (char *)val;
            break;
        }
        if (rc) {
            free(setup);
            return rc;
        }
    }
    int i = p.next; /* the worker command */
    if (i >= argc) {
        cli_error(&launch_cmd, "no worker command (tandem launch [options] -- CMD ARGS...)");
        free(setup);
        return 2;
    }
    /* Flags win over the environment, all or nothing: half a topology from each would be
     * neither what the scheduler nor what the user said. --rdzv-id still names the run. */
    td_launch_detected det;
    if (!rdzv_flags) {
        td_status dst = td_launch_detect(environ, &det);
        if (dst != TD_OK) {
            td_error_print(dst);
            free(setup);
            return 2;
        }
        if (det.scheduler) {
            char line[600];
            td_launch_detected_apply(&det, &o);
            td_launch_detected_describe(&det, line, sizeof line);
            TD_LOG_INFO("%s", line);
        }
    }
    if (!o.rdzv_endpoint && master_addr && o.max_nodes > 1)
        o.rdzv_endpoint = endpoint_buf = td_xasprintf("%s:%s", master_addr, master_port);

    /* torchrun runs PYTHON -u [-m] SCRIPT ARGS (unbuffered: the lines reach us as written), or
     * with --no-python the command itself. It does so for any command; tandem for a module and
     * a SCRIPT.py, executable or not (its #! could name another Python), and runs anything else
     * itself: `tandem launch -- tandem train ...` needs no flag. */
    if (module && no_python) {
        cli_error(&launch_cmd, "-m/--module runs PYTHON -m MODULE, --no-python runs the command "
                               "itself: give one (torchrun refuses both too)");
        free(setup);
        free(endpoint_buf);
        return 2;
    }
    size_t len = strlen(argv[i]);
    bool with_python = module || (!no_python && len > 3 && !strcmp(argv[i] + len - 3, ".py"));
    char *python = NULL;
    if (with_python) {
        const char *source = NULL;
        if (td_launch_find_python(&python, &source) != TD_OK) {
            cli_error(&launch_cmd, "%s%s needs a Python interpreter: %s", module ? "-m " : "",
                      argv[i], td_error_msg());
            td_error_clear();
            free(setup);
            free(endpoint_buf);
            return 2;
        }
        TD_LOG_DEBUG("workers run %s (from %s)", python, source);
    }
    cmd = td_xcalloc((size_t)(argc - i + 4), sizeof *cmd);
    if (python) {
        cmd[ncmd++] = python; /* as found, so that a virtual environment's python3 knows it */
        cmd[ncmd++] = (char *)"-u";
        if (module) cmd[ncmd++] = (char *)"-m";
    }
    for (int j = i; j < argc; j++) cmd[ncmd++] = argv[j];
    o.argc = ncmd;
    o.argv = cmd;
    o.node_setup = setup;
    o.nnode_setup = nsetup;

    int exit_code = 1;
    td_agent_link *link = NULL;
    if (forward && link_endpoint) {
        fprintf(stderr, "tandem launch: --forward-stdio and --link are two ways to the same "
                        "supervisor; give one\n");
        rc = 2;
    } else if (forward) {
        rc = open_link(&o, &link);
    } else if (link_endpoint) {
        rc = connect_link(&o, link_endpoint, &link);
    }
    if (rc != 0) {
        free(cmd);
        free(python);
        free(setup);
        free(endpoint_buf);
        return rc;
    }
    /* The end record: a %n in its path is this node's rank; linked to a remote supervisor, it
     * goes as the link closes to the supervisor's RUN/end/node-N.json. */
    char *end_path = NULL;
    const char *n_at = o.end_record ? strstr(o.end_record, "%n") : NULL;
    if (n_at) { /* one command line for every node (srun): the rank names the file */
        if (o.node_rank < 0) {
            fprintf(stderr,
                    "tandem launch: --end-record %s: %%n needs this node's rank "
                    "(--node-rank, or a scheduler's SLURM_NODEID)\n",
                    o.end_record);
            if (link) td_agent_link_close(link);
            free(cmd);
            free(python);
            free(endpoint_buf);
            free(setup);
            return 2;
        }
        end_path = td_xasprintf("%.*s%d%s", (int)(n_at - o.end_record), o.end_record, o.node_rank,
                                n_at + 2);
        o.end_record = end_path;
    }
    /* linked to a remote supervisor: by default beside the logs, sent as the link closes */
    bool end_default = link && !o.end_record && o.node_rank >= 0 && o.log_dir;
    if (end_default)
        o.end_record = end_path = td_xasprintf("%s/../end/node-%d.json", o.log_dir, o.node_rank);
    if (o.end_record) { /* its directory, as for --log-dir */
        char *dir = td_xstrdup(o.end_record), *slash = strrchr(dir, '/');
        if (slash && slash != dir) *slash = '\0';
        if (slash && slash != dir && td_mkdirs(dir) != TD_OK) {
            if (end_default) { /* not the user's path: go on without a record */
                TD_LOG_WARN("no end record for the supervisor: %s", td_error_msg());
                o.end_record = NULL;
            }
            td_error_clear(); /* else launch names the problem */
        }
        free(dir);
    }
    sys_sampler sys = {0};
    sys_sampler_start(&sys, &o);
    td_status st = td_launch_run(&o, &exit_code);
    sys_sampler_stop(&sys);
    if (st != TD_OK) {
        td_error_print(st);
        if (st == TD_ERR_USAGE) exit_code = 2;
    }
    if (link && o.end_record) {
        char name[64];
        snprintf(name, sizeof name, "end/node-%d.json", o.node_rank);
        td_agent_link_end_record(link, name, o.end_record);
    }
    if (link && td_agent_link_close(link) != TD_OK) td_error_print(TD_ERR_IO);
    free(end_path);
    free(cmd);
    free(python);
    free(endpoint_buf);
    free(setup);
    return exit_code;
}
