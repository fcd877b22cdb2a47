/* The runs table's own columns, as tandem ps and the ui's runs table show them: a run's config
 * flattened into fields (its params and what the script recorded), the --filter expressions over
 * them, the sort order of two values, the "silent" state, and the metric keys most of the listed
 * runs share (the ui's default columns).
 *
 * Apart from the metrics queries (query.c) because none of this reads a run's points: fields and
 * filters are pure functions of one run's row, the silent state reads what the row carries of
 * when a worker last wrote (worker_activity_s: run_activity, kept by the ingest), so listing a
 * thousand runs opens no run's files, and the common keys probe key names only. */
#include "store_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The shortest decimal that reads back as v (0.2, not 0.20000000000000001). */
static char *number_text(double v) {
    char buf[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    return td_xstrdup(buf);
}

typedef struct {
    td_run_field *items;
    size_t n, cap;
} field_list;

static const td_run_field *field_find(const field_list *l, const char *key) {
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(l->items[i].key, key)) return &l->items[i];
    return NULL;
}

static void field_add(field_list *l, const char *key, json_t *v, int from_params) {
    if (l->n >= TD_RUN_FIELDS_MAX || field_find(l, key)) return;
    td_run_field f = {0};
    if (json_is_number(v)) {
        f.is_number = 1;
        f.number = json_number_value(v);
        f.text = number_text(f.number);
    } else if (json_is_boolean(v)) {
        f.is_number = 1;
        f.number = json_is_true(v);
        f.text = td_xstrdup(json_is_true(v) ? "true" : "false");
    } else if (json_is_string(v) && json_string_length(v) <= TD_RUN_FIELD_TEXT_MAX &&
               !memchr(json_string_value(v), 0, json_string_length(v))) {
        f.text = td_xstrdup(json_string_value(v));
    } else {
        return; /* a list, a null, a long text: on the run's page */
    }
    f.key = td_xstrdup(key);
    f.from_params = from_params;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->items = td_xrealloc(l->items, l->cap * sizeof *l->items);
    }
    l->items[l->n++] = f;
}

/* The scalars of obj under prefix, nested objects flattened with '.' (at most 8 deep). */
static void fields_of(field_list *l, json_t *obj, const char *prefix, int from_params, int depth) {
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        char *key = *prefix ? td_xasprintf("%s.%s", prefix, k) : td_xstrdup(k);
        if (json_is_object(v)) {
            if (depth < 8) fields_of(l, v, key, from_params, depth + 1);
        } else {
            field_add(l, key, v, from_params);
        }
        free(key);
    }
}

static int cmp_field(const void *a, const void *b) {
    return strcmp(((const td_run_field *)a)->key, ((const td_run_field *)b)->key);
}

void td_run_fields(const td_run *run, td_run_field **out, size_t *count) {
    field_list l = {0};
    /* Params first: a param and a config key of one name keep the param. */
    const char *texts[2] = {run->params_json, run->config_json};
    for (int i = 0; i < 2; i++) {
        json_t *o = texts[i] ? json_loads(texts[i], JSON_DECODE_ANY, NULL) : NULL;
        if (json_is_object(o)) fields_of(&l, o, "", i == 0, 0);
        json_decref(o);
    }
    if (l.n > 1) qsort(l.items, l.n, sizeof *l.items, cmp_field);
    *out = l.items;
    *count = l.n;
}

void td_run_fields_free(td_run_field *fields, size_t count) {
    for (size_t i = 0; i < count; i++) {
        free(fields[i].key);
        free(fields[i].text);
    }
    free(fields);
}

