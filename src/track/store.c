/* The run store: one SQLite database in WAL mode under <project>/.tandem, the runs table and its
 * status transitions. Many processes write at once (the supervisor ingesting, verbs reaping,
 * tests hammering it), so every write transaction is BEGIN IMMEDIATE with a busy timeout and a
 * retry loop: a deferred transaction that upgrades to a writer can fail with SQLITE_BUSY without
 * ever waiting, an immediate one waits its turn. */
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

static const char *const status_text[] = {
#define TD__RUN_STATUS_TEXT(name, text) text,
    TD_RUN_STATUS_MAP(TD__RUN_STATUS_TEXT)
#undef TD__RUN_STATUS_TEXT
};

const char *td_run_status_str(td_run_status st) {
    return (unsigned)st < TD_RUN_STATUS_COUNT ? status_text[st] : "unknown";
}

td_status td_run_status_parse(const char *text, td_run_status *out) {
    for (int i = 0; i < TD_RUN_STATUS_COUNT; i++)
        if (text && !strcmp(text, status_text[i])) {
            *out = (td_run_status)i;
            return TD_OK;
        }
    return td_error(TD_ERR_INVALID, "unknown run status '%s'", text ? text : "(null)");
}

int td_run_status_is_final(td_run_status st) {
    return st == TD_RUN_SUCCEEDED || st == TD_RUN_FAILED || st == TD_RUN_STOPPED ||
           st == TD_RUN_PREEMPTED;
}

/* ---- the run directory's layout (TD_RUN_LAYOUT) ---- */
#define TD__RUN_PATH_NAME(id, name, doc) [TD_RUN_PATH_##id] = name,
static const char *const run_path_names[TD_RUN_PATH_COUNT] = {TD_RUN_LAYOUT(TD__RUN_PATH_NAME)};
#undef TD__RUN_PATH_NAME

const char *td_run_path_name(td_run_path_id id) {
    return id >= 0 && id < TD_RUN_PATH_COUNT ? run_path_names[id] : "";
}

char *td_run_path(const char *run_dir, td_run_path_id id) {
    return td_xasprintf("%s/%s", run_dir, td_run_path_name(id));
}

void td_run_clear(td_run *run) {
    if (!run) return;
    free(run->id);
    free(run->workflow);
    free(run->command);
    free(run->code_version);
    free(run->params_json);
    free(run->run_dir);
    free(run->note);
    free(run->tags);
    free(run->group);
    free(run->notes);
    free(run->config_json);
    free(run->summary_json);
    memset(run, 0, sizeof *run);
}

