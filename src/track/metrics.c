/* Metric points: (run, rank, key, step, value, time). Keys are interned in metric_keys so each
 * row and the (run, key, rank, step) index hold integers only. */
#include "store_internal.h"

#include <stdlib.h>
#include <string.h>

static uint64_t key_hash(const char *s) { /* FNV-1a */
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The slot of name in key_slots: where it is, or the empty one where it would go. */
static size_t key_slot(const td_rundb *store, const char *name) {
    size_t mask = store->nslots - 1, i = (size_t)key_hash(name) & mask;
    while (store->key_slots[i] && strcmp(store->keys[store->key_slots[i] - 1].name, name))
        i = (i + 1) & mask;
    return i;
}

static void key_index_grow(td_rundb *store) {
    free(store->key_slots);
    store->nslots = store->nslots ? 2 * store->nslots : 64;
    store->key_slots = td_xcalloc(store->nslots, sizeof *store->key_slots);
    for (size_t k = 0; k < store->nkeys; k++)
        store->key_slots[key_slot(store, store->keys[k].name)] = (uint32_t)(k + 1);
}

td_status td__metric_key_id(td_rundb *store, const char *name, int64_t *out) {
    if (store->nslots) {
        uint32_t at = store->key_slots[key_slot(store, name)];
        if (at) {
            *out = store->keys[at - 1].id;
            return TD_OK;
        }
    }
    sqlite3_stmt *q = NULL;
    td_status st = TD_OK;
    TD_CHECK(td__rundb_prepare(store, "INSERT OR IGNORE INTO metric_keys(name) VALUES(?)", &q));
    sqlite3_bind_text(q, 1, name, -1, SQLITE_STATIC);
    if (sqlite3_step(q) != SQLITE_DONE) st = td__rundb_err(store, "add a metric key");
    sqlite3_finalize(q);
    if (st != TD_OK) return st;
    TD_CHECK(td__rundb_prepare(store, "SELECT id FROM metric_keys WHERE name = ?", &q));
    sqlite3_bind_text(q, 1, name, -1, SQLITE_STATIC);
    if (sqlite3_step(q) == SQLITE_ROW)
        *out = sqlite3_column_int64(q, 0);
    else
        st = td__rundb_err(store, "read a metric key");
    sqlite3_finalize(q);
    if (st != TD_OK) return st;
    if (store->nkeys == store->cap_keys) {
        store->cap_keys = store->cap_keys ? 2 * store->cap_keys : 16;
        store->keys = td_xrealloc(store->keys, store->cap_keys * sizeof *store->keys);
    }
    store->keys[store->nkeys].name = td_xstrdup(name);
    store->keys[store->nkeys].id = *out;
    store->nkeys++;
    if (2 * store->nkeys > store->nslots)
        key_index_grow(store); /* indexes every key, the new one too */
    else
        store->key_slots[key_slot(store, name)] = (uint32_t)store->nkeys;
    return TD_OK;
}

td_status td__metric_insert_one(td_rundb *store, int64_t run_seq, int rank, int64_t key_id,
                                int64_t step, double value, double time_s) {
    sqlite3_stmt *q = store->insert_metric;
    sqlite3_reset(q);
    sqlite3_bind_int64(q, 1, run_seq);
    sqlite3_bind_int(q, 2, rank);
    sqlite3_bind_int64(q, 3, key_id);
    sqlite3_bind_int64(q, 4, step);
    sqlite3_bind_double(q, 5, value);
    sqlite3_bind_double(q, 6, time_s);
    if (sqlite3_step(q) != SQLITE_DONE) return td__rundb_err(store, "insert a metric point");
    return TD_OK;
}

td_status td__metrics_cut(td_rundb *store, int64_t run_seq, int rank, int64_t step) {
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(store,
                               "DELETE FROM metrics WHERE run = ? AND rank = ? AND step > ?"
                               " AND key IN (SELECT id FROM metric_keys"
                               " WHERE name NOT LIKE 'sys/%')",
                               &q));
    sqlite3_bind_int64(q, 1, run_seq);
    sqlite3_bind_int(q, 2, rank);
    sqlite3_bind_int64(q, 3, step);
    td_status st =
        sqlite3_step(q) == SQLITE_DONE ? TD_OK : td__rundb_err(store, "cut metrics back");
    sqlite3_finalize(q);
    return st;
}

