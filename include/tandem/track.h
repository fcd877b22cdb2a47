/* tandem track: the run store and the metrics sink.
 *
 * The store is one SQLite database in WAL mode, <project>/.tandem/runs.db, shared by every
 * process that touches a run: the supervisor of `tandem run`, the verbs (`tandem ps`, `show`,
 * `metrics`...), and tests. Each run owns a directory <project>/.tandem/runs/<id>/ holding
 * logs/, metrics/, artifacts/ and checkpoints/.
 *
 * Metrics travel as JSON lines: any process appends one object per line to the file named by
 * TANDEM_METRICS ({"step": 120, "loss": 0.31, "acc": 0.9} or {"key": "loss", "value": 0.31,
 * "step": 120}); the supervisor's ingester tails those files and stores the points, recording
 * each file's offset in the same transaction as its points, so a restarted ingester neither
 * loses nor duplicates a point. {"event": "resume", "step": S} cuts that rank's history back to
 * step S. The format is in docs/runs.md.
 */
#ifndef TANDEM_TRACK_H
#define TANDEM_TRACK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "tandem/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- runs ---- */
#define TD_RUN_STATUS_MAP(X)                                                                       \
    X(PENDING, "pending")                                                                          \
    X(RUNNING, "running")                                                                          \
    X(SUCCEEDED, "succeeded")                                                                      \
    X(FAILED, "failed")                                                                            \
    X(STOPPED, "stopped")                                                                          \
    X(PREEMPTED, "preempted")                                                                      \
    X(RESUMED, "resumed")

typedef enum {
#define TD__RUN_STATUS_ENUM(name, text) TD_RUN_##name,
    TD_RUN_STATUS_MAP(TD__RUN_STATUS_ENUM)
#undef TD__RUN_STATUS_ENUM
        TD_RUN_STATUS_COUNT
} td_run_status;

const char *td_run_status_str(td_run_status st);
/* TD_ERR_INVALID for an unknown word. */
td_status td_run_status_parse(const char *text, td_run_status *out);
/* Succeeded, failed, stopped or preempted: nothing is running for it. */
int td_run_status_is_final(td_run_status st);

/* One row of the runs table. Strings are owned by the struct (td_run_clear frees them);
 * times are wall-clock seconds since the epoch, 0 when not reached yet. */
typedef struct td_run {
    char *id; /* "<workflow>-<seq>", e.g. "demo-12" */
    char *workflow;
    td_run_status status;
    int exit_code; /* -1 until the run has ended */
    double created_s, started_s, ended_s;
    char *command;      /* the shell script the workers run */
    char *code_version; /* git commit, "<commit>+dirty.<sha256 of git diff HEAD>", or "none" */
    char *params_json;  /* JSON object of hyperparameters, "{}" when none */
    int nodes, nproc_per_node, restarts;
    int64_t supervisor_pid; /* 0 when no supervisor has claimed the run */
    /* When that process started: field 22 of /proc/PID/stat (clock ticks after boot), read by
     * td_run_set_supervisor. A pid is only taken for the supervisor while the process holding
     * it started at this time (pids are reused). 0: unknown (recorded by an older tandem, or
     * no /proc), and then a live process whose command line names tandem counts. */
    int64_t supervisor_start;
    char *run_dir;      /* absolute: <project>/.tandem/runs/<id> */
    char *note;         /* why it ended the way it did ("max_duration 30m exceeded"), or NULL */
    int stop_requested; /* `tandem stop` asked for it: a SIGTERM means stop, not preemption */
    /* The user's labels (tandem run --tag/--group/--notes, tandem tag/group/note): tags is a
     * sorted, comma-separated set ("" or NULL: none; a tag never holds a comma, see
     * td_label_check), group a label, notes free text (NULL: none; `note` above is the
     * supervisor's). archived: hidden from the default listings (tandem archive). */
    char *tags, *group, *notes;
    int archived;
    /* What the script recorded through the Python SDK (RUN/sdk.json, read by td_run_sdk_sync):
     * its config and its summary, each a JSON object's text; NULL when it recorded none. */
    char *config_json;
    char *summary_json;
    /* When the ingest last saw one of the run's workers write (a metrics line, a log growing;
     * the run store's run_activity), 0 when it has not yet: td_run_last_activity. Read only. */
    double worker_activity_s;
} td_run;

/* ---- the run directory's layout: one table ----
 * Every file and directory tandem keeps in a run's directory, named here once. Each layer asks
 * for a path by its id (td_run_path) instead of spelling the name: the store (record, logs,
 * metrics, artifacts, checkpoints), tandem run (work, lock, setup log), the executors (end
 * records, token, their job files), the ui. X(ID, relative name, what it holds). */
