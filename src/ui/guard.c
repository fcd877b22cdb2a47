/* The connection guard of `tandem ui`: a client that has not sent a whole request may not hold
 * the server's connections (slowloris: hundreds of sockets, each trickling a header, shut every
 * other client out while libmicrohttpd's inactivity timeout never fires).
 *
 * A connection is "pending" from its start, and again after each answered request (waiting on
 * keep-alive), until the handler answers its next request. Pending connections are the only
 * ones a client without the token can hold (every answer it gets is a small 401, and then it is
 * pending again), so they are the ones bounded:
 *   - each has TD__UI_REQUEST_S seconds to send its request, however slowly the bytes come;
 *   - one client address holds at most TD__UI_PENDING_PER_IP of them, all addresses together
 *     TD__UI_PENDING_TOTAL: a new connection over either bound cuts the oldest pending one, so a
 *     newcomer (a real client's request arrives in one write) always gets its turn, even from
 *     the attacker's own address (on a loopback listener every local user is 127.0.0.1).
 * A connection that is being answered (an event stream, a download) is never cut here; a client
 * that stops reading is cut by libmicrohttpd's inactivity timeout.
 *
 * Cutting is shutdown() on a dup of the connection's socket, taken when it started: it wakes the
 * connection's thread (its recv returns 0, libmicrohttpd closes it), and the dup keeps the
 * descriptor number ours, so a socket closed meanwhile cannot be mistaken for a new one. */
#include "ui_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define STR_(x) #x
#define STR(x)  STR_(x)

typedef struct guard_conn guard_conn;
struct guard_conn {
    guard_conn *prev, *next; /* in the pending list, oldest first, while pending */
    int fd;                  /* our dup of the socket, -1 when it could not be made */
    unsigned char addr[16];  /* the client's address (4 or 16 bytes), compared by value */
    size_t naddr;
    double since; /* pending since, monotonic seconds */
    int pending;
};

struct td__ui_guard {
    pthread_mutex_t lock;
    pthread_cond_t wake; /* on CLOCK_MONOTONIC */
    guard_conn *head, *tail;
    size_t npending;
    uint64_t ncut;
    int stop;
    pthread_t thread;
};

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void unlink_pending(td__ui_guard *g, guard_conn *k) {
    if (!k->pending) return;
    if (k->prev)
        k->prev->next = k->next;
    else
        g->head = k->next;
    if (k->next)
        k->next->prev = k->prev;
    else
        g->tail = k->prev;
    k->prev = k->next = NULL;
    k->pending = 0;
    g->npending--;
}

static void append_pending(td__ui_guard *g, guard_conn *k) {
    k->since = mono_now();
    k->pending = 1;
    k->prev = g->tail;
    k->next = NULL;
    if (g->tail)
        g->tail->next = k;
    else
        g->head = k;
    g->tail = k;
    g->npending++;
    if (g->head == k) pthread_cond_signal(&g->wake); /* the watchdog may be waiting for none */
}

/* Under g->lock. */
static void cut(td__ui_guard *g, guard_conn *k, const char *why) {
    unlink_pending(g, k);
    if (k->fd >= 0) shutdown(k->fd, SHUT_RDWR);
    g->ncut++;
    TD_LOG_DEBUG("tandem ui: closed a connection that sent no whole request: %s (%llu so far)", why,
                 (unsigned long long)g->ncut);
}

