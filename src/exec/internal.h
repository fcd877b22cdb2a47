/* Internals of the exec layer: what every executor needs (running a client command, shell
 * quoting, recording the end of a run) and the Slurm executor's pure parts, which
 * tests/executors/test_slurm_unit.c checks without a cluster. */
#ifndef TANDEM_EXEC_INTERNAL_H
#define TANDEM_EXEC_INTERNAL_H

#include <stddef.h>
#include <stdio.h>

#include "tandem/exec.h"
#include "tandem/loop.h"

/* ---- a growable string ---- */
typedef struct {
    char *s;
    size_t len, cap;
} td__buf;

void td__buf_add(td__buf *b, const char *s, size_t n);
void td__buf_addf(td__buf *b, const char *fmt, ...) TD_PRINTF(2, 3);
/* s as one shell word: '...' with each ' written as '\'' (sh, dash and bash read it alike). */
void td__buf_quote(td__buf *b, const char *s);

/* The absolute path of `prog` found on PATH (executable), or NULL. Caller frees. */
char *td__exec_which(const char *prog);

/* Runs argv (argv[0] absolute) in cwd (NULL: ours) with our environment and stdin from
 * /dev/null, and collects its stdout and stderr (the first 64 KiB of each) and exit code
 * (td_wait_exit_code). After timeout_s it is killed (*code = 124, as timeout(1)). A program
 * that cannot be started is an error; one that fails is not (the caller reads *code). */
td_status td__exec_capture(char *const *argv, const char *cwd, double timeout_s, char **out,
                           char **err, int *code);

/* Writes text as `path` readable by its owner only (0600), atomically: a secret never exists
 * with wider permissions, not even half written. */
td_status td__write_private(const char *path, const char *what, const char *text);

/* The ssh opening's lines for a job's secrets (exec.h): "secret NAME HEX\n" each, HEX the
 * value's bytes; "" for none. Free with td__exec_wipe_free. */
char *td__exec_secret_lines(char *const *secrets);
/* Zeroes a string that held a secret, then frees it (NULL: nothing). */
void td__exec_wipe_free(char *s);

/* "tandem: " + the line, to out (flushed): an executor's progress. */
void td__exec_say(FILE *out, const char *fmt, ...) TD_PRINTF(2, 3);
/* Writes everything to fd; gives up quietly when nobody reads it (supervising goes on). */
void td__exec_write_all(int fd, const char *s, size_t n);
/* The non-empty lines of s joined with "; ", trimmed, for a note (a client command explains a
 * refusal over several lines). */
void td__exec_joined_lines(const char *s, char *out, size_t nbytes);

/* The last metrics ingest of a run (a full disk was said by the ingester already), and a line
 * on the malformed metric lines it skipped. */
void td__exec_final_ingest(FILE *out, td_ingester *ing);

/* How a job ended, as the run records it. */
typedef struct {
    td_run_status status;
    int exit_code; /* the job's (a worker's, when the launcher names one); -2: leave as is */
    int cli_code;  /* what tandem run exits with */
    char note[768];
} td__exec_outcome;

/* The end, as the local executor records it: artifacts collected from work_dir (also after a
 * failure), log files recorded, then status, exit code and note; a progress line says it.
 * Returns the CLI exit code (1 when even the status could not be written). */
int td__exec_record_end(const td_exec_job *job, const td__exec_outcome *o, double t0);
/* A run that failed before or while its job was handed over: status failed, the note from fmt,
 * no exit code. Returns the CLI exit code. */
int td__exec_fail(const td_exec_job *job, double t0, const char *fmt, ...) TD_PRINTF(3, 4);

/* ---- Slurm ---- */
/* One job as `scontrol show job -o` prints it. */
typedef struct {
    char state[32];   /* JobState: PENDING, RUNNING, COMPLETED, ... */
    char reason[160]; /* Reason: why it waits or ended (None, Resources, PartitionConfig...) */
    char nodes[256];  /* NodeList (empty while pending) */
    int restarts;     /* Restarts: requeues so far */
    int exit_code;    /* ExitCode=A:S -> A */
    int exit_signal;  /*                  S */
} td__slurm_job;

