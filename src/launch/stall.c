/* The stall check of the node agents (docs/launch.md, "Stalls").
 *
 * Liveness (waitpid) misses a rank whose process lives but no longer gets anywhere: stopped,
 * deadlocked inside a collective, or waiting for data a partitioned network never delivers; and
 * it misses a node agent that froze. So:
 *
 * - every worker's process group publishes its collective progress (comm's td_pg_progress: seq,
 *   inside or between collectives, pieces moved, a heartbeat) under td_pg_progress_key;
 * - every agent reads its own workers' keys and publishes one heartbeat key per node,
 *   <ns>/beat/<node>, carrying them; so an agent reads nlocal + nnodes - 1 keys per round, not
 *   one per rank of the job, and a frozen agent's silence is seen like a frozen worker's;
 * - every agent judges the whole group on the same data; the first to publish `failed` wins and
 *   every node prints that cause.
 *
 * The rule (the comments at judge_workers say why each part is there): the group is stalled when
 * no rank started, finished or moved data in a collective for the stall time T while at least
 * one rank waited inside one, and the rank(s) the others wait for are provably stuck: inside a
 * collective themselves, or silent (their process published no heartbeat for max(T/2, ...)). A
 * rank that is merely busy between collectives (rank 0 evaluating while the others wait in the
 * next allreduce) is not a stall: it is reported once as a warning, and comm's own
 * TANDEM_COMM_TIMEOUT_MS bounds the others' wait as before. An agent whose heartbeat has not
 * changed for T is a stall of its own. */
#include "stall.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SUMMARY_MAGIC "tdhb1"

/* Seconds for "%.*f": a tenth below 10 s (the tests' stall times), whole seconds above. */
#define SECS(x) ((x) < 9.95 ? 1 : 0), (x)

typedef struct {
    bool known; /* a progress record was read for it */
    td_pg_progress p;
    int node;
    int pid;
    bool exited;    /* its node's agent reaped it */
    double quiet_s; /* how long its record has not changed, as its node's agent saw it */
} rank_view;

typedef struct {
    bool seen;
    uint64_t counter;  /* the heartbeat's counter, last value read */
    double changed_at; /* our clock: when it last changed (the attempt's start until it is seen) */
    char host[128];
} node_view;

struct td__stall {
    td__stall_params p;
    char *ns, *run_id;
    double frozen_s; /* a record quiet this long: its process is not running */
    double started_at;
    char host[128];
    uint64_t counter;
    char **local_key;
    char **local_last; /* the value last read, or NULL */
    double *local_changed;
    rank_view *ranks; /* per global rank, rebuilt every round */
    node_view *nodes;
    uint64_t sig; /* of every record's position: a change is progress */
    bool have_sig;
    double progress_at;
    bool warned; /* about a busy laggard, once per episode */
};

int td__stall_heartbeat_ms(double timeout_s) {
    double ms = timeout_s * 1000.0 / 8.0;
    return (int)TD_MAX(100.0, TD_MIN(5000.0, ms));
}

double td__stall_period_s(const td__stall_params *p) {
    return TD_MAX(p->monitor_s, TD_MIN(1.0, p->timeout_s / 10.0));
}

/* A host name as one printable token: it travels inside a space-separated heartbeat. */
static void sanitize_host(const char *in, char *out, size_t nbytes) {
    size_t i = 0;
    for (; in[i] && i + 1 < nbytes; i++) {
        unsigned char c = (unsigned char)in[i];
        out[i] = c > ' ' && c < 0x7f ? (char)c : '?';
    }
    out[i] = '\0';
    if (!i) snprintf(out, nbytes, "?");
}

