/* Dashboard queries: what `tandem ui` reads from the run store.
 *
 * The page asks for a million-point run's charts, and the run may still be training: every
 * query here is shaped for an index, touches only the rows it needs and keeps its read
 * transaction short. In WAL mode a reader never blocks the ingesting writer; a long one would
 * only hold back checkpoints.
 *
 * Distinct (key, rank) pairs are found by skipping through the (run, key, rank, step) index
 * (one lookup per pair, not one per row), and min/max of step or time come from the end of an
 * index range. Downsampling streams a rank's rows in index order and keeps, per bucket, the
 * first, lowest, highest and last point: no extreme is lost and the answer is deterministic. */
#include "store_internal.h"

#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

td_status td_rundb_open_reader(const td_rundb *store, td_rundb **out) {
    *out = NULL;
    td_rundb *s = td_xcalloc(1, sizeof *s);
    s->project_dir = td_xstrdup(store->project_dir);
    s->dir = td_xstrdup(store->dir);
    s->db_path = td_xstrdup(store->db_path);
    /* Read-only: nothing this connection runs can take the write lock from the supervisor.
     * The -wal and -shm files exist while `store` is open, which a read-only WAL reader needs. */
    if (sqlite3_open_v2(s->db_path, &s->db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        td_status st = td__rundb_err(s, "open read-only");
        td_rundb_close(s);
        return st;
    }
    sqlite3_busy_timeout(s->db, 5000);
    struct stat sb;
    if (stat(s->db_path, &sb) == 0) {
        s->db_dev = sb.st_dev;
        s->db_ino = sb.st_ino;
    }
    *out = s;
    return TD_OK;
}

td_status td_rundb_data_version(td_rundb *store, int64_t *out) {
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_ensure(store));
    TD_CHECK(td__rundb_prepare(store, "PRAGMA data_version", &q));
    td_status st = td__rundb_step(store, q, "read data_version");
    if (st == TD_OK) *out = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    return st;
}

void td_metrics_keys_free(char **keys, size_t count) {
    for (size_t i = 0; i < count; i++) free(keys[i]);
    free(keys);
}

td_status td_metrics_all_keys(td_rundb *store, char ***out, size_t *count) {
    *out = NULL;
    *count = 0;
    TD_CHECK(td__rundb_ensure(store));
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(store, "SELECT name FROM metric_keys ORDER BY name", &q));
    size_t cap = 0;
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (*count == cap) {
            cap = cap ? 2 * cap : 32;
            *out = td_xrealloc(*out, cap * sizeof **out);
        }
        (*out)[(*count)++] = td_xstrdup((const char *)sqlite3_column_text(q, 0));
    }
    td_status st = TD_OK;
    if (rc != SQLITE_DONE) {
        st = td__rundb_err(store, "list metric keys");
        td_metrics_keys_free(*out, *count);
        *out = NULL;
        *count = 0;
    }
    sqlite3_finalize(q);
    return st;
}

/* The id of a key name; *found = 0 when no run ever recorded it. */
static td_status key_id(td_rundb *store, const char *name, int64_t *id, int *found) {
    sqlite3_stmt *q = NULL;
    *found = 0;
    TD_CHECK(td__rundb_prepare(store, "SELECT id FROM metric_keys WHERE name = ?", &q));
    sqlite3_bind_text(q, 1, name, -1, SQLITE_STATIC);
    td_status st = td__rundb_step(store, q, "look up a metric key");
    if (st == TD_OK && sqlite3_data_count(q) > 0) {
        *id = sqlite3_column_int64(q, 0);
        *found = 1;
    }
    sqlite3_finalize(q);
    return st;
}

/* The read transactions below (td__rundb_read_begin) give each answer one snapshot: a series'
 * ranks and its range agree. */
/* The ranks that have a key in a run, ascending: one index probe per rank. *cache: the statement,
 * prepared at the first call and kept by the caller (who finalizes it): preparing it for each of
 * 100,000 keys costs more than the probes. */
