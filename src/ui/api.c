/* The JSON API of `tandem ui` (docs/ui-api.md): runs, one run, a metric's downsampled series,
 * logs, artifacts, stopping a run, and the event streams' entry points.
 *
 * Every parameter is checked before any work: a malformed one is a 400 naming it and what it
 * should be, an unknown run, key, log or artifact a 404 naming what exists. Nothing a client
 * sends becomes part of a file path. */
#include "ui_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tandem/exec.h"
#include "tandem/workflow.h"

#define MAX_WIDTH       10000
#define DEFAULT_WIDTH   1000
#define MAX_KEYS        64
#define DEFAULT_TAIL    200
#define MAX_TAIL        100000
#define DEFAULT_LIMIT   (1 << 20)
#define MAX_LIMIT       (16 << 20)
#define TAIL_SCAN_BYTES (16 << 20) /* tail=N reads at most this much from the end */

/* ---- small helpers ---- */

static json_t *time_or_null(double t) {
    return t > 0 ? json_real(t) : json_null();
}

static json_t *opt_text(const char *s) {
    return s ? td__ui_json_text(s, strlen(s)) : json_null();
}

/* The cloud instances' cost (RUN/instances.json through the store's td_run_cost_read): cost_usd
 * at cost_as_of (now), and cost_usd_per_hour still billing then, so that the page grows a live
 * run's figure without asking again; all null for a run with no priced instance ("-" on the
 * page: unknown, not free). */
static void cost_fields(const td_run *r, double now, json_t *o) {
    td_run_cost cost;
    td_status st = r->run_dir ? td_run_cost_read(r->run_dir, &cost) : TD_ERR_NOTFOUND;
    if (st != TD_OK) {
        if (st != TD_ERR_NOTFOUND)
            TD_LOG_DEBUG("tandem ui: cost of run %s: %s", r->id, td_error_msg());
        td_error_clear();
        memset(&cost, 0, sizeof cost);
    }
    int priced = td_run_cost_priced(&cost);
    json_object_set_new(o, "cost_usd",
                        priced ? json_real(td_run_cost_at(&cost, now)) : json_null());
    json_object_set_new(o, "cost_usd_per_hour",
                        priced ? json_real(td_run_cost_rate(&cost, now)) : json_null());
    json_object_set_new(o, "cost_as_of", priced ? json_real(now) : json_null());
    json_object_set_new(o, "cost_unpriced",
                        st == TD_OK ? json_integer((json_int_t)cost.unpriced) : json_null());
    td_run_cost_clear(&cost);
}