void td_runs_free(td_run *runs, size_t count) {
    for (size_t i = 0; i < count; i++) td_run_clear(&runs[i]);
    free(runs);
}

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
    " path TEXT NOT NULL, PRIMARY KEY(run, path));";

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
static const char *db_file_changed(const td_rundb *store) {
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
    int rebuild = lost && !s->no_auto_rebuild && td__runs_dir_has_runs(s->dir);
    if (moved_aside && !rebuild) TD_LOG_WARN("the run index %s was %s", s->db_path, lost);
    /* WAL: readers (tandem ps, logs -f) never block the ingesting writer and vice versa.
     * synchronous=NORMAL is durable across process crashes, which is the failure that matters. */
    TD_CHECK_GOTO(td__rundb_exec(s, "PRAGMA journal_mode=WAL"), st, out);
    TD_CHECK_GOTO(td__rundb_exec(s, "PRAGMA synchronous=NORMAL"), st, out);
    TD_CHECK_GOTO(td__rundb_begin(s), st, out);
    st = td__rundb_exec(s, schema_sql);
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
        td_status rst = td_rundb_rebuild(s, NULL, NULL, &rs);
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

td_status td_rundb_open(const char *project_dir, td_rundb **out) {
    return td_rundb_open_ex(project_dir, 0, out);
}

td_status td_rundb_open_ex(const char *project_dir, unsigned flags, td_rundb **out) {
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
    const char *how = db_file_changed(store);
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

td_status td__run_seq(td_rundb *store, const char *run_id, int64_t *out) {
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(store, "SELECT seq FROM runs WHERE id = ?", &q));
    sqlite3_bind_text(q, 1, run_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    td_status st = TD_OK;
    if (rc == SQLITE_ROW)
        *out = sqlite3_column_int64(q, 0);
    else if (rc == SQLITE_DONE)
        st = td_error(TD_ERR_NOTFOUND, "no run with id '%s'", run_id);
    else
        st = td__rundb_err(store, "look up run");
    sqlite3_finalize(q);
    return st;
}

static char *col_text(sqlite3_stmt *q, int i) {
    const unsigned char *t = sqlite3_column_text(q, i);
    return t ? td_xstrdup((const char *)t) : NULL;
}

#define RUN_COLUMNS                                                                                \
    "id, workflow, status, exit_code, created, started, ended, command, code_version, params, "    \
    "nodes, nproc_per_node, restarts, supervisor_pid, run_dir, note, stop_requested, "             \
    "supervisor_start, tags, run_group, notes, archived, config, summary"

static void read_run(sqlite3_stmt *q, td_run *r) {
    memset(r, 0, sizeof *r);
    r->id = col_text(q, 0);
    r->workflow = col_text(q, 1);
    const char *s = (const char *)sqlite3_column_text(q, 2);
    if (td_run_status_parse(s, &r->status) != TD_OK) {
        td_error_clear();
        r->status = TD_RUN_FAILED;
    }
    r->exit_code = sqlite3_column_int(q, 3);
    r->created_s = sqlite3_column_double(q, 4);
    r->started_s = sqlite3_column_double(q, 5);
    r->ended_s = sqlite3_column_double(q, 6);
    r->command = col_text(q, 7);
    r->code_version = col_text(q, 8);
    r->params_json = col_text(q, 9);
    r->nodes = sqlite3_column_int(q, 10);
    r->nproc_per_node = sqlite3_column_int(q, 11);
    r->restarts = sqlite3_column_int(q, 12);
    r->supervisor_pid = sqlite3_column_int64(q, 13);
    r->run_dir = col_text(q, 14);
    r->note = col_text(q, 15);
    r->stop_requested = sqlite3_column_int(q, 16);
    r->supervisor_start = sqlite3_column_int64(q, 17);
    r->tags = col_text(q, 18);
    r->group = col_text(q, 19);
    r->notes = col_text(q, 20);
    r->archived = sqlite3_column_int(q, 21);
    r->config_json = col_text(q, 22);
    r->summary_json = col_text(q, 23);
}

td_status td__run_get(td_rundb *store, const char *id, td_run *out, int *found) {
    sqlite3_stmt *q = NULL;
    *found = 0;
    TD_CHECK(td__rundb_prepare(store, "SELECT " RUN_COLUMNS " FROM runs WHERE id = ?", &q));
    sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    td_status st = TD_OK;
    if (rc == SQLITE_ROW) {
        read_run(q, out);
        *found = 1;
    } else if (rc != SQLITE_DONE) {
        st = td__rundb_err(store, "read run");
    }
    sqlite3_finalize(q);
    return st;
}

int64_t td__run_number(const char *id) {
    const char *dash = id ? strrchr(id, '-') : NULL;
    if (!dash || dash == id || !dash[1]) return -1;
    int64_t n = 0;
    for (const char *p = dash + 1; *p; p++) {
        if (*p < '0' || *p > '9' || n > (INT64_MAX - 9) / 10) return -1;
        n = n * 10 + (*p - '0');
    }
    return n > 0 ? n : -1;
}

td_status td__run_insert(td_rundb *store, const td_run *r, int64_t n) {
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(store,
                               "INSERT INTO runs(id, workflow, n, status, exit_code, created,"
                               " started, ended, command, code_version, params, nodes,"
                               " nproc_per_node, restarts, supervisor_pid, run_dir, note,"
                               " stop_requested, supervisor_start, tags, run_group, notes,"
                               " archived, config, summary)"
                               " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                               &q));
    sqlite3_bind_text(q, 1, r->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, r->workflow ? r->workflow : "run", -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 3, n);
    sqlite3_bind_text(q, 4, td_run_status_str(r->status), -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 5, r->exit_code);
    sqlite3_bind_double(q, 6, r->created_s);
    sqlite3_bind_double(q, 7, r->started_s);
    sqlite3_bind_double(q, 8, r->ended_s);
    sqlite3_bind_text(q, 9, r->command ? r->command : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 10, r->code_version ? r->code_version : "unknown", -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 11, r->params_json ? r->params_json : "{}", -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 12, r->nodes > 0 ? r->nodes : 1);
    sqlite3_bind_int(q, 13, r->nproc_per_node > 0 ? r->nproc_per_node : 1);
    sqlite3_bind_int(q, 14, r->restarts);
    sqlite3_bind_int64(q, 15, r->supervisor_pid);
    sqlite3_bind_text(q, 16, r->run_dir, -1, SQLITE_STATIC);
    if (r->note)
        sqlite3_bind_text(q, 17, r->note, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(q, 17);
    sqlite3_bind_int(q, 18, r->stop_requested);
    sqlite3_bind_int64(q, 19, r->supervisor_start);
    sqlite3_bind_text(q, 20, r->tags ? r->tags : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 21, r->group ? r->group : "", -1, SQLITE_STATIC);
    if (r->notes)
        sqlite3_bind_text(q, 22, r->notes, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(q, 22);
    sqlite3_bind_int(q, 23, r->archived);
    sqlite3_bind_text(q, 24, r->config_json, -1, SQLITE_STATIC); /* NULL binds NULL */
    sqlite3_bind_text(q, 25, r->summary_json, -1, SQLITE_STATIC);
    td_status st = td__rundb_step(store, q, "restore a run");
    sqlite3_finalize(q);
    return st;
}

td_status td_run_create(td_rundb *store, const td_run_spec *spec, td_run *out) {
    td_status st = TD_OK;
    memset(out, 0, sizeof *out);
    TD_CHECK(td__rundb_ensure(store));
    td__reserve_ensure(store);
    char *name = td_xstrdup(spec->workflow && *spec->workflow ? spec->workflow : "run");
    for (char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_' || *p == '.' || *p == '-'))
            *p = '_';
    char *version = td_code_version(store->project_dir);
    char *id = NULL, *run_dir = NULL;
    int wrote_json = 0, committed = 0;
    sqlite3_stmt *q = NULL;
    TD_CHECK_GOTO(td__rundb_begin(store), st, out);
    /* The per-workflow counter is read and bumped under the write lock, so two runs created at
     * the same moment by two processes get different numbers. */
    TD_CHECK_GOTO(
        td__rundb_prepare(store, "SELECT COALESCE(MAX(n), 0) + 1 FROM runs WHERE workflow = ?", &q),
        st, out);
    sqlite3_bind_text(q, 1, name, -1, SQLITE_STATIC);
    if (sqlite3_step(q) != SQLITE_ROW) {
        st = td__rundb_err(store, "number the run");
        goto out;
    }
    int64_t n = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    q = NULL;
    /* The directory is claimed with mkdir, which fails where it exists: a run directory is never
     * reused, even when the index lost its row (issue 8: after runs.db was deleted, the next run
     * took tiny-1 again and appended to the old run's logs and checkpoints). */
    char *runs = td_xasprintf("%s/runs", store->dir);
    st = td_mkdirs(runs);
    free(runs);
    if (st != TD_OK) goto out;
    for (;; n++) {
        id = td_xasprintf("%s-%lld", name, (long long)n);
        run_dir = td_xasprintf("%s/runs/%s", store->dir, id);
        if (mkdir(run_dir, 0755) == 0) break;
        if (errno != EEXIST) {
            st = td_error_errno(TD_ERR_IO, "cannot create the run directory %s", run_dir);
            free(id);
            free(run_dir);
            id = run_dir = NULL;
            goto out;
        }
        free(id);
        free(run_dir);
        id = run_dir = NULL;
    }
    TD_CHECK_GOTO(td__rundb_prepare(store,
                                    "INSERT INTO runs(id, workflow, n, status, created, command,"
                                    " code_version, params, nodes, nproc_per_node, run_dir,"
                                    " tags, run_group, notes)"
                                    " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                                    &q),
                  st, out);
    sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 3, n);
    sqlite3_bind_text(q, 4, td_run_status_str(TD_RUN_PENDING), -1, SQLITE_STATIC);
    sqlite3_bind_double(q, 5, td_wall_s());
    sqlite3_bind_text(q, 6, spec->command ? spec->command : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 7, version, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 8, spec->params_json ? spec->params_json : "{}", -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 9, spec->nodes > 0 ? spec->nodes : 1);
    sqlite3_bind_int(q, 10, spec->nproc_per_node > 0 ? spec->nproc_per_node : 1);
    sqlite3_bind_text(q, 11, run_dir, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 12, spec->tags ? spec->tags : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 13, spec->group ? spec->group : "", -1, SQLITE_STATIC);
    if (spec->notes && *spec->notes)
        sqlite3_bind_text(q, 14, spec->notes, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(q, 14);
    TD_CHECK_GOTO(td__rundb_step(store, q, "insert run"), st, out);
    int found = 0;
    TD_CHECK_GOTO(td__run_get(store, id, out, &found), st, out);
    if (!found) {
        st = td_error(TD_ERR_IO, "run %s vanished right after it was inserted", id);
        goto out;
    }
    /* run.json is written under the write lock and before the row commits: the directory
     * describes its run from the first moment, and a failed commit takes both back. */
    wrote_json = 1;
    TD_CHECK_GOTO(td__run_json_write(out), st, out);
    TD_CHECK_GOTO(td__rundb_commit(store), st, out);
    committed = 1;
    static const td_run_path_id subdirs[] = {TD_RUN_PATH_LOGS, TD_RUN_PATH_METRICS,
                                             TD_RUN_PATH_ARTIFACTS, TD_RUN_PATH_CHECKPOINTS};
    for (size_t i = 0; i < TD_ARRAY_LEN(subdirs); i++) {
        char *d = td_run_path(run_dir, subdirs[i]);
        st = td_mkdirs(d);
        free(d);
        if (st != TD_OK) goto out;
    }
out:
    if (st != TD_OK) {
        td__nospace_explain(st, store->dir);
        if (!committed) {
            td__rundb_rollback(store);
            if (run_dir) { /* an empty claim only; anything written by others stays */
                if (wrote_json) {
                    char *json = td_run_path(run_dir, TD_RUN_PATH_RECORD);
                    unlink(json);
                    free(json);
                }
                rmdir(run_dir);
            }
        }
        td_run_clear(out);
    }
    sqlite3_finalize(q);
    free(name);
    free(version);
    free(id);
    free(run_dir);
    return st;
}

td_status td_run_find(td_rundb *store, const char *id_or_prefix, td_run *out) {
    memset(out, 0, sizeof *out);
    TD_CHECK(td__rundb_ensure(store));
    if (!id_or_prefix || !*id_or_prefix)
        return td_error(TD_ERR_INVALID, "empty run id; 'tandem ps -a' lists the runs");
    int found = 0;
    TD_CHECK(td__run_get(store, id_or_prefix, out, &found));
    if (found) return TD_OK;
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(store,
                               "SELECT " RUN_COLUMNS " FROM runs WHERE substr(id, 1, ?) = ?"
                               " ORDER BY seq LIMIT 21",
                               &q));
    sqlite3_bind_int(q, 1, (int)strlen(id_or_prefix));
    sqlite3_bind_text(q, 2, id_or_prefix, -1, SQLITE_STATIC);
    size_t n = 0;
    char list[1024] = "";
    size_t used = 0;
    td_run r;
    while (sqlite3_step(q) == SQLITE_ROW) {
        read_run(q, &r);
        if (n == 0)
            *out = r;
        else {
            if (n == 1) used += (size_t)snprintf(list + used, sizeof list - used, "%s", out->id);
            if (used < sizeof list)
                used += (size_t)snprintf(list + used, sizeof list - used, ", %s", r.id);
            td_run_clear(&r);
        }
        n++;
    }
    sqlite3_finalize(q);
    if (n == 1) return TD_OK;
    if (n == 0) {
        /* Name a few recent runs so the user can see what ids look like. */
        td_run *runs = NULL;
        size_t count = 0;
        if (td_run_list(store, 1, &runs, &count) == TD_OK) {
            for (size_t i = count > 10 ? count - 10 : 0; i < count && used < sizeof list; i++)
                used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "",
                                         runs[i].id);
            td_runs_free(runs, count);
        }
        return td_error(TD_ERR_NOTFOUND, "no run matches '%s'%s%s%s", id_or_prefix,
                        used ? " (recent runs: " : " (the store has no runs yet)", list,
                        used ? ")" : "");
    }
    td_run_clear(out);
    return td_error(TD_ERR_INVALID, "run id prefix '%s' is ambiguous: %s%s; type more of the id",
                    id_or_prefix, list, n > 20 ? ", ..." : "");
}

td_status td_run_list(td_rundb *store, int all, td_run **out, size_t *count) {
    *out = NULL;
    *count = 0;
    TD_CHECK(td__rundb_ensure(store));
    sqlite3_stmt *q = NULL;
    /* Archived runs are left out before the 10 newest finished ones are counted: archiving
     * makes room for the next ones. */
    static const char *const sqls[4] = {
        "SELECT " RUN_COLUMNS " FROM runs WHERE archived = 0 AND (status IN"
        " ('pending','running','resumed') OR seq IN (SELECT seq FROM runs WHERE archived = 0 AND"
        " status NOT IN ('pending','running','resumed') ORDER BY seq DESC LIMIT 10)) ORDER BY seq",
        "SELECT " RUN_COLUMNS " FROM runs WHERE archived = 0 ORDER BY seq",
        "SELECT " RUN_COLUMNS " FROM runs WHERE status IN ('pending','running','resumed')"
        " OR seq IN (SELECT seq FROM runs WHERE status NOT IN"
        " ('pending','running','resumed') ORDER BY seq DESC LIMIT 10) ORDER BY seq",
        "SELECT " RUN_COLUMNS " FROM runs ORDER BY seq",
    };
    const char *sql = sqls[all & 3];
    TD_CHECK(td__rundb_prepare(store, sql, &q));
    size_t cap = 0;
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            *out = td_xrealloc(*out, cap * sizeof **out);
        }
        read_run(q, &(*out)[(*count)++]);
    }
    td_status st = rc == SQLITE_DONE ? TD_OK : td__rundb_err(store, "list runs");
    sqlite3_finalize(q);
    return st;
}

typedef void (*bind_fn)(sqlite3_stmt *q, const void *arg);

/* One UPDATE of a run's row and its run.json rewritten from the updated row (into *row), inside
 * the caller's write transaction. *changed: rows updated, 0 or 1. */
static td_status update_in_tx(td_rundb *store, const char *id, const char *sql, bind_fn bind,
                              const void *arg, const char *what, int *changed, td_run *row) {
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(store, sql, &q));
    bind(q, arg);
    td_status st = td__rundb_step(store, q, what);
    if (st == TD_OK) *changed = sqlite3_changes(store->db);
    sqlite3_finalize(q);
    if (st != TD_OK || !*changed) return st;
    int found = 0;
    td_run_clear(row);
    TD_CHECK(td__run_get(store, id, row, &found));
    /* A run directory deleted by hand has nothing left to describe. */
    struct stat sb;
    if (found && row->run_dir && stat(row->run_dir, &sb) == 0) TD_CHECK(td__run_json_write(row));
    return TD_OK;
}

/* update_in_tx in a write transaction of its own: run.json changes in the same order as the
 * row, and a failure takes back the row (a run.json already renamed into place then describes a
 * state the index missed, which is what reap_stale and the rebuild trust it for). */
static td_status update_row_once(td_rundb *store, const char *id, const char *sql, bind_fn bind,
                                 const void *arg, const char *what, int *changed, td_run *row_out) {
    td_status st = TD_OK;
    td_run row;
    memset(&row, 0, sizeof row);
    *changed = 0;
    TD_CHECK(td__rundb_ensure(store));
    TD_CHECK(td__rundb_begin(store));
    TD_CHECK_GOTO(update_in_tx(store, id, sql, bind, arg, what, changed, &row), st, out);
    TD_CHECK_GOTO(td__rundb_commit(store), st, out);
out:
    if (st != TD_OK) {
        td__rundb_rollback(store);
        *changed = 0;
        td__nospace_explain(st, store->dir);
    }
    if (st == TD_OK && row_out)
        *row_out = row;
    else
        td_run_clear(&row);
    return st;
}

/* update_row_once, and once more when it failed because runs.db went away between the check
 * at its top and the write (emptied, the write read zeros): the retry's check reopens (and
 * rebuilds) it, and how a run stands is not lost to that moment. */
static td_status update_row(td_rundb *store, const char *id, const char *sql, bind_fn bind,
                            const void *arg, const char *what, int *changed, td_run *row_out) {
    td_status st = update_row_once(store, id, sql, bind, arg, what, changed, row_out);
    if (st != TD_OK && st != TD_ERR_NOSPACE && db_file_changed(store)) {
        TD_LOG_DEBUG("%s failed while %s changed under it (%s); trying once more", what,
                     store->db_path, td_error_msg());
        td_error_clear();
        st = update_row_once(store, id, sql, bind, arg, what, changed, row_out);
    }
    return st;
}

static int disk_is_full(td_rundb *store) {
    if (store->nospace_noted) return 1;
    int64_t avail = td__fs_free_bytes(store->dir);
    return avail >= 0 && avail <= TD__LOW_SPACE_BYTES;
}

/* note, then the remark that the disk was full (once). */
static char *note_with_disk_full(const char *note, td_rundb *store) {
    if (note && strstr(note, "the disk was full")) return td_xstrdup(note);
    char *full = td__nospace_note(store->dir);
    char *s = note && *note ? td_xasprintf("%s; %s", note, full) : td_xstrdup(full);
    free(full);
    return s;
}

/* A write that records how a run stands (its status, a stop request). When it fails for lack of
 * space, the store deletes its reserve file and tries once more: a run that succeeded on a full
 * disk must not be left "running" for a reaper to call failed (issue 8). *note_slot (may be
 * NULL) is the note being written; the retry adds that the disk was full. */
static td_status write_with_reserve(td_rundb *store, const char *id, const char *sql, bind_fn bind,
                                    const void *arg, const char **note_slot, const char *what,
                                    int *changed, td_run *row_out) {
    td_status st = update_row(store, id, sql, bind, arg, what, changed, row_out);
    if (st != TD_ERR_NOSPACE) return st;
    char first[1024];
    snprintf(first, sizeof first, "%s", td_error_msg());
    int freed = td__reserve_release(store);
    if (!freed) TD_LOG_DEBUG("%s/reserve was gone already; trying once more anyway", store->dir);
    store->nospace_noted = 1;
    char *noted = NULL;
    const char *saved = NULL;
    if (note_slot) {
        saved = *note_slot;
        noted = note_with_disk_full(saved, store);
        *note_slot = noted;
    }
    st = update_row(store, id, sql, bind, arg, what, changed, row_out);
    if (note_slot) *note_slot = saved;
    free(noted);
    if (st == TD_OK)
        TD_LOG_WARN("%s; run %s was recorded after %s/reserve was deleted to make room", first, id,
                    store->dir);
    return st;
}

struct status_args {
    const char *id;
    td_run_status status;
    int exit_code;
    const char *note;
    double now;
};

static void bind_status(sqlite3_stmt *q, const void *p) {
    const struct status_args *a = p;
    sqlite3_bind_text(q, 1, td_run_status_str(a->status), -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 2, a->exit_code);
    sqlite3_bind_double(q, 3, a->now);
    sqlite3_bind_int(q, 4, td_run_status_is_final(a->status));
    if (a->note)
        sqlite3_bind_text(q, 5, a->note, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(q, 5);
    sqlite3_bind_text(q, 6, a->id, -1, SQLITE_STATIC);
}

td_status td_run_set_status(td_rundb *store, const char *id, td_run_status status, int exit_code,
                            const char *note) {
    /* A run that ends on a full disk says so even when this write found room (SQLite reuses
     * its WAL in place): whatever went wrong with the run probably began there. */
    char *noted = td_run_status_is_final(status) && disk_is_full(store)
                      ? note_with_disk_full(note, store)
                      : NULL;
    struct status_args a = {id, status, exit_code, noted ? noted : note, td_wall_s()};
    int changed = 0;
    td_status st = write_with_reserve(
        store, id,
        "UPDATE runs SET status = ?1,"
        " exit_code = CASE WHEN ?2 < -1 THEN exit_code ELSE ?2 END,"
        " started = CASE WHEN ?1 = 'running' AND started = 0 THEN ?3 ELSE started END,"
        " ended = CASE WHEN ?4 THEN ?3 WHEN ?1 IN ('running','resumed','pending') THEN 0"
        " ELSE ended END,"
        " note = CASE WHEN ?5 IS NOT NULL THEN ?5 WHEN ?4 THEN note ELSE NULL END"
        " WHERE id = ?6",
        bind_status, &a, &a.note, "update run status", &changed, NULL);
    free(noted);
    if (st == TD_OK && !changed) st = td_error(TD_ERR_NOTFOUND, "no run with id '%s'", id);
    return st;
}

struct int_args {
    const char *id;
    int64_t value;
};

static void bind_int(sqlite3_stmt *q, const void *p) {
    const struct int_args *a = p;
    sqlite3_bind_int64(q, 1, a->value);
    sqlite3_bind_text(q, 2, a->id, -1, SQLITE_STATIC);
}

static td_status set_int_column(td_rundb *store, const char *sql, const char *id, int64_t v,
                                int use_reserve) {
    struct int_args a = {id, v};
    int changed = 0;
    td_status st =
        use_reserve
            ? write_with_reserve(store, id, sql, bind_int, &a, NULL, "update run", &changed, NULL)
            : update_row(store, id, sql, bind_int, &a, "update run", &changed, NULL);
    if (st == TD_OK && !changed) st = td_error(TD_ERR_NOTFOUND, "no run with id '%s'", id);
    return st;
}

/* When process pid started: field 22 of /proc/PID/stat, in clock ticks after boot. > 0: the start
 * time; -1: no such process (its /proc entry is gone, or it is a zombie: dead, not yet waited
 * for); 0: unknown (no /proc, unreadable, or not in the format expected). The second field is
 * the command name in parentheses, which may hold spaces and parentheses itself ("(a) b)"): the
 * fields are counted from after the last ')'. */
static int64_t proc_start_ticks(int64_t pid) {
    if (pid <= 0) return -1;
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT && errno != ESRCH) return 0;
        /* A /proc without the entry says the process is gone; no /proc at all says nothing. */
        return access("/proc/self/stat", F_OK) == 0 ? -1 : 0;
    }
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf - 1)) < 0 && errno == EINTR) {
    }
    int err = errno;
    close(fd);
    if (n <= 0) return n < 0 && err == ESRCH ? -1 : 0;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    if (!p) return 0;
    p++;
    while (*p == ' ') p++;
    if (*p == 'Z' || *p == 'X') return -1; /* field 3, the state: zombie or dead */
    /* After ')': field 3 (state) is the first, so field 22 (starttime) is the 20th. */
    for (int field = 3; field < 22; field++) {
        while (*p == ' ') p++;
        if (!*p) return 0;
        while (*p && *p != ' ') p++;
    }
    while (*p == ' ') p++;
    if (*p < '0' || *p > '9') return 0;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno || (*end && *end != ' ' && *end != '\n') || v == 0 || v > INT64_MAX) return 0;
    return (int64_t)v;
}

