/* A transport's short wait for a descriptor to take bytes (a full output pipe), on core's event
 * loop (loop.h), as td_loop_wait_readable is for reading. A bounded wait in the middle of one
 * write, not supervision: the caller's own loop goes on when it returns. (A TCP connect waits in
 * core's td_connect_tcp.) */
#include "launch_internal.h"

#include "tandem/loop.h"

static void on_writable(td_loop *l, int fd, unsigned events, void *user) {
    (void)fd, (void)events; /* an error or a hang-up counts: the write or connect then says it */
    *(bool *)user = true;
    td_loop_stop(l);
}

static void on_deadline(td_loop *l, void *user) {
    (void)user;
    td_loop_stop(l);
}

bool td__wait_writable(int fd, double seconds) {
    bool ready = false;
    td_loop *l = NULL;
    if (td_loop_new(&l) != TD_OK ||
        td_loop_watch(l, fd, TD_LOOP_WRITE, on_writable, &ready) != TD_OK) {
        td_error_clear(); /* no loop: no wait */
        td_loop_free(l);
        return false;
    }
    td_loop_timer(l, seconds, 0, on_deadline, NULL);
    if (td_loop_run(l) != TD_OK) td_error_clear();
    td_loop_free(l);
    return ready;
}
