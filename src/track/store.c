/* The run store's database: one SQLite file in WAL mode under <project>/.tandem (runs.db), its
 * schema, opening (and rebuilding when it is lost or replaced), and the transaction helpers the
 * other files use. Many processes write at once (the supervisor ingesting, verbs reaping, tests
 * hammering it), so every write transaction is BEGIN IMMEDIATE with a busy timeout and a retry
 * loop: a deferred transaction that upgrades to a writer can fail with SQLITE_BUSY without ever
 * waiting, an immediate one waits its turn. The runs table's rows are runs.c's, their updates
 * run_update.c's, whether a run's processes live liveness.c's. */
#include "store_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

td_status td__rundb_err(td_rundb *store, const char *what) {
    if (!store->db)
        return td_error(TD_ERR_IO,
                        "run store %s: %s: the database is not open (an earlier reopen "
                        "failed); open the store again",
                        store->db_path, what);
    int ext = sqlite3_extended_errcode(store->db), prim = ext & 0xff;
    int sys = sqlite3_system_errno(store->db);
    const char *msg = sqlite3_errmsg(store->db);
    /* SQLite says SQLITE_FULL when a write hits ENOSPC, but some paths (growing the -shm index,
     * a checkpoint) report a plain I/O error; on a filesystem with next to nothing free that is
     * the same full disk and deserves the same message and fix. */
    int64_t avail = -1;
    if (prim == SQLITE_IOERR && sys != ENOSPC && sys != EDQUOT)
        avail = td__fs_free_bytes(store->dir);
    if (prim == SQLITE_FULL || (prim == SQLITE_IOERR && (sys == ENOSPC || sys == EDQUOT)) ||
        (prim == SQLITE_IOERR && avail >= 0 && avail <= TD__LOW_SPACE_BYTES)) {
        td_error(TD_ERR_NOSPACE, "run store %s: %s: %s (no space left on device)", store->db_path,
                 what, msg);
        return td__nospace_explain(TD_ERR_NOSPACE, store->dir);
    }
    if (prim == SQLITE_CORRUPT || prim == SQLITE_NOTADB)
        return td_error(TD_ERR_FORMAT,
                        "run store %s: %s: %s; the index is damaged: move it aside (mv %s "
                        "%s.broken) and run 'tandem reindex' to rebuild it from the run "
                        "directories",
                        store->db_path, what, msg, store->db_path, store->db_path);
    return td_error(TD_ERR_IO, "run store %s: %s: %s", store->db_path, what, msg);
}