json_t *td__ui_run_json(td_rundb *db, const td_run *r, const char *const *keys, size_t nkeys) {
    double now = td_wall_s();
    json_t *o = json_object();
    json_object_set_new(o, "id", opt_text(r->id));
    json_object_set_new(o, "workflow", opt_text(r->workflow));
    json_object_set_new(o, "status", json_string(td_run_status_str(r->status)));
    int final = td_run_status_is_final(r->status);
    json_object_set_new(o, "exit_code",
                        final && r->exit_code >= 0 ? json_integer(r->exit_code) : json_null());
    json_object_set_new(o, "created", time_or_null(r->created_s));
    json_object_set_new(o, "started", time_or_null(r->started_s));
    json_object_set_new(o, "ended", time_or_null(final ? r->ended_s : 0));
    double end = final && r->ended_s > 0 ? r->ended_s : now;
    json_object_set_new(o, "duration",
                        r->started_s > 0 ? json_real(fmax(0, end - r->started_s)) : json_null());
    json_object_set_new(o, "restarts", json_integer(r->restarts));
    json_object_set_new(o, "code_version", opt_text(r->code_version));
    json_t *params = r->params_json ? json_loads(r->params_json, JSON_DECODE_ANY, NULL) : NULL;
    if (!json_is_object(params)) {
        json_decref(params);
        params = json_object();
    }
    json_object_set_new(o, "params", params);
    /* The config as columns: params and the script's config in one flat namespace of scalars
     * (td_run_fields), so the runs table can show, sort and filter by lr whichever recorded it. */
    td_run_field *fields = NULL;
    size_t nfields = 0;
    td_run_fields(r, &fields, &nfields);
    json_t *hp = json_object();
    for (size_t i = 0; i < nfields; i++) {
        const td_run_field *f = &fields[i];
        json_t *v = !f->is_number                 ? td__ui_json_text(f->text, strlen(f->text))
                    : !strcmp(f->text, "true")    ? json_true()
                    : !strcmp(f->text, "false")   ? json_false()
                    : f->number == (double)(json_int_t)f->number && fabs(f->number) < 9e15
                        ? json_integer((json_int_t)f->number)
                        : json_real(f->number);
        json_object_set_new(hp, f->key, v);
    }
    td_run_fields_free(fields, nfields);
    json_object_set_new(o, "hparams", hp);
    json_object_set_new(o, "nodes", json_integer(r->nodes));
    json_object_set_new(o, "nproc_per_node", json_integer(r->nproc_per_node));
    json_object_set_new(o, "note", opt_text(r->note));
    /* The user's labels (tandem tag/group/note, issue 19). */
    json_t *tags = json_array();
    if (r->tags && *r->tags) {
        char *copy = td_xstrdup(r->tags);
        for (char *save = NULL, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
            json_array_append_new(tags, opt_text(t));
        free(copy);
    }
    json_object_set_new(o, "tags", tags);
    json_object_set_new(o, "group", r->group && *r->group ? opt_text(r->group) : json_null());
    json_object_set_new(o, "notes", opt_text(r->notes));
    json_object_set_new(o, "archived", json_boolean(r->archived));
    json_object_set_new(o, "live", json_boolean(!final));
    /* A live run whose workers wrote nothing for TANDEM_SILENT_S seconds (default 900: 15 min)
     * is "silent for N min", not just running: a hang looks like progress otherwise. */
    double last = final ? 0 : td_run_last_activity(r);
    json_object_set_new(o, "last_activity", time_or_null(last));
    int64_t silent = final ? 0 : td_run_silent_s(r, now);
    json_object_set_new(o, "silent_s", silent > 0 ? json_integer(silent) : json_null());
    cost_fields(r, now, o);
    json_t *m = json_object();
    if (nkeys) {
        td_metric_stats *stats = td_xcalloc(nkeys, sizeof *stats);
        if (td_metrics_stats(db, r->id, keys, nkeys, stats) == TD_OK) {
            for (size_t i = 0; i < nkeys; i++) {
                if (!stats[i].found) continue;
                json_object_set_new(m, keys[i],
                                    json_pack("{s:f,s:I,s:f,s:f}", "last", stats[i].last,
                                              "last_step", (json_int_t)stats[i].last_step, "min",
                                              stats[i].min, "max", stats[i].max));
            }
        } else {
            TD_LOG_DEBUG("tandem ui: metrics of run %s: %s", r->id, td_error_msg());
            td_error_clear();
        }
        free(stats);
    }
    json_object_set_new(o, "metrics", m);
    return o;
}

/* ---- logs on disk ---- */

void td__ui_logs_free(td__ui_log *logs, size_t count) {
    for (size_t i = 0; i < count; i++) {
        free(logs[i].label);
        free(logs[i].path);
    }
    free(logs);
}

static int cmp_log(const void *a, const void *b) {
    const td__ui_log *x = a, *y = b;
    /* Ranks first in order, then setup, then supervisor. */
    int kx = x->rank >= 0 ? 0 : !strcmp(x->label, "setup") ? 1 : 2;
    int ky = y->rank >= 0 ? 0 : !strcmp(y->label, "setup") ? 1 : 2;
    if (kx != ky) return kx - ky;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* rank-<R>.log -> R (digits only, no sign, no leading zeros beyond "0"); -1 otherwise. */
static int log_rank(const char *name) {
    if (strncmp(name, "rank-", 5)) return -1;
    const char *p = name + 5;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9')) return -1;
    long r = 0;
    while (*p >= '0' && *p <= '9') {
        r = r * 10 + (*p++ - '0');
        if (r > 1000000) return -1;
    }
    return strcmp(p, ".log") ? -1 : (int)r;
}

void td__ui_logs_list(const char *run_dir, td__ui_log **out, size_t *count) {
    *out = NULL;
    *count = 0;
    if (!run_dir) return;
    char *dir = td_run_path(run_dir, TD_RUN_PATH_LOGS);
    DIR *d = opendir(dir);
    size_t cap = 0;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            int rank = log_rank(e->d_name);
            const char *label = NULL;
            if (rank < 0 && !strcmp(e->d_name, "setup.log")) label = "setup";
            if (rank < 0 && !strcmp(e->d_name, "supervisor.log")) label = "supervisor";
            if (rank < 0 && !label) continue;
            char *path = td_xasprintf("%s/%s", dir, e->d_name);
            struct stat sb;
            /* Regular files only: a link in a run's logs/ could point anywhere. */
            if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
                free(path);
                continue;
            }
            if (*count == cap) {
                cap = cap ? 2 * cap : 8;
                *out = td_xrealloc(*out, cap * sizeof **out);
            }
            td__ui_log *l = &(*out)[(*count)++];
            l->rank = rank;
            l->label = label ? td_xstrdup(label) : td_xasprintf("%d", rank);
            l->path = path;
            l->nbytes = (int64_t)sb.st_size;
        }
        closedir(d);
    }
    free(dir);
    if (*count > 1) qsort(*out, *count, sizeof **out, cmp_log);
}

json_t *td__ui_log_label_json(const td__ui_log *log) {
    return log->rank >= 0 ? json_integer(log->rank) : json_string(log->label);
}

/* ---- parameters ---- */

/* Each returns 0, or -1 after replying 400 naming the parameter. */

static int param_int(const td__ui_request *req, td__ui_reply *rep, const char *name, int64_t def,
                     int64_t min, int64_t max, int64_t *out, int *given) {
    const char *v = td__ui_arg_get(req, name);
    if (given) *given = v != NULL;
    if (!v) {
        *out = def;
        return 0;
    }
    errno = 0;
    char *end = NULL;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || errno == ERANGE || x < min || x > max) {
        td__ui_reply_error(rep, 400,
                           "parameter %s must be an integer from %lld to %lld, got '%.60s'", name,
                           (long long)min, (long long)max, v);
        return -1;
    }
    *out = x;
    return 0;
}

static int param_double(const td__ui_request *req, td__ui_reply *rep, const char *name, double *out,
                        int *given) {
    const char *v = td__ui_arg_get(req, name);
    *given = v != NULL;
    if (!v) return 0;
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || *end || !isfinite(x) || errno == ERANGE) {
        td__ui_reply_error(rep, 400, "parameter %s must be a finite number, got '%.60s'", name, v);
        return -1;
    }
    *out = x;
    return 0;
}

static int param_bool(const td__ui_request *req, td__ui_reply *rep, const char *name, int *out) {
    const char *v = td__ui_arg_get(req, name);
    *out = 0;
    if (!v) return 0;
    if (!strcmp(v, "1") || !strcmp(v, "true") || !*v) {
        *out = 1;
        return 0;
    }
    if (!strcmp(v, "0") || !strcmp(v, "false")) return 0;
    td__ui_reply_error(rep, 400, "parameter %s must be 1 or 0, got '%.60s'", name, v);
    return -1;
}

/* metrics=a,b,c (default: the table's defaults; empty: none). *keys points into *buf. */
static int param_keys(const td__ui_request *req, td__ui_reply *rep, char **buf, const char **keys,
                      size_t *nkeys) {
    const char *v = td__ui_arg_get(req, "metrics");
    *buf = NULL;
    *nkeys = 0;
    if (!v) {
        for (size_t i = 0; i < td__ui_ndefault_keys; i++) keys[(*nkeys)++] = td__ui_default_keys[i];
        return 0;
    }
    *buf = td_xstrdup(v);
    for (char *save = NULL, *k = strtok_r(*buf, ",", &save); k; k = strtok_r(NULL, ",", &save)) {
        if (*nkeys == MAX_KEYS) {
            td__ui_reply_error(rep, 400, "parameter metrics names more than %d keys; ask for fewer",
                               MAX_KEYS);
            free(*buf);
            *buf = NULL;
            return -1;
        }
        keys[(*nkeys)++] = k;
    }
    return 0;
}

