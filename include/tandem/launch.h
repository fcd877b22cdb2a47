/* tandem launch: a torchrun-compatible launcher.
 *
 * One agent per node. The agents meet at a rendezvous store (comm's TCP store, hosted by the
 * node-0 agent, or by this agent on 127.0.0.1 when standalone), agree on the node set and each
 * node's global rank offset, and spawn nproc_per_node workers each with the torchrun environment
 * (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...) plus tandem's own TANDEM_* keys
 * that td_pg_init_from_env reads. Worker output is line-prefixed "[rank N] ". The first worker
 * failure on any node tears the whole group down (SIGTERM, SIGKILL after a grace period) and is
 * named as the root cause; with max_restarts the group restarts under a fresh store namespace.
 *
 * Process-wide effects while td_launch_run runs: it blocks SIGCHLD, SIGTERM, SIGINT and SIGHUP in
 * the calling thread (and so in threads it starts) and reads them through a signalfd, ignores
 * SIGPIPE, and reaps only its own children by pid. The previous mask and SIGPIPE disposition are
 * restored before it returns. Call it from the main thread of a process whose other threads
 * block those signals too (or have none), or SIGTERM may hit another thread.
 */
#ifndef TANDEM_LAUNCH_H
#define TANDEM_LAUNCH_H

#include <stdbool.h>

#include "tandem/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int min_nodes; /* --nnodes N or N:M (default 1:1) */
    int max_nodes;
    int nproc_per_node;        /* workers on this node (default 1) */
    int node_rank;             /* -1 = not given: ranks follow arrival order at the store */
    const char *rdzv_endpoint; /* "host:port" of the store; NULL = standalone */
    const char *rdzv_id; /* job id shared by all nodes; NULL = "none" (random when single-node) */
    bool standalone;     /* host a private store on 127.0.0.1 (single node) */
    int max_restarts;    /* whole-group restarts after a failure (default 0) */
    int restarts_before; /* the group's restarts made before this launcher started (the Slurm
                            batch script's new step after a launcher was lost): its first attempt
                            is restart K, resumes, and counts against max_restarts (default 0) */
    const char *log_dir; /* NULL or DIR: also append each worker's lines to DIR/rank-R.log */
    const char *metrics_dir; /* NULL or DIR: workers get TANDEM_METRICS=DIR/rank-R.jsonl */
    const char *end_record;  /* NULL or FILE: how this agent ended, as a typed record (endrec.h) */
    double monitor_interval_s; /* child / store check period (default 0.1) */
    double grace_s;            /* SIGTERM -> SIGKILL after a failure (default 2) */
    double stop_grace_s;       /* SIGTERM -> SIGKILL after the launcher is signalled (default 30) */
    double rdzv_timeout_s;     /* how long agents wait for each other (default 300) */
    double last_call_s;        /* with N:M, extra wait for more nodes after N arrived (default 3) */
    double stall_timeout_s;    /* fail (or restart) a group whose collectives are stuck this long,
                                  or whose node agent is silent this long; 0 = off (default
                                  TANDEM_STALL_TIMEOUT_MS / 1000 = 120; docs/launch.md, "Stalls") */
    int argc;                  /* the worker command */
    char *const *argv;
    int out_fd; /* where prefixed worker stdout / stderr go (default 1 / 2) */
    int err_fd;
    /* Called once this agent hosts the rendezvous store (node rank 0 of a multi-node job), with
     * its port: an --rdzv-endpoint with port 0 binds any free port, and the caller tells the
     * other nodes (td_agent_link_store_port). NULL: nobody needs to know. */
    void (*on_store)(void *user, int port);
    /* How many other node agents the executor knows are gone (it saw their connection end):
     * the store host's exit barrier stops waiting for them. NULL: none known. */
    int (*lost_nodes)(void *user);
    /* Tells the supervisor a fact as a mirror note ("interrupted", "terminate 2026-...Z": the
     * spot watch, TANDEM_SPOT_WATCH), from the agent's thread (td_agent_link_note). NULL:
     * nobody listens. */
    void (*on_note)(void *user, const char *key, const char *value);
    void *executor_link; /* the user of these (a td_agent_link) */
    /* The caller's periodic work, every tick_period_s seconds (> 0) on the agent's event loop:
     * in its thread, between its own callbacks, so it must be short. It runs from the first
     * workers' start to the end, restarts and their waits included (not while the agents meet:
     * there is nothing to look at then). `tandem launch` samples its workers' system metrics
     * with it (TANDEM_SYS_METRICS). NULL: none. */
    void (*on_tick)(void *user);
    void *tick_user;
    double tick_period_s;
    /* --node-setup: commands run once on this node before it joins the group and starts its
     * workers (a workflow's node_setup: packages, a build), each with /bin/sh -c in our
     * directory and environment, their output in LOG_DIR/node-setup-N.log (N: this node's rank,
     * or its host name while that is unknown) and on err_fd. A failing one ends the agent
     * (exit 1, its cause in the end record); a stop signal ends it with no workers started. */
    char *const *node_setup;
    int nnode_setup;
    /* torchrun's --role: the workers' ROLE_NAME (NULL or "": "default"). A job has one role, so
     * ROLE_RANK and ROLE_WORLD_SIZE are RANK and WORLD_SIZE; give every node the same. */
    const char *role;
    /* torchrun's --redirects and --tee (td_launch_std_parse: "0".."3" for every local rank, or
     * "LOCAL_RANK:VALUE,..."; NULL = "0"): a redirected stream of a worker goes to a file only,
     * a teed one to the file and, prefixed, to out_fd/err_fd as usual. The files are torchrun's:
     * BASE/<run id>_XXXXXX/attempt_<restart>/<local rank>/stdout.log and stderr.log, BASE being
     * log_dir, or a new directory under $TMPDIR without it. The raw bytes the worker wrote. */
    const char *redirects;
    const char *tee;
} td_launch_options;