#define TD_RUN_LAYOUT(X)                                                                           \
    X(RECORD, "run.json", "the run's record; runs.db is rebuilt from these")                       \
    X(LOCK, "lock", "held by the run's supervisor (flock): one supervisor per run")                \
    X(LOGS, "logs", "rank-N.log per worker, node-N.log per remote node")                           \
    X(SETUP_LOG, "logs/setup.log", "the setup commands' output")                                   \
    X(SUPERVISOR_LOG, "logs/supervisor.log", "a detached supervisor's output")                     \
    X(METRICS, "metrics", "rank-N.jsonl per worker, system-*.jsonl per node; ingested")            \
    X(ARTIFACTS, "artifacts", "the declared outputs, copied at the end")                           \
    X(ARTIFACTS_S3, "artifacts-s3.json", "artifacts: {to: s3://...}: where each one was uploaded") \
    X(CHECKPOINTS, "checkpoints", "the trainer's checkpoints (TANDEM_CHECKPOINT_DIR)")             \
    X(WORK, "work", "the commands' working directory: the project's entries copied in")            \
    X(END, "end", "end/node-N.json: how each node's launcher ended (endrec.h)")                    \
    X(TOKEN, "token", "the rendezvous and link secret, 0600")                                      \
    X(CODE_TAR, "code.tar", "the run's code, sent to nodes without a shared file system")          \
    X(SLURM_SCRIPT, "job.sbatch", "the Slurm executor's batch script")                             \
    X(SLURM_JOB, "slurm-job", "the Slurm job's id, and `ended STATE` once seen to end")            \
    X(SSH_HOSTS, "ssh-hosts", "the ssh executor's hosts, one per node")                            \
    X(INSTANCES, "instances.json", "the aws executor's instances: type, market, lifetime, end")    \
    X(SDK, "sdk.json", "the Python SDK's config, summary, name and tags; read into the record")    \
    X(IMPORTED, "imported.json", "tandem import: the offline run this run was made from")         \
    X(SDK_INBOX, "sdk-inbox", "a remote node 0's sdk.json as it arrives (its link), then moved up") \
    X(REMOTE, "remote.json", "tandem run -d of an aws run: its controller and where its store is")

#define TD__RUN_PATH_ID(id, name, doc) TD_RUN_PATH_##id,
typedef enum { TD_RUN_LAYOUT(TD__RUN_PATH_ID) TD_RUN_PATH_COUNT } td_run_path_id;
#undef TD__RUN_PATH_ID

/* The name of a path in the run directory ("logs/setup.log"). */
const char *td_run_path_name(td_run_path_id id);
/* RUN/<name> for the run directory run_dir (caller frees). */
char *td_run_path(const char *run_dir, td_run_path_id id);

void td_run_clear(td_run *run);
void td_runs_free(td_run *runs, size_t count);

typedef struct td_rundb td_rundb;

/* Opens (creating if needed) <project_dir>/.tandem/runs.db. project_dir NULL means TANDEM_HOME
 * when set, else the current directory. The path is made absolute. When runs.db is missing and
 * .tandem/runs holds run directories, it is rebuilt from them (td_rundb_rebuild; one warning
 * says so). When runs.db is deleted or replaced while the store is open, the next call notices
 * and reopens it (rebuilding it when it is gone). A store holding runs also sets aside
 * .tandem/reserve (4 MiB) when there is room: see td_run_set_status. */
td_status td_rundb_open(const char *project_dir, td_rundb **out);
/* td_rundb_open with flags: TD_RUNDB_NO_AUTO_REBUILD leaves a missing index empty at this open
 * (`tandem reindex` rebuilds it itself, reporting each run); a file lost later, while open, is
 * still rebuilt when it is reopened. */
#define TD_RUNDB_NO_AUTO_REBUILD 1u
td_status td_rundb_open_ex(const char *project_dir, unsigned flags, td_rundb **out);
void td_rundb_close(td_rundb *store);
/* <project>/.tandem, absolute. */
const char *td_rundb_dir(const td_rundb *store);
/* <project>, absolute. */
const char *td_rundb_project_dir(const td_rundb *store);

typedef struct td_run_spec {
    const char *workflow; /* names the run; characters outside [A-Za-z0-9_.-] become '_' */
    const char *command;
    const char *params_json; /* NULL = "{}" */
    int nodes, nproc_per_node;
    /* the labels it starts with (tandem run --tag/--group/--notes): tags as td_run_set_labels
     * takes them (comma-separated, checked by the caller), group, notes; NULL or "": none */
    const char *tags, *group, *notes;
    /* the lowest number the run may get (0: the next free one): the controller of a detached
     * aws run numbers its run as its submitter did, so both call it by one id */
    int64_t min_n;
} td_run_spec;

/* Inserts a pending run with a fresh id, records the project's code version and makes its
 * directory tree (logs/, metrics/, artifacts/, checkpoints/) and its run.json.
 *
 * run.json describes the run in its own directory (id, workflow, n, status, exit_code, created,
 * started, ended, command, code_version, params, nodes, nproc_per_node, restarts,
 * supervisor_pid, supervisor_start, stop_requested, note, run_dir): every function below that
 * changes the row rewrites it, atomically and in the same write transaction, so the index can be
 * rebuilt from the directories (td_rundb_rebuild). */
td_status td_run_create(td_rundb *store, const td_run_spec *spec, td_run *out);
/* Looks a run up by exact id or unique id prefix. TD_ERR_NOTFOUND / TD_ERR_INVALID (ambiguous)
 * with a message listing the candidates. */
td_status td_run_find(td_rundb *store, const char *id_or_prefix, td_run *out);
/* Runs in creation order. all = 0: active runs plus the 10 newest finished ones; TD_RUN_LIST_ALL:
 * every run. Archived runs (tandem archive) only with TD_RUN_LIST_ARCHIVED added. */
