/* executors: the supervisor at work (td__supervise, src/exec/supervisor.c) on its real event
 * loop, against a fake carrier that starts no process: its "nodes" are timers on the
 * supervisor's loop that end the attempt with a scripted exit. Asserts what the machine's own
 * test cannot: that the driver does what the machine asks, in time, and records it.
 * - a failing first attempt is restarted after the backoff (a real timer, about 1 s), resuming,
 *   and the run ends succeeded with restarts 1 in the store and the CLI code 0;
 * - max_duration fires on the loop: the carrier is asked to stop softly, ends 143, and the run
 *   is stopped with the note naming max_duration;
 * - a SIGINT to this process (the supervisor's signalfd) stops the run the same way;
 * - the grace running out asks the carrier for the hard stop;
 * - a carrier that cannot start fails the run with its message. */
#include "test.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exec/supervisor.h"

typedef struct {
    td__carrier base;
    td__sup *sup;
    int starts, resumed, soft, hard;
    int fail_first;   /* the first attempt fails (code 1) after 50 ms */
    bool until_stop;  /* the attempt runs until asked to stop */
    bool ignore_soft; /* ... and ignores the soft stop */
    bool cannot_start;
    uint64_t timer;
} fake_carrier;

static void end_attempt(fake_carrier *f, int code, const char *cause) {
    td__sup_exit e = {.code = code, .worker_code = -1};
    snprintf(e.cause, sizeof e.cause, "%s", cause ? cause : "");
    td__sup_attempt_over(f->sup, &e);
}

static void on_done(td_loop *l, void *user) {
    (void)l;
    fake_carrier *f = user;
    f->timer = 0;
    if (f->fail_first && f->starts == 1)
        end_attempt(f, 1, "rank 0 failed (exit code 1): RuntimeError: boom");
    else
        end_attempt(f, 0, NULL);
}

static td_status fake_start(td__carrier *c, td__sup *s, bool resume) {
    fake_carrier *f = (fake_carrier *)c;
    f->sup = s;
    if (f->cannot_start) return td_error(TD_ERR_IO, "no such host: node-7");
    f->starts++;
    f->resumed += resume;
    td__sup_running_now(s);
    if (!f->until_stop) f->timer = td_loop_timer(td__sup_loop(s), 0.05, 0, on_done, f);
    return TD_OK;
}

static void fake_stop(td__carrier *c, bool hard) {
    fake_carrier *f = (fake_carrier *)c;
    if (hard) {
        f->hard++;
        end_attempt(f, 137, NULL);
        return;
    }
    f->soft++;
    if (!f->ignore_soft) end_attempt(f, 143, NULL); /* the workers checkpointed */
}

static const td__carrier_ops fake_ops = {.name = "fake", .start = fake_start, .stop = fake_stop};

typedef struct {
    char dir[256];
    td_rundb *store;
    td_run run;
    td_sigwatch sigs;
    FILE *out;
    char *out_text;
    size_t out_len;
    td_exec_job job;
} fixture;

static void fixture_init(fixture *fx, const char *name) {
    snprintf(fx->dir, sizeof fx->dir, "/tmp/td_sup_driver_%d_%s", (int)getpid(), name);
    char *cmd = td_xasprintf("rm -rf '%s' && mkdir -p '%s'", fx->dir, fx->dir);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    ASSERT_OK(td_rundb_open(fx->dir, &fx->store));
    td_run_spec spec = {.workflow = name, .command = "true", .nodes = 1, .nproc_per_node = 1};
    ASSERT_OK(td_run_create(fx->store, &spec, &fx->run));
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};
    ASSERT_OK(td_sigwatch_open(&fx->sigs, sigs, 4));
    fx->out = open_memstream(&fx->out_text, &fx->out_len);
    fx->job = (td_exec_job){.store = fx->store,
                            .run = &fx->run,
                            .work_dir = fx->dir,
                            .sigs = &fx->sigs,
                            .out = fx->out};
}

static void fixture_check(fixture *fx, td_run_status status, int restarts, const char *note) {
    td_run cur = {0};
    ASSERT_OK(td_run_find(fx->store, fx->run.id, &cur));
    if (cur.status != status || cur.restarts != restarts ||
        (note[0] && (!cur.note || !strstr(cur.note, note))))
        TEST_FAIL("run %s: status %s restarts %d note '%s'; expected %s, %d, '%s'\noutput:\n%s",
                  cur.id, td_run_status_str(cur.status), cur.restarts, cur.note ? cur.note : "",
                  td_run_status_str(status), restarts, note, fx->out_text);
    td_run_clear(&cur);
}

