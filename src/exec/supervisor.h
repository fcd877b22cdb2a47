/* The supervisor of a run, and the carriers it drives.
 *
 * One supervisor owns a run from the moment its job is handed over to its record: the stop,
 * preemption and restart decisions, the deadlines (max_duration, a stop's grace), the metrics
 * ingest, and the outcome. It runs on one event loop (core's loop.h). What differs between
 * running the job on this machine, on ssh hosts or through Slurm is a carrier: it starts the
 * nodes of an attempt, stops them (soft: the workers checkpoint and exit; hard: now), and tells
 * the supervisor what happened (every node running, a node lost, the attempt over, with how it
 * ended from the nodes' end records).
 *
 * Two parts:
 * - td__sup_machine: the decisions, as a state machine with no process and no I/O. Events go in
 *   (a signal, a deadline, the carrier's news), actions come out (start, stop soft or hard, arm a
 *   timer, record restarts, end). tests/executors/test_supervisor.c drives it transition by
 *   transition.
 * - td__supervise: the machine on an event loop, a carrier's callbacks turned into its events
 *   and its actions into the carrier's calls and the loop's timers.
 *
 *     signalfd ----\                                  /--> carrier->start / stop(soft|hard)
 *     timers -------> td__sup_machine (decisions) ---+--> timers (grace, backoff, max_duration)
 *     carrier news-/                                  \--> the run's record (restarts, outcome)
 */
#ifndef TANDEM_EXEC_SUPERVISOR_H
#define TANDEM_EXEC_SUPERVISOR_H

#include <stdbool.h>

#include "exec/internal.h"
#include "tandem/loop.h"

/* ---- the decisions ---- */
typedef enum {
    TD__SUP_IDLE,     /* not begun */
    TD__SUP_STARTING, /* an attempt is starting: not every node is running yet */
    TD__SUP_RUNNING,  /* every node of the attempt runs */
    TD__SUP_STOPPING, /* the workers were asked to checkpoint and exit; the grace runs */
    TD__SUP_KILLING,  /* the nodes were told to end now; waiting for the attempt to be over */
    TD__SUP_BACKOFF,  /* an attempt failed; the next one starts after a pause */
    TD__SUP_ENDED,    /* the outcome is decided */
} td__sup_phase;

/* What the machine asks of its driver, as bits of td__sup_acts.todo, done in this order. */
enum {
    TD__SUP_DO_STOP_HARD = 1 << 0,   /* end the attempt's nodes now (and cancel the grace) */
    TD__SUP_DO_STOP_SOFT = 1 << 1,   /* ask them to checkpoint and exit */
    TD__SUP_DO_ARM_GRACE = 1 << 2,   /* td__sup_grace_over after grace_s */
    TD__SUP_DO_ARM_BACKOFF = 1 << 3, /* td__sup_backoff_over after backoff_s */
    TD__SUP_DO_ARM_LIMIT = 1 << 4,   /* td__sup_limit (max_duration) after limit_s */
    TD__SUP_DO_START = 1 << 5,       /* start an attempt (resume: from the last checkpoint) */
    TD__SUP_DO_RESTARTS = 1 << 6,    /* the run's restarts are now td__sup_restarts(m) */
    TD__SUP_DO_END = 1 << 7,         /* the run is over: m->outcome says how */
};

typedef struct {
    unsigned todo;
    double grace_s, backoff_s, limit_s;
    bool resume;   /* with DO_START */
    char say[640]; /* a progress line for the user ("" none) */
} td__sup_acts;

/* How an attempt ended, as the carrier gathers it from its nodes and their end records. */
typedef struct {
    int code;          /* 0 every node succeeded; 143 the workers checkpointed and exited;
                          -1 nothing ran; else the first failing node's exit code */
    int worker_code;   /* the failing worker's own exit code (its end record), -1 unknown */
    int node_restarts; /* restarts the nodes' own agents made in this attempt */
    char cause[1024];  /* the first failure in words ("" none): a worker's last error line */
    /* How each worker ended, from the typed records (the nodes' end records and the Python
     * SDK's): "rank 0 checkpointed (exit 143); rank 1 killed by SIGTERM without a checkpoint".
     * "" when no record said; all_checkpointed: every worker exited 143 itself. */
    char workers[700];
    bool all_checkpointed;
} td__sup_exit;

typedef struct {
    /* what the run asks for */
    const char *run_id;
    int max_restarts;      /* attempts the supervisor restarts after a failure (carriers whose
                              nodes do not restart themselves); 0: none */
    double max_duration_s; /* 0: no limit; counted from when every node first runs */
    double grace_s;        /* a soft stop becomes a hard one after this */
    double backoff_s;      /* the pause before the first restart, doubled for each next one */
    double backoff_max_s;
    int base_restarts;        /* restarts recorded before this supervisor */
    bool resuming;            /* tandem run --resume: the first attempt resumes too */
    const char *success_note; /* the note of a run that succeeded ("" or NULL: none) */

    /* where it stands */
    td__sup_phase phase;
    td_exec_stop stop; /* the stop decisions every carrier shares (exec.h) */
    int restarts;      /* attempts restarted by this supervisor */
    int node_restarts; /* the nodes' own restarts, all attempts */
    int attempt_node_restarts;
    double running_since; /* when every node first ran (0: not yet) */
    bool limit_armed;
    bool failing;       /* a node was lost or failed: the others are being stopped */
    char failure[1024]; /* that failure, in words */
    bool disk_full_said;
    bool replacing;        /* a node's machine is being taken away: resume on a replacement */
    int replacements;      /* attempts restarted on replaced machines (not max_restarts') */
    char replace_why[512]; /* the last interruption, in words */

    /* Every worker finished its script's run (the SDK's end records) but the attempt did not
     * end within the exit grace: the workers were stopped, and the run ends as hung_note says,
     * succeeded unless a worker finished with an exit code. */
    bool hung;
    bool hung_ok;
    char hung_note[700];

    td__exec_outcome outcome; /* once TD__SUP_ENDED */
} td__sup_machine;

