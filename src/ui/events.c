/* Server-sent events: the live side of `tandem ui`.
 *
 * One poller thread serves every open stream, on an event loop of its own (loop.h; the HTTP
 * side is libmicrohttpd's threads): its passes are timers, and a new stream or the stop is a
 * write to an eventfd it watches. Every POLL_RUN_S, while streams follow runs, it asks SQLite
 * whether anything was committed since its last look (data_version: one cheap pragma) and,
 * for each stream that follows a run, reads the metric rows past the stream's cursor (a rowid
 * range: only new rows are visited), the run's row (status changes), the growth of its log
 * files, and the run's events in the store past the stream's event cursor (a resume stored
 * there means the ingest cut points back: the page must refetch). The metrics files themselves
 * are never opened here: the store has what they hold.
 * Every POLL_RUNS_S it lists the runs for the streams of the runs table. What it finds is
 * queued as text on each stream; the stream's reader (a libmicrohttpd connection thread,
 * blocked in td__ui_stream_read) wakes and hands it out.
 *
 * A stream is held by its connection and by the poller's list; it is freed when both let go.
 * A client that is too slow stops getting points until its queue drains (its cursor waits), so
 * memory stays bounded and nothing is skipped. */
#include "ui_internal.h"

#include "tandem/loop.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define POLL_RUN_S         0.15 /* the latency target is 0.5 s from the store to the wire */
#define POLL_RUNS_S        0.5
#define RUNS_METRICS_EVERY 4   /* runs-table passes between metric refreshes of live runs */
#define REAP_S             5.0 /* how often runs shown as live are checked for a dead supervisor */
#define PING_S             15.0
#define POINTS_PER_EVENT   5000
#define POINTS_PER_PASS    200000
#define LOG_CHUNK_BYTES    (256 * 1024)
#define QUEUE_MAX_BYTES    (8u << 20) /* per stream: past this the poller waits for the client */
#define FINAL_LOG_BYTES    (16 << 20) /* a finished run's logs are flushed up to this much */

enum { STREAM_RUN, STREAM_RUNS };

struct log_follow {
    char *label;
    int rank;
    int64_t offset; /* sent up to here */
};

struct known_run {
    char *id;
    char *sig;     /* what makes a change: status, restarts, ended, note, exit code */
    char *metrics; /* the metrics object last sent for a live run (NULL: not looked at yet) */
};

struct td__ui_stream {
    td__ui_events *ev;
    int kind;
    int refs;     /* under ev->lock: the connection and the poller's list */
    int released; /* the connection let go */
    int done;     /* nothing more will be queued: the reader ends once the queue is empty */
    char *q;      /* queued text, q[qpos..qlen) not yet handed out */
    size_t qlen, qpos, qcap;
    double last_out; /* monotonic time the reader last handed out bytes (pings) */
    pthread_cond_t cond;
    td__ui_stream *next;
    /* STREAM_RUN: poller-only state */
    char *run_id, *run_dir;
    int64_t cursor;
    int more_points; /* the last pass left points for the next one */
    char *status_sig;
    struct log_follow *logs;
    size_t nlogs;
    int64_t event_cursor; /* the run's events up to this id are in what the page has */
    /* STREAM_RUNS */
    char **keys;
    size_t nkeys;
    struct known_run *known;
    size_t nknown;
};

struct td__ui_events {
    td_ui *ui;
    pthread_mutex_t lock;
    int wake_fd; /* eventfd: a new stream, or stopping */
    pthread_t thread;
    int started, stopping;
    td__ui_stream *streams;
    /* the poller thread's own, from here on */
    td_loop *loop;
    uint64_t run_timer, runs_timer; /* the passes' periodic timers, while they have streams */
    td_rundb *db;                   /* the poller's own reader */
    int64_t data_version;
    int runs_pass;
    /* A commit seen on a pass that served only one kind of stream is still news for the other
     * kind's next pass: each keeps its own flag (one shared flag lost points for seconds when
     * a runs-table pass consumed it). */
    int run_news, runs_news;
};

