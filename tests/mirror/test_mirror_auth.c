/* The link handshake in steps (td_mirror_auth_begin/step, include/tandem/mirror.h), run on an
 * event loop as a supervisor would: many handshakes on one loop, against the blocking calls and
 * against each other; a wrong token, a stranger and a silent peer end theirs with the blocking
 * calls' errors; nothing after the last line is taken from the connection. */
#include "test.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tandem/loop.h"
#include "tandem/mirror.h"

#define TOKEN  "0123456789abcdef0123456789abcdef"
#define NPAIRS 8

typedef struct {
    td_mirror_auth *auth;
    int fd;
    td_status st;
    bool done;
    char msg[400];
} side;

static int *running;

static void finish(td_loop *l, side *s, td_status st) {
    s->st = st;
    s->done = true;
    if (st != TD_OK) snprintf(s->msg, sizeof s->msg, "%s", td_error_msg());
    td_error_clear();
    td_loop_unwatch(l, s->fd);
    if (--*running == 0) td_loop_stop(l);
}

static void on_ready(td_loop *l, int fd, unsigned events, void *user) {
    (void)fd, (void)events;
    side *s = user;
    unsigned wants = 0;
    td_status st = td_mirror_auth_step(s->auth, &wants);
    if (st != TD_OK || !wants)
        finish(l, s, st);
    else
        ASSERT_OK(td_loop_watch(l, s->fd, wants, on_ready, s));
}

/* A deadline, as a supervisor's timer: whatever is still going ends with a timeout. */
static void on_deadline(td_loop *l, void *user) {
    side *sides = user;
    for (int i = 0; i < 2 * NPAIRS; i++)
        if (sides[i].auth && !sides[i].done) {
            (void)td_error(TD_ERR_TIMEOUT, "gave up waiting for %s",
                           td_mirror_auth_waiting_for(sides[i].auth));
            finish(l, &sides[i], TD_ERR_TIMEOUT);
        }
    td_loop_stop(l);
}

/* Starts a side on the loop: its first step (a supervisor's challenge goes out at once). */
static void start(td_loop *l, side *s, int fd, const char *token, int role) {
    *s = (side){.fd = fd};
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    ASSERT_OK(td_mirror_auth_begin(&s->auth, fd, token, role));
    (*running)++;
    on_ready(l, fd, 0, s);
}

static void run_loop(td_loop *l, side *sides, double deadline_s) {
    uint64_t t = td_loop_timer(l, deadline_s, 0, on_deadline, sides);
    if (*running) ASSERT_OK(td_loop_run(l));
    td_loop_cancel(l, t);
}

static void free_sides(side *sides, int n) {
    for (int i = 0; i < n; i++) {
        td_mirror_auth_free(sides[i].auth);
        sides[i].auth = NULL;
    }
}

/* Many pairs, both ends in steps, on one loop; each then carries on with its own protocol. */
static void test_pairs_on_one_loop(void) {
    td_loop *l;
    ASSERT_OK(td_loop_new(&l));
    side sides[2 * NPAIRS];
    int fds[2 * NPAIRS], n = 0;
    running = &n;
    for (int i = 0; i < NPAIRS; i++) {
        int sv[2];
        ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
        fds[2 * i] = sv[0];
        fds[2 * i + 1] = sv[1];
        start(l, &sides[2 * i], sv[0], TOKEN, TD_MIRROR_AUTH_ACCEPT);
        start(l, &sides[2 * i + 1], sv[1], TOKEN, TD_MIRROR_AUTH_CONNECT);
    }
    run_loop(l, sides, 10.0);
    for (int i = 0; i < 2 * NPAIRS; i++) {
        ASSERT(sides[i].done);
        if (sides[i].st != TD_OK) TEST_FAIL("side %d: %s", i, sides[i].msg);
    }
    /* the agent's first line after the handshake is the supervisor's to read, whole */
    for (int i = 0; i < NPAIRS; i++) {
        char hello[64], line[64];
        snprintf(hello, sizeof hello, "hello node-%d\n", i);
        ASSERT_EQ(write(fds[2 * i + 1], hello, strlen(hello)), (ssize_t)strlen(hello));
        ASSERT_OK(td_mirror_read_line(fds[2 * i], line, sizeof line, td_now_ns() + 5000000000ull,
                                      "hello"));
        hello[strlen(hello) - 1] = '\0';
        ASSERT_STREQ(line, hello);
    }
    free_sides(sides, 2 * NPAIRS);
    for (int i = 0; i < 2 * NPAIRS; i++) close(fds[i]);
    td_loop_free(l);
}

