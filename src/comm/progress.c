/* The progress publisher: one thread per process group that tells the launcher how far this rank
 * got (docs/comm.md, "Progress").
 *
 * Why a thread and not a store write per collective: a small allreduce takes microseconds, and
 * the store is a TCP round trip away, on another machine for most ranks. The collectives only
 * update counters in memory (pg->act, relaxed stores); this thread samples them and writes one
 * key when they changed, at most once per period, and once per heartbeat regardless. So the
 * launcher can tell a rank that is busy between collectives (its heartbeat goes on) from a
 * process that no longer runs at all (stopped or frozen: its heartbeat stops too). */
#include "comm/pg_internal.h"

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/store_internal.h"

/* A changed record waits at most this long; a rank in a tight loop of collectives writes one key
 * per second, not one per collective. */
#define MAX_PERIOD_MS 1000
/* Per store request: a store that does not answer must not hold td_pg_free up for long. */
#define IO_TIMEOUT_MS 1000

#define RECORD_MAGIC "tdp1"

struct td__progress {
    td_pg_t *pg; /* only pg->act and pg->rank are read here */
    char *host, *token, *key;
    int port;
    int heartbeat_ms, period_ms;
    td_store_t *store; /* a connection of its own: a store client serves one thread at a time */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* on CLOCK_MONOTONIC */
    bool stop;
    td_pg_progress last; /* as last published */
    uint64_t last_ns;
    uint64_t beat;
    bool warned;
};

static const char *const state_names[] = {"between", "inside", "failed", "closed"};

char *td_pg_progress_key(const char *run_id, int restart, int rank) {
    char *prefix = td__pg_env_prefix(run_id, restart);
    char *key = td_xasprintf("%s/progress/%d", prefix, rank);
    free(prefix);
    return key;
}

void td_pg_progress_format(const td_pg_progress *p, char *buf, size_t nbytes) {
    unsigned st = (unsigned)p->state < TD_ARRAY_LEN(state_names) ? (unsigned)p->state : 0;
    snprintf(buf, nbytes, RECORD_MAGIC " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %s %s %d",
             p->beat, p->started, p->finished, p->steps, p->op[0] ? p->op : "-", state_names[st],
             p->pid);
}

td_status td_pg_progress_parse(const void *value, size_t nbytes, td_pg_progress *out) {
    memset(out, 0, sizeof *out);
    char text[256], op[32], state[32], safe[300];
    if (nbytes >= sizeof text) goto bad;
    memcpy(text, value, nbytes);
    text[nbytes] = '\0';
    int used = 0;
    if (sscanf(text, RECORD_MAGIC " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %31s %31s %d%n",
               &out->beat, &out->started, &out->finished, &out->steps, op, state, &out->pid,
               &used) != 7 ||
        text[used] != '\0' || out->finished > out->started || strlen(op) >= sizeof out->op)
        goto bad;
    for (size_t i = 0; i < TD_ARRAY_LEN(state_names); i++)
        if (!strcmp(state, state_names[i])) {
            out->state = (td_pg_state)i;
            if (strcmp(op, "-")) memcpy(out->op, op, strlen(op) + 1); /* fits: checked */
            return TD_OK;
        }
bad:
    td_escape_text(safe, sizeof safe, value, nbytes);
    return td_error(TD_ERR_FORMAT,
                    "'%s' is not a progress record (expected \"" RECORD_MAGIC
                    " beat started finished steps op state pid\", as td_pg_progress_format "
                    "writes)",
                    safe);
}

/* What the collectives say now. */
static void snapshot(const td__progress *p, td_pg_progress *out) {
    const td__pg_activity *a = &p->pg->act;
    memset(out, 0, sizeof *out);
    out->started = atomic_load_explicit(&a->started, memory_order_relaxed);
    out->finished = atomic_load_explicit(&a->finished, memory_order_relaxed);
    out->steps = atomic_load_explicit(&a->steps, memory_order_relaxed);
    /* Sampled while a collective starts or ends, the two counters may be read a step apart. */
    if (out->finished > out->started) out->finished = out->started;
    snprintf(out->op, sizeof out->op, "%s",
             td__coll_name(atomic_load_explicit(&a->kind, memory_order_relaxed)));
    if (atomic_load_explicit(&a->failed, memory_order_relaxed))
        out->state = TD_PG_FAILED;
    else
        out->state = out->started != out->finished ? TD_PG_INSIDE : TD_PG_BETWEEN;
    out->pid = (int)getpid();
}

