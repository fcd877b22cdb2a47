/* The ingester: tails rank-<R>.jsonl metric files and stores their points.
 *
 * Exactly-once comes from one rule: a file's points and its new offset commit in the same
 * transaction, and the offset is read inside that transaction (under the write lock). A crashed
 * ingester leaves the last committed offset behind, a restarted one continues from it, and two
 * ingesters polling the same directory serialize on the lock and each sees the other's offset.
 * Only complete lines are consumed; a partial last line waits for its newline. */
#include "store_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define INGEST_CHUNK_BYTES (8u << 20)

struct file_state {
    char *name;
    int rank;
    int warned;
    int unreadable;       /* skipped (not a regular file, cannot be opened or read): said once */
    int64_t known_offset; /* hint only: skip the transaction when the file has not grown */
    int undated_event;    /* an event without "time" was stored: the next dated line dates it */
};

struct td_ingester {
    td_rundb *store;
    char *run_id;
    int64_t run_seq;
    char *dir;
    struct file_state *files;
    size_t nfiles;
    size_t malformed;
    char *buf;
    char *only;          /* poll this file name only (NULL: every metrics file); such an
                          * ingester works beside the main one and leaves the telling to it */
    unsigned generation; /* the store's: run_seq belongs to the database file opened then */
    int nospace;         /* the disk is full: said once, and again when it is over */
    int events_only;     /* inside backfill_events: lines already stored, their events are not */
    /* The run's sign of life (run_activity, the "silent" state of tandem ps and the ui): when a
     * worker's metrics file or log last grew, as this ingester stored it. logs_dir: RUN/logs,
     * beside the metrics directory; NULL for an `only` ingester, which leaves it to the main,
     * and for one reading files after the fact (td__ingester_skip_activity). */
    char *logs_dir;
    double activity_stored;
};

td_status td_ingester_new(td_rundb *store, const char *run_id, const char *metrics_dir,
                          td_ingester **out) {
    int64_t seq;
    TD_CHECK(td__run_seq(store, run_id, &seq));
    td_ingester *ing = td_xcalloc(1, sizeof *ing);
    ing->store = store;
    ing->run_id = td_xstrdup(run_id);
    ing->run_seq = seq;
    ing->dir = td_xstrdup(metrics_dir);
    ing->buf = td_xmalloc(INGEST_CHUNK_BYTES + 1);
    ing->generation = store->generation;
    /* The metrics directory is RUN/metrics (td_run_path): its parent is the run directory. */
    const char *slash = strrchr(metrics_dir, '/');
    if (slash && slash != metrics_dir) {
        char *run_dir = td_xasprintf("%.*s", (int)(slash - metrics_dir), metrics_dir);
        ing->logs_dir = td_run_path(run_dir, TD_RUN_PATH_LOGS);
        free(run_dir);
    }
    *out = ing;
    return TD_OK;
}

void td_ingester_free(td_ingester *ing) {
    if (!ing) return;
    for (size_t i = 0; i < ing->nfiles; i++) free(ing->files[i].name);
    free(ing->files);
    free(ing->run_id);
    free(ing->dir);
    free(ing->only);
    free(ing->logs_dir);
    free(ing->buf);
    free(ing);
}

td_status td__ingester_new_file(td_rundb *store, const char *run_id, const char *metrics_dir,
                                const char *name, td_ingester **out) {
    TD_CHECK(td_ingester_new(store, run_id, metrics_dir, out));
    (*out)->only = td_xstrdup(name);
    td__ingester_skip_activity(*out);
    return TD_OK;
}

void td__ingester_skip_activity(td_ingester *ing) {
    free(ing->logs_dir);
    ing->logs_dir = NULL;
}

size_t td_ingester_malformed(const td_ingester *ing) {
    return ing->malformed;
}

/* Ranks of files: rank-<R>.jsonl is rank R's (td_metrics_file_rank); a system metrics file
 * (sys.jsonl, the supervisor's, see sysmon.c; sys-<NODE>.jsonl, a node agent's) names the rank
 * on each line. */
