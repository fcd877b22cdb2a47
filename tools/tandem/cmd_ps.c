/* tandem ps: the runs table, newest first. Ids, workflows, config values and notes are anyone's
 * text (a run directory named by hand, a note quoting a program's output): they reach the
 * terminal escaped (run_cli_text); --json keeps them as they are. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "run_cli.h"
#include "tandem/exec.h"

/* Local date and time, ISO 8601's order ("2026-11-29 06:50"): a run of last week and one of
 * today read alike, and sort as text. */
static void fmt_time(double t, char *out, size_t n) {
    if (t <= 0) {
        snprintf(out, n, "-");
        return;
    }
    time_t tt = (time_t)t;
    struct tm tm;
    localtime_r(&tt, &tm);
    strftime(out, n, "%Y-%m-%d %H:%M", &tm);
}

/* The same in UTC with seconds, as --json gives it ("2026-11-29T06:50:45Z"); null before. */
static json_t *iso_utc(double t) {
    if (t <= 0) return json_null();
    time_t tt = (time_t)t;
    struct tm tm;
    char buf[32];
    gmtime_r(&tt, &tm);
    strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return json_string(buf);
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

/* The widest note and config `tandem ps` prints (bytes before escaping); tandem show and --json
 * have the whole of them. */
#define NOTE_MAX   100
#define CONFIG_MAX 40
/* The config keys the CONFIG column shows at most. */
#define CONFIG_KEYS 4

/* s cut to max bytes ("..." at the end when cut, never inside a UTF-8 character), with its
 * control bytes escaped. */
static const char *cut_text(const char *s, size_t max) {
    size_t len = strlen(s);
    if (len <= max) return run_cli_text(s);
    size_t cut = max - 3;
    while (cut > 0 && ((unsigned char)s[cut] & 0xc0) == 0x80) cut--;
    char *head = td_xasprintf("%.*s...", (int)cut, s);
    const char *text = run_cli_text(head);
    free(head);
    return text;
}

enum { OPT_ALL = 1, OPT_ARCHIVED, OPT_TAG, OPT_GROUP, OPT_FILTER, OPT_SORT, OPT_JSON };

static const cli_opt opts[] = {
    {OPT_ALL, "all", 'a', NULL, "list every run (archived ones too)", 0},
    {OPT_ARCHIVED, "archived", 0, NULL, "list the archived runs only", 0},
    {OPT_TAG, "tag", 0, "TAG", "only runs with this tag (repeatable: runs with all of them)",
     CLI_REPEAT},
    {OPT_GROUP, "group", 0, "GROUP", "only the runs of this group", 0},
    {OPT_FILTER, "filter", 0, "EXPR",
     "only runs whose param or config KEY matches: KEY=V, KEY!=V, KEY<N,\n"
     "KEY<=N, KEY>N, KEY>=N (repeatable: all must hold), e.g. lr=0.001",
     CLI_REPEAT},
    {OPT_SORT, "sort", 0, "[-]KEY",
     "order by this param or config key (numbers as numbers), '-' for\n"
     "descending; runs without it last (default: newest first)",
     0},
    {OPT_JSON, "json", 0, NULL, "one JSON array of run objects (docs/runs.md), newest first", 0},
    {0},
};

static const cli_command verb = {
    .name = "tandem ps",
    .usage = "[-a | --archived] [--tag TAG]... [--group GROUP] [--filter EXPR]... [--sort "
             "[-]KEY] [--json]",
    .about = "Active runs and the 10 most recent finished ones, newest first; -a lists every\n"
             "run. A filter (--tag, --group, --filter) looks at every run. Archived runs\n"
             "(tandem archive) are left out unless -a or --archived. CONFIG shows the params\n"
             "and config keys whose values differ between the runs listed. A live run whose\n"
             "workers wrote nothing for TANDEM_SILENT_S seconds (default 900) is \"silent\".\n",
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

/* Whether the project has a run store at all: `tandem ps` in a directory without one says
 * there are no runs instead of making .tandem/ there. */
static int store_exists(void) {
    const char *home = td_env_str(TD_ENV_HOME);
    const char *base = home && *home ? home : ".";
    char *db = td_xasprintf("%s/.tandem/runs.db", base);
    char *runs = td_xasprintf("%s/.tandem/runs", base);
    struct stat sb;
    int yes = stat(db, &sb) == 0 || stat(runs, &sb) == 0;
    free(db);
    free(runs);
    return yes;
}

/* One listed run with what the table and the JSON need. */
typedef struct {
    td_run *run;
    td_run_field *fields;
    size_t nfields;
    int64_t silent_s;
    double last_activity;
    int has_loss;
    int64_t step;
    double loss;
    char *loss_key;
    int has_cost; /* RUN/instances.json gives at least one instance a price */
    double cost_usd; /* to now while an instance lives */
    size_t order; /* its place in the store's creation order */
} ps_row;

static const char *sort_key;
static int sort_desc;

static int cmp_rows(const void *a, const void *b) {
    const ps_row *x = a, *y = b;
    if (sort_key) {
        const td_run_field *fx = td_run_field_find(x->fields, x->nfields, sort_key);
        const td_run_field *fy = td_run_field_find(y->fields, y->nfields, sort_key);
        if (!fx != !fy) return fx ? -1 : 1; /* runs without the key last, either way */
        int c = td_run_field_cmp(fx, fy);
        if (c) return sort_desc ? -c : c;
    }
    /* newest first (created, then the store's order: ids of one second) */
    if (x->run->created_s != y->run->created_s)
        return x->run->created_s < y->run->created_s ? 1 : -1;
    return (x->order < y->order) - (x->order > y->order);
}

/* The config keys worth a column: those two rows hold with different values (a sweep's lr),
 * the --sort and --filter keys first; when none differ, the run's params (tandem run --param).
 * At most CONFIG_KEYS. */
static size_t config_columns(const ps_row *rows, size_t n, const char *const *first, size_t nfirst,
                             const char **out) {
    size_t k = 0;
    for (size_t i = 0; i < nfirst && k < CONFIG_KEYS; i++) {
        int dup = 0;
        for (size_t j = 0; j < k; j++) dup |= !strcmp(out[j], first[i]);
        if (!dup) out[k++] = first[i];
    }
    for (int pass = 0; pass < 2 && k < CONFIG_KEYS; pass++) {
        for (size_t r = 0; r < n && k < CONFIG_KEYS; r++) {
            for (size_t f = 0; f < rows[r].nfields && k < CONFIG_KEYS; f++) {
                const td_run_field *fl = &rows[r].fields[f];
                int dup = 0;
                for (size_t j = 0; j < k; j++) dup |= !strcmp(out[j], fl->key);
                if (dup) continue;
                int take;
                if (pass == 0) { /* another row has it with another value */
                    take = 0;
                    for (size_t o = 0; o < n && !take; o++) {
                        const td_run_field *g =
                            td_run_field_find(rows[o].fields, rows[o].nfields, fl->key);
                        take = g && strcmp(g->text, fl->text);
                    }
                } else {
                    take = fl->from_params;
                }
                if (take) out[k++] = fl->key;
            }
        }
        if (k) break; /* the params only when nothing differs */
    }
    return k;
}

/* A JSON string of s (NULL: null). Text a run wrote need not be UTF-8 (a note quoting a
 * program's bytes): each byte that is not part of a valid sequence becomes U+FFFD, as in the
 * ui's API, where jansson would give no string at all. */
static json_t *json_text(const char *s) {
    if (!s) return json_null();
    json_t *v = json_string(s);
    if (v) return v;
    size_t n = strlen(s), used = 0;
    char *out = td_xmalloc(3 * n + 1);
    for (size_t i = 0; i < n;) {
        const unsigned char *p = (const unsigned char *)s + i;
        size_t len = *p < 0x80                 ? 1
                     : *p >= 0xc2 && *p <= 0xdf ? 2
                     : *p >= 0xe0 && *p <= 0xef ? 3
                     : *p >= 0xf0 && *p <= 0xf4 ? 4
                                                : 0;
        for (size_t k = 1; k < len; k++)
            if (i + k >= n || (p[k] & 0xc0) != 0x80) len = 0;
        if (len) {
            memcpy(out + used, p, len);
            used += len;
            i += len;
        } else {
            memcpy(out + used, "\xef\xbf\xbd", 3);
            used += 3;
            i++;
        }
    }
    out[used] = '\0';
    v = json_string(out); /* still NULL for overlong forms jansson refuses: then null */
    free(out);
    return v ? v : json_null();
}

static json_t *object_or_empty(const char *text) {
    json_t *o = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
    if (json_is_object(o)) return o;
    json_decref(o);
    return json_object();
}

static json_t *row_json(const ps_row *row, double now) {
    const td_run *r = row->run;
    int final = td_run_status_is_final(r->status);
    json_t *o = json_object();
    json_object_set_new(o, "id", json_text(r->id));
    json_object_set_new(o, "workflow", json_text(r->workflow ? r->workflow : ""));
    json_object_set_new(o, "status", json_string(td_run_status_str(r->status)));
    json_object_set_new(o, "live", json_boolean(!final));
    json_object_set_new(o, "silent_s",
                        row->silent_s > 0 ? json_integer(row->silent_s) : json_null());
    json_object_set_new(o, "last_activity", final ? json_null() : iso_utc(row->last_activity));
    json_object_set_new(o, "exit_code",
                        final && r->exit_code >= 0 ? json_integer(r->exit_code) : json_null());
    json_object_set_new(o, "created", iso_utc(r->created_s));
    json_object_set_new(o, "started", iso_utc(r->started_s));
    json_object_set_new(o, "ended", final ? iso_utc(r->ended_s) : json_null());
    double end = final && r->ended_s > 0 ? r->ended_s : now;
    json_object_set_new(o, "duration_s",
                        r->started_s > 0 ? json_real(fmax(0, end - r->started_s)) : json_null());
    json_object_set_new(o, "restarts", json_integer(r->restarts));
    json_object_set_new(o, "last_step", row->has_loss ? json_integer(row->step) : json_null());
    json_object_set_new(o, "loss_key", row->has_loss ? json_text(row->loss_key) : json_null());
    json_object_set_new(o, "loss",
                        row->has_loss && isfinite(row->loss) ? json_real(row->loss) : json_null());
    json_object_set_new(o, "cost_usd", row->has_cost ? json_real(row->cost_usd) : json_null());
    json_object_set_new(o, "params", object_or_empty(r->params_json));
    json_object_set_new(o, "config", object_or_empty(r->config_json));
    json_t *tags = json_array();
    if (r->tags && *r->tags) {
        char *copy = td_xstrdup(r->tags);
        for (char *save = NULL, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
            json_array_append_new(tags, json_text(t));
        free(copy);
    }
    json_object_set_new(o, "tags", tags);
    json_object_set_new(o, "group", r->group && *r->group ? json_text(r->group) : json_null());
    json_object_set_new(o, "notes", json_text(r->notes));
    json_object_set_new(o, "note", json_text(r->note));
    json_object_set_new(o, "archived", json_boolean(r->archived));
    json_object_set_new(o, "code_version", json_text(r->code_version));
    json_object_set_new(o, "run_dir", json_text(r->run_dir));
    return o;
}

/* The NOTE column: "silent for N min", the labels ([group] #tag), the user's notes (first
 * line) and the supervisor's note (why it ended, where a Slurm job stands). */
static char *note_text(const ps_row *row) {
    const td_run *r = row->run;
    char *s = td_xstrdup("");
#define ADD(...)                                                                                   \
    do {                                                                                           \
        char *more_ = td_xasprintf(__VA_ARGS__);                                                   \
        char *both_ = td_xasprintf("%s%s%s", s, *s ? " " : "", more_);                             \
        free(more_);                                                                               \
        free(s);                                                                                   \
        s = both_;                                                                                 \
    } while (0)
    if (row->silent_s >= 60)
        ADD("silent for %lld min;", (long long)(row->silent_s / 60));
    else if (row->silent_s > 0)
        ADD("silent for %lld s;", (long long)row->silent_s);
    if (r->archived) ADD("(archived)");
    if (r->group && *r->group) ADD("[%s]", r->group);
    if (r->tags && *r->tags) {
        char *copy = td_xstrdup(r->tags);
        for (char *save = NULL, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
            ADD("#%s", t);
        free(copy);
    }
    if (r->notes && *r->notes) ADD("%.*s", (int)strcspn(r->notes, "\n"), r->notes);
    if (r->note && *r->note) ADD("%s%s", r->notes && *r->notes ? "| " : "", r->note);
#undef ADD
    return s;
}

int cmd_ps(int argc, char **argv) {
    int all = 0, archived = 0, as_json = 0;
    const char *tags[TD_TAGS_MAX], *group = NULL;
    size_t ntags = 0, nfilters = 0;
    td_run_filter *filters = NULL;
    int rc = 0;
    sort_key = NULL;
    sort_desc = 0;
    cli_parser p;
    cli_init(&p, &verb, argc, argv);
    for (int c; (c = cli_next(&p)) != CLI_END;) {
        if (c == CLI_EXIT) {
            rc = p.exit_code;
            goto out;
        }
        if (c == OPT_ALL)
            all = 1;
        else if (c == OPT_ARCHIVED)
            archived = 1;
        else if (c == OPT_JSON)
            as_json = 1;
        else if (c == OPT_SORT) {
            sort_desc = p.value[0] == '-';
            sort_key = p.value + sort_desc;
            if (!*sort_key) {
                rc = cli_error(&verb, "--sort expects a param or config key, e.g. --sort lr or "
                                      "--sort -lr (descending)");
                goto out;
            }
        } else if (c == OPT_FILTER) {
            filters = td_xrealloc(filters, (nfilters + 1) * sizeof *filters);
            if (td_run_filter_parse(p.value, &filters[nfilters]) != TD_OK) {
                cli_error(&verb, "--%s", td_error_msg()); /* "--filter 'lr': ..." */
                td_error_clear();
                rc = 2;
                goto out;
            }
            nfilters++;
        } else if (c == OPT_TAG || c == OPT_GROUP) {
            if (td_label_check(c == OPT_TAG ? "tag" : "group", p.value) != TD_OK) {
                cli_error(&verb, "%s", td_error_msg());
                td_error_clear();
                rc = 2;
                goto out;
            }
            if (c == OPT_GROUP)
                group = p.value;
            else if (ntags == TD_TAGS_MAX) {
                rc = cli_error(&verb, "at most %d --tag filters", TD_TAGS_MAX);
                goto out;
            } else
                tags[ntags++] = p.value;
        } else {
            rc = cli_error(&verb, "unexpected argument '%s'", p.value);
            goto out;
        }
    }
    if (!store_exists()) {
        const char *home = td_env_str(TD_ENV_HOME);
        if (as_json)
            printf("[]\n");
        else
            printf("no runs: %s has no .tandem/ (start one with tandem run; TANDEM_HOME names "
                   "another project)\n",
                   home && *home ? run_cli_text(home) : "this directory");
        goto out;
    }
    int filtered = ntags || group || nfilters;
    td_rundb *store;
    if (run_cli_open_store(&store)) {
        rc = 1;
        goto out;
    }
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
        rc = 1;
        goto out;
    }
    double now = td_wall_s();
    ps_row *rows = td_xcalloc(n ? n : 1, sizeof *rows);
    size_t nrows = 0;
    for (size_t i = 0; i < n; i++) {
        td_run *r = &runs[i];
        if (archived && !all && !r->archived) continue;
        int match = !group || (r->group && !strcmp(r->group, group));
        for (size_t t = 0; match && t < ntags; t++) match = has_tag(r->tags, tags[t]);
        if (!match) continue;
        ps_row *row = &rows[nrows];
        row->run = r;
        row->order = i;
        td_run_fields(r, &row->fields, &row->nfields);
        for (size_t f = 0; match && f < nfilters; f++)
            match = td_run_filter_match(&filters[f], row->fields, row->nfields);
        if (!match) {
            td_run_fields_free(row->fields, row->nfields);
            memset(row, 0, sizeof *row);
            continue;
        }
        nrows++;
        /* a run that lives in the cloud and has not ended: its store pulled (one S3 listing) */
        if (!td_run_status_is_final(r->status) && td_run_is_remote(r)) run_cli_attach(store, r);
        if (td_run_reap_stale(store, r) != TD_OK) td_error_clear();
        row->silent_s = td_run_silent_s(r, now);
        row->last_activity = td_run_last_activity(r);
        td_metric_row *last = NULL;
        size_t nlast = 0;
        if (td_metrics_last(store, r->id, &last, &nlast) == TD_OK) {
            const td_metric_row *l = pick_loss(last, nlast);
            if (l) {
                row->has_loss = 1;
                row->step = l->step;
                row->loss = l->value;
                row->loss_key = td_xstrdup(l->key);
            }
            td_metric_rows_free(last, nlast);
        } else {
            td_error_clear();
        }
        /* The cloud instances' cost, from the run's own record (no AWS call); a run without
         * one (not a cloud run) or with a bad one shows none. */
        td_run_cost cost;
        if (r->run_dir && td_run_cost_read(r->run_dir, &cost) == TD_OK) {
            row->has_cost = td_run_cost_priced(&cost);
            row->cost_usd = td_run_cost_at(&cost, now);
            td_run_cost_clear(&cost);
        } else {
            td_error_clear();
        }
    }
    qsort(rows, nrows, sizeof *rows, cmp_rows);
    if (as_json) {
        /* One array (as gh --json and kubectl -o json give; jq '.[]' makes it lines), a run
         * object per line; numbers in their shortest exact form (lr 0.2, not
         * 0.20000000000000001). */
        printf("[");
        for (size_t i = 0; i < nrows; i++) {
            json_t *o = row_json(&rows[i], now);
            char *text = run_cli_json(o, 0);
            printf("%s\n%s", i ? "," : "", text);
            free(text);
            json_decref(o);
        }
        printf("%s]\n", nrows ? "\n" : "");
    } else if (!nrows) {
        printf(filtered ? "no runs match\n" : "no runs yet: start one with tandem run\n");
    } else {
        const char *first[1 + 16];
        size_t nfirst = 0;
        if (sort_key) first[nfirst++] = sort_key;
        for (size_t f = 0; f < nfilters && nfirst < TD_ARRAY_LEN(first); f++)
            first[nfirst++] = filters[f].key;
        const char *cols[CONFIG_KEYS];
        size_t ncols = config_columns(rows, nrows, first, nfirst, cols);
        /* No CONFIG column when no run has a param or config key to show. */
        int cw = ncols ? CONFIG_MAX : 0;
        /* No COST column unless a listed run has a priced cloud instance. */
        int any_cost = 0;
        for (size_t i = 0; i < nrows; i++) any_cost |= rows[i].has_cost;
        int kw = any_cost ? 10 : 0;
        printf("%-20s %-14s %-10s %-16s %-9s %8s %10s %*s%s %-*s%s%s\n", "ID", "WORKFLOW",
               "STATUS", "STARTED", "DURATION", "STEP", "LOSS", kw, any_cost ? "COST" : "",
               any_cost ? " " : "", cw, ncols ? "CONFIG" : "", ncols ? "  " : "", "NOTE");
        for (size_t i = 0; i < nrows; i++) {
            const ps_row *row = &rows[i];
            const td_run *r = row->run;
            char started[32], dur[32], step[24] = "-", loss[32] = "-", cost[32] = "-";
            if (row->has_cost) snprintf(cost, sizeof cost, "$%.2f", row->cost_usd);
            fmt_time(r->started_s, started, sizeof started);
            double end = r->ended_s > 0 ? r->ended_s : now;
            fmt_duration(r->started_s > 0 ? end - r->started_s : -1, dur, sizeof dur);
            if (row->has_loss) {
                snprintf(step, sizeof step, "%lld", (long long)row->step);
                snprintf(loss, sizeof loss, "%.4g", row->loss);
            }
            char *config = td_xstrdup("");
            for (size_t c = 0; c < ncols; c++) {
                const td_run_field *f = td_run_field_find(row->fields, row->nfields, cols[c]);
                if (!f) continue;
                /* A fraction to 7 significant digits, what a float32 holds (tandem train's lr
                 * 0.00999999978 reads 0.01; --json has it exactly); an integer whole. */
                char num[40];
                if (f->is_number && strcmp(f->text, "true") && strcmp(f->text, "false"))
                    snprintf(num, sizeof num,
                             f->number == floor(f->number) && fabs(f->number) < 1e15 ? "%.0f"
                                                                                     : "%.7g",
                             f->number);
                const char *shown = f->is_number && strcmp(f->text, "true") &&
                                            strcmp(f->text, "false")
                                        ? num
                                        : f->text;
                char *more = td_xasprintf("%s%s%s=%s", config, *config ? " " : "", f->key, shown);
                free(config);
                config = more;
            }
            char *note = note_text(row);
            const char *shown_config = cut_text(config, CONFIG_MAX);
            char *line = td_xasprintf(
                "%-20s %-14s %-10s %-16s %-9s %8s %10s %*s%s %-*s%s%s", run_cli_text(r->id),
                run_cli_text(r->workflow),
                row->silent_s > 0 ? "silent" : td_run_status_str(r->status), started, dur, step,
                loss, kw, any_cost ? cost : "", any_cost ? " " : "", cw,
                ncols ? (*shown_config ? shown_config : "-") : "", ncols ? "  " : "",
                cut_text(note, NOTE_MAX));
            size_t len = strlen(line);
            while (len && line[len - 1] == ' ') line[--len] = '\0'; /* no padding after the end */
            printf("%s\n", line);
            free(line);
            free(config);
            free(note);
        }
    }
    for (size_t i = 0; i < nrows; i++) {
        td_run_fields_free(rows[i].fields, rows[i].nfields);
        free(rows[i].loss_key);
    }
    free(rows);
    td_runs_free(runs, n);
    run_cli_close(store, NULL);
out:
    for (size_t i = 0; i < nfilters; i++) td_run_filter_clear(&filters[i]);
    free(filters);
    return rc;
}