void td__sup_init(td__sup_machine *m, const char *run_id);
/* The run's restarts as recorded: base + the supervisor's + the nodes'. */
int td__sup_restarts(const td__sup_machine *m);

/* The events. `asked`: whether `tandem stop` recorded a request for the run (a first SIGTERM
 * with one is a user's stop, without one a preemption). */
td__sup_acts td__sup_begin(td__sup_machine *m, double now);
td__sup_acts td__sup_signal(td__sup_machine *m, int sig, bool asked, double now);
td__sup_acts td__sup_running(td__sup_machine *m, double now);
td__sup_acts td__sup_node_restarts(td__sup_machine *m, int node_restarts);
td__sup_acts td__sup_node_down(td__sup_machine *m, int node, const char *why, double now);
/* A node's machine is about to be taken away (a spot interruption notice): every worker
 * checkpoints, and the run resumes once the carrier has a replacement. Not a failure: it does
 * not use max_restarts (at most TD__SUP_MAX_REPLACEMENTS times). */
#define TD__SUP_MAX_REPLACEMENTS 50
td__sup_acts td__sup_node_preempted(td__sup_machine *m, int node, const char *why, double now);
td__sup_acts td__sup_exited(td__sup_machine *m, const td__sup_exit *e, double now);
td__sup_acts td__sup_limit(td__sup_machine *m, double now);
td__sup_acts td__sup_grace_over(td__sup_machine *m, double now);
td__sup_acts td__sup_backoff_over(td__sup_machine *m, double now);
td__sup_acts td__sup_disk_full(td__sup_machine *m, double now);
/* Every worker finished training (tandem.finish) and some did not exit within the exit grace
 * (TANDEM_EXIT_GRACE): they are stopped, and the run ends with `note`, succeeded when ok. */
td__sup_acts td__sup_exit_hung(td__sup_machine *m, const char *note, bool ok, double now);

/* ---- the carriers ---- */
typedef struct td__sup td__sup; /* a supervisor at work, as its carrier sees it */
typedef struct td__carrier td__carrier;

typedef struct {
    const char *name;
    /* Starts an attempt's nodes (resume: the workers resume from the last checkpoint), watching
     * what it needs on td__sup_loop(s). It reports td__sup_running once every node runs,
     * td__sup_node_down for a node lost while the others go on, and td__sup_exited once the
     * attempt is over (every node gone). An error: nothing of the attempt is left running. */
    td_status (*start)(td__carrier *c, td__sup *s, bool resume);
    /* soft: ask the workers to checkpoint and exit; hard: end the nodes now. */
    void (*stop)(td__carrier *c, bool hard);
    /* Optional, every SYSMON_PERIOD_S: the nodes' CPU, memory and GPU use, and their restarts
     * (td__sup_restarts_seen). */
    void (*sample)(td__carrier *c);
    /* Optional: after the attempts, before the record (artifacts from the nodes, the last
     * output). */
    void (*finish)(td__carrier *c);
    /* Optional: the run's outcome in the carrier's own words, given the machine's (a scheduler
     * knows why its job ended: a time limit, a lost node, a cancel from outside). */
    void (*outcome)(td__carrier *c, const td__sup_machine *m, td__exec_outcome *o);
    /* Optional: before a progress line goes out (a progress bar on the line is cleared). */
    void (*before_say)(td__carrier *c);
} td__carrier_ops;

struct td__carrier {
    const td__carrier_ops *ops;
};

/* Runs the job through the carrier to its end and records it. max_restarts: restarts the
 * supervisor makes itself (0 where the nodes restart their workers themselves). Returns the CLI
 * exit code. */
int td__supervise(const td_exec_job *job, td__carrier *c, int max_restarts, double grace_s,
                  const char *success_note, double t0);

td_loop *td__sup_loop(td__sup *s);
/* The carrier's news. */
void td__sup_running_now(td__sup *s);
void td__sup_node_lost(td__sup *s, int node, const char *why);
/* A node's machine is being taken away (td__sup_node_preempted). */
void td__sup_node_interrupted(td__sup *s, int node, const char *why);
void td__sup_restarts_seen(td__sup *s, int node_restarts);
void td__sup_attempt_over(td__sup *s, const td__sup_exit *e);
/* A progress line ("tandem: ..."). */
void td__sup_say(td__sup *s, const char *fmt, ...) TD_PRINTF(2, 3);

#endif /* TANDEM_EXEC_SUPERVISOR_H */