#define RANK_PER_LINE (-2)

static int rank_of(const char *name) {
    return td_metrics_file_is_system(name) ? RANK_PER_LINE : td_metrics_file_rank(name);
}

static void refresh_files(td_ingester *ing) {
    DIR *d = opendir(ing->dir);
    if (!d) return; /* nothing written yet */
    struct dirent *e;
    while ((e = readdir(d))) {
        int rank = rank_of(e->d_name);
        if (rank == -1 || (ing->only && strcmp(e->d_name, ing->only))) continue;
        int known = 0;
        for (size_t i = 0; i < ing->nfiles && !known; i++)
            known = !strcmp(ing->files[i].name, e->d_name);
        if (known) continue;
        ing->files = td_xrealloc(ing->files, (ing->nfiles + 1) * sizeof *ing->files);
        ing->files[ing->nfiles++] = (struct file_state){td_xstrdup(e->d_name), rank, 0, 0, -1, 0};
    }
    closedir(d);
}

static int get_i64(json_t *v, int64_t *out) {
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return 1;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 9e15) {
            *out = (int64_t)d;
            return 1;
        }
    }
    return 0;
}

/* Outcome of one line: 1 stored (or nothing to store), 0 malformed; <0 store failure. */
static td_status ingest_line(td_ingester *ing, struct file_state *f, const char *line, size_t len,
                             int64_t line_no, double now, size_t *npoints, int *malformed) {
    *malformed = 0;
    size_t i = 0;
    while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) i++;
    if (i == len) return TD_OK; /* blank line */
    /* Reading again for events only: the lines that hold none are not parsed. */
    if (ing->events_only && !memmem(line, len, "\"event\"", 7) &&
        !(f->undated_event && memmem(line, len, "\"time\"", 6)))
        return TD_OK;
    json_error_t jerr;
    json_t *obj = json_loadb(line, len, 0, &jerr);
    td_status st = TD_OK;
    if (!obj || !json_is_object(obj)) {
        *malformed = 1;
        goto out;
    }
    int64_t step = line_no;
    json_t *jstep = json_object_get(obj, "step");
    if (jstep && !get_i64(jstep, &step)) {
        *malformed = 1;
        goto out;
    }
    int rank = f->rank;
    if (rank == RANK_PER_LINE) {
        int64_t r = 0;
        json_t *jrank = json_object_get(obj, "rank");
        if (jrank && (!get_i64(jrank, &r) || r < 0 || r > 1000000)) {
            *malformed = 1;
            goto out;
        }
        rank = (int)r;
    }
    json_t *jtime = json_object_get(obj, "time");
    int dated = jtime && json_is_number(jtime);
    double t = dated ? json_number_value(jtime) : now;
    if (dated && f->undated_event) {
        /* Resume lines written before every line had a time (docs/metrics-format.md) take the
         * time of the line after them, as the chart marks always did. */
        TD_CHECK_GOTO(td__run_events_date(ing->store, ing->run_seq, f->name, t), st, out);
        f->undated_event = 0;
    }
    json_t *event = json_object_get(obj, "event");
    if (event) {
        td_run_event_kind kind;
        if (td_run_event_kind_parse(json_string_value(event), &kind)) {
            if (!jstep) {
                *malformed = 1;
                goto out;
            }
            /* The cut and the event land in the same transaction: whoever sees the event
             * (the UI's stream says `reset`) sees the points cut back too. */
            if (kind == TD_RUN_EVENT_RESUME && !ing->events_only)
                TD_CHECK_GOTO(td__metrics_cut(ing->store, ing->run_seq, rank, step), st, out);
            TD_CHECK_GOTO(td__run_event_insert(ing->store, ing->run_seq, f->name, line_no, rank,
                                               kind, step, dated ? t : 0),
                          st, out);
            if (!dated) f->undated_event = 1;
        }
        goto out; /* events carry no points; unknown ones are ignored */
    }
    if (ing->events_only) goto out;
    json_t *jkey = json_object_get(obj, "key");
    if (jkey) {
        json_t *jval = json_object_get(obj, "value");
        if (!json_is_string(jkey) || !json_is_number(jval)) {
            *malformed = 1;
            goto out;
        }
        int64_t key_id;
        TD_CHECK_GOTO(td__metric_key_id(ing->store, json_string_value(jkey), &key_id), st, out);
        TD_CHECK_GOTO(td__metric_insert_one(ing->store, ing->run_seq, rank, key_id, step,
                                            json_number_value(jval), t),
                      st, out);
        (*npoints)++;
        goto out;
    }
    const char *name;
    json_t *val;
    json_object_foreach(obj, name, val) {
        if (!json_is_number(val) || !strcmp(name, "step") || !strcmp(name, "time") ||
            !strcmp(name, "rank"))
            continue;
        int64_t key_id;
        TD_CHECK_GOTO(td__metric_key_id(ing->store, name, &key_id), st, out);
        TD_CHECK_GOTO(td__metric_insert_one(ing->store, ing->run_seq, rank, key_id, step,
                                            json_number_value(val), t),
                      st, out);
        (*npoints)++;
    }
