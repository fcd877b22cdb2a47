/* The run store: one SQLite database in WAL mode under <project>/.tandem, the runs table and its
 * status transitions. Many processes write at once (the supervisor ingesting, verbs reaping,
 * tests hammering it), so every write transaction is BEGIN IMMEDIATE with a busy timeout and a
 * retry loop: a deferred transaction that upgrades to a writer can fail with SQLITE_BUSY without
 * ever waiting, an immediate one waits its turn. */
#include "store_internal.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

void td_run_clear(td_run *run) {
    if (!run) return;
    free(run->id);
    free(run->workflow);
    free(run->command);
    free(run->code_version);
    free(run->params_json);
    free(run->run_dir);
    free(run->note);
    memset(run, 0, sizeof *run);
}

void td_runs_free(td_run *runs, size_t count) {
    for (size_t i = 0; i < count; i++) td_run_clear(&runs[i]);
    free(runs);
}

td_status td__rundb_err(td_rundb *store, const char *what) {
    return td_error(TD_ERR_IO, "run store %s: %s: %s", store->db_path, what,
                    sqlite3_errmsg(store->db));
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
        td_status st = td_error(TD_ERR_IO, "run store %s: '%.60s': %s", store->db_path, sql,
                                err ? err : sqlite3_errmsg(store->db));
        sqlite3_free(err);
        return st;
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
    for (size_t i = 0; i < store->nkeys; i++) free(store->keys[i].name);
    store->nkeys = 0;
}

td_status td__rundb_prepare(td_rundb *store, const char *sql, sqlite3_stmt **out) {
    if (sqlite3_prepare_v2(store->db, sql, -1, out, NULL) != SQLITE_OK)
        return td__rundb_err(store, "prepare");
    return TD_OK;
}