static void fixture_free(fixture *fx) {
    fclose(fx->out);
    free(fx->out_text);
    td_sigwatch_close(&fx->sigs);
    td_run_clear(&fx->run);
    td_rundb_close(fx->store);
    char *cmd = td_xasprintf("rm -rf '%s'", fx->dir);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
}

static void test_restart_after_backoff(void) {
    fixture fx;
    fixture_init(&fx, "restart");
    fake_carrier f = {.base = {&fake_ops}, .fail_first = 1};
    double t0 = td_now_s();
    int cli = td__supervise(&fx.job, &f.base, 1, 45, "", t0);
    double took = td_now_s() - t0;
    fflush(fx.out);
    ASSERT_EQ(cli, 0);
    ASSERT_EQ(f.starts, 2);
    ASSERT_EQ(f.resumed, 1);
    ASSERT_GE(took, 0.9); /* the backoff's pause, 1 s, was waited */
    ASSERT_CONTAINS(fx.out_text, "RuntimeError: boom; restarting every node");
    fixture_check(&fx, TD_RUN_SUCCEEDED, 1, "");
    fixture_free(&fx);
}

static void test_max_duration(void) {
    fixture fx;
    fixture_init(&fx, "limit");
    fx.job.max_duration_s = 0.2;
    fake_carrier f = {.base = {&fake_ops}, .until_stop = true};
    int cli = td__supervise(&fx.job, &f.base, 0, 45, "", td_now_s());
    ASSERT_EQ(cli, 143);
    ASSERT_EQ(f.soft, 1);
    ASSERT_EQ(f.hard, 0);
    fixture_check(&fx, TD_RUN_STOPPED, 0, "max_duration of 0 s exceeded after the workers");
    fixture_free(&fx);
}

static void on_raise(td_loop *l, void *user) {
    (void)l, (void)user;
    raise(SIGINT); /* blocked: it waits on the supervisor's signalfd */
}

/* The carrier's start also arms a timer that sends us SIGINT. */
static td_status start_then_interrupt(td__carrier *c, td__sup *s, bool resume) {
    td_loop_timer(td__sup_loop(s), 0.1, 0, on_raise, NULL);
    return fake_start(c, s, resume);
}

static void test_signal_and_grace(void) {
    td__carrier_ops ops = fake_ops;
    ops.start = start_then_interrupt;
    fixture fx;
    fixture_init(&fx, "sigint");
    fake_carrier f = {.base = {&ops}, .until_stop = true};
    int cli = td__supervise(&fx.job, &f.base, 0, 45, "", td_now_s());
    ASSERT_EQ(cli, 143);
    ASSERT_EQ(f.soft, 1);
    fixture_check(&fx, TD_RUN_STOPPED, 0, "stopped by SIGINT (Ctrl-C) after the workers");
    fixture_free(&fx);

    /* the workers do not stop: after the grace, the hard stop */
    fixture_init(&fx, "grace");
    fake_carrier g = {.base = {&ops}, .until_stop = true, .ignore_soft = true};
    double t0 = td_now_s();
    cli = td__supervise(&fx.job, &g.base, 0, 0.3, "", t0);
    ASSERT_EQ(cli, 1);
    ASSERT_EQ(g.soft, 1);
    ASSERT_EQ(g.hard, 1);
    ASSERT_GE(td_now_s() - t0, 0.35); /* 0.1 s to the signal, then the grace */
    fixture_check(&fx, TD_RUN_STOPPED, 0, "stopped by SIGINT (Ctrl-C)");
    fixture_free(&fx);
}

static void test_cannot_start(void) {
    fixture fx;
    fixture_init(&fx, "nostart");
    fake_carrier f = {.base = {&fake_ops}, .cannot_start = true};
    int cli = td__supervise(&fx.job, &f.base, 0, 45, "", td_now_s());
    ASSERT_EQ(cli, 1);
    fixture_check(&fx, TD_RUN_FAILED, 0, "cannot start the fake nodes: no such host: node-7");
    fixture_free(&fx);
}

int main(void) {
    test_restart_after_backoff();
    test_max_duration();
    test_signal_and_grace();
    test_cannot_start();
    return 0;
}
