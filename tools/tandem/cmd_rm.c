/* tandem rm and tandem archive: a run deleted for good (its directory and every row the index
 * has of it, so no ghost is left on the page), or kept and hidden from the listings. A live
 * run is refused by both: its supervisor still writes into the directory and the index. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "run_cli.h"
#include "tandem/exec.h"

static const cli_opt rm_opts[] = {{0}};

static const cli_command rm_verb = {
    .name = "tandem rm",
    .usage = "RUN...",
    .about = "Deletes each run: its directory (logs, metrics, artifacts, checkpoints) and its\n"
             "rows in the index. A live run (its supervisor or workers hold RUN/lock) is\n"
             "refused: tandem stop it first. Not undone: tandem archive hides a run instead.\n",
    .opts = rm_opts,
};

int cmd_rm(int argc, char **argv) {
    const char **ids = NULL;
    size_t n = 0;
    int rc = run_cli_operands(&rm_verb, argc, argv, 0, NULL, &ids, &n);
    if (rc >= 0) return rc;
    if (!n) {
        free(ids);
        return run_cli_usage_error(&rm_verb);
    }
    td_rundb *store = NULL;
    rc = run_cli_open_store(&store);
    /* Cloud instances a dead supervisor left are found through RUN/instances.json: terminate
     * them before any directory that lists them is gone (no AWS call unless one is listed
     * alive and its lock is free). */
    if (!rc) td_gc_orphans(store, stderr, NULL);
    for (size_t i = 0; !rc && i < n; i++) {
        td_run r = {0};
        /* An exact id only: a prefix that happens to match one run is not what rm should
         * guess. */
        td_status st = td_run_find(store, ids[i], &r);
        if (st == TD_OK && strcmp(r.id, ids[i]))
            st = td_error(TD_ERR_INVALID,
                          "tandem rm takes whole run ids: '%s' is a prefix of %s (type it out)",
                          ids[i], r.id);
        if (st == TD_OK && td_run_reap_stale(store, &r) != TD_OK) td_error_clear();
        /* A job a scheduler still holds for a run whose supervisor died (Slurm) is cancelled
         * first: with the directory gone, nothing would know of it any more. */
        const td_executor *ex =
            st == TD_OK && td_run_status_is_final(r.status) && !td_run_is_live(&r)
                ? td_executor_of_run(&r)
                : NULL;
        if (ex && ex->cancel_orphan) {
            int cancelled = 0;
            char what[512];
            st = ex->cancel_orphan(&r, &cancelled, what, sizeof what);
            if (st == TD_OK && cancelled) printf("%s\n", what);
        }
        if (st == TD_OK) st = td_run_delete(store, &r);
        if (st == TD_OK)
            printf("removed %s\n", run_cli_text(r.id));
        else {
            run_cli_error(st);
            rc = st == TD_ERR_NOTFOUND || st == TD_ERR_INVALID ? 2 : 1;
        }
        td_run_clear(&r);
    }
    free(ids);
    if (store) td_rundb_close(store);
    return rc;
}

enum { OPT_UNDO = 1 };

static const cli_opt archive_opts[] = {
    {OPT_UNDO, "undo", 0, NULL, "bring the runs back into the listings", 0},
    {0},
};

static const cli_command archive_verb = {
    .name = "tandem archive",
    .usage = "[--undo] RUN...",
    .about = "Hides each finished run from tandem ps and the page's list; everything of it is\n"
             "kept (tandem show, logs, metrics and artifacts still work). tandem ps --archived\n"
             "lists the archived runs; --undo brings them back.\n",
    .opts = archive_opts,
};

int cmd_archive(int argc, char **argv) {
    int undo = 0;
    const char **ids = NULL;
    size_t n = 0;
    int rc = run_cli_operands(&archive_verb, argc, argv, OPT_UNDO, &undo, &ids, &n);
    if (rc >= 0) return rc;
    if (!n) {
        free(ids);
        return run_cli_usage_error(&archive_verb);
    }
    td_rundb *store = NULL;
    rc = run_cli_open_store(&store);
    for (size_t i = 0; !rc && i < n; i++) {
        td_run r = {0};
        td_status st = td_run_find(store, ids[i], &r);
        if (st == TD_OK && td_run_reap_stale(store, &r) != TD_OK) td_error_clear();
        if (st == TD_OK) st = td_run_set_archived(store, r.id, !undo);
        if (st == TD_OK)
            printf("%s %s\n", undo ? "restored" : "archived", run_cli_text(r.id));
        else {
            run_cli_error(st);
            rc = st == TD_ERR_NOTFOUND || st == TD_ERR_INVALID ? 2 : 1;
        }
        td_run_clear(&r);
    }
    free(ids);
    if (store) td_rundb_close(store);
    return rc;
}
