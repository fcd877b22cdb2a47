/* executors: the supervisor's state machine (src/exec/supervisor.h) against a fake carrier,
 * transition by transition, with no process started. The fake carrier is the test itself: it
 * does what each action asks (start, stop soft or hard, arm a timer) by recording it, and feeds
 * the machine the news a carrier would (running, a node lost, the attempt over) at chosen times.
 * Covered: success; a failure with restarts and doubling backoff, then no restarts left; a
 * worker's own exit code and error line in the note; a preemption (checkpointed, and not); a
 * user stop (tandem stop, Ctrl-C twice, a repeated SIGTERM), its grace running out; a stop
 * during the backoff; max_duration counted from when the nodes run; a lost node; a full disk;
 * a stall (an attempt that ends with the agent's stall cause) restarted; restarts the nodes make
 * themselves counted once. */
#include "test.h"

#include <signal.h>
#include <string.h>

#include "exec/supervisor.h"

/* the fake carrier: what the driver was asked to do, in order */
typedef struct {
    int starts, resumes, soft, hard, ends, restarts_recorded;
    double grace_s, backoff_s, limit_s;
    char said[8][640];
    int nsaid;
} fake;

static void act(fake *f, td__sup_acts a) {
    if (a.todo & TD__SUP_DO_STOP_HARD) f->hard++;
    if (a.todo & TD__SUP_DO_STOP_SOFT) f->soft++;
    if (a.todo & TD__SUP_DO_ARM_GRACE) f->grace_s = a.grace_s;
    if (a.todo & TD__SUP_DO_ARM_BACKOFF) f->backoff_s = a.backoff_s;
    if (a.todo & TD__SUP_DO_ARM_LIMIT) f->limit_s = a.limit_s;
    if (a.todo & TD__SUP_DO_START) {
        f->starts++;
        f->resumes += a.resume;
    }
    if (a.todo & TD__SUP_DO_RESTARTS) f->restarts_recorded++;
    if (a.todo & TD__SUP_DO_END) f->ends++;
    if (a.say[0] && f->nsaid < 8) snprintf(f->said[f->nsaid++], sizeof f->said[0], "%s", a.say);
}

static td__sup_exit ex(int code, int worker_code, const char *cause) {
    td__sup_exit e = {.code = code, .worker_code = worker_code};
    snprintf(e.cause, sizeof e.cause, "%s", cause ? cause : "");
    return e;
}

static void machine(td__sup_machine *m, int max_restarts, double max_duration_s) {
    td__sup_init(m, "r-1");
    m->max_restarts = max_restarts;
    m->max_duration_s = max_duration_s;
    m->grace_s = 45;
}

static void test_success(void) {
    td__sup_machine m;
    fake f = {0};
    machine(&m, 0, 0);
    m.success_note = "on ssh host a";
    act(&f, td__sup_begin(&m, 0));
    ASSERT_EQ(f.starts, 1);
    ASSERT_EQ(f.resumes, 0);
    ASSERT_EQ(m.phase, TD__SUP_STARTING);
    act(&f, td__sup_running(&m, 1));
    ASSERT_EQ(m.phase, TD__SUP_RUNNING);
    ASSERT_EQ(f.limit_s, 0); /* no max_duration: no limit armed */
    td__sup_exit e = ex(0, -1, NULL);
    act(&f, td__sup_exited(&m, &e, 9));
    ASSERT_EQ(f.ends, 1);
    ASSERT_EQ(m.phase, TD__SUP_ENDED);
    ASSERT_EQ(m.outcome.status, TD_RUN_SUCCEEDED);
    ASSERT_EQ(m.outcome.cli_code, 0);
    ASSERT_EQ(m.outcome.exit_code, 0);
    ASSERT_STREQ(m.outcome.note, "on ssh host a");
    /* after the end nothing is asked any more */
    act(&f, td__sup_signal(&m, SIGTERM, false, 10));
    ASSERT_EQ(f.soft, 0);
    ASSERT_EQ(f.hard, 0);
}

/* Two restarts with a doubling pause, each resuming; the third failure ends the run with the
 * failing worker's own exit code and its error line. */
