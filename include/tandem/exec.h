/* tandem exec: the executors that run a tracked run's job and supervise it to its end: on this
 * machine (local, the default: `tandem launch` child processes), on ssh hosts, or through Slurm.
 *
 * `tandem run` (the workflow layer) does what every executor shares before the job: it creates
 * or resumes the run (id, directory, run.json, lock), prepares RUN/work, computes the workers'
 * environment and runs the setup commands. It then hands the job to an executor of this layer.
 * Each is one carrier driven by one supervisor (src/exec/supervisor.h): the supervisor owns the
 * stop, preemption and restart decisions, the deadlines, the metrics ingest and the record of how
 * the run ended (status, exit code, note, artifacts, logs); the carrier starts and stops the
 * nodes and says how they ended. docs/executors.md describes them.
 *
 * This layer sits below workflow (it links track and core only), so an executor sees a job as
 * the plain values below, never a td_workflow. */
#ifndef TANDEM_EXEC_H
#define TANDEM_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "tandem/core.h"
#include "tandem/os.h"
#include "tandem/track.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Slurm's part of a workflow (`slurm:` in a workflow file) ---- */
#define TD_SLURM_SIGNAL_LEAD_DEFAULT_S 60.0
/* Slurm's own bound on --signal's time (a 16-bit field). */
#define TD_SLURM_SIGNAL_LEAD_MAX_S 65535.0

typedef struct td_slurm_options {
    char *partition;      /* --partition; NULL: the cluster's default partition */
    char *account;        /* --account; NULL: the user's default account */
    double time_limit_s;  /* --time; 0: the partition's default limit */
    double signal_lead_s; /* the time-limit signal comes this long before the limit; 0: 60 s */
    char **sbatch_args;   /* more sbatch options, given after tandem's own (so they win) */
    size_t nsbatch_args;
    /* Set: the nodes do not share this machine's run directory. Each keeps its copy of the run
     * under work_dir/RUN_ID (absolute, on the nodes); the code, logs, metrics and artifacts
     * travel over a connection each node's agent opens back to tandem run (docs/executors.md). */
    char *work_dir;
    char *link_host; /* how the nodes reach this machine; NULL: its host name */
    /* GPUs the job asks for on each node (#SBATCH --gres=gpu:N): set by td_slurm_count_nproc
     * when nproc_per_node: gpu or auto counted the partition's GPUs, so that the workers the
     * run records are given the GPUs they were counted from; 0: none asked */
    int gpus_per_node;
} td_slurm_options;

void td_slurm_options_copy(td_slurm_options *dst, const td_slurm_options *src);
void td_slurm_options_clear(td_slurm_options *o);
/* nproc_per_node: gpu|auto|cpu (torchrun's words) for executor slurm, counted on the cluster
 * before the job is submitted, as executor ssh counts on its hosts: the nodes the job may get
 * (sinfo: the partition, slurm.partition or the default one, with a --partition, --nodelist or
 * --constraint of slurm: sbatch_args) with tandem launch's rule applied to what Slurm says each
 * has (gpu: its GRES gpu count, refused naming the partition when it has none; cpu: its CPUs;
 * auto: gpu where it has GPUs, else cpu). The run records one count per node, so the nodes must
 * agree: TD_ERR_USAGE naming two that differ. A count of GPUs sets o->gpus_per_node. *out the
 * count, note (nbytes) what was counted ("auto: 2 workers, one per GPU of partition gpu's 4
 * nodes (GRES gpu:a100:2)"). TD_ERR_NOTFOUND without sinfo or without nodes. */
td_status td_slurm_count_nproc(td_slurm_options *o, const char *spec, int *out, char *note,
                               size_t nbytes);

/* Slurm's --time formats with a ':' or a '-', to seconds: "M:S", "H:M:S", "D-H", "D-H:M",
 * "D-H:M:S" (and "M", which the workflow parser refuses before it gets here: Slurm reads a
 * plain number as minutes, tandem's durations as seconds). TD_ERR_INVALID naming `what` and the
 * value. */
td_status td_slurm_parse_time(const char *what, const char *text, double *seconds_out);