td__stall *td__stall_new(const td__stall_params *p) {
    td__stall *s = td_xcalloc(1, sizeof *s);
    s->p = *p;
    s->ns = td_xstrdup(p->ns);
    s->run_id = td_xstrdup(p->run_id);
    s->p.ns = s->ns;
    s->p.run_id = s->run_id;
    double heartbeat_s = td__stall_heartbeat_ms(p->timeout_s) / 1000.0;
    /* A live worker's record changes at least every heartbeat; its agent reads it every period
     * and the others see it one heartbeat of that agent later. Twice that is still silence from a
     * live process only if it was starved of CPU for that long. */
    s->frozen_s = TD_MAX(p->timeout_s / 2.0, 2.0 * (heartbeat_s + 2.0 * td__stall_period_s(p)));
    s->started_at = td_now_s();
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    sanitize_host(host, s->host, sizeof s->host);
    s->local_key = td_xcalloc((size_t)p->nlocal, sizeof *s->local_key);
    s->local_last = td_xcalloc((size_t)p->nlocal, sizeof *s->local_last);
    s->local_changed = td_xcalloc((size_t)p->nlocal, sizeof *s->local_changed);
    for (int i = 0; i < p->nlocal; i++) {
        s->local_key[i] = td_pg_progress_key(p->run_id, p->restart, p->rank_offset + i);
        s->local_changed[i] = s->started_at;
    }
    s->ranks = td_xcalloc((size_t)p->world_size, sizeof *s->ranks);
    s->nodes = td_xcalloc((size_t)p->nnodes, sizeof *s->nodes);
    for (int m = 0; m < p->nnodes; m++) {
        s->nodes[m].changed_at = s->started_at;
        snprintf(s->nodes[m].host, sizeof s->nodes[m].host, "%s", m == p->node ? s->host : "?");
    }
    return s;
}

void td__stall_free(td__stall *s) {
    if (!s) return;
    for (int i = 0; i < s->p.nlocal; i++) {
        free(s->local_key[i]);
        free(s->local_last[i]);
    }
    free(s->local_key);
    free(s->local_last);
    free(s->local_changed);
    free(s->ranks);
    free(s->nodes);
    free(s->ns);
    free(s->run_id);
    free(s);
}

int td__stall_silent_nodes(const td__stall *s, double min_s) {
    double now = td_now_s();
    int n = 0;
    for (int m = 0; m < s->p.nnodes; m++)
        if (m != s->p.node && now - s->nodes[m].changed_at >= min_s) n++;
    return n;
}

/* ---------------- reading ---------------- */

/* The store's value at key, or NULL when absent. */
static td_status get_opt(td__stall *s, const char *key, char **value, size_t *nbytes) {
    void *v = NULL;
    *value = NULL;
    td_status st = td_store_get(s->p.store, key, &v, nbytes, 0);
    if (st == TD_ERR_NOTFOUND) {
        td_error_clear();
        return TD_OK;
    }
    TD_CHECK(st);
    *value = v;
    return TD_OK;
}

static td_status read_local(td__stall *s, const td__workers *ws, double now) {
    for (int i = 0; i < s->p.nlocal; i++) {
        char *v = NULL;
        size_t n = 0;
        TD_CHECK(get_opt(s, s->local_key[i], &v, &n));
        if (v && (!s->local_last[i] || strcmp(v, s->local_last[i]))) {
            free(s->local_last[i]);
            s->local_last[i] = v;
            s->local_changed[i] = now;
        } else {
            free(v);
        }
        int r = s->p.rank_offset + i;
        if (r < 0 || r >= s->p.world_size) continue;
        rank_view *rv = &s->ranks[r];
        rv->node = s->p.node;
        rv->pid = i < ws->n ? (int)ws->w[i].pid : 0;
        rv->exited = i < ws->n && !ws->w[i].running;
        rv->quiet_s = now - s->local_changed[i];
        rv->known =
            s->local_last[i] &&
            td_pg_progress_parse(s->local_last[i], strlen(s->local_last[i]), &rv->p) == TD_OK;
        if (s->local_last[i] && !rv->known) td_error_clear(); /* not ours to judge: unknown */
    }
    return TD_OK;
}

/* "tdhb1 <counter> <nlocal> <host>\n" and per local rank
 * "<rank> <pid> <exited> <quiet_ms> <progress record or ->\n". The records are re-formatted from
 * what was parsed, so whatever a worker wrote cannot break the lines. */