static void test_restarts_backoff(void) {
    td__sup_machine m;
    fake f = {0};
    machine(&m, 2, 0);
    m.base_restarts = 3; /* an earlier supervisor's */
    act(&f, td__sup_begin(&m, 0));
    act(&f, td__sup_running(&m, 1));
    td__sup_exit e = ex(1, 7, "rank 1 failed (exit code 7): ValueError: bad shape");
    act(&f, td__sup_exited(&m, &e, 5));
    ASSERT_EQ(m.phase, TD__SUP_BACKOFF);
    ASSERT_EQ(f.starts, 1); /* not at once */
    ASSERT_NEAR(f.backoff_s, 1.0, 1e-9);
    ASSERT_EQ(m.restarts, 1);
    ASSERT_EQ(td__sup_restarts(&m), 4);
    ASSERT_CONTAINS(f.said[0], "restart 1 of 2");
    ASSERT_CONTAINS(f.said[0], "ValueError: bad shape");
    act(&f, td__sup_backoff_over(&m, 6));
    ASSERT_EQ(f.starts, 2);
    ASSERT_EQ(f.resumes, 1);                /* from the last checkpoint */
    act(&f, td__sup_backoff_over(&m, 6.5)); /* a stale timer: nothing */
    ASSERT_EQ(f.starts, 2);
    act(&f, td__sup_running(&m, 7));
    act(&f, td__sup_exited(&m, &e, 8));
    ASSERT_NEAR(f.backoff_s, 2.0, 1e-9); /* doubled */
    act(&f, td__sup_backoff_over(&m, 10));
    ASSERT_EQ(f.starts, 3);
    act(&f, td__sup_exited(&m, &e, 12));
    ASSERT_EQ(f.starts, 3); /* no restarts left */
    ASSERT_EQ(m.phase, TD__SUP_ENDED);
    ASSERT_EQ(m.outcome.status, TD_RUN_FAILED);
    ASSERT_EQ(m.outcome.cli_code, 1);
    ASSERT_EQ(m.outcome.exit_code, 7); /* the worker's, not the launcher's 1 */
    ASSERT_CONTAINS(m.outcome.note, "ValueError: bad shape");
    ASSERT_CONTAINS(m.outcome.note, "(no restarts left)");
    ASSERT_EQ(m.restarts, 2);
    ASSERT_EQ(td__sup_restarts(&m), 5); /* the true count */

    /* the pause is capped */
    machine(&m, 10, 0);
    m.backoff_max_s = 4;
    fake g = {0};
    act(&g, td__sup_begin(&m, 0));
    for (int i = 0; i < 5; i++) {
        act(&g, td__sup_exited(&m, &e, i));
        act(&g, td__sup_backoff_over(&m, i + 0.5));
    }
    ASSERT_NEAR(g.backoff_s, 4.0, 1e-9);
}

/* A failure without a cause from the records: the note says the code and where to look. */
static void test_failure_without_cause(void) {
    td__sup_machine m;
    fake f = {0};
    machine(&m, 0, 0);
    act(&f, td__sup_begin(&m, 0));
    td__sup_exit e = ex(3, -1, NULL);
    act(&f, td__sup_exited(&m, &e, 1));
    ASSERT_EQ(m.outcome.status, TD_RUN_FAILED);
    ASSERT_EQ(m.outcome.exit_code, 3);
    ASSERT_STREQ(m.outcome.note, "exit code 3; see tandem logs r-1");
}

/* SIGTERM from outside (nobody asked): a preemption; the workers' 143 makes it preempted and
 * resumable, anything else a failure that says the checkpoint is missing. */