/* ---- ssh's part of a workflow (`ssh:` in a workflow file) ---- */
typedef struct td_ssh_options {
    char **hosts; /* node i runs on hosts[i]: "host", "user@host", "host:port", "user@host:port" */
    size_t nhosts;
    char *hostfile;  /* or: one host per line ('#' comments), relative to the project */
    char *work_dir;  /* on each host, where runs go (RUN_ID below it); NULL: ~/.tandem-runs */
    char **ssh_args; /* more ssh options before the host (-i KEY, -F CONFIG, -o ...) */
    size_t nssh_args;
    char *tandem;    /* tandem on the hosts; NULL: this tandem's absolute path */
    char *rdzv_host; /* how the hosts reach node 0; NULL: hosts[0]'s host part */
} td_ssh_options;

void td_ssh_options_copy(td_ssh_options *dst, const td_ssh_options *src);
void td_ssh_options_clear(td_ssh_options *o);
/* The hosts of o: o->hosts, or the hostfile's lines (relative to project_dir). TD_ERR_INVALID or
 * TD_ERR_IO naming the file and line when it has none or a malformed one. Free with
 * td_ssh_hosts_free. */
td_status td_ssh_hosts(const td_ssh_options *o, const char *project_dir, char ***hosts,
                       size_t *count);
void td_ssh_hosts_free(char **hosts, size_t count);
/* nproc_per_node: gpu|auto|cpu (torchrun's words) for executor ssh, counted where the workers
 * run: on every host, by the one rule (td_launch_nproc_resolve, through the host's tandem
 * launch), with cuda_visible (the workflow's env: CUDA_VISIBLE_DEVICES, or NULL) in its
 * environment. The run records one count per node, so the hosts must agree: TD_ERR_USAGE naming
 * two that differ, TD_ERR_PEER or TD_ERR_IO naming a host that could not count. *out the count,
 * note (nbytes) what the first host said of it ("auto: 8 workers, one per core ..."). */
td_status td_ssh_count_nproc(const td_ssh_options *o, const char *project_dir,
                             const char *tandem_bin, const char *spec, const char *cuda_visible,
                             int *out, char *note, size_t nbytes);
/* Checks one host entry ("user@host:port"): TD_ERR_INVALID naming it when it is empty, has
 * spaces or a shell metacharacter, or a bad port. */
td_status td_ssh_host_check(const char *what, const char *host);

/* ---- aws's part of a workflow (`aws:` in a workflow file; docs/cloud.md) ----
 * The instances the aws executor creates for a run, one per node, and how it reaches them. */
typedef struct td_aws_tag_kv {
    char *key, *value;
} td_aws_tag_kv;

typedef struct td_aws_options {
    char *region;          /* NULL: AWS_REGION, AWS_DEFAULT_REGION, the profile's */
    char *profile;         /* NULL: AWS_PROFILE, else default */
    char **instance_types; /* tried in order on capacity errors; [0] is instance_type */
    size_t ninstance_types;
    char *image;    /* AMI id (ami-...) */
    char *key_name; /* the EC2 key pair the instances get */
    char *ssh_key;  /* the private key of key_name, on this machine (ssh -i) */
    char *user;     /* the image's login user; NULL: "ubuntu" */
    char **subnets; /* tried in order on capacity errors; NULL: the default VPC's */
    size_t nsubnets;
    char **security_groups; /* ids (sg-...) */
    size_t nsecurity_groups;
    int spot;               /* 1: spot instances */
    char *max_price;        /* spot: USD per hour; NULL: up to the on-demand price */
    int fallback_on_demand; /* spot refused everywhere: on demand */
    int volume_gb;          /* root volume; 0: the image's */
    char *root_device;      /* NULL: /dev/sda1 (Ubuntu, Debian); Amazon Linux: /dev/xvda */
    char *iam_instance_profile;
    char *prices; /* on-demand prices over tandem's table: lines "REGION TYPE USD_PER_HOUR" */
    td_aws_tag_kv *tags; /* more tags on the instances */
    size_t ntags;
    char **setup; /* run over ssh on each new instance, in the code's copy, before tandem is
                     looked for there (an image without tandem installs it) */
    size_t nsetup;
    char *work_dir;     /* on the instances; NULL: ~/.tandem-runs */
    char *tandem;       /* tandem on the instances; NULL: this tandem, shipped (exec/bundle.h) */
    int public_address; /* reach the instances at their public address (default: public when
                           they have one, else private); -1 private, 1 public, 0 auto */
    /* `resources:` (instead of instance_type): the cheapest type of the region that has at
     * least these is chosen at the start (aws_choose.c); 0 / NULL: no requirement */
    struct {
        int set;
        double cpu;            /* vCPUs */
        double memory_gib;
        int gpu;               /* GPUs */
        char *gpu_model;       /* "A10G", "T4", "H100" (EC2's name for it, any case) */
        double gpu_memory_gib; /* per GPU */
        int disk_gib;          /* the root volume (volume_gb when that is not given) */
        char *arch;            /* "x86_64" (NULL: the default), "arm64" or "any" */
        /* nproc_per_node: gpu|cpu|auto (set by td_aws_count_nproc, not the workflow file):
         * only types on which that word counts nproc_count workers are chosen (any count but
         * none when nproc_count is 0), so that the run's one count per node holds on every
         * instance, a capacity fallback's or a replacement's too */
        char nproc_spec[8];
        int nproc_count;
    } resources;
    char **zones; /* aws.zones: the zones allowed (NULL: any); spot: the cheapest of them */
    size_t nzones;
    /* aws.controller (tandem run -d, controller.c): its instance type (NULL: t3.micro) and
     * instance profile (NULL: iam_instance_profile; none: the submitter's credentials go with
     * it, in a private file) */
    char *controller_type;
    char *controller_profile;
    double orphan_timeout_s; /* the dead-man's switch: an instance that has not heard from its
                                supervisor this long shuts itself down (terminated); 0: the
                                default, TD_AWS_ORPHAN_TIMEOUT_S of cloud.h */
} td_aws_options;

