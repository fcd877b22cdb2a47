/* One run's files brought into the index: its metrics (from the stored offsets on), artifacts,
 * log files and sdk.json. What the rebuild does for each run directory, the reaper for a run
 * whose end it takes from run.json, and the import for an offline run. */
#include "store_internal.h"

#include <stdlib.h>

td_status td__run_sync_files(td_rundb *store, const td_run *run, int only_missing, int64_t *npoints,
                             size_t *nartifacts, size_t *nlogs) {
    td_ingester *ing = NULL;
    char *metrics = td_run_path(run->run_dir, TD_RUN_PATH_METRICS);
    td_status st = td_ingester_new(store, run->id, metrics, &ing);
    free(metrics);
    if (st == TD_OK) td__ingester_skip_activity(ing);
    size_t points = 0, arts = 0;
    if (st == TD_OK) st = td_ingester_poll(ing, &points);
    td_ingester_free(ing);
    if (st == TD_OK) st = td__artifacts_register_dir(store, run, only_missing, &arts);
    td_log_file *logs = NULL;
    size_t n = 0;
    if (st == TD_OK) st = td_logs_scan(store, run, &logs, &n);
    td_log_files_free(logs, n);
    /* What the script recorded through the SDK: a malformed file is a warning, not a failure. */
    if (st == TD_OK) st = td_run_sdk_sync(store, run, NULL, NULL);
    if (npoints) *npoints += (int64_t)points;
    if (nartifacts) *nartifacts += arts;
    if (nlogs) *nlogs += n;
    return st;
}