/* Wakes the poller thread (from any thread). */
static void wake(td__ui_events *ev) {
    uint64_t one = 1;
    ssize_t r = write(ev->wake_fd, &one, sizeof one);
    (void)r; /* a full counter wakes it as well */
}

/* ---- queueing (under ev->lock) ---- */

static void queue_locked(td__ui_stream *s, const char *text, size_t n) {
    if (s->qpos && s->qpos == s->qlen) s->qpos = s->qlen = 0;
    if (s->qpos > s->qcap / 2) {
        memmove(s->q, s->q + s->qpos, s->qlen - s->qpos);
        s->qlen -= s->qpos;
        s->qpos = 0;
    }
    if (s->qlen + n > s->qcap) {
        while (s->qlen + n > s->qcap) s->qcap = s->qcap ? 2 * s->qcap : 16384;
        s->q = td_xrealloc(s->q, s->qcap);
    }
    memcpy(s->q + s->qlen, text, n);
    s->qlen += n;
    pthread_cond_signal(&s->cond);
}

static void queue(td__ui_stream *s, const td__ui_buf *b) {
    if (!b->n) return;
    pthread_mutex_lock(&s->ev->lock);
    queue_locked(s, b->p, b->n);
    pthread_mutex_unlock(&s->ev->lock);
}

static size_t queued(td__ui_stream *s) {
    pthread_mutex_lock(&s->ev->lock);
    size_t n = s->qlen - s->qpos;
    pthread_mutex_unlock(&s->ev->lock);
    return n;
}

/* "event: NAME\ndata: JSON\n\n" (with "id: ID\n" first when id >= 0: an EventSource that
 * reconnects sends it back as Last-Event-ID). data is consumed. */
static void add_event(td__ui_buf *b, const char *name, int64_t id, json_t *data) {
    char head[96];
    if (id >= 0)
        snprintf(head, sizeof head, "id: %lld\nevent: %s\ndata: ", (long long)id, name);
    else
        snprintf(head, sizeof head, "event: %s\ndata: ", name);
    td__ui_buf_str(b, head);
    td__ui_buf_json(b, data);
    td__ui_buf_str(b, "\n\n");
}

/* ---- streams: life ---- */

static void stream_free(td__ui_stream *s) {
    free(s->q);
    pthread_cond_destroy(&s->cond);
    free(s->run_id);
    free(s->run_dir);
    free(s->status_sig);
    for (size_t i = 0; i < s->nlogs; i++) free(s->logs[i].label);
    free(s->logs);
    for (size_t i = 0; i < s->nkeys; i++) free(s->keys[i]);
    free(s->keys);
    for (size_t i = 0; i < s->nknown; i++) {
        free(s->known[i].id);
        free(s->known[i].sig);
        free(s->known[i].metrics);
    }
    free(s->known);
    free(s);
}

/* Drops one reference; under ev->lock. */
static void unref_locked(td__ui_stream *s) {
    if (--s->refs == 0) stream_free(s);
}

static td__ui_stream *stream_new(td__ui_events *ev, int kind) {
    td__ui_stream *s = td_xcalloc(1, sizeof *s);
    s->ev = ev;
    s->kind = kind;
    s->refs = 2; /* the connection's and the list's */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cond, &ca);
    pthread_condattr_destroy(&ca);
    s->last_out = td_now_s();
    return s;
}

static void stream_add(td__ui_events *ev, td__ui_stream *s) {
    pthread_mutex_lock(&ev->lock);
    /* Headers and a first line go out at once: the browser's EventSource opens without waiting
     * for the first event. */
    queue_locked(s, ": tandem\n\n", 10);
    if (ev->stopping) s->done = 1;
    s->next = ev->streams;
    ev->streams = s;
    pthread_mutex_unlock(&ev->lock);
    wake(ev);
}