/* Parses one line of `scontrol show job -o`. TD_ERR_FORMAT naming the line when JobState is
 * missing. */
td_status td__slurm_parse_job(const char *line, td__slurm_job *out);

typedef enum {
    TD__SLURM_WAITING, /* queued: pending, requeued, held, nodes booting */
    TD__SLURM_ACTIVE,  /* running, suspended, completing */
    TD__SLURM_ENDED,   /* a final state */
} td__slurm_phase;
td__slurm_phase td__slurm_phase_of(const char *state);

/* What a pending job's Reason means, in a few words, or NULL for reasons that need none. */
const char *td__slurm_reason_hint(const char *reason);

/* The run's status line while the job lives ("slurm job 12 pending: Resources (...)"). */
void td__slurm_live_note(const char *job_id, const td__slurm_job *j, char *buf, size_t nbytes);

/* How the run ends, from the job's final state. stopped_by: what stopped it on our side
 * ("tandem stop", "SIGINT (Ctrl-C)", "max_duration of 60 s exceeded"), or NULL; preempted_by_us:
 * the supervisor got a SIGTERM from outside and cancelled the job; cause: the launcher's last
 * "tandem: error:" line, or "". */
void td__slurm_outcome(const char *run_id, const char *job_id, const td__slurm_job *j,
                       const char *stopped_by, int preempted_by_us, const char *cause,
                       int worker_code, td__exec_outcome *o);

/* The batch script RUN/job.sbatch of a job (see docs/executors.md). token_path: the 0600 file
 * holding TANDEM_TOKEN, which the job reads through the shared file system; or, with
 * slurm: work_dir, link: "HOST:PORT" where each node's launcher connects back to tandem run
 * (the token then comes in sbatch's environment). Caller frees. */
char *td__slurm_batch_script(const td_exec_job *job, const char *token_path, const char *link);

/* The sbatch command line: sbatch --parsable [sbatch_args...] SCRIPT. argv[0] is `sbatch` as
 * given; NULL-terminated, caller frees each string and the array. */
char **td__slurm_sbatch_argv(const char *sbatch, const td_slurm_options *o, const char *script);

/* ---- nproc_per_node: gpu|cpu|auto counted before a run (td_slurm_count_nproc, slurm.c) ----
 * One node as `sinfo -h -N -o '%N|%P|%c|%G|%f'` prints it (a node in two partitions: two lines). */
typedef struct {
    char name[128];
    char partition[128]; /* without the '*' that marks the default partition */
    int is_default;      /* the '*' */
    int cpus;            /* %c */
    int gpus;            /* the gpu entries of %G, summed (td__slurm_gres_gpus) */
    char gres[160];      /* %G as printed, for messages */
    char features[256];  /* %f: comma-separated, "(null)" for none */
} td__slurm_node;

/* The GPUs a GRES text gives a node: the counts of its gpu entries ("gpu:2", "gpu:a100:2",
 * "gpu:a100:2(S:0-1),gpu:v100:1,mps:400", a bare "gpu" is 1), 0 for "(null)", "" or none. */
int td__slurm_gres_gpus(const char *gres);
/* The lines of sinfo's output (above) for the nodes a job may get: those of `partitions` (a
 * comma-separated list, as --partition takes; NULL: the default partition) that have every
 * feature of `constraint` when it is a plain AND of names ("a100&ib"; NULL, or an expression
 * with |, [, *, ! or counts, filters nothing: counting a superset of the nodes can refuse for a
 * disagreement, never count wrong). *out (caller frees) may be empty; TD_ERR_FORMAT naming a
 * malformed line. */
