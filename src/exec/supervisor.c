/* The supervisor (supervisor.h): the run's state machine on one event loop, driving a carrier.
 *
 * The loop watches the stop signals (a signalfd) and whatever the carrier watches (its nodes'
 * pipes, children, sockets, its own timers); its timers are the metrics ingest (with the Python
 * SDK's sdk.json, read when it changed) and the
 * system-metrics sample (periodic), and the machine's deadlines (a stop's grace, the pause before
 * a restart, max_duration: one-shot). Every event becomes one call of the machine; what it
 * returns is done here, in one place (act). The loop ends when the machine does. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exec/supervisor.h"

#define INGEST_PERIOD_S 0.5
#define SYSMON_PERIOD_S 2.0

struct td__sup {
    const td_exec_job *job;
    td__carrier *carrier;
    td__sup_machine m;
    td_loop *loop;
    td_ingester *ing;
    td_sdk_watch sdk; /* RUN/sdk.json as last read (the Python SDK's config and summary) */
    uint64_t grace_timer, backoff_timer, limit_timer;
    int recorded_restarts;
};

td_loop *td__sup_loop(td__sup *s) {
    return s->loop;
}

void td__sup_say(td__sup *s, const char *fmt, ...) {
    if (s->carrier->ops->before_say) s->carrier->ops->before_say(s->carrier);
    va_list ap;
    va_start(ap, fmt);
    fputs("tandem: ", s->job->out);
    vfprintf(s->job->out, fmt, ap);
    fputc('\n', s->job->out);
    fflush(s->job->out);
    va_end(ap);
}

static void on_grace(td_loop *l, void *user);
static void on_backoff(td_loop *l, void *user);
static void on_limit(td_loop *l, void *user);

/* Does what the machine asked. */
static void act(td__sup *s, td__sup_acts a) {
    td__carrier *c = s->carrier;
    if (a.say[0]) td__sup_say(s, "%s", a.say);
    if (a.todo & TD__SUP_DO_STOP_HARD) {
        td_loop_cancel(s->loop, s->grace_timer);
        s->grace_timer = 0;
        c->ops->stop(c, true);
    }
    if (a.todo & TD__SUP_DO_STOP_SOFT) c->ops->stop(c, false);
    if (a.todo & TD__SUP_DO_ARM_GRACE) {
        td_loop_cancel(s->loop, s->grace_timer);
        s->grace_timer = td_loop_timer(s->loop, a.grace_s, 0, on_grace, s);
    }
    if (a.todo & TD__SUP_DO_ARM_BACKOFF)
        s->backoff_timer = td_loop_timer(s->loop, a.backoff_s, 0, on_backoff, s);
    if (a.todo & TD__SUP_DO_ARM_LIMIT)
        s->limit_timer = td_loop_timer(s->loop, a.limit_s > 0 ? a.limit_s : 0, 0, on_limit, s);
    if (a.todo & TD__SUP_DO_RESTARTS) {
        int r = td__sup_restarts(&s->m);
        if (r != s->recorded_restarts) {
            if (td_run_set_restarts(s->job->store, s->job->run->id, r) == TD_OK)
                s->recorded_restarts = r;
            else
                td_error_clear(); /* said by the next try, or the end's record */
        }
    }
    if (a.todo & TD__SUP_DO_START) {
        td_loop_cancel(s->loop, s->grace_timer);
        s->grace_timer = 0;
        if (c->ops->start(c, s, a.resume) != TD_OK) {
            /* Nothing of the attempt runs: it is over, and failed. */
            td__sup_exit e = {.code = 1, .worker_code = -1};
            snprintf(e.cause, sizeof e.cause, "cannot start the %s nodes: %s", c->ops->name,
                     td_error_msg());
            td_error_clear();
            act(s, td__sup_exited(&s->m, &e, td_now_s()));
        }
    }
    if (a.todo & TD__SUP_DO_END) td_loop_stop(s->loop);
}

static void on_grace(td_loop *l, void *user) {
    (void)l;
    td__sup *s = user;
    s->grace_timer = 0;
    act(s, td__sup_grace_over(&s->m, td_now_s()));
}

static void on_backoff(td_loop *l, void *user) {
    (void)l;
    td__sup *s = user;
    s->backoff_timer = 0;
    act(s, td__sup_backoff_over(&s->m, td_now_s()));
}

static void on_limit(td_loop *l, void *user) {
    (void)l;
    td__sup *s = user;
    s->limit_timer = 0;
    act(s, td__sup_limit(&s->m, td_now_s()));
}

static void on_signal(td_loop *l, int fd, unsigned events, void *user) {
    (void)l, (void)fd, (void)events;
    td__sup *s = user;
    for (int sig; (sig = td_sigwatch_next(s->job->sigs));) {
        /* Only a first SIGTERM asks the store whether `tandem stop` was behind it. */
        bool asked = sig == SIGTERM && !s->m.stop.active && td_exec_stop_asked((void *)s->job);
        act(s, td__sup_signal(&s->m, sig, asked, td_now_s()));
    }
}