typedef struct {
    int fd;
    const char *token;
    td_status st;
    char msg[400];
    const char *after; /* written once authenticated */
} agent;

static void *agent_thread(void *arg) {
    agent *a = arg;
    a->st = td_mirror_auth_connect(a->fd, a->token, 5000);
    if (a->st != TD_OK) snprintf(a->msg, sizeof a->msg, "%s", td_error_msg());
    if (a->st == TD_OK && a->after) ASSERT(write(a->fd, a->after, strlen(a->after)) > 0);
    return NULL;
}

/* The supervisor in steps against the blocking agent: the same tokens agree, different ones
 * end in TD_ERR_AUTH on both sides, the agent hearing that it was refused. */
static void test_against_blocking(const char *agent_token, td_status want) {
    td_loop *l;
    ASSERT_OK(td_loop_new(&l));
    int sv[2], n = 0;
    running = &n;
    ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    agent a = {.fd = sv[1], .token = agent_token, .after = "hello node-0 1\n"};
    pthread_t t;
    ASSERT(pthread_create(&t, NULL, agent_thread, &a) == 0);
    side sides[2 * NPAIRS] = {{0}};
    start(l, &sides[0], sv[0], TOKEN, TD_MIRROR_AUTH_ACCEPT);
    run_loop(l, sides, 10.0);
    ASSERT(pthread_join(t, NULL) == 0);
    ASSERT(sides[0].done);
    ASSERT_STATUS(sides[0].st, want);
    ASSERT_STATUS(a.st, want);
    if (want == TD_OK) {
        char line[64];
        ASSERT_OK(
            td_mirror_read_line(sv[0], line, sizeof line, td_now_ns() + 5000000000ull, "hello"));
        ASSERT_STREQ(line, "hello node-0 1");
    } else {
        ASSERT_CONTAINS(sides[0].msg, "does not know the run's token");
        ASSERT_CONTAINS(a.msg, "refused");
    }
    free_sides(sides, 1);
    close(sv[0]);
    close(sv[1]);
    td_loop_free(l);
}

/* A stranger's line, and a silent peer that only the caller's deadline ends. */
static void test_stranger_and_silence(void) {
    td_loop *l;
    ASSERT_OK(td_loop_new(&l));
    int sv[2], n = 0;
    running = &n;
    side sides[2 * NPAIRS] = {{0}};
    ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    ASSERT_EQ(write(sv[1], "GET / HTTP/1.1\n", 15), 15);
    start(l, &sides[0], sv[0], TOKEN, TD_MIRROR_AUTH_ACCEPT);
    run_loop(l, sides, 10.0);
    ASSERT(sides[0].done);
    ASSERT_STATUS(sides[0].st, TD_ERR_PROTOCOL);
    ASSERT_CONTAINS(sides[0].msg, "GET / HTTP/1.1");
    free_sides(sides, 1);
    close(sv[0]);
    close(sv[1]);

    td_loop_free(l); /* a stopped loop stays stopped: a new one */
    ASSERT_OK(td_loop_new(&l));
    ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    start(l, &sides[0], sv[1], TOKEN, TD_MIRROR_AUTH_CONNECT);
    double t0 = td_now_s();
    run_loop(l, sides, 0.3);
    ASSERT(sides[0].done);
    ASSERT_STATUS(sides[0].st, TD_ERR_TIMEOUT);
    ASSERT_CONTAINS(sides[0].msg, "challenge");
    ASSERT(td_now_s() - t0 < 2.0);
    free_sides(sides, 1);
    close(sv[0]);
    close(sv[1]);

    /* the arguments */
    td_mirror_auth *a = NULL;
    ASSERT_STATUS(td_mirror_auth_begin(&a, 3, "", TD_MIRROR_AUTH_ACCEPT), TD_ERR_INVALID);
    ASSERT_STATUS(td_mirror_auth_begin(&a, -1, TOKEN, TD_MIRROR_AUTH_ACCEPT), TD_ERR_INVALID);
    ASSERT_STATUS(td_mirror_auth_begin(&a, 3, TOKEN, 0), TD_ERR_INVALID);
    ASSERT(a == NULL);
    td_error_clear();
    td_loop_free(l);
}

int main(void) {
    test_pairs_on_one_loop();
    test_against_blocking(TOKEN, TD_OK);
    test_against_blocking("ffffffffffffffffffffffffffffffff", TD_ERR_AUTH);
    test_stranger_and_silence();
    printf("test_mirror_auth: ok\n");
    return 0;
}