/* The metric key cache belongs to the connection: forgotten with it, and after a rollback. */
void td__metric_keys_forget(td_rundb *store) {
    for (size_t i = 0; i < store->nkeys; i++) free(store->keys[i].name);
    store->nkeys = 0;
    if (store->key_slots) memset(store->key_slots, 0, store->nslots * sizeof *store->key_slots);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int is_busy(int rc) {
    rc &= 0xff;
    return rc == SQLITE_BUSY || rc == SQLITE_LOCKED;
}

td_status td__rundb_exec(td_rundb *store, const char *sql) {
    char *err = NULL;
    for (int attempt = 0;; attempt++) {
        int rc = sqlite3_exec(store->db, sql, NULL, NULL, &err);
        if (rc == SQLITE_OK) return TD_OK;
        if (is_busy(rc) && attempt < 600) {
            sqlite3_free(err);
            err = NULL;
            sleep_ms(5 + attempt % 20);
            continue;
        }
        sqlite3_free(err);
        char what[80];
        snprintf(what, sizeof what, "'%.60s'", sql);
        return td__rundb_err(store, what);
    }
}

td_status td__rundb_begin(td_rundb *store) {
    return td__rundb_exec(store, "BEGIN IMMEDIATE");
}

td_status td__rundb_commit(td_rundb *store) {
    return td__rundb_exec(store, "COMMIT");
}

td_status td__rundb_read_begin(td_rundb *store) {
    return td__rundb_exec(store, "BEGIN");
}

void td__rundb_read_end(td_rundb *store) {
    if (!sqlite3_get_autocommit(store->db)) sqlite3_exec(store->db, "COMMIT", NULL, NULL, NULL);
}

void td__rundb_rollback(td_rundb *store) {
    if (sqlite3_get_autocommit(store->db)) return;
    sqlite3_exec(store->db, "ROLLBACK", NULL, NULL, NULL);
    td__metric_keys_forget(store);
}

td_status td__rundb_prepare(td_rundb *store, const char *sql, sqlite3_stmt **out) {
    *out = NULL;
    if (!store->db || sqlite3_prepare_v2(store->db, sql, -1, out, NULL) != SQLITE_OK)
        return td__rundb_err(store, "prepare");
    return TD_OK;
}

td_status td__rundb_step(td_rundb *store, sqlite3_stmt *stmt, const char *what) {
    for (int attempt = 0;; attempt++) {
        int rc = sqlite3_step(stmt);
        if (rc == SQLITE_DONE || rc == SQLITE_ROW) return TD_OK;
        if (is_busy(rc) && attempt < 600 && sqlite3_get_autocommit(store->db)) {
            sqlite3_reset(stmt);
            sleep_ms(5 + attempt % 20);
            continue;
        }
        return td__rundb_err(store, what);
    }
}

static const char *const schema_sql =
    "CREATE TABLE IF NOT EXISTS runs("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, workflow TEXT NOT NULL,"
    " n INTEGER NOT NULL, status TEXT NOT NULL, exit_code INTEGER NOT NULL DEFAULT -1,"
    " created REAL NOT NULL, started REAL NOT NULL DEFAULT 0, ended REAL NOT NULL DEFAULT 0,"
    " command TEXT, code_version TEXT, params TEXT, nodes INTEGER, nproc_per_node INTEGER,"
    " restarts INTEGER NOT NULL DEFAULT 0, supervisor_pid INTEGER NOT NULL DEFAULT 0,"
    " run_dir TEXT, note TEXT, stop_requested INTEGER NOT NULL DEFAULT 0,"
    " supervisor_start INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE IF NOT EXISTS metric_keys(id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL);"
    "CREATE TABLE IF NOT EXISTS metrics(run INTEGER NOT NULL, rank INTEGER NOT NULL,"
    " key INTEGER NOT NULL, step INTEGER NOT NULL, value REAL NOT NULL, time REAL NOT NULL);"
    "CREATE INDEX IF NOT EXISTS metrics_by_run ON metrics(run, key, rank, step);"
    "CREATE INDEX IF NOT EXISTS metrics_by_time ON metrics(run, key, rank, time);"
    "CREATE INDEX IF NOT EXISTS metrics_by_value ON metrics(run, key, value);"
    "CREATE TABLE IF NOT EXISTS ingest_offsets(run INTEGER NOT NULL, file TEXT NOT NULL,"
    " offset INTEGER NOT NULL, line INTEGER NOT NULL, malformed INTEGER NOT NULL DEFAULT 0,"
    " PRIMARY KEY(run, file));"
    "CREATE TABLE IF NOT EXISTS artifacts(run INTEGER NOT NULL, name TEXT NOT NULL,"
    " path TEXT NOT NULL, size INTEGER NOT NULL, sha256 TEXT NOT NULL, PRIMARY KEY(run, name));"
    "CREATE TABLE IF NOT EXISTS logs(run INTEGER NOT NULL, rank INTEGER NOT NULL,"
    " path TEXT NOT NULL, PRIMARY KEY(run, path));"
    /* The metrics files' resume and restart lines (events.c); keyed by where they were read. */
    "CREATE TABLE IF NOT EXISTS run_events(id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " run INTEGER NOT NULL, file TEXT NOT NULL, line INTEGER NOT NULL, rank INTEGER NOT NULL,"
    " kind TEXT NOT NULL, step INTEGER NOT NULL, time REAL NOT NULL, UNIQUE(run, file, line));"
    /* Files ingested before run_events existed: their events up to `upto` bytes are read by the
     * ingest's next poll of the file (a reindex polls every run), then the row goes. */
    "CREATE TABLE IF NOT EXISTS run_events_backfill(run INTEGER NOT NULL, file TEXT NOT NULL,"
    " upto INTEGER NOT NULL, PRIMARY KEY(run, file));"
    /* When the ingest last saw a worker write (a metrics line or a log growing; ingest.c): the
     * "silent" state of tandem ps and the ui, read without opening the run's files. */
    "CREATE TABLE IF NOT EXISTS run_activity(run INTEGER PRIMARY KEY, worker_s REAL NOT NULL);";

/* Columns added to the runs table since its first version, for an index made by an older
 * tandem: added (with their default, which means "unknown") when the store is opened, inside
 * the schema's write transaction, so two processes opening an old index at once add each once.
 * An older tandem keeps working with the wider table: it names the columns it writes. */
static const struct {
    const char *name, *decl;
} added_run_columns[] = {
    {"supervisor_start", "INTEGER NOT NULL DEFAULT 0"},
    /* The user's labels (issue 19). "group" is an SQL keyword: the column is run_group. */
    {"tags", "TEXT NOT NULL DEFAULT ''"},
    {"run_group", "TEXT NOT NULL DEFAULT ''"},
    {"notes", "TEXT"},
    {"archived", "INTEGER NOT NULL DEFAULT 0"},
    /* What the script recorded through the Python SDK (RUN/sdk.json, issue 19). */
    {"config", "TEXT"},
    {"summary", "TEXT"},
};

/* Whether the database has a table of that name (sqlite_master: a schema made by any version). */
static td_status table_exists(td_rundb *s, const char *name, int *out) {
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(
        s, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?", &q));
    sqlite3_bind_text(q, 1, name, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    *out = rc == SQLITE_ROW && sqlite3_column_int(q, 0) > 0;
    sqlite3_finalize(q);
    return rc == SQLITE_ROW ? TD_OK : td__rundb_err(s, "read the schema");
}

static td_status migrate_schema(td_rundb *s) {
    for (size_t i = 0; i < TD_ARRAY_LEN(added_run_columns); i++) {
        sqlite3_stmt *q = NULL;
        TD_CHECK(td__rundb_prepare(
            s, "SELECT count(*) FROM pragma_table_info('runs') WHERE name = ?", &q));
        sqlite3_bind_text(q, 1, added_run_columns[i].name, -1, SQLITE_STATIC);
        int rc = sqlite3_step(q);
        int have = rc == SQLITE_ROW && sqlite3_column_int(q, 0) > 0;
        sqlite3_finalize(q);
        if (rc != SQLITE_ROW) return td__rundb_err(s, "read the runs table's columns");
        if (have) continue;
        char *sql = td_xasprintf("ALTER TABLE runs ADD COLUMN %s %s", added_run_columns[i].name,
                                 added_run_columns[i].decl);
        td_status st = td__rundb_exec(s, sql);
        free(sql);
        TD_CHECK(st);
        TD_LOG_DEBUG("run store %s: added the column runs.%s (an index made by an older tandem)",
                     s->db_path, added_run_columns[i].name);
    }
    return TD_OK;
}

/* Closes the connection. When runs.db was deleted or replaced under us, the WAL and index files
 * at <db>-wal and <db>-shm may already belong to the new database: SQLite deletes both by name
 * when its last connection closes, so tell it to keep them (PERSIST_WAL) and leave them alone. */
static void close_db(td_rundb *s) {
    if (!s->db) return;
    sqlite3_finalize(s->insert_metric);
    s->insert_metric = NULL;
    struct stat sb;
    int gone = stat(s->db_path, &sb) != 0;
    if (s->db_ino && (gone || sb.st_dev != s->db_dev || sb.st_ino != s->db_ino)) {
        int one = 1;
        sqlite3_file_control(s->db, "main", SQLITE_FCNTL_PERSIST_WAL, &one);
    } else if (s->db_ino && S_ISREG(sb.st_mode) && sb.st_size == 0) {
        /* Our file, emptied under us: a checkpoint on close would write the pages this
         * connection's WAL holds into it, leaving a fragment that is neither empty nor an
         * index. Keep them out; the reopen sees an empty file and rebuilds it. */
        sqlite3_db_config(s->db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, NULL);
    }
    sqlite3_close(s->db);
    s->db = NULL;
    s->db_ino = 0;
    td__metric_keys_forget(s);
}

/* Whether the database open in s->db holds the store's tables: 1 it has the runs table, 0 it
 * holds nothing at all (schema-less), -1 it holds other things but no runs table (someone else's
 * database, or a fragment of ours), -2 it cannot be read (the statements after this report it). */
static int probe_schema(td_rundb *s) {
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(s->db,
                           "SELECT count(*), coalesce(sum(type = 'table' AND name = 'runs'), 0)"
                           " FROM sqlite_master",
                           -1, &q, NULL) != SQLITE_OK)
        return -2;
    int result = -2;
    if (sqlite3_step(q) == SQLITE_ROW)
        result = sqlite3_column_int64(q, 1) > 0 ? 1 : sqlite3_column_int64(q, 0) == 0 ? 0 : -1;
    sqlite3_finalize(q);
    return result;
}

static void unlink_journal(const td_rundb *s) {
    char *wal = td_xasprintf("%s-wal", s->db_path), *shm = td_xasprintf("%s-shm", s->db_path);
    unlink(wal);
    unlink(shm);
    free(wal);
    free(shm);
}

/* How runs.db is no longer the file this connection opened, as it was: "deleted", "replaced" or
 * "emptied (0 bytes)" (truncated by hand or by a failed copy: the index in it is gone as surely as
 * when it is deleted, whatever this connection's WAL still holds); NULL while it is. */
const char *td__rundb_file_changed(const td_rundb *store) {
    struct stat sb;
    if (stat(store->db_path, &sb) != 0) return "deleted";
    if (!store->db || sb.st_dev != store->db_dev || sb.st_ino != store->db_ino) return "replaced";
    return S_ISREG(sb.st_mode) && sb.st_size == 0 ? "emptied (0 bytes)" : NULL;
}

/* Opens s->db_path. Under an exclusive flock on <dir>/runs.db.lock a process decides whether the
 * index is lost (the file is missing, empty, or holds none of the store's tables), creates it
 * and, when run directories exist, rebuilds it from them: so exactly one process rebuilds and
 * every other one waits and then sees the whole index, never a half-built one. */
static td_status open_db(td_rundb *s) {
    td_status st = TD_OK;
    char *lock_path = td_xasprintf("%s.lock", s->db_path);
    char *lost = NULL; /* why the index has to be rebuilt ("missing", ...); NULL: it is there */
    int moved_aside = 0;
    int lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    /* Without the lock file (a full or read-only disk) opening still works; only two processes
     * rebuilding a missing index at the same moment would each do part of the work. */
    if (lock_fd >= 0)
        while (flock(lock_fd, LOCK_EX) != 0 && errno == EINTR) {
        }
    free(lock_path);
    struct stat sb;
    if (stat(s->db_path, &sb) != 0) {
        if (errno == ENOENT) lost = td_xstrdup("missing");
    } else if (S_ISREG(sb.st_mode) && sb.st_size == 0) {
        /* Emptied (a stray `: > runs.db`, a copy that failed): no index is in it, and SQLite
         * would take it for a new database. It goes, so that a process still holding the old
         * file sees a new one and reopens, and it is rebuilt like a missing one. */
        lost = td_xstrdup("empty (0 bytes)");
        unlink(s->db_path);
    }
    if (lost) {
        /* A -wal or -shm left by a deleted or emptied runs.db (perhaps still open in a
         * supervisor that has not noticed yet) would be replayed into the new file and corrupt
         * it. The old database is gone; its journal is of no use to anyone but that process,
         * which keeps its descriptors. */
        unlink_journal(s);
    }
    for (;;) {
        if (sqlite3_open_v2(s->db_path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
            SQLITE_OK) {
            st = td__rundb_err(s, "open");
            goto out;
        }
        sqlite3_busy_timeout(s->db, 5000);
        if (lost) break;
        int schema = probe_schema(s);
        if (schema == 0) {
            lost = td_xstrdup("a database without the run store's tables");
            break;
        }
        if (schema != -1) break;
        /* Someone else's database, or a fragment of ours: adding our tables to it would mix
         * its rows with the rebuilt ones. It is kept for whoever wants to look at it. */
        sqlite3_close(s->db);
        s->db = NULL;
        char *aside = td_xasprintf("%s.unknown-%lld", s->db_path, (long long)time(NULL));
        if (rename(s->db_path, aside) != 0) {
            st = td_error_errno(TD_ERR_FORMAT,
                                "run store %s holds no runs table (it is not a run index) and "
                                "cannot be moved aside to %s; move it away by hand and run "
                                "'tandem reindex'",
                                s->db_path, aside);
            free(aside);
            goto out;
        }
        unlink_journal(s);
        lost = td_xasprintf("not a run index (it had no runs table; moved aside to %s)", aside);
        free(aside);
        moved_aside = 1;
    }
    int rebuild = lost && !s->no_auto_rebuild && s->rebuild && td__runs_dir_has_runs(s->dir);
    if (moved_aside && !rebuild) TD_LOG_WARN("the run index %s was %s", s->db_path, lost);
    /* WAL: readers (tandem ps, logs -f) never block the ingesting writer and vice versa.
     * synchronous=NORMAL is durable across process crashes, which is the failure that matters. */
    TD_CHECK_GOTO(td__rundb_exec(s, "PRAGMA journal_mode=WAL"), st, out);
    TD_CHECK_GOTO(td__rundb_exec(s, "PRAGMA synchronous=NORMAL"), st, out);
    TD_CHECK_GOTO(td__rundb_begin(s), st, out);
    int had_events = 0;
    st = table_exists(s, "run_events", &had_events);
    if (st == TD_OK) st = td__rundb_exec(s, schema_sql);
    /* An index made before the events table: what its ingest read already holds events that
     * only a second read finds (the points of those bytes are stored; only events are read). */
    if (st == TD_OK && !had_events)
        st = td__rundb_exec(s, "INSERT OR IGNORE INTO run_events_backfill(run, file, upto)"
                               " SELECT run, file, offset FROM ingest_offsets"
                               " WHERE file LIKE 'rank-%' AND offset > 0");
    if (st == TD_OK) st = migrate_schema(s);
    if (st != TD_OK) {
        td__rundb_rollback(s);
        goto out;
    }
    TD_CHECK_GOTO(td__rundb_commit(s), st, out);
    TD_CHECK_GOTO(td__rundb_prepare(s,
                                    "INSERT INTO metrics(run, rank, key, step, value, time) "
                                    "VALUES(?,?,?,?,?,?)",
                                    &s->insert_metric),
                  st, out);
    if (stat(s->db_path, &sb) == 0) {
        s->db_dev = sb.st_dev;
        s->db_ino = sb.st_ino;
    }
    if (rebuild) {
        /* The run directories are the record (each holds its run.json); an empty index over
         * them would show no runs while their ids stay taken. Rebuilding is what `tandem
         * reindex` does, and it is idempotent. */
        td_rebuild_stats rs;
        td_status rst = s->rebuild(s, NULL, NULL, &rs);
        if (rst == TD_OK)
            TD_LOG_WARN("the run index %s was %s; rebuilt it from %zu run director%s in "
                        "%s/runs (%zu from run.json, %zu recovered without one)",
                        s->db_path, lost, rs.dirs, rs.dirs == 1 ? "y" : "ies", s->dir, rs.restored,
                        rs.recovered);
        else
            TD_LOG_WARN("the run index %s was %s and could only partly be rebuilt from "
                        "%s/runs: %s; run 'tandem reindex' once that is fixed",
                        s->db_path, lost, s->dir, td_error_msg());
        td_error_clear();
    }
out:
    if (st != TD_OK) close_db(s);
    if (lock_fd >= 0) close(lock_fd); /* releases the flock */
    free(lost);
    return st;
}

td_status td__rundb_connect(const char *project_dir, unsigned flags, td__rundb_rebuild_fn rebuild,
                            td_rundb **out) {
    td_status st = TD_OK;
    *out = NULL;
    char cwd[PATH_MAX];
    const char *base = project_dir;
    if (!base || !*base) base = td_env_str(TD_ENV_HOME);
    if (!base || !*base) {
        if (!getcwd(cwd, sizeof cwd))
            return td_error_errno(TD_ERR_IO, "cannot read the current directory");
        base = cwd;
    }
    char *abs = realpath(base, NULL);
    if (!abs)
        return td_error_errno(TD_ERR_NOTFOUND, "project directory %s (TANDEM_HOME or cwd)", base);
    td_rundb *s = td_xcalloc(1, sizeof *s);
    s->project_dir = abs;
    s->dir = td_xasprintf("%s/.tandem", abs);
    s->db_path = td_xasprintf("%s/runs.db", s->dir);
    s->no_auto_rebuild = (flags & TD_RUNDB_NO_AUTO_REBUILD) != 0;
    s->rebuild = rebuild;
    st = td_mkdirs(s->dir);
    if (st != TD_OK) {
        td__nospace_explain(st, s->project_dir);
        goto out;
    }
    TD_CHECK_GOTO(open_db(s), st, out);
    /* Only this first open: a file lost later, while open, is always rebuilt on the reopen. */
    s->no_auto_rebuild = 0;
    /* Only a store in use gets a reserve: `tandem ps` typed in the wrong directory should not
     * leave 4 MiB behind. td_run_create sets it aside for a new one. */
    if (td__runs_dir_has_runs(s->dir)) td__reserve_ensure(s);
out:
    if (st != TD_OK) {
        td_rundb_close(s);
        return st;
    }
    *out = s;
    return TD_OK;
}

td_status td__rundb_ensure(td_rundb *store) {
    if (store->rebuilding || (store->db && !sqlite3_get_autocommit(store->db))) return TD_OK;
    const char *how = td__rundb_file_changed(store);
    if (!how) return TD_OK;
    if (store->db)
        TD_LOG_WARN("run store %s was %s while this process had it open; reopening it",
                    store->db_path, how);
    close_db(store);
    store->generation++;
    return open_db(store);
}

void td_rundb_close(td_rundb *store) {
    if (!store) return;
    close_db(store);
    free(store->keys);
    free(store->key_slots);
    free(store->project_dir);
    free(store->dir);
    free(store->db_path);
    free(store);
}

const char *td_rundb_dir(const td_rundb *store) {
    return store->dir;
}

const char *td_rundb_project_dir(const td_rundb *store) {
    return store->project_dir;
}
