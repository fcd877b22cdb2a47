/* The run's state machine (supervisor.h): what the supervisor does about a signal, a deadline
 * or its carrier's news, and how the run ends. Pure: no process, no I/O, no clock of its own
 * (every event brings `now`), so tests/executors/test_supervisor.c walks each transition. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "exec/supervisor.h"

#define SAY(a, ...) snprintf((a)->say, sizeof(a)->say, __VA_ARGS__)

void td__sup_init(td__sup_machine *m, const char *run_id) {
    memset(m, 0, sizeof *m);
    m->run_id = run_id;
    m->grace_s = 45.0;
    m->backoff_s = 1.0;
    m->backoff_max_s = 30.0;
}

int td__sup_restarts(const td__sup_machine *m) {
    return m->base_restarts + m->restarts + m->replacements + m->node_restarts +
           m->attempt_node_restarts;
}

static td__sup_acts none(void) {
    return (td__sup_acts){0};
}

static td__sup_acts start(td__sup_machine *m, bool resume) {
    td__sup_acts a = none();
    m->phase = TD__SUP_STARTING;
    m->failing = false;
    m->failure[0] = '\0';
    a.todo = TD__SUP_DO_START;
    a.resume = resume;
    return a;
}

td__sup_acts td__sup_begin(td__sup_machine *m, double now) {
    (void)now;
    if (m->phase != TD__SUP_IDLE) return none();
    return start(m, m->resuming);
}

/* The soft stop of a running attempt: the workers checkpoint; the hard stop after the grace. */
static void stop_soft(td__sup_machine *m, td__sup_acts *a) {
    a->todo |= TD__SUP_DO_STOP_SOFT | TD__SUP_DO_ARM_GRACE;
    a->grace_s = m->grace_s;
    m->phase = TD__SUP_STOPPING;
}

static td__sup_acts end(td__sup_machine *m, td__sup_acts a);
static void decide(td__sup_machine *m, const td__sup_exit *e);

/* A stop decision (td_exec_stop's) in the machine's current phase. */
static td__sup_acts stop_step(td__sup_machine *m, td_exec_stop_step step, double now) {
    td__sup_acts a = none();
    switch (step) {
    case TD_EXEC_STOP_NONE:
        return a;
    case TD_EXEC_STOP_SOFT:
        if (m->stop.last_signal)
            SAY(&a,
                "%s run %s (asking the workers to checkpoint and exit; " TD_STOP_ESCALATE_HINT
                " ends them now)",
                m->stop.preempt ? "SIGTERM: preempting" : "stopping", m->run_id);
        else
            SAY(&a, "run %s: %s; stopping it", m->run_id, m->stop.stopped_by);
        if (m->phase == TD__SUP_BACKOFF) { /* between attempts: nothing runs to stop */
            td__sup_exit e = {.code = -1, .worker_code = -1};
            decide(m, &e);
            return end(m, a);
        }
        if (m->phase == TD__SUP_STARTING || m->phase == TD__SUP_RUNNING) stop_soft(m, &a);
        return a;
    case TD_EXEC_STOP_AGAIN:
        if (m->phase == TD__SUP_STOPPING)
            SAY(&a,
                "run %s: SIG%s again %.1f s into the stop, taken as the same request; still "
                "waiting for the workers' checkpoint (" TD_STOP_ESCALATE_HINT " ends them now)",
                m->run_id, sigabbrev_np(m->stop.last_signal), now - m->stop.signals.began_s);
        return a;
    case TD_EXEC_STOP_HARD:
        if (m->phase == TD__SUP_STARTING || m->phase == TD__SUP_RUNNING ||
            m->phase == TD__SUP_STOPPING) {
            a.todo |= TD__SUP_DO_STOP_HARD;
            m->phase = TD__SUP_KILLING;
            SAY(&a, "run %s: ending what is left of it now", m->run_id);
        }
        return a;
    }
    return a;
}

static bool asked_value(void *user) {
    return *(bool *)user;
}