struct supervisor_args {
    const char *id;
    int64_t pid, start;
};

static void bind_supervisor(sqlite3_stmt *q, const void *p) {
    const struct supervisor_args *a = p;
    sqlite3_bind_int64(q, 1, a->pid);
    sqlite3_bind_int64(q, 2, a->start);
    sqlite3_bind_text(q, 3, a->id, -1, SQLITE_STATIC);
}

td_status td_run_set_supervisor(td_rundb *store, const char *id, int64_t pid) {
    /* Read now, while the process is there: with the pid it names the one process, so a later
     * process that is handed the same pid is never taken for this supervisor. */
    int64_t start = proc_start_ticks(pid);
    struct supervisor_args a = {id, pid, start > 0 ? start : 0};
    int changed = 0;
    td_status st = update_row(store, id,
                              "UPDATE runs SET supervisor_pid = ?1, supervisor_start = ?2"
                              " WHERE id = ?3",
                              bind_supervisor, &a, "update run", &changed, NULL);
    if (st == TD_OK && !changed) st = td_error(TD_ERR_NOTFOUND, "no run with id '%s'", id);
    return st;
}

td_status td_run_set_restarts(td_rundb *store, const char *id, int restarts) {
    return set_int_column(store, "UPDATE runs SET restarts = ? WHERE id = ?", id, restarts, 0);
}