static void test_preempt(void) {
    for (int checkpointed = 0; checkpointed < 2; checkpointed++) {
        td__sup_machine m;
        fake f = {0};
        machine(&m, 3, 0);
        act(&f, td__sup_begin(&m, 0));
        act(&f, td__sup_running(&m, 1));
        act(&f, td__sup_signal(&m, SIGTERM, false, 2));
        ASSERT_EQ(f.soft, 1);
        ASSERT_NEAR(f.grace_s, 45, 1e-9);
        ASSERT_EQ(m.phase, TD__SUP_STOPPING);
        ASSERT_CONTAINS(f.said[0], "SIGTERM: preempting run r-1");
        td__sup_exit e = checkpointed ? ex(143, -1, NULL) : ex(1, 2, "rank 0 failed");
        act(&f, td__sup_exited(&m, &e, 3));
        ASSERT_EQ(f.starts, 1); /* a stop is never restarted, restarts or not */
        ASSERT_EQ(m.phase, TD__SUP_ENDED);
        if (checkpointed) {
            ASSERT_EQ(m.outcome.status, TD_RUN_PREEMPTED);
            ASSERT_EQ(m.outcome.cli_code, 143);
            ASSERT_CONTAINS(m.outcome.note, "tandem run --resume r-1");
        } else {
            ASSERT_EQ(m.outcome.status, TD_RUN_FAILED);
            ASSERT_EQ(m.outcome.cli_code, 1);
            ASSERT_CONTAINS(m.outcome.note, "did not all checkpoint and exit 143: rank 0 failed");
        }
    }
    /* The launchers themselves got the SIGTERM (a scheduler signalled them): 143 from an
     * attempt nobody stopped is a preemption too. */
    td__sup_machine m;
    fake f = {0};
    machine(&m, 3, 0);
    act(&f, td__sup_begin(&m, 0));
    td__sup_exit e = ex(143, -1, NULL);
    act(&f, td__sup_exited(&m, &e, 3));
    ASSERT_EQ(f.starts, 1);
    ASSERT_EQ(m.outcome.status, TD_RUN_PREEMPTED);
}

/* tandem stop (a SIGTERM with the request recorded), repeated at once (timeout(1) signals twice)
 * and later (an explicit second request), and the grace running out. */
static void test_user_stop(void) {
    td__sup_machine m;
    fake f = {0};
    machine(&m, 0, 0);
    act(&f, td__sup_begin(&m, 0));
    act(&f, td__sup_running(&m, 1));
    act(&f, td__sup_signal(&m, SIGTERM, true, 2));
    ASSERT_EQ(f.soft, 1);
    ASSERT_CONTAINS(f.said[0], "stopping run r-1");
    act(&f, td__sup_signal(&m, SIGTERM, true, 2.1)); /* the same request */
    ASSERT_EQ(f.soft, 1);
    ASSERT_EQ(f.hard, 0);
    ASSERT_CONTAINS(f.said[1], "taken as the same request");
    act(&f, td__sup_signal(&m, SIGTERM, true, 2 + TD_STOP_REPEAT_GRACE_S + 1));
    ASSERT_EQ(f.hard, 1);
    ASSERT_EQ(m.phase, TD__SUP_KILLING);
    act(&f, td__sup_grace_over(&m, 50)); /* the grace's timer after the hard stop: nothing */
    ASSERT_EQ(f.hard, 1);
    td__sup_exit e = ex(137, -1, NULL);
    act(&f, td__sup_exited(&m, &e, 51));
    ASSERT_EQ(m.outcome.status, TD_RUN_STOPPED);
    ASSERT_EQ(m.outcome.cli_code, 1);
    ASSERT_STREQ(m.outcome.note, "stopped by tandem stop");

    /* Ctrl-C, the workers checkpoint: stopped, 143 */
    machine(&m, 0, 0);
    fake g = {0};
    act(&g, td__sup_begin(&m, 0));
    act(&g, td__sup_running(&m, 1));
    act(&g, td__sup_signal(&m, SIGINT, false, 2));
    ASSERT_EQ(g.soft, 1);
    e = ex(143, -1, NULL);
    act(&g, td__sup_exited(&m, &e, 3));
    ASSERT_EQ(m.outcome.status, TD_RUN_STOPPED);
    ASSERT_EQ(m.outcome.cli_code, 143);
    ASSERT_STREQ(m.outcome.note, "stopped by SIGINT (Ctrl-C) after the workers checkpointed");

    /* Ctrl-C twice: the hard stop at once */
    machine(&m, 0, 0);
    fake h = {0};
    act(&h, td__sup_begin(&m, 0));
    act(&h, td__sup_signal(&m, SIGINT, false, 2));
    act(&h, td__sup_signal(&m, SIGINT, false, 2.2));
    ASSERT_EQ(h.hard, 1);

    /* the grace runs out: the hard stop, said */
    machine(&m, 0, 0);
    fake k = {0};
    act(&k, td__sup_begin(&m, 0));
    act(&k, td__sup_running(&m, 1));
    act(&k, td__sup_signal(&m, SIGHUP, false, 2));
    act(&k, td__sup_grace_over(&m, 47));
    ASSERT_EQ(k.hard, 1);
    ASSERT_EQ(m.phase, TD__SUP_KILLING);
    ASSERT_CONTAINS(k.said[1], "did not exit within 45 s");
    act(&k, td__sup_signal(&m, SIGINT, false, 60)); /* nothing more to ask */
    ASSERT_EQ(k.hard, 1);
    e = ex(-1, -1, NULL);
    act(&k, td__sup_exited(&m, &e, 61));
    ASSERT_STREQ(m.outcome.note, "stopped by SIGHUP before it started");
    ASSERT_EQ(m.outcome.exit_code, -2); /* nothing ran: no exit code */
}

