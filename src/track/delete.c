/* What a user's archive and rm do to a run: the archived flag, and the run's rows and directory
 * deleted (refused while its processes live). Above liveness.c, which says whether they do. */
#include "store_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

td_status td_run_set_archived(td_rundb *store, const char *id, int archived) {
    td_run r;
    TD_CHECK(td_run_find(store, id, &r));
    td_status st = TD_OK;
    if (archived && (!td_run_status_is_final(r.status) || td_run_is_live(&r)))
        st = td_error(TD_ERR_INVALID,
                      "run %s is %s: only a finished run is archived (tandem stop %s first)", r.id,
                      td_run_status_str(r.status), r.id);
    else
        st = td__run_set_int_column(store, "UPDATE runs SET archived = ? WHERE id = ?", r.id,
                                    archived, 0);
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
        "DELETE FROM metrics WHERE run = ?",
        "DELETE FROM artifacts WHERE run = ?",
        "DELETE FROM logs WHERE run = ?",
        "DELETE FROM ingest_offsets WHERE run = ?",
        "DELETE FROM run_events WHERE run = ?",
        "DELETE FROM run_events_backfill WHERE run = ?",
        "DELETE FROM run_activity WHERE run = ?",
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