#define TD_RUN_LIST_ALL      1
#define TD_RUN_LIST_ARCHIVED 2
td_status td_run_list(td_rundb *store, int all, td_run **out, size_t *count);

/* ---- the user's labels (run management) ---- */
/* The longest tag or group, and the most tags a run has. */
#define TD_LABEL_MAX 64
#define TD_TAGS_MAX  32
#define TD_NOTES_MAX 65536
/* A tag or group name: 1-64 characters of [A-Za-z0-9_.:/=-], the first a letter, digit or '_'
 * (so `tandem tag RUN -old` can remove one). TD_ERR_INVALID naming what ("tag", "group"),
 * the value and the rule. */
td_status td_label_check(const char *what, const char *label);
/* tags (comma-separated) with the changes applied: each of add[nadd] added, each of del[ndel]
 * removed; sorted, no duplicates. Checks every added tag and the count (TD_TAGS_MAX). */
td_status td_tags_edit(const char *tags, const char *const *add, size_t nadd,
                       const char *const *del, size_t ndel, char **out);
/* Sets the run's tags (the whole comma-separated set), group and notes; NULL leaves that field
 * as it is, "" clears it. Row and run.json together, as every setter. TD_ERR_NOTFOUND. */
td_status td_run_set_labels(td_rundb *store, const char *id, const char *tags, const char *group,
                            const char *notes);
/* Adds add[nadd] to the run's tags and removes del[ndel] (td_tags_edit's rules), reading and
 * writing them in one write transaction, so concurrent edits of one run all take effect.
 * *tags_out: the tags after (free it). TD_ERR_NOTFOUND, TD_ERR_INVALID (a bad tag, too many). */
td_status td_run_edit_tags(td_rundb *store, const char *id, const char *const *add, size_t nadd,
                           const char *const *del, size_t ndel, char **tags_out);
/* Archives (1) or restores (0) a finished run: TD_ERR_INVALID for a run still going. */
td_status td_run_set_archived(td_rundb *store, const char *id, int archived);
/* 1 while the run's supervisor (or a worker of its group) holds RUN/lock, or its recorded
 * supervisor process lives; 0 otherwise. */
int td_run_is_live(const td_run *run);
/* Deletes the run: its rows (metrics, artifacts, logs, ingest offsets, the run) and then its
 * directory. TD_ERR_EXISTS for a live run (td_run_is_live), naming the fix (tandem stop). */
td_status td_run_delete(td_rundb *store, const td_run *run);

/* Status transitions. Stamps started_s on the first move to running and ended_s on a final
 * status; exit_code < -1 leaves the stored exit code unchanged; note may be NULL.
 * On a full disk (TD_ERR_NOSPACE from SQLite or from run.json) the store deletes
 * .tandem/reserve and tries once more, so how a run ended is recorded even then; a final status
 * written while the disk is full (at most 1 MiB free, or the reserve was used) gets "the disk was
 * full: the filesystem mounted at M had N KiB free; free space on M" added to its note.
 * TD_ERR_NOSPACE, naming the filesystem, when even that fails. td_run_request_stop and
 * td_run_reap_stale do the same; the other setters do not touch the reserve. */
td_status td_run_set_status(td_rundb *store, const char *id, td_run_status status, int exit_code,
                            const char *note);
/* Records pid as the run's supervisor, with its start time (supervisor_start) read now from
 * /proc: call it with a live process, normally the caller's own getpid(). */
td_status td_run_set_supervisor(td_rundb *store, const char *id, int64_t pid);
td_status td_run_set_restarts(td_rundb *store, const char *id, int restarts);
/* Marks that a user asked the run to stop (before its supervisor gets SIGTERM), so the
 * supervisor records "stopped" rather than "preempted". Cleared by a resume. */
td_status td_run_request_stop(td_rundb *store, const char *id, int requested);
/* A run recorded as pending/running/resumed whose supervisor process is gone (crashed, killed
 * with -9, machine rebooted) is marked failed with a note. Gone includes a pid now held by
 * another process: one that started at another time than supervisor_start (or, for a run
 * recorded without a start time, one whose command line does not name tandem). Called by the
 * listing verbs. When the run's run.json has a final status (its supervisor recorded the end there
 * but not in this index: the index was rebuilt while it ran), that status is taken instead, with
 * the run's metrics, artifacts and logs brought up to date from its directory. */
td_status td_run_reap_stale(td_rundb *store, td_run *run);
/* A run supervised elsewhere (tandem run -d of an aws run: by its controller in the cloud):
 * RUN/remote.json exists. Its row follows its run.json as pulled from the remote store
 * (td_run_adopt_remote), and td_run_reap_stale never takes it for a run whose supervisor died
 * (it has none on this machine). */
int td_run_is_remote(const td_run *run);
/* Brings the row of a run up to its directory, as a pulled copy of a run supervised elsewhere
 * left it: the status, exit code, times, note and restarts of its run.json (any status, not
 * only a final one), then the metric lines past the stored offsets, the artifacts, logs and
 * sdk.json its files hold. run is updated. Nothing to do without run.json. */
td_status td_run_adopt_remote(td_rundb *store, td_run *run);
/* Sends sig to the run's supervisor, only while the process holding supervisor_pid is the one
 * recorded (the test td_run_reap_stale makes), and through a pidfd where the kernel has them, so
 * a pid reused between the check and the signal is never hit: for a stop, instead of
 * kill(run->supervisor_pid, sig). 0 when sent; -1 with errno ESRCH when the supervisor is gone
 * (its pid free, or another process's now), or kill(2)'s errno. */