void td_aws_options_copy(td_aws_options *dst, const td_aws_options *src);
/* nproc_per_node: gpu|auto|cpu for executor aws, counted before any instance exists from the
 * instance type, as EC2's catalog (DescribeInstanceTypes) gives it, by tandem launch's rule
 * (td_launch_nproc_resolve): gpu its GPUs (TD_ERR_USAGE naming the type and the fix when it has
 * none), cpu its vCPUs, auto gpu when it has GPUs, else cpu. aws.instance_types (tried in turn)
 * must agree: TD_ERR_USAGE naming two that differ. With aws.resources, the type the choice
 * makes now (aws_choose.c) among those where the word counts, and o->resources.nproc_spec and
 * nproc_count are set so that the run's own choice keeps that count. *out the count, note
 * (nbytes) what was counted ("auto: 4 workers, one per GPU of g5.12xlarge (4 x A10G)"). */
td_status td_aws_count_nproc(td_aws_options *o, const char *spec, int *out, char *note,
                             size_t nbytes);

/* tandem run --dry-run of an aws workflow (aws_plan.c): the instances, market, region and
 * subnets, the hourly price (spot: EC2's now; on demand: aws.prices or tandem's table) and an
 * estimate (with max_duration, else per hour), what would be created and the permissions
 * needed, printed to out. Read-only calls only: nothing is created. */
typedef struct td_aws_plan_in {
    const td_aws_options *aws;
    const char *workflow;
    int nodes, nproc_per_node;
    double max_duration_s; /* 0: none */
    int s3;                /* checkpoints or artifacts in S3 */
    const char *nproc_note; /* how nproc_per_node was counted (gpu|cpu|auto), or NULL */
} td_aws_plan_in;
td_status td_aws_plan(const td_aws_plan_in *in, FILE *out);
void td_aws_options_clear(td_aws_options *o);

