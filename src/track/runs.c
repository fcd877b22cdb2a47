/* The runs table's rows: a run's status names, its directory's layout, creating, finding,
 * listing, archiving and deleting runs (updates of a row are run_update.c's). */
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
    "supervisor_start, tags, run_group, notes, archived, config, summary, "                        \
    "(SELECT worker_s FROM run_activity WHERE run_activity.run = runs.seq)"

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
    r->worker_activity_s = sqlite3_column_double(q, 24); /* NULL (none yet): 0 */
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
    if (n < spec->min_n) n = spec->min_n;
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