/* A store error as the reply: 404 for what is not there, 400 for what the request got wrong,
 * 500 otherwise, with the error's own message. */
static void reply_status(td__ui_reply *rep, td_status st) {
    td__ui_reply_error(rep,
                       st == TD_ERR_NOTFOUND  ? 404
                       : st == TD_ERR_INVALID ? 400
                                              : 500,
                       "%s", td_error_msg());
    td_error_clear();
}

/* Resolves the {id} segment; 0, or -1 after replying 404 (no such run) or 400 (ambiguous). */
static int find_run(td_rundb *db, const char *id, td__ui_reply *rep, td_run *run) {
    td_status st = td_run_find(db, id, run);
    if (st == TD_OK) return 0;
    reply_status(rep, st);
    return -1;
}

static void store_error(td__ui_reply *rep) {
    td__ui_reply_error(rep, 500, "the run store could not be read: %s", td_error_msg());
    td_error_clear();
}

/* ---- GET /api/runs ---- */

/* filter=EXPR[ EXPR...]: each a td_run_filter (lr=0.001, epochs>=10), all must hold. 0, or -1
 * after replying 400 naming the expression. */
static int param_filters(const td__ui_request *req, td__ui_reply *rep, td_run_filter **out,
                         size_t *count) {
    const char *v = td__ui_arg_get(req, "filter");
    *out = NULL;
    *count = 0;
    if (!v) return 0;
    char *buf = td_xstrdup(v);
    int rc = 0;
    for (char *save = NULL, *e = strtok_r(buf, " \t", &save); e; e = strtok_r(NULL, " \t", &save)) {
        if (*count == 16) {
            td__ui_reply_error(rep, 400, "parameter filter holds more than 16 expressions");
            rc = -1;
            break;
        }
        *out = td_xrealloc(*out, (*count + 1) * sizeof **out);
        if (td_run_filter_parse(e, &(*out)[*count]) != TD_OK) {
            td__ui_reply_error(rep, 400, "parameter %s", td_error_msg());
            td_error_clear();
            rc = -1;
            break;
        }
        (*count)++;
    }
    free(buf);
    if (rc) {
        for (size_t i = 0; i < *count; i++) td_run_filter_clear(&(*out)[i]);
        free(*out);
        *out = NULL;
        *count = 0;
    }
    return rc;
}

/* The runs whose common metric keys are counted (the newest ones), and the keys read of each. */
#define COMMON_KEYS_RUNS    30
#define COMMON_KEYS_PER_RUN 200
#define COMMON_KEYS_SHOWN   50

static void get_runs(td_rundb *db, const td__ui_request *req, td__ui_reply *rep) {
    int all, archived;
    const char *keys[MAX_KEYS];
    size_t nkeys;
    char *buf = NULL;
    td_run_filter *filters = NULL;
    size_t nfilters = 0;
    if (param_bool(req, rep, "all", &all) || param_bool(req, rep, "archived", &archived) ||
        param_filters(req, rep, &filters, &nfilters))
        return;
    if (param_keys(req, rep, &buf, keys, &nkeys)) goto out_filters;
    td_run *runs = NULL;
    size_t n = 0;
    char **names = NULL;
    size_t nnames = 0;
    if (td_run_list(db, (all || nfilters ? TD_RUN_LIST_ALL : 0) |
                            (archived ? TD_RUN_LIST_ARCHIVED : 0),
                    &runs, &n) != TD_OK ||
        td_metrics_all_keys(db, &names, &nnames) != TD_OK) {
        store_error(rep);
        td_runs_free(runs, n);
        free(buf);
        goto out_filters;
    }
    json_t *arr = json_array();
    const char **listed = td_xcalloc(n ? n : 1, sizeof *listed);
    size_t nlisted = 0;
    for (size_t i = n; i-- > 0;) {
        if (nfilters) {
            td_run_field *fields = NULL;
            size_t nfields = 0;
            td_run_fields(&runs[i], &fields, &nfields);
            int match = 1;
            for (size_t f = 0; match && f < nfilters; f++)
                match = td_run_filter_match(&filters[f], fields, nfields);
            td_run_fields_free(fields, nfields);
            if (!match) continue;
        }
        listed[nlisted++] = runs[i].id;
        json_array_append_new(arr, td__ui_run_json(db, &runs[i], keys, nkeys));
    }
    json_t *karr = json_array();
    for (size_t i = 0; i < nnames; i++) json_array_append_new(karr, opt_text(names[i]));
    td_metrics_keys_free(names, nnames);
    /* The keys the newest listed runs logged, most common first: the page's default metric
     * columns come from these (an HF run logs loss and eval_accuracy, not train/loss). */
    json_t *common = json_array();
    char **ck = NULL;
    int64_t *cn = NULL;
    size_t ncommon = 0;
    if (td_metrics_common_keys(db, listed, nlisted < COMMON_KEYS_RUNS ? nlisted : COMMON_KEYS_RUNS,
                               COMMON_KEYS_PER_RUN, &ck, &cn, &ncommon) == TD_OK) {
        for (size_t i = 0; i < ncommon && i < COMMON_KEYS_SHOWN; i++)
            json_array_append_new(common, json_pack("{s:o,s:I}", "key", opt_text(ck[i]), "runs",
                                                    (json_int_t)cn[i]));
        td_metrics_keys_free(ck, ncommon);
        free(cn);
    } else {
        TD_LOG_DEBUG("tandem ui: common metric keys: %s", td_error_msg());
        td_error_clear();
    }
    free(listed);
    td_runs_free(runs, n);
    free(buf);
    td__ui_reply_json(rep, 200,
                      json_pack("{s:o,s:o,s:o,s:I}", "runs", arr, "metric_keys", karr,
                                "common_keys", common, "silent_after_s",
                                (json_int_t)td_env_int(TD_ENV_SILENT_S)));
out_filters:
    for (size_t i = 0; i < nfilters; i++) td_run_filter_clear(&filters[i]);
    free(filters);
}