td_status td_run_request_stop(td_rundb *store, const char *id, int requested) {
    /* The reserve too: `tandem stop` on a full disk must still tell stopped from preempted. */
    return set_int_column(store, "UPDATE runs SET stop_requested = ? WHERE id = ?", id, requested,
                          1);
}

enum { SUPERVISOR_ALIVE, SUPERVISOR_GONE, SUPERVISOR_PID_REUSED };

/* Whether the run's supervisor still lives. A pid is reused once its process is gone: with the
 * start time recorded beside it, the pid counts only while the process holding it started then
 * (a run's supervisor that died, its pid handed to the supervisor of a later run, must not be
 * signalled as the first run's: `tandem stop a-1` stopped a-2). A run recorded without one (by
 * an older tandem) falls back to: alive, and its command line names tandem. */
static int supervisor_state(int64_t pid, int64_t start) {
    if (pid <= 0) return SUPERVISOR_GONE;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return SUPERVISOR_GONE;
    if (start > 0) {
        int64_t now = proc_start_ticks(pid);
        if (now < 0) return SUPERVISOR_GONE;
        if (now > 0) return now == start ? SUPERVISOR_ALIVE : SUPERVISOR_PID_REUSED;
        /* Unknown now (no /proc): the check below is all there is. */
    }
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%lld/cmdline", (long long)pid);
    FILE *f = fopen(path, "rb");
    if (!f) return SUPERVISOR_ALIVE; /* no /proc: trust kill() */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if (buf[i] == '\0') buf[i] = ' ';
    return strstr(buf, "tandem") ? SUPERVISOR_ALIVE : SUPERVISOR_PID_REUSED;
}

