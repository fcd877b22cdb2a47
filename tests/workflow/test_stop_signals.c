/* workflow: how the supervisors (the local one in run.c, ssh and slurm in exec/) take stop
 * signals (td_stop_signals_take). Two SIGTERMs close together once ended a run failed (137) with
 * no checkpoint: the second was taken for "kill now". What must hold:
 *   - the first stop signal starts a graceful stop;
 *   - a SIGTERM or SIGHUP within TD_STOP_REPEAT_GRACE_S of the start is the same request;
 *   - a second SIGINT (Ctrl-C twice) escalates at once, as torchrun's does;
 *   - any stop signal TD_STOP_REPEAT_GRACE_S or more after the start escalates;
 *   - a stop that began without a signal (max_duration) counts from its own start;
 *   - other signals (SIGCHLD) are not stop signals. */
#include "test.h"

#include <signal.h>

#include "tandem/os.h"

int main(void) {
    const double g = TD_STOP_REPEAT_GRACE_S;
    td_stop_signals s = {0};
    ASSERT_EQ(td_stop_signals_take(&s, SIGCHLD, 100.0), TD_STOP_IGNORE);
    ASSERT(!s.begun);
    ASSERT_EQ(td_stop_signals_take(&s, SIGTERM, 100.0), TD_STOP_GRACEFUL);
    ASSERT_EQ(td_stop_signals_take(&s, SIGTERM, 100.05), TD_STOP_REPEAT); /* kill -TERM x2 */
    ASSERT_EQ(td_stop_signals_take(&s, SIGHUP, 101.0), TD_STOP_REPEAT);
    ASSERT_EQ(td_stop_signals_take(&s, SIGINT, 102.0), TD_STOP_REPEAT);   /* the first SIGINT */
    ASSERT_EQ(td_stop_signals_take(&s, SIGINT, 102.2), TD_STOP_ESCALATE); /* Ctrl-C twice */
    ASSERT_EQ(td_stop_signals_take(&s, SIGTERM, 100.0 + g), TD_STOP_ESCALATE);

    td_stop_signals c = {0}; /* Ctrl-C twice from the start */
    ASSERT_EQ(td_stop_signals_take(&c, SIGINT, 5.0), TD_STOP_GRACEFUL);
    ASSERT_EQ(td_stop_signals_take(&c, SIGINT, 5.1), TD_STOP_ESCALATE);

    td_stop_signals m = {0}; /* max_duration began the stop */
    td_stop_signals_begin(&m, 50.0);
    td_stop_signals_begin(&m, 55.0); /* a second begin keeps the first start */
    ASSERT_EQ(td_stop_signals_take(&m, SIGTERM, 51.0), TD_STOP_REPEAT);
    ASSERT_EQ(td_stop_signals_take(&m, SIGTERM, 50.0 + g + 0.1), TD_STOP_ESCALATE);
    printf("test_stop_signals: ok\n");
    return 0;
}