static td_status publish_beat(td__stall *s) {
    size_t cap = 128 + (size_t)s->p.nlocal * 160;
    char *buf = td_xmalloc(cap);
    size_t off = (size_t)snprintf(buf, cap, SUMMARY_MAGIC " %" PRIu64 " %d %s\n", ++s->counter,
                                  s->p.nlocal, s->host);
    for (int i = 0; i < s->p.nlocal && off < cap; i++) {
        const rank_view *rv = &s->ranks[s->p.rank_offset + i];
        char rec[200] = "-";
        if (rv->known) td_pg_progress_format(&rv->p, rec, sizeof rec);
        off +=
            (size_t)snprintf(buf + off, cap - off, "%d %d %d %lld %s\n", s->p.rank_offset + i,
                             rv->pid, rv->exited ? 1 : 0, (long long)(rv->quiet_s * 1000.0), rec);
    }
    char key[600];
    snprintf(key, sizeof key, "%s/beat/%d", s->ns, s->p.node);
    td_status st = td_store_set(s->p.store, key, buf, TD_MIN(off, cap - 1));
    free(buf);
    return st;
}

/* Another node's heartbeat: its counter says whether its agent runs; its lines fill ranks[]. A
 * malformed one counts as not seen (its agent is then judged by the clock alone). */
static void parse_beat(td__stall *s, int m, char *text, double now) {
    node_view *nv = &s->nodes[m];
    uint64_t counter;
    int nlocal, used = 0;
    char host[128];
    if (sscanf(text, SUMMARY_MAGIC " %" SCNu64 " %d %127s%n", &counter, &nlocal, host, &used) != 3)
        return;
    if (!nv->seen || counter != nv->counter) {
        nv->seen = true;
        nv->counter = counter;
        nv->changed_at = now;
    }
    sanitize_host(host, nv->host, sizeof nv->host);
    char *save = NULL;
    for (char *line = strtok_r(text + used, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        int rank, pid, exited, off = 0;
        long long quiet_ms;
        if (sscanf(line, "%d %d %d %lld %n", &rank, &pid, &exited, &quiet_ms, &off) != 4) continue;
        if (rank < 0 || rank >= s->p.world_size || s->ranks[rank].node == s->p.node) continue;
        rank_view *rv = &s->ranks[rank];
        rv->node = m;
        rv->pid = pid;
        rv->exited = exited != 0;
        /* Its agent measured the silence when it wrote this; it has lasted since, too. */
        rv->quiet_s = (double)quiet_ms / 1000.0 + (now - nv->changed_at);
        rv->known = strcmp(line + off, "-") &&
                    td_pg_progress_parse(line + off, strlen(line + off), &rv->p) == TD_OK;
        td_error_clear();
    }
}

/* ---------------- describing ---------------- */

/* Where a rank is: "allreduce seq 17 (inside it)". */
static void where(const rank_view *rv, char *buf, size_t nbytes) {
    const td_pg_progress *p = &rv->p;
    unsigned long long seq = p->started ? (unsigned long long)(p->started - 1) : 0;
    if (!rv->known)
        snprintf(buf, nbytes, "an unknown point (no progress record)");
    else if (rv->exited)
        snprintf(buf, nbytes, "the end (its process exited)");
    else if (p->state == TD_PG_FAILED)
        snprintf(buf, nbytes, "%s seq %llu (failed)", p->op, seq);
    else if (p->state == TD_PG_CLOSED)
        snprintf(buf, nbytes, "the end (closed its process group after seq %llu)", seq);
    else if (p->started == 0)
        snprintf(buf, nbytes, "the start (no collective yet)");
    else if (p->state == TD_PG_INSIDE)
        snprintf(buf, nbytes, "%s seq %llu (inside it)", p->op, seq);
    else
        snprintf(buf, nbytes, "%s seq %llu (finished it; between collectives)", p->op, seq);
}

/* "rank 3 on node 1 (tdnode2, pid 812)" */
static void who(const td__stall *s, int r, char *buf, size_t nbytes) {
    const rank_view *rv = &s->ranks[r];
    char host[300];
    td_escape_text(host, sizeof host, s->nodes[rv->node].host, strlen(s->nodes[rv->node].host));
    snprintf(buf, nbytes, "rank %d on node %d (%s, pid %d)", r, rv->node, host, rv->pid);
}

/* Appends "0-2,5" for the ranks with mark[r]. */
static void ranges(const bool *mark, int n, char *buf, size_t nbytes) {
    size_t off = strlen(buf);
    bool first = true;
    for (int r = 0; r < n && off + 16 < nbytes; r++) {
        if (!mark[r]) continue;
        int e = r;
        while (e + 1 < n && mark[e + 1]) e++;
        off += (size_t)snprintf(buf + off, nbytes - off, e > r ? "%s%d-%d" : "%s%d",
                                first ? "" : ",", r, e);
        first = false;
        r = e;
    }
}

/* The other ranks, grouped by where they are: "the others at allreduce seq 18 (inside it)" or
 * "ranks 0,2 at ...; rank 3 at ...". */
static void others(const td__stall *s, int skip, char *buf, size_t nbytes) {
    int W = s->p.world_size;
    bool *done = td_xcalloc((size_t)W, sizeof *done);
    bool *mark = td_xcalloc((size_t)W, sizeof *mark);
    done[skip] = true;
    int groups = 0;
    size_t off = 0;
    buf[0] = '\0';
    for (int r = 0; r < W && off + 64 < nbytes; r++) {
        if (done[r]) continue;
        char w[160], w2[160];
        where(&s->ranks[r], w, sizeof w);
        memset(mark, 0, (size_t)W * sizeof *mark);
        int count = 0;
        for (int q = r; q < W; q++) {
            if (done[q]) continue;
            where(&s->ranks[q], w2, sizeof w2);
            if (strcmp(w, w2)) continue;
            mark[q] = done[q] = true;
            count++;
        }
        bool all = groups == 0 && count == W - 1;
        if (all) {
            off += (size_t)snprintf(buf + off, nbytes - off, "the other%s at %s",
                                    count > 1 ? "s" : "", w);
            break;
        }
        char list[128] = "";
        ranges(mark, W, list, sizeof list);
        off += (size_t)snprintf(buf + off, nbytes - off, "%srank%s %s at %s", groups ? "; " : "",
                                count > 1 ? "s" : "", list, w);
        groups++;
    }
    free(done);
    free(mark);
}

/* ---------------- judging ---------------- */

static bool active(const rank_view *rv) {
    return rv->known && !rv->exited &&
           (rv->p.state == TD_PG_INSIDE || rv->p.state == TD_PG_BETWEEN);
}

/* A hash of every position, so "something moved anywhere" is one comparison. */
static uint64_t positions(const td__stall *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int r = 0; r < s->p.world_size; r++) {
        const rank_view *rv = &s->ranks[r];
        uint64_t f[6] = {(uint64_t)r,    rv->known,
                         rv->exited,     rv->p.started,
                         rv->p.finished, rv->p.steps ^ ((uint64_t)rv->p.state << 60)};
        for (int i = 0; i < 6; i++) h = (h ^ f[i]) * 0x100000001b3ull;
    }
    return h;
}

