/* Rebuilding the index (runs.db) from the run directories.
 *
 * Every run directory holds run.json, which the store rewrites with each change of the run's
 * row, so the directories are the record and runs.db is an index over them (issue 8: after
 * runs.db was deleted, `tandem ps` showed nothing and the old runs were lost to every verb).
 * A rebuild adds what the index lacks and never rewrites what it has: a run missing from it is
 * inserted from run.json (or, without one, recovered from the directory's name and files, with
 * a note saying so), its metrics are ingested again from metrics/rank-R.jsonl, its artifacts
 * registered with their size and SHA-256, its log files recorded and its sdk.json (what the
 * script recorded through the Python SDK: config, summary, tags) read. A run the index shows as
 * not finished while run.json has its end takes the end from run.json. A run that was running
 * when the index was lost and whose supervisor is gone ends up failed, as td_run_reap_stale
 * does. Safe to run at any time and as often as wanted, also beside live runs. */
#include "store_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    char *name; /* the directory's name: the run id */
    char *path;
    td_run json; /* from run.json when has_json */
    int has_json;
    char *json_error; /* why run.json could not be read, when it exists */
    int json_refused; /* run.json is not a regular file: the run is left out until fixed */
    double created_s; /* for ordering: run.json's, else the directory's oldest time */
} run_dir_entry;

static double mtime_of(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0) return 0;
    return (double)sb.st_mtim.tv_sec + 1e-9 * (double)sb.st_mtim.tv_nsec;
}

/* The oldest and newest modification times among the directory and its usual subdirectories,
 * and the highest rank named by a metrics or log file: all a directory without run.json says. */
static void dir_facts(const char *run_dir, double *oldest, double *newest, int *max_rank) {
    /* -1: the run directory itself */
    static const int subdirs[] = {-1, TD_RUN_PATH_LOGS, TD_RUN_PATH_METRICS, TD_RUN_PATH_ARTIFACTS,
                                  TD_RUN_PATH_CHECKPOINTS};
    *oldest = *newest = 0;
    *max_rank = -1;
    for (size_t i = 0; i < TD_ARRAY_LEN(subdirs); i++) {
        char *p = subdirs[i] < 0 ? td_xstrdup(run_dir) : td_run_path(run_dir, subdirs[i]);
        double t = mtime_of(p);
        if (t > 0 && (*oldest == 0 || t < *oldest)) *oldest = t;
        if (t > *newest) *newest = t;
        /* rank-N.log and rank-N.jsonl name the workers */
        bool ranks = subdirs[i] == TD_RUN_PATH_LOGS || subdirs[i] == TD_RUN_PATH_METRICS;
        DIR *d = ranks ? opendir(p) : NULL;
        struct dirent *e;
        while (d && (e = readdir(d))) {
            int rank = subdirs[i] == TD_RUN_PATH_LOGS ? td_log_file_rank(e->d_name)
                                                      : td_metrics_file_rank(e->d_name);
            if (rank > *max_rank && rank < 100000) *max_rank = rank;
            char *f = td_xasprintf("%s/%s", p, e->d_name);
            double ft = mtime_of(f);
            if (ft > *newest) *newest = ft;
            free(f);
        }
        if (d) closedir(d);
        free(p);
    }
}

/* A row for a directory without a readable run.json: what its name and files tell, marked. */
static void recover_row(const run_dir_entry *e, td_run *r) {
    memset(r, 0, sizeof *r);
    double oldest, newest;
    int max_rank;
    dir_facts(e->path, &oldest, &newest, &max_rank);
    r->id = td_xstrdup(e->name);
    r->workflow = td_xstrdup(e->name);
    char *dash = strrchr(r->workflow, '-');
    if (dash) *dash = '\0';
    r->status = TD_RUN_FAILED;
    r->exit_code = -1;
    r->created_s = r->started_s = oldest;
    r->ended_s = newest;
    r->command = td_xstrdup("");
    r->code_version = td_xstrdup("unknown");
    r->params_json = td_xstrdup("{}");
    r->nodes = 1;
    r->nproc_per_node = max_rank >= 0 ? max_rank + 1 : 1;
    r->run_dir = td_xstrdup(e->path);
    r->note = td_xasprintf(
        "recovered by tandem reindex from a directory without %s: its command, params, code "
        "version, exit code and how it ended are unknown (recorded as failed); times are those "
        "of its files",
        e->json_error ? "a readable run.json" : "run.json");
}