static void on_ingest(td_loop *l, void *user) {
    (void)l;
    td__sup *s = user;
    /* A full disk is said once; the ingester retries from its offset. */
    td_status st = td_ingester_poll(s->ing, NULL);
    if (st == TD_ERR_NOSPACE)
        act(s, td__sup_disk_full(&s->m, td_now_s()));
    else if (st != TD_OK)
        TD_LOG_WARN("metrics ingest: %s (will retry)", td_error_msg());
    td_error_clear();
    /* On the same timer: a running script's config and summary reach the record while it runs
     * (read only when the file changed; a bad file is a warning, once). */
    if (td_run_sdk_sync(s->job->store, s->job->run, &s->sdk, NULL) != TD_OK) {
        TD_LOG_DEBUG("reading sdk.json: %s (will retry)", td_error_msg());
        td_error_clear();
    }
}

static void on_sample(td_loop *l, void *user) {
    (void)l;
    td__sup *s = user;
    s->carrier->ops->sample(s->carrier);
}

void td__sup_running_now(td__sup *s) {
    act(s, td__sup_running(&s->m, td_now_s()));
}

void td__sup_node_lost(td__sup *s, int node, const char *why) {
    act(s, td__sup_node_down(&s->m, node, why, td_now_s()));
}

void td__sup_node_interrupted(td__sup *s, int node, const char *why) {
    act(s, td__sup_node_preempted(&s->m, node, why, td_now_s()));
}

void td__sup_restarts_seen(td__sup *s, int node_restarts) {
    act(s, td__sup_node_restarts(&s->m, node_restarts));
}

void td__sup_attempt_over(td__sup *s, const td__sup_exit *e) {
    act(s, td__sup_exited(&s->m, e, td_now_s()));
}

/* The loop's turns until the machine ends; an epoll failure is said and the supervision goes
 * on, slowly, rather than spin or leave the nodes unwatched. */
static void run_loop(td__sup *s) {
    while (!td_loop_stopped(s->loop))
        if (td_loop_turn(s->loop, -1) != TD_OK) {
            TD_LOG_WARN("event loop: %s", td_error_msg());
            td_error_clear();
            usleep(10000);
        }
}

int td__supervise(const td_exec_job *job, td__carrier *c, int max_restarts, double grace_s,
                  const char *success_note, double t0) {
    td__sup s = {.job = job, .carrier = c, .recorded_restarts = job->base_restarts};
    td__sup_init(&s.m, job->run->id);
    s.m.max_restarts = max_restarts;
    s.m.max_duration_s = job->max_duration_s;
    s.m.grace_s = grace_s;
    s.m.base_restarts = job->base_restarts;
    s.m.resuming = job->resuming;
    s.m.success_note = success_note;

    char *metrics_dir = td_run_path(job->run->run_dir, TD_RUN_PATH_METRICS);
    td_status st = td_ingester_new(job->store, job->run->id, metrics_dir, &s.ing);
    free(metrics_dir);
    if (st == TD_OK) st = td_loop_new(&s.loop);
    if (st == TD_OK) st = td_loop_watch(s.loop, job->sigs->fd, TD_LOOP_READ, on_signal, &s);
    if (st != TD_OK) {
        int cli = td__exec_fail(job, t0, "supervisor error: %s", td_error_msg());
        td_error_print(st);
        td_loop_free(s.loop);
        td_ingester_free(s.ing);
        return cli;
    }
    td_loop_timer(s.loop, 0, INGEST_PERIOD_S, on_ingest, &s);
    if (c->ops->sample) td_loop_timer(s.loop, 0.5, SYSMON_PERIOD_S, on_sample, &s);

    act(&s, td__sup_begin(&s.m, td_now_s()));
    if (job->stop_signal) { /* a stop that came during the setup, before the loop */
        int sig = job->stop_signal;
        bool asked = sig == SIGTERM && td_exec_stop_asked((void *)job);
        act(&s, td__sup_signal(&s.m, sig, asked, td_now_s()));
    }
    run_loop(&s);
    td_loop_free(s.loop);

    if (c->ops->finish) c->ops->finish(c);
    if (c->ops->before_say) c->ops->before_say(c);
    td__exec_final_ingest(job->out, s.ing);
    td_ingester_free(s.ing);
    /* The script's last sdk.json (tandem.finish() writes it as the script ends). */
    if (td_run_sdk_sync(job->store, job->run, &s.sdk, NULL) != TD_OK) {
        TD_LOG_WARN("reading %s/sdk.json at the run's end: %s", job->run->run_dir, td_error_msg());
        td_error_clear();
    }
    if (td__sup_restarts(&s.m) != s.recorded_restarts &&
        td_run_set_restarts(job->store, job->run->id, td__sup_restarts(&s.m)) != TD_OK)
        td_error_clear();
    td__exec_outcome o = s.m.outcome;
    if (c->ops->outcome) c->ops->outcome(c, &s.m, &o);
    return td__exec_record_end(job, &o, t0);
}
