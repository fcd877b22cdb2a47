/* tandem import: offline runs of the Python SDK (./tandem-offline/<id>/, written by
 * tandem.init() outside tandem run) into the project's run store, one run each
 * (td_run_import). Importing one again names the run it became instead of making another. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "run_cli.h"
#include "tandem/track.h"

enum { OPT_FORCE = 1 };

static const cli_opt opts[] = {
    {OPT_FORCE, "force", 0, NULL,
     "import a run whose offline.json still says running (its script\nwas killed), as failed", 0},
    {0},
};

static const cli_command verb = {
    .name = "tandem import",
    .usage = "[--force] DIR...",
    .about =
        "Makes each DIR, an offline run of the tandem Python SDK (./tandem-offline/<id>/: what\n"
        "tandem.init() writes outside tandem run), a run of this project's store: its metrics\n"
        "(metrics/rank-R.jsonl) are ingested, its artifacts copied (no link is followed: a\n"
        "linked folder or file is left out, named; DIR itself may not be a link),\n"
        "its config, summary and tags taken from sdk.json, and its status, exit code and times\n"
        "from offline.json. The run is named after the SDK's name (else its project, else\n"
        "\"offline\"). DIR is left as it is. Importing the same offline run again makes no second\n"
        "run: the first one is named. A run still running (offline.json says so) is refused.\n",
    .opts = opts,
};

int cmd_import(int argc, char **argv) {
    int force = 0;
    const char **dirs = NULL;
    size_t ndirs = 0;
    int rc = run_cli_operands(&verb, argc, argv, OPT_FORCE, &force, &dirs, &ndirs);
    if (rc >= 0) return rc;
    if (!ndirs) {
        free(dirs);
        fprintf(stderr, "tandem import: no DIR given: name an offline run's directory "
                        "(./tandem-offline/<id>)\n");
        return run_cli_usage_error(&verb);
    }
    td_rundb *store = NULL;
    if (run_cli_open_store(&store)) {
        free(dirs);
        return 1;
    }
    rc = 0;
    for (size_t i = 0; i < ndirs; i++) {
        td_run r;
        int existed = 0;
        td_status st = td_run_import(store, dirs[i], force, &r, &existed);
        if (st != TD_OK) {
            run_cli_error(st);
            rc = 1;
            continue;
        }
        int64_t points = 0;
        if (td_metrics_count(store, r.id, &points) != TD_OK) td_error_clear();
        if (existed)
            printf("%s: imported already, as run %s (%s)\n", run_cli_text(dirs[i]),
                   run_cli_text(r.id), td_run_status_str(r.status));
        else
            printf("%s: imported as run %s (%s, %lld metric point%s)\n", run_cli_text(dirs[i]),
                   run_cli_text(r.id), td_run_status_str(r.status), (long long)points,
                   points == 1 ? "" : "s");
        td_run_clear(&r);
    }
    td_rundb_close(store);
    free(dirs);
    return rc;
}