td_status td__slurm_nodes_parse(const char *sinfo_out, const char *partitions,
                                const char *constraint, td__slurm_node **out, size_t *count);
/* tandem launch's rule (td_launch_nproc_resolve) over those nodes, which must agree; `where`
 * names them in messages ("partition gpu"). *gpus_out: the count when it is of GPUs, else 0. */
td_status td__slurm_count_nodes(const td__slurm_node *nodes, size_t count, const char *where,
                                const char *spec, int *out, int *gpus_out, char *note,
                                size_t nbytes);

/* The workers spec (gpu|cpu|auto) counts on an instance of type t (aws_choose.c): GPUs, vCPUs,
 * or GPUs when it has them else vCPUs. TD_ERR_USAGE naming the type and the fix for gpu on a
 * type without GPUs; why (nbytes): "one per GPU of g5.12xlarge (4 x A10G)". */
struct td_ec2_type;
td_status td__aws_type_nproc(const struct td_ec2_type *t, const char *spec, int *out, char *why,
                             size_t nbytes);

/* What decides the bits of a worker's arithmetic, read from our environment (OpenBLAS's kernel
 * and its blocking, tandem's own level), as `export NAME='value'` lines for a POSIX shell, those
 * set here only. Where a run starts processes on other machines (ssh.c's hosts, controller.c's
 * controller) these travel from the submitter's environment, so they compute what this machine
 * would. */
void td__buf_export_numerics(td__buf *b);

/* ---- ssh's carrier, for hosts found one by one (the aws executor's instances) ----
 * The ssh executor's agents and supervision (ssh.c) over hosts the caller sets node by node;
 * its soft stop's grace. */
typedef struct td__ssh td__ssh;
#define TD__SSH_CUT_AFTER_S 45.0
/* A note of a node's agent other than the ones ssh reads itself ("interrupted", "rebalance"). */
typedef void (*td__ssh_note_fn)(void *user, int node, const char *key, const char *value);
td_status td__ssh_new(const td_exec_job *job, const td_ssh_options *opts, int nodes, td__ssh **out);
/* Sets node's host ([user@]host[:port]) and prepares it as the ssh executor does before a run:
 * logs in, makes the run's directory, copies the code, runs the setup commands there (in the
 * code's copy; their output in RUN/logs/setup-node-N.log), checks that tandem runs. Blocks for
 * seconds (ssh; minutes with a setup that builds): call it while no attempt runs (a worker
 * thread may). why (nbytes) says what failed: TD_ERR_PEER when the host did not answer (ssh
 * could not log in: worth trying again while it boots), another error when it answered. */
td_status td__ssh_set_host(td__ssh *s, int node, const char *entry, const char *const *setup,
                           size_t nsetup, char *why, size_t nbytes);
const char *td__ssh_host(const td__ssh *s, int node);
/* Writes line (ending in '\n') to every running agent's stdin (aws: "alive N", the dead-man's
 * switch's heartbeat). */
void td__ssh_tell_agents(td__ssh *s, const char *line);
/* Where tandem is on every host from now on (a carrier that ships it: exec/bundle.h). */
void td__ssh_set_tandem(td__ssh *s, const char *path);
/* The carrier's ssh command up to and including entry's destination (NULL-terminated; free
 * each string, then the array), for a command of the caller's own. */
char **td__ssh_command_for(const td__ssh *s, const char *entry);
void td__ssh_on_note(td__ssh *s, td__ssh_note_fn fn, void *user);
struct td__carrier *td__ssh_carrier(td__ssh *s);
void td__ssh_free(td__ssh *s);

extern const td_executor td__executor_slurm;
extern const td_executor td__executor_ssh;
extern const td_executor td__executor_aws;

/* The run's token file RUN/token (0600), made once per run: a requeued, restarted or resumed
 * job keeps it. *path_out is its path (caller frees). */
td_status td__exec_token(const td_run *run, char **path_out);