/* ---- a job, as `tandem run` hands it to an executor ---- */
struct td_loop; /* loop.h: the supervisor's event loop */
typedef struct td_exec_job {
    td_rundb *store;
    const td_run *run;      /* created or resumed, and locked, by tandem run */
    const char *work_dir;   /* RUN/work, prepared: the commands' working directory */
    const char *script;     /* what each worker runs with /bin/sh -c */
    const char *tandem_bin; /* this tandem, absolute: the nodes run it from the shared file
                             * system */
    char *const *env;       /* the workers' environment as the local executor computes it: ours
                             * plus the run's variables (NULL-terminated "KEY=VALUE") */
    char *const *env_named; /* the names the workflow's env: sets (NULL-terminated, or NULL):
                             * they reach remote nodes even where our value is the same */
    int max_restarts;       /* tandem launch --max-restarts */
    double max_duration_s;  /* 0: no limit; exceeded: stopped */
    const char *const *artifacts; /* globs relative to work_dir, collected at the end */
    size_t nartifacts;
    const char *artifacts_to;      /* NULL, or s3://B/P: the collected ones go to B/P/RUN_ID/NAME */
    const char *const *node_setup; /* run by each node's launcher before its workers */
    size_t nnode_setup;
    int resuming;      /* tandem run --resume: the workers get TANDEM_RESUME=1 */
    int base_restarts; /* restarts recorded before this job: the scheduler's count adds to it */
    const td_slurm_options *slurm; /* executor slurm */
    const td_ssh_options *ssh;     /* executor ssh */
    const td_aws_options *aws;     /* executor aws */
    const char *project_dir;       /* the project (the code an ssh executor copies) */
    td_sigwatch *sigs; /* the supervisor's stop signals (SIGINT, SIGTERM, SIGHUP; SIGCHLD) */
    int stop_signal;   /* a stop signal tandem run read before handing over (0: none) */
    FILE *out;         /* progress lines */
    int quiet_output;  /* detached: the job's output is not copied to a terminal */
    int term_tty;      /* our stderr is a terminal the workers' progress bars are drawn on */
    /* The job's secrets: NULL-terminated "NAME=VALUE" strings (td_exec_secrets below) that reach
     * the workers' and the node agents' environment and nothing else; never part of env. */
    char *const *secrets;
    /* More periodic work for the supervisor's event loop (NULL: none): called once, on the
     * loop's thread, when the loop exists and before the run's first attempt starts. What it
     * adds there (timers, td_loop_queue_work) lives until the loop ends: td_loop_free cancels
     * the timers and the work left. The controller of a detached aws run puts its store push,
     * stop poll and switch there (td_exec_controller_on_loop). */
    void (*on_loop)(struct td_loop *loop, void *user);
    void *on_loop_user;
} td_exec_job;

/* ---- secrets: values the workers need that are written nowhere ----
 * Every executor puts a job's secrets into the environment of its node agents (an S3 client in
 * an agent reads AWS_* there) and so of their workers, and never into a command line, a file
 * (batch script, run directory, run record), a log it writes or a progress line:
 *   local  the launchers' environment, which the workers inherit;
 *   ssh    a "secret NAME HEX" line each (the value's bytes as hex) in the agent's stdin
 *          opening, before "go"; the agent sets it in its own environment (launch.h);
 *   slurm  sbatch's environment, passed on to the job with --export=ALL as the token is (also
 *          with slurm: work_dir); the batch script only checks, by name, that each arrived.
 * A workflow's `secrets: [NAME, ...]` fill the list from tandem run's own environment
 * (td_workflow_run refuses an unset one before anything starts). Other parts add implicit ones
 * before the job is handed over, the same way: the aws executor and S3 checkpoints forward the
 * AWS credentials with td_exec_secrets_add_aws (what is set in our environment) or
 * td_exec_secrets_set (credentials resolved from a profile or an instance role). A carrier that
 * needs more than its job has may copy the job and point .secrets at a longer list. A secret's
 * name wins over the same name in env. What a worker does with its environment (printing it to
 * a log) is its own business. */
#define TD_EXEC_SECRET_MAX_BYTES 8192 /* a value's length; the ssh opening line carries 2x */

typedef struct td_exec_secrets {
    char **v; /* "NAME=VALUE", NULL-terminated (v is NULL while count is 0) */
    size_t count;
} td_exec_secrets;

/* Whether name can be a secret: a shell variable name ([A-Za-z_][A-Za-z0-9_]*), 128 bytes at
 * most, and none of tandem's own (TANDEM_*, PATH), which tandem sets for the workers. */
bool td_exec_secret_name_ok(const char *name);
/* Adds name=value, replacing an earlier value of the same name. TD_ERR_INVALID naming the secret
 * (never the value) when the name is not td_exec_secret_name_ok or the value is longer than
 * TD_EXEC_SECRET_MAX_BYTES. */
td_status td_exec_secrets_set(td_exec_secrets *s, const char *name, const char *value);
/* The AWS variables an agent's or a worker's AWS client reads (AWS_ACCESS_KEY_ID,
 * AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_DEFAULT_REGION, AWS_ENDPOINT_URL,
 * AWS_ENDPOINT_URL_S3),
 * NULL-terminated. */