/* ---- torchrun's flags that need more than a field (src/launch/torchrun.c) ---- */
enum { TD_LAUNCH_STD_OUT = 1, TD_LAUNCH_STD_ERR = 2 };
/* What a --redirects / --tee value means for one local rank: *out gets TD_LAUNCH_STD_* bits.
 * The value is torchrun's: "0" none, "1" stdout, "2" stderr, "3" both, for every local rank; or
 * "LOCAL_RANK:VALUE,..." ("0:3,1:2"), ranks not listed get 0, a rank given twice its later value
 * (torchrun's dict; it takes one-digit ranks only, any number works here). TD_ERR_INVALID with
 * a message saying what is wrong and what is accepted. */
td_status td_launch_std_parse(const char *spec, int local_rank, int *out);
/* The GPUs a CUDA program started here sees: ndevices (the driver's) as CUDA_VISIBLE_DEVICES
 * (cvd; NULL = unset: all of them) narrows them. CUDA's reading: comma-separated indices or
 * UUIDs (GPU-..., MIG-...), up to the first entry that names no device (an index out of range,
 * -1, a repeat, anything else): "0,2,-1,1" sees 2; "" sees none. */
int td_launch_visible_gpus(const char *cvd, int ndevices);
/* NVIDIA GPUs the driver shows this machine (its /proc/driver/nvidia/gpus entries: no library
 * to load, nothing initialised); 0 without the driver. */
int td_launch_driver_gpus(void);
/* torchrun's worker counts (torch/distributed/run.py, determine_local_world_size), the one rule
 * for every place a count is taken (tandem launch --nproc-per-node, a workflow's nproc_per_node,
 * tandem run --nproc-per-node): a number; gpu, one worker per GPU visible here and an error
 * without one; cpu, one per core; auto, gpu where a GPU is visible, else cpu. A core is one
 * this process may run on (its affinity), where torchrun's os.cpu_count() counts the machine's.
 * cuda_count (NULL: none) is CUDA's device count where the caller has CUDA; without it, the
 * driver's GPUs as CUDA_VISIBLE_DEVICES narrows them. *note (may be NULL) gets what was counted
 * ("--nproc-per-node auto: 8 workers, one per core (no NVIDIA driver ...)"), "" for a number.
 * TD_ERR_USAGE naming what (the flag or field), the value and what is accepted. */