static td_status key_ranks(td_rundb *store, sqlite3_stmt **cache, int64_t seq, int64_t key,
                           int **ranks, size_t *n) {
    *ranks = NULL;
    *n = 0;
    if (!*cache)
        TD_CHECK(
            td__rundb_prepare(store,
                              "SELECT rank FROM metrics WHERE run = ?1 AND key = ?2 AND rank > ?3"
                              " ORDER BY rank LIMIT 1",
                              cache));
    sqlite3_stmt *q = *cache;
    td_status st = TD_OK;
    size_t cap = 0;
    int64_t after = INT64_MIN;
    for (;;) {
        sqlite3_reset(q);
        sqlite3_bind_int64(q, 1, seq);
        sqlite3_bind_int64(q, 2, key);
        sqlite3_bind_int64(q, 3, after);
        int rc = sqlite3_step(q);
        if (rc == SQLITE_DONE) break;
        if (rc != SQLITE_ROW) {
            st = td__rundb_err(store, "list a metric's ranks");
            break;
        }
        int r = sqlite3_column_int(q, 0);
        if (*n == cap) {
            cap = cap ? 2 * cap : 8;
            *ranks = td_xrealloc(*ranks, cap * sizeof **ranks);
        }
        (*ranks)[(*n)++] = r;
        after = r;
    }
    sqlite3_reset(q);
    if (st != TD_OK) {
        free(*ranks);
        *ranks = NULL;
        *n = 0;
    }
    return st;
}

/* min or max of a column over one (run, key, rank): SQLite reads it off the end of the index
 * whose last column it is. */
static td_status rank_extreme(td_rundb *store, sqlite3_stmt **cache, const char *sql, int64_t seq,
                              int64_t key, int rank, double *out, int64_t *iout) {
    if (!*cache) TD_CHECK(td__rundb_prepare(store, sql, cache));
    sqlite3_stmt *q = *cache;
    sqlite3_reset(q);
    sqlite3_bind_int64(q, 1, seq);
    sqlite3_bind_int64(q, 2, key);
    sqlite3_bind_int(q, 3, rank);
    td_status st = td__rundb_step(store, q, "read a metric's range");
    if (st == TD_OK && out) *out = sqlite3_column_double(q, 0);
    if (st == TD_OK && iout) *iout = sqlite3_column_int64(q, 0);
    sqlite3_reset(q);
    return st;
}

void td_metric_key_summaries_free(td_metric_key_summary *s, size_t count) {
    for (size_t i = 0; i < count; i++) free(s[i].key);
    free(s);
}