/* ---- GET /api/runs/{id} ---- */

/* The run's cloud instances (RUN/instances.json, executor aws) as tandem show prints them, with
 * each one's lifetime and instance-hours to now while it lives; null for a run without any. */
static json_t *instances_json(const td_run *run) {
    td_run_instances rec;
    td_status st = run->run_dir ? td_run_instances_read(run->run_dir, &rec) : TD_ERR_NOTFOUND;
    if (st != TD_OK) {
        if (st != TD_ERR_NOTFOUND)
            TD_LOG_DEBUG("tandem ui: instances of run %s: %s", run->id, td_error_msg());
        td_error_clear();
        return json_null();
    }
    double now = td_wall_s();
    json_t *arr = json_array();
    for (size_t i = 0; i < rec.count; i++) {
        const td_run_instance *in = &rec.items[i];
        double life = td_run_instance_lifetime_s(in, now);
        json_t *e = json_object();
        json_object_set_new(e, "id", opt_text(in->id));
        json_object_set_new(e, "node", in->node >= 0 ? json_integer(in->node) : json_null());
        json_object_set_new(e, "type", opt_text(in->type));
        json_object_set_new(e, "market", opt_text(in->market));
        json_object_set_new(e, "subnet", in->subnet[0] ? opt_text(in->subnet) : json_null());
        json_object_set_new(e, "zone", opt_text(in->zone));
        json_object_set_new(e, "launched", time_or_null(in->launched_s));
        json_object_set_new(e, "ended", time_or_null(in->ended_s));
        json_object_set_new(e, "end", opt_text(in->end));
        json_object_set_new(e, "replaces", in->replaces[0] ? opt_text(in->replaces) : json_null());
        json_object_set_new(e, "state", opt_text(in->state));
        json_object_set_new(e, "live", json_boolean(td_run_instance_live(in)));
        json_object_set_new(e, "lifetime", json_real(life));
        json_object_set_new(e, "instance_hours", json_real(life / 3600));
        /* the price (null: none known) and what this instance cost to now: the page's tooltip
         * and its cost axis (dollars accrued at each metric point's time) come from these */
        json_object_set_new(e, "usd_per_hour",
                            in->usd_per_hour > 0 ? json_real(in->usd_per_hour) : json_null());
        json_object_set_new(e, "price_source",
                            in->price_source[0] ? opt_text(in->price_source) : json_null());
        json_object_set_new(e, "cost_usd", in->usd_per_hour > 0
                                               ? json_real(in->usd_per_hour * life / 3600)
                                               : json_null());
        json_array_append_new(arr, e);
    }
    json_t *o = json_object();
    json_object_set_new(o, "provider", opt_text(rec.provider));
    json_object_set_new(o, "region", opt_text(rec.region));
    json_object_set_new(o, "instance_hours", json_real(td_run_instances_hours(&rec, now)));
    json_object_set_new(o, "instances", arr);
    td_run_instances_clear(&rec);
    return o;
}

/* stats=1: each entry of keys also gets "last", "last_step", "min" and "max" (td_metrics_stats
 * over every key of the run: a few index probes per key). */
static void keys_add_stats(td_rundb *db, const td_run *run, json_t *keys) {
    size_t n = json_array_size(keys);
    if (!n) return;
    const char **names = td_xcalloc(n, sizeof *names);
    td_metric_stats *stats = td_xcalloc(n, sizeof *stats);
    for (size_t i = 0; i < n; i++)
        names[i] = json_string_value(json_object_get(json_array_get(keys, i), "key"));
    if (td_metrics_stats(db, run->id, names, n, stats) == TD_OK) {
        for (size_t i = 0; i < n; i++) {
            if (!stats[i].found) continue;
            json_t *k = json_array_get(keys, i);
            json_object_set_new(k, "last", json_real(stats[i].last));
            json_object_set_new(k, "last_step", json_integer(stats[i].last_step));
            json_object_set_new(k, "min", json_real(stats[i].min));
            json_object_set_new(k, "max", json_real(stats[i].max));
        }
    } else {
        TD_LOG_DEBUG("tandem ui: metric stats of run %s: %s", run->id, td_error_msg());
        td_error_clear();
    }
    free(stats);
    free(names);
}

