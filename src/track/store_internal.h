/* track internals shared by the store's source files. */
#ifndef TANDEM_TRACK_STORE_INTERNAL_H
#define TANDEM_TRACK_STORE_INTERNAL_H

#include <sqlite3.h>
#include <sys/types.h>

#include "tandem/os.h"
#include "tandem/track.h"

/* td_rundb_rebuild, as the connection calls it when runs.db is lost (open.c sets it). */
typedef td_status (*td__rundb_rebuild_fn)(td_rundb *store, td_rebuild_fn on_run, void *arg,
                                          td_rebuild_stats *stats);

struct td_rundb {
    sqlite3 *db;
    td__rundb_rebuild_fn rebuild; /* NULL: a lost index is not rebuilt */
    char *project_dir; /* absolute */
    char *dir;         /* <project>/.tandem */
    char *db_path;
    /* The database file this connection opened: when runs.db is deleted or replaced under us
     * (issue 8), the next write notices the change and reopens the new file. */
    dev_t db_dev;
    ino_t db_ino;
    /* Bumped on every reopen: run seqs and statement caches of the old file are void. */
    unsigned generation;
    int rebuilding;      /* inside td_rundb_rebuild: do not reopen or rebuild again */
    int no_auto_rebuild; /* TD_RUNDB_NO_AUTO_REBUILD */
    int nospace_noted;   /* the reserve was released by this process (status writes say so) */
    /* metric key name -> id, valid across transactions because keys are never deleted; cleared
     * on rollback since a rolled-back insert may have handed out an id that no longer exists.
     * key_slots indexes it (open addressing on the name's hash; a slot holds index + 1, 0 is
     * empty): a run may log 100,000 keys, and each point looks its key up. */
    struct {
        char *name;
        int64_t id;
    } * keys;
    size_t nkeys, cap_keys;
    uint32_t *key_slots;
    size_t nslots; /* a power of two, at least twice nkeys; 0 before the first key */
    sqlite3_stmt *insert_metric;
};

/* Records a detail naming the database, what was being done and SQLite's message: TD_ERR_NOSPACE
 * (naming the filesystem and the fix) for SQLITE_FULL or an I/O error with ENOSPC,
 * TD_ERR_FORMAT (with how to rebuild) for a damaged file, TD_ERR_IO otherwise. */
td_status td__rundb_err(td_rundb *store, const char *what);
/* BEGIN IMMEDIATE, retried while another process holds the write lock (up to about a minute). */
td_status td__rundb_begin(td_rundb *store);
td_status td__rundb_commit(td_rundb *store);
void td__rundb_rollback(td_rundb *store);
td_status td__rundb_exec(td_rundb *store, const char *sql);
/* A read transaction, so that one answer reads one snapshot (a series' ranks and its range
 * agree). BEGIN is deferred: it takes no lock until the first read, and never the write lock, so
 * a reader never blocks the ingesting writer. read_end commits it (nothing to undo). */
td_status td__rundb_read_begin(td_rundb *store);
void td__rundb_read_end(td_rundb *store);
td_status td__rundb_prepare(td_rundb *store, const char *sql, sqlite3_stmt **out);
/* Steps a statement to SQLITE_DONE (or a row), retrying while busy outside a transaction. */
td_status td__rundb_step(td_rundb *store, sqlite3_stmt *stmt, const char *what);
/* Opens (creating) <project>/.tandem/runs.db, as td_rundb_open_ex describes, with rebuild as
 * the way to rebuild a lost index (open.c passes td_rundb_rebuild). */
td_status td__rundb_connect(const char *project_dir, unsigned flags, td__rundb_rebuild_fn rebuild,
                            td_rundb **out);
/* Reopens the database when its file was deleted or replaced since this connection opened it
 * (rebuilding it from the run directories when it is gone). Call outside transactions, at the
 * top of the public functions; a no-op otherwise. */