static void *watchdog(void *arg) {
    td__ui_guard *g = arg;
    pthread_mutex_lock(&g->lock);
    while (!g->stop) {
        double now = mono_now();
        while (g->head && now - g->head->since >= TD__UI_REQUEST_S)
            cut(g, g->head, "its request took longer than " STR(TD__UI_REQUEST_S) " s");
        /* The list is in pending order: its head is the next to time out. */
        double due = g->head ? g->head->since + TD__UI_REQUEST_S : now + 3600;
        struct timespec ts;
        ts.tv_sec = (time_t)due;
        ts.tv_nsec = (long)((due - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&g->wake, &g->lock, &ts);
    }
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

td_status td__ui_guard_start(td__ui_guard **out) {
    *out = NULL;
    td__ui_guard *g = td_xcalloc(1, sizeof *g);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->wake, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&g->lock, NULL);
    int rc = pthread_create(&g->thread, NULL, watchdog, g);
    if (rc != 0) {
        pthread_cond_destroy(&g->wake);
        pthread_mutex_destroy(&g->lock);
        free(g);
        errno = rc;
        return td_error_errno(TD_ERR_SYS, "tandem ui: cannot start its connection watchdog");
    }
    *out = g;
    return TD_OK;
}

void td__ui_guard_stop(td__ui_guard *g) {
    if (!g) return;
    pthread_mutex_lock(&g->lock);
    g->stop = 1;
    pthread_cond_signal(&g->wake);
    pthread_mutex_unlock(&g->lock);
    pthread_join(g->thread, NULL);
    /* libmicrohttpd has stopped before this: every connection has been told closed. */
    pthread_cond_destroy(&g->wake);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

static size_t client_addr(struct MHD_Connection *c, unsigned char *out) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    if (!sa) return 0;
    if (sa->sa_family == AF_INET) {
        memcpy(out, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
        return 4;
    }
    if (sa->sa_family == AF_INET6) {
        memcpy(out, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
        return 16;
    }
    return 0;
}

void td__ui_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                         enum MHD_ConnectionNotificationCode code) {
    td__ui_guard *g = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        guard_conn *k = td_xcalloc(1, sizeof *k);
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        k->fd = ci ? fcntl(ci->connect_fd, F_DUPFD_CLOEXEC, 0) : -1;
        k->naddr = client_addr(c, k->addr);
        *socket_context = k;
        pthread_mutex_lock(&g->lock);
        append_pending(g, k);
        size_t same = 0;
        for (guard_conn *o = g->head; o; o = o->next)
            same += o->naddr == k->naddr && !memcmp(o->addr, k->addr, k->naddr);
        if (same > TD__UI_PENDING_PER_IP) {
            for (guard_conn *o = g->head; o; o = o->next)
                if (o != k && o->naddr == k->naddr && !memcmp(o->addr, k->addr, k->naddr)) {
                    cut(g, o,
                        "its address holds more than " STR(
                            TD__UI_PENDING_PER_IP) " connections without a whole request");
                    break;
                }
        }
        if (g->npending > TD__UI_PENDING_TOTAL && g->head != k)
            cut(g, g->head,
                "more than " STR(TD__UI_PENDING_TOTAL) " connections without a whole request");
        pthread_mutex_unlock(&g->lock);
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        guard_conn *k = *socket_context;
        if (!k) return;
        pthread_mutex_lock(&g->lock);
        unlink_pending(g, k);
        pthread_mutex_unlock(&g->lock);
        if (k->fd >= 0) close(k->fd);
        free(k);
        *socket_context = NULL;
    }
}

static guard_conn *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void td__ui_guard_answered(td__ui_guard *g, struct MHD_Connection *c) {
    guard_conn *k = conn_of(c);
    if (!g || !k) return;
    pthread_mutex_lock(&g->lock);
    unlink_pending(g, k);
    pthread_mutex_unlock(&g->lock);
}

void td__ui_guard_waiting(td__ui_guard *g, struct MHD_Connection *c) {
    guard_conn *k = conn_of(c);
    if (!g || !k) return;
    pthread_mutex_lock(&g->lock);
    unlink_pending(g, k);
    append_pending(g, k);
    pthread_mutex_unlock(&g->lock);
}

uint64_t td__ui_guard_ncut(td__ui_guard *g) {
    pthread_mutex_lock(&g->lock);
    uint64_t n = g->ncut;
    pthread_mutex_unlock(&g->lock);
    return n;
}