static int cmp_summary(const void *a, const void *b) {
    const td_metric_key_summary *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    if (c) return c;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

td_status td_metrics_keys_summary(td_rundb *store, const char *run_id, td_metric_key_summary **out,
                                  size_t *count) {
    *out = NULL;
    *count = 0;
    int64_t seq;
    TD_CHECK(td__rundb_ensure(store));
    TD_CHECK(td__run_seq(store, run_id, &seq));
    td_status st = TD_OK;
    sqlite3_stmt *next = NULL, *agg = NULL, *name = NULL, *ranks_q = NULL, *ext[4] = {0};
    size_t cap = 0, nranks = 0, ri = 0;
    int64_t k = INT64_MIN;
    int *ranks = NULL;
    TD_CHECK(td__rundb_read_begin(store));
    /* (key, rank) pairs by skipping through the index: one probe per key and one per rank (a
     * row-value probe, (key, rank) > (?, ?), would walk the previous pair's rows). */
    TD_CHECK_GOTO(td__rundb_prepare(store,
                                    "SELECT key FROM metrics WHERE run = ?1 AND key > ?2"
                                    " ORDER BY key LIMIT 1",
                                    &next),
                  st, out);
    TD_CHECK_GOTO(td__rundb_prepare(store,
                                    "SELECT count(*) FROM metrics"
                                    " WHERE run = ?1 AND key = ?2 AND rank = ?3",
                                    &agg),
                  st, out);
    TD_CHECK_GOTO(td__rundb_prepare(store, "SELECT name FROM metric_keys WHERE id = ?", &name), st,
                  out);
    for (;;) {
        if (ri == nranks) { /* the next key and its ranks */
            sqlite3_reset(next);
            sqlite3_bind_int64(next, 1, seq);
            sqlite3_bind_int64(next, 2, k);
            int rc = sqlite3_step(next);
            if (rc == SQLITE_DONE) break;
            if (rc != SQLITE_ROW) {
                st = td__rundb_err(store, "list a run's metric keys");
                goto out;
            }
            k = sqlite3_column_int64(next, 0);
            free(ranks);
            ranks = NULL;
            ri = 0;
            TD_CHECK_GOTO(key_ranks(store, &ranks_q, seq, k, &ranks, &nranks), st, out);
            if (!nranks) continue;
        }
        int64_t r = ranks[ri++];
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            *out = td_xrealloc(*out, cap * sizeof **out);
        }
        td_metric_key_summary *s = &(*out)[*count];
        memset(s, 0, sizeof *s);
        s->rank = (int)r;
        sqlite3_reset(name);
        sqlite3_bind_int64(name, 1, k);
        if (sqlite3_step(name) != SQLITE_ROW) {
            st = td__rundb_err(store, "name a metric key");
            goto out;
        }
        s->key = td_xstrdup((const char *)sqlite3_column_text(name, 0));
        (*count)++;
        sqlite3_reset(agg);
        sqlite3_bind_int64(agg, 1, seq);
        sqlite3_bind_int64(agg, 2, k);
        sqlite3_bind_int64(agg, 3, r);
        if (sqlite3_step(agg) != SQLITE_ROW) {
            st = td__rundb_err(store, "count a metric's points");
            goto out;
        }
        s->count = sqlite3_column_int64(agg, 0);
        /* Each extreme alone, read off the index; together with count() they would be
         * computed row by row. */
        TD_CHECK_GOTO(rank_extreme(store, &ext[0],
                                   "SELECT min(step) FROM metrics"
                                   " WHERE run = ?1 AND key = ?2 AND rank = ?3",
                                   seq, k, (int)r, NULL, &s->first_step),
                      st, out);
        TD_CHECK_GOTO(rank_extreme(store, &ext[1],
                                   "SELECT max(step) FROM metrics"
                                   " WHERE run = ?1 AND key = ?2 AND rank = ?3",
                                   seq, k, (int)r, NULL, &s->last_step),
                      st, out);
        TD_CHECK_GOTO(rank_extreme(store, &ext[2],
                                   "SELECT min(time) FROM metrics"
                                   " WHERE run = ?1 AND key = ?2 AND rank = ?3",
                                   seq, k, (int)r, &s->first_time, NULL),
                      st, out);
        TD_CHECK_GOTO(rank_extreme(store, &ext[3],
                                   "SELECT max(time) FROM metrics"
                                   " WHERE run = ?1 AND key = ?2 AND rank = ?3",
                                   seq, k, (int)r, &s->last_time, NULL),
                      st, out);
    }
out:
    free(ranks);
    sqlite3_finalize(next);
    sqlite3_finalize(agg);
    sqlite3_finalize(name);
    sqlite3_finalize(ranks_q);
    for (int e = 0; e < 4; e++) sqlite3_finalize(ext[e]);
    td__rundb_read_end(store);
    if (st != TD_OK) {
        td_metric_key_summaries_free(*out, *count);
        *out = NULL;
        *count = 0;
    } else if (*count > 1) {
        qsort(*out, *count, sizeof **out, cmp_summary); /* by name: ids are in first-use order */
    }
    return st;
}

td_status td_metrics_stats(td_rundb *store, const char *run_id, const char *const *keys,
                           size_t nkeys, td_metric_stats *out) {
    int64_t seq;
    memset(out, 0, nkeys * sizeof *out);
    TD_CHECK(td__rundb_ensure(store));
    TD_CHECK(td__run_seq(store, run_id, &seq));
    td_status st = TD_OK;
    sqlite3_stmt *low = NULL, *last = NULL, *min = NULL, *max = NULL;
    TD_CHECK(td__rundb_read_begin(store));
    TD_CHECK_GOTO(td__rundb_prepare(store,
                                    "SELECT rank FROM metrics WHERE run = ?1 AND key = ?2"
                                    " ORDER BY rank LIMIT 1",
                                    &low),
                  st, out);
    TD_CHECK_GOTO(td__rundb_prepare(store,
                                    "SELECT step, value FROM metrics WHERE run = ?1 AND key = ?2"
                                    " AND rank = ?3 ORDER BY step DESC, rowid DESC LIMIT 1",
                                    &last),
                  st, out);
    /* Two statements: SQLite reads a lone min() or max() off the end of the (run, key, value)
     * index, while min() and max() together would scan every point of the key. */
    TD_CHECK_GOTO(td__rundb_prepare(
                      store, "SELECT min(value) FROM metrics WHERE run = ?1 AND key = ?2", &min),
                  st, out);
    TD_CHECK_GOTO(td__rundb_prepare(
                      store, "SELECT max(value) FROM metrics WHERE run = ?1 AND key = ?2", &max),
                  st, out);
    for (size_t i = 0; i < nkeys; i++) {
        int64_t k;
        int found = 0;
        TD_CHECK_GOTO(key_id(store, keys[i], &k, &found), st, out);
        if (!found) continue;
        sqlite3_reset(low);
        sqlite3_bind_int64(low, 1, seq);
        sqlite3_bind_int64(low, 2, k);
        int rc = sqlite3_step(low);
        if (rc == SQLITE_DONE) continue;
        if (rc != SQLITE_ROW) {
            st = td__rundb_err(store, "read a metric's ranks");
            goto out;
        }
        td_metric_stats *s = &out[i];
        s->last_rank = sqlite3_column_int(low, 0);
        sqlite3_reset(last);
        sqlite3_bind_int64(last, 1, seq);
        sqlite3_bind_int64(last, 2, k);
        sqlite3_bind_int(last, 3, s->last_rank);
        sqlite3_reset(min);
        sqlite3_bind_int64(min, 1, seq);
        sqlite3_bind_int64(min, 2, k);
        sqlite3_reset(max);
        sqlite3_bind_int64(max, 1, seq);
        sqlite3_bind_int64(max, 2, k);
        if (sqlite3_step(last) != SQLITE_ROW || sqlite3_step(min) != SQLITE_ROW ||
            sqlite3_step(max) != SQLITE_ROW) {
            st = td__rundb_err(store, "read a metric's last value");
            goto out;
        }
        s->found = 1;
        s->last_step = sqlite3_column_int64(last, 0);
        s->last = sqlite3_column_double(last, 1);
        s->min = sqlite3_column_double(min, 0);
        s->max = sqlite3_column_double(max, 0);
    }
out:
    sqlite3_finalize(low);
    sqlite3_finalize(last);
    sqlite3_finalize(min);
    sqlite3_finalize(max);
    td__rundb_read_end(store);
    if (st != TD_OK) memset(out, 0, nkeys * sizeof *out);
    return st;
}

