/* tandem show: everything recorded about one run. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"
#include "tandem/track.h"

static void print_time(const char *label, double t) {
    if (t <= 0) {
        printf("%-15s -\n", label);
        return;
    }
    time_t tt = (time_t)t;
    struct tm tm;
    char buf[64];
    localtime_r(&tt, &tm);
    strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S %z", &tm);
    printf("%-15s %s\n", label, buf);
}

int cmd_show(int argc, char **argv) {
    if (argc != 2 || argv[1][0] == '-') {
        if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
            printf("usage: tandem show RUN\n\nRUN is a run id or a unique prefix of one.\n");
            return 0;
        }
        fprintf(stderr, "usage: tandem show RUN\n");
        return 2;
    }
    td_rundb *store;
    td_status st = td_rundb_open(NULL, &store);
    if (st != TD_OK) {
        td_error_print(st);
        return 1;
    }
    td_run r;
    st = td_run_find(store, argv[1], &r);
    if (st != TD_OK) {
        td_error_print(st);
        td_rundb_close(store);
        return 2;
    }
    if (td_run_reap_stale(store, &r) != TD_OK) td_error_clear();
    printf("%-15s %s\n", "id", r.id);
    printf("%-15s %s\n", "workflow", r.workflow);
    printf("%-15s %s\n", "status", td_run_status_str(r.status));
    if (r.exit_code >= 0)
        printf("%-15s %d\n", "exit code", r.exit_code);
    else
        printf("%-15s -\n", "exit code");
    if (r.note) printf("%-15s %s\n", "note", r.note);
    print_time("created", r.created_s);
    print_time("started", r.started_s);
    print_time("ended", r.ended_s);
    if (r.started_s > 0)
        printf("%-15s %.1f s\n", "duration",
               (r.ended_s > 0 ? r.ended_s : td_wall_s()) - r.started_s);
    printf("%-15s %d node(s) x %d process(es)\n", "workers", r.nodes, r.nproc_per_node);
    printf("%-15s %d\n", "restarts", r.restarts);
    printf("%-15s %s\n", "code version", r.code_version ? r.code_version : "none");
    printf("%-15s %s\n", "params", r.params_json ? r.params_json : "{}");
    printf("%-15s %s\n", "command", r.command ? r.command : "");
    if (r.supervisor_pid) printf("%-15s %lld\n", "supervisor pid", (long long)r.supervisor_pid);
    printf("%-15s %s\n", "run dir", r.run_dir);
    printf("%-15s %s/checkpoints\n", "checkpoints", r.run_dir);

    td_log_file *logs = NULL;
    size_t nlogs = 0;
    if (td_logs_scan(store, &r, &logs, &nlogs) == TD_OK) {
        printf("\nlogs:\n");
        if (!nlogs) printf("  (none)\n");
        for (size_t i = 0; i < nlogs; i++) printf("  %s\n", logs[i].path);
        td_log_files_free(logs, nlogs);
    } else {
        td_error_clear();
    }

    td_metric_row *last = NULL;
    size_t nlast = 0;
    int64_t npoints = 0;
    if (td_metrics_last(store, r.id, &last, &nlast) == TD_OK &&
        td_metrics_count(store, r.id, &npoints) == TD_OK) {
        printf("\nmetrics (%lld points; last value of each key):\n", (long long)npoints);
        if (!nlast) printf("  (none)\n");
        for (size_t i = 0; i < nlast; i++)
            printf("  %-24s %-14.6g step %-8lld rank %d\n", last[i].key, last[i].value,
                   (long long)last[i].step, last[i].rank);
    } else {
        td_error_clear();
    }
    td_metric_rows_free(last, nlast);

    td_artifact *arts = NULL;
    size_t narts = 0;
    if (td_artifacts_list(store, r.id, &arts, &narts) == TD_OK) {
        printf("\nartifacts:\n");
        if (!narts) printf("  (none)\n");
        for (size_t i = 0; i < narts; i++)
            printf("  %-32s %12lld bytes  sha256 %s\n", arts[i].name, (long long)arts[i].size_bytes,
                   arts[i].sha256);
        td_artifacts_free(arts, narts);
    } else {
        td_error_clear();
    }
    td_run_clear(&r);
    td_rundb_close(store);
    return 0;
}
