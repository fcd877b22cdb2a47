/* tandem logs: a run's worker logs, optionally followed until the run ends. What the programs
 * wrote goes out as they wrote it (colours, a progress bar's \r); what tandem itself says around
 * it (the prefixes named after log files, run ids, paths) is escaped (run_cli_text). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"
#include "run_cli.h"

typedef struct {
    char *path;
    char *prefix;
    long offset;
    char *partial; /* a line without its newline yet */
} log_cursor;

/* Prints what was appended since the last call; complete lines only unless flush_partial. */
static void pump(log_cursor *c, int prefixed, int flush_partial) {
    FILE *f = fopen(c->path, "rb");
    if (!f) return;
    if (fseek(f, c->offset, SEEK_SET) != 0) {
        fclose(f);
        return;
    }
    char buf[1 << 15];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        c->offset += (long)n;
        size_t start = 0;
        for (size_t i = 0; i < n; i++) {
            if (buf[i] != '\n') continue;
            if (prefixed) fputs(c->prefix, stdout);
            if (c->partial) {
                fputs(c->partial, stdout);
                free(c->partial);
                c->partial = NULL;
            }
            fwrite(buf + start, 1, i + 1 - start, stdout);
            start = i + 1;
        }
        if (start < n) {
            size_t old = c->partial ? strlen(c->partial) : 0;
            c->partial = td_xrealloc(c->partial, old + (n - start) + 1);
            memcpy(c->partial + old, buf + start, n - start);
            c->partial[old + n - start] = '\0';
        }
    }
    fclose(f);
    if (flush_partial && c->partial) {
        if (prefixed) fputs(c->prefix, stdout);
        printf("%s\n", c->partial);
        free(c->partial);
        c->partial = NULL;
    }
    fflush(stdout);
}

/* Adds cursors for log files not seen yet. */
static void refresh(td_rundb *store, const td_run *r, int rank, log_cursor **cs, size_t *n) {
    td_log_file *logs = NULL;
    size_t nlogs = 0;
    if (td_logs_scan(store, r, &logs, &nlogs) != TD_OK) {
        td_error_clear();
        return;
    }
    for (size_t i = 0; i < nlogs; i++) {
        if (rank >= 0 && logs[i].rank != rank) continue;
        /* The detached supervisor's own log repeats the launcher's stderr; `show` lists it. */
        if (strstr(logs[i].path, "/supervisor.log")) continue;
        int known = 0;
        for (size_t k = 0; k < *n && !known; k++) known = !strcmp((*cs)[k].path, logs[i].path);
        if (known) continue;
        *cs = td_xrealloc(*cs, (*n + 1) * sizeof **cs);
        log_cursor *c = &(*cs)[(*n)++];
        memset(c, 0, sizeof *c);
        c->path = td_xstrdup(logs[i].path);
        const char *base = strrchr(logs[i].path, '/');
        base = base ? base + 1 : logs[i].path;
        if (logs[i].rank >= 0) {
            c->prefix = td_xasprintf("[rank %d] ", logs[i].rank);
        } else {
            char *stem = td_xasprintf("%.*s", (int)strcspn(base, "."), base);
            c->prefix = td_xasprintf("[%s] ", run_cli_text(stem));
            free(stem);
        }
    }
    td_log_files_free(logs, nlogs);
}

enum { OPT_FOLLOW = 1, OPT_RANK };

static const cli_opt opts[] = {
    {OPT_FOLLOW, "follow", 'f', NULL, "follow the logs until the run ends", 0},
    {OPT_RANK, "rank", 0, "R", "only rank R's log, without the prefix", 0},
    {0},
};

static const cli_command verb = {
    .name = "tandem logs",
    .usage = "RUN [-f] [--rank R]",
    .about = "Prints the workers' logs, each line prefixed with its rank (raw with\n"
             "--rank). -f follows them until the run ends.\n",
    .opts = opts,
};

int cmd_logs(int argc, char **argv) {
    const char *id = NULL;
    int follow = 0, rank = -1, rc;
    cli_parser p;
    cli_init(&p, &verb, argc, argv);
    for (int c; (c = cli_next(&p)) != CLI_END;) {
        if (c == CLI_EXIT) return p.exit_code;
        if (c == OPT_FOLLOW)
            follow = 1;
        else if (c == OPT_RANK) {
            if ((rc = run_cli_rank(&verb, p.value, &rank)) >= 0) return rc;
        } else if ((rc = run_cli_id(&verb, p.value, &id)) >= 0)
            return rc;
    }
    td_rundb *store;
    td_run r;
    if ((rc = run_cli_open_run(&verb, id, &store, &r))) return rc;
    log_cursor *cs = NULL;
    size_t n = 0;
    int prefixed = rank < 0;
    refresh(store, &r, rank, &cs, &n);
    for (size_t i = 0; i < n; i++) pump(&cs[i], prefixed, !follow);
    if (follow) {
        double next_pull = td_now_s() + 2.0;
        for (;;) {
            td_run cur;
            int done = 1;
            if (td_run_find(store, r.id, &cur) == TD_OK) {
                /* a run that lives in the cloud: its store pulled every 2 s (the controller
                 * pushes about as often) */
                if (td_run_is_remote(&cur) && td_now_s() >= next_pull) {
                    run_cli_attach(store, &cur);
                    next_pull = td_now_s() + 2.0;
                }
                if (td_run_reap_stale(store, &cur) != TD_OK) td_error_clear();
                done = td_run_status_is_final(cur.status);
                td_run_clear(&cur);
            }
            refresh(store, &r, rank, &cs, &n);
            for (size_t i = 0; i < n; i++) pump(&cs[i], prefixed, done);
            if (done) break;
            struct timespec ts = {0, 200000000L};
            nanosleep(&ts, NULL);
        }
    }
    rc = 0;
    if (!n) {
        fprintf(stderr, "tandem logs: run %s has no %s yet (%s/logs)\n", run_cli_text(r.id),
                rank >= 0 ? "log for that rank" : "logs", run_cli_text(r.run_dir));
        rc = 1;
    }
    for (size_t i = 0; i < n; i++) {
        free(cs[i].path);
        free(cs[i].prefix);
        free(cs[i].partial);
    }
    free(cs);
    run_cli_close(store, &r);
    return rc;
}