bool td_launch_nproc_is_spec(const char *val); /* gpu, auto or cpu */
td_status td_launch_nproc_resolve(const char *what, const char *val, int (*cuda_count)(void),
                                  int *out, char *note, size_t cap);
/* The Python that runs a worker script (SCRIPT.py, or -m MODULE), torchrun's sys.executable for a
 * launcher that is not Python itself: the first of $TANDEM_PYTHON (a Python entry point sets it
 * to its own interpreter), $PYTHON_EXEC (torchrun's override), $PYTHON, the active virtual
 * environment's $VIRTUAL_ENV/bin/python3, and python3 on PATH. A name without '/' is looked up
 * on PATH. *path (malloc'ed) is the path the workers exec and get as argv[0], never a resolved
 * symlink (a virtual environment's python3 is one, and Python finds its environment from that
 * path); *source (may be NULL) names the rule ("PYTHON", "VIRTUAL_ENV", "PATH"). TD_ERR_NOTFOUND
 * naming the variable and the fix when the chosen one is no executable file, or none is found. */
td_status td_launch_find_python(char **path, const char **source);

/* Fills the defaults above; the caller then sets argc/argv and whatever else it needs. */
void td_launch_options_init(td_launch_options *opts);

/* Runs the job to completion (all restarts included). *exit_code gets what `tandem launch`
 * exits with: 0 all workers succeeded, 1 a worker failed (root cause logged), 130 interrupted by
 * SIGINT, 143 stopped by SIGTERM with every worker exiting 143 (checkpointed) or 0.
 * Returns an error status (with *exit_code 1, or 2 for TD_ERR_USAGE) when the launcher itself
 * cannot run the job: bad options, rendezvous timeout, a command that cannot be executed. */
td_status td_launch_run(const td_launch_options *opts, int *exit_code);

/* ---- the node agent's link to an executor's supervisor (tandem launch --forward-stdio) ----
 * An executor that starts agents over ssh (src/exec/ssh.c) shares no file system with them: it
 * reads each agent's stdout as a mirror stream (tandem/mirror.h) carrying the rank logs and
 * metric files this agent writes under --log-dir and --metrics-dir, and writes to its stdin:
 *   token HEX            first (optional): TANDEM_TOKEN, kept off command lines and out of ps
 *   secret NAME HEX      a secret of the job (exec.h), HEX its value's bytes: set in the agent's
 *                        environment and so its workers'; a malformed one is refused, naming
 *                        NAME only
 *   have NAME SIZE       what the supervisor's copies hold already (its manifest), then
 *   go                   start
 *   stop                 later, any time: as a SIGTERM to this agent (workers checkpoint)
 *   lost NODE            node NODE's agent is gone (its connection ended): do not wait for
 *                        it to check out at the end
 * End of file on stdin (the supervisor or its connection is gone) also stops the job like a
 * SIGTERM: an agent never trains on alone. A link that breaks the other way (EPIPE) likewise.
 * A thread of its own does the sending, so a slow link never holds up the agent's loop. */
typedef struct td_agent_link td_agent_link;
/* Reads the opening lines from in_fd (TD_ERR_IO when it ends before "go", TD_ERR_FORMAT for a
 * line it does not know), sets TANDEM_TOKEN when given, and starts the sender on out_fd. Call
 * it before td_launch_run, from the thread that will call it: the sender thread blocks the
 * signals the agent reads through its signalfd. */
td_status td_agent_link_open(int in_fd, int out_fd, const char *log_dir, const char *metrics_dir,
                             td_agent_link **out);
/* The same link over TCP (tandem launch --link HOST:PORT; the Slurm executor without a shared
 * file system): connects to the supervisor, proves the run's token (TANDEM_TOKEN, from the
 * job's environment) both ways (td_mirror_auth_connect), says "hello NODE FIRST", and reads the
 * opening as above, which may also hold
 *   code SIZE\n<SIZE bytes>  the run's code as a tar stream, unpacked into the working directory
 *   artifact GLOB           files to send back as whole files (work/PATH) when the job ends
 * The first dial is retried with backoff (0.1 s doubling to 2 s, jittered) until the connect
 * timeout, through a refused connection, a timeout, a handshake cut short and a temporary DNS
 * failure (not a wrong token, nor a name that does not resolve). A connection that drops does not
 * stop the job: the files wait on this node's disk, the link is dialled again every 2 s (and for
 * 20 s at the end) and the mirror sends from the new manifest, so nothing is lost or sent twice. */