td__sup_acts td__sup_signal(td__sup_machine *m, int sig, bool asked, double now) {
    if (m->phase == TD__SUP_ENDED) return none();
    return stop_step(m, td_exec_stop_signal(&m->stop, sig, now, asked_value, &asked), now);
}

td__sup_acts td__sup_running(td__sup_machine *m, double now) {
    td__sup_acts a = none();
    if (m->phase != TD__SUP_STARTING) return a;
    m->phase = TD__SUP_RUNNING;
    if (m->running_since == 0) m->running_since = now;
    if (m->max_duration_s > 0 && !m->limit_armed) {
        m->limit_armed = true;
        a.todo |= TD__SUP_DO_ARM_LIMIT;
        a.limit_s = m->max_duration_s - (now - m->running_since);
    }
    return a;
}

td__sup_acts td__sup_node_restarts(td__sup_machine *m, int node_restarts) {
    td__sup_acts a = none();
    if (node_restarts <= m->attempt_node_restarts) return a;
    m->attempt_node_restarts = node_restarts;
    a.todo |= TD__SUP_DO_RESTARTS;
    return a;
}

/* A node lost while the others run: they must not train on without it. The first failure is
 * what the run will say; the others are asked to stop (they checkpoint what they can). */
td__sup_acts td__sup_node_down(td__sup_machine *m, int node, const char *why, double now) {
    (void)now;
    td__sup_acts a = none();
    if (m->phase != TD__SUP_STARTING && m->phase != TD__SUP_RUNNING) return a;
    m->failing = true;
    snprintf(m->failure, sizeof m->failure, "%s", why && *why ? why : "a node was lost");
    SAY(&a, "run %s: node %d: %.500s; stopping the other nodes", m->run_id, node, m->failure);
    stop_soft(m, &a);
    return a;
}

/* A machine taken away is the cloud's doing, not the job's: SkyPilot's managed jobs and dstack
 * recover from preemptions without spending the user's restarts on errors, and so does this
 * (up to a bound, so that a machine type that is interrupted at once every time ends the run). A
 * second node's notice during the same stop is the same replacement round. A user's stop wins:
 * the workers' checkpoint then ends the run as stopped. */
td__sup_acts td__sup_node_preempted(td__sup_machine *m, int node, const char *why, double now) {
    (void)now;
    td__sup_acts a = none();
    if (m->phase != TD__SUP_STARTING && m->phase != TD__SUP_RUNNING && m->phase != TD__SUP_STOPPING)
        return a;
    if (m->stop.active || m->failing) return a;
    snprintf(m->replace_why, sizeof m->replace_why, "node %d: %.480s", node,
             why && *why ? why : "its machine is being taken away");
    if (m->phase == TD__SUP_STOPPING) return a;
    m->replacing = true;
    SAY(&a, "run %s: %s; the workers checkpoint, then the run resumes on a replacement machine",
        m->run_id, m->replace_why);
    stop_soft(m, &a);
    return a;
}

/* o->note = a b c d, cut at its size. */
static void join_note(td__exec_outcome *o, const char *a, const char *b, const char *c,
                      const char *d) {
    const char *parts[] = {a, b, c, d};
    size_t len = 0;
    for (size_t i = 0; i < 4; i++) {
        size_t n = strlen(parts[i]);
        if (n > sizeof o->note - 1 - len) n = sizeof o->note - 1 - len;
        memcpy(o->note + len, parts[i], n);
        len += n;
    }
    o->note[len] = '\0';
}