int td_run_signal_supervisor(const td_run *run, int sig);

/* ---- rebuilding the index from the run directories ---- */
typedef struct td_rebuild_stats {
    size_t dirs;           /* run directories found in .tandem/runs */
    size_t restored;       /* rows added from the directory's run.json */
    size_t recovered;      /* rows added from a directory without a readable run.json: status
                            * failed, note "recovered by tandem reindex ..." */
    size_t updated;        /* rows still running in the index while run.json had the end */
    size_t present;        /* already in the index: left as they were, except for metric
                            * lines, artifacts and logs their files hold and the index lacks */
    size_t reaped;         /* restored as running, supervisor gone: now failed */
    size_t skipped;        /* entries of .tandem/runs that are not <workflow>-<n> directories */
    size_t dropped;        /* index rows whose run directory is gone (deleted by hand): removed */
    size_t left_out;       /* run directories the index lacks whose run.json is not a regular
                            * file (a FIFO, a link...): not read, not indexed, one warning each */
    int64_t metric_points; /* ingested again from metrics/rank-R.jsonl */
    size_t artifacts;      /* files registered from artifacts/ (size, SHA-256) */
    size_t log_files;      /* files recorded from logs/ */
} td_rebuild_stats;

/* Called once per run directory; what is "restored", "recovered", "updated", "completed" (indexed
 * already; metrics or artifacts it lacked were added) or "present" (nothing to do). */
typedef void (*td_rebuild_fn)(void *arg, const td_run *run, const char *what);

/* Adds to the index every run directory it lacks (oldest first, so ids keep their order and
 * the per-workflow numbering continues after the highest one) and brings in their metrics,
 * artifacts and log files; never changes the row of a run the index has, except to take a
 * final status from run.json (see td_run_reap_stale), but adds the metric lines past its stored
 * offsets and the artifacts it lacks (what a full disk kept out, say). Idempotent; safe beside
 * live runs and other rebuilds. A row whose directory is gone (deleted by hand) is dropped with
 * its metrics, artifacts and logs, unless its supervisor still lives (stats->dropped, on_run's
 * "dropped").
 * A directory that fails is reported and the rest still indexed: the first failure is returned.
 * on_run and stats may be NULL. */
td_status td_rundb_rebuild(td_rundb *store, td_rebuild_fn on_run, void *arg,
                           td_rebuild_stats *stats);

/* The project's code version as stored in runs: see td_run.code_version. Never fails: "none"
 * outside git. Caller frees. */
char *td_code_version(const char *project_dir);

/* ---- what a script recorded through the Python SDK (RUN/sdk.json, docs/python.md) ----
 * {"format": 1, "config": {...}, "summary": {...}, "tags": [...], "name": ..., "project": ...},
 * rewritten atomically by the script's rank 0. Read into the run's row (and so its run.json):
 * config and summary replace config_json and summary_json, tags are added to the run's tags
 * (each checked with td_label_check; a bad one is skipped with a warning). The name does not
 * rename a tracked run (its id was made from `tandem run --name` or the script's name when it
 * was created); tandem import names the run it makes after it. */
/* The largest sdk.json read, and the largest config or summary kept (as compact JSON). */
#define TD_SDK_JSON_MAX   (1 << 20)
#define TD_SDK_OBJECT_MAX (256 << 10)

/* What td_run_sdk_sync saw last, so a poller rereads the file only when it changed. Zero it
 * before the first call. */
typedef struct td_sdk_watch {
    int seen; /* a file was seen: the fields below are its */
    int64_t dev, ino, size, mtime_ns;
    unsigned warned; /* kinds of warning given already (later ones are debug lines) */
} td_sdk_watch;

/* Reads RUN/sdk.json into the run's row when it is there (watch non-NULL: only when its size,
 * mtime or inode changed since the last call). A missing file is nothing to do; one that is not
 * a regular file, is over TD_SDK_JSON_MAX, is not JSON or holds fields of the wrong type is a
 * warning naming the file, never an error: the row keeps what it had. *changed (may be NULL):
 * 1 when the row changed. Errors are the store's (TD_ERR_NOSPACE...). */
td_status td_run_sdk_sync(td_rundb *store, const td_run *run, td_sdk_watch *watch, int *changed);

/* ---- tandem import: an offline run of the Python SDK into the store ----
 * DIR is what tandem.init() writes outside a tracked run (./tandem-offline/<id>/): offline.json,
 * sdk.json, metrics/rank-R.jsonl, artifacts/. A new run is made for it (workflow: the SDK's
 * name, else its project, else "offline"; group: the project when it is a valid label), its
 * metrics files and sdk.json are copied into the run directory and ingested, its artifacts
 * copied (regular files only; links are never followed) and registered, and its status, exit
 * code and times are taken from offline.json. The source is recorded in RUN/imported.json:
 * importing the same offline run again returns the run made the first time (*existed = 1).
 * A run whose offline.json still says "running" is refused (TD_ERR_INVALID: it is still being
 * written, or its script was killed), unless force, which imports it as failed. TD_ERR_NOTFOUND /
 * TD_ERR_FORMAT name DIR and what is missing or wrong. */