/* ---- downsampling ---- */

typedef struct {
    int64_t seq; /* position in the rank's stream: orders and deduplicates the kept points */
    double x, y;
} sample;

typedef struct {
    int64_t bucket; /* -1: none open */
    sample first, min, max, last;
    td_metric_series *out;
    size_t cap;
} bucketer;

static void emit(bucketer *b, const sample *s) {
    td_metric_series *o = b->out;
    if (o->npoints == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 256;
        o->x = td_xrealloc(o->x, b->cap * sizeof *o->x);
        o->y = td_xrealloc(o->y, b->cap * sizeof *o->y);
    }
    o->x[o->npoints] = s->x;
    o->y[o->npoints] = s->y;
    o->npoints++;
}

/* The open bucket's kept points, in stream order, each once. */
static void flush(bucketer *b) {
    if (b->bucket < 0) return;
    sample k[4] = {b->first, b->min, b->max, b->last};
    for (int i = 1; i < 4; i++)
        for (int j = i; j > 0 && k[j].seq < k[j - 1].seq; j--) {
            sample t = k[j];
            k[j] = k[j - 1];
            k[j - 1] = t;
        }
    for (int i = 0; i < 4; i++)
        if (i == 0 || k[i].seq != k[i - 1].seq) emit(b, &k[i]);
    b->bucket = -1;
}

static void add(bucketer *b, int64_t bucket, const sample *s) {
    if (bucket != b->bucket) {
        flush(b);
        b->bucket = bucket;
        b->first = b->min = b->max = b->last = *s;
        return;
    }
    /* Strict comparisons: among equal values the earliest point stays, so the answer does not
     * depend on anything but the rows and their order. */
    if (s->y < b->min.y) b->min = *s;
    if (s->y > b->max.y) b->max = *s;
    b->last = *s;
}

void td_series_result_clear(td_series_result *r) {
    if (!r) return;
    for (size_t i = 0; i < r->nseries; i++) {
        free(r->series[i].x);
        free(r->series[i].y);
    }
    free(r->series);
    memset(r, 0, sizeof *r);
}