static void get_run(td_rundb *db, const td_run *run, const td__ui_request *req, td__ui_reply *rep) {
    int want_stats = 0;
    if (param_bool(req, rep, "stats", &want_stats)) return;
    json_t *o = td__ui_run_json(db, run, td__ui_default_keys, td__ui_ndefault_keys);
    json_object_set_new(o, "command", opt_text(run->command));
    json_object_set_new(o, "run_dir", opt_text(run->run_dir));
    /* What the script recorded through the Python SDK (RUN/sdk.json): {} when none. Only here,
     * not in the runs list and its events: an HF Trainer's config alone is 150 keys a run. */
    const char *const sdk_text[2] = {run->config_json, run->summary_json};
    static const char *const sdk_name[2] = {"config", "summary"};
    for (int i = 0; i < 2; i++) {
        json_t *v = sdk_text[i] ? json_loads(sdk_text[i], 0, NULL) : NULL;
        if (!json_is_object(v)) {
            json_decref(v);
            v = json_object();
        }
        json_object_set_new(o, sdk_name[i], v);
    }
    char *id_seg = td__ui_url_segment(run->id);
    /* keys: the per-rank summaries folded per key */
    td_metric_key_summary *sum = NULL;
    size_t nsum = 0;
    if (td_metrics_keys_summary(db, run->id, &sum, &nsum) != TD_OK) {
        json_decref(o);
        free(id_seg);
        store_error(rep);
        return;
    }
    json_t *keys = json_array();
    for (size_t i = 0; i < nsum;) {
        size_t j = i;
        json_t *ranks = json_array();
        int64_t count = 0, first_step = sum[i].first_step, last_step = sum[i].last_step;
        double first_time = sum[i].first_time, last_time = sum[i].last_time;
        for (; j < nsum && !strcmp(sum[j].key, sum[i].key); j++) {
            json_array_append_new(ranks, json_integer(sum[j].rank));
            count += sum[j].count;
            first_step = sum[j].first_step < first_step ? sum[j].first_step : first_step;
            last_step = sum[j].last_step > last_step ? sum[j].last_step : last_step;
            first_time = fmin(first_time, sum[j].first_time);
            last_time = fmax(last_time, sum[j].last_time);
        }
        json_array_append_new(
            keys,
            json_pack("{s:o,s:o,s:I,s:I,s:I,s:f,s:f}", "key", opt_text(sum[i].key), "ranks", ranks,
                      "count", (json_int_t)count, "first_step", (json_int_t)first_step, "last_step",
                      (json_int_t)last_step, "first_time", first_time, "last_time", last_time));
        i = j;
    }
    td_metric_key_summaries_free(sum, nsum);
    if (want_stats) keys_add_stats(db, run, keys);
    json_object_set_new(o, "keys", keys);
    int marks_partial = 0;
    json_object_set_new(o, "marks", td__ui_marks_json(db, run, &marks_partial));
    json_object_set_new(o, "marks_partial", json_boolean(marks_partial));
    td_artifact *arts = NULL;
    size_t narts = 0;
    json_t *aj = json_array();
    if (td_artifacts_list(db, run->id, &arts, &narts) == TD_OK) {
        for (size_t i = 0; i < narts; i++) {
            char *name_url = td__ui_url_segment(arts[i].name);
            char *url = td_xasprintf("/api/runs/%s/artifacts/%s", id_seg, name_url);
            json_array_append_new(aj, json_pack("{s:o,s:I,s:s,s:s}", "name", opt_text(arts[i].name),
                                                "size", (json_int_t)arts[i].size_bytes, "sha256",
                                                arts[i].sha256, "url", url));
            free(name_url);
            free(url);
        }
        td_artifacts_free(arts, narts);
    } else {
        td_error_clear();
    }
    json_object_set_new(o, "artifacts", aj);
    td__ui_log *logs = NULL;
    size_t nlogs = 0;
    td__ui_logs_list(run->run_dir, &logs, &nlogs);
    json_t *lj = json_array();
    for (size_t i = 0; i < nlogs; i++) {
        char *url = td_xasprintf("/api/runs/%s/logs/%s", id_seg, logs[i].label);
        json_array_append_new(lj,
                              json_pack("{s:o,s:s,s:I}", "rank", td__ui_log_label_json(&logs[i]),
                                        "url", url, "size", (json_int_t)logs[i].nbytes));
        free(url);
    }
    td__ui_logs_free(logs, nlogs);
    json_object_set_new(o, "logs", lj);
    json_object_set_new(o, "instances", instances_json(run));
    free(id_seg);
    td__ui_reply_json(rep, 200, o);
}

/* ---- GET /api/runs/{id}/series ---- */

static void get_series(td_rundb *db, const td_run *run, const td__ui_request *req,
                       td__ui_reply *rep) {
    td_series_query q = {0};
    q.key = td__ui_arg_get(req, "key");
    if (!q.key || !*q.key) {
        td__ui_reply_error(rep, 400,
                           "parameter key is required: the metric to chart, e.g. "
                           "?key=train/loss (GET /api/runs/%s lists the run's keys)",
                           run->id);
        return;
    }
    int64_t rank, width;
    int rank_given;
    const char *x = td__ui_arg_get(req, "x");
    if (x && strcmp(x, "step") && strcmp(x, "time")) {
        td__ui_reply_error(rep, 400, "parameter x must be 'step' or 'time', got '%.60s'", x);
        return;
    }
    q.x_time = x && !strcmp(x, "time");
    if (param_int(req, rep, "rank", -1, 0, INT_MAX, &rank, &rank_given) ||
        param_int(req, rep, "width", DEFAULT_WIDTH, 1, MAX_WIDTH, &width, NULL) ||
        param_double(req, rep, "from", &q.from, &q.has_from) ||
        param_double(req, rep, "to", &q.to, &q.has_to))
        return;
    if (q.has_from && q.has_to && q.from > q.to) {
        td__ui_reply_error(rep, 400, "from (%.17g) is after to (%.17g); ask for from <= to", q.from,
                           q.to);
        return;
    }
    q.rank = (int)rank;
    q.nbuckets = (int)width;
    td_series_result r;
    td_status st = td_metrics_series(db, run->id, &q, &r);
    if (st != TD_OK) {
        reply_status(rep, st);
        return;
    }
    td__ui_buf b = {0};
    td__ui_buf_str(&b, "{\"run\":");
    td__ui_buf_json(&b, opt_text(run->id));
    td__ui_buf_str(&b, ",\"key\":");
    td__ui_buf_json(&b, opt_text(q.key));
    td__ui_buf_str(&b, q.x_time ? ",\"x\":\"time\",\"from\":" : ",\"x\":\"step\",\"from\":");
    td__ui_buf_num(&b, r.from);
    td__ui_buf_str(&b, ",\"to\":");
    td__ui_buf_num(&b, r.to);
    char t[64];
    snprintf(t, sizeof t, ",\"width\":%d,\"total\":%lld,\"series\":[", q.nbuckets,
             (long long)r.total);
    td__ui_buf_str(&b, t);
    for (size_t i = 0; i < r.nseries; i++) {
        const td_metric_series *s = &r.series[i];
        snprintf(t, sizeof t, "%s{\"rank\":%d,\"n\":%lld,\"x\":[", i ? "," : "", s->rank,
                 (long long)s->count);
        td__ui_buf_str(&b, t);
        for (size_t k = 0; k < s->npoints; k++) {
            if (k) td__ui_buf_put(&b, ",", 1);
            td__ui_buf_num(&b, s->x[k]);
        }
        td__ui_buf_str(&b, "],\"y\":[");
        for (size_t k = 0; k < s->npoints; k++) {
            if (k) td__ui_buf_put(&b, ",", 1);
            td__ui_buf_num(&b, s->y[k]);
        }
        td__ui_buf_str(&b, "]}");
    }
    td__ui_buf_str(&b, "]}");
    td_series_result_clear(&r);
    rep->status = 200;
    rep->content_type = "application/json";
    rep->body = b.p;
    rep->nbytes = b.n;
}