out:
    json_decref(obj);
    return st;
}

/* ---- the run's sign of life ----
 * "Silent for N min" (td_run_silent_s) asks the store when a worker last wrote, so that tandem
 * ps and the ui list runs without opening any run's files. The ingest, which looks at the files
 * anyway, stores it: the modification time of a worker's metrics file (not the system samples,
 * which go on while a worker hangs) when it gave complete lines, in that poll's transaction, and
 * the newest modification of a worker's log. Stored at most once a second (the state counts seconds):
 * a run printing all the time costs one small write a second, not one per poll. */
#define ACTIVITY_RESOLUTION_S 1.0

static int is_worker_log(const char *name) {
    size_t n = strlen(name);
    return n > 4 && !strcmp(name + n - 4, ".log") &&
           (!strncmp(name, "rank-", 5) || !strncmp(name, "node-", 5));
}

/* The newest modification time of the worker logs (rank-*.log, node-*.log: not setup.log nor
 * supervisor.log); 0 when there are none. */
static double newest_worker_log(const char *dir) {
    double best = 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_worker_log(e->d_name)) continue;
        struct stat sb;
        if (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode))
            continue;
        double t = (double)sb.st_mtim.tv_sec + (double)sb.st_mtim.tv_nsec * 1e-9;
        if (t > best) best = t;
    }
    closedir(d);
    return best;
}

static int activity_due(const td_ingester *ing, double t) {
    return t >= ing->activity_stored + ACTIVITY_RESOLUTION_S;
}

/* Records t as the run's last sign of life (never moving it back: another ingester may have
 * stored a later one). In the caller's transaction, or alone, retried while busy. */
static td_status store_activity(td_ingester *ing, double t) {
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(ing->store,
                               "INSERT INTO run_activity(run, worker_s) VALUES(?, ?)"
                               " ON CONFLICT(run) DO UPDATE"
                               " SET worker_s = max(worker_s, excluded.worker_s)",
                               &q));
    sqlite3_bind_int64(q, 1, ing->run_seq);
    sqlite3_bind_double(q, 2, t);
    td_status st = td__rundb_step(ing->store, q, "store when a worker last wrote");
    sqlite3_finalize(q);
    return st;
}

static td_status poll_logs(td_ingester *ing) {
    if (!ing->logs_dir) return TD_OK;
    double t = newest_worker_log(ing->logs_dir);
    if (!activity_due(ing, t)) return TD_OK;
    TD_CHECK(store_activity(ing, t));
    ing->activity_stored = t;
    return TD_OK;
}

static td_status read_offset(td_ingester *ing, const char *name, int64_t *offset, int64_t *line,
                             int64_t *malformed) {
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(ing->store,
                               "SELECT offset, line, malformed FROM ingest_offsets"
                               " WHERE run = ? AND file = ?",
                               &q));
    sqlite3_bind_int64(q, 1, ing->run_seq);
    sqlite3_bind_text(q, 2, name, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    td_status st = TD_OK;
    *offset = *line = *malformed = 0;
    if (rc == SQLITE_ROW) {
        *offset = sqlite3_column_int64(q, 0);
        *line = sqlite3_column_int64(q, 1);
        *malformed = sqlite3_column_int64(q, 2);
    } else if (rc != SQLITE_DONE) {
        st = td__rundb_err(ing->store, "read an ingest offset");
    }
    sqlite3_finalize(q);
    return st;
}