/* A stop between attempts ends the run at once: nothing runs to stop, nothing starts again. */
static void test_stop_in_backoff(void) {
    td__sup_machine m;
    fake f = {0};
    machine(&m, 5, 0);
    act(&f, td__sup_begin(&m, 0));
    td__sup_exit e = ex(1, -1, "node 1 failed");
    act(&f, td__sup_exited(&m, &e, 1));
    ASSERT_EQ(m.phase, TD__SUP_BACKOFF);
    act(&f, td__sup_signal(&m, SIGINT, false, 1.5));
    ASSERT_EQ(f.soft, 0);
    ASSERT_EQ(f.ends, 1);
    ASSERT_EQ(m.outcome.status, TD_RUN_STOPPED);
    act(&f, td__sup_backoff_over(&m, 2));
    ASSERT_EQ(f.starts, 1);
}

/* max_duration counts from when every node runs (not the queue, not the setup), once. */
static void test_max_duration(void) {
    td__sup_machine m;
    fake f = {0};
    machine(&m, 0, 60);
    act(&f, td__sup_begin(&m, 0));
    ASSERT_EQ(f.limit_s, 0);
    act(&f, td__sup_running(&m, 100)); /* it waited 100 s in a queue */
    ASSERT_NEAR(f.limit_s, 60, 1e-9);
    act(&f, td__sup_limit(&m, 160));
    ASSERT_EQ(f.soft, 1);
    ASSERT_CONTAINS(f.said[0], "max_duration of 60 s exceeded; stopping it");
    act(&f, td__sup_limit(&m, 161)); /* under way */
    ASSERT_EQ(f.soft, 1);
    td__sup_exit e = ex(143, -1, NULL);
    act(&f, td__sup_exited(&m, &e, 170));
    ASSERT_EQ(m.outcome.status, TD_RUN_STOPPED);
    ASSERT_EQ(m.outcome.cli_code, 143);
    ASSERT_STREQ(m.outcome.note, "max_duration of 60 s exceeded after the workers checkpointed");

    /* after a restart the limit keeps counting from the first run */
    machine(&m, 1, 60);
    fake g = {0};
    act(&g, td__sup_begin(&m, 0));
    act(&g, td__sup_running(&m, 10));
    e = ex(1, -1, "x");
    act(&g, td__sup_exited(&m, &e, 40));
    act(&g, td__sup_backoff_over(&m, 41));
    g.limit_s = 0;
    act(&g, td__sup_running(&m, 45));
    ASSERT_EQ(g.limit_s, 0); /* armed once, at 10 s, due at 70 s */
}

/* A node lost while the others run: the others are asked to stop; the attempt ends failed with
 * the lost node's words, and a restart follows where one is left. */