/* ---- GET /api/runs/{id}/logs/{rank} ---- */

static void get_log(const td_run *run, const char *which, const td__ui_request *req,
                    td__ui_reply *rep) {
    td__ui_log *logs = NULL;
    size_t nlogs = 0;
    td__ui_logs_list(run->run_dir, &logs, &nlogs);
    const td__ui_log *log = NULL;
    for (size_t i = 0; i < nlogs && !log; i++)
        if (!strcmp(logs[i].label, which)) log = &logs[i];
    int64_t tail, offset, limit;
    int tail_given, offset_given, limit_given;
    char *text = NULL;
    int fd = -1;
    if (!log) {
        char list[512] = "";
        size_t used = 0;
        for (size_t i = 0; i < nlogs && used < sizeof list; i++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                                     logs[i].label);
        td__ui_reply_error(rep, 404, "run %s has no log '%s' (%s%s)", run->id, which,
                           nlogs ? "its logs: " : "it has written no log yet", list);
        goto out;
    }
    if (param_int(req, rep, "tail", DEFAULT_TAIL, 0, MAX_TAIL, &tail, &tail_given) ||
        param_int(req, rep, "offset", 0, 0, INT64_MAX, &offset, &offset_given) ||
        param_int(req, rep, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT, &limit, &limit_given))
        goto out;
    if (tail_given && (offset_given || limit_given)) {
        td__ui_reply_error(rep, 400,
                           "parameters tail and offset/limit exclude each other: ask for "
                           "the last lines (tail=N) or a byte range (offset=B&limit=L)");
        goto out;
    }
    fd = open(log->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        td__ui_reply_error(rep, 404, "log '%s' of run %s could not be opened: %s", which, run->id,
                           strerror(errno));
        goto out;
    }
    int64_t size = (int64_t)sb.st_size, start, end = size;
    if (offset_given || limit_given) {
        start = offset < size ? offset : size;
        end = start + limit < size ? start + limit : size;
        /* A cut inside a UTF-8 character goes back to its start; the next request begins
         * there. */
        if (end < size && end > start) {
            char tailb[4];
            size_t k = (size_t)(end - start < 4 ? end - start : 4);
            if (td__ui_pread_all(fd, tailb, k, end - (int64_t)k) == 0) {
                size_t back = 0;
                while (back < k && ((unsigned char)tailb[k - 1 - back] & 0xC0) == 0x80) back++;
                if (back < k) {
                    unsigned c = (unsigned char)tailb[k - 1 - back];
                    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
                    if (len > back + 1 && end - (int64_t)(back + 1) > start)
                        end -= (int64_t)(back + 1);
                }
            }
        }
    } else {
        /* The last `tail` lines: read back from the end until enough newlines are seen (a last
         * line without its newline yet counts as a line), at most TAIL_SCAN_BYTES. */
        int64_t lo = size > TAIL_SCAN_BYTES ? size - TAIL_SCAN_BYTES : 0;
        start = size;
        int64_t lines = 0;
        char chunk[65536];
        int64_t pos = size;
        int done = tail == 0;
        while (!done && pos > lo) {
            size_t k =
                (size_t)(pos - lo < (int64_t)sizeof chunk ? pos - lo : (int64_t)sizeof chunk);
            pos -= (int64_t)k;
            if (td__ui_pread_all(fd, chunk, k, pos) != 0) break;
            for (size_t i = k; i-- > 0;) {
                if (chunk[i] != '\n' || pos + (int64_t)i == size - 1) continue;
                if (++lines == tail) {
                    start = pos + (int64_t)i + 1;
                    done = 1;
                    break;
                }
            }
        }
        if (!done) {
            start = lo;
            if (lo > 0) { /* whole lines only: skip the cut one */
                int64_t p = lo;
                char c;
                while (p < size && td__ui_pread_all(fd, &c, 1, p) == 0 && c != '\n') p++;
                start = p < size ? p + 1 : size;
            }
        }
        offset = start;
    }
    size_t n = (size_t)(end - start);
    text = td_xmalloc(n + 1);
    if (n && td__ui_pread_all(fd, text, n, start) != 0) {
        td__ui_reply_error(rep, 500, "reading log '%s' of run %s: %s", which, run->id,
                           strerror(errno));
        goto out;
    }
    json_t *o = json_object();
    json_object_set_new(o, "rank", td__ui_log_label_json(log));
    json_object_set_new(o, "offset", json_integer(start));
    json_object_set_new(o, "end", json_integer(end));
    json_object_set_new(o, "size", json_integer(size));
    json_object_set_new(o, "text", td__ui_json_text(text, n));
    td__ui_reply_json(rep, 200, o);
out:
    if (fd >= 0) close(fd);
    free(text);
    td__ui_logs_free(logs, nlogs);
}

/* ---- GET /api/runs/{id}/artifacts/{name} ---- */

/* Content-Disposition for a file name: an ASCII fallback and the exact UTF-8 name. */
static char *disposition(const char *name) {
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    char *ascii = td_xstrdup(*base ? base : "artifact");
    for (char *p = ascii; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f || *p == '"' || *p == '\\')
            *p = '_';
    char *enc = td__ui_url_segment(*base ? base : "artifact");
    char *d = td_xasprintf("attachment; filename=\"%s\"; filename*=UTF-8''%s", ascii, enc);
    free(ascii);
    free(enc);
    return d;
}