/* Steps a statement to completion (SQLITE_DONE), retrying while busy. */
static td_status step_done(td_rundb *store, sqlite3_stmt *stmt, const char *what) {
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
    " run_dir TEXT, note TEXT, stop_requested INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE IF NOT EXISTS metric_keys(id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL);"
    "CREATE TABLE IF NOT EXISTS metrics(run INTEGER NOT NULL, rank INTEGER NOT NULL,"
    " key INTEGER NOT NULL, step INTEGER NOT NULL, value REAL NOT NULL, time REAL NOT NULL);"
    "CREATE INDEX IF NOT EXISTS metrics_by_run ON metrics(run, key, rank, step);"
    "CREATE TABLE IF NOT EXISTS ingest_offsets(run INTEGER NOT NULL, file TEXT NOT NULL,"
    " offset INTEGER NOT NULL, line INTEGER NOT NULL, malformed INTEGER NOT NULL DEFAULT 0,"
    " PRIMARY KEY(run, file));"
    "CREATE TABLE IF NOT EXISTS artifacts(run INTEGER NOT NULL, name TEXT NOT NULL,"
    " path TEXT NOT NULL, size INTEGER NOT NULL, sha256 TEXT NOT NULL, PRIMARY KEY(run, name));"
    "CREATE TABLE IF NOT EXISTS logs(run INTEGER NOT NULL, rank INTEGER NOT NULL,"
    " path TEXT NOT NULL, PRIMARY KEY(run, path));";

td_status td_rundb_open(const char *project_dir, td_rundb **out) {
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
    TD_CHECK_GOTO(td_mkdirs(s->dir), st, out);
    if (sqlite3_open_v2(s->db_path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
        SQLITE_OK) {
        st = td__rundb_err(s, "open");
        goto out;
    }
    sqlite3_busy_timeout(s->db, 5000);
    /* WAL: readers (tandem ps, logs -f) never block the ingesting writer and vice versa.
     * synchronous=NORMAL is durable across process crashes, which is the failure that matters. */
    TD_CHECK_GOTO(td__rundb_exec(s, "PRAGMA journal_mode=WAL"), st, out);
    TD_CHECK_GOTO(td__rundb_exec(s, "PRAGMA synchronous=NORMAL"), st, out);
    TD_CHECK_GOTO(td__rundb_begin(s), st, out);
    st = td__rundb_exec(s, schema_sql);
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
out:
    if (st != TD_OK) {
        td_rundb_close(s);
        return st;
    }
    *out = s;
    return TD_OK;
}

void td_rundb_close(td_rundb *store) {
    if (!store) return;
    sqlite3_finalize(store->insert_metric);
    if (store->db) sqlite3_close(store->db);
    for (size_t i = 0; i < store->nkeys; i++) free(store->keys[i].name);
    free(store->keys);
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
    "nodes, nproc_per_node, restarts, supervisor_pid, run_dir, note, stop_requested"

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
}

static td_status get_exact(td_rundb *store, const char *id, td_run *out, int *found) {
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(store, "SELECT " RUN_COLUMNS " FROM runs WHERE id = ?", &q));
    sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    td_status st = TD_OK;
    *found = 0;
    if (rc == SQLITE_ROW) {
        read_run(q, out);
        *found = 1;
    } else if (rc != SQLITE_DONE) {
        st = td__rundb_err(store, "read run");
    }
    sqlite3_finalize(q);
    return st;
}

td_status td_run_create(td_rundb *store, const td_run_spec *spec, td_run *out) {
    td_status st = TD_OK;
    memset(out, 0, sizeof *out);
    char *name = td_xstrdup(spec->workflow && *spec->workflow ? spec->workflow : "run");
    for (char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_' || *p == '.' || *p == '-'))
            *p = '_';
    char *version = td_code_version(store->project_dir);
    char *id = NULL, *run_dir = NULL;
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
            goto out;
        }
        free(id);
        free(run_dir);
        id = run_dir = NULL;
    }
    TD_CHECK_GOTO(td__rundb_prepare(store,
                                    "INSERT INTO runs(id, workflow, n, status, created, command,"
                                    " code_version, params, nodes, nproc_per_node, run_dir)"
                                    " VALUES(?,?,?,?,?,?,?,?,?,?,?)",
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
    TD_CHECK_GOTO(step_done(store, q, "insert run"), st, out);
    TD_CHECK_GOTO(td__rundb_commit(store), st, out);
    static const char *const subdirs[] = {"logs", "metrics", "artifacts", "checkpoints"};
    for (size_t i = 0; i < TD_ARRAY_LEN(subdirs); i++) {
        char *d = td_xasprintf("%s/%s", run_dir, subdirs[i]);
        st = td_mkdirs(d);
        free(d);
        if (st != TD_OK) goto out;
    }
    int found = 0;
    TD_CHECK_GOTO(get_exact(store, id, out, &found), st, out);
    if (!found) st = td_error(TD_ERR_IO, "run %s vanished right after it was created", id);
out:
    if (st != TD_OK) {
        td__rundb_rollback(store);
        if (run_dir) rmdir(run_dir); /* an empty claim only; anything written stays */
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
    if (!id_or_prefix || !*id_or_prefix)
        return td_error(TD_ERR_INVALID, "empty run id; 'tandem ps -a' lists the runs");
    int found = 0;
    TD_CHECK(get_exact(store, id_or_prefix, out, &found));
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
    sqlite3_stmt *q = NULL;
    const char *sql =
        all ? "SELECT " RUN_COLUMNS " FROM runs ORDER BY seq"
            : "SELECT " RUN_COLUMNS " FROM runs WHERE status IN ('pending','running','resumed')"
              " OR seq IN (SELECT seq FROM runs WHERE status NOT IN"
              " ('pending','running','resumed') ORDER BY seq DESC LIMIT 10) ORDER BY seq";
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

td_status td_run_set_status(td_rundb *store, const char *id, td_run_status status, int exit_code,
                            const char *note) {
    sqlite3_stmt *q = NULL;
    td_status st;
    TD_CHECK(td__rundb_prepare(
        store,
        "UPDATE runs SET status = ?1,"
        " exit_code = CASE WHEN ?2 < -1 THEN exit_code ELSE ?2 END,"
        " started = CASE WHEN ?1 = 'running' AND started = 0 THEN ?3 ELSE started END,"
        " ended = CASE WHEN ?4 THEN ?3 WHEN ?1 IN ('running','resumed','pending') THEN 0"
        " ELSE ended END,"
        " note = CASE WHEN ?5 IS NOT NULL THEN ?5 WHEN ?4 THEN note ELSE NULL END"
        " WHERE id = ?6",
        &q));
    sqlite3_bind_text(q, 1, td_run_status_str(status), -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 2, exit_code);
    sqlite3_bind_double(q, 3, td_wall_s());
    sqlite3_bind_int(q, 4, td_run_status_is_final(status));
    if (note)
        sqlite3_bind_text(q, 5, note, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(q, 5);
    sqlite3_bind_text(q, 6, id, -1, SQLITE_STATIC);
    st = step_done(store, q, "update run status");
    if (st == TD_OK && sqlite3_changes(store->db) == 0)
        st = td_error(TD_ERR_NOTFOUND, "no run with id '%s'", id);
    sqlite3_finalize(q);
    return st;
}

static td_status set_int_column(td_rundb *store, const char *sql, const char *id, int64_t v) {
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(store, sql, &q));
    sqlite3_bind_int64(q, 1, v);
    sqlite3_bind_text(q, 2, id, -1, SQLITE_STATIC);
    td_status st = step_done(store, q, "update run");
    if (st == TD_OK && sqlite3_changes(store->db) == 0)
        st = td_error(TD_ERR_NOTFOUND, "no run with id '%s'", id);
    sqlite3_finalize(q);
    return st;
}

td_status td_run_set_supervisor(td_rundb *store, const char *id, int64_t pid) {
    return set_int_column(store, "UPDATE runs SET supervisor_pid = ? WHERE id = ?", id, pid);
}

td_status td_run_set_restarts(td_rundb *store, const char *id, int restarts) {
    return set_int_column(store, "UPDATE runs SET restarts = ? WHERE id = ?", id, restarts);
}

td_status td_run_request_stop(td_rundb *store, const char *id, int requested) {
    return set_int_column(store, "UPDATE runs SET stop_requested = ? WHERE id = ?", id, requested);
}

/* Alive and still a tandem process: a recycled pid running something else does not count. */
static int supervisor_alive(int64_t pid) {
    if (pid <= 0) return 0;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 0;
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%lld/cmdline", (long long)pid);
    FILE *f = fopen(path, "rb");
    if (!f) return 1; /* no /proc: trust kill() */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if (buf[i] == '\0') buf[i] = ' ';
    return strstr(buf, "tandem") != NULL;
}

td_status td_run_reap_stale(td_rundb *store, td_run *run) {
    if (td_run_status_is_final(run->status)) return TD_OK;
    /* A pending run without a supervisor may be being set up right now; give it a minute. */
    if (run->supervisor_pid == 0 && td_wall_s() - run->created_s < 60) return TD_OK;
    if (supervisor_alive(run->supervisor_pid)) return TD_OK;
    char *note = td_xasprintf("its supervisor (pid %lld) is gone; it died or was killed",
                              (long long)run->supervisor_pid);
    sqlite3_stmt *q = NULL;
    td_status st = td__rundb_prepare(store,
                                     "UPDATE runs SET status = 'failed', ended = ?, note = ?"
                                     " WHERE id = ? AND status = ? AND supervisor_pid = ?",
                                     &q);
    if (st == TD_OK) {
        sqlite3_bind_double(q, 1, td_wall_s());
        sqlite3_bind_text(q, 2, note, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 3, run->id, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 4, td_run_status_str(run->status), -1, SQLITE_STATIC);
        sqlite3_bind_int64(q, 5, run->supervisor_pid);
        st = step_done(store, q, "mark a stale run failed");
        if (st == TD_OK && sqlite3_changes(store->db) == 1) {
            run->status = TD_RUN_FAILED;
            run->ended_s = td_wall_s();
            free(run->note);
            run->note = note;
            note = NULL;
        }
    }
    sqlite3_finalize(q);
    free(note);
    return st;
}