td_status td_run_import(td_rundb *store, const char *dir, int force, td_run *out, int *existed);

/* ---- metrics ---- */
typedef struct td_metric_point {
    int rank;
    const char *key;
    int64_t step;
    double value;
    double time_s; /* wall clock; 0 = now */
} td_metric_point;

/* Inserts points in one transaction (retried while the database is busy). */
td_status td_metrics_insert(td_rundb *store, const char *run_id, const td_metric_point *points,
                            size_t count);

typedef struct td_metric_row {
    int rank;
    char *key;
    int64_t step;
    double value;
    double time_s;
} td_metric_row;
void td_metric_rows_free(td_metric_row *rows, size_t count);

/* Points of a run ordered by key, rank, step. key NULL = every key; rank < 0 = every rank. */
td_status td_metrics_query(td_rundb *store, const char *run_id, const char *key, int rank,
                           td_metric_row **out, size_t *count);
/* The newest point (highest step, then lowest rank) of each key. */
td_status td_metrics_last(td_rundb *store, const char *run_id, td_metric_row **out, size_t *count);
/* Number of points stored for a run (all keys and ranks). */
td_status td_metrics_count(td_rundb *store, const char *run_id, int64_t *out);

/* ---- the metrics files: RUN/metrics/rank-<R>.jsonl (docs/metrics-format.md) ----
 * Their names are made and read here only; their lines are written by the sink (C) and the
 * Python SDK's writer (python/tandem/_run.py) and read by the ingester, and nothing else opens
 * them: the UI and the verbs ask the store. */
#define TD_METRICS_MAX_RANK 1000000
/* "rank-<R>.jsonl" (the caller frees it). */
char *td_metrics_file_name(int rank);
/* rank-<R>.jsonl -> R; -1 for any other name (sys.jsonl included). */
int td_metrics_file_rank(const char *name);
/* Whether name is a system metrics file: sys.jsonl (the supervisor's) or sys-<NODE>.jsonl (a
 * remote node agent's), whose lines name their rank. */
int td_metrics_file_is_system(const char *name);
/* rank-<R>.log (a worker's output in RUN/logs) -> R; -1 for any other name. */
int td_log_file_rank(const char *name);

/* ---- run events: the resume and restart lines of the metrics files, kept by the ingest ---- */
typedef enum td_run_event_kind {
    TD_RUN_EVENT_RESUME,  /* {"event": "resume", "step": S}: restarted from the checkpoint of S */
    TD_RUN_EVENT_RESTART, /* {"event": "restart", "step": S}: the worker was started again */
} td_run_event_kind;
const char *td_run_event_kind_name(td_run_event_kind kind);
/* "resume" / "restart" -> *out and 1; 0 for any other name. */
int td_run_event_kind_parse(const char *name, td_run_event_kind *out);

typedef struct td_run_event {
    int64_t id; /* increases in the order the events were stored: a cursor */
    td_run_event_kind kind;
    int rank;
    int64_t step;
    double time_s; /* wall clock; 0 when the line had none and no later line dated it */
} td_run_event;
/* A run's events stored after cursor `after` (0: all), oldest first, at most limit (0: no
 * limit); the caller frees *out. */
td_status td_run_events(td_rundb *store, const char *run_id, int64_t after, size_t limit,
                        td_run_event **out, size_t *count);
/* The highest event id of a run now (0 when it has none): events stored later have higher ids. */
td_status td_run_events_cursor(td_rundb *store, const char *run_id, int64_t *out);

/* ---- ingest: tailing rank-<R>.jsonl files of a metrics directory ---- */
typedef struct td_ingester td_ingester;

td_status td_ingester_new(td_rundb *store, const char *run_id, const char *metrics_dir,
                          td_ingester **out);
void td_ingester_free(td_ingester *ing);
/* Reads what was appended to every rank-<R>.jsonl since the stored offsets and stores it.
 * Each file's points, resume cut-backs and new offset commit in one transaction. A partial
 * last line waits for its newline. *npoints (may be NULL) receives the points stored.
 * On a full disk: TD_ERR_NOSPACE naming the filesystem, every time; the ingester itself logs
 * one warning when that starts (the points stay in the files and are stored once there is
 * room; nothing is skipped) and one line when it is over, so callers should not log
 * TD_ERR_NOSPACE again. */
td_status td_ingester_poll(td_ingester *ing, size_t *npoints);
/* Malformed lines skipped so far by this ingester (each file's first one is logged as a warning
 * naming file:line). */
size_t td_ingester_malformed(const td_ingester *ing);

/* ---- the sink: how a process writes metrics (no store needed) ---- */
typedef struct td_metrics_sink td_metrics_sink;

/* Opens path for appending; path NULL = $TANDEM_METRICS. When neither names a file, *out is
 * NULL and the log functions below accept a NULL sink as a no-op. */
