/* tandem show: everything recorded about one run. What the run and its programs wrote (ids,
 * notes, commands, metric keys, paths) reaches the terminal escaped (run_cli_text). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "commands.h"
#include "run_cli.h"
#include "tandem/exec.h"

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

/* The cloud instances the run used (RUN/instances.json, executor aws): each one's lifetime and
 * instance-hours (to now while it lives), and the run's total: what it cost. */
static void print_instances(const td_run *r) {
    td_run_instances rec;
    td_status st = td_run_instances_read(r->run_dir, &rec);
    if (st != TD_OK) {
        if (st != TD_ERR_NOTFOUND) printf("\ninstances: %s\n", run_cli_text(td_error_msg()));
        td_error_clear();
        return;
    }
    double now = td_wall_s();
    size_t unpriced = 0;
    double cost = td_run_instances_cost(&rec, now, &unpriced);
    printf("\ninstances (%s %s): %zu, %.2f instance-hours", run_cli_text(rec.provider),
           run_cli_text(rec.region), rec.count, td_run_instances_hours(&rec, now));
    if (unpriced < rec.count)
        printf(", cost $%.6f%s", cost, unpriced ? " (instances without a price left out)" : "");
    printf("\n  %-20s %4s %-12s %-9s %-11s %-19s %9s %7s %10s  %s\n", "ID", "NODE", "TYPE",
           "MARKET", "ZONE", "LAUNCHED", "LIFETIME", "HOURS", "USD/HOUR", "END");
    for (size_t i = 0; i < rec.count; i++) {
        const td_run_instance *in = &rec.items[i];
        char launched[32] = "-", node[16] = "-", life[32];
        if (in->launched_s > 0) {
            time_t tt = (time_t)in->launched_s;
            struct tm tm;
            localtime_r(&tt, &tm);
            strftime(launched, sizeof launched, "%Y-%m-%d %H:%M:%S", &tm);
        }
        if (in->node >= 0) snprintf(node, sizeof node, "%d", in->node);
        double s = td_run_instance_lifetime_s(in, now);
        long t = (long)s;
        if (t < 3600)
            snprintf(life, sizeof life, "%ldm%02lds", t / 60, t % 60);
        else
            snprintf(life, sizeof life, "%ldh%02ldm", t / 3600, t % 3600 / 60);
        const char *end = in->end ? in->end : td_run_instance_live(in) ? "(alive)" : in->state;
        char price[32] = "-";
        if (in->usd_per_hour > 0) snprintf(price, sizeof price, "%.5f", in->usd_per_hour);
        printf("  %-20s %4s %-12s %-9s %-11s %-19s %9s %7.2f %10s  %s%s%s\n", run_cli_text(in->id),
               node, run_cli_text(in->type), run_cli_text(in->market), run_cli_text(in->zone),
               launched, life, s / 3600, price, run_cli_text(end),
               in->replaces[0] ? "; replaced " : "",
               in->replaces[0] ? run_cli_text(in->replaces) : "");
    }
    td_run_instances_clear(&rec);
}

/* What the script recorded through the Python SDK (config, summary: RUN/sdk.json), one key a
 * line in sorted order, each value as JSON. */
static int cmp_key(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void print_sdk_object(const char *title, const char *text) {
    printf("\n%s:\n", title);
    json_t *o = text ? json_loads(text, 0, NULL) : NULL;
    if (!json_is_object(o) || !json_object_size(o)) {
        printf("  (none)\n");
        json_decref(o);
        return;
    }
    size_t n = 0, width = 0;
    const char **keys = td_xcalloc(json_object_size(o), sizeof *keys);
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        keys[n++] = k;
        if (strlen(k) > width) width = strlen(k);
    }
    qsort(keys, n, sizeof *keys, cmp_key);
    if (width > 24) width = 24;
    for (size_t i = 0; i < n; i++) {
        char *val = run_cli_json(json_object_get(o, keys[i]), 1);
        printf("  %-*s %s\n", (int)width, run_cli_text(keys[i]), run_cli_text(val ? val : "?"));
        free(val);
    }
    free(keys);
    json_decref(o);
}

/* A field whose text may span lines (a workflow's command: one line per command, or a YAML
 * block): each line on its own, under the first, rather than as one line with \x0a in it. */
static void print_lines(const char *field, const char *text) {
    const char *s = text ? text : "";
    int first = 1;
    do {
        size_t n = strcspn(s, "\n");
        char *line = td_xstrndup(s, n);
        printf("%-15s %s\n", first ? field : "", run_cli_text(line));
        free(line);
        first = 0;
        s += n;
    } while (*s && *++s);
}

static const cli_opt opts[] = {{0}};

static const cli_command verb = {
    .name = "tandem show",
    .usage = "RUN",
    .about = "Everything recorded about one run. RUN is a run id or a unique prefix of one.\n",
    .opts = opts,
};

