/* Updates of a run's row, each in a write transaction of its own that rewrites the run's
 * run.json from the updated row: status (with the reserve for a full disk), the user's labels,
 * what the SDK recorded, an imported run's end. */
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

/* One UPDATE of a run's row and its run.json rewritten from the updated row (into *row), inside
 * the caller's write transaction. *changed: rows updated, 0 or 1. */
static td_status update_in_tx(td_rundb *store, const char *id, const char *sql,
                              td__run_bind_fn bind, const void *arg, const char *what,
                              int *changed, td_run *row) {
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
static td_status update_row_once(td_rundb *store, const char *id, const char *sql,
                                 td__run_bind_fn bind, const void *arg, const char *what,
                                 int *changed, td_run *row_out) {
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
td_status td__run_update_row(td_rundb *store, const char *id, const char *sql,
                             td__run_bind_fn bind, const void *arg, const char *what, int *changed,
                             td_run *row_out) {
    td_status st = update_row_once(store, id, sql, bind, arg, what, changed, row_out);
    if (st != TD_OK && st != TD_ERR_NOSPACE && td__rundb_file_changed(store)) {
        TD_LOG_DEBUG("%s failed while %s changed under it (%s); trying once more", what,
                     store->db_path, td_error_msg());
        td_error_clear();
        st = update_row_once(store, id, sql, bind, arg, what, changed, row_out);
    }
    return st;
}

int td__run_disk_is_full(td_rundb *store) {
    if (store->nospace_noted) return 1;
    int64_t avail = td__fs_free_bytes(store->dir);
    return avail >= 0 && avail <= TD__LOW_SPACE_BYTES;
}

/* note, then the remark that the disk was full (once). */
char *td__run_note_disk_full(const char *note, td_rundb *store) {
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
td_status td__run_write_with_reserve(td_rundb *store, const char *id, const char *sql,
                                     td__run_bind_fn bind, const void *arg,
                                     const char **note_slot, const char *what, int *changed,
                                     td_run *row_out) {
    td_status st = td__run_update_row(store, id, sql, bind, arg, what, changed, row_out);
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
        noted = td__run_note_disk_full(saved, store);
        *note_slot = noted;
    }
    st = td__run_update_row(store, id, sql, bind, arg, what, changed, row_out);
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
    char *noted = td_run_status_is_final(status) && td__run_disk_is_full(store)
                      ? td__run_note_disk_full(note, store)
                      : NULL;
    struct status_args a = {id, status, exit_code, noted ? noted : note, td_wall_s()};
    int changed = 0;
    td_status st = td__run_write_with_reserve(
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

td_status td__run_set_int_column(td_rundb *store, const char *sql, const char *id, int64_t v,
                                int use_reserve) {
    struct int_args a = {id, v};
    int changed = 0;
    td_status st =
        use_reserve
            ? td__run_write_with_reserve(store, id, sql, bind_int, &a, NULL, "update run",
                                         &changed, NULL)
            : td__run_update_row(store, id, sql, bind_int, &a, "update run", &changed, NULL);
    if (st == TD_OK && !changed) st = td_error(TD_ERR_NOTFOUND, "no run with id '%s'", id);
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
    td_status st = td__run_update_row(
        store, id,
        "UPDATE runs SET tags = coalesce(?1, tags), run_group = coalesce(?2, run_group),"
        " notes = CASE WHEN ?3 IS NULL THEN notes WHEN ?3 = '' THEN NULL ELSE ?3 END"
        " WHERE id = ?4",
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
    td_status st = td__run_update_row(
        store, id,
        "UPDATE runs SET status = ?1, exit_code = ?2, created = ?3, started = ?4, ended = ?5,"
        " note = ?6, code_version = ?7 WHERE id = ?8",
        bind_imported, &a, "record an imported run", &changed, NULL);
    if (st == TD_OK && !changed) st = td_error(TD_ERR_NOTFOUND, "no run with id '%s'", id);
    return st;
}