td_status td_metrics_sink_open(const char *path, td_metrics_sink **out);
void td_metrics_sink_close(td_metrics_sink *sink);
/* Appends {"step": step, "time": now, keys[i]: values[i]...} with one write(2), in the line
 * schema of docs/metrics-format.md (a key named like a schema field, such as "step", gets a line
 * {"key": K, "value": V, "step": S, "time": T} of its own; non-finite values are null, which
 * stores no point). A key that is not UTF-8, or a line over 4096 bytes, is TD_ERR_INVALID with
 * nothing written. On a full disk: TD_ERR_NOSPACE naming the filesystem, no half line left
 * behind, and one warning from the sink itself that points are being dropped (and one line when
 * writing works again); the sink stays usable, so callers should keep it and not log
 * TD_ERR_NOSPACE again. */
td_status td_metrics_sink_log(td_metrics_sink *sink, int64_t step, size_t count,
                              const char *const *keys, const double *values);
td_status td_metrics_sink_log1(td_metrics_sink *sink, int64_t step, const char *key, double value);
/* Appends {"event": "resume"|"restart", "step": step, "time": now}. A resume: the writer
 * restarted from a checkpoint at step, so the store drops this rank's points with a higher
 * step. A restart: the worker was started again (by its launcher), going on from step. */
td_status td_metrics_sink_event(td_metrics_sink *sink, td_run_event_kind kind, int64_t step);
/* td_metrics_sink_event(sink, TD_RUN_EVENT_RESUME, step). */
td_status td_metrics_sink_resume(td_metrics_sink *sink, int64_t step);

/* ---- system metrics: CPU %, RSS and GPU use of every worker under a process ---- */
typedef struct td_sysmon td_sysmon;

td_sysmon *td_sysmon_new(void);
void td_sysmon_free(td_sysmon *mon);
/* Walks /proc for the descendants of root that carry RANK in their environment, sums CPU % (since
 * the previous sample) and RSS per rank and stores them as sys/cpu_percent and sys/rss_mb with
 * step = whole seconds since the run was created. Where the NVIDIA driver's libnvidia-ml.so.1
 * loads (at run time; without it nothing changes), a rank whose processes hold a GPU context also
 * gets sys/gpu_mem_mb (their GPU memory summed over all devices, MiB) and sys/gpu_util_percent
 * (the highest utilisation among the devices they are on). *max_restart (may be NULL) receives
 * the highest TORCHELASTIC_RESTART_COUNT / TANDEM_RESTART_COUNT seen in the workers'
 * environments, or -1. */
td_status td_sysmon_sample(td_sysmon *mon, td_rundb *store, const td_run *run, pid_t root,
                           int *max_restart);
/* The same sample, appended to the file path as sys.jsonl's lines (one per rank, steps whole
 * seconds since t0_wall) instead of stored: a node agent on another machine (TANDEM_SYS_METRICS)
 * writes METRICS_DIR/sys-HOST.jsonl, which reaches the run store as its metric files do. */
td_status td_sysmon_sample_to_file(td_sysmon *mon, const char *path, pid_t root, double t0_wall);

/* ---- artifacts ---- */
typedef struct td_artifact {
    char *name; /* path relative to the working directory, as matched */
    char *path; /* the stored copy, absolute */
    int64_t size_bytes;
    char sha256[65];
} td_artifact;
void td_artifacts_free(td_artifact *arts, size_t count);

/* Hex SHA-256 of a file (OpenSSL EVP). */
td_status td_sha256_file(const char *path, char hex_out[65]);
/* Expands each glob relative to work_dir, copies the matching files (directories recursively)
 * into <run_dir>/artifacts/<name> and records name, size and sha256. A pattern that matches
 * nothing is a warning, not an error. *ncopied (may be NULL) receives the files stored. */
td_status td_artifacts_collect(td_rundb *store, const td_run *run, const char *work_dir,
                               const char *const *patterns, size_t npatterns, size_t *ncopied);
td_status td_artifacts_list(td_rundb *store, const char *run_id, td_artifact **out, size_t *count);
/* Records the files a run put into <run_dir>/artifacts itself (the Python SDK's
 * tandem.artifact) that the index does not have yet. *nfound (may be NULL): how many. */
td_status td_artifacts_register_found(td_rundb *store, const td_run *run, size_t *nfound);

/* Log files recorded for a run: rank (-1 for setup/supervisor logs) and absolute path. */
typedef struct td_log_file {
    int rank;
    char *path;
} td_log_file;
/* Scans <run_dir>/logs for rank-<R>.log (and setup.log, supervisor.log), records and returns
 * them ordered by rank. */
td_status td_logs_scan(td_rundb *store, const td_run *run, td_log_file **out, size_t *count);
void td_log_files_free(td_log_file *logs, size_t count);

/* ---- dashboard queries (query.c): what `tandem ui` reads ----
 * Read-only and bounded: each call reads what it needs through the (run, key, rank, step) and
 * (run, key, rank, time) indexes and holds at most one short read transaction, so a training
 * run's writes (WAL) are never blocked. */

/* A read-only connection to the database store has open (same runs.db, busy timeout), for a
 * reader thread: a td_rundb is used by one thread at a time. Close with td_rundb_close. */
td_status td_rundb_open_reader(const td_rundb *store, td_rundb **out);
/* SQLite's data_version of this connection: it changes when another connection commits, so a
 * poller can skip its queries while nothing was written. */
td_status td_rundb_data_version(td_rundb *store, int64_t *out);

/* Every metric key any run has recorded, sorted. Caller frees each and the array. */
td_status td_metrics_all_keys(td_rundb *store, char ***out, size_t *count);
void td_metrics_keys_free(char **keys, size_t count);