static bool same_position(const td_pg_progress *a, const td_pg_progress *b) {
    return a->started == b->started && a->finished == b->finished && a->steps == b->steps &&
           a->state == b->state && !strcmp(a->op, b->op);
}

/* Said once per group: the launcher may take this rank's silence for a frozen process. */
static void warn_once(td__progress *p, const char *what) {
    if (p->warned) return;
    p->warned = true;
    TD_LOG_WARN("rank %d: cannot publish collective progress to the store at %s:%d (%s: %s); the "
                "launcher's stall check (--stall-timeout) may take this rank for frozen",
                p->pg->rank, p->host, p->port, what, td_error_msg());
}

static void publish(td__progress *p, const td_pg_progress *rec) {
    if (!p->store) {
        if (td_store_connect(p->host, p->port, p->token, IO_TIMEOUT_MS, &p->store) != TD_OK) {
            p->store = NULL;
            warn_once(p, "connect");
            return;
        }
        td__store_set_io_timeout(p->store, IO_TIMEOUT_MS);
    }
    td_pg_progress r = *rec;
    r.beat = ++p->beat;
    char value[256];
    td_pg_progress_format(&r, value, sizeof value);
    if (td_store_set(p->store, p->key, value, strlen(value)) != TD_OK) {
        warn_once(p, "set");
        td_store_close(p->store); /* the stream may be out of step: start over next time */
        p->store = NULL;
        return;
    }
    p->last = r;
    p->last_ns = td_now_ns();
}

static void *publisher_main(void *arg) {
    td__progress *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)p->period_ms * 1000000ull;
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        while (!p->stop && pthread_cond_timedwait(&p->cv, &p->mu, &ts) == 0) {
        }
        if (p->stop) break;
        pthread_mutex_unlock(&p->mu);
        td_pg_progress now;
        snapshot(p, &now);
        if (!same_position(&now, &p->last) ||
            td_now_ns() - p->last_ns >= (uint64_t)p->heartbeat_ms * 1000000ull)
            publish(p, &now);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    /* The last word: this rank left the group on purpose, it is not stuck in it. */
    if (p->store) {
        td_pg_progress last;
        snapshot(p, &last);
        if (last.state != TD_PG_FAILED) last.state = TD_PG_CLOSED;
        publish(p, &last);
    }
    return NULL;
}

static void progress_free(td__progress *p) {
    if (p->store) td_store_close(p->store);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->host);
    free(p->token);
    free(p->key);
    free(p);
}

void td__progress_start(td_pg_t *pg, const char *host, int port, const char *token,
                        int heartbeat_ms, td__progress **out) {
    *out = NULL;
    td__progress *p = td_xcalloc(1, sizeof *p);
    p->pg = pg;
    p->host = td_xstrdup(host);
    p->token = td_xstrdup(token);
    p->port = port;
    p->key = td__pg_key(pg, "progress/%d", pg->rank);
    p->heartbeat_ms = TD_MAX(heartbeat_ms, 10);
    p->period_ms = TD_MIN(p->heartbeat_ms, MAX_PERIOD_MS);
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    /* The first record now, before any collective: a rank that freezes right away is seen. */
    td_pg_progress first;
    snapshot(p, &first);
    publish(p, &first);
    if (!p->store) { /* warned */
        progress_free(p);
        return;
    }
    /* Signals stay with the application's threads (a trainer's SIGTERM handler, a sigwait). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&p->thread, NULL, publisher_main, p);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        TD_LOG_WARN("rank %d: cannot start the progress publisher thread (%s); the launcher's "
                    "stall check sees this rank's first record only",
                    pg->rank, strerror(rc));
        progress_free(p);
        return;
    }
    TD_LOG_DEBUG("comm: rank %d publishes progress under '%s' (heartbeat %d ms)", pg->rank, p->key,
                 p->heartbeat_ms);
    *out = p;
}

void td__progress_stop(td__progress *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    progress_free(p);
}