/* The run's outcome from the stop (if any) and how the last attempt ended. */
static void decide(td__sup_machine *m, const td__sup_exit *e) {
    td__exec_outcome *o = &m->outcome;
    memset(o, 0, sizeof *o);
    int code = e->code;
    bool ran = code >= 0;
    o->exit_code = ran ? code : -2;
    if (m->hung) { /* training finished; the exit hung and was ended */
        o->status = m->hung_ok ? TD_RUN_SUCCEEDED : TD_RUN_FAILED;
        o->exit_code = m->hung_ok ? 0 : 1;
        o->cli_code = m->hung_ok ? 0 : 1;
        join_note(o, "", m->hung_note, e->workers[0] ? "; " : "", e->workers);
        return;
    }
    /* A failing worker named by the end records says more than the carrier's first account of
     * the node it ran on ("its ssh connection ended"). */
    const char *cause = e->worker_code >= 0 && e->cause[0] ? e->cause
                        : m->failure[0]                    ? m->failure
                                                           : e->cause;
    if (m->stop.active && !m->stop.preempt) {
        o->status = TD_RUN_STOPPED;
        o->cli_code = code == 143 ? 143 : 1;
        /* What each worker did, where the records say (a worker killed through the shell in
         * front of it exits 143 too): never "checkpointed" for one that was killed. */
        if (ran && e->workers[0] && !e->all_checkpointed)
            join_note(o, m->stop.last_signal ? "stopped by " : "", m->stop.stopped_by, ": ",
                      e->workers);
        else
            snprintf(o->note, sizeof o->note, "%s%s%s", m->stop.last_signal ? "stopped by " : "",
                     m->stop.stopped_by,
                     !ran          ? " before it started"
                     : code == 143 ? " after the workers checkpointed"
                                   : "");
        return;
    }
    if (m->stop.preempt || (code == 143 && !m->failing)) {
        if (code == 143) {
            o->status = TD_RUN_PREEMPTED;
            o->cli_code = 143;
            snprintf(o->note, sizeof o->note,
                     "preempted: the workers checkpointed and exited 143; continue with tandem "
                     "run --resume %s",
                     m->run_id);
        } else {
            o->status = TD_RUN_FAILED;
            o->cli_code = 1;
            char why[800];
            if (cause[0])
                snprintf(why, sizeof why, "%.600s", cause);
            else if (ran)
                snprintf(why, sizeof why, "exit code %d", code);
            else
                snprintf(why, sizeof why, "nothing ran");
            snprintf(o->note, sizeof o->note,
                     "received SIGTERM but the workers did not all checkpoint and exit 143: %.600s",
                     why);
        }
        return;
    }
    if (code == 0 && !m->failing) {
        o->status = TD_RUN_SUCCEEDED;
        o->cli_code = 0;
        snprintf(o->note, sizeof o->note, "%s", m->success_note ? m->success_note : "");
        return;
    }
    o->cli_code = 1;
    if (code == 130 && !m->failing) {
        o->status = TD_RUN_STOPPED;
        snprintf(o->note, sizeof o->note, "the launcher was interrupted (SIGINT)");
        return;
    }
    o->status = TD_RUN_FAILED;
    /* The job's exit code is the failing worker's own, where its end record gives it. */
    if ((code == 1 || code == 255 || code == 143 || !ran) && e->worker_code > 0)
        o->exit_code = e->worker_code;
    if (o->exit_code == 0 || o->exit_code == -2) o->exit_code = 1;
    if (cause[0])
        snprintf(o->note, sizeof o->note, "%.700s%s", cause,
                 m->max_restarts > 0 ? " (no restarts left)" : "");
    else
        snprintf(o->note, sizeof o->note, "exit code %d; see tandem logs %s", o->exit_code,
                 m->run_id);
}

static td__sup_acts end(td__sup_machine *m, td__sup_acts a) {
    m->phase = TD__SUP_ENDED;
    a.todo |= TD__SUP_DO_END;
    return a;
}

