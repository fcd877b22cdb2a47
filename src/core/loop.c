/* The event loop (loop.h): epoll for descriptors, an unsorted timer table scanned each turn
 * (a process has a handful of timers: ae.c's reasoning), pidfds for children, and a small pool
 * of threads for blocking work whose ends come back through an eventfd (uv_queue_work). */
#include "tandem/loop.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHILD_POLL_S 0.05 /* without pidfds: how often watched children are reaped */

typedef struct {
    td_loop_io_fn fn; /* NULL: not watched */
    void *user;
    unsigned events;
    uint64_t gen; /* which watch of this fd an epoll event belongs to */
} io_watch;

typedef struct {
    uint64_t id; /* 0: free slot */
    double due, period;
    td_loop_timer_fn fn;
    void *user;
} timer;

typedef struct {
    pid_t pid;
    int pidfd; /* -1: reaped by the CHILD_POLL_S timer */
    td_loop_child_fn fn;
    void *user;
} child;

struct td_loop {
    int epfd;
    io_watch *io; /* indexed by fd */
    int nio;
    uint64_t gen;
    timer *timers;
    int ntimers;
    uint64_t next_id;
    child *children;
    int nchildren;
    uint64_t child_poll; /* the fallback timer, or 0 */
    td_loop_hook_fn before;
    void *before_user;
    bool stop;
    struct loop_work *work; /* NULL until the first td_loop_queue_work */
};

static void work_free(td_loop *l);

td_status td_loop_new(td_loop **out) {
    td_loop *l = td_xcalloc(1, sizeof *l);
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (l->epfd < 0) {
        free(l);
        return td_error_errno(TD_ERR_SYS, "epoll_create1");
    }
    *out = l;
    return TD_OK;
}

void td_loop_free(td_loop *l) {
    if (!l) return;
    work_free(l);
    for (int i = 0; i < l->nchildren; i++)
        if (l->children[i].pidfd >= 0) close(l->children[i].pidfd);
    close(l->epfd);
    free(l->io);
    free(l->timers);
    free(l->children);
    free(l);
}

/* ---- descriptors ---- */

static uint32_t epoll_events(unsigned events) {
    return (events & TD_LOOP_READ ? EPOLLIN : 0u) | (events & TD_LOOP_WRITE ? EPOLLOUT : 0u);
}

td_status td_loop_watch(td_loop *l, int fd, unsigned events, td_loop_io_fn fn, void *user) {
    if (fd < 0 || !fn)
        return td_error(TD_ERR_INVALID, "td_loop_watch: fd %d, callback %p", fd, (void *)fn);
    if (fd >= l->nio) {
        int n = TD_MAX(fd + 1, 2 * l->nio);
        l->io = td_xrealloc(l->io, (size_t)n * sizeof *l->io);
        memset(l->io + l->nio, 0, (size_t)(n - l->nio) * sizeof *l->io);
        l->nio = n;
    }
    io_watch *w = &l->io[fd];
    struct epoll_event ev = {.events = epoll_events(events), .data.u64 = 0};
    uint64_t gen = w->fn ? w->gen : ++l->gen;
    ev.data.u64 = gen << 32 | (uint32_t)fd;
    if (epoll_ctl(l->epfd, w->fn ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev) != 0)
        return td_error_errno(TD_ERR_SYS, "epoll_ctl(fd %d)", fd);
    *w = (io_watch){.fn = fn, .user = user, .events = events, .gen = gen};
    return TD_OK;
}

void td_loop_unwatch(td_loop *l, int fd) {
    if (fd < 0 || fd >= l->nio || !l->io[fd].fn) return;
    epoll_ctl(l->epfd, EPOLL_CTL_DEL, fd, NULL);
    l->io[fd] = (io_watch){0};
}

/* ---- timers ---- */

uint64_t td_loop_timer(td_loop *l, double after_s, double period_s, td_loop_timer_fn fn,
                       void *user) {
    int slot = -1;
    for (int i = 0; i < l->ntimers && slot < 0; i++)
        if (!l->timers[i].id) slot = i;
    if (slot < 0) {
        l->timers = td_xrealloc(l->timers, (size_t)(l->ntimers + 1) * sizeof *l->timers);
        slot = l->ntimers++;
    }
    l->timers[slot] = (timer){.id = ++l->next_id,
                              .due = td_now_s() + TD_MAX(after_s, 0.0),
                              .period = period_s > 0 ? period_s : 0,
                              .fn = fn,
                              .user = user};
    return l->timers[slot].id;
}