extern const char *const td_exec_aws_secret_names[];
/* Adds each of td_exec_aws_secret_names that is set (non-empty) in our environment; returns
 * how many. */
size_t td_exec_secrets_add_aws(td_exec_secrets *s);
/* Zeroes the values and frees. */
void td_exec_secrets_free(td_exec_secrets *s);
/* The value of name in a job's secrets, or NULL when it is not one. */
const char *td_exec_secret_value(char *const *secrets, const char *name);

typedef struct td_executor {
    const char *name;
    /* Runs the job to its end and records it (status, exit code, note, artifacts, logs).
     * Returns the CLI exit code: 0 succeeded, 1 failed (or stopped without a checkpoint), 143
     * preempted or stopped after the workers checkpointed. */
    int (*run)(const td_exec_job *job);
    /* For a run whose supervisor is gone: cancels what the executor left queued or running for
     * it (*cancelled = 1, a line saying what in buf), or does nothing (*cancelled = 0). */
    td_status (*cancel_orphan)(const td_run *run, int *cancelled, char *buf, size_t nbytes);
    /* One line on where the run's job is or was ("slurm job 12, script ..."), for tandem show.
     * Caller frees; NULL when there is nothing to say. */
    char *(*describe)(const td_run *run);
    /* (cancel_orphan and describe are NULL for td_executor_local, which td_executor_of_run
     * never returns.) */
} td_executor;

/* The default executor: the run's nodes as `tandem launch` child processes of tandem run. */
extern const td_executor td_executor_local;
/* The executor called `name` ("slurm", "ssh"), or NULL ("local" is td_executor_local, the
 * default, not found by name). */
const td_executor *td_executor_find(const char *name);
/* The names td_executor_find knows, for messages ("slurm or ssh"). */
const char *td_executor_names(void);
/* The executor that ran `run`, from what it left in the run directory; NULL: the local one. */
const td_executor *td_executor_of_run(const td_run *run);

/* A run that ended before its job was handed over (its setup failed or was stopped): its
 * artifacts and logs recorded, then status, exit code and note, as an executor records an end.
 * Returns the CLI exit code (1). */
int td_exec_end_before_job(const td_exec_job *job, td_run_status status, int exit_code,
                           const char *note, double t0);

/* ---- a run's stop: the decisions every carrier shares ----
 * Signals and deadlines go in; what the carrier must do comes out. A first stop signal begins a
 * soft stop (the workers checkpoint and exit): a user's (`tandem stop`, Ctrl-C, SIGHUP) stops the
 * run, a SIGTERM nobody in tandem asked for (a scheduler, a cloud preemption) preempts it. The
 * same signal again within moments (timeout(1), a scheduler signalling a group) is the same
 * request; an explicit second request (Ctrl-C twice, a signal TD_STOP_REPEAT_GRACE s or more
 * after the first) ends the job now. max_duration begins a user stop unless a stop is under
 * way. After the hard stop nothing more is asked. Pure decisions: no process, no I/O. */
typedef enum {
    TD_EXEC_STOP_NONE,  /* nothing to do */
    TD_EXEC_STOP_SOFT,  /* begin the stop: ask the workers to checkpoint and exit, and end the
                           job after the carrier's grace if it has not ended by then */
    TD_EXEC_STOP_AGAIN, /* the same request repeated: say so, keep waiting */
    TD_EXEC_STOP_HARD,  /* end the job now */
} td_exec_stop_step;

typedef struct {
    td_stop_signals signals;
    bool active;         /* a stop has begun */
    bool preempt;        /* ... and it is a preemption */
    bool hard;           /* the hard stop was asked */
    int last_signal;     /* 0: none yet */
    char stopped_by[96]; /* a user stop's cause ("tandem stop", "SIGINT (Ctrl-C)", "SIGHUP",
                            "max_duration of 60 s exceeded"); "" for a preemption */
} td_exec_stop;

/* A signal arrived at `now` (td_now_s). For a first SIGTERM, asked(user) says whether `tandem
 * stop` recorded a request (the run's stop_requested): then it is a user stop. */
