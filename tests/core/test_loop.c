/* core: the event loop (loop.h) and the launcher's end record (endrec.h).
 *
 * The loop: a readable pipe reaches its callback, and one unwatched earlier in the same turn
 * does not; one-shot timers run once, in due order, a cancelled one never; a periodic timer
 * runs at its period and never twice in one turn, even when it falls behind; a child's exit
 * reaches its callback with its wait status; the before-sleep hook runs every turn and can stop
 * the loop; a timer added in a callback waits for the next turn.
 * The end record: written and read back field for field; a missing record is TD_ERR_NOTFOUND;
 * a FIFO in its place is refused without blocking; malformed ones name what is wrong. */
#include "test.h"

#include "tandem/endrec.h"
#include "tandem/loop.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

typedef struct {
    int reads, writes;
    char got[64];
    int order[8], norder;
    int ticks;
    double tick_at[16];
    pid_t child;
    int child_status;
    int turns;
    int stop_after_turns;
    int other_fd, pair_fd; /* with other_fd >= 0, each read unwatches the other of the two */
    int late_ran;
} state;

static void on_read(td_loop *l, int fd, unsigned events, void *user) {
    state *s = user;
    ASSERT(events & TD_LOOP_READ);
    ssize_t n = read(fd, s->got, sizeof s->got - 1);
    ASSERT_GT(n, 0);
    s->got[n] = '\0';
    s->reads++;
    /* the other pipe is ready in this same turn: unwatched now, its event must be dropped */
    if (s->other_fd >= 0) td_loop_unwatch(l, fd == s->other_fd ? s->pair_fd : s->other_fd);
}

static void mark(state *s, int v) {
    s->order[s->norder++] = v;
}
static void t1(td_loop *l, void *u) {
    (void)l;
    mark(u, 1);
}
static void t2(td_loop *l, void *u) {
    (void)l;
    mark(u, 2);
}
static void t3(td_loop *l, void *u) {
    (void)l;
    mark(u, 3);
}
static void never(td_loop *l, void *u) {
    (void)l, (void)u;
    TEST_FAIL("a cancelled timer ran");
}

static void on_tick(td_loop *l, void *user) {
    (void)l;
    state *s = user;
    if (s->ticks < 16) s->tick_at[s->ticks] = td_now_s();
    s->ticks++;
}

static void late(td_loop *l, void *user) {
    (void)l;
    ((state *)user)->late_ran++;
}
static void adds_late(td_loop *l, void *user) {
    state *s = user;
    td_loop_timer(l, 0, 0, late, s); /* due at once, but not in this turn */
    ASSERT_EQ(s->late_ran, 0);
}

static void on_child(td_loop *l, pid_t pid, int status, void *user) {
    state *s = user;
    ASSERT_EQ(pid, s->child);
    s->child_status = status;
    td_loop_stop(l);
}

static void count_turns(td_loop *l, void *user) {
    state *s = user;
    if (++s->turns >= s->stop_after_turns && s->stop_after_turns) td_loop_stop(l);
}

static void test_io(void) {
    td_loop *l;
    ASSERT_EQ(td_loop_new(&l), TD_OK);
    state s = {.other_fd = -1};
    int a[2], b[2];
    ASSERT_EQ(pipe(a), 0);
    ASSERT_EQ(pipe(b), 0);
    ASSERT_EQ(td_loop_watch(l, a[0], TD_LOOP_READ, on_read, &s), TD_OK);
    ASSERT_EQ(td_loop_watch(l, b[0], TD_LOOP_READ, on_read, &s), TD_OK);
    ASSERT_EQ(write(a[1], "x", 1), 1);
    ASSERT_EQ(write(b[1], "y", 1), 1);
    ASSERT_EQ(td_loop_turn(l, 1.0), TD_OK);
    ASSERT_EQ(s.reads, 2); /* both ready: both read in one turn */
    /* both ready again; whichever callback runs first unwatches the other, whose event of this
     * same turn must then be dropped (it would read a descriptor the caller may have closed) */
    ASSERT_EQ(write(a[1], "p", 1), 1);
    ASSERT_EQ(write(b[1], "q", 1), 1);
    s.reads = 0;
    s.other_fd = a[0], s.pair_fd = b[0];
    ASSERT_EQ(td_loop_turn(l, 1.0), TD_OK);
    ASSERT_EQ(s.reads, 1);
    /* an idle turn with a cap returns after about the cap */
    td_loop_unwatch(l, a[0]), td_loop_unwatch(l, b[0]);
    double t0 = td_now_s();
    ASSERT_EQ(td_loop_turn(l, 0.02), TD_OK);
    ASSERT_GE(td_now_s() - t0, 0.02 - 1e-3);
    ASSERT_EQ(s.reads, 1);
    td_loop_free(l);
    close(a[0]), close(a[1]), close(b[0]), close(b[1]);
}