td_status td_metrics_insert(td_rundb *store, const char *run_id, const td_metric_point *points,
                            size_t count) {
    td_status st = TD_OK;
    int64_t seq;
    TD_CHECK(td__rundb_ensure(store));
    TD_CHECK(td__run_seq(store, run_id, &seq));
    double now = td_wall_s();
    TD_CHECK(td__rundb_begin(store));
    for (size_t i = 0; i < count; i++) {
        int64_t key;
        TD_CHECK_GOTO(td__metric_key_id(store, points[i].key, &key), st, out);
        TD_CHECK_GOTO(td__metric_insert_one(store, seq, points[i].rank, key, points[i].step,
                                            points[i].value,
                                            points[i].time_s > 0 ? points[i].time_s : now),
                      st, out);
    }
    TD_CHECK_GOTO(td__rundb_commit(store), st, out);
out:
    if (st != TD_OK) td__rundb_rollback(store);
    return st;
}

void td_metric_rows_free(td_metric_row *rows, size_t count) {
    for (size_t i = 0; i < count; i++) free(rows[i].key);
    free(rows);
}

static td_status collect_rows(td_rundb *store, sqlite3_stmt *q, td_metric_row **out,
                              size_t *count) {
    size_t cap = 0;
    int rc;
    *out = NULL;
    *count = 0;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (*count == cap) {
            cap = cap ? 2 * cap : 256;
            *out = td_xrealloc(*out, cap * sizeof **out);
        }
        td_metric_row *r = &(*out)[(*count)++];
        r->rank = sqlite3_column_int(q, 0);
        r->key = td_xstrdup((const char *)sqlite3_column_text(q, 1));
        r->step = sqlite3_column_int64(q, 2);
        r->value = sqlite3_column_double(q, 3);
        r->time_s = sqlite3_column_double(q, 4);
    }
    if (rc != SQLITE_DONE) {
        td_metric_rows_free(*out, *count);
        *out = NULL;
        *count = 0;
        return td__rundb_err(store, "read metrics");
    }
    return TD_OK;
}

td_status td_metrics_query(td_rundb *store, const char *run_id, const char *key, int rank,
                           td_metric_row **out, size_t *count) {
    int64_t seq;
    TD_CHECK(td__rundb_ensure(store));
    TD_CHECK(td__run_seq(store, run_id, &seq));
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(store,
                               "SELECT m.rank, k.name, m.step, m.value, m.time FROM metrics m"
                               " JOIN metric_keys k ON k.id = m.key WHERE m.run = ?1"
                               " AND (?2 IS NULL OR k.name = ?2) AND (?3 < 0 OR m.rank = ?3)"
                               " ORDER BY k.name, m.rank, m.step, m.rowid",
                               &q));
    sqlite3_bind_int64(q, 1, seq);
    if (key)
        sqlite3_bind_text(q, 2, key, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(q, 2);
    sqlite3_bind_int(q, 3, rank);
    td_status st = collect_rows(store, q, out, count);
    sqlite3_finalize(q);
    return st;
}

td_status td_metrics_last(td_rundb *store, const char *run_id, td_metric_row **out, size_t *count) {
    int64_t seq;
    TD_CHECK(td__rundb_ensure(store));
    TD_CHECK(td__run_seq(store, run_id, &seq));
    sqlite3_stmt *q = NULL;
    /* For each key: the highest step, and on ties the lowest rank (rank 0 speaks for the job). */
    TD_CHECK(td__rundb_prepare(
        store,
        "SELECT m.rank, k.name, m.step, m.value, m.time FROM metric_keys k"
        " JOIN metrics m ON m.rowid = (SELECT rowid FROM metrics WHERE run = ?1 AND key = k.id"
        " ORDER BY step DESC, rank ASC, rowid DESC LIMIT 1) ORDER BY k.name",
        &q));
    sqlite3_bind_int64(q, 1, seq);
    td_status st = collect_rows(store, q, out, count);
    sqlite3_finalize(q);
    return st;
}

td_status td_metrics_count(td_rundb *store, const char *run_id, int64_t *out) {
    int64_t seq;
    TD_CHECK(td__rundb_ensure(store));
    TD_CHECK(td__run_seq(store, run_id, &seq));
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(store, "SELECT COUNT(*) FROM metrics WHERE run = ?", &q));
    sqlite3_bind_int64(q, 1, seq);
    td_status st = TD_OK;
    if (sqlite3_step(q) == SQLITE_ROW)
        *out = sqlite3_column_int64(q, 0);
    else
        st = td__rundb_err(store, "count metrics");
    sqlite3_finalize(q);
    return st;
}