td_exec_stop_step td_exec_stop_signal(td_exec_stop *s, int sig, double now,
                                      bool (*asked)(void *user), void *user);
/* The run's max_duration has passed. */
td_exec_stop_step td_exec_stop_max_duration(td_exec_stop *s, double max_duration_s, double now);
/* Whether `tandem stop` recorded a request for the run (the store's stop_requested). */
bool td_exec_stop_requested(td_rundb *store, const char *run_id);
/* asked() for a job (a const td_exec_job *): td_exec_stop_requested of its run. */
bool td_exec_stop_asked(void *job);

/* ---- the run's working directory (RUN/work) ----
 * The project's entries are copied into it, never linked (issue 30; src/exec/workdir.c): a
 * script writing a name the project has writes its own file. td_exec_work_copy copies the entry
 * `from` (a file, a directory with everything under it but .tandem, or a symbolic link, made
 * again as it is) to `to`, which must not exist, with the same base name: cloned (a reflink)
 * where the file system can, else copied. stats adds up what it did. */
typedef struct {
    int64_t files, links, skipped; /* regular files; links made again; FIFOs, sockets, devices */
    int64_t cloned_bytes, copied_bytes;
} td_exec_copy_stats;
td_status td_exec_work_copy(const char *from, const char *to, td_exec_copy_stats *stats);
/* Whether the entry `from` is small enough to copy into every run: at most
 * TD_EXEC_WORK_COPY_MAX_BYTES in at most TD_EXEC_WORK_COPY_MAX_FILES regular files (links not
 * followed). A larger one (a virtual environment, a build tree, a data set kept in the project)
 * is linked instead, as before issue 30, and said so: a copy per run would cost its size in time
 * and disk each run. *bytes_out, *files_out (may be NULL): what was counted, up to past a limit. */
#define TD_EXEC_WORK_COPY_MAX_BYTES ((int64_t)64 << 20)
#define TD_EXEC_WORK_COPY_MAX_FILES 4096
bool td_exec_work_copyable(const char *from, int64_t *bytes_out, int64_t *files_out);

/* ---- how the node agents ended: their end records (endrec.h), for every carrier ----
 * Each node's `tandem launch` writes RUN/end/node-N.json (the local carrier's launchers directly,
 * a remote node's over its link or into the shared run directory). What the supervisor takes
 * from them: the first failure (its worker's exit code, and the cause with that worker's last
 * error line), else the first cause a failed record gives, and the most restarts any node made.
 * A node that exited non-zero (launch_codes[i], -1: unknown) without a record is named as such. */
typedef struct {
    int worker_code; /* the failing worker's exit code, or -1 */
    int restarts;    /* the most any node's agent made */
    int records;     /* how many nodes left one */
    char cause[1024];
} td_exec_end_summary;

/* RUN/end/node-N.json (caller frees). */
char *td_exec_end_record_path(const td_run *run, int node);
/* Removes the nodes' records of an earlier attempt (a resume, a restart by the supervisor), so
 * that one cannot stand in for an agent that dies without writing its own; makes RUN/end. */
td_status td_exec_end_records_reset(const td_run *run, int nodes);
void td_exec_end_records_read(const td_run *run, int nodes, const int *launch_codes,
                              td_exec_end_summary *out);

/* ---- the cloud instances a run used: RUN/instances.json (executor aws) ----
 * The aws executor records every instance it creates for a run, and rewrites the file
 * atomically at each change (launched, interrupted, replaced, terminated); tandem gc and the
 * orphan check of tandem stop/ps/run add their ends. docs/cloud.md has the format. */
typedef struct td_run_instance {
    char id[32]; /* "i-0abc..." */
    int node;    /* -1: unknown */
    char type[48];
    char market[16]; /* "spot" or "on-demand" */
    char subnet[48];
    char zone[48];
    double launched_s; /* epoch seconds; 0: unknown */
    double ended_s;    /* 0 while it lives (null in the file) */
    char *end;         /* how it ended ("interrupted (...)", "terminated by tandem gc", ...) */
    char replaces[32]; /* the instance it replaced, "" for none */
    char state[24];    /* EC2's state when last seen: pending running ... terminated */
    double usd_per_hour;   /* its price for its market, zone and type; 0: unknown (null) */
    char price_source[160]; /* where the price came from ("spot price of us-east-1a at TIME",
                               "tandem's table (...)", "FILE:LINE"), "" when unknown */
} td_run_instance;