static const char why_link[] = "is a symbolic link, which could lead anywhere",
                  why_outside[] = "is outside the run's artifacts directory";

/* Opens the stored copy path of an artifact of the run in run_dir, which must be
 * run_dir/artifacts/<rel> as the store wrote it: run_dir is opened, then "artifacts" and each
 * component of rel, one openat(O_NOFOLLOW) at a time from the one before, so a symbolic link
 * anywhere below the run directory (artifacts/ itself, a folder, the file) is refused, not
 * followed, and "..", "." or an empty component is refused before any lookup. Comparing
 * realpath()s cannot do this: the realpath of a symlinked artifacts/ is wherever the link
 * points, and everything there would pass as inside it. The fd (O_RDONLY), or -1 with *why (a
 * static text: why_link, why_outside or another) and *where (the component at fault, owned). */
static int open_stored(const char *run_dir, const char *path, const char **why, char **where) {
    *why = "is gone (no run directory)";
    *where = NULL;
    if (!run_dir) return -1;
    const char *art = td_run_path_name(TD_RUN_PATH_ARTIFACTS);
    size_t nd = strlen(run_dir), na = strlen(art);
    if (strncmp(path, run_dir, nd) || path[nd] != '/' || strncmp(path + nd + 1, art, na) ||
        path[nd + 1 + na] != '/') {
        *why = why_outside;
        *where = td_xstrdup(path);
        return -1;
    }
    /* The run directory's own last component too: the store made a directory there. */
    int dir = open(run_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (dir < 0) {
        *why = errno == ELOOP || errno == ENOTDIR ? why_link : "is gone (its run directory is)";
        *where = td_xstrdup(run_dir);
        return -1;
    }
    const char *p = path + nd + 1; /* "artifacts/<rel>" */
    for (;;) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        char *comp = td_xasprintf("%.*s", (int)len, p);
        size_t upto = (size_t)(p - path) + len;
        if (!len || !strcmp(comp, ".") || !strcmp(comp, "..")) {
            *why = why_outside;
            *where = td_xasprintf("%.*s", (int)upto, path);
            free(comp);
            close(dir);
            return -1;
        }
        /* O_NONBLOCK: opening a FIFO put there must not hang this thread; the caller checks
         * that the end is a regular file. */
        int fd = openat(dir, comp,
                        O_RDONLY | O_CLOEXEC | O_NOFOLLOW | (slash ? O_DIRECTORY : O_NONBLOCK));
        int err = errno;
        struct stat lsb;
        int is_link =
            fd < 0 && fstatat(dir, comp, &lsb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lsb.st_mode);
        free(comp);
        close(dir);
        if (fd < 0) {
            *why = is_link || err == ELOOP ? why_link
                   : err == ENOENT         ? "is gone"
                   : err == ENOTDIR        ? "is not a directory"
                                           : "cannot be opened";
            *where = td_xasprintf("%.*s", (int)upto, path);
            return -1;
        }
        if (!slash) return fd;
        dir = fd;
        p = slash + 1;
    }
}

static void get_artifact(td_rundb *db, const td_run *run, const char *name, td__ui_reply *rep) {
    td_artifact *arts = NULL;
    size_t n = 0;
    if (td_artifacts_list(db, run->id, &arts, &n) != TD_OK) {
        store_error(rep);
        return;
    }
    const td_artifact *a = NULL;
    for (size_t i = 0; i < n && !a; i++)
        if (!strcmp(arts[i].name, name)) a = &arts[i];
    if (!a) {
        td__ui_reply_error(rep, 404,
                           "run %s has no artifact named '%s'; GET /api/runs/%s lists its "
                           "artifacts",
                           run->id, name, run->id);
        td_artifacts_free(arts, n);
        return;
    }
    /* The stored copy lives under <run_dir>/artifacts/ (the store put it there); open it only
     * through that directory, following no link (open_stored). */
    char *where = NULL;
    const char *why = NULL;
    int fd = open_stored(run->run_dir, a->path, &why, &where);
    struct stat sb;
    if (fd >= 0 && (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))) {
        close(fd);
        fd = -1;
        why = "is not a regular file";
        where = td_xstrdup(a->path);
    }
    if (fd < 0) {
        /* A link or a way out is refused (403), not missing: say what would be served. */
        const char *fix =
            why == why_link      ? ": tandem ui follows no symbolic link under a run's directory; "
                                   "put the file itself in place of the link"
            : why == why_outside ? ": tandem ui serves only files stored under the run's "
                                   "artifacts directory (RUN/artifacts/NAME, without '..')"
                                 : "";
        td__ui_reply_error(rep, *fix ? 403 : 404,
                           "artifact '%s' of run %s is registered but %s %s%s", name, run->id,
                           where ? where : a->path, why, fix);
    } else {
        rep->status = 200;
        rep->fd = fd;
        rep->fd_nbytes = (int64_t)sb.st_size;
        rep->disposition = disposition(a->name);
    }
    free(where);
    td_artifacts_free(arts, n);
}

/* ---- POST /api/runs/{id}/stop ---- */