td_status td_agent_link_connect(const char *endpoint, int node, const char *log_dir,
                                const char *metrics_dir, td_agent_link **out);
/* A td_launch_options.on_store for the link: tells the supervisor "store_port PORT". */
void td_agent_link_store_port(void *link, int port);
/* A td_launch_options.on_note for the link: "tdm note KEY VALUE" on its stream. */
void td_agent_link_note(void *link, const char *key, const char *value);
/* A td_launch_options.lost_nodes for the link: the "lost NODE" lines the supervisor sent. */
int td_agent_link_lost_nodes(void *link);
/* The agent's end record (endrec.h) at path: sent whole as NAME ("end/node-N.json") as the link
 * closes, after the artifacts, so the supervisor reads it as it reads a local agent's. */
void td_agent_link_end_record(td_agent_link *link, const char *name, const char *path);
/* Sends what is left, the artifacts, and "end" (the supervisor then knows nothing is missing),
 * and frees. */
td_status td_agent_link_close(td_agent_link *link);

/* ---- topology from the scheduler's environment (src/launch/detect.c) ----
 * `tandem launch` given no rendezvous flag (--nnodes, --node-rank, --rdzv-endpoint,
 * --master-addr/--master-port, --standalone) takes the node count, this node's rank, node 0's
 * address and a run id from the scheduler that started it: Open MPI (mpirun), Slurm (srun),
 * SkyPilot, dstack, SageMaker, the first found in that order. docs/launch.md ("Inside a
 * scheduler") lists the variables each one reads. TANDEM_LAUNCH_DETECT=0 turns it off. */
typedef struct {
    const char *scheduler; /* "Slurm", "Open MPI", "SkyPilot", "dstack", "SageMaker"; NULL: none */
    int nnodes;            /* nodes in the job, >= 1 */
    int node_rank;         /* this node, 0 .. nnodes-1 */
    char host[256];        /* node 0's address, where the store runs; "" for one node */
    int port;              /* the store's port, the same on every node; 0 for one node */
    char endpoint[272];    /* "host:port" ("[v6]:port"); "" for one node (standalone) */
    char run_id[128];      /* the same on every node of the job: "slurm-<job>.<step>", ... */
} td_launch_detected;

/* Reads envp (a NULL-terminated "NAME=value" array, e.g. environ). TD_OK with
 * out->scheduler == NULL when no scheduler's variables are there (or TANDEM_LAUNCH_DETECT=0).
 * TD_ERR_USAGE when they are there but a variable is missing or disagrees with another (a
 * launcher started twice on a node, a rank beyond the node count): the message names the
 * variables, their values and the fix. */
td_status td_launch_detect(char *const *envp, td_launch_detected *out);
/* Sets opts' topology from det (nothing when det->scheduler is NULL): min/max nodes, node_rank,
 * rdzv_endpoint (pointing into det, which must outlive opts) or standalone for one node, and
 * rdzv_id unless the caller set one. nproc_per_node and the rest stay. */
void td_launch_detected_apply(const td_launch_detected *det, td_launch_options *opts);
/* The line `tandem launch` logs: "topology from Slurm: node 1 of 2, rendezvous tdnode1:23456,
 * run id slurm-123456.0". */
void td_launch_detected_describe(const td_launch_detected *det, char *buf, size_t nbytes);
/* Expands a Slurm hostlist ("tdnode[1-3,5]", "a[01-03]b", "r[1-2]n[1-2]") into host names in the
 * order `scontrol show hostnames` prints them. *hosts is freed with td_hostlist_free.
 * TD_ERR_INVALID naming the spot when the list is malformed. */
td_status td_hostlist_expand(const char *hostlist, char ***hosts, int *count);
void td_hostlist_free(char **hosts, int count);

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_LAUNCH_H */