static void test_timers(void) {
    td_loop *l;
    ASSERT_EQ(td_loop_new(&l), TD_OK);
    state s = {0};
    td_loop_timer(l, 0.03, 0, t3, &s);
    td_loop_timer(l, 0.01, 0, t1, &s);
    uint64_t c = td_loop_timer(l, 0.015, 0, never, &s);
    td_loop_timer(l, 0.02, 0, t2, &s);
    td_loop_cancel(l, c);
    double t0 = td_now_s();
    while (s.norder < 3) ASSERT_EQ(td_loop_turn(l, 1.0), TD_OK);
    ASSERT_GE(td_now_s() - t0, 0.03 - 1e-3);
    ASSERT_EQ(s.order[0], 1);
    ASSERT_EQ(s.order[1], 2);
    ASSERT_EQ(s.order[2], 3);
    /* nothing left: a turn with a short cap returns without running anything */
    ASSERT_EQ(td_loop_turn(l, 0.01), TD_OK);
    ASSERT_EQ(s.norder, 3);

    /* periodic: the first tick a period after it was armed, then each at least a period after
     * the one before (never two in a burst); waits for 5 ticks, not for a time: a loaded machine
     * may run them late, never early */
    t0 = td_now_s();
    uint64_t p = td_loop_timer(l, 0.02, 0.02, on_tick, &s);
    while (s.ticks < 5) ASSERT_EQ(td_loop_turn(l, 0.2), TD_OK);
    ASSERT_EQ(s.ticks, 5);
    ASSERT_GE(s.tick_at[0] - t0, 0.02 - 2e-3);
    for (int i = 1; i < s.ticks && i < 16; i++)
        ASSERT_GE(s.tick_at[i] - s.tick_at[i - 1], 0.02 - 2e-3);
    /* fallen behind by 10 periods: one run, not ten back to back */
    int before = s.ticks;
    usleep(200 * 1000);
    ASSERT_EQ(td_loop_turn(l, 0), TD_OK);
    ASSERT_EQ(s.ticks, before + 1);
    td_loop_cancel(l, p);

    /* a timer added by a callback runs in the next turn, not this one */
    td_loop_timer(l, 0, 0, adds_late, &s);
    ASSERT_EQ(td_loop_turn(l, 0.1), TD_OK);
    ASSERT_EQ(s.late_ran, 0);
    ASSERT_EQ(td_loop_turn(l, 0.1), TD_OK);
    ASSERT_EQ(s.late_ran, 1);
    td_loop_free(l);
}

static void test_child_and_hook(void) {
    td_loop *l;
    ASSERT_EQ(td_loop_new(&l), TD_OK);
    state s = {0};
    s.child = fork();
    ASSERT(s.child >= 0);
    if (s.child == 0) {
        usleep(50 * 1000);
        _exit(7);
    }
    ASSERT_EQ(td_loop_watch_child(l, s.child, on_child, &s), TD_OK);
    td_loop_before_sleep(l, count_turns, &s);
    ASSERT_EQ(td_loop_run(l), TD_OK);
    ASSERT(WIFEXITED(s.child_status));
    ASSERT_EQ(WEXITSTATUS(s.child_status), 7);
    ASSERT_GE(s.turns, 1);
    /* the hook stops the loop by itself */
    td_loop_free(l);
    ASSERT_EQ(td_loop_new(&l), TD_OK);
    s.turns = 0;
    s.stop_after_turns = 3;
    td_loop_before_sleep(l, count_turns, &s);
    td_loop_timer(l, 0, 0.001, on_tick, &s);
    ASSERT_EQ(td_loop_run(l), TD_OK);
    ASSERT_EQ(s.turns, 3);
    ASSERT(td_loop_stopped(l));
    td_loop_free(l);
}

