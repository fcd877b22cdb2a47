/* tandem ps: the runs table. Ids, workflows and notes are anyone's text (a run directory named by
 * hand, a note quoting a program's output): they reach the terminal escaped (run_cli_text). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"
#include "run_cli.h"
#include "tandem/exec.h"

static void fmt_time(double t, char *out, size_t n) {
    if (t <= 0) {
        snprintf(out, n, "-");
        return;
    }
    time_t tt = (time_t)t, now = time(NULL);
    struct tm tm, today;
    localtime_r(&tt, &tm);
    localtime_r(&now, &today);
    if (tm.tm_year == today.tm_year && tm.tm_yday == today.tm_yday)
        strftime(out, n, "%H:%M:%S", &tm);
    else
        strftime(out, n, "%Y-%m-%d %H:%M", &tm);
}

static void fmt_duration(double s, char *out, size_t n) {
    if (s < 0) {
        snprintf(out, n, "-");
        return;
    }
    long t = (long)(s + 0.5);
    if (t < 60)
        snprintf(out, n, "%lds", t);
    else if (t < 3600)
        snprintf(out, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(out, n, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
}

/* The run's loss: "loss" itself, else "train/loss" (tandem train also logs test/loss, which
 * sorts first but is not the training loss), else the first key ending in "loss". */
static const td_metric_row *pick_loss(const td_metric_row *rows, size_t n) {
    const td_metric_row *best = NULL, *train = NULL;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(rows[i].key);
        if (!strcmp(rows[i].key, "loss")) return &rows[i];
        if (!strcmp(rows[i].key, "train/loss")) train = &rows[i];
        if (!best && len >= 4 && !strcmp(rows[i].key + len - 4, "loss")) best = &rows[i];
    }
    return train ? train : best;
}

/* The widest note `tandem ps` prints (bytes before escaping); tandem show has the whole of it. */
#define NOTE_MAX 100

/* note cut to NOTE_MAX bytes ("..." at the end when cut, never inside a UTF-8 character), with
 * its control bytes escaped. */
static const char *short_note(const char *note) {
    size_t len = strlen(note);
    if (len <= NOTE_MAX) return run_cli_text(note);
    size_t cut = NOTE_MAX - 3;
    while (cut > 0 && ((unsigned char)note[cut] & 0xc0) == 0x80) cut--;
    char *head = td_xasprintf("%.*s...", (int)cut, note);
    const char *text = run_cli_text(head);
    free(head);
    return text;
}

enum { OPT_ALL = 1, OPT_ARCHIVED, OPT_TAG, OPT_GROUP };

static const cli_opt opts[] = {
    {OPT_ALL, "all", 'a', NULL, "list every run (archived ones too)", 0},
    {OPT_ARCHIVED, "archived", 0, NULL, "list the archived runs only", 0},
    {OPT_TAG, "tag", 0, "TAG", "only runs with this tag (repeatable: runs with all of them)",
     CLI_REPEAT},
    {OPT_GROUP, "group", 0, "GROUP", "only the runs of this group", 0},
    {0},
};

static const cli_command verb = {
    .name = "tandem ps",
    .usage = "[-a | --archived] [--tag TAG]... [--group GROUP]",
    .about = "Active runs and the 10 most recent finished ones; -a lists every run. A filter\n"
             "(--tag, --group) looks at every run. Archived runs (tandem archive) are left\n"
             "out unless -a or --archived.\n",
    .opts = opts,
};

/* Whether the comma-separated set tags holds tag. */
static int has_tag(const char *tags, const char *tag) {
    size_t len = strlen(tag);
    for (const char *p = tags ? tags : ""; *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == len && !strncmp(p, tag, n)) return 1;
        p += n + (end != NULL);
    }
    return 0;
}