td_status td__rundb_ensure(td_rundb *store);
/* The integer key (runs.seq) of a run id; TD_ERR_NOTFOUND naming it. */
td_status td__run_seq(td_rundb *store, const char *run_id, int64_t *out);
/* The id of a metric key, inserting it when new; call inside a transaction. */
td_status td__metric_key_id(td_rundb *store, const char *name, int64_t *out);
/* Forgets the key cache (after a rollback, or with the connection). */
void td__metric_keys_forget(td_rundb *store);
/* Binds and steps the cached insert statement for one point; inside a transaction. */
td_status td__metric_insert_one(td_rundb *store, int64_t run_seq, int rank, int64_t key_id,
                                int64_t step, double value, double time_s);
/* Removes a rank's non-system points with step > step (a resume event). */
td_status td__metrics_cut(td_rundb *store, int64_t run_seq, int rank, int64_t step);

/* ---- run events (events.c) ---- */
/* Stores the event of line `line` of a metrics file (replacing what an earlier read of that
 * line stored); inside the ingest's transaction. */
td_status td__run_event_insert(td_rundb *store, int64_t run_seq, const char *file, int64_t line,
                               int rank, td_run_event_kind kind, int64_t step, double time_s);
/* Dates the file's undated events (time 0) with time_s, the time of the line after them. */
td_status td__run_events_date(td_rundb *store, int64_t run_seq, const char *file, double time_s);
/* Forgets a file's events (it is read again from its start). */
td_status td__run_events_forget_file(td_rundb *store, int64_t run_seq, const char *file);

/* An ingester for one file of metrics_dir only (sysmon stores its own sys.jsonl at once). */
td_status td__ingester_new_file(td_rundb *store, const char *run_id, const char *metrics_dir,
                                const char *name, td_ingester **out);
/* Stores no sign of life (run_activity) from this ingester's reads: a reindex, an import or a
 * reaper reading a run's files after the fact is no sign that its workers are writing. */
void td__ingester_skip_activity(td_ingester *ing);

/* How runs.db is no longer the file this connection opened: "deleted", "replaced" or "emptied
 * (0 bytes)"; NULL while it is (store.c). */
const char *td__rundb_file_changed(const td_rundb *store);

/* ---- row updates (run_update.c) ---- */
/* Binds an UPDATE's parameters from arg. */
typedef void (*td__run_bind_fn)(sqlite3_stmt *q, const void *arg);
/* One UPDATE of run id's row in a write transaction of its own, its run.json rewritten from the
 * updated row (into *row_out when not NULL); tried once more when runs.db changed under it.
 * *changed: rows updated, 0 or 1. */
td_status td__run_update_row(td_rundb *store, const char *id, const char *sql, td__run_bind_fn bind,
                             const void *arg, const char *what, int *changed, td_run *row_out);
/* td__run_update_row for a write that records how a run stands: on a full disk the reserve is
 * deleted and the write tried once more, *note_slot (may be NULL) then saying the disk was full. */
td_status td__run_write_with_reserve(td_rundb *store, const char *id, const char *sql,
                                     td__run_bind_fn bind, const void *arg,
                                     const char **note_slot, const char *what, int *changed,
                                     td_run *row_out);
/* sql (binding ?1 = v, ?2 = id) on run id's row; TD_ERR_NOTFOUND naming it when there is none.
 * use_reserve: td__run_write_with_reserve. */
td_status td__run_set_int_column(td_rundb *store, const char *sql, const char *id, int64_t v,
                                 int use_reserve);

/* Whether the store's filesystem is full (or was found full by this process). */
int td__run_disk_is_full(td_rundb *store);
/* note (may be NULL), then the remark that the disk was full (once); the caller frees it. */
char *td__run_note_disk_full(const char *note, td_rundb *store);

/* ---- a run's record without the store (record.c) ---- */
/* The per-workflow number of an id "<workflow>-<n>": n, or -1 when the id has no such tail. */
int64_t td__run_number(const char *id);

/* ---- rows (runs.c) ---- */
/* Reads the row of an exact id; *found = 0 when there is none. */
td_status td__run_get(td_rundb *store, const char *id, td_run *out, int *found);
/* Inserts a complete row (a run restored from its directory) with per-workflow number n. */
td_status td__run_insert(td_rundb *store, const td_run *run, int64_t n);
/* Takes a run's end (status, exit code, times, note, restarts) from its run.json (disk) while
 * the index still shows the status *run has; *changed = 1 and *run refreshed when it did. */
