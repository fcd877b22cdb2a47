/* The spot watch (TANDEM_SPOT_WATCH=1): the node agent asks the instance metadata service
 * (IMDSv2, cloud.h's client) every TANDEM_SPOT_WATCH_PERIOD seconds whether EC2 announced an
 * interruption of this spot instance or recommends a rebalance. The HTTP calls block (up to 2 s
 * each), so each look is work on the loop's threads (td_loop_queue_work, loop.h): a timer queues
 * it, and what it found comes back to the agent's loop, where everything the agent does about it
 * (log, note, stop) happens, in the agent's thread, before the next look is timed:
 *   - an instance-action notice (once): log it, note "interrupted ACTION TIME" to the
 *     supervisor, and stop the workers as a SIGTERM does (they checkpoint: the trainer reduces
 *     its stop flag across ranks, and the agent tells the other nodes through the store's `stop`
 *     key), so the agent exits 143 like a stopped one; no look after it;
 *   - a rebalance recommendation (once): log it and note "rebalance TIME"; training goes on;
 *   - no answer: one warning, then quiet retries, since a notice must not be missed if the
 *     service comes back. */
#include "launch_internal.h"

#include "tandem/cloud.h"
#include "tandem/loop.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

typedef enum { EV_ACTION, EV_REBALANCE, EV_DOWN, EV_UP } ev_kind;

/* One finding of a look, handed to the loop. */
typedef struct {
    int kind;
    td_spot_notice notice;
    char text[400]; /* EV_DOWN: why; EV_ACTION: a parse problem, or "" */
} event;

struct td__spot_watch {
    const td_launch_options *o;
    td_loop *loop;
    td_imds_t *imds;
    double period_s;
    char url[256];
    uint64_t timer; /* the next look's timer, or 0 */
    uint64_t job;   /* the look in progress on the loop's threads, or 0 */
    /* The look's own (written by the work while job is set, read by the loop after it) */
    bool action_seen, rebalance_seen, thread_down;
    event found[2]; /* a notice, and a change of the service's answering */
    int nfound;
    /* the loop's side */
    bool warned;  /* the one warning that the service does not answer was given */
    bool down;    /* it did not answer last time */
    char *cause;  /* set once a notice stopped the agent: the end record's cause */
    bool stopped; /* the action notice was acted on */
};

static void found(td__spot_watch *w, const event *e) {
    if (w->nfound < (int)TD_ARRAY_LEN(w->found)) w->found[w->nfound++] = *e;
}

/* One look at path: 1 the document is there (*body), 0 not (404), -1 no answer (*why). */
static int look(td__spot_watch *w, const char *path, char **body, char *why, size_t why_nbytes) {
    int status = 0;
    td_status st = td_imds_get(w->imds, path, body, &status);
    if (st != TD_OK) {
        snprintf(why, why_nbytes, "%s", td_error_msg());
        td_error_clear();
        return -1;
    }
    return *body ? 1 : 0;
}

/* One look at a notice's document: when it is there (1), *e is the finding of that kind, kept
 * for the loop; a document that does not parse still counts (the instance goes away, or is at risk,
 * whatever else it says) with the fallback action and the parser's complaint in e->text. 0 not
 * (yet), -1 no answer (e->text says why). */
static int look_notice(td__spot_watch *w, const char *path, int kind,
                       td_status (*parse)(const char *, td_spot_notice *), const char *fallback,
                       event *e) {
    char *body = NULL;
    int r = look(w, path, &body, e->text, sizeof e->text);
    if (r == 1) {
        e->kind = kind;
        if (parse(body, &e->notice) != TD_OK) {
            snprintf(e->text, sizeof e->text, "%s", td_error_msg());
            td_error_clear();
            snprintf(e->notice.action, sizeof e->notice.action, "%s", fallback);
            snprintf(e->notice.time, sizeof e->notice.time, "unknown");
        }
        found(w, e);
    }
    free(body);
    return r;
}

/* The work of one look, on a thread of the loop's: the action notice, else (until one was
 * seen) the rebalance recommendation, and whether the service stopped or started answering. */
static void look_work(void *user) {
    td__spot_watch *w = user;
    w->nfound = 0;
    event e = {0};
    int r = look_notice(w, TD_IMDS_SPOT_ACTION, EV_ACTION, td_spot_action_parse, "terminate", &e);
    if (r == 1) {
        w->action_seen = true;
    } else if (r == 0 && !w->rebalance_seen) {
        r = look_notice(w, TD_IMDS_REBALANCE, EV_REBALANCE, td_spot_rebalance_parse, "rebalance",
                        &e);
        w->rebalance_seen = r == 1;
    }
    if ((r < 0) != w->thread_down) {
        w->thread_down = r < 0;
        event d = {.kind = w->thread_down ? EV_DOWN : EV_UP};
        snprintf(d.text, sizeof d.text, "%s", w->thread_down ? e.text : "");
        found(w, &d);
    }
}

static void look_done(td_loop *l, void *user);

/* The timer: the next look, on the loop's threads. */
static void look_now(td_loop *l, void *user) {
    td__spot_watch *w = user;
    w->timer = 0;
    w->job = td_loop_queue_work(l, look_work, look_done, w);
    if (!w->job) {
        TD_LOG_WARN("spot watch: %s; trying again in %g s", td_error_msg(), w->period_s);
        td_error_clear();
        w->timer = td_loop_timer(l, w->period_s, 0, look_now, w);
    }
}