static void test_lost_node(void) {
    td__sup_machine m;
    fake f = {0};
    machine(&m, 1, 0);
    act(&f, td__sup_begin(&m, 0));
    act(&f, td__sup_running(&m, 1));
    act(&f, td__sup_node_down(&m, 1, "node 1 (ssh host b): its ssh connection ended", 5));
    ASSERT_EQ(f.soft, 1);
    ASSERT_EQ(m.phase, TD__SUP_STOPPING);
    ASSERT_CONTAINS(f.said[0], "stopping the other nodes");
    act(&f, td__sup_node_down(&m, 0, "node 0 too", 5.5)); /* stopping already */
    ASSERT_EQ(f.soft, 1);
    td__sup_exit e = ex(143, -1, NULL); /* the others checkpointed: still a failure */
    act(&f, td__sup_exited(&m, &e, 6));
    e = ex(1, -1, NULL); /* the lost node's code, as the carrier gives it */
    ASSERT_EQ(m.phase, TD__SUP_BACKOFF);
    act(&f, td__sup_backoff_over(&m, 7));
    ASSERT_EQ(f.starts, 2);
    act(&f, td__sup_running(&m, 8));
    act(&f, td__sup_node_down(&m, 1, "node 1 (ssh host b): lost again", 9));
    act(&f, td__sup_exited(&m, &e, 10));
    ASSERT_EQ(m.outcome.status, TD_RUN_FAILED);
    ASSERT_STREQ(m.outcome.note, "node 1 (ssh host b): lost again (no restarts left)");
    ASSERT_EQ(m.outcome.exit_code, 1);

    /* the lost node's end record names its failing worker: that says more */
    machine(&m, 0, 0);
    fake g = {0};
    act(&g, td__sup_begin(&m, 0));
    act(&g, td__sup_running(&m, 1));
    act(&g, td__sup_node_down(&m, 1, "node 1 (ssh host b): exit code 1", 2));
    e = ex(1, 4, "rank 3 failed (exit code 4): KeyError: 'lr'");
    act(&g, td__sup_exited(&m, &e, 3));
    ASSERT_STREQ(m.outcome.note, "rank 3 failed (exit code 4): KeyError: 'lr'");
    ASSERT_EQ(m.outcome.exit_code, 4);
}

/* A full disk is said once and stops nothing. */
static void test_disk_full(void) {
    td__sup_machine m;
    fake f = {0};
    machine(&m, 0, 0);
    act(&f, td__sup_begin(&m, 0));
    act(&f, td__sup_running(&m, 1));
    act(&f, td__sup_disk_full(&m, 2));
    act(&f, td__sup_disk_full(&m, 3));
    ASSERT_EQ(f.nsaid, 1);
    ASSERT_CONTAINS(f.said[0], "disk of the run store is full");
    ASSERT_EQ(f.soft + f.hard + f.ends, 0);
    ASSERT_EQ(m.phase, TD__SUP_RUNNING);
}

/* A stall: the node's agent ends the workers that stopped stepping and says so in its end
 * record; the supervisor restarts the attempt with that cause, and counts the restarts the
 * agents made themselves once each. */
static void test_stall_and_node_restarts(void) {
    td__sup_machine m;
    fake f = {0};
    machine(&m, 1, 0);
    act(&f, td__sup_begin(&m, 0));
    act(&f, td__sup_running(&m, 1));
    act(&f, td__sup_node_restarts(&m, 1)); /* the agent restarted its workers once */
    ASSERT_EQ(f.restarts_recorded, 1);
    act(&f, td__sup_node_restarts(&m, 1)); /* seen again: nothing new */
    ASSERT_EQ(f.restarts_recorded, 1);
    ASSERT_EQ(td__sup_restarts(&m), 1);
    td__sup_exit e = ex(1, -1, "rank 1 stalled: no step for 30 s");
    e.node_restarts = 2; /* and once more before it gave up */
    act(&f, td__sup_exited(&m, &e, 40));
    ASSERT_EQ(m.phase, TD__SUP_BACKOFF);
    ASSERT_CONTAINS(f.said[0], "rank 1 stalled");
    ASSERT_EQ(td__sup_restarts(&m), 3); /* 2 by the agent, 1 by the supervisor */
    act(&f, td__sup_backoff_over(&m, 41));
    act(&f, td__sup_running(&m, 42));
    act(&f, td__sup_node_restarts(&m, 1)); /* a new attempt counts from 0 again */
    ASSERT_EQ(td__sup_restarts(&m), 4);
    e = ex(0, -1, NULL);
    act(&f, td__sup_exited(&m, &e, 50));
    ASSERT_EQ(m.outcome.status, TD_RUN_SUCCEEDED);
    ASSERT_EQ(td__sup_restarts(&m), 4);
}