void td_loop_cancel(td_loop *l, uint64_t id) {
    for (int i = 0; id && i < l->ntimers; i++)
        if (l->timers[i].id == id) l->timers[i].id = 0;
}

static double next_due(const td_loop *l) {
    double due = INFINITY;
    for (int i = 0; i < l->ntimers; i++)
        if (l->timers[i].id && l->timers[i].due < due) due = l->timers[i].due;
    return due;
}

/* Runs the timers due by now, earliest first; timers added meanwhile wait for the next turn. */
static void run_timers(td_loop *l) {
    double now = td_now_s();
    uint64_t last_id = l->next_id;
    for (;;) {
        int pick = -1;
        for (int i = 0; i < l->ntimers; i++) {
            const timer *t = &l->timers[i];
            if (t->id && t->id <= last_id && t->due <= now &&
                (pick < 0 || t->due < l->timers[pick].due))
                pick = i;
        }
        if (pick < 0 || l->stop) return;
        timer t = l->timers[pick];
        if (t.period > 0) { /* due again after now: not twice in this turn */
            double due = t.due + t.period;
            l->timers[pick].due = due > now ? due : now + t.period;
        } else {
            l->timers[pick].id = 0;
        }
        t.fn(l, t.user);
    }
}

/* ---- children ---- */

static void child_done(td_loop *l, int i, int status) {
    child c = l->children[i];
    if (c.pidfd >= 0) {
        td_loop_unwatch(l, c.pidfd);
        close(c.pidfd);
    }
    l->children[i] = l->children[--l->nchildren];
    c.fn(l, c.pid, status, c.user);
}

static void reap_one(td_loop *l, int i) {
    int status;
    pid_t r;
    do r = waitpid(l->children[i].pid, &status, WNOHANG);
    while (r < 0 && errno == EINTR);
    if (r == l->children[i].pid) child_done(l, i, status);
}

static void on_pidfd(td_loop *l, int fd, unsigned events, void *user) {
    (void)events, (void)user;
    for (int i = 0; i < l->nchildren; i++)
        if (l->children[i].pidfd == fd) {
            reap_one(l, i);
            return;
        }
}

static void poll_children(td_loop *l, void *user) {
    (void)user;
    for (int i = l->nchildren - 1; i >= 0; i--)
        if (i < l->nchildren && l->children[i].pidfd < 0) reap_one(l, i);
}

td_status td_loop_watch_child(td_loop *l, pid_t pid, td_loop_child_fn fn, void *user) {
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0 && errno != ENOSYS && errno != EPERM)
        return td_error_errno(TD_ERR_SYS, "pidfd_open(%d)", (int)pid);
    l->children = td_xrealloc(l->children, (size_t)(l->nchildren + 1) * sizeof *l->children);
    l->children[l->nchildren++] = (child){.pid = pid, .pidfd = pidfd, .fn = fn, .user = user};
    if (pidfd >= 0) {
        td_status st = td_loop_watch(l, pidfd, TD_LOOP_READ, on_pidfd, NULL);
        if (st != TD_OK) {
            close(pidfd);
            l->nchildren--;
            return st;
        }
    } else if (!l->child_poll) {
        l->child_poll = td_loop_timer(l, CHILD_POLL_S, CHILD_POLL_S, poll_children, NULL);
    }
    return TD_OK;
}

/* ---- running ---- */

void td_loop_before_sleep(td_loop *l, td_loop_hook_fn fn, void *user) {
    l->before = fn;
    l->before_user = user;
}

void td_loop_stop(td_loop *l) {
    l->stop = true;
}

bool td_loop_stopped(const td_loop *l) {
    return l->stop;
}