/* Whether anything moved since the last round; if so, the idle clock starts again. */
static bool moved(td__stall *s, double now) {
    uint64_t sig = positions(s);
    if (s->have_sig && sig == s->sig) return false;
    s->sig = sig;
    s->have_sig = true;
    s->progress_at = now;
    s->warned = false;
    return true;
}

/* What the ranks are doing, as judge_workers weighs it. */
typedef struct {
    int first_active; /* the first rank inside or between collectives, or -1 */
    bool any_inside;  /* one of them is inside one */
    uint64_t min_pos; /* the least started + finished among them: the ones furthest behind */
    bool blind;       /* a live rank without a record */
    bool all_same;    /* every active rank is furthest behind: all in one collective */
    int culprit;      /* the rank the others wait for, provably stuck; or -1 */
    int nculprits;
    int busy; /* a rank furthest behind but between collectives and alive; or -1 */
} rank_census;

static void census_active(const td__stall *s, rank_census *c) {
    *c = (rank_census){.first_active = -1, .min_pos = UINT64_MAX, .culprit = -1, .busy = -1};
    for (int r = 0; r < s->p.world_size; r++) {
        const rank_view *rv = &s->ranks[r];
        c->blind |= !rv->known && !rv->exited;
        if (!active(rv)) continue;
        if (c->first_active < 0) c->first_active = r;
        c->any_inside |= rv->p.state == TD_PG_INSIDE;
        c->min_pos = TD_MIN(c->min_pos, rv->p.started + rv->p.finished);
    }
}

/* The ranks the others wait for are those furthest behind: a collective completes only when
 * every rank has reached it. They are stuck if they are inside a collective (the others are
 * there or past it: nothing legitimate keeps them), or silent (their process stopped). One
 * between collectives whose heartbeat goes on is busy, not stuck. When everyone is inside the
 * same collective and nobody is silent, nothing moves between live processes: stuck too. */
