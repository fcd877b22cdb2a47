/* The spot watch (TANDEM_SPOT_WATCH=1): the node agent asks the instance metadata service
 * (IMDSv2, cloud.h's client) every TANDEM_SPOT_WATCH_PERIOD seconds whether EC2 announced an
 * interruption of this spot instance or recommends a rebalance. The HTTP calls block (up to 2 s
 * each), so they run on a thread of their own; what it finds comes back to the agent's loop
 * through a pipe, and everything the agent does about it (log, note, stop) happens there, in the
 * agent's thread:
 *   - an instance-action notice (once): log it, note "interrupted ACTION TIME" to the
 *     supervisor, and stop the workers as a SIGTERM does (they checkpoint: the trainer reduces
 *     its stop flag across ranks, and the agent tells the other nodes through the store's `stop`
 *     key), so the agent exits 143 like a stopped one;
 *   - a rebalance recommendation (once): log it and note "rebalance TIME"; training goes on;
 *   - no answer: one warning, then quiet retries, since a notice must not be missed if the
 *     service comes back. */
#include "launch_internal.h"

#include "tandem/cloud.h"
#include "tandem/loop.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum { EV_ACTION, EV_REBALANCE, EV_DOWN, EV_UP } ev_kind;

/* One finding, written whole (well below PIPE_BUF, so a write never interleaves). */
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
    int ev[2];   /* the thread's findings -> the loop */
    int wake[2]; /* written to end the thread's sleep when it must quit */
    pthread_t thread;
    bool started;
    atomic_bool quit;
    /* the loop's side */
    bool warned;  /* the one warning that the service does not answer was given */
    bool down;    /* it did not answer last time */
    char *cause;  /* set once a notice stopped the agent: the end record's cause */
    bool stopped; /* the action notice was acted on */
};

static void send_event(td__spot_watch *w, const event *e) {
    /* A full pipe cannot happen (each finding is sent once; DOWN/UP alternate at most once a
     * period), and a failed write loses one message, nothing else. */
    ssize_t n;
    do n = write(w->ev[1], e, sizeof *e);
    while (n < 0 && errno == EINTR);
}

/* Sleeps period_s; false when asked to quit meanwhile. */
static bool nap(td__spot_watch *w) {
    struct pollfd p = {.fd = w->wake[0], .events = POLLIN};
    int ms = (int)(w->period_s * 1000);
    while (poll(&p, 1, ms) < 0 && errno == EINTR) {
    }
    return !atomic_load(&w->quit);
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

/* One look at a notice's document: when it is there (1), *e is the finding of that kind, sent to
 * the loop; a document that does not parse still counts (the instance goes away, or is at risk,
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
        send_event(w, e);
    }
    free(body);
    return r;
}

static void *watch(void *arg) {
    td__spot_watch *w = arg;
    bool action_seen = false, rebalance_seen = false, down = false;
    while (!atomic_load(&w->quit) && !action_seen) {
        event e = {0};
        int r =
            look_notice(w, TD_IMDS_SPOT_ACTION, EV_ACTION, td_spot_action_parse, "terminate", &e);
        if (r == 1) {
            action_seen = true;
        } else if (r == 0 && !rebalance_seen) {
            r = look_notice(w, TD_IMDS_REBALANCE, EV_REBALANCE, td_spot_rebalance_parse,
                            "rebalance", &e);
            rebalance_seen = r == 1;
        }
        if (r < 0 && atomic_load(&w->quit)) break; /* cancelled, not down */
        if ((r < 0) != down) {
            down = r < 0;
            event d = {.kind = down ? EV_DOWN : EV_UP};
            snprintf(d.text, sizeof d.text, "%s", down ? e.text : "");
            send_event(w, &d);
        }
        if (!action_seen && !nap(w)) break;
    }
    return NULL;
}

/* On the agent's loop: what the thread found. */
static void on_event(td_loop *l, int fd, unsigned events, void *user) {
    (void)l, (void)events;
    td__spot_watch *w = user;
    event e;
    ssize_t n;
    while ((n = read(fd, &e, sizeof e)) == (ssize_t)sizeof e) {
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
    w->ev[0] = w->ev[1] = w->wake[0] = w->wake[1] = -1;
    atomic_init(&w->quit, false);
    td_status st = td_imds_new(NULL, &w->imds);
    if (st != TD_OK) {
        st = td_error(TD_ERR_USAGE, "%s=1: %s", td_var_name(TD_VAR_TANDEM_SPOT_WATCH),
                      td_error_msg());
        goto fail;
    }
    snprintf(w->url, sizeof w->url, "%s", td_imds_endpoint(w->imds));
    if (pipe2(w->ev, O_CLOEXEC | O_NONBLOCK) != 0 || pipe2(w->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        st = td_error_errno(TD_ERR_SYS, "spot watch: pipe");
        goto fail;
    }
    TD_CHECK_GOTO(td_loop_watch(loop, w->ev[0], TD_LOOP_READ, on_event, w), st, fail);
    /* The thread inherits the agent's mask, with the signals of its signalfd blocked. */
    if (pthread_create(&w->thread, NULL, watch, w) != 0) {
        td_loop_unwatch(loop, w->ev[0]);
        st = td_error(TD_ERR_SYS, "spot watch: cannot start its thread");
        goto fail;
    }
    w->started = true;
    TD_LOG_INFO("watching the instance metadata service at %s for spot interruption notices "
                "every %g s (%s=1)",
                w->url, period, td_var_name(TD_VAR_TANDEM_SPOT_WATCH));
    *out = w;
    return TD_OK;
fail:
    td__spot_watch_free(w);
    return st;
}

const char *td__spot_watch_cause(const td__spot_watch *w) {
    return w ? w->cause : NULL;
}

void td__spot_watch_free(td__spot_watch *w) {
    if (!w) return;
    if (w->started) {
        atomic_store(&w->quit, true);
        td_imds_cancel(w->imds); /* a call in flight ends now, not at its timeout */
        ssize_t n = write(w->wake[1], "q", 1);
        (void)n;
        pthread_join(w->thread, NULL);
    }
    if (w->ev[0] >= 0) td_loop_unwatch(w->loop, w->ev[0]);
    for (int i = 0; i < 2; i++) {
        if (w->ev[i] >= 0) close(w->ev[i]);
        if (w->wake[i] >= 0) close(w->wake[i]);
    }
    td_imds_free(w->imds);
    free(w->cause);
    free(w);
}