typedef struct td_run_instances {
    char provider[16]; /* "aws" */
    char region[48];
    td_run_instance *items;
    size_t count;
} td_run_instances;

/* Reads RUN/instances.json of the run directory run_dir. TD_ERR_NOTFOUND when the run has none
 * (not an aws run), TD_ERR_FORMAT naming the file and the field when it is malformed. */
td_status td_run_instances_read(const char *run_dir, td_run_instances *out);
void td_run_instances_clear(td_run_instances *r);
/* Not ended: no ended_s, and a state other than shutting-down/terminated. */
int td_run_instance_live(const td_run_instance *in);
/* Its lifetime in seconds (ended, else now_s, minus launched; 0 when the launch is unknown), and
 * its instance-hours (lifetime / 3600); the run's total instance-hours. */
double td_run_instance_lifetime_s(const td_run_instance *in, double now_s);
double td_run_instances_hours(const td_run_instances *r, double now_s);
/* What the instances cost in USD by now_s: track's one formula (td_instance_cost_at: each one's
 * usd_per_hour x its hours, to now_s while it lives) summed, as tandem ps and the ui sum it; the
 * record's "cost_usd" is this at its last write. *unpriced (may be NULL): how many have no
 * price, whose hours are left out. */
double td_run_instances_cost(const td_run_instances *r, double now_s, size_t *unpriced);

/* ---- tandem gc: instances nobody will terminate ----
 * Every instance of the region tagged tandem:run, pending, running, stopping or stopped: one of
 * this project's runs (its tandem:project tag is this project, or, untagged, its run is in this
 * store) whose supervisor is gone (nobody holds RUN/lock) is terminated and its end recorded in
 * RUN/instances.json ("terminated by tandem gc"); a live run's are left; another project's or an
 * unknown run's are listed and left unless `all` (then terminated, except a run known to be
 * live on this machine). One line per instance to out. */
typedef struct td_gc_opts {
    const char *region; /* NULL: td_aws_region_load's (AWS_REGION, ...) */
    int dry_run;        /* say what would be done, change nothing */
    int all;            /* also another project's and unknown runs' instances */
    FILE *out;          /* NULL: stdout */
} td_gc_opts;

typedef struct td_gc_counts {
    int seen, terminated, left, failed;
} td_gc_counts;

/* TD_OK when every instance it meant to terminate was; an error (credentials, region, a failed
 * call: the cloud layer's message) otherwise. counts may be NULL. */
td_status td_gc_instances(td_rundb *store, const td_gc_opts *opts, td_gc_counts *counts);

/* The cheap check of tandem run and tandem ps: only for runs whose RUN/instances.json lists an
 * instance still alive and whose supervisor is gone, terminates that run's instances (as
 * tandem stop does) and prints a line per instance terminated to out. Makes no AWS call (no
 * network) otherwise. Failures are warnings (one line each, with the fix); *nterminated (may be
 * NULL) counts the instances terminated. */
void td_gc_orphans(td_rundb *store, FILE *out, int *nterminated);

/* ---- artifacts in S3 (artifacts_s3.c; artifacts: {to: s3://B/P}) ----
 * Uploads each artifact recorded for the run (td_artifacts_list) to s3://B/P/RUN_ID/NAME with
 * its SHA-256, and writes RUN/artifacts-s3.json (TD_RUN_PATH_ARTIFACTS_S3): where each went,
 * its size and sha256. A failure names the object and the fix; what was uploaded is recorded. */
td_status td_artifacts_s3_upload(td_rundb *store, const td_run *run, const char *to, FILE *out);
/* The S3 copy of one artifact, by the record above: downloads s3://.../NAME to dest, checked
 * against the recorded sha256 (nothing is left at dest on a mismatch). TD_ERR_NOTFOUND when the
 * run has no record or the record no such name. */
td_status td_artifacts_s3_download(const td_run *run, const char *name, const char *dest);