int td_run_signal_supervisor(const td_run *run, int sig) {
    int64_t pid = run->supervisor_pid;
    if (pid <= 0) {
        errno = ESRCH;
        return -1;
    }
    /* A pidfd names one process for good: once it is open and the process it names is found to
     * be the supervisor, a signal through it can only reach that process (ESRCH once it is
     * gone, whoever holds the pid by then). Without pidfds (a kernel before 5.3), the check and
     * kill(2) leave the narrow gap a pid is reused in between. */
    int fd = -1;
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_send_signal)
    fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (fd < 0 && errno == ESRCH) return -1;
#endif
    if (supervisor_state(pid, run->supervisor_start) != SUPERVISOR_ALIVE) {
        if (fd >= 0) close(fd);
        errno = ESRCH;
        return -1;
    }
    int rc;
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_send_signal)
    if (fd >= 0) {
        rc = (int)syscall(SYS_pidfd_send_signal, fd, sig, NULL, 0);
        int err = errno;
        close(fd);
        errno = err;
        return rc;
    }
#endif
    rc = kill((pid_t)pid, sig);
    return rc;
}

struct adopt_args {
    const td_run *disk;
    const char *id;
    const char *expect; /* the status the index still shows */
};

static void bind_adopt(sqlite3_stmt *q, const void *p) {
    const struct adopt_args *a = p;
    sqlite3_bind_text(q, 1, td_run_status_str(a->disk->status), -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 2, a->disk->exit_code);
    sqlite3_bind_double(q, 3, a->disk->started_s);
    sqlite3_bind_double(q, 4, a->disk->ended_s);
    if (a->disk->note)
        sqlite3_bind_text(q, 5, a->disk->note, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(q, 5);
    sqlite3_bind_int(q, 6, a->disk->restarts);
    sqlite3_bind_text(q, 7, a->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 8, a->expect, -1, SQLITE_STATIC);
}

td_status td__run_adopt(td_rundb *store, td_run *run, const td_run *disk, int *changed) {
    struct adopt_args a = {disk, run->id, td_run_status_str(run->status)};
    td_run row;
    memset(&row, 0, sizeof row);
    TD_CHECK(update_row(store, run->id,
                        "UPDATE runs SET status = ?1, exit_code = ?2,"
                        " started = CASE WHEN ?3 > 0 THEN ?3 ELSE started END, ended = ?4,"
                        " note = ?5, restarts = MAX(restarts, ?6) WHERE id = ?7 AND status = ?8",
                        bind_adopt, &a, "take a run's end from its run.json", changed, &row));
    if (*changed) {
        td_run_clear(run);
        *run = row;
    }
    return TD_OK;
}

struct reap_args {
    const char *id;
    const char *note;
    const char *expect;
    int64_t pid, start;
    double now;
};

static void bind_reap(sqlite3_stmt *q, const void *p) {
    const struct reap_args *a = p;
    sqlite3_bind_double(q, 1, a->now);
    sqlite3_bind_text(q, 2, a->note, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 3, a->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 4, a->expect, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 5, a->pid);
    sqlite3_bind_int64(q, 6, a->start);
}

td_status td_run_reap_stale(td_rundb *store, td_run *run) {
    if (td_run_status_is_final(run->status)) return TD_OK;
    /* A pending run without a supervisor may be being set up right now; give it a minute. */
    if (run->supervisor_pid == 0 && td_wall_s() - run->created_s < 60) return TD_OK;
    int state = supervisor_state(run->supervisor_pid, run->supervisor_start);
    if (state == SUPERVISOR_ALIVE) return TD_OK;
    /* The supervisor may have recorded the end in run.json and not in this index: the index was
     * deleted and rebuilt while it ran, or the disk was full. run.json is then the record. */
    td_run disk;
    int found = 0;
    memset(&disk, 0, sizeof disk);
    if (run->run_dir && td__run_json_read(run->run_dir, &disk, &found) == TD_OK && found &&
        disk.id && !strcmp(disk.id, run->id) && td_run_status_is_final(disk.status)) {
        int changed = 0;
        td_status st = td__run_adopt(store, run, &disk, &changed);
        td_run_clear(&disk);
        if (st == TD_OK && changed) st = td__run_sync_files(store, run, 1, NULL, NULL, NULL);
        return st;
    }
    td_run_clear(&disk);
    td_error_clear();
    char *note = td_xasprintf("its supervisor (pid %lld) is gone; it died or was killed%s",
                              (long long)run->supervisor_pid,
                              state == SUPERVISOR_PID_REUSED
                                  ? " (its pid now belongs to another process, left alone)"
                                  : "");
    if (disk_is_full(store)) {
        char *noted = note_with_disk_full(note, store);
        free(note);
        note = noted;
    }
    struct reap_args a = {run->id,
                          note,
                          td_run_status_str(run->status),
                          run->supervisor_pid,
                          run->supervisor_start,
                          td_wall_s()};
    int changed = 0;
    td_run row;
    memset(&row, 0, sizeof row);
    td_status st =
        write_with_reserve(store, run->id,
                           "UPDATE runs SET status = 'failed', ended = ?, note = ?"
                           " WHERE id = ? AND status = ? AND supervisor_pid = ?"
                           " AND supervisor_start = ?",
                           bind_reap, &a, &a.note, "mark a stale run failed", &changed, &row);
    if (st == TD_OK && changed) {
        td_run_clear(run);
        *run = row;
    } else {
        td_run_clear(&row);
    }
    free(note);
    return st;
}

/* ---- the user's labels, archive and delete (issue 19) ---- */

td_status td_label_check(const char *what, const char *label) {
    size_t len = label ? strlen(label) : 0;
    int ok = len >= 1 && len <= TD_LABEL_MAX;
    for (size_t i = 0; ok && i < len; i++) {
        char c = label[i];
        int alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        ok = alnum || c == '_' ||
             (i > 0 && (c == '.' || c == '-' || c == ':' || c == '/' || c == '='));
    }
    if (ok) return TD_OK;
    /* Control bytes in the value are not echoed as they are: the message reaches a terminal. */
    char shown[3 * TD_LABEL_MAX];
    size_t o = 0;
    for (size_t i = 0; label && label[i] && o + 4 < sizeof shown; i++)
        shown[o++] = (unsigned char)label[i] < 0x20 || label[i] == 0x7f ? '?' : label[i];
    shown[o] = '\0';
    return td_error(TD_ERR_INVALID,
                    "%s '%s'%s: a %s is 1-%d characters of letters, digits and _ . - : / =, "
                    "beginning with a letter, digit or _ (e.g. baseline, lr:3e-4, exp/ablation-2)",
                    what, shown, label && len > TD_LABEL_MAX ? " is too long" : " is not allowed",
                    what, TD_LABEL_MAX);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

td_status td_tags_edit(const char *tags, const char *const *add, size_t nadd,
                       const char *const *del, size_t ndel, char **out) {
    *out = NULL;
    for (size_t i = 0; i < nadd; i++) TD_CHECK(td_label_check("tag", add[i]));
    /* A removal that names no possible tag is a mistake (`tandem tag RUN --help`), not a no-op. */
    for (size_t i = 0; i < ndel; i++) TD_CHECK(td_label_check("tag", del[i]));
    char *copy = td_xstrdup(tags ? tags : "");
    size_t cap = nadd + 1, n = 0;
    for (const char *p = copy; *p; p++) cap += *p == ',';
    const char **set = td_xcalloc(cap, sizeof *set);
    for (char *save = NULL, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
        set[n++] = t;
    for (size_t i = 0; i < nadd; i++) set[n++] = add[i];
    qsort(set, n, sizeof *set, cmp_str);
    size_t kept = 0, len = 1;
    for (size_t i = 0; i < n; i++) {
        int gone = kept && !strcmp(set[kept - 1], set[i]);
        for (size_t j = 0; !gone && j < ndel; j++) gone = !strcmp(del[j], set[i]);
        if (gone) continue;
        set[kept++] = set[i];
        len += strlen(set[i]) + 1;
    }
    td_status st = TD_OK;
    if (kept > TD_TAGS_MAX) {
        st = td_error(TD_ERR_INVALID,
                      "a run has at most %d tags (this would give it %zu); remove some with "
                      "tandem tag RUN -TAG",
                      TD_TAGS_MAX, kept);
    } else {
        char *s = td_xcalloc(len, 1);
        for (size_t i = 0; i < kept; i++) {
            if (i) strcat(s, ",");
            strcat(s, set[i]);
        }
        *out = s;
    }
    free(set);
    free(copy);
    return st;
}

struct labels_args {
    const char *id, *tags, *group, *notes;
};

static void bind_labels(sqlite3_stmt *q, const void *p) {
    const struct labels_args *a = p;
    sqlite3_bind_text(q, 1, a->tags, -1, SQLITE_STATIC); /* NULL binds NULL: unchanged */
    sqlite3_bind_text(q, 2, a->group, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 3, a->notes, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 4, a->id, -1, SQLITE_STATIC);
}

td_status td_run_set_labels(td_rundb *store, const char *id, const char *tags, const char *group,
                            const char *notes) {
    if (group && *group) TD_CHECK(td_label_check("group", group));
    if (notes && strlen(notes) > TD_NOTES_MAX)
        return td_error(TD_ERR_INVALID, "notes of %zu bytes: at most %d are kept; shorten them",
                        strlen(notes), TD_NOTES_MAX);
    struct labels_args a = {id, tags, group, notes};
    int changed = 0;
    td_status st = update_row(store, id,
                              "UPDATE runs SET tags = coalesce(?1, tags),"
                              " run_group = coalesce(?2, run_group),"
                              " notes = CASE WHEN ?3 IS NULL THEN notes WHEN ?3 = '' THEN NULL"
                              " ELSE ?3 END WHERE id = ?4",
                              bind_labels, &a, "label a run", &changed, NULL);
    if (st == TD_OK && !changed) st = td_error(TD_ERR_NOTFOUND, "no run with id '%s'", id);
    return st;
}

struct tags_args {
    const char *tags, *id;
};

static void bind_tags(sqlite3_stmt *q, const void *p) {
    const struct tags_args *a = p;
    sqlite3_bind_text(q, 1, a->tags, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, a->id, -1, SQLITE_STATIC);
}

td_status td_run_edit_tags(td_rundb *store, const char *id, const char *const *add, size_t nadd,
                           const char *const *del, size_t ndel, char **tags_out) {
    td_status st = TD_OK;
    td_run row;
    memset(&row, 0, sizeof row);
    char *tags = NULL;
    int found = 0, changed = 0;
    *tags_out = NULL;
    TD_CHECK(td__rundb_ensure(store));
    /* Read, edit and write under one write lock, run.json written from the same row before the
     * commit: two `tandem tag` at once each see the other's tags (a read before the lock would
     * let the second write drop the first's). */
    TD_CHECK(td__rundb_begin(store));
    TD_CHECK_GOTO(td__run_get(store, id, &row, &found), st, out);
    if (!found) {
        st = td_error(TD_ERR_NOTFOUND, "no run with id '%s'", id);
        goto out;
    }
    TD_CHECK_GOTO(td_tags_edit(row.tags, add, nadd, del, ndel, &tags), st, out);
    if (strcmp(tags, row.tags ? row.tags : "")) {
        struct tags_args a = {tags, id};
        TD_CHECK_GOTO(update_in_tx(store, id, "UPDATE runs SET tags = ?1 WHERE id = ?2",
                                   bind_tags, &a, "tag a run", &changed, &row),
                      st, out);
    }
    TD_CHECK_GOTO(td__rundb_commit(store), st, out);
out:
    if (st != TD_OK) {
        td__rundb_rollback(store);
        td__nospace_explain(st, store->dir);
        free(tags);
        tags = NULL;
    }
    td_run_clear(&row);
    *tags_out = tags;
    return st;
}

static int same_text(const char *a, const char *b) {
    return a && b ? !strcmp(a, b) : a == b;
}

struct sdk_args {
    const char *config, *summary, *tags, *id;
};

static void bind_sdk(sqlite3_stmt *q, const void *arg) {
    const struct sdk_args *a = arg;
    sqlite3_bind_text(q, 1, a->config, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, a->summary, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 3, a->tags, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 4, a->id, -1, SQLITE_STATIC);
}

td_status td__run_apply_sdk(td_rundb *store, const char *id, const char *config,
                            const char *summary, const char *const *tags, size_t ntags,
                            const char *source, int *changed) {
    td_status st = TD_OK;
    td_run row;
    memset(&row, 0, sizeof row);
    char *merged = NULL;
    int found = 0;
    *changed = 0;
    TD_CHECK(td__rundb_ensure(store));
    /* The row is read and written under one write lock: a `tandem tag` at the same moment is
     * neither lost nor undone. */
    TD_CHECK(td__rundb_begin(store));
    TD_CHECK_GOTO(td__run_get(store, id, &row, &found), st, out);
    if (!found) {
        st = td_error(TD_ERR_NOTFOUND, "no run with id '%s'", id);
        goto out;
    }
    const char *had = row.tags ? row.tags : "";
    if (ntags && td_tags_edit(had, tags, ntags, NULL, 0, &merged) != TD_OK) {
        TD_LOG_WARN("%s: its tags are not added to run %s: %s", source, id, td_error_msg());
        td_error_clear();
        merged = NULL;
    }
    int differs = (config && !same_text(config, row.config_json)) ||
                  (summary && !same_text(summary, row.summary_json)) ||
                  (merged && strcmp(merged, had));
    if (differs) {
        struct sdk_args a = {config, summary, merged, id};
        TD_CHECK_GOTO(update_in_tx(store, id,
                                   "UPDATE runs SET config = coalesce(?1, config),"
                                   " summary = coalesce(?2, summary), tags = coalesce(?3, tags)"
                                   " WHERE id = ?4",
                                   bind_sdk, &a, "record what the script's SDK recorded", changed,
                                   &row),
                      st, out);
    }
    TD_CHECK_GOTO(td__rundb_commit(store), st, out);
out:
    if (st != TD_OK) {
        td__rundb_rollback(store);
        *changed = 0;
        td__nospace_explain(st, store->dir);
    }
    td_run_clear(&row);
    free(merged);
    return st;
}

struct imported_args {
    const char *id;
    td_run_status status;
    int exit_code;
    double created, started, ended;
    const char *note, *code_version;
};

static void bind_imported(sqlite3_stmt *q, const void *p) {
    const struct imported_args *a = p;
    sqlite3_bind_text(q, 1, td_run_status_str(a->status), -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 2, a->exit_code);
    sqlite3_bind_double(q, 3, a->created);
    sqlite3_bind_double(q, 4, a->started);
    sqlite3_bind_double(q, 5, a->ended);
    sqlite3_bind_text(q, 6, a->note, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 7, a->code_version, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 8, a->id, -1, SQLITE_STATIC);
}

td_status td__run_set_imported(td_rundb *store, const char *id, td_run_status status, int exit_code,
                               double created, double started, double ended, const char *note,
                               const char *code_version) {
    struct imported_args a = {id, status, exit_code, created, started, ended, note, code_version};
    int changed = 0;
    td_status st = update_row(store, id,
                              "UPDATE runs SET status = ?1, exit_code = ?2, created = ?3,"
                              " started = ?4, ended = ?5, note = ?6, code_version = ?7"
                              " WHERE id = ?8",
                              bind_imported, &a, "record an imported run", &changed, NULL);
    if (st == TD_OK && !changed) st = td_error(TD_ERR_NOTFOUND, "no run with id '%s'", id);
    return st;
}

int td_run_is_live(const td_run *run) {
    if (!td_run_status_is_final(run->status) &&
        supervisor_state(run->supervisor_pid, run->supervisor_start) == SUPERVISOR_ALIVE)
        return 1;
    /* RUN/lock is held (flock) by the supervisor and inherited by its launcher and workers:
     * while any of them lives, something may still write into the directory. */
    if (!run->run_dir) return 0;
    char *path = td_run_path(run->run_dir, TD_RUN_PATH_LOCK);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    free(path);
    if (fd < 0) return 0;
    int held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd);
    return held;
}

td_status td_run_set_archived(td_rundb *store, const char *id, int archived) {
    td_run r;
    TD_CHECK(td_run_find(store, id, &r));
    td_status st = TD_OK;
    if (archived && (!td_run_status_is_final(r.status) || td_run_is_live(&r)))
        st = td_error(TD_ERR_INVALID,
                      "run %s is %s: only a finished run is archived (tandem stop %s first)", r.id,
                      td_run_status_str(r.status), r.id);
    else
        st = set_int_column(store, "UPDATE runs SET archived = ? WHERE id = ?", r.id, archived, 0);
    td_run_clear(&r);
    return st;
}

/* rm -r of path without following links (a link in the tree is removed, not what it names). */
static int remove_tree(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(sb.st_mode)) return unlink(path) == 0 || errno == ENOENT ? 0 : -1;
    DIR *d = opendir(path);
    if (!d) return -1;
    int rc = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *sub = td_xasprintf("%s/%s", path, e->d_name);
        if (remove_tree(sub) != 0) rc = -1;
        free(sub);
    }
    closedir(d);
    if (rmdir(path) != 0 && errno != ENOENT) rc = -1;
    return rc;
}