td_status td_loop_turn(td_loop *l, double max_wait_s) {
    if (l->before) l->before(l, l->before_user);
    if (l->stop) return TD_OK;
    double wait = next_due(l) - td_now_s();
    if (max_wait_s >= 0 && !(wait <= max_wait_s)) wait = max_wait_s;
    int timeout_ms = isinf(wait) ? -1 : wait <= 0 ? 0 : (int)TD_MIN(ceil(wait * 1000.0), 1e9);
    struct epoll_event evs[64];
    int n = epoll_wait(l->epfd, evs, (int)TD_ARRAY_LEN(evs), timeout_ms);
    if (n < 0) {
        if (errno == EINTR) return TD_OK;
        return td_error_errno(TD_ERR_SYS, "epoll_wait");
    }
    for (int i = 0; i < n && !l->stop; i++) {
        int fd = (int)(uint32_t)evs[i].data.u64;
        uint64_t gen = evs[i].data.u64 >> 32;
        /* unwatched (or unwatched and watched again) by an earlier callback of this turn */
        if (fd >= l->nio || !l->io[fd].fn || (l->io[fd].gen & 0xffffffffu) != gen) continue;
        unsigned ready = 0;
        if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) ready |= TD_LOOP_READ;
        if (evs[i].events & (EPOLLOUT | EPOLLERR)) ready |= TD_LOOP_WRITE;
        ready &= l->io[fd].events | TD_LOOP_READ;
        l->io[fd].fn(l, fd, ready, l->io[fd].user);
    }
    run_timers(l);
    return TD_OK;
}

td_status td_loop_run(td_loop *l) {
    while (!l->stop) TD_CHECK(td_loop_turn(l, -1));
    return TD_OK;
}

/* ---- blocking work on threads (td_loop_queue_work) ---- */

typedef enum { WORK_QUEUED, WORK_RUNNING, WORK_DONE } work_state;

typedef struct work_item {
    uint64_t id;
    work_state state;
    td_loop_work_fn work;
    td_loop_after_fn after;
    void *user;
    struct work_item *next;
} work_item;

struct loop_work {
    pthread_mutex_t lock;
    pthread_cond_t wake;   /* a thread waits here for queued work */
    pthread_cond_t ended;  /* a cancel waits here for running work to end */
    work_item *items;      /* every item not yet handed to its after(), oldest first */
    pthread_t threads[TD_LOOP_WORK_THREADS];
    int nthreads, idle;
    bool quit;
    int efd; /* eventfd, watched by the loop: some work ended */
    uint64_t next_id;
};

/* The oldest queued item, marked running; NULL when there is none. Under the lock. */
static work_item *take_queued(struct loop_work *w) {
    for (work_item *it = w->items; it; it = it->next)
        if (it->state == WORK_QUEUED) {
            it->state = WORK_RUNNING;
            return it;
        }
    return NULL;
}