int cmd_ps(int argc, char **argv) {
    int all = 0, archived = 0;
    const char *tags[TD_TAGS_MAX], *group = NULL;
    size_t ntags = 0;
    cli_parser p;
    cli_init(&p, &verb, argc, argv);
    for (int c; (c = cli_next(&p)) != CLI_END;) {
        if (c == CLI_EXIT) return p.exit_code;
        if (c == OPT_ALL)
            all = 1;
        else if (c == OPT_ARCHIVED)
            archived = 1;
        else if (c == OPT_TAG || c == OPT_GROUP) {
            if (td_label_check(c == OPT_TAG ? "tag" : "group", p.value) != TD_OK) {
                cli_error(&verb, "%s", td_error_msg());
                td_error_clear();
                return 2;
            }
            if (c == OPT_GROUP)
                group = p.value;
            else if (ntags == TD_TAGS_MAX)
                return cli_error(&verb, "at most %d --tag filters", TD_TAGS_MAX);
            else
                tags[ntags++] = p.value;
        } else
            return cli_error(&verb, "unexpected argument '%s'", p.value);
    }
    int filtered = ntags || group;
    td_rundb *store;
    if (run_cli_open_store(&store)) return 1;
    /* A dead supervisor's cloud instances, terminated (one line each on stderr); no AWS call
     * unless a run's RUN/instances.json lists one alive and nobody holds its lock. */
    td_gc_orphans(store, stderr, NULL);
    td_run *runs = NULL;
    size_t n = 0;
    int flags = all || archived || filtered ? TD_RUN_LIST_ALL : 0;
    if (all || archived) flags |= TD_RUN_LIST_ARCHIVED;
    td_status st = td_run_list(store, flags, &runs, &n);
    if (st != TD_OK) {
        run_cli_error(st);
        run_cli_close(store, NULL);
        return 1;
    }
    printf("%-20s %-14s %-10s %-17s %-9s %8s %10s  %s\n", "ID", "WORKFLOW", "STATUS", "STARTED",
           "DURATION", "STEP", "LOSS", "NOTE");
    double now = td_wall_s();
    for (size_t i = 0; i < n; i++) {
        td_run *r = &runs[i];
        if (archived && !all && !r->archived) continue;
        int match = !group || (r->group && !strcmp(r->group, group));
        for (size_t t = 0; match && t < ntags; t++) match = has_tag(r->tags, tags[t]);
        if (!match) continue;
        if (td_run_reap_stale(store, r) != TD_OK) td_error_clear();
        char started[32], dur[32], step[24] = "-", loss[32] = "-";
        fmt_time(r->started_s, started, sizeof started);
        double end = r->ended_s > 0 ? r->ended_s : now;
        fmt_duration(r->started_s > 0 ? end - r->started_s : -1, dur, sizeof dur);
        td_metric_row *last = NULL;
        size_t nlast = 0;
        if (td_metrics_last(store, r->id, &last, &nlast) == TD_OK) {
            const td_metric_row *l = pick_loss(last, nlast);
            if (l) {
                snprintf(step, sizeof step, "%lld", (long long)l->step);
                snprintf(loss, sizeof loss, "%.4g", l->value);
            }
            td_metric_rows_free(last, nlast);
        } else {
            td_error_clear();
        }
        /* The note of a run still going says where it stands (a Slurm job's state and, while
         * it waits, Slurm's reason); a finished run's is in tandem show. */
        const char *note = !td_run_status_is_final(r->status) && r->note ? r->note : "";
        /* The labels lead the NOTE column ([group] #tag ...): short by their rules, and the
         * column a reader scans for words anyway. */
        char *labels = NULL;
        if ((r->group && *r->group) || (r->tags && *r->tags) || r->archived) {
            labels = td_xasprintf("%s%s%s%s%s", r->archived ? "(archived) " : "",
                                  r->group && *r->group ? "[" : "", r->group ? r->group : "",
                                  r->group && *r->group ? "] " : "", "");
            if (r->tags && *r->tags) {
                char *copy = td_xstrdup(r->tags);
                for (char *save = NULL, *t = strtok_r(copy, ",", &save); t;
                     t = strtok_r(NULL, ",", &save)) {
                    char *more = td_xasprintf("%s#%s ", labels, t);
                    free(labels);
                    labels = more;
                }
                free(copy);
            }
            if (*note) {
                char *more = td_xasprintf("%s%s", labels, note);
                free(labels);
                labels = more;
            } else {
                labels[strlen(labels) - 1] = '\0'; /* the last ' ' */
            }
            note = labels;
        }
        printf("%-20s %-14s %-10s %-17s %-9s %8s %10s%s%s\n", run_cli_text(r->id),
               run_cli_text(r->workflow), td_run_status_str(r->status), started, dur, step, loss,
               *note ? "  " : "", short_note(note));
        free(labels);
    }
    td_runs_free(runs, n);
    run_cli_close(store, NULL);
    return 0;
}