/* Streams one rank's rows in [from, to] (x order, then insertion order) into its buckets. */
static td_status bucket_rank(td_rundb *store, int64_t seq, int64_t key, const td_series_query *q,
                             double from, double to, td_metric_series *out) {
    const char *sql = q->x_time ? "SELECT time, value FROM metrics WHERE run = ?1 AND key = ?2"
                                  " AND rank = ?3 AND time >= ?4 AND time <= ?5"
                                  " ORDER BY time, rowid"
                                : "SELECT step, value FROM metrics WHERE run = ?1 AND key = ?2"
                                  " AND rank = ?3 AND step >= ?4 AND step <= ?5"
                                  " ORDER BY step, rowid";
    sqlite3_stmt *s = NULL;
    TD_CHECK(td__rundb_prepare(store, sql, &s));
    sqlite3_bind_int64(s, 1, seq);
    sqlite3_bind_int64(s, 2, key);
    sqlite3_bind_int(s, 3, out->rank);
    sqlite3_bind_double(s, 4, from);
    sqlite3_bind_double(s, 5, to);
    bucketer b = {.bucket = -1, .out = out};
    double span = to - from, w = (double)q->nbuckets;
    int rc;
    int64_t n = 0;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        sample p = {n++, sqlite3_column_double(s, 0), sqlite3_column_double(s, 1)};
        int64_t bucket = 0;
        if (span > 0) {
            double f = floor((p.x - from) / span * w);
            bucket = f < 0 ? 0 : f >= w ? q->nbuckets - 1 : (int64_t)f;
        }
        add(&b, bucket, &p);
    }
    flush(&b);
    out->count = n;
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) return td__rundb_err(store, "read a metric's points");
    return TD_OK;
}

td_status td_metrics_series(td_rundb *store, const char *run_id, const td_series_query *q,
                            td_series_result *out) {
    memset(out, 0, sizeof *out);
    if (q->nbuckets < 1)
        return td_error(TD_ERR_INVALID, "series of '%s': %d buckets; ask for at least 1", q->key,
                        q->nbuckets);
    if (q->has_from && q->has_to && q->from > q->to)
        return td_error(TD_ERR_INVALID, "series of '%s': from %.17g is after to %.17g", q->key,
                        q->from, q->to);
    int64_t seq, key;
    int found = 0;
    TD_CHECK(td__rundb_ensure(store));
    TD_CHECK(td__run_seq(store, run_id, &seq));
    td_status st = TD_OK;
    int *ranks = NULL;
    size_t nranks = 0;
    sqlite3_stmt *ranks_q = NULL, *lo_q = NULL, *hi_q = NULL;
    TD_CHECK(td__rundb_read_begin(store));
    TD_CHECK_GOTO(key_id(store, q->key, &key, &found), st, out);
    if (found) TD_CHECK_GOTO(key_ranks(store, &ranks_q, seq, key, &ranks, &nranks), st, out);
    if (!nranks) {
        st = td_error(TD_ERR_NOTFOUND, "run %s has no metric '%s'", run_id, q->key);
        goto out;
    }
    if (q->rank >= 0) {
        size_t i = 0;
        while (i < nranks && ranks[i] != q->rank) i++;
        if (i == nranks) {
            char list[256] = "";
            size_t used = 0;
            for (size_t j = 0; j < nranks && used < sizeof list; j++)
                used += (size_t)snprintf(list + used, sizeof list - used, "%s%d", j ? ", " : "",
                                         ranks[j]);
            st = td_error(TD_ERR_NOTFOUND, "run %s has no points of '%s' for rank %d (ranks: %s)",
                          run_id, q->key, q->rank, list);
            goto out;
        }
        ranks[0] = q->rank;
        nranks = 1;
    }
    double from = q->from, to = q->to;
    if (!q->has_from || !q->has_to) {
        const char *lo = q->x_time ? "SELECT min(time) FROM metrics"
                                     " WHERE run = ?1 AND key = ?2 AND rank = ?3"
                                   : "SELECT min(step) FROM metrics"
                                     " WHERE run = ?1 AND key = ?2 AND rank = ?3";
        const char *hi = q->x_time ? "SELECT max(time) FROM metrics"
                                     " WHERE run = ?1 AND key = ?2 AND rank = ?3"
                                   : "SELECT max(step) FROM metrics"
                                     " WHERE run = ?1 AND key = ?2 AND rank = ?3";
        double min_x = INFINITY, max_x = -INFINITY;
        for (size_t i = 0; i < nranks; i++) {
            double a, b;
            TD_CHECK_GOTO(rank_extreme(store, &lo_q, lo, seq, key, ranks[i], &a, NULL), st, out);
            TD_CHECK_GOTO(rank_extreme(store, &hi_q, hi, seq, key, ranks[i], &b, NULL), st, out);
            min_x = fmin(min_x, a);
            max_x = fmax(max_x, b);
        }
        if (!q->has_from) from = min_x;
        if (!q->has_to) to = max_x;
        /* One bound given, the other from the data, may cross: an empty range then. */
        if (from > to) {
            if (q->has_from)
                to = from;
            else
                from = to;
        }
    }
    if (!isfinite(to - from)) {
        st = td_error(TD_ERR_INVALID,
                      "series of '%s': the range [%.17g, %.17g] is too wide to cut into buckets;"
                      " ask for a narrower from/to",
                      q->key, from, to);
        goto out;
    }
    out->from = from;
    out->to = to;
    out->series = td_xcalloc(nranks, sizeof *out->series);
    out->nseries = nranks;
    for (size_t i = 0; i < nranks; i++) {
        out->series[i].rank = ranks[i];
        TD_CHECK_GOTO(bucket_rank(store, seq, key, q, from, to, &out->series[i]), st, out);
        out->total += out->series[i].count;
    }
out:
    sqlite3_finalize(ranks_q);
    sqlite3_finalize(lo_q);
    sqlite3_finalize(hi_q);
    td__rundb_read_end(store);
    free(ranks);
    if (st != TD_OK) td_series_result_clear(out);
    return st;
}