/* On the agent's loop: one finding. */
static void handle(td__spot_watch *w, const event *ep) {
    const event e = *ep;
    const td_spot_notice *sn = &e.notice;
    switch (e.kind) {
    case EV_DOWN:
        w->down = true;
        if (!w->warned)
            TD_LOG_WARN("TANDEM_SPOT_WATCH=1 but the instance metadata service at %s does not "
                        "answer: %s; still asking every %g s, quietly (is this an EC2 "
                        "instance? AWS_EC2_METADATA_SERVICE_ENDPOINT overrides the address)",
                        w->url, e.text, w->period_s);
        else
            TD_LOG_DEBUG("the instance metadata service at %s does not answer: %s", w->url,
                         e.text);
        w->warned = true;
        break;
    case EV_UP:
        if (w->down)
            TD_LOG_INFO("the instance metadata service at %s answers again; watching for "
                        "spot interruption notices",
                        w->url);
        w->down = false;
        break;
    case EV_REBALANCE: {
        TD_LOG_WARN("spot rebalance recommendation (notice time %s): this instance is at "
                    "elevated risk of interruption; training goes on%s%s",
                    sn->time, e.text[0] ? "; " : "", e.text);
        if (w->o->on_note) w->o->on_note(w->o->executor_link, "rebalance", sn->time);
        break;
    }
    case EV_ACTION: {
        if (w->stopped) break;
        w->stopped = true;
        char in[48] = "?";
        if (sn->time_wall_s > 0)
            snprintf(in, sizeof in, "%.0f", TD_MAX(0.0, sn->time_wall_s - td_wall_s()));
        TD_LOG_WARN("spot interruption notice: this instance will %s at %s (in %s s); the "
                    "workers checkpoint and stop%s%s%s",
                    sn->action, sn->time, in, e.text[0] ? " (" : "", e.text,
                    e.text[0] ? ")" : "");
        char value[80];
        snprintf(value, sizeof value, "%s %s", sn->action, sn->time);
        if (w->o->on_note) w->o->on_note(w->o->executor_link, "interrupted", value);
        w->cause = td_xasprintf("spot interruption notice: the instance will %s at %s",
                                sn->action, sn->time);
        /* As a SIGTERM from the supervisor (agent_link.c stop_self): to this thread, which
         * has it blocked and reads it from the agent's signalfd in whatever phase it is. */
        raise(SIGTERM);
        break;
    }
    }
}

/* On the agent's loop: what the look found; then the next look, unless the notice came. */
static void look_done(td_loop *l, void *user) {
    td__spot_watch *w = user;
    w->job = 0;
    for (int i = 0; i < w->nfound; i++) handle(w, &w->found[i]);
    if (!w->action_seen) w->timer = td_loop_timer(l, w->period_s, 0, look_now, w);
}

td_status td__spot_watch_start(td_loop *loop, const td_launch_options *o, td__spot_watch **out) {
    *out = NULL;
    const char *on = td_var_get(TD_VAR_TANDEM_SPOT_WATCH);
    if (!on || !strcmp(on, "0")) return TD_OK;
    if (strcmp(on, "1"))
        return td_error(TD_ERR_USAGE, "%s=%s: give 1 (watch for spot interruptions) or 0",
                        td_var_name(TD_VAR_TANDEM_SPOT_WATCH), on);
    const char *ps = td_env_str(TD_ENV_SPOT_WATCH_PERIOD);
    char *end = NULL;
    double period = strtod(ps, &end);
    if (!(end && end != ps && !*end && period >= 0.05 && period <= 3600))
        return td_error(TD_ERR_USAGE,
                        "TANDEM_SPOT_WATCH_PERIOD=%s: give seconds between 0.05 and 3600 (EC2 "
                        "gives two minutes' notice; the default is 2)",
                        ps);
    td__spot_watch *w = td_xcalloc(1, sizeof *w);
    w->o = o;
    w->loop = loop;
    w->period_s = period;
    td_status st = td_imds_new(NULL, &w->imds);
    if (st != TD_OK) {
        st = td_error(TD_ERR_USAGE, "%s=1: %s", td_var_name(TD_VAR_TANDEM_SPOT_WATCH),
                      td_error_msg());
        td__spot_watch_free(w);
        return st;
    }
    snprintf(w->url, sizeof w->url, "%s", td_imds_endpoint(w->imds));
    /* The first look at once: a notice may be there already. */
    w->timer = td_loop_timer(loop, 0, 0, look_now, w);
    TD_LOG_INFO("watching the instance metadata service at %s for spot interruption notices "
                "every %g s (%s=1)",
                w->url, period, td_var_name(TD_VAR_TANDEM_SPOT_WATCH));
    *out = w;
    return TD_OK;
}

const char *td__spot_watch_cause(const td__spot_watch *w) {
    return w ? w->cause : NULL;
}

void td__spot_watch_free(td__spot_watch *w) {
    if (!w) return;
    if (w->loop) {
        td_loop_cancel(w->loop, w->timer);
        if (w->job) {
            td_imds_cancel(w->imds); /* a call in flight ends now, not at its timeout */
            td_loop_cancel_work(w->loop, w->job);
        }
    }
    td_imds_free(w->imds);
    free(w->cause);
    free(w);
}