void td__ui_stream_release(td__ui_stream *s) {
    if (!s) return;
    td__ui_events *ev = s->ev;
    pthread_mutex_lock(&ev->lock);
    s->released = 1;
    unref_locked(s);
    pthread_mutex_unlock(&ev->lock);
}

static void timespec_at(double t_mono, struct timespec *ts) {
    /* td_now_s is CLOCK_MONOTONIC, as the streams' condition variables are. */
    ts->tv_sec = (time_t)t_mono;
    ts->tv_nsec = (long)((t_mono - (double)ts->tv_sec) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

ssize_t td__ui_stream_read(td__ui_stream *s, char *buf, size_t max) {
    td__ui_events *ev = s->ev;
    pthread_mutex_lock(&ev->lock);
    for (;;) {
        if (s->qpos < s->qlen) {
            size_t n = s->qlen - s->qpos < max ? s->qlen - s->qpos : max;
            memcpy(buf, s->q + s->qpos, n);
            s->qpos += n;
            s->last_out = td_now_s();
            pthread_mutex_unlock(&ev->lock);
            return (ssize_t)n;
        }
        if (s->done || ev->stopping) {
            pthread_mutex_unlock(&ev->lock);
            return -1; /* MHD_CONTENT_READER_END_OF_STREAM */
        }
        double now = td_now_s(), ping_at = s->last_out + PING_S;
        if (now >= ping_at) {
            /* Also how a client that went away is noticed: the write fails. */
            queue_locked(s, ": ping\n\n", 8);
            continue;
        }
        struct timespec ts;
        timespec_at(ping_at, &ts);
        pthread_cond_timedwait(&s->cond, &ev->lock, &ts);
    }
}

/* ---- following one run ---- */

static struct log_follow *find_log(td__ui_stream *s, const char *label) {
    for (size_t i = 0; i < s->nlogs; i++)
        if (!strcmp(s->logs[i].label, label)) return &s->logs[i];
    return NULL;
}

static struct log_follow *add_log(td__ui_stream *s, const td__ui_log *l, int64_t offset) {
    s->logs = td_xrealloc(s->logs, (s->nlogs + 1) * sizeof *s->logs);
    s->logs[s->nlogs] = (struct log_follow){td_xstrdup(l->label), l->rank, offset};
    return &s->logs[s->nlogs++];
}

/* New bytes of the run's logs as `log` events. Live: whole lines only (the rest waits for its
 * newline, unless a line outgrows a chunk). Final: everything, partial last line included.
 * Returns 1 when something was left for the next pass. */
static int poll_logs(td__ui_stream *s, int final) {
    td__ui_log *logs = NULL;
    size_t n = 0;
    int more = 0;
    td__ui_logs_list(s->run_dir, &logs, &n);
    char *chunk = NULL;
    for (size_t i = 0; i < n; i++) {
        struct log_follow *f = find_log(s, logs[i].label);
        if (!f) f = add_log(s, &logs[i], 0); /* a file that appeared since the stream opened */
        if (logs[i].nbytes < f->offset) f->offset = 0; /* truncated: from its start again */
        if (logs[i].nbytes == f->offset) continue;
        int fd = open(logs[i].path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) continue;
        if (!chunk) chunk = td_xmalloc(LOG_CHUNK_BYTES);
        int64_t budget = final ? FINAL_LOG_BYTES : LOG_CHUNK_BYTES;
        while (f->offset < logs[i].nbytes && budget > 0) {
            if (queued(s) > QUEUE_MAX_BYTES) {
                more = 1;
                break;
            }
            int64_t left = logs[i].nbytes - f->offset;
            size_t k = (size_t)(left < LOG_CHUNK_BYTES ? left : LOG_CHUNK_BYTES);
            if (td__ui_pread_all(fd, chunk, k, f->offset) != 0) break;
            size_t send = k;
            if (!final) {
                while (send > 0 && chunk[send - 1] != '\n') send--;
                if (send == 0 && k < LOG_CHUNK_BYTES) break; /* a partial line: wait */
                if (send == 0) send = k;
            }
            td__ui_buf b = {0};
            json_t *d = json_object();
            json_object_set_new(d, "rank", td__ui_log_label_json(&logs[i]));
            json_object_set_new(d, "offset", json_integer(f->offset));
            json_object_set_new(d, "end", json_integer(f->offset + (int64_t)send));
            json_object_set_new(d, "text", td__ui_json_text(chunk, send));
            add_event(&b, "log", -1, d);
            queue(s, &b);
            free(b.p);
            f->offset += (int64_t)send;
            budget -= (int64_t)send;
        }
        if (f->offset < logs[i].nbytes && !final && budget <= 0) more = 1;
        close(fd);
    }
    free(chunk);
    td__ui_logs_free(logs, n);
    return more;
}

/* Whether the store holds a resume event of the run past the stream's event cursor (moved on):
 * the ingest stored it in the transaction that cut the rank's points back, so the page's series
 * are stale and the stream says `reset`. */
static int poll_resets(td__ui_stream *s, td_rundb *db) {
    int reset = 0;
    for (;;) {
        td_run_event *ev = NULL;
        size_t n = 0;
        if (td_run_events(db, s->run_id, s->event_cursor, 256, &ev, &n) != TD_OK) {
            TD_LOG_DEBUG("tandem ui: events of run %s: %s", s->run_id, td_error_msg());
            td_error_clear();
            return reset;
        }
        for (size_t i = 0; i < n; i++) {
            reset |= ev[i].kind == TD_RUN_EVENT_RESUME;
            s->event_cursor = ev[i].id;
        }
        free(ev);
        if (n < 256) return reset;
    }
}

static char *run_sig(const td_run *r) {
    return td_xasprintf("%s|%d|%.6f|%d|%s", td_run_status_str(r->status), r->restarts, r->ended_s,
                        r->exit_code, r->note ? r->note : "");
}

/* Points after the stream's cursor as `points` events; returns 1 when more are left (a pass
 * takes at most POINTS_PER_PASS, and none while the client's queue is full). */
static int poll_points(td__ui_stream *s, td_rundb *db) {
    size_t sent = 0;
    while (sent < POINTS_PER_PASS) {
        if (queued(s) > QUEUE_MAX_BYTES) return 1;
        td_metric_row *rows = NULL;
        size_t n = 0;
        int64_t cursor;
        if (td_metrics_since(db, s->run_id, s->cursor, POINTS_PER_EVENT, &rows, &n, &cursor) !=
            TD_OK) {
            TD_LOG_DEBUG("tandem ui: new points of run %s: %s", s->run_id, td_error_msg());
            td_error_clear();
            return 1;
        }
        if (n) {
            td__ui_buf b = {0};
            char head[96];
            snprintf(head, sizeof head,
                     "id: %lld\nevent: points\ndata: {\"cursor\":%lld,\"points\":[",
                     (long long)cursor, (long long)cursor);
            td__ui_buf_str(&b, head);
            const char *last_key = NULL;
            char *key_json = NULL;
            for (size_t i = 0; i < n; i++) {
                if (!last_key || strcmp(last_key, rows[i].key)) {
                    free(key_json);
                    json_t *k = td__ui_json_text(rows[i].key, strlen(rows[i].key));
                    key_json = json_dumps(k, JSON_ENCODE_ANY);
                    json_decref(k);
                    last_key = rows[i].key;
                }
                td__ui_buf_str(&b, i ? ",[" : "[");
                td__ui_buf_str(&b, key_json ? key_json : "\"\"");
                char t[48];
                snprintf(t, sizeof t, ",%d,%lld,", rows[i].rank, (long long)rows[i].step);
                td__ui_buf_str(&b, t);
                td__ui_buf_num(&b, rows[i].time_s);
                td__ui_buf_put(&b, ",", 1);
                td__ui_buf_num(&b, rows[i].value);
                td__ui_buf_put(&b, "]", 1);
            }
            free(key_json);
            td__ui_buf_str(&b, "]}\n\n");
            queue(s, &b);
            free(b.p);
            sent += n;
        }
        td_metric_rows_free(rows, n);
        s->cursor = cursor;
        if (n < POINTS_PER_EVENT) return 0;
    }
    return 1;
}

static void poll_run(td__ui_events *ev, td__ui_stream *s, int changed) {
    td_rundb *db = ev->db;
    td_run r;
    td_status st = td_run_find(db, s->run_id, &r);
    if (st != TD_OK) {
        /* Gone from the index (a reindex in progress?): try again next pass, unless it is
         * really unknown now. */
        if (st == TD_ERR_NOTFOUND) {
            pthread_mutex_lock(&ev->lock);
            s->done = 1;
            pthread_cond_signal(&s->cond);
            pthread_mutex_unlock(&ev->lock);
        }
        td_error_clear();
        return;
    }
    int final = td_run_status_is_final(r.status), more = 0;
    char *sig = run_sig(&r);
    int status_changed = !s->status_sig || strcmp(sig, s->status_sig);
    /* The supervisor records a final status after its last ingest: points and logs read after
     * seeing it are complete. */
    if (changed || s->more_points || status_changed || final || !s->status_sig)
        s->more_points = poll_points(s, db);
    more |= s->more_points;
    more |= poll_logs(s, final);
    if ((changed || !s->status_sig) && poll_resets(s, db)) {
        int64_t cursor = s->cursor;
        if (td_metrics_cursor(db, &cursor) != TD_OK) td_error_clear();
        /* The page refetches its series, which then hold everything up to here; points come
         * after. */
        s->cursor = cursor > s->cursor ? cursor : s->cursor;
        td__ui_buf b = {0};
        add_event(&b, "reset", s->cursor, json_pack("{s:I}", "cursor", (json_int_t)s->cursor));
        queue(s, &b);
        free(b.p);
    }
    if (status_changed || (final && !more)) {
        td__ui_buf b = {0};
        add_event(&b, "status", -1,
                  td__ui_run_json(db, &r, td__ui_default_keys, td__ui_ndefault_keys));
        queue(s, &b);
        free(b.p);
        free(s->status_sig);
        s->status_sig = sig;
        sig = NULL;
    }
    free(sig);
    if (final && !more) {
        pthread_mutex_lock(&ev->lock);
        s->done = 1;
        pthread_cond_signal(&s->cond);
        pthread_mutex_unlock(&ev->lock);
    }
    td_run_clear(&r);
}

td__ui_stream *td__ui_stream_run(td__ui_events *ev, td_rundb *db, const td_run *run, int64_t since,
                                 int has_since) {
    td__ui_stream *s = stream_new(ev, STREAM_RUN);
    s->run_id = td_xstrdup(run->id);
    s->run_dir = td_xstrdup(run->run_dir ? run->run_dir : "");
    s->cursor = since;
    if (!has_since && td_metrics_cursor(db, &s->cursor) != TD_OK) {
        s->refs = 1;
        stream_free(s);
        return NULL;
    }
    /* Logs from their current ends (the page read them through /logs), events from the newest
     * stored: a resume before that is in the series the page has. */
    td__ui_log *logs = NULL;
    size_t n = 0;
    td__ui_logs_list(s->run_dir, &logs, &n);
    for (size_t i = 0; i < n; i++) add_log(s, &logs[i], logs[i].nbytes);
    td__ui_logs_free(logs, n);
    if (td_run_events_cursor(db, s->run_id, &s->event_cursor) != TD_OK) td_error_clear();
    stream_add(ev, s);
    return s;
}

/* ---- the runs table ---- */

static struct known_run *find_known(td__ui_stream *s, const char *id) {
    for (size_t i = 0; i < s->nknown; i++)
        if (!strcmp(s->known[i].id, id)) return &s->known[i];
    return NULL;
}

static struct known_run *add_known(td__ui_stream *s, const td_run *r) {
    s->known = td_xrealloc(s->known, (s->nknown + 1) * sizeof *s->known);
    s->known[s->nknown] = (struct known_run){td_xstrdup(r->id), run_sig(r), NULL};
    return &s->known[s->nknown++];
}

static char *metrics_text(json_t *run_obj) {
    return json_dumps(json_object_get(run_obj, "metrics"), JSON_COMPACT | JSON_SORT_KEYS);
}

static void poll_runs(td__ui_events *ev, td__ui_stream *s, const td_run *runs, size_t n,
                      int metrics_pass) {
    json_t *changed = json_array();
    const char **keys = (const char **)s->keys;
    for (size_t i = 0; i < n; i++) {
        const td_run *r = &runs[i];
        struct known_run *k = find_known(s, r->id);
        char *sig = run_sig(r);
        int live = !td_run_status_is_final(r->status);
        int is_new = !k, differs = k && strcmp(k->sig, sig);
        if (!k) k = add_known(s, r);
        json_t *obj = NULL;
        if (is_new || differs || (live && metrics_pass)) {
            obj = td__ui_run_json(ev->db, r, keys, s->nkeys);
            char *m = metrics_text(obj);
            /* A live run's last/min/max move while its status does not. */
            int metrics_moved = live && k->metrics && m && strcmp(k->metrics, m);
            free(k->metrics);
            k->metrics = m;
            if (is_new || differs || metrics_moved) {
                json_array_append(changed, obj);
                free(k->sig);
                k->sig = sig;
                sig = NULL;
            }
            json_decref(obj);
        }
        free(sig);
    }
    if (json_array_size(changed)) {
        td__ui_buf b = {0};
        add_event(&b, "runs", -1, json_pack("{s:O}", "runs", changed));
        queue(s, &b);
        free(b.p);
    }
    json_decref(changed);
}

td__ui_stream *td__ui_stream_runs(td__ui_events *ev, td_rundb *db, const char *const *keys,
                                  size_t nkeys) {
    td__ui_stream *s = stream_new(ev, STREAM_RUNS);
    s->keys = td_xcalloc(nkeys ? nkeys : 1, sizeof *s->keys);
    for (size_t i = 0; i < nkeys; i++) s->keys[i] = td_xstrdup(keys[i]);
    s->nkeys = nkeys;
    /* What the page has (it listed the runs first): changes from here on. */
    td_run *runs = NULL;
    size_t n = 0;
    if (td_run_list(db, 1, &runs, &n) != TD_OK) {
        s->refs = 1;
        stream_free(s);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) add_known(s, &runs[i]);
    td_runs_free(runs, n);
    stream_add(ev, s);
    return s;
}

/* ---- the poller ---- */

/* A run recorded as running whose supervisor died (killed, machine rebooted) would stay "live"
 * on the page for ever: mark it failed, as `tandem ps` does when it lists runs. The one write the
 * server makes on its own, and only for runs that nothing writes to any more. */
static void reap_stale(td__ui_events *ev) {
    td_ui *ui = ev->ui;
    td_run *runs = NULL;
    size_t n = 0;
    pthread_mutex_lock(&ui->writer_lock);
    if (td_run_list(ui->writer, 0, &runs, &n) == TD_OK) {
        for (size_t i = 0; i < n; i++)
            if (!td_run_status_is_final(runs[i].status) &&
                td_run_reap_stale(ui->writer, &runs[i]) != TD_OK) {
                TD_LOG_DEBUG("tandem ui: checking run %s: %s", runs[i].id, td_error_msg());
                td_error_clear();
            }
    }
    td_error_clear();
    pthread_mutex_unlock(&ui->writer_lock);
    td_runs_free(runs, n);
}

#define MAX_WORK 256 /* streams served per pass; the rest wait for the next */

/* The streams of one kind that need work, with a reference each (td__ui_stream_release may come
 * meanwhile); drops released and finished ones from the list on the way. Returns how many. */
static size_t take_work(td__ui_events *ev, int kind, td__ui_stream **work) {
    size_t nwork = 0;
    pthread_mutex_lock(&ev->lock);
    for (td__ui_stream **pp = &ev->streams; *pp;) {
        td__ui_stream *s = *pp;
        if (s->released || s->done) {
            *pp = s->next;
            unref_locked(s);
            continue;
        }
        if (s->kind == kind && nwork < MAX_WORK) {
            s->refs++;
            work[nwork++] = s;
        }
        pp = &s->next;
    }
    pthread_mutex_unlock(&ev->lock);
    return nwork;
}

static void put_work(td__ui_events *ev, td__ui_stream **work, size_t nwork) {
    pthread_mutex_lock(&ev->lock);
    for (size_t i = 0; i < nwork; i++) unref_locked(work[i]);
    pthread_mutex_unlock(&ev->lock);
}

/* Whether s is still wanted (its connection holds it, and the server is not stopping). */
static int serving(td__ui_events *ev, td__ui_stream *s) {
    pthread_mutex_lock(&ev->lock);
    int yes = !s->released && !ev->stopping;
    pthread_mutex_unlock(&ev->lock);
    return yes;
}

/* One cheap question to SQLite: was anything committed since the last pass of either kind? */
static void check_news(td__ui_events *ev) {
    int64_t dv = 0;
    if (td_rundb_data_version(ev->db, &dv) != TD_OK) {
        td_error_clear();
        dv = ev->data_version + 1;
    }
    if (dv != ev->data_version) ev->run_news = ev->runs_news = 1;
    ev->data_version = dv;
}

/* Every POLL_RUN_S while streams follow runs: each gets what its run gained. */
static void run_pass(td_loop *l, void *user) {
    td__ui_events *ev = user;
    td__ui_stream *work[MAX_WORK];
    size_t nwork = take_work(ev, STREAM_RUN, work);
    if (!nwork) { /* none left: the timer waits for the next stream */
        td_loop_cancel(l, ev->run_timer);
        ev->run_timer = 0;
        return;
    }
    check_news(ev);
    int changed = ev->run_news;
    ev->run_news = 0;
    for (size_t i = 0; i < nwork; i++)
        if (serving(ev, work[i])) poll_run(ev, work[i], changed);
    put_work(ev, work, nwork);
}

/* Every POLL_RUNS_S while streams show the runs table: the list, when it changed (and every
 * RUNS_METRICS_EVERY passes for the live runs' metrics). */
static void runs_pass(td_loop *l, void *user) {
    td__ui_events *ev = user;
    td__ui_stream *work[MAX_WORK];
    size_t nwork = take_work(ev, STREAM_RUNS, work);
    if (!nwork) {
        td_loop_cancel(l, ev->runs_timer);
        ev->runs_timer = 0;
        return;
    }
    check_news(ev);
    int metrics_pass = ++ev->runs_pass % RUNS_METRICS_EVERY == 0;
    int changed = ev->runs_news;
    ev->runs_news = 0;
    td_run *runs = NULL;
    size_t nruns = 0;
    if ((changed || metrics_pass) && td_run_list(ev->db, 1, &runs, &nruns) != TD_OK) {
        td_error_clear();
        runs = NULL;
        nruns = 0;
    }
    for (size_t i = 0; runs && i < nwork; i++)
        if (serving(ev, work[i])) poll_runs(ev, work[i], runs, nruns, metrics_pass);
    td_runs_free(runs, nruns);
    put_work(ev, work, nwork);
}

static void reap_pass(td_loop *l, void *user) {
    (void)l;
    reap_stale(user);
}

/* A new stream, or the stop. A stream that follows a run gets its first events at once (a pass
 * of every run stream, the timer's phase starting over); the runs table's first stream starts
 * its timer, due at once. */
static void on_wake(td_loop *l, int fd, unsigned events, void *user) {
    (void)events;
    td__ui_events *ev = user;
    uint64_t v;
    ssize_t r = read(fd, &v, sizeof v);
    (void)r;
    int have[2] = {0, 0};
    pthread_mutex_lock(&ev->lock);
    int stopping = ev->stopping;
    for (td__ui_stream *s = ev->streams; s; s = s->next)
        if (!s->released && !s->done) have[s->kind] = 1;
    pthread_mutex_unlock(&ev->lock);
    if (stopping) {
        td_loop_stop(l);
        return;
    }
    if (have[STREAM_RUN]) {
        td_loop_cancel(l, ev->run_timer);
        ev->run_timer = td_loop_timer(l, POLL_RUN_S, POLL_RUN_S, run_pass, ev);
        run_pass(l, ev);
    }
    if (have[STREAM_RUNS] && !ev->runs_timer)
        ev->runs_timer = td_loop_timer(l, 0, POLL_RUNS_S, runs_pass, ev);
}

static void *poller(void *arg) {
    td__ui_events *ev = arg;
    if (td_loop_run(ev->loop) != TD_OK) {
        TD_LOG_ERROR("tandem ui: the live-event poller's loop failed: %s", td_error_msg());
        td_error_clear();
    }
    return NULL;
}

td_status td__ui_events_start(td_ui *ui, td__ui_events **out) {
    *out = NULL;
    td__ui_events *ev = td_xcalloc(1, sizeof *ev);
    ev->ui = ui;
    ev->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (ev->wake_fd < 0) {
        free(ev);
        return td_error_errno(TD_ERR_SYS, "tandem ui: eventfd for the event poller");
    }
    td_status st = td_rundb_open_reader(ui->writer, &ev->db);
    /* The loop is made here, so that its failure is the caller's error; from the thread's start
     * on only the poller thread touches it. */
    if (st == TD_OK && (st = td_loop_new(&ev->loop)) == TD_OK)
        st = td_loop_watch(ev->loop, ev->wake_fd, TD_LOOP_READ, on_wake, ev);
    if (st != TD_OK) goto fail;
    td_loop_timer(ev->loop, 0, REAP_S, reap_pass, ev);
    pthread_mutex_init(&ev->lock, NULL);
    int rc = pthread_create(&ev->thread, NULL, poller, ev);
    if (rc != 0) {
        errno = rc;
        st = td_error_errno(TD_ERR_SYS, "cannot start the ui's event poller thread");
        pthread_mutex_destroy(&ev->lock);
        goto fail;
    }
    ev->started = 1;
    *out = ev;
    return TD_OK;
fail:
    td_loop_free(ev->loop);
    td_rundb_close(ev->db);
    close(ev->wake_fd);
    free(ev);
    return st;
}

void td__ui_events_stop(td__ui_events *ev) {
    if (!ev) return;
    pthread_mutex_lock(&ev->lock);
    ev->stopping = 1;
    for (td__ui_stream *s = ev->streams; s; s = s->next) pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&ev->lock);
    wake(ev);
    if (ev->started) pthread_join(ev->thread, NULL);
    ev->started = 0;
}

void td__ui_events_free(td__ui_events *ev) {
    if (!ev) return;
    td__ui_events_stop(ev);
    pthread_mutex_lock(&ev->lock);
    /* The connections are gone (MHD stopped before this): only the list's references remain. */
    while (ev->streams) {
        td__ui_stream *s = ev->streams;
        ev->streams = s->next;
        unref_locked(s);
    }
    pthread_mutex_unlock(&ev->lock);
    pthread_mutex_destroy(&ev->lock);
    td_loop_free(ev->loop);
    close(ev->wake_fd);
    td_rundb_close(ev->db);
    free(ev);
}