static int cmp_entry(const void *a, const void *b) {
    const run_dir_entry *x = a, *y = b;
    if (x->created_s != y->created_s) return x->created_s < y->created_s ? -1 : 1;
    int64_t nx = td__run_number(x->name), ny = td__run_number(y->name);
    if (nx != ny) return nx < ny ? -1 : 1;
    return strcmp(x->name, y->name);
}

static void entries_free(run_dir_entry *es, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(es[i].name);
        free(es[i].path);
        free(es[i].json_error);
        td_run_clear(&es[i].json);
    }
    free(es);
}

/* The run directories under <dir>/runs, oldest first (so the rebuilt seqs keep their order). */
static td_status list_run_dirs(td_rundb *store, run_dir_entry **out, size_t *count,
                               size_t *skipped) {
    *out = NULL;
    *count = 0;
    char *runs = td_xasprintf("%s/runs", store->dir);
    DIR *d = opendir(runs);
    if (!d) {
        td_status st = errno == ENOENT ? TD_OK
                                       : td_error_errno(TD_ERR_IO,
                                                        "cannot list the run "
                                                        "directories in %s",
                                                        runs);
        free(runs);
        return st;
    }
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *path = td_xasprintf("%s/%s", runs, e->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode) || !td__is_run_dir_name(e->d_name)) {
            TD_LOG_WARN("%s is not a run directory (<workflow>-<number>); left out of the index",
                        path);
            (*skipped)++;
            free(path);
            continue;
        }
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            *out = td_xrealloc(*out, cap * sizeof **out);
        }
        run_dir_entry *r = &(*out)[(*count)++];
        memset(r, 0, sizeof *r);
        r->name = td_xstrdup(e->d_name);
        r->path = path;
        td_status jst = td__run_json_read(path, &r->json, &r->has_json);
        if (jst != TD_OK) {
            r->json_error = td_xstrdup(td_error_msg());
            r->json_refused = jst == TD_ERR_INVALID;
            td_error_clear();
            r->has_json = 0;
        } else if (r->has_json && (!r->json.id || strcmp(r->json.id, r->name))) {
            /* A directory renamed by hand: its name is the id that claims it. */
            free(r->json.id);
            r->json.id = td_xstrdup(r->name);
        }
        if (r->has_json) {
            r->created_s = r->json.created_s;
        } else {
            double oldest, newest;
            int max_rank;
            dir_facts(path, &oldest, &newest, &max_rank);
            r->created_s = oldest;
        }
    }
    closedir(d);
    free(runs);
    if (*count) qsort(*out, *count, sizeof **out, cmp_entry);
    return TD_OK;
}

