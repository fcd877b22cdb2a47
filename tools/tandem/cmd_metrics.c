/* tandem metrics: a run's metric points as a table, CSV or JSON. Keys are anyone's text: the
 * table (and CSV on a terminal) writes their control bytes escaped (run_cli_text); JSON escapes
 * them its own way. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "run_cli.h"

enum { OPT_CSV = 1, OPT_JSON, OPT_KEY, OPT_RANK };

static const cli_opt opts[] = {
    {OPT_CSV, "csv", 0, NULL, "CSV: rank,key,step,value,time", 0},
    {OPT_JSON, "json", 0, NULL, "one JSON array of {rank, key, step, value, time} objects", 0},
    {OPT_KEY, "key", 0, "KEY", "only this key", 0},
    {OPT_RANK, "rank", 0, "R", "only this rank", 0},
    {0},
};

static const cli_command verb = {
    .name = "tandem metrics",
    .usage = "RUN [--csv | --json] [--key KEY] [--rank R]",
    .about = "Points ordered by key, rank and step, as a table unless --csv or --json.\n"
             "A --key the run has no point of exits 1, naming the keys it has.\n",
    .opts = opts,
};

static void csv_field(const char *s) {
    if (!strpbrk(s, ",\"\n")) {
        fputs(s, stdout);
        return;
    }
    putchar('"');
    for (; *s; s++) {
        if (*s == '"') putchar('"');
        putchar(*s);
    }
    putchar('"');
}

/* The error for --key KEY that matched no point: the keys the run has (with --rank R, whether
 * KEY exists on other ranks). Returns the exit code, 1. */
static int no_such_key(td_rundb *store, const td_run *r, const char *key, int rank) {
    td_metric_row *last = NULL;
    size_t nlast = 0;
    if (td_metrics_last(store, r->id, &last, &nlast) != TD_OK) {
        td_error_clear();
        nlast = 0;
    }
    int on_other_rank = 0;
    for (size_t i = 0; i < nlast; i++) on_other_rank |= !strcmp(last[i].key, key);
    if (rank >= 0 && on_other_rank)
        fprintf(stderr, "tandem: error: run %s has no point of key '%s' from rank %d; that key was "
                        "logged by other ranks (drop --rank, or pick one of them)\n",
                run_cli_text(r->id), run_cli_text(key), rank);
    else if (!nlast)
        fprintf(stderr, "tandem: error: run %s has no metric '%s': it has logged no metrics yet\n",
                run_cli_text(r->id), run_cli_text(key));
    else {
        fprintf(stderr, "tandem: error: run %s has no metric '%s'; its keys are:",
                run_cli_text(r->id), run_cli_text(key));
        /* td_metrics_last has one row per (key, rank), ordered by key: each key once */
        for (size_t i = 0; i < nlast; i++)
            if (!i || strcmp(last[i].key, last[i - 1].key))
                fprintf(stderr, " %s", run_cli_text(last[i].key));
        fprintf(stderr, "\n");
    }
    td_metric_rows_free(last, nlast);
    return 1;
}

int cmd_metrics(int argc, char **argv) {
    const char *id = NULL, *key = NULL;
    int format = 0; /* 0 table, 1 csv, 2 json */
    int rank = -1, rc;
    cli_parser p;
    cli_init(&p, &verb, argc, argv);
    for (int c; (c = cli_next(&p)) != CLI_END;) {
        if (c == CLI_EXIT) return p.exit_code;
        if (c == OPT_CSV)
            format = 1;
        else if (c == OPT_JSON)
            format = 2;
        else if (c == OPT_KEY)
            key = p.value;
        else if (c == OPT_RANK) {
            if ((rc = run_cli_rank(&verb, p.value, &rank)) >= 0) return rc;
        } else if ((rc = run_cli_id(&verb, p.value, &id)) >= 0)
            return rc;
    }
    td_rundb *store;
    td_run r;
    if ((rc = run_cli_open_run(&verb, id, &store, &r))) return rc;
    td_metric_row *rows = NULL;
    size_t n = 0;
    td_status st = td_metrics_query(store, r.id, key, rank, &rows, &n);
    if (st != TD_OK) {
        td_error_print(st);
        run_cli_close(store, &r);
        return 1;
    }
    if (key && !n) {
        /* A key the run never logged is a mistake (a typo, loss vs train/loss), not an empty
         * result: say which keys there are, exit 1, and write no empty table for a script to
         * take as data. A --rank that logged none of an existing key is the same. */
        rc = no_such_key(store, &r, key, rank);
        td_metric_rows_free(rows, n);
        run_cli_close(store, &r);
        return rc;
    }
    if (format == 1) {
        /* CSV is data: kept byte for byte in a file or a pipe, escaped on a terminal. */
        int tty = isatty(STDOUT_FILENO);
        printf("rank,key,step,value,time\n");
        for (size_t i = 0; i < n; i++) {
            printf("%d,", rows[i].rank);
            csv_field(tty ? run_cli_text(rows[i].key) : rows[i].key);
            printf(",%lld,%.17g,%.6f\n", (long long)rows[i].step, rows[i].value, rows[i].time_s);
        }
    } else if (format == 2) {
        printf("[");
        for (size_t i = 0; i < n; i++) {
            json_t *o = json_pack("{s:i, s:s, s:I, s:f, s:f}", "rank", rows[i].rank, "key",
                                  rows[i].key, "step", (json_int_t)rows[i].step, "value",
                                  rows[i].value, "time", rows[i].time_s);
            char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
            printf("%s\n%s", i ? "," : "", s ? s : "null");
            free(s);
            json_decref(o);
        }
        printf("\n]\n");
    } else {
        printf("%-24s %5s %10s %16s\n", "KEY", "RANK", "STEP", "VALUE");
        for (size_t i = 0; i < n; i++)
            printf("%-24s %5d %10lld %16.8g\n", run_cli_text(rows[i].key), rows[i].rank,
                   (long long)rows[i].step, rows[i].value);
        if (!n) printf("(no metrics recorded for run %s)\n", run_cli_text(r.id));
    }
    td_metric_rows_free(rows, n);
    run_cli_close(store, &r);
    return 0;
}