static td_status write_offset(td_ingester *ing, const char *name, int64_t offset, int64_t line,
                              int64_t malformed) {
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(ing->store,
                               "INSERT OR REPLACE INTO ingest_offsets(run, file, offset, line,"
                               " malformed) VALUES(?,?,?,?,?)",
                               &q));
    sqlite3_bind_int64(q, 1, ing->run_seq);
    sqlite3_bind_text(q, 2, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 3, offset);
    sqlite3_bind_int64(q, 4, line);
    sqlite3_bind_int64(q, 5, malformed);
    td_status st = sqlite3_step(q) == SQLITE_DONE
                       ? TD_OK
                       : td__rundb_err(ing->store, "store an ingest offset");
    sqlite3_finalize(q);
    return st;
}

/* The events of a file's first upto bytes, read again for an index made before the run_events
 * table (run_events_backfill, store.c): the lines are numbered as the ingest numbered them (a
 * line longer than a chunk counts as the ingest counts it), nothing but events is stored, no
 * cut is applied again. Inside the poll's transaction. */
static td_status backfill_events(td_ingester *ing, struct file_state *f, int fd, int64_t upto) {
    td_status st = TD_OK;
    int64_t offset = 0, line_no = 0;
    size_t ignored = 0;
    ing->events_only = 1;
    while (offset < upto && st == TD_OK) {
        size_t want = (size_t)TD_MIN((int64_t)INGEST_CHUNK_BYTES, upto - offset), got = 0;
        while (got < want) {
            ssize_t n = pread(fd, ing->buf + got, want - got, (off_t)(offset + (int64_t)got));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            got += (size_t)n;
        }
        size_t consumed = 0;
        while (consumed < got && st == TD_OK) {
            char *nl = memchr(ing->buf + consumed, '\n', got - consumed);
            if (!nl) break;
            size_t len = (size_t)(nl - (ing->buf + consumed));
            int malformed;
            st = ingest_line(ing, f, ing->buf + consumed, len, ++line_no, 0, &ignored, &malformed);
            consumed += len + 1;
        }
        if (consumed == 0) {
            if (got < INGEST_CHUNK_BYTES) break; /* the file ends (or shrank) before upto */
            consumed = got;                      /* one line longer than the chunk */
            line_no++;
        }
        offset += (int64_t)consumed;
    }
    ing->events_only = 0;
    return st;
}

/* Reads the events of the part of f an older index ingested, when run_events_backfill says so
 * (reread: 0 when the file is read again from its start anyway), and forgets the row. */