/* One (key, rank) of a run: how many points and the range they span. */
typedef struct td_metric_key_summary {
    char *key;
    int rank;
    int64_t count;
    int64_t first_step, last_step; /* lowest and highest step */
    double first_time, last_time;  /* earliest and latest wall time */
} td_metric_key_summary;
/* Every (key, rank) of a run, ordered by key name then rank. */
td_status td_metrics_keys_summary(td_rundb *store, const char *run_id, td_metric_key_summary **out,
                                  size_t *count);
void td_metric_key_summaries_free(td_metric_key_summary *s, size_t count);

/* A key's headline numbers in a run: the last point (highest step) of the lowest rank that has
 * the key, and the minimum and maximum over every rank and step. found = 0 when the run has no
 * point of the key (the other fields are then 0). */
typedef struct td_metric_stats {
    int found;
    int last_rank;
    int64_t last_step;
    double last, min, max;
} td_metric_stats;
/* out[i] for keys[i]. */
td_status td_metrics_stats(td_rundb *store, const char *run_id, const char *const *keys,
                           size_t nkeys, td_metric_stats *out);

/* A key's points, downsampled for a chart nbuckets wide: [from, to] is cut into nbuckets
 * equal-width buckets and, per rank and bucket, the first, the lowest, the highest and the last
 * point are kept (each once, in x order; ties go to the earliest). So no extreme is ever lost,
 * each rank gives at most 4 * nbuckets points, and the same query over the same points gives
 * the same answer. Rows stream in index order and are bucketed as they come: memory is
 * O(nbuckets), whatever the range holds. */
typedef struct td_series_query {
    const char *key;
    int rank;             /* < 0: every rank */
    int x_time;           /* 0: x is the step; 1: x is the point's wall time */
    int has_from, has_to; /* 0: the key's lowest / highest x over every rank */
    double from, to;
    int nbuckets; /* >= 1 */
} td_series_query;

typedef struct td_metric_series {
    int rank;
    int64_t count;  /* points of this rank in [from, to] */
    size_t npoints; /* kept: x[i], y[i] */
    double *x, *y;
} td_metric_series;

typedef struct td_series_result {
    double from, to; /* the range bucketed, defaults filled in */
    int64_t total;   /* points in [from, to] over the ranks returned */
    td_metric_series *series;
    size_t nseries; /* one per rank that has the key, in rank order */
} td_series_result;

/* TD_ERR_NOTFOUND when the run has no point of the key (or of that rank), naming what it has;
 * TD_ERR_INVALID for from > to, nbuckets < 1 or a range whose width overflows. */
td_status td_metrics_series(td_rundb *store, const char *run_id, const td_series_query *q,
                            td_series_result *out);
void td_series_result_clear(td_series_result *r);

/* The metrics cursor: the highest row id of the metrics table now (0 when empty). Rows added
 * later get higher ids, until a resume cut deletes the newest rows (then ids are reused). */
td_status td_metrics_cursor(td_rundb *store, int64_t *out);
/* A run's points added after cursor `after`, in insertion order, at most `limit`; *cursor_out
 * is where the next call should start (the cursor of the whole table when every row up to it
 * was returned, so other runs' rows are not scanned again). */
td_status td_metrics_since(td_rundb *store, const char *run_id, int64_t after, size_t limit,
                           td_metric_row **out, size_t *count, int64_t *cursor_out);
/* How far the ingest has read <run_dir>/metrics/<file> (bytes; 0 before it starts). */
td_status td_metrics_ingested_offset(td_rundb *store, const char *run_id, const char *file,
                                     int64_t *out);

/* ---- the runs table's config columns, filters and states (query.c) ---- */

/* One hyperparameter of a run as the runs table shows it: the workflow's params (tandem run
 * --param, a workflow's params:) and what the script recorded as its config (the Python SDK's
 * tandem.config, tandem train's own config; RUN/sdk.json), one namespace. Nested objects of the
 * config are flattened with '.' ("optimizer.lr"); lists, nulls and strings over
 * TD_RUN_FIELD_TEXT_MAX bytes are left out (tandem show and the run page have them whole). A
 * param and a config key of the same name: the param wins (the user set it for this run). */
#define TD_RUN_FIELD_TEXT_MAX 200
#define TD_RUN_FIELDS_MAX     500
typedef struct td_run_field {
    char *key;
    int is_number; /* number (or bool: 1/0 with text "true"/"false"): `number` holds it */
    double number;
    char *text; /* the value as shown: a number in its shortest exact form, a string as is */
    int from_params; /* 1: a workflow param / --param; 0: the script's config */
} td_run_field;
/* The run's fields sorted by key, at most TD_RUN_FIELDS_MAX. Never fails: a params or config
 * text that is not a JSON object adds nothing. Free with td_run_fields_free. */
void td_run_fields(const td_run *run, td_run_field **out, size_t *count);
void td_run_fields_free(td_run_field *fields, size_t count);
/* The field named key, or NULL. */
const td_run_field *td_run_field_find(const td_run_field *fields, size_t count, const char *key);

/* A filter on one field: KEY=VALUE, KEY!=VALUE, KEY>N, KEY>=N, KEY<N, KEY<=N (tandem ps
 * --filter, GET /api/runs?filter=, the page's filter box). Numbers compare as numbers, equal
 * within a relative 1e-6 (tandem train records lr as a float: 0.200000003 is lr=0.2); anything
 * else compares as text (true, false, adamw). A run without the field never matches (not even
 * KEY!=V). */