int cmd_show(int argc, char **argv) {
    const char *id = NULL;
    int rc;
    cli_parser p;
    cli_init(&p, &verb, argc, argv);
    for (int c; (c = cli_next(&p)) != CLI_END;) {
        if (c == CLI_EXIT) return p.exit_code;
        if ((rc = run_cli_id(&verb, p.value, &id)) >= 0) return rc;
    }
    td_rundb *store;
    td_run r;
    if ((rc = run_cli_open_run(&verb, id, &store, &r))) return rc;
    if (td_run_reap_stale(store, &r) != TD_OK) td_error_clear();
    printf("%-15s %s\n", "id", run_cli_text(r.id));
    printf("%-15s %s\n", "workflow", run_cli_text(r.workflow));
    printf("%-15s %s\n", "status", td_run_status_str(r.status));
    if (r.exit_code >= 0)
        printf("%-15s %d\n", "exit code", r.exit_code);
    else
        printf("%-15s -\n", "exit code");
    if (r.note) printf("%-15s %s\n", "note", run_cli_text(r.note));
    if (r.group && *r.group) printf("%-15s %s\n", "group", run_cli_text(r.group));
    if (r.tags && *r.tags) printf("%-15s %s\n", "tags", run_cli_text(r.tags));
    if (r.notes) printf("%-15s %s\n", "notes", run_cli_text(r.notes));
    if (r.archived)
        printf("%-15s yes (tandem archive --undo %s)\n", "archived", run_cli_text(r.id));
    print_time("created", r.created_s);
    print_time("started", r.started_s);
    print_time("ended", r.ended_s);
    if (r.started_s > 0)
        printf("%-15s %.1f s\n", "duration",
               (r.ended_s > 0 ? r.ended_s : td_wall_s()) - r.started_s);
    printf("%-15s %d node(s) x %d process(es)\n", "workers", r.nodes, r.nproc_per_node);
    const td_executor *ex = td_executor_of_run(&r);
    char *where = ex ? ex->describe(&r) : NULL;
    if (where) printf("%-15s %s\n", "executor", run_cli_text(where));
    free(where);
    printf("%-15s %d\n", "restarts", r.restarts);
    printf("%-15s %s\n", "code version", r.code_version ? run_cli_text(r.code_version) : "none");
    char *params = run_cli_json_text(r.params_json ? r.params_json : "{}");
    printf("%-15s %s\n", "params", run_cli_text(params));
    free(params);
    print_lines("command", r.command);
    if (r.supervisor_pid) printf("%-15s %lld\n", "supervisor pid", (long long)r.supervisor_pid);
    printf("%-15s %s\n", "run dir", run_cli_text(r.run_dir));
    printf("%-15s %s/checkpoints\n", "checkpoints", run_cli_text(r.run_dir));
    print_sdk_object("config", r.config_json);
    print_sdk_object("summary", r.summary_json);

    td_log_file *logs = NULL;
    size_t nlogs = 0;
    if (td_logs_scan(store, &r, &logs, &nlogs) == TD_OK) {
        printf("\nlogs:\n");
        if (!nlogs) printf("  (none)\n");
        for (size_t i = 0; i < nlogs; i++) printf("  %s\n", run_cli_text(logs[i].path));
        td_log_files_free(logs, nlogs);
    } else {
        td_error_clear();
    }

    td_metric_row *last = NULL;
    size_t nlast = 0;
    int64_t npoints = 0;
    if (td_metrics_last(store, r.id, &last, &nlast) == TD_OK &&
        td_metrics_count(store, r.id, &npoints) == TD_OK) {
        printf("\nmetrics (%lld point%s; last value of each key):\n", (long long)npoints,
               npoints == 1 ? "" : "s");
        if (!nlast) printf("  (none)\n");
        for (size_t i = 0; i < nlast; i++) {
            /* system metrics are sampled by time: their "step" is seconds since the run began */
            int sys = !strncmp(last[i].key, "sys/", 4);
            char at[48];
            snprintf(at, sizeof at, sys ? "at %lld s" : "step %lld", (long long)last[i].step);
            printf("  %-24s %-14.6g %-13s rank %d\n", run_cli_text(last[i].key), last[i].value, at,
                   last[i].rank);
        }
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
            printf("  %-32s %12lld bytes  sha256 %s\n", run_cli_text(arts[i].name),
                   (long long)arts[i].size_bytes, run_cli_text(arts[i].sha256));
        td_artifacts_free(arts, narts);
    } else {
        td_error_clear();
    }
    print_instances(&r);
    /* A directory deleted by hand leaves the index with a run nothing stands behind: say so, and
     * how to be rid of it, instead of listing it as if it were whole. */
    char *dir = td_xasprintf("%s/runs/%s", td_rundb_dir(store), r.id);
    struct stat sb;
    rc = 0;
    if (lstat(dir, &sb) != 0 && errno == ENOENT) {
        fprintf(stderr,
                "tandem show: the directory of run %s (%s) is gone: its logs, metrics files "
                "and artifacts with it; 'tandem reindex' drops such runs from the index, "
                "'tandem rm %s' this one\n",
                run_cli_text(r.id), run_cli_text(dir), run_cli_text(r.id));
        rc = 1;
    }
    free(dir);
    run_cli_close(store, &r);
    return rc;
}
