/* core: blocking work on the loop's threads (td_loop_queue_work, loop.h).
 *
 * Ten items that each block reading a pipe: the loop is not blocked meanwhile (a timer runs
 * while all of them wait, and it is the timer that releases them); at most TD_LOOP_WORK_THREADS
 * run at once (the rest wait their turn); every after() runs on the loop's thread, once, after
 * its work, in the order queued. Cancelling work not yet started means it never runs and its
 * after() never comes; cancelling running work waits for it to return, and its after() never
 * comes either; td_loop_free with work left waits for the running and drops the rest, calling
 * no after(). No sleeps: every wait is for an event (a pipe, the loop's own turns). */
#include "test.h"

#include "tandem/loop.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#define NITEMS 10

typedef struct {
    int gate[2];           /* work blocks reading gate[0] until the loop writes gate[1] */
    atomic_int running;    /* items inside work() now */
    atomic_int max_running;
    atomic_int worked[NITEMS];
    int after_order[NITEMS], nafter;
    int after_calls[NITEMS];
    pthread_t loop_thread;
    int ticks_while_blocked;
    atomic_int started; /* items that entered work() */
} ctx;

typedef struct {
    ctx *c;
    int i;
} item;

static void blocking_work(void *user) {
    item *it = user;
    int now = atomic_fetch_add(&it->c->running, 1) + 1;
    int max = atomic_load(&it->c->max_running);
    while (now > max && !atomic_compare_exchange_weak(&it->c->max_running, &max, now)) {
    }
    atomic_fetch_add(&it->c->started, 1);
    char b;
    ASSERT_EQ(read(it->c->gate[0], &b, 1), 1); /* one byte per item */
    atomic_fetch_add(&it->c->worked[it->i], 1);
    atomic_fetch_sub(&it->c->running, 1);
}

static void after_work(td_loop *l, void *user) {
    item *it = user;
    ctx *c = it->c;
    ASSERT(pthread_equal(pthread_self(), c->loop_thread));
    ASSERT_EQ(atomic_load(&c->worked[it->i]), 1); /* after its work, never before */
    c->after_calls[it->i]++;
    c->after_order[c->nafter++] = it->i;
    if (c->nafter == NITEMS) td_loop_stop(l);
}

/* A timer on the loop while every thread is blocked: the loop turns. Once the pool is full it
 * opens the gate for all ten. */
static void tick(td_loop *l, void *user) {
    (void)l;
    ctx *c = user;
    if (atomic_load(&c->started) < TD_LOOP_WORK_THREADS) return;
    c->ticks_while_blocked++;
    if (c->ticks_while_blocked == 3) {
        char ones[NITEMS];
        memset(ones, 1, sizeof ones);
        ASSERT_EQ(write(c->gate[1], ones, sizeof ones), (ssize_t)sizeof ones);
    }
}

static void test_run_and_after(void) {
    ctx c;
    memset(&c, 0, sizeof c);
    ASSERT_EQ(pipe(c.gate), 0);
    c.loop_thread = pthread_self();
    td_loop *l;
    ASSERT_OK(td_loop_new(&l));
    item items[NITEMS];
    for (int i = 0; i < NITEMS; i++) {
        items[i] = (item){&c, i};
        ASSERT_GT(td_loop_queue_work(l, blocking_work, after_work, &items[i]), 0);
    }
    ASSERT_EQ(td_loop_work_pending(l), NITEMS);
    td_loop_timer(l, 0.001, 0.001, tick, &c);
    ASSERT_OK(td_loop_run(l));
    ASSERT_GE(c.ticks_while_blocked, 3);
    ASSERT_EQ(c.nafter, NITEMS);
    ASSERT_EQ(atomic_load(&c.max_running), TD_LOOP_WORK_THREADS);
    for (int i = 0; i < NITEMS; i++) ASSERT_EQ(c.after_calls[i], 1);
    ASSERT_EQ(td_loop_work_pending(l), 0);
    td_loop_free(l);
    close(c.gate[0]);
    close(c.gate[1]);
}