typedef enum { TD_FILTER_EQ, TD_FILTER_NE, TD_FILTER_LT, TD_FILTER_LE, TD_FILTER_GT, TD_FILTER_GE }
    td_filter_op;
typedef struct td_run_filter {
    char *key;
    td_filter_op op;
    int is_number;
    double number;
    char *text;
} td_run_filter;
/* TD_ERR_INVALID naming the expression and the forms it may take (no operator, an empty key, a
 * < or > with a value that is not a number). Clear with td_run_filter_clear. */
td_status td_run_filter_parse(const char *expr, td_run_filter *out);
void td_run_filter_clear(td_run_filter *f);
int td_run_filter_match(const td_run_filter *f, const td_run_field *fields, size_t count);
/* The three-way order of two fields' values for a sort: numbers numerically, before text; text
 * by strcmp; a missing field (NULL) after both. */
int td_run_field_cmp(const td_run_field *a, const td_run_field *b);

/* When the run's workers last wrote anything, as the store knows it (worker_activity_s: the
 * ingest's time for a worker's metrics lines, rank-*.jsonl and the others but the system
 * samples sys*.jsonl, and the newest modification of its worker logs, RUN/logs/rank-*.log and
 * node-*.log); the run's start when nothing was seen yet. 0 for a run that has not started.
 * Opens no file: tandem ps and the ui list runs without touching their directories. */
double td_run_last_activity(const td_run *run);
/* Whole seconds a live run has been silent, when that is at least TANDEM_SILENT_S (default 900
 * = 15 min, core.h's TD_ENV_MAP; 0 turns it off): "silent for N min" in tandem ps and the ui.
 * 0 for a run that is not live or has written something since. */
int64_t td_run_silent_s(const td_run *run, double now);

/* Metric keys by how many of the given runs logged them: for each run its distinct keys (one
 * index probe per key, the first max_per_run of them in name order), counted. keys[i] was
 * logged by nruns_with[i] runs; sorted by that count, most first, then by name. Free with
 * td_metrics_keys_free and free(). */
td_status td_metrics_common_keys(td_rundb *store, const char *const *run_ids, size_t nruns,
                                 size_t max_per_run, char ***keys, int64_t **nruns_with,
                                 size_t *count);


/* ---- what a run's cloud instances cost: RUN/instances.json, read as a run-dir file ----
 * The aws executor writes the record (docs/cloud.md "What it costs"); the store reads it the way
 * it reads run.json and sdk.json, so that tandem ps and the ui show a cost without depending on
 * the executor. A live instance bills until it ends, so what is kept is each instance's hourly
 * price and lifetime, and a reader asks for the figure at the time it wants (now, or a metric
 * point's time for the ui's cost axis). */
typedef struct td_run_cost_instance {
    char id[64];
    char type[64];
    char market[32];       /* "spot" or "on-demand" */
    char zone[64];
    char price_source[96]; /* where the price came from; "" when none */
    double usd_per_hour;   /* 0: no price known (left out of the sum, counted as unpriced) */
    double launched_s;     /* 0: not known */
    double ended_s;        /* 0: still billing */
} td_run_cost_instance;

typedef struct td_run_cost {
    td_run_cost_instance *items;
    size_t count;
    size_t unpriced; /* instances without a price */
} td_run_cost;

/* Opens RUN/instances.json of run_dir for reading (*fd_out, its path in *path_out, to free
 * either way): the one place its limits live, for this reader and exec's full one. Never follows
 * a link nor blocks on a FIFO; TD_ERR_NOTFOUND when there is none, TD_ERR_FORMAT naming the
 * file when it is not a regular file under 16 MiB. */
td_status td_run_instances_open(const char *run_dir, int *fd_out, char **path_out);

/* Reads RUN/instances.json of run_dir. TD_ERR_NOTFOUND when the run has none (not a cloud run);
 * TD_ERR_FORMAT naming the file when it is not the documented record. Clear with
 * td_run_cost_clear. Opens that one small file, never follows a link nor blocks on a FIFO. */
td_status td_run_cost_read(const char *run_dir, td_run_cost *out);
void td_run_cost_clear(td_run_cost *c);
/* Whether any instance has a price: otherwise the run's cost is unknown ("-", null), not 0. */
int td_run_cost_priced(const td_run_cost *c);
/* The one cost formula (ps, show, the ui, the record's cost_usd): USD that an instance priced
 * usd_per_hour (0: unknown, costs 0 and is counted unpriced by the callers), launched at
 * launched_s (0: unknown) and ended at ended_s (0: still billing) had accrued by t_s. */
double td_instance_cost_at(double usd_per_hour, double launched_s, double ended_s, double t_s);
/* USD accrued by time t_s (epoch seconds): each priced instance's usd_per_hour times the part of
 * its lifetime before t_s. Equals the record's cost_usd for t_s at or after every end. */
double td_run_cost_at(const td_run_cost *c, double t_s);
/* USD per hour billing at time t_s: the sum of the prices of the instances alive then. */
double td_run_cost_rate(const td_run_cost *c, double t_s);

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_TRACK_H */