/* ---- a run that lives in the cloud: tandem run -d of an aws run (controller.c) ----
 * The submitter creates a small on-demand controller instance, ships it the workflow, the code
 * and the credentials, and starts the run's supervisor there (a detached `tandem run`), then
 * returns: the controller creates the nodes, replaces interrupted ones and ends the run. The run's
 * store is kept in S3 (STORE = s3://B/P/RUN_ID/.tandem-run for checkpoint_dir s3://B/P): the
 * controller pushes the run directory to STORE/run/ as it goes; the submitter's verbs pull it
 * back (td_exec_remote_refresh) and ask for a stop with STORE/stop, which the controller polls.
 * RUN/remote.json on the submitter says where the store is and which instance controls it.
 * docs/runs.md, "A run that lives in the cloud"; docs/cloud.md, "The controller". */

/* STORE for the workflow's checkpoint_dir (s3:// only: the controller and the submitter both
 * reach it), or TD_ERR_INVALID saying what to set. Caller frees *out. */
td_status td_exec_remote_store_url(const char *checkpoint_dir, const char *run_id, char **out);

/* What the submitter ships besides the job: the workflow and how it was asked for. */
typedef struct td_exec_handoff {
    const char *workflow_file; /* the workflow's file, sent as it is */
    const char *workflow_name;
    char *const *params; /* "KEY=VALUE" as given with --param (NULL-terminated, or NULL) */
    const char *store_url;    /* td_exec_remote_store_url */
    char *const *forward_env; /* "NAME=VALUE" more for the controller's environment (the
                                 credentials, the workflow's secrets), written to a 0600 file
                                 there, never to a command line */
    int resume; /* tandem run --resume -d: the controller resumes the run from its store and its
                   S3 checkpoints (a stop asked of the run's last life is cleared first) */
} td_exec_handoff;

/* The submitter's part: the controller created (on demand; aws.controller_type, else t3.micro),
 * reached over ssh, given the run, and its supervisor started. The job's run is marked running,
 * "supervised by its controller". On any failure the controller is terminated and the error
 * says what failed. Progress lines go to job->out. */
td_status td_exec_controller_handoff(const td_exec_job *job, const td_exec_handoff *h);

/* The controller's part, in its detached supervisor. td_exec_controller_start: the store's
 * client made and the controller's own dead-man's switch fed once. td_exec_controller_on_loop
 * (the job's on_loop, its user the controller): a timer on the supervisor's loop that, every few
 * seconds, has a work thread push the run directory to the store and look for STORE/stop, and,
 * back on the loop, acts on a stop asked from the submitter (the run's stop request and a
 * SIGTERM to this process, as tandem stop does) and keeps the switch fed.
 * td_exec_controller_finish, after the supervisor's loop ended: the last push (synchronous),
 * then the switch told that the run is over (the instance ends itself within seconds). */
typedef struct td_exec_controller td_exec_controller;
td_status td_exec_controller_start(const td_run *run, const char *project_dir,
                                   const td_aws_options *aws, const char *store_url,
                                   td_exec_controller **out);
void td_exec_controller_on_loop(struct td_loop *loop, void *controller);
void td_exec_controller_finish(td_exec_controller *c);
/* On a resumed run's new controller (tandem run --resume RUN -d ... --controller-of RUN), before
 * the run is looked up: the run's store (store_url) pulled into this project's run directory of
 * run_id and indexed (td_rundb_rebuild), as its last life left it, so the resume continues its
 * record, metrics, logs and instances. TD_ERR_NOTFOUND when the store has no run.json. */
td_status td_exec_controller_adopt(td_rundb *store, const td_aws_options *aws,
                                   const char *store_url, const char *run_id);
/* tandem run --resume RUN -d of an aws run that lived here (attached, or resumed attached since):
 * its run directory as its last life left it (before it is marked resumed) sent whole to its
 * store, for the new controller to take (td_exec_controller_adopt). */
td_status td_exec_remote_seed(const td_aws_options *aws, const char *store_url,
                              const td_run *run);

/* For a run supervised by its controller (td_run_is_remote): its store pulled into the run
 * directory and the row brought up to it (td_run_adopt_remote). Nothing for another run. A store
 * that cannot be read is an error naming it; the row keeps what it had. */
td_status td_exec_remote_refresh(td_rundb *store, td_run *run);
/* tandem stop of such a run: STORE/stop put, then the store pulled every second until the run
 * ended or wait_s passed; run is the run as last pulled. */
td_status td_exec_remote_stop(td_rundb *store, td_run *run, double wait_s);

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_EXEC_H */