const td_run_field *td_run_field_find(const td_run_field *fields, size_t count, const char *key) {
    size_t lo = 0, hi = count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(fields[mid].key, key);
        if (!c) return &fields[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

td_status td_run_filter_parse(const char *expr, td_run_filter *out) {
    memset(out, 0, sizeof *out);
    static const struct {
        const char *text;
        td_filter_op op;
    } ops[] = {{"!=", TD_FILTER_NE}, {">=", TD_FILTER_GE}, {"<=", TD_FILTER_LE},
               {"=", TD_FILTER_EQ},  {">", TD_FILTER_GT},  {"<", TD_FILTER_LT}};
    /* The first operator character splits key and value (a key holds none of them). */
    size_t at = strcspn(expr, "=!<>");
    const char *rest = expr + at;
    size_t oplen = 0;
    for (size_t i = 0; i < TD_ARRAY_LEN(ops) && !oplen; i++)
        if (!strncmp(rest, ops[i].text, strlen(ops[i].text))) {
            out->op = ops[i].op;
            oplen = strlen(ops[i].text);
        }
    if (!*rest || !oplen || at == 0)
        return td_error(TD_ERR_INVALID,
                        "filter '%s': expected KEY=VALUE, KEY!=VALUE, KEY<N, KEY<=N, KEY>N or "
                        "KEY>=N with KEY a param or config key (tandem show RUN lists them), "
                        "e.g. lr=0.001 or epochs>=10",
                        expr);
    const char *value = rest + oplen;
    char *end = NULL;
    double num = strtod(value, &end);
    out->is_number = *value && !*end && isfinite(num);
    out->number = num;
    if (!out->is_number && out->op != TD_FILTER_EQ && out->op != TD_FILTER_NE)
        return td_error(TD_ERR_INVALID,
                        "filter '%s': %.*s compares numbers, and '%s' is not one; use = or != "
                        "for text",
                        expr, (int)oplen, rest, value);
    out->key = td_xasprintf("%.*s", (int)at, expr);
    out->text = td_xstrdup(value);
    return TD_OK;
}

void td_run_filter_clear(td_run_filter *f) {
    free(f->key);
    free(f->text);
    memset(f, 0, sizeof *f);
}

/* Equal as numbers: within a relative 1e-6 (a float32 value printed with 9 digits). */
static int numbers_equal(double a, double b) {
    return a == b || fabs(a - b) <= 1e-6 * fmax(fabs(a), fabs(b));
}

int td_run_filter_match(const td_run_filter *f, const td_run_field *fields, size_t count) {
    const td_run_field *v = td_run_field_find(fields, count, f->key);
    if (!v) return 0;
    if (f->op == TD_FILTER_EQ || f->op == TD_FILTER_NE) {
        int eq = f->is_number && v->is_number ? numbers_equal(v->number, f->number)
                                              : !strcmp(v->text, f->text);
        return f->op == TD_FILTER_EQ ? eq : !eq;
    }
    if (!v->is_number) return 0;
    switch (f->op) {
    case TD_FILTER_LT: return v->number < f->number && !numbers_equal(v->number, f->number);
    case TD_FILTER_LE: return v->number <= f->number || numbers_equal(v->number, f->number);
    case TD_FILTER_GT: return v->number > f->number && !numbers_equal(v->number, f->number);
    case TD_FILTER_GE: return v->number >= f->number || numbers_equal(v->number, f->number);
    default: return 0;
    }
}

int td_run_field_cmp(const td_run_field *a, const td_run_field *b) {
    if (!a || !b) return (a == NULL) - (b == NULL);
    if (a->is_number != b->is_number) return a->is_number ? -1 : 1;
    if (a->is_number) return (a->number > b->number) - (a->number < b->number);
    return strcmp(a->text, b->text);
}

double td_run_last_activity(const td_run *run) {
    if (run->started_s <= 0) return 0;
    return fmax(run->started_s, run->worker_activity_s);
}

int64_t td_run_silent_s(const td_run *run, double now) {
    int64_t after = td_env_int(TD_ENV_SILENT_S);
    if (after <= 0 || td_run_status_is_final(run->status) || run->started_s <= 0) return 0;
    int64_t quiet = (int64_t)(now - td_run_last_activity(run));
    return quiet >= after ? quiet : 0;
}

td_status td_metrics_common_keys(td_rundb *store, const char *const *run_ids, size_t nruns,
                                 size_t max_per_run, char ***keys, int64_t **nruns_with,
                                 size_t *count) {
    *keys = NULL;
    *nruns_with = NULL;
    *count = 0;
    TD_CHECK(td__rundb_ensure(store));
    sqlite3_stmt *next = NULL, *name = NULL;
    int64_t *ids = NULL, *counts = NULL;
    size_t n = 0, cap = 0;
    td_status st = td__rundb_read_begin(store);
    if (st != TD_OK) return st;
    TD_CHECK_GOTO(td__rundb_prepare(store,
                                    "SELECT key FROM metrics WHERE run = ?1 AND key > ?2"
                                    " ORDER BY key LIMIT 1",
                                    &next),
                  st, out);
    for (size_t r = 0; r < nruns; r++) {
        int64_t seq;
        if (td__run_seq(store, run_ids[r], &seq) != TD_OK) {
            td_error_clear(); /* removed meanwhile */
            continue;
        }
        int64_t after = INT64_MIN;
        for (size_t got = 0; got < max_per_run; got++) {
            sqlite3_reset(next);
            sqlite3_bind_int64(next, 1, seq);
            sqlite3_bind_int64(next, 2, after);
            int rc = sqlite3_step(next);
            if (rc == SQLITE_DONE) break;
            if (rc != SQLITE_ROW) {
                st = td__rundb_err(store, "list a run's metric keys");
                goto out;
            }
            after = sqlite3_column_int64(next, 0);
            size_t i = 0;
            while (i < n && ids[i] != after) i++;
            if (i == n) {
                if (n == cap) {
                    cap = cap ? 2 * cap : 32;
                    ids = td_xrealloc(ids, cap * sizeof *ids);
                    counts = td_xrealloc(counts, cap * sizeof *counts);
                }
                ids[n] = after;
                counts[n++] = 0;
            }
            counts[i]++;
        }
    }
    sqlite3_reset(next);
    TD_CHECK_GOTO(td__rundb_prepare(store, "SELECT name FROM metric_keys WHERE id = ?1", &name), st,
                  out);
    *keys = td_xcalloc(n ? n : 1, sizeof **keys);
    *nruns_with = td_xcalloc(n ? n : 1, sizeof **nruns_with);
    for (size_t i = 0; i < n; i++) {
        sqlite3_reset(name);
        sqlite3_bind_int64(name, 1, ids[i]);
        if (sqlite3_step(name) != SQLITE_ROW) continue;
        (*keys)[*count] = td_xstrdup((const char *)sqlite3_column_text(name, 0));
        (*nruns_with)[(*count)++] = counts[i];
    }
    /* Most runs first, then by name: an insertion sort (a few hundred keys at most per run). */
    for (size_t i = 1; i < *count; i++)
        for (size_t j = i; j > 0; j--) {
            int64_t a = (*nruns_with)[j - 1], b = (*nruns_with)[j];
            if (a > b || (a == b && strcmp((*keys)[j - 1], (*keys)[j]) <= 0)) break;
            char *tk = (*keys)[j - 1];
            (*keys)[j - 1] = (*keys)[j];
            (*keys)[j] = tk;
            (*nruns_with)[j - 1] = b;
            (*nruns_with)[j] = a;
        }
out:
    sqlite3_finalize(next);
    sqlite3_finalize(name);
    td__rundb_read_end(store);
    free(ids);
    free(counts);
    if (st != TD_OK) {
        td_metrics_keys_free(*keys, *count);
        free(*nruns_with);
        *keys = NULL;
        *nruns_with = NULL;
        *count = 0;
    }
    return st;
}
