/* Runs supervised elsewhere: tandem run -d of an aws run hands its run to a controller in the
 * cloud (src/exec/controller.c), which keeps the run's directory in S3; the submitter pulls it
 * back into its own run directory (src/exec/remote_store.c) and the row follows the directory
 * here, as a rebuild would: run.json is the record, the files are the rest. */
#include "store_internal.h"

#include <stdlib.h>
#include <string.h>

td_status td_run_adopt_remote(td_rundb *store, td_run *run) {
    td_run disk;
    int found = 0;
    memset(&disk, 0, sizeof disk);
    TD_CHECK(td__run_json_read(run->run_dir, &disk, &found));
    td_status st = TD_OK;
    /* the controller numbered its run as we did (td_run_spec.min_n): another id is another run */
    if (found && disk.id && strcmp(disk.id, run->id))
        st = td_error(TD_ERR_FORMAT,
                      "%s/run.json pulled from run %s's store describes run %s; the store's "
                      "prefix (remote.json) names another run",
                      run->run_dir, run->id, disk.id);
    int changed = 0;
    if (st == TD_OK && found) st = td__run_adopt(store, run, &disk, &changed);
    td_run_clear(&disk);
    if (st == TD_OK && found) st = td__run_sync_files(store, run, 1, NULL, NULL, NULL);
    return st;
}