static void find_culprit(const td__stall *s, rank_census *c) {
    c->all_same = true;
    for (int r = 0; r < s->p.world_size; r++) {
        const rank_view *rv = &s->ranks[r];
        if (!active(rv)) continue;
        if (rv->p.started + rv->p.finished != c->min_pos) {
            c->all_same = false;
            continue;
        }
        bool silent = rv->quiet_s >= s->frozen_s;
        if (silent || (rv->p.state == TD_PG_INSIDE && !c->blind)) {
            if (c->culprit < 0 || (silent && s->ranks[c->culprit].quiet_s < s->frozen_s))
                c->culprit = r;
            c->nculprits++;
        } else if (c->busy < 0) {
            c->busy = r;
        }
    }
    if (c->all_same) { /* everyone inside one collective: the silent ones, if any, hold it up */
        c->culprit = -1;
        c->nculprits = 0;
        for (int r = 0; r < s->p.world_size; r++)
            if (active(&s->ranks[r]) && s->ranks[r].quiet_s >= s->frozen_s) {
                if (c->culprit < 0) c->culprit = r;
                c->nculprits++;
            }
    }
}

static void say_all_stuck(const td__stall *s, const rank_census *c, double idle, char *cause,
                          size_t nbytes) {
    char w[320];
    int n = 0;
    for (int r = 0; r < s->p.world_size; r++) n += active(&s->ranks[r]);
    where(&s->ranks[c->first_active], w, sizeof w);
    snprintf(cause, nbytes,
             "stall: all %d ranks are at %s and no data moved between them for %.*f s, though "
             "every process runs (a network partition, or a transport that lost a message?) "
             "(--stall-timeout %g)",
             n, w, SECS(idle), s->p.timeout_s);
}

/* Busy between collectives (or not known): said once, by the node it runs on. */
static void warn_busy(td__stall *s, const rank_census *c, double idle) {
    if (s->warned || c->busy < 0 || s->ranks[c->busy].node != s->p.node) return;
    char w[320], rest[400], name[360];
    s->warned = true;
    who(s, c->busy, name, sizeof name);
    where(&s->ranks[c->busy], w, sizeof w);
    others(s, c->busy, rest, sizeof rest);
    TD_LOG_WARN("%s has been at %s for %.*f s, %s; its process is running (an evaluation "
                "or a checkpoint?), so this is no stall; the others' wait is bounded by "
                "TANDEM_COMM_TIMEOUT_MS (%lld ms)",
                name, w, SECS(idle), rest, (long long)td_env_int(TD_ENV_COMM_TIMEOUT_MS));
}

static void say_culprit(const td__stall *s, const rank_census *c, double idle, char *cause,
                        size_t nbytes) {
    char w[320], rest[400], name[360];
    const rank_view *cv = &s->ranks[c->culprit];
    who(s, c->culprit, name, sizeof name);
    where(cv, w, sizeof w);
    others(s, c->culprit, rest, sizeof rest);
    /* A record is a sample, up to a heartbeat old. A live rank has published since it stopped
     * moving, but a silent one's last record may lag far behind (1000 collectives a second,
     * sampled once a second). No rank finishes collective k before every rank has entered it,
     * so the others' progress bounds where it really is. */
    bool is_silent = cv->quiet_s >= s->frozen_s;
    uint64_t entered = 0;
    for (int r = 0; r < s->p.world_size; r++)
        if (s->ranks[r].known) entered = TD_MAX(entered, s->ranks[r].p.finished);
    char at[sizeof w + 96];
    if (is_silent && entered > cv->p.started)
        snprintf(at, sizeof at,
                 "seq %llu or just past it (its last report, %.*f s ago, was %s%s%llu)",
                 (unsigned long long)(entered - 1), SECS(cv->quiet_s), cv->p.op,
                 cv->p.op[0] ? " seq " : "seq ",
                 (unsigned long long)(cv->p.started ? cv->p.started - 1 : 0));
    else
        snprintf(at, sizeof at, "%s", w);
    char silent[96] = "";
    if (is_silent)
        snprintf(silent, sizeof silent,
                 ", and rank %d's process sent no heartbeat for %.*f s "
                 "(stopped or frozen?)",
                 c->culprit, SECS(cv->quiet_s));
    char more[48] = "";
    if (c->nculprits > 1) snprintf(more, sizeof more, " (and %d more like it)", c->nculprits - 1);
    snprintf(cause, nbytes,
             "stall: %s%s is at %s, %s; no progress for %.*f s%s (--stall-timeout %g)", name, more,
             at, rest, SECS(idle), silent, s->p.timeout_s);
}

