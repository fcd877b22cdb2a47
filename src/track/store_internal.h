/* track internals shared by the store's source files. */
#ifndef TANDEM_TRACK_STORE_INTERNAL_H
#define TANDEM_TRACK_STORE_INTERNAL_H

#include <sqlite3.h>

#include "tandem/track.h"

struct td_rundb {
    sqlite3 *db;
    char *project_dir; /* absolute */
    char *dir;         /* <project>/.tandem */
    char *db_path;
    /* metric key name -> id, valid across transactions because keys are never deleted; cleared
     * on rollback since a rolled-back insert may have handed out an id that no longer exists. */
    struct {
        char *name;
        int64_t id;
    } * keys;
    size_t nkeys, cap_keys;
    sqlite3_stmt *insert_metric;
};

/* Records a TD_ERR_IO detail naming the database, what was being done and SQLite's message. */
td_status td__rundb_err(td_rundb *store, const char *what);
/* BEGIN IMMEDIATE, retried while another process holds the write lock (up to about a minute). */
td_status td__rundb_begin(td_rundb *store);
td_status td__rundb_commit(td_rundb *store);
void td__rundb_rollback(td_rundb *store);
td_status td__rundb_exec(td_rundb *store, const char *sql);
td_status td__rundb_prepare(td_rundb *store, const char *sql, sqlite3_stmt **out);
/* The integer key (runs.seq) of a run id; TD_ERR_NOTFOUND naming it. */
td_status td__run_seq(td_rundb *store, const char *run_id, int64_t *out);
/* The id of a metric key, inserting it when new; call inside a transaction. */
td_status td__metric_key_id(td_rundb *store, const char *name, int64_t *out);
/* Binds and steps the cached insert statement for one point; inside a transaction. */
td_status td__metric_insert_one(td_rundb *store, int64_t run_seq, int rank, int64_t key_id,
                                int64_t step, double value, double time_s);
/* Removes a rank's non-system points with step > step (a resume event). */
td_status td__metrics_cut(td_rundb *store, int64_t run_seq, int rank, int64_t step);

#endif