td__sup_acts td__sup_exited(td__sup_machine *m, const td__sup_exit *e, double now) {
    (void)now;
    td__sup_acts a = none();
    if (m->phase == TD__SUP_ENDED || m->phase == TD__SUP_IDLE || m->phase == TD__SUP_BACKOFF)
        return a;
    /* the nodes' own restarts of this attempt stay counted */
    if (e->node_restarts > m->attempt_node_restarts) m->attempt_node_restarts = e->node_restarts;
    m->node_restarts += m->attempt_node_restarts;
    m->attempt_node_restarts = 0;
    a.todo |= TD__SUP_DO_RESTARTS;
    if (m->replacing && !m->stop.active) {
        m->replacing = false;
        if (m->replacements < TD__SUP_MAX_REPLACEMENTS) {
            m->replacements++;
            m->failing = false;
            m->failure[0] = '\0';
            SAY(&a,
                "run %s: the workers stopped (exit code %d); replacing the machine and resuming "
                "from the last checkpoint (replacement %d)",
                m->run_id, e->code, m->replacements);
            m->phase = TD__SUP_BACKOFF;
            a.todo |= TD__SUP_DO_ARM_BACKOFF;
            a.backoff_s = m->backoff_s;
            return a;
        }
        m->failing = true;
        snprintf(m->failure, sizeof m->failure,
                 "%.400s; not replaced: the run's machines were taken away %d times already",
                 m->replace_why, m->replacements);
    }
    if (m->hung) { /* the workers had finished: nothing to restart */
        decide(m, e);
        return end(m, a);
    }
    /* 143 without a lost node is the workers' checkpoint (a stop or a preemption): no failure */
    bool failed = m->failing || (e->code != 0 && e->code != 143);
    if (failed && !m->stop.active && m->restarts < m->max_restarts) {
        m->restarts++;
        double pause = m->backoff_s;
        for (int i = 1; i < m->restarts && pause < m->backoff_max_s; i++) pause *= 2;
        if (pause > m->backoff_max_s) pause = m->backoff_max_s;
        const char *why = e->worker_code >= 0 && e->cause[0] ? e->cause
                          : m->failure[0]                    ? m->failure
                                                             : e->cause;
        SAY(&a,
            "run %s: %.400s%srestarting every node from the last checkpoint in %.0f s (restart %d "
            "of "
            "%d)",
            m->run_id, why, why[0] ? "; " : "", pause, m->restarts, m->max_restarts);
        m->phase = TD__SUP_BACKOFF;
        a.todo |= TD__SUP_DO_ARM_BACKOFF;
        a.backoff_s = pause;
        return a;
    }
    decide(m, e);
    return end(m, a);
}

td__sup_acts td__sup_limit(td__sup_machine *m, double now) {
    if (m->phase == TD__SUP_ENDED) return none();
    return stop_step(m, td_exec_stop_max_duration(&m->stop, m->max_duration_s, now), now);
}

td__sup_acts td__sup_grace_over(td__sup_machine *m, double now) {
    (void)now;
    td__sup_acts a = none();
    if (m->phase != TD__SUP_STOPPING) return a;
    m->phase = TD__SUP_KILLING;
    m->stop.hard = m->stop.active; /* a later signal asks nothing more */
    a.todo |= TD__SUP_DO_STOP_HARD;
    SAY(&a, "run %s: the workers did not exit within %.0f s of the stop; ending them now",
        m->run_id, m->grace_s);
    return a;
}

td__sup_acts td__sup_backoff_over(td__sup_machine *m, double now) {
    (void)now;
    if (m->phase != TD__SUP_BACKOFF) return none();
    return start(m, true);
}

td__sup_acts td__sup_exit_hung(td__sup_machine *m, const char *note, bool ok, double now) {
    (void)now;
    td__sup_acts a = none();
    if ((m->phase != TD__SUP_STARTING && m->phase != TD__SUP_RUNNING) || m->stop.active ||
        m->failing || m->hung)
        return a;
    m->hung = true;
    m->hung_ok = ok;
    snprintf(m->hung_note, sizeof m->hung_note, "%s", note);
    SAY(&a, "run %s: %.500s; stopping the workers", m->run_id, note);
    stop_soft(m, &a);
    return a;
}

td__sup_acts td__sup_disk_full(td__sup_machine *m, double now) {
    (void)now;
    td__sup_acts a = none();
    if (m->disk_full_said || m->phase == TD__SUP_ENDED) return a;
    m->disk_full_said = true;
    SAY(&a,
        "run %s: the disk of the run store is full; the run goes on and its metrics are stored "
        "once there is room again (free some space)",
        m->run_id);
    return a;
}
