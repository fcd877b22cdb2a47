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
} td_slurm_options;

void td_slurm_options_copy(td_slurm_options *dst, const td_slurm_options *src);
void td_slurm_options_clear(td_slurm_options *o);

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
/* Checks one host entry ("user@host:port"): TD_ERR_INVALID naming it when it is empty, has
 * spaces or a shell metacharacter, or a bad port. */
td_status td_ssh_host_check(const char *what, const char *host);

/* ---- a job, as `tandem run` hands it to an executor ---- */
typedef struct td_exec_job {
    td_rundb *store;
    const td_run *run;      /* created or resumed, and locked, by tandem run */
    const char *work_dir;   /* RUN/work, prepared: the commands' working directory */
    const char *script;     /* what each worker runs with /bin/sh -c */
    const char *tandem_bin; /* this tandem, absolute: the nodes run it from the shared file
                             * system */
    char *const *env;       /* the workers' environment as the local executor computes it: ours
                             * plus the run's variables (NULL-terminated "KEY=VALUE") */
    int max_restarts;       /* tandem launch --max-restarts */
    double max_duration_s;  /* 0: no limit; exceeded: stopped */
    const char *const *artifacts; /* globs relative to work_dir, collected at the end */
    size_t nartifacts;
    const char *const *node_setup; /* run by each node's launcher before its workers */
    size_t nnode_setup;
    int resuming;      /* tandem run --resume: the workers get TANDEM_RESUME=1 */
    int base_restarts; /* restarts recorded before this job: the scheduler's count adds to it */
    const td_slurm_options *slurm; /* executor slurm */
    const td_ssh_options *ssh;     /* executor ssh */
    const char *project_dir;       /* the project (the code an ssh executor copies) */
    td_sigwatch *sigs; /* the supervisor's stop signals (SIGINT, SIGTERM, SIGHUP; SIGCHLD) */
    int stop_signal;   /* a stop signal tandem run read before handing over (0: none) */
    FILE *out;         /* progress lines */
    int quiet_output;  /* detached: the job's output is not copied to a terminal */
    int term_tty;      /* our stderr is a terminal the workers' progress bars are drawn on */
} td_exec_job;

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

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_EXEC_H */
