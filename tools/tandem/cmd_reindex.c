/* tandem reindex: rebuilds the run index (.tandem/runs.db) from the run directories. Each run
 * directory describes its run in run.json; the index is only an index over them, so when it is
 * lost (deleted, damaged and moved aside) this puts every run back: status, params, metrics,
 * artifacts with their SHA-256, log files. Runs the index already has are left as they are. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "run_cli.h"
#include "tandem/track.h"

enum { OPT_QUIET = 1 };

static const cli_opt opts[] = {
    {OPT_QUIET, "quiet", 'q', NULL, "print only the summary", 0},
    {0},
};

static const cli_command verb = {
    .name = "tandem reindex",
    .usage = "[-q]",
    .about =
        "Rebuilds the run index (.tandem/runs.db) from the run directories in .tandem/runs:\n"
        "each run missing from the index comes back from its run.json (or, without one, is\n"
        "recovered from its name and files and marked so in its note), with its metrics read\n"
        "again from metrics/*.jsonl, its artifacts registered with size and SHA-256 and its log\n"
        "files recorded. A run that was running and whose supervisor is gone is marked failed.\n"
        "Runs already in the index are left as they are; it is safe to run at any time.\n"
        "A damaged index: move it aside first (mv .tandem/runs.db .tandem/runs.db.broken).\n",
    .opts = opts,
};

typedef struct {
    int quiet;
} reindex_ctx;

static void on_run(void *arg, const td_run *run, const char *what) {
    const reindex_ctx *c = arg;
    if (c->quiet || !strcmp(what, "present")) return;
    printf("%-10s %-24s %-10s%s%s\n", what, run_cli_text(run->id), td_run_status_str(run->status),
           run->note ? "  " : "", run->note ? run_cli_text(run->note) : "");
}

int cmd_reindex(int argc, char **argv) {
    reindex_ctx c = {0};
    cli_parser p;
    cli_init(&p, &verb, argc, argv);
    for (int o; (o = cli_next(&p)) != CLI_END;) {
        if (o == CLI_EXIT) return p.exit_code;
        if (o == OPT_QUIET)
            c.quiet = 1;
        else
            return cli_error(&verb, "unexpected argument '%s'", p.value);
    }
    td_rundb *store = NULL;
    /* No automatic rebuild on open: this verb does it itself and says what it did per run. */
    td_status st = td_rundb_open_ex(NULL, TD_RUNDB_NO_AUTO_REBUILD, &store);
    if (st != TD_OK) {
        td_error_print(st);
        return 1;
    }
    td_rebuild_stats s;
    st = td_rundb_rebuild(store, on_run, &c, &s);
    printf("reindexed %s/runs: %zu run director%s; %zu restored from run.json, %zu recovered "
           "without one, %zu updated from run.json, %zu already indexed, %zu marked failed "
           "(supervisor gone); %lld metric point%s, %zu artifact%s, %zu log file%s\n",
           td_rundb_dir(store), s.dirs, s.dirs == 1 ? "y" : "ies", s.restored, s.recovered,
           s.updated, s.present, s.reaped, (long long)s.metric_points,
           s.metric_points == 1 ? "" : "s", s.artifacts, s.artifacts == 1 ? "" : "s", s.log_files,
           s.log_files == 1 ? "" : "s");
    if (s.dropped)
        printf("dropped %zu run%s whose directory is gone (rows, metrics, artifacts and logs)\n",
               s.dropped, s.dropped == 1 ? "" : "s");
    if (s.left_out)
        printf("left out %zu run director%s whose run.json is not a regular file (see the "
               "warnings on stderr)\n",
               s.left_out, s.left_out == 1 ? "y" : "ies");
    if (st != TD_OK) td_error_print(st);
    td_rundb_close(store);
    return st == TD_OK ? 0 : 1;
}