td_status td__run_adopt(td_rundb *store, td_run *run, const td_run *disk, int *changed);
/* What RUN/sdk.json holds (sdk.c) into the row, row and run.json in one write transaction:
 * config and summary (compact JSON objects; NULL: unchanged) replace the stored ones, tags
 * (checked already) are added to the run's (over TD_TAGS_MAX: a warning naming source, none
 * added). *changed = 1 when the row changed (nothing is written when nothing would). */
td_status td__run_apply_sdk(td_rundb *store, const char *id, const char *config,
                            const char *summary, const char *const *tags, size_t ntags,
                            const char *source, int *changed);
/* An imported run's status, exit code, times, note and code version (import.c). */
td_status td__run_set_imported(td_rundb *store, const char *id, td_run_status status, int exit_code,
                               double created, double started, double ended, const char *note,
                               const char *code_version);

/* ---- run.json (runjson.c): the run directory describes its run ---- */
/* Writes <run_dir>/run.json from the row, atomically (temporary file, fsync, rename). A run.json
 * that is not a regular file (a FIFO, a link: not tandem's doing) is left as it is, with a
 * warning, and TD_OK: the caller's row change still goes through. */
td_status td__run_json_write(const td_run *run);
/* Reads <run_dir>/run.json into out (run_dir set to the directory given). *found = 0 and TD_OK
 * when there is no run.json; TD_ERR_FORMAT naming the file when it is unreadable;
 * TD_ERR_INVALID, naming it, what it is and what to do, when it is not a regular file (a FIFO, a
 * symbolic link, a directory...): it is never opened in a way that could block. */
td_status td__run_json_read(const char *run_dir, td_run *out, int *found);

/* ---- disk space (space.c) ---- */
/* The mount point of the filesystem holding path (path itself when it cannot tell). */
void td__fs_mount_point(const char *path, char *out, size_t cap);
/* Bytes an unprivileged writer may still use on the filesystem holding path; -1 unknown. */
int64_t td__fs_free_bytes(const char *path);
/* When st is TD_ERR_NOSPACE, rewrites the current error detail to name the filesystem holding
 * path, its free space and the fix ("free space on /mnt/x"). Returns st. */
td_status td__nospace_explain(td_status st, const char *path);
/* "the filesystem mounted at M was full (N KiB free); free space on M", for notes. */
char *td__nospace_note(const char *path);
/* Creates <dir>/reserve (a few MiB, posix_fallocate) when it is missing and at least as much
 * again stays free; quiet when it cannot. */
void td__reserve_ensure(td_rundb *store);
/* Deletes the reserve so that a status write can go through on a full disk; 1 when it freed
 * something. */
int td__reserve_release(td_rundb *store);
/* Free space at or below this on the store's filesystem counts as a full disk. */
#define TD__LOW_SPACE_BYTES ((int64_t)1 << 20)

/* ---- artifacts (artifacts.c) ---- */
/* Registers every file under <run_dir>/artifacts (name = path below it, size, SHA-256);
 * only_missing: only those the index does not have (no hashing of the others). */
td_status td__artifacts_register_dir(td_rundb *store, const td_run *run, int only_missing,
                                     size_t *count);

/* ---- run directories (files.c) ---- */
/* Whether a name in <dir>/runs is a run directory's: "<workflow>-<n>", not hidden. */
int td__is_run_dir_name(const char *name);
/* Whether <dir>/runs holds at least one run directory. */
int td__runs_dir_has_runs(const char *store_dir);

/* ---- one run's files into the index (sync.c) ---- */
/* Brings one run's metrics (from the stored offsets on), artifacts (only_missing: those the
 * index lacks), log files and sdk.json (td_run_sdk_sync) from its directory into the index;
 * counts are added to. */
td_status td__run_sync_files(td_rundb *store, const td_run *run, int only_missing, int64_t *npoints,
                             size_t *nartifacts, size_t *nlogs);

#endif