/* The run's token (td__exec_token's file, made when missing) as 32 hex digits. */
td_status td__exec_read_token(const td_run *run, char token[33]);

/* A /bin/sh script that writes the run's code as a tar stream to its stdout: the files git sees
 * in the project (tracked, and untracked ones not ignored), or everything but .git and .tandem
 * outside a git work tree, read through RUN/work (whose entries link into the project), without
 * the declared outputs. Caller frees. */
char *td__exec_code_tar_script(const td_exec_job *job);

/* Rank log bytes that came over a link, to our stdout as the local launcher prints them
 * ("[rank R] line"); other files are not echoed. */
typedef struct {
    char name[64];
    int at_line_start;
} td__echo_file;
typedef struct {
    td__echo_file files[64];
} td__echo;
void td__exec_echo_rank_log(td__echo *echo, const char *name, const char *bytes, size_t n);
/* The script's record from a node that does not share the run directory (the "record" opening
 * line: node 0's agent sends its RUN/sdk.json as sdk-inbox/sdk.json whenever it changes, and
 * its artifacts/ files at the end, into the same names here): the mirror prefixes a receiver
 * takes for it, and what a whole file's arrival does (sdk-inbox/sdk.json replaces RUN/sdk.json,
 * which the supervisor's ingest timer then reads). */
#define TD__EXEC_RECORD_PREFIXES                                                                   \
    td_run_path_name(TD_RUN_PATH_SDK_INBOX), td_run_path_name(TD_RUN_PATH_ARTIFACTS)
void td__exec_record_arrived(const td_run *run, const char *name);

/* ---- the Python SDK's end records (sdkend.c): RUN/metrics/sdk-end-RANK.jsonl ---- */
typedef struct {
    bool finished;      /* the script finished its run (tandem.finish, or at interpreter exit) */
    double finish_time; /* wall clock */
    int exit_code;      /* the one passed to tandem.finish, or -1 */
    bool killed;        /* a SIGTERM ended it (a script that never asks tandem.should_stop) */
    int signal;
    long long pid, start_ticks; /* the process, for a look at it on this machine */
    char boot_id[40];
} td__sdk_end;
/* Each rank's (0 .. world-1) lines written at `since` (wall clock) or later into out[world];
 * returns how many ranks have one. */
int td__sdk_ends_read(const char *run_dir, int world, double since, td__sdk_end *out);
/* Whether the process of a record still lives: 1 yes, 0 no, -1 not known (it ran on another
 * machine, or the record does not say). */
int td__sdk_end_alive(const td__sdk_end *e);

/* ---- the nodes' links back to the supervisor (links.c) ---- */
typedef struct td__links td__links;
/* Packs the run's code into RUN/code.tar and listens on a free port of every interface; the
 * nodes reach it at host:PORT (td__links_endpoint). */
td_status td__links_open(const td_exec_job *job, const char *token, const char *host,
                         td__links **out);
const char *td__links_endpoint(const td__links *l);
/* Serves the links on `loop` (the supervisor's): new connections, handshakes that ended (each
 * on a thread of its own, HANDSHAKE_MS at most: never waited on), openings sent as the peer
 * takes them, the mirror streams. Detach before the loop goes. */
td_status td__links_attach(td__links *l, td_loop *loop);
void td__links_detach(td__links *l);
/* Nodes' connections whose agent has not said its end yet (everything of an agent arrived when
 * it did; strangers in the handshake are not counted); the nodes' message lines still unterminated,
 * written out (at the end). */
int td__links_open_count(const td__links *l);
void td__links_flush_lines(td__links *l);
/* How many nodes have connected at least once (their opening sent); how many connections were
 * closed before they joined (a wrong token, no handshake within its deadline, cut short when the
 * slots were full). */
int td__links_nodes_seen(const td__links *l);
int td__links_refused(const td__links *l);
void td__links_free(td__links *l);

#endif /* TANDEM_EXEC_INTERNAL_H */