/* ---- following a run ---- */

td_status td_metrics_cursor(td_rundb *store, int64_t *out) {
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_ensure(store));
    TD_CHECK(td__rundb_prepare(store, "SELECT coalesce(max(rowid), 0) FROM metrics", &q));
    td_status st = td__rundb_step(store, q, "read the metrics cursor");
    if (st == TD_OK) *out = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    return st;
}

td_status td_metrics_since(td_rundb *store, const char *run_id, int64_t after, size_t limit,
                           td_metric_row **out, size_t *count, int64_t *cursor_out) {
    *out = NULL;
    *count = 0;
    *cursor_out = after;
    int64_t seq, high = 0;
    TD_CHECK(td__rundb_ensure(store));
    TD_CHECK(td__run_seq(store, run_id, &seq));
    td_status st = TD_OK;
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_read_begin(store));
    TD_CHECK_GOTO(td_metrics_cursor(store, &high), st, out);
    /* A rowid range of the table itself: only rows written since `after` are visited. */
    TD_CHECK_GOTO(td__rundb_prepare(store,
                                    "SELECT m.rowid, m.rank, k.name, m.step, m.value, m.time"
                                    " FROM metrics m JOIN metric_keys k ON k.id = m.key"
                                    " WHERE m.rowid > ?1 AND m.rowid <= ?2 AND m.run = ?3"
                                    " ORDER BY m.rowid LIMIT ?4",
                                    &q),
                  st, out);
    sqlite3_bind_int64(q, 1, after);
    sqlite3_bind_int64(q, 2, high);
    sqlite3_bind_int64(q, 3, seq);
    sqlite3_bind_int64(q, 4, limit > INT64_MAX ? INT64_MAX : (int64_t)limit);
    size_t cap = 0;
    int64_t last = after;
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (*count == cap) {
            cap = cap ? 2 * cap : 64;
            *out = td_xrealloc(*out, cap * sizeof **out);
        }
        td_metric_row *r = &(*out)[(*count)++];
        last = sqlite3_column_int64(q, 0);
        r->rank = sqlite3_column_int(q, 1);
        r->key = td_xstrdup((const char *)sqlite3_column_text(q, 2));
        r->step = sqlite3_column_int64(q, 3);
        r->value = sqlite3_column_double(q, 4);
        r->time_s = sqlite3_column_double(q, 5);
    }
    if (rc != SQLITE_DONE) {
        st = td__rundb_err(store, "read new metric points");
        goto out;
    }
    *cursor_out = *count == limit ? last : (high > after ? high : after);
out:
    sqlite3_finalize(q);
    td__rundb_read_end(store);
    if (st != TD_OK) {
        td_metric_rows_free(*out, *count);
        *out = NULL;
        *count = 0;
    }
    return st;
}

td_status td_metrics_ingested_offset(td_rundb *store, const char *run_id, const char *file,
                                     int64_t *out) {
    int64_t seq;
    *out = 0;
    TD_CHECK(td__rundb_ensure(store));
    TD_CHECK(td__run_seq(store, run_id, &seq));
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(store,
                               "SELECT offset FROM ingest_offsets WHERE run = ? AND file = ?", &q));
    sqlite3_bind_int64(q, 1, seq);
    sqlite3_bind_text(q, 2, file, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    td_status st = TD_OK;
    if (rc == SQLITE_ROW)
        *out = sqlite3_column_int64(q, 0);
    else if (rc != SQLITE_DONE)
        st = td__rundb_err(store, "read an ingest offset");
    sqlite3_finalize(q);
    return st;
}