static void test_end_record(void) {
    char dir[] = "/tmp/tandem-endrec-XXXXXX";
    ASSERT(mkdtemp(dir));
    char path[256], fifo[256], bad[256];
    snprintf(path, sizeof path, "%s/node-1.json", dir);
    snprintf(fifo, sizeof fifo, "%s/fifo.json", dir);
    snprintf(bad, sizeof bad, "%s/bad.json", dir);
    td_end_worker ws[2] = {{.rank = 2, .local_rank = 0, .node = 1, .exit_code = 143, .signal = 15},
                           {.rank = 3, .local_rank = 1, .node = 1, .exit_code = 2}};
    td_end_record r = {.outcome = TD_END_FAILED,
                       .exit_code = 1,
                       .node_rank = 1,
                       .nnodes = 2,
                       .restarts = 2,
                       .max_restarts = 3,
                       .stop_signal = 0,
                       .has_failure = true,
                       .failure = ws[1],
                       .workers = ws,
                       .nworkers = 2};
    snprintf(r.cause, sizeof r.cause, "worker rank 3 (local rank 1 on node 1) exited with code 2");
    snprintf(r.failure_line, sizeof r.failure_line, "ValueError: \"label\" \xc3\xa9 \t missing");
    ASSERT_EQ(td_end_record_write(path, &r), TD_OK);
    td_end_record g;
    ASSERT_EQ(td_end_record_read(path, &g), TD_OK);
    ASSERT_EQ(g.outcome, TD_END_FAILED);
    ASSERT_EQ(g.exit_code, 1);
    ASSERT_EQ(g.node_rank, 1);
    ASSERT_EQ(g.nnodes, 2);
    ASSERT_EQ(g.restarts, 2);
    ASSERT_EQ(g.max_restarts, 3);
    ASSERT_STREQ(g.cause, r.cause);
    ASSERT(g.has_failure);
    ASSERT_EQ(g.failure.rank, 3);
    ASSERT_EQ(g.failure.exit_code, 2);
    ASSERT_STREQ(g.failure_line, r.failure_line);
    ASSERT_EQ(g.nworkers, 2);
    ASSERT_EQ(g.workers[0].exit_code, 143);
    ASSERT_EQ(g.workers[0].signal, 15);
    ASSERT_EQ(g.workers[1].node, 1);
    td_end_record_clear(&g);
    /* each outcome's name survives the trip */
    for (int o = 0; o < TD_END_OUTCOME_COUNT; o++) {
        r.outcome = (td_end_outcome)o;
        r.has_failure = false;
        ASSERT_EQ(td_end_record_write(path, &r), TD_OK);
        ASSERT_EQ(td_end_record_read(path, &g), TD_OK);
        ASSERT_EQ(g.outcome, o);
        ASSERT(!g.has_failure);
        td_end_record_clear(&g);
    }
    ASSERT_EQ(td_end_record_read(bad, &g), TD_ERR_NOTFOUND);
    ASSERT_EQ(mkfifo(fifo, 0600), 0);
    ASSERT_EQ(td_end_record_read(fifo, &g), TD_ERR_FORMAT); /* refused, not blocked on */
    ASSERT_CONTAINS(td_error_msg(), "not a regular file");
    static const struct {
        const char *text, *says;
    } cases[] = {
        {"{\"record\": \"other\", \"version\": 1}", "not a tandem launch end record"},
        {"[1, 2]", "not an object"},
        {"{\"record\": \"tandem.launch.end\", \"version\": 1, \"outcome\": \"won\"}", "outcome"},
        {"{\"record\": \"tandem.launch.end\", \"version\": 1, \"outcome\": \"failed\", "
         "\"exit_code\": \"1\"}",
         "\"exit_code\""},
        {"{\"record\": \"tandem.launch.end\"", "line 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        FILE *f = fopen(bad, "w");
        ASSERT(f);
        fputs(cases[i].text, f);
        fclose(f);
        ASSERT_EQ(td_end_record_read(bad, &g), TD_ERR_FORMAT);
        ASSERT_CONTAINS(td_error_msg(), cases[i].says);
        ASSERT_CONTAINS(td_error_msg(), bad);
    }
    unlink(path), unlink(fifo), unlink(bad), rmdir(dir);
}

int main(void) {
    test_io();
    test_timers();
    test_child_and_hook();
    test_end_record();
    printf("ok\n");
    return 0;
}