/* One directory into the index. */
static td_status sync_one(td_rundb *store, run_dir_entry *e, td_rebuild_fn on_run, void *arg,
                          td_rebuild_stats *stats) {
    td_status st = TD_OK;
    td_run row, fresh;
    memset(&row, 0, sizeof row);
    memset(&fresh, 0, sizeof fresh);
    const char *what;
    int found = 0;
    if (e->has_json) {
        fresh = e->json;
        memset(&e->json, 0, sizeof e->json);
        free(fresh.run_dir);
        fresh.run_dir = td_xstrdup(e->path);
    } else {
        recover_row(e, &fresh);
    }
    int64_t n = td__run_number(e->name);
    /* Looked up and inserted in one write transaction: two rebuilds at once insert each run
     * once. */
    TD_CHECK_GOTO(td__rundb_begin(store), st, out);
    st = td__run_get(store, e->name, &row, &found);
    /* A run.json that is a FIFO, a link, a directory is somebody's doing, not a damaged record:
     * recovering the run as failed from its files would put a guess into the index that a
     * later reindex never corrects. It stays out, with a warning saying what to do. */
    int left_out = st == TD_OK && !found && e->json_refused;
    if (st == TD_OK && !found && !left_out) st = td__run_insert(store, &fresh, n);
    if (st == TD_OK) st = td__rundb_commit(store);
    if (st != TD_OK) {
        td__rundb_rollback(store);
        goto out;
    }
    if (left_out) {
        TD_LOG_WARN("run directory %s left out of the index: %s", e->path, e->json_error);
        stats->left_out++;
        goto out;
    }
    if (!found) {
        what = e->has_json ? "restored" : "recovered";
        if (e->has_json)
            stats->restored++;
        else
            stats->recovered++;
        if (e->json_error) TD_LOG_WARN("%s", e->json_error);
    } else if (!td_run_status_is_final(row.status) && e->has_json &&
               td_run_status_is_final(fresh.status)) {
        int changed = 0;
        TD_CHECK_GOTO(td__run_adopt(store, &row, &fresh, &changed), st, out);
        if (!changed) goto present;
        what = "updated";
        stats->updated++;
    } else {
        goto present;
    }
    td_run_clear(&row);
    TD_CHECK_GOTO(td__run_get(store, e->name, &row, &found), st, out);
    if (!found) {
        st = td_error(TD_ERR_IO, "run %s vanished from the index while it was being rebuilt",
                      e->name);
        goto out;
    }
    TD_CHECK_GOTO(td__run_sync_files(store, &row, found, &stats->metric_points, &stats->artifacts,
                                     &stats->log_files),
                  st, out);
    if (!td_run_status_is_final(row.status)) {
        TD_CHECK_GOTO(td_run_reap_stale(store, &row), st, out);
        if (row.status == TD_RUN_FAILED) stats->reaped++;
    }
    if (on_run) on_run(arg, &row, what);
    goto out;
present:
    /* Indexed already, but what its supervisor could not store (a full disk, an index lost
     * while it ran) may still be in its files: take that, exactly once (metrics continue from
     * the stored offsets, artifacts only where the name is missing). */
    stats->present++;
    {
        int64_t points = 0;
        size_t arts = 0, logs = 0;
        TD_CHECK_GOTO(td__run_sync_files(store, &row, 1, &points, &arts, &logs), st, out);
        stats->metric_points += points;
        stats->artifacts += arts;
        if (on_run) on_run(arg, &row, points || arts ? "completed" : "present");
    }
out:
    if (st != TD_OK) td__nospace_explain(st, store->dir);
    td_run_clear(&row);
    td_run_clear(&fresh);
    return st;
}

td_status td_rundb_rebuild(td_rundb *store, td_rebuild_fn on_run, void *arg,
                           td_rebuild_stats *stats) {
    td_rebuild_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    TD_CHECK(td__rundb_ensure(store));
    run_dir_entry *es = NULL;
    size_t n = 0;
    TD_CHECK(list_run_dirs(store, &es, &n, &stats->skipped));
    stats->dirs = n;
    int was = store->rebuilding;
    store->rebuilding = 1;
    td_status st = TD_OK;
    char first[1536] = "";
    /* Every directory gets its turn: one that fails (a damaged metrics file, say) is reported
     * and the others are still indexed. The first failure is what the caller sees. */
    for (size_t i = 0; i < n; i++) {
        td_status rst = sync_one(store, &es[i], on_run, arg, stats);
        if (rst == TD_OK) continue;
        if (st == TD_OK) {
            st = rst;
            snprintf(first, sizeof first, "run directory %s: %s", es[i].path, td_error_msg());
        } else {
            TD_LOG_WARN("run directory %s: %s", es[i].path, td_error_msg());
        }
        /* Out of space, nothing after this one would fit either. */
        if (rst == TD_ERR_NOSPACE) break;
    }
    /* Rows whose directory is gone (deleted by hand) are ghosts: charts of metrics nobody can
     * check and downloads that fail. The directory is the record; without it the row goes, with
     * its metrics, artifacts and logs. A run whose supervisor still lives keeps its row. */
    td_run *rows = NULL;
    size_t nrows = 0;
    if (st == TD_OK) st = td_run_list(store, TD_RUN_LIST_ALL | TD_RUN_LIST_ARCHIVED, &rows, &nrows);
    for (size_t i = 0; st == TD_OK && i < nrows; i++) {
        char *dir = td_xasprintf("%s/runs/%s", store->dir, rows[i].id);
        struct stat sb;
        int gone = lstat(dir, &sb) != 0 && errno == ENOENT;
        free(dir);
        if (!gone || td_run_is_live(&rows[i])) continue;
        td_status dst = td_run_delete(store, &rows[i]);
        if (dst != TD_OK) {
            st = dst;
            snprintf(first, sizeof first, "%s", td_error_msg());
            break;
        }
        stats->dropped++;
        if (on_run) on_run(arg, &rows[i], "dropped");
    }
    td_runs_free(rows, nrows);
    if (st != TD_OK) td_error(st, "%s", first);
    store->rebuilding = was;
    entries_free(es, n);
    return st;
}