static void judge_workers(td__stall *s, double now, char *cause, size_t nbytes) {
    if (moved(s, now)) return;
    double idle = now - s->progress_at;
    if (idle < s->p.timeout_s) return;
    rank_census c;
    census_active(s, &c);
    /* Nobody inside a collective: everyone is computing (an evaluation, a checkpoint, a long
     * epoch of a script without collectives). However long, that is work, not a stall. A job
     * whose ranks publish nothing (world size 1, PyTorch) ends here too: liveness only. A rank
     * without a record (its publisher could not reach the store) may be the one the others wait
     * for: then only silence proves anything (c.blind). */
    if (c.first_active < 0 || !c.any_inside) return;
    find_culprit(s, &c);
    if (c.culprit >= 0)
        say_culprit(s, &c, idle, cause, nbytes);
    else if (c.all_same && !c.blind)
        say_all_stuck(s, &c, idle, cause, nbytes);
    else
        warn_busy(s, &c, idle);
}

static void judge_agents(td__stall *s, double now, char *cause, size_t nbytes) {
    for (int m = 0; m < s->p.nnodes; m++) {
        const node_view *nv = &s->nodes[m];
        double age = now - nv->changed_at;
        if (m == s->p.node || age < s->p.timeout_s) continue;
        char host[300], where_was[400] = "", what[160];
        td_escape_text(host, sizeof host, nv->host, strlen(nv->host));
        bool *mark = td_xcalloc((size_t)s->p.world_size, sizeof *mark);
        int first = -1, count = 0;
        for (int r = 0; r < s->p.world_size; r++)
            if (s->ranks[r].node == m && s->ranks[r].known) {
                mark[r] = true;
                count++;
                if (first < 0) first = r;
            }
        if (first >= 0) {
            char list[128] = "";
            ranges(mark, s->p.world_size, list, sizeof list);
            where(&s->ranks[first], what, sizeof what);
            if (count > 1)
                snprintf(where_was, sizeof where_was, "; its ranks %s, rank %d last seen at %s",
                         list, first, what);
            else
                snprintf(where_was, sizeof where_was, "; its rank %s was last seen at %s", list,
                         what);
        }
        free(mark);
        if (nv->seen)
            snprintf(cause, nbytes,
                     "stall: the node agent of node %d (%s) has not updated its heartbeat for %.*f "
                     "s: it is stopped, dead, or cut off from the store%s (--stall-timeout %g)",
                     m, host, SECS(age), where_was, s->p.timeout_s);
        else
            snprintf(cause, nbytes,
                     "stall: the node agent of node %d published no heartbeat in the %.*f s since "
                     "this attempt started: it is stopped, dead, or cut off from the store "
                     "(--stall-timeout %g)",
                     m, SECS(age), s->p.timeout_s);
        return;
    }
}

td_status td__stall_check(td__stall *s, const td__workers *ws, char *cause, size_t nbytes) {
    cause[0] = '\0';
    double now = td_now_s();
    for (int r = 0; r < s->p.world_size; r++) s->ranks[r] = (rank_view){.node = -1};
    TD_CHECK(read_local(s, ws, now));
    if (s->p.nnodes > 1) {
        TD_CHECK(publish_beat(s));
        for (int m = 0; m < s->p.nnodes; m++) {
            if (m == s->p.node) continue;
            char key[600], *v = NULL;
            size_t n = 0;
            snprintf(key, sizeof key, "%s/beat/%d", s->ns, m);
            TD_CHECK(get_opt(s, key, &v, &n));
            if (v) parse_beat(s, m, v, now);
            free(v);
        }
        judge_agents(s, now, cause, nbytes);
        if (cause[0]) return TD_OK;
    }
    /* Ranks no heartbeat told us about stay unknown and are not judged. */
    for (int r = 0; r < s->p.world_size; r++)
        if (s->ranks[r].node < 0) s->ranks[r].node = 0, s->ranks[r].known = false;
    judge_workers(s, now, cause, nbytes);
    return TD_OK;
}