/* ---- cancelling ---- */

typedef struct {
    int entered[2]; /* work writes a byte here when it starts */
    atomic_int ran;
    atomic_int cancelling; /* the main thread is about to cancel the running item */
    int afters;
} cctx;

/* One gated item: its own gate, so a byte meant for one item releases that item and no other. */
typedef struct {
    cctx *c;
    int gate[2];
} gated;

static void gated_work(void *user) {
    gated *g = user;
    ASSERT_EQ(write(g->c->entered[1], "e", 1), 1);
    char b;
    ASSERT_EQ(read(g->gate[0], &b, 1), 1);
    atomic_fetch_add(&g->c->ran, 1);
}

static void count_after(td_loop *l, void *user) {
    (void)l;
    ((gated *)user)->c->afters++;
}

/* Releases one gated item once the main thread is about to cancel it, giving way a while first:
 * a cancel that does not wait returns before the item has run (and the check after it fails). */
static void *release_gate(void *user) {
    gated *g = user;
    while (!atomic_load(&g->c->cancelling)) sched_yield();
    for (int i = 0; i < 1000; i++) sched_yield();
    ASSERT_EQ(write(g->gate[1], "g", 1), 1);
    return NULL;
}

static void test_cancel(void) {
    cctx c;
    memset(&c, 0, sizeof c);
    gated items[TD_LOOP_WORK_THREADS + 1];
    for (int i = 0; i <= TD_LOOP_WORK_THREADS; i++) {
        items[i].c = &c;
        ASSERT_EQ(pipe(items[i].gate), 0);
    }
    ASSERT_EQ(pipe(c.entered), 0);
    td_loop *l;
    ASSERT_OK(td_loop_new(&l));
    /* Fill every thread with gated work, so the next one queued cannot start. */
    uint64_t ids[TD_LOOP_WORK_THREADS + 1];
    for (int i = 0; i <= TD_LOOP_WORK_THREADS; i++)
        ids[i] = td_loop_queue_work(l, gated_work, count_after, &items[i]);
    char b;
    for (int i = 0; i < TD_LOOP_WORK_THREADS; i++) ASSERT_EQ(read(c.entered[0], &b, 1), 1);
    /* The last is still queued: cancelled, it never runs. */
    td_loop_cancel_work(l, ids[TD_LOOP_WORK_THREADS]);
    ASSERT_EQ(td_loop_work_pending(l), TD_LOOP_WORK_THREADS);
    /* A running one: the cancel waits for it; release it from another thread. */
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, release_gate, &items[0]), 0);
    atomic_store(&c.cancelling, 1);
    td_loop_cancel_work(l, ids[0]);
    ASSERT_EQ(atomic_load(&c.ran), 1); /* it returned before the cancel did */
    ASSERT_EQ(pthread_join(t, NULL), 0);
    ASSERT_EQ(td_loop_work_pending(l), TD_LOOP_WORK_THREADS - 1);
    /* Release the rest, but free the loop without turning it: no after() for anyone. */
    for (int i = 1; i < TD_LOOP_WORK_THREADS; i++) ASSERT_EQ(write(items[i].gate[1], "g", 1), 1);
    td_loop_free(l);
    ASSERT_EQ(atomic_load(&c.ran), TD_LOOP_WORK_THREADS);
    ASSERT_EQ(c.afters, 0);
    /* The queued one that was cancelled never entered. */
    ASSERT_EQ(read(c.entered[0], &b, 0), 0);
    int fl = fcntl(c.entered[0], F_GETFL);
    ASSERT_EQ(fcntl(c.entered[0], F_SETFL, fl | O_NONBLOCK), 0);
    ASSERT_EQ(read(c.entered[0], &b, 1), -1);
    for (int i = 0; i < 2; i++) {
        close(c.entered[i]);
        for (int k = 0; k <= TD_LOOP_WORK_THREADS; k++) close(items[k].gate[i]);
    }
}

int main(void) {
    test_run_and_after();
    test_cancel();
    TEST_PASS();
}