static td_status backfill_if_due(td_ingester *ing, struct file_state *f, int fd, int reread) {
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(ing->store,
                               "SELECT upto FROM run_events_backfill WHERE run = ? AND file = ?",
                               &q));
    sqlite3_bind_int64(q, 1, ing->run_seq);
    sqlite3_bind_text(q, 2, f->name, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    int64_t upto = rc == SQLITE_ROW ? sqlite3_column_int64(q, 0) : -1;
    sqlite3_finalize(q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return td__rundb_err(ing->store, "read the events to read again");
    if (upto < 0) return TD_OK;
    if (!reread) TD_CHECK(backfill_events(ing, f, fd, upto));
    TD_CHECK(td__rundb_prepare(ing->store,
                               "DELETE FROM run_events_backfill WHERE run = ? AND file = ?", &q));
    sqlite3_bind_int64(q, 1, ing->run_seq);
    sqlite3_bind_text(q, 2, f->name, -1, SQLITE_STATIC);
    td_status st = sqlite3_step(q) == SQLITE_DONE
                       ? TD_OK
                       : td__rundb_err(ing->store, "forget the events to read again");
    sqlite3_finalize(q);
    return st;
}

/* A metrics file that cannot be read is skipped, with one warning naming it and why (once, and
 * again only after it was read in between); the other files of the directory are ingested all
 * the same, and it is tried again at each poll (a file put right is read from its stored offset
 * on). */
static void skip_file(const td_ingester *ing, struct file_state *f, const char *path,
                      const char *why) {
    if (f->unreadable) return;
    f->unreadable = 1;
    if (ing->only) return; /* the main ingester polls this file too, and says it */
    TD_LOG_WARN("metrics file %s %s: skipped, the run's other metrics files are still stored "
                "(metrics files are regular files; remove or rename this one, a regular file in "
                "its place is read at the next poll)",
                path, why);
}

/* One transaction for one file: read the committed offset, consume complete lines from there,
 * commit points and the new offset together. *more is set when the chunk limit cut it short.
 * Only a regular file is read: the open never blocks (O_NONBLOCK: a FIFO would wait for a
 * writer forever, and the supervisor with it) nor follows a link, and anything else is skipped
 * (skip_file). Errors returned are the store's, which no other file would escape either. */
static td_status poll_file(td_ingester *ing, struct file_state *f, size_t *npoints, int *more) {
    *more = 0;
    char *path = td_xasprintf("%s/%s", ing->dir, f->name);
    td_status st = TD_OK;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0) {
        int err = errno;
        if (err == ELOOP)
            skip_file(ing, f, path, "is a symbolic link");
        else if (err != ENOENT) {
            char why[160];
            snprintf(why, sizeof why, "cannot be opened (%s)", strerror(err));
            skip_file(ing, f, path, why);
        }
        free(path);
        return TD_OK;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        char why[160];
        snprintf(why, sizeof why, "cannot be examined (fstat: %s)", strerror(errno));
        skip_file(ing, f, path, why);
        goto done;
    }
    if (!S_ISREG(sb.st_mode)) {
        char why[160];
        snprintf(why, sizeof why, "is %s, not a regular file", td_mode_kind(sb.st_mode));
        skip_file(ing, f, path, why);
        goto done;
    }
    if (sb.st_size == f->known_offset) goto done;

    int64_t offset, line_no, bad;
    int64_t first_bad_line = 0;
    size_t stored = 0;
    TD_CHECK_GOTO(td__rundb_begin(ing->store), st, done);
    /* Size and offset both read under the write lock: another ingester may have consumed
     * more of the file since the stat above, so an older size could look like a shrink. */
    if (fstat(fd, &sb) != 0) {
        char why[160];
        snprintf(why, sizeof why, "cannot be examined (fstat: %s)", strerror(errno));
        skip_file(ing, f, path, why);
        goto rollback;
    }
    TD_CHECK_GOTO(read_offset(ing, f->name, &offset, &line_no, &bad), st, rollback);
    if (sb.st_size < offset) {
        TD_LOG_WARN("%s shrank from %lld to %lld bytes (rewritten?); reading it again from the "
                    "start",
                    path, (long long)offset, (long long)sb.st_size);
        offset = line_no = 0;
        TD_CHECK_GOTO(td__run_events_forget_file(ing->store, ing->run_seq, f->name), st, rollback);
    }
    TD_CHECK_GOTO(backfill_if_due(ing, f, fd, offset == 0), st, rollback);
    size_t want = (size_t)TD_MIN((int64_t)INGEST_CHUNK_BYTES, (int64_t)sb.st_size - offset);
    size_t got = 0;
    while (got < want) {
        ssize_t n = pread(fd, ing->buf + got, want - got, (off_t)(offset + (int64_t)got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            char why[200];
            snprintf(why, sizeof why, "cannot be read at offset %lld (%s)", (long long)offset,
                     strerror(errno));
            skip_file(ing, f, path, why);
            goto rollback;
        }
        if (n == 0) break;
        got += (size_t)n;
    }
    size_t consumed = 0;
    double now = td_wall_s();
    while (consumed < got) {
        char *nl = memchr(ing->buf + consumed, '\n', got - consumed);
        if (!nl) break;
        size_t len = (size_t)(nl - (ing->buf + consumed));
        line_no++;
        int malformed = 0;
        TD_CHECK_GOTO(
            ingest_line(ing, f, ing->buf + consumed, len, line_no, now, &stored, &malformed), st,
            rollback);
        if (malformed) {
            bad++;
            ing->malformed++;
            if (!first_bad_line) first_bad_line = line_no;
        }
        consumed += len + 1;
    }
    if (consumed == 0 && got == INGEST_CHUNK_BYTES) {
        /* One line longer than the chunk: no metric line is that long, skip it as malformed. */
        consumed = got;
        line_no++;
        bad++;
        ing->malformed++;
        if (!first_bad_line) first_bad_line = line_no;
    }
    TD_CHECK_GOTO(write_offset(ing, f->name, offset + (int64_t)consumed, line_no, bad), st,
                  rollback);
    /* The file's modification time, not the clock: a reindex or an import reading old lines
     * is no sign of life. */
    double written = (double)sb.st_mtim.tv_sec + (double)sb.st_mtim.tv_nsec * 1e-9;
    int active = consumed > 0 && ing->logs_dir && !td_metrics_file_is_system(f->name) &&
                 activity_due(ing, written);
    if (active) TD_CHECK_GOTO(store_activity(ing, written), st, rollback);
    TD_CHECK_GOTO(td__rundb_commit(ing->store), st, rollback);
    if (active) ing->activity_stored = written;
    *npoints += stored;
    f->unreadable = 0; /* read again: a later problem is said again */
    f->known_offset = offset + (int64_t)consumed;
    *more = got == INGEST_CHUNK_BYTES;
    if (first_bad_line && !f->warned) {
        f->warned = 1;
        TD_LOG_WARN("%s:%lld: malformed metrics line skipped (expected one JSON object such as "
                    "{\"step\": 10, \"loss\": 0.5}); further bad lines in this file are only "
                    "counted",
                    path, (long long)first_bad_line);
    }
    goto done;
rollback:
    td__rundb_rollback(ing->store);
done:
    close(fd);
    free(path);
    return st;
}

td_status td_ingester_poll(td_ingester *ing, size_t *npoints) {
    size_t total = 0;
    td_status st = td__rundb_ensure(ing->store);
    if (st == TD_OK && ing->generation != ing->store->generation) {
        /* runs.db was replaced (and rebuilt) under us: the run has a new seq there, and the
         * new file's offsets, not our hints, say what it already holds. */
        st = td__run_seq(ing->store, ing->run_id, &ing->run_seq);
        if (st == TD_OK) {
            ing->generation = ing->store->generation;
            for (size_t i = 0; i < ing->nfiles; i++) ing->files[i].known_offset = -1;
            ing->activity_stored = 0;
        }
    }
    if (st == TD_OK) {
        refresh_files(ing);
        for (size_t i = 0; i < ing->nfiles && st == TD_OK; i++) {
            int more = 1;
            while (more && st == TD_OK) st = poll_file(ing, &ing->files[i], &total, &more);
        }
        if (st == TD_OK) st = poll_logs(ing);
    }
    if (npoints) *npoints = total;
    if (st == TD_ERR_NOSPACE) {
        td__nospace_explain(st, td_rundb_dir(ing->store));
        if (!ing->nospace && !ing->only) {
            /* Said here, once: a supervisor polls twice a second and must not repeat it. */
            TD_LOG_WARN("metrics of run %s are not being stored: %s; the points stay in %s "
                        "(as far as they could be written) and are stored when there is room "
                        "again, or later by 'tandem reindex' (this is said once)",
                        ing->run_id, td_error_msg(), ing->dir);
            ing->nospace = 1;
        }
        return st;
    }
    if (st == TD_OK && ing->nospace && !ing->only) {
        TD_LOG_WARN("metrics of run %s are being stored again (the disk has room)", ing->run_id);
        ing->nospace = 0;
    }
    return st;
}