static void *work_thread(void *arg) {
    struct loop_work *w = arg;
    /* Signals are the loop thread's business (a signalfd there needs them blocked everywhere). */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    pthread_mutex_lock(&w->lock);
    for (;;) {
        work_item *it = w->quit ? NULL : take_queued(w);
        if (!it) {
            if (w->quit) break;
            w->idle++;
            pthread_cond_wait(&w->wake, &w->lock);
            w->idle--;
            continue;
        }
        pthread_mutex_unlock(&w->lock);
        it->work(it->user);
        pthread_mutex_lock(&w->lock);
        it->state = WORK_DONE;
        pthread_cond_broadcast(&w->ended);
        uint64_t one = 1;
        ssize_t r = write(w->efd, &one, sizeof one);
        (void)r; /* a full counter wakes the loop as well */
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

static void unlink_item(struct loop_work *w, work_item *it) {
    for (work_item **p = &w->items; *p; p = &(*p)->next)
        if (*p == it) {
            *p = it->next;
            return;
        }
}

/* On the loop: hands each ended item to its after(), in the order they were queued. */
static void on_work_ended(td_loop *l, int fd, unsigned events, void *user) {
    (void)events, (void)user;
    uint64_t n;
    ssize_t r = read(fd, &n, sizeof n);
    (void)r;
    struct loop_work *w = l->work;
    for (;;) {
        pthread_mutex_lock(&w->lock);
        work_item *it = w->items;
        while (it && it->state != WORK_DONE) it = it->next;
        if (it) unlink_item(w, it);
        pthread_mutex_unlock(&w->lock);
        if (!it) return;
        if (it->after) it->after(l, it->user);
        free(it);
    }
}

static td_status work_init(td_loop *l) {
    struct loop_work *w = td_xcalloc(1, sizeof *w);
    w->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (w->efd < 0) {
        free(w);
        return td_error_errno(TD_ERR_SYS, "eventfd for the loop's work queue");
    }
    td_status st = td_loop_watch(l, w->efd, TD_LOOP_READ, on_work_ended, NULL);
    if (st != TD_OK) {
        close(w->efd);
        free(w);
        return st;
    }
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->wake, NULL);
    pthread_cond_init(&w->ended, NULL);
    l->work = w;
    return TD_OK;
}

uint64_t td_loop_queue_work(td_loop *l, td_loop_work_fn work, td_loop_after_fn after,
                            void *user) {
    if (!work) {
        td_error(TD_ERR_INVALID, "td_loop_queue_work: no work function");
        return 0;
    }
    if (!l->work && work_init(l) != TD_OK) return 0;
    struct loop_work *w = l->work;
    work_item *it = td_xcalloc(1, sizeof *it);
    *it = (work_item){.state = WORK_QUEUED, .work = work, .after = after, .user = user};
    pthread_mutex_lock(&w->lock);
    it->id = ++w->next_id;
    work_item **tail = &w->items;
    int queued = 1; /* this one */
    for (; *tail; tail = &(*tail)->next) queued += (*tail)->state == WORK_QUEUED;
    *tail = it;
    uint64_t id = it->id;
    /* A thread is started while the queued items outnumber the idle threads: an idle thread
     * already signalled for an earlier item still counts as idle until it takes that item, so
     * "any idle thread" would leave this item waiting behind work that may block. */
    if (queued > w->idle && w->nthreads < TD_LOOP_WORK_THREADS) {
        if (pthread_create(&w->threads[w->nthreads], NULL, work_thread, w) == 0)
            w->nthreads++;
        else if (!w->nthreads) {
            unlink_item(w, it);
            pthread_mutex_unlock(&w->lock);
            free(it);
            td_error(TD_ERR_SYS, "td_loop_queue_work: cannot start a thread");
            return 0;
        }
    }
    pthread_cond_signal(&w->wake);
    pthread_mutex_unlock(&w->lock);
    return id;
}

void td_loop_cancel_work(td_loop *l, uint64_t id) {
    struct loop_work *w = l->work;
    if (!w || !id) return;
    pthread_mutex_lock(&w->lock);
    work_item *it = w->items;
    while (it && it->id != id) it = it->next;
    while (it && it->state == WORK_RUNNING) pthread_cond_wait(&w->ended, &w->lock);
    if (it) unlink_item(w, it);
    pthread_mutex_unlock(&w->lock);
    free(it);
}

size_t td_loop_work_pending(const td_loop *l) {
    struct loop_work *w = l->work;
    if (!w) return 0;
    size_t n = 0;
    pthread_mutex_lock(&w->lock);
    for (const work_item *it = w->items; it; it = it->next) n++;
    pthread_mutex_unlock(&w->lock);
    return n;
}

/* Work still queued is dropped, running work is waited for; no after() is called. */
static void work_free(td_loop *l) {
    struct loop_work *w = l->work;
    if (!w) return;
    pthread_mutex_lock(&w->lock);
    w->quit = true;
    pthread_cond_broadcast(&w->wake);
    pthread_mutex_unlock(&w->lock);
    for (int i = 0; i < w->nthreads; i++) pthread_join(w->threads[i], NULL);
    while (w->items) {
        work_item *it = w->items;
        w->items = it->next;
        free(it);
    }
    td_loop_unwatch(l, w->efd);
    close(w->efd);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->wake);
    pthread_cond_destroy(&w->ended);
    free(w);
    l->work = NULL;
}

/* ---- a wait ---- */

static void wait_ready(td_loop *l, int fd, unsigned events, void *user) {
    (void)fd, (void)events;
    *(bool *)user = true;
    td_loop_stop(l);
}

static void wait_over(td_loop *l, void *user) {
    (void)user;
    td_loop_stop(l);
}

bool td_loop_wait_readable(int fd, double seconds) {
    bool ready = false;
    td_loop *l = NULL;
    if (td_loop_new(&l) != TD_OK ||
        td_loop_watch(l, fd, TD_LOOP_READ, wait_ready, &ready) != TD_OK) {
        td_error_clear(); /* no loop: no wait */
        td_loop_free(l);
        return false;
    }
    td_loop_timer(l, seconds, 0, wait_over, NULL);
    if (td_loop_run(l) != TD_OK) td_error_clear();
    td_loop_free(l);
    return ready;
}
