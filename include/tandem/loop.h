/* tandem loop: the one event loop of tandem's long-lived processes, in the manner of Redis's
 * ae.c: descriptors, timers, child exits, and a hook before each sleep. One thread, callbacks
 * only, nothing runs in a signal handler (signals arrive as a descriptor: td_sigwatch in os.h,
 * watched like any other).
 *
 * A turn of td_loop_run: the before-sleep hook, then one epoll_wait bounded by the nearest timer,
 * then the ready descriptors' callbacks, then the due timers' callbacks (in the order they are
 * due). Periodic work is a timer with a period; a deadline is a one-shot timer, cancelled when
 * it no longer applies. A child's exit is a descriptor too (a pidfd, Linux 5.3+): its callback
 * gets the wait status once the child is reaped; without pidfds the loop reaps the watched
 * children every 50 ms instead.
 *
 * Callbacks may watch, unwatch, add and cancel timers, and call td_loop_stop, at any time: an
 * event for a descriptor unwatched earlier in the same turn is dropped, a timer added in a
 * callback runs no earlier than the next turn. */
#ifndef TANDEM_LOOP_H
#define TANDEM_LOOP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "tandem/core.h"

typedef struct td_loop td_loop;

enum { TD_LOOP_READ = 1, TD_LOOP_WRITE = 2 };
/* events: the TD_LOOP_* that are ready; a hang-up or an error counts as readable (a read then
 * sees the end or the error). */
typedef void (*td_loop_io_fn)(td_loop *l, int fd, unsigned events, void *user);
typedef void (*td_loop_timer_fn)(td_loop *l, void *user);
typedef void (*td_loop_child_fn)(td_loop *l, pid_t pid, int wait_status, void *user);
typedef void (*td_loop_hook_fn)(td_loop *l, void *user);

td_status td_loop_new(td_loop **out);
/* Closes the loop's own descriptors (epoll, pidfds), never the watched ones. */
void td_loop_free(td_loop *l);

/* Watches fd for events (TD_LOOP_READ and/or TD_LOOP_WRITE); watching a watched fd again
 * replaces its events, callback and user. */
td_status td_loop_watch(td_loop *l, int fd, unsigned events, td_loop_io_fn fn, void *user);
/* Stops watching fd (before the caller closes it). Unwatched fds are ignored. */
void td_loop_unwatch(td_loop *l, int fd);

/* A timer first due after_s seconds from now, then every period_s seconds (0: once). Returns
 * its id (> 0), for td_loop_cancel. A periodic timer that falls behind skips the missed turns
 * rather than running them back to back. */
uint64_t td_loop_timer(td_loop *l, double after_s, double period_s, td_loop_timer_fn fn,
                       void *user);
/* Cancels a timer (an id already run or cancelled, or 0, is ignored). */
void td_loop_cancel(td_loop *l, uint64_t id);

/* Calls fn once pid (a child of this process) has exited and been reaped. */
td_status td_loop_watch_child(td_loop *l, pid_t pid, td_loop_child_fn fn, void *user);

/* Called at the start of every turn, before the loop sleeps: the place for checks that follow
 * from whatever the last turn's callbacks changed. One hook; NULL removes it. */
void td_loop_before_sleep(td_loop *l, td_loop_hook_fn fn, void *user);

/* ---- blocking work, off the loop's thread (libuv's uv_queue_work) ----
 * A call that blocks (an HTTP request to the instance metadata service, an upload, an ssh or
 * Slurm client call) runs as work(user) on one of a few threads the loop starts when first
 * asked (at most TD_LOOP_WORK_THREADS; queued work waits for a free one, in order); when it
 * returns, after(l, user) runs on the loop's thread, in a later turn, where the results are
 * acted on. work must not touch the loop; user is the caller's until after() has run or the
 * work was cancelled. Each item is one call: periodic work is a timer that queues it. */
#define TD_LOOP_WORK_THREADS 4
typedef void (*td_loop_work_fn)(void *user);
typedef void (*td_loop_after_fn)(td_loop *l, void *user);
/* Queues work; returns its id (> 0) for td_loop_cancel_work, or 0 with the error recorded (no
 * thread could be started). after may be NULL. */
uint64_t td_loop_queue_work(td_loop *l, td_loop_work_fn work, td_loop_after_fn after,
                            void *user);
/* Cancels work: not yet started, it never runs; running, this waits until it returns (make it
 * return soon: cancel the request it blocks in first). Either way its after() is never called,
 * so the caller may free user once this returns. An id that ended and was handed to after(),
 * or 0, is ignored. */
void td_loop_cancel_work(td_loop *l, uint64_t id);
/* Work items queued, running, or ended and not yet handed to their after(). */
size_t td_loop_work_pending(const td_loop *l);
/* td_loop_free cancels whatever work is left (waiting for running work to return). */

/* Runs turns until td_loop_stop. TD_ERR_SYS if epoll itself fails (EINTR is not a failure). */
td_status td_loop_run(td_loop *l);
/* One turn, sleeping at most max_wait_s (< 0: until an event or the nearest timer). */
td_status td_loop_turn(td_loop *l, double max_wait_s);
/* Waits up to `seconds` for fd to become readable, on a loop of its own; true if it did. For
 * a short wait outside any loop (a pause that a stop signal cuts short). */
bool td_loop_wait_readable(int fd, double seconds);

/* Makes td_loop_run return after the current turn. */
void td_loop_stop(td_loop *l);
bool td_loop_stopped(const td_loop *l);

#endif