/* A spot interruption notice: the workers checkpoint, and the run resumes on a replacement
 * without spending max_restarts (0 here); a second node's notice in the same stop is the same
 * round; the connection of the interrupted node dropping meanwhile is no failure; a user's stop
 * during the checkpoint wins; too many replacements end the run. */
static void test_interruption(void) {
    td__sup_machine m;
    fake f = {0};
    machine(&m, 0, 0);
    act(&f, td__sup_begin(&m, 0));
    act(&f, td__sup_running(&m, 1));
    act(&f, td__sup_node_preempted(&m, 1, "spot interruption notice (terminate at 12:00:00Z)", 5));
    ASSERT_EQ(f.soft, 1);
    ASSERT_EQ(m.phase, TD__SUP_STOPPING);
    ASSERT_CONTAINS(f.said[0], "node 1: spot interruption notice");
    ASSERT_CONTAINS(f.said[0], "resumes on a replacement");
    act(&f, td__sup_node_preempted(&m, 0, "spot interruption notice", 5.2));
    act(&f, td__sup_node_down(&m, 1, "node 1: its ssh connection ended", 5.5));
    ASSERT_EQ(f.soft, 1);
    td__sup_exit e = ex(143, -1, NULL);
    act(&f, td__sup_exited(&m, &e, 6));
    ASSERT_EQ(m.phase, TD__SUP_BACKOFF);
    ASSERT_EQ(f.ends, 0);
    ASSERT_EQ(m.replacements, 1);
    ASSERT_EQ(td__sup_restarts(&m), 1); /* recorded as a restart of the run */
    act(&f, td__sup_backoff_over(&m, 7));
    ASSERT_EQ(f.starts, 2);
    ASSERT_EQ(f.resumes, 1);
    act(&f, td__sup_running(&m, 8));
    e = ex(0, -1, NULL);
    act(&f, td__sup_exited(&m, &e, 20));
    ASSERT_EQ(m.outcome.status, TD_RUN_SUCCEEDED);

    /* a stop during the interruption's checkpoint: the run ends stopped, nothing replaced */
    machine(&m, 0, 0);
    fake g = {0};
    act(&g, td__sup_begin(&m, 0));
    act(&g, td__sup_running(&m, 1));
    act(&g, td__sup_node_preempted(&m, 0, "spot interruption notice", 2));
    act(&g, td__sup_signal(&m, SIGINT, false, 3));
    e = ex(143, -1, NULL);
    act(&g, td__sup_exited(&m, &e, 4));
    ASSERT_EQ(m.outcome.status, TD_RUN_STOPPED);
    ASSERT_EQ(g.starts, 1);

    /* interrupted every time: the bound ends it, with the interruption's words */
    machine(&m, 0, 0);
    fake h = {0};
    act(&h, td__sup_begin(&m, 0));
    for (int i = 0; i <= TD__SUP_MAX_REPLACEMENTS; i++) {
        act(&h, td__sup_running(&m, 10.0 * i + 1));
        act(&h, td__sup_node_preempted(&m, 1, "spot interruption notice", 10.0 * i + 2));
        act(&h, td__sup_exited(&m, &e, 10.0 * i + 3));
        if (m.phase == TD__SUP_BACKOFF) act(&h, td__sup_backoff_over(&m, 10.0 * i + 4));
    }
    ASSERT_EQ(m.phase, TD__SUP_ENDED);
    ASSERT_EQ(m.outcome.status, TD_RUN_FAILED);
    ASSERT_CONTAINS(m.outcome.note, "taken away 50 times");
}

int main(void) {
    test_interruption();
    test_success();
    test_restarts_backoff();
    test_failure_without_cause();
    test_preempt();
    test_user_stop();
    test_stop_in_backoff();
    test_max_duration();
    test_lost_node();
    test_disk_full();
    test_stall_and_node_restarts();
    return 0;
}