static void post_stop(td_ui *ui, const td_run *run, td__ui_reply *rep) {
    if (td_run_status_is_final(run->status)) {
        td__ui_reply_error(rep, 409, "run %s already ended (%s)", run->id,
                           td_run_status_str(run->status));
        return;
    }
    /* What `tandem stop` does, without waiting: the status changes reach the page through its
     * event stream. */
    td_run after = {0};
    pthread_mutex_lock(&ui->writer_lock);
    td_status st = td_run_stop(ui->writer, run->id, 0, &after);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", st == TD_OK ? "" : td_error_msg());
    td_error_clear();
    /* A run whose supervisor is gone may have left a cluster job behind (tandem stop does the
     * same). */
    char what[512] = "";
    td_run cur = {0};
    if ((st == TD_OK || st == TD_ERR_INVALID) && td_run_find(ui->writer, run->id, &cur) == TD_OK &&
        td_run_status_is_final(cur.status) && td_executor_of_run(&cur)) {
        int cancelled = 0;
        if (td_executor_of_run(&cur)->cancel_orphan(&cur, &cancelled, what, sizeof what) != TD_OK ||
            !cancelled)
            what[0] = '\0';
        td_error_clear();
    }
    td_error_clear();
    pthread_mutex_unlock(&ui->writer_lock);
    if (st != TD_OK && !*what) {
        td__ui_reply_error(rep, st == TD_ERR_INVALID ? 409 : 500, "%s", msg);
    } else {
        const td_run *r = st == TD_OK ? &after : &cur;
        json_t *o = json_pack("{s:s,s:s,s:b}", "id", run->id, "status",
                              td_run_status_str(r->status), "requested", 1);
        if (*what) json_object_set_new(o, "note", td__ui_json_text(what, strlen(what)));
        td__ui_reply_json(rep, 200, o);
    }
    td_run_clear(&after);
    td_run_clear(&cur);
}

/* ---- events ---- */

static void get_run_events(td_ui *ui, td_rundb *db, const td_run *run, const td__ui_request *req,
                           td__ui_reply *rep) {
    int64_t since;
    int given;
    if (param_int(req, rep, "since", 0, 0, INT64_MAX, &since, &given)) return;
    if (!given && req->last_event_id) {
        /* An EventSource reconnecting: the id of the last points event it got. */
        char *end = NULL;
        errno = 0;
        long long v = strtoll(req->last_event_id, &end, 10);
        if (*req->last_event_id && !*end && errno == 0 && v >= 0) {
            since = v;
            given = 1;
        }
    }
    rep->stream = td__ui_stream_run(ui->events, db, run, since, given);
    if (!rep->stream) {
        store_error(rep);
        return;
    }
    rep->status = 200;
}

static void get_events(td_ui *ui, td_rundb *db, const td__ui_request *req, td__ui_reply *rep) {
    const char *keys[MAX_KEYS];
    size_t nkeys;
    char *buf = NULL;
    if (param_keys(req, rep, &buf, keys, &nkeys)) return;
    rep->stream = td__ui_stream_runs(ui->events, db, keys, nkeys);
    free(buf);
    if (!rep->stream) {
        store_error(rep);
        return;
    }
    rep->status = 200;
}

/* ---- routing ---- */

static int method_is(const td__ui_request *req, const char *m, td__ui_reply *rep,
                     const char *path) {
    int get = !strcmp(req->method, "GET") || !strcmp(req->method, "HEAD");
    if (!strcmp(m, "GET") ? get : !strcmp(req->method, m)) return 1;
    rep->allow = !strcmp(m, "GET") ? "GET, HEAD" : m;
    td__ui_reply_error(rep, 405, "%s takes %s, not %s", path, m, req->method);
    return 0;
}

void td__ui_api(td_ui *ui, const td__ui_request *req, td__ui_reply *rep) {
    char *const *s = req->segs;
    size_t n = req->nsegs;
    td_rundb *db = td__ui_db_acquire(ui);
    td_run run = {0};
    int have_run = 0;
    if (!db) {
        store_error(rep);
        return;
    }
    if (n == 2 && !strcmp(s[1], "runs")) {
        if (method_is(req, "GET", rep, "/api/runs")) get_runs(db, req, rep);
    } else if (n == 2 && !strcmp(s[1], "events")) {
        if (method_is(req, "GET", rep, "/api/events")) get_events(ui, db, req, rep);
    } else if (n >= 3 && !strcmp(s[1], "runs") && *s[2]) {
        if (find_run(db, s[2], rep, &run)) goto out;
        have_run = 1;
        const char *what = n >= 4 ? s[3] : NULL;
        if (n == 3) {
            if (method_is(req, "GET", rep, "/api/runs/{id}")) get_run(db, &run, req, rep);
        } else if (n == 4 && !strcmp(what, "series")) {
            if (method_is(req, "GET", rep, "/api/runs/{id}/series")) get_series(db, &run, req, rep);
        } else if (n == 5 && !strcmp(what, "logs")) {
            if (method_is(req, "GET", rep, "/api/runs/{id}/logs/{rank}"))
                get_log(&run, s[4], req, rep);
        } else if (n >= 5 && !strcmp(what, "artifacts")) {
            /* The name may hold '/' (out/model.bin): the rest of the path, each segment decoded,
             * joined again; it must then equal a registered name exactly. */
            size_t len = 0;
            for (size_t i = 4; i < n; i++) len += strlen(s[i]) + 1;
            char *name = td_xmalloc(len + 1);
            name[0] = '\0';
            for (size_t i = 4; i < n; i++) {
                if (i > 4) strcat(name, "/");
                strcat(name, s[i]);
            }
            if (method_is(req, "GET", rep, "/api/runs/{id}/artifacts/{name}"))
                get_artifact(db, &run, name, rep);
            free(name);
        } else if (n == 4 && !strcmp(what, "stop")) {
            if (method_is(req, "POST", rep, "/api/runs/{id}/stop")) post_stop(ui, &run, rep);
        } else if (n == 4 && !strcmp(what, "events")) {
            if (method_is(req, "GET", rep, "/api/runs/{id}/events"))
                get_run_events(ui, db, &run, req, rep);
        } else {
            td__ui_reply_error(rep, 404,
                               "no endpoint /api/runs/{id}/%s; a run has series, logs/{rank}, "
                               "artifacts/{name}, events and stop (docs/ui-api.md)",
                               what);
        }
    } else {
        td__ui_reply_error(rep, 404,
                           "no endpoint at this path; the API has /api/runs, /api/runs/{id}[/...] "
                           "and /api/events (docs/ui-api.md)");
    }
out:
    if (have_run) td_run_clear(&run);
    td__ui_db_release(ui, db);
}
