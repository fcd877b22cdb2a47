/* The run events table (run_events): the resume and restart lines of the workers' metrics
 * files, kept by the ingest in the same transaction as the points around them (a resume's cut
 * included), so whoever shows them (the UI's marks, its stream's `reset`) asks the store and
 * never reads RUN/metrics itself. A line's file and line number are its key: the ingest reading
 * a file again from its start (rewritten, or a rebuild) replaces the rows it stored before
 * instead of adding a second copy. */
#include "store_internal.h"

#include <stdlib.h>
#include <string.h>

const char *td_run_event_kind_name(td_run_event_kind kind) {
    return kind == TD_RUN_EVENT_RESTART ? "restart" : "resume";
}

int td_run_event_kind_parse(const char *name, td_run_event_kind *out) {
    if (!name) return 0;
    if (!strcmp(name, "resume"))
        *out = TD_RUN_EVENT_RESUME;
    else if (!strcmp(name, "restart"))
        *out = TD_RUN_EVENT_RESTART;
    else
        return 0;
    return 1;
}

td_status td__run_event_insert(td_rundb *store, int64_t run_seq, const char *file, int64_t line,
                               int rank, td_run_event_kind kind, int64_t step, double time_s) {
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(store,
                               "INSERT OR REPLACE INTO run_events(run, file, line, rank, kind,"
                               " step, time) VALUES(?,?,?,?,?,?,?)",
                               &q));
    sqlite3_bind_int64(q, 1, run_seq);
    sqlite3_bind_text(q, 2, file, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 3, line);
    sqlite3_bind_int(q, 4, rank);
    sqlite3_bind_text(q, 5, td_run_event_kind_name(kind), -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 6, step);
    sqlite3_bind_double(q, 7, time_s);
    td_status st =
        sqlite3_step(q) == SQLITE_DONE ? TD_OK : td__rundb_err(store, "store a run event");
    sqlite3_finalize(q);
    return st;
}

td_status td__run_events_date(td_rundb *store, int64_t run_seq, const char *file, double time_s) {
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(store,
                               "UPDATE run_events SET time = ? WHERE run = ? AND file = ?"
                               " AND time = 0",
                               &q));
    sqlite3_bind_double(q, 1, time_s);
    sqlite3_bind_int64(q, 2, run_seq);
    sqlite3_bind_text(q, 3, file, -1, SQLITE_STATIC);
    td_status st =
        sqlite3_step(q) == SQLITE_DONE ? TD_OK : td__rundb_err(store, "date a run event");
    sqlite3_finalize(q);
    return st;
}

td_status td__run_events_forget_file(td_rundb *store, int64_t run_seq, const char *file) {
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(store, "DELETE FROM run_events WHERE run = ? AND file = ?", &q));
    sqlite3_bind_int64(q, 1, run_seq);
    sqlite3_bind_text(q, 2, file, -1, SQLITE_STATIC);
    td_status st =
        sqlite3_step(q) == SQLITE_DONE ? TD_OK : td__rundb_err(store, "forget run events");
    sqlite3_finalize(q);
    return st;
}

td_status td_run_events(td_rundb *store, const char *run_id, int64_t after, size_t limit,
                        td_run_event **out, size_t *count) {
    *out = NULL;
    *count = 0;
    int64_t seq;
    TD_CHECK(td__rundb_ensure(store));
    TD_CHECK(td__run_seq(store, run_id, &seq));
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(store,
                               "SELECT id, rank, kind, step, time FROM run_events"
                               " WHERE run = ? AND id > ? ORDER BY id LIMIT ?",
                               &q));
    sqlite3_bind_int64(q, 1, seq);
    sqlite3_bind_int64(q, 2, after);
    sqlite3_bind_int64(q, 3, limit ? (int64_t)limit : -1);
    size_t cap = 0;
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        td_run_event_kind kind;
        if (!td_run_event_kind_parse((const char *)sqlite3_column_text(q, 2), &kind)) continue;
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            *out = td_xrealloc(*out, cap * sizeof **out);
        }
        (*out)[(*count)++] = (td_run_event){sqlite3_column_int64(q, 0), kind,
                                            sqlite3_column_int(q, 1), sqlite3_column_int64(q, 3),
                                            sqlite3_column_double(q, 4)};
    }
    td_status st = rc == SQLITE_DONE ? TD_OK : td__rundb_err(store, "read run events");
    sqlite3_finalize(q);
    if (st != TD_OK) {
        free(*out);
        *out = NULL;
        *count = 0;
    }
    return st;
}

td_status td_run_events_cursor(td_rundb *store, const char *run_id, int64_t *out) {
    *out = 0;
    int64_t seq;
    TD_CHECK(td__rundb_ensure(store));
    TD_CHECK(td__run_seq(store, run_id, &seq));
    sqlite3_stmt *q = NULL;
    TD_CHECK(
        td__rundb_prepare(store, "SELECT coalesce(max(id), 0) FROM run_events WHERE run = ?", &q));
    sqlite3_bind_int64(q, 1, seq);
    td_status st = TD_OK;
    if (sqlite3_step(q) == SQLITE_ROW)
        *out = sqlite3_column_int64(q, 0);
    else
        st = td__rundb_err(store, "read the run events' cursor");
    sqlite3_finalize(q);
    return st;
}
