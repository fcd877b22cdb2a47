/* executors: the stop decisions every carrier shares (td_exec_stop, exec.h), transition by
 * transition, with no process started: a first SIGTERM nobody asked for preempts, one `tandem
 * stop` recorded makes it a user stop; SIGINT and SIGHUP are user stops; the same signal again
 * within the repeat grace is the same request, after it (or Ctrl-C twice) the hard stop, and
 * nothing after that; max_duration begins a user stop unless a stop is under way, and a signal
 * after it counts from when it began; signals that are not stop signals change nothing. */
#include "test.h"

#include "tandem/exec.h"

#include <signal.h>

static int asked_calls;
static bool asked_yes(void *user) {
    (void)user;
    asked_calls++;
    return true;
}
static bool asked_no(void *user) {
    (void)user;
    asked_calls++;
    return false;
}

int main(void) {
    const double G = TD_STOP_REPEAT_GRACE_S;
    /* a preemption: SIGTERM, no request recorded */
    td_exec_stop s = {0};
    ASSERT_EQ(td_exec_stop_signal(&s, SIGCHLD, 0.0, asked_no, NULL), TD_EXEC_STOP_NONE);
    ASSERT(!s.active);
    ASSERT_EQ(td_exec_stop_signal(&s, SIGTERM, 1.0, asked_no, NULL), TD_EXEC_STOP_SOFT);
    ASSERT(s.active && s.preempt && !s.hard);
    ASSERT_STREQ(s.stopped_by, "");
    ASSERT_EQ(s.last_signal, SIGTERM);
    asked_calls = 0;
    ASSERT_EQ(td_exec_stop_signal(&s, SIGTERM, 1.5, asked_no, NULL), TD_EXEC_STOP_AGAIN);
    ASSERT_EQ(asked_calls, 0); /* the store is asked once, for the first SIGTERM */
    ASSERT_EQ(td_exec_stop_signal(&s, SIGCHLD, 2.0, asked_no, NULL), TD_EXEC_STOP_NONE);
    ASSERT_EQ(td_exec_stop_max_duration(&s, 60, 3.0), TD_EXEC_STOP_NONE); /* under way */
    ASSERT(s.preempt);
    ASSERT_EQ(td_exec_stop_signal(&s, SIGTERM, 1.0 + G, asked_no, NULL), TD_EXEC_STOP_HARD);
    ASSERT(s.hard);
    ASSERT_EQ(td_exec_stop_signal(&s, SIGTERM, 2.0 + G, asked_no, NULL), TD_EXEC_STOP_NONE);

    /* tandem stop: a SIGTERM with the request recorded */
    s = (td_exec_stop){0};
    ASSERT_EQ(td_exec_stop_signal(&s, SIGTERM, 0.0, asked_yes, NULL), TD_EXEC_STOP_SOFT);
    ASSERT(!s.preempt);
    ASSERT_STREQ(s.stopped_by, "tandem stop");
    /* timeout(1) and srun send one request twice in a burst: the same request */
    ASSERT_EQ(td_exec_stop_signal(&s, SIGTERM, 0.2, asked_yes, NULL), TD_EXEC_STOP_AGAIN);
    ASSERT(!s.hard);

    /* Ctrl-C: a user stop; Ctrl-C again, at once: the hard stop */
    s = (td_exec_stop){0};
    asked_calls = 0;
    ASSERT_EQ(td_exec_stop_signal(&s, SIGINT, 0.0, asked_no, NULL), TD_EXEC_STOP_SOFT);
    ASSERT_EQ(asked_calls, 0); /* only a SIGTERM can be a preemption */
    ASSERT_STREQ(s.stopped_by, "SIGINT (Ctrl-C)");
    ASSERT_EQ(td_exec_stop_signal(&s, SIGINT, 0.1, asked_no, NULL), TD_EXEC_STOP_HARD);

    /* SIGHUP (a closed terminal): a user stop */
    s = (td_exec_stop){0};
    ASSERT_EQ(td_exec_stop_signal(&s, SIGHUP, 0.0, asked_no, NULL), TD_EXEC_STOP_SOFT);
    ASSERT_STREQ(s.stopped_by, "SIGHUP");
    ASSERT(!s.preempt);

    /* max_duration: a user stop; a signal soon after is the same request, one after the grace
     * (counted from when max_duration began the stop) ends it now */
    s = (td_exec_stop){0};
    ASSERT_EQ(td_exec_stop_max_duration(&s, 60, 100.0), TD_EXEC_STOP_SOFT);
    ASSERT_STREQ(s.stopped_by, "max_duration of 60 s exceeded");
    ASSERT(!s.preempt);
    ASSERT_EQ(td_exec_stop_max_duration(&s, 60, 101.0), TD_EXEC_STOP_NONE);
    ASSERT_EQ(td_exec_stop_signal(&s, SIGTERM, 101.0, asked_no, NULL), TD_EXEC_STOP_AGAIN);
    ASSERT_STREQ(s.stopped_by, "max_duration of 60 s exceeded"); /* the cause stays */
    ASSERT_EQ(td_exec_stop_signal(&s, SIGTERM, 100.0 + G, asked_no, NULL), TD_EXEC_STOP_HARD);
    printf("ok\n");
    return 0;
}