td_status td_run_delete(td_rundb *store, const td_run *run) {
    if (td_run_is_live(run))
        return td_error(TD_ERR_EXISTS,
                        "run %s is live (its supervisor or workers hold %s/lock): it is not "
                        "removed; stop it first (tandem stop %s), then tandem rm %s",
                        run->id, run->run_dir ? run->run_dir : "RUN", run->id, run->id);
    if (!run->id || !*run->id || strchr(run->id, '/') || !strcmp(run->id, ".") ||
        !strcmp(run->id, ".."))
        return td_error(TD_ERR_INVALID, "run id '%s' names no run directory; not removed",
                        run->id ? run->id : "");
    int64_t seq = 0;
    TD_CHECK(td__rundb_ensure(store));
    TD_CHECK(td__run_seq(store, run->id, &seq));
    /* The rows first, in one transaction: a failure after it leaves a directory without a row,
     * which the next reindex would bring back, rather than a row without a directory. So the
     * directory goes right after, and a failure there names what is left to delete. */
    static const char *const sqls[] = {
        "DELETE FROM metrics WHERE run = ?", "DELETE FROM artifacts WHERE run = ?",
        "DELETE FROM logs WHERE run = ?",    "DELETE FROM ingest_offsets WHERE run = ?",
        "DELETE FROM runs WHERE seq = ?",
    };
    td_status st = TD_OK;
    TD_CHECK(td__rundb_begin(store));
    for (size_t i = 0; st == TD_OK && i < TD_ARRAY_LEN(sqls); i++) {
        sqlite3_stmt *q = NULL;
        st = td__rundb_prepare(store, sqls[i], &q);
        if (st == TD_OK) {
            sqlite3_bind_int64(q, 1, seq);
            st = td__rundb_step(store, q, "delete a run's rows");
        }
        sqlite3_finalize(q);
    }
    if (st == TD_OK) st = td__rundb_commit(store);
    if (st != TD_OK) {
        td__rundb_rollback(store);
        return st;
    }
    /* The directory where the store keeps it (the recorded run_dir may predate a move of the
     * project), and the recorded one when that is elsewhere and still there. */
    char *dir = td_xasprintf("%s/runs/%s", store->dir, run->id);
    if (remove_tree(dir) != 0)
        st = td_error_errno(TD_ERR_IO,
                            "run %s: its rows are deleted but its directory %s could not be "
                            "removed entirely; remove it by hand (rm -r '%s')",
                            run->id, dir, dir);
    free(dir);
    return st;
}
